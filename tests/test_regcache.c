/* The memory registration cache (transports/regcache.c) against a fake owner
 * that counts reg/dereg calls and can be told to fail: hits and misses,
 * covering reuse, page widening, reference counts, LRU eviction under entry
 * and byte limits, merges, invalidation with and without references, reg
 * failures (nothing inserted), destroy with references, the kinds, many
 * seeded random operations checked against a model. The threads are
 * tests/regcache_threads.c (a plain program, for TSan). No memory is touched: the cache only handles
 * addresses, so the tests use made-up ones. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"
#include "transports/regcache.h"

#define PG ((uintptr_t)4096)
#define DPG ((uintptr_t)65536)
#define BASE ((uintptr_t)0x100000000ull)

/* ---------------------------------------------------------------- the fake owner */

struct fake_reg {
    uintptr_t start;
    size_t len;
    struct plait_regcache_mem mem;
    int live; /* atomic: 1 from reg to dereg */
    int id;
    struct fake_reg *next_all;
};

struct fake_owner {
    size_t regs, deregs, live, live_bytes;
    int next_id;
    int fail_all;        /* fail every reg while set */
    int fail_first;      /* fail the next this many regs */
    size_t fail_above;   /* fail a reg longer than this (0: never) */
    int bad_alignment;   /* set when reg saw a range not aligned to the expected page */
    int fail_dereg;      /* dereg fails (after releasing the registration) while set */
    struct fake_reg *all;
    /* The handles dereg saw, in order (the model test drains it after each op). */
    struct fake_reg **log;
    size_t nlog, caplog;
    int use_log;
};

static plait_result_t fake_reg_cb(void *ctx, uintptr_t addr, size_t len, const struct plait_regcache_mem *mem,
                                  void **handle_out)
{
    struct fake_owner *o = ctx;
    o->regs++;
    uintptr_t page = mem->kind == PLAIT_REG_HOST ? PG : DPG;
    if (mem->kind != PLAIT_REG_DMABUF && ((addr % page) || (len % page)))
        o->bad_alignment = 1;
    if (o->fail_all || o->fail_first > 0 || (o->fail_above && len > o->fail_above)) {
        if (o->fail_first > 0)
            o->fail_first--;
        return plait_error(PLAIT_ERR_SYSTEM, "fake reg: ENOMEM pinning %zu bytes", len);
    }
    struct fake_reg *r = calloc(1, sizeof(*r));
    cr_assert(r);
    r->start = addr;
    r->len = len;
    r->mem = *mem;
    r->id = o->next_id++;
    __atomic_store_n(&r->live, 1, __ATOMIC_RELAXED);
    r->next_all = o->all;
    o->all = r;
    o->live++;
    o->live_bytes += len;
    *handle_out = r;
    return PLAIT_SUCCESS;
}

static plait_result_t fake_dereg_cb(void *ctx, void *handle)
{
    struct fake_owner *o = ctx;
    struct fake_reg *r = handle;
    o->deregs++;
    if (!__atomic_load_n(&r->live, __ATOMIC_RELAXED)) {
        o->bad_alignment = 2; /* a double dereg; checked as a failure below */
        return PLAIT_ERR_INTERNAL;
    }
    __atomic_store_n(&r->live, 0, __ATOMIC_RELAXED);
    o->live--;
    o->live_bytes -= r->len;
    if (o->fail_dereg)
        return plait_error(PLAIT_ERR_SYSTEM, "fake dereg: EBUSY");
    if (o->use_log) {
        if (o->nlog == o->caplog) {
            o->caplog = o->caplog ? o->caplog * 2 : 64;
            o->log = realloc(o->log, o->caplog * sizeof(*o->log));
        }
        o->log[o->nlog++] = r;
    }
    return PLAIT_SUCCESS;
}

static void fake_free(struct fake_owner *o)
{
    while (o->all) {
        struct fake_reg *r = o->all;
        o->all = r->next_all;
        free(r);
    }
    free(o->log);
}

static struct plait_regcache *make_cache(struct fake_owner *o, size_t max_entries, size_t max_bytes)
{
    struct plait_regcache_params p = {
        .name = "test-rc",
        .ctx = o,
        .reg = fake_reg_cb,
        .dereg = fake_dereg_cb,
        .max_entries = max_entries,
        .max_bytes = max_bytes,
        .host_page = PG,
        .device_page = DPG,
    };
    struct plait_regcache *rc = NULL;
    cr_assert_eq(plait_regcache_create(&p, &rc), PLAIT_SUCCESS, "%s", plait_last_error_get());
    return rc;
}

static const struct plait_regcache_mem HOST = {.kind = PLAIT_REG_HOST};

static struct plait_regcache_ref get_ok(struct plait_regcache *rc, uintptr_t addr, size_t len)
{
    struct plait_regcache_ref ref;
    plait_result_t res = plait_regcache_get(rc, (const void *)addr, len, &HOST, &ref);
    cr_assert_eq(res, PLAIT_SUCCESS, "get 0x%" PRIxPTR " + %zu: %s", addr, len, plait_last_error_get());
    cr_assert_leq(ref.base, addr);
    cr_assert_geq(ref.base + ref.len, addr + len);
    return ref;
}

static void put_ok(struct plait_regcache *rc, struct plait_regcache_ref ref)
{
    cr_assert_eq(plait_regcache_put(rc, ref.entry), PLAIT_SUCCESS, "%s", plait_last_error_get());
}

static int is_live(const struct plait_regcache_ref *ref)
{
    return __atomic_load_n(&((struct fake_reg *)ref->handle)->live, __ATOMIC_RELAXED);
}

static struct plait_regcache_stats stats_of(struct plait_regcache *rc)
{
    struct plait_regcache_stats st;
    plait_regcache_stats(rc, &st);
    return st;
}

TestSuite(regcache);

