/* Settings read from the environment, once per communicator init.
 *
 * Every variable plait reads is listed in one table (env.c) with its default and
 * meaning; plait-info prints it and docs/env.md mirrors it. Where NCCL has the
 * same knob, its NCCL_ name is read too and the PLAIT_ name wins. */
#ifndef PLAIT_ENV_H
#define PLAIT_ENV_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"
#include "../algorithms/schedule.h"

struct plait_env_var {
    const char *name;      /* PLAIT_... */
    const char *nccl_name; /* NCCL_... twin or NULL */
    const char *deflt;     /* default as text, "" if none */
    const char *doc;
};

extern const struct plait_env_var plait_env_table[];
extern const size_t plait_env_table_len;

/* getenv of the PLAIT_ name, else its NCCL_ twin from the table. */
const char *plait_env_get(const char *plait_name);

enum plait_transport_force { PLAIT_FORCE_NONE = 0, PLAIT_FORCE_SOCKET = 1 };

/* PLAIT_PROTO: auto = the small-message path (src/fastpath.c, "LL") where it
 * applies, the FIFO path ("Simple") elsewhere; simple = the FIFO path only. */
enum plait_proto { PLAIT_PROTO_AUTO = 0, PLAIT_PROTO_SIMPLE = 1 };

/* PLAIT_CMA: single-copy transfers between ranks of one host (docs/performance.md). */
enum plait_cma_setting { PLAIT_CMA_AUTO = 0, PLAIT_CMA_OFF = 1, PLAIT_CMA_REQUIRE = 2 };

/* The settings of one communicator. The ones marked (agreed) change which
 * schedule runs or how bytes are framed: every rank must have the same values,
 * which init checks. */
struct plait_settings {
    int nchannels;          /* (agreed) ring channels */
    uint32_t nslots;        /* (agreed) FIFO depth */
    uint64_t slot_bytes;    /* (agreed) FIFO slot size */
    uint64_t chunk_bytes;   /* (agreed) bytes per ring step per rank-chunk */
    int transport_force;    /* (agreed) enum plait_transport_force */
    int proto;              /* (agreed) enum plait_proto */
    uint8_t algo[PLAIT_COLL_COUNT]; /* (agreed) forced algorithm per collective (PLAIT_ALGO / NCCL_ALGO) */
    double timeout_s;       /* setup deadline (PLAIT_TIMEOUT) */
    double coll_timeout_s;  /* collective deadline (PLAIT_COLL_TIMEOUT), 0 = none */
    int spin_us;            /* busy-poll before yielding, -1 = automatic */
    int tree_radix;         /* (agreed) k of k-nomial trees */
    int max_ctas;           /* PLAIT_MAX_CTAS, 0 = unset */
    int min_ctas;           /* PLAIT_MIN_CTAS, 0 = unset */
    char ifname[128];       /* PLAIT_SOCKET_IFNAME */
    char hostid[256];       /* PLAIT_HOSTID, or hostname + network namespace */
    int cma;                /* (agreed) enum plait_cma_setting (PLAIT_CMA) */
    uint64_t cma_min_bytes; /* smallest step published as a descriptor to another process (UINT64_MAX: none) */
    uint64_t cma_local_min_bytes; /* ... to a thread of this process (both from PLAIT_CMA_MIN_BYTES) */
    uint64_t tune_file_hash;    /* (agreed) the PLAIT_TUNE_FILE rules' hash, 0 = none (set by plait_tuner_prepare) */
    uint64_t tune_consts_hash;  /* (agreed) the model constants' hash (defaults or PLAIT_TUNE_CONSTANTS) */
};

/* Reads the environment. Returns PLAIT_ERR_INVALID_ARGUMENT naming the variable
 * when a value is malformed. */
plait_result_t plait_settings_load(struct plait_settings *s);

/* Compares the agreed settings of two ranks; returns the name of the first that
 * differs (and both values as text in buf) or NULL. */
const char *plait_settings_diff(const struct plait_settings *a, const struct plait_settings *b, char *buf,
                                size_t len);

#endif
