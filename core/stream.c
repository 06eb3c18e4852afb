/* Host streams, CUDA-backed streams and events.
 *
 * A host stream is a worker thread with a FIFO of items: a batch of operations
 * (run by the executor on the worker), an event record, or a wait for an event.
 * Items run in issue order; plait_stream_synchronize waits for the queue to
 * drain. Events count records: record N completes when the stream reaches it,
 * and waits compare against the record count at the time of the wait.
 *
 * A CUDA-backed stream (plait_stream_from_cuda) has no worker: it names a CUDA
 * stream, on which device operations are launched (core/cuda/launch.c). An event
 * recorded on one is a CUevent record; waits across kinds bridge the two (a
 * host stream waiting for a CUDA record synchronises the CUevent on its
 * worker; a CUDA stream waiting for a host record blocks in a host function,
 * cuLaunchHostFunc, until the record is reached). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/cuda/cu.h"
#include "base/handle.h"
#include "base/log.h"

enum item_kind { ITEM_OPS, ITEM_RECORD, ITEM_WAIT, ITEM_CUWAIT };

struct plait_event {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t records;   /* records issued */
    uint64_t completed; /* records reached */
    /* CUDA side: a CUevent made at the first record on a CUDA-backed stream;
     * cu_last: the last record was there (waits then go to the CUevent);
     * host_waiters: host functions of CUDA streams blocked on this event. */
    void *cu_event;
    int cu_last;
    int host_waiters;
    pid_t owner_pid; /* the process that created it (fork safety) */
};

struct item {
    int kind;
    struct plait_op *ops;
    struct plait_event *event;
    uint64_t target;
    struct item *next;
};

struct plait_stream {
    pthread_mutex_t lock;
    pthread_cond_t cond;      /* new item, or stop */
    pthread_cond_t idle_cond; /* queue drained */
    struct item *head, *tail;
    int running;              /* the worker is executing an item */
    int stop;
    plait_result_t error;     /* first error since the last synchronize */
    char error_msg[1024];
    struct plait_comm *owner; /* internal stream of a non-blocking communicator */
    int is_cuda;              /* wraps cu_stream (plait_stream_from_cuda): no worker */
    void *cu_stream;
    /* Items the worker has finished, kept for the next submissions (under
     * lock, which both ends take anyway) so that a call on a stream does not
     * pay a malloc on one thread and a cross-thread free on the other. */
    struct item *spare;
    int nspare;
    pid_t owner_pid;          /* the process that created it: a forked child has no worker */
    pthread_t thread;
};

/* Spare items kept per stream: enough for a burst of queued calls to recycle
 * without holding memory that a long-lived idle stream never needs. */
#define MAX_SPARE_ITEMS 64

/* Handles are looked up in the registry (base/handle.h) before anything is
 * read through them. A forked child inherits its parent's streams without
 * their workers and its events without the threads that would complete
 * them (and with locks those threads may have held): it may only destroy
 * them. */
plait_result_t plait_stream_check_live(plait_stream_t s, const char *fn)
{
    if (!s)
        return PLAIT_SUCCESS;
    if (!plait_handle_live(PLAIT_HANDLE_STREAM, s))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "%s: stream %p is not a live stream (destroyed, or never made by plait_stream_create or "
                           "plait_stream_from_cuda)",
                           fn, (void *)s);
    if (s->owner_pid != plait_self_pid())
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "%s: stream %p belongs to process %d; a forked child cannot use it (only destroy it)", fn,
                           (void *)s, (int)s->owner_pid);
    return PLAIT_SUCCESS;
}

static plait_result_t event_check(plait_event_t e, const char *fn)
{
    if (!e)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: event is NULL", fn);
    if (!plait_handle_live(PLAIT_HANDLE_EVENT, e))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "%s: event %p is not a live event (destroyed, or never made by plait_event_create)", fn,
                           (void *)e);
    if (e->owner_pid != plait_self_pid())
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "%s: event %p belongs to process %d; a forked child cannot use it (only destroy it)", fn,
                           (void *)e, (int)e->owner_pid);
    return PLAIT_SUCCESS;
}

/* Keeps a finished item as a spare or frees it; called with s->lock held. */
static void item_put_locked(struct plait_stream *s, struct item *it)
{
    if (s->nspare >= MAX_SPARE_ITEMS) {
        free(it);
        return;
    }
    it->next = s->spare;
    s->spare = it;
    s->nspare++;
}

