/* API misuse: stale handles (a destroyed communicator, stream or event used
 * again), garbage handles (a wild pointer, a pointer to ordinary memory, a
 * handle of another kind) and counts whose byte sizes cannot be a buffer
 * (count x element size x nranks overflowing, or running past the end of the
 * address space). Each returns PLAIT_ERR_INVALID_ARGUMENT with a message that
 * names the argument, never a crash or a hang, with ranks as threads, as
 * processes over shared memory and over sockets. Public API and the harness
 * only; these run under AddressSanitizer too (which would report any read of a
 * freed handle). */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"

static void set_deadlines(void)
{
    setenv("PLAIT_TIMEOUT", "20", 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
}

TestSuite(misuse, .init = set_deadlines);

/* In a rank function: the call must fail with `code` and a last-error message
 * containing `word`. */
#define RANK_EXPECT(call, code, word)                                                                             \
    do {                                                                                                          \
        plait_result_t r_ = (call);                                                                               \
        const char *m_ = plait_get_last_error(NULL);                                                              \
        if (r_ != (code) || !strstr(m_, word)) {                                                                  \
            snprintf(msg, len, "%s returned %d (%s), message \"%s\"; expected %d naming \"%s\"", #call, r_,     \
                     plait_get_error_string(r_), m_, code, word);                                                 \
            return 1;                                                                                             \
        }                                                                                                         \
    } while (0)

#define EXPECT_ERR(call, code, word)                                                                              \
    do {                                                                                                          \
        plait_result_t r_ = (call);                                                                               \
        cr_expect_eq(r_, code, "%s returned %d (%s), expected %d", #call, r_, plait_get_error_string(r_), code); \
        cr_expect(strstr(plait_get_last_error(NULL), word) != NULL, "%s: message \"%s\" does not name \"%s\"",    \
                  #call, plait_get_last_error(NULL), word);                                                       \
    } while (0)

static int sum_check(plait_comm_t comm, int rank, int n, const char *when, char *msg, size_t len)
{
    float x[4], y[4];
    for (int i = 0; i < 4; i++)
        x[i] = (float)(rank + i);
    plait_result_t r = plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, len, "%s: allreduce: %s: %s", when, plait_get_error_string(r), plait_get_last_error(comm));
        return 1;
    }
    for (int i = 0; i < 4; i++) {
        float want = (float)(n * (n - 1) / 2 + n * i);
        if (y[i] != want) {
            snprintf(msg, len, "%s: allreduce: y[%d] = %g, want %g", when, i, y[i], want);
            return 1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- destroyed communicators */

/* Every call that takes a communicator, on a destroyed one. */
static int stale_comm_calls(plait_comm_t comm, char *msg, size_t len)
{
    float x[4] = {0}, y[4];
    int v;
    plait_result_t ae;
    plait_comm_t child;
    void *h;
    plait_redop_t op;
    double s = 1;
    const plait_result_t E = PLAIT_ERR_INVALID_ARGUMENT;
    RANK_EXPECT(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), E, "comm");
    RANK_EXPECT(plait_broadcast(x, y, 4, PLAIT_FLOAT32, 0, comm, NULL), E, "comm");
    RANK_EXPECT(plait_reduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, 0, comm, NULL), E, "comm");
    RANK_EXPECT(plait_allgather(x, y, 1, PLAIT_FLOAT32, comm, NULL), E, "comm");
    RANK_EXPECT(plait_reducescatter(x, y, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), E, "comm");
    RANK_EXPECT(plait_alltoall(x, y, 1, PLAIT_FLOAT32, comm, NULL), E, "comm");
    RANK_EXPECT(plait_gather(x, y, 1, PLAIT_FLOAT32, 0, comm, NULL), E, "comm");
    RANK_EXPECT(plait_scatter(x, y, 1, PLAIT_FLOAT32, 0, comm, NULL), E, "comm");
    RANK_EXPECT(plait_send(x, 1, PLAIT_FLOAT32, 0, comm, NULL), E, "comm");
    RANK_EXPECT(plait_recv(y, 1, PLAIT_FLOAT32, 0, comm, NULL), E, "comm");
    RANK_EXPECT(plait_barrier(comm, NULL), E, "comm");
    RANK_EXPECT(plait_comm_count(comm, &v), E, "comm");
    RANK_EXPECT(plait_comm_rank(comm, &v), E, "comm");
    RANK_EXPECT(plait_comm_get_async_error(comm, &ae), E, "comm");
    RANK_EXPECT(plait_comm_split(comm, 0, 0, &child, NULL), E, "comm");
    RANK_EXPECT(plait_comm_register(comm, x, sizeof(x), &h), E, "comm");
    RANK_EXPECT(plait_comm_deregister(comm, x), E, "comm");
    RANK_EXPECT(plait_redop_create_premulsum(&op, &s, PLAIT_FLOAT64, PLAIT_SCALAR_HOST_IMMEDIATE, comm), E, "comm");
    RANK_EXPECT(plait_redop_destroy((plait_redop_t)PLAIT_NUM_OPS, comm), E, "comm");
    RANK_EXPECT(plait_comm_window_register(comm, x, sizeof(x), PLAIT_WIN_DEFAULT, &(plait_window_t){NULL}), E,
                "comm");
    RANK_EXPECT(plait_comm_window_deregister(comm, NULL), E, "comm");
    RANK_EXPECT(plait_comm_finalize(comm), E, "comm");
    RANK_EXPECT(plait_comm_destroy(comm), E, "comm");
    RANK_EXPECT(plait_comm_abort(comm), E, "comm");
    const char *m = plait_get_last_error(comm);
    if (!m) {
        snprintf(msg, len, "plait_get_last_error(a destroyed communicator) is NULL");
        return 1;
    }
    return 0;
}

static int destroyed_comm_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    if (sum_check(comm, rank, n, "before destroy", msg, len))
        return 1;
    if (plait_comm_destroy(comm) != PLAIT_SUCCESS) {
        snprintf(msg, len, "plait_comm_destroy: %s", plait_get_last_error(NULL));
        return 1;
    }
    if (stale_comm_calls(comm, msg, len))
        return 1;
    /* A new communicator, made while the old handle is stale (the allocator
     * would hand the freed address out again): the old handle must not be
     * taken for it. */
    plait_comm_t fresh;
    plait_result_t r = plait_comm_init_all(&fresh, 1, NULL);
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, len, "init_all(1): %s", plait_get_last_error(NULL));
        return 1;
    }
    int bad = fresh == comm;
    if (bad)
        snprintf(msg, len, "a new communicator got the destroyed one's address %p", (void *)comm);
    else
        bad = stale_comm_calls(comm, msg, len);
    if (!bad)
        bad = sum_check(fresh, 0, 1, "the new communicator", msg, len);
    plait_comm_destroy(fresh);
    return bad;
}

