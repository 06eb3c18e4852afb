/* The hierarchical algorithm (algorithms/hier.c) on real multi-host node maps:
 * each rank is a process with its own PLAIT_HOSTID, so the communicator sees
 * several hosts (shared memory inside a host, TCP between hosts) and hier runs
 * its intra-host and column rings. Maps: 3 hosts x 2 ranks, 3 + 3 + 1 (a
 * partial host: the column count follows the smallest host), hosts dealt
 * round-robin, and an irregular interleaved map. Each rank checks allreduce,
 * reducescatter and allgather over several types, ops and counts, in and out
 * of place, and that init saw the map it was given (from its INFO log line).
 * Then the verifier on random node maps (hosts of any sizes, interleaved in
 * any order), which plait-verify --all does not sweep (it tries consecutive
 * blocks only). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "tests/coll_check.h"
#include "tests/harness.h"
#include "base/log.h"
#include "algorithms/verify.h"

#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        snprintf(c->msg, c->msglen, __VA_ARGS__);                                                                  \
        return 1;                                                                                                  \
    } while (0)

/* One letter per rank: its host. */
struct node_map {
    const char *hosts;
};

static const size_t counts[] = {0, 1, 7, 4099, (1u << 16) + 5};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))
static const int dtypes[] = {PLAIT_FLOAT32, PLAIT_INT32, PLAIT_FLOAT16, PLAIT_FLOAT64};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

/* Host index (in order of first appearance) and local rank of `rank`, and the
 * host count, as init computes them. */
static void expected_place(const char *hosts, int rank, int *host, int *local, int *nhosts)
{
    int h = -1, nh = 0, loc = 0;
    char seen[64];
    for (int p = 0; hosts[p]; p++) {
        if (!memchr(seen, hosts[p], (size_t)nh))
            seen[nh++] = hosts[p];
        if (p < rank && hosts[p] == hosts[rank])
            loc++;
    }
    for (int i = 0; i < nh; i++)
        if (seen[i] == hosts[rank])
            h = i;
    *host = h;
    *local = loc;
    *nhosts = nh;
}

static char *read_log(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

/* One collective, one type and op, one count, in or out of place. Returns the
 * number of wrong elements, or -1 after a failed call (msg says which). */
static long run_case(plait_comm_t comm, int rank, int n, int coll, int dtype, int op, int inplace, size_t count,
                     char *sbuf, char *rbuf, char *msg, size_t len)
{
    const size_t es = cc_size(dtype), bytes = count * es;
    plait_redop_t pop = (plait_redop_t)op;
    struct cc_expect e;
    plait_result_t r = PLAIT_SUCCESS;
    if (coll != 2) {
        cc_expect_init(&e, dtype, op, n);
        if (op == CC_PREMUL) {
            uint64_t scalar = 0;
            cc_premul_scalar(dtype, &scalar);
            if ((r = plait_redop_create_premulsum(&pop, &scalar, dtype, PLAIT_SCALAR_HOST_IMMEDIATE, comm))) {
                snprintf(msg, len, "premulsum: %s", plait_get_last_error(comm));
                return -1;
            }
        }
    }
    memset(rbuf, 0xcd, bytes * (size_t)n);
    long bad = 0;
    if (coll == 0) {
        cc_fill(sbuf, count, dtype, op, rank, 0);
        char *out = inplace ? sbuf : rbuf;
        if (!(r = plait_allreduce(sbuf, out, count, dtype, pop, comm, NULL)))
            bad = (long)cc_check(&e, out, count, 0, msg, len);
    } else if (coll == 1) {
        cc_fill(sbuf, count * (size_t)n, dtype, op, rank, 0);
        char *out = inplace ? sbuf + (size_t)rank * bytes : rbuf;
        if (!(r = plait_reducescatter(sbuf, out, count, dtype, pop, comm, NULL)))
            bad = (long)cc_check(&e, out, count, (size_t)rank * count, msg, len);
    } else {
        char *in = inplace ? rbuf + (size_t)rank * bytes : sbuf;
        cc_fill_bytes(in, bytes, rank, 0);
        if (!(r = plait_allgather(in, rbuf, count, dtype, comm, NULL)))
            for (int q = 0; q < n; q++)
                bad += (long)cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, msg, len);
    }
    if (op == CC_PREMUL && coll != 2)
        plait_redop_destroy(pop, comm);
    if (r) {
        snprintf(msg, len, "%s: %s", plait_get_error_string(r), plait_get_last_error(comm));
        return -1;
    }
    return bad;
}

