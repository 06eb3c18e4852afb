/* The TCP transport: between ranks on different hosts (or every pair, with
 * PLAIT_TRANSPORT=socket). Users know it as "socket" (its name in the init
 * log, the prefix of its errors, PLAIT_TRANSPORT's value); inside it is tcp,
 * apart from base/net.c's plait_sock_* helpers it uses.
 *
 * One TCP connection per (peer, class) carries both directions. The executor
 * fills local staging FIFOs exactly as it fills a peer's shared FIFO; progress()
 * then moves committed slots onto the wire, each behind an 8-byte header
 * {magic, length}, and lands incoming ones in the receive FIFO, bumping the
 * local counters the executor polls. Nothing read from the wire is trusted: a bad
 * magic, a zero length or a length larger than a slot ends the connection with
 * an error of its own naming the peer and what was wrong (the peer is alive:
 * not "gone"), returned again by every later progress call. A peer's EOF is
 * recorded (peer_gone); it becomes an error only when the executor waits for
 * data or credit that can no longer come.
 *
 * Connections: init listens and allgathers every rank's address. The end
 * that first needs a connection dials the other (connect() starts it), both
 * sides run the challenge-response with the communicator's secret, the dialer
 * names its rank and class in a hello, and the acceptor answers "taken" or,
 * when it dialed the same connection itself and is the lower rank, "lost":
 * when both ends dial at once, the lower rank's dial is the connection. So a
 * send completes without its peer asking for the connection (its handshakes
 * move in progress()), as when every connection was made at init. Nothing
 * blocks: connect() only starts the dial; every accept() call, and progress()
 * every HS_PERIOD, moves every handshake of the context a step (this rank's
 * dials and the connections that came in, which wait in a list until their
 * hello says which they are, for at most HS_IN_LIMIT_S and at most
 * in_cap_max of them). A connection that fails the
 * handshake or whose hello names no connection this rank expects (not a hello,
 * a rank not below it, a class out of range, a class already connected) is
 * dropped and the expected peers keep their chance; if they do not come by the
 * deadline, the error says how many were dropped and, for the last, where it
 * came from and what was wrong (tests/test_tcp.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include "base/log.h"
#include "base/net.h"
#include "base/util.h"
#include "transports/transport.h"

#define TCP_MAGIC 0x504c5431u /* "PLT1" */
#define HELLO_MAGIC 0x504c4843u
/* The acceptor's answer to a hello: taken, or lost to the acceptor's own dial
 * of the same connection (both ends dialed at once: the lower rank's wins). */
#define REPLY_TAKEN 0x504c4f4bu
#define REPLY_LOST 0x504c4c53u

struct tcp_conn {
    struct plait_conn conn;
    int fd;
    char peer_str[160];
    char *tx_mem;
    char *rx_mem;
    uint32_t *tx_sizes;
    uint32_t *rx_sizes;
    uint64_t tx_tail;  /* committed by the executor */
    uint64_t tx_head;  /* slots fully on the wire (credit) */
    size_t tx_off;     /* bytes of the current slot (header included) sent */
    uint64_t rx_tail;  /* slots fully received */
    uint64_t rx_head;  /* slots drained by the executor */
    size_t rx_off;
    uint32_t rx_hdr[2];
    int eof; /* the peer closed its side: nothing more will arrive */
    int dialed; /* this rank dialed it (a hello for it from a higher rank crossed our dial: "lost") */
    char malformed[512]; /* set by a malformed message: the connection is dead, this is why */
    int busy;          /* a thread is in conn_progress (atomic) */
};

/* A handshake in progress: a dial of ours, or a connection that came in. */
enum hs_phase {
    HS_LATER,        /* dial of a higher rank: starts at `deadline` unless the lower rank's comes first */
    HS_CONNECTING,   /* dial: the TCP connect has not completed */
    HS_CHALLENGE,    /* dial: reading the challenge; in: writing it */
    HS_ANSWER,       /* dial: writing the answer; in: reading it */
    HS_PROOF,        /* dial: reading the proof; in: writing it */
    HS_HELLO,        /* in: reading the hello; dial: writing it */
    HS_REPLY,        /* dial: reading the answer to the hello; in: writing it */
};

struct handshake {
    int fd;
    int peer, cls;           /* dial: whom; in: -1 until the hello */
    enum hs_phase phase;
    struct plait_auth auth;
    uint8_t buf[PLAIT_AUTH_ANSWER_BYTES];
    size_t off, len;         /* of the current message in buf */
    char from[PLAIT_SOCKADDR_STRLEN];
    plait_result_t failed;   /* dial: how it failed (its accept() says so), PLAIT_SUCCESS while it goes on */
    char msg[512];
    double deadline;         /* in: dropped when its hello has not come by then; HS_LATER: when to dial */
};

/* A higher rank's dial waits this long for the lower rank's, which usually
 * comes at once when both need the connection (a collective's first call). */
#define HS_HIGHER_DELAY_S 2e-3

static plait_result_t dial_start(const struct plait_tp_env *env, const union plait_sockaddr *a,
                                 struct handshake *h);

