/* Bootstrap: the root that introduces the ranks to each other, and the setup
 * ring they build to run allgathers and barriers during init.
 *
 * Wire formats (every integer big-endian, every message fixed-size, so nothing
 * received can make us allocate or read an amount of the sender's choosing):
 *
 *   address (24 bytes): u8 family (4, 6; 0 = none), u8 0, u16 port,
 *                       u32 IPv6 scope id, u8[16] address (IPv4 in the first 4)
 *   hello   (48 bytes): u32 magic "PLBH", u32 type (1 = register with the root,
 *                       2 = ring: first message to one's successor), u32 rank,
 *                       u32 nranks, u64 uid nonce, address (listening address
 *                       when registering; zero on the ring)
 *   reply   (40 bytes): u32 magic "PLBR", u32 status (enum bs_status), u32 the
 *                       root's nranks, u32 detail (ranks registered, on timeout;
 *                       the rank registered twice, on a duplicate), address of
 *                       the rank's successor (when status is OK); a duplicate's
 *                       reply is followed by 2 addresses (48 bytes): where the
 *                       two registrations of that rank came from
 *   step    (24 bytes): u32 magic "PLBC", u32 op (1 allgather, 2 barrier),
 *                       u32 sequence number, u32 step, u64 block size;
 *                       an allgather step is followed by the block itself.
 *   notice  (24 bytes): u32 magic "PLBD", u32 the rank that died, 16 zero
 *                       bytes; sent on both ring connections, at any time
 *                       after init (see "death notices" below).
 *
 * Every connection, to the root and on the ring, starts with the challenge-
 * response of socket.h (the accepting side speaks first); the hello is read
 * only from a peer that has proven it holds the secret.
 *
 * The root sends each rank only its successor's address, not the whole table:
 * that keeps the root's traffic O(nranks) instead of O(nranks^2), and a rank
 * that wants everyone's addresses gets them with one ring allgather. */
#define _GNU_SOURCE
#include "bootstrap/bootstrap.h"

#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"

_Static_assert(sizeof(struct plait_uid) <= PLAIT_UNIQUE_ID_BYTES, "struct plait_uid must fit in plait_unique_id_t");

#define BS_HELLO_MAGIC 0x504c4248u /* "PLBH" */
#define BS_REPLY_MAGIC 0x504c4252u /* "PLBR" */
#define BS_STEP_MAGIC 0x504c4243u  /* "PLBC" */
#define BS_NOTICE_MAGIC 0x504c4244u /* "PLBD" */

#define BS_ADDR_BYTES 24
#define BS_HELLO_BYTES 48
#define BS_REPLY_BYTES 40
#define BS_DUP_BYTES (2 * BS_ADDR_BYTES)
#define BS_STEP_BYTES 24

/* Beyond any job we expect; bounds what an (authenticated) hello can make the root allocate. */
#define BS_MAX_RANKS (1 << 20)
/* A connection to the root or to our own ring listener must finish the
 * handshake and its hello within this time after we accept it. A legitimate
 * peer is waiting for our challenge and needs a few round trips, but may be
 * descheduled for a while on a loaded machine; silent connections are not what
 * this deadline defends against (eviction, below, makes room for new arrivals),
 * so it is generous. */
#define BS_PENDING_S 10.0
/* Our own waits on a peer that does not answer: connecting to the successor,
 * and the root sending its final replies. */
#define BS_HANDSHAKE_S 10.0
/* Connections being authenticated at once, by the root and by a rank alike
 * (one mechanism, struct bs_acceptor): enough for a whole job's burst of
 * arrivals at the root. Beyond it, or when descriptors run out, the oldest
 * pending connection is dropped for the new one, but only once it has been
 * pending for BS_EVICT_AGE_S: a legitimate peer answers our challenge within
 * milliseconds, so what is still silent by then is most likely hostile, and a
 * burst of real ranks is never dropped for being many. Until then further
 * arrivals wait in the listen backlog. */
#define BS_MAX_PENDING 1024
#define BS_EVICT_AGE_S 0.1
#define BS_SLICE_MS 100

enum bs_hello_type { BS_HELLO_REGISTER = 1, BS_HELLO_RING = 2 };

enum bs_status {
    BS_STATUS_OK = 0,
    BS_STATUS_TIMEOUT = 1,         /* the root gave up before every rank came */
    BS_STATUS_BAD_HELLO = 2,       /* wrong magic or type: another version or protocol */
    BS_STATUS_WRONG_ID = 3,        /* the nonce is another communicator's */
    BS_STATUS_NRANKS_MISMATCH = 4, /* the root already serves a different nranks */
    BS_STATUS_BAD_RANK = 5,        /* rank or nranks out of range */
    BS_STATUS_DUPLICATE_RANK = 6,  /* two connections registered one rank: the job cannot form */
    BS_STATUS_BAD_ADDRESS = 7,     /* the listening address cannot be used */
    BS_STATUS_STOPPED = 8,         /* the rank that started the root failed and stopped it */
};

enum bs_op { BS_OP_ALLGATHER = 1, BS_OP_BARRIER = 2 };

struct plait_bootstrap {
    int rank;
    int nranks;
    int next_fd; /* to (rank+1) % nranks; -1 when nranks == 1 */
    int prev_fd; /* from (rank-1) % nranks */
    int is_broken; /* an allgather or barrier failed: the ring's framing is lost */
    uint32_t seq;  /* allgathers and barriers so far, checked against the predecessor's */
    uint64_t nonce;
    uint32_t is_authenticated;
    double timeout_s;
    const int *abort_flag;
    uint8_t secret[PLAIT_SECRET_BYTES];
    char next_str[PLAIT_SOCKADDR_STRLEN];
    char prev_str[PLAIT_SOCKADDR_STRLEN];
    /* ring_lock: held by a ring operation for its whole walk, so that no
     * other thread reads prev_fd or writes next_fd in the middle of a step;
     * the notice reader and sender only try it (see below). notice_pending:
     * culprit + 1 of a notice for next_fd that waits for the lock's holder
     * (atomic), 0: none. */
    pthread_mutex_t ring_lock;
    int notice_pending;
    /* Death notices (see below); the notice state is read and written by one
     * thread at a time (plait_comm_check_peers holds the comm's peers_lock). */
    int has_notified;               /* this rank sent its notice */
    int heard_culprit;              /* the rank the first notice read named, -1: none */
    int heard_from;                 /* the neighbour it came from */
    int link_closed[2];             /* [0] next_fd, [1] prev_fd: the neighbour's end closed */
    int link_noticed[2];            /* a notice came on that link before it closed */
};

static int roots_running;

/* ---------------------------------------------------------------- encoding */

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) << 32 | get_u32(p + 4);
}

static void addr_put(uint8_t p[BS_ADDR_BYTES], const union plait_sockaddr *a)
{
    memset(p, 0, BS_ADDR_BYTES);
    if (!a)
        return;
    if (a->sa.sa_family == AF_INET) {
        p[0] = 4;
        memcpy(p + 2, &a->sin.sin_port, 2); /* already in network order */
        memcpy(p + 8, &a->sin.sin_addr, 4);
    } else if (a->sa.sa_family == AF_INET6) {
        p[0] = 6;
        memcpy(p + 2, &a->sin6.sin6_port, 2);
        put_u32(p + 4, a->sin6.sin6_scope_id);
        memcpy(p + 8, &a->sin6.sin6_addr, 16);
    }
}

/* Returns 1 and fills *a for a usable address (IPv4/IPv6, non-zero port). */
static int addr_get(const uint8_t p[BS_ADDR_BYTES], union plait_sockaddr *a)
{
    memset(a, 0, sizeof(*a));
    if (p[1] != 0 || (p[2] == 0 && p[3] == 0))
        return 0;
    if (p[0] == 4) {
        a->sin.sin_family = AF_INET;
        memcpy(&a->sin.sin_port, p + 2, 2);
        memcpy(&a->sin.sin_addr, p + 8, 4);
        return 1;
    }
    if (p[0] == 6) {
        a->sin6.sin6_family = AF_INET6;
        memcpy(&a->sin6.sin6_port, p + 2, 2);
        a->sin6.sin6_scope_id = get_u32(p + 4);
        memcpy(&a->sin6.sin6_addr, p + 8, 16);
        return 1;
    }
    return 0;
}

/* The address with every byte the kernel ignores cleared, so that uids built
 * from the same address by different processes are byte-identical. */
static union plait_sockaddr addr_canonical(const union plait_sockaddr *a)
{
    union plait_sockaddr c;
    memset(&c, 0, sizeof(c));
    if (a->sa.sa_family == AF_INET) {
        c.sin.sin_family = AF_INET;
        c.sin.sin_port = a->sin.sin_port;
        c.sin.sin_addr = a->sin.sin_addr;
    } else if (a->sa.sa_family == AF_INET6) {
        c.sin6.sin6_family = AF_INET6;
        c.sin6.sin6_port = a->sin6.sin6_port;
        c.sin6.sin6_addr = a->sin6.sin6_addr;
        c.sin6.sin6_scope_id = a->sin6.sin6_scope_id;
    }
    return c;
}

struct bs_hello {
    uint32_t magic;
    uint32_t type;
    uint32_t rank;
    uint32_t nranks;
    uint64_t nonce;
    uint8_t addr[BS_ADDR_BYTES];
};

static void hello_put(uint8_t p[BS_HELLO_BYTES], uint32_t type, int rank, int nranks, uint64_t nonce,
                      const union plait_sockaddr *addr)
{
    put_u32(p, BS_HELLO_MAGIC);
    put_u32(p + 4, type);
    put_u32(p + 8, (uint32_t)rank);
    put_u32(p + 12, (uint32_t)nranks);
    put_u64(p + 16, nonce);
    addr_put(p + 24, addr);
}

