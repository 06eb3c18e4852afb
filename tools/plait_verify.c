/* plait-verify: proves schedules right with the symbolic verifier
 * (algorithms/verify.h), one case from the command line or the built-in sweep.
 *
 *   plait-verify --coll allreduce --algo ring --ranks 8 --count 1000000
 *   plait-verify --all            # every generator x collective x ranks x chunking
 *   plait-verify --list           # the algorithm table
 *
 * The generators come from the library's algorithm table (algorithms.h), so a
 * new generator is swept as soon as it is listed there. Exit status: 0 when
 * every case verified, 1 when one failed, 2 for a usage error. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "base/log.h"
#include "algorithms/verify.h"

/* The library's defaults (base/env.c): PLAIT_NSLOTS, PLAIT_BUFFSIZE,
 * PLAIT_CHUNK_SIZE, PLAIT_NCHANNELS, PLAIT_TREE_RADIX. */
#define DEF_SLOTS 4
#define DEF_BUFFSIZE (512 * 1024)
#define DEF_CHUNK_BYTES (512 * 1024)
#define DEF_CHANNELS 2
#define DEF_RADIX 2

/* The collectives whose result the verifier knows. */
static const int checked_colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_REDUCESCATTER, PLAIT_COLL_ALLGATHER,
                                    PLAIT_COLL_BROADCAST, PLAIT_COLL_REDUCE,        PLAIT_COLL_ALLTOALL,
                                    PLAIT_COLL_GATHER,    PLAIT_COLL_SCATTER,       PLAIT_COLL_BARRIER};
#define NCHECKED (sizeof(checked_colls) / sizeof(checked_colls[0]))

/* Node shapes the sweep tries for an algorithm (ranks per host; 0 = one host).
 * Node-aware algorithms get 1 (N x 1), 2 (8 x 2 at 16 ranks), 3 (4 x 3 at 12),
 * 16 (8 x 16 at 128) and n (1 x N); the others one host. */
static int algo_shapes(const struct plait_algorithm *a, int nranks, int *out)
{
    if (strcmp(a->name, "hier") != 0) {
        out[0] = 0;
        return 1;
    }
    int k = 0;
    /* every shape up to 32 ranks; beyond, the irregular 3 and the wide 16
     * (the 8 x 16 of the issue at 128); at 1000 and 1024, 16 */
    const int all[] = {1, 2, 3, 16, nranks}, mid[] = {3, 16}, big[] = {16};
    const int *cand = nranks <= 32 ? all : nranks <= 128 ? mid : big;
    const size_t ncand = nranks <= 32 ? 5 : nranks <= 128 ? 2 : 1;
    for (size_t i = 0; i < ncand; i++) {
        int dup = cand[i] > nranks || cand[i] < 1;
        for (int j = 0; j < k && !dup; j++)
            dup = out[j] == cand[i];
        if (!dup)
            out[k++] = cand[i];
    }
    return k;
}

/* The radices worth sweeping: only the k-nomial trees (tree broadcast and
 * reduce) read it; every other generator ignores it and is swept once. */
static int algo_radices(const struct plait_algorithm *a, int coll, int *out)
{
    if (strcmp(a->name, "tree") == 0 && (coll == PLAIT_COLL_BROADCAST || coll == PLAIT_COLL_REDUCE)) {
        out[0] = 2;
        out[1] = 3;
        out[2] = 4;
        return 3;
    }
    out[0] = DEF_RADIX;
    return 1;
}

static int coll_by_name(const char *name)
{
    for (size_t i = 0; i < NCHECKED; i++)
        if (strcmp(plait_coll_name(checked_colls[i]), name) == 0)
            return checked_colls[i];
    return -1;
}

static const struct plait_algorithm *algo_by_name(const char *name)
{
    for (int i = 0; i < PLAIT_ALGO_COUNT; i++)
        if (plait_algorithms[i].step && strcmp(plait_algorithms[i].name, name) == 0)
            return &plait_algorithms[i];
    return NULL;
}

