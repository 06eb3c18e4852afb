/* The collective and point-to-point entry points: validate the arguments, build
 * the operation (its tasks and their schedule), and hand it to the group. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "core/comm.h"
#include "core/cuda/cuda.h"
#include "core/fastpath.h"
#include "base/log.h"
#include "algorithms/stepper.h"
#include "core/tuner_comm.h"
#include "base/util.h"

static plait_result_t check_type(int dtype, const char *fn)
{
    if (dtype < 0 || dtype >= PLAIT_NUM_TYPES)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: datatype %d is invalid (0..%d)", fn, dtype,
                           PLAIT_NUM_TYPES - 1);
    return PLAIT_SUCCESS;
}

static plait_result_t check_buf(const void *p, size_t count, const char *what, const char *fn)
{
    if (!p && count > 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: %s is NULL with count %zu", fn, what, count);
    return PLAIT_SUCCESS;
}

/* Where a buffer must end. On these 64-bit Linux targets user space is the
 * lower half of the address space (x86-64: below 2^47, or 2^56 with 5-level
 * paging; AArch64 below 2^52; POWER, RISC-V and LoongArch below 2^63), and
 * CUDA's unified addresses (device memory) are user addresses too: a range
 * that reaches past 2^63 is no buffer. Elsewhere only a range that wraps
 * past the end of the address space is refused. */
#if UINTPTR_MAX > 0xffffffffu && (defined(__x86_64__) || defined(__aarch64__) || defined(__powerpc64__) ||            \
                                  (defined(__riscv) && __riscv_xlen == 64) || defined(__loongarch64))
#define BUF_END ((uintptr_t)1 << 63)
#else
#define BUF_END UINTPTR_MAX
#endif

/* The most bytes a buffer can have: it ends by BUF_END and starts above the
 * first page (never mapped); and pointer differences within it fit. */
#define BUF_MAX_BYTES                                                                                              \
    ((size_t)(BUF_END - 4096) < (size_t)PTRDIFF_MAX ? (size_t)(BUF_END - 4096) : (size_t)PTRDIFF_MAX)

/* count * esize * mult (mult: the ranks' blocks of the call's largest
 * buffer) must fit in size_t and be a size some buffer can have. It depends
 * on the arguments every rank passes alike, so every rank refuses the same
 * call: a rank whose own buffers would pass cannot start a collective that
 * another rank (a root whose buffer is nranks blocks) refuses. */
static plait_result_t check_size(size_t count, size_t esize, size_t mult, const char *fn)
{
    size_t a, b;
    if (plait_mul_overflows(count, esize, &a) || plait_mul_overflows(a, mult, &b))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: count %zu x %zu bytes x %zu ranks overflows size_t", fn,
                           count, esize, mult);
    if (b > BUF_MAX_BYTES)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "%s: count %zu x %zu bytes x %zu ranks is %zu bytes: no buffer is that large (at most %zu)",
                           fn, count, esize, mult, b, (size_t)BUF_MAX_BYTES);
    return PLAIT_SUCCESS;
}

/* A buffer the call uses, of count * esize * blocks bytes (blocks: the
 * ranks' blocks of a gathered or scattered buffer), after check_size
 * bounded that product by BUF_MAX_BYTES: [p, p + bytes) must lie in the
 * address space, or the count cannot be this buffer's (the reduction would
 * run off the end of memory). */
static plait_result_t check_range(const void *p, size_t count, size_t esize, size_t blocks, const char *what,
                                  const char *fn)
{
    if (!p || count == 0)
        return PLAIT_SUCCESS;
    const size_t bytes = count * esize * blocks;
    if ((uintptr_t)p > BUF_END - bytes)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "%s: count %zu (%zu bytes of %s %p) runs past the end of the address space: no buffer is "
                           "that large",
                           fn, count, bytes, what, p);
    return PLAIT_SUCCESS;
}

static plait_result_t check_rank(const struct plait_comm *comm, int r, const char *what, const char *fn)
{
    if (r < 0 || r >= comm->nranks)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: %s %d is out of range [0, %d)", fn, what, r, comm->nranks);
    return PLAIT_SUCCESS;
}

