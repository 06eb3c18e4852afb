/* Memory windows and the copy-engine all-gather and broadcast (core/cuda/ce.c)
 * against the CUDA test double (suite cuda_ce): 2-4 ranks as threads of this
 * process, each with its own stream; the bytes are right, no kernel was
 * launched (the double's launch counter), flags are reused correctly over a
 * mix of operations and roots, and without windows (or with PLAIT_CE_COLL=0)
 * the kernel path is left to run. Runs on the double, not a GPU. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/cuda/cu.h"
#include "core/cuda/cuda.h"
#include "tests/cuda_double.h"

#define MAXR 4
#define WIN_OFF 256 /* recvbuff's offset in every rank's window */

static const struct plait_cu *cu;

static void setup_double(const char *ce_coll)
{
    setenv("PLAIT_CUDA_LIBRARY", PLAIT_CUDA_DOUBLE_PATH, 1);
    setenv("PLAIT_CE_COLL", ce_coll, 1);
    printf("cuda_ce: on the CUDA test double (not a GPU), PLAIT_CE_COLL=%s\n", ce_coll);
    cu = plait_cu_get();
    cr_assert(cu && cu->is_double, "the CUDA test double did not load from %s", PLAIT_CUDA_DOUBLE_PATH);
}

static int set_context(void)
{
    void *ctx = NULL;
    if (cu->DevicePrimaryCtxRetain(&ctx, 0) || cu->CtxSetCurrent(ctx))
        return -1;
    return 0;
}

/* Runs fn on one thread per rank, rank r with args + r * arg_size, and
 * waits for them all. */
static void run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size)
{
    pthread_t th[MAXR];
    for (int r = 0; r < n; r++)
        pthread_create(&th[r], NULL, fn, (char *)args + (size_t)r * arg_size);
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
}

static void free_comms(plait_comm_t *comms, int n)
{
    for (int r = 0; r < n; r++) {
        plait_cuda_ce_free(comms[r]);
        plait_comm_destroy(comms[r]);
    }
}

struct rank_arg {
    struct plait_comm *comm;
    int nranks;
    size_t bytes;      /* per rank (all-gather), whole (broadcast) */
    int use_window;
    int fail;
    char msg[512];
};

#define FAIL(a, ...)                                                  \
    do {                                                              \
        snprintf((a)->msg, sizeof((a)->msg), __VA_ARGS__);            \
        (a)->fail = 1;                                                \
        goto out;                                                     \
    } while (0)

/* Frees what a rank set up (any of it may be missing); a failed
 * deregistration fails a rank that had not failed yet. */
static void rank_release(struct rank_arg *a, plait_window_t w, void *stream, plait_cudevptr win, plait_cudevptr send)
{
    if (w && plait_comm_window_deregister(a->comm, w) && !a->fail) {
        snprintf(a->msg, sizeof(a->msg), "rank %d: plait_comm_window_deregister: %s", a->comm->rank,
                 plait_get_last_error(NULL));
        a->fail = 1;
    }
    if (stream)
        cu->StreamDestroy(stream);
    if (win)
        cu->MemFree(win);
    if (send)
        cu->MemFree(send);
}

static uint8_t pat(int rank, int iter, size_t i)
{
    return (uint8_t)(rank * 59 + iter * 13 + i * 7 + 1);
}

/* One rank: a window, then a sequence of CE all-gathers and broadcasts (all
 * roots, in place and not) on its own stream, each checked. */