/* One case: what the library would hand the generator, plus the FIFO shape. */
struct vcase {
    const struct plait_algorithm *algo;
    int coll, nranks, nchannels, root, radix, type_bytes, is_inplace;
    int ranks_per_node; /* node shape: 0 = one host */
    uint64_t count, chunk_elems, piece_elems;
    uint32_t slots;
};

/* The chunk as sched_args() computes it (core/enqueue.c): at most half the FIFO
 * (unless clamp is 0), a multiple of 16 bytes, at least 16 bytes. */
static uint64_t chunk_like_enqueue(uint64_t chunk_bytes, uint64_t slot_bytes, uint32_t slots, int type_bytes,
                                   int clamp)
{
    const uint64_t align = 16 / (uint64_t)type_bytes;
    const uint64_t half_fifo = (uint64_t)(slots / 2) * slot_bytes;
    if (clamp && chunk_bytes > half_fifo)
        chunk_bytes = half_fifo;
    uint64_t chunk = chunk_bytes / (uint64_t)type_bytes;
    chunk = chunk / align * align;
    return chunk > align ? chunk : align;
}

static void case_config(const struct vcase *k, struct plait_verify_config *cfg, int max_reports)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->gen = k->algo->step;
    cfg->args.coll = k->coll;
    cfg->args.nranks = k->nranks;
    cfg->args.root = k->root;
    cfg->args.count = k->count;
    cfg->args.nchannels = k->nchannels;
    cfg->args.chunk_elems = k->chunk_elems;
    cfg->args.align_elems = 16 / (uint64_t)k->type_bytes;
    cfg->args.radix = k->radix;
    cfg->piece_elems = k->piece_elems;
    cfg->fifo_slots = k->slots;
    cfg->max_reports = max_reports;
    cfg->is_inplace = k->is_inplace;
    cfg->peers = k->algo->peers;
    cfg->scratch = k->algo->scratch;
    cfg->ranks_per_node = k->ranks_per_node;
}

static void case_cmdline(const struct vcase *k, char *buf, size_t len)
{
    snprintf(buf, len,
             "plait-verify --algo %s --coll %s --ranks %d --count %" PRIu64 " --channels %d --chunk %" PRIu64
             " --piece %" PRIu64 " --slots %u --type-bytes %d --root %d --radix %d --ranks-per-node %d%s --no-clamp",
             k->algo->name, plait_coll_name(k->coll), k->nranks, k->count, k->nchannels, k->chunk_elems,
             k->piece_elems, k->slots, k->type_bytes, k->root, k->radix, k->ranks_per_node,
             k->is_inplace ? " --inplace" : "");
}

static void print_result(FILE *f, const struct plait_verify_result *r, size_t max_lines)
{
    for (size_t i = 0; i < r->nfindings && i < max_lines; i++)
        fprintf(f, "  [%s] %s\n", plait_verify_kind_name(r->findings[i].kind), r->findings[i].text);
    if (r->total > r->nfindings && r->nfindings <= max_lines)
        fprintf(f, "  ... %" PRIu64 " more\n", r->total - r->nfindings);
    fprintf(f, "  counts:");
    for (int k = 0; k < PLAIT_VERIFY_KINDS; k++)
        if (r->counts[k])
            fprintf(f, " %s=%" PRIu64, plait_verify_kind_name(k), r->counts[k]);
    fprintf(f, "\n");
}

/* ------------------------------------------------------------------ the sweep */

/* A chunking of the sweep: FIFO depth, pieces per chunk (chunk = that many
 * slots; slots/2 is "chunk = half the FIFO"), element size, channels. The
 * piece starts at one slot of `slot_bytes` and grows with the count so that a
 * channel takes at most `iters` iterations (the verifier's cost is per step). */
struct chunking {
    uint32_t slots;
    uint32_t pieces_per_chunk;
    int type_bytes;
    int nchannels;
    uint64_t slot_bytes;
    uint64_t iters;
    int is_inplace;
};

