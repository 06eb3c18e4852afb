/*
 * perf/alltoall_perf.c — nccl-tests' alltoall_perf on plait.
 *
 * The size is each rank's input (nranks blocks); block q of rank r's output is
 * block r of rank q's input. plait refuses in-place alltoall, so the in-place
 * half of the table is skipped (nccl-tests' -c/-p semantics are unchanged).
 */
#include "perf/common.h"

static void alltoall_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    const size_t per_rank = count / (size_t)nranks;
    counts_out->send_count = per_rank * (size_t)nranks;
    counts_out->recv_count = per_rank * (size_t)nranks;
    counts_out->param_count = per_rank;
    counts_out->send_inplace_offset = 0;
    counts_out->recv_inplace_offset = 0;
}

static int alltoall_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    const size_t per_rank = run->counts.param_count;
    *rank_out = (int)(i / per_rank);
    *index_out = (size_t)run->rank * per_rank + i % per_rank;
    return 1;
}

static plait_result_t alltoall_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    return plait_alltoall(sendbuf, recvbuf, run->counts.param_count, run->type, run->comm, run->stream);
}

static const struct plait_perf_coll alltoall_coll = {
    .name = "alltoall",
    .is_reduction = 0,
    .has_root = 0,
    .no_inplace = 1,
    .get_counts = alltoall_get_counts,
    .busbw_factor = plait_perf_factor_n_minus_1_over_n,
    .source = alltoall_source,
    .start = alltoall_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &alltoall_coll);
}
