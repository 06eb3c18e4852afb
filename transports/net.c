/* The net transport: FIFO slots between hosts through a net provider
 * (transports/net/provider.h; today the Socket provider, plait_net_socket,
 * the default of PLAIT_NET_PROVIDER), for every pair of ranks on different
 * hosts (every pair of distinct ranks with PLAIT_TRANSPORT=socket): the only
 * transport between hosts.
 *
 * The executor fills local staging send slots and drains local receive slots
 * (the FIFO memory is this process's); progress() moves
 * them: each committed send slot becomes one isend() on the connection's send
 * comm, in order, up to the FIFO depth (and the provider's request limit) in
 * flight; the credit (tx_head) advances as they complete, in order. Each free
 * receive slot has one irecv() posted on the recv comm, in order; when test()
 * says it is done, the slot's size is stored and then rx_tail (release).
 * One thread at a time moves a connection (a busy flag: the others leave it),
 * as the provider wants one thread per comm at a time.
 *
 * Connections: init (collective) starts the provider, takes device 0 (the
 * first device the provider lists: one device per rank for now), listens on
 * it and allgathers every rank's listen handle, port speed and latency. A
 * connection (peer, class) is a send comm this rank dials to the peer's
 * handle plus a recv comm the peer dialed to ours. Since one listen comm takes
 * every peer's connections, the first message on each send comm is a hello
 * {magic, rank, class, nslots, slot_bytes}; accept() and progress() post a
 * receive for it on every comm the listen comm yields and check it (a rank
 * other than this one of the communicator, a class in range, a pair this
 * transport joins and the core wants, not a second one for a connection, the
 * same FIFO shape). A comm that fails the check is closed with a WARN naming
 * what it claimed (the provider's own errors name its address). A valid hello
 * for a connection this rank has not asked for yet starts this rank's dial
 * back, so that both ends always dial (PLAIT_TP_BOTH_NOW changes nothing) and
 * an eager send completes while its peer is busy elsewhere: progress(ctx,
 * NULL) steps every handshake at most every HS_PERIOD (try-locked).
 *
 * Failures: a provider error on a send fails the connection with a message
 * naming the peer and the provider's message (sticky: every later progress
 * says it again); a PLAIT_ERR_REMOTE one also marks the peer gone. A
 * PLAIT_ERR_REMOTE on the receive side (the peer closed or reset its side)
 * marks the peer gone and stops receiving: what arrived before is still
 * consumed, and only a wait for more becomes an error (the core names the
 * rank that failed first). A PLAIT_ERR_INTERNAL on the receive side (what
 * came broke the provider's protocol), or a message of a size no slot has,
 * fails the connection at once with PLAIT_ERR_REMOTE ("a malformed message
 * from" the peer, sticky), without calling the peer gone: it may be alive.
 * Nothing the provider returns is trusted: sizes are checked against the
 * slot. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "transports/net.h"
#include "transports/net/provider.h"
#include "transports/transport.h"

#define HELLO_MAGIC 0x504c4e48u /* "PLNH" */
#define HELLO_VERSION 1u
/* An incoming comm whose hello has not come within this long is closed. */
#define HS_IN_LIMIT_S 30.0
/* progress(ctx, NULL) steps the handshakes at most this often. */
#define HS_PERIOD 100e-6
/* The device every rank uses (the first the provider lists). */
#define NET_DEV 0
/* Request slots per direction we keep: the FIFO depth is at most this. */
#define NET_MAX_SLOTS 64

struct net_hello {
    uint32_t magic;
    uint32_t version;
    int32_t rank;
    int32_t cls;
    uint32_t nslots;
    uint32_t pad;
    uint64_t slot_bytes;
};

/* What init allgathers per rank. */
struct net_rank_info {
    uint8_t handle[PLAIT_NET_HANDLE_BYTES];
    int32_t has;        /* 1: this rank listens (it has net peers) */
    int32_t speed_mbps;
    float latency_us;
    uint32_t ptr_support; /* the device's enum plait_net_ptr bits */
};

struct net_state;

struct net_conn {
    struct plait_conn conn;
    struct net_state *st;
    int peer, cls;
    char peer_str[160];
    /* set-up (under hs_lock until published) */
    uint8_t handle[PLAIT_NET_HANDLE_BYTES]; /* our copy of the peer's: the provider keeps its progress there */
    int dialing;
    void *send_comm;
    void *recv_comm;
    /* registrations (reg_mr: the provider may need them, as verbs does) */
    void *tx_mh;             /* tx_mem on send_comm */
    void *hello_mh;          /* hello on send_comm */
    void *rx_mh;             /* rx_mem on recv_comm */
    struct net_hello hello;  /* ours, sent first on send_comm */
    void *hello_req;         /* its request until done */
    int hello_sent;          /* the hello is posted: the send comm carries data next */
    int hello_done;          /* its request finished (atomic: is_flushed reads it from any thread) */
    int busy;                /* a thread is in conn_progress (atomic) */
    plait_result_t failed;   /* the dial failed: accept() says so */
    char failed_msg[512];
    int published;
    /* staging */
    char *tx_mem, *rx_mem;
    uint32_t *tx_sizes, *rx_sizes;
    uint64_t tx_tail;   /* committed by the executor */
    uint64_t tx_head;   /* sends completed (credit) */
    uint64_t tx_issued; /* sends given to the provider */
    uint64_t rx_tail;   /* receives completed */
    uint64_t rx_head;   /* drained by the executor */
    uint64_t rx_posted; /* receives given to the provider */
    void *tx_req[NET_MAX_SLOTS];
    void *rx_req[NET_MAX_SLOTS];
    int rx_dead;        /* the peer's side is gone: nothing more is received */
    plait_result_t err; /* sticky failure */
    char err_msg[768];
};

