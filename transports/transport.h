/* Transports: how bytes reach a peer (docs/architecture.md, section 4).
 *
 * A connection joins this rank and one peer for one connection class (a ring
 * channel, or the point-to-point class). Each direction is a FIFO of `nslots`
 * slots of `slot_bytes`:
 *   - the slots, the per-slot byte counts and the `tail` counter live with the
 *     receiver; the sender fills a slot and its size, then publishes them with a
 *     release store of tail; the receiver acquires tail before reading them;
 *   - the `head` counter (credit) lives with the sender; the receiver
 *     release-stores it after draining a slot, and the sender acquires it before
 *     overwriting one.
 * Counters are 64-bit and monotonic, each on its own 64-byte line.
 *
 * For shm (other processes) and inproc (threads of one process) the FIFO memory
 * is shared and the executor works on the peer's memory directly. For net
 * (other hosts) the same FIFO logic runs on local staging memory, and the
 * transport's progress() moves slots through a net provider and bumps the
 * counters as if the peer had.
 *
 * This header knows nothing of algorithms. */
#ifndef PLAIT_TRANSPORT_H
#define PLAIT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"
#include "algorithms/stepper.h"

struct plait_conn;

/* ------------------------------------------------------------ the transport boundary
 *
 * A transport is a const ops table (struct plait_transport). The core
 * (core/comm_transport.c) owns peer enumeration and the connection table: it
 * asks every transport whether it can join each pair of ranks (the highest
 * priority wins), gives each transport a narrow environment (struct
 * plait_tp_env: the ranks, the settings it reads, the exchange over the
 * bootstrap) rather than the communicator, and asks the chosen transport for
 * each connection it needs. A transport includes nothing of the core. */

#define PLAIT_TRANSPORT_VERSION 1
/* Transports a communicator may hold. */
#define PLAIT_TP_MAX 8
/* The largest connection blob a transport may exchange per connection. */
#define PLAIT_TP_BLOB_BYTES 128
/* connect() flags */
#define PLAIT_TP_BOTH_NOW 1u

/* What a transport may know of each rank (from init's allgather). */
struct plait_tp_rank {
    int32_t host;           /* dense host index */
    int32_t pid;
    uint64_t process_token; /* random per process */
};

/* The narrow environment of a transport, valid from init to fini. */
struct plait_tp_env {
    uint32_t size;          /* sizeof(struct plait_tp_env) of the core that filled it */
    int rank;
    int nranks;
    int ncls;               /* connection classes: ring channels, then the point-to-point class */
    const struct plait_tp_rank *ranks; /* [nranks] */
    /* settings (agreed on every rank unless marked) */
    uint32_t nslots;        /* FIFO depth */
    size_t slot_bytes;      /* FIFO slot size */
    int force_net;          /* PLAIT_TRANSPORT=socket: every pair of distinct ranks over the net transport */
    int cma;                /* PLAIT_CMA: enum plait_tp_cma */
    uint64_t cma_min_bytes; /* for the log only */
    double timeout_s;       /* setup deadline, <= 0 none (this rank's) */
    const char *net_provider; /* PLAIT_NET_PROVIDER: "" the default (socket), "socket" */
    const uint8_t *secret;  /* the communicator's 32-byte secret (connection authentication) */
    /* Bytes the core wants in each rank's memory segment, shared by every rank
     * of the host that this transport joins (operation counters, the
     * small-message boxes): see region() below. 0 when none. */
    size_t region_bytes;
    /* Whether a may ever connect with b on class cls (the algorithms' peers,
     * every pair for point-to-point): a pure function every rank computes the
     * same; a transport refuses a hello for anything else. */
    int (*wanted)(const void *core, int a, int b, int cls);
    /* The exchange over the bootstrap: collective over the communicator. */
    plait_result_t (*allgather)(void *core, void *data, size_t size);
    plait_result_t (*barrier)(void *core);
    /* "rank R (host H)" for messages. */
    const char *(*peer_str)(const void *core, int peer, char *buf, size_t len);
    void *core;
};

