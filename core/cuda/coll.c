/* The CUDA backend's host side: a communicator's device state (device FIFOs
 * for every host connection, the host-mapped status and abort words, the
 * kernel module), where a call runs (memory kinds), and launches of device
 * operations on the caller's CUDA streams. docs/architecture.md, section 16;
 * the layouts it fills are in kernel.h.
 *
 * Hot path (a launch of a shape seen before): no allocation, no lock, no
 * logging and no host synchronisation; the driver calls are
 * cuStreamIsCapturing, possibly cuStreamWaitEvent (another stream than the
 * communicator's previous launch), cuLaunchKernel and cuEventRecord. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cuda/cuda.h"
#include "core/cuda/cu.h"
#include "core/cuda/kernel.h"
#include "bootstrap/bootstrap.h"
#include "core/comm.h"
#include "base/env.h"
#include "base/log.h"
#include "base/util.h"

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

static plait_result_t cu_fail(int res, const char *what, const char *call)
{
    return plait_cu_error(res, what, call);
}

/* ------------------------------------------------------------ arenas */

static plait_result_t arena_alloc(struct plait_cuda_comm *cc, struct arena *a, size_t bytes, plait_cudevptr *dev,
                                  char **host)
{
    bytes = plait_align_up(bytes ? bytes : 1, 256);
    struct arena_chunk *c = a->chunks;
    if (!c || c->size - c->used < bytes) {
        const size_t size = bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK;
        c = calloc(1, sizeof(*c));
        if (!c)
            return plait_error(PLAIT_ERR_SYSTEM, "CUDA plan memory: out of host memory");
        /* Relaxed: a shape first launched while its stream (or another
         * thread's) is captured may still allocate, as NCCL's do. */
        const int mode = plait_cu_capture_relax(cc->cu);
        int r = cc->cu->MemAlloc(&c->dev, size);
        if (r) {
            plait_cu_capture_restore(cc->cu, mode);
            free(c);
            return cu_fail(r, "device plan/scratch memory", "cuMemAlloc");
        }
        if (a->with_host) {
            void *h = NULL;
            if ((r = cc->cu->MemHostAlloc(&h, size, PLAIT_CU_MEMHOSTALLOC_PORTABLE))) {
                cc->cu->MemFree(c->dev);
                plait_cu_capture_restore(cc->cu, mode);
                free(c);
                return cu_fail(r, "pinned staging for a launch plan", "cuMemHostAlloc");
            }
            c->host = h;
        }
        plait_cu_capture_restore(cc->cu, mode);
        c->size = size;
        c->next = a->chunks;
        a->chunks = c;
    }
    *dev = c->dev + c->used;
    if (host)
        *host = c->host ? c->host + c->used : NULL;
    c->used += bytes;
    return PLAIT_SUCCESS;
}

static void arena_free(const struct plait_cu *cu, struct arena *a)
{
    while (a->chunks) {
        struct arena_chunk *c = a->chunks;
        a->chunks = c->next;
        cu->MemFree(c->dev);
        if (c->host)
            cu->MemFreeHost(c->host);
        free(c);
    }
}

/* ------------------------------------------------------------ setup */

/* What every rank tells the others at init. */
struct gpu_card {
    int32_t has_gpu;
    int32_t dev;
    int32_t cta_cap;
    int32_t resident;   /* plait_kernel CTAs its device holds at once (SMs x PLAIT_KERNEL_CTAS_PER_SM), 0 unknown */
    uint64_t token;     /* process token: same process */
    uint64_t ctx;       /* its context (meaningful in its own process) */
    char bus_id[32];
};

struct seg_card {
    uint64_t dev_base;
    uint64_t pinned_base;
    plait_cu_ipc_handle ipc;
    int32_t has_ipc;
    int32_t has_proxy;
};

/* Bytes of one connection's region in its owner's segment: the receive side
 * of direction peer -> owner (Simple slots, LL lines, sizes, tail) and the
 * credit of direction owner -> peer (head), each counter on its own line. */
static size_t region_bytes(const struct plait_comm *comm)
{
    const size_t fifo = (size_t)comm->set.nslots * comm->set.slot_bytes;
    return plait_align_up(2 * fifo + plait_align_up(comm->set.nslots * 4u, 64) + 128, 256);
}

struct region {
    char *slots, *ll;
    uint32_t *sizes;
    uint64_t *tail, *head;
};

static struct region region_at(const struct plait_comm *comm, plait_cudevptr base)
{
    const size_t fifo = (size_t)comm->set.nslots * comm->set.slot_bytes;
    struct region g;
    char *p = (char *)(uintptr_t)base;
    g.slots = p;
    g.ll = p + fifo;
    g.sizes = (uint32_t *)(p + 2 * fifo);
    g.tail = (uint64_t *)(p + 2 * fifo + plait_align_up(comm->set.nslots * 4u, 64));
    g.head = g.tail + 8;
    return g;
}

/* How a pair's FIFOs are reached: 0 none (no connection), 1 proxied (socket),
 * 2 device memory (same device, peer access or IPC), 3 pinned host memory (a
 * pair of this process whose devices cannot reach each other). */
enum { PAIR_NONE = 0, PAIR_PROXY = 1, PAIR_DEVICE = 2, PAIR_PINNED = 3 };

static int pair_kind(const struct plait_comm *comm, const uint8_t *access, int a, int b)
{
    if (plait_pair_transport(comm, a, b) == PLAIT_TP_SOCKET)
        return PAIR_PROXY;
    const int n = comm->nranks;
    return access[(size_t)a * n + b] && access[(size_t)b * n + a] ? PAIR_DEVICE : PAIR_PINNED;
}

/* The offset of (owner, peer, cls)'s region in the owner's segment of its
 * kind: regions are laid out in (peer, cls) order, each segment on its own. */
static size_t region_offset(const struct plait_comm *comm, const uint8_t *access, int owner, int peer, int cls)
{
    const int kind = pair_kind(comm, access, owner, peer);
    size_t idx = 0;
    for (int q = 0; q < comm->nranks; q++)
        for (int c = 0; c < comm->ncls; c++) {
            if (q == peer && c == cls)
                return idx * region_bytes(comm);
            if (plait_conn_needed(comm, owner, q, c) && pair_kind(comm, access, owner, q) == kind)
                idx++;
        }
    return idx * region_bytes(comm);
}

static int cap_from_settings(const struct plait_comm *comm)
{
    if (comm->max_channels > 0)
        return comm->max_channels;
    if (comm->max_channels < 0) /* the config's max_ctas = 0 */
        return 0;
    if (comm->set.max_ctas > 0)
        return comm->set.max_ctas;
    if (comm->set.is_max_ctas_set) /* set, to 0 */
        return 0;
    return -1;
}

