/*
 * perf/gpu_reduce_bw.c — the local reduction kernel's memory bandwidth.
 *
 * Launches plait's plait_reduce_local kernel (core/cuda/kernel.h, from the
 * fatbin built into the library: plait_cuda_fatbin + cuModuleLoadData) for
 * dst = a + b on fp32, bf16 and fp16 over buffers of 1 GiB each, and reports
 * GB/s counting bytes read and written (3 x 1 GiB per launch) and the fraction
 * of the GPU's memory bandwidth: from the driver's memory clock and bus width
 * when it reports them, else from a table of known GPUs by name (H200: 4.8
 * TB/s). Checks a sample of every result against the exact answer.
 *
 *   gpu_reduce_bw [--bytes N[K|M|G]] [--iters N] [--allow-double]
 *
 * Without a GPU it prints "SKIP: no CUDA device (...)" and exits with 77.
 * --allow-double runs on the CUDA test double (PLAIT_CUDA_LIBRARY) to check
 * the program's logic; its figures are host memory, not a GPU's.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cuda/cu.h"
#include "core/cuda/kernel.h"
#include "plait.h"

enum { ATTR_MEMORY_CLOCK_RATE = 36, ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37 }; /* CUDA's numbers (kHz, bits) */
#define CHUNK_ELEMS ((size_t)1 << 22)

struct known_gpu {
    const char *name_part;
    double bytes_per_s;
};

/* Peak memory bandwidth of GPUs whose driver does not report clock and width. */
static const struct known_gpu known_gpus[] = {
    {"H200", 4.8e12}, {"GH200", 4.0e12}, {"H100 NVL", 3.9e12}, {"H100 PCIe", 2.0e12}, {"H100", 3.35e12},
    {"H800", 3.35e12}, {"B200", 8.0e12}, {"B100", 8.0e12}, {"A100-SXM4-80GB", 2.039e12}, {"A100", 1.555e12},
    {"L40S", 0.864e12}, {"L4", 0.3e12},
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cu_check(int res, const char *call)
{
    char buf[128];
    if (res == PLAIT_CU_SUCCESS)
        return 0;
    fprintf(stderr, "gpu_reduce_bw: %s failed: %s\n", call, plait_cu_strerror(res, buf, sizeof(buf)));
    return -1;
}

static uint16_t to_half(float f)
{
    /* Small non-negative integers only (exact in fp16). */
    if (f == 0.0f)
        return 0;
    int e = 0;
    float m = f;
    while (m >= 2.0f) {
        m /= 2.0f;
        e++;
    }
    return (uint16_t)(((e + 15) << 10) | (uint16_t)((m - 1.0f) * 1024.0f));
}

static uint16_t to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)(b >> 16); /* exact for the small integers used */
}

/* Element j of input a (b is 2 everywhere), stored as type t. */
static void store(int t, void *buf, size_t i, float v)
{
    if (t == PLAIT_FLOAT32)
        ((float *)buf)[i] = v;
    else if (t == PLAIT_BFLOAT16)
        ((uint16_t *)buf)[i] = to_bf16(v);
    else
        ((uint16_t *)buf)[i] = to_half(v);
}

static float a_value(size_t j)
{
    return (float)(j % 16);
}

static int fill(const struct plait_cu *cu, plait_cudevptr d, int t, size_t esize, size_t n, int is_a, void *host)
{
    /* The pattern's period (16) divides CHUNK_ELEMS: one chunk, copied over. */
    for (size_t i = 0; i < CHUNK_ELEMS; i++)
        store(t, host, i, is_a ? a_value(i) : 2.0f);
    for (size_t off = 0; off < n; off += CHUNK_ELEMS) {
        size_t k = n - off < CHUNK_ELEMS ? n - off : CHUNK_ELEMS;
        if (cu_check(cu->MemcpyHtoD(d + off * esize, host, k * esize), "cuMemcpyHtoD"))
            return -1;
    }
    return 0;
}

