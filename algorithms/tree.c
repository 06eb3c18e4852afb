/* k-nomial tree broadcast (binomial when the radix is 2).
 *
 * Ranks are renumbered relative to the root (vr = rank - root mod n). The parent
 * of vr clears its lowest non-zero base-k digit; its children add one non-zero
 * digit below that one. Each channel walks its range in chunks; per chunk a
 * rank receives from its parent (forwarding to its first child in the same
 * step) and then sends to its other children, largest subtree first, so the
 * deepest paths start earliest. The root sends from its input and copies it to
 * its output last.
 *
 *   radix 2, 8 ranks, root 0:      0
 *                              /   |   \
 *                             4    2    1
 *                            / \   |
 *                           6   5  3
 *                           |
 *                           7
 *
 * Over all roots, rank r talks only to r +- j*k^i (mod n), j < k: the
 * connections it needs are O((k-1) log_k n), whatever the root. */
#include "algorithms.h"

#define TREE_MAX_CHILDREN 128

static int radix_of(const struct plait_sched_args *a)
{
    return a->radix >= 2 ? a->radix : 2;
}

/* k^d of vr's lowest non-zero digit (a power >= n for vr == 0). */
static long low_digit_power(long vr, long n, int k)
{
    long p = 1;
    while (p < n && (vr / p) % k == 0)
        p *= k;
    return p;
}

static int knomial_children(long vr, long n, int k, long *out)
{
    int cnt = 0;
    long p = low_digit_power(vr, n, k);
    for (long q = p / k; q >= 1; q /= k)
        for (int j = 1; j < k; j++) {
            long c = vr + j * q;
            if (c < n && cnt < TREE_MAX_CHILDREN)
                out[cnt++] = c;
        }
    return cnt;
}

static long knomial_parent(long vr, long n, int k)
{
    if (vr == 0)
        return -1;
    long p = low_digit_power(vr, n, k);
    return vr - ((vr / p) % k) * p;
}

int plait_knomial_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const long n = a->nranks;
    const int k = radix_of(a);
    const long vr = ((long)a->rank - a->root + n) % n;
    long children[TREE_MAX_CHILDREN];
    const int nchild = knomial_children(vr, n, k, children);
    const long parent = knomial_parent(vr, n, k);
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    /* root: one send per child, then the copy; others: receive (forwarding to
     * the first child), then one send per further child */
    const uint64_t steps = parent < 0 ? (uint64_t)nchild + 1 : (nchild > 0 ? (uint64_t)nchild : 1);
    const uint64_t iter = idx / steps;
    const uint64_t s = idx % steps;
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = hi - base < a->chunk_elems ? hi - base : a->chunk_elems;

    out->flags = 0;
    out->src_off = base;
    out->dst_off = base;
    out->count = len;
    out->send_peer = -1;
    out->recv_peer = -1;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    if (parent < 0) {
        out->src_buf = PLAIT_BUF_INPUT;
        if (s < (uint64_t)nchild) {
            out->kind = PLAIT_STEP_SEND;
            out->send_peer = (int32_t)((children[s] + a->root) % n);
        } else {
            out->kind = PLAIT_STEP_COPY;
        }
        return 1;
    }
    out->src_buf = PLAIT_BUF_OUTPUT;
    if (s == 0) {
        out->recv_peer = (int32_t)((parent + a->root) % n);
        if (nchild > 0) {
            out->kind = PLAIT_STEP_RECV_COPY_SEND;
            out->send_peer = (int32_t)((children[0] + a->root) % n);
        } else {
            out->kind = PLAIT_STEP_RECV;
        }
    } else {
        out->kind = PLAIT_STEP_SEND;
        out->send_peer = (int32_t)((children[s] + a->root) % n);
    }
    return 1;
}

int plait_knomial_peers(int nranks, int rank, int radix, int *out, int max)
{
    const int k = radix >= 2 ? radix : 2;
    int cnt = 0;
    for (long q = 1; q < nranks; q *= k)
        for (int j = 1; j < k; j++) {
            long d = j * q;
            if (d >= nranks)
                break;
            plait_peers_add_distance(nranks, rank, d, out, &cnt, max);
        }
    return cnt;
}

/* The "tree" entry of the table. */
int plait_tree_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_BROADCAST;
}

int plait_tree_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return plait_knomial_step(a, channel, idx, out);
}

int plait_tree_peers(int nranks, int rank, int radix, int *out, int max)
{
    return plait_knomial_peers(nranks, rank, radix, out, max);
}

uint64_t plait_tree_scratch(const struct plait_sched_args *a)
{
    (void)a;
    return 0;
}
