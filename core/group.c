/* Groups: per-thread queues of operations launched together at the outermost
 * plait_group_end(). Operations on NULL streams run on the calling thread in one
 * executor pass (across communicators); those on a stream go to its worker;
 * those of a non-blocking communicator go to the communicator's internal stream
 * and the call reports PLAIT_IN_PROGRESS. Operations on device buffers launch
 * on their CUDA streams (core/cuda/launch.c) and return before completion. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "core/comm.h"
#include "core/progress.h"
#include "core/cuda/cuda.h"
#include "base/log.h"

struct group_state {
    int depth;
    struct plait_op *head;
    struct plait_op *tail;
};

static __thread struct group_state group;

int plait_group_depth(void)
{
    return group.depth;
}

plait_result_t plait_group_start(void)
{
    group.depth++;
    return PLAIT_SUCCESS;
}

/* Takes the ops whose destination stream is `s` out of *list, in order. */
static struct plait_op *take_stream(struct plait_op **list, plait_stream_t s)
{
    struct plait_op *out = NULL, **out_tail = &out, **pp = list;
    while (*pp) {
        struct plait_op *op = *pp;
        if (op->stream == s) {
            *pp = op->next;
            op->next = NULL;
            *out_tail = op;
            out_tail = &op->next;
        } else {
            pp = &op->next;
        }
    }
    return out;
}

/* Takes the device ops (core/cuda/launch.c) out of *list, in order. */
static struct plait_op *take_device(struct plait_op **list)
{
    struct plait_op *out = NULL, **out_tail = &out, **pp = list;
    while (*pp) {
        struct plait_op *op = *pp;
        if (op->plan.executor == PLAIT_EXEC_CUDA) {
            *pp = op->next;
            op->next = NULL;
            *out_tail = op;
            out_tail = &op->next;
        } else {
            pp = &op->next;
        }
    }
    return out;
}

/* Sends each op of the list where it runs: device ops to their CUDA streams
 * (plait_cuda_launch), ops on a plait stream (or a non-blocking
 * communicator's internal one) to its worker, and the rest through the
 * executor on the calling thread, which runs them before returning. Takes
 * ownership of the list. */
static plait_result_t dispatch_ops(struct plait_op *ops)
{
    plait_result_t status = PLAIT_SUCCESS;
    int in_progress = 0;
    /* Device ops run on CUDA streams, asynchronously, whatever the
     * communicator's blocking mode (as NCCL's calls on device buffers). */
    struct plait_op *dev_ops = take_device(&ops);
    /* Calls of non-blocking communicators on the NULL stream run on their
     * communicator's internal stream. */
    struct plait_comm *pinned[64];
    int npinned = 0;
    for (struct plait_op *op = ops; op; op = op->next) {
        if (op->stream || op->comm->blocking)
            continue;
        /* The internal stream is freed by an abort once busy and inflight are
         * zero: hold busy (plait_op_enter) until the submit below has raised
         * inflight. */
        struct plait_comm *c = op->comm;
        int seen = 0;
        for (int i = 0; i < npinned; i++)
            seen |= pinned[i] == c;
        if (!seen) {
            if (npinned == (int)(sizeof(pinned) / sizeof(pinned[0]))) {
                status = plait_error(PLAIT_ERR_INVALID_USAGE, "a group may span at most 64 communicators");
                break;
            }
            pinned[npinned++] = c;
            if (plait_op_enter(c)) {
                status = plait_error(PLAIT_ERR_INVALID_USAGE, "rank %d: the communicator was aborted", c->rank);
                break;
            }
        }
        op->stream = c->internal_stream; /* made with the communicator */
        in_progress = 1;
    }
    if (status) {
        for (int i = 0; i < npinned; i++)
            plait_op_leave(pinned[i]);
        plait_op_free_list(ops);
        plait_op_free_list(dev_ops);
        return status;
    }
    /* Streams first: the calling thread's own batch may depend on work of the
     * group queued on a stream (and the reverse cannot block a worker). */
    struct plait_op *inline_ops = take_stream(&ops, NULL);
    while (ops) {
        plait_stream_t s = ops->stream;
        struct plait_op *batch = take_stream(&ops, s);
        plait_result_t r = plait_stream_submit(s, batch);
        if (r && !status)
            status = r;
    }
    for (int i = 0; i < npinned; i++)
        plait_op_leave(pinned[i]);
    /* Device ops launch before the calling thread runs its host batch: a
     * launch returns at once, and host and device ops use separate FIFOs,
     * so neither waits for the other. */
    if (dev_ops) {
        plait_result_t r = plait_cuda_launch(dev_ops);
        if (r && !status)
            status = r;
    }
    if (inline_ops) {
        plait_result_t r = plait_exec_run(inline_ops);
        plait_op_free_list(inline_ops);
        if (r && !status)
            status = r;
    }
    if (!status && in_progress)
        return PLAIT_IN_PROGRESS;
    return status;
}

plait_result_t plait_group_end(void)
{
    if (group.depth <= 0)
        return plait_error(PLAIT_ERR_INVALID_USAGE, "plait_group_end: no plait_group_start on this thread");
    if (--group.depth > 0)
        return PLAIT_SUCCESS;
    struct plait_op *ops = group.head;
    group.head = group.tail = NULL;
    /* A call refused inside the group returned its error and is simply not part
     * of it; the others run. */
    return dispatch_ops(ops);
}

plait_result_t plait_enqueue(struct plait_op *op, plait_stream_t stream)
{
    struct plait_comm *comm = op->comm;
    op->stream = stream;
    op->seq = ++comm->seq;
    op->grouped = group.depth > 0;
    if (group.depth > 0) {
        if (group.tail)
            group.tail->next = op;
        else
            group.head = op;
        group.tail = op;
        return PLAIT_SUCCESS;
    }
    return dispatch_ops(op);
}
