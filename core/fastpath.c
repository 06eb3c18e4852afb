/* The small-message path: collectives of a few hundred bytes between the ranks
 * of one host, in the fewest cache-line hand-offs the hardware allows.
 *
 * Why: through the FIFO path an 8-byte allreduce walks the op/task machinery,
 * a schedule generator, slot credits and the executor's loop (~3,800
 * instructions per rank), several times the ~80 ns a cache line takes to move
 * between two cores. Here a call pushes its data straight into a box in each
 * peer's segment and reads the boxes the peers pushed into its own.
 *
 * Boxes. Every rank's region in its segment (of a transport that holds the
 * core's region: shm, inproc; core/comm_transport.c) holds, after the
 * operation counters, for each
 * writer rank w, two boxes (parity 0 and 1) of BOX_BYTES: an 8-byte tag, then
 * up to PLAIT_FAST_MAX_BYTES of data. Only w writes its boxes; only the owner
 * reads them. The writer stores the data with plain stores and then publishes
 * the tag with a release store; the reader acquires the tag and then reads the
 * data. For up to 56 bytes, data and tag share one cache line: one line moves.
 *
 * Tags. tag = small-message sequence number (low 32 bits) << 32 | collective
 * sequence number (low 12 bits) << 20 | a 20-bit hash of (collective, type,
 * op, count). A reader waits for the exact tag it expects; a tag with its own
 * small-message number but other bits means the ranks called different
 * collectives (a mismatch, reported, never a hang or wrong data).
 *
 * Reuse. Call k writes the boxes of parity k & 1, last written by call k - 2.
 * Every call on this path writes a box to every peer and reads every peer's box
 * before it completes; in broadcast and reduce the ranks that have no data for
 * a peer push the tag alone. So when a rank starts call k it has read the
 * peer's call k - 1 box, which the peer wrote only after finishing call k - 2,
 * that is after reading our call k - 2 box: the box is free. No credit is
 * needed. Small-message calls of a communicator run one at a time in issue
 * order: inline on the calling thread, or as the only task of their op in lane
 * 0 of the executor.
 *
 * Over connections. Between hosts (or with PLAIT_TRANSPORT=socket) no
 * segment holds every rank's boxes; the same exchange then runs as messages
 * on the communicator's small-message connection class (comm->nchannels,
 * connected to every peer on first use: comm->fast_msg). A call writes one
 * FIFO slot to each peer, the tag and then the data (the tag alone where a
 * box would carry none), so the net transport sends it as one message (the
 * Socket provider: one write of header and data) and the peer reads it with
 * one read; then it takes one slot from each peer, in rank order. The slots
 * come in order, so the message from a peer is exactly this call's: any other
 * tag or size is a mismatch. A call posts to every peer before it consumes
 * anything (in place, alltoall's blocks are overwritten by what it receives).
 * Credit: a rank starting call k has at most calls k - 1 and k unread at a
 * peer (the reuse argument above), so two slots per connection suffice and a
 * post waits only for the transport to move earlier sends.
 *
 * Results. Reductions run in rank order 0..n-1 on every rank, so every rank
 * gets the same bits. Float avg and premulsum scale each rank's contribution
 * once, by its own rank, before it is pushed (the reduction's "pre" rule). */
#define _GNU_SOURCE
#include "core/fastpath.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "core/comm.h"
#include "core/progress.h"
#include "topology/topo.h"
#include "base/log.h"
#include "base/util.h"

#define BOX_HDR 8
#define BOX_BYTES ((BOX_HDR + PLAIT_FAST_MAX_BYTES + 63) / 64 * 64)

/* The executor's advance codes (exec.c uses the same values). */
enum { FAST_BLOCKED = 0, FAST_PROGRESSED = 1, FAST_DONE = 2, FAST_ERROR = 3 };

struct plait_fast {
    /* Every rank can have a core of its own (the host's graph, the same on
     * every rank, has at least nranks cores): broadcast and reduce take the
     * path only then. Oversubscribed, their FIFO form is faster: the root
     * runs ahead of the others by a FIFO's worth of calls, where this path
     * makes every call wait for every rank to be scheduled. */
    int fits_cores;
    int msg;    /* over connections (comm->fast_msg): rx and tx are unused */
    char **rx;  /* [writer]: the writer's two boxes in this rank's segment (NULL for itself) */
    char **tx;  /* [reader]: this rank's two boxes in the reader's segment (NULL for itself) */
    /* This rank's contribution when it cannot be read from the user's buffer
     * during the call: scaled (avg, premulsum) or overwritten (in place). */
    char *stash;      /* max_bytes, 64-byte aligned */
    size_t max_bytes; /* per rank pair: PLAIT_FAST_MAX_BYTES (boxes), PLAIT_FAST_MSG_MAX_BYTES at most (messages) */
};

