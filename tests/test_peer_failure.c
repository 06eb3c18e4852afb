/* Peer failures and who gets the blame: a peer that dies *between* two
 * collectives is noticed by the next one on every path (the small-message path,
 * the barrier, the FIFOs), within a bound and naming the dead rank; over
 * sockets every survivor names the rank that was killed, not the neighbour
 * whose connection closed; a stalled (SIGSTOPped) peer is named by the
 * collective timeout; a forged frame on a socket connection is named as
 * malformed, not as a death. Public API and the harness (and, to forge a
 * frame, the socket connection's descriptor). */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/comm.h"
#include "tests/harness.h"
#include "transports/net.h"
#include "transports/net/socket_wire.h"

#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        snprintf(c->msg, c->msglen, __VA_ARGS__);                                                                  \
        return 1;                                                                                                  \
    } while (0)

#define MAX_RANKS 4

static void set_deadlines(void)
{
    setenv("PLAIT_TIMEOUT", "20", 1);
}

TestSuite(peer_failure, .init = set_deadlines);

enum coll { C_ALLREDUCE, C_BARRIER, C_ALLGATHER, C_BROADCAST };

static const char *coll_name(enum coll k)
{
    static const char *const names[] = {"allreduce", "barrier", "allgather", "broadcast"};
    return names[k];
}

/* One 8-byte (per rank) call of collective k; a broadcast's root is `root`. */
static plait_result_t call(enum coll k, plait_comm_t comm, int root, double *buf)
{
    switch (k) {
    case C_ALLREDUCE:
        return plait_allreduce(buf, buf + 1, 1, PLAIT_FLOAT64, PLAIT_SUM, comm, NULL);
    case C_BARRIER:
        return plait_barrier(comm, NULL);
    case C_ALLGATHER:
        return plait_allgather(buf, buf + 1, 1, PLAIT_FLOAT64, comm, NULL);
    case C_BROADCAST:
        return plait_broadcast(buf, buf + 1, 1, PLAIT_FLOAT64, root, comm, NULL);
    }
    return PLAIT_ERR_INTERNAL;
}

struct report {
    int done;      /* 1 once the rank has returned from the call under test */
    int result;    /* its plait_result_t */
    double took;   /* seconds the call took */
    char text[800];
};

struct board {
    int first_done[MAX_RANKS]; /* the rank finished the first call */
    int go;                    /* the parent: the victim is dead (or stopped), make the second call */
    struct report rep[MAX_RANKS];
};

struct between_arg {
    enum coll coll;
    int victim;
    int socket;       /* PLAIT_TRANSPORT=socket */
    const char *topo_file; /* PLAIT_TOPO_FILE, or NULL */
    const char *coll_timeout;
    size_t count;     /* doubles per rank of the second call when coll is allreduce (0: 1) */
};

static int wait_flag(const int *flag, double seconds)
{
    const double give_up = mr_now() + seconds;
    while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
        if (mr_now() > give_up)
            return -1;
        mr_sleep_ms(2);
    }
    return 0;
}

