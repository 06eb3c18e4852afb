/* The net transport (transports/net.c) through the public API: with
 * PLAIT_NET_PROVIDER=socket and PLAIT_TRANSPORT=socket every pair of ranks of
 * one host uses it over the Socket provider (on loopback here). Collectives
 * at 2, 3 and 5 ranks, point-to-point, an eager send before a collective, a
 * killed peer; each rank checks (core/comm.h) that its connections are the
 * net transport's. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"
#include "tests/coll_check.h"
#include "tests/harness.h"
#include "transports/net.h"

#define FAIL(...)                                                                                                    \
    do {                                                                                                             \
        snprintf(msg, len, __VA_ARGS__);                                                                             \
        return 1;                                                                                                    \
    } while (0)

static void net_env(void)
{
    setenv("PLAIT_NET_PROVIDER", "socket", 1);
    setenv("PLAIT_SOCKET_IFNAME", "lo", 1);
}

static void net_env_clear(void)
{
    unsetenv("PLAIT_NET_PROVIDER");
    unsetenv("PLAIT_SOCKET_IFNAME");
    unsetenv("PLAIT_TRANSPORT");
    unsetenv("PLAIT_COLL_TIMEOUT");
}

TestSuite(net_transport, .init = net_env, .fini = net_env_clear);

/* Every connection made with another rank is the net transport's; returns
 * how many there are, -1 (and msg) for one that is not. */
static int net_conns(plait_comm_t comm, int rank, char *msg, size_t len)
{
    int count = 0;
    for (int i = 0; i < comm->nranks * comm->ncls; i++) {
        const struct plait_conn *c = __atomic_load_n(&comm->conns[i], __ATOMIC_ACQUIRE);
        if (!c || c->peer == rank)
            continue;
        if (c->tp != &plait_transport_net) {
            snprintf(msg, len, "rank %d: the connection with rank %d on class %d is the %s transport's, not net's",
                     rank, c->peer, c->cls, c->tp->name);
            return -1;
        }
        count++;
    }
    return count;
}

static void run(int n, mr_fn fn, void *arg)
{
    char msg[4096] = "";
    const int failed = mr_run(MR_SOCKET, n, fn, arg, 150, msg, sizeof(msg));
    cr_assert_eq(failed, 0, "%d ranks: %d failed: %s", n, failed, msg);
}

/* ---------------------------------------------------------------- collectives */

enum tc { TC_ALLREDUCE, TC_REDUCE, TC_REDUCESCATTER, TC_BROADCAST, TC_ALLGATHER, TC_ALLTOALL, TC_GATHER, TC_SCATTER,
          TC_COUNT };
static const char *const tc_names[TC_COUNT] = {"allreduce", "reduce",    "reducescatter", "broadcast",
                                               "allgather", "alltoall",  "gather",        "scatter"};

#define CHECK(call)                                                                                                  \
    do {                                                                                                             \
        plait_result_t r_ = (call);                                                                                  \
        if (r_ != PLAIT_SUCCESS) {                                                                                   \
            snprintf(msg, len, "rank %d: %s %s count %zu inplace %d: %s: %s", rank, tc_names[coll],                  \
                     cc_type_name(dtype), count, inplace, plait_get_error_string(r_), plait_get_last_error(comm));   \
            return 1;                                                                                                \
        }                                                                                                            \
    } while (0)

