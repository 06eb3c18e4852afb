/* The tuner (tuning/tuner.c): tuning files (parsing, every kind of malformed line
 * with its line number, matching), size buckets, the model's choices on
 * uniform machines and recorded clusters (small sizes leave the ring, large
 * ones keep ring or hier), determinism and the cache, and a communicator:
 * PLAIT_TUNE_FILE really runs its algorithm (seen in the TUNING log and in the
 * results), a malformed file fails init naming the line, PLAIT_ALGO wins over
 * the file, ranks with different files fail init naming the variable. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "tuning/model.h"
#include "core/comm.h"
#include "base/log.h"
#include "core/tuner_comm.h"
#include "topology/topo.h"
#include "tests/harness.h"

static void quiet_env(void)
{
    unsetenv("PLAIT_TUNE_FILE");
    unsetenv("PLAIT_TUNE_CONSTANTS");
    unsetenv("PLAIT_ALGO");
    unsetenv("NCCL_ALGO");
    unsetenv("PLAIT_PROTO");
    unsetenv("NCCL_PROTO");
    setenv("PLAIT_TIMEOUT", "20", 1);
    setenv("PLAIT_COLL_TIMEOUT", "20", 1);
}

TestSuite(tuner, .init = quiet_env);

/* ---------------------------------------------------------------- tuning files */

static plait_result_t parse(const char *text, struct plait_tune_rules *r)
{
    return plait_tune_rules_parse(text, strlen(text), "rules.txt", r);
}

