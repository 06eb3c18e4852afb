/* The body of the CUDA kernel: one interpreter of a launch (kernel.h),
 * compiled by nvcc into plait_kernel (kernel.cu) and by the C compiler into
 * its host emulation (kernel_host.c), so that every decision the GPU makes --
 * which piece, which slot, when to wait, what to publish, what an error is --
 * is the one the CPU tests exercise. Common subset of C11 and CUDA C++, like
 * algorithms/stepper.h.
 *
 * The includer defines the hooks below before including this file; the body
 * only decides, the hooks do the machine-specific work:
 *
 *   PLAIT_KB_FN                qualifiers of the body's functions
 *   PLAIT_KB_TID, PLAIT_KB_NTHREADS   this thread's index in the CTA, threads per CTA
 *   PLAIT_KB_SYNC()            CTA barrier (also orders memory within the CTA)
 *   plait_kb_copy(dst, src, bytes)                 CTA-cooperative copy (every thread calls)
 *   plait_kb_reduce(op, dst, a, b, n, flags)       CTA-cooperative dst = post(pre(a) OP b), b may be NULL
 *   plait_kb_reduce8(op, a, b, has_b, n, flags)    one thread: the same on n elements packed in 8 bytes
 *   plait_kb_ld64(p), plait_kb_st64(p, v)          one 8-byte access at an 8-byte aligned address
 *   plait_kb_ll_store(line, v, whole, flag)        one LL line (16-byte store; 8 bytes when !whole)
 *   plait_kb_ll_load(line, whole, flag, &v)        one LL line: 1 and v when its flag(s) equal flag
 *   plait_kb_fence(scope)      a release fence of the scope (before a leader publishes)
 *   plait_kb_cas64(p, expect, desired)  system-scope CAS, returns the old value
 *   plait_kb_add32(p, v)       system-scope fetch-add with acquire and release, returns the old value
 *   plait_kb_ld32_relaxed(p), plait_kb_ld64_relaxed(p)   volatile loads (abort flag, status words)
 *   plait_kb_clock_ns()        a monotonic clock in nanoseconds
 *   plait_kb_pause(spins)      between two polls of a wait (spins: polls so far)
 *
 * How a CTA divides the work: thread 0 (the leader) does every wait and every
 * publication; all threads move the data. Each piece runs three phases:
 *   A. the leader waits for what the piece needs (a filled receive slot, a
 *      send credit) and leaves the slot addresses (or an error) in the CTA's
 *      shared state;  SYNC
 *   B. every thread moves its share of the piece (LL: each thread also polls
 *      the flags of its own lines);  SYNC
 *   C. the leader publishes: sizes[slot] then tail (release) to the receiver,
 *      head (release) back to the sender, and advances the counters.
 * Shared state written in A is read only between the two SYNCs, and what B
 * writes is read only after the second, so no phase of one piece races with
 * a phase of the next. Every decision after a SYNC is taken on values all
 * threads read alike (the shared state, the plan, the kernel parameters), so
 * every thread reaches the same barriers.
 *
 * Memory ordering. Simple: the sender's data and sizes[slot] are published by
 * the leader's release store of tail (after a fence of the connection's
 * scope, which with the SYNC before it covers every thread's stores); the
 * receiver's leader acquires tail, and the SYNC orders the other threads'
 * reads of the slot after that acquire. The receiver gives the slot back with
 * a release store of head after the SYNC that ends every thread's reads; the
 * sender's leader acquires head before anyone writes the slot again. LL: a
 * line's data and its flag travel in one store, so the receiver needs no
 * tail; credit is as for Simple. Completion: each CTA's leader fences (system
 * scope) and adds one to lanes_done; the last one fences again and
 * release-stores status[0] + 1, so the host and the proxy that acquire
 * status[0] see everything every CTA wrote, results and error words alike. */
#ifndef PLAIT_KERNEL_BODY_H
#define PLAIT_KERNEL_BODY_H

#include <stdint.h>

#include "core/cuda/kernel.h"

/* Polls between two looks at the abort flag, the status word and the clock. */
#define PLAIT_KB_CHECK_EVERY 64u

/* Internal result of a wait: another CTA failed first (its error is already
 * in status[1..3]): leave without recording anything. */
#define PLAIT_KB_LEAVE (-1)

/* Descriptors a CTA may have published and not yet seen released. */
#define PLAIT_KB_SC_PENDING 8

/* A descriptor this CTA published: [addr, addr + len) of its own buffers,
 * readable by the peer until conn's tx head passes seq. */
struct plait_kb_pend {
    struct plait_dev_conn *conn;
    uint64_t seq;
    const char *addr;
    uint64_t len;
};

/* The CTA's shared state (GPU: __shared__). wait_err and the slot addresses
 * are written by the leader in phase A and read between the SYNCs; ll_err is
 * written by any thread in phase B and read after the second SYNC. The
 * single-copy state (sdesc at a step's start, rx_desc in phase A, the
 * pending list) is the leader's: the others read sdesc and rx_desc between
 * SYNCs like the rest. */
