/* The small-message path (core/fastpath.c): which calls take it (observed in the
 * communicator's counters, so a test cannot pass while the path silently stays
 * off), its results for every kind it runs (in place, avg and premulsum with a
 * different scalar per rank, groups, streams), PLAIT_PROTO, and the faults:
 * mismatched calls between the two paths and inside it, a peer killed while
 * others wait in it. Element-level correctness over every type and op is in
 * test_collectives (small counts now run here). */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/fastpath.h"
#include "algorithms/schedule.h"
#include "tests/harness.h"

#define FAILF(...)                                                                                                 \
    do {                                                                                                           \
        snprintf(msg, msglen, __VA_ARGS__);                                                                        \
        return 1;                                                                                                  \
    } while (0)

#define CHECK(call)                                                                                                \
    do {                                                                                                           \
        plait_result_t r_ = (call);                                                                                \
        if (r_ != PLAIT_SUCCESS)                                                                                   \
            FAILF("rank %d: %s: %s: %s", rank, #call, plait_get_error_string(r_), plait_get_last_error(comm));     \
    } while (0)

static void set_deadlines(void)
{
    setenv("PLAIT_TIMEOUT", "20", 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
    unsetenv("PLAIT_PROTO");
    unsetenv("NCCL_PROTO");
}

TestSuite(fastpath, .init = set_deadlines);

static uint64_t fast_calls(plait_comm_t comm)
{
    return ((struct plait_comm *)comm)->fast_seq;
}

/* Every kind on the path, and a call just above it, with results checked and
 * the path observed. */
static int kinds(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    (void)arg;
    if (!((struct plait_comm *)comm)->fast)
        FAILF("rank %d: no small-message boxes on a %d-rank single-host communicator", rank, n);
    enum { C = 7 };
    int32_t in[8 * C], out[8 * C];
    uint64_t before = fast_calls(comm);

    /* allreduce, out of place and in place */
    for (int i = 0; i < C; i++)
        in[i] = rank * 100 + i;
    CHECK(plait_allreduce(in, out, C, PLAIT_INT32, PLAIT_SUM, comm, NULL));
    for (int i = 0; i < C; i++)
        if (out[i] != 100 * n * (n - 1) / 2 + n * i)
            FAILF("rank %d: allreduce[%d] = %d", rank, i, out[i]);
    CHECK(plait_allreduce(in, in, C, PLAIT_INT32, PLAIT_MAX, comm, NULL));
    for (int i = 0; i < C; i++)
        if (in[i] != (n - 1) * 100 + i)
            FAILF("rank %d: in-place max[%d] = %d", rank, i, in[i]);

    /* allgather, in place (own block already in its slot) */
    for (int i = 0; i < C; i++)
        out[rank * C + i] = rank * 10 + i;
    CHECK(plait_allgather(out + rank * C, out, C, PLAIT_INT32, comm, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < C; i++)
            if (out[r * C + i] != r * 10 + i)
                FAILF("rank %d: allgather block %d [%d] = %d", rank, r, i, out[r * C + i]);

    /* reducescatter, in place (result in this rank's block of the input) */
    for (int r = 0; r < n; r++)
        for (int i = 0; i < C; i++)
            in[r * C + i] = (rank + 1) * (r * C + i);
    CHECK(plait_reducescatter(in, in + rank * C, C, PLAIT_INT32, PLAIT_SUM, comm, NULL));
    for (int i = 0; i < C; i++)
        if (in[rank * C + i] != n * (n + 1) / 2 * (rank * C + i))
            FAILF("rank %d: in-place reducescatter[%d] = %d", rank, i, in[rank * C + i]);

    /* alltoall */
    for (int r = 0; r < n; r++)
        for (int i = 0; i < C; i++)
            in[r * C + i] = rank * 1000 + r * 10 + i;
    CHECK(plait_alltoall(in, out, C, PLAIT_INT32, comm, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < C; i++)
            if (out[r * C + i] != r * 1000 + rank * 10 + i)
                FAILF("rank %d: alltoall from %d [%d] = %d", rank, r, i, out[r * C + i]);

    CHECK(plait_barrier(comm, NULL));

    /* premulsum with this rank's own scalar: each contribution scaled by its
     * own rank's scalar, once */
    float fin[C], fout[C];
    float scalar = (float)(rank + 1);
    plait_redop_t pm;
    CHECK(plait_redop_create_premulsum(&pm, &scalar, PLAIT_FLOAT32, PLAIT_SCALAR_HOST_IMMEDIATE, comm));
    for (int i = 0; i < C; i++)
        fin[i] = (float)(rank + i);
    CHECK(plait_allreduce(fin, fout, C, PLAIT_FLOAT32, pm, comm, NULL));
    for (int i = 0; i < C; i++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want += (float)(r + 1) * (float)(r + i);
        if (fout[i] != want)
            FAILF("rank %d: premulsum[%d] = %g, want %g", rank, i, fout[i], want);
    }
    /* float avg in place: each rank's value divided by n before the sum */
    for (int i = 0; i < C; i++)
        fin[i] = (float)(n * (rank + 1));
    CHECK(plait_allreduce(fin, fin, C, PLAIT_FLOAT32, PLAIT_AVG, comm, NULL));
    for (int i = 0; i < C; i++)
        if (fin[i] != (float)(n * (n + 1) / 2))
            FAILF("rank %d: avg[%d] = %g", rank, i, fin[i]);
    CHECK(plait_redop_destroy(pm, comm));

    /* broadcast from the last rank (in place there), reduce to rank 1 (in
     * place there; NULL recvbuff elsewhere) */
    for (int i = 0; i < C; i++)
        out[i] = rank == n - 1 ? 7 * i + 1 : -1;
    CHECK(plait_broadcast(out, out, C, PLAIT_INT32, n - 1, comm, NULL));
    for (int i = 0; i < C; i++)
        if (out[i] != 7 * i + 1)
            FAILF("rank %d: broadcast[%d] = %d", rank, i, out[i]);
    for (int i = 0; i < C; i++)
        in[i] = rank + 2 * i;
    CHECK(plait_reduce(in, rank == 1 ? in : NULL, C, PLAIT_INT32, PLAIT_SUM, 1, comm, NULL));
    if (rank == 1)
        for (int i = 0; i < C; i++)
            if (in[i] != n * (n - 1) / 2 + 2 * n * i)
                FAILF("rank %d: in-place reduce[%d] = %d", rank, i, in[i]);

    /* broadcast and reduce take the path only when the host has a core per
     * rank (fastpath.c) */
    const uint64_t want = 8 + (plait_fast_eligible((struct plait_comm *)comm, PLAIT_COLL_BROADCAST, C * 4) ? 2 : 0);
    const uint64_t taken = fast_calls(comm) - before;
    if (taken != want)
        FAILF("rank %d: %llu of %llu small calls took the small-message path", rank, (unsigned long long)taken,
              (unsigned long long)want);

    /* 1025 int32 = 4100 bytes per rank pair: just above the path */
    int32_t *big = calloc(1025, sizeof(int32_t));
    if (!big)
        FAILF("out of memory");
    for (int i = 0; i < 1025; i++)
        big[i] = rank + i;
    plait_result_t r = plait_allreduce(big, big, 1025, PLAIT_INT32, PLAIT_SUM, comm, NULL);
    int bad = r != PLAIT_SUCCESS;
    for (int i = 0; i < 1025 && !bad; i++)
        bad = big[i] != n * (n - 1) / 2 + n * i;
    free(big);
    if (bad)
        FAILF("rank %d: 4100-byte allreduce failed or wrong", rank);
    if (fast_calls(comm) - before != want)
        FAILF("rank %d: a 4100-byte allreduce took the small-message path", rank);
    return 0;
}

/* Whether a call takes the path is the tuner's choice (tuning/tuner.c): the
 * cost model may put a kind on the FIFO path (on 8 ranks sharing 2 cores it
 * prefers recursive doubling for small allgathers). These tests are about the
 * path itself, so a tuning file asks for it ("ll") for every kind wherever it
 * can carry the call; which calls the model sends where is test_tuner's. */
static int kinds_with_ll(enum mr_mode mode, int n, char *msg, size_t msglen)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/plait-fastpath-ll-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(msg, msglen, "cannot write %s", path);
        return 1;
    }
    fputs("allreduce * ring ll\nreducescatter * ring ll\nallgather * ring ll\nalltoall * pairwise ll\n"
          "broadcast * ring ll\nreduce * ring ll\nbarrier * dissemination ll\n",
          f);
    fclose(f);
    setenv("PLAIT_TUNE_FILE", path, 1);
    int failed = mr_run(mode, n, kinds, NULL, 40, msg, msglen);
    unsetenv("PLAIT_TUNE_FILE");
    unlink(path);
    return failed;
}

Test(fastpath, kinds_threads_2, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(kinds_with_ll(MR_THREADS, 2, msg, sizeof(msg)), 0, "%s", msg);
}

Test(fastpath, kinds_shm_3, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(kinds_with_ll(MR_SHM, 3, msg, sizeof(msg)), 0, "%s", msg);
}

Test(fastpath, kinds_shm_8, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(kinds_with_ll(MR_SHM, 8, msg, sizeof(msg)), 0, "%s", msg);
}

/* Without the path (PLAIT_PROTO=simple): the same calls run on the FIFO path. */
static int no_boxes(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    (void)n;
    if (!arg && ((struct plait_comm *)comm)->fast)
        FAILF("rank %d: small-message boxes where they must not be", rank);
    int32_t x = rank, y = 0;
    CHECK(plait_allreduce(&x, &y, 1, PLAIT_INT32, PLAIT_SUM, comm, NULL));
    if (fast_calls(comm) != 0)
        FAILF("rank %d: a call took the small-message path", rank);
    return 0;
}

/* Over TCP there are no boxes: the path runs over connections, one message
 * per peer on the small-message class (tests/test_fast_net.c has the rest). */
static int by_messages(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    (void)n;
    (void)arg;
    const struct plait_comm *c = (const struct plait_comm *)comm;
    if (!c->fast || !c->fast_msg)
        FAILF("rank %d: no small-message path over connections (fast %p, fast_msg %d)", rank, (void *)c->fast,
              c->fast_msg);
    int32_t x = rank, y = 0;
    CHECK(plait_allreduce(&x, &y, 1, PLAIT_INT32, PLAIT_SUM, comm, NULL));
    if (fast_calls(comm) != 1 || y != 1)
        FAILF("rank %d: %llu calls on the small-message path, sum %d", rank, (unsigned long long)fast_calls(comm), y);
    return 0;
}

Test(fastpath, over_sockets_by_messages, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SOCKET, 2, by_messages, NULL, 40, msg, sizeof(msg)), 0, "%s", msg);
}

