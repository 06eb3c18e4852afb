/* The CUDA test double: a stand-in for libcuda.so.1 (see cuda_double.h for
 * what it emulates, what it checks and what it refuses).
 *
 * Layout of the state:
 *  - g_lock guards contexts, streams (queues, counters, capture), events,
 *    graphs and the kernel table; g_cond is broadcast on every change of
 *    that state (an item enqueued or done, a hold released), and every
 *    waiter (stream workers, synchronising calls) re-checks its condition.
 *    One lock and one condition keep the double obviously right; it is not
 *    meant to be fast.
 *  - g_mem_lock guards the table of allocations, so that pointer queries and
 *    memcpy validation never wait for stream bookkeeping.
 *  - counters (struct plait_cuda_double_stats) are atomics.
 *
 * Ordering: a stream counts items enqueued and items done; an event is
 * (stream, enqueued count when recorded) and completes when the stream's done
 * count reaches it. Waits between streams are queue items that are "ready"
 * once the other stream's done count is high enough. Stream objects are never
 * freed, only recycled (with their worker thread) once destroyed and drained,
 * so (stream, count) pairs held by events and waits stay meaningful: the
 * counts only grow. */
#define _GNU_SOURCE
#include "tests/cuda_double.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/cuda/cu.h"

#define API __attribute__((visibility("default")))

/* CUDA's result codes (cuda.h), those the double returns. */
enum {
    DBL_SUCCESS = 0,
    DBL_ERROR_INVALID_VALUE = 1,
    DBL_ERROR_OUT_OF_MEMORY = 2,
    DBL_ERROR_NOT_INITIALIZED = 3,
    DBL_ERROR_NO_DEVICE = 100,
    DBL_ERROR_INVALID_DEVICE = 101,
    DBL_ERROR_INVALID_CONTEXT = 201,
    DBL_ERROR_MAP_FAILED = 205,
    DBL_ERROR_ALREADY_MAPPED = 208,
    DBL_ERROR_INVALID_HANDLE = 400,
    DBL_ERROR_ILLEGAL_STATE = 401,
    DBL_ERROR_NOT_FOUND = 500,
    DBL_ERROR_NOT_READY = 600,
    DBL_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    DBL_ERROR_LAUNCH_TIMEOUT = 702,
    DBL_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    DBL_ERROR_CONTEXT_IS_DESTROYED = 709,
    DBL_ERROR_NOT_SUPPORTED = 801,
    DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    DBL_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    DBL_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    DBL_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    DBL_ERROR_CAPTURED_EVENT = 907,
    DBL_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
};

