/* The proxy thread: device FIFOs <-> net connections (issue 8, part 6).
 *
 * A kernel cannot call send(2). For a peer reached over the net transport
 * (transports/net.c: other hosts, or every peer under PLAIT_TRANSPORT=socket)
 * the kernel's connection (struct plait_dev_conn) points at FIFOs in pinned
 * host memory mapped into the device, and one thread per communicator moves
 * slots between them and the host connection `hc`, whose staging FIFOs the
 * net transport's progress() moves through its provider:
 *
 *   kernel --(ktx FIFO, pinned)--> proxy --(hc send slot)--> net progress --> wire
 *   wire --> net progress --(hc receive slot)--> proxy --(krx FIFO, pinned)--> kernel
 *
 * Each pinned FIFO follows transports/transport.h's protocol with the proxy
 * as the kernel's peer:
 *   - ktx: the kernel fills slot s and sizes[s] and release-stores tail
 *     (sys scope); the proxy acquires tail, copies the slot into hc's send
 *     slot with the same byte count, commits it there (hc's release of its
 *     tail, read by the net progress) and then release-stores ktx head, which the
 *     kernel acquires before it writes the slot again;
 *   - krx: the proxy copies hc's received slot into slot s, sets sizes[s] and
 *     release-stores tail (the kernel acquires it before reading); the kernel
 *     release-stores krx head after draining a slot, and the proxy acquires
 *     it before reusing the slot and before giving hc's slot back
 *     (plait_conn_recv_release). Until then hc keeps the slot, so that slots
 *     fetched ahead for the kernel that no launch drains can be handed back
 *     to the CPU executor (plait_cuda_proxy_busy, pair_give_back).
 * Counters are 64-bit, monotonic, each on its own 64-byte line: the kernel
 * writes ktx tail and krx head, the proxy ktx head and krx tail.
 *
 * The thread runs while kicked launches are in flight: until status[0] (the
 * kernel's count of completed launches, host-mapped, bumped by the last CTA
 * after every FIFO store of its launch) reaches the kicked value and every
 * slot the kernel sent is on the wire. Then it sleeps on a condition variable.
 * While polling it spins for the communicator's spin time, then yields, then
 * sleeps in growing steps (at most PROXY_MAX_NAP_NS), so that ranks sharing
 * cores with their proxies keep making progress.
 *
 * The same thread watches the peers of a communicator with ranks in other
 * processes even when it has no proxied connection (then it moves nothing):
 * a kernel cannot see a process die, and without a watcher a launch whose
 * peer is gone (dead before the call, or killed during it) would wait out
 * PLAIT_COLL_TIMEOUT. While a launch is in flight it checks the peers every
 * PLAIT_WAIT_CHECK_NS of waiting (plait_comm_check_waiting, as a CPU wait
 * does, with the same struct plait_waiter: core/progress.h): a death
 * published by another rank, or a peer process gone (its pidfd) while no
 * launch completes for PROXY_EXITED_GRACE_S (not for captured graphs: no
 * launch is known to be in flight), fails the launch.
 *
 * Failures: a transport error (the peer reset or sent garbage) or a peer gone
 * while a launch waits and nothing moves for PROXY_GONE_GRACE_S, a peer found
 * gone as above, and the communicator's abort flag, raise the kernel's abort
 * word (every kernel wait ends with PLAIT_KERR_ABORT) and record the
 * communicator's asynchronous error naming the rank that failed first
 * (plait_comm_peer_gone's words). The proxy then moves nothing more. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "core/progress.h"
#include "base/log.h"
#include "base/util.h"
#include "core/cuda/cu.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"

#define PROXY_LINE 64
#define PROXY_MAX_NAP_NS 50000      /* longest sleep between polls while a launch is in flight */
#define PROXY_YIELD_NS 1000000      /* yield (rather than sleep) for this long after the spin */
#define PROXY_IDLE_WAIT_NS 100000000 /* an idle proxy re-checks stop/abort this often */
#define PROXY_GONE_GRACE_S 0.5      /* a gone peer and nothing moving for this long: the launch is stuck */
#define PROXY_EXITED_GRACE_S 0.5    /* a peer process gone and no launch completing for this long: stuck */
#define PROXY_WATCH_NAP_NS 1000000  /* a proxy with no connection to move polls this often */

