/*
 * libnccl.so.2: NCCL's API and ABI over plait's public API.
 *
 * A thin layer: it translates arguments, keeps the little state NCCL has and
 * plait lacks (the CUDA device a communicator names, revocation, creations
 * deferred to ncclGroupEnd), and calls libplait.so, which it links to (one
 * global state, no second copy of plait). Every pncclX below is the definition
 * and ncclX a weak alias of it (at the end of the file), as in NVIDIA's library.
 *
 * Buffers. In this release plait runs on host memory only. A pointer is
 * treated as device memory only when the process has loaded the CUDA driver
 * and the driver says so; such calls fail with ncclInvalidUsage. The
 * cudaStream_t argument is ignored: with host buffers a call is complete when
 * it returns (in a group: when ncclGroupEnd returns).
 *
 * What each function does, and what differs from NCCL: docs/nccl-compat.md.
 */
#define _GNU_SOURCE
#include "nccl_abi.h"

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
        f = fopen(path, "a");
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

/* ---------------------------------------------------------------- CUDA pointers
 *
 * Device memory exists only in a process that has loaded the CUDA driver
 * (libcuda.so.1, loaded by the CUDA runtime or linked by the application). So
 * the shim never loads or initialises CUDA itself, which keeps CPU-only and
 * forking jobs free of it: it looks for a driver that is already loaded
 * (RTLD_NOLOAD) and asks it about each buffer. Until the driver appears, the
 * look-up is repeated only when the process has loaded new objects (the
 * loader's counter, read through dl_iterate_phdr), so a CPU-only call costs one
 * counter read. A driver that answers with an error (not initialised, or a
 * pointer it does not know) means host memory. */

typedef int (*cu_pointer_get_attribute_fn)(void *data, int attribute, unsigned long long ptr);
typedef int (*cu_ctx_get_current_fn)(void **ctx);

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_MEMORYTYPE_DEVICE 2

static cu_pointer_get_attribute_fn cu_get_attribute;
static cu_ctx_get_current_fn cu_ctx_get_current;
static unsigned long long cu_probed_adds;

static int loader_adds_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
        *(unsigned long long *)data = info->dlpi_adds;
    return 1; /* the counter is the same in every entry: stop at the first */
}

static cu_pointer_get_attribute_fn cuda_driver(void)
{
    cu_pointer_get_attribute_fn fn = __atomic_load_n(&cu_get_attribute, __ATOMIC_ACQUIRE);
    if (fn)
        return fn;
    unsigned long long adds = 0;
    dl_iterate_phdr(loader_adds_cb, &adds);
    if (adds != 0 && adds == __atomic_load_n(&cu_probed_adds, __ATOMIC_RELAXED))
        return NULL;
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h) {
        void *get = dlsym(h, "cuPointerGetAttribute");
        void *ctx = dlsym(h, "cuCtxGetCurrent");
        if (get && ctx) {
            cu_ctx_get_current_fn ctx_fn;
            memcpy(&ctx_fn, &ctx, sizeof(ctx_fn));
            __atomic_store_n(&cu_ctx_get_current, ctx_fn, __ATOMIC_RELAXED);
            memcpy(&fn, &get, sizeof(fn));
            /* The handle is kept: the driver stays loaded for the process. */
            __atomic_store_n(&cu_get_attribute, fn, __ATOMIC_RELEASE);
        } else {
            dlclose(h);
        }
    }
    __atomic_store_n(&cu_probed_adds, adds, __ATOMIC_RELAXED);
    return fn;
}

static int is_device_pointer(cu_pointer_get_attribute_fn get, const void *p)
{
    unsigned int type = 0, managed = 0;
    unsigned long long addr = (unsigned long long)(uintptr_t)p;
    if (!p || get(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) != 0 || type != CU_MEMORYTYPE_DEVICE)
        return 0;
    /* Managed memory is reachable from the host: the CPU backend can run on it. */
    return !(get(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, addr) == 0 && managed);
}

/* ncclInvalidUsage when a buffer is device memory (b may be NULL or a). */
static ncclResult_t check_host(const char *fn, const char *name_a, const void *a, const char *name_b, const void *b)
{
    cu_pointer_get_attribute_fn get = cuda_driver();
    if (!get)
        return ncclSuccess;
    const char *name = NULL;
    const void *p = NULL;
    if (is_device_pointer(get, a)) {
        name = name_a;
        p = a;
    } else if (b && b != a && is_device_pointer(get, b)) {
        name = name_b;
        p = b;
    }
    if (!name)
        return ncclSuccess;
    return shim_error(ncclInvalidUsage,
                      "%s: %s (%p) is device memory, which needs the CUDA backend (not built yet): this libnccl.so.2 "
                      "from plait runs on host memory only",
                      fn, name, p);
}