static void run_item(struct plait_stream *s, struct item *it)
{
    if (it->kind == ITEM_OPS) {
        plait_result_t r = plait_exec_run(it->ops);
        if (r) {
            pthread_mutex_lock(&s->lock);
            if (!s->error) {
                s->error = r;
                snprintf(s->error_msg, sizeof(s->error_msg), "%s", plait_last_error_get());
            }
            pthread_mutex_unlock(&s->lock);
            for (struct plait_op *op = it->ops; op; op = op->next)
                plait_comm_set_async_error(op->comm, r, plait_last_error_get());
        }
        for (struct plait_op *op = it->ops; op; op = op->next)
            __atomic_sub_fetch(&op->comm->inflight, 1, __ATOMIC_ACQ_REL);
        plait_op_free_list(it->ops);
    } else if (it->kind == ITEM_CUWAIT) {
        const struct plait_cu *cu = plait_cu_get();
        if (cu && it->event->cu_event)
            cu->EventSynchronize(it->event->cu_event);
    } else if (it->kind == ITEM_RECORD) {
        pthread_mutex_lock(&it->event->lock);
        if (it->target > it->event->completed)
            it->event->completed = it->target;
        pthread_cond_broadcast(&it->event->cond);
        pthread_mutex_unlock(&it->event->lock);
    } else {
        pthread_mutex_lock(&it->event->lock);
        while (it->event->completed < it->target)
            pthread_cond_wait(&it->event->cond, &it->event->lock);
        pthread_mutex_unlock(&it->event->lock);
    }
}

static void *worker_main(void *arg)
{
    struct plait_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cond, &s->lock);
        if (!s->head && s->stop)
            break;
        struct item *it = s->head;
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        s->running = 1;
        pthread_mutex_unlock(&s->lock);
        run_item(s, it);
        pthread_mutex_lock(&s->lock);
        item_put_locked(s, it);
        s->running = 0;
        if (!s->head)
            pthread_cond_broadcast(&s->idle_cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Queues an item {kind, ops, event, target} on s: a spare item when there is
 * one, so that the common case takes the lock once and allocates nothing.
 * Returns PLAIT_ERR_SYSTEM (nothing queued) when out of memory. */
static plait_result_t push(struct plait_stream *s, int kind, struct plait_op *ops, struct plait_event *event,
                           uint64_t target)
{
    pthread_mutex_lock(&s->lock);
    struct item *it = s->spare;
    if (it) {
        s->spare = it->next;
        s->nspare--;
    } else {
        pthread_mutex_unlock(&s->lock);
        if (!(it = malloc(sizeof(*it))))
            return PLAIT_ERR_SYSTEM;
        pthread_mutex_lock(&s->lock);
    }
    it->kind = kind;
    it->ops = ops;
    it->event = event;
    it->target = target;
    it->next = NULL;
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return PLAIT_SUCCESS;
}

static plait_result_t stream_new(struct plait_comm *owner, plait_stream_t *out)
{
    struct plait_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_stream_create: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pthread_cond_init(&s->idle_cond, NULL);
    s->owner = owner;
    plait_fork_hooks();
    s->owner_pid = plait_self_pid();
    const int registered = plait_handle_add(PLAIT_HANDLE_STREAM, s) == 0;
    if (!registered || pthread_create(&s->thread, NULL, worker_main, s) != 0) {
        plait_handle_remove(PLAIT_HANDLE_STREAM, s);
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->cond);
        pthread_cond_destroy(&s->idle_cond);
        free(s);
        return plait_error(PLAIT_ERR_SYSTEM, "plait_stream_create: %s",
                           registered ? "cannot start the worker thread" : "out of memory");
    }
    *out = s;
    return PLAIT_SUCCESS;
}

