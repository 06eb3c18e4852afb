/* The tuner (tuner.h): per call, the algorithm, protocol, channel count and
 * chunk size with the lowest modelled time (tuning/model.h), cached per
 * (collective, size bucket); PLAIT_ALGO / PLAIT_PROTO and a tuning file
 * (PLAIT_TUNE_FILE) override.
 *
 * Every rank must run the same schedule for a call, and ranks do not talk per
 * call: so every input of a decision is something every rank holds alike (the
 * node map, the transports between ranks as computed from the init cards, the
 * host's cores when every rank sees the same graph, the agreed settings, the
 * constants and rules whose hashes init compares), the model is a pure
 * function of them, and the cache is filled from the bucket's representative
 * size (never from the call that happened to come first), so a decision does
 * not depend on the history of calls either. */
#define _GNU_SOURCE
#include "tuning/tuner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "topology/topo.h"

/* ------------------------------------------------------------ size buckets */

int plait_tune_bucket(uint64_t bytes)
{
    if (bytes == 0)
        return 0;
    const int e = 63 - __builtin_clzll(bytes);
    const int q = e >= 2 ? (int)((bytes >> (e - 2)) & 3) : (int)((bytes << (2 - e)) & 3);
    return 1 + 4 * e + q;
}

/* The smallest size of a bucket: what the cache models the bucket at. The
 * smallest, not a middle, so that the small-message protocol's limit (a power
 * of two, the first size of its bucket) is decided the same for every size the
 * protocol can take; sizes above the limit in that bucket use the entry's
 * schedule instead (see choose_cached). */
uint64_t plait_tune_bucket_lo(int b)
{
    if (b <= 0)
        return 0;
    const int e = (b - 1) / 4, q = (b - 1) % 4;
    if (e >= 2)
        return (uint64_t)(4 + q) << (e - 2);
    return (uint64_t)(4 + q) >> (2 - e);
}

/* ------------------------------------------------------------ candidates */

/* The chunk sizes searched: slot, 2 slots, 4 slots, ... up to max_chunk_bytes,
 * and max_chunk_bytes itself (the executor's default), largest first so that
 * a tie keeps the larger chunk. Returns how many. */
#define MAX_CHUNKS 24
static int chunk_list(const struct plait_tune_space *sp, uint64_t out[MAX_CHUNKS])
{
    int n = 0;
    const uint64_t max = sp->max_chunk_bytes;
    out[n++] = max;
    if (sp->slot_bytes > 0)
        for (int i = 20; i >= 0; i--) {
            const uint64_t c = sp->slot_bytes << i;
            if (c < max && n < MAX_CHUNKS)
                out[n++] = c;
        }
    return n;
}

/* Channel counts searched: 1, 2, 4, ... and max_channels itself. */
#define MAX_CHANS 16
static int chan_list(const struct plait_tune_space *sp, int out[MAX_CHANS])
{
    int n = 0;
    for (int c = 1; c < sp->max_channels && n < MAX_CHANS - 1; c *= 2)
        out[n++] = c;
    out[n++] = sp->max_channels > 0 ? sp->max_channels : 1;
    return n;
}

/* How many model runs one algorithm may cost: a full grid when it fits, else
 * channels at the largest chunk, then chunks at the best channel count. */
#define MAX_RUNS_GRID 12

struct eval {
    double t;
    int ch;
    uint64_t chunk;
    struct plait_model_result res;
    int ok;
};

/* One model run; keeps it in *best when strictly faster (the order of the
 * calls decides ties). Returns PLAIT_SUCCESS, or the model's error when it is
 * not "does not apply" (which only skips the point). */
static plait_result_t eval_point(const struct plait_model_machine *m, struct plait_model_call *c, int ch,
                                 uint64_t chunk, struct eval *best, int *applies)
{
    c->nchannels = ch;
    c->chunk_bytes = chunk;
    struct plait_model_result r;
    plait_result_t s = plait_model_time(m, c, PLAIT_MODEL_AUTO, &r);
    if (s == PLAIT_ERR_INVALID_ARGUMENT) {
        *applies = 0;
        return PLAIT_SUCCESS;
    }
    if (s)
        return s;
    *applies = 1;
    if (!best->ok || r.time_s < best->t) {
        best->ok = 1;
        best->t = r.time_s;
        best->ch = ch;
        best->chunk = chunk;
        best->res = r;
    }
    return PLAIT_SUCCESS;
}

