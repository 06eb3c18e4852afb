/* The CUDA backend's interface to the core (private). docs/architecture.md,
 * section 16; docs/cuda.md.
 *
 * Who implements what:
 *   cu.c          the driver loaded with dlopen, memory kinds (cu.h)
 *   conn.c        device state of a communicator: device connections (FIFOs),
 *                 status and abort words; setup and teardown
 *   plan_cache.c  launch plans, one per launch shape, and their memory
 *   launch.c      routing (memory kinds), launches on streams, kernel errors
 *                 (the three share struct plait_cuda_comm: dev_comm.h)
 *   ce.c          the copy-engine collectives
 *   proxy.c       the proxy thread: device FIFOs <-> socket connections
 *   kernel_host.c the kernel's host emulation (for the CUDA test double)
 *   kernel.cu     the kernel (nvcc), kernel_body.h the body it shares with
 *                 kernel_host.c, reduce_dev.cuh the device reductions */
#ifndef PLAIT_CUDA_H
#define PLAIT_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"

struct plait_comm;
struct plait_op;
struct plait_conn;
struct plait_dev_conn;

/* ------------------------------------------- conn.c, launch.c (dev_comm.h) */

/* At init, after the transports (collective: every rank calls it, and it uses
 * the bootstrap). A communicator gets device state when the CUDA driver is
 * loaded and the initialising thread has a current CUDA context (as NCCL
 * takes the current device); otherwise comm->cuda stays NULL and only host
 * buffers are accepted. Every rank must agree (allgathered): mixed
 * communicators (some ranks with a GPU, some without) fail init naming a rank. */
plait_result_t plait_cuda_comm_setup(struct plait_comm *comm);

/* Frees the device state (after the communicator's device work has been
 * waited for by the caller, or after an abort). */
void plait_cuda_comm_free(struct plait_comm *comm);

/* plait_comm_abort: raises the host-mapped abort word every kernel wait polls. */
void plait_cuda_comm_abort(struct plait_comm *comm);

/* Where an operation runs, from its buffers: 0 = CPU backend (host or
 * registered host memory), 1 = CUDA backend (device or managed memory), -1 =
 * error (set *err: PLAIT_ERR_INVALID_USAGE for buffers of different kinds in
 * one call, or device buffers on a communicator without a GPU). NULL buffers
 * (count 0, or not used by this rank) are ignored. */
int plait_cuda_route(struct plait_comm *comm, const char *fn, const void *sendbuff, const void *recvbuff,
                     plait_result_t *err);

/* Launches device ops (planned for PLAIT_EXEC_CUDA, op->plan) on their CUDA
 * streams: one kernel per (communicator, stream) for the ops of one group,
 * stream-ordered, without host synchronisation. Takes ownership of the list. */
plait_result_t plait_cuda_launch(struct plait_op *ops);

/* The first error a kernel of this communicator reported (host-mapped status
 * word), turned into the communicator's asynchronous error; PLAIT_SUCCESS
 * when none. Cheap: one load. */
plait_result_t plait_cuda_poll_error(struct plait_comm *comm);

/* The CTAs a device launch of this communicator may use: PLAIT_MAX_CTAS or
 * the config's max_ctas (the config wins), 0 when explicitly 0 (copy engines
 * for allgather/broadcast, one CTA otherwise), -1 when uncapped or without
 * device state. Agreed by every rank at init. */
int plait_cuda_cta_cap(const struct plait_comm *comm);

/* The communicator's CUDA context (NULL without device state). */
void *plait_cuda_ctx(const struct plait_comm *comm);

/* The host-mapped word in which copy-engine collectives (ce.c) record, on
 * their stream, the sequence number of the last one done: its device
 * address (0 without device state), and its host address in *host_out. */
uint64_t plait_cuda_ce_done_word(const struct plait_comm *comm, const uint64_t **host_out);

/* Whether device ops may run the kernel's LL protocol: no rank of the
 * communicator has a proxied (socket) connection. Agreed at init. */
int plait_cuda_ll_ok(const struct plait_comm *comm);

/* 1 when the kernels of this rank and of `peer` can load each other's device
 * memory (same device, peer access, or IPC between processes of one host:
 * the FIFOs are device memory both ways). The same answer on both ranks;
 * 0 without device state. ce.c maps windows for single copy only then. */
int plait_cuda_peer_loadable(const struct plait_comm *comm, int peer);

/* Tests (internal): the single-copy descriptors this rank's kernels have
 * published (*sent_out) and received (*received_out) on this communicator
 * since init. A synchronous device read: wait for the kernels first.
 * PLAIT_ERR_INVALID_USAGE without device state. */
plait_result_t plait_cuda_sc_counts(struct plait_comm *comm, uint64_t *sent_out, uint64_t *received_out);

/* ---------------------------------------------------------------- proxy.c
 * Connections whose peer is reached over the net transport: the kernel
 * reads and writes FIFOs in pinned host memory mapped into the device (their
 * counters too), and the proxy thread moves slots between them and the host
 * connection `hc` (whose staging FIFOs and progress it alone then uses). */

