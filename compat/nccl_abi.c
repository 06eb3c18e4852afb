/*
 * libnccl.so.2: NCCL's API and ABI over plait's public API.
 *
 * A thin layer: it translates arguments, keeps the little state NCCL has and
 * plait lacks (the CUDA device a communicator names, revocation, creations
 * deferred to ncclGroupEnd), and calls libplait.so, which it links to (one
 * global state, no second copy of plait). Every pncclX below is the definition
 * and ncclX a weak alias of it (at the end of the file), as in NVIDIA's library.
 *
 * Buffers and streams. A pointer is device memory only when the process has
 * loaded the CUDA driver and the driver says so (cudaMalloc'd or managed
 * memory); the shim never loads CUDA itself. Calls on device buffers go to
 * plait's CUDA backend on a plait stream wrapping the caller's cudaStream_t
 * (one cached wrapper per cudaStream_t; NULL is CUDA's default stream): they
 * are stream-ordered and return once queued, as NCCL's. Calls on host buffers
 * run on the CPU backend and are complete when they return (in a group: when
 * ncclGroupEnd returns); their cudaStream_t is not used.
 *
 * What each function does, and what differs from NCCL: docs/nccl-compat.md.
 */
#define _GNU_SOURCE
#include "compat/nccl_abi.h"
#include "base/handle.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "plait.h"

/* plait's enums were given NCCL's values; the translation is then a cast
 * after a range check. These make sure it stays so. */
_Static_assert((int)ncclSuccess == (int)PLAIT_SUCCESS, "result values");
_Static_assert((int)ncclUnhandledCudaError == (int)PLAIT_ERR_UNHANDLED_CUDA, "result values");
_Static_assert((int)ncclSystemError == (int)PLAIT_ERR_SYSTEM, "result values");
_Static_assert((int)ncclInternalError == (int)PLAIT_ERR_INTERNAL, "result values");
_Static_assert((int)ncclInvalidArgument == (int)PLAIT_ERR_INVALID_ARGUMENT, "result values");
_Static_assert((int)ncclInvalidUsage == (int)PLAIT_ERR_INVALID_USAGE, "result values");
_Static_assert((int)ncclRemoteError == (int)PLAIT_ERR_REMOTE, "result values");
_Static_assert((int)ncclInProgress == (int)PLAIT_IN_PROGRESS, "result values");
_Static_assert((int)ncclInt8 == (int)PLAIT_INT8 && (int)ncclUint8 == (int)PLAIT_UINT8, "datatype values");
_Static_assert((int)ncclInt32 == (int)PLAIT_INT32 && (int)ncclUint32 == (int)PLAIT_UINT32, "datatype values");
_Static_assert((int)ncclInt64 == (int)PLAIT_INT64 && (int)ncclUint64 == (int)PLAIT_UINT64, "datatype values");
_Static_assert((int)ncclFloat16 == (int)PLAIT_FLOAT16 && (int)ncclFloat32 == (int)PLAIT_FLOAT32, "datatype values");
_Static_assert((int)ncclFloat64 == (int)PLAIT_FLOAT64 && (int)ncclBfloat16 == (int)PLAIT_BFLOAT16, "datatype values");
_Static_assert((int)ncclFloat8e4m3 == (int)PLAIT_FLOAT8_E4M3 && (int)ncclFloat8e5m2 == (int)PLAIT_FLOAT8_E5M2,
               "datatype values");
_Static_assert((int)ncclNumTypes == (int)PLAIT_NUM_TYPES, "datatype values");
_Static_assert((int)ncclSum == (int)PLAIT_SUM && (int)ncclProd == (int)PLAIT_PROD, "op values");
_Static_assert((int)ncclMax == (int)PLAIT_MAX && (int)ncclMin == (int)PLAIT_MIN, "op values");
_Static_assert((int)ncclAvg == (int)PLAIT_AVG && (int)ncclNumOps == (int)PLAIT_NUM_OPS, "op values");
_Static_assert(sizeof(ncclRedOp_t) == sizeof(plait_redop_t), "op size");
_Static_assert((int)ncclScalarDevice == (int)PLAIT_SCALAR_DEVICE, "residence values");
_Static_assert((int)ncclScalarHostImmediate == (int)PLAIT_SCALAR_HOST_IMMEDIATE, "residence values");
_Static_assert(sizeof(ncclUniqueId) == sizeof(plait_unique_id_t), "unique id size");
_Static_assert(NCCL_SPLIT_NOCOLOR == PLAIT_SPLIT_NOCOLOR, "split no-color");
_Static_assert(NCCL_WIN_DEFAULT == PLAIT_WIN_DEFAULT && NCCL_WIN_COLL_SYMMETRIC == PLAIT_WIN_COLL_SYMMETRIC,
               "window flags");
_Static_assert(NCCL_CONFIG_UNDEF_INT == PLAIT_CONFIG_UNDEF_INT, "undefined config value");

/* ---------------------------------------------------------------- last error and log
 *
 * plait keeps the last-error message per thread, but libplait.so exports no
 * way to set it. Errors found here are kept in a message of our own, and a
 * flag says whether it or plait's is the more recent: every failure returned
 * by plait clears the flag. */

#define SHIM_MSG_MAX 1024

static __thread char shim_msg[SHIM_MSG_MAX];
static __thread int shim_msg_is_last;

static const char *debug_env(const char *plait_name, const char *nccl_name)
{
    const char *v = getenv(plait_name);
    return v ? v : getenv(nccl_name);
}

/* Logs one WARN line in plait's format, where plait's log goes, when
 * PLAIT_DEBUG (or NCCL_DEBUG) asks for warnings. Error paths only. */
static void shim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void shim_warn(const char *fmt, ...)
{
    const char *lvl = debug_env("PLAIT_DEBUG", "NCCL_DEBUG");
    if (!lvl || (strcasecmp(lvl, "WARN") != 0 && strcasecmp(lvl, "INFO") != 0 && strcasecmp(lvl, "TRACE") != 0))
        return;
    char msg[SHIM_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    char *dot = strchr(host, '.');
    if (dot)
        *dot = '\0';
    FILE *f = NULL;
    const char *file = debug_env("PLAIT_DEBUG_FILE", "NCCL_DEBUG_FILE");
    if (file && *file) {
        char path[1024];
        size_t o = 0;
        for (const char *p = file; *p && o + 1 < sizeof(path); p++) {
            if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
                int n = p[1] == 'h' ? snprintf(path + o, sizeof(path) - o, "%s", host)
                                    : snprintf(path + o, sizeof(path) - o, "%d", (int)getpid());
                o += n > 0 ? (size_t)n : 0;
                if (o >= sizeof(path))
                    o = sizeof(path) - 1;
                p++;
            } else {
                path[o++] = *p;
            }
        }
        path[o] = '\0';
        char why[1400];
        f = plait_file_open(path, true, why, sizeof(why)); /* NULL: stderr (file.h: a FIFO never blocks) */
    }
    fprintf(f ? f : stderr, "%s:%d:%d plait WARN %s\n", host, (int)getpid(), (int)syscall(SYS_gettid), msg);
    if (f)
        fclose(f);
}

/* Records an error found by the shim (what ncclGetLastError returns next) and
 * returns `result`. */
static ncclResult_t shim_error(ncclResult_t result, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t shim_error(ncclResult_t result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(shim_msg, sizeof(shim_msg), fmt, ap);
    va_end(ap);
    shim_msg_is_last = 1;
    shim_warn("%s", shim_msg);
    return result;
}

/* plait's result as NCCL's (the values are equal; plait's 8, a timeout, is
 * passed on as NCCL 2.30 numbers it). */
static ncclResult_t from_plait(plait_result_t r)
{
    if (r != PLAIT_SUCCESS && r != PLAIT_IN_PROGRESS)
        shim_msg_is_last = 0;
    return (ncclResult_t)r;
}

/* The message of the last failure on this thread, whichever layer found it. */
static const char *last_error_text(plait_comm_t pc)
{
    return shim_msg_is_last ? shim_msg : plait_get_last_error(pc);
}

/* ---------------------------------------------------------------- CUDA: the driver, pointers, streams
 *
 * Device memory exists only in a process that has loaded the CUDA driver
 * (libcuda.so.1, loaded by the CUDA runtime or linked by the application). So
 * the shim never loads or initialises CUDA itself, which keeps CPU-only and
 * forking jobs free of it: it looks for a driver that is already loaded
 * (RTLD_NOLOAD) and asks it about each buffer. The driver looked for is the
 * one plait loads: PLAIT_CUDA_LIBRARY when set (the CUDA test double, in
 * tests), else libcuda.so.1. Until it appears, the look-up is repeated only
 * when the process has loaded new objects (the loader's counter, read through
 * dl_iterate_phdr), so a CPU-only call costs one counter read.
 *
 * plait itself dlopens that driver and calls cuInit(0) once per process, at
 * the first communicator init (core/cuda/cu.c), creating no context. This is consistent: a host-only
 * program on a machine with a driver then has it loaded, but without a
 * context; the shim finds it and classifies buffers with
 * cuPointerGetAttributes, which needs no context either, and every host
 * buffer stays on the CPU backend with a NULL stream. On a machine without a
 * driver (or a GPU) nothing is loaded and every buffer is host memory.
 *
 * A buffer the driver calls device memory (cudaMalloc, cuMemAlloc) or managed
 * memory (cudaMallocManaged) goes to plait's CUDA backend on the caller's
 * cudaStream_t; anything else (a pointer the driver does not know, registered
 * host memory, a driver that answers with an error) is host memory. */

typedef int (*cu_pointer_get_attributes_fn)(unsigned n, int *attrs, void **data, unsigned long long ptr);
typedef int (*cu_ctx_get_current_fn)(void **ctx);
typedef int (*cu_ctx_set_current_fn)(void *ctx);
typedef int (*cu_ctx_get_device_fn)(int *dev);
typedef int (*cu_mem_alloc_fn)(unsigned long long *p, size_t bytes);
typedef int (*cu_mem_free_fn)(unsigned long long p);

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE 2 /* managed memory reports DEVICE too */

/* The driver's functions the shim calls. Written once (under cu_lock), then
 * published by the release store of `attributes`; readers acquire it. */
struct shim_cu {
    cu_pointer_get_attributes_fn attributes;
    cu_ctx_get_current_fn ctx_get_current;
    cu_ctx_set_current_fn ctx_set_current;   /* NULL if the driver lacks it */
    cu_ctx_get_device_fn ctx_get_device;     /* idem */
    cu_mem_alloc_fn mem_alloc;               /* cuMemAlloc_v2, idem */
    cu_mem_free_fn mem_free;                 /* cuMemFree_v2, idem */
};

static struct shim_cu cu_fns;
static int cu_found; /* cu_fns is filled (atomic) */
static unsigned long long cu_probed_adds;
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;

static int loader_adds_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
        *(unsigned long long *)data = info->dlpi_adds;
    return 1; /* the counter is the same in every entry: stop at the first */
}

