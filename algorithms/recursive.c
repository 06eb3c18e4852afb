/* Recursive halving and doubling: allreduce (Rabenseifner), allgather
 * (recursive doubling) and reducescatter (recursive halving), any rank count.
 *
 * Ranks. n ranks, p the largest power of two <= n, e = n - p, L = log2(p).
 * Ranks 0..p-1 run the main phase, with partners r XOR d (d = 2^i < p, that
 * is r +- d without wrapping). Each extra rank x = p + j (j < e) first folds
 * its data into rank j and at the end gets the result back from it. So a
 * rank's peers are r +- 2^i and, for r < e or r >= p, its fold partner r +- p.
 *
 * Allreduce. Each channel walks its range in windows of p * chunk_elems; a
 * window is cut into p segments of cs = ceil(len / p) elements (16-byte
 * aligned; the last ones may be short or empty). Everything happens in
 * OUTPUT, which a COPY with PRE fills from INPUT first (in place it scales the
 * user's buffer where it is). Halving, d = p/2 .. 1: before the round of
 * distance d, rank r holds partial sums of segments [r & ~(2d-1), +2d); it
 * keeps [r & ~(d-1), +d), sends the other half to r ^ d and reduces into its
 * own half what r ^ d sends. Rank r ends with the final value of segment r,
 * computed there and nowhere else (POST in the last round); doubling
 * (d = 1 .. p/2) copies the final segments around, so every rank gets the
 * same bits. A round whose halves differ in size (only at the end of a
 * window) is a SENDRECV(_REDUCE) of the smaller size plus a one-way step for
 * the rest of the larger half, computed alike on both ends.
 *
 *   per window, rank r < p (x = r + p its extra rank when r < e):
 *     COPY(PRE) INPUT -> OUTPUT, or for r < e RECV_REDUCE_COPY(PRE) from x
 *     d = p/2 .. 1:  SENDRECV_REDUCE (POST when d = 1), then RECV_REDUCE_COPY
 *                    of the rest (keeper of the larger half) / SEND (other)
 *     d = 1 .. p/2:  SENDRECV, then SEND (holder of the larger half) / RECV
 *     r < e:         SEND the window to x
 *   extra rank x:    SEND(PRE) the window to x - p, RECV the result
 *
 *   n = 6 (p = 4, e = 2), segments s0..s3 of one window:
 *     fold      4 -> 0, 5 -> 1          (0 holds x0+x4, 1 holds x1+x5)
 *     d = 2     0 <-> 2, 1 <-> 3        (0, 1 keep s0 s1; 2, 3 keep s2 s3)
 *     d = 1     0 <-> 1, 2 <-> 3        (rank k keeps sk, final: POST)
 *     d = 1     0 <-> 1, 2 <-> 3        (0, 1 hold s0 s1; 2, 3 hold s2 s3)
 *     d = 2     0 <-> 2, 1 <-> 3        (everyone holds s0..s3)
 *     unfold    0 -> 4, 1 -> 5
 *
 * Allgather and reducescatter: the gathered buffer (allgather's OUTPUT,
 * reducescatter's INPUT) holds block k at k * count, as NCCL puts it, and is
 * treated as one array of n * count elements: channels split that array
 * (plait_sched_channel_range over n * count) and each channel walks its part
 * in windows of n * chunk_elems. The main phase works on p groups: group
 * g < e is {block g, block g + p}, group g >= e is {block g}; rank r < p
 * starts the doubling from (ends the halving with) group r, its own block and,
 * for r < e, its extra rank's. What a rank holds (or keeps) in the round of
 * distance d is the groups [r & ~(d-1), +d): blocks [g0, g0+d), contiguous,
 * and their extra blocks [g0+p, min(g0+d, e)+p), contiguous too. A round is
 * therefore two exchanges (each a SENDRECV(_REDUCE) of the common size and a
 * one-way step for the rest), of whatever those ranges have in the window,
 * however many blocks they span: O(log p) steps per window.
 *
 * Allgather, per window: COPY the own block's part into OUTPUT; extra rank x
 * SENDs its part to x - p, which RECVs it; rounds d = 1 .. p/2 exchange the
 * held ranges in place in OUTPUT; rank r < e finally SENDs x the window minus
 * x's block (two ranges), which x RECVs.
 *
 * Reducescatter, per window: SCRATCH mirrors the window (window element w at
 * SCRATCH[c * part + w - w0] on channel c). Rank r < p COPYs the window of
 * INPUT into it with PRE (r < e: RECV_REDUCE_COPY with PRE, adding the window
 * that x SENDs with PRE); halving rounds d = p/2 .. 1 reduce in SCRATCH (POST
 * in the last); then r COPYs its block's part to OUTPUT and, if r < e, SENDs
 * x's block's part to x, which RECVs it into OUTPUT. INPUT is only read, and
 * in place the own block is overwritten only after its window was read.
 * SCRATCH: nchannels * min(n * chunk_elems, channel 0's range) elements on
 * ranks 0..p-1, none on the extra ranks.
 *
 * Deadlock: every exchange is between a fixed pair, in the same order on both
 * ends, each step talks to one peer, and no step holds a received slot while
 * waiting for credit (receives never wait for credit), so any FIFO depth, one
 * slot included, completes. */
