/* Bruck allgather: ceil(log2 n) rounds, any rank count, blocks placed directly
 * in the output (no final rotation).
 *
 * Before the round of distance d (1, 2, 4, ...), rank r holds blocks r .. r+d-1
 * (mod n). In the round it sends those it has, m = min(d, n-d) of them, to rank
 * r-d and receives blocks r+d .. r+d+m-1 from rank r+d, one SENDRECV step per
 * block: the i-th block sent and the i-th received form one step, and both ends
 * of each message number it alike. Every channel moves its slice of every
 * block; each iteration covers chunk_elems of that slice.
 *
 *   n = 5, rank 0:  holds {0}; d=1: send 0 -> 4, get 1 from 1;
 *                   holds {0,1}; d=2: send 0,1 -> 3, get 2,3 from 2;
 *                   holds {0..3}; d=4: send 0 -> 1, get 4 from 4.
 *
 * The peers of rank r are r +- 2^k (mod n). */
#include "algorithms.h"

int plait_bruck_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const uint64_t n = (uint64_t)a->nranks;
    const uint64_t r = (uint64_t)a->rank;
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    /* per iteration: the copy of the own block, then n-1 exchanges */
    const uint64_t iter = idx / n;
    uint64_t s = idx % n;
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = hi - base < a->chunk_elems ? hi - base : a->chunk_elems;
    out->flags = 0;
    out->count = len;
    out->src_buf = PLAIT_BUF_OUTPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    if (s == 0) {
        out->kind = PLAIT_STEP_COPY;
        out->src_buf = PLAIT_BUF_INPUT;
        out->src_off = base;
        out->dst_off = r * a->count + base;
        out->send_peer = -1;
        out->recv_peer = -1;
        return 1;
    }
    s--; /* exchange number within the iteration: find its round */
    uint64_t d = 1;
    for (;;) {
        const uint64_t m = d < n - d ? d : n - d;
        if (s < m)
            break;
        s -= m;
        d *= 2;
    }
    const uint64_t sent_block = (r + s) % n;
    const uint64_t got_block = (r + d + s) % n;
    out->kind = PLAIT_STEP_SENDRECV;
    out->send_peer = (int32_t)((r + n - d) % n);
    out->recv_peer = (int32_t)((r + d) % n);
    out->src_off = sent_block * a->count + base;
    out->dst_off = got_block * a->count + base;
    return 1;
}

int plait_bruck_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    /* rank +- 2^i: the peers of a binomial tree */
    return plait_knomial_peers(nranks, rank, 2, out, max);
}

uint64_t plait_bruck_scratch(const struct plait_sched_args *a)
{
    (void)a;
    return 0;
}
