/*
 * plait — collective communication for machine learning, on CPUs and GPUs.
 *
 * This is the only public header. Every function returns a plait_result_t whose
 * values equal NCCL's (0-7 as in NCCL 2.28, 8 = timeout as in NCCL 2.30); the
 * human-readable detail of the last failure on the calling thread is available
 * from plait_get_last_error().
 *
 * Threading: a communicator is used by one thread at a time (as in NCCL); group
 * state is per thread; plait_comm_abort() and plait_comm_get_async_error() may be
 * called from any thread at any time.
 *
 * Handles (plait_comm_t, plait_stream_t, plait_event_t, plait_window_t and
 * registration handles) are looked up in registries of live handles before
 * anything is read through them: a destroyed, aborted, never-made or garbage
 * handle, or one of another kind, is PLAIT_ERR_INVALID_ARGUMENT naming the
 * argument, never a crash or a hang. A handle a forked child inherited is
 * PLAIT_ERR_INVALID_USAGE there, except for its destroy (which frees the
 * child's copy).
 *
 * Buffers: each call's buffers are classified (host, registered host, device,
 * managed memory; no CUDA context is created for that). Host and registered
 * host memory run on the CPU backend; device (cudaMalloc) and managed
 * (cudaMallocManaged) memory run on the CUDA backend, whose kernels interpret
 * the same schedules. The buffers of one call must go to one backend: host
 * with device memory in one call is PLAIT_ERR_INVALID_USAGE naming both
 * buffers and their kinds. Device buffers need a communicator created while
 * the calling thread had a current CUDA context (cudaSetDevice, as NCCL), on
 * that device (else PLAIT_ERR_INVALID_USAGE). Every rank of a communicator
 * has a current CUDA device at init, or none (else init fails naming a
 * rank); several ranks may share one GPU (ranks of one process sharing a GPU
 * must then issue on distinct CUDA streams: the default stream of the shared
 * context would run their kernels one after the other, and they wait on each
 * other).
 */
#ifndef PLAIT_H
#define PLAIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PLAIT_MAJOR 0
#define PLAIT_MINOR 1
#define PLAIT_PATCH 0
/* Version code as an integer: major*10000 + minor*100 + patch (NCCL's scheme). */
#define PLAIT_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define PLAIT_VERSION_CODE PLAIT_VERSION(PLAIT_MAJOR, PLAIT_MINOR, PLAIT_PATCH)

/* Results. The numeric values are NCCL's, so a caller may cast between them. */
typedef enum {
    PLAIT_SUCCESS = 0,
    PLAIT_ERR_UNHANDLED_CUDA = 1,  /* a CUDA call failed */
    PLAIT_ERR_SYSTEM = 2,          /* a system call failed (socket, mmap, thread, ...) */
    PLAIT_ERR_INTERNAL = 3,        /* a bug in plait, or a peer that broke the protocol */
    PLAIT_ERR_INVALID_ARGUMENT = 4,/* an argument is wrong; nothing was started */
    PLAIT_ERR_INVALID_USAGE = 5,   /* the call is not valid now (or not supported) */
    PLAIT_ERR_REMOTE = 6,          /* a peer failed, died or disconnected */
    PLAIT_IN_PROGRESS = 7,         /* non-blocking communicator: the call goes on */
    PLAIT_ERR_TIMEOUT = 8,         /* a deadline passed (PLAIT_TIMEOUT, PLAIT_COLL_TIMEOUT) */
    PLAIT_NUM_RESULTS = 9
} plait_result_t;

/* Data types, in NCCL's order and with NCCL's values. */
typedef enum {
    PLAIT_INT8 = 0,
    PLAIT_UINT8 = 1,
    PLAIT_INT32 = 2,
    PLAIT_UINT32 = 3,
    PLAIT_INT64 = 4,
    PLAIT_UINT64 = 5,
    PLAIT_FLOAT16 = 6,
    PLAIT_FLOAT32 = 7,
    PLAIT_FLOAT64 = 8,
    PLAIT_BFLOAT16 = 9,
    PLAIT_FLOAT8_E4M3 = 10,
    PLAIT_FLOAT8_E5M2 = 11,
    PLAIT_NUM_TYPES = 12
} plait_datatype_t;

/* Reduction operations. Values at or above PLAIT_NUM_OPS are created at run time
 * by plait_redop_create_premulsum() and belong to one communicator. */