/* One proxied connection: the pinned block holds, in order, the four counter
 * lines (ktx tail, ktx head, krx tail, krx head), the two size arrays and the
 * two slot arrays. */
struct proxy_pair {
    struct plait_conn *hc;
    char *host;                /* the pinned block (host address) */
    size_t bytes;
    char peer_str[160];
    char *ktx_slots;
    const uint32_t *ktx_sizes;
    const uint64_t *ktx_tail;  /* written by the kernel */
    uint64_t *ktx_head;        /* written by the proxy */
    char *krx_slots;
    uint32_t *krx_sizes;
    uint64_t *krx_tail;        /* written by the proxy */
    const uint64_t *krx_head;  /* written by the kernel */
    uint64_t ktx_taken;        /* kernel slots copied into hc (= what ktx head says) */
    uint64_t krx_given;        /* slots given to the kernel (= what krx tail says) */
    uint64_t ahead;            /* of those, slots the kernel has not drained: still held in hc */
};

struct plait_cuda_proxy {
    struct plait_comm *comm;
    const struct plait_cu *cu;
    struct proxy_pair *pairs;
    int npairs;
    const uint64_t *status;    /* kernel's host-mapped status words, NULL until watched */
    uint32_t *abort_word;
    pthread_t thread;
    int has_thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int sleeping;              /* the thread is (about to be) waiting on cond: kicks must signal */
    int stop;
    int failed;                /* an error was recorded: nothing moves any more */
    int watch_peers;           /* some peer is in another process: watch for its death */
    const uint64_t *ce_word;   /* the copy-engine collectives' done word (plait_cuda_ce_done_word) */
    uint64_t ce_target;        /* the last copy-engine collective issued (plait_cuda_proxy_kick_ce) */
    void *rel_stream;          /* the thread's stream for plait_cuda_ce_release_waits, made when needed */
    uint64_t target;           /* status[0] value the kicked launches reach */
    uint64_t finished;         /* the target the thread last saw reached and flushed */
};

static size_t line_up(size_t x)
{
    return (x + PROXY_LINE - 1) / PROXY_LINE * PROXY_LINE;
}

static plait_result_t proxy_get(struct plait_comm *comm, struct plait_cuda_proxy **out)
{
    if (comm->cuda_proxy) {
        *out = comm->cuda_proxy;
        return PLAIT_SUCCESS;
    }
    const struct plait_cu *cu = plait_cu_get();
    if (!cu)
        return plait_error(PLAIT_ERR_INVALID_USAGE, "proxy: rank %d: no CUDA driver for device connections", comm->rank);
    struct plait_cuda_proxy *px = calloc(1, sizeof(*px));
    if (!px)
        return plait_error(PLAIT_ERR_SYSTEM, "proxy: rank %d: out of memory", comm->rank);
    px->comm = comm;
    px->cu = cu;
    pthread_mutex_init(&px->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&px->cond, &ca);
    pthread_condattr_destroy(&ca);
    comm->cuda_proxy = px;
    *out = px;
    return PLAIT_SUCCESS;
}

