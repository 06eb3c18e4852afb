/* Connections made on first use (core/comm_transport.c, docs/architecture.md
 * section 4): what init connects, what a first call connects, and that no
 * pattern of first uses deadlocks: two ranks that need each other at once, a
 * group of many, a stream worker, one thread driving two communicators. Also
 * what a first use says when the peer's side never comes or the peer is
 * gone, and that nothing is left in /dev/shm. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"
#include "tests/harness.h"

#define FAIL(...)                                                                                                    \
    do {                                                                                                             \
        snprintf(msg, len, __VA_ARGS__);                                                                             \
        return 1;                                                                                                    \
    } while (0)

static int made(plait_comm_t comm, int peer, int cls)
{
    return __atomic_load_n(&comm->conns[peer * comm->ncls + cls], __ATOMIC_ACQUIRE) != NULL;
}

static int ring_neighbour(int rank, int peer, int n)
{
    return peer == (rank + 1) % n || peer == (rank + n - 1) % n;
}

/* Init made the ring neighbours' channel connections and nothing else (the
 * ring orders are rank order: PLAIT_TOPO_RINGS is not in play on these
 * machines' flat graphs... unless the topology put a neighbour elsewhere,
 * which plait_comm_ring_neighbours tells). An alltoall then connects every
 * peer on some channel; a send/recv ring the point-to-point class. */
static int first_use_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    const int p2p = comm->ncls - 1;
    for (int p = 0; p < n; p++)
        for (int c = 0; c < comm->ncls; c++) {
            const int want = c < comm->nchannels && p != rank &&
                             (ring_neighbour(rank, p, n) || plait_comm_ring_neighbours(comm, rank, p, c));
            if (made(comm, p, c) != want)
                FAIL("rank %d: after init, connection class %d with rank %d is %s", rank, c, p,
                     want ? "missing" : "made (expected on first use)");
        }
    const int at_init = plait_comm_conns_made(comm);
    /* 128 KiB per peer: past the small-message path (boxes: 4 KiB; over
     * connections, its own class: 64 KiB at most) */
    enum { PER = 32768 };
    int32_t *s = malloc(sizeof(int32_t) * PER * (size_t)n), *r = malloc(sizeof(int32_t) * PER * (size_t)n);
    for (int i = 0; i < PER * n; i++)
        s[i] = rank * 100000 + i;
    if (plait_alltoall(s, r, PER, PLAIT_INT32, comm, NULL))
        FAIL("rank %d: alltoall: %s", rank, plait_get_last_error(comm));
    for (int p = 0; p < n; p++)
        for (int i = 0; i < PER; i++)
            if (r[p * PER + i] != p * 100000 + rank * PER + i)
                FAIL("rank %d: alltoall: element %d from rank %d is %d", rank, i, p, r[p * PER + i]);
    int any_channel = 0;
    for (int p = 0; p < n; p++) {
        int some = 0;
        for (int c = 0; c < comm->nchannels; c++)
            some |= made(comm, p, c);
        if (p != rank && !some)
            FAIL("rank %d: the alltoall made no connection with rank %d", rank, p);
        any_channel += some;
    }
    if (plait_comm_conns_made(comm) <= at_init && n > 3)
        FAIL("rank %d: the alltoall made no connection (%d at init)", rank, at_init);
    if (made(comm, (rank + 1) % n, p2p))
        FAIL("rank %d: the point-to-point class is connected before any send", rank);
    /* a send/recv ring on the point-to-point class */
    plait_group_start();
    plait_send(s, 16, PLAIT_INT32, (rank + 1) % n, comm, NULL);
    plait_recv(r, 16, PLAIT_INT32, (rank + n - 1) % n, comm, NULL);
    if (plait_group_end())
        FAIL("rank %d: send/recv ring: %s", rank, plait_get_last_error(comm));
    for (int i = 0; i < 16; i++)
        if (r[i] != ((rank + n - 1) % n) * 100000 + i)
            FAIL("rank %d: send/recv ring: element %d is %d", rank, i, r[i]);
    if (n > 1 && (!made(comm, (rank + 1) % n, p2p) || !made(comm, (rank + n - 1) % n, p2p)))
        FAIL("rank %d: the ring's point-to-point connections were not made", rank);
    if (n > 3 && made(comm, (rank + 2) % n, p2p))
        FAIL("rank %d: a point-to-point connection to rank %d nobody used was made", rank, (rank + 2) % n);
    free(s);
    free(r);
    return 0;
}