Test(fastpath, proto_simple_turns_it_off, .timeout = 60)
{
    char msg[1024];
    setenv("PLAIT_PROTO", "simple", 1);
    int failed = mr_run(MR_THREADS, 3, no_boxes, NULL, 40, msg, sizeof(msg));
    unsetenv("PLAIT_PROTO");
    cr_assert_eq(failed, 0, "PLAIT_PROTO=simple: %s", msg);
    setenv("NCCL_PROTO", "Simple", 1);
    failed = mr_run(MR_SHM, 2, no_boxes, NULL, 40, msg, sizeof(msg));
    unsetenv("NCCL_PROTO");
    cr_assert_eq(failed, 0, "NCCL_PROTO=Simple: %s", msg);
    setenv("PLAIT_ALGO", "allreduce:ring", 1); /* a forced algorithm runs its schedule */
    failed = mr_run(MR_SHM, 2, no_boxes, "boxes, unused", 40, msg, sizeof(msg));
    unsetenv("PLAIT_ALGO");
    cr_assert_eq(failed, 0, "PLAIT_ALGO=allreduce:ring: %s", msg);
}

Test(fastpath, proto_bad_value_fails_init, .timeout = 30)
{
    setenv("PLAIT_PROTO", "LL128", 1);
    plait_comm_t c[2] = {NULL, NULL};
    plait_result_t r = plait_comm_init_all(c, 2, NULL);
    unsetenv("PLAIT_PROTO");
    cr_expect_eq(r, PLAIT_ERR_INVALID_ARGUMENT, "init with PLAIT_PROTO=LL128 returned %s",
                 plait_get_error_string(r));
    cr_expect(strstr(plait_get_last_error(NULL), "PLAIT_PROTO") != NULL, "message: %s", plait_get_last_error(NULL));
    if (r == PLAIT_SUCCESS) {
        plait_comm_destroy(c[0]);
        plait_comm_destroy(c[1]);
    }
}

