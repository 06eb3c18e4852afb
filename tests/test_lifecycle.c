/* Communicator lifecycle: split (and destroying the parent first), non-blocking
 * init, many init/destroy cycles without leaking descriptors or threads, nothing
 * left in /dev/shm (also when every rank is SIGKILLed right after init), fork
 * safety, finalize, and the small queries. Public API and the harness only.
 *
 * PLAIT_TEST_CYCLES sets the number of init/destroy cycles (default 100), so
 * that a run under valgrind --leak-check=full can use a few. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"

/* ---------------------------------------------------------------- helpers */

#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        snprintf(msg, len, __VA_ARGS__);                                                                           \
        return 1;                                                                                                  \
    } while (0)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int cycles_wanted(void)
{
    const char *v = getenv("PLAIT_TEST_CYCLES");
    int n = v && *v ? atoi(v) : 100;
    return n > 0 ? n : 1;
}

/* Setup and collective deadlines well inside each test's Criterion timeout, so
 * that a wait that never ends fails the test with a message. */
static void set_deadlines(void)
{
    setenv("PLAIT_TIMEOUT", "20", 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
}

TestSuite(lifecycle, .init = set_deadlines);

/* Every test checks that it leaves no plait-* entry of its own in /dev/shm. */
static struct mr_shm_set shm_before;

static void shm_begin(void)
{
    mr_shm_snapshot(&shm_before);
}

static void shm_end(void)
{
    char names[2048];
    int n = mr_shm_new_entries(&shm_before, names, sizeof(names));
    mr_shm_set_free(&shm_before);
    cr_expect_eq(n, 0, "%d new /dev/shm entries left behind: %s", n, names);
}

/* An int32 allreduce (sum) whose result depends on who took part: rank r of the
 * parent contributes (r + 1) * 1000 + i at index i. `members` is the bit set of
 * parent ranks in `comm`. Returns 0, or 1 with a message. */
#define AR_COUNT 1027
static int check_allreduce(plait_comm_t comm, int parent_rank, unsigned members, const char *what, char *msg,
                           size_t len)
{
    int32_t *buf = malloc(AR_COUNT * sizeof(int32_t));
    if (!buf)
        FAIL("out of memory");
    for (int i = 0; i < AR_COUNT; i++)
        buf[i] = (parent_rank + 1) * 1000 + i;
    plait_result_t r = plait_allreduce(buf, buf, AR_COUNT, PLAIT_INT32, PLAIT_SUM, comm, NULL);
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, len, "%s: allreduce: %s: %s", what, plait_get_error_string(r), plait_get_last_error(comm));
        free(buf);
        return 1;
    }
    int32_t base = 0, k = 0;
    for (int p = 0; p < 32; p++)
        if (members & (1u << p)) {
            base += (p + 1) * 1000;
            k++;
        }
    for (int i = 0; i < AR_COUNT; i++)
        if (buf[i] != base + k * i) {
            snprintf(msg, len, "%s: allreduce element %d is %d, expected %d", what, i, buf[i], base + k * i);
            free(buf);
            return 1;
        }
    free(buf);
    return 0;
}

/* ---------------------------------------------------------------- split */

/* Colors rank % 2 with keys reversed, and a second split that leaves the last
 * rank out; then the parent is destroyed first and the children must still work. */
