/*
 * perf/common.c — the benchmark harness behind every perf/<collective>_perf.
 *
 * It reproduces nccl-tests' command line, table and timing method on plait's
 * public API: per size, warm-up, one untimed call, -n timed iterations of -m
 * aggregated calls, then -c checking runs on fresh inputs. Ranks are forked
 * local processes (--np), threads of this process (--threads) or whatever the
 * launcher's environment describes (plait_comm_init_from_env).
 *
 * Buffers are host memory by default (nccl-tests always uses device memory).
 * With -D 1 (or PLAIT_PERF_DEVICE=1) they are device memory of CUDA device 0,
 * which every rank shares: each rank's thread (or process) retains the
 * device's primary context before making its communicator, the buffers come
 * from cuMemAlloc through plait's driver table (core/cuda/cu.h), the
 * collectives run on a CUDA stream wrapped by plait_stream_from_cuda (-y 1:
 * CUDA's default stream), timings end with cuStreamSynchronize, and the checks
 * copy inputs in and results out through host shadows of the buffers. The
 * harness's own bookkeeping (header, times, error counts) stays on host
 * buffers and completes before returning (NULL stream).
 */
#define _GNU_SOURCE

#include "perf/common.h"
#include "core/cuda/cu.h"
#include "base/env.h"
#include "base/file.h"
#include "base/log.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Largest magnitude of a numeric check input: big enough to exercise more than
 * the low byte of wide integers, small enough that every partial result stays
 * exact in the type. */
#define PERF_AMP_CAP 1000
/* Mismatches printed per rank and check, before only counting them. */
#define PERF_MAX_REPORTED 5
/* After one rank fails, how long the others get to report their own errors
 * before the launcher stops them. */
#define PERF_GRACE_PROCESS_S 2
#define PERF_GRACE_THREAD_S 5
#define PERF_EXIT_TIMEOUT 3
#define PERF_HOST_LEN 56

/* ------------------------------------------------------------------ data types */

struct perf_type_info {
    const char *name;  /* nccl-tests' name, printed in the type column */
    size_t size;
    int is_float;
    int is_signed;     /* floats count as signed */
    int exp_bits;      /* floats narrower than 32 bits: their layout */
    int man_bits;
    int is_fn;         /* e4m3: no infinity, the only NaN is all ones */
    int64_t exact_max; /* every integer in [-exact_max, exact_max] (or [0, ..]) is exact */
    int max_twos;      /* how many factors of 2 a product may hold and stay exact */
    double eps;        /* 2^-man_bits: spacing of the type just above 1 */
    double tiny;       /* smallest positive subnormal (0 where irrelevant) */
};

/* Indexed by plait_datatype_t (NCCL's order). Integer limits are clamped to 2^53
 * so that the expected values, computed in double, are exact too. */
static const struct perf_type_info perf_types[PLAIT_NUM_TYPES] = {
    [PLAIT_INT8] = {"int8", 1, 0, 1, 0, 0, 0, 127, 6, 0.0, 0.0},
    [PLAIT_UINT8] = {"uint8", 1, 0, 0, 0, 0, 0, 255, 7, 0.0, 0.0},
    [PLAIT_INT32] = {"int32", 4, 0, 1, 0, 0, 0, 2147483647LL, 16, 0.0, 0.0},
    [PLAIT_UINT32] = {"uint32", 4, 0, 0, 0, 0, 0, 4294967295LL, 16, 0.0, 0.0},
    [PLAIT_INT64] = {"int64", 8, 0, 1, 0, 0, 0, 1LL << 53, 16, 0.0, 0.0},
    [PLAIT_UINT64] = {"uint64", 8, 0, 0, 0, 0, 0, 1LL << 53, 16, 0.0, 0.0},
    [PLAIT_FLOAT16] = {"half", 2, 1, 1, 5, 10, 0, 2048, 15, 0x1p-10, 0x1p-24},
    [PLAIT_FLOAT32] = {"float", 4, 1, 1, 8, 23, 0, 1LL << 24, 16, 0x1p-23, 0.0},
    [PLAIT_FLOAT64] = {"double", 8, 1, 1, 11, 52, 0, 1LL << 53, 16, 0x1p-52, 0.0},
    [PLAIT_BFLOAT16] = {"bfloat16", 2, 1, 1, 8, 7, 0, 256, 16, 0x1p-7, 0x1p-133},
    [PLAIT_FLOAT8_E4M3] = {"f8e4m3", 1, 1, 1, 4, 3, 1, 16, 8, 0x1p-3, 0x1p-9},
    [PLAIT_FLOAT8_E5M2] = {"f8e5m2", 1, 1, 1, 5, 2, 0, 8, 15, 0x1p-2, 0x1p-16},
};

struct perf_name {
    const char *name;
    int value;
};

/* Other spellings accepted by -d, beside the names of perf_types. */
static const struct perf_name perf_type_aliases[] = {
    {"char", PLAIT_INT8},           {"int", PLAIT_INT32},          {"float16", PLAIT_FLOAT16},
    {"fp16", PLAIT_FLOAT16},        {"float32", PLAIT_FLOAT32},    {"fp32", PLAIT_FLOAT32},
    {"float64", PLAIT_FLOAT64},     {"fp64", PLAIT_FLOAT64},       {"bf16", PLAIT_BFLOAT16},
    {"fp8e4m3", PLAIT_FLOAT8_E4M3}, {"fp8_e4m3", PLAIT_FLOAT8_E4M3}, {"float8e4m3", PLAIT_FLOAT8_E4M3},
    {"e4m3", PLAIT_FLOAT8_E4M3},    {"fp8e5m2", PLAIT_FLOAT8_E5M2}, {"fp8_e5m2", PLAIT_FLOAT8_E5M2},
    {"float8e5m2", PLAIT_FLOAT8_E5M2}, {"e5m2", PLAIT_FLOAT8_E5M2},
};

/* -o names, in nccl-tests' order (which is also plait's). */
static const struct perf_name perf_ops[] = {
    {"sum", PLAIT_SUM}, {"prod", PLAIT_PROD}, {"max", PLAIT_MAX},
    {"min", PLAIT_MIN}, {"avg", PLAIT_AVG},   {"mulsum", PLAIT_PERF_PREMULSUM},
    {"premulsum", PLAIT_PERF_PREMULSUM},
};

static const char *perf_op_name(int op_index)
{
    for (size_t i = 0; i < sizeof(perf_ops) / sizeof(perf_ops[0]); i++)
        if (perf_ops[i].value == op_index)
            return perf_ops[i].name;
    return "?";
}

/* ------------------------------------------------------------------ element encoding
 *
 * Half, bfloat16 and the fp8 formats are converted by hand (round to nearest
 * even), so that the harness needs neither a compiler's _Float16 nor libm. */

static double perf_pow2(int e)
{
    uint64_t bits = (uint64_t)(e + 1023) << 52; /* callers keep e in [-1022, 1023] */
    double d;
    memcpy(&d, &bits, sizeof(d));
    return d;
}

/* x >= 0 and below 2^53. */
static uint64_t perf_round_even(double x)
{
    uint64_t f = (uint64_t)x;
    double frac = x - (double)f;
    if (frac > 0.5 || (frac == 0.5 && (f & 1)))
        f++;
    return f;
}

static uint32_t perf_encode_minifloat(double v, int ebits, int mbits, int is_fn)
{
    uint64_t vb;
    memcpy(&vb, &v, sizeof(vb));
    const uint32_t sign = (uint32_t)(vb >> 63) << (ebits + mbits);
    const uint32_t exp_all = (1u << ebits) - 1;
    const uint32_t man_all = (1u << mbits) - 1;
    const int bias = (1 << (ebits - 1)) - 1;
    const uint32_t nan = (exp_all << mbits) | man_all;
    const uint32_t overflow = is_fn ? sign | nan : sign | (exp_all << mbits);

    if (v != v)
        return nan;
    int e = (int)((vb >> 52) & 0x7ff) - 1023;
    if (e == -1023) /* zero or a double subnormal: below every format here */
        return sign;
    if (e > bias + 1)
        return overflow;
    const int min_exp = 1 - bias;
    const double a = v < 0 ? -v : v;
    if (e < min_exp) {
        int shift = mbits - min_exp; /* units of the subnormal spacing */
        if (e + shift <= -2)
            return sign;
        /* A carry into 2^mbits is the smallest normal, which this bit pattern is. */
        return sign | (uint32_t)perf_round_even(a * perf_pow2(shift));
    }
    uint64_t q = perf_round_even(a * perf_pow2(mbits - e));
    if (q >> (mbits + 1)) {
        q >>= 1;
        e++;
    }
    if (e + bias > (int)exp_all)
        return overflow;
    const uint32_t field = (uint32_t)(e + bias);
    const uint32_t mant = (uint32_t)q & man_all;
    if ((!is_fn && field == exp_all) || (is_fn && field == exp_all && mant == man_all))
        return overflow;
    return sign | (field << mbits) | mant;
}

static double perf_decode_minifloat(uint32_t bits, int ebits, int mbits, int is_fn)
{
    const uint32_t exp_all = (1u << ebits) - 1;
    const uint32_t man_all = (1u << mbits) - 1;
    const int bias = (1 << (ebits - 1)) - 1;
    const uint32_t mant = bits & man_all;
    const uint32_t field = (bits >> mbits) & exp_all;
    const int is_negative = (bits >> (ebits + mbits)) & 1;
    double v;

    if (field == exp_all && (!is_fn || mant == man_all))
        v = (is_fn || mant) ? NAN : INFINITY;
    else if (field == 0)
        v = (double)mant * perf_pow2(1 - bias - mbits);
    else
        v = (double)(mant | (1u << mbits)) * perf_pow2((int)field - bias - mbits);
    return is_negative ? -v : v;
}

/* Buffers may be deliberately misaligned (-u), so elements move through memcpy. */
static void perf_store_bits(size_t size, void *buf, size_t i, uint64_t bits)
{
    unsigned char *p = (unsigned char *)buf + i * size;
    uint8_t b8 = (uint8_t)bits;
    uint16_t b16 = (uint16_t)bits;
    uint32_t b32 = (uint32_t)bits;
    switch (size) {
    case 1: memcpy(p, &b8, 1); break;
    case 2: memcpy(p, &b16, 2); break;
    case 4: memcpy(p, &b32, 4); break;
    default: memcpy(p, &bits, 8); break;
    }
}

static uint64_t perf_load_bits(size_t size, const void *buf, size_t i)
{
    const unsigned char *p = (const unsigned char *)buf + i * size;
    uint8_t b8;
    uint16_t b16;
    uint32_t b32;
    uint64_t b64;
    switch (size) {
    case 1: memcpy(&b8, p, 1); return b8;
    case 2: memcpy(&b16, p, 2); return b16;
    case 4: memcpy(&b32, p, 4); return b32;
    default: memcpy(&b64, p, 8); return b64;
    }
}

