/* Memory windows and the copy-engine (SM-free) all-gather and broadcast
 * (issue 8, part 7).
 *
 * Windows. plait_comm_window_register is collective: every rank allgathers
 * its buffer's device address (and, for peers in other processes of this
 * host, a CUDA IPC handle of the allocation holding it), so that every rank
 * knows where each peer's window starts in its own address space. As in NCCL,
 * windows are symmetric: a rank addresses a peer's buffer at the offset its
 * own buffer has in its own window.
 *
 * Copy-engine collectives. With PLAIT_CE_COLL=1 (or auto on a communicator
 * whose CTAs are capped at 0: PLAIT_MAX_CTAS=0, config max_ctas 0), a device
 * all-gather or broadcast whose recvbuff lies in a window, on a communicator
 * whose ranks are all on this host, is issued as cuMemcpyAsync calls on the
 * op's stream, with no kernel and no host synchronisation:
 *   all-gather (push): rank r copies its block into recvbuff + r * bytes of
 *     every rank (its own included, unless in place);
 *   broadcast (pull): the root copies sendbuff into its recvbuff (unless in
 *     place); every other rank copies the root's recvbuff into its own.
 *
 * Ordering across ranks uses stream memory operations on flags in device
 * memory, one 64-byte line per (writer, reader) pair and kind, in the reader's
 * flag block (its device memory, mapped into peers like a window):
 *   READY[w -> q] = 1 (written by w on its stream): w's prior work on the
 *     stream is done, so q may write into w's recvbuff (all-gather) or read
 *     w's recvbuff (broadcast: w is the root and the data is there);
 *   DONE[w -> q] = 1: w's copies into (or out of) q's buffer are complete
 *     (cuStreamWriteValue64 without NO_MEMORY_BARRIER orders the preceding
 *     copies before the write, system-wide).
 * The reader waits for 1 (cuStreamWaitValue64) and writes 0 back at once, on
 * its own stream. Each op uses READY[q -> w] for every DONE[w -> q] it uses,
 * and a rank's op ends only after it has seen the DONE of every rank that
 * saw its READY; so a writer sets a flag again only after the reader has
 * cleared it, whatever mix of all-gathers and broadcasts (and roots) follows.
 * The values are constants (0 and 1), not per-op counters: a CUDA graph that
 * captured these calls replays them correctly, any number of times.
 * Limitation, as in NCCL: the CE ops of one communicator must be ordered
 * (one stream, or streams joined by events); two running at once on
 * different streams would share flags.
 *
 * Every rank takes the same decision without talking: PLAIT_CE_COLL is
 * compared at window registration, the host map is common knowledge, and the
 * buffers must be symmetric (in a window at the same offset on every rank) —
 * a rank whose recvbuff is not in a window while its peers' are would run the
 * kernel while they wait for its flags, with no deadline (a stream wait has
 * none; PLAIT_COLL_TIMEOUT does not reach it). That is NCCL's rule for
 * symmetric memory too.
 *
 * Dead peers. A CE collective issued outside a capture ends with a stream
 * write of its sequence number into a host-mapped word
 * (plait_cuda_ce_done_word) and kicks the proxy thread, which watches the
 * peers until the word reaches it (proxy.c); when a peer is gone it records
 * the error naming it and sets every flag this rank waits for
 * (plait_cuda_ce_release_waits), so that the stream does not block forever.
 *
 * Single copy (kernel.h). Each registration also takes the lowest free index
 * of PLAIT_KMAX_WINDOWS (registration and deregistration are collective, so
 * every rank picks the same) and writes row [index][rank] of the
 * communicator's device table: each rank's window base and size as this
 * rank's kernels address it, for the ranks whose kernels load this device's
 * memory and whose memory this device's kernels load (plait_cuda_peer_loadable,
 * symmetric), else 0. The kernel's sender publishes {index, offset, length}
 * for bytes in its windows; the receiver finds their address in its own row.
 * The row is written (a synchronous copy) before the registration's last
 * exchange, so a rank that has returned from it knows every rank's row is in
 * place; a launch uses only the windows registered when it was issued
 * (kargs.win_mask). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bootstrap/bootstrap.h"
#include "core/comm.h"
#include "base/env.h"
#include "base/handle.h"
#include "base/log.h"
#include "core/cuda/cu.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"

#define CE_LINE 64
#define PLAIT_WINDOW_MAGIC 0x706c61697477696eull

enum ce_mode { CE_OFF = 0, CE_ON = 1, CE_AUTO = 2, CE_BAD = -1 };

struct plait_window {
    uint64_t magic;
    struct plait_comm *comm;
    char *base;               /* this rank's buffer */
    size_t size;
    plait_cudevptr *peer_base; /* [nranks]: each rank's buffer in this process's address space, 0 if not mapped */
    plait_cudevptr *ipc_map;  /* [nranks]: what cuIpcOpenMemHandle returned (to close), 0 if none */
    int sc_slot;              /* its index in the single-copy table, -1: none */
    struct plait_window *next;
};

