/* The CUDA backend's host-side logic against the CUDA test double (suite
 * cuda_host): pointer classification, routing and its errors, stream
 * ordering, no host synchronisation on the hot path, CUDA-graph capture and
 * replay, grouped launches, device collectives equal to the CPU backend's,
 * processes sharing device memory through IPC, abort of a device wait.
 *
 * The double (tests/cuda_double.c) is loaded through PLAIT_CUDA_LIBRARY, the
 * same dlopen path as libcuda.so.1: device memory is host memory and kernels
 * run their host emulation, one thread per CTA. Nothing here ran on a GPU:
 * every test's name ends in "_double" and each prints so once. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cuda/cu.h"
#include "tests/cuda_compare.h"
#include "tests/cuda_double.h"
#include "tests/cuda_ranks.h"
#include "tests/harness.h"
#include "plait.h"

#ifndef PLAIT_CUDA_DOUBLE_PATH
#error "PLAIT_CUDA_DOUBLE_PATH (the double's path) comes from tests/meson.build"
#endif

#define DOUBLE_NOTE "(CUDA test double, not a GPU)"

static void use_double(void)
{
    /* Before plait first loads the driver (every test runs in its own process). */
    setenv("PLAIT_CUDA_LIBRARY", PLAIT_CUDA_DOUBLE_PATH, 1);
    setenv("PLAIT_CUDA_DOUBLE_TIMEOUT", "30", 1);
    printf("%s %s\n", criterion_current_test->name, DOUBLE_NOTE);
    fflush(stdout);
}

TestSuite(cuda_host, .init = use_double, .timeout = 60);

static const struct plait_cu *driver(void)
{
    const struct plait_cu *cu = plait_cu_get();
    cr_assert(cu, "plait did not load the test double %s", PLAIT_CUDA_DOUBLE_PATH);
    cr_assert(cu->is_double, "plait loaded %s, which is not the test double", cu->path);
    return cu;
}

/* The calling thread's current context: device 0's primary one. */
static void enter_device(const struct plait_cu *cu)
{
    void *ctx = NULL;
    cr_assert_eq(cu->DevicePrimaryCtxRetain(&ctx, 0), 0);
    cr_assert_eq(cu->CtxSetCurrent(ctx), 0);
}

static void *dev_alloc(const struct plait_cu *cu, size_t bytes)
{
    plait_cudevptr p = 0;
    cr_assert_eq(cu->MemAlloc(&p, bytes), 0, "cuMemAlloc(%zu)", bytes);
    return (void *)(uintptr_t)p;
}

static void dev_free(const struct plait_cu *cu, void *p)
{
    cu->MemFree((plait_cudevptr)(uintptr_t)p);
}

static struct plait_cuda_double_stats stats(void)
{
    struct plait_cuda_double_stats s;
    plait_cuda_double_stats_get(&s);
    return s;
}

/* ------------------------------------------------------------------ rank threads (cuda_ranks.c) */

/* Rank 0 takes the double's counters while every rank waits, so that none
 * is inside a call meanwhile. */
static void rank0_stats(struct cuda_rank *e, struct plait_cuda_double_stats *out)
{
    cuda_rank_barrier(e);
    if (e->rank == 0)
        *out = stats();
    cuda_rank_barrier(e);
}

#define FAILF(...)                                  \
    do {                                            \
        snprintf(msg, len, __VA_ARGS__);            \
        return 1;                                   \
    } while (0)

/* ------------------------------------------------------------------ classification */

Test(cuda_host, classify_double)
{
    const struct plait_cu *cu = driver();
    const uint64_t contexts0 = stats().contexts_created;
    int dev = 7;
    char *host = malloc(4096);

    /* A host-only program: classification and a whole collective create no context. */
    cr_expect_eq(plait_mem_kind(host, &dev), PLAIT_MEM_HOST);
    cr_expect_eq(dev, -1);
    cr_expect_eq(plait_mem_kind(NULL, &dev), PLAIT_MEM_HOST);
    plait_unique_id_t id;
    plait_comm_t comm;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS);
    cr_assert_eq(plait_comm_init_rank(&comm, 1, id, 0), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    float x[4] = {1, 2, 3, 4}, y[4];
    cr_expect_eq(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_SUCCESS, "%s",
                 plait_get_last_error(comm));
    cr_expect_eq(y[3], 4.0f);
    cr_expect_eq(plait_comm_destroy(comm), PLAIT_SUCCESS);
    void *cur = (void *)1;
    cr_expect_eq(cu->CtxGetCurrent(&cur), 0);
    cr_expect_null(cur, "a host-only program got a current context");
    cr_expect_eq(stats().contexts_created, contexts0, "a host-only program created a CUDA context");

    /* With a context: device, registered host, managed; interior pointers too. */
    enter_device(cu);
    char *d = dev_alloc(cu, 1 << 20);
    cr_expect_eq(plait_mem_kind(d, &dev), PLAIT_MEM_DEVICE);
    cr_expect_eq(dev, 0);
    cr_expect_eq(plait_mem_kind(d + 12345, &dev), PLAIT_MEM_DEVICE, "an interior device pointer");
    void *pinned = NULL;
    cr_assert_eq(cu->MemHostAlloc(&pinned, 1 << 16, PLAIT_CU_MEMHOSTALLOC_PORTABLE), 0);
    cr_expect_eq(plait_mem_kind(pinned, &dev), PLAIT_MEM_REGISTERED);
    cr_expect_eq(dev, -1);
    int (*alloc_managed)(plait_cudevptr *, size_t, unsigned) = NULL;
    *(void **)&alloc_managed = dlsym(cu->lib, "cuMemAllocManaged");
    cr_assert(alloc_managed, "the double exports no cuMemAllocManaged");
    plait_cudevptr m = 0;
    cr_assert_eq(alloc_managed(&m, 1 << 16, 1 /* CU_MEM_ATTACH_GLOBAL */), 0);
    cr_expect_eq(plait_mem_kind((void *)(uintptr_t)m, &dev), PLAIT_MEM_MANAGED);
    cr_expect_eq(plait_mem_kind(host, &dev), PLAIT_MEM_HOST, "malloc'd memory with a context");
    cr_expect_str_eq(plait_mem_kind_name(PLAIT_MEM_DEVICE), "device");
    cu->MemFree(m);
    cu->MemFreeHost(pinned);
    dev_free(cu, d);
    free(host);
}