typedef enum {
    PLAIT_SUM = 0,
    PLAIT_PROD = 1,
    PLAIT_MAX = 2,
    PLAIT_MIN = 3,
    PLAIT_AVG = 4,
    PLAIT_NUM_OPS = 5,
    PLAIT_MAX_REDOP = 0x7fffffff
} plait_redop_t;

/* Where the scalar of a premultiplied sum lives (NCCL's ncclScalarResidence_t). */
typedef enum {
    PLAIT_SCALAR_DEVICE = 0, /* a pointer, read each time a collective using the op is issued */
    PLAIT_SCALAR_HOST_IMMEDIATE = 1 /* copied when the op is created */
} plait_scalar_residence_t;

/* Opaque id that ties the ranks of one communicator together: the root's address
 * and a random secret. Pass it to every rank by any means (MPI_Bcast, a file). */
#define PLAIT_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[PLAIT_UNIQUE_ID_BYTES];
} plait_unique_id_t;

typedef struct plait_comm *plait_comm_t;
typedef struct plait_stream *plait_stream_t;
typedef struct plait_event *plait_event_t;

#define PLAIT_CONFIG_UNDEF_INT INT32_MIN
#define PLAIT_CONFIG_MAGIC 0x706c6169u /* "plai" */

/* Communicator configuration. Always start from PLAIT_CONFIG_INITIALIZER; fields
 * left undefined take their defaults (environment, then built-in). New fields are
 * only ever appended: a config whose `size` is smaller than this struct is read up
 * to its size. */
typedef struct {
    size_t size;          /* sizeof(plait_config_t) of the caller */
    unsigned int magic;   /* PLAIT_CONFIG_MAGIC */
    unsigned int version; /* PLAIT_VERSION_CODE of the caller */
    int blocking;         /* 1 (default): calls return when done; 0: they may return PLAIT_IN_PROGRESS */
    int min_ctas;         /* GPU: minimum CTAs (channels) per collective; CPU: minimum channels */
    int max_ctas;         /* GPU: CTA cap (leave SMs to compute); CPU: maximum channels */
    const char *name;     /* shown in logs and errors; copied at init; NULL = none */
} plait_config_t;

#define PLAIT_CONFIG_INITIALIZER                                                            \
    {                                                                                       \
        sizeof(plait_config_t), PLAIT_CONFIG_MAGIC, PLAIT_VERSION_CODE,                     \
            PLAIT_CONFIG_UNDEF_INT, PLAIT_CONFIG_UNDEF_INT, PLAIT_CONFIG_UNDEF_INT, NULL    \
    }

/* Color for plait_comm_split() that leaves the calling rank out (it gets NULL). */
#define PLAIT_SPLIT_NOCOLOR (-1)

/* ---------------------------------------------------------------- version, errors */

/* Writes PLAIT_VERSION_CODE of the library (not of the header) to *version.
 * Returns PLAIT_ERR_INVALID_ARGUMENT if version is NULL. Thread-safe. */
plait_result_t plait_get_version(int *version);

/* A static string naming the result code ("invalid argument", ...); never NULL.
 * Thread-safe. */
const char *plait_get_error_string(plait_result_t result);

/* The detailed message of the last failure on the calling thread (which argument,
 * which peer rank and host, the OS error), or "" if no call on this thread has
 * failed yet; a later success does not clear it. The string belongs to
 * the library and stays valid until the thread's next plait call. `comm` may be
 * NULL; when given and an asynchronous error was found on it by a background
 * thread, that error's message is returned instead. */
const char *plait_get_last_error(plait_comm_t comm);

/* ---------------------------------------------------------------- communicators */

/* Creates a new unique id for a communicator: starts a listening socket for the
 * bootstrap root in this process (on PLAIT_SOCKET_IFNAME's address) and draws a
 * random secret. With PLAIT_COMM_ID=host:port set, it starts nothing: the id
 * names that address (rank 0 hosts the root at init) and carries the secret of
 * PLAIT_SECRET/PLAIT_SECRET_FILE, or none (a WARN says so). Call it on one rank
 * only and pass the id to the others. Returns PLAIT_ERR_SYSTEM when no address can be
 * bound, PLAIT_ERR_INVALID_ARGUMENT if id is NULL. Thread-safe. */
plait_result_t plait_get_unique_id(plait_unique_id_t *id);

