/* The memory registration cache (transports/regcache.h has the policy).
 *
 * Layout: the cached (reusable) entries sit in one array sorted by (class,
 * start), each slot with its key and end. Within a class they never overlap, so the only entry that can cover
 * [s, e) is the last one of that class starting at or before s: a lookup is
 * one binary search. Unreferenced cached entries are also on a doubly linked
 * LRU list (oldest first); referenced entries that left the index (replaced
 * by a merge, or invalidated) are on a detached list until their last
 * release. Everything is guarded by one mutex: a registration costs
 * microseconds to milliseconds in the kernel, so the lock is not what limits
 * a get that misses, and a hit holds it for a binary search. */
#include "transports/regcache.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

#define RC_ENTRY_MAGIC 0x7263656e74727921ull
#define RC_DEFAULT_DEVICE_PAGE ((size_t)65536)
/* Referenced entries a destroy names in its WARN line. */
#define RC_WARN_MAX_NAMED 4

/* What decides whether a registration may serve a request besides the range.
 * For a dmabuf, `delta` is the address of the dmabuf's byte 0 (address minus
 * offset, modulo 2^64): two mappings of one fd at different addresses are
 * different classes, so an entry's offset for any address in it is
 * address - delta. */
struct rc_class {
    uint32_t kind;
    uint32_t flags;
    int32_t device;
    int32_t fd;
    uint64_t delta;
};

enum rc_state {
    RC_CACHED,   /* in the index: reusable */
    RC_DETACHED, /* out of the index, still referenced; deregistered at the last put */
};

struct plait_regcache_entry {
    uint64_t magic;
    struct rc_class cls;
    uintptr_t start, end;
    void *handle;
    size_t refs;
    enum rc_state state;
    int is_invalid; /* detached by an invalidate (rather than by a merge) */
    /* The LRU list while cached and unreferenced; the detached list while detached. */
    struct plait_regcache_entry *prev, *next;
};

/* An index slot holds its entry's key and end, so that a binary search reads
 * only the array (one cache line per step) and never chases entry pointers. */
struct rc_slot {
    struct rc_class cls;
    uintptr_t start, end;
    struct plait_regcache_entry *e;
};

struct rc_list {
    struct plait_regcache_entry *head, *tail;
    size_t count;
};

struct plait_regcache {
    char name[64];
    struct plait_regcache_params p; /* p.name points at name */
    pthread_mutex_t lock;
    struct rc_slot *idx; /* sorted by (class, start) */
    size_t n, cap;
    struct rc_list lru;      /* cached, unreferenced: head is the least recently used */
    struct rc_list detached; /* detached, referenced */
    size_t referenced;
    struct plait_regcache_stats st;
};

const char *plait_reg_kind_name(enum plait_reg_kind kind)
{
    switch (kind) {
    case PLAIT_REG_HOST:
        return "host";
    case PLAIT_REG_DEVICE:
        return "device";
    case PLAIT_REG_DMABUF:
        return "dmabuf";
    }
    return "unknown";
}

static int is_pow2(size_t x)
{
    return x && !(x & (x - 1));
}

static void list_push_tail(struct rc_list *l, struct plait_regcache_entry *e)
{
    e->next = NULL;
    e->prev = l->tail;
    if (l->tail)
        l->tail->next = e;
    else
        l->head = e;
    l->tail = e;
    l->count++;
}

static void list_remove(struct rc_list *l, struct plait_regcache_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        l->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = NULL;
    l->count--;
}

static int class_cmp(const struct rc_class *a, const struct rc_class *b)
{
    if (a->kind != b->kind)
        return a->kind < b->kind ? -1 : 1;
    if (a->flags != b->flags)
        return a->flags < b->flags ? -1 : 1;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    if (a->fd != b->fd)
        return a->fd < b->fd ? -1 : 1;
    if (a->delta != b->delta)
        return a->delta < b->delta ? -1 : 1;
    return 0;
}

