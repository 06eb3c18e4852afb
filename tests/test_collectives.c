/* Every collective x every type x every op x in-place and out-of-place x counts
 * 0, 1, 7 and 1Mi+3, on 1, 2, 3, 4, 5 and 8 ranks, as threads (init_all), as
 * processes over shared memory and as processes over TCP. One communicator per
 * (mode, rank count); the combinations run inside it. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "tests/coll_check.h"
#include "tests/harness.h"
#include "core/reduce.h" /* scalar conversions and type names */

enum tc { TC_ALLREDUCE, TC_REDUCE, TC_REDUCESCATTER, TC_BROADCAST, TC_ALLGATHER, TC_ALLTOALL, TC_GATHER, TC_SCATTER,
          TC_SENDRECV, TC_COUNT };
static const char *const tc_names[TC_COUNT] = {"allreduce", "reduce",  "reducescatter", "broadcast", "allgather",
                                               "alltoall",  "gather",  "scatter",       "sendrecv"};

struct matrix {
    const size_t *counts;
    int ncounts;
    int all_types;     /* 0: a representative subset (sanitizer builds) */
    unsigned colls;    /* bit per enum tc to run; 0 = all */
};

static const size_t full_counts[] = {0, 1, 7, (1u << 20) + 3};

/* The large count is a size in bytes: 1 MiB, plus 3 elements (odd). The
 * chunks, slots and pipeline steps a collective makes are counted in bytes, so
 * every type spans as many of them as int8 does at 2^20 + 3 elements, and the
 * wider types no longer move 2 to 8 times the bytes for the same structure
 * (test_large covers counts past 2^31). */
static size_t type_count(size_t count, int dtype)
{
    return count > ((size_t)1 << 20) ? ((size_t)1 << 20) / cc_size(dtype) + 3 : count;
}

#define CHECK(call)                                                                                        \
    do {                                                                                                   \
        plait_result_t r_ = (call);                                                                        \
        if (r_ != PLAIT_SUCCESS) {                                                                         \
            snprintf(msg, len, "%s %s count %zu inplace %d: %s failed: %s: %s", tc_names[coll],            \
                     cc_type_name(dtype), count, inplace, #call, plait_get_error_string(r_),               \
                     plait_get_last_error(comm));                                                          \
            return 1;                                                                                      \
        }                                                                                                  \
    } while (0)

static int reduction(int coll)
{
    return coll == TC_ALLREDUCE || coll == TC_REDUCE || coll == TC_REDUCESCATTER;
}

static int has_inplace(int coll)
{
    return coll <= TC_ALLGATHER;
}