/* ---------------------------------------------------------------- behaviours */

Test(regcache, hit_and_miss)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref a = get_ok(rc, BASE, 3 * PG);
    cr_assert_eq(o.regs, 1);
    put_ok(rc, a);
    cr_assert_eq(o.deregs, 0, "an unreferenced entry stays cached");
    struct plait_regcache_ref b = get_ok(rc, BASE, 3 * PG);
    cr_assert_eq(o.regs, 1, "the second get is a hit");
    cr_assert_eq(b.handle, a.handle);
    cr_assert_eq(b.entry, a.entry);
    put_ok(rc, b);
    /* Another range, in another page: a miss. */
    struct plait_regcache_ref c = get_ok(rc, BASE + 16 * PG, 10);
    cr_assert_eq(o.regs, 2);
    put_ok(rc, c);
    struct plait_regcache_stats st = stats_of(rc);
    cr_assert_eq(st.hits, 1);
    cr_assert_eq(st.misses, 2);
    cr_assert_eq(st.entries, 2);
    cr_assert_eq(st.bytes, 4 * PG);
    cr_assert_eq(st.bytes_registered_total, 4 * PG);
    cr_assert_eq(st.referenced, 0);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.deregs, 2);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, covering_reuse)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref big = get_ok(rc, BASE, 8 * PG);
    /* Every range inside it, at any alignment, reuses it. */
    const uintptr_t offs[][2] = {{0, 1}, {PG + 5, 100}, {7 * PG, PG}, {3 * PG + 1, 4 * PG - 1}, {0, 8 * PG}};
    for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
        struct plait_regcache_ref r = get_ok(rc, BASE + offs[i][0], offs[i][1]);
        cr_assert_eq(r.handle, big.handle, "range %zu", i);
        cr_assert_eq(r.base, BASE);
        cr_assert_eq(r.len, 8 * PG);
        put_ok(rc, r);
    }
    cr_assert_eq(o.regs, 1);
    /* One byte past the end is not covered. */
    struct plait_regcache_ref past = get_ok(rc, BASE + 7 * PG, PG + 1);
    cr_assert_neq(past.handle, big.handle);
    cr_assert_eq(o.regs, 2);
    put_ok(rc, past);
    put_ok(rc, big);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, page_widening)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref a = get_ok(rc, BASE + 100, 10);
    cr_assert_eq(a.base, BASE);
    cr_assert_eq(a.len, PG);
    struct plait_regcache_ref b = get_ok(rc, BASE + 10 * PG - 1, 2);
    cr_assert_eq(b.base, BASE + 9 * PG);
    cr_assert_eq(b.len, 2 * PG, "a range across a page boundary registers both pages");
    /* Another address in a registered page hits. */
    struct plait_regcache_ref c = get_ok(rc, BASE + PG - 1, 1);
    cr_assert_eq(c.handle, a.handle);
    cr_assert_eq(o.regs, 2);
    cr_assert_eq(o.bad_alignment, 0, "reg saw a range not widened to pages");
    /* Device memory is widened to the device page. */
    struct plait_regcache_mem dev = {.kind = PLAIT_REG_DEVICE, .device = 1};
    struct plait_regcache_ref d;
    cr_assert_eq(plait_regcache_get(rc, (void *)(BASE + DPG + 3 * PG), 8, &dev, &d), PLAIT_SUCCESS);
    cr_assert_eq(d.base, BASE + DPG);
    cr_assert_eq(d.len, DPG);
    cr_assert_eq(o.bad_alignment, 0);
    put_ok(rc, a);
    put_ok(rc, b);
    put_ok(rc, c);
    put_ok(rc, d);
    plait_regcache_destroy(rc);
    fake_free(&o);
}