plait_result_t plait_stream_create(plait_stream_t *stream_out)
{
    if (!stream_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_stream_create: stream_out is NULL");
    return stream_new(NULL, stream_out);
}

plait_result_t plait_stream_create_internal(struct plait_comm *comm, plait_stream_t *out)
{
    return stream_new(comm, out);
}

plait_result_t plait_stream_submit(plait_stream_t s, struct plait_op *ops)
{
    if (s->is_cuda) { /* enqueue.c routes every op on a CUDA-backed stream elsewhere */
        plait_op_free_list(ops);
        return plait_error(PLAIT_ERR_INTERNAL, "stream: host operations submitted to a CUDA-backed stream");
    }
    /* Raised before the worker can see the item (push publishes it under the
     * lock): an abort waits for inflight to drop back. */
    for (struct plait_op *op = ops; op; op = op->next)
        __atomic_add_fetch(&op->comm->inflight, 1, __ATOMIC_ACQ_REL);
    if (push(s, ITEM_OPS, ops, NULL, 0) != PLAIT_SUCCESS) {
        for (struct plait_op *op = ops; op; op = op->next)
            __atomic_sub_fetch(&op->comm->inflight, 1, __ATOMIC_ACQ_REL);
        plait_op_free_list(ops);
        return plait_error(PLAIT_ERR_SYSTEM, "stream: out of memory");
    }
    return PLAIT_SUCCESS;
}

int plait_stream_cuda(plait_stream_t s, void **cu_stream_out)
{
    if (!s || !s->is_cuda)
        return 0;
    if (cu_stream_out)
        *cu_stream_out = s->cu_stream;
    return 1;
}

int plait_stream_busy(plait_stream_t s)
{
    if (s->is_cuda) {
        const struct plait_cu *cu = plait_cu_get();
        return cu && cu->StreamQuery(s->cu_stream) == PLAIT_CU_ERROR_NOT_READY;
    }
    pthread_mutex_lock(&s->lock);
    int busy = s->head != NULL || s->running;
    pthread_mutex_unlock(&s->lock);
    return busy;
}

/* plait_stream_synchronize of a stream already checked. */
static plait_result_t stream_sync(plait_stream_t s)
{
    if (s->is_cuda) {
        /* Errors of the kernels themselves are the communicators' async
         * errors (plait_comm_get_async_error), as with NCCL. */
        int r = plait_cu_get()->StreamSynchronize(s->cu_stream);
        return r ? plait_cu_error(r, "plait_stream_synchronize", "cuStreamSynchronize") : PLAIT_SUCCESS;
    }
    pthread_mutex_lock(&s->lock);
    while (s->head || s->running)
        pthread_cond_wait(&s->idle_cond, &s->lock);
    plait_result_t r = s->error;
    char msg[1024];
    memcpy(msg, s->error_msg, sizeof(msg));
    s->error = PLAIT_SUCCESS;
    pthread_mutex_unlock(&s->lock);
    if (r)
        return plait_error(r, "%s", msg);
    return PLAIT_SUCCESS;
}

plait_result_t plait_stream_synchronize(plait_stream_t s)
{
    if (!s)
        return PLAIT_SUCCESS; /* the NULL stream's host work is already complete */
    plait_result_t status = plait_stream_check(s, "plait_stream_synchronize");
    if (status)
        return status;
    return stream_sync(s);
}

/* The error of a destroy that found its handle taken out of the registry by
 * a destroy on another thread after its own check. */
static plait_result_t destroyed_meanwhile(const char *fn, const char *what, const void *h)
{
    return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: %s %p was destroyed by another thread meanwhile", fn, what,
                       h);
}

plait_result_t plait_stream_destroy(plait_stream_t s)
{
    static const char fn[] = "plait_stream_destroy";
    if (!s)
        return PLAIT_SUCCESS;
    if (!plait_handle_live(PLAIT_HANDLE_STREAM, s) || s->owner_pid == plait_self_pid()) {
        plait_result_t status = plait_stream_check(s, fn);
        if (status)
            return status;
    } else {
        /* A forked child's copy: no worker to stop, and its lock and queue
         * are as the parent's threads left them. The struct goes; what it
         * pointed at stays (the child's copy of the parent's memory). */
        if (!plait_handle_remove(PLAIT_HANDLE_STREAM, s))
            return destroyed_meanwhile(fn, "stream", s);
        plait_handle_retire(PLAIT_HANDLE_STREAM, s);
        return PLAIT_SUCCESS;
    }
    /* Out of the registry first: of two destroys at once, only the one that
     * took it out goes on (and calls on it from now on are refused). */
    if (!plait_handle_remove(PLAIT_HANDLE_STREAM, s))
        return destroyed_meanwhile(fn, "stream", s);
    plait_result_t r = stream_sync(s);
    if (s->is_cuda) { /* the CUDA stream is the caller's: only the wrapper goes */
        plait_handle_retire(PLAIT_HANDLE_STREAM, s);
        return r;
    }
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    while (s->spare) {
        struct item *it = s->spare;
        s->spare = it->next;
        free(it);
    }
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    pthread_cond_destroy(&s->idle_cond);
    plait_handle_retire(PLAIT_HANDLE_STREAM, s); /* its address is not given to the next stream at once */
    return r;
}