struct plait_kb_shared {
    int32_t wait_err;     /* 0, an enum plait_kerr, or PLAIT_KB_LEAVE */
    int32_t ll_err;
    int32_t go_send;      /* SENDRECV: this round moves a piece of the send half */
    int32_t go_recv;      /* ... of the receive half */
    char *out;            /* the send slot (Simple) or LL slot */
    const char *in;       /* the receive slot (Simple) or LL slot */
    uint64_t sseq;        /* the pieces' sequence numbers (LL flags) */
    uint64_t rseq;
    int32_t sdesc;        /* this step's send (half) goes as one descriptor: window sdesc_win, offset sdesc_off */
    int32_t rx_desc;      /* this step's receive reads the sender's window: element rx_base is at rx_src */
    int32_t npend;
    uint32_t sdesc_win;
    uint64_t sdesc_off;
    const char *rx_src;
    uint64_t rx_base;
    struct plait_kb_pend pend[PLAIT_KB_SC_PENDING];
};

/* What a CTA works on. */
struct plait_kb_ctx {
    const struct plait_kargs *args;
    const struct plait_dev_op *op;
    struct plait_kb_shared *sh;
    uint32_t lane;
    uint32_t cls;
    int32_t is_ll;
};

/* Records the first error of the launch: status[1] = kerr, [2] = lane,
 * [3] = peer, first wins. Returns kerr (PLAIT_KB_LEAVE stays unrecorded). */
PLAIT_KB_FN int plait_kb_fail(const struct plait_kb_ctx *c, int kerr, int32_t peer)
{
    uint64_t *status = c->args->status;
    if (kerr > 0 && plait_kb_cas64(&status[1], 0, (uint64_t)kerr) == 0) {
        status[2] = c->lane;
        status[3] = (uint64_t)(int64_t)peer;
    }
    return kerr;
}

/* The checks of every wait: abort, another CTA's failure, the deadline (the
 * wait's start is taken on its first check). 0 while the wait may go on. */
PLAIT_KB_FN int plait_kb_wait_check(const struct plait_kb_ctx *c, uint64_t *start)
{
    const struct plait_kargs *a = c->args;
    if (a->abort_flag && plait_kb_ld32_relaxed(a->abort_flag) != 0)
        return PLAIT_KERR_ABORT;
    if (plait_kb_ld64_relaxed(&a->status[1]) != 0)
        return PLAIT_KB_LEAVE;
    if (a->timeout_ns) {
        const uint64_t now = plait_kb_clock_ns();
        if (*start == 0)
            *start = now ? now : 1;
        else if (now - *start > a->timeout_ns)
            return PLAIT_KERR_TIMEOUT;
    }
    return 0;
}

/* The connection to `peer` on the task's class, NULL when there is none. */
PLAIT_KB_FN struct plait_dev_conn *plait_kb_conn(const struct plait_kb_ctx *c, int32_t peer)
{
    const struct plait_kargs *a = c->args;
    if (peer < 0 || peer >= a->nranks || c->cls >= (uint32_t)a->ncls || !a->conns)
        return 0;
    return a->conns[(uint64_t)peer * (uint32_t)a->ncls + c->cls];
}

/* Whether a connection can carry this task's pieces: slots large enough for
 * piece_max elements in the op's protocol, LL lines where LL is used. */
PLAIT_KB_FN int plait_kb_conn_fits(const struct plait_kb_ctx *c, const struct plait_dev_conn *conn, int is_tx)
{
    const struct plait_dev_op *op = c->op;
    const uint64_t bytes = op->piece_max * op->esize;
    if (conn->nslots == 0)
        return 0;
    if (!c->is_ll)
        return bytes <= conn->slot_bytes;
    const char *ll = is_tx ? conn->tx.ll : conn->rx.ll;
    return ll != 0 && ((uintptr_t)ll & 15u) == 0 && conn->slot_bytes % 16u == 0 &&
           bytes <= plait_ll_payload(conn->slot_bytes);
}

/* A buffer of the op at an element offset. */
PLAIT_KB_FN char *plait_kb_buf(const struct plait_dev_op *op, int which, uint64_t off)
{
    return op->buf[which < 0 || which > 2 ? 0 : which] + off * op->esize;
}

/* ---------------------------------------------------------------- phase C */

/* The leader hands a filled slot to the receiver: its size, then the tail. */
PLAIT_KB_FN void plait_kb_publish(const struct plait_kb_ctx *c, struct plait_dev_conn *sc, uint64_t bytes)
{
    const uint64_t seq = sc->tx_posted;
    if (!c->is_ll) {
        *(volatile uint32_t *)&sc->tx.sizes[plait_fifo_slot(seq, sc->nslots)] = (uint32_t)bytes;
        plait_kb_fence(sc->scope);
        plait_st_release(sc->tx.tail, seq + 1, sc->scope);
    }
    sc->tx_posted = seq + 1;
}

/* The leader gives a drained slot back to its sender. */
PLAIT_KB_FN void plait_kb_release(const struct plait_kb_ctx *c, struct plait_dev_conn *rc)
{
    (void)c;
    const uint64_t seq = rc->rx_consumed + 1;
    plait_st_release(rc->rx.head, seq, rc->scope);
    rc->rx_consumed = seq;
}

