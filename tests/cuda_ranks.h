/* Rank threads for the CUDA tests on the test double: each thread may make
 * device 0's primary context current (as a GPU program sets its device)
 * BEFORE it creates its own communicator, which the harness's thread mode
 * (plait_comm_init_all from one thread) cannot do. Criterion tests only. */
#ifndef PLAIT_TEST_CUDA_RANKS_H
#define PLAIT_TEST_CUDA_RANKS_H

#include <stddef.h>
#include "core/cuda/cu.h"
#include "plait.h"

#define CUDA_RANKS_MAX 8
#define CUDA_RANKS_CONTEXT 1u /* each rank thread makes device 0's primary context current before init */
#define CUDA_RANKS_STREAM 2u  /* each rank gets a non-blocking CUDA stream and plait's handle for it */

struct cuda_ranks;

struct cuda_rank {
    struct cuda_ranks *sh;
    const struct plait_cu *cu;
    int rank, n;
    plait_comm_t comm;
    void *arg;         /* cuda_run_ranks' arg */
    void *stream;      /* CUDA_RANKS_STREAM: the rank's CUDA stream ... */
    plait_stream_t ps; /* ... and plait's handle for it */
    int result, done;
    char msg[512];
};

/* Returns 0 when the rank passed; writes the reason into msg otherwise. */
typedef int (*cuda_rank_fn)(struct cuda_rank *e, char *msg, size_t len);

/* Runs fn on n rank threads, each with its own communicator; fails the test
 * on any rank's failure, or when a rank still runs after timeout_s (a stuck
 * rank cannot be joined: the test process ends there). */
void cuda_run_ranks(int n, unsigned flags, cuda_rank_fn fn, void *arg, double timeout_s);

/* Every rank of the run waits for the others. */
void cuda_rank_barrier(struct cuda_rank *e);

/* A non-blocking CUDA stream and plait's handle for it; nonzero on failure. */
int cuda_stream_open(const struct plait_cu *cu, void **s, plait_stream_t *ps);
void cuda_stream_close(const struct plait_cu *cu, void *s, plait_stream_t ps);

#endif