/* The first index whose (class, start) is >= (cls, start). */
static size_t lower_bound(const struct plait_regcache *rc, const struct rc_class *cls, uintptr_t start)
{
    size_t lo = 0, hi = rc->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct rc_slot *e = &rc->idx[mid];
        int c = class_cmp(&e->cls, cls);
        if (c < 0 || (c == 0 && e->start < start))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The run [*first, *last) of cached entries of `cls` that overlap [s, e).
 * Cached entries of a class do not overlap each other, so the run is
 * contiguous: at most one entry starting before s reaches into the range
 * (the one just before the lower bound), then every entry starting below e. */
static void overlap_run(const struct plait_regcache *rc, const struct rc_class *cls, uintptr_t s, uintptr_t e,
                        size_t *first, size_t *last)
{
    size_t i = lower_bound(rc, cls, s);
    if (i > 0 && class_cmp(&rc->idx[i - 1].cls, cls) == 0 && rc->idx[i - 1].end > s)
        i--;
    size_t j = i;
    while (j < rc->n && class_cmp(&rc->idx[j].cls, cls) == 0 && rc->idx[j].start < e)
        j++;
    *first = i;
    *last = j;
}

/* The cached entry of `cls` covering [s, e), or NULL. */
static struct plait_regcache_entry *find_covering(const struct plait_regcache *rc, const struct rc_class *cls,
                                                  uintptr_t s, uintptr_t e)
{
    /* The last entry of the class with start <= s is the only candidate. */
    size_t i = lower_bound(rc, cls, s + 1);
    if (i == 0)
        return NULL;
    const struct rc_slot *c = &rc->idx[i - 1];
    if (class_cmp(&c->cls, cls) != 0 || c->start > s || c->end < e)
        return NULL;
    return c->e;
}

static uint64_t entry_offset(const struct plait_regcache_entry *e)
{
    return e->cls.kind == PLAIT_REG_DMABUF ? (uint64_t)e->start - e->cls.delta : 0;
}

static void entry_mem(const struct plait_regcache_entry *e, struct plait_regcache_mem *mem)
{
    mem->kind = (enum plait_reg_kind)e->cls.kind;
    mem->flags = e->cls.flags;
    mem->device = e->cls.device;
    mem->dmabuf_fd = e->cls.fd;
    mem->dmabuf_offset = entry_offset(e);
}

/* Deregisters and frees an entry that is in no list and not in the index. */
static plait_result_t entry_dereg(struct plait_regcache *rc, struct plait_regcache_entry *e, const char *why)
{
    size_t len = e->end - e->start;
    rc->st.dereg_calls++;
    plait_result_t res = rc->p.dereg(rc->p.ctx, e->handle);
    if (res != PLAIT_SUCCESS) {
        rc->st.dereg_failures++;
        PLAIT_WARN(PLAIT_SUBSYS_TRANSPORT,
                   "regcache %s: deregistering %s memory [0x%" PRIxPTR ", 0x%" PRIxPTR ") (%s) failed: %s (%s); "
                   "forgotten anyway",
                   rc->name, plait_reg_kind_name((enum plait_reg_kind)e->cls.kind), e->start, e->end, why,
                   plait_get_error_string(res), plait_last_error_get());
    } else {
        PLAIT_TRACE(PLAIT_SUBSYS_TRANSPORT, "regcache %s: deregistered [0x%" PRIxPTR ", 0x%" PRIxPTR ") (%s)",
                    rc->name, e->start, e->end, why);
    }
    rc->st.bytes -= len;
    e->magic = 0;
    free(e);
    return res;
}

/* Removes idx[i] from the index (the caller then detaches or frees it). */
static void index_remove(struct plait_regcache *rc, size_t i)
{
    memmove(&rc->idx[i], &rc->idx[i + 1], (rc->n - i - 1) * sizeof(rc->idx[0]));
    rc->n--;
}

/* An entry just removed from the index: deregistered now when unreferenced,
 * else kept for its holders on the detached list. */
static void entry_detach(struct plait_regcache *rc, struct plait_regcache_entry *e, int is_invalidate,
                         const char *why)
{
    if (e->refs == 0) {
        list_remove(&rc->lru, e);
        entry_dereg(rc, e, why);
        return;
    }
    e->state = RC_DETACHED;
    e->is_invalid = is_invalidate;
    list_push_tail(&rc->detached, e);
}

static int over_limits(const struct plait_regcache *rc, size_t add_entries, size_t add_bytes)
{
    size_t entries = rc->n + rc->detached.count;
    if (rc->p.max_entries && entries + add_entries > rc->p.max_entries)
        return 1;
    if (rc->p.max_bytes && (add_bytes > rc->p.max_bytes || rc->st.bytes > rc->p.max_bytes - add_bytes))
        return 1;
    return 0;
}

/* Deregisters the least recently used unreferenced entry; 0 when there is none. */
static int evict_one(struct plait_regcache *rc, const char *why)
{
    struct plait_regcache_entry *e = rc->lru.head;
    if (!e)
        return 0;
    size_t i = lower_bound(rc, &e->cls, e->start);
    /* The index holds each cached entry exactly once (starts are distinct within a class). */
    if (i >= rc->n || rc->idx[i].e != e) {
        PLAIT_WARN(PLAIT_SUBSYS_TRANSPORT, "regcache %s: LRU entry [0x%" PRIxPTR ", 0x%" PRIxPTR ") not in the index",
                   rc->name, e->start, e->end);
        return 0;
    }
    index_remove(rc, i);
    list_remove(&rc->lru, e);
    rc->st.evictions++;
    entry_dereg(rc, e, why);
    return 1;
}

static void fill_ref(const struct plait_regcache_entry *e, struct plait_regcache_ref *ref)
{
    ref->entry = (struct plait_regcache_entry *)e;
    ref->handle = e->handle;
    ref->base = e->start;
    ref->len = e->end - e->start;
    ref->dmabuf_offset = entry_offset(e);
}

plait_result_t plait_regcache_create(const struct plait_regcache_params *params, struct plait_regcache **cache_out)
{
    if (!params || !cache_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_regcache_create: %s is NULL",
                           params ? "cache_out" : "params");
    const char *name = params->name ? params->name : "(unnamed)";
    if (!params->reg || !params->dereg)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_regcache_create(%s): the %s callback is NULL", name,
                           params->reg ? "dereg" : "reg");
    size_t host_page = params->host_page ? params->host_page : (size_t)sysconf(_SC_PAGESIZE);
    size_t device_page = params->device_page ? params->device_page : RC_DEFAULT_DEVICE_PAGE;
    if (!is_pow2(host_page) || !is_pow2(device_page))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_regcache_create(%s): page sizes must be powers of two (host %zu, device %zu)", name,
                           host_page, device_page);
    struct plait_regcache *rc = calloc(1, sizeof(*rc));
    if (!rc)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_regcache_create(%s): out of memory", name);
    snprintf(rc->name, sizeof(rc->name), "%s", name);
    rc->p = *params;
    rc->p.name = rc->name;
    rc->p.host_page = host_page;
    rc->p.device_page = device_page;
    int err = pthread_mutex_init(&rc->lock, NULL);
    if (err) {
        free(rc);
        return plait_error(PLAIT_ERR_SYSTEM, "plait_regcache_create(%s): pthread_mutex_init: %s", name,
                           strerror(err));
    }
    *cache_out = rc;
    return PLAIT_SUCCESS;
}