static plait_result_t setup_gpu(struct plait_comm *comm, struct plait_cuda_comm *cc, const struct gpu_card *cards)
{
    const struct plait_cu *cu = cc->cu;
    const int n = comm->nranks, me = comm->rank, ncls = comm->ncls;
    plait_result_t status = PLAIT_SUCCESS;
    int r;
    uint8_t *access = calloc((size_t)n * n, 1);
    struct seg_card *segs = calloc((size_t)n, sizeof(*segs));
    struct plait_dev_conn *hconns = calloc((size_t)n * ncls, sizeof(*hconns));
    plait_cudevptr *table = calloc((size_t)n * ncls, sizeof(*table));
    cc->peer_seg = calloc((size_t)n, sizeof(*cc->peer_seg));
    cc->peer_ipc = calloc((size_t)n, 1);
    cc->peer_load = calloc((size_t)n, 1);
    cc->conn_proxied = calloc((size_t)n * ncls, 1);
    cc->nlane_ids = comm->nchannels + 2 * n;
    cc->lane_seen = calloc((size_t)cc->nlane_ids, 1);
    if (!access || !segs || !hconns || !table || !cc->peer_seg || !cc->peer_ipc || !cc->peer_load ||
        !cc->conn_proxied || !cc->lane_seen) {
        status = plait_error(PLAIT_ERR_SYSTEM, "CUDA setup on rank %d: out of memory", me);
        goto out;
    }

    /* Round 2: which peers' memory this rank's device can address. Pairs of
     * one process on different devices need peer access both ways; pairs of
     * processes of one host go through IPC (which needs it too, and fails at
     * open when there is none). */
    for (int p = 0; p < n; p++) {
        uint8_t *a = &access[(size_t)me * n + p];
        if (cards[p].token != cards[me].token || cards[p].dev == cc->dev) {
            *a = 1;
            continue;
        }
        r = cu->CtxEnablePeerAccess((void *)(uintptr_t)cards[p].ctx, 0);
        *a = r == PLAIT_CU_SUCCESS || r == 704 /* CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED */;
        if (!*a)
            PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                       "CUDA: rank %d (device %d) cannot access rank %d's device %d directly; their FIFOs go "
                       "through pinned host memory",
                       me, cc->dev, p, cards[p].dev);
    }
    if ((status = plait_bootstrap_allgather(comm->bs, access, (size_t)n)))
        goto out;
    /* Single copy reads a peer's window with the kernel's own loads: only
     * where both directions are device memory (the same for both ends). */
    for (int p = 0; p < n; p++)
        cc->peer_load[p] = pair_kind(comm, access, me, p) == PAIR_DEVICE;

    /* Segments. */
    const size_t rb = region_bytes(comm);
    size_t ndev = 0, npin = 0;
    int need_ipc = 0;
    for (int p = 0; p < n; p++)
        for (int c = 0; c < ncls; c++) {
            /* the layout every peer computes for us (region_offset) */
            if (!plait_conn_needed(comm, me, p, c))
                continue;
            if (!comm->conns[(size_t)p * ncls + c]) {
                status = plait_error(PLAIT_ERR_INTERNAL,
                                     "CUDA setup on rank %d: no host connection to rank %d on class %d, which needs one",
                                     me, p, c);
                goto out;
            }
            const int k = pair_kind(comm, access, me, p);
            ndev += k == PAIR_DEVICE;
            npin += k == PAIR_PINNED;
            if (k == PAIR_PINNED && cards[p].token != cards[me].token) {
                status = plait_error(PLAIT_ERR_INVALID_USAGE,
                                     "CUDA setup on rank %d: rank %d is another process whose device (%s) this "
                                     "rank's device (%s) cannot access; plait has no host-staged path between GPU "
                                     "processes of one host yet",
                                     me, p, cards[p].bus_id, cc->bus_id);
                goto out;
            }
            if (k == PAIR_DEVICE && cards[p].token != cards[me].token)
                need_ipc = 1;
        }
    if (ndev) {
        cc->seg_bytes = ndev * rb;
        if ((r = cu->MemAlloc(&cc->seg, cc->seg_bytes))) {
            status = cu_fail(r, "device FIFOs", "cuMemAlloc");
            goto out;
        }
        if ((r = plait_cu_sync_fill(cu, cc->seg, 0, cc->seg_bytes))) {
            status = cu_fail(r, "zeroing the device FIFOs", "cuMemsetD8Async");
            goto out;
        }
        segs[me].dev_base = cc->seg;
        if (need_ipc) {
            if ((r = cu->IpcGetMemHandle(&segs[me].ipc, cc->seg))) {
                status = cu_fail(r, "device FIFOs for other processes", "cuIpcGetMemHandle");
                goto out;
            }
            segs[me].has_ipc = 1;
        }
    }
    if (npin) {
        void *h = NULL;
        cc->pinned_bytes = npin * rb;
        if ((r = cu->MemHostAlloc(&h, cc->pinned_bytes,
                                  PLAIT_CU_MEMHOSTALLOC_PORTABLE | PLAIT_CU_MEMHOSTALLOC_DEVICEMAP))) {
            status = cu_fail(r, "pinned FIFOs", "cuMemHostAlloc");
            goto out;
        }
        cc->pinned = h;
        memset(h, 0, cc->pinned_bytes);
        plait_cudevptr d;
        if ((r = cu->MemHostGetDevicePointer(&d, h, 0))) {
            status = cu_fail(r, "pinned FIFOs", "cuMemHostGetDevicePointer");
            goto out;
        }
        segs[me].pinned_base = d; /* unified addressing: the same address in every context */
    }
    /* Every rank has zeroed its FIFOs before any peer learns where they are. */
    if ((status = plait_bootstrap_allgather(comm->bs, segs, sizeof(*segs))))
        goto out;

    /* Connections. */
    int nconn = 0;
    for (int p = 0; p < n; p++)
        for (int c = 0; c < ncls; c++) {
            struct plait_conn *hc = comm->conns[(size_t)p * ncls + c];
            if (!hc || !plait_conn_needed(comm, me, p, c))
                continue;
            struct plait_dev_conn *dc = &hconns[nconn];
            memset(dc, 0, sizeof(*dc));
            dc->peer = p;
            dc->nslots = comm->set.nslots;
            dc->slot_bytes = (uint32_t)comm->set.slot_bytes;
            const int k = pair_kind(comm, access, me, p);
            if (k == PAIR_PROXY) {
                if ((status = plait_cuda_proxy_conn(comm, hc, dc)))
                    goto out;
                dc->peer = p;
                dc->scope = PLAIT_SCOPE_SYS;
                cc->conn_proxied[(size_t)p * ncls + c] = 1;
                cc->has_proxy = 1;
            } else {
                plait_cudevptr mine_base = k == PAIR_PINNED ? segs[me].pinned_base : segs[me].dev_base;
                plait_cudevptr their_base;
                if (k == PAIR_PINNED) {
                    their_base = segs[p].pinned_base;
                } else if (cards[p].token == cards[me].token) {
                    their_base = segs[p].dev_base;
                } else {
                    if (!cc->peer_seg[p]) {
                        if (!segs[p].has_ipc) {
                            status = plait_error(PLAIT_ERR_INTERNAL,
                                                 "CUDA setup on rank %d: rank %d published no IPC handle", me, p);
                            goto out;
                        }
                        if ((r = plait_cu_ipc_open(cu, &segs[p].ipc, &cc->peer_seg[p]))) {
                            char what[96];
                            snprintf(what, sizeof(what), "rank %d's device FIFOs (device %s) on rank %d (device %s)",
                                     p, cards[p].bus_id, me, cc->bus_id);
                            status = cu_fail(r, what, "cuIpcOpenMemHandle");
                            goto out;
                        }
                        cc->peer_ipc[p] = 1;
                    }
                    their_base = cc->peer_seg[p];
                }
                const struct region mine = region_at(comm, mine_base + region_offset(comm, access, me, p, c));
                const struct region theirs = region_at(comm, their_base + region_offset(comm, access, p, me, c));
                dc->rx.slots = mine.slots;
                dc->rx.ll = mine.ll;
                dc->rx.sizes = mine.sizes;
                dc->rx.tail = mine.tail;
                dc->rx.head = theirs.head;
                dc->tx.slots = theirs.slots;
                dc->tx.ll = theirs.ll;
                dc->tx.sizes = theirs.sizes;
                dc->tx.tail = theirs.tail;
                dc->tx.head = mine.head;
                dc->scope = k == PAIR_DEVICE && strcmp(cards[p].bus_id, cc->bus_id) == 0 ? PLAIT_SCOPE_GPU
                                                                                          : PLAIT_SCOPE_SYS;
            }
            table[(size_t)p * ncls + c] = (plait_cudevptr)nconn; /* index now, address below */
            nconn++;
        }
    cc->nconn = nconn;
    if (nconn) {
        if ((r = cu->MemAlloc(&cc->dconns, sizeof(*hconns) * (size_t)nconn))) {
            status = cu_fail(r, "device connections", "cuMemAlloc");
            goto out;
        }
    }
    if ((r = cu->MemAlloc(&cc->dtable, sizeof(*table) * (size_t)n * ncls))) {
        status = cu_fail(r, "device connection table", "cuMemAlloc");
        goto out;
    }
    for (int p = 0; p < n; p++)
        for (int c = 0; c < ncls; c++) {
            plait_cudevptr *t = &table[(size_t)p * ncls + c];
            *t = comm->conns[(size_t)p * ncls + c] ? cc->dconns + *t * sizeof(*hconns) : 0;
        }
    if ((nconn && (r = plait_cu_sync_copy(cu, (void *)(uintptr_t)cc->dconns, hconns, sizeof(*hconns) * (size_t)nconn))) ||
        (r = plait_cu_sync_copy(cu, (void *)(uintptr_t)cc->dtable, table, sizeof(*table) * (size_t)n * ncls))) {
        status = cu_fail(r, "device connections", "cuMemcpyAsync");
        goto out;
    }

    /* Status and abort words: pinned, mapped, polled by the kernel's waits. */
    void *h = NULL;
    if ((r = cu->MemHostAlloc(&h, CTL_BYTES, PLAIT_CU_MEMHOSTALLOC_PORTABLE | PLAIT_CU_MEMHOSTALLOC_DEVICEMAP))) {
        status = cu_fail(r, "status words", "cuMemHostAlloc");
        goto out;
    }
    cc->ctl = h;
    memset(h, 0, CTL_BYTES);
    if ((r = cu->MemHostGetDevicePointer(&cc->ctl_dev, h, 0))) {
        status = cu_fail(r, "status words", "cuMemHostGetDevicePointer");
        goto out;
    }
    if ((r = cu->MemAlloc(&cc->lanes_done, 64)) || (r = plait_cu_sync_fill(cu, cc->lanes_done, 0, 64))) {
        status = cu_fail(r, "the kernel's lane counter", "cuMemAlloc");
        goto out;
    }
    if ((r = cu->EventCreate(&cc->event, PLAIT_CU_EVENT_DISABLE_TIMING))) {
        status = cu_fail(r, "the communicator's launch event", "cuEventCreate");
        goto out;
    }

    /* The kernel. A build without nvcc, or a device none of the built
     * architectures runs on, keeps the communicator usable for host buffers;
     * device calls then fail naming why. The test double runs the kernels'
     * host emulation and needs no image (so the CUDA host code is tested in
     * builds without nvcc too, such as CI's sanitizer builds). */
    size_t fatbin_bytes = 0;
    const void *fatbin = plait_cuda_fatbin(&fatbin_bytes);
    if (!fatbin && !cu->is_double) {
        snprintf(cc->no_kernel_why, sizeof(cc->no_kernel_why),
                 "this libplait was built without nvcc (no CUDA kernels)");
    } else if ((r = cu->ModuleLoadData(&cc->module, fatbin)) ||
               (r = cu->ModuleGetFunction(&cc->fn, cc->module, PLAIT_KERNEL_NAME))) {
        char e[96];
        snprintf(cc->no_kernel_why, sizeof(cc->no_kernel_why), "the kernels do not load on device %s: %s",
                 cc->bus_id, plait_cu_strerror(r, e, sizeof(e)));
        cc->fn = NULL;
        PLAIT_WARN(PLAIT_SUBSYS_INIT, "CUDA on rank %d: %s; device buffers will be refused", me, cc->no_kernel_why);
    }

    /* The first plan chunk (see ARENA_CHUNK). */
    plait_cudevptr d;
    if ((status = arena_alloc(cc, &cc->plan_arena, 256, &d, NULL)))
        goto out;

    /* The proxy moves proxied FIFOs; it also watches peers in other
     * processes, whose death no kernel can see (proxy.c). */
    cc->watched = cc->has_proxy;
    for (int p = 0; p < n; p++)
        cc->watched |= p != me && cards[p].token != cards[me].token;
    if (cc->watched) {
        if ((status = plait_cuda_proxy_watch(comm, (const uint64_t *)(cc->ctl + CTL_STATUS_OFF),
                                             (uint32_t *)(cc->ctl + CTL_ABORT_OFF), cc->watched)) ||
            (status = plait_cuda_proxy_start(comm)))
            goto out;
    }
    /* LL needs no proxied connection anywhere: every rank must choose alike. */
    memset(segs, 0, sizeof(*segs) * (size_t)n);
    segs[me].has_proxy = cc->has_proxy;
    if ((status = plait_bootstrap_allgather(comm->bs, segs, sizeof(*segs))))
        goto out;
    cc->ll_ok = 1;
    for (int p = 0; p < n; p++)
        if (segs[p].has_proxy)
            cc->ll_ok = 0;