static int hier_child(struct mr_child *c, void *arg)
{
    const struct node_map *map = arg;
    char hostid[64], logpath[128];
    snprintf(hostid, sizeof(hostid), "plait-test-hier-%c", map->hosts[c->rank]);
    snprintf(logpath, sizeof(logpath), "/tmp/plait_test_hier_%d_%d.log", (int)getppid(), c->rank);
    unlink(logpath);
    setenv("PLAIT_HOSTID", hostid, 1);
    setenv("PLAIT_ALGO", "hier", 1);
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    setenv("PLAIT_DEBUG", "INFO", 1);
    setenv("PLAIT_DEBUG_SUBSYS", "INIT", 1);
    setenv("PLAIT_DEBUG_FILE", logpath, 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));

    int host, local, nhosts;
    expected_place(map->hosts, c->rank, &host, &local, &nhosts);
    char want[64], log[1 << 14];
    snprintf(want, sizeof(want), "(host %d of %d, local rank %d of", host, nhosts, local);
    if (!strstr(read_log(logpath, log, sizeof(log)), want)) {
        plait_comm_destroy(comm);
        unlink(logpath);
        FAIL("init did not see the node map: no \"%s\" in its log", want);
    }
    unlink(logpath);

    const int n = c->nranks;
    const size_t max_bytes = counts[NCOUNTS - 1] * 8 * (size_t)n;
    char *sbuf = malloc(max_bytes), *rbuf = malloc(max_bytes);
    if (!sbuf || !rbuf)
        FAIL("out of memory");
    static const char *const coll_names[3] = {"allreduce", "reducescatter", "allgather"};
    int failed = 0;
    for (int coll = 0; coll < 3 && !failed; coll++)
        for (size_t t = 0; t < NDTYPES && !failed; t++)
            for (int op = 0; op < CC_NUM_OPS && !failed; op++) {
                /* every op on float32; sum and avg on the others */
                if (coll == 2 ? op > 0 : (dtypes[t] != PLAIT_FLOAT32 && op != 0 && op != 4))
                    continue;
                for (size_t k = 0; k < NCOUNTS && !failed; k++)
                    for (int inplace = 0; inplace < 2 && !failed; inplace++) {
                        char why[512] = "";
                        long bad = run_case(comm, c->rank, n, coll, dtypes[t], op, inplace, counts[k], sbuf, rbuf,
                                            why, sizeof(why));
                        if (bad != 0) {
                            snprintf(c->msg, c->msglen, "%s %s %s count %zu%s: %s%ld wrong: %s", coll_names[coll],
                                     cc_type_name(dtypes[t]), cc_op_name(op), counts[k], inplace ? " in place" : "",
                                     bad < 0 ? "failed, " : "", bad < 0 ? 0 : bad, why);
                            failed = 1;
                        }
                    }
            }
    free(sbuf);
    free(rbuf);
    plait_comm_destroy(comm);
    return failed;
}

static void run_map(const char *hosts)
{
    struct node_map map = {hosts};
    const int n = (int)strlen(hosts);
    char msg[2048];
    struct mr_procs *p = mr_procs_start(n, hier_child, &map, 0, 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 500, msg, sizeof(msg));
    mr_procs_free(p);
    cr_expect_eq(failed, 0, "hosts \"%s\": %d rank(s) failed: %s", hosts, failed, msg);
}

