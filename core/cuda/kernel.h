/* What the host gives the CUDA kernel: the layout shared by core/cuda/kernel.cu
 * (nvcc), the kernel's host emulation (core/cuda/kernel_host.c, used by the
 * CUDA test double) and the host side that builds it (core/cuda/conn.c,
 * plan_cache.c, launch.c).
 * Common subset of C and CUDA C++, like algorithms/stepper.h.
 *
 * One launch runs every device operation of one communicator that a group (or
 * a single call) issued: CTA i runs lane i, a list of tasks executed in order
 * (a channel of a collective, or one side of a point-to-point transfer). Every
 * CTA of the launch runs at once, so tasks on different lanes may wait on
 * each other (a send and a receive of one group never deadlock).
 *
 * Lifetimes (CUDA graphs replay a launch with the same parameters):
 *  - struct plait_kargs is passed by value (kernel parameter): CUDA copies it
 *    at launch and at capture, so buffer pointers and the scalar stay valid.
 *  - the plan (steps, tasks) is immutable, built once per shape of launch and
 *    kept in device memory until the communicator is destroyed;
 *  - connection state (struct plait_dev_conn) is in device memory: its
 *    counters are monotonic and advanced by the kernel itself, so a replay
 *    continues where the previous launch stopped;
 *  - scratch belongs to the plan (a plan runs on one stream at a time: the
 *    communicator's launches are ordered).
 */
#ifndef PLAIT_KERNEL_H
#define PLAIT_KERNEL_H

#include <stdint.h>
#include "algorithms/stepper.h"

#define PLAIT_KERNEL_NAME "plait_kernel"
#define PLAIT_KERNEL_THREADS 512      /* threads per CTA (blockDim.x) */
/* CTAs of plait_kernel one SM is guaranteed to hold at once (the min-blocks
 * of its __launch_bounds__: ptxas then keeps registers at or under
 * 64K / (THREADS * this)). A launch's CTAs wait on each other and on the CTAs
 * of the other ranks sharing the GPU, so all of them must be resident
 * together: conn.c caps the CTAs of a rank at SMs x this / ranks on the GPU. */
#define PLAIT_KERNEL_CTAS_PER_SM 1
#define PLAIT_KMAX_OPS 48             /* operations in one launch (more: several launches) */
#define PLAIT_KMAX_LANES 512          /* CTAs of one launch */

/* One direction of a connection as the kernel sees it: device-visible
 * addresses (device memory, a peer's memory through IPC or peer access, or
 * host-mapped pinned memory for a proxy). */
struct plait_dev_fifo {
    char *slots;        /* nslots x slot_bytes (Simple) */
    char *ll;           /* nslots x slot_bytes of LL lines (LL), NULL when the connection has no LL */
    uint32_t *sizes;    /* bytes in each slot (Simple) */
    uint64_t *tail;     /* slots filled: written by the sender (release), polled by the receiver */
    uint64_t *head;     /* slots drained: written by the receiver (release), polled by the sender */
};

/* A connection (peer, class) of this rank, in device memory. The tx side's
 * slots, sizes and tail point into the peer's receive memory, its head into
 * ours; the rx side the other way round (as transports/transport.h). */
struct plait_dev_conn {
    struct plait_dev_fifo tx;
    struct plait_dev_fifo rx;
    uint64_t tx_posted;   /* owned by the kernel: slots this rank has sent */
    uint64_t rx_consumed; /* owned by the kernel: slots this rank has drained */
    uint32_t nslots;
    uint32_t slot_bytes;
    int32_t peer;
    int32_t scope;        /* enum plait_scope for this connection's counters */
};

/* A task of a lane: steps [step_begin, step_end) of the plan's step array run
 * in order by one CTA, over operation `op` of the launch, on connection class
 * `cls`. */
struct plait_dev_task {
    uint32_t op;
    uint32_t cls;
    uint64_t step_begin;
    uint64_t step_end;
};

/* The immutable part of a launch, in device memory. Offsets are in bytes
 * from the start of the plan. */
struct plait_dev_plan {
    uint32_t magic;       /* PLAIT_PLAN_MAGIC: checked by the kernel (and the double) */
    uint32_t nlanes;      /* CTAs */
    uint32_t ntasks;
    uint32_t nops;
    uint64_t lane_off;    /* uint32_t[nlanes + 1]: lane i runs tasks [lane[i], lane[i + 1]) */
    uint64_t task_off;    /* struct plait_dev_task[ntasks] */
    uint64_t step_off;    /* struct plait_step[...] */
    uint64_t bytes;       /* the whole plan */
};
#define PLAIT_PLAN_MAGIC 0x706c616eu

/* One operation of the launch (per call: in the kernel parameters). */
struct plait_dev_op {
    char *buf[3];         /* enum plait_buf: sendbuff, recvbuff, scratch (device addresses) */
    uint32_t esize;
    int32_t dtype;        /* plait_datatype_t */
    int32_t redop;        /* PLAIT_SUM..PLAIT_AVG, PLAIT_RED_PREMULSUM (reduce.h) */
    int32_t proto;        /* enum plait_wire (algorithms/stepper.h): PLAIT_WIRE_SIMPLE or PLAIT_WIRE_LL */
    uint64_t nranks;      /* for avg */
    double scalar_f;      /* as struct plait_red */
    uint64_t scalar_i;
    uint64_t piece_max;   /* elements per piece (plait_piece_max) */
    uint32_t sc;          /* PLAIT_DEV_SC_*: whether and when its sends may go as single-copy descriptors */
};