/* PLAIT_CMA for a transport. */
enum plait_tp_cma { PLAIT_TP_CMA_AUTO = 0, PLAIT_TP_CMA_OFF = 1, PLAIT_TP_CMA_REQUIRE = 2 };

/* Link classes: what the tuner and the model are told a pair's link is. */
enum plait_link_class {
    PLAIT_LC_NONE = 0,
    PLAIT_LC_LOCAL = 1,  /* threads of one process: plain loads and stores */
    PLAIT_LC_SHM = 2,    /* processes of one host: shared memory */
    PLAIT_LC_NET = 3,    /* a network (the net transport: TCP today) */
};

/* How a connection's receiver reads descriptors; NONE: neither end sends any. */
enum plait_sc_mode {
    PLAIT_SC_NONE = 0,
    PLAIT_SC_READ = 1,  /* the receiver reads the sender's memory through the transport's remote_read */
    PLAIT_SC_LOCAL = 2, /* the sender's memory is this process's: the receiver reads it in place */
};

/* What the pair (a, b) joined by a transport offers. */
struct plait_tp_info {
    int link;             /* enum plait_link_class */
    double bw_GBps;       /* per direction, 0 = unknown: the model's calibrated constants decide */
    double lat_us;        /* one small message, 0 = unknown */
    int sc;               /* enum plait_sc_mode the transport may offer on its connections (the
                           * connection's own sc_mode says what it does) */
    int region;           /* it can hold the core's region (env->region_bytes) in each rank's segment */
    int host_mem_shared;  /* a connection's FIFO memory is host memory both ranks address (else it is
                           * staging that progress() moves: a GPU reaches it through the proxy) */
    int can_register;     /* reg() pins or registers memory (else registration is a no-op) */
    unsigned device_mem;  /* enum plait_tp_mem bits: what memory the link itself could move from and
                           * into (a net provider's ptr_support, agreed by both ranks); the core's
                           * FIFOs are host memory whatever it says */
};

/* What memory a link can move directly (plait_tp_info.device_mem). Without
 * PLAIT_TP_MEM_CUDA/DMABUF, device buffers are staged through host memory by
 * the CUDA backend's proxy. */
enum plait_tp_mem {
    PLAIT_TP_MEM_HOST = 0x1,
    PLAIT_TP_MEM_CUDA = 0x2,   /* CUDA device pointers (GPUDirect RDMA) */
    PLAIT_TP_MEM_DMABUF = 0x4, /* device memory registered by DMA-BUF */
};

