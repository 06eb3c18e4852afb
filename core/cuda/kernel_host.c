/* The host emulation of the CUDA kernels: the body the GPU runs
 * (kernel_body.h) with host hooks, one thread per CTA. The CUDA test double
 * (tests/cuda_double.c) runs each CTA of a launch on its own thread, and
 * tests/test_stepper.c drives it directly; either way the CPU tests take the
 * GPU's decisions.
 *
 * The hooks: a CTA is one thread (tid 0 of 1, barriers are no-ops) -- or,
 * with PLAIT_KB_EMU_THREADS=T (2..64; a test setting), T threads that share
 * the CTA's state and meet at a barrier at every PLAIT_KB_SYNC, each copying
 * and reducing its slice, so that the body's division of work between the
 * leader and the others (shared state, barriers, per-thread LL polls) runs
 * as on the GPU --, copies
 * are memcpy, reductions are plait_reduce_apply (the CPU executor's, whose
 * rules the device reductions reproduce bit for bit), LL lines are written
 * and read as 8-byte atomics of {data, flag} (a line's two halves carry the
 * flag each, so a reader that sees both flags has both words), fences and
 * atomics are GCC's __atomic builtins at sequential consistency where the GPU
 * uses system scope, waits spin briefly and then yield. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/env.h"
#include "core/reduce.h"
#include "core/cuda/kernel.h"

/* A struct plait_red as the op carries it: the scalars are the values the
 * host computed (plait_red_init's), taken as they are, so the emulation
 * scales by exactly what the GPU scales by. */
static void red_of(const struct plait_dev_op *op, struct plait_red *r)
{
    r->dtype = op->dtype;
    r->op = op->redop;
    r->nranks = op->nranks;
    r->scalar_f = op->scalar_f;
    r->scalar_i = op->scalar_i;
}

/* This thread's place in its emulated CTA (tid 0 of 1 unless
 * PLAIT_KB_EMU_THREADS is set). */
static __thread unsigned kb_tid;
static __thread unsigned kb_nth = 1;
static __thread pthread_barrier_t *kb_bar;

static void kb_sync(void)
{
    if (kb_nth > 1)
        pthread_barrier_wait(kb_bar);
}

#define PLAIT_KB_FN static
#define PLAIT_KB_TID kb_tid
#define PLAIT_KB_NTHREADS kb_nth
#define PLAIT_KB_SYNC() kb_sync()

/* [lo, hi) of n items: this thread's contiguous share. */
static void kb_share(uint64_t n, uint64_t *lo, uint64_t *hi)
{
    *lo = n * kb_tid / kb_nth;
    *hi = n * (kb_tid + 1) / kb_nth;
}

static void plait_kb_copy(void *dst, const void *src, uint64_t bytes)
{
    uint64_t lo, hi;
    if (dst == src || !bytes)
        return;
    kb_share(bytes, &lo, &hi);
    if (hi > lo)
        memcpy((char *)dst + lo, (const char *)src + lo, (size_t)(hi - lo));
}

static void plait_kb_reduce(const struct plait_dev_op *op, void *dst, const void *a, const void *b, uint64_t n,
                            unsigned flags)
{
    struct plait_red r;
    uint64_t lo, hi;
    red_of(op, &r);
    kb_share(n, &lo, &hi);
    if (hi <= lo)
        return;
    const size_t es = op->esize, off = (size_t)lo * es;
    plait_reduce_apply(&r, (char *)dst + off, (const char *)a + off, b ? (const char *)b + off : NULL,
                       (size_t)(hi - lo), flags);
}

static uint64_t plait_kb_reduce8(const struct plait_dev_op *op, uint64_t a, uint64_t b, int has_b, uint32_t n,
                                 unsigned flags)
{
    struct plait_red r;
    uint64_t d = 0;
    red_of(op, &r);
    plait_reduce_apply(&r, &d, &a, has_b ? &b : NULL, n, flags);
    /* Bytes past the n elements are not part of the line's payload. */
    return d;
}