struct plait_cuda_ce {
    const struct plait_cu *cu;
    int mode;                 /* enum ce_mode, the same on every rank */
    int all_local;            /* every rank on this host */
    int logged;               /* the INFO line on why CE was not used was written */
    plait_cudevptr flags;     /* this rank's flag block: READY[nranks] then DONE[nranks], CE_LINE each */
    plait_cudevptr *peer_flags; /* [nranks]: each rank's flag block here */
    plait_cudevptr *flags_map;  /* [nranks]: IPC mappings of peers' flag blocks (to close) */
    struct plait_window *wins;
    plait_cudevptr sc_table;  /* struct plait_dev_win[PLAIT_KMAX_WINDOWS][nranks], device memory; 0: none yet */
    uint32_t sc_mask;         /* indices of the registered windows (bit i: index i) */
    uint64_t seq;             /* copy-engine collectives issued outside a capture */
};

/* What each rank tells the others at registration. */
struct win_info {
    int32_t status;           /* plait_result_t of the rank's preparation */
    int32_t mode;             /* its PLAIT_CE_COLL */
    uint64_t addr;            /* its buffer */
    uint64_t size;
    uint64_t alloc_off;       /* the buffer's offset in its allocation (IPC maps allocations) */
    uint64_t flags;           /* its flag block */
    int32_t has_ipc;
    int32_t pad;
    plait_cu_ipc_handle win_ipc;
    plait_cu_ipc_handle flags_ipc;
    char why[256];
};

static pthread_once_t mode_once = PTHREAD_ONCE_INIT;
static int env_mode = CE_AUTO;
static int logged_no_window;

static void mode_read(void)
{
    double v = PLAIT_ENV_AUTO;
    if (plait_env_number("PLAIT_CE_COLL", &v, NULL) != PLAIT_SUCCESS)
        env_mode = CE_BAD;
    else
        env_mode = v == PLAIT_ENV_AUTO ? CE_AUTO : v == 0 ? CE_OFF : CE_ON;
}

static int ce_env_mode(void)
{
    pthread_once(&mode_once, mode_read);
    return env_mode;
}

static plait_cudevptr flag_ready(plait_cudevptr block, int writer)
{
    return block + (plait_cudevptr)writer * CE_LINE;
}

static plait_cudevptr flag_done(plait_cudevptr block, int nranks, int writer)
{
    return block + (plait_cudevptr)(nranks + writer) * CE_LINE;
}

static int same_process(const struct plait_comm *comm, int p)
{
    return comm->ranks[p].process_token == comm->ranks[comm->rank].process_token;
}

static int same_host(const struct plait_comm *comm, int p)
{
    return comm->ranks[p].host_index == comm->host_index;
}

/* Whether some peer of this host is in another process (IPC handles needed). */
static int needs_ipc(const struct plait_comm *comm)
{
    for (int p = 0; p < comm->nranks; p++)
        if (p != comm->rank && same_host(comm, p) && !same_process(comm, p))
            return 1;
    return 0;
}

static void ce_close_flags(struct plait_cuda_ce *ce, int nranks)
{
    for (int p = 0; ce->flags_map && p < nranks; p++)
        if (ce->flags_map[p])
            plait_cu_ipc_close(ce->cu, ce->flags_map[p]);
    if (ce->flags)
        ce->cu->MemFree(ce->flags);
    free(ce->peer_flags);
    free(ce->flags_map);
    ce->flags = 0;
    ce->peer_flags = NULL;
    ce->flags_map = NULL;
}

