/* Direct (all-pairs) allreduce for small messages on few ranks: one-shot and
 * two-shot. Every rank talks to every other rank, so both are limited to 32
 * ranks; their point is latency (each contribution is one hop from where it is
 * reduced, and a result one hop from where it is needed, where the ring chains
 * up to 2(n-1) hops), not bandwidth: a rank moves n-1 times its data.
 *
 * The pre-op (avg's and premulsum's scaling) belongs to the rank that
 * contributes: with premulsum each rank has its own scalar. So every rank
 * first scales its own contribution (a COPY with PRE into SCRATCH) and sends
 * that; the reductions apply no pre-op at all. (Applying PRE on the receiving
 * rank to what it received scaled every contribution by the receiver's scalar:
 * harmless for avg, whose scalar is the same everywhere, wrong for premulsum.)
 * The executor's scaled reduction rounds the scaled value to the element type
 * before it adds, so scaling first and adding later gives the same bits.
 *
 * One-shot. Each channel walks its range in chunks of chunk_elems. Per chunk,
 * rank r scales its input into SCRATCH slot 0, exchanges that slot with every
 * other rank in n-1 SENDRECV rounds in pairwise order (round i: send to r+i,
 * receive from r-i into SCRATCH slot i), then reduces the n contributions
 * itself into its output, in rank order 0..n-1, so that every rank computes
 * the same tree ((x0 + x1) + x2) + ... and gets the same bits:
 *
 *   COPY   x_r -> slot 0      (PRE: the rank's own scalar)
 *   SENDRECV slot 0 -> r+i, r-i -> slot i      (i = 1 .. n-1)
 *   COPY   x0 -> out
 *   REDUCE x1 .. x(n-1) -> out                 (POST on the last)
 *
 * where x_q is in slot (r - q) mod n. The output is written only after the
 * input was read (by the first COPY), so in place needs nothing more.
 * SCRATCH: n slots of min(chunk, channel range) per channel.
 *
 *   n = 3, one chunk:    rank 0        rank 1        rank 2
 *   scale (COPY, PRE)    s0*x0         s1*x1         s2*x2
 *   round 1 (SENDRECV)   x0 -> 1       x1 -> 2       x2 -> 0
 *   round 2 (SENDRECV)   x0 -> 2       x1 -> 0       x2 -> 1
 *   reduce               (x0+x1)+x2    (x0+x1)+x2    (x0+x1)+x2   (each on its own)
 *
 * Two-shot. A chunk covers n rank-blocks (like the ring's iteration); rank r
 * owns block r. Rank r first scales its whole chunk (all n blocks, COPY with
 * PRE) into the SCRATCH area `own`. Reduce-scatter by direct exchange: in round
 * i rank r sends its scaled block r+i to rank r+i and receives rank r-i's
 * scaled block r into SCRATCH slot i; then it reduces block r in rank order
 * exactly as one-shot does (its own block read from `own`), into its output.
 * Allgather by direct exchange: in round i it sends its finished block to r+i
 * and receives block r-i from r-i into the output. Each block is finalised once
 * and copied, so all ranks get the same bits. SCRATCH per channel: `own`, n
 * slots (a chunk: n blocks of at most a slot each), then n-1 receive slots.
 *
 * Both halves of a SENDRECV move the same count; in a channel's last, shorter
 * iteration the blocks sent and received in a round may differ in size, and
 * that round is then a SEND followed by a RECV (each message is still one
 * contiguous unit on both ends, so the pieces agree). A message is at most
 * chunk_elems (<= half the FIFO), and a rank cannot be more than one phase
 * ahead of its receiver on a connection (it would need that receiver's data),
 * so the FIFO always has room for two messages and a SEND never waits for
 * its receiver to reach it.
 *
 * Peers: every other rank. */
#include "algorithms/algorithms.h"

#define DIRECT_MAX_RANKS 32

static void put(struct plait_step *st, int kind, int src_buf, uint64_t src_off, int dst_buf, uint64_t dst_off,
                uint64_t count, unsigned flags)
{
    st->kind = (uint8_t)kind;
    st->src_buf = (uint8_t)src_buf;
    st->dst_buf = (uint8_t)dst_buf;
    st->flags = (uint8_t)flags;
    st->send_peer = -1;
    st->recv_peer = -1;
    st->src_off = src_off;
    st->dst_off = dst_off;
    st->count = count;
}

