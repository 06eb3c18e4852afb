/* The net provider interface: how the net transport moves bytes between hosts.
 *
 * A provider is a const table of functions (struct plait_net_provider) shaped
 * after NCCL's newest network plugin ABI (ncclNet_v12), so that an adapter can
 * wrap any NCCL net plugin in a few lines per function, and plait's own
 * providers (transports/net/socket.c: TCP, "Socket") fill the same table.
 *
 * Objects, all opaque to the caller and owned by the provider:
 *   ctx          one per init(); holds the device list and the settings read
 *                at init. finalize() frees it (and whatever is left in it).
 *   listen comm  listen() on one device; accept() on it yields receive comms.
 *   send comm    connect() to a peer's listen handle; one direction: send.
 *   recv comm    accept(); one direction: receive.
 *   request      isend()/irecv()/iflush(); finished by test() saying done.
 *   mhandle      reg_mr()/reg_mr_dmabuf(); passed back to isend/irecv.
 *
 * Connection set-up: the receiving side calls listen(), which fills a handle
 * of PLAIT_NET_HANDLE_BYTES that the caller carries to the sending peer
 * (through the authenticated bootstrap); the peer calls connect() with it,
 * and the receiver calls accept(). Neither blocks: each returns
 * PLAIT_SUCCESS with *comm_out = NULL while the connection is still being
 * made, and the caller calls it again (connect with the same handle memory)
 * until a comm comes back. The caller bounds those retries by its own
 * deadline; what a connect abandoned mid-way holds is freed by finalize().
 *
 * Data: a message is one isend() matched by one buffer of an irecv(); the
 * messages of a comm arrive in the order they were sent. irecv() may post up
 * to max_recvs buffers at once (a grouped receive); the messages filling them
 * are consecutive isends, in any order among themselves, each going to the
 * first unfilled buffer with its tag. A message longer than its buffer is an
 * error (truncation), a shorter one is fine (test() gives its size).
 * Nothing waits: isend/irecv return *request_out = NULL when the comm has
 * PLAIT_NET_MAX_REQUESTS requests in flight (try again after test() finished
 * one), and test() makes progress and says whether the request is done.
 *
 * Errors are plait_result_t values with a last-error message (base/log.h,
 * plait_error) that names the peer's address and what was wrong. After an
 * error on a comm the comm is failed: every later call on it returns an error
 * again (with the same message); the caller closes it. Bytes from the network
 * are never trusted: a malformed frame fails the comm, never the process.
 * Two statuses say what the peer did: PLAIT_ERR_REMOTE, its side is closed,
 * reset or unreachable (it is gone, or going: what it sent before has been
 * received); PLAIT_ERR_INTERNAL on a receive, what came broke the protocol
 * (a malformed header, a message larger than its buffer, a tag nobody
 * posted): the peer may be alive, but nothing more from it is taken.
 *
 * Threads: calls on one comm (and on one listen comm) come from one thread at
 * a time; different comms, and different ctxs, may be used from different
 * threads at once. A provider may run helper threads of its own; close_*()
 * stops them before it returns.
 *
 * Growing the table: new members go at the end, `version` goes up, and a
 * caller reads a member only when `size` says the provider has it. */
#ifndef PLAIT_NET_PROVIDER_H
#define PLAIT_NET_PROVIDER_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"

/* The version of struct plait_net_provider this header describes. */
#define PLAIT_NET_PROVIDER_VERSION 1

/* Bytes of a listen handle (NCCL_NET_HANDLE_MAXSIZE). */
#define PLAIT_NET_HANDLE_BYTES 128

/* Requests one comm may have in flight (NCCL_NET_MAX_REQUESTS). */
#define PLAIT_NET_MAX_REQUESTS 32

/* Bytes of the name and PCI path strings in the properties. */
#define PLAIT_NET_NAME_BYTES 64
#define PLAIT_NET_PATH_BYTES 256

/* What memory a device can send from and receive into (ptr_support), and the
 * `type` of reg_mr (NCCL_PTR_HOST/CUDA/DMABUF, the same values). */
enum plait_net_ptr {
    PLAIT_NET_PTR_HOST = 0x1,   /* host memory */
    PLAIT_NET_PTR_CUDA = 0x2,   /* CUDA device memory, directly (GPUDirect RDMA) */
    PLAIT_NET_PTR_DMABUF = 0x4, /* device memory registered by DMA-BUF fd (reg_mr_dmabuf) */
};

/* The provider's logger, given to init(): the levels and subsystems of
 * base/log.h (PLAIT_LOG_WARN/INFO/TRACE, PLAIT_SUBSYS_*), the source file and
 * line, then printf arguments (ncclDebugLogger_t's shape). Thread-safe; may
 * be called from the provider's helper threads. */