static int split_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    plait_comm_t half = NULL, most = (plait_comm_t)(uintptr_t)0x1;
    plait_result_t r = plait_comm_split(comm, rank % 2, n - rank, &half, NULL);
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, len, "split(color %d, key %d): %s: %s", rank % 2, n - rank, plait_get_error_string(r),
                 plait_get_last_error(comm));
        plait_comm_destroy(comm);
        return 1;
    }
    const int last = rank == n - 1;
    r = plait_comm_split(comm, last ? PLAIT_SPLIT_NOCOLOR : 7, rank, &most, NULL);
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, len, "split(%s): %s: %s", last ? "NOCOLOR" : "7", plait_get_error_string(r),
                 plait_get_last_error(comm));
        plait_comm_destroy(half);
        plait_comm_destroy(comm);
        return 1;
    }
    int bad = 0;
    unsigned half_members = 0, most_members = 0;
    int want_count = 0, want_rank = 0;
    for (int q = 0; q < n; q++) {
        if (q % 2 != rank % 2)
            continue;
        half_members |= 1u << q;
        want_count++;
        if (q > rank) /* key n - q is smaller: ordered before us */
            want_rank++;
    }
    for (int q = 0; q < n - 1; q++)
        most_members |= 1u << q;
    int count = -1, crank = -1;
    if (!half) {
        snprintf(msg, len, "split by rank %% 2 gave NULL");
        bad = 1;
    } else if (plait_comm_count(half, &count) != PLAIT_SUCCESS || plait_comm_rank(half, &crank) != PLAIT_SUCCESS ||
               count != want_count || crank != want_rank) {
        snprintf(msg, len, "child of color %d: rank %d of %d, expected rank %d of %d", rank % 2, crank, count,
                 want_rank, want_count);
        bad = 1;
    }
    if (!bad && last && most != NULL) {
        snprintf(msg, len, "a rank passing PLAIT_SPLIT_NOCOLOR got %p, not NULL", (void *)most);
        bad = 1;
        most = NULL;
    } else if (!bad && !last) {
        if (!most || most == (plait_comm_t)(uintptr_t)0x1) {
            snprintf(msg, len, "split with color 7 gave %s", most ? "nothing (newcomm_out not written)" : "NULL");
            most = NULL;
            bad = 1;
        } else if (plait_comm_count(most, &count) != PLAIT_SUCCESS || plait_comm_rank(most, &crank) != PLAIT_SUCCESS ||
                   count != n - 1 || crank != rank) {
            snprintf(msg, len, "child of color 7: rank %d of %d, expected rank %d of %d", crank, count, rank, n - 1);
            bad = 1;
        }
    }
    if (bad && most == (plait_comm_t)(uintptr_t)0x1)
        most = NULL;
    if (!bad)
        bad = check_allreduce(half, rank, half_members, "child by rank % 2, parent alive", msg, len);
    if (!bad && most)
        bad = check_allreduce(most, rank, most_members, "child without the last rank, parent alive", msg, len);

    /* The parent goes first; the children have their own connections. */
    r = plait_comm_destroy(comm);
    if (!bad && r != PLAIT_SUCCESS) {
        snprintf(msg, len, "destroy parent: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
        bad = 1;
    }
    if (!bad)
        bad = check_allreduce(half, rank, half_members, "child by rank % 2, parent destroyed", msg, len);
    if (!bad && most)
        bad = check_allreduce(most, rank, most_members, "child without the last rank, parent destroyed", msg, len);
    if (!bad && half && plait_barrier(half, NULL) != PLAIT_SUCCESS) {
        snprintf(msg, len, "barrier on child after parent destroyed: %s", plait_get_last_error(half));
        bad = 1;
    }
    if (half && (r = plait_comm_destroy(half)) != PLAIT_SUCCESS && !bad) {
        snprintf(msg, len, "destroy child: %s", plait_get_error_string(r));
        bad = 1;
    }
    if (most && (r = plait_comm_destroy(most)) != PLAIT_SUCCESS && !bad) {
        snprintf(msg, len, "destroy child: %s", plait_get_error_string(r));
        bad = 1;
    }
    return bad;
}

static void split_case(enum mr_mode mode)
{
    char msg[1024];
    shm_begin();
    int failed = mr_run_owned(mode, 4, split_rank, NULL, 60, msg, sizeof(msg));
    cr_expect_eq(failed, 0, "%s: %d rank(s) failed: %s", mr_mode_name(mode), failed, msg);
    shm_end();
}

Test(lifecycle, split_threads, .timeout = 60)
{
    split_case(MR_THREADS);
}

Test(lifecycle, split_shm, .timeout = 60)
{
    split_case(MR_SHM);
}

Test(lifecycle, split_socket, .timeout = 60)
{
    split_case(MR_SOCKET);
}

/* ---------------------------------------------------------------- non-blocking init */

static const plait_config_t *nonblocking_config(void)
{
    static plait_config_t cfg = PLAIT_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return &cfg;
}

/* Polls until the communicator's state is no longer PLAIT_IN_PROGRESS; returns
 * the state (PLAIT_IN_PROGRESS if the deadline passed). */