/* An incoming connection that has not said who it is within this long is
 * dropped (it holds an fd of ours). */
#define HS_IN_LIMIT_S 30.0

struct tcp_state {
    const struct plait_tp_env *env;
    struct tcp_conn **conns;  /* every connection made, nconns of them (capacity: every one this rank may need) */
    int nconns;               /* release-stored: progress() reads it without the core's lock */
    int cap;
    struct tcp_conn **by;     /* [peer * ncls + cls]: the connection, once made */
    struct handshake **dials; /* [peer * ncls + cls]: this rank's dial in progress */
    struct handshake **in;    /* connections that came in, in their handshake */
    int nin, in_cap;
    union plait_sockaddr *addrs; /* every rank's listening address */
    int lfd;                  /* listening socket, -1 when this rank accepts nothing */
    int ndropped;             /* connections dropped for a failed handshake or a bad hello */
    char dropped[400];        /* the last of them: where from and why */
    char ifname[64];
    /* The handshakes move in accept() (the core's lock held) and, so that a
     * rank busy with other operations still answers a peer's dial, in
     * progress() at most every HS_PERIOD (try-locked: never waits). */
    pthread_mutex_t hs_lock;
    double hs_next;
};

#define HS_PERIOD 100e-6

static plait_result_t tcp_handshakes(struct tcp_state *st);

struct hello {
    uint32_t magic;
    int32_t rank;
    int32_t cls;
    uint32_t pad;
};

static plait_result_t conn_fail(struct tcp_conn *t, plait_result_t res, const char *what)
{
    return plait_error(res, "socket: %s with %s", what, t->peer_str);
}

static plait_result_t conn_progress_locked(struct plait_conn *conn);

/* Threads that run operations of one communicator at once (a stream's
 * worker, the calling thread) all move its connections: one at a time per
 * connection; a thread that finds it busy leaves it to the other. */
static plait_result_t conn_progress(struct plait_conn *conn)
{
    struct tcp_conn *t = (struct tcp_conn *)conn;
    if (__atomic_exchange_n(&t->busy, 1, __ATOMIC_ACQUIRE))
        return PLAIT_SUCCESS;
    plait_result_t res = conn_progress_locked(conn);
    __atomic_store_n(&t->busy, 0, __ATOMIC_RELEASE);
    return res;
}

static plait_result_t conn_progress_locked(struct plait_conn *conn)
{
    struct tcp_conn *t = (struct tcp_conn *)conn;
    const size_t slot = conn->slot_bytes;
    if (t->malformed[0])
        return plait_error(PLAIT_ERR_REMOTE, "%s", t->malformed);
    /* send committed slots */
    while (t->tx_head < __atomic_load_n(&t->tx_tail, __ATOMIC_ACQUIRE)) {
        size_t i = (size_t)(t->tx_head % conn->nslots);
        uint32_t len = t->tx_sizes[i];
        uint32_t hdr[2] = {TCP_MAGIC, len};
        struct iovec iov[2];
        int niov = 0;
        if (t->tx_off < sizeof(hdr)) {
            iov[niov].iov_base = (char *)hdr + t->tx_off;
            iov[niov].iov_len = sizeof(hdr) - t->tx_off;
            niov++;
            iov[niov].iov_base = t->tx_mem + i * slot;
            iov[niov].iov_len = len;
            niov++;
        } else {
            iov[niov].iov_base = t->tx_mem + i * slot + (t->tx_off - sizeof(hdr));
            iov[niov].iov_len = len - (t->tx_off - sizeof(hdr));
            niov++;
        }
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)niov;
        ssize_t n = sendmsg(t->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            __atomic_store_n(&conn->peer_gone, 1, __ATOMIC_RELEASE);
            return plait_error(PLAIT_ERR_REMOTE, "socket: send to %s failed: %s (peer gone?)", t->peer_str,
                               strerror(errno));
        }
        t->tx_off += (size_t)n;
        if (t->tx_off == sizeof(hdr) + len) {
            t->tx_off = 0;
            __atomic_store_n(&t->tx_head, t->tx_head + 1, __ATOMIC_RELEASE);
        }
    }
    /* receive into free slots */
    while (!t->eof && t->rx_tail - __atomic_load_n(&t->rx_head, __ATOMIC_ACQUIRE) < conn->nslots) {
        size_t i = (size_t)(t->rx_tail % conn->nslots);
        ssize_t n;
        if (t->rx_off < sizeof(t->rx_hdr)) {
            n = recv(t->fd, (char *)t->rx_hdr + t->rx_off, sizeof(t->rx_hdr) - t->rx_off, MSG_DONTWAIT);
        } else {
            size_t got = t->rx_off - sizeof(t->rx_hdr);
            n = recv(t->fd, t->rx_mem + i * slot + got, t->rx_hdr[1] - got, MSG_DONTWAIT);
        }
        if (n == 0) {
            t->eof = 1;
            __atomic_store_n(&conn->peer_gone, 1, __ATOMIC_RELEASE);
            if (t->rx_off != 0)
                return conn_fail(t, PLAIT_ERR_REMOTE, "connection closed in the middle of a message");
            break;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            __atomic_store_n(&conn->peer_gone, 1, __ATOMIC_RELEASE);
            return plait_error(PLAIT_ERR_REMOTE, "socket: receive from %s failed: %s", t->peer_str, strerror(errno));
        }
        t->rx_off += (size_t)n;
        if (t->rx_off == sizeof(t->rx_hdr)) {
            if (t->rx_hdr[0] != TCP_MAGIC || t->rx_hdr[1] == 0 || t->rx_hdr[1] > slot) {
                /* Not a death: the peer (or whoever writes on its
                 * connection) sent bytes that are no plait frame. */
                char what[96];
                if (t->rx_hdr[0] != TCP_MAGIC)
                    snprintf(what, sizeof(what), "bad magic 0x%08x (a frame starts with 0x%08x)", t->rx_hdr[0],
                             TCP_MAGIC);
                else if (t->rx_hdr[1] == 0)
                    snprintf(what, sizeof(what), "a frame of length 0");
                else
                    snprintf(what, sizeof(what), "a frame of %u bytes, larger than a slot (%zu bytes)", t->rx_hdr[1],
                             slot);
                snprintf(t->malformed, sizeof(t->malformed),
                         "socket: malformed message from %s on connection class %d, after %llu good frames: %s; "
                         "nothing more is read from this connection",
                         t->peer_str, conn->cls, (unsigned long long)t->rx_tail, what);
                return plait_error(PLAIT_ERR_REMOTE, "%s", t->malformed);
            }
        }
        if (t->rx_off > sizeof(t->rx_hdr) && t->rx_off == sizeof(t->rx_hdr) + t->rx_hdr[1]) {
            t->rx_sizes[i] = t->rx_hdr[1];
            t->rx_off = 0;
            __atomic_store_n(&t->rx_tail, t->rx_tail + 1, __ATOMIC_RELEASE);
        }
    }
    return PLAIT_SUCCESS;
}