plait_result_t plait_cuda_proxy_conn(struct plait_comm *comm, struct plait_conn *hc, struct plait_dev_conn *dc)
{
    if (!hc || !dc)
        return plait_error(PLAIT_ERR_INTERNAL, "plait_cuda_proxy_conn: NULL connection");
    struct plait_cuda_proxy *px = NULL;
    plait_result_t status = proxy_get(comm, &px);
    if (status)
        return status;
    if (px->has_thread)
        return plait_error(PLAIT_ERR_INTERNAL, "plait_cuda_proxy_conn: the proxy of rank %d already runs", comm->rank);
    if (hc->slot_bytes == 0 || hc->slot_bytes % PROXY_LINE || hc->slot_bytes > UINT32_MAX || hc->nslots == 0)
        return plait_error(PLAIT_ERR_INTERNAL, "plait_cuda_proxy_conn: connection to rank %d has %u slots of %zu bytes",
                           hc->peer, hc->nslots, hc->slot_bytes);
    struct proxy_pair *grown = realloc(px->pairs, (size_t)(px->npairs + 1) * sizeof(*grown));
    if (!grown)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_cuda_proxy_conn: out of memory");
    px->pairs = grown;
    struct proxy_pair *pp = &px->pairs[px->npairs];
    memset(pp, 0, sizeof(*pp));
    pp->hc = hc;
    plait_peer_str(comm, hc->peer, pp->peer_str, sizeof(pp->peer_str));

    const size_t n = hc->nslots, slot = hc->slot_bytes;
    const size_t sizes = line_up(n * sizeof(uint32_t));
    const size_t off_sizes = 4 * PROXY_LINE, off_slots = off_sizes + 2 * sizes;
    pp->bytes = off_slots + 2 * n * slot;
    void *host = NULL;
    int r = px->cu->MemHostAlloc(&host, pp->bytes, PLAIT_CU_MEMHOSTALLOC_PORTABLE | PLAIT_CU_MEMHOSTALLOC_DEVICEMAP);
    if (r)
        return plait_error_context(plait_cu_error(r, "proxy FIFOs", "cuMemHostAlloc"), "plait_cuda_proxy_conn: %s",
                                   pp->peer_str);
    plait_cudevptr dev = 0;
    r = px->cu->MemHostGetDevicePointer(&dev, host, 0);
    if (r) {
        px->cu->MemFreeHost(host);
        return plait_error_context(plait_cu_error(r, "proxy FIFOs", "cuMemHostGetDevicePointer"),
                                   "plait_cuda_proxy_conn: %s", pp->peer_str);
    }
    memset(host, 0, pp->bytes);
    char *h = host;
    pp->host = h;
    pp->ktx_tail = (const uint64_t *)(h + 0 * PROXY_LINE);
    pp->ktx_head = (uint64_t *)(h + 1 * PROXY_LINE);
    pp->krx_tail = (uint64_t *)(h + 2 * PROXY_LINE);
    pp->krx_head = (const uint64_t *)(h + 3 * PROXY_LINE);
    pp->ktx_sizes = (const uint32_t *)(h + off_sizes);
    pp->krx_sizes = (uint32_t *)(h + off_sizes + sizes);
    pp->ktx_slots = h + off_slots;
    pp->krx_slots = h + off_slots + n * slot;

    /* The kernel's view: its tx side is the proxy's ktx (slots, sizes and tail
     * "with the receiver", head with itself), its rx side the proxy's krx. */
    memset(dc, 0, sizeof(*dc));
    dc->tx.slots = (char *)(uintptr_t)(dev + off_slots);
    dc->tx.ll = NULL; /* no LL through the proxy: LL flags would cross the wire one word at a time */
    dc->tx.sizes = (uint32_t *)(uintptr_t)(dev + off_sizes);
    dc->tx.tail = (uint64_t *)(uintptr_t)(dev + 0 * PROXY_LINE);
    dc->tx.head = (uint64_t *)(uintptr_t)(dev + 1 * PROXY_LINE);
    dc->rx.slots = (char *)(uintptr_t)(dev + off_slots + n * slot);
    dc->rx.ll = NULL;
    dc->rx.sizes = (uint32_t *)(uintptr_t)(dev + off_sizes + sizes);
    dc->rx.tail = (uint64_t *)(uintptr_t)(dev + 2 * PROXY_LINE);
    dc->rx.head = (uint64_t *)(uintptr_t)(dev + 3 * PROXY_LINE);
    dc->tx_posted = 0;
    dc->rx_consumed = 0;
    dc->nslots = (uint32_t)n;
    dc->slot_bytes = (uint32_t)slot;
    dc->peer = hc->peer;
    dc->scope = PLAIT_SCOPE_SYS;
    px->npairs++;
    return PLAIT_SUCCESS;
}

plait_result_t plait_cuda_proxy_watch(struct plait_comm *comm, const uint64_t *status, uint32_t *abort_word,
                                      int watch_peers)
{
    struct plait_cuda_proxy *px = comm->cuda_proxy;
    if (!px && !watch_peers)
        return PLAIT_SUCCESS;
    plait_result_t res = proxy_get(comm, &px);
    if (res)
        return res;
    px->status = status;
    px->abort_word = abort_word;
    px->watch_peers = watch_peers;
    plait_cuda_ce_done_word(comm, &px->ce_word);
    return PLAIT_SUCCESS;
}

/* Copy-engine collectives issued and not yet done on their streams. */
static int ce_busy(const struct plait_cuda_proxy *px)
{
    return px->ce_word && __atomic_load_n(&px->ce_target, __ATOMIC_SEQ_CST) > __atomic_load_n(px->ce_word, __ATOMIC_ACQUIRE);
}