/* ------------------------------------------------------------------ routing errors */

Test(cuda_host, mixed_kinds_double)
{
    const struct plait_cu *cu = driver();
    enter_device(cu);
    plait_unique_id_t id;
    plait_comm_t comm;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS);
    cr_assert_eq(plait_comm_init_rank(&comm, 1, id, 0), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    float *d = dev_alloc(cu, 4096);
    float host[256] = {0};
    void *pinned = NULL;
    cr_assert_eq(cu->MemHostAlloc(&pinned, 4096, 0), 0);

    struct {
        const void *s;
        void *r;
        const char *what;
    } mixes[] = {{host, d, "host -> device"}, {d, host, "device -> host"}, {pinned, d, "registered -> device"}};
    for (size_t i = 0; i < sizeof(mixes) / sizeof(mixes[0]); i++) {
        plait_result_t r = plait_allreduce(mixes[i].s, mixes[i].r, 256, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
        const char *m = plait_get_last_error(NULL);
        cr_expect_eq(r, PLAIT_ERR_INVALID_USAGE, "%s: %d (%s)", mixes[i].what, r, m);
        cr_expect(strstr(m, "sendbuff") && strstr(m, "recvbuff"), "%s: the message names neither buffer: %s",
                  mixes[i].what, m);
    }
    /* Nothing was started: the communicator still works, on either kind. */
    cr_expect_eq(plait_allreduce(host, host, 256, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_SUCCESS, "%s",
                 plait_get_last_error(comm));
    cr_expect_eq(plait_allreduce(d, d, 256, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_SUCCESS, "%s",
                 plait_get_last_error(comm));
    cr_expect_eq(cu->CtxSynchronize(), 0);
    plait_comm_destroy(comm);
    cu->MemFreeHost(pinned);
    dev_free(cu, d);
}

Test(cuda_host, no_context_double)
{
    const struct plait_cu *cu = driver();
    /* The communicator is made on a thread without a current context... */
    plait_unique_id_t id;
    plait_comm_t comm;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS);
    cr_assert_eq(plait_comm_init_rank(&comm, 1, id, 0), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    /* ... so it takes host buffers only: device ones get a clear error. */
    enter_device(cu);
    float *d = dev_alloc(cu, 4096);
    plait_result_t r = plait_allreduce(d, d, 256, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    const char *m = plait_get_last_error(NULL);
    cr_expect_eq(r, PLAIT_ERR_INVALID_USAGE, "got %d (%s)", r, m);
    cr_expect(strstr(m, "device") != NULL, "the message does not say device buffers are the problem: %s", m);
    float x = 1, y = 0;
    cr_expect_eq(plait_allreduce(&x, &y, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_SUCCESS,
                 "host buffers after the refusal: %s", plait_get_last_error(comm));
    plait_comm_destroy(comm);
    dev_free(cu, d);
}

/* ------------------------------------------------------------------ stream ordering */

enum { ORDER_N = 1 << 16 };

static int stream_order_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    void *s = NULL;
    plait_stream_t ps;
    float *in = dev_alloc(cu, ORDER_N * sizeof(float)), *out = dev_alloc(cu, ORDER_N * sizeof(float));
    /* Device memory of the double is host memory: the test reads it directly. */
    for (int i = 0; i < ORDER_N; i++) {
        in[i] = (float)(e->rank + 1);
        out[i] = -1.0f;
    }
    if (cuda_stream_open(cu, &s, &ps))
        FAILF("stream: %s", plait_get_last_error(NULL));
    if (plait_cuda_double_stream_hold(s, 1))
        FAILF("plait_cuda_double_stream_hold failed");
    plait_result_t r = plait_allreduce(in, out, ORDER_N, PLAIT_FLOAT32, PLAIT_SUM, e->comm, ps);
    if (r)
        FAILF("allreduce on a held stream: %s", plait_get_last_error(e->comm));
    /* Returned while the stream cannot have run it. */
    usleep(50 * 1000);
    if (out[0] != -1.0f || out[ORDER_N - 1] != -1.0f)
        FAILF("the output changed while the stream was held (out[0] = %g)", out[0]);
    cuda_rank_barrier(e);
    plait_cuda_double_stream_hold(s, 0);
    int cr = cu->StreamSynchronize(s);
    if (cr)
        FAILF("cuStreamSynchronize: %d", cr);
    const float want = (float)(e->n * (e->n + 1) / 2);
    for (int i = 0; i < ORDER_N; i++)
        if (out[i] != want)
            FAILF("after cuStreamSynchronize out[%d] = %g, want %g", i, out[i], want);
    cuda_stream_close(cu, s, ps);
    dev_free(cu, in);
    dev_free(cu, out);
    return 0;
}

Test(cuda_host, stream_order_double)
{
    cuda_run_ranks(2, CUDA_RANKS_CONTEXT, stream_order_rank, NULL, 40);
}

/* NULL stream with device buffers: CUDA's default stream, asynchronous too.
 * One rank: ranks that share a GPU must not share a stream (their kernels
 * would run one after the other, each waiting for the next). */
static int default_stream_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    int *in = dev_alloc(cu, 1024 * sizeof(int)), *out = dev_alloc(cu, 1024 * sizeof(int));
    for (int i = 0; i < 1024; i++) {
        in[i] = i;
        out[i] = -1;
    }
    plait_cuda_double_stream_hold(NULL, 1);
    plait_result_t r = plait_allreduce(in, out, 1024, PLAIT_INT32, PLAIT_SUM, e->comm, NULL);
    if (r)
        FAILF("allreduce on the default stream: %s", plait_get_last_error(e->comm));
    usleep(50 * 1000);
    int early = out[1023];
    plait_cuda_double_stream_hold(NULL, 0);
    if (cu->CtxSynchronize())
        FAILF("cuCtxSynchronize failed");
    if (early != -1)
        FAILF("out[1023] = %d before the default stream ran", early);
    for (int i = 0; i < 1024; i++)
        if (out[i] != i)
            FAILF("out[%d] = %d, want %d", i, out[i], i);
    dev_free(cu, in);
    dev_free(cu, out);
    return 0;
}

Test(cuda_host, default_stream_double)
{
    cuda_run_ranks(1, CUDA_RANKS_CONTEXT, default_stream_rank, NULL, 40);
}

/* ------------------------------------------------------------------ no host sync on the hot path */

static struct plait_cuda_double_stats hot_before, hot_after;

static int hot_path_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    void *s = NULL;
    plait_stream_t ps;
    const size_t n = 4096;
    float *a = dev_alloc(cu, n * sizeof(float)), *b = dev_alloc(cu, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        a[i] = 1.0f;
    if (cuda_stream_open(cu, &s, &ps))
        FAILF("stream: %s", plait_get_last_error(NULL));
    /* Warm-up: whatever a first call sets up (plans, connections) happens here. */
    if (plait_allreduce(a, b, n, PLAIT_FLOAT32, PLAIT_SUM, e->comm, ps) || cu->StreamSynchronize(s))
        FAILF("warm-up: %s", plait_get_last_error(e->comm));
    rank0_stats(e, &hot_before);
    for (int it = 0; it < 20; it++) {
        plait_result_t r = plait_allreduce(it % 2 ? b : a, it % 2 ? a : b, n, PLAIT_FLOAT32, PLAIT_MAX, e->comm, ps);
        if (r)
            FAILF("call %d: %s", it, plait_get_last_error(e->comm));
    }
    rank0_stats(e, &hot_after);
    if (cu->StreamSynchronize(s))
        FAILF("cuStreamSynchronize");
    for (size_t i = 0; i < n; i++)
        if (a[i] != 1.0f || b[i] != 1.0f)
            FAILF("a[%zu] = %g, b[%zu] = %g, want 1", i, a[i], i, b[i]);
    cuda_stream_close(cu, s, ps);
    dev_free(cu, a);
    dev_free(cu, b);
    return 0;
}

Test(cuda_host, no_host_sync_double)
{
    cuda_run_ranks(2, CUDA_RANKS_CONTEXT, hot_path_rank, NULL, 40);
    cr_expect_eq(hot_after.syncs - hot_before.syncs, 0, "40 device calls made %llu host synchronisations",
                 (unsigned long long)(hot_after.syncs - hot_before.syncs));
    cr_expect_eq(hot_after.allocs - hot_before.allocs, 0, "40 device calls made %llu allocations",
                 (unsigned long long)(hot_after.allocs - hot_before.allocs));
    cr_expect_eq(hot_after.frees - hot_before.frees, 0, "40 device calls freed %llu allocations",
                 (unsigned long long)(hot_after.frees - hot_before.frees));
    cr_expect_eq(hot_after.streams_created - hot_before.streams_created, 0, "the hot path created streams");
    cr_expect_eq(hot_after.launches - hot_before.launches, 40, "%llu launches for 2 ranks x 20 calls",
                 (unsigned long long)(hot_after.launches - hot_before.launches));
}

/* ------------------------------------------------------------------ graph capture */

/* Replays a captured float sum allreduce of in into out `reps` times with
 * fresh inputs ((rank + 1) * rep + i % 5) and checks each result: the graph's
 * parameters must reduce the current inputs. */
static int replay_allreduce(struct cuda_rank *e, void *exec, void *s, float *in, float *out, size_t n, int reps,
                            char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    for (int rep = 1; rep <= reps; rep++) {
        for (size_t i = 0; i < n; i++) {
            in[i] = (float)((e->rank + 1) * rep + (int)(i % 5));
            out[i] = -7.0f;
        }
        cuda_rank_barrier(e);
        int cr;
        if ((cr = cu->GraphLaunch(exec, s)) || (cr = cu->StreamSynchronize(s)))
            FAILF("replay %d: %d", rep, cr);
        for (size_t i = 0; i < n; i++) {
            const float want = (float)(rep * e->n * (e->n + 1) / 2 + e->n * (int)(i % 5));
            if (out[i] != want)
                FAILF("replay %d: out[%zu] = %g, want %g", rep, i, out[i], want);
        }
        cuda_rank_barrier(e); /* nobody rewrites inputs while a peer's replay may read them */
    }
    return 0;
}

static int graph_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    void *s = NULL, *graph = NULL, *exec = NULL;
    plait_stream_t ps;
    const size_t n = 3000;
    float *in = dev_alloc(cu, n * sizeof(float)), *out = dev_alloc(cu, n * sizeof(float));
    if (cuda_stream_open(cu, &s, &ps))
        FAILF("stream: %s", plait_get_last_error(NULL));
    for (size_t i = 0; i < n; i++)
        in[i] = 1.0f;
    /* One eager call first, as frameworks do before capturing. */
    if (plait_allreduce(in, out, n, PLAIT_FLOAT32, PLAIT_SUM, e->comm, ps) || cu->StreamSynchronize(s))
        FAILF("eager call: %s", plait_get_last_error(e->comm));
    int cr = cu->StreamBeginCapture(s, PLAIT_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (cr)
        FAILF("cuStreamBeginCapture: %d", cr);
    plait_result_t r = plait_allreduce(in, out, n, PLAIT_FLOAT32, PLAIT_SUM, e->comm, ps);
    cr = cu->StreamEndCapture(s, &graph);
    if (r)
        FAILF("allreduce during capture: %s", plait_get_last_error(e->comm));
    if (cr || !graph)
        FAILF("cuStreamEndCapture: %d", cr);
    if ((cr = cu->GraphInstantiate(&exec, graph, 0)))
        FAILF("cuGraphInstantiate: %d", cr);
    /* Nothing is destroyed, the inputs change, the graph replays: each replay
     * must reduce the current inputs with the captured parameters. */
    if (replay_allreduce(e, exec, s, in, out, n, 3, msg, len))
        return 1;
    cu->GraphExecDestroy(exec);
    cu->GraphDestroy(graph);
    cuda_stream_close(cu, s, ps);
    dev_free(cu, in);
    dev_free(cu, out);
    return 0;
}

Test(cuda_host, graph_capture_double)
{
    cuda_run_ranks(2, CUDA_RANKS_CONTEXT, graph_rank, NULL, 50);
}

/* ------------------------------------------------------------------ capture modes */

/* Another thread's global-mode capture of a blocking stream is in progress
 * while the ranks create their communicators (cuMemAlloc and copies: unsafe
 * calls, and the legacy default stream would join the captured stream), and
 * a rank captures, in global mode, the first call of a shape that needs new
 * scratch memory: plait makes those calls in the thread's relaxed mode, as
 * NCCL does, so neither fails nor invalidates a capture. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int begun, end, ended;
    int begin_result, end_result;
} capt = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0};

static void *capturer(void *arg)
{
    const struct plait_cu *cu = arg;
    void *ctx = NULL, *s = NULL, *graph = NULL;
    int r = cu->DevicePrimaryCtxRetain(&ctx, 0);
    if (!r)
        r = cu->CtxSetCurrent(ctx);
    /* A blocking stream (flags 0), as cudaStreamCreate makes: work on CUDA's
     * legacy default stream (synchronous copies, NULL-stream fills) would
     * join it and break its capture. */
    if (!r)
        r = cu->StreamCreateWithPriority(&s, 0, 0);
    if (!r)
        r = cu->StreamBeginCapture(s, PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL);
    pthread_mutex_lock(&capt.lock);
    capt.begin_result = r;
    capt.begun = 1;
    pthread_cond_broadcast(&capt.cond);
    while (!capt.end)
        pthread_cond_wait(&capt.cond, &capt.lock);
    pthread_mutex_unlock(&capt.lock);
    int e = r ? r : cu->StreamEndCapture(s, &graph);
    if (graph)
        cu->GraphDestroy(graph);
    if (s)
        cu->StreamDestroy(s);
    pthread_mutex_lock(&capt.lock);
    capt.end_result = e;
    capt.ended = 1;
    pthread_cond_broadcast(&capt.cond);
    pthread_mutex_unlock(&capt.lock);
    return NULL;
}

static int relaxed_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    /* The communicator was made while the capture ran; end it now (every
     * rank's init is done), before this test's own unsafe calls. */
    cuda_rank_barrier(e);
    if (e->rank == 0) {
        pthread_mutex_lock(&capt.lock);
        capt.end = 1;
        pthread_cond_broadcast(&capt.cond);
        while (!capt.ended)
            pthread_cond_wait(&capt.cond, &capt.lock);
        pthread_mutex_unlock(&capt.lock);
    }
    cuda_rank_barrier(e);
    const size_t n = 5000;
    float *in = dev_alloc(cu, n * sizeof(float)), *out = dev_alloc(cu, n * sizeof(float));
    void *s = NULL, *graph = NULL, *exec = NULL;
    plait_stream_t ps;
    if (cuda_stream_open(cu, &s, &ps))
        FAILF("stream: %s", plait_get_last_error(NULL));
    /* Every rank's own unsafe calls (the allocations above) are done before
     * any rank begins its global-mode capture, which forbids them. */
    cuda_rank_barrier(e);
    /* No eager call: the one-shot's scratch is first allocated inside the capture. */
    int cr = cu->StreamBeginCapture(s, PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (cr)
        FAILF("cuStreamBeginCapture: %d", cr);
    plait_result_t r = plait_allreduce(in, out, n, PLAIT_FLOAT32, PLAIT_SUM, e->comm, ps);
    cr = cu->StreamEndCapture(s, &graph);
    if (r)
        FAILF("a first call captured in global mode: %s", plait_get_last_error(e->comm));
    if (cr || !graph)
        FAILF("cuStreamEndCapture: %d (the capture was invalidated)", cr);
    cuda_rank_barrier(e); /* no rank's capture is still open from here on */
    if ((cr = cu->GraphInstantiate(&exec, graph, 0)))
        FAILF("cuGraphInstantiate: %d", cr);
    if (replay_allreduce(e, exec, s, in, out, n, 2, msg, len))
        return 1;
    cu->GraphExecDestroy(exec);
    cu->GraphDestroy(graph);
    cuda_stream_close(cu, s, ps);
    dev_free(cu, in);
    dev_free(cu, out);
    return 0;
}

Test(cuda_host, capture_relaxed_double)
{
    const struct plait_cu *cu = driver();
    pthread_t t;
    setenv("PLAIT_ALGO", "allreduce:oneshot", 1);
    cr_assert_eq(pthread_create(&t, NULL, capturer, (void *)cu), 0);
    pthread_mutex_lock(&capt.lock);
    while (!capt.begun)
        pthread_cond_wait(&capt.cond, &capt.lock);
    pthread_mutex_unlock(&capt.lock);
    cr_assert_eq(capt.begin_result, 0, "the other thread's capture did not begin (%d)", capt.begin_result);
    cuda_run_ranks(2, CUDA_RANKS_CONTEXT, relaxed_rank, NULL, 50);
    pthread_join(t, NULL);
    unsetenv("PLAIT_ALGO");
    cr_expect_eq(capt.end_result, 0,
                 "the other thread's global-mode capture ended with %d: plait's setup invalidated it",
                 capt.end_result);
}

/* ------------------------------------------------------------------ co-residency */

/* Every CTA of every rank sharing a GPU must be resident at once (they spin
 * on each other). A GPU of 2 SMs shared by 4 ranks holds less than one CTA
 * per rank: device calls are refused with a reason instead of hanging. */
static int oversubscribed_rank(struct cuda_rank *e, char *msg, size_t len)
{
    float *buf = dev_alloc(e->cu, 4096);
    plait_result_t r = plait_allreduce(buf, buf, 1024, PLAIT_FLOAT32, PLAIT_SUM, e->comm, NULL);
    const char *why = plait_get_last_error(e->comm);
    dev_free(e->cu, buf);
    if (r != PLAIT_ERR_INVALID_USAGE || !strstr(why, "SMs"))
        FAILF("allreduce on an over-subscribed GPU: %d (%s), want PLAIT_ERR_INVALID_USAGE naming the SMs", r, why);
    return 0;
}

Test(cuda_host, oversubscribed_gpu_double)
{
    setenv("PLAIT_CUDA_DOUBLE_SMS", "2", 1);
    cuda_run_ranks(4, CUDA_RANKS_CONTEXT, oversubscribed_rank, NULL, 40);
    unsetenv("PLAIT_CUDA_DOUBLE_SMS");
}

/* 3 ranks on a GPU of 6 SMs: 2 resident CTAs each. Collectives are capped to
 * 2 channels and still right; a group that sends to and receives from both
 * peers needs 4 concurrent lanes and is refused (split, it could deadlock). */
static int capped_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    const size_t n = 1 << 16;
    float *in = dev_alloc(cu, n * sizeof(float)), *out = dev_alloc(cu, 2 * n * sizeof(float));
    void *s = NULL;
    plait_stream_t ps;
    if (cuda_stream_open(cu, &s, &ps))
        FAILF("stream: %s", plait_get_last_error(NULL));
    for (size_t i = 0; i < n; i++)
        in[i] = (float)(e->rank + 1);
    if (plait_allreduce(in, out, n, PLAIT_FLOAT32, PLAIT_SUM, e->comm, ps) || cu->StreamSynchronize(s))
        FAILF("capped allreduce: %s", plait_get_last_error(e->comm));
    for (size_t i = 0; i < n; i++)
        if (out[i] != 6.0f)
            FAILF("capped allreduce: out[%zu] = %g, want 6", i, out[i]);
    plait_group_start();
    for (int p = 0; p < e->n; p++)
        if (p != e->rank) {
            plait_send(in, n, PLAIT_FLOAT32, p, e->comm, ps);
            plait_recv(out + (p < e->rank ? 0 : n), n, PLAIT_FLOAT32, p, e->comm, ps);
        }
    plait_result_t r = plait_group_end();
    const char *why = plait_get_last_error(NULL);
    cu->StreamSynchronize(s);
    cuda_stream_close(cu, s, ps);
    dev_free(cu, in);
    dev_free(cu, out);
    if (r != PLAIT_ERR_INVALID_USAGE || !strstr(why, "resident"))
        FAILF("a 4-lane send/recv group with 2 resident CTAs: %d (%s), want PLAIT_ERR_INVALID_USAGE", r, why);
    return 0;
}

Test(cuda_host, cta_share_cap_double)
{
    setenv("PLAIT_CUDA_DOUBLE_SMS", "6", 1);
    cuda_run_ranks(3, CUDA_RANKS_CONTEXT, capped_rank, NULL, 40);
    unsetenv("PLAIT_CUDA_DOUBLE_SMS");
}

/* ------------------------------------------------------------------ grouped calls */

static struct plait_cuda_double_stats grp_before, grp_after;

static int group_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    void *s = NULL;
    plait_stream_t ps;
    /* 4 MiB each way: many times the FIFO (PLAIT_BUFFSIZE, 512 KiB), so the
     * send and the receive must run at once to complete. */
    const size_t n = (4u << 20) / sizeof(uint32_t);
    uint32_t *sb = dev_alloc(cu, n * 4), *rb = dev_alloc(cu, n * 4);
    const int peer = 1 - e->rank;
    for (size_t i = 0; i < n; i++) {
        sb[i] = (uint32_t)(e->rank * 0x10000000u + i);
        rb[i] = 0xdeadbeef;
    }
    if (cuda_stream_open(cu, &s, &ps))
        FAILF("stream: %s", plait_get_last_error(NULL));
    rank0_stats(e, &grp_before);
    plait_result_t r0 = plait_group_start();
    plait_result_t r1 = e->rank == 0 ? plait_send(sb, n, PLAIT_UINT32, peer, e->comm, ps)
                                     : plait_recv(rb, n, PLAIT_UINT32, peer, e->comm, ps);
    plait_result_t r2 = e->rank == 0 ? plait_recv(rb, n, PLAIT_UINT32, peer, e->comm, ps)
                                     : plait_send(sb, n, PLAIT_UINT32, peer, e->comm, ps);
    plait_result_t r3 = plait_group_end();
    if (r0 || r1 || r2 || r3)
        FAILF("group: %d %d %d %d: %s", r0, r1, r2, r3, plait_get_last_error(e->comm));
    if (cu->StreamSynchronize(s))
        FAILF("cuStreamSynchronize");
    rank0_stats(e, &grp_after);
    for (size_t i = 0; i < n; i++)
        if (rb[i] != (uint32_t)(peer * 0x10000000u + i))
            FAILF("rb[%zu] = 0x%x, want 0x%x", i, rb[i], (uint32_t)(peer * 0x10000000u + i));
    cuda_stream_close(cu, s, ps);
    dev_free(cu, sb);
    dev_free(cu, rb);
    return 0;
}