out:
    free(access);
    free(segs);
    free(hconns);
    free(table);
    return status;
}

/* Forward progress. The CTAs of a launch wait on each other (a send and a
 * receive of one group) and on the CTAs of every peer's launch; peers that
 * share this GPU (threads of one process, or processes under MPS or
 * time-slicing) run their launches on the same SMs. A CTA that is not
 * resident while the others spin waiting for it never becomes resident: a
 * hang. So every rank on a GPU gets an equal share of the CTAs the GPU holds
 * at once (plait_kernel takes a whole SM's registers: PLAIT_KERNEL_CTAS_PER_SM
 * per SM), and the communicator's CTA cap is the smallest share of any rank
 * (agreed: computed from the allgathered cards, so every rank chooses the same
 * channels). The share assumes one communicator's launches at a time on the
 * GPU; the launches of other communicators running concurrently on the same
 * GPU are not counted. */
static void coresident_cap(const struct plait_comm *comm, struct plait_cuda_comm *cc, const struct gpu_card *cards)
{
    const int n = comm->nranks;
    int cap = -1;
    for (int p = 0; p < n; p++) {
        if (!cards[p].has_gpu || cards[p].resident <= 0)
            continue;
        int same = 0;
        for (int q = 0; q < n; q++)
            same += cards[q].has_gpu && comm->ranks[q].host_index == comm->ranks[p].host_index &&
                    strncmp(cards[q].bus_id, cards[p].bus_id, sizeof(cards[p].bus_id)) == 0;
        if (p == comm->rank)
            cc->ranks_on_gpu = same;
        const int share = cards[p].resident / (same ? same : 1);
        if (cap < 0 || share < cap)
            cap = share;
    }
    cc->resident_cap = cap;
    if (cap > 0 && (cc->cta_cap < 0 || cc->cta_cap > cap))
        cc->cta_cap = cap;
}


static plait_result_t comm_setup(struct plait_comm *comm);

plait_result_t plait_cuda_comm_setup(struct plait_comm *comm)
{
    const struct plait_cu *cu = plait_cu_get();
    const int mode = plait_cu_capture_relax(cu);
    plait_result_t status = comm_setup(comm);
    plait_cu_capture_restore(cu, mode);
    return status;
}