static const struct dbl_error {
    int code;
    const char *name;
    const char *text;
} dbl_errors[] = {
    {DBL_SUCCESS, "CUDA_SUCCESS", "no error"},
    {DBL_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {DBL_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {DBL_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {DBL_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {DBL_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {DBL_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {DBL_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {DBL_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {DBL_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {DBL_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {DBL_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {DBL_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {DBL_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {DBL_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {DBL_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {DBL_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {DBL_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {DBL_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {DBL_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
     "dependency created on uncaptured work in another stream"},
    {DBL_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {DBL_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {DBL_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
};

#define DBL_MAX_DEVICES 16
#define DBL_MAX_KERNELS 16
#define DBL_MAX_SHMEM (48 * 1024)   /* dynamic shared memory without opt-in, as CUDA */
#define DBL_PRIO_GREATEST (-5)      /* an H100's stream priority range: [-5, 0] */
#define DBL_PRIO_LEAST 0
#define DBL_IPC_MAGIC 0x70637564u   /* "pcud" */

/* PCI buses of a DGX H100's eight GPUs, then one bus per further device. */
static const int dbl_pci_bus[] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

static struct plait_cuda_double_stats g_stats;

static void stat_inc(uint64_t *counter)
{
    __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- global state */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER; /* CLOCK_REALTIME deadlines */
static pthread_rwlock_t g_mem_lock = PTHREAD_RWLOCK_INITIALIZER;
static int g_initialized;   /* cuInit succeeded (atomic) */
static int g_ndevices;
static double g_timeout_s = 300.0;
static int g_sticky;        /* first asynchronous error (a stream memory wait that timed out, ...) */
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static int g_init_result;

struct dctx {
    uint32_t magic;
    int device;
    int refs;      /* primary context retains */
    int is_alive;
    uint64_t peers; /* bit i: peer access to device i enabled */
};
#define DBL_CTX_MAGIC 0x63747864u
static struct dctx g_ctx[DBL_MAX_DEVICES];
static __thread struct dctx *t_ctx;

struct dkernel {
    uint32_t magic;
    char name[64];
    void (*fn)(const void *params, unsigned cta, unsigned ncta);
    size_t params_bytes;
};
#define DBL_FUNC_MAGIC 0x66756e63u
static struct dkernel g_kernels[DBL_MAX_KERNELS];

struct dmodule {
    uint32_t magic;
};
#define DBL_MODULE_MAGIC 0x6d6f646cu

/* ---------------------------------------------------------------- queue items */

enum item_kind {
    IT_NOP,          /* a marker (event record, legacy-stream synchronisation) */
    IT_WAIT_STREAM,  /* ready when u.wait.s has done u.wait.seq items */
    IT_KERNEL,
    IT_MEMCPY,
    IT_MEMSET,
    IT_WAIT_VALUE,   /* spins until *addr >= value */
    IT_WRITE_VALUE,
    IT_HOST_FUNC,
    IT_GRAPH,        /* runs an instantiated graph's items in order */
};

struct dstream;
struct dexec;

struct item {
    struct item *next;
    enum item_kind kind;
    union {
        struct {
            struct dstream *s;
            uint64_t seq;
        } wait;
        struct {
            void (*fn)(const void *, unsigned, unsigned);
            unsigned grid;
            void *params; /* owned copy */
            size_t params_bytes;
        } kernel;
        struct {
            void *dst;
            const void *src;
            size_t n;
            void *owned; /* a snapshot of a pageable source (src points to it), or NULL */
        } copy;
        struct {
            void *dst;
            unsigned char v;
            size_t n;
        } set;
        struct {
            uint64_t *addr;
            uint64_t v;
        } value;
        struct {
            void (*fn)(void *);
            void *arg;
        } host;
        struct {
            struct dexec *exec;
        } graph;
    } u;
};

struct dgraph {
    uint32_t magic;
    struct item *head, *tail;
};
#define DBL_GRAPH_MAGIC 0x67726170u

struct dexec {
    uint32_t magic;
    int is_destroyed; /* cuGraphExecDestroy called: the handle is invalid */
    struct item *head;
    int refs;         /* the handle (until cuGraphExecDestroy) + launches queued */
};
#define DBL_EXEC_MAGIC 0x65786563u

struct dstream {
    uint32_t magic;
    struct dstream *next_all;
    unsigned flags;
    int priority;
    int is_legacy;
    int device;        /* of the context current when it was made */
    int is_free;       /* destroyed and drained: may be handed out again */
    int is_destroyed;  /* destroyed, still draining */
    int is_held;
    struct item *head, *tail;
    uint64_t enqueued, done;
    /* capture */
    int is_capturing;
    int is_invalidated;
    int capture_mode;
    pthread_t capture_thread;
    struct dgraph *graph;
};
#define DBL_STREAM_MAGIC 0x7374726du
static struct dstream *g_streams; /* every stream ever made (never freed) */
static struct dstream *g_legacy[DBL_MAX_DEVICES]; /* per (primary) context, as CUDA's */

struct devent {
    uint32_t magic;
    unsigned flags;
    struct dstream *s; /* NULL: never recorded (complete) */
    uint64_t seq;
    struct dgraph *captured_in;
};
#define DBL_EVENT_MAGIC 0x6576656eu

/* ---------------------------------------------------------------- allocations */

enum mem_kind { MEMK_DEVICE, MEMK_MANAGED, MEMK_HOST, MEMK_IPC };

struct dmem {
    struct dmem *next;
    uintptr_t base;
    size_t bytes;     /* as asked */
    size_t map_bytes; /* mapped (whole pages) */
    int fd;           /* the memfd (-1 for IPC mappings: closed after mmap) */
    int kind;
    int device;
    int refs;         /* IPC mappings: opens */
    int32_t ipc_pid;  /* IPC mappings: the exporter and its inode */
    uint64_t ipc_ino;
    uint64_t ino;
};
static struct dmem *g_mem;

struct ipc_wire {
    uint32_t magic;
    int32_t pid;
    int32_t fd;
    int32_t device;
    uint64_t bytes;
    uint64_t ino;
};

/* ---------------------------------------------------------------- helpers */

static void deadline_in(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    long long ns = ts->tv_nsec + (long long)((seconds - (long long)seconds) * 1e9);
    ts->tv_sec += (time_t)seconds + (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
}

static int is_initialized(void)
{
    return __atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE);
}

static void set_sticky(int res)
{
    int zero = 0;
    __atomic_compare_exchange_n(&g_sticky, &zero, res, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static int sticky(void)
{
    return __atomic_load_n(&g_sticky, __ATOMIC_ACQUIRE);
}

/* The calling thread's context, as calls that need one check it. */
static int need_ctx(void)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (t_ctx == NULL)
        return DBL_ERROR_INVALID_CONTEXT;
    if (!__atomic_load_n(&t_ctx->is_alive, __ATOMIC_ACQUIRE))
        return DBL_ERROR_CONTEXT_IS_DESTROYED;
    return DBL_SUCCESS;
}

/* Finds the allocation holding [p, p + n) (n 0: just p); copies it to *out.
 * Returns 0 when found. */
static int mem_find(uintptr_t p, size_t n, struct dmem *out)
{
    int found = -1;
    pthread_rwlock_rdlock(&g_mem_lock);
    for (struct dmem *m = g_mem; m != NULL; m = m->next) {
        if (p >= m->base && p < m->base + m->bytes && (n == 0 || n <= m->base + m->bytes - p)) {
            *out = *m;
            found = 0;
            break;
        }
    }
    pthread_rwlock_unlock(&g_mem_lock);
    return found;
}

/* Whether [p, p + n) is memory the device can reach: device, managed, IPC or
 * pinned host memory (which this double maps at the same address). */
static int mem_device_visible(uintptr_t p, size_t n)
{
    struct dmem m;
    return n == 0 || mem_find(p, n, &m) == 0;
}

/* ---------------------------------------------------------------- capture rules (g_lock held) */

/* Whether a capture in progress forbids the calling thread a potentially
 * unsafe call (an allocation, a free, a synchronisation): its own capture
 * not begun RELAXED, or another thread's GLOBAL one. Such a call fails, and
 * the capture that forbade it is invalidated, as CUDA does. */
/* The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode):
 * RELAXED makes no call unsafe, THREAD_LOCAL ignores other threads' captures. */
static __thread int t_capture_mode = PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL;

static int capture_forbids_unsafe_locked(void)
{
    int forbidden = 0;
    pthread_t self = pthread_self();
    if (t_capture_mode == PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED)
        return 0;
    for (struct dstream *s = g_streams; s != NULL; s = s->next_all) {
        if (!s->is_capturing || s->is_invalidated)
            continue;
        int own = pthread_equal(s->capture_thread, self);
        if ((own && s->capture_mode != PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!own && t_capture_mode == PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL &&
             s->capture_mode == PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            s->is_invalidated = 1;
            forbidden = 1;
        }
    }
    return forbidden;
}

static int capture_forbids_unsafe(void)
{
    pthread_mutex_lock(&g_lock);
    int forbidden = capture_forbids_unsafe_locked();
    pthread_mutex_unlock(&g_lock);
    return forbidden ? DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED : DBL_SUCCESS;
}

/* ---------------------------------------------------------------- items */

static struct item *item_new(enum item_kind kind)
{
    struct item *it = calloc(1, sizeof(*it));
    if (it != NULL)
        it->kind = kind;
    return it;
}

static void exec_unref_locked(struct dexec *e);

/* g_lock need not be held except for IT_GRAPH (exec refcount). */
static void item_free_locked(struct item *it)
{
    if (it->kind == IT_KERNEL)
        free(it->u.kernel.params);
    if (it->kind == IT_MEMCPY)
        free(it->u.copy.owned);
    if (it->kind == IT_GRAPH)
        exec_unref_locked(it->u.graph.exec);
    free(it);
}

static void item_list_free_locked(struct item *it)
{
    while (it != NULL) {
        struct item *next = it->next;
        item_free_locked(it);
        it = next;
    }
}

/* A copy for a graph instantiation (kernel parameters copied again: every
 * instantiation owns its own). */
static struct item *item_clone(const struct item *src)
{
    struct item *it = item_new(src->kind);
    if (it == NULL)
        return NULL;
    it->u = src->u;
    if (src->kind == IT_KERNEL) {
        it->u.kernel.params = malloc(src->u.kernel.params_bytes ? src->u.kernel.params_bytes : 1);
        if (it->u.kernel.params == NULL) {
            free(it);
            return NULL;
        }
        memcpy(it->u.kernel.params, src->u.kernel.params, src->u.kernel.params_bytes);
    }
    if (src->kind == IT_MEMCPY && src->u.copy.owned != NULL) {
        if ((it->u.copy.owned = malloc(src->u.copy.n)) == NULL) {
            free(it);
            return NULL;
        }
        memcpy(it->u.copy.owned, src->u.copy.owned, src->u.copy.n);
        it->u.copy.src = it->u.copy.owned;
    }
    return it;
}

struct cta_arg {
    void (*fn)(const void *, unsigned, unsigned);
    const void *params;
    unsigned cta, ncta;
};

static void *cta_main(void *p)
{
    struct cta_arg *a = p;
    a->fn(a->params, a->cta, a->ncta);
    return NULL;
}

/* Every CTA on its own thread, all at once: CTAs of one launch may wait for
 * each other, as on a GPU where the whole grid is resident. */
static void run_kernel(const struct item *it)
{
    unsigned n = it->u.kernel.grid;
    pthread_t *threads = calloc(n, sizeof(*threads));
    struct cta_arg *args = calloc(n, sizeof(*args));
    unsigned started = 0;
    if (threads == NULL || args == NULL) {
        set_sticky(DBL_ERROR_LAUNCH_OUT_OF_RESOURCES);
        goto out;
    }
    for (; started < n; started++) {
        args[started] = (struct cta_arg){it->u.kernel.fn, it->u.kernel.params, started, n};
        if (pthread_create(&threads[started], NULL, cta_main, &args[started]) != 0) {
            fprintf(stderr, "plait CUDA test double: cannot start CTA %u of %u (%s)\n", started, n, strerror(errno));
            set_sticky(DBL_ERROR_LAUNCH_OUT_OF_RESOURCES);
            break;
        }
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    stat_inc(&g_stats.kernels_run);
out:
    free(threads);
    free(args);
}

static void run_wait_value(uint64_t *addr, uint64_t v)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned spins = 0; __atomic_load_n(addr, __ATOMIC_ACQUIRE) < v; spins++) {
        if ((spins & 1023) == 1023) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            double waited = (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) * 1e-9;
            if (waited > g_timeout_s) {
                fprintf(stderr,
                        "plait CUDA test double: cuStreamWaitValue64 on %p waited %.0f s for >= %llu (holds %llu): "
                        "CUDA_ERROR_LAUNCH_TIMEOUT\n",
                        (void *)addr, waited, (unsigned long long)v,
                        (unsigned long long)__atomic_load_n(addr, __ATOMIC_ACQUIRE));
                set_sticky(DBL_ERROR_LAUNCH_TIMEOUT);
                return;
            }
        }
        sched_yield();
    }
}

static void run_item(const struct item *it)
{
    switch (it->kind) {
    case IT_NOP:
    case IT_WAIT_STREAM:
        break;
    case IT_KERNEL:
        run_kernel(it);
        break;
    case IT_MEMCPY:
        memmove(it->u.copy.dst, it->u.copy.src, it->u.copy.n);
        stat_inc(&g_stats.memcpys);
        break;
    case IT_MEMSET:
        memset(it->u.set.dst, it->u.set.v, it->u.set.n);
        stat_inc(&g_stats.memsets);
        break;
    case IT_WAIT_VALUE:
        run_wait_value(it->u.value.addr, it->u.value.v);
        break;
    case IT_WRITE_VALUE:
        __atomic_store_n(it->u.value.addr, it->u.value.v, __ATOMIC_RELEASE);
        break;
    case IT_HOST_FUNC:
        it->u.host.fn(it->u.host.arg);
        break;
    case IT_GRAPH:
        for (const struct item *n = it->u.graph.exec->head; n != NULL; n = n->next)
            run_item(n);
        break;
    }
}

/* ---------------------------------------------------------------- streams */

static int item_ready_locked(const struct item *it)
{
    return it->kind != IT_WAIT_STREAM || it->u.wait.s->done >= it->u.wait.seq;
}

static void *stream_worker(void *p)
{
    struct dstream *s = p;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        struct item *it = s->head;
        if (it == NULL || s->is_held || !item_ready_locked(it)) {
            if (it == NULL && s->is_destroyed) {
                s->is_destroyed = 0;
                s->is_free = 1;
            }
            pthread_cond_wait(&g_cond, &g_lock);
            continue;
        }
        s->head = it->next;
        if (s->head == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&g_lock);
        run_item(it);
        pthread_mutex_lock(&g_lock);
        item_free_locked(it);
        s->done++;
        pthread_cond_broadcast(&g_cond);
    }
    return NULL;
}

/* A new stream (or a recycled one with its worker). g_lock held. */
static struct dstream *stream_new_locked(unsigned flags, int priority, int is_legacy, int device)
{
    struct dstream *s = NULL;
    for (struct dstream *f = g_streams; f != NULL; f = f->next_all) {
        if (f->is_free) {
            s = f;
            break;
        }
    }
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL)
            return NULL;
        pthread_t worker;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&worker, &attr, stream_worker, s);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            free(s);
            return NULL;
        }
        s->next_all = g_streams;
        g_streams = s;
    }
    s->is_free = 0;
    s->is_destroyed = 0;
    s->is_held = 0;
    s->flags = flags;
    s->priority = priority;
    s->is_legacy = is_legacy;
    s->device = device;
    s->is_capturing = 0;
    s->is_invalidated = 0;
    s->graph = NULL;
    __atomic_store_n(&s->magic, DBL_STREAM_MAGIC, __ATOMIC_RELEASE);
    return s;
}

/* The stream behind a handle: NULL and CU_STREAM_LEGACY are the legacy
 * default stream of the calling thread's context (made on first use; no
 * context: CUDA_ERROR_INVALID_CONTEXT). g_lock held. */
static int stream_get_locked(void *handle, struct dstream **out)
{
    if (handle == NULL || handle == (void *)0x1) {
        int res = need_ctx();
        if (res != DBL_SUCCESS)
            return res;
        struct dstream **legacy = &g_legacy[t_ctx->device];
        if (*legacy == NULL && (*legacy = stream_new_locked(0, 0, 1, t_ctx->device)) == NULL)
            return DBL_ERROR_OUT_OF_MEMORY;
        *out = *legacy;
        return DBL_SUCCESS;
    }
    if (handle == (void *)0x2)
        return DBL_ERROR_NOT_SUPPORTED; /* CU_STREAM_PER_THREAD: not emulated */
    struct dstream *s = handle;
    for (struct dstream *f = g_streams; f != NULL; f = f->next_all) {
        if (f == s && s->magic == DBL_STREAM_MAGIC && !s->is_free && !s->is_destroyed) {
            *out = s;
            return DBL_SUCCESS;
        }
    }
    return DBL_ERROR_INVALID_HANDLE;
}

/* Whether s takes part in the implicit ordering with the legacy default
 * stream of `device`'s context. */
static int is_blocking(const struct dstream *s, int device)
{
    return !s->is_legacy && !(s->flags & PLAIT_CU_STREAM_NON_BLOCKING) && s->device == device;
}

static int push_locked(struct dstream *s, struct item *it)
{
    it->next = NULL;
    if (s->tail != NULL)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    s->enqueued++;
    return DBL_SUCCESS;
}

static int push_wait_locked(struct dstream *s, struct dstream *on, uint64_t seq)
{
    struct item *w = item_new(IT_WAIT_STREAM);
    if (w == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    w->u.wait.s = on;
    w->u.wait.seq = seq;
    return push_locked(s, w);
}

/* Queues `it` on s (or records it into s's capture). On success the stream
 * owns it; on failure the caller still does. g_lock held. */
static int enqueue_locked(struct dstream *s, struct item *it)
{
    if (s->is_capturing) {
        if (s->is_invalidated)
            return DBL_ERROR_STREAM_CAPTURE_INVALIDATED;
        if (it->kind == IT_GRAPH)
            return DBL_ERROR_NOT_SUPPORTED; /* a graph inside a capture: not emulated */
        if (it->kind == IT_WAIT_STREAM)
            return DBL_ERROR_STREAM_CAPTURE_ISOLATION;
        it->next = NULL;
        if (s->graph->tail != NULL)
            s->graph->tail->next = it;
        else
            s->graph->head = it;
        s->graph->tail = it;
        return DBL_SUCCESS;
    }
    /* The legacy default stream waits for the work already queued on every
     * blocking stream, and blocking streams wait for the legacy stream's. */
    if (s->is_legacy) {
        int implicit = 0;
        for (struct dstream *b = g_streams; b != NULL; b = b->next_all) {
            if (is_blocking(b, s->device) && b->is_capturing && !b->is_free) {
                b->is_invalidated = 1;
                implicit = 1;
            }
        }
        if (implicit)
            return DBL_ERROR_STREAM_CAPTURE_IMPLICIT;
        for (struct dstream *b = g_streams; b != NULL; b = b->next_all)
            if (is_blocking(b, s->device) && b->enqueued > b->done &&
                push_wait_locked(s, b, b->enqueued) != DBL_SUCCESS)
                return DBL_ERROR_OUT_OF_MEMORY;
    } else if (is_blocking(s, s->device)) {
        struct dstream *legacy = g_legacy[s->device];
        if (legacy != NULL && legacy->enqueued > legacy->done &&
            push_wait_locked(s, legacy, legacy->enqueued) != DBL_SUCCESS)
            return DBL_ERROR_OUT_OF_MEMORY;
    }
    push_locked(s, it);
    pthread_cond_broadcast(&g_cond);
    return DBL_SUCCESS;
}

static int enqueue(void *stream, struct item *it)
{
    if (it == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int res = stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS)
        res = enqueue_locked(s, it);
    if (res != DBL_SUCCESS)
        item_free_locked(it);
    pthread_mutex_unlock(&g_lock);
    return res;
}

/* Waits (g_lock held) until s has done `seq` items. */
static int wait_done_locked(struct dstream *s, uint64_t seq)
{
    struct timespec deadline;
    deadline_in(&deadline, g_timeout_s);
    while (s->done < seq) {
        if (pthread_cond_timedwait(&g_cond, &g_lock, &deadline) == ETIMEDOUT && s->done < seq) {
            fprintf(stderr, "plait CUDA test double: a synchronisation waited %.0f s (stream %p%s): "
                    "CUDA_ERROR_LAUNCH_TIMEOUT\n", g_timeout_s, (void *)s, s->is_held ? ", held" : "");
            return DBL_ERROR_LAUNCH_TIMEOUT;
        }
    }
    return DBL_SUCCESS;
}

/* Waits for all work queued so far on every stream (g_lock held). */
static int wait_all_locked(void)
{
    int res;
    for (struct dstream *s = g_streams; s != NULL; s = s->next_all) {
        if ((res = wait_done_locked(s, s->enqueued)) != DBL_SUCCESS)
            return res;
    }
    return DBL_SUCCESS;
}

/* A marker item; on the legacy stream it carries the implicit waits for the
 * blocking streams, so that an event recorded there, or a synchronisation of
 * it, covers them too. Returns the count that marks it done. */
static int marker_locked(struct dstream *s, uint64_t *seq)
{
    struct item *it = item_new(IT_NOP);
    if (it == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    int res = enqueue_locked(s, it);
    if (res != DBL_SUCCESS) {
        item_free_locked(it);
        return res;
    }
    *seq = s->enqueued;
    return DBL_SUCCESS;
}

/* ---------------------------------------------------------------- fork */

static void fork_prepare(void)
{
    pthread_mutex_lock(&g_lock);
    pthread_rwlock_wrlock(&g_mem_lock);
}

static void fork_parent(void)
{
    pthread_rwlock_unlock(&g_mem_lock);
    pthread_mutex_unlock(&g_lock);
}

/* The child has none of the parent's threads: its streams have no workers.
 * They become invalid handles, never recycled, with nothing pending (so no
 * implicit legacy-stream wait waits for them); the legacy stream is made
 * again on first use. Allocations stay (the MAP_SHARED mappings are shared
 * with the parent, as a forked process shares them anyway). */
static void fork_child(void)
{
    for (struct dstream *s = g_streams; s != NULL; s = s->next_all) {
        s->magic = 0;
        s->is_free = 0;
        s->is_destroyed = 0;
        s->is_capturing = 0;
        s->head = s->tail = NULL; /* the items leak: the parent's threads owned them */
        s->done = s->enqueued;
    }
    memset(g_legacy, 0, sizeof(g_legacy));
    /* Made afresh rather than unlocked: glibc's rwlock remembers its writer
     * by thread id, which the child's thread does not share. */
    pthread_rwlock_init(&g_mem_lock, NULL);
    pthread_mutex_init(&g_lock, NULL);
    pthread_cond_init(&g_cond, NULL);
}

/* ---------------------------------------------------------------- the double's API */

API const char *plait_cuda_double_info(void)
{
    return "plait CUDA test double (not a GPU)";
}

API int plait_cuda_double_set_kernel(const char *name, void (*fn)(const void *, unsigned, unsigned),
                                     size_t params_bytes)
{
    if (name == NULL || fn == NULL || strlen(name) >= sizeof(g_kernels[0].name))
        return -1;
    int res = -1;
    pthread_mutex_lock(&g_lock);
    struct dkernel *slot = NULL;
    for (int i = 0; i < DBL_MAX_KERNELS; i++) {
        if (g_kernels[i].magic == DBL_FUNC_MAGIC && strcmp(g_kernels[i].name, name) == 0) {
            slot = &g_kernels[i];
            break;
        }
        if (slot == NULL && g_kernels[i].magic == 0)
            slot = &g_kernels[i];
    }
    if (slot != NULL) {
        snprintf(slot->name, sizeof(slot->name), "%s", name);
        slot->fn = fn;
        slot->params_bytes = params_bytes;
        slot->magic = DBL_FUNC_MAGIC;
        res = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return res;
}

API void plait_cuda_double_stats_get(struct plait_cuda_double_stats *out)
{
    uint64_t *dst = (uint64_t *)out;
    const uint64_t *src = (const uint64_t *)&g_stats;
    for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

API int plait_cuda_double_stream_hold(void *stream, int hold)
{
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int res = stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS) {
        s->is_held = hold != 0;
        pthread_cond_broadcast(&g_cond);
    }
    pthread_mutex_unlock(&g_lock);
    return res;
}

/* ---------------------------------------------------------------- initialisation, devices */

/* SMs per device: an H200's 132, or PLAIT_CUDA_DOUBLE_SMS (read at each query,
 * so a test can shrink the GPU to reach plait's co-residency limits). */
static int sm_count(void)
{
    const char *v = getenv("PLAIT_CUDA_DOUBLE_SMS");
    const long n = v && *v ? strtol(v, NULL, 10) : 132;
    return n >= 1 && n <= 1024 ? (int)n : 132;
}

static void init_once(void)
{
    const char *n = getenv("PLAIT_CUDA_DOUBLE_DEVICES");
    long devices = 1;
    if (n != NULL && *n != '\0') {
        char *end;
        devices = strtol(n, &end, 10);
        if (*end != '\0' || devices < 0 || devices > DBL_MAX_DEVICES) {
            fprintf(stderr, "plait CUDA test double: PLAIT_CUDA_DOUBLE_DEVICES=\"%s\" is not 0..%d\n", n,
                    DBL_MAX_DEVICES);
            g_init_result = DBL_ERROR_INVALID_VALUE;
            return;
        }
    }
    const char *t = getenv("PLAIT_CUDA_DOUBLE_TIMEOUT");
    if (t != NULL && *t != '\0' && atof(t) > 0)
        g_timeout_s = atof(t);
    if (devices == 0) {
        g_init_result = DBL_ERROR_NO_DEVICE;
        return;
    }
    g_ndevices = (int)devices;
    for (int i = 0; i < g_ndevices; i++) {
        g_ctx[i].magic = DBL_CTX_MAGIC;
        g_ctx[i].device = i;
    }
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    __atomic_store_n(&g_initialized, 1, __ATOMIC_RELEASE);
}

API int cuInit(unsigned flags)
{
    if (flags != 0)
        return DBL_ERROR_INVALID_VALUE;
    pthread_once(&g_init_once, init_once);
    return g_init_result;
}

API int cuDriverGetVersion(int *v)
{
    if (v == NULL)
        return DBL_ERROR_INVALID_VALUE;
    *v = 13000;
    return DBL_SUCCESS;
}

API int cuDeviceGetCount(int *n)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (n == NULL)
        return DBL_ERROR_INVALID_VALUE;
    *n = g_ndevices;
    return DBL_SUCCESS;
}

API int cuDeviceGet(int *dev, int ordinal)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (dev == NULL)
        return DBL_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_ndevices)
        return DBL_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return DBL_SUCCESS;
}

static int pci_bus(int dev)
{
    int n = (int)(sizeof(dbl_pci_bus) / sizeof(dbl_pci_bus[0]));
    return dev < n ? dbl_pci_bus[dev] : 0xe0 + (dev - n);
}

/* An H100/H200 SXM's values for the attributes plait may ask. */
API int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (v == NULL)
        return DBL_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_ndevices)
        return DBL_ERROR_INVALID_DEVICE;
    switch (attr) {
    case 1: /* MAX_THREADS_PER_BLOCK */
    case 2: /* MAX_BLOCK_DIM_X */
        *v = 1024;
        return DBL_SUCCESS;
    case 5: /* MAX_GRID_DIM_X */
        *v = 2147483647;
        return DBL_SUCCESS;
    case 8: /* MAX_SHARED_MEMORY_PER_BLOCK */
        *v = DBL_MAX_SHMEM;
        return DBL_SUCCESS;
    case 10: /* WARP_SIZE */
        *v = 32;
        return DBL_SUCCESS;
    case 13: /* CLOCK_RATE (kHz) */
        *v = 1980000;
        return DBL_SUCCESS;
    case PLAIT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = sm_count();
        return DBL_SUCCESS;
    case 18: /* INTEGRATED */
    case 20: /* COMPUTE_MODE: default */
    case 34: /* PCI_DEVICE_ID */
    case 50: /* PCI_DOMAIN_ID */
    case 84: /* MULTI_GPU_BOARD */
    case 102: /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: the double has no cuMem* */
    case 115: /* MEMORY_POOLS_SUPPORTED */
    case 116: /* GPU_DIRECT_RDMA_SUPPORTED */
        *v = 0;
        return DBL_SUCCESS;
    case 19: /* CAN_MAP_HOST_MEMORY */
    case 31: /* CONCURRENT_KERNELS */
    case 32: /* ECC_ENABLED */
    case PLAIT_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case 78: /* STREAM_PRIORITIES_SUPPORTED */
    case 83: /* MANAGED_MEMORY */
    case 89: /* CONCURRENT_MANAGED_ACCESS */
    case 91: /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
    case 122: /* CAN_USE_64_BIT_STREAM_MEM_OPS */
        *v = 1;
        return DBL_SUCCESS;
    case PLAIT_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *v = pci_bus(dev);
        return DBL_SUCCESS;
    case 36: /* MEMORY_CLOCK_RATE (kHz) */
        *v = 2619000;
        return DBL_SUCCESS;
    case 37: /* GLOBAL_MEMORY_BUS_WIDTH */
        *v = 6144;
        return DBL_SUCCESS;
    case 38: /* L2_CACHE_SIZE */
        *v = 50 * 1024 * 1024;
        return DBL_SUCCESS;
    case 39: /* MAX_THREADS_PER_MULTIPROCESSOR */
        *v = 2048;
        return DBL_SUCCESS;
    case 40: /* ASYNC_ENGINE_COUNT */
        *v = 3;
        return DBL_SUCCESS;
    case PLAIT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *v = 9;
        return DBL_SUCCESS;
    case PLAIT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *v = 0;
        return DBL_SUCCESS;
    case 81: /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
        *v = 233472;
        return DBL_SUCCESS;
    case 97: /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
        *v = 232448;
        return DBL_SUCCESS;
    default:
        /* Not emulated: a clear failure rather than a made-up value. */
        return DBL_ERROR_INVALID_VALUE;
    }
}

/* Upper-case hex, as the driver writes it. */
API int cuDeviceGetPCIBusId(char *buf, int len, int dev)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (buf == NULL || len <= 0)
        return DBL_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_ndevices)
        return DBL_ERROR_INVALID_DEVICE;
    snprintf(buf, (size_t)len, "0000:%02X:00.0", pci_bus(dev));
    return DBL_SUCCESS;
}

/* ---------------------------------------------------------------- contexts */

API int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (ctx == NULL)
        return DBL_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_ndevices)
        return DBL_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    if (g_ctx[dev].refs++ == 0) {
        __atomic_store_n(&g_ctx[dev].is_alive, 1, __ATOMIC_RELEASE);
        stat_inc(&g_stats.contexts_created);
    }
    pthread_mutex_unlock(&g_lock);
    *ctx = &g_ctx[dev];
    return DBL_SUCCESS;
}

API int cuDevicePrimaryCtxRelease_v2(int dev)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= g_ndevices)
        return DBL_ERROR_INVALID_DEVICE;
    int res = DBL_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_ctx[dev].refs <= 0)
        res = DBL_ERROR_INVALID_CONTEXT;
    else if (--g_ctx[dev].refs == 0)
        __atomic_store_n(&g_ctx[dev].is_alive, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return res;
}

static struct dctx *ctx_from_handle(void *h)
{
    for (int i = 0; i < g_ndevices; i++)
        if (h == &g_ctx[i])
            return &g_ctx[i];
    return NULL;
}

API int cuCtxSetCurrent(void *ctx)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (ctx == NULL) {
        t_ctx = NULL;
        return DBL_SUCCESS;
    }
    struct dctx *c = ctx_from_handle(ctx);
    if (c == NULL)
        return DBL_ERROR_INVALID_CONTEXT;
    t_ctx = c;
    return DBL_SUCCESS;
}

API int cuCtxGetCurrent(void **ctx)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (ctx == NULL)
        return DBL_ERROR_INVALID_VALUE;
    *ctx = t_ctx;
    return DBL_SUCCESS;
}

API int cuCtxGetDevice(int *dev)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (dev == NULL)
        return DBL_ERROR_INVALID_VALUE;
    *dev = t_ctx->device;
    return DBL_SUCCESS;
}

API int cuCtxSynchronize(void)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    pthread_mutex_lock(&g_lock);
    if (capture_forbids_unsafe_locked())
        res = DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else
        res = wait_all_locked();
    pthread_mutex_unlock(&g_lock);
    stat_inc(&g_stats.syncs);
    return res != DBL_SUCCESS ? res : sticky();
}

API int cuCtxEnablePeerAccess(void *peer_ctx, unsigned flags)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    struct dctx *peer = ctx_from_handle(peer_ctx);
    if (flags != 0)
        return DBL_ERROR_INVALID_VALUE;
    if (peer == NULL)
        return DBL_ERROR_INVALID_CONTEXT;
    if (peer->device == t_ctx->device)
        return DBL_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    uint64_t bit = 1ull << peer->device;
    if (t_ctx->peers & bit)
        res = DBL_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    t_ctx->peers |= bit;
    pthread_mutex_unlock(&g_lock);
    return res;
}

/* ---------------------------------------------------------------- memory */

static int mem_alloc(int kind, size_t bytes, uintptr_t *out)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (out == NULL || bytes == 0)
        return DBL_ERROR_INVALID_VALUE;
    if ((res = capture_forbids_unsafe()) != DBL_SUCCESS)
        return res;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t map_bytes = (bytes + page - 1) / page * page;
    struct dmem *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    /* memfd: the allocation can be mapped by another process (IPC). */
    int fd = memfd_create("plait-cuda-double", MFD_CLOEXEC);
    if (fd < 0)
        goto err_free;
    struct stat st;
    if (ftruncate(fd, (off_t)map_bytes) != 0 || fstat(fd, &st) != 0)
        goto err_close;
    void *p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        goto err_close;
    m->base = (uintptr_t)p;
    m->bytes = bytes;
    m->map_bytes = map_bytes;
    m->fd = fd;
    m->kind = kind;
    m->device = t_ctx->device;
    m->ino = (uint64_t)st.st_ino;
    pthread_rwlock_wrlock(&g_mem_lock);
    m->next = g_mem;
    g_mem = m;
    pthread_rwlock_unlock(&g_mem_lock);
    stat_inc(&g_stats.allocs);
    *out = m->base;
    return DBL_SUCCESS;

err_close:
    close(fd);
err_free:
    free(m);
    return DBL_ERROR_OUT_OF_MEMORY;
}

/* Frees the allocation based at p of one of the kinds in kinds_mask. Like
 * the driver, waits for the device's queued work first (a kernel may still
 * use the memory), which is not counted as a synchronisation call. */
static int mem_free(uintptr_t p, unsigned kinds_mask)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    pthread_mutex_lock(&g_lock);
    if (capture_forbids_unsafe_locked())
        res = DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else
        res = wait_all_locked();
    pthread_mutex_unlock(&g_lock);
    if (res != DBL_SUCCESS)
        return res;
    struct dmem *found = NULL;
    pthread_rwlock_wrlock(&g_mem_lock);
    for (struct dmem **pp = &g_mem; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->base == p && (kinds_mask & (1u << (*pp)->kind))) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_rwlock_unlock(&g_mem_lock);
    if (found == NULL)
        return DBL_ERROR_INVALID_VALUE;
    munmap((void *)found->base, found->map_bytes);
    if (found->fd >= 0)
        close(found->fd);
    free(found);
    stat_inc(&g_stats.frees);
    return DBL_SUCCESS;
}

API int cuMemAlloc_v2(plait_cudevptr *p, size_t bytes)
{
    uintptr_t a = 0;
    int res = mem_alloc(MEMK_DEVICE, bytes, p ? &a : NULL);
    if (res == DBL_SUCCESS)
        *p = (plait_cudevptr)a;
    return res;
}

API int cuMemAllocManaged(plait_cudevptr *p, size_t bytes, unsigned flags)
{
    if (flags != 1 && flags != 2) /* CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST */
        return DBL_ERROR_INVALID_VALUE;
    uintptr_t a = 0;
    int res = mem_alloc(MEMK_MANAGED, bytes, p ? &a : NULL);
    if (res == DBL_SUCCESS)
        *p = (plait_cudevptr)a;
    return res;
}

API int cuMemFree_v2(plait_cudevptr p)
{
    if (p == 0)
        return DBL_SUCCESS;
    return mem_free((uintptr_t)p, (1u << MEMK_DEVICE) | (1u << MEMK_MANAGED));
}

API int cuMemHostAlloc(void **p, size_t bytes, unsigned flags)
{
    if (flags & ~7u) /* PORTABLE, DEVICEMAP, WRITECOMBINED */
        return DBL_ERROR_INVALID_VALUE;
    uintptr_t a = 0;
    int res = mem_alloc(MEMK_HOST, bytes, p ? &a : NULL);
    if (res == DBL_SUCCESS)
        *p = (void *)a;
    return res;
}

API int cuMemFreeHost(void *p)
{
    return mem_free((uintptr_t)p, 1u << MEMK_HOST);
}

API int cuMemHostGetDevicePointer_v2(plait_cudevptr *d, void *h, unsigned flags)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    struct dmem m;
    if (d == NULL || flags != 0 || mem_find((uintptr_t)h, 0, &m) != 0 || m.kind != MEMK_HOST)
        return DBL_ERROR_INVALID_VALUE;
    *d = (plait_cudevptr)(uintptr_t)h;
    return DBL_SUCCESS;
}

API int cuMemGetAddressRange_v2(plait_cudevptr *base, size_t *size, plait_cudevptr p)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    struct dmem m;
    if (mem_find((uintptr_t)p, 0, &m) != 0)
        return DBL_ERROR_NOT_FOUND;
    if (base != NULL)
        *base = (plait_cudevptr)m.base;
    if (size != NULL)
        *size = m.bytes;
    return DBL_SUCCESS;
}

