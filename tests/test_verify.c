/* The schedule verifier (algorithms/verify.c): the ring is proved right for
 * every collective on many rank counts and chunkings, and deliberately broken
 * generators written here are caught, each with the finding it deserves.
 *
 * The broken generators are small wrappers around plait_ring_step (or a few
 * hand-written steps) so that each one breaks exactly one thing. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "algorithms/algorithms.h"
#include "algorithms/schedule.h"
#include "algorithms/verify.h"

/* ---------------------------------------------------------------- helpers */

/* A config shaped like the library's: chunk at most half the FIFO, 16-byte
 * aligned (core/enqueue.c, sched_args). */
static struct plait_verify_config config(plait_step_fn gen, int coll, int nranks, uint64_t count, int nchannels,
                                         uint64_t piece, uint32_t slots, uint64_t chunk, int type_bytes)
{
    struct plait_verify_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.gen = gen;
    cfg.args.coll = coll;
    cfg.args.nranks = nranks;
    cfg.args.count = count;
    cfg.args.nchannels = nchannels;
    cfg.args.align_elems = 16 / (uint64_t)type_bytes;
    cfg.args.chunk_elems = chunk;
    cfg.piece_elems = piece;
    cfg.fifo_slots = slots;
    cfg.max_reports = 16;
    return cfg;
}

static uint64_t clamp_chunk(uint64_t chunk, uint64_t piece, uint32_t slots, uint64_t align)
{
    const uint64_t half = (uint64_t)(slots / 2) * piece;
    if (chunk > half)
        chunk = half;
    chunk = chunk / align * align;
    return chunk > align ? chunk : align;
}

static struct plait_verify_result run(const struct plait_verify_config *cfg)
{
    struct plait_verify_result r;
    plait_result_t res = plait_sched_verify(cfg, &r);
    cr_assert_eq(res, PLAIT_SUCCESS, "plait_sched_verify failed: %s", plait_last_error_get());
    return r;
}

static void dump(const struct plait_verify_result *r)
{
    for (size_t i = 0; i < r->nfindings; i++)
        cr_log_info("[%s] %s", plait_verify_kind_name(r->findings[i].kind), r->findings[i].text);
}

/* Whether some stored finding of `kind` contains `needle`. */
static int has_finding(const struct plait_verify_result *r, int kind, const char *needle)
{
    for (size_t i = 0; i < r->nfindings; i++)
        if (r->findings[i].kind == kind && strstr(r->findings[i].text, needle))
            return 1;
    return 0;
}

static const char *coll_str(int coll)
{
    switch (coll) {
    case PLAIT_COLL_ALLREDUCE:
        return "allreduce";
    case PLAIT_COLL_REDUCESCATTER:
        return "reducescatter";
    case PLAIT_COLL_ALLGATHER:
        return "allgather";
    case PLAIT_COLL_BROADCAST:
        return "broadcast";
    case PLAIT_COLL_REDUCE:
        return "reduce";
    default:
        return "barrier";
    }
}

static void expect_ok(const struct plait_verify_config *cfg)
{
    struct plait_verify_result r = run(cfg);
    if (!r.is_ok)
        dump(&r);
    cr_expect(r.is_ok,
              "ring %s, %d ranks, count %" PRIu64 ", %d channels, piece %" PRIu64 ", %u slots, chunk %" PRIu64
              ", root %d, in place %d: %" PRIu64 " findings",
              coll_str(cfg->args.coll), cfg->args.nranks, cfg->args.count, cfg->args.nchannels, cfg->piece_elems,
              cfg->fifo_slots, cfg->args.chunk_elems, cfg->args.root, cfg->is_inplace, r.total);
    plait_verify_result_free(&r);
}

static const int all_colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_REDUCESCATTER, PLAIT_COLL_ALLGATHER,
                                PLAIT_COLL_BROADCAST, PLAIT_COLL_REDUCE, PLAIT_COLL_BARRIER};

/* ---------------------------------------------------------------- the ring is right */

Test(verify, ring_every_collective_many_ranks)
{
    static const int ranks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 32, 33, 64};
    static const uint64_t counts[] = {0, 1, 7, 100, 1000, 4099};
    for (size_t ci = 0; ci < sizeof(all_colls) / sizeof(all_colls[0]); ci++)
        for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++)
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
                const int n = ranks[ri];
                /* 4-byte elements, 64-byte slots (16 elements), 4 slots, the
                 * library's clamp: chunk = half the FIFO */
                struct plait_verify_config cfg =
                    config(plait_ring_step, all_colls[ci], n, counts[k], 2, 16, 4, clamp_chunk(1 << 20, 16, 4, 4), 4);
                cfg.args.root = (int)(k * 5) % n;
                expect_ok(&cfg);
            }
}

Test(verify, ring_chunkings_and_in_place)
{
    /* {slots, piece, chunk before the clamp, type bytes, channels} */
    static const struct {
        uint32_t slots;
        uint64_t piece, chunk;
        int tb, nch;
    } shapes[] = {
        {2, 32, 1 << 20, 2, 1},  /* 2 slots: chunk = one piece */
        {8, 16, 48, 4, 3},       /* piece < chunk < half the FIFO */
        {8, 64, 1 << 20, 1, 2},  /* chunk = half the FIFO, 4 pieces */
        {3, 8, 1 << 20, 8, 2},   /* an odd FIFO depth */
        {4, 24, 40, 4, 1},       /* chunk not a multiple of the piece */
    };
    static const int ranks[] = {1, 2, 3, 5, 8, 13};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (size_t ci = 0; ci < sizeof(all_colls) / sizeof(all_colls[0]); ci++)
            for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    const uint64_t align = 16 / (uint64_t)shapes[s].tb;
                    struct plait_verify_config cfg =
                        config(plait_ring_step, all_colls[ci], ranks[ri], 5003, shapes[s].nch, shapes[s].piece,
                               shapes[s].slots, clamp_chunk(shapes[s].chunk, shapes[s].piece, shapes[s].slots, align),
                               shapes[s].tb);
                    cfg.args.root = ranks[ri] - 1;
                    cfg.is_inplace = inplace;
                    expect_ok(&cfg);
                }
}

Test(verify, ring_large_rank_counts)
{
    for (size_t ci = 0; ci < sizeof(all_colls) / sizeof(all_colls[0]); ci++) {
        struct plait_verify_config cfg = config(plait_ring_step, all_colls[ci], 1024, 7, 1, 16, 4, 32, 4);
        cfg.args.root = 1000;
        expect_ok(&cfg);
        cfg = config(plait_ring_step, all_colls[ci], 96, 1000003, 2, 2048, 4, 4096, 4);
        cfg.args.root = 95;
        expect_ok(&cfg);
    }
}

/* The cost follows the steps, not the elements: 2^32+5 elements with pieces
 * scaled to match take exactly the steps that 7 elements take. */
Test(verify, cost_does_not_grow_with_count)
{
    const uint64_t big = (1ull << 32) + 5;
    for (size_t ci = 0; ci < 5; ci++) {
        const int n = 64;
        struct plait_verify_config small = config(plait_ring_step, all_colls[ci], n, 7, 1, 16, 4, 32, 4);
        /* one iteration either way: the chunk covers the whole range */
        const uint64_t piece = (big + 1) / 2 / 4 * 4 + 4;
        struct plait_verify_config large = config(plait_ring_step, all_colls[ci], n, big, 1, piece, 4, 2 * piece, 4);
        struct plait_verify_result rs = run(&small), rl = run(&large);
        cr_expect(rs.is_ok && rl.is_ok, "%s: small ok %d, large ok %d", coll_str(all_colls[ci]), rs.is_ok, rl.is_ok);
        cr_expect_eq(rs.steps, rl.steps, "%s: %" PRIu64 " steps for 7 elements, %" PRIu64 " for 2^32+5",
                     coll_str(all_colls[ci]), rs.steps, rl.steps);
        cr_expect_leq(rl.batches, 2 * rl.steps + 1, "%s: %" PRIu64 " batches for %" PRIu64 " steps",
                      coll_str(all_colls[ci]), rl.batches, rl.steps);
        plait_verify_result_free(&rs);
        plait_verify_result_free(&rl);
    }
}

/* ---------------------------------------------------------------- broken generators */

/* Ring allreduce in which rank 1 forwards what it receives at step 1 of every
 * iteration without adding its own input: its contribution to that chunk is
 * lost. */
static int ring_skip_reduce(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!plait_ring_step(a, channel, idx, out))
        return 0;
    if (a->rank == 1 && idx % (2 * (uint64_t)a->nranks - 1) == 1 && out->kind == PLAIT_STEP_RECV_REDUCE_SEND) {
        out->kind = PLAIT_STEP_RECV_COPY_SEND;
        out->dst_buf = PLAIT_BUF_SCRATCH;
        out->flags = 0;
    }
    return 1;
}

