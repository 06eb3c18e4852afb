/* The shared step header (algorithms/stepper.h) and the CUDA kernel's body
 * (core/cuda/kernel_body.h) through its host emulation (core/cuda/kernel_host.c).
 *
 * The first part checks stepper.h's arithmetic: FIFO credit and slots (across
 * the 2^32 boundary), how steps are cut into pieces, what each step kind's
 * piece does, LL flags and payloads.
 *
 * The second part runs the code the GPU runs: launches built here by hand
 * the way core/cuda/plan_cache.c builds them (a plan of tasks and steps from
 * algorithms/, the kernel parameters, device connections wired rank to rank
 * in heap memory), every CTA of every "rank" on its own thread through
 * plait_kernel_emulate. Results are compared element for element with a
 * whole-step simulation of the same schedules that combines with
 * plait_reduce_apply in schedule order; errors (size mismatch, abort,
 * timeout, missing connection) must come back in the status words. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algorithms/algorithms.h"
#include "core/reduce.h"
#include "algorithms/stepper.h"
#include "core/cuda/kernel.h"

/* ---------------------------------------------------------------- stepper.h */

Test(stepper, fifo_credit_and_slots)
{
    cr_assert(plait_fifo_can_send(0, 0, 4));
    cr_assert(plait_fifo_can_send(3, 0, 4));
    cr_assert_not(plait_fifo_can_send(4, 0, 4));
    cr_assert(plait_fifo_can_send(5, 2, 4));
    cr_assert_not(plait_fifo_can_recv(0, 0));
    cr_assert(plait_fifo_can_recv(1, 0));
    cr_assert_not(plait_fifo_can_recv(7, 7));
    for (uint64_t s = 0; s < 20; s++)
        cr_assert_eq(plait_fifo_slot(s, 3), s % 3);
}

Test(stepper, fifo_counters_wrap_past_2_32)
{
    /* The counters are 64-bit: nothing happens at 2^32 except that a 32-bit
     * truncation would go wrong, which these values would show. */
    const uint64_t w = (uint64_t)1 << 32;
    cr_assert(plait_fifo_can_send(w + 1, w - 2, 4));
    cr_assert_not(plait_fifo_can_send(w + 2, w - 2, 4));
    cr_assert(plait_fifo_can_send(w, w, 1));
    cr_assert_not(plait_fifo_can_send(w + 1, w, 1));
    cr_assert(plait_fifo_can_recv(w, w - 1));
    cr_assert_not(plait_fifo_can_recv(w, w));
    cr_assert(plait_fifo_can_recv(w + 5, w + 4));
    cr_assert_eq(plait_fifo_slot(w, 3), 1); /* 2^32 = 3 * 1431655765 + 1 */
    cr_assert_eq(plait_fifo_slot(w - 1, 3), 0);
    cr_assert_eq(plait_fifo_slot(w + 7, 8), 7);
    cr_assert_eq(plait_fifo_slot(UINT64_MAX, 8), 7);
}

Test(stepper, piece_cutting)
{
    cr_assert_eq(plait_step_pieces(0, 8), 0);
    cr_assert_eq(plait_step_pieces(1, 8), 1);
    cr_assert_eq(plait_step_pieces(7, 8), 1);
    cr_assert_eq(plait_step_pieces(8, 8), 1);
    cr_assert_eq(plait_step_pieces(9, 8), 2);
    cr_assert_eq(plait_step_pieces(24, 8), 3);
    cr_assert_eq(plait_step_pieces(25, 1), 25);
    const uint64_t counts[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 1001};
    const uint64_t maxes[] = {1, 2, 3, 8, 16, 64};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        for (size_t j = 0; j < sizeof maxes / sizeof *maxes; j++) {
            const uint64_t count = counts[i], m = maxes[j];
            uint64_t done = 0, pieces = 0;
            while (done < count) {
                const uint64_t n = plait_piece_elems(count, done, m);
                cr_assert(n >= 1 && n <= m, "count %lu max %lu: piece of %lu", (unsigned long)count,
                          (unsigned long)m, (unsigned long)n);
                /* Only the last piece is short. */
                if (done + n < count)
                    cr_assert_eq(n, m);
                done += n;
                pieces++;
            }
            cr_assert_eq(done, count);
            cr_assert_eq(pieces, plait_step_pieces(count, m));
        }
    }
    /* Slots to pieces: Simple carries the slot, LL half of it in 16-byte lines. */
    cr_assert_eq(plait_piece_max(4096, 4, PLAIT_WIRE_SIMPLE), 1024);
    cr_assert_eq(plait_piece_max(4096, 4, PLAIT_WIRE_LL), 512);
    cr_assert_eq(plait_piece_max(4096, 8, PLAIT_WIRE_LL), 256);
    cr_assert_eq(plait_piece_max(250, 1, PLAIT_WIRE_LL), 112);
    cr_assert_eq(plait_piece_max(250, 2, PLAIT_WIRE_SIMPLE), 125);
    struct plait_step st = {.kind = PLAIT_STEP_SEND, .src_off = 100, .dst_off = 7, .count = 50};
    cr_assert_eq(plait_piece_src(&st, 16), 116);
    cr_assert_eq(plait_piece_dst(&st, 16), 23);
}