Test(cuda_host, group_launch_double)
{
    cuda_run_ranks(2, CUDA_RANKS_CONTEXT, group_rank, NULL, 50);
    cr_expect_eq(grp_after.launches - grp_before.launches, 2,
                 "a group of send + recv on 2 ranks made %llu kernel launches, want 1 per rank",
                 (unsigned long long)(grp_after.launches - grp_before.launches));
}

/* ------------------------------------------------------------------ abort */

static int abort_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    float *buf = dev_alloc(cu, 1 << 20);
    void *s = NULL;
    plait_stream_t ps;
    if (cuda_stream_open(cu, &s, &ps))
        FAILF("stream: %s", plait_get_last_error(NULL));
    if (e->rank == 1) {
        /* The peer never joins: rank 0's kernel waits for it until the abort. */
        cuda_rank_barrier(e);
        cuda_rank_barrier(e);
    } else {
        for (int i = 0; i < (1 << 18); i++)
            buf[i] = 1.0f;
        plait_result_t r = plait_allreduce(buf, buf, 1 << 18, PLAIT_FLOAT32, PLAIT_SUM, e->comm, ps);
        if (r)
            FAILF("allreduce: %s", plait_get_last_error(e->comm));
        cuda_rank_barrier(e);
        usleep(200 * 1000);
        double t0 = mr_now();
        plait_result_t ar = plait_comm_abort(e->comm);
        e->comm = NULL; /* freed by the abort */
        int cr = cu->StreamSynchronize(s);
        double waited = mr_now() - t0;
        cuda_rank_barrier(e);
        if (ar)
            FAILF("plait_comm_abort: %d", ar);
        if (waited > 10)
            FAILF("the kernel kept waiting %.1f s after the abort (cuStreamSynchronize: %d)", waited, cr);
        if (buf[0] == 2.0f)
            FAILF("the allreduce completed without its peer");
        printf("abort_double: the device wait ended %.3f s after plait_comm_abort (cuStreamSynchronize %d)\n",
               waited, cr);
    }
    cuda_stream_close(cu, s, ps);
    dev_free(cu, buf);
    return 0;
}

