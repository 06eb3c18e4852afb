/* The CUDA backend's launches: where a call runs (memory kinds), launches of
 * device operations on the caller's CUDA streams (plans from
 * core/cuda/plan_cache.c), and the errors the kernel reports.
 *
 * Hot path (a launch of a shape seen before): no allocation, no lock, no
 * logging and no host synchronisation; the driver calls are
 * cuStreamIsCapturing, possibly cuStreamWaitEvent (another stream than the
 * communicator's previous launch), cuLaunchKernel and cuEventRecord. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/dev_comm.h"
#include "core/cuda/cuda.h"
#include "core/progress.h"
#include "base/log.h"
#include "base/util.h"

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
        plait_comm_mark_failed_msg(comm, res, msg);
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
    plait_result_t s = plait_cuda_plan_get(comm, cc, ops, nops, &pl);
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
        /* Either the abort sees us busy and waits before freeing, or we see
         * its flag (plait_op_enter). */
        if (plait_op_enter(comm) || !cc) {
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
                plait_comm_mark_failed(comm, status);
            }
        }
        plait_op_leave(comm);
        plait_op_free_list(mine);
    }
    plait_op_free_list(ops);
    return status;
}