/* A comm the listen comm gave us, waiting for its hello. */
struct net_incoming {
    void *recv_comm;
    void *req;
    void *mh;               /* hello's registration on recv_comm */
    struct net_hello hello; /* the provider writes here until req is done: never moved */
    double deadline;
};

struct net_state {
    const struct plait_tp_env *env;
    const struct plait_net_provider *prov;
    void *pctx;
    void *listen_comm;
    struct plait_net_properties props;
    struct net_rank_info *infos; /* [nranks] */
    int inflight;               /* requests per direction in flight at most */
    struct net_conn **by;       /* [peer * ncls + cls] */
    struct net_conn **entries;  /* every entry made, nentries (<= cap) */
    int nentries;
    struct net_conn **conns;    /* published connections */
    int nconns;                 /* release-stored: progress() reads it without the lock */
    int cap;
    struct net_incoming **in;   /* [in_cap], each allocated on its own (a posted receive points into it) */
    int nin, in_cap;
    int ndropped;
    char dropped[400];
    pthread_mutex_t hs_lock;
    double hs_next;
};

/* ---------------------------------------------------------------- env -> ctx (for query) */

/* query() is a pure function of the environment, yet its speed and latency
 * come from init's allgather: every context is listed with its env here. */
struct net_reg {
    const struct plait_tp_env *env;
    struct net_state *st;
    struct net_reg *next;
};
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct net_reg *reg_head;

static void reg_add(struct net_state *st)
{
    struct net_reg *r = calloc(1, sizeof(*r));
    if (!r)
        return; /* query then says "unknown" */
    r->env = st->env;
    r->st = st;
    pthread_mutex_lock(&reg_lock);
    r->next = reg_head;
    reg_head = r;
    pthread_mutex_unlock(&reg_lock);
}

static void reg_remove(struct net_state *st)
{
    pthread_mutex_lock(&reg_lock);
    for (struct net_reg **pp = &reg_head; *pp; pp = &(*pp)->next)
        if ((*pp)->st == st) {
            struct net_reg *r = *pp;
            *pp = r->next;
            free(r);
            break;
        }
    pthread_mutex_unlock(&reg_lock);
}

/* ---------------------------------------------------------------- choice */

static int net_can_join(const struct plait_tp_env *env, int a, int b)
{
    if (a == b)
        return 0;
    return env->ranks[a].host != env->ranks[b].host || env->force_net ? 15 : 0;
}

static void net_query(const struct plait_tp_env *env, int a, int b, struct plait_tp_info *info)
{
    memset(info, 0, sizeof(*info));
    info->link = PLAIT_LC_NET;
    info->sc = PLAIT_SC_NONE;
    info->host_mem_shared = 0;
    pthread_mutex_lock(&reg_lock);
    for (struct net_reg *r = reg_head; r; r = r->next) {
        if (r->env != env)
            continue;
        const struct net_rank_info *ia = &r->st->infos[a], *ib = &r->st->infos[b];
        if (a >= 0 && b >= 0 && a < env->nranks && b < env->nranks && ia->has && ib->has) {
            const int mbps = ia->speed_mbps < ib->speed_mbps ? ia->speed_mbps : ib->speed_mbps;
            const float lat = ia->latency_us > ib->latency_us ? ia->latency_us : ib->latency_us;
            info->bw_GBps = mbps > 0 ? mbps / 8000.0 : 0;
            info->lat_us = lat > 0 ? lat : 0;
            /* what both ends' devices take (the enums have the same bits) */
            const uint32_t both = ia->ptr_support & ib->ptr_support;
            info->device_mem = (both & PLAIT_NET_PTR_HOST ? PLAIT_TP_MEM_HOST : 0) |
                               (both & PLAIT_NET_PTR_CUDA ? PLAIT_TP_MEM_CUDA : 0) |
                               (both & PLAIT_NET_PTR_DMABUF ? PLAIT_TP_MEM_DMABUF : 0);
        }
        break;
    }
    pthread_mutex_unlock(&reg_lock);
}

static int joins(const struct plait_tp_env *env, int a, int b)
{
    const int t = plait_tp_choose(env, a, b);
    return t >= 0 && plait_transports[t] == &plait_transport_net;
}

/* ---------------------------------------------------------------- connections */

/* Registers host memory on a comm; the error names what it was for. */
static plait_result_t mr_reg(struct net_state *st, void *comm, void *data, size_t size, void **mh, const char *what)
{
    plait_result_t status = st->prov->reg_mr(comm, data, size, PLAIT_NET_PTR_HOST, mh);
    if (status)
        return plait_error_context(status, "net: registering %zu bytes of %s with provider %s", size, what,
                                   st->prov->name);
    return PLAIT_SUCCESS;
}

static uint32_t env_slots(const struct net_state *st)
{
    return st->env->nslots;
}

