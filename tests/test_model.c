/* The cost model (tuning/model.h): closed-form oracles on machines that
 * have only alpha and beta, monotonicity, contention, the reduced replay
 * against the full one, the LL closed form, the constants file, and the cost
 * of large predictions. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "base/log.h"
#include "tuning/model.h"
#include "topology/topo.h"
#include "tuning/tuner.h"

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int close_rel(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(fabs(a), fabs(b));
}

/* Constants with nothing but the wire: every engine cost and overhead 0. */
static void consts_wire_only(struct plait_model_consts *k, double alpha, double beta)
{
    memset(k, 0, sizeof(*k));
    for (int l = 0; l < PLAIT_MLINK_COUNT; l++) {
        k->alpha[l] = alpha;
        k->beta[l] = beta;
    }
}

/* One channel, a chunk and a slot big enough for the whole call: every step
 * is one piece. */
static void call_one_piece(struct plait_model_call *c, int coll, uint64_t count, int algo)
{
    plait_model_call_init(c, coll, count, 4, algo, PLAIT_MPROTO_SIMPLE);
    c->nchannels = 1;
    c->slot_bytes = 1ull << 30;
    c->chunk_bytes = 1ull << 30;
    c->nslots = 4;
}

static double predict(const struct plait_model_machine *m, const struct plait_model_call *c, int mode,
                      struct plait_model_result *out)
{
    struct plait_model_result r;
    plait_result_t st = plait_model_time(m, c, mode, &r);
    cr_assert_eq(st, PLAIT_SUCCESS, "%s %s count %llu on %d ranks: %s", plait_algorithms[c->algo].name,
                 plait_coll_name(c->coll), (unsigned long long)c->count, m->nranks, plait_last_error_get());
    if (out)
        *out = r;
    return r.time_s;
}

/* ------------------------------------------------------------ oracles */

/* Ring allreduce, one piece per step: 2(n-1) hops in sequence, each alpha
 * plus one rank-chunk (S/n bytes) through the port (the out- and in-ports
 * overlap: cut-through). */
Test(model, oracle_ring_allreduce)
{
    const double alpha = 2e-6, beta = 1e-9;
    struct plait_model_consts k;
    consts_wire_only(&k, alpha, beta);
    for (int n = 2; n <= 8; n++) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_uniform(&m, n, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                     PLAIT_SUCCESS);
        for (uint64_t per = 4; per <= 4096 * 4; per *= 16) {
            const uint64_t count = per * (uint64_t)n; /* equal rank-chunks of `per` floats */
            struct plait_model_call c;
            call_one_piece(&c, PLAIT_COLL_ALLREDUCE, count, PLAIT_ALGO_RING);
            const double t = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
            const double want = 2.0 * (n - 1) * (alpha + (double)(per * 4) * beta);
            cr_expect(close_rel(t, want, 1e-12), "ring allreduce n=%d S=%llu: %.9g, formula %.9g", n,
                      (unsigned long long)count * 4, t, want);
        }
        plait_model_machine_free(&m);
    }
}

/* Ring allgather: n-1 hops of a whole block (S bytes per rank). */
Test(model, oracle_ring_allgather)
{
    const double alpha = 3e-6, beta = 2e-10;
    struct plait_model_consts k;
    consts_wire_only(&k, alpha, beta);
    for (int n = 2; n <= 8; n++) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_uniform(&m, n, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                     PLAIT_SUCCESS);
        for (uint64_t count = 4; count <= 65536; count *= 8) {
            struct plait_model_call c;
            call_one_piece(&c, PLAIT_COLL_ALLGATHER, count, PLAIT_ALGO_RING);
            const double t = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
            const double want = (n - 1) * (alpha + (double)(count * 4) * beta);
            cr_expect(close_rel(t, want, 1e-12), "ring allgather n=%d: %.9g, formula %.9g", n, t, want);
        }
        plait_model_machine_free(&m);
    }
}

/* Binomial tree broadcast of one chunk. A parent's sends to its children
 * leave back to back on its out-port (alpha is latency, not occupancy), so
 * its j-th child hears j S beta + alpha after it; along the worst path the
 * hops number floor(log2 n) (the tree's depth) and the queued transfers
 * ceil(log2 n): T = floor(log2 n) alpha + ceil(log2 n) S beta, the textbook
 * ceil(log2 n) (alpha + S beta) when n is a power of two. */
Test(model, oracle_tree_broadcast)
{
    const double alpha = 5e-6, beta = 1e-9;
    struct plait_model_consts k;
    consts_wire_only(&k, alpha, beta);
    for (int n = 2; n <= 9; n++) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_uniform(&m, n, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                     PLAIT_SUCCESS);
        int levels = 0, depth = 0;
        while ((1 << levels) < n)
            levels++;
        while ((2 << depth) <= n)
            depth++;
        for (uint64_t count = 4; count <= 65536; count *= 16) {
            struct plait_model_call c;
            call_one_piece(&c, PLAIT_COLL_BROADCAST, count, PLAIT_ALGO_TREE);
            const double t = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
            const double want = depth * alpha + levels * (double)(count * 4) * beta;
            cr_expect(close_rel(t, want, 1e-12), "tree broadcast n=%d S=%llu: %.9g, formula %.9g", n,
                      (unsigned long long)count * 4, t, want);
        }
        plait_model_machine_free(&m);
    }
}

/* Pipelined ring allreduce, one channel, p pieces per step (the chunk is p
 * slots, FIFO deep enough) and alpha below a piece's wire time: every rank
 * sends from the start and always has its next piece by the time its
 * out-port is free, so the out-port carries its 2(n-1) p pieces back to back
 * and the last arrives alpha after it left: T = alpha + 2(n-1) p P beta. */
Test(model, oracle_ring_allreduce_pipelined)
{
    const double alpha = 1e-6, beta = 1e-9;
    struct plait_model_consts k;
    consts_wire_only(&k, alpha, beta);
    for (int n = 2; n <= 6; n++) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_uniform(&m, n, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                     PLAIT_SUCCESS);
        const uint64_t piece = 4096, p = 4;
        struct plait_model_call c;
        plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, (uint64_t)n * p * piece / 4, 4, PLAIT_ALGO_RING,
                              PLAIT_MPROTO_SIMPLE);
        c.nchannels = 1;
        c.slot_bytes = piece;
        c.nslots = 64;
        c.chunk_bytes = p * piece;
        const double t = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
        const double want = alpha + 2.0 * (n - 1) * (double)(p * piece) * beta;
        cr_expect(close_rel(t, want, 1e-12), "pipelined ring n=%d: %.9g, formula %.9g", n, t, want);
        plait_model_machine_free(&m);
    }
}

/* Latency scaling: small messages, alpha only. Ring allreduce grows as
 * 2(n-1), tree broadcast as ceil(log2 n). */
