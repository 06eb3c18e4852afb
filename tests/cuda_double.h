/* The CUDA test double's own API (tests/cuda_double.c, built as
 * libplait_cuda_double.so).
 *
 * The double is a stand-in for libcuda.so.1 that plait loads through
 * PLAIT_CUDA_LIBRARY, the same dlopen path as the real driver. It exports the
 * driver functions plait's table resolves (core/cuda/cu.h) under their
 * versioned names, plus the functions below. It is a test double, not a GPU:
 * "device" memory is host memory (memfd mappings, shareable with other
 * processes through cuIpcGetMemHandle), a stream is a worker thread running
 * its queue in order (the legacy default stream, NULL, is one per device's
 * primary context, as in CUDA: ranks sharing a device share it), a kernel
 * launch runs the kernel's host emulation with one thread per CTA. An async
 * copy from pageable host memory (not cuMemHostAlloc'd) reads its source
 * before the call returns, as the driver's staging does; from pinned memory
 * it reads it when the copy runs. Tests that use it say "double" in their names and output.
 *
 * What it checks as the real driver does: cuInit first (else
 * CUDA_ERROR_NOT_INITIALIZED), a current context for calls that need one
 * (CUDA_ERROR_INVALID_CONTEXT), stream-capture rules (synchronising or
 * allocating while a capture forbids it: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
 * and the capture is invalidated), the legacy default stream's implicit
 * ordering with blocking streams, device pointers of memcpy/memset/stream
 * memory operations lying inside an allocation (CUDA_ERROR_INVALID_VALUE).
 *
 * What it does not emulate (each fails with CUDA_ERROR_NOT_SUPPORTED):
 * multi-stream capture (waiting on an event recorded in a capture from
 * another stream), graph launches inside a capture, per-thread default
 * streams, cuLaunchKernel's `extra` argument, grids with y or z > 1.
 *
 * Environment (read at cuInit):
 *   PLAIT_CUDA_DOUBLE_DEVICES    devices (default 1; 0: cuInit fails with CUDA_ERROR_NO_DEVICE)
 *   PLAIT_CUDA_DOUBLE_TIMEOUT    seconds a synchronising call or a stream memory wait may
 *                                wait before failing with CUDA_ERROR_LAUNCH_TIMEOUT
 *                                (default 300; a real GPU would hang)
 *
 * Using it from a test: link it (meson: cuda_double_dep) so the functions
 * below resolve, and set PLAIT_CUDA_LIBRARY to its path (meson:
 * cuda_double_path, also passed as the define PLAIT_CUDA_DOUBLE_PATH) before
 * plait first loads the driver; plait's dlopen then finds the same loaded
 * library, so the test and plait share one double. */
#ifndef PLAIT_CUDA_DOUBLE_H
#define PLAIT_CUDA_DOUBLE_H

#include <stddef.h>
#include <stdint.h>

/* Counters since the library was loaded (monotonic: tests compare before
 * and after). */
struct plait_cuda_double_stats {
    uint64_t syncs;            /* host synchronisations: cuStreamSynchronize, cuCtxSynchronize,
                                  cuEventSynchronize, synchronous memcpy (HtoD, DtoH), an async
                                  copy into pageable host memory (the driver waits for it) */
    uint64_t queries;          /* cuStreamQuery, cuEventQuery (not synchronisations) */
    uint64_t launches;         /* cuLaunchKernel calls that enqueued a kernel (not captured ones) */
    uint64_t captured_launches;/* cuLaunchKernel calls recorded into a capture */
    uint64_t kernels_run;      /* kernels executed (direct launches and graph replays) */
    uint64_t graph_launches;   /* cuGraphLaunch calls */
    uint64_t allocs;           /* cuMemAlloc, cuMemAllocManaged, cuMemHostAlloc */
    uint64_t frees;            /* cuMemFree, cuMemFreeHost */
    uint64_t contexts_created; /* primary contexts created (first retain of a device) */
    uint64_t streams_created;  /* cuStreamCreateWithPriority */
    uint64_t memcpys;          /* memcpy items executed (async and synchronous) */
    uint64_t memsets;          /* memset items executed */
    uint64_t ipc_opens;        /* cuIpcOpenMemHandle calls that mapped (or re-used) a handle */
};

/* "plait CUDA test double (not a GPU)". Its presence tells plait's loader
 * that the library is the double. */
const char *plait_cuda_double_info(void);

/* Registers the host function that runs kernel `name`: fn(params, cta, ncta)
 * runs one CTA to completion; params points to a copy (params_bytes) of the
 * kernel's one parameter, taken at cuLaunchKernel (or at capture). Replaces
 * an earlier registration of the name. Returns 0, or -1 when the table is
 * full or the name too long. Thread-safe. */
int plait_cuda_double_set_kernel(const char *name, void (*fn)(const void *params, unsigned cta, unsigned ncta),
                                 size_t params_bytes);

/* Copies the counters. */
void plait_cuda_double_stats_get(struct plait_cuda_double_stats *out);

/* hold != 0: the stream's worker starts no new item (the one running
 * finishes), so a test can show that a call returned before its work ran;
 * hold == 0 releases it. stream NULL is the legacy default stream of the
 * calling thread's current context. Returns 0, or a CUDA error code (a handle
 * that is not a stream, no current context for NULL). */
int plait_cuda_double_stream_hold(void *stream, int hold);

#endif