static uint64_t scratch_1000(const struct plait_sched_args *a)
{
    (void)a;
    return 1000;
}

Test(verify, missing_contribution_reported)
{
    struct plait_verify_config cfg = config(ring_skip_reduce, PLAIT_COLL_ALLREDUCE, 4, 1000, 1, 16, 4, 32, 4);
    cfg.scratch = scratch_1000;
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_gt(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 0);
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "missing the contribution of rank 1"));
    /* nothing else is wrong: no deadlock, nothing left over */
    cr_expect_eq(r.total, r.counts[PLAIT_VERIFY_WRONG_OUTPUT]);
    plait_verify_result_free(&r);
}

/* One rank: the input is copied with the pre-op, then the pre-op and the
 * post-op are applied again in place: pre twice. */
static int pre_twice(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (channel > 0 || idx > 1)
        return 0;
    memset(out, 0, sizeof(*out));
    out->kind = PLAIT_STEP_COPY;
    out->src_buf = idx == 0 ? PLAIT_BUF_INPUT : PLAIT_BUF_OUTPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->flags = idx == 0 ? PLAIT_STEP_PRE : PLAIT_STEP_PRE | PLAIT_STEP_POST;
    out->count = a->count;
    return 1;
}

Test(verify, pre_applied_twice_reported)
{
    struct plait_verify_config cfg = config(pre_twice, PLAIT_COLL_ALLREDUCE, 1, 100, 1, 16, 4, 32, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "pre-op applied 2 times to rank 0's contribution"));
    plait_verify_result_free(&r);
}

/* Two ranks, hand-written: rank 1 adds its input to rank 0's and sends the sum
 * back; rank 0 adds (with the pre-op) its own input again, finalises and
 * returns the result: rank 0 is counted twice. */
static int dup_contribution(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (channel > 0 || idx > 1)
        return 0;
    memset(out, 0, sizeof(*out));
    out->count = a->count;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->send_peer = out->recv_peer = 1 - a->rank;
    if (a->rank == 0) {
        out->kind = idx == 0 ? PLAIT_STEP_SEND : PLAIT_STEP_RECV_REDUCE_COPY_SEND;
        out->flags = idx == 0 ? PLAIT_STEP_PRE : PLAIT_STEP_PRE | PLAIT_STEP_POST;
    } else {
        out->kind = idx == 0 ? PLAIT_STEP_RECV_REDUCE_SEND : PLAIT_STEP_RECV;
        out->flags = idx == 0 ? PLAIT_STEP_PRE : 0;
    }
    return 1;
}

Test(verify, duplicated_contribution_reported)
{
    struct plait_verify_config cfg = config(dup_contribution, PLAIT_COLL_ALLREDUCE, 2, 40, 1, 16, 4, 32, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 2); /* both ranks' outputs */
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "duplicated contribution of rank 0"));
    plait_verify_result_free(&r);
}

/* The real bug: a chunk as large as the whole FIFO on two ranks. Every rank
 * fills its neighbour's FIFO at step 0, then holds a received piece while it
 * waits for credit from the neighbour, which does the same. */
Test(verify, chunk_equal_to_fifo_deadlocks_by_credit)
{
    const uint64_t piece = 16;
    const uint32_t slots = 4;
    struct plait_verify_config cfg =
        config(plait_ring_step, PLAIT_COLL_ALLREDUCE, 2, 1000, 1, piece, slots, piece * slots, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_CREDIT_DEADLOCK], 2, "both ranks wait for credit from each other");
    cr_expect_eq(r.counts[PLAIT_VERIFY_NO_MATCHING_SEND], 0);
    cr_expect_eq(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 0, "a run that did not finish has no output to check");
    cr_expect(has_finding(&r, PLAIT_VERIFY_CREDIT_DEADLOCK, "waits for credit from rank 1"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_CREDIT_DEADLOCK, "credit exhaustion"));
    cr_expect_eq(r.stuck_tasks, 2);
    plait_verify_result_free(&r);

    /* the fix (the chunk clamped to half the FIFO) */
    cfg.args.chunk_elems = clamp_chunk(piece * slots, piece, slots, 4);
    expect_ok(&cfg);
}

/* Broadcast whose root never sends: its first successor waits for data that
 * never comes (the root finished), the others wait behind it. */
static int root_never_sends(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (a->rank != a->root)
        return plait_ring_step(a, channel, idx, out);
    /* only the root's local copies (every second step of its schedule) */
    return plait_ring_step(a, channel, 2 * idx + 1, out);
}

Test(verify, receive_without_send_reported)
{
    struct plait_verify_config cfg = config(root_never_sends, PLAIT_COLL_BROADCAST, 5, 1000, 1, 16, 4, 32, 4);
    cfg.args.root = 2;
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_NO_MATCHING_SEND], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_NO_MATCHING_SEND, "rank 3 channel 0 step 0"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_NO_MATCHING_SEND, "rank 2 finished its schedule"));
    cr_expect_eq(r.counts[PLAIT_VERIFY_BLOCKED_BEHIND], 3, "ranks 4, 0 and 1 wait behind rank 3");
    cr_expect_eq(r.counts[PLAIT_VERIFY_CREDIT_DEADLOCK] + r.counts[PLAIT_VERIFY_CIRCULAR_WAIT], 0);
    plait_verify_result_free(&r);
}

/* Two ranks: rank 0 waits on rank 1, which still has steps but none of them
 * sends to rank 0 (it only sends the other way and then stops). */
static int never_sends_back(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (channel > 0)
        return 0;
    memset(out, 0, sizeof(*out));
    out->count = 16;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->send_peer = out->recv_peer = 1 - a->rank;
    if (a->rank == 0) {
        if (idx > 0)
            return 0;
        out->kind = PLAIT_STEP_RECV;
        return 1;
    }
    /* rank 1 waits for rank 0 first (a receive rank 0 never matches either) */
    if (idx > 1)
        return 0;
    out->kind = idx == 0 ? PLAIT_STEP_RECV : PLAIT_STEP_SEND;
    return 1;
}

Test(verify, receive_from_a_rank_that_never_sends_reported)
{
    struct plait_verify_config cfg = config(never_sends_back, PLAIT_COLL_BROADCAST, 2, 16, 1, 16, 4, 16, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    /* rank 1 waits for rank 0, which is not finished but will never send: the
     * cause; rank 0 waits for rank 1's later send: stuck behind it */
    cr_expect_eq(r.counts[PLAIT_VERIFY_NO_MATCHING_SEND], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_NO_MATCHING_SEND, "rank 0 never sends to it again"));
    cr_expect_eq(r.counts[PLAIT_VERIFY_BLOCKED_BEHIND], 1);
    cr_expect_eq(r.counts[PLAIT_VERIFY_CREDIT_DEADLOCK] + r.counts[PLAIT_VERIFY_CIRCULAR_WAIT], 0);
    plait_verify_result_free(&r);
}

/* Broadcast whose root sends each chunk as two half-chunk steps: the pieces
 * are cut differently on the two ends (P, P/2, P, P/2 against P, P, P). */
static int split_sends(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (a->rank != a->root)
        return plait_ring_step(a, channel, idx, out);
    /* the root's schedule is (SEND, COPY) per chunk; make it (SEND, SEND, COPY) */
    if (!plait_ring_step(a, channel, idx / 3 * 2 + (idx % 3 == 2), out))
        return 0;
    if (out->kind == PLAIT_STEP_SEND) {
        const uint64_t half = out->count / 2;
        if (idx % 3 == 0) {
            out->count = half;
        } else {
            out->src_off += half;
            out->count -= half;
        }
    }
    return 1;
}

Test(verify, piece_mismatch_reported)
{
    /* chunk = 3 pieces of 16: the root sends 24 + 24 elements as 16, 8, 16, 8 */
    struct plait_verify_config cfg = config(split_sends, PLAIT_COLL_BROADCAST, 3, 480, 1, 16, 8, 48, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_MISMATCH], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_MISMATCH, "should hold 16 elements but rank 0 sent 8"));
    /* everything after the failed receive is stuck behind it */
    cr_expect_eq(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 0);
    plait_verify_result_free(&r);
}

/* Ring allreduce in which rank 0 sends from SCRATCH at step 0, before anything
 * wrote it. */
static int reads_scratch_first(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!plait_ring_step(a, channel, idx, out))
        return 0;
    if (a->rank == 0 && idx == 0)
        out->src_buf = PLAIT_BUF_SCRATCH;
    return 1;
}

static uint64_t scratch_96(const struct plait_sched_args *a)
{
    (void)a;
    return 96;
}

