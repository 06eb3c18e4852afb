/* The communicator and the operations it runs (private). */
#ifndef PLAIT_COMM_H
#define PLAIT_COMM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "plait.h"
#include "core/settings.h"
#include "base/handle.h"
#include "core/plan.h"
#include "core/reduce.h"
#include "algorithms/schedule.h"
#include "transports/transport.h"

#define PLAIT_COMM_MAGIC 0x706c6169636f6d6dull
#define PLAIT_MAX_PREMUL_OPS 64
/* Single-copy descriptors one task may have published and not yet seen
 * released; past that its steps send data slots (exec.c). */
#define PLAIT_SC_PENDING 8

/* What every rank learns about every other at init. */
struct plait_rank_info {
    char hostid[256];
    char hostname[64];
    uint64_t process_token; /* random per process: "same process" test */
    int32_t pid;
    int32_t host_index;     /* dense index of hostid, in order of first appearance */
    int32_t local_rank;     /* index among the ranks of its host */
    int32_t numa;           /* the NUMA node (cpu node index in its host's graph) it runs on, -1 unknown */
    uint64_t topo_hash;     /* plait_topo_hash of the graph it sees: equal on one host when views agree */
};

/* Channels whose ring order the topology may set: PLAIT_NCHANNELS' maximum. */
#define PLAIT_MAX_CHANNELS_TOPO 32
struct plait_topo;

struct plait_premul_op {
    int in_use;
    int dtype;
    int residence;
    uint64_t scalar_bits;   /* the immediate value (HOST_IMMEDIATE) */
    const void *scalar_ptr; /* read at enqueue (DEVICE residence, host memory here) */
};

struct plait_comm {
    uint64_t magic;
    int rank;
    int nranks;
    char name[64];
    struct plait_settings set;
    struct plait_bootstrap *bs;
    struct plait_rank_info *ranks;
    int nhosts;
    int host_index;
    int local_rank;
    int nlocal;
    int32_t *host_of;       /* node map for the generators: host index per rank, then local index per rank */
    const struct plait_topo *topo; /* this process's graph of its host (topology/system.c), not owned */
    int32_t *ring_order;    /* [nchannels * nranks] ring order per channel from channel search, NULL = rank order */
    int32_t *ring_pos;      /* [nchannels * nranks] place of each rank in each channel's ring, NULL with ring_order */
    char *scratch_cache;    /* the last SCRATCH buffer released (enqueue.c), or NULL */
    int spin_ns;            /* how long a waiter polls before yielding the core */

    /* connections: conns[peer * ncls + cls]; NULL where none */
    int nchannels;
    int ncls;               /* nchannels + 2: the channels' classes, the small-message class (index
                             * nchannels: connected only with fast_msg), then point-to-point (the last) */
    int fast_msg;           /* the small-message path runs over connections (fastpath.c): agreed */
    struct plait_conn **conns;
    uint8_t *tp_of;         /* per peer: the transport that joins us (an index in plait_transports) */
    void *tp_ctx[PLAIT_TP_MAX];          /* per transport: its context (NULL: nothing on this rank) */
    struct plait_tp_env tp_env[PLAIT_TP_MAX]; /* per transport: what it knows of the communicator */
    struct plait_tp_rank *tp_ranks;      /* [nranks]: what every transport knows of each rank */
    pthread_mutex_t conn_lock;           /* connections being made (comm_transport.c) */
    uint8_t *conn_state;                 /* [peer * ncls + cls]: being made, failed (comm_transport.c) */
    double *conn_since;                  /* [peer * ncls + cls]: when its making started */
    int nconns_made;                     /* connections made so far */
    int init_done;                       /* init has returned: connections are made on first use */
    int *pidfds;            /* per peer: pidfd of a same-host process, else -1 */
    uint8_t *peer_exited;   /* per peer: its process is known gone (its pidfd fired) */
    /* Operation counters {issued, completed}: ours are published where same-host
     * peers can read them (the shm segment's header), so that a peer that died
     * with issued > completed is known to have crashed mid-operation. An
     * operation that returned an error counts as completed: the rank did not
     * crash in it. */
    uint64_t local_ops[3];  /* {issued, completed, culprit + 1}: see PLAIT_OPS_* */
    uint64_t *my_ops;
    const uint64_t **peer_ops;
    int dead_peer;          /* a peer that crashed mid-operation, or -1 */
    int dead_reporter;      /* the rank that reported dead_peer, or -1 (we saw it ourselves) */