/* Like the driver's: a pointer it does not know is not an error, its
 * attributes read as zero (memory type 0, not managed, device -2). */
API int cuPointerGetAttributes(unsigned n, int *attrs, void **data, plait_cudevptr p)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (n == 0 || attrs == NULL || data == NULL)
        return DBL_ERROR_INVALID_VALUE;
    struct dmem m;
    int known = mem_find((uintptr_t)p, 0, &m) == 0;
    for (unsigned i = 0; i < n; i++) {
        if (data[i] == NULL)
            return DBL_ERROR_INVALID_VALUE;
        switch (attrs[i]) {
        case PLAIT_CU_POINTER_ATTRIBUTE_CONTEXT:
            *(void **)data[i] = known ? (void *)&g_ctx[m.device] : NULL;
            break;
        case PLAIT_CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            /* Managed memory reports DEVICE (and IS_MANAGED), as the driver does. */
            *(unsigned *)data[i] = !known ? 0u : m.kind == MEMK_HOST ? PLAIT_CU_MEMORYTYPE_HOST : PLAIT_CU_MEMORYTYPE_DEVICE;
            break;
        case PLAIT_CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            *(plait_cudevptr *)data[i] = known ? p : 0;
            break;
        case 4: /* HOST_POINTER: host-visible memory only */
            *(void **)data[i] = known && (m.kind == MEMK_HOST || m.kind == MEMK_MANAGED) ? (void *)(uintptr_t)p : NULL;
            break;
        case PLAIT_CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(bool *)data[i] = known && m.kind == MEMK_MANAGED;
            break;
        case PLAIT_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = known ? m.device : -2;
            break;
        case 11: /* RANGE_START_ADDR */
            *(plait_cudevptr *)data[i] = known ? (plait_cudevptr)m.base : 0;
            break;
        case 12: /* RANGE_SIZE */
            *(size_t *)data[i] = known ? m.bytes : 0;
            break;
        case 13: /* MAPPED */
            *(bool *)data[i] = known;
            break;
        default:
            return DBL_ERROR_INVALID_VALUE;
        }
    }
    return DBL_SUCCESS;
}