static int between_child(struct mr_child *c, void *arg)
{
    const struct between_arg *a = arg;
    struct board *b = c->shared;
    struct report *rep = &b->rep[c->rank];
    if (a->socket)
        setenv("PLAIT_TRANSPORT", "socket", 1);
    if (a->topo_file)
        setenv("PLAIT_TOPO_FILE", a->topo_file, 1);
    setenv("PLAIT_COLL_TIMEOUT", a->coll_timeout, 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    const size_t count = a->count ? a->count : 1;
    double *buf = calloc(2 * count * MAX_RANKS, sizeof(double));
    if (!buf)
        FAIL("out of memory");
    r = call(a->coll, comm, a->victim, buf);
    if (r)
        FAIL("the first %s failed: %s: %s", coll_name(a->coll), plait_get_error_string(r),
             plait_get_last_error(comm));
    __atomic_store_n(&b->first_done[c->rank], 1, __ATOMIC_RELEASE);
    if (c->rank == a->victim) {
        /* Killed (or stopped) by the parent here; never past this wait. */
        mr_sleep_ms(60000);
        return 0;
    }
    if (wait_flag(&b->go, 30))
        FAIL("no go from the parent within 30 s");
    const double t0 = mr_now();
    if (a->coll == C_ALLREDUCE && a->count > 1)
        r = plait_allreduce(buf, buf + count * MAX_RANKS, count, PLAIT_FLOAT64, PLAIT_SUM, comm, NULL);
    else
        r = call(a->coll, comm, a->victim, buf);
    rep->took = mr_now() - t0;
    rep->result = (int)r;
    snprintf(rep->text, sizeof(rep->text), "%s", r ? plait_get_last_error(comm) : "");
    __atomic_store_n(&rep->done, 1, __ATOMIC_RELEASE);
    /* Survivors go at once, as applications do on an error: a rank that exits
     * after seeing a death must not be taken for the culprit by the others. */
    free(buf);
    plait_comm_destroy(comm);
    return 0;
}

/* Runs the first call on every rank, then takes the victim out (sig: SIGKILL,
 * or SIGSTOP for a stall) and lets the others make the second call. Copies the
 * reports into rep_out. */
static void run_between(int n, const struct between_arg *a, int sig, struct report *rep_out)
{
    char msg[1024];
    struct mr_procs *p = mr_procs_start(n, between_child, (void *)a, sizeof(struct board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    struct board *b = mr_procs_shared(p);
    int ok = 1;
    for (int r = 0; r < n && ok; r++)
        ok = wait_flag(&b->first_done[r], 30) == 0;
    if (!ok) {
        int failed = mr_procs_join(p, 5, msg, sizeof(msg));
        mr_procs_free(p);
        cr_assert_fail("the first %s did not complete on every rank within 30 s (%d failed: %s)",
                       coll_name(a->coll), failed, msg);
    }
    mr_procs_kill(p, a->victim, sig);
    if (sig == SIGKILL) {
        /* Dead before the survivors start: the death is between the calls. */
        siginfo_t si;
        const double give_up = mr_now() + 10;
        while (mr_now() < give_up) {
            memset(&si, 0, sizeof(si));
            if (waitid(P_PID, mr_procs_pid(p, a->victim), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid)
                break;
            mr_sleep_ms(2);
        }
    } else {
        mr_sleep_ms(50);
    }
    __atomic_store_n(&b->go, 1, __ATOMIC_RELEASE);
    for (int r = 0; r < n; r++)
        if (r != a->victim)
            wait_flag(&b->rep[r].done, 40);
    if (sig != SIGKILL)
        mr_procs_kill(p, a->victim, SIGKILL); /* a stopped process takes SIGKILL */
    int failed = mr_procs_join(p, 20, msg, sizeof(msg));
    memcpy(rep_out, b->rep, sizeof(b->rep));
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
}

/* A host of 8 cores, whatever this one has: broadcast takes the small-message
 * path only when every rank can have a core (fastpath.c), and CI has 2. */
static void write_8_core_topology(char *path, size_t len)
{
    snprintf(path, len, "/tmp/plait_test_peer_failure_%d.xml", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "<?xml version=\"1.0\"?>\n<plait_topology version=\"1\" host=\"eight-cores\">\n"
               "  <cpu name=\"cpu0\" package=\"0\" cores=\"8\" cpuset=\"0\" arch=\"x86_64\"/>\n"
               "</plait_topology>\n");
    fclose(f);
}

/* The dead-peer case: every survivor fails well before the collective timeout
 * (10 s here; the issue asks for 1 s, asserted with a loaded machine's margin)
 * with PLAIT_ERR_REMOTE naming the victim. A broadcast's root is the victim
 * (a live root may rightly finish a broadcast into a dead rank's FIFO), on the
 * small-message path (an 8-core topology). */
static void dead_between(enum coll k, int n, int socket)
{
    const int victim = 1;
    char topo[128] = "";
    if (k == C_BROADCAST)
        write_8_core_topology(topo, sizeof(topo));
    struct between_arg a = {
        .coll = k, .victim = victim, .socket = socket, .topo_file = topo[0] ? topo : NULL, .coll_timeout = "10"};
    struct report rep[MAX_RANKS];
    run_between(n, &a, SIGKILL, rep);
    if (topo[0])
        unlink(topo);
    for (int r = 0; r < n; r++) {
        if (r == victim)
            continue;
        cr_log_info("dead between calls (%s, %d ranks, %s): rank %d returned %s after %.3f s: %s", coll_name(k), n,
                    socket ? "socket" : "shm", r, plait_get_error_string((plait_result_t)rep[r].result), rep[r].took,
                    rep[r].text);
        if (!rep[r].done) {
            cr_expect_fail("rank %d never returned from its second %s", r, coll_name(k));
            continue;
        }
        cr_expect_eq(rep[r].result, PLAIT_ERR_REMOTE, "rank %d's second %s returned %s, expected PLAIT_ERR_REMOTE: %s",
                     r, coll_name(k), plait_get_error_string((plait_result_t)rep[r].result), rep[r].text);
        cr_expect_lt(rep[r].took, 3.0, "rank %d's second %s returned after %.2f s (limit 3 s; the timeout is 10 s)", r,
                     coll_name(k), rep[r].took);
        cr_expect(mr_names_rank(rep[r].text, victim), "rank %d's error does not name the dead rank %d: \"%s\"", r,
                  victim, rep[r].text);
        cr_expect(strstr(rep[r].text, coll_name(k)) != NULL, "rank %d's error does not name the %s: \"%s\"", r,
                  coll_name(k), rep[r].text);
    }
}

Test(peer_failure, dead_between_allreduce_2_shm, .timeout = 90)
{
    dead_between(C_ALLREDUCE, 2, 0);
}

Test(peer_failure, dead_between_allreduce_3_shm, .timeout = 90)
{
    dead_between(C_ALLREDUCE, 3, 0);
}

Test(peer_failure, dead_between_barrier_2_shm, .timeout = 90)
{
    dead_between(C_BARRIER, 2, 0);
}

Test(peer_failure, dead_between_barrier_3_shm, .timeout = 90)
{
    dead_between(C_BARRIER, 3, 0);
}

Test(peer_failure, dead_between_allgather_2_shm, .timeout = 90)
{
    dead_between(C_ALLGATHER, 2, 0);
}

Test(peer_failure, dead_between_allgather_3_shm, .timeout = 90)
{
    dead_between(C_ALLGATHER, 3, 0);
}

Test(peer_failure, dead_between_broadcast_2_shm, .timeout = 90)
{
    dead_between(C_BROADCAST, 2, 0);
}

Test(peer_failure, dead_between_broadcast_3_shm, .timeout = 90)
{
    dead_between(C_BROADCAST, 3, 0);
}

/* Over sockets at 4 ranks, rank 1 dead: ranks 0 and 2 see its connections
 * close, rank 3 sees only theirs close (or hears nothing): it must still name
 * rank 1. */
Test(peer_failure, dead_between_allreduce_4_socket, .timeout = 90)
{
    dead_between(C_ALLREDUCE, 4, 1);
}

Test(peer_failure, dead_between_barrier_4_socket, .timeout = 90)
{
    dead_between(C_BARRIER, 4, 1);
}

/* ---------------------------------------------------------------- killed in the middle, over sockets */

#define KILL_NRANKS 4
#define KILL_VICTIM 2
#define KILL_FLOATS ((size_t)4 << 20) /* 16 MiB of floats per rank */

struct kill_board {
    double t_kill;
    struct report rep[KILL_NRANKS];
};

static int kill_child(struct mr_child *c, void *arg)
{
    (void)arg;
    struct kill_board *b = c->shared;
    struct report *rep = &b->rep[c->rank];
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_COLL_TIMEOUT", "30", 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    float *buf = calloc(KILL_FLOATS, sizeof(float));
    if (!buf)
        FAIL("out of memory");
    mr_child_ready(c);
    const double give_up = mr_now() + 40;
    do
        r = plait_allreduce(buf, buf, KILL_FLOATS, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    while (r == PLAIT_SUCCESS && mr_now() < give_up);
    rep->took = mr_now();
    rep->result = (int)r;
    snprintf(rep->text, sizeof(rep->text), "%s", r ? plait_get_last_error(comm) : "");
    __atomic_store_n(&rep->done, 1, __ATOMIC_RELEASE);
    free(buf);
    plait_comm_destroy(comm); /* at once: its peers must not blame this rank */
    return 0;
}

/* Every survivor, neighbour of the victim or not, names the victim. */
Test(peer_failure, killed_mid_allreduce_socket_every_survivor_names_it, .timeout = 90)
{
    char msg[1024];
    struct mr_procs *p = mr_procs_start(KILL_NRANKS, kill_child, NULL, sizeof(struct kill_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    struct kill_board *shared = mr_procs_shared(p);
    if (mr_procs_wait_ready(p, KILL_NRANKS, 30) != 0) {
        int failed = mr_procs_join(p, 5, msg, sizeof(msg));
        mr_procs_free(p);
        cr_assert_fail("the ranks did not all start within 30 s (%d failed: %s)", failed, msg);
    }
    mr_sleep_ms(300);
    shared->t_kill = mr_now();
    mr_procs_kill(p, KILL_VICTIM, SIGKILL);
    int failed = mr_procs_join(p, 40, msg, sizeof(msg));
    struct kill_board b = *shared;
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    for (int r = 0; r < KILL_NRANKS; r++) {
        if (r == KILL_VICTIM)
            continue;
        const struct report *rep = &b.rep[r];
        cr_log_info("socket kill: rank %d returned %s %.3f s after the kill: %s", r,
                    plait_get_error_string((plait_result_t)rep->result), rep->took - b.t_kill, rep->text);
        if (!rep->done) {
            cr_expect_fail("rank %d never returned from its allreduce", r);
            continue;
        }
        cr_expect_eq(rep->result, PLAIT_ERR_REMOTE, "rank %d returned %s: %s", r,
                     plait_get_error_string((plait_result_t)rep->result), rep->text);
        cr_expect_lt(rep->took - b.t_kill, 10.0, "rank %d returned %.2f s after the kill", r, rep->took - b.t_kill);
        cr_expect(mr_names_rank(rep->text, KILL_VICTIM), "rank %d's error does not name the killed rank %d: \"%s\"", r,
                  KILL_VICTIM, rep->text);
        for (int o = 0; o < KILL_NRANKS; o++)
            if (o != KILL_VICTIM && o != r)
                cr_expect(!mr_names_rank(rep->text, o) || strstr(rep->text, "found") != NULL,
                          "rank %d's error blames the survivor rank %d: \"%s\"", r, o, rep->text);
    }
}

/* ---------------------------------------------------------------- a stalled peer */

/* The victim is stopped, not dead: the collective timeout (2 s) ends the call,
 * and its message names the peer(s) this rank was waiting for. */
static void stalled(int n, int victim, size_t count, const int *expect_named)
{
    struct between_arg a = {.coll = C_ALLREDUCE, .victim = victim, .socket = 0, .coll_timeout = "2", .count = count};
    struct report rep[MAX_RANKS];
    run_between(n, &a, SIGSTOP, rep);
    for (int r = 0; r < n; r++) {
        if (r == victim)
            continue;
        cr_log_info("stalled rank %d (%d ranks, %zu doubles): rank %d returned %s after %.3f s: %s", victim, n,
                    count ? count : 1, r, plait_get_error_string((plait_result_t)rep[r].result), rep[r].took,
                    rep[r].text);
        if (!rep[r].done) {
            cr_expect_fail("rank %d never returned", r);
            continue;
        }
        cr_expect_eq(rep[r].result, PLAIT_ERR_TIMEOUT, "rank %d returned %s, expected PLAIT_ERR_TIMEOUT: %s", r,
                     plait_get_error_string((plait_result_t)rep[r].result), rep[r].text);
        cr_expect(strstr(rep[r].text, "PLAIT_COLL_TIMEOUT") != NULL, "rank %d: no PLAIT_COLL_TIMEOUT in \"%s\"", r,
                  rep[r].text);
        const int who = expect_named[r];
        cr_expect(strstr(rep[r].text, "waiting for") != NULL && mr_names_rank(rep[r].text, who),
                  "rank %d's timeout does not say it was waiting for rank %d: \"%s\"", r, who, rep[r].text);
    }
}

/* The small-message path: every survivor waits for the stalled rank's box. */
Test(peer_failure, stalled_peer_named_small_3, .timeout = 90)
{
    static const int named[] = {2, 2, -1};
    stalled(3, 2, 0, named);
}

/* The FIFO path (1 MiB): the step's peer. */
Test(peer_failure, stalled_peer_named_fifo_2, .timeout = 90)
{
    static const int named[] = {1, -1};
    stalled(2, 1, (size_t)1 << 17, named);
}

/* ------------------------------------------------------------------ malformed frames */

/* Bytes on a net connection that are no message of the Socket provider's
 * (here forged by the peer itself on its own connection's control socket,
 * after one good allreduce): the rank that reads them fails at once, naming
 * the peer and what was wrong with the message — not "rank 1 is gone" after
 * PLAIT_BLAME_GRACE_S, since the peer is alive. */
struct forge_board {
    int first_done[2];
    int forged;
    int done;
    int result;
    double took;
    char text[800];
};

/* The forged message header: its magic (0: the right one) and size. */
struct forge_spec {
    uint32_t magic;
    uint64_t size;
};

static int forge_child(struct mr_child *c, void *arg)
{
    const struct forge_spec *spec = arg;
    struct forge_board *b = c->shared;
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_COLL_TIMEOUT", "10", 1);
    /* one data socket: the header's inline flag is the one due for its size */
    setenv("PLAIT_SOCKET_NTHREADS", "1", 1);
    setenv("PLAIT_NSOCKS_PERTHREAD", "1", 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    enum { COUNT = 1024 };
    double *buf = calloc(2 * COUNT, sizeof(double));
    if (!buf)
        FAIL("out of memory");
    if ((r = plait_allreduce(buf, buf + COUNT, COUNT, PLAIT_FLOAT64, PLAIT_SUM, comm, NULL)))
        FAIL("the first allreduce failed: %s", plait_get_last_error(comm));
    __atomic_store_n(&b->first_done[c->rank], 1, __ATOMIC_RELEASE);
    if (c->rank == 1) {
        if (wait_flag(&b->first_done[0], 30))
            FAIL("rank 0 did not finish the first allreduce within 30 s");
        /* A header on every one of our connections to rank 0, numbered as
         * the next message of its send comm (the hello was message 0, then
         * one per slot). */
        int forged = 0;
        for (int cls = 0; cls < comm->ncls; cls++) {
            const struct plait_conn *conn = comm->conns[0 * comm->ncls + cls];
            const int fd = plait_net_conn_fd(conn, 1);
            if (fd < 0)
                continue;
            uint8_t hdr[SOCK_MSG_BYTES];
            sock_msg_encode(hdr, (uint32_t)(1 + conn->tx_posted), spec->size, 0,
                            sock_msg_is_inline(spec->size, 1) ? SOCK_MSG_INLINE : 0);
            if (spec->magic)
                sock_put_u32(hdr, spec->magic);
            if (send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL) == (ssize_t)sizeof(hdr))
                forged++;
        }
        if (!forged)
            FAIL("rank 1 found no net connection to rank 0 to write on");
        __atomic_store_n(&b->forged, 1, __ATOMIC_RELEASE);
        wait_flag(&b->done, 40); /* alive while rank 0 reads the bytes */
        free(buf);
        plait_comm_abort(comm);
        return 0;
    }
    if (wait_flag(&b->forged, 30))
        FAIL("rank 1 did not forge its frame within 30 s");
    const double t0 = mr_now();
    r = plait_allreduce(buf, buf + COUNT, COUNT, PLAIT_FLOAT64, PLAIT_SUM, comm, NULL);
    b->took = mr_now() - t0;
    b->result = (int)r;
    snprintf(b->text, sizeof(b->text), "%s", r ? plait_get_last_error(comm) : "");
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    free(buf);
    plait_comm_abort(comm);
    return 0;
}

static void malformed_frame(uint32_t magic, uint64_t length, const char *expect)
{
    struct forge_spec spec = {magic, length};
    char msg[1024];
    struct mr_procs *p = mr_procs_start(2, forge_child, &spec, sizeof(struct forge_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    struct forge_board *b = mr_procs_shared(p);
    wait_flag(&b->done, 60);
    int failed = mr_procs_join(p, 20, msg, sizeof(msg));
    struct forge_board rep = *b;
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    cr_assert(rep.done, "rank 0 never returned from the allreduce after the forged frame");
    cr_log_info("forged header {0x%08x, %llu}: rank 0 returned %s after %.3f s: %s", magic, (unsigned long long)length,
                plait_get_error_string((plait_result_t)rep.result), rep.took, rep.text);
    cr_expect_eq(rep.result, PLAIT_ERR_REMOTE, "rank 0 returned %s, expected PLAIT_ERR_REMOTE: %s",
                 plait_get_error_string((plait_result_t)rep.result), rep.text);
    cr_expect(mr_names_rank(rep.text, 1) && strstr(rep.text, "malformed message") && strstr(rep.text, expect),
              "rank 0's error does not name rank 1's malformed message (\"%s\"): \"%s\"", expect, rep.text);
    cr_expect(strstr(rep.text, "gone") == NULL, "rank 0's error calls the live rank 1 gone: \"%s\"", rep.text);
    cr_expect(strstr(rep.text, "allreduce") != NULL, "rank 0's error does not name the allreduce: \"%s\"", rep.text);
    cr_expect_lt(rep.took, 3.0, "rank 0's allreduce returned after %.2f s (limit 3 s)", rep.took);
}

Test(peer_failure, malformed_frame_bad_magic_socket, .timeout = 90)
{
    malformed_frame(0xdeadbeefu, 16, "bad magic 0xdeadbeef");
}

Test(peer_failure, malformed_frame_oversized_socket, .timeout = 90)
{
    malformed_frame(0, 0x7fffffffu, "is 2147483647 bytes, more than the");
}