static int conn_flushed(const struct plait_conn *conn)
{
    const struct tcp_conn *t = (const struct tcp_conn *)conn;
    return __atomic_load_n(&t->tx_head, __ATOMIC_ACQUIRE) == __atomic_load_n(&t->tx_tail, __ATOMIC_ACQUIRE);
}

/* Per context: every connection of the communicator on sockets. */
static plait_result_t tcp_progress(void *ctx, struct plait_conn *conn, struct plait_conn **failed)
{
    struct tcp_state *st = ctx;
    if (!conn && st && st->lfd >= 0) {
        const double now = plait_now();
        double next;
        __atomic_load(&st->hs_next, &next, __ATOMIC_RELAXED);
        if (now >= next && pthread_mutex_trylock(&st->hs_lock) == 0) {
            next = now + HS_PERIOD;
            __atomic_store(&st->hs_next, &next, __ATOMIC_RELAXED);
            /* a failure here is the failing connection's accept() to report */
            (void)tcp_handshakes(st);
            pthread_mutex_unlock(&st->hs_lock);
        }
    }
    if (conn) {
        plait_result_t res = conn_progress(conn);
        if (res)
            *failed = conn;
        return res;
    }
    const int n = st ? __atomic_load_n(&st->nconns, __ATOMIC_ACQUIRE) : 0;
    for (int i = 0; i < n; i++) {
        plait_result_t res = conn_progress(&st->conns[i]->conn);
        if (res) {
            *failed = &st->conns[i]->conn;
            return res;
        }
    }
    return PLAIT_SUCCESS;
}

static int tcp_is_flushed(void *ctx, const struct plait_conn *conn)
{
    struct tcp_state *st = ctx;
    if (conn)
        return conn_flushed(conn);
    const int n = st ? __atomic_load_n(&st->nconns, __ATOMIC_ACQUIRE) : 0;
    for (int i = 0; i < n; i++)
        if (!conn_flushed(&st->conns[i]->conn))
            return 0;
    return 1;
}

static void free_conn(struct tcp_conn *t)
{
    if (!t)
        return;
    if (t->fd >= 0)
        close(t->fd);
    free(t->tx_mem);
    free(t->rx_mem);
    free(t->tx_sizes);
    free(t->rx_sizes);
    free(t);
}

