/* The Socket net provider: TCP between hosts (NCCL's "Socket" network).
 *
 * Devices are the interfaces PLAIT_SOCKET_IFNAME / NCCL_SOCKET_IFNAME select
 * (base/net.c, NCCL's syntax and default order). A connection is one control
 * socket plus nsocks data sockets, served by nthreads helper threads
 * (PLAIT_SOCKET_NTHREADS x PLAIT_NSOCKS_PERTHREAD, NCCL's knobs). The wire
 * format is in socket_wire.h.
 *
 * A message of at most SOCK_INLINE_MAX bytes (or any message when there are
 * no data sockets) is one write of header and data on the control socket,
 * done by the caller's thread in isend(), and is read by the receiver's
 * test() with one read into a staging buffer (most of the time: a read takes
 * whatever has arrived). A larger message sends only its header on the
 * control socket; its bytes go in pieces (at least SOCK_MIN_PIECE each, one
 * per data socket at most) that the helper threads move straight between the
 * user's buffer and their sockets. Both ends cut a message the same way and
 * give its pieces to the same sockets in turn, so a data socket carries its
 * pieces in message order; each piece starts with a header naming its
 * message and range, which the receiver checks against what it expects.
 *
 * Threads: the caller's thread owns the control socket and the requests; a
 * helper thread owns its data sockets. They share, per data socket, a ring of
 * piece pointers: the caller writes ring[tail] then release-stores tail; the
 * helper acquire-loads tail, moves the piece, release-stores the piece's
 * state (done or failed), then head. The caller acquire-loads a piece's state
 * before it reads what the helper wrote. A helper with nothing to do sets
 * `sleeping` and checks the tails again before it polls (both sequentially
 * consistent, as are the caller's tail store and sleeping load), so a post
 * either is seen by that check or sees `sleeping` and writes the eventfd; the
 * poll is bounded (100 ms) in any case.
 *
 * Authentication: listen() draws a random token that travels in the handle
 * (over the caller's authenticated bootstrap); every socket of a connection
 * starts with a hello carrying it, and accept() drops, with a WARN, a socket
 * whose hello is malformed or whose token differs (compared in constant
 * time). Nothing read from the network is trusted: every length is checked
 * against what was posted before a byte is stored. */
#define _GNU_SOURCE
#include "transports/net/provider.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/crypto.h"
#include "base/env.h"
#include "base/log.h"
#include "base/net.h"
#include "base/util.h"
#include "transports/net/socket_wire.h"

/* Buffers in one grouped irecv. */
#define SOCK_MAX_RECVS 8
/* Pieces a data socket may have queued: every buffer of every request. */
#define SOCK_RING (PLAIT_NET_MAX_REQUESTS * SOCK_MAX_RECVS)
/* The receiver's staging buffer for the control socket. */
#define SOCK_RXBUF (16 * 1024)
/* An inline payload of at least this many bytes still to come is read
 * straight into the user's buffer instead of through the staging buffer. */
#define SOCK_DIRECT_MIN 4096
/* Largest transfer handed to one system call. */
#define SOCK_IO_MAX ((size_t)1 << 30)
/* Largest message (NCCL_MAX_NET_SIZE_BYTES). */
#define SOCK_MAX_P2P ((size_t)1 << 40)
/* Unidentified sockets a listener keeps while their hellos come in, and how
 * long each may take; connections whose sockets have not all come. */
#define SOCK_MAX_PENDING 64
#define SOCK_HELLO_TIMEOUT_S 30.0
#define SOCK_MAX_GROUPS 16
/* A helper thread's longest sleep. */
#define SOCK_HELPER_POLL_MS 100
/* Threads and sockets per thread when they are auto and the NIC is not one
 * whose vendor has its own figures (auto_counts): two flows, for the per-flow
 * limits of cloud networks, when the process has SOCK_DEFAULT_MIN_CPUS CPUs
 * or more; below that the helpers would take the cores the ranks need, and
 * the caller's thread moves everything (NCCL's default for such NICs). */
#define SOCK_DEFAULT_NTHREADS 2
#define SOCK_DEFAULT_NSOCKS 1
#define SOCK_DEFAULT_MIN_CPUS 4
/* What a peer that broke the protocol (a malformed header or piece, a
 * message larger than its buffer, a tag nobody posted) fails the comm with:
 * PLAIT_ERR_INTERNAL, as provider.h says, so that the caller tells it from a
 * peer that closed or reset its side (PLAIT_ERR_REMOTE: it is gone). */
#define SOCK_ERR_PROTOCOL PLAIT_ERR_INTERNAL

enum { PIECE_POSTED = 1, PIECE_DONE = 2, PIECE_FAILED = 3 };

struct sock_piece {
    char *data;
    uint64_t len, offset;
    uint32_t seq;
    size_t done; /* bytes of header + data moved */
    uint8_t hdr[SOCK_PIECE_BYTES];
    int state; /* atomic: PIECE_*; 0 when unused */
};

struct sock_data {
    int fd;
    uint32_t tail; /* atomic: pieces posted (caller) */
    uint32_t head; /* atomic: pieces finished (helper) */
    struct sock_piece *ring[SOCK_RING];
};

struct sock_comm;

struct sock_thread {
    struct sock_comm *comm;
    pthread_t tid;
    int is_started;
    int index;
    int efd;
    int sleeping; /* atomic */
};

/* One message: an isend, or one buffer of an irecv. */
struct sock_msg {
    char *data;
    size_t cap;  /* receive: the posted size */
    size_t size; /* the message's size (receive: once matched) */
    int tag;
    int is_matched; /* receive: its header has come */
    int is_inline;
    uint32_t seq;
    size_t ctrl_done; /* send: header + inline bytes written; receive: inline bytes read */
    uint8_t hdr[SOCK_MSG_BYTES];
    int npieces;
    struct sock_piece *pieces; /* [nsocks] of the comm's pool */
};

struct sock_request {
    struct sock_comm *comm;
    int is_used;
    int n;
    struct sock_msg msgs[SOCK_MAX_RECVS];
};

struct sock_ctx;

struct sock_comm {
    int is_send;
    plait_net_log_fn log;
    char peer[PLAIT_SOCKADDR_STRLEN];
    int ctrl_fd;
    int nsocks, nthreads;
    struct sock_data *data;      /* [nsocks] */
    struct sock_thread *threads; /* [nthreads] */
    struct sock_piece *pool;     /* [PLAIT_NET_MAX_REQUESTS][SOCK_MAX_RECVS][nsocks] */
    int next_sock;
    uint32_t next_seq; /* send: the next message's; receive: the next expected */
    int stop;          /* atomic: helpers exit */
    int failed;        /* atomic: a plait_result_t, 0 while healthy */
    pthread_mutex_t err_lock;
    char err[512];
    struct sock_request reqs[PLAIT_NET_MAX_REQUESTS];
    /* send: messages whose control bytes are still to write, in order */
    struct sock_msg *txq[PLAIT_NET_MAX_REQUESTS];
    int tx_head, tx_count;
    /* receive: requests with buffers still unmatched, in posting order */
    struct sock_request *rxq[PLAIT_NET_MAX_REQUESTS];
    int rx_head, rx_count;
    struct sock_msg *rx_cur; /* the inline message being read */
    uint8_t *rxbuf;
    size_t rx_start, rx_end;
    int is_eof;
    uint64_t nmsgs; /* messages completed, for errors */
};

/* A connect in progress, kept in the ctx between connect() calls. */
struct sock_connect {
    struct sock_connect *next;
    uint64_t id;
    uint8_t handle[64]; /* the handle it was started with */
    struct sock_comm *comm;
    int nfds;
    int stage[1 + SOCK_MAX_SOCKETS]; /* 0 connecting, 1 hello, 2 done */
    size_t sent[1 + SOCK_MAX_SOCKETS];
    uint8_t hello[1 + SOCK_MAX_SOCKETS][SOCK_HELLO_BYTES];
};

struct sock_dev {
    struct plait_netif nif;
    int nthreads, nsocks; /* total data sockets */
};

struct sock_ctx {
    uint64_t comm_id;
    plait_net_log_fn log;
    int ndev;
    struct sock_dev devs[PLAIT_NETIF_MAX];
    pthread_mutex_t lock; /* connects */
    struct sock_connect *connects;
};