static const struct chunking chunkings[] = {
    /* chunk = half the FIFO, 4 slots (the library's shape), 64-byte slots */
    {.slots = 4, .pieces_per_chunk = 2, .type_bytes = 4, .nchannels = 1, .slot_bytes = 64, .iters = 8},
    /* 2 slots: chunk = half the FIFO = one piece; fp16; two channels; in place */
    {.slots = 2, .pieces_per_chunk = 1, .type_bytes = 2, .nchannels = 2, .slot_bytes = 64, .iters = 4,
     .is_inplace = 1},
    /* 8 slots, piece < chunk < half the FIFO (3 pieces); doubles; three channels */
    {.slots = 8, .pieces_per_chunk = 3, .type_bytes = 8, .nchannels = 3, .slot_bytes = 128, .iters = 3},
    /* 8 slots, chunk = half the FIFO (4 pieces); bytes; in place */
    {.slots = 8, .pieces_per_chunk = 4, .type_bytes = 1, .nchannels = 2, .slot_bytes = 64, .iters = 2,
     .is_inplace = 1},
    /* the library's defaults: 4 slots of 128 KiB, 512 KiB chunk clamped to half the FIFO */
    {.slots = DEF_SLOTS, .pieces_per_chunk = 0, .type_bytes = 4, .nchannels = DEF_CHANNELS,
     .slot_bytes = DEF_BUFFSIZE / DEF_SLOTS, .iters = 4},
};
#define NCHUNKINGS (sizeof(chunkings) / sizeof(chunkings[0]))

static const uint64_t sweep_counts[] = {0, 1, 7, (1u << 20) + 3, (1ull << 32) + 5};
#define NCOUNTS (sizeof(sweep_counts) / sizeof(sweep_counts[0]))

static int sweep_ranks(int *out)
{
    int n = 0;
    for (int r = 1; r <= 64; r++)
        out[n++] = r;
    out[n++] = 96;
    out[n++] = 128;
    out[n++] = 1000;
    out[n++] = 1024;
    return n;
}

/* Steps the sweep allows one case, roughly (the verifier does ~4 M steps/s):
 * larger counts get larger pieces instead of more iterations. */
#define CASE_STEP_BUDGET (1u << 20)

/* Fills k's piece and chunk from chunking h so that each channel takes at most
 * h->iters iterations, fewer when the rank count makes an iteration long. */
static void size_case(struct vcase *k, const struct chunking *h)
{
    const uint64_t tb = (uint64_t)k->type_bytes;
    const uint64_t n = (uint64_t)k->nranks;
    const uint64_t per_channel = (k->count + (uint64_t)h->nchannels - 1) / (uint64_t)h->nchannels;
    const uint64_t ranks_per_iter = k->coll == PLAIT_COLL_ALLREDUCE ? n : 1;
    /* per rank and iteration, roughly; alltoall: n for pairwise (Bruck's
     * n/2 log2 n is more); gather/scatter: n on the root, 1 elsewhere */
    const uint64_t steps_per_iter = k->coll == PLAIT_COLL_ALLREDUCE ? 2 * n
                                    : k->coll == PLAIT_COLL_REDUCESCATTER || k->coll == PLAIT_COLL_ALLGATHER ||
                                            k->coll == PLAIT_COLL_ALLTOALL
                                        ? n + 1
                                        : 2;
    uint64_t iters = CASE_STEP_BUDGET / (n * (uint64_t)h->nchannels * steps_per_iter);
    if (iters > h->iters)
        iters = h->iters;
    /* alltoall: two iterations show the chunk boundaries; more cost n^2 each */
    if (k->coll == PLAIT_COLL_ALLTOALL && iters > 2)
        iters = 2;
    if (iters < 1)
        iters = 1;
    const uint64_t ppc = h->pieces_per_chunk ? h->pieces_per_chunk : (h->slots / 2 ? h->slots / 2 : 1);
    uint64_t slot = h->slot_bytes;
    /* the smallest slot (a multiple of 64 bytes, as the library's) meeting the bound */
    uint64_t need = (per_channel + ranks_per_iter * iters * ppc - 1) / (ranks_per_iter * iters * ppc);
    need *= tb;
    if (need > slot)
        slot = (need + 63) / 64 * 64;
    k->piece_elems = slot / tb;
    uint64_t chunk_bytes = h->pieces_per_chunk ? ppc * slot : DEF_CHUNK_BYTES;
    if (chunk_bytes < ppc * slot)
        chunk_bytes = ppc * slot;
    k->chunk_elems = chunk_like_enqueue(chunk_bytes, slot, h->slots, k->type_bytes, 1);
}

