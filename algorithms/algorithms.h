/* The table of algorithms (STYLE.md: "choices are data"). The executor, the
 * selection rule, plait-verify and the tests read the same table. */
#ifndef PLAIT_ALGORITHMS_H
#define PLAIT_ALGORITHMS_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"
#include "algorithms/schedule.h"

enum plait_algo_id {
    PLAIT_ALGO_AUTO = 0,
    PLAIT_ALGO_RING,          /* ring.c */
    PLAIT_ALGO_TREE,          /* tree.c (k-nomial broadcast/reduce), dbtree.c (double binary tree allreduce) */
    PLAIT_ALGO_BRUCK,         /* bruck.c (allgather), bruck_alltoall.c */
    PLAIT_ALGO_RECURSIVE,     /* recursive.c: halving/doubling (Rabenseifner) */
    PLAIT_ALGO_PAT,           /* pat.c */
    PLAIT_ALGO_HIER,          /* hier.c: two-level, node-aware */
    PLAIT_ALGO_ONESHOT,       /* direct.c */
    PLAIT_ALGO_TWOSHOT,       /* direct.c */
    PLAIT_ALGO_PAIRWISE,      /* pairwise.c: alltoall */
    PLAIT_ALGO_LINEAR,        /* linear.c: gather, scatter */
    PLAIT_ALGO_DISSEMINATION, /* dissemination.c: barrier */
    PLAIT_ALGO_COUNT
};

struct plait_algorithm {
    int id;
    const char *name;
    /* 1 when the generator handles this collective on nranks ranks */
    int (*supports)(int coll, int nranks);
    plait_step_fn step;
    /* The peers `rank` may exchange with on a channel, over every call this
     * algorithm can serve (any root, any size): the connections made at init.
     * Returns how many it wrote (at most max). */
    int (*peers)(int nranks, int rank, int radix, int *out, int max);
    /* Elements of SCRATCH the call needs on args->rank (NULL: none). */
    plait_scratch_fn scratch;
    /* 1 when peers() is every other rank (pairwise, linear, hier, oneshot,
     * twoshot): connections are then all pairs without listing them. Other
     * algorithms list O(log n) peers (at most PLAIT_ALGO_MAX_PEERS). */
    int all_pairs;
};

#define PLAIT_ALGO_MAX_PEERS 256

/* Whether an algorithm that may run on this communicator (forced in choice, or
 * one the default rule can pick for nranks) exchanges between a and b
 * (symmetric): the channel connections made at init. */
int plait_algo_connects(int nranks, int radix, const uint8_t choice[PLAIT_COLL_COUNT], int a, int b);

/* Indexed by enum plait_algo_id (entry 0, "auto", has no generator). */
extern const struct plait_algorithm plait_algorithms[PLAIT_ALGO_COUNT];

/* Collectives that run as schedules of an algorithm (the others are direct
 * point-to-point exchanges), and their names as PLAIT_ALGO writes them. */
int plait_coll_is_scheduled(int coll);
const char *plait_coll_name(int coll);

/* Parses PLAIT_ALGO's syntax: one algorithm name for every collective, or
 * "coll:algo;coll:algo" (e.g. "allreduce:ring;allgather:ring"). Fills choice[coll]
 * with algorithm ids (PLAIT_ALGO_AUTO where unspecified). strict (PLAIT_ALGO):
 * an unknown or unsupported name is PLAIT_ERR_INVALID_ARGUMENT with a message
 * listing the valid ones; lenient (NCCL_ALGO): such names give one WARN each
 * and stay "auto", so scripts written for NCCL keep running. */
plait_result_t plait_algo_parse(const char *spec, int strict, const char *varname, uint8_t choice[PLAIT_COLL_COUNT]);

/* The generator for a call: the forced choice if any, else the default rule
 * (the choice without a model: tuning/tuner.c decides calls, and falls back to
 * this where its model does not apply).
 * `bytes` is count x element size (per rank for allgather). Deterministic in its
 * arguments, so every rank chooses the same. */
const struct plait_algorithm *plait_algo_select(int coll, uint64_t bytes, int nranks, int nhosts,
                                                const uint8_t choice[PLAIT_COLL_COUNT]);

/* Each algorithm's entry points, in its own file (see the enum). */
/* tree.c */
int plait_tree_supports(int coll, int nranks);
int plait_tree_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_tree_peers(int nranks, int rank, int radix, int *out, int max);
uint64_t plait_tree_scratch(const struct plait_sched_args *args);
/* recursive.c */
int plait_recursive_supports(int coll, int nranks);
int plait_recursive_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_recursive_peers(int nranks, int rank, int radix, int *out, int max);
uint64_t plait_recursive_scratch(const struct plait_sched_args *args);
/* pat.c */
int plait_pat_supports(int coll, int nranks);
int plait_pat_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_pat_peers(int nranks, int rank, int radix, int *out, int max);
uint64_t plait_pat_scratch(const struct plait_sched_args *args);
/* hier.c */
int plait_hier_supports(int coll, int nranks);
int plait_hier_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_hier_peers(int nranks, int rank, int radix, int *out, int max);
uint64_t plait_hier_scratch(const struct plait_sched_args *args);
/* direct.c */
int plait_oneshot_supports(int coll, int nranks);
int plait_oneshot_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_oneshot_peers(int nranks, int rank, int radix, int *out, int max);
uint64_t plait_oneshot_scratch(const struct plait_sched_args *args);
/* direct.c */
int plait_twoshot_supports(int coll, int nranks);
int plait_twoshot_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_twoshot_peers(int nranks, int rank, int radix, int *out, int max);
uint64_t plait_twoshot_scratch(const struct plait_sched_args *args);
/* pairwise.c */
int plait_pairwise_supports(int coll, int nranks);
int plait_pairwise_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_pairwise_peers(int nranks, int rank, int radix, int *out, int max);
/* linear.c */
int plait_linear_supports(int coll, int nranks);
int plait_linear_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_linear_peers(int nranks, int rank, int radix, int *out, int max);
/* dissemination.c */
int plait_dissemination_supports(int coll, int nranks);
int plait_dissemination_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_dissemination_peers(int nranks, int rank, int radix, int *out, int max);
uint64_t plait_dissemination_scratch(const struct plait_sched_args *args);
/* Bruck: allgather (bruck.c) and alltoall (bruck_alltoall.c) share one entry. */
int plait_bruck_alltoall_supports(int nranks);
int plait_bruck_alltoall_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
uint64_t plait_bruck_alltoall_scratch(const struct plait_sched_args *args);
uint64_t plait_bruck_scratch(const struct plait_sched_args *args);

#endif
