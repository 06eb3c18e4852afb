/*
 * plait's libnccl.so.2 on device buffers, against the CUDA test double
 * (tests/cuda_double.c: device memory is host memory, kernels run their host
 * emulation; not a GPU).
 *
 *   nccl_device_double EXPECT_LIB
 *
 * Written against NVIDIA's nccl.h and linked against NVIDIA's libnccl.so.2, as
 * a user's program is; run with LD_PRELOAD of plait's libnccl.so.2 (EXPECT_LIB:
 * every NCCL call must resolve to it) and PLAIT_CUDA_LIBRARY naming the
 * double, which this program loads itself (as a GPU program loads
 * libcuda.so.1) before plait does, so that both use one copy. With
 * PLAIT_CUDA_DOUBLE_DEVICES=2, two rank threads, rank r on device r, each with
 * the device's primary context current and its own stream
 * (cuStreamCreateWithPriority), cuMemAlloc'd buffers: AllReduce, AllGather,
 * ReduceScatter, Broadcast and a grouped Send+Recv exchange, each followed by
 * cuStreamSynchronize and a copy back (cuMemcpyDtoH_v2), give exact results,
 * as does an AllGather into a memory window (ncclCommWindowRegister);
 * a call returns before its stream has run it (stream order: the stream is
 * held by the double); the NULL stream (CUDA's default stream) works;
 * ncclMemAlloc under the context gives device memory (the double classifies
 * it) that a collective can use and ncclMemFree returns; ncclCommCuDevice is
 * the device. One line per check; exit 1 on any failure, 2 on a setup error.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/cuda_double.h"

#define NRANKS 2
#define COUNT 4099 /* elements per rank: not a multiple of any chunk */

typedef unsigned long long devptr;

/* The driver functions this program calls, from the double (cuda.h's ABI). */
static struct {
    int (*Init)(unsigned);
    int (*DevicePrimaryCtxRetain)(void **, int);
    int (*CtxSetCurrent)(void *);
    int (*MemAlloc)(devptr *, size_t);
    int (*MemFree)(devptr);
    int (*MemcpyHtoD)(devptr, const void *, size_t);
    int (*MemcpyDtoH)(void *, devptr, size_t);
    int (*StreamCreateWithPriority)(void **, unsigned, int);
    int (*StreamDestroy)(void *);
    int (*StreamSynchronize)(void *);
    int (*PointerGetAttributes)(unsigned, int *, void **, devptr);
    int (*StreamHold)(void *, int); /* plait_cuda_double_stream_hold */
    void (*StatsGet)(struct plait_cuda_double_stats *);
} cu;

/* Device calls each rank makes; each must be one kernel launch (at least) on
 * the double, else it ran on the CPU backend (which would give the same
 * results here, the double's device memory being host memory). */
#define DEVICE_CALLS_PER_RANK 7

static ncclUniqueId g_id;
static pthread_barrier_t g_barrier;
static int g_failures;
static pthread_mutex_t g_out = PTHREAD_MUTEX_INITIALIZER;

static void say(int rank, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(int rank, int ok, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&g_out);
    printf("[rank %d] %s: ", rank, ok ? "ok" : "FAIL");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf(" (CUDA test double, not a GPU)\n");
    if (!ok)
        g_failures++;
    pthread_mutex_unlock(&g_out);
}

static int nccl_ok(int rank, ncclResult_t r, const char *what)
{
    if (r != ncclSuccess)
        say(rank, 0, "%s returned %d (%s): %s", what, (int)r, ncclGetErrorString(r), ncclGetLastError(NULL));
    return r == ncclSuccess;
}

static float *upload(devptr d, const float *h, size_t n)
{
    return cu.MemcpyHtoD(d, h, n * sizeof(float)) == 0 ? (float *)(uintptr_t)d : NULL;
}

