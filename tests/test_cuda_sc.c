/* Single copy in the CUDA kernel for buffers in memory windows (suite
 * cuda_sc; core/cuda/kernel_body.h, "single copy"): on 2 and 3 rank threads
 * with their buffers inside windows, ring all-gathers and all-reduces (in
 * place and not, sum and avg) give the CPU backend's bits for the same
 * schedule, and descriptors were really received (plait_cuda_sc_counts);
 * with PLAIT_CUDA_SC_MIN_BYTES=0, or buffers outside every window, none are;
 * a grouped send/recv of window buffers works through one. Runs on the CUDA
 * test double (tests/cuda_double.c), not a GPU: every name ends in _double. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cuda/cu.h"
#include "core/cuda/cuda.h"
#include "tests/cuda_double.h"
#include "tests/cuda_ranks.h"
#include "tests/harness.h"
#include "plait.h"

#ifndef PLAIT_CUDA_DOUBLE_PATH
#error "PLAIT_CUDA_DOUBLE_PATH (the double's path) comes from tests/meson.build"
#endif

#define COUNT ((size_t)(1u << 20) + 3) /* elements per rank: ~1M, not a multiple of anything */

static void setup_double(void)
{
    setenv("PLAIT_CUDA_LIBRARY", PLAIT_CUDA_DOUBLE_PATH, 1);
    setenv("PLAIT_CUDA_DOUBLE_TIMEOUT", "60", 1);
    /* Both backends run the same schedule: ring, Simple, 2 channels. */
    setenv("PLAIT_ALGO", "ring", 1);
    setenv("PLAIT_PROTO", "simple", 1);
    setenv("PLAIT_NCHANNELS", "2", 1);
    setenv("PLAIT_MIN_CTAS", "2", 1);
    setenv("PLAIT_MAX_CTAS", "2", 1);
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    setenv("PLAIT_CUDA_SC_MIN_BYTES", "4K", 1);
    unsetenv("PLAIT_CE_COLL");
    unsetenv("PLAIT_TUNE_FILE");
    printf("%s (CUDA test double, not a GPU)\n", criterion_current_test->name);
    fflush(stdout);
}

TestSuite(cuda_sc, .init = setup_double, .timeout = 240);

/* ------------------------------------------------------------------ rank threads */

enum { IN_WINDOW = 0, OUTSIDE_WINDOW = 1 };
enum { WANT_NONE = 0, WANT_SOME = 1, WANT_ANY = 2 };

/* What every rank of a run reads (cuda_run_ranks' arg). */
struct sc_run {
    int placement; /* IN_WINDOW, OUTSIDE_WINDOW */
    int want;      /* WANT_SOME: descriptors must be received where the rules allow them */
};

static const struct sc_run *run_of(const struct cuda_rank *e)
{
    return e->arg;
}

#define FAILF(...)                       \
    do {                                 \
        snprintf(msg, len, __VA_ARGS__); \
        return 1;                        \
    } while (0)

static void run_ranks(int n, cuda_rank_fn fn, int placement, int want)
{
    struct sc_run run = {placement, want};
    cuda_run_ranks(n, CUDA_RANKS_CONTEXT | CUDA_RANKS_STREAM, fn, &run, 200);
}

/* Device memory for the buffers: one window holding [send | recv], or (for
 * OUTSIDE_WINDOW) a window registered over another allocation and the
 * buffers outside it. */
struct bufs {
    char *mem, *other;
    plait_window_t win;
};

static int bufs_get(struct cuda_rank *e, size_t bytes, struct bufs *b, char *msg, size_t len)
{
    plait_cudevptr m = 0, o = 0;
    memset(b, 0, sizeof(*b));
    if (e->cu->MemAlloc(&m, bytes) || e->cu->MemAlloc(&o, 4096))
        FAILF("rank %d: cuMemAlloc(%zu) failed", e->rank, bytes);
    b->mem = (char *)(uintptr_t)m;
    b->other = (char *)(uintptr_t)o;
    void *wbase = run_of(e)->placement == IN_WINDOW ? (void *)b->mem : (void *)b->other;
    size_t wbytes = run_of(e)->placement == IN_WINDOW ? bytes : 4096;
    if (plait_comm_window_register(e->comm, wbase, wbytes, PLAIT_WIN_COLL_SYMMETRIC, &b->win))
        FAILF("rank %d: plait_comm_window_register: %s", e->rank, plait_get_last_error(NULL));
    return 0;
}

static void bufs_put(struct cuda_rank *e, struct bufs *b)
{
    if (b->win)
        plait_comm_window_deregister(e->comm, b->win);
    e->cu->MemFree((plait_cudevptr)(uintptr_t)b->mem);
    e->cu->MemFree((plait_cudevptr)(uintptr_t)b->other);
}

/* Descriptors this rank has received so far. */
static int received(struct cuda_rank *e, uint64_t *out, char *msg, size_t len)
{
    uint64_t sent = 0;
    if (plait_cuda_sc_counts(e->comm, &sent, out))
        FAILF("rank %d: plait_cuda_sc_counts: %s", e->rank, plait_get_last_error(NULL));
    return 0;
}

