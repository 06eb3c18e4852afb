/* The settings of one communicator, read from the environment (base/env.h's
 * table and parser) once per init. */
#ifndef PLAIT_SETTINGS_H
#define PLAIT_SETTINGS_H

#include <stdint.h>
#include "plait.h"
#include "algorithms/schedule.h"
#include "base/env.h"

enum plait_transport_force { PLAIT_FORCE_NONE = 0, PLAIT_FORCE_TCP = 1 /* PLAIT_TRANSPORT=socket */ };

/* PLAIT_PROTO: auto = the small-message path (core/fastpath.c; "LL" in
 * PLAIT_PROTO and NCCL_PROTO) where it applies, the FIFO path ("Simple")
 * elsewhere; simple = the FIFO path only. */
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
    int runtime_connect;    /* (agreed) PLAIT_RUNTIME_CONNECT: 1 connections beyond ring neighbours on first use, 0 all at init */
    int proto;              /* (agreed) enum plait_proto */
    uint8_t algo[PLAIT_COLL_COUNT]; /* (agreed) forced algorithm per collective (PLAIT_ALGO / NCCL_ALGO) */
    double timeout_s;       /* setup deadline (PLAIT_TIMEOUT) */
    double coll_timeout_s;  /* collective deadline (PLAIT_COLL_TIMEOUT), 0 = none */
    int spin_us;            /* busy-poll before yielding, -1 = automatic */
    int tree_radix;         /* (agreed) k of k-nomial trees */
    /* PLAIT_MAX_CTAS / PLAIT_MIN_CTAS bound the channels of both backends:
     * host channels, and CTAs of a device launch (core/cuda/launch.c). */
    int max_channels;       /* PLAIT_MAX_CTAS, 0 = unset */
    int is_max_channels_set; /* PLAIT_MAX_CTAS (or NCCL_MAX_CTAS) is set, possibly to 0 */
    int min_channels;       /* PLAIT_MIN_CTAS, 0 = unset */
    char ifname[128];       /* PLAIT_SOCKET_IFNAME */
    char net_provider[32];  /* (agreed) PLAIT_NET_PROVIDER: "socket" (the default): the net transport's provider */
    char hostid[256];       /* PLAIT_HOSTID, or hostname + network namespace */
    int cma;                /* (agreed) enum plait_cma_setting (PLAIT_CMA) */
    uint64_t cma_min_bytes; /* smallest step published as a descriptor to another process (UINT64_MAX: none) */
    uint64_t cma_local_min_bytes; /* ... to a thread of this process (both from PLAIT_CMA_MIN_BYTES) */
    uint64_t cuda_sc_min_bytes; /* PLAIT_CUDA_SC_MIN_BYTES: smallest device step sent as a descriptor, 0 = off */
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