Test(model, oracle_scaling_with_ranks)
{
    struct plait_model_consts k;
    consts_wire_only(&k, 1e-6, 0);
    for (int n = 2; n <= 64; n *= 2) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_uniform(&m, n, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                     PLAIT_SUCCESS);
        struct plait_model_call c;
        call_one_piece(&c, PLAIT_COLL_ALLREDUCE, (uint64_t)n * 4, PLAIT_ALGO_RING);
        cr_expect(close_rel(predict(&m, &c, PLAIT_MODEL_FULL, NULL), 2.0 * (n - 1) * 1e-6, 1e-12), "ring n=%d", n);
        call_one_piece(&c, PLAIT_COLL_BROADCAST, 4, PLAIT_ALGO_TREE);
        int lg = 0;
        while ((1 << lg) < n)
            lg++;
        cr_expect(close_rel(predict(&m, &c, PLAIT_MODEL_FULL, NULL), lg * 1e-6, 1e-12), "tree n=%d", n); /* n = 2^lg */
        plait_model_machine_free(&m);
    }
}

/* Overheads alone: a call of count 0 costs the call overhead plus one step
 * overhead per step (no piece moves); one rank is a local copy. */
Test(model, overheads_and_one_rank)
{
    struct plait_model_consts k;
    consts_wire_only(&k, 1e-6, 1e-9);
    k.call_overhead[PLAIT_MENGINE_CPU] = 3e-6;
    k.step_overhead[PLAIT_MENGINE_CPU] = 1e-7;
    k.copy_beta[PLAIT_MENGINE_CPU] = 1e-10;
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_uniform(&m, 4, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                 PLAIT_SUCCESS);
    struct plait_model_call c;
    call_one_piece(&c, PLAIT_COLL_ALLREDUCE, 0, PLAIT_ALGO_RING);
    struct plait_model_result r;
    predict(&m, &c, PLAIT_MODEL_FULL, &r);
    cr_expect_eq(r.pieces, 0);
    /* a ring over an empty range has no step: the call overhead alone */
    cr_expect_eq(r.steps, 0);
    cr_expect(close_rel(r.time_s, 3e-6, 1e-12), "count 0: %.9g", r.time_s);
    /* recursive halving/doubling still walks its steps, each of count 0 */
    c.algo = PLAIT_ALGO_RECURSIVE;
    predict(&m, &c, PLAIT_MODEL_FULL, &r);
    cr_expect_eq(r.pieces, 0);
    cr_expect(r.time_s >= 3e-6 && r.time_s <= 3e-6 + (double)r.steps * 1e-7 + 1e-15, "count 0: %.9g, %llu steps",
              r.time_s, (unsigned long long)r.steps);
    plait_model_machine_free(&m);

    cr_assert_eq(plait_model_machine_uniform(&m, 1, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                 PLAIT_SUCCESS);
    call_one_piece(&c, PLAIT_COLL_ALLREDUCE, 1000, PLAIT_ALGO_RING);
    predict(&m, &c, PLAIT_MODEL_FULL, &r);
    cr_expect(close_rel(r.time_s, 3e-6 + 1e-7 + 4000 * 1e-10, 1e-12), "one rank: %.9g", r.time_s);
    plait_model_machine_free(&m);
}

/* ---------------------------------------------------------- monotonic */

/* Non-decreasing in size. Below 64 KiB, where a channel has only a few
 * elements per rank, the serial CPU executor's channels contend for its one
 * thread in size-dependent ways (two channels whose only chunk starts on the
 * same rank collide at every hop; evenly filled rings do not), and the replay
 * models that: there a later size may be up to a third faster (recursive
 * halving on 8 ranks: 64 bytes leave most ranks a count-0 step whose overhead
 * still queues on the thread). From 64 KiB up the
 * prediction never decreases. */
Test(model, monotonic_in_size)
{
    static const int colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_REDUCESCATTER,
                                PLAIT_COLL_BROADCAST};
    for (int engine = 0; engine < PLAIT_MENGINE_COUNT; engine++) {
        for (int n = 2; n <= 8; n++) {
            struct plait_model_machine m;
            cr_assert_eq(plait_model_machine_uniform(&m, n, 1, engine,
                                                     engine == PLAIT_MENGINE_CPU ? PLAIT_MLINK_SHM : PLAIT_MLINK_NVLINK,
                                                     PLAIT_MLINK_NET, NULL),
                         PLAIT_SUCCESS);
            for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++) {
                for (int a = PLAIT_ALGO_AUTO + 1; a < PLAIT_ALGO_COUNT; a++) {
                    if (!plait_algorithms[a].supports(colls[ci], n))
                        continue;
                    double prev = -1;
                    for (uint64_t bytes = 0; bytes <= (1ull << 30); bytes = bytes ? bytes * 4 : 4) {
                        /* count per rank for allgather/reducescatter: the same total */
                        const int per_rank = colls[ci] == PLAIT_COLL_ALLGATHER || colls[ci] == PLAIT_COLL_REDUCESCATTER;
                        const uint64_t count = per_rank ? bytes / 4 / (uint64_t)n : bytes / 4;
                        struct plait_model_call c;
                        plait_model_call_init(&c, colls[ci], count, 4, a, PLAIT_MPROTO_SIMPLE);
                        const double t = predict(&m, &c, PLAIT_MODEL_AUTO, NULL);
                        const double slack = bytes <= (64u << 10) ? 0.35 : 0.0;
                        cr_expect(t >= prev * (1.0 - slack), "%s %s engine %d n=%d: %llu bytes take %.9g < %.9g for less",
                                  plait_algorithms[a].name, plait_coll_name(colls[ci]), engine, n,
                                  (unsigned long long)bytes, t, prev);
                        prev = t;
                    }
                }
            }
            plait_model_machine_free(&m);
        }
    }
}

/* --------------------------------------------------- reduced vs full */

/* The reduced replay (host 0 alone) gives the full replay's time, to the
 * bit or nearly, for the rotation-invariant schedules, on 2..64 hosts of 8. */