static void perf_store_value(plait_datatype_t type, void *buf, size_t i, double v)
{
    const struct perf_type_info *ti = &perf_types[type];
    uint64_t bits = 0;
    uint32_t b32;
    float f;
    switch (type) {
    case PLAIT_INT8:
    case PLAIT_INT32:
    case PLAIT_INT64:
        bits = (uint64_t)(int64_t)v; /* two's complement; the low bytes are kept */
        break;
    case PLAIT_UINT8:
    case PLAIT_UINT32:
    case PLAIT_UINT64:
        bits = (uint64_t)v;
        break;
    case PLAIT_FLOAT32:
        f = (float)v;
        memcpy(&b32, &f, sizeof(b32));
        bits = b32;
        break;
    case PLAIT_FLOAT64:
        memcpy(&bits, &v, sizeof(bits));
        break;
    case PLAIT_FLOAT16:
    case PLAIT_BFLOAT16:
    case PLAIT_FLOAT8_E4M3:
    case PLAIT_FLOAT8_E5M2:
        bits = perf_encode_minifloat(v, ti->exp_bits, ti->man_bits, ti->is_fn);
        break;
    default:
        break;
    }
    perf_store_bits(ti->size, buf, i, bits);
}

static double perf_load_value(plait_datatype_t type, const void *buf, size_t i)
{
    const struct perf_type_info *ti = &perf_types[type];
    uint64_t bits = perf_load_bits(ti->size, buf, i);
    uint32_t b32 = (uint32_t)bits;
    float f;
    double d;
    switch (type) {
    case PLAIT_INT8: return (double)(int8_t)bits;
    case PLAIT_UINT8: return (double)(uint8_t)bits;
    case PLAIT_INT32: return (double)(int32_t)bits;
    case PLAIT_UINT32: return (double)(uint32_t)bits;
    case PLAIT_INT64: return (double)(int64_t)bits;
    case PLAIT_UINT64: return (double)bits;
    case PLAIT_FLOAT32:
        memcpy(&f, &b32, sizeof(f));
        return (double)f;
    case PLAIT_FLOAT64:
        memcpy(&d, &bits, sizeof(d));
        return d;
    case PLAIT_FLOAT16:
    case PLAIT_BFLOAT16:
    case PLAIT_FLOAT8_E4M3:
    case PLAIT_FLOAT8_E5M2:
        return perf_decode_minifloat((uint32_t)bits, ti->exp_bits, ti->man_bits, ti->is_fn);
    default:
        return NAN;
    }
}

/* ------------------------------------------------------------------ check patterns */

