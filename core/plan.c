/* The planning stage (plan.h): one function decides, once per call, how the
 * call runs; the execution stage (enqueue.c, then fastpath.c, exec.c or
 * core/cuda/) only follows the plan. */
#define _GNU_SOURCE
#include "core/plan.h"

#include "algorithms/algorithms.h"
#include "algorithms/stepper.h"
#include "base/log.h"
#include "core/comm.h"
#include "core/cuda/cuda.h"
#include "core/tuner_comm.h"

/* The executor, from the buffers this rank uses (the root's own buffer for a
 * rooted call's non-root ranks is not used). Device or managed memory: CUDA,
 * on the wrapped CUDA stream (NULL = CUDA's default stream), queued on no
 * host stream. Host or registered memory: CPU; on a CUDA-backed stream the
 * CUDA stream is synchronised now (work queued on it before may have written
 * the buffers) and the call runs as on the NULL stream, complete when it
 * returns (or at plait_group_end). Also reports a kernel error found since
 * the last call. */
static plait_result_t plan_executor(struct plait_comm *comm, const struct plait_call *call, struct plait_plan *plan)
{
    const char *fn = call->name;
    const int coll = call->coll;
    plan->executor = PLAIT_EXEC_CPU;
    plan->stream = call->stream;
    plan->cu_stream = NULL;
    void *cs = NULL;
    const int is_cuda_stream = plait_stream_cuda(call->stream, &cs);
    if (comm->cuda && plait_cuda_poll_error(comm)) {
        char why[sizeof(comm->async_msg)];
        plait_comm_async_msg(comm, why, sizeof(why));
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: rank %d: the communicator is in error after: %s", fn,
                           comm->rank, why);
    }
    const void *s = call->sendbuff, *r = call->recvbuff;
    const int is_root = comm->rank == call->root;
    if (coll == PLAIT_COLL_SEND)
        r = NULL;
    if (coll == PLAIT_COLL_RECV)
        s = NULL;
    if (call->count == 0 || coll == PLAIT_COLL_BARRIER)
        s = r = NULL;
    if ((coll == PLAIT_COLL_BROADCAST || coll == PLAIT_COLL_SCATTER) && !is_root)
        s = NULL;
    if ((coll == PLAIT_COLL_REDUCE || coll == PLAIT_COLL_GATHER) && !is_root)
        r = NULL;
    plait_result_t err;
    int dev = plait_cuda_route(comm, fn, s, r, &err);
    if (dev < 0)
        return err;
    if (!s && !r && is_cuda_stream && comm->cuda && coll != PLAIT_COLL_BARRIER)
        dev = 1;
    if (dev) {
        if (call->stream && !is_cuda_stream)
            return plait_error(PLAIT_ERR_INVALID_USAGE,
                               "%s: device buffers on a host stream (plait_stream_create): pass a CUDA stream "
                               "(plait_stream_from_cuda) or NULL (CUDA's default stream)",
                               fn);
        plan->executor = PLAIT_EXEC_CUDA;
        plan->cu_stream = cs;
        plan->stream = NULL;
        return PLAIT_SUCCESS;
    }
    if (is_cuda_stream) {
        plait_result_t res = plait_stream_synchronize(call->stream);
        if (res)
            return plait_error_context(res, "%s: host buffers on a CUDA stream (synchronising it first)", fn);
        plan->stream = NULL;
    }
    return PLAIT_SUCCESS;
}

/* Elements per step per rank-chunk, from a chunk in bytes (0: the configured
 * chunk). A ring step both receives and sends, one slot each per piece: if a
 * step's chunk could fill the whole FIFO, two neighbours could each hold
 * every slot of the other and wait forever. A chunk of at most half the FIFO
 * leaves credit for the next step to start (NCCL keeps the same margin). At
 * least one alignment unit (16 bytes of elements). */
static uint64_t chunk_elems(const struct plait_comm *comm, size_t esize, uint64_t chunk_bytes)
{
    if (chunk_bytes == 0)
        chunk_bytes = comm->set.chunk_bytes;
    const uint64_t half_fifo = (uint64_t)(comm->set.nslots / 2) * comm->set.slot_bytes;
    if (chunk_bytes > half_fifo)
        chunk_bytes = half_fifo;
    const uint64_t align = 16 / esize;
    const uint64_t chunk = chunk_bytes / esize / align * align;
    return chunk > align ? chunk : align;
}