Test(verify, scratch_read_before_write_reported)
{
    struct plait_verify_config cfg = config(reads_scratch_first, PLAIT_COLL_ALLREDUCE, 3, 96, 1, 16, 4, 32, 4);
    cfg.scratch = scratch_96;
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_UNWRITTEN_READ], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_UNWRITTEN_READ, "rank 0 channel 0 step 0 (SEND): reads SCRATCH["));
    /* the garbage reaches the chunk's final value on every rank */
    cr_expect_eq(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 3);
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "read before anything wrote it"));
    plait_verify_result_free(&r);
}

/* An OUTPUT used as a source before it was written is the same mistake. */
static int reads_output_first(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!plait_ring_step(a, channel, idx, out))
        return 0;
    if (a->rank == 1 && out->kind == PLAIT_STEP_RECV_REDUCE_SEND)
        out->src_buf = PLAIT_BUF_OUTPUT;
    return 1;
}

Test(verify, output_read_before_write_reported)
{
    struct plait_verify_config cfg = config(reads_output_first, PLAIT_COLL_ALLREDUCE, 4, 128, 1, 16, 4, 32, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_gt(r.counts[PLAIT_VERIFY_UNWRITTEN_READ], 0);
    cr_expect(has_finding(&r, PLAIT_VERIFY_UNWRITTEN_READ, "reads OUTPUT["));
    plait_verify_result_free(&r);
}

/* Peers equal to self and out of range. */
static int bad_peers(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!plait_ring_step(a, channel, idx, out))
        return 0;
    if (a->rank == 0 && idx == 0)
        out->send_peer = 0;
    if (a->rank == 2 && idx == 1)
        out->recv_peer = a->nranks;
    return 1;
}

Test(verify, bad_peers_reported)
{
    struct plait_verify_config cfg = config(bad_peers, PLAIT_COLL_ALLREDUCE, 4, 1000, 1, 16, 4, 32, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_BAD_PEER], 2);
    cr_expect(has_finding(&r, PLAIT_VERIFY_BAD_PEER, "send_peer 0 is the rank itself"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_BAD_PEER, "recv_peer 4 is out of range"));
    plait_verify_result_free(&r);
}

/* A peer the communicator has no connection to: the ring's connections are the
 * neighbours only. */
static int ring_neighbours(int nranks, int rank, int radix, int *out, int max)
{
    return plait_algorithms[PLAIT_ALGO_RING].peers(nranks, rank, radix, out, max);
}

static int skips_a_rank(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!plait_ring_step(a, channel, idx, out))
        return 0;
    if (a->rank == 0 && out->kind == PLAIT_STEP_SEND)
        out->send_peer = 2;
    return 1;
}

Test(verify, unconnected_peer_reported)
{
    struct plait_verify_config cfg = config(skips_a_rank, PLAIT_COLL_ALLREDUCE, 5, 1000, 1, 16, 4, 32, 4);
    cfg.peers = ring_neighbours;
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_expect_eq(r.counts[PLAIT_VERIFY_BAD_PEER], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_BAD_PEER, "send_peer 2 is not connected"));
    plait_verify_result_free(&r);
    cfg.gen = plait_ring_step;
    expect_ok(&cfg);
}

/* Rank 0 sends one piece nobody receives. */
static int stray_send(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (plait_ring_step(a, channel, idx, out))
        return 1;
    if (a->rank != 0 || channel != 0)
        return 0;
    /* one step past the end of rank 0's ring schedule */
    struct plait_step probe;
    if (idx == 0 || !plait_ring_step(a, channel, idx - 1, &probe))
        return 0;
    memset(out, 0, sizeof(*out));
    out->kind = PLAIT_STEP_SEND;
    out->send_peer = 1;
    out->count = 5;
    return 1;
}

Test(verify, leftover_message_reported)
{
    struct plait_verify_config cfg = config(stray_send, PLAIT_COLL_ALLGATHER, 3, 40, 1, 16, 4, 32, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_LEFTOVER], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_LEFTOVER, "rank 0 -> rank 1 channel 0: 1 piece (5 elements)"));
    cr_expect_eq(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 0, "the outputs themselves are right");
    plait_verify_result_free(&r);
}

/* Allgather whose receives land one block off on rank 2. */
static int wrong_block(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!plait_ring_step(a, channel, idx, out))
        return 0;
    if (a->rank == 2 && out->kind == PLAIT_STEP_RECV)
        out->dst_off = (out->dst_off + a->count) % ((uint64_t)a->nranks * a->count);
    return 1;
}

Test(verify, wrong_placement_reported)
{
    struct plait_verify_config cfg = config(wrong_block, PLAIT_COLL_ALLGATHER, 4, 64, 1, 16, 4, 32, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "rank 2 OUTPUT["));
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "never written") ||
              has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "instead of rank"));
    plait_verify_result_free(&r);
}

/* Two channels writing the same output range. */
static int channels_overlap(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    struct plait_sched_args one = *a;
    (void)channel;
    one.nchannels = 1; /* every channel walks the whole range, as channel 0 of 1 */
    return plait_ring_step(&one, 0, idx, out);
}