struct sock_pending {
    int fd;
    size_t got;
    double deadline;
    uint8_t hello[SOCK_HELLO_BYTES];
    char peer[PLAIT_SOCKADDR_STRLEN];
};

struct sock_group {
    int is_used;
    uint64_t conn_id;
    int have;
    double deadline;
    int fds[1 + SOCK_MAX_SOCKETS];
    char peer[PLAIT_SOCKADDR_STRLEN];
};

struct sock_listen {
    struct sock_ctx *ctx;
    int fd;
    int nsocks, nthreads;
    char addr[PLAIT_SOCKADDR_STRLEN];
    uint8_t token[SOCK_TOKEN_BYTES];
    int npending;
    struct sock_pending pending[SOCK_MAX_PENDING];
    struct sock_group groups[SOCK_MAX_GROUPS];
    uint64_t ndropped;
};

/* ---------------------------------------------------------------- logging, errors */

static void default_log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void default_log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    (void)file;
    (void)line;
    if (!plait_log_enabled(level, subsys))
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    plait_log(level, subsys, "%s", buf);
}

#define SOCK_LOG(fn, level, ...) (fn)((level), PLAIT_SUBSYS_TRANSPORT, __FILE__, __LINE__, __VA_ARGS__)

/* Records the comm's first failure (any thread) and logs it once. */
static plait_result_t comm_fail(struct sock_comm *c, plait_result_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static plait_result_t comm_fail(struct sock_comm *c, plait_result_t status, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&c->err_lock);
    if (!__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE)) {
        int n = snprintf(c->err, sizeof(c->err), "NET/Socket: ");
        va_start(ap, fmt);
        vsnprintf(c->err + n, sizeof(c->err) - (size_t)n, fmt, ap);
        va_end(ap);
        __atomic_store_n(&c->failed, (int)status, __ATOMIC_RELEASE);
        SOCK_LOG(c->log, PLAIT_LOG_WARN, "%s", c->err);
    }
    pthread_mutex_unlock(&c->err_lock);
    return status;
}

/* The comm's failure as the calling thread's error. */
static plait_result_t comm_error(struct sock_comm *c)
{
    char msg[sizeof(c->err)];
    pthread_mutex_lock(&c->err_lock);
    snprintf(msg, sizeof(msg), "%s", c->err);
    pthread_mutex_unlock(&c->err_lock);
    return plait_error((plait_result_t)__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE), "%s", msg);
}

static plait_result_t io_status(int err)
{
    return plait_sock_errno_status(err);
}

static int ct_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    volatile uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= (uint8_t)(a[i] ^ b[i]);
    return acc == 0;
}

static void set_nodelay(int fd)
{
    int one = 1;
    /* A failure costs latency, not correctness. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void fd_peer(int fd, char *buf, size_t len)
{
    union plait_sockaddr a;
    socklen_t alen = sizeof(a);
    memset(&a, 0, sizeof(a));
    if (getpeername(fd, &a.sa, &alen) != 0)
        snprintf(buf, len, "<unknown peer>");
    else
        plait_sockaddr_str(&a, buf, len);
}

/* ---------------------------------------------------------------- init, devices */

/* Threads and sockets for a NIC by vendor, as NCCL's auto-detection: AWS ENA
 * and Google's gVNIC have their own; any other (virtio, loopback, unknown)
 * gets SOCK_DEFAULT_* (none on a small machine). */
static void auto_counts(const char *ifname, int *nthreads, int *nsocks_per_thread)
{
    char path[128], vendor[16] = "";
    cpu_set_t cpus;
    const int ncpus = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    *nthreads = ncpus >= SOCK_DEFAULT_MIN_CPUS ? SOCK_DEFAULT_NTHREADS : 0;
    *nsocks_per_thread = SOCK_DEFAULT_NSOCKS;
    snprintf(path, sizeof(path), "/sys/class/net/%s/device/vendor", ifname);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, vendor, sizeof(vendor) - 1);
    close(fd);
    if (n <= 0)
        return;
    vendor[n] = '\0';
    if (strncmp(vendor, "0x1d0f", 6) == 0) {
        *nthreads = 2;
        *nsocks_per_thread = 8;
    } else if (strncmp(vendor, "0x1ae0", 6) == 0) {
        *nthreads = 4;
        *nsocks_per_thread = 1;
    }
}

static plait_result_t sock_init(void **ctx_out, uint64_t comm_id, plait_net_log_fn log)
{
    struct plait_netif ifs[PLAIT_NETIF_MAX];
    double env_nt = PLAIT_ENV_AUTO, env_ns = PLAIT_ENV_AUTO;
    int n = 0, is_set;
    plait_result_t status;

    if (!ctx_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket init: NULL ctx_out");
    if (!log)
        log = default_log;
    status = plait_env_number("PLAIT_SOCKET_NTHREADS", &env_nt, &is_set);
    if (status == PLAIT_SUCCESS)
        status = plait_env_number("PLAIT_NSOCKS_PERTHREAD", &env_ns, &is_set);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "NET/Socket init");
    status = plait_sock_find_interfaces(plait_env_get("PLAIT_SOCKET_IFNAME"), ifs, PLAIT_NETIF_MAX, &n);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "NET/Socket init");

    struct sock_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return plait_error(PLAIT_ERR_SYSTEM, "NET/Socket init: out of memory");
    ctx->comm_id = comm_id;
    ctx->log = log;
    ctx->ndev = n;
    pthread_mutex_init(&ctx->lock, NULL);
    char line[1024] = "";
    for (int d = 0; d < n; d++) {
        struct sock_dev *dev = &ctx->devs[d];
        int nt, ns;
        dev->nif = ifs[d];
        auto_counts(dev->nif.name, &nt, &ns);
        if (env_nt != PLAIT_ENV_AUTO)
            nt = (int)env_nt;
        if (env_ns != PLAIT_ENV_AUTO)
            ns = (int)env_ns;
        if (nt * ns > SOCK_MAX_SOCKETS) {
            SOCK_LOG(log, PLAIT_LOG_WARN,
                     "NET/Socket: %d threads x %d sockets per thread is more than %d sockets; using %d per thread",
                     nt, ns, SOCK_MAX_SOCKETS, SOCK_MAX_SOCKETS / nt);
            ns = SOCK_MAX_SOCKETS / nt;
        }
        dev->nthreads = nt * ns > 0 ? nt : 0;
        dev->nsocks = nt * ns;
        char a[PLAIT_SOCKADDR_STRLEN];
        plait_sockaddr_str(&dev->nif.addr, a, sizeof(a));
        size_t used = strlen(line);
        snprintf(line + used, sizeof(line) - used, " [%d]%s:%s (%d threads, %d sockets)", d, dev->nif.name, a,
                 dev->nthreads, dev->nsocks);
    }
    SOCK_LOG(log, PLAIT_LOG_INFO, "NET/Socket: using%s", line);
    *ctx_out = ctx;
    return PLAIT_SUCCESS;
}

static plait_result_t sock_devices(void *vctx, int *ndev_out)
{
    struct sock_ctx *ctx = vctx;
    if (!ctx || !ndev_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket devices: NULL argument");
    *ndev_out = ctx->ndev;
    return PLAIT_SUCCESS;
}

static plait_result_t check_dev(const struct sock_ctx *ctx, int dev, const char *call)
{
    if (!ctx)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket %s: NULL ctx", call);
    if (dev < 0 || dev >= ctx->ndev)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket %s: device %d out of range (%d devices)", call,
                           dev, ctx->ndev);
    return PLAIT_SUCCESS;
}

