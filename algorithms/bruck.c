/* Bruck allgather: ceil(log2 n) rounds of one SENDRECV each, any rank count.
 *
 * Each rank keeps a rotated copy of the blocks in SCRATCH: slot j of rank r
 * holds block (r + j) mod n. Before the round of distance d (1, 2, 4, ...) rank
 * r holds slots [0, d); it sends slots [0, m) to rank r-d, where they become
 * slots [d, d+m), and receives slots [d, d+m) from rank r+d, with
 * m = min(d, n-d). Both ranges are contiguous, so a round is one message; the
 * two ends cut it alike because they compute the same m. After the last round
 * the slots go to their blocks in the output.
 *
 *   n = 5, rank 0 (slot j = block j):
 *               slots   0   1   2   3   4
 *   start              [0]                      own block copied in
 *   d=1: send [0,1) -> 4, get [1,2) from 1     [0] [1]
 *   d=2: send [0,2) -> 3, get [2,4) from 2     [0] [1] [2] [3]
 *   d=4: send [0,1) -> 1, get [4,5) from 4     [0] [1] [2] [3] [4]
 *   end: slot j -> output block (0 + j) mod 5
 *
 * Every channel moves its slice [lo, hi) of every block, in iterations of `len`
 * elements per block (len = min(chunk, slice)); in an iteration the slots are
 * `cur` elements apart (cur = len except in a short last iteration), so a
 * round's message is contiguous. The slots do not line up with the output
 * blocks (those are `count` apart), so the copy-out is one COPY per block,
 * except when one iteration covers whole blocks (cur == count): then slots
 * [1, n-r) and [n-r, n) land in two COPY steps. SCRATCH: n slots of len per
 * channel, n * min(chunk, slice) elements. Steps per iteration: two local
 * copies in (output and slot 0), ceil(log2 n) exchanges, the copies out.
 *
 * The peers of rank r are r +- 2^k (mod n). */
#include "algorithms/algorithms.h"

static uint64_t log2_ceil(uint64_t n)
{
    uint64_t k = 0;
    while ((1ull << k) < n)
        k++;
    return k;
}

static void local_copy(struct plait_step *out, int src_buf, uint64_t src_off, int dst_buf, uint64_t dst_off,
                       uint64_t count)
{
    out->kind = PLAIT_STEP_COPY;
    out->flags = 0;
    out->send_peer = -1;
    out->recv_peer = -1;
    out->src_buf = (uint8_t)src_buf;
    out->dst_buf = (uint8_t)dst_buf;
    out->src_off = src_off;
    out->dst_off = dst_off;
    out->count = count;
}

int plait_bruck_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const uint64_t n = (uint64_t)a->nranks;
    const uint64_t r = (uint64_t)a->rank;
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    if (hi <= lo)
        return 0;
    if (n == 1)
        return plait_sched_single_rank(a, channel, idx, out);
    const uint64_t len = plait_umin(a->chunk_elems, hi - lo);
    const uint64_t rounds = log2_ceil(n);
    /* one iteration covering whole blocks: the slots are laid out like the
     * output (channel 0 holds everything, so the other channels have no steps) */
    const int is_whole = lo == 0 && hi == a->count && len == a->count;
    const uint64_t copies_out = is_whole ? 2 : n - 1;
    const uint64_t steps = 2 + rounds + copies_out;
    const uint64_t iter = idx / steps;
    const uint64_t s = idx % steps;
    const uint64_t base = lo + iter * len;
    if (base >= hi)
        return 0;
    const uint64_t cur = plait_umin(len, hi - base);
    const uint64_t slots = (uint64_t)channel * n * plait_sched_chunk_slot(a);

    if (s == 0) {
        local_copy(out, PLAIT_BUF_INPUT, base, PLAIT_BUF_OUTPUT, r * a->count + base, cur);
        return 1;
    }
    if (s == 1) {
        local_copy(out, PLAIT_BUF_INPUT, base, PLAIT_BUF_SCRATCH, slots, cur);
        return 1;
    }
    if (s < 2 + rounds) {
        const uint64_t d = 1ull << (s - 2);
        const uint64_t m = plait_umin(d, n - d);
        out->kind = PLAIT_STEP_SENDRECV;
        out->flags = 0;
        out->src_buf = PLAIT_BUF_SCRATCH;
        out->dst_buf = PLAIT_BUF_SCRATCH;
        out->send_peer = (int32_t)((r + n - d) % n);
        out->recv_peer = (int32_t)((r + d) % n);
        out->src_off = slots;
        out->dst_off = slots + d * cur;
        out->count = m * cur;
        return 1;
    }
    const uint64_t c = s - 2 - rounds;
    if (is_whole) {
        /* slots [1, n-r) are blocks r+1 .. n-1, slots [n-r, n) blocks 0 .. r-1 */
        if (c == 0)
            local_copy(out, PLAIT_BUF_SCRATCH, slots + cur, PLAIT_BUF_OUTPUT, (r + 1) * a->count,
                       (n - r - 1) * cur);
        else
            local_copy(out, PLAIT_BUF_SCRATCH, slots + (n - r) * cur, PLAIT_BUF_OUTPUT, 0, r * cur);
        return 1;
    }
    const uint64_t j = c + 1;
    local_copy(out, PLAIT_BUF_SCRATCH, slots + j * cur, PLAIT_BUF_OUTPUT, ((r + j) % n) * a->count + base, cur);
    return 1;
}

int plait_bruck_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    return plait_peers_pow2(nranks, rank, out, max);
}

uint64_t plait_bruck_scratch(const struct plait_sched_args *a)
{
    if (a->nranks <= 1 || a->count == 0)
        return 0;
    return (uint64_t)a->nchannels * (uint64_t)a->nranks * plait_sched_chunk_slot(a);
}
