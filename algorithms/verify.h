/* The schedule verifier: runs a schedule symbolically, for every rank and
 * channel, and proves it right or says what is wrong (docs/architecture.md, section 3;
 * docs/algorithms.md, "The verifier").
 *
 * What it models is what the CPU executor (core/exec.c) does:
 *   - every (rank, channel) runs its steps in order;
 *   - a step that is not a COPY moves its count in pieces of at most
 *     `piece_elems` elements (one FIFO slot); a piece of a receiving step needs
 *     a filled slot from recv_peer on the same channel, a piece of a sending step
 *     needs a free slot (credit) towards send_peer on the same channel, and a
 *     piece that does both needs both at once (the received slot is held until
 *     the send slot is there);
 *   - a SENDRECV step is two independent halves: its send half moves pieces of
 *     src to send_peer as credit allows, its receive half pieces from
 *     recv_peer into dst as they arrive; neither waits for the other and the
 *     step ends when both are done (a stuck one may wait for both);
 *   - each connection (ordered pair of ranks, channel) is a FIFO of `fifo_slots`
 *     slots; the receiver compares each piece's size with what its own step
 *     expects (a difference is the executor's "mismatched operations" error);
 *   - COPY steps are local and whole; steps of count 0 move nothing.
 *
 * Data is symbolic and kept per element *interval*: each buffer of each rank is
 * a map from intervals to a content ("element x holds the reduction of
 * input_q[x + shift] over these (q, shift), with the pre-op applied so many times
 * to each and the post-op so many times"), and so is each piece in flight. Runs
 * of pieces move in batches (as many as the slots and credit allow), so the cost
 * grows with the number of steps, never with the element count: 2^32 elements
 * cost what 7 do with the same number of steps.
 *
 * By Kahn's argument (each task is a deterministic sequential process that
 * blocks on one FIFO at a time; a SENDRECV step is two such processes, one per
 * half, joined at its end) the outcome does not depend on the order in which
 * tasks are run, so one run decides deadlock for every interleaving the
 * executor may take. */
#ifndef PLAIT_VERIFY_H
#define PLAIT_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"
#include "algorithms/schedule.h"

/* The set of peers a rank is connected to on a channel (the connections the
 * communicator makes at init); the signature of struct plait_algorithm's
 * `peers` (algorithms/algorithms.h). */
typedef int (*plait_verify_peers_fn)(int nranks, int rank, int radix, int *out, int max);

struct plait_verify_config {
    plait_step_fn gen;             /* the generator under test (required) */
    /* The call: coll, nranks, root, count, nchannels, chunk_elems, align_elems
     * (and radix for trees), exactly as sched_args() would fill them;
     * args.rank is ignored (every rank is run). */
    struct plait_sched_args args;
    uint64_t piece_elems;          /* elements per FIFO slot (slot_bytes / element size), >= 1 */
    uint32_t fifo_slots;           /* FIFO depth per connection and direction, >= 1 */
    /* The node map handed to the generator: args.host_of/local_of/nhosts when the
     * caller sets them, else ranks_per_node consecutive ranks per host (0: one
     * host). args.order/pos (ring orders) are handed on as they are. */
    int ranks_per_node;
    /* SCRATCH per rank, as the algorithm's scratch() (NULL: none; a step that
     * touches SCRATCH is then out of bounds). */
    plait_scratch_fn scratch;
    int max_reports;               /* findings kept with their text (counts are always complete); 0 = 32 */
    int is_inplace;                /* sendbuff and recvbuff alias as in NCCL's in-place calls */
    uint64_t max_steps;            /* stop (a LIMIT finding) after this many steps in all; 0 = 2^30 */
    /* Optional: the connections that exist. A step that uses a peer outside this
     * set is reported as BAD_PEER (the executor has no connection there). */
    plait_verify_peers_fn peers;
};

