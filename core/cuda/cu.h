/* The CUDA driver API as plait uses it: loaded with dlopen, never linked.
 *
 * libplait.so has no link-time dependency on CUDA. The first communicator init
 * (or the first classification of a pointer) calls plait_cu_get(), which
 * dlopen()s libcuda.so.1 (or the library named by PLAIT_CUDA_LIBRARY: the test
 * double of tests/cuda_double.c), resolves the functions below by their
 * versioned names (cuMemAlloc_v2, ...), calls cuInit(0) (which creates no
 * context) and counts devices. When any of that fails, the CPU backend works
 * alone and one INFO line says "no CUDA device (<why>)".
 *
 * Types are plait's own (no cuda.h needed to compile the host code): handles
 * are void *, device pointers uint64_t, results int (0 = CUDA_SUCCESS), and
 * the enum values used are defined here with CUDA's numbers. */
#ifndef PLAIT_CU_H
#define PLAIT_CU_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"

typedef uint64_t plait_cudevptr;
typedef struct { char reserved[64]; } plait_cu_ipc_handle;

/* CUDA's values (cuda.h) of what plait passes or checks. */
enum {
    PLAIT_CU_SUCCESS = 0,
    PLAIT_CU_ERROR_NOT_READY = 600,
    PLAIT_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    PLAIT_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    PLAIT_CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    PLAIT_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    PLAIT_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    PLAIT_CU_MEMORYTYPE_HOST = 1,
    PLAIT_CU_MEMORYTYPE_DEVICE = 2,
    PLAIT_CU_MEMORYTYPE_ARRAY = 3,
    PLAIT_CU_MEMORYTYPE_UNIFIED = 4,
    PLAIT_CU_MEMHOSTALLOC_PORTABLE = 1,
    PLAIT_CU_MEMHOSTALLOC_DEVICEMAP = 2,
    PLAIT_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
    PLAIT_CU_STREAM_NON_BLOCKING = 1,
    PLAIT_CU_EVENT_DISABLE_TIMING = 2,
    PLAIT_CU_STREAM_CAPTURE_STATUS_NONE = 0,
    PLAIT_CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    PLAIT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    PLAIT_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    PLAIT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    PLAIT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    PLAIT_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    PLAIT_CU_CTX_SCHED_AUTO = 0,
    PLAIT_CU_STREAM_WAIT_VALUE_GEQ = 0,
    PLAIT_CU_STREAM_WRITE_VALUE_DEFAULT = 0,
    PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    PLAIT_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED = 2,
    PLAIT_CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
    PLAIT_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    PLAIT_CU_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
};

/* The functions, each under the symbol name given in the comment (the one
 * cuda.h's macros choose for the default, legacy-stream API). */
