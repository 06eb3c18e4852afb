/* The CPU executor: runs the steps of every task of a set of operations, on the
 * calling thread, until all are done (docs/architecture.md, sections 2 and 8).
 *
 * Each task is a non-blocking state machine: advance() does every piece it can
 * without waiting and reports PROGRESSED, BLOCKED or DONE. One loop drives every
 * task of the set, across communicators, so a thread can run a group spanning
 * several communicators without deadlock. When nothing moves, the loop polls for
 * a bounded time, then yields the core (ranks may outnumber cores), and every
 * millisecond checks the abort flags, the peers' liveness and the deadline. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/fastpath.h"
#include "core/progress.h"
#include "algorithms/stepper.h"
#include "core/cuda/cuda.h"
#include "base/log.h"
#include "base/util.h"

/* plait_fast_advance (fastpath.c) returns the same codes. */
enum { ADV_BLOCKED = 0, ADV_PROGRESSED = 1, ADV_DONE = 2, ADV_ERROR = 3 };

/* Upper bound of pieces one advance() call moves, so that one busy task cannot
 * starve the others of the loop (their peers wait on them). */
#define PIECES_PER_ADVANCE 16

static const char *buf_ptr(const struct plait_op *op, int which)
{
    return which == PLAIT_BUF_INPUT ? op->sendbuff : which == PLAIT_BUF_OUTPUT ? op->recvbuff : op->scratch;
}

static plait_result_t peer_gone_error(const struct plait_task *t, int peer, const char *what)
{
    const struct plait_op *op = t->op;
    /* A peer that ran this collective on the small-message path found the
     * calls mismatched and left: its message may still be on the way (over
     * connections it lands only with progress). Say that rather than "gone". */
    if (op->comm->fast && op->coll_seq) {
        int flushed = 0;
        (void)plait_comm_transports_progress(op->comm, &flushed);
        plait_result_t m = plait_fast_check_mismatch(op);
        if (m)
            return m;
    }
    plait_result_t res = plait_comm_peer_gone(op->comm, peer, what);
    return plait_error_context(res, "%s (operation #%llu) on rank %d", op->name, (unsigned long long)op->seq,
                               op->comm->rank);
}

static plait_result_t conn_progress(struct plait_comm *comm, struct plait_conn *c)
{
    return plait_conn_progress(comm, c);
}

static int fetch_step(struct plait_task *t)
{
    if (t->gen)
        return t->gen(&t->op->args, t->cls, t->step_idx, &t->step);
    return t->step_idx == 0;
}

/* The connection of a step's peer on the task's class, or an error: a step to
 * a peer the class does not connect is a generator/peer-set mismatch. */
static struct plait_conn *step_conn(struct plait_task *t, int peer, const char *dir, plait_result_t *err)
{
    struct plait_op *op = t->op;
    struct plait_comm *comm = op->comm;
    struct plait_conn *c = peer >= 0 && peer < comm->nranks ? comm->conns[peer * comm->ncls + t->cls] : NULL;
    if (!c) {
        *err = plait_error(PLAIT_ERR_INTERNAL,
                           "%s (operation #%llu) on rank %d: the schedule %s rank %d on channel %d, which has no "
                           "connection there (a generator/peer-set mismatch)",
                           op->name, (unsigned long long)op->seq, comm->rank, dir, peer, t->cls);
        return NULL;
    }
    if (c->needs_progress && (*err = conn_progress(comm, c)) != PLAIT_SUCCESS)
        return NULL;
    return c;
}

/* Whether the connections of the task's current step exist (1), are being
 * made (0: the task waits, the loop goes on), or cannot be (-1, *err). */
static int step_conns_ready(struct plait_task *t, plait_result_t *err)
{
    const struct plait_step *st = &t->step;
    if (st->count == 0 || st->kind == PLAIT_STEP_COPY || st->kind == PLAIT_STEP_REDUCE)
        return 1;
    const int sr = plait_step_is_sendrecv(st->kind);
    const unsigned ops = sr ? PLAIT_PIECE_RECV | PLAIT_PIECE_SEND : plait_piece_ops(st->kind);
    struct plait_comm *comm = t->op->comm;
    int ready = 1;
    for (int k = 0; k < 2; k++) {
        if (!(ops & (k ? PLAIT_PIECE_SEND : PLAIT_PIECE_RECV)))
            continue;
        const int peer = k ? st->send_peer : st->recv_peer;
        if (peer >= 0 && peer < comm->nranks &&
            __atomic_load_n(&comm->conns[peer * comm->ncls + t->cls], __ATOMIC_ACQUIRE))
            continue;
        if (peer < 0 || peer >= comm->nranks || !plait_conn_needed(comm, comm->rank, peer, t->cls)) {
            struct plait_op *op = t->op;
            *err = plait_error(PLAIT_ERR_INTERNAL,
                               "%s (operation #%llu) on rank %d: the schedule %s rank %d on channel %d, which has no "
                               "connection there (a generator/peer-set mismatch)",
                               op->name, (unsigned long long)op->seq, comm->rank, k ? "sends to" : "receives from",
                               peer, t->cls);
            return -1;
        }
        struct plait_conn *c = NULL;
        if ((*err = plait_comm_conn_get(comm, peer, t->cls, &c)))
            return -1;
        if (!c) {
            /* a same-host peer known gone makes no half of anything */
            if (comm->peer_exited && __atomic_load_n(&comm->peer_exited[peer], __ATOMIC_SEQ_CST)) {
                *err = peer_gone_error(t, peer, "waiting for its side of a connection made on first use");
                return -1;
            }
            ready = 0;
        }
    }
    return ready;
}

static plait_result_t size_mismatch(const struct plait_task *t, int peer, uint64_t got, size_t bytes)
{
    const struct plait_op *op = t->op;
    char who[160];
    return plait_error(PLAIT_ERR_INVALID_USAGE,
                       "%s (operation #%llu) on rank %d: received %llu bytes from %s where %zu were expected: the "
                       "ranks called mismatched operations (count, type or order)",
                       op->name, (unsigned long long)op->seq, op->comm->rank, (unsigned long long)got,
                       plait_peer_str(op->comm, peer, who, sizeof(who)), bytes);
}

