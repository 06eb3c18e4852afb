/* The CUDA backend's plan cache: one immutable launch plan per launch shape
 * (the key: every op's collective, root, count, channels, chunking, scratch
 * and tasks: classes, lanes, generators or first steps; not its buffers),
 * built on the host, uploaded once and kept with its scratch for the
 * communicator's life (captured graphs keep pointing at them), in arenas of
 * device memory that are never freed before the communicator. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/dev_comm.h"
#include "core/cuda/cuda.h"
#include "base/log.h"
#include "base/util.h"

/* ------------------------------------------------------------ arenas */

plait_result_t plait_cuda_arena_alloc(struct plait_cuda_comm *cc, struct arena *a, size_t bytes, plait_cudevptr *dev,
                                      char **host)
{
    bytes = plait_align_up(bytes ? bytes : 1, 256);
    struct arena_chunk *c = a->chunks;
    if (!c || c->size - c->used < bytes) {
        const size_t size = bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK;
        c = calloc(1, sizeof(*c));
        if (!c)
            return plait_error(PLAIT_ERR_SYSTEM, "CUDA plan memory: out of host memory");
        /* Relaxed: a shape first launched while its stream (or another
         * thread's) is captured may still allocate, as NCCL's do. */
        const int mode = plait_cu_capture_relax(cc->cu);
        int r = cc->cu->MemAlloc(&c->dev, size);
        if (r) {
            plait_cu_capture_restore(cc->cu, mode);
            free(c);
            return cu_fail(r, "device plan/scratch memory", "cuMemAlloc");
        }
        if (a->with_host) {
            void *h = NULL;
            if ((r = cc->cu->MemHostAlloc(&h, size, PLAIT_CU_MEMHOSTALLOC_PORTABLE))) {
                cc->cu->MemFree(c->dev);
                plait_cu_capture_restore(cc->cu, mode);
                free(c);
                return cu_fail(r, "pinned staging for a launch plan", "cuMemHostAlloc");
            }
            c->host = h;
        }
        plait_cu_capture_restore(cc->cu, mode);
        c->size = size;
        c->next = a->chunks;
        a->chunks = c;
    }
    *dev = c->dev + c->used;
    if (host)
        *host = c->host ? c->host + c->used : NULL;
    c->used += bytes;
    return PLAIT_SUCCESS;
}

void plait_cuda_arena_free(const struct plait_cu *cu, struct arena *a)
{
    while (a->chunks) {
        struct arena_chunk *c = a->chunks;
        a->chunks = c->next;
        cu->MemFree(c->dev);
        if (c->host)
            cu->MemFreeHost(c->host);
        free(c);
    }
}

void plait_cuda_arena_forget(struct arena *a)
{
    for (struct arena_chunk *c = a->chunks, *nx; c; c = nx) {
        nx = c->next;
        free(c);
    }
    a->chunks = NULL;
}

/* ------------------------------------------------------------ plans */

