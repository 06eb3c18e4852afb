/* Element-wise reductions (core/reduce.c): conversions, every type x op x flags,
 * wrap-around, avg truncation, unaligned and aliased buffers.
 *
 * Everything is checked against the reference below, which is written from the
 * format definitions and plain per-element C, independently of reduce.c: narrow
 * floats are decoded as mantissa * 2^exponent and encoded by a search over the
 * table of representable values, comparing against exact midpoints. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "core/reduce.h"

/* ---------------------------------------------------------------- reference formats */

struct ref_format {
    int width;           /* bits */
    int exp_bits;
    int man_bits;
    int bias;
    bool has_inf;        /* all-ones exponent means inf/NaN (IEEE style) */
    bool is_saturating;  /* finite overflow and inf narrow to the largest finite (CUDA SATFINITE) */
    uint32_t max_finite; /* positive encoding */
    uint32_t nan;        /* what any NaN narrows to */
    double *values;      /* decoded value of every positive encoding 0..max_finite+1 */
};

static struct ref_format ref_half = {16, 5, 10, 15, true, false, 0x7bff, 0x7fff, NULL};
static struct ref_format ref_bf16 = {16, 8, 7, 127, true, false, 0x7f7f, 0x7fff, NULL};
static struct ref_format ref_e4m3 = {8, 4, 3, 7, false, true, 0x7e, 0x7f, NULL};
static struct ref_format ref_e5m2 = {8, 5, 2, 15, true, true, 0x7b, 0x7f, NULL};

static struct ref_format *ref_format_of(int dtype)
{
    switch (dtype) {
    case PLAIT_FLOAT16:
        return &ref_half;
    case PLAIT_BFLOAT16:
        return &ref_bf16;
    case PLAIT_FLOAT8_E4M3:
        return &ref_e4m3;
    case PLAIT_FLOAT8_E5M2:
        return &ref_e5m2;
    default:
        return NULL;
    }
}

/* 2^e for the exponents the formats need, exact, without libm. */
static double pow2(int e)
{
    uint64_t bits = (uint64_t)(e + 1023) << 52;
    double v;
    memcpy(&v, &bits, 8);
    return v;
}

static double ref_decode(const struct ref_format *f, uint32_t bits)
{
    uint32_t sign = (bits >> (f->width - 1)) & 1u;
    uint32_t e = (bits >> f->man_bits) & ((1u << f->exp_bits) - 1u);
    uint32_t m = bits & ((1u << f->man_bits) - 1u);
    uint32_t e_max = (1u << f->exp_bits) - 1u;
    double v;
    if (f->has_inf && e == e_max)
        v = m != 0 ? NAN : INFINITY;
    else if (!f->has_inf && e == e_max && m == (1u << f->man_bits) - 1u)
        v = NAN;
    else if (e == 0)
        v = (double)m * pow2(1 - f->bias - f->man_bits);
    else
        v = (double)(m + (1u << f->man_bits)) * pow2((int)e - f->bias - f->man_bits);
    return sign ? -v : v;
}

static void ref_init(struct ref_format *f)
{
    if (f->values != NULL)
        return;
    f->values = malloc((f->max_finite + 2) * sizeof(double));
    cr_assert_not_null(f->values);
    for (uint32_t p = 0; p <= f->max_finite; p++)
        f->values[p] = ref_decode(f, p);
    /* The value one step past the largest finite, where round-to-nearest-even
     * sends overflow (inf for IEEE formats; saturating formats clamp first). */
    f->values[f->max_finite + 1] = f->values[f->max_finite] + (f->values[f->max_finite] - f->values[f->max_finite - 1]);
}

/* x rounded to nearest, ties to the even encoding. */
static uint32_t ref_encode(struct ref_format *f, double x)
{
    ref_init(f);
    if (isnan(x))
        return f->nan;
    uint32_t sign = signbit(x) ? 1u << (f->width - 1) : 0u;
    double a = fabs(x);
    if (f->is_saturating && a > f->values[f->max_finite])
        return sign | f->max_finite;
    if (a >= f->values[f->max_finite + 1])
        return sign | (f->max_finite + 1); /* inf */
    /* Largest encoding p with values[p] <= a. */
    uint32_t lo = 0, hi = f->max_finite + 1;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (f->values[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    uint32_t p = lo;
    if (f->values[p] == a)
        return sign | p;
    double midpoint = (f->values[p] + f->values[p + 1]) / 2; /* exact in double */
    uint32_t r;
    if (a < midpoint)
        r = p;
    else if (a > midpoint)
        r = p + 1;
    else
        r = (p & 1u) ? p + 1 : p;
    return sign | r;
}

/* ---------------------------------------------------------------- element bits */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t f64_bits(double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
}

static double f64_of(uint64_t u)
{
    double f;
    memcpy(&f, &u, 8);
    return f;
}

static size_t esize(int dtype)
{
    static const size_t sizes[PLAIT_NUM_TYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return sizes[dtype];
}

static uint64_t load_bits(int dtype, const void *buf, size_t i)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)buf + i * esize(dtype), esize(dtype)); /* little-endian */
    return v;
}

static void store_bits(int dtype, void *buf, size_t i, uint64_t v)
{
    memcpy((char *)buf + i * esize(dtype), &v, esize(dtype));
}

static bool is_integer(int dtype)
{
    return dtype <= PLAIT_UINT64;
}

static bool is_signed_int(int dtype)
{
    return dtype == PLAIT_INT8 || dtype == PLAIT_INT32 || dtype == PLAIT_INT64;
}

static uint64_t int_mask(int dtype)
{
    return esize(dtype) == 8 ? ~0ull : (1ull << (8 * esize(dtype))) - 1;
}

static int64_t sign_extend(int dtype, uint64_t v)
{
    switch (esize(dtype)) {
    case 1:
        return (int8_t)(uint8_t)v;
    case 4:
        return (int32_t)(uint32_t)v;
    default:
        return (int64_t)v;
    }
}