Test(cuda_host, abort_double)
{
    cuda_run_ranks(2, CUDA_RANKS_CONTEXT, abort_rank, NULL, 40);
}

/* A kernel wait that passes PLAIT_COLL_TIMEOUT becomes the communicator's
 * asynchronous error. */
static int timeout_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const struct plait_cu *cu = e->cu;
    float *buf = dev_alloc(cu, 4096);
    void *s = NULL;
    plait_stream_t ps;
    if (cuda_stream_open(cu, &s, &ps))
        FAILF("stream: %s", plait_get_last_error(NULL));
    if (e->rank == 0) {
        if (plait_allreduce(buf, buf, 1024, PLAIT_FLOAT32, PLAIT_SUM, e->comm, ps))
            FAILF("allreduce: %s", plait_get_last_error(e->comm));
        double t0 = mr_now();
        int cr = cu->StreamSynchronize(s);
        plait_result_t async = PLAIT_SUCCESS;
        plait_comm_get_async_error(e->comm, &async);
        if (mr_now() - t0 > 15)
            FAILF("the kernel waited %.1f s past a 1 s PLAIT_COLL_TIMEOUT (sync %d)", mr_now() - t0, cr);
        if (async != PLAIT_ERR_TIMEOUT && async != PLAIT_ERR_REMOTE)
            FAILF("asynchronous error after the kernel's timeout: %d (%s)", async, plait_get_last_error(e->comm));
        plait_comm_abort(e->comm);
        e->comm = NULL;
    }
    cuda_rank_barrier(e);
    if (e->rank == 1) {
        plait_comm_abort(e->comm);
        e->comm = NULL;
    }
    cuda_stream_close(cu, s, ps);
    dev_free(cu, buf);
    return 0;
}

