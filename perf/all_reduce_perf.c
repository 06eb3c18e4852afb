/*
 * perf/all_reduce_perf.c — nccl-tests' all_reduce_perf on plait.
 *
 * Every rank's output element i is the reduction over all ranks of their input
 * element i; in place, the input and output are the same buffer.
 */
#include "perf/common.h"

static void allreduce_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    (void)nranks;
    counts_out->send_count = count;
    counts_out->recv_count = count;
    counts_out->param_count = count;
    counts_out->send_inplace_offset = 0;
    counts_out->recv_inplace_offset = 0;
}

static int allreduce_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    (void)run;
    *rank_out = -1;
    *index_out = i;
    return 1;
}

static plait_result_t allreduce_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    return plait_allreduce(sendbuf, recvbuf, run->counts.param_count, run->type, run->op, run->comm, run->stream);
}

static const struct plait_perf_coll allreduce_coll = {
    .name = "all_reduce",
    .is_reduction = 1,
    .has_root = 0,
    .get_counts = allreduce_get_counts,
    .busbw_factor = plait_perf_factor_allreduce,
    .source = allreduce_source,
    .start = allreduce_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &allreduce_coll);
}