static plait_result_t comm_setup(struct plait_comm *comm)
{
    const int n = comm->nranks, me = comm->rank;
    const struct plait_cu *cu = plait_cu_get();
    void *ctx = NULL;
    if (cu && (cu->CtxGetCurrent(&ctx) != PLAIT_CU_SUCCESS))
        ctx = NULL;
    struct gpu_card *cards = calloc((size_t)n, sizeof(*cards));
    if (!cards)
        return plait_error(PLAIT_ERR_SYSTEM, "CUDA setup on rank %d: out of memory", me);
    struct gpu_card *mine = &cards[me];
    plait_result_t status = PLAIT_SUCCESS;
    int r;
    mine->has_gpu = ctx != NULL;
    mine->token = comm->ranks[me].process_token;
    mine->ctx = (uint64_t)(uintptr_t)ctx;
    mine->cta_cap = cap_from_settings(comm);
    mine->dev = -1;
    if (ctx) {
        if ((r = cu->CtxGetDevice(&mine->dev)) || (r = cu->DeviceGetPCIBusId(mine->bus_id, sizeof(mine->bus_id), mine->dev))) {
            /* the card still goes out: the other ranks must not wait for it */
            mine->has_gpu = 0;
            PLAIT_WARN(PLAIT_SUBSYS_INIT, "CUDA on rank %d: the current context's device is unknown (%d)", me, r);
        } else {
            int sms = 0;
            if (cu->DeviceGetAttribute(&sms, PLAIT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, mine->dev) == 0 && sms > 0)
                mine->resident = sms * PLAIT_KERNEL_CTAS_PER_SM;
        }
    }
    if ((status = plait_bootstrap_allgather(comm->bs, cards, sizeof(*cards))))
        goto out;
    for (int p = 0; p < n; p++) {
        if (cards[p].has_gpu != cards[0].has_gpu) {
            const int with = cards[p].has_gpu ? p : 0, without = cards[p].has_gpu ? 0 : p;
            status = plait_error(PLAIT_ERR_INVALID_USAGE,
                                 "init: rank %d has a current CUDA device but rank %d has none; every rank of a "
                                 "communicator must init with a current CUDA device (cudaSetDevice), or none",
                                 with, without);
            goto out;
        }
        if (cards[p].cta_cap != cards[0].cta_cap) {
            status = plait_error(PLAIT_ERR_INVALID_USAGE,
                                 "init: rank %d caps CTAs at %d but rank 0 at %d (PLAIT_MAX_CTAS or the config's "
                                 "max_ctas; -1 = no cap); every rank must use the same value",
                                 p, cards[p].cta_cap, cards[0].cta_cap);
            goto out;
        }
    }
    if (!mine->has_gpu) {
        if (cu)
            PLAIT_INFO(PLAIT_SUBSYS_INIT, "CUDA: rank %d has no current CUDA context at init: host buffers only", me);
        goto out;
    }
    struct plait_cuda_comm *cc = calloc(1, sizeof(*cc));
    if (!cc) {
        status = plait_error(PLAIT_ERR_SYSTEM, "CUDA setup on rank %d: out of memory", me);
        goto out;
    }
    cc->cu = cu;
    cc->ctx = ctx;
    cc->dev = mine->dev;
    memcpy(cc->bus_id, mine->bus_id, sizeof(cc->bus_id));
    cc->bus_id[sizeof(cc->bus_id) - 1] = '\0';
    cc->cta_cap = mine->cta_cap;
    coresident_cap(comm, cc, cards);
    double ce = 0;
    cc->ce_env = plait_env_number("PLAIT_CE_COLL", &ce, NULL) == PLAIT_SUCCESS && ce == 1;
    /* PLAIT_CUDA_SC_MIN_BYTES (checked at the start of init, with the other
     * settings). Each rank may have its own: a receiver reads whatever arrives. */
    cc->sc_min_bytes = comm->set.cuda_sc_min_bytes;
    cc->plan_arena.with_host = 1;
    comm->cuda = cc; /* freed by plait_cuda_comm_free, also after a failure here */
    if ((status = setup_gpu(comm, cc, cards)))
        goto out;
    int nsame = 0;
    for (int p = 0; p < n; p++)
        nsame += strcmp(cards[p].bus_id, cc->bus_id) == 0 && cards[p].token == mine->token;
    PLAIT_INFO(PLAIT_SUBSYS_INIT,
               "CUDA: rank %d on device %d (%s)%s, %d rank(s) of this process on it (%d in all), %d device "
               "connection(s)%s, CTA cap %d (co-residency %d)%s",
               me, cc->dev, cc->bus_id, cu->is_double ? " [test double, not a GPU]" : "", nsame, cc->ranks_on_gpu,
               cc->nconn, cc->has_proxy ? " (some through the proxy)" : "", cc->cta_cap, cc->resident_cap,
               cc->fn ? "" : " (no kernel)");
out:
    free(cards);
    return status;
}

/* ------------------------------------------------------------ teardown */

/* Waits for the communicator's last launch (its event), polling so that an
 * abort or the deadline ends the wait: a kernel that never ends is told to
 * (its abort word) and given a grace period. Returns 0 when the device no
 * longer runs the communicator's work (its memory may be freed). */
static int wait_idle(struct plait_comm *comm, struct plait_cuda_comm *cc)
{
    if (!cc->has_last)
        return 0;
    const double limit = comm->set.coll_timeout_s > 0 ? comm->set.coll_timeout_s : 0;
    double deadline = plait_deadline(limit);
    int told = 0;
    for (;;) {
        int r = cc->cu->EventQuery(cc->event);
        if (r != PLAIT_CU_ERROR_NOT_READY)
            return 0; /* done, or the context is broken: nothing runs any more either way */
        if (!told && (plait_deadline_passed(deadline) || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))) {
            __atomic_store_n((uint32_t *)(cc->ctl + CTL_ABORT_OFF), 1u, __ATOMIC_RELEASE);
            told = 1;
            deadline = plait_deadline(10.0);
        } else if (told && plait_deadline_passed(deadline)) {
            PLAIT_WARN(PLAIT_SUBSYS_INIT,
                       "CUDA on rank %d: the communicator's last kernel has not ended 10 s after its abort; its "
                       "device memory is left allocated",
                       comm->rank);
            return -1;
        }
        usleep(200);
    }
}

/* Waits until every receiver has returned the credit of every slot this
 * rank sent it: a receiver writes that last credit (our tx head, in our
 * segment) after our own kernel may have ended, so our FIFO memory must
 * outlive it. Bounded (a peer that never drains, e.g. one that skipped the
 * call, costs at most the deadline), ends at once after an abort, and does
 * not wait for a peer whose process is gone (it writes nothing more).
 * Teardown only: synchronous copies are fine here. */
static void wait_credits(struct plait_comm *comm, struct plait_cuda_comm *cc)
{
    if (!cc->has_last || !cc->nconn || !cc->dconns)
        return;
    struct plait_dev_conn *dc = malloc(sizeof(*dc) * (size_t)cc->nconn);
    if (!dc)
        return;
    const double deadline = plait_deadline(10.0);
    while (!__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) && !plait_deadline_passed(deadline)) {
        if (plait_cu_sync_copy(cc->cu, dc, (const void *)(uintptr_t)cc->dconns, sizeof(*dc) * (size_t)cc->nconn))
            break;
        int pending = 0;
        plait_comm_check_peers(comm);
        for (int i = 0; i < cc->nconn && !pending; i++) {
            if (cc->conn_proxied[(size_t)dc[i].peer * comm->ncls + comm->ncls - 1] || !dc[i].tx.head)
                continue;
            if (comm->peer_exited && __atomic_load_n(&comm->peer_exited[dc[i].peer], __ATOMIC_ACQUIRE))
                continue;
            uint64_t head = 0;
            if (plait_cu_sync_copy(cc->cu, &head, dc[i].tx.head, sizeof(head)))
                break;
            pending = head < dc[i].tx_posted;
        }
        if (!pending)
            break;
        usleep(200);
    }
    free(dc);
}

static void comm_free(struct plait_comm *comm);

void plait_cuda_comm_free(struct plait_comm *comm)
{
    if (!comm->cuda)
        return;
    const struct plait_cu *cu = comm->cuda->cu;
    const int owner = comm->owner_pid == getpid();
    const int mode = owner ? plait_cu_capture_relax(cu) : PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED;
    comm_free(comm);
    if (owner)
        plait_cu_capture_restore(cu, mode);
}