/* ---------------------------------------------------------------- single copy
 *
 * A step whose sent bytes sit unchanged in one of this rank's buffers (SEND of
 * a plain copy, the send half of SENDRECV and SENDRECV_REDUCE, the forward of
 * RECV_COPY_SEND and RECV_REDUCE_COPY_SEND once their dst is complete) and that
 * is at least PLAIT_CMA_MIN_BYTES long publishes, on a connection with single
 * copy (sc_mode), one descriptor of those bytes instead of copying them into
 * slots. The step is then over, but its task keeps the descriptor (sc_pend)
 * until the receiver has released the slot: until then the task writes none
 * of those bytes and is not done, so the operation does not return while a
 * peer may still read the buffer. That makes a large send a rendezvous (a
 * lone plait_send returns once its receiver has read it; send and receive
 * belong in one group, as NCCL requires), and a task that overwrites bytes it
 * published (the final COPY of Bruck, recursive doubling, PAT) waits for the
 * reader, which in every generator of the table reaches its reading step
 * without needing anything the writer does afterwards (docs/algorithms.md,
 * the verifier's limits).
 *
 * A receiving step that finds a descriptor reads the bytes in the sender's
 * memory: straight into dst when it only copies them (RECV, and the receive of
 * RECV_COPY_SEND), one piece at a time otherwise (into the connection's bounce
 * buffer with process_vm_readv, in place for a thread of this process), and
 * releases the slot once the whole range is consumed. The descriptor comes from
 * another process: its size word, length and address range are checked, and a
 * read that fails is an error naming the peer, never a crash. */

/* Pieces a receive reads in one call when it reads a descriptor straight into
 * dst (counted once against PIECES_PER_ADVANCE). */
#define SC_BULK_PIECES 4

/* Drops the descriptors whose slots the receivers have released (acquire: their
 * reads are complete); returns how many are left. */
static int sc_prune(struct plait_task *t)
{
    int k = 0;
    for (int i = 0; i < t->sc_npend; i++)
        if (plait_ld_acquire_u64(t->sc_pend[i].conn->tx_head) <= t->sc_pend[i].seq)
            t->sc_pend[k++] = t->sc_pend[i];
    t->sc_npend = (uint8_t)k;
    return k;
}

/* Whether a send of `bytes` on c goes as a descriptor. */
static int sc_wants(struct plait_task *t, const struct plait_conn *c, uint64_t bytes)
{
    const struct plait_settings *set = &t->op->comm->set;
    /* A descriptor makes a send wait until it is read. A point-to-point send
     * issued on its own (no group) keeps the FIFO's buffering instead: two
     * ranks that each send before they receive worked before single copy
     * (up to PLAIT_BUFFSIZE) and must keep working. */
    if (t->cls == t->op->comm->ncls - 1 && !t->op->grouped)
        return 0;
    if (c->sc_mode == PLAIT_SC_NONE || bytes == 0 ||
        bytes < (c->sc_mode == PLAIT_SC_READ ? set->cma_min_bytes : set->cma_local_min_bytes))
        return 0;
    return t->sc_npend < PLAIT_SC_PENDING || sc_prune(t) < PLAIT_SC_PENDING;
}

/* An error when the peer holding one of the task's descriptors is gone: it
 * will never release it. */
static plait_result_t sc_pending_gone(const struct plait_task *t)
{
    for (int i = 0; i < t->sc_npend; i++)
        if (plait_conn_peer_gone(t->sc_pend[i].conn))
            return peer_gone_error(t, t->sc_pend[i].conn->peer,
                                   "before it read the bytes this rank published for single copy");
    return PLAIT_SUCCESS;
}

/* Before the task writes [p, p + len): 1 when that overlaps a descriptor not
 * yet released (wait), 0 when the write may go ahead, -1 on error (*err). */
static int sc_must_wait(struct plait_task *t, const char *p, uint64_t len, plait_result_t *err)
{
    if (!t->sc_npend || !sc_prune(t))
        return 0;
    for (int i = 0; i < t->sc_npend; i++) {
        const struct plait_sc_pending *d = &t->sc_pend[i];
        if (p < d->addr + d->len && d->addr < p + len) {
            if ((*err = sc_pending_gone(t)))
                return -1;
            return 1;
        }
    }
    return 0;
}

/* Publishes [addr, addr + len) in `slot`, c's next free slot. */
static void sc_publish(struct plait_task *t, struct plait_conn *c, void *slot, const char *addr, uint64_t len)
{
    const struct plait_sc_desc d = {(uint64_t)(uintptr_t)addr, len, 0};
    memcpy(slot, &d, sizeof(d));
    struct plait_sc_pending *p = &t->sc_pend[t->sc_npend++];
    p->conn = c;
    p->seq = c->tx_posted;
    p->addr = addr;
    p->len = len;
    p->state = &((struct plait_sc_desc *)slot)->state;
    plait_conn_send_commit(c, PLAIT_SLOT_DESC | (uint32_t)sizeof(d));
    c->sc_tx_descs++;
}

/* Publishes [addr, addr + len) on c once a slot is free: 1 published, 0 no
 * free slot yet (wait), -1 the peer is gone (*err). */
static int sc_try_publish(struct plait_task *t, struct plait_conn *c, const char *addr, uint64_t len,
                          plait_result_t *err)
{
    void *slot = plait_conn_send_slot(c);
    if (!slot) {
        if (!plait_conn_peer_gone(c))
            return 0;
        *err = peer_gone_error(t, c->peer, "waiting for it to drain its buffers");
        return -1;
    }
    sc_publish(t, c, slot, addr, len);
    return 1;
}

/* Takes the descriptor in `slot` (size word `got`), at the head of c's FIFO,
 * for the rest of the step: it must cover exactly the (count - done) elements
 * the step still expects. */