static int verify(const struct plait_cu *cu, plait_cudevptr d, int t, size_t esize, size_t n, void *host)
{
    size_t k = n < CHUNK_ELEMS ? n : CHUNK_ELEMS;
    /* The first chunk and the last one (the tail). */
    for (int part = 0; part < 2; part++) {
        size_t off = part == 0 ? 0 : n - k;
        if (cu_check(cu->MemcpyDtoH(host, d + off * esize, k * esize), "cuMemcpyDtoH"))
            return -1;
        unsigned char want[4];
        for (size_t i = 0; i < k; i++) {
            store(t, want, 0, a_value(off + i) + 2.0f);
            if (memcmp((unsigned char *)host + i * esize, want, esize) != 0) {
                fprintf(stderr, "gpu_reduce_bw: element %zu is wrong\n", off + i);
                return -1;
            }
        }
    }
    return 0;
}

static double peak_bandwidth(const struct plait_cu *cu, int dev, const char *name, char *how, size_t len)
{
    int clock_khz = 0, width = 0;
    if (cu->DeviceGetAttribute(&clock_khz, ATTR_MEMORY_CLOCK_RATE, dev) == PLAIT_CU_SUCCESS &&
        cu->DeviceGetAttribute(&width, ATTR_GLOBAL_MEMORY_BUS_WIDTH, dev) == PLAIT_CU_SUCCESS && clock_khz > 0 &&
        width > 0) {
        snprintf(how, len, "driver: memory clock %d MHz x %d-bit bus x 2 (DDR)", clock_khz / 1000, width);
        return 2.0 * (double)clock_khz * 1e3 * (double)width / 8.0;
    }
    for (size_t i = 0; i < sizeof(known_gpus) / sizeof(known_gpus[0]); i++) {
        if (strstr(name, known_gpus[i].name_part)) {
            snprintf(how, len, "table entry for %s (the driver reports no memory clock/bus width)",
                     known_gpus[i].name_part);
            return known_gpus[i].bytes_per_s;
        }
    }
    snprintf(how, len, "unknown GPU: H200's 4.8 TB/s assumed");
    return 4.8e12;
}

static size_t parse_bytes(const char *s)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (end && (*end == 'K' || *end == 'k'))
        v *= 1024.0;
    else if (end && (*end == 'M' || *end == 'm'))
        v *= 1024.0 * 1024.0;
    else if (end && (*end == 'G' || *end == 'g'))
        v *= 1024.0 * 1024.0 * 1024.0;
    return v > 0 ? (size_t)v : 0;
}