static void window_free(struct plait_window *w, const struct plait_cu *cu, int nranks)
{
    for (int p = 0; w->ipc_map && p < nranks; p++)
        if (w->ipc_map[p])
            plait_cu_ipc_close(cu, w->ipc_map[p]);
    free(w->peer_base);
    free(w->ipc_map);
    w->magic = 0;
    plait_handle_retire(PLAIT_RETIRE_OTHER, w); /* its address is not given to the next window at once */
}

/* The rank's part of a registration: checks, the flag block (first window),
 * IPC handles. Errors go to info->status and info->why (the collective step
 * tells every rank). */
static void prepare(struct plait_comm *comm, struct plait_cuda_ce *ce, void *buff, size_t size, int flags,
                    plait_window_t *win_out, struct win_info *info)
{
    const struct plait_cu *cu = ce->cu;
    plait_result_t st = PLAIT_SUCCESS;
    int r, dev = -1;
    info->mode = ce_env_mode();
    info->addr = (uint64_t)(uintptr_t)buff;
    info->size = size;
    if (!win_out || !buff || size == 0) {
        st = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_window_register: %s",
                         !win_out ? "win_out is NULL" : !buff ? "buff is NULL" : "size is 0");
        goto out;
    }
    if (flags & ~PLAIT_WIN_COLL_SYMMETRIC) {
        st = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_window_register: unknown flags 0x%x", (unsigned)flags);
        goto out;
    }
    if (info->mode == CE_BAD) {
        double ignored;
        plait_env_number("PLAIT_CE_COLL", &ignored, NULL); /* the last-error string says why */
        st = plait_error_context(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_window_register");
        goto out;
    }
    if (plait_mem_kind(buff, &dev) != PLAIT_MEM_DEVICE) {
        st = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_window_register: buff %p is %s memory, not device "
                         "memory", buff, plait_mem_kind_name(plait_mem_kind(buff, NULL)));
        goto out;
    }
    const int ipc = needs_ipc(comm);
    if (!ce->flags) {
        const size_t fbytes = (size_t)2 * comm->nranks * CE_LINE;
        void *zero = calloc(1, fbytes);
        if (!zero) {
            st = plait_error(PLAIT_ERR_SYSTEM, "plait_comm_window_register: out of memory");
            goto out;
        }
        if ((r = cu->MemAlloc(&ce->flags, fbytes)) != 0) {
            ce->flags = 0;
            st = plait_cu_error(r, "plait_comm_window_register: copy-engine flags", "cuMemAlloc");
        } else if ((r = plait_cu_sync_copy(cu, (void *)(uintptr_t)ce->flags, zero, fbytes)) != 0) {
            st = plait_cu_error(r, "plait_comm_window_register: copy-engine flags", "cuMemcpyAsync");
        }
        free(zero);
        if (st)
            goto out;
    }
    info->flags = ce->flags;
    if (ipc) {
        plait_cudevptr base = 0;
        size_t range = 0;
        if ((r = cu->MemGetAddressRange(&base, &range, (plait_cudevptr)(uintptr_t)buff)) != 0) {
            st = plait_cu_error(r, "plait_comm_window_register", "cuMemGetAddressRange");
            goto out;
        }
        if ((uint64_t)(uintptr_t)buff - base + size > range) {
            st = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_window_register: [%p, +%zu) runs past its "
                             "allocation (%zu bytes)", buff, size, range);
            goto out;
        }
        info->alloc_off = (uint64_t)(uintptr_t)buff - base;
        if ((r = cu->IpcGetMemHandle(&info->win_ipc, base)) != 0) {
            st = plait_cu_error(r, "plait_comm_window_register: window", "cuIpcGetMemHandle");
            goto out;
        }
        if ((r = cu->IpcGetMemHandle(&info->flags_ipc, ce->flags)) != 0) {
            st = plait_cu_error(r, "plait_comm_window_register: copy-engine flags", "cuIpcGetMemHandle");
            goto out;
        }
        info->has_ipc = 1;
    }
out:
    info->status = st;
    if (st)
        snprintf(info->why, sizeof(info->why), "%s", plait_last_error_get());
}