static plait_result_t sock_get_properties(void *vctx, int dev, struct plait_net_properties *props_out)
{
    struct sock_ctx *ctx = vctx;
    plait_result_t status = check_dev(ctx, dev, "get_properties");
    if (status != PLAIT_SUCCESS)
        return status;
    if (!props_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket get_properties: NULL props_out");
    const char *name = ctx->devs[dev].nif.name;
    struct plait_net_properties p;
    memset(&p, 0, sizeof(p));
    snprintf(p.name, sizeof(p.name), "%s", name);
    char path[128], real[PATH_MAX];
    snprintf(path, sizeof(path), "/sys/class/net/%s/device", name);
    if (realpath(path, real) && strlen(real) < sizeof(p.pci_path))
        memcpy(p.pci_path, real, strlen(real) + 1);
    p.guid = (uint64_t)dev;
    p.ptr_support = PLAIT_NET_PTR_HOST;
    p.reg_is_global = 1;
    p.force_flush = 0;
    /* The link's speed as the kernel reports it; virtual links (loopback,
     * virtio without a speed) report none: 10 Gbit/s, NCCL's default. */
    p.speed_mbps = 10000;
    snprintf(path, sizeof(path), "/sys/class/net/%s/speed", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char s[32];
        ssize_t n = read(fd, s, sizeof(s) - 1);
        close(fd);
        if (n > 0) {
            s[n] = '\0';
            long v = strtol(s, NULL, 10);
            if (v > 0 && v < INT_MAX)
                p.speed_mbps = (int)v;
        }
    }
    p.port = 0;
    p.latency_us = 0;
    p.max_comms = 65536;
    p.max_recvs = SOCK_MAX_RECVS;
    p.max_requests = PLAIT_NET_MAX_REQUESTS;
    p.max_p2p_bytes = SOCK_MAX_P2P;
    *props_out = p;
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- comms */

static struct sock_comm *comm_new(int is_send, plait_net_log_fn log, int nthreads, int nsocks)
{
    struct sock_comm *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->is_send = is_send;
    c->log = log;
    c->ctrl_fd = -1;
    c->nthreads = nthreads;
    c->nsocks = nsocks;
    pthread_mutex_init(&c->err_lock, NULL);
    for (int i = 0; i < PLAIT_NET_MAX_REQUESTS; i++)
        c->reqs[i].comm = c;
    if (nsocks > 0) {
        c->data = calloc((size_t)nsocks, sizeof(*c->data));
        c->threads = calloc((size_t)nthreads, sizeof(*c->threads));
        c->pool = calloc((size_t)PLAIT_NET_MAX_REQUESTS * SOCK_MAX_RECVS * (size_t)nsocks, sizeof(*c->pool));
        if (!c->data || !c->threads || !c->pool)
            goto err_free;
        for (int i = 0; i < nsocks; i++)
            c->data[i].fd = -1;
        for (int t = 0; t < nthreads; t++) {
            c->threads[t].comm = c;
            c->threads[t].index = t;
            c->threads[t].efd = -1;
        }
        for (int r = 0; r < PLAIT_NET_MAX_REQUESTS; r++)
            for (int m = 0; m < SOCK_MAX_RECVS; m++)
                c->reqs[r].msgs[m].pieces = c->pool + ((size_t)r * SOCK_MAX_RECVS + (size_t)m) * (size_t)nsocks;
    }
    if (!is_send) {
        c->rxbuf = malloc(SOCK_RXBUF);
        if (!c->rxbuf)
            goto err_free;
    }
    return c;

err_free:
    free(c->data);
    free(c->threads);
    free(c->pool);
    pthread_mutex_destroy(&c->err_lock);
    free(c);
    return NULL;
}

/* Stops the helpers, closes every socket, frees the comm. */
static void comm_free(struct sock_comm *c)
{
    if (!c)
        return;
    __atomic_store_n(&c->stop, 1, __ATOMIC_SEQ_CST);
    for (int t = 0; t < c->nthreads && c->threads; t++) {
        struct sock_thread *th = &c->threads[t];
        if (th->is_started) {
            uint64_t one = 1;
            ssize_t rc = write(th->efd, &one, sizeof(one));
            (void)rc; /* the helper's poll is bounded anyway */
            pthread_join(th->tid, NULL);
        }
        if (th->efd >= 0)
            close(th->efd);
    }
    for (int i = 0; i < c->nsocks && c->data; i++)
        if (c->data[i].fd >= 0)
            close(c->data[i].fd);
    if (c->ctrl_fd >= 0)
        close(c->ctrl_fd);
    free(c->data);
    free(c->threads);
    free(c->pool);
    free(c->rxbuf);
    pthread_mutex_destroy(&c->err_lock);
    free(c);
}

/* ---------------------------------------------------------------- helper threads */

/* Moves what it can of one piece: 1 when the piece is complete, 0 when the
 * socket would block, -1 after recording the comm's failure. */
static int piece_progress(struct sock_comm *c, int s, struct sock_piece *p)
{
    const int fd = c->data[s].fd;
    const size_t total = SOCK_PIECE_BYTES + p->len;

    while (p->done < total) {
        ssize_t rc;
        if (c->is_send) {
            struct iovec iov[2];
            int n = 0;
            if (p->done < SOCK_PIECE_BYTES)
                iov[n++] = (struct iovec){p->hdr + p->done, SOCK_PIECE_BYTES - p->done};
            size_t off = p->done > SOCK_PIECE_BYTES ? p->done - SOCK_PIECE_BYTES : 0;
            size_t left = p->len - off;
            if (left > 0)
                iov[n++] = (struct iovec){p->data + off, left < SOCK_IO_MAX ? left : SOCK_IO_MAX};
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
            rc = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else if (p->done < SOCK_PIECE_BYTES) {
            rc = recv(fd, p->hdr + p->done, SOCK_PIECE_BYTES - p->done, MSG_DONTWAIT);
        } else {
            size_t off = p->done - SOCK_PIECE_BYTES, left = p->len - off;
            rc = recv(fd, p->data + off, left < SOCK_IO_MAX ? left : SOCK_IO_MAX, MSG_DONTWAIT);
        }
        if (rc > 0) {
            size_t before = p->done;
            p->done += (size_t)rc;
            if (!c->is_send && before < SOCK_PIECE_BYTES && p->done >= SOCK_PIECE_BYTES) {
                const uint32_t magic = sock_get_u32(p->hdr), seq = sock_get_u32(p->hdr + 4);
                const uint64_t off = sock_get_u64(p->hdr + 8), len = sock_get_u64(p->hdr + 16);
                if (magic != SOCK_PIECE_MAGIC || seq != p->seq || off != p->offset || len != p->len) {
                    comm_fail(c, SOCK_ERR_PROTOCOL,
                              "malformed piece header from %s on data socket %d: magic 0x%08x, message %u, bytes "
                              "%llu+%llu (expected 0x%08x, message %u, bytes %llu+%llu)",
                              c->peer, s, magic, seq, (unsigned long long)off, (unsigned long long)len,
                              SOCK_PIECE_MAGIC, p->seq, (unsigned long long)p->offset, (unsigned long long)p->len);
                    return -1;
                }
            }
            continue;
        }
        if (rc == 0) {
            comm_fail(c, PLAIT_ERR_REMOTE,
                      "connection closed by %s on data socket %d in the middle of message %u (%zu of %zu bytes of "
                      "its piece at offset %llu)",
                      c->peer, s, p->seq, p->done, total, (unsigned long long)p->offset);
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        const int err = errno;
        comm_fail(c, io_status(err), "%s %s on data socket %d (message %u): %s", c->is_send ? "sending to" :
                  "receiving from", c->peer, s, p->seq, strerror(err));
        return -1;
    }
    return 1;
}

static void *helper_main(void *arg)
{
    struct sock_thread *t = arg;
    struct sock_comm *c = t->comm;
    struct pollfd pfds[1 + SOCK_MAX_SOCKETS];
    int is_dead = 0;

    while (!__atomic_load_n(&c->stop, __ATOMIC_SEQ_CST)) {
        int nfds = 1, is_busy = 0;
        pfds[0] = (struct pollfd){.fd = t->efd, .events = POLLIN};
        if (!is_dead && __atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
            is_dead = 1; /* the comm is failed: touch no buffer again */
        for (int s = t->index; s < c->nsocks && !is_dead; s += c->nthreads) {
            struct sock_data *d = &c->data[s];
            for (;;) {
                uint32_t head = __atomic_load_n(&d->head, __ATOMIC_RELAXED);
                if (head == __atomic_load_n(&d->tail, __ATOMIC_SEQ_CST))
                    break;
                struct sock_piece *p = d->ring[head % SOCK_RING];
                int r = piece_progress(c, s, p);
                if (r < 0) {
                    __atomic_store_n(&p->state, PIECE_FAILED, __ATOMIC_RELEASE);
                    is_dead = 1;
                    break;
                }
                if (r == 0) {
                    pfds[nfds++] = (struct pollfd){.fd = d->fd, .events = c->is_send ? POLLOUT : POLLIN};
                    break;
                }
                __atomic_store_n(&p->state, PIECE_DONE, __ATOMIC_RELEASE);
                __atomic_store_n(&d->head, head + 1, __ATOMIC_RELEASE);
                is_busy = 1;
            }
        }
        if (is_busy)
            continue;
        if (is_dead)
            nfds = 1;
        __atomic_store_n(&t->sleeping, 1, __ATOMIC_SEQ_CST);
        /* Work posted since the scan, on a socket that was idle then? */
        int is_new = 0;
        for (int s = t->index; s < c->nsocks && !is_dead && !is_new; s += c->nthreads) {
            struct sock_data *d = &c->data[s];
            if (__atomic_load_n(&d->head, __ATOMIC_RELAXED) != __atomic_load_n(&d->tail, __ATOMIC_SEQ_CST)) {
                int is_polled = 0;
                for (int k = 1; k < nfds; k++)
                    is_polled |= pfds[k].fd == d->fd;
                is_new = !is_polled;
            }
        }
        if (!is_new && !__atomic_load_n(&c->stop, __ATOMIC_SEQ_CST))
            (void)poll(pfds, (nfds_t)nfds, SOCK_HELPER_POLL_MS);
        __atomic_store_n(&t->sleeping, 0, __ATOMIC_SEQ_CST);
        if (pfds[0].revents & POLLIN) {
            uint64_t v;
            ssize_t rc = read(t->efd, &v, sizeof(v));
            (void)rc;
        }
        pfds[0].revents = 0;
    }
    return NULL;
}

/* Gives piece p to data socket s (its helper thread started on first use). */
static plait_result_t post_piece(struct sock_comm *c, int s, struct sock_piece *p)
{
    struct sock_data *d = &c->data[s];
    struct sock_thread *t = &c->threads[s % c->nthreads];

    if (!t->is_started) {
        t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (t->efd < 0)
            return comm_fail(c, PLAIT_ERR_SYSTEM, "eventfd for a helper thread of the connection with %s: %s",
                             c->peer, strerror(errno));
        int rc = pthread_create(&t->tid, NULL, helper_main, t);
        if (rc != 0)
            return comm_fail(c, PLAIT_ERR_SYSTEM, "starting a helper thread for the connection with %s: %s",
                             c->peer, strerror(rc));
        t->is_started = 1;
    }
    uint32_t tail = __atomic_load_n(&d->tail, __ATOMIC_RELAXED);
    if (tail - __atomic_load_n(&d->head, __ATOMIC_ACQUIRE) >= SOCK_RING)
        return comm_fail(c, PLAIT_ERR_INTERNAL, "data socket %d of the connection with %s has %d pieces queued", s,
                         c->peer, SOCK_RING);
    __atomic_store_n(&p->state, PIECE_POSTED, __ATOMIC_RELAXED);
    d->ring[tail % SOCK_RING] = p;
    __atomic_store_n(&d->tail, tail + 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&t->sleeping, __ATOMIC_SEQ_CST)) {
        uint64_t one = 1;
        ssize_t rc = write(t->efd, &one, sizeof(one));
        (void)rc; /* EAGAIN: the counter is already non-zero, the helper wakes anyway */
    }
    return PLAIT_SUCCESS;
}

/* Cuts message m into pieces and posts them on the data sockets in turn. */
static plait_result_t post_pieces(struct sock_comm *c, struct sock_msg *m)
{
    uint64_t piece;
    sock_split_message(m->size, c->nsocks, &m->npieces, &piece);
    for (int i = 0; i < m->npieces; i++) {
        struct sock_piece *p = &m->pieces[i];
        p->offset = (uint64_t)i * piece;
        p->len = m->size - p->offset < piece ? m->size - p->offset : piece;
        p->data = m->data + p->offset;
        p->seq = m->seq;
        p->done = 0;
        if (c->is_send)
            sock_piece_encode(p->hdr, p->seq, p->offset, p->len);
        plait_result_t status = post_piece(c, (c->next_sock + i) % c->nsocks, p);
        if (status != PLAIT_SUCCESS)
            return status;
    }
    c->next_sock = (c->next_sock + m->npieces) % c->nsocks;
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- sending */

/* Writes queued control bytes until the socket would block. */
static plait_result_t send_progress(struct sock_comm *c)
{
    while (c->tx_count > 0) {
        struct sock_msg *m = c->txq[c->tx_head];
        const size_t total = SOCK_MSG_BYTES + (m->is_inline ? m->size : 0);
        while (m->ctrl_done < total) {
            struct iovec iov[2];
            int n = 0;
            if (m->ctrl_done < SOCK_MSG_BYTES)
                iov[n++] = (struct iovec){m->hdr + m->ctrl_done, SOCK_MSG_BYTES - m->ctrl_done};
            if (m->is_inline) {
                size_t off = m->ctrl_done > SOCK_MSG_BYTES ? m->ctrl_done - SOCK_MSG_BYTES : 0;
                size_t left = m->size - off;
                if (left > 0)
                    iov[n++] = (struct iovec){m->data + off, left < SOCK_IO_MAX ? left : SOCK_IO_MAX};
            }
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
            ssize_t rc = sendmsg(c->ctrl_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (rc > 0) {
                m->ctrl_done += (size_t)rc;
                continue;
            }
            if (rc < 0 && errno == EINTR)
                continue;
            if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return PLAIT_SUCCESS;
            const int err = rc < 0 ? errno : EPIPE;
            return comm_fail(c, io_status(err), "sending message %u (%zu bytes) to %s: %s", m->seq, m->size, c->peer,
                             strerror(err));
        }
        c->tx_head = (c->tx_head + 1) % PLAIT_NET_MAX_REQUESTS;
        c->tx_count--;
    }
    return PLAIT_SUCCESS;
}

static struct sock_request *request_get(struct sock_comm *c)
{
    for (int i = 0; i < PLAIT_NET_MAX_REQUESTS; i++)
        if (!c->reqs[i].is_used) {
            c->reqs[i].is_used = 1;
            return &c->reqs[i];
        }
    return NULL;
}

static plait_result_t sock_isend(void *vcomm, const void *data, size_t size, int tag, void *mhandle,
                                 void **request_out)
{
    struct sock_comm *c = vcomm;
    (void)mhandle;
    if (!c || !request_out || !c->is_send)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket isend: %s",
                           !c ? "NULL comm" : !request_out ? "NULL request_out" : "not a send comm");
    if (!data && size > 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket isend to %s: NULL data for %zu bytes", c->peer,
                           size);
    if (size > SOCK_MAX_P2P)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket isend to %s: %zu bytes is more than %zu", c->peer,
                           size, SOCK_MAX_P2P);
    if (__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
        return comm_error(c);
    struct sock_request *r = request_get(c);
    if (!r) {
        *request_out = NULL;
        return PLAIT_SUCCESS;
    }
    struct sock_msg *m = &r->msgs[0];
    r->n = 1;
    m->data = (char *)(uintptr_t)data;
    m->size = size;
    m->tag = tag;
    m->seq = c->next_seq++;
    m->is_inline = sock_msg_is_inline(size, c->nsocks);
    m->ctrl_done = 0;
    m->npieces = 0;
    sock_msg_encode(m->hdr, m->seq, size, tag, m->is_inline ? SOCK_MSG_INLINE : 0);
    plait_result_t status = PLAIT_SUCCESS;
    if (!m->is_inline)
        status = post_pieces(c, m);
    if (status == PLAIT_SUCCESS) {
        c->txq[(c->tx_head + c->tx_count) % PLAIT_NET_MAX_REQUESTS] = m;
        c->tx_count++;
        status = send_progress(c);
    }
    if (status != PLAIT_SUCCESS) {
        /* The comm is failed; its pieces stay where the helpers may look
         * (no new request can reuse them). */
        r->is_used = 0;
        return comm_error(c);
    }
    *request_out = r;
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- receiving */

static plait_result_t sock_irecv(void *vcomm, int n, void **data, const size_t *sizes, const int *tags,
                                 void **mhandles, void **request_out)
{
    struct sock_comm *c = vcomm;
    (void)mhandles;
    if (!c || !request_out || c->is_send)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket irecv: %s",
                           !c ? "NULL comm" : !request_out ? "NULL request_out" : "not a receive comm");
    if (n < 1 || n > SOCK_MAX_RECVS || !data || !sizes || !tags)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "NET/Socket irecv from %s: n = %d buffers (1..%d) with data, sizes and tags", c->peer, n,
                           SOCK_MAX_RECVS);
    for (int i = 0; i < n; i++)
        if (!data[i] && sizes[i] > 0)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket irecv from %s: buffer %d is NULL (%zu bytes)",
                               c->peer, i, sizes[i]);
    if (__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
        return comm_error(c);
    struct sock_request *r = request_get(c);
    if (!r) {
        *request_out = NULL;
        return PLAIT_SUCCESS;
    }
    r->n = n;
    for (int i = 0; i < n; i++) {
        struct sock_msg *m = &r->msgs[i];
        m->data = data[i];
        m->cap = sizes[i];
        m->size = 0;
        m->tag = tags[i];
        m->is_matched = 0;
        m->is_inline = 0;
        m->ctrl_done = 0;
        m->npieces = 0;
    }
    c->rxq[(c->rx_head + c->rx_count) % PLAIT_NET_MAX_REQUESTS] = r;
    c->rx_count++;
    *request_out = r;
    return PLAIT_SUCCESS;
}

/* Reads what the control socket has into the staging buffer: 1 when bytes
 * came, 0 when it would block or is at EOF (is_eof), -1 on failure. */
static int rx_fill(struct sock_comm *c)
{
    if (c->is_eof)
        return 0;
    if (c->rx_start > 0) {
        memmove(c->rxbuf, c->rxbuf + c->rx_start, c->rx_end - c->rx_start);
        c->rx_end -= c->rx_start;
        c->rx_start = 0;
    }
    if (c->rx_end == SOCK_RXBUF)
        return 0;
    for (;;) {
        ssize_t rc = recv(c->ctrl_fd, c->rxbuf + c->rx_end, SOCK_RXBUF - c->rx_end, MSG_DONTWAIT);
        if (rc > 0) {
            c->rx_end += (size_t)rc;
            return 1;
        }
        if (rc == 0) {
            c->is_eof = 1;
            return 0;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        const int err = errno;
        comm_fail(c, io_status(err), "receiving from %s after %llu messages: %s", c->peer,
                  (unsigned long long)c->nmsgs, strerror(err));
        return -1;
    }
}

/* The oldest request's first unmatched buffer with `tag`, or NULL. */
static struct sock_msg *rx_match(struct sock_request *r, int tag)
{
    for (int i = 0; i < r->n; i++)
        if (!r->msgs[i].is_matched && r->msgs[i].tag == tag)
            return &r->msgs[i];
    return NULL;
}

static int request_unmatched(const struct sock_request *r)
{
    int n = 0;
    for (int i = 0; i < r->n; i++)
        n += !r->msgs[i].is_matched;
    return n;
}

/* A header that came: checked, then given to the oldest posted buffer. */
static plait_result_t rx_header(struct sock_comm *c, const uint8_t *h)
{
    const uint32_t magic = sock_get_u32(h), seq = sock_get_u32(h + 4), flags = sock_get_u32(h + 20);
    const uint64_t size = sock_get_u64(h + 8);
    const int tag = (int)sock_get_u32(h + 16);

    if (magic != SOCK_MSG_MAGIC)
        return comm_fail(c, SOCK_ERR_PROTOCOL,
                         "malformed message header from %s after %llu messages: bad magic 0x%08x (expected 0x%08x)",
                         c->peer, (unsigned long long)c->nmsgs, magic, SOCK_MSG_MAGIC);
    if (seq != c->next_seq)
        return comm_fail(c, SOCK_ERR_PROTOCOL,
                         "malformed message header from %s: message number %u where %u was due (lost or repeated "
                         "data)",
                         c->peer, seq, c->next_seq);
    if (size > SOCK_MAX_P2P)
        return comm_fail(c, SOCK_ERR_PROTOCOL, "malformed message header from %s: message %u of %llu bytes (more than "
                         "%zu)", c->peer, seq, (unsigned long long)size, SOCK_MAX_P2P);
    const uint32_t want = sock_msg_is_inline(size, c->nsocks) ? SOCK_MSG_INLINE : 0;
    if (flags != want)
        return comm_fail(c, SOCK_ERR_PROTOCOL,
                         "malformed message header from %s: message %u (%llu bytes) has flags 0x%x where 0x%x was due",
                         c->peer, seq, (unsigned long long)size, flags, want);
    struct sock_request *r = c->rxq[c->rx_head];
    struct sock_msg *m = rx_match(r, tag);
    if (!m) {
        char tags[128] = "";
        for (int i = 0; i < r->n; i++)
            if (!r->msgs[i].is_matched)
                snprintf(tags + strlen(tags), sizeof(tags) - strlen(tags), "%s%d", tags[0] ? ", " : "",
                         r->msgs[i].tag);
        return comm_fail(c, SOCK_ERR_PROTOCOL,
                         "message %u from %s has tag %d, which matches no buffer of the posted receive (tags still "
                         "open: %s)",
                         seq, c->peer, tag, tags);
    }
    if (size > m->cap)
        return comm_fail(c, SOCK_ERR_PROTOCOL,
                         "message %u from %s (tag %d) is %llu bytes, more than the %zu bytes posted for it "
                         "(truncated): the two sides disagree on the size",
                         seq, c->peer, tag, (unsigned long long)size, m->cap);
    m->is_matched = 1;
    m->size = (size_t)size;
    m->seq = seq;
    m->is_inline = want != 0;
    m->ctrl_done = 0;
    c->next_seq++;
    if (request_unmatched(r) == 0) {
        c->rx_head = (c->rx_head + 1) % PLAIT_NET_MAX_REQUESTS;
        c->rx_count--;
    }
    if (m->is_inline)
        c->rx_cur = m;
    else
        return post_pieces(c, m);
    return PLAIT_SUCCESS;
}

/* Reads the control socket as far as posted buffers allow. */
static plait_result_t recv_progress(struct sock_comm *c)
{
    for (;;) {
        struct sock_msg *m = c->rx_cur;
        if (m) {
            size_t have = c->rx_end - c->rx_start, left = m->size - m->ctrl_done;
            if (have > 0) {
                size_t k = have < left ? have : left;
                memcpy(m->data + m->ctrl_done, c->rxbuf + c->rx_start, k);
                m->ctrl_done += k;
                c->rx_start += k;
                left -= k;
            }
            if (left == 0) {
                /* Done. Go on only with what is already staged: another read
                 * now almost always finds nothing (a system call on the
                 * latency path of the caller waiting for this message); the
                 * next test reads. */
                c->rx_cur = NULL;
                if (c->rx_end - c->rx_start < SOCK_MSG_BYTES)
                    return PLAIT_SUCCESS;
                continue;
            }
            if (left >= SOCK_DIRECT_MIN && !c->is_eof) {
                ssize_t rc = recv(c->ctrl_fd, m->data + m->ctrl_done, left < SOCK_IO_MAX ? left : SOCK_IO_MAX,
                                  MSG_DONTWAIT);
                if (rc > 0) {
                    m->ctrl_done += (size_t)rc;
                    continue;
                }
                if (rc == 0)
                    c->is_eof = 1;
                else if (errno == EINTR)
                    continue;
                else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                    const int err = errno;
                    return comm_fail(c, io_status(err), "receiving message %u from %s: %s", m->seq, c->peer,
                                     strerror(err));
                }
            } else {
                int r = rx_fill(c);
                if (r < 0)
                    return (plait_result_t)__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE);
                if (r > 0)
                    continue;
            }
            if (c->is_eof)
                return comm_fail(c, PLAIT_ERR_REMOTE,
                                 "connection closed by %s in the middle of message %u (%zu of %zu bytes received)",
                                 c->peer, m->seq, m->ctrl_done, m->size);
            return PLAIT_SUCCESS;
        }
        if (c->rx_count == 0) {
            /* Nothing posted: read ahead what fits (a peer's EOF or reset is
             * seen early), but match nothing. */
            if (c->rx_end - c->rx_start < SOCK_RXBUF && rx_fill(c) < 0)
                return (plait_result_t)__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE);
            return PLAIT_SUCCESS;
        }
        if (c->rx_end - c->rx_start >= SOCK_MSG_BYTES) {
            uint8_t h[SOCK_MSG_BYTES];
            memcpy(h, c->rxbuf + c->rx_start, SOCK_MSG_BYTES);
            c->rx_start += SOCK_MSG_BYTES;
            plait_result_t status = rx_header(c, h);
            if (status != PLAIT_SUCCESS)
                return status;
            continue;
        }
        int r = rx_fill(c);
        if (r < 0)
            return (plait_result_t)__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE);
        if (r > 0)
            continue;
        if (c->is_eof) {
            size_t have = c->rx_end - c->rx_start;
            return comm_fail(c, PLAIT_ERR_REMOTE,
                             have ? "connection closed by %s in the middle of the header of message %u (%zu of %d "
                                    "bytes received)"
                                  : "connection closed by %s while a receive was posted (message %u due; %zu of %d "
                                    "header bytes)",
                             c->peer, c->next_seq, have, SOCK_MSG_BYTES);
        }
        return PLAIT_SUCCESS;
    }
}

/* ---------------------------------------------------------------- test */

static int msg_is_done(const struct sock_comm *c, struct sock_msg *m, int *is_failed)
{
    if (c->is_send ? m->ctrl_done < SOCK_MSG_BYTES + (m->is_inline ? m->size : 0)
                   : (!m->is_matched || (m->is_inline && m->ctrl_done < m->size)))
        return 0;
    for (int i = 0; i < m->npieces; i++) {
        int st = __atomic_load_n(&m->pieces[i].state, __ATOMIC_ACQUIRE);
        if (st == PIECE_FAILED)
            *is_failed = 1;
        if (st != PIECE_DONE)
            return 0;
    }
    return 1;
}

static plait_result_t sock_test(void *vreq, int *done_out, size_t *sizes_out)
{
    struct sock_request *r = vreq;
    if (!r || !done_out || !r->comm || !r->is_used)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket test: %s",
                           !r || !r->comm ? "NULL or unknown request" : !done_out ? "NULL done_out"
                                                                                  : "request already finished");
    struct sock_comm *c = r->comm;
    *done_out = 0;
    plait_result_t status = PLAIT_SUCCESS;
    if (__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
        status = c->failed;
    else
        status = c->is_send ? send_progress(c) : recv_progress(c);
    /* A request whose messages all completed is done even when the comm
     * failed after them (a receive posted behind it met the peer's EOF in
     * the same call): its bytes are whole, and the failure is the next
     * request's to report. */
    int is_done = 1, is_failed = 0;
    for (int i = 0; i < r->n; i++)
        is_done &= msg_is_done(c, &r->msgs[i], &is_failed);
    if (!is_done && (status != PLAIT_SUCCESS || is_failed || __atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))) {
        /* Finished by the error; its pieces stay out of reuse (the comm
         * takes no new request). */
        r->is_used = 0;
        return comm_error(c);
    }
    if (!is_done)
        return PLAIT_SUCCESS;
    for (int i = 0; i < r->n; i++) {
        struct sock_msg *m = &r->msgs[i];
        if (sizes_out)
            sizes_out[i] = m->size;
        for (int k = 0; k < m->npieces; k++)
            __atomic_store_n(&m->pieces[k].state, 0, __ATOMIC_RELAXED);
        m->npieces = 0;
    }
    c->nmsgs += (uint64_t)r->n;
    r->is_used = 0;
    *done_out = 1;
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- memory */

#define SOCK_MR_MAGIC 0x4d524b53u

struct sock_mr {
    uint32_t magic;
    void *data;
    size_t size;
};

static plait_result_t sock_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle_out)
{
    (void)comm;
    if (!mhandle_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket reg_mr: NULL mhandle_out");
    if (type != PLAIT_NET_PTR_HOST)
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "NET/Socket reg_mr: memory of type %d cannot be registered: TCP sends from host memory "
                           "only (ptr_support HOST); stage device buffers through host memory",
                           type);
    struct sock_mr *mr = malloc(sizeof(*mr));
    if (!mr)
        return plait_error(PLAIT_ERR_SYSTEM, "NET/Socket reg_mr: out of memory");
    *mr = (struct sock_mr){SOCK_MR_MAGIC, data, size};
    *mhandle_out = mr;
    return PLAIT_SUCCESS;
}