Test(cuda_host, coll_timeout_double)
{
    setenv("PLAIT_COLL_TIMEOUT", "1", 1);
    cuda_run_ranks(2, CUDA_RANKS_CONTEXT, timeout_rank, NULL, 40);
}

/* ------------------------------------------------------------------ device == CPU backend */

static void compare_matrix(struct cx_config *cfg)
{
    long passed = 0, failed = 0;
    cfg->label = "double";
    /* The whole run's budget: well inside meson's 120 s, and with room for
     * an ASan build on a loaded 2-core machine (15-23 s there usually, over
     * 50 s once in CI). */
    cfg->timeout_s = 100;
    int st = cx_run_cases(cfg, stdout, &passed, &failed);
    printf("%ld passed, %ld failed %s\n", passed, failed, DOUBLE_NOTE);
    cr_expect_eq(st, 0, "%ld of %ld cases failed (status %d): see the FAIL lines", failed, passed + failed, st);
}

Test(cuda_host, matrix_1_double)
{
    struct cx_config cfg;
    cx_config_default(&cfg, 1, 70001);
    compare_matrix(&cfg);
}

Test(cuda_host, matrix_2_double)
{
    struct cx_config cfg;
    cx_config_default(&cfg, 2, 100003);
    compare_matrix(&cfg);
}

