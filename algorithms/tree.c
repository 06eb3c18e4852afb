/* The "tree" algorithm: k-nomial broadcast and reduce (binomial when the radix
 * is 2) here, the double binary tree allreduce in dbtree.c.
 *
 * Ranks are renumbered relative to the root (vr = rank - root mod n). The parent
 * of vr clears its lowest non-zero base-k digit; its children add one non-zero
 * digit below that one. Each channel walks its range in chunks.
 *
 * Broadcast, per chunk: a rank receives from its parent (forwarding to its
 * first child in the same step) and then sends to its other children, largest
 * subtree first, so the deepest paths start earliest. The root sends from its
 * input and copies it to its output last.
 *
 * Reduce is the mirror: per chunk a rank receives its children's partial
 * results smallest subtree first (those are ready first), each reduced into
 * its accumulator, the last one straight on to its parent
 * (RECV_REDUCE_SEND); its own input enters the first reduction with PRE. The
 * root accumulates in its OUTPUT and applies POST with its last child. A
 * non-root rank has no OUTPUT, so one with two or more children accumulates
 * in SCRATCH (one chunk per channel); a leaf SENDs its input with PRE and a
 * rank with one child reduces it with its input on the way through, neither
 * needing SCRATCH. The order of the children is fixed: the result does not
 * depend on timing.
 *
 *   radix 2, 8 ranks, root 0:      0           broadcast: data flows down,
 *                              /   |   \       largest subtree (4) first
 *                             4    2    1
 *                            / \   |           reduce: partial results flow up;
 *                           6   5  3           0 takes 1, then 2, then 4
 *                           |                  (4 took 5, then 6)
 *                           7
 *
 *   reduce steps per chunk, m children c_1 (smallest subtree) .. c_m:
 *     leaf          SEND input (PRE) -> parent
 *     m = 1         RECV_REDUCE_SEND input (PRE) + c_1 -> parent
 *     m >= 2        RECV_REDUCE_COPY input (PRE) + c_1 -> acc,
 *                   RECV_REDUCE_COPY acc + c_i -> acc (1 < i < m),
 *                   RECV_REDUCE_SEND acc + c_m -> parent
 *     root          the same into OUTPUT, POST on the last; alone: COPY PRE|POST
 *
 * Over all roots, rank r talks only to r +- j*k^i (mod n), j < k: the
 * connections it needs are O((k-1) log_k n), whatever the root. */
#include "algorithms/algorithms.h"
#include "algorithms/tree.h"

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

/* k-nomial reduce: the broadcast's tree with the data flowing up (see the
 * header comment). Per chunk, a rank with m children takes m steps (a leaf
 * one SEND). */
static int knomial_reduce_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const long n = a->nranks;
    const int k = radix_of(a);
    const long vr = ((long)a->rank - a->root + n) % n;
    long children[TREE_MAX_CHILDREN];
    const int nchild = knomial_children(vr, n, k, children);
    const long parent = knomial_parent(vr, n, k);
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t steps = nchild > 0 ? (uint64_t)nchild : 1;
    const uint64_t iter = idx / steps;
    const int s = (int)(idx % steps);
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = hi - base < a->chunk_elems ? hi - base : a->chunk_elems;

    /* the accumulator: the root's OUTPUT, else this channel's chunk of SCRATCH */
    const int acc_buf = parent < 0 ? PLAIT_BUF_OUTPUT : PLAIT_BUF_SCRATCH;
    const uint64_t acc_off = parent < 0 ? base : (uint64_t)channel * plait_sched_chunk_slot(a);
    out->flags = 0;
    out->count = len;
    out->send_peer = -1;
    out->recv_peer = -1;
    out->src_buf = PLAIT_BUF_INPUT;
    out->src_off = base;
    out->dst_buf = (uint8_t)acc_buf;
    out->dst_off = acc_off;
    if (nchild == 0) {
        if (parent < 0) { /* one rank */
            out->kind = PLAIT_STEP_COPY;
            out->flags = PLAIT_STEP_PRE | PLAIT_STEP_POST;
        } else {
            out->kind = PLAIT_STEP_SEND;
            out->flags = PLAIT_STEP_PRE;
            out->send_peer = (int32_t)((parent + a->root) % n);
        }
        return 1;
    }
    /* children smallest subtree first: the reverse of the broadcast's order */
    out->recv_peer = (int32_t)((children[nchild - 1 - s] + a->root) % n);
    if (s == 0) {
        out->flags = PLAIT_STEP_PRE;
    } else {
        out->src_buf = (uint8_t)acc_buf;
        out->src_off = acc_off;
    }
    if (s < nchild - 1) {
        out->kind = PLAIT_STEP_RECV_REDUCE_COPY;
    } else if (parent < 0) {
        out->kind = PLAIT_STEP_RECV_REDUCE_COPY;
        out->flags |= PLAIT_STEP_POST;
    } else {
        out->kind = PLAIT_STEP_RECV_REDUCE_SEND;
        out->send_peer = (int32_t)((parent + a->root) % n);
    }
    return 1;
}

/* The "tree" entry of the table. */
int plait_tree_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_BROADCAST || coll == PLAIT_COLL_REDUCE || coll == PLAIT_COLL_ALLREDUCE;
}

int plait_tree_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    switch (a->coll) {
    case PLAIT_COLL_BROADCAST:
        return plait_knomial_step(a, channel, idx, out);
    case PLAIT_COLL_REDUCE:
        return knomial_reduce_step(a, channel, idx, out);
    case PLAIT_COLL_ALLREDUCE:
        return plait_dbtree_step(a, channel, idx, out);
    default:
        return 0;
    }
}

int plait_tree_peers(int nranks, int rank, int radix, int *out, int max)
{
    int cnt = plait_knomial_peers(nranks, rank, radix, out, max);
    plait_dbtree_add_peers(nranks, rank, out, &cnt, max);
    return cnt;
}

/* A reduce's non-root rank with two or more children accumulates one chunk
 * per channel in SCRATCH (less when the data is smaller); nothing else needs
 * any. */
uint64_t plait_tree_scratch(const struct plait_sched_args *a)
{
    if (a->coll != PLAIT_COLL_REDUCE || a->nranks < 2 || a->rank == a->root)
        return 0;
    const long n = a->nranks;
    const long vr = ((long)a->rank - a->root + n) % n;
    long children[TREE_MAX_CHILDREN];
    if (knomial_children(vr, n, radix_of(a), children) < 2)
        return 0;
    return (uint64_t)a->nchannels * plait_sched_chunk_slot(a);
}