#include "algorithms/algorithms.h"

/* p: the largest power of two <= n; *log_out = log2(p). */
static int pow2_floor(int n, int *log_out)
{
    int p = 1, l = 0;
    while (2L * p <= n) {
        p *= 2;
        l++;
    }
    *log_out = l;
    return p;
}

static void set_step(struct plait_step *st, int kind, int src_buf, uint64_t src_off, int dst_buf, uint64_t dst_off,
                     uint64_t count, unsigned flags, int send_peer, int recv_peer)
{
    st->kind = (uint8_t)kind;
    st->src_buf = (uint8_t)src_buf;
    st->dst_buf = (uint8_t)dst_buf;
    st->flags = (uint8_t)flags;
    st->send_peer = send_peer;
    st->recv_peer = recv_peer;
    /* an empty intersection may sit past a buffer's end: it touches nothing */
    st->src_off = count ? src_off : 0;
    st->dst_off = count ? dst_off : 0;
    st->count = count;
}

/* A half-open element range. */
struct span {
    uint64_t lo, hi;
};

/* [lo, hi) intersected with the window [w0, w1) (empty: lo == hi). */
static struct span clip(uint64_t lo, uint64_t hi, uint64_t w0, uint64_t w1)
{
    struct span s;
    s.lo = lo < w0 ? w0 : lo > w1 ? w1 : lo;
    s.hi = hi < s.lo ? s.lo : hi > w1 ? w1 : hi;
    return s;
}

static uint64_t span_len(struct span s)
{
    return s.hi - s.lo;
}

/* One exchange of a round with `partner`, in buffer coordinates: `mine` is
 * what r keeps (halving) or holds (doubling), `other` the partner's. Part 0
 * moves the common size both ways; part 1 the rest of the larger side, one
 * way. Halving: r sends `other` and reduces into `mine` (flags: POST on the
 * last round); doubling: r sends `mine` and receives into `other`. The partner
 * computes the same with the roles swapped, so the two ends agree. */
static void exchange_step(struct span mine, struct span other, int part, int is_halving, int buf, int partner,
                          unsigned flags, struct plait_step *out)
{
    const uint64_t nm = span_len(mine), no = span_len(other), c = plait_umin(nm, no);
    if (part == 0) {
        if (is_halving)
            set_step(out, PLAIT_STEP_SENDRECV_REDUCE, buf, other.lo, buf, mine.lo, c, flags, partner, partner);
        else
            set_step(out, PLAIT_STEP_SENDRECV, buf, mine.lo, buf, other.lo, c, 0, partner, partner);
        return;
    }
    if (is_halving) {
        if (nm > no)
            set_step(out, PLAIT_STEP_RECV_REDUCE_COPY, buf, mine.lo + c, buf, mine.lo + c, nm - c, flags, -1,
                     partner);
        else
            set_step(out, PLAIT_STEP_SEND, buf, other.lo + c, buf, 0, no - c, 0, partner, -1);
    } else {
        if (nm > no)
            set_step(out, PLAIT_STEP_SEND, buf, mine.lo + c, buf, 0, nm - c, 0, partner, -1);
        else
            set_step(out, PLAIT_STEP_RECV, buf, 0, buf, other.lo + c, no - c, 0, -1, partner);
    }
}

/* ------------------------------------------------------------------ allreduce */