/* After a failure: the copy-engine collectives' stream waits have no
 * deadline, so the flags they wait for are set from here (their data is
 * garbage; the communicator is in error). */
static void release_ce(struct plait_cuda_proxy *px)
{
    if (!px->rel_stream) {
        void *ctx = plait_cuda_ctx(px->comm);
        if (!ctx || px->cu->CtxSetCurrent(ctx) ||
            px->cu->StreamCreateWithPriority(&px->rel_stream, PLAIT_CU_STREAM_NON_BLOCKING, 0)) {
            px->rel_stream = NULL;
            return;
        }
    }
    plait_cuda_ce_release_waits(px->comm, px->rel_stream);
}

/* Raises the kernel's abort word, records `msg` as the communicator's
 * asynchronous error (the first error wins there) and puts the communicator
 * in error. */
static void proxy_fail(struct plait_cuda_proxy *px, plait_result_t res, const char *msg)
{
    if (px->abort_word)
        __atomic_store_n(px->abort_word, 1u, __ATOMIC_RELEASE);
    if (!px->failed) {
        PLAIT_WARN(PLAIT_SUBSYS_TRANSPORT, "%s", msg);
        /* Later calls fail naming it (copy-engine collectives have no kernel
         * status word for plait_cuda_poll_error to find). */
        plait_comm_mark_failed_msg(px->comm, res, msg);
    }
    px->failed = 1;
}

/* Releases hc's slots whose copies the kernel has drained (acquiring krx
 * head: its reads of them are done). */
static void pair_release_drained(struct proxy_pair *pp)
{
    const uint64_t drained = __atomic_load_n(pp->krx_head, __ATOMIC_ACQUIRE);
    while (pp->ahead > 0 && pp->krx_given - pp->ahead < drained) {
        plait_conn_recv_release(pp->hc);
        pp->ahead--;
    }
}

/* Moves what can move on one pair without blocking; *moved counts slots. */
static plait_result_t pair_step(struct proxy_pair *pp, int *moved)
{
    struct plait_conn *hc = pp->hc;
    const uint64_t n = hc->nslots;
    /* kernel -> wire: each slot the kernel published, as long as hc has credit */
    const uint64_t ktail = __atomic_load_n(pp->ktx_tail, __ATOMIC_ACQUIRE);
    while (pp->ktx_taken < ktail) {
        void *dst = plait_conn_send_slot(hc);
        if (!dst)
            break;
        const size_t i = (size_t)(pp->ktx_taken % n);
        const uint32_t bytes = pp->ktx_sizes[i];
        if (bytes == 0 || bytes > hc->slot_bytes)
            return plait_error(PLAIT_ERR_INTERNAL, "proxy: the kernel sent a slot of %u bytes (slots hold %zu) to %s",
                               bytes, hc->slot_bytes, pp->peer_str);
        memcpy(dst, pp->ktx_slots + i * hc->slot_bytes, bytes);
        plait_conn_send_commit(hc, bytes);
        pp->ktx_taken++;
        __atomic_store_n(pp->ktx_head, pp->ktx_taken, __ATOMIC_RELEASE);
        (*moved)++;
    }
    struct plait_conn *failed = NULL;
    plait_result_t res = hc->needs_progress ? hc->tp->progress(hc->ctx, hc, &failed) : PLAIT_SUCCESS;
    if (res)
        return res;
    /* wire -> kernel: each slot hc received, as long as the kernel has room.
     * hc's slot is released only once the kernel has drained its copy, so
     * that slots the kernel never takes stay hc's (pair_give_back). */
    pair_release_drained(pp);
    for (;;) {
        if (pp->krx_given - __atomic_load_n(pp->krx_head, __ATOMIC_ACQUIRE) >= n)
            break;
        const uint64_t seq = hc->rx_consumed + pp->ahead;
        if (__atomic_load_n(hc->rx_tail, __ATOMIC_ACQUIRE) <= seq)
            break;
        const size_t j = (size_t)(seq % n), i = (size_t)(pp->krx_given % n);
        const uint32_t bytes = hc->rx_sizes[j];
        memcpy(pp->krx_slots + i * hc->slot_bytes, hc->rx_slots + j * hc->slot_bytes, bytes);
        pp->krx_sizes[i] = bytes;
        pp->krx_given++;
        pp->ahead++;
        __atomic_store_n(pp->krx_tail, pp->krx_given, __ATOMIC_RELEASE);
        (*moved)++;
    }
    return PLAIT_SUCCESS;
}