/* ---------------------------------------------------------------- copies */

static int memcpy_sync(void *dst, const void *src, size_t n)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    struct item *it = item_new(IT_MEMCPY);
    if (it == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    it->u.copy.dst = dst;
    it->u.copy.src = src;
    it->u.copy.n = n;
    /* On the legacy default stream, then waited for: ordered after the
     * blocking streams' work, as the driver's synchronous copies are. */
    pthread_mutex_lock(&g_lock);
    struct dstream *s = NULL;
    uint64_t seq = 0;
    if (capture_forbids_unsafe_locked())
        res = DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else if ((res = stream_get_locked(NULL, &s)) == DBL_SUCCESS && (res = enqueue_locked(s, it)) == DBL_SUCCESS)
        seq = s->enqueued;
    if (res != DBL_SUCCESS)
        item_free_locked(it);
    else
        res = wait_done_locked(s, seq);
    pthread_mutex_unlock(&g_lock);
    stat_inc(&g_stats.syncs);
    return res;
}

API int cuMemcpyHtoD_v2(plait_cudevptr dst, const void *src, size_t bytes)
{
    if (!mem_device_visible((uintptr_t)dst, bytes) || (bytes && src == NULL))
        return is_initialized() ? DBL_ERROR_INVALID_VALUE : DBL_ERROR_NOT_INITIALIZED;
    return memcpy_sync((void *)(uintptr_t)dst, src, bytes);
}