Test(model, reduced_equals_full)
{
    static const int algos[] = {PLAIT_ALGO_RING, PLAIT_ALGO_HIER};
    static const int colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_REDUCESCATTER};
    static const int hosts[] = {2, 3, 4, 8, 16, 64};
    for (size_t hi = 0; hi < sizeof(hosts) / sizeof(hosts[0]); hi++) {
        const int H = hosts[hi], n = 8 * H;
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_uniform(&m, n, H, PLAIT_MENGINE_GPU, PLAIT_MLINK_NVLINK, PLAIT_MLINK_NET, NULL),
                     PLAIT_SUCCESS);
        m.nics_per_host = 4;
        for (size_t ai = 0; ai < sizeof(algos) / sizeof(algos[0]); ai++) {
            for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++) {
                /* total bytes: small, medium, several chunk iterations */
                /* Total bytes that split into equal 16-byte-aligned rank
                 * chunks on every channel (a ring allreduce of other sizes is
                 * not rotation-invariant: its short last chunk sits on some
                 * ranks only; mode_selection covers that case). */
                const uint64_t sizes[] = {(uint64_t)n * 1024, (uint64_t)n * (128u << 10), (uint64_t)n * (2u << 20)};
                for (size_t si = 0; si < 3; si++) {
                    if (H == 64 && si == 2)
                        continue; /* the full replay of 512 ranks x 1 GiB is the slow part */
                    const int per_rank = colls[ci] != PLAIT_COLL_ALLREDUCE;
                    const uint64_t count = per_rank ? sizes[si] / 4 / (uint64_t)n : sizes[si] / 4;
                    struct plait_model_call c;
                    plait_model_call_init(&c, colls[ci], count, 4, algos[ai], PLAIT_MPROTO_SIMPLE);
                    struct plait_model_result full, red;
                    predict(&m, &c, PLAIT_MODEL_FULL, &full);
                    predict(&m, &c, PLAIT_MODEL_REDUCED, &red);
                    cr_expect_eq(full.mode, PLAIT_MODEL_FULL);
                    cr_expect_eq(red.mode, PLAIT_MODEL_REDUCED);
                    cr_expect(close_rel(full.time_s, red.time_s, 1e-9), "%s %s %d hosts, %llu bytes: full %.12g reduced %.12g",
                              plait_algorithms[algos[ai]].name, plait_coll_name(colls[ci]), H,
                              (unsigned long long)sizes[si], full.time_s, red.time_s);
                    cr_expect(red.steps < full.steps || H == 1);
                }
            }
        }
        plait_model_machine_free(&m);
    }
}

/* AUTO picks the reduced replay for ring on many hosts and the full one for
 * trees; REDUCED refuses a tree. */
Test(model, mode_selection)
{
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_uniform(&m, 32, 4, PLAIT_MENGINE_GPU, PLAIT_MLINK_NVLINK, PLAIT_MLINK_NET, NULL),
                 PLAIT_SUCCESS);
    struct plait_model_call c;
    struct plait_model_result r;
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, 1 << 20, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE);
    predict(&m, &c, PLAIT_MODEL_AUTO, &r);
    cr_expect_eq(r.mode, PLAIT_MODEL_REDUCED);
    plait_model_call_init(&c, PLAIT_COLL_BROADCAST, 1 << 20, 4, PLAIT_ALGO_TREE, PLAIT_MPROTO_SIMPLE);
    predict(&m, &c, PLAIT_MODEL_AUTO, &r);
    cr_expect_eq(r.mode, PLAIT_MODEL_FULL);
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_REDUCED, &r), PLAIT_ERR_INVALID_ARGUMENT);
    /* A count whose ring chunks are unequal: AUTO replays it in full here. */
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, 1000003, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE);
    struct plait_model_result full;
    predict(&m, &c, PLAIT_MODEL_AUTO, &r);
    predict(&m, &c, PLAIT_MODEL_FULL, &full);
    cr_expect_eq(r.mode, PLAIT_MODEL_FULL);
    cr_expect_eq(r.time_s, full.time_s);
    plait_model_machine_free(&m);
}

/* ----------------------------------------------------------- contention */

/* Two channels leaving each host from different local indices: on one NIC
 * they share it, on two each has its own. */
Test(model, contention_nic)
{
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_uniform(&m, 4, 2, PLAIT_MENGINE_GPU, PLAIT_MLINK_NVLINK, PLAIT_MLINK_NET, NULL),
                 PLAIT_SUCCESS);
    /* channel 0: 0 1 | 2 3 (leaves from local 1); channel 1: 1 0 | 3 2 (leaves from local 0) */
    static const int32_t order[8] = {0, 1, 2, 3, 1, 0, 3, 2};
    int32_t pos[8];
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 4; i++)
            pos[c * 4 + order[c * 4 + i]] = i;
    int32_t *o = malloc(sizeof(order)), *p = malloc(sizeof(pos));
    cr_assert(o && p);
    memcpy(o, order, sizeof(order));
    memcpy(p, pos, sizeof(pos));
    m.order = o;
    m.pos = p;
    m.norder = 2;
    struct plait_model_call c;
    plait_model_call_init(&c, PLAIT_COLL_ALLGATHER, 16 << 20, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE);
    c.nslots = 16; /* enough credit in flight for one channel to fill a NIC despite alpha */
    m.nics_per_host = 1;
    const double one = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
    m.nics_per_host = 2;
    const double two = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
    cr_expect(one > 1.4 * two, "two channels on one NIC %.9g, on two NICs %.9g", one, two);
    /* one channel: the second NIC does not help */
    c.nchannels = 1;
    m.nics_per_host = 1;
    const double one1 = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
    m.nics_per_host = 2;
    cr_expect(close_rel(one1, predict(&m, &c, PLAIT_MODEL_FULL, NULL), 1e-12));
    plait_model_machine_free(&m);
}

/* More ranks than cores: slower than a core each, and slower still with
 * fewer cores. */
Test(model, contention_cores)
{
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_uniform(&m, 8, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, NULL),
                 PLAIT_SUCCESS);
    static const uint64_t counts[] = {16, 4096, 1 << 20};
    for (int i = 0; i < 3; i++) {
        struct plait_model_call c;
        plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, counts[i], 4, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE);
        m.cores_per_host = 8;
        const double enough = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
        m.cores_per_host = 0;
        cr_expect(close_rel(enough, predict(&m, &c, PLAIT_MODEL_FULL, NULL), 1e-12));
        m.cores_per_host = 4;
        const double four = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
        m.cores_per_host = 2;
        const double two = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
        cr_expect(four > enough && two > four, "count %llu: 8 cores %.9g, 4 cores %.9g, 2 cores %.9g",
                  (unsigned long long)counts[i], enough, four, two);
    }
    plait_model_machine_free(&m);
}

/* ------------------------------------------------------------------- LL */

Test(model, ll_small_messages)
{
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_uniform(&m, 8, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, NULL),
                 PLAIT_SUCCESS);
    cr_assert(m.ll_ok);
    struct plait_model_call c;
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, 2, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_LL);
    struct plait_model_result ll;
    predict(&m, &c, PLAIT_MODEL_AUTO, &ll);
    const struct plait_model_consts *k = &m.k;
    cr_expect(close_rel(ll.time_s, k->ll_call[0] + 7 * (k->ll_alpha[0] + 8 * k->ll_beta[0]), 1e-12));
    c.proto = PLAIT_MPROTO_SIMPLE;
    const double simple = predict(&m, &c, PLAIT_MODEL_AUTO, NULL);
    cr_expect(ll.time_s < simple, "8 bytes: LL %.9g, simple %.9g", ll.time_s, simple);
    /* above ll_max_bytes: rejected */
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, m.ll_max_bytes / 4 + 4, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_LL);
    struct plait_model_result r;
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
    /* time-sliced: one hand-off per rank beyond the cores; broadcast refused */
    m.cores_per_host = 2;
    c.count = 2;
    predict(&m, &c, PLAIT_MODEL_AUTO, &r);
    cr_expect(close_rel(r.time_s, ll.time_s + 6 * k->handoff, 1e-12));
    c.coll = PLAIT_COLL_BROADCAST;
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
    plait_model_machine_free(&m);
    /* two hosts: no CPU LL */
    cr_assert_eq(plait_model_machine_uniform(&m, 8, 2, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, NULL),
                 PLAIT_SUCCESS);
    cr_expect_not(m.ll_ok);
    c.coll = PLAIT_COLL_ALLREDUCE;
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
    plait_model_machine_free(&m);
}

