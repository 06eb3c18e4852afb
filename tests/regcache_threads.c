/* The registration cache (transports/regcache.c) from several threads, for
 * ThreadSanitizer (suite tsan; Criterion's runner does not start under TSan)
 * and as a plain test (suites unit, sanitize). Four threads get and release
 * overlapping ranges (hits, misses, merges, evictions under small limits)
 * while a fifth invalidates ranges until they are done. Each worker checks
 * that every reference covers its request and that a registration it holds
 * is never deregistered; at the end every registration is deregistered once
 * and the counters agree. Exits 1 on a wrong result, 2 past its deadline;
 * TSan makes it 66 on a race. Every address is made up: nothing is touched. */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "transports/regcache.h"

#define PG ((uintptr_t)4096)
#define BASE ((uintptr_t)0x100000000ull)
#define WORKERS 4
#define OPS 30000
#define HELD 4
#define MAX_ENTRIES 16
#define MAX_BYTES (48 * PG)

struct fake_reg {
    uintptr_t start;
    size_t len;
    int live; /* atomic: read by the workers that hold it */
    struct fake_reg *next_all;
};

/* Written by the callbacks only, which run under the cache's lock. */
struct fake_owner {
    size_t regs, deregs, live, double_deregs;
    struct fake_reg *all;
};

static plait_result_t fake_reg(void *ctx, uintptr_t addr, size_t len, const struct plait_regcache_mem *mem,
                               void **handle_out)
{
    (void)mem;
    struct fake_owner *o = ctx;
    struct fake_reg *r = calloc(1, sizeof(*r));
    if (!r)
        return plait_error(PLAIT_ERR_SYSTEM, "fake reg: out of memory");
    r->start = addr;
    r->len = len;
    __atomic_store_n(&r->live, 1, __ATOMIC_RELAXED);
    r->next_all = o->all;
    o->all = r;
    o->regs++;
    o->live++;
    *handle_out = r;
    return PLAIT_SUCCESS;
}

static plait_result_t fake_dereg(void *ctx, void *handle)
{
    struct fake_owner *o = ctx;
    struct fake_reg *r = handle;
    o->deregs++;
    if (!__atomic_exchange_n(&r->live, 0, __ATOMIC_RELAXED)) {
        o->double_deregs++;
        return PLAIT_ERR_INTERNAL;
    }
    o->live--;
    return PLAIT_SUCCESS;
}

struct shared {
    struct plait_regcache *rc;
    int failed, stop;
    char msg[512];
    double deadline;
};

struct arg {
    struct shared *sh;
    uint64_t seed;
    int is_invalidator;
};

static uint64_t rng_next(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

static void fail(struct shared *sh, const char *msg)
{
    if (!__atomic_exchange_n(&sh->failed, 1, __ATOMIC_ACQ_REL))
        snprintf(sh->msg, sizeof(sh->msg), "%s", msg);
}

static int is_live(const struct plait_regcache_ref *ref)
{
    return __atomic_load_n(&((struct fake_reg *)ref->handle)->live, __ATOMIC_RELAXED);
}

static void *invalidator(struct arg *a)
{
    struct shared *sh = a->sh;
    uint64_t x = a->seed;
    for (unsigned i = 0; !__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE) && !__atomic_load_n(&sh->failed,
                                                                                             __ATOMIC_RELAXED);
         i++) {
        uintptr_t addr = BASE + rng_next(&x) % (64 * PG);
        if (plait_regcache_invalidate(sh->rc, (void *)addr, 1 + rng_next(&x) % (4 * PG), NULL) != PLAIT_SUCCESS)
            fail(sh, "invalidate failed");
        if (i % 8 == 0)
            sched_yield();
        if (plait_deadline_passed(sh->deadline)) {
            fail(sh, "the invalidator passed its deadline");
            break;
        }
    }
    return NULL;
}

