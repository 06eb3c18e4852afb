/* The planning stage (core/plan.c): what plait_plan_make decides for a call,
 * asked directly on real communicators (planning runs nothing, so each rank
 * may plan calls its peers never make): the small-message path on the calling
 * thread, or queued inside a group or on a stream; a schedule whose channels
 * and chunk fit the communicator; a barrier's tag-only exchange; point-to-
 * point; no small-message path over sockets or with an algorithm forced. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "core/comm.h"
#include "core/plan.h"
#include "tests/harness.h"

#define FAILF(...)                                                                                                 \
    do {                                                                                                           \
        snprintf(msg, msglen, __VA_ARGS__);                                                                        \
        return 1;                                                                                                  \
    } while (0)

static void set_deadlines(void)
{
    setenv("PLAIT_TIMEOUT", "20", 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
    unsetenv("PLAIT_PROTO");
    unsetenv("NCCL_PROTO");
    unsetenv("PLAIT_ALGO");
    unsetenv("NCCL_ALGO");
}

TestSuite(plan, .init = set_deadlines);

static char sbuf[1 << 20], rbuf[1 << 20];

static plait_result_t plan_of(plait_comm_t comm, int coll, size_t count, plait_stream_t stream, struct plait_plan *p)
{
    const struct plait_call call = {.coll = coll, .name = "test_plan", .sendbuff = sbuf, .recvbuff = rbuf,
                                    .count = count, .dtype = PLAIT_FLOAT32, .root = 0, .red = NULL,
                                    .stream = stream};
    memset(p, 0xa5, sizeof(*p)); /* a field the planner forgets shows */
    return plait_plan_make((struct plait_comm *)comm, &call, p);
}

#define PLAN(coll, count, stream, p)                                                                               \
    do {                                                                                                           \
        plait_result_t r_ = plan_of(comm, (coll), (count), (stream), (p));                                         \
        if (r_ != PLAIT_SUCCESS)                                                                                   \
            FAILF("rank %d: plan of %s x %zu: %s: %s", rank, plait_coll_name(coll), (size_t)(count),              \
                  plait_get_error_string(r_), plait_get_last_error(comm));                                         \
    } while (0)

/* A schedule's channels and chunk: within the communicator and the FIFO (a
 * chunk of at most half of it, whole 16-byte units of elements). */
static int check_schedule(const struct plait_comm *c, const struct plait_plan *p, int coll, int rank, char *msg,
                          size_t msglen)
{
    if (p->path != PLAIT_PATH_SCHEDULE)
        FAILF("rank %d: %s: path %d, not a schedule", rank, plait_coll_name(coll), p->path);
    if (p->algo == PLAIT_ALGO_AUTO || p->algo >= PLAIT_ALGO_COUNT ||
        !plait_algorithms[p->algo].supports(coll, c->nranks))
        FAILF("rank %d: %s: algorithm %d cannot run it", rank, plait_coll_name(coll), p->algo);
    if (p->nchannels < 1 || p->nchannels > c->nchannels)
        FAILF("rank %d: %s: %d channels of %d", rank, plait_coll_name(coll), p->nchannels, c->nchannels);
    const uint64_t half = (uint64_t)(c->set.nslots / 2) * c->set.slot_bytes;
    if (p->chunk_elems == 0 || p->chunk_elems % 4 != 0 || (p->chunk_elems * 4 > half && p->chunk_elems != 4))
        FAILF("rank %d: %s: chunk of %llu floats (half the FIFO: %llu bytes)", rank, plait_coll_name(coll),
              (unsigned long long)p->chunk_elems, (unsigned long long)half);
    if (p->executor != PLAIT_EXEC_CPU || p->stream != NULL)
        FAILF("rank %d: %s: executor %d, stream %p", rank, plait_coll_name(coll), p->executor, (void *)p->stream);
    return 0;
}