static plait_result_t sock_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                         void **mhandle_out)
{
    (void)comm;
    (void)data;
    (void)size;
    (void)type;
    (void)offset;
    (void)fd;
    (void)mhandle_out;
    return plait_error(PLAIT_ERR_INVALID_USAGE,
                       "NET/Socket reg_mr_dmabuf: DMA-BUF registration is not supported (ptr_support HOST only)");
}

static plait_result_t sock_dereg_mr(void *comm, void *mhandle)
{
    struct sock_mr *mr = mhandle;
    (void)comm;
    if (!mr)
        return PLAIT_SUCCESS;
    if (mr->magic != SOCK_MR_MAGIC)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket dereg_mr: not a handle from reg_mr");
    mr->magic = 0;
    free(mr);
    return PLAIT_SUCCESS;
}

static plait_result_t sock_iflush(void *recv_comm, int n, void **data, const size_t *sizes, void **mhandles,
                                  void **request_out)
{
    (void)recv_comm;
    (void)n;
    (void)data;
    (void)sizes;
    (void)mhandles;
    if (!request_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket iflush: NULL request_out");
    /* Host memory is coherent: nothing to flush. */
    *request_out = NULL;
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- listen */

static plait_result_t sock_listen(void *vctx, int dev, void *handle, void **listen_comm_out)
{
    struct sock_ctx *ctx = vctx;
    plait_result_t status = check_dev(ctx, dev, "listen");
    if (status != PLAIT_SUCCESS)
        return status;
    if (!handle || !listen_comm_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket listen: NULL handle or listen_comm_out");
    struct sock_listen *l = calloc(1, sizeof(*l));
    if (!l)
        return plait_error(PLAIT_ERR_SYSTEM, "NET/Socket listen: out of memory");
    l->ctx = ctx;
    l->nthreads = ctx->devs[dev].nthreads;
    l->nsocks = ctx->devs[dev].nsocks;
    union plait_sockaddr addr = ctx->devs[dev].nif.addr;
    status = plait_sock_listen(&addr, &l->fd);
    if (status != PLAIT_SUCCESS) {
        free(l);
        return plait_error_context(status, "NET/Socket listen on %s", ctx->devs[dev].nif.name);
    }
    status = plait_random_bytes(l->token, sizeof(l->token));
    if (status != PLAIT_SUCCESS) {
        close(l->fd);
        free(l);
        return plait_error_context(status, "NET/Socket listen: the handle's token");
    }
    plait_sockaddr_str(&addr, l->addr, sizeof(l->addr));

    uint8_t *h = handle;
    memset(h, 0, PLAIT_NET_HANDLE_BYTES);
    sock_put_u32(h, SOCK_HANDLE_MAGIC);
    h[4] = SOCK_WIRE_VERSION;
    h[6] = (uint8_t)l->nthreads;
    h[7] = (uint8_t)l->nsocks;
    if (addr.sa.sa_family == AF_INET) {
        h[5] = 4;
        memcpy(h + 8, &addr.sin.sin_port, 2);
        memcpy(h + 16, &addr.sin.sin_addr, 4);
    } else {
        h[5] = 6;
        memcpy(h + 8, &addr.sin6.sin6_port, 2);
        sock_put_u32(h + 12, addr.sin6.sin6_scope_id);
        memcpy(h + 16, &addr.sin6.sin6_addr, 16);
    }
    memcpy(h + 32, l->token, SOCK_TOKEN_BYTES);
    for (int i = 0; i < SOCK_MAX_PENDING; i++)
        l->pending[i].fd = -1;
    *listen_comm_out = l;
    return PLAIT_SUCCESS;
}

static void pending_drop(struct sock_listen *l, int i, const char *why)
{
    struct sock_pending *p = &l->pending[i];
    if (why)
        SOCK_LOG(l->ctx->log, PLAIT_LOG_WARN, "NET/Socket: dropped a connection from %s to %s: %s", p->peer, l->addr,
                 why);
    close(p->fd);
    l->ndropped += why != NULL;
    l->pending[i] = l->pending[--l->npending];
    l->pending[l->npending].fd = -1;
}

static void group_drop(struct sock_listen *l, struct sock_group *g, const char *why)
{
    SOCK_LOG(l->ctx->log, PLAIT_LOG_WARN, "NET/Socket: dropped a connection from %s to %s (%d of %d sockets): %s",
             g->peer, l->addr, g->have, 1 + l->nsocks, why);
    for (int k = 0; k <= l->nsocks; k++)
        if (g->fds[k] >= 0)
            close(g->fds[k]);
    memset(g, 0, sizeof(*g));
    l->ndropped++;
}

/* A pending socket whose hello is complete: checked, then added to its
 * connection's group. Returns the group when it is now complete. */
static struct sock_group *hello_done(struct sock_listen *l, int i)
{
    struct sock_pending *p = &l->pending[i];
    const uint8_t *h = p->hello;
    char why[160];

    if (sock_get_u32(h) != SOCK_HELLO_MAGIC || h[4] != SOCK_WIRE_VERSION) {
        snprintf(why, sizeof(why), "not a NET/Socket hello (magic 0x%08x, version %u)", sock_get_u32(h), h[4]);
        pending_drop(l, i, why);
        return NULL;
    }
    if (!ct_equal(h + 16, l->token, SOCK_TOKEN_BYTES)) {
        pending_drop(l, i, "wrong token (not made from this listen handle)");
        return NULL;
    }
    const int index = h[5], nsocks = h[6];
    if (nsocks != l->nsocks || index > nsocks) {
        snprintf(why, sizeof(why), "socket %d of %d where this listener has %d data sockets", index, nsocks,
                 l->nsocks);
        pending_drop(l, i, why);
        return NULL;
    }
    const uint64_t id = sock_get_u64(h + 8);
    struct sock_group *g = NULL, *free_g = NULL;
    for (int k = 0; k < SOCK_MAX_GROUPS; k++) {
        if (l->groups[k].is_used && l->groups[k].conn_id == id)
            g = &l->groups[k];
        else if (!l->groups[k].is_used && !free_g)
            free_g = &l->groups[k];
    }
    if (!g) {
        if (!free_g) {
            pending_drop(l, i, "too many connections being made at once");
            return NULL;
        }
        g = free_g;
        g->is_used = 1;
        g->conn_id = id;
        g->have = 0;
        g->deadline = plait_now() + SOCK_HELLO_TIMEOUT_S;
        for (int k = 0; k <= SOCK_MAX_SOCKETS; k++)
            g->fds[k] = -1;
        snprintf(g->peer, sizeof(g->peer), "%s", p->peer);
    }
    if (g->fds[index] >= 0) {
        snprintf(why, sizeof(why), "a second socket %d for one connection", index);
        pending_drop(l, i, why);
        return NULL;
    }
    g->fds[index] = p->fd;
    g->have++;
    /* Handed over: remove from pending without closing. */
    l->pending[i] = l->pending[--l->npending];
    l->pending[l->npending].fd = -1;
    return g->have == 1 + l->nsocks ? g : NULL;
}

static plait_result_t sock_accept(void *vlisten, void **recv_comm_out)
{
    struct sock_listen *l = vlisten;
    if (!l || !recv_comm_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket accept: NULL argument");
    *recv_comm_out = NULL;

    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                return plait_error(PLAIT_ERR_SYSTEM, "NET/Socket accept on %s: %s", l->addr, strerror(errno));
            break; /* a network error accept(2) says to treat as EAGAIN */
        }
        if (l->npending == SOCK_MAX_PENDING) {
            int oldest = 0;
            for (int i = 1; i < l->npending; i++)
                if (l->pending[i].deadline < l->pending[oldest].deadline)
                    oldest = i;
            pending_drop(l, oldest, "too many connections that have not identified themselves");
        }
        struct sock_pending *p = &l->pending[l->npending++];
        p->fd = fd;
        p->got = 0;
        p->deadline = plait_now() + SOCK_HELLO_TIMEOUT_S;
        fd_peer(fd, p->peer, sizeof(p->peer));
        set_nodelay(fd);
    }

    struct sock_group *done = NULL;
    for (int i = 0; i < l->npending && !done;) {
        struct sock_pending *p = &l->pending[i];
        /* Exactly the hello: what follows it belongs to the comm. */
        ssize_t rc = recv(p->fd, p->hello + p->got, SOCK_HELLO_BYTES - p->got, MSG_DONTWAIT);
        if (rc > 0) {
            p->got += (size_t)rc;
            if (p->got == SOCK_HELLO_BYTES)
                done = hello_done(l, i); /* removes it from pending */
            continue;                    /* same i: read more, or the entry moved here */
        }
        if (rc == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            pending_drop(l, i, rc == 0 ? "closed before its hello was complete" : strerror(errno));
            continue;
        }
        if (errno != EINTR && plait_now() > p->deadline) {
            pending_drop(l, i, "no hello within 30 s");
            continue;
        }
        if (errno != EINTR)
            i++;
    }
    const double now = plait_now();
    for (int k = 0; k < SOCK_MAX_GROUPS; k++)
        if (l->groups[k].is_used && &l->groups[k] != done && now > l->groups[k].deadline)
            group_drop(l, &l->groups[k], "its other sockets did not come within 30 s");
    if (!done)
        return PLAIT_SUCCESS;

    struct sock_comm *c = comm_new(0, l->ctx->log, l->nthreads, l->nsocks);
    if (!c) {
        group_drop(l, done, "out of memory");
        return plait_error(PLAIT_ERR_SYSTEM, "NET/Socket accept on %s: out of memory", l->addr);
    }
    c->ctrl_fd = done->fds[0];
    for (int k = 0; k < l->nsocks; k++)
        c->data[k].fd = done->fds[1 + k];
    snprintf(c->peer, sizeof(c->peer), "%s", done->peer);
    memset(done, 0, sizeof(*done));
    SOCK_LOG(l->ctx->log, PLAIT_LOG_TRACE, "NET/Socket: accepted a connection from %s on %s (%d data sockets)",
             c->peer, l->addr, c->nsocks);
    *recv_comm_out = c;
    return PLAIT_SUCCESS;
}

static plait_result_t sock_close_listen(void *vlisten)
{
    struct sock_listen *l = vlisten;
    if (!l)
        return PLAIT_SUCCESS;
    while (l->npending > 0)
        pending_drop(l, 0, NULL);
    for (int k = 0; k < SOCK_MAX_GROUPS; k++)
        if (l->groups[k].is_used)
            for (int s = 0; s <= l->nsocks; s++)
                if (l->groups[k].fds[s] >= 0)
                    close(l->groups[k].fds[s]);
    close(l->fd);
    free(l);
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- connect */

/* The handle from a peer, checked: its address and socket counts. */
static plait_result_t handle_decode(const uint8_t *h, union plait_sockaddr *addr, int *nthreads, int *nsocks)
{
    memset(addr, 0, sizeof(*addr));
    if (sock_get_u32(h) != SOCK_HANDLE_MAGIC || h[4] != SOCK_WIRE_VERSION)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "NET/Socket connect: not a Socket listen handle (magic 0x%08x, version %u)",
                           sock_get_u32(h), h[4]);
    *nthreads = h[6];
    *nsocks = h[7];
    if (*nthreads > SOCK_MAX_THREADS || *nsocks > SOCK_MAX_SOCKETS || (*nthreads == 0) != (*nsocks == 0) ||
        (*nthreads > 0 && *nsocks % *nthreads != 0))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "NET/Socket connect: malformed listen handle (%d threads, %d data sockets)", *nthreads,
                           *nsocks);
    if (h[5] == 4) {
        addr->sin.sin_family = AF_INET;
        memcpy(&addr->sin.sin_port, h + 8, 2);
        memcpy(&addr->sin.sin_addr, h + 16, 4);
    } else if (h[5] == 6) {
        addr->sin6.sin6_family = AF_INET6;
        memcpy(&addr->sin6.sin6_port, h + 8, 2);
        addr->sin6.sin6_scope_id = sock_get_u32(h + 12);
        memcpy(&addr->sin6.sin6_addr, h + 16, 16);
    } else {
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket connect: malformed listen handle (family %u)",
                           h[5]);
    }
    return PLAIT_SUCCESS;
}