static plait_result_t make_conn(struct tcp_state *st, int fd, int peer, int cls, struct tcp_conn **out)
{
    const struct plait_tp_env *env = st->env;
    struct tcp_conn *t = calloc(1, sizeof(*t));
    if (!t)
        return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
    t->fd = fd;
    const size_t nslots = env->nslots, slot = env->slot_bytes;
    t->tx_mem = malloc(nslots * slot);
    t->rx_mem = malloc(nslots * slot);
    t->tx_sizes = calloc(nslots, sizeof(uint32_t));
    t->rx_sizes = calloc(nslots, sizeof(uint32_t));
    if (!t->tx_mem || !t->rx_mem || !t->tx_sizes || !t->rx_sizes) {
        t->fd = -1;
        free_conn(t);
        return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory for staging slots");
    }
    env->peer_str(env->core, peer, t->peer_str, sizeof(t->peer_str));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct plait_conn *c = &t->conn;
    c->tp = &plait_transport_tcp;
    c->ctx = st;
    c->peer = peer;
    c->cls = cls;
    c->needs_progress = 1;
    c->nslots = (uint32_t)nslots;
    c->slot_bytes = slot;
    c->tx_slots = t->tx_mem;
    c->tx_sizes = t->tx_sizes;
    c->tx_tail = &t->tx_tail;
    c->tx_head = &t->tx_head;
    c->rx_slots = t->rx_mem;
    c->rx_sizes = t->rx_sizes;
    c->rx_tail = &t->rx_tail;
    c->rx_head = &t->rx_head;
    *out = t;
    if (st->nconns >= st->cap) {
        t->fd = -1;
        free_conn(t);
        return plait_error(PLAIT_ERR_INTERNAL, "socket: more connections than rank %d may need", env->rank);
    }
    st->conns[st->nconns] = t;
    __atomic_store_n(&st->nconns, st->nconns + 1, __ATOMIC_RELEASE);
    st->by[peer * env->ncls + cls] = t;
    return PLAIT_SUCCESS;
}

static void hs_free(struct handshake *h)
{
    if (!h)
        return;
    if (h->fd >= 0)
        close(h->fd);
    free(h);
}

static void tcp_fini(void *ctx)
{
    struct tcp_state *st = ctx;
    if (!st)
        return;
    for (int i = 0; i < st->nconns; i++)
        free_conn(st->conns[i]);
    for (int i = 0; st->dials && i < st->env->nranks * st->env->ncls; i++)
        hs_free(st->dials[i]);
    for (int i = 0; i < st->nin; i++)
        hs_free(st->in[i]);
    if (st->lfd >= 0)
        close(st->lfd);
    free(st->conns);
    free(st->by);
    free(st->dials);
    free(st->in);
    free(st->addrs);
    pthread_mutex_destroy(&st->hs_lock);
    free(st);
}

static int tcp_can_join(const struct plait_tp_env *env, int a, int b)
{
    (void)env;
    return a != b ? 10 : 0;
}

static void tcp_query(const struct plait_tp_env *env, int a, int b, struct plait_tp_info *info)
{
    (void)env;
    (void)a;
    (void)b;
    memset(info, 0, sizeof(*info));
    info->link = PLAIT_LC_NET;
    info->sc = PLAIT_SC_NONE;
}

static int joins(const struct plait_tp_env *env, int a, int b)
{
    const int t = plait_tp_choose(env, a, b);
    return t >= 0 && plait_transports[t] == &plait_transport_tcp;
}

/* What is wrong with a hello that a connection to this rank introduced itself
 * with (written into why), or 0 when it names a connection this rank expects. */
static int hello_problem(const struct tcp_state *st, const struct hello *h, char *why, size_t len)
{
    const struct plait_tp_env *env = st->env;
    const int me = env->rank;
    if (h->magic != HELLO_MAGIC)
        snprintf(why, len, "not a hello (magic 0x%08x, a hello starts with 0x%08x)", h->magic, HELLO_MAGIC);
    else if (h->rank < 0 || h->rank >= env->nranks || h->rank == me)
        snprintf(why, len, "a hello from rank %d, not another rank of the %d of the communicator (this is rank %d)",
                 h->rank, env->nranks, me);
    else if (h->cls < 0 || h->cls >= env->ncls)
        snprintf(why, len, "a hello from rank %d for connection class %d of %d", h->rank, h->cls, env->ncls);
    else if (!joins(env, me, h->rank))
        snprintf(why, len, "a hello from rank %d, which does not use sockets with rank %d", h->rank, me);
    else if (!env->wanted(env->core, me, h->rank, h->cls))
        snprintf(why, len, "a hello from rank %d for connection class %d, which rank %d does not use", h->rank,
                 h->cls, me);
    else if (st->by[h->rank * env->ncls + h->cls] && !st->by[h->rank * env->ncls + h->cls]->dialed)
        snprintf(why, len, "a second hello from rank %d for connection class %d", h->rank, h->cls);
    else
        return 0;
    return 1;
}

/* Collective: listens (when this rank may have socket peers) and allgathers
 * every rank's address. */