/* Copies n floats of d back and compares them with want. */
static int check(int rank, const char *what, devptr d, const float *want, size_t n)
{
    float *got = malloc(n * sizeof(float));
    int res = got ? cu.MemcpyDtoH(got, d, n * sizeof(float)) : -1;
    size_t bad = n;
    for (size_t i = 0; res == 0 && i < n; i++)
        if (got[i] != want[i]) {
            bad = i;
            break;
        }
    int ok = res == 0 && bad == n;
    if (ok)
        say(rank, 1, "%s: %zu elements exact", what, n);
    else if (res != 0)
        say(rank, 0, "%s: cuMemcpyDtoH_v2 failed (%d)", what, res);
    else
        say(rank, 0, "%s: element %zu is %g, want %g", what, bad, (double)got[bad], (double)want[bad]);
    free(got);
    return ok;
}

static float value(int rank, size_t i)
{
    return (float)((rank + 1) * 1000 + (int)(i % 997));
}

static void *rank_main(void *arg)
{
    const int rank = (int)(intptr_t)arg, peer = 1 - rank, n = NRANKS;
    void *ctx = NULL, *stream = NULL;
    if (cu.DevicePrimaryCtxRetain(&ctx, rank) || cu.CtxSetCurrent(ctx) ||
        cu.StreamCreateWithPriority(&stream, 1 /* CU_STREAM_NON_BLOCKING */, 0)) {
        say(rank, 0, "cannot set up the context and stream of device %d", rank);
        return NULL;
    }
    ncclComm_t comm = NULL;
    if (!nccl_ok(rank, ncclCommInitRank(&comm, n, g_id, rank), "ncclCommInitRank"))
        return NULL;
    int dev = -2;
    ncclResult_t r = ncclCommCuDevice(comm, &dev);
    say(rank, r == ncclSuccess && dev == rank, "ncclCommCuDevice: %d (want %d, the context's device)", dev, rank);

    const size_t total = (size_t)n * COUNT;
    float *h = malloc(total * sizeof(float)), *want = malloc(total * sizeof(float));
    devptr send = 0, recv = 0;
    if (!h || !want || cu.MemAlloc(&send, total * sizeof(float)) || cu.MemAlloc(&recv, total * sizeof(float))) {
        say(rank, 0, "cannot allocate the buffers");
        return NULL;
    }
    float *ds = (float *)(uintptr_t)send, *dr = (float *)(uintptr_t)recv;

    /* AllReduce, with the stream held: the call returns before the stream ran it. */
    for (size_t i = 0; i < total; i++) {
        h[i] = value(rank, i);
        want[i] = value(0, i) + value(1, i);
    }
    upload(send, h, total);
    cu.StreamHold(stream, 1);
    r = ncclAllReduce(ds, dr, total, ncclFloat32, ncclSum, comm, (cudaStream_t)stream);
    float first = -1;
    cu.MemcpyDtoH(&first, recv, sizeof(first));
    say(rank, r == ncclSuccess && first != want[0],
        "ncclAllReduce on device buffers returned (%d) before its held stream ran it (recvbuff[0] = %g)", (int)r,
        (double)first);
    pthread_barrier_wait(&g_barrier);
    cu.StreamHold(stream, 0);
    if (nccl_ok(rank, cu.StreamSynchronize(stream) == 0 ? ncclSuccess : ncclUnhandledCudaError, "cuStreamSynchronize"))
        check(rank, "ncclAllReduce (sum) + cuStreamSynchronize", recv, want, total);

    /* AllGather: rank r's COUNT elements at r*COUNT. */
    for (size_t i = 0; i < COUNT; i++)
        h[i] = value(rank, i);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < COUNT; i++)
            want[p * COUNT + i] = value(p, i);
    upload(send, h, COUNT);
    if (nccl_ok(rank, ncclAllGather(ds, dr, COUNT, ncclFloat32, comm, (cudaStream_t)stream), "ncclAllGather") &&
        cu.StreamSynchronize(stream) == 0)
        check(rank, "ncclAllGather", recv, want, total);

    /* A memory window over recvbuff (collective), an AllGather into it, and
     * its deregistration. */
    ncclWindow_t win = NULL;
    if (nccl_ok(rank, ncclCommWindowRegister(comm, dr, total * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC),
                "ncclCommWindowRegister")) {
        say(rank, win != NULL, "ncclCommWindowRegister of the cuMemAlloc'd recvbuff: window %p", (void *)win);
        for (size_t i = 0; i < COUNT; i++)
            h[i] = value(rank, i) + 1;
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < COUNT; i++)
                want[p * COUNT + i] = value(p, i) + 1;
        upload(send, h, COUNT);
        if (nccl_ok(rank, ncclAllGather(ds, dr, COUNT, ncclFloat32, comm, (cudaStream_t)stream),
                    "ncclAllGather into a window") &&
            cu.StreamSynchronize(stream) == 0)
            check(rank, "ncclAllGather into a window", recv, want, total);
        say(rank, nccl_ok(rank, ncclCommWindowDeregister(comm, win), "ncclCommWindowDeregister"),
            "ncclCommWindowDeregister");
    }

    /* ReduceScatter: rank r gets the sum of the ranks' r-th blocks. */
    for (size_t i = 0; i < total; i++)
        h[i] = value(rank, i);
    for (size_t i = 0; i < COUNT; i++)
        want[i] = value(0, rank * COUNT + i) + value(1, rank * COUNT + i);
    upload(send, h, total);
    if (nccl_ok(rank, ncclReduceScatter(ds, dr, COUNT, ncclFloat32, ncclSum, comm, (cudaStream_t)stream),
                "ncclReduceScatter") &&
        cu.StreamSynchronize(stream) == 0)
        check(rank, "ncclReduceScatter (sum)", recv, want, COUNT);

    /* Broadcast from rank 1, on the NULL stream (the device's default stream;
     * each rank has its own device, so the ranks do not share it). */
    for (size_t i = 0; i < total; i++) {
        h[i] = value(rank, i);
        want[i] = value(1, i);
    }
    upload(send, h, total);
    if (nccl_ok(rank, ncclBroadcast(ds, dr, total, ncclFloat32, 1, comm, NULL), "ncclBroadcast (NULL stream)") &&
        cu.StreamSynchronize(NULL) == 0)
        check(rank, "ncclBroadcast from rank 1 on the NULL stream", recv, want, total);

    /* Send+Recv in one group: each rank sends its buffer to the other. */
    for (size_t i = 0; i < total; i++) {
        h[i] = value(rank, i);
        want[i] = value(peer, i);
    }
    upload(send, h, total);
    int ok = nccl_ok(rank, ncclGroupStart(), "ncclGroupStart") &&
             nccl_ok(rank, ncclSend(ds, total, ncclFloat32, peer, comm, (cudaStream_t)stream), "ncclSend") &&
             nccl_ok(rank, ncclRecv(dr, total, ncclFloat32, peer, comm, (cudaStream_t)stream), "ncclRecv");
    ok = nccl_ok(rank, ncclGroupEnd(), "ncclGroupEnd") && ok;
    if (ok && cu.StreamSynchronize(stream) == 0)
        check(rank, "grouped ncclSend+ncclRecv exchange", recv, want, total);

    /* ncclMemAlloc under the context: device memory, usable by a collective. */
    void *m = NULL;
    r = ncclMemAlloc(&m, COUNT * sizeof(float));
    unsigned type = 0;
    int attr = 2; /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
    void *data = &type;
    int res = m ? cu.PointerGetAttributes(1, &attr, &data, (devptr)(uintptr_t)m) : -1;
    say(rank, r == ncclSuccess && res == 0 && type == 2 /* CU_MEMORYTYPE_DEVICE */,
        "ncclMemAlloc with a current context: device memory (%p, memory type %u)", m, type);
    if (m && type == 2) {
        for (size_t i = 0; i < COUNT; i++) {
            h[i] = value(rank, i);
            want[i] = value(0, i) + value(1, i);
        }
        upload((devptr)(uintptr_t)m, h, COUNT);
        if (nccl_ok(rank, ncclAllReduce(m, m, COUNT, ncclFloat32, ncclSum, comm, (cudaStream_t)stream),
                    "ncclAllReduce in place on ncclMemAlloc memory") &&
            cu.StreamSynchronize(stream) == 0)
            check(rank, "ncclAllReduce in place on ncclMemAlloc memory", (devptr)(uintptr_t)m, want, COUNT);
        say(rank, ncclMemFree(m) == ncclSuccess, "ncclMemFree of the device memory");
    }

    say(rank, ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
    cu.MemFree(send);
    cu.MemFree(recv);
    cu.StreamDestroy(stream);
    free(h);
    free(want);
    return NULL;
}

