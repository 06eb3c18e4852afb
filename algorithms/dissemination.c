/* Dissemination barrier: ceil(log2 n) rounds, any rank count.
 *
 * In the round of distance d = 1, 2, 4, ... (d < n) rank r sends a token to
 * r+d and receives one from r-d. A rank leaves round k only after rank r-d has
 * entered it, and r-d entered it only after its own earlier rounds: after the
 * round of distance d, rank r has (transitively) heard from ranks r-2d+1 .. r,
 * so after the last round, from every rank. That chain of waits is what the
 * barrier promises; the data only makes it visible to the verifier.
 *
 * The token is the barrier's one element (plait_barrier: comm->barrier_buf),
 * carried as a running reduction so that the verifier can see the chain: the
 * rank copies its input into its output, and per round sends its output and
 * receives the partner's into SCRATCH (one SENDRECV: the halves are
 * independent, so neither partner waits for the other to receive), then
 * reduces SCRATCH into its output (REDUCE). The output ends with every rank's
 * contribution at least once (some twice when n is not a power of two, which a
 * barrier allows; the value is never read).
 *
 *   n = 5:  d = 1: 0->1 1->2 2->3 3->4 4->0   (r has heard from r-1 .. r)
 *           d = 2: 0->2 1->3 2->4 3->0 4->1   (from r-3 .. r)
 *           d = 4: 0->4 1->0 2->1 3->2 4->3   (from r-7 .. r: all 5, 3 of them twice)
 *
 *           rank 0's token after d = 4:  {0} + {4} + {3,2} + {1,0,4,3}
 *                                        own   d=1   d=2      d=4
 *
 * Steps per iteration: COPY, then SENDRECV and REDUCE per round. Any count
 * works (each channel walks its slice of it in chunks, SCRATCH mirrors the
 * output), though a barrier has count 1: channel 0 carries it and the other
 * channels have no steps.
 *
 * Peers: r +- 2^k (mod n). */
#include "algorithms/algorithms.h"

int plait_dissemination_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_BARRIER;
}

int plait_dissemination_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (a->coll != PLAIT_COLL_BARRIER)
        return 0;
    const uint64_t n = (uint64_t)a->nranks;
    const uint64_t r = (uint64_t)a->rank;
    uint64_t rounds = 0;
    while ((1ull << rounds) < n)
        rounds++;
    uint64_t base, len, s;
    if (!plait_sched_chunk_iter(a, channel, idx, 1 + 2 * rounds, &base, &len, &s))
        return 0;
    out->flags = 0;
    out->count = len;
    out->send_peer = -1;
    out->recv_peer = -1;
    out->src_off = base;
    out->dst_off = base;
    if (s == 0) {
        out->kind = PLAIT_STEP_COPY;
        out->src_buf = PLAIT_BUF_INPUT;
        out->dst_buf = PLAIT_BUF_OUTPUT;
        return 1;
    }
    const uint64_t d = 1ull << ((s - 1) / 2);
    if ((s - 1) % 2 == 0) {
        out->kind = PLAIT_STEP_SENDRECV;
        out->src_buf = PLAIT_BUF_OUTPUT;
        out->dst_buf = PLAIT_BUF_SCRATCH;
        out->send_peer = (int32_t)((r + d) % n);
        out->recv_peer = (int32_t)((r + n - d % n) % n);
    } else {
        out->kind = PLAIT_STEP_REDUCE;
        out->src_buf = PLAIT_BUF_SCRATCH;
        out->dst_buf = PLAIT_BUF_OUTPUT;
    }
    return 1;
}

int plait_dissemination_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    return plait_peers_pow2(nranks, rank, out, max);
}

uint64_t plait_dissemination_scratch(const struct plait_sched_args *a)
{
    /* SCRATCH mirrors the output: each channel's slice at its own offsets */
    return a->nranks > 1 ? a->count : 0;
}