static void comm_free(struct plait_comm *comm)
{
    struct plait_cuda_comm *cc = comm->cuda;
    if (!cc)
        return;
    __atomic_store_n(&comm->cuda, NULL, __ATOMIC_RELEASE);
    const struct plait_cu *cu = cc->cu;
    /* A forked child has no CUDA: it frees its host copies only. */
    const int owner = comm->owner_pid == getpid();
    void *prev = NULL;
    int leak = 0;
    if (owner) {
        cu->CtxGetCurrent(&prev);
        if (prev != cc->ctx)
            cu->CtxSetCurrent(cc->ctx);
        leak = wait_idle(comm, cc) != 0;
        if (!leak)
            wait_credits(comm, cc);
        plait_cuda_proxy_stop(comm); /* also frees FIFOs of pairs added before a failed start */
    }
    if (owner && !leak) {
        plait_cuda_ce_free(comm);
        arena_free(cu, &cc->plan_arena);
        arena_free(cu, &cc->scratch_arena);
        if (cc->peer_ipc)
            for (int p = 0; p < comm->nranks; p++)
                if (cc->peer_ipc[p])
                    plait_cu_ipc_close(cu, cc->peer_seg[p]);
        if (cc->seg)
            cu->MemFree(cc->seg);
        if (cc->pinned)
            cu->MemFreeHost(cc->pinned);
        if (cc->dconns)
            cu->MemFree(cc->dconns);
        if (cc->dtable)
            cu->MemFree(cc->dtable);
        if (cc->lanes_done)
            cu->MemFree(cc->lanes_done);
        if (cc->ctl)
            cu->MemFreeHost(cc->ctl);
        if (cc->event)
            cu->EventDestroy(cc->event);
        if (cc->module)
            cu->ModuleUnload(cc->module);
    }
    if (owner && prev != cc->ctx)
        cu->CtxSetCurrent(prev);
    for (int b = 0; b < PLAN_BUCKETS; b++)
        while (cc->plans[b]) {
            struct plan *p = cc->plans[b];
            cc->plans[b] = p->next;
            free(p->key);
            free(p);
        }
    if (!owner || !leak) {
        for (struct arena_chunk *c = cc->plan_arena.chunks, *nx; c; c = nx) {
            nx = c->next;
            free(c);
        }
        for (struct arena_chunk *c = cc->scratch_arena.chunks, *nx; c; c = nx) {
            nx = c->next;
            free(c);
        }
    }
    free(cc->peer_seg);
    free(cc->peer_ipc);
    free(cc->peer_load);
    free(cc->conn_proxied);
    free(cc->lane_seen);
    free(cc->key);
    free(cc);
}

