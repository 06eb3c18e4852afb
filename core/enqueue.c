/* The collective and point-to-point entry points: validate the arguments,
 * have the call planned (core/plan.c), then build the operation the plan
 * describes (its tasks and their schedule) and run it or hand it to the group. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "core/comm.h"
#include "core/fastpath.h"
#include "base/log.h"
#include "algorithms/stepper.h"
#include "core/plan.h"
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

/* ------------------------------------------------------------ execution: the op from the plan */

/* The schedule's arguments: the call's, and the plan's channels and chunk. */
static void sched_args(struct plait_op *op, size_t count, int root, const struct plait_plan *plan)
{
    struct plait_comm *comm = op->comm;
    struct plait_sched_args *a = &op->args;
    a->coll = op->coll;
    a->nranks = comm->nranks;
    a->rank = comm->rank;
    a->root = root;
    a->count = count;
    a->nchannels = plan->nchannels;
    a->align_elems = 16 / op->esize;
    a->radix = comm->set.tree_radix;
    a->nhosts = comm->nhosts;
    a->host_of = comm->host_of;
    a->local_of = comm->host_of + comm->nranks;
    a->order = comm->ring_order; /* channel search's rings (comm_topo.c), NULL = rank order */
    a->pos = comm->ring_pos;
    a->chunk_elems = plan->chunk_elems;
}

/* A call on the small-message path (fastpath.c): run now from an op on the
 * stack, or queued as a one-task op in lane 0, as the plan says. A barrier's
 * boxes carry tags only. */
static plait_result_t exec_small(struct plait_comm *comm, const struct plait_call *call, const struct plait_plan *plan)
{
    const int is_barrier = call->coll == PLAIT_COLL_BARRIER;
    const struct plait_red *red = is_barrier ? NULL : call->red;
    const int dtype = is_barrier ? PLAIT_UINT8 : call->dtype;
    const int redop = red ? red->op : PLAIT_SUM;
    const size_t count = is_barrier ? 0 : call->count;
    const int root = is_barrier ? 0 : call->root;
    if (plan->run_now) {
        struct plait_op op;
        op.comm = comm;
        op.coll = call->coll;
        op.name = call->name;
        op.sendbuff = is_barrier ? NULL : call->sendbuff;
        op.recvbuff = is_barrier ? NULL : call->recvbuff;
        op.esize = plait_dtype_size(dtype);
        if (red)
            op.red = *red;
        op.args.count = count;
        op.args.root = root;
        op.plan = *plan;
        op.seq = ++comm->seq;
        op.coll_seq = ++comm->coll_seq;
        plait_fast_prepare(&op, plan->bytes, dtype, redop);
        return plait_fast_run(&op);
    }
    struct plait_op *op = op_new(comm, call->coll, call->name, 1);
    if (!op)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", call->name);
    op->sendbuff = is_barrier ? NULL : call->sendbuff;
    op->recvbuff = is_barrier ? NULL : call->recvbuff;
    op->esize = plait_dtype_size(dtype);
    if (red)
        op->red = *red;
    op->plan = *plan;
    sched_args(op, count, root, plan);
    op->coll_seq = ++comm->coll_seq;
    plait_fast_prepare(op, plan->bytes, dtype, redop);
    struct plait_task *t = &op->tasks[op->ntasks++];
    t->op = op;
    t->cls = 0;
    t->lane = 0;
    t->is_fast = 1;
    return plait_enqueue(op, plan->stream);
}

/* A call on an algorithm's schedule: one task per planned channel, run by
 * the executor the plan names (core/exec.c, or core/cuda/launch.c). */
