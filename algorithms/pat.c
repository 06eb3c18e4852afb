/* PAT ("parallel aggregated trees") allgather and reducescatter: exchanges over
 * distances 2^i, log-depth, with SCRATCH bounded by O(log n) chunks.
 *
 * The trees. Every block q travels along the same binomial tree, shifted to
 * start at rank q: on rank r, block q has relative index x = (r - q) mod n, and
 * node x's parent is x - lowbit(x) (its lowest set bit cleared), lowbit(x) ranks
 * away. Allgather sends each block down its tree, far distances first (the
 * root's first send goes P/2 away, P = 2^ceil(log2 n)); reducescatter runs the
 * same schedule backwards: partial sums go up the tree, near distances first,
 * and rank q finishes block q. The farthest hop carries one block and distance
 * d about n/(2d): long hops move little. All ranks run the same relative
 * schedule in step, so every exchange is one SENDRECV (allgather) or
 * SENDRECV_REDUCE (reducescatter) whose two ends sit at the same step index:
 * nothing depends on the FIFO depth.
 *
 *   tree of block 0, n = 8:              n = 6 (the same, cut at 6):
 *                  0                                  0
 *           d=4 /  |d=2 \ d=1                  d=4 /  |d=2 \ d=1
 *              4   2     1                        4   2     1
 *         d=2 / |d=1 |d=1                     d=1 |   |d=1
 *            6  5    3                            5   3
 *       d=1  |
 *            7
 *
 * Aggregation. One message per tree edge costs n-1 exchanges per iteration; for
 * small data PAT packs the edges of one distance together. An iteration covers
 * len = min(chunk, the channel's slice) elements of every block, and A blocks
 * go in one message, A the largest power of two <= P with A * len <= chunk.
 * With D = P / A, the relative indices split into classes t = x mod D, class t
 * holding the J_t = ceil((n - t) / D) blocks x = D*j + t, and the tree into:
 *   - the class tree: class t's parent is class t - lowbit(t), lowbit(t) < D
 *     away, and one message carries the whole class (every j at once);
 *   - the top tree inside class 0 (x = D*j): j's parent is j - lowbit(j),
 *     D*lowbit(j) away, one message per distance D*2^k, k < K = ceil(log2 J_0).
 * A class lives in SCRATCH as an area of J_0 slots holding its blocks in
 * bit-reversed order of j (the slot of j counts the j' < J_t whose reversed
 * bits are smaller), which makes every top round contiguous: the slots of the
 * j with lowbit 2^k follow those of the j = 0 mod 2^(k+1), in matching order.
 * Small data: A = P, D = 1, one class: ceil(log2 n) exchanges. Large data:
 * A = 1, J_0 = 1, every class one block: n-1 single-block exchanges, and then
 * the allgather moves blocks straight between output blocks (no SCRATCH, no
 * copies) and the reducescatter accumulates block r in the output.
 *
 * Reducescatter iteration, rank r (the allgather's is the exact reverse, each
 * exchange with its halves swapped, no flags, COPYs out instead of in):
 *   for t = 0 .. T-1 (T = min(D, n) classes):
 *     open(t): COPY (PRE) input block r - D*j - t to its slot, for each j;
 *     for each class c whose subtree ends at t, deepest first:
 *       SENDRECV_REDUCE: class c to r - lowbit(c); class c of r + lowbit(c)
 *       reduced into class c - lowbit(c);
 *   for k = 0 .. K-1: SENDRECV_REDUCE the class-0 slots with lowbit(j) = 2^k to
 *     r - D*2^k; those of r + D*2^k reduced into the j = 0 mod 2^(k+1);
 *   COPY slot 0 of class 0 (block r, POST on its last reduction) to the output.
 * The allgather starts by copying its own block to the output and to slot 0.
 * Classes open in increasing t, a depth-first walk of the class tree: only the
 * classes on one path are open at once, and class t uses area popcount(t):
 * 1 + floor(log2 T) areas. The order of reductions is fixed by the schedule,
 * so results do not depend on timing; PRE is applied once to each block (its
 * open), POST once to each result.
 *
 * Ragged ends. When n is not a power of two, classes t >= n - D*(J_0 - 1) hold
 * J_0 - 1 blocks, and top round k can have one receiver fewer than senders; the
 * slot without a partner (j = J_0 - 1 in a class message, the largest
 * j = 0 mod 2^(k+1) in the top round) may sit inside the bit-reversed order,
 * so such an exchange goes in two pieces around it, cut alike on both ends.
 * Every exchange is then two steps (the second may move nothing); one when
 * J_0 is a power of two.
 *
 *   n = 8, small data (A = 8, D = 1); the slots hold blocks r - j, in order
 *     of j:          0 4 2 6 1 5 3 7
 *     allgather      d=4: [0]        -> r+4, [4]        <- r-4
 *                    d=2: [0 4]      -> r+2, [2 6]      <- r-2
 *                    d=1: [0 4 2 6]  -> r+1, [1 5 3 7]  <- r-1
 *     reducescatter  d=1: [1 5 3 7] -> r-1, r+1's into [0 4 2 6]
 *                    d=2: [2 6] -> r-2, into [0 4];  d=4: [4] -> r-4, into [0]
 *   n = 8, A = 2 (D = 4): classes {0,4} {1,5} {2,6} {3,7}; class tree 1->0
 *     (d=1), 3->2 (d=1), 2->0 (d=2); top: j=1 -> j=0 (d=4). Reducescatter:
 *     open 0, open 1, 1->0, open 2, open 3, 3->2, 2->0, top, copy out
 *     (classes 0..3 in areas 0, 1, 1, 2).
 *   n = 6, small data: slots j = 0 4 2 1 5 3
 *     allgather      d=4: [0] -> r+4, [4] <- r-4
 *                    d=2: [0] -> r+2, [2] <- r-2        (4 has no child: 6 > 5)
 *                    d=1: [0 4 2] -> r+1, [1 5 3] <- r-1
 *   n = 6, A = 2 (D = 4): classes {0,4} {1,5} {2} {3}: 2->0 carries j = 0 only.
 *   n = 5, small data: slots j = 0 4 2 1 3; reducescatter d=1 sends [1 3]
 *     into j = 0 and 2, slots 0 and 2 around 4's: two pieces.
 *
 * Peers: r +- 2^i (every distance is a power of two below n). SCRATCH per
 * channel: (1 + floor(log2 T)) areas of J_0 * len <= chunk elements: at most
 * chunk for small data (one area), about (1 + log2 n) * len for large data
 * (log2 n for the reducescatter, none for the allgather). */