static void *sym(void *h, const char *name)
{
    return h ? dlsym(h, name) : NULL;
}

/* The loaded driver's functions, or NULL when no driver is loaded. */
static const struct shim_cu *cuda_driver(void)
{
    if (__atomic_load_n(&cu_found, __ATOMIC_ACQUIRE))
        return &cu_fns;
    unsigned long long adds = 0;
    dl_iterate_phdr(loader_adds_cb, &adds);
    if (adds != 0 && adds == __atomic_load_n(&cu_probed_adds, __ATOMIC_RELAXED))
        return NULL;
    pthread_mutex_lock(&cu_lock);
    if (!__atomic_load_n(&cu_found, __ATOMIC_ACQUIRE)) {
        const char *path = getenv("PLAIT_CUDA_LIBRARY");
        void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        void *get = sym(h, "cuPointerGetAttributes"), *ctx = sym(h, "cuCtxGetCurrent");
        if (get && ctx) {
            void *set = sym(h, "cuCtxSetCurrent"), *dev = sym(h, "cuCtxGetDevice");
            void *alloc = sym(h, "cuMemAlloc_v2"), *release = sym(h, "cuMemFree_v2");
            memcpy(&cu_fns.attributes, &get, sizeof(get));
            memcpy(&cu_fns.ctx_get_current, &ctx, sizeof(ctx));
            memcpy(&cu_fns.ctx_set_current, &set, sizeof(set));
            memcpy(&cu_fns.ctx_get_device, &dev, sizeof(dev));
            memcpy(&cu_fns.mem_alloc, &alloc, sizeof(alloc));
            memcpy(&cu_fns.mem_free, &release, sizeof(release));
            /* The handle is kept: the driver stays loaded for the process. */
            __atomic_store_n(&cu_found, 1, __ATOMIC_RELEASE);
        } else if (h) {
            dlclose(h);
        }
        __atomic_store_n(&cu_probed_adds, adds, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&cu_lock);
    return __atomic_load_n(&cu_found, __ATOMIC_ACQUIRE) ? &cu_fns : NULL;
}

/* Whether p is device or managed memory (the CUDA backend's kinds). */
static int is_device_pointer(const struct shim_cu *cu, const void *p)
{
    if (!cu || !p)
        return 0;
    unsigned int type = 0;
    int attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    void *data = &type;
    return cu->attributes(1, &attr, &data, (unsigned long long)(uintptr_t)p) == 0 && type == CU_MEMORYTYPE_DEVICE;
}

/* The calling thread's current CUDA context, or NULL (no driver, or none). */
static void *cuda_context_current(void)
{
    const struct shim_cu *cu = cuda_driver();
    void *ctx = NULL;
    if (!cu || cu->ctx_get_current(&ctx) != 0)
        return NULL;
    return ctx;
}

/* The device of the calling thread's current context, or -1 (none: a host
 * communicator would be made). */
static int cuda_device_current(void)
{
    const struct shim_cu *cu = cuda_driver();
    int dev = -1;
    if (!cuda_context_current() || !cu->ctx_get_device || cu->ctx_get_device(&dev) != 0)
        return -1;
    return dev;
}

/* plait streams wrapping the caller's cudaStream_t values, one per value,
 * made at its first use and kept for the process's life. A wrapper holds
 * nothing but the handle (plait_stream_from_cuda makes no CUDA call and
 * keeps no state of the CUDA stream), so when the application destroys a
 * stream and CUDA later hands out the same address for a new one, the old
 * wrapper names the new stream correctly: reuse is harmless, and nothing needs
 * to know about cudaStreamDestroy. The table grows by one small node per
 * distinct handle; lookups take no lock: a node is filled, then published by
 * the release store into its bucket's head, which readers acquire. */
#define SHIM_STREAM_BUCKETS 64

struct shim_stream {
    cudaStream_t cuda;
    plait_stream_t ps;
    struct shim_stream *next;
};

static struct shim_stream *stream_buckets[SHIM_STREAM_BUCKETS];
static pthread_mutex_t stream_lock = PTHREAD_MUTEX_INITIALIZER;

static struct shim_stream *stream_find(struct shim_stream *head, cudaStream_t s)
{
    for (struct shim_stream *n = head; n; n = n->next)
        if (n->cuda == s)
            return n;
    return NULL;
}

/* The cached plait stream wrapping `s`, for a call on device buffers. The
 * NULL cudaStream_t gets a wrapper too (of NULL: CUDA's default stream, as
 * plait's NULL stream means for device buffers), so that a plait without a
 * CUDA driver refuses the call instead of reading device memory as host
 * memory. On failure, plait's message is the last error. */
static ncclResult_t stream_for(cudaStream_t s, const char *fn, plait_stream_t *out)
{
    *out = NULL;
    uintptr_t key = (uintptr_t)s;
    struct shim_stream **bucket = &stream_buckets[((key >> 4) ^ (key >> 12)) % SHIM_STREAM_BUCKETS];
    struct shim_stream *n = stream_find(__atomic_load_n(bucket, __ATOMIC_ACQUIRE), s);
    if (n) {
        *out = n->ps;
        return ncclSuccess;
    }
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&stream_lock);
    n = stream_find(*bucket, s);
    if (!n) {
        n = calloc(1, sizeof(*n));
        if (!n) {
            r = shim_error(ncclSystemError, "%s: out of memory", fn);
        } else if ((r = from_plait(plait_stream_from_cuda(s, &n->ps))) != ncclSuccess) {
            free(n);
            n = NULL;
        } else {
            n->cuda = s;
            n->next = *bucket;
            __atomic_store_n(bucket, n, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&stream_lock);
    if (n)
        *out = n->ps;
    return r;
}

/* The plait stream for a call's buffers (b, c may be NULL): the wrapper of
 * the caller's cudaStream_t when one of them is device or managed memory
 * (plait then checks that they all are, and that the communicator has the
 * device); NULL for host buffers, whose call is complete when it returns (or
 * when ncclGroupEnd returns), as before the CUDA backend. */
static ncclResult_t call_stream(const char *fn, const void *a, const void *b, cudaStream_t s, plait_stream_t *out)
{
    *out = NULL;
    const struct shim_cu *cu = cuda_driver();
    const void *dev = NULL;
    if (is_device_pointer(cu, a))
        dev = a;
    else if (b && b != a && is_device_pointer(cu, b))
        dev = b;
    if (!dev)
        return ncclSuccess;
    ncclResult_t r = stream_for(s, fn, out);
    if (r != ncclSuccess) {
        char why[SHIM_MSG_MAX];
        snprintf(why, sizeof(why), "%s", last_error_text(NULL));
        return shim_error(r, "%s: a buffer (%p) is device memory, for plait's CUDA backend, which cannot take it: %s",
                          fn, dev, why);
    }
    return ncclSuccess;
}

/* ---------------------------------------------------------------- communicators
 *
 * ncclComm_t points to a small wrapper around plait's communicator. Every
 * wrapper handed out is in the registry of live handles (base/handle.h, a copy
 * of its own in this library), which every entry point asks before it reads
 * through a handle: a destroyed, never-made or garbage ncclComm_t is
 * ncclInvalidArgument, never a crash. Destroyed wrappers are quarantined
 * before they are freed, so a new one does not take a destroyed one's
 * address at once. Wrappers of aborted communicators are kept for a while
 * (the graveyard, registered as aborted: calls on them are ncclInvalidUsage
 * "aborted"), because ncclCommAbort may be called while another thread is
 * inside a call on the communicator: that call still reads the wrapper when
 * plait returns. */

#define SHIM_COMM_MAGIC 0x6e63636c636f6d6dull /* "ncclcomm" */
#define SHIM_COMM_DEAD 0x6e63636c64656164ull  /* "nccldead": aborted */
#define SHIM_GRAVE_SECONDS 60.0

struct shim_job;

struct ncclComm {
    uint64_t magic;
    plait_comm_t pc;            /* NULL while a deferred creation runs, or after it failed */
    struct shim_job *job;       /* the creation deferred to ncclGroupEnd, until then */
    ncclResult_t create_result; /* of a deferred creation that failed */
    int cuda_dev;               /* what ncclCommCuDevice reports */
    int revoked;                /* ncclCommRevoke was called */
    plait_config_t cfg;         /* the config it was made with (ncclCommShrink inherits it) */
    char name[64];
    double dead_since;
    struct ncclComm *next;      /* in the graveyard */
};

/* The graveyard's lock, held for list operations only. */
static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *grave;

static void shim_prefork(void)
{
    pthread_mutex_lock(&shim_lock);
}

static void shim_postfork(void)
{
    pthread_mutex_unlock(&shim_lock);
}

static void shim_register_atfork(void)
{
    pthread_atfork(shim_prefork, shim_postfork, shim_postfork);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct ncclComm *comm_new(const plait_config_t *cfg, const char *name, int cuda_dev)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, shim_register_atfork);
    struct ncclComm *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->cfg = *cfg;
    snprintf(w->name, sizeof(w->name), "%s", name ? name : "");
    w->cfg.name = w->name[0] ? w->name : NULL;
    w->cuda_dev = cuda_dev;
    w->magic = SHIM_COMM_MAGIC;
    if (plait_handle_add(PLAIT_HANDLE_NCCL_COMM, w) != 0) {
        free(w);
        return NULL;
    }
    return w;
}

/* Frees a wrapper that never reached the caller. */
static void comm_discard(struct ncclComm *w)
{
    if (!w)
        return;
    plait_handle_remove(PLAIT_HANDLE_NCCL_COMM, w);
    free(w);
}

/* Whether `comm` may be read: a live wrapper, or an aborted one in the
 * graveyard (PLAIT_SUCCESS); else ncclInvalidArgument naming it. Any pointer
 * may be passed; none is read. */
static ncclResult_t comm_handle(ncclComm_t comm, const char *fn)
{
    if (!comm)
        return shim_error(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (plait_handle_live(PLAIT_HANDLE_NCCL_COMM, comm) || plait_handle_live(PLAIT_HANDLE_NCCL_ABORTED, comm))
        return ncclSuccess;
    return shim_error(ncclInvalidArgument, "%s: comm %p is not a communicator (destroyed, or never made)", fn,
                      (void *)comm);
}

/* Checks the handle and gives plait's communicator. `for_work`: collectives,
 * point-to-point and op creation, refused after ncclCommRevoke. */
static ncclResult_t comm_get(ncclComm_t comm, const char *fn, int for_work, plait_comm_t *pc_out)
{
    ncclResult_t hr = comm_handle(comm, fn);
    if (hr)
        return hr;
    uint64_t magic = __atomic_load_n(&comm->magic, __ATOMIC_ACQUIRE);
    if (magic == SHIM_COMM_DEAD)
        return shim_error(ncclInvalidUsage, "%s: the communicator was aborted (ncclCommAbort)", fn);
    if (magic != SHIM_COMM_MAGIC)
        return shim_error(ncclInvalidArgument, "%s: comm is not a communicator (destroyed, or never made)", fn);
    if (__atomic_load_n(&comm->job, __ATOMIC_ACQUIRE))
        return shim_error(ncclInvalidUsage,
                          "%s: the communicator is still being created: its creation completes at ncclGroupEnd", fn);
    plait_comm_t pc = __atomic_load_n(&comm->pc, __ATOMIC_ACQUIRE);
    if (!pc)
        return shim_error(ncclInvalidUsage, "%s: the communicator's creation failed (%s); destroy it", fn,
                          plait_get_error_string((plait_result_t)comm->create_result));
    if (for_work && __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE))
        return shim_error(ncclInvalidUsage,
                          "%s: the communicator was revoked (ncclCommRevoke): destroy, abort, split or shrink it", fn);
    *pc_out = pc;
    return ncclSuccess;
}

/* ---------------------------------------------------------------- configs */

static int config_has(size_t size, size_t offset, size_t field_size)
{
    return size >= offset + field_size;
}

/* Reads an ncclConfig_t of any version (by its size) into plait's config.
 * Copied: blocking, minCTAs/maxCTAs (plait's channel bounds), commName (into
 * name[64]). netName is checked (plait's network is TCP sockets). The others
 * steer GPU or InfiniBand resources plait does not have yet and are ignored:
 * cgaClusterSize, splitShare, trafficClass, collnetEnable, CTAPolicy,
 * shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched. */
static ncclResult_t config_from_nccl(const ncclConfig_t *in, plait_config_t *out, char name[64], const char *fn)
{
    const plait_config_t def = PLAIT_CONFIG_INITIALIZER;
    *out = def;
    name[0] = '\0';
    if (!in)
        return ncclSuccess;
    if (in->magic != NCCL_CONFIG_MAGIC)
        return shim_error(ncclInvalidArgument,
                          "%s: config->magic is 0x%x, not 0x%x: initialise the config with NCCL_CONFIG_INITIALIZER", fn,
                          in->magic, NCCL_CONFIG_MAGIC);
    const size_t size = in->size;
    if (!config_has(size, offsetof(ncclConfig_t, blocking), sizeof(in->blocking)) || size > 4096)
        return shim_error(ncclInvalidArgument, "%s: config->size %zu is not the size of an ncclConfig_t", fn, size);
    out->blocking = in->blocking;
    if (in->blocking != NCCL_CONFIG_UNDEF_INT && in->blocking != 0 && in->blocking != 1)
        return shim_error(ncclInvalidArgument, "%s: config->blocking is %d (0 or 1)", fn, in->blocking);
    if (config_has(size, offsetof(ncclConfig_t, minCTAs), sizeof(in->minCTAs)) && in->minCTAs > 0)
        out->min_ctas = in->minCTAs;
    if (config_has(size, offsetof(ncclConfig_t, maxCTAs), sizeof(in->maxCTAs)) && in->maxCTAs > 0)
        out->max_ctas = in->maxCTAs;
    if (config_has(size, offsetof(ncclConfig_t, netName), sizeof(in->netName)) && in->netName &&
        strcasecmp(in->netName, "Socket") != 0) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            shim_warn("%s: config->netName \"%s\" is not a network plait has; it uses TCP sockets between hosts "
                      "(warned once)",
                      fn, in->netName);
    }
    if (config_has(size, offsetof(ncclConfig_t, commName), sizeof(in->commName)) && in->commName) {
        snprintf(name, 64, "%s", in->commName);
        out->name = name;
    }
    return ncclSuccess;
}