API int cuMemcpyDtoH_v2(void *dst, plait_cudevptr src, size_t bytes)
{
    if (!mem_device_visible((uintptr_t)src, bytes) || (bytes && dst == NULL))
        return is_initialized() ? DBL_ERROR_INVALID_VALUE : DBL_ERROR_NOT_INITIALIZED;
    return memcpy_sync(dst, (const void *)(uintptr_t)src, bytes);
}

/* Pageable host memory (no allocation of the double holds it) is treated as
 * the driver treats it: a pageable source is read now, into a buffer the
 * item owns (the driver stages it before returning: the caller may reuse it
 * at once); a copy into a pageable destination returns only once it is done
 * (a host synchronisation, counted as one). In a capture the copy touches
 * host memory at each replay, as a graph's memcpy node does. */
static int memcpy_async(void *dst, const void *src, size_t n, void *stream)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (n && (dst == NULL || src == NULL))
        return DBL_ERROR_INVALID_VALUE;
    struct item *it = item_new(IT_MEMCPY);
    if (it == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    it->u.copy.dst = dst;
    it->u.copy.src = src;
    it->u.copy.n = n;
    int is_pageable = n > 0 && !mem_device_visible((uintptr_t)src, n);
    int is_to_pageable = n > 0 && !mem_device_visible((uintptr_t)dst, n);
    pthread_mutex_lock(&g_lock);
    struct dstream *s = NULL;
    res = stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS && is_pageable && !s->is_capturing) {
        if ((it->u.copy.owned = malloc(n)) == NULL) {
            res = DBL_ERROR_OUT_OF_MEMORY;
        } else {
            memcpy(it->u.copy.owned, src, n);
            it->u.copy.src = it->u.copy.owned;
        }
    }
    int is_sync = res == DBL_SUCCESS && is_to_pageable && !s->is_capturing;
    if (res == DBL_SUCCESS)
        res = enqueue_locked(s, it);
    if (res != DBL_SUCCESS)
        item_free_locked(it);
    else if (is_sync)
        res = wait_done_locked(s, s->enqueued);
    pthread_mutex_unlock(&g_lock);
    if (is_sync)
        stat_inc(&g_stats.syncs);
    return res;
}

