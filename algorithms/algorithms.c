/* The algorithm table, PLAIT_ALGO parsing and the default selection rule. */
#include "algorithms/algorithms.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"

static int ring_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_ALLREDUCE || coll == PLAIT_COLL_BROADCAST || coll == PLAIT_COLL_REDUCE ||
           coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_BARRIER;
}

static int bruck_supports(int coll, int nranks)
{
    return coll == PLAIT_COLL_ALLGATHER || (coll == PLAIT_COLL_ALLTOALL && plait_bruck_alltoall_supports(nranks));
}

static int bruck_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    return a->coll == PLAIT_COLL_ALLTOALL ? plait_bruck_alltoall_step(a, channel, idx, out)
                                          : plait_bruck_step(a, channel, idx, out);
}

static uint64_t bruck_scratch(const struct plait_sched_args *a)
{
    return a->coll == PLAIT_COLL_ALLTOALL ? plait_bruck_alltoall_scratch(a) : plait_bruck_scratch(a);
}

static int ring_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    int cnt = 0;
    if (nranks > 1)
        plait_peers_add_distance(nranks, rank, 1, out, &cnt, max);
    return cnt;
}

static int no_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)nranks;
    (void)rank;
    (void)radix;
    (void)out;
    (void)max;
    return 0;
}

static int auto_supports(int coll, int nranks)
{
    (void)nranks;
    return plait_coll_is_scheduled(coll);
}

const struct plait_algorithm plait_algorithms[PLAIT_ALGO_COUNT] = {
    [PLAIT_ALGO_AUTO] = {.id = PLAIT_ALGO_AUTO, .name = "auto", .supports = auto_supports, .step = NULL,
                         .peers = no_peers, .scratch = NULL},
    [PLAIT_ALGO_RING] = {.id = PLAIT_ALGO_RING, .name = "ring", .supports = ring_supports, .step = plait_ring_step,
                         .peers = ring_peers, .scratch = NULL},
    [PLAIT_ALGO_TREE] = {.id = PLAIT_ALGO_TREE, .name = "tree", .supports = plait_tree_supports,
                         .step = plait_tree_step, .peers = plait_tree_peers, .scratch = plait_tree_scratch},
    [PLAIT_ALGO_BRUCK] = {.id = PLAIT_ALGO_BRUCK, .name = "bruck", .supports = bruck_supports, .step = bruck_step,
                          .peers = plait_bruck_peers, .scratch = bruck_scratch},
    [PLAIT_ALGO_RECURSIVE] = {.id = PLAIT_ALGO_RECURSIVE, .name = "recursive", .supports = plait_recursive_supports,
                              .step = plait_recursive_step, .peers = plait_recursive_peers,
                              .scratch = plait_recursive_scratch},
    [PLAIT_ALGO_PAT] = {.id = PLAIT_ALGO_PAT, .name = "pat", .supports = plait_pat_supports, .step = plait_pat_step,
                        .peers = plait_pat_peers, .scratch = plait_pat_scratch},
    [PLAIT_ALGO_HIER] = {.id = PLAIT_ALGO_HIER, .name = "hier", .supports = plait_hier_supports,
                         .step = plait_hier_step, .peers = plait_hier_peers, .scratch = plait_hier_scratch,
                         .all_pairs = 1},
    [PLAIT_ALGO_ONESHOT] = {.id = PLAIT_ALGO_ONESHOT, .name = "oneshot", .supports = plait_oneshot_supports,
                            .step = plait_oneshot_step, .peers = plait_oneshot_peers,
                            .scratch = plait_oneshot_scratch, .all_pairs = 1},
    [PLAIT_ALGO_TWOSHOT] = {.id = PLAIT_ALGO_TWOSHOT, .name = "twoshot", .supports = plait_twoshot_supports,
                            .step = plait_twoshot_step, .peers = plait_twoshot_peers,
                            .scratch = plait_twoshot_scratch, .all_pairs = 1},
    [PLAIT_ALGO_PAIRWISE] = {.id = PLAIT_ALGO_PAIRWISE, .name = "pairwise", .supports = plait_pairwise_supports,
                             .step = plait_pairwise_step, .peers = plait_pairwise_peers, .scratch = NULL,
                             .all_pairs = 1},
    [PLAIT_ALGO_LINEAR] = {.id = PLAIT_ALGO_LINEAR, .name = "linear", .supports = plait_linear_supports,
                           .step = plait_linear_step, .peers = plait_linear_peers, .scratch = NULL,
                           .all_pairs = 1},
    [PLAIT_ALGO_DISSEMINATION] = {.id = PLAIT_ALGO_DISSEMINATION, .name = "dissemination",
                                  .supports = plait_dissemination_supports, .step = plait_dissemination_step,
                                  .peers = plait_dissemination_peers, .scratch = plait_dissemination_scratch},
};