static plait_result_t poll_async(plait_comm_t comm, double timeout_s)
{
    double deadline = mr_now() + timeout_s;
    plait_result_t state = PLAIT_IN_PROGRESS;
    for (;;) {
        plait_result_t r = plait_comm_get_async_error(comm, &state);
        if (r != PLAIT_SUCCESS)
            return r;
        if (state != PLAIT_IN_PROGRESS || mr_now() > deadline)
            return state;
        sleep_ms(1);
    }
}

#define NB_COUNT ((1u << 20) + 5)

static void nb_fill(float *buf, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)((rank + 1) * (int)(i % 1000));
}

static int nb_check(const float *buf, size_t n, int nranks, char *msg, size_t len)
{
    const int f = nranks * (nranks + 1) / 2;
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(f * (int)(i % 1000)))
            FAIL("element %zu is %g, expected %g", i, (double)buf[i], (double)(f * (int)(i % 1000)));
    return 0;
}

/* One thread makes both ranks of a non-blocking communicator, then drives an
 * allreduce on both: neither call may wait for the other rank. */
Test(lifecycle, nonblocking_init_threads, .timeout = 60)
{
    shm_begin();
    plait_unique_id_t id;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    plait_comm_t c[2] = {NULL, NULL};
    plait_result_t r = plait_comm_init_rank_config(&c[0], 2, id, 0, nonblocking_config());
    cr_assert_eq(r, PLAIT_IN_PROGRESS, "non-blocking init of rank 0 returned %s: %s", plait_get_error_string(r),
                 plait_get_last_error(NULL));
    cr_assert_not_null(c[0]);
    /* Rank 1 has not started: rank 0's init cannot be done. */
    plait_result_t state;
    cr_assert_eq(plait_comm_get_async_error(c[0], &state), PLAIT_SUCCESS);
    cr_expect_eq(state, PLAIT_IN_PROGRESS, "rank 0's init is %s before rank 1 started", plait_get_error_string(state));
    r = plait_comm_init_rank_config(&c[1], 2, id, 1, nonblocking_config());
    cr_assert_eq(r, PLAIT_IN_PROGRESS, "non-blocking init of rank 1 returned %s", plait_get_error_string(r));
    for (int i = 0; i < 2; i++) {
        state = poll_async(c[i], 30);
        cr_assert_eq(state, PLAIT_SUCCESS, "rank %d: init ended with %s: %s", i, plait_get_error_string(state),
                     plait_get_last_error(c[i]));
    }
    float *buf[2];
    for (int i = 0; i < 2; i++) {
        buf[i] = malloc(NB_COUNT * sizeof(float));
        cr_assert_not_null(buf[i]);
        nb_fill(buf[i], NB_COUNT, i);
    }
    r = plait_allreduce(buf[0], buf[0], NB_COUNT, PLAIT_FLOAT32, PLAIT_SUM, c[0], NULL);
    cr_assert(r == PLAIT_IN_PROGRESS || r == PLAIT_SUCCESS, "allreduce on rank 0: %s: %s", plait_get_error_string(r),
              plait_get_last_error(c[0]));
    cr_assert_eq(plait_comm_get_async_error(c[0], &state), PLAIT_SUCCESS);
    cr_expect_eq(state, PLAIT_IN_PROGRESS, "rank 0's allreduce is %s before rank 1 joined",
                 plait_get_error_string(state));
    r = plait_allreduce(buf[1], buf[1], NB_COUNT, PLAIT_FLOAT32, PLAIT_SUM, c[1], NULL);
    cr_assert(r == PLAIT_IN_PROGRESS || r == PLAIT_SUCCESS, "allreduce on rank 1: %s: %s", plait_get_error_string(r),
              plait_get_last_error(c[1]));
    for (int i = 0; i < 2; i++) {
        state = poll_async(c[i], 30);
        cr_assert_eq(state, PLAIT_SUCCESS, "rank %d: allreduce ended with %s: %s", i, plait_get_error_string(state),
                     plait_get_last_error(c[i]));
        char m[256] = "";
        cr_expect_eq(nb_check(buf[i], NB_COUNT, 2, m, sizeof(m)), 0, "rank %d: %s", i, m);
    }
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(plait_comm_destroy(c[i]), PLAIT_SUCCESS);
        free(buf[i]);
    }
    shm_end();
}