struct plait_cu {
    void *lib;
    char path[256];
    int is_double;       /* the library exports plait_cuda_double_info: a test double, not a GPU */
    int ndevices;
    int driver_version;
    int (*Init)(unsigned flags);                                          /* cuInit */
    int (*DriverGetVersion)(int *v);                                      /* cuDriverGetVersion */
    int (*DeviceGetCount)(int *n);                                        /* cuDeviceGetCount */
    int (*DeviceGet)(int *dev, int ordinal);                              /* cuDeviceGet */
    int (*DeviceGetAttribute)(int *v, int attr, int dev);                 /* cuDeviceGetAttribute */
    int (*DeviceGetPCIBusId)(char *buf, int len, int dev);                /* cuDeviceGetPCIBusId */
    int (*DevicePrimaryCtxRetain)(void **ctx, int dev);                   /* cuDevicePrimaryCtxRetain */
    int (*DevicePrimaryCtxRelease)(int dev);                              /* cuDevicePrimaryCtxRelease_v2 */
    int (*CtxGetCurrent)(void **ctx);                                     /* cuCtxGetCurrent */
    int (*CtxSetCurrent)(void *ctx);                                      /* cuCtxSetCurrent */
    int (*CtxGetDevice)(int *dev);                                        /* cuCtxGetDevice */
    int (*CtxSynchronize)(void);                                          /* cuCtxSynchronize */
    int (*CtxEnablePeerAccess)(void *peer_ctx, unsigned flags);           /* cuCtxEnablePeerAccess */
    int (*PointerGetAttributes)(unsigned n, int *attrs, void **data, plait_cudevptr p); /* cuPointerGetAttributes */
    int (*MemAlloc)(plait_cudevptr *p, size_t bytes);                     /* cuMemAlloc_v2 */
    int (*MemFree)(plait_cudevptr p);                                     /* cuMemFree_v2 */
    int (*MemGetAddressRange)(plait_cudevptr *base, size_t *size, plait_cudevptr p); /* cuMemGetAddressRange_v2 */
    int (*MemHostAlloc)(void **p, size_t bytes, unsigned flags);          /* cuMemHostAlloc */
    int (*MemFreeHost)(void *p);                                          /* cuMemFreeHost */
    int (*MemHostGetDevicePointer)(plait_cudevptr *d, void *h, unsigned flags); /* cuMemHostGetDevicePointer_v2 */
    int (*MemcpyHtoD)(plait_cudevptr dst, const void *src, size_t bytes); /* cuMemcpyHtoD_v2 (setup only) */
    int (*MemcpyDtoH)(void *dst, plait_cudevptr src, size_t bytes);       /* cuMemcpyDtoH_v2 (setup, tests) */
    int (*MemcpyAsync)(plait_cudevptr dst, plait_cudevptr src, size_t bytes, void *stream); /* cuMemcpyAsync */
    int (*MemcpyHtoDAsync)(plait_cudevptr dst, const void *src, size_t bytes, void *stream); /* cuMemcpyHtoDAsync_v2 */
    int (*MemsetD8Async)(plait_cudevptr dst, unsigned char v, size_t n, void *stream); /* cuMemsetD8Async */
    int (*ModuleLoadData)(void **mod, const void *image);                 /* cuModuleLoadData */
    int (*ModuleUnload)(void *mod);                                       /* cuModuleUnload */
    int (*ModuleGetFunction)(void **fn, void *mod, const char *name);     /* cuModuleGetFunction */
    int (*LaunchKernel)(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *stream, void **params, void **extra); /* cuLaunchKernel */
    int (*StreamCreateWithPriority)(void **s, unsigned flags, int prio);  /* cuStreamCreateWithPriority */
    int (*StreamGetPriority)(void *s, int *prio);                         /* cuStreamGetPriority */
    int (*StreamDestroy)(void *s);                                        /* cuStreamDestroy_v2 */
    int (*StreamSynchronize)(void *s);                                    /* cuStreamSynchronize */
    int (*StreamQuery)(void *s);                                          /* cuStreamQuery */
    int (*StreamWaitEvent)(void *s, void *ev, unsigned flags);            /* cuStreamWaitEvent */
    int (*StreamIsCapturing)(void *s, int *status);                       /* cuStreamIsCapturing */
    int (*EventCreate)(void **ev, unsigned flags);                        /* cuEventCreate */
    int (*EventRecord)(void *ev, void *stream);                           /* cuEventRecord */
    int (*EventQuery)(void *ev);                                          /* cuEventQuery */
    int (*EventSynchronize)(void *ev);                                    /* cuEventSynchronize */
    int (*EventDestroy)(void *ev);                                        /* cuEventDestroy_v2 */
    int (*IpcGetMemHandle)(plait_cu_ipc_handle *h, plait_cudevptr p);     /* cuIpcGetMemHandle */
    int (*IpcOpenMemHandle)(plait_cudevptr *p, plait_cu_ipc_handle h, unsigned flags); /* cuIpcOpenMemHandle_v2 */
    int (*IpcCloseMemHandle)(plait_cudevptr p);                           /* cuIpcCloseMemHandle */
    int (*LaunchHostFunc)(void *stream, void (*fn)(void *), void *arg);   /* cuLaunchHostFunc */
    int (*GetErrorName)(int res, const char **s);                         /* cuGetErrorName */
    int (*GetErrorString)(int res, const char **s);                       /* cuGetErrorString */
    int (*StreamWaitValue64)(void *s, plait_cudevptr addr, uint64_t v, unsigned flags); /* cuStreamWaitValue64_v2 */
    int (*StreamWriteValue64)(void *s, plait_cudevptr addr, uint64_t v, unsigned flags); /* cuStreamWriteValue64_v2 */
    int (*StreamBeginCapture)(void *s, int mode);                         /* cuStreamBeginCapture_v2 */
    int (*StreamEndCapture)(void *s, void **graph);                       /* cuStreamEndCapture */
    int (*GraphInstantiate)(void **exec, void *graph, unsigned long long flags); /* cuGraphInstantiateWithFlags */
    int (*GraphLaunch)(void *exec, void *stream);                         /* cuGraphLaunch */
    int (*GraphDestroy)(void *graph);                                     /* cuGraphDestroy */
    int (*GraphExecDestroy)(void *exec);                                  /* cuGraphExecDestroy */
    int (*ThreadExchangeStreamCaptureMode)(int *mode);                    /* cuThreadExchangeStreamCaptureMode */
};