static const char *const coll_names[PLAIT_COLL_COUNT] = {
    [PLAIT_COLL_ALLREDUCE] = "allreduce", [PLAIT_COLL_BROADCAST] = "broadcast",
    [PLAIT_COLL_REDUCE] = "reduce",       [PLAIT_COLL_ALLGATHER] = "allgather",
    [PLAIT_COLL_REDUCESCATTER] = "reducescatter", [PLAIT_COLL_ALLTOALL] = "alltoall",
    [PLAIT_COLL_GATHER] = "gather",       [PLAIT_COLL_SCATTER] = "scatter",
    [PLAIT_COLL_SEND] = "send",           [PLAIT_COLL_RECV] = "recv",
    [PLAIT_COLL_BARRIER] = "barrier",
};

const char *plait_coll_name(int coll)
{
    return coll >= 0 && coll < PLAIT_COLL_COUNT ? coll_names[coll] : "invalid";
}

int plait_coll_is_scheduled(int coll)
{
    return coll == PLAIT_COLL_ALLREDUCE || coll == PLAIT_COLL_BROADCAST || coll == PLAIT_COLL_REDUCE ||
           coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_ALLTOALL ||
           coll == PLAIT_COLL_GATHER || coll == PLAIT_COLL_SCATTER || coll == PLAIT_COLL_BARRIER;
}

static int find_algo(const char *name, size_t len)
{
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++)
        if (strlen(plait_algorithms[a].name) == len && strncasecmp(plait_algorithms[a].name, name, len) == 0)
            return a;
    return -1;
}

static int find_coll(const char *name, size_t len)
{
    for (int c = 0; c < PLAIT_COLL_COUNT; c++)
        if (plait_coll_is_scheduled(c) && strlen(coll_names[c]) == len && strncasecmp(coll_names[c], name, len) == 0)
            return c;
    return -1;
}

static void list_valid(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    o += (size_t)snprintf(buf + o, len - o, "algorithms:");
    for (int a = 0; a < PLAIT_ALGO_COUNT && o < len; a++)
        o += (size_t)snprintf(buf + o, len - o, " %s", plait_algorithms[a].name);
    if (o < len)
        o += (size_t)snprintf(buf + o, len - o, "; collectives:");
    for (int c = 0; c < PLAIT_COLL_COUNT && o < len; c++)
        if (plait_coll_is_scheduled(c))
            o += (size_t)snprintf(buf + o, len - o, " %s", coll_names[c]);
}

/* One problem in the spec: an error when strict, a WARN otherwise. */
static plait_result_t bad(int strict, const char *varname, const char *spec, const char *what, const char *tok,
                          size_t toklen)
{
    char valid[512];
    list_valid(valid, sizeof(valid));
    if (strict)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s=\"%s\": %s \"%.*s\" (valid %s)", varname, spec, what,
                           (int)toklen, tok, valid);
    /* once per process: settings are read at every init */
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        PLAIT_WARN(PLAIT_SUBSYS_ENV, "%s=\"%s\": %s \"%.*s\" is not one of plait's; plait chooses instead (%s)",
                   varname, spec, what, (int)toklen, tok, valid);
    return PLAIT_SUCCESS;
}