/* Agrees on a status, from every rank's allgathered one: this rank's own
 * failure, else the first other rank's (named), else PLAIT_SUCCESS. */
static plait_result_t agree(struct plait_comm *comm, const struct win_info *all, const char *what)
{
    if (all[comm->rank].status != PLAIT_SUCCESS)
        return (plait_result_t)all[comm->rank].status; /* its own message is the last error already */
    for (int p = 0; p < comm->nranks; p++)
        if (all[p].status != PLAIT_SUCCESS)
            return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: rank %d failed: %s", what, p, all[p].why);
    return PLAIT_SUCCESS;
}

/* Opens the peers' windows (and, the first time, flag blocks) in this
 * process's address space. */
static plait_result_t open_peers(struct plait_comm *comm, struct plait_cuda_ce *ce, struct plait_window *w,
                                 const struct win_info *all, int first)
{
    const struct plait_cu *cu = ce->cu;
    const int n = comm->nranks;
    for (int p = 0; p < n; p++) {
        if (all[p].mode != all[comm->rank].mode)
            return plait_error(PLAIT_ERR_INVALID_USAGE, "plait_comm_window_register: PLAIT_CE_COLL differs: rank %d "
                               "has %d, rank %d has %d (2 = auto); every rank must set the same", comm->rank,
                               all[comm->rank].mode, p, all[p].mode);
        if (p == comm->rank) {
            w->peer_base[p] = all[p].addr;
            if (first)
                ce->peer_flags[p] = ce->flags;
            continue;
        }
        if (!same_host(comm, p))
            continue; /* not mapped: copy engines do not reach other hosts */
        if (same_process(comm, p)) {
            w->peer_base[p] = all[p].addr;
            if (first)
                ce->peer_flags[p] = all[p].flags;
            continue;
        }
        if (!all[p].has_ipc)
            return plait_error(PLAIT_ERR_INTERNAL, "plait_comm_window_register: rank %d sent no IPC handle", p);
        plait_cudevptr m = 0;
        int r = plait_cu_ipc_open(cu, &all[p].win_ipc, &m);
        if (r) {
            char who[160];
            return plait_error_context(plait_cu_error(r, "plait_comm_window_register", "cuIpcOpenMemHandle"),
                                       "opening the window of %s", plait_peer_str(comm, p, who, sizeof(who)));
        }
        w->ipc_map[p] = m;
        w->peer_base[p] = m + all[p].alloc_off;
        if (first) {
            if ((r = plait_cu_ipc_open(cu, &all[p].flags_ipc, &m)) != 0) {
                char who[160];
                return plait_error_context(plait_cu_error(r, "plait_comm_window_register", "cuIpcOpenMemHandle"),
                                           "opening the copy-engine flags of %s",
                                           plait_peer_str(comm, p, who, sizeof(who)));
            }
            ce->flags_map[p] = m;
            ce->peer_flags[p] = m;
        }
    }
    return PLAIT_SUCCESS;
}

/* Writes row `slot` of the single-copy table (zeros when w is NULL). */
static plait_result_t sc_write_row(struct plait_comm *comm, struct plait_cuda_ce *ce, int slot,
                                   const struct plait_window *w, const struct win_info *all)
{
    const int n = comm->nranks;
    struct plait_dev_win *row = calloc((size_t)n, sizeof(*row));
    if (!row)
        return plait_error(PLAIT_ERR_SYSTEM, "memory window single-copy table: out of memory");
    for (int p = 0; w && p < n; p++)
        if (w->peer_base[p] && plait_cuda_peer_loadable(comm, p)) {
            row[p].base = w->peer_base[p];
            row[p].size = all[p].size;
        }
    const size_t rb = sizeof(*row) * (size_t)n;
    int r = plait_cu_sync_copy(ce->cu, (void *)(uintptr_t)(ce->sc_table + (plait_cudevptr)slot * rb), row, rb);
    free(row);
    return r ? plait_cu_error(r, "memory window single-copy table", "cuMemcpyAsync") : PLAIT_SUCCESS;
}

/* Gives window w the lowest free single-copy index and writes its row
 * (none beyond PLAIT_KMAX_WINDOWS, or without device state). */