/* plait's own driver calls outside the hot path (setup, teardown, windows, a
 * plan's first memory) run in the RELAXED capture mode of the calling thread,
 * as NCCL's do: another thread's global-mode CUDA graph capture (or the
 * caller's own) then neither forbids them nor is invalidated by them. Returns
 * the thread's previous mode for plait_cu_capture_restore (a no-op without
 * driver). */
int plait_cu_capture_relax(const struct plait_cu *cu);
void plait_cu_capture_restore(const struct plait_cu *cu, int mode);

/* Setup and teardown copies and fills, complete on return, on a private
 * non-blocking stream of the current context: never on CUDA's legacy default
 * stream, which waits for the application's blocking streams and breaks their
 * graph captures. Addresses are unified (host or device). Return CUDA results. */
int plait_cu_sync_copy(const struct plait_cu *cu, void *dst, const void *src, size_t bytes);
int plait_cu_sync_fill(const struct plait_cu *cu, plait_cudevptr dst, unsigned char v, size_t bytes);

/* The loaded driver, or NULL when there is none (no library, cuInit failed, no
 * device). Loads at most once per process (thread-safe); the first call logs
 * one INFO line: "CUDA: N device(s), driver X.Y (libcuda.so.1)", "CUDA: test
 * double <path> (not a GPU): N device(s)" or "no CUDA device (<why>)" (a WARN
 * under PLAIT_CUDA=1). PLAIT_CUDA=0 turns the backend off without loading
 * anything. */
const struct plait_cu *plait_cu_get(void);

/* "CUDA_ERROR_X: text" for a result (through cuGetErrorName/String). */
const char *plait_cu_strerror(int res, char *buf, size_t len);

/* Maps a failed driver call to PLAIT_ERR_UNHANDLED_CUDA with a message
 * "<what>: <call> failed: CUDA_ERROR_X: text" (plait_error). */
plait_result_t plait_cu_error(int res, const char *what, const char *call);

/* CUDA IPC handles opened once per process and context. Older drivers let a
 * process open a handle once (a second cuIpcOpenMemHandle of the same handle
 * fails with CUDA_ERROR_ALREADY_MAPPED while the first is open; current ones
 * count references per context), but several ranks of one process may need
 * the same peer segment: these count the users of each (handle, current
 * context) and close it with the last. A rank of the same process on another
 * device (another context) maps the handle again in its own context, as the
 * driver requires. Close with the opening context current. Thread-safe.
 * Return CUDA results. */
int plait_cu_ipc_open(const struct plait_cu *cu, const plait_cu_ipc_handle *h, plait_cudevptr *p_out);
int plait_cu_ipc_close(const struct plait_cu *cu, plait_cudevptr p);

/* Memory kinds of a user buffer. */
enum plait_mem_kind {
    PLAIT_MEM_HOST = 0,       /* ordinary host memory (or no CUDA in this process) */
    PLAIT_MEM_REGISTERED = 1, /* page-locked host memory known to CUDA (cudaHostAlloc/Register) */
    PLAIT_MEM_DEVICE = 2,     /* cudaMalloc'd device memory */
    PLAIT_MEM_MANAGED = 3,    /* cudaMallocManaged */
};

/* The kind of the memory at p, and for device/managed memory its device
 * ordinal (-1 otherwise). Calls plait_cu_get() (so the first call in a
 * process may load the driver, once) and then only cuPointerGetAttributes,
 * which needs no context: it creates no CUDA context, so a host-only program
 * stays without one. Without a driver (or PLAIT_CUDA=0) every pointer is
 * PLAIT_MEM_HOST; so is NULL, and so is a pointer the driver does not know.
 * Thread-safe. */
int plait_mem_kind(const void *p, int *device);

const char *plait_mem_kind_name(int kind);

/* The fatbin of core/cuda/kernel.cu built into this library (NULL, 0 when
 * the build had no nvcc: device collectives then fail with a clear error). */
const void *plait_cuda_fatbin(size_t *bytes);

#endif