/* Runs one combination; returns the number of wrong elements (or 1 on error). */
static size_t run_one(plait_comm_t comm, int rank, int n, int coll, int dtype, int op, int inplace, size_t count,
                      int root, char *sbuf, char *rbuf, char *msg, size_t len)
{
    const size_t es = cc_size(dtype);
    const size_t bytes = count * es;
    size_t bad = 0;
    struct cc_expect e;
    plait_redop_t pop = (plait_redop_t)op;
    if (reduction(coll)) {
        cc_expect_init(&e, dtype, op, n);
        if (op == CC_PREMUL) {
            uint64_t scalar = 0;
            cc_premul_scalar(dtype, &scalar);
            CHECK(plait_redop_create_premulsum(&pop, &scalar, dtype, PLAIT_SCALAR_HOST_IMMEDIATE, comm));
        }
    }
    memset(rbuf, 0xcd, bytes * (size_t)n);
    switch (coll) {
    case TC_ALLREDUCE:
    case TC_REDUCE: {
        cc_fill(sbuf, count, dtype, op, rank, 0);
        char *out = inplace ? sbuf : rbuf;
        if (coll == TC_ALLREDUCE)
            CHECK(plait_allreduce(sbuf, out, count, dtype, pop, comm, NULL));
        else
            CHECK(plait_reduce(sbuf, out, count, dtype, pop, root, comm, NULL));
        if (coll == TC_ALLREDUCE || rank == root)
            bad = cc_check(&e, out, count, 0, msg, len);
        break;
    }
    case TC_REDUCESCATTER: {
        cc_fill(sbuf, count * (size_t)n, dtype, op, rank, 0);
        char *out = inplace ? sbuf + (size_t)rank * bytes : rbuf;
        CHECK(plait_reducescatter(sbuf, out, count, dtype, pop, comm, NULL));
        bad = cc_check(&e, out, count, (size_t)rank * count, msg, len);
        break;
    }
    case TC_BROADCAST: {
        char *out = rbuf;
        char *in = inplace ? rbuf : sbuf;
        if (rank == root)
            cc_fill_bytes(in, bytes, root, 0);
        CHECK(plait_broadcast(in, out, count, dtype, root, comm, NULL));
        bad = cc_check_bytes(out, bytes, root, 0, msg, len);
        break;
    }
    case TC_ALLGATHER: {
        char *in = inplace ? rbuf + (size_t)rank * bytes : sbuf;
        cc_fill_bytes(in, bytes, rank, 0);
        CHECK(plait_allgather(in, rbuf, count, dtype, comm, NULL));
        for (int q = 0; q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, msg, len);
        break;
    }
    case TC_ALLTOALL:
        cc_fill_bytes(sbuf, bytes * (size_t)n, rank, 0);
        CHECK(plait_alltoall(sbuf, rbuf, count, dtype, comm, NULL));
        for (int q = 0; q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, (size_t)rank * bytes, msg, len);
        break;
    case TC_GATHER:
        cc_fill_bytes(sbuf, bytes, rank, 0);
        CHECK(plait_gather(sbuf, rbuf, count, dtype, root, comm, NULL));
        if (rank == root)
            for (int q = 0; q < n; q++)
                bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, msg, len);
        break;
    case TC_SCATTER:
        if (rank == root)
            cc_fill_bytes(sbuf, bytes * (size_t)n, root, 0);
        CHECK(plait_scatter(sbuf, rbuf, count, dtype, root, comm, NULL));
        bad = cc_check_bytes(rbuf, bytes, root, (size_t)rank * bytes, msg, len);
        break;
    case TC_SENDRECV: {
        /* a ring exchange and a message to self, in one group */
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        cc_fill_bytes(sbuf, bytes, rank, 0);
        CHECK(plait_group_start());
        CHECK(plait_send(sbuf, count, dtype, next, comm, NULL));
        CHECK(plait_recv(rbuf, count, dtype, prev, comm, NULL));
        CHECK(plait_send(sbuf, count, dtype, rank, comm, NULL));
        CHECK(plait_recv(rbuf + bytes, count, dtype, rank, comm, NULL));
        CHECK(plait_group_end());
        bad = cc_check_bytes(rbuf, bytes, prev, 0, msg, len) + cc_check_bytes(rbuf + bytes, bytes, rank, 0, msg, len);
        break;
    }
    }
    if (reduction(coll) && op == CC_PREMUL)
        CHECK(plait_redop_destroy(pop, comm));
    if (bad && msg[0] && !strstr(msg, "count"))
        snprintf(msg + strlen(msg), len - strlen(msg), " [%s count %zu inplace %d root %d]", tc_names[coll], count,
                 inplace, root);
    return bad;
}

