/*
 * perf/broadcast_perf.c — nccl-tests' broadcast_perf on plait.
 *
 * Every rank's output is the root's input (-r picks the root, "all" loops over
 * every rank). In place, the root's input is its output buffer.
 */
#include "perf/common.h"

static void broadcast_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    (void)nranks;
    counts_out->send_count = count;
    counts_out->recv_count = count;
    counts_out->param_count = count;
    counts_out->send_inplace_offset = 0;
    counts_out->recv_inplace_offset = 0;
}

static int broadcast_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    *rank_out = run->root;
    *index_out = i;
    return 1;
}

static plait_result_t broadcast_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    return plait_broadcast(sendbuf, recvbuf, run->counts.param_count, run->type, run->root, run->comm, run->stream);
}

static const struct plait_perf_coll broadcast_coll = {
    .name = "broadcast",
    .is_reduction = 0,
    .has_root = 1,
    .get_counts = broadcast_get_counts,
    .busbw_factor = plait_perf_factor_one,
    .source = broadcast_source,
    .start = broadcast_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &broadcast_coll);
}