/* Unified addressing: either side may be host or device memory. */
API int cuMemcpyAsync(plait_cudevptr dst, plait_cudevptr src, size_t bytes, void *stream)
{
    return memcpy_async((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, stream);
}

API int cuMemcpyHtoDAsync_v2(plait_cudevptr dst, const void *src, size_t bytes, void *stream)
{
    if (!mem_device_visible((uintptr_t)dst, bytes))
        return is_initialized() ? DBL_ERROR_INVALID_VALUE : DBL_ERROR_NOT_INITIALIZED;
    return memcpy_async((void *)(uintptr_t)dst, src, bytes, stream);
}

API int cuMemsetD8Async(plait_cudevptr dst, unsigned char v, size_t n, void *stream)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (!mem_device_visible((uintptr_t)dst, n))
        return DBL_ERROR_INVALID_VALUE;
    struct item *it = item_new(IT_MEMSET);
    if (it != NULL) {
        it->u.set.dst = (void *)(uintptr_t)dst;
        it->u.set.v = v;
        it->u.set.n = n;
    }
    return enqueue(stream, it);
}

/* ---------------------------------------------------------------- modules, kernels */

API int cuModuleLoadData(void **mod, const void *image)
{
    (void)image; /* any image: the kernels are the registered host emulations */
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (mod == NULL)
        return DBL_ERROR_INVALID_VALUE;
    struct dmodule *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    m->magic = DBL_MODULE_MAGIC;
    *mod = m;
    return DBL_SUCCESS;
}

API int cuModuleUnload(void *mod)
{
    struct dmodule *m = mod;
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (m == NULL || m->magic != DBL_MODULE_MAGIC)
        return DBL_ERROR_INVALID_HANDLE;
    m->magic = 0;
    free(m);
    return DBL_SUCCESS;
}

API int cuModuleGetFunction(void **fn, void *mod, const char *name)
{
    const struct dmodule *m = mod;
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (fn == NULL || name == NULL)
        return DBL_ERROR_INVALID_VALUE;
    if (m == NULL || m->magic != DBL_MODULE_MAGIC)
        return DBL_ERROR_INVALID_HANDLE;
    res = DBL_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < DBL_MAX_KERNELS; i++) {
        if (g_kernels[i].magic == DBL_FUNC_MAGIC && strcmp(g_kernels[i].name, name) == 0) {
            *fn = &g_kernels[i];
            res = DBL_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return res;
}

API int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shmem, void *stream, void **params, void **extra)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    struct dkernel *k = NULL;
    for (int i = 0; i < DBL_MAX_KERNELS; i++)
        if (f == &g_kernels[i] && g_kernels[i].magic == DBL_FUNC_MAGIC)
            k = &g_kernels[i];
    if (k == NULL)
        return DBL_ERROR_INVALID_HANDLE;
    if (extra != NULL || gy != 1 || gz != 1)
        return DBL_ERROR_NOT_SUPPORTED; /* not emulated (cuda_double.h) */
    if (gx == 0 || bx == 0 || by == 0 || bz == 0 || (unsigned long long)bx * by * bz > 1024 || shmem > DBL_MAX_SHMEM)
        return DBL_ERROR_INVALID_VALUE;
    if (k->params_bytes > 0 && (params == NULL || params[0] == NULL))
        return DBL_ERROR_INVALID_VALUE;
    struct item *it = item_new(IT_KERNEL);
    if (it == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    /* The parameter is copied now, at launch (or capture), as CUDA does: the
     * caller may reuse its memory as soon as the call returns. */
    it->u.kernel.fn = k->fn;
    it->u.kernel.grid = gx;
    it->u.kernel.params_bytes = k->params_bytes;
    it->u.kernel.params = malloc(k->params_bytes ? k->params_bytes : 1);
    if (it->u.kernel.params == NULL) {
        free(it);
        return DBL_ERROR_OUT_OF_MEMORY;
    }
    if (k->params_bytes > 0)
        memcpy(it->u.kernel.params, params[0], k->params_bytes);
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int is_capture = 0;
    res = stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS) {
        is_capture = s->is_capturing;
        res = enqueue_locked(s, it);
    }
    if (res != DBL_SUCCESS)
        item_free_locked(it);
    pthread_mutex_unlock(&g_lock);
    if (res == DBL_SUCCESS)
        stat_inc(is_capture ? &g_stats.captured_launches : &g_stats.launches);
    return res;
}

/* ---------------------------------------------------------------- streams */

API int cuStreamCreateWithPriority(void **out, unsigned flags, int prio)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (out == NULL || (flags & ~(unsigned)PLAIT_CU_STREAM_NON_BLOCKING))
        return DBL_ERROR_INVALID_VALUE;
    /* Out-of-range priorities are clamped, as the driver does. */
    if (prio < DBL_PRIO_GREATEST)
        prio = DBL_PRIO_GREATEST;
    if (prio > DBL_PRIO_LEAST)
        prio = DBL_PRIO_LEAST;
    pthread_mutex_lock(&g_lock);
    struct dstream *s = stream_new_locked(flags, prio, 0, t_ctx->device);
    pthread_mutex_unlock(&g_lock);
    if (s == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    stat_inc(&g_stats.streams_created);
    *out = s;
    return DBL_SUCCESS;
}

API int cuStreamGetPriority(void *stream, int *prio)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (prio == NULL)
        return DBL_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int res = stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS)
        *prio = s->priority;
    pthread_mutex_unlock(&g_lock);
    return res;
}

/* Returns at once; the stream's queued work still runs, then the stream
 * (and its worker) is recycled. */
API int cuStreamDestroy_v2(void *stream)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (stream == NULL || stream == (void *)0x1 || stream == (void *)0x2)
        return DBL_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int res = stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS) {
        if (s->is_capturing) {
            struct dgraph *g = s->graph;
            item_list_free_locked(g->head);
            g->magic = 0;
            free(g);
            s->graph = NULL;
            s->is_capturing = 0;
        }
        s->magic = 0;
        s->is_held = 0;
        s->is_destroyed = 1;
        pthread_cond_broadcast(&g_cond);
    }
    pthread_mutex_unlock(&g_lock);
    return res;
}