Test(stepper, piece_ops_for_every_kind)
{
    const unsigned R = PLAIT_PIECE_RECV, S = PLAIT_PIECE_SEND, X = PLAIT_PIECE_REDUCE, D = PLAIT_PIECE_TO_DST,
                   F = PLAIT_PIECE_FROM_SRC;
    const unsigned want[PLAIT_STEP_KINDS] = {
        [PLAIT_STEP_SEND] = S | F,
        [PLAIT_STEP_RECV] = R | D,
        [PLAIT_STEP_RECV_REDUCE_SEND] = R | S | X | F,
        [PLAIT_STEP_RECV_REDUCE_COPY] = R | X | D | F,
        [PLAIT_STEP_RECV_REDUCE_COPY_SEND] = R | S | X | D | F,
        [PLAIT_STEP_RECV_COPY_SEND] = R | S | D,
        [PLAIT_STEP_COPY] = D | F,
        [PLAIT_STEP_SENDRECV] = 0,
        [PLAIT_STEP_REDUCE] = X | D | F,
        [PLAIT_STEP_SENDRECV_REDUCE] = 0,
    };
    for (int k = 0; k < PLAIT_STEP_KINDS; k++) {
        const unsigned ops = plait_piece_ops(k);
        cr_assert_eq(ops, want[k], "kind %d: ops %#x, want %#x", k, ops, want[k]);
        cr_assert_eq(plait_sendrecv_reduces(k), k == PLAIT_STEP_SENDRECV_REDUCE);
        if (plait_step_is_sendrecv(k))
            continue;
        /* The piece table agrees with the schedule header's view of a kind. */
        cr_assert_eq(!!(ops & R), plait_step_recvs(k), "kind %d", k);
        cr_assert_eq(!!(ops & S), plait_step_sends(k), "kind %d", k);
        cr_assert_eq(!!(ops & F), plait_step_reads_src(k), "kind %d", k);
        cr_assert_eq(!!(ops & D), plait_step_writes_dst(k), "kind %d", k);
    }
    cr_assert_eq(plait_piece_ops(PLAIT_STEP_KINDS), 0);
}

Test(stepper, local_step_writes)
{
    struct plait_step st = {.kind = PLAIT_STEP_COPY, .count = 10};
    cr_assert(plait_local_step_writes(&st, 0));
    cr_assert_not(plait_local_step_writes(&st, 1));
    st.flags = PLAIT_STEP_PRE;
    cr_assert(plait_local_step_writes(&st, 1));
    st.kind = PLAIT_STEP_REDUCE;
    st.flags = 0;
    cr_assert(plait_local_step_writes(&st, 1));
    st.count = 0;
    cr_assert_not(plait_local_step_writes(&st, 0));
}

Test(stepper, ll_flags_and_payload)
{
    const uint64_t w = (uint64_t)1 << 32;
    const uint64_t seqs[] = {0, 1, 2, 0x7ffffffe, 0x7fffffff, 0x80000000u, w - 2, w - 1, w, w + 1, 3 * w - 1,
                             UINT64_MAX - 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof seqs / sizeof *seqs; i++) {
        const uint64_t s = seqs[i];
        cr_assert_neq(plait_ll_flag(s), 0, "seq %#lx", (unsigned long)s);
        cr_assert_neq(plait_ll_flag(s), plait_ll_flag(s + 1), "seq %#lx", (unsigned long)s);
        cr_assert(plait_ll_flag(s) & 0x80000000u);
    }
    for (uint64_t s = 0; s < 100000; s++) {
        cr_assert_neq(plait_ll_flag(s), 0);
        cr_assert_neq(plait_ll_flag(s), plait_ll_flag(s + 1));
    }
    cr_assert_eq(plait_ll_payload(4096), 2048);
    cr_assert_eq(plait_ll_payload(256), 128);
    cr_assert_eq(plait_ll_payload(250), 112);
    cr_assert_eq(plait_ll_payload(31), 0);
    cr_assert_eq(plait_ll_payload(32), 16);
    /* A payload's lines fit in the slot. */
    for (uint64_t b = 0; b < 5000; b += 7)
        cr_assert_leq((plait_ll_payload(b) + 7) / 8 * 16, b);
}

/* ---------------------------------------------------------------- launches */

#define MAX_RANKS 4
#define MAX_CH 2
#define TIMEOUT_NS 20000000000ull /* a broken body fails the test in 20 s, not hangs it */

/* One direction of a connection: the receiver's memory and the two counters. */
struct dir {
    char *slots;
    char *ll;
    uint32_t *sizes;
    uint64_t *tail; /* 64-byte apart: written by different ranks */
    uint64_t *head;
};

struct rank_state {
    char *buf[3];
    void *plan;
    struct plait_dev_conn conn[MAX_RANKS * MAX_CH]; /* [peer * ncls + cls] */
    struct plait_dev_conn *conns[MAX_RANKS * MAX_CH];
    struct plait_kargs kargs;
    uint64_t status[4];
    uint32_t lanes_done;
    volatile uint32_t abort_flag;
    uint64_t nsteps[MAX_CH];
};

struct launch {
    int nranks, nch, wire;
    int dtype, redop;
    uint64_t count, chunk;
    uint32_t nslots, slot_bytes;
    size_t es;
    struct plait_red red;
    plait_step_fn step;
    plait_scratch_fn scratch;
    uint64_t scratch_elems;
    struct dir dirs[MAX_RANKS][MAX_RANKS][MAX_CH]; /* [from][to][cls] */
    struct rank_state rs[MAX_RANKS];
    char *input[MAX_RANKS];                        /* each rank's original input */
};

static void sched_args(const struct launch *L, int rank, struct plait_sched_args *a)
{
    memset(a, 0, sizeof *a);
    a->coll = PLAIT_COLL_ALLREDUCE;
    a->nranks = L->nranks;
    a->rank = rank;
    a->count = L->count;
    a->nchannels = L->nch;
    a->chunk_elems = L->chunk;
    a->align_elems = 16 / L->es;
    a->nhosts = 1;
}

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    cr_assert_not_null(p);
    memset(p, 0, (bytes + 63) / 64 * 64);
    return p;
}

/* Deterministic values of each type that keep sums and products finite
 * (small integers and simple fractions), with a few signed zeros. */
