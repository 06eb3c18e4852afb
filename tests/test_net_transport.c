/* The net transport (transports/net.c) through the public API: with
 * PLAIT_TRANSPORT=socket every pair of ranks of one host uses it over the
 * Socket provider (on loopback here; PLAIT_NET_PROVIDER=socket, as a user may
 * say, in most tests, and unset or empty in the default_* ones, where ranks
 * on different hosts (PLAIT_HOSTID) use it without being forced). Collectives
 * at 2, 3 and 5 ranks, point-to-point, an eager send before a collective, a
 * killed peer; each rank checks (core/comm.h) that its connections are the
 * net transport's; an unknown provider is an error naming the variable. */
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

/* Operations of one communicator running at once on three threads (two
 * streams' workers and the calling thread) all move the same connections:
 * one thread at a time per connection, or the provider's comms break. */
#define TS_COUNT 40000
static int threads_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    const size_t pc = TS_COUNT;
    int32_t *s = malloc(sizeof(int32_t) * pc * 2), *got = malloc(sizeof(int32_t) * pc * 2);
    int32_t *all_s = malloc(sizeof(int32_t) * pc * (size_t)n), *all_r = malloc(sizeof(int32_t) * pc * (size_t)n);
    plait_stream_t s1 = NULL, s2 = NULL;
    int bad = !s || !got || !all_s || !all_r || plait_stream_create(&s1) || plait_stream_create(&s2);
    for (int iter = 0; iter < 3 && !bad; iter++) {
        for (size_t i = 0; i < pc * 2; i++)
            s[i] = (int32_t)(rank * 1000000 + (int)i + iter);
        for (size_t i = 0; i < pc * (size_t)n; i++)
            all_s[i] = (int32_t)(rank * 1000000 + (int)i + iter);
        memset(got, 0xff, sizeof(int32_t) * pc * 2);
        plait_group_start();
        plait_send(s, pc, PLAIT_INT32, (rank + 1) % n, comm, s1);
        plait_recv(got, pc, PLAIT_INT32, (rank + n - 1) % n, comm, s1);
        plait_group_end();
        plait_group_start();
        plait_send(s + pc, pc, PLAIT_INT32, (rank + 2) % n, comm, s2);
        plait_recv(got + pc, pc, PLAIT_INT32, (rank + n - 2) % n, comm, s2);
        plait_group_end();
        if (plait_alltoall(all_s, all_r, pc, PLAIT_INT32, comm, NULL) || plait_stream_synchronize(s1) ||
            plait_stream_synchronize(s2)) {
            snprintf(msg, len, "rank %d iteration %d: %s", rank, iter, plait_get_last_error(comm));
            bad = 1;
            break;
        }
        const int p1 = (rank + n - 1) % n, p2 = (rank + n - 2) % n;
        for (size_t i = 0; i < pc && !bad; i++)
            if (got[i] != (int32_t)(p1 * 1000000 + (int)i + iter) ||
                got[pc + i] != (int32_t)(p2 * 1000000 + (int)(pc + i) + iter)) {
                snprintf(msg, len, "rank %d iteration %d: stream element %zu wrong", rank, iter, i);
                bad = 1;
            }
        for (int q = 0; q < n && !bad; q++)
            for (size_t i = 0; i < pc && !bad; i++)
                if (all_r[(size_t)q * pc + i] != (int32_t)(q * 1000000 + (int)((size_t)rank * pc + i) + iter)) {
                    snprintf(msg, len, "rank %d iteration %d: alltoall element %zu from rank %d wrong", rank, iter,
                             i, q);
                    bad = 1;
                }
    }
    if (s1)
        plait_stream_destroy(s1);
    if (s2)
        plait_stream_destroy(s2);
    free(s);
    free(got);
    free(all_s);
    free(all_r);
    if (!bad && net_conns(comm, rank, msg, len) < 0)
        bad = 1;
    if (bad && !msg[0])
        snprintf(msg, len, "rank %d: set-up failed", rank);
    return bad;
}