/* Value of a float element, widened (exactly) to double. */
static double ref_value(int dtype, uint64_t bits)
{
    if (dtype == PLAIT_FLOAT32)
        return f32_of((uint32_t)bits);
    if (dtype == PLAIT_FLOAT64)
        return f64_of(bits);
    return ref_decode(ref_format_of(dtype), (uint32_t)bits);
}

/* Rounds an fp32 (or, for fp64, double) result to the storage type. */
static uint64_t ref_store(int dtype, double v)
{
    if (dtype == PLAIT_FLOAT64)
        return f64_bits(v);
    if (dtype == PLAIT_FLOAT32)
        return f32_bits((float)v);
    return ref_encode(ref_format_of(dtype), v);
}

static bool ref_is_nan_bits(int dtype, uint64_t bits)
{
    return !is_integer(dtype) && isnan(ref_value(dtype, bits));
}

/* ---------------------------------------------------------------- reference reduction */

struct ref_op {
    int dtype;
    int op;
    uint64_t nranks;
    uint64_t scalar_bits; /* premulsum's scalar as stored in dtype */
};

/* fmaxf/fminf as documented in reduce.c: a NaN operand is ignored, two NaNs give
 * the canonical NaN, -0 < +0. */
static double ref_maxmin(bool is_max, double x, double y, bool *is_canonical_nan)
{
    *is_canonical_nan = false;
    if (isnan(x) && isnan(y)) {
        *is_canonical_nan = true;
        return NAN;
    }
    if (isnan(x))
        return y;
    if (isnan(y))
        return x;
    if (x == y && x == 0) {
        bool x_neg = signbit(x);
        if (is_max)
            return x_neg ? y : x;
        return x_neg ? x : y;
    }
    if (is_max)
        return x > y ? x : y;
    return x < y ? x : y;
}

/* One element: post(pre(a) OP b), b absent when has_b is false. */
static uint64_t ref_element(const struct ref_op *o, unsigned flags, uint64_t a, bool has_b, uint64_t b)
{
    int dtype = o->dtype;
    int op = o->op;
    if (is_integer(dtype)) {
        uint64_t mask = int_mask(dtype);
        uint64_t x = a;
        if ((flags & PLAIT_RED_PRE) && op == PLAIT_RED_PREMULSUM)
            x = (x * o->scalar_bits) & mask;
        if (has_b) {
            bool is_signed = is_signed_int(dtype);
            switch (op) {
            case PLAIT_PROD:
                x = (x * b) & mask;
                break;
            case PLAIT_MAX:
                if (is_signed ? sign_extend(dtype, x) < sign_extend(dtype, b) : x < b)
                    x = b;
                break;
            case PLAIT_MIN:
                if (is_signed ? sign_extend(dtype, x) > sign_extend(dtype, b) : x > b)
                    x = b;
                break;
            default:
                x = (x + b) & mask;
                break;
            }
        }
        if ((flags & PLAIT_RED_POST) && op == PLAIT_AVG) {
            if (is_signed_int(dtype))
                x = (uint64_t)(sign_extend(dtype, x) / (int64_t)o->nranks) & mask;
            else
                x = x / o->nranks;
        }
        return x;
    }

    bool is_f64 = dtype == PLAIT_FLOAT64;
    double x = ref_value(dtype, a);
    bool has_pre = (flags & PLAIT_RED_PRE) && (op == PLAIT_RED_PREMULSUM || op == PLAIT_AVG);
    if (!has_pre && !has_b)
        return a; /* a plain copy: the bits, NaN payloads included */
    if (has_pre) {
        double s;
        if (op == PLAIT_AVG)
            s = is_f64 ? 1.0 / (double)o->nranks : ref_value(dtype, ref_store(dtype, (float)(1.0 / (double)o->nranks)));
        else
            s = ref_value(dtype, o->scalar_bits);
        if (is_f64) {
            volatile double t = x * s;
            x = t;
        } else {
            volatile float t = (float)x * (float)s;
            x = ref_value(dtype, ref_store(dtype, t));
        }
    }
    if (!has_b)
        return ref_store(dtype, x);
    double y = ref_value(dtype, b);
    bool is_canonical_nan = false;
    double r;
    switch (op) {
    case PLAIT_PROD:
        if (is_f64) {
            volatile double t = x * y;
            r = t;
        } else {
            volatile float t = (float)x * (float)y;
            r = t;
        }
        break;
    case PLAIT_MAX:
    case PLAIT_MIN:
        r = ref_maxmin(op == PLAIT_MAX, x, y, &is_canonical_nan);
        break;
    default:
        if (is_f64) {
            volatile double t = x + y;
            r = t;
        } else {
            volatile float t = (float)x + (float)y;
            r = t;
        }
        break;
    }
    if (is_canonical_nan) {
        if (dtype == PLAIT_FLOAT64)
            return 0x7fffffffffffffffull;
        if (dtype == PLAIT_FLOAT32)
            return 0x7fffffffu;
    }
    return ref_store(dtype, r);
}

/* ---------------------------------------------------------------- inputs */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* Random element bits that exercise wrap-around, signs, specials, subnormals,
 * rounding ties (values of similar magnitude) and saturation. */
static uint64_t random_element(int dtype)
{
    uint64_t r = rng_next();
    unsigned kind = (unsigned)(r >> 60);
    if (is_integer(dtype)) {
        uint64_t mask = int_mask(dtype);
        if (kind < 6)
            return (uint64_t)((int64_t)(r % 21) - 10) & mask;
        if (kind < 8) {
            static const uint64_t edges[] = {0, 1, ~0ull, 0x7f, 0x80, 0x7fffffff, 0x80000000, 0x7fffffffffffffff,
                                             0x8000000000000000};
            return edges[r % (sizeof edges / sizeof edges[0])] & mask;
        }
        return rng_next() & mask;
    }
    if (kind < 6) {
        /* A moderate value, quantised so that sums and products often tie. */
        double v = (double)((int64_t)(r % 4001) - 2000) * pow2(-(int)(rng_next() % 12));
        return ref_store(dtype, v);
    }
    if (kind < 8) {
        static const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0, 448.0, 57344.0, 65504.0,
                                          0x1p-24, 0x1p-9, 0x1p-16, 0x1p-133, -0x1p-149, 3.0e38, 1.0e308};
        double v = specials[r % (sizeof specials / sizeof specials[0])];
        if (isnan(v) && (r & 1))
            v = -v;
        return ref_store(dtype, v);
    }
    return rng_next() & ((esize(dtype) == 8) ? ~0ull : (1ull << (8 * esize(dtype))) - 1);
}