static int nonblocking_child(struct mr_child *c, void *arg)
{
    (void)arg;
    char *msg = c->msg;
    size_t len = c->msglen;
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank_config(&comm, c->nranks, c->id, c->rank, nonblocking_config());
    if (r != PLAIT_IN_PROGRESS)
        FAIL("non-blocking init returned %s, not PLAIT_IN_PROGRESS: %s", plait_get_error_string(r),
             plait_get_last_error(NULL));
    plait_result_t state = poll_async(comm, 30);
    if (state != PLAIT_SUCCESS)
        FAIL("init ended with %s: %s", plait_get_error_string(state), plait_get_last_error(comm));
    float *buf = malloc(NB_COUNT * sizeof(float));
    if (!buf)
        FAIL("out of memory");
    nb_fill(buf, NB_COUNT, c->rank);
    r = plait_allreduce(buf, buf, NB_COUNT, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    if (r != PLAIT_IN_PROGRESS && r != PLAIT_SUCCESS)
        FAIL("allreduce: %s: %s", plait_get_error_string(r), plait_get_last_error(comm));
    state = poll_async(comm, 30);
    if (state != PLAIT_SUCCESS)
        FAIL("allreduce ended with %s: %s", plait_get_error_string(state), plait_get_last_error(comm));
    int bad = nb_check(buf, NB_COUNT, c->nranks, msg, len);
    free(buf);
    r = plait_comm_destroy(comm);
    if (!bad && r != PLAIT_SUCCESS)
        FAIL("destroy: %s", plait_get_error_string(r));
    return bad;
}

Test(lifecycle, nonblocking_init_processes, .timeout = 60)
{
    shm_begin();
    char msg[1024];
    struct mr_procs *p = mr_procs_start(3, nonblocking_child, NULL, 0, 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 50, msg, sizeof(msg));
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    shm_end();
}

/* ---------------------------------------------------------------- init/destroy cycles */

/* The two ranks of an init_all communicator, driven by this thread in one group. */
static int group_allreduce_pair(plait_comm_t c[2], char *msg, size_t len)
{
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++) {
        a[i] = i;
        b[i] = 1000 * i;
    }
    plait_result_t r = plait_group_start();
    if (!r)
        r = plait_allreduce(a, a, 64, PLAIT_INT32, PLAIT_SUM, c[0], NULL);
    if (!r)
        r = plait_allreduce(b, b, 64, PLAIT_INT32, PLAIT_SUM, c[1], NULL);
    plait_result_t e = plait_group_end();
    if (r || e)
        FAIL("group allreduce: %s: %s", plait_get_error_string(r ? r : e), plait_get_last_error(NULL));
    for (int i = 0; i < 64; i++)
        if (a[i] != 1001 * i || b[i] != 1001 * i)
            FAIL("group allreduce element %d: %d and %d, expected %d", i, a[i], b[i], 1001 * i);
    return 0;
}

Test(lifecycle, init_destroy_cycles_threads, .timeout = 60)
{
    shm_begin();
    const int cycles = cycles_wanted();
    const int fds0 = mr_count_fds(), threads0 = mr_count_threads();
    double t0 = mr_now();
    for (int k = 0; k < cycles; k++) {
        plait_comm_t c[2] = {NULL, NULL};
        plait_result_t r = plait_comm_init_all(c, 2, NULL);
        cr_assert_eq(r, PLAIT_SUCCESS, "cycle %d: init_all: %s: %s", k, plait_get_error_string(r),
                     plait_get_last_error(NULL));
        char m[256] = "";
        int bad = group_allreduce_pair(c, m, sizeof(m));
        cr_expect_eq(plait_comm_destroy(c[0]), PLAIT_SUCCESS);
        cr_expect_eq(plait_comm_destroy(c[1]), PLAIT_SUCCESS);
        cr_assert_eq(bad, 0, "cycle %d: %s", k, m);
    }
    const int threads1 = mr_settle_threads(threads0, 5);
    const int fds1 = mr_count_fds();
    cr_log_info("init_destroy_cycles_threads: %d cycles in %.2f s", cycles, mr_now() - t0);
    cr_expect_eq(fds1, fds0, "open descriptors: %d before %d cycles, %d after", fds0, cycles, fds1);
    cr_expect_eq(threads1, threads0, "threads: %d before %d cycles, %d after", threads0, cycles, threads1);
    shm_end();
}

