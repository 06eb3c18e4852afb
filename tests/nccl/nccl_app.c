/*
 * A user's program, written against NVIDIA's nccl.h and nothing of plait's:
 * the test of libnccl.so.2 (issue 4, parts 3, 4 and 6).
 *
 *   nccl_app NRANKS [--expect-lib PATH]
 *
 * It forks NRANKS ranks (2 to 4) that get their ncclUniqueIds from the parent
 * through pipes, and runs on host buffers, with real data checked element by
 * element: every collective in and out of place with rotating roots, Send/Recv
 * in a group, every datatype x op of AllReduce, grouped and nested groups,
 * premultiplied sums, splits (with NCCL_SPLIT_NOCOLOR), shrink and revoke,
 * registration, ncclMemAlloc buffers, bad arguments and their last-error
 * messages, a non-blocking communicator (init, a collective, then an abort while
 * an operation is stuck), ncclCommInitRankScalable, finalize and destroy. The
 * parent then runs what needs a single process: ncclCommInitAll driven from one
 * thread, ncclGroupSimulateEnd, the device-API and window entry points, error
 * strings, version.
 *
 * With --expect-lib, every NCCL function this program calls must have been
 * resolved by the dynamic linker to that library (dladdr): run with LD_PRELOAD
 * of plait's libnccl.so.2, this proves that nothing reached NVIDIA's.
 *
 * One line per check ("[rank R] ok: ..." or "[rank R] FAIL: ..."). Exit status:
 * 0 every check passed; 1 a check failed; 2 a usage or setup error; 3 the
 * library failed at ncclGetUniqueId or ncclCommInitRank (what NVIDIA's NCCL does
 * on a machine without a GPU: the test that runs without LD_PRELOAD expects it).
 *
 * Streams: every call passes a NULL cudaStream_t (the type comes from nccl.h's
 * own include of the CUDA runtime header); the program does not link libcudart.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The device-API host entry points of NCCL 2.28 are declared in nccl_device.h,
 * which is C++. Declared here with the same ABI: pointers to NCCL's opaque
 * structures as void *, and the team, a struct of three ints, by value. */
struct app_team {
    int nRanks, rank, stride;
};
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *devcomm_out);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void *devcomm);
struct app_team ncclTeamWorld(ncclComm_t comm);
struct app_team ncclTeamLsa(ncclComm_t comm);
struct app_team ncclTeamRail(ncclComm_t comm);
int ncclTeamRankToWorld(ncclComm_t comm, struct app_team team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, struct app_team team, int rank);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void *handle_out, void *req_out);
ncclResult_t ncclLsaBarrierCreateRequirement(struct app_team team, int nBarriers, void *handle_out, void *req_out);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, struct app_team team, int nBarriers, void *handle_out,
                                             void *req_out);

#define EXIT_CHECK_FAILED 1
#define EXIT_SETUP 2
#define EXIT_INIT_FAILED 3

/* Deadlines: each rank is killed by SIGALRM after RANK_DEADLINE_S; the parent
 * gives the ranks RUN_DEADLINE_S in all. Meson's limit for the test is 60 s. */
#define RANK_DEADLINE_S 45
#define RUN_DEADLINE_S 50.0

enum { ID_MAIN, ID_NONBLOCKING, ID_SCALABLE0, ID_SCALABLE1, NUM_IDS };

static int g_rank = -1; /* -1: the parent */
static int g_nranks;
static int g_failures;
static int g_checks;

static void say(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int ok, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    g_checks++;
    if (!ok)
        g_failures++;
    if (g_rank < 0)
        printf("[parent] %s: %s\n", ok ? "ok" : "FAIL", line);
    else
        printf("[rank %d] %s: %s\n", g_rank, ok ? "ok" : "FAIL", line);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Checks that a call succeeded; on failure says why (result and last error). */
static int expect_ok(ncclResult_t r, const char *what)
{
    if (r == ncclSuccess)
        return 1;
    say(0, "%s returned %d (%s): %s", what, (int)r, ncclGetErrorString(r), ncclGetLastError(NULL));
    return 0;
}

static const char *result_name(ncclResult_t r)
{
    static const char *const names[] = {"ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError",
                                        "ncclInternalError",   "ncclInvalidArgument",    "ncclInvalidUsage",
                                        "ncclRemoteError",     "ncclInProgress"};
    return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "(not an ncclResult_t of 2.28)";
}

/* Checks that a call failed with `want` and left a non-empty last-error message. */
static void expect_error(ncclResult_t r, ncclResult_t want, const char *what)
{
    const char *msg = ncclGetLastError(NULL);
    if (r == want && msg && msg[0])
        say(1, "%s -> %s: \"%s\"", what, result_name(r), msg);
    else
        say(0, "%s -> %d %s, want %s with a message; last error: \"%s\"", what, (int)r, result_name(r),
            result_name(want), msg ? msg : "(NULL)");
}

/* A non-blocking communicator's state: polls ncclCommGetAsyncError until it is
 * no longer ncclInProgress (or the deadline), returns the last state. */
static ncclResult_t wait_async(ncclComm_t comm, double timeout_s)
{
    double end = now_s() + timeout_s;
    ncclResult_t state = ncclInProgress;
    for (;;) {
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess)
            return r;
        if (state != ncclInProgress || now_s() > end)
            return state;
        sleep_ms(1);
    }
}

/* ---------------------------------------------------------------- types */

struct type_info {
    ncclDataType_t type;
    const char *name;
    size_t size;
    int is_float, is_signed;
    int ebits, mbits; /* for the 16- and 8-bit floats */
};

static const struct type_info types[] = {
    {ncclInt8, "int8", 1, 0, 1, 0, 0},
    {ncclUint8, "uint8", 1, 0, 0, 0, 0},
    {ncclInt32, "int32", 4, 0, 1, 0, 0},
    {ncclUint32, "uint32", 4, 0, 0, 0, 0},
    {ncclInt64, "int64", 8, 0, 1, 0, 0},
    {ncclUint64, "uint64", 8, 0, 0, 0, 0},
    {ncclFloat16, "float16", 2, 1, 1, 5, 10},
    {ncclFloat32, "float32", 4, 1, 1, 0, 0},
    {ncclFloat64, "float64", 8, 1, 1, 0, 0},
    {ncclBfloat16, "bfloat16", 2, 1, 1, 8, 7},
    {ncclFloat8e4m3, "float8e4m3", 1, 1, 1, 4, 3},
    {ncclFloat8e5m2, "float8e5m2", 1, 1, 1, 5, 2},
};
#define NUM_TYPES (sizeof(types) / sizeof(types[0]))

static const struct type_info *type_of(ncclDataType_t t)
{
    for (size_t i = 0; i < NUM_TYPES; i++)
        if (types[i].type == t)
            return &types[i];
    return NULL;
}

/* Small floats (fp16, bf16, fp8), written here from the formats' definitions:
 * round to nearest even, no overflow handling (the test's values are small). */
static uint32_t minifloat_encode(double v, int ebits, int mbits)
{
    uint32_t sign = signbit(v) ? 1u : 0u;
    double a = fabs(v);
    int bias = (1 << (ebits - 1)) - 1;
    if (a == 0.0)
        return sign << (ebits + mbits);
    int e;
    double f = frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    int exp = e - 1 + bias;
    double mant;
    if (exp <= 0) {
        mant = a / ldexp(1.0, 1 - bias - mbits);
        exp = 0;
    } else {
        mant = (2.0 * f - 1.0) * (double)(1 << mbits);
    }
    double rm = nearbyint(mant);
    if (rm >= (double)(1 << mbits)) {
        rm = 0;
        exp++;
    }
    return (sign << (ebits + mbits)) | ((uint32_t)exp << mbits) | (uint32_t)rm;
}