static void hello_get(const uint8_t p[BS_HELLO_BYTES], struct bs_hello *h)
{
    h->magic = get_u32(p);
    h->type = get_u32(p + 4);
    h->rank = get_u32(p + 8);
    h->nranks = get_u32(p + 12);
    h->nonce = get_u64(p + 16);
    memcpy(h->addr, p + 24, BS_ADDR_BYTES);
}

static void reply_put(uint8_t p[BS_REPLY_BYTES], enum bs_status status, int nranks, uint32_t detail,
                      const union plait_sockaddr *succ)
{
    put_u32(p, BS_REPLY_MAGIC);
    put_u32(p + 4, (uint32_t)status);
    put_u32(p + 8, (uint32_t)nranks);
    put_u32(p + 12, detail);
    addr_put(p + 16, succ);
}

static const char *bs_status_str(uint32_t status)
{
    switch (status) {
    case BS_STATUS_OK:
        return "ok";
    case BS_STATUS_TIMEOUT:
        return "the root timed out";
    case BS_STATUS_BAD_HELLO:
        return "malformed registration (another plait version?)";
    case BS_STATUS_WRONG_ID:
        return "registration for another communicator (different unique id)";
    case BS_STATUS_NRANKS_MISMATCH:
        return "nranks differs from the other ranks'";
    case BS_STATUS_BAD_RANK:
        return "rank or nranks out of range";
    case BS_STATUS_DUPLICATE_RANK:
        return "a rank was registered twice";
    case BS_STATUS_BAD_ADDRESS:
        return "unusable listening address";
    case BS_STATUS_STOPPED:
        return "the root was stopped because rank 0, which started it, failed";
    default:
        return "unknown status";
    }
}

/* ---------------------------------------------------------------- handshake state machine
 *
 * The blocking plait_sock_auth_server/client cannot serve here: the root must
 * authenticate many arrivals at once (one silent peer must not stall the rest),
 * and a rank must at the same time authenticate itself to its successor and its
 * predecessor to itself (done one after the other, around the ring, every rank
 * would wait for its successor to speak first). So each connection is a small
 * state machine over the same fixed-size messages, driven from a poll loop. */

enum bs_conn_state {
    /* accepting side */
    BS_CONN_SEND_CHALLENGE,
    BS_CONN_RECV_ANSWER,
    BS_CONN_SEND_PROOF,
    BS_CONN_RECV_HELLO,
    /* connecting side */
    BS_CONN_RECV_CHALLENGE,
    BS_CONN_SEND_ANSWER,
    BS_CONN_RECV_PROOF,
    BS_CONN_SEND_HELLO,
    BS_CONN_DONE,
};

enum bs_conn_progress { BS_CONN_BLOCKED, BS_CONN_FINISHED, BS_CONN_FAILED };

struct bs_conn {
    int fd;
    enum bs_conn_state state;
    size_t off;                  /* bytes of buf moved so far */
    size_t len;                  /* size of the message in buf */
    uint8_t buf[64];             /* the message being sent or received */
    uint8_t hello[BS_HELLO_BYTES]; /* to send (connecting side) or received (accepting side) */
    struct plait_auth auth;
    double accepted_at;          /* accepting side: when we accepted it */
    double handshake_deadline;
    int err;                     /* errno of a failed send/recv */
    const char *why;             /* why it failed, for the log */
    char peer[PLAIT_SOCKADDR_STRLEN];
};

static int conn_is_sending(enum bs_conn_state state)
{
    return state == BS_CONN_SEND_CHALLENGE || state == BS_CONN_SEND_PROOF || state == BS_CONN_SEND_ANSWER ||
           state == BS_CONN_SEND_HELLO;
}

static short conn_events(const struct bs_conn *c)
{
    return conn_is_sending(c->state) ? POLLOUT : POLLIN;
}

static plait_result_t conn_start_server(struct bs_conn *c, int fd, const char *peer)
{
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    snprintf(c->peer, sizeof(c->peer), "%s", peer);
    c->state = BS_CONN_SEND_CHALLENGE;
    c->len = PLAIT_AUTH_CHALLENGE_BYTES;
    c->accepted_at = plait_now();
    c->handshake_deadline = c->accepted_at + BS_PENDING_S;
    return plait_auth_server_challenge(&c->auth, c->buf);
}

static void conn_start_client(struct bs_conn *c, int fd, const char *peer, const uint8_t hello[BS_HELLO_BYTES])
{
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    snprintf(c->peer, sizeof(c->peer), "%s", peer);
    c->state = BS_CONN_RECV_CHALLENGE;
    c->len = PLAIT_AUTH_CHALLENGE_BYTES;
    c->handshake_deadline = plait_now() + BS_HANDSHAKE_S;
    memcpy(c->hello, hello, BS_HELLO_BYTES);
}

/* Moves the connection as far as its socket allows without waiting. */
static enum bs_conn_progress conn_advance(struct bs_conn *c, const uint8_t secret[PLAIT_SECRET_BYTES])
{
    uint8_t tmp[PLAIT_AUTH_ANSWER_BYTES];

    while (c->state != BS_CONN_DONE) {
        if (c->off < c->len) {
            int is_send = conn_is_sending(c->state);
            ssize_t n = is_send ? send(c->fd, c->buf + c->off, c->len - c->off, MSG_DONTWAIT | MSG_NOSIGNAL)
                                : recv(c->fd, c->buf + c->off, c->len - c->off, MSG_DONTWAIT);
            if (n > 0) {
                c->off += (size_t)n;
                continue;
            }
            if (n == 0 && !is_send) {
                c->why = c->state == BS_CONN_RECV_PROOF ? "closed the connection after our answer (a different "
                                                          "secret?)"
                                                        : "closed the connection during the handshake";
                return BS_CONN_FAILED;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return BS_CONN_BLOCKED;
            c->err = n < 0 ? errno : EIO;
            c->why = "socket error during the handshake";
            return BS_CONN_FAILED;
        }
        /* The current message is complete: check it and set up the next. */
        switch (c->state) {
        case BS_CONN_SEND_CHALLENGE:
            c->state = BS_CONN_RECV_ANSWER;
            c->len = PLAIT_AUTH_ANSWER_BYTES;
            break;
        case BS_CONN_RECV_ANSWER:
            if (!plait_auth_server_check(&c->auth, secret, c->buf, tmp)) {
                c->why = "failed authentication (a different secret, or not a plait peer)";
                return BS_CONN_FAILED;
            }
            memcpy(c->buf, tmp, PLAIT_AUTH_PROOF_BYTES);
            c->state = BS_CONN_SEND_PROOF;
            c->len = PLAIT_AUTH_PROOF_BYTES;
            break;
        case BS_CONN_SEND_PROOF:
            c->state = BS_CONN_RECV_HELLO;
            c->len = BS_HELLO_BYTES;
            break;
        case BS_CONN_RECV_HELLO:
            memcpy(c->hello, c->buf, BS_HELLO_BYTES);
            c->state = BS_CONN_DONE;
            break;
        case BS_CONN_RECV_CHALLENGE:
            if (!plait_auth_client_answer(&c->auth, secret, c->buf, tmp)) {
                c->why = "is not a plait bootstrap peer (bad protocol tag)";
                return BS_CONN_FAILED;
            }
            memcpy(c->buf, tmp, PLAIT_AUTH_ANSWER_BYTES);
            c->state = BS_CONN_SEND_ANSWER;
            c->len = PLAIT_AUTH_ANSWER_BYTES;
            break;
        case BS_CONN_SEND_ANSWER:
            c->state = BS_CONN_RECV_PROOF;
            c->len = PLAIT_AUTH_PROOF_BYTES;
            break;
        case BS_CONN_RECV_PROOF:
            if (!plait_auth_client_check(&c->auth, secret, c->buf)) {
                c->why = "does not hold the secret (wrong proof)";
                return BS_CONN_FAILED;
            }
            memcpy(c->buf, c->hello, BS_HELLO_BYTES);
            c->state = BS_CONN_SEND_HELLO;
            c->len = BS_HELLO_BYTES;
            break;
        case BS_CONN_SEND_HELLO:
            c->state = BS_CONN_DONE;
            break;
        case BS_CONN_DONE:
            break;
        }
        c->off = 0;
    }
    explicit_bzero(&c->auth, sizeof(c->auth));
    return BS_CONN_FINISHED;
}

/* ---------------------------------------------------------------- acceptor
 *
 * A listening socket plus the accepted connections still in their handshake,
 * the one mechanism behind the root's listener and each rank's. Whoever owns it
 * builds the poll set with acceptor_fill(), polls for at most acceptor_poll_ms(),
 * then calls acceptor_service() with the results; a connection that completes
 * its hello is handed to on_hello, which takes the fd (returns 1) or rejects it
 * (returns 0: the acceptor closes it).
 *
 * Nothing here blocks: each connection is a bs_conn state machine, so any
 * number of silent or slow peers cost a descriptor and a slot each, never time.
 * The slots are bounded (BS_MAX_PENDING, and the process's descriptors); when
 * they run out the oldest pending connection makes room (see BS_EVICT_AGE_S), so
 * a legitimate peer queued behind hundreds of idle connections is reached in
 * one pass over the backlog instead of one handshake deadline per batch. */

struct bs_acceptor {
    int listen_fd;
    const uint8_t *secret;
    const char *who; /* names the owner in log lines */
    struct bs_conn *conns;
    int count;
    int max;
    int high;                /* most slots ever used: what fini must clear */
    long evicted;            /* connections dropped to make room, logged once by fini */
    double resume_accept_at; /* accepting paused until then (no room yet, or accept failing) */
    int (*on_hello)(void *ctx, struct bs_conn *c);
    void *ctx;
};

static plait_result_t acceptor_init(struct bs_acceptor *a, int listen_fd, const uint8_t *secret, const char *who,
                                    int (*on_hello)(void *, struct bs_conn *), void *ctx)
{
    memset(a, 0, sizeof(*a));
    a->listen_fd = listen_fd;
    a->secret = secret;
    a->who = who;
    a->max = BS_MAX_PENDING;
    a->on_hello = on_hello;
    a->ctx = ctx;
    a->conns = calloc((size_t)a->max, sizeof(*a->conns));
    if (!a->conns)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory for %d pending connections", who, a->max);
    return PLAIT_SUCCESS;
}

/* Closes the connections still in their handshake (not the listening socket). */
static void acceptor_fini(struct bs_acceptor *a)
{
    for (int i = 0; i < a->count; i++)
        close(a->conns[i].fd);
    if (a->evicted)
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP,
                   "%s: dropped %ld connections that had not authenticated within %.1f s to make room for newer "
                   "ones (more than %d pending, or out of descriptors)",
                   a->who, a->evicted, BS_EVICT_AGE_S, a->max);
    if (a->conns)
        explicit_bzero(a->conns, (size_t)a->high * sizeof(*a->conns));
    free(a->conns);
    a->conns = NULL;
    a->count = 0;
}

