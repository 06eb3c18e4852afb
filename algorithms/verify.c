/* The schedule verifier (verify.h; docs/algorithms.md, "The verifier").
 *
 * Representation. A symbolic content is a node of a DAG:
 *   LEAF(q)        value(p) = input_q[p]
 *   POISON         data that was read before anything wrote it
 *   PRE(a)         the pre-op applied to every contribution of a, by the rank
 *                  that made the step; a is only ever a rank's own data
 *   POST(a)        the post-op applied to a
 *   SUM(a, b, s)   value(p) = a(p) OP b(p + s)
 * and an interval [lo, hi) of a buffer holds (node, delta): element x holds
 * node(x + delta). Moving data between offsets only changes delta, so a copy
 * never creates a node; a reduction creates one SUM per interval, whatever its
 * length. A node remembers the last PRE, POST and SUM made over it, so the
 * batches of one step make the same nodes again and their intervals coalesce
 * back into one; every rank's copy of a finalised chunk is the same node,
 * checked once (memoised). Equal nodes made independently stay distinct: the
 * checks are structural, so that costs memory, never correctness.
 * The pre-op of a contribution is its own rank's (premulsum scales each input
 * by the scalar of the rank that contributed it), so a step that applies PRE
 * on rank r to data holding another rank's contribution is a finding of its
 * own (foreign-pre), whatever the rest of the result: every node knows whose
 * contributions it holds (owner), so the check costs one look per interval.
 * Offsets and shifts are computed modulo 2^64 (unsigned): only differences
 * matter, and every real value is far below 2^63.
 *
 * Execution. Each (rank, channel) is a task that runs until it must wait for
 * data or credit; then it parks, and the peer that fills or drains the FIFO it
 * waits on puts it back on the run queue. A task moves as many pieces of its
 * step at once as the FIFOs allow (a batch), so the work is proportional to the
 * number of steps and batches, not of pieces or elements. FIFOs hold their
 * content in stream coordinates (elements pushed so far) and the sizes of their
 * pieces as runs, so a batch is a few interval operations. A SENDRECV step
 * keeps a count per half (done: sent, rdone: received) and moves a batch of
 * either half whenever that half can; a task stuck in one waits for data,
 * credit or both (a bit set), and the deadlock analysis works on the graph of
 * those waits (strongly connected components: circular waits). */
#include "algorithms/verify.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

#define DEFAULT_MAX_REPORTS 32
#define DEFAULT_MAX_STEPS (1ull << 30)
#define MAX_RANKS (1 << 20)
#define MAX_CHANNELS 65535
/* Steps a deadlock diagnosis may read ahead in a peer's schedule to decide
 * whether that peer will ever serve the waiter. */
#define LOOKAHEAD_STEPS (1u << 20)

/* ------------------------------------------------------------------ types */

enum { NODE_NONE = 0, NODE_LEAF, NODE_POISON, NODE_PRE, NODE_POST, NODE_SUM };

struct vnode {
    uint8_t type;
    uint8_t memo;      /* 0: not checked; 1: right; 2: wrong (for memo_key) */
    uint32_t a, b;     /* children; LEAF: a = rank */
    uint32_t nleaves;  /* contributions, saturating */
    uint64_t shift;    /* SUM: b is read at p + shift */
    uint64_t memo_key; /* expected shift minus delta of the memoised check */
    /* The last PRE, POST and SUM (as its b) made over this node: a step moved
     * in several batches makes the same nodes again, and finds them here. */
    uint32_t up_pre, up_post, up_sum;
    int32_t owner; /* the one rank whose contributions it holds, OWNER_NONE or OWNER_MIXED */
};

/* vnode.owner for a node without a contribution (POISON) and for one with
 * contributions of several ranks. */
#define OWNER_NONE (-1)
#define OWNER_MIXED (-2)

struct seg {
    uint64_t lo, hi;
    uint64_t delta; /* element x holds node(x + delta) */
    uint32_t node;
    int32_t writer; /* channel that wrote it; -1: the user's input */
};

struct segv {
    struct seg *v;
    size_t n, cap;
};

/* A buffer: segments sorted by lo, in a gap buffer so that runs of writes near
 * one place (a ring writes chunk r, r-1, r-2 ... of an iteration) cost O(1). */
struct store {
    struct seg *v;
    size_t cap, g0, g1; /* logical order: [0, g0) then [g1, cap) */
};

/* A run of pieces in a FIFO: n pieces of `size` elements, sent by one step. */
struct grp {
    uint64_t n, size, step;
    int kind;
};

struct fifo {
    int32_t from, to, ch;
    uint64_t pieces;     /* in flight (filled, not yet drained) */
    uint64_t head, tail; /* stream coordinates: [head, tail) is in flight */
    struct seg *seg;     /* content, in stream coordinates */
    size_t seg_start, seg_end, seg_cap;
    struct grp *grp;
    size_t grp_start, grp_end, grp_cap;
};

enum { T_READY = 0, T_BLOCKED, T_DONE, T_FAILED };
/* What a blocked task waits for: a bit set (a SENDRECV step may wait for
 * both, one per half). */
enum { W_NONE = 0, W_DATA = 1, W_CREDIT = 2 };
/* per-step "already reported" bits, so one step reports one thing once */
enum { R_UNWRITTEN = 1, R_BOUNDS = 2, R_RACE = 4, R_PRE = 8 };

struct task {
    struct plait_step st;
    uint64_t idx;   /* index of st */
    uint64_t done;  /* elements of st already moved (SENDRECV: sent) */
    uint64_t rdone; /* SENDRECV: elements of st already received */
    uint32_t fin;   /* FIFO st receives from, or NO_FIFO */
    uint32_t fout;  /* FIFO st sends into, or NO_FIFO */
    int32_t ok_send, ok_recv; /* last peers found connected (cache) */
    uint8_t state, wait, has_step, queued, reported;
};

#define NO_FIFO UINT32_MAX

struct leaf {
    int32_t rank;
    uint32_t npre;
    uint64_t shift;
};

struct flat {
    size_t nleaves;
    uint32_t post_top;   /* post-ops applied to the whole result */
    uint32_t post_inner; /* post-ops applied to a part that was reduced further */
    uint32_t poison;
};

struct fentry {
    uint32_t node;
    uint32_t npre;
    uint64_t shift;
    int under; /* below a SUM or a PRE */
};

/* What one output interval must hold. */
struct expect {
    int is_all;     /* 1: every rank once (a reduction); 0: rank q only (a copy) */
    int allow_dup;  /* with is_all: every rank at least once (a barrier) */
    int q;
    uint64_t shift; /* element x must read input[x + shift] */
    uint32_t pre, post; /* times each is applied; ANY_TIMES: not checked */
};

/* A barrier's data is never read: its pre- and post-ops do not matter, only
 * that every rank's contribution reached every rank (at least once: a
 * dissemination barrier on a rank count that is not a power of two hears from
 * some ranks twice). */
#define ANY_TIMES UINT32_MAX

struct vctx {
    const struct plait_verify_config *cfg;
    struct plait_verify_result *res;
    struct plait_sched_args args;
    int n, nch, coll, root, max_reports;
    uint64_t count, P, S, max_steps;
    int is_inplace;
    uint64_t *scratch_size; /* per rank (NULL: no scratch) */
    int32_t *nodemap;       /* host_of then local_of, built from ranks_per_node */
    int **peer_lists;       /* per rank: {count, sorted peers}, computed on first use */

    struct vnode *nodes;
    size_t nnodes, nodes_cap;
    uint32_t poison;

    struct task *tasks;
    int ntasks;
    int *queue;
    size_t qhead, qlen;

    struct fifo *fifos;
    size_t nfifos, fifos_cap;
    uint64_t *fkeys;
    uint32_t *fvals;
    size_t fmap_cap;

    struct store *stores; /* 3 per rank: input, output, scratch */

    struct segv la, lb, lr, tmp;
    uint32_t *rank_cnt;
    int *peerbuf;
    struct leaf *leaves;
    size_t nleaves, leaves_cap;
    struct fentry *stack;
    size_t stack_cap;

    int oom, stop;
};

/* ------------------------------------------------------------------ names */

const char *plait_verify_kind_name(int kind)
{
    static const char *const names[PLAIT_VERIFY_KINDS] = {
        "wrong-output",   "no-matching-send", "no-matching-recv", "credit-deadlock", "circular-wait",
        "blocked-behind", "unwritten-read",   "bad-peer",         "leftover",        "mismatch",
        "out-of-bounds",  "bad-step",         "race",             "divergent",       "foreign-pre",
        "limit",
    };
    return kind >= 0 && kind < PLAIT_VERIFY_KINDS ? names[kind] : "invalid";
}

const char *plait_step_kind_name(int kind)
{
    static const char *const names[PLAIT_STEP_KINDS] = {
        "SEND", "RECV", "RECV_REDUCE_SEND", "RECV_REDUCE_COPY", "RECV_REDUCE_COPY_SEND", "RECV_COPY_SEND", "COPY",
        "SENDRECV", "REDUCE", "SENDRECV_REDUCE",
    };
    return kind >= 0 && kind < PLAIT_STEP_KINDS ? names[kind] : "invalid";
}

static const char *buf_name(int buf)
{
    return buf == PLAIT_BUF_INPUT ? "INPUT" : buf == PLAIT_BUF_OUTPUT ? "OUTPUT" : "SCRATCH";
}