/* msg: a per-slot cost on each end's engine, charged over TCP only. A
 * one-piece exchange between two hosts grows by exactly both ends' msg; the
 * same call on one host over shared memory does not change; LL pays the
 * TCP link's alpha and bytes on one host too (PLAIT_TRANSPORT=socket). */
Test(model, msg_per_piece_over_tcp_only)
{
    struct plait_model_consts k;
    consts_wire_only(&k, 2e-6, 1e-9);
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_uniform(&m, 2, 2, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                 PLAIT_SUCCESS);
    struct plait_model_call c;
    call_one_piece(&c, PLAIT_COLL_ALLREDUCE, 1024, PLAIT_ALGO_ONESHOT);
    const double none = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
    m.k.msg[PLAIT_MLINK_TCP] = 3e-6;
    const double with = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
    cr_expect(close_rel(with - none, 2 * 3e-6, 1e-9), "one piece each way: %.9g -> %.9g (want +6 us)", none, with);
    plait_model_machine_free(&m);
    /* one host, shared memory: msg of TCP changes nothing */
    cr_assert_eq(plait_model_machine_uniform(&m, 2, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, &k),
                 PLAIT_SUCCESS);
    const double shm0 = predict(&m, &c, PLAIT_MODEL_FULL, NULL);
    m.k.msg[PLAIT_MLINK_TCP] = 3e-6;
    cr_expect(close_rel(predict(&m, &c, PLAIT_MODEL_FULL, NULL), shm0, 1e-12));
    /* one host over TCP (PLAIT_TRANSPORT=socket): LL pays the network term
     * (alpha and the bytes; msg is the FIFO path's) */
    m.intra_link = PLAIT_MLINK_TCP;
    m.ll_ok = 1;
    m.ll_max_bytes = 65536;
    struct plait_model_call l;
    plait_model_call_init(&l, PLAIT_COLL_ALLREDUCE, 16, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_LL);
    const double ll3 = predict(&m, &l, PLAIT_MODEL_AUTO, NULL);
    m.k.msg[PLAIT_MLINK_TCP] = 0;
    const double ll0 = predict(&m, &l, PLAIT_MODEL_AUTO, NULL);
    cr_expect(close_rel(ll3, ll0, 1e-12), "LL pays no msg: %.9g, %.9g", ll0, ll3);
    cr_expect(ll0 >= 2e-6 + 72e-9, "LL over TCP on one host pays the link's alpha and bytes: %.9g", ll0);
    plait_model_machine_free(&m);
}

/* --------------------------------------------------------- constants */

static char *tmp_path(const char *tag)
{
    static __thread char buf[256];
    snprintf(buf, sizeof(buf), "/tmp/plait-test-model-%ld-%s.conf", (long)getpid(), tag);
    return buf;
}