/* In groups and on streams the path runs inside the executor (one task in
 * lane 0), interleaved with FIFO-path work, in issue order. */
static int grouped(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    (void)arg;
    enum { K = 6, BIG = 4096 };
    int32_t small[K][3];
    int32_t *big = malloc(BIG * sizeof(int32_t));
    if (!big)
        FAILF("out of memory");
    const uint64_t before = fast_calls(comm);
    for (int k = 0; k < K; k++)
        for (int i = 0; i < 3; i++)
            small[k][i] = rank + k * 10 + i;
    for (int i = 0; i < BIG; i++)
        big[i] = rank;
    CHECK(plait_group_start());
    for (int k = 0; k < 3; k++)
        CHECK(plait_allreduce(small[k], small[k], 3, PLAIT_INT32, PLAIT_SUM, comm, NULL));
    CHECK(plait_allreduce(big, big, BIG, PLAIT_INT32, PLAIT_SUM, comm, NULL));
    CHECK(plait_allreduce(small[3], small[3], 3, PLAIT_INT32, PLAIT_SUM, comm, NULL));
    CHECK(plait_group_end());
    plait_stream_t s = NULL;
    CHECK(plait_stream_create(&s));
    CHECK(plait_allreduce(small[4], small[4], 3, PLAIT_INT32, PLAIT_SUM, comm, s));
    CHECK(plait_barrier(comm, s));
    CHECK(plait_allreduce(small[5], small[5], 3, PLAIT_INT32, PLAIT_SUM, comm, s));
    CHECK(plait_stream_synchronize(s));
    CHECK(plait_stream_destroy(s));
    for (int k = 0; k < K; k++)
        for (int i = 0; i < 3; i++)
            if (small[k][i] != n * (n - 1) / 2 + n * (k * 10 + i))
                FAILF("rank %d: small allreduce %d [%d] = %d", rank, k, i, small[k][i]);
    for (int i = 0; i < BIG; i++)
        if (big[i] != n * (n - 1) / 2)
            FAILF("rank %d: big[%d] = %d", rank, i, big[i]);
    free(big);
    if (fast_calls(comm) - before != 7)
        FAILF("rank %d: %llu of 7 small calls took the path", rank, (unsigned long long)(fast_calls(comm) - before));
    return 0;
}