static void destroyed_comm_case(enum mr_mode mode, int nranks)
{
    char msg[1024];
    int failed = mr_run_owned(mode, nranks, destroyed_comm_rank, NULL, 40, msg, sizeof(msg));
    cr_expect_eq(failed, 0, "%s: %d rank(s) failed: %s", mr_mode_name(mode), failed, msg);
}

Test(misuse, destroyed_comm_threads, .timeout = 60)
{
    destroyed_comm_case(MR_THREADS, 2);
}

Test(misuse, destroyed_comm_processes, .timeout = 60)
{
    destroyed_comm_case(MR_SHM, 2);
}

/* ---------------------------------------------------------------- garbage handles */

Test(misuse, garbage_handles, .timeout = 60)
{
    plait_comm_t comm;
    cr_assert_eq(plait_comm_init_all(&comm, 1, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    plait_stream_t stream;
    plait_event_t event;
    cr_assert_eq(plait_stream_create(&stream), PLAIT_SUCCESS);
    cr_assert_eq(plait_event_create(&event), PLAIT_SUCCESS);
    /* Memory that is mapped but holds no plait object, a wild address, and
     * handles of the other kinds. */
    static uint64_t junk[512];
    memset(junk, 0x5a, sizeof(junk));
    void *const wild = (void *)(uintptr_t)0x10;
    float x[4] = {0}, y[4];
    int v;
    plait_result_t ae;
    const plait_result_t E = PLAIT_ERR_INVALID_ARGUMENT;
    void *const bad_comms[] = {wild, junk, stream, event};
    for (size_t i = 0; i < sizeof(bad_comms) / sizeof(bad_comms[0]); i++) {
        plait_comm_t c = bad_comms[i];
        EXPECT_ERR(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, c, NULL), E, "comm");
        EXPECT_ERR(plait_broadcast(x, y, 4, PLAIT_FLOAT32, 0, c, NULL), E, "comm");
        EXPECT_ERR(plait_send(x, 1, PLAIT_FLOAT32, 0, c, NULL), E, "comm");
        EXPECT_ERR(plait_barrier(c, NULL), E, "comm");
        EXPECT_ERR(plait_comm_count(c, &v), E, "comm");
        EXPECT_ERR(plait_comm_rank(c, &v), E, "comm");
        EXPECT_ERR(plait_comm_get_async_error(c, &ae), E, "comm");
        EXPECT_ERR(plait_comm_split(c, 0, 0, &(plait_comm_t){NULL}, NULL), E, "comm");
        EXPECT_ERR(plait_comm_register(c, x, sizeof(x), &(void *){NULL}), E, "comm");
        EXPECT_ERR(plait_comm_deregister(c, x), E, "comm");
        EXPECT_ERR(plait_redop_destroy((plait_redop_t)PLAIT_NUM_OPS, c), E, "comm");
        EXPECT_ERR(plait_comm_window_deregister(c, NULL), E, "comm");
        EXPECT_ERR(plait_comm_finalize(c), E, "comm");
        EXPECT_ERR(plait_comm_destroy(c), E, "comm");
        EXPECT_ERR(plait_comm_abort(c), E, "comm");
        cr_expect_not_null(plait_get_last_error(c));
    }
    void *const bad_streams[] = {wild, junk, comm, event};
    for (size_t i = 0; i < sizeof(bad_streams) / sizeof(bad_streams[0]); i++) {
        plait_stream_t s = bad_streams[i];
        EXPECT_ERR(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, s), E, "stream");
        EXPECT_ERR(plait_barrier(comm, s), E, "stream");
        EXPECT_ERR(plait_recv(y, 1, PLAIT_FLOAT32, 0, comm, s), E, "stream");
        EXPECT_ERR(plait_stream_synchronize(s), E, "stream");
        EXPECT_ERR(plait_event_record(event, s), E, "stream");
        EXPECT_ERR(plait_stream_wait_event(s, event), E, "stream");
        EXPECT_ERR(plait_stream_destroy(s), E, "stream");
    }
    void *const bad_events[] = {wild, junk, comm, stream};
    for (size_t i = 0; i < sizeof(bad_events) / sizeof(bad_events[0]); i++) {
        plait_event_t e = bad_events[i];
        EXPECT_ERR(plait_event_record(e, NULL), E, "event");
        EXPECT_ERR(plait_event_record(e, stream), E, "event");
        EXPECT_ERR(plait_event_synchronize(e), E, "event");
        EXPECT_ERR(plait_stream_wait_event(stream, e), E, "event");
        EXPECT_ERR(plait_event_destroy(e), E, "event");
    }
    /* registration handles and windows that are not this communicator's (it
     * has no window: a usage error, as NCCL's, before win is looked at) */
    EXPECT_ERR(plait_comm_deregister(comm, wild), E, "handle");
    EXPECT_ERR(plait_comm_deregister(comm, junk), E, "handle");
    void *h = NULL;
    cr_expect_eq(plait_comm_register(comm, x, sizeof(x), &h), PLAIT_SUCCESS);
    cr_expect_eq(plait_comm_deregister(comm, h), PLAIT_SUCCESS);
    EXPECT_ERR(plait_comm_deregister(comm, h), E, "handle");
    EXPECT_ERR(plait_comm_window_deregister(comm, (plait_window_t)wild), PLAIT_ERR_INVALID_USAGE, "window");
    EXPECT_ERR(plait_comm_window_deregister(comm, (plait_window_t)junk), PLAIT_ERR_INVALID_USAGE, "window");

    /* the real handles still work */
    cr_expect_eq(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, stream), PLAIT_SUCCESS, "%s",
                 plait_get_last_error(comm));
    cr_expect_eq(plait_event_record(event, stream), PLAIT_SUCCESS);
    cr_expect_eq(plait_event_synchronize(event), PLAIT_SUCCESS);
    cr_expect_eq(plait_stream_synchronize(stream), PLAIT_SUCCESS);
    cr_expect_eq(plait_event_destroy(event), PLAIT_SUCCESS);
    cr_expect_eq(plait_stream_destroy(stream), PLAIT_SUCCESS);
    cr_expect_eq(plait_comm_destroy(comm), PLAIT_SUCCESS);
}