static int matrix_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    const struct matrix *m = arg;
    size_t maxcount = 0;
    for (int c = 0; c < m->ncounts; c++)
        if (m->counts[c] > maxcount)
            maxcount = m->counts[c];
    const size_t cap = (maxcount * 8 + 64) * (size_t)(n + 1);
    char *sbuf = malloc(cap), *rbuf = malloc(cap);
    if (!sbuf || !rbuf) {
        snprintf(msg, len, "out of memory");
        return 1;
    }
    static const int subset[] = {PLAIT_INT8, PLAIT_UINT64, PLAIT_FLOAT16, PLAIT_FLOAT32, PLAIT_BFLOAT16,
                                 PLAIT_FLOAT8_E5M2};
    size_t total_bad = 0;
    int iter = 0;
    for (int ci = 0; ci < m->ncounts; ci++) {
        const size_t count = m->counts[ci];
        /* a barrier between counts: every rank must get through it, and the
         * collectives after it must still match up */
        plait_result_t br = plait_barrier(comm, NULL);
        if (br != PLAIT_SUCCESS) {
            snprintf(msg, len, "plait_barrier before count %zu: %s: %s", count, plait_get_error_string(br),
                     plait_get_last_error(comm));
            free(sbuf);
            free(rbuf);
            return 1;
        }
        for (int coll = 0; coll < TC_COUNT; coll++) {
            if (m->colls && !(m->colls & (1u << coll)))
                continue;
            int ntypes = m->all_types ? PLAIT_NUM_TYPES : (int)(sizeof(subset) / sizeof(subset[0]));
            for (int ti = 0; ti < ntypes; ti++) {
                int dtype = m->all_types ? ti : subset[ti];
                int nops = reduction(coll) ? CC_NUM_OPS : 1;
                for (int op = 0; op < nops; op++) {
                    for (int inplace = 0; inplace <= has_inplace(coll); inplace++) {
                        int root = iter++ % n;
                        char one[512] = "";
                        size_t bad = run_one(comm, rank, n, coll, dtype, op, inplace, type_count(count, dtype),
                                             root, sbuf, rbuf, one, sizeof(one));
                        if (bad && !total_bad)
                            snprintf(msg, len, "%s (%zu wrong)", one, bad);
                        total_bad += bad;
                        if (bad && strstr(one, "failed:")) { /* an error: the communicator is unusable */
                            free(sbuf);
                            free(rbuf);
                            return 1;
                        }
                    }
                }
            }
        }
    }
    free(sbuf);
    free(rbuf);
    return total_bad != 0;
}

static void run_matrix(enum mr_mode mode, int nranks, const struct matrix *m)
{
    char msg[1024];
    setenv("PLAIT_COLL_TIMEOUT", "120", 1);
    int failed = mr_run(mode, nranks, matrix_rank, (void *)m, 900, msg, sizeof(msg));
    cr_assert_eq(failed, 0, "%s, %d ranks: %d rank(s) failed: %s", mr_mode_name(mode), nranks, failed, msg);
}

static const struct matrix full = {full_counts, 4, 1, 0};