static uint64_t plait_kb_ld64(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void plait_kb_st64(char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* A line {data0, flag, data1, flag} as two 8-byte words, data in the low half. */
static void plait_kb_ll_store(char *line, uint64_t v, int whole, uint32_t flag)
{
    uint64_t *w = (uint64_t *)(void *)line;
    __atomic_store_n(&w[0], (v & 0xffffffffu) | (uint64_t)flag << 32, __ATOMIC_RELAXED);
    if (whole)
        __atomic_store_n(&w[1], (v >> 32) | (uint64_t)flag << 32, __ATOMIC_RELAXED);
}

static int plait_kb_ll_load(const char *line, int whole, uint32_t flag, uint64_t *v)
{
    const uint64_t *w = (const uint64_t *)(const void *)line;
    const uint64_t w0 = __atomic_load_n(&w[0], __ATOMIC_RELAXED);
    if ((uint32_t)(w0 >> 32) != flag)
        return 0;
    uint64_t r = w0 & 0xffffffffu;
    if (whole) {
        const uint64_t w1 = __atomic_load_n(&w[1], __ATOMIC_RELAXED);
        if ((uint32_t)(w1 >> 32) != flag)
            return 0;
        r |= w1 << 32;
    }
    *v = r;
    return 1;
}

static void plait_kb_fence(int scope)
{
    (void)scope;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static uint64_t plait_kb_cas64(uint64_t *p, uint64_t expect, uint64_t desired)
{
    __atomic_compare_exchange_n(p, &expect, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expect;
}

static uint32_t plait_kb_add32(uint32_t *p, uint32_t v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}

static uint32_t plait_kb_ld32_relaxed(const volatile uint32_t *p)
{
    return __atomic_load_n((const uint32_t *)p, __ATOMIC_RELAXED);
}

static uint64_t plait_kb_ld64_relaxed(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static uint64_t plait_kb_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A CTA's peers are other threads, possibly on this core: spin a little,
 * then let them run. */
static void plait_kb_pause(uint32_t spins)
{
    if (spins > 256)
        sched_yield();
}

#include "core/cuda/kernel_body.h"

struct kb_cta {
    const struct plait_kargs *args;
    unsigned cta, ncta, nth;
    struct plait_kb_shared *sh;
    pthread_barrier_t bar;
};

struct kb_thread {
    struct kb_cta *c;
    unsigned tid;
};

static void *kb_thread_main(void *arg)
{
    const struct kb_thread *t = arg;
    kb_tid = t->tid;
    kb_nth = t->c->nth;
    kb_bar = &t->c->bar;
    plait_kb_run(t->c->args, t->c->cta, t->c->ncta, t->c->sh);
    return NULL;
}

static unsigned kb_emu_threads(void)
{
    /* Checked at init (plait_settings_load); a kernel launch cannot fail on it. */
    double n = 1;
    return plait_env_number("PLAIT_KB_EMU_THREADS", &n, NULL) == PLAIT_SUCCESS ? (unsigned)n : 1u;
}

void plait_kernel_emulate(const void *params, unsigned cta, unsigned ncta)
{
    struct plait_kb_shared sh;
    memset(&sh, 0, sizeof sh);
    const unsigned nth = kb_emu_threads();
    if (nth > 1) {
        struct kb_cta c;
        memset(&c, 0, sizeof c);
        c.args = (const struct plait_kargs *)params;
        c.cta = cta;
        c.ncta = ncta;
        c.nth = nth;
        c.sh = &sh;
        struct kb_thread t[64];
        pthread_t th[64];
        unsigned started = 1;
        if (pthread_barrier_init(&c.bar, NULL, nth) == 0) {
            for (; started < nth; started++) {
                t[started].c = &c;
                t[started].tid = started;
                if (pthread_create(&th[started], NULL, kb_thread_main, &t[started]) != 0)
                    break;
            }
            if (started == nth) {
                t[0].c = &c;
                t[0].tid = 0;
                kb_thread_main(&t[0]);
                for (unsigned i = 1; i < nth; i++)
                    pthread_join(th[i], NULL);
                pthread_barrier_destroy(&c.bar);
                kb_tid = 0;
                kb_nth = 1;
                kb_bar = NULL;
                return;
            }
            abort(); /* a test setting: a half-started CTA cannot run */
        }
    }
    plait_kb_run((const struct plait_kargs *)params, cta, ncta, &sh);
}

/* The local reduction kernel: CTA cta of ncta takes its share of elements in
 * 4096-element blocks, as the GPU's grid-stride loop does (the result does not
 * depend on the split: the reduction is element-wise). */
void plait_reduce_local_emulate(const void *params, unsigned cta, unsigned ncta)
{
    const struct plait_kreduce_args *a = params;
    const size_t es = plait_dtype_size(a->dtype);
    struct plait_red r = {
        .dtype = a->dtype,
        .op = a->redop,
        .nranks = a->nranks,
        .scalar_f = a->scalar_f,
        .scalar_i = a->scalar_i,
    };
    const uint64_t block = 4096;
    if (es == 0 || ncta == 0)
        return;
    for (uint64_t lo = (uint64_t)cta * block; lo < a->n; lo += (uint64_t)ncta * block) {
        const uint64_t n = a->n - lo < block ? a->n - lo : block;
        const size_t off = (size_t)lo * es;
        plait_reduce_apply(&r, (char *)a->dst + off, (const char *)a->a + off, a->b ? (const char *)a->b + off : NULL,
                           (size_t)n, a->flags);
    }
}