plait_result_t plait_algo_parse(const char *spec, int strict, const char *varname, uint8_t choice[PLAIT_COLL_COUNT])
{
    memset(choice, PLAIT_ALGO_AUTO, PLAIT_COLL_COUNT);
    if (!spec || !*spec)
        return PLAIT_SUCCESS;
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        int coll = -1;
        const char *name = p;
        size_t name_len = len;
        if (colon) {
            coll = find_coll(p, (size_t)(colon - p));
            name = colon + 1;
            name_len = len - (size_t)(colon - p) - 1;
        }
        plait_result_t res = PLAIT_SUCCESS;
        int algo = find_algo(name, name_len);
        if (colon && coll < 0)
            res = bad(strict, varname, spec, "collective", p, (size_t)(colon - p));
        else if (algo < 0)
            res = bad(strict, varname, spec, "algorithm", name, name_len);
        else {
            for (int c = 0; c < PLAIT_COLL_COUNT; c++) {
                if (!plait_coll_is_scheduled(c) || (coll >= 0 && c != coll))
                    continue;
                if (!plait_algorithms[algo].supports(c, 0)) {
                    if (coll >= 0) {
                        char what[96];
                        snprintf(what, sizeof(what), "%s does not implement %s:", plait_algorithms[algo].name,
                                 coll_names[c]);
                        res = bad(strict, varname, spec, what, name, name_len);
                    }
                    continue; /* one name for all: applies where it can */
                }
                choice[c] = (uint8_t)algo;
            }
        }
        if (res)
            return res;
        p = end ? end + 1 : p + len;
    }
    return PLAIT_SUCCESS;
}

/* The default rule, the choice without a model (docs/algorithms.md,
 * "Selection"): the tuner (tuning/tuner.c) uses it for collectives or machines
 * its cost model does not cover. Returns an algorithm id for (coll, bytes, nranks, nhosts), or
 * with bytes == UINT64_MAX sets may[] to every id the rule can return for
 * nranks (any size, any host count). */
/* Default one-shot allreduce: at most this many bytes per rank, this many ranks. */
#define ONESHOT_MAX_BYTES 1024
#define ONESHOT_MAX_RANKS 4

static int default_rule(int coll, uint64_t bytes, int nranks, int nhosts, uint8_t may[PLAIT_ALGO_COUNT])
{
    /* Alltoall, gather and scatter have one algorithm each by default: the
     * pairwise exchange and the linear root (what the direct point-to-point
     * code did before they became schedules). */
    int id = PLAIT_ALGO_RING;
    if (coll == PLAIT_COLL_ALLTOALL)
        id = PLAIT_ALGO_PAIRWISE;
    else if (coll == PLAIT_COLL_GATHER || coll == PLAIT_COLL_SCATTER)
        id = PLAIT_ALGO_LINEAR;
    else if (coll == PLAIT_COLL_BARRIER) {
        /* On one host (shared memory) the dissemination barrier's log2 n rounds
         * beat the ring's 2(n-1) hops (medians on the 2-core VM: 47 vs 85 us
         * at 8 ranks, 45 vs 88 at 2, 18 vs 20 at 4). Over loopback sockets the
         * ring was ahead at 8 ranks (504 vs 588 us): that is all we measured
         * of what several hosts would see, so there the ring stays until the
         * cost model decides (docs/algorithms.md). */
        if (bytes == UINT64_MAX) {
            if (may)
                may[PLAIT_ALGO_DISSEMINATION] = 1;
        } else if (nhosts <= 1) {
            id = PLAIT_ALGO_DISSEMINATION;
        }
    }
    else if (coll == PLAIT_COLL_ALLGATHER && nranks >= 4) {
        /* Small allgathers: Bruck's ceil(log2 n) messages beat the ring's n-1
         * hops when the whole output is at most 16 KiB (medians of three
         * alternating runs: 4 ranks, 1 KiB 4.5 vs 6.8 us, 16 KiB 6.5 vs 7.5;
         * 8 ranks 14.5 vs 21.7 and 17.7 vs 21.4); at 256 KiB the ring wins (8
         * ranks 50 vs 70 us). `bytes` is per rank. */
        if (bytes == UINT64_MAX) {
            if (may)
                may[PLAIT_ALGO_BRUCK] = 1;
        } else if (bytes * (uint64_t)nranks <= 16384) {
            id = PLAIT_ALGO_BRUCK;
        }
    }
    else if ((coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER) && nranks == 2) {
        /* Two ranks of one host, small: recursive doubling/halving's single
         * SENDRECV step beats the ring's send-then-receive step (medians of
         * five alternating runs, NULL stream, totals: allgather 512 B 0.84 vs
         * 1.07 us, 4 KiB 0.95 vs 1.23, 32 KiB 2.22 vs 2.49; reducescatter
         * 512 B 0.77 vs 0.98, 4 KiB 1.08 vs 1.19, 32 KiB 2.46 vs 2.22, where
         * the ring wins). `bytes` is per rank. */
        uint64_t cut = coll == PLAIT_COLL_ALLGATHER ? 16384 : 2048;
        if (bytes == UINT64_MAX) {
            if (may)
                may[PLAIT_ALGO_RECURSIVE] = 1;
        } else if (nhosts <= 1 && bytes <= cut) {
            id = PLAIT_ALGO_RECURSIVE;
        }
    }
    else if (coll == PLAIT_COLL_ALLREDUCE) {
        /* Tiny allreduces on one host: one-shot's single exchange (every
         * contribution one hop from where it is reduced) beats the ring's
         * 2(n-1) dependent hops, which are the whole cost at this size
         * (docs/algorithms.md, "Selection"). Across hosts unmeasured: the
         * ring stays. */
        if (bytes == UINT64_MAX) {
            if (may && nranks <= ONESHOT_MAX_RANKS && plait_oneshot_supports(coll, nranks))
                may[PLAIT_ALGO_ONESHOT] = 1;
        } else if (nhosts <= 1 && nranks <= ONESHOT_MAX_RANKS && bytes <= ONESHOT_MAX_BYTES) {
            id = PLAIT_ALGO_ONESHOT;
        }
    }
    /* The rest, the ring: alternating measurements on the 2-core machine
     * (docs/algorithms.md) did not show another algorithm ahead consistently
     * enough to switch (allreduce: the ring leads from 256 KiB and ties below;
     * tree broadcast wins small on 3-4 ranks and loses on 8). */
    if (may)
        may[id] = 1;
    return id;
}