static void *rank_main(void *p)
{
    struct rank_arg *a = p;
    struct plait_comm *comm = a->comm;
    const int n = a->nranks, me = comm->rank;
    const size_t bytes = a->bytes, win_bytes = WIN_OFF + bytes * (size_t)n + 64;
    plait_cudevptr win = 0, send = 0;
    plait_window_t w = NULL;
    void *stream = NULL;
    uint8_t *host = malloc(win_bytes), *want = malloc(bytes * (size_t)n);
    if (!host || !want)
        FAIL(a, "out of memory");
    if (set_context())
        FAIL(a, "rank %d: no context", me);
    if (cu->MemAlloc(&win, win_bytes) || cu->MemAlloc(&send, bytes))
        FAIL(a, "rank %d: cuMemAlloc failed", me);
    if (cu->StreamCreateWithPriority(&stream, PLAIT_CU_STREAM_NON_BLOCKING, 0))
        FAIL(a, "rank %d: cuStreamCreateWithPriority failed", me);
    if (a->use_window) {
        plait_result_t r = plait_comm_window_register(comm, (void *)(uintptr_t)win, win_bytes, PLAIT_WIN_COLL_SYMMETRIC, &w);
        if (r)
            FAIL(a, "rank %d: plait_comm_window_register: %s", me, plait_get_last_error(NULL));
    }
    char *recv = (char *)(uintptr_t)win + WIN_OFF;
    struct plait_op op;
    for (int iter = 0; iter < 3 * n + 2; iter++) {
        /* Alternate all-gather (even: out of place, odd: in place) and
         * broadcast from every root in turn. */
        const int is_ag = iter % 2 == 0 || iter >= 2 * n;
        const int root = (iter / 2) % n;
        const int inplace = (iter / 3) % 2;
        memset(&op, 0, sizeof(op));
        op.comm = comm;
        op.plan.executor = PLAIT_EXEC_CUDA;
        op.esize = 1;
        op.recvbuff = recv;
        op.args.nranks = n;
        op.args.rank = me;
        for (size_t i = 0; i < bytes; i++)
            host[i] = pat(me, iter, i);
        if (is_ag) {
            op.coll = PLAIT_COLL_ALLGATHER;
            op.args.coll = PLAIT_COLL_ALLGATHER;
            op.args.count = bytes;
            op.sendbuff = inplace ? recv + (size_t)me * bytes : (const char *)(uintptr_t)send;
        } else {
            op.coll = PLAIT_COLL_BROADCAST;
            op.args.coll = PLAIT_COLL_BROADCAST;
            op.args.count = bytes;
            op.args.root = root;
            op.sendbuff = inplace ? recv : (const char *)(uintptr_t)send;
        }
        /* Stream-ordered input (the copy engines must wait for it), and
         * garbage in the rest of recvbuff. */
        if (cu->MemsetD8Async((plait_cudevptr)(uintptr_t)recv, 0xee, bytes * (size_t)n, stream) ||
            cu->MemcpyHtoDAsync((plait_cudevptr)(uintptr_t)op.sendbuff, host, bytes, stream))
            FAIL(a, "rank %d: staging the input failed", me);
        plait_result_t err = PLAIT_SUCCESS;
        int took = plait_cuda_ce_try(&op, stream, &err);
        if (!a->use_window) {
            if (took != 0 || err != PLAIT_SUCCESS)
                FAIL(a, "rank %d: without a window CE took the op (%d, %d)", me, took, (int)err);
            goto out;
        }
        if (took != 1 || err != PLAIT_SUCCESS)
            FAIL(a, "rank %d iter %d: plait_cuda_ce_try returned %d, err %d: %s", me, iter, took, (int)err,
                 plait_get_last_error(NULL));
        if (cu->StreamSynchronize(stream))
            FAIL(a, "rank %d: cuStreamSynchronize failed", me);
        const size_t total = is_ag ? bytes * (size_t)n : bytes;
        for (size_t i = 0; i < total; i++)
            want[i] = is_ag ? pat((int)(i / bytes), iter, i % bytes) : pat(root, iter, i);
        if (cu->MemcpyDtoH(host, (plait_cudevptr)(uintptr_t)recv, total))
            FAIL(a, "rank %d: cuMemcpyDtoH failed", me);
        for (size_t i = 0; i < total; i++)
            if (host[i] != want[i])
                FAIL(a, "rank %d iter %d (%s%s, root %d): byte %zu is 0x%02x, expected 0x%02x", me, iter,
                     is_ag ? "allgather" : "broadcast", inplace ? " in place" : "", root, i, host[i], want[i]);
    }
out:
    rank_release(a, w, stream, win, send);
    free(host);
    free(want);
    return NULL;
}