static plait_result_t sc_take(struct plait_task *t, const struct plait_conn *c, const void *slot, uint32_t got,
                              uint64_t done, uint64_t count)
{
    const struct plait_op *op = t->op;
    char who[160];
    struct plait_sc_desc d;
    if (c->sc_mode == PLAIT_SC_NONE || (got & ~PLAIT_SLOT_DESC) != sizeof(d))
        return plait_error(PLAIT_ERR_REMOTE,
                           "%s (operation #%llu) on rank %d: %s sent a malformed single-copy descriptor (size word "
                           "0x%x%s)",
                           op->name, (unsigned long long)op->seq, op->comm->rank,
                           plait_peer_str(op->comm, c->peer, who, sizeof(who)), got,
                           c->sc_mode == PLAIT_SC_NONE ? ", on a connection without single copy" : "");
    memcpy(&d, slot, sizeof(d));
    const uint64_t want = (count - done) * op->esize;
    if (d.len != want)
        return size_mismatch(t, c->peer, d.len, want);
    if (d.addr == 0 || d.addr + d.len < d.addr)
        return plait_error(PLAIT_ERR_REMOTE,
                           "%s (operation #%llu) on rank %d: %s sent a single-copy descriptor with a bad address "
                           "(0x%llx, %llu bytes)",
                           op->name, (unsigned long long)op->seq, op->comm->rank,
                           plait_peer_str(op->comm, c->peer, who, sizeof(who)), (unsigned long long)d.addr,
                           (unsigned long long)d.len);
    t->sc_rx_active = 1;
    t->sc_rx_addr = d.addr;
    t->sc_rx_base = done;
    return PLAIT_SUCCESS;
}

/* The address in the sender of element `at` of the step's receive. */
static uint64_t sc_rx_at(const struct plait_task *t, uint64_t at)
{
    return t->sc_rx_addr + (at - t->sc_rx_base) * t->op->esize;
}

/* Copies len bytes at the peer's address `addr` into dst. */
static plait_result_t sc_copy(const struct plait_task *t, const struct plait_conn *c, void *dst, uint64_t addr,
                              size_t len)
{
    if (c->sc_mode == PLAIT_SC_LOCAL) {
        /* memmove: a rank sending to itself may name one buffer twice */
        memmove(dst, (const void *)(uintptr_t)addr, len);
        return PLAIT_SUCCESS;
    }
    size_t done = 0;
    const int e = c->tp->remote_read ? c->tp->remote_read(c, dst, addr, len, &done) : ENOSYS;
    if (e == 0)
        return PLAIT_SUCCESS;
    if (e == ESRCH)
        return peer_gone_error(t, c->peer, "while this rank read the bytes it published for single copy");
    {
        const struct plait_op *op = t->op;
        char who[160];
        return plait_error(PLAIT_ERR_REMOTE,
                           "%s (operation #%llu) on rank %d: single-copy read of %zu bytes at 0x%llx in the memory "
                           "of %s failed after %zu bytes: %s",
                           op->name, (unsigned long long)op->seq, op->comm->rank, len, (unsigned long long)addr,
                           plait_peer_str(op->comm, c->peer, who, sizeof(who)), done,
                           e == EIO ? "no progress" : strerror(e));
    }
}

/* Reads len bytes at the peer's address `addr` into dst, from the descriptor
 * at the head of c's FIFO, unless its sender has withdrawn it. */
static plait_result_t sc_read(const struct plait_task *t, const struct plait_conn *c, void *dst, uint64_t addr,
                              size_t len)
{
    uint64_t *state = &((struct plait_sc_desc *)(uintptr_t)(c->rx_slots + (size_t)(c->rx_consumed % c->nslots) *
                                                                                c->slot_bytes))->state;
    const int revoked = (__atomic_add_fetch(state, 1, __ATOMIC_SEQ_CST) & PLAIT_SC_REVOKED) != 0;
    plait_result_t res = revoked ? PLAIT_SUCCESS : sc_copy(t, c, dst, addr, len);
    /* Release: the reads are done before the sender can see no reader left. */
    const uint64_t after = __atomic_sub_fetch(state, 1, __ATOMIC_ACQ_REL);
    if (!revoked && !(after & PLAIT_SC_REVOKED))
        return res;
    const struct plait_op *op = t->op;
    char who[160];
    return plait_error(PLAIT_ERR_REMOTE,
                       "%s (operation #%llu) on rank %d: %s withdrew the bytes it published for single copy before "
                       "this rank had read them (its operation failed or was aborted)",
                       op->name, (unsigned long long)op->seq, op->comm->rank,
                       plait_peer_str(op->comm, c->peer, who, sizeof(who)));
}

/* Withdraws the descriptors that the tasks of a failed run published and no
 * receiver has released, before the run returns and the user may free or
 * change those bytes: a reader that has not started sees PLAIT_SC_REVOKED and
 * fails; one that has is waited for. A thread of this process always finishes
 * its memcpy; a process may have died in the middle of its read, so that wait
 * is bounded. */
static void sc_revoke(struct plait_task *const *all, int n)
{
    for (int i = 0; i < n; i++) {
        struct plait_task *t = all[i];
        for (int k = 0; k < t->sc_npend; k++) {
            const struct plait_sc_pending *p = &t->sc_pend[k];
            if (plait_ld_acquire_u64(p->conn->tx_head) > p->seq)
                continue;
            uint64_t v = __atomic_or_fetch(p->state, PLAIT_SC_REVOKED, __ATOMIC_SEQ_CST);
            const uint64_t until = plait_now_ns() + 1000000000ull;
            while ((v & ~PLAIT_SC_REVOKED) &&
                   (p->conn->sc_mode == PLAIT_SC_LOCAL || plait_now_ns() < until)) {
                sched_yield();
                v = __atomic_load_n(p->state, __ATOMIC_ACQUIRE);
            }
        }
        t->sc_npend = 0;
    }
}

/* The descriptor at the head of c is consumed: give its slot back. */
static void sc_done_reading(struct plait_task *t, struct plait_conn *c)
{
    t->sc_rx_active = 0;
    c->sc_rx_descs++;
    plait_conn_recv_release(c);
}