static uint64_t umax(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* ------------------------------------------------------------------ memory */

/* Grows *p (of *cap elements of sz bytes) to hold `need`; on failure sets the
 * sticky oom flag and leaves *p as it was. */
static int grow(struct vctx *c, void **p, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    if (c->oom)
        return -1;
    size_t nc = *cap ? *cap : 8;
    while (nc < need)
        nc *= 2;
    if (nc > SIZE_MAX / sz) {
        c->oom = 1;
        return -1;
    }
    void *q = realloc(*p, nc * sz);
    if (!q) {
        c->oom = 1;
        return -1;
    }
    *p = q;
    *cap = nc;
    return 0;
}

static void segv_push(struct vctx *c, struct segv *s, uint64_t lo, uint64_t hi, uint32_t node, uint64_t delta,
                      int32_t writer)
{
    if (lo >= hi)
        return;
    if (s->n) {
        struct seg *l = &s->v[s->n - 1];
        if (l->hi == lo && l->node == node && l->delta == delta && l->writer == writer) {
            l->hi = hi;
            return;
        }
    }
    void *v = s->v;
    if (grow(c, &v, &s->cap, s->n + 1, sizeof(*s->v)))
        return;
    s->v = v;
    s->v[s->n++] = (struct seg){.lo = lo, .hi = hi, .delta = delta, .node = node, .writer = writer};
}

/* ------------------------------------------------------------------ reports */

static int want_text(const struct vctx *c)
{
    return c->res->nfindings < (size_t)c->max_reports;
}

static void report(struct vctx *c, int kind, int rank, int ch, uint64_t step, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void report(struct vctx *c, int kind, int rank, int ch, uint64_t step, const char *fmt, ...)
{
    struct plait_verify_result *r = c->res;
    r->counts[kind]++;
    r->total++;
    if (!want_text(c))
        return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    char *text = strdup(buf);
    void *v = r->findings;
    size_t cap = r->nfindings; /* findings grow one by one: max_reports is small */
    if (!text || grow(c, &v, &cap, r->nfindings + 1, sizeof(*r->findings))) {
        free(text);
        c->oom = 1;
        return;
    }
    r->findings = v;
    r->findings[r->nfindings++] =
        (struct plait_verify_finding){.kind = kind, .rank = rank, .channel = ch, .step = step, .text = text};
}

/* "0-3,7,9-12" for the ranks whose rank_cnt satisfies pred, at most ~len chars. */
static void fmt_ranks(const struct vctx *c, int (*pred)(uint32_t), char *buf, size_t len)
{
    size_t o = 0;
    int first = 1;
    buf[0] = '\0';
    for (int r = 0; r < c->n; r++) {
        if (!pred(c->rank_cnt[r]))
            continue;
        int e = r;
        while (e + 1 < c->n && pred(c->rank_cnt[e + 1]))
            e++;
        if (o + 32 >= len) {
            snprintf(buf + o, len - o, ",...");
            return;
        }
        if (e == r)
            o += (size_t)snprintf(buf + o, len - o, "%s%d", first ? "" : ",", r);
        else
            o += (size_t)snprintf(buf + o, len - o, "%s%d-%d", first ? "" : ",", r, e);
        first = 0;
        r = e;
    }
}

static int is_zero(uint32_t v)
{
    return v == 0;
}

static int is_many(uint32_t v)
{
    return v > 1;
}

static int is_nonzero(uint32_t v)
{
    return v != 0;
}

/* "input[x]", "input[x+64]", "input[x-128]" */
static const char *fmt_index(uint64_t shift, char *buf, size_t len)
{
    int64_t s = (int64_t)shift;
    if (s == 0)
        snprintf(buf, len, "input[x]");
    else
        snprintf(buf, len, "input[x%+" PRId64 "]", s);
    return buf;
}

/* ------------------------------------------------------------------ nodes */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint32_t node_new(struct vctx *c, int type, uint32_t a, uint32_t b, uint64_t shift)
{
    if (c->oom)
        return 0;
    if (c->nnodes >= UINT32_MAX - 1) {
        c->oom = 1;
        return 0;
    }
    void *v = c->nodes;
    if (grow(c, &v, &c->nodes_cap, c->nnodes + 1, sizeof(*c->nodes)))
        return 0;
    c->nodes = v;
    const uint32_t id = (uint32_t)c->nnodes++;
    uint64_t leaves = 1;
    int32_t owner = type == NODE_LEAF ? (int32_t)a : OWNER_NONE;
    if (type == NODE_PRE || type == NODE_POST) {
        leaves = c->nodes[a].nleaves;
        owner = c->nodes[a].owner;
    } else if (type == NODE_SUM) {
        leaves = (uint64_t)c->nodes[a].nleaves + c->nodes[b].nleaves;
        const int32_t oa = c->nodes[a].owner, ob = c->nodes[b].owner;
        owner = oa == OWNER_NONE ? ob : ob == OWNER_NONE || ob == oa ? oa : OWNER_MIXED;
    }
    memset(&c->nodes[id], 0, sizeof(c->nodes[id]));
    c->nodes[id].type = (uint8_t)type;
    c->nodes[id].a = a;
    c->nodes[id].b = b;
    c->nodes[id].nleaves = leaves > UINT32_MAX ? UINT32_MAX : (uint32_t)leaves;
    c->nodes[id].shift = shift;
    c->nodes[id].owner = owner;
    c->res->nodes++;
    return id;
}

/* PRE(x) or POST(x), one per x. */
static uint32_t node_wrap(struct vctx *c, int type, uint32_t x)
{
    uint32_t *up = type == NODE_PRE ? &c->nodes[x].up_pre : &c->nodes[x].up_post;
    if (*up)
        return *up;
    const uint32_t id = node_new(c, type, x, 0, 0);
    if (id) /* nodes may have moved */
        *(type == NODE_PRE ? &c->nodes[x].up_pre : &c->nodes[x].up_post) = id;
    return id;
}

/* SUM(a, b, shift), reusing the last one made over b when it is the same (the
 * batches of one step). Equal sums made apart stay distinct nodes, which costs
 * memory, never correctness: every check is structural. */
static uint32_t node_sum(struct vctx *c, uint32_t a, uint32_t b, uint64_t shift)
{
    const uint32_t last = c->nodes[b].up_sum;
    if (last && c->nodes[last].a == a && c->nodes[last].shift == shift)
        return last;
    const uint32_t id = node_new(c, NODE_SUM, a, b, shift);
    if (id)
        c->nodes[b].up_sum = id;
    return id;
}

static uint32_t node_flags(struct vctx *c, uint32_t node, unsigned flags)
{
    if (flags & PLAIT_STEP_PRE)
        node = node_wrap(c, NODE_PRE, node);
    if (flags & PLAIT_STEP_POST)
        node = node_wrap(c, NODE_POST, node);
    return node;
}

/* ------------------------------------------------------------------ stores */

static size_t store_n(const struct store *s)
{
    return s->cap - (s->g1 - s->g0);
}

static struct seg *store_at(const struct store *s, size_t i)
{
    return &s->v[i < s->g0 ? i : i + (s->g1 - s->g0)];
}

/* The first segment whose hi is above x. Edits cluster (a ring writes chunk
 * r, r-1, r-2 ... of an iteration), so the few segments around the gap, the
 * last edit, are tried before a binary search. */
static size_t store_find(const struct store *s, uint64_t x)
{
    const size_t n = store_n(s);
    const size_t from = s->g0 > 4 ? s->g0 - 4 : 0, to = s->g0 + 1 < n ? s->g0 + 1 : n;
    for (size_t i = from; i <= to; i++)
        if ((i == 0 || store_at(s, i - 1)->hi <= x) && (i == n || store_at(s, i)->hi > x))
            return i;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (store_at(s, mid)->hi > x)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static void store_move_gap(struct store *s, size_t p)
{
    if (p < s->g0) {
        size_t k = s->g0 - p;
        memmove(s->v + s->g1 - k, s->v + p, k * sizeof(*s->v));
        s->g0 = p;
        s->g1 -= k;
    } else if (p > s->g0) {
        size_t k = p - s->g0;
        memmove(s->v + s->g0, s->v + s->g1, k * sizeof(*s->v));
        s->g0 += k;
        s->g1 += k;
    }
}

static int store_reserve(struct vctx *c, struct store *s, size_t m)
{
    if (s->g1 - s->g0 >= m)
        return 0;
    size_t n = store_n(s);
    size_t nc = s->cap ? s->cap * 2 : 16;
    while (nc < n + m)
        nc *= 2;
    struct seg *v = malloc(nc * sizeof(*v));
    if (!v) {
        c->oom = 1;
        return -1;
    }
    size_t tail = s->cap - s->g1;
    if (s->g0)
        memcpy(v, s->v, s->g0 * sizeof(*v));
    if (tail)
        memcpy(v + nc - tail, s->v + s->g1, tail * sizeof(*v));
    free(s->v);
    s->v = v;
    s->g1 = nc - tail;
    s->cap = nc;
    return 0;
}

/* Replaces [lo, lo + len) of s with the local segments L (local j is store
 * element lo + j), written by channel `writer`; merges equal neighbours. */
static void store_write(struct vctx *c, struct store *s, uint64_t lo, uint64_t len, const struct segv *L,
                        int32_t writer)
{
    const uint64_t hi = lo + len;
    const size_t n = store_n(s);
    size_t i = store_find(s, lo), j = i;
    while (j < n && store_at(s, j)->lo < hi)
        j++;
    const size_t i0 = i > 0 ? i - 1 : i, j0 = j < n ? j + 1 : j;
    struct segv *t = &c->tmp;
    t->n = 0;
    for (size_t k = i0; k < j0; k++) {
        const struct seg *g = store_at(s, k);
        if (g->lo < lo)
            segv_push(c, t, g->lo, plait_umin(g->hi, lo), g->node, g->delta, g->writer);
    }
    for (size_t k = 0; k < L->n; k++) {
        const struct seg *l = &L->v[k];
        if (l->lo >= len)
            break;
        segv_push(c, t, lo + l->lo, lo + plait_umin(l->hi, len), l->node, l->delta - lo, writer);
    }
    for (size_t k = i0; k < j0; k++) {
        const struct seg *g = store_at(s, k);
        if (g->hi > hi)
            segv_push(c, t, umax(g->lo, hi), g->hi, g->node, g->delta, g->writer);
    }
    if (c->oom)
        return;
    store_move_gap(s, i0);
    s->g1 += j0 - i0;
    if (store_reserve(c, s, t->n))
        return;
    memcpy(s->v + s->g0, t->v, t->n * sizeof(*t->v));
    s->g0 += t->n;
}

/* ------------------------------------------------------------------ buffers */

static uint64_t in_size(const struct vctx *c, int rank)
{
    switch (c->coll) {
    case PLAIT_COLL_BROADCAST:
        return rank == c->root ? c->count : 0;
    case PLAIT_COLL_SCATTER:
        return rank == c->root ? (uint64_t)c->n * c->count : 0;
    case PLAIT_COLL_REDUCESCATTER:
    case PLAIT_COLL_ALLTOALL:
        return (uint64_t)c->n * c->count;
    default:
        return c->count;
    }
}

static uint64_t out_size(const struct vctx *c, int rank)
{
    switch (c->coll) {
    case PLAIT_COLL_REDUCE:
        return rank == c->root ? c->count : 0;
    case PLAIT_COLL_GATHER:
        return rank == c->root ? (uint64_t)c->n * c->count : 0;
    case PLAIT_COLL_ALLGATHER:
    case PLAIT_COLL_ALLTOALL:
        return (uint64_t)c->n * c->count;
    default:
        return c->count;
    }
}

static uint64_t buf_size(const struct vctx *c, int rank, int buf)
{
    if (buf == PLAIT_BUF_INPUT)
        return in_size(c, rank);
    if (buf == PLAIT_BUF_OUTPUT)
        return out_size(c, rank);
    return c->scratch_size ? c->scratch_size[rank] : 0; /* SCRATCH: what the algorithm asked for */
}

/* Where a logical buffer lives: store 0 holds INPUT, 1 OUTPUT, 2 SCRATCH; an
 * in-place call folds one of INPUT and OUTPUT into the other the way NCCL
 * defines in-place (allgather: sendbuff = recvbuff + rank*count; reducescatter:
 * recvbuff = sendbuff + rank*count; gather, on the root: sendbuff = recvbuff +
 * root*count; scatter, on the root: recvbuff = sendbuff + root*count; the
 * others: sendbuff == recvbuff, for reduce on the root only). Alltoall has no
 * in-place form (the API refuses it; check_config too). */
static int resolve(const struct vctx *c, int rank, int buf, uint64_t *add)
{
    *add = 0;
    if (buf == PLAIT_BUF_SCRATCH || !c->is_inplace)
        return buf;
    switch (c->coll) {
    case PLAIT_COLL_ALLGATHER:
        if (buf == PLAIT_BUF_INPUT)
            *add = (uint64_t)rank * c->count;
        return PLAIT_BUF_OUTPUT;
    case PLAIT_COLL_REDUCESCATTER:
        if (buf == PLAIT_BUF_OUTPUT)
            *add = (uint64_t)rank * c->count;
        return PLAIT_BUF_INPUT;
    case PLAIT_COLL_REDUCE:
        return rank == c->root ? PLAIT_BUF_OUTPUT : buf;
    case PLAIT_COLL_GATHER:
        if (rank != c->root)
            return buf;
        if (buf == PLAIT_BUF_INPUT)
            *add = (uint64_t)rank * c->count;
        return PLAIT_BUF_OUTPUT;
    case PLAIT_COLL_SCATTER:
        if (rank != c->root)
            return buf;
        if (buf == PLAIT_BUF_OUTPUT)
            *add = (uint64_t)rank * c->count;
        return PLAIT_BUF_INPUT;
    default:
        return PLAIT_BUF_OUTPUT;
    }
}

static struct store *store_of(struct vctx *c, int rank, int which)
{
    return &c->stores[(size_t)rank * 3 + (size_t)which];
}

static int task_rank(const struct vctx *c, const struct task *t)
{
    return (int)((t - c->tasks) / c->nch);
}

static int task_ch(const struct vctx *c, const struct task *t)
{
    return (int)((t - c->tasks) % c->nch);
}

/* Reads [off, off + len) of a rank's logical buffer into L (local
 * coordinates), reporting what is outside the buffer, unwritten, or written by
 * another channel; those parts read as POISON (the first two). */
static void buf_read(struct vctx *c, struct task *t, int buf, uint64_t off, uint64_t len, struct segv *L)
{
    const int rank = task_rank(c, t), ch = task_ch(c, t);
    const uint64_t size = buf_size(c, rank, buf);
    const uint64_t inb = off >= size ? 0 : plait_umin(len, size - off);
    L->n = 0;
    if (inb) {
        uint64_t add;
        const struct store *s = store_of(c, rank, resolve(c, rank, buf, &add));
        const uint64_t lo = off + add, hi = lo + inb;
        const size_t n = store_n(s);
        uint64_t pos = lo;
        for (size_t k = store_find(s, lo); pos < hi; k++) {
            const struct seg *g = k < n ? store_at(s, k) : NULL;
            const uint64_t a = g ? umax(g->lo, lo) : hi;
            if (a > pos) {
                segv_push(c, L, pos - lo, plait_umin(a, hi) - lo, c->poison, 0, -1);
                if (!(t->reported & R_UNWRITTEN)) {
                    t->reported |= R_UNWRITTEN;
                    report(c, PLAIT_VERIFY_UNWRITTEN_READ, rank, ch, t->idx,
                           "rank %d channel %d step %" PRIu64 " (%s): reads %s[%" PRIu64 ", %" PRIu64
                           ") before anything wrote it",
                           rank, ch, t->idx, plait_step_kind_name(t->st.kind), buf_name(buf), pos - add,
                           plait_umin(a, hi) - add);
                }
            }
            if (!g || g->lo >= hi)
                break;
            const uint64_t b = plait_umin(g->hi, hi);
            segv_push(c, L, a - lo, b - lo, g->node, g->delta + lo, g->writer);
            if (g->writer >= 0 && g->writer != ch && !(t->reported & R_RACE)) {
                t->reported |= R_RACE;
                report(c, PLAIT_VERIFY_RACE, rank, ch, t->idx,
                       "rank %d channel %d step %" PRIu64 " (%s): reads %s[%" PRIu64 ", %" PRIu64
                       ") written by channel %d (channels are not ordered)",
                       rank, ch, t->idx, plait_step_kind_name(t->st.kind), buf_name(buf), a - add, b - add,
                       (int)g->writer);
            }
            pos = b;
        }
    }
    if (inb < len) {
        segv_push(c, L, inb, len, c->poison, 0, -1);
        if (!(t->reported & R_BOUNDS)) {
            t->reported |= R_BOUNDS;
            report(c, PLAIT_VERIFY_OUT_OF_BOUNDS, rank, ch, t->idx,
                   "rank %d channel %d step %" PRIu64 " (%s): reads %s[%" PRIu64 ", %" PRIu64
                   "), outside its %" PRIu64 " elements",
                   rank, ch, t->idx, plait_step_kind_name(t->st.kind), buf_name(buf), off + inb, off + len, size);
        }
    }
}

static void buf_write(struct vctx *c, struct task *t, int buf, uint64_t off, uint64_t len, const struct segv *L)
{
    const int rank = task_rank(c, t), ch = task_ch(c, t);
    const uint64_t size = buf_size(c, rank, buf);
    const uint64_t inb = off >= size ? 0 : plait_umin(len, size - off);
    if (inb < len && !(t->reported & R_BOUNDS)) {
        t->reported |= R_BOUNDS;
        report(c, PLAIT_VERIFY_OUT_OF_BOUNDS, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): writes %s[%" PRIu64 ", %" PRIu64
               "), outside its %" PRIu64 " elements%s",
               rank, ch, t->idx, plait_step_kind_name(t->st.kind), buf_name(buf), off + inb, off + len, size,
               size == 0 ? " (the buffer does not exist on this rank)" : "");
    }
    if (!inb)
        return;
    uint64_t add;
    struct store *s = store_of(c, rank, resolve(c, rank, buf, &add));
    if (!(t->reported & R_RACE)) {
        const size_t n = store_n(s);
        for (size_t k = store_find(s, off + add); k < n; k++) {
            const struct seg *g = store_at(s, k);
            if (g->lo >= off + add + inb)
                break;
            if (g->writer >= 0 && g->writer != ch) {
                t->reported |= R_RACE;
                report(c, PLAIT_VERIFY_RACE, rank, ch, t->idx,
                       "rank %d channel %d step %" PRIu64 " (%s): overwrites %s[%" PRIu64 ", %" PRIu64
                       ") written by channel %d (channels are not ordered)",
                       rank, ch, t->idx, plait_step_kind_name(t->st.kind), buf_name(buf),
                       umax(g->lo, off + add) - add, plait_umin(g->hi, off + add + inb) - add, (int)g->writer);
                break;
            }
        }
    }
    store_write(c, s, off + add, inb, L, ch);
}

/* ------------------------------------------------------------------ FIFOs */

static uint64_t fifo_key(int from, int to, int ch)
{
    return ((uint64_t)(from + 1) << 40) | ((uint64_t)to << 16) | (uint64_t)ch;
}

static int fmap_rehash(struct vctx *c, size_t cap)
{
    uint64_t *k = calloc(cap, sizeof(*k));
    uint32_t *v = calloc(cap, sizeof(*v));
    if (!k || !v) {
        free(k);
        free(v);
        c->oom = 1;
        return -1;
    }
    for (size_t f = 0; f < c->nfifos; f++) {
        const struct fifo *x = &c->fifos[f];
        uint64_t key = fifo_key(x->from, x->to, x->ch);
        size_t i = (size_t)mix64(key) & (cap - 1);
        while (k[i])
            i = (i + 1) & (cap - 1);
        k[i] = key;
        v[i] = (uint32_t)f;
    }
    free(c->fkeys);
    free(c->fvals);
    c->fkeys = k;
    c->fvals = v;
    c->fmap_cap = cap;
    return 0;
}

/* The FIFO from -> to on channel ch, made on first use. */
static uint32_t fifo_get(struct vctx *c, int from, int to, int ch)
{
    const uint64_t key = fifo_key(from, to, ch);
    if ((c->nfifos + 1) * 2 > c->fmap_cap && fmap_rehash(c, c->fmap_cap ? c->fmap_cap * 2 : 1024))
        return NO_FIFO;
    size_t i = (size_t)mix64(key) & (c->fmap_cap - 1);
    while (c->fkeys[i]) {
        if (c->fkeys[i] == key)
            return c->fvals[i];
        i = (i + 1) & (c->fmap_cap - 1);
    }
    void *v = c->fifos;
    if (grow(c, &v, &c->fifos_cap, c->nfifos + 1, sizeof(*c->fifos)))
        return NO_FIFO;
    c->fifos = v;
    struct fifo *f = &c->fifos[c->nfifos];
    memset(f, 0, sizeof(*f));
    f->from = from;
    f->to = to;
    f->ch = ch;
    c->fkeys[i] = key;
    c->fvals[i] = (uint32_t)c->nfifos;
    return (uint32_t)c->nfifos++;
}

static void fifo_push_seg(struct vctx *c, struct fifo *f, uint64_t lo, uint64_t hi, uint32_t node, uint64_t delta)
{
    if (f->seg_end > f->seg_start) {
        struct seg *l = &f->seg[f->seg_end - 1];
        if (l->hi == lo && l->node == node && l->delta == delta) {
            l->hi = hi;
            return;
        }
    }
    if (f->seg_end == f->seg_cap && f->seg_start > 0) {
        memmove(f->seg, f->seg + f->seg_start, (f->seg_end - f->seg_start) * sizeof(*f->seg));
        f->seg_end -= f->seg_start;
        f->seg_start = 0;
    }
    void *v = f->seg;
    if (grow(c, &v, &f->seg_cap, f->seg_end + 1, sizeof(*f->seg)))
        return;
    f->seg = v;
    f->seg[f->seg_end++] = (struct seg){.lo = lo, .hi = hi, .delta = delta, .node = node, .writer = -1};
}

static void fifo_push_grp(struct vctx *c, struct fifo *f, uint64_t n, uint64_t size, uint64_t step, int kind)
{
    if (!n)
        return;
    if (f->grp_end > f->grp_start) {
        struct grp *l = &f->grp[f->grp_end - 1];
        if (l->size == size && l->step == step) {
            l->n += n;
            return;
        }
    }
    if (f->grp_end == f->grp_cap && f->grp_start > 0) {
        memmove(f->grp, f->grp + f->grp_start, (f->grp_end - f->grp_start) * sizeof(*f->grp));
        f->grp_end -= f->grp_start;
        f->grp_start = 0;
    }
    void *v = f->grp;
    if (grow(c, &v, &f->grp_cap, f->grp_end + 1, sizeof(*f->grp)))
        return;
    f->grp = v;
    f->grp[f->grp_end++] = (struct grp){.n = n, .size = size, .step = step, .kind = kind};
}

/* Sends `len` elements of L as nfull pieces of P elements and one of `last`
 * (when last > 0). */
static void fifo_push(struct vctx *c, struct fifo *f, const struct segv *L, uint64_t len, uint64_t nfull,
                      uint64_t last, uint64_t step, int kind)
{
    for (size_t k = 0; k < L->n; k++) {
        const struct seg *l = &L->v[k];
        fifo_push_seg(c, f, f->tail + l->lo, f->tail + l->hi, l->node, l->delta - f->tail);
    }
    f->tail += len;
    fifo_push_grp(c, f, nfull, c->P, step, kind);
    fifo_push_grp(c, f, last ? 1 : 0, last, step, kind);
    f->pieces += nfull + (last ? 1 : 0);
}

/* How many of the next pieces match what the receiver expects (nfull pieces
 * of P, then one of `last` if last > 0); at the first difference, *want and
 * *got are the two sizes and *grp the sender's run. */
static uint64_t fifo_match(const struct vctx *c, const struct fifo *f, uint64_t nfull, uint64_t last, uint64_t *want,
                           uint64_t *got, const struct grp **grp)
{
    uint64_t m = 0;
    size_t gi = f->grp_start;
    uint64_t used = 0;
    while (m < nfull) {
        const struct grp *g = &f->grp[gi];
        if (g->size != c->P) {
            *want = c->P;
            *got = g->size;
            *grp = g;
            return m;
        }
        uint64_t take = plait_umin(g->n - used, nfull - m);
        m += take;
        used += take;
        if (used == g->n) {
            gi++;
            used = 0;
        }
    }
    if (last) {
        const struct grp *g = &f->grp[gi];
        if (g->size != last) {
            *want = last;
            *got = g->size;
            *grp = g;
            return m;
        }
        m++;
    }
    return m;
}

/* Receives the next `len` elements (k pieces) into L (local coordinates). */
static void fifo_pop(struct vctx *c, struct fifo *f, uint64_t len, uint64_t k, struct segv *L)
{
    const uint64_t head = f->head, end = head + len;
    L->n = 0;
    while (f->head < end && f->seg_start < f->seg_end) {
        struct seg *g = &f->seg[f->seg_start];
        const uint64_t b = plait_umin(g->hi, end);
        segv_push(c, L, f->head - head, b - head, g->node, g->delta + head, -1);
        f->head = b;
        if (g->hi <= end)
            f->seg_start++;
        else
            g->lo = end;
    }
    f->head = end;
    if (f->seg_start == f->seg_end)
        f->seg_start = f->seg_end = 0;
    f->pieces -= k;
    while (k) {
        struct grp *g = &f->grp[f->grp_start];
        uint64_t take = plait_umin(k, g->n);
        g->n -= take;
        k -= take;
        if (!g->n)
            f->grp_start++;
    }
    if (f->grp_start == f->grp_end)
        f->grp_start = f->grp_end = 0;
}

/* ------------------------------------------------------------------ tasks */

static void wake(struct vctx *c, int rank, int ch)
{
    struct task *t = &c->tasks[(size_t)rank * (size_t)c->nch + (size_t)ch];
    if (t->queued || t->state == T_DONE || t->state == T_FAILED)
        return;
    t->queued = 1;
    t->state = T_READY;
    c->queue[(c->qhead + c->qlen) % (size_t)c->ntasks] = (int)(t - c->tasks);
    c->qlen++;
}

/* Whether the executor has a connection between rank and peer: the peers
 * function lists it on either side (as plait_algo_connects does). */
static int cmp_int(const void *x, const void *y)
{
    const int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

/* Rank a's peer list, sorted, computed once (steps change peers often). */
static const int *peers_of(struct vctx *c, int a, int *cnt)
{
    if (!c->peer_lists[a]) {
        int m = c->cfg->peers(c->n, a, c->args.radix, c->peerbuf, c->n);
        if (m < 0)
            m = 0;
        if (m > c->n)
            m = c->n;
        int *v = malloc(sizeof(int) * (size_t)(m + 1));
        if (!v) {
            c->oom = 1;
            *cnt = 0;
            return NULL;
        }
        v[0] = m;
        memcpy(v + 1, c->peerbuf, sizeof(int) * (size_t)m);
        qsort(v + 1, (size_t)m, sizeof(int), cmp_int);
        c->peer_lists[a] = v;
    }
    *cnt = c->peer_lists[a][0];
    return c->peer_lists[a] + 1;
}

static int is_connected(struct vctx *c, int rank, int peer)
{
    if (!c->cfg->peers)
        return 1;
    for (int side = 0; side < 2; side++) {
        int a = side ? peer : rank, b = side ? rank : peer, cnt = 0;
        const int *v = peers_of(c, a, &cnt);
        if (v && bsearch(&b, v, (size_t)cnt, sizeof(int), cmp_int))
            return 1;
    }
    return 0;
}

static int check_peer(struct vctx *c, struct task *t, int peer, int is_send)
{
    const int rank = task_rank(c, t), ch = task_ch(c, t);
    const char *what = is_send ? "send_peer" : "recv_peer";
    int32_t *ok = is_send ? &t->ok_send : &t->ok_recv;
    if (peer < 0 || peer >= c->n || peer == rank) {
        report(c, PLAIT_VERIFY_BAD_PEER, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): %s %d is %s", rank, ch, t->idx,
               plait_step_kind_name(t->st.kind), what, peer,
               peer == rank ? "the rank itself (channels have no self-connection)" : "out of range");
        return 0;
    }
    if (*ok == peer)
        return 1;
    if (!is_connected(c, rank, peer)) {
        report(c, PLAIT_VERIFY_BAD_PEER, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): %s %d is not connected to it (the algorithm's peers "
               "do not list the pair, so the executor has no connection there)",
               rank, ch, t->idx, plait_step_kind_name(t->st.kind), what, peer);
        return 0;
    }
    *ok = peer;
    return 1;
}

/* Checks a freshly fetched step and finds its FIFOs. 0: the task cannot go on
 * (the executor would fail or crash on it). */
static int step_check(struct vctx *c, struct task *t)
{
    const int rank = task_rank(c, t), ch = task_ch(c, t);
    const struct plait_step *st = &t->st;
    t->fin = t->fout = NO_FIFO;
    if (st->kind >= PLAIT_STEP_KINDS) {
        report(c, PLAIT_VERIFY_BAD_STEP, rank, ch, t->idx, "rank %d channel %d step %" PRIu64 ": unknown kind %d",
               rank, ch, t->idx, st->kind);
        return 0;
    }
    if (st->count == 0)
        return 1; /* the executor touches nothing for it */
    const char *kind = plait_step_kind_name(st->kind);
    const int reads = plait_step_reads_src(st->kind), writes = plait_step_writes_dst(st->kind);
    if ((reads && st->src_buf > PLAIT_BUF_SCRATCH) || (writes && st->dst_buf > PLAIT_BUF_SCRATCH)) {
        report(c, PLAIT_VERIFY_BAD_STEP, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): unknown buffer (src %d, dst %d)", rank, ch, t->idx, kind,
               st->src_buf, st->dst_buf);
        return 0;
    }
    if (st->kind == PLAIT_STEP_SENDRECV && st->flags)
        report(c, PLAIT_VERIFY_BAD_STEP, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): flags 0x%x (a SENDRECV moves data unchanged: it takes no "
               "PRE or POST)",
               rank, ch, t->idx, kind, st->flags);
    else if (st->kind == PLAIT_STEP_SENDRECV_REDUCE && (st->flags & ~(unsigned)PLAIT_STEP_POST))
        report(c, PLAIT_VERIFY_BAD_STEP, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): flags 0x%x (only POST: apply PRE with a COPY first)", rank,
               ch, t->idx, kind, st->flags);
    else if (st->flags & ~(unsigned)(PLAIT_STEP_PRE | PLAIT_STEP_POST))
        report(c, PLAIT_VERIFY_BAD_STEP, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): unknown flags 0x%x", rank, ch, t->idx, kind, st->flags);
    if ((reads && st->src_off > UINT64_MAX - st->count) || (writes && st->dst_off > UINT64_MAX - st->count)) {
        report(c, PLAIT_VERIFY_OUT_OF_BOUNDS, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): offset + count overflows 64 bits", rank, ch, t->idx, kind);
        return 0;
    }
    if (writes && st->dst_buf == PLAIT_BUF_INPUT)
        report(c, PLAIT_VERIFY_BAD_STEP, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): writes INPUT[%" PRIu64 ", %" PRIu64
               ") (the user's send buffer is read-only)",
               rank, ch, t->idx, kind, st->dst_off, st->dst_off + st->count);
    if (reads && writes) {
        uint64_t as, ad;
        int ss = resolve(c, rank, st->src_buf, &as), sd = resolve(c, rank, st->dst_buf, &ad);
        uint64_t s0 = st->src_off + as, d0 = st->dst_off + ad;
        if (plait_step_is_sendrecv(st->kind)) {
            /* its halves run concurrently: what is sent must not be what is
             * being received, not even in place */
            if (ss == sd && s0 < d0 + st->count && d0 < s0 + st->count)
                report(c, PLAIT_VERIFY_BAD_STEP, rank, ch, t->idx,
                       "rank %d channel %d step %" PRIu64 " (%s): %s[%" PRIu64 ", +%" PRIu64 ") and %s[%" PRIu64
                       ", +%" PRIu64 ") overlap (the receive half would overwrite what the send half has yet to "
                       "send: the data sent would depend on the timing)",
                       rank, ch, t->idx, kind, buf_name(st->src_buf), st->src_off, st->count,
                       buf_name(st->dst_buf), st->dst_off, st->count);
        } else if (ss == sd && s0 != d0 && s0 < d0 + st->count && d0 < s0 + st->count)
            report(c, PLAIT_VERIFY_BAD_STEP, rank, ch, t->idx,
                   "rank %d channel %d step %" PRIu64 " (%s): %s[%" PRIu64 ", +%" PRIu64 ") and %s[%" PRIu64
                   ", +%" PRIu64 ") overlap partially (the executor allows only dst == src exactly)",
                   rank, ch, t->idx, kind, buf_name(st->src_buf), st->src_off, st->count, buf_name(st->dst_buf),
                   st->dst_off, st->count);
    }
    if (plait_step_recvs(st->kind)) {
        if (!check_peer(c, t, st->recv_peer, 0))
            return 0;
        t->fin = fifo_get(c, st->recv_peer, rank, ch);
    }
    if (plait_step_sends(st->kind)) {
        if (!check_peer(c, t, st->send_peer, 1))
            return 0;
        t->fout = fifo_get(c, rank, st->send_peer, ch);
    }
    return !c->oom;
}

/* R = post(pre(A) OP B) interval by interval (A and B cover the same range). */
static void reduce_local(struct vctx *c, const struct segv *A, const struct segv *B, unsigned flags, struct segv *R)
{
    size_t i = 0, j = 0;
    uint64_t pos = 0;
    R->n = 0;
    while (i < A->n && j < B->n) {
        const struct seg *a = &A->v[i], *b = &B->v[j];
        const uint64_t end = plait_umin(a->hi, b->hi);
        uint32_t na = (flags & PLAIT_STEP_PRE) ? node_wrap(c, NODE_PRE, a->node) : a->node;
        uint32_t node = node_sum(c, na, b->node, b->delta - a->delta);
        if (flags & PLAIT_STEP_POST)
            node = node_wrap(c, NODE_POST, node);
        segv_push(c, R, pos, end, node, a->delta, -1);
        pos = end;
        if (a->hi == end)
            i++;
        if (b->hi == end)
            j++;
    }
}

static void apply_flags(struct vctx *c, struct segv *L, unsigned flags)
{
    if (!(flags & (PLAIT_STEP_PRE | PLAIT_STEP_POST)))
        return;
    for (size_t k = 0; k < L->n; k++)
        L->v[k].node = node_flags(c, L->v[k].node, flags);
}

/* A step with PRE applies the pre-op to src, read into L from src_buf[off ..):
 * that must be the rank's own contribution (or something not yet written,
 * reported as such), never data that came from another rank. A barrier's data
 * is never read, so its pre-op is not checked (as in the output check). */
static void check_pre(struct vctx *c, struct task *t, uint64_t off, const struct segv *L)
{
    if (!(t->st.flags & PLAIT_STEP_PRE) || (t->reported & R_PRE) || c->coll == PLAIT_COLL_BARRIER)
        return;
    const int rank = task_rank(c, t), ch = task_ch(c, t);
    for (size_t k = 0; k < L->n; k++) {
        const int32_t owner = c->nodes[L->v[k].node].owner;
        if (owner == OWNER_NONE || owner == rank)
            continue;
        char whose[64];
        if (owner == OWNER_MIXED)
            snprintf(whose, sizeof(whose), "contributions of several ranks");
        else
            snprintf(whose, sizeof(whose), "rank %d's contribution", (int)owner);
        t->reported |= R_PRE;
        report(c, PLAIT_VERIFY_FOREIGN_PRE, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s): applies the pre-op to %s[%" PRIu64 ", %" PRIu64
               "), which holds %s (each rank must apply the pre-op to its own contribution: premulsum scales by "
               "the scalar of the rank that contributed)",
               rank, ch, t->idx, plait_step_kind_name(t->st.kind), buf_name(t->st.src_buf), off + L->v[k].lo,
               off + L->v[k].hi, whose);
        return;
    }
}

/* A COPY step, whole: the executor skips it when src and dst are the same
 * memory and it has no flags. */
static void step_copy(struct vctx *c, struct task *t)
{
    const struct plait_step *st = &t->st;
    if (st->count == 0)
        return;
    const int rank = task_rank(c, t);
    uint64_t as, ad;
    if (resolve(c, rank, st->src_buf, &as) == resolve(c, rank, st->dst_buf, &ad) && st->src_off + as == st->dst_off + ad &&
        !(st->flags & (PLAIT_STEP_PRE | PLAIT_STEP_POST)))
        return;
    buf_read(c, t, st->src_buf, st->src_off, st->count, &c->la);
    check_pre(c, t, st->src_off, &c->la);
    apply_flags(c, &c->la, st->flags);
    buf_write(c, t, st->dst_buf, st->dst_off, st->count, &c->la);
}

/* A REDUCE step, whole: dst = post(pre(src) OP dst). */
static void step_reduce(struct vctx *c, struct task *t)
{
    const struct plait_step *st = &t->st;
    if (st->count == 0)
        return;
    buf_read(c, t, st->src_buf, st->src_off, st->count, &c->la);
    check_pre(c, t, st->src_off, &c->la);
    buf_read(c, t, st->dst_buf, st->dst_off, st->count, &c->lb);
    reduce_local(c, &c->la, &c->lb, st->flags, &c->lr);
    buf_write(c, t, st->dst_buf, st->dst_off, st->count, &c->lr);
}

/* Moves `len` elements (nfull pieces of P, then one of `last`) of the current
 * step: the data effect of the executor's per-piece switch. */
static void step_move(struct vctx *c, struct task *t, uint64_t len, uint64_t nfull, uint64_t last)
{
    const struct plait_step *st = &t->st;
    const uint64_t po = t->done;
    struct segv *A = &c->la, *B = &c->lb, *R = &c->lr;
    const struct segv *out = NULL;
    if (plait_step_reads_src(st->kind)) {
        buf_read(c, t, st->src_buf, st->src_off + po, len, A);
        check_pre(c, t, st->src_off + po, A);
    }
    if (plait_step_recvs(st->kind))
        fifo_pop(c, &c->fifos[t->fin], len, nfull + (last ? 1 : 0), B);
    switch (st->kind) {
    case PLAIT_STEP_SEND:
        apply_flags(c, A, st->flags);
        out = A;
        break;
    case PLAIT_STEP_RECV:
    case PLAIT_STEP_RECV_COPY_SEND:
        out = B;
        break;
    default: /* the three RECV_REDUCE kinds */
        reduce_local(c, A, B, st->flags, R);
        out = R;
        break;
    }
    if (plait_step_writes_dst(st->kind))
        buf_write(c, t, st->dst_buf, st->dst_off + po, len, out);
    if (plait_step_sends(st->kind))
        fifo_push(c, &c->fifos[t->fout], out, len, nfull, last, t->idx, st->kind);
}

/* Cuts a batch of received pieces (*len elements: *nfull pieces of P, then
 * one of *last) down to the prefix whose sizes match what the sender's pieces
 * hold. At the first piece that differs (the executor's "mismatched
 * operations"), reports it, fails the task and returns 0. `done`: elements of
 * the step received before this batch. */
static int match_prefix(struct vctx *c, struct task *t, const struct fifo *fin, uint64_t done, uint64_t *len,
                        uint64_t *nfull, uint64_t *last)
{
    const struct plait_step *st = &t->st;
    const int rank = task_rank(c, t), ch = task_ch(c, t);
    uint64_t want = 0, got = 0;
    const struct grp *g = NULL;
    const uint64_t m = fifo_match(c, fin, *nfull, *last, &want, &got, &g);
    if (m == 0) {
        report(c, PLAIT_VERIFY_MISMATCH, rank, ch, t->idx,
               "rank %d channel %d step %" PRIu64 " (%s, count %" PRIu64 "): piece %" PRIu64 " should hold %" PRIu64
               " elements but rank %d sent %" PRIu64 " (its step %" PRIu64 ", %s): the two ends cut the data "
               "differently",
               rank, ch, t->idx, plait_step_kind_name(st->kind), st->count, done / c->P, want, st->recv_peer, got,
               g->step, plait_step_kind_name(g->kind));
        t->state = T_FAILED;
        return 0;
    }
    if (m < *nfull + (*last ? 1 : 0)) { /* the matching prefix is all full pieces */
        *len = m * c->P;
        *nfull = m;
        *last = 0;
    }
    return 1;
}

/* The next batch of a half with `rem` elements left, of at most `room`
 * pieces: *len elements, *nfull pieces of P, then one of *last. */
static void cut_batch(const struct vctx *c, uint64_t rem, uint64_t room, uint64_t *len, uint64_t *nfull,
                      uint64_t *last)
{
    const uint64_t prem = rem / c->P + (rem % c->P ? 1 : 0);
    *len = room >= prem ? rem : room * c->P;
    *nfull = *len / c->P;
    *last = *len % c->P;
}

/* Advances a SENDRECV step as far as it goes now: its send half moves as many
 * pieces as there is credit towards send_peer, reading src as it stands when
 * they go; its receive half as many as recv_peer has filled, writing dst.
 * Neither waits for the other. Returns 1 when both halves are complete, 0
 * when the task must wait (t->wait says for what), -1 when it failed. */
static int sendrecv_run(struct vctx *c, struct task *t)
{
    const struct plait_step *st = &t->st;
    for (;;) {
        int moved = 0;
        if (t->done < st->count) {
            struct fifo *fout = &c->fifos[t->fout];
            if (fout->pieces < c->S) {
                uint64_t len, nfull, last;
                cut_batch(c, st->count - t->done, c->S - fout->pieces, &len, &nfull, &last);
                buf_read(c, t, st->src_buf, st->src_off + t->done, len, &c->la);
                fifo_push(c, &c->fifos[t->fout], &c->la, len, nfull, last, t->idx, st->kind);
                t->done += len;
                c->res->batches++;
                wake(c, st->send_peer, task_ch(c, t)); /* data for it */
                moved = 1;
            }
        }
        if (t->rdone < st->count) {
            struct fifo *fin = &c->fifos[t->fin];
            if (fin->pieces) {
                uint64_t len, nfull, last;
                cut_batch(c, st->count - t->rdone, fin->pieces, &len, &nfull, &last);
                if (!match_prefix(c, t, fin, t->rdone, &len, &nfull, &last))
                    return -1;
                fifo_pop(c, fin, len, nfull + (last ? 1 : 0), &c->lb);
                if (st->kind == PLAIT_STEP_SENDRECV_REDUCE) {
                    /* dst = post(dst OP received) */
                    buf_read(c, t, st->dst_buf, st->dst_off + t->rdone, len, &c->la);
                    reduce_local(c, &c->la, &c->lb, st->flags & PLAIT_STEP_POST, &c->lr);
                    buf_write(c, t, st->dst_buf, st->dst_off + t->rdone, len, &c->lr);
                } else {
                    buf_write(c, t, st->dst_buf, st->dst_off + t->rdone, len, &c->lb);
                }
                t->rdone += len;
                c->res->batches++;
                wake(c, st->recv_peer, task_ch(c, t)); /* credit for it */
                moved = 1;
            }
        }
        if (c->oom)
            return -1;
        if (t->done >= st->count && t->rdone >= st->count)
            return 1;
        if (!moved) {
            t->wait = (uint8_t)((t->done < st->count ? W_CREDIT : 0) | (t->rdone < st->count ? W_DATA : 0));
            return 0;
        }
    }
}

/* Runs a task until it waits, finishes or fails. */
static void task_run(struct vctx *c, struct task *t)
{
    const int rank = task_rank(c, t), ch = task_ch(c, t);
    for (;;) {
        if (c->oom || c->stop)
            return;
        if (!t->has_step) {
            if (c->res->steps >= c->max_steps) {
                c->stop = 1;
                report(c, PLAIT_VERIFY_LIMIT, rank, ch, t->idx,
                       "stopped after %" PRIu64 " steps (max_steps); the schedule may be endless", c->res->steps);
                return;
            }
            c->args.rank = rank;
            memset(&t->st, 0, sizeof(t->st));
            if (!c->cfg->gen(&c->args, ch, t->idx, &t->st)) {
                t->state = T_DONE;
                return;
            }
            c->res->steps++;
            t->has_step = 1;
            t->done = 0;
            t->rdone = 0;
            t->reported = 0;
            if (!step_check(c, t)) {
                t->state = T_FAILED;
                return;
            }
        }
        const struct plait_step *st = &t->st;
        if (st->kind == PLAIT_STEP_COPY || st->kind == PLAIT_STEP_REDUCE) {
            if (st->kind == PLAIT_STEP_COPY)
                step_copy(c, t);
            else
                step_reduce(c, t);
            t->has_step = 0;
            t->idx++;
            continue;
        }
        if (plait_step_is_sendrecv(st->kind) && st->count) {
            const int r = sendrecv_run(c, t);
            if (r < 0) /* failed (a mismatch, reported) or out of memory */
                return;
            if (r == 0) {
                t->state = T_BLOCKED;
                return;
            }
            t->has_step = 0;
            t->idx++;
            continue;
        }
        if (t->done >= st->count) {
            t->has_step = 0;
            t->idx++;
            continue;
        }
        const uint64_t rem = st->count - t->done;
        const uint64_t prem = rem / c->P + (rem % c->P ? 1 : 0);
        uint64_t k = prem;
        struct fifo *fin = NULL, *fout = NULL;
        if (plait_step_recvs(st->kind)) {
            fin = &c->fifos[t->fin];
            if (fin->pieces == 0) {
                t->state = T_BLOCKED;
                t->wait = W_DATA;
                return;
            }
            k = plait_umin(k, fin->pieces);
        }
        if (plait_step_sends(st->kind)) {
            fout = &c->fifos[t->fout];
            if (fout->pieces >= c->S) {
                t->state = T_BLOCKED;
                t->wait = W_CREDIT;
                return;
            }
            k = plait_umin(k, c->S - fout->pieces);
        }
        uint64_t len = k == prem ? rem : k * c->P;
        uint64_t nfull = len / c->P, last = len % c->P;
        if (fin && !match_prefix(c, t, fin, t->done, &len, &nfull, &last))
            return;
        step_move(c, t, len, nfull, last);
        t->done += len;
        c->res->batches++;
        if (fin)
            wake(c, st->recv_peer, ch); /* credit for it */
        if (fout)
            wake(c, st->send_peer, ch); /* data for it */
    }
}

/* ------------------------------------------------------------------ output check */

static void flatten(struct vctx *c, uint32_t node, uint64_t shift, struct flat *f)
{
    memset(f, 0, sizeof(*f));
    c->nleaves = 0;
    size_t sp = 0;
    void *v = c->stack;
    if (grow(c, &v, &c->stack_cap, 1, sizeof(*c->stack)))
        return;
    c->stack = v;
    c->stack[sp++] = (struct fentry){.node = node, .npre = 0, .shift = shift, .under = 0};
    while (sp) {
        const struct fentry e = c->stack[--sp];
        const struct vnode *nd = &c->nodes[e.node];
        v = c->stack;
        if (grow(c, &v, &c->stack_cap, sp + 2, sizeof(*c->stack)))
            return;
        c->stack = v;
        switch (nd->type) {
        case NODE_LEAF:
            v = c->leaves;
            if (grow(c, &v, &c->leaves_cap, c->nleaves + 1, sizeof(*c->leaves)))
                return;
            c->leaves = v;
            c->leaves[c->nleaves++] = (struct leaf){.rank = (int32_t)nd->a, .npre = e.npre, .shift = e.shift};
            break;
        case NODE_POISON:
            f->poison++;
            break;
        case NODE_PRE:
            c->stack[sp++] = (struct fentry){.node = nd->a, .npre = e.npre + 1, .shift = e.shift, .under = 1};
            break;
        case NODE_POST:
            if (e.under)
                f->post_inner++;
            else
                f->post_top++;
            c->stack[sp++] = (struct fentry){.node = nd->a, .npre = e.npre, .shift = e.shift, .under = e.under};
            break;
        case NODE_SUM:
            c->stack[sp++] = (struct fentry){.node = nd->b, .npre = e.npre, .shift = e.shift + nd->shift, .under = 1};
            c->stack[sp++] = (struct fentry){.node = nd->a, .npre = e.npre, .shift = e.shift, .under = 1};
            break;
        default:
            break;
        }
    }
    f->nleaves = c->nleaves;
}

/* Whether the flattened content (c->leaves, f) is what e asks for. */
static int flat_ok(struct vctx *c, const struct flat *f, const struct expect *e)
{
    int ok = f->poison == 0 && (e->post == ANY_TIMES || (f->post_top == e->post && f->post_inner == 0));
    if (!e->is_all)
        return ok && f->nleaves == 1 && c->leaves[0].rank == e->q && c->leaves[0].shift == e->shift &&
               c->leaves[0].npre == e->pre;
    int distinct = 0;
    for (size_t i = 0; i < f->nleaves; i++) {
        const struct leaf *l = &c->leaves[i];
        if (c->rank_cnt[l->rank]++ == 0)
            distinct++;
        else if (!e->allow_dup)
            ok = 0;
        if (l->shift != e->shift || (e->pre != ANY_TIMES && l->npre != e->pre))
            ok = 0;
    }
    for (size_t i = 0; i < f->nleaves; i++)
        c->rank_cnt[c->leaves[i].rank] = 0;
    return ok && distinct == c->n;
}

/* Too many contributions to be worth expanding (a duplicated subtree can
 * double at every step). */
static int too_many(const struct vctx *c, uint32_t nleaves)
{
    return (uint64_t)nleaves > 4 * (uint64_t)c->n + 4;
}

static int content_ok(struct vctx *c, uint32_t node, uint64_t delta, const struct expect *e)
{
    struct vnode *nd = &c->nodes[node];
    if (e->is_all && e->allow_dup ? nd->nleaves < (uint32_t)c->n || too_many(c, nd->nleaves)
                                  : nd->nleaves != (e->is_all ? (uint32_t)c->n : 1u))
        return 0;
    const uint64_t key = e->shift - delta;
    if (e->is_all && nd->memo && nd->memo_key == key)
        return nd->memo == 1;
    struct flat f;
    flatten(c, node, delta, &f);
    int ok = !c->oom && flat_ok(c, &f, e);
    if (e->is_all) {
        nd = &c->nodes[node];
        nd->memo = ok ? 1 : 2;
        nd->memo_key = key;
    }
    return ok;
}

/* Appends to buf (of len bytes) at *o, never past the end. */
static void cat(char *buf, size_t len, size_t *o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void cat(char *buf, size_t len, size_t *o, const char *fmt, ...)
{
    if (*o >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *o, len - *o, fmt, ap);
    va_end(ap);
    if (k > 0)
        *o += (size_t)k;
}

/* What is wrong with a content, in words. */
static void describe(struct vctx *c, uint32_t node, uint64_t delta, const struct expect *e, char *buf, size_t len)
{
    size_t o = 0;
    char idx[48], idx2[48], ranks[256];
    buf[0] = '\0';
    if (node == c->poison) {
        cat(buf, len, &o, "holds data read before anything wrote it");
        return;
    }
    const uint32_t nl = c->nodes[node].nleaves;
    if (too_many(c, nl)) {
        cat(buf, len, &o, "holds %s%u contributions where %d %s expected", nl == UINT32_MAX ? "over " : "", nl,
            e->is_all ? c->n : 1, e->is_all && c->n > 1 ? "are" : "is");
        return;
    }
    struct flat f;
    flatten(c, node, delta, &f);
    if (c->oom)
        return;
    if (f.poison)
        cat(buf, len, &o, "holds data read before anything wrote it (%u time%s); ", f.poison,
            f.poison > 1 ? "s" : "");
    size_t bad_shift = 0, bad_pre = 0;
    const struct leaf *first_shift = NULL, *first_pre = NULL;
    for (size_t i = 0; i < f.nleaves; i++) {
        const struct leaf *l = &c->leaves[i];
        c->rank_cnt[l->rank]++;
        if (l->shift != e->shift && !bad_shift++)
            first_shift = l;
        if (e->pre != ANY_TIMES && l->npre != e->pre && !bad_pre++)
            first_pre = l;
    }
    if (e->is_all) {
        int missing = 0, dup = 0;
        for (int r = 0; r < c->n; r++) {
            missing += c->rank_cnt[r] == 0;
            dup += c->rank_cnt[r] > 1;
        }
        if (missing) {
            fmt_ranks(c, is_zero, ranks, sizeof(ranks));
            cat(buf, len, &o, "missing the contribution of rank%s %s; ", missing > 1 ? "s" : "", ranks);
        }
        if (dup) {
            fmt_ranks(c, is_many, ranks, sizeof(ranks));
            cat(buf, len, &o, "duplicated contribution of rank%s %s; ", dup > 1 ? "s" : "", ranks);
        }
    } else if (f.nleaves != 1) {
        fmt_ranks(c, is_nonzero, ranks, sizeof(ranks));
        cat(buf, len, &o, "holds %zu contributions (ranks %s) where one copy is expected; ", f.nleaves, ranks);
    } else if (c->leaves[0].rank != e->q) {
        cat(buf, len, &o, "holds rank %d's data instead of rank %d's; ", c->leaves[0].rank, e->q);
    }
    if (bad_shift)
        cat(buf, len, &o, "wrong elements: rank %d's %s instead of %s%s; ", first_shift->rank,
            fmt_index(first_shift->shift, idx, sizeof(idx)), fmt_index(e->shift, idx2, sizeof(idx2)),
            bad_shift > 1 ? " (and others)" : "");
    if (bad_pre)
        cat(buf, len, &o, "pre-op applied %u time%s to rank %d's contribution (expected %u)%s; ", first_pre->npre,
            first_pre->npre == 1 ? "" : "s", first_pre->rank, e->pre, bad_pre > 1 ? " (and others)" : "");
    if (e->post != ANY_TIMES && f.post_top != e->post)
        cat(buf, len, &o, "post-op applied %u time%s (expected %u); ", f.post_top, f.post_top == 1 ? "" : "s",
            e->post);
    if (e->post != ANY_TIMES && f.post_inner)
        cat(buf, len, &o, "post-op applied to a partial result that was reduced further; ");
    fmt_ranks(c, is_nonzero, ranks, sizeof(ranks));
    cat(buf, len, &o, "got %zu contribution%s from ranks %s", f.nleaves, f.nleaves == 1 ? "" : "s", ranks);
    for (size_t i = 0; i < f.nleaves; i++)
        c->rank_cnt[c->leaves[i].rank] = 0;
}

static void expect_text(const struct vctx *c, const struct expect *e, char *buf, size_t len)
{
    char idx[48];
    if (e->is_all && e->allow_dup)
        snprintf(buf, len, "every rank's %s reduced at least once (%d contributions or more)",
                 fmt_index(e->shift, idx, sizeof(idx)), c->n);
    else if (e->is_all)
        snprintf(buf, len, "every rank's %s reduced once (%d contributions)%s", fmt_index(e->shift, idx, sizeof(idx)),
                 c->n, e->pre == ANY_TIMES ? "" : ", pre-op once each, post-op once");
    else
        snprintf(buf, len, "rank %d's %s, unchanged", e->q, fmt_index(e->shift, idx, sizeof(idx)));
}

static void report_output(struct vctx *c, int rank, uint64_t lo, uint64_t hi, uint32_t node, uint64_t delta,
                          const struct expect *e)
{
    if (!want_text(c)) {
        report(c, PLAIT_VERIFY_WRONG_OUTPUT, rank, -1, UINT64_MAX, "-");
        return;
    }
    char what[1024], exp[256];
    if (node == 0)
        snprintf(what, sizeof(what), "never written");
    else
        describe(c, node, delta, e, what, sizeof(what));
    expect_text(c, e, exp, sizeof(exp));
    report(c, PLAIT_VERIFY_WRONG_OUTPUT, rank, -1, UINT64_MAX,
           "rank %d OUTPUT[%" PRIu64 ", %" PRIu64 "): %s; expected %s", rank, lo, hi, what, exp);
}

/* Checks [blo, bhi) of rank's OUTPUT against e. */
static void check_block(struct vctx *c, int rank, uint64_t blo, uint64_t bhi, const struct expect *e)
{
    uint64_t add;
    const struct store *s = store_of(c, rank, resolve(c, rank, PLAIT_BUF_OUTPUT, &add));
    const size_t n = store_n(s);
    uint64_t pos = blo;
    for (size_t k = store_find(s, blo + add); k < n && pos < bhi; k++) {
        const struct seg *g = store_at(s, k);
        if (g->lo >= bhi + add)
            break;
        const uint64_t a = umax(g->lo, blo + add) - add, b = plait_umin(g->hi, bhi + add) - add;
        if (a > pos)
            report_output(c, rank, pos, a, 0, 0, e);
        /* element x of OUTPUT is element x + add of the store */
        if (!content_ok(c, g->node, g->delta + add, e))
            report_output(c, rank, a, b, g->node, g->delta + add, e);
        pos = b;
        if (c->oom)
            return;
    }
    if (pos < bhi)
        report_output(c, rank, pos, bhi, 0, 0, e);
}

static void check_outputs(struct vctx *c)
{
    for (int r = 0; r < c->n && !c->oom; r++) {
        struct expect e = {.is_all = 1, .q = 0, .shift = 0, .pre = 1, .post = 1};
        switch (c->coll) {
        case PLAIT_COLL_REDUCE:
            if (r != c->root)
                continue; /* non-root outputs are unconstrained */
            break;
        case PLAIT_COLL_REDUCESCATTER:
            e.shift = (uint64_t)r * c->count;
            break;
        case PLAIT_COLL_BARRIER:
            e.pre = e.post = ANY_TIMES;
            e.allow_dup = 1;
            break;
        case PLAIT_COLL_BROADCAST:
            e = (struct expect){.is_all = 0, .q = c->root, .shift = 0, .pre = 0, .post = 0};
            break;
        case PLAIT_COLL_SCATTER:
            /* rank r's output is the root's input block r */
            e = (struct expect){.is_all = 0, .q = c->root, .shift = (uint64_t)r * c->count, .pre = 0, .post = 0};
            break;
        case PLAIT_COLL_GATHER:
            /* only the root has an output; its block q is rank q's input,
             * as in an allgather */
            if (r != c->root)
                continue;
            /* fall through */
        case PLAIT_COLL_ALLGATHER:
            for (int q = 0; q < c->n && !c->oom; q++) {
                e = (struct expect){.is_all = 0, .q = q, .shift = 0 - (uint64_t)q * c->count, .pre = 0, .post = 0};
                check_block(c, r, (uint64_t)q * c->count, (uint64_t)(q + 1) * c->count, &e);
            }
            continue;
        case PLAIT_COLL_ALLTOALL:
            /* block q of rank r's output is block r of rank q's input:
             * element x reads input_q[x - q*count + r*count] */
            for (int q = 0; q < c->n && !c->oom; q++) {
                e = (struct expect){
                    .is_all = 0, .q = q, .shift = ((uint64_t)r - (uint64_t)q) * c->count, .pre = 0, .post = 0};
                check_block(c, r, (uint64_t)q * c->count, (uint64_t)(q + 1) * c->count, &e);
            }
            continue;
        default:
            break;
        }
        check_block(c, r, 0, out_size(c, r), &e);
    }
}

/* Whether a(x + da) and b(x + db) are the same reduction, operand for operand,
 * up to the order of the two operands of each step (an IEEE add or multiply
 * is commutative, not associative). -1: gave up (budget spent). */
static int same_tree(const struct vctx *c, uint32_t a, uint64_t da, uint32_t b, uint64_t db, uint64_t *budget)
{
    if (a == b)
        return da == db || c->nodes[a].type == NODE_POISON;
    if (!*budget)
        return -1;
    --*budget;
    const struct vnode *x = &c->nodes[a], *y = &c->nodes[b];
    if (x->type != y->type || x->nleaves != y->nleaves)
        return 0;
    switch (x->type) {
    case NODE_LEAF:
        return x->a == y->a && da == db;
    case NODE_POISON:
        return 1;
    case NODE_PRE:
    case NODE_POST:
        return same_tree(c, x->a, da, y->a, db, budget);
    default: {
        int l = same_tree(c, x->a, da, y->a, db, budget);
        int r = l == 1 ? same_tree(c, x->b, da + x->shift, y->b, db + y->shift, budget) : l;
        if (r != 0)
            return r;
        l = same_tree(c, x->a, da, y->b, db + y->shift, budget);
        return l == 1 ? same_tree(c, x->b, da + x->shift, y->a, db, budget) : l;
    }
    }
}

/* The executor promises every rank of an allreduce the same bits: each
 * element must be the same reduction tree on every rank (the ring finalises a
 * chunk once and copies it). Compares every rank's OUTPUT with rank 0's. */
static void check_same_bits(struct vctx *c)
{
    uint64_t add0;
    const struct store *s0 = store_of(c, 0, resolve(c, 0, PLAIT_BUF_OUTPUT, &add0));
    const size_t n0 = store_n(s0);
    for (int r = 1; r < c->n && !c->oom; r++) {
        uint64_t add;
        const struct store *s = store_of(c, r, resolve(c, r, PLAIT_BUF_OUTPUT, &add));
        const size_t n = store_n(s);
        size_t i = store_find(s, add), j = store_find(s0, add0);
        while (i < n && j < n0) {
            const struct seg *g = store_at(s, i), *g0 = store_at(s0, j);
            const uint64_t a = umax(g->lo - add, g0->lo - add0), b = plait_umin(g->hi - add, g0->hi - add0);
            if (g->lo < add || g0->lo < add0 || a >= c->count)
                break;
            uint64_t budget = 16 * (uint64_t)c->n + 64;
            if (a < b && same_tree(c, g->node, g->delta + add, g0->node, g0->delta + add0, &budget) == 0 &&
                content_ok(c, g->node, g->delta + add, &(struct expect){.is_all = 1, .pre = 1, .post = 1}) &&
                content_ok(c, g0->node, g0->delta + add0, &(struct expect){.is_all = 1, .pre = 1, .post = 1})) {
                report(c, PLAIT_VERIFY_DIVERGENT, r, -1, UINT64_MAX,
                       "rank %d OUTPUT[%" PRIu64 ", %" PRIu64 "): reduced in another order than on rank 0 (both "
                       "hold every rank's input once): the ranks may not get the same bits",
                       r, a, b);
            }
            if (g->hi - add <= b)
                i++;
            if (g0->hi - add0 <= b)
                j++;
        }
    }
}

/* ------------------------------------------------------------------ deadlock */

static int step_serves(const struct plait_step *st, int target, int is_send)
{
    if (st->count == 0 || st->kind >= PLAIT_STEP_KINDS)
        return 0;
    return is_send ? plait_step_sends(st->kind) && st->send_peer == target
                   : plait_step_recvs(st->kind) && st->recv_peer == target;
}

/* Whether the half of p's current step that sends (is_send) or receives still
 * has elements to move. */
static int half_pending(const struct task *p, int is_send)
{
    if (!p->has_step)
        return 0;
    if (plait_step_is_sendrecv(p->st.kind) && !is_send)
        return p->rdone < p->st.count;
    return p->done < p->st.count;
}

/* Whether task p, from where it stands, will ever send to (is_send) or receive
 * from `target` on its channel. Unknown (a very long schedule) counts as yes. */
static int will_serve(struct vctx *c, const struct task *p, int target, int is_send)
{
    if (half_pending(p, is_send) && step_serves(&p->st, target, is_send))
        return 1;
    struct plait_step st;
    c->args.rank = task_rank(c, p);
    for (uint64_t i = p->idx + 1, k = 0; k < LOOKAHEAD_STEPS; i++, k++) {
        memset(&st, 0, sizeof(st));
        if (!c->cfg->gen(&c->args, task_ch(c, p), i, &st))
            return 0;
        if (step_serves(&st, target, is_send))
            return 1;
    }
    return 1;
}

enum { C_NONE = 0, C_NO_SEND, C_NO_RECV, C_PEER_FAILED };

static void task_where(const struct vctx *c, const struct task *t, char *buf, size_t len)
{
    if (plait_step_is_sendrecv(t->st.kind))
        snprintf(buf, len,
                 "rank %d channel %d step %" PRIu64 " (%s, %" PRIu64 " of %" PRIu64 " elements sent, %" PRIu64
                 " received)",
                 task_rank(c, t), task_ch(c, t), t->idx, plait_step_kind_name(t->st.kind), t->done, t->st.count,
                 t->rdone);
    else
        snprintf(buf, len, "rank %d channel %d step %" PRIu64 " (%s, %" PRIu64 " of %" PRIu64 " elements done)",
                 task_rank(c, t), task_ch(c, t), t->idx, plait_step_kind_name(t->st.kind), t->done, t->st.count);
}

static void task_wait_text(const struct vctx *c, const struct task *t, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    if (t->wait & W_DATA)
        cat(buf, len, &o, "waits for data from rank %d", t->st.recv_peer);
    if (t->wait & W_CREDIT)
        cat(buf, len, &o, "%s for credit from rank %d (its FIFO from rank %d holds %" PRIu64 " of %" PRIu64 " slots)",
            (t->wait & W_DATA) ? " and" : "waits", t->st.send_peer, task_rank(c, t), c->fifos[t->fout].pieces, c->S);
}

/* The wait-for graph of the stuck tasks: task i has an edge per thing it waits
 * for, 2i for data (to recv_peer's task) and 2i + 1 for credit (to
 * send_peer's); a SENDRECV step blocked on both of its halves has both. Every
 * other step waits for one thing at a time. */
#define EDGE_DATA 0
#define EDGE_CREDIT 1

static int edge_peer(const struct task *t, int e)
{
    return e == EDGE_DATA ? t->st.recv_peer : t->st.send_peer;
}

static int edge_waits(const struct task *t, int e)
{
    return t->state == T_BLOCKED && (t->wait & (e == EDGE_DATA ? W_DATA : W_CREDIT));
}

/* Strongly connected components of the graph (next[2i], next[2i + 1]; -1: no
 * edge), iteratively (Tarjan): comp[i] is i's component, numbered in the
 * order they complete. Returns how many, or -1 when memory runs out. */
static int wait_sccs(struct vctx *c, const int *next, int *comp)
{
    const int nt = c->ntasks;
    int *index = malloc(sizeof(int) * (size_t)nt), *low = malloc(sizeof(int) * (size_t)nt);
    int *stack = malloc(sizeof(int) * (size_t)nt), *call = malloc(sizeof(int) * (size_t)nt);
    uint8_t *pos = malloc((size_t)nt), *on = calloc((size_t)nt, 1);
    int ncomp = -1;
    if (!index || !low || !stack || !call || !pos || !on) {
        c->oom = 1;
        goto out;
    }
    ncomp = 0;
    for (int i = 0; i < nt; i++) {
        index[i] = -1;
        comp[i] = -1;
    }
    int counter = 0, sp = 0;
    for (int root = 0; root < nt; root++) {
        if (index[root] >= 0 || c->tasks[root].state != T_BLOCKED)
            continue;
        int depth = 0;
        call[depth++] = root;
        index[root] = low[root] = counter++;
        pos[root] = 0;
        stack[sp++] = root;
        on[root] = 1;
        while (depth) {
            const int v = call[depth - 1];
            if (pos[v] < 2) {
                const int w = next[2 * v + pos[v]++];
                if (w < 0)
                    continue;
                if (index[w] < 0) {
                    index[w] = low[w] = counter++;
                    pos[w] = 0;
                    stack[sp++] = w;
                    on[w] = 1;
                    call[depth++] = w;
                } else if (on[w] && index[w] < low[v]) {
                    low[v] = index[w];
                }
                continue;
            }
            depth--;
            if (depth && low[v] < low[call[depth - 1]])
                low[call[depth - 1]] = low[v];
            if (low[v] == index[v]) {
                int w;
                do {
                    w = stack[--sp];
                    on[w] = 0;
                    comp[w] = ncomp;
                } while (w != v);
                ncomp++;
            }
        }
    }
out:
    free(index);
    free(low);
    free(stack);
    free(call);
    free(pos);
    free(on);
    return ncomp;
}

/* Why a stuck task's wait on edge e is never served, in words. */
static void edge_why(struct vctx *c, const struct task *t, int e, int cause, char *buf, size_t len, size_t *o)
{
    const int peer = edge_peer(t, e);
    const struct task *p = &c->tasks[peer * c->nch + task_ch(c, t)];
    if (cause == C_NO_SEND)
        cat(buf, len, o, "receive with no matching send: rank %d %s", peer,
            p->state == T_DONE ? "finished its schedule on this channel" : "never sends to it again on this channel");
    else if (cause == C_NO_RECV)
        cat(buf, len, o, "send with no matching receive: rank %d %s, so the credit never returns", peer,
            p->state == T_DONE ? "finished its schedule on this channel"
                               : "never receives from it again on this channel");
    else if (cause == C_PEER_FAILED)
        cat(buf, len, o, "rank %d stopped on an error (reported above)", peer);
    else
        cat(buf, len, o, "rank %d is itself stuck at step %" PRIu64 " (%s)", peer, p->idx,
            plait_step_kind_name(p->st.kind));
}

/* Classifies every stuck task. A wait that can never be served (its peer
 * finished, failed, or never serves it again) is a cause; tasks on a circular
 * wait (a strongly connected component of the wait-for graph) are causes too,
 * a credit deadlock when every wait inside the component is for credit; the
 * rest are stuck behind them. */
static void analyse_deadlock(struct vctx *c)
{
    const int nt = c->ntasks;
    int *next = malloc(sizeof(int) * 2 * (size_t)nt);
    uint8_t *cause = calloc(2 * (size_t)nt, 1);
    int *comp = malloc(sizeof(int) * (size_t)nt);
    /* per component: its size, whether every wait inside it is for credit,
     * and a member to start its cycle from */
    int *comp_size = NULL, *comp_first = NULL;
    uint8_t *comp_credit = NULL, *seen = NULL;
    int *walk = NULL;
    if (!next || !cause || !comp) {
        c->oom = 1;
        goto out;
    }
    for (int i = 0; i < nt; i++) {
        const struct task *t = &c->tasks[i];
        for (int e = 0; e < 2; e++) {
            next[2 * i + e] = -1;
            if (!edge_waits(t, e))
                continue;
            const int pi = edge_peer(t, e) * c->nch + task_ch(c, t);
            const struct task *p = &c->tasks[pi];
            if (p->state == T_FAILED)
                cause[2 * i + e] = C_PEER_FAILED;
            else if (p->state == T_DONE || !will_serve(c, p, task_rank(c, t), e == EDGE_DATA))
                cause[2 * i + e] = e == EDGE_DATA ? C_NO_SEND : C_NO_RECV;
            else
                next[2 * i + e] = pi;
        }
        if (t->state == T_BLOCKED || t->state == T_FAILED)
            c->res->stuck_tasks++;
    }
    const int ncomp = wait_sccs(c, next, comp);
    if (ncomp < 0)
        goto out;
    comp_size = calloc((size_t)ncomp + 1, sizeof(int));
    comp_first = malloc(sizeof(int) * ((size_t)ncomp + 1));
    comp_credit = malloc((size_t)ncomp + 1);
    seen = calloc((size_t)nt, 1);
    walk = malloc(sizeof(int) * (size_t)nt);
    if (!comp_size || !comp_first || !comp_credit || !seen || !walk) {
        c->oom = 1;
        goto out;
    }
    for (int k = 0; k < ncomp; k++) {
        comp_first[k] = -1;
        comp_credit[k] = 1;
    }
    for (int i = 0; i < nt; i++) {
        if (comp[i] < 0)
            continue;
        comp_size[comp[i]]++;
        if (comp_first[comp[i]] < 0)
            comp_first[comp[i]] = i;
        for (int e = 0; e < 2; e++) {
            const int w = next[2 * i + e];
            if (w >= 0 && comp[w] == comp[i] && e == EDGE_DATA)
                comp_credit[comp[i]] = 0;
        }
    }
    for (int i = 0; i < nt && !c->oom; i++) {
        const struct task *t = &c->tasks[i];
        if (t->state != T_BLOCKED)
            continue;
        const int rank = task_rank(c, t), ch = task_ch(c, t);
        char where[200], wait[400], why[800];
        size_t o = 0;
        why[0] = '\0';
        if (want_text(c)) {
            task_where(c, t, where, sizeof(where));
            task_wait_text(c, t, wait, sizeof(wait));
        }
        int kind = -1;
        /* a wait nobody will ever serve: the data one first */
        for (int e = 0; e < 2 && kind < 0; e++)
            if (cause[2 * i + e] == C_NO_SEND || cause[2 * i + e] == C_NO_RECV) {
                kind = cause[2 * i + e] == C_NO_SEND ? PLAIT_VERIFY_NO_MATCHING_SEND : PLAIT_VERIFY_NO_MATCHING_RECV;
                edge_why(c, t, e, cause[2 * i + e], why, sizeof(why), &o);
            }
        if (kind < 0 && comp_size[comp[i]] > 1) {
            /* on a circular wait: show one cycle through the component,
             * walking its edges from its first member */
            const int id = comp[i];
            kind = comp_credit[id] ? PLAIT_VERIFY_CREDIT_DEADLOCK : PLAIT_VERIFY_CIRCULAR_WAIT;
            int nw = 0, v = comp_first[id];
            while (!seen[v]) {
                seen[v] = 1;
                walk[nw++] = v;
                const int w0 = next[2 * v + EDGE_DATA], w1 = next[2 * v + EDGE_CREDIT];
                v = w0 >= 0 && comp[w0] == id ? w0 : w1;
            }
            int from = 0;
            while (walk[from] != v)
                from++;
            for (int k = 0; k < nw; k++)
                seen[walk[k]] = 0;
            const int len = nw - from;
            cat(why, sizeof(why), &o, "%s: circular wait of %d tasks: ",
                comp_credit[id] ? "credit exhaustion (every FIFO on the cycle is full)" : "circular wait", len);
            for (int k = 0; k <= len; k++) {
                const int u = walk[from + k % len];
                if (k == 8 && k < len) {
                    cat(why, sizeof(why), &o, "...");
                    break;
                }
                if (k == len) {
                    cat(why, sizeof(why), &o, "rank %d", task_rank(c, &c->tasks[u]));
                    break;
                }
                const int nx = walk[from + (k + 1) % len];
                const int data = next[2 * u + EDGE_DATA] == nx;
                cat(why, sizeof(why), &o, "rank %d -%s-> ", task_rank(c, &c->tasks[u]), data ? "data" : "credit");
            }
            if (comp_size[id] > len)
                cat(why, sizeof(why), &o, " (%d tasks wait on each other in all)", comp_size[id]);
        }
        if (kind < 0) {
            kind = PLAIT_VERIFY_BLOCKED_BEHIND;
            for (int e = 0; e < 2; e++)
                if (edge_waits(t, e)) {
                    if (o)
                        cat(why, sizeof(why), &o, "; ");
                    edge_why(c, t, e, cause[2 * i + e], why, sizeof(why), &o);
                }
        }
        report(c, kind, rank, ch, t->idx, "deadlock: %s %s; %s", where, wait, why);
    }
out:
    free(next);
    free(cause);
    free(comp);
    free(comp_size);
    free(comp_first);
    free(comp_credit);
    free(seen);
    free(walk);
}

static void report_leftovers(struct vctx *c)
{
    for (size_t i = 0; i < c->nfifos; i++) {
        const struct fifo *f = &c->fifos[i];
        if (!f->pieces || c->tasks[(size_t)f->to * (size_t)c->nch + (size_t)f->ch].state != T_DONE)
            continue;
        const struct grp *g = &f->grp[f->grp_start];
        report(c, PLAIT_VERIFY_LEFTOVER, f->from, f->ch, g->step,
               "rank %d -> rank %d channel %d: %" PRIu64 " piece%s (%" PRIu64 " elements) sent from step %" PRIu64
               " (%s) on were never received: rank %d finished its schedule on this channel",
               (int)f->from, (int)f->to, (int)f->ch, f->pieces, f->pieces == 1 ? "" : "s", f->tail - f->head,
               g->step, plait_step_kind_name(g->kind), (int)f->to);
    }
}

/* ------------------------------------------------------------------ driver */

static plait_result_t check_config(const struct plait_verify_config *cfg)
{
    const struct plait_sched_args *a = &cfg->args;
    if (!cfg->gen)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sched_verify: no generator");
    if (a->nranks < 1 || a->nranks > MAX_RANKS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sched_verify: nranks %d is outside 1..%d", a->nranks,
                           MAX_RANKS);
    if (a->nchannels < 1 || a->nchannels > MAX_CHANNELS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sched_verify: nchannels %d is outside 1..%d",
                           a->nchannels, MAX_CHANNELS);
    if (cfg->piece_elems == 0 || cfg->piece_elems > (1ull << 62) || cfg->fifo_slots == 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_sched_verify: piece of %" PRIu64 " elements and %u slots (both must be >= 1)",
                           cfg->piece_elems, cfg->fifo_slots);
    if (a->chunk_elems == 0 || a->align_elems == 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_sched_verify: chunk_elems %" PRIu64 " and align_elems %" PRIu64 " must be >= 1",
                           a->chunk_elems, a->align_elems);
    switch (a->coll) {
    case PLAIT_COLL_ALLREDUCE:
    case PLAIT_COLL_BARRIER:
    case PLAIT_COLL_ALLGATHER:
    case PLAIT_COLL_REDUCESCATTER:
        break;
    case PLAIT_COLL_ALLTOALL:
        if (cfg->is_inplace)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                               "plait_sched_verify: alltoall has no in-place form (plait_alltoall refuses "
                               "sendbuff == recvbuff)");
        break;
    case PLAIT_COLL_BROADCAST:
    case PLAIT_COLL_REDUCE:
    case PLAIT_COLL_GATHER:
    case PLAIT_COLL_SCATTER:
        if (a->root < 0 || a->root >= a->nranks)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sched_verify: root %d is outside 0..%d", a->root,
                               a->nranks - 1);
        break;
    default:
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_sched_verify: collective %d has no result the verifier knows", a->coll);
    }
    if (a->count > (1ull << 62) / (uint64_t)a->nranks)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sched_verify: count %" PRIu64 " x %d ranks is too large",
                           a->count, a->nranks);
    if (cfg->ranks_per_node < 0 || cfg->max_reports < 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sched_verify: negative ranks_per_node or max_reports");
    return PLAIT_SUCCESS;
}