/* Creates the communicator of `rank` among `nranks` ranks that share `id`. Blocks
 * until every rank has joined (deadline: PLAIT_TIMEOUT seconds), unless the config
 * asks for a non-blocking communicator, in which case it returns PLAIT_IN_PROGRESS
 * at once and *comm_out is usable with plait_comm_get_async_error() (which
 * returns PLAIT_IN_PROGRESS, then PLAIT_SUCCESS or the failure).
 *
 * Failures: PLAIT_ERR_INVALID_ARGUMENT (NULL comm_out, nranks < 1, rank out of
 * range, a config with a bad size/magic, a malformed id or environment value);
 * PLAIT_ERR_TIMEOUT (some rank never came); PLAIT_ERR_REMOTE (a rank failed or
 * refused us); PLAIT_ERR_INVALID_USAGE (a rank's settings that must agree differ:
 * the message names the rank and the setting); PLAIT_ERR_SYSTEM. On failure
 * *comm_out is not written (blocking mode). With PLAIT_COMM_ID set, the id names
 * that address and rank 0 hosts the root. */
plait_result_t plait_comm_init_rank(plait_comm_t *comm_out, int nranks, plait_unique_id_t id, int rank);
plait_result_t plait_comm_init_rank_config(plait_comm_t *comm_out, int nranks, plait_unique_id_t id, int rank,
                                           const plait_config_t *config);

/* Creates `ndev` communicators, ranks 0..ndev-1, in this process (one thread per
 * rank is used internally during init). `devlist` names a device per rank for the
 * CUDA backend; it may be NULL (host-only). The communicators are then driven from
 * any thread, typically all of them inside one group. Failures as init_rank; on
 * failure nothing is created. */
plait_result_t plait_comm_init_all(plait_comm_t *comms_out, int ndev, const int *devlist);

/* Creates a communicator from the launcher's environment, looked for in this
 * order: plait's own PLAIT_RANK/PLAIT_NRANKS; torchrun (RANK, WORLD_SIZE); Open
 * MPI (OMPI_COMM_WORLD_RANK/SIZE); Slurm (SLURM_PROCID, SLURM_NTASKS); PMI
 * (PMI_RANK/PMI_SIZE). The root's address is PLAIT_COMM_ID (host:port), else
 * MASTER_ADDR and MASTER_PORT + PLAIT_PORT_OFFSET (default 1: plait never takes
 * torchrun's TCPStore port); rank 0 hosts the root. The secret comes from PLAIT_SECRET or the file PLAIT_SECRET_FILE;
 * without one the bootstrap is unauthenticated and each process says so once on
 * stderr, whatever PLAIT_DEBUG. `config` may be
 * NULL. Failures: PLAIT_ERR_INVALID_USAGE when no launcher environment is found
 * (the message lists what was looked for), otherwise as init_rank. */
plait_result_t plait_comm_init_from_env(plait_comm_t *comm_out, const plait_config_t *config);

/* Splits `comm` into sub-communicators: ranks with the same `color` form one,
 * ordered by (`key`, parent rank). Collective over `comm`. A rank passing
 * PLAIT_SPLIT_NOCOLOR gets *newcomm_out = NULL. The child has its own connections
 * and survives the parent's destruction. `config` may be NULL (inherit the
 * parent's). Failures: PLAIT_ERR_INVALID_ARGUMENT (NULL comm or newcomm_out, color
 * < -1), and those of init. */
plait_result_t plait_comm_split(plait_comm_t comm, int color, int key, plait_comm_t *newcomm_out,
                                const plait_config_t *config);

/* Waits for every operation issued on `comm` through its non-blocking path to
 * finish and then makes it inert for new work. Local: it exchanges no message
 * (every rank's operations complete only together anyway). Returns the first
 * error of the communicator's work, if any. */
plait_result_t plait_comm_finalize(plait_comm_t comm);

/* Frees every resource of `comm` (memory, segments, sockets, threads), after
 * waiting for its work queued on any stream. Call it after plait_comm_finalize()
 * or instead of it; not after plait_comm_abort(), which frees the communicator
 * itself. `comm` is invalid afterwards: calls with it (destroy included) return
 * PLAIT_ERR_INVALID_ARGUMENT. NULL is accepted (no-op). In a forked child,
 * destroying an inherited communicator frees the child's copies only. */
plait_result_t plait_comm_destroy(plait_comm_t comm);

/* Aborts every wait on `comm` from any thread: collectives in flight return
 * PLAIT_ERR_REMOTE ("aborted"), then the communicator is freed. Safe to call while
 * another thread is inside a collective on `comm`: that call returns, and the
 * memory is released when it has. NULL is accepted (no-op). */