static double minifloat_decode(uint32_t bits, int ebits, int mbits)
{
    uint32_t sign = (bits >> (ebits + mbits)) & 1u;
    uint32_t emax = (1u << ebits) - 1;
    uint32_t exp = (bits >> mbits) & emax;
    uint32_t m = bits & ((1u << mbits) - 1);
    int bias = (1 << (ebits - 1)) - 1;
    double v;
    if (ebits == 4 && mbits == 3 && exp == emax && m == (1u << mbits) - 1)
        v = NAN; /* e4m3 has no infinity; only S.1111.111 is NaN */
    else if (exp == emax && !(ebits == 4 && mbits == 3))
        v = m ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp(1.0 + ldexp((double)m, -mbits), (int)exp - bias);
    return sign ? -v : v;
}

/* Stores v (an integer value for integer types, wrapped to the width) at element i. */
static void store(const struct type_info *t, void *buf, size_t i, double v)
{
    if (!t->is_float) {
        uint64_t u = (uint64_t)(int64_t)llround(v);
        switch (t->size) {
        case 1: ((uint8_t *)buf)[i] = (uint8_t)u; break;
        case 4: ((uint32_t *)buf)[i] = (uint32_t)u; break;
        default: ((uint64_t *)buf)[i] = u; break;
        }
        return;
    }
    switch (t->type) {
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = v; break;
    case ncclFloat16:
    case ncclBfloat16: ((uint16_t *)buf)[i] = (uint16_t)minifloat_encode(v, t->ebits, t->mbits); break;
    default: ((uint8_t *)buf)[i] = (uint8_t)minifloat_encode(v, t->ebits, t->mbits); break;
    }
}

static double load(const struct type_info *t, const void *buf, size_t i)
{
    if (!t->is_float) {
        switch (t->size) {
        case 1: return t->is_signed ? (double)((const int8_t *)buf)[i] : (double)((const uint8_t *)buf)[i];
        case 4: return t->is_signed ? (double)((const int32_t *)buf)[i] : (double)((const uint32_t *)buf)[i];
        default: return t->is_signed ? (double)((const int64_t *)buf)[i] : (double)((const uint64_t *)buf)[i];
        }
    }
    switch (t->type) {
    case ncclFloat32: return ((const float *)buf)[i];
    case ncclFloat64: return ((const double *)buf)[i];
    case ncclFloat16:
    case ncclBfloat16: return minifloat_decode(((const uint16_t *)buf)[i], t->ebits, t->mbits);
    default: return minifloat_decode(((const uint8_t *)buf)[i], t->ebits, t->mbits);
    }
}

/* Wraps an exact integer result to the type's width (as the library's integer
 * arithmetic does), so that it compares with load(). */
static double wrap(const struct type_info *t, double v)
{
    if (t->is_float)
        return v;
    uint64_t buf[1];
    store(t, buf, 0, v);
    return load(t, buf, 0);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(EXIT_SETUP);
    }
    return p;
}

/* Compares n elements with expected values; reports the first mismatch. */
static int compare(const struct type_info *t, const void *got, const double *want, size_t n, double tol,
                   const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double g = load(t, got, i);
        double w = want[i];
        double err = fabs(g - w);
        if (!(err <= tol * (fabs(w) > 1.0 ? fabs(w) : 1.0))) {
            say(0, "%s: element %zu of %zu is %g, expected %g", what, i, n, g, w);
            return 0;
        }
    }
    return 1;
}

/* ---------------------------------------------------------------- data patterns */

/* The value of element i on rank r for data movement (broadcast, gathers,
 * alltoall, send/recv): distinct per rank and element, exact in the type. */
static double pattern(const struct type_info *t, int r, size_t i)
{
    if (t->type == ncclFloat32 || t->type == ncclFloat64 || t->type == ncclInt32 || t->type == ncclInt64)
        return (double)(r * 1000 + (int)(i % 997));
    return (double)((r * 37 + (int)(i % 211)) % 100); /* small: fits int8 and uint8 (sums wrap) */
}

/* The sum over ranks 0..nranks-1 of element i's pattern (not wrapped). */
static double pattern_sum(const struct type_info *t, int nranks, size_t i)
{
    double s = 0;
    for (int r = 0; r < nranks; r++)
        s += pattern(t, r, i);
    return s;
}

/* Inputs of a reduction: small integers, so that sums and products are exact in
 * every type whatever the order (fp8: sums of 4 ranks stay within [-8, 8]). */
static double red_input(const struct type_info *t, ncclRedOp_t op, int r, size_t i)
{
    size_t k = i % 61;
    if (op == ncclProd) {
        double mag = ((k + (size_t)r) % 3 == 0) ? 2.0 : 1.0;
        double sign = (t->is_signed && ((k + 2 * (size_t)r) % 2)) ? -1.0 : 1.0;
        return mag * sign;
    }
    if (t->is_signed)
        return (double)((int)((k * 5 + (size_t)r * 3) % 5) - 2); /* [-2, 2] */
    return (double)((k * 5 + (size_t)r * 3) % 5); /* [0, 4] */
}

