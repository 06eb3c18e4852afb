/*
 * perf/mpi/mpi_coll_perf.c — the collectives of plait's perf/ programs, timed
 * on an MPI library, so that perf/compare.sh can put both side by side.
 *
 *   mpirun -np N mpi_coll_perf -C allreduce [-b 8] [-e 128M] [-f 2] [-n 20] [-w 1] [-a 1] [-c 1]
 *
 * It is built by perf/compare.sh with each MPI's own mpicc (meson does not
 * build it: one binary per MPI library, and neither is a dependency of plait).
 *
 * What is measured is what perf/common.c measures, so that the rows compare:
 *  - float, sum, out of place, root 0; sizes from -b to -e, times -f;
 *  - `size` is the larger of one rank's input and output in bytes, and the
 *    counts derive from it as in perf/<coll>_perf.c (allgather, reducescatter
 *    and alltoall use size / 4 / nranks elements per rank);
 *  - every size is warmed up first (-w calls, sizes doubling), then per size:
 *    one untimed call, a barrier, -n timed calls; iteration k uses the k-th
 *    slice of -e sized buffers, as perf/common.c does;
 *  - time = elapsed / n on each rank, then combined over ranks by -a
 *    (0 rank 0, 1 average (the default, as in perf/common.c), 2 min, 3 max);
 *  - algbw = size / time; busbw = algbw * factor, with the factors of
 *    perf/common.c (docs/performance.md lists them);
 *  - -c check runs on known inputs count the wrong elements over all ranks.
 * The table has the columns of plait's; the in-place half is N/A.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum mpi_perf_coll {
    COLL_ALLREDUCE,
    COLL_ALLGATHER,
    COLL_REDUCESCATTER,
    COLL_BROADCAST,
    COLL_REDUCE,
    COLL_ALLTOALL,
    COLL_SENDRECV,
};

enum mpi_perf_factor { FACTOR_ONE, FACTOR_ALLREDUCE, FACTOR_N_MINUS_1_OVER_N };

enum mpi_perf_shape {
    SHAPE_SAME,     /* send = recv = count */
    SHAPE_GATHERED, /* send = count / n, recv = n * (count / n) */
    SHAPE_SCATTERED,/* send = n * (count / n), recv = count / n */
    SHAPE_EXCHANGE, /* send = recv = n * (count / n) */
};

/* One row per collective: its name on the command line and in the header, the
 * shape of its counts and its busbw factor (the same as perf/<coll>_perf.c). */
static const struct {
    const char *name;
    enum mpi_perf_shape shape;
    enum mpi_perf_factor factor;
    int is_reduction;
} mpi_perf_colls[] = {
    [COLL_ALLREDUCE] = {"allreduce", SHAPE_SAME, FACTOR_ALLREDUCE, 1},
    [COLL_ALLGATHER] = {"allgather", SHAPE_GATHERED, FACTOR_N_MINUS_1_OVER_N, 0},
    [COLL_REDUCESCATTER] = {"reducescatter", SHAPE_SCATTERED, FACTOR_N_MINUS_1_OVER_N, 1},
    [COLL_BROADCAST] = {"broadcast", SHAPE_SAME, FACTOR_ONE, 0},
    [COLL_REDUCE] = {"reduce", SHAPE_SAME, FACTOR_ONE, 1},
    [COLL_ALLTOALL] = {"alltoall", SHAPE_EXCHANGE, FACTOR_N_MINUS_1_OVER_N, 0},
    [COLL_SENDRECV] = {"sendrecv", SHAPE_SAME, FACTOR_ONE, 0},
};
#define MPI_PERF_NUM_COLLS ((int)(sizeof(mpi_perf_colls) / sizeof(mpi_perf_colls[0])))

struct mpi_perf_opts {
    int coll;
    size_t min_bytes, max_bytes, factor;
    int iters, warmup, average, check;
};