/* One combination: the number of wrong elements, or 1 on an error. */
static size_t run_one(plait_comm_t comm, int rank, int n, int coll, int dtype, int op, int inplace, size_t count,
                      int root, char *sbuf, char *rbuf, char *msg, size_t len)
{
    const size_t bytes = count * cc_size(dtype);
    size_t bad = 0;
    struct cc_expect e;
    if (coll <= TC_REDUCESCATTER)
        cc_expect_init(&e, dtype, op, n);
    memset(rbuf, 0xcd, bytes * (size_t)n);
    switch (coll) {
    case TC_ALLREDUCE:
    case TC_REDUCE: {
        cc_fill(sbuf, count, dtype, op, rank, 0);
        char *out = inplace ? sbuf : rbuf;
        if (coll == TC_ALLREDUCE)
            CHECK(plait_allreduce(sbuf, out, count, dtype, (plait_redop_t)op, comm, NULL));
        else
            CHECK(plait_reduce(sbuf, out, count, dtype, (plait_redop_t)op, root, comm, NULL));
        if (coll == TC_ALLREDUCE || rank == root)
            bad = cc_check(&e, out, count, 0, msg, len);
        break;
    }
    case TC_REDUCESCATTER: {
        cc_fill(sbuf, count * (size_t)n, dtype, op, rank, 0);
        char *out = inplace ? sbuf + (size_t)rank * bytes : rbuf;
        CHECK(plait_reducescatter(sbuf, out, count, dtype, (plait_redop_t)op, comm, NULL));
        bad = cc_check(&e, out, count, (size_t)rank * count, msg, len);
        break;
    }
    case TC_BROADCAST: {
        char *in = inplace ? rbuf : sbuf;
        if (rank == root)
            cc_fill_bytes(in, bytes, root, 0);
        CHECK(plait_broadcast(in, rbuf, count, dtype, root, comm, NULL));
        bad = cc_check_bytes(rbuf, bytes, root, 0, msg, len);
        break;
    }
    case TC_ALLGATHER: {
        char *in = inplace ? rbuf + (size_t)rank * bytes : sbuf;
        cc_fill_bytes(in, bytes, rank, 0);
        CHECK(plait_allgather(in, rbuf, count, dtype, comm, NULL));
        for (int q = 0; q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, msg, len);
        break;
    }
    case TC_ALLTOALL:
        cc_fill_bytes(sbuf, bytes * (size_t)n, rank, 0);
        CHECK(plait_alltoall(sbuf, rbuf, count, dtype, comm, NULL));
        for (int q = 0; q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, (size_t)rank * bytes, msg, len);
        break;
    case TC_GATHER:
        cc_fill_bytes(sbuf, bytes, rank, 0);
        CHECK(plait_gather(sbuf, rbuf, count, dtype, root, comm, NULL));
        if (rank == root)
            for (int q = 0; q < n; q++)
                bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, msg, len);
        break;
    case TC_SCATTER:
        if (rank == root)
            cc_fill_bytes(sbuf, bytes * (size_t)n, root, 0);
        CHECK(plait_scatter(sbuf, rbuf, count, dtype, root, comm, NULL));
        bad = cc_check_bytes(rbuf, bytes, root, (size_t)rank * bytes, msg, len);
        break;
    }
    if (bad && !strstr(msg, "count"))
        snprintf(msg + strlen(msg), len - strlen(msg), " [rank %d: %s %s count %zu inplace %d root %d]", rank,
                 tc_names[coll], cc_type_name(dtype), count, inplace, root);
    return bad;
}

struct combo {
    int dtype, op;
};

static int colls_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    if (net_conns(comm, rank, msg, len) < 1) {
        if (!msg[0])
            snprintf(msg, len, "rank %d: no net connection after init", rank);
        return 1;
    }
    /* 0, 1, odd, and past 1 MiB (one type: the slots and pipeline steps are in bytes) */
    const size_t counts[] = {0, 1, 1001, ((size_t)1 << 20) / 4 + 3};
    const struct combo combos[] = {{PLAIT_FLOAT32, PLAIT_SUM}, {PLAIT_INT32, PLAIT_MAX}, {PLAIT_FLOAT64, PLAIT_PROD},
                                   {PLAIT_INT8, PLAIT_MIN}};
    const size_t maxbytes = counts[3] * 8 * (size_t)n;
    char *sbuf = malloc(maxbytes), *rbuf = malloc(maxbytes);
    if (!sbuf || !rbuf) {
        free(sbuf);
        free(rbuf);
        FAIL("rank %d: out of memory", rank);
    }
    int bad = 0;
    for (int coll = 0; coll < TC_COUNT && !bad; coll++)
        for (int k = 0; k < 4 && !bad; k++)
            for (int ci = 0; ci < 4 && !bad; ci++) {
                /* the large count with one combination only */
                if (ci == 3 && k != 0)
                    continue;
                const int root = (coll + ci) % n;
                for (int inplace = 0; inplace < 2 && !bad; inplace++) {
                    if (inplace && coll >= TC_ALLTOALL)
                        continue;
                    bad = run_one(comm, rank, n, coll, combos[k].dtype, combos[k].op, inplace, counts[ci], root, sbuf,
                                  rbuf, msg, len) != 0;
                }
            }
    free(sbuf);
    free(rbuf);
    if (!bad && net_conns(comm, rank, msg, len) < 0)
        bad = 1;
    return bad;
}

Test(net_transport, collectives_2_ranks, .timeout = 150)
{
    run(2, colls_rank, NULL);
}

Test(net_transport, collectives_3_ranks, .timeout = 150)
{
    run(3, colls_rank, NULL);
}

Test(net_transport, collectives_5_ranks, .timeout = 150)
{
    run(5, colls_rank, NULL);
}

/* ---------------------------------------------------------------- point-to-point */