/* A SENDRECV step: its two halves move independently, each piece as soon as
 * its own resource (credit, or a filled slot) is there. Returns like
 * task_advance; *done when both halves are complete. */
static int sendrecv_advance(struct plait_task *t, int *done, plait_result_t *err)
{
    struct plait_op *op = t->op;
    const size_t es = op->esize;
    const struct plait_step *st = &t->step;
    const uint64_t piece_max = plait_piece_max(op->comm->set.slot_bytes, es, PLAIT_WIRE_SIMPLE);
    int moved = 0;
    *done = 0;
    struct plait_conn *sc = step_conn(t, st->send_peer, "sends to", err);
    if (!sc)
        return ADV_ERROR;
    struct plait_conn *rc = step_conn(t, st->recv_peer, "receives from", err);
    if (!rc)
        return ADV_ERROR;
    /* The send half sends src unchanged: one descriptor when it is large. */
    if (t->piece_off == 0 && sc_wants(t, sc, st->count * es)) {
        void *out = plait_conn_send_slot(sc);
        if (out) {
            sc_publish(t, sc, out, buf_ptr(op, st->src_buf) + st->src_off * es, st->count * es);
            t->piece_off = st->count;
            moved = 1;
        }
    }
    for (int budget = 0; budget < PIECES_PER_ADVANCE && t->piece_off < st->count; budget++) {
        void *out = plait_conn_send_slot(sc);
        if (!out) {
            if (plait_conn_peer_gone(sc)) {
                *err = peer_gone_error(t, st->send_peer, "waiting for it to drain its buffers");
                return ADV_ERROR;
            }
            break;
        }
        const uint64_t n = plait_piece_elems(st->count, t->piece_off, piece_max);
        memcpy(out, buf_ptr(op, st->src_buf) + (st->src_off + t->piece_off) * es, (size_t)n * es);
        plait_conn_send_commit(sc, (uint32_t)(n * es));
        if (sc->needs_progress && (*err = conn_progress(op->comm, sc)) != PLAIT_SUCCESS)
            return ADV_ERROR;
        t->piece_off += n;
        moved = 1;
    }
    for (int budget = 0; budget < PIECES_PER_ADVANCE && t->recv_off < st->count; budget++) {
        uint32_t got = 0;
        const void *in = plait_conn_recv_slot(rc, &got);
        if (!in) {
            if (plait_conn_peer_gone(rc)) {
                *err = peer_gone_error(t, st->recv_peer, "waiting for its data");
                return ADV_ERROR;
            }
            break;
        }
        uint64_t n = plait_piece_elems(st->count, t->recv_off, piece_max);
        const int from_desc = t->sc_rx_active || (got & PLAIT_SLOT_DESC);
        if (from_desc) {
            if (!t->sc_rx_active && (*err = sc_take(t, rc, in, got, t->recv_off, st->count)))
                return ADV_ERROR;
            if (st->kind == PLAIT_STEP_SENDRECV)
                n = plait_min_u64(st->count - t->recv_off, SC_BULK_PIECES * piece_max);
        } else if (got != n * es) {
            *err = size_mismatch(t, st->recv_peer, got, (size_t)(n * es));
            return ADV_ERROR;
        }
        char *dst = (char *)buf_ptr(op, st->dst_buf) + (st->dst_off + t->recv_off) * es;
        const int wait = sc_must_wait(t, dst, n * es, err);
        if (wait < 0)
            return ADV_ERROR;
        if (wait)
            break;
        if (from_desc) {
            const uint64_t at = sc_rx_at(t, t->recv_off);
            if (st->kind == PLAIT_STEP_SENDRECV) {
                if ((*err = sc_read(t, rc, dst, at, (size_t)(n * es))))
                    return ADV_ERROR;
            } else {
                in = rc->sc_mode == PLAIT_SC_LOCAL ? (const void *)(uintptr_t)at : rc->sc_bounce;
                if (in == rc->sc_bounce && (*err = sc_read(t, rc, rc->sc_bounce, at, (size_t)(n * es))))
                    return ADV_ERROR;
                plait_reduce_apply(&op->red, dst, dst, in, (size_t)n, st->flags & PLAIT_STEP_POST);
            }
            t->recv_off += n;
            if (t->recv_off >= st->count)
                sc_done_reading(t, rc);
            moved = 1;
            continue;
        }
        if (plait_sendrecv_reduces(st->kind))
            plait_reduce_apply(&op->red, dst, dst, in, (size_t)n, st->flags & PLAIT_STEP_POST);
        else
            memcpy(dst, in, (size_t)n * es);
        plait_conn_recv_release(rc);
        t->recv_off += n;
        moved = 1;
    }
    *done = t->piece_off >= st->count && t->recv_off >= st->count;
    return moved ? ADV_PROGRESSED : ADV_BLOCKED;
}