static plait_result_t tcp_init(const struct plait_tp_env *env, void **ctx)
{
    const int n = env->nranks, me = env->rank;
    *ctx = NULL;
    if (n <= 0)
        return plait_error(PLAIT_ERR_INTERNAL, "socket: %d ranks", n);
    int nconns = 0;
    for (int p = 0; p < n; p++) {
        if (!joins(env, me, p))
            continue;
        for (int c = 0; c < env->ncls; c++)
            if (env->wanted(env->core, me, p, c))
                nconns++;
    }
    /* The exchange of addresses is collective, even for ranks without sockets. */
    struct tcp_state *st = calloc(1, sizeof(*st));
    union plait_sockaddr *addrs = calloc((size_t)n, sizeof(*addrs));
    if (!addrs || !st) {
        free(addrs);
        free(st);
        return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
    }
    st->env = env;
    st->addrs = addrs;
    st->lfd = -1;
    pthread_mutex_init(&st->hs_lock, NULL);
    plait_result_t status = PLAIT_SUCCESS;
    if (nconns > 0) {
        /* Without PLAIT_SOCKET_IFNAME, listen where the bootstrap reaches its
         * peers: the local address of the setup ring's connection is the one the
         * routing table picked for this job. */
        socklen_t alen = sizeof(addrs[me]);
        const int ring_fd = env->bootstrap_fd;
        if (!env->ifname[0] && ring_fd >= 0 && getsockname(ring_fd, &addrs[me].sa, &alen) == 0) {
            if (addrs[me].sa.sa_family == AF_INET)
                addrs[me].sin.sin_port = 0;
            else
                addrs[me].sin6.sin6_port = 0;
            snprintf(st->ifname, sizeof(st->ifname), "the bootstrap's interface");
        } else {
            status = plait_sock_find_ifaddr(env->ifname, &addrs[me], st->ifname, sizeof(st->ifname));
        }
        if (!status)
            status = plait_sock_listen(&addrs[me], &st->lfd);
        if (!status)
            fcntl(st->lfd, F_SETFL, fcntl(st->lfd, F_GETFL) | O_NONBLOCK);
        st->cap = nconns;
        st->conns = calloc((size_t)nconns, sizeof(*st->conns));
        st->by = calloc((size_t)n * (size_t)env->ncls, sizeof(*st->by));
        st->dials = calloc((size_t)n * (size_t)env->ncls, sizeof(*st->dials));
        if (!status && (!st->conns || !st->by || !st->dials))
            status = plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
    }
    plait_result_t ag = env->allgather(env->core, addrs, sizeof(*addrs));
    if (!status)
        status = ag;
    if (status) {
        tcp_fini(st);
        return status;
    }
    if (nconns > 0) {
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT, "socket: rank %d listens on %s for up to %d TCP connections", me,
                   st->ifname, nconns);
        *ctx = st;
    } else {
        tcp_fini(st);
    }
    return PLAIT_SUCCESS;
}