static void acceptor_remove(struct bs_acceptor *a, int i, int do_close)
{
    if (do_close)
        close(a->conns[i].fd);
    a->conns[i] = a->conns[a->count - 1];
    a->count--;
}

static void acceptor_drop(struct bs_acceptor *a, int i, const char *why)
{
    struct bs_conn *c = &a->conns[i];
    if (c->err)
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: dropped connection from %s: %s: %s", a->who, c->peer, why,
                   strerror(c->err));
    else
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: dropped connection from %s: %s", a->who, c->peer, why);
    acceptor_remove(a, i, 1);
}

/* Whether the peer has shown anything of a handshake: sent a byte of its
 * answer, or got past it. Such connections go last when room is needed. */
static int conn_has_progress(const struct bs_conn *c)
{
    return c->state != BS_CONN_SEND_CHALLENGE && !(c->state == BS_CONN_RECV_ANSWER && c->off == 0);
}

/* The connection to drop when room is needed: the oldest that has shown no
 * progress, else the oldest. -1 when none is pending. */
static int acceptor_oldest(const struct bs_acceptor *a)
{
    int best = -1;
    for (int i = 0; i < a->count; i++) {
        const struct bs_conn *c = &a->conns[i], *b = best >= 0 ? &a->conns[best] : NULL;
        if (!b || conn_has_progress(b) > conn_has_progress(c) ||
            (conn_has_progress(b) == conn_has_progress(c) && c->accepted_at < b->accepted_at))
            best = i;
    }
    return best;
}

/* Makes room for one more connection by dropping the oldest pending one, if it
 * has been pending for BS_EVICT_AGE_S. Returns 1 if room was made; otherwise
 * pauses accepting until the oldest is old enough (or, with nothing pending,
 * for one slice: the lack of descriptors is someone else's) and returns 0. */
static int acceptor_make_room(struct bs_acceptor *a, double now)
{
    int i = acceptor_oldest(a);
    if (i < 0) {
        a->resume_accept_at = now + BS_SLICE_MS * 1e-3;
        return 0;
    }
    if (now - a->conns[i].accepted_at < BS_EVICT_AGE_S) {
        a->resume_accept_at = a->conns[i].accepted_at + BS_EVICT_AGE_S;
        return 0;
    }
    PLAIT_TRACE(PLAIT_SUBSYS_BOOTSTRAP, "%s: dropped connection from %s, silent for %.2f s, to make room", a->who,
                a->conns[i].peer, now - a->conns[i].accepted_at);
    a->evicted++;
    acceptor_remove(a, i, 1);
    return 1;
}

/* Slots [0] = listener (fd -1 when not accepting), then one per connection.
 * Returns the number of entries written. */
static nfds_t acceptor_fill(const struct bs_acceptor *a, struct pollfd *pfds, int is_accepting)
{
    int can_accept = is_accepting && plait_now() >= a->resume_accept_at;
    pfds[0] = (struct pollfd){.fd = can_accept ? a->listen_fd : -1, .events = POLLIN};
    for (int i = 0; i < a->count; i++)
        pfds[1 + i] = (struct pollfd){.fd = a->conns[i].fd, .events = conn_events(&a->conns[i])};
    return (nfds_t)(1 + a->count);
}

/* The poll timeout: at most ms, less when accepting resumes sooner. */
static int acceptor_poll_ms(const struct bs_acceptor *a, int ms)
{
    double wait = a->resume_accept_at - plait_now();
    if (wait > 0 && wait * 1e3 < ms)
        ms = (int)(wait * 1e3) + 1;
    return ms;
}

static void acceptor_advance(struct bs_acceptor *a, int i)
{
    struct bs_conn *c = &a->conns[i];
    switch (conn_advance(c, a->secret)) {
    case BS_CONN_BLOCKED:
        break;
    case BS_CONN_FAILED:
        acceptor_drop(a, i, c->why);
        break;
    case BS_CONN_FINISHED: {
        struct bs_conn done = *c;
        /* Out of the table first: on_hello may close the fd or keep it. */
        acceptor_remove(a, i, 0);
        if (!a->on_hello(a->ctx, &done))
            close(done.fd);
        explicit_bzero(&done, sizeof(done));
        break;
    }
    }
}

/* Accepts what the backlog holds, making room as above. At most max accepts a
 * call, so that a flood of arrivals cannot keep the owner from serving the
 * connections it has. */
static void acceptor_accept(struct bs_acceptor *a)
{
    for (int budget = a->max; budget > 0; budget--) {
        union plait_sockaddr peer;
        socklen_t plen = sizeof(peer);
        char peer_str[PLAIT_SOCKADDR_STRLEN];
        double now = plait_now();

        if (a->count == a->max && !acceptor_make_room(a, now))
            return;
        memset(&peer, 0, sizeof(peer));
        int fd = accept4(a->listen_fd, &peer.sa, &plen, SOCK_CLOEXEC);
        if (fd < 0) {
            switch (errno) {
            case EAGAIN:
#if EWOULDBLOCK != EAGAIN
            case EWOULDBLOCK:
#endif
                return;
            case EINTR:
            case ECONNABORTED:
            case EPROTO:
                continue;
            case EMFILE:
            case ENFILE:
            case ENOBUFS:
            case ENOMEM:
                /* Out of descriptors or memory, most likely held by pending
                 * connections: free the oldest and try again. */
                if (acceptor_make_room(a, now))
                    continue;
                PLAIT_TRACE(PLAIT_SUBSYS_BOOTSTRAP, "%s: accept: %s (%d pending)", a->who, strerror(errno),
                            a->count);
                return;
            default:
                /* A network error: try again shortly rather than spin on a
                 * listener that stays readable. */
                PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: accept: %s", a->who, strerror(errno));
                a->resume_accept_at = now + BS_SLICE_MS * 1e-3;
                return;
            }
        }
        /* Ring neighbours exchange small headers then blocks; without this, Nagle
         * and delayed ACKs would add tens of milliseconds per step. */
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        plait_sockaddr_str(&peer, peer_str, sizeof(peer_str));
        struct bs_conn *c = &a->conns[a->count];
        if (conn_start_server(c, fd, peer_str) != PLAIT_SUCCESS) {
            PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: dropped connection from %s: %s", a->who, peer_str,
                       plait_last_error_get());
            close(fd);
            continue;
        }
        PLAIT_TRACE(PLAIT_SUBSYS_BOOTSTRAP, "%s: connection from %s", a->who, peer_str);
        a->count++;
        if (a->count > a->high)
            a->high = a->count;
        /* The challenge can go at once; the socket is fresh. */
        acceptor_advance(a, a->count - 1);
    }
}

/* Handles one poll round: pfds/n as filled by acceptor_fill() (connections may
 * have been added or removed since only through this function). */
static void acceptor_service(struct bs_acceptor *a, const struct pollfd *pfds, nfds_t n)
{
    /* Backwards: removing connection i moves the last one into slot i, and the
     * last one has then already been serviced. */
    for (int i = (int)n - 2; i >= 0; i--) {
        if (i < a->count && pfds[1 + i].revents && pfds[1 + i].fd == a->conns[i].fd)
            acceptor_advance(a, i);
    }
    double now = plait_now();
    for (int i = a->count - 1; i >= 0; i--) {
        if (now > a->conns[i].handshake_deadline)
            acceptor_drop(a, i, "did not complete the handshake in time");
    }
    if (pfds[0].fd >= 0 && pfds[0].revents)
        acceptor_accept(a);
}

/* ---------------------------------------------------------------- root */

/* Shared by a root thread and the init that started it (start_root), so that a
 * failed or aborted init can stop its root instead of leaving it listening until
 * its timeout (or for ever, without one). Freed by whoever drops the last ref. */
struct bs_root_ctl {
    int stop; /* set (release) by the init; read (acquire) by the root each slice */
    int refs;
};