API int cuStreamSynchronize(void *stream)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    stat_inc(&g_stats.syncs);
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    uint64_t seq = 0;
    int res = stream_get_locked(stream, &s);
    if (res != DBL_SUCCESS)
        goto out;
    if (s->is_capturing) {
        s->is_invalidated = 1;
        res = DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        goto out;
    }
    if (s->is_legacy) {
        if (capture_forbids_unsafe_locked()) {
            res = DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED;
            goto out;
        }
        if ((res = marker_locked(s, &seq)) != DBL_SUCCESS)
            goto out;
    } else {
        seq = s->enqueued;
    }
    res = wait_done_locked(s, seq);
out:
    pthread_mutex_unlock(&g_lock);
    return res != DBL_SUCCESS ? res : sticky();
}

API int cuStreamQuery(void *stream)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    stat_inc(&g_stats.queries);
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int res = stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS) {
        if (s->is_capturing) {
            s->is_invalidated = 1;
            res = DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        } else if (s->done < s->enqueued) {
            res = DBL_ERROR_NOT_READY;
        } else if (s->is_legacy) {
            for (struct dstream *b = g_streams; b != NULL; b = b->next_all)
                if (is_blocking(b, s->device) && b->done < b->enqueued)
                    res = DBL_ERROR_NOT_READY;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return res != DBL_SUCCESS ? res : sticky();
}

static struct devent *event_get(void *h)
{
    struct devent *e = h;
    return e != NULL && e->magic == DBL_EVENT_MAGIC ? e : NULL;
}

API int cuStreamWaitEvent(void *stream, void *ev, unsigned flags)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (flags != 0)
        return DBL_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct devent *e = event_get(ev);
    struct dstream *s;
    int res = e == NULL ? DBL_ERROR_INVALID_HANDLE : stream_get_locked(stream, &s);
    if (res != DBL_SUCCESS)
        goto out;
    if (e->captured_in != NULL) {
        /* Within one capture the stream's order already covers it; joining
         * another stream into the capture is not emulated. */
        if (!(s->is_capturing && s->graph == e->captured_in))
            res = DBL_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if (e->s == NULL || e->s == s)
        goto out; /* never recorded, or recorded earlier on this stream: nothing to wait for */
    if (s->is_capturing) {
        s->is_invalidated = 1;
        res = DBL_ERROR_STREAM_CAPTURE_ISOLATION;
        goto out;
    }
    res = push_wait_locked(s, e->s, e->seq);
    pthread_cond_broadcast(&g_cond);
out:
    pthread_mutex_unlock(&g_lock);
    return res;
}

API int cuStreamIsCapturing(void *stream, int *status)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (status == NULL)
        return DBL_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int res = stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS) {
        if (s->is_legacy) {
            *status = PLAIT_CU_STREAM_CAPTURE_STATUS_NONE;
            for (struct dstream *b = g_streams; b != NULL; b = b->next_all)
                if (is_blocking(b, s->device) && b->is_capturing)
                    res = DBL_ERROR_STREAM_CAPTURE_IMPLICIT;
        } else if (!s->is_capturing) {
            *status = PLAIT_CU_STREAM_CAPTURE_STATUS_NONE;
        } else {
            *status = s->is_invalidated ? PLAIT_CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                        : PLAIT_CU_STREAM_CAPTURE_STATUS_ACTIVE;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return res;
}

/* A stream memory operation on an aligned 64-bit word the device can see. */
static int enqueue_value(void *stream, enum item_kind kind, plait_cudevptr addr, uint64_t v)
{
    if ((addr & 7) != 0 || !mem_device_visible((uintptr_t)addr, 8))
        return DBL_ERROR_INVALID_VALUE;
    struct item *it = item_new(kind);
    if (it != NULL) {
        it->u.value.addr = (uint64_t *)(uintptr_t)addr;
        it->u.value.v = v;
    }
    return enqueue(stream, it);
}

API int cuStreamWaitValue64_v2(void *stream, plait_cudevptr addr, uint64_t v, unsigned flags)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (flags != PLAIT_CU_STREAM_WAIT_VALUE_GEQ) /* the one condition emulated */
        return DBL_ERROR_NOT_SUPPORTED;
    return enqueue_value(stream, IT_WAIT_VALUE, addr, v);
}

API int cuStreamWriteValue64_v2(void *stream, plait_cudevptr addr, uint64_t v, unsigned flags)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (flags != PLAIT_CU_STREAM_WRITE_VALUE_DEFAULT)
        return DBL_ERROR_NOT_SUPPORTED;
    return enqueue_value(stream, IT_WRITE_VALUE, addr, v);
}

API int cuLaunchHostFunc(void *stream, void (*fn)(void *), void *arg)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (fn == NULL)
        return DBL_ERROR_INVALID_VALUE;
    struct item *it = item_new(IT_HOST_FUNC);
    if (it != NULL) {
        it->u.host.fn = fn;
        it->u.host.arg = arg;
    }
    return enqueue(stream, it);
}

/* ---------------------------------------------------------------- events */

API int cuEventCreate(void **ev, unsigned flags)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    if (ev == NULL || (flags & ~7u))
        return DBL_ERROR_INVALID_VALUE;
    if (flags & 4) /* CU_EVENT_INTERPROCESS */
        return DBL_ERROR_NOT_SUPPORTED;
    struct devent *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    e->magic = DBL_EVENT_MAGIC;
    e->flags = flags;
    *ev = e;
    return DBL_SUCCESS;
}

API int cuEventRecord(void *ev, void *stream)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_lock);
    struct devent *e = event_get(ev);
    struct dstream *s;
    int res = e == NULL ? DBL_ERROR_INVALID_HANDLE : stream_get_locked(stream, &s);
    if (res != DBL_SUCCESS)
        goto out;
    if (s->is_capturing) {
        if (s->is_invalidated) {
            res = DBL_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else {
            e->captured_in = s->graph;
            e->s = NULL;
        }
        goto out;
    }
    /* A marker item, so that a record on the legacy stream carries its
     * implicit waits for the blocking streams. */
    uint64_t seq;
    if ((res = marker_locked(s, &seq)) == DBL_SUCCESS) {
        e->s = s;
        e->seq = seq;
        e->captured_in = NULL;
    }
out:
    pthread_mutex_unlock(&g_lock);
    return res;
}

/* Query and synchronise refuse an event recorded during a capture, as CUDA does. */
static int event_get_uncaptured_locked(void *h, struct devent **out)
{
    struct devent *e = event_get(h);
    if (e == NULL)
        return DBL_ERROR_INVALID_HANDLE;
    if (e->captured_in != NULL)
        return DBL_ERROR_CAPTURED_EVENT;
    *out = e;
    return DBL_SUCCESS;
}

API int cuEventQuery(void *ev)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    stat_inc(&g_stats.queries);
    pthread_mutex_lock(&g_lock);
    struct devent *e = NULL;
    int res = event_get_uncaptured_locked(ev, &e);
    if (res == DBL_SUCCESS && e->s != NULL && e->s->done < e->seq)
        res = DBL_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_lock);
    return res;
}

API int cuEventSynchronize(void *ev)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    stat_inc(&g_stats.syncs);
    pthread_mutex_lock(&g_lock);
    struct devent *e = NULL;
    int res = event_get_uncaptured_locked(ev, &e);
    if (res == DBL_SUCCESS && e->s != NULL)
        res = wait_done_locked(e->s, e->seq);
    pthread_mutex_unlock(&g_lock);
    return res != DBL_SUCCESS ? res : sticky();
}

API int cuEventDestroy_v2(void *ev)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_lock);
    struct devent *e = event_get(ev);
    if (e != NULL)
        e->magic = 0;
    pthread_mutex_unlock(&g_lock);
    if (e == NULL)
        return DBL_ERROR_INVALID_HANDLE;
    free(e);
    return DBL_SUCCESS;
}

/* ---------------------------------------------------------------- IPC */

API int cuIpcGetMemHandle(plait_cu_ipc_handle *h, plait_cudevptr p)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    struct dmem m;
    if (h == NULL || mem_find((uintptr_t)p, 0, &m) != 0 || m.kind != MEMK_DEVICE)
        return DBL_ERROR_INVALID_VALUE;
    struct ipc_wire w = {DBL_IPC_MAGIC, (int32_t)getpid(), m.fd, m.device, m.bytes, m.ino};
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &w, sizeof(w));
    return DBL_SUCCESS;
}

/* Maps the exporter's memfd through /proc/<pid>/fd/<fd> (the exporter keeps
 * it open while the allocation lives): works between any two processes of
 * one user, forked or not. A handle of this process is refused, as the
 * driver refuses it. Opening one handle again gives the same mapping. */
