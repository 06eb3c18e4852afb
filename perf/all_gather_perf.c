/*
 * perf/all_gather_perf.c — nccl-tests' all_gather_perf on plait.
 *
 * The size is the output of each rank (nranks blocks); block q of every rank's
 * output is rank q's input. In place, rank r's input is block r of its output.
 */
#include "perf/common.h"

static void allgather_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    const size_t per_rank = count / (size_t)nranks;
    counts_out->send_count = per_rank;
    counts_out->recv_count = per_rank * (size_t)nranks;
    counts_out->param_count = per_rank;
    counts_out->send_inplace_offset = per_rank;
    counts_out->recv_inplace_offset = 0;
}

static int allgather_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    const size_t per_rank = run->counts.param_count;
    *rank_out = (int)(i / per_rank);
    *index_out = i % per_rank;
    return 1;
}

static plait_result_t allgather_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    return plait_allgather(sendbuf, recvbuf, run->counts.param_count, run->type, run->comm, run->stream);
}

static const struct plait_perf_coll allgather_coll = {
    .name = "all_gather",
    .is_reduction = 0,
    .has_root = 0,
    .get_counts = allgather_get_counts,
    .busbw_factor = plait_perf_factor_n_minus_1_over_n,
    .source = allgather_source,
    .start = allgather_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &allgather_coll);
}
