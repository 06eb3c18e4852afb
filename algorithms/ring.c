/* Ring schedules for allreduce, reducescatter, allgather (ring), and broadcast /
 * reduce (a chain along the ring, starting or ending at the root).
 *
 * Each channel handles a contiguous range of the data and walks it in
 * iterations. An allreduce iteration covers nranks rank-chunks of at most
 * chunk_elems each; reducescatter/allgather iterations cover chunk_elems of each
 * rank's block (blocks are `count` apart); broadcast/reduce iterations cover
 * chunk_elems. Every step's chunk is a pure function of (rank, channel, index).
 *
 * Allreduce, step s of an iteration, on rank r (n ranks):
 *   s = 0          send chunk r-1 (own input, pre-op)
 *   0 < s < n-1    recv chunk r-s-1, reduce with own input, send
 *   s = n-1        recv chunk r, reduce, write output (post-op), send
 *   n-1 < s < 2n-2 recv chunk r-s+n-1, write output, send
 *   s = 2n-2       recv chunk r+1, write output
 * so rank r finalises chunk r and every chunk visits every rank.
 *
 * Each channel's ring follows its rank order (args->order; the identity when
 * none): "r" above is the rank's place in that order, its neighbours are the
 * ranks at the places before and after it, and a reducescatter/allgather block
 * is still the block of the rank that owns it. */
#include "algorithms/schedule.h"

static int ring_next(const struct plait_sched_args *a, int ch)
{
    return plait_sched_at(a, ch, (plait_sched_pos(a, ch, a->rank) + 1) % a->nranks);
}

static int ring_prev(const struct plait_sched_args *a, int ch)
{
    return plait_sched_at(a, ch, (plait_sched_pos(a, ch, a->rank) + a->nranks - 1) % a->nranks);
}

static void step_init(struct plait_step *st, int kind, const struct plait_sched_args *a, int ch)
{
    st->kind = (uint8_t)kind;
    st->src_buf = PLAIT_BUF_INPUT;
    st->dst_buf = PLAIT_BUF_OUTPUT;
    st->flags = 0;
    st->send_peer = ring_next(a, ch);
    st->recv_peer = ring_prev(a, ch);
    st->src_off = 0;
    st->dst_off = 0;
    st->count = 0;
}

static int allreduce_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const uint64_t n = (uint64_t)a->nranks;
    const uint64_t r = (uint64_t)plait_sched_pos(a, channel, a->rank);
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t per_iter = n * a->chunk_elems;
    const uint64_t steps = 2 * n - 1;
    const uint64_t iter = idx / steps;
    const uint64_t s = idx % steps;
    const uint64_t base = lo + iter * per_iter;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(per_iter, hi - base);
    uint64_t cs = (len + n - 1) / n;
    cs = (cs + a->align_elems - 1) / a->align_elems * a->align_elems;

    uint64_t k;
    if (s < n)
        k = (r + 2 * n - s - 1) % n;
    else
        k = (r + 2 * n - s + n - 1) % n;
    const uint64_t k_lo = plait_umin(k * cs, len);
    const uint64_t k_hi = plait_umin((k + 1) * cs, len);

    int kind;
    unsigned flags = 0;
    if (s == 0) {
        kind = PLAIT_STEP_SEND;
        flags = PLAIT_STEP_PRE;
    } else if (s < n - 1) {
        kind = PLAIT_STEP_RECV_REDUCE_SEND;
        flags = PLAIT_STEP_PRE;
    } else if (s == n - 1) {
        kind = PLAIT_STEP_RECV_REDUCE_COPY_SEND;
        flags = PLAIT_STEP_PRE | PLAIT_STEP_POST;
    } else if (s < 2 * n - 2) {
        kind = PLAIT_STEP_RECV_COPY_SEND;
    } else {
        kind = PLAIT_STEP_RECV;
    }
    step_init(out, kind, a, channel);
    out->flags = (uint8_t)flags;
    out->src_off = base + k_lo;
    out->dst_off = base + k_lo;
    out->count = k_hi - k_lo;
    return 1;
}

/* Reducescatter and allgather: rank-chunk k of an iteration is the slice
 * [base, base+len) of block k, which starts at k*count. */
