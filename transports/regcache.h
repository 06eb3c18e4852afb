/* The memory registration cache: lookup-or-register of address ranges for a
 * transport or net provider that must register memory before a device may
 * touch it (ibv_reg_mr, a dmabuf import, a UCX memory handle). The owner
 * supplies the registration and deregistration callbacks; the cache decides
 * when to call them: a range already covered by a registration of the same
 * kind is reused, unused registrations stay cached until evicted (in LRU
 * order) or invalidated, and everything is deregistered at destroy.
 *
 * Policy (docs/architecture.md, section 4, "Registration cache"):
 * - Ranges are widened to page boundaries (host_page / device_page).
 * - The registrations the cache may reuse (the *cached* ones) never overlap
 *   within one class (same kind, flags, device and, for dmabuf, the same fd
 *   mapped at the same address). A request that overlaps cached entries without
 *   being covered by one is registered as the union of the request and those
 *   entries (one merged registration); the entries it replaces leave the cache:
 *   unreferenced ones are deregistered at once, referenced ones stay valid for
 *   their holders and are deregistered at their last release. If the merged
 *   registration fails, the request alone is tried before the failure is
 *   returned (a merge may span pages the request never asked for).
 * - Limits (max_entries, max_bytes; 0 = unlimited) count every registration
 *   the cache holds. Only unreferenced cached entries are evicted, so a cache
 *   whose registrations are all in use may exceed its limits: the limits bound
 *   what the cache keeps for reuse, never what the owner's callers hold.
 *   Before a new registration, unreferenced entries are evicted until it fits.
 *
 * Thread-safety: every function may be called from any thread; one mutex per
 * cache serialises them. The owner's callbacks run with that mutex held, so
 * they must not call back into the same cache (they may take their own locks).
 * A get takes the lock and does a binary search: call it per buffer and
 * operation, and keep the reference for the operation's chunks, not per chunk.
 */
#ifndef PLAIT_TRANSPORTS_REGCACHE_H
#define PLAIT_TRANSPORTS_REGCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"

/* What the memory is, as the owner's reg callback needs to know it. */
enum plait_reg_kind {
    PLAIT_REG_HOST = 0,   /* host memory (malloc, mmap, shm) */
    PLAIT_REG_DEVICE = 1, /* device memory by virtual address (GPUDirect RDMA peer memory) */
    PLAIT_REG_DMABUF = 2, /* device memory exported as a dmabuf: fd and offset */
};

/* The kind of a range, passed to plait_regcache_get. For PLAIT_REG_DMABUF,
 * dmabuf_offset is the offset in the dmabuf of the byte at the requested
 * address (as ibv_reg_dmabuf_mr's offset for that address). `flags` are the
 * owner's (access rights, say): a registration is reused only for requests
 * with the same flags. */
struct plait_regcache_mem {
    enum plait_reg_kind kind;
    unsigned flags;
    int device;             /* device ordinal (DEVICE, DMABUF); ignored for HOST */
    int dmabuf_fd;          /* DMABUF only */
    uint64_t dmabuf_offset; /* DMABUF only: offset of the requested address */
};

/* The owner's callbacks and settings, copied at create. */
struct plait_regcache_params {
    const char *name; /* for messages ("tcp", "ib mlx5_0", ...); copied */
    void *ctx;        /* the owner's, passed to each callback */
    /* Registers [addr, addr+len) (page-aligned); for DMABUF, mem->dmabuf_offset
     * is the offset of addr itself. Sets *handle_out on success. Failures are
     * returned as they are, with the owner's last-error message (if it set one)
     * quoted in the cache's message. */
    plait_result_t (*reg)(void *ctx, uintptr_t addr, size_t len, const struct plait_regcache_mem *mem,
                          void **handle_out);
    /* Deregisters a handle reg returned. A failure is logged (WARN) and the
     * registration is forgotten anyway. */
    plait_result_t (*dereg)(void *ctx, void *handle);
    size_t max_entries; /* 0 = unlimited */
    size_t max_bytes;   /* 0 = unlimited */
    size_t host_page;   /* widening for HOST; power of two; 0 = the system page size */
    size_t device_page; /* widening for DEVICE and DMABUF; power of two; 0 = 64 KiB (a GPU page) */
};

struct plait_regcache;
struct plait_regcache_entry; /* one registration; opaque */

/* A reference to a registration, from plait_regcache_get. */
struct plait_regcache_ref {
    struct plait_regcache_entry *entry; /* pass to plait_regcache_put */
    void *handle;                       /* the owner's handle from reg */
    uintptr_t base;                     /* the registration's first byte (page-aligned) */
    size_t len;                         /* its length; [base, base+len) covers the request */
    uint64_t dmabuf_offset;             /* DMABUF: the offset of base in the dmabuf */
};