static void connect_free(struct sock_connect *st)
{
    if (!st)
        return;
    comm_free(st->comm); /* closes the fds made so far */
    free(st);
}

static void connect_unlink(struct sock_ctx *ctx, struct sock_connect *st)
{
    pthread_mutex_lock(&ctx->lock);
    for (struct sock_connect **pp = &ctx->connects; *pp; pp = &(*pp)->next)
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    pthread_mutex_unlock(&ctx->lock);
}

static plait_result_t connect_start(struct sock_ctx *ctx, uint8_t *h, struct sock_connect **st_out)
{
    union plait_sockaddr addr;
    int nthreads, nsocks;
    plait_result_t status = handle_decode(h, &addr, &nthreads, &nsocks);
    if (status != PLAIT_SUCCESS)
        return status;
    struct sock_connect *st = calloc(1, sizeof(*st));
    if (!st)
        return plait_error(PLAIT_ERR_SYSTEM, "NET/Socket connect: out of memory");
    st->comm = comm_new(1, ctx->log, nthreads, nsocks);
    if (!st->comm) {
        free(st);
        return plait_error(PLAIT_ERR_SYSTEM, "NET/Socket connect: out of memory");
    }
    struct sock_comm *c = st->comm;
    plait_sockaddr_str(&addr, c->peer, sizeof(c->peer));
    uint64_t conn_id = 0;
    status = plait_random_bytes(&st->id, sizeof(st->id));
    if (status == PLAIT_SUCCESS)
        status = plait_random_bytes(&conn_id, sizeof(conn_id));
    if (status != PLAIT_SUCCESS) {
        connect_free(st);
        return plait_error_context(status, "NET/Socket connect to %s", c->peer);
    }
    st->id |= 1; /* never 0, which means "none" */
    memcpy(st->handle, h, sizeof(st->handle));
    st->nfds = 1 + nsocks;
    for (int i = 0; i < st->nfds; i++) {
        int fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            const int err = errno;
            connect_free(st);
            return plait_error(PLAIT_ERR_SYSTEM, "NET/Socket connect to %s: socket(): %s", c->peer, strerror(err));
        }
        if (i == 0)
            c->ctrl_fd = fd;
        else
            c->data[i - 1].fd = fd;
        set_nodelay(fd);
        socklen_t alen = addr.sa.sa_family == AF_INET ? sizeof(addr.sin) : sizeof(addr.sin6);
        if (connect(fd, &addr.sa, alen) != 0 && errno != EINPROGRESS && errno != EINTR) {
            const int err = errno;
            connect_free(st);
            return plait_error(io_status(err), "NET/Socket connect to %s: %s", c->peer, strerror(err));
        }
        sock_hello_encode(st->hello[i], i, nsocks, conn_id, h + 32);
    }
    pthread_mutex_lock(&ctx->lock);
    st->next = ctx->connects;
    ctx->connects = st;
    pthread_mutex_unlock(&ctx->lock);
    sock_put_u64(h + 64, st->id);
    *st_out = st;
    return PLAIT_SUCCESS;
}

