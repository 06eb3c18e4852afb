/*
 * perf/reduce_scatter_perf.c — nccl-tests' reduce_scatter_perf on plait.
 *
 * The size is each rank's input (nranks blocks); rank r's output is the
 * reduction over all ranks of input block r. In place, the output is block r of
 * the input buffer.
 */
#include "perf/common.h"

static void reducescatter_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    const size_t per_rank = count / (size_t)nranks;
    counts_out->send_count = per_rank * (size_t)nranks;
    counts_out->recv_count = per_rank;
    counts_out->param_count = per_rank;
    counts_out->send_inplace_offset = 0;
    counts_out->recv_inplace_offset = per_rank;
}

static int reducescatter_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    *rank_out = -1;
    *index_out = (size_t)run->rank * run->counts.param_count + i;
    return 1;
}

static plait_result_t reducescatter_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    return plait_reducescatter(sendbuf, recvbuf, run->counts.param_count, run->type, run->op, run->comm,
                               run->stream);
}

static const struct plait_perf_coll reducescatter_coll = {
    .name = "reduce_scatter",
    .is_reduction = 1,
    .has_root = 0,
    .get_counts = reducescatter_get_counts,
    .busbw_factor = plait_perf_factor_n_minus_1_over_n,
    .source = reducescatter_source,
    .start = reducescatter_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &reducescatter_coll);
}