static void ctx_free(struct vctx *c)
{
    if (c->stores)
        for (size_t i = 0; i < (size_t)c->n * 3; i++)
            free(c->stores[i].v);
    for (size_t i = 0; i < c->nfifos; i++) {
        free(c->fifos[i].seg);
        free(c->fifos[i].grp);
    }
    free(c->stores);
    free(c->fifos);
    free(c->fkeys);
    free(c->fvals);
    free(c->nodes);
    free(c->tasks);
    free(c->queue);
    free(c->la.v);
    free(c->lb.v);
    free(c->lr.v);
    free(c->tmp.v);
    free(c->rank_cnt);
    free(c->scratch_size);
    free(c->nodemap);
    if (c->peer_lists)
        for (int r = 0; r < c->n; r++)
            free(c->peer_lists[r]);
    free(c->peer_lists);
    free(c->peerbuf);
    free(c->leaves);
    free(c->stack);
}

/* Every rank's input as LEAF(rank), where that rank's INPUT lives. */
static void init_inputs(struct vctx *c)
{
    struct segv *L = &c->tmp;
    for (int r = 0; r < c->n && !c->oom; r++) {
        const uint64_t size = in_size(c, r);
        if (!size)
            continue;
        uint64_t add;
        struct store *s = store_of(c, r, resolve(c, r, PLAIT_BUF_INPUT, &add));
        if (store_reserve(c, s, 1))
            return;
        /* element y = x + add holds input[x] = LEAF(y - add) */
        s->v[s->g0++] = (struct seg){.lo = add,
                                     .hi = add + size,
                                     .delta = 0 - add,
                                     .node = node_new(c, NODE_LEAF, (uint32_t)r, 0, 0),
                                     .writer = -1};
    }
    L->n = 0;
}

