/* Transports and connections: the one module of the core that enumerates
 * peers and owns the connection table (comm->conns). It gives every
 * transport its narrow environment (struct plait_tp_env), picks the
 * transport of each pair of ranks (the highest can_join of
 * transports/registry.c), runs the transports' collective init and makes the
 * connections through their connect/accept halves at init and destroy
 * (core/comm.c). Nothing else in the core knows which transport is which: it
 * asks plait_comm_pair_info what a pair's link offers. */
#include "core/comm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algorithms/algorithms.h"
#include "base/log.h"
#include "base/util.h"
#include "bootstrap/bootstrap.h"
#include "core/fastpath.h"

/* The core's region in each rank's segment of a transport that holds one:
 * one line of operation counters, then the small-message boxes. */
#define OPS_LINE 64

_Static_assert((int)PLAIT_TP_CMA_AUTO == (int)PLAIT_CMA_AUTO && (int)PLAIT_TP_CMA_OFF == (int)PLAIT_CMA_OFF &&
                   (int)PLAIT_TP_CMA_REQUIRE == (int)PLAIT_CMA_REQUIRE,
               "enum plait_tp_cma follows enum plait_cma_setting");

int plait_conn_needed(const struct plait_comm *comm, int rank, int peer, int cls)
{
    if (cls == comm->ncls - 1)
        return 1;
    /* the small-message class: every peer, when that path runs over
     * connections (it exchanges with every rank), made on first use */
    if (cls == comm->nchannels)
        return comm->fast_msg && rank != peer;
    /* ring channels join the peers any algorithm of the table may use, and the
     * neighbours of the topology's ring orders */
    return plait_algo_connects(comm->nranks, comm->set.tree_radix, comm->set.algo, rank, peer) ||
           plait_comm_ring_neighbours(comm, rank, peer, cls);
}

/* ------------------------------------------------------------ the environment */

static int env_wanted(const void *core, int a, int b, int cls)
{
    return plait_conn_needed(core, a, b, cls);
}

static plait_result_t env_allgather(void *core, void *data, size_t size)
{
    return plait_bootstrap_allgather(((struct plait_comm *)core)->bs, data, size);
}

static plait_result_t env_barrier(void *core)
{
    return plait_bootstrap_barrier(((struct plait_comm *)core)->bs);
}

static const char *env_peer_str(const void *core, int peer, char *buf, size_t len)
{
    return plait_peer_str(core, peer, buf, len);
}

static void fill_env(struct plait_comm *comm, struct plait_tp_env *env)
{
    memset(env, 0, sizeof(*env));
    env->size = sizeof(*env);
    env->rank = comm->rank;
    env->nranks = comm->nranks;
    env->ncls = comm->ncls;
    env->ranks = comm->tp_ranks;
    env->nslots = comm->set.nslots;
    env->slot_bytes = comm->set.slot_bytes;
    env->force_net = comm->set.transport_force == PLAIT_FORCE_TCP;
    env->cma = comm->set.cma;
    env->cma_min_bytes = comm->set.cma_min_bytes;
    env->timeout_s = comm->set.timeout_s;
    env->net_provider = comm->set.net_provider;
    env->secret = plait_bootstrap_secret(comm->bs);
    env->wanted = env_wanted;
    env->allgather = env_allgather;
    env->barrier = env_barrier;
    env->peer_str = env_peer_str;
    env->core = comm;
}

/* ------------------------------------------------------------ choice and queries */

int plait_comm_pair_tp(const struct plait_comm *comm, int a, int b)
{
    if (a == comm->rank && comm->tp_of)
        return comm->tp_of[b];
    if (b == comm->rank && comm->tp_of)
        return comm->tp_of[a];
    return plait_tp_choose(&comm->tp_env[0], a, b);
}

void plait_comm_pair_info(const struct plait_comm *comm, int a, int b, struct plait_tp_info *info)
{
    memset(info, 0, sizeof(*info));
    if (!comm->tp_ranks)
        return;
    const int t = plait_comm_pair_tp(comm, a, b);
    if (t >= 0)
        plait_transports[t]->query(&comm->tp_env[t], a, b, info);
}

const char *plait_comm_transport_name(const struct plait_comm *comm, int peer)
{
    return plait_transports[comm->tp_of[peer]]->name;
}

/* ------------------------------------------------------------ setup and teardown */

/* The core's region: operation counters (comm->my_ops, peer_ops: read by
 * same-host peers to tell a crash mid-operation from a clean exit) and the
 * small-message boxes. */