/* ---------------------------------------------------------------- running one case */

#define GUARD 16

/* A buffer of n elements at byte offset `off` inside a guarded allocation. */
struct guarded {
    unsigned char *base;
    size_t total;
    size_t off;
    size_t len;
};

static void *guarded_alloc(struct guarded *g, size_t len, size_t off)
{
    g->total = len + off + 2 * GUARD;
    g->base = malloc(g->total);
    cr_assert_not_null(g->base);
    memset(g->base, 0xa5, g->total);
    g->off = GUARD + off;
    g->len = len;
    return g->base + g->off;
}

static void guarded_check_free(struct guarded *g, const char *what)
{
    for (size_t i = 0; i < g->total; i++) {
        if (i >= g->off && i < g->off + g->len)
            continue;
        cr_assert_eq(g->base[i], 0xa5, "%s: byte %lld outside the buffer was written", what,
                     (long long)i - (long long)g->off);
    }
    free(g->base);
}

static const char *flags_name(unsigned flags)
{
    static const char *const names[] = {"none", "PRE", "POST", "PRE|POST"};
    return names[flags & 3u];
}

static bool same_result(int dtype, uint64_t got, uint64_t want)
{
    if (got == want)
        return true;
    /* fp32/fp64 arithmetic leaves a NaN's payload to the CPU; only NaN-ness is
     * specified. Narrow types always produce the canonical NaN, checked exactly. */
    if ((dtype == PLAIT_FLOAT32 || dtype == PLAIT_FLOAT64) && ref_is_nan_bits(dtype, got) &&
        ref_is_nan_bits(dtype, want))
        return true;
    return false;
}

enum layout { LAYOUT_ALIGNED, LAYOUT_UNALIGNED, LAYOUT_DST_IS_A, LAYOUT_DST_IS_B };

static const char *const layout_names[] = {"aligned", "unaligned", "dst==a", "dst==b"};

static void check_case(const struct ref_op *o, const struct plait_red *r, unsigned flags, bool has_b, size_t n,
                       enum layout layout, const uint64_t *a, const uint64_t *b, const uint64_t *want)
{
    int dtype = o->dtype;
    size_t len = n * esize(dtype);
    /* Offsets chosen so that no two buffers share an alignment. */
    size_t off_d = layout == LAYOUT_ALIGNED ? 0 : 1;
    size_t off_a = layout == LAYOUT_ALIGNED ? 0 : 3;
    size_t off_b = layout == LAYOUT_ALIGNED ? 0 : 6;
    struct guarded gd, ga, gb;
    void *dst = guarded_alloc(&gd, len, off_d);
    void *pa = guarded_alloc(&ga, len, off_a);
    void *pb = guarded_alloc(&gb, len, off_b);
    for (size_t i = 0; i < n; i++) {
        store_bits(dtype, pa, i, a[i]);
        store_bits(dtype, pb, i, has_b ? b[i] : 0);
        store_bits(dtype, dst, i, 0x5a5a5a5a5a5a5a5aull);
    }
    const void *in_a = pa;
    const void *in_b = has_b ? pb : NULL;
    if (layout == LAYOUT_DST_IS_A) {
        memcpy(dst, pa, len);
        in_a = dst;
    } else if (layout == LAYOUT_DST_IS_B) {
        memcpy(dst, pb, len);
        in_b = dst;
    }
    plait_reduce_apply(r, dst, in_a, in_b, n, flags);
    for (size_t i = 0; i < n; i++) {
        uint64_t got = load_bits(dtype, dst, i);
        if (!same_result(dtype, got, want[i]))
            cr_assert_fail("%s %s flags=%s b=%s n=%zu %s: element %zu: a=0x%llx b=0x%llx got 0x%llx want 0x%llx",
                    plait_dtype_name(dtype), plait_op_name(o->op), flags_name(flags), has_b ? "yes" : "NULL", n,
                    layout_names[layout], i, (unsigned long long)a[i], (unsigned long long)(has_b ? b[i] : 0),
                    (unsigned long long)got, (unsigned long long)want[i]);
    }
    /* The inputs that are not the output must be left alone. */
    if (in_a != dst)
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(load_bits(dtype, pa, i), a[i], "%s: input a modified", plait_dtype_name(dtype));
    if (has_b && in_b != dst)
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(load_bits(dtype, pb, i), b[i], "%s: input b modified", plait_dtype_name(dtype));
    guarded_check_free(&gd, "dst");
    guarded_check_free(&ga, "a");
    guarded_check_free(&gb, "b");
}

/* The premulsum scalar for each type: something that is not a power of two, and
 * negative for signed types so that the multiply wraps. */
static uint64_t premul_scalar(int dtype)
{
    if (is_integer(dtype))
        return (is_signed_int(dtype) ? (uint64_t)-3 : 3) & int_mask(dtype);
    return ref_store(dtype, -0.3);
}