plait_result_t plait_stream_from_cuda(void *cuda_stream, plait_stream_t *stream_out)
{
    if (!stream_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_stream_from_cuda: stream_out is NULL");
    if (!plait_cu_get())
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "plait_stream_from_cuda: no CUDA driver or device in this process (see the INFO line "
                           "\"no CUDA device\")");
    struct plait_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_stream_from_cuda: out of memory");
    s->is_cuda = 1;
    s->cu_stream = cuda_stream;
    plait_fork_hooks();
    s->owner_pid = plait_self_pid();
    if (plait_handle_add(PLAIT_HANDLE_STREAM, s) != 0) {
        free(s);
        return plait_error(PLAIT_ERR_SYSTEM, "plait_stream_from_cuda: out of memory");
    }
    *stream_out = s;
    return PLAIT_SUCCESS;
}

/* ------------------------------------------------------------ events */

plait_result_t plait_event_create(plait_event_t *event_out)
{
    if (!event_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_event_create: event_out is NULL");
    struct plait_event *e = calloc(1, sizeof(*e));
    if (!e)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_event_create: out of memory");
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    plait_fork_hooks();
    e->owner_pid = plait_self_pid();
    if (plait_handle_add(PLAIT_HANDLE_EVENT, e) != 0) {
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->cond);
        free(e);
        return plait_error(PLAIT_ERR_SYSTEM, "plait_event_create: out of memory");
    }
    *event_out = e;
    return PLAIT_SUCCESS;
}

plait_result_t plait_event_record(plait_event_t e, plait_stream_t s)
{
    plait_result_t status;
    if ((status = event_check(e, "plait_event_record")) || (status = plait_stream_check(s, "plait_event_record")))
        return status;
    if (s && s->is_cuda) {
        const struct plait_cu *cu = plait_cu_get();
        pthread_mutex_lock(&e->lock);
        int r = e->cu_event ? PLAIT_CU_SUCCESS : cu->EventCreate(&e->cu_event, PLAIT_CU_EVENT_DISABLE_TIMING);
        if (!r)
            r = cu->EventRecord(e->cu_event, s->cu_stream);
        if (!r)
            e->cu_last = 1;
        pthread_mutex_unlock(&e->lock);
        return r ? plait_cu_error(r, "plait_event_record", "cuEventRecord") : PLAIT_SUCCESS;
    }
    pthread_mutex_lock(&e->lock);
    e->cu_last = 0;
    uint64_t target = ++e->records;
    if (!s) {
        e->completed = target;
        pthread_cond_broadcast(&e->cond);
    }
    pthread_mutex_unlock(&e->lock);
    if (!s)
        return PLAIT_SUCCESS;
    if (push(s, ITEM_RECORD, NULL, e, target) != PLAIT_SUCCESS)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_event_record: out of memory");
    return PLAIT_SUCCESS;
}

/* plait_event_synchronize of an event already checked. */
static plait_result_t event_sync(plait_event_t e)
{
    pthread_mutex_lock(&e->lock);
    if (e->cu_last) {
        void *ev = e->cu_event;
        pthread_mutex_unlock(&e->lock);
        int r = plait_cu_get()->EventSynchronize(ev);
        return r ? plait_cu_error(r, "plait_event_synchronize", "cuEventSynchronize") : PLAIT_SUCCESS;
    }
    uint64_t target = e->records;
    while (e->completed < target)
        pthread_cond_wait(&e->cond, &e->lock);
    pthread_mutex_unlock(&e->lock);
    return PLAIT_SUCCESS;
}

plait_result_t plait_event_synchronize(plait_event_t e)
{
    plait_result_t status = event_check(e, "plait_event_synchronize");
    if (status)
        return status;
    return event_sync(e);
}