static plait_result_t search_algo(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                                  uint64_t count, int esize, int algo, struct eval *best)
{
    struct plait_model_call c;
    plait_model_call_init(&c, coll, count, esize, algo, PLAIT_MPROTO_SIMPLE);
    c.root = 0;
    c.slot_bytes = sp->slot_bytes;
    c.nslots = sp->nslots;
    c.radix = sp->radix;
    uint64_t chunks[MAX_CHUNKS];
    int chans[MAX_CHANS];
    const int nk = chunk_list(sp, chunks), nc = chan_list(sp, chans);
    memset(best, 0, sizeof(*best));
    plait_result_t s;
    int applies = 1;
    if (nk * nc <= MAX_RUNS_GRID) {
        for (int i = 0; i < nc; i++)
            for (int j = 0; j < nk; j++) {
                if ((s = eval_point(m, &c, chans[i], chunks[j], best, &applies)))
                    return s;
                if (!applies)
                    return PLAIT_SUCCESS; /* the algorithm does not apply: no point in trying others */
            }
        return PLAIT_SUCCESS;
    }
    for (int i = 0; i < nc; i++) {
        if ((s = eval_point(m, &c, chans[i], chunks[0], best, &applies)))
            return s;
        if (!applies)
            return PLAIT_SUCCESS;
    }
    const int ch = best->ch;
    for (int j = 1; j < nk && best->ok; j++)
        if ((s = eval_point(m, &c, ch, chunks[j], best, &applies)))
            return s;
    return PLAIT_SUCCESS;
}

/* The small-message protocol's candidate: one exchange, no schedule. The
 * model takes it with any algorithm id (it does not replay a schedule), and
 * the ring is the one that every modelled collective has a generator for;
 * alltoall has none in the ring, so the pairwise exchange stands in. */
static plait_result_t eval_ll(const struct plait_model_machine *m, int coll, uint64_t count, int esize,
                              struct eval *best)
{
    memset(best, 0, sizeof(*best));
    static const int stand_in[] = {PLAIT_ALGO_RING, PLAIT_ALGO_PAIRWISE, PLAIT_ALGO_BRUCK, PLAIT_ALGO_LINEAR,
                                   PLAIT_ALGO_DISSEMINATION};
    for (size_t i = 0; i < sizeof(stand_in) / sizeof(stand_in[0]); i++) {
        if (!plait_algorithms[stand_in[i]].supports(coll, m->nranks))
            continue;
        struct plait_model_call c;
        plait_model_call_init(&c, coll, count, esize, stand_in[i], PLAIT_MPROTO_LL);
        c.nchannels = 1;
        struct plait_model_result r;
        plait_result_t s = plait_model_time(m, &c, PLAIT_MODEL_AUTO, &r);
        if (s == PLAIT_ERR_INVALID_ARGUMENT)
            return PLAIT_SUCCESS;
        if (s)
            return s;
        best->ok = 1;
        best->t = r.time_s;
        best->ch = 1;
        best->chunk = 0;
        best->res = r;
        return PLAIT_SUCCESS;
    }
    return PLAIT_SUCCESS;
}

double plait_tune_ll_time(const struct plait_model_machine *m, int coll, uint64_t count, int esize)
{
    struct eval e;
    return eval_ll(m, coll, count, esize, &e) == PLAIT_SUCCESS && e.ok ? e.t : 0.0;
}

/* Whether the small-message protocol can carry a call of `bytes` per rank
 * pair (what fastpath.c counts: count x element size for every collective). */
static int ll_fits(const struct plait_model_machine *m, int coll, uint64_t bytes)
{
    if (!m->ll_ok)
        return 0;
    if (coll == PLAIT_COLL_BARRIER)
        return 1;
    return bytes > 0 && bytes <= m->ll_max_bytes;
}

int plait_tune_ll_coll(int coll)
{
    return coll == PLAIT_COLL_ALLREDUCE || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_ALLGATHER ||
           coll == PLAIT_COLL_ALLTOALL || coll == PLAIT_COLL_BROADCAST || coll == PLAIT_COLL_REDUCE ||
           coll == PLAIT_COLL_BARRIER;
}