static void attach_regions(struct plait_comm *comm)
{
    const int n = comm->nranks, me = comm->rank;
    for (int t = 0; t < plait_ntransports; t++) {
        const struct plait_transport *tp = plait_transports[t];
        void *ctx = comm->tp_ctx[t];
        if (!ctx || !tp->region || !comm->tp_env[t].region_bytes)
            continue;
        char *mine = tp->region(ctx, me);
        if (mine)
            comm->my_ops = (uint64_t *)mine;
        for (int p = 0; p < n; p++)
            if (p != me && comm->tp_of[p] == t && tp->region(ctx, p))
                comm->peer_ops[p] = (const uint64_t *)tp->region(ctx, p);
        if (comm->tp_env[t].region_bytes > OPS_LINE && mine) {
            char **boxes = calloc((size_t)(n > 0 ? n : 1), sizeof(*boxes));
            int ok = boxes != NULL;
            for (int p = 0; ok && p < n; p++)
                ok = (boxes[p] = tp->region(ctx, p)) != NULL;
            if (ok) {
                for (int p = 0; p < n; p++)
                    boxes[p] += OPS_LINE;
                plait_fast_attach(comm, boxes);
            }
            free(boxes);
        }
    }
}

/* ------------------------------------------------------------ connections
 *
 * A connection is made in two halves (the transport's connect, then accept
 * until it no longer says PLAIT_IN_PROGRESS), without blocking: at init for
 * the ring neighbours (every connection with PLAIT_RUNTIME_CONNECT=0), and
 * otherwise when a step first needs it (core/exec.c), from whichever thread
 * runs the step. A rank that waits for its peer's half goes on running its
 * other tasks, so two ranks that need each other at once, several
 * communicators driven by one thread, or a group's many connections cannot
 * deadlock. comm->conn_lock serializes the halves; comm->conns[] entries are
 * published with a release store and read with an acquire load. */

enum { CS_NONE = 0, CS_CONNECTING, CS_FAILED };

/* Whether (peer, cls) is connected at init: a symmetric rule, so both ends
 * of a connection make it then, or neither. */
static int at_init(const struct plait_comm *comm, int peer, int cls)
{
    const int n = comm->nranks, me = comm->rank;
    if (!plait_conn_needed(comm, me, peer, cls))
        return 0;
    if (!comm->set.runtime_connect)
        return 1;
    if (cls >= comm->nchannels || peer == me)
        return 0; /* point-to-point: on first use */
    return peer == (me + 1) % n || peer == (me + n - 1) % n || plait_comm_ring_neighbours(comm, me, peer, cls);
}

/* One attempt at (peer, cls); *out is NULL while it is being made. Called
 * with conn_lock held. */
static plait_result_t conn_step(struct plait_comm *comm, int peer, int cls, double deadline, int both_now,
                                struct plait_conn **out)
{
    const size_t i = (size_t)peer * (size_t)comm->ncls + (size_t)cls;
    const int t = comm->tp_of[peer];
    const struct plait_transport *tp = plait_transports[t];
    char who[160];
    *out = NULL;
    if (comm->conns[i]) {
        *out = comm->conns[i];
        return PLAIT_SUCCESS;
    }
    if (comm->conn_state[i] == CS_FAILED)
        return plait_error(PLAIT_ERR_REMOTE, "rank %d: the %s connection with %s on class %d failed before", comm->rank,
                           tp->name, plait_peer_str(comm, peer, who, sizeof(who)), cls);
    plait_result_t status = PLAIT_SUCCESS;
    if (comm->conn_state[i] == CS_NONE) {
        if (tp->blob_bytes > 0)
            /* A blob needs a point-to-point exchange over the bootstrap,
             * which no transport needs yet. */
            status = plait_error(PLAIT_ERR_INTERNAL, "the %s transport needs a connection blob, which this build "
                                 "cannot exchange", tp->name);
        else
            status = tp->connect(comm->tp_ctx[t], peer, cls, both_now ? PLAIT_TP_BOTH_NOW : 0, NULL);
        if (!status) {
            comm->conn_state[i] = CS_CONNECTING;
            comm->conn_since[i] = plait_now();
        }
    }
    struct plait_conn *conn = NULL;
    if (!status)
        status = tp->accept(comm->tp_ctx[t], peer, cls, NULL, deadline, &conn);
    if (status == PLAIT_IN_PROGRESS) {
        if (deadline > 0 && plait_deadline_passed(deadline))
            status = plait_error(PLAIT_ERR_TIMEOUT, "its side did not come by the deadline (PLAIT_TIMEOUT=%g s)",
                                 comm->set.timeout_s);
        else
            return PLAIT_SUCCESS;
    }
    if (status) {
        comm->conn_state[i] = CS_FAILED;
        return plait_error_context(status, "rank %d: %s connection with %s on class %d", comm->rank, tp->name,
                                   plait_peer_str(comm, peer, who, sizeof(who)), cls);
    }
    /* A peer already known dead (its pidfd fired) gives nothing more. The
     * watcher stores peer_exited and then reads conns[]; this stores conns[]
     * and then reads peer_exited: sequentially consistent, so at least one
     * of the two sees the other and the connection is marked. */
    __atomic_store_n(&comm->conns[i], conn, __ATOMIC_SEQ_CST);
    if (comm->peer_exited && __atomic_load_n(&comm->peer_exited[peer], __ATOMIC_SEQ_CST) && !conn->needs_progress)
        __atomic_store_n(&conn->peer_gone, 1, __ATOMIC_RELEASE);
    comm->nconns_made++;
    if (comm->init_done)
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT, "rank %d: %s connection with %s on class %d made on first use in %.3f ms",
                   comm->rank, tp->name, plait_peer_str(comm, peer, who, sizeof(who)), cls,
                   (plait_now() - comm->conn_since[i]) * 1e3);
    *out = conn;
    return PLAIT_SUCCESS;
}