Test(tuner, rules_valid)
{
    const char *text = "# a tuning file\n"
                       "\n"
                       "allreduce 0-4K oneshot      # tiny\n"
                       "ALLREDUCE 4K-1M Recursive ll\n"
                       "  allreduce\t1M-inf  ring SIMPLE\n"
                       "allgather * bruck\n"
                       "broadcast 1G-2G tree\n"
                       "reducescatter 100-200 pat\r\n"
                       "barrier 0-inf dissemination";
    struct plait_tune_rules r;
    cr_assert_eq(parse(text, &r), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(r.n, 7);
    const struct {
        int coll;
        uint64_t lo, hi;
        int algo, proto, line;
    } want[] = {
        {PLAIT_COLL_ALLREDUCE, 0, 4096, PLAIT_ALGO_ONESHOT, -1, 3},
        {PLAIT_COLL_ALLREDUCE, 4096, 1u << 20, PLAIT_ALGO_RECURSIVE, PLAIT_MPROTO_LL, 4},
        {PLAIT_COLL_ALLREDUCE, 1u << 20, UINT64_MAX, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE, 5},
        {PLAIT_COLL_ALLGATHER, 0, UINT64_MAX, PLAIT_ALGO_BRUCK, -1, 6},
        {PLAIT_COLL_BROADCAST, 1ull << 30, 2ull << 30, PLAIT_ALGO_TREE, -1, 7},
        {PLAIT_COLL_REDUCESCATTER, 100, 200, PLAIT_ALGO_PAT, -1, 8},
        {PLAIT_COLL_BARRIER, 0, UINT64_MAX, PLAIT_ALGO_DISSEMINATION, -1, 9},
    };
    for (int i = 0; i < 7; i++) {
        cr_expect_eq(r.rules[i].coll, want[i].coll, "rule %d coll", i);
        cr_expect_eq(r.rules[i].lo, want[i].lo, "rule %d lo", i);
        cr_expect_eq(r.rules[i].hi, want[i].hi, "rule %d hi %llu", i, (unsigned long long)r.rules[i].hi);
        cr_expect_eq(r.rules[i].algo, want[i].algo, "rule %d algo", i);
        cr_expect_eq(r.rules[i].proto, want[i].proto, "rule %d proto", i);
        cr_expect_eq(r.rules[i].line, want[i].line, "rule %d line", i);
    }
    cr_expect_neq(r.hash, 0);
    /* comments and spacing do not change the hash; a rule does */
    struct plait_tune_rules r2, r3;
    cr_assert_eq(parse("allreduce 0-4096 ONESHOT\nallreduce 4k-1m recursive LL\nallreduce 1m-inf ring simple\n"
                       "allgather * bruck\nbroadcast 1g-2g tree\nreducescatter 100-200 pat\nbarrier * dissemination\n",
                       &r2),
                 PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_eq(r2.hash, r.hash);
    cr_assert_eq(parse("allreduce 0-4K twoshot\n", &r3), PLAIT_SUCCESS);
    cr_expect_neq(r3.hash, r.hash);
    plait_tune_rules_free(&r);
    plait_tune_rules_free(&r2);
    plait_tune_rules_free(&r3);
    cr_expect_eq(r.n, 0);
    cr_expect_null(r.rules);
}

Test(tuner, rules_malformed)
{
    char longline[2100];
    memset(longline, ' ', sizeof(longline));
    memcpy(longline, "allreduce 0-4K ring", 19);
    snprintf(longline + 2000, 100, "\nallreduce 0-1K ring\n");
    char longtext[2200];
    snprintf(longtext, sizeof(longtext), "# fine\n%s", longline);
    const struct {
        const char *text;
        int line;
        const char *what;
    } cases[] = {
        {"allreduce 0-4K ring\nallreduse 0-4K ring\n", 2, "unknown collective \"allreduse\""},
        {"send 0-4K ring\n", 1, "unknown collective"},
        {"# x\n\nallreduce 0-4K rign\n", 3, "unknown algorithm \"rign\""},
        {"allreduce 0-4K auto\n", 1, "unknown algorithm"},
        {"alltoall 0-4K ring\n", 1, "ring does not implement alltoall"},
        {"gather * tree\n", 1, "tree does not implement gather"},
        {"allreduce 4K-1K ring\n", 1, "empty size range \"4K-1K\""},
        {"allreduce 4K-4K ring\n", 1, "empty size range"},
        {"allreduce 1X-2K ring\n", 1, "bad size range \"1X-2K\""},
        {"allreduce 0-4KB ring\n", 1, "bad size range"},
        {"allreduce 4K ring\n", 1, "bad size range"},
        {"allreduce inf-4K ring\n", 1, "bad size range"},
        {"allreduce -4K ring\n", 1, "bad size range"},
        {"allreduce 0-99999999999999999999 ring\n", 1, "bad size range"},
        {"allreduce 0-17179869184G ring\n", 1, "bad size range"},
        {"allreduce 0-4K\n", 1, "missing the algorithm"},
        {"\n\n\nallreduce\n", 4, "missing the size range and the algorithm"},
        {"allreduce 0-4K ring simple extra\n", 1, "trailing \"extra\""},
        {"allreduce 0-4K ring LL128\n", 1, "unknown protocol \"LL128\""},
        {longtext, 2, "line longer than"},
        {"", 1, "no rule"},
        {"# only a comment\n   \n", 2, "no rule"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct plait_tune_rules r;
        memset(&r, 0x5a, sizeof(r));
        plait_result_t s = parse(cases[i].text, &r);
        cr_expect_eq(s, PLAIT_ERR_INVALID_ARGUMENT, "case %zu returned %d", i, (int)s);
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "rules.txt:%d: ", cases[i].line);
        const char *msg = plait_last_error_get();
        cr_expect(strncmp(msg, prefix, strlen(prefix)) == 0, "case %zu: want \"%s...\", got \"%s\"", i, prefix, msg);
        cr_expect(strstr(msg, cases[i].what) != NULL, "case %zu: want \"%s\" in \"%s\"", i, cases[i].what, msg);
        cr_expect_eq(r.n, 0, "case %zu left rules", i);
        cr_expect_null(r.rules, "case %zu left rules", i);
    }
}

Test(tuner, rules_match)
{
    struct plait_tune_rules r;
    cr_assert_eq(parse("allreduce 0-1K oneshot\n"
                       "allreduce 0-64K recursive\n"
                       "allreduce 64K-inf ring\n"
                       "allgather * pat simple\n",
                       &r),
                 PLAIT_SUCCESS, "%s", plait_last_error_get());
    const struct plait_tune_rule *m;
    cr_expect_eq(plait_tune_rules_match(&r, PLAIT_COLL_ALLREDUCE, 0, 4)->algo, PLAIT_ALGO_ONESHOT);
    cr_expect_eq(plait_tune_rules_match(&r, PLAIT_COLL_ALLREDUCE, 1023, 4)->algo, PLAIT_ALGO_ONESHOT);
    cr_expect_eq(plait_tune_rules_match(&r, PLAIT_COLL_ALLREDUCE, 1024, 4)->algo, PLAIT_ALGO_RECURSIVE);
    cr_expect_eq(plait_tune_rules_match(&r, PLAIT_COLL_ALLREDUCE, 65535, 4)->algo, PLAIT_ALGO_RECURSIVE);
    m = plait_tune_rules_match(&r, PLAIT_COLL_ALLREDUCE, 65536, 4);
    cr_expect_eq(m->algo, PLAIT_ALGO_RING);
    cr_expect_eq(m->line, 3);
    cr_expect_eq(plait_tune_rules_match(&r, PLAIT_COLL_ALLREDUCE, UINT64_MAX - 1, 4)->algo, PLAIT_ALGO_RING);
    /* one-shot stops at 32 ranks: the next rule that fits the communicator */
    if (!plait_oneshot_supports(PLAIT_COLL_ALLREDUCE, 64))
        cr_expect_eq(plait_tune_rules_match(&r, PLAIT_COLL_ALLREDUCE, 10, 64)->algo, PLAIT_ALGO_RECURSIVE);
    m = plait_tune_rules_match(&r, PLAIT_COLL_ALLGATHER, 12345, 8);
    cr_expect_eq(m->algo, PLAIT_ALGO_PAT);
    cr_expect_eq(m->proto, PLAIT_MPROTO_SIMPLE);
    cr_expect_null(plait_tune_rules_match(&r, PLAIT_COLL_BROADCAST, 10, 4));
    cr_expect_null(plait_tune_rules_match(NULL, PLAIT_COLL_ALLREDUCE, 10, 4));
    plait_tune_rules_free(&r);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

Test(tuner, rules_load)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/plait-tune-load-%d.txt", (int)getpid());
    write_file(path, "# ok\nallreduce 0-4K oneshot\nallreduce 4K-inf riing\n");
    struct plait_tune_rules r;
    cr_expect_eq(plait_tune_rules_load(path, &r), PLAIT_ERR_INVALID_ARGUMENT);
    char want[128];
    snprintf(want, sizeof(want), "%s:3: unknown algorithm \"riing\"", path);
    cr_expect(strstr(plait_last_error_get(), want) != NULL, "%s", plait_last_error_get());
    write_file(path, "allreduce 0-4K oneshot\n");
    cr_expect_eq(plait_tune_rules_load(path, &r), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_eq(r.n, 1);
    plait_tune_rules_free(&r);
    unlink(path);
    cr_expect_eq(plait_tune_rules_load(path, &r), PLAIT_ERR_SYSTEM);
    cr_expect(strstr(plait_last_error_get(), path) != NULL, "%s", plait_last_error_get());
}

/* ---------------------------------------------------------------- buckets */

Test(tuner, buckets)
{
    cr_expect_eq(plait_tune_bucket(0), 0);
    int prev = plait_tune_bucket(4);
    for (uint64_t b = 5; b < (1u << 20); b++) {
        const int k = plait_tune_bucket(b);
        cr_assert(k == prev || k == prev + 1, "bucket of %llu is %d after %d", (unsigned long long)b, k, prev);
        prev = k;
    }
    cr_expect_lt(plait_tune_bucket(1), plait_tune_bucket(2));
    cr_expect_lt(plait_tune_bucket(3), plait_tune_bucket(4));
    /* 4 per power of two */
    cr_expect_eq(plait_tune_bucket(1u << 20) - plait_tune_bucket(1u << 16), 16);
    cr_expect_eq(plait_tune_bucket(4096), plait_tune_bucket(5119));
    cr_expect_neq(plait_tune_bucket(4095), plait_tune_bucket(4096));
    cr_expect_neq(plait_tune_bucket(5119), plait_tune_bucket(5120));
    cr_expect_lt(plait_tune_bucket(UINT64_MAX), PLAIT_TUNE_BUCKETS);
}

/* ---------------------------------------------------------------- choices on model machines */

static void space_default(struct plait_tune_space *sp, int max_channels)
{
    memset(sp, 0, sizeof(*sp));
    for (int a = 1; a < PLAIT_ALGO_COUNT; a++)
        sp->allowed[a] = 1;
    sp->max_channels = max_channels;
    sp->slot_bytes = 128 * 1024;
    sp->nslots = 4;
    sp->max_chunk_bytes = 256 * 1024;
    sp->radix = 2;
}

static struct plait_tune_choice best_of(const struct plait_model_machine *m, const struct plait_tune_space *sp,
                                        int coll, uint64_t bytes)
{
    struct plait_tune_candidate c[PLAIT_ALGO_COUNT + 1];
    int n = 0, best = -1;
    plait_result_t s = plait_tune_candidates(m, sp, coll, bytes, 4, c, PLAIT_ALGO_COUNT + 1, &n, &best);
    cr_assert_eq(s, PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_geq(best, 0, "no candidate for %s %llu B", plait_coll_name(coll), (unsigned long long)bytes);
    for (int i = 0; i < n; i++) {
        cr_expect_gt(c[i].choice.predicted_s, 0.0);
        cr_expect(c[i].choice.nchannels >= 1 && c[i].choice.nchannels <= sp->max_channels);
        if (c[i].choice.proto == PLAIT_MPROTO_LL)
            cr_expect_eq(c[i].choice.algo, PLAIT_ALGO_AUTO);
        else
            cr_expect(plait_algorithms[c[i].choice.algo].supports(coll, m->nranks));
        if (i > 0)
            cr_expect_gt(c[i].choice.algo, c[i - 1].choice.algo, "candidates not in algorithm order");
    }
    return c[best].choice;
}

static const char *choice_name(const struct plait_tune_choice *c)
{
    return c->proto == PLAIT_MPROTO_LL ? "ll" : plait_algorithms[c->algo].name;
}

/* One host of 4 and 8 ranks over shared memory, with and without the
 * small-message path: small calls leave the ring (one-shot, trees, recursive
 * doubling, Bruck or LL: fewer dependent hops), large allreduces keep it. */
Test(tuner, one_host_small_vs_large, .timeout = 60)
{
    for (int n = 4; n <= 8; n += 4)
        for (int ll = 0; ll <= 1; ll++) {
            struct plait_model_machine m;
            cr_assert_eq(plait_tune_machine_local(&m, n, PLAIT_MLINK_SHM, NULL, NULL), PLAIT_SUCCESS, "%s",
                         plait_last_error_get());
            m.ll_ok = ll;
            struct plait_tune_space sp;
            space_default(&sp, 2);
            struct plait_tune_choice c = best_of(&m, &sp, PLAIT_COLL_ALLREDUCE, 64);
            cr_log_info("%d ranks, LL %d: allreduce 64 B -> %s %d ch, %.2f us", n, ll, choice_name(&c), c.nchannels,
                        c.predicted_s * 1e6);
            cr_expect(c.proto == PLAIT_MPROTO_LL || c.algo != PLAIT_ALGO_RING,
                      "%d ranks: a 64-byte allreduce chose the ring", n);
            if (ll)
                cr_expect_eq(c.proto, PLAIT_MPROTO_LL, "%d ranks: 64 B with LL available chose %s", n,
                             choice_name(&c));
            c = best_of(&m, &sp, PLAIT_COLL_ALLGATHER, 64);
            cr_expect(c.proto == PLAIT_MPROTO_LL || c.algo != PLAIT_ALGO_RING, "%d ranks: small allgather chose ring",
                      n);
            c = best_of(&m, &sp, PLAIT_COLL_ALLREDUCE, 64u << 20);
            cr_log_info("%d ranks: allreduce 64 MiB -> %s %d ch %u B chunk, %.2f ms", n, choice_name(&c),
                        c.nchannels, c.chunk_bytes, c.predicted_s * 1e3);
            cr_expect_eq(c.proto, PLAIT_MPROTO_SIMPLE);
            cr_expect(c.algo == PLAIT_ALGO_RING || c.algo == PLAIT_ALGO_HIER || c.algo == PLAIT_ALGO_TWOSHOT ||
                          c.algo == PLAIT_ALGO_RECURSIVE,
                      "%d ranks: 64 MiB allreduce chose %s (a bandwidth-optimal algorithm expected)", n,
                      choice_name(&c));
            plait_model_machine_free(&m);
        }
}

static const char *fixture(const char *name)
{
    static char path[4096];
    const char *root = getenv("PLAIT_TEST_FIXTURES");
    if (root && *root) {
        snprintf(path, sizeof(path), "%s/topo/%s", root, name);
        return path;
    }
    /* __FILE__ is relative to the build directory or absolute */
    char dir[2048];
    snprintf(dir, sizeof(dir), "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof(dir), ".");
    snprintf(path, sizeof(path), "%s/fixtures/topo/%s", dir, name);
    if (access(path, R_OK) != 0) {
        snprintf(path, sizeof(path), "%s/../%s/fixtures/topo/%s", getenv("PWD") ? getenv("PWD") : ".", dir, name);
        if (access(path, R_OK) != 0)
            snprintf(path, sizeof(path), "tests/fixtures/topo/%s", name);
    }
    return path;
}

/* DGX H100 clusters of 2..16 nodes: a large allreduce keeps a
 * bandwidth-optimal schedule (ring or hier), a small one does not take the
 * ring's 2(n-1) hops. */
Test(tuner, dgx_clusters, .timeout = 120)
{
    struct plait_topo *topo = NULL;
    const char *path = fixture("dgx-h100.xml");
    cr_assert_eq(plait_topo_load_xml(path, &topo), PLAIT_SUCCESS, "%s: %s", path, plait_last_error_get());
    for (int nodes = 2; nodes <= 16; nodes *= 2) {
        struct plait_model_machine m;
        cr_assert_eq(plait_model_machine_from_topo(&m, topo, nodes, NULL), PLAIT_SUCCESS, "%s",
                     plait_last_error_get());
        struct plait_tune_space sp;
        space_default(&sp, 8);
        struct plait_tune_choice small = best_of(&m, &sp, PLAIT_COLL_ALLREDUCE, 1024);
        struct plait_tune_choice large = best_of(&m, &sp, PLAIT_COLL_ALLREDUCE, 256u << 20);
        cr_log_info("%d nodes (%d ranks): allreduce 1 KiB -> %s %d ch (%.1f us); 256 MiB -> %s %d ch %u B (%.2f ms)",
                    nodes, m.nranks, choice_name(&small), small.nchannels, small.predicted_s * 1e6,
                    choice_name(&large), large.nchannels, large.chunk_bytes, large.predicted_s * 1e3);
        cr_expect(small.algo != PLAIT_ALGO_RING, "%d nodes: 1 KiB allreduce chose the ring", nodes);
        cr_expect(large.algo == PLAIT_ALGO_RING || large.algo == PLAIT_ALGO_HIER,
                  "%d nodes: 256 MiB allreduce chose %s", nodes, choice_name(&large));
        plait_model_machine_free(&m);
    }
    plait_topo_free(topo);
}

/* The same machine twice gives the same bits; the search is small. */
Test(tuner, deterministic, .timeout = 60)
{
    struct plait_model_machine a, b;
    cr_assert_eq(plait_model_machine_uniform(&a, 8, 2, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, NULL),
                 PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(plait_model_machine_uniform(&b, 8, 2, PLAIT_MENGINE_CPU, PLAIT_MLINK_SHM, PLAIT_MLINK_TCP, NULL),
                 PLAIT_SUCCESS, "%s", plait_last_error_get());
    struct plait_tune_space sp;
    space_default(&sp, 4);
    static const int colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_REDUCESCATTER,
                                PLAIT_COLL_BROADCAST};
    for (size_t i = 0; i < sizeof(colls) / sizeof(colls[0]); i++)
        for (uint64_t bytes = 64; bytes <= (16u << 20); bytes *= 16) {
            struct plait_tune_candidate ca[PLAIT_ALGO_COUNT + 1], cb[PLAIT_ALGO_COUNT + 1];
            int na, nb, ba, bb;
            cr_assert_eq(plait_tune_candidates(&a, &sp, colls[i], bytes, 4, ca, PLAIT_ALGO_COUNT + 1, &na, &ba),
                         PLAIT_SUCCESS);
            cr_assert_eq(plait_tune_candidates(&b, &sp, colls[i], bytes, 4, cb, PLAIT_ALGO_COUNT + 1, &nb, &bb),
                         PLAIT_SUCCESS);
            cr_expect_eq(na, nb);
            cr_expect_eq(ba, bb);
            for (int k = 0; k < na && k < nb; k++) {
                cr_expect_eq(memcmp(&ca[k].choice, &cb[k].choice, sizeof(ca[k].choice)), 0, "%s %llu B candidate %d",
                             plait_coll_name(colls[i]), (unsigned long long)bytes, k);
                cr_expect_eq(ca[k].result.time_s, cb[k].result.time_s);
            }
        }
    plait_model_machine_free(&a);
    plait_model_machine_free(&b);
}

/* ---------------------------------------------------------------- a communicator */

struct comm_case {
    int want_algo;     /* what plait_tuner_choose must say for allreduce */
    int want_source;
    const char *log;   /* the TUNING log file, or NULL */
};

static int check_comm(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    const struct comm_case *cc = arg;
    struct plait_comm *c = (struct plait_comm *)comm;
    static const uint64_t sizes[] = {28, 4000, 1u << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        struct plait_tune_choice ch;
        plait_tuner_choose(c, PLAIT_COLL_ALLREDUCE, sizes[i], 4, &ch);
        if (ch.algo != cc->want_algo || ch.source != cc->want_source || ch.proto != PLAIT_MPROTO_SIMPLE) {
            snprintf(msg, msglen, "rank %d: allreduce %llu B: %s/%s from %s, want %s from %s", rank,
                     (unsigned long long)sizes[i], plait_algorithms[ch.algo].name, plait_model_proto_name(ch.proto),
                     plait_tune_source_name(ch.source), plait_algorithms[cc->want_algo].name,
                     plait_tune_source_name(cc->want_source));
            return 1;
        }
    }
    const uint64_t fast_before = c->fast_seq;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        const size_t count = sizes[i] / 4;
        int32_t *buf = malloc(count * sizeof(int32_t));
        if (!buf) {
            snprintf(msg, msglen, "out of memory");
            return 1;
        }
        for (size_t k = 0; k < count; k++)
            buf[k] = (int32_t)(rank + 3 * k);
        plait_result_t r = plait_allreduce(buf, buf, count, PLAIT_INT32, PLAIT_SUM, comm, NULL);
        int bad = r != PLAIT_SUCCESS;
        for (size_t k = 0; k < count && !bad; k++)
            bad = buf[k] != (int32_t)(n * (n - 1) / 2 + n * 3 * k);
        free(buf);
        if (bad) {
            snprintf(msg, msglen, "rank %d: allreduce of %zu ints failed or wrong: %s", rank, count,
                     plait_get_last_error(comm));
            return 1;
        }
    }
    if (c->fast_seq != fast_before) {
        snprintf(msg, msglen, "rank %d: a call took the small-message path despite %s", rank,
                 plait_tune_source_name(cc->want_source));
        return 1;
    }
    return 0;
}

static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

Test(tuner, file_forces_algorithm, .timeout = 60)
{
    char rules[64], logpath[64];
    snprintf(rules, sizeof(rules), "/tmp/plait-tune-rules-%d.txt", (int)getpid());
    snprintf(logpath, sizeof(logpath), "/tmp/plait-tune-log-%d.txt", (int)getpid());
    write_file(rules, "# every allreduce by recursive halving/doubling\nallreduce 0-inf recursive\n");
    unlink(logpath);
    setenv("PLAIT_TUNE_FILE", rules, 1);
    setenv("PLAIT_DEBUG", "INFO", 1);
    setenv("PLAIT_DEBUG_SUBSYS", "TUNING", 1);
    setenv("PLAIT_DEBUG_FILE", logpath, 1);
    struct comm_case cc = {PLAIT_ALGO_RECURSIVE, PLAIT_TUNE_SRC_FILE, logpath};
    char msg[1024];
    int failed = mr_run(MR_THREADS, 4, check_comm, &cc, 40, msg, sizeof(msg));
    unsetenv("PLAIT_DEBUG");
    unsetenv("PLAIT_DEBUG_SUBSYS");
    unsetenv("PLAIT_DEBUG_FILE");
    /* PLAIT_ALGO wins over the file */
    setenv("PLAIT_ALGO", "allreduce:ring", 1);
    struct comm_case forced = {PLAIT_ALGO_RING, PLAIT_TUNE_SRC_FORCED, NULL};
    char msg2[1024];
    int failed2 = mr_run(MR_THREADS, 3, check_comm, &forced, 40, msg2, sizeof(msg2));
    unsetenv("PLAIT_ALGO");
    unsetenv("PLAIT_TUNE_FILE");
    plait_comm_t reconf[1];
    if (plait_comm_init_all(reconf, 1, NULL) == PLAIT_SUCCESS) /* logging back to its defaults */
        plait_comm_destroy(reconf[0]);
    cr_expect_eq(failed, 0, "%s", msg);
    cr_expect_eq(failed2, 0, "PLAIT_ALGO with a tuning file: %s", msg2);
    cr_expect(file_has(logpath, "allreduce 28 B: recursive simple"), "no TUNING line for the 28-byte call in %s",
              logpath);
    cr_expect(file_has(logpath, "allreduce 1048576 B: recursive simple"), "no TUNING line for 1 MiB in %s", logpath);
    cr_expect(file_has(logpath, "(file)"), "the log does not say the file chose");
    unlink(rules);
    unlink(logpath);
}

Test(tuner, malformed_file_fails_init, .timeout = 60)
{
    char rules[64];
    snprintf(rules, sizeof(rules), "/tmp/plait-tune-bad-%d.txt", (int)getpid());
    write_file(rules, "allreduce 0-4K oneshot\n# two\nallgather 4K-1K ring\n");
    setenv("PLAIT_TUNE_FILE", rules, 1);
    plait_comm_t c[2] = {NULL, NULL};
    plait_result_t r = plait_comm_init_all(c, 2, NULL);
    unsetenv("PLAIT_TUNE_FILE");
    cr_expect_eq(r, PLAIT_ERR_INVALID_ARGUMENT, "init returned %s", plait_get_error_string(r));
    char want[128];
    snprintf(want, sizeof(want), "PLAIT_TUNE_FILE=%s:3: empty size range", rules);
    cr_expect(strstr(plait_get_last_error(NULL), want) != NULL, "want \"%s\" in: %s", want,
              plait_get_last_error(NULL));
    if (r == PLAIT_SUCCESS) {
        plait_comm_destroy(c[0]);
        plait_comm_destroy(c[1]);
    }
    unlink(rules);
    /* a missing file fails too, naming it */
    setenv("PLAIT_TUNE_FILE", rules, 1);
    r = plait_comm_init_all(c, 2, NULL);
    unsetenv("PLAIT_TUNE_FILE");
    cr_expect_neq(r, PLAIT_SUCCESS);
    cr_expect(strstr(plait_get_last_error(NULL), rules) != NULL, "%s", plait_get_last_error(NULL));
    if (r == PLAIT_SUCCESS) {
        plait_comm_destroy(c[0]);
        plait_comm_destroy(c[1]);
    }
}

struct differ_report {
    int result;
    char text[600];
};

static int differ_child(struct mr_child *c, void *arg)
{
    const char *const *files = arg;
    struct differ_report *rep = (struct differ_report *)c->shared + c->rank;
    setenv("PLAIT_TUNE_FILE", files[c->rank], 1);
    setenv("PLAIT_TIMEOUT", "15", 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    rep->result = (int)r;
    snprintf(rep->text, sizeof(rep->text), "%s", r ? plait_get_last_error(NULL) : "");
    if (!r)
        plait_comm_destroy(comm);
    return 0;
}

Test(tuner, different_files_fail_init, .timeout = 60)
{
    char a[64], b[64];
    snprintf(a, sizeof(a), "/tmp/plait-tune-a-%d.txt", (int)getpid());
    snprintf(b, sizeof(b), "/tmp/plait-tune-b-%d.txt", (int)getpid());
    write_file(a, "allreduce * ring\n");
    write_file(b, "allreduce * tree\n");
    const char *files[2] = {a, b};
    char msg[1024];
    struct mr_procs *p = mr_procs_start(2, differ_child, files, 2 * sizeof(struct differ_report), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 40, msg, sizeof(msg));
    struct differ_report rep[2];
    memcpy(rep, mr_procs_shared(p), sizeof(rep));
    mr_procs_free(p);
    unlink(a);
    unlink(b);
    cr_expect_eq(failed, 0, "%s", msg);
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(rep[r].result, PLAIT_ERR_INVALID_USAGE, "rank %d: %s", r, rep[r].text);
        cr_expect(strstr(rep[r].text, "PLAIT_TUNE_FILE") != NULL && strstr(rep[r].text, "rank 1") != NULL,
                  "rank %d: %s", r, rep[r].text);
    }
}

/* The communicator's cache: same bucket, same answer, and a second
 * communicator on the same machine answers alike whatever the order of its
 * calls. */
static int cache_round;

static int cache_check(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    (void)n;
    struct plait_tune_choice *out = arg; /* [2][3][nsizes] */
    struct plait_comm *c = (struct plait_comm *)comm;
    static const uint64_t sizes[] = {8, 100, 4096, 4100, 65536, 1u << 20, 4u << 20};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    static const int colls[3] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_BROADCAST};
    const int which = cache_round;
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < NS; j++) {
            /* the second communicator asks from the largest size down */
            const int i = which ? NS - 1 - j : j;
            struct plait_tune_choice a, b;
            plait_tuner_choose(c, colls[k], sizes[i], 4, &a);
            plait_tuner_choose(c, colls[k], sizes[i] + (sizes[i] >= 4096 && sizes[i] != 4096 ? 3 : 0), 4, &b);
            if (memcmp(&a, &b, sizeof(a)) != 0 && !(sizes[i] == 4096)) {
                snprintf(msg, msglen, "rank %d: %s %llu B: two sizes of one bucket chose differently", rank,
                         plait_coll_name(colls[k]), (unsigned long long)sizes[i]);
                return 1;
            }
            if (a.proto == PLAIT_MPROTO_LL && sizes[i] > 4096) {
                snprintf(msg, msglen, "rank %d: LL for %llu B", rank, (unsigned long long)sizes[i]);
                return 1;
            }
            if (rank == 0)
                out[(which * 3 + k) * NS + i] = a;
        }
    return 0;
}

Test(tuner, cache_same_bucket_same_answer, .timeout = 60)
{
    struct plait_tune_choice got[2 * 3 * 7];
    memset(got, 0, sizeof(got));
    char msg[1024];
    cache_round = 0;
    cr_assert_eq(mr_run(MR_THREADS, 4, cache_check, got, 40, msg, sizeof(msg)), 0, "%s", msg);
    /* a second communicator, asked in the other order */
    cache_round = 1;
    cr_assert_eq(mr_run(MR_THREADS, 4, cache_check, got, 40, msg, sizeof(msg)), 0, "%s", msg);
    for (int i = 0; i < 3 * 7; i++)
        cr_expect_eq(memcmp(&got[i], &got[3 * 7 + i], sizeof(got[i])), 0, "choice %d differs between communicators",
                     i);
}

/* PLAIT_MIN_CTAS is a lower bound on the channels of every call the tuner
 * schedules, as NCCL's minCTAs is: without it the model gives some calls one
 * channel (checked first, so that the bound is what the second run tests). */
static int count_one_channel(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t msglen)
{
    (void)rank;
    (void)n;
    (void)msg;
    (void)msglen;
    int *ones = arg;
    static const int colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_REDUCESCATTER};
    for (size_t i = 0; i < sizeof(colls) / sizeof(colls[0]); i++)
        for (uint64_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) {
            struct plait_tune_choice ch;
            if (plait_tuner_choose((struct plait_comm *)comm, colls[i], bytes, 4, &ch))
                return 1;
            if (ch.proto == PLAIT_MPROTO_SIMPLE && ch.nchannels < 2)
                __atomic_add_fetch(ones, 1, __ATOMIC_RELAXED);
        }
    return 0;
}

Test(tuner, min_ctas_bounds_channels, .timeout = 60)
{
    char msg[1024];
    int ones = 0;
    cr_assert_eq(mr_run(MR_THREADS, 4, count_one_channel, &ones, 40, msg, sizeof(msg)), 0, "%s", msg);
    cr_assert_gt(ones, 0, "precondition: the model gave no call one channel on 4 threads");
    setenv("PLAIT_MIN_CTAS", "2", 1);
    ones = 0;
    const int failed = mr_run(MR_THREADS, 4, count_one_channel, &ones, 40, msg, sizeof(msg));
    unsetenv("PLAIT_MIN_CTAS");
    cr_assert_eq(failed, 0, "%s", msg);
    cr_expect_eq(ones, 0, "with PLAIT_MIN_CTAS=2, %d calls were given one channel", ones);
}