static int config_blocking(const plait_config_t *cfg)
{
    return cfg->blocking != 0; /* undefined means blocking, plait's default and NCCL's */
}

/* ---------------------------------------------------------------- groups and deferred creations
 *
 * NCCL lets one thread create several communicators inside a group
 * (ncclGroupStart; ncclCommInitRank for each rank; ncclGroupEnd). plait's
 * blocking init, split and shrink wait for the other ranks, so there each
 * creation runs on a thread of its own from the call on, and ncclGroupEnd
 * waits for them. The handle is returned at once; it becomes usable when the
 * group ends. Group state is per thread, as in plait. */

enum shim_job_kind { SHIM_JOB_INIT, SHIM_JOB_SPLIT, SHIM_JOB_SHRINK };

struct shim_job {
    enum shim_job_kind kind;
    struct ncclComm *target;    /* NULL for a split with NCCL_SPLIT_NOCOLOR */
    pthread_t thread;
    int nranks, rank;           /* init */
    plait_unique_id_t id;       /* init */
    plait_comm_t parent;        /* split, shrink */
    int color, key;             /* split */
    unsigned char *excluded;    /* shrink: per parent rank */
    int pass_cfg;               /* give cfg to plait (else NULL: plait's inheritance) */
    plait_config_t cfg;
    char name[64];
    void *cu_ctx;               /* the caller's current CUDA context (NULL: none) */
    plait_comm_t made;
    ncclResult_t result;
    char msg[SHIM_MSG_MAX];
    struct shim_job *next;
};

static __thread int group_depth;
static __thread unsigned group_ops;        /* operations queued in the open group */
static __thread int group_in_progress;     /* a call in the group returned ncclInProgress */
static __thread struct shim_job *group_jobs;

static ncclResult_t shrink_run(plait_comm_t parent, const unsigned char *excluded, const plait_config_t *cfg,
                               plait_comm_t *out);

static void *job_main(void *arg)
{
    struct shim_job *job = arg;
    const plait_config_t *cfg = job->pass_cfg ? &job->cfg : NULL;
    shim_msg_is_last = 0;
    /* plait takes a communicator's device from the context current on the
     * thread that creates it (as NCCL takes the current device): the caller's,
     * not this new thread's, which has none. */
    const struct shim_cu *cu = job->cu_ctx ? cuda_driver() : NULL;
    if (cu && cu->ctx_set_current && cu->ctx_set_current(job->cu_ctx) != 0) {
        job->result = shim_error(ncclUnhandledCudaError,
                                 "cannot make the caller's CUDA context current on the thread that creates the "
                                 "communicator (cuCtxSetCurrent failed)");
        snprintf(job->msg, sizeof(job->msg), "%s", shim_msg);
        return NULL;
    }
    switch (job->kind) {
    case SHIM_JOB_INIT:
        job->result = from_plait(plait_comm_init_rank_config(&job->made, job->nranks, job->id, job->rank, cfg));
        break;
    case SHIM_JOB_SPLIT:
        job->result = from_plait(plait_comm_split(job->parent, job->color, job->key, &job->made, cfg));
        break;
    case SHIM_JOB_SHRINK:
        job->result = shrink_run(job->parent, job->excluded, &job->cfg, &job->made);
        break;
    }
    if (job->result != ncclSuccess && job->result != ncclInProgress)
        snprintf(job->msg, sizeof(job->msg), "%s", last_error_text(NULL));
    return NULL;
}