static void *need(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        printf("FAIL: the double lacks %s\n", name);
        exit(2);
    }
    return p;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(100);
    const char *path = getenv("PLAIT_CUDA_LIBRARY");
    if (argc != 2 || !path || !*path) {
        fprintf(stderr, "usage: PLAIT_CUDA_LIBRARY=<the CUDA test double> %s EXPECT_LIB\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL: cannot load the CUDA test double %s: %s\n", path, dlerror());
        return 2;
    }
    *(void **)&cu.Init = need(lib, "cuInit");
    *(void **)&cu.DevicePrimaryCtxRetain = need(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.CtxSetCurrent = need(lib, "cuCtxSetCurrent");
    *(void **)&cu.MemAlloc = need(lib, "cuMemAlloc_v2");
    *(void **)&cu.MemFree = need(lib, "cuMemFree_v2");
    *(void **)&cu.MemcpyHtoD = need(lib, "cuMemcpyHtoD_v2");
    *(void **)&cu.MemcpyDtoH = need(lib, "cuMemcpyDtoH_v2");
    *(void **)&cu.StreamCreateWithPriority = need(lib, "cuStreamCreateWithPriority");
    *(void **)&cu.StreamDestroy = need(lib, "cuStreamDestroy_v2");
    *(void **)&cu.StreamSynchronize = need(lib, "cuStreamSynchronize");
    *(void **)&cu.PointerGetAttributes = need(lib, "cuPointerGetAttributes");
    *(void **)&cu.StreamHold = need(lib, "plait_cuda_double_stream_hold");
    *(void **)&cu.StatsGet = need(lib, "plait_cuda_double_stats_get");
    if (cu.Init(0) != 0) {
        printf("FAIL: cuInit of the double failed (PLAIT_CUDA_DOUBLE_DEVICES=2?)\n");
        return 2;
    }
    /* Every NCCL function must come from the preloaded library. */
    Dl_info info;
    void *fn = dlsym(RTLD_DEFAULT, "ncclAllReduce");
    char want_real[4096], got_real[4096];
    if (!fn || !dladdr(fn, &info) || !realpath(argv[1], want_real) || !realpath(info.dli_fname, got_real) ||
        strcmp(want_real, got_real) != 0) {
        printf("FAIL: ncclAllReduce resolves to %s, not %s (run with LD_PRELOAD)\n", fn ? info.dli_fname : "nothing",
               argv[1]);
        return 1;
    }
    printf("ok: NCCL's functions come from %s\n", argv[1]);
    if (ncclGetUniqueId(&g_id) != ncclSuccess) {
        printf("FAIL: ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    struct plait_cuda_double_stats before, after;
    cu.StatsGet(&before);
    pthread_barrier_init(&g_barrier, NULL, NRANKS);
    pthread_t t[NRANKS];
    for (int r = 0; r < NRANKS; r++)
        pthread_create(&t[r], NULL, rank_main, (void *)(intptr_t)r);
    for (int r = 0; r < NRANKS; r++)
        pthread_join(t[r], NULL);
    cu.StatsGet(&after);
    unsigned long long launches = (unsigned long long)(after.launches - before.launches);
    int ran_on_device = launches >= (unsigned long long)NRANKS * DEVICE_CALLS_PER_RANK;
    printf("%s: %llu kernel launches for %d device calls: they ran on the CUDA backend\n",
           ran_on_device ? "ok" : "FAIL", launches, NRANKS * DEVICE_CALLS_PER_RANK);
    g_failures += !ran_on_device;
    printf("%d failed (CUDA test double, not a GPU)\n", g_failures);
    return g_failures ? 1 : 0;
}