Test(cuda_host, matrix_4_double)
{
    struct cx_config cfg;
    cx_config_default(&cfg, 4, 30001);
    compare_matrix(&cfg);
}

/* Another schedule for every collective that has one, on 3 ranks (not a power
 * of two) with 3 channels and small chunks (many steps per channel). */
Test(cuda_host, matrix_3_other_algos_double)
{
    struct cx_config cfg;
    cx_config_default(&cfg, 3, 50001);
    cfg.algo = "tree;allgather:bruck;reducescatter:pat;alltoall:bruck;gather:linear;scatter:linear";
    cfg.nchannels = 3;
    cfg.chunk_bytes = 4096;
    cfg.types = (1u << PLAIT_INT8) | (1u << PLAIT_UINT32) | (1u << PLAIT_INT64) | (1u << PLAIT_FLOAT16) |
                (1u << PLAIT_FLOAT32) | (1u << PLAIT_BFLOAT16) | (1u << PLAIT_FLOAT8_E5M2);
    compare_matrix(&cfg);
}

/* ------------------------------------------------------------------ processes */

Test(cuda_host, procs_ipc_double)
{
    /* Fork first, as with a real driver: this process has made no CUDA call. */
    struct cx_config cfg;
    cx_config_default(&cfg, 2, 100003);
    cfg.use_procs = 1;
    cfg.types = (1u << PLAIT_FLOAT32) | (1u << PLAIT_BFLOAT16) | (1u << PLAIT_INT8);
    long passed = 0, failed = 0;
    cfg.label = "double";
    /* The whole run's budget: well inside meson's 120 s, and with room for
     * an ASan build on a loaded 2-core machine (15-23 s there usually, over
     * 50 s once in CI). */
    cfg.timeout_s = 100;
    int st = cx_run_cases(&cfg, stdout, &passed, &failed);
    printf("%ld passed, %ld failed %s\n", passed, failed, DOUBLE_NOTE);
    cr_expect_eq(st, 0, "%ld of %ld cases failed (status %d): see the FAIL lines", failed, passed + failed, st);
}

