/* Faults: a peer SIGKILLed in the middle of large allreduces (shared memory and
 * TCP), plait_comm_abort from another thread, PLAIT_COLL_TIMEOUT, settings that
 * differ between ranks, mismatched counts, and a garbage unique id. Each fault
 * must end in an error that names what went wrong, within a bound, never a hang
 * or a crash. Public API and the harness only. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"

/* ---------------------------------------------------------------- helpers */

#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        snprintf(c->msg, c->msglen, __VA_ARGS__);                                                                  \
        return 1;                                                                                                  \
    } while (0)

/* Setup deadline well inside each test's Criterion timeout; each test sets the
 * collective deadline it needs. */
static void set_deadlines(void)
{
    setenv("PLAIT_TIMEOUT", "20", 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
}

TestSuite(faults, .init = set_deadlines);

/* What each rank reports to the parent through shared memory. */
struct report {
    int done;              /* 1 once the rank has returned from the call under test */
    int result;            /* its plait_result_t */
    int iterations;        /* calls that completed before */
    double t_start;        /* mr_now() when the call (or the loop) started */
    double t_return;       /* mr_now() when it returned */
    char text[700];        /* plait_get_last_error at that point */
};

static void report_result(struct report *rep, plait_result_t r, plait_comm_t comm)
{
    rep->t_return = mr_now();
    rep->result = (int)r;
    snprintf(rep->text, sizeof(rep->text), "%s", r ? plait_get_last_error(comm) : "");
    __atomic_store_n(&rep->done, 1, __ATOMIC_RELEASE);
}

static struct shm_guard {
    struct mr_shm_set before;
} guard;

static void shm_begin(void)
{
    mr_shm_snapshot(&guard.before);
}

static void shm_end(void)
{
    char names[2048];
    int n = mr_shm_new_entries(&guard.before, names, sizeof(names));
    mr_shm_set_free(&guard.before);
    cr_expect_eq(n, 0, "%d new /dev/shm entries left behind: %s", n, names);
}

/* ---------------------------------------------------------------- a peer killed mid-allreduce */

#define KILL_NRANKS 4
#define KILL_VICTIM 2
#define KILL_FLOATS ((size_t)16 << 20) /* 64 MiB of floats per rank */

struct kill_board {
    double t_kill;
    struct report rep[KILL_NRANKS];
};

static int kill_child(struct mr_child *c, void *arg)
{
    const int socket_mode = *(const int *)arg;
    struct kill_board *b = c->shared;
    struct report *rep = &b->rep[c->rank];
    if (socket_mode)
        setenv("PLAIT_TRANSPORT", "socket", 1);
    /* Generous: the point is that a dead peer is found by events, not by this. */
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    float *buf = calloc(KILL_FLOATS, sizeof(float)); /* zeros: sums stay zero */
    if (!buf)
        FAIL("out of memory");
    rep->t_start = mr_now();
    mr_child_ready(c);
    const double give_up = mr_now() + 40;
    do {
        r = plait_allreduce(buf, buf, KILL_FLOATS, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
        if (r == PLAIT_SUCCESS)
            rep->iterations++;
    } while (r == PLAIT_SUCCESS && mr_now() < give_up);
    report_result(rep, r, comm);
    free(buf);
    plait_comm_destroy(comm);
    if (r == PLAIT_SUCCESS)
        FAIL("still no error 40 s after the start (%d allreduces)", rep->iterations);
    return 0;
}

/* strict: also the rest of what docs/architecture.md section 9 promises ("the survivors return an error
 * naming the operation, its sequence number, the peer rank and host"): the
 * message of each survivor that names rank 2 must also name the operation
 * ("allreduce"), its sequence number ("#<n>", n = completed allreduces + 1) and
 * the host. */
static void kill_case(int socket_mode, int strict)
{
    shm_begin();
    char msg[1024];
    struct mr_procs *p =
        mr_procs_start(KILL_NRANKS, kill_child, &socket_mode, sizeof(struct kill_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    struct kill_board *shared = mr_procs_shared(p);
    int ready = mr_procs_wait_ready(p, KILL_NRANKS, 30);
    if (ready != 0) {
        int failed = mr_procs_join(p, 5, msg, sizeof(msg));
        mr_procs_free(p);
        cr_assert_fail("the ranks did not all start within 30 s (%d failed: %s)", failed, msg);
    }
    /* Let them get well into an allreduce of 64 MiB. */
    mr_sleep_ms(300);
    shared->t_kill = mr_now();
    mr_procs_kill(p, KILL_VICTIM, SIGKILL);
    int failed = mr_procs_join(p, 30, msg, sizeof(msg));
    const int victim_status = mr_procs_status(p, KILL_VICTIM);
    static struct kill_board board;
    board = *shared;
    const struct kill_board *b = &board;
    mr_procs_free(p);
    cr_expect(WIFSIGNALED(victim_status) && WTERMSIG(victim_status) == SIGKILL,
              "rank %d was not killed by SIGKILL (status 0x%x)", KILL_VICTIM, victim_status);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    for (int r = 0; r < KILL_NRANKS; r++) {
        if (r == KILL_VICTIM)
            continue;
        const struct report *rep = &b->rep[r];
        const int neighbour = r == (KILL_VICTIM + 1) % KILL_NRANKS || r == (KILL_VICTIM + KILL_NRANKS - 1) % KILL_NRANKS;
        const double after = rep->t_return - b->t_kill;
        cr_log_info("%s: rank %d returned %s %.3f s after the kill, after %d allreduces: %s",
                    socket_mode ? "socket" : "shm", r, plait_get_error_string((plait_result_t)rep->result), after,
                    rep->iterations, rep->text);
        if (!rep->done) {
            cr_expect_fail("rank %d never returned from its allreduce", r);
            continue;
        }
        cr_expect_neq(rep->result, PLAIT_SUCCESS, "rank %d: no error", r);
        cr_expect_lt(after, 10.0, "rank %d returned %.2f s after the kill (limit 10 s)", r, after);
        if (!socket_mode || neighbour) {
            cr_expect_eq(rep->result, PLAIT_ERR_REMOTE, "rank %d returned %s, expected PLAIT_ERR_REMOTE: %s", r,
                         plait_get_error_string((plait_result_t)rep->result), rep->text);
            cr_expect(mr_names_rank(rep->text, KILL_VICTIM), "rank %d's error does not name rank %d: \"%s\"", r,
                      KILL_VICTIM, rep->text);
        }
        if (strict && mr_names_rank(rep->text, KILL_VICTIM)) {
            char host[256] = "", seq[32];
            gethostname(host, sizeof(host) - 1);
            snprintf(seq, sizeof(seq), "#%d", rep->iterations + 1);
            cr_expect(strstr(rep->text, "allreduce") != NULL, "rank %d's error does not name the operation: \"%s\"",
                      r, rep->text);
            cr_expect(strstr(rep->text, seq) != NULL, "rank %d's error does not give the sequence number %s: \"%s\"",
                      r, seq, rep->text);
            cr_expect(strstr(rep->text, host) != NULL, "rank %d's error does not name the host %s: \"%s\"", r, host,
                      rep->text);
        }
    }
    shm_end();
}

Test(faults, peer_killed_mid_allreduce_shm, .timeout = 60)
{
    kill_case(0, 0);
}

Test(faults, peer_killed_mid_allreduce_socket, .timeout = 60)
{
    kill_case(1, 0);
}

/* docs/architecture.md, section 9: the survivors' error names the operation, its sequence number, the
 * peer's rank and host. */
Test(faults, peer_killed_error_names_operation_shm, .timeout = 60)
{
    kill_case(0, 1);
}

Test(faults, peer_killed_error_names_operation_socket, .timeout = 60)
{
    kill_case(1, 1);
}

/* ---------------------------------------------------------------- abort from another thread */

struct aborter {
    plait_comm_t comm;
    double t_abort;
    plait_result_t result;
};

static void *abort_after_200ms(void *p)
{
    struct aborter *a = p;
    mr_sleep_ms(200);
    a->t_abort = mr_now();
    a->result = plait_comm_abort(a->comm);
    return NULL;
}

Test(faults, abort_from_another_thread, .timeout = 30)
{
    /* If abort did not work, the collective deadline ends the call (and the test fails on time). */
    setenv("PLAIT_COLL_TIMEOUT", "8", 1);
    plait_comm_t c[2] = {NULL, NULL};
    plait_result_t r = plait_comm_init_all(c, 2, NULL);
    cr_assert_eq(r, PLAIT_SUCCESS, "init_all: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    struct aborter a = {.comm = c[0], .t_abort = 0, .result = PLAIT_NUM_RESULTS};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, abort_after_200ms, &a), 0);
    float x[1024];
    memset(x, 0, sizeof(x));
    const double t0 = mr_now();
    /* Rank 1 never joins: only the abort can end this. */
    r = plait_allreduce(x, x, 1024, PLAIT_FLOAT32, PLAIT_SUM, c[0], NULL);
    const double t1 = mr_now();
    /* c[0] is freed by the abort: only the thread's own last error may be read. */
    char text[700];
    snprintf(text, sizeof(text), "%s", plait_get_last_error(NULL));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    int joined = pthread_timedjoin_np(th, NULL, &ts);
    cr_assert_eq(joined, 0, "plait_comm_abort did not return within 10 s");
    cr_log_info("abort: allreduce returned %s %.3f s after the abort (%.3f s after the call): %s",
                plait_get_error_string(r), t1 - a.t_abort, t1 - t0, text);
    cr_expect_eq(a.result, PLAIT_SUCCESS, "plait_comm_abort returned %s", plait_get_error_string(a.result));
    cr_expect_neq(r, PLAIT_SUCCESS, "the allreduce of the aborted communicator succeeded");
    cr_expect_neq(r, PLAIT_ERR_TIMEOUT, "the allreduce ran into PLAIT_COLL_TIMEOUT: the abort did not wake it");
    cr_expect_eq(r, PLAIT_ERR_REMOTE, "plait.h: a collective in flight returns PLAIT_ERR_REMOTE on abort, got %s",
                 plait_get_error_string(r));
    cr_expect(strstr(text, "abort") != NULL, "the message does not say the communicator was aborted: \"%s\"", text);
    cr_expect_gt(a.t_abort, 0.0);
    cr_expect_lt(t1 - a.t_abort, 2.0, "the allreduce returned %.2f s after the abort (limit 2 s)", t1 - a.t_abort);
    cr_expect_eq(plait_comm_destroy(c[1]), PLAIT_SUCCESS, "destroying the other rank: %s", plait_get_last_error(NULL));
}

/* The abort lands while the other thread is just entering the collective.
 * plait.h: "Safe to call while another thread is inside a collective on comm:
 * that call returns, and the memory is released when it has." The caller
 * announces itself right before the call and the abort comes 1-8 us later, so
 * the call has (all but always) begun. A crash inside plait here means that a
 * thread that had passed the communicator's validity check went on to use it
 * after the abort freed it. */
struct entering {
    plait_comm_t comm;
    int announced;
    plait_result_t result;
};

static void *enter_allreduce(void *p)
{
    struct entering *e = p;
    float x[256];
    memset(x, 0, sizeof(x));
    __atomic_store_n(&e->announced, 1, __ATOMIC_RELEASE);
    e->result = plait_allreduce(x, x, 256, PLAIT_FLOAT32, PLAIT_SUM, e->comm, NULL);
    return NULL;
}

static void spin_us(int us)
{
    const double end = mr_now() + us * 1e-6;
    while (mr_now() < end) {
    }
}

Test(faults, abort_while_entering_collective, .timeout = 60,
     .description = "abort racing with a thread entering a collective never crashes")
{
    setenv("PLAIT_COLL_TIMEOUT", "8", 1);
    const int rounds = 1000;
    double worst = 0;
    for (int k = 0; k < rounds; k++) {
        plait_comm_t c[2] = {NULL, NULL};
        plait_result_t r = plait_comm_init_all(c, 2, NULL);
        cr_assert_eq(r, PLAIT_SUCCESS, "round %d: init_all: %s: %s", k, plait_get_error_string(r),
                     plait_get_last_error(NULL));
        struct entering e = {.comm = c[0], .announced = 0, .result = PLAIT_NUM_RESULTS};
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, enter_allreduce, &e), 0);
        const double wait_until = mr_now() + 5;
        while (!__atomic_load_n(&e.announced, __ATOMIC_ACQUIRE) && mr_now() < wait_until) {
        }
        spin_us(1 + (k * 7) % 8);
        const double t_abort = mr_now();
        cr_assert_eq(plait_comm_abort(c[0]), PLAIT_SUCCESS, "round %d: abort", k);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 5;
        cr_assert_eq(pthread_timedjoin_np(th, NULL, &ts), 0, "round %d: the allreduce did not return within 5 s", k);
        const double took = mr_now() - t_abort;
        if (took > worst)
            worst = took;
        cr_expect_neq(e.result, PLAIT_SUCCESS, "round %d: the aborted allreduce succeeded", k);
        cr_expect_lt(took, 2.0, "round %d: the allreduce returned %.2f s after the abort", k, took);
        cr_expect_eq(plait_comm_destroy(c[1]), PLAIT_SUCCESS);
    }
    cr_log_info("abort while entering: %d rounds, slowest return %.3f s after the abort", rounds, worst);
}

/* ---------------------------------------------------------------- PLAIT_COLL_TIMEOUT */

static int timeout_child(struct mr_child *c, void *arg)
{
    (void)arg;
    struct report *rep = (struct report *)c->shared + c->rank;
    setenv("PLAIT_COLL_TIMEOUT", "1", 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    if (c->rank == 1) { /* never calls the collective */
        mr_sleep_ms(3000);
        plait_comm_destroy(comm);
        return 0;
    }
    float x[1024];
    memset(x, 0, sizeof(x));
    rep->t_start = mr_now();
    r = plait_allreduce(x, x, 1024, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    report_result(rep, r, comm);
    plait_comm_destroy(comm);
    return 0;
}

Test(faults, coll_timeout, .timeout = 30)
{
    shm_begin();
    char msg[1024];
    struct mr_procs *p = mr_procs_start(2, timeout_child, NULL, 2 * sizeof(struct report), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    const struct report *rep = mr_procs_shared(p);
    int failed = mr_procs_join(p, 20, msg, sizeof(msg));
    struct report r0 = rep[0];
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    cr_assert(r0.done, "rank 0 never returned from its allreduce");
    const double took = r0.t_return - r0.t_start;
    cr_log_info("coll_timeout: allreduce returned %s after %.3f s: %s",
                plait_get_error_string((plait_result_t)r0.result), took, r0.text);
    cr_expect_eq(r0.result, PLAIT_ERR_TIMEOUT, "rank 0's allreduce returned %s, expected PLAIT_ERR_TIMEOUT: %s",
                 plait_get_error_string((plait_result_t)r0.result), r0.text);
    cr_expect(took >= 0.9 && took <= 2.5, "rank 0's allreduce returned after %.2f s, expected 1-2.5 s", took);
    cr_expect(strstr(r0.text, "PLAIT_COLL_TIMEOUT") != NULL, "the message does not name PLAIT_COLL_TIMEOUT: \"%s\"",
              r0.text);
    shm_end();
}

/* ---------------------------------------------------------------- settings that differ */

struct nchannels_arg {
    const char *per_rank[8]; /* PLAIT_NCHANNELS of each rank */
};

static int settings_child(struct mr_child *c, void *arg)
{
    const struct nchannels_arg *a = arg;
    struct report *rep = (struct report *)c->shared + c->rank;
    setenv("PLAIT_NCHANNELS", a->per_rank[c->rank], 1);
    setenv("PLAIT_TIMEOUT", "30", 1); /* a hang would show as a failure after 30 s, not before */
    plait_comm_t comm = (plait_comm_t)(uintptr_t)0x1;
    rep->t_start = mr_now();
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    report_result(rep, r, NULL);
    if (r == PLAIT_SUCCESS) {
        plait_comm_destroy(comm);
        FAIL("init succeeded although PLAIT_NCHANNELS differs between ranks");
    }
    if (comm != (plait_comm_t)(uintptr_t)0x1)
        FAIL("a failed init wrote *comm_out");
    return 0;
}

/* Runs the ranks with the given PLAIT_NCHANNELS values; every rank's init must
 * fail within 10 s with PLAIT_ERR_INVALID_USAGE and a message naming the
 * variable and rank `odd`. */
static void settings_case(int n, const struct nchannels_arg *a, int odd)
{
    shm_begin();
    char msg[1024];
    struct mr_procs *p =
        mr_procs_start(n, settings_child, (void *)a, (size_t)n * sizeof(struct report), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 40, msg, sizeof(msg));
    struct report rep[8];
    memcpy(rep, mr_procs_shared(p), (size_t)n * sizeof(struct report));
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    for (int r = 0; r < n; r++) {
        cr_log_info("settings: rank %d (PLAIT_NCHANNELS=%s): %s after %.3f s: %s", r, a->per_rank[r],
                    plait_get_error_string((plait_result_t)rep[r].result), rep[r].t_return - rep[r].t_start,
                    rep[r].text);
        if (!rep[r].done) {
            cr_expect_fail("rank %d never returned from init", r);
            continue;
        }
        cr_expect_neq(rep[r].result, PLAIT_SUCCESS, "rank %d: init succeeded", r);
        cr_expect_lt(rep[r].t_return - rep[r].t_start, 10.0, "rank %d: init failed only after %.1f s", r,
                     rep[r].t_return - rep[r].t_start);
        cr_expect(strstr(rep[r].text, "PLAIT_NCHANNELS") != NULL, "rank %d: the message does not name "
                  "PLAIT_NCHANNELS: \"%s\"", r, rep[r].text);
        cr_expect(mr_names_rank(rep[r].text, odd), "rank %d: the message does not name rank %d: \"%s\"", r, odd,
                  rep[r].text);
        cr_expect_eq(rep[r].result, PLAIT_ERR_INVALID_USAGE,
                     "rank %d: init returned %s; plait.h documents PLAIT_ERR_INVALID_USAGE when settings differ", r,
                     plait_get_error_string((plait_result_t)rep[r].result));
    }
    shm_end();
}

Test(faults, settings_mismatch_2_ranks, .timeout = 60)
{
    static const struct nchannels_arg a = {{"1", "2"}};
    settings_case(2, &a, 1);
}

Test(faults, settings_mismatch_names_the_odd_rank, .timeout = 60)
{
    static const struct nchannels_arg a = {{"2", "2", "1", "2"}};
    settings_case(4, &a, 2);
}

/* ---------------------------------------------------------------- mismatched counts */

static int counts_child(struct mr_child *c, void *arg)
{
    (void)arg;
    struct report *rep = (struct report *)c->shared + c->rank;
    setenv("PLAIT_COLL_TIMEOUT", "5", 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    const size_t count = c->rank == 0 ? 1000 : 3000;
    float *buf = calloc(3000, sizeof(float));
    if (!buf)
        FAIL("out of memory");
    rep->t_start = mr_now();
    r = plait_allreduce(buf, buf, count, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    report_result(rep, r, comm);
    /* Stay alive until the other rank has returned too, so that its error comes
     * from the mismatch or the deadline, not from seeing this process exit. */
    const struct report *other = (const struct report *)c->shared + (1 - c->rank);
    const double give_up = mr_now() + 10;
    while (!__atomic_load_n(&other->done, __ATOMIC_ACQUIRE) && mr_now() < give_up)
        mr_sleep_ms(5);
    free(buf);
    plait_comm_destroy(comm);
    return 0;
}

Test(faults, mismatched_counts, .timeout = 60)
{
    shm_begin();
    char msg[1024];
    struct mr_procs *p = mr_procs_start(2, counts_child, NULL, 2 * sizeof(struct report), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 30, msg, sizeof(msg));
    struct report rep[2];
    memcpy(rep, mr_procs_shared(p), sizeof(rep));
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed (crashed?): %s", failed, msg);
    for (int r = 0; r < 2; r++) {
        if (!rep[r].done) {
            cr_expect_fail("rank %d never returned from its allreduce", r);
            continue;
        }
        const double took = rep[r].t_return - rep[r].t_start;
        cr_log_info("mismatched counts: rank %d (count %d) returned %s after %.3f s: %s", r, r ? 3000 : 1000,
                    plait_get_error_string((plait_result_t)rep[r].result), took, rep[r].text);
        cr_expect_neq(rep[r].result, PLAIT_SUCCESS, "rank %d: the allreduce with mismatched counts succeeded", r);
        cr_expect_lt(took, 6.5, "rank %d returned after %.2f s (PLAIT_COLL_TIMEOUT=5)", r, took);
    }
    shm_end();
}

/* ---------------------------------------------------------------- a garbage unique id */

Test(faults, garbage_unique_id, .timeout = 30)
{
    setenv("PLAIT_TIMEOUT", "10", 1);
    plait_unique_id_t ids[4];
    memset(&ids[0], 0, sizeof(ids[0]));
    memset(&ids[1], 0xff, sizeof(ids[1]));
    srand(12345);
    for (size_t i = 0; i < sizeof(ids[2].internal); i++)
        ids[2].internal[i] = (char)(rand() & 0xff);
    for (size_t i = 0; i < sizeof(ids[3].internal); i++)
        ids[3].internal[i] = (char)("plait"[i % 5] ^ (int)i);
    for (int k = 0; k < 4; k++) {
        for (int rank = 0; rank < 2; rank++) {
            plait_comm_t comm = (plait_comm_t)(uintptr_t)0x1;
            const double t0 = mr_now();
            plait_result_t r = plait_comm_init_rank(&comm, 2, ids[k], rank);
            const double took = mr_now() - t0;
            if (r == PLAIT_SUCCESS && comm != (plait_comm_t)(uintptr_t)0x1)
                plait_comm_destroy(comm);
            cr_expect_eq(r, PLAIT_ERR_INVALID_ARGUMENT, "garbage id %d, rank %d: %s (%s)", k, rank,
                         plait_get_error_string(r), plait_get_last_error(NULL));
            cr_expect(strlen(plait_get_last_error(NULL)) > 0, "garbage id %d: no message", k);
            cr_expect_lt(took, 1.0, "garbage id %d, rank %d: took %.2f s", k, rank, took);
            cr_expect_eq(comm, (plait_comm_t)(uintptr_t)0x1, "garbage id %d: *comm_out was written", k);
        }
    }
}