/* The expected result of op over every rank's red_input. */
static double red_expected(const struct type_info *t, ncclRedOp_t op, int nranks, size_t i)
{
    double acc = red_input(t, op, 0, i);
    for (int r = 1; r < nranks; r++) {
        double v = red_input(t, op, r, i);
        switch (op) {
        case ncclProd: acc *= v; break;
        case ncclMax: acc = v > acc ? v : acc; break;
        case ncclMin: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (op == ncclAvg)
        acc = t->is_float ? acc / nranks : trunc(acc / nranks); /* integer avg: sum, then divide (toward 0) */
    return wrap(t, acc);
}

/* Relative tolerance of a float avg (each contribution scaled and rounded). */
static double avg_tolerance(const struct type_info *t, int nranks)
{
    double eps = t->type == ncclFloat16 ? 0x1p-10 : t->type == ncclBfloat16 ? 0x1p-7 : t->type == ncclFloat32 ? 0x1p-22 : 0x1p-50;
    return 2.0 * (nranks + 1) * eps;
}

static const char *op_name(ncclRedOp_t op)
{
    static const char *const names[] = {"sum", "prod", "max", "min", "avg"};
    return (int)op >= 0 && (int)op < 5 ? names[op] : "premulsum";
}

/* ---------------------------------------------------------------- collectives */

/* Every collective with the pattern data of type t, `count` elements per block,
 * out of place and in place, the root rotating with `iter`. */
static void check_collectives(ncclComm_t comm, const struct type_info *t, size_t count, int iter)
{
    const int n = g_nranks, me = g_rank;
    const int root = iter % n;
    const size_t es = t->size;
    const size_t total = count * (size_t)n;
    char *send = xcalloc(total, es), *recv = xcalloc(total, es);
    double *want = xcalloc(total, sizeof(double));
    char what[160];

    for (int inplace = 0; inplace < 2; inplace++) {
        const char *mode = inplace ? "in place" : "out of place";

        /* AllReduce, sum of the patterns. */
        for (size_t i = 0; i < count; i++) {
            store(t, send, i, pattern(t, me, i));
            want[i] = wrap(t, pattern_sum(t, n, i));
        }
        snprintf(what, sizeof(what), "ncclAllReduce %s count %zu %s", t->name, count, mode);
        if (expect_ok(ncclAllReduce(send, inplace ? send : recv, count, t->type, ncclSum, comm, NULL), what) &&
            compare(t, inplace ? send : recv, want, count, 0, what))
            say(1, "%s", what);

        /* Broadcast from root. */
        for (size_t i = 0; i < count; i++) {
            store(t, send, i, pattern(t, me, i));
            store(t, recv, i, -1);
            want[i] = pattern(t, root, i);
        }
        snprintf(what, sizeof(what), "ncclBroadcast %s count %zu root %d %s", t->name, count, root, mode);
        if (expect_ok(ncclBroadcast(send, inplace ? send : recv, count, t->type, root, comm, NULL), what) &&
            compare(t, inplace ? send : recv, want, count, 0, what))
            say(1, "%s", what);

        /* Reduce (sum) to root. */
        for (size_t i = 0; i < count; i++) {
            store(t, send, i, pattern(t, me, i));
            want[i] = wrap(t, pattern_sum(t, n, i));
        }
        snprintf(what, sizeof(what), "ncclReduce %s count %zu root %d %s", t->name, count, root, mode);
        if (expect_ok(ncclReduce(send, inplace ? send : recv, count, t->type, ncclSum, root, comm, NULL), what) &&
            (me != root || compare(t, inplace ? send : recv, want, count, 0, what)))
            say(1, "%s", what);

        /* AllGather: block r is rank r's. In place: my input sits in my block. */
        for (size_t i = 0; i < total; i++) {
            store(t, recv, i, -1);
            want[i] = pattern(t, (int)(i / count), i % count);
        }
        for (size_t i = 0; i < count; i++)
            store(t, inplace ? recv + (size_t)me * count * es : send, i, pattern(t, me, i));
        snprintf(what, sizeof(what), "ncclAllGather %s count %zu %s", t->name, count, mode);
        if (expect_ok(ncclAllGather(inplace ? recv + (size_t)me * count * es : send, recv, count, t->type, comm,
                                    NULL),
                      what) &&
            compare(t, recv, want, total, 0, what))
            say(1, "%s", what);

        /* ReduceScatter: rank r gets the sum of everyone's block r. */
        for (size_t i = 0; i < total; i++)
            store(t, send, i, pattern(t, me, i));
        for (size_t i = 0; i < count; i++)
            want[i] = wrap(t, pattern_sum(t, n, (size_t)me * count + i));
        snprintf(what, sizeof(what), "ncclReduceScatter %s count %zu %s", t->name, count, mode);
        {
            char *out = inplace ? send + (size_t)me * count * es : recv;
            if (expect_ok(ncclReduceScatter(send, out, count, t->type, ncclSum, comm, NULL), what) &&
                compare(t, out, want, count, 0, what))
                say(1, "%s", what);
        }

        /* Gather to root: block r is rank r's. In place on the root: its input in its block. */
        for (size_t i = 0; i < total; i++) {
            store(t, recv, i, -1);
            want[i] = pattern(t, (int)(i / count), i % count);
        }
        {
            int ip = inplace && me == root;
            char *in = ip ? recv + (size_t)root * count * es : send;
            for (size_t i = 0; i < count; i++)
                store(t, in, i, pattern(t, me, i));
            snprintf(what, sizeof(what), "ncclGather %s count %zu root %d %s", t->name, count, root, mode);
            if (expect_ok(ncclGather(in, recv, count, t->type, root, comm, NULL), what) &&
                (me != root || compare(t, recv, want, total, 0, what)))
                say(1, "%s", what);
        }

        /* Scatter from root: rank r gets the root's block r. In place on the root:
         * its output is its own block of the send buffer. */
        for (size_t i = 0; i < total; i++)
            store(t, send, i, pattern(t, me, i));
        for (size_t i = 0; i < count; i++) {
            store(t, recv, i, -1);
            want[i] = pattern(t, root, (size_t)me * count + i);
        }
        {
            int ip = inplace && me == root;
            char *out = ip ? send + (size_t)root * count * es : recv;
            snprintf(what, sizeof(what), "ncclScatter %s count %zu root %d %s", t->name, count, root, mode);
            if (expect_ok(ncclScatter(send, out, count, t->type, root, comm, NULL), what) &&
                compare(t, out, want, count, 0, what))
                say(1, "%s", what);
        }
    }

    /* Bcast: always in place. */
    for (size_t i = 0; i < count; i++) {
        store(t, send, i, pattern(t, me, i));
        want[i] = pattern(t, (root + 1) % n, i);
    }
    snprintf(what, sizeof(what), "ncclBcast %s count %zu root %d", t->name, count, (root + 1) % n);
    if (expect_ok(ncclBcast(send, count, t->type, (root + 1) % n, comm, NULL), what) &&
        compare(t, send, want, count, 0, what))
        say(1, "%s", what);

    /* AlltoAll: my block r comes from rank r's block me (out of place only). */
    for (size_t i = 0; i < total; i++) {
        store(t, send, i, pattern(t, me, i));
        store(t, recv, i, -1);
        want[i] = pattern(t, (int)(i / count), (size_t)me * count + i % count);
    }
    snprintf(what, sizeof(what), "ncclAlltoAll %s count %zu", t->name, count);
    if (expect_ok(ncclAlltoAll(send, recv, count, t->type, comm, NULL), what) && compare(t, recv, want, total, 0, what))
        say(1, "%s", what);

    free(send);
    free(recv);
    free(want);
}

/* Every datatype x built-in op of AllReduce (fp8: sum, min and max), out of
 * place, then in place for sum. */
static void check_allreduce_matrix(ncclComm_t comm)
{
    const size_t count = 131;
    const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
    for (size_t ti = 0; ti < NUM_TYPES; ti++) {
        const struct type_info *t = &types[ti];
        char *send = xcalloc(count, t->size), *recv = xcalloc(count, t->size);
        double want[131];
        for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++) {
            ncclRedOp_t op = ops[oi];
            if (t->ebits && t->mbits <= 3 && (op == ncclProd || op == ncclAvg))
                continue; /* fp8: sum, min, max */
            for (int inplace = 0; inplace < (op == ncclSum ? 2 : 1); inplace++) {
                for (size_t i = 0; i < count; i++) {
                    store(t, send, i, red_input(t, op, g_rank, i));
                    store(t, recv, i, 99);
                    want[i] = red_expected(t, op, g_nranks, i);
                }
                char what[128];
                snprintf(what, sizeof(what), "ncclAllReduce %s %s%s", t->name, op_name(op), inplace ? " in place" : "");
                void *out = inplace ? send : recv;
                double tol = (op == ncclAvg && t->is_float) ? avg_tolerance(t, g_nranks) : 0.0;
                if (expect_ok(ncclAllReduce(send, out, count, t->type, op, comm, NULL), what) &&
                    compare(t, out, want, count, tol, what))
                    say(1, "%s", what);
            }
        }
        free(send);
        free(recv);
    }
}

/* Premultiplied sums with host scalars: out = sum over ranks of scalar * in. The
 * scalar is copied at creation (ncclScalarHostImmediate): changing it afterwards
 * must not change the result. */
static void check_premulsum(ncclComm_t comm)
{
    struct {
        ncclDataType_t type;
        double scalar;
    } cases[] = {{ncclFloat32, 0.5}, {ncclFloat64, -3.0}, {ncclInt32, 3.0}, {ncclBfloat16, 2.0}, {ncclFloat16, 0.25}};
    const size_t count = 257;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const struct type_info *t = type_of(cases[c].type);
        char scalar[8];
        store(t, scalar, 0, cases[c].scalar);
        ncclRedOp_t op;
        char what[128];
        snprintf(what, sizeof(what), "ncclRedOpCreatePreMulSum %s scalar %g (host)", t->name, cases[c].scalar);
        if (!expect_ok(ncclRedOpCreatePreMulSum(&op, scalar, t->type, ncclScalarHostImmediate, comm), what))
            continue;
        say((int)op >= (int)ncclNumOps, "%s: op %d (>= ncclNumOps)", what, (int)op);
        store(t, scalar, 0, 100.0); /* must not matter: the value was copied */
        char *send = xcalloc(count, t->size), *recv = xcalloc(count, t->size);
        double *want = xcalloc(count, sizeof(double));
        for (size_t i = 0; i < count; i++) {
            store(t, send, i, red_input(t, ncclSum, g_rank, i));
            double s = 0;
            for (int r = 0; r < g_nranks; r++)
                s += cases[c].scalar * red_input(t, ncclSum, r, i);
            want[i] = wrap(t, s);
        }
        snprintf(what, sizeof(what), "ncclAllReduce %s premulsum scalar %g", t->name, cases[c].scalar);
        if (expect_ok(ncclAllReduce(send, recv, count, t->type, op, comm, NULL), what) &&
            compare(t, recv, want, count, 0, what))
            say(1, "%s", what);
        /* A reduce-scatter with the same op. */
        snprintf(what, sizeof(what), "ncclReduceScatter %s premulsum", t->name);
        char *send2 = xcalloc(count * (size_t)g_nranks, t->size);
        for (size_t i = 0; i < count * (size_t)g_nranks; i++)
            store(t, send2, i, red_input(t, ncclSum, g_rank, i % count));
        if (expect_ok(ncclReduceScatter(send2, recv, count, t->type, op, comm, NULL), what) &&
            compare(t, recv, want, count, 0, what))
            say(1, "%s", what);
        free(send2);
        snprintf(what, sizeof(what), "ncclRedOpDestroy %s premulsum", t->name);
        if (expect_ok(ncclRedOpDestroy(op, comm), what))
            say(1, "%s", what);
        free(send);
        free(recv);
        free(want);
    }
}