/* Rank 0 draws an id per cycle and hands it to the others through shared memory. */
struct cycle_board {
    uint64_t seq; /* cycle number + 1 of the id in `id` (release/acquire) */
    plait_unique_id_t id;
};

struct cycles_arg {
    int cycles;
    int socket; /* PLAIT_TRANSPORT=socket */
};

static int cycles_child(struct mr_child *c, void *arg)
{
    const struct cycles_arg *a = arg;
    const int cycles = a->cycles;
    if (a->socket)
        setenv("PLAIT_TRANSPORT", "socket", 1);
    char *msg = c->msg;
    size_t len = c->msglen;
    struct cycle_board *board = c->shared;
    const int fds0 = mr_count_fds(), threads0 = mr_count_threads();
    for (int k = 0; k < cycles; k++) {
        plait_unique_id_t id;
        if (c->rank == 0) {
            plait_result_t r = plait_get_unique_id(&id);
            if (r)
                FAIL("cycle %d: get_unique_id: %s", k, plait_get_last_error(NULL));
            board->id = id;
            __atomic_store_n(&board->seq, (uint64_t)k + 1, __ATOMIC_RELEASE);
        } else {
            double deadline = mr_now() + 20;
            while (__atomic_load_n(&board->seq, __ATOMIC_ACQUIRE) != (uint64_t)k + 1) {
                if (mr_now() > deadline)
                    FAIL("cycle %d: no id from rank 0 within 20 s", k);
                usleep(100);
            }
            id = board->id;
        }
        plait_comm_t comm = NULL;
        plait_result_t r = plait_comm_init_rank(&comm, c->nranks, id, c->rank);
        if (r)
            FAIL("cycle %d: init: %s: %s", k, plait_get_error_string(r), plait_get_last_error(NULL));
        int32_t v[16];
        for (int i = 0; i < 16; i++)
            v[i] = (c->rank + 1) * i;
        r = plait_allreduce(v, v, 16, PLAIT_INT32, PLAIT_SUM, comm, NULL);
        plait_result_t d = plait_comm_destroy(comm);
        if (r)
            FAIL("cycle %d: allreduce: %s: %s", k, plait_get_error_string(r), plait_get_last_error(NULL));
        if (d)
            FAIL("cycle %d: destroy: %s", k, plait_get_error_string(d));
        for (int i = 0; i < 16; i++)
            if (v[i] != 3 * i)
                FAIL("cycle %d: element %d is %d, expected %d", k, i, v[i], 3 * i);
    }
    const int threads1 = mr_settle_threads(threads0, 5);
    const int fds1 = mr_count_fds();
    if (fds1 != fds0 || threads1 != threads0)
        FAIL("after %d init/destroy cycles: %d open descriptors (%d before), %d threads (%d before)", cycles, fds1,
             fds0, threads1, threads0);
    return 0;
}

static void cycles_processes_case(int socket)
{
    shm_begin();
    struct cycles_arg a = {cycles_wanted(), socket};
    const int fds0 = mr_count_fds(), threads0 = mr_count_threads();
    char msg[1024];
    double t0 = mr_now();
    struct mr_procs *p =
        mr_procs_start(2, cycles_child, &a, sizeof(struct cycle_board), MR_PROCS_NO_ID, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 50, msg, sizeof(msg));
    mr_procs_free(p);
    cr_log_info("init_destroy_cycles_processes (%s): %d cycles in %.2f s", socket ? "socket" : "shm", a.cycles,
                mr_now() - t0);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    const int threads1 = mr_settle_threads(threads0, 5);
    const int fds1 = mr_count_fds();
    cr_expect_eq(fds1, fds0, "parent: open descriptors %d before, %d after", fds0, fds1);
    cr_expect_eq(threads1, threads0, "parent: threads %d before, %d after", threads0, threads1);
    shm_end();
}