/* ---------------------------------------------------------------- destroyed streams and events */

static int destroyed_stream_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    plait_stream_t s;
    if (plait_stream_create(&s) != PLAIT_SUCCESS) {
        snprintf(msg, len, "plait_stream_create: %s", plait_get_last_error(NULL));
        return 1;
    }
    float x[4] = {1, 2, 3, 4}, y[4];
    plait_result_t r = plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, s);
    if (r == PLAIT_SUCCESS)
        r = plait_stream_synchronize(s);
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, len, "allreduce on a live stream: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
        return 1;
    }
    if (plait_stream_destroy(s) != PLAIT_SUCCESS) {
        snprintf(msg, len, "plait_stream_destroy: %s", plait_get_last_error(NULL));
        return 1;
    }
    const plait_result_t E = PLAIT_ERR_INVALID_ARGUMENT;
    RANK_EXPECT(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, s), E, "stream");
    RANK_EXPECT(plait_allgather(x, y, 1, PLAIT_FLOAT32, comm, s), E, "stream");
    RANK_EXPECT(plait_barrier(comm, s), E, "stream");
    RANK_EXPECT(plait_send(x, 1, PLAIT_FLOAT32, (rank + 1) % n, comm, s), E, "stream");
    RANK_EXPECT(plait_stream_synchronize(s), E, "stream");
    RANK_EXPECT(plait_stream_wait_event(s, NULL), E, "stream");
    RANK_EXPECT(plait_stream_destroy(s), E, "stream");
    /* nothing was started: the communicator still works */
    return sum_check(comm, rank, n, "after the calls on a destroyed stream", msg, len);
}