struct mpi_perf_ctx {
    struct mpi_perf_opts o;
    int rank, nranks;
    float *send, *recv;
    size_t buf_elems;
    /* Elements of the current size. */
    size_t send_count, recv_count, param_count;
};

static int mpi_perf_parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1024.0 * 1024.0; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; end++; break;
    default: break;
    }
    if (*end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v >= 1e18)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int mpi_perf_parse_int(const char *s, int min, int max, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

static void mpi_perf_usage(FILE *f)
{
    fprintf(f, "usage: mpi_coll_perf -C <");
    for (int c = 0; c < MPI_PERF_NUM_COLLS; c++)
        fprintf(f, "%s%s", c ? "|" : "", mpi_perf_colls[c].name);
    fprintf(f, "> [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-a 0/1/2/3] [-c checks]\n");
}

/* Returns 0 to run, 1 for help, -1 on a bad command line. */
static int mpi_perf_parse(int argc, char **argv, struct mpi_perf_opts *o)
{
    int c, factor = 2;
    o->coll = -1;
    o->min_bytes = 32u << 20;
    o->max_bytes = 32u << 20;
    o->iters = 20;
    o->warmup = 1;
    o->average = 1;
    o->check = 1;
    while ((c = getopt(argc, argv, "C:b:e:f:n:w:a:c:h")) != -1) {
        int bad = 0;
        switch (c) {
        case 'C':
            bad = 1;
            for (int k = 0; k < MPI_PERF_NUM_COLLS; k++) {
                if (strcasecmp(optarg, mpi_perf_colls[k].name) == 0) {
                    o->coll = k;
                    bad = 0;
                }
            }
            break;
        case 'b': bad = mpi_perf_parse_size(optarg, &o->min_bytes); break;
        case 'e': bad = mpi_perf_parse_size(optarg, &o->max_bytes); break;
        case 'f': bad = mpi_perf_parse_int(optarg, 2, 1 << 20, &factor); break;
        case 'n': bad = mpi_perf_parse_int(optarg, 1, 1 << 30, &o->iters); break;
        case 'w': bad = mpi_perf_parse_int(optarg, 0, 1 << 30, &o->warmup); break;
        case 'a': bad = mpi_perf_parse_int(optarg, 0, 3, &o->average); break;
        case 'c': bad = mpi_perf_parse_int(optarg, 0, 1 << 20, &o->check); break;
        case 'h': return 1;
        default: return -1;
        }
        if (bad) {
            fprintf(stderr, "mpi_coll_perf: invalid value '%s' for -%c\n", optarg, c);
            return -1;
        }
    }
    o->factor = (size_t)factor;
    if (o->coll < 0 || optind < argc || o->min_bytes > o->max_bytes) {
        fprintf(stderr, "mpi_coll_perf: a collective (-C) and minbytes <= maxbytes are required\n");
        return -1;
    }
    return 0;
}

static double mpi_perf_factor(enum mpi_perf_factor f, int n)
{
    switch (f) {
    case FACTOR_ALLREDUCE: return 2.0 * (double)(n - 1) / (double)n;
    case FACTOR_N_MINUS_1_OVER_N: return (double)(n - 1) / (double)n;
    default: return 1.0;
    }
}

static void mpi_perf_set_size(struct mpi_perf_ctx *ctx, size_t bytes)
{
    const size_t count = bytes / sizeof(float);
    const size_t n = (size_t)ctx->nranks;
    const size_t per_rank = count / n;
    switch (mpi_perf_colls[ctx->o.coll].shape) {
    case SHAPE_GATHERED:
        ctx->send_count = per_rank;
        ctx->recv_count = per_rank * n;
        ctx->param_count = per_rank;
        break;
    case SHAPE_SCATTERED:
        ctx->send_count = per_rank * n;
        ctx->recv_count = per_rank;
        ctx->param_count = per_rank;
        break;
    case SHAPE_EXCHANGE:
        ctx->send_count = per_rank * n;
        ctx->recv_count = per_rank * n;
        ctx->param_count = per_rank;
        break;
    default:
        ctx->send_count = count;
        ctx->recv_count = count;
        ctx->param_count = count;
        break;
    }
}

static size_t mpi_perf_total(const struct mpi_perf_ctx *ctx)
{
    return ctx->send_count > ctx->recv_count ? ctx->send_count : ctx->recv_count;
}

/* Iteration k works on the k-th slice of the buffers, as perf/common.c does, so
 * that small sizes do not always hit the same cache lines. */
static size_t mpi_perf_shift(const struct mpi_perf_ctx *ctx, long iter)
{
    size_t total = mpi_perf_total(ctx);
    size_t steps = total ? ctx->buf_elems / total : 1;
    if (steps == 0)
        steps = 1;
    return total * ((size_t)iter % steps);
}

/* MPI counts are int: the sizes this program is meant for stay far below. */
static int mpi_perf_call(struct mpi_perf_ctx *ctx, long iter)
{
    const size_t shift = mpi_perf_shift(ctx, iter);
    const float *s = ctx->send + shift;
    float *r = ctx->recv + shift;
    const int pc = (int)ctx->param_count;
    const int next = (ctx->rank + 1) % ctx->nranks;
    const int prev = (ctx->rank + ctx->nranks - 1) % ctx->nranks;

    switch (ctx->o.coll) {
    case COLL_ALLREDUCE: return MPI_Allreduce(s, r, pc, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case COLL_ALLGATHER: return MPI_Allgather(s, pc, MPI_FLOAT, r, pc, MPI_FLOAT, MPI_COMM_WORLD);
    case COLL_REDUCESCATTER: return MPI_Reduce_scatter_block(s, r, pc, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case COLL_BROADCAST:
        /* MPI_Bcast has one buffer: the root sends from its input, the others
         * receive into their output. */
        if (ctx->rank == 0)
            r = (float *)s;
        return MPI_Bcast(r, pc, MPI_FLOAT, 0, MPI_COMM_WORLD);
    case COLL_REDUCE: return MPI_Reduce(s, r, pc, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    case COLL_ALLTOALL: return MPI_Alltoall(s, pc, MPI_FLOAT, r, pc, MPI_FLOAT, MPI_COMM_WORLD);
    default:
        return MPI_Sendrecv(s, pc, MPI_FLOAT, next, 0, r, pc, MPI_FLOAT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
}

/* A small integer, so that every sum over ranks is exact in float. */
static float mpi_perf_input(int rank, size_t j, int seed)
{
    return (float)((int)((j * 13u + (size_t)rank * 7u + (size_t)seed * 5u) % 17u) - 8);
}

static float mpi_perf_sum(int nranks, size_t j, int seed)
{
    float v = 0.0f;
    for (int r = 0; r < nranks; r++)
        v += mpi_perf_input(r, j, seed);
    return v;
}

/* Runs the collective once on known inputs; returns the wrong elements of this
 * rank (elements that are not defined here, such as reduce's output off the
 * root, are not counted). */
static long mpi_perf_check_once(struct mpi_perf_ctx *ctx, int seed, int *err_out)
{
    const int me = ctx->rank, n = ctx->nranks;
    const size_t pc = ctx->param_count;
    long wrong = 0;

    for (size_t j = 0; j < ctx->send_count; j++)
        ctx->send[j] = mpi_perf_input(me, j, seed);
    memset(ctx->recv, 0xa5, ctx->recv_count * sizeof(float));
    *err_out = mpi_perf_call(ctx, 0);
    if (*err_out != MPI_SUCCESS)
        return 0;
    for (size_t i = 0; i < ctx->recv_count; i++) {
        float want;
        switch (ctx->o.coll) {
        case COLL_ALLREDUCE: want = mpi_perf_sum(n, i, seed); break;
        case COLL_ALLGATHER: want = mpi_perf_input((int)(i / pc), i % pc, seed); break;
        case COLL_REDUCESCATTER: want = mpi_perf_sum(n, (size_t)me * pc + i, seed); break;
        case COLL_BROADCAST:
            if (me == 0) /* the root's output is its input (see mpi_perf_call) */
                continue;
            want = mpi_perf_input(0, i, seed);
            break;
        case COLL_REDUCE:
            if (me != 0)
                continue;
            want = mpi_perf_sum(n, i, seed);
            break;
        case COLL_ALLTOALL: want = mpi_perf_input((int)(i / pc), (size_t)me * pc + i % pc, seed); break;
        default: want = mpi_perf_input((me + n - 1) % n, i, seed); break;
        }
        if (ctx->recv[i] != want)
            wrong++;
    }
    return wrong;
}

static int mpi_perf_fail(const char *what, int err)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    fprintf(stderr, "mpi_coll_perf: %s failed: %s\n", what, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}

static void mpi_perf_float_str(double v, int width, char *buf, size_t cap)
{
    if (snprintf(buf, cap, "%*.2f", width, v) <= width)
        return;
    if (snprintf(buf, cap, "%*.1f", width, v) <= width)
        return;
    if (snprintf(buf, cap, "%*.0f", width, v) <= width)
        return;
    snprintf(buf, cap, width >= 7 ? "%*.1e" : "%*.0e", width, v);
}

static void mpi_perf_header(const struct mpi_perf_ctx *ctx)
{
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char *nl = strchr(version, '\n');
    if (nl)
        *nl = '\0';
    char *comma = strchr(version, ',');
    if (comma && comma - version > 20)
        *comma = '\0';
    printf("# MPI perf tests: %s\n", version);
    printf("# Collective test starting: mpi_coll_perf -C %s\n", mpi_perf_colls[ctx->o.coll].name);
    printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d agg iters: 1 "
           "validation: %d graph: 0\n", ctx->o.min_bytes, ctx->o.max_bytes, ctx->o.factor, ctx->o.warmup,
           ctx->o.iters, ctx->o.check);
    printf("# Ranks: %d (MPI_COMM_WORLD); time combined over ranks: %s\n", ctx->nranks,
           (const char *[]){"rank 0", "average", "min", "max"}[ctx->o.average]);
    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n", "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type", "redop",
           "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    struct mpi_perf_ctx ctx;
    int err;

    memset(&ctx, 0, sizeof(ctx));
    int parsed = mpi_perf_parse(argc, argv, &ctx.o);
    if (parsed) {
        mpi_perf_usage(parsed > 0 ? stdout : stderr);
        return parsed > 0 ? 0 : 2;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ctx.nranks);
    if (ctx.o.max_bytes / sizeof(float) > (size_t)2147483647) {
        if (ctx.rank == 0)
            fprintf(stderr, "mpi_coll_perf: -e above 8 GiB does not fit MPI's int counts\n");
        MPI_Finalize();
        return 2;
    }

    ctx.buf_elems = ctx.o.max_bytes / sizeof(float) + 16;
    if (posix_memalign((void **)&ctx.send, 4096, ctx.buf_elems * sizeof(float)) ||
        posix_memalign((void **)&ctx.recv, 4096, ctx.buf_elems * sizeof(float))) {
        fprintf(stderr, "mpi_coll_perf: rank %d: cannot allocate 2 x %zu bytes\n", ctx.rank, ctx.o.max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Touch every page now, so that page faults stay out of the timings. */
    memset(ctx.send, 0, ctx.buf_elems * sizeof(float));
    memset(ctx.recv, 0, ctx.buf_elems * sizeof(float));
    if (ctx.rank == 0)
        mpi_perf_header(&ctx);

    for (size_t size = ctx.o.min_bytes; size <= ctx.o.max_bytes; size = size ? size * 2 : 1) {
        mpi_perf_set_size(&ctx, size);
        for (int w = 0; w < ctx.o.warmup; w++)
            if ((err = mpi_perf_call(&ctx, w)) != MPI_SUCCESS)
                return mpi_perf_fail("warm-up", err);
    }

    const char *op = mpi_perf_colls[ctx.o.coll].is_reduction ? "sum" : "none";
    const int root = ctx.o.coll == COLL_BROADCAST || ctx.o.coll == COLL_REDUCE ? 0 : -1;
    long error_rows = 0;
    double bw_sum = 0.0;
    int bw_count = 0;
    for (size_t size = ctx.o.min_bytes; size <= ctx.o.max_bytes; size = size ? size * ctx.o.factor : 1) {
        mpi_perf_set_size(&ctx, size);
        if ((err = mpi_perf_call(&ctx, 0)) != MPI_SUCCESS)
            return mpi_perf_fail(mpi_perf_colls[ctx.o.coll].name, err);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long it = 0; it < ctx.o.iters; it++)
            if ((err = mpi_perf_call(&ctx, it)) != MPI_SUCCESS)
                return mpi_perf_fail(mpi_perf_colls[ctx.o.coll].name, err);
        double sec = (MPI_Wtime() - t0) / (double)ctx.o.iters, combined = 0.0;
        static const MPI_Op ops[4] = {MPI_SUM, MPI_SUM, MPI_MIN, MPI_MAX};
        if (ctx.o.average == 0) {
            combined = sec;
            MPI_Bcast(&combined, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        } else {
            MPI_Allreduce(&sec, &combined, 1, MPI_DOUBLE, ops[ctx.o.average], MPI_COMM_WORLD);
            if (ctx.o.average == 1)
                combined /= (double)ctx.nranks;
        }

        long wrong = 0, wrong_all = 0;
        for (int c = 0; c < ctx.o.check && wrong_all == 0; c++) {
            wrong = mpi_perf_check_once(&ctx, c + 1, &err);
            if (err != MPI_SUCCESS)
                return mpi_perf_fail(mpi_perf_colls[ctx.o.coll].name, err);
            MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        }
        if (ctx.rank == 0) {
            double bytes = (double)(mpi_perf_total(&ctx) * sizeof(float));
            double algbw = combined > 0 ? bytes / 1e9 / combined : 0.0;
            double busbw = algbw * mpi_perf_factor(mpi_perf_colls[ctx.o.coll].factor, ctx.nranks);
            char t[32], a[32], b[32], wr[32];
            mpi_perf_float_str(combined * 1e6, 7, t, sizeof(t));
            mpi_perf_float_str(algbw, 6, a, sizeof(a));
            mpi_perf_float_str(busbw, 6, b, sizeof(b));
            if (ctx.o.check)
                snprintf(wr, sizeof(wr), "%5ld", wrong_all);
            else
                snprintf(wr, sizeof(wr), "%5s", "N/A");
            printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n",
                   mpi_perf_total(&ctx) * sizeof(float), ctx.param_count, "float", op, root, t, a, b, wr, "N/A",
                   "N/A", "N/A", "N/A");
            fflush(stdout);
            bw_sum += busbw;
            bw_count++;
        }
        if (wrong_all)
            error_rows++;
        if (size > ctx.o.max_bytes / ctx.o.factor)
            break;
    }
    if (ctx.rank == 0) {
        printf("# %-20s : %ld %s\n", "Out of bounds values", error_rows, error_rows ? "FAILED" : "OK");
        printf("# %-20s : %g\n", "Avg bus bandwidth", bw_count ? bw_sum / bw_count : 0.0);
        printf("#\n# Collective test concluded: mpi_coll_perf\n#\n");
        fflush(stdout);
    }
    free(ctx.send);
    free(ctx.recv);
    MPI_Finalize();
    return error_rows ? 1 : 0;
}