/* One round of a direct exchange, counted down by *s: sn elements of
 * sbuf[soff..] to `to` and dn elements from `from` into dbuf[doff..]. Equal
 * sizes make one SENDRECV, different ones (a short last block) a SEND then a
 * RECV, so both ends number the same pieces. Returns 1 with *out filled when
 * *s falls in this round, else takes the round's steps off *s and returns 0. */
static int exchange_step(uint64_t *s, int to, int sbuf, uint64_t soff, uint64_t sn, int from, int dbuf, uint64_t doff,
                         uint64_t dn, struct plait_step *out)
{
    if (sn == dn) {
        if (*s == 0) {
            put(out, PLAIT_STEP_SENDRECV, sbuf, soff, dbuf, doff, sn, 0);
            out->send_peer = to;
            out->recv_peer = from;
            return 1;
        }
        *s -= 1;
        return 0;
    }
    if (*s == 0) {
        put(out, PLAIT_STEP_SEND, sbuf, soff, dbuf, 0, sn, 0);
        out->send_peer = to;
        return 1;
    }
    if (*s == 1) {
        put(out, PLAIT_STEP_RECV, sbuf, 0, dbuf, doff, dn, 0);
        out->recv_peer = from;
        return 1;
    }
    *s -= 2;
    return 0;
}

/* Where the scaled contribution x_q of the chunk or block is on rank r: its own
 * at `own`, the one from rank q in the SCRATCH slot of the round (r - q) mod n
 * that brought it (slot i at recv + (i - 1) * slot). */
static uint64_t contribution(int n, int r, int q, uint64_t own, uint64_t recv, uint64_t slot)
{
    if (q == r)
        return own;
    return recv + (uint64_t)((r - q + n) % n - 1) * slot;
}

/* Step k (0 .. n-1) of the rank-order reduction of the n scaled contributions
 * into OUTPUT[off, off + count) (see the header). No pre-op: each rank applied
 * its own before it sent. */
static void reduce_step(int n, int r, uint64_t k, uint64_t off, uint64_t count, uint64_t own, uint64_t recv,
                        uint64_t slot, struct plait_step *out)
{
    const unsigned post = k == (uint64_t)n - 1 ? PLAIT_STEP_POST : 0;
    const uint64_t at = contribution(n, r, (int)k, own, recv, slot);
    put(out, k == 0 ? PLAIT_STEP_COPY : PLAIT_STEP_REDUCE, PLAIT_BUF_SCRATCH, at, PLAIT_BUF_OUTPUT, off, count, post);
}

/* ------------------------------------------------------------------ one-shot */

int plait_oneshot_supports(int coll, int nranks)
{
    return coll == PLAIT_COLL_ALLREDUCE && nranks <= DIRECT_MAX_RANKS;
}

int plait_oneshot_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int n = a->nranks, r = a->rank;
    if (n == 1)
        return plait_sched_single_rank(a, channel, idx, out);
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    /* scale, n-1 rounds, n reduction steps */
    const uint64_t spi = 2 * (uint64_t)n;
    const uint64_t iter = idx / spi, s = idx % spi;
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(a->chunk_elems, hi - base);
    const uint64_t slot = plait_sched_chunk_slot(a);
    const uint64_t own = (uint64_t)channel * (uint64_t)n * slot, recv = own + slot;
    if (s == 0) {
        put(out, PLAIT_STEP_COPY, PLAIT_BUF_INPUT, base, PLAIT_BUF_SCRATCH, own, len, PLAIT_STEP_PRE);
        return 1;
    }
    if (s < (uint64_t)n) {
        const int i = (int)s;
        put(out, PLAIT_STEP_SENDRECV, PLAIT_BUF_SCRATCH, own, PLAIT_BUF_SCRATCH, recv + (uint64_t)(i - 1) * slot, len,
            0);
        out->send_peer = (r + i) % n;
        out->recv_peer = (r - i + n) % n;
        return 1;
    }
    reduce_step(n, r, s - (uint64_t)n, base, len, own, recv, slot, out);
    return 1;
}

int plait_oneshot_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    return plait_peers_all(nranks, rank, out, max);
}

uint64_t plait_oneshot_scratch(const struct plait_sched_args *a)
{
    if (a->nranks <= 1)
        return 0;
    return (uint64_t)a->nchannels * (uint64_t)a->nranks * plait_sched_chunk_slot(a);
}