Test(lifecycle, init_destroy_cycles_processes, .timeout = 60)
{
    cycles_processes_case(0);
}

Test(lifecycle, init_destroy_cycles_processes_socket, .timeout = 60)
{
    cycles_processes_case(1);
}

/* Non-blocking communicators start an init thread and, at their first call, a
 * worker: both must be gone after destroy. One thread drives both ranks. */
Test(lifecycle, init_destroy_cycles_nonblocking, .timeout = 60)
{
    shm_begin();
    const int cycles = cycles_wanted();
    const int fds0 = mr_count_fds(), threads0 = mr_count_threads();
    double t0 = mr_now();
    for (int k = 0; k < cycles; k++) {
        plait_unique_id_t id;
        cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
        plait_comm_t c[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            plait_result_t r = plait_comm_init_rank_config(&c[i], 2, id, i, nonblocking_config());
            cr_assert_eq(r, PLAIT_IN_PROGRESS, "cycle %d rank %d: init: %s", k, i, plait_get_error_string(r));
        }
        for (int i = 0; i < 2; i++)
            cr_assert_eq(poll_async(c[i], 20), PLAIT_SUCCESS, "cycle %d rank %d: init: %s", k, i,
                         plait_get_last_error(c[i]));
        float v[2][64];
        for (int i = 0; i < 2; i++) {
            nb_fill(v[i], 64, i);
            plait_result_t r = plait_allreduce(v[i], v[i], 64, PLAIT_FLOAT32, PLAIT_SUM, c[i], NULL);
            cr_assert(r == PLAIT_IN_PROGRESS || r == PLAIT_SUCCESS, "cycle %d rank %d: allreduce: %s", k, i,
                      plait_get_error_string(r));
        }
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(poll_async(c[i], 20), PLAIT_SUCCESS, "cycle %d rank %d: allreduce: %s", k, i,
                         plait_get_last_error(c[i]));
            char m[256] = "";
            cr_assert_eq(nb_check(v[i], 64, 2, m, sizeof(m)), 0, "cycle %d rank %d: %s", k, i, m);
        }
        cr_expect_eq(plait_comm_destroy(c[0]), PLAIT_SUCCESS);
        cr_expect_eq(plait_comm_destroy(c[1]), PLAIT_SUCCESS);
    }
    const int threads1 = mr_settle_threads(threads0, 5);
    const int fds1 = mr_count_fds();
    cr_log_info("init_destroy_cycles_nonblocking: %d cycles in %.2f s", cycles, mr_now() - t0);
    cr_expect_eq(fds1, fds0, "open descriptors: %d before %d cycles, %d after", fds0, cycles, fds1);
    cr_expect_eq(threads1, threads0, "threads: %d before %d cycles, %d after", threads0, cycles, threads1);
    shm_end();
}

/* ---------------------------------------------------------------- /dev/shm after SIGKILL */

static int init_then_wait(struct mr_child *c, void *arg)
{
    (void)arg;
    char *msg = c->msg;
    size_t len = c->msglen;
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    mr_child_ready(c);
    /* The parent kills us; if it never does, give up after a while. */
    sleep_ms(30000);
    snprintf(msg, len, "not killed within 30 s");
    plait_comm_destroy(comm);
    return 1;
}

Test(lifecycle, no_shm_left_after_sigkill, .timeout = 60)
{
    shm_begin();
    for (int round = 0; round < 3; round++) {
        char msg[1024];
        struct mr_procs *p = mr_procs_start(4, init_then_wait, NULL, 0, 0, msg, sizeof(msg));
        cr_assert_not_null(p, "%s", msg);
        int ready = mr_procs_wait_ready(p, 4, 30);
        for (int i = 0; i < 4; i++)
            mr_procs_kill(p, i, SIGKILL);
        int failed = mr_procs_join(p, 10, msg, sizeof(msg));
        mr_procs_free(p);
        cr_assert_eq(ready, 0, "round %d: the ranks did not all finish init within 30 s: %s", round, msg);
        cr_assert_eq(failed, 0, "round %d: %s", round, msg);
    }
    shm_end();
}

