/*
 * perf/common.h — the nccl-tests-style benchmark harness shared by every
 * perf/<collective>_perf program.
 *
 * A program describes its collective in one `struct plait_perf_coll` and calls
 * plait_perf_main(). The harness owns everything else: the command line (the
 * same options as nccl-tests, plus --np and --threads), creating the ranks,
 * buffers, timing, the correctness check, the table and the JSON rows.
 *
 * How the check works, so that a description only has to say where data goes:
 * every rank's input element j is a deterministic function of (seed, rank, j)
 * that the harness computes on any rank (plait_perf_input_value/_bits). A
 * description's `source` callback says, for each element of this rank's output,
 * which rank's input element it comes from, or that it is the reduction over all
 * ranks of one input index. The harness recomputes the expected value from that
 * and compares every element.
 */
#ifndef PLAIT_PERF_COMMON_H
#define PLAIT_PERF_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"

/* Operation indices as nccl-tests numbers them: the plait_redop_t values
 * PLAIT_SUM..PLAIT_AVG, then a premultiplied sum the harness creates per run
 * with plait_redop_create_premulsum() (scalar 1 on even ranks, 2 on odd ones,
 * as nccl-tests does). */
enum {
    PLAIT_PERF_PREMULSUM = PLAIT_NUM_OPS,
    PLAIT_PERF_NUM_OPS
};

/* Element counts of one tested size (the same five numbers as nccl-tests'
 * getCollByteCount). The harness allocates both buffers large enough for any
 * size up to -e, so these only describe where data lives. */
struct plait_perf_counts {
    size_t send_count;          /* elements of each rank's input */
    size_t recv_count;          /* elements of each rank's output */
    size_t param_count;         /* the count argument passed to the collective */
    size_t send_inplace_offset; /* in place: input  = buffer + rank * send_inplace_offset elements */
    size_t recv_inplace_offset; /* in place: output = buffer + rank * recv_inplace_offset elements */
};

/* Pattern parameters of one check, computed by the harness from (type, op,
 * nranks). Descriptions do not need to read them. */
struct plait_perf_pattern {
    int is_bits;       /* data movement: inputs are random bit patterns, compared bitwise */
    int64_t amp;       /* numeric inputs lie in [-amp, amp] ([0, amp] for unsigned types) */
    int stride;        /* rank r feeds a non-neutral value into index j only if (r + j) % stride == 0 */
    double tol_abs;    /* allowed |got - expected| (plus tol_rel * |expected|) */
    double tol_rel;
    int is_int_avg;    /* integer average: any rounding of the exact quotient is accepted */
};

/* Everything the callbacks of a description may read about the current run.
 * Owned by the harness; valid during the callback only. */
struct plait_perf_run {
    plait_comm_t comm;
    plait_stream_t stream;   /* NULL with -y 1: calls then complete before returning */
    int rank;
    int nranks;
    plait_datatype_t type;
    size_t elt_size;         /* bytes per element of `type` */
    int op_index;            /* PLAIT_SUM..PLAIT_AVG or PLAIT_PERF_PREMULSUM */
    plait_redop_t op;        /* the op to pass to plait (the created one for premulsum) */
    int root;                /* -1 for collectives without a root */
    struct plait_perf_counts counts;
    uint64_t seed;           /* of the current check inputs */
    struct plait_perf_pattern pattern;
};

/* One collective, as data. No slot may be NULL. */
struct plait_perf_coll {
    /* Short name for JSON rows and messages ("all_reduce"). */
    const char *name;
    /* 1 if the collective reduces (takes -o; inputs are small numbers whose
     * reduction is exact or has a known tolerance); 0 for data movement (the op
     * column shows "none" and inputs are random bit patterns). */
    int is_reduction;
    /* 1 if the collective has a root (-r applies; "all" or -1 loops over every rank). */
    int has_root;
    /* 1 if the library refuses the in-place form (alltoall): that half of the
     * table prints N/A and is not run. */
    int no_inplace;
    /* Fills *counts_out for `count` = size in bytes / elt_size. */
    void (*get_counts)(size_t count, size_t elt_size, int nranks, struct plait_perf_counts *counts_out);
    /* busbw = algbw * busbw_factor(nranks); algbw = max(send, recv) bytes / time. */
    double (*busbw_factor)(int nranks);
    /* Where element `i` (0 <= i < counts.recv_count) of this rank's output comes
     * from: *index_out is the element index in the sender's input and *rank_out
     * the sending rank, or -1 for the reduction over all ranks of that index.
     * Returns 0 when the element is not defined on this rank (for example the
     * output of reduce on a non-root rank): it is then not checked. */
    int (*source)(const struct plait_perf_run *run, size_t i, int *rank_out, size_t *index_out);
    /* Issues the collective once: sendbuf and recvbuf are already placed
     * (in-place offsets applied). Returns what plait returned. */
    plait_result_t (*start)(const struct plait_perf_run *run, const void *sendbuf, void *recvbuf);
};

/* Reusable slots. */
double plait_perf_factor_one(int nranks);                 /* 1 (broadcast, reduce) */
double plait_perf_factor_allreduce(int nranks);           /* 2(n-1)/n */
double plait_perf_factor_n_minus_1_over_n(int nranks);    /* (n-1)/n (allgather, reduce_scatter, alltoall) */

/* Rank `rank`'s input element `j` in the current check: a number exactly
 * representable in run->type (reductions) ... */
double plait_perf_input_value(const struct plait_perf_run *run, int rank, size_t j);
/* ... or its raw bits, in the low elt_size bytes (data movement). */
uint64_t plait_perf_input_bits(const struct plait_perf_run *run, int rank, size_t j);
/* The exact value of the reduction over all ranks of input index j under
 * run->op_index (the average as an exact quotient). */
double plait_perf_expected_reduction(const struct plait_perf_run *run, size_t j);

/* The whole program: parses argv, runs the benchmark and returns the process
 * exit status (0 only if every run succeeded and every check passed). */
int plait_perf_main(int argc, char **argv, const struct plait_perf_coll *coll);

#endif /* PLAIT_PERF_COMMON_H */