/* A ring exchange in one group (send right, receive from the left), plus a
 * message to self, then several collectives in one group and a nested group. */
static void check_groups(ncclComm_t comm)
{
    const int n = g_nranks, me = g_rank;
    const struct type_info *t = type_of(ncclFloat32);
    const size_t count = 4099;
    float *sbuf = xcalloc(count, 4), *rbuf = xcalloc(count, 4), *self = xcalloc(count, 4);
    double *want = xcalloc(count, sizeof(double)), *want_self = xcalloc(count, sizeof(double));
    int right = (me + 1) % n, left = (me + n - 1) % n;
    for (size_t i = 0; i < count; i++) {
        store(t, sbuf, i, pattern(t, me, i));
        want[i] = pattern(t, left, i);
        want_self[i] = pattern(t, me, i);
    }
    int ok = expect_ok(ncclGroupStart(), "ncclGroupStart (ring)");
    ok = ok && expect_ok(ncclSend(sbuf, count, ncclFloat32, right, comm, NULL), "ncclSend to the right");
    ok = ok && expect_ok(ncclRecv(rbuf, count, ncclFloat32, left, comm, NULL), "ncclRecv from the left");
    ok = ok && expect_ok(ncclSend(sbuf, count, ncclFloat32, me, comm, NULL), "ncclSend to self");
    ok = ok && expect_ok(ncclRecv(self, count, ncclFloat32, me, comm, NULL), "ncclRecv from self");
    ok = expect_ok(ncclGroupEnd(), "ncclGroupEnd (ring)") && ok;
    if (ok && compare(t, rbuf, want, count, 0, "Send/Recv ring") && compare(t, self, want_self, count, 0, "Send/Recv self"))
        say(1, "ncclSend/ncclRecv ring exchange and self message in a group (%zu floats)", count);

    /* Three collectives in one group, one of them in a nested group: all
     * complete at the outer ncclGroupEnd. */
    const size_t c = 1001;
    float *a = xcalloc(c, 4), *b = xcalloc(c, 4), *in = xcalloc(c, 4), *g = xcalloc(c * (size_t)n, 4);
    double *wa = xcalloc(c, sizeof(double)), *wb = xcalloc(c, sizeof(double)), *wg = xcalloc(c * (size_t)n, sizeof(double));
    for (size_t i = 0; i < c; i++) {
        a[i] = (float)pattern(t, me, i);
        wa[i] = pattern_sum(t, n, i);
        b[i] = (float)pattern(t, me, i);
        wb[i] = pattern(t, n - 1, i);
        in[i] = (float)pattern(t, me, i);
    }
    for (size_t i = 0; i < c * (size_t)n; i++)
        wg[i] = pattern(t, (int)(i / c), i % c);
    ok = expect_ok(ncclGroupStart(), "ncclGroupStart (collectives)");
    ok = ok && expect_ok(ncclAllReduce(a, a, c, ncclFloat32, ncclSum, comm, NULL), "grouped ncclAllReduce");
    ok = ok && expect_ok(ncclGroupStart(), "nested ncclGroupStart");
    ok = ok && expect_ok(ncclBroadcast(b, b, c, ncclFloat32, n - 1, comm, NULL), "nested grouped ncclBroadcast");
    ok = ok && expect_ok(ncclGroupEnd(), "nested ncclGroupEnd");
    ok = ok && expect_ok(ncclAllGather(in, g, c, ncclFloat32, comm, NULL), "grouped ncclAllGather");
    ok = expect_ok(ncclGroupEnd(), "outer ncclGroupEnd") && ok;
    if (ok && compare(t, a, wa, c, 0, "grouped allreduce") && compare(t, b, wb, c, 0, "nested grouped broadcast") &&
        compare(t, g, wg, c * (size_t)n, 0, "grouped allgather"))
        say(1, "ncclAllReduce + nested ncclBroadcast + ncclAllGather in one group, complete at the outer ncclGroupEnd");
    free(sbuf);
    free(rbuf);
    free(self);
    free(want);
    free(want_self);
    free(a);
    free(b);
    free(in);
    free(g);
    free(wa);
    free(wb);
    free(wg);
}

/* An allreduce of (rank + 1) on `comm` of `n` ranks; checks the sum. */
static int check_sum_of_ranks(ncclComm_t comm, int n, const char *what)
{
    int rank = -1;
    if (!expect_ok(ncclCommUserRank(comm, &rank), what))
        return 0;
    int64_t v[3] = {rank + 1, rank + 1, rank + 1}, out[3] = {0, 0, 0};
    if (!expect_ok(ncclAllReduce(v, out, 3, ncclInt64, ncclSum, comm, NULL), what))
        return 0;
    int64_t want = (int64_t)n * (n + 1) / 2;
    int ok = out[0] == want && out[1] == want && out[2] == want;
    say(ok, "%s: allreduce of rank+1 over %d ranks = %lld (want %lld)", what, n, (long long)out[0], (long long)want);
    return ok;
}

static void check_split(ncclComm_t comm)
{
    const int n = g_nranks, me = g_rank;
    /* Even and odd ranks, ordered by descending parent rank (key = -rank). */
    ncclComm_t half = NULL;
    if (expect_ok(ncclCommSplit(comm, me % 2, -me, &half, NULL), "ncclCommSplit even/odd")) {
        int cnt = -1, rank = -1;
        int size = me % 2 ? n / 2 : (n + 1) / 2;
        /* Parent ranks of my color in descending order: my position among them. */
        int want_rank = 0;
        for (int r = me + 2; r < n; r += 2)
            want_rank++;
        ncclCommCount(half, &cnt);
        ncclCommUserRank(half, &rank);
        say(half && cnt == size && rank == want_rank, "ncclCommSplit even/odd: count %d rank %d (want %d, %d)", cnt,
            rank, size, want_rank);
        if (half)
            check_sum_of_ranks(half, size, "split child (even/odd)");
        if (half)
            expect_ok(ncclCommDestroy(half), "ncclCommDestroy split child");
    }
    /* The last rank stays out. */
    ncclComm_t rest = (ncclComm_t)(uintptr_t)0x1;
    int color = me == n - 1 ? NCCL_SPLIT_NOCOLOR : 7;
    if (expect_ok(ncclCommSplit(comm, color, me, &rest, NULL), "ncclCommSplit with NCCL_SPLIT_NOCOLOR")) {
        if (me == n - 1) {
            say(rest == NULL, "ncclCommSplit NCCL_SPLIT_NOCOLOR gives a NULL communicator (%p)", (void *)rest);
        } else {
            int cnt = -1;
            ncclCommCount(rest, &cnt);
            say(rest != NULL && cnt == n - 1, "ncclCommSplit without the last rank: count %d (want %d)", cnt, n - 1);
            check_sum_of_ranks(rest, n - 1, "split child (NOCOLOR for the last rank)");
            /* End this one with abort, the other with destroy. */
            expect_ok(ncclCommAbort(rest), "ncclCommAbort of a split child");
        }
    }
}

/* Bad arguments: ncclInvalidArgument, a message, nothing started, and the
 * communicator still works afterwards. */
