/* Device collectives compared with the CPU backend, element for element.
 *
 * Shared by tests/test_cuda_device.c (Criterion, real GPU), its driver without
 * Criterion (tests/cuda_device_check, built from the same file with
 * -DNO_CRITERION, run by perf/gpu_check.sh on a machine without Criterion) and
 * tests/test_cuda_host.c (the same comparison against the CUDA test double).
 *
 * Every rank (a thread or a forked process) retains the primary context of one
 * device (several ranks share it), makes its communicator, and runs a list of
 * cases in the same order: for each, the same inputs go through the collective
 * on device buffers (on a CUDA stream wrapped by plait_stream_from_cuda) and
 * on host buffers (the CPU backend, NULL stream) of the same communicator, and
 * the outputs must be equal bit for bit. Algorithm, protocol, channel count
 * and chunk size are forced through the environment before the communicators
 * are made, so both backends run the same schedule.
 *
 * Needs only plait's internal library (core/cuda/cu.h for the driver table) and
 * tests/coll_check.c (inputs): no Criterion, no harness. */
#ifndef PLAIT_TEST_CUDA_COMPARE_H
#define PLAIT_TEST_CUDA_COMPARE_H

#include <stddef.h>
#include <stdio.h>

enum cx_coll {
    CX_ALLREDUCE,
    CX_BROADCAST,
    CX_REDUCE,
    CX_ALLGATHER,
    CX_REDUCESCATTER,
    CX_ALLTOALL,
    CX_GATHER,
    CX_SCATTER,
    CX_SENDRECV,
    CX_NUM_COLLS
};

#define CX_MAX_COUNTS 8

/* What to run: every (collective, type, op, placement, count) allowed by the
 * masks, in that nesting order. */
struct cx_config {
    int nranks;
    int use_procs;         /* 1: forked processes (fork before any CUDA call), 0: threads */
    int device;            /* CUDA device ordinal every rank uses */
    unsigned colls;        /* bit (1u << enum cx_coll) */
    unsigned types;        /* bit (1u << plait_datatype_t) */
    unsigned ops;          /* bit (1u << op), op as tests/coll_check.h numbers them (5 = premulsum) */
    unsigned placements;   /* bit 0: out of place, bit 1: in place (where the collective has it) */
    size_t counts[CX_MAX_COUNTS];
    int ncounts;
    const char *algo;      /* PLAIT_ALGO for both backends; NULL: cx_default_algo */
    const char *proto;     /* PLAIT_PROTO; NULL: "simple" */
    int nchannels;         /* PLAIT_NCHANNELS = PLAIT_MIN_CTAS = PLAIT_MAX_CTAS; 0: 2 */
    long chunk_bytes;      /* PLAIT_CHUNK_SIZE; 0: 131072 */
    double timeout_s;      /* the whole run; ranks still running then are killed (processes) or the
                            * process exits (threads) */
    int print_passes;      /* 1: one line per case; 0: failures only */
    const char *label;     /* prefix of each line ("double", "gpu") */
};

#define CX_ALL_COLLS ((1u << CX_NUM_COLLS) - 1)
#define CX_ALL_TYPES 0xfffu
#define CX_ALL_OPS 0x3fu

extern const char *const cx_default_algo;

/* Fills a config with every collective, type, op and placement, counts 0, 1,
 * 1001 and `big` (0: none), nranks threads on device 0. */
void cx_config_default(struct cx_config *cfg, int nranks, size_t big);

/* Sets the environment (PLAIT_ALGO, ...) the config asks for. Call before the
 * first communicator of the run is made; run_cases does it. */
void cx_set_env(const struct cx_config *cfg);

/* Runs every case; prints one line per case (PASS/FAIL ..., with cfg->label)
 * or only the failures to `out`, and adds to *passed and *failed. Returns 0
 * when every case passed, 1 on failures, 2 when the run itself failed (init,
 * allocation, a rank that died or overran): a line says why. */
int cx_run_cases(const struct cx_config *cfg, FILE *out, long *passed, long *failed);

/* What CUDA this process would load: a real device, the test double
 * (PLAIT_CUDA_LIBRARY) or none. Decided in a forked child (deadline 60 s), so
 * that the caller has made no CUDA call and may still fork ranks. `why` (may
 * be NULL) gets a line saying what was found. */
enum { CX_PROBE_NONE = 0, CX_PROBE_GPU = 1, CX_PROBE_DOUBLE = 2 };
int cx_probe(char *why, size_t len);

const char *cx_coll_name(int coll);

#endif