int plait_algo_connects(int nranks, int radix, const uint8_t choice[PLAIT_COLL_COUNT], int a, int b)
{
    if (a == b)
        return 0;
    uint8_t may[PLAIT_ALGO_COUNT] = {0};
    for (int c = 0; c < PLAIT_COLL_COUNT; c++) {
        if (choice && choice[c] != PLAIT_ALGO_AUTO)
            may[choice[c]] = 1;
        default_rule(c, UINT64_MAX, nranks, 0, may);
    }
    for (int i = 0; i < PLAIT_ALGO_COUNT; i++)
        if (may[i] && plait_algorithms[i].all_pairs)
            return 1;
    int peers[PLAIT_ALGO_MAX_PEERS];
    for (int i = 0; i < PLAIT_ALGO_COUNT; i++) {
        if (!may[i])
            continue;
        int n = plait_algorithms[i].peers(nranks, a, radix, peers, PLAIT_ALGO_MAX_PEERS);
        for (int j = 0; j < n; j++)
            if (peers[j] == b)
                return 1;
        n = plait_algorithms[i].peers(nranks, b, radix, peers, PLAIT_ALGO_MAX_PEERS);
        for (int j = 0; j < n; j++)
            if (peers[j] == a)
                return 1;
    }
    return 0;
}

const struct plait_algorithm *plait_algo_select(int coll, uint64_t bytes, int nranks, int nhosts,
                                                const uint8_t choice[PLAIT_COLL_COUNT])
{
    int forced = coll >= 0 && coll < PLAIT_COLL_COUNT ? choice[coll] : PLAIT_ALGO_AUTO;
    if (forced != PLAIT_ALGO_AUTO && plait_algorithms[forced].supports(coll, nranks))
        return &plait_algorithms[forced];
    int id = default_rule(coll, bytes, nranks, nhosts, NULL);
    if (!plait_algorithms[id].supports(coll, nranks))
        id = PLAIT_ALGO_RING;
    return &plait_algorithms[id];
}