static struct plait_fast *fast_new(size_t max_bytes)
{
    struct plait_fast *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    if (posix_memalign((void **)&f->stash, 64, max_bytes) != 0) {
        free(f);
        return NULL;
    }
    f->max_bytes = max_bytes;
    return f;
}

static void fast_free(struct plait_fast *f)
{
    if (!f)
        return;
    free(f->rx);
    free(f->tx);
    free(f->stash);
    free(f);
}

static int all_pairs_on(const struct plait_comm *comm, int t)
{
    for (int a = 0; a < comm->nranks; a++)
        for (int b = a + 1; b < comm->nranks; b++)
            if (plait_comm_pair_tp(comm, a, b) != t)
                return 0;
    return 1;
}

size_t plait_fast_region_bytes(const struct plait_comm *comm, int t)
{
    if (comm->nranks < 2 || comm->nranks > PLAIT_FAST_MAX_RANKS || comm->set.proto == PLAIT_PROTO_SIMPLE)
        return 0;
    struct plait_tp_info info;
    plait_comm_pair_info(comm, 0, 1, &info);
    if (!info.region || !all_pairs_on(comm, t))
        return 0;
    return (size_t)comm->nranks * 2 * BOX_BYTES;
}

/* Whether every host has a core per rank on it, by a count every rank agrees
 * on: the cores of the host's graph when every rank sees the same graph. */
static int fits_cores(const struct plait_comm *comm)
{
    int most = 0; /* ranks on the fullest host */
    for (int r = 0; r < comm->nranks; r++) {
        int on = 0;
        for (int q = 0; q < comm->nranks; q++)
            on += comm->ranks[q].host_index == comm->ranks[r].host_index;
        if (on > most)
            most = on;
    }
    if (!comm->topo)
        return 0;
    for (int r = 0; r < comm->nranks; r++)
        if (comm->ranks[r].topo_hash != comm->ranks[0].topo_hash)
            return 0;
    int cores = 0;
    for (int i = 0; i < comm->topo->nnodes; i++) {
        const struct plait_topo_node *node = &comm->topo->nodes[i];
        if (node->type != PLAIT_TOPO_CPU)
            continue;
        if (node->cpu.ncores <= 0)
            return 0; /* unknown */
        cores += node->cpu.ncores;
    }
    return cores >= most;
}

void plait_fast_attach(struct plait_comm *comm, char *const *boxes)
{
    const int n = comm->nranks, me = comm->rank;
    struct plait_fast *f = fast_new(PLAIT_FAST_MAX_BYTES);
    if (!f)
        return;
    f->fits_cores = fits_cores(comm);
    f->rx = calloc((size_t)n, sizeof(char *));
    f->tx = calloc((size_t)n, sizeof(char *));
    if (!f->rx || !f->tx) {
        fast_free(f);
        return;
    }
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        f->rx[p] = boxes[me] + (size_t)p * 2 * BOX_BYTES;
        f->tx[p] = boxes[p] + (size_t)me * 2 * BOX_BYTES;
    }
    comm->fast = f;
    PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
               "rank %d: small-message path on (%d ranks, up to %d bytes per rank pair; broadcast and reduce %s)", me,
               n, PLAIT_FAST_MAX_BYTES, f->fits_cores ? "too" : "not: fewer cores than ranks");
}

int plait_fast_msg_wanted(const struct plait_comm *comm)
{
    const int n = comm->nranks;
    if (n < 2 || n > PLAIT_FAST_MAX_RANKS || comm->set.proto == PLAIT_PROTO_SIMPLE)
        return 0;
    if (comm->set.nslots < 2 || comm->set.slot_bytes < BOX_HDR + PLAIT_FAST_MAX_BYTES)
        return 0;
    /* boxes where one transport holding a region joins every pair */
    struct plait_tp_info info;
    plait_comm_pair_info(comm, 0, 1, &info);
    return !(info.region && all_pairs_on(comm, plait_comm_pair_tp(comm, 0, 1)));
}

