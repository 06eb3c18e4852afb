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
 * Connections are made at init: the lower rank connects, both sides run the
 * challenge-response with the communicator's secret, then the connector names its
 * rank and class in a hello. Connecting only upwards and accepting afterwards
 * cannot deadlock: the highest rank only accepts. A connection that fails the
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
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/comm.h"
#include "base/log.h"
#include "base/net.h"
#include "base/util.h"
#include "transports/transport.h"

#define TCP_MAGIC 0x504c5431u /* "PLT1" */
#define HELLO_MAGIC 0x504c4843u

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
    char malformed[512]; /* set by a malformed message: the connection is dead, this is why */
};

struct tcp_state {
    struct tcp_conn **conns;
    int nconns;
};

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

static plait_result_t tcp_progress(struct plait_conn *conn)
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
            t->tx_head++;
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

static int tcp_is_flushed(const struct plait_conn *conn)
{
    const struct tcp_conn *t = (const struct tcp_conn *)conn;
    return t->tx_head == __atomic_load_n(&t->tx_tail, __ATOMIC_ACQUIRE);
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

static plait_result_t make_conn(struct plait_comm *comm, int fd, int peer, int cls, struct tcp_conn **out)
{
    struct tcp_conn *t = calloc(1, sizeof(*t));
    if (!t)
        return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
    t->fd = fd;
    const size_t nslots = comm->set.nslots, slot = comm->set.slot_bytes;
    t->tx_mem = malloc(nslots * slot);
    t->rx_mem = malloc(nslots * slot);
    t->tx_sizes = calloc(nslots, sizeof(uint32_t));
    t->rx_sizes = calloc(nslots, sizeof(uint32_t));
    if (!t->tx_mem || !t->rx_mem || !t->tx_sizes || !t->rx_sizes) {
        t->fd = -1;
        free_conn(t);
        return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory for staging slots");
    }
    plait_peer_str(comm, peer, t->peer_str, sizeof(t->peer_str));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct plait_conn *c = &t->conn;
    c->tp = &plait_transport_tcp;
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
    return PLAIT_SUCCESS;
}

static void tcp_teardown(struct plait_comm *comm)
{
    struct tcp_state *st = comm->tp_state[PLAIT_TP_TCP];
    if (!st)
        return;
    comm->tp_state[PLAIT_TP_TCP] = NULL;
    for (int i = 0; i < st->nconns; i++)
        free_conn(st->conns[i]);
    free(st->conns);
    free(st);
}

/* What is wrong with a hello that a connection to rank `me` introduced itself
 * with (written into why), or 0 when it names a connection this rank expects. */
static int hello_problem(const struct plait_comm *comm, int me, const struct hello *h, char *why, size_t len)
{
    if (h->magic != HELLO_MAGIC)
        snprintf(why, len, "not a hello (magic 0x%08x, a hello starts with 0x%08x)", h->magic, HELLO_MAGIC);
    else if (h->rank < 0 || h->rank >= me)
        snprintf(why, len, "a hello from rank %d, not a rank below %d (only lower ranks connect)", h->rank, me);
    else if (h->cls < 0 || h->cls >= comm->ncls)
        snprintf(why, len, "a hello from rank %d for connection class %d of %d", h->rank, h->cls, comm->ncls);
    else if (plait_pair_transport(comm, me, h->rank) != PLAIT_TP_TCP)
        snprintf(why, len, "a hello from rank %d, which does not use sockets with rank %d", h->rank, me);
    else if (!plait_conn_needed(comm, me, h->rank, h->cls))
        snprintf(why, len, "a hello from rank %d for connection class %d, which rank %d does not use", h->rank,
                 h->cls, me);
    else if (comm->conns[h->rank * comm->ncls + h->cls])
        snprintf(why, len, "a second hello from rank %d for connection class %d", h->rank, h->cls);
    else
        return 0;
    return 1;
}

static plait_result_t tcp_setup(struct plait_comm *comm)
{
    const int n = comm->nranks, me = comm->rank;
    int expect_accepts = 0, nconns = 0;
    for (int p = 0; p < n; p++) {
        if (plait_pair_transport(comm, me, p) != PLAIT_TP_TCP)
            continue;
        for (int c = 0; c < comm->ncls; c++)
            if (plait_conn_needed(comm, me, p, c)) {
                nconns++;
                if (p < me)
                    expect_accepts++;
            }
    }
    /* The exchange of addresses is collective, even for ranks without sockets. */
    union plait_sockaddr *addrs = calloc((size_t)n, sizeof(*addrs));
    struct tcp_state *st = calloc(1, sizeof(*st));
    if (!addrs || !st) {
        free(addrs);
        free(st);
        return plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
    }
    plait_result_t status = PLAIT_SUCCESS;
    int lfd = -1;
    char ifname[64] = "";
    if (nconns > 0) {
        /* Without PLAIT_SOCKET_IFNAME, listen where the bootstrap reaches its
         * peers: the local address of the setup ring's connection is the one the
         * routing table picked for this job. */
        socklen_t alen = sizeof(addrs[me]);
        int ring_fd = plait_bootstrap_next_fd(comm->bs);
        if (!comm->set.ifname[0] && ring_fd >= 0 && getsockname(ring_fd, &addrs[me].sa, &alen) == 0) {
            if (addrs[me].sa.sa_family == AF_INET)
                addrs[me].sin.sin_port = 0;
            else
                addrs[me].sin6.sin6_port = 0;
            snprintf(ifname, sizeof(ifname), "the bootstrap's interface");
        } else {
            status = plait_sock_find_ifaddr(comm->set.ifname, &addrs[me], ifname, sizeof(ifname));
        }
        if (!status)
            status = plait_sock_listen(&addrs[me], &lfd);
    }
    plait_result_t ag = plait_bootstrap_allgather(comm->bs, addrs, sizeof(*addrs));
    if (!status)
        status = ag;
    if (status)
        goto out;
    st->conns = calloc((size_t)(nconns > 0 ? nconns : 1), sizeof(*st->conns));
    if (!st->conns) {
        status = plait_error(PLAIT_ERR_SYSTEM, "socket: out of memory");
        goto out;
    }
    comm->tp_state[PLAIT_TP_TCP] = st;
    const double deadline = plait_deadline(comm->set.timeout_s);
    const uint8_t *secret = plait_bootstrap_secret(comm->bs);
    for (int p = me + 1; p < n && !status; p++) {
        if (plait_pair_transport(comm, me, p) != PLAIT_TP_TCP)
            continue;
        for (int c = 0; c < comm->ncls && !status; c++) {
            if (!plait_conn_needed(comm, me, p, c))
                continue;
            int fd = -1;
            status = plait_sock_connect(&addrs[p], deadline, &comm->abort_flag, &fd);
            if (!status)
                status = plait_sock_auth_client(fd, secret, deadline, &comm->abort_flag);
            struct hello h = {HELLO_MAGIC, me, c, 0};
            if (!status)
                status = plait_sock_send_all(fd, &h, sizeof(h), deadline, &comm->abort_flag);
            struct tcp_conn *t = NULL;
            if (!status)
                status = make_conn(comm, fd, p, c, &t);
            if (status) {
                if (fd >= 0)
                    close(fd);
                char who[160];
                status = plait_error_context(status, "socket: connecting to %s",
                                             plait_peer_str(comm, p, who, sizeof(who)));
                break;
            }
            st->conns[st->nconns++] = t;
            comm->conns[p * comm->ncls + c] = &t->conn;
        }
    }
    /* A connection that fails to authenticate or to introduce itself properly
     * is dropped; the peers we expect keep their chance until the deadline. If
     * they do not come, the error says what was dropped last and from where. */
    int ndropped = 0;
    char dropped[400] = "";
    while (!status && expect_accepts > 0) {
        int fd = -1;
        status = plait_sock_accept(lfd, deadline, &comm->abort_flag, &fd);
        if (status) {
            if (ndropped)
                status = plait_error_context(status, "socket: rank %d still waited for %d connection(s) from lower "
                                                     "ranks, and dropped %d; the last, %s",
                                             me, expect_accepts, ndropped, dropped);
            break;
        }
        union plait_sockaddr from;
        socklen_t flen = sizeof(from);
        char from_str[PLAIT_SOCKADDR_STRLEN] = "an unknown address";
        if (getpeername(fd, &from.sa, &flen) == 0)
            plait_sockaddr_str(&from, from_str, sizeof(from_str));
        struct hello h;
        char why[200];
        if (plait_sock_auth_server(fd, secret, deadline, &comm->abort_flag) != PLAIT_SUCCESS ||
            plait_sock_recv_all(fd, &h, sizeof(h), deadline, &comm->abort_flag) != PLAIT_SUCCESS) {
            snprintf(dropped, sizeof(dropped), "from %s: %s", from_str, plait_last_error_get());
            PLAIT_WARN(PLAIT_SUBSYS_TRANSPORT, "socket: rank %d dropped a connection %s", me, dropped);
            ndropped++;
            close(fd);
            continue;
        }
        if (hello_problem(comm, me, &h, why, sizeof(why))) {
            snprintf(dropped, sizeof(dropped), "from %s: %s", from_str, why);
            PLAIT_WARN(PLAIT_SUBSYS_TRANSPORT, "socket: rank %d dropped a connection %s", me, dropped);
            ndropped++;
            close(fd);
            continue;
        }
        struct tcp_conn *t = NULL;
        status = make_conn(comm, fd, h.rank, h.cls, &t);
        if (status) {
            close(fd);
            break;
        }
        st->conns[st->nconns++] = t;
        comm->conns[h.rank * comm->ncls + h.cls] = &t->conn;
        expect_accepts--;
    }
out:
    if (lfd >= 0)
        close(lfd);
    free(addrs);
    if (status) {
        if (comm->tp_state[PLAIT_TP_TCP]) {
            for (int i = 0; i < n * comm->ncls; i++)
                if (comm->conns[i] && comm->conns[i]->tp == &plait_transport_tcp)
                    comm->conns[i] = NULL;
            tcp_teardown(comm);
        } else {
            free(st);
        }
        return status;
    }
    if (!comm->tp_state[PLAIT_TP_TCP])
        comm->tp_state[PLAIT_TP_TCP] = st;
    if (nconns > 0)
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT, "socket: rank %d has %d TCP connections on %s", me, nconns, ifname);
    return PLAIT_SUCCESS;
}

const struct plait_transport plait_transport_tcp = {
    .name = "socket",
    .setup = tcp_setup,
    .progress = tcp_progress,
    .is_flushed = tcp_is_flushed,
    .teardown = tcp_teardown,
};

int plait_tcp_conn_fd(const struct plait_conn *conn)
{
    return conn && conn->tp == &plait_transport_tcp ? ((const struct tcp_conn *)conn)->fd : -1;
}
