/* The CUDA backend's device connections: a communicator's device state
 * (device FIFOs for every host connection, the host-mapped status and abort
 * words, the kernel module), set up at init and torn down at destroy or
 * abort. The state is struct plait_cuda_comm (core/cuda/dev_comm.h). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cuda/dev_comm.h"
#include "core/cuda/cuda.h"
#include "bootstrap/bootstrap.h"
#include "core/progress.h"
#include "base/env.h"
#include "base/log.h"
#include "base/util.h"

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

/* How a pair's FIFOs are reached: 0 none (no connection), 1 proxied (staging
 * memory that the host transport moves: sockets),
 * 2 device memory (same device, peer access or IPC), 3 pinned host memory (a
 * pair of this process whose devices cannot reach each other). */
enum { PAIR_NONE = 0, PAIR_PROXY = 1, PAIR_DEVICE = 2, PAIR_PINNED = 3 };

static int pair_kind(const struct plait_comm *comm, const uint8_t *access, int a, int b)
{
    struct plait_tp_info info;
    plait_comm_pair_info(comm, a, b, &info);
    if (!info.host_mem_shared)
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
    if (comm->config_max_channels > 0)
        return comm->config_max_channels;
    if (comm->config_max_channels < 0) /* the config's max_ctas = 0 */
        return 0;
    if (comm->set.max_channels > 0)
        return comm->set.max_channels;
    if (comm->set.is_max_channels_set) /* set, to 0 */
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
    int nconn = 0, logged_peer = -1;
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
                if (p != logged_peer) {
                    /* The link's own reach decides nothing yet: plait has no
                     * direct device path (GPUDirect RDMA comes with verbs),
                     * so device buffers are always staged; say which case. */
                    struct plait_tp_info info;
                    plait_comm_pair_info(comm, me, p, &info);
                    char who[160];
                    PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                               "rank %d: device buffers to and from %s are staged through host memory by the proxy "
                               "(the %s link %s)",
                               me, plait_peer_str(comm, p, who, sizeof(who)), plait_comm_transport_name(comm, p),
                               info.device_mem & (PLAIT_TP_MEM_CUDA | PLAIT_TP_MEM_DMABUF)
                                   ? "could move device memory directly; plait's direct path is not built yet"
                                   : "moves host memory only");
                    logged_peer = p;
                }
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
    if ((status = plait_cuda_arena_alloc(cc, &cc->plan_arena, 256, &d, NULL)))
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
    /* Device FIFOs are built beside every host connection at once: no
     * connection is made on first use on a communicator with device state
     * (every rank of it has a device, so every rank makes them all). */
    if ((status = plait_comm_connect_all(comm)))
        goto out;
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
    /* Teardown: no spin, a sleep between polls of the event. */
    struct plait_waiter w;
    plait_waiter_init(&w, 0, comm->set.coll_timeout_s);
    plait_waiter_pace(&w, 0, 0, PLAIT_WAIT_SLEEP_NS, PLAIT_WAIT_SLEEP_NS);
    int told = 0;
    for (;;) {
        int r = cc->cu->EventQuery(cc->event);
        if (r != PLAIT_CU_ERROR_NOT_READY)
            return 0; /* done, or the context is broken: nothing runs any more either way */
        if (!plait_wait_idle(&w))
            continue;
        if (!told && (plait_wait_expired(&w) || plait_aborted(&comm->abort_flag))) {
            __atomic_store_n((uint32_t *)(cc->ctl + CTL_ABORT_OFF), 1u, __ATOMIC_RELEASE);
            told = 1;
            plait_wait_rearm(&w, 10.0);
        } else if (told && plait_wait_expired(&w)) {
            PLAIT_WARN(PLAIT_SUBSYS_INIT,
                       "CUDA on rank %d: the communicator's last kernel has not ended 10 s after its abort; its "
                       "device memory is left allocated",
                       comm->rank);
            return -1;
        }
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
    struct plait_waiter w;
    plait_waiter_init(&w, 0, 10.0);
    plait_waiter_pace(&w, 0, 0, PLAIT_WAIT_SLEEP_NS, PLAIT_WAIT_SLEEP_NS);
    while (!plait_aborted(&comm->abort_flag)) {
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
        if (plait_wait_idle(&w) && plait_wait_expired(&w))
            break;
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
        plait_cuda_arena_free(cu, &cc->plan_arena);
        plait_cuda_arena_free(cu, &cc->scratch_arena);
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
    plait_cuda_plans_free(cc);
    if (!owner || !leak) {
        plait_cuda_arena_forget(&cc->plan_arena);
        plait_cuda_arena_forget(&cc->scratch_arena);
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