void plait_fast_attach_msg(struct plait_comm *comm)
{
    /* One slot per message: a message of up to a slot less its tag. */
    size_t max = comm->set.slot_bytes - BOX_HDR;
    if (max > PLAIT_FAST_MSG_MAX_BYTES)
        max = PLAIT_FAST_MSG_MAX_BYTES;
    struct plait_fast *f = fast_new(max);
    if (!f)
        return;
    f->msg = 1;
    /* Every rank's host has a core per rank of it: a rank's wait here is its
     * peers being scheduled, as with boxes. */
    f->fits_cores = fits_cores(comm);
    comm->fast = f;
    PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
               "rank %d: small-message path on over connections (%d ranks, up to %zu bytes per rank pair, one message "
               "per peer; broadcast and reduce %s)",
               comm->rank, comm->nranks, f->max_bytes, f->fits_cores ? "too" : "not: fewer cores than ranks");
}

void plait_fast_detach(struct plait_comm *comm)
{
    struct plait_fast *f = comm->fast;
    if (!f)
        return;
    comm->fast = NULL;
    fast_free(f);
}

size_t plait_fast_max_bytes(const struct plait_comm *comm)
{
    return comm->fast ? comm->fast->max_bytes : 0;
}

int plait_fast_eligible(const struct plait_comm *comm, int coll, size_t bytes)
{
    if (!comm->fast || comm->set.algo[coll] != PLAIT_ALGO_AUTO)
        return 0;
    switch (coll) {
    case PLAIT_COLL_BARRIER:
        return 1;
    case PLAIT_COLL_ALLREDUCE:
    case PLAIT_COLL_REDUCESCATTER:
    case PLAIT_COLL_ALLGATHER:
    case PLAIT_COLL_ALLTOALL:
        return bytes > 0 && bytes <= comm->fast->max_bytes;
    case PLAIT_COLL_BROADCAST:
    case PLAIT_COLL_REDUCE:
        return comm->fast->fits_cores && bytes > 0 && bytes <= comm->fast->max_bytes;
    default:
        return 0;
    }
}

static int is_reduction(int coll)
{
    return coll == PLAIT_COLL_ALLREDUCE || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_REDUCE;
}

/* Whether this rank pushes data (not only the tag) to peer p. */
static int sends_data_to(const struct plait_op *op, int p)
{
    const int me = op->comm->rank, root = op->args.root;
    if (op->coll == PLAIT_COLL_BARRIER)
        return 0;
    if (op->coll == PLAIT_COLL_BROADCAST)
        return me == root;
    if (op->coll == PLAIT_COLL_REDUCE)
        return p == root;
    return 1;
}

/* Whether a rank's contribution must be transformed before it is combined. */
static int needs_pre(const struct plait_op *op)
{
    return is_reduction(op->coll) && (op->red.op == PLAIT_AVG || op->red.op == PLAIT_RED_PREMULSUM);
}

/* The block of the send buffer destined for rank p. */
static const char *block_for(const struct plait_op *op, int p)
{
    if (op->coll == PLAIT_COLL_REDUCESCATTER || op->coll == PLAIT_COLL_ALLTOALL)
        return op->sendbuff + (size_t)p * op->fast_bytes;
    return op->sendbuff;
}

void plait_fast_prepare(struct plait_op *op, size_t bytes, int dtype, int redop)
{
    struct plait_comm *comm = op->comm;
    op->fast_seq = ++comm->fast_seq;
    op->fast_bytes = bytes;
    uint64_t h = (uint64_t)op->coll | (uint64_t)(uint32_t)dtype << 8 | (uint64_t)(uint32_t)redop << 16 |
                 (uint64_t)(uint32_t)op->args.root << 24;
    h ^= (uint64_t)bytes * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    op->fast_tag = (op->fast_seq & 0xffffffffull) << 32 | (op->coll_seq & 0xfffull) << 20 | (h & 0xfffffull);
}

/* Pushes this rank's blocks into its peers' boxes. The stash is the
 * communicator's, so it is filled here, when the op runs (its calls run one at
 * a time), not when it is issued (a group may issue several). */
static void prepare_own(struct plait_op *op, struct plait_fast *f)
{
    const int me = op->comm->rank;
    const size_t bytes = op->fast_bytes;
    const int pre = needs_pre(op);
    const char *own = block_for(op, me);
    /* A reduce's non-root writes no result (its recvbuff may be NULL). */
    const int writes_result = op->coll != PLAIT_COLL_REDUCE || me == op->args.root;
    if (pre) {
        plait_reduce_apply(&op->red, f->stash, own, NULL, (size_t)op->args.count, PLAIT_RED_PRE);
        own = f->stash;
    } else if (is_reduction(op->coll) && writes_result && own < op->recvbuff + bytes && op->recvbuff < own + bytes) {
        /* In place: the result is built in recvbuff before our turn comes. */
        memcpy(f->stash, own, bytes);
        own = f->stash;
    }
    op->fast_own = own;
}

