/* The tuner: per call, the algorithm, protocol, channel count and chunk size
 * with the lowest modelled time (tuning/model.h), cached per (collective,
 * size bucket); PLAIT_ALGO / PLAIT_PROTO and a tuning file (PLAIT_TUNE_FILE)
 * override. docs/tuning.md. */
#ifndef PLAIT_TUNER_H
#define PLAIT_TUNER_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"
#include "algorithms/algorithms.h"
#include "tuning/model.h"

/* Why a choice was made. */
enum plait_tune_source {
    PLAIT_TUNE_SRC_MODEL = 0, /* lowest modelled time */
    PLAIT_TUNE_SRC_FORCED,    /* PLAIT_ALGO / NCCL_ALGO (and PLAIT_PROTO) */
    PLAIT_TUNE_SRC_FILE,      /* a PLAIT_TUNE_FILE rule */
    PLAIT_TUNE_SRC_DEFAULT,   /* the default rule (plait_algo_select): no model for this call */
    PLAIT_TUNE_SRC_COUNT
};

struct plait_tune_choice {
    uint8_t algo;          /* enum plait_algo_id */
    uint8_t proto;         /* enum plait_model_proto */
    uint8_t nchannels;     /* channels the call uses (<= the communicator's) */
    uint8_t source;        /* enum plait_tune_source */
    uint32_t chunk_bytes;  /* bytes per step per rank-chunk */
    double predicted_s;    /* the model's time for this choice (0 when not modelled) */
};

/* What a call may use: the algorithms the tuner may pick (supported and
 * connected), the communicator's channels and FIFO geometry, whether the LL
 * protocol exists and up to how many bytes per rank pair. */
struct plait_tune_space {
    uint8_t allowed[PLAIT_ALGO_COUNT];
    int max_channels;
    uint64_t slot_bytes;
    uint32_t nslots;
    uint64_t max_chunk_bytes; /* at most half the FIFO (enqueue.c) */
    int radix;
};

/* One candidate of plait_tune_candidates(): an (algorithm, protocol) with its
 * best channel count and chunk size. */
struct plait_tune_candidate {
    struct plait_tune_choice choice;
    struct plait_model_result result;
};

/* Every candidate for a call of `bytes` (count x element size; per rank for
 * allgather, reducescatter, alltoall, as plait_algo_select counts) on m,
 * best channel count and chunk each, in algorithm order (at most max); *best
 * gets the index of the lowest time (ties, i.e. within 1% of the lowest: the
 * lower algorithm id, LL first; within one algorithm fewer channels, then the
 * larger chunk), -1 when none applies. Pure and
 * deterministic. */
plait_result_t plait_tune_candidates(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                                     uint64_t bytes, int esize, struct plait_tune_candidate *out, int max, int *n,
                                     int *best);

/* The (algorithm, protocol) a communicator's tuner takes for a call of
 * `bytes` on m without rules or forcing: the candidates of its size bucket's
 * lower edge (what the cache models), LL when that is best and this size fits
 * it, else the best schedule. What plait-tune --explain marks as the pick. */
plait_result_t plait_tune_pick(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                               uint64_t bytes, int *algo, int *proto);

/* Tuning files (PLAIT_TUNE_FILE): lines "collective  size-range  algorithm
 * [protocol]", e.g. "allreduce 0-4K oneshot" or "allgather 1M-inf ring simple";
 * '#' comments. Ranges are lo <= bytes < hi with K/M/G suffixes (powers of
 * 1024), "*" for every size; the first matching line wins. */
struct plait_tune_rule {
    int coll;        /* enum plait_coll */
    uint64_t lo, hi; /* lo <= bytes < hi (hi UINT64_MAX: no bound) */
    int algo;        /* enum plait_algo_id */
    int proto;       /* enum plait_model_proto, -1: none named (the simple protocol) */
    int line;
};

struct plait_tune_rules {
    struct plait_tune_rule *rules;
    int n;
    uint64_t hash;   /* of the parsed rules: ranks compare it at init */
};

/* Malformed input: PLAIT_ERR_INVALID_ARGUMENT with "NAME:LINE: what" (NAME is
 * the path, or `name` for text). *out is left empty on failure. */
plait_result_t plait_tune_rules_parse(const char *text, size_t len, const char *name, struct plait_tune_rules *out);
plait_result_t plait_tune_rules_load(const char *path, struct plait_tune_rules *out);
void plait_tune_rules_free(struct plait_tune_rules *r);
/* The first rule for (coll, bytes) whose algorithm supports coll on nranks, or NULL. */
const struct plait_tune_rule *plait_tune_rules_match(const struct plait_tune_rules *r, int coll, uint64_t bytes,
                                                     int nranks);

/* The size bucket of `bytes`: 4 per power of two (0 for 0 bytes). */
#define PLAIT_TUNE_BUCKETS 260
int plait_tune_bucket(uint64_t bytes);

/* The model's machine for ranks of one host of this process's kind:
 * `nranks` ranks on one host over `link` (PLAIT_MLINK_SHM, _INPROC or
 * _TCP), the host's cores from its topology graph (topo may be NULL:
 * unknown, no time-slicing), the small-message path when it would be on
 * (fastpath.c's conditions). What plait-tune --explain and the communicator's
 * tuner both build, so that they choose alike. */
struct plait_topo;
plait_result_t plait_tune_machine_local(struct plait_model_machine *m, int nranks, int link, const struct plait_topo *topo,
                                        const struct plait_model_consts *k);

/* "model", "forced", "file", "default rule". */
const char *plait_tune_source_name(int source);

/* For the communicator's tuner (core/tuner_comm.c): the smallest size of
 * bucket b, the collectives the small-message path serves, a host graph's
 * cores (0 when unknown), and the model's answer for a bucket: the schedule
 * candidates (and the small-message protocol when `only` is AUTO) at the
 * bucket's smallest size with a fixed element size, restricted to `only`
 * unless AUTO; ll is 1 when LL is best overall, sbest the best schedule's
 * index or -1. */
uint64_t plait_tune_bucket_lo(int b);
/* The small-message protocol's modelled time for a call, 0 when it does not apply. */
double plait_tune_ll_time(const struct plait_model_machine *m, int coll, uint64_t count, int esize);
int plait_tune_ll_coll(int coll);
int plait_tune_topo_cores(const struct plait_topo *topo);
struct plait_tune_bucket_answer {
    struct plait_tune_candidate cand[PLAIT_ALGO_COUNT + 1];
    int ll;
    int sbest;
};
plait_result_t plait_tune_model_bucket(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                                       int b, int only, struct plait_tune_bucket_answer *ans);

#endif