static uint64_t perf_hash(uint64_t seed, int rank, size_t j)
{
    uint64_t x = seed + (uint64_t)(unsigned)rank * 0x9e3779b97f4a7c15ull + (uint64_t)j * 0xd1b54a32d192ed03ull;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* A value in [-amp, amp] (signed) or [0, amp], from the hash's high half. */
static double perf_pick(uint64_t h, int64_t amp, int is_signed)
{
    uint64_t range = is_signed ? (uint64_t)(2 * amp + 1) : (uint64_t)(amp + 1);
    int64_t v = (int64_t)(((h >> 32) * range) >> 32);
    return (double)(is_signed ? v - amp : v);
}

static int64_t perf_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Chooses the inputs of a check so that every partial result an implementation
 * may form, in any order, is exact in the type (or, for a floating-point average,
 * off by a bounded number of roundings):
 *  - sum, premulsum: |input| <= amp and at most exact_max/amp ranks (exact_max/2
 *    with premulsum's factor 2) feed a non-zero value into any one index; the
 *    others feed 0;
 *  - prod: inputs are +-1, and +-2 from at most max_twos ranks per index;
 *  - min, max: any value in [-amp, amp];
 *  - avg: integers as sum (any rounding of sum/n accepted); floating point with
 *    at most two non-zero contributions per index, as nccl-tests does, so the
 *    premultiplications by 1/n and one addition are the only roundings. */
static void perf_pattern_setup(struct plait_perf_run *run, int is_reduction)
{
    const struct perf_type_info *ti = &perf_types[run->type];
    struct plait_perf_pattern *p = &run->pattern;
    const int64_t n = run->nranks;

    memset(p, 0, sizeof(*p));
    p->stride = 1;
    if (!is_reduction) {
        p->is_bits = 1;
        return;
    }
    switch (run->op_index) {
    case PLAIT_MAX:
    case PLAIT_MIN:
        p->amp = perf_min64(PERF_AMP_CAP, ti->exact_max);
        return;
    case PLAIT_PROD:
        p->amp = 2;
        p->stride = (int)((n + ti->max_twos - 1) / ti->max_twos);
        return;
    default:
        break;
    }
    if (run->op_index == PLAIT_AVG && ti->is_float) {
        p->amp = perf_min64(PERF_AMP_CAP, ti->exact_max / 2);
        p->stride = (int)((n + 1) / 2);
        p->tol_rel = ti->eps;
        p->tol_abs = ti->eps * 2.0 * (double)p->amp / (double)n + 2.0 * ti->tiny;
        return;
    }
    p->is_int_avg = run->op_index == PLAIT_AVG;
    int64_t limit = run->op_index == PLAIT_PERF_PREMULSUM ? ti->exact_max / 2 : ti->exact_max;
    int64_t amp = limit / n;
    if (amp > PERF_AMP_CAP)
        amp = PERF_AMP_CAP;
    if (amp < 1)
        amp = 1;
    int64_t feeders = limit / amp;
    if (feeders < 1)
        feeders = 1;
    p->amp = amp;
    p->stride = (int)((n + feeders - 1) / feeders);
}

static int perf_feeds(const struct plait_perf_pattern *p, int rank, size_t j)
{
    return p->stride == 1 || ((uint64_t)rank + j) % (uint64_t)p->stride == 0;
}

double plait_perf_input_value(const struct plait_perf_run *run, int rank, size_t j)
{
    const struct plait_perf_pattern *p = &run->pattern;
    const int is_signed = perf_types[run->type].is_signed;
    uint64_t h = perf_hash(run->seed, rank, j);

    switch (run->op_index) {
    case PLAIT_PROD: {
        double mag = (perf_feeds(p, rank, j) && (h & 1)) ? 2.0 : 1.0;
        return (is_signed && (h & 2)) ? -mag : mag;
    }
    case PLAIT_MAX:
    case PLAIT_MIN:
        return perf_pick(h, p->amp, is_signed);
    default:
        return perf_feeds(p, rank, j) ? perf_pick(h, p->amp, is_signed) : 0.0;
    }
}

uint64_t plait_perf_input_bits(const struct plait_perf_run *run, int rank, size_t j)
{
    uint64_t h = perf_hash(run->seed, rank, j);
    return run->elt_size >= 8 ? h : h & ((1ull << (8 * run->elt_size)) - 1);
}

double plait_perf_expected_reduction(const struct plait_perf_run *run, size_t j)
{
    const int n = run->nranks;
    double v;

    switch (run->op_index) {
    case PLAIT_PROD:
        v = 1.0;
        for (int r = 0; r < n; r++)
            v *= plait_perf_input_value(run, r, j);
        return v;
    case PLAIT_MAX:
        v = plait_perf_input_value(run, 0, j);
        for (int r = 1; r < n; r++) {
            double x = plait_perf_input_value(run, r, j);
            v = x > v ? x : v;
        }
        return v;
    case PLAIT_MIN:
        v = plait_perf_input_value(run, 0, j);
        for (int r = 1; r < n; r++) {
            double x = plait_perf_input_value(run, r, j);
            v = x < v ? x : v;
        }
        return v;
    default: {
        /* Only the ranks that feed index j contribute a non-zero value. */
        const int stride = run->pattern.stride;
        int first = (int)((uint64_t)(stride - (int)(j % (size_t)stride)) % (uint64_t)stride);
        v = 0.0;
        for (int r = first; r < n; r += stride) {
            double x = plait_perf_input_value(run, r, j);
            v += run->op_index == PLAIT_PERF_PREMULSUM ? x * (double)(1 + r % 2) : x;
        }
        return run->op_index == PLAIT_AVG ? v / (double)n : v;
    }
    }
}

static int perf_value_matches(const struct plait_perf_pattern *p, double got, double expected)
{
    double d = got - expected;
    double mag = expected < 0 ? -expected : expected;
    if (d < 0)
        d = -d;
    if (p->is_int_avg)
        return d < 1.0; /* truncation, floor or rounding of the exact quotient */
    return d <= p->tol_abs + p->tol_rel * mag; /* false for NaN */
}

double plait_perf_factor_one(int nranks)
{
    (void)nranks;
    return 1.0;
}

double plait_perf_factor_allreduce(int nranks)
{
    return 2.0 * (double)(nranks - 1) / (double)nranks;
}

double plait_perf_factor_n_minus_1_over_n(int nranks)
{
    return (double)(nranks - 1) / (double)nranks;
}

/* ------------------------------------------------------------------ options */

struct perf_options {
    const char *prog;
    size_t min_bytes, max_bytes, step_bytes, step_factor;
    int iters, agg_iters, warmup_iters, run_cycles, check;
    int type; /* -1: all */
    int op;   /* -1: all */
    int root; /* -1: all */
    int blocking, stream_null, timeout_s, report_cputime, report_timestamps;
    int average, local_register, unalign, parallel_init;
    const char *json_path;
    int np, threads;
    int device; /* -D 1: device buffers (CUDA device 0) */
};

enum { PERF_OPT_NP = 1000, PERF_OPT_THREADS, PERF_OPT_DEVICE_IMPL };

static void perf_usage(FILE *f, const char *prog)
{
    fprintf(f,
            "USAGE: %s \n\t"
            "[--np <N> fork N local ranks] \n\t"
            "[--threads <N> run N ranks as threads of this process] \n\t"
            "(without either: ranks from PLAIT_RANK/PLAIT_NRANKS/PLAIT_COMM_ID, torchrun, Slurm or Open MPI; else 1 rank)\n\t"
            "[-t,--nthreads <1>] \n\t"
            "[-g,--ngpus <1>] \n\t"
            "[-b,--minbytes <min size in bytes, K/M/G suffixes>] (default 32M)\n\t"
            "[-e,--maxbytes <max size in bytes>] (default 32M)\n\t"
            "[-i,--stepbytes <increment size>] (default 1M)\n\t"
            "[-f,--stepfactor <increment factor>] (default: disabled, -i applies)\n\t"
            "[-n,--iters <iteration count>] (default 20)\n\t"
            "[-m,--agg_iters <aggregated iteration count>] (default 1)\n\t"
            "[-w,--warmup_iters <warmup iteration count>] (default 1)\n\t"
            "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t"
            "[-p,--parallel_init <0/1>] \n\t"
            "[-c,--check <check iteration count>] (default 1)\n\t"
            "[-o,--op <sum/prod/min/max/avg/mulsum/all>] (default sum)\n\t"
            "[-d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/f8e4m3/f8e5m2/all>] (default float)\n\t"
            "[-r,--root <root/all>] \n\t"
            "[-z,--blocking <0/1/2/3> 1=wait and barrier after each iteration, 2=wait only, 3=wait and barrier after each, time excludes barrier] \n\t"
            "[-y,--stream_null <0/1> 1=NULL stream: each call completes before returning] \n\t"
            "[-T,--timeout <time in seconds>] \n\t"
            "[-C,--report_cputime <0/1>] \n\t"
            "[-S,--report_timestamps <0/1> report timestamps (default 0)] \n\t"
            "[-J,--output_file <file> write one JSON object per size and placement (JSON lines)] \n\t"
            "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t"
            "[-R,--local_register <0/1/2> register send/recv buffers with plait_comm_register] \n\t"
            "[-u,--unalign <index of first element> misalign source and destination buffers (default: 0)] \n\t"
            "[-D,--device <0/1> 1=buffers in CUDA device memory (device 0, shared by every rank); default 0 = host memory, "
            "or PLAIT_PERF_DEVICE] \n\t"
            "[-G,--cudagraph <0>] [--device_implementation <0>] [-I,--per_iter_timing <0>] (must be 0)\n\t"
            "[-x,--cta_policy] [-V,--device_cta_count] [-M,--memory] [-K,--per_iter_skip] (accepted, ignored)\n\t"
            "[-h,--help]\n",
            prog);
}

static int perf_parse_long(const char *s, const char *what, long min, long max, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || end == s || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "invalid value '%s' for %s (expected an integer in [%ld, %ld])\n", s, what, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int perf_parse_int(const char *s, const char *what, long min, long max, int *out)
{
    long v;
    if (perf_parse_long(s, what, min, max, &v))
        return -1;
    *out = (int)v;
    return 0;
}

/* nccl-tests' sizes: a number with an optional K, M or G (binary units); a
 * trailing "B" or "iB" is tolerated. */
static int perf_parse_size(const char *s, const char *what, size_t *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    double unit = 1.0;
    if (errno || end == s || v < 0) {
        fprintf(stderr, "invalid size '%s' for %s\n", s, what);
        return -1;
    }
    switch (*end) {
    case 'k': case 'K': unit = 1024.0; end++; break;
    case 'm': case 'M': unit = 1024.0 * 1024.0; end++; break;
    case 'g': case 'G': unit = 1024.0 * 1024.0 * 1024.0; end++; break;
    default: break;
    }
    if (unit > 1.0 && *end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    v *= unit;
    if (*end != '\0' || v >= 18446744073709551615.0) {
        fprintf(stderr, "invalid size '%s' for %s\n", s, what);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

static int perf_parse_type(const char *s, int *out)
{
    if (strcasecmp(s, "all") == 0) {
        *out = -1;
        return 0;
    }
    for (int t = 0; t < PLAIT_NUM_TYPES; t++) {
        if (strcasecmp(s, perf_types[t].name) == 0) {
            *out = t;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof(perf_type_aliases) / sizeof(perf_type_aliases[0]); i++) {
        if (strcasecmp(s, perf_type_aliases[i].name) == 0) {
            *out = perf_type_aliases[i].value;
            return 0;
        }
    }
    fprintf(stderr, "invalid type '%s' (int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, "
                    "f8e4m3, f8e5m2 or all)\n", s);
    return -1;
}

static int perf_parse_op(const char *s, int *out)
{
    if (strcasecmp(s, "all") == 0) {
        *out = -1;
        return 0;
    }
    for (size_t i = 0; i < sizeof(perf_ops) / sizeof(perf_ops[0]); i++) {
        if (strcasecmp(s, perf_ops[i].name) == 0) {
            *out = perf_ops[i].value;
            return 0;
        }
    }
    fprintf(stderr, "invalid op '%s' (sum, prod, max, min, avg, mulsum or all)\n", s);
    return -1;
}

/* Returns 0 to run, 1 when the program should exit with status 0 (help), -1 on a
 * bad command line. */
static int perf_parse_options(int argc, char **argv, struct perf_options *o)
{
    static const struct option longopts[] = {
        {"nthreads", required_argument, 0, 't'},
        {"ngpus", required_argument, 0, 'g'},
        {"minbytes", required_argument, 0, 'b'},
        {"maxbytes", required_argument, 0, 'e'},
        {"stepbytes", required_argument, 0, 'i'},
        {"stepfactor", required_argument, 0, 'f'},
        {"iters", required_argument, 0, 'n'},
        {"agg_iters", required_argument, 0, 'm'},
        {"warmup_iters", required_argument, 0, 'w'},
        {"run_cycles", required_argument, 0, 'N'},
        {"parallel_init", required_argument, 0, 'p'},
        {"check", required_argument, 0, 'c'},
        {"op", required_argument, 0, 'o'},
        {"datatype", required_argument, 0, 'd'},
        {"root", required_argument, 0, 'r'},
        {"blocking", required_argument, 0, 'z'},
        {"stream_null", required_argument, 0, 'y'},
        {"timeout", required_argument, 0, 'T'},
        {"cudagraph", required_argument, 0, 'G'},
        {"report_cputime", required_argument, 0, 'C'},
        {"report_timestamps", required_argument, 0, 'S'},
        {"output_file", required_argument, 0, 'J'},
        {"average", required_argument, 0, 'a'},
        {"local_register", required_argument, 0, 'R'},
        {"cta_policy", required_argument, 0, 'x'},
        {"device", required_argument, 0, 'D'},
        {"device_implementation", required_argument, 0, PERF_OPT_DEVICE_IMPL},
        {"device_cta_count", required_argument, 0, 'V'},
        {"memory", required_argument, 0, 'M'},
        {"unalign", required_argument, 0, 'u'},
        {"per_iter_timing", required_argument, 0, 'I'},
        {"per_iter_skip", required_argument, 0, 'K'},
        {"np", required_argument, 0, PERF_OPT_NP},
        {"threads", required_argument, 0, PERF_OPT_THREADS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int one = 1, zero = 0;
    long lv;

    for (;;) {
        int c = getopt_long(argc, argv, "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:S:J:a:R:x:D:V:M:u:I:K:h",
                            longopts, NULL);
        if (c == -1)
            break;
        int bad = 0;
        switch (c) {
        case 't':
            bad = perf_parse_int(optarg, "-t (threads per process)", 1, 1, &one);
            if (bad)
                fprintf(stderr, "plait runs one rank per process or thread: use --threads N or --np N\n");
            break;
        case 'g':
            bad = perf_parse_int(optarg, "-g (GPUs per thread)", 1, 1, &one);
            if (bad)
                fprintf(stderr, "plait runs one rank per process or thread: use --threads N or --np N\n");
            break;
        case 'b': bad = perf_parse_size(optarg, "-b (minbytes)", &o->min_bytes); break;
        case 'e': bad = perf_parse_size(optarg, "-e (maxbytes)", &o->max_bytes); break;
        case 'i': bad = perf_parse_size(optarg, "-i (stepbytes)", &o->step_bytes); break;
        case 'f':
            bad = perf_parse_long(optarg, "-f (stepfactor)", 0, 1L << 30, &lv);
            o->step_factor = (size_t)lv;
            break;
        case 'n': bad = perf_parse_int(optarg, "-n (iters)", 1, 1 << 30, &o->iters); break;
        case 'm': bad = perf_parse_int(optarg, "-m (agg_iters)", 1, 1 << 20, &o->agg_iters); break;
        case 'w': bad = perf_parse_int(optarg, "-w (warmup_iters)", 0, 1 << 30, &o->warmup_iters); break;
        case 'N': bad = perf_parse_int(optarg, "-N (run_cycles)", 0, 1 << 30, &o->run_cycles); break;
        case 'p': bad = perf_parse_int(optarg, "-p (parallel_init)", 0, 1, &o->parallel_init); break;
        case 'c': bad = perf_parse_int(optarg, "-c (check)", 0, 1 << 20, &o->check); break;
        case 'o': bad = perf_parse_op(optarg, &o->op); break;
        case 'd': bad = perf_parse_type(optarg, &o->type); break;
        case 'r':
            if (strcasecmp(optarg, "all") == 0)
                o->root = -1;
            else
                bad = perf_parse_int(optarg, "-r (root)", -1, 1 << 30, &o->root);
            break;
        case 'z': bad = perf_parse_int(optarg, "-z (blocking)", 0, 3, &o->blocking); break;
        case 'y': bad = perf_parse_int(optarg, "-y (stream_null)", 0, 1, &o->stream_null); break;
        case 'T': bad = perf_parse_int(optarg, "-T (timeout)", 0, 1 << 30, &o->timeout_s); break;
        case 'G': bad = perf_parse_int(optarg, "-G (cudagraph; GPU-only)", 0, 0, &zero); break;
        case 'D': bad = perf_parse_int(optarg, "-D (device buffers)", 0, 1, &o->device); break;
        case PERF_OPT_DEVICE_IMPL:
            bad = perf_parse_int(optarg, "--device_implementation (not supported)", 0, 0, &zero);
            break;
        case 'I': bad = perf_parse_int(optarg, "-I (per_iter_timing; not supported)", 0, 0, &zero); break;
        case 'x': case 'V': case 'M': case 'K':
            break;
        case 'C': bad = perf_parse_int(optarg, "-C (report_cputime)", 0, 1, &o->report_cputime); break;
        case 'S': bad = perf_parse_int(optarg, "-S (report_timestamps)", 0, 1, &o->report_timestamps); break;
        case 'J': o->json_path = optarg; break;
        case 'a': bad = perf_parse_int(optarg, "-a (average)", 0, 3, &o->average); break;
        case 'R': bad = perf_parse_int(optarg, "-R (local_register)", 0, 2, &o->local_register); break;
        case 'u': bad = perf_parse_int(optarg, "-u (unalign)", 0, 1 << 20, &o->unalign); break;
        case PERF_OPT_NP: bad = perf_parse_int(optarg, "--np", 1, 1 << 16, &o->np); break;
        case PERF_OPT_THREADS: bad = perf_parse_int(optarg, "--threads", 1, 1 << 16, &o->threads); break;
        case 'h':
            perf_usage(stdout, o->prog);
            return 1;
        default:
            perf_usage(stderr, o->prog);
            return -1;
        }
        if (bad)
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", o->prog, argv[optind]);
        perf_usage(stderr, o->prog);
        return -1;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu\n", o->min_bytes, o->max_bytes);
        return -1;
    }
    if (o->min_bytes < o->max_bytes && o->step_factor <= 1 && o->step_bytes == 0) {
        fprintf(stderr, "invalid step: -i 0 without -f would never reach maxbytes\n");
        return -1;
    }
    if (o->np && o->threads) {
        fprintf(stderr, "%s: --np and --threads are exclusive\n", o->prog);
        return -1;
    }
    if (o->device && o->stream_null && o->threads > 1) {
        /* One process has one default stream: the ranks' kernels would run one
         * after the other, each waiting for the next. */
        fprintf(stderr, "%s: -y 1 with -D 1 and --threads > 1 would put every rank's kernels on CUDA's one default "
                        "stream, where they wait for each other forever; use -y 0 (a stream per rank) or --np\n",
                o->prog);
        return -1;
    }
    return 0;
}

/* The size after `size`, or 0 when there is none (overflow, no progress). */
static int perf_next_size(size_t size, size_t factor, size_t step, size_t *next_out)
{
    if (factor > 1) {
        if (size == 0) {
            *next_out = 1;
            return 1;
        }
        if (size > SIZE_MAX / factor)
            return 0;
        *next_out = size * factor;
        return 1;
    }
    if (step == 0 || size > SIZE_MAX - step)
        return 0;
    *next_out = size + step;
    return 1;
}

/* ------------------------------------------------------------------ small utilities */

static double perf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t perf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void perf_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* nccl-tests' getFloatStr: the most decimals that fit the column. */
static void perf_float_str(double value, int width, char *str, size_t cap)
{
    if (snprintf(str, cap, "%*.2f", width, value) <= width)
        return;
    if (snprintf(str, cap, "%*.1f", width, value) <= width)
        return;
    if (snprintf(str, cap, "%*.0f", width, value) <= width)
        return;
    snprintf(str, cap, width >= 7 ? "%*.1e" : "%*.0e", width, value);
}

static void perf_json_double(FILE *f, const char *key, double v)
{
    if (v != v || v > 1e300 || v < -1e300)
        fprintf(f, "\"%s\":null", key);
    else
        fprintf(f, "\"%s\":%.9g", key, v);
}

static void perf_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* ------------------------------------------------------------------ watchdog (-T)
 *
 * A test that runs past -T seconds ends the whole process: a hung collective
 * cannot be interrupted portably, and the launcher (or the --np parent) turns
 * the exit into a failure for every rank. */

struct perf_watchdog {
    pthread_t thread;
    int is_running;
    int timeout_s;
    int nslots;
    _Atomic int64_t *deadline; /* per local rank, CLOCK_MONOTONIC ns; 0 = no test running */
    _Atomic int *rank;
    _Atomic size_t *size;
    atomic_int stop;
};

static struct perf_watchdog perf_dog;

static void *perf_watchdog_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&perf_dog.stop)) {
        int64_t now = perf_now_ns();
        for (int i = 0; i < perf_dog.nslots; i++) {
            int64_t d = atomic_load(&perf_dog.deadline[i]);
            if (d > 0 && now > d) {
                fprintf(stderr, "rank %d: test timeout (%d s) at size %zu; exiting\n", atomic_load(&perf_dog.rank[i]),
                        perf_dog.timeout_s, atomic_load(&perf_dog.size[i]));
                fflush(stdout);
                fflush(stderr);
                _exit(PERF_EXIT_TIMEOUT);
            }
        }
        perf_sleep_ms(50);
    }
    return NULL;
}

static int perf_watchdog_start(int timeout_s, int nslots)
{
    if (timeout_s <= 0)
        return 0;
    perf_dog.timeout_s = timeout_s;
    perf_dog.nslots = nslots;
    perf_dog.deadline = calloc((size_t)nslots, sizeof(*perf_dog.deadline));
    perf_dog.rank = calloc((size_t)nslots, sizeof(*perf_dog.rank));
    perf_dog.size = calloc((size_t)nslots, sizeof(*perf_dog.size));
    if (!perf_dog.deadline || !perf_dog.rank || !perf_dog.size) {
        fprintf(stderr, "watchdog: out of memory\n");
        return -1;
    }
    atomic_store(&perf_dog.stop, 0);
    int err = pthread_create(&perf_dog.thread, NULL, perf_watchdog_main, NULL);
    if (err) {
        fprintf(stderr, "watchdog: pthread_create: %s\n", strerror(err));
        return -1;
    }
    perf_dog.is_running = 1;
    return 0;
}

static void perf_watchdog_stop(void)
{
    if (perf_dog.is_running) {
        atomic_store(&perf_dog.stop, 1);
        pthread_join(perf_dog.thread, NULL);
        perf_dog.is_running = 0;
    }
    free((void *)perf_dog.deadline);
    free((void *)perf_dog.rank);
    free((void *)perf_dog.size);
    perf_dog.deadline = NULL;
    perf_dog.rank = NULL;
    perf_dog.size = NULL;
}

static void perf_watchdog_arm(int slot, int rank, size_t size)
{
    if (!perf_dog.is_running)
        return;
    atomic_store(&perf_dog.rank[slot], rank);
    atomic_store(&perf_dog.size[slot], size);
    atomic_store(&perf_dog.deadline[slot], perf_now_ns() + (int64_t)perf_dog.timeout_s * 1000000000);
}

static void perf_watchdog_disarm(int slot)
{
    if (perf_dog.is_running)
        atomic_store(&perf_dog.deadline[slot], 0);
}

/* ------------------------------------------------------------------ one rank */

struct perf_rank {
    const struct perf_options *opt;
    const struct plait_perf_coll *coll;
    const char *launch;      /* how the ranks were started, for the header */
    int slot;                /* index among this process's ranks (watchdog) */
    char host[PERF_HOST_LEN];
    struct plait_perf_run run;
    plait_comm_t comm;
    plait_stream_t stream;
    int is_printer;
    FILE *json;
    unsigned char *send_alloc, *recv_alloc; /* host buffers, or the host shadows of the device ones */
    size_t alloc_bytes;
    /* -D 1: the driver, device 0's primary context (retained by this rank), the
     * CUDA stream the collectives run on (NULL with -y 1: CUDA's default
     * stream) and the device buffers. */
    const struct plait_cu *cu;
    void *cu_ctx;
    void *cu_stream;
    plait_cudevptr dev_send, dev_recv;
    void *send_handle, *recv_handle;
    uint64_t seed_counter;
    double bw_sum;
    long bw_count;
    long error_rows;
};

/* Reports a failed plait call (the call, the code's name and the detail). */
static int perf_ok(struct perf_rank *ctx, plait_result_t res, const char *call)
{
    if (res == PLAIT_SUCCESS)
        return 1;
    fprintf(stderr, "%s: rank %d on %s: %s failed: %s (%d): %s\n", ctx->opt->prog, ctx->run.rank, ctx->host, call,
            plait_get_error_string(res), (int)res, plait_get_last_error(ctx->comm));
    return 0;
}

static int perf_cu_ok(struct perf_rank *ctx, int res, const char *call)
{
    char buf[128];
    if (res == PLAIT_CU_SUCCESS)
        return 1;
    fprintf(stderr, "%s: rank %d on %s: %s failed: %s\n", ctx->opt->prog, ctx->run.rank, ctx->host, call,
            plait_cu_strerror(res, buf, sizeof(buf)));
    return 0;
}

/* The stream of the harness's own calls on host buffers: with device buffers
 * they complete before returning (NULL), so they never wait on the CUDA stream. */
static plait_stream_t perf_host_stream(struct perf_rank *ctx)
{
    return ctx->cu ? NULL : ctx->stream;
}

static int perf_sync(struct perf_rank *ctx)
{
    if (ctx->cu) {
        /* The collectives' kernels report failures asynchronously. */
        int res = ctx->cu_stream ? ctx->cu->StreamSynchronize(ctx->cu_stream) : ctx->cu->CtxSynchronize();
        if (!perf_cu_ok(ctx, res, ctx->cu_stream ? "cuStreamSynchronize" : "cuCtxSynchronize"))
            return -1;
        plait_result_t async = PLAIT_SUCCESS;
        if (plait_comm_get_async_error(ctx->comm, &async) == PLAIT_SUCCESS && async != PLAIT_SUCCESS &&
            async != PLAIT_IN_PROGRESS)
            return perf_ok(ctx, async, "device collective (asynchronous error)") ? 0 : -1;
        return 0;
    }
    if (!ctx->stream)
        return 0;
    return perf_ok(ctx, plait_stream_synchronize(ctx->stream), "plait_stream_synchronize") ? 0 : -1;
}

static int perf_barrier(struct perf_rank *ctx)
{
    if (ctx->cu && perf_sync(ctx))
        return -1;
    if (!perf_ok(ctx, plait_barrier(ctx->comm, perf_host_stream(ctx)), "plait_barrier"))
        return -1;
    return perf_sync(ctx);
}

/* Combines the iteration time across ranks as -a asks. */
static int perf_combine_time(struct perf_rank *ctx, double *sec)
{
    static const plait_redop_t ops[4] = {PLAIT_SUM, PLAIT_SUM, PLAIT_MIN, PLAIT_MAX};
    double in = *sec, out = 0.0;
    plait_result_t res;

    if (ctx->opt->average == 0)
        res = plait_broadcast(&in, &out, 1, PLAIT_FLOAT64, 0, ctx->comm, perf_host_stream(ctx));
    else
        res = plait_allreduce(&in, &out, 1, PLAIT_FLOAT64, ops[ctx->opt->average], ctx->comm, perf_host_stream(ctx));
    if (!perf_ok(ctx, res, ctx->opt->average == 0 ? "plait_broadcast (time)" : "plait_allreduce (time)"))
        return -1;
    if (perf_sync(ctx))
        return -1;
    if (ctx->opt->average == 1)
        out /= (double)ctx->run.nranks;
    *sec = out;
    return 0;
}

static int perf_sum_int64(struct perf_rank *ctx, int64_t *value)
{
    int64_t in = *value, out = 0;
    if (!perf_ok(ctx, plait_allreduce(&in, &out, 1, PLAIT_INT64, PLAIT_SUM, ctx->comm, perf_host_stream(ctx)),
                 "plait_allreduce (#wrong)"))
        return -1;
    if (perf_sync(ctx))
        return -1;
    *value = out;
    return 0;
}

/* Rank 0 prints nccl-tests' preamble, with one line per rank gathered through
 * plait_allgather (rank, pid, host). */
static int perf_print_header(struct perf_rank *ctx)
{
    enum { REC = 64 };
    const struct perf_options *o = ctx->opt;
    const int n = ctx->run.nranks;
    unsigned char mine[REC];
    unsigned char *all = malloc((size_t)n * REC);
    int32_t rank = ctx->run.rank, pid = (int32_t)getpid();
    int version = 0;

    if (!all) {
        fprintf(stderr, "%s: rank %d: out of memory\n", o->prog, ctx->run.rank);
        return -1;
    }
    memset(mine, 0, sizeof(mine));
    memcpy(mine, &rank, 4);
    memcpy(mine + 4, &pid, 4);
    memcpy(mine + 8, ctx->host, PERF_HOST_LEN);
    if (!perf_ok(ctx, plait_allgather(mine, all, REC, PLAIT_UINT8, ctx->comm, perf_host_stream(ctx)),
                 "plait_allgather (ranks)") ||
        perf_sync(ctx)) {
        free(all);
        return -1;
    }
    if (!ctx->is_printer) {
        free(all);
        return 0;
    }
    plait_get_version(&version);
    printf("# plait perf tests: plait-headers=%d plait-library=%d\n", PLAIT_VERSION_CODE, version);
    printf("# Collective test starting: %s\n", o->prog);
    printf("# nThread %d nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
           "validation: %d graph: 0",
           o->threads ? o->threads : 1, o->min_bytes, o->max_bytes, o->step_factor > 1 ? o->step_factor : o->step_bytes,
           o->step_factor > 1 ? "factor" : "bytes", o->warmup_iters, o->iters, o->agg_iters, o->check);
    if (o->unalign)
        printf(" unalign: %d", o->unalign);
    printf("\n");
    printf("# Ranks: %d (%s); stream: %s\n", n, ctx->launch,
           ctx->cu ? (ctx->stream ? "CUDA stream (plait_stream_from_cuda)" : "CUDA default stream (-y 1)")
                   : (ctx->stream ? "plait host stream" : "NULL (-y 1)"));
    printf("# Buffers: %s\n", ctx->cu ? "CUDA device memory (cuMemAlloc on device 0, shared by every rank)"
                                        : "host memory (-D 1 or PLAIT_PERF_DEVICE=1: device memory)");
    if (o->blocking == 1)
        printf("# Blocking Enabled: wait and barrier after each iteration\n");
    if (o->blocking == 2)
        printf("# Blocking Enabled: wait after each iteration, no barrier\n");
    if (o->blocking == 3)
        printf("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier\n");
    if (o->local_register)
        printf("# Buffers registered with plait_comm_register\n");
    printf("#\n# Using devices\n");
    for (int r = 0; r < n; r++) {
        int32_t rr, rp;
        char host[PERF_HOST_LEN + 1];
        memcpy(&rr, all + (size_t)r * REC, 4);
        memcpy(&rp, all + (size_t)r * REC + 4, 4);
        memcpy(host, all + (size_t)r * REC + 8, PERF_HOST_LEN);
        host[PERF_HOST_LEN] = '\0';
        if (ctx->cu)
            printf("#  Rank %2d Group  0 Pid %6d on %10s device  0 [device memory]\n", (int)rr, (int)rp, host);
        else
            printf("#  Rank %2d Group  0 Pid %6d on %10s device cpu [host memory]\n", (int)rr, (int)rp, host);
    }
    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n", "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s%s\n", "size", "count", "type", "redop",
           "root", o->report_cputime ? "cputime" : "time", "algbw", "busbw", "#wrong",
           o->report_cputime ? "cputime" : "time", "algbw", "busbw", "#wrong", o->report_timestamps ? "            timestamp" : "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
    fflush(stdout);
    free(all);
    return 0;
}

/* Where the collectives' buffers start: the device buffers with -D 1. */
static unsigned char *perf_send_base(struct perf_rank *ctx)
{
    unsigned char *base = ctx->cu ? (unsigned char *)(uintptr_t)ctx->dev_send : ctx->send_alloc;
    return base + (size_t)ctx->opt->unalign * ctx->run.elt_size;
}

static unsigned char *perf_recv_base(struct perf_rank *ctx)
{
    unsigned char *base = ctx->cu ? (unsigned char *)(uintptr_t)ctx->dev_recv : ctx->recv_alloc;
    return base + (size_t)ctx->opt->unalign * ctx->run.elt_size;
}

/* The host memory that mirrors a collective's buffer address p: p itself for
 * host buffers, the same offset in the host shadow for device ones. */
static unsigned char *perf_host_view(struct perf_rank *ctx, unsigned char *p)
{
    if (!ctx->cu)
        return p;
    uintptr_t a = (uintptr_t)p;
    if (a >= ctx->dev_send && a < ctx->dev_send + ctx->alloc_bytes)
        return ctx->send_alloc + (a - ctx->dev_send);
    return ctx->recv_alloc + (a - ctx->dev_recv);
}

/* Host to device (no-op for host buffers): n bytes at the collective's address p
 * from its host view. Setup only, outside the timed loops. */
static int perf_to_device(struct perf_rank *ctx, unsigned char *p, size_t n)
{
    if (!ctx->cu || n == 0)
        return 0;
    return perf_cu_ok(ctx, ctx->cu->MemcpyHtoD((plait_cudevptr)(uintptr_t)p, perf_host_view(ctx, p), n),
                      "cuMemcpyHtoD")
               ? 0
               : -1;
}

static int perf_from_device(struct perf_rank *ctx, unsigned char *p, size_t n)
{
    if (!ctx->cu || n == 0)
        return 0;
    return perf_cu_ok(ctx, ctx->cu->MemcpyDtoH(perf_host_view(ctx, p), (plait_cudevptr)(uintptr_t)p, n),
                      "cuMemcpyDtoH")
               ? 0
               : -1;
}

/* memset on either kind of buffer; device memory through the collectives'
 * stream, waited for. */
static int perf_fill_bytes(struct perf_rank *ctx, unsigned char *p, int value, size_t n)
{
    memset(perf_host_view(ctx, p), value, n);
    if (!ctx->cu || n == 0)
        return 0;
    if (!perf_cu_ok(ctx, ctx->cu->MemsetD8Async((plait_cudevptr)(uintptr_t)p, (unsigned char)value, n, ctx->cu_stream),
                    "cuMemsetD8Async"))
        return -1;
    return perf_cu_ok(ctx, ctx->cu->StreamSynchronize(ctx->cu_stream), "cuStreamSynchronize") ? 0 : -1;
}

static size_t perf_total_bytes(const struct plait_perf_run *run)
{
    size_t n = run->counts.send_count > run->counts.recv_count ? run->counts.send_count : run->counts.recv_count;
    return n * run->elt_size;
}

/* Like nccl-tests, iteration k uses the k-th slice of the -e sized buffers, so
 * small sizes do not stay cache-hot and buffer reuse races show up. */
static size_t perf_shift(struct perf_rank *ctx, long iter)
{
    size_t total = perf_total_bytes(&ctx->run);
    size_t steps = total ? ctx->opt->max_bytes / total : 1;
    if (steps == 0)
        steps = 1;
    return total * ((size_t)iter % steps);
}

static void perf_place(struct perf_rank *ctx, int is_inplace, long iter, unsigned char **send_out,
                       unsigned char **recv_out)
{
    const struct plait_perf_run *run = &ctx->run;
    size_t shift = perf_shift(ctx, iter);
    unsigned char *recv = perf_recv_base(ctx) + shift;
    unsigned char *send = perf_send_base(ctx) + shift;
    if (is_inplace) {
        send = recv + (size_t)run->rank * run->counts.send_inplace_offset * run->elt_size;
        recv = recv + (size_t)run->rank * run->counts.recv_inplace_offset * run->elt_size;
    }
    *send_out = send;
    *recv_out = recv;
}

static int perf_start_one(struct perf_rank *ctx, int is_inplace, long iter)
{
    unsigned char *send, *recv;
    perf_place(ctx, is_inplace, iter, &send, &recv);
    if (!perf_ok(ctx, ctx->coll->start(&ctx->run, send, recv), ctx->coll->name))
        return -1;
    return 0;
}

/* -z 1 and 2: wait after each iteration (1: and a barrier). */
static int perf_after_iteration(struct perf_rank *ctx)
{
    if (ctx->opt->blocking == 1 || ctx->opt->blocking == 2) {
        if (perf_sync(ctx))
            return -1;
        if (ctx->opt->blocking == 1 && perf_barrier(ctx))
            return -1;
    }
    return 0;
}

/* One iteration of the timed loop: -m calls, grouped when more than one. */
static int perf_iteration(struct perf_rank *ctx, int is_inplace, long iter)
{
    const int agg = ctx->opt->agg_iters;
    if (agg > 1 && !perf_ok(ctx, plait_group_start(), "plait_group_start"))
        return -1;
    for (int a = 0; a < agg; a++) {
        if (perf_start_one(ctx, is_inplace, iter * agg + a)) {
            if (agg > 1)
                plait_group_end();
            return -1;
        }
    }
    if (agg > 1 && !perf_ok(ctx, plait_group_end(), "plait_group_end"))
        return -1;
    return 0;
}

static int64_t perf_count_wrong(struct perf_rank *ctx, const unsigned char *out)
{
    const struct plait_perf_run *run = &ctx->run;
    const struct plait_perf_pattern *p = &run->pattern;
    int64_t wrong = 0;

    for (size_t i = 0; i < run->counts.recv_count; i++) {
        int src = -1;
        size_t idx = 0;
        if (!ctx->coll->source(run, i, &src, &idx))
            continue;
        int is_bad_source = src >= run->nranks || idx >= run->counts.send_count || (p->is_bits && src < 0);
        double got = 0, exp = 0;
        uint64_t got_bits = 0, exp_bits = 0;
        int is_match;
        if (is_bad_source) {
            is_match = 0;
        } else if (p->is_bits) {
            got_bits = perf_load_bits(run->elt_size, out, i);
            exp_bits = plait_perf_input_bits(run, src, idx);
            is_match = got_bits == exp_bits;
        } else {
            got = perf_load_value(run->type, out, i);
            exp = src < 0 ? plait_perf_expected_reduction(run, idx) : plait_perf_input_value(run, src, idx);
            is_match = perf_value_matches(p, got, exp);
        }
        if (is_match)
            continue;
        if (wrong < PERF_MAX_REPORTED) {
            if (is_bad_source)
                fprintf(stderr, "%s: rank %d: %s element %zu: description gives source rank %d index %zu\n",
                        ctx->opt->prog, run->rank, ctx->coll->name, i, src, idx);
            else if (p->is_bits)
                fprintf(stderr, "%s: rank %d: %s %s count %zu: element %zu is 0x%llx, expected 0x%llx\n",
                        ctx->opt->prog, run->rank, ctx->coll->name, perf_types[run->type].name,
                        run->counts.param_count, i, (unsigned long long)got_bits, (unsigned long long)exp_bits);
            else
                fprintf(stderr, "%s: rank %d: %s %s %s count %zu: element %zu is %.17g, expected %.17g\n",
                        ctx->opt->prog, run->rank, ctx->coll->name, perf_types[run->type].name,
                        perf_op_name(run->op_index), run->counts.param_count, i, got, exp);
        }
        wrong++;
    }
    return wrong;
}

static void perf_fill_input(struct perf_rank *ctx, unsigned char *in)
{
    const struct plait_perf_run *run = &ctx->run;
    if (run->pattern.is_bits) {
        for (size_t j = 0; j < run->counts.send_count; j++)
            perf_store_bits(run->elt_size, in, j, plait_perf_input_bits(run, run->rank, j));
    } else {
        for (size_t j = 0; j < run->counts.send_count; j++)
            perf_store_value(run->type, in, j, plait_perf_input_value(run, run->rank, j));
    }
}

/* -c runs on fresh inputs; returns the number of wrong elements over all ranks
 * in *wrong_out (the first failing run ends the loop, as in nccl-tests). */
static int perf_check(struct perf_rank *ctx, int is_inplace, int64_t *wrong_out)
{
    struct plait_perf_run *run = &ctx->run;
    int64_t wrong = 0;

    for (int c = 0; c < ctx->opt->check; c++) {
        unsigned char *send, *recv;
        run->seed = perf_hash(0x706c616974ull, 0, (size_t)++ctx->seed_counter);
        perf_place(ctx, is_inplace, 0, &send, &recv);
        /* A collective that writes nothing must not pass on stale results; in
         * place, the input then overwrites its part of the poisoned output. */
        if (perf_fill_bytes(ctx, recv, 0xa5, run->counts.recv_count * run->elt_size))
            return -1;
        perf_fill_input(ctx, perf_host_view(ctx, send));
        if (perf_to_device(ctx, send, run->counts.send_count * run->elt_size))
            return -1;
        if (perf_start_one(ctx, is_inplace, 0) || perf_after_iteration(ctx) || perf_sync(ctx))
            return -1;
        if (perf_from_device(ctx, recv, run->counts.recv_count * run->elt_size))
            return -1;
        wrong = perf_count_wrong(ctx, perf_host_view(ctx, recv));
        if (perf_sum_int64(ctx, &wrong))
            return -1;
        if (wrong)
            break;
    }
    *wrong_out = wrong;
    return 0;
}

struct perf_half {
    double time_us;
    double algbw, busbw;
    int64_t wrong;
};

/* One half of a table row: the timed loop and the check, for one placement. */
static int perf_bench(struct perf_rank *ctx, int is_inplace, struct perf_half *half)
{
    const struct perf_options *o = ctx->opt;
    struct plait_perf_run *run = &ctx->run;
    const long ops = (long)o->iters * o->agg_iters;

    /* Repeated in-place reductions would grow the data (integer overflow in the
     * library, infinities); zero every slice the loop below touches. */
    if (is_inplace && ctx->coll->is_reduction) {
        size_t total = perf_total_bytes(run);
        size_t steps = total ? o->max_bytes / total : 1;
        size_t used = steps < (size_t)ops + 1 ? steps : (size_t)ops + 1;
        if (perf_fill_bytes(ctx, perf_recv_base(ctx), 0, used * total))
            return -1;
    }

    /* One untimed call, then line the ranks up. */
    if (perf_start_one(ctx, is_inplace, 0) || perf_after_iteration(ctx) || perf_sync(ctx) || perf_barrier(ctx))
        return -1;

    double coll_only = 0.0;
    double t0 = perf_now();
    for (long it = 0; it < o->iters; it++) {
        double ti = perf_now();
        if (perf_iteration(ctx, is_inplace, it))
            return -1;
        if (o->blocking == 3) {
            if (perf_sync(ctx))
                return -1;
            coll_only += perf_now() - ti;
            if (perf_barrier(ctx))
                return -1;
        } else if (perf_after_iteration(ctx)) {
            return -1;
        }
    }
    double cpu_sec = (o->blocking == 3 ? coll_only : perf_now() - t0) / (double)ops;
    if (perf_sync(ctx))
        return -1;
    double sec = (o->blocking == 3 ? coll_only : perf_now() - t0) / (double)ops;
    if (o->report_cputime)
        sec = cpu_sec;
    if (perf_combine_time(ctx, &sec))
        return -1;

    double bytes = (double)perf_total_bytes(run);
    half->time_us = sec * 1e6;
    half->algbw = sec > 0 ? bytes / 1e9 / sec : 0.0;
    half->busbw = half->algbw * ctx->coll->busbw_factor(run->nranks);
    half->wrong = 0;
    if (perf_check(ctx, is_inplace, &half->wrong))
        return -1;
    ctx->bw_sum += half->busbw;
    ctx->bw_count++;
    if (half->wrong)
        ctx->error_rows++;
    return 0;
}

static void perf_setup_size(struct plait_perf_run *run, const struct plait_perf_coll *coll, size_t size)
{
    memset(&run->counts, 0, sizeof(run->counts));
    coll->get_counts(size / run->elt_size, run->elt_size, run->nranks, &run->counts);
}

static void perf_half_str(const struct perf_options *o, const struct perf_half *h, char *buf, size_t cap)
{
    char t[32], a[32], b[32];
    perf_float_str(h->time_us, 7, t, sizeof(t));
    perf_float_str(h->algbw, 6, a, sizeof(a));
    perf_float_str(h->busbw, 6, b, sizeof(b));
    if (o->check)
        snprintf(buf, cap, "  %7s  %6s  %6s  %5g", t, a, b, (double)h->wrong);
    else
        snprintf(buf, cap, "  %7s  %6s  %6s  %5s", t, a, b, "N/A");
}

static void perf_json_row(struct perf_rank *ctx, size_t bytes, const char *op_name, int is_inplace,
                          const struct perf_half *h)
{
    const struct plait_perf_run *run = &ctx->run;
    FILE *f = ctx->json;
    fprintf(f, "{\"collective\":");
    perf_json_string(f, ctx->coll->name);
    fprintf(f, ",\"nranks\":%d,\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\",\"root\":%d",
            run->nranks, bytes, run->counts.param_count, perf_types[run->type].name, op_name, run->root);
    fprintf(f, ",\"in_place\":%s,", is_inplace ? "true" : "false");
    perf_json_double(f, ctx->opt->report_cputime ? "cpu_time_us" : "time_us", h->time_us);
    fputc(',', f);
    perf_json_double(f, "algbw_gbps", h->algbw);
    fputc(',', f);
    perf_json_double(f, "busbw_gbps", h->busbw);
    if (ctx->opt->check)
        fprintf(f, ",\"wrong\":%lld", (long long)h->wrong);
    else
        fprintf(f, ",\"wrong\":null");
    fprintf(f, ",\"iters\":%d,\"agg_iters\":%d,\"warmup_iters\":%d,\"blocking\":%d}\n", ctx->opt->iters,
            ctx->opt->agg_iters, ctx->opt->warmup_iters, ctx->opt->blocking);
    fflush(f);
}

/* Every size for one (type, op, root), as nccl-tests' TimeTest. */
static int perf_time_test(struct perf_rank *ctx, plait_datatype_t type, int op_index, int root)
{
    const struct perf_options *o = ctx->opt;
    const struct plait_perf_coll *coll = ctx->coll;
    struct plait_perf_run *run = &ctx->run;
    const char *op_name = coll->is_reduction ? perf_op_name(op_index) : "none";
    int status = -1;

    run->type = type;
    run->elt_size = perf_types[type].size;
    run->op_index = op_index;
    run->op = op_index < PLAIT_NUM_OPS ? (plait_redop_t)op_index : PLAIT_SUM;
    run->root = root;
    perf_pattern_setup(run, coll->is_reduction);

    if (op_index == PLAIT_PERF_PREMULSUM) {
        unsigned char scalar[8] = {0};
        perf_store_value(type, scalar, 0, run->rank % 2 ? 2.0 : 1.0);
        if (!perf_ok(ctx, plait_redop_create_premulsum(&run->op, scalar, type, PLAIT_SCALAR_HOST_IMMEDIATE, ctx->comm),
                     "plait_redop_create_premulsum"))
            return -1;
    }
    perf_watchdog_arm(ctx->slot, run->rank, o->min_bytes);
    if (perf_barrier(ctx))
        goto out;

    /* Warm every size up first (factor 2), out of place, like nccl-tests. */
    for (size_t size = o->min_bytes;;) {
        perf_setup_size(run, coll, size);
        perf_watchdog_arm(ctx->slot, run->rank, size);
        for (int w = 0; w < o->warmup_iters; w++)
            if (perf_start_one(ctx, 0, w) || perf_after_iteration(ctx))
                goto out;
        if (perf_sync(ctx))
            goto out;
        if (!perf_next_size(size, 2, 0, &size) || size > o->max_bytes)
            break;
    }

    for (size_t size = o->min_bytes;;) {
        struct perf_half half[2];
        perf_setup_size(run, coll, size);
        for (int is_inplace = 0; is_inplace < 2; is_inplace++) {
            if (is_inplace && coll->no_inplace) {
                half[1] = (struct perf_half){.time_us = -1};
                continue;
            }
            perf_watchdog_arm(ctx->slot, run->rank, size);
            if (perf_bench(ctx, is_inplace, &half[is_inplace]))
                goto out;
        }
        perf_watchdog_disarm(ctx->slot);
        if (ctx->is_printer) {
            size_t bytes = perf_total_bytes(run);
            char h0[160], h1[160], stamp[32] = "";
            perf_half_str(o, &half[0], h0, sizeof(h0));
            if (coll->no_inplace)
                snprintf(h1, sizeof(h1), "  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
            else
                perf_half_str(o, &half[1], h1, sizeof(h1));
            if (o->report_timestamps) {
                time_t now = time(NULL);
                struct tm tm;
                char tbuf[24];
                strftime(tbuf, sizeof(tbuf), "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
                snprintf(stamp, sizeof(stamp), "%21s", tbuf);
            }
            printf("%12zu  %12zu  %8s  %6s  %6d%s%s%s\n", bytes, run->counts.param_count, perf_types[type].name,
                   op_name, root, h0, h1, stamp);
            fflush(stdout);
            if (ctx->json) {
                perf_json_row(ctx, bytes, op_name, 0, &half[0]);
                if (!coll->no_inplace)
                    perf_json_row(ctx, bytes, op_name, 1, &half[1]);
            }
        }
        if (!perf_next_size(size, o->step_factor, o->step_bytes, &size) || size > o->max_bytes)
            break;
    }
    status = 0;

out:
    perf_watchdog_disarm(ctx->slot);
    if (op_index == PLAIT_PERF_PREMULSUM && status == 0) {
        /* The op may be released only once no queued call still uses it. */
        if (perf_sync(ctx) || !perf_ok(ctx, plait_redop_destroy(run->op, ctx->comm), "plait_redop_destroy"))
            status = -1;
    }
    return status;
}

/* -D 1: the calling thread's hold on device 0's primary context, taken before
 * its communicator is made (plait gives a communicator device state when the
 * initialising thread has a current context, as NCCL takes the current device). */
static __thread const struct plait_cu *perf_dev_cu;
static __thread void *perf_dev_ctx;

static int perf_device_enter(const struct perf_options *opt, int rank)
{
    char buf[128];
    if (!opt->device)
        return 0;
    const struct plait_cu *cu = plait_cu_get();
    if (!cu || cu->ndevices < 1) {
        fprintf(stderr,
                "%s: rank %d: -D 1 (device buffers) needs a CUDA device, and this process has none (no driver "
                "could be loaded, cuInit failed or it reports no device; PLAIT_DEBUG=INFO says which)\n",
                opt->prog, rank);
        return -1;
    }
    void *ctx = NULL;
    int res = cu->DevicePrimaryCtxRetain(&ctx, 0);
    if (res == PLAIT_CU_SUCCESS) {
        res = cu->CtxSetCurrent(ctx);
        if (res != PLAIT_CU_SUCCESS)
            cu->DevicePrimaryCtxRelease(0);
    }
    if (res != PLAIT_CU_SUCCESS) {
        fprintf(stderr, "%s: rank %d: device 0's context: %s\n", opt->prog, rank, plait_cu_strerror(res, buf, sizeof(buf)));
        return -1;
    }
    perf_dev_cu = cu;
    perf_dev_ctx = ctx;
    return 0;
}

static void perf_device_leave(void)
{
    if (perf_dev_cu)
        perf_dev_cu->DevicePrimaryCtxRelease(0);
    perf_dev_cu = NULL;
    perf_dev_ctx = NULL;
}

/* -D 1: the CUDA stream of the collectives and the device buffers (the host
 * ones stay as their shadows). */
static int perf_alloc_device(struct perf_rank *ctx, size_t bytes)
{
    const struct plait_cu *cu = perf_dev_cu;
    ctx->cu = cu;
    ctx->cu_ctx = perf_dev_ctx;
    if (!ctx->opt->stream_null) {
        if (!perf_cu_ok(ctx, cu->StreamCreateWithPriority(&ctx->cu_stream, PLAIT_CU_STREAM_NON_BLOCKING, 0),
                        "cuStreamCreateWithPriority"))
            return -1;
        if (!perf_ok(ctx, plait_stream_from_cuda(ctx->cu_stream, &ctx->stream), "plait_stream_from_cuda"))
            return -1;
        ctx->run.stream = ctx->stream;
    }
    if (!perf_cu_ok(ctx, cu->MemAlloc(&ctx->dev_send, bytes), "cuMemAlloc (send)") ||
        !perf_cu_ok(ctx, cu->MemAlloc(&ctx->dev_recv, bytes), "cuMemAlloc (recv)"))
        return -1;
    if (perf_fill_bytes(ctx, (unsigned char *)(uintptr_t)ctx->dev_send, 0, bytes) ||
        perf_fill_bytes(ctx, (unsigned char *)(uintptr_t)ctx->dev_recv, 0, bytes))
        return -1;
    return 0;
}

static void perf_free_device(struct perf_rank *ctx)
{
    if (!ctx->cu)
        return;
    if (ctx->cu_stream)
        ctx->cu->StreamSynchronize(ctx->cu_stream);
    else
        ctx->cu->CtxSynchronize();
    if (ctx->dev_send)
        ctx->cu->MemFree(ctx->dev_send);
    if (ctx->dev_recv)
        ctx->cu->MemFree(ctx->dev_recv);
    if (ctx->cu_stream)
        ctx->cu->StreamDestroy(ctx->cu_stream);
    ctx->dev_send = ctx->dev_recv = 0;
    ctx->cu_stream = NULL;
}

static int perf_alloc_buffers(struct perf_rank *ctx)
{
    const struct perf_options *o = ctx->opt;
    /* Room for -e bytes after the largest misalignment (8-byte types). */
    size_t bytes = o->max_bytes + (size_t)o->unalign * 8 + 64;
    void *s = NULL, *r = NULL;

    if (posix_memalign(&s, 4096, bytes) || posix_memalign(&r, 4096, bytes)) {
        fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes: %s\n", o->prog, ctx->run.rank, bytes,
                strerror(ENOMEM));
        free(s);
        return -1;
    }
    /* Touch every page now, so that page faults stay out of the timings. */
    memset(s, 0, bytes);
    memset(r, 0, bytes);
    ctx->send_alloc = s;
    ctx->recv_alloc = r;
    ctx->alloc_bytes = bytes;
    if (o->device && perf_alloc_device(ctx, bytes))
        return -1;
    if (o->local_register) {
        void *rs = perf_send_base(ctx) - (size_t)o->unalign * ctx->run.elt_size;
        void *rr = perf_recv_base(ctx) - (size_t)o->unalign * ctx->run.elt_size;
        if (!perf_ok(ctx, plait_comm_register(ctx->comm, rs, bytes, &ctx->send_handle), "plait_comm_register (send)"))
            return -1;
        if (!perf_ok(ctx, plait_comm_register(ctx->comm, rr, bytes, &ctx->recv_handle), "plait_comm_register (recv)"))
            return -1;
    }
    return 0;
}

static int perf_run_all(struct perf_rank *ctx)
{
    const struct perf_options *o = ctx->opt;
    const struct plait_perf_coll *coll = ctx->coll;
    const int n = ctx->run.nranks;
    int t_first = o->type < 0 ? 0 : o->type, t_last = o->type < 0 ? PLAIT_NUM_TYPES - 1 : o->type;
    int o_first = 0, o_last = 0;
    int r_first = -1, r_last = -1;

    if (coll->is_reduction) {
        o_first = o->op < 0 ? 0 : o->op;
        o_last = o->op < 0 ? PLAIT_PERF_NUM_OPS - 1 : o->op;
    }
    if (coll->has_root) {
        if (o->root >= n) {
            fprintf(stderr, "%s: invalid root %d for %d ranks\n", o->prog, o->root, n);
            return -1;
        }
        r_first = o->root < 0 ? 0 : o->root;
        r_last = o->root < 0 ? n - 1 : o->root;
    }
    for (long cycle = 0; o->run_cycles == 0 || cycle < o->run_cycles; cycle++) {
        for (int t = t_first; t <= t_last; t++) {
            for (int op = o_first; op <= o_last; op++) {
                for (int root = r_first; root <= r_last; root++)
                    if (perf_time_test(ctx, (plait_datatype_t)t, op, root))
                        return -1;
            }
        }
    }
    return 0;
}

/* Runs the whole benchmark on one rank. Takes ownership of `comm` (destroyed on
 * success, aborted on failure). Returns the rank's exit status. */
static int perf_rank_main(const struct perf_options *opt, const struct plait_perf_coll *coll, plait_comm_t comm,
                          int slot, const char *launch)
{
    struct perf_rank ctx;
    int status = 1;

    memset(&ctx, 0, sizeof(ctx));
    ctx.opt = opt;
    ctx.coll = coll;
    ctx.launch = launch;
    ctx.slot = slot;
    ctx.comm = comm;
    ctx.run.comm = comm;
    if (gethostname(ctx.host, sizeof(ctx.host) - 1) != 0)
        snprintf(ctx.host, sizeof(ctx.host), "unknown");
    ctx.host[sizeof(ctx.host) - 1] = '\0';
    ctx.run.rank = -1;

    if (!perf_ok(&ctx, plait_comm_rank(comm, &ctx.run.rank), "plait_comm_rank") ||
        !perf_ok(&ctx, plait_comm_count(comm, &ctx.run.nranks), "plait_comm_count"))
        goto err;
    ctx.is_printer = ctx.run.rank == 0;
    if (!opt->stream_null && !opt->device) {
        if (!perf_ok(&ctx, plait_stream_create(&ctx.stream), "plait_stream_create"))
            goto err;
        ctx.run.stream = ctx.stream;
    }
    if (ctx.is_printer && opt->json_path) {
        char why[1400];
        ctx.json = plait_file_open(opt->json_path, false, why, sizeof(why));
        if (!ctx.json)
            printf("# skipping json output; %s\n", why);
        else
            printf("# Writing JSON output to %s\n", opt->json_path);
    }
    /* Device buffers first: the header says which kind the ranks use. */
    if (perf_alloc_buffers(&ctx) || perf_print_header(&ctx) || perf_run_all(&ctx))
        goto err;

    if (ctx.is_printer) {
        printf("# %-20s : %ld %s\n", "Out of bounds values", ctx.error_rows, ctx.error_rows ? "FAILED" : "OK");
        printf("# %-20s : %g\n", "Avg bus bandwidth", ctx.bw_count ? ctx.bw_sum / (double)ctx.bw_count : 0.0);
        printf("#\n# Collective test concluded: %s\n#\n", opt->prog);
        fflush(stdout);
    }
    status = ctx.error_rows ? 1 : 0;

    if (ctx.cu && perf_sync(&ctx))
        status = 1;
    if (ctx.stream && !perf_ok(&ctx, plait_stream_destroy(ctx.stream), "plait_stream_destroy"))
        status = 1;
    ctx.stream = NULL;
    if (ctx.send_handle && !perf_ok(&ctx, plait_comm_deregister(comm, ctx.send_handle), "plait_comm_deregister"))
        status = 1;
    if (ctx.recv_handle && !perf_ok(&ctx, plait_comm_deregister(comm, ctx.recv_handle), "plait_comm_deregister"))
        status = 1;
    if (!perf_ok(&ctx, plait_comm_finalize(comm), "plait_comm_finalize"))
        status = 1;
    if (!perf_ok(&ctx, plait_comm_destroy(comm), "plait_comm_destroy"))
        status = 1;
    goto out;

err:
    /* Abort first: it makes every wait on the communicator (ours, queued stream
     * work, peers') return, so the stream can be drained and the buffers freed. */
    plait_comm_abort(comm);
    if (ctx.stream)
        plait_stream_destroy(ctx.stream);
out:
    if (ctx.json)
        fclose(ctx.json);
    /* After the communicator is gone (or aborted): no kernel uses the buffers. */
    perf_free_device(&ctx);
    free(ctx.send_alloc);
    free(ctx.recv_alloc);
    return status;
}

/* ------------------------------------------------------------------ launchers */

static void perf_init_config(const struct perf_options *opt, plait_config_t *config)
{
    plait_config_t init = PLAIT_CONFIG_INITIALIZER;
    *config = init;
    config->name = opt->prog;
}

static void perf_report_init_failure(const struct perf_options *opt, int rank, const char *call, plait_result_t res)
{
    char who[32] = "";
    if (rank >= 0)
        snprintf(who, sizeof(who), "rank %d: ", rank);
    fprintf(stderr, "%s: %s%s failed: %s (%d): %s\n", opt->prog, who, call, plait_get_error_string(res), (int)res,
            plait_get_last_error(NULL));
}

static int perf_child_main(const struct perf_options *opt, const struct plait_perf_coll *coll, plait_unique_id_t id,
                           int rank)
{
    plait_config_t config;
    plait_comm_t comm = NULL;
    char launch[64];

    if (perf_watchdog_start(opt->timeout_s, 1))
        return 1;
    if (perf_device_enter(opt, rank))
        return 1;
    perf_init_config(opt, &config);
    plait_result_t res = plait_comm_init_rank_config(&comm, opt->np, id, rank, &config);
    if (res != PLAIT_SUCCESS) {
        perf_report_init_failure(opt, rank, "plait_comm_init_rank_config", res);
        perf_device_leave();
        return 1;
    }
    snprintf(launch, sizeof(launch), "--np %d: forked local processes", opt->np);
    int status = perf_rank_main(opt, coll, comm, 0, launch);
    perf_device_leave();
    perf_watchdog_stop();
    return status;
}

static double perf_deadline_or(double deadline, double candidate)
{
    return deadline > 0 ? deadline : candidate;
}

/* Waits for the --np children. When one fails, the others get a short grace to
 * report their own errors, then are killed. */
static int perf_wait_children(const struct perf_options *opt, pid_t *pids, int n)
{
    int remaining = n, failed = 0, killed = 0;
    double deadline = 0;

    if (n <= 0)
        return 1;
    int *is_killed = calloc((size_t)n, sizeof(int));

    while (remaining > 0) {
        int st = 0;
        pid_t p = waitpid(-1, &st, (deadline > 0 && !killed) ? WNOHANG : 0);
        if (p < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "%s: waitpid: %s\n", opt->prog, strerror(errno));
            failed = 1;
            break;
        }
        if (p == 0) {
            if (perf_now() < deadline) {
                perf_sleep_ms(20);
                continue;
            }
            for (int r = 0; r < n; r++) {
                if (pids[r] > 0) {
                    kill(pids[r], SIGKILL);
                    if (is_killed)
                        is_killed[r] = 1;
                }
            }
            killed = 1;
            continue;
        }
        int r = 0;
        while (r < n && pids[r] != p)
            r++;
        if (r == n)
            continue;
        pids[r] = 0;
        remaining--;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
            continue;
        failed = 1;
        if (is_killed && is_killed[r])
            fprintf(stderr, "%s: rank %d (pid %d) stopped after another rank failed\n", opt->prog, r, (int)p);
        else if (WIFEXITED(st))
            fprintf(stderr, "%s: rank %d (pid %d) exited with status %d\n", opt->prog, r, (int)p, WEXITSTATUS(st));
        else if (WIFSIGNALED(st))
            fprintf(stderr, "%s: rank %d (pid %d) killed by signal %d (%s)\n", opt->prog, r, (int)p, WTERMSIG(st),
                    strsignal(WTERMSIG(st)));
        deadline = perf_deadline_or(deadline, perf_now() + PERF_GRACE_PROCESS_S);
    }
    free(is_killed);
    return failed ? 1 : 0;
}

/* --np N: the unique id (and with it the bootstrap root) is created here, in
 * the parent, which stays alive until every child has finished. */
static int perf_run_forked(const struct perf_options *opt, const struct plait_perf_coll *coll)
{
    plait_unique_id_t id;
    pid_t parent = getpid();
    /* The children are forked before the id exists and read it from a pipe:
     * plait_get_unique_id starts the root's thread, and a fork while another
     * thread holds a lock (a sanitizer's allocator has no fork handler) could
     * leave the child stuck. */
    int idp[2];
    if (pipe(idp) != 0) {
        fprintf(stderr, "%s: pipe: %s\n", opt->prog, strerror(errno));
        return 1;
    }
    pid_t *pids = calloc((size_t)opt->np, sizeof(pid_t));
    if (!pids) {
        fprintf(stderr, "%s: out of memory\n", opt->prog);
        close(idp[0]);
        close(idp[1]);
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < opt->np; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "%s: fork (rank %d): %s\n", opt->prog, r, strerror(errno));
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGKILL);
            for (int k = 0; k < r; k++)
                waitpid(pids[k], NULL, 0);
            free(pids);
            close(idp[0]);
            close(idp[1]);
            return 1;
        }
        if (pid == 0) {
            /* A child must not outlive a killed launcher. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(1);
            close(idp[1]);
            size_t got = 0;
            while (got < sizeof(id)) {
                ssize_t n = read(idp[0], (char *)&id + got, sizeof(id) - got);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n <= 0)
                    _exit(1); /* the parent could not make an id: it says why */
                got += (size_t)n;
            }
            close(idp[0]);
            int status = perf_child_main(opt, coll, id, r);
            fflush(stdout);
            fflush(stderr);
            /* _exit: the parent's atexit handlers (the library's included) are
             * not this process's to run. */
            _exit(status);
        }
        pids[r] = pid;
    }
    close(idp[0]);
    plait_result_t res = plait_get_unique_id(&id);
    if (res != PLAIT_SUCCESS)
        perf_report_init_failure(opt, -1, "plait_get_unique_id", res);
    /* One 128-byte copy per child: writes that small are atomic on a pipe. */
    for (int r = 0; res == PLAIT_SUCCESS && r < opt->np; r++)
        if (write(idp[1], &id, sizeof(id)) != (ssize_t)sizeof(id))
            res = PLAIT_ERR_SYSTEM;
    close(idp[1]);
    int status = perf_wait_children(opt, pids, opt->np);
    if (res != PLAIT_SUCCESS)
        status = 1;
    free(pids);
    return status;
}

struct perf_thread_state {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    int failed;
};

struct perf_thread_arg {
    const struct perf_options *opt;
    const struct plait_perf_coll *coll;
    plait_comm_t comm; /* NULL with -D 1: the thread makes its own from id */
    int slot;
    int status;
    const char *launch;
    struct perf_thread_state *state;
    plait_unique_id_t id;
};

static void *perf_thread_main(void *p)
{
    struct perf_thread_arg *a = p;
    if (!a->comm) {
        /* Device buffers: this thread's context first, then its communicator. */
        plait_config_t config;
        perf_init_config(a->opt, &config);
        a->status = 1;
        if (perf_device_enter(a->opt, a->slot) == 0) {
            plait_result_t res = plait_comm_init_rank_config(&a->comm, a->opt->threads, a->id, a->slot, &config);
            if (res != PLAIT_SUCCESS)
                perf_report_init_failure(a->opt, a->slot, "plait_comm_init_rank_config", res);
            else
                a->status = perf_rank_main(a->opt, a->coll, a->comm, a->slot, a->launch);
            perf_device_leave();
        }
    } else {
        a->status = perf_rank_main(a->opt, a->coll, a->comm, a->slot, a->launch);
    }
    pthread_mutex_lock(&a->state->lock);
    a->state->done++;
    if (a->status)
        a->state->failed++;
    pthread_cond_broadcast(&a->state->cond);
    pthread_mutex_unlock(&a->state->lock);
    return NULL;
}

/* --threads N: one communicator per rank from plait_comm_init_all, one thread
 * per rank. */
static int perf_run_threads(const struct perf_options *opt, const struct plait_perf_coll *coll)
{
    const int n = opt->threads;
    plait_comm_t *comms = calloc((size_t)n, sizeof(*comms));
    struct perf_thread_arg *args = calloc((size_t)n, sizeof(*args));
    pthread_t *tids = calloc((size_t)n, sizeof(*tids));
    struct perf_thread_state state = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    char launch[64];
    int status = 1;

    if (!comms || !args || !tids) {
        fprintf(stderr, "%s: out of memory\n", opt->prog);
        goto out;
    }
    plait_unique_id_t id;
    memset(&id, 0, sizeof(id));
    plait_result_t res = opt->device ? plait_get_unique_id(&id) : plait_comm_init_all(comms, n, NULL);
    if (res != PLAIT_SUCCESS) {
        perf_report_init_failure(opt, -1, opt->device ? "plait_get_unique_id" : "plait_comm_init_all", res);
        goto out;
    }
    if (perf_watchdog_start(opt->timeout_s, n))
        goto out;
    snprintf(launch, sizeof(launch), "--threads %d: one thread per rank", n);
    for (int r = 0; r < n; r++) {
        args[r] = (struct perf_thread_arg){opt, coll, comms[r], r, 1, launch, &state, id};
        int err = pthread_create(&tids[r], NULL, perf_thread_main, &args[r]);
        if (err) {
            /* The ranks already running wait for this one forever. */
            fprintf(stderr, "%s: pthread_create (rank %d): %s\n", opt->prog, r, strerror(err));
            fflush(stdout);
            _exit(1);
        }
    }
    pthread_mutex_lock(&state.lock);
    struct timespec deadline = {0, 0};
    while (state.done < n) {
        if (state.failed && deadline.tv_sec == 0) {
            clock_gettime(CLOCK_REALTIME, &deadline);
            deadline.tv_sec += PERF_GRACE_THREAD_S;
        }
        if (deadline.tv_sec == 0) {
            pthread_cond_wait(&state.cond, &state.lock);
        } else if (pthread_cond_timedwait(&state.cond, &state.lock, &deadline) == ETIMEDOUT && state.done < n) {
            fprintf(stderr, "%s: %d rank(s) still running %d s after a rank failed; exiting\n", opt->prog,
                    n - state.done, PERF_GRACE_THREAD_S);
            fflush(stdout);
            fflush(stderr);
            _exit(1);
        }
    }
    pthread_mutex_unlock(&state.lock);
    status = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(tids[r], NULL);
        if (args[r].status)
            status = 1;
    }
    perf_watchdog_stop();
out:
    free(comms);
    free(args);
    free(tids);
    return status;
}

/* Without --np or --threads: the launcher's environment, or a single rank. */
static int perf_run_env(const struct perf_options *opt, const struct plait_perf_coll *coll)
{
    static const char *const markers[] = {"PLAIT_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"};
    int has_launcher = 0;
    plait_comm_t comm = NULL;
    plait_config_t config;
    plait_result_t res;
    const char *launch;

    for (size_t i = 0; i < sizeof(markers) / sizeof(markers[0]); i++)
        if (getenv(markers[i]))
            has_launcher = 1;
    if (perf_watchdog_start(opt->timeout_s, 1))
        return 1;
    if (perf_device_enter(opt, 0)) {
        perf_watchdog_stop();
        return 1;
    }
    perf_init_config(opt, &config);
    if (has_launcher) {
        launch = "launcher environment";
        res = plait_comm_init_from_env(&comm, &config);
        if (res != PLAIT_SUCCESS) {
            perf_report_init_failure(opt, -1, "plait_comm_init_from_env", res);
            perf_device_leave();
            perf_watchdog_stop();
            return 1;
        }
    } else {
        plait_unique_id_t id;
        launch = "no launcher environment: one rank; use --np N or --threads N for more";
        res = plait_get_unique_id(&id);
        if (res == PLAIT_SUCCESS)
            res = plait_comm_init_rank_config(&comm, 1, id, 0, &config);
        if (res != PLAIT_SUCCESS) {
            perf_report_init_failure(opt, 0, "plait_comm_init_rank_config", res);
            perf_device_leave();
            perf_watchdog_stop();
            return 1;
        }
    }
    int status = perf_rank_main(opt, coll, comm, 0, launch);
    perf_device_leave();
    perf_watchdog_stop();
    return status;
}

int plait_perf_main(int argc, char **argv, const struct plait_perf_coll *coll)
{
    struct perf_options opt;
    const char *slash = argv[0] ? strrchr(argv[0], '/') : NULL;

    memset(&opt, 0, sizeof(opt));
    opt.prog = slash ? slash + 1 : (argv[0] ? argv[0] : "perf");
    /* nccl-tests' defaults. */
    opt.min_bytes = 32u << 20;
    opt.max_bytes = 32u << 20;
    opt.step_bytes = 1u << 20;
    opt.step_factor = 1;
    opt.iters = 20;
    opt.agg_iters = 1;
    opt.warmup_iters = 1;
    opt.run_cycles = 1;
    opt.check = 1;
    opt.type = PLAIT_FLOAT32;
    opt.op = PLAIT_SUM;
    opt.root = 0;
    opt.average = 1;
    double dev_env = 0;
    if (plait_env_number("PLAIT_PERF_DEVICE", &dev_env, NULL) != PLAIT_SUCCESS) {
        fprintf(stderr, "%s: %s\n", argv[0], plait_last_error_get());
        return 2;
    }
    opt.device = dev_env == 1;

    /* Every line is flushed, so that progress shows through pipes too. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    int parsed = perf_parse_options(argc, argv, &opt);
    if (parsed)
        return parsed > 0 ? 0 : 2;
    if (opt.np)
        return perf_run_forked(&opt, coll);
    if (opt.threads)
        return perf_run_threads(&opt, coll);
    return perf_run_env(&opt, coll);
}