    int abort_flag;         /* raised by plait_comm_abort from any thread */
    int busy;               /* threads inside the executor with this communicator */
    int inflight;           /* operations queued on streams, not yet finished */
    double dead_since;      /* aborted: when its resources were released */
    struct plait_comm *grave_next;
    struct plait_reg *regs; /* registrations, freed with the communicator */
    int init_pending;       /* non-blocking init still running */
    pid_t owner_pid;        /* the process that created it (fork safety) */
    int blocking;
    /* The config's max_ctas / min_ctas: channels of both backends (host
     * channels, CTAs of a device launch); they win over set.max_channels /
     * set.min_channels (PLAIT_MAX_CTAS / PLAIT_MIN_CTAS). */
    int config_max_channels; /* > 0 a cap, -1: max_ctas = 0 (no CTA of their own on a GPU), 0 = unset */
    int config_min_channels; /* > 0 a lower bound, 0 = unset */
    uint64_t seq;           /* operations issued */
    uint64_t coll_seq;      /* collectives issued (every rank issues the same sequence) */
    uint64_t fast_seq;      /* collectives issued on the small-message path (fastpath.c) */
    struct plait_fast *fast;/* the small-message boxes, NULL when this communicator has none */
    struct plait_tuner *tuner; /* per-call choices (tuner.c), NULL before init */
    struct plait_cuda_comm *cuda; /* device state (core/cuda/dev_comm.h), NULL: host buffers only */
    struct plait_cuda_proxy *cuda_proxy; /* proxy thread and its FIFOs (core/cuda/proxy.c), NULL: none */
    struct plait_cuda_ce *cuda_ce; /* memory windows, copy-engine flags (core/cuda/ce.c), NULL: none */
    int in_error;           /* a collective failed: further ones are refused */
    int finalized;

    /* asynchronous state (non-blocking init/calls, stream workers) */
    pthread_mutex_t async_lock;
    pthread_mutex_t peers_lock; /* plait_comm_check_peers: the CUDA proxy thread checks peers too */
    plait_result_t async_error;
    char async_msg[1024];
    int async_pending;      /* non-blocking work not yet done */
    pthread_t init_thread;
    int has_init_thread;
    struct plait_stream *internal_stream; /* runs calls of a non-blocking communicator */

    struct plait_premul_op premul[PLAIT_MAX_PREMUL_OPS];
    uint8_t barrier_buf[2][16];
};

/* One unit of the executor: a channel of a collective, or one side of a
 * point-to-point transfer. */
struct plait_task {
    struct plait_op *op;
    int cls;                 /* connection class */
    int lane;                /* ordering lane: tasks of one comm and lane run in issue order */
    struct plait_task *after;/* the task that must finish first (same comm and lane) */
    plait_step_fn gen;       /* NULL: `step` is the only step */
    uint64_t step_idx;
    uint64_t piece_off;      /* elements of the step moved (its send half, for SENDRECV) */
    uint64_t recv_off;       /* elements of a SENDRECV step's receive half moved */
    /* Single copy (exec.c). The descriptor the current step is reading (found
     * when the step had received sc_rx_base elements; its address in the
     * sender), whether the step forwards its whole dst as one descriptor once
     * it is complete (RECV_COPY_SEND, RECV_REDUCE_COPY_SEND), and the
     * descriptors this task has published that are not released yet: the task
     * is not done, and writes none of those bytes, until they are. */
    uint8_t sc_rx_active;
    uint8_t sc_fwd;
    uint8_t sc_npend;
    uint64_t sc_rx_addr;
    uint64_t sc_rx_base;
    struct plait_sc_pending sc_pend[PLAIT_SC_PENDING];
    int has_step;
    uint8_t step_ready;      /* the current step's connections exist (made on first use, exec.c) */
    int done;
    int is_fast;             /* runs on the small-message path (fastpath.c), not through FIFOs */
    int fast_next;           /* small-message path: the next rank whose data is consumed */
    uint32_t fast_polls;     /* small-message path: waits so far (paces the mismatch check) */
    uint32_t fast_sent;      /* small-message path over connections: the peers sent to (bit per rank) */
    uint32_t fast_idle;      /* small-message path over connections: passes that moved nothing */
    struct plait_step step;
};