static void run(enum mr_mode mode, int n, mr_fn fn, void *arg)
{
    char msg[2048] = "";
    struct mr_shm_set before;
    mr_shm_snapshot(&before);
    int failed = mr_run(mode, n, fn, arg, 120, msg, sizeof(msg));
    cr_assert_eq(failed, 0, "%s, %d ranks: %d failed: %s", mr_mode_name(mode), n, failed, msg);
    char left[1024] = "";
    const int nleft = mr_shm_new_entries(&before, left, sizeof(left));
    mr_shm_set_free(&before);
    cr_expect_eq(nleft, 0, "%s: left in /dev/shm: %s", mr_mode_name(mode), left);
}

Test(connect, first_use_threads_6, .timeout = 120)
{
    run(MR_THREADS, 6, first_use_rank, NULL);
}

Test(connect, first_use_shm_5, .timeout = 120)
{
    run(MR_SHM, 5, first_use_rank, NULL);
}

Test(connect, first_use_socket_5, .timeout = 120)
{
    run(MR_SOCKET, 5, first_use_rank, NULL);
}

/* PLAIT_RUNTIME_CONNECT=0: every connection at init. */
static int all_at_init_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    for (int p = 0; p < n; p++)
        for (int c = 0; c < comm->ncls; c++)
            if (made(comm, p, c) != plait_conn_needed(comm, rank, p, c))
                FAIL("rank %d: with PLAIT_RUNTIME_CONNECT=0, connection class %d with rank %d is %s after init", rank,
                     c, p, made(comm, p, c) ? "made, not needed" : "missing");
    return 0;
}

Test(connect, all_at_init_when_asked, .timeout = 120)
{
    setenv("PLAIT_RUNTIME_CONNECT", "0", 1);
    run(MR_SHM, 4, all_at_init_rank, NULL);
    run(MR_SOCKET, 3, all_at_init_rank, NULL);
    unsetenv("PLAIT_RUNTIME_CONNECT");
}

Test(connect, nccl_spelling_honoured, .timeout = 120)
{
    setenv("NCCL_RUNTIME_CONNECT", "0", 1);
    run(MR_THREADS, 4, all_at_init_rank, NULL);
    unsetenv("NCCL_RUNTIME_CONNECT");
}

/* Every rank sends to and receives from every other rank in one group: all
 * of its point-to-point connections are made at once, each needed by both
 * ends at the same moment, in a different order on each rank. */
static int all_pairs_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    const int rounds = arg ? *(const int *)arg : 1;
    int64_t *s = calloc((size_t)n * 33, sizeof(int64_t)), *r = calloc((size_t)n * 33, sizeof(int64_t));
    for (int round = 0; round < rounds; round++) {
        for (int p = 0; p < n; p++)
            for (int i = 0; i < 33; i++)
                s[p * 33 + i] = ((int64_t)rank << 40) | ((int64_t)p << 20) | (round * 33 + i);
        plait_group_start();
        for (int k = 0; k < n; k++) {
            const int p = (rank * 7 + k) % n; /* every rank in its own order */
            plait_send(s + p * 33, 33, PLAIT_INT64, p, comm, NULL);
            plait_recv(r + p * 33, 33, PLAIT_INT64, p, comm, NULL);
        }
        if (plait_group_end())
            FAIL("rank %d: round %d: %s", rank, round, plait_get_last_error(comm));
        for (int p = 0; p < n; p++)
            for (int i = 0; i < 33; i++)
                if (r[p * 33 + i] != (((int64_t)p << 40) | ((int64_t)rank << 20) | (round * 33 + i)))
                    FAIL("rank %d: round %d: element %d from rank %d is wrong", rank, round, i, p);
    }
    free(s);
    free(r);
    return 0;
}

Test(connect, all_pairs_at_once_threads_7, .timeout = 120)
{
    run(MR_THREADS, 7, all_pairs_rank, NULL);
}

Test(connect, all_pairs_at_once_shm_6, .timeout = 120)
{
    int rounds = 3;
    run(MR_SHM, 6, all_pairs_rank, &rounds);
}

Test(connect, all_pairs_at_once_socket_5, .timeout = 120)
{
    int rounds = 2;
    run(MR_SOCKET, 5, all_pairs_rank, &rounds);
}

/* First uses from a stream's worker thread: the calls return at once, the
 * worker makes the connections. */