/* Closes a comm the listen comm gave us (its hello's registration first). */
static void incoming_close(struct net_state *st, struct net_incoming *in)
{
    if (in->mh)
        st->prov->dereg_mr(in->recv_comm, in->mh);
    in->mh = NULL;
    st->prov->close_recv(in->recv_comm);
}

static void conn_free(struct net_state *st, struct net_conn *c)
{
    if (!c)
        return;
    if (c->send_comm) {
        if (c->tx_mh)
            st->prov->dereg_mr(c->send_comm, c->tx_mh);
        if (c->hello_mh)
            st->prov->dereg_mr(c->send_comm, c->hello_mh);
        st->prov->close_send(c->send_comm);
    }
    if (c->recv_comm) {
        if (c->rx_mh)
            st->prov->dereg_mr(c->recv_comm, c->rx_mh);
        st->prov->close_recv(c->recv_comm);
    }
    free(c->tx_mem);
    free(c->rx_mem);
    free(c->tx_sizes);
    free(c->rx_sizes);
    free(c);
}

/* The entry of (peer, cls), made when missing. */
static plait_result_t entry_get(struct net_state *st, int peer, int cls, struct net_conn **out)
{
    const struct plait_tp_env *env = st->env;
    const int i = peer * env->ncls + cls;
    if (st->by[i]) {
        *out = st->by[i];
        return PLAIT_SUCCESS;
    }
    if (st->nentries >= st->cap)
        return plait_error(PLAIT_ERR_INTERNAL, "net: more connections than rank %d may need", env->rank);
    struct net_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return plait_error(PLAIT_ERR_SYSTEM, "net: out of memory");
    const size_t nslots = env->nslots, slot = env->slot_bytes;
    c->tx_mem = malloc(nslots * slot);
    c->rx_mem = malloc(nslots * slot);
    c->tx_sizes = calloc(nslots, sizeof(uint32_t));
    c->rx_sizes = calloc(nslots, sizeof(uint32_t));
    if (!c->tx_mem || !c->rx_mem || !c->tx_sizes || !c->rx_sizes) {
        conn_free(st, c);
        return plait_error(PLAIT_ERR_SYSTEM, "net: out of memory for staging slots");
    }
    c->st = st;
    c->peer = peer;
    c->cls = cls;
    env->peer_str(env->core, peer, c->peer_str, sizeof(c->peer_str));
    c->hello = (struct net_hello){HELLO_MAGIC, HELLO_VERSION, env->rank, cls, env->nslots, 0, env->slot_bytes};
    struct plait_conn *pc = &c->conn;
    pc->tp = &plait_transport_net;
    pc->ctx = st;
    pc->peer = peer;
    pc->cls = cls;
    pc->needs_progress = 1;
    pc->nslots = (uint32_t)nslots;
    pc->slot_bytes = slot;
    pc->tx_slots = c->tx_mem;
    pc->tx_sizes = c->tx_sizes;
    pc->tx_tail = &c->tx_tail;
    pc->tx_head = &c->tx_head;
    pc->rx_slots = c->rx_mem;
    pc->rx_sizes = c->rx_sizes;
    pc->rx_tail = &c->rx_tail;
    pc->rx_head = &c->rx_head;
    st->entries[st->nentries++] = c;
    st->by[i] = c;
    *out = c;
    return PLAIT_SUCCESS;
}

/* Starts this rank's dial of the entry's peer (once). */
static void dial_start(struct net_state *st, struct net_conn *c)
{
    if (c->dialing)
        return;
    c->dialing = 1;
    const struct net_rank_info *pi = &st->infos[c->peer];
    if (!pi->has) {
        c->failed = plait_error(PLAIT_ERR_INTERNAL, "net: %s does not listen for net connections", c->peer_str);
        snprintf(c->failed_msg, sizeof(c->failed_msg), "%s", plait_last_error_get());
        return;
    }
    memcpy(c->handle, pi->handle, sizeof(c->handle));
}

/* One step of the entry's dial; posts the hello once the send comm exists. */
static void dial_step(struct net_state *st, struct net_conn *c)
{
    if (!c->dialing || c->failed || c->hello_sent)
        return;
    plait_result_t status = PLAIT_SUCCESS;
    if (!c->send_comm) {
        void *sc = NULL;
        status = st->prov->connect(st->pctx, NET_DEV, c->handle, &sc);
        if (!status && sc) {
            c->send_comm = sc;
            status = mr_reg(st, sc, c->tx_mem, (size_t)env_slots(st) * st->env->slot_bytes, &c->tx_mh, "send slots");
            if (!status)
                status = mr_reg(st, sc, &c->hello, sizeof(c->hello), &c->hello_mh, "the hello");
        }
    }
    if (!status && c->send_comm && !c->hello_req) {
        void *req = NULL;
        status = st->prov->isend(c->send_comm, &c->hello, sizeof(c->hello), 0, c->hello_mh, &req);
        if (!status && req) {
            c->hello_req = req;
            c->hello_sent = 1;
        } /* NULL: try again next step */
    }
    if (status) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", plait_last_error_get());
        c->failed = plait_error(status, "net: connecting to %s on class %d: %s", c->peer_str, c->cls, msg);
        snprintf(c->failed_msg, sizeof(c->failed_msg), "%s", plait_last_error_get());
    }
}