/* ---------------------------------------------------------------- single copy
 * (kernel.h). The same rules as the CPU executor's (core/exec.c, sc_*): the
 * sender publishes one descriptor for a whole step's send and keeps it
 * pending until the receiver's release of that slot (its tx head passing the
 * slot's sequence number, acquired: the reads are complete); before anything
 * of the CTA writes bytes overlapping a pending range (in place), the leader
 * waits for its release; a task ends only when none is pending; a full
 * pending list means: send data slots instead. Leader only. */

/* Whether a SEND step's flags leave the op's bytes unchanged. */
PLAIT_KB_FN int plait_kb_sc_plain(const struct plait_dev_op *op, unsigned flags)
{
    if ((flags & PLAIT_STEP_PRE) && !(op->sc & PLAIT_DEV_SC_PLAIN_PRE))
        return 0;
    if ((flags & PLAIT_STEP_POST) && !(op->sc & PLAIT_DEV_SC_PLAIN_POST))
        return 0;
    return 1;
}

/* Drops the pending descriptors whose slots were released; how many are left. */
PLAIT_KB_FN int plait_kb_sc_prune(const struct plait_kb_ctx *c)
{
    struct plait_kb_shared *sh = c->sh;
    int k = 0;
    for (int i = 0; i < sh->npend; i++) {
        const struct plait_dev_conn *conn = sh->pend[i].conn;
        if (plait_ld_acquire(conn->tx.head, conn->scope) <= sh->pend[i].seq)
            sh->pend[k++] = sh->pend[i];
    }
    sh->npend = k;
    return k;
}

/* 1 when [p, p + len) overlaps a pending descriptor (p NULL: when any is pending). */
PLAIT_KB_FN int plait_kb_sc_busy(const struct plait_kb_ctx *c, const char *p, uint64_t len)
{
    const struct plait_kb_shared *sh = c->sh;
    if (sh->npend == 0 || plait_kb_sc_prune(c) == 0)
        return 0;
    if (!p)
        return 1;
    const uintptr_t lo = (uintptr_t)p, hi = lo + len;
    for (int i = 0; i < sh->npend; i++) {
        const uintptr_t a = (uintptr_t)sh->pend[i].addr;
        if (lo < a + sh->pend[i].len && a < hi)
            return 1;
    }
    return 0;
}

/* Waits until no pending descriptor overlaps [p, p + len) (p NULL: none is
 * pending), with the checks of every wait. 0 or an error (recorded). */
PLAIT_KB_FN int plait_kb_sc_wait_free(const struct plait_kb_ctx *c, const char *p, uint64_t len)
{
    uint64_t start = 0;
    uint32_t spins = 0;
    while (plait_kb_sc_busy(c, p, len)) {
        if (++spins % PLAIT_KB_CHECK_EVERY == 0) {
            const int err = plait_kb_wait_check(c, &start);
            if (err)
                return plait_kb_fail(c, err, c->sh->pend[0].conn->peer);
        }
        plait_kb_pause(spins);
    }
    return 0;
}

/* At the start of a step's send: whether its `bytes` at src go to sc as one
 * descriptor (then sh->sdesc_win and sdesc_off say where they are). They
 * must lie in one of this rank's windows registered when the launch was
 * issued, that window must be mapped by the peer (ce.c maps it for peers
 * whose kernels can load this device's memory: the entry is symmetric), and
 * the pending list must have room. */
PLAIT_KB_FN int plait_kb_sc_wants(const struct plait_kb_ctx *c, const struct plait_dev_conn *sc, const char *src,
                                  uint64_t bytes)
{
    const struct plait_kargs *a = c->args;
    struct plait_kb_shared *sh = c->sh;
    if (c->is_ll || a->sc_min_bytes == 0 || bytes < a->sc_min_bytes || !a->wins || !a->win_mask ||
        !(c->op->sc & PLAIT_DEV_SC_SEND) || a->rank < 0 || a->rank >= a->nranks)
        return 0;
    if (sh->npend >= PLAIT_KB_SC_PENDING && plait_kb_sc_prune(c) >= PLAIT_KB_SC_PENDING)
        return 0;
    const uint64_t n = (uint64_t)a->nranks, s = (uintptr_t)src;
    for (uint32_t w = 0; w < PLAIT_KMAX_WINDOWS; w++) {
        if (!((a->win_mask >> w) & 1u))
            continue;
        const struct plait_dev_win own = a->wins[w * n + (uint64_t)a->rank];
        if (!own.base || s < own.base || bytes > own.size || s - own.base > own.size - bytes)
            continue;
        if (!a->wins[w * n + (uint64_t)sc->peer].base)
            return 0;
        sh->sdesc_win = w;
        sh->sdesc_off = s - own.base;
        return 1;
    }
    return 0;
}

/* Phase C of a descriptor send: the descriptor in the credit slot sh->out,
 * published like data (its stores ordered before the tail by the publish's
 * fence), and kept pending. */