plait_result_t plait_plan_make(struct plait_comm *comm, const struct plait_call *call, struct plait_plan *plan_out)
{
    struct plait_plan plan;
    const int coll = call->coll;
    const size_t esize = plait_dtype_size(call->dtype);
    plait_result_t s = plan_executor(comm, call, &plan);
    if (s)
        return s;
    plan.run_now = 0;
    plan.algo = PLAIT_ALGO_AUTO;
    plan.wire = PLAIT_WIRE_SIMPLE;
    plan.bytes = 0;
    if (coll == PLAIT_COLL_SEND || coll == PLAIT_COLL_RECV) {
        plan.path = PLAIT_PATH_P2P;
        plan.nchannels = comm->nchannels;
        plan.chunk_elems = chunk_elems(comm, esize, 0);
        *plan_out = plan;
        return PLAIT_SUCCESS;
    }
    /* The tuner (core/tuner_comm.c), once: a pure function of the call and of
     * what every rank holds alike, so every rank takes the same path and
     * schedule. Bytes are what each rank sends each peer on the small-message
     * path: count is per rank for allgather, reducescatter and alltoall. Its
     * small-message choice (PLAIT_MPROTO_LL) is made only where that path
     * exists for the call (plait_fast_eligible's answer at init, and the size
     * limit), so it needs no second look here. */
    struct plait_tune_choice choice;
    if ((s = plait_tuner_choose(comm, coll, (uint64_t)call->count * esize, (int)esize, &choice)))
        return s; /* the tuner's message names the rank and the call */
    /* The first call of a size bucket runs the model (milliseconds, holding
     * the communicator busy): a plait_comm_abort from another thread may have
     * waited for it and released the boxes and connections meanwhile. The
     * flag was raised before the abort waited, so it shows here. */
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: rank %d: the communicator was aborted", call->name,
                           comm->rank);
    /* The tuner offers the small-message path only where plait_fast_eligible
     * holds (core/tuner_comm.c: small_for at init, small_here per call), so it
     * is not asked again. In the one race where that changed since (an abort
     * on another thread tore the boxes down while the model ran), the flag
     * read just above, or plait_fast_run's plait_op_enter, refuses the call
     * before anything touches comm->fast: keep that order. */
    const int small = choice.proto == PLAIT_MPROTO_LL;
    if (small && plan.executor == PLAIT_EXEC_CPU) {
        plan.path = PLAIT_PATH_SMALL;
        plan.nchannels = 1;
        plan.bytes = coll == PLAIT_COLL_BARRIER ? 0 : call->count * esize; /* a barrier's boxes carry tags only */
        /* At once, from an op on the stack: no allocation, no executor. A
         * queued call becomes a one-task op in lane 0 that the group, stream
         * or executor runs like any other, so the path depends only on the
         * call's arguments, the same on every rank. */
        plan.run_now = !plan.stream && comm->blocking && plait_group_depth() == 0 &&
                       !__atomic_load_n(&comm->inflight, __ATOMIC_ACQUIRE);
        plan.chunk_elems = plan.run_now ? 0 : chunk_elems(comm, esize, 0);
        *plan_out = plan;
        return PLAIT_SUCCESS;
    }
    plan.path = PLAIT_PATH_SCHEDULE;
    /* Device ops never take the small-message path (its boxes are host
     * memory): where the tuner chose it, the kernel runs the default rule's
     * schedule on all channels with its LL protocol, when no rank has a
     * proxied connection (those FIFOs carry no LL lines). An algorithm that
     * cannot run the call is not reached with a consistent tuner: the default
     * rule keeps it safe. */
    if (small || choice.algo == PLAIT_ALGO_AUTO || !plait_algorithms[choice.algo].supports(coll, comm->nranks)) {
        choice.algo = (uint8_t)plait_algo_select(coll, (uint64_t)call->count * esize, comm->nranks, comm->nhosts,
                                                 comm->set.algo)->id;
        choice.nchannels = (uint8_t)comm->nchannels;
        choice.chunk_bytes = 0; /* the configured chunk */
    }
    if (small && plait_cuda_ll_ok(comm))
        plan.wire = PLAIT_WIRE_LL;
    plan.algo = choice.algo;
    /* 1..comm->nchannels by plait_tuner_choose's contract; kept in range here
     * as well (one compare), so a tuner bug cannot make an op of no task or of
     * tasks past the connection classes. */
    int nch = choice.nchannels >= 1 && choice.nchannels <= comm->nchannels ? choice.nchannels : comm->nchannels;
    /* The CTA cap (part of the comm's nchannels already when positive): 0
     * leaves device collectives one CTA (copy engines take allgather and
     * broadcast where they can, core/cuda/ce.c). */
    if (plan.executor == PLAIT_EXEC_CUDA && plait_cuda_cta_cap(comm) >= 0 && nch > plait_cuda_cta_cap(comm))
        nch = plait_cuda_cta_cap(comm) > 0 ? plait_cuda_cta_cap(comm) : 1;
    plan.nchannels = nch;
    plan.chunk_elems = chunk_elems(comm, esize, choice.chunk_bytes);
    *plan_out = plan;
    return PLAIT_SUCCESS;
}