static void check_bad_arguments(ncclComm_t comm)
{
    float buf[16] = {0};
    expect_error(ncclAllReduce(NULL, buf, 16, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument,
                 "ncclAllReduce with a NULL send buffer");
    expect_error(ncclAllReduce(buf, NULL, 16, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument,
                 "ncclAllReduce with a NULL receive buffer");
    expect_error(ncclAllReduce(buf, buf, 16, (ncclDataType_t)ncclNumTypes, ncclSum, comm, NULL), ncclInvalidArgument,
                 "ncclAllReduce with datatype ncclNumTypes");
    expect_error(ncclAllReduce(buf, buf, 16, (ncclDataType_t)-1, ncclSum, comm, NULL), ncclInvalidArgument,
                 "ncclAllReduce with datatype -1");
    expect_error(ncclAllReduce(buf, buf, 16, ncclFloat32, (ncclRedOp_t)ncclNumOps, comm, NULL), ncclInvalidArgument,
                 "ncclAllReduce with op ncclNumOps (never created)");
    expect_error(ncclAllReduce(buf, buf, 16, ncclFloat32, (ncclRedOp_t)(ncclNumOps + 1000), comm, NULL),
                 ncclInvalidArgument, "ncclAllReduce with op ncclNumOps+1000");
    expect_error(ncclAllReduce(buf, buf, SIZE_MAX / 2, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument,
                 "ncclAllReduce with count SIZE_MAX/2 (byte size overflows)");
    expect_error(ncclAllGather(buf, buf, SIZE_MAX / 8, ncclFloat64, comm, NULL), ncclInvalidArgument,
                 "ncclAllGather with count SIZE_MAX/8 (count x nranks x 8 overflows)");
    expect_error(ncclBroadcast(buf, buf, 16, ncclFloat32, g_nranks, comm, NULL), ncclInvalidArgument,
                 "ncclBroadcast with root = nranks");
    expect_error(ncclReduce(buf, buf, 16, ncclFloat32, ncclSum, -1, comm, NULL), ncclInvalidArgument,
                 "ncclReduce with root -1");
    expect_error(ncclSend(buf, 16, ncclFloat32, g_nranks + 3, comm, NULL), ncclInvalidArgument,
                 "ncclSend to peer nranks+3");
    expect_error(ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument,
                 "ncclAllReduce with a NULL communicator");
    expect_error(ncclCommCount(comm, NULL), ncclInvalidArgument, "ncclCommCount with a NULL output");
    expect_error(ncclCommUserRank(NULL, (int[1]){0}), ncclInvalidArgument, "ncclCommUserRank of a NULL communicator");
    expect_error(ncclRedOpCreatePreMulSum(NULL, buf, ncclFloat32, ncclScalarHostImmediate, comm), ncclInvalidArgument,
                 "ncclRedOpCreatePreMulSum with a NULL output");
    expect_error(ncclCommGetAsyncError(comm, NULL), ncclInvalidArgument, "ncclCommGetAsyncError with a NULL output");
    expect_error(ncclGetVersion(NULL), ncclInvalidArgument, "ncclGetVersion(NULL)");
    expect_error(ncclGetUniqueId(NULL), ncclInvalidArgument, "ncclGetUniqueId(NULL)");
    expect_error(ncclMemAlloc(NULL, 64), ncclInvalidArgument, "ncclMemAlloc with a NULL output");
    /* ncclGetLastError(comm) answers too (the message of this thread's last
     * failure, or the communicator's asynchronous error: never NULL). */
    const char *m = ncclGetLastError(comm);
    say(m != NULL, "ncclGetLastError(comm) is not NULL: \"%s\"", m ? m : "(NULL)");
    check_sum_of_ranks(comm, g_nranks, "the communicator still works after the bad arguments");
}

static void check_registration_and_memalloc(ncclComm_t comm)
{
    const size_t count = 50021;
    const struct type_info *t = type_of(ncclFloat32);
    float *send = NULL, *recv = NULL;
    int ok = expect_ok(ncclMemAlloc((void **)&send, count * sizeof(float)), "ncclMemAlloc (send)") &&
             expect_ok(ncclMemAlloc((void **)&recv, count * sizeof(float)), "ncclMemAlloc (recv)");
    if (!ok || !send || !recv) {
        say(0, "ncclMemAlloc gave %p and %p", (void *)send, (void *)recv);
        return;
    }
    say(1, "ncclMemAlloc: two buffers of %zu bytes (%p, %p)", count * sizeof(float), (void *)send, (void *)recv);
    void *hs = NULL, *hr = NULL;
    ok = expect_ok(ncclCommRegister(comm, send, count * sizeof(float), &hs), "ncclCommRegister (send)") &&
         expect_ok(ncclCommRegister(comm, recv, count * sizeof(float), &hr), "ncclCommRegister (recv)");
    say(ok && hs && hr, "ncclCommRegister gives handles %p and %p", hs, hr);
    double *want = xcalloc(count, sizeof(double));
    for (size_t i = 0; i < count; i++) {
        send[i] = (float)pattern(t, g_rank, i);
        want[i] = pattern_sum(t, g_nranks, i);
    }
    if (expect_ok(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL),
                  "ncclAllReduce on registered ncclMemAlloc buffers") &&
        compare(t, recv, want, count, 0, "allreduce on registered ncclMemAlloc buffers"))
        say(1, "ncclAllReduce on registered ncclMemAlloc buffers (%zu floats)", count);
    if (hs)
        expect_ok(ncclCommDeregister(comm, hs), "ncclCommDeregister (send)");
    if (hr)
        expect_ok(ncclCommDeregister(comm, hr), "ncclCommDeregister (recv)");
    say(1, "ncclCommDeregister of both handles");
    /* Unregistered now: the buffers still work. */
    if (expect_ok(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL), "ncclAllReduce after deregister") &&
        compare(t, recv, want, count, 0, "allreduce after deregister"))
        say(1, "ncclAllReduce after ncclCommDeregister");
    if (expect_ok(ncclMemFree(send), "ncclMemFree (send)") && expect_ok(ncclMemFree(recv), "ncclMemFree (recv)"))
        say(1, "ncclMemFree of both buffers");
    free(want);
}

/* ncclCommInitRankConfig with blocking = 0: init and a collective return
 * ncclSuccess or ncclInProgress and ncclCommGetAsyncError reports progress to
 * ncclSuccess, as PyTorch polls. Then every rank but 0 starts an allreduce that
 * cannot finish (rank 0 never joins it), sees it still in progress, and aborts:
 * ncclCommAbort must return promptly. `main` (a blocking communicator) orders
 * the steps between ranks. */
static void check_nonblocking_and_abort(ncclComm_t main_comm, const ncclUniqueId *id)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "nccl_app non-blocking";
    ncclComm_t nb = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nb, g_nranks, *id, g_rank, &cfg);
    say((r == ncclSuccess || r == ncclInProgress) && nb != NULL,
        "ncclCommInitRankConfig blocking=0 returns %d (%s) with a communicator %p", (int)r, ncclGetErrorString(r),
        (void *)nb);
    if (!nb || (r != ncclSuccess && r != ncclInProgress)) {
        say(0, "non-blocking init failed: %s", ncclGetLastError(NULL));
        return;
    }
    ncclResult_t state = wait_async(nb, 20.0);
    say(state == ncclSuccess, "non-blocking init: ncclCommGetAsyncError went from %s to %d (%s)",
        r == ncclInProgress ? "ncclInProgress" : "ncclSuccess", (int)state, ncclGetErrorString(state));
    if (state != ncclSuccess)
        return;

    /* A collective on the non-blocking communicator. */
    const struct type_info *t = type_of(ncclInt32);
    const size_t count = 20011;
    int32_t *buf = xcalloc(count, 4);
    double *want = xcalloc(count, sizeof(double));
    for (size_t i = 0; i < count; i++) {
        buf[i] = (int32_t)pattern(t, g_rank, i);
        want[i] = pattern_sum(t, g_nranks, i);
    }
    r = ncclAllReduce(buf, buf, count, ncclInt32, ncclSum, nb, NULL);
    state = (r == ncclSuccess || r == ncclInProgress) ? wait_async(nb, 20.0) : r;
    if (state == ncclSuccess && compare(t, buf, want, count, 0, "non-blocking allreduce"))
        say(1, "ncclAllReduce on the non-blocking communicator returned %d (%s), completed by polling", (int)r,
            ncclGetErrorString(r));
    else if (state != ncclSuccess)
        say(0, "ncclAllReduce on the non-blocking communicator: returned %d, state %d (%s): %s", (int)r, (int)state,
            ncclGetErrorString(state), ncclGetLastError(nb));

    /* The abort of an operation that cannot finish. */
    int stuck_ok = 1;
    if (g_rank != 0) {
        r = ncclAllReduce(buf, buf, count, ncclInt32, ncclSum, nb, NULL);
        sleep_ms(300);
        ncclCommGetAsyncError(nb, &state);
        stuck_ok = (r == ncclSuccess || r == ncclInProgress) && state == ncclInProgress;
        say(stuck_ok, "an allreduce that rank 0 never joins: returned %d (%s), still %d (%s) after 300 ms", (int)r,
            ncclGetErrorString(r), (int)state, ncclGetErrorString(state));
    }
    /* Every rank is now at this point (rank 0 idle, the others stuck): then abort. */
    check_sum_of_ranks(main_comm, g_nranks, "step barrier before the abort");
    double t0 = now_s();
    r = ncclCommAbort(nb);
    double dt = now_s() - t0;
    say(r == ncclSuccess && dt < 5.0, "ncclCommAbort of the non-blocking communicator%s returned %d (%s) in %.3f s",
        g_rank ? " with an operation in flight" : "", (int)r, ncclGetErrorString(r), dt);
    check_sum_of_ranks(main_comm, g_nranks, "the main communicator after the abort");
    free(buf);
    free(want);
}