PLAIT_KB_FN void plait_kb_sc_publish(const struct plait_kb_ctx *c, struct plait_dev_conn *sc, const char *src,
                                     uint64_t bytes)
{
    struct plait_kb_shared *sh = c->sh;
    volatile uint64_t *d = (volatile uint64_t *)(void *)sh->out;
    d[0] = sh->sdesc_win;
    d[1] = sh->sdesc_off;
    d[2] = bytes;
    struct plait_kb_pend *p = &sh->pend[sh->npend++];
    p->conn = sc;
    p->seq = sc->tx_posted;
    p->addr = src;
    p->len = bytes;
    plait_kb_publish(c, sc, PLAIT_DEV_SLOT_DESC | (uint32_t)sizeof(struct plait_dev_desc));
    if (c->args->sc_counts)
        plait_kb_add32(&c->args->sc_counts[0], 1);
}

/* Phase A, a receive slot whose size word is `got` with PLAIT_DEV_SLOT_DESC:
 * checks the descriptor in `slot` against this rank's table and the `rleft`
 * bytes the step still expects, and reads the step's rest from the sender's
 * window from element rdone on. 0 or an enum plait_kerr. */
PLAIT_KB_FN int plait_kb_sc_take(const struct plait_kb_ctx *c, const struct plait_dev_conn *rc, const char *slot,
                                 uint32_t got, uint64_t rdone, uint64_t rleft)
{
    const struct plait_kargs *a = c->args;
    struct plait_kb_shared *sh = c->sh;
    if ((got & ~PLAIT_DEV_SLOT_DESC) != (uint32_t)sizeof(struct plait_dev_desc))
        return PLAIT_KERR_DESC;
    const volatile uint64_t *d = (const volatile uint64_t *)(const void *)slot;
    const uint64_t w = d[0], off = d[1], len = d[2];
    if (len != rleft)
        return PLAIT_KERR_SIZE;
    if (!a->wins || w >= PLAIT_KMAX_WINDOWS)
        return PLAIT_KERR_DESC;
    const struct plait_dev_win e = a->wins[w * (uint64_t)a->nranks + (uint64_t)rc->peer];
    if (!e.base || off > e.size || len > e.size - off)
        return PLAIT_KERR_DESC;
    sh->rx_desc = 1;
    sh->rx_src = (const char *)(uintptr_t)(e.base + off);
    sh->rx_base = rdone;
    return 0;
}

/* Phase C after the last piece read from a descriptor: its slot goes back. */
PLAIT_KB_FN void plait_kb_sc_done(const struct plait_kb_ctx *c, struct plait_dev_conn *rc)
{
    c->sh->rx_desc = 0;
    plait_kb_release(c, rc);
    if (c->args->sc_counts)
        plait_kb_add32(&c->args->sc_counts[1], 1);
}

/* ---------------------------------------------------------------- phase A
 * The leader's wait for a piece: a filled slot from rc (need_r), a credit
 * on sc (need_s). With `any` (SENDRECV), it returns as soon as one of the
 * needed ones is there and says which in sh->go_*; otherwise it waits for
 * all. Fills sh->in / sh->out with the slots' addresses.
 *
 * Single copy: the receive is element rdone of its step, which still expects
 * rleft bytes; a slot holding a descriptor is taken for the step's rest
 * (sh->rx_desc), and while one is taken sh->in points into the sender's
 * window without any wait. The piece writes [wdst, wdst + wbytes) of this
 * rank's buffers (wdst NULL: nothing): it waits until no pending descriptor
 * of this CTA overlaps that (with `any`, only the receive half waits). */