#include "algorithms/algorithms.h"

static uint64_t lowbit(uint64_t x)
{
    return x & (~x + 1);
}

static uint64_t popcount(uint64_t x)
{
    return (uint64_t)__builtin_popcountll(x);
}

static uint64_t floor_log2(uint64_t x) /* x >= 1 */
{
    return 63 - (uint64_t)__builtin_clzll(x);
}

static uint64_t ceil_log2(uint64_t x) /* x >= 1 */
{
    return x == 1 ? 0 : floor_log2(x - 1) + 1;
}

/* The shape of one channel's schedule: a pure function of (n, slice, chunk,
 * collective). */
struct pat_plan {
    uint64_t n;
    uint64_t len;    /* elements of each block per iteration */
    uint64_t delta;  /* D = P / A: the class count before truncation to n */
    uint64_t nclass; /* T = min(D, n) */
    uint64_t j0;     /* blocks of class 0 */
    uint64_t ktop;   /* top rounds: ceil(log2 j0) */
    uint64_t pieces; /* steps per exchange: 1 or 2 */
    uint64_t areas;  /* class areas of j0 slots */
    /* Unaggregated (j0 == 1): every message is one block, contiguous where it
     * lies, so the allgather sends from and receives into the output directly
     * (no opens, no SCRATCH) and the reducescatter accumulates block r in the
     * output (class 0's area is the output). */
    int is_direct;
    uint64_t opens;  /* steps per open: j0, or 0 for the direct allgather */
    uint64_t core;   /* steps of an iteration between the start and the finish */
};