/* FNV-1a over the key's words. */
static uint64_t key_hash(const uint64_t *k, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= k[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int key_reserve(struct plait_cuda_comm *cc, size_t words)
{
    if (words <= cc->key_cap)
        return 0;
    size_t cap = cc->key_cap ? cc->key_cap : 256;
    while (cap < words)
        cap *= 2;
    uint64_t *k = realloc(cc->key, cap * sizeof(*k));
    if (!k)
        return -1;
    cc->key = k;
    cc->key_cap = cap;
    return 0;
}

/* Everything that determines a launch's steps, lanes and scratch, as words:
 * per op its schedule arguments and scratch size, per task its class, lane
 * and generator (or its one step). Buffers, types and ops are not in it:
 * they go in the kernel parameters of every launch. */
static size_t key_build(struct plait_cuda_comm *cc, struct plait_op *const *ops, int nops)
{
    size_t words = 1;
    for (int i = 0; i < nops; i++)
        words += 11 + (size_t)ops[i]->ntasks * (3 + sizeof(struct plait_step) / 8 + 1);
    if (key_reserve(cc, words))
        return 0;
    uint64_t *k = cc->key;
    size_t w = 0;
    k[w++] = (uint64_t)nops;
    for (int i = 0; i < nops; i++) {
        const struct plait_op *op = ops[i];
        const struct plait_sched_args *a = &op->args;
        k[w++] = (uint64_t)op->coll;
        k[w++] = (uint64_t)(uint32_t)a->root;
        k[w++] = a->count;
        k[w++] = (uint64_t)a->nchannels;
        k[w++] = a->chunk_elems;
        k[w++] = a->align_elems;
        k[w++] = (uint64_t)a->radix;
        k[w++] = (uint64_t)op->scratch_bytes;
        k[w++] = (uint64_t)op->esize;
        k[w++] = (uint64_t)op->ntasks;
        k[w++] = 0x6f70656e64ull; /* op separator */
        for (int t = 0; t < op->ntasks; t++) {
            const struct plait_task *tk = &op->tasks[t];
            k[w++] = (uint64_t)tk->cls;
            k[w++] = (uint64_t)tk->lane;
            k[w++] = (uint64_t)(uintptr_t)tk->gen;
            uint64_t st[sizeof(struct plait_step) / 8 + 1];
            memset(st, 0, sizeof(st));
            if (!tk->gen)
                memcpy(st, &tk->step, sizeof(tk->step));
            for (size_t j = 0; j < sizeof(st) / 8; j++)
                k[w++] = st[j];
        }
    }
    return w;
}

struct lane_task {
    int lane;
    int order; /* issue order: op, then task */
    int op;
    int task;
};

static int lane_task_cmp(const void *a, const void *b)
{
    const struct lane_task *x = a, *y = b;
    if (x->lane != y->lane)
        return x->lane < y->lane ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Builds the plan of a new shape: the steps each task's generator yields
 * (computed once here, so the kernel never runs a generator), grouped by
 * lane; writes it into pinned staging and reserves its device copy and
 * scratch. */
static plait_result_t plan_build(struct plait_comm *comm, struct plait_cuda_comm *cc, struct plait_op *const *ops,
                                 int nops, struct plan *pl)
{
    plait_result_t status = PLAIT_SUCCESS;
    int ntasks = 0;
    for (int i = 0; i < nops; i++)
        ntasks += ops[i]->ntasks;
    struct lane_task *lt = malloc(sizeof(*lt) * (size_t)(ntasks ? ntasks : 1));
    struct plait_dev_task *dt = malloc(sizeof(*dt) * (size_t)(ntasks ? ntasks : 1));
    uint32_t *lanes = malloc(sizeof(*lanes) * (size_t)(ntasks + 1));
    size_t nsteps = 0, steps_cap = 1024;
    struct plait_step *steps = malloc(sizeof(*steps) * steps_cap);
    if (!lt || !dt || !lanes || !steps) {
        status = plait_error(PLAIT_ERR_SYSTEM, "CUDA launch plan on rank %d: out of memory", comm->rank);
        goto out;
    }
    int o = 0;
    for (int i = 0; i < nops; i++)
        for (int t = 0; t < ops[i]->ntasks; t++, o++) {
            lt[o].lane = ops[i]->tasks[t].lane;
            lt[o].order = o;
            lt[o].op = i;
            lt[o].task = t;
        }
    qsort(lt, (size_t)ntasks, sizeof(*lt), lane_task_cmp);
    uint32_t nlanes = 0;
    for (int i = 0; i < ntasks; i++) {
        if (i == 0 || lt[i].lane != lt[i - 1].lane)
            lanes[nlanes++] = (uint32_t)i;
        struct plait_op *op = ops[lt[i].op];
        struct plait_task *tk = &op->tasks[lt[i].task];
        dt[i].op = (uint32_t)lt[i].op;
        dt[i].cls = (uint32_t)tk->cls;
        dt[i].step_begin = nsteps;
        for (uint64_t idx = 0;; idx++) {
            struct plait_step st;
            if (tk->gen) {
                if (!tk->gen(&op->args, tk->cls, idx, &st))
                    break;
            } else {
                if (idx > 0)
                    break;
                st = tk->step;
            }
            if (nsteps == steps_cap) {
                struct plait_step *g = realloc(steps, sizeof(*steps) * steps_cap * 2);
                if (!g) {
                    status = plait_error(PLAIT_ERR_SYSTEM, "CUDA launch plan on rank %d: out of memory for %zu steps",
                                         comm->rank, nsteps);
                    goto out;
                }
                steps = g;
                steps_cap *= 2;
            }
            steps[nsteps++] = st;
        }
        dt[i].step_end = nsteps;
    }
    lanes[nlanes] = (uint32_t)ntasks;
    if (nlanes > PLAIT_KMAX_LANES) {
        status = plait_error(PLAIT_ERR_INVALID_USAGE,
                             "CUDA launch on rank %d: %u lanes (CTAs) exceed the kernel's %d: fewer operations per "
                             "group",
                             comm->rank, nlanes, PLAIT_KMAX_LANES);
        goto out;
    }
    struct plait_dev_plan hdr;
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = PLAIT_PLAN_MAGIC;
    hdr.nlanes = nlanes;
    hdr.ntasks = (uint32_t)ntasks;
    hdr.nops = (uint32_t)nops;
    hdr.lane_off = plait_align_up(sizeof(hdr), 16);
    hdr.task_off = plait_align_up(hdr.lane_off + sizeof(uint32_t) * (nlanes + 1), 16);
    hdr.step_off = plait_align_up(hdr.task_off + sizeof(*dt) * (size_t)ntasks, 16);
    hdr.bytes = hdr.step_off + sizeof(*steps) * nsteps;
    char *host = NULL;
    if ((status = plait_cuda_arena_alloc(cc, &cc->plan_arena, hdr.bytes, &pl->dev, &host)))
        goto out;
    memcpy(host, &hdr, sizeof(hdr));
    memcpy(host + hdr.lane_off, lanes, sizeof(uint32_t) * (nlanes + 1));
    memcpy(host + hdr.task_off, dt, sizeof(*dt) * (size_t)ntasks);
    memcpy(host + hdr.step_off, steps, sizeof(*steps) * nsteps);
    pl->staging = host;
    pl->bytes = hdr.bytes;
    pl->nlanes = nlanes;
    uint64_t scratch = 0;
    for (int i = 0; i < nops; i++) {
        pl->scratch_off[i] = scratch;
        scratch += plait_align_up(ops[i]->scratch_bytes, 256);
    }
    if (scratch && (status = plait_cuda_arena_alloc(cc, &cc->scratch_arena, scratch, &pl->scratch, NULL)))
        goto out;
out:
    free(lt);
    free(dt);
    free(lanes);
    free(steps);
    return status;
}

plait_result_t plait_cuda_plan_get(struct plait_comm *comm, struct plait_cuda_comm *cc, struct plait_op *const *ops,
                                   int nops, struct plan **out)
{
    const size_t words = key_build(cc, ops, nops);
    if (!words)
        return plait_error(PLAIT_ERR_SYSTEM, "CUDA launch on rank %d: out of memory", comm->rank);
    const uint64_t h = key_hash(cc->key, words);
    struct plan **bucket = &cc->plans[h % PLAN_BUCKETS];
    for (struct plan *p = *bucket; p; p = p->next)
        if (p->hash == h && p->key_len == words && memcmp(p->key, cc->key, words * 8) == 0) {
            *out = p;
            return PLAIT_SUCCESS;
        }
    struct plan *p = calloc(1, sizeof(*p));
    uint64_t *key = malloc(words * 8);
    if (!p || !key) {
        free(p);
        free(key);
        return plait_error(PLAIT_ERR_SYSTEM, "CUDA launch on rank %d: out of memory", comm->rank);
    }
    memcpy(key, cc->key, words * 8);
    p->hash = h;
    p->key = key;
    p->key_len = words;
    plait_result_t s = plan_build(comm, cc, ops, nops, p);
    if (s) {
        /* what the arenas reserved stays reserved (nothing there is freed
         * before the communicator) */
        free(key);
        free(p);
        return s;
    }
    p->next = *bucket;
    *bucket = p;
    *out = p;
    return PLAIT_SUCCESS;
}

void plait_cuda_plans_free(struct plait_cuda_comm *cc)
{
    for (int b = 0; b < PLAN_BUCKETS; b++)
        while (cc->plans[b]) {
            struct plan *p = cc->plans[b];
            cc->plans[b] = p->next;
            free(p->key);
            free(p);
        }
}