/* The request's class and its range widened to pages; PLAIT_SUCCESS or an
 * argument error (nothing locked yet). */
static plait_result_t request_class(const struct plait_regcache *rc, uintptr_t a, size_t len,
                                    const struct plait_regcache_mem *mem, struct rc_class *cls, uintptr_t *s_out,
                                    uintptr_t *e_out)
{
    size_t page;
    memset(cls, 0, sizeof(*cls));
    cls->kind = (uint32_t)mem->kind;
    cls->flags = mem->flags;
    cls->device = -1;
    cls->fd = -1;
    switch (mem->kind) {
    case PLAIT_REG_HOST:
        page = rc->p.host_page;
        break;
    case PLAIT_REG_DEVICE:
        page = rc->p.device_page;
        cls->device = mem->device;
        break;
    case PLAIT_REG_DMABUF:
        page = rc->p.device_page;
        cls->device = mem->device;
        cls->fd = mem->dmabuf_fd;
        if (mem->dmabuf_fd < 0)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "regcache %s: dmabuf fd %d for [%p, +%zu)", rc->name,
                               mem->dmabuf_fd, (void *)a, len);
        cls->delta = (uint64_t)a - mem->dmabuf_offset;
        break;
    default:
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "regcache %s: unknown memory kind %d for [%p, +%zu)",
                           rc->name, (int)mem->kind, (void *)a, len);
    }
    if (len == 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "regcache %s: zero-length %s range at %p", rc->name,
                           plait_reg_kind_name(mem->kind), (void *)a);
    if (a > UINTPTR_MAX - len || a + len > UINTPTR_MAX - (page - 1))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "regcache %s: %s range [%p, +%zu) wraps around the address space once widened to %zu-byte "
                           "pages",
                           rc->name, plait_reg_kind_name(mem->kind), (void *)a, len, page);
    uintptr_t s = a & ~(uintptr_t)(page - 1);
    uintptr_t e = (a + len + page - 1) & ~(uintptr_t)(page - 1);
    /* A dmabuf's registration cannot start before its byte 0: the widening
     * stops there (the dmabuf itself is page-aligned in practice). */
    if (mem->kind == PLAIT_REG_DMABUF && mem->dmabuf_offset < a - s)
        s = a - (uintptr_t)mem->dmabuf_offset;
    *s_out = s;
    *e_out = e;
    return PLAIT_SUCCESS;
}