static void drop_in(struct net_state *st, const char *why)
{
    snprintf(st->dropped, sizeof(st->dropped), "%s", why);
    if (st->ndropped < 10 || st->ndropped % 1000 == 0)
        PLAIT_WARN(PLAIT_SUBSYS_TRANSPORT, "net: rank %d closed a connection that came in on %s: %s (%d so far)",
                   st->env->rank, st->props.name, why, st->ndropped + 1);
    st->ndropped++;
}

/* What is wrong with a hello (into why), 0 when it names a connection this
 * rank expects and has no recv comm for yet. */
static int hello_problem(const struct net_state *st, const struct net_hello *h, size_t size, char *why, size_t len)
{
    const struct plait_tp_env *env = st->env;
    const int me = env->rank;
    if (size != sizeof(*h))
        snprintf(why, len, "a first message of %zu bytes, not a hello (%zu bytes)", size, sizeof(*h));
    else if (h->magic != HELLO_MAGIC || h->version != HELLO_VERSION)
        snprintf(why, len, "not a hello (magic 0x%08x version %u; a hello has 0x%08x version %u)", h->magic,
                 h->version, HELLO_MAGIC, HELLO_VERSION);
    else if (h->rank < 0 || h->rank >= env->nranks || h->rank == me)
        snprintf(why, len, "a hello from rank %d, not another rank of the %d of the communicator (this is rank %d)",
                 h->rank, env->nranks, me);
    else if (h->cls < 0 || h->cls >= env->ncls)
        snprintf(why, len, "a hello from rank %d for connection class %d of %d", h->rank, h->cls, env->ncls);
    else if (!joins(env, me, h->rank))
        snprintf(why, len, "a hello from rank %d, which does not use the net transport with rank %d", h->rank, me);
    else if (!env->wanted(env->core, me, h->rank, h->cls))
        snprintf(why, len, "a hello from rank %d for connection class %d, which rank %d does not use", h->rank,
                 h->cls, me);
    else if (h->nslots != env->nslots || h->slot_bytes != env->slot_bytes)
        snprintf(why, len, "a hello from rank %d with %u slots of %llu bytes where this rank has %u of %zu", h->rank,
                 h->nslots, (unsigned long long)h->slot_bytes, env->nslots, env->slot_bytes);
    else if (st->by[h->rank * env->ncls + h->cls] && st->by[h->rank * env->ncls + h->cls]->recv_comm)
        snprintf(why, len, "a second hello from rank %d for connection class %d", h->rank, h->cls);
    else
        return 0;
    return 1;
}

/* A hello that came: the comm joins its entry (made when missing, and then
 * this rank dials back), or is closed. */
static plait_result_t hello_done(struct net_state *st, struct net_incoming *in, size_t size)
{
    char why[300];
    if (hello_problem(st, &in->hello, size, why, sizeof(why))) {
        incoming_close(st, in);
        drop_in(st, why);
        return PLAIT_SUCCESS;
    }
    struct net_conn *c = NULL;
    plait_result_t status = entry_get(st, in->hello.rank, in->hello.cls, &c);
    if (status) {
        incoming_close(st, in);
        return status;
    }
    void *rx_mh = NULL;
    status = mr_reg(st, in->recv_comm, c->rx_mem, (size_t)env_slots(st) * st->env->slot_bytes, &rx_mh,
                    "receive slots");
    if (status) {
        /* The connection's own failure: its accept() reports it at once
         * (naming the peer), rather than waiting for a comm that has gone. */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", plait_last_error_get());
        incoming_close(st, in);
        if (!c->failed) {
            c->failed = plait_error(status, "net: accepting %s's connection on class %d: %s", c->peer_str, c->cls,
                                    msg);
            snprintf(c->failed_msg, sizeof(c->failed_msg), "%s", plait_last_error_get());
        }
        return PLAIT_SUCCESS;
    }
    st->prov->dereg_mr(in->recv_comm, in->mh);
    in->mh = NULL;
    c->recv_comm = in->recv_comm;
    c->rx_mh = rx_mh;
    dial_start(st, c);
    return PLAIT_SUCCESS;
}

/* Moves every handshake of the context (hs_lock held): takes new comms from
 * the listen comm, steps their hellos and this rank's dials, and publishes
 * the connections whose two comms exist. */