Test(model, consts_round_trip)
{
    struct plait_model_consts k, back;
    plait_model_consts_default(&k);
    /* values that need all 17 digits */
    k.alpha[PLAIT_MLINK_SHM] = 1.0 / 3.0 * 1e-6;
    k.gamma[PLAIT_MENGINE_GPU] = 0.1 + 0.2;
    k.handoff = 5e-324;
    const char *path = tmp_path("rt");
    cr_assert_eq(plait_model_consts_save(path, &k, "a test\nwith two lines"), PLAIT_SUCCESS, "%s",
                 plait_last_error_get());
    memset(&back, 0, sizeof(back));
    cr_assert_eq(plait_model_consts_load(path, &back), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_eq(memcmp(&k, &back, sizeof(k)), 0, "the table did not come back bit for bit");
    cr_expect_eq(plait_model_consts_hash(&k), plait_model_consts_hash(&back));
    back.beta[PLAIT_MLINK_NET] *= 1.0000001;
    cr_expect_neq(plait_model_consts_hash(&k), plait_model_consts_hash(&back));
    unlink(path);
}

Test(model, consts_units)
{
    struct plait_model_consts k;
    plait_model_consts_default(&k);
    const char *text = "# calibrated\n"
                       "alpha.shm = 1.5us\n"
                       "beta.net = 25 GB/s   # a rate: 1 / that\n"
                       "\n"
                       "  gamma.cpu=2ns\n"
                       "handoff = 3 ms\n"
                       "call_overhead.gpu = 0.000005\n"
                       "copy_beta.cpu = 500MB/s\n"
                       "ll_call.cpu = 100 ns\r\n";
    cr_assert_eq(plait_model_consts_parse(text, strlen(text), "units", &k), PLAIT_SUCCESS, "%s",
                 plait_last_error_get());
    cr_expect(close_rel(k.alpha[PLAIT_MLINK_SHM], 1.5e-6, 1e-15));
    cr_expect(close_rel(k.beta[PLAIT_MLINK_NET], 1.0 / 25e9, 1e-15));
    cr_expect(close_rel(k.gamma[PLAIT_MENGINE_CPU], 2e-9, 1e-15));
    cr_expect(close_rel(k.handoff, 3e-3, 1e-15));
    cr_expect(close_rel(k.call_overhead[PLAIT_MENGINE_GPU], 5e-6, 1e-15));
    cr_expect(close_rel(k.copy_beta[PLAIT_MENGINE_CPU], 1.0 / 500e6, 1e-15));
    cr_expect(close_rel(k.ll_call[PLAIT_MENGINE_CPU], 1e-7, 1e-15));
}

Test(model, consts_errors)
{
    struct {
        const char *text;
        const char *want; /* in the message */
    } cases[] = {
        {"alpha.shm = 1us\nalpha.bogus = 1us\n", "bad:2:"},
        {"nokey\n", "bad:1:"},
        {"alpha.shm = 1 furlong\n", "unknown unit"},
        {"alpha.shm = nan\n", "not finite"},
        {"alpha.shm = inf\n", "not finite"},
        {"alpha.shm = -1us\n", "negative"},
        {"alpha.shm = 1GB/s\n", "per-byte"},
        {"beta.shm = 0GB/s\n", "forever"},
        {"alpha.shm =\n", "no value"},
        {"alpha.shm = 1e999\n", "range"},
        {"gamma = 1\n", "unknown key"},
        {"alpha.shm = 1us 2us\n", "unknown unit"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct plait_model_consts k, before;
        plait_model_consts_default(&k);
        before = k;
        plait_result_t r = plait_model_consts_parse(cases[i].text, strlen(cases[i].text), "bad", &k);
        cr_expect_eq(r, PLAIT_ERR_INVALID_ARGUMENT, "case %zu accepted", i);
        cr_expect(strstr(plait_last_error_get(), cases[i].want), "case %zu: \"%s\" lacks \"%s\"", i,
                  plait_last_error_get(), cases[i].want);
        cr_expect(strncmp(plait_last_error_get(), "bad:", 4) == 0, "case %zu: %s", i, plait_last_error_get());
        cr_expect_eq(memcmp(&k, &before, sizeof(k)), 0, "case %zu changed the table", i);
    }
    /* an overlong line, a NUL byte, and a file that does not exist */
    char *longline = malloc(4096);
    cr_assert(longline);
    memset(longline, ' ', 4095);
    memcpy(longline, "alpha.shm = 1", 13);
    longline[4095] = '\n';
    struct plait_model_consts k, before;
    plait_model_consts_default(&k);
    before = k;
    cr_expect_eq(plait_model_consts_parse(longline, 4096, "long", &k), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(plait_last_error_get(), "long:1:"), "%s", plait_last_error_get());
    free(longline);
    cr_expect_eq(plait_model_consts_parse("alpha.shm = 1\0x", 15, "nul", &k), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(memcmp(&k, &before, sizeof(k)), 0);
    cr_expect_eq(plait_model_consts_load("/nonexistent/plait.conf", &k), PLAIT_ERR_SYSTEM);
    /* a file with an error names it and the line */
    const char *path = tmp_path("err");
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("# ok\nalpha.net = 10us\nbeta.net = fast\n", f);
    fclose(f);
    cr_expect_eq(plait_model_consts_load(path, &k), PLAIT_ERR_INVALID_ARGUMENT);
    char want[300];
    snprintf(want, sizeof(want), "%s:3:", path);
    cr_expect(strstr(plait_last_error_get(), want), "%s", plait_last_error_get());
    cr_expect_eq(memcmp(&k, &before, sizeof(k)), 0);
    unlink(path);
}

/* Random bytes never crash the parser, and a failed parse leaves *k alone. */
Test(model, consts_fuzz)
{
    unsigned seed = 12345;
    char buf[600];
    for (int it = 0; it < 3000; it++) {
        const size_t len = (size_t)(rand_r(&seed) % (int)sizeof(buf));
        for (size_t i = 0; i < len; i++) {
            static const char alphabet[] = "alpha.shm=1 usGB/\n#e-+.nainf0123456789betagamma_cpu";
            buf[i] = rand_r(&seed) % 8 == 0 ? (char)rand_r(&seed) : alphabet[rand_r(&seed) % (sizeof(alphabet) - 1)];
        }
        struct plait_model_consts k, before;
        plait_model_consts_default(&k);
        before = k;
        if (plait_model_consts_parse(buf, len, "fuzz", &k) != PLAIT_SUCCESS)
            cr_assert_eq(memcmp(&k, &before, sizeof(k)), 0);
        for (int g = 0; g < (int)(sizeof(k) / sizeof(double)); g++) {
            const double v = ((const double *)&k)[g];
            cr_assert(isfinite(v) && v >= 0);
        }
    }
}

/* ------------------------------------------------------------ machines */

/* The DGX H100 of tests/fixtures/topo/dgx-h100.xml, loaded when the fixture
 * can be found, else built here with the same GPUs, NVSwitch and NICs. */
static struct plait_topo *dgx_h100(void)
{
    const char *root = getenv("PLAIT_TEST_FIXTURES");
    const char *cands[3] = {root, "tests/fixtures", "../tests/fixtures"};
    for (int i = 0; i < 3; i++) {
        if (!cands[i])
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/topo/dgx-h100.xml", cands[i]);
        struct plait_topo *t = NULL;
        if (access(path, R_OK) == 0 && plait_topo_load_xml(path, &t) == PLAIT_SUCCESS)
            return t;
    }
    struct plait_topo *t = NULL;
    cr_assert_eq(plait_topo_create(&t), PLAIT_SUCCESS);
    const int nvs = plait_topo_add_node(t, PLAIT_TOPO_NVS, NULL);
    for (int g = 0; g < 8; g++) {
        const int gpu = plait_topo_add_node(t, PLAIT_TOPO_GPU, NULL);
        const int nic = plait_topo_add_node(t, PLAIT_TOPO_NIC, NULL);
        cr_assert(gpu >= 0 && nic >= 0 && nvs >= 0);
        t->nodes[gpu].gpu.sm = 90;
        t->nodes[nic].nic.speed = 400;
        cr_assert_eq(plait_topo_add_link(t, gpu, nvs, PLAIT_LINK_NVL, 18, 450, 0), PLAIT_SUCCESS);
        cr_assert_eq(plait_topo_add_link(t, gpu, nic, PLAIT_LINK_PCI, 16, 63.008, 0), PLAIT_SUCCESS);
    }
    return t;
}

Test(model, machine_from_topo_dgx_h100)
{
    struct plait_topo *t = dgx_h100();
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_from_topo(&m, t, 4, NULL), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_eq(m.nranks, 32);
    cr_expect_eq(m.nhosts, 4);
    cr_expect_eq(m.engine, PLAIT_MENGINE_GPU);
    cr_expect_eq(m.intra_link, PLAIT_MLINK_NVLINK);
    cr_expect_eq(m.inter_link, PLAIT_MLINK_NET);
    cr_expect(close_rel(m.intra_bw, 450e9, 1e-12), "intra_bw %g", m.intra_bw);
    cr_expect(close_rel(m.inter_bw, 50e9, 1e-12), "inter_bw %g", m.inter_bw);
    cr_expect_eq(m.nics_per_host, 8);
    cr_expect_eq(m.norder, 8);
    cr_expect(m.ll_ok);
    /* channel c leaves every host from local index c and enters the next at c + 1 */
    for (int c = 0; c < 8; c++) {
        for (int h = 0; h < 4; h++) {
            const int last = m.order[c * 32 + h * 8 + 7];
            const int next = m.order[c * 32 + ((h + 1) % 4) * 8];
            cr_expect_eq(m.local_of[last], c);
            cr_expect_eq(m.host_of[last], h);
            cr_expect_eq(m.local_of[next], (c + 1) % 8);
        }
        for (int r = 0; r < 32; r++)
            cr_expect_eq(m.order[c * 32 + m.pos[c * 32 + r]], r);
    }
    /* more channels than orders: channel % norder */
    struct plait_model_call c;
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, 64 << 20, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE);
    c.nchannels = 16;
    struct plait_model_result r;
    predict(&m, &c, PLAIT_MODEL_AUTO, &r);
    cr_expect_eq(r.mode, PLAIT_MODEL_REDUCED);
    cr_expect(r.busbw > 10e9 && r.busbw < 450e9, "busbw %g", r.busbw);
    plait_model_machine_free(&m);
    plait_topo_free(t);
}

Test(model, machine_from_topo_cpu_only)
{
    struct plait_topo *t = NULL;
    cr_assert_eq(plait_topo_create(&t), PLAIT_SUCCESS);
    const int cpu = plait_topo_add_node(t, PLAIT_TOPO_CPU, NULL);
    cr_assert(cpu >= 0);
    t->nodes[cpu].cpu.ncores = 96;
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_from_topo(&m, t, 2, NULL), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_eq(m.nranks, 128); /* 64 per host at most */
    cr_expect_eq(m.engine, PLAIT_MENGINE_CPU);
    cr_expect_eq(m.intra_link, PLAIT_MLINK_SHM);
    cr_expect_eq(m.inter_link, PLAIT_MLINK_TCP);
    cr_expect_not(m.ll_ok);
    plait_model_machine_free(&m);
    plait_topo_free(t);
}

Test(model, bus_factors)
{
    cr_expect_eq(plait_model_bus_factor(PLAIT_COLL_ALLREDUCE, 8), 2.0 * 7 / 8);
    cr_expect_eq(plait_model_bus_factor(PLAIT_COLL_ALLGATHER, 8), 7.0 / 8);
    cr_expect_eq(plait_model_bus_factor(PLAIT_COLL_REDUCESCATTER, 4), 3.0 / 4);
    cr_expect_eq(plait_model_bus_factor(PLAIT_COLL_ALLTOALL, 4), 3.0 / 4);
    cr_expect_eq(plait_model_bus_factor(PLAIT_COLL_BROADCAST, 4), 1.0);
    cr_expect_eq(plait_model_bus_factor(PLAIT_COLL_REDUCE, 4), 1.0);
    cr_expect_eq(plait_model_coll_bytes(PLAIT_COLL_ALLREDUCE, 100, 4, 8), 400);
    cr_expect_eq(plait_model_coll_bytes(PLAIT_COLL_ALLGATHER, 100, 4, 8), 3200);
    cr_expect_eq(plait_model_coll_bytes(PLAIT_COLL_REDUCESCATTER, 100, 4, 8), 3200);
    cr_expect_eq(plait_model_coll_bytes(PLAIT_COLL_BROADCAST, 100, 2, 8), 200);
}

Test(model, bad_calls)
{
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_uniform(&m, 4, 1, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, NULL),
                 PLAIT_SUCCESS);
    struct plait_model_call c;
    struct plait_model_result r;
    plait_model_call_init(&c, PLAIT_COLL_ALLGATHER, 100, 4, PLAIT_ALGO_TREE, PLAIT_MPROTO_SIMPLE);
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, 100, 3, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE);
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, 100, 4, PLAIT_ALGO_AUTO, PLAIT_MPROTO_SIMPLE);
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, 100, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE);
    c.nchannels = 0;
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
    c.nchannels = 1;
    c.root = 4;
    cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_model_time(&m, &c, 7, &r), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_model_machine_uniform(&m, 6, 4, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, NULL),
                 PLAIT_ERR_INVALID_ARGUMENT);
    plait_model_machine_free(&m);
}