/* Writes what this rank sends peer p after a box's or message's tag; returns
 * its bytes (0: the tag alone). */
static size_t fill_for(const struct plait_op *op, int p, char *data)
{
    const size_t bytes = op->fast_bytes;
    if (!bytes || !sends_data_to(op, p))
        return 0;
    if (op->coll == PLAIT_COLL_ALLREDUCE || op->coll == PLAIT_COLL_REDUCE)
        memcpy(data, op->fast_own, bytes);
    else if (needs_pre(op))
        plait_reduce_apply(&op->red, data, block_for(op, p), NULL, (size_t)op->args.count, PLAIT_RED_PRE);
    else
        memcpy(data, block_for(op, p), bytes);
    return bytes;
}

/* Bytes of data (after the tag) that peer k sends this rank. */
static size_t data_from(const struct plait_op *op, int k)
{
    const int me = op->comm->rank, root = op->args.root;
    if (!op->fast_bytes || op->coll == PLAIT_COLL_BARRIER)
        return 0;
    if (op->coll == PLAIT_COLL_BROADCAST)
        return k == root ? op->fast_bytes : 0;
    if (op->coll == PLAIT_COLL_REDUCE)
        return me == root ? op->fast_bytes : 0;
    return op->fast_bytes;
}

static void post(struct plait_op *op, struct plait_fast *f, size_t parity_off)
{
    const struct plait_comm *comm = op->comm;
    const int n = comm->nranks, me = comm->rank;
    prepare_own(op, f);
    for (int i = 1; i < n; i++) {
        const int p = (me + i) % n;
        char *box = f->tx[p] + parity_off;
        (void)fill_for(op, p, box + BOX_HDR);
        /* Publishes the data above to the reader's acquire of the tag. */
        __atomic_store_n((uint64_t *)box, op->fast_tag, __ATOMIC_RELEASE);
    }
}

/* Combines rank k's block into the result. */
static void consume(struct plait_op *op, int k, const char *in)
{
    const int n = op->comm->nranks;
    const size_t bytes = op->fast_bytes;
    switch (op->coll) {
    case PLAIT_COLL_BROADCAST:
        /* Every box is waited for (the reuse rule); only the root's has data. */
        if (k == op->args.root && op->recvbuff != in)
            memcpy(op->recvbuff, in, bytes);
        break;
    case PLAIT_COLL_REDUCE:
        if (op->comm->rank != op->args.root)
            break;
        /* The root reduces like allreduce. */
        /* fall through */
    case PLAIT_COLL_ALLREDUCE:
    case PLAIT_COLL_REDUCESCATTER: {
        const unsigned post_flag = k == n - 1 ? PLAIT_RED_POST : 0;
        if (k == 0)
            plait_reduce_apply(&op->red, op->recvbuff, in, NULL, (size_t)op->args.count, post_flag);
        else
            plait_reduce_apply(&op->red, op->recvbuff, in, op->recvbuff, (size_t)op->args.count, post_flag);
        break;
    }
    case PLAIT_COLL_ALLGATHER:
    case PLAIT_COLL_ALLTOALL: {
        char *dst = op->recvbuff + (size_t)k * bytes;
        if (dst != in)
            memcpy(dst, in, bytes);
        break;
    }
    default: /* barrier: the tag is the message */
        break;
    }
}

static plait_result_t mismatch(const struct plait_op *op, int peer, const char *what)
{
    char who[160];
    return plait_error(PLAIT_ERR_INVALID_USAGE,
                       "%s (operation #%llu, collective #%llu) on rank %d: %s %s: the ranks called mismatched "
                       "collectives (kind, count, type, op or order)",
                       op->name, (unsigned long long)op->seq, (unsigned long long)op->coll_seq, op->comm->rank,
                       plait_peer_str(op->comm, peer, who, sizeof(who)), what);
}

/* Data in a ring FIFO from `peer` while we wait on the small-message path: the
 * peer runs this collective on the FIFO path, so the calls differ. (Point-to-
 * point traffic may legitimately arrive early: only ring classes count.) */