/* Starts a deferred creation; the job belongs to this thread's group. */
static ncclResult_t job_start(struct shim_job *job, const char *fn)
{
    job->cu_ctx = cuda_context_current();
    if (job->target)
        job->target->job = job;
    if (pthread_create(&job->thread, NULL, job_main, job) != 0) {
        if (job->target)
            job->target->job = NULL;
        return shim_error(ncclSystemError, "%s: cannot start a thread for the creation deferred to ncclGroupEnd", fn);
    }
    job->next = group_jobs;
    group_jobs = job;
    return ncclSuccess;
}

/* At the outermost ncclGroupEnd: waits for every deferred creation of this
 * thread's group and hands the communicators to their wrappers. Returns the
 * first failure (its message becomes the last error). */
static ncclResult_t jobs_collect(void)
{
    ncclResult_t first = ncclSuccess;
    char msg[SHIM_MSG_MAX] = "";
    struct shim_job *job = group_jobs;
    group_jobs = NULL;
    while (job) {
        struct shim_job *next = job->next;
        pthread_join(job->thread, NULL);
        if (job->result == ncclInProgress)
            group_in_progress = 1;
        int ok = job->result == ncclSuccess || job->result == ncclInProgress;
        if (job->target) {
            if (ok)
                __atomic_store_n(&job->target->pc, job->made, __ATOMIC_RELEASE);
            else
                job->target->create_result = job->result;
            __atomic_store_n(&job->target->job, NULL, __ATOMIC_RELEASE);
        } else if (ok && job->made) {
            /* A split that gave this rank no color yields no communicator. */
            plait_comm_destroy(job->made);
        }
        if (!ok && first == ncclSuccess) {
            first = job->result;
            snprintf(msg, sizeof(msg), "%s", job->msg);
        }
        free(job->excluded);
        free(job);
        job = next;
    }
    if (first != ncclSuccess)
        return shim_error(first, "ncclGroupEnd: a communicator created in the group failed: %s", msg);
    return ncclSuccess;
}

static void group_count_op(ncclResult_t r)
{
    if (group_depth > 0) {
        if (r == ncclSuccess || r == ncclInProgress)
            group_ops++;
        if (r == ncclInProgress)
            group_in_progress = 1;
    }
}

ncclResult_t pncclGroupStart(void)
{
    ncclResult_t r = from_plait(plait_group_start());
    if (r == ncclSuccess)
        group_depth++;
    return r;
}

ncclResult_t pncclGroupEnd(void)
{
    if (group_depth == 0)
        return shim_error(ncclInvalidUsage, "ncclGroupEnd: no group is open (call ncclGroupStart first)");
    ncclResult_t r = from_plait(plait_group_end());
    group_depth--;
    if (group_depth == 0) {
        ncclResult_t jr = jobs_collect();
        if (r == ncclSuccess)
            r = jr;
        if (r == ncclSuccess && group_in_progress)
            r = ncclInProgress;
        group_ops = 0;
        group_in_progress = 0;
    }
    return r;
}

ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    if (!simInfo)
        return shim_error(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo is NULL");
    if (simInfo->magic != NCCL_SIM_INFO_MAGIC)
        return shim_error(ncclInvalidArgument,
                          "ncclGroupSimulateEnd: simInfo->magic is 0x%x: initialise it with NCCL_SIM_INFO_INITIALIZER",
                          simInfo->magic);
    if (group_depth == 0)
        return shim_error(ncclInvalidUsage, "ncclGroupSimulateEnd: no group is open (call ncclGroupStart first)");
    /* NCCL ends the group without running it. plait cannot drop queued work,
     * so a group that would run something stays open; one that would run
     * nothing (an inner level, or an empty group) is closed as NCCL does. */
    if (group_depth > 1 || (group_ops == 0 && !group_jobs)) {
        ncclResult_t r = pncclGroupEnd();
        if (r != ncclSuccess)
            return r;
        return shim_error(ncclInvalidUsage,
                          "ncclGroupSimulateEnd: plait does not estimate a group's time (its cost model is not "
                          "connected to this call; plait-tune --explain predicts single collectives) (the group level "
                          "is closed; nothing ran)");
    }
    return shim_error(ncclInvalidUsage,
                      "ncclGroupSimulateEnd: plait does not estimate a group's time (its cost model is not "
                      "connected to this call; plait-tune --explain predicts single collectives); the group (%u "
                      "operations) stays open: end it with ncclGroupEnd to run it",
                      group_ops + (group_jobs ? 1u : 0u));
}

/* ---------------------------------------------------------------- version, ids, errors */

ncclResult_t pncclGetVersion(int *version)
{
    if (!version)
        return shim_error(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return shim_error(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    plait_unique_id_t id;
    ncclResult_t r = from_plait(plait_get_unique_id(&id));
    if (r == ncclSuccess)
        memcpy(uniqueId->internal, id.internal, sizeof(uniqueId->internal));
    return r;
}

const char *pncclGetErrorString(ncclResult_t result)
{
    return plait_get_error_string((plait_result_t)result);
}

const char *pncclGetLastError(ncclComm_t comm)
{
    if (shim_msg_is_last)
        return shim_msg;
    /* Only a live wrapper is read: a program may pass the handle of a failed
     * init, never written. */
    plait_comm_t pc = NULL;
    struct ncclComm *w = plait_handle_live(PLAIT_HANDLE_NCCL_COMM, comm) ? comm : NULL;
    if (w && !__atomic_load_n(&w->job, __ATOMIC_ACQUIRE))
        pc = __atomic_load_n(&w->pc, __ATOMIC_ACQUIRE);
    return plait_get_last_error(pc);
}

/* plait reads PLAIT_DEBUG/NCCL_DEBUG and their companions again at every
 * communicator init, so there is nothing to reset. */
void pncclResetDebugInit(void)
{
}

void ncclResetDebugInitInternal(void)
{
}

/* ---------------------------------------------------------------- creation */

static ncclResult_t init_common(ncclComm_t *comm_out, int nranks, const ncclUniqueId *commId, int rank,
                                const ncclConfig_t *config, const char *fn)
{
    if (!comm_out)
        return shim_error(ncclInvalidArgument, "%s: comm is NULL", fn);
    plait_config_t cfg;
    char name[64];
    ncclResult_t r = config_from_nccl(config, &cfg, name, fn);
    if (r)
        return r;
    plait_unique_id_t id;
    memcpy(id.internal, commId->internal, sizeof(id.internal));
    struct ncclComm *w = comm_new(&cfg, name, cuda_device_current());
    if (!w)
        return shim_error(ncclSystemError, "%s: out of memory", fn);
    if (group_depth > 0 && config_blocking(&cfg)) {
        struct shim_job *job = calloc(1, sizeof(*job));
        if (!job) {
            comm_discard(w);
            return shim_error(ncclSystemError, "%s: out of memory", fn);
        }
        job->kind = SHIM_JOB_INIT;
        job->target = w;
        job->nranks = nranks;
        job->rank = rank;
        job->id = id;
        job->pass_cfg = 1;
        job->cfg = w->cfg;
        snprintf(job->name, sizeof(job->name), "%s", w->name);
        job->cfg.name = job->name[0] ? job->name : NULL;
        if ((r = job_start(job, fn))) {
            free(job);
            comm_discard(w);
            return r;
        }
        *comm_out = w;
        return ncclSuccess;
    }
    plait_comm_t pc = NULL;
    r = from_plait(plait_comm_init_rank_config(&pc, nranks, id, rank, &w->cfg));
    if (r != ncclSuccess && r != ncclInProgress) {
        comm_discard(w);
        return r;
    }
    __atomic_store_n(&w->pc, pc, __ATOMIC_RELEASE);
    group_count_op(r);
    *comm_out = w;
    return r;
}

ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return init_common(comm, nranks, &commId, rank, NULL, "ncclCommInitRank");
}

ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t *config)
{
    return init_common(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig");
}

/* plait's bootstrap needs one root: every rank uses commIds[0] (the others
 * would spread NCCL's bootstrap over several roots). */
ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
                                       ncclConfig_t *config)
{
    if (nId < 1 || !commIds)
        return shim_error(ncclInvalidArgument, "ncclCommInitRankScalable: nId is %d and commIds %p (need at least one id)",
                          nId, (void *)commIds);
    return init_common(newcomm, nranks, &commIds[0], myrank, config, "ncclCommInitRankScalable");
}

ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    if (!comm)
        return shim_error(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
    if (ndev < 1)
        return shim_error(ncclInvalidArgument, "ncclCommInitAll: ndev is %d (must be >= 1)", ndev);
    plait_comm_t *pcs = calloc((size_t)ndev, sizeof(*pcs));
    struct ncclComm **ws = calloc((size_t)ndev, sizeof(*ws));
    int *first = NULL;
    ncclResult_t r = ncclSuccess;
    if (!pcs || !ws) {
        r = shim_error(ncclSystemError, "ncclCommInitAll: out of memory");
        goto out;
    }
    /* NCCL's NULL devlist means the first ndev devices. A program with a
     * current CUDA context (a GPU program) gets them; without one, host
     * communicators, so that CPU-only programs keep working without CUDA. */
    if (!devlist && cuda_context_current()) {
        if (!(first = calloc((size_t)ndev, sizeof(*first)))) {
            r = shim_error(ncclSystemError, "ncclCommInitAll: out of memory");
            goto out;
        }
        for (int i = 0; i < ndev; i++)
            first[i] = i;
        devlist = first;
    }
    const plait_config_t def = PLAIT_CONFIG_INITIALIZER;
    for (int i = 0; i < ndev; i++) {
        ws[i] = comm_new(&def, NULL, devlist ? devlist[i] : -1);
        if (!ws[i]) {
            r = shim_error(ncclSystemError, "ncclCommInitAll: out of memory");
            goto err_wrappers;
        }
    }
    r = from_plait(plait_comm_init_all(pcs, ndev, devlist));
    if (r != ncclSuccess)
        goto err_wrappers;
    for (int i = 0; i < ndev; i++) {
        __atomic_store_n(&ws[i]->pc, pcs[i], __ATOMIC_RELEASE);
        comm[i] = ws[i];
    }
    goto out;
err_wrappers:
    for (int i = 0; i < ndev; i++)
        comm_discard(ws[i]);
out:
    free(first);
    free(pcs);
    free(ws);
    return r;
}

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    static const char fn[] = "ncclCommSplit";
    plait_comm_t parent = NULL;
    ncclResult_t r = comm_get(comm, fn, 0, &parent);
    if (r)
        return r;
    if (!newcomm)
        return shim_error(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    if (color < NCCL_SPLIT_NOCOLOR)
        return shim_error(ncclInvalidArgument, "%s: color %d is negative (and not NCCL_SPLIT_NOCOLOR)", fn, color);
    plait_config_t cfg;
    char name[64];
    if ((r = config_from_nccl(config, &cfg, name, fn)))
        return r;
    if (!config) {
        /* plait inherits the parent's settings itself; the wrapper records them. */
        cfg = comm->cfg;
        snprintf(name, sizeof(name), "%s", comm->name);
    }
    struct ncclComm *w = NULL;
    if (color != NCCL_SPLIT_NOCOLOR && !(w = comm_new(&cfg, name, cuda_device_current())))
        return shim_error(ncclSystemError, "%s: out of memory", fn);
    if (group_depth > 0) {
        /* plait's split exchanges colors with the other ranks before it
         * returns, even for a non-blocking child: defer it. */
        struct shim_job *job = calloc(1, sizeof(*job));
        if (!job) {
            comm_discard(w);
            return shim_error(ncclSystemError, "%s: out of memory", fn);
        }
        job->kind = SHIM_JOB_SPLIT;
        job->target = w;
        job->parent = parent;
        job->color = color;
        job->key = key;
        job->pass_cfg = config != NULL;
        job->cfg = cfg;
        snprintf(job->name, sizeof(job->name), "%s", name);
        job->cfg.name = job->name[0] ? job->name : NULL;
        if ((r = job_start(job, fn))) {
            free(job);
            comm_discard(w);
            return r;
        }
        *newcomm = w;
        return ncclSuccess;
    }
    plait_comm_t pc = NULL;
    r = from_plait(plait_comm_split(parent, color, key, &pc, config ? &cfg : NULL));
    if ((r != ncclSuccess && r != ncclInProgress) || !pc) {
        comm_discard(w);
        if (r == ncclSuccess || r == ncclInProgress)
            *newcomm = NULL;
        return r;
    }
    __atomic_store_n(&w->pc, pc, __ATOMIC_RELEASE);
    *newcomm = w;
    return r;
}