static plait_result_t conn_get(struct plait_comm *comm, int peer, int cls, double deadline, int both_now,
                               struct plait_conn **out)
{
    struct plait_conn *c = __atomic_load_n(&comm->conns[(size_t)peer * (size_t)comm->ncls + (size_t)cls],
                                           __ATOMIC_ACQUIRE);
    if (c) {
        *out = c;
        return PLAIT_SUCCESS;
    }
    pthread_mutex_lock(&comm->conn_lock);
    plait_result_t status = conn_step(comm, peer, cls, deadline, both_now, out);
    pthread_mutex_unlock(&comm->conn_lock);
    return status;
}

/* On first use there is no deadline of its own: the peer's side comes when
 * it calls the operation, and the operation's wait (PLAIT_COLL_TIMEOUT, the
 * dead-peer checks) decides. */
plait_result_t plait_comm_conn_get(struct plait_comm *comm, int peer, int cls, struct plait_conn **out)
{
    return conn_get(comm, peer, cls, 0, 0, out);
}

/* Makes every connection `which` selects (at_init's, or every one this rank
 * may need), polling them all until each is made: both ends of each make
 * their halves, in any order. */
static plait_result_t connect_set(struct plait_comm *comm, int all)
{
    const int n = comm->nranks, me = comm->rank;
    const double deadline = plait_deadline(comm->set.timeout_s);
    for (int polls = 0;; polls++) {
        int pending = 0;
        for (int p = 0; p < n; p++)
            for (int c = 0; c < comm->ncls; c++) {
                if (!(all ? plait_conn_needed(comm, me, p, c) : at_init(comm, p, c)))
                    continue;
                struct plait_conn *conn = NULL;
                /* at init both ends make the same set now; connect_all (the
                 * CUDA backend) too: every rank of such a communicator does */
                plait_result_t status = conn_get(comm, p, c, deadline, 1, &conn);
                if (status)
                    return status;
                pending += conn == NULL;
            }
        if (!pending)
            return PLAIT_SUCCESS;
        if (plait_aborted(&comm->abort_flag))
            return plait_error(PLAIT_ERR_REMOTE, "rank %d: aborted while making its connections", me);
        if (polls > 100) {
            struct timespec ts = {0, 100000}; /* 0.1 ms: the peers are making their halves */
            nanosleep(&ts, NULL);
        }
    }
}

plait_result_t plait_comm_connect_all(struct plait_comm *comm)
{
    return connect_set(comm, 1);
}

int plait_comm_conns_made(const struct plait_comm *comm)
{
    return comm->nconns_made;
}