#define MATRIX_TEST(mode, n)                                                                                      \
    Test(collectives, mode##_##n, .timeout = 900)                                                                  \
    {                                                                                                             \
        run_matrix(MR_##mode, n, &full);                                                                          \
    }

MATRIX_TEST(THREADS, 1)
MATRIX_TEST(THREADS, 2)
MATRIX_TEST(THREADS, 3)
MATRIX_TEST(THREADS, 4)
MATRIX_TEST(THREADS, 5)
MATRIX_TEST(THREADS, 8)
MATRIX_TEST(SHM, 1)
MATRIX_TEST(SHM, 2)
MATRIX_TEST(SHM, 3)
MATRIX_TEST(SHM, 4)
MATRIX_TEST(SHM, 5)
MATRIX_TEST(SHM, 8)
MATRIX_TEST(SOCKET, 1)
MATRIX_TEST(SOCKET, 2)
MATRIX_TEST(SOCKET, 3)
MATRIX_TEST(SOCKET, 4)
MATRIX_TEST(SOCKET, 5)
MATRIX_TEST(SOCKET, 8)

/* The sanitizer builds run a smaller matrix: small counts, a subset of types. */
static const size_t small_counts[] = {0, 1, 7, 4099};
static const struct matrix small = {small_counts, 4, 0, 0};

Test(collectives_small, threads_3, .timeout = 600)
{
    run_matrix(MR_THREADS, 3, &small);
}

Test(collectives_small, shm_4, .timeout = 600)
{
    run_matrix(MR_SHM, 4, &small);
}

Test(collectives_small, socket_2, .timeout = 600)
{
    run_matrix(MR_SOCKET, 2, &small);
}

/* Each algorithm, forced with PLAIT_ALGO, on every collective the table says
 * it implements (every count and type, in and out of place). A test whose
 * algorithm implements none of them fails: it would prove nothing.
 *
 * PLAIT_ALGO is read at init and names one algorithm per collective
 * ("allreduce:tree;allgather:bruck"), so one communicator forces several
 * algorithms at once, each on its own collectives: the algorithms of one
 * (mode, rank count) share a test and as few communicators as the most forced
 * collective needs. The barrier between counts runs forced too, on the first
 * algorithm that implements it (as when the algorithm was forced alone). */
#define TC_BARRIER TC_COUNT /* a bit of the masks below: not in the matrix loop */

static const int coll_of_tc[TC_COUNT + 1] = {
    [TC_ALLREDUCE] = PLAIT_COLL_ALLREDUCE, [TC_REDUCE] = PLAIT_COLL_REDUCE,
    [TC_REDUCESCATTER] = PLAIT_COLL_REDUCESCATTER, [TC_BROADCAST] = PLAIT_COLL_BROADCAST,
    [TC_ALLGATHER] = PLAIT_COLL_ALLGATHER, [TC_ALLTOALL] = PLAIT_COLL_ALLTOALL, [TC_GATHER] = PLAIT_COLL_GATHER,
    [TC_SCATTER] = PLAIT_COLL_SCATTER, [TC_SENDRECV] = -1, [TC_BARRIER] = PLAIT_COLL_BARRIER};

static int algo_id(const char *algo)
{
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++)
        if (plait_algorithms[a].step && strcmp(plait_algorithms[a].name, algo) == 0)
            return a;
    return -1;
}

/* The collectives of the matrix (and the barrier) that `algo` implements on nranks. */
static unsigned algo_mask(const char *algo, int nranks)
{
    const int a = algo_id(algo);
    unsigned mask = 0;
    for (int t = 0; a >= 0 && t <= TC_BARRIER; t++)
        if (coll_of_tc[t] >= 0 && plait_algorithms[a].supports(coll_of_tc[t], nranks))
            mask |= 1u << t;
    return mask;
}

/* Runs `m` (colls 0) with each of algos[] forced on each collective it
 * implements on nranks, the tree with `radix`; returns the communicators used. */
static int run_forced(enum mr_mode mode, int nranks, const char *const *algos, int nalgos, const char *radix,
                      const struct matrix *m, double timeout_s)
{
    unsigned left[PLAIT_ALGO_COUNT];
    for (int i = 0; i < nalgos; i++) {
        left[i] = algo_mask(algos[i], nranks) & ~(1u << TC_BARRIER);
        cr_assert_neq(left[i], 0u, "%s implements no collective on %d ranks", algos[i], nranks);
    }
    int barrier = -1; /* the first algorithm that implements the barrier forces it */
    for (int i = 0; i < nalgos && barrier < 0; i++)
        if (algo_mask(algos[i], nranks) & (1u << TC_BARRIER))
            barrier = i;
    setenv("PLAIT_TREE_RADIX", radix, 1);
    setenv("PLAIT_COLL_TIMEOUT", "120", 1);
    int comms = 0;
    for (;;) {
        char spec[512] = "";
        size_t o = 0;
        unsigned taken = 0;
        for (int i = 0; i < nalgos; i++)
            for (int t = 0; t < TC_COUNT; t++)
                if ((left[i] & (1u << t)) && !(taken & (1u << t))) {
                    o += (size_t)snprintf(spec + o, sizeof(spec) - o, "%s%s:%s", o ? ";" : "",
                                          plait_coll_name(coll_of_tc[t]), algos[i]);
                    taken |= 1u << t;
                    left[i] &= ~(1u << t);
                }
        if (!taken)
            break;
        if (barrier >= 0) {
            o += (size_t)snprintf(spec + o, sizeof(spec) - o, ";barrier:%s", algos[barrier]);
            barrier = -1;
        }
        cr_assert_lt(o, sizeof(spec));
        setenv("PLAIT_ALGO", spec, 1);
        cr_log_info("%s, %d ranks: PLAIT_ALGO=%s", mr_mode_name(mode), nranks, spec);
        struct matrix mm = *m;
        mm.colls = taken;
        char msg[1024];
        msg[0] = 0;
        int failed = mr_run(mode, nranks, matrix_rank, &mm, timeout_s, msg, sizeof(msg));
        comms++;
        cr_expect_eq(failed, 0, "%s, %d ranks, PLAIT_ALGO=%s, PLAIT_TREE_RADIX=%s: %d rank(s) failed: %s",
                     mr_mode_name(mode), nranks, spec, radix, failed, msg);
    }
    unsetenv("PLAIT_ALGO");
    unsetenv("PLAIT_TREE_RADIX");
    return comms;
}

/* 16 ranks as threads, one fast case per algorithm: every algorithm of the table
 * on every collective it implements at 16 ranks, small counts, a subset of
 * types. */
Test(wide, threads_16, .timeout = 900)
{
    static const size_t counts[] = {0, 1, 4099};
    static const struct matrix m = {counts, 3, 0, 0};
    const char *algos[PLAIT_ALGO_COUNT];
    int n = 0;
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++)
        if (plait_algorithms[a].step && (algo_mask(plait_algorithms[a].name, 16) & ~(1u << TC_BARRIER)))
            algos[n++] = plait_algorithms[a].name;
    cr_assert_gt(n, 1);
    run_forced(MR_THREADS, 16, algos, n, "3", &m, 900);
}