/* Whether the calling thread has a current CUDA context: a GPU program. */
static int cuda_context_current(void)
{
    if (!cuda_driver())
        return 0;
    cu_ctx_get_current_fn get = __atomic_load_n(&cu_ctx_get_current, __ATOMIC_RELAXED);
    void *ctx = NULL;
    return get && get(&ctx) == 0 && ctx != NULL;
}

/* ---------------------------------------------------------------- communicators
 *
 * ncclComm_t points to a small wrapper around plait's communicator. Wrappers of
 * aborted communicators are kept for a while (the graveyard), because
 * ncclCommAbort may be called while another thread is inside a call on the
 * communicator: that call still reads the wrapper when plait returns. */

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
    struct ncclComm *next;      /* in the registry of live wrappers, or in the graveyard */
};

/* The registry lets ncclGetLastError(comm) accept any pointer (a program may
 * pass the uninitialised handle of a failed init). One lock for it and the
 * graveyard; it is held for list operations only. */
static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *live_comms;
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
    pthread_mutex_lock(&shim_lock);
    w->next = live_comms;
    live_comms = w;
    pthread_mutex_unlock(&shim_lock);
    return w;
}

static void registry_remove_locked(struct ncclComm *w)
{
    for (struct ncclComm **pp = &live_comms; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            w->next = NULL;
            return;
        }
}

/* Frees a wrapper that never reached the caller. */
static void comm_discard(struct ncclComm *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&shim_lock);
    registry_remove_locked(w);
    pthread_mutex_unlock(&shim_lock);
    free(w);
}

/* The wrapper, if `comm` is a live one we made; NULL otherwise. Takes the lock. */
static struct ncclComm *registry_find(ncclComm_t comm)
{
    struct ncclComm *found = NULL;
    pthread_mutex_lock(&shim_lock);
    for (struct ncclComm *w = live_comms; w; w = w->next)
        if (w == comm) {
            found = w;
            break;
        }
    pthread_mutex_unlock(&shim_lock);
    return found;
}

/* Checks the handle and gives plait's communicator. `for_work`: collectives,
 * point-to-point and op creation, refused after ncclCommRevoke. */
static ncclResult_t comm_get(ncclComm_t comm, const char *fn, int for_work, plait_comm_t *pc_out)
{
    if (!comm)
        return shim_error(ncclInvalidArgument, "%s: comm is NULL", fn);
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
                          "ncclGroupSimulateEnd: plait has no cost model yet, so it cannot estimate the group's time "
                          "(the group level is closed; nothing ran)");
    }
    return shim_error(ncclInvalidUsage,
                      "ncclGroupSimulateEnd: plait has no cost model yet, so it cannot estimate the group's time; "
                      "the group (%u operations) stays open: end it with ncclGroupEnd to run it",
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
    struct ncclComm *w = comm ? registry_find(comm) : NULL;
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
    struct ncclComm *w = comm_new(&cfg, name, -1);
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
    ncclResult_t r = ncclSuccess;
    if (!pcs || !ws) {
        r = shim_error(ncclSystemError, "ncclCommInitAll: out of memory");
        goto out;
    }
    const plait_config_t def = PLAIT_CONFIG_INITIALIZER;
    for (int i = 0; i < ndev; i++) {
        /* The device each rank was given (NCCL: the first ndev devices when devlist is NULL). */
        ws[i] = comm_new(&def, NULL, devlist ? devlist[i] : i);
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
    if (color != NCCL_SPLIT_NOCOLOR && !(w = comm_new(&cfg, name, comm->cuda_dev)))
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
    struct ncclComm *w = comm_new(&cfg, name, comm->cuda_dev);
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
    pthread_mutex_lock(&shim_lock);
    registry_remove_locked(comm);
    pthread_mutex_unlock(&shim_lock);
    plait_comm_t pc = __atomic_exchange_n(&comm->pc, NULL, __ATOMIC_ACQ_REL);
    __atomic_store_n(&comm->magic, 0, __ATOMIC_RELEASE);
    r = pc ? from_plait(plait_comm_destroy(pc)) : ncclSuccess;
    free(comm);
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
    pthread_mutex_lock(&shim_lock);
    registry_remove_locked(comm);
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
        free(old);
        old = next;
    }
    return r;
}

/* plait cannot stop a communicator's work without freeing it (that is
 * ncclCommAbort). With host buffers a call on this thread is complete when it
 * returns, so revoking marks the communicator: later collectives,
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
    if (!comm)
        return shim_error(ncclInvalidArgument, "%s: comm is NULL", fn);
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

/* The CUDA device the communicator was given: ncclCommInitAll's devlist entry
 * (or the rank, when devlist is NULL), inherited by split and shrink children;
 * -1 for the others, since no CUDA device is used by a host communicator. */
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