static void fill(void *p, int dtype, size_t count, int rank, int salt)
{
    for (size_t i = 0; i < count; i++) {
        const uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503 + salt * 977);
        if (dtype == PLAIT_FLOAT32)
            ((float *)p)[i] = (float)(h % 20011) * 0.0137f - 120.5f;
        else
            ((int32_t *)p)[i] = (int32_t)(h % 2000003) - 1000000;
    }
}

/* One collective on device buffers and the same on host buffers (the CPU
 * backend); the results must be the same bits. sc_ok: the rules allow
 * descriptors for this case (float avg pre-multiplies what it sends first). */
static int one_case(struct cuda_rank *e, struct bufs *b, int is_allgather, int dtype, int op, int inplace, int sc_ok,
                    char *msg, size_t len)
{
    const int n = e->n, me = e->rank;
    const size_t es = 4, cnt = COUNT;
    const size_t in_elems = cnt, out_elems = is_allgather ? cnt * (size_t)n : cnt;
    char *recv = b->mem + in_elems * es; /* [send | recv] */
    char *send = inplace ? (is_allgather ? recv + (size_t)me * cnt * es : recv) : b->mem;
    char *hin = malloc(in_elems * es), *hout = malloc(out_elems * es), *hwant = malloc(out_elems * es);
    const char *what = is_allgather ? "allgather" : "allreduce";
    int rc = 1;
    if (!hin || !hout || !hwant) {
        snprintf(msg, len, "out of memory");
        goto out;
    }
    fill(hin, dtype, in_elems, me, op * 3 + inplace);
    /* Garbage in recvbuff, then the input (the double's device memory is
     * this process's memory). */
    memset(recv, 0x5a, out_elems * es);
    memcpy(send, hin, in_elems * es);
    uint64_t before = 0, after = 0;
    if (received(e, &before, msg, len))
        goto out;
    cuda_rank_barrier(e);
    plait_result_t r = is_allgather ? plait_allgather(send, recv, cnt, dtype, e->comm, e->ps)
                                    : plait_allreduce(send, recv, cnt, dtype, op, e->comm, e->ps);
    if (r) {
        snprintf(msg, len, "rank %d: device %s: %s", me, what, plait_get_last_error(e->comm));
        goto out;
    }
    if (e->cu->StreamSynchronize(e->stream)) {
        snprintf(msg, len, "rank %d: cuStreamSynchronize after %s failed", me, what);
        goto out;
    }
    if (plait_comm_get_async_error(e->comm, &r) == PLAIT_SUCCESS && r != PLAIT_SUCCESS) {
        snprintf(msg, len, "rank %d: %s: asynchronous error %d: %s", me, what, r, plait_get_last_error(e->comm));
        goto out;
    }
    memcpy(hout, recv, out_elems * es);
    if (received(e, &after, msg, len))
        goto out;
    /* The CPU backend on host buffers, same communicator and schedule. */
    r = is_allgather ? plait_allgather(hin, hwant, cnt, dtype, e->comm, NULL)
                     : plait_allreduce(hin, hwant, cnt, dtype, op, e->comm, NULL);
    if (r) {
        snprintf(msg, len, "rank %d: host %s: %s", me, what, plait_get_last_error(e->comm));
        goto out;
    }
    for (size_t i = 0; i < out_elems; i++)
        if (memcmp(hout + i * es, hwant + i * es, es) != 0) {
            snprintf(msg, len,
                     "rank %d: %s %s op %d%s: element %zu is 0x%08x on the device, 0x%08x on the CPU backend", me,
                     what, dtype == PLAIT_FLOAT32 ? "float32" : "int32", op, inplace ? " in place" : "", i,
                     *(uint32_t *)(hout + i * es), *(uint32_t *)(hwant + i * es));
            goto out;
        }
    const uint64_t got = after - before;
    if (run_of(e)->want == WANT_SOME && sc_ok && got == 0) {
        snprintf(msg, len, "rank %d: %s%s used no single-copy descriptor", me, what, inplace ? " in place" : "");
        goto out;
    }
    if ((run_of(e)->want == WANT_NONE || (run_of(e)->want == WANT_SOME && !sc_ok)) && got != 0) {
        snprintf(msg, len, "rank %d: %s%s received %llu single-copy descriptors, want none", me, what,
                 inplace ? " in place" : "", (unsigned long long)got);
        goto out;
    }
    printf("rank %d: %s %s op %d%s: same bits as the CPU backend, %llu descriptors received\n", me, what,
           dtype == PLAIT_FLOAT32 ? "float32" : "int32", op, inplace ? " in place" : "", (unsigned long long)got);
    rc = 0;
out:
    free(hin);
    free(hout);
    free(hwant);
    return rc;
}