static plait_result_t sc_map(struct plait_comm *comm, struct plait_cuda_ce *ce, struct plait_window *w,
                             const struct win_info *all)
{
    const struct plait_cu *cu = ce->cu;
    w->sc_slot = -1;
    if (!comm->cuda || ce->sc_mask == UINT32_MAX)
        return PLAIT_SUCCESS;
    if (!ce->sc_table) {
        const size_t bytes = sizeof(struct plait_dev_win) * PLAIT_KMAX_WINDOWS * (size_t)comm->nranks;
        void *zero = calloc(1, bytes);
        int r = zero ? cu->MemAlloc(&ce->sc_table, bytes) : 0;
        if (zero && !r && (r = plait_cu_sync_copy(cu, (void *)(uintptr_t)ce->sc_table, zero, bytes)) != 0) {
            cu->MemFree(ce->sc_table);
            ce->sc_table = 0;
        } else if (r) {
            ce->sc_table = 0;
        }
        free(zero);
        if (!zero)
            return plait_error(PLAIT_ERR_SYSTEM, "memory window single-copy table: out of memory");
        if (r)
            return plait_cu_error(r, "memory window single-copy table", "cuMemAlloc/cuMemcpyHtoD");
    }
    int slot = 0;
    while (ce->sc_mask & (1u << slot))
        slot++;
    plait_result_t st = sc_write_row(comm, ce, slot, w, all);
    if (!st)
        w->sc_slot = slot;
    return st;
}

void plait_cuda_ce_sc_table(const struct plait_comm *comm, const struct plait_dev_win **table_out,
                            uint32_t *mask_out)
{
    const struct plait_cuda_ce *ce = comm->cuda_ce;
    *table_out = ce ? (const struct plait_dev_win *)(uintptr_t)ce->sc_table : NULL;
    *mask_out = ce && ce->sc_table ? ce->sc_mask : 0;
}

static plait_result_t window_register(plait_comm_t comm, void *buff, size_t size, int flags, plait_window_t *win_out);
static plait_result_t window_deregister(plait_comm_t comm, plait_window_t win);

/* Both run the driver in the thread's RELAXED capture mode (cu.h). */
plait_result_t plait_comm_window_register(plait_comm_t comm, void *buff, size_t size, int flags,
                                          plait_window_t *win_out)
{
    const struct plait_cu *cu = plait_cu_get();
    const int mode = plait_cu_capture_relax(cu);
    plait_result_t status = window_register(comm, buff, size, flags, win_out);
    plait_cu_capture_restore(cu, mode);
    return status;
}

plait_result_t plait_comm_window_deregister(plait_comm_t comm, plait_window_t win)
{
    const struct plait_cu *cu = plait_cu_get();
    const int mode = plait_cu_capture_relax(cu);
    plait_result_t status = window_deregister(comm, win);
    plait_cu_capture_restore(cu, mode);
    return status;
}