/* ---------------------------------------------------------------- fork safety */

/* Forks; the child destroys its copies of the communicators and exits. Returns
 * 0 when the child exited cleanly within 10 s. */
static int fork_and_destroy(plait_comm_t *comms, int n, char *msg, size_t len)
{
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(3);
        alarm(10); /* the child's own deadline */
        for (int i = 0; i < n; i++)
            if (plait_comm_destroy(comms[i]) != PLAIT_SUCCESS)
                _exit(1);
        _exit(0);
    }
    mr_note_child(pid);
    double deadline = mr_now() + 15;
    int status = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (mr_now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            FAIL("the forked child did not exit within 15 s");
        }
        sleep_ms(2);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL("the forked child's plait_comm_destroy failed (status 0x%x%s)", status,
             WIFSIGNALED(status) ? ", killed by a signal" : "");
    return 0;
}

Test(lifecycle, fork_safety_threads, .timeout = 60)
{
    shm_begin();
    plait_comm_t c[2] = {NULL, NULL};
    plait_result_t r = plait_comm_init_all(c, 2, NULL);
    cr_assert_eq(r, PLAIT_SUCCESS, "init_all: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    char m[256] = "";
    cr_expect_eq(group_allreduce_pair(c, m, sizeof(m)), 0, "before fork: %s", m);
    cr_expect_eq(fork_and_destroy(c, 2, m, sizeof(m)), 0, "%s", m);
    for (int k = 0; k < 3; k++)
        cr_expect_eq(group_allreduce_pair(c, m, sizeof(m)), 0, "after the child destroyed its copies (%d): %s", k, m);
    cr_expect_eq(plait_comm_destroy(c[0]), PLAIT_SUCCESS);
    cr_expect_eq(plait_comm_destroy(c[1]), PLAIT_SUCCESS);
    shm_end();
}

/* The same with non-blocking communicators that have run a call (so each has a
 * background worker in the parent, which the child does not have). */
Test(lifecycle, fork_safety_nonblocking, .timeout = 60)
{
    shm_begin();
    plait_unique_id_t id;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    plait_comm_t c[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        plait_result_t r = plait_comm_init_rank_config(&c[i], 2, id, i, nonblocking_config());
        cr_assert_eq(r, PLAIT_IN_PROGRESS, "init rank %d: %s", i, plait_get_error_string(r));
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(poll_async(c[i], 30), PLAIT_SUCCESS, "init rank %d: %s", i, plait_get_last_error(c[i]));
    float *buf[2];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 2; i++) {
            buf[i] = malloc(1024 * sizeof(float));
            cr_assert_not_null(buf[i]);
            nb_fill(buf[i], 1024, i);
            plait_result_t r = plait_allreduce(buf[i], buf[i], 1024, PLAIT_FLOAT32, PLAIT_SUM, c[i], NULL);
            cr_assert(r == PLAIT_IN_PROGRESS || r == PLAIT_SUCCESS, "round %d rank %d: %s", round, i,
                      plait_get_error_string(r));
        }
        for (int i = 0; i < 2; i++) {
            plait_result_t state = poll_async(c[i], 30);
            cr_assert_eq(state, PLAIT_SUCCESS, "round %d rank %d: %s: %s", round, i, plait_get_error_string(state),
                         plait_get_last_error(c[i]));
            char m[256] = "";
            cr_expect_eq(nb_check(buf[i], 1024, 2, m, sizeof(m)), 0, "round %d rank %d: %s", round, i, m);
            free(buf[i]);
        }
        if (round == 0) {
            char m[256] = "";
            cr_expect_eq(fork_and_destroy(c, 2, m, sizeof(m)), 0, "%s", m);
        }
    }
    cr_expect_eq(plait_comm_destroy(c[0]), PLAIT_SUCCESS);
    cr_expect_eq(plait_comm_destroy(c[1]), PLAIT_SUCCESS);
    shm_end();
}

/* Processes: rank 0 forks while its communicator is live; the child destroys
 * its copy; both ranks then keep using theirs. */