plait_result_t plait_comm_transports_setup(struct plait_comm *comm)
{
    const int n = comm->nranks, me = comm->rank;
    if (n <= 0)
        return plait_error(PLAIT_ERR_INTERNAL, "init: %d ranks", n);
    comm->tp_ranks = calloc((size_t)n, sizeof(*comm->tp_ranks));
    if (!comm->tp_ranks)
        return plait_error(PLAIT_ERR_SYSTEM, "init: out of memory for %d ranks", n);
    for (int p = 0; p < n; p++) {
        comm->tp_ranks[p].host = comm->ranks[p].host_index;
        comm->tp_ranks[p].pid = comm->ranks[p].pid;
        comm->tp_ranks[p].process_token = comm->ranks[p].process_token;
    }
    for (int t = 0; t < plait_ntransports; t++)
        fill_env(comm, &comm->tp_env[t]);
    for (int p = 0; p < n; p++) {
        const int t = plait_tp_choose(&comm->tp_env[0], me, p);
        if (t < 0) {
            char who[160];
            return plait_error(PLAIT_ERR_INTERNAL, "rank %d: no transport can join it with %s", me,
                               plait_peer_str(comm, p, who, sizeof(who)));
        }
        comm->tp_of[p] = (uint8_t)t;
    }
    /* Whether the small-message path runs over connections (no transport
     * joins every pair with boxes): it decides which connections exist. */
    comm->fast_msg = plait_fast_msg_wanted(comm);
    /* The regions each transport holds for the core: a pure function of
     * what every rank knows (every segment's layout is computed by its peers). */
    for (int t = 0; t < plait_ntransports; t++) {
        const struct plait_transport *tp = plait_transports[t];
        struct plait_tp_info info;
        memset(&info, 0, sizeof(info));
        tp->query(&comm->tp_env[t], 0, 0, &info);
        if (tp->region && info.region)
            comm->tp_env[t].region_bytes = OPS_LINE + plait_fast_region_bytes(comm, t);
    }
    plait_result_t status;
    for (int t = 0; t < plait_ntransports; t++)
        if ((status = plait_transports[t]->init(&comm->tp_env[t], &comm->tp_ctx[t])))
            return plait_error_context(status, "rank %d: %s transport", me, plait_transports[t]->name);
    comm->conn_state = calloc((size_t)n * (size_t)comm->ncls, 1);
    comm->conn_since = calloc((size_t)n * (size_t)comm->ncls, sizeof(double));
    if (!comm->conn_state || !comm->conn_since)
        return plait_error(PLAIT_ERR_SYSTEM, "init: out of memory for %d ranks", n);
    if ((status = connect_set(comm, 0)))
        return status;
    attach_regions(comm);
    if (comm->fast_msg && !comm->fast)
        plait_fast_attach_msg(comm);
    PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT, "rank %d: %d connections at init (%s)", me, comm->nconns_made,
               comm->set.runtime_connect ? "ring neighbours; the others on first use" : "every one: PLAIT_RUNTIME_CONNECT=0");
    return PLAIT_SUCCESS;
}

void plait_comm_transports_teardown(struct plait_comm *comm)
{
    plait_fast_detach(comm);
    comm->my_ops = comm->local_ops;
    if (comm->peer_ops)
        memset(comm->peer_ops, 0, sizeof(*comm->peer_ops) * (size_t)comm->nranks);
    if (comm->conns)
        memset(comm->conns, 0, sizeof(*comm->conns) * (size_t)comm->nranks * (size_t)comm->ncls);
    for (int t = plait_ntransports - 1; t >= 0; t--) {
        void *ctx = comm->tp_ctx[t];
        comm->tp_ctx[t] = NULL;
        if (ctx)
            plait_transports[t]->fini(ctx);
    }
    free(comm->tp_ranks);
    comm->tp_ranks = NULL;
    free(comm->conn_state);
    comm->conn_state = NULL;
    free(comm->conn_since);
    comm->conn_since = NULL;
}

/* ------------------------------------------------------------ progress */

int plait_comm_needs_progress(const struct plait_comm *comm)
{
    for (int t = 0; t < plait_ntransports; t++)
        if (comm->tp_ctx[t] && plait_transports[t]->progress)
            return 1;
    return 0;
}

/* A progress failure because the peer went away names the rank that failed
 * first, as a wait on the peer would. */
static plait_result_t progress_error(struct plait_comm *comm, struct plait_conn *failed, plait_result_t res)
{
    if (!failed || !plait_conn_peer_gone(failed))
        return res;
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", plait_last_error_get());
    return plait_comm_peer_gone(comm, failed->peer, detail);
}

plait_result_t plait_conn_progress(struct plait_comm *comm, struct plait_conn *c)
{
    struct plait_conn *failed = NULL;
    plait_result_t res = c->tp->progress(c->ctx, c, &failed);
    return res ? progress_error(comm, failed ? failed : c, res) : PLAIT_SUCCESS;
}

plait_result_t plait_comm_transports_progress(struct plait_comm *comm, int *all_flushed)
{
    for (int t = 0; t < plait_ntransports; t++) {
        const struct plait_transport *tp = plait_transports[t];
        void *ctx = comm->tp_ctx[t];
        if (!ctx || !tp->progress)
            continue;
        struct plait_conn *failed = NULL;
        plait_result_t res = tp->progress(ctx, NULL, &failed);
        if (res)
            return progress_error(comm, failed, res);
        if (tp->is_flushed(ctx, NULL))
            continue;
        /* Which connection still holds sends, and whether its peer can
         * still take them. */
        for (int i = 0; i < comm->nranks * comm->ncls; i++) {
            struct plait_conn *c = __atomic_load_n(&comm->conns[i], __ATOMIC_ACQUIRE);
            if (!c || c->ctx != ctx || tp->is_flushed(ctx, c))
                continue;
            if (plait_conn_peer_gone(c))
                return plait_comm_peer_gone(comm, c->peer, "before it received our data");
            *all_flushed = 0;
        }
    }
    return PLAIT_SUCCESS;
}