plait_result_t plait_comm_abort(plait_comm_t comm);

/* The communicator's asynchronous state: PLAIT_IN_PROGRESS while a non-blocking
 * init or call is still running, PLAIT_SUCCESS when idle and healthy, or the error
 * a background thread (stream worker, non-blocking call) found. Thread-safe. */
plait_result_t plait_comm_get_async_error(plait_comm_t comm, plait_result_t *async_error_out);

/* Number of ranks / this rank. Failures: PLAIT_ERR_INVALID_ARGUMENT on NULL. */
plait_result_t plait_comm_count(plait_comm_t comm, int *count_out);
plait_result_t plait_comm_rank(plait_comm_t comm, int *rank_out);

/* Registers [buff, buff+size) for single-copy use by `comm`. The handle is passed
 * to plait_comm_deregister() before the memory is freed. Registering host memory
 * is optional: unregistered buffers work (through staging slots). Failures:
 * PLAIT_ERR_INVALID_ARGUMENT on NULL comm/handle_out or a NULL buff with size > 0;
 * for deregister, a handle that is not a live registration of this comm. */
plait_result_t plait_comm_register(plait_comm_t comm, void *buff, size_t size, void **handle_out);
plait_result_t plait_comm_deregister(plait_comm_t comm, void *handle);

/* Memory windows (NCCL's ncclCommWindowRegister): every rank registers a
 * device buffer (cudaMalloc'd, or from cuMem* allocations) of its own, in the
 * same order on every rank; a rank may then address a peer's window at the
 * same offset as its own. Device all-gathers and broadcasts whose recvbuff
 * lies in a window (at the same offset on every rank), between ranks of one
 * host, may then run on copy engines without kernels (PLAIT_CE_COLL). Peers in
 * this process use the addresses directly; peers in other processes of the
 * host map the buffer through CUDA IPC; peers on other hosts are not mapped.
 * Collective (uses the bootstrap; blocks until every rank has called it).
 * flags: PLAIT_WIN_DEFAULT or PLAIT_WIN_COLL_SYMMETRIC (the same, plait
 * treats every window as symmetric). The window is freed by
 * plait_comm_window_deregister (collective too; before the memory is freed)
 * or with the communicator. Failures: PLAIT_ERR_INVALID_ARGUMENT (NULL comm,
 * buff or win_out, size 0, unknown flags, buff not device memory);
 * PLAIT_ERR_INVALID_USAGE (no CUDA device; ranks disagree on PLAIT_CE_COLL;
 * another rank failed: the message names it); PLAIT_ERR_UNHANDLED_CUDA (a
 * CUDA call failed). Not thread-safe with other calls on comm. */
typedef struct plait_window *plait_window_t;
#define PLAIT_WIN_DEFAULT 0x00
#define PLAIT_WIN_COLL_SYMMETRIC 0x01
plait_result_t plait_comm_window_register(plait_comm_t comm, void *buff, size_t size, int flags,
                                          plait_window_t *win_out);
plait_result_t plait_comm_window_deregister(plait_comm_t comm, plait_window_t win);

/* Creates a premultiplied-sum op: out = sum over ranks of (scalar * in_r).
 * `scalar` points to one element of `datatype` (any type; integers multiply with
 * wrap-around); with PLAIT_SCALAR_HOST_IMMEDIATE it is copied now, with
 * PLAIT_SCALAR_DEVICE the pointer is kept and read each time a collective using
 * the op is issued (host memory). The op belongs to `comm`. Failures:
 * PLAIT_ERR_INVALID_ARGUMENT (NULL, bad type or residence); PLAIT_ERR_INVALID_USAGE
 * when the communicator's table of ops is full. */
plait_result_t plait_redop_create_premulsum(plait_redop_t *op_out, void *scalar, plait_datatype_t datatype,
                                            plait_scalar_residence_t residence, plait_comm_t comm);
plait_result_t plait_redop_destroy(plait_redop_t op, plait_comm_t comm);