static plait_result_t handshakes(struct net_state *st)
{
    plait_result_t first = PLAIT_SUCCESS;
    for (int guard = 0; guard < 1024; guard++) {
        void *rc = NULL;
        plait_result_t status = st->prov->accept(st->listen_comm, &rc);
        if (status) {
            first = status;
            break;
        }
        if (!rc)
            break;
        if (st->nin >= 2 * st->cap + 16) {
            st->prov->close_recv(rc);
            drop_in(st, "too many connections waiting for their hello at once");
            continue;
        }
        if (st->nin == st->in_cap) {
            const int cap = st->in_cap ? 2 * st->in_cap : 8;
            struct net_incoming **grown = realloc(st->in, sizeof(*grown) * (size_t)cap);
            if (!grown) {
                st->prov->close_recv(rc);
                return plait_error(PLAIT_ERR_SYSTEM, "net: out of memory");
            }
            st->in = grown;
            st->in_cap = cap;
        }
        struct net_incoming *in = calloc(1, sizeof(*in));
        if (!in) {
            st->prov->close_recv(rc);
            return plait_error(PLAIT_ERR_SYSTEM, "net: out of memory");
        }
        st->in[st->nin++] = in;
        in->recv_comm = rc;
        in->deadline = plait_now() + (st->env->timeout_s > HS_IN_LIMIT_S ? st->env->timeout_s : HS_IN_LIMIT_S);
    }
    for (int i = 0; i < st->nin;) {
        struct net_incoming *in = st->in[i];
        int done = 0;
        size_t size = 0;
        plait_result_t status = PLAIT_SUCCESS;
        if (!in->mh)
            status = st->prov->reg_mr(in->recv_comm, &in->hello, sizeof(in->hello), PLAIT_NET_PTR_HOST, &in->mh);
        if (!status && !in->req) {
            void *data = &in->hello;
            const size_t cap = sizeof(in->hello);
            const int tag = 0;
            status = st->prov->irecv(in->recv_comm, 1, &data, &cap, &tag, &in->mh, &in->req);
        }
        if (!status && in->req) {
            status = st->prov->test(in->req, &done, &size);
            if (status || done)
                in->req = NULL; /* finished either way */
        }
        int remove = 0;
        if (status) {
            char why[600];
            snprintf(why, sizeof(why), "its hello did not come: %s", plait_last_error_get());
            incoming_close(st, in);
            drop_in(st, why);
            remove = 1;
        } else if (done) {
            plait_result_t s = hello_done(st, in, size);
            if (s && !first)
                first = s;
            remove = 1;
        } else if (plait_now() > in->deadline) {
            incoming_close(st, in);
            drop_in(st, "no hello within the set-up limit");
            remove = 1;
        }
        if (remove) {
            free(in);
            st->in[i] = st->in[--st->nin];
            continue;
        }
        i++;
    }
    for (int i = 0; i < st->nentries; i++) {
        struct net_conn *c = st->entries[i];
        if (c->published)
            continue;
        dial_step(st, c);
        if (!c->failed && c->hello_sent && c->recv_comm) {
            c->published = 1;
            st->conns[st->nconns] = c;
            __atomic_store_n(&st->nconns, st->nconns + 1, __ATOMIC_RELEASE);
        }
    }
    return first;
}

/* ---------------------------------------------------------------- data */

static plait_result_t conn_fail(struct net_conn *c, plait_result_t status, const char *what)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", plait_last_error_get());
    if (status == PLAIT_ERR_REMOTE)
        __atomic_store_n(&c->conn.peer_gone, 1, __ATOMIC_RELEASE);
    snprintf(c->err_msg, sizeof(c->err_msg), "net: %s %s on class %d: %s", what, c->peer_str, c->cls, msg);
    c->err = status ? status : PLAIT_ERR_INTERNAL;
    return plait_error(c->err, "%s", c->err_msg);
}

/* What came from the peer broke the protocol (the last error says how): the
 * connection fails for good with PLAIT_ERR_REMOTE (the peer's doing), but
 * the peer is not called gone: it may be alive. */
static plait_result_t conn_malformed(struct net_conn *c)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", plait_last_error_get());
    snprintf(c->err_msg, sizeof(c->err_msg), "net: a malformed message from %s on class %d: %s", c->peer_str, c->cls,
             msg);
    c->err = PLAIT_ERR_REMOTE;
    c->rx_dead = 1;
    return plait_error(c->err, "%s", c->err_msg);
}

/* A receive failure: the peer's side is gone (REMOTE: closed or reset, also
 * in the middle of a message), what came broke the protocol (INTERNAL), or
 * ours failed. */
static plait_result_t rx_fail(struct net_conn *c, plait_result_t status)
{
    if (status == PLAIT_ERR_INTERNAL)
        return conn_malformed(c);
    if (status != PLAIT_ERR_REMOTE)
        return conn_fail(c, status, "receiving from");
    c->rx_dead = 1;
    __atomic_store_n(&c->conn.peer_gone, 1, __ATOMIC_RELEASE);
    PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT, "net: %s on class %d is gone: %s", c->peer_str, c->cls,
               plait_last_error_get());
    return PLAIT_SUCCESS;
}

static plait_result_t conn_progress_locked(struct net_state *st, struct net_conn *c);

/* Threads that run operations of one communicator at once (a stream's
 * worker, the calling thread) all move its connections: one at a time per
 * connection (the provider wants one thread per comm at a time); a thread
 * that finds it busy leaves it to the other. */
static plait_result_t conn_progress(struct net_state *st, struct net_conn *c)
{
    if (__atomic_exchange_n(&c->busy, 1, __ATOMIC_ACQUIRE))
        return PLAIT_SUCCESS;
    plait_result_t res = conn_progress_locked(st, c);
    __atomic_store_n(&c->busy, 0, __ATOMIC_RELEASE);
    return res;
}