static plait_result_t window_register(plait_comm_t comm, void *buff, size_t size, int flags, plait_window_t *win_out)
{
    static const char fn[] = "plait_comm_window_register";
    plait_result_t status = plait_comm_check(comm, fn);
    if (status)
        return status;
    const struct plait_cu *cu = plait_cu_get();
    if (!cu)
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: no CUDA device: windows are device memory", fn);
    const int n = comm->nranks;
    struct plait_cuda_ce *ce = comm->cuda_ce;
    if (!ce) {
        ce = calloc(1, sizeof(*ce));
        if (!ce)
            return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", fn);
        ce->cu = cu;
        ce->all_local = comm->nhosts == 1;
        comm->cuda_ce = ce;
    }
    const int first = ce->peer_flags == NULL;
    struct win_info *all = calloc((size_t)n, sizeof(*all));
    struct plait_window *w = calloc(1, sizeof(*w));
    plait_cudevptr *pf = first ? calloc((size_t)n, sizeof(*pf)) : NULL;
    plait_cudevptr *fm = first ? calloc((size_t)n, sizeof(*fm)) : NULL;
    if (w) {
        w->sc_slot = -1;
        w->peer_base = calloc((size_t)n, sizeof(*w->peer_base));
        w->ipc_map = calloc((size_t)n, sizeof(*w->ipc_map));
    }
    struct win_info *mine = all ? &all[comm->rank] : NULL;
    struct win_info scratch;
    if (!mine) {
        memset(&scratch, 0, sizeof(scratch));
        mine = &scratch;
    }
    if (!all || !w || !w->peer_base || !w->ipc_map || (first && (!pf || !fm))) {
        mine->status = plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", fn);
        snprintf(mine->why, sizeof(mine->why), "out of memory");
    } else {
        prepare(comm, ce, buff, size, flags, win_out, mine);
    }
    if (!all) {
        /* Without the table the exchange cannot run; the peers fail with the
         * bootstrap's timeout. */
        status = mine->status;
        goto err_free;
    }
    status = plait_bootstrap_allgather(comm->bs, all, sizeof(*all));
    if (!status)
        status = agree(comm, all, fn);
    if (status)
        goto err_free;
    if (first) {
        ce->peer_flags = pf;
        ce->flags_map = fm;
        pf = fm = NULL;
        ce->mode = all[comm->rank].mode;
    }
    status = open_peers(comm, ce, w, all, first);
    if (!status)
        status = sc_map(comm, ce, w, all);
    /* Every rank learns whether every other could open what it sent. */
    memset(mine, 0, sizeof(*mine));
    mine->status = status;
    if (status)
        snprintf(mine->why, sizeof(mine->why), "%s", plait_last_error_get());
    plait_result_t ag = plait_bootstrap_allgather(comm->bs, all, sizeof(*all));
    if (!status)
        status = ag ? ag : agree(comm, all, fn);
    if (status)
        goto err_free;
    if (w->sc_slot >= 0)
        ce->sc_mask |= 1u << w->sc_slot;
    w->magic = PLAIT_WINDOW_MAGIC;
    w->comm = comm;
    w->base = buff;
    w->size = size;
    w->next = ce->wins;
    ce->wins = w;
    free(all);
    *win_out = w;
    return PLAIT_SUCCESS;

err_free:
    if (w)
        window_free(w, cu, n);
    if (first && ce->peer_flags)
        ce_close_flags(ce, n); /* the next registration starts again from the flags */
    free(pf);
    free(fm);
    free(all);
    return status;
}

static plait_result_t window_deregister(plait_comm_t comm, plait_window_t win)
{
    static const char fn[] = "plait_comm_window_deregister";
    plait_result_t hs = plait_comm_check_handle(comm, fn);
    if (hs)
        return hs;
    struct plait_cuda_ce *ce = comm->cuda_ce;
    if (!ce || !ce->wins)
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: no window is registered on this communicator%s", fn,
                           plait_cu_get() ? "" : " (windows need a CUDA device)");
    /* The communicator's list is the registry of its windows: win is looked
     * for there before anything is read through it. */
    struct plait_window **pp = &ce->wins;
    while (*pp && *pp != win)
        pp = &(*pp)->next;
    if (!*pp || !win)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "%s: win %p is not a live window of this communicator (not returned by "
                           "plait_comm_window_register on it, or deregistered already)",
                           fn, (void *)win);
    *pp = win->next;
    /* Collective, as NCCL's: no rank returns (and frees its buffer) before
     * every rank has stopped using the window. */
    plait_result_t status = plait_bootstrap_barrier(comm->bs);
    if (win->sc_slot >= 0) {
        /* Launches issued from now on no longer name it; the row goes too
         * (a later registration reuses the index). */
        ce->sc_mask &= ~(1u << win->sc_slot);
        plait_result_t s2 = sc_write_row(comm, ce, win->sc_slot, NULL, NULL);
        if (!status)
            status = s2;
    }
    window_free(win, ce->cu, comm->nranks);
    return status;
}

void plait_cuda_ce_free(struct plait_comm *comm)
{
    struct plait_cuda_ce *ce = comm->cuda_ce;
    if (!ce)
        return;
    while (ce->wins) {
        struct plait_window *w = ce->wins;
        ce->wins = w->next;
        window_free(w, ce->cu, comm->nranks);
    }
    ce_close_flags(ce, comm->nranks);
    if (ce->sc_table)
        ce->cu->MemFree(ce->sc_table);
    comm->cuda_ce = NULL;
    free(ce);
}