static void run_permul(int nranks);

/* The forced algorithms per (mode, rank count), in one test each; `radix` is
 * the tree's. */
#define FORCED(mode, n, radix, ...)                                                                               \
    do {                                                                                                          \
        static const char *const algos[] = {__VA_ARGS__};                                                        \
        run_forced(MR_##mode, n, algos, (int)(sizeof(algos) / sizeof(algos[0])), #radix, &full, 600);           \
    } while (0)
#define FORCED_TEST(mode, n, radix, ...)                                                                          \
    Test(algorithms, mode##_##n, .timeout = 900)                                                                 \
    {                                                                                                             \
        FORCED(mode, n, radix, __VA_ARGS__);                                                                      \
    }

/* and premulsum with a scalar per rank (below), on every allreduce algorithm */
Test(algorithms, THREADS_2, .timeout = 900)
{
    FORCED(THREADS, 2, 2, "tree", "bruck", "recursive", "pat");
    run_permul(2);
}

Test(algorithms, THREADS_3, .timeout = 900)
{
    FORCED(THREADS, 3, 2, "tree", "bruck", "oneshot", "pairwise");
    run_permul(3);
}

FORCED_TEST(THREADS, 4, 2, "hier")
FORCED_TEST(THREADS, 5, 2, "tree", "bruck", "recursive", "pat", "twoshot", "linear")
FORCED_TEST(THREADS, 6, 2, "pat")
FORCED_TEST(THREADS, 7, 2, "recursive")
FORCED_TEST(THREADS, 8, 4, "tree", "bruck")
FORCED_TEST(SHM, 3, 2, "tree", "recursive", "pat")
FORCED_TEST(SHM, 4, 2, "twoshot", "linear")
FORCED_TEST(SHM, 5, 2, "bruck")
FORCED_TEST(SHM, 6, 2, "recursive", "hier")
FORCED_TEST(SHM, 7, 3, "tree", "bruck")
FORCED_TEST(SHM, 8, 2, "tree", "recursive", "pat", "oneshot", "pairwise")
FORCED_TEST(SOCKET, 2, 2, "oneshot")
FORCED_TEST(SOCKET, 4, 2, "tree", "bruck", "recursive", "pat", "hier", "pairwise")
FORCED_TEST(SOCKET, 5, 2, "tree")
/* dissemination: see test_barrier */

/* ---------------------------------------------------------------- premulsum, a scalar per rank */

/* premulsum's scalar belongs to the rank that creates the op (as NCCL's
 * ncclRedOpCreatePreMulSum): rank q scales its own input by its own scalar,
 * q + 2 here, and every rank must get sum_q (q + 2) * x_q. One-shot and
 * two-shot once scaled the contributions they received by the receiver's
 * scalar, which is right only when every rank has the same one (avg's 1/n,
 * the matrix's premulsum). Every algorithm of the table that implements
 * allreduce runs, forced, on the FIFO path (PLAIT_PROTO=simple); small
 * chunks so that each channel walks many iterations. Inputs are small
 * integers: exact in every type and order. */
static const int permul_types[] = {PLAIT_INT32, PLAIT_INT64, PLAIT_FLOAT16, PLAIT_BFLOAT16, PLAIT_FLOAT32,
                                   PLAIT_FLOAT64};
static const size_t permul_counts[] = {1, 7, 1000, 70001};

static int64_t permul_input(int rank, size_t i)
{
    return (int64_t)(i % 7) - 3 + rank;
}

static void permul_store(void *buf, size_t i, int dtype, double v)
{
    switch (dtype) {
    case PLAIT_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case PLAIT_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case PLAIT_FLOAT16: ((uint16_t *)buf)[i] = plait_float_to_half((float)v); break;
    case PLAIT_BFLOAT16: ((uint16_t *)buf)[i] = plait_float_to_bf16((float)v); break;
    case PLAIT_FLOAT32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
    }
}

static double permul_load(const void *buf, size_t i, int dtype)
{
    switch (dtype) {
    case PLAIT_INT32: return ((const int32_t *)buf)[i];
    case PLAIT_INT64: return (double)((const int64_t *)buf)[i];
    case PLAIT_FLOAT16: return plait_half_to_float(((const uint16_t *)buf)[i]);
    case PLAIT_BFLOAT16: return plait_bf16_to_float(((const uint16_t *)buf)[i]);
    case PLAIT_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

static int permul_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    const size_t cap = permul_counts[sizeof(permul_counts) / sizeof(permul_counts[0]) - 1] * 8;
    char *sbuf = malloc(cap), *rbuf = malloc(cap);
    int bad = 0;
    if (!sbuf || !rbuf) {
        snprintf(msg, len, "out of memory");
        bad = 1;
    }
    for (size_t ti = 0; !bad && ti < sizeof(permul_types) / sizeof(permul_types[0]); ti++) {
        const int dtype = permul_types[ti];
        char scalar[8];
        permul_store(scalar, 0, dtype, rank + 2);
        plait_redop_t op;
        plait_result_t res = plait_redop_create_premulsum(&op, scalar, dtype, PLAIT_SCALAR_HOST_IMMEDIATE, comm);
        for (size_t ci = 0; res == PLAIT_SUCCESS && !bad && ci < sizeof(permul_counts) / sizeof(permul_counts[0]);
             ci++)
            for (int inplace = 0; res == PLAIT_SUCCESS && !bad && inplace < 2; inplace++) {
                const size_t count = permul_counts[ci];
                char *out = inplace ? sbuf : rbuf;
                for (size_t i = 0; i < count; i++)
                    permul_store(sbuf, i, dtype, (double)permul_input(rank, i));
                memset(rbuf, 0xcd, cap);
                res = plait_allreduce(sbuf, out, count, dtype, op, comm, NULL);
                for (size_t i = 0; res == PLAIT_SUCCESS && i < count; i++) {
                    int64_t want = 0;
                    for (int q = 0; q < n; q++)
                        want += (q + 2) * permul_input(q, i);
                    const double got = permul_load(out, i, dtype);
                    if (got != (double)want) {
                        snprintf(msg, len, "%s count %zu in place %d: element %zu is %g, expected %" PRId64,
                                 plait_dtype_name(dtype), count, inplace, i, got, want);
                        bad = 1;
                        break;
                    }
                }
            }
        if (res == PLAIT_SUCCESS)
            res = plait_redop_destroy(op, comm);
        if (res != PLAIT_SUCCESS) {
            snprintf(msg, len, "%s: %s: %s", plait_dtype_name(dtype), plait_get_error_string(res),
                     plait_get_last_error(comm));
            bad = 1;
        }
    }
    free(sbuf);
    free(rbuf);
    return bad;
}

/* Runs last in its test: it leaves PLAIT_CHUNK_SIZE and PLAIT_PROTO set. */
static void run_permul(int nranks)
{
    char msg[1024];
    int ran = 0;
    setenv("PLAIT_COLL_TIMEOUT", "120", 1);
    setenv("PLAIT_CHUNK_SIZE", "1024", 1);
    setenv("PLAIT_PROTO", "simple", 1); /* the schedules, not the small-message path */
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++) {
        const struct plait_algorithm *al = &plait_algorithms[a];
        if (!al->step || !al->supports(PLAIT_COLL_ALLREDUCE, nranks))
            continue;
        char algo[64];
        snprintf(algo, sizeof(algo), "allreduce:%s", al->name);
        setenv("PLAIT_ALGO", algo, 1);
        msg[0] = 0;
        int failed = mr_run(MR_THREADS, nranks, permul_rank, NULL, 300, msg, sizeof(msg));
        cr_expect_eq(failed, 0, "%s, %d ranks: %d rank(s) failed: %s", al->name, nranks, failed, msg);
        ran += strcmp(al->name, "oneshot") == 0 || strcmp(al->name, "twoshot") == 0;
    }
    cr_assert_eq(ran, 2, "oneshot and twoshot must both run");
}