/* ---------------------------------------------------------------- single copy
 * A step whose sent bytes are the sender's own unchanged buffer bytes (a SEND
 * whose PRE/POST change nothing for the op, the send half of SENDRECV and
 * SENDRECV_REDUCE), that lie inside one of the sender's memory windows and
 * that are at least kargs.sc_min_bytes long, goes as ONE slot whose size word
 * is PLAIT_DEV_SLOT_DESC | sizeof(struct plait_dev_desc): {window, offset,
 * length}. The receiver reads the bytes from its own mapping of the sender's
 * window (kargs.wins) for every piece of its step and releases the slot after
 * the last one; the sender keeps the descriptor pending (kernel_body.h) and
 * writes none of those bytes, nor ends its task, until then. */
#define PLAIT_DEV_SC_SEND 1u       /* the op may publish descriptors (off for a lone, ungrouped send) */
#define PLAIT_DEV_SC_PLAIN_PRE 2u  /* PLAIT_STEP_PRE leaves the bytes unchanged for this op */
#define PLAIT_DEV_SC_PLAIN_POST 4u /* PLAIT_STEP_POST leaves the bytes unchanged for this op */
#define PLAIT_DEV_SLOT_DESC 0x80000000u /* == transports/transport.h's PLAIT_SLOT_DESC (dev_comm.h checks) */
#define PLAIT_KMAX_WINDOWS 32      /* windows with a single-copy table entry (later ones: no single copy) */

/* What a descriptor slot holds. Windows are registered collectively, so a
 * window's index is the same on every rank. */
struct plait_dev_desc {
    uint64_t win;         /* window index, < PLAIT_KMAX_WINDOWS */
    uint64_t off;         /* byte offset of the bytes in the sender's window */
    uint64_t len;         /* bytes */
};

/* One rank's window as this rank's device addresses it (base 0: not
 * mapped, or not loadable by this device's kernels). */
struct plait_dev_win {
    uint64_t base;
    uint64_t size;
};

/* Kernel errors, written once (first wins) to kargs.status[1]. */
enum plait_kerr {
    PLAIT_KERR_NONE = 0,
    PLAIT_KERR_ABORT = 1,     /* *abort_flag became non-zero */
    PLAIT_KERR_TIMEOUT = 2,   /* a wait passed timeout_ns */
    PLAIT_KERR_SIZE = 3,      /* a slot held another size than expected: mismatched calls */
    PLAIT_KERR_NOCONN = 4,    /* a step names a peer with no connection on its class */
    PLAIT_KERR_PLAN = 5,      /* bad plan magic */
    PLAIT_KERR_DESC = 6,      /* a single-copy descriptor names a window or range this rank has not mapped */
};

struct plait_kargs {
    const struct plait_dev_plan *plan;
    struct plait_dev_conn *const *conns; /* [peer * ncls + cls], NULL where none */
    int32_t ncls;
    int32_t nranks;
    int32_t rank;
    int32_t nops;
    /* Host-mapped words (pinned, device-visible): abort_flag is the
     * communicator's abort (non-zero: every wait ends); status[0] counts
     * completed launches (the last CTA to finish bumps it), status[1] holds
     * the first enum plait_kerr, status[2] the lane, status[3] the peer. */
    const volatile uint32_t *abort_flag;
    uint64_t *status;
    uint64_t timeout_ns;  /* 0: none */
    uint32_t *lanes_done; /* device counter for "last CTA" detection, reset by the last CTA */
    /* Single copy: wins[w * nranks + r] is rank r's window w here (device
     * memory, written by ce.c at registration); win_mask the windows
     * registered when the launch was issued (bit w); sc_min_bytes the
     * smallest step sent as a descriptor (0: none); sc_counts[0] counts the
     * descriptors this rank published, [1] those it received (tests). */
    const struct plait_dev_win *wins;
    uint32_t win_mask;
    uint32_t pad0;
    uint64_t sc_min_bytes;
    uint32_t *sc_counts;
    struct plait_dev_op ops[PLAIT_KMAX_OPS];
};

/* The second kernel: a local element-wise reduction dst = post(pre(a) OP b)
 * over n elements (b NULL: a transformed copy), for the bandwidth test
 * (perf/gpu_check.sh) and local steps. */
#define PLAIT_REDUCE_KERNEL_NAME "plait_reduce_local"
struct plait_kreduce_args {
    void *dst;
    const void *a;
    const void *b;
    uint64_t n;
    int32_t dtype;
    int32_t redop;
    uint64_t nranks;
    double scalar_f;
    uint64_t scalar_i;
    uint32_t flags;       /* PLAIT_STEP_PRE | PLAIT_STEP_POST */
};

/* The host emulation of the kernels (kernel_host.c), with the same body as
 * the GPU's (core/cuda/kernel_body.h): runs CTA `cta` of `ncta` of a launch to
 * completion on the calling thread. `params` points to the kernel's one
 * parameter (struct plait_kargs, struct plait_kreduce_args). The CUDA test
 * double runs each CTA of a launch on its own thread; plait's cu.c hands it
 * these entries by name when it loads a double (plait_cuda_double_set_kernel). */
#ifndef __CUDACC__
void plait_kernel_emulate(const void *params, unsigned cta, unsigned ncta);
void plait_reduce_local_emulate(const void *params, unsigned cta, unsigned ncta);
#endif

#endif