static void root_ctl_put(struct bs_root_ctl *ctl)
{
    if (ctl && __atomic_sub_fetch(&ctl->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(ctl);
}

struct bs_root {
    struct bs_root_ctl *ctl;
    int listen_fd;
    uint8_t secret[PLAIT_SECRET_BYTES];
    uint64_t nonce;
    double timeout_s;
    double deadline;  /* moves forward each time a rank registers */
    char name[96];    /* "bootstrap root 1.2.3.4:5" */
    int nranks;       /* 0 until the first valid registration */
    int registered;
    int *fds;         /* [nranks]: each registered rank's connection, or -1 */
    uint8_t (*addrs)[BS_ADDR_BYTES];
    char (*peers)[PLAIT_SOCKADDR_STRLEN];
    /* -1, else a rank that two connections registered: the job cannot form (the
     * root cannot tell the real rank from a forger, or from a second process
     * launched as the same rank), so every rank, registered or still to come,
     * is told at once, with where both registrations came from. */
    int dup_rank;
    int dup_nranks;
    uint8_t dup_addrs[2][BS_ADDR_BYTES];
};

/* Tells an authenticated peer why it was turned away. Best effort: the socket is
 * fresh and the reply small, so a non-blocking send either fits or the peer is
 * gone. */
static void root_send_reply(int fd, enum bs_status status, int nranks, uint32_t detail,
                            const uint8_t succ[BS_ADDR_BYTES])
{
    uint8_t msg[BS_REPLY_BYTES];
    union plait_sockaddr succ_addr;
    int has_succ = succ && addr_get(succ, &succ_addr);
    reply_put(msg, status, nranks, detail, has_succ ? &succ_addr : NULL);
    (void)send(fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* The failure every rank gets once a rank was registered twice: the reply
 * and both registrations' addresses, in one send (best effort, as above). */
static void root_send_duplicate(const struct bs_root *r, int fd)
{
    uint8_t msg[BS_REPLY_BYTES + BS_DUP_BYTES];
    reply_put(msg, BS_STATUS_DUPLICATE_RANK, r->dup_nranks, (uint32_t)r->dup_rank, NULL);
    memcpy(msg + BS_REPLY_BYTES, r->dup_addrs, BS_DUP_BYTES);
    (void)send(fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
}

static void root_free_table(struct bs_root *r)
{
    if (r->fds)
        for (int i = 0; i < r->nranks; i++)
            if (r->fds[i] >= 0)
                close(r->fds[i]);
    free(r->fds);
    free(r->addrs);
    free(r->peers);
    r->fds = NULL;
    r->addrs = NULL;
    r->peers = NULL;
    r->nranks = 0;
    r->registered = 0;
}

static void root_unregister(struct bs_root *r, int rank, const char *why)
{
    PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: rank %d (%s) %s before every rank arrived; it may register again",
               r->name, rank, r->peers[rank], why);
    close(r->fds[rank]);
    r->fds[rank] = -1;
    r->registered--;
    /* With nobody left, forget nranks too: a first rank with a wrong nranks must
     * not lock out the right ones for good. */
    if (r->registered == 0)
        root_free_table(r);
}

static void peer_addr_put(int fd, uint8_t out[BS_ADDR_BYTES])
{
    union plait_sockaddr a;
    socklen_t len = sizeof(a);
    memset(&a, 0, sizeof(a));
    if (getpeername(fd, &a.sa, &len) != 0)
        memset(&a, 0, sizeof(a));
    addr_put(out, &a);
}

/* Connection c registers rank h->rank, which another connection holds. */
static int root_fail_duplicate(struct bs_root *r, struct bs_conn *c, const struct bs_hello *h)
{
    int rank = (int)h->rank;
    r->dup_rank = rank;
    r->dup_nranks = r->nranks;
    peer_addr_put(r->fds[rank], r->dup_addrs[0]);
    peer_addr_put(c->fd, r->dup_addrs[1]);
    PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP,
               "%s: rank %d of %d registered twice, from %s and then from %s (a forged registration, or two "
               "processes launched as one rank): failing every rank",
               r->name, rank, r->nranks, r->peers[rank], c->peer);
    root_send_duplicate(r, c->fd);
    for (int i = 0; i < r->nranks; i++)
        if (r->fds[i] >= 0)
            root_send_duplicate(r, r->fds[i]);
    root_free_table(r);
    r->deadline = plait_deadline(r->timeout_s);
    return 0;
}

static int root_reject(struct bs_root *r, struct bs_conn *c, enum bs_status status, const struct bs_hello *h)
{
    if (status == BS_STATUS_BAD_HELLO)
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: rejected registration from %s: %s", r->name, c->peer,
                   bs_status_str(status));
    else
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: rejected registration from %s (rank %u of %u): %s", r->name,
                   c->peer, h->rank, h->nranks, bs_status_str(status));
    root_send_reply(c->fd, status, r->nranks, (uint32_t)r->registered, NULL);
    return 0;
}

static int root_on_hello(void *ctx, struct bs_conn *c)
{
    struct bs_root *r = ctx;
    struct bs_hello h;
    union plait_sockaddr addr;

    hello_get(c->hello, &h);
    if (h.magic != BS_HELLO_MAGIC || h.type != BS_HELLO_REGISTER)
        return root_reject(r, c, BS_STATUS_BAD_HELLO, &h);
    if (h.nonce != r->nonce)
        return root_reject(r, c, BS_STATUS_WRONG_ID, &h);
    if (r->dup_rank >= 0) {
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: told rank %u (%s) that rank %d was registered twice", r->name,
                   h.rank, c->peer, r->dup_rank);
        root_send_duplicate(r, c->fd);
        r->deadline = plait_deadline(r->timeout_s);
        return 0;
    }
    if (h.nranks < 1 || h.nranks > BS_MAX_RANKS || h.rank >= h.nranks)
        return root_reject(r, c, BS_STATUS_BAD_RANK, &h);
    if (r->nranks && h.nranks != (uint32_t)r->nranks)
        return root_reject(r, c, BS_STATUS_NRANKS_MISMATCH, &h);
    /* A rank alone needs no listener, so its address may be empty. */
    if (h.nranks > 1 && !addr_get(h.addr, &addr))
        return root_reject(r, c, BS_STATUS_BAD_ADDRESS, &h);
    if (r->nranks && r->fds[h.rank] >= 0)
        return root_fail_duplicate(r, c, &h);

    if (!r->nranks) {
        r->fds = malloc(h.nranks * sizeof(*r->fds));
        r->addrs = calloc(h.nranks, sizeof(*r->addrs));
        r->peers = calloc(h.nranks, sizeof(*r->peers));
        if (!r->fds || !r->addrs || !r->peers) {
            PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: out of memory for %u ranks", r->name, h.nranks);
            free(r->fds);
            free(r->addrs);
            free(r->peers);
            r->fds = NULL;
            r->addrs = NULL;
            r->peers = NULL;
            return 0;
        }
        for (uint32_t i = 0; i < h.nranks; i++)
            r->fds[i] = -1;
        r->nranks = (int)h.nranks;
    }
    r->fds[h.rank] = c->fd;
    memcpy(r->addrs[h.rank], h.addr, BS_ADDR_BYTES);
    snprintf(r->peers[h.rank], sizeof(r->peers[h.rank]), "%s", c->peer);
    r->registered++;
    r->deadline = plait_deadline(r->timeout_s);
    PLAIT_TRACE(PLAIT_SUBSYS_BOOTSTRAP, "%s: rank %u of %d registered from %s (%d so far)", r->name, h.rank,
                r->nranks, c->peer, r->registered);
    return 1;
}

/* A registered rank only waits for its reply: anything readable on its
 * connection means it closed, failed, or broke the protocol. */
static void root_check_registered(struct bs_root *r, int rank)
{
    char byte;
    ssize_t n = recv(r->fds[rank], &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0)
        root_unregister(r, rank, "closed its connection");
    else if (n > 0)
        root_unregister(r, rank, "sent unexpected data");
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        root_unregister(r, rank, "lost its connection");
}

static void root_give_up(struct bs_root *r, enum bs_status why)
{
    if (!r->nranks) {
        if (why == BS_STATUS_TIMEOUT)
            PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: no rank registered within %.1f s; exiting", r->name,
                       r->timeout_s);
        else
            PLAIT_INFO(PLAIT_SUBSYS_BOOTSTRAP, "%s: stopped before any rank registered", r->name);
        return;
    }
    char missing[256];
    size_t used = 0;
    int nmissing = 0;
    missing[0] = '\0';
    for (int i = 0; i < r->nranks; i++) {
        if (r->fds[i] >= 0)
            continue;
        if (nmissing++ < 16 && used < sizeof(missing)) {
            int k = snprintf(missing + used, sizeof(missing) - used, " %d", i);
            if (k > 0)
                used += (size_t)k;
        }
    }
    if (why == BS_STATUS_TIMEOUT)
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP,
                   "%s: gave up after %.1f s without a new rank: %d of %d ranks registered; missing ranks:%s%s",
                   r->name, r->timeout_s, r->registered, r->nranks, missing, nmissing > 16 ? " ..." : "");
    else
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP,
                   "%s: stopped by the failure of rank 0: %d of %d ranks registered; missing ranks:%s%s", r->name,
                   r->registered, r->nranks, missing, nmissing > 16 ? " ..." : "");
    for (int i = 0; i < r->nranks; i++)
        if (r->fds[i] >= 0)
            root_send_reply(r->fds[i], why, r->nranks, (uint32_t)r->registered, NULL);
}

static void root_finish(struct bs_root *r)
{
    for (int i = 0; i < r->nranks; i++) {
        uint8_t msg[BS_REPLY_BYTES];
        union plait_sockaddr succ;
        int has_succ = addr_get(r->addrs[(i + 1) % r->nranks], &succ);
        reply_put(msg, BS_STATUS_OK, r->nranks, (uint32_t)r->registered, has_succ ? &succ : NULL);
        /* The rank is blocked reading this; a failure means it died, which it
         * will report itself (or its neighbours will). */
        if (plait_sock_send_all(r->fds[i], msg, sizeof(msg), plait_deadline(BS_HANDSHAKE_S), NULL) != PLAIT_SUCCESS)
            PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: could not send rank %d (%s) its peer: %s", r->name, i,
                       r->peers[i], plait_last_error_get());
    }
    PLAIT_INFO(PLAIT_SUBSYS_BOOTSTRAP, "%s: all %d ranks registered", r->name, r->nranks);
}