/* Calls reg for [s, e) of cls. On failure, *why gets the owner's message. */
static plait_result_t call_reg(struct plait_regcache *rc, const struct rc_class *cls, uintptr_t s, uintptr_t e,
                               void **handle, char *why, size_t why_len)
{
    struct plait_regcache_entry tmp = {.cls = *cls, .start = s, .end = e};
    struct plait_regcache_mem mem;
    entry_mem(&tmp, &mem);
    plait_last_error_clear();
    rc->st.reg_calls++;
    void *h = NULL;
    plait_result_t res = rc->p.reg(rc->p.ctx, s, e - s, &mem, &h);
    if (res != PLAIT_SUCCESS) {
        rc->st.reg_failures++;
        const char *msg = plait_last_error_get();
        snprintf(why, why_len, "%s", msg[0] ? msg : plait_get_error_string(res));
        return res;
    }
    *handle = h;
    return PLAIT_SUCCESS;
}

plait_result_t plait_regcache_get(struct plait_regcache *rc, const void *addr, size_t len,
                                  const struct plait_regcache_mem *mem, struct plait_regcache_ref *ref_out)
{
    if (!rc || !mem || !ref_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_regcache_get: %s is NULL",
                           !rc ? "cache" : !mem ? "mem" : "ref_out");
    uintptr_t a = (uintptr_t)addr;
    struct rc_class cls;
    uintptr_t s = 0, e = 0;
    plait_result_t res = request_class(rc, a, len, mem, &cls, &s, &e);
    if (res != PLAIT_SUCCESS)
        return res;

    pthread_mutex_lock(&rc->lock);
    struct plait_regcache_entry *hit = find_covering(rc, &cls, s, e);
    if (hit) {
        if (hit->refs++ == 0) {
            list_remove(&rc->lru, hit);
            rc->referenced++;
        }
        rc->st.hits++;
        fill_ref(hit, ref_out);
        pthread_mutex_unlock(&rc->lock);
        return PLAIT_SUCCESS;
    }
    rc->st.misses++;

    /* Room first, so that an owner with a hard limit (a NIC's count of memory
     * regions) sees the deregistrations before the registration. */
    while (over_limits(rc, 1, e - s) && evict_one(rc, "evicted for a new registration"))
        ;

    /* Everything that can fail without a registration to undo comes before it. */
    struct plait_regcache_entry *ne = calloc(1, sizeof(*ne));
    if (!ne) {
        pthread_mutex_unlock(&rc->lock);
        return plait_error(PLAIT_ERR_SYSTEM, "regcache %s: out of memory for an entry", rc->name);
    }
    if (rc->n == rc->cap) {
        size_t cap = rc->cap ? rc->cap * 2 : 16;
        struct rc_slot *idx = realloc(rc->idx, cap * sizeof(*idx));
        if (!idx) {
            free(ne);
            pthread_mutex_unlock(&rc->lock);
            return plait_error(PLAIT_ERR_SYSTEM, "regcache %s: out of memory for the index (%zu entries)", rc->name,
                               cap);
        }
        rc->idx = idx;
        rc->cap = cap;
    }

    size_t first, last;
    overlap_run(rc, &cls, s, e, &first, &last);
    uintptr_t us = s, ue = e;
    if (first < last) {
        if (rc->idx[first].start < us)
            us = rc->idx[first].start;
        if (rc->idx[last - 1].end > ue)
            ue = rc->idx[last - 1].end;
    }
    void *handle = NULL;
    char why[512];
    res = call_reg(rc, &cls, us, ue, &handle, why, sizeof(why));
    int merged_failed = 0;
    if (res != PLAIT_SUCCESS && (us != s || ue != e)) {
        /* The union may span pages the request never named (with other
         * protections, say); the request alone may still register. */
        merged_failed = 1;
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                   "regcache %s: merged range [0x%" PRIxPTR ", 0x%" PRIxPTR ") did not register (%s); trying "
                   "[0x%" PRIxPTR ", 0x%" PRIxPTR ") alone",
                   rc->name, us, ue, why, s, e);
        us = s;
        ue = e;
        res = call_reg(rc, &cls, us, ue, &handle, why, sizeof(why));
    }
    if (res != PLAIT_SUCCESS) {
        free(ne);
        pthread_mutex_unlock(&rc->lock);
        return plait_error(res,
                           "regcache %s: registering %s memory [0x%" PRIxPTR ", 0x%" PRIxPTR ") (%zu bytes, for "
                           "[%p, +%zu)%s) failed: %s",
                           rc->name, plait_reg_kind_name(mem->kind), s, e, (size_t)(e - s), addr, len,
                           merged_failed ? "; merged with its overlapping entries it failed too" : "", why);
    }

    ne->magic = RC_ENTRY_MAGIC;
    ne->cls = cls;
    ne->start = us;
    ne->end = ue;
    ne->handle = handle;
    ne->refs = 1;
    ne->state = RC_CACHED;
    rc->referenced++;
    rc->st.bytes += ue - us;
    rc->st.bytes_registered_total += ue - us;
    if (rc->st.bytes > rc->st.peak_bytes)
        rc->st.peak_bytes = rc->st.bytes;
    PLAIT_TRACE(PLAIT_SUBSYS_TRANSPORT, "regcache %s: registered %s [0x%" PRIxPTR ", 0x%" PRIxPTR ")", rc->name,
                plait_reg_kind_name(mem->kind), us, ue);

    /* The entries the new one overlaps leave the index, replaced by it; the
     * run is recomputed because the registered range may be the request's. */
    overlap_run(rc, &cls, us, ue, &first, &last);
    if (first < last)
        rc->st.merges++;
    for (size_t k = first; k < last; k++)
        entry_detach(rc, rc->idx[k].e, 0, "replaced by a merged registration");
    size_t removed = last - first;
    memmove(&rc->idx[first + 1], &rc->idx[last], (rc->n - last) * sizeof(rc->idx[0]));
    rc->idx[first] = (struct rc_slot){.cls = cls, .start = us, .end = ue, .e = ne};
    rc->n = rc->n - removed + 1;

    /* A merge can grow past what was made room for. */
    while (over_limits(rc, 0, 0) && evict_one(rc, "evicted over the limits"))
        ;
    fill_ref(ne, ref_out);
    pthread_mutex_unlock(&rc->lock);
    return PLAIT_SUCCESS;
}