struct plait_op {
    struct plait_comm *comm;
    int coll;
    const char *name;
    const char *sendbuff;
    char *recvbuff;
    size_t esize;
    struct plait_red red;
    char *scratch;           /* SCRATCH of the op's algorithm while it runs (NULL otherwise) */
    size_t scratch_bytes;    /* what the algorithm needs (0: none) */
    uint64_t seq;
    uint64_t coll_seq;       /* collectives: comm->coll_seq at issue (0 for point-to-point) */
    uint64_t fast_seq;       /* the small-message call this is (is_fast), or the next one (FIFO path) */
    uint64_t fast_tag;       /* small-message path: the tag every box of this call carries */
    size_t fast_bytes;       /* small-message path: bytes each rank sends each peer */
    const char *fast_own;    /* small-message path: this rank's own block (a copy when in place) */
    struct plait_sched_args args;
    int ntasks;
    struct plait_task *tasks;
    plait_stream_t stream;   /* where it runs (NULL: the calling thread) */
    int grouped;             /* issued inside a group (plait_group_start/end) */
    struct plait_plan plan;  /* how it runs (core/plan.c): executor, path, channels, the kernel's protocol */
    struct plait_op *next;   /* in a group's list */
};

/* The one init path: every public init calls it. start_root: this rank hosts
 * the bootstrap root at the id's address (PLAIT_COMM_ID, launchers). */
plait_result_t plait_comm_init_internal(plait_comm_t *comm_out, int nranks, const plait_unique_id_t *id, int rank,
                                        const plait_config_t *config, int start_root, const char *fn);

/* The shared secret from PLAIT_SECRET or PLAIT_SECRET_FILE (hashed to 32
 * bytes); *has_secret = 0 when neither is set. */
plait_result_t plait_secret_from_env(uint8_t secret[32], int *has_secret);

/* getpid(), cached (the cache is cleared in a forked child by the atfork
 * handler plait_fork_hooks registers: call that first, as comm_alloc, stream
 * and event creation do, before a pid is cached). */
void plait_fork_hooks(void);
pid_t plait_self_pid(void);

/* Validation shared by the API entry points. plait_comm_check_handle: comm is
 * a live communicator (the handle registry, base/handle.h: a NULL, destroyed,
 * aborted or garbage handle is PLAIT_ERR_INVALID_ARGUMENT naming it, and
 * nothing is read through it). plait_comm_check: that, and usable for work
 * now (initialized, not in error, not finalized or aborted, this process's). */
plait_result_t plait_comm_check(struct plait_comm *comm, const char *fn);

/* Whether comm is a live communicator (not destroyed, not aborted). The magic
 * is read atomically: an abort on another thread rewrites it. Only for a
 * handle the registry holds. */
static inline int plait_comm_is_live(const struct plait_comm *comm)
{
    return __atomic_load_n(&comm->magic, __ATOMIC_ACQUIRE) == PLAIT_COMM_MAGIC;
}

/* The failure of plait_comm_check_handle, out of line: which of NULL,
 * destroyed, aborted or garbage comm is. */
plait_result_t plait_comm_handle_error(struct plait_comm *comm, const char *fn);

static inline plait_result_t plait_comm_check_handle(struct plait_comm *comm, const char *fn)
{
    if (__builtin_expect(plait_handle_live(PLAIT_HANDLE_COMM, comm) && plait_comm_is_live(comm), 1))
        return PLAIT_SUCCESS;
    return plait_comm_handle_error(comm, fn);
}

/* Copies the asynchronous error message (under its lock). */
void plait_comm_async_msg(struct plait_comm *comm, char *buf, size_t len);

/* Runs ops to completion on the calling thread (the progress loop). Returns the
 * first error; failed communicators are marked in_error. */
plait_result_t plait_exec_run(struct plait_op *ops);

/* Frees a list of ops (without touching their communicators). */
void plait_op_free_list(struct plait_op *ops);

/* SCRATCH while an op runs: plait_exec_run takes it (the communicator's cached
 * buffer when large enough) and gives it back to the cache before it returns. */
