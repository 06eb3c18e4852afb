/* The CUDA driver loader (core/cuda/cu.c) and the CUDA test double
 * (tests/cuda_double.c).
 *
 * Tests named double_* load the test double through PLAIT_CUDA_LIBRARY, the
 * dlopen path the real driver takes: they exercise plait's host-side logic
 * and the double itself, never a GPU. no_driver_* runs the real path on this
 * machine (no libcuda.so.1): the CPU backend must work and say "no CUDA
 * device" once. Criterion runs each test in its own process, so every test
 * loads the driver afresh. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cuda/cu.h"
#include "tests/cuda_double.h"
#include "tests/harness.h"
#include "plait.h"

#define DEADLINE_S 30.0

/* Points plait at the double (before anything loads the driver) and says so
 * in the output. */
static const struct plait_cu *use_double(const char *devices)
{
    setenv("PLAIT_CUDA_LIBRARY", PLAIT_CUDA_DOUBLE_PATH, 1);
    setenv("PLAIT_CUDA_DOUBLE_DEVICES", devices, 1);
    setenv("PLAIT_CUDA_DOUBLE_TIMEOUT", "20", 1);
    cr_log_info("CUDA test double %s (not a GPU)", PLAIT_CUDA_DOUBLE_PATH);
    const struct plait_cu *cu = plait_cu_get();
    cr_assert_not_null(cu, "the double did not load: %s", plait_get_last_error(NULL));
    return cu;
}

/* The primary context of `dev`, made current on the calling thread (what
 * cudaSetDevice does in a program using the runtime API). */
static void set_device(const struct plait_cu *cu, int dev)
{
    void *ctx = NULL;
    cr_assert_eq(cu->DevicePrimaryCtxRetain(&ctx, dev), 0);
    cr_assert_eq(cu->CtxSetCurrent(ctx), 0);
}

/* Waits for pid within the deadline (killing it past it); returns its exit
 * status, or -1 when it did not exit normally. */
static int reap(pid_t pid, double timeout_s)
{
    double end = mr_now() + timeout_s;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (r < 0 && errno != EINTR)
            return -1;
        if (mr_now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(2000);
    }
}

/* ---------------------------------------------------------------- host collectives */

/* A 2-rank allreduce through the public API, ranks as threads of this
 * process (plait_comm_init_all), on host buffers. Returns 0 when right. */
static int host_allreduce_2(char *why, size_t len)
{
    plait_comm_t comms[2];
    plait_result_t res = plait_comm_init_all(comms, 2, NULL);
    if (res != PLAIT_SUCCESS) {
        snprintf(why, len, "plait_comm_init_all: %s", plait_get_last_error(NULL));
        return -1;
    }
    enum { N = 1000 };
    static float send[2][N], recv[2][N];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++)
            send[r][i] = (float)(i + 1000 * r);
    int bad = 0;
    if (plait_group_start() != PLAIT_SUCCESS)
        bad = 1;
    for (int r = 0; r < 2 && !bad; r++)
        if (plait_allreduce(send[r], recv[r], N, PLAIT_FLOAT32, PLAIT_SUM, comms[r], NULL) != PLAIT_SUCCESS)
            bad = 1;
    if (plait_group_end() != PLAIT_SUCCESS || bad) {
        snprintf(why, len, "allreduce: %s", plait_get_last_error(NULL));
        bad = 1;
    }
    for (int r = 0; r < 2 && !bad; r++)
        for (int i = 0; i < N; i++)
            if (recv[r][i] != (float)(2 * i + 1000)) {
                snprintf(why, len, "rank %d element %d: %g, expected %g", r, i, recv[r][i], (double)(2 * i + 1000));
                bad = 1;
                break;
            }
    for (int r = 0; r < 2; r++)
        plait_comm_destroy(comms[r]);
    return bad ? -1 : 0;
}

/* ---------------------------------------------------------------- the real path */

/* Runs a program in a child with PLAIT_DEBUG=INFO: it classifies buffers
 * (each classification asks for the driver) and runs a host allreduce;
 * returns its exit status and its stderr in out. */