/* Waits until a non-blocking communicator's queued calls are done. */
static plait_result_t wait_quiet(plait_comm_t pc)
{
    plait_result_t state = PLAIT_IN_PROGRESS;
    for (;;) {
        plait_result_t r = plait_comm_get_async_error(pc, &state);
        if (r != PLAIT_SUCCESS)
            return r;
        if (state != PLAIT_IN_PROGRESS)
            return state;
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Shrinks a healthy parent without the excluded ranks taking part: the lowest
 * surviving rank makes a new unique id and sends it to the other survivors
 * over the parent's point-to-point connections, and the survivors create a
 * communicator with it, in parent-rank order. */
static ncclResult_t shrink_run(plait_comm_t parent, const unsigned char *excluded, const plait_config_t *cfg,
                               plait_comm_t *out)
{
    static const char fn[] = "ncclCommShrink";
    int n = 0, me = 0;
    plait_comm_count(parent, &n);
    plait_comm_rank(parent, &me);
    int leader = -1, newrank = 0, newn = 0;
    for (int p = 0; p < n; p++) {
        if (excluded[p])
            continue;
        if (leader < 0)
            leader = p;
        if (p < me)
            newrank++;
        newn++;
    }
    plait_unique_id_t id;
    plait_result_t pr;
    if (me == leader) {
        if ((pr = plait_get_unique_id(&id)) != PLAIT_SUCCESS)
            return shim_error(from_plait(pr), "%s: cannot make the new communicator's id: %s", fn,
                              plait_get_last_error(NULL));
        pr = plait_group_start();
        for (int p = 0; p < n && pr == PLAIT_SUCCESS; p++)
            if (!excluded[p] && p != me)
                pr = plait_send(&id, sizeof(id), PLAIT_UINT8, p, parent, NULL);
        plait_result_t end = plait_group_end();
        if (pr == PLAIT_SUCCESS)
            pr = end;
    } else {
        pr = plait_recv(&id, sizeof(id), PLAIT_UINT8, leader, parent, NULL);
    }
    if (pr == PLAIT_IN_PROGRESS)
        pr = wait_quiet(parent);
    if (pr != PLAIT_SUCCESS)
        return shim_error(from_plait(pr),
                          "%s: cannot hand the new id to the surviving ranks over the parent (%s). plait shrinks only a "
                          "healthy communicator; after a rank failed, create a new one with ncclGetUniqueId and "
                          "ncclCommInitRank",
                          fn, plait_get_last_error(parent));
    return from_plait(plait_comm_init_rank_config(out, newn, id, newrank, cfg));
}

ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                             ncclConfig_t *config, int shrinkFlags)
{
    static const char fn[] = "ncclCommShrink";
    plait_comm_t parent = NULL;
    ncclResult_t r = comm_get(comm, fn, 0, &parent);
    if (r)
        return r;
    if (!newcomm)
        return shim_error(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
        return shim_error(ncclInvalidArgument, "%s: excludeRanksList %p with excludeRanksCount %d", fn,
                          (void *)excludeRanksList, excludeRanksCount);
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
        return shim_error(ncclInvalidArgument, "%s: shrinkFlags is 0x%x (NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT)", fn,
                          shrinkFlags);
    int n = 0, me = 0;
    plait_comm_count(parent, &n);
    plait_comm_rank(parent, &me);
    unsigned char *excluded = calloc((size_t)n, 1);
    if (!excluded)
        return shim_error(ncclSystemError, "%s: out of memory", fn);
    for (int i = 0; i < excludeRanksCount; i++) {
        int x = excludeRanksList[i];
        if (x < 0 || x >= n || excluded[x]) {
            free(excluded);
            return shim_error(ncclInvalidArgument, "%s: excludeRanksList[%d] = %d is out of range [0, %d) or repeated",
                              fn, i, x, n);
        }
        excluded[x] = 1;
    }
    if (excluded[me]) {
        free(excluded);
        return shim_error(ncclInvalidArgument, "%s: rank %d is in excludeRanksList: excluded ranks do not call it", fn,
                          me);
    }
    plait_config_t cfg;
    char name[64];
    if ((r = config_from_nccl(config, &cfg, name, fn))) {
        free(excluded);
        return r;
    }
    if (!config) {
        cfg = comm->cfg;
        snprintf(name, sizeof(name), "%s", comm->name);
    }
    struct ncclComm *w = comm_new(&cfg, name, cuda_device_current());
    if (!w) {
        free(excluded);
        return shim_error(ncclSystemError, "%s: out of memory", fn);
    }
    if (group_depth > 0) {
        struct shim_job *job = calloc(1, sizeof(*job));
        if (!job) {
            free(excluded);
            comm_discard(w);
            return shim_error(ncclSystemError, "%s: out of memory", fn);
        }
        job->kind = SHIM_JOB_SHRINK;
        job->target = w;
        job->parent = parent;
        job->excluded = excluded;
        job->pass_cfg = 1;
        job->cfg = w->cfg;
        snprintf(job->name, sizeof(job->name), "%s", w->name);
        job->cfg.name = job->name[0] ? job->name : NULL;
        if ((r = job_start(job, fn))) {
            free(excluded);
            free(job);
            comm_discard(w);
            return r;
        }
        *newcomm = w;
        return ncclSuccess;
    }
    plait_comm_t pc = NULL;
    r = shrink_run(parent, excluded, &w->cfg, &pc);
    free(excluded);
    if (r != ncclSuccess && r != ncclInProgress) {
        comm_discard(w);
        return r;
    }
    __atomic_store_n(&w->pc, pc, __ATOMIC_RELEASE);
    *newcomm = w;
    return r;
}

/* ---------------------------------------------------------------- ending */

/* Checks a handle given to destroy or abort; NULL is accepted by the callers. */
static ncclResult_t comm_check_end(ncclComm_t comm, const char *fn)
{
    ncclResult_t hr = comm_handle(comm, fn);
    if (hr)
        return hr;
    uint64_t magic = __atomic_load_n(&comm->magic, __ATOMIC_ACQUIRE);
    if (magic == SHIM_COMM_DEAD)
        return shim_error(ncclInvalidUsage, "%s: the communicator was aborted, which freed it", fn);
    if (magic != SHIM_COMM_MAGIC)
        return shim_error(ncclInvalidArgument, "%s: comm is not a communicator (destroyed, or never made)", fn);
    if (__atomic_load_n(&comm->job, __ATOMIC_ACQUIRE))
        return shim_error(ncclInvalidUsage, "%s: the communicator is still being created: end its group first", fn);
    return ncclSuccess;
}

ncclResult_t pncclCommFinalize(ncclComm_t comm)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclCommFinalize", 0, &pc);
    if (r)
        return r;
    if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE))
        return shim_error(ncclInvalidUsage, "ncclCommFinalize: the communicator was revoked; destroy it instead");
    return from_plait(plait_comm_finalize(pc));
}

ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t r = comm_check_end(comm, "ncclCommDestroy");
    if (r)
        return r;
    /* Of two destroys at once, only the one that took it out goes on. */
    if (!plait_handle_remove(PLAIT_HANDLE_NCCL_COMM, comm))
        return shim_error(ncclInvalidArgument, "ncclCommDestroy: comm %p was destroyed or aborted by another thread "
                                               "meanwhile",
                          (void *)comm);
    plait_comm_t pc = __atomic_exchange_n(&comm->pc, NULL, __ATOMIC_ACQ_REL);
    __atomic_store_n(&comm->magic, 0, __ATOMIC_RELEASE);
    r = pc ? from_plait(plait_comm_destroy(pc)) : ncclSuccess;
    plait_handle_retire(PLAIT_HANDLE_NCCL_COMM, comm); /* its address is not given to the next wrapper at once */
    return r;
}