/* Opens the socket of a dial and starts its TCP connect. */
static plait_result_t dial_start(const struct plait_tp_env *env, const union plait_sockaddr *a, struct handshake *h)
{
    h->phase = HS_CONNECTING;
    h->fd = socket(a->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const socklen_t alen = a->sa.sa_family == AF_INET6 ? sizeof(a->sin6) : sizeof(a->sin);
    if (h->fd < 0 || (connect(h->fd, &a->sa, alen) != 0 && errno != EINPROGRESS)) {
        const int e = errno;
        char who[160];
        return plait_error(PLAIT_ERR_REMOTE, "socket: connecting to %s at %s: %s",
                           env->peer_str(env->core, h->peer, who, sizeof(who)), h->from, strerror(e));
    }
    return PLAIT_SUCCESS;
}

/* Starts dialing the peer, unless its dial has made the connection already.
 * With PLAIT_TP_BOTH_NOW only the lower rank dials (the higher one knows it
 * comes); otherwise the higher rank dials too, a little later, so that the
 * connection is made even if the lower rank asks for it only later. */
static plait_result_t tcp_connect(void *ctx, int peer, int cls, unsigned flags, void *blob)
{
    (void)blob;
    struct tcp_state *st = ctx;
    if (!st)
        return plait_error(PLAIT_ERR_INTERNAL, "socket: a connection to rank %d with no socket peer", peer);
    const struct plait_tp_env *env = st->env;
    const int i = peer * env->ncls + cls;
    const int higher = peer < env->rank;
    if (higher && (flags & PLAIT_TP_BOTH_NOW))
        return PLAIT_SUCCESS; /* it dials us */
    pthread_mutex_lock(&st->hs_lock);
    const int skip = st->by[i] != NULL || st->dials[i] != NULL;
    pthread_mutex_unlock(&st->hs_lock);
    if (skip)
        return PLAIT_SUCCESS;
    struct handshake *h = calloc(1, sizeof(*h));
    if (!h)
        return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
    h->fd = -1;
    h->peer = peer;
    h->cls = cls;
    plait_sockaddr_str(&st->addrs[peer], h->from, sizeof(h->from));
    if (higher) {
        h->phase = HS_LATER;
        h->deadline = plait_now() + HS_HIGHER_DELAY_S;
    } else {
        plait_result_t status = dial_start(env, &st->addrs[peer], h);
        if (status) {
            hs_free(h);
            return status;
        }
    }
    pthread_mutex_lock(&st->hs_lock);
    if (st->by[i] || st->dials[i]) {
        hs_free(h); /* made meanwhile by the peer's dial (progress() on another thread) */
    } else {
        st->dials[i] = h;
    }
    pthread_mutex_unlock(&st->hs_lock);
    return PLAIT_SUCCESS;
}

/* Moves buf[off, len) in or out of h->fd without blocking: 1 when done, 0
 * when the socket would block, -1 on an error or (reading) the peer's EOF
 * (errno set, ECONNRESET for EOF). */
static int hs_io(struct handshake *h, int writing)
{
    while (h->off < h->len) {
        ssize_t k = writing ? send(h->fd, h->buf + h->off, h->len - h->off, MSG_DONTWAIT | MSG_NOSIGNAL)
                            : recv(h->fd, h->buf + h->off, h->len - h->off, MSG_DONTWAIT);
        if (k > 0) {
            h->off += (size_t)k;
            continue;
        }
        if (k == 0) {
            errno = ECONNRESET;
            return -1;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return 0;
        return -1;
    }
    return 1;
}

static void hs_expect(struct handshake *h, enum hs_phase phase, size_t len)
{
    h->phase = phase;
    h->off = 0;
    h->len = len;
}

/* One step of a dial: 1 when it made the connection, 0 when it waits, or an
 * error (naming the peer). */
static plait_result_t dial_step(struct tcp_state *st, struct handshake *h, int *made)
{
    const struct plait_tp_env *env = st->env;
    char who[160];
    *made = 0;
    for (;;) {
        int r;
        switch (h->phase) {
        case HS_LATER: {
            if (plait_now() < h->deadline)
                return PLAIT_SUCCESS;
            plait_result_t status = dial_start(env, &st->addrs[h->peer], h);
            if (status)
                return status;
            continue;
        }
        case HS_CONNECTING: {
            struct pollfd pfd = {.fd = h->fd, .events = POLLOUT};
            if (poll(&pfd, 1, 0) <= 0)
                return PLAIT_SUCCESS;
            int err = 0;
            socklen_t elen = sizeof(err);
            if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
                err = errno;
            if (err)
                return plait_error(PLAIT_ERR_REMOTE, "socket: connecting to %s at %s: %s (peer gone?)",
                                   env->peer_str(env->core, h->peer, who, sizeof(who)), h->from, strerror(err));
            hs_expect(h, HS_CHALLENGE, PLAIT_AUTH_CHALLENGE_BYTES);
            continue;
        }
        case HS_CHALLENGE:
            if ((r = hs_io(h, 0)) <= 0)
                break;
            {
                uint8_t challenge[PLAIT_AUTH_CHALLENGE_BYTES];
                memcpy(challenge, h->buf, sizeof(challenge));
                if (!plait_auth_client_answer(&h->auth, env->secret, challenge, h->buf))
                    return plait_error(PLAIT_ERR_REMOTE, "socket: authentication with %s at %s failed: not a plait "
                                                         "peer (bad protocol tag)",
                                       env->peer_str(env->core, h->peer, who, sizeof(who)), h->from);
            }
            hs_expect(h, HS_ANSWER, PLAIT_AUTH_ANSWER_BYTES);
            continue;
        case HS_ANSWER:
            if ((r = hs_io(h, 1)) <= 0)
                break;
            hs_expect(h, HS_PROOF, PLAIT_AUTH_PROOF_BYTES);
            continue;
        case HS_PROOF:
            if ((r = hs_io(h, 0)) <= 0) {
                if (r < 0 && errno == ECONNRESET)
                    return plait_error(PLAIT_ERR_REMOTE, "socket: authentication with %s at %s failed: the peer "
                                                         "refused our answer (a different secret?)",
                                       env->peer_str(env->core, h->peer, who, sizeof(who)), h->from);
                break;
            }
            if (!plait_auth_client_check(&h->auth, env->secret, h->buf))
                return plait_error(PLAIT_ERR_REMOTE, "socket: authentication with %s at %s failed: the peer does not "
                                                     "hold the secret",
                                   env->peer_str(env->core, h->peer, who, sizeof(who)), h->from);
            {
                /* 16 bytes into an empty socket buffer: it does not block */
                struct hello hello = {HELLO_MAGIC, env->rank, h->cls, 0};
                plait_result_t status =
                    plait_sock_send_all(h->fd, &hello, sizeof(hello), plait_deadline(env->timeout_s), env->abort_flag);
                if (status)
                    return plait_error_context(status, "socket: the hello to %s",
                                               env->peer_str(env->core, h->peer, who, sizeof(who)));
            }
            hs_expect(h, HS_REPLY, sizeof(uint32_t));
            continue;
        case HS_REPLY: {
            if ((r = hs_io(h, 0)) <= 0) {
                if (r < 0 && errno == ECONNRESET)
                    return plait_error(PLAIT_ERR_REMOTE, "socket: %s at %s closed the connection after our hello "
                                                         "(it refused it: see its log)",
                                       env->peer_str(env->core, h->peer, who, sizeof(who)), h->from);
                break;
            }
            uint32_t reply;
            memcpy(&reply, h->buf, sizeof(reply));
            if (reply == REPLY_LOST) {
                *made = -1; /* the peer's own dial is the connection */
                return PLAIT_SUCCESS;
            }
            if (reply != REPLY_TAKEN)
                return plait_error(PLAIT_ERR_REMOTE, "socket: %s at %s answered our hello with 0x%08x",
                                   env->peer_str(env->core, h->peer, who, sizeof(who)), h->from, reply);
            struct tcp_conn *t = NULL;
            plait_result_t status = make_conn(st, h->fd, h->peer, h->cls, &t);
            if (status)
                return status;
            t->dialed = 1;
            h->fd = -1; /* the connection's now */
            *made = 1;
            return PLAIT_SUCCESS;
        }
        case HS_HELLO:
            return plait_error(PLAIT_ERR_INTERNAL, "socket: a dial in the accepting phase");
        }
        if (r < 0)
            return plait_error(PLAIT_ERR_REMOTE, "socket: handshake with %s at %s: %s (peer gone?)",
                               env->peer_str(env->core, h->peer, who, sizeof(who)), h->from, strerror(errno));
        return PLAIT_SUCCESS;
    }
}

/* Drops a connection that came in (a WARN; the expected peers keep their
 * chance). */
static void drop_in(struct tcp_state *st, struct handshake *h, const char *why)
{
    snprintf(st->dropped, sizeof(st->dropped), "from %s: %s", h->from, why);
    if (st->ndropped < 10 || st->ndropped % 1000 == 0)
        PLAIT_WARN(PLAIT_SUBSYS_TRANSPORT, "socket: rank %d dropped a connection %s (%d dropped so far)",
                   st->env->rank, st->dropped, st->ndropped + 1);
    st->ndropped++;
}

/* One step of a connection that came in: 1 when done with it (made or
 * dropped), 0 when it waits. */
static int in_step(struct tcp_state *st, struct handshake *h, plait_result_t *err)
{
    const struct plait_tp_env *env = st->env;
    for (;;) {
        int r;
        switch (h->phase) {
        case HS_CHALLENGE:
            if ((r = hs_io(h, 1)) <= 0)
                break;
            hs_expect(h, HS_ANSWER, PLAIT_AUTH_ANSWER_BYTES);
            continue;
        case HS_ANSWER: {
            if ((r = hs_io(h, 0)) <= 0)
                break;
            uint8_t answer[PLAIT_AUTH_ANSWER_BYTES];
            memcpy(answer, h->buf, sizeof(answer));
            if (!plait_auth_server_check(&h->auth, env->secret, answer, h->buf)) {
                drop_in(st, h, "authentication failed: the answer is wrong (a different secret?)");
                return 1;
            }
            hs_expect(h, HS_PROOF, PLAIT_AUTH_PROOF_BYTES);
            continue;
        }
        case HS_PROOF:
            if ((r = hs_io(h, 1)) <= 0)
                break;
            hs_expect(h, HS_HELLO, sizeof(struct hello));
            continue;
        case HS_HELLO: {
            if ((r = hs_io(h, 0)) <= 0)
                break;
            struct hello hello;
            char why[200];
            memcpy(&hello, h->buf, sizeof(hello));
            if (hello_problem(st, &hello, why, sizeof(why))) {
                drop_in(st, h, why);
                return 1;
            }
            const int i = hello.rank * env->ncls + hello.cls;
            /* Both ends dialed: the lower rank's dial is the connection. */
            const int lost = hello.rank > env->rank && (st->dials[i] || st->by[i]);
            uint32_t reply = lost ? REPLY_LOST : REPLY_TAKEN;
            if (plait_sock_send_all(h->fd, &reply, sizeof(reply), plait_deadline(1.0), env->abort_flag)) {
                drop_in(st, h, "it closed before our answer to its hello");
                return 1;
            }
            if (lost)
                return 1;
            /* A dial of ours to this lower rank goes on: the peer answers
             * it "lost" and it ends quietly. */
            struct tcp_conn *t = NULL;
            if ((*err = make_conn(st, h->fd, hello.rank, hello.cls, &t)))
                return 1;
            h->fd = -1;
            return 1;
        }
        case HS_REPLY:
        case HS_LATER:
        case HS_CONNECTING:
            break;
        }
        if (r < 0) {
            char why[200];
            snprintf(why, sizeof(why), "the handshake failed: %s", errno == ECONNRESET ? "closed" : strerror(errno));
            drop_in(st, h, why);
            return 1;
        }
        return 0;
    }
}

/* Moves every handshake of the context: takes new connections, steps the
 * ones that came in and this rank's dials. */
static plait_result_t tcp_handshakes(struct tcp_state *st)
{
    const struct plait_tp_env *env = st->env;
    for (;;) {
        union plait_sockaddr from;
        socklen_t flen = sizeof(from);
        int fd = accept4(st->lfd, &from.sa, &flen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            break; /* EAGAIN, or an error the next call sees again */
        /* Every connection this rank may take could be in its handshake at
         * once; more than that is someone else's doing. */
        if (st->nin >= 2 * st->cap + 16) {
            struct handshake tmp;
            memset(&tmp, 0, sizeof(tmp));
            plait_sockaddr_str(&from, tmp.from, sizeof(tmp.from));
            close(fd);
            drop_in(st, &tmp, "too many connections in their handshake at once");
            continue;
        }
        if (st->nin == st->in_cap) {
            const int cap = st->in_cap ? 2 * st->in_cap : 8;
            struct handshake **grown = realloc(st->in, sizeof(*grown) * (size_t)cap);
            if (!grown) {
                close(fd);
                return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
            }
            st->in = grown;
            st->in_cap = cap;
        }
        struct handshake *h = calloc(1, sizeof(*h));
        if (!h) {
            close(fd);
            return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
        }
        h->fd = fd;
        h->peer = h->cls = -1;
        snprintf(h->from, sizeof(h->from), "an unknown address");
        plait_sockaddr_str(&from, h->from, sizeof(h->from));
        hs_expect(h, HS_CHALLENGE, PLAIT_AUTH_CHALLENGE_BYTES);
        h->deadline = plait_now() + (env->timeout_s > HS_IN_LIMIT_S ? env->timeout_s : HS_IN_LIMIT_S);
        if (plait_auth_server_challenge(&h->auth, h->buf) != PLAIT_SUCCESS) {
            hs_free(h);
            return plait_error(PLAIT_ERR_SYSTEM, "socket: no random bytes for a challenge");
        }
        st->in[st->nin++] = h;
    }
    for (int i = 0; i < st->nin;) {
        plait_result_t err = PLAIT_SUCCESS;
        int done = in_step(st, st->in[i], &err);
        if (!done && plait_now() > st->in[i]->deadline) {
            drop_in(st, st->in[i], "it did not finish its handshake in time");
            done = 1;
        }
        if (done) {
            hs_free(st->in[i]);
            st->in[i] = st->in[--st->nin];
            if (err)
                return err;
            continue;
        }
        i++;
    }
    for (int i = 0; i < env->nranks * env->ncls; i++) {
        struct handshake *h = st->dials[i];
        if (!h || h->failed)
            continue;
        int made = 0;
        plait_result_t status = dial_step(st, h, &made);
        if (made) {
            hs_free(h);
            st->dials[i] = NULL;
        } else if (status) {
            /* kept for this connection's accept() to report */
            h->failed = status;
            snprintf(h->msg, sizeof(h->msg), "%s", plait_last_error_get());
            close(h->fd);
            h->fd = -1;
        }
    }
    return PLAIT_SUCCESS;
}

static plait_result_t accept_locked(struct tcp_state *st, int peer, int cls, double deadline,
                                    struct plait_conn **out)
{
    const struct plait_tp_env *env = st->env;
    const int i = peer * env->ncls + cls;
    if (!st->by[i]) {
        plait_result_t status = tcp_handshakes(st);
        if (status)
            return status;
    }
    if (st->by[i]) {
        *out = &st->by[i]->conn;
        return PLAIT_SUCCESS;
    }
    if (st->dials[i] && st->dials[i]->failed)
        return plait_error(st->dials[i]->failed, "%s", st->dials[i]->msg);
    if (deadline > 0 && plait_deadline_passed(deadline)) {
        char who[160];
        env->peer_str(env->core, peer, who, sizeof(who));
        if (peer < env->rank && st->ndropped)
            return plait_error(PLAIT_ERR_TIMEOUT, "socket: rank %d waited for %s's connection on class %d until the "
                                                  "deadline (PLAIT_TIMEOUT=%g s), and dropped %d; the last, %s",
                               env->rank, who, cls, env->timeout_s, st->ndropped, st->dropped);
        return plait_error(PLAIT_ERR_TIMEOUT, "socket: rank %d waited for its connection with %s on class %d until "
                                              "the deadline (PLAIT_TIMEOUT=%g s)",
                           env->rank, who, cls, env->timeout_s);
    }
    return PLAIT_IN_PROGRESS;
}

static plait_result_t tcp_accept(void *ctx, int peer, int cls, const void *peer_blob, double deadline,
                                 struct plait_conn **out)
{
    (void)peer_blob;
    struct tcp_state *st = ctx;
    if (!st)
        return plait_error(PLAIT_ERR_INTERNAL, "socket: a connection to rank %d with no socket peer", peer);
    pthread_mutex_lock(&st->hs_lock);
    plait_result_t status = accept_locked(st, peer, cls, deadline, out);
    pthread_mutex_unlock(&st->hs_lock);
    return status;
}

const struct plait_transport plait_transport_tcp = {
    .size = sizeof(struct plait_transport),
    .version = PLAIT_TRANSPORT_VERSION,
    .name = "socket",
    .can_join = tcp_can_join,
    .query = tcp_query,
    .init = tcp_init,
    .connect = tcp_connect,
    .accept = tcp_accept,
    .progress = tcp_progress,
    .is_flushed = tcp_is_flushed,
    .fini = tcp_fini,
};

int plait_tcp_conn_fd(const struct plait_conn *conn)
{
    return conn && conn->tp == &plait_transport_tcp ? ((const struct tcp_conn *)conn)->fd : -1;
}