static int run_logged_child(const char *library, char *out, size_t len)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        setenv("PLAIT_DEBUG", "INFO", 1);
        setenv("PLAIT_DEBUG_SUBSYS", "INIT", 1);
        if (library != NULL)
            setenv("PLAIT_CUDA_LIBRARY", library, 1);
        else
            unsetenv("PLAIT_CUDA_LIBRARY");
        int x = 0;
        char why[256] = "";
        for (int i = 0; i < 3; i++)
            if (plait_mem_kind(&x, NULL) != PLAIT_MEM_HOST) {
                fprintf(stderr, "child: a stack variable is not host memory\n");
                _exit(2);
            }
        if (host_allreduce_2(why, sizeof(why)) != 0) {
            fprintf(stderr, "child: %s\n", why);
            _exit(3);
        }
        if (plait_mem_kind(&x, NULL) != PLAIT_MEM_HOST)
            _exit(2);
        _exit(0);
    }
    close(fds[1]);
    size_t used = 0;
    double end = mr_now() + DEADLINE_S;
    for (;;) {
        struct pollfd p = {fds[0], POLLIN, 0};
        int left_ms = (int)((end - mr_now()) * 1000);
        if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0)
            break;
        ssize_t n = read(fds[0], out + used, len - 1 - used);
        if (n <= 0)
            break;
        used += (size_t)n;
        if (used == len - 1)
            break;
    }
    out[used] = '\0';
    close(fds[0]);
    return reap(pid, 5.0);
}