/* The window holding [p, p + bytes), or NULL. */
static const struct plait_window *window_of(const struct plait_cuda_ce *ce, const char *p, size_t bytes)
{
    for (const struct plait_window *w = ce->wins; w; w = w->next)
        if (p >= w->base && bytes <= w->size && (size_t)(p - w->base) <= w->size - bytes)
            return w;
    return NULL;
}

static void log_once(struct plait_comm *comm, struct plait_cuda_ce *ce, const char *why)
{
    int *flag = ce ? &ce->logged : &logged_no_window;
    if (__atomic_exchange_n(flag, 1, __ATOMIC_RELAXED))
        return;
    PLAIT_INFO(PLAIT_SUBSYS_COLL, "rank %d: copy-engine collectives asked for (PLAIT_CE_COLL=1, or CTAs capped at 0) "
               "but not used: %s; the kernel runs", comm->rank, why);
}

static int ce_fail(int r, const char *call, plait_result_t *err)
{
    *err = plait_cu_error(r, "copy-engine collective", call);
    return 1;
}

/* Tells rank q (its flag block) that this rank's `kind` happened. */
static int signal_to(const struct plait_cuda_ce *ce, void *s, plait_cudevptr flag, plait_result_t *err)
{
    int r = ce->cu->StreamWriteValue64(s, flag, 1, PLAIT_CU_STREAM_WRITE_VALUE_DEFAULT);
    return r ? ce_fail(r, "cuStreamWriteValue64", err) : 0;
}

/* Waits on the stream for a flag of this rank's block, then clears it. */
static int wait_and_clear(const struct plait_cuda_ce *ce, void *s, plait_cudevptr flag, plait_result_t *err)
{
    int r = ce->cu->StreamWaitValue64(s, flag, 1, PLAIT_CU_STREAM_WAIT_VALUE_GEQ);
    if (r)
        return ce_fail(r, "cuStreamWaitValue64", err);
    r = ce->cu->StreamWriteValue64(s, flag, 0, PLAIT_CU_STREAM_WRITE_VALUE_DEFAULT);
    return r ? ce_fail(r, "cuStreamWriteValue64", err) : 0;
}

static int copy(const struct plait_cuda_ce *ce, void *s, plait_cudevptr dst, plait_cudevptr src, size_t bytes,
                plait_result_t *err)
{
    if (dst == src)
        return 0;
    int r = ce->cu->MemcpyAsync(dst, src, bytes, s);
    return r ? ce_fail(r, "cuMemcpyAsync", err) : 0;
}

static void issue_allgather(const struct plait_cuda_ce *ce, const struct plait_op *op, const struct plait_window *w,
                            size_t bytes, void *s, plait_result_t *err)
{
    const struct plait_comm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    const uint64_t off = (uint64_t)(op->recvbuff - w->base) + (uint64_t)me * bytes;
    const plait_cudevptr src = (plait_cudevptr)(uintptr_t)op->sendbuff;
    for (int p = 0; p < n; p++)
        if (p != me && signal_to(ce, s, flag_ready(ce->peer_flags[p], me), err))
            return;
    for (int p = 0; p < n; p++)
        if (p != me && wait_and_clear(ce, s, flag_ready(ce->flags, p), err))
            return;
    /* Peers first (in rank order from the next one, spreading the load when
     * every rank pushes at once), then the own block. */
    for (int i = 1; i <= n; i++) {
        const int p = (me + i) % n;
        if (copy(ce, s, w->peer_base[p] + off, src, bytes, err))
            return;
    }
    for (int p = 0; p < n; p++)
        if (p != me && signal_to(ce, s, flag_done(ce->peer_flags[p], n, me), err))
            return;
    for (int p = 0; p < n; p++)
        if (p != me && wait_and_clear(ce, s, flag_done(ce->flags, n, p), err))
            return;
}