static plait_result_t conn_progress_locked(struct net_state *st, struct net_conn *c)
{
    const struct plait_net_provider *p = st->prov;
    const uint32_t nslots = c->conn.nslots;
    const size_t slot = c->conn.slot_bytes;
    if (c->err)
        return plait_error(c->err, "%s", c->err_msg);
    /* the hello first: it is the comm's first message */
    if (c->hello_req) {
        int done = 0;
        plait_result_t status = p->test(c->hello_req, &done, NULL);
        if (status || done) {
            c->hello_req = NULL;
            __atomic_store_n(&c->hello_done, 1, __ATOMIC_RELEASE);
        }
        if (status)
            return conn_fail(c, status, "the hello to");
    }
    /* sends: issue committed slots in order */
    const uint64_t tail = __atomic_load_n(&c->tx_tail, __ATOMIC_ACQUIRE);
    while (c->tx_issued < tail && c->tx_issued - c->tx_head < (uint64_t)st->inflight) {
        const size_t i = (size_t)(c->tx_issued % nslots);
        const uint32_t len = c->tx_sizes[i];
        if (len == 0 || len > slot)
            return plait_error(PLAIT_ERR_INTERNAL, "net: a send slot of %u bytes to %s (slots hold %zu)", len,
                               c->peer_str, slot);
        void *req = NULL;
        plait_result_t status = p->isend(c->send_comm, c->tx_mem + i * slot, len, 0, c->tx_mh, &req);
        if (status)
            return conn_fail(c, status, "sending to");
        if (!req)
            break;
        c->tx_req[i] = req;
        c->tx_issued++;
    }
    /* sends: complete in order (the credit) */
    while (c->tx_head < c->tx_issued) {
        const size_t i = (size_t)(c->tx_head % nslots);
        int done = 0;
        plait_result_t status = p->test(c->tx_req[i], &done, NULL);
        if (status) {
            c->tx_req[i] = NULL;
            return conn_fail(c, status, "sending to");
        }
        if (!done)
            break;
        c->tx_req[i] = NULL;
        __atomic_store_n(&c->tx_head, c->tx_head + 1, __ATOMIC_RELEASE);
    }
    if (c->rx_dead)
        return PLAIT_SUCCESS;
    /* receives: one posted per free slot, in order */
    const uint64_t head = __atomic_load_n(&c->rx_head, __ATOMIC_ACQUIRE);
    while (c->rx_posted - head < nslots && c->rx_posted - c->rx_tail < (uint64_t)st->inflight) {
        const size_t i = (size_t)(c->rx_posted % nslots);
        void *data = c->rx_mem + i * slot;
        const int tag = 0;
        void *req = NULL;
        plait_result_t status = p->irecv(c->recv_comm, 1, &data, &slot, &tag, &c->rx_mh, &req);
        if (status)
            return rx_fail(c, status);
        if (!req)
            break;
        c->rx_req[i] = req;
        c->rx_posted++;
    }
    while (c->rx_tail < c->rx_posted) {
        const size_t i = (size_t)(c->rx_tail % nslots);
        int done = 0;
        size_t size = 0;
        plait_result_t status = p->test(c->rx_req[i], &done, &size);
        if (status) {
            c->rx_req[i] = NULL;
            return rx_fail(c, status);
        }
        if (!done)
            break;
        c->rx_req[i] = NULL;
        if (size == 0 || size > slot) {
            plait_error(PLAIT_ERR_REMOTE, "a message of %zu bytes (slots hold %zu; 0 is never sent)", size, slot);
            return conn_malformed(c);
        }
        c->rx_sizes[i] = (uint32_t)size;
        __atomic_store_n(&c->rx_tail, c->rx_tail + 1, __ATOMIC_RELEASE);
    }
    return PLAIT_SUCCESS;
}

static int conn_flushed(const struct plait_conn *conn)
{
    const struct net_conn *c = (const struct net_conn *)conn;
    return __atomic_load_n(&c->hello_done, __ATOMIC_ACQUIRE) &&
           __atomic_load_n(&c->tx_head, __ATOMIC_ACQUIRE) == __atomic_load_n(&c->tx_tail, __ATOMIC_ACQUIRE);
}

static plait_result_t net_progress(void *ctx, struct plait_conn *conn, struct plait_conn **failed)
{
    struct net_state *st = ctx;
    if (!st)
        return PLAIT_SUCCESS;
    if (!conn) {
        const double now = plait_now();
        double next;
        __atomic_load(&st->hs_next, &next, __ATOMIC_RELAXED);
        if (now >= next && pthread_mutex_trylock(&st->hs_lock) == 0) {
            next = now + HS_PERIOD;
            __atomic_store(&st->hs_next, &next, __ATOMIC_RELAXED);
            /* a failure here is the failing connection's accept() to report */
            (void)handshakes(st);
            pthread_mutex_unlock(&st->hs_lock);
        }
    }
    if (conn) {
        plait_result_t res = conn_progress(st, (struct net_conn *)conn);
        if (res)
            *failed = conn;
        return res;
    }
    const int n = __atomic_load_n(&st->nconns, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        plait_result_t res = conn_progress(st, st->conns[i]);
        if (res) {
            *failed = &st->conns[i]->conn;
            return res;
        }
    }
    return PLAIT_SUCCESS;
}