/* Whether the sweep tries coll on nranks. Alltoall costs n^2 steps and
 * connections per iteration (and the verifier's peer check is O(n) a step):
 * every rank count up to 32, then 33, 48, 63, 64, 96 and 128; never 1000 or
 * 1024, which alone would take minutes. */
static int sweep_rank_count(int coll, int nranks)
{
    if (coll != PLAIT_COLL_ALLTOALL || nranks <= 32)
        return 1;
    return nranks == 33 || nranks == 48 || nranks == 63 || nranks == 64 || nranks == 96 || nranks == 128;
}

/* Steps of `rank` on channel 0 for case k, up to `cap`. */
static uint64_t probe_steps(const struct vcase *k, int rank, const int32_t *nodemap, uint64_t cap)
{
    struct plait_verify_config cfg;
    case_config(k, &cfg, 1);
    cfg.args.rank = rank;
    if (nodemap) {
        cfg.args.host_of = nodemap;
        cfg.args.local_of = nodemap + k->nranks;
        cfg.args.nhosts = (k->nranks + k->ranks_per_node - 1) / k->ranks_per_node;
    } else {
        cfg.args.nhosts = 1;
    }
    struct plait_step st;
    uint64_t i = 0;
    while (i < cap && k->algo->step(&cfg.args, 0, i, &st))
        i++;
    return i;
}

/* The sizing above knows the ring's shape; other generators take more or fewer
 * steps per iteration. Counts the steps of a few ranks and, when the case would
 * exceed the budget, grows the piece and the chunk together (the chunk stays
 * within half the FIFO) until it does not. */
static void calibrate_case(struct vcase *k)
{
    const int n = k->nranks;
    int32_t *map = NULL;
    if (k->ranks_per_node > 0 && (map = malloc(sizeof(int32_t) * 2 * (size_t)n)))
        for (int r = 0; r < n; r++) {
            map[r] = r / k->ranks_per_node;
            map[n + r] = r % k->ranks_per_node;
        }
    for (int round = 0; round < 4; round++) {
        const uint64_t cap = 4 * (uint64_t)CASE_STEP_BUDGET;
        const uint64_t s = probe_steps(k, 0, map, cap) + probe_steps(k, n / 2, map, cap) +
                           probe_steps(k, n - 1, map, cap);
        const uint64_t est = s * (uint64_t)n * (uint64_t)k->nchannels / 3;
        if (est <= 2 * (uint64_t)CASE_STEP_BUDGET || k->chunk_elems >= k->count)
            break;
        const uint64_t f = (est + CASE_STEP_BUDGET - 1) / CASE_STEP_BUDGET;
        k->piece_elems *= f;
        k->chunk_elems *= f;
    }
    free(map);
}

