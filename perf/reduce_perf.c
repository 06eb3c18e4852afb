/*
 * perf/reduce_perf.c — nccl-tests' reduce_perf on plait.
 *
 * Every rank's input is reduced into the root's output; other ranks' outputs
 * are not defined (not checked).
 */
#include "perf/common.h"

static void reduce_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    (void)nranks;
    counts_out->send_count = count;
    counts_out->recv_count = count;
    counts_out->param_count = count;
    counts_out->send_inplace_offset = 0;
    counts_out->recv_inplace_offset = 0;
}

static int reduce_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    if (run->rank != run->root)
        return 0;
    *rank_out = -1;
    *index_out = i;
    return 1;
}

static plait_result_t reduce_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    return plait_reduce(sendbuf, recvbuf, run->counts.param_count, run->type, run->op, run->root, run->comm,
                        run->stream);
}

static const struct plait_perf_coll reduce_coll = {
    .name = "reduce",
    .is_reduction = 1,
    .has_root = 1,
    .get_counts = reduce_get_counts,
    .busbw_factor = plait_perf_factor_one,
    .source = reduce_source,
    .start = reduce_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &reduce_coll);
}