Test(verify, cross_channel_race_reported)
{
    struct plait_verify_config cfg = config(channels_overlap, PLAIT_COLL_BROADCAST, 3, 100, 2, 16, 4, 32, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_gt(r.counts[PLAIT_VERIFY_RACE], 0);
    plait_verify_result_free(&r);
}

Test(verify, bad_config_rejected)
{
    struct plait_verify_result r;
    struct plait_verify_config cfg = config(plait_ring_step, PLAIT_COLL_ALLREDUCE, 4, 100, 1, 16, 4, 32, 4);
    cfg.piece_elems = 0;
    cr_expect_eq(plait_sched_verify(&cfg, &r), PLAIT_ERR_INVALID_ARGUMENT);
    cfg = config(plait_ring_step, PLAIT_COLL_SEND, 4, 100, 1, 16, 4, 32, 4);
    cr_expect_eq(plait_sched_verify(&cfg, &r), PLAIT_ERR_INVALID_ARGUMENT);
    cfg = config(plait_ring_step, PLAIT_COLL_REDUCE, 4, 100, 1, 16, 4, 32, 4);
    cfg.args.root = 4;
    cr_expect_eq(plait_sched_verify(&cfg, &r), PLAIT_ERR_INVALID_ARGUMENT);
    cfg = config(NULL, PLAIT_COLL_REDUCE, 4, 100, 1, 16, 4, 32, 4);
    cr_expect_eq(plait_sched_verify(&cfg, &r), PLAIT_ERR_INVALID_ARGUMENT);
}

/* An endless generator stops at max_steps instead of hanging. */
static int endless(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    (void)a;
    (void)channel;
    (void)idx;
    memset(out, 0, sizeof(*out));
    out->kind = PLAIT_STEP_COPY;
    return 1;
}

Test(verify, endless_schedule_stops)
{
    struct plait_verify_config cfg = config(endless, PLAIT_COLL_ALLREDUCE, 2, 100, 1, 16, 4, 32, 4);
    cfg.max_steps = 10000;
    struct plait_verify_result r = run(&cfg);
    cr_expect_eq(r.counts[PLAIT_VERIFY_LIMIT], 1);
    cr_expect_eq(r.steps, 10000);
    plait_verify_result_free(&r);
}

/* Direct allreduce on 3 ranks: every rank sends its input to both others and
 * adds what it receives to its own, in arrival order, so rank r computes
 * (x_r + x_{r-1}) + x_{r-2}. Every result holds every input once, but the
 * association differs from rank to rank: the ranks may not get the same bits. */
static int direct_allreduce(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int n = a->nranks, r = a->rank;
    if (channel > 0 || idx > 3)
        return 0;
    memset(out, 0, sizeof(*out));
    out->count = a->count;
    out->src_buf = idx == 3 ? PLAIT_BUF_OUTPUT : PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    switch (idx) {
    case 0:
    case 1:
        out->kind = PLAIT_STEP_SEND;
        out->flags = PLAIT_STEP_PRE;
        out->send_peer = (r + 1 + (int)idx) % n;
        break;
    case 2:
        out->kind = PLAIT_STEP_RECV_REDUCE_COPY;
        out->flags = PLAIT_STEP_PRE;
        out->recv_peer = (r + n - 1) % n;
        break;
    default:
        out->kind = PLAIT_STEP_RECV_REDUCE_COPY;
        out->flags = PLAIT_STEP_POST;
        out->recv_peer = (r + n - 2) % n;
        break;
    }
    return 1;
}

Test(verify, different_reduction_orders_reported)
{
    struct plait_verify_config cfg = config(direct_allreduce, PLAIT_COLL_ALLREDUCE, 3, 100, 1, 16, 8, 32, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_expect_eq(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 0, "each result holds every input once");
    cr_expect_eq(r.counts[PLAIT_VERIFY_DIVERGENT], 2, "ranks 1 and 2 associate differently from rank 0");
    cr_expect(has_finding(&r, PLAIT_VERIFY_DIVERGENT, "rank 1 OUTPUT[0, 100): reduced in another order"));
    plait_verify_result_free(&r);
}

/* ---------------------------------------------------------------- SENDRECV */

/* The two halves of a SENDRECV step move independently (schedule.h): these
 * generators exchange with it, right and broken. All are allgathers on one
 * channel whose steps ignore the chunking: step 0 copies the input into the
 * rank's own block of the output, the rest exchange blocks. */

static void own_block_copy(const struct plait_sched_args *a, struct plait_step *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = PLAIT_STEP_COPY;
    out->src_buf = PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->dst_off = (uint64_t)a->rank * a->count;
    out->count = a->count;
    out->send_peer = out->recv_peer = -1;
}

static void sendrecv_blocks(const struct plait_sched_args *a, struct plait_step *out, int send_peer,
                            uint64_t send_block, int recv_peer, uint64_t recv_block, uint64_t nblocks)
{
    memset(out, 0, sizeof(*out));
    out->kind = PLAIT_STEP_SENDRECV;
    out->src_buf = PLAIT_BUF_OUTPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->send_peer = send_peer;
    out->recv_peer = recv_peer;
    out->src_off = send_block * a->count;
    out->dst_off = recv_block * a->count;
    out->count = nblocks * a->count;
}

/* Ring allgather as n-1 SENDRECV steps: at step s rank r passes block
 * r-s+1 on to r+1 while it takes block r-s from r-1. Any rank count. */
static int ring_sendrecv(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int n = a->nranks, r = a->rank;
    if (channel > 0 || idx >= (uint64_t)n)
        return 0;
    if (idx == 0) {
        own_block_copy(a, out);
        return 1;
    }
    const int s = (int)idx;
    sendrecv_blocks(a, out, (r + 1) % n, (uint64_t)((r - s + 1 + n) % n), (r + n - 1) % n,
                    (uint64_t)((r - s + n) % n), 1);
    return 1;
}

/* Recursive doubling allgather (power-of-two rank counts): at step k rank r
 * swaps the 2^(k-1) blocks it holds with rank r ^ 2^(k-1), both halves at
 * once in one SENDRECV per step. */
static int rd_sendrecv(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int n = a->nranks, r = a->rank;
    if (channel > 0)
        return 0;
    if (idx == 0) {
        own_block_copy(a, out);
        return 1;
    }
    const int d = 1 << (idx - 1);
    if (d >= n)
        return 0;
    const int peer = r ^ d;
    sendrecv_blocks(a, out, peer, (uint64_t)(r & ~(d - 1)), peer, (uint64_t)(peer & ~(d - 1)), (uint64_t)d);
    return 1;
}

static int rd_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    int cnt = 0;
    for (int d = 1; d < nranks && cnt < max; d *= 2)
        out[cnt++] = rank ^ d;
    return cnt;
}

Test(verify, sendrecv_exchanges_verify)
{
    static const uint64_t counts[] = {0, 1, 7, 16, 100, 1000};
    for (int n = 1; n <= 16; n++)
        for (uint32_t slots = 1; slots <= 4; slots++)
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
                for (int inplace = 0; inplace < 2; inplace++)
                    for (int g = 0; g < 2; g++) {
                        const int pow2 = (n & (n - 1)) == 0;
                        if (g == 1 && !pow2)
                            continue;
                        struct plait_verify_config cfg = config(g ? rd_sendrecv : ring_sendrecv, PLAIT_COLL_ALLGATHER,
                                                                n, counts[k], 1, 16, slots, 16, 4);
                        cfg.peers = g ? rd_peers : ring_neighbours;
                        cfg.is_inplace = inplace;
                        struct plait_verify_result r = run(&cfg);
                        if (!r.is_ok)
                            dump(&r);
                        cr_expect(r.is_ok,
                                  "%s allgather, %d ranks, count %" PRIu64 ", %u slots, in place %d: %" PRIu64
                                  " findings",
                                  g ? "recursive doubling" : "ring", n, counts[k], slots, inplace, r.total);
                        plait_verify_result_free(&r);
                    }
}

/* Rank 1 exchanges one element fewer at step 1: it cuts what it receives
 * from rank 0 differently (the last piece), and so does rank 2 with what rank
 * 1 sends it. */
static int sendrecv_short(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!ring_sendrecv(a, channel, idx, out))
        return 0;
    if (a->rank == 1 && idx == 1)
        out->count--;
    return 1;
}

Test(verify, sendrecv_count_mismatch_reported)
{
    /* 3 full pieces of 16 and one of 5; rank 1 expects one of 4 */
    struct plait_verify_config cfg = config(sendrecv_short, PLAIT_COLL_ALLGATHER, 4, 53, 1, 16, 2, 16, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_gt(r.counts[PLAIT_VERIFY_MISMATCH], 0);
    cr_expect(has_finding(&r, PLAIT_VERIFY_MISMATCH,
                          "rank 1 channel 0 step 1 (SENDRECV, count 52): piece 3 should hold 4 elements but rank 0 "
                          "sent 5 (its step 1, SENDRECV)"));
    cr_expect_eq(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 0, "a run that did not finish has no output to check");
    plait_verify_result_free(&r);
}

/* Rank 0 sends its step-1 block to rank 2 instead of rank 1. */
static int sendrecv_wrong_peer(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!ring_sendrecv(a, channel, idx, out))
        return 0;
    if (a->rank == 0 && idx == 1)
        out->send_peer = 2;
    return 1;
}

Test(verify, sendrecv_wrong_peer_reported)
{
    /* one piece per block: the stray piece fits in rank 2's FIFO from rank 0
     * and stays there; rank 1 takes rank 0's later blocks one step early and
     * waits in its last step for one more that never comes */
    struct plait_verify_config cfg = config(sendrecv_wrong_peer, PLAIT_COLL_ALLGATHER, 4, 16, 1, 16, 4, 16, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_LEFTOVER], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_LEFTOVER, "rank 0 -> rank 2 channel 0: 1 piece (16 elements) sent from "
                                                     "step 1 (SENDRECV)"));
    cr_expect_eq(r.counts[PLAIT_VERIFY_NO_MATCHING_SEND], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_NO_MATCHING_SEND, "rank 1 channel 0 step 3 (SENDRECV, 16 of 16 elements "
                                                             "sent, 0 received) waits for data from rank 0"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_NO_MATCHING_SEND, "rank 0 finished its schedule"));
    plait_verify_result_free(&r);

    /* more pieces than rank 2's FIFO holds: rank 0 waits for credit that
     * never comes back */
    cfg = config(sendrecv_wrong_peer, PLAIT_COLL_ALLGATHER, 4, 100, 1, 16, 2, 16, 4);
    r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_NO_MATCHING_RECV], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_NO_MATCHING_RECV, "rank 0 channel 0 step 1 (SENDRECV"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_NO_MATCHING_RECV, "waits for credit from rank 2"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_NO_MATCHING_RECV, "rank 2 never receives from it again"));
    plait_verify_result_free(&r);
}

/* Two ranks. Rank 0 swaps blocks with rank 1 in one SENDRECV; rank 1 first
 * receives rank 0's block (step 1) and only then, in a later step, sends its
 * own. Rank 0's receive half waits for a send that depends on its own send
 * half: fine when the halves are independent, a circular wait when the
 * receive gates the send (as in RECV_COPY_SEND, which `coupled` uses). */
static int one_sided_swap(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out,
                          int coupled)
{
    if (channel > 0 || a->nranks != 2)
        return 0;
    if (idx == 0) {
        own_block_copy(a, out);
        return 1;
    }
    if (a->rank == 0) {
        if (idx > 1)
            return 0;
        sendrecv_blocks(a, out, 1, 0, 1, 1, 1);
        if (coupled) {
            out->kind = PLAIT_STEP_RECV_COPY_SEND; /* receive into block 1, forward what arrives */
            out->src_off = out->dst_off;
        }
        return 1;
    }
    if (idx > 2)
        return 0;
    sendrecv_blocks(a, out, 0, 1, 0, 0, 1);
    out->kind = idx == 1 ? PLAIT_STEP_RECV : PLAIT_STEP_SEND;
    return 1;
}

static int swap_independent(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return one_sided_swap(a, channel, idx, out, 0);
}

static int swap_coupled(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return one_sided_swap(a, channel, idx, out, 1);
}