static void *worker(void *p)
{
    struct arg *a = p;
    if (a->is_invalidator)
        return invalidator(a);
    struct shared *sh = a->sh;
    uint64_t x = a->seed;
    struct plait_regcache_ref held[HELD];
    size_t nheld = 0;
    const struct plait_regcache_mem host = {.kind = PLAIT_REG_HOST};
    for (int i = 0; i < OPS && !__atomic_load_n(&sh->failed, __ATOMIC_RELAXED); i++) {
        if (plait_deadline_passed(sh->deadline)) {
            fail(sh, "a worker passed its deadline");
            break;
        }
        if (i % 256 == 0)
            sched_yield();
        if (nheld < HELD && (nheld == 0 || rng_next(&x) % 2)) {
            uintptr_t addr = BASE + rng_next(&x) % (64 * PG);
            size_t len = 1 + rng_next(&x) % (4 * PG);
            struct plait_regcache_ref ref;
            if (plait_regcache_get(sh->rc, (void *)addr, len, &host, &ref) != PLAIT_SUCCESS) {
                fail(sh, plait_last_error_get());
                break;
            }
            const struct fake_reg *r = ref.handle;
            if (ref.base > addr || ref.base + ref.len < addr + len || r->start != ref.base || r->len != ref.len)
                fail(sh, "a reference does not cover its request");
            if (!is_live(&ref))
                fail(sh, "get returned a deregistered registration");
            held[nheld++] = ref;
        } else {
            size_t k = rng_next(&x) % nheld;
            if (!is_live(&held[k]))
                fail(sh, "a held registration was deregistered");
            if (plait_regcache_put(sh->rc, held[k].entry) != PLAIT_SUCCESS)
                fail(sh, plait_last_error_get());
            held[k] = held[--nheld];
        }
    }
    for (size_t k = 0; k < nheld; k++) {
        if (!is_live(&held[k]))
            fail(sh, "a held registration was deregistered");
        plait_regcache_put(sh->rc, held[k].entry);
    }
    return NULL;
}

#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "regcache_threads: " __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                                                   \
            status = 1;                                                                                            \
        }                                                                                                          \
    } while (0)

int main(void)
{
    int status = 0;
    struct fake_owner o = {0};
    struct plait_regcache_params p = {
        .name = "threads",
        .ctx = &o,
        .reg = fake_reg,
        .dereg = fake_dereg,
        .max_entries = MAX_ENTRIES,
        .max_bytes = MAX_BYTES,
        .host_page = PG,
    };
    struct shared sh = {.deadline = plait_deadline(200)};
    if (plait_regcache_create(&p, &sh.rc) != PLAIT_SUCCESS) {
        fprintf(stderr, "regcache_threads: create: %s\n", plait_last_error_get());
        return 1;
    }
    pthread_t th[WORKERS + 1];
    struct arg args[WORKERS + 1];
    for (int i = 0; i <= WORKERS; i++) {
        args[i] = (struct arg){.sh = &sh, .seed = 0x1234567ull + (uint64_t)i * 7777, .is_invalidator = i == WORKERS};
        if (pthread_create(&th[i], NULL, worker, &args[i]) != 0) {
            fprintf(stderr, "regcache_threads: pthread_create failed\n");
            return 1;
        }
    }
    for (int i = 0; i < WORKERS; i++)
        pthread_join(th[i], NULL);
    __atomic_store_n(&sh.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th[WORKERS], NULL);
    if (sh.failed) {
        fprintf(stderr, "regcache_threads: %s\n", sh.msg);
        return plait_deadline_passed(sh.deadline) ? 2 : 1;
    }
    struct plait_regcache_stats st;
    plait_regcache_stats(sh.rc, &st);
    printf("regcache_threads: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " merges, %" PRIu64
           " evictions, %" PRIu64 " invalidated\n",
           st.hits, st.misses, st.merges, st.evictions, st.invalidated);
    CHECK(st.referenced == 0 && st.detached == 0, "%zu referenced, %zu detached after every release", st.referenced,
          st.detached);
    CHECK(st.entries == o.live, "%zu entries, %zu registrations live", st.entries, o.live);
    CHECK(st.entries <= MAX_ENTRIES && st.bytes <= MAX_BYTES, "limits: %zu entries, %zu bytes", st.entries,
          st.bytes);
    CHECK(st.hits > 0 && st.misses > 0 && st.merges > 0 && st.evictions > 0,
          "every path should have run (hits, misses, merges, evictions)");
    plait_regcache_destroy(sh.rc);
    CHECK(o.live == 0, "%zu registrations left after destroy", o.live);
    CHECK(o.regs == o.deregs && o.double_deregs == 0, "%zu regs, %zu deregs, %zu twice", o.regs, o.deregs,
          o.double_deregs);
    while (o.all) {
        struct fake_reg *r = o.all;
        o.all = r->next_all;
        free(r);
    }
    return status;
}