ncclResult_t pncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t r = comm_check_end(comm, "ncclCommAbort");
    if (r)
        return r;
    /* New calls see the dead magic; a call already past comm_get holds plait's
     * handle, which plait itself keeps answerable after its abort. */
    __atomic_store_n(&comm->magic, SHIM_COMM_DEAD, __ATOMIC_RELEASE);
    plait_comm_t pc = __atomic_exchange_n(&comm->pc, NULL, __ATOMIC_ACQ_REL);
    r = pc ? from_plait(plait_comm_abort(pc)) : ncclSuccess;
    double t = now_s();
    struct ncclComm *old = NULL;
    plait_handle_add(PLAIT_HANDLE_NCCL_ABORTED, comm); /* without room: "not a communicator" */
    plait_handle_remove(PLAIT_HANDLE_NCCL_COMM, comm);
    pthread_mutex_lock(&shim_lock);
    for (struct ncclComm **pp = &grave; *pp;) {
        struct ncclComm *w = *pp;
        if (t - w->dead_since > SHIM_GRAVE_SECONDS) {
            *pp = w->next;
            w->next = old;
            old = w;
        } else {
            pp = &w->next;
        }
    }
    comm->dead_since = t;
    comm->next = grave;
    grave = comm;
    pthread_mutex_unlock(&shim_lock);
    while (old) {
        struct ncclComm *next = old->next;
        plait_handle_remove(PLAIT_HANDLE_NCCL_ABORTED, old);
        plait_handle_retire(PLAIT_HANDLE_NCCL_COMM, old);
        old = next;
    }
    return r;
}

/* plait cannot stop a communicator's work without freeing it (that is
 * ncclCommAbort). With host buffers a call on this thread is complete when it
 * returns, and device work already queued on CUDA streams runs to its end, so
 * revoking marks the communicator: later collectives,
 * point-to-point calls, op creation and finalize are refused; destroy, abort,
 * split and shrink remain. Work still queued by a non-blocking communicator
 * finishes (ncclCommGetAsyncError reports ncclInProgress until it has). */
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclCommRevoke", 0, &pc);
    if (r)
        return r;
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
        return shim_error(ncclInvalidArgument, "ncclCommRevoke: revokeFlags is 0x%x (must be NCCL_REVOKE_DEFAULT)",
                          revokeFlags);
    __atomic_store_n(&comm->revoked, 1, __ATOMIC_RELEASE);
    return ncclSuccess;
}

/* ---------------------------------------------------------------- queries */

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    static const char fn[] = "ncclCommGetAsyncError";
    ncclResult_t hr = comm_handle(comm, fn);
    if (hr)
        return hr;
    if (!asyncError)
        return shim_error(ncclInvalidArgument, "%s: asyncError is NULL", fn);
    uint64_t magic = __atomic_load_n(&comm->magic, __ATOMIC_ACQUIRE);
    if (magic == SHIM_COMM_DEAD)
        return shim_error(ncclInvalidUsage, "%s: the communicator was aborted (ncclCommAbort)", fn);
    if (magic != SHIM_COMM_MAGIC)
        return shim_error(ncclInvalidArgument, "%s: comm is not a communicator (destroyed, or never made)", fn);
    if (__atomic_load_n(&comm->job, __ATOMIC_ACQUIRE)) {
        *asyncError = ncclInProgress;
        return ncclSuccess;
    }
    plait_comm_t pc = __atomic_load_n(&comm->pc, __ATOMIC_ACQUIRE);
    if (!pc) {
        *asyncError = comm->create_result;
        return ncclSuccess;
    }
    plait_result_t state;
    ncclResult_t r = from_plait(plait_comm_get_async_error(pc, &state));
    if (r == ncclSuccess)
        *asyncError = (ncclResult_t)state;
    return r;
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int *count)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclCommCount", 0, &pc);
    if (r)
        return r;
    if (!count)
        return shim_error(ncclInvalidArgument, "ncclCommCount: count is NULL");
    return from_plait(plait_comm_count(pc, count));
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclCommUserRank", 0, &pc);
    if (r)
        return r;
    if (!rank)
        return shim_error(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    return from_plait(plait_comm_rank(pc, rank));
}

/* The communicator's CUDA device: the device of the context current when it
 * was created (cuCtxGetDevice; for a creation deferred to ncclGroupEnd, the
 * caller's context at the call), ncclCommInitAll's devlist entry (devices
 * 0..ndev-1 for a NULL devlist in a GPU program); -1 for a host communicator
 * (no current context at creation). */
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclCommCuDevice", 0, &pc);
    if (r)
        return r;
    if (!device)
        return shim_error(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = comm->cuda_dev;
    return ncclSuccess;
}

/* ---------------------------------------------------------------- memory and registration */

/* With a current CUDA context (a GPU program), device memory of that context's
 * device from the driver the program loaded (cuMemAlloc_v2), as NCCL gives;
 * without one, host memory. The size is rounded up to whole pages. Host memory
 * is page-aligned (NCCL_WIN_REQUIRED_ALIGNMENT); device memory has
 * cuMemAlloc's alignment (at least 256 bytes; NCCL's cuMemCreate granularity
 * is coarser), which plait's windows accept. */
ncclResult_t pncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr)
        return shim_error(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    const size_t page = NCCL_WIN_REQUIRED_ALIGNMENT;
    if (size > SIZE_MAX - page)
        return shim_error(ncclInvalidArgument, "ncclMemAlloc: size %zu is too large", size);
    size_t bytes = size == 0 ? page : (size + page - 1) / page * page;
    if (cuda_context_current()) {
        const struct shim_cu *cu = cuda_driver();
        unsigned long long d = 0;
        if (!cu->mem_alloc)
            return shim_error(ncclUnhandledCudaError, "ncclMemAlloc: the loaded CUDA driver has no cuMemAlloc_v2");
        int res = cu->mem_alloc(&d, bytes);
        if (res != 0)
            return shim_error(ncclUnhandledCudaError, "ncclMemAlloc: cuMemAlloc_v2 of %zu bytes failed (CUDA error %d)",
                              bytes, res);
        *ptr = (void *)(uintptr_t)d;
        return ncclSuccess;
    }
    void *p = NULL;
    if (posix_memalign(&p, page, bytes) != 0)
        return shim_error(ncclSystemError, "ncclMemAlloc: cannot allocate %zu bytes of host memory", bytes);
    *ptr = p;
    return ncclSuccess;
}

/* Device memory (from ncclMemAlloc under a context) goes back to the driver,
 * on the calling thread's context as cuMemFree needs; host memory to free(). */