static void *root_main(void *arg)
{
    struct bs_root *r = arg;
    struct bs_acceptor a;
    struct pollfd *pfds = NULL;
    int *pfd_rank = NULL;
    size_t pfds_cap = 0;

    if (acceptor_init(&a, r->listen_fd, r->secret, r->name, root_on_hello, r) != PLAIT_SUCCESS) {
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: %s", r->name, plait_last_error_get());
        goto out;
    }
    r->deadline = plait_deadline(r->timeout_s);
    while (!(r->nranks > 0 && r->registered == r->nranks)) {
        if (plait_deadline_passed(r->deadline)) {
            if (r->dup_rank >= 0)
                PLAIT_INFO(PLAIT_SUBSYS_BOOTSTRAP, "%s: no rank came for %.1f s after the duplicate rank %d; exiting",
                           r->name, r->timeout_s, r->dup_rank);
            else
                root_give_up(r, BS_STATUS_TIMEOUT);
            goto out;
        }
        /* After a duplicate, rank 0 has failed (which stops a root it started)
         * but ranks still to come must hear why at once, not wait out their
         * deadline against a closed port: keep telling them until the root's
         * own deadline. */
        if (__atomic_load_n(&r->ctl->stop, __ATOMIC_ACQUIRE) && !(r->dup_rank >= 0 && r->timeout_s > 0)) {
            if (r->dup_rank < 0)
                root_give_up(r, BS_STATUS_STOPPED);
            goto out;
        }
        size_t need = 1 + (size_t)a.max + (size_t)r->nranks;
        if (need > pfds_cap) {
            struct pollfd *np = realloc(pfds, need * sizeof(*pfds));
            int *nr = np ? realloc(pfd_rank, need * sizeof(*pfd_rank)) : NULL;
            if (np)
                pfds = np;
            if (!np || !nr) {
                PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: out of memory", r->name);
                goto out;
            }
            pfd_rank = nr;
            pfds_cap = need;
        }
        nfds_t nconn = acceptor_fill(&a, pfds, 1);
        nfds_t n = nconn;
        for (int i = 0; i < r->nranks; i++) {
            if (r->fds[i] < 0)
                continue;
            pfd_rank[n] = i;
            pfds[n++] = (struct pollfd){.fd = r->fds[i], .events = POLLIN};
        }
        if (poll(pfds, n, acceptor_poll_ms(&a, BS_SLICE_MS)) < 0 && errno != EINTR) {
            PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP, "%s: poll: %s", r->name, strerror(errno));
            goto out;
        }
        /* Registered ranks first: the handshakes below may change the table
         * (and even free it when the last registered rank leaves). */
        for (nfds_t k = nconn; k < n; k++) {
            int rank = pfd_rank[k];
            if (pfds[k].revents && rank < r->nranks && r->fds[rank] == pfds[k].fd)
                root_check_registered(r, rank);
        }
        acceptor_service(&a, pfds, nconn);
    }
    root_finish(r);

out:
    acceptor_fini(&a);
    root_free_table(r);
    close(r->listen_fd);
    free(pfds);
    free(pfd_rank);
    root_ctl_put(r->ctl);
    explicit_bzero(r, sizeof(*r));
    free(r);
    __atomic_sub_fetch(&roots_running, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Starts the root thread, which owns listen_fd from then on (also on failure
 * here, where it is closed). With ctl_out, the caller gets a reference to the
 * root's control block (to stop it; drop it with root_ctl_put). */
static plait_result_t root_spawn(int listen_fd, const union plait_sockaddr *addr, const uint8_t *secret,
                                 uint64_t nonce, double timeout_s, struct bs_root_ctl **ctl_out)
{
    char addr_str[PLAIT_SOCKADDR_STRLEN];
    pthread_attr_t attr;
    pthread_t thread;
    plait_result_t status = PLAIT_SUCCESS;

    struct bs_root *r = calloc(1, sizeof(*r));
    struct bs_root_ctl *ctl = calloc(1, sizeof(*ctl));
    if (!r || !ctl) {
        free(r);
        free(ctl);
        close(listen_fd);
        return plait_error(PLAIT_ERR_SYSTEM, "bootstrap root: out of memory");
    }
    ctl->refs = ctl_out ? 2 : 1;
    r->ctl = ctl;
    r->listen_fd = listen_fd;
    memcpy(r->secret, secret, PLAIT_SECRET_BYTES);
    r->nonce = nonce;
    r->timeout_s = timeout_s;
    r->dup_rank = -1;
    plait_sockaddr_str(addr, addr_str, sizeof(addr_str));
    snprintf(r->name, sizeof(r->name), "bootstrap root %s", addr_str);

    /* Detached: the root outlives plait_get_unique_id() and nobody joins it; it
     * frees everything itself when it is done. */
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        __atomic_add_fetch(&roots_running, 1, __ATOMIC_ACQ_REL);
        rc = pthread_create(&thread, &attr, root_main, r);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            __atomic_sub_fetch(&roots_running, 1, __ATOMIC_ACQ_REL);
    }
    if (rc != 0) {
        status = plait_error(PLAIT_ERR_SYSTEM, "bootstrap root on %s: pthread_create: %s", addr_str, strerror(rc));
        close(listen_fd);
        explicit_bzero(r, sizeof(*r));
        free(r);
        free(ctl);
        return status;
    }
    PLAIT_INFO(PLAIT_SUBSYS_BOOTSTRAP, "bootstrap root listening on %s", addr_str);
    if (ctl_out)
        *ctl_out = ctl;
    return PLAIT_SUCCESS;
}

int plait_bootstrap_roots_running(void)
{
    return __atomic_load_n(&roots_running, __ATOMIC_ACQUIRE);
}

/* ---------------------------------------------------------------- unique ids */

static void uid_store(const struct plait_uid *uid, plait_unique_id_t *id_out)
{
    memset(id_out, 0, sizeof(*id_out));
    memcpy(id_out->internal, uid, sizeof(*uid));
}

/* Text hashed into the secret of an unauthenticated launch. Public on purpose:
 * every rank must derive the same one without being told. */
static const char bs_default_secret_text[] = "plait unauthenticated bootstrap v1";

void plait_bootstrap_uid_from_addr(const union plait_sockaddr *root, const uint8_t *secret, plait_unique_id_t *id_out)
{
    struct plait_uid uid;

    if (!root || !id_out)
        return;
    memset(&uid, 0, sizeof(uid));
    uid.magic = PLAIT_UID_MAGIC;
    uid.version = PLAIT_UID_VERSION;
    uid.root = addr_canonical(root);
    if (secret) {
        memcpy(uid.secret, secret, PLAIT_SECRET_BYTES);
        uid.is_authenticated = 1;
    } else {
        plait_sha256(bs_default_secret_text, sizeof(bs_default_secret_text) - 1, uid.secret);
        uid.is_authenticated = 0;
    }
    /* Every rank builds this id on its own, so the nonce cannot be random: derive
     * it from what they share. Ids for different roots or secrets differ. */
    uint8_t material[PLAIT_SECRET_BYTES + BS_ADDR_BYTES], digest[32];
    memcpy(material, uid.secret, PLAIT_SECRET_BYTES);
    addr_put(material + PLAIT_SECRET_BYTES, &uid.root);
    plait_sha256(material, sizeof(material), digest);
    uid.nonce = get_u64(digest);
    explicit_bzero(material, sizeof(material));
    uid_store(&uid, id_out);
    explicit_bzero(&uid, sizeof(uid));
}

plait_result_t plait_bootstrap_create_root(const char *ifname_spec, const union plait_sockaddr *fixed_addr,
                                           double timeout_s, plait_unique_id_t *id_out)
{
    union plait_sockaddr addr;
    struct plait_uid uid;
    char ifname[64] = "";
    plait_result_t status;
    int listen_fd;

    if (!id_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_create_root: NULL id_out");
    if (fixed_addr) {
        addr = addr_canonical(fixed_addr);
    } else {
        status = plait_sock_find_ifaddr(ifname_spec, &addr, ifname, sizeof(ifname));
        if (status != PLAIT_SUCCESS)
            return plait_error_context(status, "bootstrap root");
    }
    status = plait_sock_listen(&addr, &listen_fd);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "bootstrap root");

    memset(&uid, 0, sizeof(uid));
    uid.magic = PLAIT_UID_MAGIC;
    uid.version = PLAIT_UID_VERSION;
    uid.root = addr_canonical(&addr);
    uid.is_authenticated = 1;
    status = plait_random_bytes(uid.secret, sizeof(uid.secret));
    while (status == PLAIT_SUCCESS && uid.nonce == 0)
        status = plait_random_bytes(&uid.nonce, sizeof(uid.nonce));
    if (status != PLAIT_SUCCESS) {
        close(listen_fd);
        return plait_error_context(status, "bootstrap root");
    }
    status = root_spawn(listen_fd, &uid.root, uid.secret, uid.nonce, timeout_s, NULL);
    if (status == PLAIT_SUCCESS)
        uid_store(&uid, id_out);
    explicit_bzero(&uid, sizeof(uid));
    return status;
}

/* ---------------------------------------------------------------- joining */

/* Connects to the root, registers, and returns the successor's address. For
 * nranks > 1 it also opens this rank's listener (before registering, so that it
 * exists by the time anyone learns its address). */