static int blocked_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const uint64_t n = (uint64_t)a->nranks;
    const uint64_t r = (uint64_t)a->rank;
    const uint64_t p = (uint64_t)plait_sched_pos(a, channel, a->rank);
    const int is_gather = a->coll == PLAIT_COLL_ALLGATHER;
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    /* allgather has a leading local copy of the own block: n+1 steps per iteration */
    const uint64_t steps = is_gather ? n + 1 : n;
    const uint64_t iter = idx / steps;
    const uint64_t s = idx % steps;
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(a->chunk_elems, hi - base);

    if (is_gather) {
        if (s == 0) {
            step_init(out, PLAIT_STEP_COPY, a, channel);
            out->src_off = base;
            out->dst_off = r * a->count + base;
        } else if (s == 1) {
            step_init(out, PLAIT_STEP_SEND, a, channel);
            out->src_off = base;
        } else {
            const uint64_t k = (uint64_t)plait_sched_at(a, channel, (int)((p + n - (s - 1)) % n));
            step_init(out, s < n ? PLAIT_STEP_RECV_COPY_SEND : PLAIT_STEP_RECV, a, channel);
            out->dst_off = k * a->count + base;
        }
        out->count = len;
        return 1;
    }

    const uint64_t k = (uint64_t)plait_sched_at(a, channel, (int)((p + 2 * n - s - 1) % n));
    int kind;
    unsigned flags = PLAIT_STEP_PRE;
    if (s == 0)
        kind = PLAIT_STEP_SEND;
    else if (s < n - 1)
        kind = PLAIT_STEP_RECV_REDUCE_SEND;
    else {
        kind = PLAIT_STEP_RECV_REDUCE_COPY;
        flags |= PLAIT_STEP_POST;
    }
    step_init(out, kind, a, channel);
    out->flags = (uint8_t)flags;
    out->src_off = k * a->count + base;
    out->dst_off = base;
    out->count = len;
    return 1;
}

/* Broadcast: a chain from the root along the ring. Reduce: a chain that starts
 * after the root and ends at it. */
static int chain_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const uint64_t n = (uint64_t)a->nranks;
    const int is_bcast = a->coll == PLAIT_COLL_BROADCAST;
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t me = (uint64_t)plait_sched_pos(a, channel, a->rank);
    const uint64_t rootp = (uint64_t)plait_sched_pos(a, channel, a->root);
    const uint64_t pos = is_bcast ? (me + n - rootp) % n : (me + 2 * n - rootp - 1) % n;
    /* the broadcast root also copies its input to its output */
    const uint64_t steps = (is_bcast && pos == 0) ? 2 : 1;
    const uint64_t iter = idx / steps;
    const uint64_t s = idx % steps;
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(a->chunk_elems, hi - base);

    int kind;
    unsigned flags = 0;
    if (is_bcast) {
        if (pos == 0)
            kind = s == 0 ? PLAIT_STEP_SEND : PLAIT_STEP_COPY;
        else
            kind = pos < n - 1 ? PLAIT_STEP_RECV_COPY_SEND : PLAIT_STEP_RECV;
    } else {
        flags = PLAIT_STEP_PRE;
        if (pos == 0)
            kind = PLAIT_STEP_SEND;
        else if (pos < n - 1)
            kind = PLAIT_STEP_RECV_REDUCE_SEND;
        else {
            kind = PLAIT_STEP_RECV_REDUCE_COPY;
            flags |= PLAIT_STEP_POST;
        }
    }
    step_init(out, kind, a, channel);
    out->flags = (uint8_t)flags;
    out->src_off = base;
    out->dst_off = base;
    out->count = len;
    return 1;
}

int plait_ring_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (a->nranks == 1)
        return plait_sched_single_rank(a, channel, idx, out);
    switch (a->coll) {
    case PLAIT_COLL_ALLREDUCE:
    case PLAIT_COLL_BARRIER:
        return allreduce_step(a, channel, idx, out);
    case PLAIT_COLL_REDUCESCATTER:
    case PLAIT_COLL_ALLGATHER:
        return blocked_step(a, channel, idx, out);
    case PLAIT_COLL_BROADCAST:
    case PLAIT_COLL_REDUCE:
        return chain_step(a, channel, idx, out);
    default:
        return 0;
    }
}