static void run(int nranks, size_t bytes, int use_window)
{
    plait_comm_t comms[MAXR];
    cr_assert_eq(plait_comm_init_all(comms, nranks, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    struct plait_cuda_double_stats before, after;
    plait_cuda_double_stats_get(&before);
    struct rank_arg args[MAXR];
    for (int r = 0; r < nranks; r++)
        args[r] = (struct rank_arg){.comm = comms[r], .nranks = nranks, .bytes = bytes, .use_window = use_window};
    run_threads(nranks, rank_main, args, sizeof(args[0]));
    plait_cuda_double_stats_get(&after);
    for (int r = 0; r < nranks; r++)
        cr_assert_eq(args[r].fail, 0, "%s", args[r].msg);
    cr_assert_eq(after.launches, before.launches, "a kernel was launched (%lu)",
                 (unsigned long)(after.launches - before.launches));
    if (use_window)
        cr_assert_gt(after.memcpys, before.memcpys);
    free_comms(comms, nranks);
}

Test(cuda_ce, double_2_ranks, .timeout = 120)
{
    setup_double("1");
    run(2, 1000, 1);
}

Test(cuda_ce, double_3_ranks_odd_size, .timeout = 120)
{
    setup_double("1");
    run(3, 4097, 1);
}

Test(cuda_ce, double_4_ranks, .timeout = 120)
{
    setup_double("1");
    run(4, 65536, 1);
}

/* PLAIT_CE_COLL=1 without a window: the op is left to the kernel path. */
Test(cuda_ce, double_no_window_falls_back, .timeout = 60)
{
    setup_double("1");
    run(2, 1000, 0);
}

struct fallback_arg {
    struct plait_comm *comm;
    int took[4];
    plait_result_t reg;
    char msg[256];
};

/* With a window: a recvbuff outside it, and collectives CE does not do, fall
 * back; so does everything under PLAIT_CE_COLL=0. */
static void *fallback_main(void *p)
{
    struct fallback_arg *a = p;
    plait_cudevptr win = 0, other = 0;
    plait_window_t w = NULL;
    memset(a->took, -1, sizeof(a->took));
    if (set_context() || cu->MemAlloc(&win, 8192) || cu->MemAlloc(&other, 8192)) {
        snprintf(a->msg, sizeof(a->msg), "setup failed");
        return NULL;
    }
    a->reg = plait_comm_window_register(a->comm, (void *)(uintptr_t)win, 8192, 0, &w);
    if (a->reg) {
        snprintf(a->msg, sizeof(a->msg), "%s", plait_get_last_error(NULL));
        return NULL;
    }
    struct plait_op op;
    memset(&op, 0, sizeof(op));
    op.comm = a->comm;
    op.plan.executor = PLAIT_EXEC_CUDA;
    op.esize = 4;
    op.args.count = 100;
    op.coll = PLAIT_COLL_ALLGATHER;
    op.sendbuff = (const char *)(uintptr_t)other;
    op.recvbuff = (char *)(uintptr_t)other; /* not in the window */
    plait_result_t err;
    a->took[0] = plait_cuda_ce_try(&op, NULL, &err);
    op.recvbuff = (char *)(uintptr_t)win + 8192 - 700; /* runs past the window's end */
    a->took[1] = plait_cuda_ce_try(&op, NULL, &err);
    op.coll = PLAIT_COLL_ALLREDUCE;
    op.recvbuff = (char *)(uintptr_t)win;
    a->took[2] = plait_cuda_ce_try(&op, NULL, &err);
    op.coll = PLAIT_COLL_BROADCAST;
    op.args.count = 0;
    a->took[3] = plait_cuda_ce_try(&op, NULL, &err);
    plait_comm_window_deregister(a->comm, w);
    cu->MemFree(win);
    cu->MemFree(other);
    return NULL;
}

/* Two ranks, each running fn on its own fallback_arg; the caller checks the
 * results and frees comms. */
static void run_fallback_ranks(plait_comm_t comms[2], struct fallback_arg args[2], void *(*fn)(void *))
{
    cr_assert_eq(plait_comm_init_all(comms, 2, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    for (int r = 0; r < 2; r++) {
        memset(&args[r], 0, sizeof(args[r]));
        args[r].comm = comms[r];
    }
    run_threads(2, fn, args, sizeof(args[0]));
}

static void run_fallback(void)
{
    plait_comm_t comms[2];
    struct fallback_arg args[2];
    run_fallback_ranks(comms, args, fallback_main);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(args[r].reg, PLAIT_SUCCESS, "rank %d: %s", r, args[r].msg);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(args[r].took[i], 0, "rank %d: case %d went to the copy engines", r, i);
    }
    free_comms(comms, 2);
}

Test(cuda_ce, double_outside_window_falls_back, .timeout = 60)
{
    setup_double("1");
    run_fallback();
}

Test(cuda_ce, double_ce_coll_0_falls_back, .timeout = 60)
{
    setup_double("0");
    run_fallback();
}

/* Windows need device memory; host memory is refused on every rank (the
 * collective step tells each rank which one failed). */
static void *host_window_main(void *p)
{
    struct fallback_arg *a = p;
    static char host_buf[2][4096];
    plait_window_t w = NULL;
    if (set_context()) {
        a->reg = PLAIT_ERR_INTERNAL;
        return NULL;
    }
    a->reg = plait_comm_window_register(a->comm, host_buf[a->comm->rank], 4096, 0, &w);
    snprintf(a->msg, sizeof(a->msg), "%s", plait_get_last_error(NULL));
    return NULL;
}

Test(cuda_ce, double_host_memory_window_refused, .timeout = 60)
{
    setup_double("1");
    plait_comm_t comms[2];
    struct fallback_arg args[2];
    run_fallback_ranks(comms, args, host_window_main);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(args[r].reg, PLAIT_ERR_INVALID_ARGUMENT, "rank %d: %d (%s)", r, (int)args[r].reg, args[r].msg);
        cr_assert(strstr(args[r].msg, "not device memory") != NULL, "rank %d: %s", r, args[r].msg);
    }
    free_comms(comms, 2);
}

/* A CE all-gather captured into a CUDA graph and replayed: the flags are
 * constants (set to 1, cleared to 0), so every replay orders the ranks again
 * and the bytes of each replay's input arrive. */
static void *graph_main(void *p)
{
    struct rank_arg *a = p;
    struct plait_comm *comm = a->comm;
    const int n = a->nranks, me = comm->rank;
    const size_t bytes = a->bytes, win_bytes = bytes * (size_t)n;
    plait_cudevptr win = 0, send = 0;
    plait_window_t w = NULL;
    void *stream = NULL, *graph = NULL, *exec = NULL;
    uint8_t *host = malloc(win_bytes);
    if (!host)
        FAIL(a, "out of memory");
    if (set_context() || cu->MemAlloc(&win, win_bytes) || cu->MemAlloc(&send, bytes) ||
        cu->StreamCreateWithPriority(&stream, PLAIT_CU_STREAM_NON_BLOCKING, 0))
        FAIL(a, "rank %d: setup failed", me);
    if (plait_comm_window_register(comm, (void *)(uintptr_t)win, win_bytes, 0, &w))
        FAIL(a, "rank %d: plait_comm_window_register: %s", me, plait_get_last_error(NULL));
    struct plait_op op;
    memset(&op, 0, sizeof(op));
    op.comm = comm;
    op.plan.executor = PLAIT_EXEC_CUDA;
    op.esize = 1;
    op.coll = op.args.coll = PLAIT_COLL_ALLGATHER;
    op.args.count = bytes;
    op.sendbuff = (const char *)(uintptr_t)send;
    op.recvbuff = (char *)(uintptr_t)win;
    if (cu->StreamBeginCapture(stream, PLAIT_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        FAIL(a, "rank %d: cuStreamBeginCapture failed", me);
    plait_result_t err = PLAIT_SUCCESS;
    int took = plait_cuda_ce_try(&op, stream, &err);
    if (cu->StreamEndCapture(stream, &graph) || took != 1 || err)
        FAIL(a, "rank %d: capture failed (took %d, err %d: %s)", me, took, (int)err, plait_get_last_error(NULL));
    if (cu->GraphInstantiate(&exec, graph, 0))
        FAIL(a, "rank %d: cuGraphInstantiate failed", me);
    for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < bytes; i++)
            host[i] = pat(me, k, i);
        if (cu->MemcpyHtoD(send, host, bytes) || cu->GraphLaunch(exec, stream) || cu->StreamSynchronize(stream))
            FAIL(a, "rank %d: replay %d failed", me, k);
        if (cu->MemcpyDtoH(host, win, win_bytes))
            FAIL(a, "rank %d: cuMemcpyDtoH failed", me);
        for (size_t i = 0; i < win_bytes; i++)
            if (host[i] != pat((int)(i / bytes), k, i % bytes))
                FAIL(a, "rank %d replay %d: byte %zu is 0x%02x, expected 0x%02x", me, k, i, host[i],
                     pat((int)(i / bytes), k, i % bytes));
    }
out:
    if (exec)
        cu->GraphExecDestroy(exec);
    if (graph)
        cu->GraphDestroy(graph);
    rank_release(a, w, stream, win, send);
    free(host);
    return NULL;
}

Test(cuda_ce, double_graph_replays, .timeout = 120)
{
    setup_double("1");
    enum { N = 3 };
    plait_comm_t comms[N];
    cr_assert_eq(plait_comm_init_all(comms, N, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    struct plait_cuda_double_stats before, after;
    plait_cuda_double_stats_get(&before);
    struct rank_arg args[N];
    for (int r = 0; r < N; r++)
        args[r] = (struct rank_arg){.comm = comms[r], .nranks = N, .bytes = 3000};
    run_threads(N, graph_main, args, sizeof(args[0]));
    plait_cuda_double_stats_get(&after);
    for (int r = 0; r < N; r++)
        cr_assert_eq(args[r].fail, 0, "%s", args[r].msg);
    cr_assert_eq(after.launches + after.captured_launches, before.launches + before.captured_launches);
    cr_assert_eq(after.graph_launches - before.graph_launches, 4 * N);
    free_comms(comms, N);
}

/* Through the public API: plait_allgather and plait_broadcast on device
 * buffers in windows, on a CUDA stream, run without a kernel; with recvbuff
 * outside the window the kernel runs them (right bytes either way). */
static uint64_t launches_now(void)
{
    struct plait_cuda_double_stats st;
    plait_cuda_double_stats_get(&st);
    return st.launches;
}

struct api_arg {
    struct rank_arg r;
    const plait_unique_id_t *id;
    int rank;
    uint64_t *ce_launches; /* shared: launches seen around the CE phase (rank 0 reads) */
    pthread_barrier_t *bar;
};

static void *api_main(void *p)
{
    struct api_arg *aa = p;
    struct rank_arg *a = &aa->r;
    const int n = a->nranks, me = aa->rank;
    const size_t bytes = a->bytes, win_bytes = 2 * bytes * (size_t)n;
    /* A context current at init: the communicator gets device state. */
    if (set_context() || plait_comm_init_rank(&a->comm, n, *aa->id, me)) {
        snprintf(a->msg, sizeof(a->msg), "rank %d: init: %s", me, plait_get_last_error(NULL));
        a->fail = 1;
        return NULL;
    }
    struct plait_comm *comm = a->comm;
    plait_cudevptr win = 0, send = 0;
    plait_window_t w = NULL;
    void *stream = NULL;
    plait_stream_t ps = NULL;
    uint8_t *host = malloc(win_bytes);
    if (!comm->cuda)
        FAIL(a, "rank %d: the communicator has no device state", me);
    if (!host)
        FAIL(a, "out of memory");
    if (cu->MemAlloc(&win, win_bytes) || cu->MemAlloc(&send, bytes) ||
        cu->StreamCreateWithPriority(&stream, PLAIT_CU_STREAM_NON_BLOCKING, 0) || plait_stream_from_cuda(stream, &ps))
        FAIL(a, "rank %d: setup failed: %s", me, plait_get_last_error(NULL));
    /* The window covers the first half of the allocation only. */
    if (plait_comm_window_register(comm, (void *)(uintptr_t)win, win_bytes / 2, 0, &w))
        FAIL(a, "rank %d: plait_comm_window_register: %s", me, plait_get_last_error(NULL));
    for (int phase = 0; phase < 2; phase++) {
        char *recv = (char *)(uintptr_t)win + (phase ? win_bytes / 2 : 0);
        pthread_barrier_wait(aa->bar);
        if (me == 0)
            aa->ce_launches[phase] = launches_now();
        pthread_barrier_wait(aa->bar);
        for (size_t i = 0; i < bytes; i++)
            host[i] = pat(me, phase, i);
        if (cu->MemcpyHtoD(send, host, bytes))
            FAIL(a, "rank %d: cuMemcpyHtoD failed", me);
        if (plait_allgather((const void *)(uintptr_t)send, recv, bytes, PLAIT_UINT8, comm, ps))
            FAIL(a, "rank %d phase %d: plait_allgather: %s", me, phase, plait_get_last_error(NULL));
        if (cu->StreamSynchronize(stream) || cu->MemcpyDtoH(host, (plait_cudevptr)(uintptr_t)recv, bytes * (size_t)n))
            FAIL(a, "rank %d: synchronising failed", me);
        for (size_t i = 0; i < bytes * (size_t)n; i++)
            if (host[i] != pat((int)(i / bytes), phase, i % bytes))
                FAIL(a, "rank %d phase %d: allgather byte %zu is 0x%02x", me, phase, i, host[i]);
        if (plait_broadcast((const void *)(uintptr_t)send, recv, bytes, PLAIT_UINT8, n - 1, comm, ps))
            FAIL(a, "rank %d phase %d: plait_broadcast: %s", me, phase, plait_get_last_error(NULL));
        if (cu->StreamSynchronize(stream) || cu->MemcpyDtoH(host, (plait_cudevptr)(uintptr_t)recv, bytes))
            FAIL(a, "rank %d: synchronising failed", me);
        for (size_t i = 0; i < bytes; i++)
            if (host[i] != pat(n - 1, phase, i))
                FAIL(a, "rank %d phase %d: broadcast byte %zu is 0x%02x", me, phase, i, host[i]);
        pthread_barrier_wait(aa->bar);
        if (me == 0)
            aa->ce_launches[phase] = launches_now() - aa->ce_launches[phase];
    }
out:
    if (a->fail) /* the others must not wait at a barrier for this rank: they fail too (deadline) */
        fprintf(stderr, "%s\n", a->msg);
    if (w)
        plait_comm_window_deregister(comm, w);
    if (ps)
        plait_stream_destroy(ps);
    if (stream)
        cu->StreamDestroy(stream);
    if (win)
        cu->MemFree(win);
    if (send)
        cu->MemFree(send);
    free(host);
    plait_comm_destroy(comm);
    return NULL;
}

static void run_public_api(void)
{
    enum { N = 2 };
    plait_unique_id_t id;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    uint64_t ce_launches[2] = {0, 0};
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N);
    struct api_arg args[N];
    for (int r = 0; r < N; r++)
        args[r] = (struct api_arg){.r = {.nranks = N, .bytes = 5000}, .id = &id, .rank = r,
                                   .ce_launches = ce_launches, .bar = &bar};
    run_threads(N, api_main, args, sizeof(args[0]));
    for (int r = 0; r < N; r++)
        cr_assert_eq(args[r].r.fail, 0, "%s", args[r].r.msg);
    cr_assert_eq(ce_launches[0], 0, "the copy-engine phase launched %lu kernels", (unsigned long)ce_launches[0]);
    cr_assert_gt(ce_launches[1], 0, "recvbuff outside the window, yet no kernel ran");
    pthread_barrier_destroy(&bar);
}

Test(cuda_ce, double_public_api, .timeout = 120)
{
    setup_double("1");
    run_public_api();
}

/* PLAIT_CE_COLL=auto with CTAs capped at 0 (PLAIT_MAX_CTAS=0): copy engines
 * where the buffers allow, the kernel (one CTA) elsewhere. */
Test(cuda_ce, double_auto_zero_ctas, .timeout = 120)
{
    setenv("PLAIT_MAX_CTAS", "0", 1);
    setup_double("auto");
    run_public_api();
}

/* Ranks as processes of this host: windows and flags are mapped with CUDA
 * IPC (the double shares its memory between processes), and the same
 * sequence of CE operations gives the right bytes. */
#include "tests/harness.h"

static int procs_child(struct mr_child *c, void *arg)
{
    (void)arg;
    cu = plait_cu_get();
    if (!cu || !cu->is_double) {
        snprintf(c->msg, c->msglen, "rank %d: the CUDA test double did not load", c->rank);
        return 1;
    }
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    struct rank_arg a = {.comm = comm, .nranks = c->nranks, .bytes = 3001, .use_window = 1};
    rank_main(&a);
    plait_comm_destroy(comm);
    struct plait_cuda_double_stats st;
    plait_cuda_double_stats_get(&st);
    if (!a.fail && st.ipc_opens < 2u * (unsigned)(c->nranks - 1)) {
        snprintf(a.msg, sizeof(a.msg), "rank %d: %lu IPC opens: the peers' windows and flags were not mapped", c->rank,
                 (unsigned long)st.ipc_opens);
        a.fail = 1;
    }
    if (a.fail)
        snprintf(c->msg, c->msglen, "%s", a.msg);
    return a.fail;
}

Test(cuda_ce, double_procs_ipc, .timeout = 120)
{
    /* Fork first, as with a real driver: this process makes no CUDA call. */
    setenv("PLAIT_CUDA_LIBRARY", PLAIT_CUDA_DOUBLE_PATH, 1);
    setenv("PLAIT_CE_COLL", "1", 1);
    printf("cuda_ce: on the CUDA test double (not a GPU), 3 processes, PLAIT_CE_COLL=1\n");
    char msg[1024] = "";
    struct mr_procs *p = mr_procs_start(3, procs_child, NULL, 0, 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 90, msg, sizeof(msg));
    mr_procs_free(p);
    cr_assert_eq(failed, 0, "%s", msg);
}