/* Kinds of findings. */
enum plait_verify_kind {
    PLAIT_VERIFY_WRONG_OUTPUT = 0, /* an output interval is not what the collective requires */
    PLAIT_VERIFY_NO_MATCHING_SEND, /* deadlock: a receive whose sender finished or never sends on that channel */
    PLAIT_VERIFY_NO_MATCHING_RECV, /* deadlock: a send into a full FIFO whose receiver finished or never receives */
    PLAIT_VERIFY_CREDIT_DEADLOCK,  /* deadlock: a circular wait in which every task waits for credit */
    PLAIT_VERIFY_CIRCULAR_WAIT,    /* deadlock: a circular wait in which some task waits for data */
    PLAIT_VERIFY_BLOCKED_BEHIND,   /* deadlock: waits on a task that is itself stuck (not a cause) */
    PLAIT_VERIFY_UNWRITTEN_READ,   /* a step reads SCRATCH or OUTPUT before anything wrote it */
    PLAIT_VERIFY_BAD_PEER,         /* a peer out of range, equal to self, or not connected */
    PLAIT_VERIFY_LEFTOVER,         /* pieces left in a FIFO whose receiver finished */
    PLAIT_VERIFY_MISMATCH,         /* a received piece's size differs from what the receiver expects */
    PLAIT_VERIFY_OUT_OF_BOUNDS,    /* a step reaches outside INPUT or OUTPUT */
    PLAIT_VERIFY_BAD_STEP,         /* unknown kind or buffer, a write to INPUT, a partially overlapping copy,
                                      a SENDRECV with flags or with overlapping src and dst */
    PLAIT_VERIFY_RACE,             /* a channel reads or overwrites what another channel of the rank wrote */
    PLAIT_VERIFY_DIVERGENT,        /* allreduce: a rank's result is reduced in another order than rank 0's,
                                      so the ranks may not get the same bits */
    PLAIT_VERIFY_FOREIGN_PRE,      /* a step applies the pre-op to data holding another rank's contribution
                                      (premulsum: each contribution is scaled by its own rank's scalar) */
    PLAIT_VERIFY_LIMIT,            /* the run stopped at max_steps */
    PLAIT_VERIFY_KINDS
};

struct plait_verify_finding {
    int kind;      /* enum plait_verify_kind */
    int rank;      /* -1 when not about one rank */
    int channel;   /* -1 when not about one channel */
    uint64_t step; /* step index, UINT64_MAX when not about one step */
    char *text;    /* one human-readable line, owned by the result */
};

struct plait_verify_result {
    int is_ok;                              /* 1: no finding of any kind */
    uint64_t counts[PLAIT_VERIFY_KINDS];    /* every finding, by kind */
    uint64_t total;                         /* sum of counts */
    struct plait_verify_finding *findings;  /* the first max_reports findings */
    size_t nfindings;
    int stuck_tasks;                        /* (rank, channel) tasks that never finished */
    /* what the run cost, for the tool's statistics */
    uint64_t steps;                         /* steps fetched from the generator */
    uint64_t batches;                       /* batched piece moves */
    uint64_t nodes;                         /* symbolic contents created */
};

/* Runs cfg's schedule for every rank and channel and checks it. On success
 * (the verification ran, whatever it found) fills *out, which the caller frees
 * with plait_verify_result_free(), and returns PLAIT_SUCCESS; out->is_ok says
 * whether the schedule is right. Returns PLAIT_ERR_INVALID_ARGUMENT (with the
 * last-error message saying why) for a config it cannot run: no generator,
 * nranks outside 1..2^20, nchannels outside 1..65535, a piece, slot count, chunk
 * or alignment of 0, a collective without a defined result, a root out of range;
 * PLAIT_ERR_SYSTEM when memory runs out. *out is untouched on failure.
 * Allocates memory proportional to nranks x channels and to the intervals the
 * schedule creates, never to the element count. No global state: thread-safe
 * as long as the generator is (generators are pure functions). */
plait_result_t plait_sched_verify(const struct plait_verify_config *cfg, struct plait_verify_result *out);

/* Frees what plait_sched_verify() put in *r (not r itself) and zeroes it. */
void plait_verify_result_free(struct plait_verify_result *r);

/* "wrong-output", "no-matching-send", ... ("invalid" when out of range). */
const char *plait_verify_kind_name(int kind);

/* "SEND", "RECV_REDUCE_SEND", ... ("invalid" when out of range). */
const char *plait_step_kind_name(int kind);

#endif