/* Resolves the op (including premultiplied sums) into the executor's form. */
static plait_result_t make_red(struct plait_comm *comm, int dtype, int op, struct plait_red *red, const char *fn)
{
    if (op >= 0 && op < PLAIT_NUM_OPS)
        return plait_red_init(red, dtype, op, NULL, (uint64_t)comm->nranks);
    int i = op - PLAIT_NUM_OPS;
    if (i < 0 || i >= PLAIT_MAX_PREMUL_OPS || !comm->premul[i].in_use)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "%s: op %d is neither a built-in op (0..%d) nor a premulsum op created on this comm", fn, op,
                           PLAIT_NUM_OPS - 1);
    const struct plait_premul_op *p = &comm->premul[i];
    if (p->dtype != dtype)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: premulsum op %d was created for %s, used with %s", fn, op,
                           plait_dtype_name(p->dtype), plait_dtype_name(dtype));
    uint64_t bits = p->scalar_bits;
    if (p->residence == PLAIT_SCALAR_DEVICE) /* host memory here: read it now */
        memcpy(&bits, p->scalar_ptr, plait_dtype_size(dtype));
    return plait_red_init(red, dtype, PLAIT_RED_PREMULSUM, &bits, (uint64_t)comm->nranks);
}

static struct plait_op *op_new(struct plait_comm *comm, int coll, const char *name, int ntasks)
{
    struct plait_op *op = calloc(1, sizeof(*op) + sizeof(struct plait_task) * (size_t)ntasks);
    if (!op)
        return NULL;
    op->comm = comm;
    op->coll = coll;
    op->name = name;
    op->tasks = (struct plait_task *)(op + 1);
    op->ntasks = 0;
    return op;
}

/* SCRATCH buffers: an op holds one only while it executes (plait_exec_run
 * acquires and releases it), and the communicator keeps the last one released,
 * so that a loop of calls does not map and fault in fresh pages each time (a
 * malloc of megabytes is an mmap in glibc, and its free an munmap). Acquiring at
 * enqueue instead would defeat the cache for calls queued ahead on a stream. A
 * buffer starts with a header holding its capacity; op->scratch points after
 * it. */
#define SCRATCH_HDR 64
#define SCRATCH_KEEP_MAX ((size_t)256 << 20) /* larger ones are not kept */

static char *scratch_acquire(struct plait_comm *comm, size_t bytes)
{
    char *b = __atomic_exchange_n(&comm->scratch_cache, NULL, __ATOMIC_ACQ_REL);
    if (b && *(size_t *)b >= bytes)
        return b + SCRATCH_HDR;
    free(b);
    if (bytes > SIZE_MAX - SCRATCH_HDR)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, SCRATCH_HDR, bytes + SCRATCH_HDR))
        return NULL;
    *(size_t *)p = bytes;
    return (char *)p + SCRATCH_HDR;
}

plait_result_t plait_op_acquire_scratch(struct plait_op *op)
{
    if (!op->scratch_bytes || op->scratch)
        return PLAIT_SUCCESS;
    if (!(op->scratch = scratch_acquire(op->comm, op->scratch_bytes)))
        return plait_error(PLAIT_ERR_SYSTEM, "%s (operation #%llu) on rank %d: out of memory for %zu bytes of scratch",
                           op->name, (unsigned long long)op->seq, op->comm->rank, op->scratch_bytes);
    return PLAIT_SUCCESS;
}

void plait_op_release_scratch(struct plait_op *op)
{
    if (!op->scratch)
        return;
    char *b = op->scratch - SCRATCH_HDR;
    op->scratch = NULL;
    if (*(size_t *)b > SCRATCH_KEEP_MAX) {
        free(b);
        return;
    }
    free(__atomic_exchange_n(&op->comm->scratch_cache, b, __ATOMIC_ACQ_REL));
}

void plait_op_free_list(struct plait_op *ops)
{
    while (ops) {
        struct plait_op *next = ops->next;
        /* plait_exec_run gave it back already; never touch the communicator
         * here (it may be gone once a stream worker dropped its count) */
        if (ops->scratch)
            free(ops->scratch - SCRATCH_HDR);
        free(ops);
        ops = next;
    }
}

/* nchannels: the channels the call uses (tasks 0..nchannels-1, the tuner's
 * choice); chunk_bytes: bytes per step per rank-chunk before the clamp below. */