Test(net_transport, three_threads_one_communicator, .timeout = 150)
{
    run(5, threads_rank, NULL);
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

/* ---------------------------------------------------------------- the in-band hello, white box
 *
 * Two ranks' transport contexts in this process on a fake environment (its
 * allgather between two threads), and a forger holding rank 1's listen
 * handle (a member of the communicator could send anything): each malformed
 * hello is closed and counted, and the message of an accept() that times out
 * names the last one; then the real connection is made and carries a slot,
 * and a second hello for it is refused. */
#include <pthread.h>
#include "base/log.h"
#include "base/util.h"
#include "transports/net/provider.h"

/* The hello's wire layout (transports/net.c, struct net_hello). */
struct wire_hello {
    uint32_t magic, version;
    int32_t rank, cls;
    uint32_t nslots, pad;
    uint64_t slot_bytes;
};
#define WIRE_MAGIC 0x504c4e48u

struct fake_world {
    pthread_barrier_t bar;
    char *gathered;
    size_t size;
    uint8_t handle1[PLAIT_NET_HANDLE_BYTES]; /* rank 1's: the first bytes of its allgathered entry */
    struct plait_tp_rank ranks[2];
    int abort_flag;
    uint8_t secret[32];
};

struct fake_rank {
    struct fake_world *w;
    int rank;
    struct plait_tp_env env;
    void *ctx;
    plait_result_t init_status;
};

static int fake_wanted(const void *core, int a, int b, int cls)
{
    (void)core;
    (void)cls;
    return a != b;
}

static plait_result_t fake_allgather(void *core, void *data, size_t size)
{
    struct fake_rank *r = core;
    struct fake_world *w = r->w;
    pthread_barrier_wait(&w->bar);
    if (r->rank == 0) {
        free(w->gathered);
        w->gathered = calloc(2, size);
        w->size = size;
    }
    pthread_barrier_wait(&w->bar);
    memcpy(w->gathered + (size_t)r->rank * size, (char *)data + (size_t)r->rank * size, size);
    pthread_barrier_wait(&w->bar);
    memcpy(data, w->gathered, 2 * size);
    if (r->rank == 1 && size >= PLAIT_NET_HANDLE_BYTES)
        memcpy(w->handle1, w->gathered + size, PLAIT_NET_HANDLE_BYTES);
    pthread_barrier_wait(&w->bar);
    return PLAIT_SUCCESS;
}

static plait_result_t fake_barrier(void *core)
{
    pthread_barrier_wait(&((struct fake_rank *)core)->w->bar);
    return PLAIT_SUCCESS;
}

static const char *fake_peer_str(const void *core, int peer, char *buf, size_t len)
{
    (void)core;
    snprintf(buf, len, "rank %d (fake)", peer);
    return buf;
}

static void *fake_init_main(void *p)
{
    struct fake_rank *r = p;
    r->init_status = plait_transport_net.init(&r->env, &r->ctx);
    return NULL;
}

static void fake_setup(struct fake_world *w, struct fake_rank r[2])
{
    memset(w, 0, sizeof(*w));
    pthread_barrier_init(&w->bar, NULL, 2);
    for (int i = 0; i < 2; i++) {
        w->ranks[i] = (struct plait_tp_rank){.host = i, .pid = 1000 + i, .process_token = 77 + (uint64_t)i};
        memset(&r[i], 0, sizeof(r[i]));
        r[i].w = w;
        r[i].rank = i;
        struct plait_tp_env *e = &r[i].env;
        e->size = sizeof(*e);
        e->rank = i;
        e->nranks = 2;
        e->ncls = 2;
        e->ranks = w->ranks;
        e->nslots = 4;
        e->slot_bytes = 4096;
        e->timeout_s = 30;
        e->net_provider = "socket";
        e->secret = w->secret;
        e->wanted = fake_wanted;
        e->allgather = fake_allgather;
        e->barrier = fake_barrier;
        e->peer_str = fake_peer_str;
        e->core = &r[i];
    }
    pthread_t t;
    pthread_create(&t, NULL, fake_init_main, &r[1]);
    fake_init_main(&r[0]);
    pthread_join(t, NULL);
}

/* Steps both contexts for `seconds`. */
static void step_both(struct fake_rank r[2], double seconds)
{
    const double end = plait_now() + seconds;
    while (plait_now() < end) {
        for (int i = 0; i < 2; i++) {
            struct plait_conn *failed = NULL;
            (void)plait_transport_net.progress(r[i].ctx, NULL, &failed);
        }
        usleep(200);
    }
}

/* The forger: a send comm to rank 1 carrying `bytes` of `msg` as its first message. */
static int forge(struct fake_world *w, struct fake_rank r[2], void *pctx, const void *msg, size_t bytes,
                 void **comm_out)
{
    uint8_t handle[PLAIT_NET_HANDLE_BYTES];
    memcpy(handle, w->handle1, sizeof(handle));
    void *sc = NULL;
    const double end = plait_now() + 20;
    while (!sc && plait_now() < end) {
        if (plait_net_socket.connect(pctx, 0, handle, &sc))
            return -1;
        step_both(r, 0.001);
    }
    if (!sc)
        return -1;
    void *req = NULL;
    if (plait_net_socket.isend(sc, msg, bytes, 0, NULL, &req) || !req)
        return -1;
    int done = 0;
    while (!done && plait_now() < end) {
        if (plait_net_socket.test(req, &done, NULL))
            return -1;
        step_both(r, 0.001);
    }
    *comm_out = sc;
    return done ? 0 : -1;
}

/* rank 1's accept of (0, cls 1), which rank 0 never dials, at a short deadline: its message. */
static plait_result_t accept_times_out(struct fake_rank r[2], char *err, size_t len)
{
    struct plait_conn *conn = NULL;
    const double deadline = plait_deadline(0.3);
    plait_result_t res;
    while ((res = plait_transport_net.accept(r[1].ctx, 0, 1, NULL, deadline, &conn)) == PLAIT_IN_PROGRESS)
        step_both(r, 0.001);
    snprintf(err, len, "%s", plait_last_error_get());
    return res;
}

Test(net_transport, hello_checked, .timeout = 120)
{
    const int fds0 = mr_count_fds();
    struct fake_world w;
    struct fake_rank r[2];
    fake_setup(&w, r);
    cr_assert_eq(r[0].init_status, PLAIT_SUCCESS, "rank 0 init: %s", plait_last_error_get());
    cr_assert_eq(r[1].init_status, PLAIT_SUCCESS, "rank 1 init");
    cr_assert(r[0].ctx && r[1].ctx);
    /* the pure parts */
    cr_expect_eq(plait_transport_net.can_join(&r[0].env, 0, 1), 15);
    cr_expect_eq(plait_transport_net.can_join(&r[0].env, 1, 1), 0);
    struct plait_tp_info info;
    plait_transport_net.query(&r[0].env, 0, 1, &info);
    cr_expect_eq(info.link, PLAIT_LC_NET);
    cr_expect_eq(info.host_mem_shared, 0);
    cr_expect_gt(info.bw_GBps, 0.0, "no bandwidth from the properties");

    void *pctx = NULL;
    cr_assert_eq(plait_net_socket.init(&pctx, 0, NULL), PLAIT_SUCCESS, "%s", plait_last_error_get());
    const struct wire_hello good = {WIRE_MAGIC, 1, 0, 0, 4, 0, 4096};
    struct {
        struct wire_hello h;
        size_t bytes;
        const char *why;
    } bad[] = {
        {{0x12345678u, 1, 0, 0, 4, 0, 4096}, sizeof(good), "not a hello (magic 0x12345678"},
        {{WIRE_MAGIC, 1, 5, 0, 4, 0, 4096}, sizeof(good), "a hello from rank 5, not another rank"},
        {{WIRE_MAGIC, 1, 1, 0, 4, 0, 4096}, sizeof(good), "a hello from rank 1, not another rank"},
        {{WIRE_MAGIC, 1, 0, 9, 4, 0, 4096}, sizeof(good), "connection class 9 of 2"},
        {{WIRE_MAGIC, 1, 0, 0, 8, 0, 4096}, sizeof(good), "with 8 slots of 4096 bytes"},
        {{WIRE_MAGIC, 1, 0, 0, 4, 0, 4096}, 16, "a first message of 16 bytes"},
    };
    void *forged[8] = {0};
    int nforged = 0;
    for (size_t v = 0; v < sizeof(bad) / sizeof(bad[0]); v++) {
        cr_assert_eq(forge(&w, r, pctx, &bad[v].h, bad[v].bytes, &forged[nforged]), 0, "forging %zu: %s", v,
                     plait_last_error_get());
        nforged++;
        char err[1024];
        cr_expect_eq(accept_times_out(r, err, sizeof(err)), PLAIT_ERR_TIMEOUT);
        char count[64];
        snprintf(count, sizeof(count), "%zu connections were closed", v + 1);
        cr_expect(strstr(err, count) && strstr(err, bad[v].why), "hello %zu: expected '%s' and '%s' in: %s", v,
                  count, bad[v].why, err);
    }
    /* the real connection (0, 0) and one slot each way */
    struct plait_conn *c[2] = {NULL, NULL};
    cr_assert_eq(plait_transport_net.connect(r[0].ctx, 1, 0, 0, NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_transport_net.connect(r[1].ctx, 0, 0, PLAIT_TP_BOTH_NOW, NULL), PLAIT_SUCCESS);
    const double deadline = plait_deadline(20);
    for (int i = 0; i < 2; i++) {
        plait_result_t res;
        while ((res = plait_transport_net.accept(r[i].ctx, 1 - i, 0, NULL, deadline, &c[i])) == PLAIT_IN_PROGRESS)
            step_both(r, 0.001);
        cr_assert_eq(res, PLAIT_SUCCESS, "rank %d accept: %s", i, plait_last_error_get());
        cr_assert_eq(c[i]->tp, &plait_transport_net);
        cr_assert_eq(c[i]->peer, 1 - i);
    }
    for (int i = 0; i < 2; i++) {
        char *slot = plait_conn_send_slot(c[i]);
        cr_assert_not_null(slot);
        memset(slot, 'a' + i, 777);
        plait_conn_send_commit(c[i], 777);
    }
    for (int i = 0; i < 2; i++) {
        uint32_t got = 0;
        const char *in = NULL;
        const double end = plait_now() + 20;
        while (!(in = plait_conn_recv_slot(c[i], &got)) && plait_now() < end)
            step_both(r, 0.001);
        cr_assert_not_null(in, "rank %d received nothing", i);
        cr_expect_eq(got, 777u);
        cr_expect(in[0] == 'a' + (1 - i) && in[776] == 'a' + (1 - i));
        plait_conn_recv_release(c[i]);
        cr_expect(plait_transport_net.is_flushed(r[i].ctx, c[i]), "rank %d's send not flushed", i);
    }
    /* a second hello for (0, 0) */
    cr_assert_eq(forge(&w, r, pctx, &good, sizeof(good), &forged[nforged]), 0, "%s", plait_last_error_get());
    nforged++;
    char err[1024];
    cr_expect_eq(accept_times_out(r, err, sizeof(err)), PLAIT_ERR_TIMEOUT);
    cr_expect(strstr(err, "a second hello from rank 0 for connection class 0"), "%s", err);
    for (int i = 0; i < nforged; i++)
        plait_net_socket.close_send(forged[i]);
    plait_net_socket.finalize(pctx);
    plait_transport_net.fini(r[0].ctx);
    plait_transport_net.fini(r[1].ctx);
    free(w.gathered);
    pthread_barrier_destroy(&w.bar);
    cr_expect_eq(mr_count_fds(), fds0, "%d descriptors before, %d after", fds0, mr_count_fds());
}

/* ---------------------------------------------------------------- the default provider */

/* One allreduce, then: every connection with another rank is net's, and
 * there is one. */
static int default_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    float x = (float)(rank + 1), sum = 0;
    if (plait_allreduce(&x, &sum, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL))
        FAIL("rank %d: the allreduce: %s", rank, plait_get_last_error(comm));
    if (sum != (float)(n * (n + 1) / 2))
        FAIL("rank %d: the allreduce gave %g", rank, (double)sum);
    const int k = net_conns(comm, rank, msg, len);
    if (k == 0)
        FAIL("rank %d: no net connection", rank);
    return k < 0;
}

/* PLAIT_TRANSPORT=socket with PLAIT_NET_PROVIDER unset, then empty: the net
 * transport over the Socket provider. */
Test(net_transport, default_provider_forced, .timeout = 150)
{
    unsetenv("PLAIT_NET_PROVIDER");
    run(3, default_rank, NULL);
    setenv("PLAIT_NET_PROVIDER", "", 1);
    run(2, default_rank, NULL);
}

/* Ranks 0, 1 on one host and 2, 3 on another (PLAIT_HOSTID), nothing forced
 * and no PLAIT_NET_PROVIDER: the pairs of one host use shared memory, the
 * others the net transport. */
static int hosts_child(struct mr_child *c, void *arg)
{
    (void)arg;
    setenv("PLAIT_HOSTID", c->rank < 2 ? "net-default-a" : "net-default-b", 1);
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    char *msg = c->msg;
    const size_t len = c->msglen;
    const int rank = c->rank;
    int bad = 0;
    /* a ring and every pair: connections with both hosts' ranks */
    int32_t out[4], in[4] = {-1, -1, -1, -1};
    for (int q = 0; q < 4; q++)
        out[q] = rank * 10 + q;
    plait_group_start();
    for (int q = 0; q < 4; q++) {
        plait_send(&out[q], 1, PLAIT_INT32, q, comm, NULL);
        plait_recv(&in[q], 1, PLAIT_INT32, q, comm, NULL);
    }
    if (plait_group_end()) {
        snprintf(msg, len, "rank %d: all pairs: %s", rank, plait_get_last_error(comm));
        bad = 1;
    }
    for (int q = 0; q < 4 && !bad; q++)
        if (in[q] != q * 10 + rank) {
            snprintf(msg, len, "rank %d: from rank %d got %d", rank, q, in[q]);
            bad = 1;
        }
    int nnet = 0;
    for (int i = 0; i < comm->nranks * comm->ncls && !bad; i++) {
        const struct plait_conn *k = __atomic_load_n(&comm->conns[i], __ATOMIC_ACQUIRE);
        if (!k || k->peer == rank)
            continue;
        const int other_host = (k->peer < 2) != (rank < 2);
        if (other_host != (k->tp == &plait_transport_net)) {
            snprintf(msg, len, "rank %d: the connection with rank %d (%s host) is the %s transport's", rank, k->peer,
                     other_host ? "the other" : "its own", k->tp->name);
            bad = 1;
        }
        nnet += other_host;
    }
    if (!bad && nnet == 0) {
        snprintf(msg, len, "rank %d: no connection with the other host", rank);
        bad = 1;
    }
    plait_comm_destroy(comm);
    return bad;
}

Test(net_transport, default_provider_between_hosts, .timeout = 150)
{
    unsetenv("PLAIT_NET_PROVIDER");
    unsetenv("PLAIT_TRANSPORT");
    char msg[2048];
    struct mr_procs *p = mr_procs_start(4, hosts_child, NULL, 0, 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    const int failed = mr_procs_join(p, 120, msg, sizeof(msg));
    mr_procs_free(p);
    cr_assert_eq(failed, 0, "%d ranks failed: %s", failed, msg);
}

/* A provider plait does not have: init fails at once, naming the variable,
 * the value and the valid ones. */
Test(net_transport, unknown_provider_is_an_error, .timeout = 30)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    setenv("PLAIT_NET_PROVIDER", "ucx", 1);
    plait_comm_t comm = NULL;
    const plait_result_t res = plait_comm_init_rank(&comm, 1, id, 0);
    const char *err = plait_get_last_error(NULL);
    cr_expect_eq(res, PLAIT_ERR_INVALID_ARGUMENT, "init returned %s: %s", plait_get_error_string(res), err);
    cr_expect(strstr(err, "PLAIT_NET_PROVIDER") && strstr(err, "ucx") && strstr(err, "valid: socket"), "%s", err);
    if (res == PLAIT_SUCCESS)
        plait_comm_destroy(comm);
}

/* ---------------------------------------------------------------- strangers, white box
 *
 * Strangers on rank 1's listen socket (the address in its handle: anyone on
 * the network may connect there): text, a Socket hello with a wrong token, half
 * a hello, and a socket that says nothing. The provider drops them (the net
 * transport never sees them), and the expected peer still connects and its
 * connection carries a slot each way; nothing is left open. */
#include "base/net.h"
#include "transports/net/socket_wire.h"

static int stranger(const uint8_t *handle)
{
    union plait_sockaddr a;
    memset(&a, 0, sizeof(a));
    cr_assert_eq(handle[5], 4, "loopback handles are IPv4");
    a.sin.sin_family = AF_INET;
    memcpy(&a.sin.sin_port, handle + 8, 2);
    memcpy(&a.sin.sin_addr, handle + 16, 4);
    int fd = -1;
    cr_assert_eq(plait_sock_connect(&a, plait_deadline(5), NULL, &fd), PLAIT_SUCCESS, "%s", plait_last_error_get());
    return fd;
}

Test(net_transport, stranger_dropped, .timeout = 120)
{
    const int fds0 = mr_count_fds();
    struct fake_world w;
    struct fake_rank r[2];
    fake_setup(&w, r);
    cr_assert_eq(r[0].init_status, PLAIT_SUCCESS, "rank 0 init: %s", plait_last_error_get());
    cr_assert_eq(r[1].init_status, PLAIT_SUCCESS, "rank 1 init");
    int fds[4];
    for (int i = 0; i < 4; i++)
        fds[i] = stranger(w.handle1);
    static const char text[] = "GET / HTTP/1.0\r\n\r\n0123456789012345678901234567890";
    cr_assert_eq(plait_sock_send_all(fds[0], text, 48, plait_deadline(5), NULL), PLAIT_SUCCESS);
    uint8_t token[SOCK_TOKEN_BYTES], hello[SOCK_HELLO_BYTES];
    memcpy(token, w.handle1 + 32, sizeof(token));
    token[0] ^= 1;
    sock_hello_encode(hello, 0, 0, 12345, token);
    cr_assert_eq(plait_sock_send_all(fds[1], hello, sizeof(hello), plait_deadline(5), NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_send_all(fds[2], hello, 10, plait_deadline(5), NULL), PLAIT_SUCCESS);
    /* fds[3] says nothing */
    step_both(r, 0.3);
    /* the text and the wrong token are closed by the listener */
    for (int i = 0; i < 2; i++) {
        char c;
        cr_expect_eq(plait_sock_recv_all(fds[i], &c, 1, plait_deadline(5), NULL), PLAIT_ERR_REMOTE,
                     "stranger %d was not dropped", i);
    }
    /* the expected peer still connects, while the silent strangers wait */
    struct plait_conn *c[2] = {NULL, NULL};
    cr_assert_eq(plait_transport_net.connect(r[0].ctx, 1, 0, 0, NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_transport_net.connect(r[1].ctx, 0, 0, PLAIT_TP_BOTH_NOW, NULL), PLAIT_SUCCESS);
    const double deadline = plait_deadline(20);
    for (int i = 0; i < 2; i++) {
        plait_result_t res;
        while ((res = plait_transport_net.accept(r[i].ctx, 1 - i, 0, NULL, deadline, &c[i])) == PLAIT_IN_PROGRESS)
            step_both(r, 0.001);
        cr_assert_eq(res, PLAIT_SUCCESS, "rank %d accept: %s", i, plait_last_error_get());
    }
    for (int i = 0; i < 2; i++) {
        char *slot = plait_conn_send_slot(c[i]);
        cr_assert_not_null(slot);
        memset(slot, 'x' + i, 100);
        plait_conn_send_commit(c[i], 100);
    }
    for (int i = 0; i < 2; i++) {
        uint32_t got = 0;
        const char *in = NULL;
        const double end = plait_now() + 20;
        while (!(in = plait_conn_recv_slot(c[i], &got)) && plait_now() < end)
            step_both(r, 0.001);
        cr_assert_not_null(in, "rank %d received nothing", i);
        cr_expect(got == 100 && in[0] == 'x' + (1 - i) && in[99] == 'x' + (1 - i));
        plait_conn_recv_release(c[i]);
    }
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    plait_transport_net.fini(r[0].ctx);
    plait_transport_net.fini(r[1].ctx);
    free(w.gathered);
    pthread_barrier_destroy(&w.bar);
    cr_expect_eq(mr_count_fds(), fds0, "%d descriptors before, %d after", fds0, mr_count_fds());
}
