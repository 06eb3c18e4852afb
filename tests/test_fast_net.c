/* The small-message path over connections (core/fastpath.c, "Over
 * connections"): with PLAIT_TRANSPORT=socket every pair of ranks is joined by
 * the net transport, no segment holds boxes, and a small collective is one
 * message to each peer on the small-message class (comm->nchannels) and one
 * from each. Each rank checks that its calls went that way: the class's
 * connection to every peer carried exactly comm->fast_seq messages.
 *
 * Every collective the path runs x every type x every built-in op x in and
 * out of place x counts 1, 7 and the largest the path takes (a slot less the
 * tag, at most PLAIT_FAST_MSG_MAX_BYTES per rank pair) at 2, 3, 5 and 8
 * ranks, whichever path the tuner picks for each; many calls in a row; calls
 * inside a group (the executor's lane) and beside point-to-point traffic;
 * mismatched calls;
 * PLAIT_PROTO=simple; a killed peer. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/fastpath.h"
#include "tests/coll_check.h"
#include "tests/harness.h"

static void env_on(void)
{
    setenv("PLAIT_NET_PROVIDER", "socket", 1);
    setenv("PLAIT_SOCKET_IFNAME", "lo", 1);
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
}

static void env_off(void)
{
    unsetenv("PLAIT_NET_PROVIDER");
    unsetenv("PLAIT_SOCKET_IFNAME");
    unsetenv("PLAIT_COLL_TIMEOUT");
    unsetenv("PLAIT_PROTO");
    unsetenv("PLAIT_TRANSPORT");
}

TestSuite(fast_net, .init = env_on, .fini = env_off);

/* The small-message connection with peer p, or NULL. */
static const struct plait_conn *fast_conn(plait_comm_t comm, int p)
{
    return __atomic_load_n(&comm->conns[(size_t)p * (size_t)comm->ncls + (size_t)comm->nchannels], __ATOMIC_ACQUIRE);
}

/* 0 when every call so far went through the small-message connections:
 * comm->fast_seq calls, one message each to every peer. */
static int check_used(plait_comm_t comm, int rank, uint64_t at_least, char *msg, size_t len)
{
    if (!comm->fast || !comm->fast_msg) {
        snprintf(msg, len, "rank %d: no small-message path over connections (fast %p, fast_msg %d)", rank,
                 (void *)comm->fast, comm->fast_msg);
        return 1;
    }
    if (comm->fast_seq < at_least) {
        snprintf(msg, len, "rank %d: %llu calls on the small-message path, expected at least %llu", rank,
                 (unsigned long long)comm->fast_seq, (unsigned long long)at_least);
        return 1;
    }
    for (int p = 0; p < comm->nranks; p++) {
        if (p == rank)
            continue;
        /* the net transport's link: host memory only (the Socket provider's
         * ptr_support, agreed by both ranks), so the CUDA backend stages */
        struct plait_tp_info info;
        plait_comm_pair_info(comm, rank, p, &info);
        if (info.link != PLAIT_LC_NET || info.device_mem != PLAIT_TP_MEM_HOST) {
            snprintf(msg, len, "rank %d: the link with rank %d: class %d, device_mem 0x%x (want net, host only)", rank,
                     p, info.link, info.device_mem);
            return 1;
        }
        const struct plait_conn *c = fast_conn(comm, p);
        if (!c || c->tx_posted != comm->fast_seq || c->rx_consumed != comm->fast_seq) {
            snprintf(msg, len,
                     "rank %d: the small-message connection with rank %d carried %llu/%llu messages (sent/read) for "
                     "%llu calls",
                     rank, p, c ? (unsigned long long)c->tx_posted : 0ull,
                     c ? (unsigned long long)c->rx_consumed : 0ull, (unsigned long long)comm->fast_seq);
            return 1;
        }
    }
    return 0;
}

enum fc { FC_ALLREDUCE, FC_REDUCE, FC_REDUCESCATTER, FC_BROADCAST, FC_ALLGATHER, FC_ALLTOALL, FC_BARRIER, FC_COUNT };
static const char *const fc_names[FC_COUNT] = {"allreduce", "reduce",   "reducescatter", "broadcast",
                                               "allgather", "alltoall", "barrier"};