static void fill(const struct launch *L, char *p, uint64_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        const int v = (int)((x >> 16) % 9) - 4; /* -4..4 */
        const float f = (float)v * 0.5f + ((x >> 8) & 1 ? 0.25f : 0.0f);
        char *e = p + i * L->es;
        switch (L->dtype) {
        case PLAIT_FLOAT16: {
            uint16_t h = plait_float_to_half(f);
            memcpy(e, &h, 2);
            break;
        }
        case PLAIT_BFLOAT16: {
            uint16_t h = plait_float_to_bf16(f);
            memcpy(e, &h, 2);
            break;
        }
        case PLAIT_FLOAT8_E4M3:
            *(uint8_t *)e = plait_float_to_e4m3(f);
            break;
        case PLAIT_FLOAT8_E5M2:
            *(uint8_t *)e = plait_float_to_e5m2(f);
            break;
        case PLAIT_FLOAT32:
            memcpy(e, &f, 4);
            break;
        case PLAIT_FLOAT64: {
            double d = f;
            memcpy(e, &d, 8);
            break;
        }
        default: {
            const uint64_t u = (uint64_t)(int64_t)(v * 37 + (int)(x >> 24));
            memcpy(e, &u, L->es);
            break;
        }
        }
    }
}

static void wire_dir(struct launch *L, struct dir *d)
{
    d->slots = xalloc((size_t)L->nslots * L->slot_bytes);
    d->ll = xalloc((size_t)L->nslots * L->slot_bytes);
    d->sizes = xalloc(L->nslots * sizeof(uint32_t));
    d->tail = xalloc(64);
    d->head = xalloc(64);
}

/* The plan of one rank: one lane per channel, one task each, the channel's
 * steps from the generator; laid out as plan_cache.c lays it out. */
static void *build_plan(struct launch *L, int rank, uint32_t nops)
{
    struct plait_sched_args a;
    sched_args(L, rank, &a);
    uint64_t total = 0;
    for (int ch = 0; ch < L->nch; ch++) {
        struct plait_step st;
        uint64_t n = 0;
        while (L->step(&a, ch, n, &st))
            n++;
        L->rs[rank].nsteps[ch] = n;
        total += n;
    }
    const uint64_t lane_off = sizeof(struct plait_dev_plan);
    const uint64_t task_off = (lane_off + (L->nch + 1) * sizeof(uint32_t) + 15) / 16 * 16;
    const uint64_t step_off = task_off + L->nch * sizeof(struct plait_dev_task);
    const uint64_t bytes = step_off + total * sizeof(struct plait_step);
    char *base = xalloc(bytes);
    struct plait_dev_plan *plan = (struct plait_dev_plan *)base;
    plan->magic = PLAIT_PLAN_MAGIC;
    plan->nlanes = (uint32_t)L->nch;
    plan->ntasks = (uint32_t)L->nch;
    plan->nops = nops;
    plan->lane_off = lane_off;
    plan->task_off = task_off;
    plan->step_off = step_off;
    plan->bytes = bytes;
    uint32_t *lanes = (uint32_t *)(base + lane_off);
    struct plait_dev_task *tasks = (struct plait_dev_task *)(base + task_off);
    struct plait_step *steps = (struct plait_step *)(base + step_off);
    uint64_t at = 0;
    for (int ch = 0; ch < L->nch; ch++) {
        lanes[ch] = (uint32_t)ch;
        tasks[ch].op = 0;
        tasks[ch].cls = (uint32_t)ch;
        tasks[ch].step_begin = at;
        for (uint64_t i = 0; i < L->rs[rank].nsteps[ch]; i++)
            cr_assert(L->step(&a, ch, i, &steps[at++]));
        tasks[ch].step_end = at;
    }
    lanes[L->nch] = (uint32_t)L->nch;
    return base;
}

static void setup_kargs(struct launch *L, int r)
{
    struct rank_state *s = &L->rs[r];
    struct plait_kargs *k = &s->kargs;
    memset(k, 0, sizeof *k);
    k->plan = s->plan;
    k->conns = s->conns;
    k->ncls = L->nch;
    k->nranks = L->nranks;
    k->rank = r;
    k->nops = 1;
    k->abort_flag = &s->abort_flag;
    k->status = s->status;
    k->timeout_ns = TIMEOUT_NS;
    k->lanes_done = &s->lanes_done;
    struct plait_dev_op *op = &k->ops[0];
    for (int b = 0; b < 3; b++)
        op->buf[b] = s->buf[b];
    op->esize = (uint32_t)L->es;
    op->dtype = L->red.dtype;
    op->redop = L->red.op;
    op->proto = L->wire;
    op->nranks = L->red.nranks;
    op->scalar_f = L->red.scalar_f;
    op->scalar_i = L->red.scalar_i;
    op->piece_max = plait_piece_max(L->slot_bytes, L->es, L->wire);
}