static int net_is_flushed(void *ctx, const struct plait_conn *conn)
{
    struct net_state *st = ctx;
    if (conn)
        return conn_flushed(conn);
    const int n = st ? __atomic_load_n(&st->nconns, __ATOMIC_ACQUIRE) : 0;
    for (int i = 0; i < n; i++)
        if (!conn_flushed(&st->conns[i]->conn))
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- set-up, teardown */

static void net_fini(void *ctx)
{
    struct net_state *st = ctx;
    if (!st)
        return;
    reg_remove(st);
    for (int i = 0; i < st->nentries; i++)
        conn_free(st, st->entries[i]);
    for (int i = 0; i < st->nin; i++) {
        incoming_close(st, st->in[i]);
        free(st->in[i]);
    }
    if (st->listen_comm)
        st->prov->close_listen(st->listen_comm);
    if (st->pctx)
        st->prov->finalize(st->pctx);
    free(st->infos);
    free(st->by);
    free(st->entries);
    free(st->conns);
    free(st->in);
    pthread_mutex_destroy(&st->hs_lock);
    free(st);
}

static const struct plait_net_provider *test_provider; /* plait_net_provider_substitute */

void plait_net_provider_substitute(const struct plait_net_provider *p)
{
    __atomic_store_n(&test_provider, p, __ATOMIC_RELEASE);
}

/* PLAIT_NET_PROVIDER's value (core/settings.c checks it; "" is the default). */
static const struct plait_net_provider *provider_named(const char *name)
{
    const struct plait_net_provider *t = __atomic_load_n(&test_provider, __ATOMIC_ACQUIRE);
    if (!name || !name[0] || strcmp(name, "socket") == 0)
        return t ? t : &plait_net_socket;
    return NULL;
}

/* The provider's side of init on a rank with net peers: the context, device
 * 0's properties, the listen comm and handle. */
static plait_result_t provider_start(struct net_state *st, struct net_rank_info *mine)
{
    const struct plait_tp_env *env = st->env;
    const struct plait_net_provider *p = provider_named(env->net_provider);
    if (!p)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "net: PLAIT_NET_PROVIDER=\"%s\" names no provider (valid: socket)", env->net_provider);
    if (p->size < sizeof(*p) || p->version < PLAIT_NET_PROVIDER_VERSION)
        return plait_error(PLAIT_ERR_INTERNAL, "net: provider %s is version %u (size %zu), older than this transport",
                           p->name, p->version, p->size);
    st->prov = p;
    plait_result_t status = p->init(&st->pctx, 0, NULL);
    if (status)
        return plait_error_context(status, "net: provider %s", p->name);
    int ndev = 0;
    if ((status = p->devices(st->pctx, &ndev)))
        return plait_error_context(status, "net: provider %s: devices", p->name);
    if (ndev < 1)
        return plait_error(PLAIT_ERR_SYSTEM, "net: provider %s has no device", p->name);
    if ((status = p->get_properties(st->pctx, NET_DEV, &st->props)))
        return plait_error_context(status, "net: provider %s: device %d", p->name, NET_DEV);
    st->props.name[sizeof(st->props.name) - 1] = 0;
    if (!(st->props.ptr_support & PLAIT_NET_PTR_HOST))
        return plait_error(PLAIT_ERR_SYSTEM, "net: provider %s device %s cannot send from host memory", p->name,
                           st->props.name);
    if (st->props.max_p2p_bytes < env->slot_bytes)
        return plait_error(PLAIT_ERR_SYSTEM, "net: provider %s device %s takes messages of %zu bytes at most, less "
                                             "than a slot (%zu)",
                           p->name, st->props.name, st->props.max_p2p_bytes, env->slot_bytes);
    int inflight = (int)env->nslots;
    const int maxreq = st->props.max_requests > 0 && st->props.max_requests < PLAIT_NET_MAX_REQUESTS
                           ? st->props.max_requests
                           : PLAIT_NET_MAX_REQUESTS;
    if (inflight > maxreq)
        inflight = maxreq;
    st->inflight = inflight > 0 ? inflight : 1;
    if ((status = p->listen(st->pctx, NET_DEV, mine->handle, &st->listen_comm)))
        return plait_error_context(status, "net: provider %s: listening on %s", p->name, st->props.name);
    mine->has = 1;
    mine->speed_mbps = st->props.speed_mbps;
    mine->latency_us = st->props.latency_us;
    mine->ptr_support = st->props.ptr_support;
    return PLAIT_SUCCESS;
}

/* Collective: every rank allgathers its listen handle (zero without net peers). */
static plait_result_t net_init(const struct plait_tp_env *env, void **ctx)
{
    const int n = env->nranks, me = env->rank;
    *ctx = NULL;
    if (n <= 0)
        return plait_error(PLAIT_ERR_INTERNAL, "net: %d ranks", n);
    /* agreed on every rank (a pure function of env): a communicator of one
     * host, not forced onto the network, exchanges nothing */
    int any = env->force_net && n > 1;
    for (int p = 1; p < n && !any; p++)
        any = env->ranks[p].host != env->ranks[0].host;
    if (!any)
        return PLAIT_SUCCESS;
    if (env->nslots > NET_MAX_SLOTS || env->slot_bytes > UINT32_MAX / 2)
        return plait_error(PLAIT_ERR_INTERNAL, "net: %u slots of %zu bytes", env->nslots, env->slot_bytes);
    int nconns = 0;
    for (int p = 0; p < n; p++) {
        if (!joins(env, me, p))
            continue;
        for (int c = 0; c < env->ncls; c++)
            if (env->wanted(env->core, me, p, c))
                nconns++;
    }
    struct net_state *st = calloc(1, sizeof(*st));
    struct net_rank_info *infos = calloc((size_t)n, sizeof(*infos));
    if (!st || !infos) {
        free(st);
        free(infos);
        return plait_error(PLAIT_ERR_SYSTEM, "net: out of memory");
    }
    st->env = env;
    st->infos = infos;
    st->prov = &plait_net_socket; /* replaced by provider_start; fini's closes need one */
    pthread_mutex_init(&st->hs_lock, NULL);
    plait_result_t status = PLAIT_SUCCESS;
    if (nconns > 0) {
        st->cap = nconns;
        st->by = calloc((size_t)n * (size_t)env->ncls, sizeof(*st->by));
        st->entries = calloc((size_t)nconns, sizeof(*st->entries));
        st->conns = calloc((size_t)nconns, sizeof(*st->conns));
        if (!st->by || !st->entries || !st->conns)
            status = plait_error(PLAIT_ERR_SYSTEM, "net: out of memory");
        if (!status)
            status = provider_start(st, &infos[me]);
    }
    /* the exchange is collective, even for ranks that failed or have no net peer */
    plait_result_t ag = env->allgather(env->core, infos, sizeof(*infos));
    if (!status)
        status = ag;
    if (status || nconns == 0) {
        net_fini(st);
        return status;
    }
    reg_add(st);
    PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
               "net: rank %d listens with provider %s on device %d (%s, %d Mbit/s) for up to %d connections", me,
               st->prov->name, NET_DEV, st->props.name, st->props.speed_mbps, nconns);
    *ctx = st;
    return PLAIT_SUCCESS;
}