static struct vcase *build_sweep(const char *only_algo, size_t *ncases)
{
    int ranks[80];
    const int nr = sweep_ranks(ranks);
    size_t cap = 1024, n = 0;
    struct vcase *cases = malloc(cap * sizeof(*cases));
    if (!cases)
        return NULL;
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++) {
        const struct plait_algorithm *algo = &plait_algorithms[a];
        if (!algo->step || (only_algo && strcmp(algo->name, only_algo) != 0))
            continue;
        for (size_t ci = 0; ci < NCHECKED; ci++) {
            const int coll = checked_colls[ci];
            int radices[8];
            const int nradix = algo_radices(algo, coll, radices);
            for (int ri = 0; ri < nr; ri++) {
                const int nranks = ranks[ri];
                if (!algo->supports(coll, nranks))
                    continue;
                if (!sweep_rank_count(coll, nranks))
                    continue;
                int shapes[8];
                const int nshapes = algo_shapes(algo, nranks, shapes);
                for (int sh = 0; sh < nshapes; sh++)
                for (int x = 0; x < nradix; x++)
                    for (size_t hi = 0; hi < NCHUNKINGS; hi++) {
                        const struct chunking *h = &chunkings[hi];
                        for (size_t q = 0; q < NCOUNTS; q++) {
                            /* a barrier is a one-byte allreduce: one shape */
                            if (coll == PLAIT_COLL_BARRIER && (q != 1 || hi != 0))
                                continue;
                            /* 1000 and 1024 ranks: count 7 and 2^32 + 5, with the
                             * 2-slot and the library's chunkings (each case costs
                             * millions of steps at that size) */
                            if (nranks > 128 && ((q != 2 && q != 4) || (hi != 1 && hi != 4)))
                                continue;
                            if (n == cap) {
                                cap *= 2;
                                struct vcase *nc = realloc(cases, cap * sizeof(*cases));
                                if (!nc) {
                                    free(cases);
                                    return NULL;
                                }
                                cases = nc;
                            }
                            struct vcase *k = &cases[n++];
                            memset(k, 0, sizeof(*k));
                            k->algo = algo;
                            k->coll = coll;
                            k->nranks = nranks;
                            k->count = sweep_counts[q];
                            k->nchannels = h->nchannels;
                            k->slots = h->slots;
                            k->type_bytes = coll == PLAIT_COLL_BARRIER ? 1 : h->type_bytes;
                            k->is_inplace = h->is_inplace && coll != PLAIT_COLL_ALLTOALL; /* it has none */
                            k->radix = radices[x];
                            k->ranks_per_node = shapes[sh];
                            /* roots: 0, the last rank, and one in the middle */
                            k->root = (int)((hi * 7919u + q * 104729u) % (uint64_t)nranks);
                            if (hi == 0)
                                k->root = nranks - 1;
                            size_case(k, h);
                            calibrate_case(k);
                        }
                    }
            }
        }
    }
    *ncases = n;
    return cases;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct sweep {
    struct vcase *cases;
    size_t ncases;
    size_t next;
    size_t failed;
    uint64_t steps;
    int verbose;
    pthread_mutex_t lock;
};

static void *sweep_worker(void *arg)
{
    struct sweep *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        size_t i = s->next++;
        pthread_mutex_unlock(&s->lock);
        if (i >= s->ncases)
            return NULL;
        const struct vcase *k = &s->cases[i];
        struct plait_verify_config cfg;
        struct plait_verify_result r;
        case_config(k, &cfg, 8);
        const double t0 = now_s();
        plait_result_t res = plait_sched_verify(&cfg, &r);
        const double dt = now_s() - t0;
        char cmd[512];
        case_cmdline(k, cmd, sizeof(cmd));
        pthread_mutex_lock(&s->lock);
        if (res != PLAIT_SUCCESS) {
            s->failed++;
            printf("FAIL %s\n  could not run: %s\n", cmd, plait_last_error_get());
        } else {
            s->steps += r.steps;
            if (!r.is_ok) {
                s->failed++;
                printf("FAIL %s\n", cmd);
                print_result(stdout, &r, 4);
            } else if (s->verbose) {
                printf("ok   %s (%" PRIu64 " steps, %.3f s)\n", cmd, r.steps, dt);
            }
            plait_verify_result_free(&r);
        }
        fflush(stdout);
        pthread_mutex_unlock(&s->lock);
    }
}

static int run_sweep(const char *only_algo, int jobs, int verbose)
{
    struct sweep s;
    memset(&s, 0, sizeof(s));
    s.verbose = verbose;
    s.cases = build_sweep(only_algo, &s.ncases);
    if (!s.cases) {
        fprintf(stderr, "plait-verify: out of memory\n");
        return 1;
    }
    pthread_mutex_init(&s.lock, NULL);
    const double t0 = now_s();
    if (jobs < 1)
        jobs = 1;
    if (jobs > 64)
        jobs = 64;
    pthread_t th[64];
    int started = 0;
    for (int j = 1; j < jobs; j++)
        if (pthread_create(&th[started], NULL, sweep_worker, &s) == 0)
            started++;
    sweep_worker(&s);
    for (int j = 0; j < started; j++)
        pthread_join(th[j], NULL);
    const double dt = now_s() - t0;
    printf("%zu cases verified, %zu failed (%.1f s, %d thread%s, %" PRIu64 " steps)\n", s.ncases, s.failed, dt,
           started + 1, started ? "s" : "", s.steps);
    pthread_mutex_destroy(&s.lock);
    free(s.cases);
    return s.failed ? 1 : 0;
}