static void destroyed_stream_case(enum mr_mode mode)
{
    char msg[1024];
    int failed = mr_run(mode, 2, destroyed_stream_rank, NULL, 40, msg, sizeof(msg));
    cr_expect_eq(failed, 0, "%s: %d rank(s) failed: %s", mr_mode_name(mode), failed, msg);
}

Test(misuse, destroyed_stream_threads, .timeout = 60)
{
    destroyed_stream_case(MR_THREADS);
}

Test(misuse, destroyed_stream_processes, .timeout = 60)
{
    destroyed_stream_case(MR_SHM);
}

Test(misuse, destroyed_stream_socket, .timeout = 60)
{
    destroyed_stream_case(MR_SOCKET);
}

Test(misuse, destroyed_event, .timeout = 60)
{
    plait_event_t e;
    plait_stream_t s;
    cr_assert_eq(plait_event_create(&e), PLAIT_SUCCESS);
    cr_assert_eq(plait_stream_create(&s), PLAIT_SUCCESS);
    cr_assert_eq(plait_event_record(e, s), PLAIT_SUCCESS);
    cr_assert_eq(plait_event_destroy(e), PLAIT_SUCCESS);
    const plait_result_t E = PLAIT_ERR_INVALID_ARGUMENT;
    EXPECT_ERR(plait_event_record(e, NULL), E, "event");
    EXPECT_ERR(plait_event_record(e, s), E, "event");
    EXPECT_ERR(plait_event_synchronize(e), E, "event");
    EXPECT_ERR(plait_stream_wait_event(s, e), E, "event");
    EXPECT_ERR(plait_stream_wait_event(NULL, e), E, "event");
    EXPECT_ERR(plait_event_destroy(e), E, "event");
    /* a new event is not taken for the old one */
    plait_event_t e2;
    cr_assert_eq(plait_event_create(&e2), PLAIT_SUCCESS);
    cr_expect_neq((void *)e2, (void *)e, "a new event got the destroyed one's address");
    if (e2 != e)
        EXPECT_ERR(plait_event_synchronize(e), E, "event");
    cr_expect_eq(plait_event_record(e2, s), PLAIT_SUCCESS);
    cr_expect_eq(plait_event_synchronize(e2), PLAIT_SUCCESS);
    cr_expect_eq(plait_event_destroy(e2), PLAIT_SUCCESS);
    cr_expect_eq(plait_stream_destroy(s), PLAIT_SUCCESS);
}