static void check_scalable(const ncclUniqueId *ids)
{
    ncclUniqueId two[2] = {ids[0], ids[1]};
    ncclComm_t sc = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "nccl_app scalable";
    if (!expect_ok(ncclCommInitRankScalable(&sc, g_nranks, g_rank, 2, two, &cfg), "ncclCommInitRankScalable (2 ids)"))
        return;
    int cnt = -1, rank = -1;
    ncclCommCount(sc, &cnt);
    ncclCommUserRank(sc, &rank);
    say(cnt == g_nranks && rank == g_rank, "ncclCommInitRankScalable: count %d rank %d", cnt, rank);
    check_sum_of_ranks(sc, g_nranks, "communicator from ncclCommInitRankScalable");
    expect_ok(ncclCommDestroy(sc), "ncclCommDestroy (scalable)");
}

/* What ncclCommCuDevice reports for a host communicator (made without a
 * current CUDA context): plait's libnccl.so.2 gives -1 (no CUDA device is
 * used); NCCL would give the current CUDA device (docs/nccl-compat.md). */
#define APP_HOST_CUDEVICE (-1)

/* ncclCommShrink without the last rank: the survivors call it (the excluded
 * rank does not, as in NCCL), get a communicator of n-1 ranks in parent order.
 * ncclCommRevoke of a duplicate: later work is refused with ncclInvalidUsage,
 * the communicator becomes quiescent, and destroy still works. */
static void check_shrink_and_revoke(ncclComm_t comm)
{
    const int n = g_nranks, me = g_rank;
    int excluded = n - 1;
    ncclComm_t small = NULL;
    if (me == excluded) {
        expect_error(ncclCommShrink(comm, &excluded, 1, &small, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
                     "ncclCommShrink called by the excluded rank itself");
    } else if (expect_ok(ncclCommShrink(comm, &excluded, 1, &small, NULL, NCCL_SHRINK_DEFAULT),
                         "ncclCommShrink without the last rank")) {
        int cnt = -1, rank = -1;
        ncclCommCount(small, &cnt);
        ncclCommUserRank(small, &rank);
        say(small && cnt == n - 1 && rank == me, "ncclCommShrink: count %d rank %d (want %d, %d)", cnt, rank, n - 1,
            me);
        if (small) {
            check_sum_of_ranks(small, n - 1, "shrunk communicator");
            expect_ok(ncclCommDestroy(small), "ncclCommDestroy (shrunk)");
        }
    }
    check_sum_of_ranks(comm, n, "the parent after ncclCommShrink");

    ncclComm_t dup = NULL;
    if (!expect_ok(ncclCommSplit(comm, 0, me, &dup, NULL), "ncclCommSplit (a duplicate to revoke)") || !dup)
        return;
    check_sum_of_ranks(dup, n, "duplicate before ncclCommRevoke");
    expect_error(ncclCommRevoke(dup, 0x40), ncclInvalidArgument, "ncclCommRevoke with flags 0x40");
    if (expect_ok(ncclCommRevoke(dup, NCCL_REVOKE_DEFAULT), "ncclCommRevoke"))
        say(1, "ncclCommRevoke(NCCL_REVOKE_DEFAULT)");
    ncclResult_t state = wait_async(dup, 10.0);
    say(state == ncclSuccess, "revoked communicator becomes quiescent: state %d (%s)", (int)state,
        ncclGetErrorString(state));
    int x = 1;
    expect_error(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, dup, NULL), ncclInvalidUsage,
                 "ncclAllReduce on a revoked communicator");
    expect_error(ncclCommFinalize(dup), ncclInvalidUsage, "ncclCommFinalize of a revoked communicator");
    if (expect_ok(ncclCommDestroy(dup), "ncclCommDestroy of a revoked communicator"))
        say(1, "ncclCommDestroy of a revoked communicator");
}

/* ncclGroupSimulateEnd: plait does not estimate a group's time: ncclInvalidUsage with a
 * message. An empty group is closed by it (as NCCL ends the group); a group
 * holding work stays open and ncclGroupEnd then runs it (docs/nccl-compat.md). */
static void check_group_simulate(void)
{
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    expect_error(ncclGroupSimulateEnd(NULL), ncclInvalidArgument, "ncclGroupSimulateEnd(NULL)");
    expect_ok(ncclGroupStart(), "ncclGroupStart (simulate)");
    expect_error(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "ncclGroupSimulateEnd of an empty group (no estimate)");
    expect_error(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd after ncclGroupSimulateEnd closed the empty group");
}

/* The window and device-API entry points on a host communicator: the ones that
 * create resources fail cleanly (ncclInvalidUsage and a message); the team
 * queries and ncclLLA2ACalcSlots answer. */
static void check_device_api(ncclComm_t comm, int n)
{
    char buf[8192], devcomm[4096], reqs[512], handle[256], req[512];
    memset(devcomm, 0, sizeof(devcomm));
    memset(reqs, 0, sizeof(reqs));
    ncclWindow_t win = NULL;
    expect_error(ncclCommWindowRegister(comm, buf, sizeof(buf), &win, NCCL_WIN_DEFAULT), ncclInvalidUsage,
                 "ncclCommWindowRegister (needs the CUDA backend)");
    expect_error(ncclCommWindowDeregister(comm, win), ncclInvalidUsage, "ncclCommWindowDeregister");
    expect_error(ncclDevCommCreate(comm, reqs, devcomm), ncclInvalidUsage, "ncclDevCommCreate (needs the CUDA backend)");
    expect_error(ncclDevCommDestroy(comm, devcomm), ncclInvalidUsage, "ncclDevCommDestroy");
    struct app_team world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm), rail = ncclTeamRail(comm);
    say(world.nRanks == n && world.rank == 0 && world.stride == 1, "ncclTeamWorld = {%d, %d, %d} (want {%d, 0, 1})",
        world.nRanks, world.rank, world.stride, n);
    say(lsa.nRanks == 1 && lsa.rank == 0 && lsa.stride == 1, "ncclTeamLsa = {%d, %d, %d} (want {1, 0, 1}: no peer is load/store reachable)",
        lsa.nRanks, lsa.rank, lsa.stride);
    say(rail.nRanks == n && rail.rank == 0 && rail.stride == 1, "ncclTeamRail = {%d, %d, %d} (want the world)",
        rail.nRanks, rail.rank, rail.stride);
    int w_last = ncclTeamRankToWorld(comm, world, n - 1), l0 = ncclTeamRankToLsa(comm, lsa, 0);
    say(w_last == n - 1 && l0 == 0, "ncclTeamRankToWorld(world, %d) = %d, ncclTeamRankToLsa(lsa, 0) = %d", n - 1,
        w_last, l0);
    /* Reference values from NVIDIA's libnccl.so.2 2.28.9 (a host function). */
    int s1 = ncclLLA2ACalcSlots(100, 16), s2 = ncclLLA2ACalcSlots(10, 9), s3 = ncclLLA2ACalcSlots(3, 24);
    say(s1 == 200 && s2 == 20 && s3 == 9, "ncclLLA2ACalcSlots: %d %d %d (NCCL: 200 20 9)", s1, s2, s3);
    expect_error(ncclLLA2ACreateRequirement(1, 16, handle, req), ncclInvalidUsage, "ncclLLA2ACreateRequirement");
    expect_error(ncclLsaBarrierCreateRequirement(lsa, 1, handle, req), ncclInvalidUsage,
                 "ncclLsaBarrierCreateRequirement");
    expect_error(ncclGinBarrierCreateRequirement(comm, rail, 1, handle, req), ncclInvalidUsage,
                 "ncclGinBarrierCreateRequirement");
}

