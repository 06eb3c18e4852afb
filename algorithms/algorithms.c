/* The algorithm table, PLAIT_ALGO parsing and the default selection rule. */
#include "algorithms.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "../src/log.h"

static int ring_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_ALLREDUCE || coll == PLAIT_COLL_BROADCAST || coll == PLAIT_COLL_REDUCE ||
           coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_BARRIER;
}

static int tree_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_BROADCAST;
}

static int bruck_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_ALLGATHER;
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
                         .peers = no_peers},
    [PLAIT_ALGO_RING] = {.id = PLAIT_ALGO_RING, .name = "ring", .supports = ring_supports, .step = plait_ring_step,
                         .peers = ring_peers},
    [PLAIT_ALGO_TREE] = {.id = PLAIT_ALGO_TREE, .name = "tree", .supports = tree_supports,
                         .step = plait_knomial_step, .peers = plait_knomial_peers},
    [PLAIT_ALGO_BRUCK] = {.id = PLAIT_ALGO_BRUCK, .name = "bruck", .supports = bruck_supports,
                          .step = plait_bruck_step, .peers = plait_bruck_peers},
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
           coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_BARRIER;
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
    PLAIT_WARN(PLAIT_SUBSYS_ENV, "%s=\"%s\": %s \"%.*s\" is not one of plait's; plait chooses instead (%s)", varname,
               spec, what, (int)toklen, tok, valid);
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

int plait_algo_connects(int nranks, int radix, int a, int b)
{
    if (a == b)
        return 0;
    int peers[256];
    for (int i = 0; i < PLAIT_ALGO_COUNT; i++) {
        int n = plait_algorithms[i].peers(nranks, a, radix, peers, 256);
        for (int j = 0; j < n; j++)
            if (peers[j] == b)
                return 1;
        n = plait_algorithms[i].peers(nranks, b, radix, peers, 256);
        for (int j = 0; j < n; j++)
            if (peers[j] == a)
                return 1;
    }
    return 0;
}

const struct plait_algorithm *plait_algo_select(int coll, uint64_t bytes, int nranks,
                                                const uint8_t choice[PLAIT_COLL_COUNT])
{
    int forced = coll >= 0 && coll < PLAIT_COLL_COUNT ? choice[coll] : PLAIT_ALGO_AUTO;
    if (forced != PLAIT_ALGO_AUTO && plait_algorithms[forced].supports(coll, nranks))
        return &plait_algorithms[forced];
    /* Default rule until the cost model replaces it: the ring. Alternating
     * measurements on the 2-core machine (docs/algorithms.md) did not show the
     * tree or Bruck ahead consistently enough to switch by size: the tree wins
     * small broadcasts on 3-4 ranks and loses them on 8 oversubscribed ranks,
     * and Bruck, one step per block, takes as many steps as the ring. */
    (void)bytes;
    return &plait_algorithms[PLAIT_ALGO_RING];
}