Test(verify, sendrecv_halves_are_independent)
{
    static const uint64_t counts[] = {1, 16, 17, 64, 1000};
    for (uint32_t slots = 1; slots <= 4; slots++)
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            struct plait_verify_config cfg =
                config(swap_independent, PLAIT_COLL_ALLGATHER, 2, counts[k], 1, 16, slots, 16, 4);
            struct plait_verify_result r = run(&cfg);
            if (!r.is_ok)
                dump(&r);
            cr_expect(r.is_ok, "count %" PRIu64 ", %u slots: %" PRIu64 " findings", counts[k], slots, r.total);
            cr_expect_eq(r.stuck_tasks, 0);
            plait_verify_result_free(&r);

            /* the same exchange with a step whose receive gates its send */
            cfg.gen = swap_coupled;
            r = run(&cfg);
            cr_expect_eq(r.counts[PLAIT_VERIFY_CIRCULAR_WAIT], 2, "count %" PRIu64 ", %u slots", counts[k], slots);
            cr_expect(has_finding(&r, PLAIT_VERIFY_CIRCULAR_WAIT, "rank 0 -data-> rank 1 -data-> rank 0") ||
                      has_finding(&r, PLAIT_VERIFY_CIRCULAR_WAIT, "rank 1 -data-> rank 0 -data-> rank 1"));
            plait_verify_result_free(&r);
        }
}

/* Three ranks, one slot per FIFO, 16-element pieces. Rank 0's SENDRECV sends
 * two pieces to rank 1 and receives two from rank 2; ranks 1 and 2 each first
 * wait for data from the other. Rank 0 sends one piece (the FIFO is then full)
 * and is stuck on both halves, behind the circular wait of ranks 1 and 2. */
static int stuck_both_halves(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    static const struct {
        int kind, peer;
        uint64_t count;
    } prog[3][3] = {
        {{PLAIT_STEP_SENDRECV, 0, 32}, {-1, 0, 0}, {-1, 0, 0}},
        {{PLAIT_STEP_RECV, 2, 16}, {PLAIT_STEP_SEND, 2, 16}, {PLAIT_STEP_RECV, 0, 32}},
        {{PLAIT_STEP_RECV, 1, 16}, {PLAIT_STEP_SEND, 1, 16}, {PLAIT_STEP_SEND, 0, 32}},
    };
    if (channel > 0 || idx >= 3 || prog[a->rank][idx].kind < 0)
        return 0;
    memset(out, 0, sizeof(*out));
    out->kind = (uint8_t)prog[a->rank][idx].kind;
    out->src_buf = PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->count = prog[a->rank][idx].count;
    out->send_peer = out->recv_peer = prog[a->rank][idx].peer;
    if (out->kind == PLAIT_STEP_SENDRECV) {
        out->send_peer = 1;
        out->recv_peer = 2;
    }
    return 1;
}

/* Three ranks, one slot: rank 0's receive half takes two of the four pieces
 * rank 2 sends and completes; its send half sent one piece to rank 1, which
 * waits for rank 2 first, and rank 2 waits for credit from rank 0, whose next
 * step would drain it: a circular wait through rank 0's send half only. */
static int stuck_send_half(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    static const struct {
        int kind, peer;
        uint64_t count;
    } prog[3][2] = {
        {{PLAIT_STEP_SENDRECV, 0, 32}, {PLAIT_STEP_RECV, 2, 32}},
        {{PLAIT_STEP_RECV, 2, 16}, {PLAIT_STEP_RECV, 0, 32}},
        {{PLAIT_STEP_SEND, 0, 64}, {PLAIT_STEP_SEND, 1, 16}},
    };
    if (channel > 0 || idx >= 2)
        return 0;
    memset(out, 0, sizeof(*out));
    out->kind = (uint8_t)prog[a->rank][idx].kind;
    out->src_buf = PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->count = prog[a->rank][idx].count;
    out->send_peer = out->recv_peer = prog[a->rank][idx].peer;
    if (out->kind == PLAIT_STEP_SENDRECV) {
        out->send_peer = 1;
        out->recv_peer = 2;
    }
    return 1;
}

Test(verify, sendrecv_deadlocks_say_which_half_waits)
{
    struct plait_verify_config cfg = config(stuck_both_halves, PLAIT_COLL_ALLREDUCE, 3, 64, 1, 16, 1, 16, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.stuck_tasks, 3);
    cr_expect_eq(r.counts[PLAIT_VERIFY_CIRCULAR_WAIT], 2, "ranks 1 and 2 wait for each other");
    cr_expect_eq(r.counts[PLAIT_VERIFY_BLOCKED_BEHIND], 1, "rank 0 waits behind both");
    cr_expect(has_finding(&r, PLAIT_VERIFY_BLOCKED_BEHIND,
                          "rank 0 channel 0 step 0 (SENDRECV, 16 of 32 elements sent, 0 received) waits for data "
                          "from rank 2 and for credit from rank 1 (its FIFO from rank 0 holds 1 of 1 slots); rank 2 "
                          "is itself stuck at step 0 (RECV); rank 1 is itself stuck at step 0 (RECV)"));
    cr_expect_eq(r.counts[PLAIT_VERIFY_NO_MATCHING_SEND] + r.counts[PLAIT_VERIFY_NO_MATCHING_RECV], 0);
    plait_verify_result_free(&r);

    cfg.gen = stuck_send_half;
    r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.stuck_tasks, 3);
    cr_expect_eq(r.counts[PLAIT_VERIFY_CIRCULAR_WAIT], 3);
    cr_expect(has_finding(&r, PLAIT_VERIFY_CIRCULAR_WAIT,
                          "rank 0 channel 0 step 0 (SENDRECV, 16 of 32 elements sent, 32 received) waits for credit "
                          "from rank 1 (its FIFO from rank 0 holds 1 of 1 slots)"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_CIRCULAR_WAIT, "rank 0 -credit-> rank 1 -data-> rank 2 -credit-> rank 0"));
    plait_verify_result_free(&r);
}

/* Rank 0 sends its own block before copying it there. */
static int sendrecv_reads_unwritten(const struct plait_sched_args *a, int channel, uint64_t idx,
                                    struct plait_step *out)
{
    if (!ring_sendrecv(a, channel, idx, out))
        return 0;
    if (a->rank == 0 && idx == 0)
        out->count = 0;
    return 1;
}

/* A SENDRECV with flags, and one whose receive lands on what it sends. */
static int sendrecv_bad_steps(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (!ring_sendrecv(a, channel, idx, out))
        return 0;
    if (a->rank == 1 && idx == 1)
        out->flags = PLAIT_STEP_PRE;
    if (a->rank == 2 && idx == 2)
        out->dst_off = out->src_off;
    return 1;
}

Test(verify, sendrecv_bad_reads_and_steps_reported)
{
    struct plait_verify_config cfg = config(sendrecv_reads_unwritten, PLAIT_COLL_ALLGATHER, 3, 40, 1, 16, 2, 16, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_UNWRITTEN_READ], 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_UNWRITTEN_READ,
                          "rank 0 channel 0 step 1 (SENDRECV): reads OUTPUT[0, 32) before anything wrote it"));
    /* the garbage reaches block 0 on the other ranks; rank 0's own is never written */
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "rank 0 OUTPUT[0, 40): never written"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "rank 1 OUTPUT[0, 32): holds data read before"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "rank 2 OUTPUT[32, 40): holds data read before"));
    plait_verify_result_free(&r);

    cfg = config(sendrecv_bad_steps, PLAIT_COLL_ALLGATHER, 3, 40, 1, 16, 2, 16, 4);
    r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_BAD_STEP], 2);
    cr_expect(has_finding(&r, PLAIT_VERIFY_BAD_STEP, "rank 1 channel 0 step 1 (SENDRECV): flags 0x1"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_BAD_STEP, "rank 2 channel 0 step 2 (SENDRECV): OUTPUT[40, +40) and "
                                                     "OUTPUT[40, +40) overlap"));
    plait_verify_result_free(&r);
}

/* ---------------------------------------------------------------- REDUCE, SENDRECV_REDUCE, SCRATCH, orders */

/* Two ranks, recursive halving then doubling: a PRE copy into OUTPUT, one
 * SENDRECV_REDUCE (keep my half, send the other), one SENDRECV (swap halves). */
static int halving_2(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    (void)channel;
    const uint64_t h = a->count / 2, mine = a->rank == 0 ? 0 : h, other = a->rank == 0 ? h : 0;
    const uint64_t mine_n = a->rank == 0 ? h : a->count - h, other_n = a->count - mine_n;
    memset(out, 0, sizeof(*out));
    out->send_peer = out->recv_peer = 1 - a->rank;
    out->src_buf = out->dst_buf = PLAIT_BUF_OUTPUT;
    if (idx == 0) {
        out->kind = PLAIT_STEP_COPY;
        out->src_buf = PLAIT_BUF_INPUT;
        out->flags = PLAIT_STEP_PRE;
        out->count = a->count;
        return 1;
    }
    if (idx > 2)
        return 0;
    /* both halves of a SENDRECV move the same count: the halves are equal here */
    out->kind = idx == 1 ? PLAIT_STEP_SENDRECV_REDUCE : PLAIT_STEP_SENDRECV;
    out->flags = idx == 1 ? PLAIT_STEP_POST : 0;
    out->count = mine_n < other_n ? mine_n : other_n;
    out->src_off = idx == 1 ? other : mine;
    out->dst_off = idx == 1 ? mine : other;
    return 1;
}