Test(regcache, refcounts)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref a1 = get_ok(rc, BASE, PG);
    struct plait_regcache_ref a2 = get_ok(rc, BASE, PG);
    struct plait_regcache_ref a3 = get_ok(rc, BASE + 10, 10);
    cr_assert_eq(stats_of(rc).referenced, 1);
    put_ok(rc, a1);
    put_ok(rc, a2);
    cr_assert_eq(stats_of(rc).referenced, 1, "one reference is left");
    put_ok(rc, a3);
    cr_assert_eq(stats_of(rc).referenced, 0);
    cr_assert_eq(o.deregs, 0);
    /* A fourth release is misuse, refused, and changes nothing. */
    cr_assert_eq(plait_regcache_put(rc, a1.entry), PLAIT_ERR_INVALID_USAGE);
    cr_assert(strstr(plait_last_error_get(), "test-rc"), "%s", plait_last_error_get());
    struct plait_regcache_ref again = get_ok(rc, BASE, PG);
    cr_assert_eq(again.handle, a1.handle);
    cr_assert_eq(o.regs, 1);
    put_ok(rc, again);
    cr_assert_eq(plait_regcache_put(rc, NULL), PLAIT_ERR_INVALID_ARGUMENT);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, lru_eviction_by_entries)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 3, 0);
    struct plait_regcache_ref a = get_ok(rc, BASE, PG);
    struct plait_regcache_ref b = get_ok(rc, BASE + 10 * PG, PG);
    struct plait_regcache_ref c = get_ok(rc, BASE + 20 * PG, PG);
    put_ok(rc, a);
    put_ok(rc, b);
    put_ok(rc, c);
    /* Touch a: the order is now b, c, a. */
    put_ok(rc, get_ok(rc, BASE, PG));
    struct plait_regcache_ref d = get_ok(rc, BASE + 30 * PG, PG);
    cr_assert_eq(o.deregs, 1);
    cr_assert(!is_live(&b), "b was the least recently used");
    cr_assert(is_live(&a) && is_live(&c));
    struct plait_regcache_ref e = get_ok(rc, BASE + 40 * PG, PG);
    cr_assert(!is_live(&c), "then c");
    cr_assert(is_live(&a));
    struct plait_regcache_stats st = stats_of(rc);
    cr_assert_eq(st.evictions, 2);
    cr_assert_eq(st.entries, 3);
    /* Referenced entries are never evicted: with d and e held, the limit is
     * exceeded rather than a held registration dropped ... */
    struct plait_regcache_ref f = get_ok(rc, BASE + 50 * PG, PG);
    struct plait_regcache_ref g = get_ok(rc, BASE + 60 * PG, PG);
    cr_assert(!is_live(&a), "a, the only unreferenced entry, went for f");
    st = stats_of(rc);
    cr_assert_eq(st.entries, 4, "d, e, f, g are all held");
    /* ... and a release while over the limit evicts at once. */
    put_ok(rc, d);
    cr_assert(!is_live(&d));
    cr_assert_eq(stats_of(rc).entries, 3);
    put_ok(rc, e);
    put_ok(rc, f);
    put_ok(rc, g);
    cr_assert_eq(stats_of(rc).entries, 3);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, lru_eviction_by_bytes)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 4 * PG);
    struct plait_regcache_ref a = get_ok(rc, BASE, PG);
    struct plait_regcache_ref b = get_ok(rc, BASE + 10 * PG, 2 * PG);
    put_ok(rc, a);
    put_ok(rc, b);
    /* 1 + 2 + 2 pages > 4: a (least recently used) goes, before c registers. */
    struct plait_regcache_ref c = get_ok(rc, BASE + 20 * PG, 2 * PG);
    cr_assert(!is_live(&a));
    cr_assert(is_live(&b));
    cr_assert_eq(stats_of(rc).bytes, 4 * PG);
    put_ok(rc, c);
    /* A registration larger than the limit is made (held) and goes when released. */
    struct plait_regcache_ref big = get_ok(rc, BASE + 40 * PG, 5 * PG);
    cr_assert(!is_live(&b) && !is_live(&c), "everything unreferenced was evicted to make room");
    cr_assert_eq(stats_of(rc).bytes, 5 * PG);
    put_ok(rc, big);
    cr_assert(!is_live(&big));
    cr_assert_eq(stats_of(rc).bytes, 0);
    cr_assert_eq(stats_of(rc).evictions, 4);
    /* trim: deregisters unreferenced entries down to a byte count. */
    for (int i = 0; i < 4; i++)
        put_ok(rc, get_ok(rc, BASE + (100 + 10 * i) * PG, PG));
    cr_assert_eq(plait_regcache_trim(rc, 2 * PG), 2);
    cr_assert_eq(stats_of(rc).bytes, 2 * PG);
    cr_assert_eq(plait_regcache_trim(rc, 0), 2);
    cr_assert_eq(o.live, 0);
    plait_regcache_destroy(rc);
    fake_free(&o);
}

Test(regcache, merge_overlapping)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref a = get_ok(rc, BASE, 2 * PG);           /* [0, 2) held */
    struct plait_regcache_ref b = get_ok(rc, BASE + 4 * PG, 2 * PG);  /* [4, 6) released */
    put_ok(rc, b);
    struct plait_regcache_ref m = get_ok(rc, BASE + PG, 4 * PG);      /* [1, 5) */
    cr_assert_eq(m.base, BASE);
    cr_assert_eq(m.len, 6 * PG, "the union of the request and what it overlaps");
    cr_assert(is_live(&a), "a is held: it stays registered for its holder");
    cr_assert(!is_live(&b), "b was unreferenced and is replaced");
    struct plait_regcache_stats st = stats_of(rc);
    cr_assert_eq(st.merges, 1);
    cr_assert_eq(st.entries, 1);
    cr_assert_eq(st.detached, 1);
    cr_assert_eq(st.bytes, 8 * PG);
    /* Lookups inside a's range now find the merged entry, not a. */
    struct plait_regcache_ref r = get_ok(rc, BASE, PG);
    cr_assert_eq(r.handle, m.handle);
    put_ok(rc, r);
    put_ok(rc, a);
    cr_assert(!is_live(&a), "a detached entry goes at its last release");
    cr_assert_eq(stats_of(rc).detached, 0);
    /* Adjacent ranges do not merge (they do not overlap). */
    struct plait_regcache_ref adj = get_ok(rc, BASE + 6 * PG, PG);
    cr_assert_eq(adj.base, BASE + 6 * PG);
    cr_assert_eq(adj.len, PG);
    put_ok(rc, adj);
    put_ok(rc, m);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, invalidate_unreferenced)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref a = get_ok(rc, BASE, 4 * PG);
    struct plait_regcache_ref b = get_ok(rc, BASE + 8 * PG, PG);
    put_ok(rc, a);
    put_ok(rc, b);
    size_t dropped = 99;
    /* The last byte of a only. */
    cr_assert_eq(plait_regcache_invalidate(rc, (void *)(BASE + 4 * PG - 1), 1, &dropped), PLAIT_SUCCESS);
    cr_assert_eq(dropped, 1);
    cr_assert(!is_live(&a));
    cr_assert(is_live(&b));
    /* A range touching nothing drops nothing; nor does length 0. */
    cr_assert_eq(plait_regcache_invalidate(rc, (void *)(BASE + 4 * PG), 4 * PG, &dropped), PLAIT_SUCCESS);
    cr_assert_eq(dropped, 0);
    cr_assert_eq(plait_regcache_invalidate(rc, (void *)(BASE + 8 * PG), 0, &dropped), PLAIT_SUCCESS);
    cr_assert_eq(dropped, 0);
    struct plait_regcache_ref a2 = get_ok(rc, BASE, PG);
    cr_assert_neq(a2.handle, a.handle, "an invalidated range registers again");
    cr_assert_eq(o.regs, 3);
    put_ok(rc, a2);
    cr_assert_eq(stats_of(rc).invalidated, 1);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, invalidate_referenced)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref a = get_ok(rc, BASE, 4 * PG);
    struct plait_regcache_ref a_too = get_ok(rc, BASE, PG);
    size_t dropped = 0;
    cr_assert_eq(plait_regcache_invalidate(rc, (void *)(BASE + PG), PG, &dropped), PLAIT_SUCCESS);
    cr_assert_eq(dropped, 1);
    cr_assert(is_live(&a), "a referenced entry stays registered for its holders");
    cr_assert_eq(stats_of(rc).detached, 1);
    /* Never handed out again. */
    struct plait_regcache_ref fresh = get_ok(rc, BASE, PG);
    cr_assert_neq(fresh.handle, a.handle);
    put_ok(rc, a);
    cr_assert(is_live(&a), "one reference is left");
    put_ok(rc, a_too);
    cr_assert(!is_live(&a), "deregistered at its last release");
    cr_assert_eq(stats_of(rc).detached, 0);
    put_ok(rc, fresh);
    cr_assert(is_live(&fresh), "the new one is cached");
    /* Invalidate reaches every kind at those addresses. */
    struct plait_regcache_mem dev = {.kind = PLAIT_REG_DEVICE, .device = 0};
    struct plait_regcache_ref d;
    cr_assert_eq(plait_regcache_get(rc, (void *)BASE, PG, &dev, &d), PLAIT_SUCCESS);
    put_ok(rc, d);
    cr_assert_eq(plait_regcache_invalidate(rc, (void *)BASE, 1, &dropped), PLAIT_SUCCESS);
    cr_assert_eq(dropped, 2);
    cr_assert(!is_live(&d) && !is_live(&fresh));
    cr_assert_eq(o.live, 0);
    plait_regcache_destroy(rc);
    fake_free(&o);
}