plait_result_t plait_sched_verify(const struct plait_verify_config *cfg, struct plait_verify_result *out)
{
    if (!cfg || !out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sched_verify: NULL config or result");
    plait_result_t status = check_config(cfg);
    if (status)
        return status;
    struct plait_verify_result res;
    memset(&res, 0, sizeof(res));
    struct vctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    struct vctx *c = &ctx;
    c->cfg = cfg;
    c->res = &res;
    c->args = cfg->args;
    c->n = cfg->args.nranks;
    c->nch = cfg->args.nchannels;
    c->coll = cfg->args.coll;
    c->root = cfg->args.root;
    c->count = cfg->args.count;
    c->P = cfg->piece_elems;
    c->S = cfg->fifo_slots;
    c->is_inplace = cfg->is_inplace != 0;
    c->max_reports = cfg->max_reports ? cfg->max_reports : DEFAULT_MAX_REPORTS;
    c->max_steps = cfg->max_steps ? cfg->max_steps : DEFAULT_MAX_STEPS;
    c->ntasks = c->n * c->nch;
    if ((uint64_t)c->ntasks > (uint64_t)INT32_MAX / 2) {
        status = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sched_verify: %d ranks x %d channels is too many",
                             c->n, c->nch);
        goto out;
    }
    c->tasks = calloc((size_t)c->ntasks, sizeof(*c->tasks));
    c->queue = malloc(sizeof(int) * (size_t)c->ntasks);
    c->stores = calloc((size_t)c->n * 3, sizeof(*c->stores));
    c->rank_cnt = calloc((size_t)c->n, sizeof(*c->rank_cnt));
    c->peerbuf = malloc(sizeof(int) * (size_t)c->n);
    c->peer_lists = calloc((size_t)c->n, sizeof(*c->peer_lists));
    c->nnodes = 1; /* node 0 means "nothing" */
    if (!c->tasks || !c->queue || !c->stores || !c->rank_cnt || !c->peerbuf || !c->peer_lists) {
        c->oom = 1;
        goto out;
    }
    /* The node map: the caller's, else ranks_per_node consecutive ranks per host. */
    if (!c->args.host_of && cfg->ranks_per_node > 0) {
        if (!(c->nodemap = malloc(sizeof(int32_t) * 2 * (size_t)c->n))) {
            c->oom = 1;
            goto out;
        }
        for (int r = 0; r < c->n; r++) {
            c->nodemap[r] = r / cfg->ranks_per_node;
            c->nodemap[c->n + r] = r % cfg->ranks_per_node;
        }
        c->args.nhosts = (c->n + cfg->ranks_per_node - 1) / cfg->ranks_per_node;
        c->args.host_of = c->nodemap;
        c->args.local_of = c->nodemap + c->n;
    } else if (!c->args.host_of) {
        c->args.nhosts = 1;
    }
    if (cfg->scratch) {
        if (!(c->scratch_size = malloc(sizeof(uint64_t) * (size_t)c->n))) {
            c->oom = 1;
            goto out;
        }
        for (int r = 0; r < c->n; r++) {
            c->args.rank = r;
            c->scratch_size[r] = cfg->scratch(&c->args);
        }
    }
    c->poison = node_new(c, NODE_POISON, 0, 0, 0);
    init_inputs(c);
    for (int i = 0; i < c->ntasks; i++) {
        c->tasks[i].ok_send = c->tasks[i].ok_recv = -1;
        c->tasks[i].fin = c->tasks[i].fout = NO_FIFO;
    }
    /* Channels never wait on each other (each has its own FIFOs), so they run
     * one after the other: a rank's buffers then see one channel's writes at a
     * time, which keeps each store's edits in one place. */
    for (int ch = 0; ch < c->nch && !c->oom && !c->stop; ch++) {
        for (int r = 0; r < c->n; r++)
            wake(c, r, ch);
        while (c->qlen && !c->oom && !c->stop) {
            struct task *t = &c->tasks[c->queue[c->qhead]];
            c->qhead = (c->qhead + 1) % (size_t)c->ntasks;
            c->qlen--;
            t->queued = 0;
            if (t->state == T_DONE || t->state == T_FAILED)
                continue;
            task_run(c, t);
        }
    }
    if (!c->oom && !c->stop) {
        int all_done = 1;
        for (int i = 0; i < c->ntasks; i++)
            all_done &= c->tasks[i].state == T_DONE;
        analyse_deadlock(c);
        report_leftovers(c);
        /* A run that did not finish has no result to compare: its outputs would
         * only repeat the deadlock or the error. */
        if (all_done) {
            check_outputs(c);
            if (c->coll == PLAIT_COLL_ALLREDUCE)
                check_same_bits(c);
        }
    }
    if (c->oom) {
        status = plait_error(PLAIT_ERR_SYSTEM, "plait_sched_verify: out of memory (%zu symbolic contents)", c->nnodes);
        goto out;
    }
    res.is_ok = res.total == 0;
    *out = res;
    memset(&res, 0, sizeof(res));
out:
    if (c->oom && !status)
        status = plait_error(PLAIT_ERR_SYSTEM, "plait_sched_verify: out of memory");
    plait_verify_result_free(&res);
    ctx_free(c);
    return status;
}

void plait_verify_result_free(struct plait_verify_result *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nfindings; i++)
        free(r->findings[i].text);
    free(r->findings);
    memset(r, 0, sizeof(*r));
}
