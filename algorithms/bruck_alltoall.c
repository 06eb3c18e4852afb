/* PLACEHOLDER (being written): supports nothing yet. */
#include "algorithms.h"

int plait_bruck_alltoall_supports(int nranks)
{
    (void)nranks;
    return 0;
}

int plait_bruck_alltoall_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    (void)a;
    (void)channel;
    (void)idx;
    (void)out;
    return 0;
}

uint64_t plait_bruck_alltoall_scratch(const struct plait_sched_args *a)
{
    (void)a;
    return 0;
}