/* -------------------------------------------------------------- large */

Test(model, large_count_extrapolated)
{
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_uniform(&m, 8, 1, PLAIT_MENGINE_GPU, PLAIT_MLINK_NVLINK, PLAIT_MLINK_NET, NULL),
                 PLAIT_SUCCESS);
    struct plait_model_call c;
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, (8ull << 30) / 4, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE);
    struct plait_model_result r;
    const double t0 = wall();
    predict(&m, &c, PLAIT_MODEL_AUTO, &r);
    const double dt = wall() - t0;
    cr_expect(dt < 1.0, "8 GiB took %.3f s to predict", dt);
    cr_expect(r.extrapolated);
    /* the line through the replayed points: twice the bytes, about twice the time */
    struct plait_model_result half;
    c.count /= 2;
    predict(&m, &c, PLAIT_MODEL_AUTO, &half);
    cr_expect(close_rel(r.time_s - half.time_s, half.time_s, 0.02), "4 GiB %.6g s, 8 GiB %.6g s", half.time_s,
              r.time_s);
    plait_model_machine_free(&m);
}

/* 512 DGX H100 nodes (4096 ranks), ring and hier allreduce of 1 GiB: the
 * reduced replay (host 0's 8 ranks) keeps it well under a second.
 * PLAIT_TEST_MODEL_NODES overrides the node count. */
Test(model, large_cluster_reduced, .timeout = 120)
{
    struct plait_topo *t = dgx_h100();
    const int nodes = getenv("PLAIT_TEST_MODEL_NODES") ? atoi(getenv("PLAIT_TEST_MODEL_NODES")) : 512;
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_from_topo(&m, t, nodes, NULL), PLAIT_SUCCESS, "%s", plait_last_error_get());
    static const int algos[] = {PLAIT_ALGO_RING, PLAIT_ALGO_HIER};
    for (int i = 0; i < 2; i++) {
        struct plait_model_call c;
        plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, (1ull << 30) / 4, 4, algos[i], PLAIT_MPROTO_SIMPLE);
        struct plait_model_result r;
        const double t0 = wall();
        predict(&m, &c, PLAIT_MODEL_AUTO, &r);
        const double dt = wall() - t0;
        cr_expect_eq(r.mode, PLAIT_MODEL_REDUCED);
        cr_expect(dt < 20.0, "%s on %d nodes took %.2f s", plait_algorithms[algos[i]].name, nodes, dt);
        cr_log_info("%s allreduce 1 GiB on %d x 8 H100: %.3f ms, busbw %.1f GB/s, %llu steps, predicted in %.2f s",
                    plait_algorithms[algos[i]].name, nodes, r.time_s * 1e3, r.busbw / 1e9,
                    (unsigned long long)r.steps, dt);
    }
    plait_model_machine_free(&m);
    plait_topo_free(t);
}

/* The other schedules AUTO replays reduced (distances rank +- d, no root):
 * Bruck and PAT allgather/reducescatter, pairwise alltoall, on CPU hosts
 * joined by sockets. */
Test(model, reduced_equals_full_distance_schedules)
{
    static const int algos[] = {PLAIT_ALGO_BRUCK, PLAIT_ALGO_PAT, PLAIT_ALGO_PAIRWISE};
    static const int colls[] = {PLAIT_COLL_ALLGATHER, PLAIT_COLL_REDUCESCATTER, PLAIT_COLL_ALLTOALL};
    for (int H = 2; H <= 8; H *= 2) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_uniform(&m, 4 * H, H, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP,
                                                 NULL),
                     PLAIT_SUCCESS);
        for (size_t ai = 0; ai < 3; ai++) {
            for (size_t ci = 0; ci < 3; ci++) {
                if (!plait_algorithms[algos[ai]].supports(colls[ci], m.nranks))
                    continue;
                for (uint64_t count = 1000; count <= 1000000; count *= 1000) {
                    struct plait_model_call c;
                    plait_model_call_init(&c, colls[ci], count, 4, algos[ai], PLAIT_MPROTO_SIMPLE);
                    struct plait_model_result full, red;
                    predict(&m, &c, PLAIT_MODEL_FULL, &full);
                    predict(&m, &c, PLAIT_MODEL_AUTO, &red);
                    cr_expect_eq(red.mode, PLAIT_MODEL_REDUCED);
                    cr_expect(close_rel(full.time_s, red.time_s, 1e-9), "%s %s %d hosts count %llu: %.12g vs %.12g",
                              plait_algorithms[algos[ai]].name, plait_coll_name(colls[ci]), H,
                              (unsigned long long)count, full.time_s, red.time_s);
                }
            }
        }
        plait_model_machine_free(&m);
    }
}