static int on_boxes(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    (void)n;
    (void)arg;
    const struct plait_comm *c = (const struct plait_comm *)comm;
    if (!c->fast)
        FAILF("rank %d: no small-message boxes", rank);
    struct plait_plan p;

    PLAN(PLAIT_COLL_ALLREDUCE, 2, NULL, &p); /* 8 bytes */
    if (p.path != PLAIT_PATH_SMALL || p.executor != PLAIT_EXEC_CPU || !p.run_now || p.bytes != 8 ||
        p.nchannels != 1 || p.stream != NULL)
        FAILF("rank %d: 8-byte allreduce: path %d executor %d run_now %d bytes %zu channels %d", rank, p.path,
              p.executor, p.run_now, p.bytes, p.nchannels);

    PLAN(PLAIT_COLL_BARRIER, 1, NULL, &p);
    if (p.path != PLAIT_PATH_SMALL || !p.run_now || p.bytes != 0)
        FAILF("rank %d: barrier: path %d run_now %d bytes %zu (tags only)", rank, p.path, p.run_now, p.bytes);

    /* Inside a group the call is queued: the group runs it. */
    if (plait_group_start() != PLAIT_SUCCESS)
        FAILF("rank %d: plait_group_start failed", rank);
    plait_result_t r = plan_of(comm, PLAIT_COLL_ALLREDUCE, 2, NULL, &p);
    plait_group_end();
    if (r != PLAIT_SUCCESS)
        FAILF("rank %d: plan in a group: %s", rank, plait_get_error_string(r));
    if (p.path != PLAIT_PATH_SMALL || p.run_now || p.chunk_elems == 0)
        FAILF("rank %d: 8-byte allreduce in a group: path %d run_now %d chunk %llu", rank, p.path, p.run_now,
              (unsigned long long)p.chunk_elems);

    /* On a host stream, queued on that stream. */
    plait_stream_t s = NULL;
    if (plait_stream_create(&s) != PLAIT_SUCCESS)
        FAILF("rank %d: plait_stream_create failed", rank);
    r = plan_of(comm, PLAIT_COLL_ALLREDUCE, 2, s, &p);
    const int ok = r == PLAIT_SUCCESS && p.path == PLAIT_PATH_SMALL && !p.run_now && p.stream == s;
    plait_stream_destroy(s);
    if (!ok)
        FAILF("rank %d: 8-byte allreduce on a stream: %s, path %d run_now %d, stream %s", rank,
              plait_get_error_string(r), p.path, p.run_now, p.stream == s ? "its own" : "another");

    /* 1 MiB: a schedule. */
    PLAN(PLAIT_COLL_ALLREDUCE, 1 << 18, NULL, &p);
    if (check_schedule(c, &p, PLAIT_COLL_ALLREDUCE, rank, msg, msglen))
        return 1;
    PLAN(PLAIT_COLL_ALLGATHER, 1 << 16, NULL, &p);
    if (check_schedule(c, &p, PLAIT_COLL_ALLGATHER, rank, msg, msglen))
        return 1;

    /* Point-to-point: one task on its class, the configured chunk. */
    PLAN(PLAIT_COLL_SEND, 1024, NULL, &p);
    if (p.path != PLAIT_PATH_P2P || p.executor != PLAIT_EXEC_CPU || p.nchannels != c->nchannels ||
        p.chunk_elems == 0 || p.stream != NULL)
        FAILF("rank %d: send: path %d executor %d channels %d chunk %llu", rank, p.path, p.executor, p.nchannels,
              (unsigned long long)p.chunk_elems);
    return 0;
}

/* No boxes (sockets), or an algorithm forced: 8 bytes run a schedule. */
static int no_small(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    (void)n;
    const struct plait_comm *c = (const struct plait_comm *)comm;
    const int want_algo = arg ? *(const int *)arg : PLAIT_ALGO_AUTO;
    struct plait_plan p;
    PLAN(PLAIT_COLL_ALLREDUCE, 2, NULL, &p);
    if (check_schedule(c, &p, PLAIT_COLL_ALLREDUCE, rank, msg, msglen))
        return 1;
    if (want_algo != PLAIT_ALGO_AUTO && p.algo != want_algo)
        FAILF("rank %d: PLAIT_ALGO forced %s, the plan says %s", rank, plait_algorithms[want_algo].name,
              plait_algorithms[p.algo].name);
    return 0;
}

Test(plan, small_message_path_threads_2, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_THREADS, 2, on_boxes, NULL, 40, msg, sizeof(msg)), 0, "%s", msg);
}

Test(plan, small_message_path_shm_3, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SHM, 3, on_boxes, NULL, 40, msg, sizeof(msg)), 0, "%s", msg);
}

/* Over sockets there are no boxes; the path runs over connections
 * (core/fastpath.c) and is planned the same way. */
Test(plan, small_message_path_over_sockets, .timeout = 60)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SOCKET, 2, on_boxes, NULL, 40, msg, sizeof(msg)), 0, "%s", msg);
}

Test(plan, schedule_when_forced, .timeout = 60)
{
    char msg[1024];
    static int ring = PLAIT_ALGO_RING;
    setenv("PLAIT_ALGO", "allreduce:ring", 1);
    const int failed = mr_run(MR_SHM, 2, no_small, &ring, 40, msg, sizeof(msg));
    unsetenv("PLAIT_ALGO");
    cr_assert_eq(failed, 0, "PLAIT_ALGO=allreduce:ring: %s", msg);
}
