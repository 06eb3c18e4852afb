/* Linear gather and scatter: the root exchanges with every rank directly.
 *
 * Gather: every rank's input lands in block (rank) of the root's output. The
 * root copies its own input into its block, then receives from root+1,
 * root+2, ... (mod n) in that fixed order; every other rank has one SEND to the
 * root. Scatter is the mirror: the root copies its block `root` to its output,
 * then sends block p to rank p in the same order; every other rank has one
 * RECV from the root.
 *
 *   gather, n = 4, root 1:           scatter, n = 4, root 1:
 *     rank 0 --in--> out[0] of 1       rank 1 in[2] --> rank 2 out
 *     rank 2 --in--> out[2] of 1       rank 1 in[3] --> rank 3 out
 *     rank 3 --in--> out[3] of 1       rank 1 in[0] --> rank 0 out
 *     rank 1: COPY in -> out[1]        rank 1: COPY in[1] -> out
 *
 * Each channel handles its slice of the block (plait_sched_channel_range of
 * count) in iterations of chunk_elems: per iteration the root has n steps
 * (its COPY, then one per other rank) and the others one. The root only
 * receives (gather) or only sends (scatter), so no wait can be circular; a
 * rank waiting on the root is served in its turn. No SCRATCH.
 *
 * In place (NCCL's: gather sendbuff == recvbuff + root*count, scatter
 * recvbuff == sendbuff + root*count, on the root) the root's COPY has the same
 * source and destination, which the executor skips.
 *
 * Peers: the root can be any rank, so every other rank. */
#include "algorithms/algorithms.h"

int plait_linear_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_GATHER || coll == PLAIT_COLL_SCATTER;
}

int plait_linear_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (a->coll != PLAIT_COLL_GATHER && a->coll != PLAIT_COLL_SCATTER)
        return 0;
    const int is_gather = a->coll == PLAIT_COLL_GATHER;
    const int is_root = a->rank == a->root;
    const uint64_t n = (uint64_t)a->nranks;
    uint64_t base, len, s;
    if (!plait_sched_chunk_iter(a, channel, idx, is_root ? n : 1, &base, &len, &s))
        return 0;
    out->flags = 0;
    out->count = len;
    out->src_buf = PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->send_peer = -1;
    out->recv_peer = -1;
    out->src_off = base;
    out->dst_off = base;
    if (!is_root) {
        if (is_gather) {
            out->kind = PLAIT_STEP_SEND;
            out->send_peer = a->root;
        } else {
            out->kind = PLAIT_STEP_RECV;
            out->recv_peer = a->root;
        }
        return 1;
    }
    const uint64_t p = ((uint64_t)a->root + s) % n; /* s == 0: the root itself */
    if (is_gather)
        out->dst_off = p * a->count + base;
    else
        out->src_off = p * a->count + base;
    if (s == 0)
        out->kind = PLAIT_STEP_COPY;
    else if (is_gather) {
        out->kind = PLAIT_STEP_RECV;
        out->recv_peer = (int32_t)p;
    } else {
        out->kind = PLAIT_STEP_SEND;
        out->send_peer = (int32_t)p;
    }
    return 1;
}

int plait_linear_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    return plait_peers_all(nranks, rank, out, max);
}