static void plan_make(uint64_t n, uint64_t slice, uint64_t chunk, int is_gather, struct pat_plan *p)
{
    const uint64_t log_p = ceil_log2(n);
    p->n = n;
    p->len = plait_umin(slice, chunk);
    /* A = the largest power of two with A * len <= chunk, at most P */
    const uint64_t agg = chunk / p->len;
    const uint64_t log_a = plait_umin(floor_log2(agg), log_p);
    p->delta = 1ull << (log_p - log_a);
    p->nclass = plait_umin(p->delta, n);
    p->j0 = (n + p->delta - 1) / p->delta;
    p->ktop = ceil_log2(p->j0);
    p->pieces = (p->j0 & (p->j0 - 1)) ? 2 : 1;
    p->areas = 1 + floor_log2(p->nclass);
    p->is_direct = p->j0 == 1;
    p->opens = is_gather && p->is_direct ? 0 : p->j0;
    p->core = p->nclass * p->opens + p->pieces * (p->nclass - 1) + p->pieces * p->ktop;
}

/* Steps of one iteration: the allgather starts with the own block (to the
 * output, and to slot 0 unless direct), the reducescatter finishes by copying
 * block r out (unless direct: it is already there). */
static uint64_t plan_steps(const struct pat_plan *p, int is_gather)
{
    return p->core + (is_gather ? (p->is_direct ? 1 : 2) : (p->is_direct ? 0 : 1));
}

/* SCRATCH of one channel: the areas (less class 0's when direct). */
static uint64_t plan_scratch(const struct pat_plan *p, int is_gather)
{
    if (p->is_direct)
        return is_gather ? 0 : (p->areas - 1) * p->len;
    return p->areas * p->j0 * p->len;
}

/* Blocks of class t. */
static uint64_t class_size(const struct pat_plan *p, uint64_t t)
{
    return (p->n - t + p->delta - 1) / p->delta;
}

/* Slot of j among [0, size) in bit-reversed order: the j' that differ from j
 * first (lowest) at a bit where j has a one and j' a zero come before it. */
static uint64_t slot_of(uint64_t j, uint64_t size)
{
    uint64_t pos = 0;
    for (uint64_t x = j; x; x &= x - 1) {
        const uint64_t b = (uint64_t)__builtin_ctzll(x);
        const uint64_t v = j & ((1ull << b) - 1); /* the j' that agree below bit b, with a 0 at b */
        if (v < size)
            pos += (size - v + (2ull << b) - 1) >> (b + 1);
    }
    return pos;
}

/* Steps of the core before class t's open. */
static uint64_t steps_before(const struct pat_plan *p, uint64_t t)
{
    return t * p->opens + p->pieces * (t - popcount(t));
}

/* One core step, decoded (in reducescatter order). */
enum { OP_OPEN, OP_EXCHANGE };

struct pat_op {
    int kind;
    uint64_t t, j;             /* OP_OPEN: class and block index */
    uint64_t dist;             /* OP_EXCHANGE: data moves from rank r + dist to rank r */
    uint64_t src_class, src_slot; /* slots sent (reducescatter direction) */
    uint64_t dst_class, dst_slot; /* slots reduced into */
    uint64_t nslots;
    int is_last;               /* the last reduction into block r */
};

/* The piece of an exchange from slots [src_lo, src_lo + n0 + n1) into [dst_lo,
 * ...) that skips dst slot dst_lo + n0 (the one without a partner). */
static void exchange_piece(struct pat_op *op, uint64_t piece, uint64_t src_lo, uint64_t dst_lo, uint64_t n0,
                           uint64_t n1)
{
    op->kind = OP_EXCHANGE;
    if (piece == 0) {
        op->src_slot = src_lo;
        op->dst_slot = dst_lo;
        op->nslots = n0;
    } else {
        op->src_slot = src_lo + n0;
        op->dst_slot = n1 ? dst_lo + n0 + 1 : dst_lo;
        op->nslots = n1;
    }
}