Test(hier, three_hosts_of_two, .timeout = 600)
{
    run_map("aabbcc");
}

Test(hier, partial_last_host, .timeout = 600)
{
    run_map("aaabbbc");
}

Test(hier, round_robin_hosts, .timeout = 600)
{
    run_map("abcabc");
}

Test(hier, irregular_interleaved, .timeout = 600)
{
    run_map("abbab");
}

/* ---------------------------------------------------------------- random maps, verified */

static uint64_t next_random(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

Test(hier, verifier_random_maps, .timeout = 120)
{
    const struct plait_algorithm *al = &plait_algorithms[PLAIT_ALGO_HIER];
    static const int colls[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_REDUCESCATTER, PLAIT_COLL_ALLGATHER};
    static const uint64_t counts[] = {0, 1, 7, 100, 1003};
    uint64_t x = 88172645463325252ull;
    int failed = 0;
    for (int trial = 0; trial < 300 && failed < 3; trial++) {
        /* a host drawn per rank, numbered in order of first appearance as init does */
        const int n = 2 + (int)(next_random(&x) % 23);
        const int draw = 1 + (int)(next_random(&x) % (uint64_t)(n < 6 ? n : 6));
        int32_t nodemap[2 * 24], index_of[6] = {-1, -1, -1, -1, -1, -1};
        int nhosts = 0;
        for (int r = 0; r < n; r++) {
            const int d = (int)(next_random(&x) % (uint64_t)draw);
            if (index_of[d] < 0)
                index_of[d] = nhosts++;
            nodemap[r] = index_of[d];
            nodemap[n + r] = 0;
            for (int q = 0; q < r; q++)
                nodemap[n + r] += nodemap[q] == nodemap[r];
        }
        for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++)
            for (int inplace = 0; inplace < 2; inplace++) {
                struct plait_verify_config cfg;
                memset(&cfg, 0, sizeof(cfg));
                const uint32_t slots = 2 + 2 * (uint32_t)(next_random(&x) % 3);
                const uint64_t piece = 4 + 4 * (next_random(&x) % 3);
                cfg.gen = al->step;
                cfg.peers = al->peers;
                cfg.scratch = al->scratch;
                cfg.args.coll = colls[ci];
                cfg.args.nranks = n;
                cfg.args.count = counts[next_random(&x) % (sizeof(counts) / sizeof(counts[0]))];
                cfg.args.nchannels = 1 + (int)(next_random(&x) % 3);
                cfg.args.align_elems = 4;
                /* half the FIFO, in 16-byte multiples, as sched_args() clamps it */
                cfg.args.chunk_elems = piece * (slots / 2) / 4 * 4;
                cfg.args.nhosts = nhosts;
                cfg.args.host_of = nodemap;
                cfg.args.local_of = nodemap + n;
                cfg.piece_elems = piece;
                cfg.fifo_slots = slots;
                cfg.is_inplace = inplace;
                cfg.max_reports = 2;
                struct plait_verify_result r;
                cr_assert_eq(plait_sched_verify(&cfg, &r), PLAIT_SUCCESS, "%s", plait_last_error_get());
                if (!r.is_ok) {
                    char map[64] = "";
                    for (int q = 0; q < n; q++)
                        map[q] = (char)('a' + nodemap[q]);
                    cr_log_error("hosts \"%s\" %s count %llu, %d channels, %u slots of %llu%s: %s", map,
                                 plait_coll_name(colls[ci]), (unsigned long long)cfg.args.count, cfg.args.nchannels,
                                 slots, (unsigned long long)piece, inplace ? ", in place" : "",
                                 r.nfindings ? r.findings[0].text : "");
                    failed++;
                }
                plait_verify_result_free(&r);
            }
    }
    cr_expect_eq(failed, 0, "%d random node maps failed verification", failed);
}