static void sched_args_tuned(struct plait_op *op, size_t count, int root, int nchannels, uint64_t chunk_bytes)
{
    struct plait_comm *comm = op->comm;
    struct plait_sched_args *a = &op->args;
    a->coll = op->coll;
    a->nranks = comm->nranks;
    a->rank = comm->rank;
    a->root = root;
    a->count = count;
    a->nchannels = nchannels >= 1 && nchannels <= comm->nchannels ? nchannels : comm->nchannels;
    a->align_elems = 16 / op->esize;
    a->radix = comm->set.tree_radix;
    a->nhosts = comm->nhosts;
    a->host_of = comm->host_of;
    a->local_of = comm->host_of + comm->nranks;
    a->order = comm->ring_order; /* channel search's rings (comm_topo.c), NULL = rank order */
    a->pos = comm->ring_pos;
    /* A ring step both receives and sends, one slot each per piece: if a step's
     * chunk could fill the whole FIFO, two neighbours could each hold every slot
     * of the other and wait forever. A chunk of at most half the FIFO leaves
     * credit for the next step to start (NCCL keeps the same margin). */
    if (chunk_bytes == 0)
        chunk_bytes = comm->set.chunk_bytes;
    const uint64_t half_fifo = (uint64_t)(comm->set.nslots / 2) * comm->set.slot_bytes;
    if (chunk_bytes > half_fifo)
        chunk_bytes = half_fifo;
    uint64_t chunk = chunk_bytes / op->esize;
    chunk = chunk / a->align_elems * a->align_elems;
    a->chunk_elems = chunk > a->align_elems ? chunk : a->align_elems;
}

static void sched_args(struct plait_op *op, size_t count, int root)
{
    sched_args_tuned(op, count, root, op->comm->nchannels, op->comm->set.chunk_bytes);
}

/* A collective on the small-message path (fastpath.c). With a NULL stream,
 * outside a group, on a blocking communicator with nothing queued on a stream,
 * it runs at once on the calling thread from an op on the stack: no
 * allocation, no executor. Otherwise it becomes a one-task op in lane 0 that
 * the group, stream or executor runs like any other, so that the choice of
 * path depends only on the call's arguments, the same on every rank. */
static plait_result_t fast_op(struct plait_comm *comm, int coll, const char *name, const void *sendbuff,
                              void *recvbuff, size_t count, int dtype, const struct plait_red *red, int root,
                              size_t bytes, plait_stream_t stream)
{
    const int redop = red ? red->op : PLAIT_SUM;
    if (!stream && comm->blocking && plait_group_depth() == 0 && !__atomic_load_n(&comm->inflight, __ATOMIC_ACQUIRE)) {
        struct plait_op op;
        op.comm = comm;
        op.coll = coll;
        op.name = name;
        op.sendbuff = sendbuff;
        op.recvbuff = recvbuff;
        op.esize = plait_dtype_size(dtype);
        if (red)
            op.red = *red;
        op.args.count = count;
        op.args.root = root;
        op.seq = ++comm->seq;
        op.coll_seq = ++comm->coll_seq;
        plait_fast_prepare(&op, bytes, dtype, redop);
        return plait_fast_run(&op);
    }
    struct plait_op *op = op_new(comm, coll, name, 1);
    if (!op)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", name);
    op->sendbuff = sendbuff;
    op->recvbuff = recvbuff;
    op->esize = plait_dtype_size(dtype);
    if (red)
        op->red = *red;
    sched_args(op, count, root);
    op->coll_seq = ++comm->coll_seq;
    plait_fast_prepare(op, bytes, dtype, redop);
    struct plait_task *t = &op->tasks[op->ntasks++];
    t->op = op;
    t->cls = 0;
    t->lane = 0;
    t->is_fast = 1;
    return plait_enqueue(op, stream);
}

/* Which backend runs a call (core/cuda/launch.c), from the buffers this rank
 * uses: device or managed memory -> the CUDA backend (*on_device = 1, on
 * *cu_stream: the wrapped CUDA stream, NULL = CUDA's default stream; *stream
 * becomes NULL); host or registered memory -> the CPU backend. Host buffers
 * on a CUDA-backed stream: the CUDA stream is synchronised now (so work
 * queued on it before, which may have written them, is done) and the call
 * runs as on the NULL stream, complete when it returns (or at
 * plait_group_end). A call with no buffer to classify (count 0) follows its
 * stream. Also reports a kernel error found since the last call. */