/* One call and its check: the number of wrong elements, or 1 with msg set on
 * an error. */
static size_t one(plait_comm_t comm, int rank, int n, int coll, int dtype, int op, int inplace, size_t count, int root,
                  char *sbuf, char *rbuf, char *msg, size_t len)
{
    const size_t bytes = count * cc_size(dtype);
    struct cc_expect e;
    cc_expect_init(&e, dtype, op, n);
    memset(rbuf, 0xcd, bytes * (size_t)n);
    plait_result_t r = PLAIT_SUCCESS;
    size_t bad = 0;
    char *out = rbuf;
    switch (coll) {
    case FC_ALLREDUCE:
    case FC_REDUCE:
        cc_fill(sbuf, count, dtype, op, rank, 0);
        out = inplace ? sbuf : rbuf;
        r = coll == FC_ALLREDUCE ? plait_allreduce(sbuf, out, count, dtype, (plait_redop_t)op, comm, NULL)
                                 : plait_reduce(sbuf, out, count, dtype, (plait_redop_t)op, root, comm, NULL);
        if (!r && (coll == FC_ALLREDUCE || rank == root))
            bad = cc_check(&e, out, count, 0, msg, len);
        break;
    case FC_REDUCESCATTER:
        cc_fill(sbuf, count * (size_t)n, dtype, op, rank, 0);
        out = inplace ? sbuf + (size_t)rank * bytes : rbuf;
        r = plait_reducescatter(sbuf, out, count, dtype, (plait_redop_t)op, comm, NULL);
        if (!r)
            bad = cc_check(&e, out, count, (size_t)rank * count, msg, len);
        break;
    case FC_BROADCAST: {
        char *in = inplace ? rbuf : sbuf;
        if (rank == root)
            cc_fill_bytes(in, bytes, root, 0);
        r = plait_broadcast(in, rbuf, count, dtype, root, comm, NULL);
        if (!r)
            bad = cc_check_bytes(rbuf, bytes, root, 0, msg, len);
        break;
    }
    case FC_ALLGATHER: {
        char *in = inplace ? rbuf + (size_t)rank * bytes : sbuf;
        cc_fill_bytes(in, bytes, rank, 0);
        r = plait_allgather(in, rbuf, count, dtype, comm, NULL);
        for (int q = 0; !r && q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, msg, len);
        break;
    }
    case FC_ALLTOALL: /* out of place only (plait and NCCL refuse in place) */
        cc_fill_bytes(sbuf, bytes * (size_t)n, rank, 0);
        r = plait_alltoall(sbuf, rbuf, count, dtype, comm, NULL);
        for (int q = 0; !r && q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, (size_t)rank * bytes, msg, len);
        break;
    default:
        r = plait_barrier(comm, NULL);
        break;
    }
    if (r) {
        snprintf(msg, len, "rank %d: %s: %s", rank, plait_get_error_string(r), plait_get_last_error(comm));
        bad = 1;
    }
    if (bad)
        snprintf(msg + strlen(msg), len - strlen(msg), " [rank %d: %s %s %s count %zu inplace %d root %d]", rank,
                 fc_names[coll], cc_type_name(dtype), cc_op_name(op), count, inplace, root);
    return bad;
}

struct matrix_arg {
    int all_types; /* every type, or four */
};

