/* PLACEHOLDER (being written): supports nothing yet. */
#include "algorithms.h"

int plait_hier_supports(int coll, int nranks)
{
    (void)coll;
    (void)nranks;
    return 0;
}

int plait_hier_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    (void)a;
    (void)channel;
    (void)idx;
    (void)out;
    return 0;
}

int plait_hier_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)nranks;
    (void)rank;
    (void)radix;
    (void)out;
    (void)max;
    return 0;
}

uint64_t plait_hier_scratch(const struct plait_sched_args *a)
{
    (void)a;
    return 0;
}