static plait_result_t route_call(struct plait_comm *comm, int coll, const char *fn, const void *sendbuff,
                                 const void *recvbuff, size_t count, int root, plait_stream_t *stream, int *on_device,
                                 void **cu_stream)
{
    *on_device = 0;
    *cu_stream = NULL;
    void *cs = NULL;
    const int is_cuda_stream = plait_stream_cuda(*stream, &cs);
    if (comm->cuda && plait_cuda_poll_error(comm)) {
        char why[sizeof(comm->async_msg)];
        plait_comm_async_msg(comm, why, sizeof(why));
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: rank %d: the communicator is in error after: %s", fn,
                           comm->rank, why);
    }
    const void *s = sendbuff, *r = recvbuff;
    const int is_root = comm->rank == root;
    if (count == 0 || coll == PLAIT_COLL_BARRIER)
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
        if (*stream && !is_cuda_stream)
            return plait_error(PLAIT_ERR_INVALID_USAGE,
                               "%s: device buffers on a host stream (plait_stream_create): pass a CUDA stream "
                               "(plait_stream_from_cuda) or NULL (CUDA's default stream)",
                               fn);
        *on_device = 1;
        *cu_stream = cs;
        *stream = NULL;
        return PLAIT_SUCCESS;
    }
    if (is_cuda_stream) {
        plait_result_t res = plait_stream_synchronize(*stream);
        if (res)
            return plait_error_context(res, "%s: host buffers on a CUDA stream (synchronising it first)", fn);
        *stream = NULL;
    }
    return PLAIT_SUCCESS;
}

static plait_result_t sched_op(struct plait_comm *comm, int coll, const char *name, const void *sendbuff,
                              void *recvbuff, size_t count, int dtype, const struct plait_red *red, int root,
                              plait_stream_t stream)
{
    const size_t esize = plait_dtype_size(dtype);
    int on_device;
    void *cu_stream;
    plait_result_t rres = route_call(comm, coll, name, sendbuff, recvbuff, count, root, &stream, &on_device, &cu_stream);
    if (rres)
        return rres;
    /* The tuner (tuner.c): a pure function of the call and of what every rank
     * holds alike, so every rank takes the same path and schedule. Bytes are
     * what each rank sends each peer on the small-message path: count is per
     * rank for allgather, reducescatter and alltoall. */
    struct plait_tune_choice choice;
    plait_result_t tres = plait_tuner_choose(comm, coll, (uint64_t)count * esize, (int)esize, &choice);
    if (tres)
        return tres; /* the tuner's message names the rank and the call */
    /* The first call of a size bucket runs the model (milliseconds, holding
     * the communicator busy): a plait_comm_abort from another thread may have
     * waited for it and released the boxes and connections meanwhile. The
     * flag was raised before the abort waited, so it shows here. */
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: rank %d: the communicator was aborted", name, comm->rank);
    /* Device ops never take the small-message path (its boxes are host
     * memory); the tuner's LL becomes the kernel's LL protocol when no rank
     * has a proxied connection (its FIFOs carry no LL lines). */
    const int fast = !on_device && choice.proto == PLAIT_MPROTO_LL &&
                     plait_fast_eligible(comm, coll, coll == PLAIT_COLL_BARRIER ? 0 : count * esize);
    const int dev_proto = on_device && choice.proto == PLAIT_MPROTO_LL && plait_cuda_ll_ok(comm) ? PLAIT_WIRE_LL
                                                                                                 : PLAIT_WIRE_SIMPLE;
    if (fast && coll == PLAIT_COLL_BARRIER)
        return fast_op(comm, coll, name, NULL, NULL, 0, PLAIT_UINT8, NULL, 0, 0, stream); /* tags only */
    if (fast)
        return fast_op(comm, coll, name, sendbuff, recvbuff, count, dtype, red, root, count * esize, stream);
    if (choice.proto == PLAIT_MPROTO_LL || choice.algo == PLAIT_ALGO_AUTO ||
        !plait_algorithms[choice.algo].supports(coll, comm->nranks)) {
        /* not reached with a consistent tuner; the default rule keeps it safe */
        choice.algo = (uint8_t)plait_algo_select(coll, (uint64_t)count * esize, comm->nranks, comm->nhosts,
                                                 comm->set.algo)->id;
        choice.nchannels = (uint8_t)comm->nchannels;
        choice.chunk_bytes = 0;
    }
    int nch = choice.nchannels >= 1 && choice.nchannels <= comm->nchannels ? choice.nchannels : comm->nchannels;
    /* The CTA cap (part of the comm's nchannels already when positive): 0
     * leaves device collectives one CTA (copy engines take allgather and
     * broadcast where they can, core/cuda/launch.c). */
    if (on_device && plait_cuda_cta_cap(comm) >= 0 && nch > plait_cuda_cta_cap(comm))
        nch = plait_cuda_cta_cap(comm) > 0 ? plait_cuda_cta_cap(comm) : 1;
    struct plait_op *op = op_new(comm, coll, name, nch);
    if (!op)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", name);
    op->coll_seq = ++comm->coll_seq;
    op->fast_seq = comm->fast_seq + 1; /* for plait_fast_check_mismatch */
    op->on_device = on_device;
    op->cu_stream = cu_stream;
    op->dev_proto = dev_proto;
    op->sendbuff = sendbuff;
    op->recvbuff = recvbuff;
    op->esize = plait_dtype_size(dtype);
    if (red)
        op->red = *red;
    else
        plait_red_init(&op->red, dtype, PLAIT_SUM, NULL, (uint64_t)comm->nranks);
    sched_args_tuned(op, count, root, nch, choice.chunk_bytes);
    const struct plait_algorithm *algo = &plait_algorithms[choice.algo];
    if (algo->scratch) {
        const uint64_t elems = algo->scratch(&op->args);
        size_t sb;
        if (plait_mul_overflows((size_t)elems, op->esize, &sb) || elems > SIZE_MAX) {
            free(op);
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: %s would need %llu elements of scratch", name,
                               algo->name, (unsigned long long)elems);
        }
        op->scratch_bytes = sb; /* acquired when it runs (plait_exec_run) */
    }
    for (int c = 0; c < nch; c++) {
        struct plait_task *t = &op->tasks[op->ntasks++];
        t->op = op;
        t->cls = c;
        t->lane = c;
        t->gen = algo->step;
    }
    return plait_enqueue(op, stream);
}