/* Starts this rank's dial (both ends always dial: each needs its send comm). */
static plait_result_t net_connect(void *ctx, int peer, int cls, unsigned flags, void *blob)
{
    (void)flags;
    (void)blob;
    struct net_state *st = ctx;
    if (!st)
        return plait_error(PLAIT_ERR_INTERNAL, "net: a connection to rank %d with no net peer", peer);
    const struct plait_tp_env *env = st->env;
    if (peer < 0 || peer >= env->nranks || cls < 0 || cls >= env->ncls)
        return plait_error(PLAIT_ERR_INTERNAL, "net: a connection to rank %d on class %d", peer, cls);
    pthread_mutex_lock(&st->hs_lock);
    struct net_conn *c = NULL;
    plait_result_t status = entry_get(st, peer, cls, &c);
    if (!status) {
        dial_start(st, c);
        dial_step(st, c);
    }
    pthread_mutex_unlock(&st->hs_lock);
    return status;
}

static plait_result_t net_accept(void *ctx, int peer, int cls, const void *peer_blob, double deadline,
                                 struct plait_conn **out)
{
    (void)peer_blob;
    struct net_state *st = ctx;
    if (!st)
        return plait_error(PLAIT_ERR_INTERNAL, "net: a connection to rank %d with no net peer", peer);
    const struct plait_tp_env *env = st->env;
    if (peer < 0 || peer >= env->nranks || cls < 0 || cls >= env->ncls)
        return plait_error(PLAIT_ERR_INTERNAL, "net: a connection to rank %d on class %d", peer, cls);
    pthread_mutex_lock(&st->hs_lock);
    struct net_conn *c = st->by[peer * env->ncls + cls];
    plait_result_t status = PLAIT_SUCCESS;
    if (!c || !c->published)
        status = handshakes(st);
    c = st->by[peer * env->ncls + cls];
    if (c && c->published) {
        *out = &c->conn;
        status = PLAIT_SUCCESS;
    } else if (c && c->failed) {
        status = plait_error(c->failed, "%s", c->failed_msg);
    } else if (status) {
        /* the listen comm failed: the provider's message */
    } else if (deadline > 0 && plait_deadline_passed(deadline)) {
        char who[160];
        env->peer_str(env->core, peer, who, sizeof(who));
        const int have_send = c && c->send_comm, have_recv = c && c->recv_comm;
        const char *missing = !have_send && !have_recv ? "our dial and its dial"
                              : !have_send             ? "our dial"
                                                       : "its dial (its hello)";
        if (st->ndropped)
            status = plait_error(PLAIT_ERR_TIMEOUT,
                                 "net: rank %d waited for its connection with %s on class %d until the deadline "
                                 "(PLAIT_TIMEOUT=%g s): %s did not come; %d connections were closed, the last: %s",
                                 env->rank, who, cls, env->timeout_s, missing, st->ndropped, st->dropped);
        else
            status = plait_error(PLAIT_ERR_TIMEOUT,
                                 "net: rank %d waited for its connection with %s on class %d until the deadline "
                                 "(PLAIT_TIMEOUT=%g s): %s did not come",
                                 env->rank, who, cls, env->timeout_s, missing);
    } else {
        status = PLAIT_IN_PROGRESS;
    }
    pthread_mutex_unlock(&st->hs_lock);
    return status;
}

int plait_net_conn_fd(const struct plait_conn *conn, int send)
{
    if (!conn || conn->tp != &plait_transport_net)
        return -1;
    const struct net_conn *c = (const struct net_conn *)conn;
    if (c->st->prov != &plait_net_socket)
        return -1;
    return plait_net_socket_comm_fd(send ? c->send_comm : c->recv_comm);
}

const struct plait_transport plait_transport_net = {
    .size = sizeof(struct plait_transport),
    .version = PLAIT_TRANSPORT_VERSION,
    .name = "net",
    .can_join = net_can_join,
    .query = net_query,
    .init = net_init,
    .connect = net_connect,
    .accept = net_accept,
    .progress = net_progress,
    .is_flushed = net_is_flushed,
    .fini = net_fini,
};