Test(verify, sendrecv_reduce_halving_verifies)
{
    for (int inplace = 0; inplace < 2; inplace++)
        for (uint64_t count = 0; count <= 64; count += 16) {
            struct plait_verify_config cfg = config(halving_2, PLAIT_COLL_ALLREDUCE, 2, count, 1, 4, 1, 4, 4);
            cfg.is_inplace = inplace;
            expect_ok(&cfg);
        }
}

/* The same with PRE on the SENDRECV_REDUCE: a bad step (PRE belongs on a copy). */
static int halving_2_pre(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    int r = halving_2(a, channel, idx, out);
    if (r && idx == 1)
        out->flags |= PLAIT_STEP_PRE;
    return r;
}

Test(verify, sendrecv_reduce_pre_rejected)
{
    struct plait_verify_config cfg = config(halving_2_pre, PLAIT_COLL_ALLREDUCE, 2, 32, 1, 4, 2, 4, 4);
    struct plait_verify_result r = run(&cfg);
    cr_expect(!r.is_ok);
    cr_expect(r.counts[PLAIT_VERIFY_BAD_STEP] >= 1);
    cr_expect(has_finding(&r, PLAIT_VERIFY_BAD_STEP, "only POST"));
    plait_verify_result_free(&r);
}

/* One-shot on two ranks: each rank scales its input into SCRATCH[0, count)
 * (its own pre-op), swaps that with the other rank into SCRATCH[count, 2
 * count), then reduces in rank order with REDUCE steps (so both ranks compute
 * x0 OP x1 the same way). */
static int oneshot_2(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    (void)channel;
    memset(out, 0, sizeof(*out));
    out->send_peer = out->recv_peer = 1 - a->rank;
    out->count = a->count;
    const uint64_t theirs = a->count;
    const int mine_first = a->rank == 0; /* the lower rank's data comes first */
    switch (idx) {
    case 0:
        out->kind = PLAIT_STEP_COPY;
        out->src_buf = PLAIT_BUF_INPUT;
        out->dst_buf = PLAIT_BUF_SCRATCH;
        out->flags = PLAIT_STEP_PRE;
        return 1;
    case 1:
        out->kind = PLAIT_STEP_SENDRECV;
        out->src_buf = out->dst_buf = PLAIT_BUF_SCRATCH;
        out->dst_off = theirs;
        return 1;
    case 2:
        out->kind = PLAIT_STEP_COPY;
        out->src_buf = PLAIT_BUF_SCRATCH;
        out->src_off = mine_first ? 0 : theirs;
        out->dst_buf = PLAIT_BUF_OUTPUT;
        return 1;
    case 3:
        out->kind = PLAIT_STEP_REDUCE;
        out->src_buf = PLAIT_BUF_SCRATCH;
        out->src_off = mine_first ? theirs : 0;
        out->dst_buf = PLAIT_BUF_OUTPUT;
        out->flags = PLAIT_STEP_POST;
        return 1;
    default:
        return 0;
    }
}

static uint64_t scratch_count(const struct plait_sched_args *a)
{
    return a->count;
}

static uint64_t scratch_2count(const struct plait_sched_args *a)
{
    return 2 * a->count;
}

Test(verify, reduce_step_and_scratch_verify)
{
    struct plait_verify_config cfg = config(oneshot_2, PLAIT_COLL_ALLREDUCE, 2, 100, 1, 16, 2, 16, 4);
    cfg.scratch = scratch_2count;
    expect_ok(&cfg);
    cfg.is_inplace = 1;
    expect_ok(&cfg);
    /* without the scratch it asks for, the steps are out of bounds */
    cfg.scratch = NULL;
    struct plait_verify_result r = run(&cfg);
    cr_expect(!r.is_ok);
    cr_expect(r.counts[PLAIT_VERIFY_OUT_OF_BOUNDS] >= 1);
    plait_verify_result_free(&r);
}

/* The one-shot as it was written first: swap the raw inputs into SCRATCH,
 * then reduce in rank order applying the pre-op to both operands on the rank
 * that reduces. Every output holds every input once with the pre-op once, but
 * each rank scaled the other's input by its own scalar: with premulsum (a
 * scalar per rank) the result is wrong. */
static int oneshot_2_receiver_pre(const struct plait_sched_args *a, int channel, uint64_t idx,
                                  struct plait_step *out)
{
    (void)channel;
    memset(out, 0, sizeof(*out));
    out->send_peer = out->recv_peer = 1 - a->rank;
    out->count = a->count;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    const int scratch_first = a->rank == 1; /* the lower rank's data comes first */
    switch (idx) {
    case 0:
        out->kind = PLAIT_STEP_SENDRECV;
        out->src_buf = PLAIT_BUF_INPUT;
        out->dst_buf = PLAIT_BUF_SCRATCH;
        return 1;
    case 1:
        out->kind = PLAIT_STEP_COPY;
        out->src_buf = scratch_first ? PLAIT_BUF_SCRATCH : PLAIT_BUF_INPUT;
        out->flags = PLAIT_STEP_PRE;
        return 1;
    case 2:
        out->kind = PLAIT_STEP_REDUCE;
        out->src_buf = scratch_first ? PLAIT_BUF_INPUT : PLAIT_BUF_SCRATCH;
        out->flags = PLAIT_STEP_PRE | PLAIT_STEP_POST;
        return 1;
    default:
        return 0;
    }
}

Test(verify, pre_applied_by_receiver_reported)
{
    struct plait_verify_config cfg = config(oneshot_2_receiver_pre, PLAIT_COLL_ALLREDUCE, 2, 100, 1, 16, 2, 16, 4);
    cfg.scratch = scratch_count;
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    /* one per rank: rank 1 copies rank 0's input with the pre-op, rank 0 adds
     * rank 1's with it; the outputs themselves count the pre-op once each */
    cr_expect_eq(r.counts[PLAIT_VERIFY_FOREIGN_PRE], 2);
    cr_expect_eq(r.total, 2);
    cr_expect(has_finding(&r, PLAIT_VERIFY_FOREIGN_PRE,
                          "rank 1 channel 0 step 1 (COPY): applies the pre-op to SCRATCH[0, 100), which holds rank "
                          "0's contribution"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_FOREIGN_PRE,
                          "rank 0 channel 0 step 2 (REDUCE): applies the pre-op to SCRATCH[0, 100), which holds "
                          "rank 1's contribution"));
    for (size_t i = 0; i < r.nfindings; i++) {
        cr_expect_geq(r.findings[i].rank, 0);
        cr_expect_eq(r.findings[i].channel, 0);
        cr_expect_neq(r.findings[i].step, UINT64_MAX);
    }
    plait_verify_result_free(&r);
    /* in place, rank 1 also overwrites its input with rank 0's before reducing it */
    cfg.is_inplace = 1;
    r = run(&cfg);
    cr_expect(!r.is_ok);
    cr_expect(r.counts[PLAIT_VERIFY_WRONG_OUTPUT] >= 1);
    plait_verify_result_free(&r);
}

/* The library's one-shot and two-shot with the pre-op moved back to where the
 * first versions applied it: off the scaling copy of the own input, onto every
 * step of the rank-order reduction (which reads the other ranks' scaled
 * contributions). This is the premulsum bug those versions had. */
static int direct_receiver_pre(plait_step_fn gen, const struct plait_sched_args *a, int channel, uint64_t idx,
                               struct plait_step *out)
{
    if (!gen(a, channel, idx, out))
        return 0;
    if ((out->kind == PLAIT_STEP_COPY || out->kind == PLAIT_STEP_REDUCE) && out->src_buf == PLAIT_BUF_INPUT)
        out->flags &= (uint8_t)~PLAIT_STEP_PRE;
    else if ((out->kind == PLAIT_STEP_COPY || out->kind == PLAIT_STEP_REDUCE) && out->dst_buf == PLAIT_BUF_OUTPUT)
        out->flags |= PLAIT_STEP_PRE;
    return 1;
}

static int oneshot_receiver_pre(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return direct_receiver_pre(plait_oneshot_step, a, channel, idx, out);
}

static int twoshot_receiver_pre(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return direct_receiver_pre(plait_twoshot_step, a, channel, idx, out);
}