/* Everything for an allreduce of `count` elements with generator `step`. */
static void launch_init(struct launch *L, int nranks, int nch, int wire, int dtype, int redop, uint64_t count,
                        plait_step_fn step, plait_scratch_fn scratch)
{
    memset(L, 0, sizeof *L);
    L->nranks = nranks;
    L->nch = nch;
    L->wire = wire;
    L->dtype = dtype;
    L->redop = redop;
    L->count = count;
    L->es = plait_dtype_size(dtype);
    L->nslots = 8;
    L->slot_bytes = 256;
    /* A step must leave the FIFO a free slot: a forwarding step takes its
     * credit while the previous step's pieces still fill the peer's slots
     * (LL: 4 pieces of 128 bytes per chunk, Simple: 2). */
    L->chunk = 512 / L->es;
    L->step = step;
    L->scratch = scratch;
    /* premulsum's scalar: 3 (or 1.5 for floats); avg's 1/n rounded to the type. */
    char scalar[8] = {0};
    if (dtype == PLAIT_FLOAT32) {
        const float f = 1.5f;
        memcpy(scalar, &f, 4);
    } else if (dtype == PLAIT_FLOAT64) {
        const double d = 1.5;
        memcpy(scalar, &d, 8);
    } else if (dtype == PLAIT_FLOAT16) {
        const uint16_t h = plait_float_to_half(1.5f);
        memcpy(scalar, &h, 2);
    } else if (dtype == PLAIT_BFLOAT16) {
        const uint16_t h = plait_float_to_bf16(1.5f);
        memcpy(scalar, &h, 2);
    } else if (dtype == PLAIT_FLOAT8_E4M3) {
        scalar[0] = (char)plait_float_to_e4m3(1.5f);
    } else if (dtype == PLAIT_FLOAT8_E5M2) {
        scalar[0] = (char)plait_float_to_e5m2(1.5f);
    } else {
        scalar[0] = 3;
    }
    cr_assert_eq(plait_red_init(&L->red, dtype, redop, scalar, (uint64_t)nranks), PLAIT_SUCCESS);
    for (int f = 0; f < nranks; f++)
        for (int t = 0; t < nranks; t++)
            if (f != t)
                for (int c = 0; c < nch; c++)
                    wire_dir(L, &L->dirs[f][t][c]);
    for (int r = 0; r < nranks; r++) {
        struct rank_state *s = &L->rs[r];
        struct plait_sched_args a;
        sched_args(L, r, &a);
        const uint64_t scr = scratch ? scratch(&a) : 0;
        s->buf[0] = xalloc(count * L->es + 16);
        s->buf[1] = xalloc(count * L->es + 16);
        s->buf[2] = xalloc((scr ? scr : 1) * L->es + 16);
        L->input[r] = xalloc(count * L->es + 16);
        fill(L, s->buf[0], count, (unsigned)r + 1);
        memcpy(L->input[r], s->buf[0], count * L->es);
        s->plan = build_plan(L, r, 1);
        for (int p = 0; p < nranks; p++) {
            for (int c = 0; c < nch; c++) {
                const int at = p * nch + c;
                s->conns[at] = NULL;
                if (p == r)
                    continue;
                struct plait_dev_conn *cn = &s->conn[at];
                const struct dir *tx = &L->dirs[r][p][c], *rx = &L->dirs[p][r][c];
                cn->tx.slots = tx->slots;
                cn->tx.ll = tx->ll;
                cn->tx.sizes = tx->sizes;
                cn->tx.tail = tx->tail;
                cn->tx.head = tx->head;
                cn->rx.slots = rx->slots;
                cn->rx.ll = rx->ll;
                cn->rx.sizes = rx->sizes;
                cn->rx.tail = rx->tail;
                cn->rx.head = rx->head;
                cn->nslots = L->nslots;
                cn->slot_bytes = L->slot_bytes;
                cn->peer = p;
                cn->scope = c % 2 ? PLAIT_SCOPE_SYS : PLAIT_SCOPE_GPU;
                s->conns[at] = cn;
            }
        }
        setup_kargs(L, r);
    }
}

static void launch_free(struct launch *L)
{
    for (int f = 0; f < L->nranks; f++)
        for (int t = 0; t < L->nranks; t++)
            if (f != t)
                for (int c = 0; c < L->nch; c++) {
                    struct dir *d = &L->dirs[f][t][c];
                    free(d->slots);
                    free(d->ll);
                    free(d->sizes);
                    free(d->tail);
                    free(d->head);
                }
    for (int r = 0; r < L->nranks; r++) {
        for (int b = 0; b < 3; b++)
            free(L->rs[r].buf[b]);
        free(L->rs[r].plan);
        free(L->input[r]);
    }
}

struct cta_run {
    const struct plait_kargs *k;
    unsigned cta, ncta;
    pthread_t th;
};

static void *cta_main(void *p)
{
    struct cta_run *c = p;
    plait_kernel_emulate(c->k, c->cta, c->ncta);
    return NULL;
}

/* One launch on every rank: each CTA on its own thread, as the CUDA double
 * runs them. Returns when all have finished (the body's own timeout bounds
 * every wait). */
static void run_all(struct launch *L)
{
    struct cta_run runs[MAX_RANKS * MAX_CH];
    int n = 0;
    for (int r = 0; r < L->nranks; r++)
        for (int c = 0; c < L->nch; c++) {
            runs[n] = (struct cta_run){.k = &L->rs[r].kargs, .cta = (unsigned)c, .ncta = (unsigned)L->nch};
            cr_assert_eq(pthread_create(&runs[n].th, NULL, cta_main, &runs[n]), 0);
            n++;
        }
    for (int i = 0; i < n; i++)
        pthread_join(runs[i].th, NULL);
}

/* ---------------------------------------------------------------- reference
 * The same schedules, whole steps at a time, with unbounded queues between
 * ranks: sends never block, so taking the ranks round-robin runs every step
 * in order. Each combination is plait_reduce_apply in schedule order. */

#define MAX_MSGS 256
struct msg {
    char *data;
    uint64_t count;
};
struct queue {
    struct msg m[MAX_MSGS];
    int head, tail;
};

struct sim {
    struct launch *L;
    char *buf[MAX_RANKS][3];
    struct queue q[MAX_RANKS][MAX_RANKS][MAX_CH];
};

static char *sim_ptr(struct sim *S, int r, int b, uint64_t off)
{
    return S->buf[r][b] + off * S->L->es;
}

static void sim_push(struct sim *S, int from, int to, int ch, const char *p, uint64_t count)
{
    struct queue *q = &S->q[from][to][ch];
    cr_assert_lt(q->tail, MAX_MSGS);
    q->m[q->tail].data = xalloc(count * S->L->es + 1);
    memcpy(q->m[q->tail].data, p, count * S->L->es);
    q->m[q->tail].count = count;
    q->tail++;
}