/* ---------------------------------------------------------------- counts whose bytes cannot be a buffer */

/* Every call of rank functions below has a count whose byte size overflows,
 * or cannot be a buffer in the address space; each names what is wrong. */
static int overflow_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    static float x[16], y[16 * 8];
    const plait_result_t E = PLAIT_ERR_INVALID_ARGUMENT;
    const size_t huge = SIZE_MAX / 8; /* x 4 bytes: 2^63 - 4 bytes, below SIZE_MAX / 2 */
    /* count x element size alone: no buffer of 2^63 bytes exists */
    RANK_EXPECT(plait_allreduce(x, y, huge, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), E, "count");
    RANK_EXPECT(plait_allreduce(x, x, huge, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), E, "count");
    RANK_EXPECT(plait_reduce(x, y, huge, PLAIT_FLOAT32, PLAIT_MAX, 0, comm, NULL), E, "count");
    RANK_EXPECT(plait_broadcast(x, y, huge, PLAIT_FLOAT32, 0, comm, NULL), E, "count");
    RANK_EXPECT(plait_send(x, huge, PLAIT_FLOAT32, (rank + 1) % n, comm, NULL), E, "count");
    RANK_EXPECT(plait_recv(y, huge, PLAIT_FLOAT32, (rank + n - 1) % n, comm, NULL), E, "count");
    RANK_EXPECT(plait_allreduce(x, y, SIZE_MAX / 4 + 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), E, "count");
    RANK_EXPECT(plait_allreduce(x, y, SIZE_MAX, PLAIT_FLOAT64, PLAIT_SUM, comm, NULL), E, "count");
    /* Counts that overflow, or leave the address space, only with nranks:
     * each rank's block is small enough, the blocks of every rank are not. */
    const size_t blocks = SIZE_MAX / 8 / (size_t)n; /* x 4 bytes x n: just below 2^63 */
    RANK_EXPECT(plait_allgather(x, y, blocks, PLAIT_FLOAT32, comm, NULL), E, "count");
    RANK_EXPECT(plait_reducescatter(x, y, blocks, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), E, "count");
    RANK_EXPECT(plait_alltoall(x, y, blocks, PLAIT_FLOAT32, comm, NULL), E, "count");
    RANK_EXPECT(plait_gather(x, y, blocks, PLAIT_FLOAT32, 0, comm, NULL), E, "count");
    RANK_EXPECT(plait_scatter(x, y, blocks, PLAIT_FLOAT32, 0, comm, NULL), E, "count");
    const size_t wraps = SIZE_MAX / 4 / (size_t)n + 1; /* x 4 bytes x n: past 2^64 */
    RANK_EXPECT(plait_allgather(x, y, wraps, PLAIT_FLOAT32, comm, NULL), E, "count");
    RANK_EXPECT(plait_alltoall(x, y, wraps, PLAIT_FLOAT32, comm, NULL), E, "count");
    RANK_EXPECT(plait_reducescatter(x, y, wraps, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), E, "count");
    /* nothing was started: the communicator still works */
    return sum_check(comm, rank, n, "after the refused counts", msg, len);
}

static void overflow_case(int nranks)
{
    char msg[1024];
    int failed = mr_run(MR_THREADS, nranks, overflow_rank, NULL, 40, msg, sizeof(msg));
    cr_expect_eq(failed, 0, "%d ranks: %d rank(s) failed: %s", nranks, failed, msg);
}

Test(misuse, count_overflow_1_rank, .timeout = 60)
{
    overflow_case(1);
}

Test(misuse, count_overflow_3_ranks, .timeout = 60)
{
    overflow_case(3);
}