Test(verify, direct_pre_on_received_data_reported)
{
    static const int ranks[] = {2, 3, 5};
    const plait_step_fn gens[] = {oneshot_receiver_pre, twoshot_receiver_pre};
    const plait_scratch_fn scratch[] = {plait_oneshot_scratch, plait_twoshot_scratch};
    for (int g = 0; g < 2; g++)
        for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++) {
            const int n = ranks[ri];
            struct plait_verify_config cfg =
                config(gens[g], PLAIT_COLL_ALLREDUCE, n, 1000, 2, 16, 4, clamp_chunk(1 << 20, 16, 4, 4), 4);
            cfg.scratch = scratch[g];
            struct plait_verify_result r = run(&cfg);
            cr_expect(!r.is_ok, "%s on %d ranks", g ? "twoshot" : "oneshot", n);
            /* on every rank, every channel: the reduction reads n-1 received contributions */
            cr_expect_geq(r.counts[PLAIT_VERIFY_FOREIGN_PRE], (uint64_t)(2 * n), "%s on %d ranks",
                          g ? "twoshot" : "oneshot", n);
            cr_expect_eq(r.total, r.counts[PLAIT_VERIFY_FOREIGN_PRE], "only the pre-op is wrong");
            cr_expect(has_finding(&r, PLAIT_VERIFY_FOREIGN_PRE, "applies the pre-op to SCRATCH["));
            plait_verify_result_free(&r);
        }
}

/* The ring, then one more step: the pre-op applied again to the whole
 * result, which holds every rank's contribution. */
static int ring_then_pre(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (plait_ring_step(a, channel, idx, out))
        return 1;
    if (idx == 0 || !plait_ring_step(a, channel, idx - 1, out))
        return 0;
    memset(out, 0, sizeof(*out));
    out->kind = PLAIT_STEP_COPY;
    out->src_buf = out->dst_buf = PLAIT_BUF_OUTPUT;
    out->flags = PLAIT_STEP_PRE;
    out->count = a->count;
    out->send_peer = out->recv_peer = -1;
    return 1;
}

Test(verify, pre_on_a_reduced_result_reported)
{
    struct plait_verify_config cfg = config(ring_then_pre, PLAIT_COLL_ALLREDUCE, 3, 64, 1, 16, 4, 16, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect_eq(r.counts[PLAIT_VERIFY_FOREIGN_PRE], 3); /* once per rank */
    cr_expect(has_finding(&r, PLAIT_VERIFY_FOREIGN_PRE, "which holds contributions of several ranks"));
    /* and the outputs are wrong as well: the pre-op twice */
    cr_expect_gt(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 0);
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "pre-op applied 2 times"));
    plait_verify_result_free(&r);
}

/* Every generator of the table that reduces applies the pre-op only to its
 * rank's own contribution, for every reduction it implements (the sweep of
 * plait-verify --all has more shapes). */
Test(verify, table_reductions_pre_on_own_data)
{
    static const int colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_REDUCE, PLAIT_COLL_REDUCESCATTER};
    static const int ranks[] = {1, 2, 3, 4, 5, 8, 9};
    static const uint64_t counts[] = {1, 7, 1000};
    int cases = 0;
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++) {
        const struct plait_algorithm *al = &plait_algorithms[a];
        if (!al->step)
            continue;
        for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++)
            for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++)
                for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
                    for (int inplace = 0; inplace < 2; inplace++) {
                        const int n = ranks[ri];
                        if (!al->supports(colls[ci], n))
                            continue;
                        struct plait_verify_config cfg =
                            config(al->step, colls[ci], n, counts[k], 2, 16, 4, clamp_chunk(1 << 20, 16, 4, 4), 4);
                        cfg.args.root = (int)(k * 5) % n;
                        cfg.args.radix = 2;
                        cfg.is_inplace = inplace;
                        cfg.scratch = al->scratch;
                        cfg.peers = al->peers;
                        struct plait_verify_result r = run(&cfg);
                        if (!r.is_ok)
                            dump(&r);
                        cr_expect(r.is_ok, "%s %s, %d ranks, count %" PRIu64 ", in place %d: %" PRIu64 " findings",
                                  al->name, plait_coll_name(colls[ci]), n, counts[k], inplace, r.total);
                        cr_expect_eq(r.counts[PLAIT_VERIFY_FOREIGN_PRE], 0);
                        plait_verify_result_free(&r);
                        cases++;
                    }
    }
    cr_expect_gt(cases, 100);
}


/* The connections a ring over given orders needs: each rank's neighbours in
 * every channel's order (the verifier's peers function sees no orders, so the
 * test keeps them here). */
static const int32_t *g_order, *g_pos;
static int g_nch;

static int order_neighbours(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    int cnt = 0;
    for (int c = 0; c < g_nch; c++) {
        const int p = g_pos[c * nranks + rank];
        const int cand[2] = {g_order[c * nranks + (p + 1) % nranks], g_order[c * nranks + (p + nranks - 1) % nranks]};
        for (int k = 0; k < 2; k++) {
            int dup = cand[k] == rank;
            for (int i = 0; i < cnt && !dup; i++)
                dup = out[i] == cand[k];
            if (!dup && cnt < max)
                out[cnt++] = cand[k];
        }
    }
    return cnt;
}

/* The ring follows per-channel rank orders: random permutations, every
 * collective, three channels; every step uses a connection of the orders. */
Test(verify, ring_follows_rank_orders)
{
    static const int ranks[] = {2, 3, 5, 8, 13};
    uint64_t seed = 12345;
    for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++) {
        const int n = ranks[ri], nch = 3;
        int32_t order[3 * 13], pos[3 * 13];
        for (int c = 0; c < nch; c++) {
            for (int i = 0; i < n; i++)
                order[c * n + i] = i;
            for (int i = n - 1; i > 0; i--) { /* Fisher-Yates */
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                int j = (int)((seed >> 33) % (uint64_t)(i + 1));
                int32_t t = order[c * n + i];
                order[c * n + i] = order[c * n + j];
                order[c * n + j] = t;
            }
            for (int i = 0; i < n; i++)
                pos[c * n + order[c * n + i]] = i;
        }
        for (size_t ci = 0; ci < sizeof(all_colls) / sizeof(all_colls[0]); ci++)
            for (int inplace = 0; inplace < 2; inplace++) {
                struct plait_verify_config cfg =
                    config(plait_ring_step, all_colls[ci], n, 1000, nch, 16, 4, clamp_chunk(1 << 20, 16, 4, 4), 4);
                cfg.args.order = order;
                cfg.args.pos = pos;
                g_order = order;
                g_pos = pos;
                g_nch = nch;
                cfg.peers = order_neighbours;
                cfg.args.root = n / 2;
                cfg.is_inplace = inplace;
                expect_ok(&cfg);
            }
    }
}

/* ---------------------------------------------------------------- alltoall, gather, scatter, barrier */

/* Hand-written schedules on one channel, whole blocks per step (no chunking),
 * right and with one thing broken each (wrong_*: a block in the wrong place). */

static void expect_ok_as(const char *what, const struct plait_verify_config *cfg)
{
    struct plait_verify_result r = run(cfg);
    if (!r.is_ok)
        dump(&r);
    cr_expect(r.is_ok, "%s %s, %d ranks, count %" PRIu64 ", root %d, in place %d: %" PRIu64 " findings", what,
              plait_coll_name(cfg->args.coll), cfg->args.nranks, cfg->args.count, cfg->args.root, cfg->is_inplace,
              r.total);
    plait_verify_result_free(&r);
}

/* Alltoall by shifts: step 0 copies the own block, step s sends block r+s to
 * r+s and receives rank r-s's block r into block r-s. wrong_at: the rank
 * whose received blocks land one block off (-1: none). */
static int alltoall_shifts(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out,
                           int wrong_at)
{
    const uint64_t n = (uint64_t)a->nranks, r = (uint64_t)a->rank;
    if (channel > 0 || idx >= n)
        return 0;
    memset(out, 0, sizeof(*out));
    out->src_buf = PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->count = a->count;
    out->send_peer = out->recv_peer = -1;
    if (idx == 0) {
        out->kind = PLAIT_STEP_COPY;
        out->src_off = out->dst_off = r * a->count;
        return 1;
    }
    const uint64_t to = (r + idx) % n, from = (r + n - idx) % n;
    out->kind = PLAIT_STEP_SENDRECV;
    out->send_peer = (int)to;
    out->recv_peer = (int)from;
    out->src_off = to * a->count;
    out->dst_off = (a->rank == wrong_at ? (from + 1) % n : from) * a->count;
    return 1;
}

static int alltoall_right(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return alltoall_shifts(a, channel, idx, out, -1);
}

static int alltoall_wrong(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return alltoall_shifts(a, channel, idx, out, 1);
}

/* Gather and scatter from the root, one step per rank. wrong: the root
 * exchanges rank p's block at p+1 (gather: writes it there; scatter: sends
 * block p+1 to p). */