/* ------------------------------------------------------------------ dead peers */

/* A peer process that is gone while this rank's device collective needs it
 * (dead before the call, or killed while the kernel waits): the survivor's
 * kernel is stopped and the communicator's asynchronous error names the dead
 * rank in plait_comm_peer_gone's words ("rank 1 ... is gone"), promptly —
 * not after PLAIT_COLL_TIMEOUT (15 s here). Over shared memory and CUDA IPC
 * (the kernel's own FIFOs: nothing on the host moves its data) and over
 * sockets (the proxy thread). */
struct dead_board {
    int first_done[2];
    int launched;    /* the survivor's second call is queued */
    int go;          /* the parent: the victim is dead (between), or make the call (mid) */
    int done;
    int result;      /* the second call's return value */
    int async;       /* the asynchronous error after the stream ended */
    int sync;        /* cuStreamSynchronize's result */
    double took;     /* from the second call to the asynchronous error */
    double destroy_took; /* plait_comm_destroy after it (teardown waits for no dead peer) */
    char text[800];
    int next_result;     /* a third call after the error: refused, naming it */
    char next_text[800];
};

struct dead_arg {
    int socket;
    int mid; /* kill the victim while the survivor's kernel waits, not before the call */
    int ce;  /* PLAIT_CE_COLL=1 and an allgather into a memory window: copy engines, no kernel */
};

/* The call under test: an allreduce, or with a->ce an allgather into the
 * window `win` (copy engines: stream waits on flags the peer sets). */
static plait_result_t dead_call(const struct dead_arg *a, float *buf, float *win, plait_comm_t comm,
                                plait_stream_t ps)
{
    if (a->ce)
        return plait_allgather(buf, win, 256, PLAIT_FLOAT32, comm, ps);
    return plait_allreduce(buf, buf, 256, PLAIT_FLOAT32, PLAIT_SUM, comm, ps);
}

#define DEAD_FAIL(...)                                                                                             \
    do {                                                                                                           \
        snprintf(c->msg, c->msglen, __VA_ARGS__);                                                                  \
        return 1;                                                                                                  \
    } while (0)

static int wait_board(const int *flag, double seconds)
{
    const double give_up = mr_now() + seconds;
    while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
        if (mr_now() > give_up)
            return -1;
        usleep(2000);
    }
    return 0;
}

static int dead_child(struct mr_child *c, void *arg)
{
    const struct dead_arg *a = arg;
    struct dead_board *b = c->shared;
    if (a->socket)
        setenv("PLAIT_TRANSPORT", "socket", 1);
    if (a->ce)
        setenv("PLAIT_CE_COLL", "1", 1);
    setenv("PLAIT_COLL_TIMEOUT", "15", 1);
    const struct plait_cu *cu = plait_cu_get();
    if (!cu || !cu->is_double)
        DEAD_FAIL("rank %d: the test double did not load", c->rank);
    void *ctx = NULL;
    if (cu->DevicePrimaryCtxRetain(&ctx, 0) || cu->CtxSetCurrent(ctx))
        DEAD_FAIL("rank %d: no context on device 0", c->rank);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        DEAD_FAIL("rank %d: init: %s", c->rank, plait_get_last_error(NULL));
    plait_cudevptr d = 0, dw = 0;
    if (cu->MemAlloc(&d, 4096) || cu->MemAlloc(&dw, 4096))
        DEAD_FAIL("rank %d: cuMemAlloc", c->rank);
    float *buf = (float *)(uintptr_t)d, *win = (float *)(uintptr_t)dw;
    plait_window_t w = NULL;
    if (a->ce && plait_comm_window_register(comm, win, 4096, PLAIT_WIN_COLL_SYMMETRIC, &w))
        DEAD_FAIL("rank %d: plait_comm_window_register: %s", c->rank, plait_get_last_error(comm));
    void *s = NULL;
    plait_stream_t ps;
    if (cuda_stream_open(cu, &s, &ps))
        DEAD_FAIL("rank %d: stream: %s", c->rank, plait_get_last_error(NULL));
    for (int i = 0; i < 256; i++)
        buf[i] = 1.0f;
    if ((r = dead_call(a, buf, win, comm, ps)) || cu->StreamSynchronize(s))
        DEAD_FAIL("rank %d: the first call: %s", c->rank, plait_get_last_error(comm));
    plait_result_t ae = PLAIT_SUCCESS;
    plait_comm_get_async_error(comm, &ae);
    if (ae != PLAIT_SUCCESS || (a->ce ? win[256] != 1.0f : buf[0] != 2.0f))
        DEAD_FAIL("rank %d: the first call: async %d, element 0 is %g, window element 256 is %g", c->rank, (int)ae,
                  (double)buf[0], (double)win[256]);
    __atomic_store_n(&b->first_done[c->rank], 1, __ATOMIC_RELEASE);
    if (c->rank == 1) {
        usleep(60 * 1000 * 1000); /* killed by the parent here */
        return 0;
    }
    if (!a->mid && wait_board(&b->go, 30))
        DEAD_FAIL("no go from the parent within 30 s");
    const double t0 = mr_now();
    r = dead_call(a, buf, win, comm, ps);
    __atomic_store_n(&b->launched, 1, __ATOMIC_RELEASE);
    b->result = (int)r;
    if (r == PLAIT_SUCCESS) {
        b->sync = cu->StreamSynchronize(s);
        /* The kernel has ended; its error is the communicator's now (the
         * double's stream sync reports no kernel error, as a GPU's would not). */
        const double give_up = mr_now() + 30;
        do {
            plait_comm_get_async_error(comm, &ae);
            if (ae != PLAIT_SUCCESS && ae != PLAIT_IN_PROGRESS)
                break;
            usleep(1000);
        } while (mr_now() < give_up);
    } else {
        ae = r;
    }
    b->took = mr_now() - t0;
    b->async = (int)ae;
    snprintf(b->text, sizeof(b->text), "%s", plait_get_last_error(comm));
    b->next_result = (int)dead_call(a, buf, win, comm, ps);
    snprintf(b->next_text, sizeof(b->next_text), "%s", plait_get_last_error(comm));
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    const double d0 = mr_now();
    plait_comm_destroy(comm); /* frees the window too */
    b->destroy_took = mr_now() - d0;
    cuda_stream_close(cu, s, ps);
    cu->MemFree(d);
    cu->MemFree(dw);
    return 0;
}

