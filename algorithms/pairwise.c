/* Pairwise alltoall: n-1 rounds, any rank count.
 *
 * Block j of a rank's input goes to rank j, and lands in block (sender) of
 * rank j's output. In round i (1 <= i < n) rank r sends its block r+i to rank
 * r+i and receives block r of rank r-i into its output block r-i: every rank
 * sends to a different rank in each round (a shift permutation), so no rank is
 * the target of two senders at once. The own block is a local COPY before the
 * first round. Per iteration a rank first issues its n-1 SENDs (rounds 1..n-1),
 * then its n-1 RECVs in the same round order: a send never waits for a receive
 * (one SENDRECV per round chained the rounds and was 2-2.5x slower for small
 * blocks), and since a chunk fits in a FIFO a blocked sender always waits on a
 * receiver that is at an earlier iteration, so no wait is circular.
 *
 *   n = 4: the round in which block (from -> to) moves (C: the local COPY)
 *
 *               to 0   to 1   to 2   to 3
 *     from 0     C      1      2      3
 *     from 1     3      C      1      2
 *     from 2     2      3      C      1
 *     from 3     1      2      3      C
 *
 *   round 1:  0 --in[1]--> 1 --in[2]--> 2 --in[3]--> 3 --in[0]--> 0
 *   round 2:  0 --in[2]--> 2 --in[0]--> 0,   1 --in[3]--> 3 --in[1]--> 1
 *
 * Each channel handles its slice of every block (plait_sched_channel_range of
 * the block size) and walks it in iterations of chunk_elems; an iteration is
 * the COPY, the n-1 sends and the n-1 receives of that chunk of each block. The
 * peers of round i compute the same chunk, so sizes agree without crossing the
 * wire. No SCRATCH.
 *
 * Peers: every other rank (alltoall is inherently all-pairs). */
#include "algorithms/algorithms.h"

int plait_pairwise_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_ALLTOALL;
}

int plait_pairwise_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (a->coll != PLAIT_COLL_ALLTOALL)
        return 0;
    const uint64_t n = (uint64_t)a->nranks;
    const uint64_t r = (uint64_t)a->rank;
    uint64_t base, len, s;
    if (!plait_sched_chunk_iter(a, channel, idx, 2 * n - 1, &base, &len, &s))
        return 0;
    out->flags = 0;
    out->count = len;
    out->src_buf = PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    if (s == 0) {
        out->kind = PLAIT_STEP_COPY;
        out->send_peer = -1;
        out->recv_peer = -1;
        out->src_off = r * a->count + base;
        out->dst_off = r * a->count + base;
        return 1;
    }
    /* sends first (to r+1, r+2, ...), then receives (from r-1, r-2, ...):
     * a send never waits for a receive, so the whole chunk is in flight at
     * once; a chunk fits in a FIFO, so a blocked sender always waits on a
     * receiver at an earlier iteration and no wait can be circular */
    if (s < n) {
        const uint64_t to = (r + s) % n;
        out->kind = PLAIT_STEP_SEND;
        out->send_peer = (int32_t)to;
        out->recv_peer = -1;
        out->src_off = to * a->count + base;
        out->dst_off = 0;
    } else {
        const uint64_t from = (r + n - (s - n + 1)) % n;
        out->kind = PLAIT_STEP_RECV;
        out->send_peer = -1;
        out->recv_peer = (int32_t)from;
        out->src_off = 0;
        out->dst_off = from * a->count + base;
    }
    return 1;
}

int plait_pairwise_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    return plait_peers_all(nranks, rank, out, max);
}