/* ---------------------------------------------------------------- collectives
 *
 * Common rules. `count` is in elements of `datatype`. Buffers may be in-place
 * where noted (sendbuff == recvbuff, or the rank's slice of recvbuff). `stream`
 * NULL with host buffers: the call returns when the operation is complete (inside
 * a group: when plait_group_end() returns). A host plait_stream_t: the call is queued
 * and returns at once; plait_stream_synchronize() waits. Every rank must make the
 * same sequence of calls with matching counts, types, ops and roots, and with
 * buffers of the same backend (host or device) on every rank.
 *
 * Device buffers (CUDA backend), as NCCL: the call is stream-ordered on the
 * CUDA stream of a plait_stream_from_cuda() stream, or on CUDA's default
 * stream when `stream` is NULL; it returns once launched, before completion
 * (cudaStreamSynchronize or plait_stream_synchronize waits), with no host
 * synchronisation. A host stream (plait_stream_create) with device buffers is
 * PLAIT_ERR_INVALID_USAGE. Calls of a group launch together (one kernel per
 * communicator and CUDA stream, several when a group exceeds 48 operations or
 * the CTA cap; a group with sends/receives of more than 48 device operations
 * per communicator and stream is refused). A communicator's launches run in
 * issue order even across CUDA streams (each waits for the previous one),
 * except launches captured into a CUDA graph, whose replays the user orders.
 * CUDA graph capture works: what a launch points at stays valid until the
 * communicator is destroyed; a call whose shape is first seen during a
 * capture allocates in the thread's relaxed capture mode, so it may be
 * captured without an eager call first. The kernel runs on the caller's
 * stream, so that stream's priority applies. A failure inside a kernel (a
 * peer that never comes within PLAIT_COLL_TIMEOUT, an abort, mismatched
 * calls) becomes the communicator's asynchronous error
 * (plait_comm_get_async_error: the message names the rank, the CTA lane,
 * the peer and what happened), and the next call on it fails with it.
 * Host buffers on a CUDA-backed stream: the CUDA stream is synchronised first
 * (so work queued on it before is done), then the call runs as on the NULL
 * stream and is complete when it returns; not allowed while that stream is
 * being captured. PLAIT_MAX_CTAS or the config's max_ctas caps the CTAs of a
 * device launch (sends/receives of one group excepted); 0 leaves device
 * collectives one CTA (all-gather and broadcast on copy engines where
 * PLAIT_CE_COLL and memory windows allow).
 *
 * Failures common to all: PLAIT_ERR_INVALID_ARGUMENT (NULL, destroyed or garbage
 * comm or stream, NULL buffer with count > 0, datatype or op out of range, root
 * or peer out of range, count x element size x nranks overflowing or larger than
 * any buffer can be (2^63 - 4096 bytes on 64-bit Linux: the same on every rank),
 * a buffer whose range runs past the end of the address space) — nothing is
 * started and the communicator stays usable;
 * PLAIT_ERR_REMOTE (a peer died, disconnected or the communicator was aborted: the
 * message names the operation, its sequence number, the peer's rank and host);
 * PLAIT_ERR_TIMEOUT (PLAIT_COLL_TIMEOUT passed); PLAIT_ERR_INVALID_USAGE (the
 * communicator is finalized, or in error after a failed operation). */

/* recvbuff[i] = op over ranks of sendbuff[i], on every rank. In-place allowed. */
plait_result_t plait_allreduce(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype,
                               plait_redop_t op, plait_comm_t comm, plait_stream_t stream);
/* recvbuff = root's sendbuff on every rank (sendbuff is read on root only). */
plait_result_t plait_broadcast(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype,
                               int root, plait_comm_t comm, plait_stream_t stream);
/* root's recvbuff[i] = op over ranks of sendbuff[i] (recvbuff used on root only). */
plait_result_t plait_reduce(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype,
                            plait_redop_t op, int root, plait_comm_t comm, plait_stream_t stream);
/* recvbuff[r*sendcount ...] = rank r's sendbuff. In-place: sendbuff == recvbuff + rank*sendcount. */
plait_result_t plait_allgather(const void *sendbuff, void *recvbuff, size_t sendcount, plait_datatype_t datatype,
                               plait_comm_t comm, plait_stream_t stream);
/* recvbuff[i] = op over ranks of sendbuff[rank*recvcount + i]. In-place: recvbuff == sendbuff + rank*recvcount. */
plait_result_t plait_reducescatter(const void *sendbuff, void *recvbuff, size_t recvcount, plait_datatype_t datatype,
                                   plait_redop_t op, plait_comm_t comm, plait_stream_t stream);
/* recvbuff[r*count ...] = rank r's sendbuff[rank*count ...]. Not in-place. */
plait_result_t plait_alltoall(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype,
                              plait_comm_t comm, plait_stream_t stream);
/* root's recvbuff[r*count ...] = rank r's sendbuff. */
plait_result_t plait_gather(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype, int root,
                            plait_comm_t comm, plait_stream_t stream);