/* Slots the proxy gave the kernel beyond what its launches drained belong to
 * whatever runs next on the connection. When that is a kernel, it finds them
 * in its FIFO; when it is the CPU executor, they must be back in hc: this
 * takes them out of the kernel's FIFO (its tail goes back to its head) and
 * leaves them in hc, never released. Only with no launch in flight. */
static void pair_give_back(struct proxy_pair *pp)
{
    pair_release_drained(pp);
    if (!pp->ahead)
        return;
    pp->krx_given -= pp->ahead;
    pp->ahead = 0;
    __atomic_store_n(pp->krx_tail, pp->krx_given, __ATOMIC_RELEASE);
}

/* Whether every slot the kernel published is on the wire. */
static int pair_drained(const struct proxy_pair *pp)
{
    return pp->ktx_taken == __atomic_load_n(pp->ktx_tail, __ATOMIC_ACQUIRE) &&
           (!pp->hc->tp->is_flushed || pp->hc->tp->is_flushed(pp->hc->ctx, pp->hc));
}

/* Sleeps until a kick raises target past `finished`, or stop, or a timeout
 * (so that an abort is noticed even without a kick). The Dekker pair with
 * plait_cuda_proxy_kick: we store sleeping then load target, the kicker stores
 * target then loads sleeping (both sequentially consistent), so at least one
 * of us sees the other: no kick is lost. */
static void proxy_idle(struct plait_cuda_proxy *px)
{
    pthread_mutex_lock(&px->lock);
    __atomic_store_n(&px->sleeping, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&px->stop, __ATOMIC_SEQ_CST) &&
        __atomic_load_n(&px->target, __ATOMIC_SEQ_CST) <= __atomic_load_n(&px->finished, __ATOMIC_RELAXED) &&
        !ce_busy(px)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += PROXY_IDLE_WAIT_NS;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&px->cond, &px->lock, &ts);
    }
    __atomic_store_n(&px->sleeping, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&px->lock);
}

/* The launch in flight cannot complete because `peer` is gone: the error
 * names the rank that failed first (plait_comm_peer_gone; this thread may
 * wait there up to PLAIT_BLAME_GRACE_S for the evidence). */
static void proxy_fail_gone(struct plait_cuda_proxy *px, int peer, const char *what)
{
    struct plait_comm *comm = px->comm;
    plait_comm_peer_gone(comm, peer, what);
    char msg[1024];
    snprintf(msg, sizeof(msg), "device operation on rank %d: %s", comm->rank, plait_last_error_get());
    proxy_fail(px, PLAIT_ERR_REMOTE, msg);
}

/* The peer checks of a launch in flight (when the proxy's waiter says they
 * are due, every PLAIT_WAIT_CHECK_NS of waiting):
 * a death another rank published, or the abort flag, fails it at once, as in
 * a CPU wait (plait_comm_check_waiting); a peer process that is gone fails
 * it once no launch has completed for PROXY_EXITED_GRACE_S since it was seen
 * gone (what it left in our FIFOs may still let the launch finish). Returns
 * 1 when the launch was failed. */
static int watch_peers(struct plait_cuda_proxy *px, uint64_t target, uint64_t done, double *exited_since,
                       uint64_t *exited_done)
{
    struct plait_comm *comm = px->comm;
    if (plait_comm_check_waiting(comm)) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "device operation on rank %d: %s", comm->rank, plait_last_error_get());
        proxy_fail(px, PLAIT_ERR_REMOTE, msg);
        return 1;
    }
    /* A captured graph keeps the target at PLAIT_PROXY_FOREVER whether or not
     * a replay runs: a peer that has exited may just be done with the job. */
    if (target == PLAIT_PROXY_FOREVER && !ce_busy(px))
        return 0;
    int exited = -1;
    for (int p = 0; p < comm->nranks && exited < 0 && comm->peer_exited; p++)
        if (p != comm->rank && __atomic_load_n(&comm->peer_exited[p], __ATOMIC_ACQUIRE))
            exited = p;
    if (exited < 0)
        return 0;
    if (*exited_since == 0 || done != *exited_done) {
        *exited_since = plait_now();
        *exited_done = done;
        return 0;
    }
    if (plait_now() - *exited_since <= PROXY_EXITED_GRACE_S)
        return 0;
    proxy_fail_gone(px, exited, "its process exited while a device operation waits for it");
    return 1;
}