/* Fills *dc (a host-side image of the device connection) with device-visible
 * addresses of new pinned FIFOs for the pair (hc->peer, hc->cls), and adds
 * the pair to the communicator's proxy. */
plait_result_t plait_cuda_proxy_conn(struct plait_comm *comm, struct plait_conn *hc, struct plait_dev_conn *dc);

/* Starts the communicator's proxy thread (when it has proxied connections,
 * or peers to watch: plait_cuda_proxy_watch). */
plait_result_t plait_cuda_proxy_start(struct plait_comm *comm);

/* Stops and joins the proxy thread, frees its FIFOs. */
void plait_cuda_proxy_stop(struct plait_comm *comm);

/* Tells the proxy that a launch with proxied connections was issued (it
 * polls until the launch's completion count is reached, then sleeps). */
void plait_cuda_proxy_kick(struct plait_comm *comm, uint64_t launch_seq);

/* launch_seq for plait_cuda_proxy_kick when a launch was captured into a CUDA
 * graph: its replays are not known to the host, so the proxy polls (with
 * backoff) until plait_cuda_proxy_stop. */
#define PLAIT_PROXY_FOREVER UINT64_MAX

/* The kernel's host-mapped words the proxy watches (host addresses): status
 * (kargs.status: [0] = completed launches) and the abort word
 * (kargs.abort_flag), which the proxy raises when a proxied peer fails so that
 * every kernel wait ends. conn.c calls it before plait_cuda_proxy_start
 * (start fails without it when there are proxied connections). watch_peers:
 * some peer is in another process; the thread then runs (even with no
 * proxied connection) and fails a launch whose peer is gone, naming it. */
plait_result_t plait_cuda_proxy_watch(struct plait_comm *comm, const uint64_t *status, uint32_t *abort_word,
                                      int watch_peers);

/* 1 while the proxy may be using the communicator's socket connections (a
 * kicked launch not yet complete, or its sends not yet on the wire), else 0
 * (also when there is no proxy). The CPU executor must not run host ops on a
 * communicator while this is 1: before each host op it waits (yielding, with
 * its deadline and the abort flag) until it reads 0. Reading 0 also hands
 * back to the host connections the slots the proxy had fetched for the
 * kernel that no launch drained (they belong to the host op): without this
 * call a host op after device ops on a proxied communicator can read the
 * wrong slots. The acquire load pairs with the proxy's release store after
 * its last use of the connections (their counters are then the executor's
 * again). Call it on the communicator's issuing thread (the one whose kicks
 * it orders against); cheap: two loads, plus one pass over the proxied
 * connections when idle. */
int plait_cuda_proxy_busy(struct plait_comm *comm);

/* 1 when a launch with proxied connections was captured into a CUDA graph:
 * the proxy then serves the connections for the communicator's life (a graph
 * may be replayed at any time), so host operations on it are refused. */
int plait_cuda_proxy_captured(struct plait_comm *comm);

/* A copy-engine collective (ce.c) with sequence number ce_seq was issued
 * (outside a capture): the proxy thread, when it watches peers, checks them
 * until the CE done word (plait_cuda_ce_done_word) reaches ce_seq; if a peer
 * is gone meanwhile it releases the stream's waits on flags
 * (plait_cuda_ce_release_waits) after recording the error. */
void plait_cuda_proxy_kick_ce(struct plait_comm *comm, uint64_t ce_seq);

/* ---------------------------------------------------------------- ce.c */

/* Sets every flag this rank's copy-engine collectives wait for (every
 * peer's READY and DONE), on `stream` (the caller's context current): after
 * a peer is gone, the stream waits no deadline ends would block the stream
 * forever. The data is then garbage; the communicator is in error. */
int plait_cuda_ce_release_waits(struct plait_comm *comm, void *stream);

/* ---------------------------------------------------------------- ce.c
 * Memory windows (plait_comm_window_register, include/plait.h) and the
 * copy-engine all-gather and broadcast between ranks of one host. */

/* Issues op (a device allgather or broadcast) on `stream` with copy engines
 * (cuMemcpyAsync between windows, ordered across ranks by cuStreamWriteValue64
 * / cuStreamWaitValue64 flags) when PLAIT_CE_COLL allows it, every rank is on
 * this host and the buffers lie in windows. Returns 1 when it took the op
 * (*err then says whether issuing succeeded), 0 when the kernel path must run
 * it (*err = PLAIT_SUCCESS). No host synchronisation, no allocation. */
int plait_cuda_ce_try(struct plait_op *op, void *stream, plait_result_t *err);

/* The single-copy window table for a launch (kernel.h: kargs.wins, win_mask):
 * the device address of the [PLAIT_KMAX_WINDOWS][nranks] table (NULL when no
 * window was registered) and the windows registered now. Hot path: two loads. */
struct plait_dev_win;
void plait_cuda_ce_sc_table(const struct plait_comm *comm, const struct plait_dev_win **table_out,
                            uint32_t *mask_out);

/* Frees the windows the user left registered and the copy-engine flags (after
 * the communicator's device work is done, or after an abort). conn.c's
 * plait_cuda_comm_free calls it (idempotent; no-op without windows). */
void plait_cuda_ce_free(struct plait_comm *comm);

#endif
