/* Bruck alltoall: ceil(log2 n) rounds, any rank count, SCRATCH staging.
 *
 * Name a block by its distance i = (destination - source) mod n. Rank s's
 * block for rank s+i travels by the set bits of i, lowest first: in the round
 * of bit k (distance 2^k) every rank sends each block it holds whose i has bit
 * k set to rank +2^k and receives the same indices from rank -2^k. A block
 * with index i is thus at s + (i's bits up to k) after round k, and at s+i,
 * its destination, after its highest bit. Block 0 stays home (a COPY).
 *
 * The textbook version rotates the input into a staging buffer first and
 * rotates back at the end; here the rotations are folded into the offsets.
 * For index i, on rank r:
 *   - before its first hop the block is INPUT block (r+i) (no rotation copy);
 *   - its last hop lands in OUTPUT block (r-i), where it belongs (no final
 *     rotation either);
 *   - in between it alternates, by the hops it has left, between SCRATCH slot
 *     i (an odd number of hops left) and OUTPUT block (r-i) (an even number),
 *     so that the last stop before the final hop is SCRATCH.
 * A SENDRECV's halves run concurrently, so what a step sends must not be
 * where it receives: a step sends index i from its stop after hop h and
 * receives index i into its stop after hop h+1, which are always different
 * places. At any time each rank holds exactly one index-i block (every rank
 * sends its own and receives one per round), so OUTPUT block (r-i) and SCRATCH
 * slot i belong to index i alone.
 *
 *   n = 5 (3 rounds), rank 0:  block i = 1, 2, 3, 4 is for rank i
 *     COPY    in[0] -> out[0]
 *     k = 0   indices 1, 3:  send in[1], in[3] -> rank 1;
 *                            recv index 1 -> out[4], index 3 -> scratch[3]  <- rank 4
 *     k = 1   indices 2, 3:  send in[2], scratch[3] -> rank 2;
 *                            recv index 2 -> out[3], index 3 -> out[2]      <- rank 3
 *     k = 2   index 4:       send in[4] -> rank 4; recv index 4 -> out[1]  <- rank 1
 *
 *        index 3 from rank 0:  rank 0 --k=0--> rank 1 --k=1--> rank 3
 *                              in[3]           scratch[3]       out[0]
 *
 * One SENDRECV step per block (the i-th block sent and the i-th received in a
 * round form a step; both ends number them alike). Each channel handles its
 * slice of every block in iterations of L = min(chunk_elems, the largest
 * channel slice) elements; per iteration: the COPY, then per round k one step
 * per index with bit k set, ascending. SCRATCH: n slots of L per channel
 * (none below 4 ranks, where no index has two bits).
 *
 * Peers: r +- 2^k (mod n), Bruck allgather's (plait_bruck_peers). */
#include "algorithms/algorithms.h"

static int popcount64(uint64_t x)
{
    return __builtin_popcountll(x);
}

/* Indices in [1, n) with bit k set. */
static uint64_t round_size(uint64_t n, int k)
{
    const uint64_t bit = 1ull << k;
    const uint64_t full = (n >> (k + 1)) << k;
    const uint64_t rem = n & ((bit << 1) - 1);
    return full + (rem > bit ? rem - bit : 0);
}

int plait_bruck_alltoall_supports(int nranks)
{
    (void)nranks;
    return 1;
}

int plait_bruck_alltoall_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const uint64_t n = (uint64_t)a->nranks;
    const uint64_t r = (uint64_t)a->rank;
    int rounds = 0;
    uint64_t per_iter = 1;
    while ((1ull << rounds) < n)
        per_iter += round_size(n, rounds++);
    uint64_t base, len, s;
    if (!plait_sched_chunk_iter(a, channel, idx, per_iter, &base, &len, &s))
        return 0;
    out->flags = 0;
    out->count = len;
    if (s == 0) {
        out->kind = PLAIT_STEP_COPY;
        out->src_buf = PLAIT_BUF_INPUT;
        out->dst_buf = PLAIT_BUF_OUTPUT;
        out->send_peer = -1;
        out->recv_peer = -1;
        out->src_off = r * a->count + base;
        out->dst_off = r * a->count + base;
        return 1;
    }
    s--;
    int k = 0;
    while (s >= round_size(n, k))
        s -= round_size(n, k++);
    /* the s-th index with bit k set: s with a 1 inserted at bit k */
    const uint64_t bit = 1ull << k;
    const uint64_t i = ((s >> k) << (k + 1)) | bit | (s & (bit - 1));
    const int hops = popcount64(i);
    const int done = popcount64(i & (bit - 1)); /* hops before this one */
    /* a slot holds one iteration's slice of its index at a time */
    const uint64_t slot = ((uint64_t)channel * n + i) * plait_sched_chunk_slot(a);
    /* where index i is after h hops (h > 0): SCRATCH slot i when an odd
     * number of hops is left, else OUTPUT block (r-i), the final place once
     * none is left */
    const uint64_t out_block = ((r + n - i) % n) * a->count + base;
    if (done == 0) {
        out->src_buf = PLAIT_BUF_INPUT;
        out->src_off = ((r + i) % n) * a->count + base;
    } else if ((hops - done) % 2 == 1) {
        out->src_buf = PLAIT_BUF_SCRATCH;
        out->src_off = slot;
    } else {
        out->src_buf = PLAIT_BUF_OUTPUT;
        out->src_off = out_block;
    }
    if ((hops - done - 1) % 2 == 0) {
        out->dst_buf = PLAIT_BUF_OUTPUT;
        out->dst_off = out_block;
    } else {
        out->dst_buf = PLAIT_BUF_SCRATCH;
        out->dst_off = slot;
    }
    out->kind = PLAIT_STEP_SENDRECV;
    out->send_peer = (int32_t)((r + bit) % n);
    out->recv_peer = (int32_t)((r + n - bit) % n);
    return 1;
}

uint64_t plait_bruck_alltoall_scratch(const struct plait_sched_args *a)
{
    if (a->nranks < 4)
        return 0;
    return (uint64_t)a->nchannels * (uint64_t)a->nranks * plait_sched_chunk_slot(a);
}
