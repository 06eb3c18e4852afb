/* Double binary tree allreduce (after Sanders, Speck and Traeff): two binary
 * trees over the ranks, each carrying half of every channel's data. A rank is
 * an inner node of at most one of them and a leaf of the other, so every rank
 * sends and receives about as much as in a ring, while the depth is
 * O(log2 n) instead of n.
 *
 * The trees. Number the places 1..n and give place v the height h = the number
 * of trailing zero bits of v (b = 2^h is v's lowest set bit). In the infinite
 * in-order tree, v's parent is v - b when the bit above b is set and v + b
 * otherwise, its children are v - b/2 and v + b/2. Over 1..n, a place's parent
 * is its first ancestor that is <= n, its left child v - b/2 (always there when
 * h > 0) and its right child v + d for the largest d in b/2, b/4, .., 1 with
 * v + d <= n; the root is the largest power of two <= n. Odd places (h = 0) are
 * the leaves, even places the inner nodes. Tree 0 puts rank r at place r + 1:
 * the inner nodes are the odd ranks. Tree 1 puts rank r at place
 * (r + 1 mod n) + 1, one further: the inner nodes are the even ranks other than
 * n - 1, which is then a leaf of both (odd n). No rank is inner in both.
 *
 *   n = 6   tree 0 (rank r at place r+1)      tree 1 (rank r at place (r+1 mod 6)+1)
 *                      3                                   2
 *                    /   \                               /   \
 *                   1     5                             0     4
 *                  / \   /                             / \   /
 *                 0   2 4                             5   1 3
 *
 * Data: each channel's range is cut into two halves at a 16-byte boundary;
 * tree 0 reduces and broadcasts the first, tree 1 the second. An iteration
 * covers chunk_elems of each half, in four phases on every rank:
 *
 *   phase 1  tree 0 up      leaf:   SEND own input (PRE) to the parent
 *   phase 2  tree 1 up      inner:  RECV_REDUCE_COPY own input (PRE) + first child -> OUTPUT,
 *                                   RECV_REDUCE_SEND OUTPUT + second child -> parent
 *                                   (one child: RECV_REDUCE_SEND input (PRE) + child -> parent)
 *                           root:   as inner, the last reduction with POST into OUTPUT
 *   phase 3  tree 0 down    root:   SEND OUTPUT to each child
 *   phase 4  tree 1 down    inner:  RECV_COPY_SEND parent -> OUTPUT and first child,
 *                                   SEND OUTPUT to the second child
 *                           leaf:   RECV parent -> OUTPUT
 *
 * Children are reduced right (the smaller subtree) first and served left
 * (the deeper subtree) first. Each element is reduced once, at its tree's root,
 * and then copied down, so every rank gets the root's bits. Every message kind
 * (tree 0 up, tree 1 up, tree 0 down, tree 1 down) lives in one phase at both
 * of its ends, so the two messages a connection can carry in an iteration (a
 * rank is the child of a neighbour in one tree and its parent in the other)
 * are sent and received in the same order; the root does not fuse its last
 * reduction with the first send down for that reason. A connection carries at
 * most one message per phase, and the dependencies of a phase point down the
 * tree (up phases) or up it (down phases), never around: no cycle of full
 * FIFOs can form, down to one slot. The verifier checks this.
 *
 * No SCRATCH: OUTPUT (every rank has one in an allreduce) accumulates the
 * children's partial sums of the inner node's chunk. One rank: a COPY with
 * PRE|POST. */
#include "algorithms/algorithms.h"
#include "algorithms/tree.h"

/* A rank's place in one tree: parent and children as ranks (-1: none). */
struct bt_role {
    int parent;
    int nchild;
    int child[2]; /* left (deeper), then right */
};

static long largest_pow2_le(long n)
{
    long p = 1;
    while (p * 2 <= n)
        p *= 2;
    return p;
}

/* Place (1..n) of rank in tree t, and back. */
static long bt_place(long n, long rank, int t)
{
    return (rank + t) % n + 1;
}

static int bt_rank(long n, long place, int t)
{
    return (int)((place - 1 - t + n) % n);
}

static void bt_role_of(long n, long rank, int t, struct bt_role *r)
{
    const long v = bt_place(n, rank, t);
    const long b = v & -v;
    r->parent = -1;
    r->nchild = 0;
    if (v != largest_pow2_le(n)) {
        long u = v;
        for (;;) {
            const long ub = u & -u;
            u = (u & (2 * ub)) ? u - ub : u + ub;
            if (u <= n)
                break;
        }
        r->parent = bt_rank(n, u, t);
    }
    if (b == 1)
        return;
    r->child[r->nchild++] = bt_rank(n, v - b / 2, t);
    for (long d = b / 2; d >= 1; d /= 2)
        if (v + d <= n) {
            r->child[r->nchild++] = bt_rank(n, v + d, t);
            break;
        }
}

static int up_steps(const struct bt_role *r)
{
    return r->nchild > 0 ? r->nchild : 1;
}

static int down_steps(const struct bt_role *r)
{
    return r->nchild > 0 ? r->nchild : 1;
}