static void fill_candidate(struct plait_tune_candidate *o, int algo, int proto, const struct eval *e)
{
    memset(o, 0, sizeof(*o));
    o->choice.algo = (uint8_t)algo;
    o->choice.proto = (uint8_t)proto;
    o->choice.nchannels = (uint8_t)(e->ch > 255 ? 255 : e->ch);
    o->choice.source = PLAIT_TUNE_SRC_MODEL;
    o->choice.chunk_bytes = (uint32_t)(e->chunk > UINT32_MAX ? UINT32_MAX : e->chunk);
    o->choice.predicted_s = e->t;
    o->result = e->res;
}

/* Predictions closer than this (relative) are ties: the model's resolution is
 * not finer, and among tied candidates the first in algorithm order (LL, then
 * ring, tree, ...: the simpler schedules first) is taken rather than one that
 * wins by a rounding (PAT against the ring on 2 ranks, 0.2%, measured 13%
 * slower). */
#define TUNE_TIE 0.01

/* The index of the best of cand[0..n) (proto: only those of that protocol,
 * -1: any), ties as TUNE_TIE says; -1 when none. */
static int pick_best(const struct plait_tune_candidate *cand, int n, int proto)
{
    double tmin = 0;
    int any = 0;
    for (int i = 0; i < n; i++)
        if (proto < 0 || cand[i].choice.proto == proto)
            if (!any || cand[i].choice.predicted_s < tmin) {
                tmin = cand[i].choice.predicted_s;
                any = 1;
            }
    for (int i = 0; any && i < n; i++)
        if ((proto < 0 || cand[i].choice.proto == proto) && cand[i].choice.predicted_s <= tmin * (1.0 + TUNE_TIE))
            return i;
    return -1;
}

/* The candidates of one call, restricted to `only` (an algorithm id) when it
 * is not PLAIT_ALGO_AUTO and allowing LL only when allow_ll. */
static plait_result_t candidates(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                                 uint64_t bytes, int esize, int only, int allow_ll, struct plait_tune_candidate *out,
                                 int max, int *n, int *best)
{
    *n = 0;
    *best = -1;
    if (!m || !sp || esize <= 0 || coll < 0 || coll >= PLAIT_COLL_COUNT || max < 0 || (max > 0 && !out))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_tune_candidates: invalid arguments");
    const uint64_t count = bytes / (uint64_t)esize;
    plait_result_t s;
    struct eval e;
    if (allow_ll && only == PLAIT_ALGO_AUTO && plait_tune_ll_coll(coll) && ll_fits(m, coll, bytes)) {
        if ((s = eval_ll(m, coll, count, esize, &e)))
            return s;
        if (e.ok && *n < max)
            fill_candidate(&out[(*n)++], PLAIT_ALGO_AUTO, PLAIT_MPROTO_LL, &e);
    }
    for (int a = 1; a < PLAIT_ALGO_COUNT && *n < max; a++) {
        if (!sp->allowed[a] || (only != PLAIT_ALGO_AUTO && a != only) ||
            !plait_algorithms[a].supports(coll, m->nranks))
            continue;
        if ((s = search_algo(m, sp, coll, count, esize, a, &e)))
            return s;
        if (e.ok)
            fill_candidate(&out[(*n)++], a, PLAIT_MPROTO_SIMPLE, &e);
    }
    /* Candidates are in algorithm order (LL, whose id is AUTO = 0, first),
     * each already the fewest channels and the largest chunk among its own
     * ties. */
    *best = pick_best(out, *n, -1);
    return PLAIT_SUCCESS;
}

/* The model's answer for a size bucket, as the cache holds it: the candidates
 * at the bucket's smallest size with a fixed element size (never the first
 * caller's), restricted to `only` unless AUTO (then LL competes too). *ll is 1
 * when LL is best overall; *sbest the best schedule's index or -1. */
plait_result_t plait_tune_model_bucket(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                                   int b, int only, struct plait_tune_bucket_answer *ans)
{
    const uint64_t rep = plait_tune_bucket_lo(b);
    const int esize = rep % 4 == 0 ? 4 : 1;
    int n = 0, best = -1;
    plait_result_t s = candidates(m, sp, coll, rep, esize, only, only == PLAIT_ALGO_AUTO, ans->cand,
                                  PLAIT_ALGO_COUNT + 1, &n, &best);
    ans->ll = !s && best >= 0 && ans->cand[best].choice.proto == PLAIT_MPROTO_LL;
    ans->sbest = s ? -1 : pick_best(ans->cand, n, PLAIT_MPROTO_SIMPLE);
    return s;
}

