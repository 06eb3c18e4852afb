/* The CUDA backend's per-communicator device state (struct plait_cuda_comm),
 * private to the three files that serve it:
 *   core/cuda/conn.c        device connections: a communicator's device FIFOs
 *                           for every host connection, the host-mapped status
 *                           and abort words, the kernel module (setup and
 *                           teardown);
 *   core/cuda/plan_cache.c  launch plans, one per launch shape, kept for the
 *                           communicator's life, in device memory arenas;
 *   core/cuda/launch.c      where a call runs (memory kinds), launches on the
 *                           caller's CUDA streams, and the kernel's errors.
 * docs/architecture.md, section 16; the layouts they fill are in kernel.h. */
#ifndef PLAIT_CUDA_DEV_COMM_H
#define PLAIT_CUDA_DEV_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/comm.h"
#include "core/cuda/cu.h"
#include "core/cuda/kernel.h"

/* The first chunk of a plan arena is allocated at init so that the first
 * launch of a small shape needs no allocation (a launch first seen while a
 * stream is being captured cannot allocate: cuMemAlloc is not allowed in a
 * global-mode capture). Later chunks are at least this large. */
#define ARENA_CHUNK ((size_t)1 << 20)
/* cuLaunchKernel's classic limit on a kernel's parameters (32764 bytes needs
 * CUDA 12.1 and Volta or newer): struct plait_kargs goes by value. */
_Static_assert(sizeof(struct plait_kargs) <= 4096, "struct plait_kargs exceeds the 4 KiB kernel parameter limit");
_Static_assert(PLAIT_DEV_SLOT_DESC == PLAIT_SLOT_DESC, "the kernel's descriptor flag is the FIFO protocol's");
/* lanes_done's 64 bytes: [0] the lane count, [4] and [5] the single-copy
 * counts (kargs.sc_counts). */
#define LANES_SC_COUNTS 4
#define PLAN_BUCKETS 256
#define CTL_STATUS_OFF 0   /* uint64_t status[4] */
#define CTL_ABORT_OFF 64   /* uint32_t abort word, on its own line */
#define CTL_CE_DONE_OFF 96 /* uint64_t: the last copy-engine collective done (ce.c writes it on the stream) */
#define CTL_BYTES 128

/* Bump allocator over chunks of device memory, each with a pinned host
 * mirror (plans: built on the host, copied with cuMemcpyHtoDAsync) or
 * without (scratch). Nothing is ever freed before the communicator:
 * captured graphs keep using what a launch pointed at. */
struct arena_chunk {
    struct arena_chunk *next;
    plait_cudevptr dev;
    char *host;
    size_t size;
    size_t used;
};

struct arena {
    struct arena_chunk *chunks; /* newest first */
    int with_host;
};

/* A launch shape's immutable plan (and its scratch), kept for the
 * communicator's life. */
struct plan {
    struct plan *next;
    uint64_t hash;
    size_t key_len;
    uint64_t *key;
    plait_cudevptr dev;
    const char *staging;      /* pinned host copy of the plan */
    uint64_t bytes;
    plait_cudevptr scratch;   /* the launch's scratch (ops at scratch_off[]) */
    uint64_t scratch_off[PLAIT_KMAX_OPS];
    uint32_t nlanes;
    int uploaded;             /* copied to dev by a launch outside any capture */
};

struct plait_cuda_comm {
    const struct plait_cu *cu;
    void *ctx;
    int dev;
    char bus_id[32];
    void *module;
    void *fn;                 /* the kernel, NULL when this build or device has none */
    char no_kernel_why[160];
    int cta_cap;              /* CTAs a launch may use, -1: no cap (PLAIT_MAX_CTAS, config max_ctas, and
                                 resident_cap) */
    int resident_cap;         /* CTAs a launch of this rank may use so that every launch of every rank
                                 sharing a GPU is resident at once (coresident_cap); -1: unknown, 0: even
                                 one CTA per rank does not fit */
    int ranks_on_gpu;         /* ranks of the communicator on this rank's GPU (all processes) */
    int ce_env;               /* PLAIT_CE_COLL=1 */
    int ll_ok;                /* no rank has proxied connections: the kernel may run LL */
    int has_proxy;            /* this rank has proxied connections */
    int watched;              /* the proxy thread runs: proxied connections, or peers in other processes */
    uint64_t sc_min_bytes;    /* PLAIT_CUDA_SC_MIN_BYTES (0: no single copy) */
    uint8_t *peer_load;       /* per peer: its kernels and ours load each other's device memory (PAIR_DEVICE) */
    int p2p_cap_logged;

    /* FIFO memory: one device segment and one pinned segment (pairs in this
     * process whose devices cannot reach each other) per rank */
    plait_cudevptr seg;
    size_t seg_bytes;
    char *pinned;
    size_t pinned_bytes;
    plait_cudevptr *peer_seg;   /* per peer: its device segment as we address it (0: none) */
    uint8_t *peer_ipc;          /* per peer: peer_seg was opened with cuIpcOpenMemHandle */
    plait_cudevptr dconns;      /* struct plait_dev_conn[nconn] */
    plait_cudevptr dtable;      /* struct plait_dev_conn *[nranks * ncls] */
    int nconn;
    uint8_t *conn_proxied;      /* [nranks * ncls] */

    /* status and abort words (pinned, host-mapped), lanes_done (device) */
    char *ctl;
    plait_cudevptr ctl_dev;
    plait_cudevptr lanes_done;
    int err_reported;

    /* ordering of the communicator's launches across streams */
    void *event;
    void *last_stream;
    int has_last;
    uint64_t launch_seq;

    struct arena plan_arena;
    struct arena scratch_arena;
    struct plan *plans[PLAN_BUCKETS];
    uint64_t *key;              /* the key being looked up (grown on a new, larger shape) */
    size_t key_cap;
    uint8_t *lane_seen;         /* [nchannels + 2 * nranks] */
    int nlane_ids;
    struct plait_kargs kargs;   /* filled per launch, passed by value */
};

static inline plait_result_t cu_fail(int res, const char *what, const char *call)
{
    return plait_cu_error(res, what, call);
}

/* ---- core/cuda/plan_cache.c */

/* Carves bytes (rounded up to 256) out of arena a, adding a chunk of at least
 * ARENA_CHUNK when the newest one is full: its device address, and in *host
 * its pinned mirror (arenas with_host; host may be NULL). */
plait_result_t plait_cuda_arena_alloc(struct plait_cuda_comm *cc, struct arena *a, size_t bytes, plait_cudevptr *dev,
                                      char **host);

/* Frees every chunk of a, device memory and host bookkeeping alike. */
void plait_cuda_arena_free(const struct plait_cu *cu, struct arena *a);

/* Frees the host bookkeeping of a's chunks only (their device memory is
 * leaked on purpose or gone with a forked child's lack of CUDA). */
void plait_cuda_arena_forget(struct arena *a);

/* The plan of the launch of ops[0..nops) (all of one communicator and
 * stream): found by its shape, or built, uploaded on first use and kept. */
plait_result_t plait_cuda_plan_get(struct plait_comm *comm, struct plait_cuda_comm *cc, struct plait_op *const *ops,
                                   int nops, struct plan **out);

/* Frees the host side of every cached plan (their device memory is in the
 * plan arena). */
void plait_cuda_plans_free(struct plait_cuda_comm *cc);

#endif
