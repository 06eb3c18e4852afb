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
 * is shared and the executor works on the peer's memory directly. For tcp the
 * same FIFO logic runs on local staging memory, and the transport's progress()
 * moves slots over TCP and bumps the counters as if the peer had.
 *
 * This header knows nothing of algorithms. */
#ifndef PLAIT_TRANSPORT_H
#define PLAIT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"
#include "algorithms/stepper.h"

struct plait_comm;
struct plait_conn;

struct plait_transport {
    const char *name;
    /* Builds the connections of this transport for every peer pair that
     * comm->tp_of[] assigns to it. Collective over the communicator (uses the
     * bootstrap); called once at init by every rank, in transport table order. */
    plait_result_t (*setup)(struct plait_comm *comm);
    /* Moves data for one connection without blocking. */
    plait_result_t (*progress)(struct plait_conn *conn);
    /* 1 when every committed send has left this process's staging memory. */
    int (*is_flushed)(const struct plait_conn *conn);
    /* Frees the transport's per-communicator state (connections are freed with it). */
    void (*teardown)(struct plait_comm *comm);
};

extern const struct plait_transport plait_transport_shm;    /* processes on one host */
extern const struct plait_transport plait_transport_inproc; /* threads of one process */
extern const struct plait_transport plait_transport_tcp;    /* TCP, any two hosts ("socket" to users) */
/* A TCP transport connection's file descriptor, -1 for another
 * transport's (tests forge frames on it; diagnostics). */
int plait_tcp_conn_fd(const struct plait_conn *conn);

enum plait_tp_id { PLAIT_TP_INPROC = 0, PLAIT_TP_SHM = 1, PLAIT_TP_TCP = 2, PLAIT_TP_COUNT };

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

/* How a connection's receiver reads descriptors; NONE: neither end sends any. */
enum plait_sc_mode {
    PLAIT_SC_NONE = 0,
    PLAIT_SC_CMA = 1,   /* the peer is another process of this host: process_vm_readv */
    PLAIT_SC_LOCAL = 2, /* the peer is a thread of this process (or this rank): memcpy */
};

struct plait_conn {
    const struct plait_transport *tp;
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
     * plait_comm_check_peers (maybe on the CUDA proxy thread) and the tcp
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
    c->rx_consumed++;
    plait_st_release_u64(c->rx_head, c->rx_consumed);
}

/* Whether `cls` of the pair (rank, peer) gets a connection: ring channels join
 * ring neighbours, the point-to-point class joins every pair (self included). */
int plait_conn_needed(const struct plait_comm *comm, int rank, int peer, int cls);

/* The transport (enum plait_tp_id) that joins ranks a and b: a pure, symmetric
 * function of what every rank knows, so both ends and third parties agree. */
int plait_pair_transport(const struct plait_comm *comm, int a, int b);

/* "rank R (host H)" for messages. */
const char *plait_peer_str(const struct plait_comm *comm, int peer, char *buf, size_t len);

#endif