plait_result_t plait_tune_pick(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                               uint64_t bytes, int *algo, int *proto)
{
    /* What fill_entry caches for the bucket and choose() takes for this size. */
    struct plait_tune_bucket_answer ans;
    plait_result_t s = plait_tune_model_bucket(m, sp, coll, plait_tune_bucket(bytes), PLAIT_ALGO_AUTO, &ans);
    if (s)
        return s;
    if (ans.ll && ll_fits(m, coll, bytes)) {
        *algo = PLAIT_ALGO_AUTO;
        *proto = PLAIT_MPROTO_LL;
        return PLAIT_SUCCESS;
    }
    if (ans.sbest < 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_tune_pick: no algorithm models %s on %d ranks",
                           plait_coll_name(coll), m->nranks);
    *algo = ans.cand[ans.sbest].choice.algo;
    *proto = PLAIT_MPROTO_SIMPLE;
    return PLAIT_SUCCESS;
}

plait_result_t plait_tune_candidates(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                                     uint64_t bytes, int esize, struct plait_tune_candidate *out, int max, int *n,
                                     int *best)
{
    int n_local = 0, best_local = -1;
    plait_result_t s = candidates(m, sp, coll, bytes, esize, PLAIT_ALGO_AUTO, 1, out, max, &n_local, &best_local);
    if (n)
        *n = n_local;
    if (best)
        *best = best_local;
    return s;
}

/* ------------------------------------------------------------ tuning files */

#define RULE_LINE_MAX 1024
#define RULES_FILE_MAX (1 << 20)

static int find_coll_name(const char *s, size_t len)
{
    for (int c = 0; c < PLAIT_COLL_COUNT; c++) {
        const char *name = plait_coll_name(c);
        if (plait_coll_is_scheduled(c) && strlen(name) == len && strncasecmp(name, s, len) == 0)
            return c;
    }
    return -1;
}

static int find_algo_name(const char *s, size_t len)
{
    for (int a = 1; a < PLAIT_ALGO_COUNT; a++) {
        const char *name = plait_algorithms[a].name;
        if (strlen(name) == len && strncasecmp(name, s, len) == 0)
            return a;
    }
    return -1;
}

/* A size: digits with an optional K, M or G (powers of 1024, either case),
 * or "inf" (no bound) when allow_inf. Returns 0 when well formed. */
static int parse_size(const char *s, size_t len, int allow_inf, uint64_t *out)
{
    if (allow_inf && len == 3 && strncasecmp(s, "inf", 3) == 0) {
        *out = UINT64_MAX;
        return 0;
    }
    if (len == 0 || s[0] < '0' || s[0] > '9')
        return -1;
    uint64_t v = 0;
    size_t i = 0;
    for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
        if (v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    int shift = 0;
    if (i < len) {
        switch (s[i]) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        default: return -1;
        }
        i++;
    }
    if (i != len)
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t rules_hash(const struct plait_tune_rule *r, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        const int64_t f[5] = {r[i].coll, (int64_t)r[i].lo, (int64_t)r[i].hi, r[i].algo, r[i].proto};
        h = fnv1a(h, f, sizeof(f));
    }
    return h ? h : 1; /* 0 means "no file" in the agreed settings */
}

/* One line (comment already cut): 0 and *rule filled, 1 blank, or -1 with
 * the problem in what. */