plait_result_t plait_regcache_put(struct plait_regcache *rc, struct plait_regcache_entry *e)
{
    if (!rc || !e)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_regcache_put: %s is NULL", !rc ? "cache" : "entry");
    plait_result_t res = PLAIT_SUCCESS;
    pthread_mutex_lock(&rc->lock);
    if (e->magic != RC_ENTRY_MAGIC) {
        pthread_mutex_unlock(&rc->lock);
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "regcache %s: %p is not a live entry", rc->name, (void *)e);
    }
    if (e->refs == 0) {
        uintptr_t s = e->start, end = e->end;
        pthread_mutex_unlock(&rc->lock);
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "regcache %s: entry [0x%" PRIxPTR ", 0x%" PRIxPTR ") released more often than it was got",
                           rc->name, s, end);
    }
    if (--e->refs == 0) {
        rc->referenced--;
        if (e->state == RC_DETACHED) {
            list_remove(&rc->detached, e);
            res = entry_dereg(rc, e, e->is_invalid ? "invalidated, last reference released"
                                                   : "replaced by a merge, last reference released");
        } else {
            list_push_tail(&rc->lru, e);
            /* Limits could be exceeded while everything was referenced. */
            while (over_limits(rc, 0, 0) && evict_one(rc, "evicted over the limits"))
                ;
        }
    }
    pthread_mutex_unlock(&rc->lock);
    return res;
}

