/* The table of algorithms (STYLE.md: "choices are data"). The executor, the
 * selection rule, plait-verify and the tests read the same table. */
#ifndef PLAIT_ALGORITHMS_H
#define PLAIT_ALGORITHMS_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"
#include "schedule.h"

enum plait_algo_id { PLAIT_ALGO_AUTO = 0, PLAIT_ALGO_RING = 1, PLAIT_ALGO_TREE = 2, PLAIT_ALGO_BRUCK = 3, PLAIT_ALGO_COUNT };

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
};

/* Whether any algorithm of the table exchanges between a and b (symmetric). */
int plait_algo_connects(int nranks, int radix, int a, int b);

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

/* The generator for a call: the forced choice if any, else the default rule.
 * `bytes` is count x element size (per rank for allgather). Deterministic in its
 * arguments, so every rank chooses the same. */
const struct plait_algorithm *plait_algo_select(int coll, uint64_t bytes, int nranks,
                                                const uint8_t choice[PLAIT_COLL_COUNT]);

#endif
