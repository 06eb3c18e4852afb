/* The CUDA backend's interface to the core (private). DESIGN.md, "Data path"
 * and "Streams and overlap"; docs/architecture.md section 16.
 *
 * Who implements what:
 *   cu.c          the driver loaded with dlopen, memory kinds (cu.h)
 *   coll.c        device state of a communicator, plans, launches on streams
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

/* ---------------------------------------------------------------- coll.c */

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

/* Launches device ops (op->on_device) on their CUDA streams: one kernel per
 * (communicator, stream) for the ops of one group, stream-ordered, without
 * host synchronisation. Takes ownership of the list. */
plait_result_t plait_cuda_launch(struct plait_op *ops);

/* The first error a kernel of this communicator reported (host-mapped status
 * word), turned into the communicator's asynchronous error; PLAIT_SUCCESS
 * when none. Cheap: one load. */
plait_result_t plait_cuda_poll_error(struct plait_comm *comm);

/* ---------------------------------------------------------------- proxy.c
 * Connections whose peer is reached over the socket transport: the kernel
 * reads and writes FIFOs in pinned host memory mapped into the device (their
 * counters too), and the proxy thread moves slots between them and the host
 * connection `hc` (whose staging FIFOs and TCP socket it alone then uses). */

/* Fills *dc (a host-side image of the device connection) with device-visible
 * addresses of new pinned FIFOs for the pair (hc->peer, hc->cls), and adds
 * the pair to the communicator's proxy. */
plait_result_t plait_cuda_proxy_conn(struct plait_comm *comm, struct plait_conn *hc, struct plait_dev_conn *dc);

/* Starts the communicator's proxy thread (when it has proxied connections). */
plait_result_t plait_cuda_proxy_start(struct plait_comm *comm);

/* Stops and joins the proxy thread, frees its FIFOs. */
void plait_cuda_proxy_stop(struct plait_comm *comm);

/* Tells the proxy that a launch with proxied connections was issued (it
 * polls until the launch's completion count is reached, then sleeps). */
void plait_cuda_proxy_kick(struct plait_comm *comm, uint64_t launch_seq);

#endif