static int rank_main(int rank, int nranks, const ncclUniqueId *ids)
{
    g_rank = rank;
    g_nranks = nranks;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRank(&comm, nranks, ids[ID_MAIN], rank);
    if (r != ncclSuccess) {
        say(0, "ncclCommInitRank(%d ranks) returned %d (%s): %s", nranks, (int)r, ncclGetErrorString(r),
            ncclGetLastError(NULL));
        return EXIT_INIT_FAILED;
    }
    say(1, "ncclCommInitRank: rank %d of %d", rank, nranks);
    int cnt = -1, urank = -1, dev = -2;
    expect_ok(ncclCommCount(comm, &cnt), "ncclCommCount");
    expect_ok(ncclCommUserRank(comm, &urank), "ncclCommUserRank");
    say(cnt == nranks && urank == rank, "ncclCommCount %d, ncclCommUserRank %d", cnt, urank);
    r = ncclCommCuDevice(comm, &dev);
    say(r == ncclSuccess && dev == APP_HOST_CUDEVICE, "ncclCommCuDevice on a host communicator: %d (%s), device %d (want %d)",
        (int)r, ncclGetErrorString(r), dev, APP_HOST_CUDEVICE);

    const ncclDataType_t coll_types[] = {ncclFloat32, ncclUint8, ncclInt64};
    const size_t counts[] = {1, 1037, 65541};
    int iter = 0;
    for (size_t ti = 0; ti < sizeof(coll_types) / sizeof(coll_types[0]); ti++)
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
            check_collectives(comm, type_of(coll_types[ti]), counts[ci], iter++);
    check_allreduce_matrix(comm);
    check_premulsum(comm);
    check_groups(comm);
    check_bad_arguments(comm);
    check_registration_and_memalloc(comm);
    check_split(comm);
    check_shrink_and_revoke(comm);
    check_nonblocking_and_abort(comm, &ids[ID_NONBLOCKING]);
    check_scalable(&ids[ID_SCALABLE0]);

    /* Finalize, wait until the communicator is quiescent, destroy. */
    r = ncclCommFinalize(comm);
    ncclResult_t state = (r == ncclSuccess || r == ncclInProgress) ? wait_async(comm, 10.0) : r;
    say((r == ncclSuccess || r == ncclInProgress) && state == ncclSuccess, "ncclCommFinalize returned %d, state %d (%s)",
        (int)r, (int)state, ncclGetErrorString(state));
    expect_error(ncclAllReduce(&cnt, &cnt, 1, ncclInt32, ncclSum, comm, NULL), ncclInvalidUsage,
                 "ncclAllReduce after ncclCommFinalize");
    if (expect_ok(ncclCommDestroy(comm), "ncclCommDestroy"))
        say(1, "ncclCommDestroy after ncclCommFinalize");
    return g_failures ? EXIT_CHECK_FAILED : 0;
}

/* ---------------------------------------------------------------- the parent's part */

/* ncclCommInitAll: every rank in this process, driven from this thread in one group. */
static void check_init_all(int n)
{
    ncclComm_t comms[8] = {0};
    if (!expect_ok(ncclCommInitAll(comms, n, NULL), "ncclCommInitAll"))
        return;
    say(1, "ncclCommInitAll: %d communicators in one process", n);
    const size_t count = 3001;
    const struct type_info *t = type_of(ncclFloat64);
    double *bufs[8], *want = xcalloc(count, sizeof(double));
    for (int r = 0; r < n; r++) {
        int cnt = -1, rank = -1, dev = -2;
        ncclCommCount(comms[r], &cnt);
        ncclCommUserRank(comms[r], &rank);
        ncclCommCuDevice(comms[r], &dev);
        /* A NULL devlist in a program without a CUDA context: host
         * communicators, device -1 (NCCL would use devices 0..n-1). */
        say(cnt == n && rank == r && dev == APP_HOST_CUDEVICE, "ncclCommInitAll communicator %d: count %d rank %d device %d",
            r, cnt, rank, dev);
        bufs[r] = xcalloc(count, sizeof(double));
        for (size_t i = 0; i < count; i++)
            bufs[r][i] = pattern(t, r, i);
    }
    for (size_t i = 0; i < count; i++)
        want[i] = pattern_sum(t, n, i);
    /* ncclGroupSimulateEnd on a group that holds work: ncclInvalidUsage (no
     * cost model), and the group stays open; ncclGroupEnd then runs it. */
    int ok = expect_ok(ncclGroupStart(), "ncclGroupStart (InitAll)");
    for (int r = 0; ok && r < n; r++)
        ok = expect_ok(ncclAllReduce(bufs[r], bufs[r], count, ncclFloat64, ncclSum, comms[r], NULL),
                       "grouped ncclAllReduce over the InitAll communicators");
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    expect_error(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "ncclGroupSimulateEnd of a group holding work");
    ok = expect_ok(ncclGroupEnd(), "ncclGroupEnd (InitAll)") && ok;
    for (int r = 0; ok && r < n; r++)
        ok = compare(t, bufs[r], want, count, 0, "InitAll grouped allreduce");
    if (ok)
        say(1, "one thread drives %d InitAll communicators through one group (allreduce of %zu doubles)", n, count);
    check_device_api(comms[0], n);
    for (int r = 0; r < n; r++) {
        expect_ok(ncclCommDestroy(comms[r]), "ncclCommDestroy (InitAll)");
        free(bufs[r]);
    }
    free(want);
}