/* Moves pieces of the task's current and following steps until it would wait. */
static int task_advance(struct plait_task *t, plait_result_t *err)
{
    if (t->is_fast)
        return plait_fast_advance(t, err);
    struct plait_op *op = t->op;
    struct plait_comm *comm = op->comm;
    const size_t es = op->esize;
    int progressed = 0;
    for (int budget = 0; budget < PIECES_PER_ADVANCE; budget++) {
        if (!t->has_step) {
            if (!fetch_step(t)) {
                /* Done once every descriptor it published has been read. */
                if (t->sc_npend && sc_prune(t)) {
                    if ((*err = sc_pending_gone(t)))
                        return ADV_ERROR;
                    return progressed ? ADV_PROGRESSED : ADV_BLOCKED;
                }
                return ADV_DONE;
            }
            t->has_step = 1;
            t->piece_off = 0;
            t->recv_off = 0;
            t->sc_rx_active = 0;
            t->sc_fwd = 0;
            t->step_ready = 0;
        }
        if (!t->step_ready) {
            /* A step starts once its connections exist: those not made at
             * init are made on first use, without blocking the loop. */
            const int ready = step_conns_ready(t, err);
            if (ready < 0)
                return ADV_ERROR;
            if (!ready)
                return progressed ? ADV_PROGRESSED : ADV_BLOCKED;
            t->step_ready = 1;
            /* A forwarding step sends what it writes to dst: when that is
             * large, it receives (and reduces) the whole step first, then
             * publishes dst as one descriptor. Decided here, once: nothing
             * else of this task publishes before it, so the room in sc_pend
             * found now is still there then. */
            if ((t->step.kind == PLAIT_STEP_RECV_COPY_SEND || t->step.kind == PLAIT_STEP_RECV_REDUCE_COPY_SEND) &&
                t->step.count > 0) {
                struct plait_conn *c = step_conn(t, t->step.send_peer, "sends to", err);
                if (!c)
                    return ADV_ERROR;
                t->sc_fwd = (uint8_t)sc_wants(t, c, t->step.count * es);
            }
        }
        struct plait_step *st = &t->step;
        if (plait_step_is_sendrecv(st->kind)) {
            int done = 0;
            int r = st->count > 0 ? sendrecv_advance(t, &done, err) : (done = 1, ADV_PROGRESSED);
            if (r == ADV_ERROR)
                return ADV_ERROR;
            if (!done)
                return (progressed || r == ADV_PROGRESSED) ? ADV_PROGRESSED : ADV_BLOCKED;
            t->has_step = 0;
            t->step_idx++;
            progressed = 1;
            continue;
        }
        if (st->kind == PLAIT_STEP_COPY || st->kind == PLAIT_STEP_REDUCE) {
            const char *src = buf_ptr(op, st->src_buf) + st->src_off * es;
            char *dst = (char *)buf_ptr(op, st->dst_buf) + st->dst_off * es;
            if (plait_local_step_writes(st, src == dst)) {
                const int wait = sc_must_wait(t, dst, st->count * es, err);
                if (wait < 0)
                    return ADV_ERROR;
                if (wait)
                    return progressed ? ADV_PROGRESSED : ADV_BLOCKED;
                if (st->kind == PLAIT_STEP_REDUCE)
                    plait_reduce_apply(&op->red, dst, src, dst, st->count, st->flags);
                else if (st->flags)
                    plait_reduce_apply(&op->red, dst, src, NULL, st->count, st->flags);
                else
                    memcpy(dst, src, st->count * es);
            }
            t->has_step = 0;
            t->step_idx++;
            progressed = 1;
            continue;
        }
        if (t->piece_off >= st->count) {
            if (t->sc_fwd) {
                /* dst holds the whole step now: forward it as one descriptor. */
                struct plait_conn *c = step_conn(t, st->send_peer, "sends to", err);
                if (!c)
                    return ADV_ERROR;
                const int r = sc_try_publish(t, c, buf_ptr(op, st->dst_buf) + st->dst_off * es, st->count * es, err);
                if (r < 0)
                    return ADV_ERROR;
                if (r == 0)
                    return progressed ? ADV_PROGRESSED : ADV_BLOCKED;
                t->sc_fwd = 0;
            }
            t->has_step = 0;
            t->step_idx++;
            progressed = 1;
            continue;
        }
        struct plait_conn *rc = NULL, *sc = NULL;
        const void *in = NULL;
        void *out = NULL;
        const uint64_t piece_max = plait_piece_max(comm->set.slot_bytes, es, PLAIT_WIRE_SIMPLE);
        const unsigned ops = plait_piece_ops(st->kind);
        uint64_t n = plait_piece_elems(st->count, t->piece_off, piece_max);
        /* A plain-copy SEND: the whole step as one descriptor when it is large. */
        if (st->kind == PLAIT_STEP_SEND && t->piece_off == 0 && plait_reduce_is_copy(&op->red, st->flags)) {
            if (!(sc = step_conn(t, st->send_peer, "sends to", err)))
                return ADV_ERROR;
            if (sc_wants(t, sc, st->count * es)) {
                const int r = sc_try_publish(t, sc, buf_ptr(op, st->src_buf) + st->src_off * es, st->count * es, err);
                if (r < 0)
                    return ADV_ERROR;
                if (r == 0)
                    return progressed ? ADV_PROGRESSED : ADV_BLOCKED;
                t->piece_off = st->count;
                progressed = 1;
                continue;
            }
        }
        int from_desc = 0;
        if (ops & PLAIT_PIECE_RECV) {
            if (!(rc = step_conn(t, st->recv_peer, "receives from", err)))
                return ADV_ERROR;
            uint32_t got = 0;
            in = plait_conn_recv_slot(rc, &got);
            if (!in) {
                if (plait_conn_peer_gone(rc)) {
                    *err = peer_gone_error(t, st->recv_peer, "waiting for its data");
                    return ADV_ERROR;
                }
                return progressed ? ADV_PROGRESSED : ADV_BLOCKED;
            }
            if (t->sc_rx_active || (got & PLAIT_SLOT_DESC)) {
                if (!t->sc_rx_active && (*err = sc_take(t, rc, in, got, t->piece_off, st->count)))
                    return ADV_ERROR;
                from_desc = 1;
            } else if (got != n * es) {
                *err = size_mismatch(t, st->recv_peer, got, (size_t)(n * es));
                return ADV_ERROR;
            }
        }
        /* A descriptor is read straight into dst when the step only copies what
         * it receives; several pieces at once when nothing is sent meanwhile. */
        const int direct = from_desc && (st->kind == PLAIT_STEP_RECV || st->kind == PLAIT_STEP_RECV_COPY_SEND);
        if (direct && (st->kind == PLAIT_STEP_RECV || t->sc_fwd))
            n = plait_min_u64(st->count - t->piece_off, SC_BULK_PIECES * piece_max);
        const size_t bytes = (size_t)n * es;
        if ((ops & PLAIT_PIECE_SEND) && !t->sc_fwd) {
            if (!(sc = step_conn(t, st->send_peer, "sends to", err)))
                return ADV_ERROR;
            out = plait_conn_send_slot(sc);
            if (!out) {
                if (plait_conn_peer_gone(sc)) {
                    *err = peer_gone_error(t, st->send_peer, "waiting for it to drain its buffers");
                    return ADV_ERROR;
                }
                return progressed ? ADV_PROGRESSED : ADV_BLOCKED;
            }
        }
        /* Only the sides the kind uses: a generator may leave the other pointing
         * at a buffer this rank does not have (NULL plus an offset). */
        const char *src =
            (ops & PLAIT_PIECE_FROM_SRC) ? buf_ptr(op, st->src_buf) + plait_piece_src(st, t->piece_off) * es : NULL;
        char *dst =
            (ops & PLAIT_PIECE_TO_DST) ? (char *)buf_ptr(op, st->dst_buf) + plait_piece_dst(st, t->piece_off) * es : NULL;
        if (dst) {
            const int wait = sc_must_wait(t, dst, bytes, err);
            if (wait < 0)
                return ADV_ERROR;
            if (wait)
                return progressed ? ADV_PROGRESSED : ADV_BLOCKED;
        }
        if (from_desc) {
            const uint64_t at = sc_rx_at(t, t->piece_off);
            if (direct) {
                if ((*err = sc_read(t, rc, dst, at, bytes)))
                    return ADV_ERROR;
                in = dst;
            } else if (rc->sc_mode == PLAIT_SC_LOCAL) {
                in = (const void *)(uintptr_t)at;
            } else {
                if ((*err = sc_read(t, rc, rc->sc_bounce, at, bytes)))
                    return ADV_ERROR;
                in = rc->sc_bounce;
            }
        }
        /* What the piece does (stepper.h, shared with the CUDA kernel): a
         * reduction of src and the received data into dst (when the step
         * keeps it) or straight into the send slot, else the received data
         * copied out, else (SEND) src with the pre-op applied. */
        if (ops & PLAIT_PIECE_REDUCE) {
            plait_reduce_apply(&op->red, (ops & PLAIT_PIECE_TO_DST) ? (void *)dst : out, src, in, n, st->flags);
            if ((ops & PLAIT_PIECE_TO_DST) && out)
                memcpy(out, dst, bytes);
        } else if (ops & PLAIT_PIECE_RECV) {
            if ((ops & PLAIT_PIECE_TO_DST) && in != dst)
                memcpy(dst, in, bytes);
            if (out)
                memcpy(out, in, bytes);
        } else if (ops & PLAIT_PIECE_SEND) {
            if (st->flags)
                plait_reduce_apply(&op->red, out, src, NULL, n, st->flags);
            else
                memcpy(out, src, bytes);
        } else {
            *err = plait_error(PLAIT_ERR_INTERNAL, "executor: unknown step kind %d", st->kind);
            return ADV_ERROR;
        }
        if (out) {
            plait_conn_send_commit(sc, (uint32_t)bytes);
            if (sc->needs_progress) {
                plait_result_t res = conn_progress(comm, sc);
                if (res) {
                    *err = res;
                    return ADV_ERROR;
                }
            }
        }
        if (rc) {
            if (!from_desc)
                plait_conn_recv_release(rc);
            else if (t->piece_off + n >= st->count)
                sc_done_reading(t, rc);
        }
        t->piece_off += n;
        progressed = 1;
    }
    return ADV_PROGRESSED;
}