PLAIT_KB_FN int plait_kb_wait(const struct plait_kb_ctx *c, struct plait_dev_conn *rc, uint64_t rbytes,
                              uint64_t rdone, uint64_t rleft, struct plait_dev_conn *sc, int any, const char *wdst,
                              uint64_t wbytes)
{
    struct plait_kb_shared *sh = c->sh;
    int has_r = rc == 0, has_s = sc == 0, wr_ok = 1;
    uint64_t start = 0;
    uint32_t spins = 0;
    for (;;) {
        if (!has_r && sh->rx_desc) {
            sh->in = sh->rx_src + (rdone - sh->rx_base) * c->op->esize;
            has_r = 1;
        }
        if (!has_r) {
            const uint64_t seq = rc->rx_consumed;
            const uint32_t slot = plait_fifo_slot(seq, rc->nslots);
            sh->rseq = seq;
            if (c->is_ll) {
                /* Line 0's flags: the sender is writing this piece, and will
                 * finish it without waiting on anything (it took its credit
                 * first), so phase B's per-line polls end soon. */
                const char *ll = rc->rx.ll + (uint64_t)slot * rc->slot_bytes;
                uint64_t v;
                if (plait_kb_ll_load(ll, rbytes > 4, plait_ll_flag(seq), &v)) {
                    sh->in = ll;
                    has_r = 1;
                }
            } else if (plait_fifo_can_recv(plait_ld_acquire(rc->rx.tail, rc->scope), seq)) {
                const uint32_t got = *(const volatile uint32_t *)&rc->rx.sizes[slot];
                sh->in = rc->rx.slots + (uint64_t)slot * rc->slot_bytes;
                if (got & PLAIT_DEV_SLOT_DESC) {
                    const int err = plait_kb_sc_take(c, rc, sh->in, got, rdone, rleft);
                    if (err)
                        return plait_kb_fail(c, err, rc->peer);
                    sh->in = sh->rx_src;
                } else if (got != rbytes) {
                    return plait_kb_fail(c, PLAIT_KERR_SIZE, rc->peer);
                }
                has_r = 1;
            }
        }
        if (wdst)
            wr_ok = !plait_kb_sc_busy(c, wdst, wbytes);
        if (!has_s) {
            const uint64_t seq = sc->tx_posted;
            sh->sseq = seq;
            if (plait_fifo_can_send(seq, plait_ld_acquire(sc->tx.head, sc->scope), sc->nslots)) {
                const uint32_t slot = plait_fifo_slot(seq, sc->nslots);
                sh->out = (c->is_ll ? sc->tx.ll : sc->tx.slots) + (uint64_t)slot * sc->slot_bytes;
                has_s = 1;
            }
        }
        if (any ? (rc && has_r && wr_ok) || (sc && has_s) : has_r && has_s && wr_ok) {
            sh->go_recv = rc && has_r && wr_ok;
            sh->go_send = sc && has_s;
            return 0;
        }
        if (++spins % PLAIT_KB_CHECK_EVERY == 0) {
            const int err = plait_kb_wait_check(c, &start);
            if (err)
                return plait_kb_fail(c, err,
                                     !has_r ? rc->peer
                                     : !has_s ? sc->peer
                                     : sh->npend ? sh->pend[0].conn->peer
                                                 : -1);
        }
        plait_kb_pause(spins);
    }
}

/* ---------------------------------------------------------------- LL data */

/* Up to 8 bytes of user memory (little-endian), at any alignment. */
PLAIT_KB_FN uint64_t plait_kb_ld_bytes(const char *p, uint32_t n)
{
    if (n == 8 && ((uintptr_t)p & 7u) == 0)
        return plait_kb_ld64(p);
    uint64_t v = 0;
    for (uint32_t i = 0; i < n; i++)
        v |= (uint64_t)(unsigned char)p[i] << (8 * i);
    return v;
}

