/* What the two files of the "tree" algorithm share (private to algorithms/):
 * tree.c holds the k-nomial broadcast and reduce and the table's entry points,
 * dbtree.c the double binary tree allreduce. */
#ifndef PLAIT_TREE_H
#define PLAIT_TREE_H

#include <stdint.h>

#include "algorithms/schedule.h"

/* Double binary tree allreduce (dbtree.c): step `idx` of `channel` on
 * args->rank, as a plait_step_fn. Handles any nranks >= 1. */
int plait_dbtree_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);

/* Appends the ranks `rank` exchanges with in either binary tree over nranks
 * ranks (parents and children, at most 6) to out[0 .. *cnt), skipping rank
 * itself and ranks already listed, writing at most max entries in all. */
void plait_dbtree_add_peers(int nranks, int rank, int *out, int *cnt, int max);

#endif