static void issue_broadcast(const struct plait_cuda_ce *ce, const struct plait_op *op, const struct plait_window *w,
                            size_t bytes, void *s, plait_result_t *err)
{
    const struct plait_comm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank, root = op->args.root;
    const uint64_t off = (uint64_t)(op->recvbuff - w->base);
    if (me == root) {
        if (copy(ce, s, (plait_cudevptr)(uintptr_t)op->recvbuff, (plait_cudevptr)(uintptr_t)op->sendbuff, bytes, err))
            return;
        for (int p = 0; p < n; p++)
            if (p != me && signal_to(ce, s, flag_ready(ce->peer_flags[p], me), err))
                return;
        for (int p = 0; p < n; p++)
            if (p != me && wait_and_clear(ce, s, flag_done(ce->flags, n, p), err))
                return;
        return;
    }
    if (wait_and_clear(ce, s, flag_ready(ce->flags, root), err))
        return;
    if (copy(ce, s, (plait_cudevptr)(uintptr_t)op->recvbuff, w->peer_base[root] + off, bytes, err))
        return;
    signal_to(ce, s, flag_done(ce->peer_flags[root], n, me), err);
}

int plait_cuda_ce_try(struct plait_op *op, void *stream, plait_result_t *err)
{
    *err = PLAIT_SUCCESS;
    if (op->coll != PLAIT_COLL_ALLGATHER && op->coll != PLAIT_COLL_BROADCAST)
        return 0;
    struct plait_comm *comm = op->comm;
    struct plait_cuda_ce *ce = comm->cuda_ce;
    const int mode = ce ? ce->mode : ce_env_mode();
    /* auto: copy engines when the communicator may use no CTA at all
     * (PLAIT_MAX_CTAS=0, or the config's max_ctas = 0): agreed at init. */
    if (mode == CE_OFF || mode == CE_BAD || (mode == CE_AUTO && plait_cuda_cta_cap(comm) != 0))
        return 0;
    const size_t bytes = (size_t)op->args.count * op->esize;
    if (bytes == 0 || comm->nranks == 1)
        return 0;
    if (!ce || !ce->wins) {
        log_once(comm, ce, "no memory window is registered (plait_comm_window_register, ncclCommWindowRegister)");
        return 0;
    }
    if (!ce->all_local) {
        log_once(comm, ce, "the communicator spans several hosts");
        return 0;
    }
    const size_t total = op->coll == PLAIT_COLL_ALLGATHER ? bytes * (size_t)comm->nranks : bytes;
    const struct plait_window *w = window_of(ce, op->recvbuff, total);
    if (!w) {
        log_once(comm, ce, "recvbuff does not lie in a registered window");
        return 0;
    }
    if (op->coll == PLAIT_COLL_ALLGATHER)
        issue_allgather(ce, op, w, bytes, stream, err);
    else
        issue_broadcast(ce, op, w, bytes, stream, err);
    /* The stream records that this one is done, so that the proxy thread
     * watches the peers meanwhile (their death would leave the stream's waits
     * blocked forever). Not in a capture: a replay would write a stale value. */
    const uint64_t *word = NULL;
    const plait_cudevptr dev = plait_cuda_ce_done_word(comm, &word);
    int capture = PLAIT_CU_STREAM_CAPTURE_STATUS_NONE;
    if (*err == PLAIT_SUCCESS && dev && ce->cu->StreamIsCapturing(stream, &capture) == 0 &&
        capture == PLAIT_CU_STREAM_CAPTURE_STATUS_NONE) {
        const int r = ce->cu->StreamWriteValue64(stream, dev, ce->seq + 1, PLAIT_CU_STREAM_WRITE_VALUE_DEFAULT);
        if (r) {
            ce_fail(r, "cuStreamWriteValue64 (done word)", err);
            return 1;
        }
        ce->seq++;
        plait_cuda_proxy_kick_ce(comm, ce->seq);
    }
    return 1;
}

int plait_cuda_ce_release_waits(struct plait_comm *comm, void *stream)
{
    struct plait_cuda_ce *ce = comm->cuda_ce;
    if (!ce || !ce->flags)
        return 0;
    const int n = comm->nranks;
    for (int p = 0; p < n; p++) {
        if (p == comm->rank)
            continue;
        int r = ce->cu->StreamWriteValue64(stream, flag_ready(ce->flags, p), 1, PLAIT_CU_STREAM_WRITE_VALUE_DEFAULT);
        if (!r)
            r = ce->cu->StreamWriteValue64(stream, flag_done(ce->flags, n, p), 1, PLAIT_CU_STREAM_WRITE_VALUE_DEFAULT);
        if (r)
            return r;
    }
    return 0;
}