plait_result_t plait_op_acquire_scratch(struct plait_op *op);
void plait_op_release_scratch(struct plait_op *op);

/* Nesting depth of the calling thread's open groups (0: none). */
int plait_group_depth(void);

/* Queues an op: into the thread's open group, else runs it now (or on its stream). */
plait_result_t plait_enqueue(struct plait_op *op, plait_stream_t stream);

/* Streams: submit a list of ops to run in order on the stream's worker. */
plait_result_t plait_stream_submit(plait_stream_t stream, struct plait_op *ops);
plait_result_t plait_stream_create_internal(struct plait_comm *comm, plait_stream_t *out);
/* A call's stream argument: PLAIT_SUCCESS for NULL or a live stream of this
 * process; PLAIT_ERR_INVALID_ARGUMENT naming it for a destroyed or garbage
 * one (nothing is read through it), PLAIT_ERR_INVALID_USAGE for a stream a
 * forked child inherited. */
plait_result_t plait_stream_check_live(plait_stream_t stream, const char *fn);
static inline plait_result_t plait_stream_check(plait_stream_t stream, const char *fn)
{
    return stream ? plait_stream_check_live(stream, fn) : PLAIT_SUCCESS;
}
int plait_stream_busy(plait_stream_t stream);
/* Whether `stream` wraps a CUDA stream (plait_stream_from_cuda); if so, and
 * cu_stream_out is not NULL, *cu_stream_out is that CUDA stream. NULL: 0. */
int plait_stream_cuda(plait_stream_t stream, void **cu_stream_out);

/* Records an error found asynchronously on comm (first one wins). */
void plait_comm_set_async_error(struct plait_comm *comm, plait_result_t res, const char *msg);

/* Transports and connections (core/comm_transport.c), the one module that
 * enumerates peers and owns the connection table.
 * setup: gives every transport its environment, picks each pair's transport
 * (the highest can_join), runs every transport's init in table order, then
 * makes the connections (every connect() before any accept()); the error
 * names the transport. teardown: releases them, in reverse order. */
plait_result_t plait_comm_transports_setup(struct plait_comm *comm);
void plait_comm_transports_teardown(struct plait_comm *comm);
/* The name of the transport that joins this rank to `peer` ("shm", ...). */
const char *plait_comm_transport_name(const struct plait_comm *comm, int peer);
/* The transport (an index in plait_transports) that joins ranks a and b: a
 * pure, symmetric function of what every rank knows, so both ends and third
 * parties agree. */
int plait_comm_pair_tp(const struct plait_comm *comm, int a, int b);
/* What the pair (a, b) is joined by (its transport's query; a zeroed info
 * with link PLAIT_LC_NONE before the transports are set up). */
void plait_comm_pair_info(const struct plait_comm *comm, int a, int b, struct plait_tp_info *info);
/* Whether `cls` of the pair (rank, peer) gets a connection: ring channels join
 * the peers the algorithms may use, the point-to-point class joins every pair
 * (self included). */
int plait_conn_needed(const struct plait_comm *comm, int rank, int peer, int cls);
/* Moves the data of every connection of comm's transports that need it
 * (sockets); *all_flushed = 0 when one still holds committed sends. */
plait_result_t plait_comm_transports_progress(struct plait_comm *comm, int *all_flushed);
/* Moves c's data (its transport's progress for c); a failure because the
 * peer went away names the rank that failed first, as a wait would. */
plait_result_t plait_conn_progress(struct plait_comm *comm, struct plait_conn *c);
/* The connection (peer, cls), made on first use: *out is NULL while it is
 * being made (the caller waits and asks again); an error when it cannot be. */
plait_result_t plait_comm_conn_get(struct plait_comm *comm, int peer, int cls, struct plait_conn **out);
/* Makes every connection this rank may need (the CUDA backend builds its
 * device connections from them at init), polling until each is made. */
plait_result_t plait_comm_connect_all(struct plait_comm *comm);
/* Connections made so far (tests, statistics). */
int plait_comm_conns_made(const struct plait_comm *comm);
/* Whether comm has connections that need progress (sockets). */
int plait_comm_needs_progress(const struct plait_comm *comm);