static void decode(const struct pat_plan *p, uint64_t q, struct pat_op *op)
{
    op->is_last = 0;
    const uint64_t tree_steps = p->nclass * p->opens + p->pieces * (p->nclass - 1);
    if (q >= tree_steps) {
        /* top round k of class 0 */
        const uint64_t k = (q - tree_steps) / p->pieces;
        const uint64_t piece = (q - tree_steps) % p->pieces;
        const uint64_t step2 = 2ull << k;
        const uint64_t held = (p->j0 + step2 - 1) / step2;
        const uint64_t sent = (p->j0 - (1ull << k) + step2 - 1) / step2;
        uint64_t cut = sent;
        if (sent < held)
            cut = slot_of((p->j0 - 1) / step2 * step2, p->j0);
        op->dist = p->delta << k;
        op->src_class = 0;
        op->dst_class = 0;
        exchange_piece(op, piece, held, 0, cut, sent - cut);
        op->is_last = k + 1 == p->ktop && piece == 0;
        return;
    }
    /* the class t whose group holds step q: the last t with steps_before <= q
     * (with no opens, groups of no edges share their start with the next);
     * q / (opens + pieces) is at most t and short of it by O(log T) */
    uint64_t t = q / (p->opens + p->pieces);
    while (t + 1 < p->nclass && steps_before(p, t + 1) <= q)
        t++;
    const uint64_t off = q - steps_before(p, t);
    if (off < p->opens) {
        op->kind = OP_OPEN;
        op->t = t;
        op->j = off;
        return;
    }
    /* edge e of those ending at t: t with its e lowest set bits cleared, sent
     * to its parent */
    uint64_t c = t;
    for (uint64_t e = (off - p->opens) / p->pieces; e > 0; e--)
        c &= c - 1;
    const uint64_t piece = (off - p->opens) % p->pieces;
    const uint64_t parent = c - lowbit(c);
    const uint64_t jc = class_size(p, c), jp = class_size(p, parent);
    const uint64_t cut = jc == jp ? jc : slot_of(p->j0 - 1, p->j0);
    op->dist = lowbit(c);
    op->src_class = c;
    op->dst_class = parent;
    exchange_piece(op, piece, 0, 0, cut, jc - cut);
    /* the last edge into class 0 finishes block r when class 0 has one block */
    op->is_last = parent == 0 && p->ktop == 0 && c == (1ull << floor_log2(p->nclass - 1)) && piece == 0;
}

/* Every channel's SCRATCH region has the size of the largest: the slices are
 * channel 0's and possibly one shorter remainder. `mine` is the plan of a
 * channel whose slice is `slice` (it saves recomputing one of them). */
static uint64_t region_stride(const struct plait_sched_args *a, int is_gather, const struct pat_plan *mine,
                              uint64_t slice)
{
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, 0, a->align_elems, &lo, &hi);
    const uint64_t full = hi - lo;
    if (full == 0)
        return 0;
    const uint64_t rest = a->count % full;
    uint64_t size = 0;
    for (int i = 0; i < 2; i++) {
        const uint64_t sl = i == 0 ? full : rest;
        if (sl == 0)
            continue;
        struct pat_plan p;
        if (!mine || sl != slice)
            plan_make((uint64_t)a->nranks, sl, a->chunk_elems, is_gather, &p);
        const uint64_t sz = plan_scratch(mine && sl == slice ? mine : &p, is_gather);
        size = sz > size ? sz : size;
    }
    return size;
}

static void step_local(struct plait_step *out, int src_buf, uint64_t src_off, int dst_buf, uint64_t dst_off,
                       uint64_t count, unsigned flags)
{
    out->kind = PLAIT_STEP_COPY;
    out->flags = (uint8_t)flags;
    out->send_peer = -1;
    out->recv_peer = -1;
    out->src_buf = (uint8_t)src_buf;
    out->dst_buf = (uint8_t)dst_buf;
    out->src_off = src_off;
    out->dst_off = dst_off;
    out->count = count;
}

/* Where one iteration keeps things. */
struct pat_where {
    const struct pat_plan *p;
    int is_gather;
    uint64_t rank, count, base, cur, region;
};

/* Slot `slot` of class `cls` (in area popcount(cls)): the buffer and offset.
 * Direct: the allgather's classes are their blocks in the output; the
 * reducescatter's class 0 is block r's place in the output. */
static void locate(const struct pat_where *w, uint64_t cls, uint64_t slot, int *buf, uint64_t *off)
{
    const struct pat_plan *p = w->p;
    const uint64_t area = popcount(cls);
    if (!p->is_direct) {
        *buf = PLAIT_BUF_SCRATCH;
        *off = w->region + (area * p->j0 + slot) * w->cur;
    } else if (w->is_gather) {
        *buf = PLAIT_BUF_OUTPUT;
        *off = ((w->rank + p->n - cls) % p->n) * w->count + w->base;
    } else if (area == 0) {
        *buf = PLAIT_BUF_OUTPUT;
        *off = w->base;
    } else {
        *buf = PLAIT_BUF_SCRATCH;
        *off = w->region + (area - 1) * w->cur;
    }
}