/* Runs step st of rank r if its message is there: 1 done, 0 wait. */
static int sim_step(struct sim *S, int r, int ch, const struct plait_step *st)
{
    const struct plait_red *red = &S->L->red;
    const size_t es = S->L->es;
    const uint64_t n = st->count;
    if (n == 0)
        return 1;
    struct msg in = {0};
    if (plait_step_recvs(st->kind)) {
        struct queue *q = &S->q[st->recv_peer][r][ch];
        if (q->head == q->tail)
            return 0;
        in = q->m[q->head++];
        cr_assert_eq(in.count, n);
    }
    char *src = plait_step_reads_src(st->kind) ? sim_ptr(S, r, st->src_buf, st->src_off) : NULL;
    char *dst = plait_step_writes_dst(st->kind) ? sim_ptr(S, r, st->dst_buf, st->dst_off) : NULL;
    char *tmp = xalloc(n * es + 1);
    switch (st->kind) {
    case PLAIT_STEP_SEND:
        plait_reduce_apply(red, tmp, src, NULL, n, st->flags);
        sim_push(S, r, st->send_peer, ch, tmp, n);
        break;
    case PLAIT_STEP_RECV:
        memcpy(dst, in.data, n * es);
        break;
    case PLAIT_STEP_RECV_REDUCE_SEND:
        plait_reduce_apply(red, tmp, src, in.data, n, st->flags);
        sim_push(S, r, st->send_peer, ch, tmp, n);
        break;
    case PLAIT_STEP_RECV_REDUCE_COPY:
        plait_reduce_apply(red, dst, src, in.data, n, st->flags);
        break;
    case PLAIT_STEP_RECV_REDUCE_COPY_SEND:
        plait_reduce_apply(red, dst, src, in.data, n, st->flags);
        sim_push(S, r, st->send_peer, ch, dst, n);
        break;
    case PLAIT_STEP_RECV_COPY_SEND:
        memcpy(dst, in.data, n * es);
        sim_push(S, r, st->send_peer, ch, in.data, n);
        break;
    case PLAIT_STEP_COPY:
        plait_reduce_apply(red, dst, src, NULL, n, st->flags);
        break;
    case PLAIT_STEP_REDUCE:
        plait_reduce_apply(red, dst, src, dst, n, st->flags);
        break;
    default:
        cr_assert_fail("sendrecv handled by the caller");
    }
    free(tmp);
    free(in.data);
    return 1;
}

/* SENDRECV: the send half goes first (always possible), then the receive. */
static int sim_sendrecv(struct sim *S, int r, int ch, const struct plait_step *st, int *sent)
{
    const uint64_t n = st->count;
    if (n == 0)
        return 1;
    if (!*sent) {
        sim_push(S, r, st->send_peer, ch, sim_ptr(S, r, st->src_buf, st->src_off), n);
        *sent = 1;
    }
    struct queue *q = &S->q[st->recv_peer][r][ch];
    if (q->head == q->tail)
        return 0;
    struct msg in = q->m[q->head++];
    cr_assert_eq(in.count, n);
    char *dst = sim_ptr(S, r, st->dst_buf, st->dst_off);
    if (plait_sendrecv_reduces(st->kind))
        plait_reduce_apply(&S->L->red, dst, dst, in.data, n, st->flags & PLAIT_STEP_POST);
    else
        memcpy(dst, in.data, n * S->L->es);
    free(in.data);
    return 1;
}

/* The expected OUTPUT of every rank, into out[r]. */
static void simulate(struct launch *L, char *out[MAX_RANKS])
{
    static struct sim S;
    memset(&S, 0, sizeof S);
    S.L = L;
    uint64_t idx[MAX_RANKS][MAX_CH] = {{0}};
    int sent[MAX_RANKS][MAX_CH] = {{0}};
    for (int r = 0; r < L->nranks; r++) {
        struct plait_sched_args a;
        sched_args(L, r, &a);
        const uint64_t scr = L->scratch ? L->scratch(&a) : 0;
        S.buf[r][0] = xalloc(L->count * L->es + 16);
        S.buf[r][1] = out[r];
        S.buf[r][2] = xalloc((scr ? scr : 1) * L->es + 16);
        memcpy(S.buf[r][0], L->input[r], L->count * L->es);
    }
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < L->nranks; r++) {
            struct plait_sched_args a;
            sched_args(L, r, &a);
            for (int ch = 0; ch < L->nch; ch++) {
                struct plait_step st;
                while (L->step(&a, ch, idx[r][ch], &st)) {
                    const int ok = plait_step_is_sendrecv(st.kind) ? sim_sendrecv(&S, r, ch, &st, &sent[r][ch])
                                                                   : sim_step(&S, r, ch, &st);
                    if (!ok)
                        break;
                    idx[r][ch]++;
                    sent[r][ch] = 0;
                    progress = 1;
                }
            }
        }
    }
    for (int r = 0; r < L->nranks; r++) {
        struct plait_sched_args a;
        sched_args(L, r, &a);
        struct plait_step st;
        for (int ch = 0; ch < L->nch; ch++)
            cr_assert_not(L->step(&a, ch, idx[r][ch], &st), "reference simulation stuck (rank %d ch %d)", r, ch);
        free(S.buf[r][0]);
        free(S.buf[r][2]);
    }
}