static int parse_rule_line(char *line, struct plait_tune_rule *rule, char *what, size_t wlen)
{
    const char *tok[5];
    size_t tlen[5];
    int nt = 0;
    for (char *p = line; *p;) {
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\v' || *p == '\f')
            p++;
        if (!*p)
            break;
        char *start = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\r' && *p != '\v' && *p != '\f')
            p++;
        if (nt == 4) {
            snprintf(what, wlen, "trailing \"%.*s\" after the protocol (a rule is: collective size-range algorithm "
                                 "[protocol])", (int)(p - start) > 64 ? 64 : (int)(p - start), start);
            return -1;
        }
        tok[nt] = start;
        tlen[nt] = (size_t)(p - start);
        nt++;
    }
    if (nt == 0)
        return 1;
    if (nt < 3) {
        snprintf(what, wlen, "missing %s (a rule is: collective size-range algorithm [protocol])",
                 nt == 1 ? "the size range and the algorithm" : "the algorithm");
        return -1;
    }
    memset(rule, 0, sizeof(*rule));
    rule->coll = find_coll_name(tok[0], tlen[0]);
    if (rule->coll < 0) {
        snprintf(what, wlen, "unknown collective \"%.*s\" (allreduce, broadcast, reduce, allgather, reducescatter, "
                             "alltoall, gather, scatter, barrier)", (int)(tlen[0] > 64 ? 64 : tlen[0]), tok[0]);
        return -1;
    }
    if (tlen[1] == 1 && tok[1][0] == '*') {
        rule->lo = 0;
        rule->hi = UINT64_MAX;
    } else {
        const char *dash = memchr(tok[1], '-', tlen[1]);
        if (!dash || parse_size(tok[1], (size_t)(dash - tok[1]), 0, &rule->lo) ||
            parse_size(dash + 1, tlen[1] - (size_t)(dash - tok[1]) - 1, 1, &rule->hi)) {
            snprintf(what, wlen, "bad size range \"%.*s\" (LO-HI in bytes with K, M, G suffixes, HI may be inf; or *)",
                     (int)(tlen[1] > 64 ? 64 : tlen[1]), tok[1]);
            return -1;
        }
        if (rule->lo >= rule->hi) {
            snprintf(what, wlen, "empty size range \"%.*s\" (LO must be below HI)", (int)(tlen[1] > 64 ? 64 : tlen[1]),
                     tok[1]);
            return -1;
        }
    }
    rule->algo = find_algo_name(tok[2], tlen[2]);
    if (rule->algo < 0) {
        char valid[256];
        size_t o = 0;
        valid[0] = '\0';
        for (int a = 1; a < PLAIT_ALGO_COUNT && o < sizeof(valid); a++)
            o += (size_t)snprintf(valid + o, sizeof(valid) - o, "%s%s", a > 1 ? ", " : "", plait_algorithms[a].name);
        snprintf(what, wlen, "unknown algorithm \"%.*s\" (%s)", (int)(tlen[2] > 64 ? 64 : tlen[2]), tok[2], valid);
        return -1;
    }
    if (!plait_algorithms[rule->algo].supports(rule->coll, 0)) {
        snprintf(what, wlen, "%s does not implement %s", plait_algorithms[rule->algo].name,
                 plait_coll_name(rule->coll));
        return -1;
    }
    rule->proto = -1;
    if (nt == 4) {
        if (tlen[3] == 6 && strncasecmp(tok[3], "simple", 6) == 0)
            rule->proto = PLAIT_MPROTO_SIMPLE;
        else if (tlen[3] == 2 && strncasecmp(tok[3], "ll", 2) == 0)
            rule->proto = PLAIT_MPROTO_LL;
        else {
            snprintf(what, wlen, "unknown protocol \"%.*s\" (simple, ll)", (int)(tlen[3] > 64 ? 64 : tlen[3]), tok[3]);
            return -1;
        }
    }
    return 0;
}