static int colls_rank(struct cuda_rank *e, char *msg, size_t len)
{
    struct bufs b;
    const size_t bytes = COUNT * 4 * (size_t)(1 + e->n);
    if (bufs_get(e, bytes, &b, msg, len))
        return 1;
    int rc = 0;
    for (int inplace = 0; inplace < 2 && !rc; inplace++) {
        rc = one_case(e, &b, 1, PLAIT_FLOAT32, PLAIT_SUM, inplace, 1, msg, len) ||
             one_case(e, &b, 0, PLAIT_FLOAT32, PLAIT_SUM, inplace, 1, msg, len) ||
             one_case(e, &b, 0, PLAIT_INT32, PLAIT_AVG, inplace, 1, msg, len) ||
             one_case(e, &b, 0, PLAIT_FLOAT32, PLAIT_AVG, inplace, 0, msg, len);
    }
    bufs_put(e, &b);
    return rc;
}

Test(cuda_sc, ring_2_ranks_double)
{
    run_ranks(2, colls_rank, IN_WINDOW, WANT_SOME);
}

Test(cuda_sc, ring_3_ranks_double)
{
    run_ranks(3, colls_rank, IN_WINDOW, WANT_SOME);
}

/* The same with 4 threads per emulated CTA: the leader keeps the pending
 * list and the descriptor state, the others move the bytes. */
Test(cuda_sc, ring_3_ranks_cta_threads_double)
{
    setenv("PLAIT_KB_EMU_THREADS", "4", 1);
    run_ranks(3, colls_rank, IN_WINDOW, WANT_SOME);
}

/* Other schedules with window buffers (tree, bruck, recursive doubling,
 * PAT): the bits stay the CPU backend's and nothing waits forever, whether
 * or not their steps qualify for descriptors. */
Test(cuda_sc, other_algos_3_ranks_double)
{
    setenv("PLAIT_ALGO", "tree;allgather:bruck", 1);
    run_ranks(3, colls_rank, IN_WINDOW, WANT_ANY);
}

Test(cuda_sc, other_algos_4_ranks_double)
{
    setenv("PLAIT_ALGO", "recursive;allgather:pat", 1);
    run_ranks(4, colls_rank, IN_WINDOW, WANT_ANY);
}

Test(cuda_sc, min_bytes_0_double)
{
    setenv("PLAIT_CUDA_SC_MIN_BYTES", "0", 1);
    run_ranks(2, colls_rank, IN_WINDOW, WANT_NONE);
}

Test(cuda_sc, outside_window_double)
{
    run_ranks(3, colls_rank, OUTSIDE_WINDOW, WANT_NONE);
}

/* A group of send + recv between window buffers, 4 MiB each way (eight
 * times the FIFO): both sides go as descriptors. */
static int sendrecv_rank(struct cuda_rank *e, char *msg, size_t len)
{
    const size_t cnt = (4u << 20) / 4;
    struct bufs b;
    if (bufs_get(e, cnt * 8, &b, msg, len))
        return 1;
    uint32_t *sb = (uint32_t *)(void *)b.mem, *rb = sb + cnt;
    const int to = (e->rank + 1) % e->n, from = (e->rank + e->n - 1) % e->n;
    int rc = 1;
    for (size_t i = 0; i < cnt; i++) {
        sb[i] = (uint32_t)(e->rank * 0x10000000u + i);
        rb[i] = 0xdeadbeef;
    }
    uint64_t before = 0, after = 0;
    if (received(e, &before, msg, len))
        goto out;
    cuda_rank_barrier(e);
    plait_result_t r0 = plait_group_start();
    plait_result_t r1 = plait_send(sb, cnt, PLAIT_UINT32, to, e->comm, e->ps);
    plait_result_t r2 = plait_recv(rb, cnt, PLAIT_UINT32, from, e->comm, e->ps);
    plait_result_t r3 = plait_group_end();
    if (r0 || r1 || r2 || r3) {
        snprintf(msg, len, "rank %d: group: %d %d %d %d: %s", e->rank, r0, r1, r2, r3, plait_get_last_error(e->comm));
        goto out;
    }
    if (e->cu->StreamSynchronize(e->stream)) {
        snprintf(msg, len, "rank %d: cuStreamSynchronize failed", e->rank);
        goto out;
    }
    if (received(e, &after, msg, len))
        goto out;
    for (size_t i = 0; i < cnt; i++)
        if (rb[i] != (uint32_t)(from * 0x10000000u + i)) {
            snprintf(msg, len, "rank %d: rb[%zu] = 0x%x, want 0x%x", e->rank, i, rb[i],
                     (uint32_t)(from * 0x10000000u + i));
            goto out;
        }
    if (after - before == 0) {
        snprintf(msg, len, "rank %d: the grouped receive used no single-copy descriptor", e->rank);
        goto out;
    }
    printf("rank %d: grouped send/recv of 4 MiB: right bytes, %llu descriptor(s) received\n", e->rank,
           (unsigned long long)(after - before));
    rc = 0;
out:
    bufs_put(e, &b);
    return rc;
}

Test(cuda_sc, sendrecv_group_2_ranks_double)
{
    run_ranks(2, sendrecv_rank, IN_WINDOW, WANT_SOME);
}

Test(cuda_sc, sendrecv_group_3_ranks_double)
{
    run_ranks(3, sendrecv_rank, IN_WINDOW, WANT_SOME);
}