static void check_launch(struct launch *L, uint64_t launches)
{
    char *want[MAX_RANKS];
    for (int r = 0; r < L->nranks; r++)
        want[r] = xalloc(L->count * L->es + 16);
    simulate(L, want);
    for (int r = 0; r < L->nranks; r++) {
        const struct rank_state *s = &L->rs[r];
        cr_assert_eq(s->status[1], PLAIT_KERR_NONE, "rank %d: kernel error %lu on lane %lu peer %ld", r,
                     (unsigned long)s->status[1], (unsigned long)s->status[2], (long)s->status[3]);
        cr_assert_eq(s->status[0], launches, "rank %d: %lu launches completed", r, (unsigned long)s->status[0]);
        cr_assert_eq(s->lanes_done, 0);
        for (uint64_t i = 0; i < L->count; i++) {
            if (memcmp(s->buf[1] + i * L->es, want[r] + i * L->es, L->es) != 0) {
                uint64_t got = 0, exp = 0;
                memcpy(&got, s->buf[1] + i * L->es, L->es);
                memcpy(&exp, want[r] + i * L->es, L->es);
                cr_assert_fail("%s %s %s nranks %d rank %d element %lu: got %#lx, want %#lx",
                               L->wire == PLAIT_WIRE_LL ? "LL" : "Simple", plait_dtype_name(L->dtype),
                               plait_op_name(L->redop), L->nranks, r, (unsigned long)i, (unsigned long)got,
                               (unsigned long)exp);
            }
        }
        free(want[r]);
    }
}

static void allreduce_case(plait_step_fn step, plait_scratch_fn scratch, int wire, int dtype, int redop)
{
    for (int nranks = 2; nranks <= 4; nranks++) {
        struct launch *L = calloc(1, sizeof *L);
        /* Several chunks per channel, an odd tail, partial LL lines. */
        const uint64_t count = 3 * (uint64_t)nranks * (512 / plait_dtype_size(dtype)) + 37;
        launch_init(L, nranks, 2, wire, dtype, redop, count, step, scratch);
        run_all(L);
        check_launch(L, 1);
        launch_free(L);
        free(L);
    }
}

static const struct {
    int dtype, redop;
} cases[] = {
    {PLAIT_FLOAT32, PLAIT_SUM},         {PLAIT_FLOAT16, PLAIT_AVG},  {PLAIT_BFLOAT16, PLAIT_SUM},
    {PLAIT_INT32, PLAIT_AVG},           {PLAIT_INT8, PLAIT_PROD},    {PLAIT_FLOAT64, PLAIT_MAX},
    {PLAIT_FLOAT8_E4M3, PLAIT_RED_PREMULSUM}, {PLAIT_FLOAT8_E5M2, PLAIT_MIN}, {PLAIT_UINT64, PLAIT_SUM},
};

Test(stepper, ring_allreduce_simple, .timeout = 60)
{
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        allreduce_case(plait_ring_step, NULL, PLAIT_WIRE_SIMPLE, cases[i].dtype, cases[i].redop);
}

Test(stepper, ring_allreduce_ll, .timeout = 60)
{
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        allreduce_case(plait_ring_step, NULL, PLAIT_WIRE_LL, cases[i].dtype, cases[i].redop);
}

/* Recursive halving/doubling: SENDRECV and SENDRECV_REDUCE halves, folds of
 * the extra rank (3 ranks), scratch-free local COPY. */
Test(stepper, recursive_allreduce_sendrecv, .timeout = 60)
{
    for (int wire = 0; wire < 2; wire++)
        for (size_t i = 0; i < 4; i++)
            allreduce_case(plait_recursive_step, plait_recursive_scratch, wire, cases[i].dtype, cases[i].redop);
}

/* Counters live in the connections and go on across launches; the second
 * launch starts at other slots (and, for LL, other flags). */
Test(stepper, counters_persist_across_launches, .timeout = 60)
{
    for (int wire = 0; wire < 2; wire++) {
        struct launch *L = calloc(1, sizeof *L);
        launch_init(L, 3, 2, wire, PLAIT_FLOAT32, PLAIT_SUM, 1000, plait_ring_step, NULL);
        run_all(L);
        check_launch(L, 1);
        uint64_t after_one[MAX_RANKS][MAX_RANKS * MAX_CH];
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < 3 * 2; i++)
                after_one[r][i] = L->rs[r].conn[i].tx_posted;
        /* The ring sends to the next rank on both channels. */
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 2; c++)
                cr_assert_gt(after_one[r][((r + 1) % 3) * 2 + c], 0);
        memset(L->rs[0].buf[1], 0, L->count * L->es);
        run_all(L);
        check_launch(L, 2);
        for (int r = 0; r < 3; r++)
            for (int p = 0; p < 3; p++)
                for (int c = 0; c < 2; c++) {
                    if (p == r)
                        continue;
                    const struct plait_dev_conn *mine = &L->rs[r].conn[p * 2 + c];
                    const struct plait_dev_conn *theirs = &L->rs[p].conn[r * 2 + c];
                    cr_assert_eq(mine->tx_posted, 2 * after_one[r][p * 2 + c]);
                    cr_assert_eq(mine->tx_posted, theirs->rx_consumed);
                    if (wire == PLAIT_WIRE_SIMPLE)
                        cr_assert_eq(*mine->tx.tail, mine->tx_posted);
                    cr_assert_eq(*mine->tx.head, mine->tx_posted);
                }
        launch_free(L);
        free(L);
    }
}

/* Counters that start just below 2^32 (a connection that has carried four
 * billion slots) give the same results. */
Test(stepper, counters_past_2_32, .timeout = 60)
{
    for (int wire = 0; wire < 2; wire++) {
        struct launch *L = calloc(1, sizeof *L);
        launch_init(L, 2, 2, wire, PLAIT_INT32, PLAIT_SUM, 2000, plait_ring_step, NULL);
        const uint64_t start = ((uint64_t)1 << 32) - 3;
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 4; i++) {
                struct plait_dev_conn *cn = L->rs[r].conns[i];
                if (!cn)
                    continue;
                cn->tx_posted = cn->rx_consumed = start;
                *cn->tx.tail = *cn->tx.head = start;
            }
        run_all(L);
        check_launch(L, 1);
        cr_assert_gt(L->rs[0].conn[1 * 2].tx_posted, (uint64_t)1 << 32);
        launch_free(L);
        free(L);
    }
}