static int count_lines(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

Test(cuda_loader, no_driver_says_no_cuda_device_once_and_host_collectives_run)
{
    void *real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (real != NULL)
        dlclose(real);
    static char out[1 << 16];
    int status = run_logged_child(NULL, out, sizeof(out));
    cr_log_info("child's log:\n%s", out);
    cr_assert_eq(status, 0, "the host-only child failed (%d):\n%s", status, out);
    int none = count_lines(out, "no CUDA device (");
    int found = count_lines(out, "CUDA: ");
    if (real == NULL) {
        cr_assert_eq(none, 1, "expected one \"no CUDA device\" line, got %d:\n%s", none, out);
        cr_assert_eq(found, 0, "%s", out);
        cr_assert(strstr(out, "INFO") != NULL && strstr(out, "libcuda.so.1") != NULL,
                  "the line should be INFO and name libcuda.so.1:\n%s", out);
    } else {
        cr_log_info("this machine has a libcuda.so.1: one \"CUDA:\" line expected instead");
        cr_assert_eq(none + found, 1, "expected one loader line, got %d:\n%s", none + found, out);
    }
}

Test(cuda_loader, no_driver_plait_cuda_0_loads_nothing)
{
    setenv("PLAIT_CUDA", "0", 1);
    setenv("PLAIT_CUDA_LIBRARY", PLAIT_CUDA_DOUBLE_PATH, 1);
    cr_assert_null(plait_cu_get());
    int dev = 7;
    cr_assert_eq(plait_mem_kind(&dev, &dev), PLAIT_MEM_HOST);
    cr_assert_eq(dev, -1);
}

Test(cuda_loader, double_without_devices_is_no_cuda_device)
{
    setenv("PLAIT_CUDA_LIBRARY", PLAIT_CUDA_DOUBLE_PATH, 1);
    setenv("PLAIT_CUDA_DOUBLE_DEVICES", "0", 1);
    cr_log_info("CUDA test double %s (not a GPU) with 0 devices", PLAIT_CUDA_DOUBLE_PATH);
    cr_assert_null(plait_cu_get(), "cuInit fails with CUDA_ERROR_NO_DEVICE: no driver for plait");
    int x = 0;
    cr_assert_eq(plait_mem_kind(&x, NULL), PLAIT_MEM_HOST);
}

/* ---------------------------------------------------------------- the double through the loader */

Test(cuda_loader, double_is_loaded_and_named_a_double)
{
    static char out[1 << 16];
    int status = run_logged_child(PLAIT_CUDA_DOUBLE_PATH, out, sizeof(out));
    cr_log_info("child's log (CUDA test double):\n%s", out);
    cr_assert_eq(status, 0, "the child failed (%d):\n%s", status, out);
    cr_assert_eq(count_lines(out, "CUDA: test double "), 1, "%s", out);
    cr_assert_eq(count_lines(out, "(not a GPU): 1 device(s)"), 1, "%s", out);
    cr_assert_eq(count_lines(out, "no CUDA device"), 0, "%s", out);

    const struct plait_cu *cu = use_double("3");
    cr_assert(cu->is_double);
    cr_assert_eq(cu->ndevices, 3);
    cr_assert_str_eq(cu->path, PLAIT_CUDA_DOUBLE_PATH);
    cr_assert_str_eq(plait_cuda_double_info(), "plait CUDA test double (not a GPU)");
    char bus[32];
    cr_assert_eq(cu->DeviceGetPCIBusId(bus, sizeof(bus), 1), 0);
    cr_assert_str_eq(bus, "0000:2A:00.0");
    int sms = 0, major = 0;
    cr_assert_eq(cu->DeviceGetAttribute(&sms, PLAIT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0), 0);
    cr_assert_eq(cu->DeviceGetAttribute(&major, PLAIT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0), 0);
    cr_assert_eq(sms, 132);
    cr_assert_eq(major, 9);
    /* The loader handed it plait's kernels: both resolve, others do not. */
    set_device(cu, 0);
    void *mod = NULL, *fn = NULL;
    cr_assert_eq(cu->ModuleLoadData(&mod, NULL), 0);
    cr_assert_eq(cu->ModuleGetFunction(&fn, mod, "plait_kernel"), 0);
    cr_assert_eq(cu->ModuleGetFunction(&fn, mod, "plait_reduce_local"), 0);
    cr_assert_eq(cu->ModuleGetFunction(&fn, mod, "no_such_kernel"), 500);
    char err[160];
    cr_assert_str_eq(plait_cu_strerror(500, err, sizeof(err)), "CUDA_ERROR_NOT_FOUND: named symbol not found");
    cr_assert_eq(plait_cu_error(500, "test", "cuModuleGetFunction"), PLAIT_ERR_UNHANDLED_CUDA);
    cr_assert_str_eq(plait_get_last_error(NULL),
                     "test: cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND: named symbol not found");
    cr_assert_eq(cu->ModuleUnload(mod), 0);
}

Test(cuda_loader, double_mem_kind_classifies_host_registered_device_managed)
{
    const struct plait_cu *cu = use_double("2");
    int (*alloc_managed)(plait_cudevptr *, size_t, unsigned);
    *(void **)&alloc_managed = dlsym(cu->lib, "cuMemAllocManaged");
    cr_assert_not_null(alloc_managed);

    int dev = 5, on_stack = 0;
    char *heap = malloc(4096);
    cr_assert_eq(plait_mem_kind(NULL, &dev), PLAIT_MEM_HOST);
    cr_assert_eq(dev, -1);
    cr_assert_eq(plait_mem_kind(&on_stack, &dev), PLAIT_MEM_HOST);
    cr_assert_eq(plait_mem_kind(heap, &dev), PLAIT_MEM_HOST);
    cr_assert_eq(dev, -1);

    set_device(cu, 1);
    plait_cudevptr d = 0, m = 0;
    void *pinned = NULL;
    cr_assert_eq(cu->MemAlloc(&d, 1 << 20), 0);
    cr_assert_eq(alloc_managed(&m, 1 << 16, 1), 0);
    cr_assert_eq(cu->MemHostAlloc(&pinned, 1 << 16, PLAIT_CU_MEMHOSTALLOC_DEVICEMAP), 0);

    cr_assert_eq(plait_mem_kind((void *)(uintptr_t)d, &dev), PLAIT_MEM_DEVICE);
    cr_assert_eq(dev, 1);
    cr_assert_eq(plait_mem_kind((char *)(uintptr_t)d + 4000, &dev), PLAIT_MEM_DEVICE, "inside the allocation");
    cr_assert_eq(plait_mem_kind((void *)(uintptr_t)m, &dev), PLAIT_MEM_MANAGED);
    cr_assert_eq(dev, 1);
    cr_assert_eq(plait_mem_kind(pinned, &dev), PLAIT_MEM_REGISTERED);
    cr_assert_eq(dev, -1);
    cr_assert_eq(plait_mem_kind(heap, NULL), PLAIT_MEM_HOST);
    cr_assert_str_eq(plait_mem_kind_name(PLAIT_MEM_MANAGED), "managed");
    cr_assert_str_eq(plait_mem_kind_name(PLAIT_MEM_REGISTERED), "registered host");

    plait_cudevptr mapped = 0, base = 0;
    size_t size = 0;
    cr_assert_eq(cu->MemHostGetDevicePointer(&mapped, pinned, 0), 0);
    cr_assert_eq(mapped, (plait_cudevptr)(uintptr_t)pinned);
    cr_assert_eq(cu->MemGetAddressRange(&base, &size, d + 100), 0);
    cr_assert_eq(base, d);
    cr_assert_eq(size, (size_t)1 << 20);

    cr_assert_eq(cu->MemFree(d), 0);
    cr_assert_eq(cu->MemFree(m), 0);
    cr_assert_eq(cu->MemFreeHost(pinned), 0);
    /* A freed pointer is unknown again. */
    cr_assert_eq(plait_mem_kind((void *)(uintptr_t)d, &dev), PLAIT_MEM_HOST);
    free(heap);
}

Test(cuda_loader, double_host_only_program_creates_no_context)
{
    const struct plait_cu *cu = use_double("1");
    struct plait_cuda_double_stats before, after;
    plait_cuda_double_stats_get(&before);
    int x = 0;
    cr_assert_eq(plait_mem_kind(&x, NULL), PLAIT_MEM_HOST);
    char why[256] = "";
    cr_assert_eq(host_allreduce_2(why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(plait_mem_kind(&x, NULL), PLAIT_MEM_HOST);
    plait_cuda_double_stats_get(&after);
    cr_assert_eq(after.contexts_created, 0, "a host-only program made %llu CUDA context(s)",
                 (unsigned long long)after.contexts_created);
    cr_assert_eq(after.allocs, before.allocs);
    cr_assert_eq(after.launches, before.launches);
    void *ctx = (void *)1;
    cr_assert_eq(cu->CtxGetCurrent(&ctx), 0);
    cr_assert_null(ctx);
    /* Calls that need a context fail without one, as the driver's do. */
    plait_cudevptr d;
    cr_assert_eq(cu->MemAlloc(&d, 64), 201);
}

/* ---------------------------------------------------------------- the double's streams */

static void set_flag(void *arg)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

Test(cuda_loader, double_stream_order_hold_and_events)
{
    const struct plait_cu *cu = use_double("1");
    set_device(cu, 0);
    void *s1 = NULL, *s2 = NULL, *ev = NULL;
    cr_assert_eq(cu->StreamCreateWithPriority(&s1, PLAIT_CU_STREAM_NON_BLOCKING, -3), 0);
    cr_assert_eq(cu->StreamCreateWithPriority(&s2, PLAIT_CU_STREAM_NON_BLOCKING, 0), 0);
    int prio = 1;
    cr_assert_eq(cu->StreamGetPriority(s1, &prio), 0);
    cr_assert_eq(prio, -3);
    cr_assert_eq(cu->EventCreate(&ev, PLAIT_CU_EVENT_DISABLE_TIMING), 0);

    enum { N = 1 << 16 };
    plait_cudevptr a = 0, b = 0;
    cr_assert_eq(cu->MemAlloc(&a, N), 0);
    cr_assert_eq(cu->MemAlloc(&b, N), 0);
    unsigned char *host = malloc(N);
    int ran = 0;

    struct plait_cuda_double_stats before, mid, after;
    plait_cuda_double_stats_get(&before);
    /* s1 (held): a = 0x5a, then record; s2: wait for it, b = a, then a host
     * function. Every call returns although nothing has run. */
    cr_assert_eq(plait_cuda_double_stream_hold(s1, 1), 0);
    cr_assert_eq(cu->MemsetD8Async(a, 0x5a, N, s1), 0);
    cr_assert_eq(cu->EventRecord(ev, s1), 0);
    cr_assert_eq(cu->StreamWaitEvent(s2, ev, 0), 0);
    cr_assert_eq(cu->MemcpyAsync(b, a, N, s2), 0);
    cr_assert_eq(cu->LaunchHostFunc(s2, set_flag, &ran), 0);
    usleep(100 * 1000);
    plait_cuda_double_stats_get(&mid);
    cr_assert_eq(mid.syncs, before.syncs, "enqueueing synchronised the host");
    cr_assert_eq(__atomic_load_n(&ran, __ATOMIC_ACQUIRE), 0, "s2 ran past an event of a held stream");
    cr_assert_eq(cu->EventQuery(ev), PLAIT_CU_ERROR_NOT_READY);
    cr_assert_eq(cu->StreamQuery(s2), PLAIT_CU_ERROR_NOT_READY);
    cr_assert_eq(((unsigned char *)(uintptr_t)b)[0], 0);

    cr_assert_eq(plait_cuda_double_stream_hold(s1, 0), 0);
    cr_assert_eq(cu->StreamSynchronize(s2), 0);
    cr_assert_eq(__atomic_load_n(&ran, __ATOMIC_ACQUIRE), 1);
    cr_assert_eq(cu->EventQuery(ev), 0);
    cr_assert_eq(cu->MemcpyDtoH(host, b, N), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(host[i], 0x5a, "byte %d", i);
    plait_cuda_double_stats_get(&after);
    cr_assert_eq(after.syncs, before.syncs + 2, "cuStreamSynchronize and cuMemcpyDtoH");

    /* Stream memory operations: s2 waits for a 64-bit word s1 writes. */
    void *flags = NULL;
    cr_assert_eq(cu->MemHostAlloc(&flags, 64, PLAIT_CU_MEMHOSTALLOC_DEVICEMAP), 0);
    plait_cudevptr word = (plait_cudevptr)(uintptr_t)flags;
    ran = 0;
    cr_assert_eq(cu->StreamWaitValue64(s2, word, 3, PLAIT_CU_STREAM_WAIT_VALUE_GEQ), 0);
    cr_assert_eq(cu->LaunchHostFunc(s2, set_flag, &ran), 0);
    usleep(50 * 1000);
    cr_assert_eq(__atomic_load_n(&ran, __ATOMIC_ACQUIRE), 0);
    cr_assert_eq(cu->StreamWriteValue64(s1, word, 3, PLAIT_CU_STREAM_WRITE_VALUE_DEFAULT), 0);
    cr_assert_eq(cu->StreamSynchronize(s2), 0);
    cr_assert_eq(__atomic_load_n(&ran, __ATOMIC_ACQUIRE), 1);
    cr_assert_eq(*(volatile uint64_t *)flags, 3);
    /* A device address outside any allocation is refused. */
    uint64_t not_device = 0;
    cr_assert_eq(cu->StreamWriteValue64(s1, (plait_cudevptr)(uintptr_t)&not_device, 1, 0), 1);

    cr_assert_eq(cu->EventDestroy(ev), 0);
    cr_assert_eq(cu->StreamDestroy(s1), 0);
    cr_assert_eq(cu->StreamDestroy(s2), 0);
    cr_assert_eq(cu->MemFree(a), 0);
    cr_assert_eq(cu->MemFree(b), 0);
    cr_assert_eq(cu->MemFreeHost(flags), 0);
    free(host);
}

Test(cuda_loader, double_legacy_stream_orders_after_blocking_streams)
{
    const struct plait_cu *cu = use_double("1");
    set_device(cu, 0);
    void *blocking = NULL;
    cr_assert_eq(cu->StreamCreateWithPriority(&blocking, 0, 0), 0);
    plait_cudevptr a = 0;
    cr_assert_eq(cu->MemAlloc(&a, 4096), 0);
    cr_assert_eq(plait_cuda_double_stream_hold(blocking, 1), 0);
    cr_assert_eq(cu->MemsetD8Async(a, 0x11, 4096, blocking), 0);
    int ran = 0;
    cr_assert_eq(cu->LaunchHostFunc(NULL, set_flag, &ran), 0);
    usleep(50 * 1000);
    cr_assert_eq(__atomic_load_n(&ran, __ATOMIC_ACQUIRE), 0, "the legacy stream overtook a blocking stream");
    cr_assert_eq(plait_cuda_double_stream_hold(blocking, 0), 0);
    cr_assert_eq(cu->StreamSynchronize(NULL), 0);
    cr_assert_eq(__atomic_load_n(&ran, __ATOMIC_ACQUIRE), 1);
    cr_assert_eq(((unsigned char *)(uintptr_t)a)[4095], 0x11);
    cr_assert_eq(cu->StreamDestroy(blocking), 0);
    cr_assert_eq(cu->MemFree(a), 0);
}

Test(cuda_loader, double_pageable_copies_behave_as_the_driver_stages_them)
{
    const struct plait_cu *cu = use_double("1");
    set_device(cu, 0);
    void *s = NULL;
    cr_assert_eq(cu->StreamCreateWithPriority(&s, PLAIT_CU_STREAM_NON_BLOCKING, 0), 0);
    plait_cudevptr d = 0;
    cr_assert_eq(cu->MemAlloc(&d, 64), 0);
    char src[64], dst[64];
    memset(src, 'a', sizeof(src));
    /* A pageable source is read before the call returns. */
    cr_assert_eq(plait_cuda_double_stream_hold(s, 1), 0);
    cr_assert_eq(cu->MemcpyHtoDAsync(d, src, sizeof(src), s), 0);
    memset(src, 'b', sizeof(src));
    cr_assert_eq(plait_cuda_double_stream_hold(s, 0), 0);
    /* A pageable destination: the call returns when the copy is done, and
     * that is a host synchronisation. */
    struct plait_cuda_double_stats before, after;
    plait_cuda_double_stats_get(&before);
    cr_assert_eq(cu->MemcpyAsync((plait_cudevptr)(uintptr_t)dst, d, sizeof(dst), s), 0);
    plait_cuda_double_stats_get(&after);
    cr_assert_eq(after.syncs, before.syncs + 1);
    for (size_t i = 0; i < sizeof(dst); i++)
        cr_assert_eq(dst[i], 'a', "byte %zu", i);
    cr_assert_eq(cu->StreamDestroy(s), 0);
    cr_assert_eq(cu->MemFree(d), 0);
}

struct legacy_arg {
    const struct plait_cu *cu;
    int ran;
};

static void *device1_legacy_work(void *p)
{
    struct legacy_arg *a = p;
    void *ctx = NULL;
    if (a->cu->DevicePrimaryCtxRetain(&ctx, 1) == 0 && a->cu->CtxSetCurrent(ctx) == 0 &&
        a->cu->LaunchHostFunc(NULL, set_flag, &a->ran) == 0 && a->cu->StreamSynchronize(NULL) == 0)
        return p;
    return NULL;
}

/* One legacy default stream per device's context: holding device 0's does
 * not stop device 1's. */
Test(cuda_loader, double_legacy_stream_per_device)
{
    const struct plait_cu *cu = use_double("2");
    set_device(cu, 0);
    cr_assert_eq(plait_cuda_double_stream_hold(NULL, 1), 0);
    struct legacy_arg a = {cu, 0};
    pthread_t t;
    void *ok = NULL;
    cr_assert_eq(pthread_create(&t, NULL, device1_legacy_work, &a), 0);
    cr_assert_eq(pthread_join(t, &ok), 0);
    cr_assert_not_null(ok, "device 1's legacy stream waited for device 0's");
    cr_assert_eq(a.ran, 1);
    cr_assert_eq(plait_cuda_double_stream_hold(NULL, 0), 0);
    cr_assert_eq(cu->StreamSynchronize(NULL), 0);
}

/* ---------------------------------------------------------------- capture and replay */

struct fill_args {
    int *dst;
    int value;
};

/* A test kernel: CTA i writes value + i to dst[i]. */
static void fill_emulate(const void *params, unsigned cta, unsigned ncta)
{
    const struct fill_args *a = params;
    (void)ncta;
    a->dst[cta] = a->value + (int)cta;
}

Test(cuda_loader, double_capture_replays_memset_memcpy_and_kernel_params)
{
    const struct plait_cu *cu = use_double("1");
    cr_assert_eq(plait_cuda_double_set_kernel("test_fill", fill_emulate, sizeof(struct fill_args)), 0);
    set_device(cu, 0);
    void *s = NULL, *mod = NULL, *fn = NULL;
    cr_assert_eq(cu->StreamCreateWithPriority(&s, PLAIT_CU_STREAM_NON_BLOCKING, 0), 0);
    cr_assert_eq(cu->ModuleLoadData(&mod, NULL), 0);
    cr_assert_eq(cu->ModuleGetFunction(&fn, mod, "test_fill"), 0);
    enum { N = 8192, CTAS = 4 };
    plait_cudevptr dev = 0, ints = 0;
    void *pinned = NULL;
    cr_assert_eq(cu->MemAlloc(&dev, N), 0);
    cr_assert_eq(cu->MemAlloc(&ints, CTAS * sizeof(int)), 0);
    cr_assert_eq(cu->MemHostAlloc(&pinned, N, 0), 0);
    memset(pinned, 0, N);

    struct plait_cuda_double_stats before, captured, replayed;
    plait_cuda_double_stats_get(&before);
    cr_assert_eq(cu->StreamBeginCapture(s, PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL), 0);
    int status = -1;
    cr_assert_eq(cu->StreamIsCapturing(s, &status), 0);
    cr_assert_eq(status, PLAIT_CU_STREAM_CAPTURE_STATUS_ACTIVE);
    cr_assert_eq(cu->MemsetD8Async(dev, 0x77, N, s), 0);
    cr_assert_eq(cu->MemcpyAsync((plait_cudevptr)(uintptr_t)pinned, dev, N, s), 0);
    /* The kernel's parameter is copied at capture: changing the caller's
     * struct afterwards must not change what replays write. */
    struct fill_args args = {(int *)(uintptr_t)ints, 100};
    void *params[] = {&args};
    cr_assert_eq(cu->LaunchKernel(fn, CTAS, 1, 1, 512, 1, 1, 0, s, params, NULL), 0);
    args.value = -1;
    args.dst = NULL;
    void *graph = NULL, *exec = NULL;
    cr_assert_eq(cu->StreamEndCapture(s, &graph), 0);
    cr_assert_not_null(graph);
    cr_assert_eq(cu->StreamIsCapturing(s, &status), 0);
    cr_assert_eq(status, PLAIT_CU_STREAM_CAPTURE_STATUS_NONE);
    plait_cuda_double_stats_get(&captured);
    cr_assert_eq(captured.memsets, before.memsets, "captured work ran");
    cr_assert_eq(captured.kernels_run, before.kernels_run, "a captured kernel ran");
    cr_assert_eq(captured.captured_launches, before.captured_launches + 1);
    cr_assert_eq(captured.launches, before.launches);
    cr_assert_eq(((unsigned char *)pinned)[0], 0);

    cr_assert_eq(cu->GraphInstantiate(&exec, graph, 0), 0);
    cr_assert_eq(cu->GraphDestroy(graph), 0);
    for (int replay = 0; replay < 3; replay++) {
        memset(pinned, 0, N);
        memset((void *)(uintptr_t)ints, 0, CTAS * sizeof(int));
        cr_assert_eq(cu->GraphLaunch(exec, s), 0);
        cr_assert_eq(cu->StreamSynchronize(s), 0);
        for (int i = 0; i < N; i++)
            cr_assert_eq(((unsigned char *)pinned)[i], 0x77, "replay %d byte %d", replay, i);
        for (int c = 0; c < CTAS; c++)
            cr_assert_eq(((int *)(uintptr_t)ints)[c], 100 + c, "replay %d CTA %d", replay, c);
    }
    plait_cuda_double_stats_get(&replayed);
    cr_assert_eq(replayed.graph_launches, captured.graph_launches + 3);
    cr_assert_eq(replayed.kernels_run, captured.kernels_run + 3);
    cr_assert_eq(cu->GraphExecDestroy(exec), 0);
    cr_assert_eq(cu->StreamDestroy(s), 0);
    cr_assert_eq(cu->ModuleUnload(mod), 0);
    cr_assert_eq(cu->MemFree(dev), 0);
    cr_assert_eq(cu->MemFree(ints), 0);
    cr_assert_eq(cu->MemFreeHost(pinned), 0);
}

Test(cuda_loader, double_capture_refuses_synchronisation_and_allocation)
{
    const struct plait_cu *cu = use_double("1");
    set_device(cu, 0);
    void *s = NULL, *graph = (void *)1;
    cr_assert_eq(cu->StreamCreateWithPriority(&s, PLAIT_CU_STREAM_NON_BLOCKING, 0), 0);
    char err[160];
    /* Synchronising a capturing stream fails and invalidates the capture. */
    cr_assert_eq(cu->StreamBeginCapture(s, PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL), 0);
    cr_assert_eq(cu->StreamSynchronize(s), PLAIT_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_str_eq(plait_cu_strerror(PLAIT_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED, err, sizeof(err)),
                     "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: operation not permitted when stream is capturing");
    int status = -1;
    cr_assert_eq(cu->StreamIsCapturing(s, &status), 0);
    cr_assert_eq(status, PLAIT_CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    cr_assert_eq(cu->StreamEndCapture(s, &graph), PLAIT_CU_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_null(graph);
    /* An allocation during a global-mode capture: the same. */
    plait_cudevptr d = 0;
    cr_assert_eq(cu->StreamBeginCapture(s, PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL), 0);
    cr_assert_eq(cu->MemAlloc(&d, 4096), PLAIT_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(cu->StreamEndCapture(s, &graph), PLAIT_CU_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Relaxed mode allows it. */
    cr_assert_eq(cu->StreamBeginCapture(s, PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED), 0);
    cr_assert_eq(cu->MemAlloc(&d, 4096), 0);
    cr_assert_eq(cu->StreamEndCapture(s, &graph), 0);
    cr_assert_not_null(graph);
    cr_assert_eq(cu->GraphDestroy(graph), 0);
    cr_assert_eq(cu->MemFree(d), 0);
    cr_assert_eq(cu->StreamDestroy(s), 0);
}

/* ---------------------------------------------------------------- IPC */

Test(cuda_loader, double_ipc_handle_in_forked_child_sees_parent_writes)
{
    const struct plait_cu *cu = use_double("1");
    set_device(cu, 0);
    enum { N = 1 << 20 };
    plait_cudevptr d = 0;
    cr_assert_eq(cu->MemAlloc(&d, N), 0);
    unsigned char *pattern = malloc(N);
    for (int i = 0; i < N; i++)
        pattern[i] = (unsigned char)(i * 7 + 3);
    plait_cu_ipc_handle h;
    cr_assert_eq(cu->IpcGetMemHandle(&h, d), 0);
    plait_cudevptr self_open = 0;
    cr_assert_eq(cu->IpcOpenMemHandle(&self_open, h, PLAIT_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), 201,
                 "a process cannot open its own handle (as with the driver)");

    int go[2];
    cr_assert_eq(pipe(go), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* The child waits for the parent's writes (made after the fork), then
         * checks them through its own mapping and answers in the last page. */
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 1)
            _exit(10);
        void *ctx = NULL;
        if (cu->DevicePrimaryCtxRetain(&ctx, 0) != 0 || cu->CtxSetCurrent(ctx) != 0)
            _exit(17);
        plait_cudevptr mine = 0;
        if (cu->IpcOpenMemHandle(&mine, h, PLAIT_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0)
            _exit(11);
        if (mine == d)
            _exit(12); /* a new mapping, not the inherited one */
        if (plait_mem_kind((void *)(uintptr_t)mine, NULL) != PLAIT_MEM_DEVICE)
            _exit(13);
        const unsigned char *p = (const unsigned char *)(uintptr_t)mine;
        for (int i = 0; i < N - 4096; i++)
            if (p[i] != pattern[i])
                _exit(14);
        if (cu->MemcpyHtoD(mine + N - 4096, "child", 6) != 0)
            _exit(15);
        if (cu->IpcCloseMemHandle(mine) != 0)
            _exit(16);
        _exit(0);
    }
    close(go[0]);
    cr_assert_eq(cu->MemcpyHtoD(d, pattern, N - 4096), 0);
    cr_assert_eq(write(go[1], "g", 1), 1);
    close(go[1]);
    int status = reap(pid, DEADLINE_S);
    cr_assert_eq(status, 0, "the child failed with %d (10: pipe, 11: open, 12: same address, 13: kind, "
                 "14: data, 15: write, 16: close, 17: context)", status);
    char answer[6] = "";
    cr_assert_eq(cu->MemcpyDtoH(answer, d + N - 4096, 6), 0);
    cr_assert_str_eq(answer, "child");
    cr_assert_eq(cu->MemFree(d), 0);
    free(pattern);
}