/* ---------------------------------------------------------------- handles a forked child inherits */

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* The child's checks; its exit status is the number that failed. */
static int child_checks(plait_comm_t comm, plait_stream_t s, plait_event_t e)
{
    int bad = 0;
    float x[4] = {0}, y[4];
    /* a parent's stream has no worker here, a parent's event no thread to
     * complete it: refused, never a hang */
    bad += plait_stream_synchronize(s) != PLAIT_ERR_INVALID_USAGE || !strstr(plait_get_last_error(NULL), "stream");
    bad += plait_event_record(e, NULL) != PLAIT_ERR_INVALID_USAGE || !strstr(plait_get_last_error(NULL), "event");
    bad += plait_event_synchronize(e) != PLAIT_ERR_INVALID_USAGE;
    bad += plait_stream_wait_event(s, e) != PLAIT_ERR_INVALID_USAGE;
    bad += plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL) != PLAIT_ERR_INVALID_USAGE;
    /* destroying the child's copies works, and then they are stale here */
    bad += plait_event_destroy(e) != PLAIT_SUCCESS;
    bad += plait_stream_destroy(s) != PLAIT_SUCCESS;
    bad += plait_comm_destroy(comm) != PLAIT_SUCCESS;
    bad += plait_stream_synchronize(s) != PLAIT_ERR_INVALID_ARGUMENT;
    bad += plait_event_synchronize(e) != PLAIT_ERR_INVALID_ARGUMENT;
    bad += plait_comm_destroy(comm) != PLAIT_ERR_INVALID_ARGUMENT;
    return bad;
}

Test(misuse, handles_inherited_by_a_forked_child, .timeout = 60)
{
    plait_comm_t comm;
    plait_stream_t s;
    plait_event_t e;
    cr_assert_eq(plait_comm_init_all(&comm, 1, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    cr_assert_eq(plait_stream_create(&s), PLAIT_SUCCESS);
    cr_assert_eq(plait_event_create(&e), PLAIT_SUCCESS);
    float x[4] = {1, 2, 3, 4}, y[4];
    cr_assert_eq(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, s), PLAIT_SUCCESS);
    cr_assert_eq(plait_event_record(e, s), PLAIT_SUCCESS);
    cr_assert_eq(plait_stream_synchronize(s), PLAIT_SUCCESS);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork failed");
    if (pid == 0) {
        alarm(20); /* a hang in the child ends it */
        _exit(child_checks(comm, s, e));
    }
    mr_note_child(pid);
    int status = 0;
    double deadline = mr_now() + 30;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (mr_now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        usleep(2000);
    }
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child's checks: status 0x%x (exit %d: checks failed; a signal: crashed or hung)", status,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    /* the parent's handles are untouched */
    cr_expect_eq(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, s), PLAIT_SUCCESS, "%s",
                 plait_get_last_error(comm));
    cr_expect_eq(plait_event_record(e, s), PLAIT_SUCCESS);
    cr_expect_eq(plait_event_synchronize(e), PLAIT_SUCCESS);
    cr_expect_eq(plait_event_destroy(e), PLAIT_SUCCESS);
    cr_expect_eq(plait_stream_destroy(s), PLAIT_SUCCESS);
    cr_expect_eq(plait_comm_destroy(comm), PLAIT_SUCCESS);
}

/* ---------------------------------------------------------------- the registry under churn */

/* Threads create and destroy events (hundreds live at once: the registry
 * grows, and reuses its tombstones) while this thread keeps using a stream
 * and a communicator made before: a live handle is never refused, a
 * destroyed one always is. */
#include <pthread.h>

struct churn {
    int bad;
    int done; /* set (atomically) when the thread ends */
    char why[256];
};

static void churn_rounds(struct churn *c);