static int matrix_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    const struct matrix_arg *a = arg;
    const int some_types[] = {PLAIT_INT8, PLAIT_FLOAT32, PLAIT_FLOAT64, PLAIT_BFLOAT16};
    const int ntypes = a->all_types ? PLAIT_NUM_TYPES : 4;
    const size_t maxb = plait_fast_max_bytes(comm);
    if (maxb < PLAIT_FAST_MAX_BYTES || maxb > PLAIT_FAST_MSG_MAX_BYTES) {
        snprintf(msg, len, "rank %d: the path takes %zu bytes per rank pair", rank, maxb);
        return 1;
    }
    const size_t maxbuf = maxb * (size_t)n;
    char *sbuf = malloc(maxbuf), *rbuf = malloc(maxbuf);
    if (!sbuf || !rbuf) {
        free(sbuf);
        free(rbuf);
        snprintf(msg, len, "rank %d: out of memory", rank);
        return 1;
    }
    uint64_t musts = 0;
    int bad = 0;
    for (int coll = 0; coll < FC_COUNT && !bad; coll++)
        for (int ti = 0; ti < ntypes && !bad; ti++) {
            const int dtype = a->all_types ? ti : some_types[ti];
            const size_t counts[] = {1, 7, maxb / cc_size(dtype)};
            const int is_red = coll <= FC_REDUCESCATTER;
            for (int op = 0; op < (is_red ? PLAIT_NUM_OPS : 1) && !bad; op++)
                for (int ci = 0; ci < 3 && !bad; ci++)
                    for (int inplace = 0; inplace < 2 && !bad; inplace++) {
                        if ((coll == FC_BARRIER && (ti || ci || inplace)) || (coll == FC_ALLTOALL && inplace))
                            continue;
                        const int root = (int)((coll + ti + ci) % (size_t)n);
                        bad = one(comm, rank, n, coll, dtype, op, inplace, counts[ci], root, sbuf, rbuf, msg,
                                  len) != 0;
                        /* the tuner takes the path for these at least (the
                         * others as its model says) */
                        musts += (coll == FC_ALLREDUCE && ci == 0) || coll == FC_BARRIER;
                    }
        }
    free(sbuf);
    free(rbuf);
    return bad || check_used(comm, rank, musts, msg, len);
}

static void matrix(int n, int all_types)
{
    struct matrix_arg a = {all_types};
    char msg[4096] = "";
    const int failed = mr_run(MR_SOCKET, n, matrix_rank, &a, 240, msg, sizeof(msg));
    cr_assert_eq(failed, 0, "%d ranks: %d failed: %s", n, failed, msg);
}

Test(fast_net, every_collective_type_op_2_ranks, .timeout = 300)
{
    matrix(2, 1);
}

Test(fast_net, every_collective_type_op_3_ranks, .timeout = 300)
{
    matrix(3, 1);
}

Test(fast_net, every_collective_5_ranks, .timeout = 300)
{
    matrix(5, 0);
}

Test(fast_net, every_collective_8_ranks, .timeout = 300)
{
    matrix(8, 0);
}

/* ---------------------------------------------------------------- in a row, in a group, beside p2p */