static plait_result_t check_fifo_traffic(const struct plait_op *op, int peer)
{
    const struct plait_comm *comm = op->comm;
    for (int c = 0; c < comm->nchannels; c++) {
        const struct plait_conn *conn = comm->conns[peer * comm->ncls + c];
        if (conn && plait_ld_acquire_u64(conn->rx_tail) > __atomic_load_n(&conn->rx_consumed, __ATOMIC_RELAXED))
            return mismatch(op, peer, "sent collective data through its FIFOs (a larger call?) while this rank "
                                      "waits on the small-message path");
    }
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- over connections */

static plait_result_t op_error(const struct plait_op *op, plait_result_t res)
{
    return plait_error_context(res, "%s (operation #%llu) on rank %d", op->name, (unsigned long long)op->seq,
                               op->comm->rank);
}

/* The small-message connection with peer p: NULL while it is being made, or
 * on failure (*err set). */
static struct plait_conn *msg_conn(struct plait_comm *comm, int p, plait_result_t *err)
{
    struct plait_conn *c =
        __atomic_load_n(&comm->conns[(size_t)p * (size_t)comm->ncls + (size_t)comm->nchannels], __ATOMIC_ACQUIRE);
    if (c)
        return c;
    *err = plait_comm_conn_get(comm, p, comm->nchannels, &c);
    return *err ? NULL : c;
}

/* Whether peer k is known gone (its process exited, or its transport saw
 * its side close). */
static int msg_peer_gone(const struct plait_comm *comm, int k, const struct plait_conn *c)
{
    return (c && plait_conn_peer_gone(c)) ||
           (comm->peer_exited && __atomic_load_n(&comm->peer_exited[k], __ATOMIC_ACQUIRE));
}

/* The message waiting from c's peer (its size in *got), or NULL. Reads
 * rx_consumed atomically: plait_fast_check_mismatch peeks from another lane. */
static const char *msg_peek(const struct plait_conn *c, uint32_t *got)
{
    const uint64_t consumed = __atomic_load_n(&c->rx_consumed, __ATOMIC_RELAXED);
    if (!plait_fifo_can_recv(plait_ld_acquire_u64(c->rx_tail), consumed))
        return NULL;
    const size_t i = plait_fifo_slot(consumed, c->nslots);
    *got = c->rx_sizes[i];
    return c->rx_slots + i * c->slot_bytes;
}

/* The peer is gone (its connection saw the end, or its process exited):
 * what it sent before is still taken. A connection moved by progress (a
 * socket) may hold it unread in the kernel's buffer or still on the way:
 * move it until the message is there or the connection itself has seen the
 * end, for MSG_LAND_S at most (a peer's fd kept open by a child of it never
 * ends). A progress error (the connection failed) ends the wait: the caller
 * reports the peer. */
#define MSG_LAND_S 0.5
static const char *msg_land_last(struct plait_comm *comm, struct plait_conn *c, uint32_t *got)
{
    const char *slot = msg_peek(c, got);
    if (slot || !c->needs_progress)
        return slot;
    const double until = plait_now() + MSG_LAND_S;
    for (;;) {
        const int saw_end = plait_conn_peer_gone(c);
        if (plait_conn_progress(comm, c) != PLAIT_SUCCESS)
            return msg_peek(c, got);
        if ((slot = msg_peek(c, got)) || saw_end || plait_now() > until)
            return slot;
        plait_cpu_relax();
    }
}

static void msg_release(struct plait_conn *c)
{
    const uint64_t next = c->rx_consumed + 1;
    __atomic_store_n(&c->rx_consumed, next, __ATOMIC_RELAXED);
    plait_st_release_u64(c->rx_head, next);
}

static plait_result_t msg_gone(const struct plait_op *op, int k)
{
    return op_error(op, plait_comm_peer_gone(op->comm, k,
                                             op->coll == PLAIT_COLL_BARRIER
                                                 ? "waiting for it to enter the barrier"
                                                 : "waiting for its part on the small-message path"));
}

/* Nothing moved: the communicator's other connections still need their
 * transports' progress (handshakes of connections peers make on first use,
 * sends and receives of other classes: an eager send to this rank completes
 * while it waits here; the mismatch check sees FIFO traffic). */
static int blocked(struct plait_task *t, plait_result_t *err)
{
    const struct plait_op *op = t->op;
    /* Every 16th idle pass: on the net transport it tests every connection's
     * posted receives (a system call each), which would delay seeing the
     * message this call waits for. */
    if ((++t->fast_idle & 15) != 1)
        return FAST_BLOCKED;
    int flushed = 0;
    if ((*err = plait_comm_transports_progress(op->comm, &flushed)) != PLAIT_SUCCESS) {
        *err = op_error(op, *err);
        return FAST_ERROR;
    }
    return FAST_BLOCKED;
}

static int msg_advance(struct plait_task *t, plait_result_t *err)
{
    struct plait_op *op = t->op;
    struct plait_comm *comm = op->comm;
    struct plait_fast *f = comm->fast;
    const int n = comm->nranks, me = comm->rank;
    const uint32_t everyone = (n >= 32 ? ~0u : (1u << n) - 1) & ~(1u << me);
    int moved = 0;
    if (!t->has_step) {
        prepare_own(op, f);
        t->has_step = 1;
        t->fast_next = 0;
        t->fast_sent = 0;
        t->fast_idle = 0;
        moved = 1;
    }
    /* Every peer's message first (in place, alltoall's blocks are then
     * overwritten by what comes in). */
    for (int i = 1; i < n && t->fast_sent != everyone; i++) {
        const int p = (me + i) % n;
        if (t->fast_sent & 1u << p)
            continue;
        plait_result_t e = PLAIT_SUCCESS;
        struct plait_conn *c = msg_conn(comm, p, &e);
        if (e) {
            *err = op_error(op, e);
            return FAST_ERROR;
        }
        if (!c) {
            /* a same-host peer known gone makes no half of anything */
            if (msg_peer_gone(comm, p, NULL)) {
                *err = op_error(op, plait_comm_peer_gone(comm, p, "waiting for its side of a connection made on "
                                                                  "first use"));
                return FAST_ERROR;
            }
            continue;
        }
        char *slot = plait_conn_send_slot(c);
        if (slot) {
            const size_t len = BOX_HDR + fill_for(op, p, slot + BOX_HDR);
            memcpy(slot, &op->fast_tag, BOX_HDR);
            plait_conn_send_commit(c, (uint32_t)len);
            t->fast_sent |= 1u << p;
            moved = 1;
        }
        if (c->needs_progress && (e = plait_conn_progress(comm, c))) {
            *err = op_error(op, e);
            return FAST_ERROR;
        }
    }
    if (t->fast_sent != everyone)
        return moved ? FAST_PROGRESSED : blocked(t, err);
    while (t->fast_next < n) {
        const int k = t->fast_next;
        if (k == me) {
            consume(op, k, op->fast_own);
            t->fast_next++;
            moved = 1;
            continue;
        }
        struct plait_conn *c =
            comm->conns[(size_t)k * (size_t)comm->ncls + (size_t)comm->nchannels]; /* made: we sent on it */
        /* Look first: the progress after our own send often landed it,
         * and another would cost a system call that finds nothing. */
        uint32_t got = 0;
        const char *slot = msg_peek(c, &got);
        plait_result_t e;
        if (!slot && c->needs_progress) {
            if ((e = plait_conn_progress(comm, c))) {
                *err = op_error(op, e);
                return FAST_ERROR;
            }
            slot = msg_peek(c, &got);
        }
        if (!slot) {
            /* What a peer sent before it went is still taken: look again
             * after seeing it gone. */
            if (msg_peer_gone(comm, k, c) && !(slot = msg_land_last(comm, c, &got))) {
                /* a peer that left after sending this collective through
                 * its FIFOs called another one: say that, not only "gone" */
                if ((*err = check_fifo_traffic(op, k)) == PLAIT_SUCCESS)
                    *err = msg_gone(op, k);
                return FAST_ERROR;
            }
            if (!slot) {
                if ((++t->fast_polls & 1023) == 0 && (*err = check_fifo_traffic(op, k)) != PLAIT_SUCCESS)
                    return FAST_ERROR;
                return moved ? FAST_PROGRESSED : blocked(t, err);
            }
        }
        uint64_t tag;
        memcpy(&tag, slot, sizeof(tag));
        const size_t want = BOX_HDR + data_from(op, k);
        if (tag != op->fast_tag || got != want) {
            char what[200];
            snprintf(what, sizeof(what),
                     "sent small-message call #%llu, collective #%llu (%u bytes) where this rank is in call #%llu, "
                     "collective #%llu (%zu bytes)",
                     (unsigned long long)(tag >> 32), (unsigned long long)(tag >> 20 & 0xfff),
                     got > BOX_HDR ? got - BOX_HDR : 0, (unsigned long long)(op->fast_tag >> 32),
                     (unsigned long long)(op->fast_tag >> 20 & 0xfff), want - BOX_HDR);
            *err = mismatch(op, k, what);
            return FAST_ERROR;
        }
        consume(op, k, slot + BOX_HDR);
        msg_release(c);
        t->fast_next++;
        moved = 1;
    }
    return FAST_DONE;
}

/* ---------------------------------------------------------------- one pass */

int plait_fast_advance(struct plait_task *t, plait_result_t *err)
{
    struct plait_op *op = t->op;
    struct plait_comm *comm = op->comm;
    struct plait_fast *f = comm->fast;
    const int n = comm->nranks, me = comm->rank;
    const size_t parity_off = (size_t)(op->fast_seq & 1) * BOX_BYTES;
    int moved = 0;
    if (f->msg)
        return msg_advance(t, err);
    if (!t->has_step) {
        post(op, f, parity_off);
        t->has_step = 1;
        t->fast_next = 0;
        moved = 1;
    }
    while (t->fast_next < n) {
        const int k = t->fast_next;
        const char *in = op->fast_own;
        if (k != me) {
            const char *box = f->rx[k] + parity_off;
            uint64_t tag = __atomic_load_n((const uint64_t *)box, __ATOMIC_ACQUIRE);
            if (tag != op->fast_tag) {
                if (tag >> 32 == op->fast_tag >> 32) {
                    *err = mismatch(op, k, "is in a different collective at the same point");
                    return FAST_ERROR;
                }
                /* A peer seen gone (plait_comm_check_peers, every millisecond
                 * of a wait) fills no more boxes. Its exit came after its last
                 * stores, so the tag is read once more after the flag: a box
                 * it filled before dying is still taken. */
                if (comm->peer_exited && __atomic_load_n(&comm->peer_exited[k], __ATOMIC_ACQUIRE) &&
                    (tag = __atomic_load_n((const uint64_t *)box, __ATOMIC_ACQUIRE)) != op->fast_tag) {
                    *err = plait_error_context(plait_comm_peer_gone(comm, k,
                                                                    op->coll == PLAIT_COLL_BARRIER
                                                                        ? "waiting for it to enter the barrier"
                                                                        : "waiting for its part on the small-message "
                                                                          "path"),
                                               "%s (operation #%llu) on rank %d", op->name,
                                               (unsigned long long)op->seq, me);
                    return FAST_ERROR;
                }
                if (tag == op->fast_tag)
                    continue; /* taken on the next turn */
                if ((++t->fast_polls & 1023) == 0 && (*err = check_fifo_traffic(op, k)) != PLAIT_SUCCESS)
                    return FAST_ERROR;
                return moved ? FAST_PROGRESSED : FAST_BLOCKED;
            }
            in = box + BOX_HDR;
        }
        consume(op, k, in);
        t->fast_next++;
        moved = 1;
    }
    return FAST_DONE;
}

plait_result_t plait_fast_check_mismatch(const struct plait_op *op)
{
    const struct plait_comm *comm = op->comm;
    const struct plait_fast *f = comm->fast;
    if (!f || !op->coll_seq)
        return PLAIT_SUCCESS;
    const size_t parity_off = (size_t)(op->fast_seq & 1) * BOX_BYTES;
    for (int k = 0; k < comm->nranks; k++) {
        if (k == comm->rank)
            continue;
        uint64_t tag;
        if (f->msg) {
            const struct plait_conn *c = __atomic_load_n(
                &comm->conns[(size_t)k * (size_t)comm->ncls + (size_t)comm->nchannels], __ATOMIC_ACQUIRE);
            uint32_t got;
            const char *slot = c ? msg_peek(c, &got) : NULL;
            if (!slot)
                continue;
            tag = __atomic_load_n((const uint64_t *)slot, __ATOMIC_RELAXED);
        } else {
            tag = __atomic_load_n((const uint64_t *)(f->rx[k] + parity_off), __ATOMIC_ACQUIRE);
        }
        if (tag >> 32 == (op->fast_seq & 0xffffffffull) && (tag >> 20 & 0xfff) == (op->coll_seq & 0xfff))
            return mismatch(op, k, "runs this collective on the small-message path (a smaller call?) while this "
                                   "rank runs it through the FIFOs");
    }
    return PLAIT_SUCCESS;
}

void plait_fast_waits(const struct plait_task *t, struct plait_waits *w)
{
    const struct plait_op *op = t->op;
    const struct plait_comm *comm = op->comm;
    const struct plait_fast *f = comm->fast;
    if (!f || !t->has_step)
        return;
    const size_t parity_off = (size_t)(op->fast_seq & 1) * BOX_BYTES;
    if (f->msg) {
        const int everyone_sent = t->fast_sent == ((comm->nranks >= 32 ? ~0u : (1u << comm->nranks) - 1) &
                                                   ~(1u << comm->rank));
        for (int k = 0; k < comm->nranks; k++) {
            if (k == comm->rank)
                continue;
            const struct plait_conn *c = __atomic_load_n(
                &comm->conns[(size_t)k * (size_t)comm->ncls + (size_t)comm->nchannels], __ATOMIC_ACQUIRE);
            uint32_t got;
            if (!(t->fast_sent & 1u << k))
                plait_waits_add(w, k, c ? "room for this rank's small-message part (it has not read the last ones)"
                                        : "its side of the small-message connection (made on first use)");
            else if (everyone_sent && k >= t->fast_next && !(c && msg_peek(c, &got)))
                plait_waits_add(w, k,
                                op->coll == PLAIT_COLL_BARRIER ? "its entry into the barrier"
                                                               : "its part on the small-message path");
        }
        return;
    }
    for (int k = t->fast_next; k < comm->nranks; k++)
        if (k != comm->rank &&
            __atomic_load_n((const uint64_t *)(f->rx[k] + parity_off), __ATOMIC_ACQUIRE) != op->fast_tag)
            plait_waits_add(w, k,
                            op->coll == PLAIT_COLL_BARRIER ? "its entry into the barrier"
                                                           : "its part on the small-message path");
}

/* The checks a waiting rank makes every millisecond (as the executor does). */
static plait_result_t idle_checks(const struct plait_task *t, const struct plait_waiter *w)
{
    const struct plait_op *op = t->op;
    struct plait_comm *c = op->comm;
    plait_result_t res = plait_comm_check_waiting(c);
    if (res)
        return plait_error_context(res, "%s (operation #%llu) on rank %d", op->name, (unsigned long long)op->seq,
                                   c->rank);
    if (plait_wait_expired(w)) {
        struct plait_waits ws = {0};
        plait_fast_waits(t, &ws);
        return plait_timeout_error(op, c->set.coll_timeout_s, &ws);
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_fast_run(struct plait_op *op)
{
    struct plait_comm *comm = op->comm;
    plait_result_t status = PLAIT_SUCCESS;
    /* An abort either waits for us or is seen here before the segments are
     * touched (plait_op_enter). */
    if (plait_op_enter(comm)) {
        status = plait_error(PLAIT_ERR_INVALID_USAGE, "%s: rank %d: the communicator was aborted", op->name,
                             comm->rank);
        plait_op_leave(comm);
        return status;
    }
    plait_op_issued(comm);
    struct plait_task t;
    t.op = op;
    t.has_step = 0;
    t.fast_next = 0;
    t.fast_polls = 0;
    /* The waiter reads the clock only once the rank has to wait: a call that
     * finds its peers' data spends no time on it. */
    struct plait_waiter w;
    plait_waiter_init(&w, comm->spin_ns, comm->set.coll_timeout_s);
    plait_waiter_cheap_polls(&w);
    for (;;) {
        int r = plait_fast_advance(&t, &status);
        if (r == FAST_DONE)
            break;
        if (r == FAST_ERROR)
            goto failed;
        if (r == FAST_PROGRESSED) {
            plait_wait_moved(&w);
            continue;
        }
        if (plait_wait_idle(&w) && (status = idle_checks(&t, &w)) != PLAIT_SUCCESS)
            goto failed;
    }
    /* Over connections, this rank's messages must have left before the call
     * returns: a transport that moves them in progress() (the net transport,
     * whose provider may have written part of one) gets no other progress
     * once the caller goes on. Only the small-message class: another class
     * may hold an eager send its peer takes later. */
    if (comm->fast->msg)
        for (int p = 0; p < comm->nranks; p++) {
            struct plait_conn *c = p == comm->rank ? NULL : comm->conns[(size_t)p * (size_t)comm->ncls +
                                                                        (size_t)comm->nchannels];
            while (c && c->needs_progress && !c->tp->is_flushed(c->ctx, c)) {
                if ((status = plait_conn_progress(comm, c)) != PLAIT_SUCCESS) {
                    status = op_error(op, status);
                    goto failed;
                }
                if (plait_conn_peer_gone(c) && !c->tp->is_flushed(c->ctx, c)) {
                    status = op_error(op, plait_comm_peer_gone(comm, p, "before it received our part"));
                    goto failed;
                }
                if (plait_wait_idle(&w) && (status = idle_checks(&t, &w)) != PLAIT_SUCCESS)
                    goto failed;
            }
        }
    plait_op_completed(comm);
    plait_op_leave(comm);
    return PLAIT_SUCCESS;

failed:
    /* The boxes' state is unknown after a failure: the communicator refuses
     * further work, as after a failure on the FIFO path. */
    plait_comm_mark_failed(comm, status);
    plait_op_completed(comm);
    plait_op_leave(comm);
    return status;
}
