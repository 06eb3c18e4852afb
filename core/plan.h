/* The planning stage of a call (core/plan.c). A call goes
 *
 *   API entry point (enqueue.c) -> validate (enqueue.c) -> plan (here)
 *     -> execute (enqueue.c builds the op from the plan; fastpath.c, exec.c
 *        or core/cuda/ run it)
 *
 * and every choice that makes the call one kind of work or another is made
 * here, once: which executor (CPU or CUDA), the small-message path or an
 * algorithm's schedule, the protocol, the channels and the chunk. The plan is
 * a value: the executors read it and decide none of it again. */
#ifndef PLAIT_PLAN_H
#define PLAIT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"

struct plait_comm;
struct plait_red;

/* A call whose arguments the API entry point has validated. */
struct plait_call {
    int coll;                    /* PLAIT_COLL_* */
    const char *name;            /* the API function, for messages */
    const void *sendbuff;
    void *recvbuff;
    size_t count;                /* elements (per rank for allgather, reducescatter, alltoall) */
    int dtype;
    int root;                    /* the root, or the peer of a send or receive (0 otherwise) */
    const struct plait_red *red; /* the resolved reduction (NULL: the call reduces nothing) */
    plait_stream_t stream;       /* as passed by the caller */
};

enum plait_path {
    PLAIT_PATH_SMALL,    /* the small-message path (core/fastpath.c): one exchange, no schedule */
    PLAIT_PATH_SCHEDULE, /* an algorithm's schedule through the FIFOs, one task per channel */
    PLAIT_PATH_P2P,      /* a send or a receive: one task on the point-to-point class */
};

enum plait_executor {
    PLAIT_EXEC_CPU,  /* host buffers: core/exec.c, or fastpath.c on the calling thread */
    PLAIT_EXEC_CUDA, /* device or managed buffers: core/cuda/launch.c on a CUDA stream */
};

struct plait_plan {
    uint8_t path;          /* enum plait_path */
    uint8_t executor;      /* enum plait_executor */
    /* PLAIT_PATH_SMALL: the call runs at once on the calling thread from an op
     * on its stack (NULL stream, no open group, a blocking communicator with
     * nothing queued on a stream); otherwise it becomes a one-task op. */
    uint8_t run_now;
    uint8_t algo;          /* PLAIT_PATH_SCHEDULE: the algorithm (PLAIT_ALGO_*) */
    uint8_t wire;          /* PLAIT_EXEC_CUDA: the kernel's protocol, enum plait_wire */
    int nchannels;         /* channels (tasks) of a schedule, 1..comm->nchannels */
    uint64_t chunk_elems;  /* elements per step per rank-chunk (0 when run_now: no schedule args) */
    size_t bytes;          /* PLAIT_PATH_SMALL: bytes each rank sends each peer (0: a barrier) */
    plait_stream_t stream; /* where the op is queued after routing (NULL: the calling thread) */
    void *cu_stream;       /* PLAIT_EXEC_CUDA: the CUDA stream (NULL: CUDA's default stream) */
};

/* Plans one validated call on comm. The executor follows the buffers this
 * rank uses (device or managed memory: CUDA; host memory: CPU; a call with no
 * buffer to classify follows its stream); host buffers on a CUDA stream
 * synchronise that stream first and run as on the NULL stream. The rest is the
 * tuner's choice (plait_tuner_choose, asked exactly once here), a pure
 * function of the call and of what every rank holds alike, so every rank
 * plans matching calls alike. Sets *plan_out on success. Fails with the
 * routing error (mixed or unusable buffers, a communicator in asynchronous
 * error), the tuner's (out of memory), or PLAIT_ERR_INVALID_USAGE when the
 * communicator was aborted while the tuner modelled. */
plait_result_t plait_plan_make(struct plait_comm *comm, const struct plait_call *call, struct plait_plan *plan_out);

#endif