struct plait_transport {
    uint32_t size;     /* sizeof(struct plait_transport) the table was built with: later fields past it do not exist */
    uint32_t version;  /* PLAIT_TRANSPORT_VERSION */
    const char *name;  /* in logs and messages ("shm", "net") */
    /* 0 when this transport cannot join ranks a and b, else its priority (the
     * highest wins). A pure, symmetric function of env: both ends and third
     * parties agree. a == b is the point-to-point class's self connection. */
    int (*can_join)(const struct plait_tp_env *env, int a, int b);
    /* What a pair this transport joins offers (pure, as can_join). */
    void (*query)(const struct plait_tp_env *env, int a, int b, struct plait_tp_info *info);
    /* Collective over the communicator: every rank calls it for every
     * transport, in table order, even with no peer on it (it may allgather).
     * Makes the per-communicator context (*ctx; NULL when the transport has
     * nothing to do on this rank). env stays valid until fini. */
    plait_result_t (*init)(const struct plait_tp_env *env, void **ctx);
    /* Connections, in two halves, neither of which blocks: connect() starts
     * this rank's side of (peer, cls) and writes blob_bytes (<=
     * PLAIT_TP_BLOB_BYTES; 0: no blob) for the peer; accept() takes the peer's
     * blob (NULL without one) and returns the connection, or
     * PLAIT_IN_PROGRESS while the peer's side has not come (call it again:
     * each call moves the context's handshakes), or PLAIT_ERR_TIMEOUT once
     * `deadline` (plait_deadline(); 0: none, the caller's wait decides) has
     * passed. Both ends call both halves for each connection, at init (the
     * ones the core makes then) or when a step first needs it, in any order
     * and from any thread (the core serializes a communicator's calls).
     * PLAIT_TP_BOTH_NOW in flags: the peer is making its half of this
     * connection now too (init), so this end need not start anything the
     * peer will (a socket's higher rank does not dial). Without it, this
     * end's half must make the connection even when the peer asks for it
     * only later (a send that completes before its peer's receive). */
    size_t blob_bytes;
    plait_result_t (*connect)(void *ctx, int peer, int cls, unsigned flags, void *blob);
    plait_result_t (*accept)(void *ctx, int peer, int cls, const void *peer_blob, double deadline,
                             struct plait_conn **conn);
    /* The core's region (env->region_bytes) in `owner`'s segment, NULL when
     * this transport holds none there. NULL op: no region. */
    char *(*region)(void *ctx, int owner);
    /* Memory registration: a handle for [buf, buf + len) (NULL op: nothing
     * to register). */
    plait_result_t (*reg)(void *ctx, void *buf, size_t len, void **handle);
    void (*dereg)(void *ctx, void *handle);
    /* Moves data without blocking: for `conn` (NULL: every connection of the
     * context; a UCX worker or a completion queue serves many). On failure
     * *failed is the connection that failed. NULL op: nothing to move (the
     * FIFO memory is the peer's). */
    plait_result_t (*progress)(void *ctx, struct plait_conn *conn, struct plait_conn **failed);
    /* 1 when every committed send of `conn` (NULL: of every connection of the
     * context) has left this process's staging memory. */
    int (*is_flushed)(void *ctx, const struct plait_conn *conn);
    /* Single copy (PLAIT_SC_READ): reads len bytes at `addr` in the peer's
     * memory into dst. Returns 0, or an errno (ESRCH: the peer is gone); *done
     * counts the bytes read before a failure. */
    int (*remote_read)(const struct plait_conn *conn, void *dst, uint64_t addr, size_t len, size_t *done);
    /* Frees the context and its connections (not collective). */
    void (*fini)(void *ctx);
};

/* The transports, in set-up order (transports/registry.c). */
extern const struct plait_transport *const plait_transports[];
extern const int plait_ntransports;

/* The index in plait_transports of the transport that joins a and b (the
 * highest priority), -1 when none can. Pure, symmetric. */
int plait_tp_choose(const struct plait_tp_env *env, int a, int b);

extern const struct plait_transport plait_transport_shm;    /* processes on one host */
extern const struct plait_transport plait_transport_inproc; /* threads of one process */
/* Connection objects between threads that wait in the process-wide registry
 * for their second end (tests: none is left once every communicator is
 * destroyed). */
int plait_inproc_objects_listed(void);

/* Single copy (docs/performance.md, "Single-copy (CMA)"). A slot whose size word
 * has PLAIT_SLOT_DESC set holds a struct plait_sc_desc instead of data: where the
 * bytes are in the sender's own memory. The receiver reads them from there
 * itself (process_vm_readv for shm, memcpy for inproc, where the peer is a
 * thread of this process) and releases the slot only once it has read them
 * all; the sender keeps them valid and unchanged until then (its head passes
 * the slot). Ordering as for data: the sender's writes of the bytes and of the
 * descriptor come before its release store of tail, which the receiver
 * acquires before reading either; the receiver's reads (process_vm_readv has
 * returned) come before its release store of head, which the sender acquires
 * before it writes those bytes again or returns them to the user. */
#define PLAIT_SLOT_DESC 0x80000000u

struct plait_sc_desc {
    uint64_t addr;  /* in the sender's address space */
    uint64_t len;   /* bytes */
    /* Readers now reading (low bits) | PLAIT_SC_REVOKED. A receiver adds 1
     * before each read and takes it off after; a sender whose operation fails
     * with the descriptor unreleased sets REVOKED and waits until no reader is
     * left before it returns (and the user may free the bytes). Both are
     * sequentially consistent read-modify-writes of this word, so either the
     * reader sees REVOKED and reads nothing, or the sender sees the reader and
     * waits for it. */
    uint64_t state;
};
#define PLAIT_SC_REVOKED (1ull << 63)