static plait_result_t bs_register(struct plait_bootstrap *bs, const struct plait_uid *uid,
                                  const struct plait_bootstrap_opts *opts, double deadline, int *listen_fd_out,
                                  union plait_sockaddr *succ_out)
{
    char root_str[PLAIT_SOCKADDR_STRLEN];
    union plait_sockaddr my_addr;
    uint8_t msg[BS_HELLO_BYTES];
    plait_result_t status;
    int root_fd = -1, listen_fd = -1;

    plait_sockaddr_str(&uid->root, root_str, sizeof(root_str));
    status = plait_sock_connect(&uid->root, deadline, bs->abort_flag, &root_fd);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "connecting to the bootstrap root %s", root_str);
    status = plait_sock_auth_client(root_fd, uid->secret, deadline, bs->abort_flag);
    if (status != PLAIT_SUCCESS) {
        plait_error_context(status, "bootstrap root %s", root_str);
        goto err_close_root;
    }

    memset(&my_addr, 0, sizeof(my_addr));
    if (bs->nranks > 1) {
        if (opts->ifname_spec && opts->ifname_spec[0]) {
            status = plait_sock_find_ifaddr(opts->ifname_spec, &my_addr, NULL, 0);
            if (status != PLAIT_SUCCESS)
                goto err_close_root;
        } else {
            /* Without PLAIT_SOCKET_IFNAME, listen on the address this host used to
             * reach the root: the one the routing table picked towards the rest
             * of the job, which a "first interface" guess may not be. */
            socklen_t len = sizeof(my_addr);
            if (getsockname(root_fd, &my_addr.sa, &len) != 0) {
                status = plait_error(PLAIT_ERR_SYSTEM, "getsockname: %s", strerror(errno));
                goto err_close_root;
            }
            my_addr = addr_canonical(&my_addr);
            if (my_addr.sa.sa_family == AF_INET)
                my_addr.sin.sin_port = 0;
            else
                my_addr.sin6.sin6_port = 0;
        }
        status = plait_sock_listen(&my_addr, &listen_fd);
        if (status != PLAIT_SUCCESS)
            goto err_close_root;
    }

    hello_put(msg, BS_HELLO_REGISTER, bs->rank, bs->nranks, bs->nonce, bs->nranks > 1 ? &my_addr : NULL);
    status = plait_sock_send_all(root_fd, msg, BS_HELLO_BYTES, deadline, bs->abort_flag);
    if (status == PLAIT_SUCCESS)
        status = plait_sock_recv_all(root_fd, msg, BS_REPLY_BYTES, deadline, bs->abort_flag);
    /* A duplicate's reply carries both registrations' addresses after it. */
    uint8_t dup[BS_DUP_BYTES];
    if (status == PLAIT_SUCCESS && get_u32(msg) == BS_REPLY_MAGIC && get_u32(msg + 4) == BS_STATUS_DUPLICATE_RANK)
        status = plait_sock_recv_all(root_fd, dup, sizeof(dup), deadline, bs->abort_flag);
    if (status != PLAIT_SUCCESS) {
        plait_error_context(status, "waiting for the other ranks at the bootstrap root %s", root_str);
        goto err_close_listen;
    }
    close(root_fd);
    root_fd = -1;

    uint32_t magic = get_u32(msg), reply_status = get_u32(msg + 4);
    uint32_t root_nranks = get_u32(msg + 8), detail = get_u32(msg + 12);
    if (magic != BS_REPLY_MAGIC) {
        status = plait_error(PLAIT_ERR_INTERNAL, "bootstrap root %s sent a malformed reply (another plait version?)",
                             root_str);
        goto err_close_listen;
    }
    if (reply_status == BS_STATUS_TIMEOUT) {
        status = plait_error(PLAIT_ERR_TIMEOUT,
                             "bootstrap root %s gave up waiting for the other ranks: %u of %u ranks registered "
                             "(its log names the missing ones)",
                             root_str, detail, root_nranks);
        goto err_close_listen;
    }
    if (reply_status == BS_STATUS_NRANKS_MISMATCH) {
        status = plait_error(PLAIT_ERR_INVALID_USAGE,
                             "bootstrap root %s rejected rank %d: the other ranks said nranks=%u, this one %d",
                             root_str, bs->rank, root_nranks, bs->nranks);
        goto err_close_listen;
    }
    if (reply_status == BS_STATUS_STOPPED) {
        status = plait_error(PLAIT_ERR_REMOTE, "bootstrap root %s: %s (%u of %u ranks had registered)", root_str,
                             bs_status_str(reply_status), detail, root_nranks);
        goto err_close_listen;
    }
    if (reply_status == BS_STATUS_DUPLICATE_RANK) {
        char first[PLAIT_SOCKADDR_STRLEN] = "?", second[PLAIT_SOCKADDR_STRLEN] = "?";
        union plait_sockaddr a;
        if (addr_get(dup, &a))
            plait_sockaddr_str(&a, first, sizeof(first));
        if (addr_get(dup + BS_ADDR_BYTES, &a))
            plait_sockaddr_str(&a, second, sizeof(second));
        status = plait_error(PLAIT_ERR_INVALID_USAGE,
                             "bootstrap root %s: rank %u of %u was registered twice, from %s and then from %s (a "
                             "forged registration, or two processes launched as one rank): the job cannot form "
                             "(this is rank %d)",
                             root_str, detail, root_nranks, first, second, bs->rank);
        goto err_close_listen;
    }
    if (reply_status != BS_STATUS_OK) {
        status = plait_error(PLAIT_ERR_INTERNAL, "bootstrap root %s rejected rank %d of %d: %s", root_str, bs->rank,
                             bs->nranks, bs_status_str(reply_status));
        goto err_close_listen;
    }
    if (root_nranks != (uint32_t)bs->nranks) {
        status = plait_error(PLAIT_ERR_INTERNAL, "bootstrap root %s answered for %u ranks, not %d", root_str,
                             root_nranks, bs->nranks);
        goto err_close_listen;
    }
    if (bs->nranks > 1 && !addr_get(msg + 16, succ_out)) {
        status = plait_error(PLAIT_ERR_INTERNAL, "bootstrap root %s sent an unusable address for rank %d", root_str,
                             (bs->rank + 1) % bs->nranks);
        goto err_close_listen;
    }
    *listen_fd_out = listen_fd;
    return PLAIT_SUCCESS;

err_close_listen:
    if (listen_fd >= 0)
        close(listen_fd);
err_close_root:
    if (root_fd >= 0)
        close(root_fd);
    return status;
}

static int ring_on_hello(void *ctx, struct bs_conn *c)
{
    struct plait_bootstrap *bs = ctx;
    struct bs_hello h;
    int prev = (bs->rank + bs->nranks - 1) % bs->nranks;

    hello_get(c->hello, &h);
    if (h.magic != BS_HELLO_MAGIC || h.type != BS_HELLO_RING || h.nonce != bs->nonce ||
        h.nranks != (uint32_t)bs->nranks) {
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP,
                   "bootstrap rank %d: rejected ring connection from %s: not for this communicator", bs->rank,
                   c->peer);
        return 0;
    }
    if (h.rank != (uint32_t)prev || bs->prev_fd >= 0) {
        PLAIT_WARN(PLAIT_SUBSYS_BOOTSTRAP,
                   "bootstrap rank %d: rejected ring connection from %s: it says rank %u, expected predecessor "
                   "rank %d%s",
                   bs->rank, c->peer, h.rank, prev, bs->prev_fd >= 0 ? " (already connected)" : "");
        return 0;
    }
    bs->prev_fd = c->fd;
    snprintf(bs->prev_str, sizeof(bs->prev_str), "%s", c->peer);
    return 1;
}

/* Connects to the successor and accepts the predecessor at the same time, each
 * through the handshake; impostors at our listener are dropped on the way. */