int plait_pat_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int is_gather = a->coll == PLAIT_COLL_ALLGATHER;
    if (!is_gather && a->coll != PLAIT_COLL_REDUCESCATTER)
        return 0;
    const uint64_t n = (uint64_t)a->nranks;
    const uint64_t r = (uint64_t)a->rank;
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    if (hi <= lo)
        return 0;
    if (n == 1)
        return plait_sched_single_rank(a, channel, idx, out);
    struct pat_plan p;
    plan_make(n, hi - lo, a->chunk_elems, is_gather, &p);
    const uint64_t steps = plan_steps(&p, is_gather);
    const uint64_t iter = idx / steps;
    uint64_t s = idx % steps;
    const uint64_t base = lo + iter * p.len;
    if (base >= hi)
        return 0;
    const struct pat_where w = {&p, is_gather, r, a->count, base, plait_umin(p.len, hi - base),
                                (uint64_t)channel * region_stride(a, is_gather, &p, hi - lo)};
    int buf;
    uint64_t off;

    /* the allgather's start and the reducescatter's finish */
    if (is_gather) {
        const uint64_t start = p.is_direct ? 1 : 2;
        if (s < start) {
            if (s == 0)
                step_local(out, PLAIT_BUF_INPUT, base, PLAIT_BUF_OUTPUT, r * a->count + base, w.cur, 0);
            else
                step_local(out, PLAIT_BUF_INPUT, base, PLAIT_BUF_SCRATCH, w.region, w.cur, 0);
            return 1;
        }
        s = p.core - 1 - (s - start); /* the reducescatter's step, run backwards */
    } else if (s == p.core) {
        step_local(out, PLAIT_BUF_SCRATCH, w.region, PLAIT_BUF_OUTPUT, base, w.cur, 0);
        return 1;
    }
    struct pat_op op;
    decode(&p, s, &op);

    if (op.kind == OP_OPEN) {
        const uint64_t size = class_size(&p, op.t);
        const uint64_t x = p.delta * op.j + op.t;
        /* padding (a short class), or the own block, already in the output */
        const int is_empty = op.j >= size || (is_gather && x == 0);
        locate(&w, op.t, is_empty ? 0 : slot_of(op.j, size), &buf, &off);
        const uint64_t block = is_empty ? base : ((r + n - x) % n) * a->count + base;
        if (is_gather)
            step_local(out, buf, off, PLAIT_BUF_OUTPUT, block, is_empty ? 0 : w.cur, 0);
        else
            step_local(out, PLAIT_BUF_INPUT, block, buf, off, is_empty ? 0 : w.cur, PLAIT_STEP_PRE);
        return 1;
    }
    int from_buf, into_buf;
    uint64_t from, into;
    locate(&w, op.src_class, op.src_slot, &from_buf, &from);
    locate(&w, op.dst_class, op.dst_slot, &into_buf, &into);
    const uint64_t d = op.dist;
    out->count = op.nslots * w.cur;
    if (is_gather) {
        out->kind = PLAIT_STEP_SENDRECV;
        out->flags = 0;
        out->src_buf = (uint8_t)into_buf;
        out->src_off = into;
        out->dst_buf = (uint8_t)from_buf;
        out->dst_off = from;
        out->send_peer = (int32_t)((r + d) % n);
        out->recv_peer = (int32_t)((r + n - d) % n);
    } else {
        out->kind = PLAIT_STEP_SENDRECV_REDUCE;
        out->flags = op.is_last ? PLAIT_STEP_POST : 0;
        out->src_buf = (uint8_t)from_buf;
        out->src_off = from;
        out->dst_buf = (uint8_t)into_buf;
        out->dst_off = into;
        out->send_peer = (int32_t)((r + n - d) % n);
        out->recv_peer = (int32_t)((r + d) % n);
    }
    return 1;
}

int plait_pat_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER;
}

int plait_pat_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    return plait_peers_pow2(nranks, rank, out, max);
}

uint64_t plait_pat_scratch(const struct plait_sched_args *a)
{
    if (a->nranks <= 1 || a->count == 0)
        return 0;
    return (uint64_t)a->nchannels * region_stride(a, a->coll == PLAIT_COLL_ALLGATHER, NULL, 0);
}