static int allreduce_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int n = a->nranks, r = a->rank;
    int lg;
    const int p = pow2_floor(n, &lg);
    const int e = n - p;
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t window = (uint64_t)p * a->chunk_elems;
    const uint64_t steps = r >= p ? 2 : 1 + 4 * (uint64_t)lg + (r < e ? 1 : 0);
    const uint64_t iter = idx / steps;
    const uint64_t s = idx % steps;
    const uint64_t base = lo + iter * window;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(window, hi - base);

    if (r >= p) { /* an extra rank: fold in, get the result back */
        if (s == 0)
            set_step(out, PLAIT_STEP_SEND, PLAIT_BUF_INPUT, base, PLAIT_BUF_OUTPUT, 0, len, PLAIT_STEP_PRE, r - p, -1);
        else
            set_step(out, PLAIT_STEP_RECV, PLAIT_BUF_OUTPUT, 0, PLAIT_BUF_OUTPUT, base, len, 0, -1, r - p);
        return 1;
    }
    if (s == 0) {
        if (r < e)
            set_step(out, PLAIT_STEP_RECV_REDUCE_COPY, PLAIT_BUF_INPUT, base, PLAIT_BUF_OUTPUT, base, len,
                     PLAIT_STEP_PRE, -1, r + p);
        else
            set_step(out, PLAIT_STEP_COPY, PLAIT_BUF_INPUT, base, PLAIT_BUF_OUTPUT, base, len, PLAIT_STEP_PRE, -1, -1);
        return 1;
    }
    if (s > 4 * (uint64_t)lg) { /* r < e: hand the window to the extra rank */
        set_step(out, PLAIT_STEP_SEND, PLAIT_BUF_OUTPUT, base, PLAIT_BUF_OUTPUT, 0, len, 0, r + p, -1);
        return 1;
    }
    uint64_t cs = (len + (uint64_t)p - 1) / (uint64_t)p;
    cs = (cs + a->align_elems - 1) / a->align_elems * a->align_elems;
    const uint64_t t = s - 1;
    const int is_halving = t < 2 * (uint64_t)lg;
    const int round = (int)((is_halving ? t : t - 2 * (uint64_t)lg) / 2);
    const int d = is_halving ? p >> (round + 1) : 1 << round;
    const int partner = r ^ d;
    const uint64_t m0 = (uint64_t)(r & ~(d - 1)), o0 = (uint64_t)(partner & ~(d - 1));
    const uint64_t w1 = base + len;
    const struct span mine = clip(base + m0 * cs, base + (m0 + (uint64_t)d) * cs, base, w1);
    const struct span other = clip(base + o0 * cs, base + (o0 + (uint64_t)d) * cs, base, w1);
    exchange_step(mine, other, (int)(t % 2), is_halving, PLAIT_BUF_OUTPUT, partner,
                  is_halving && d == 1 ? PLAIT_STEP_POST : 0u, out);
    return 1;
}

/* ------------------------------------------------------------------ blocks */

/* Allgather and reducescatter see the gathered buffer (n blocks of `count`,
 * block k at k * count) as one array of n * count elements: channels and
 * windows cut that array. What rank r < p holds or keeps in a round is the
 * groups [g0, g0 + d): the main blocks [g0, g0 + d), contiguous, and the extra
 * blocks [g0 + p, min(g0 + d, e) + p), contiguous too; `which` picks one. */
static struct span group_span(int g0, int d, int p, int e, int which, uint64_t cnt, uint64_t w0, uint64_t w1)
{
    if (which == 0)
        return clip((uint64_t)g0 * cnt, (uint64_t)(g0 + d) * cnt, w0, w1);
    if (g0 >= e)
        return clip(0, 0, w0, w1);
    const int end = g0 + d < e ? g0 + d : e;
    return clip((uint64_t)(g0 + p) * cnt, (uint64_t)(end + p) * cnt, w0, w1);
}

/* The window of the gathered array: n chunks, as a ring iteration moves
 * chunk_elems of every block. Sets [*w0, *w1) and returns 0 past the end. */