typedef void (*plait_net_log_fn)(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* One device as get_properties() describes it (ncclNetProperties_v12). */
struct plait_net_properties {
    char name[PLAIT_NET_NAME_BYTES];     /* for logs: the interface or HCA name ("eth0", "mlx5_0") */
    char pci_path[PLAIT_NET_PATH_BYTES]; /* the device's PCI path in /sys (for topology), "" when it has none */
    uint64_t guid;                       /* identifies the NIC chip (ports/functions of one card share it) */
    unsigned ptr_support;                /* enum plait_net_ptr bits: what isend/irecv may point at */
    int reg_is_global;                   /* 1: an mhandle works on every comm of this ctx, not only the one it was
                                            registered with */
    int force_flush;                     /* 1: received device memory needs iflush() before the GPU reads it */
    int speed_mbps;                      /* port speed in Mbit/s (the tuner's bandwidth) */
    int port;                            /* port number on the device (0 when not meaningful) */
    float latency_us;                    /* one-way latency in microseconds; 0 = unknown */
    int max_comms;                       /* most comms (send + receive) the device can hold */
    int max_recvs;                       /* most buffers in one grouped irecv() */
    int max_requests;                    /* most requests in flight per comm (<= PLAIT_NET_MAX_REQUESTS) */
    size_t max_p2p_bytes;                /* largest message isend/irecv take */
};

struct plait_net_provider {
    /* sizeof(struct plait_net_provider) as the provider was built, and
     * PLAIT_NET_PROVIDER_VERSION then: members past `size` do not exist. */
    size_t size;
    unsigned version;
    /* For logs and selection ("Socket", as NCCL names its TCP network). */
    const char *name;

    /* Reads the provider's settings and finds its devices. comm_id: an
     * identifier of the communicator (for the provider's logs; 0 if none).
     * log: where the provider logs (NULL: plait's own log). *ctx_out is set on
     * success. Settings that are malformed fail with
     * PLAIT_ERR_INVALID_ARGUMENT naming the variable; no usable device is
     * PLAIT_ERR_SYSTEM saying what was seen. Thread-safe. */
    plait_result_t (*init)(void **ctx_out, uint64_t comm_id, plait_net_log_fn log);
    /* Number of devices (>= 1 after a successful init). */
    plait_result_t (*devices)(void *ctx, int *ndev_out);
    /* Properties of device 0..ndev-1; PLAIT_ERR_INVALID_ARGUMENT otherwise. */
    plait_result_t (*get_properties)(void *ctx, int dev, struct plait_net_properties *props_out);

    /* Listens on `dev`; fills handle[PLAIT_NET_HANDLE_BYTES] (what the peer
     * needs to connect, secrets included: carry it over an authenticated
     * channel only) and *listen_comm_out. */
    plait_result_t (*listen)(void *ctx, int dev, void *handle, void **listen_comm_out);
    /* Connects to the peer that made `handle` (from its listen()), from
     * `dev`. Non-blocking: *send_comm_out = NULL means "not yet": call again
     * with the same handle memory (the provider may keep its progress in
     * it). An error ends the attempt (nothing is left open). */
    plait_result_t (*connect)(void *ctx, int dev, void *handle, void **send_comm_out);
    /* Accepts the next connection made to this listen comm. Non-blocking like
     * connect. Connections that fail the provider's checks (a wrong handle, a
     * malformed hello) are dropped with a WARN and never returned. */
    plait_result_t (*accept)(void *listen_comm, void **recv_comm_out);

    /* Registers data[0..size) of `type` (one enum plait_net_ptr value) for
     * use on `comm` (or every comm when reg_is_global); *mhandle_out is passed
     * to isend/irecv/iflush and to dereg_mr. A type outside ptr_support is
     * PLAIT_ERR_INVALID_USAGE. */
    plait_result_t (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle_out);
    /* The same for device memory exported as a DMA-BUF fd (at `offset` in it). */
    plait_result_t (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                    void **mhandle_out);
    plait_result_t (*dereg_mr)(void *comm, void *mhandle);

    /* Sends data[0..size) with `tag`. The buffer must stay untouched until
     * test() says done. mhandle: from reg_mr, or NULL where the device needs
     * no registration for host memory. *request_out = NULL: too many
     * requests in flight, try again. */
    plait_result_t (*isend)(void *send_comm, const void *data, size_t size, int tag, void *mhandle,
                            void **request_out);
    /* Posts n (1..max_recvs) buffers data[i] of sizes[i] bytes for messages
     * with tags[i] (see "Data" above); one request for all of them.
     * mhandles may be NULL, else n entries. *request_out = NULL: try again. */
    plait_result_t (*irecv)(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
                            void **mhandles, void **request_out);
    /* Makes received device memory visible to the GPU (force_flush, CUDA
     * pointers). *request_out = NULL: nothing to flush (done already). */
    plait_result_t (*iflush)(void *recv_comm, int n, void **data, const size_t *sizes, void **mhandles,
                             void **request_out);
    /* Progresses the request's comm and says whether the request is done.
     * When *done_out is 1, sizes_out (may be NULL) gets the bytes of each
     * message (one for isend, n for an irecv of n) and the request is freed:
     * it must not be tested again. An error also finishes the request. */
    plait_result_t (*test)(void *request, int *done_out, size_t *sizes_out);

    /* Close a comm: requests still in flight are abandoned (their buffers
     * are no longer touched once this returns), helper threads are joined,
     * sockets closed, memory freed. NULL is a no-op. Always frees the comm. */
    plait_result_t (*close_send)(void *send_comm);
    plait_result_t (*close_recv)(void *recv_comm);
    plait_result_t (*close_listen)(void *listen_comm);

    /* Frees the ctx (and connections still being made with it). Every comm
     * made from it must be closed first. */
    plait_result_t (*finalize)(void *ctx);
};

/* The TCP provider (transports/net/socket.c). */
extern const struct plait_net_provider plait_net_socket;
/* The control socket of one of its send or recv comms, -1 for NULL (tests
 * write on it what a hostile peer would; diagnostics). */
int plait_net_socket_comm_fd(const void *comm);

#endif