/* A point-to-point task (send or recv): one step over the point-to-point class. */
static void p2p_task(struct plait_op *op, int kind, int peer, uint64_t off, uint64_t count)
{
    struct plait_comm *comm = op->comm;
    struct plait_task *t = &op->tasks[op->ntasks++];
    t->op = op;
    t->cls = comm->ncls - 1;
    t->gen = NULL;
    memset(&t->step, 0, sizeof(t->step));
    t->step.kind = (uint8_t)kind;
    t->step.src_buf = PLAIT_BUF_INPUT;
    t->step.dst_buf = PLAIT_BUF_OUTPUT;
    t->step.count = count;
    if (kind == PLAIT_STEP_SEND) {
        t->lane = plait_lane_send(comm, peer);
        t->step.send_peer = peer;
        t->step.src_off = off;
    } else { /* PLAIT_STEP_RECV */
        t->lane = plait_lane_recv(comm, peer);
        t->step.recv_peer = peer;
        t->step.dst_off = off;
    }
}

/* ------------------------------------------------------------ collectives */

plait_result_t plait_allreduce(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype,
                               plait_redop_t op, plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_allreduce";
    plait_result_t s;
    struct plait_red red;
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_buf(sendbuff, count, "sendbuff", fn)) || (s = check_buf(recvbuff, count, "recvbuff", fn)) ||
        (s = check_size(count, plait_dtype_size(datatype), 1, fn)) ||
        (s = check_range(sendbuff, count, plait_dtype_size(datatype), 1, "sendbuff", fn)) ||
        (s = check_range(recvbuff, count, plait_dtype_size(datatype), 1, "recvbuff", fn)) ||
        (s = make_red(comm, datatype, op, &red, fn)))
        return s;
    return sched_op(comm, PLAIT_COLL_ALLREDUCE, fn, sendbuff, recvbuff, count, datatype, &red, 0, stream);
}

plait_result_t plait_broadcast(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype,
                               int root, plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_broadcast";
    plait_result_t s;
    const size_t es = plait_dtype_size(datatype);
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_rank(comm, root, "root", fn)) || (s = check_buf(recvbuff, count, "recvbuff", fn)) ||
        (s = check_size(count, es, 1, fn)) || (s = check_range(recvbuff, count, es, 1, "recvbuff", fn)))
        return s;
    if (comm->rank == root && ((s = check_buf(sendbuff, count, "sendbuff (on the root)", fn)) ||
                               (s = check_range(sendbuff, count, es, 1, "sendbuff", fn))))
        return s;
    return sched_op(comm, PLAIT_COLL_BROADCAST, fn, sendbuff, recvbuff, count, datatype, NULL, root, stream);
}