/* ---------------------------------------------------------------- errors
 * Hand-made plans of one step on 2 ranks, one channel. */

static void one_step_plan(struct launch *L, int r, const struct plait_step *st)
{
    free(L->rs[r].plan);
    const uint64_t lane_off = sizeof(struct plait_dev_plan);
    const uint64_t task_off = lane_off + 16;
    const uint64_t step_off = task_off + sizeof(struct plait_dev_task);
    const uint64_t bytes = step_off + sizeof(struct plait_step);
    char *base = xalloc(bytes);
    struct plait_dev_plan *plan = (struct plait_dev_plan *)base;
    *plan = (struct plait_dev_plan){.magic = PLAIT_PLAN_MAGIC, .nlanes = 1, .ntasks = 1, .nops = 1,
                                    .lane_off = lane_off, .task_off = task_off, .step_off = step_off, .bytes = bytes};
    uint32_t *lanes = (uint32_t *)(base + lane_off);
    lanes[0] = 0;
    lanes[1] = 1;
    *(struct plait_dev_task *)(base + task_off) = (struct plait_dev_task){.op = 0, .cls = 0, .step_begin = 0,
                                                                         .step_end = 1};
    *(struct plait_step *)(base + step_off) = *st;
    L->rs[r].plan = base;
    L->rs[r].kargs.plan = (const struct plait_dev_plan *)base;
}

static void error_launch(struct launch *L)
{
    /* 1024 elements: room for the timeout test's 9 pieces */
    launch_init(L, 2, 1, PLAIT_WIRE_SIMPLE, PLAIT_FLOAT32, PLAIT_SUM, 1024, plait_ring_step, NULL);
}

Test(stepper, size_mismatch, .timeout = 60)
{
    struct launch *L = calloc(1, sizeof *L);
    error_launch(L);
    struct plait_step send = {.kind = PLAIT_STEP_SEND, .src_buf = 0, .dst_buf = 1, .send_peer = 1, .recv_peer = -1,
                              .count = 10};
    struct plait_step recv = {.kind = PLAIT_STEP_RECV, .src_buf = 0, .dst_buf = 1, .send_peer = -1, .recv_peer = 0,
                              .count = 12};
    one_step_plan(L, 0, &send);
    one_step_plan(L, 1, &recv);
    run_all(L);
    cr_assert_eq(L->rs[0].status[1], PLAIT_KERR_NONE);
    cr_assert_eq(L->rs[0].status[0], 1);
    cr_assert_eq(L->rs[1].status[1], PLAIT_KERR_SIZE);
    cr_assert_eq(L->rs[1].status[2], 0);   /* lane */
    cr_assert_eq(L->rs[1].status[3], 0);   /* peer */
    cr_assert_eq(L->rs[1].status[0], 1);   /* the launch still completes */
    launch_free(L);
    free(L);
}