static int linear_hand(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out, int wrong)
{
    const int n = a->nranks, is_gather = a->coll == PLAIT_COLL_GATHER;
    if (channel > 0)
        return 0;
    memset(out, 0, sizeof(*out));
    out->src_buf = PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->count = a->count;
    out->send_peer = out->recv_peer = -1;
    if (a->rank != a->root) {
        if (idx > 0)
            return 0;
        out->kind = is_gather ? PLAIT_STEP_SEND : PLAIT_STEP_RECV;
        out->send_peer = out->recv_peer = a->root;
        return 1;
    }
    if (idx >= (uint64_t)n)
        return 0;
    const int p = (int)idx; /* every rank in rank order, the root itself by a COPY */
    const uint64_t block = (uint64_t)(wrong && p != a->root ? (p + 1) % n : p) * a->count;
    if (is_gather)
        out->dst_off = block;
    else
        out->src_off = block;
    if (p == a->root)
        out->kind = PLAIT_STEP_COPY;
    else if (is_gather) {
        out->kind = PLAIT_STEP_RECV;
        out->recv_peer = p;
    } else {
        out->kind = PLAIT_STEP_SEND;
        out->send_peer = p;
    }
    return 1;
}

static int linear_right(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return linear_hand(a, channel, idx, out, 0);
}

static int linear_wrong(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return linear_hand(a, channel, idx, out, 1);
}

/* Dissemination barrier: copy the token, then per round d = 1, 2, 4 ... send
 * it to r+d, receive r-d's into SCRATCH and reduce it in. rounds_cut: rounds
 * left out at the end (a barrier that lets ranks go early). */
static int barrier_hand(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out,
                        int rounds_cut)
{
    const int n = a->nranks, r = a->rank;
    int rounds = 0;
    while ((1 << rounds) < n)
        rounds++;
    rounds -= rounds_cut;
    if (channel > 0 || idx >= (uint64_t)(1 + 2 * rounds))
        return 0;
    memset(out, 0, sizeof(*out));
    out->count = a->count;
    out->send_peer = out->recv_peer = -1;
    if (idx == 0) {
        out->kind = PLAIT_STEP_COPY;
        out->src_buf = PLAIT_BUF_INPUT;
        out->dst_buf = PLAIT_BUF_OUTPUT;
        return 1;
    }
    const int d = 1 << ((idx - 1) / 2);
    if ((idx - 1) % 2 == 0) {
        out->kind = PLAIT_STEP_SENDRECV;
        out->src_buf = PLAIT_BUF_OUTPUT;
        out->dst_buf = PLAIT_BUF_SCRATCH;
        out->send_peer = (r + d) % n;
        out->recv_peer = (r + n - d % n) % n;
    } else {
        out->kind = PLAIT_STEP_REDUCE;
        out->src_buf = PLAIT_BUF_SCRATCH;
        out->dst_buf = PLAIT_BUF_OUTPUT;
    }
    return 1;
}

static int barrier_right(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return barrier_hand(a, channel, idx, out, 0);
}

static int barrier_short(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return barrier_hand(a, channel, idx, out, 1);
}

Test(verify, alltoall_gather_scatter_verify)
{
    for (int n = 1; n <= 9; n++) {
        struct plait_verify_config cfg = config(alltoall_right, PLAIT_COLL_ALLTOALL, n, 100, 1, 16, 2, 16, 4);
        expect_ok_as("shifts", &cfg);
        for (int coll = PLAIT_COLL_GATHER; coll <= PLAIT_COLL_SCATTER; coll++)
            for (int inplace = 0; inplace < 2; inplace++) {
                cfg = config(linear_right, coll, n, 100, 1, 16, 2, 16, 4);
                cfg.args.root = n / 2;
                cfg.is_inplace = inplace;
                expect_ok_as("linear by hand", &cfg);
            }
    }
}

Test(verify, alltoall_wrong_block_reported)
{
    struct plait_verify_config cfg = config(alltoall_wrong, PLAIT_COLL_ALLTOALL, 4, 100, 1, 16, 2, 16, 4);
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    /* rank 1 gets rank 0's block in its block 1 and so on */
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "rank 1 OUTPUT[100, 200): holds rank 0's data instead of "
                                                         "rank 1's"));
    cr_expect_eq(r.total, r.counts[PLAIT_VERIFY_WRONG_OUTPUT]);
    plait_verify_result_free(&r);
    /* alltoall has no in-place form */
    cfg = config(alltoall_right, PLAIT_COLL_ALLTOALL, 4, 100, 1, 16, 2, 16, 4);
    cfg.is_inplace = 1;
    cr_expect_eq(plait_sched_verify(&cfg, &r), PLAIT_ERR_INVALID_ARGUMENT);
}

Test(verify, gather_scatter_wrong_block_reported)
{
    struct plait_verify_config cfg = config(linear_wrong, PLAIT_COLL_GATHER, 4, 100, 1, 16, 2, 16, 4);
    cfg.args.root = 2;
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    /* rank p's input went to block p+1 mod 4 (the root copies its own into
     * block 2): nothing was written to block 3 */
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "rank 2 OUTPUT[300, 400): never written"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "rank 2 OUTPUT[100, 200): holds rank 0's data"));
    plait_verify_result_free(&r);

    cfg = config(linear_wrong, PLAIT_COLL_SCATTER, 4, 100, 1, 16, 2, 16, 4);
    cfg.args.root = 2;
    r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    /* rank 0 got the root's block 1 */
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "rank 0 OUTPUT[0, 100): wrong elements: rank 2's "
                                                         "input[x+100] instead of input[x]"));
    plait_verify_result_free(&r);

    /* a root out of range is refused */
    cfg.args.root = 4;
    cr_expect_eq(plait_sched_verify(&cfg, &r), PLAIT_ERR_INVALID_ARGUMENT);
}

Test(verify, barrier_semantics)
{
    /* dissemination: every rank heard at least once, some twice when n is not
     * a power of two; that is a barrier */
    for (int n = 1; n <= 17; n++) {
        struct plait_verify_config cfg = config(barrier_right, PLAIT_COLL_BARRIER, n, 1, 1, 16, 2, 16, 1);
        cfg.scratch = scratch_count;
        expect_ok_as("dissemination by hand", &cfg);
    }
    /* one round short: ranks leave before hearing from every rank */
    struct plait_verify_config cfg = config(barrier_short, PLAIT_COLL_BARRIER, 5, 1, 1, 16, 2, 16, 1);
    cfg.scratch = scratch_count;
    struct plait_verify_result r = run(&cfg);
    dump(&r);
    cr_assert(!r.is_ok);
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "missing the contribution of rank"));
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "at least once"));
    plait_verify_result_free(&r);
    /* duplicates stay wrong where a barrier is not the collective */
    cfg = config(barrier_right, PLAIT_COLL_ALLREDUCE, 5, 1, 1, 16, 2, 16, 1);
    cfg.scratch = scratch_count;
    r = run(&cfg);
    cr_expect(!r.is_ok);
    cr_expect_gt(r.counts[PLAIT_VERIFY_WRONG_OUTPUT], 0);
    /* and it is the duplicates that are named, not only the missing pre/post */
    cr_expect(has_finding(&r, PLAIT_VERIFY_WRONG_OUTPUT, "duplicated contribution"));
    plait_verify_result_free(&r);
}

/* The table's generators for the new collectives, a few shapes each (the
 * sweep of plait-verify --all has the rest). */
Test(verify, table_alltoall_gather_scatter_barrier)
{
    static const struct {
        int algo, coll;
    } cases[] = {
        {PLAIT_ALGO_PAIRWISE, PLAIT_COLL_ALLTOALL},      {PLAIT_ALGO_BRUCK, PLAIT_COLL_ALLTOALL},
        {PLAIT_ALGO_LINEAR, PLAIT_COLL_GATHER},          {PLAIT_ALGO_LINEAR, PLAIT_COLL_SCATTER},
        {PLAIT_ALGO_DISSEMINATION, PLAIT_COLL_BARRIER},
    };
    static const int ranks[] = {1, 2, 3, 4, 5, 7, 8, 13};
    static const uint64_t counts[] = {0, 1, 7, 1000};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct plait_algorithm *al = &plait_algorithms[cases[i].algo];
        for (size_t ri = 0; ri < sizeof(ranks) / sizeof(ranks[0]); ri++)
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    if (inplace && cases[i].coll == PLAIT_COLL_ALLTOALL)
                        continue;
                    const int n = ranks[ri];
                    struct plait_verify_config cfg = config(al->step, cases[i].coll, n, counts[k], 3, 16, 4,
                                                            clamp_chunk(1 << 20, 16, 4, 4), 4);
                    cfg.args.root = (int)(k * 5) % n;
                    cfg.is_inplace = inplace;
                    cfg.scratch = al->scratch;
                    cfg.peers = al->peers;
                    cr_expect(al->supports(cases[i].coll, n));
                    struct plait_verify_result r = run(&cfg);
                    if (!r.is_ok)
                        dump(&r);
                    cr_expect(r.is_ok, "%s %s, %d ranks, count %" PRIu64 ", in place %d: %" PRIu64 " findings",
                              al->name, plait_coll_name(cases[i].coll), n, counts[k], inplace, r.total);
                    plait_verify_result_free(&r);
                }
    }
}