struct plait_conn {
    const struct plait_transport *tp;
    void *ctx;              /* the transport's context this connection belongs to */
    int peer;
    int cls;
    int needs_progress;     /* the executor must call tp->progress */
    uint32_t nslots;
    size_t slot_bytes;
    /* send direction */
    char *tx_slots;
    uint32_t *tx_sizes;
    uint64_t *tx_tail;       /* written by us (release) */
    const uint64_t *tx_head; /* written by the receiver (acquire) */
    uint64_t tx_posted;
    /* receive direction */
    const char *rx_slots;
    const uint32_t *rx_sizes;
    const uint64_t *rx_tail; /* written by the sender (acquire) */
    uint64_t *rx_head;       /* written by us (release) */
    uint64_t rx_consumed;
    /* set when the peer is known gone (process exit, EOF); data already in the
     * FIFO is still consumed, only a wait for more becomes an error. Atomic:
     * plait_comm_check_peers (maybe on the CUDA proxy thread) and the net
     * transport's progress set it while the executor's waits read it
     * (plait_conn_peer_gone). */
    int peer_gone;
    void *priv;              /* transport's own state */
    /* single copy: enum plait_sc_mode (both ends agree: set at setup from an
     * allgathered probe), the peer's pid for process_vm_readv, a slot_bytes
     * buffer (one per communicator and transport) that reducing steps read a
     * piece into, and counts of descriptors sent and read, which only this
     * rank's executor writes (for tests and statistics) */
    int sc_mode;
    int32_t sc_pid;
    char *sc_bounce;
    uint64_t sc_tx_descs;
    uint64_t sc_rx_descs;
};

/* Whether the peer of `c` is known gone (acquire: what it left before is
 * read after). The per-step waits call it: one atomic load, no lock. */
static inline int plait_conn_peer_gone(const struct plait_conn *c)
{
    return __atomic_load_n(&c->peer_gone, __ATOMIC_ACQUIRE);
}

/* A descriptor a task has published and its receiver has not released yet:
 * the bytes [addr, addr + len) must stay unchanged until tx_head passes seq. */
struct plait_sc_pending {
    struct plait_conn *conn;
    uint64_t seq;
    const char *addr;
    uint64_t len;
    uint64_t *state; /* the descriptor's state word, in the receiver's slot */
};

static inline uint64_t plait_ld_acquire_u64(const uint64_t *p)
{
    return plait_ld_acquire_sys(p);
}

static inline void plait_st_release_u64(uint64_t *p, uint64_t v)
{
    plait_st_release_sys(p, v);
}

/* The next free send slot, or NULL when the receiver holds every slot. */
static inline void *plait_conn_send_slot(struct plait_conn *c)
{
    if (!plait_fifo_can_send(c->tx_posted, plait_ld_acquire_u64(c->tx_head), c->nslots))
        return NULL;
    return c->tx_slots + (size_t)plait_fifo_slot(c->tx_posted, c->nslots) * c->slot_bytes;
}

/* Publishes the slot returned by plait_conn_send_slot holding `bytes`. */
static inline void plait_conn_send_commit(struct plait_conn *c, uint32_t bytes)
{
    c->tx_sizes[plait_fifo_slot(c->tx_posted, c->nslots)] = bytes;
    c->tx_posted++;
    plait_st_release_u64(c->tx_tail, c->tx_posted);
}

/* The next filled receive slot (and its size), or NULL when none has arrived. */
static inline const void *plait_conn_recv_slot(struct plait_conn *c, uint32_t *bytes_out)
{
    if (!plait_fifo_can_recv(plait_ld_acquire_u64(c->rx_tail), c->rx_consumed))
        return NULL;
    size_t i = plait_fifo_slot(c->rx_consumed, c->nslots);
    *bytes_out = c->rx_sizes[i];
    return c->rx_slots + i * c->slot_bytes;
}

/* Gives the slot returned by plait_conn_recv_slot back to the sender. */
static inline void plait_conn_recv_release(struct plait_conn *c)
{
    /* atomic: the small-message path's checks read it from other lanes */
    const uint64_t next = c->rx_consumed + 1;
    __atomic_store_n(&c->rx_consumed, next, __ATOMIC_RELAXED);
    plait_st_release_u64(c->rx_head, next);
}

#endif