Test(stepper, no_connection, .timeout = 60)
{
    struct launch *L = calloc(1, sizeof *L);
    error_launch(L);
    struct plait_step send = {.kind = PLAIT_STEP_SEND, .send_peer = 1, .recv_peer = -1, .count = 10};
    one_step_plan(L, 0, &send);
    L->rs[0].conns[1] = NULL;
    plait_kernel_emulate(&L->rs[0].kargs, 0, 1);
    cr_assert_eq(L->rs[0].status[1], PLAIT_KERR_NOCONN);
    cr_assert_eq(L->rs[0].status[3], 1);
    cr_assert_eq(L->rs[0].status[0], 1);
    /* A peer out of range is no connection either, never a read out of bounds. */
    memset(L->rs[0].status, 0, sizeof L->rs[0].status);
    send.send_peer = 7;
    one_step_plan(L, 0, &send);
    plait_kernel_emulate(&L->rs[0].kargs, 0, 1);
    cr_assert_eq(L->rs[0].status[1], PLAIT_KERR_NOCONN);
    cr_assert_eq(L->rs[0].status[3], 7);
    /* A bad plan magic. */
    memset(L->rs[0].status, 0, sizeof L->rs[0].status);
    ((struct plait_dev_plan *)L->rs[0].plan)->magic = 0;
    plait_kernel_emulate(&L->rs[0].kargs, 0, 1);
    cr_assert_eq(L->rs[0].status[1], PLAIT_KERR_PLAN);
    launch_free(L);
    free(L);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A receive nobody answers: the abort flag ends it (Simple and LL). */
Test(stepper, abort_ends_a_wait, .timeout = 60)
{
    for (int wire = 0; wire < 2; wire++) {
        struct launch *L = calloc(1, sizeof *L);
        error_launch(L);
        L->rs[1].kargs.ops[0].proto = wire;
        L->rs[1].kargs.ops[0].piece_max = plait_piece_max(L->slot_bytes, L->es, wire);
        struct plait_step recv = {.kind = PLAIT_STEP_RECV, .dst_buf = 1, .send_peer = -1, .recv_peer = 0, .count = 12};
        one_step_plan(L, 1, &recv);
        struct cta_run run = {.k = &L->rs[1].kargs, .cta = 0, .ncta = 1};
        const uint64_t t0 = now_ns();
        cr_assert_eq(pthread_create(&run.th, NULL, cta_main, &run), 0);
        struct timespec d = {0, 50 * 1000 * 1000};
        nanosleep(&d, NULL);
        cr_assert_eq(__atomic_load_n(&L->rs[1].status[0], __ATOMIC_ACQUIRE), 0, "the receive did not wait");
        L->rs[1].abort_flag = 1;
        pthread_join(run.th, NULL);
        cr_assert_lt(now_ns() - t0, 5000000000ull);
        cr_assert_eq(L->rs[1].status[1], PLAIT_KERR_ABORT);
        cr_assert_eq(L->rs[1].status[3], 0);
        cr_assert_eq(L->rs[1].status[0], 1);
        launch_free(L);
        free(L);
    }
}

/* A send without credit (the receiver never drains) times out, and so does
 * an LL receive. */
Test(stepper, timeout_ends_a_wait, .timeout = 60)
{
    for (int wire = 0; wire < 2; wire++) {
        struct launch *L = calloc(1, sizeof *L);
        error_launch(L);
        struct rank_state *s = &L->rs[0];
        s->kargs.timeout_ns = 100 * 1000 * 1000;
        s->kargs.ops[0].proto = wire;
        s->kargs.ops[0].piece_max = plait_piece_max(L->slot_bytes, L->es, wire);
        /* More pieces than slots: the ninth waits for credit forever. */
        struct plait_step send = {.kind = PLAIT_STEP_SEND, .send_peer = 1, .recv_peer = -1,
                                  .count = 9 * s->kargs.ops[0].piece_max};
        one_step_plan(L, 0, &send);
        const uint64_t t0 = now_ns();
        plait_kernel_emulate(&s->kargs, 0, 1);
        const uint64_t took = now_ns() - t0;
        cr_assert_eq(s->status[1], PLAIT_KERR_TIMEOUT);
        cr_assert_eq(s->status[3], 1);
        cr_assert_geq(took, 100 * 1000 * 1000ull);
        cr_assert_lt(took, 5000000000ull);
        cr_assert_eq(s->conn[1].tx_posted, 8); /* the slots it had credit for */
        launch_free(L);
        free(L);
    }
}

/* The first error wins: two CTAs of one launch fail, status keeps one. The
 * other CTA leaves its wait when it sees status[1] set. */
Test(stepper, first_error_wins, .timeout = 60)
{
    struct launch *L = calloc(1, sizeof *L);
    launch_init(L, 2, 2, PLAIT_WIRE_SIMPLE, PLAIT_FLOAT32, PLAIT_SUM, 64, plait_ring_step, NULL);
    struct rank_state *s = &L->rs[1];
    /* Lane 0 waits for data that never comes; lane 1 names a missing peer. */
    free(s->plan);
    const uint64_t lane_off = sizeof(struct plait_dev_plan), task_off = lane_off + 16,
                   step_off = task_off + 2 * sizeof(struct plait_dev_task);
    const uint64_t bytes = step_off + 2 * sizeof(struct plait_step);
    char *base = xalloc(bytes);
    *(struct plait_dev_plan *)base = (struct plait_dev_plan){.magic = PLAIT_PLAN_MAGIC, .nlanes = 2, .ntasks = 2,
                                                             .nops = 1, .lane_off = lane_off, .task_off = task_off,
                                                             .step_off = step_off, .bytes = bytes};
    uint32_t *lanes = (uint32_t *)(base + lane_off);
    lanes[0] = 0;
    lanes[1] = 1;
    lanes[2] = 2;
    struct plait_dev_task *tasks = (struct plait_dev_task *)(base + task_off);
    tasks[0] = (struct plait_dev_task){.op = 0, .cls = 0, .step_begin = 0, .step_end = 1};
    tasks[1] = (struct plait_dev_task){.op = 0, .cls = 1, .step_begin = 1, .step_end = 2};
    struct plait_step *steps = (struct plait_step *)(base + step_off);
    steps[0] = (struct plait_step){.kind = PLAIT_STEP_RECV, .dst_buf = 1, .send_peer = -1, .recv_peer = 0, .count = 8};
    steps[1] = (struct plait_step){.kind = PLAIT_STEP_SEND, .send_peer = 3, .recv_peer = -1, .count = 8};
    s->plan = base;
    s->kargs.plan = (const struct plait_dev_plan *)base;
    struct cta_run runs[2] = {{.k = &s->kargs, .cta = 0, .ncta = 2}, {.k = &s->kargs, .cta = 1, .ncta = 2}};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&runs[i].th, NULL, cta_main, &runs[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(runs[i].th, NULL);
    cr_assert_eq(s->status[1], PLAIT_KERR_NOCONN);
    cr_assert_eq(s->status[2], 1);
    cr_assert_eq(s->status[3], 3);
    cr_assert_eq(s->status[0], 1);
    cr_assert_eq(s->lanes_done, 0);
    launch_free(L);
    free(L);
}

/* ---------------------------------------------------------------- local reduction kernel */

Test(stepper, reduce_local_matches_reduce_apply)
{
    const int types[] = {PLAIT_FLOAT16, PLAIT_BFLOAT16, PLAIT_INT64, PLAIT_FLOAT8_E4M3};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        struct launch L;
        memset(&L, 0, sizeof L);
        L.dtype = types[t];
        L.es = plait_dtype_size(types[t]);
        const uint64_t n = 10007;
        char *a = xalloc(n * L.es), *b = xalloc(n * L.es), *got = xalloc(n * L.es), *want = xalloc(n * L.es);
        fill(&L, a, n, 1);
        fill(&L, b, n, 2);
        struct plait_red red;
        cr_assert_eq(plait_red_init(&red, types[t], PLAIT_AVG, NULL, 3), PLAIT_SUCCESS);
        struct plait_kreduce_args k = {.dst = got, .a = a, .b = b, .n = n, .dtype = types[t], .redop = PLAIT_AVG,
                                       .nranks = 3, .scalar_f = red.scalar_f, .scalar_i = red.scalar_i,
                                       .flags = PLAIT_STEP_PRE | PLAIT_STEP_POST};
        for (unsigned cta = 0; cta < 3; cta++)
            plait_reduce_local_emulate(&k, cta, 3);
        plait_reduce_apply(&red, want, a, b, n, PLAIT_RED_PRE | PLAIT_RED_POST);
        cr_assert_eq(memcmp(got, want, n * L.es), 0, "%s", plait_dtype_name(types[t]));
        free(a);
        free(b);
        free(got);
        free(want);
    }
}
