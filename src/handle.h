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
 * Self-contained (libc and pthreads only): src/nccl_abi.c compiles its own
 * copy into libnccl.so.2. */
#ifndef PLAIT_HANDLE_H
#define PLAIT_HANDLE_H

#include <stdbool.h>

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

/* Removes `h` from `kind` (nothing when absent). Thread-safe (a lock). */
void plait_handle_remove(int kind, const void *h);

/* Whether `h` is a live handle of `kind`: any pointer value may be asked
 * about, none is dereferenced. Lock-free (a few loads): the check of every
 * call. A handle removed before the call began (in happens-before order) is
 * never reported live. */
bool plait_handle_live(int kind, const void *h);

/* Frees `p` (malloc'd) later: it joins a FIFO of the last destroyed objects,
 * and the oldest one there is freed. Thread-safe. */
void plait_handle_retire(void *p);

#endif