/* ------------------------------------------------- tiny calls, many ranks */

/* Tiny calls on many DGX H100 nodes: every prediction is finite, positive and
 * below a second (a count below nchannels x nranks x 16 B used to wrap an
 * unsigned difference in the reduced replay's interpolation: 10^13 us). The
 * reduced replay equals the full one where the count splits evenly, and stays
 * close to it (ring) where it is interpolated. */
Test(model, tiny_calls_many_ranks)
{
    struct plait_topo *t = dgx_h100();
    static const int nodes[] = {2, 8, 64, 512};
    static const int colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_REDUCESCATTER};
    static const uint64_t sizes[] = {8, 512, 64 << 10};
    const double t0 = wall();
    for (size_t ni = 0; ni < sizeof(nodes) / sizeof(nodes[0]); ni++) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_from_topo(&m, t, nodes[ni], NULL), PLAIT_SUCCESS);
        for (size_t ci = 0; ci < 3; ci++) {
            for (int algo = 1; algo < PLAIT_ALGO_COUNT; algo++) {
                if (!plait_algorithms[algo].supports(colls[ci], m.nranks))
                    continue;
                for (size_t si = 0; si < 3; si++) {
                    if (nodes[ni] == 512 && algo == PLAIT_ALGO_HIER && (colls[ci] == PLAIT_COLL_ALLREDUCE || si == 2))
                        continue; /* 2 s each: the ring covers the interpolation on 4096 ranks */
                    /* nccl-tests' sizes: allgather/reducescatter per rank = size / ranks, at least one */
                    uint64_t count = sizes[si] / 4;
                    if (colls[ci] != PLAIT_COLL_ALLREDUCE)
                        count = count / (uint64_t)m.nranks ? count / (uint64_t)m.nranks : 1;
                    struct plait_model_call c;
                    plait_model_call_init(&c, colls[ci], count, 4, algo, PLAIT_MPROTO_SIMPLE);
                    c.nchannels = 8;
                    struct plait_model_result red, full;
                    const int has_red = nodes[ni] > 1 &&
                                        plait_model_time(&m, &c, PLAIT_MODEL_REDUCED, &red) == PLAIT_SUCCESS;
                    plait_last_error_clear();
                    if (has_red)
                        cr_expect(isfinite(red.time_s) && red.time_s > 0 && red.time_s < 1.0,
                                  "%s %s %llu B on %d nodes: reduced %.6g s", plait_algorithms[algo].name,
                                  plait_coll_name(colls[ci]), (unsigned long long)sizes[si], nodes[ni], red.time_s);
                    if (nodes[ni] > 64 || (nodes[ni] == 64 && (algo != PLAIT_ALGO_RING || si == 2)))
                        continue; /* the full replays of 4096 ranks and most of 512: seconds each */
                    predict(&m, &c, PLAIT_MODEL_FULL, &full);
                    cr_expect(isfinite(full.time_s) && full.time_s > 0 && full.time_s < 1.0,
                              "%s %s %llu B on %d nodes: full %.6g s", plait_algorithms[algo].name,
                              plait_coll_name(colls[ci]), (unsigned long long)sizes[si], nodes[ni], full.time_s);
                    if (!has_red)
                        continue;
                    const uint64_t g = 8u * (uint64_t)m.nranks * 4u;
                    const int exact = colls[ci] != PLAIT_COLL_ALLREDUCE || count % g == 0;
                    /* interpolated (allreduce counts that do not split evenly): ring within 10%;
                     * hier skips most of its inter-host steps below one element per (host,
                     * channel), which the interpolation from even counts cannot see */
                    const double tol = exact ? 1e-9 : algo == PLAIT_ALGO_RING ? 0.10 : 5.0;
                    cr_expect(close_rel(full.time_s, red.time_s, tol), "%s %s %llu B on %d nodes: full %.9g reduced %.9g",
                              plait_algorithms[algo].name, plait_coll_name(colls[ci]), (unsigned long long)sizes[si],
                              nodes[ni], full.time_s, red.time_s);
                }
            }
        }
        plait_model_machine_free(&m);
    }
    cr_log_info("tiny_calls_many_ranks: %.2f s", wall() - t0);
    plait_topo_free(t);
}

/* ------------------------------------------------------------- GPU LL */

/* LL on a GPU machine is the algorithm's replay with LL's costs: the same
 * time as the simple protocol on a machine whose GPU link alphas are scaled
 * by ll_alpha.gpu / alpha.nvlink, whose per-byte costs are doubled and whose
 * call costs ll_call.gpu. Small calls gain (lower alpha), large ones lose
 * (half the bandwidth); above ll_max_bytes it is refused. The tuner's LL
 * candidate (ring stand-in, one channel) gets the same number. */