int main(int argc, char **argv)
{
    size_t bytes = (size_t)1 << 30;
    int iters = 10, allow_double = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc)
            bytes = parse_bytes(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--allow-double") == 0)
            allow_double = 1;
        else {
            fprintf(stderr, "usage: %s [--bytes N[K|M|G]] [--iters N] [--allow-double]\n", argv[0]);
            return 2;
        }
    }
    if (bytes < 4096 || iters < 1) {
        fprintf(stderr, "gpu_reduce_bw: --bytes must be at least 4K and --iters at least 1\n");
        return 2;
    }

    const struct plait_cu *cu = plait_cu_get();
    if (!cu || cu->ndevices < 1 || (cu->is_double && !allow_double)) {
        printf("gpu_reduce_bw: SKIP: no CUDA device (%s)\n",
               !cu ? "no CUDA driver could be loaded" : cu->is_double ? "only the CUDA test double" : "no device");
        return 77;
    }
    size_t fatbin_bytes = 0;
    const void *fatbin = plait_cuda_fatbin(&fatbin_bytes);
    if (!fatbin && !cu->is_double) {
        printf("gpu_reduce_bw: FAIL: this libplait was built without nvcc (no kernels)\n");
        return 1;
    }

    int dev = 0, cr;
    void *ctx = NULL, *mod = NULL, *fn = NULL, *stream = NULL;
    char name[256] = "unknown";
    int (*get_name)(char *, int, int) = NULL;
    *(void **)&get_name = dlsym(cu->lib, "cuDeviceGetName");
    if (cu_check(cu->DeviceGet(&dev, 0), "cuDeviceGet") || cu_check(cu->DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
        cu_check(cu->CtxSetCurrent(ctx), "cuCtxSetCurrent"))
        return 1;
    if (get_name)
        get_name(name, (int)sizeof(name), dev);
    int sms = 0;
    cu->DeviceGetAttribute(&sms, PLAIT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    if (sms <= 0)
        sms = 1;
    char how[160];
    const double peak = peak_bandwidth(cu, dev, name, how, sizeof(how));
    printf("# gpu_reduce_bw: %s%s, %d SMs; peak memory bandwidth %.2f TB/s (%s)\n", name,
           cu->is_double ? " (CUDA test double, not a GPU)" : "", sms, peak / 1e12, how);
    if (cu_check(cu->ModuleLoadData(&mod, fatbin), "cuModuleLoadData") ||
        cu_check(cu->ModuleGetFunction(&fn, mod, PLAIT_REDUCE_KERNEL_NAME), "cuModuleGetFunction (" PLAIT_REDUCE_KERNEL_NAME ")") ||
        cu_check(cu->StreamCreateWithPriority(&stream, PLAIT_CU_STREAM_NON_BLOCKING, 0), "cuStreamCreateWithPriority"))
        return 1;

    plait_cudevptr a = 0, b = 0, d = 0;
    void *host = malloc(CHUNK_ELEMS * 4);
    if (!host || cu_check(cu->MemAlloc(&a, bytes), "cuMemAlloc") || cu_check(cu->MemAlloc(&b, bytes), "cuMemAlloc") ||
        cu_check(cu->MemAlloc(&d, bytes), "cuMemAlloc"))
        return 1;

    static const int types[] = {PLAIT_FLOAT32, PLAIT_BFLOAT16, PLAIT_FLOAT16};
    static const char *const tnames[] = {"fp32", "bf16", "fp16"};
    int failed = 0;
    /* As many CTAs as fill the GPU a few times over; the kernel strides. */
    const unsigned grid = (unsigned)sms * 4;
    printf("# %-5s %12s %10s %10s %8s\n", "type", "bytes", "time(us)", "GB/s", "of peak");
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const int t = types[ti];
        const size_t esize = t == PLAIT_FLOAT32 ? 4 : 2;
        const size_t n = bytes / esize;
        if (fill(cu, a, t, esize, n, 1, host) || fill(cu, b, t, esize, n, 0, host)) {
            failed = 1;
            break;
        }
        struct plait_kreduce_args args;
        memset(&args, 0, sizeof(args));
        args.dst = (void *)(uintptr_t)d;
        args.a = (const void *)(uintptr_t)a;
        args.b = (const void *)(uintptr_t)b;
        args.n = n;
        args.dtype = t;
        args.redop = PLAIT_SUM;
        args.nranks = 1;
        void *params[] = {&args};
        /* One launch to warm up (and to check), then the timed ones. */
        if (cu_check(cu->LaunchKernel(fn, grid, 1, 1, PLAIT_KERNEL_THREADS, 1, 1, 0, stream, params, NULL), "cuLaunchKernel") ||
            cu_check(cu->StreamSynchronize(stream), "cuStreamSynchronize")) {
            failed = 1;
            break;
        }
        if (verify(cu, d, t, esize, n, host)) {
            printf("  %-5s FAIL: wrong result\n", tnames[ti]);
            failed = 1;
            continue;
        }
        double t0 = now_s();
        cr = 0;
        for (int it = 0; it < iters && !cr; it++)
            cr = cu->LaunchKernel(fn, grid, 1, 1, PLAIT_KERNEL_THREADS, 1, 1, 0, stream, params, NULL);
        if (cu_check(cr, "cuLaunchKernel") || cu_check(cu->StreamSynchronize(stream), "cuStreamSynchronize")) {
            failed = 1;
            break;
        }
        double sec = (now_s() - t0) / iters;
        double gbs = 3.0 * (double)(n * esize) / sec / 1e9;
        printf("  %-5s %12zu %10.1f %10.1f %7.1f%%\n", tnames[ti], n * esize, sec * 1e6, gbs, 100.0 * gbs * 1e9 / peak);
    }
    cu->MemFree(a);
    cu->MemFree(b);
    cu->MemFree(d);
    cu->StreamDestroy(stream);
    cu->ModuleUnload(mod);
    cu->DevicePrimaryCtxRelease(dev);
    free(host);
    printf("gpu_reduce_bw: %s\n", failed ? "FAIL" : "PASS");
    return failed ? 1 : 0;
}