plait_result_t plait_reduce(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype,
                            plait_redop_t op, int root, plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_reduce";
    plait_result_t s;
    struct plait_red red;
    const size_t es = plait_dtype_size(datatype);
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_rank(comm, root, "root", fn)) || (s = check_buf(sendbuff, count, "sendbuff", fn)) ||
        (s = check_size(count, es, 1, fn)) || (s = check_range(sendbuff, count, es, 1, "sendbuff", fn)) ||
        (s = make_red(comm, datatype, op, &red, fn)))
        return s;
    if (comm->rank == root && ((s = check_buf(recvbuff, count, "recvbuff (on the root)", fn)) ||
                               (s = check_range(recvbuff, count, es, 1, "recvbuff", fn))))
        return s;
    return sched_op(comm, PLAIT_COLL_REDUCE, fn, sendbuff, recvbuff, count, datatype, &red, root, stream);
}

plait_result_t plait_allgather(const void *sendbuff, void *recvbuff, size_t sendcount, plait_datatype_t datatype,
                               plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_allgather";
    plait_result_t s;
    const size_t es = plait_dtype_size(datatype);
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_buf(sendbuff, sendcount, "sendbuff", fn)) || (s = check_buf(recvbuff, sendcount, "recvbuff", fn)) ||
        (s = check_size(sendcount, es, (size_t)comm->nranks, fn)) ||
        (s = check_range(sendbuff, sendcount, es, 1, "sendbuff", fn)) ||
        (s = check_range(recvbuff, sendcount, es, (size_t)comm->nranks, "recvbuff", fn)))
        return s;
    return sched_op(comm, PLAIT_COLL_ALLGATHER, fn, sendbuff, recvbuff, sendcount, datatype, NULL, 0, stream);
}

plait_result_t plait_reducescatter(const void *sendbuff, void *recvbuff, size_t recvcount, plait_datatype_t datatype,
                                   plait_redop_t op, plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_reducescatter";
    plait_result_t s;
    struct plait_red red;
    const size_t es = plait_dtype_size(datatype);
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_buf(sendbuff, recvcount, "sendbuff", fn)) || (s = check_buf(recvbuff, recvcount, "recvbuff", fn)) ||
        (s = check_size(recvcount, es, (size_t)comm->nranks, fn)) ||
        (s = check_range(sendbuff, recvcount, es, (size_t)comm->nranks, "sendbuff", fn)) ||
        (s = check_range(recvbuff, recvcount, es, 1, "recvbuff", fn)) || (s = make_red(comm, datatype, op, &red, fn)))
        return s;
    return sched_op(comm, PLAIT_COLL_REDUCESCATTER, fn, sendbuff, recvbuff, recvcount, datatype, &red, 0, stream);
}

plait_result_t plait_barrier(plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_barrier";
    plait_result_t s;
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)))
        return s;
    /* One byte that every rank's completion depends on, from every rank:
     * what a barrier promises (the dissemination pattern on one host, a
     * one-byte ring allreduce across hosts; PLAIT_ALGO=barrier:X forces one). */
    return sched_op(comm, PLAIT_COLL_BARRIER, fn, comm->barrier_buf[0], comm->barrier_buf[1], 1, PLAIT_UINT8, NULL, 0,
                   stream);
}

/* ------------------------------------------------------------ alltoall, gather, scatter */

plait_result_t plait_alltoall(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype,
                              plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_alltoall";
    plait_result_t s;
    const size_t es = plait_dtype_size(datatype);
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_buf(sendbuff, count, "sendbuff", fn)) || (s = check_buf(recvbuff, count, "recvbuff", fn)) ||
        (s = check_size(count, es, (size_t)comm->nranks, fn)) ||
        (s = check_range(sendbuff, count, es, (size_t)comm->nranks, "sendbuff", fn)) ||
        (s = check_range(recvbuff, count, es, (size_t)comm->nranks, "recvbuff", fn)))
        return s;
    if (count > 0 && sendbuff == recvbuff)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: in-place alltoall is not supported (sendbuff == recvbuff)",
                           fn);
    return sched_op(comm, PLAIT_COLL_ALLTOALL, fn, sendbuff, recvbuff, count, datatype, NULL, 0, stream);
}