ncclResult_t pncclMemFree(void *ptr)
{
    const struct shim_cu *cu = cuda_driver();
    if (is_device_pointer(cu, ptr)) {
        if (!cu->mem_free)
            return shim_error(ncclUnhandledCudaError, "ncclMemFree: the loaded CUDA driver has no cuMemFree_v2");
        int res = cu->mem_free((unsigned long long)(uintptr_t)ptr);
        if (res != 0)
            return shim_error(ncclUnhandledCudaError,
                              "ncclMemFree: cuMemFree_v2(%p) failed (CUDA error %d; it needs a current context)", ptr,
                              res);
        return ncclSuccess;
    }
    free(ptr);
    return ncclSuccess;
}

ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    static const char fn[] = "ncclCommRegister";
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, fn, 0, &pc);
    if (r)
        return r;
    /* plait records the range (host or device memory alike); the single-copy
     * paths that use it are plait's. */
    return from_plait(plait_comm_register(pc, buff, size, handle));
}

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclCommDeregister", 0, &pc);
    if (r)
        return r;
    return from_plait(plait_comm_deregister(pc, handle));
}

ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclCommWindowRegister", 0, &pc);
    if (r)
        return r;
    if (!win)
        return shim_error(ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
    plait_window_t w = NULL;
    r = from_plait(plait_comm_window_register(pc, buff, size, winFlags, &w));
    if (r == ncclSuccess)
        *win = (ncclWindow_t)w;
    return r;
}

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclCommWindowDeregister", 0, &pc);
    if (r)
        return r;
    return from_plait(plait_comm_window_deregister(pc, (plait_window_t)win));
}

/* ---------------------------------------------------------------- reduction ops */

static ncclResult_t check_type(ncclDataType_t datatype, const char *fn)
{
    if ((unsigned)datatype >= (unsigned)ncclNumTypes)
        return shim_error(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t (0..%d)", fn, (int)datatype,
                          (int)ncclNumTypes - 1);
    return ncclSuccess;
}

/* Built-in ops are 0..ncclNumOps-1; larger values are made by
 * ncclRedOpCreatePreMulSum, and plait checks that they are live. */
static ncclResult_t check_op(ncclRedOp_t op, const char *fn)
{
    if ((int)op < 0)
        return shim_error(ncclInvalidArgument, "%s: op %d is not an ncclRedOp_t", fn, (int)op);
    return ncclSuccess;
}

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm)
{
    static const char fn[] = "ncclRedOpCreatePreMulSum";
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, fn, 1, &pc);
    if (r || (r = check_type(datatype, fn)))
        return r;
    if (!op || !scalar)
        return shim_error(ncclInvalidArgument, "%s: op (%p) or scalar (%p) is NULL", fn, (void *)op, scalar);
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
        return shim_error(ncclInvalidArgument, "%s: residence %d is not an ncclScalarResidence_t", fn, (int)residence);
    /* plait reads a premulsum scalar on the host: once here
     * (ncclScalarHostImmediate), or when each collective using the op is
     * issued (ncclScalarDevice), never from a kernel. A scalar in device
     * memory would be read as host memory: refuse it. */
    if (is_device_pointer(cuda_driver(), scalar))
        return shim_error(ncclInvalidUsage,
                          "%s: scalar (%p) is device memory: plait reads a premulsum scalar on the host when the op "
                          "is created (ncclScalarHostImmediate) or when a collective using it is issued "
                          "(ncclScalarDevice), and cannot read it from device memory yet; keep the scalar in host "
                          "memory",
                          fn, scalar);
    plait_redop_t made;
    r = from_plait(plait_redop_create_premulsum(&made, scalar, (plait_datatype_t)datatype,
                                                (plait_scalar_residence_t)residence, pc));
    if (r == ncclSuccess)
        *op = (ncclRedOp_t)made;
    return r;
}

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclRedOpDestroy", 0, &pc);
    if (r)
        return r;
    return from_plait(plait_redop_destroy((plait_redop_t)op, pc));
}

/* ---------------------------------------------------------------- collectives and point-to-point
 *
 * Each checks the handle, the type and op, and calls plait: on device buffers
 * with the wrapper of the caller's cudaStream_t (stream-ordered: the call
 * returns once queued, as NCCL's), on host buffers with the NULL stream (the
 * call is complete when it returns, or, in a group, when ncclGroupEnd
 * returns). */

static ncclResult_t work_done(plait_result_t pr)
{
    ncclResult_t r = from_plait(pr);
    group_count_op(r);
    return r;
}

ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclAllReduce";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) || (r = check_op(op, fn)) ||
        (r = call_stream(fn, sendbuff, recvbuff, stream, &ps)))
        return r;
    return work_done(plait_allreduce(sendbuff, recvbuff, count, (plait_datatype_t)datatype, (plait_redop_t)op, pc, ps));
}

ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                            ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclBroadcast";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = call_stream(fn, sendbuff, recvbuff, stream, &ps)))
        return r;
    return work_done(plait_broadcast(sendbuff, recvbuff, count, (plait_datatype_t)datatype, root, pc, ps));
}

/* NCCL's in-place broadcast. */
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream)
{
    static const char fn[] = "ncclBcast";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = call_stream(fn, buff, NULL, stream, &ps)))
        return r;
    return work_done(plait_broadcast(buff, buff, count, (plait_datatype_t)datatype, root, pc, ps));
}

ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                         int root, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclReduce";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) || (r = check_op(op, fn)) ||
        (r = call_stream(fn, sendbuff, recvbuff, stream, &ps)))
        return r;
    return work_done(
        plait_reduce(sendbuff, recvbuff, count, (plait_datatype_t)datatype, (plait_redop_t)op, root, pc, ps));
}

ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclAllGather";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = call_stream(fn, sendbuff, recvbuff, stream, &ps)))
        return r;
    return work_done(plait_allgather(sendbuff, recvbuff, sendcount, (plait_datatype_t)datatype, pc, ps));
}

ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclReduceScatter";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) || (r = check_op(op, fn)) ||
        (r = call_stream(fn, sendbuff, recvbuff, stream, &ps)))
        return r;
    return work_done(
        plait_reducescatter(sendbuff, recvbuff, recvcount, (plait_datatype_t)datatype, (plait_redop_t)op, pc, ps));
}

ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclAlltoAll";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = call_stream(fn, sendbuff, recvbuff, stream, &ps)))
        return r;
    return work_done(plait_alltoall(sendbuff, recvbuff, count, (plait_datatype_t)datatype, pc, ps));
}

ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclGather";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = call_stream(fn, sendbuff, recvbuff, stream, &ps)))
        return r;
    return work_done(plait_gather(sendbuff, recvbuff, count, (plait_datatype_t)datatype, root, pc, ps));
}

ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                          ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclScatter";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = call_stream(fn, sendbuff, recvbuff, stream, &ps)))
        return r;
    return work_done(plait_scatter(sendbuff, recvbuff, count, (plait_datatype_t)datatype, root, pc, ps));
}

ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream)
{
    static const char fn[] = "ncclSend";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = call_stream(fn, sendbuff, NULL, stream, &ps)))
        return r;
    return work_done(plait_send(sendbuff, count, (plait_datatype_t)datatype, peer, pc, ps));
}

ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream)
{
    static const char fn[] = "ncclRecv";
    plait_comm_t pc = NULL;
    plait_stream_t ps = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = call_stream(fn, recvbuff, NULL, stream, &ps)))
        return r;
    return work_done(plait_recv(recvbuff, count, (plait_datatype_t)datatype, peer, pc, ps));
}

/* ---------------------------------------------------------------- device API, host side
 *
 * NCCL's device API lets the user's own kernels communicate (nccl_device.h:
 * ncclDevComm, load/store and GIN barriers, the LL all-to-all) through
 * symmetric memory windows. plait's CUDA backend runs plait's kernels only: it
 * has memory windows (ncclCommWindowRegister) but no device-side library for
 * user kernels, so the entry points that create resources fail with
 * ncclInvalidUsage. The team queries answer as if no peer were load/store
 * accessible (no device API can use one): the LSA team is the rank alone and
 * the rail team is the world. */

static const char device_api_msg[] =
    "plait has no device-side API for user kernels (NCCL's nccl_device.h: ncclDevComm, LSA/GIN barriers, LL "
    "all-to-all); its CUDA backend runs plait's own kernels only";

ncclResult_t pncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm)
{
    (void)reqs;
    (void)outDevComm;
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclDevCommCreate", 0, &pc);
    if (r)
        return r;
    return shim_error(ncclInvalidUsage, "ncclDevCommCreate: %s", device_api_msg);
}

ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm)
{
    (void)devComm;
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, "ncclDevCommDestroy", 0, &pc);
    if (r)
        return r;
    return shim_error(ncclInvalidUsage, "ncclDevCommDestroy: no device communicator exists: %s", device_api_msg);
}

/* The world team {nranks, rank, 1}; {0, 0, 0} for a handle that is not a
 * usable communicator (then ncclGetLastError says why). */
static ncclTeam_t team_world(ncclComm_t comm, const char *fn)
{
    ncclTeam_t t = {0, 0, 0};
    plait_comm_t pc = NULL;
    int n = 0, me = 0;
    if (comm_get(comm, fn, 0, &pc) == ncclSuccess && plait_comm_count(pc, &n) == PLAIT_SUCCESS &&
        plait_comm_rank(pc, &me) == PLAIT_SUCCESS) {
        t.nRanks = n;
        t.rank = me;
        t.stride = 1;
    }
    return t;
}

ncclTeam_t pncclTeamWorld(ncclComm_t comm)
{
    return team_world(comm, "ncclTeamWorld");
}

ncclTeam_t pncclTeamLsa(ncclComm_t comm)
{
    ncclTeam_t world = team_world(comm, "ncclTeamLsa");
    ncclTeam_t t = {0, 0, 0};
    if (world.nRanks > 0) {
        t.nRanks = 1;
        t.stride = 1;
    }
    return t;
}