Test(regcache, reg_failure_inserts_nothing)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    o.fail_all = 1;
    struct plait_regcache_ref ref = {.handle = (void *)1};
    plait_result_t res = plait_regcache_get(rc, (void *)(BASE + 5), PG, &HOST, &ref);
    cr_assert_eq(res, PLAIT_ERR_SYSTEM, "the owner's code is returned");
    const char *msg = plait_last_error_get();
    cr_assert(strstr(msg, "regcache test-rc"), "%s", msg);
    cr_assert(strstr(msg, "[0x100000000, 0x100002000)"), "the widened range is named: %s", msg);
    cr_assert(strstr(msg, "ENOMEM pinning"), "the owner's message is quoted: %s", msg);
    cr_assert(strstr(msg, "host"), "%s", msg);
    cr_assert_eq(ref.handle, (void *)1, "ref_out is untouched");
    struct plait_regcache_stats st = stats_of(rc);
    cr_assert_eq(st.entries, 0);
    cr_assert_eq(st.bytes, 0);
    cr_assert_eq(st.reg_failures, 1);
    o.fail_all = 0;
    /* Nothing half-inserted: the same get now registers. */
    struct plait_regcache_ref ok = get_ok(rc, BASE + 5, PG);
    cr_assert_eq(o.regs, 2);
    cr_assert_eq(stats_of(rc).misses, 2);
    put_ok(rc, ok);

    /* A merge that fails falls back to the request alone ... */
    o.fail_above = 2 * PG;
    struct plait_regcache_ref m = get_ok(rc, BASE + PG, 2 * PG); /* [1,3) overlaps [0,2) -> [0,3) fails */
    cr_assert_eq(m.base, BASE + PG);
    cr_assert_eq(m.len, 2 * PG);
    cr_assert(!is_live(&ok), "the request alone still replaces what it overlaps");
    cr_assert_eq(stats_of(rc).reg_failures, 2);
    /* ... and when both fail, the cache is as it was. */
    o.fail_all = 1;
    put_ok(rc, m);
    res = plait_regcache_get(rc, (void *)(BASE + 2 * PG), 2 * PG, &HOST, &ref);
    cr_assert_eq(res, PLAIT_ERR_SYSTEM);
    cr_assert(strstr(plait_last_error_get(), "merged"), "%s", plait_last_error_get());
    o.fail_all = 0;
    cr_assert(is_live(&m));
    struct plait_regcache_ref m2 = get_ok(rc, BASE + PG, 1);
    cr_assert_eq(m2.handle, m.handle, "the overlapped entry is still cached");
    put_ok(rc, m2);
    cr_assert_eq(o.regs - o.deregs - stats_of(rc).reg_failures, o.live);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, dereg_failure_is_forgotten)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref a = get_ok(rc, BASE, PG);
    size_t dropped;
    cr_assert_eq(plait_regcache_invalidate(rc, (void *)BASE, PG, &dropped), PLAIT_SUCCESS);
    o.fail_dereg = 1;
    /* The last release deregisters; the owner's failure is returned ... */
    cr_assert_eq(plait_regcache_put(rc, a.entry), PLAIT_ERR_SYSTEM);
    /* ... and the registration is forgotten all the same. */
    struct plait_regcache_stats st = stats_of(rc);
    cr_assert_eq(st.dereg_failures, 1);
    cr_assert_eq(st.detached, 0);
    cr_assert_eq(st.bytes, 0);
    /* A failure during eviction or destroy is counted, not returned. */
    put_ok(rc, get_ok(rc, BASE + 4 * PG, PG));
    cr_assert_eq(plait_regcache_trim(rc, 0), 1);
    cr_assert_eq(stats_of(rc).dereg_failures, 2);
    o.fail_dereg = 0;
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, bad_arguments)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref ref;
    cr_assert_eq(plait_regcache_get(rc, (void *)BASE, 0, &HOST, &ref), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_regcache_get(rc, (void *)(UINTPTR_MAX - 10), 5, &HOST, &ref), PLAIT_ERR_INVALID_ARGUMENT,
                 "widening the last page wraps");
    cr_assert_eq(plait_regcache_get(rc, (void *)(UINTPTR_MAX - 10), 20, &HOST, &ref), PLAIT_ERR_INVALID_ARGUMENT);
    struct plait_regcache_mem bad = {.kind = (enum plait_reg_kind)7};
    cr_assert_eq(plait_regcache_get(rc, (void *)BASE, 1, &bad, &ref), PLAIT_ERR_INVALID_ARGUMENT);
    struct plait_regcache_mem nofd = {.kind = PLAIT_REG_DMABUF, .dmabuf_fd = -1};
    cr_assert_eq(plait_regcache_get(rc, (void *)BASE, 1, &nofd, &ref), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_regcache_get(rc, (void *)BASE, 1, NULL, &ref), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_regcache_get(NULL, (void *)BASE, 1, &HOST, &ref), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_regcache_invalidate(rc, (void *)(UINTPTR_MAX - 1), 5, NULL), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(o.regs, 0);
    plait_regcache_destroy(rc);
    plait_regcache_destroy(NULL);

    struct plait_regcache *rc2 = NULL;
    struct plait_regcache_params p = {.name = "x", .reg = fake_reg_cb, .dereg = NULL};
    cr_assert_eq(plait_regcache_create(&p, &rc2), PLAIT_ERR_INVALID_ARGUMENT);
    p.dereg = fake_dereg_cb;
    p.host_page = 3000;
    cr_assert_eq(plait_regcache_create(&p, &rc2), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_null(rc2);
    p.host_page = 0; /* the system page */
    cr_assert_eq(plait_regcache_create(&p, &rc2), PLAIT_SUCCESS);
    plait_regcache_destroy(rc2);
    fake_free(&o);
}

Test(regcache, kinds_and_dmabuf)
{
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_mem dev0 = {.kind = PLAIT_REG_DEVICE, .device = 0};
    struct plait_regcache_mem dev1 = {.kind = PLAIT_REG_DEVICE, .device = 1};
    struct plait_regcache_mem host_f = {.kind = PLAIT_REG_HOST, .flags = 4};
    struct plait_regcache_ref h = get_ok(rc, BASE, DPG), d0, d1, hf;
    cr_assert_eq(plait_regcache_get(rc, (void *)BASE, PG, &dev0, &d0), PLAIT_SUCCESS);
    cr_assert_eq(plait_regcache_get(rc, (void *)BASE, PG, &dev1, &d1), PLAIT_SUCCESS);
    cr_assert_eq(plait_regcache_get(rc, (void *)BASE, PG, &host_f, &hf), PLAIT_SUCCESS);
    cr_assert_eq(o.regs, 4, "kind, device and flags each make a class of their own");
    cr_assert_eq(((struct fake_reg *)d1.handle)->mem.device, 1);
    cr_assert_eq(((struct fake_reg *)hf.handle)->mem.flags, 4u);

    /* A dmabuf mapped at BASE + 16 pages, fd 42: the byte at BASE + 16 pages + 3 GPU pages + 5
     * is at offset 3 GPU pages + 5; the registration starts at offset 3 GPU pages. */
    uintptr_t map = BASE + 16 * DPG;
    struct plait_regcache_mem buf = {.kind = PLAIT_REG_DMABUF, .device = 0, .dmabuf_fd = 42,
                                     .dmabuf_offset = 3 * DPG + 5};
    struct plait_regcache_ref b1, b2, b3, b4;
    cr_assert_eq(plait_regcache_get(rc, (void *)(map + 3 * DPG + 5), 10, &buf, &b1), PLAIT_SUCCESS);
    cr_assert_eq(b1.base, map + 3 * DPG);
    cr_assert_eq(b1.dmabuf_offset, 3 * DPG);
    cr_assert_eq(((struct fake_reg *)b1.handle)->mem.dmabuf_offset, 3 * DPG, "reg gets the offset of the base");
    cr_assert_eq(((struct fake_reg *)b1.handle)->mem.dmabuf_fd, 42);
    /* Same fd, same mapping, inside: reused. */
    buf.dmabuf_offset = 3 * DPG + 100;
    cr_assert_eq(plait_regcache_get(rc, (void *)(map + 3 * DPG + 100), 10, &buf, &b2), PLAIT_SUCCESS);
    cr_assert_eq(b2.handle, b1.handle);
    /* Same fd mapped elsewhere (address minus offset differs): another class. */
    buf.dmabuf_offset = 3 * DPG + 5 + DPG;
    cr_assert_eq(plait_regcache_get(rc, (void *)(map + 3 * DPG + 5), 10, &buf, &b3), PLAIT_SUCCESS);
    cr_assert_neq(b3.handle, b1.handle);
    cr_assert_eq(b3.dmabuf_offset, 4 * DPG);
    /* Widening stops at the dmabuf's byte 0 (here 50 bytes into a device page). */
    buf.dmabuf_offset = 50;
    cr_assert_eq(plait_regcache_get(rc, (void *)(map + 7 * DPG + 100), 10, &buf, &b4), PLAIT_SUCCESS);
    cr_assert_eq(b4.base, map + 7 * DPG + 50);
    cr_assert_eq(b4.len, DPG - 50);
    cr_assert_eq(b4.dmabuf_offset, 0);
    cr_assert_eq(o.regs, 7);
    struct plait_regcache_ref all[] = {h, d0, d1, hf, b1, b2, b3, b4};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        put_ok(rc, all[i]);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

Test(regcache, destroy_with_references)
{
    char path[128];
    snprintf(path, sizeof(path), "/tmp/plait-regcache-test-%d.log", (int)getpid());
    setenv("PLAIT_DEBUG", "WARN", 1);
    setenv("PLAIT_DEBUG_FILE", path, 1);
    plait_log_configure();
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    struct plait_regcache_ref a = get_ok(rc, BASE, PG);
    struct plait_regcache_ref b = get_ok(rc, BASE + 8 * PG, PG);
    get_ok(rc, BASE + 8 * PG, 1);
    struct plait_regcache_ref c = get_ok(rc, BASE + 16 * PG, PG);
    put_ok(rc, c);
    size_t dropped;
    plait_regcache_invalidate(rc, (void *)BASE, 1, &dropped); /* a: detached, still held */
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0, "everything is deregistered, held or not");
    cr_assert(!is_live(&a) && !is_live(&b));
    unsetenv("PLAIT_DEBUG");
    unsetenv("PLAIT_DEBUG_FILE");
    plait_log_configure();
    FILE *f = fopen(path, "r");
    cr_assert(f, "no log at %s", path);
    char text[8192] = "";
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(path);
    cr_assert(strstr(text, "WARN"), "%s", text);
    cr_assert(strstr(text, "regcache test-rc: destroyed with 2 registrations still referenced"), "%s", text);
    cr_assert(strstr(text, "[0x100008000, 0x100009000) x2"), "%s", text);
    cr_assert(strstr(text, "(detached)"), "%s", text);
    fake_free(&o);
}

Test(regcache, many_entries)
{
    /* Lookups by binary search over a large index: every entry found again,
     * the gaps between them missed. */
    enum { N = 20000 };
    struct fake_owner o = {0};
    struct plait_regcache *rc = make_cache(&o, 0, 0);
    /* Inserted in a scrambled order, so that insertion lands everywhere in the array. */
    for (size_t k = 0; k < N; k++) {
        size_t i = (k * 7919) % N;
        put_ok(rc, get_ok(rc, BASE + 2 * i * PG, PG));
    }
    cr_assert_eq(stats_of(rc).entries, N);
    double t0 = plait_now();
    enum { ROUNDS = 10 };
    for (int r = 0; r < ROUNDS; r++)
        for (size_t i = 0; i < N; i++) {
            struct plait_regcache_ref ref = get_ok(rc, BASE + 2 * i * PG + 17, 100);
            cr_assert_eq(ref.base, BASE + 2 * i * PG);
            put_ok(rc, ref);
        }
    double dt = plait_now() - t0;
    cr_log_info("%d hits (get + put) over %d entries: %.0f ns each", ROUNDS * N, N, dt * 1e9 / (ROUNDS * N));
    cr_assert_eq(o.regs, N);
    cr_assert_eq(stats_of(rc).hits, (uint64_t)ROUNDS * N);
    /* The gaps miss, and each merges nothing (adjacent, not overlapping). */
    put_ok(rc, get_ok(rc, BASE + PG, PG));
    cr_assert_eq(stats_of(rc).merges, 0);
    cr_assert_eq(o.regs, N + 1);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    fake_free(&o);
}

/* ---------------------------------------------------------------- random operations against a model
 *
 * The model knows, for every registration the fake owner made, whether the
 * cache may still reuse it (`cached`), who holds it (`refs`, the test's own
 * count) and when it was last released (`used`, for LRU). After each
 * operation it checks the cache against the policy: a get is a hit exactly
 * when a cached registration of the class covers the widened request, and it
 * returns that one; a miss registers the union of the request and the cached
 * entries it overlaps (or the request alone when the union failed) and those
 * entries leave the cache; a referenced registration is never deregistered;
 * every deregistration is explained (replaced, invalidated, released after
 * either, or evicted least recently used first); after every operation the
 * limits hold unless no unreferenced entry is left. */

#define M_MAX_REGS 50000
#define M_MAX_HELD 8

struct mreg {
    struct fake_reg *h;
    int cls; /* 0 = host flags 0, 1 = host flags 1 */
    uintptr_t s, e;
    int cached, alive, refs;
    uint64_t used;
};

struct model {
    struct mreg *regs; /* indexed by fake_reg id */
    size_t nregs;
    struct plait_regcache_ref held[M_MAX_HELD];
    int held_id[M_MAX_HELD];
    size_t nheld;
    uint64_t clock;
    size_t max_entries, max_bytes;
};

static uint64_t rng_next(uint64_t *x)
{
    /* xorshift64*: a fixed sequence per seed. */
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

static void model_sync_new(struct model *m, struct fake_owner *o)
{
    /* o->all is newest first; ids are dense. */
    size_t newest = o->all ? (size_t)o->all->id + 1 : 0;
    for (struct fake_reg *r = o->all; r && (size_t)r->id >= m->nregs; r = r->next_all) {
        cr_assert_lt((size_t)r->id, (size_t)M_MAX_REGS);
        struct mreg *g = &m->regs[r->id];
        g->h = r;
        g->cls = (int)r->mem.flags;
        g->s = r->start;
        g->e = r->start + r->len;
        g->alive = 1;
        g->cached = 0;
        g->refs = 0;
    }
    m->nregs = newest;
}

/* The least recently released cached unreferenced registration, or -1. */
static long model_lru_oldest(const struct model *m)
{
    long best = -1;
    for (size_t i = 0; i < m->nregs; i++) {
        const struct mreg *g = &m->regs[i];
        if (g->alive && g->cached && g->refs == 0 && (best < 0 || g->used < m->regs[best].used))
            best = (long)i;
    }
    return best;
}

/* Accounts for the deregistrations of one operation. `newest` (or -1) is a
 * registration this op made: cached entries overlapping it were replaced. */
static void model_drain(struct model *m, struct fake_owner *o, long newest, const char *op, uint64_t step)
{
    for (size_t k = 0; k < o->nlog; k++) {
        struct mreg *g = &m->regs[o->log[k]->id];
        cr_assert(g->alive, "step %" PRIu64 " %s: reg %d deregistered twice", step, op, o->log[k]->id);
        cr_assert_eq(g->refs, 0, "step %" PRIu64 " %s: reg %d [0x%" PRIxPTR ", 0x%" PRIxPTR ") deregistered while "
                     "held %d times", step, op, o->log[k]->id, g->s, g->e, g->refs);
        int replaced = 0;
        if (newest >= 0 && g->cached) {
            const struct mreg *n = &m->regs[newest];
            replaced = g->cls == n->cls && g->s < n->e && n->s < g->e && (size_t)newest != (size_t)o->log[k]->id;
        }
        if (g->cached && !replaced) {
            long oldest = model_lru_oldest(m);
            cr_assert_eq(oldest, (long)o->log[k]->id,
                         "step %" PRIu64 " %s: evicted reg %d, but the least recently used is %ld", step, op,
                         o->log[k]->id, oldest);
        }
        g->alive = 0;
        g->cached = 0;
    }
    o->nlog = 0;
}

static void model_check_state(struct model *m, struct fake_owner *o, struct plait_regcache *rc, uint64_t step)
{
    struct plait_regcache_stats st = stats_of(rc);
    size_t cached = 0, alive = 0, bytes = 0, unref_cached = 0, referenced = 0;
    for (size_t i = 0; i < m->nregs; i++) {
        const struct mreg *g = &m->regs[i];
        cr_assert_eq(g->alive, __atomic_load_n(&g->h->live, __ATOMIC_RELAXED), "step %" PRIu64 ": reg %zu", step,
                     i);
        if (!g->alive) {
            cr_assert_eq(g->refs, 0);
            continue;
        }
        alive++;
        bytes += g->e - g->s;
        referenced += g->refs > 0;
        if (g->cached) {
            cached++;
            unref_cached += g->refs == 0;
        } else {
            cr_assert_gt(g->refs, 0, "step %" PRIu64 ": reg %zu is neither cached nor held yet registered", step, i);
        }
    }
    cr_assert_eq(st.entries, cached, "step %" PRIu64, step);
    cr_assert_eq(st.entries + st.detached, alive, "step %" PRIu64, step);
    cr_assert_eq(st.bytes, bytes, "step %" PRIu64, step);
    cr_assert_eq(o->live_bytes, bytes);
    cr_assert_eq(st.referenced, referenced, "step %" PRIu64, step);
    if (unref_cached > 0) {
        cr_assert(!m->max_entries || alive <= m->max_entries, "step %" PRIu64 ": %zu entries over %zu", step, alive,
                  m->max_entries);
        cr_assert(!m->max_bytes || bytes <= m->max_bytes, "step %" PRIu64 ": %zu bytes over %zu", step, bytes,
                  m->max_bytes);
    }
    cr_assert_eq(o->bad_alignment, 0, "step %" PRIu64, step);
}

static void run_model(uint64_t seed, int steps, size_t max_entries, size_t max_bytes)
{
    struct fake_owner o = {.use_log = 1};
    struct model m = {.max_entries = max_entries, .max_bytes = max_bytes};
    m.regs = calloc(M_MAX_REGS, sizeof(*m.regs));
    cr_assert(m.regs);
    struct plait_regcache *rc = make_cache(&o, max_entries, max_bytes);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    const uintptr_t window = 96; /* pages */
    for (int step = 0; step < steps; step++) {
        m.clock++;
        unsigned r = (unsigned)(rng_next(&x) % 100);
        if (r < 45 && m.nheld < M_MAX_HELD) {
            /* get */
            int cls = (int)(rng_next(&x) % 2);
            uintptr_t a = BASE + (rng_next(&x) % (window * PG));
            size_t len = 1 + rng_next(&x) % (6 * PG);
            uintptr_t s = a & ~(PG - 1), e = (a + len + PG - 1) & ~(PG - 1);
            unsigned f = (unsigned)(rng_next(&x) % 100);
            o.fail_all = f < 4;
            o.fail_first = f >= 4 && f < 8;
            long expect = -1;
            for (size_t i = 0; i < m.nregs; i++) {
                const struct mreg *g = &m.regs[i];
                if (g->alive && g->cached && g->cls == cls && g->s <= s && g->e >= e) {
                    cr_assert_eq(expect, -1, "step %d: two cached entries cover one range", step);
                    expect = (long)i;
                }
            }
            size_t regs_before = o.regs;
            struct plait_regcache_mem mem = {.kind = PLAIT_REG_HOST, .flags = (unsigned)cls};
            struct plait_regcache_ref ref;
            int failing = o.fail_all || o.fail_first;
            plait_result_t res = plait_regcache_get(rc, (void *)a, len, &mem, &ref);
            o.fail_all = 0;
            o.fail_first = 0;
            if (expect >= 0) {
                cr_assert_eq(res, PLAIT_SUCCESS, "step %d: %s", step, plait_last_error_get());
                cr_assert_eq(ref.handle, m.regs[expect].h, "step %d: a covering cached entry was not reused", step);
                cr_assert_eq(o.regs, regs_before, "step %d: a hit called reg", step);
                model_drain(&m, &o, -1, "hit", step);
                m.regs[expect].refs++;
                m.held[m.nheld] = ref;
                m.held_id[m.nheld++] = (int)expect;
            } else if (res != PLAIT_SUCCESS) {
                cr_assert(failing, "step %d: get failed with no failure injected: %s", step, plait_last_error_get());
                cr_assert_eq(res, PLAIT_ERR_SYSTEM);
                cr_assert(strstr(plait_last_error_get(), "regcache test-rc"), "%s", plait_last_error_get());
                cr_assert_eq(o.all ? (size_t)o.all->id + 1 : 0, m.nregs, "step %d: a failed get registered", step);
                model_drain(&m, &o, -1, "failed get", step);
            } else {
                cr_assert_gt(o.regs, regs_before, "step %d: a miss did not call reg", step);
                /* What the union would be, from the model's cached entries. */
                uintptr_t us = s, ue = e;
                for (size_t i = 0; i < m.nregs; i++) {
                    const struct mreg *g = &m.regs[i];
                    if (g->alive && g->cached && g->cls == cls && g->s < e && s < g->e) {
                        us = g->s < us ? g->s : us;
                        ue = g->e > ue ? g->e : ue;
                    }
                }
                model_sync_new(&m, &o);
                long n = ((struct fake_reg *)ref.handle)->id;
                cr_assert_eq((size_t)n + 1, m.nregs, "step %d: the get did not return its new registration", step);
                struct mreg *g = &m.regs[n];
                cr_assert_eq(g->cls, cls);
                /* Evictions before the reg may have shrunk the union; it is never larger. */
                cr_assert(g->s >= us && g->e <= ue && g->s <= s && g->e >= e,
                          "step %d: registered [0x%" PRIxPTR ", 0x%" PRIxPTR ") for [0x%" PRIxPTR ", 0x%" PRIxPTR
                          ") with union [0x%" PRIxPTR ", 0x%" PRIxPTR ")",
                          step, g->s, g->e, s, e, us, ue);
                if (!failing && !m.max_entries && !m.max_bytes)
                    cr_assert(g->s == us && g->e == ue, "step %d: without limits or failures, the union", step);
                model_drain(&m, &o, n, "miss", step);
                for (size_t i = 0; i < m.nregs; i++) {
                    struct mreg *q = &m.regs[i];
                    if (i != (size_t)n && q->alive && q->cached && q->cls == cls && q->s < g->e && g->s < q->e) {
                        cr_assert_gt(q->refs, 0, "step %d: an unreferenced replaced entry is still registered", step);
                        q->cached = 0; /* detached */
                    }
                }
                g->cached = 1;
                g->refs = 1;
                m.held[m.nheld] = ref;
                m.held_id[m.nheld++] = (int)n;
            }
        } else if (r < 88 && m.nheld > 0) {
            /* put */
            size_t k = rng_next(&x) % m.nheld;
            struct mreg *g = &m.regs[m.held_id[k]];
            cr_assert_eq(plait_regcache_put(rc, m.held[k].entry), PLAIT_SUCCESS, "step %d: %s", step,
                         plait_last_error_get());
            g->refs--;
            if (g->refs == 0)
                g->used = m.clock;
            m.held[k] = m.held[m.nheld - 1];
            m.held_id[k] = m.held_id[m.nheld - 1];
            m.nheld--;
            if (g->refs == 0 && !g->cached) {
                /* A detached registration goes at its last release. */
                cr_assert(o.nlog >= 1 && o.log[0] == g->h, "step %d: a detached entry survived its last put", step);
                g->alive = 0;
                memmove(&o.log[0], &o.log[1], (o.nlog - 1) * sizeof(o.log[0]));
                o.nlog--;
            }
            model_drain(&m, &o, -1, "put", step);
        } else {
            /* invalidate */
            uintptr_t a = BASE + (rng_next(&x) % (window * PG));
            size_t len = rng_next(&x) % (8 * PG);
            size_t expect = 0;
            for (size_t i = 0; i < m.nregs; i++) {
                struct mreg *g = &m.regs[i];
                if (g->alive && g->cached && g->s < a + len && a < g->e && len > 0) {
                    expect++;
                    g->cached = 0;
                    g->used = 0;
                }
            }
            size_t dropped = 0;
            cr_assert_eq(plait_regcache_invalidate(rc, (void *)a, len, &dropped), PLAIT_SUCCESS);
            cr_assert_eq(dropped, expect, "step %d: invalidate dropped %zu, expected %zu", step, dropped, expect);
            /* Every dereg here is of an unreferenced invalidated entry. */
            for (size_t k = 0; k < o.nlog; k++) {
                struct mreg *g = &m.regs[o.log[k]->id];
                cr_assert(g->alive && !g->cached && g->refs == 0, "step %d: invalidate deregistered reg %d", step,
                          o.log[k]->id);
                g->alive = 0;
            }
            o.nlog = 0;
            for (size_t i = 0; i < m.nregs; i++) {
                const struct mreg *g = &m.regs[i];
                cr_assert(!(g->alive && !g->cached && g->refs == 0), "step %d: invalidated reg %zu kept", step, i);
            }
        }
        model_check_state(&m, &o, rc, (uint64_t)step);
    }
    struct plait_regcache_stats st = stats_of(rc);
    cr_log_info("seed %" PRIu64 ": %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " merges, %" PRIu64
                " evictions, %" PRIu64 " invalidated, %" PRIu64 " reg failures",
                seed, st.hits, st.misses, st.merges, st.evictions, st.invalidated, st.reg_failures);
    /* The run must have exercised every path. */
    cr_assert_gt(st.hits, 100);
    cr_assert_gt(st.merges, 10);
    cr_assert_gt(st.invalidated, 10);
    cr_assert_gt(st.reg_failures, 10);
    if (max_entries || max_bytes)
        cr_assert_gt(st.evictions, 10);
    for (size_t k = 0; k < m.nheld; k++)
        put_ok(rc, m.held[k]);
    plait_regcache_destroy(rc);
    cr_assert_eq(o.live, 0);
    cr_assert_eq(o.live_bytes, 0);
    free(m.regs);
    fake_free(&o);
}

Test(regcache, random_vs_model_entry_limit)
{
    run_model(1, 10000, 12, 0);
    run_model(2, 10000, 12, 0);
}

Test(regcache, random_vs_model_byte_limit)
{
    run_model(3, 10000, 0, 40 * PG);
    run_model(4, 10000, 0, 40 * PG);
}

Test(regcache, random_vs_model_unlimited)
{
    run_model(5, 10000, 0, 0);
}