struct host_wait {
    struct plait_event *e;
    uint64_t target;
};

/* A CUDA stream's host function: blocks the stream until a host record is
 * reached (it calls no CUDA function, as host functions must not). */
static void host_wait_fn(void *arg)
{
    struct host_wait *w = arg;
    struct plait_event *e = w->e;
    pthread_mutex_lock(&e->lock);
    while (e->completed < w->target)
        pthread_cond_wait(&e->cond, &e->lock);
    e->host_waiters--;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
    free(w);
}

plait_result_t plait_stream_wait_event(plait_stream_t s, plait_event_t e)
{
    plait_result_t status;
    if ((status = plait_stream_check(s, "plait_stream_wait_event")) ||
        (status = event_check(e, "plait_stream_wait_event")))
        return status;
    pthread_mutex_lock(&e->lock);
    uint64_t target = e->records;
    const int cu_last = e->cu_last;
    const int reached = e->completed >= target;
    void *ev = e->cu_event;
    pthread_mutex_unlock(&e->lock);
    if (cu_last) {
        if (!s)
            return plait_event_synchronize(e);
        if (s->is_cuda) {
            int r = plait_cu_get()->StreamWaitEvent(s->cu_stream, ev, 0);
            return r ? plait_cu_error(r, "plait_stream_wait_event", "cuStreamWaitEvent") : PLAIT_SUCCESS;
        }
        if (push(s, ITEM_CUWAIT, NULL, e, 0) != PLAIT_SUCCESS)
            return plait_error(PLAIT_ERR_SYSTEM, "plait_stream_wait_event: out of memory");
        return PLAIT_SUCCESS;
    }
    if (s && s->is_cuda) {
        if (reached)
            return PLAIT_SUCCESS;
        struct host_wait *w = malloc(sizeof(*w));
        if (!w)
            return plait_error(PLAIT_ERR_SYSTEM, "plait_stream_wait_event: out of memory");
        w->e = e;
        w->target = target;
        pthread_mutex_lock(&e->lock);
        e->host_waiters++;
        pthread_mutex_unlock(&e->lock);
        int r = plait_cu_get()->LaunchHostFunc(s->cu_stream, host_wait_fn, w);
        if (r) {
            pthread_mutex_lock(&e->lock);
            e->host_waiters--;
            pthread_mutex_unlock(&e->lock);
            free(w);
            return plait_cu_error(r, "plait_stream_wait_event", "cuLaunchHostFunc");
        }
        return PLAIT_SUCCESS;
    }
    if (!s) {
        /* The NULL stream is the calling thread: wait here. */
        return plait_event_synchronize(e);
    }
    if (push(s, ITEM_WAIT, NULL, e, target) != PLAIT_SUCCESS)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_stream_wait_event: out of memory");
    return PLAIT_SUCCESS;
}

plait_result_t plait_event_destroy(plait_event_t e)
{
    if (!e)
        return PLAIT_SUCCESS;
    static const char fn[] = "plait_event_destroy";
    if (plait_handle_live(PLAIT_HANDLE_EVENT, e) && e->owner_pid != plait_self_pid()) {
        /* A forked child's copy: the records it waits for are the parent's. */
        if (!plait_handle_remove(PLAIT_HANDLE_EVENT, e))
            return destroyed_meanwhile(fn, "event", e);
        plait_handle_retire(PLAIT_HANDLE_EVENT, e);
        return PLAIT_SUCCESS;
    }
    plait_result_t status = event_check(e, fn);
    if (status)
        return status;
    /* Out of the registry first: of two destroys at once, only one goes on. */
    if (!plait_handle_remove(PLAIT_HANDLE_EVENT, e))
        return destroyed_meanwhile(fn, "event", e);
    event_sync(e);
    /* host records reached, and no CUDA host function still holds the event */
    pthread_mutex_lock(&e->lock);
    while (e->completed < e->records || e->host_waiters > 0)
        pthread_cond_wait(&e->cond, &e->lock);
    pthread_mutex_unlock(&e->lock);
    if (e->cu_event)
        plait_cu_get()->EventDestroy(e->cu_event);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->cond);
    plait_handle_retire(PLAIT_HANDLE_EVENT, e);
    return PLAIT_SUCCESS;
}