static int stream_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    plait_stream_t st = NULL;
    if (plait_stream_create(&st))
        FAIL("rank %d: stream: %s", rank, plait_get_last_error(comm));
    float s[100], r[100];
    for (int i = 0; i < 100; i++)
        s[i] = (float)(rank + i);
    const int to = (rank + 2) % n, from = (rank + n - 2) % n;
    plait_group_start();
    plait_send(s, 100, PLAIT_FLOAT32, to, comm, st);
    plait_recv(r, 100, PLAIT_FLOAT32, from, comm, st);
    if (plait_group_end())
        FAIL("rank %d: group on the stream: %s", rank, plait_get_last_error(comm));
    if (plait_stream_synchronize(st))
        FAIL("rank %d: stream synchronize: %s", rank, plait_get_last_error(comm));
    plait_stream_destroy(st);
    for (int i = 0; i < 100; i++)
        if (r[i] != (float)(from + i))
            FAIL("rank %d: element %d from rank %d is %g", rank, i, from, (double)r[i]);
    return 0;
}

Test(connect, from_a_stream_worker_shm_5, .timeout = 120)
{
    run(MR_SHM, 5, stream_rank, NULL);
}

Test(connect, from_a_stream_worker_socket_4, .timeout = 120)
{
    run(MR_SOCKET, 4, stream_rank, NULL);
}

/* One thread drives two communicators at once: thread 0 holds rank 0 of A and
 * rank 1 of B, thread 1 the other two, and each issues, in one group, a send
 * on one communicator and a receive on the other (where its peer thread does
 * the opposite): each thread makes a connection of each communicator while
 * its peer makes the other end of both. */
struct two {
    plait_unique_id_t ida, idb;
    int fail[2];
    char msg[2][512];
};

struct two_arg {
    struct two *t;
    int who;
};

static void *two_comms_main(void *p)
{
    struct two_arg *a = p;
    struct two *t = a->t;
    const int who = a->who;
    plait_comm_t A = NULL, B = NULL;
    /* both inits are collective over their two threads: A first, then B */
    if (plait_comm_init_rank(&A, 2, t->ida, who) || plait_comm_init_rank(&B, 2, t->idb, 1 - who)) {
        t->fail[who] = 1;
        snprintf(t->msg[who], sizeof(t->msg[who]), "init: %s", plait_get_last_error(NULL));
        return NULL;
    }
    double sa[40], ra[40], sb[40], rb[40];
    for (int i = 0; i < 40; i++) {
        sa[i] = who * 100 + i;
        sb[i] = who * 1000 + i;
    }
    for (int round = 0; round < 3; round++) {
        plait_group_start();
        if (who == 0) {
            plait_send(sa, 40, PLAIT_FLOAT64, 1, A, NULL);
            plait_recv(rb, 40, PLAIT_FLOAT64, 0, B, NULL);
        } else {
            plait_recv(ra, 40, PLAIT_FLOAT64, 0, A, NULL);
            plait_send(sb, 40, PLAIT_FLOAT64, 1, B, NULL);
        }
        if (plait_group_end()) {
            t->fail[who] = 1;
            snprintf(t->msg[who], sizeof(t->msg[who]), "round %d: %s", round, plait_get_last_error(NULL));
            break;
        }
        for (int i = 0; i < 40 && !t->fail[who]; i++)
            if ((who == 0 ? rb[i] != 1000 + i : ra[i] != i)) {
                t->fail[who] = 1;
                snprintf(t->msg[who], sizeof(t->msg[who]), "round %d: element %d is wrong", round, i);
            }
    }
    plait_comm_destroy(A);
    plait_comm_destroy(B);
    return NULL;
}

Test(connect, one_thread_two_communicators, .timeout = 60)
{
    const char *modes[] = {"auto", "socket"};
    for (int m = 0; m < 2; m++) {
        setenv("PLAIT_TRANSPORT", modes[m], 1);
        struct two t;
        memset(&t, 0, sizeof(t));
        cr_assert_eq(plait_get_unique_id(&t.ida), PLAIT_SUCCESS);
        cr_assert_eq(plait_get_unique_id(&t.idb), PLAIT_SUCCESS);
        pthread_t th[2];
        struct two_arg a[2] = {{&t, 0}, {&t, 1}};
        for (int i = 0; i < 2; i++)
            cr_assert_eq(pthread_create(&th[i], NULL, two_comms_main, &a[i]), 0);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++)
            cr_expect_eq(t.fail[i], 0, "PLAIT_TRANSPORT=%s: thread %d: %s", modes[m], i, t.msg[i]);
    }
    unsetenv("PLAIT_TRANSPORT");
}