ncclResult_t pncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr)
        return shim_error(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    if (cuda_context_current())
        return shim_error(ncclInvalidUsage,
                          "ncclMemAlloc: this thread has a CUDA context, so the caller wants device memory, which "
                          "needs the CUDA backend (not built yet)");
    /* Host memory, page-aligned and rounded up to whole pages, so that it
     * meets NCCL_WIN_REQUIRED_ALIGNMENT too. */
    const size_t page = NCCL_WIN_REQUIRED_ALIGNMENT;
    if (size > SIZE_MAX - page)
        return shim_error(ncclInvalidArgument, "ncclMemAlloc: size %zu is too large", size);
    size_t bytes = size == 0 ? page : (size + page - 1) / page * page;
    void *p = NULL;
    if (posix_memalign(&p, page, bytes) != 0)
        return shim_error(ncclSystemError, "ncclMemAlloc: cannot allocate %zu bytes of host memory", bytes);
    *ptr = p;
    return ncclSuccess;
}

ncclResult_t pncclMemFree(void *ptr)
{
    ncclResult_t r = check_host("ncclMemFree", "ptr", ptr, NULL, NULL);
    if (r)
        return r;
    free(ptr);
    return ncclSuccess;
}

ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    static const char fn[] = "ncclCommRegister";
    plait_comm_t pc = NULL;
    ncclResult_t r = comm_get(comm, fn, 0, &pc);
    if (r || (r = check_host(fn, "buff", buff, NULL, NULL)))
        return r;
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
    if ((r = check_host(fn, "scalar", scalar, NULL, NULL)))
        return r;
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
 * Each checks the handle, the type and op, and that the buffers are host
 * memory, then calls plait on the NULL stream: the call is complete when it
 * returns, or, in a group, when ncclGroupEnd returns. */

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
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) || (r = check_op(op, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, "recvbuff", recvbuff)))
        return r;
    return work_done(plait_allreduce(sendbuff, recvbuff, count, (plait_datatype_t)datatype, (plait_redop_t)op, pc, NULL));
}

ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                            ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclBroadcast";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, "recvbuff", recvbuff)))
        return r;
    return work_done(plait_broadcast(sendbuff, recvbuff, count, (plait_datatype_t)datatype, root, pc, NULL));
}

/* NCCL's in-place broadcast. */
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream)
{
    static const char fn[] = "ncclBcast";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = check_host(fn, "buff", buff, NULL, NULL)))
        return r;
    return work_done(plait_broadcast(buff, buff, count, (plait_datatype_t)datatype, root, pc, NULL));
}

ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                         int root, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclReduce";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) || (r = check_op(op, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, "recvbuff", recvbuff)))
        return r;
    return work_done(
        plait_reduce(sendbuff, recvbuff, count, (plait_datatype_t)datatype, (plait_redop_t)op, root, pc, NULL));
}

ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclAllGather";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, "recvbuff", recvbuff)))
        return r;
    return work_done(plait_allgather(sendbuff, recvbuff, sendcount, (plait_datatype_t)datatype, pc, NULL));
}

ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclReduceScatter";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) || (r = check_op(op, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, "recvbuff", recvbuff)))
        return r;
    return work_done(
        plait_reducescatter(sendbuff, recvbuff, recvcount, (plait_datatype_t)datatype, (plait_redop_t)op, pc, NULL));
}

ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclAlltoAll";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, "recvbuff", recvbuff)))
        return r;
    return work_done(plait_alltoall(sendbuff, recvbuff, count, (plait_datatype_t)datatype, pc, NULL));
}

ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclGather";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, "recvbuff", recvbuff)))
        return r;
    return work_done(plait_gather(sendbuff, recvbuff, count, (plait_datatype_t)datatype, root, pc, NULL));
}

ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                          ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclScatter";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, "recvbuff", recvbuff)))
        return r;
    return work_done(plait_scatter(sendbuff, recvbuff, count, (plait_datatype_t)datatype, root, pc, NULL));
}

ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream)
{
    static const char fn[] = "ncclSend";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = check_host(fn, "sendbuff", sendbuff, NULL, NULL)))
        return r;
    return work_done(plait_send(sendbuff, count, (plait_datatype_t)datatype, peer, pc, NULL));
}

ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream)
{
    static const char fn[] = "ncclRecv";
    (void)stream;
    plait_comm_t pc = NULL;
    ncclResult_t r;
    if ((r = comm_get(comm, fn, 1, &pc)) || (r = check_type(datatype, fn)) ||
        (r = check_host(fn, "recvbuff", recvbuff, NULL, NULL)))
        return r;
    return work_done(plait_recv(recvbuff, count, (plait_datatype_t)datatype, peer, pc, NULL));
}

/* ---------------------------------------------------------------- device API, host side
 *
 * NCCL's device API (kernels that communicate through symmetric windows) needs
 * the CUDA backend. Until it exists, the entry points that create resources
 * fail with ncclInvalidUsage; the team queries answer for a host
 * communicator, where no peer is load/store accessible: the LSA team is the
 * rank alone and the rail team is the world. */

static const char device_api_msg[] = "NCCL's device API needs the CUDA backend (not built yet)";

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
 * computes it. Pure arithmetic, so it answers without the CUDA backend. */
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