void plait_waits_add(struct plait_waits *w, int peer, const char *what)
{
    for (int i = 0; i < w->n; i++)
        if (w->peer[i] == peer && w->what[i] == what)
            return;
    if (w->n < PLAIT_WAITS_MAX) {
        w->peer[w->n] = peer;
        w->what[w->n++] = what;
    }
}

plait_result_t plait_timeout_error(const struct plait_op *op, double timeout_s, const struct plait_waits *w)
{
    char list[1024] = "";
    size_t o = 0;
    for (int i = 0; i < w->n && o < sizeof(list) - 1; i++) {
        char who[160];
        o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s (%s)", i ? ", " : "; waiting for ",
                              plait_peer_str(op->comm, w->peer[i], who, sizeof(who)), w->what[i]);
    }
    return plait_error(PLAIT_ERR_TIMEOUT,
                       "%s (operation #%llu) on rank %d did not complete within PLAIT_COLL_TIMEOUT=%g s%s", op->name,
                       (unsigned long long)op->seq, op->comm->rank, timeout_s, list);
}

/* For a timeout's message: what an unfinished task is waiting for. Reads the
 * FIFO counters the way advance() does, without moving anything. */
static void task_waits(struct plait_task *t, struct plait_waits *w)
{
    struct plait_comm *comm = t->op->comm;
    if (t->done || (t->after && !t->after->done))
        return;
    if (t->is_fast) {
        plait_fast_waits(t, w);
        return;
    }
    for (int i = 0; i < t->sc_npend; i++)
        if (plait_ld_acquire_u64(t->sc_pend[i].conn->tx_head) <= t->sc_pend[i].seq)
            plait_waits_add(w, t->sc_pend[i].conn->peer, "it to read the bytes this rank published for single copy");
    if (!t->has_step)
        return;
    const struct plait_step *st = &t->step;
    const int sr = plait_step_is_sendrecv(st->kind);
    const unsigned ops = sr ? PLAIT_PIECE_RECV | PLAIT_PIECE_SEND : plait_piece_ops(st->kind);
    const int recv_left = sr ? t->recv_off < st->count : t->piece_off < st->count;
    if ((ops & PLAIT_PIECE_RECV) && recv_left && st->recv_peer >= 0 && st->recv_peer < comm->nranks) {
        struct plait_conn *c = __atomic_load_n(&comm->conns[st->recv_peer * comm->ncls + t->cls], __ATOMIC_ACQUIRE);
        uint32_t got;
        if (!c)
            plait_waits_add(w, st->recv_peer, "its side of a connection made on first use");
        else if (!plait_conn_recv_slot(c, &got))
            plait_waits_add(w, st->recv_peer, "its data");
    }
    if ((ops & PLAIT_PIECE_SEND) && t->piece_off < st->count && st->send_peer >= 0 && st->send_peer < comm->nranks) {
        struct plait_conn *c = __atomic_load_n(&comm->conns[st->send_peer * comm->ncls + t->cls], __ATOMIC_ACQUIRE);
        if (!c)
            plait_waits_add(w, st->send_peer, "its side of a connection made on first use");
        else if (!plait_conn_send_slot(c))
            plait_waits_add(w, st->send_peer, "room in its FIFO: it has not read what this rank sent");
    }
}

