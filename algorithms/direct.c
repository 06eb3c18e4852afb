/* Direct (all-pairs) allreduce for small messages on few ranks: one-shot and
 * two-shot. Every rank talks to every other rank, so both are limited to 32
 * ranks; their point is latency (each contribution is one hop from where it is
 * reduced, and a result one hop from where it is needed, where the ring chains
 * up to 2(n-1) hops), not bandwidth: a rank moves n-1 times its data.
 *
 * One-shot. Each channel walks its range in chunks of chunk_elems. Per chunk,
 * rank r first exchanges its input with every other rank in n-1 SENDRECV
 * rounds in pairwise order (round i: send to r+i, receive from r-i into SCRATCH
 * slot i-1), then reduces the n contributions itself, in rank order 0..n-1, so
 * that every rank computes the same tree ((x0 + x1) + x2) + ... and gets the
 * same bits:
 *
 *   rank 0:    COPY   x0 -> out        (PRE)
 *              REDUCE x1 -> out        (PRE) ... x(n-1) (PRE|POST)
 *   rank r>0:  COPY   x0 -> x0         (PRE, in its SCRATCH slot: the accumulator)
 *              REDUCE x1 .. x(n-2) -> acc   (PRE; x_r is read from INPUT)
 *              COPY   x(n-1) -> out    (PRE)
 *              REDUCE acc -> out       (POST): out = x(n-1) + acc, the same sum
 *
 * A rank other than 0 accumulates in SCRATCH rather than in its output because
 * in place the output is its own input, which it still needs at position r;
 * only the last contribution, read after its own, goes straight to the output.
 * SCRATCH: (n-1) slots of min(chunk, channel range) per channel.
 *
 *   n = 3, one chunk:    rank 0        rank 1        rank 2
 *   round 1 (SENDRECV)   x0 -> 1       x1 -> 2       x2 -> 0
 *   round 2 (SENDRECV)   x0 -> 2       x1 -> 0       x2 -> 1
 *   reduce               (x0+x1)+x2    (x0+x1)+x2    (x0+x1)+x2   (each on its own)
 *
 * Two-shot. A chunk covers n rank-blocks (like the ring's iteration); rank r
 * owns block r. Reduce-scatter by direct exchange: in round i rank r sends its
 * input's block r+i to rank r+i and receives rank r-i's copy of block r into
 * SCRATCH; then it reduces block r in rank order exactly as one-shot does, into
 * its output. Allgather by direct exchange: in round i it sends its finished
 * block to r+i and receives block r-i from r-i into the output. Each block is
 * finalised once and copied, so all ranks get the same bits.
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
#include "algorithms.h"

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

/* Where contribution x_q of the chunk/block at `off` is on rank r: its own in
 * INPUT, the others in the SCRATCH slot of the round that brought them. */
static void contribution(int n, int r, int q, uint64_t off, uint64_t sbase, uint64_t slot, int *buf, uint64_t *at)
{
    if (q == r) {
        *buf = PLAIT_BUF_INPUT;
        *at = off;
    } else {
        *buf = PLAIT_BUF_SCRATCH;
        *at = sbase + (uint64_t)((r - q + n) % n - 1) * slot;
    }
}

/* Step k of the rank-order reduction of the n contributions to [off, off+count)
 * into OUTPUT (see the header): n steps on rank 0, n+1 on the others. */
static void reduce_step(int n, int r, uint64_t k, uint64_t off, uint64_t count, uint64_t sbase, uint64_t slot,
                        struct plait_step *out)
{
    int buf, acc_buf;
    uint64_t at, acc;
    if (r == 0) {
        const unsigned post = k == (uint64_t)n - 1 ? PLAIT_STEP_POST : 0;
        contribution(n, r, (int)k, off, sbase, slot, &buf, &at);
        put(out, k == 0 ? PLAIT_STEP_COPY : PLAIT_STEP_REDUCE, buf, at, PLAIT_BUF_OUTPUT, off, count,
            PLAIT_STEP_PRE | post);
        return;
    }
    contribution(n, r, 0, off, sbase, slot, &acc_buf, &acc);
    if (k == 0) {
        put(out, PLAIT_STEP_COPY, acc_buf, acc, acc_buf, acc, count, PLAIT_STEP_PRE);
    } else if (k < (uint64_t)n - 1) {
        contribution(n, r, (int)k, off, sbase, slot, &buf, &at);
        put(out, PLAIT_STEP_REDUCE, buf, at, acc_buf, acc, count, PLAIT_STEP_PRE);
    } else if (k == (uint64_t)n - 1) {
        contribution(n, r, n - 1, off, sbase, slot, &buf, &at);
        put(out, PLAIT_STEP_COPY, buf, at, PLAIT_BUF_OUTPUT, off, count, PLAIT_STEP_PRE);
    } else {
        put(out, PLAIT_STEP_REDUCE, acc_buf, acc, PLAIT_BUF_OUTPUT, off, count, PLAIT_STEP_POST);
    }
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
    const uint64_t spi = (uint64_t)(n - 1) + (uint64_t)(r == 0 ? n : n + 1);
    const uint64_t iter = idx / spi, s = idx % spi;
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(a->chunk_elems, hi - base);
    const uint64_t slot = plait_sched_chunk_slot(a);
    const uint64_t sbase = (uint64_t)channel * (uint64_t)(n - 1) * slot;
    if (s < (uint64_t)n - 1) {
        const int i = (int)s + 1;
        put(out, PLAIT_STEP_SENDRECV, PLAIT_BUF_INPUT, base, PLAIT_BUF_SCRATCH, sbase + (uint64_t)(i - 1) * slot, len,
            0);
        out->send_peer = (r + i) % n;
        out->recv_peer = (r - i + n) % n;
        return 1;
    }
    reduce_step(n, r, s - (uint64_t)(n - 1), base, len, sbase, slot, out);
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
    return (uint64_t)a->nchannels * (uint64_t)(a->nranks - 1) * plait_sched_chunk_slot(a);
}

/* ------------------------------------------------------------------ two-shot */

int plait_twoshot_supports(int coll, int nranks)
{
    return coll == PLAIT_COLL_ALLREDUCE && nranks <= DIRECT_MAX_RANKS;
}

/* Elements of one SCRATCH slot: the largest block a chunk can have. */
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
    const uint64_t red = (uint64_t)(r == 0 ? n : n + 1);
    /* a full chunk's blocks are all chunk_elems: one SENDRECV per round */
    const uint64_t spi_full = 2 * (uint64_t)(n - 1) + red;
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
    const uint64_t sbase = (uint64_t)channel * (uint64_t)(n - 1) * slot;
    const uint64_t mine = (uint64_t)r, my_lo = base + block_lo(mine, cs, len), my_n = block_size(mine, cs, len);

    /* reduce-scatter rounds: send block r+i to r+i, receive block r from r-i */
    for (int i = 1; i < n; i++) {
        const int to = (r + i) % n, from = (r - i + n) % n;
        const uint64_t to_n = block_size((uint64_t)to, cs, len);
        const uint64_t to_lo = base + block_lo((uint64_t)to, cs, len);
        const uint64_t dst = sbase + (uint64_t)(i - 1) * slot;
        if (exchange_step(&s, to, PLAIT_BUF_INPUT, to_lo, to_n, from, PLAIT_BUF_SCRATCH, dst, my_n, out))
            return 1;
    }
    if (s < red) {
        reduce_step(n, r, s, my_lo, my_n, sbase, slot, out);
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
    return (uint64_t)a->nchannels * (uint64_t)(a->nranks - 1) * twoshot_slot(a);
}