static int p2p_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    const size_t count = 70000; /* 280 KB: many slots */
    int32_t *out = malloc(count * sizeof(int32_t) * (size_t)n), *in = malloc(count * sizeof(int32_t) * (size_t)n);
    if (!out || !in) {
        free(out);
        free(in);
        FAIL("rank %d: out of memory", rank);
    }
    int bad = 0;
    /* a ring: send to the next, receive from the previous */
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (size_t i = 0; i < count; i++)
        out[i] = (int32_t)(rank * 1000003 + (int)i);
    plait_group_start();
    plait_send(out, count, PLAIT_INT32, next, comm, NULL);
    plait_recv(in, count, PLAIT_INT32, prev, comm, NULL);
    if (plait_group_end()) {
        snprintf(msg, len, "rank %d: the ring: %s", rank, plait_get_last_error(comm));
        bad = 1;
    }
    for (size_t i = 0; i < count && !bad; i++)
        if (in[i] != (int32_t)(prev * 1000003 + (int)i)) {
            snprintf(msg, len, "rank %d: the ring: element %zu is %d", rank, i, in[i]);
            bad = 1;
        }
    /* every pair at once, in one group */
    for (int q = 0; q < n && !bad; q++)
        for (size_t i = 0; i < count; i++)
            out[(size_t)q * count + i] = (int32_t)((rank * 31 + q) * 7919 + (int)i);
    if (!bad) {
        plait_group_start();
        for (int q = 0; q < n; q++) {
            plait_send(out + (size_t)q * count, count, PLAIT_INT32, q, comm, NULL);
            plait_recv(in + (size_t)q * count, count, PLAIT_INT32, q, comm, NULL);
        }
        if (plait_group_end()) {
            snprintf(msg, len, "rank %d: all pairs: %s", rank, plait_get_last_error(comm));
            bad = 1;
        }
    }
    for (int q = 0; q < n && !bad; q++)
        for (size_t i = 0; i < count && !bad; i++)
            if (in[(size_t)q * count + i] != (int32_t)((q * 31 + rank) * 7919 + (int)i)) {
                snprintf(msg, len, "rank %d: all pairs: from rank %d element %zu is %d", rank, q, i,
                         in[(size_t)q * count + i]);
                bad = 1;
            }
    free(out);
    free(in);
    if (!bad && net_conns(comm, rank, msg, len) < n - 1 && !msg[0]) {
        snprintf(msg, len, "rank %d: fewer than %d net connections after all pairs", rank, n - 1);
        bad = 1;
    }
    return bad || msg[0];
}

Test(net_transport, p2p_ring_and_all_pairs, .timeout = 150)
{
    run(4, p2p_rank, NULL);
}

/* A small send its peer receives only after a collective it runs first: the
 * peer's side of the connection (its dial back) comes while it runs the
 * collective. Rank 0 sends to the last rank (a lower rank first) and the last
 * rank to rank 1 (a higher rank first). */
static int eager_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
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
    return net_conns(comm, rank, msg, len) < 0;
}

Test(net_transport, eager_send_before_a_collective, .timeout = 150)
{
    run(4, eager_rank, NULL);
}

/* ---------------------------------------------------------------- a killed peer */

struct dead_board {
    int result;
    double took;
    char err[1024];
    int conns_ok;
};

struct dead_roles {
    int victim, survivor; /* the survivor receives from the victim */
    int made;             /* 1: their point-to-point connection is made before the kill */
};

static int dead_child(struct mr_child *c, void *arg)
{
    const struct dead_roles *roles = arg;
    struct dead_board *b = c->shared;
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    if (roles->made && (c->rank == roles->victim || c->rank == roles->survivor)) {
        const int other = c->rank == roles->victim ? roles->survivor : roles->victim;
        int32_t v = c->rank, got = -1;
        plait_group_start();
        plait_send(&v, 1, PLAIT_INT32, other, comm, NULL);
        plait_recv(&got, 1, PLAIT_INT32, other, comm, NULL);
        if (plait_group_end() || got != other) {
            snprintf(c->msg, c->msglen, "rank %d: the exchange before the kill: %s", c->rank,
                     plait_get_last_error(comm));
            return 1;
        }
    }
    char m[256] = "";
    if (c->rank == roles->survivor)
        b->conns_ok = net_conns(comm, c->rank, m, sizeof(m)) > 0;
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

static void dead_case(int victim, int survivor, int made)
{
    struct dead_roles roles = {victim, survivor, made};
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
    char msg[1024];
    struct mr_procs *p = mr_procs_start(3, dead_child, &roles, sizeof(struct dead_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    cr_assert_eq(mr_procs_wait_ready(p, 3, 60), 0, "the ranks did not init");
    mr_procs_kill(p, victim, SIGKILL);
    mr_procs_join(p, 60, msg, sizeof(msg));
    struct dead_board got = *(struct dead_board *)mr_procs_shared(p);
    mr_procs_free(p);
    unsetenv("PLAIT_TRANSPORT");
    unsetenv("PLAIT_COLL_TIMEOUT");
    cr_log_info("victim %d, survivor %d, made %d: after %.2f s: %s", victim, survivor, made, got.took, got.err);
    cr_expect(got.conns_ok, "rank %d's connections are not the net transport's", survivor);
    cr_expect_eq(got.result, PLAIT_ERR_REMOTE, "rank %d's receive from the dead rank %d returned %d: %s", survivor,
                 victim, got.result, got.err);
    cr_expect(mr_names_rank(got.err, victim), "the error does not name rank %d: %s", victim, got.err);
    cr_expect_lt(got.took, 5.0, "the error came after %.2f s", got.took);
}

Test(net_transport, killed_peer_is_named, .timeout = 150)
{
    dead_case(2, 0, 1); /* the connection was made: the survivor's receive sees it close */
    dead_case(0, 2, 1);
    dead_case(2, 0, 0); /* made on first use: the survivor dials the dead rank */
}
