/* PLACEHOLDER (being written): supports nothing yet. */
#include "algorithms.h"

int plait_oneshot_supports(int coll, int nranks)
{
    (void)coll;
    (void)nranks;
    return 0;
}

int plait_oneshot_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    (void)a;
    (void)channel;
    (void)idx;
    (void)out;
    return 0;
}

int plait_oneshot_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)nranks;
    (void)rank;
    (void)radix;
    (void)out;
    (void)max;
    return 0;
}

uint64_t plait_oneshot_scratch(const struct plait_sched_args *a)
{
    (void)a;
    return 0;
}

int plait_twoshot_supports(int coll, int nranks)
{
    (void)coll;
    (void)nranks;
    return 0;
}

int plait_twoshot_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    (void)a;
    (void)channel;
    (void)idx;
    (void)out;
    return 0;
}

int plait_twoshot_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)nranks;
    (void)rank;
    (void)radix;
    (void)out;
    (void)max;
    return 0;
}

uint64_t plait_twoshot_scratch(const struct plait_sched_args *a)
{
    (void)a;
    return 0;
}