static int block_window(const struct plait_sched_args *a, int channel, uint64_t iter, uint64_t *w0, uint64_t *w1)
{
    uint64_t lo, hi;
    plait_sched_channel_range((uint64_t)a->nranks * a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t window = (uint64_t)a->nranks * a->chunk_elems;
    *w0 = lo + iter * window;
    if (*w0 >= hi)
        return 0;
    *w1 = *w0 + plait_umin(window, hi - *w0);
    return 1;
}

/* ------------------------------------------------------------------ allgather */

static int allgather_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int n = a->nranks, r = a->rank;
    int lg;
    const int p = pow2_floor(n, &lg);
    const int e = n - p;
    const uint64_t cnt = a->count, total = (uint64_t)n * cnt;
    const uint64_t per_round = e > 0 ? 4 : 2;
    const uint64_t steps = r >= p ? 4 : 1 + per_round * (uint64_t)lg + (r < e ? 3 : 0);
    uint64_t s = idx % steps, w0, w1;
    if (!block_window(a, channel, idx / steps, &w0, &w1))
        return 0;
    const struct span own = clip((uint64_t)r * cnt, (uint64_t)(r + 1) * cnt, w0, w1);

    if (s == 0) {
        set_step(out, PLAIT_STEP_COPY, PLAIT_BUF_INPUT, own.lo - (uint64_t)r * cnt, PLAIT_BUF_OUTPUT, own.lo,
                 span_len(own), 0, -1, -1);
        return 1;
    }
    if (r >= p) { /* an extra rank: its block to r - p, then everything else back */
        const int j = r - p;
        if (s == 1) {
            set_step(out, PLAIT_STEP_SEND, PLAIT_BUF_INPUT, own.lo - (uint64_t)r * cnt, PLAIT_BUF_OUTPUT, 0,
                     span_len(own), 0, j, -1);
        } else {
            const struct span rest = s == 2 ? clip(0, (uint64_t)r * cnt, w0, w1)
                                            : clip((uint64_t)(r + 1) * cnt, total, w0, w1);
            set_step(out, PLAIT_STEP_RECV, PLAIT_BUF_OUTPUT, 0, PLAIT_BUF_OUTPUT, rest.lo, span_len(rest), 0, -1, j);
        }
        return 1;
    }
    s--;
    const int x = r + p;
    if (r < e) {
        if (s == 0) {
            const struct span xb = clip((uint64_t)x * cnt, (uint64_t)(x + 1) * cnt, w0, w1);
            set_step(out, PLAIT_STEP_RECV, PLAIT_BUF_OUTPUT, 0, PLAIT_BUF_OUTPUT, xb.lo, span_len(xb), 0, -1, x);
            return 1;
        }
        s--;
    }
    if (s < per_round * (uint64_t)lg) {
        const int d = 1 << (int)(s / per_round);
        const int q = (int)(s % per_round);
        const int partner = r ^ d;
        const struct span mine = group_span(r & ~(d - 1), d, p, e, q / 2, cnt, w0, w1);
        const struct span other = group_span(partner & ~(d - 1), d, p, e, q / 2, cnt, w0, w1);
        exchange_step(mine, other, q % 2, 0, PLAIT_BUF_OUTPUT, partner, 0, out);
        return 1;
    }
    s -= per_round * (uint64_t)lg; /* r < e: the window but x's own block, to x */
    const struct span rest = s == 0 ? clip(0, (uint64_t)x * cnt, w0, w1) : clip((uint64_t)(x + 1) * cnt, total, w0, w1);
    set_step(out, PLAIT_STEP_SEND, PLAIT_BUF_OUTPUT, rest.lo, PLAIT_BUF_OUTPUT, 0, span_len(rest), 0, x, -1);
    return 1;
}

/* ------------------------------------------------------------------ reducescatter */

/* SCRATCH per channel: one window, or channel 0's range when that is shorter
 * (channel 0's is the longest). */
static uint64_t rs_part(const struct plait_sched_args *a)
{
    uint64_t lo, hi;
    plait_sched_channel_range((uint64_t)a->nranks * a->count, a->nchannels, 0, a->align_elems, &lo, &hi);
    return plait_umin((uint64_t)a->nranks * a->chunk_elems, hi - lo);
}