plait_result_t plait_regcache_invalidate(struct plait_regcache *rc, const void *addr, size_t len, size_t *dropped_out)
{
    if (!rc)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_regcache_invalidate: cache is NULL");
    uintptr_t a = (uintptr_t)addr;
    if (a > UINTPTR_MAX - len)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "regcache %s: invalidated range [%p, +%zu) wraps", rc->name,
                           addr, len);
    size_t dropped = 0;
    pthread_mutex_lock(&rc->lock);
    /* One run per class: the index is sorted by class first. */
    size_t i = 0;
    while (len > 0 && i < rc->n) {
        struct rc_class cls = rc->idx[i].cls;
        size_t first, last;
        overlap_run(rc, &cls, a, a + len, &first, &last);
        for (size_t k = first; k < last; k++)
            entry_detach(rc, rc->idx[k].e, 1, "invalidated");
        memmove(&rc->idx[first], &rc->idx[last], (rc->n - last) * sizeof(rc->idx[0]));
        rc->n -= last - first;
        dropped += last - first;
        /* The next class begins after every entry of this one. */
        i = lower_bound(rc, &cls, UINTPTR_MAX);
        while (i < rc->n && class_cmp(&rc->idx[i].cls, &cls) == 0)
            i++;
    }
    rc->st.invalidated += dropped;
    pthread_mutex_unlock(&rc->lock);
    if (dropped_out)
        *dropped_out = dropped;
    return PLAIT_SUCCESS;
}

size_t plait_regcache_trim(struct plait_regcache *rc, size_t keep_bytes)
{
    size_t n = 0;
    if (!rc)
        return 0;
    pthread_mutex_lock(&rc->lock);
    while ((keep_bytes == 0 || rc->st.bytes > keep_bytes) && evict_one(rc, "trimmed"))
        n++;
    pthread_mutex_unlock(&rc->lock);
    return n;
}

void plait_regcache_stats(struct plait_regcache *rc, struct plait_regcache_stats *out)
{
    if (!rc || !out)
        return;
    pthread_mutex_lock(&rc->lock);
    *out = rc->st;
    out->entries = rc->n;
    out->detached = rc->detached.count;
    out->referenced = rc->referenced;
    pthread_mutex_unlock(&rc->lock);
}

void plait_regcache_destroy(struct plait_regcache *rc)
{
    if (!rc)
        return;
    pthread_mutex_lock(&rc->lock);
    char named[RC_WARN_MAX_NAMED * 64] = "";
    size_t nnamed = 0, used = 0;
    if (rc->referenced > 0) {
        /* The cached entries first, then the detached ones. */
        struct plait_regcache_entry *d = rc->detached.head;
        for (size_t i = 0; nnamed < RC_WARN_MAX_NAMED && (i < rc->n || d); i++) {
            struct plait_regcache_entry *e;
            if (i < rc->n) {
                e = rc->idx[i].e;
            } else {
                e = d;
                d = d->next;
            }
            if (e->refs == 0)
                continue;
            int w = snprintf(named + used, sizeof(named) - used, "%s[0x%" PRIxPTR ", 0x%" PRIxPTR ") x%zu%s",
                             nnamed ? ", " : "", e->start, e->end, e->refs, e->state == RC_DETACHED ? " (detached)" : "");
            if (w > 0 && (size_t)w < sizeof(named) - used)
                used += (size_t)w;
            nnamed++;
        }
        PLAIT_WARN(PLAIT_SUBSYS_TRANSPORT,
                   "regcache %s: destroyed with %zu registration%s still referenced (%s%s); deregistering them",
                   rc->name, rc->referenced, rc->referenced == 1 ? "" : "s", named,
                   rc->referenced > nnamed ? ", ..." : "");
    }
    PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
               "regcache %s: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " merges, %" PRIu64
               " evictions, %" PRIu64 " invalidated, %" PRIu64 " reg calls (%" PRIu64 " failed), %" PRIu64
               " bytes registered in all, peak %zu",
               rc->name, rc->st.hits, rc->st.misses, rc->st.merges, rc->st.evictions, rc->st.invalidated,
               rc->st.reg_calls, rc->st.reg_failures, rc->st.bytes_registered_total, rc->st.peak_bytes);
    for (size_t i = 0; i < rc->n; i++) {
        struct plait_regcache_entry *e = rc->idx[i].e;
        if (e->refs == 0)
            list_remove(&rc->lru, e);
        entry_dereg(rc, e, "cache destroyed");
    }
    rc->n = 0;
    while (rc->detached.head) {
        struct plait_regcache_entry *e = rc->detached.head;
        list_remove(&rc->detached, e);
        entry_dereg(rc, e, "cache destroyed");
    }
    pthread_mutex_unlock(&rc->lock);
    pthread_mutex_destroy(&rc->lock);
    free(rc->idx);
    free(rc);
}