static int fork_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    unsigned all = (1u << n) - 1;
    if (check_allreduce(comm, rank, all, "before fork", msg, len))
        return 1;
    if (rank == 0 && fork_and_destroy(&comm, 1, msg, len))
        return 1;
    for (int k = 0; k < 3; k++)
        if (check_allreduce(comm, rank, all, "after the forked child destroyed its copy", msg, len))
            return 1;
    return 0;
}

static void fork_case(enum mr_mode mode)
{
    shm_begin();
    char msg[1024];
    int failed = mr_run(mode, 2, fork_rank, NULL, 50, msg, sizeof(msg));
    cr_expect_eq(failed, 0, "%s: %d rank(s) failed: %s", mr_mode_name(mode), failed, msg);
    shm_end();
}

Test(lifecycle, fork_safety_shm, .timeout = 60)
{
    fork_case(MR_SHM);
}

Test(lifecycle, fork_safety_socket, .timeout = 60)
{
    fork_case(MR_SOCKET);
}

/* ---------------------------------------------------------------- finalize, count, rank */

static int finalize_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    int count = -1, me = -1;
    plait_result_t r;
    if ((r = plait_comm_count(comm, &count)) != PLAIT_SUCCESS || count != n)
        FAIL("plait_comm_count: %s, %d (expected %d)", plait_get_error_string(r), count, n);
    if ((r = plait_comm_rank(comm, &me)) != PLAIT_SUCCESS || me != rank)
        FAIL("plait_comm_rank: %s, %d (expected %d)", plait_get_error_string(r), me, rank);
    if ((r = plait_comm_count(NULL, &count)) != PLAIT_ERR_INVALID_ARGUMENT)
        FAIL("plait_comm_count(NULL comm) returned %s", plait_get_error_string(r));
    if ((r = plait_comm_count(comm, NULL)) != PLAIT_ERR_INVALID_ARGUMENT)
        FAIL("plait_comm_count(NULL count_out) returned %s", plait_get_error_string(r));
    if ((r = plait_comm_rank(NULL, &me)) != PLAIT_ERR_INVALID_ARGUMENT)
        FAIL("plait_comm_rank(NULL comm) returned %s", plait_get_error_string(r));
    if ((r = plait_comm_rank(comm, NULL)) != PLAIT_ERR_INVALID_ARGUMENT)
        FAIL("plait_comm_rank(NULL rank_out) returned %s", plait_get_error_string(r));
    if (check_allreduce(comm, rank, (1u << n) - 1, "before finalize", msg, len))
        return 1;
    if ((r = plait_comm_finalize(comm)) != PLAIT_SUCCESS)
        FAIL("plait_comm_finalize: %s: %s", plait_get_error_string(r), plait_get_last_error(comm));
    /* Finalized: queries still answer, new work is refused (nothing is started,
     * so this cannot hang). */
    if (plait_comm_count(comm, &count) != PLAIT_SUCCESS || count != n || plait_comm_rank(comm, &me) != PLAIT_SUCCESS ||
        me != rank)
        FAIL("count/rank after finalize: %d/%d", count, me);
    int32_t x = 1;
    if ((r = plait_allreduce(&x, &x, 1, PLAIT_INT32, PLAIT_SUM, comm, NULL)) != PLAIT_ERR_INVALID_USAGE)
        FAIL("allreduce after finalize returned %s, expected PLAIT_ERR_INVALID_USAGE", plait_get_error_string(r));
    if ((r = plait_comm_destroy(comm)) != PLAIT_SUCCESS)
        FAIL("destroy after finalize: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    return 0;
}

static void finalize_case(enum mr_mode mode)
{
    shm_begin();
    char msg[1024];
    int failed = mr_run_owned(mode, 3, finalize_rank, NULL, 50, msg, sizeof(msg));
    cr_expect_eq(failed, 0, "%s: %d rank(s) failed: %s", mr_mode_name(mode), failed, msg);
    cr_expect_eq(plait_comm_destroy(NULL), PLAIT_SUCCESS, "plait_comm_destroy(NULL)");
    shm_end();
}

Test(lifecycle, finalize_then_destroy_threads, .timeout = 60)
{
    finalize_case(MR_THREADS);
}

Test(lifecycle, finalize_then_destroy_shm, .timeout = 60)
{
    finalize_case(MR_SHM);
}