static void check_dtype(int dtype)
{
    /* 4133 crosses the 4096-element blocks of integer avg's division. */
    static const size_t sizes[] = {0, 1, 7, 33, 1003, 4133};
    const uint64_t nranks = 3;
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)dtype;
    for (int op = 0; op < PLAIT_RED_NUM_OPS; op++) {
        struct ref_op o = {dtype, op, nranks, premul_scalar(dtype)};
        struct plait_red r;
        uint64_t scalar = o.scalar_bits; /* little-endian: its first esize bytes are the element */
        cr_assert_eq(plait_red_init(&r, dtype, op, &scalar, nranks), PLAIT_SUCCESS, "init %s %s",
                     plait_dtype_name(dtype), plait_op_name(op));
        for (unsigned flags = 0; flags < 4; flags++) {
            for (int has_b = 0; has_b < 2; has_b++) {
                for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                    size_t n = sizes[si];
                    uint64_t *a = calloc(n + 1, sizeof *a);
                    uint64_t *b = calloc(n + 1, sizeof *b);
                    uint64_t *want = calloc(n + 1, sizeof *want);
                    cr_assert(a && b && want);
                    for (size_t i = 0; i < n; i++) {
                        a[i] = random_element(dtype);
                        b[i] = random_element(dtype);
                        want[i] = ref_element(&o, flags, a[i], has_b, b[i]);
                    }
                    for (int layout = 0; layout < 4; layout++) {
                        if (layout == LAYOUT_DST_IS_B && !has_b)
                            continue;
                        check_case(&o, &r, flags, has_b, n, (enum layout)layout, a, b, want);
                    }
                    free(a);
                    free(b);
                    free(want);
                }
            }
        }
    }
}

Test(reduce, matrix_int8) { check_dtype(PLAIT_INT8); }
Test(reduce, matrix_uint8) { check_dtype(PLAIT_UINT8); }
Test(reduce, matrix_int32) { check_dtype(PLAIT_INT32); }
Test(reduce, matrix_uint32) { check_dtype(PLAIT_UINT32); }
Test(reduce, matrix_int64) { check_dtype(PLAIT_INT64); }
Test(reduce, matrix_uint64) { check_dtype(PLAIT_UINT64); }
Test(reduce, matrix_float16) { check_dtype(PLAIT_FLOAT16); }
Test(reduce, matrix_float32) { check_dtype(PLAIT_FLOAT32); }
Test(reduce, matrix_float64) { check_dtype(PLAIT_FLOAT64); }
Test(reduce, matrix_bfloat16) { check_dtype(PLAIT_BFLOAT16); }
Test(reduce, matrix_float8_e4m3) { check_dtype(PLAIT_FLOAT8_E4M3); }
Test(reduce, matrix_float8_e5m2) { check_dtype(PLAIT_FLOAT8_E5M2); }

/* ---------------------------------------------------------------- conversions */

static float to_float(int dtype, uint32_t v)
{
    switch (dtype) {
    case PLAIT_FLOAT16:
        return plait_half_to_float((uint16_t)v);
    case PLAIT_BFLOAT16:
        return plait_bf16_to_float((uint16_t)v);
    case PLAIT_FLOAT8_E4M3:
        return plait_e4m3_to_float((uint8_t)v);
    default:
        return plait_e5m2_to_float((uint8_t)v);
    }
}

static uint32_t from_float(int dtype, float f)
{
    switch (dtype) {
    case PLAIT_FLOAT16:
        return plait_float_to_half(f);
    case PLAIT_BFLOAT16:
        return plait_float_to_bf16(f);
    case PLAIT_FLOAT8_E4M3:
        return plait_float_to_e4m3(f);
    default:
        return plait_float_to_e5m2(f);
    }
}

static const int narrow_types[] = {PLAIT_FLOAT16, PLAIT_BFLOAT16, PLAIT_FLOAT8_E4M3, PLAIT_FLOAT8_E5M2};

/* Every encoding widens to the value the format defines, and narrows back to
 * itself (NaN to the canonical NaN; e5m2's infinities saturate). */
Test(reduce, convert_every_encoding_round_trips)
{
    for (size_t t = 0; t < 4; t++) {
        int dtype = narrow_types[t];
        struct ref_format *f = ref_format_of(dtype);
        for (uint32_t v = 0; v < (1u << f->width); v++) {
            double want = ref_decode(f, v);
            float got = to_float(dtype, v);
            if (isnan(want)) {
                cr_assert(isnan(got), "%s 0x%x: want NaN, got %a", plait_dtype_name(dtype), v, (double)got);
                cr_assert_eq(from_float(dtype, got), f->nan, "%s 0x%x: NaN narrows to 0x%x", plait_dtype_name(dtype),
                             v, from_float(dtype, got));
                continue;
            }
            cr_assert_eq(f32_bits(got), f32_bits((float)want), "%s 0x%x: got %a want %a", plait_dtype_name(dtype),
                         v, (double)got, want);
            uint32_t back = from_float(dtype, got);
            uint32_t expect = v;
            if (isinf(want) && f->is_saturating)
                expect = (v & (1u << (f->width - 1))) | f->max_finite;
            cr_assert_eq(back, expect, "%s 0x%x: round trip gave 0x%x", plait_dtype_name(dtype), v, back);
        }
    }
}

/* Every midpoint between neighbouring encodings (a tie), and the floats just
 * above and below it, narrow as round-to-nearest-even says. */
Test(reduce, convert_ties_and_neighbours)
{
    for (size_t t = 0; t < 4; t++) {
        int dtype = narrow_types[t];
        struct ref_format *f = ref_format_of(dtype);
        ref_init(f);
        for (uint32_t p = 0; p <= f->max_finite; p++) {
            double mid = (f->values[p] + f->values[p + 1]) / 2;
            float m = (float)mid;
            cr_assert_eq((double)m, mid, "%s: midpoint %a is not an fp32", plait_dtype_name(dtype), mid);
            /* The midpoint and the fp32 values on either side of it (m > 0). */
            float probes[3] = {m, f32_of(f32_bits(m) - 1), f32_of(f32_bits(m) + 1)};
            for (int k = 0; k < 3; k++) {
                for (int sgn = 0; sgn < 2; sgn++) {
                    float x = sgn ? -probes[k] : probes[k];
                    uint32_t got = from_float(dtype, x);
                    uint32_t want = ref_encode(f, x);
                    cr_assert_eq(got, want, "%s: %a narrows to 0x%x, want 0x%x", plait_dtype_name(dtype), (double)x,
                                 got, want);
                }
            }
        }
    }
}

