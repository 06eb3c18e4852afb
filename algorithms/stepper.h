/* The per-step logic both executors run: compiled by the C compiler for the
 * CPU executor (exec.c) and the kernel's host emulation, and by nvcc for the
 * CUDA kernel (core/cuda/kernel.cu). docs/architecture.md, sections 2 and 16.
 *
 * It decides *what* moves and *when*: how a step is cut into pieces, which
 * FIFO slot a piece uses, when a slot may be written or read, and what a
 * piece does with the received data (send it on, reduce it, copy it out). It
 * never copies or reduces bytes itself; each executor does that its own way
 * (memcpy and plait_reduce_apply on a CPU, a CTA's vectorised loads on a GPU).
 *
 * Keep it in the common subset of C11 and CUDA C++: no _Atomic, no designated
 * initialisers, no implicit void * conversions, nothing but <stdint.h>. */
#ifndef PLAIT_STEPPER_H
#define PLAIT_STEPPER_H

#include <stdint.h>
#include "algorithms/schedule.h"

#if defined(__CUDACC__)
#define PLAIT_HD __host__ __device__ __forceinline__
#else
#define PLAIT_HD static inline
#endif

/* ---------------------------------------------------------------- ordering
 * 64-bit counters with acquire loads and release stores. On the CPU every
 * scope is the system's; on the GPU the scope says who the other side is:
 * _gpu for a peer on the same device (another CTA, a rank sharing the GPU),
 * _sys for a peer that reads through the host or another device (a proxy
 * thread, host-mapped counters, another GPU over NVLink/PCIe). */