static plait_result_t sock_connect(void *vctx, int dev, void *handle, void **send_comm_out)
{
    struct sock_ctx *ctx = vctx;
    plait_result_t status = check_dev(ctx, dev, "connect");
    if (status != PLAIT_SUCCESS)
        return status;
    if (!handle || !send_comm_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "NET/Socket connect: NULL handle or send_comm_out");
    *send_comm_out = NULL;
    uint8_t *h = handle;
    const uint64_t id = sock_get_u64(h + 64);
    struct sock_connect *st = NULL;
    if (id) {
        pthread_mutex_lock(&ctx->lock);
        for (st = ctx->connects; st; st = st->next)
            if (st->id == id && memcmp(st->handle, h, sizeof(st->handle)) == 0)
                break;
        pthread_mutex_unlock(&ctx->lock);
    }
    if (!st) {
        status = connect_start(ctx, h, &st);
        if (status != PLAIT_SUCCESS)
            return status;
    }
    struct sock_comm *c = st->comm;
    int ndone = 0;
    for (int i = 0; i < st->nfds; i++) {
        const int fd = i == 0 ? c->ctrl_fd : c->data[i - 1].fd;
        if (st->stage[i] == 0) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            if (poll(&pfd, 1, 0) <= 0)
                continue;
            int err = 0;
            socklen_t elen = sizeof(err);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
                err = errno;
            if (err == 0 && !(pfd.revents & POLLOUT))
                err = ECONNREFUSED;
            if (err) {
                status = plait_error(io_status(err), "NET/Socket connect to %s (socket %d of %d): %s", c->peer, i,
                                     st->nfds, strerror(err));
                goto err_free;
            }
            st->stage[i] = 1;
        }
        if (st->stage[i] == 1) {
            ssize_t rc = send(fd, st->hello[i] + st->sent[i], SOCK_HELLO_BYTES - st->sent[i],
                              MSG_DONTWAIT | MSG_NOSIGNAL);
            if (rc > 0)
                st->sent[i] += (size_t)rc;
            else if (rc < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                const int err = errno;
                status = plait_error(io_status(err), "NET/Socket connect to %s: sending the hello: %s", c->peer,
                                     strerror(err));
                goto err_free;
            }
            if (st->sent[i] == SOCK_HELLO_BYTES)
                st->stage[i] = 2;
        }
        ndone += st->stage[i] == 2;
    }
    if (ndone < st->nfds)
        return PLAIT_SUCCESS;
    connect_unlink(ctx, st);
    sock_put_u64(h + 64, 0);
    st->comm = NULL;
    free(st);
    SOCK_LOG(ctx->log, PLAIT_LOG_TRACE, "NET/Socket: connected to %s (%d data sockets, %d threads)", c->peer,
             c->nsocks, c->nthreads);
    *send_comm_out = c;
    return PLAIT_SUCCESS;