static int sequence_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    /* Many calls in a row, each with other values: a message read twice or
     * skipped (credit, order) gives a wrong sum. */
    for (int i = 0; i < 3000; i++) {
        int64_t v = (int64_t)rank * 1000003 + i, sum = 0;
        plait_result_t r = plait_allreduce(&v, &sum, 1, PLAIT_INT64, PLAIT_SUM, comm, NULL);
        const int64_t want = (int64_t)n * (n - 1) / 2 * 1000003 + (int64_t)n * i;
        if (r || sum != want) {
            snprintf(msg, len, "rank %d: call %d: %s: sum %lld, expected %lld", rank, i, plait_get_error_string(r),
                     (long long)sum, (long long)want);
            return 1;
        }
    }
    /* A group of small calls: queued, run by the executor's lane 0. */
    int32_t in[4] = {rank, rank + 1, rank + 2, rank + 3}, out[4][4];
    plait_group_start();
    for (int k = 0; k < 4; k++)
        plait_allreduce(in, out[k], (size_t)(k + 1), PLAIT_INT32, PLAIT_MAX, comm, NULL);
    plait_result_t r = plait_group_end();
    for (int k = 0; !r && k < 4; k++)
        for (int j = 0; j <= k; j++)
            if (out[k][j] != n - 1 + j) {
                snprintf(msg, len, "rank %d: grouped call %d element %d: %d, expected %d", rank, k, j, out[k][j],
                         n - 1 + j);
                return 1;
            }
    if (r) {
        snprintf(msg, len, "rank %d: the group: %s", rank, plait_get_last_error(comm));
        return 1;
    }
    /* Point-to-point beside it: rank 0 sends to rank 1 and then calls the
     * collective; rank 1 calls the collective and then receives. The small
     * messages have a class of their own, so neither is taken for the other. */
    if (n >= 2 && rank <= 1) {
        int64_t token = 77, got = 0, v = rank, sum = -1;
        if (rank == 0) {
            r = plait_send(&token, 1, PLAIT_INT64, 1, comm, NULL);
            if (!r)
                r = plait_allreduce(&v, &sum, 1, PLAIT_INT64, PLAIT_SUM, comm, NULL);
        } else {
            r = plait_allreduce(&v, &sum, 1, PLAIT_INT64, PLAIT_SUM, comm, NULL);
            if (!r)
                r = plait_recv(&got, 1, PLAIT_INT64, 0, comm, NULL);
        }
        if (r || sum != (int64_t)n * (n - 1) / 2 || (rank == 1 && got != token)) {
            snprintf(msg, len, "rank %d: send beside the collective: %s: sum %lld got %lld", rank,
                     r ? plait_get_last_error(comm) : "wrong data", (long long)sum, (long long)got);
            return 1;
        }
    } else if (n >= 2) {
        int64_t v = rank, sum = -1;
        if ((r = plait_allreduce(&v, &sum, 1, PLAIT_INT64, PLAIT_SUM, comm, NULL)) || sum != (int64_t)n * (n - 1) / 2) {
            snprintf(msg, len, "rank %d: %s", rank, r ? plait_get_last_error(comm) : "wrong sum");
            return 1;
        }
    }
    return check_used(comm, rank, 3000 + 4 + 1, msg, len);
}

Test(fast_net, in_a_row_in_a_group_beside_p2p, .timeout = 300)
{
    char msg[4096] = "";
    for (int n = 2; n <= 4; n += 2) {
        const int failed = mr_run(MR_SOCKET, n, sequence_rank, NULL, 240, msg, sizeof(msg));
        cr_assert_eq(failed, 0, "%d ranks: %d failed: %s", n, failed, msg);
    }
}

/* ---------------------------------------------------------------- mismatches, PLAIT_PROTO=simple */

struct mm_arg {
    int kind; /* 0: counts differ; 1: reduce vs broadcast; 2: small vs large */
};

static int mismatch_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)n;
    const struct mm_arg *a = arg;
    static float buf[1 << 16], out[1 << 16];
    plait_result_t r;
    /* one good call first: the connections exist and the first use is past */
    if ((r = plait_allreduce(buf, out, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL))) {
        snprintf(msg, len, "rank %d: the first call: %s", rank, plait_get_last_error(comm));
        return 1;
    }
    if (a->kind == 0)
        r = plait_allreduce(buf, out, rank ? 8 : 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    else if (a->kind == 1)
        r = rank ? plait_broadcast(buf, out, 4, PLAIT_FLOAT32, 0, comm, NULL)
                 : plait_reduce(buf, out, 4, PLAIT_FLOAT32, PLAIT_SUM, 0, comm, NULL);
    else
        r = plait_allreduce(buf, out, rank ? 4 : (size_t)1 << 16, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    const char *e = plait_get_last_error(comm);
    if (r != PLAIT_ERR_INVALID_USAGE || !strstr(e, "mismatched")) {
        snprintf(msg, len, "rank %d: mismatch kind %d returned %d (%s): %s", rank, a->kind, r,
                 plait_get_error_string(r), e);
        return 1;
    }
    return 0;
}

Test(fast_net, mismatched_calls_are_errors, .timeout = 200)
{
    for (int kind = 0; kind < 3; kind++) {
        struct mm_arg a = {kind};
        char msg[4096] = "";
        const double t0 = mr_now();
        const int failed = mr_run(MR_SOCKET, 2, mismatch_rank, &a, 90, msg, sizeof(msg));
        cr_assert_eq(failed, 0, "kind %d: %d failed: %s", kind, failed, msg);
        /* the errors come from the checks, not from PLAIT_COLL_TIMEOUT (60 s) */
        cr_expect_lt(mr_now() - t0, 45.0, "kind %d took %.1f s", kind, mr_now() - t0);
    }
}

static int simple_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    int64_t v = rank, sum = 0;
    plait_result_t r = plait_allreduce(&v, &sum, 1, PLAIT_INT64, PLAIT_SUM, comm, NULL);
    if (r || sum != (int64_t)n * (n - 1) / 2) {
        snprintf(msg, len, "rank %d: %s", rank, r ? plait_get_last_error(comm) : "wrong sum");
        return 1;
    }
    for (int p = 0; p < n; p++)
        if (p != rank && fast_conn(comm, p)) {
            snprintf(msg, len, "rank %d: a small-message connection with rank %d under PLAIT_PROTO=simple", rank, p);
            return 1;
        }
    if (comm->fast || comm->fast_msg || comm->fast_seq) {
        snprintf(msg, len, "rank %d: the small-message path is on under PLAIT_PROTO=simple", rank);
        return 1;
    }
    return 0;
}

