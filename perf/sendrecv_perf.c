/*
 * perf/sendrecv_perf.c — nccl-tests' sendrecv_perf on plait.
 *
 * Every rank sends its buffer to rank + 1 and receives rank - 1's into its
 * output, both in one group (an exchange around the ring: outside a group the
 * sends would wait for receives that are never posted). One rank sends to
 * itself. Each rank moves `size` bytes out and `size` bytes in per iteration,
 * so algbw = size / time and busbw = algbw (factor 1).
 *
 * There is no in-place half: plait's API allows in-place buffers only where a
 * collective says so, and a send and a receive on the same buffer in one group
 * have no order between the send reading it and the receive overwriting it.
 */
#include "perf/common.h"

static void sendrecv_get_counts(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out)
{
    (void)elt_size;
    (void)nranks;
    counts_out->send_count = count;
    counts_out->recv_count = count;
    counts_out->param_count = count;
    counts_out->send_inplace_offset = 0;
    counts_out->recv_inplace_offset = 0;
}

static int sendrecv_source(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out)
{
    *rank_out = (run->rank + run->nranks - 1) % run->nranks;
    *index_out = i;
    return 1;
}

static plait_result_t sendrecv_start(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf)
{
    const int next = (run->rank + 1) % run->nranks;
    const int prev = (run->rank + run->nranks - 1) % run->nranks;
    const size_t count = run->counts.param_count;

    plait_result_t res = plait_group_start();
    if (res != PLAIT_SUCCESS)
        return res;
    res = plait_send(sendbuf, count, run->type, next, run->comm, run->stream);
    if (res == PLAIT_SUCCESS)
        res = plait_recv(recvbuf, count, run->type, prev, run->comm, run->stream);
    /* The group is closed even after a failed call, so that this thread's
     * group depth stays balanced; the first error is the one reported. */
    plait_result_t end = plait_group_end();
    return res != PLAIT_SUCCESS ? res : end;
}

static const struct plait_perf_coll sendrecv_coll = {
    .name = "sendrecv",
    .is_reduction = 0,
    .has_root = 0,
    .no_inplace = 1,
    .get_counts = sendrecv_get_counts,
    .busbw_factor = plait_perf_factor_one,
    .source = sendrecv_source,
    .start = sendrecv_start,
};

int main(int argc, char **argv)
{
    return plait_perf_main(argc, argv, &sendrecv_coll);
}