Test(model, ll_gpu_is_a_replay)
{
    struct plait_topo *t = dgx_h100();
    static const int nodes[] = {1, 8};
    for (size_t ni = 0; ni < 2; ni++) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_from_topo(&m, t, nodes[ni], NULL), PLAIT_SUCCESS);
        cr_assert(m.ll_ok);
        /* the same machine with LL's constants, by hand */
        struct plait_model_machine lm = m;
        struct plait_model_consts *k = &lm.k;
        const double scale = m.k.ll_alpha[PLAIT_MENGINE_GPU] / m.k.alpha[PLAIT_MLINK_NVLINK];
        k->alpha[PLAIT_MLINK_NVLINK] *= scale;
        k->alpha[PLAIT_MLINK_PCIE] *= scale;
        k->alpha[PLAIT_MLINK_NET] *= scale;
        for (int l = 0; l < PLAIT_MLINK_COUNT; l++)
            k->beta[l] *= 2;
        lm.intra_bw /= 2;
        lm.inter_bw /= 2;
        k->copy_beta[PLAIT_MENGINE_GPU] = fmax(2 * k->copy_beta[PLAIT_MENGINE_GPU], k->ll_beta[PLAIT_MENGINE_GPU]);
        k->gamma[PLAIT_MENGINE_GPU] = fmax(2 * k->gamma[PLAIT_MENGINE_GPU], k->ll_beta[PLAIT_MENGINE_GPU]);
        k->send_beta[PLAIT_MENGINE_GPU] *= 2;
        k->call_overhead[PLAIT_MENGINE_GPU] = m.k.ll_call[PLAIT_MENGINE_GPU];
        static const int colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_BROADCAST};
        for (size_t ci = 0; ci < 3; ci++) {
            for (uint64_t bytes = 8; bytes <= m.ll_max_bytes; bytes *= 64) {
                struct plait_model_call c;
                plait_model_call_init(&c, colls[ci], bytes / 4 ? bytes / 4 : 1, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_LL);
                c.nchannels = 1;
                struct plait_model_result ll, ref, simple;
                predict(&m, &c, PLAIT_MODEL_AUTO, &ll);
                c.proto = PLAIT_MPROTO_SIMPLE;
                predict(&lm, &c, PLAIT_MODEL_AUTO, &ref);
                predict(&m, &c, PLAIT_MODEL_AUTO, &simple);
                cr_expect(close_rel(ll.time_s, ref.time_s, 1e-12), "%s %llu B %d nodes: LL %.9g, by hand %.9g",
                          plait_coll_name(colls[ci]), (unsigned long long)bytes, nodes[ni], ll.time_s, ref.time_s);
                if (bytes == 8)
                    cr_expect(ll.time_s < simple.time_s, "%s 8 B %d nodes: LL %.9g, simple %.9g",
                              plait_coll_name(colls[ci]), nodes[ni], ll.time_s, simple.time_s);
            }
        }
        /* 4 MiB allgather on 8 nodes (64 KiB per rank, LL's largest): LL on
         * one channel forwards (n-1) blocks through one kernel at no more
         * than 1 / ll_beta.gpu (the direct exchange gave every peer at once) */
        struct plait_model_call c;
        if (nodes[ni] > 1) {
            const uint64_t per_rank = (4u << 20) / 4 / (uint64_t)m.nranks;
            plait_model_call_init(&c, PLAIT_COLL_ALLGATHER, per_rank, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_LL);
            c.nchannels = 1;
            struct plait_model_result ll;
            predict(&m, &c, PLAIT_MODEL_AUTO, &ll);
            const double bound = (double)(m.nranks - 1) * (double)(per_rank * 4) * m.k.ll_beta[PLAIT_MENGINE_GPU];
            cr_expect(ll.time_s > bound, "4 MiB allgather: LL %.9g s, the LL rate allows no less than %.9g s",
                      ll.time_s, bound);
        }
        /* above ll_max_bytes: refused */
        plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, m.ll_max_bytes / 4 + 4, 4, PLAIT_ALGO_RING, PLAIT_MPROTO_LL);
        struct plait_model_result r;
        cr_expect_eq(plait_model_time(&m, &c, PLAIT_MODEL_AUTO, &r), PLAIT_ERR_INVALID_ARGUMENT);
        plait_last_error_clear();
        /* the tuner's LL candidate: the ring stand-in (pairwise for alltoall) */
        struct plait_tune_space sp;
        memset(&sp, 0, sizeof(sp));
        sp.allowed[PLAIT_ALGO_RING] = 1;
        sp.max_channels = 8;
        sp.slot_bytes = 128u << 10;
        sp.nslots = 4;
        sp.max_chunk_bytes = 256u << 10;
        sp.radix = 2;
        static const int tcolls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLTOALL, PLAIT_COLL_BARRIER};
        for (size_t ci = 0; ci < 3; ci++) {
            struct plait_tune_candidate cands[PLAIT_ALGO_COUNT * PLAIT_MPROTO_COUNT];
            int nc = 0, best = -1;
            cr_assert_eq(plait_tune_candidates(&m, &sp, tcolls[ci], tcolls[ci] == PLAIT_COLL_BARRIER ? 0 : 64, 4, cands,
                                               (int)(sizeof(cands) / sizeof(cands[0])), &nc, &best),
                         PLAIT_SUCCESS, "%s", plait_last_error_get());
            int has_ll = 0;
            for (int i = 0; i < nc; i++) {
                if (cands[i].choice.proto != PLAIT_MPROTO_LL)
                    continue;
                has_ll = 1;
                const double ts = cands[i].choice.predicted_s;
                cr_expect(isfinite(ts) && ts > 0 && ts < 1e-2, "%s LL on %d nodes: %.6g s",
                          plait_coll_name(tcolls[ci]), nodes[ni], ts);
                /* a barrier is one line per round: more than the call alone on many ranks */
                if (tcolls[ci] == PLAIT_COLL_BARRIER && m.nranks > 1)
                    cr_expect(ts > m.k.ll_call[PLAIT_MENGINE_GPU], "barrier LL %.6g s", ts);
            }
            cr_expect(has_ll, "%s on %d nodes: no LL candidate", plait_coll_name(tcolls[ci]), nodes[ni]);
        }
        plait_model_machine_free(&m);
    }
    plait_topo_free(t);
}

/* ------------------------------------ full replays that stay affordable */

/* The double binary tree's iteration is a chunk of each half: a large tree
 * allreduce is extrapolated (before, with the ring's nranks-chunk iteration,
 * 1 GiB on 4096 ranks replayed 50M steps); Bruck allgather on one channel
 * (one iteration, copy-out split where the rank says) replays reduced and
 * equals the full replay. */
Test(model, affordable_full_and_reduced)
{
    struct plait_topo *t = dgx_h100();
    struct plait_model_machine m;
    cr_assert_eq(plait_model_machine_from_topo(&m, t, 16, NULL), PLAIT_SUCCESS);
    struct plait_model_call c;
    plait_model_call_init(&c, PLAIT_COLL_ALLREDUCE, (1ull << 30) / 4, 4, PLAIT_ALGO_TREE, PLAIT_MPROTO_SIMPLE);
    c.nchannels = 8;
    c.chunk_bytes = 256u << 10;
    struct plait_model_result r;
    double t0 = wall();
    predict(&m, &c, PLAIT_MODEL_AUTO, &r);
    const double dt = wall() - t0;
    cr_expect(r.extrapolated);
    cr_expect(dt < 2.0, "tree allreduce 1 GiB on 128 ranks: %.2f s", dt);
    cr_expect(r.busbw > 1e9 && r.busbw < 450e9, "busbw %g", r.busbw);
    /* periodic: the extrapolated time of 2 GiB is twice the per-iteration part of 1 GiB */
    struct plait_model_result r2;
    c.count *= 2;
    predict(&m, &c, PLAIT_MODEL_AUTO, &r2);
    cr_expect(r2.time_s > 1.9 * r.time_s && r2.time_s < 2.05 * r.time_s, "1 GiB %.6g s, 2 GiB %.6g s", r.time_s,
              r2.time_s);
    for (int ch = 1; ch <= 2; ch++) {
        plait_model_call_init(&c, PLAIT_COLL_ALLGATHER, 65536, 4, PLAIT_ALGO_BRUCK, PLAIT_MPROTO_SIMPLE);
        c.nchannels = ch;
        struct plait_model_result full, red;
        predict(&m, &c, PLAIT_MODEL_FULL, &full);
        predict(&m, &c, PLAIT_MODEL_REDUCED, &red);
        cr_expect(close_rel(full.time_s, red.time_s, 1e-9), "bruck %d channels: full %.12g reduced %.12g", ch,
                  full.time_s, red.time_s);
    }
    plait_model_machine_free(&m);
    plait_topo_free(t);
}