/* Counters since create; read with plait_regcache_stats. */
struct plait_regcache_stats {
    uint64_t hits;          /* gets served by a cached registration */
    uint64_t misses;        /* gets that called reg (successfully or not) */
    uint64_t merges;        /* registrations that replaced overlapping cached entries */
    uint64_t evictions;     /* unreferenced entries deregistered to meet the limits */
    uint64_t invalidated;   /* entries dropped by plait_regcache_invalidate */
    uint64_t reg_calls;     /* calls of reg (a failed merge and its retry are two) */
    uint64_t reg_failures;  /* reg calls that failed */
    uint64_t dereg_calls;   /* calls of dereg */
    uint64_t dereg_failures;
    uint64_t bytes_registered_total; /* bytes of every successful reg since create */
    size_t entries;        /* cached entries (reusable) now */
    size_t detached;       /* registrations still referenced but no longer reusable (merged, invalidated) */
    size_t referenced;     /* entries (cached or detached) with a reference now */
    size_t bytes;          /* bytes registered now (cached and detached) */
    size_t peak_bytes;     /* the most bytes registered at once */
};

/* Creates a cache. params->reg and params->dereg are required; page sizes
 * must be powers of two. Returns PLAIT_ERR_INVALID_ARGUMENT (NULL params,
 * callbacks or cache_out; a bad page size) or PLAIT_ERR_SYSTEM (out of memory);
 * *cache_out is set only on success. */
plait_result_t plait_regcache_create(const struct plait_regcache_params *params, struct plait_regcache **cache_out);

/* Returns a reference to a registration of `mem`'s class covering
 * [addr, addr+len): a cached one (a hit; its reference count +1) or a new one
 * (a miss; see the merge policy above). len must be > 0 and the range must
 * not wrap. On failure nothing is inserted and *ref_out is untouched:
 * PLAIT_ERR_INVALID_ARGUMENT (NULL arguments, len 0, a wrapping range, an
 * unknown kind, a dmabuf offset that does not fit), the reg callback's
 * failure (the message names the cache, the range and the kind), or
 * PLAIT_ERR_SYSTEM (out of memory). Evictions done to make room stay done. */
plait_result_t plait_regcache_get(struct plait_regcache *cache, const void *addr, size_t len,
                                  const struct plait_regcache_mem *mem, struct plait_regcache_ref *ref_out);

/* Drops one reference taken by plait_regcache_get. An entry left without
 * references stays cached (most recently used) unless it was invalidated or
 * replaced, in which case it is deregistered now. Returns
 * PLAIT_ERR_INVALID_USAGE for an entry without references (released twice),
 * or the dereg callback's failure (the entry is forgotten anyway). */
plait_result_t plait_regcache_put(struct plait_regcache *cache, struct plait_regcache_entry *entry);

/* The user freed or deregistered [addr, addr+len): every registration of any
 * class overlapping it leaves the cache. Unreferenced ones are deregistered
 * now; referenced ones are marked invalid (never handed out again) and
 * deregistered at their last release. *dropped_out (may be NULL) gets the
 * number of entries dropped. Returns PLAIT_ERR_INVALID_ARGUMENT for NULL
 * cache or a wrapping range; a dereg failure is logged, not returned. */
plait_result_t plait_regcache_invalidate(struct plait_regcache *cache, const void *addr, size_t len,
                                         size_t *dropped_out);

/* Deregisters unreferenced cached entries, least recently used first, until
 * at most `keep_bytes` bytes are registered or none is left (0: all of them).
 * For an owner that ran out of registrable memory and wants to retry. Returns
 * the number of entries deregistered. */
size_t plait_regcache_trim(struct plait_regcache *cache, size_t keep_bytes);

/* A copy of the counters, taken under the cache's lock. */
void plait_regcache_stats(struct plait_regcache *cache, struct plait_regcache_stats *stats_out);

/* Deregisters everything and frees the cache. Entries still referenced are
 * reported in one WARN (how many, and the first few ranges) and deregistered
 * too: their holders' handles are dead afterwards. The counters are logged
 * at INFO (subsystem TRANSPORT). NULL is a no-op. */
void plait_regcache_destroy(struct plait_regcache *cache);

/* The name of a kind ("host", "device", "dmabuf"). */
const char *plait_reg_kind_name(enum plait_reg_kind kind);

#endif