/* The set of communicators a run touches (small: usually one). */
struct run_comms {
    struct plait_comm *list[64];
    int has_progress[64]; /* the communicator has connections that need tp->progress (sockets) */
    int n;
    int overflow;
};

static void add_comm(struct run_comms *rc, struct plait_comm *c)
{
    for (int i = 0; i < rc->n; i++)
        if (rc->list[i] == c)
            return;
    if (rc->n < (int)(sizeof(rc->list) / sizeof(rc->list[0]))) {
        /* Scanned once per run rather than on every pass of the polling loop:
         * the connections of a communicator do not change while it runs. */
        rc->has_progress[rc->n] = plait_comm_needs_progress(c);
        rc->list[rc->n++] = c;
    } else {
        rc->overflow = 1;
    }
}

/* Socket connections need progress even when no task is waiting on them:
 * committed slots must leave and arriving ones must land. */
static plait_result_t progress_tcp(struct plait_comm *comm, int *all_flushed)
{
    return plait_comm_transports_progress(comm, all_flushed);
}

/* Runs of at most this many tasks keep their task list on the stack and find
 * each task's predecessor in its lane by scanning back (at most 64 * 63 / 2
 * comparisons); larger runs (groups of many point-to-point calls) use a hash
 * of (communicator, lane), so that ordering stays linear in the tasks. */
#define SMALL_RUN_TASKS 64

static size_t lane_hash(const struct plait_comm *comm, int lane, size_t mask)
{
    uint64_t h = (uint64_t)(uintptr_t)comm ^ ((uint64_t)(uint32_t)lane * 0x9e3779b97f4a7c15ull);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (size_t)h & mask;
}

/* Fills all[] with the run's tasks in issue order and points each task at the
 * previous task of its (communicator, lane), which must finish first, so that
 * both ends of a connection see the same sequence of pieces. */
static plait_result_t order_lanes(struct plait_op *ops, struct plait_task **all, int ntasks)
{
    int k = 0;
    if (ntasks <= SMALL_RUN_TASKS) {
        for (struct plait_op *op = ops; op; op = op->next)
            for (int i = 0; i < op->ntasks; i++) {
                struct plait_task *t = &op->tasks[i];
                t->after = NULL;
                for (int j = k - 1; j >= 0; j--)
                    if (all[j]->op->comm == op->comm && all[j]->lane == t->lane) {
                        t->after = all[j];
                        break;
                    }
                all[k++] = t;
            }
        return PLAIT_SUCCESS;
    }
    /* Open addressing, at most half full: each slot holds the last task seen
     * of one (communicator, lane). */
    size_t cap = 2;
    while (cap < 2 * (size_t)ntasks)
        cap *= 2;
    struct plait_task **last = calloc(cap, sizeof(*last));
    if (!last)
        return plait_error(PLAIT_ERR_SYSTEM, "executor: out of memory");
    for (struct plait_op *op = ops; op; op = op->next)
        for (int i = 0; i < op->ntasks; i++) {
            struct plait_task *t = &op->tasks[i];
            size_t h = lane_hash(op->comm, t->lane, cap - 1);
            while (last[h] && !(last[h]->op->comm == op->comm && last[h]->lane == t->lane))
                h = (h + 1) & (cap - 1);
            t->after = last[h];
            last[h] = t;
            all[k++] = t;
        }
    free(last);
    return PLAIT_SUCCESS;
}

/* Waits (with the run's waiter: its deadline and the abort and liveness
 * checks) until the CUDA proxy has finished with comm's socket connections. */
static plait_result_t wait_proxy_idle(struct plait_comm *comm, struct plait_waiter *w, double timeout)
{
    if (plait_cuda_proxy_captured(comm))
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "rank %d: host buffers on a communicator whose device operations reach socket peers and were "
                           "captured into a CUDA graph (the graph's proxy owns those connections for the "
                           "communicator's life): use another communicator for host buffers",
                           comm->rank);
    while (plait_cuda_proxy_busy(comm)) {
        if (!plait_wait_idle(w))
            continue;
        plait_result_t r = plait_comm_check_waiting(comm);
        if (r)
            return r;
        if (plait_wait_expired(w))
            return plait_error(PLAIT_ERR_TIMEOUT,
                               "rank %d: a host operation waited more than PLAIT_COLL_TIMEOUT=%g s for the "
                               "communicator's device operations to release its socket connections",
                               comm->rank, timeout);
    }
    plait_wait_moved(w);
    return PLAIT_SUCCESS;
}