static plait_result_t bs_ring_connect(struct plait_bootstrap *bs, int listen_fd, const union plait_sockaddr *succ,
                                      double deadline)
{
    int next = (bs->rank + 1) % bs->nranks, prev = (bs->rank + bs->nranks - 1) % bs->nranks;
    struct bs_acceptor a;
    struct bs_conn client;
    struct pollfd pfds[1 + 1 + BS_MAX_PENDING];
    uint8_t hello[BS_HELLO_BYTES];
    char who[64];
    plait_result_t status;
    int next_fd = -1, is_client_done = 0;

    plait_sockaddr_str(succ, bs->next_str, sizeof(bs->next_str));
    snprintf(who, sizeof(who), "bootstrap rank %d", bs->rank);
    status = acceptor_init(&a, listen_fd, bs->secret, who, ring_on_hello, bs);
    if (status != PLAIT_SUCCESS)
        return status;
    /* The successor's listener has been up since before it registered, so the
     * kernel completes this connection at once; a refusal that lasts means the
     * successor is gone, and waiting out a long init deadline would only delay
     * the error. */
    double connect_deadline = plait_deadline(BS_HANDSHAKE_S);
    if (deadline > 0 && deadline < connect_deadline)
        connect_deadline = deadline;
    status = plait_sock_connect(succ, connect_deadline, bs->abort_flag, &next_fd);
    if (status != PLAIT_SUCCESS) {
        plait_error_context(status, "bootstrap rank %d: connecting to successor rank %d", bs->rank, next);
        goto err_fini;
    }
    hello_put(hello, BS_HELLO_RING, bs->rank, bs->nranks, bs->nonce, NULL);
    conn_start_client(&client, next_fd, bs->next_str, hello);

    while (!is_client_done || bs->prev_fd < 0) {
        if (plait_aborted(bs->abort_flag)) {
            status = plait_error(PLAIT_ERR_REMOTE, "bootstrap rank %d: aborted while forming the setup ring",
                                 bs->rank);
            goto err_close_next;
        }
        if (plait_deadline_passed(deadline)) {
            status = plait_error(PLAIT_ERR_TIMEOUT,
                                 "bootstrap rank %d: setup ring not formed within %.1f s (to successor rank %d at "
                                 "%s: %s; from predecessor rank %d: %s)",
                                 bs->rank, bs->timeout_s, next, bs->next_str,
                                 is_client_done ? "connected" : "handshake unfinished", prev,
                                 bs->prev_fd >= 0 ? "connected" : "not connected");
            goto err_close_next;
        }
        nfds_t nconn = acceptor_fill(&a, pfds + 1, bs->prev_fd < 0);
        pfds[0] = (struct pollfd){.fd = is_client_done ? -1 : next_fd, .events = conn_events(&client)};
        int ms = acceptor_poll_ms(&a, BS_SLICE_MS);
        if (deadline > 0 && (deadline - plait_now()) * 1e3 < ms)
            ms = (int)((deadline - plait_now()) * 1e3) + 1;
        if (poll(pfds, 1 + nconn, ms < 0 ? 0 : ms) < 0 && errno != EINTR) {
            status = plait_error(PLAIT_ERR_SYSTEM, "bootstrap rank %d: poll: %s", bs->rank, strerror(errno));
            goto err_close_next;
        }
        if (!is_client_done && pfds[0].revents) {
            enum bs_conn_progress p = conn_advance(&client, bs->secret);
            if (p == BS_CONN_FAILED) {
                status = plait_error(PLAIT_ERR_REMOTE, "bootstrap rank %d: successor rank %d at %s %s%s%s", bs->rank,
                                     next, bs->next_str, client.why, client.err ? ": " : "",
                                     client.err ? strerror(client.err) : "");
                goto err_close_next;
            }
            is_client_done = p == BS_CONN_FINISHED;
        }
        acceptor_service(&a, pfds + 1, nconn);
    }
    acceptor_fini(&a);
    bs->next_fd = next_fd;
    return PLAIT_SUCCESS;

err_close_next:
    close(next_fd);
    if (bs->prev_fd >= 0)
        close(bs->prev_fd);
    bs->prev_fd = -1;
err_fini:
    acceptor_fini(&a);
    explicit_bzero(&client, sizeof(client));
    return status;
}

void plait_bootstrap_warn_unauthenticated(const char *where)
{
    static int has_warned;
    if (__atomic_exchange_n(&has_warned, 1, __ATOMIC_ACQ_REL))
        return;
    plait_log_always("%s: the bootstrap is unauthenticated (neither PLAIT_SECRET nor PLAIT_SECRET_FILE is set): "
                     "anyone who can reach it can join or disrupt the job",
                     where);
}