static void *proxy_main(void *arg)
{
    struct plait_cuda_proxy *px = arg;
    struct plait_comm *comm = px->comm;
    /* Polling while a launch is in flight: the communicator's spin, then
     * PROXY_YIELD_NS of yielding, then sleeps growing from 1 us to
     * PROXY_MAX_NAP_NS. A watcher with nothing to move does not spin: it
     * sleeps PROXY_WATCH_NAP_NS between polls. No deadline: the kernel's own
     * waits have it. */
    struct plait_waiter w;
    plait_waiter_init(&w, comm->spin_ns, 0);
    if (px->npairs == 0)
        plait_waiter_pace(&w, 0, 0, PROXY_WATCH_NAP_NS, PROXY_WATCH_NAP_NS);
    else
        plait_waiter_pace(&w, comm->spin_ns, PROXY_YIELD_NS, 1000, PROXY_MAX_NAP_NS);
    uint64_t exited_done = 0;
    double gone_quiet_since = 0, exited_since = 0;
    while (!__atomic_load_n(&px->stop, __ATOMIC_ACQUIRE)) {
        const uint64_t target = __atomic_load_n(&px->target, __ATOMIC_SEQ_CST);
        const uint64_t finished = __atomic_load_n(&px->finished, __ATOMIC_RELAXED);
        const int ce = ce_busy(px);
        if (target <= finished && !ce) {
            proxy_idle(px);
            plait_wait_moved(&w); /* the next launch starts the spin over */
            continue;
        }
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
            char msg[256];
            snprintf(msg, sizeof(msg), "proxy: rank %d: communicator aborted; device FIFOs over sockets stopped",
                     comm->rank);
            proxy_fail(px, PLAIT_ERR_REMOTE, msg);
        }
        if (px->failed) {
            /* Nothing moves any more: the launches end through the abort word,
             * the copy-engine collectives through their flags. */
            __atomic_store_n(&px->finished, target, __ATOMIC_RELEASE);
            if (ce) {
                release_ce(px);
                plait_nap_ns(10 * PROXY_WATCH_NAP_NS);
            }
            continue;
        }
        /* Acquire the completion count first: the kernel's FIFO stores of a
         * completed launch are then visible to pair_drained. Progress of the
         * copy-engine collectives counts too. */
        const uint64_t done = __atomic_load_n(px->status, __ATOMIC_ACQUIRE);
        const uint64_t progress = done + (px->ce_word ? __atomic_load_n(px->ce_word, __ATOMIC_ACQUIRE) : 0);
        int moved = 0, drained = 1;
        const struct proxy_pair *gone = NULL;
        for (int i = 0; i < px->npairs && !px->failed; i++) {
            struct proxy_pair *pp = &px->pairs[i];
            plait_result_t res = pair_step(pp, &moved);
            if (res) {
                char msg[1024], why[768];
                snprintf(why, sizeof(why), "%s", plait_last_error_get());
                if (plait_conn_peer_gone(pp->hc)) {
                    /* The peer went away: name the rank that failed first. */
                    plait_comm_peer_gone(comm, pp->hc->peer, why);
                    snprintf(why, sizeof(why), "%s", plait_last_error_get());
                    snprintf(msg, sizeof(msg), "device operation on rank %d: %s", comm->rank, why);
                } else {
                    snprintf(msg, sizeof(msg), "proxy: rank %d: device connection with %s failed: %s", comm->rank,
                             pp->peer_str, why);
                }
                proxy_fail(px, res == PLAIT_ERR_INTERNAL ? res : PLAIT_ERR_REMOTE, msg);
                break;
            }
            drained = drained && pair_drained(pp);
            if (plait_conn_peer_gone(pp->hc) && !gone)
                gone = pp;
        }
        if (px->failed)
            continue;
        if (done >= target && drained && target > finished) {
            /* Release: our last uses of the host connections come before a
             * CPU executor's acquire in plait_cuda_proxy_busy. */
            __atomic_store_n(&px->finished, target, __ATOMIC_RELEASE);
            plait_wait_moved(&w);
            gone_quiet_since = 0;
            exited_since = 0;
            continue;
        }
        if (moved) {
            plait_wait_moved(&w);
            gone_quiet_since = 0;
            continue;
        }
        /* A peer that closed its connection while a launch still waits and
         * nothing moves anywhere: what the kernel waits for will not come. */
        if (gone) {
            if (gone_quiet_since == 0) {
                gone_quiet_since = plait_now();
            } else if (plait_now() - gone_quiet_since > PROXY_GONE_GRACE_S) {
                proxy_fail_gone(px, gone->hc->peer, "it closed its connection while a device operation waits for it");
                continue;
            }
        }
        if (plait_wait_idle(&w) && px->watch_peers)
            watch_peers(px, target, progress, &exited_since, &exited_done);
    }
    return NULL;
}