static void check_parent(int n)
{
    int version = 0;
    if (expect_ok(ncclGetVersion(&version), "ncclGetVersion"))
        say(version >= 22800, "ncclGetVersion: %d (want >= 22800, NCCL 2.28)", version);
    int distinct = 1;
    for (int r = 0; r <= ncclInProgress; r++) {
        const char *s = ncclGetErrorString((ncclResult_t)r);
        if (!s || !s[0])
            distinct = 0;
        for (int q = 0; s && q < r; q++)
            if (strcmp(s, ncclGetErrorString((ncclResult_t)q)) == 0)
                distinct = 0;
    }
    const char *unknown = ncclGetErrorString((ncclResult_t)1234);
    say(distinct && unknown != NULL, "ncclGetErrorString: distinct non-empty strings for 0..7 (\"%s\" .. \"%s\"), "
        "\"%s\" for 1234", ncclGetErrorString(ncclSuccess), ncclGetErrorString(ncclInProgress), unknown ? unknown : "(NULL)");

    /* Init with bad arguments (no root is contacted). */
    ncclUniqueId zero;
    memset(&zero, 0, sizeof(zero));
    ncclComm_t c = NULL;
    expect_error(ncclCommInitRank(&c, 0, zero, 0), ncclInvalidArgument, "ncclCommInitRank with nranks 0");
    expect_error(ncclCommInitRank(&c, 2, zero, 2), ncclInvalidArgument, "ncclCommInitRank with rank 2 of 2");
    expect_error(ncclCommInitRank(NULL, 2, zero, 0), ncclInvalidArgument, "ncclCommInitRank with a NULL output");
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0x12345678u;
    expect_error(ncclCommInitRankConfig(&c, 1, zero, 0, &bad), ncclInvalidArgument,
                 "ncclCommInitRankConfig with a config of the wrong magic");
    expect_error(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument, "ncclCommInitAll with a NULL output");

    check_group_simulate();
    check_init_all(n);
    /* Deprecated, void: must just return. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    ncclResetDebugInit();
#pragma GCC diagnostic pop
    say(1, "ncclResetDebugInit returns");
}

/* ---------------------------------------------------------------- served by whom */

struct fn_entry {
    const char *name;
    void *addr;
};

/* ncclResetDebugInit is deprecated in nccl.h; its address is all that is taken. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define FN(f) {#f, (void *)(f)}
static const struct fn_entry app_functions[] = {
    FN(ncclMemAlloc), FN(ncclMemFree), FN(ncclGetVersion), FN(ncclGetUniqueId), FN(ncclCommInitRankConfig),
    FN(ncclCommInitRank), FN(ncclCommInitAll), FN(ncclCommFinalize), FN(ncclCommDestroy), FN(ncclCommAbort),
    FN(ncclCommRevoke), FN(ncclCommSplit), FN(ncclCommShrink), FN(ncclCommInitRankScalable), FN(ncclGetErrorString),
    FN(ncclGetLastError), FN(ncclResetDebugInit), FN(ncclCommGetAsyncError), FN(ncclCommCount), FN(ncclCommCuDevice),
    FN(ncclCommUserRank), FN(ncclCommRegister), FN(ncclCommDeregister), FN(ncclCommWindowRegister),
    FN(ncclCommWindowDeregister), FN(ncclRedOpCreatePreMulSum), FN(ncclRedOpDestroy), FN(ncclReduce), FN(ncclBcast),
    FN(ncclBroadcast), FN(ncclAllReduce), FN(ncclReduceScatter), FN(ncclAllGather), FN(ncclAlltoAll), FN(ncclGather),
    FN(ncclScatter), FN(ncclSend), FN(ncclRecv), FN(ncclGroupStart), FN(ncclGroupEnd), FN(ncclGroupSimulateEnd),
    FN(ncclDevCommCreate), FN(ncclDevCommDestroy), FN(ncclTeamWorld), FN(ncclTeamLsa), FN(ncclTeamRail),
    FN(ncclTeamRankToWorld), FN(ncclTeamRankToLsa), FN(ncclLLA2ACalcSlots), FN(ncclLLA2ACreateRequirement),
    FN(ncclLsaBarrierCreateRequirement), FN(ncclGinBarrierCreateRequirement),
};
#undef FN
#pragma GCC diagnostic pop

/* Every function above must live in `lib` (compared by inode: paths may differ
 * by symlinks). */
static void check_served_by(const char *lib)
{
    struct stat want;
    if (stat(lib, &want) != 0) {
        say(0, "--expect-lib %s: %s", lib, strerror(errno));
        return;
    }
    size_t n = sizeof(app_functions) / sizeof(app_functions[0]), good = 0;
    for (size_t i = 0; i < n; i++) {
        Dl_info info;
        struct stat st;
        if (!dladdr(app_functions[i].addr, &info) || !info.dli_fname) {
            say(0, "%s: dladdr finds no library", app_functions[i].name);
            continue;
        }
        if (stat(info.dli_fname, &st) != 0 || st.st_dev != want.st_dev || st.st_ino != want.st_ino) {
            say(0, "%s is served by %s, not by %s", app_functions[i].name, info.dli_fname, lib);
            continue;
        }
        good++;
    }
    if (good == n)
        say(1, "all %zu NCCL functions this program calls resolve to %s", n, lib);
}

/* ---------------------------------------------------------------- main */

static int read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t k = read(fd, (char *)buf + got, len - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = argc > 1 ? atoi(argv[1]) : 0;
    const char *expect_lib = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--expect-lib") == 0 && i + 1 < argc)
            expect_lib = argv[++i];
        else
            n = 0;
    }
    if (n < 2 || n > 4) {
        fprintf(stderr, "usage: %s NRANKS (2..4) [--expect-lib PATH]\n", argv[0]);
        return EXIT_SETUP;
    }
    if (expect_lib)
        check_served_by(expect_lib);

    /* Fork the ranks before this process calls into the library, which may
     * start threads; the ids follow through one pipe per rank. */
    int fds[4][2];
    pid_t pids[4];
    for (int r = 0; r < n; r++)
        if (pipe(fds[r]) != 0) {
            perror("pipe");
            return EXIT_SETUP;
        }
    fflush(stdout);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            return EXIT_SETUP;
        }
        if (pids[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            alarm(RANK_DEADLINE_S);
            for (int q = 0; q < n; q++) {
                close(fds[q][1]);
                if (q != r)
                    close(fds[q][0]);
            }
            ncclUniqueId ids[NUM_IDS];
            if (read_full(fds[r][0], ids, sizeof(ids)) != 0) {
                fprintf(stderr, "rank %d: no unique ids from the parent\n", r);
                _exit(EXIT_SETUP);
            }
            close(fds[r][0]);
            int rc = rank_main(r, n, ids);
            printf("[rank %d] %d checks, %d failed\n", r, g_checks, g_failures);
            fflush(stdout);
            _exit(rc);
        }
    }
    for (int r = 0; r < n; r++)
        close(fds[r][0]);

    ncclUniqueId ids[NUM_IDS];
    int id_failed = 0;
    for (int k = 0; k < NUM_IDS && !id_failed; k++) {
        ncclResult_t r = ncclGetUniqueId(&ids[k]);
        if (r != ncclSuccess) {
            say(0, "ncclGetUniqueId returned %d (%s): %s", (int)r, ncclGetErrorString(r), ncclGetLastError(NULL));
            id_failed = 1;
        }
    }
    for (int r = 0; r < n; r++) {
        if (!id_failed && write(fds[r][1], ids, sizeof(ids)) != (ssize_t)sizeof(ids))
            say(0, "cannot send the ids to rank %d: %s", r, strerror(errno));
        close(fds[r][1]); /* a rank without ids reads EOF and exits */
    }
    if (!id_failed)
        say(1, "ncclGetUniqueId: %d ids sent to %d ranks", NUM_IDS, n);

    /* Reap the ranks within the deadline. */
    int init_failed = 0, rank_failed = 0, left = n;
    double end = now_s() + RUN_DEADLINE_S;
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            int r = 0;
            while (r < n && pids[r] != p)
                r++;
            if (r == n)
                continue;
            pids[r] = -1;
            left--;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                continue;
            if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_INIT_FAILED)
                init_failed++;
            else
                rank_failed++;
            if (WIFSIGNALED(status))
                say(0, "rank %d died of signal %d (%s)%s", r, WTERMSIG(status), strsignal(WTERMSIG(status)),
                    WTERMSIG(status) == SIGALRM ? ": its deadline passed" : "");
            else
                say(0, "rank %d exited with status %d", r, WEXITSTATUS(status));
            continue;
        }
        if (now_s() > end) {
            for (int r = 0; r < n; r++)
                if (pids[r] > 0) {
                    say(0, "rank %d still running after %.0f s: killed", r, RUN_DEADLINE_S);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    rank_failed++;
                }
            break;
        }
        sleep_ms(5);
    }
    if (id_failed || init_failed) {
        printf("[parent] the library failed at init (%s)\n", id_failed ? "ncclGetUniqueId" : "ncclCommInitRank");
        return EXIT_INIT_FAILED;
    }
    if (rank_failed) {
        printf("[parent] %d of %d ranks failed\n", rank_failed, n);
        return EXIT_CHECK_FAILED;
    }
    check_parent(n);
    printf("[parent] %d checks, %d failed; ranks: all %d passed\n", g_checks, g_failures, n);
    return g_failures ? EXIT_CHECK_FAILED : 0;
}