#if defined(__CUDA_ARCH__)
PLAIT_HD uint64_t plait_ld_acquire_sys(const volatile uint64_t *p)
{
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
PLAIT_HD void plait_st_release_sys(volatile uint64_t *p, uint64_t v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
PLAIT_HD uint64_t plait_ld_acquire_gpu(const volatile uint64_t *p)
{
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
PLAIT_HD void plait_st_release_gpu(volatile uint64_t *p, uint64_t v)
{
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
#else
PLAIT_HD uint64_t plait_ld_acquire_sys(const volatile uint64_t *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
}
PLAIT_HD void plait_st_release_sys(volatile uint64_t *p, uint64_t v)
{
    __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
}
PLAIT_HD uint64_t plait_ld_acquire_gpu(const volatile uint64_t *p)
{
    return plait_ld_acquire_sys(p);
}
PLAIT_HD void plait_st_release_gpu(volatile uint64_t *p, uint64_t v)
{
    plait_st_release_sys(p, v);
}
#endif

/* A scoped load/store chosen at run time (a connection knows its scope). */
enum plait_scope { PLAIT_SCOPE_GPU = 0, PLAIT_SCOPE_SYS = 1 };

PLAIT_HD uint64_t plait_ld_acquire(const volatile uint64_t *p, int scope)
{
    return scope == PLAIT_SCOPE_SYS ? plait_ld_acquire_sys(p) : plait_ld_acquire_gpu(p);
}

PLAIT_HD void plait_st_release(volatile uint64_t *p, uint64_t v, int scope)
{
    if (scope == PLAIT_SCOPE_SYS)
        plait_st_release_sys(p, v);
    else
        plait_st_release_gpu(p, v);
}

/* ---------------------------------------------------------------- FIFO
 * A direction of a connection is `nslots` slots; `posted` counts the slots the
 * sender has filled (its tail), `head` the slots the receiver has drained (the
 * sender's credit), `consumed` the receiver's own count of drained slots.
 * Sequence number s uses slot s % nslots. */

/* Whether the sender may fill its next slot (posted), given the credit it read. */
PLAIT_HD int plait_fifo_can_send(uint64_t posted, uint64_t head, uint32_t nslots)
{
    return posted - head < (uint64_t)nslots;
}

/* Whether the receiver has a filled slot to read, given the tail it read. */
PLAIT_HD int plait_fifo_can_recv(uint64_t tail, uint64_t consumed)
{
    return tail > consumed;
}

/* The slot of sequence number seq. */
PLAIT_HD uint32_t plait_fifo_slot(uint64_t seq, uint32_t nslots)
{
    return (uint32_t)(seq % nslots);
}

/* ---------------------------------------------------------------- LL
 * The low-latency protocol: a slot of slot_bytes carries slot_bytes / 2 bytes
 * of data as 16-byte lines {data0, flag, data1, flag} (4-byte data words,
 * each next to a flag), written with one 16-byte store per line (8-byte
 * stores of {data, flag} pairs where a line is not whole). The flag of every
 * word of the piece with sequence number seq is plait_ll_flag(seq): a reader
 * polls a word until its flag matches, so data and its arrival come in one
 * store and no tail counter is needed. The credit (head) is as for Simple. */
PLAIT_HD uint32_t plait_ll_flag(uint64_t seq)
{
    return (uint32_t)(seq + 1) | 0x80000000u; /* never 0: a fresh (zeroed) slot holds no flag */
}

/* Data bytes one LL slot of slot_bytes carries. */
PLAIT_HD uint64_t plait_ll_payload(uint64_t slot_bytes)
{
    return slot_bytes / 2 / 16 * 16;
}

/* ---------------------------------------------------------------- pieces
 * A step of `count` elements moves in pieces of at most piece_max elements
 * (one FIFO slot); both ends of a connection cut it the same way, so no size
 * crosses the wire. */
/* The protocol a piece travels with (env.h's enum plait_proto is the setting). */
enum plait_wire { PLAIT_WIRE_SIMPLE = 0, PLAIT_WIRE_LL = 1 };

/* Elements per piece for slots of slot_bytes (esize bytes each). */
PLAIT_HD uint64_t plait_piece_max(uint64_t slot_bytes, uint64_t esize, int proto)
{
    const uint64_t bytes = proto == PLAIT_WIRE_LL ? plait_ll_payload(slot_bytes) : slot_bytes;
    return bytes / esize;
}

/* Elements of the piece that starts `done` elements into a step of `count`. */
PLAIT_HD uint64_t plait_piece_elems(uint64_t count, uint64_t done, uint64_t piece_max)
{
    const uint64_t left = count - done;
    return left < piece_max ? left : piece_max;
}

/* Pieces of a step of `count` elements (0 for an empty step). */
PLAIT_HD uint64_t plait_step_pieces(uint64_t count, uint64_t piece_max)
{
    return (count + piece_max - 1) / piece_max;
}

/* What one piece of a (non-SENDRECV) step does, from its kind: */
#define PLAIT_PIECE_RECV 1u      /* waits for a filled slot from recv_peer */
#define PLAIT_PIECE_SEND 2u      /* waits for a free slot to send_peer */
#define PLAIT_PIECE_REDUCE 4u    /* combines src (own data, pre-op when PRE) with the received slot */
#define PLAIT_PIECE_TO_DST 8u    /* writes its result (reduced, received or src) to dst */
#define PLAIT_PIECE_FROM_SRC 16u /* reads src */

PLAIT_HD unsigned plait_piece_ops(int kind)
{
    switch (kind) {
    case PLAIT_STEP_SEND:
        return PLAIT_PIECE_SEND | PLAIT_PIECE_FROM_SRC;
    case PLAIT_STEP_RECV:
        return PLAIT_PIECE_RECV | PLAIT_PIECE_TO_DST;
    case PLAIT_STEP_RECV_REDUCE_SEND:
        return PLAIT_PIECE_RECV | PLAIT_PIECE_SEND | PLAIT_PIECE_REDUCE | PLAIT_PIECE_FROM_SRC;
    case PLAIT_STEP_RECV_REDUCE_COPY:
        return PLAIT_PIECE_RECV | PLAIT_PIECE_REDUCE | PLAIT_PIECE_TO_DST | PLAIT_PIECE_FROM_SRC;
    case PLAIT_STEP_RECV_REDUCE_COPY_SEND:
        return PLAIT_PIECE_RECV | PLAIT_PIECE_SEND | PLAIT_PIECE_REDUCE | PLAIT_PIECE_TO_DST | PLAIT_PIECE_FROM_SRC;
    case PLAIT_STEP_RECV_COPY_SEND:
        return PLAIT_PIECE_RECV | PLAIT_PIECE_SEND | PLAIT_PIECE_TO_DST;
    case PLAIT_STEP_COPY:
        return PLAIT_PIECE_TO_DST | PLAIT_PIECE_FROM_SRC;
    case PLAIT_STEP_REDUCE:
        return PLAIT_PIECE_REDUCE | PLAIT_PIECE_TO_DST | PLAIT_PIECE_FROM_SRC;
    default: /* SENDRECV, SENDRECV_REDUCE: two independent halves (below) */
        return 0;
    }
}

/* The SENDRECV kinds: the send half sends src unchanged piece by piece, the
 * receive half writes dst (SENDRECV) or reduces into it (SENDRECV_REDUCE:
 * dst = post(dst OP recv)); each half advances as soon as its own resource
 * is there, and the step ends when both have moved `count` elements. */
PLAIT_HD int plait_sendrecv_reduces(int kind)
{
    return kind == PLAIT_STEP_SENDRECV_REDUCE;
}

/* Where a step's piece `done` elements in reads and writes, in elements from
 * the start of its buffers. */
PLAIT_HD uint64_t plait_piece_src(const struct plait_step *st, uint64_t done)
{
    return st->src_off + done;
}

PLAIT_HD uint64_t plait_piece_dst(const struct plait_step *st, uint64_t done)
{
    return st->dst_off + done;
}

/* Whether a local step (COPY, REDUCE) writes anything: a COPY onto itself
 * (same_address: src and dst resolve to one address) without flags is skipped. */
PLAIT_HD int plait_local_step_writes(const struct plait_step *st, int same_address)
{
    if (st->count == 0)
        return 0;
    return st->kind == PLAIT_STEP_REDUCE || st->flags || !same_address;
}

#endif