static void dead_peer(int socket, int mid, int ce)
{
    struct dead_arg a = {.socket = socket, .mid = mid, .ce = ce};
    const char *how = ce ? "copy engines" : socket ? "sockets (the proxy)" : "shm and CUDA IPC";
    char msg[1024];
    struct mr_procs *p = mr_procs_start(2, dead_child, &a, sizeof(struct dead_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    struct dead_board *b = mr_procs_shared(p);
    int ok = wait_board(&b->first_done[0], 40) == 0 && wait_board(&b->first_done[1], 40) == 0;
    if (ok && mid) {
        /* The survivor's kernel waits for the victim's data. */
        ok = wait_board(&b->launched, 20) == 0;
        usleep(300 * 1000);
    }
    if (!ok) {
        int failed = mr_procs_join(p, 5, msg, sizeof(msg));
        mr_procs_free(p);
        cr_assert_fail("the ranks did not reach the second allreduce (%d failed: %s)", failed, msg);
    }
    mr_procs_kill(p, 1, SIGKILL);
    siginfo_t si;
    const double give_up = mr_now() + 10;
    while (mr_now() < give_up) {
        memset(&si, 0, sizeof(si));
        if (waitid(P_PID, mr_procs_pid(p, 1), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid)
            break;
        usleep(2000);
    }
    __atomic_store_n(&b->go, 1, __ATOMIC_RELEASE);
    wait_board(&b->done, 40);
    int failed = mr_procs_join(p, 30, msg, sizeof(msg));
    struct dead_board rep = *b;
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    cr_assert(rep.done, "rank 0 never got an error from its device call (%s, victim dead %s)", how,
              mid ? "mid-collective" : "between collectives");
    printf("dead peer %s (%s): rank 0's device call returned %d, sync %d, async error %s after %.3f s: %s %s\n",
           mid ? "mid-collective" : "between collectives", how, rep.result, rep.sync,
           plait_get_error_string((plait_result_t)rep.async), rep.took, rep.text, DOUBLE_NOTE);
    cr_expect_eq(rep.async, PLAIT_ERR_REMOTE, "rank 0's error is %s, not PLAIT_ERR_REMOTE: %s",
                 plait_get_error_string((plait_result_t)rep.async), rep.text);
    cr_expect_lt(rep.took, 5.0, "rank 0 learned of the dead rank 1 after %.2f s (limit 5 s; the timeout is 15 s)",
                 rep.took);
    cr_expect(strstr(rep.text, "rank 1") && strstr(rep.text, "is gone"),
              "rank 0's error does not say that rank 1 is gone: \"%s\"", rep.text);
    cr_expect(rep.next_result != PLAIT_SUCCESS && strstr(rep.next_text, "rank 1"),
              "rank 0's next call after the error returned %s: \"%s\"",
              plait_get_error_string((plait_result_t)rep.next_result), rep.next_text);
    printf("rank 0's next call: %s; its plait_comm_destroy then took %.3f s\n", rep.next_text, rep.destroy_took);
    cr_expect_lt(rep.destroy_took, 5.0, "rank 0's plait_comm_destroy took %.2f s (limit 5 s): it waited for the dead rank",
                 rep.destroy_took);
}

Test(cuda_host, dead_peer_between_shm_double, .timeout = 120)
{
    dead_peer(0, 0, 0);
}

Test(cuda_host, dead_peer_mid_shm_double, .timeout = 120)
{
    dead_peer(0, 1, 0);
}

Test(cuda_host, dead_peer_between_socket_double, .timeout = 120)
{
    dead_peer(1, 0, 0);
}

Test(cuda_host, dead_peer_mid_socket_double, .timeout = 120)
{
    dead_peer(1, 1, 0);
}

Test(cuda_host, dead_peer_between_ce_double, .timeout = 120)
{
    dead_peer(0, 0, 1);
}

Test(cuda_host, dead_peer_mid_ce_double, .timeout = 120)
{
    dead_peer(0, 1, 1);
}