/* ------------------------------------------------------------------ command line */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: plait-verify --coll C --algo A --ranks N --count C [options]   verify one case\n"
            "       plait-verify --all [--algo A] [--jobs J] [--verbose]           the built-in sweep (of one algorithm)\n"
            "       plait-verify --list                                            the algorithm table\n"
            "options (sizes in elements unless said):\n"
            "  --channels K     channels (default %d)\n"
            "  --piece E        elements per FIFO slot (default %d bytes / type size)\n"
            "  --slots S        FIFO depth in slots (default %d)\n"
            "  --chunk E        elements per step per rank-chunk, before the library's clamp to half\n"
            "                   the FIFO and to 16-byte multiples (default %d bytes / type size)\n"
            "  --no-clamp       use --chunk as given (to reproduce a chunk larger than half the FIFO)\n"
            "  --type-bytes B   element size: 1, 2, 4, 8 (default 4); sets the 16-byte alignment\n"
            "  --root R         root of broadcast, reduce, gather and scatter (default 0)\n"
            "  --radix K        tree radix (default %d)\n"
            "  --ranks-per-node P  node shape: P consecutive ranks per host (default 0: one host)\n"
            "  --inplace        sendbuff and recvbuff alias as in NCCL's in-place calls (not alltoall)\n"
            "  --max-reports M  findings printed (default 20)\n"
            "collectives: allreduce reducescatter allgather broadcast reduce alltoall gather scatter\n"
            "             barrier\n",
            DEF_CHANNELS, DEF_BUFFSIZE / DEF_SLOTS, DEF_SLOTS, DEF_CHUNK_BYTES, DEF_RADIX);
}