plait_result_t plait_cuda_proxy_start(struct plait_comm *comm)
{
    struct plait_cuda_proxy *px = comm->cuda_proxy;
    if (!px || (px->npairs == 0 && !px->watch_peers) || px->has_thread)
        return PLAIT_SUCCESS;
    if (!px->status)
        return plait_error(PLAIT_ERR_INTERNAL,
                           "plait_cuda_proxy_start: rank %d: no status words to watch (plait_cuda_proxy_watch)",
                           comm->rank);
    int e = pthread_create(&px->thread, NULL, proxy_main, px);
    if (e)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_cuda_proxy_start: rank %d: pthread_create: %s", comm->rank,
                           strerror(e));
    px->has_thread = 1;
    PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT, "proxy: rank %d moves %d device connections over sockets%s", comm->rank,
               px->npairs, px->watch_peers ? " and watches its peers in other processes" : "");
    return PLAIT_SUCCESS;
}

static void kick(struct plait_cuda_proxy *px, uint64_t *target, uint64_t seq)
{
    uint64_t cur = __atomic_load_n(target, __ATOMIC_RELAXED);
    while (cur < seq && !__atomic_compare_exchange_n(target, &cur, seq, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    if (__atomic_load_n(&px->sleeping, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&px->lock);
        pthread_cond_signal(&px->cond);
        pthread_mutex_unlock(&px->lock);
    }
}

void plait_cuda_proxy_kick(struct plait_comm *comm, uint64_t launch_seq)
{
    struct plait_cuda_proxy *px = comm->cuda_proxy;
    if (px && px->has_thread)
        kick(px, &px->target, launch_seq);
}

void plait_cuda_proxy_kick_ce(struct plait_comm *comm, uint64_t ce_seq)
{
    struct plait_cuda_proxy *px = comm->cuda_proxy;
    if (px && px->has_thread && px->watch_peers && px->ce_word)
        kick(px, &px->ce_target, ce_seq);
}

int plait_cuda_proxy_busy(struct plait_comm *comm)
{
    struct plait_cuda_proxy *px = comm->cuda_proxy;
    if (!px || !px->has_thread || px->npairs == 0) /* a watcher holds no host connection */
        return 0;
    const uint64_t finished = __atomic_load_n(&px->finished, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&px->target, __ATOMIC_ACQUIRE) > finished)
        return 1;
    /* Every launch is done and the thread touches no pair until the next
     * kick, which only this thread (the communicator's issuing thread) makes. */
    for (int i = 0; i < px->npairs; i++)
        pair_give_back(&px->pairs[i]);
    return 0;
}

int plait_cuda_proxy_captured(struct plait_comm *comm)
{
    struct plait_cuda_proxy *px = comm->cuda_proxy;
    return px && px->has_thread && __atomic_load_n(&px->target, __ATOMIC_ACQUIRE) == PLAIT_PROXY_FOREVER;
}

void plait_cuda_proxy_stop(struct plait_comm *comm)
{
    struct plait_cuda_proxy *px = comm->cuda_proxy;
    if (!px)
        return;
    if (px->has_thread) {
        pthread_mutex_lock(&px->lock);
        __atomic_store_n(&px->stop, 1, __ATOMIC_SEQ_CST);
        pthread_cond_signal(&px->cond);
        pthread_mutex_unlock(&px->lock);
        pthread_join(px->thread, NULL);
    }
    if (px->rel_stream)
        px->cu->StreamDestroy(px->rel_stream);
    for (int i = 0; i < px->npairs; i++)
        if (px->pairs[i].host)
            px->cu->MemFreeHost(px->pairs[i].host);
    free(px->pairs);
    pthread_cond_destroy(&px->cond);
    pthread_mutex_destroy(&px->lock);
    comm->cuda_proxy = NULL;
    free(px);
}