static void *churn_main(void *p)
{
    churn_rounds(p);
    __atomic_store_n(&((struct churn *)p)->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void churn_rounds(struct churn *c)
{
    enum { HELD = 150, ROUNDS = 20 };
    plait_event_t ev[HELD];
    for (int round = 0; round < ROUNDS && !c->bad; round++) {
        for (int i = 0; i < HELD; i++)
            if (plait_event_create(&ev[i]) != PLAIT_SUCCESS) {
                snprintf(c->why, sizeof(c->why), "plait_event_create: %s", plait_get_last_error(NULL));
                c->bad = 1;
                return;
            }
        for (int i = 0; i < HELD; i++) {
            if (plait_event_synchronize(ev[i]) != PLAIT_SUCCESS) {
                snprintf(c->why, sizeof(c->why), "a live event refused: %s", plait_get_last_error(NULL));
                c->bad = 1;
            }
            plait_event_destroy(ev[i]);
            if (plait_event_synchronize(ev[i]) != PLAIT_ERR_INVALID_ARGUMENT) {
                snprintf(c->why, sizeof(c->why), "a destroyed event accepted");
                c->bad = 1;
            }
        }
    }
}

Test(misuse, registry_under_churn, .timeout = 120)
{
    plait_comm_t comm;
    plait_stream_t s;
    cr_assert_eq(plait_comm_init_all(&comm, 1, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    cr_assert_eq(plait_stream_create(&s), PLAIT_SUCCESS);
    enum { NTHREADS = 3 };
    pthread_t th[NTHREADS];
    struct churn c[NTHREADS];
    memset(c, 0, sizeof(c));
    for (int i = 0; i < NTHREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, churn_main, &c[i]), 0);
    int refused = 0, calls = 0;
    const double deadline = mr_now() + 90;
    for (int alive = NTHREADS; alive > 0 && mr_now() < deadline; calls++) {
        float x[2] = {1, 2}, y[2];
        if (plait_allreduce(x, y, 2, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL) != PLAIT_SUCCESS ||
            plait_stream_synchronize(s) != PLAIT_SUCCESS)
            refused++;
        alive = 0;
        for (int i = 0; i < NTHREADS; i++)
            alive += !__atomic_load_n(&c[i].done, __ATOMIC_ACQUIRE);
    }
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    cr_expect_eq(refused, 0, "%d of %d calls on live handles were refused: %s", refused, calls,
                 plait_get_last_error(NULL));
    for (int i = 0; i < NTHREADS; i++)
        cr_expect_eq(c[i].bad, 0, "thread %d: %s", i, c[i].why);
    cr_expect_eq(plait_stream_destroy(s), PLAIT_SUCCESS);
    cr_expect_eq(plait_comm_destroy(comm), PLAIT_SUCCESS);
}

/* The quarantine keeps a destroyed communicator's address from the next one
 * whatever else is destroyed meanwhile: a program that creates and destroys
 * an event per step (or a stream, a registration) must not flush it, or the
 * next communicator may take the address and a stale handle would act on it
 * (a call on someone else's communicator, no error). */
Test(misuse, stale_comm_not_taken_after_event_churn, .timeout = 60)
{
    int aliased = 0;
    for (int round = 0; round < 32; round++) {
        plait_comm_t old, fresh;
        cr_assert_eq(plait_comm_init_all(&old, 1, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
        cr_assert_eq(plait_comm_destroy(old), PLAIT_SUCCESS);
        for (int i = 0; i < 200; i++) {
            plait_event_t e;
            cr_assert_eq(plait_event_create(&e), PLAIT_SUCCESS);
            cr_assert_eq(plait_event_destroy(e), PLAIT_SUCCESS);
        }
        cr_assert_eq(plait_comm_init_all(&fresh, 1, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
        int n = 0;
        const plait_result_t r = plait_comm_count(old, &n);
        if (fresh == old || r != PLAIT_ERR_INVALID_ARGUMENT)
            aliased++;
        cr_expect_eq(r, PLAIT_ERR_INVALID_ARGUMENT, "round %d: the destroyed comm %p answered %d (the new one is %p)",
                     round, (void *)old, (int)r, (void *)fresh);
        cr_assert_eq(plait_comm_destroy(fresh), PLAIT_SUCCESS);
    }
    cr_expect_eq(aliased, 0, "a destroyed communicator's address went to a new one in %d of 32 rounds", aliased);
}

/* Two threads destroying one handle at once: one destroys it, the other is
 * told the handle is not live (before, both could pass the check, and the
 * object was quarantined twice: a double free). */
struct double_destroy {
    plait_event_t e;
    plait_stream_t s;
    int go, ready;
    plait_result_t ev_result, st_result;
};

static void *double_destroy_main(void *p)
{
    struct double_destroy *d = p;
    __atomic_add_fetch(&d->ready, 1, __ATOMIC_ACQ_REL);
    while (!__atomic_load_n(&d->go, __ATOMIC_ACQUIRE)) {
    }
    d->st_result = plait_stream_destroy(d->s);
    d->ev_result = plait_event_destroy(d->e);
    return NULL;
}

Test(misuse, handle_destroyed_by_two_threads_at_once, .timeout = 120)
{
    int both = 0, neither = 0;
    enum { ROUNDS = 300 };
    for (int round = 0; round < ROUNDS; round++) {
        struct double_destroy d[2];
        memset(d, 0, sizeof(d));
        cr_assert_eq(plait_event_create(&d[0].e), PLAIT_SUCCESS);
        cr_assert_eq(plait_stream_create(&d[0].s), PLAIT_SUCCESS);
        /* A record keeps both busy for a moment inside their destroy. */
        cr_assert_eq(plait_event_record(d[0].e, d[0].s), PLAIT_SUCCESS);
        d[1].e = d[0].e;
        d[1].s = d[0].s;
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            cr_assert_eq(pthread_create(&th[i], NULL, double_destroy_main, &d[i]), 0);
        while (__atomic_load_n(&d[0].ready, __ATOMIC_ACQUIRE) + __atomic_load_n(&d[1].ready, __ATOMIC_ACQUIRE) < 2) {
        }
        __atomic_store_n(&d[0].go, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&d[1].go, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        const int ev_ok = (d[0].ev_result == PLAIT_SUCCESS) + (d[1].ev_result == PLAIT_SUCCESS);
        const int st_ok = (d[0].st_result == PLAIT_SUCCESS) + (d[1].st_result == PLAIT_SUCCESS);
        both += (ev_ok == 2) + (st_ok == 2);
        neither += (ev_ok == 0) + (st_ok == 0);
        for (int i = 0; i < 2; i++) {
            if (d[i].ev_result != PLAIT_SUCCESS)
                cr_expect_eq(d[i].ev_result, PLAIT_ERR_INVALID_ARGUMENT, "round %d: the second event destroy: %d",
                             round, (int)d[i].ev_result);
            if (d[i].st_result != PLAIT_SUCCESS)
                cr_expect_eq(d[i].st_result, PLAIT_ERR_INVALID_ARGUMENT, "round %d: the second stream destroy: %d",
                             round, (int)d[i].st_result);
        }
    }
    cr_expect_eq(both, 0, "%d of %d handles were destroyed twice (both destroys succeeded)", both, 2 * ROUNDS);
    cr_expect_eq(neither, 0, "%d of %d handles were destroyed by neither thread", neither, 2 * ROUNDS);
}

/* The same for a communicator. */
struct double_comm_destroy {
    plait_comm_t comm;
    int *go, *ready;
    plait_result_t result;
};

static void *double_comm_destroy_main(void *p)
{
    struct double_comm_destroy *d = p;
    __atomic_add_fetch(d->ready, 1, __ATOMIC_ACQ_REL);
    while (!__atomic_load_n(d->go, __ATOMIC_ACQUIRE)) {
    }
    d->result = plait_comm_destroy(d->comm);
    return NULL;
}

Test(misuse, comm_destroyed_by_two_threads_at_once, .timeout = 120)
{
    int both = 0, neither = 0;
    enum { ROUNDS = 100 };
    for (int round = 0; round < ROUNDS; round++) {
        plait_comm_t comm;
        cr_assert_eq(plait_comm_init_all(&comm, 1, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
        int go = 0, ready = 0;
        struct double_comm_destroy d[2] = {{comm, &go, &ready, PLAIT_SUCCESS}, {comm, &go, &ready, PLAIT_SUCCESS}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            cr_assert_eq(pthread_create(&th[i], NULL, double_comm_destroy_main, &d[i]), 0);
        while (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) < 2) {
        }
        __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        const int ok = (d[0].result == PLAIT_SUCCESS) + (d[1].result == PLAIT_SUCCESS);
        both += ok == 2;
        neither += ok == 0;
        for (int i = 0; i < 2; i++)
            if (d[i].result != PLAIT_SUCCESS)
                cr_expect_eq(d[i].result, PLAIT_ERR_INVALID_ARGUMENT, "round %d: the second destroy: %d", round,
                             (int)d[i].result);
    }
    cr_expect_eq(both, 0, "%d of %d communicators were destroyed twice (both destroys succeeded)", both, ROUNDS);
    cr_expect_eq(neither, 0, "%d of %d communicators were destroyed by neither thread", neither, ROUNDS);
}
