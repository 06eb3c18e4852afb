/*
 * perf/gather_perf.c — nccl-tests' gather_perf on plait.
 *
 * The size is the root's output (nranks blocks); block q of the root's output
 * is rank q's input. In place, rank r's input is block r of its output buffer.
 */
#include "perf/common.h"

static void gather_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    const size_t per_rank = count / (size_t)nranks;
    counts_out->send_count = per_rank;
    counts_out->recv_count = per_rank * (size_t)nranks;
    counts_out->param_count = per_rank;
    counts_out->send_inplace_offset = per_rank;
    counts_out->recv_inplace_offset = 0;
}

static int gather_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    if (run->rank != run->root)
        return 0;
    const size_t per_rank = run->counts.param_count;
    *rank_out = (int)(i / per_rank);
    *index_out = i % per_rank;
    return 1;
}

static plait_result_t gather_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    return plait_gather(sendbuf, recvbuf, run->counts.param_count, run->type, run->root, run->comm, run->stream);
}

static const struct plait_perf_coll gather_coll = {
    .name = "gather",
    .is_reduction = 0,
    .has_root = 1,
    .get_counts = gather_get_counts,
    .busbw_factor = plait_perf_factor_n_minus_1_over_n,
    .source = gather_source,
    .start = gather_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &gather_coll);
}
