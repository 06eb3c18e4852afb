/* Registries of live handles (private).
 *
 * Every opaque handle the API gives out (communicators, streams, events; the
 * NCCL shim's ncclComm_t) is entered here when it is made and removed when it
 * is destroyed, so that an entry point can tell a live handle from a stale or
 * garbage one before it reads a byte through it: a destroyed, never-made or
 * wild pointer is PLAIT_ERR_INVALID_ARGUMENT, never a crash, a hang or a read
 * of freed memory. Destroyed objects are not freed at once but quarantined
 * (plait_handle_retire), so that the allocator does not hand a destroyed
 * handle's address to the next object at once: a stale handle is not taken
 * for a newer object until many more handles have been destroyed.
 *
 * Self-contained (libc and pthreads only): compat/nccl_abi.c compiles its own
 * copy into libnccl.so.2. */
#ifndef PLAIT_HANDLE_H
#define PLAIT_HANDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum plait_handle_kind {
    PLAIT_HANDLE_COMM,         /* plait_comm_t, from comm_alloc to its destruction */
    PLAIT_HANDLE_COMM_ABORTED, /* plait_comm_t freed by plait_comm_abort, while its struct is kept */
    PLAIT_HANDLE_STREAM,       /* plait_stream_t (host and CUDA-backed) */
    PLAIT_HANDLE_EVENT,        /* plait_event_t */
    PLAIT_HANDLE_NCCL_COMM,    /* the NCCL shim's ncclComm_t */
    PLAIT_HANDLE_NCCL_ABORTED, /* an ncclComm_t after ncclCommAbort, while its wrapper is kept */
    PLAIT_HANDLE_KINDS
};

/* Enters `h` as a live handle of `kind`. Returns 0, or -1 when out of memory
 * (the caller then fails its creation). Thread-safe (a lock). */
int plait_handle_add(int kind, const void *h);

/* Removes `h` from `kind` (nothing when absent). Returns whether it was
 * there: of threads removing one handle at once, exactly one is told true,
 * and only it may free the object. Thread-safe (a lock). */
bool plait_handle_remove(int kind, const void *h);

/* One kind's table (handle.c says how it is kept). Exposed only for the
 * inline first probe below. */
struct plait_handle_table {
    struct plait_handle_table *retired_next; /* replaced tables, kept for readers that may still walk them */
    size_t cap;                              /* a power of two */
    unsigned shift;                          /* 64 - log2(cap): the hash's top bits index the table */
    size_t live;
    uintptr_t slots[];                       /* 0: never used, 1: tombstone, else a live handle */
};
extern struct plait_handle_table *plait_handle_tables[PLAIT_HANDLE_KINDS];

/* Fibonacci hashing: the top bits of the product mix every bit of the
 * address, whose low bits (alignment) are all zero. */
static inline size_t plait_handle_slot(const struct plait_handle_table *t, uintptr_t key)
{
    return (size_t)(((uint64_t)key * 0x9e3779b97f4a7c15ull) >> t->shift);
}

/* The rest of the probe sequence after slot i (handle.c). */
bool plait_handle_live_probe(const struct plait_handle_table *t, uintptr_t key, size_t i);

/* Whether `h` is a live handle of `kind` (a constant): any pointer value may
 * be asked about, none is dereferenced. Lock-free: the check of every call,
 * inline up to the first probe (two acquire loads, a multiply), which finds
 * a live handle unless it collided. A handle removed before the call began
 * (in happens-before order) is never reported live. */
static inline bool plait_handle_live(int kind, const void *h)
{
    const uintptr_t key = (uintptr_t)h;
    const struct plait_handle_table *t = __atomic_load_n(&plait_handle_tables[kind], __ATOMIC_ACQUIRE);
    if (!t || key <= 1)
        return false;
    const size_t i = plait_handle_slot(t, key);
    const uintptr_t k = __atomic_load_n(&t->slots[i], __ATOMIC_ACQUIRE);
    if (k == key)
        return true;
    return k != 0 && plait_handle_live_probe(t, key, i);
}

/* Quarantine queues: one per kind of object (an aborted handle's object
 * goes with its kind's: PLAIT_HANDLE_COMM, PLAIT_HANDLE_NCCL_COMM), and one
 * for the rest (registrations, CUDA windows). */
#define PLAIT_RETIRE_OTHER PLAIT_HANDLE_KINDS
#define PLAIT_RETIRE_QUEUES (PLAIT_HANDLE_KINDS + 1)

/* Frees `p` (malloc'd) later: it joins `queue`'s FIFO of the last destroyed
 * objects, and the oldest one there is freed. Thread-safe. */
void plait_handle_retire(int queue, void *p);

#endif