Test(fast_net, simple_protocol_has_no_small_message_connections, .timeout = 120)
{
    setenv("PLAIT_PROTO", "simple", 1);
    char msg[4096] = "";
    const int failed = mr_run(MR_SOCKET, 3, simple_rank, NULL, 90, msg, sizeof(msg));
    unsetenv("PLAIT_PROTO");
    cr_assert_eq(failed, 0, "%d failed: %s", failed, msg);
}

/* ---------------------------------------------------------------- a killed peer */

struct dead_board {
    int result;
    double took;
    char err[1024];
};

struct dead_roles {
    int made; /* 1: a call first, so the small-message connections exist */
};

static int dead_child(struct mr_child *c, void *arg)
{
    const struct dead_roles *roles = arg;
    struct dead_board *b = c->shared;
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    float v = 1, sum = 0;
    if (roles->made && plait_allreduce(&v, &sum, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL)) {
        snprintf(c->msg, c->msglen, "rank %d: the call before the kill: %s", c->rank, plait_get_last_error(comm));
        return 1;
    }
    mr_child_ready(c);
    if (c->rank == 1) {
        for (;;)
            pause(); /* killed by the parent */
    }
    if (c->rank == 0) {
        mr_sleep_ms(300); /* the parent kills rank 1 meanwhile */
        const double t0 = mr_now();
        b->result = (int)plait_allreduce(&v, &sum, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
        b->took = mr_now() - t0;
        snprintf(b->err, sizeof(b->err), "%s", plait_get_last_error(comm));
    }
    /* rank 2 waits in its own call: its failure is not what is checked */
    if (c->rank == 2)
        (void)plait_allreduce(&v, &sum, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    plait_comm_abort(comm);
    return 0;
}

static void dead_case(int made)
{
    struct dead_roles roles = {made};
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
    char msg[1024];
    struct mr_procs *p = mr_procs_start(3, dead_child, &roles, sizeof(struct dead_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    cr_assert_eq(mr_procs_wait_ready(p, 3, 60), 0, "the ranks did not init");
    mr_procs_kill(p, 1, SIGKILL);
    mr_procs_join(p, 60, msg, sizeof(msg));
    struct dead_board got = *(struct dead_board *)mr_procs_shared(p);
    mr_procs_free(p);
    unsetenv("PLAIT_TRANSPORT");
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    cr_log_info("made %d: after %.2f s: %s", made, got.took, got.err);
    cr_expect_eq(got.result, PLAIT_ERR_REMOTE, "made %d: rank 0's call with rank 1 dead returned %d: %s", made,
                 got.result, got.err);
    cr_expect(mr_names_rank(got.err, 1), "made %d: the error does not name rank 1: %s", made, got.err);
    cr_expect_lt(got.took, 10.0, "made %d: the error came after %.2f s", made, got.took);
}

Test(fast_net, killed_peer_is_named, .timeout = 200)
{
    dead_case(1); /* the small-message connections exist: the receive sees rank 1's side close */
    dead_case(0); /* made on first use: rank 0 dials the dead rank */
}