/* A sweep over the fp32 encodings (every 4099th, both signs, all exponents). */
Test(reduce, convert_float_sweep)
{
    for (size_t t = 0; t < 4; t++) {
        int dtype = narrow_types[t];
        struct ref_format *f = ref_format_of(dtype);
        for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
            float x = f32_of((uint32_t)u);
            uint32_t got = from_float(dtype, x);
            uint32_t want = ref_encode(f, x);
            cr_assert_eq(got, want, "%s: 0x%08x (%a) narrows to 0x%x, want 0x%x", plait_dtype_name(dtype),
                         (unsigned)u, (double)x, got, want);
        }
    }
}

Test(reduce, convert_known_values)
{
    /* fp16: ties to even, subnormals, overflow to inf, NaN canonical. */
    cr_expect_eq(plait_float_to_half(1.0f), 0x3c00);
    cr_expect_eq(plait_float_to_half(1.0f + 0x1p-11f), 0x3c00);        /* tie, even stays */
    cr_expect_eq(plait_float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);    /* tie, odd rounds up */
    cr_expect_eq(plait_float_to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    cr_expect_eq(plait_float_to_half(65504.0f), 0x7bff);
    cr_expect_eq(plait_float_to_half(65519.0f), 0x7bff);
    cr_expect_eq(plait_float_to_half(65520.0f), 0x7c00); /* tie with 2^16: even is inf */
    cr_expect_eq(plait_float_to_half(-1e10f), 0xfc00);
    cr_expect_eq(plait_float_to_half(INFINITY), 0x7c00);
    cr_expect_eq(plait_float_to_half(0x1p-24f), 0x0001);
    cr_expect_eq(plait_float_to_half(0x1p-25f), 0x0000);            /* tie with 0 */
    cr_expect_eq(plait_float_to_half(0x1.8p-25f), 0x0001);
    cr_expect_eq(plait_float_to_half(3 * 0x1p-25f), 0x0002);        /* tie between 1 and 2 ulps */
    cr_expect_eq(plait_float_to_half(0x1p-14f - 0x1p-25f), 0x0400); /* tie rounds up to the smallest normal */
    cr_expect_eq(plait_float_to_half(-0.0f), 0x8000);
    cr_expect_eq(plait_float_to_half(NAN), 0x7fff);
    cr_expect_eq(plait_float_to_half(-NAN), 0x7fff);
    cr_expect_eq(f32_bits(plait_half_to_float(0x0001)), f32_bits(0x1p-24f));
    cr_expect_eq(f32_bits(plait_half_to_float(0x03ff)), f32_bits(0x3ffp-24f));
    cr_expect_eq(f32_bits(plait_half_to_float(0xfc00)), f32_bits(-INFINITY));

    /* bf16 */
    cr_expect_eq(plait_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    cr_expect_eq(plait_float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    cr_expect_eq(plait_float_to_bf16(0x1.fffffep127f), 0x7f80); /* rounds up past the largest finite */
    cr_expect_eq(plait_float_to_bf16(0x1p-133f), 0x0001);        /* bf16 subnormal */
    cr_expect_eq(plait_float_to_bf16(-NAN), 0x7fff);
    cr_expect_eq(f32_bits(plait_bf16_to_float(0x0001)), f32_bits(0x1p-133f));

    /* e4m3: no inf; saturate to 448; NaN 0x7f */
    cr_expect_eq(plait_float_to_e4m3(448.0f), 0x7e);
    cr_expect_eq(plait_float_to_e4m3(464.0f), 0x7e);
    cr_expect_eq(plait_float_to_e4m3(1e9f), 0x7e);
    cr_expect_eq(plait_float_to_e4m3(INFINITY), 0x7e);
    cr_expect_eq(plait_float_to_e4m3(-INFINITY), 0xfe);
    cr_expect_eq(plait_float_to_e4m3(-500.0f), 0xfe);
    cr_expect_eq(plait_float_to_e4m3(NAN), 0x7f);
    cr_expect_eq(plait_float_to_e4m3(-NAN), 0x7f);
    cr_expect_eq(plait_float_to_e4m3(0x1p-9f), 0x01);
    cr_expect_eq(plait_float_to_e4m3(0x1p-10f), 0x00);  /* tie with 0 */
    cr_expect_eq(plait_float_to_e4m3(3 * 0x1p-10f), 0x02);
    cr_expect_eq(plait_float_to_e4m3(1.0625f), 0x38);   /* 1 + 1/16: tie, even */
    cr_expect_eq(plait_float_to_e4m3(1.1875f), 0x3a);   /* 1 + 3/16: tie, odd up */
    cr_expect_eq(plait_float_to_e4m3(-0.0f), 0x80);
    cr_expect(isnan(plait_e4m3_to_float(0x7f)));
    cr_expect(isnan(plait_e4m3_to_float(0xff)));
    cr_expect_eq(plait_e4m3_to_float(0x7e), 448.0f);
    cr_expect_eq(plait_e4m3_to_float(0x01), 0x1p-9f);

    /* e5m2: saturate to 57344 (SATFINITE, infinities included) */
    cr_expect_eq(plait_float_to_e5m2(57344.0f), 0x7b);
    cr_expect_eq(plait_float_to_e5m2(61440.0f), 0x7b);
    cr_expect_eq(plait_float_to_e5m2(1e30f), 0x7b);
    cr_expect_eq(plait_float_to_e5m2(INFINITY), 0x7b);
    cr_expect_eq(plait_float_to_e5m2(-INFINITY), 0xfb);
    cr_expect_eq(plait_float_to_e5m2(NAN), 0x7f);
    cr_expect_eq(plait_float_to_e5m2(0x1p-16f), 0x01);
    cr_expect_eq(plait_float_to_e5m2(0x1p-17f), 0x00);
    cr_expect_eq(plait_float_to_e5m2(0x1.8p-17f), 0x01);
    cr_expect_eq(plait_e5m2_to_float(0x7c), INFINITY);
    cr_expect(isnan(plait_e5m2_to_float(0x7d)));
    cr_expect_eq(plait_e5m2_to_float(0x7b), 57344.0f);
}

/* ---------------------------------------------------------------- targeted cases */

static void apply2(int dtype, int op, uint64_t nranks, unsigned flags, const void *a, const void *b, void *dst,
                   size_t n)
{
    struct plait_red r;
    double scalar = 0;
    cr_assert_eq(plait_red_init(&r, dtype, op, &scalar, nranks), PLAIT_SUCCESS);
    plait_reduce_apply(&r, dst, a, b, n, flags);
}

Test(reduce, int_wraps)
{
    int8_t a8[] = {127, -128, -128, 100};
    int8_t b8[] = {1, -1, -1, 100};
    int8_t d8[4];
    apply2(PLAIT_INT8, PLAIT_SUM, 1, 0, a8, b8, d8, 4);
    cr_expect_eq(d8[0], -128);
    cr_expect_eq(d8[1], 127);
    cr_expect_eq(d8[3], -56);
    apply2(PLAIT_INT8, PLAIT_PROD, 1, 0, a8, b8, d8, 4);
    cr_expect_eq(d8[1], -128); /* -128 * -1 */
    cr_expect_eq(d8[3], 16);   /* 10000 mod 256 */

    uint8_t ua[] = {255, 16};
    uint8_t ub[] = {1, 16};
    uint8_t ud[2];
    apply2(PLAIT_UINT8, PLAIT_SUM, 1, 0, ua, ub, ud, 2);
    cr_expect_eq(ud[0], 0);
    apply2(PLAIT_UINT8, PLAIT_PROD, 1, 0, ua, ub, ud, 2);
    cr_expect_eq(ud[0], 255);
    cr_expect_eq(ud[1], 0);

    int32_t a32[] = {65536, INT32_MAX, 0x10001};
    int32_t b32[] = {65536, 1, 0x10001};
    int32_t d32[3];
    apply2(PLAIT_INT32, PLAIT_PROD, 1, 0, a32, b32, d32, 3);
    cr_expect_eq(d32[0], 0);
    cr_expect_eq(d32[2], 0x20001);
    apply2(PLAIT_INT32, PLAIT_SUM, 1, 0, a32, b32, d32, 3);
    cr_expect_eq(d32[1], INT32_MIN);

    int64_t a64[] = {INT64_MAX, INT64_MIN, INT64_MIN};
    int64_t b64[] = {1, -1, INT64_MIN};
    int64_t d64[3];
    apply2(PLAIT_INT64, PLAIT_SUM, 1, 0, a64, b64, d64, 3);
    cr_expect_eq(d64[0], INT64_MIN);
    cr_expect_eq(d64[1], INT64_MAX);
    cr_expect_eq(d64[2], 0);
    apply2(PLAIT_INT64, PLAIT_PROD, 1, 0, a64, b64, d64, 3);
    cr_expect_eq(d64[0], INT64_MAX);
    cr_expect_eq(d64[1], INT64_MIN);
    cr_expect_eq(d64[2], 0);

    uint64_t u64a[] = {UINT64_MAX}, u64b[] = {1}, u64d[1];
    apply2(PLAIT_UINT64, PLAIT_SUM, 1, 0, u64a, u64b, u64d, 1);
    cr_expect_eq(u64d[0], 0);
}

Test(reduce, int_max_min_signedness)
{
    int8_t a[] = {-1, 5};
    int8_t b[] = {1, -128};
    int8_t d[2];
    apply2(PLAIT_INT8, PLAIT_MAX, 1, 0, a, b, d, 2);
    cr_expect_eq(d[0], 1);
    cr_expect_eq(d[1], 5);
    apply2(PLAIT_UINT8, PLAIT_MAX, 1, 0, a, b, d, 2);
    cr_expect_eq((uint8_t)d[0], 255);
    cr_expect_eq((uint8_t)d[1], 128);
    uint64_t ua[] = {1ull << 63}, ub[] = {1}, ud[1];
    apply2(PLAIT_UINT64, PLAIT_MIN, 1, 0, ua, ub, ud, 1);
    cr_expect_eq(ud[0], 1);
    apply2(PLAIT_INT64, PLAIT_MIN, 1, 0, ua, ub, ud, 1);
    cr_expect_eq(ud[0], 1ull << 63);
}

/* NCCL's integer avg: wrapped sum, then divide by nranks truncating toward zero. */
Test(reduce, int_avg_truncates_toward_zero)
{
    int32_t a[] = {-7, 7, -1, INT32_MIN};
    int32_t b[] = {0, 0, 0, 0};
    int32_t d[4];
    apply2(PLAIT_INT32, PLAIT_AVG, 2, PLAIT_RED_POST, a, b, d, 4);
    cr_expect_eq(d[0], -3);
    cr_expect_eq(d[1], 3);
    cr_expect_eq(d[2], 0);
    cr_expect_eq(d[3], INT32_MIN / 2);
    /* Without POST it is a plain sum; PRE does nothing for integers. */
    apply2(PLAIT_INT32, PLAIT_AVG, 2, PLAIT_RED_PRE, a, b, d, 4);
    cr_expect_eq(d[0], -7);

    int8_t a8[] = {-100, -128, 127};
    int8_t b8[] = {-27, -1, 1};
    int8_t d8[3];
    apply2(PLAIT_INT8, PLAIT_AVG, 2, PLAIT_RED_PRE | PLAIT_RED_POST, a8, b8, d8, 3);
    cr_expect_eq(d8[0], -63);
    cr_expect_eq(d8[1], 63);  /* -129 wraps to 127 */
    cr_expect_eq(d8[2], -64); /* 128 wraps to -128 */

    int64_t a64[] = {INT64_MIN, -5};
    int64_t d64[2];
    apply2(PLAIT_INT64, PLAIT_AVG, 3, PLAIT_RED_POST, a64, NULL, d64, 2);
    cr_expect_eq(d64[0], INT64_MIN / 3);
    cr_expect_eq(d64[1], -1);
    uint64_t u64[] = {UINT64_MAX}, ud[1];
    apply2(PLAIT_UINT64, PLAIT_AVG, 2, PLAIT_RED_POST, u64, NULL, ud, 1);
    cr_expect_eq(ud[0], UINT64_MAX / 2);
}

Test(reduce, float_avg_and_premulsum_scale_first)
{
    float a[] = {3.0f, 1.0f};
    float b[] = {1.0f, 0.0f};
    float d[2];
    apply2(PLAIT_FLOAT32, PLAIT_AVG, 3, PLAIT_RED_PRE, a, b, d, 2);
    cr_expect_eq(d[0], 3.0f * (1.0f / 3.0f) + 1.0f);
    cr_expect_eq(d[1], 1.0f / 3.0f);
    apply2(PLAIT_FLOAT32, PLAIT_AVG, 3, PLAIT_RED_POST, a, b, d, 2);
    cr_expect_eq(d[0], 4.0f); /* POST is nothing for float avg */

    struct plait_red r;
    uint16_t s = plait_float_to_half(0.5f);
    uint16_t ha[] = {plait_float_to_half(3.0f)}, hb[] = {plait_float_to_half(1.0f)}, hd[1];
    cr_assert_eq(plait_red_init(&r, PLAIT_FLOAT16, PLAIT_RED_PREMULSUM, &s, 4), PLAIT_SUCCESS);
    plait_reduce_apply(&r, hd, ha, hb, 1, PLAIT_RED_PRE);
    cr_expect_eq(hd[0], plait_float_to_half(2.5f));
    plait_reduce_apply(&r, hd, ha, hb, 1, 0);
    cr_expect_eq(hd[0], plait_float_to_half(4.0f));

    /* avg's 1/n is the storage type's value: 1/3 in fp16 is 0x3555. */
    cr_assert_eq(plait_red_init(&r, PLAIT_FLOAT16, PLAIT_AVG, NULL, 3), PLAIT_SUCCESS);
    cr_expect_eq((float)r.scalar_f, plait_half_to_float(0x3555));
}

/* fmaxf/fminf semantics: NaN ignored, two NaNs give the canonical NaN, -0 < +0. */
Test(reduce, float_max_min_nan_and_zero)
{
    float a[] = {NAN, 1.0f, NAN, -0.0f, 0.0f, -INFINITY};
    float b[] = {1.0f, NAN, -NAN, 0.0f, -0.0f, NAN};
    float d[6];
    apply2(PLAIT_FLOAT32, PLAIT_MAX, 1, 0, a, b, d, 6);
    cr_expect_eq(d[0], 1.0f);
    cr_expect_eq(d[1], 1.0f);
    cr_expect_eq(f32_bits(d[2]), 0x7fffffffu);
    cr_expect_eq(f32_bits(d[3]), 0x00000000u);
    cr_expect_eq(f32_bits(d[4]), 0x00000000u);
    cr_expect_eq(d[5], -INFINITY);
    apply2(PLAIT_FLOAT32, PLAIT_MIN, 1, 0, a, b, d, 6);
    cr_expect_eq(d[0], 1.0f);
    cr_expect_eq(f32_bits(d[2]), 0x7fffffffu);
    cr_expect_eq(f32_bits(d[3]), 0x80000000u);
    cr_expect_eq(f32_bits(d[4]), 0x80000000u);

    double da[] = {NAN, -0.0}, db[] = {NAN, 0.0}, dd[2];
    apply2(PLAIT_FLOAT64, PLAIT_MIN, 1, 0, da, db, dd, 2);
    cr_expect_eq(f64_bits(dd[0]), 0x7fffffffffffffffull);
    cr_expect_eq(f64_bits(dd[1]), 0x8000000000000000ull);

    uint16_t ha[] = {0x7e00, 0xfe01, 0x3c00}, hb[] = {0xfc01, 0x3c00, 0x7c01}, hd[3];
    apply2(PLAIT_FLOAT16, PLAIT_MAX, 1, 0, ha, hb, hd, 3);
    cr_expect_eq(hd[0], 0x7fff);
    cr_expect_eq(hd[1], 0x3c00);
    cr_expect_eq(hd[2], 0x3c00);
    uint8_t ea[] = {0xff}, eb[] = {0x7f}, ed[1];
    apply2(PLAIT_FLOAT8_E4M3, PLAIT_MIN, 1, 0, ea, eb, ed, 1);
    cr_expect_eq(ed[0], 0x7f);
}

Test(reduce, float_narrow_sums_round_and_saturate)
{
    uint8_t e4a[] = {0x7e, 0xfe}, e4b[] = {0x7e, 0xfe}, e4d[2];
    apply2(PLAIT_FLOAT8_E4M3, PLAIT_SUM, 1, 0, e4a, e4b, e4d, 2);
    cr_expect_eq(e4d[0], 0x7e);
    cr_expect_eq(e4d[1], 0xfe);
    uint8_t e5a[] = {0x7b}, e5b[] = {0x7b}, e5d[1];
    apply2(PLAIT_FLOAT8_E5M2, PLAIT_SUM, 1, 0, e5a, e5b, e5d, 1);
    cr_expect_eq(e5d[0], 0x7b);
    uint16_t ha[] = {0x7bff, 0x3c00}, hb[] = {0x7bff, 0x1000}, hd[2];
    apply2(PLAIT_FLOAT16, PLAIT_SUM, 1, 0, ha, hb, hd, 2);
    cr_expect_eq(hd[0], 0x7c00);
    cr_expect_eq(hd[1], 0x3c00); /* 1 + 2^-11: a tie, stays at 1 */
    uint16_t ba[] = {0x3f80}, bb[] = {0x3b80}, bd[1];
    apply2(PLAIT_BFLOAT16, PLAIT_SUM, 1, 0, ba, bb, bd, 1);
    cr_expect_eq(bd[0], 0x3f80); /* 1 + 2^-8: a tie, stays at 1 */
}

/* One scaling rounding and one sum rounding, never a fused multiply-add. */
Test(reduce, float_premulsum_is_not_fused)
{
    float s = 1.0f + 0x1p-12f;
    float a[64], b[64], d[64];
    for (int i = 0; i < 64; i++) {
        a[i] = 1.0f + (float)i * 0x1p-13f;
        b[i] = -1.0f;
    }
    struct plait_red r;
    cr_assert_eq(plait_red_init(&r, PLAIT_FLOAT32, PLAIT_RED_PREMULSUM, &s, 2), PLAIT_SUCCESS);
    plait_reduce_apply(&r, d, a, b, 64, PLAIT_RED_PRE);
    for (int i = 0; i < 64; i++) {
        volatile float t = a[i] * s;
        cr_expect_eq(d[i], t + b[i], "element %d: got %a want %a", i, (double)d[i], (double)(t + b[i]));
    }
}

Test(reduce, apply_n_zero_writes_nothing)
{
    struct plait_red r;
    cr_assert_eq(plait_red_init(&r, PLAIT_FLOAT32, PLAIT_SUM, NULL, 2), PLAIT_SUCCESS);
    float d = 42.0f, a = 1.0f, b = 2.0f;
    plait_reduce_apply(&r, &d, &a, &b, 0, PLAIT_RED_PRE | PLAIT_RED_POST);
    cr_expect_eq(d, 42.0f);
}

/* ---------------------------------------------------------------- init, names */

Test(reduce, init_rejects_bad_arguments)
{
    struct plait_red r;
    memset(&r, 0x11, sizeof r);
    struct plait_red before = r;
    float one = 1.0f;
    cr_expect_eq(plait_red_init(&r, -1, PLAIT_SUM, NULL, 1), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(plait_last_error_get(), "-1") != NULL, "message: %s", plait_last_error_get());
    cr_expect_eq(plait_red_init(&r, PLAIT_NUM_TYPES, PLAIT_SUM, NULL, 1), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(plait_last_error_get(), "12") != NULL, "message: %s", plait_last_error_get());
    cr_expect_eq(plait_red_init(&r, PLAIT_FLOAT32, -1, NULL, 1), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_red_init(&r, PLAIT_FLOAT32, PLAIT_RED_NUM_OPS, &one, 1), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(plait_last_error_get(), "6") != NULL, "message: %s", plait_last_error_get());
    cr_expect_eq(plait_red_init(&r, PLAIT_FLOAT32, PLAIT_AVG, NULL, 0), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_red_init(&r, PLAIT_FLOAT32, PLAIT_RED_PREMULSUM, NULL, 1), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_red_init(NULL, PLAIT_FLOAT32, PLAIT_SUM, NULL, 1), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect(memcmp(&r, &before, sizeof r) == 0, "r written on failure");
}

Test(reduce, init_scalars)
{
    struct plait_red r;
    int8_t s8 = -2;
    cr_assert_eq(plait_red_init(&r, PLAIT_INT8, PLAIT_RED_PREMULSUM, &s8, 4), PLAIT_SUCCESS);
    cr_expect_eq((uint8_t)r.scalar_i, 0xfe);
    uint16_t sb = plait_float_to_bf16(-1.5f);
    cr_assert_eq(plait_red_init(&r, PLAIT_BFLOAT16, PLAIT_RED_PREMULSUM, &sb, 4), PLAIT_SUCCESS);
    cr_expect_eq(r.scalar_f, -1.5);
    cr_assert_eq(plait_red_init(&r, PLAIT_FLOAT64, PLAIT_AVG, NULL, 3), PLAIT_SUCCESS);
    cr_expect_eq(r.scalar_f, 1.0 / 3.0);
    cr_assert_eq(plait_red_init(&r, PLAIT_FLOAT32, PLAIT_AVG, NULL, 3), PLAIT_SUCCESS);
    cr_expect_eq(r.scalar_f, (double)(1.0f / 3.0f));
    /* An unaligned scalar. */
    unsigned char buf[9];
    double v = 2.25;
    memcpy(buf + 1, &v, 8);
    cr_assert_eq(plait_red_init(&r, PLAIT_FLOAT64, PLAIT_RED_PREMULSUM, buf + 1, 4), PLAIT_SUCCESS);
    cr_expect_eq(r.scalar_f, 2.25);
}

Test(reduce, names_and_sizes)
{
    static const char *const names[] = {"int8",    "uint8",   "int32",   "uint32",   "int64",       "uint64",
                                        "float16", "float32", "float64", "bfloat16", "float8_e4m3", "float8_e5m2"};
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    for (int t = 0; t < PLAIT_NUM_TYPES; t++) {
        cr_expect_str_eq(plait_dtype_name(t), names[t]);
        cr_expect_eq(plait_dtype_size(t), sizes[t]);
    }
    cr_expect_str_eq(plait_dtype_name(-1), "invalid");
    cr_expect_str_eq(plait_dtype_name(PLAIT_NUM_TYPES), "invalid");
    cr_expect_eq(plait_dtype_size(PLAIT_NUM_TYPES), 0);
    cr_expect_eq(plait_dtype_size(-1), 0);
    static const char *const ops[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
    for (int op = 0; op < PLAIT_RED_NUM_OPS; op++)
        cr_expect_str_eq(plait_op_name(op), ops[op]);
    cr_expect_str_eq(plait_op_name(PLAIT_RED_NUM_OPS), "invalid");
    cr_expect_str_eq(plait_op_name(-1), "invalid");
}