plait_result_t plait_tune_rules_parse(const char *text, size_t len, const char *name, struct plait_tune_rules *out)
{
    if (!out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_tune_rules_parse: out is NULL");
    memset(out, 0, sizeof(*out));
    if (!name)
        name = "(tuning rules)";
    if (!text && len > 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: no text", name);
    struct plait_tune_rule *rules = NULL;
    int n = 0, cap = 0, lineno = 0;
    char line[RULE_LINE_MAX + 1];
    char what[512];
    size_t pos = 0;
    while (pos < len) {
        lineno++;
        const char *start = text + pos;
        const char *nl = memchr(start, '\n', len - pos);
        const size_t llen = nl ? (size_t)(nl - start) : len - pos;
        pos += llen + (nl ? 1 : 0);
        if (llen > RULE_LINE_MAX) {
            free(rules);
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%d: line longer than %d characters", name, lineno,
                               RULE_LINE_MAX);
        }
        if (memchr(start, '\0', llen)) {
            free(rules);
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%d: NUL byte in the line", name, lineno);
        }
        memcpy(line, start, llen);
        line[llen] = '\0';
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        struct plait_tune_rule rule;
        const int r = parse_rule_line(line, &rule, what, sizeof(what));
        if (r > 0)
            continue;
        if (r < 0) {
            free(rules);
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%d: %s", name, lineno, what);
        }
        if (n == cap) {
            const int ncap = cap ? cap * 2 : 16;
            struct plait_tune_rule *nr = realloc(rules, sizeof(*nr) * (size_t)ncap);
            if (!nr) {
                free(rules);
                return plait_error(PLAIT_ERR_SYSTEM, "%s:%d: out of memory", name, lineno);
            }
            rules = nr;
            cap = ncap;
        }
        rule.line = lineno;
        rules[n++] = rule;
    }
    if (n == 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%d: no rule (the file is empty or only comments)", name,
                           lineno > 0 ? lineno : 1);
    out->rules = rules;
    out->n = n;
    out->hash = rules_hash(rules, n);
    return PLAIT_SUCCESS;
}

plait_result_t plait_tune_rules_load(const char *path, struct plait_tune_rules *out)
{
    if (!out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_tune_rules_load: out is NULL");
    memset(out, 0, sizeof(*out));
    if (!path)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_tune_rules_load: path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: cannot open: %s", path, strerror(errno));
    char *buf = malloc(RULES_FILE_MAX + 1);
    if (!buf) {
        fclose(f);
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", path);
    }
    const size_t got = fread(buf, 1, RULES_FILE_MAX + 1, f);
    const int rerr = ferror(f);
    const int saved = errno;
    fclose(f);
    plait_result_t s;
    if (rerr)
        s = plait_error(PLAIT_ERR_SYSTEM, "%s: cannot read: %s", path, strerror(saved));
    else if (got > RULES_FILE_MAX)
        s = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: larger than %d bytes", path, RULES_FILE_MAX);
    else
        s = plait_tune_rules_parse(buf, got, path, out);
    free(buf);
    return s;
}

void plait_tune_rules_free(struct plait_tune_rules *r)
{
    if (!r)
        return;
    free(r->rules);
    memset(r, 0, sizeof(*r));
}

const struct plait_tune_rule *plait_tune_rules_match(const struct plait_tune_rules *r, int coll, uint64_t bytes,
                                                     int nranks)
{
    if (!r)
        return NULL;
    for (int i = 0; i < r->n; i++) {
        const struct plait_tune_rule *x = &r->rules[i];
        if (x->coll == coll && bytes >= x->lo && bytes < x->hi && x->algo > 0 && x->algo < PLAIT_ALGO_COUNT &&
            plait_algorithms[x->algo].supports(coll, nranks))
            return x;
    }
    return NULL;
}

/* ------------------------------------------------------------ machines */

/* The cores a host's graph has, 0 when unknown (no graph, or a CPU node
 * without a core count): the count fastpath.c's fits_cores uses. */
int plait_tune_topo_cores(const struct plait_topo *topo)
{
    if (!topo)
        return 0;
    int cores = 0;
    for (int i = 0; i < topo->nnodes; i++) {
        const struct plait_topo_node *node = &topo->nodes[i];
        if (node->type != PLAIT_TOPO_CPU)
            continue;
        if (node->cpu.ncores <= 0)
            return 0;
        cores += node->cpu.ncores;
    }
    return cores;
}

plait_result_t plait_tune_machine_local(struct plait_model_machine *m, int nranks, int link, const struct plait_topo *topo,
                                        const struct plait_model_consts *k)
{
    if (!m || nranks < 1 || (link != PLAIT_MLINK_SHM && link != PLAIT_MLINK_INPROC && link != PLAIT_MLINK_TCP))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_tune_machine_local: %d ranks over link %d (inproc, shm or socket)", nranks, link);
    plait_result_t s = plait_model_machine_uniform(m, nranks, 1, PLAIT_MENGINE_CPU, link, PLAIT_MLINK_TCP, k);
    if (s)
        return s;
    m->cores_per_host = plait_tune_topo_cores(topo);
    /* fastpath.c: boxes when every pair shares one memory transport and
     * 2..PLAIT_FAST_MAX_RANKS ranks */
    m->ll_ok = nranks >= 2 && nranks <= PLAIT_FAST_MAX_RANKS && link != PLAIT_MLINK_TCP;
    m->ll_max_bytes = PLAIT_FAST_MAX_BYTES;
    return PLAIT_SUCCESS;
}

static const char *const src_names[PLAIT_TUNE_SRC_COUNT] = {
    [PLAIT_TUNE_SRC_MODEL] = "model",
    [PLAIT_TUNE_SRC_FORCED] = "forced",
    [PLAIT_TUNE_SRC_FILE] = "file",
    [PLAIT_TUNE_SRC_DEFAULT] = "default rule",
};

const char *plait_tune_source_name(int source)
{
    return source >= 0 && source < PLAIT_TUNE_SRC_COUNT ? src_names[source] : "?";
}