static void step_fill(struct plait_step *out, int kind, int src_buf, unsigned flags, int send_peer, int recv_peer)
{
    out->kind = (uint8_t)kind;
    out->src_buf = (uint8_t)src_buf;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->flags = (uint8_t)flags;
    out->send_peer = send_peer;
    out->recv_peer = recv_peer;
}

/* Step j of the up phase: reduce the children (right first) into OUTPUT and
 * pass the partial result up, or finalise it at the root. */
static void up_step(const struct bt_role *r, int j, struct plait_step *out)
{
    if (r->nchild == 0) {
        step_fill(out, PLAIT_STEP_SEND, PLAIT_BUF_INPUT, PLAIT_STEP_PRE, r->parent, -1);
        return;
    }
    const int from = r->child[r->nchild - 1 - j];
    const int src = j == 0 ? PLAIT_BUF_INPUT : PLAIT_BUF_OUTPUT;
    const unsigned pre = j == 0 ? PLAIT_STEP_PRE : 0u;
    if (j < r->nchild - 1)
        step_fill(out, PLAIT_STEP_RECV_REDUCE_COPY, src, pre, -1, from);
    else if (r->parent >= 0)
        step_fill(out, PLAIT_STEP_RECV_REDUCE_SEND, src, pre, r->parent, from);
    else
        step_fill(out, PLAIT_STEP_RECV_REDUCE_COPY, src, pre | PLAIT_STEP_POST, -1, from);
}

/* Step j of the down phase: pass the final result on to the children (left
 * first), receiving it from the parent first unless this is the root. */
static void down_step(const struct bt_role *r, int j, struct plait_step *out)
{
    if (r->parent < 0)
        step_fill(out, PLAIT_STEP_SEND, PLAIT_BUF_OUTPUT, 0, r->child[j], -1);
    else if (r->nchild == 0)
        step_fill(out, PLAIT_STEP_RECV, PLAIT_BUF_OUTPUT, 0, -1, r->parent);
    else if (j == 0)
        step_fill(out, PLAIT_STEP_RECV_COPY_SEND, PLAIT_BUF_OUTPUT, 0, r->child[0], r->parent);
    else
        step_fill(out, PLAIT_STEP_SEND, PLAIT_BUF_OUTPUT, 0, r->child[j], -1);
}

int plait_dbtree_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    const long n = a->nranks;
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    if (n == 1) {
        if (idx > 0)
            return 0;
        step_fill(out, PLAIT_STEP_COPY, PLAIT_BUF_INPUT, PLAIT_STEP_PRE | PLAIT_STEP_POST, -1, -1);
        out->src_off = lo;
        out->dst_off = lo;
        out->count = hi - lo;
        return 1;
    }
    /* tree 0 takes [lo, mid), tree 1 [mid, hi) */
    uint64_t half = (hi - lo + 1) / 2;
    half = (half + a->align_elems - 1) / a->align_elems * a->align_elems;
    const uint64_t mid = half < hi - lo ? lo + half : hi;
    struct bt_role role[2];
    bt_role_of(n, a->rank, 0, &role[0]);
    bt_role_of(n, a->rank, 1, &role[1]);
    const uint64_t up0 = (uint64_t)up_steps(&role[0]), up1 = (uint64_t)up_steps(&role[1]);
    const uint64_t dn0 = (uint64_t)down_steps(&role[0]), dn1 = (uint64_t)down_steps(&role[1]);
    const uint64_t steps = up0 + up1 + dn0 + dn1;
    const uint64_t iter = idx / steps;
    uint64_t s = idx % steps;
    if (iter >= (mid - lo + a->chunk_elems - 1) / a->chunk_elems)
        return 0;

    /* the phases: tree 0 up, tree 1 up, tree 0 down, tree 1 down */
    const uint64_t phase_len[4] = {up0, up1, dn0, dn1};
    int phase = 0;
    while (s >= phase_len[phase])
        s -= phase_len[phase++];
    const int t = phase % 2;
    if (phase < 2)
        up_step(&role[t], (int)s, out);
    else
        down_step(&role[t], (int)s, out);

    const uint64_t first = t == 0 ? lo : mid, end = t == 0 ? mid : hi;
    uint64_t base = first + iter * a->chunk_elems;
    if (base > end)
        base = end; /* tree 1's half may be shorter: the last steps move nothing */
    out->src_off = base;
    out->dst_off = base;
    out->count = end - base < a->chunk_elems ? end - base : a->chunk_elems;
    return 1;
}

static void add_peer(int peer, int rank, int *out, int *cnt, int max)
{
    if (peer < 0 || peer == rank)
        return;
    for (int i = 0; i < *cnt; i++)
        if (out[i] == peer)
            return;
    if (*cnt < max)
        out[(*cnt)++] = peer;
}

void plait_dbtree_add_peers(int nranks, int rank, int *out, int *cnt, int max)
{
    if (nranks < 2)
        return;
    for (int t = 0; t < 2; t++) {
        struct bt_role r;
        bt_role_of(nranks, rank, t, &r);
        add_peer(r.parent, rank, out, cnt, max);
        for (int i = 0; i < r.nchild; i++)
            add_peer(r.child[i], rank, out, cnt, max);
    }
}