plait_result_t plait_gather(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype, int root,
                            plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_gather";
    plait_result_t s;
    const size_t es = plait_dtype_size(datatype);
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_rank(comm, root, "root", fn)) || (s = check_buf(sendbuff, count, "sendbuff", fn)) ||
        (s = check_size(count, es, (size_t)comm->nranks, fn)) || (s = check_range(sendbuff, count, es, 1, "sendbuff", fn)))
        return s;
    if (comm->rank == root && ((s = check_buf(recvbuff, count, "recvbuff (on the root)", fn)) ||
                               (s = check_range(recvbuff, count, es, (size_t)comm->nranks, "recvbuff", fn))))
        return s;
    return sched_op(comm, PLAIT_COLL_GATHER, fn, sendbuff, recvbuff, count, datatype, NULL, root, stream);
}

plait_result_t plait_scatter(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype, int root,
                             plait_comm_t comm, plait_stream_t stream)
{
    static const char fn[] = "plait_scatter";
    plait_result_t s;
    const size_t es = plait_dtype_size(datatype);
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_rank(comm, root, "root", fn)) || (s = check_buf(recvbuff, count, "recvbuff", fn)) ||
        (s = check_size(count, es, (size_t)comm->nranks, fn)) || (s = check_range(recvbuff, count, es, 1, "recvbuff", fn)))
        return s;
    if (comm->rank == root && ((s = check_buf(sendbuff, count, "sendbuff (on the root)", fn)) ||
                               (s = check_range(sendbuff, count, es, (size_t)comm->nranks, "sendbuff", fn))))
        return s;
    return sched_op(comm, PLAIT_COLL_SCATTER, fn, sendbuff, recvbuff, count, datatype, NULL, root, stream);
}

plait_result_t plait_send(const void *sendbuff, size_t count, plait_datatype_t datatype, int peer, plait_comm_t comm,
                          plait_stream_t stream)
{
    static const char fn[] = "plait_send";
    plait_result_t s;
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_rank(comm, peer, "peer", fn)) || (s = check_buf(sendbuff, count, "sendbuff", fn)) ||
        (s = check_size(count, plait_dtype_size(datatype), 1, fn)) ||
        (s = check_range(sendbuff, count, plait_dtype_size(datatype), 1, "sendbuff", fn)))
        return s;
    int on_device;
    void *cu_stream;
    if ((s = route_call(comm, PLAIT_COLL_SEND, fn, sendbuff, NULL, count, peer, &stream, &on_device, &cu_stream)))
        return s;
    struct plait_op *op = op_new(comm, PLAIT_COLL_SEND, fn, 1);
    if (!op)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", fn);
    op->on_device = on_device;
    op->cu_stream = cu_stream;
    op->sendbuff = sendbuff;
    op->esize = plait_dtype_size(datatype);
    sched_args(op, count, peer);
    p2p_task(op, PLAIT_STEP_SEND, peer, 0, count);
    return plait_enqueue(op, stream);
}

plait_result_t plait_recv(void *recvbuff, size_t count, plait_datatype_t datatype, int peer, plait_comm_t comm,
                          plait_stream_t stream)
{
    static const char fn[] = "plait_recv";
    plait_result_t s;
    if ((s = plait_comm_check(comm, fn)) || (s = plait_stream_check(stream, fn)) || (s = check_type(datatype, fn)) ||
        (s = check_rank(comm, peer, "peer", fn)) || (s = check_buf(recvbuff, count, "recvbuff", fn)) ||
        (s = check_size(count, plait_dtype_size(datatype), 1, fn)) ||
        (s = check_range(recvbuff, count, plait_dtype_size(datatype), 1, "recvbuff", fn)))
        return s;
    int on_device;
    void *cu_stream;
    if ((s = route_call(comm, PLAIT_COLL_RECV, fn, NULL, recvbuff, count, peer, &stream, &on_device, &cu_stream)))
        return s;
    struct plait_op *op = op_new(comm, PLAIT_COLL_RECV, fn, 1);
    if (!op)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", fn);
    op->on_device = on_device;
    op->cu_stream = cu_stream;
    op->recvbuff = recvbuff;
    op->esize = plait_dtype_size(datatype);
    sched_args(op, count, peer);
    p2p_task(op, PLAIT_STEP_RECV, peer, 0, count);
    return plait_enqueue(op, stream);
}