/* rank r's recvbuff = root's sendbuff[r*count ...]. */
plait_result_t plait_scatter(const void *sendbuff, void *recvbuff, size_t count, plait_datatype_t datatype, int root,
                             plait_comm_t comm, plait_stream_t stream);
/* Point to point. Matched in order per (sender, receiver). Sends and receives that
 * depend on each other (an exchange) must be in one group. A rank may send to itself
 * if the matching receive is in the same group. */
plait_result_t plait_send(const void *sendbuff, size_t count, plait_datatype_t datatype, int peer, plait_comm_t comm,
                          plait_stream_t stream);
plait_result_t plait_recv(void *recvbuff, size_t count, plait_datatype_t datatype, int peer, plait_comm_t comm,
                          plait_stream_t stream);
/* Returns (or completes on the stream) when every rank has entered it. */
plait_result_t plait_barrier(plait_comm_t comm, plait_stream_t stream);

/* Groups: calls between start and end are queued and launched together at the
 * outermost plait_group_end(), which (for NULL streams and host buffers) returns
 * when all of them are complete. Groups nest. One thread may drive several
 * communicators in one group. Per thread. plait_group_end() without a start
 * returns PLAIT_ERR_INVALID_USAGE. If an operation fails, the group returns the
 * first error and the communicators involved are left in error. */
plait_result_t plait_group_start(void);
plait_result_t plait_group_end(void);

/* ---------------------------------------------------------------- streams, events
 *
 * A host stream runs its operations in issue order on a worker thread of its own.
 * Thread-safe with respect to other streams; one stream is fed by one thread at a
 * time. */

/* Creates a host stream. Failures: PLAIT_ERR_INVALID_ARGUMENT (NULL), PLAIT_ERR_SYSTEM. */
plait_result_t plait_stream_create(plait_stream_t *stream_out);
/* Waits for the stream's work, then frees it. Returns the stream's first error. NULL is a no-op.
 * The stream is invalid afterwards: calls with it return PLAIT_ERR_INVALID_ARGUMENT. In a forked
 * child, streams and events inherited from the parent are PLAIT_ERR_INVALID_USAGE (their threads
 * are the parent's); destroying them frees the child's copies. */
plait_result_t plait_stream_destroy(plait_stream_t stream);
/* Waits until every operation queued on the stream is done. Returns the first
 * error of that work (and clears it). */
plait_result_t plait_stream_synchronize(plait_stream_t stream);
/* Wraps a CUDA stream (cudaStream_t passed as void*; NULL: CUDA's default
 * stream) in a new plait_stream_t, for calls on device buffers (see the
 * collectives' common rules). No thread and no CUDA call: make one per CUDA
 * stream and keep it. plait_stream_synchronize() on it is
 * cudaStreamSynchronize (PLAIT_ERR_UNHANDLED_CUDA on a CUDA failure; kernel
 * errors are the communicators' asynchronous errors);
 * plait_stream_destroy() synchronises it and frees the wrapper, never the
 * CUDA stream. Events recorded on it are CUDA events (plait_event_*): host
 * streams waiting for them synchronise the CUDA event on their worker, and
 * a CUDA-backed stream waiting for a record on a host stream blocks in a
 * CUDA host function until the host stream reaches it. Failures:
 * PLAIT_ERR_INVALID_ARGUMENT (NULL stream_out); PLAIT_ERR_INVALID_USAGE (no
 * CUDA driver or device in this process); PLAIT_ERR_SYSTEM. */
plait_result_t plait_stream_from_cuda(void *cuda_stream, plait_stream_t *stream_out);

plait_result_t plait_event_create(plait_event_t *event_out);
/* Marks the point in `stream` reached by the work queued so far. NULL stream: the
 * event completes at once (host work on NULL streams is already done). On a
 * CUDA-backed stream: a CUDA event record (work launched on the CUDA stream
 * so far). */
plait_result_t plait_event_record(plait_event_t event, plait_stream_t stream);
/* Waits until the last record of the event has been reached (an event never
 * recorded is complete). */
plait_result_t plait_event_synchronize(plait_event_t event);
/* Work queued on `stream` after this call waits for the event's last record. */
plait_result_t plait_stream_wait_event(plait_stream_t stream, plait_event_t event);
plait_result_t plait_event_destroy(plait_event_t event);

#ifdef __cplusplus
}
#endif

#endif /* PLAIT_H */