Test(fastpath, groups_and_streams_threads_3, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_THREADS, 3, grouped, NULL, 40, msg, sizeof(msg)), 0, "%s", msg);
}

Test(fastpath, groups_and_streams_shm_4, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SHM, 4, grouped, NULL, 40, msg, sizeof(msg)), 0, "%s", msg);
}

/* ---------------------------------------------------------------- faults */

struct report {
    int done;
    int result;
    double took;
    char text[600];
};

enum mismatch_kind { MIS_COUNT_PATHS, MIS_KIND_SAME_SIZE };

static int mismatch_child(struct mr_child *c, void *arg)
{
    const int kind = *(const int *)arg;
    struct report *rep = (struct report *)c->shared + c->rank;
    setenv("PLAIT_COLL_TIMEOUT", "15", 1);
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    float *buf = calloc(4096, sizeof(float));
    if (!buf)
        return 1;
    const double t0 = mr_now();
    plait_result_t r;
    if (kind == MIS_COUNT_PATHS) /* rank 0: 16 bytes (small path); rank 1: 16 KiB (FIFO path) */
        r = plait_allreduce(buf, buf, c->rank == 0 ? 4 : 4096, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    else if (c->rank == 0) /* both small, different collectives */
        r = plait_allreduce(buf, buf, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    else
        r = plait_allgather(buf, buf + 8, 4, PLAIT_FLOAT32, comm, NULL);
    rep->took = mr_now() - t0;
    rep->result = (int)r;
    snprintf(rep->text, sizeof(rep->text), "%s", r ? plait_get_last_error(comm) : "");
    __atomic_store_n(&rep->done, 1, __ATOMIC_RELEASE);
    /* Stay until the other rank has returned, so that its error comes from the
     * mismatch, not from our exit. */
    const struct report *other = (const struct report *)c->shared + (1 - c->rank);
    while (!__atomic_load_n(&other->done, __ATOMIC_ACQUIRE) && mr_now() < t0 + 20) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    free(buf);
    plait_comm_destroy(comm);
    return 0;
}

static void mismatch_case(int kind)
{
    char msg[1024];
    struct mr_procs *p = mr_procs_start(2, mismatch_child, &kind, 2 * sizeof(struct report), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 40, msg, sizeof(msg));
    struct report rep[2];
    memcpy(rep, mr_procs_shared(p), sizeof(rep));
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    for (int r = 0; r < 2; r++) {
        cr_log_info("mismatch %d: rank %d returned %s after %.3f s: %s", kind, r,
                    plait_get_error_string((plait_result_t)rep[r].result), rep[r].took, rep[r].text);
        cr_expect(rep[r].done, "rank %d never returned", r);
        cr_expect_eq(rep[r].result, PLAIT_ERR_INVALID_USAGE, "rank %d returned %s: %s", r,
                     plait_get_error_string((plait_result_t)rep[r].result), rep[r].text);
        cr_expect(strstr(rep[r].text, "mismatched") != NULL, "rank %d: the error does not say mismatched: %s", r,
                  rep[r].text);
        cr_expect_lt(rep[r].took, 5.0, "rank %d took %.2f s (deadline 15 s): found by the deadline, not the check",
                     r, rep[r].took);
    }
}

/* One rank on the small-message path, the other on the FIFO path: each finds
 * the other's traffic (FIFO data / a box tag for the same collective). */
Test(fastpath, mismatch_between_paths, .timeout = 60)
{
    mismatch_case(MIS_COUNT_PATHS);
}

/* Both on the path, different collectives: the tags differ. */
Test(fastpath, mismatch_inside_path, .timeout = 60)
{
    mismatch_case(MIS_KIND_SAME_SIZE);
}

#define KILL_N 3
struct kill_board {
    double t_kill;
    struct report rep[KILL_N];
    int iterations[KILL_N];
};

static int kill_child(struct mr_child *c, void *arg)
{
    (void)arg;
    struct kill_board *b = c->shared;
    setenv("PLAIT_COLL_TIMEOUT", "30", 1);
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    mr_child_ready(c);
    float x[4] = {0, 0, 0, 0};
    const double give_up = mr_now() + 20;
    plait_result_t r;
    do {
        r = plait_allreduce(x, x, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
        if (!r)
            b->iterations[c->rank]++;
    } while (!r && mr_now() < give_up);
    struct report *rep = &b->rep[c->rank];
    rep->took = mr_now();
    rep->result = (int)r;
    snprintf(rep->text, sizeof(rep->text), "%s", r ? plait_get_last_error(comm) : "");
    __atomic_store_n(&rep->done, 1, __ATOMIC_RELEASE);
    plait_comm_destroy(comm);
    return 0;
}

/* A peer SIGKILLed while the others loop small allreduces: they return
 * PLAIT_ERR_REMOTE naming it, at once (pidfds), not at the deadline. */
Test(fastpath, peer_killed, .timeout = 60)
{
    char msg[1024];
    struct mr_procs *p = mr_procs_start(KILL_N, kill_child, NULL, sizeof(struct kill_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    struct kill_board *shared = mr_procs_shared(p);
    cr_assert_eq(mr_procs_wait_ready(p, KILL_N, 30), 0, "the ranks did not start");
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    shared->t_kill = mr_now();
    mr_procs_kill(p, 1, SIGKILL);
    int failed = mr_procs_join(p, 30, msg, sizeof(msg));
    struct kill_board b = *shared;
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    for (int r = 0; r < KILL_N; r += 2) {
        cr_log_info("rank %d: %d allreduces, then %s %.3f s after the kill: %s", r, b.iterations[r],
                    plait_get_error_string((plait_result_t)b.rep[r].result), b.rep[r].took - b.t_kill,
                    b.rep[r].text);
        cr_expect(b.rep[r].done, "rank %d never returned", r);
        cr_expect_gt(b.iterations[r], 100, "rank %d: only %d allreduces before the kill", r, b.iterations[r]);
        cr_expect_eq(b.rep[r].result, PLAIT_ERR_REMOTE, "rank %d: %s", r, b.rep[r].text);
        cr_expect(strstr(b.rep[r].text, "rank 1") != NULL, "rank %d's error does not name rank 1: %s", r,
                  b.rep[r].text);
        cr_expect_lt(b.rep[r].took - b.t_kill, 3.0, "rank %d returned %.2f s after the kill", r,
                     b.rep[r].took - b.t_kill);
    }
}