err_free:
    connect_unlink(ctx, st);
    sock_put_u64(h + 64, 0);
    connect_free(st);
    return status;
}

/* ---------------------------------------------------------------- close, finalize */

static plait_result_t sock_close_send(void *vcomm)
{
    comm_free(vcomm);
    return PLAIT_SUCCESS;
}

static plait_result_t sock_close_recv(void *vcomm)
{
    comm_free(vcomm);
    return PLAIT_SUCCESS;
}

static plait_result_t sock_finalize(void *vctx)
{
    struct sock_ctx *ctx = vctx;
    if (!ctx)
        return PLAIT_SUCCESS;
    while (ctx->connects) {
        struct sock_connect *st = ctx->connects;
        ctx->connects = st->next;
        connect_free(st);
    }
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
    return PLAIT_SUCCESS;
}

int plait_net_socket_comm_fd(const void *comm)
{
    return comm ? ((const struct sock_comm *)comm)->ctrl_fd : -1;
}

const struct plait_net_provider plait_net_socket = {
    .size = sizeof(struct plait_net_provider),
    .version = PLAIT_NET_PROVIDER_VERSION,
    .name = "Socket",
    .init = sock_init,
    .devices = sock_devices,
    .get_properties = sock_get_properties,
    .listen = sock_listen,
    .connect = sock_connect,
    .accept = sock_accept,
    .reg_mr = sock_reg_mr,
    .reg_mr_dmabuf = sock_reg_mr_dmabuf,
    .dereg_mr = sock_dereg_mr,
    .isend = sock_isend,
    .irecv = sock_irecv,
    .iflush = sock_iflush,
    .test = sock_test,
    .close_send = sock_close_send,
    .close_recv = sock_close_recv,
    .close_listen = sock_close_listen,
    .finalize = sock_finalize,
};