static void list_algorithms(void)
{
    printf("%-8s %s\n", "name", "collectives it supports (of those the verifier checks)");
    for (int i = 0; i < PLAIT_ALGO_COUNT; i++) {
        const struct plait_algorithm *a = &plait_algorithms[i];
        if (!a->step)
            continue;
        printf("%-8s", a->name);
        for (size_t c = 0; c < NCHECKED; c++)
            if (a->supports(checked_colls[c], 2))
                printf(" %s", plait_coll_name(checked_colls[c]));
        printf("\n");
    }
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *coll_name = "allreduce", *algo_name = "ring";
    uint64_t ranks = 0, count = 0, channels = DEF_CHANNELS, chunk = 0, piece = 0, slots = DEF_SLOTS;
    uint64_t type_bytes = 4, root = 0, radix = DEF_RADIX, max_reports = 20, rpn = 0;
    uint64_t jobs = (uint64_t)sysconf(_SC_NPROCESSORS_ONLN);
    int all = 0, clamp = 1, inplace = 0, verbose = 0, have_ranks = 0, have_count = 0, have_algo = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes = 1;
        if (strcmp(o, "--all") == 0)
            all = 1, takes = 0;
        else if (strcmp(o, "--list") == 0) {
            list_algorithms();
            return 0;
        } else if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(o, "--no-clamp") == 0)
            clamp = 0, takes = 0;
        else if (strcmp(o, "--inplace") == 0)
            inplace = 1, takes = 0;
        else if (strcmp(o, "--verbose") == 0)
            verbose = 1, takes = 0;
        else if (strcmp(o, "--coll") == 0)
            coll_name = v, bad = !v;
        else if (strcmp(o, "--algo") == 0)
            algo_name = v, bad = !v, have_algo = 1;
        else if (strcmp(o, "--ranks") == 0)
            bad = parse_u64(v, &ranks), have_ranks = 1;
        else if (strcmp(o, "--count") == 0)
            bad = parse_u64(v, &count), have_count = 1;
        else if (strcmp(o, "--channels") == 0)
            bad = parse_u64(v, &channels);
        else if (strcmp(o, "--chunk") == 0)
            bad = parse_u64(v, &chunk);
        else if (strcmp(o, "--piece") == 0)
            bad = parse_u64(v, &piece);
        else if (strcmp(o, "--slots") == 0)
            bad = parse_u64(v, &slots);
        else if (strcmp(o, "--type-bytes") == 0)
            bad = parse_u64(v, &type_bytes);
        else if (strcmp(o, "--root") == 0)
            bad = parse_u64(v, &root);
        else if (strcmp(o, "--radix") == 0)
            bad = parse_u64(v, &radix);
        else if (strcmp(o, "--ranks-per-node") == 0)
            bad = parse_u64(v, &rpn);
        else if (strcmp(o, "--max-reports") == 0)
            bad = parse_u64(v, &max_reports);
        else if (strcmp(o, "--jobs") == 0)
            bad = parse_u64(v, &jobs);
        else {
            fprintf(stderr, "plait-verify: unknown option %s\n", o);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "plait-verify: %s needs a %s\n", o, takes ? "value" : "nothing");
            return 2;
        }
        i += takes;
    }
    if (all)
        return run_sweep(have_algo ? algo_name : NULL, (int)(jobs > 64 ? 64 : jobs), verbose);

    struct vcase k;
    memset(&k, 0, sizeof(k));
    k.algo = algo_by_name(algo_name);
    k.coll = coll_by_name(coll_name);
    if (!k.algo || k.coll < 0 || !have_ranks || !have_count) {
        fprintf(stderr, "plait-verify: %s\n",
                !k.algo      ? "unknown --algo (see --list)"
                : k.coll < 0 ? "unknown --coll"
                             : "--ranks and --count are required");
        usage(stderr);
        return 2;
    }
    if (ranks < 1 || ranks > (1u << 20) || channels < 1 || channels > 65535 || slots < 1 || slots > UINT32_MAX ||
        (type_bytes != 1 && type_bytes != 2 && type_bytes != 4 && type_bytes != 8) || root >= ranks) {
        fprintf(stderr, "plait-verify: --ranks, --channels, --slots, --type-bytes or --root out of range\n");
        return 2;
    }
    if (!k.algo->supports(k.coll, (int)ranks))
        fprintf(stderr, "plait-verify: note: %s does not claim to support %s on %d ranks; verifying anyway\n",
                k.algo->name, coll_name, (int)ranks);
    k.nranks = (int)ranks;
    k.count = count;
    k.nchannels = (int)channels;
    k.slots = (uint32_t)slots;
    k.type_bytes = (int)type_bytes;
    k.root = (int)root;
    k.radix = (int)radix;
    k.is_inplace = inplace;
    k.ranks_per_node = rpn > ranks ? (int)ranks : (int)rpn;
    k.piece_elems = piece ? piece : DEF_BUFFSIZE / DEF_SLOTS / type_bytes;
    const uint64_t chunk_bytes = chunk ? chunk * type_bytes : DEF_CHUNK_BYTES;
    k.chunk_elems = chunk_like_enqueue(chunk_bytes, k.piece_elems * type_bytes, k.slots, k.type_bytes, clamp);

    struct plait_verify_config cfg;
    struct plait_verify_result r;
    case_config(&k, &cfg, (int)(max_reports ? max_reports : 1));
    const double t0 = now_s();
    if (plait_sched_verify(&cfg, &r) != PLAIT_SUCCESS) {
        fprintf(stderr, "plait-verify: %s\n", plait_last_error_get());
        return 2;
    }
    const double dt = now_s() - t0;
    char cmd[512];
    case_cmdline(&k, cmd, sizeof(cmd));
    printf("%s\n", cmd);
    if (r.is_ok) {
        printf("ok (%" PRIu64 " steps, %" PRIu64 " batches, %" PRIu64 " symbolic contents, %.3f s)\n", r.steps,
               r.batches, r.nodes, dt);
    } else {
        printf("FAILED: %" PRIu64 " finding%s (%" PRIu64 " steps, %.3f s)\n", r.total, r.total == 1 ? "" : "s",
               r.steps, dt);
        print_result(stdout, &r, (size_t)max_reports);
    }
    int rc = r.is_ok ? 0 : 1;
    plait_verify_result_free(&r);
    return rc;
}