static int reducescatter_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int n = a->nranks, r = a->rank;
    int lg;
    const int p = pow2_floor(n, &lg);
    const int e = n - p;
    const uint64_t cnt = a->count;
    const uint64_t per_round = e > 0 ? 4 : 2;
    const uint64_t steps = r >= p ? 2 : 2 + per_round * (uint64_t)lg + (r < e ? 1 : 0);
    uint64_t s = idx % steps, w0, w1;
    if (!block_window(a, channel, idx / steps, &w0, &w1))
        return 0;
    const struct span own = clip((uint64_t)r * cnt, (uint64_t)(r + 1) * cnt, w0, w1);
    /* the window's element w sits at SCRATCH[w + shift] (mod 2^64) */
    const uint64_t shift = (uint64_t)channel * rs_part(a) - w0;

    if (r >= p) { /* an extra rank: its pre-scaled window to r - p, then its own block back */
        if (s == 0)
            set_step(out, PLAIT_STEP_SEND, PLAIT_BUF_INPUT, w0, PLAIT_BUF_OUTPUT, 0, w1 - w0, PLAIT_STEP_PRE, r - p,
                     -1);
        else
            set_step(out, PLAIT_STEP_RECV, PLAIT_BUF_OUTPUT, 0, PLAIT_BUF_OUTPUT, own.lo - (uint64_t)r * cnt,
                     span_len(own), 0, -1, r - p);
        return 1;
    }
    if (s == 0) {
        if (r < e)
            set_step(out, PLAIT_STEP_RECV_REDUCE_COPY, PLAIT_BUF_INPUT, w0, PLAIT_BUF_SCRATCH, w0 + shift, w1 - w0,
                     PLAIT_STEP_PRE, -1, r + p);
        else
            set_step(out, PLAIT_STEP_COPY, PLAIT_BUF_INPUT, w0, PLAIT_BUF_SCRATCH, w0 + shift, w1 - w0,
                     PLAIT_STEP_PRE, -1, -1);
        return 1;
    }
    s--;
    if (s < per_round * (uint64_t)lg) {
        const int d = p >> (int)(s / per_round + 1);
        const int q = (int)(s % per_round);
        const int partner = r ^ d;
        struct span mine = group_span(r & ~(d - 1), d, p, e, q / 2, cnt, w0, w1);
        struct span other = group_span(partner & ~(d - 1), d, p, e, q / 2, cnt, w0, w1);
        mine.lo += shift;
        mine.hi += shift;
        other.lo += shift;
        other.hi += shift;
        exchange_step(mine, other, q % 2, 1, PLAIT_BUF_SCRATCH, partner, d == 1 ? PLAIT_STEP_POST : 0u, out);
        return 1;
    }
    s -= per_round * (uint64_t)lg;
    if (s == 0) {
        set_step(out, PLAIT_STEP_COPY, PLAIT_BUF_SCRATCH, own.lo + shift, PLAIT_BUF_OUTPUT, own.lo - (uint64_t)r * cnt,
                 span_len(own), 0, -1, -1);
    } else { /* r < e: the extra rank's block */
        const int x = r + p;
        const struct span xb = clip((uint64_t)x * cnt, (uint64_t)(x + 1) * cnt, w0, w1);
        set_step(out, PLAIT_STEP_SEND, PLAIT_BUF_SCRATCH, xb.lo + shift, PLAIT_BUF_OUTPUT, 0, span_len(xb), 0, x, -1);
    }
    return 1;
}

/* ------------------------------------------------------------------ the table's entry points */

int plait_recursive_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_ALLREDUCE || coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER;
}

int plait_recursive_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (a->nranks == 1)
        return plait_sched_single_rank(a, channel, idx, out);
    switch (a->coll) {
    case PLAIT_COLL_ALLREDUCE:
        return allreduce_step(a, channel, idx, out);
    case PLAIT_COLL_ALLGATHER:
        return allgather_step(a, channel, idx, out);
    case PLAIT_COLL_REDUCESCATTER:
        return reducescatter_step(a, channel, idx, out);
    default:
        return 0;
    }
}

static void add_peer(int peer, int *out, int *cnt, int max)
{
    for (int i = 0; i < *cnt; i++)
        if (out[i] == peer)
            return;
    if (*cnt < max)
        out[(*cnt)++] = peer;
}

/* Exactly the ranks the schedules use: r XOR 2^i (that is r +- 2^i, never
 * wrapping) for 2^i < p, and the fold partner r +- p. */
int plait_recursive_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    int lg, cnt = 0;
    if (nranks < 2)
        return 0;
    const int p = pow2_floor(nranks, &lg);
    const int e = nranks - p;
    if (rank >= p) {
        add_peer(rank - p, out, &cnt, max);
        return cnt;
    }
    for (int d = 1; d < p; d *= 2)
        add_peer(rank ^ d, out, &cnt, max);
    if (rank < e)
        add_peer(rank + p, out, &cnt, max);
    return cnt;
}

uint64_t plait_recursive_scratch(const struct plait_sched_args *a)
{
    int lg;
    if (a->coll != PLAIT_COLL_REDUCESCATTER || a->nranks < 2 || a->rank >= pow2_floor(a->nranks, &lg))
        return 0; /* only reducescatter's main ranks; extra ranks send straight from INPUT */
    return (uint64_t)a->nchannels * rs_part(a);
}