API int cuIpcOpenMemHandle_v2(plait_cudevptr *out, plait_cu_ipc_handle h, unsigned flags)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    struct ipc_wire w;
    memcpy(&w, h.reserved, sizeof(w));
    if (out == NULL || w.magic != DBL_IPC_MAGIC || w.bytes == 0 || (flags & ~1u))
        return DBL_ERROR_INVALID_VALUE;
    if (w.pid == (int32_t)getpid())
        return DBL_ERROR_INVALID_CONTEXT;
    pthread_rwlock_wrlock(&g_mem_lock);
    for (struct dmem *m = g_mem; m != NULL; m = m->next) {
        /* As the real driver: a handle may be opened once per context
         * ("cudaIpcMemHandles ... may only be opened by one context per
         * device per other process"); a second open fails until it is closed. */
        if (m->kind == MEMK_IPC && m->ipc_pid == w.pid && m->ipc_ino == w.ino) {
            pthread_rwlock_unlock(&g_mem_lock);
            return DBL_ERROR_ALREADY_MAPPED;
        }
    }
    pthread_rwlock_unlock(&g_mem_lock);

    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)w.pid, (int)w.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "plait CUDA test double: cuIpcOpenMemHandle: open %s: %s\n", path, strerror(errno));
        return DBL_ERROR_MAP_FAILED;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != w.ino || (uint64_t)st.st_size < w.bytes) {
        close(fd);
        return DBL_ERROR_INVALID_HANDLE; /* the allocation was freed (the fd is another file now) */
    }
    size_t map_bytes = (size_t)st.st_size;
    void *p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return DBL_ERROR_MAP_FAILED;
    struct dmem *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        munmap(p, map_bytes);
        return DBL_ERROR_OUT_OF_MEMORY;
    }
    m->base = (uintptr_t)p;
    m->bytes = w.bytes;
    m->map_bytes = map_bytes;
    m->fd = -1;
    m->kind = MEMK_IPC;
    m->device = w.device;
    m->refs = 1;
    m->ipc_pid = w.pid;
    m->ipc_ino = w.ino;
    pthread_rwlock_wrlock(&g_mem_lock);
    m->next = g_mem;
    g_mem = m;
    pthread_rwlock_unlock(&g_mem_lock);
    stat_inc(&g_stats.ipc_opens);
    *out = (plait_cudevptr)m->base;
    return DBL_SUCCESS;
}

API int cuIpcCloseMemHandle(plait_cudevptr p)
{
    int res = need_ctx();
    if (res != DBL_SUCCESS)
        return res;
    struct dmem *gone = NULL;
    res = DBL_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&g_mem_lock);
    for (struct dmem **pp = &g_mem; *pp != NULL; pp = &(*pp)->next) {
        struct dmem *m = *pp;
        if (m->kind == MEMK_IPC && m->base == (uintptr_t)p) {
            res = DBL_SUCCESS;
            if (--m->refs == 0) {
                *pp = m->next;
                gone = m;
            }
            break;
        }
    }
    pthread_rwlock_unlock(&g_mem_lock);
    if (gone != NULL) {
        munmap((void *)gone->base, gone->map_bytes);
        free(gone);
    }
    return res;
}

/* ---------------------------------------------------------------- capture, graphs */

API int cuThreadExchangeStreamCaptureMode(int *mode)
{
    if (mode == NULL || *mode < PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED)
        return DBL_ERROR_INVALID_VALUE;
    const int old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return DBL_SUCCESS;
}

API int cuStreamBeginCapture_v2(void *stream, int mode)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (mode < PLAIT_CU_STREAM_CAPTURE_MODE_GLOBAL || mode > PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED)
        return DBL_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int res = stream_get_locked(stream, &s);
    if (res != DBL_SUCCESS)
        goto out;
    if (s->is_legacy) {
        res = DBL_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        goto out;
    }
    if (s->is_capturing) {
        res = DBL_ERROR_ILLEGAL_STATE;
        goto out;
    }
    struct dgraph *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        res = DBL_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    g->magic = DBL_GRAPH_MAGIC;
    s->graph = g;
    s->is_capturing = 1;
    s->is_invalidated = 0;
    s->capture_mode = mode;
    s->capture_thread = pthread_self();
out:
    pthread_mutex_unlock(&g_lock);
    return res;
}

API int cuStreamEndCapture(void *stream, void **graph)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    if (graph == NULL)
        return DBL_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct dstream *s;
    int res = stream_get_locked(stream, &s);
    if (res != DBL_SUCCESS)
        goto out;
    if (!s->is_capturing) {
        res = DBL_ERROR_ILLEGAL_STATE;
        goto out;
    }
    if (s->capture_mode != PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(s->capture_thread, pthread_self())) {
        res = DBL_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        goto out;
    }
    struct dgraph *g = s->graph;
    s->graph = NULL;
    s->is_capturing = 0;
    if (s->is_invalidated) {
        s->is_invalidated = 0;
        item_list_free_locked(g->head);
        g->magic = 0;
        free(g);
        *graph = NULL;
        res = DBL_ERROR_STREAM_CAPTURE_INVALIDATED;
        goto out;
    }
    *graph = g;
out:
    pthread_mutex_unlock(&g_lock);
    return res;
}

API int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    struct dgraph *g = graph;
    if (exec == NULL || g == NULL || flags != 0)
        return DBL_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    int res = DBL_SUCCESS;
    struct dexec *e = NULL;
    if (g->magic != DBL_GRAPH_MAGIC) {
        res = DBL_ERROR_INVALID_HANDLE;
        goto out;
    }
    if ((e = calloc(1, sizeof(*e))) == NULL) {
        res = DBL_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    e->magic = DBL_EXEC_MAGIC;
    e->refs = 1;
    struct item **tail = &e->head;
    for (const struct item *n = g->head; n != NULL; n = n->next) {
        if ((*tail = item_clone(n)) == NULL) {
            exec_unref_locked(e);
            res = DBL_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        tail = &(*tail)->next;
    }
    *exec = e;
out:
    pthread_mutex_unlock(&g_lock);
    return res;
}

static void exec_unref_locked(struct dexec *e)
{
    if (--e->refs > 0)
        return;
    item_list_free_locked(e->head);
    e->magic = 0;
    free(e);
}

API int cuGraphLaunch(void *exec, void *stream)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    struct item *it = item_new(IT_GRAPH);
    if (it == NULL)
        return DBL_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    struct dexec *e = exec;
    struct dstream *s;
    int res = e == NULL || e->magic != DBL_EXEC_MAGIC || e->is_destroyed ? DBL_ERROR_INVALID_HANDLE
                                                                          : stream_get_locked(stream, &s);
    if (res == DBL_SUCCESS) {
        e->refs++;
        it->u.graph.exec = e;
        res = enqueue_locked(s, it);
        if (res != DBL_SUCCESS)
            item_free_locked(it);
    } else {
        free(it);
    }
    pthread_mutex_unlock(&g_lock);
    if (res == DBL_SUCCESS)
        stat_inc(&g_stats.graph_launches);
    return res;
}

API int cuGraphDestroy(void *graph)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    struct dgraph *g = graph;
    pthread_mutex_lock(&g_lock);
    int res = g == NULL || g->magic != DBL_GRAPH_MAGIC ? DBL_ERROR_INVALID_VALUE : DBL_SUCCESS;
    if (res == DBL_SUCCESS) {
        item_list_free_locked(g->head);
        g->magic = 0;
        free(g);
    }
    pthread_mutex_unlock(&g_lock);
    return res;
}

/* Launches still queued keep their reference: the graph runs, then goes. */
API int cuGraphExecDestroy(void *exec)
{
    if (!is_initialized())
        return DBL_ERROR_NOT_INITIALIZED;
    struct dexec *e = exec;
    pthread_mutex_lock(&g_lock);
    int res = e == NULL || e->magic != DBL_EXEC_MAGIC || e->is_destroyed ? DBL_ERROR_INVALID_VALUE : DBL_SUCCESS;
    if (res == DBL_SUCCESS) {
        e->is_destroyed = 1;
        exec_unref_locked(e);
    }
    pthread_mutex_unlock(&g_lock);
    return res;
}

/* ---------------------------------------------------------------- errors */

static const struct dbl_error *error_find(int res)
{
    for (size_t i = 0; i < sizeof(dbl_errors) / sizeof(dbl_errors[0]); i++)
        if (dbl_errors[i].code == res)
            return &dbl_errors[i];
    return NULL;
}

API int cuGetErrorName(int res, const char **s)
{
    if (s == NULL)
        return DBL_ERROR_INVALID_VALUE;
    const struct dbl_error *e = error_find(res);
    *s = e ? e->name : NULL;
    return e ? DBL_SUCCESS : DBL_ERROR_INVALID_VALUE;
}

API int cuGetErrorString(int res, const char **s)
{
    if (s == NULL)
        return DBL_ERROR_INVALID_VALUE;
    const struct dbl_error *e = error_find(res);
    *s = e ? e->text : NULL;
    return e ? DBL_SUCCESS : DBL_ERROR_INVALID_VALUE;
}