PLAIT_KB_FN void plait_kb_st_bytes(char *p, uint64_t v, uint32_t n)
{
    if (n == 8 && ((uintptr_t)p & 7u) == 0) {
        plait_kb_st64(p, v);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        p[i] = (char)(unsigned char)(v >> (8 * i));
}

/* Polls one LL line until its flag is `flag`; 0 or an error. Any thread. */
PLAIT_KB_FN int plait_kb_ll_wait(const struct plait_kb_ctx *c, const char *line, int whole, uint32_t flag,
                                 int32_t peer, uint64_t *v)
{
    uint64_t start = 0;
    uint32_t spins = 0;
    while (!plait_kb_ll_load(line, whole, flag, v)) {
        if (++spins % PLAIT_KB_CHECK_EVERY == 0) {
            const int err = plait_kb_wait_check(c, &start);
            if (err)
                return plait_kb_fail(c, err, peer);
        }
        plait_kb_pause(spins);
    }
    return 0;
}

/* Phase B of an LL piece of `bytes` bytes: each thread takes lines tid,
 * tid + nthreads, ...; a line carries 8 bytes of the piece (fewer in the last
 * one), a whole number of elements since every element size divides 8. `ops`
 * is a stepper piece mask; `rflags` the reduction flags; with `acc` the
 * received data is reduced into dst (SENDRECV_REDUCE: dst = post(dst OP in)).
 * Errors go to sh->ll_err. */
PLAIT_KB_FN void plait_kb_ll_move(const struct plait_kb_ctx *c, unsigned ops, unsigned rflags, int acc,
                                  const char *src, char *dst, const char *in, uint64_t rseq, int32_t rpeer,
                                  char *out, uint64_t sseq, uint64_t bytes)
{
    const struct plait_dev_op *op = c->op;
    const uint64_t nlines = (bytes + 7) / 8;
    const uint32_t rflag = plait_ll_flag(rseq), sflag = plait_ll_flag(sseq);
    for (uint64_t li = PLAIT_KB_TID; li < nlines; li += PLAIT_KB_NTHREADS) {
        const uint64_t off = li * 8;
        const uint32_t lb = bytes - off < 8 ? (uint32_t)(bytes - off) : 8u;
        const uint32_t n = lb / op->esize;
        const uint64_t s = (ops & PLAIT_PIECE_FROM_SRC) ? plait_kb_ld_bytes(src + off, lb) : 0;
        uint64_t v = 0, r;
        if (ops & PLAIT_PIECE_RECV) {
            const int err = plait_kb_ll_wait(c, in + li * 16, lb > 4, rflag, rpeer, &v);
            if (err) {
                c->sh->ll_err = err;
                return;
            }
        }
        if (acc)
            r = plait_kb_reduce8(op, plait_kb_ld_bytes(dst + off, lb), v, 1, n, rflags);
        else if (ops & PLAIT_PIECE_REDUCE)
            r = plait_kb_reduce8(op, s, v, 1, n, rflags);
        else if (ops & PLAIT_PIECE_RECV)
            r = v;
        else
            r = rflags ? plait_kb_reduce8(op, s, 0, 0, n, rflags) : s;
        if (ops & PLAIT_PIECE_TO_DST)
            plait_kb_st_bytes(dst + off, r, lb);
        if (ops & PLAIT_PIECE_SEND)
            plait_kb_ll_store(out + li * 16, r, lb > 4, sflag);
    }
}

/* ---------------------------------------------------------------- steps */

/* A local step (COPY, REDUCE): all threads, no connection; it waits first
 * for the release of any pending descriptor its write overlaps. */
PLAIT_KB_FN int plait_kb_local(const struct plait_kb_ctx *c, const struct plait_step *st)
{
    const struct plait_dev_op *op = c->op;
    const char *src = plait_kb_buf(op, st->src_buf, st->src_off);
    char *dst = plait_kb_buf(op, st->dst_buf, st->dst_off);
    if (plait_local_step_writes(st, src == dst)) {
        if (PLAIT_KB_TID == 0)
            c->sh->wait_err = plait_kb_sc_wait_free(c, dst, st->count * op->esize);
        PLAIT_KB_SYNC();
        if (c->sh->wait_err)
            return c->sh->wait_err;
        if (st->kind == PLAIT_STEP_REDUCE)
            plait_kb_reduce(op, dst, src, dst, st->count, st->flags);
        else if (st->flags)
            plait_kb_reduce(op, dst, src, 0, st->count, st->flags);
        else
            plait_kb_copy(dst, src, st->count * op->esize);
    }
    PLAIT_KB_SYNC();
    return 0;
}

/* A step of the kinds with one piece sequence (stepper.h's plait_piece_ops):
 * each piece receives, then sends, in the order the CPU executor does. */
PLAIT_KB_FN int plait_kb_pieces(const struct plait_kb_ctx *c, const struct plait_step *st, struct plait_dev_conn *rc,
                                struct plait_dev_conn *sc)
{
    const struct plait_dev_op *op = c->op;
    struct plait_kb_shared *sh = c->sh;
    const unsigned ops = plait_piece_ops(st->kind);
    const uint64_t es = op->esize;
    /* A plain SEND of bytes in a window: the whole step as one descriptor. */
    int sdesc = 0;
    if (st->kind == PLAIT_STEP_SEND) {
        if (PLAIT_KB_TID == 0)
            sh->sdesc = plait_kb_sc_plain(op, st->flags) &&
                        plait_kb_sc_wants(c, sc, plait_kb_buf(op, st->src_buf, st->src_off), st->count * es);
        PLAIT_KB_SYNC();
        sdesc = sh->sdesc;
    }
    for (uint64_t done = 0; done < st->count;) {
        const uint64_t n = sdesc ? st->count : plait_piece_elems(st->count, done, op->piece_max);
        const uint64_t bytes = n * es;
        /* Only the sides the kind uses: a generator may leave the other
         * naming a buffer this rank does not have. */
        const char *src = (ops & PLAIT_PIECE_FROM_SRC) ? plait_kb_buf(op, st->src_buf, plait_piece_src(st, done)) : 0;
        char *dst = (ops & PLAIT_PIECE_TO_DST) ? plait_kb_buf(op, st->dst_buf, plait_piece_dst(st, done)) : 0;
        if (PLAIT_KB_TID == 0)
            sh->wait_err = plait_kb_wait(c, rc, bytes, done, (st->count - done) * es, sc, 0, dst, bytes);
        PLAIT_KB_SYNC();
        if (sh->wait_err)
            return sh->wait_err;
        const uint64_t rseq = sh->rseq, sseq = sh->sseq;
        const int from_desc = rc ? sh->rx_desc : 0;
        const char *in = rc ? sh->in : 0;
        char *out = sc ? sh->out : 0;
        if (c->is_ll) {
            plait_kb_ll_move(c, ops, st->flags, 0, src, dst, in, rseq, rc ? rc->peer : -1, out, sseq, bytes);
        } else if (sdesc) {
            /* nothing moves: the receiver reads src where it is */
        } else if (ops & PLAIT_PIECE_REDUCE) {
            plait_kb_reduce(op, (ops & PLAIT_PIECE_TO_DST) ? dst : out, src, in, n, st->flags);
            if ((ops & PLAIT_PIECE_TO_DST) && out) {
                PLAIT_KB_SYNC();
                plait_kb_copy(out, dst, bytes);
            }
        } else if (ops & PLAIT_PIECE_RECV) {
            if ((ops & PLAIT_PIECE_TO_DST) && in != dst)
                plait_kb_copy(dst, in, bytes);
            if (out)
                plait_kb_copy(out, in, bytes);
        } else if (st->flags) {
            plait_kb_reduce(op, out, src, 0, n, st->flags);
        } else {
            plait_kb_copy(out, src, bytes);
        }
        PLAIT_KB_SYNC();
        if (sh->ll_err)
            return sh->ll_err;
        if (PLAIT_KB_TID == 0) {
            if (sc && sdesc)
                plait_kb_sc_publish(c, sc, src, bytes);
            else if (sc)
                plait_kb_publish(c, sc, bytes);
            if (rc && !from_desc)
                plait_kb_release(c, rc);
            else if (rc && done + n >= st->count)
                plait_kb_sc_done(c, rc);
        }
        done += n;
    }
    return 0;
}

/* A SENDRECV or SENDRECV_REDUCE step: the send half sends src unchanged, the
 * receive half writes (or reduces into) dst; each round moves a piece of
 * whichever halves have their resource, so two ranks exchanging never wait
 * on each other's order. */
PLAIT_KB_FN int plait_kb_sendrecv(const struct plait_kb_ctx *c, const struct plait_step *st,
                                  struct plait_dev_conn *rc, struct plait_dev_conn *sc)
{
    const struct plait_dev_op *op = c->op;
    struct plait_kb_shared *sh = c->sh;
    const uint64_t es = op->esize;
    const int reduces = plait_sendrecv_reduces(st->kind);
    const unsigned rflags = st->flags & PLAIT_STEP_POST;
    /* The send half sends src unchanged: one descriptor when it lies in a window. */
    if (PLAIT_KB_TID == 0)
        sh->sdesc = plait_kb_sc_wants(c, sc, plait_kb_buf(op, st->src_buf, st->src_off), st->count * es);
    PLAIT_KB_SYNC();
    const int sdesc = sh->sdesc;
    uint64_t sent = 0, recvd = 0;
    while (sent < st->count || recvd < st->count) {
        const uint64_t ns =
            sent < st->count ? (sdesc ? st->count - sent : plait_piece_elems(st->count, sent, op->piece_max)) : 0;
        const uint64_t nr = recvd < st->count ? plait_piece_elems(st->count, recvd, op->piece_max) : 0;
        char *rdst = nr ? plait_kb_buf(op, st->dst_buf, st->dst_off + recvd) : 0;
        if (PLAIT_KB_TID == 0)
            sh->wait_err = plait_kb_wait(c, nr ? rc : 0, nr * es, recvd, (st->count - recvd) * es, ns ? sc : 0, 1,
                                         rdst, nr * es);
        PLAIT_KB_SYNC();
        if (sh->wait_err)
            return sh->wait_err;
        const int go_send = sh->go_send, go_recv = sh->go_recv;
        const int from_desc = go_recv && sh->rx_desc;
        const uint64_t rseq = sh->rseq, sseq = sh->sseq;
        const char *src = go_send ? plait_kb_buf(op, st->src_buf, st->src_off + sent) : 0;
        char *dst = go_recv ? rdst : 0;
        if (c->is_ll) {
            if (go_send)
                plait_kb_ll_move(c, PLAIT_PIECE_SEND | PLAIT_PIECE_FROM_SRC, 0, 0, src, 0, 0, 0, -1, sh->out, sseq,
                                 ns * es);
            if (go_recv)
                plait_kb_ll_move(c, PLAIT_PIECE_RECV | PLAIT_PIECE_TO_DST, rflags, reduces, 0, dst, sh->in, rseq,
                                 rc->peer, 0, 0, nr * es);
        } else {
            if (go_send && !sdesc)
                plait_kb_copy(sh->out, src, ns * es);
            if (go_recv) {
                if (reduces)
                    plait_kb_reduce(op, dst, dst, sh->in, nr, rflags);
                else
                    plait_kb_copy(dst, sh->in, nr * es);
            }
        }
        PLAIT_KB_SYNC();
        if (sh->ll_err)
            return sh->ll_err;
        if (PLAIT_KB_TID == 0) {
            if (go_send && sdesc)
                plait_kb_sc_publish(c, sc, src, ns * es);
            else if (go_send)
                plait_kb_publish(c, sc, ns * es);
            if (go_recv && !from_desc)
                plait_kb_release(c, rc);
            else if (go_recv && recvd + nr >= st->count)
                plait_kb_sc_done(c, rc);
        }
        sent += go_send ? ns : 0;
        recvd += go_recv ? nr : 0;
    }
    return 0;
}

/* One step: finds its connections (checked: NOCONN, or PLAN when a slot
 * cannot hold a piece) and runs it. 0 or an error (recorded). */
PLAIT_KB_FN int plait_kb_step(const struct plait_kb_ctx *c, const struct plait_step *st)
{
    if (st->count == 0)
        return 0; /* both ends move nothing */
    if (st->kind == PLAIT_STEP_COPY || st->kind == PLAIT_STEP_REDUCE)
        return plait_kb_local(c, st);
    if (st->kind >= PLAIT_STEP_KINDS)
        return plait_kb_fail(c, PLAIT_KERR_PLAN, -1);
    /* schedule.h's kind predicates are host-only C; stepper.h's table is
     * compiled for both. */
    const int is_sendrecv = st->kind == PLAIT_STEP_SENDRECV || st->kind == PLAIT_STEP_SENDRECV_REDUCE;
    const unsigned ops = plait_piece_ops(st->kind);
    struct plait_dev_conn *rc = 0, *sc = 0;
    if (is_sendrecv || (ops & PLAIT_PIECE_RECV)) {
        rc = plait_kb_conn(c, st->recv_peer);
        if (!rc)
            return plait_kb_fail(c, PLAIT_KERR_NOCONN, st->recv_peer);
        if (!plait_kb_conn_fits(c, rc, 0))
            return plait_kb_fail(c, c->is_ll && !rc->rx.ll ? PLAIT_KERR_NOCONN : PLAIT_KERR_PLAN, st->recv_peer);
    }
    if (is_sendrecv || (ops & PLAIT_PIECE_SEND)) {
        sc = plait_kb_conn(c, st->send_peer);
        if (!sc)
            return plait_kb_fail(c, PLAIT_KERR_NOCONN, st->send_peer);
        if (!plait_kb_conn_fits(c, sc, 1))
            return plait_kb_fail(c, c->is_ll && !sc->tx.ll ? PLAIT_KERR_NOCONN : PLAIT_KERR_PLAN, st->send_peer);
    }
    if (is_sendrecv)
        return plait_kb_sendrecv(c, st, rc, sc);
    return plait_kb_pieces(c, st, rc, sc);
}

/* ---------------------------------------------------------------- the launch
 * CTA `cta` of `ncta`: runs lane cta's tasks in order, stops at the first
 * error (its own or another CTA's), then takes part in the completion. */
PLAIT_KB_FN void plait_kb_run(const struct plait_kargs *a, unsigned cta, unsigned ncta, struct plait_kb_shared *sh)
{
    const struct plait_dev_plan *plan = a->plan;
    struct plait_kb_ctx c;
    c.args = a;
    c.op = 0;
    c.sh = sh;
    c.lane = cta;
    c.cls = 0;
    c.is_ll = 0;
    if (PLAIT_KB_TID == 0) {
        sh->wait_err = 0;
        sh->ll_err = 0;
        sh->sdesc = 0;
        sh->rx_desc = 0;
        sh->npend = 0;
    }
    PLAIT_KB_SYNC();
    if (!plan || plan->magic != PLAIT_PLAN_MAGIC) {
        if (PLAIT_KB_TID == 0)
            plait_kb_fail(&c, PLAIT_KERR_PLAN, -1);
    } else if (cta < plan->nlanes) {
        const char *base = (const char *)plan;
        const uint32_t *lanes = (const uint32_t *)(const void *)(base + plan->lane_off);
        const struct plait_dev_task *tasks = (const struct plait_dev_task *)(const void *)(base + plan->task_off);
        const struct plait_step *steps = (const struct plait_step *)(const void *)(base + plan->step_off);
        const uint64_t nsteps =
            plan->bytes > plan->step_off ? (plan->bytes - plan->step_off) / sizeof(struct plait_step) : 0;
        int err = 0;
        for (uint32_t t = lanes[cta]; t < lanes[cta + 1] && t < plan->ntasks && !err; t++) {
            const struct plait_dev_task task = tasks[t];
            if (task.op >= (uint32_t)a->nops || task.op >= PLAIT_KMAX_OPS || a->ops[task.op].esize == 0 ||
                a->ops[task.op].piece_max == 0 || task.step_end > nsteps) {
                err = PLAIT_KERR_PLAN;
                if (PLAIT_KB_TID == 0)
                    plait_kb_fail(&c, err, -1);
                break;
            }
            c.op = &a->ops[task.op];
            c.cls = task.cls;
            c.is_ll = c.op->proto == PLAIT_WIRE_LL;
            for (uint64_t s = task.step_begin; s < task.step_end && !err; s++) {
                const struct plait_step st = steps[s];
                err = plait_kb_step(&c, &st);
            }
            /* A task is done once every descriptor it published was read:
             * until then a peer may still read its buffers. */
            if (!err) {
                if (PLAIT_KB_TID == 0)
                    sh->wait_err = plait_kb_sc_wait_free(&c, 0, 0);
                PLAIT_KB_SYNC();
                err = sh->wait_err;
                PLAIT_KB_SYNC(); /* every thread has read it before the next task's waits write it */
            }
        }
    }
    /* Completion: every CTA counts itself, error or not, so the launch always
     * ends and the host learns of it through status[0]. */
    PLAIT_KB_SYNC();
    if (PLAIT_KB_TID == 0) {
        plait_kb_fence(PLAIT_SCOPE_SYS);
        if (plait_kb_add32(a->lanes_done, 1) == ncta - 1) {
            *a->lanes_done = 0;
            plait_kb_fence(PLAIT_SCOPE_SYS);
            plait_st_release_sys(&a->status[0], plait_kb_ld64_relaxed(&a->status[0]) + 1);
        }
    }
}

#endif