static plait_result_t exec_schedule(struct plait_comm *comm, const struct plait_call *call,
                                    const struct plait_plan *plan)
{
    const int nch = plan->nchannels;
    struct plait_op *op = op_new(comm, call->coll, call->name, nch);
    if (!op)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", call->name);
    op->coll_seq = ++comm->coll_seq;
    op->fast_seq = comm->fast_seq + 1; /* for plait_fast_check_mismatch */
    op->plan = *plan;
    op->sendbuff = call->sendbuff;
    op->recvbuff = call->recvbuff;
    op->esize = plait_dtype_size(call->dtype);
    if (call->red)
        op->red = *call->red;
    else
        plait_red_init(&op->red, call->dtype, PLAIT_SUM, NULL, (uint64_t)comm->nranks);
    sched_args(op, call->count, call->root, plan);
    const struct plait_algorithm *algo = &plait_algorithms[plan->algo];
    if (algo->scratch) {
        const uint64_t elems = algo->scratch(&op->args);
        size_t sb;
        if (plait_mul_overflows((size_t)elems, op->esize, &sb) || elems > SIZE_MAX) {
            free(op);
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: %s would need %llu elements of scratch", call->name,
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
    return plait_enqueue(op, plan->stream);
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

/* A send or a receive: one task on the point-to-point class. */
static plait_result_t exec_p2p(struct plait_comm *comm, const struct plait_call *call, const struct plait_plan *plan)
{
    const int is_send = call->coll == PLAIT_COLL_SEND;
    struct plait_op *op = op_new(comm, call->coll, call->name, 1);
    if (!op)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", call->name);
    op->plan = *plan;
    if (is_send)
        op->sendbuff = call->sendbuff;
    else
        op->recvbuff = call->recvbuff;
    op->esize = plait_dtype_size(call->dtype);
    sched_args(op, call->count, call->root, plan);
    p2p_task(op, is_send ? PLAIT_STEP_SEND : PLAIT_STEP_RECV, call->root, 0, call->count);
    return plait_enqueue(op, plan->stream);
}

/* ------------------------------------------------------------ a validated call: plan, then execute */

/* Every entry point, once its arguments are valid: the planner decides how
 * the call runs (core/plan.c), then the op the plan describes is built and
 * run or queued. Nothing after plait_plan_make decides again. */
static plait_result_t issue(struct plait_comm *comm, int coll, const char *name, const void *sendbuff, void *recvbuff,
                            size_t count, int dtype, const struct plait_red *red, int root, plait_stream_t stream)
{
    const struct plait_call call = {.coll = coll, .name = name, .sendbuff = sendbuff, .recvbuff = recvbuff,
                                    .count = count, .dtype = dtype, .root = root, .red = red, .stream = stream};
    struct plait_plan plan;
    plait_result_t s = plait_plan_make(comm, &call, &plan);
    if (s)
        return s;
    switch (plan.path) {
    case PLAIT_PATH_SMALL: return exec_small(comm, &call, &plan);
    case PLAIT_PATH_P2P: return exec_p2p(comm, &call, &plan);
    default: return exec_schedule(comm, &call, &plan);
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
    return issue(comm, PLAIT_COLL_ALLREDUCE, fn, sendbuff, recvbuff, count, datatype, &red, 0, stream);
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
    return issue(comm, PLAIT_COLL_BROADCAST, fn, sendbuff, recvbuff, count, datatype, NULL, root, stream);
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
    return issue(comm, PLAIT_COLL_REDUCE, fn, sendbuff, recvbuff, count, datatype, &red, root, stream);
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
    return issue(comm, PLAIT_COLL_ALLGATHER, fn, sendbuff, recvbuff, sendcount, datatype, NULL, 0, stream);
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
    return issue(comm, PLAIT_COLL_REDUCESCATTER, fn, sendbuff, recvbuff, recvcount, datatype, &red, 0, stream);
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
    return issue(comm, PLAIT_COLL_BARRIER, fn, comm->barrier_buf[0], comm->barrier_buf[1], 1, PLAIT_UINT8, NULL, 0,
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
    return issue(comm, PLAIT_COLL_ALLTOALL, fn, sendbuff, recvbuff, count, datatype, NULL, 0, stream);
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
    return issue(comm, PLAIT_COLL_GATHER, fn, sendbuff, recvbuff, count, datatype, NULL, root, stream);
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
    return issue(comm, PLAIT_COLL_SCATTER, fn, sendbuff, recvbuff, count, datatype, NULL, root, stream);
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
    return issue(comm, PLAIT_COLL_SEND, fn, sendbuff, NULL, count, datatype, NULL, peer, stream);
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
    return issue(comm, PLAIT_COLL_RECV, fn, NULL, recvbuff, count, datatype, NULL, peer, stream);
}
