/* The small-message path: collectives of at most PLAIT_FAST_MAX_BYTES per
 * rank pair between the ranks of one host, without FIFOs, schedules or the
 * executor's machinery. See fastpath.c. PLAIT_PROTO, NCCL_PROTO and the
 * tuning file call it "LL" ("ll"), and the model's PLAIT_MPROTO_LL is this
 * path on a CPU engine; elsewhere in the code LL is the kernel's wire
 * protocol (PLAIT_WIRE_LL). */
#ifndef PLAIT_FASTPATH_H
#define PLAIT_FASTPATH_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"
#include "tuning/model.h" /* PLAIT_FAST_MAX_RANKS, PLAIT_FAST_MAX_BYTES */

struct plait_comm;
struct plait_op;
struct plait_task;


/* Bytes of the small-message boxes in each rank's region of transport t
 * (an index in plait_transports): nonzero only when every pair of distinct
 * ranks of the communicator is joined by t, t holds a region for the core
 * (its query's `region`), 2 <= nranks <= PLAIT_FAST_MAX_RANKS and PLAIT_PROTO
 * allows it. A pure function of what every rank knows, so every rank computes
 * the same size for every segment. */
size_t plait_fast_region_bytes(const struct plait_comm *comm, int t);

/* Called by the core once transport t's segments are mapped: boxes[r] is
 * where the boxes are in rank r's region. Sets comm->fast (left NULL when out
 * of memory: the FIFO path is always there). */
void plait_fast_attach(struct plait_comm *comm, char *const *boxes);

/* Whether the communicator's small-message path runs over connections (the
 * small-message class, comm->nchannels) instead of boxes: when no transport
 * joins every pair with boxes (ranks on several hosts, or PLAIT_TRANSPORT=
 * socket), 2 <= nranks <= PLAIT_FAST_MAX_RANKS, PLAIT_PROTO allows it and a
 * slot holds a message. A pure function of what every rank knows. */
int plait_fast_msg_wanted(const struct plait_comm *comm);

/* Sets comm->fast for the path over connections (comm->fast_msg). */
void plait_fast_attach_msg(struct plait_comm *comm);

/* The most bytes per rank pair the communicator's path takes (0: none):
 * PLAIT_FAST_MAX_BYTES with boxes; over connections a slot less the tag, at
 * most PLAIT_FAST_MSG_MAX_BYTES (one message per peer stays one message). */
size_t plait_fast_max_bytes(const struct plait_comm *comm);

/* Frees comm->fast (before the segments go). */
void plait_fast_detach(struct plait_comm *comm);

/* Whether a collective of `bytes` per rank pair takes the small-message path:
 * the same answer on every rank for matching calls (it reads only agreed
 * settings and the call's arguments). `coll` is a PLAIT_COLL_* value. */
int plait_fast_eligible(const struct plait_comm *comm, int coll, size_t bytes);

/* Fills the small-message fields of an op (whose comm, coll, buffers, esize,
 * red and args.count are set) and assigns it the next small-message sequence
 * number. */
void plait_fast_prepare(struct plait_op *op, size_t bytes, int dtype, int redop);

/* Runs a prepared op to completion on the calling thread (the NULL-stream,
 * no-group case): holds the communicator busy, waits with the executor's
 * policy (poll, then yield), honours abort, dead peers and PLAIT_COLL_TIMEOUT,
 * and marks the communicator in error on failure, like plait_exec_run. */
plait_result_t plait_fast_run(struct plait_op *op);

/* One non-blocking pass of a small-message task inside the executor: returns
 * the executor's ADV_* codes (0 blocked, 1 progressed, 2 done, 3 error with
 * *err set). */
int plait_fast_advance(struct plait_task *t, plait_result_t *err);

/* For a timeout's message: adds to w the peers whose boxes the task still
 * waits for. */
struct plait_waits;
void plait_fast_waits(const struct plait_task *t, struct plait_waits *w);

/* For a FIFO-path collective that is waiting: whether a peer entered the same
 * collective (by collective sequence number) on the small-message path, which
 * means the ranks called mismatched collectives. Returns the error (and sets
 * the last-error string) or PLAIT_SUCCESS. */
plait_result_t plait_fast_check_mismatch(const struct plait_op *op);

#endif