/* The outer factor of the LSA team (size 1): the world. */
ncclTeam_t pncclTeamRail(ncclComm_t comm)
{
    return team_world(comm, "ncclTeamRail");
}

/* NCCL's rule: the world rank of `rank` in `team` is the caller's world rank
 * plus its distance from the caller in the team, times the team's stride.
 * -1 for a handle that is not a usable communicator. */
int pncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank)
{
    ncclTeam_t world = team_world(comm, "ncclTeamRankToWorld");
    if (world.nRanks == 0)
        return -1;
    return world.rank + (rank - team.rank) * team.stride;
}

/* The same, relative to the caller's LSA rank (0: the LSA team is the rank alone). */
int pncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank)
{
    ncclTeam_t world = team_world(comm, "ncclTeamRankToLsa");
    if (world.nRanks == 0)
        return -1;
    return (rank - team.rank) * team.stride;
}

ncclResult_t pncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t *outHandle,
                                              ncclDevResourceRequirements_t *outReq)
{
    (void)team;
    (void)nBarriers;
    (void)outHandle;
    (void)outReq;
    return shim_error(ncclInvalidUsage, "ncclLsaBarrierCreateRequirement: %s", device_api_msg);
}

ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                              ncclGinBarrierHandle_t *outHandle, ncclDevResourceRequirements_t *outReq)
{
    (void)comm;
    (void)team;
    (void)nBarriers;
    (void)outHandle;
    (void)outReq;
    return shim_error(ncclInvalidUsage, "ncclGinBarrierCreateRequirement: %s", device_api_msg);
}

/* Slots an LL all-to-all needs for maxElts elements of maxEltSize bytes: one
 * per 8 bytes of each element (an LL slot carries 8 bytes of data), as NCCL
 * computes it. Pure arithmetic, so it answers without a device API. */
int pncclLLA2ACalcSlots(int maxElts, int maxEltSize)
{
    return maxElts * ((maxEltSize + 7) / 8);
}

ncclResult_t pncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t *outHandle,
                                         ncclDevResourceRequirements_t *outReq)
{
    (void)nBlocks;
    (void)nSlots;
    (void)outHandle;
    (void)outReq;
    return shim_error(ncclInvalidUsage, "ncclLLA2ACreateRequirement: %s", device_api_msg);
}

/* ---------------------------------------------------------------- ncclX: weak aliases of pncclX
 *
 * A tool that defines ncclX (a profiler) interposes it and calls pncclX. */

extern __typeof__(pncclMemAlloc) ncclMemAlloc __attribute__((weak, alias("pncclMemAlloc")));
extern __typeof__(pncclMemFree) ncclMemFree __attribute__((weak, alias("pncclMemFree")));
extern __typeof__(pncclGetVersion) ncclGetVersion __attribute__((weak, alias("pncclGetVersion")));
extern __typeof__(pncclGetUniqueId) ncclGetUniqueId __attribute__((weak, alias("pncclGetUniqueId")));
extern __typeof__(pncclCommInitRankConfig) ncclCommInitRankConfig
    __attribute__((weak, alias("pncclCommInitRankConfig")));
extern __typeof__(pncclCommInitRank) ncclCommInitRank __attribute__((weak, alias("pncclCommInitRank")));
extern __typeof__(pncclCommInitAll) ncclCommInitAll __attribute__((weak, alias("pncclCommInitAll")));
extern __typeof__(pncclCommInitRankScalable) ncclCommInitRankScalable
    __attribute__((weak, alias("pncclCommInitRankScalable")));
extern __typeof__(pncclCommFinalize) ncclCommFinalize __attribute__((weak, alias("pncclCommFinalize")));
extern __typeof__(pncclCommDestroy) ncclCommDestroy __attribute__((weak, alias("pncclCommDestroy")));
extern __typeof__(pncclCommAbort) ncclCommAbort __attribute__((weak, alias("pncclCommAbort")));
extern __typeof__(pncclCommRevoke) ncclCommRevoke __attribute__((weak, alias("pncclCommRevoke")));
extern __typeof__(pncclCommSplit) ncclCommSplit __attribute__((weak, alias("pncclCommSplit")));
extern __typeof__(pncclCommShrink) ncclCommShrink __attribute__((weak, alias("pncclCommShrink")));
extern __typeof__(pncclGetErrorString) ncclGetErrorString __attribute__((weak, alias("pncclGetErrorString")));
extern __typeof__(pncclGetLastError) ncclGetLastError __attribute__((weak, alias("pncclGetLastError")));
extern __typeof__(pncclResetDebugInit) ncclResetDebugInit __attribute__((weak, alias("pncclResetDebugInit")));
extern __typeof__(pncclCommGetAsyncError) ncclCommGetAsyncError __attribute__((weak, alias("pncclCommGetAsyncError")));
extern __typeof__(pncclCommCount) ncclCommCount __attribute__((weak, alias("pncclCommCount")));
extern __typeof__(pncclCommCuDevice) ncclCommCuDevice __attribute__((weak, alias("pncclCommCuDevice")));
extern __typeof__(pncclCommUserRank) ncclCommUserRank __attribute__((weak, alias("pncclCommUserRank")));
extern __typeof__(pncclCommRegister) ncclCommRegister __attribute__((weak, alias("pncclCommRegister")));
extern __typeof__(pncclCommDeregister) ncclCommDeregister __attribute__((weak, alias("pncclCommDeregister")));
extern __typeof__(pncclCommWindowRegister) ncclCommWindowRegister
    __attribute__((weak, alias("pncclCommWindowRegister")));
extern __typeof__(pncclCommWindowDeregister) ncclCommWindowDeregister
    __attribute__((weak, alias("pncclCommWindowDeregister")));
extern __typeof__(pncclRedOpCreatePreMulSum) ncclRedOpCreatePreMulSum
    __attribute__((weak, alias("pncclRedOpCreatePreMulSum")));
extern __typeof__(pncclRedOpDestroy) ncclRedOpDestroy __attribute__((weak, alias("pncclRedOpDestroy")));
extern __typeof__(pncclReduce) ncclReduce __attribute__((weak, alias("pncclReduce")));
extern __typeof__(pncclBcast) ncclBcast __attribute__((weak, alias("pncclBcast")));
extern __typeof__(pncclBroadcast) ncclBroadcast __attribute__((weak, alias("pncclBroadcast")));
extern __typeof__(pncclAllReduce) ncclAllReduce __attribute__((weak, alias("pncclAllReduce")));
extern __typeof__(pncclReduceScatter) ncclReduceScatter __attribute__((weak, alias("pncclReduceScatter")));
extern __typeof__(pncclAllGather) ncclAllGather __attribute__((weak, alias("pncclAllGather")));
extern __typeof__(pncclAlltoAll) ncclAlltoAll __attribute__((weak, alias("pncclAlltoAll")));
extern __typeof__(pncclGather) ncclGather __attribute__((weak, alias("pncclGather")));
extern __typeof__(pncclScatter) ncclScatter __attribute__((weak, alias("pncclScatter")));
extern __typeof__(pncclSend) ncclSend __attribute__((weak, alias("pncclSend")));
extern __typeof__(pncclRecv) ncclRecv __attribute__((weak, alias("pncclRecv")));
extern __typeof__(pncclGroupStart) ncclGroupStart __attribute__((weak, alias("pncclGroupStart")));
extern __typeof__(pncclGroupEnd) ncclGroupEnd __attribute__((weak, alias("pncclGroupEnd")));
extern __typeof__(pncclGroupSimulateEnd) ncclGroupSimulateEnd __attribute__((weak, alias("pncclGroupSimulateEnd")));
extern __typeof__(pncclDevCommCreate) ncclDevCommCreate __attribute__((weak, alias("pncclDevCommCreate")));
extern __typeof__(pncclDevCommDestroy) ncclDevCommDestroy __attribute__((weak, alias("pncclDevCommDestroy")));
extern __typeof__(pncclTeamWorld) ncclTeamWorld __attribute__((weak, alias("pncclTeamWorld")));
extern __typeof__(pncclTeamLsa) ncclTeamLsa __attribute__((weak, alias("pncclTeamLsa")));
extern __typeof__(pncclTeamRail) ncclTeamRail __attribute__((weak, alias("pncclTeamRail")));
extern __typeof__(pncclTeamRankToWorld) ncclTeamRankToWorld __attribute__((weak, alias("pncclTeamRankToWorld")));
extern __typeof__(pncclTeamRankToLsa) ncclTeamRankToLsa __attribute__((weak, alias("pncclTeamRankToLsa")));
extern __typeof__(pncclLsaBarrierCreateRequirement) ncclLsaBarrierCreateRequirement
    __attribute__((weak, alias("pncclLsaBarrierCreateRequirement")));
extern __typeof__(pncclGinBarrierCreateRequirement) ncclGinBarrierCreateRequirement
    __attribute__((weak, alias("pncclGinBarrierCreateRequirement")));
extern __typeof__(pncclLLA2ACalcSlots) ncclLLA2ACalcSlots __attribute__((weak, alias("pncclLLA2ACalcSlots")));
extern __typeof__(pncclLLA2ACreateRequirement) ncclLLA2ACreateRequirement
    __attribute__((weak, alias("pncclLLA2ACreateRequirement")));