plait_result_t plait_bootstrap_init(const plait_unique_id_t *id, int rank, int nranks,
                                    const struct plait_bootstrap_opts *opts, struct plait_bootstrap **bs_out)
{
    static const struct plait_bootstrap_opts default_opts = {0};
    struct bs_root_ctl *root_ctl = NULL;
    union plait_sockaddr succ;
    struct plait_uid uid;
    plait_result_t status;
    int listen_fd = -1;

    if (!id || !bs_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_init: NULL %s", id ? "bs_out" : "id");
    if (!opts)
        opts = &default_opts;
    if (nranks < 1 || nranks > BS_MAX_RANKS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_init: nranks %d is not in [1, %d]", nranks,
                           BS_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_init: rank %d is not in [0, %d)", rank,
                           nranks);
    memcpy(&uid, id->internal, sizeof(uid));
    if (uid.magic != PLAIT_UID_MAGIC || uid.version != PLAIT_UID_VERSION)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_bootstrap_init: not a plait unique id (magic %#x, version %u; expected %#x, %u)",
                           uid.magic, uid.version, PLAIT_UID_MAGIC, PLAIT_UID_VERSION);
    if (uid.root.sa.sa_family != AF_INET && uid.root.sa.sa_family != AF_INET6)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_init: the unique id holds no root address");

    if (!uid.is_authenticated) {
        char root_str[PLAIT_SOCKADDR_STRLEN], where[PLAIT_SOCKADDR_STRLEN + 32];
        plait_sockaddr_str(&uid.root, root_str, sizeof(root_str));
        snprintf(where, sizeof(where), "bootstrap root %s", root_str);
        plait_bootstrap_warn_unauthenticated(where);
    }

    double deadline = plait_deadline(opts->timeout_s);
    struct plait_bootstrap *bs = calloc(1, sizeof(*bs));
    if (!bs)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_bootstrap_init: out of memory");
    pthread_mutex_init(&bs->ring_lock, NULL);
    bs->rank = rank;
    bs->nranks = nranks;
    bs->next_fd = -1;
    bs->prev_fd = -1;
    bs->heard_culprit = -1;
    bs->heard_from = -1;
    bs->nonce = uid.nonce;
    bs->is_authenticated = uid.is_authenticated;
    bs->timeout_s = opts->timeout_s;
    bs->abort_flag = opts->abort_flag;
    memcpy(bs->secret, uid.secret, PLAIT_SECRET_BYTES);

    /* A communicator of one whose root would be our own needs no root at all. */
    if (nranks == 1 && opts->start_root)
        goto done;
    if (opts->start_root && rank == 0) {
        union plait_sockaddr root_addr = uid.root;
        int root_fd;
        status = plait_sock_listen(&root_addr, &root_fd);
        if (status == PLAIT_SUCCESS)
            status = root_spawn(root_fd, &root_addr, uid.secret, uid.nonce, opts->timeout_s, &root_ctl);
        if (status != PLAIT_SUCCESS) {
            plait_error_context(status, "bootstrap rank 0: starting the root");
            goto err_free;
        }
    }
    status = bs_register(bs, &uid, opts, deadline, &listen_fd, &succ);
    if (status != PLAIT_SUCCESS) {
        plait_error_context(status, "bootstrap rank %d of %d", rank, nranks);
        goto err_free;
    }
    if (nranks == 1)
        goto done;
    status = bs_ring_connect(bs, listen_fd, &succ, deadline);
    close(listen_fd);
    if (status != PLAIT_SUCCESS)
        goto err_free;
    PLAIT_INFO(PLAIT_SUBSYS_BOOTSTRAP, "bootstrap rank %d of %d: setup ring formed (next %s, prev %s)", rank, nranks,
               bs->next_str, bs->prev_str);

done:
    /* By now the root has answered everyone and is exiting on its own. */
    root_ctl_put(root_ctl);
    explicit_bzero(&uid, sizeof(uid));
    *bs_out = bs;
    return PLAIT_SUCCESS;

err_free:
    if (root_ctl) {
        __atomic_store_n(&root_ctl->stop, 1, __ATOMIC_RELEASE);
        root_ctl_put(root_ctl);
    }
    explicit_bzero(&uid, sizeof(uid));
    pthread_mutex_destroy(&bs->ring_lock);
    explicit_bzero(bs, sizeof(*bs));
    free(bs);
    return status;
}

/* ---------------------------------------------------------------- ring collectives */

/* Sends a notice whole: a part of one would break the connection's framing.
 * wait_s: how long a full socket may make it wait (a ring step's bytes the
 * neighbour has not read yet); past that, or on a connection that failed,
 * the notice is dropped. Touches no last-error string (the caller's error
 * may be built already). */
static void notice_send(int fd, int culprit, double wait_s)
{
    uint8_t msg[BS_STEP_BYTES];
    memset(msg, 0, sizeof(msg));
    put_u32(msg, BS_NOTICE_MAGIC);
    put_u32(msg + 4, (uint32_t)culprit);
    const double until = plait_deadline(wait_s), until_part = plait_deadline(wait_s + 10);
    size_t off = 0;
    while (fd >= 0 && off < sizeof(msg)) {
        ssize_t n = send(fd, msg + off, sizeof(msg) - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return; /* a dead neighbour's connection just fails */
        /* Once a part is sent the rest must follow, for a while longer (a
         * stalled neighbour still ends it: the ring is broken then anyway). */
        if (plait_deadline_passed(off == 0 ? until : until_part))
            return;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        (void)poll(&pfd, 1, 10);
    }
}

/* With ring_lock held: sends the notice that waits for next_fd, if any. */
static void notice_flush_locked(struct plait_bootstrap *bs)
{
    const int pending = __atomic_exchange_n(&bs->notice_pending, 0, __ATOMIC_SEQ_CST);
    if (pending > 0)
        notice_send(bs->next_fd, pending - 1, 1.0);
}

/* Releases ring_lock; a notice that another thread left pending meanwhile is
 * sent first, and one left after the release by a thread whose trylock
 * failed is sent here too (whoever holds the lock last sends it). */
static void ring_unlock(struct plait_bootstrap *bs)
{
    for (;;) {
        notice_flush_locked(bs);
        pthread_mutex_unlock(&bs->ring_lock);
        if (!__atomic_load_n(&bs->notice_pending, __ATOMIC_SEQ_CST) || pthread_mutex_trylock(&bs->ring_lock) != 0)
            return;
    }
}

/* n-1 steps around the ring: at step s a rank sends block (rank - s) to its
 * successor and receives block (rank - s - 1) from its predecessor, sending and
 * receiving at once so that blocks larger than the socket buffers cannot
 * deadlock the ring. Each step starts with a header naming the operation, its
 * sequence number, the step and the size, so that ranks calling different
 * operations or sizes fail with a message instead of misreading bytes. A
 * barrier is the same walk with headers only: after n-1 steps every rank has
 * heard, through the chain, from every other rank's entry. */
static plait_result_t bs_ring_op(struct plait_bootstrap *bs, enum bs_op op, uint8_t *data, size_t size)
{
    const char *op_name = op == BS_OP_ALLGATHER ? "allgather" : "barrier";
    int n = bs->nranks, prev = (bs->rank + n - 1) % n;
    plait_result_t status;

    /* One walk at a time, and no notice read or sent in its middle. */
    pthread_mutex_lock(&bs->ring_lock);
    double deadline = plait_deadline(bs->timeout_s);
    if (bs->is_broken) {
        ring_unlock(bs);
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "bootstrap %s on rank %d: the setup ring is unusable after an earlier failure", op_name,
                           bs->rank);
    }
    uint32_t seq = ++bs->seq;
    for (int step = 0; step < n - 1; step++) {
        uint8_t out[BS_STEP_BYTES], in[BS_STEP_BYTES];
        /* A death this rank reported meanwhile (another thread): the notice
         * goes between two steps, where the successor's walk reads it, and
         * this walk ends. */
        const int pending = __atomic_exchange_n(&bs->notice_pending, 0, __ATOMIC_SEQ_CST);
        if (pending > 0) {
            notice_send(bs->next_fd, pending - 1, 1.0);
            status = plait_error(PLAIT_ERR_REMOTE, "rank %d died (as this rank found)", pending - 1);
            goto err_broken;
        }
        put_u32(out, BS_STEP_MAGIC);
        put_u32(out + 4, (uint32_t)op);
        put_u32(out + 8, seq);
        put_u32(out + 12, (uint32_t)step);
        put_u64(out + 16, (uint64_t)size);
        status = plait_sock_sendrecv(bs->next_fd, out, sizeof(out), bs->prev_fd, in, sizeof(in), deadline,
                                     bs->abort_flag);
        if (status != PLAIT_SUCCESS)
            goto err_broken;
        uint32_t magic = get_u32(in), in_op = get_u32(in + 4), in_seq = get_u32(in + 8), in_step = get_u32(in + 12);
        uint64_t in_size = get_u64(in + 16);
        if (magic == BS_NOTICE_MAGIC) {
            status = plait_error(PLAIT_ERR_REMOTE, "rank %u died (as predecessor rank %d (%s) reported)",
                                 get_u32(in + 4), prev, bs->prev_str);
            goto err_broken;
        }
        if (magic != BS_STEP_MAGIC || in_step != (uint32_t)step) {
            status = plait_error(PLAIT_ERR_INTERNAL, "predecessor rank %d (%s) broke the protocol", prev,
                                 bs->prev_str);
            goto err_broken;
        }
        if (in_op != (uint32_t)op || in_seq != seq || in_size != (uint64_t)size) {
            status = plait_error(PLAIT_ERR_INVALID_USAGE,
                                 "ranks disagree: this rank %d is in %s #%u of %zu bytes per rank, predecessor rank "
                                 "%d (%s) in %s #%u of %llu bytes",
                                 bs->rank, op_name, seq, size, prev, bs->prev_str,
                                 in_op == BS_OP_ALLGATHER ? "allgather" : in_op == BS_OP_BARRIER ? "barrier" : "?",
                                 in_seq, (unsigned long long)in_size);
            goto err_broken;
        }
        if (op == BS_OP_ALLGATHER && size > 0) {
            size_t send_idx = (size_t)((bs->rank - step + n) % n);
            size_t recv_idx = (size_t)((bs->rank - step - 1 + 2 * n) % n);
            status = plait_sock_sendrecv(bs->next_fd, data + send_idx * size, size, bs->prev_fd,
                                         data + recv_idx * size, size, deadline, bs->abort_flag);
            if (status != PLAIT_SUCCESS)
                goto err_broken;
        }
    }
    ring_unlock(bs);
    return PLAIT_SUCCESS;

err_broken:
    bs->is_broken = 1;
    ring_unlock(bs);
    return plait_error_context(status, "bootstrap %s #%u on rank %d of %d (next %s, prev %s)", op_name, seq, bs->rank,
                               n, bs->next_str, bs->prev_str);
}

plait_result_t plait_bootstrap_allgather(struct plait_bootstrap *bs, void *data, size_t size)
{
    size_t total;

    if (!bs)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_allgather: NULL bootstrap");
    if (!data && size > 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_allgather: NULL data");
    if (plait_mul_overflows(size, (size_t)bs->nranks, &total))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_allgather: %zu bytes x %d ranks overflows",
                           size, bs->nranks);
    if (bs->nranks == 1)
        return PLAIT_SUCCESS;
    return bs_ring_op(bs, BS_OP_ALLGATHER, data, size);
}

plait_result_t plait_bootstrap_barrier(struct plait_bootstrap *bs)
{
    if (!bs)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_bootstrap_barrier: NULL bootstrap");
    if (bs->nranks == 1)
        return PLAIT_SUCCESS;
    return bs_ring_op(bs, BS_OP_BARRIER, NULL, 0);
}

const uint8_t *plait_bootstrap_secret(const struct plait_bootstrap *bs)
{
    return bs ? bs->secret : NULL;
}

int plait_bootstrap_is_authenticated(const struct plait_bootstrap *bs)
{
    return bs ? (int)bs->is_authenticated : 0;
}

int plait_bootstrap_next_fd(const struct plait_bootstrap *bs)
{
    return bs ? bs->next_fd : -1;
}

int plait_bootstrap_prev_fd(const struct plait_bootstrap *bs)
{
    return bs ? bs->prev_fd : -1;
}

/* ---------------------------------------------------------------- death notices
 *
 * The setup ring stays connected for the communicator's life, so it tells the
 * ranks who failed first, whatever carries their data (shared memory, sockets,
 * any net provider). A rank whose operation fails because a peer died sends
 * one notice naming the dead rank on both ring connections, before it returns
 * the error (and so before it can exit and close them). A rank that reads a
 * notice fails its own wait naming that rank, and sends its own notice on in
 * turn, so the news walks the ring both ways past the hole the dead rank left.
 *
 * The ring also tells a death from a report: TCP delivers a connection's bytes
 * before its end, so a neighbour's connection that ends without a notice
 * first belongs to a process that died (or left without reporting any
 * failure), and one that ends after a notice to a survivor that merely saw
 * someone else die. */

static void notice_read(struct plait_bootstrap *bs, int link, int fd, int from)
{
    uint8_t msg[BS_STEP_BYTES];
    while (fd >= 0 && !bs->link_closed[link]) {
        ssize_t n = recv(fd, msg, sizeof(msg), MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            bs->link_closed[link] = 1; /* EOF, or reset: the neighbour's end is gone */
            return;
        }
        /* Nothing yet, part of a notice, or a ring step (which only a ring
         * operation reads). */
        if (n < (ssize_t)sizeof(msg) || get_u32(msg) != BS_NOTICE_MAGIC)
            return;
        if (recv(fd, msg, sizeof(msg), MSG_DONTWAIT) != (ssize_t)sizeof(msg))
            return;
        bs->link_noticed[link] = 1;
        const uint32_t culprit = get_u32(msg + 4);
        /* Checked: a notice naming no rank, the sender or this rank is ignored. */
        if (bs->heard_culprit < 0 && culprit < (uint32_t)bs->nranks && (int)culprit != bs->rank &&
            (int)culprit != from) {
            bs->heard_culprit = (int)culprit;
            bs->heard_from = from;
        }
    }
}

void plait_bootstrap_notify_death(struct plait_bootstrap *bs, int culprit)
{
    if (!bs || bs->nranks < 2 || culprit < 0 || culprit >= bs->nranks || culprit == bs->rank)
        return;
    if (__atomic_exchange_n(&bs->has_notified, 1, __ATOMIC_ACQ_REL))
        return;
    /* Backwards, on prev_fd, only notices travel: at once. Forwards, on
     * next_fd, a ring step may be half sent: the notice waits for the lock,
     * never blocking on it (this thread may hold it itself, or a walk on
     * another thread may wait long); its holder sends it (ring_unlock). */
    notice_send(bs->prev_fd, culprit, 0);
    __atomic_store_n(&bs->notice_pending, culprit + 1, __ATOMIC_SEQ_CST);
    if (pthread_mutex_trylock(&bs->ring_lock) == 0)
        ring_unlock(bs);
}

int plait_bootstrap_poll_notices(struct plait_bootstrap *bs, int *culprit_out, int *from_out)
{
    if (!bs || bs->nranks < 2)
        return 0;
    const int n = bs->nranks;
    notice_read(bs, 0, bs->next_fd, (bs->rank + 1) % n);
    /* prev_fd belongs to a ring walk while one runs: skip it this time. */
    if (pthread_mutex_trylock(&bs->ring_lock) == 0) {
        notice_read(bs, 1, bs->prev_fd, (bs->rank + n - 1) % n);
        ring_unlock(bs);
    }
    if (bs->heard_culprit < 0)
        return 0;
    *culprit_out = bs->heard_culprit;
    *from_out = bs->heard_from;
    return 1;
}

int plait_bootstrap_neighbour_died(const struct plait_bootstrap *bs, int rank)
{
    if (!bs || bs->nranks < 2)
        return 0;
    const int n = bs->nranks;
    int died = 0;
    if (rank == (bs->rank + 1) % n)
        died |= bs->link_closed[0] && !bs->link_noticed[0];
    if (rank == (bs->rank + n - 1) % n)
        died |= bs->link_closed[1] && !bs->link_noticed[1];
    return died;
}

void plait_bootstrap_close(struct plait_bootstrap *bs)
{
    if (!bs)
        return;
    if (bs->next_fd >= 0)
        close(bs->next_fd);
    if (bs->prev_fd >= 0)
        close(bs->prev_fd);
    pthread_mutex_destroy(&bs->ring_lock);
    explicit_bzero(bs, sizeof(*bs));
    free(bs);
}
