/*
 * perf/scatter_perf.c — nccl-tests' scatter_perf on plait.
 *
 * The size is the root's input (nranks blocks); rank r's output is block r of
 * the root's input. In place, the root's output is block root of its input.
 */
#include "perf/common.h"

static void scatter_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    const size_t per_rank = count / (size_t)nranks;
    counts_out->send_count = per_rank * (size_t)nranks;
    counts_out->recv_count = per_rank;
    counts_out->param_count = per_rank;
    counts_out->send_inplace_offset = 0;
    counts_out->recv_inplace_offset = per_rank;
}

static int scatter_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    *rank_out = run->root;
    *index_out = (size_t)run->rank * run->counts.param_count + i;
    return 1;
}

static plait_result_t scatter_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    return plait_scatter(sendbuf, recvbuf, run->counts.param_count, run->type, run->root, run->comm, run->stream);
}

static const struct plait_perf_coll scatter_coll = {
    .name = "scatter",
    .is_reduction = 0,
    .has_root = 1,
    .get_counts = scatter_get_counts,
    .busbw_factor = plait_perf_factor_n_minus_1_over_n,
    .source = scatter_source,
    .start = scatter_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &scatter_coll);
}