/* ------------------------------------------------------------------ two-shot */

int plait_twoshot_supports(int coll, int nranks)
{
    return coll == PLAIT_COLL_ALLREDUCE && nranks <= DIRECT_MAX_RANKS;
}

/* Elements of one SCRATCH slot: the largest block a chunk can have. n of them
 * hold a whole chunk: n * chunk_elems, or at least the channel's range. */
static uint64_t twoshot_slot(const struct plait_sched_args *a)
{
    const uint64_t n = (uint64_t)a->nranks;
    return plait_umin(a->chunk_elems, plait_round_up((plait_sched_max_channel_range(a) + n - 1) / n, a->align_elems));
}

/* Block k of a chunk of len elements split in n blocks of cs. */
static uint64_t block_lo(uint64_t k, uint64_t cs, uint64_t len)
{
    return plait_umin(k * cs, len);
}

static uint64_t block_size(uint64_t k, uint64_t cs, uint64_t len)
{
    return plait_umin((k + 1) * cs, len) - block_lo(k, cs, len);
}

int plait_twoshot_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const int n = a->nranks, r = a->rank;
    if (n == 1)
        return plait_sched_single_rank(a, channel, idx, out);
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t per_iter = (uint64_t)n * a->chunk_elems;
    const uint64_t red = (uint64_t)n;
    /* a full chunk's blocks are all chunk_elems: the scaling COPY, one
     * SENDRECV per round */
    const uint64_t spi_full = 1 + 2 * (uint64_t)(n - 1) + red;
    const uint64_t nfull = (hi - lo) / per_iter;
    uint64_t iter, s;
    if (idx < nfull * spi_full) {
        iter = idx / spi_full;
        s = idx % spi_full;
    } else {
        iter = nfull;
        s = idx - nfull * spi_full;
    }
    const uint64_t base = lo + iter * per_iter;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(per_iter, hi - base);
    const uint64_t cs = plait_round_up((len + (uint64_t)n - 1) / (uint64_t)n, a->align_elems);
    const uint64_t slot = twoshot_slot(a);
    /* per channel: the scaled chunk (n slots), then n-1 receive slots */
    const uint64_t own = (uint64_t)channel * (uint64_t)(2 * n - 1) * slot, recv = own + (uint64_t)n * slot;
    const uint64_t mine = (uint64_t)r, my_lo = base + block_lo(mine, cs, len), my_n = block_size(mine, cs, len);

    if (s == 0) {
        put(out, PLAIT_STEP_COPY, PLAIT_BUF_INPUT, base, PLAIT_BUF_SCRATCH, own, len, PLAIT_STEP_PRE);
        return 1;
    }
    s -= 1;
    /* reduce-scatter rounds: send scaled block r+i to r+i, receive block r from r-i */
    for (int i = 1; i < n; i++) {
        const int to = (r + i) % n, from = (r - i + n) % n;
        const uint64_t to_n = block_size((uint64_t)to, cs, len);
        const uint64_t to_at = own + block_lo((uint64_t)to, cs, len);
        const uint64_t dst = recv + (uint64_t)(i - 1) * slot;
        if (exchange_step(&s, to, PLAIT_BUF_SCRATCH, to_at, to_n, from, PLAIT_BUF_SCRATCH, dst, my_n, out))
            return 1;
    }
    if (s < red) {
        reduce_step(n, r, s, my_lo, my_n, own + block_lo(mine, cs, len), recv, slot, out);
        return 1;
    }
    s -= red;
    /* allgather rounds: send the finished block r to r+i, receive block r-i */
    for (int i = 1; i < n; i++) {
        const int to = (r + i) % n, from = (r - i + n) % n;
        const uint64_t from_n = block_size((uint64_t)from, cs, len);
        const uint64_t from_lo = base + block_lo((uint64_t)from, cs, len);
        if (exchange_step(&s, to, PLAIT_BUF_OUTPUT, my_lo, my_n, from, PLAIT_BUF_OUTPUT, from_lo, from_n, out))
            return 1;
    }
    return 0;
}

int plait_twoshot_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    return plait_peers_all(nranks, rank, out, max);
}

uint64_t plait_twoshot_scratch(const struct plait_sched_args *a)
{
    if (a->nranks <= 1)
        return 0;
    return (uint64_t)a->nchannels * (uint64_t)(2 * a->nranks - 1) * twoshot_slot(a);
}