/* A receive whose peer never sends: the wait (PLAIT_COLL_TIMEOUT) names the
 * peer, whether it waited for the peer's side of the connection (a socket
 * dial nobody answers) or for its data (shared memory: the first end's
 * object is there at once). */
struct never_board {
    int done;
    int result;
    char err[1024];
};

static int never_child(struct mr_child *c, void *arg)
{
    (void)arg;
    struct never_board *b = c->shared;
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    if (c->rank == 0) {
        float buf[8] = {0};
        b->result = (int)plait_recv(buf, 8, PLAIT_FLOAT32, 2, comm, NULL);
        snprintf(b->err, sizeof(b->err), "%s", plait_get_last_error(comm));
        __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    } else {
        const double until = mr_now() + 60;
        while (!__atomic_load_n(&b->done, __ATOMIC_ACQUIRE) && mr_now() < until)
            mr_sleep_ms(5);
    }
    plait_comm_destroy(comm);
    return 0;
}

static void never_case(const char *transport, const char *what)
{
    setenv("PLAIT_TRANSPORT", transport, 1);
    setenv("PLAIT_COLL_TIMEOUT", "2", 1);
    char msg[1024];
    struct mr_shm_set before;
    mr_shm_snapshot(&before);
    struct mr_procs *p = mr_procs_start(3, never_child, NULL, sizeof(struct never_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    const int failed = mr_procs_join(p, 60, msg, sizeof(msg));
    struct never_board got = *(struct never_board *)mr_procs_shared(p);
    mr_procs_free(p);
    unsetenv("PLAIT_TRANSPORT");
    unsetenv("PLAIT_COLL_TIMEOUT");
    cr_expect_eq(failed, 0, "%s: %s", transport, msg);
    cr_expect_eq(got.result, PLAIT_ERR_TIMEOUT, "%s: rank 0's receive returned %d: %s", transport, got.result,
                 got.err);
    cr_expect(mr_names_rank(got.err, 2) && strstr(got.err, what), "%s: the timeout does not name rank 2 and \"%s\": %s",
              transport, what, got.err);
    char left[1024] = "";
    const int nleft = mr_shm_new_entries(&before, left, sizeof(left));
    mr_shm_set_free(&before);
    cr_expect_eq(nleft, 0, "%s: left in /dev/shm: %s", transport, left);
}

Test(connect, peer_side_never_comes_shm, .timeout = 120)
{
    never_case("auto", "its data");
}

Test(connect, peer_side_never_comes_socket, .timeout = 120)
{
    never_case("socket", "its side of a connection made on first use");
}

/* A peer killed before a first use: the survivor's first use fails at once
 * naming it (a same-host process: its pidfd; over sockets: the refused
 * dial or the peer's notice). */
struct dead_board {
    int result;
    double took;
    char err[1024];
};

struct dead_roles {
    int victim, survivor; /* the survivor receives from the victim */
};

static int dead_child(struct mr_child *c, void *arg)
{
    const struct dead_roles *roles = arg;
    struct dead_board *b = c->shared;
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    mr_child_ready(c);
    if (c->rank == roles->victim) {
        for (;;)
            pause(); /* killed by the parent */
    }
    if (c->rank == roles->survivor) {
        mr_sleep_ms(300); /* the parent kills the victim meanwhile */
        float buf[64] = {0};
        const double t0 = mr_now();
        b->result = (int)plait_recv(buf, 64, PLAIT_FLOAT32, roles->victim, comm, NULL);
        b->took = mr_now() - t0;
        snprintf(b->err, sizeof(b->err), "%s", plait_get_last_error(comm));
    }
    plait_comm_destroy(comm);
    return 0;
}

static void dead_case(const char *transport, int victim, int survivor)
{
    struct dead_roles roles = {victim, survivor};
    setenv("PLAIT_TRANSPORT", transport, 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
    char msg[1024];
    struct mr_shm_set before;
    mr_shm_snapshot(&before);
    struct mr_procs *p = mr_procs_start(3, dead_child, &roles, sizeof(struct dead_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    cr_assert_eq(mr_procs_wait_ready(p, 3, 60), 0, "the ranks did not init");
    mr_procs_kill(p, victim, SIGKILL);
    mr_procs_join(p, 60, msg, sizeof(msg));
    struct dead_board got = *(struct dead_board *)mr_procs_shared(p);
    mr_procs_free(p);
    unsetenv("PLAIT_TRANSPORT");
    unsetenv("PLAIT_COLL_TIMEOUT");
    cr_log_info("%s: rank %d after %.2f s: %s", transport, survivor, got.took, got.err);
    cr_expect_eq(got.result, PLAIT_ERR_REMOTE, "%s: rank %d's receive from the dead rank %d returned %d: %s", transport,
                 survivor, victim, got.result, got.err);
    cr_expect(mr_names_rank(got.err, victim), "%s: the error does not name rank %d: %s", transport, victim, got.err);
    cr_expect_lt(got.took, 5.0, "%s: the error came after %.2f s", transport, got.took);
    char left[1024] = "";
    const int nleft = mr_shm_new_entries(&before, left, sizeof(left));
    mr_shm_set_free(&before);
    cr_expect_eq(nleft, 0, "%s: left in /dev/shm: %s", transport, left);
}

Test(connect, peer_dead_before_first_use_shm, .timeout = 120)
{
    dead_case("auto", 2, 0);
    dead_case("auto", 0, 2);
}

Test(connect, peer_dead_before_first_use_socket, .timeout = 120)
{
    dead_case("socket", 2, 0); /* the survivor dials the dead rank */
    dead_case("socket", 0, 2); /* the dead rank would have dialed the survivor */
}

/* A small send that the peer receives only after a collective it runs
 * first: the send completes on its own (it fits the FIFO) once the
 * connection is made, so the peer's side of a first use must come while the
 * peer runs something else (its socket handshakes move in every executor
 * pass, not only when it asks for that connection). */
static int eager_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    /* rank 0 sends to the last rank and the last rank to rank 1: a lower
     * and a higher rank's first use */
    int32_t v = 1000 + rank, got = -1;
    float x = 1.0f, sum = 0;
    const int to = rank == 0 ? n - 1 : rank == n - 1 ? 1 : -1;
    const int from = rank == n - 1 ? 0 : rank == 1 ? n - 1 : -1;
    if (to >= 0 && plait_send(&v, 1, PLAIT_INT32, to, comm, NULL))
        FAIL("rank %d: the send: %s", rank, plait_get_last_error(comm));
    if (plait_allreduce(&x, &sum, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL))
        FAIL("rank %d: the allreduce: %s", rank, plait_get_last_error(comm));
    if (sum != (float)n)
        FAIL("rank %d: the allreduce gave %g", rank, (double)sum);
    if (from >= 0) {
        if (plait_recv(&got, 1, PLAIT_INT32, from, comm, NULL))
            FAIL("rank %d: the receive: %s", rank, plait_get_last_error(comm));
        if (got != 1000 + from)
            FAIL("rank %d: received %d", rank, got);
    }
    return 0;
}

Test(connect, eager_send_before_a_collective, .timeout = 120)
{
    run(MR_THREADS, 4, eager_rank, NULL);
    run(MR_SHM, 4, eager_rank, NULL);
    run(MR_SOCKET, 4, eager_rank, NULL);
}

/* A rank's connection with itself and a send nobody takes leave nothing
 * behind between threads (the registry of objects waiting for their second
 * end is empty once the communicators are gone). */
static int self_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    int32_t v = rank, got = -1;
    plait_group_start();
    plait_send(&v, 1, PLAIT_INT32, rank, comm, NULL);
    plait_recv(&got, 1, PLAIT_INT32, rank, comm, NULL);
    if (plait_group_end() || got != rank)
        FAIL("rank %d: send to itself: %s", rank, plait_get_last_error(comm));
    /* rank 0 sends to the last rank, which never receives it */
    if (rank == 0 && n > 1 && plait_send(&v, 1, PLAIT_INT32, n - 1, comm, NULL))
        FAIL("rank 0: the send nobody receives: %s", plait_get_last_error(comm));
    return 0;
}

Test(connect, nothing_left_between_threads, .timeout = 60)
{
    for (int i = 0; i < 3; i++)
        run(MR_THREADS, 3, self_rank, NULL);
    cr_expect_eq(plait_inproc_objects_listed(), 0, "%d connection objects are left in the registry",
                 plait_inproc_objects_listed());
}