/* "rank R (host H)" for messages. */
const char *plait_peer_str(const struct plait_comm *comm, int peer, char *buf, size_t len);

/* Dead peers (core/comm_liveness.c). watch: a pidfd for every same-host peer
 * in another process (pidfds[p], -1 where none or where pidfd_open failed);
 * unwatch: closes them (the array itself is freed with the communicator). */
void plait_comm_watch_peers(struct plait_comm *comm);
void plait_comm_unwatch_peers(struct plait_comm *comm);

/* Frees every registration left on comm (core/comm_register.c). */
void plait_comm_regs_free(struct plait_comm *comm);

/* Checks for peers that are gone (pidfds) and for deaths other same-host ranks
 * have published; marks connections, sets dead_peer. */
void plait_comm_check_peers(struct plait_comm *comm);

/* What a waiting rank checks every millisecond: the abort flag, then the
 * peers (plait_comm_check_peers). PLAIT_ERR_REMOTE naming the aborted
 * communicator or the dead peer (published for same-host ranks), else
 * PLAIT_SUCCESS. The caller adds which operation waited. */
plait_result_t plait_comm_check_waiting(struct plait_comm *comm);

/* Publishes that `peer` died under one of our operations, so that ranks
 * waiting on us (not on it) name the rank that really died: in our shm header
 * for same-host ranks, and as a notice on the bootstrap ring for every rank. */
void plait_comm_publish_death(struct plait_comm *comm, int peer);

/* The error of a wait that cannot complete because `peer` is gone (its
 * connection closed, its process exited): names the rank that failed first,
 * which is `peer` itself unless it only saw another rank die. Where `peer`'s
 * own report can be read at once (same host, through shared memory) that
 * decides; otherwise the bootstrap ring does (a notice, or the neighbour's
 * connection ending without one), waited for up to PLAIT_BLAME_GRACE_S.
 * Publishes the death (plait_comm_publish_death) before it returns.
 * `what` says what the rank waited for. Returns PLAIT_ERR_REMOTE. */
plait_result_t plait_comm_peer_gone(struct plait_comm *comm, int peer, const char *what);
#define PLAIT_BLAME_GRACE_S 0.5

/* What a timed-out operation was waiting for, for its message: the peers and,
 * for each, what did not come (a static string). */
#define PLAIT_WAITS_MAX 8
struct plait_waits {
    int n;
    int peer[PLAIT_WAITS_MAX];
    const char *what[PLAIT_WAITS_MAX];
};
/* Adds (peer, what) unless it is there already or the list is full. */
void plait_waits_add(struct plait_waits *w, int peer, const char *what);
/* The PLAIT_ERR_TIMEOUT of op after timeout_s, naming the peers in w (the
 * executor and the small-message path build it the same way). */
plait_result_t plait_timeout_error(const struct plait_op *op, double timeout_s, const struct plait_waits *w);

#define PLAIT_OPS_ISSUED 0
#define PLAIT_OPS_COMPLETED 1
#define PLAIT_OPS_CULPRIT 2 /* rank + 1 of a peer seen dying mid-operation, 0 = none */

/* Ring/point-to-point lanes of a communicator's tasks. */
static inline int plait_lane_send(const struct plait_comm *c, int peer)
{
    return c->nchannels + peer;
}
static inline int plait_lane_recv(const struct plait_comm *c, int peer)
{
    return c->nchannels + c->nranks + peer;
}

/* Internal host identity ("hostname" + "/netns:<inode>") and process token. */
void plait_host_identity(char *buf, size_t len);
uint64_t plait_process_token(void);

/* Topology at init (comm_topo.c): fills mine->numa and topo_hash (after
 * loading or discovering the graph once per process; rank 0 dumps it to
 * PLAIT_TOPO_DUMP_FILE), then, once the node map is known, searches this
 * host's channels and agrees with every rank on the ring orders. */
plait_result_t plait_comm_topo_describe(struct plait_comm *comm, struct plait_rank_info *mine);
plait_result_t plait_comm_topo_setup(struct plait_comm *comm);
/* Whether a and b are neighbours in the ring order of channel `cls` (false
 * with rank order and for the point-to-point class). */
bool plait_comm_ring_neighbours(const struct plait_comm *comm, int a, int b, int cls);

#endif