plait_result_t plait_exec_run(struct plait_op *ops)
{
    struct run_comms rc; /* not zeroed as a whole: only list[0..n) is read */
    rc.n = 0;
    rc.overflow = 0;
    int ntasks = 0;
    for (struct plait_op *op = ops; op; op = op->next) {
        add_comm(&rc, op->comm);
        ntasks += op->ntasks;
    }
    if (rc.overflow)
        return plait_error(PLAIT_ERR_INVALID_USAGE, "a group may span at most 64 communicators");
    double timeout = 0;
    int spin_ns = 1 << 30;
    for (int i = 0; i < rc.n; i++) {
        if (rc.list[i]->set.coll_timeout_s > 0 && (timeout == 0 || rc.list[i]->set.coll_timeout_s < timeout))
            timeout = rc.list[i]->set.coll_timeout_s;
        int s = rc.list[i]->spin_ns;
        if (s < spin_ns)
            spin_ns = s;
    }
    struct plait_waiter w;
    plait_waiter_init(&w, spin_ns, timeout);
    /* An abort either waits for us or is seen by the check below before any
     * of the communicator's resources are touched (plait_op_enter). */
    int is_aborted[sizeof(rc.list) / sizeof(rc.list[0])];
    for (int i = 0; i < rc.n; i++)
        is_aborted[i] = plait_op_enter(rc.list[i]);

    plait_result_t status = PLAIT_SUCCESS;
    int is_counted = 0; /* the ops are counted as issued in the published counters */
    struct plait_comm *failed_comm = NULL;
    /* Most runs are one collective of a few tasks: their list lives on the
     * stack, so the per-call path does not allocate. */
    struct plait_task *all_small[SMALL_RUN_TASKS];
    struct plait_task **all = NULL;
    int nall = 0; /* entries of all[] filled (error paths read only those) */
    /* Work queued on a stream may reach a communicator that failed meanwhile. */
    for (int i = 0; i < rc.n; i++)
        if (is_aborted[i]) {
            status = plait_error(PLAIT_ERR_INVALID_USAGE, "rank %d: the communicator was aborted", rc.list[i]->rank);
            goto refused;
        } else if (__atomic_load_n(&rc.list[i]->in_error, __ATOMIC_ACQUIRE)) {
            char why[sizeof(rc.list[i]->async_msg)];
            plait_comm_async_msg(rc.list[i], why, sizeof(why));
            status = plait_error(PLAIT_ERR_INVALID_USAGE, "rank %d: the communicator is in error after: %s",
                                 rc.list[i]->rank, why);
            goto refused;
        }
    /* A communicator whose device operations reach socket peers through the
     * CUDA proxy (core/cuda/proxy.c) gets those connections back only when the
     * proxy is done with them: host operations queued behind device ones wait
     * here (the acquire in plait_cuda_proxy_busy pairs with the proxy's last
     * release, so the connections' counters are ours again afterwards). */
    for (int i = 0; i < rc.n; i++)
        if ((status = wait_proxy_idle(rc.list[i], &w, timeout))) {
            failed_comm = rc.list[i];
            goto out;
        }
    for (struct plait_op *op = ops; op; op = op->next)
        plait_op_issued(op->comm);
    is_counted = 1;
    all = ntasks <= SMALL_RUN_TASKS ? all_small : malloc(sizeof(*all) * (size_t)ntasks);
    if (!all) {
        status = plait_error(PLAIT_ERR_SYSTEM, "executor: out of memory");
        goto out;
    }
    for (struct plait_op *op = ops; op; op = op->next)
        if ((status = plait_op_acquire_scratch(op))) {
            failed_comm = op->comm;
            goto out;
        }
    if ((status = order_lanes(ops, all, ntasks)))
        goto out;
    nall = ntasks;

    for (;;) {
        int remaining = 0, progressed = 0;
        for (int i = 0; i < ntasks; i++) {
            struct plait_task *t = all[i];
            if (t->done)
                continue;
            if (t->after && !t->after->done) {
                remaining++;
                continue;
            }
            plait_result_t err = PLAIT_SUCCESS;
            int r = task_advance(t, &err);
            if (r == ADV_ERROR) {
                status = err;
                failed_comm = t->op->comm;
                goto out;
            }
            if (r == ADV_DONE) {
                t->done = 1;
                progressed = 1;
            } else {
                remaining++;
                progressed |= r == ADV_PROGRESSED;
            }
        }
        int flushed = 1;
        for (int i = 0; i < rc.n; i++) {
            if (!rc.has_progress[i])
                continue;
            plait_result_t res = progress_tcp(rc.list[i], &flushed);
            if (res) {
                status = res;
                failed_comm = rc.list[i];
                goto out;
            }
        }
        if (remaining == 0 && flushed)
            break;
        if (progressed) {
            plait_wait_moved(&w);
            continue;
        }
        if (plait_wait_idle(&w)) {
            for (int i = 0; i < rc.n; i++)
                if ((status = plait_comm_check_waiting(rc.list[i])) != PLAIT_SUCCESS) {
                    failed_comm = rc.list[i];
                    goto out;
                }
            /* A peer that runs our waiting collective on the small-message
             * path will never feed our FIFOs. */
            for (int i = 0; i < ntasks; i++)
                if (!all[i]->done && !all[i]->is_fast &&
                    (status = plait_fast_check_mismatch(all[i]->op)) != PLAIT_SUCCESS) {
                    failed_comm = all[i]->op->comm;
                    goto out;
                }
            if (plait_wait_expired(&w)) {
                struct plait_op *op = NULL;
                for (int i = 0; i < ntasks; i++)
                    if (!all[i]->done) {
                        op = all[i]->op;
                        break;
                    }
                if (op) {
                    struct plait_waits ws = {0};
                    for (int i = 0; i < ntasks; i++)
                        if (all[i]->op == op)
                            task_waits(all[i], &ws);
                    status = plait_timeout_error(op, timeout, &ws);
                } else {
                    status = plait_error(PLAIT_ERR_TIMEOUT,
                                         "an operation did not complete within PLAIT_COLL_TIMEOUT=%g s", timeout);
                }
                failed_comm = op ? op->comm : NULL;
                goto out;
            }
        }
    }
out:
    if (status && failed_comm && !strstr(plait_last_error_get(), "(operation #")) {
        for (int i = 0; i < nall; i++)
            if (!all[i]->done && all[i]->op->comm == failed_comm) {
                const struct plait_op *op = all[i]->op;
                status = plait_error_context(status, "%s (operation #%llu) on rank %d", op->name,
                                             (unsigned long long)op->seq, failed_comm->rank);
                break;
            }
    }
    if (status)
        sc_revoke(all, nall);
    if (all != all_small)
        free(all);
    for (struct plait_op *op = ops; op; op = op->next)
        plait_op_release_scratch(op);
    if (is_counted)
        for (struct plait_op *op = ops; op; op = op->next)
            plait_op_completed(op->comm);
    if (status)
        for (int i = 0; i < rc.n; i++)
            plait_comm_mark_failed(rc.list[i], status);
refused:
    /* Refused up front: nothing moved, so the other communicators of the run
     * are still healthy. */
    for (int i = 0; i < rc.n; i++)
        plait_op_leave(rc.list[i]);
    return status;
}