void plait_cuda_comm_abort(struct plait_comm *comm)
{
    struct plait_cuda_comm *cc = __atomic_load_n(&comm->cuda, __ATOMIC_ACQUIRE);
    if (cc && cc->ctl)
        __atomic_store_n((uint32_t *)(cc->ctl + CTL_ABORT_OFF), 1u, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------ errors */

static const char *kerr_text(uint64_t k)
{
    switch (k) {
    case PLAIT_KERR_ABORT:
        return "aborted (plait_comm_abort, or a peer failed)";
    case PLAIT_KERR_TIMEOUT:
        return "a wait passed PLAIT_COLL_TIMEOUT";
    case PLAIT_KERR_SIZE:
        return "a FIFO slot held another size than expected: the ranks' calls do not match";
    case PLAIT_KERR_NOCONN:
        return "a step names a peer with no connection on its channel (a generator/peer-set mismatch)";
    case PLAIT_KERR_PLAN:
        return "the launch plan is corrupt (bad magic)";
    case PLAIT_KERR_DESC:
        return "a single-copy descriptor names a memory window or range this rank has not mapped (windows "
               "registered differently on the ranks?)";
    default:
        return "unknown kernel error";
    }
}

plait_result_t plait_cuda_poll_error(struct plait_comm *comm)
{
    struct plait_cuda_comm *cc = __atomic_load_n(&comm->cuda, __ATOMIC_ACQUIRE);
    if (!cc || !cc->ctl)
        return PLAIT_SUCCESS;
    const uint64_t *st = (const uint64_t *)(cc->ctl + CTL_STATUS_OFF);
    const uint64_t k = __atomic_load_n(&st[1], __ATOMIC_ACQUIRE);
    if (k == PLAIT_KERR_NONE)
        return PLAIT_SUCCESS;
    const plait_result_t res = k == PLAIT_KERR_ABORT     ? PLAIT_ERR_REMOTE
                               : k == PLAIT_KERR_TIMEOUT ? PLAIT_ERR_TIMEOUT
                               : k == PLAIT_KERR_SIZE    ? PLAIT_ERR_INVALID_USAGE
                                                         : PLAIT_ERR_INTERNAL;
    if (!__atomic_exchange_n(&cc->err_reported, 1, __ATOMIC_ACQ_REL)) {
        char msg[512], who[160];
        const uint64_t lane = __atomic_load_n(&st[2], __ATOMIC_ACQUIRE);
        const int64_t peer = (int64_t)__atomic_load_n(&st[3], __ATOMIC_ACQUIRE);
        if (peer >= 0 && peer < comm->nranks)
            plait_peer_str(comm, (int)peer, who, sizeof(who));
        else
            snprintf(who, sizeof(who), "none");
        snprintf(msg, sizeof(msg), "device kernel on rank %d%s%s: lane %llu, peer %s: %s", comm->rank,
                 comm->name[0] ? " of " : "", comm->name, (unsigned long long)lane, who, kerr_text(k));
        plait_comm_set_async_error(comm, res, msg);
        __atomic_store_n(&comm->in_error, 1, __ATOMIC_RELEASE);
        PLAIT_WARN(PLAIT_SUBSYS_COLL, "%s", msg);
    }
    return res;
}

/* ------------------------------------------------------------ routing */

int plait_cuda_cta_cap(const struct plait_comm *comm)
{
    return comm->cuda ? comm->cuda->cta_cap : -1;
}

void *plait_cuda_ctx(const struct plait_comm *comm)
{
    return comm->cuda ? comm->cuda->ctx : NULL;
}

uint64_t plait_cuda_ce_done_word(const struct plait_comm *comm, const uint64_t **host_out)
{
    struct plait_cuda_comm *cc = comm->cuda;
    if (!cc || !cc->ctl) {
        *host_out = NULL;
        return 0;
    }
    *host_out = (const uint64_t *)(cc->ctl + CTL_CE_DONE_OFF);
    return cc->ctl_dev + CTL_CE_DONE_OFF;
}

int plait_cuda_ll_ok(const struct plait_comm *comm)
{
    return comm->cuda && comm->cuda->ll_ok;
}

static int is_gpu_kind(int kind)
{
    return kind == PLAIT_MEM_DEVICE || kind == PLAIT_MEM_MANAGED;
}

int plait_cuda_route(struct plait_comm *comm, const char *fn, const void *sendbuff, const void *recvbuff,
                     plait_result_t *err)
{
    *err = PLAIT_SUCCESS;
    int ds = -1, dr = -1;
    const int ks = sendbuff ? plait_mem_kind(sendbuff, &ds) : -1;
    /* In place: one driver query (this runs on every call, host ones too). */
    const int kr = recvbuff == sendbuff ? (dr = ds, ks) : recvbuff ? plait_mem_kind(recvbuff, &dr) : -1;
    if (ks < 0 && kr < 0)
        return 0;
    if (ks >= 0 && kr >= 0 && is_gpu_kind(ks) != is_gpu_kind(kr)) {
        *err = plait_error(PLAIT_ERR_INVALID_USAGE,
                           "%s: sendbuff %p is %s memory but recvbuff %p is %s memory; the buffers of one call must "
                           "both be host memory (CPU backend) or both device/managed memory (CUDA backend)",
                           fn, sendbuff, plait_mem_kind_name(ks), recvbuff, plait_mem_kind_name(kr));
        return -1;
    }
    const int kind = ks >= 0 ? ks : kr;
    if (!is_gpu_kind(kind))
        return 0;
    const char *what = ks >= 0 ? "sendbuff" : "recvbuff";
    const void *ptr = ks >= 0 ? sendbuff : recvbuff;
    const struct plait_cuda_comm *cc = comm->cuda;
    if (!cc) {
        *err = plait_error(PLAIT_ERR_INVALID_USAGE,
                           "%s: %s %p is %s memory but the communicator has no GPU (init it with a current CUDA "
                           "device)",
                           fn, what, ptr, plait_mem_kind_name(kind));
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        const int k = i ? kr : ks, d = i ? dr : ds;
        if (k == PLAIT_MEM_DEVICE && d >= 0 && d != cc->dev) {
            *err = plait_error(PLAIT_ERR_INVALID_USAGE,
                               "%s: %s %p is memory of device %d but rank %d's communicator runs on device %d", fn,
                               i ? "recvbuff" : "sendbuff", i ? recvbuff : sendbuff, d, comm->rank, cc->dev);
            return -1;
        }
    }
    if (!cc->fn) {
        *err = plait_error(PLAIT_ERR_INVALID_USAGE, "%s: %s %p is device memory but %s", fn, what, ptr,
                           cc->no_kernel_why);
        return -1;
    }
    return 1;
}

/* ------------------------------------------------------------ plans */

/* FNV-1a over the key's words. */
static uint64_t key_hash(const uint64_t *k, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= k[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int key_reserve(struct plait_cuda_comm *cc, size_t words)
{
    if (words <= cc->key_cap)
        return 0;
    size_t cap = cc->key_cap ? cc->key_cap : 256;
    while (cap < words)
        cap *= 2;
    uint64_t *k = realloc(cc->key, cap * sizeof(*k));
    if (!k)
        return -1;
    cc->key = k;
    cc->key_cap = cap;
    return 0;
}

/* Everything that determines a launch's steps, lanes and scratch, as words:
 * per op its schedule arguments and scratch size, per task its class, lane
 * and generator (or its one step). Buffers, types and ops are not in it:
 * they go in the kernel parameters of every launch. */
static size_t key_build(struct plait_cuda_comm *cc, struct plait_op *const *ops, int nops)
{
    size_t words = 1;
    for (int i = 0; i < nops; i++)
        words += 11 + (size_t)ops[i]->ntasks * (3 + sizeof(struct plait_step) / 8 + 1);
    if (key_reserve(cc, words))
        return 0;
    uint64_t *k = cc->key;
    size_t w = 0;
    k[w++] = (uint64_t)nops;
    for (int i = 0; i < nops; i++) {
        const struct plait_op *op = ops[i];
        const struct plait_sched_args *a = &op->args;
        k[w++] = (uint64_t)op->coll;
        k[w++] = (uint64_t)(uint32_t)a->root;
        k[w++] = a->count;
        k[w++] = (uint64_t)a->nchannels;
        k[w++] = a->chunk_elems;
        k[w++] = a->align_elems;
        k[w++] = (uint64_t)a->radix;
        k[w++] = (uint64_t)op->scratch_bytes;
        k[w++] = (uint64_t)op->esize;
        k[w++] = (uint64_t)op->ntasks;
        k[w++] = 0x6f70656e64ull; /* op separator */
        for (int t = 0; t < op->ntasks; t++) {
            const struct plait_task *tk = &op->tasks[t];
            k[w++] = (uint64_t)tk->cls;
            k[w++] = (uint64_t)tk->lane;
            k[w++] = (uint64_t)(uintptr_t)tk->gen;
            uint64_t st[sizeof(struct plait_step) / 8 + 1];
            memset(st, 0, sizeof(st));
            if (!tk->gen)
                memcpy(st, &tk->step, sizeof(tk->step));
            for (size_t j = 0; j < sizeof(st) / 8; j++)
                k[w++] = st[j];
        }
    }
    return w;
}

struct lane_task {
    int lane;
    int order; /* issue order: op, then task */
    int op;
    int task;
};

static int lane_task_cmp(const void *a, const void *b)
{
    const struct lane_task *x = a, *y = b;
    if (x->lane != y->lane)
        return x->lane < y->lane ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Builds the plan of a new shape: the steps each task's generator yields
 * (computed once here, so the kernel never runs a generator), grouped by
 * lane; writes it into pinned staging and reserves its device copy and
 * scratch. */
static plait_result_t plan_build(struct plait_comm *comm, struct plait_cuda_comm *cc, struct plait_op *const *ops,
                                 int nops, struct plan *pl)
{
    plait_result_t status = PLAIT_SUCCESS;
    int ntasks = 0;
    for (int i = 0; i < nops; i++)
        ntasks += ops[i]->ntasks;
    struct lane_task *lt = malloc(sizeof(*lt) * (size_t)(ntasks ? ntasks : 1));
    struct plait_dev_task *dt = malloc(sizeof(*dt) * (size_t)(ntasks ? ntasks : 1));
    uint32_t *lanes = malloc(sizeof(*lanes) * (size_t)(ntasks + 1));
    size_t nsteps = 0, steps_cap = 1024;
    struct plait_step *steps = malloc(sizeof(*steps) * steps_cap);
    if (!lt || !dt || !lanes || !steps) {
        status = plait_error(PLAIT_ERR_SYSTEM, "CUDA launch plan on rank %d: out of memory", comm->rank);
        goto out;
    }
    int o = 0;
    for (int i = 0; i < nops; i++)
        for (int t = 0; t < ops[i]->ntasks; t++, o++) {
            lt[o].lane = ops[i]->tasks[t].lane;
            lt[o].order = o;
            lt[o].op = i;
            lt[o].task = t;
        }
    qsort(lt, (size_t)ntasks, sizeof(*lt), lane_task_cmp);
    uint32_t nlanes = 0;
    for (int i = 0; i < ntasks; i++) {
        if (i == 0 || lt[i].lane != lt[i - 1].lane)
            lanes[nlanes++] = (uint32_t)i;
        struct plait_op *op = ops[lt[i].op];
        struct plait_task *tk = &op->tasks[lt[i].task];
        dt[i].op = (uint32_t)lt[i].op;
        dt[i].cls = (uint32_t)tk->cls;
        dt[i].step_begin = nsteps;
        for (uint64_t idx = 0;; idx++) {
            struct plait_step st;
            if (tk->gen) {
                if (!tk->gen(&op->args, tk->cls, idx, &st))
                    break;
            } else {
                if (idx > 0)
                    break;
                st = tk->step;
            }
            if (nsteps == steps_cap) {
                struct plait_step *g = realloc(steps, sizeof(*steps) * steps_cap * 2);
                if (!g) {
                    status = plait_error(PLAIT_ERR_SYSTEM, "CUDA launch plan on rank %d: out of memory for %zu steps",
                                         comm->rank, nsteps);
                    goto out;
                }
                steps = g;
                steps_cap *= 2;
            }
            steps[nsteps++] = st;
        }
        dt[i].step_end = nsteps;
    }
    lanes[nlanes] = (uint32_t)ntasks;
    if (nlanes > PLAIT_KMAX_LANES) {
        status = plait_error(PLAIT_ERR_INVALID_USAGE,
                             "CUDA launch on rank %d: %u lanes (CTAs) exceed the kernel's %d: fewer operations per "
                             "group",
                             comm->rank, nlanes, PLAIT_KMAX_LANES);
        goto out;
    }
    struct plait_dev_plan hdr;
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = PLAIT_PLAN_MAGIC;
    hdr.nlanes = nlanes;
    hdr.ntasks = (uint32_t)ntasks;
    hdr.nops = (uint32_t)nops;
    hdr.lane_off = plait_align_up(sizeof(hdr), 16);
    hdr.task_off = plait_align_up(hdr.lane_off + sizeof(uint32_t) * (nlanes + 1), 16);
    hdr.step_off = plait_align_up(hdr.task_off + sizeof(*dt) * (size_t)ntasks, 16);
    hdr.bytes = hdr.step_off + sizeof(*steps) * nsteps;
    char *host = NULL;
    if ((status = arena_alloc(cc, &cc->plan_arena, hdr.bytes, &pl->dev, &host)))
        goto out;
    memcpy(host, &hdr, sizeof(hdr));
    memcpy(host + hdr.lane_off, lanes, sizeof(uint32_t) * (nlanes + 1));
    memcpy(host + hdr.task_off, dt, sizeof(*dt) * (size_t)ntasks);
    memcpy(host + hdr.step_off, steps, sizeof(*steps) * nsteps);
    pl->staging = host;
    pl->bytes = hdr.bytes;
    pl->nlanes = nlanes;
    uint64_t scratch = 0;
    for (int i = 0; i < nops; i++) {
        pl->scratch_off[i] = scratch;
        scratch += plait_align_up(ops[i]->scratch_bytes, 256);
    }
    if (scratch && (status = arena_alloc(cc, &cc->scratch_arena, scratch, &pl->scratch, NULL)))
        goto out;
out:
    free(lt);
    free(dt);
    free(lanes);
    free(steps);
    return status;
}

static plait_result_t plan_get(struct plait_comm *comm, struct plait_cuda_comm *cc, struct plait_op *const *ops,
                               int nops, struct plan **out)
{
    const size_t words = key_build(cc, ops, nops);
    if (!words)
        return plait_error(PLAIT_ERR_SYSTEM, "CUDA launch on rank %d: out of memory", comm->rank);
    const uint64_t h = key_hash(cc->key, words);
    struct plan **bucket = &cc->plans[h % PLAN_BUCKETS];
    for (struct plan *p = *bucket; p; p = p->next)
        if (p->hash == h && p->key_len == words && memcmp(p->key, cc->key, words * 8) == 0) {
            *out = p;
            return PLAIT_SUCCESS;
        }
    struct plan *p = calloc(1, sizeof(*p));
    uint64_t *key = malloc(words * 8);
    if (!p || !key) {
        free(p);
        free(key);
        return plait_error(PLAIT_ERR_SYSTEM, "CUDA launch on rank %d: out of memory", comm->rank);
    }
    memcpy(key, cc->key, words * 8);
    p->hash = h;
    p->key = key;
    p->key_len = words;
    plait_result_t s = plan_build(comm, cc, ops, nops, p);
    if (s) {
        /* what the arenas reserved stays reserved (nothing there is freed
         * before the communicator) */
        free(key);
        free(p);
        return s;
    }
    p->next = *bucket;
    *bucket = p;
    *out = p;
    return PLAIT_SUCCESS;
}

/* ------------------------------------------------------------ launches */

/* Orders this launch after the communicator's previous one when that went to
 * another stream. Skipped while `stream` is being captured: a captured wait on
 * an event recorded outside the capture is an error (the capture would depend
 * on uncaptured work), and a graph's launches run when it is replayed, which
 * the user orders against the communicator's other work, as with NCCL. */
static plait_result_t order_after_last(struct plait_cuda_comm *cc, void *stream, int capturing, const char *fn)
{
    if (capturing || !cc->has_last || cc->last_stream == stream)
        return PLAIT_SUCCESS;
    int r = cc->cu->StreamWaitEvent(stream, cc->event, 0);
    if (r)
        return plait_error_context(cu_fail(r, fn, "cuStreamWaitEvent"), "ordering after the communicator's last launch");
    return PLAIT_SUCCESS;
}

static plait_result_t note_launch(struct plait_cuda_comm *cc, void *stream, int capturing, const char *fn)
{
    if (capturing)
        return PLAIT_SUCCESS; /* an event recorded in a capture cannot be waited for outside it */
    int r = cc->cu->EventRecord(cc->event, stream);
    if (r)
        return cu_fail(r, fn, "cuEventRecord");
    cc->last_stream = stream;
    cc->has_last = 1;
    return PLAIT_SUCCESS;
}

static int op_is_p2p(const struct plait_op *op)
{
    return op->coll == PLAIT_COLL_SEND || op->coll == PLAIT_COLL_RECV;
}

/* Distinct lanes of ops[0..nops) plus `extra` (NULL: none). */
static int count_lanes(struct plait_cuda_comm *cc, struct plait_op *const *ops, int nops, const struct plait_op *extra)
{
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i <= nops; i++) {
            const struct plait_op *op = i < nops ? ops[i] : extra;
            if (!op)
                continue;
            for (int t = 0; t < op->ntasks; t++) {
                const int l = op->tasks[t].lane;
                if (l < 0 || l >= cc->nlane_ids)
                    continue;
                if (pass == 0 && !cc->lane_seen[l]) {
                    cc->lane_seen[l] = 1;
                    n++;
                } else if (pass == 1) {
                    cc->lane_seen[l] = 0;
                }
            }
        }
    }
    return n;
}

/* One kernel launch of ops[0..nops) on `stream`. */
static plait_result_t launch_one(struct plait_comm *comm, struct plait_cuda_comm *cc, void *stream, int capturing,
                                 struct plait_op *const *ops, int nops)
{
    const char *fn = ops[0]->name;
    struct plan *pl = NULL;
    plait_result_t s = plan_get(comm, cc, ops, nops, &pl);
    if (s)
        return s;
    /* Any op may reach a proxied or mortal peer: the proxy watches every launch. */
    const int proxied = cc->watched;
    if ((s = order_after_last(cc, stream, capturing, fn)))
        return s;
    const struct plait_cu *cu = cc->cu;
    int r;
    /* The plan's bytes reach the device on the launch's own stream, before the
     * kernel, from pinned staging kept for the communicator's life: no host
     * synchronisation, and a capture holds a copy node whose source stays
     * valid for every replay. Once a launch outside a capture has copied it,
     * later launches are ordered after that copy (the communicator's event
     * chain) and skip it. */
    if (!pl->uploaded) {
        if ((r = cu->MemcpyHtoDAsync(pl->dev, pl->staging, pl->bytes, stream)))
            return cu_fail(r, fn, "cuMemcpyHtoDAsync (launch plan)");
        if (!capturing)
            pl->uploaded = 1;
    }
    struct plait_kargs *ka = &cc->kargs;
    ka->plan = (const struct plait_dev_plan *)(uintptr_t)pl->dev;
    ka->conns = (struct plait_dev_conn *const *)(uintptr_t)cc->dtable;
    ka->ncls = comm->ncls;
    ka->nranks = comm->nranks;
    ka->rank = comm->rank;
    ka->nops = nops;
    ka->abort_flag = (const volatile uint32_t *)(uintptr_t)(cc->ctl_dev + CTL_ABORT_OFF);
    ka->status = (uint64_t *)(uintptr_t)(cc->ctl_dev + CTL_STATUS_OFF);
    ka->timeout_ns = comm->set.coll_timeout_s > 0 ? (uint64_t)(comm->set.coll_timeout_s * 1e9) : 0;
    ka->lanes_done = (uint32_t *)(uintptr_t)cc->lanes_done;
    ka->sc_counts = ka->lanes_done + LANES_SC_COUNTS;
    ka->sc_min_bytes = cc->sc_min_bytes;
    plait_cuda_ce_sc_table(comm, &ka->wins, &ka->win_mask);
    for (int i = 0; i < nops; i++) {
        const struct plait_op *op = ops[i];
        struct plait_dev_op *d = &ka->ops[i];
        d->buf[PLAIT_BUF_INPUT] = (char *)(uintptr_t)op->sendbuff;
        d->buf[PLAIT_BUF_OUTPUT] = op->recvbuff;
        d->buf[PLAIT_BUF_SCRATCH] = op->scratch_bytes ? (char *)(uintptr_t)(pl->scratch + pl->scratch_off[i]) : NULL;
        d->esize = (uint32_t)op->esize;
        d->dtype = op->red.dtype;
        d->redop = op->red.op;
        d->proto = op->plan.wire;
        d->nranks = op->red.nranks ? op->red.nranks : (uint64_t)comm->nranks;
        d->scalar_f = op->red.scalar_f;
        d->scalar_i = op->red.scalar_i;
        d->piece_max = plait_piece_max(comm->set.slot_bytes, op->esize, op->plan.wire);
        /* A lone send keeps the FIFO's buffering (as exec.c's sc_wants): a
         * descriptor would make it wait for its receiver. */
        d->sc = op_is_p2p(op) && !op->grouped ? 0u : PLAIT_DEV_SC_SEND;
        if (plait_reduce_is_copy(&op->red, PLAIT_STEP_PRE))
            d->sc |= PLAIT_DEV_SC_PLAIN_PRE;
        if (plait_reduce_is_copy(&op->red, PLAIT_STEP_POST))
            d->sc |= PLAIT_DEV_SC_PLAIN_POST;
    }
    void *params[1] = {ka};
    if ((r = cu->LaunchKernel(cc->fn, pl->nlanes ? pl->nlanes : 1, 1, 1, PLAIT_KERNEL_THREADS, 1, 1, 0, stream, params,
                              NULL)))
        return cu_fail(r, fn, "cuLaunchKernel");
    cc->launch_seq++;
    if (proxied)
        plait_cuda_proxy_kick(comm, capturing ? PLAIT_PROXY_FOREVER : cc->launch_seq);
    return note_launch(cc, stream, capturing, fn);
}

/* The device ops of one (communicator, stream), in issue order. */
static plait_result_t launch_stream(struct plait_comm *comm, struct plait_cuda_comm *cc, void *stream,
                                    struct plait_op **ops, int nops)
{
    const struct plait_cu *cu = cc->cu;
    int capture = PLAIT_CU_STREAM_CAPTURE_STATUS_NONE;
    int r = cu->StreamIsCapturing(stream, &capture);
    if (r)
        return cu_fail(r, ops[0]->name, "cuStreamIsCapturing");
    const int capturing = capture != PLAIT_CU_STREAM_CAPTURE_STATUS_NONE;
    plait_result_t s;

    /* Copy-engine all-gathers and broadcasts go first: ops of one group have
     * no order among themselves, and these use no FIFO, so they match no
     * kernel step of a peer. */
    int m = 0;
    for (int i = 0; i < nops; i++) {
        struct plait_op *op = ops[i];
        if ((op->coll == PLAIT_COLL_ALLGATHER || op->coll == PLAIT_COLL_BROADCAST) &&
            (cc->ce_env || cc->cta_cap == 0)) {
            if ((s = order_after_last(cc, stream, capturing, op->name)))
                return s;
            plait_result_t err = PLAIT_SUCCESS;
            if (plait_cuda_ce_try(op, stream, &err)) {
                if (err)
                    return err;
                if ((s = note_launch(cc, stream, capturing, op->name)))
                    return s;
                continue;
            }
        }
        ops[m++] = op;
    }
    nops = m;
    if (!nops)
        return PLAIT_SUCCESS;
    if (cc->resident_cap == 0)
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "%s: rank %d: %d ranks of the communicator share device %s, more than its SMs can hold "
                           "CTAs of plait's kernel at once (one CTA per SM): the kernels would wait for each other "
                           "forever; put fewer ranks on one GPU",
                           ops[0]->name, comm->rank, cc->ranks_on_gpu, cc->bus_id);

    int has_p2p = 0;
    for (int i = 0; i < nops; i++)
        has_p2p |= op_is_p2p(ops[i]);
    if (has_p2p) {
        /* Sends and receives of a group may wait on each other: they must be
         * in one launch (every CTA of a launch runs at once), whatever the
         * cap. */
        if (nops > PLAIT_KMAX_OPS)
            return plait_error(PLAIT_ERR_INVALID_USAGE,
                               "%s: rank %d: a group of %d device operations with sends/receives exceeds the %d one "
                               "kernel launch holds (they must launch together); split the group",
                               ops[0]->name, comm->rank, nops, PLAIT_KMAX_OPS);
        const int lanes = count_lanes(cc, ops, nops, NULL);
        if (cc->resident_cap > 0 && lanes > cc->resident_cap)
            return plait_error(PLAIT_ERR_INVALID_USAGE,
                               "%s: rank %d: a group with sends/receives needs %d CTAs at once (one per peer and "
                               "direction, plus the collectives' channels), but with %d rank(s) of the communicator "
                               "on device %s each rank may have only %d resident (one CTA per SM): it would hang; "
                               "split the group or put fewer ranks on one GPU",
                               ops[0]->name, comm->rank, lanes, cc->ranks_on_gpu, cc->bus_id, cc->resident_cap);
        if (cc->cta_cap >= 0 && lanes > (cc->cta_cap ? cc->cta_cap : 1) && !cc->p2p_cap_logged) {
            cc->p2p_cap_logged = 1;
            PLAIT_INFO(PLAIT_SUBSYS_P2P,
                       "CUDA on rank %d: a group with sends/receives takes %d CTAs, over the cap of %d: "
                       "point-to-point groups launch whole (logged once)",
                       comm->rank, lanes, cc->cta_cap);
        }
        return launch_one(comm, cc, stream, capturing, ops, nops);
    }
    /* Collectives only: consecutive ops share a launch while the launch
     * stays within PLAIT_KMAX_OPS and the CTA cap. Splitting them is
     * deadlock-free: every rank splits the same sequence the same way, and
     * each launch completes on its own. */
    const int cap = cc->cta_cap < 0 ? PLAIT_KMAX_LANES : cc->cta_cap ? cc->cta_cap : 1;
    int start = 0;
    while (start < nops) {
        int end = start + 1;
        while (end < nops && end - start < PLAIT_KMAX_OPS && count_lanes(cc, ops + start, end - start, ops[end]) <= cap)
            end++;
        if ((s = launch_one(comm, cc, stream, capturing, ops + start, end - start)))
            return s;
        start = end;
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_cuda_launch(struct plait_op *ops)
{
    plait_result_t status = PLAIT_SUCCESS;
    struct plait_op *batch[PLAIT_KMAX_OPS * 4];
    while (ops && !status) {
        struct plait_comm *comm = ops->comm;
        void *stream = ops->plan.cu_stream;
        /* This (comm, stream)'s ops, in order, out of the list. */
        int n = 0, overflow = 0;
        struct plait_op **pp = &ops, *mine = NULL, **mtail = &mine;
        while (*pp) {
            struct plait_op *op = *pp;
            if (op->comm == comm && op->plan.cu_stream == stream) {
                *pp = op->next;
                op->next = NULL;
                *mtail = op;
                mtail = &op->next;
                if (n < (int)(sizeof(batch) / sizeof(batch[0])))
                    batch[n++] = op;
                else
                    overflow = 1;
            } else {
                pp = &op->next;
            }
        }
        struct plait_cuda_comm *cc = comm->cuda;
        /* Paired with plait_comm_abort as in the executor: either the abort
         * sees us busy and waits before freeing, or we see its flag. */
        __atomic_add_fetch(&comm->busy, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST) || !cc) {
            status = plait_error(PLAIT_ERR_INVALID_USAGE, "%s: rank %d: the communicator was aborted", batch[0]->name,
                                 comm->rank);
        } else if (overflow) {
            status = plait_error(PLAIT_ERR_INVALID_USAGE,
                                 "%s: rank %d: a group may hold at most %d device operations per communicator and "
                                 "stream",
                                 batch[0]->name, comm->rank, (int)(sizeof(batch) / sizeof(batch[0])));
        } else {
            void *prev = NULL;
            cc->cu->CtxGetCurrent(&prev);
            if (prev != cc->ctx)
                cc->cu->CtxSetCurrent(cc->ctx);
            status = launch_stream(comm, cc, stream, batch, n);
            if (prev != cc->ctx)
                cc->cu->CtxSetCurrent(prev);
            if (status) {
                /* A launch that failed half-way leaves the device FIFOs in an
                 * unknown state: the communicator refuses further work. */
                plait_comm_set_async_error(comm, status, plait_last_error_get());
                __atomic_store_n(&comm->in_error, 1, __ATOMIC_RELEASE);
            }
        }
        __atomic_sub_fetch(&comm->busy, 1, __ATOMIC_SEQ_CST);
        plait_op_free_list(mine);
    }
    plait_op_free_list(ops);
    return status;
}

int plait_cuda_peer_loadable(const struct plait_comm *comm, int peer)
{
    const struct plait_cuda_comm *cc = comm->cuda;
    return cc && cc->peer_load && peer >= 0 && peer < comm->nranks && cc->peer_load[peer];
}

plait_result_t plait_cuda_sc_counts(struct plait_comm *comm, uint64_t *sent_out, uint64_t *received_out)
{
    struct plait_cuda_comm *cc = comm->cuda;
    if (!cc || !cc->lanes_done)
        return plait_error(PLAIT_ERR_INVALID_USAGE, "plait_cuda_sc_counts: rank %d has no device state", comm->rank);
    uint32_t w[2];
    void *prev = NULL;
    cc->cu->CtxGetCurrent(&prev);
    if (prev != cc->ctx)
        cc->cu->CtxSetCurrent(cc->ctx);
    int r = plait_cu_sync_copy(cc->cu, w, (const void *)(uintptr_t)(cc->lanes_done + LANES_SC_COUNTS * sizeof(uint32_t)),
                               sizeof(w));
    if (prev != cc->ctx)
        cc->cu->CtxSetCurrent(prev);
    if (r)
        return cu_fail(r, "plait_cuda_sc_counts", "cuMemcpyAsync");
    *sent_out = w[0];
    *received_out = w[1];
    return PLAIT_SUCCESS;
}
