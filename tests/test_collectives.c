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
                        size_t bad = run_one(comm, rank, n, coll, dtype, op, inplace, count, root, sbuf, rbuf, one,
                                             sizeof(one));
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
 * algorithm implements none of them fails: it would prove nothing. */
static unsigned algo_mask(const char *algo, int nranks)
{
    static const int map[][2] = {{PLAIT_COLL_ALLREDUCE, TC_ALLREDUCE},   {PLAIT_COLL_REDUCE, TC_REDUCE},
                                 {PLAIT_COLL_REDUCESCATTER, TC_REDUCESCATTER}, {PLAIT_COLL_BROADCAST, TC_BROADCAST},
                                 {PLAIT_COLL_ALLGATHER, TC_ALLGATHER},   {PLAIT_COLL_ALLTOALL, TC_ALLTOALL},
                                 {PLAIT_COLL_GATHER, TC_GATHER},         {PLAIT_COLL_SCATTER, TC_SCATTER}};
    unsigned mask = 0;
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++)
        if (plait_algorithms[a].step && strcmp(plait_algorithms[a].name, algo) == 0)
            for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
                if (plait_algorithms[a].supports(map[i][0], nranks))
                    mask |= 1u << map[i][1];
    return mask;
}

static void run_algo(const char *algo, const char *radix, enum mr_mode mode, int nranks)
{
    setenv("PLAIT_ALGO", algo, 1);
    setenv("PLAIT_TREE_RADIX", radix, 1);
    struct matrix m = {full_counts, 4, 1, algo_mask(algo, nranks)};
    cr_assert_neq(m.colls, 0u, "%s implements no collective on %d ranks", algo, nranks);
    run_matrix(mode, nranks, &m);
}

/* 16 ranks as threads, one fast case per algorithm: every algorithm of the table
 * on every collective it implements at 16 ranks, small counts, a subset of
 * types. */
Test(wide, threads_16, .timeout = 900)
{
    static const size_t counts[] = {0, 1, 4099};
    int ran = 0;
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++) {
        if (!plait_algorithms[a].step)
            continue;
        struct matrix m = {counts, 3, 0, algo_mask(plait_algorithms[a].name, 16)};
        if (!m.colls)
            continue;
        setenv("PLAIT_ALGO", plait_algorithms[a].name, 1);
        setenv("PLAIT_TREE_RADIX", "3", 1);
        cr_log_info("16 ranks: %s", plait_algorithms[a].name);
        run_matrix(MR_THREADS, 16, &m);
        ran++;
    }
    cr_assert_gt(ran, 1);
}

/* tree: radix in the name */
#define TREE_TEST(radix, mode, n)                                                                                 \
    Test(algorithms, tree_k##radix##_##mode##_##n, .timeout = 600)                                               \
    {                                                                                                             \
        run_algo("tree", #radix, MR_##mode, n);                                                                   \
    }
#define ALGO_TEST(algo, mode, n)                                                                                  \
    Test(algorithms, algo##_##mode##_##n, .timeout = 600)                                                        \
    {                                                                                                             \
        run_algo(#algo, "2", MR_##mode, n);                                                                       \
    }

TREE_TEST(2, THREADS, 2)
TREE_TEST(2, THREADS, 5)
TREE_TEST(2, SHM, 3)
TREE_TEST(2, SHM, 8)
TREE_TEST(3, SHM, 7)
TREE_TEST(4, THREADS, 8)
TREE_TEST(2, SOCKET, 4)
TREE_TEST(2, THREADS, 3)
TREE_TEST(2, SOCKET, 5)
ALGO_TEST(bruck, THREADS, 2)
ALGO_TEST(bruck, THREADS, 3)
ALGO_TEST(bruck, THREADS, 8)
ALGO_TEST(bruck, SHM, 5)
ALGO_TEST(bruck, SHM, 7)
ALGO_TEST(bruck, SOCKET, 4)
/* recursive */
ALGO_TEST(recursive, THREADS, 2)
ALGO_TEST(recursive, THREADS, 5)
ALGO_TEST(recursive, SHM, 3)
ALGO_TEST(recursive, SHM, 8)
ALGO_TEST(recursive, SOCKET, 4)
ALGO_TEST(recursive, THREADS, 7)
ALGO_TEST(recursive, SHM, 6)
/* pat */
ALGO_TEST(pat, THREADS, 2)
ALGO_TEST(pat, THREADS, 5)
ALGO_TEST(pat, SHM, 3)
ALGO_TEST(pat, SHM, 8)
ALGO_TEST(pat, SOCKET, 4)
ALGO_TEST(pat, THREADS, 6)
/* hier */
ALGO_TEST(hier, THREADS, 4)
ALGO_TEST(hier, SHM, 6)
ALGO_TEST(hier, SOCKET, 4)
/* oneshot, twoshot */
ALGO_TEST(oneshot, THREADS, 3)
ALGO_TEST(oneshot, SHM, 8)
ALGO_TEST(oneshot, SOCKET, 2)
ALGO_TEST(twoshot, THREADS, 5)
ALGO_TEST(twoshot, SHM, 4)
/* pairwise, linear */
ALGO_TEST(pairwise, THREADS, 3)
ALGO_TEST(pairwise, SHM, 8)
ALGO_TEST(pairwise, SOCKET, 4)
ALGO_TEST(linear, THREADS, 5)
ALGO_TEST(linear, SHM, 4)
ALGO_TEST(bruck, THREADS, 5)
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

Test(algorithms, premulsum_per_rank_THREADS_2, .timeout = 600)
{
    run_permul(2);
}

Test(algorithms, premulsum_per_rank_THREADS_3, .timeout = 600)
{
    run_permul(3);
}
