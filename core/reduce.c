/* Element-wise reductions and copies for the 12 data types and 6 ops.
 *
 * plait_reduce_apply() is the inner loop of every reduction the CPU executor
 * runs, so it looks at (dtype, op, flags) once per call, picks one of a handful
 * of "kernels" (sum, prod, max, min, scale-then-sum, scale, copy) and runs one
 * loop specialised for that (type, kernel) pair. The loops are written once per
 * type as always_inline bodies that take the kernel as a compile-time constant;
 * the per-type functions that call them are compiled three times (x86-64-v4:
 * AVX-512 with BW/VL; x86-64-v3: AVX2; and the baseline) by target_clones and
 * chosen once, at load time, through an ifunc. A call costs one switch and one
 * indirect call, never a per-element branch.
 *
 * bf16 and fp8 are widened to fp32 in registers, combined in fp32 and narrowed
 * again with round-to-nearest-even inside the same loop. The conversions are
 * branch-free integer code (plus one fp32 add or int-to-float conversion for
 * subnormals) so that gcc vectorises them, and so that their result does not
 * depend on MXCSR's flush-to-zero/denormals-are-zero bits: a process that set
 * FTZ/DAZ for its own fp32 math still gets exact fp16 and fp8 subnormals (bf16
 * subnormals are fp32 subnormals, so bf16 sums are subject to FTZ like fp32's).
 * fp16 does the same, except that on CPUs with AVX2 and F16C the sums, products
 * and scaling use vcvtph2ps/vcvtps2ph, which give the same bits. Max and min of
 * narrow types never convert: they compare the encodings.
 *
 * NaN conventions (chosen to match what CUDA produces, so that the CPU and GPU
 * executors agree bit for bit):
 *  - narrowing to fp16 or bf16 turns every NaN into the canonical 0x7fff, to
 *    e4m3 or e5m2 into 0x7f (CUDA's __nv_cvt_float_to_fp8 canonicalises the
 *    fp32 NaN first, so the sign is dropped);
 *  - e4m3 has no infinity and e5m2 is narrowed with __NV_SATFINITE semantics:
 *    finite values beyond the largest finite and +-inf saturate to +-448
 *    (0x7e/0xfe) and +-57344 (0x7b/0xfb);
 *  - max/min follow fmaxf/fminf as the GPU's max.f32/min.f32 implement them: a
 *    NaN operand is ignored and the other operand returned; when both are NaN
 *    the result is the canonical NaN (0x7fffffff, 0x7fffffffffffffff, and for
 *    narrow types 0x7fff or 0x7f); -0 orders below +0, so max(-0, +0) = +0 and
 *    min(-0, +0) = -0 whatever the operand order. A narrow result is narrowed
 *    like any other, so max(inf, x) in e5m2 is 57344;
 *  - for fp32 and fp64 sum, prod and scaling the payload of a NaN result is
 *    whatever the CPU produces (it stays a NaN); only its NaN-ness is specified;
 *  - a copy (b == NULL without the pre-op) copies the bits, NaN payloads
 *    included.
 *
 * fp32 and fp64 arithmetic itself assumes the default floating-point
 * environment (round to nearest, no FTZ/DAZ), as the GPU does by default. */
#include "core/reduce.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define PLAIT_HAVE_X86 1
#if !defined(PLAIT_NO_F16C)
#define PLAIT_HAVE_F16C 1 /* compiled in, used when the CPU has it; -DPLAIT_NO_F16C leaves it out */
#endif
#endif

#include "base/log.h"

/* Each binary step is rounded to its type before the next one (docs/architecture.md, section 13), so
 * "a * s + b" must stay two roundings. GNU C contracts it into an FMA by default
 * (-ffp-contract=fast), which the x86-64-v3/v4 clones would then emit; turn that
 * off for this file whatever the build flags are. no-trapping-math lets the
 * vectoriser compute both sides of the conversions' selects (it refuses to
 * if-convert an fp32 add that might raise a flag otherwise); nothing here reads
 * the floating-point exception flags. The pragmas come after the includes so that
 * they do not change how the headers' inline functions are compiled. */
#if defined(__FAST_MATH__)
#error "reduce.c must not be built with -ffast-math: NaN, signed zero and rounding are part of its contract"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

/* The per-type loops are compiled for x86-64-v4, x86-64-v3 and the baseline ISA,
 * and the best one is picked once, at load time (an ifunc). Building with
 * -DPLAIT_NO_CLONES keeps one copy, compiled for whatever -march says (and is
 * how the tests exercise each level on one machine). */
#if defined(PLAIT_HAVE_X86) && defined(__GNUC__) && !defined(PLAIT_NO_CLONES)
#define PLAIT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PLAIT_CLONES
#endif

#define PLAIT_INLINE __attribute__((always_inline))

/* Element types for loads and stores at any address. The buffers come from the
 * user (any alignment, any declared type: __half, _Float16, int32_t, ...), so the
 * accesses are neither aligned nor type-based-alias safe without these. */
typedef uint16_t unaligned_u16 __attribute__((aligned(1), may_alias));
typedef uint32_t unaligned_u32 __attribute__((aligned(1), may_alias));
typedef uint64_t unaligned_u64 __attribute__((aligned(1), may_alias));
typedef float unaligned_f32 __attribute__((aligned(1), may_alias));
typedef double unaligned_f64 __attribute__((aligned(1), may_alias));

/* What one call does to each element; chosen once per call. */
enum red_kernel {
    KERN_SUM,       /* a + b */
    KERN_PROD,      /* a * b */
    KERN_MAX,       /* max(a, b) */
    KERN_MIN,       /* min(a, b) */
    KERN_SCALE_SUM, /* round(a * s) + b: the pre-op on this rank's input, then sum */
    KERN_SCALE,     /* round(a * s): b == NULL with the pre-op */
    KERN_COPY       /* a: b == NULL without a pre-op */
};

/* ---------------------------------------------------------------- bit casts */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---------------------------------------------------------------- conversions
 *
 * Written without data-dependent branches (each path is computed and one is
 * selected) so that the loops below vectorise. */

/* fp16 (binary16) to fp32, exact. Subnormals are converted as integer * 2^-24
 * (exact in fp32 and a normal fp32 result, so FTZ/DAZ cannot touch them). NaN
 * keeps its payload and is made quiet, as vcvtph2ps does. */
static inline PLAIT_INLINE float half_to_f32(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t normal = sign | ((e + 112u) << 23) | (m << 13);
    uint32_t special = sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x00400000u : 0u);
    uint32_t subnormal = sign | f32_bits((float)(int32_t)m * 0x1p-24f);
    uint32_t r = e == 0 ? subnormal : normal;
    return f32_from_bits(e == 0x1fu ? special : r);
}

/* fp32 to a narrow binary format with `man_bits` mantissa bits and exponent bias
 * `bias`, round to nearest-even. Magnitudes whose rounded encoding exceeds
 * `max_mag` become `max_mag` (fp16: the infinity 0x7c00, which is exactly where
 * RNE overflows; fp8: the largest finite, i.e. saturation). Any NaN becomes
 * `nan_bits`. `sign_shift` moves the fp32 sign bit down to the format's.
 *
 * Normal results: add just under half an ulp of the target (plus one when the
 * kept mantissa is odd, which makes exact ties round to even) to the fp32
 * encoding, rebias the exponent and shift; a carry out of the mantissa bumps the
 * exponent, as it should. Subnormal results: add a power of two whose fp32 ulp is
 * the target's subnormal step; the fp32 adder rounds to nearest-even onto that
 * grid and the low bits of the sum are the target encoding (this works under DAZ
 * too: an fp32 subnormal input reads as 0 and rounds to 0 anyway). */
static inline PLAIT_INLINE uint32_t f32_to_narrow(float f, unsigned man_bits, unsigned bias, uint32_t max_mag,
                                                 uint32_t nan_bits, unsigned sign_shift)
{
    const unsigned drop = 23u - man_bits;
    const uint32_t magic = (151u - bias - man_bits) << 23;
    const uint32_t min_normal = (128u - bias) << 23;
    uint32_t u = f32_bits(f);
    uint32_t sign = u & 0x80000000u;
    uint32_t a = u ^ sign;
    uint32_t subnormal = f32_bits(f32_from_bits(a) + f32_from_bits(magic)) - magic;
    uint32_t odd = (a >> drop) & 1u;
    uint32_t normal = (a - ((127u - bias) << 23) + ((1u << (drop - 1)) - 1u) + odd) >> drop;
    uint32_t r = a < min_normal ? subnormal : normal;
    r = r > max_mag ? max_mag : r;
    r |= sign >> sign_shift;
    return a > 0x7f800000u ? nan_bits : r;
}

static inline PLAIT_INLINE uint32_t f32_to_half(float f)
{
    return f32_to_narrow(f, 10, 15, 0x7c00u, 0x7fffu, 16);
}

static inline PLAIT_INLINE float bf16_to_f32(uint32_t h)
{
    return f32_from_bits(h << 16);
}

/* bf16 is the top half of fp32, so RNE is one add on the encoding; a carry into
 * the exponent gives the right result up to and including overflow to inf. */
static inline PLAIT_INLINE uint32_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : r;
}

/* e4m3 (OCP FP8, bias 7, no infinities, NaN = S.1111.111). */
static inline PLAIT_INLINE float e4m3_to_f32(uint32_t v)
{
    uint32_t sign = (v & 0x80u) << 24;
    uint32_t e = (v >> 3) & 0xfu;
    uint32_t m = v & 0x7u;
    uint32_t normal = sign | ((e + 120u) << 23) | (m << 20);
    uint32_t subnormal = sign | f32_bits((float)(int32_t)m * 0x1p-9f);
    uint32_t r = e == 0 ? subnormal : normal;
    return f32_from_bits((v & 0x7fu) == 0x7fu ? 0x7fffffffu : r);
}

static inline PLAIT_INLINE uint32_t f32_to_e4m3(float f)
{
    return f32_to_narrow(f, 3, 7, 0x7eu, 0x7fu, 24);
}

/* e5m2 is the top byte of fp16. */
static inline PLAIT_INLINE float e5m2_to_f32(uint32_t v)
{
    return half_to_f32(v << 8);
}

static inline PLAIT_INLINE uint32_t f32_to_e5m2(float f)
{
    return f32_to_narrow(f, 2, 15, 0x7bu, 0x7fu, 24);
}

float plait_half_to_float(uint16_t h)
{
    return half_to_f32(h);
}

uint16_t plait_float_to_half(float f)
{
    return (uint16_t)f32_to_half(f);
}

float plait_bf16_to_float(uint16_t h)
{
    return bf16_to_f32(h);
}

uint16_t plait_float_to_bf16(float f)
{
    return (uint16_t)f32_to_bf16(f);
}

float plait_e4m3_to_float(uint8_t v)
{
    return e4m3_to_f32(v);
}

uint8_t plait_float_to_e4m3(float f)
{
    return (uint8_t)f32_to_e4m3(f);
}

float plait_e5m2_to_float(uint8_t v)
{
    return e5m2_to_f32(v);
}

uint8_t plait_float_to_e5m2(float f)
{
    return (uint8_t)f32_to_e5m2(f);
}

/* ---------------------------------------------------------------- max/min on encodings
 *
 * Comparing encodings rather than values gives fmaxf's NaN rule and a total order
 * on zeros in a form gcc vectorises: flipping the magnitude bits of negative
 * numbers turns the IEEE encoding into a two's-complement integer in value order
 * (-0 just below +0). */

static inline PLAIT_INLINE uint32_t f32_order_key(uint32_t u)
{
    return u ^ ((uint32_t)((int32_t)u >> 31) >> 1);
}

static inline PLAIT_INLINE uint32_t f32_maxmin_bits(bool is_max, uint32_t x, uint32_t y)
{
    bool x_nan = (x & 0x7fffffffu) > 0x7f800000u;
    bool y_nan = (y & 0x7fffffffu) > 0x7f800000u;
    int32_t kx = (int32_t)f32_order_key(x);
    int32_t ky = (int32_t)f32_order_key(y);
    uint32_t r = (is_max ? kx > ky : kx < ky) ? x : y;
    r = y_nan ? x : r;
    r = x_nan ? y : r;
    return x_nan && y_nan ? 0x7fffffffu : r;
}

static inline PLAIT_INLINE uint64_t f64_order_key(uint64_t u)
{
    return u ^ ((uint64_t)((int64_t)u >> 63) >> 1);
}

static inline PLAIT_INLINE uint64_t f64_maxmin_bits(bool is_max, uint64_t x, uint64_t y)
{
    bool x_nan = (x & 0x7fffffffffffffffu) > 0x7ff0000000000000u;
    bool y_nan = (y & 0x7fffffffffffffffu) > 0x7ff0000000000000u;
    int64_t kx = (int64_t)f64_order_key(x);
    int64_t ky = (int64_t)f64_order_key(y);
    uint64_t r = (is_max ? kx > ky : kx < ky) ? x : y;
    r = y_nan ? x : r;
    r = x_nan ? y : r;
    return x_nan && y_nan ? 0x7fffffffffffffffu : r;
}

/* ---------------------------------------------------------------- integer loops
 *
 * Integers are combined as unsigned values of their width, so sums and products
 * wrap (two's complement) and never overflow a signed type; only max/min look at
 * the sign. The same loop serves the signed and unsigned type of a width. The
 * 8-bit arithmetic happens in int after promotion, where 255 * 255 still fits. */

static inline PLAIT_INLINE uint8_t u8_combine(enum red_kernel k, bool is_signed, uint8_t x, uint8_t y)
{
    switch (k) {
    case KERN_PROD:
        return (uint8_t)(x * y);
    case KERN_MAX:
        return (is_signed ? (int8_t)x > (int8_t)y : x > y) ? x : y;
    case KERN_MIN:
        return (is_signed ? (int8_t)x < (int8_t)y : x < y) ? x : y;
    default:
        return (uint8_t)(x + y);
    }
}

static inline PLAIT_INLINE void u8_loop(enum red_kernel k, bool is_signed, void *dst, const void *a, const void *b,
                                        size_t n, uint8_t s)
{
    uint8_t *d = dst;
    const uint8_t *x = a;
    const uint8_t *y = b;
    for (size_t i = 0; i < n; i++) {
        uint8_t v = x[i];
        if (k == KERN_SCALE || k == KERN_SCALE_SUM)
            v = (uint8_t)(v * s);
        if (k != KERN_SCALE)
            v = u8_combine(k, is_signed, v, y[i]);
        d[i] = v;
    }
}

static inline PLAIT_INLINE uint32_t u32_combine(enum red_kernel k, bool is_signed, uint32_t x, uint32_t y)
{
    switch (k) {
    case KERN_PROD:
        return x * y;
    case KERN_MAX:
        return (is_signed ? (int32_t)x > (int32_t)y : x > y) ? x : y;
    case KERN_MIN:
        return (is_signed ? (int32_t)x < (int32_t)y : x < y) ? x : y;
    default:
        return x + y;
    }
}

static inline PLAIT_INLINE void u32_loop(enum red_kernel k, bool is_signed, void *dst, const void *a, const void *b,
                                         size_t n, uint32_t s)
{
    unaligned_u32 *d = dst;
    const unaligned_u32 *x = a;
    const unaligned_u32 *y = b;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = x[i];
        if (k == KERN_SCALE || k == KERN_SCALE_SUM)
            v *= s;
        if (k != KERN_SCALE)
            v = u32_combine(k, is_signed, v, y[i]);
        d[i] = v;
    }
}

static inline PLAIT_INLINE uint64_t u64_combine(enum red_kernel k, bool is_signed, uint64_t x, uint64_t y)
{
    switch (k) {
    case KERN_PROD:
        return x * y;
    case KERN_MAX:
        return (is_signed ? (int64_t)x > (int64_t)y : x > y) ? x : y;
    case KERN_MIN:
        return (is_signed ? (int64_t)x < (int64_t)y : x < y) ? x : y;
    default:
        return x + y;
    }
}

static inline PLAIT_INLINE void u64_loop(enum red_kernel k, bool is_signed, void *dst, const void *a, const void *b,
                                         size_t n, uint64_t s)
{
    unaligned_u64 *d = dst;
    const unaligned_u64 *x = a;
    const unaligned_u64 *y = b;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = x[i];
        if (k == KERN_SCALE || k == KERN_SCALE_SUM)
            v *= s;
        if (k != KERN_SCALE)
            v = u64_combine(k, is_signed, v, y[i]);
        d[i] = v;
    }
}

/* The switches below turn the run-time kernel into a compile-time constant for
 * each inlined loop; max/min get a signed and an unsigned instance. */

PLAIT_CLONES static void red_int8(enum red_kernel k, bool is_signed, void *dst, const void *a, const void *b, size_t n,
                                  uint8_t s)
{
    switch (k) {
    case KERN_SUM:
        u8_loop(KERN_SUM, false, dst, a, b, n, s);
        break;
    case KERN_PROD:
        u8_loop(KERN_PROD, false, dst, a, b, n, s);
        break;
    case KERN_MAX:
        if (is_signed)
            u8_loop(KERN_MAX, true, dst, a, b, n, s);
        else
            u8_loop(KERN_MAX, false, dst, a, b, n, s);
        break;
    case KERN_MIN:
        if (is_signed)
            u8_loop(KERN_MIN, true, dst, a, b, n, s);
        else
            u8_loop(KERN_MIN, false, dst, a, b, n, s);
        break;
    case KERN_SCALE_SUM:
        u8_loop(KERN_SCALE_SUM, false, dst, a, b, n, s);
        break;
    case KERN_SCALE:
        u8_loop(KERN_SCALE, false, dst, a, b, n, s);
        break;
    case KERN_COPY:
        break;
    }
}

PLAIT_CLONES static void red_int32(enum red_kernel k, bool is_signed, void *dst, const void *a, const void *b,
                                   size_t n, uint32_t s)
{
    switch (k) {
    case KERN_SUM:
        u32_loop(KERN_SUM, false, dst, a, b, n, s);
        break;
    case KERN_PROD:
        u32_loop(KERN_PROD, false, dst, a, b, n, s);
        break;
    case KERN_MAX:
        if (is_signed)
            u32_loop(KERN_MAX, true, dst, a, b, n, s);
        else
            u32_loop(KERN_MAX, false, dst, a, b, n, s);
        break;
    case KERN_MIN:
        if (is_signed)
            u32_loop(KERN_MIN, true, dst, a, b, n, s);
        else
            u32_loop(KERN_MIN, false, dst, a, b, n, s);
        break;
    case KERN_SCALE_SUM:
        u32_loop(KERN_SCALE_SUM, false, dst, a, b, n, s);
        break;
    case KERN_SCALE:
        u32_loop(KERN_SCALE, false, dst, a, b, n, s);
        break;
    case KERN_COPY:
        break;
    }
}

PLAIT_CLONES static void red_int64(enum red_kernel k, bool is_signed, void *dst, const void *a, const void *b,
                                   size_t n, uint64_t s)
{
    switch (k) {
    case KERN_SUM:
        u64_loop(KERN_SUM, false, dst, a, b, n, s);
        break;
    case KERN_PROD:
        u64_loop(KERN_PROD, false, dst, a, b, n, s);
        break;
    case KERN_MAX:
        if (is_signed)
            u64_loop(KERN_MAX, true, dst, a, b, n, s);
        else
            u64_loop(KERN_MAX, false, dst, a, b, n, s);
        break;
    case KERN_MIN:
        if (is_signed)
            u64_loop(KERN_MIN, true, dst, a, b, n, s);
        else
            u64_loop(KERN_MIN, false, dst, a, b, n, s);
        break;
    case KERN_SCALE_SUM:
        u64_loop(KERN_SCALE_SUM, false, dst, a, b, n, s);
        break;
    case KERN_SCALE:
        u64_loop(KERN_SCALE, false, dst, a, b, n, s);
        break;
    case KERN_COPY:
        break;
    }
}

/* Integer avg's post-op: the wrapped sum divided by nranks, truncated toward
 * zero as C division of the signed type truncates (NCCL divides the magnitude and
 * restores the sign the same way). Computed on the magnitude in uint64_t, so
 * INT*_MIN and any divisor are fine. It runs once per element of the final
 * result, on a block the caller just wrote, and stays scalar: x86 has no vector
 * integer division. */
static inline uint64_t div_trunc_signed(int64_t x, uint64_t d)
{
    bool is_neg = x < 0;
    uint64_t mag = is_neg ? 0u - (uint64_t)x : (uint64_t)x;
    uint64_t q = mag / d;
    return is_neg ? 0u - q : q;
}

static void post_divide(int dtype, void *dst, size_t n, uint64_t d)
{
    switch (dtype) {
    case PLAIT_INT8: {
        uint8_t *p = dst;
        for (size_t i = 0; i < n; i++)
            p[i] = (uint8_t)div_trunc_signed((int8_t)p[i], d);
        break;
    }
    case PLAIT_UINT8: {
        uint8_t *p = dst;
        for (size_t i = 0; i < n; i++)
            p[i] = (uint8_t)(p[i] / d);
        break;
    }
    case PLAIT_INT32: {
        unaligned_u32 *p = dst;
        for (size_t i = 0; i < n; i++)
            p[i] = (uint32_t)div_trunc_signed((int32_t)p[i], d);
        break;
    }
    case PLAIT_UINT32: {
        unaligned_u32 *p = dst;
        for (size_t i = 0; i < n; i++)
            p[i] = (uint32_t)(p[i] / d);
        break;
    }
    case PLAIT_INT64: {
        unaligned_u64 *p = dst;
        for (size_t i = 0; i < n; i++)
            p[i] = div_trunc_signed((int64_t)p[i], d);
        break;
    }
    case PLAIT_UINT64: {
        unaligned_u64 *p = dst;
        for (size_t i = 0; i < n; i++)
            p[i] = p[i] / d;
        break;
    }
    default:
        break;
    }
}

/* ---------------------------------------------------------------- fp32, fp64 loops */

static inline PLAIT_INLINE void f32_loop(enum red_kernel k, void *dst, const void *a, const void *b, size_t n, float s)
{
    if (k == KERN_MAX || k == KERN_MIN) {
        unaligned_u32 *d = dst;
        const unaligned_u32 *x = a;
        const unaligned_u32 *y = b;
        for (size_t i = 0; i < n; i++)
            d[i] = f32_maxmin_bits(k == KERN_MAX, x[i], y[i]);
        return;
    }
    unaligned_f32 *d = dst;
    const unaligned_f32 *x = a;
    const unaligned_f32 *y = b;
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        if (k == KERN_SCALE || k == KERN_SCALE_SUM)
            v = v * s;
        if (k == KERN_SUM || k == KERN_SCALE_SUM)
            v = v + y[i];
        else if (k == KERN_PROD)
            v = v * y[i];
        d[i] = v;
    }
}

static inline PLAIT_INLINE void f64_loop(enum red_kernel k, void *dst, const void *a, const void *b, size_t n, double s)
{
    if (k == KERN_MAX || k == KERN_MIN) {
        unaligned_u64 *d = dst;
        const unaligned_u64 *x = a;
        const unaligned_u64 *y = b;
        for (size_t i = 0; i < n; i++)
            d[i] = f64_maxmin_bits(k == KERN_MAX, x[i], y[i]);
        return;
    }
    unaligned_f64 *d = dst;
    const unaligned_f64 *x = a;
    const unaligned_f64 *y = b;
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        if (k == KERN_SCALE || k == KERN_SCALE_SUM)
            v = v * s;
        if (k == KERN_SUM || k == KERN_SCALE_SUM)
            v = v + y[i];
        else if (k == KERN_PROD)
            v = v * y[i];
        d[i] = v;
    }
}

PLAIT_CLONES static void red_f32(enum red_kernel k, void *dst, const void *a, const void *b, size_t n, float s)
{
    switch (k) {
    case KERN_SUM:
        f32_loop(KERN_SUM, dst, a, b, n, s);
        break;
    case KERN_PROD:
        f32_loop(KERN_PROD, dst, a, b, n, s);
        break;
    case KERN_MAX:
        f32_loop(KERN_MAX, dst, a, b, n, s);
        break;
    case KERN_MIN:
        f32_loop(KERN_MIN, dst, a, b, n, s);
        break;
    case KERN_SCALE_SUM:
        f32_loop(KERN_SCALE_SUM, dst, a, b, n, s);
        break;
    case KERN_SCALE:
        f32_loop(KERN_SCALE, dst, a, b, n, s);
        break;
    case KERN_COPY:
        break;
    }
}

PLAIT_CLONES static void red_f64(enum red_kernel k, void *dst, const void *a, const void *b, size_t n, double s)
{
    switch (k) {
    case KERN_SUM:
        f64_loop(KERN_SUM, dst, a, b, n, s);
        break;
    case KERN_PROD:
        f64_loop(KERN_PROD, dst, a, b, n, s);
        break;
    case KERN_MAX:
        f64_loop(KERN_MAX, dst, a, b, n, s);
        break;
    case KERN_MIN:
        f64_loop(KERN_MIN, dst, a, b, n, s);
        break;
    case KERN_SCALE_SUM:
        f64_loop(KERN_SCALE_SUM, dst, a, b, n, s);
        break;
    case KERN_SCALE:
        f64_loop(KERN_SCALE, dst, a, b, n, s);
        break;
    case KERN_COPY:
        break;
    }
}

/* ---------------------------------------------------------------- fp16, bf16, fp8 loops
 *
 * `dtype` is a compile-time constant in every inlined instance, so each helper
 * below reduces to one conversion. */

static inline PLAIT_INLINE float narrow_load(int dtype, const void *p, size_t i)
{
    switch (dtype) {
    case PLAIT_FLOAT16:
        return half_to_f32(((const unaligned_u16 *)p)[i]);
    case PLAIT_BFLOAT16:
        return bf16_to_f32(((const unaligned_u16 *)p)[i]);
    case PLAIT_FLOAT8_E4M3:
        return e4m3_to_f32(((const uint8_t *)p)[i]);
    default:
        return e5m2_to_f32(((const uint8_t *)p)[i]);
    }
}

static inline PLAIT_INLINE uint32_t narrow_from_f32(int dtype, float f)
{
    switch (dtype) {
    case PLAIT_FLOAT16:
        return f32_to_half(f);
    case PLAIT_BFLOAT16:
        return f32_to_bf16(f);
    case PLAIT_FLOAT8_E4M3:
        return f32_to_e4m3(f);
    default:
        return f32_to_e5m2(f);
    }
}

static inline PLAIT_INLINE float narrow_to_f32(int dtype, uint32_t v)
{
    switch (dtype) {
    case PLAIT_FLOAT16:
        return half_to_f32(v);
    case PLAIT_BFLOAT16:
        return bf16_to_f32(v);
    case PLAIT_FLOAT8_E4M3:
        return e4m3_to_f32(v);
    default:
        return e5m2_to_f32(v);
    }
}


static inline PLAIT_INLINE uint32_t narrow_load_bits(int dtype, const void *p, size_t i)
{
    if (dtype == PLAIT_FLOAT16 || dtype == PLAIT_BFLOAT16)
        return ((const unaligned_u16 *)p)[i];
    return ((const uint8_t *)p)[i];
}

static inline PLAIT_INLINE void narrow_store_bits(int dtype, void *p, size_t i, uint32_t v)
{
    if (dtype == PLAIT_FLOAT16 || dtype == PLAIT_BFLOAT16)
        ((unaligned_u16 *)p)[i] = (uint16_t)v;
    else
        ((uint8_t *)p)[i] = (uint8_t)v;
}

/* max/min of two narrow encodings, with the same result as widening both to
 * fp32, taking f32_maxmin_bits() and narrowing back, but without converting:
 * the result is one of the inputs, except that two NaNs give the canonical NaN
 * and e5m2's +-inf narrow (saturate) to +-57344 as every narrowing does. The
 * encodings are sign-magnitude, so mapping negatives to (magnitude mask - |x|)
 * and positives to (sign bit + |x|) orders them as unsigned integers, with
 * -0 just below +0. */
static inline PLAIT_INLINE uint32_t narrow_maxmin_bits(int dtype, bool is_max, uint32_t x, uint32_t y)
{
    const bool is_16 = dtype == PLAIT_FLOAT16 || dtype == PLAIT_BFLOAT16;
    const uint32_t sign = is_16 ? 0x8000u : 0x80u;
    const uint32_t mag = sign - 1u;
    bool x_nan, y_nan;
    switch (dtype) {
    case PLAIT_FLOAT16:
        x_nan = (x & mag) > 0x7c00u;
        y_nan = (y & mag) > 0x7c00u;
        break;
    case PLAIT_BFLOAT16:
        x_nan = (x & mag) > 0x7f80u;
        y_nan = (y & mag) > 0x7f80u;
        break;
    case PLAIT_FLOAT8_E4M3:
        x_nan = (x & mag) == 0x7fu;
        y_nan = (y & mag) == 0x7fu;
        break;
    default:
        x_nan = (x & mag) > 0x7cu;
        y_nan = (y & mag) > 0x7cu;
        break;
    }
    uint32_t kx = (x & sign) ? mag - (x & mag) : x | sign;
    uint32_t ky = (y & sign) ? mag - (y & mag) : y | sign;
    uint32_t r = (is_max ? kx > ky : kx < ky) ? x : y;
    r = y_nan ? x : r;
    r = x_nan ? y : r;
    if (dtype == PLAIT_FLOAT8_E5M2)
        r = (r & mag) == 0x7cu ? (r & sign) | 0x7bu : r;
    return x_nan && y_nan ? (is_16 ? 0x7fffu : 0x7fu) : r;
}

/* One binary step in fp32 on values widened from a narrow type (or fp32 itself);
 * the caller rounds the result to the storage type. */
static inline PLAIT_INLINE float f32_combine(enum red_kernel k, float x, float y)
{
    switch (k) {
    case KERN_PROD:
        return x * y;
    case KERN_MAX:
        return f32_from_bits(f32_maxmin_bits(true, f32_bits(x), f32_bits(y)));
    case KERN_MIN:
        return f32_from_bits(f32_maxmin_bits(false, f32_bits(x), f32_bits(y)));
    default:
        return x + y;
    }
}

static inline PLAIT_INLINE void narrow_loop(int dtype, enum red_kernel k, void *dst, const void *a, const void *b,
                                            size_t n, float s)
{
    if (k == KERN_MAX || k == KERN_MIN) {
        for (size_t i = 0; i < n; i++)
            narrow_store_bits(dtype, dst, i,
                              narrow_maxmin_bits(dtype, k == KERN_MAX, narrow_load_bits(dtype, a, i),
                                                 narrow_load_bits(dtype, b, i)));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float v = narrow_load(dtype, a, i);
        /* The scaled contribution is rounded to the storage type before it is
         * summed, as it is when the GPU computes __hmul then __hadd. */
        if (k == KERN_SCALE || k == KERN_SCALE_SUM)
            v = narrow_to_f32(dtype, narrow_from_f32(dtype, v * s));
        if (k != KERN_SCALE)
            v = f32_combine(k, v, narrow_load(dtype, b, i));
        narrow_store_bits(dtype, dst, i, narrow_from_f32(dtype, v));
    }
}

PLAIT_CLONES static void red_narrow(int dtype, enum red_kernel k, void *dst, const void *a, const void *b, size_t n,
                                    float s)
{
    switch (dtype) {
    case PLAIT_FLOAT16:
        switch (k) {
        case KERN_SUM:
            narrow_loop(PLAIT_FLOAT16, KERN_SUM, dst, a, b, n, s);
            break;
        case KERN_PROD:
            narrow_loop(PLAIT_FLOAT16, KERN_PROD, dst, a, b, n, s);
            break;
        case KERN_MAX:
            narrow_loop(PLAIT_FLOAT16, KERN_MAX, dst, a, b, n, s);
            break;
        case KERN_MIN:
            narrow_loop(PLAIT_FLOAT16, KERN_MIN, dst, a, b, n, s);
            break;
        case KERN_SCALE_SUM:
            narrow_loop(PLAIT_FLOAT16, KERN_SCALE_SUM, dst, a, b, n, s);
            break;
        case KERN_SCALE:
            narrow_loop(PLAIT_FLOAT16, KERN_SCALE, dst, a, b, n, s);
            break;
        case KERN_COPY:
            break;
        }
        break;
    case PLAIT_BFLOAT16:
        switch (k) {
        case KERN_SUM:
            narrow_loop(PLAIT_BFLOAT16, KERN_SUM, dst, a, b, n, s);
            break;
        case KERN_PROD:
            narrow_loop(PLAIT_BFLOAT16, KERN_PROD, dst, a, b, n, s);
            break;
        case KERN_MAX:
            narrow_loop(PLAIT_BFLOAT16, KERN_MAX, dst, a, b, n, s);
            break;
        case KERN_MIN:
            narrow_loop(PLAIT_BFLOAT16, KERN_MIN, dst, a, b, n, s);
            break;
        case KERN_SCALE_SUM:
            narrow_loop(PLAIT_BFLOAT16, KERN_SCALE_SUM, dst, a, b, n, s);
            break;
        case KERN_SCALE:
            narrow_loop(PLAIT_BFLOAT16, KERN_SCALE, dst, a, b, n, s);
            break;
        case KERN_COPY:
            break;
        }
        break;
    case PLAIT_FLOAT8_E4M3:
        switch (k) {
        case KERN_SUM:
            narrow_loop(PLAIT_FLOAT8_E4M3, KERN_SUM, dst, a, b, n, s);
            break;
        case KERN_PROD:
            narrow_loop(PLAIT_FLOAT8_E4M3, KERN_PROD, dst, a, b, n, s);
            break;
        case KERN_MAX:
            narrow_loop(PLAIT_FLOAT8_E4M3, KERN_MAX, dst, a, b, n, s);
            break;
        case KERN_MIN:
            narrow_loop(PLAIT_FLOAT8_E4M3, KERN_MIN, dst, a, b, n, s);
            break;
        case KERN_SCALE_SUM:
            narrow_loop(PLAIT_FLOAT8_E4M3, KERN_SCALE_SUM, dst, a, b, n, s);
            break;
        case KERN_SCALE:
            narrow_loop(PLAIT_FLOAT8_E4M3, KERN_SCALE, dst, a, b, n, s);
            break;
        case KERN_COPY:
            break;
        }
        break;
    case PLAIT_FLOAT8_E5M2:
        switch (k) {
        case KERN_SUM:
            narrow_loop(PLAIT_FLOAT8_E5M2, KERN_SUM, dst, a, b, n, s);
            break;
        case KERN_PROD:
            narrow_loop(PLAIT_FLOAT8_E5M2, KERN_PROD, dst, a, b, n, s);
            break;
        case KERN_MAX:
            narrow_loop(PLAIT_FLOAT8_E5M2, KERN_MAX, dst, a, b, n, s);
            break;
        case KERN_MIN:
            narrow_loop(PLAIT_FLOAT8_E5M2, KERN_MIN, dst, a, b, n, s);
            break;
        case KERN_SCALE_SUM:
            narrow_loop(PLAIT_FLOAT8_E5M2, KERN_SCALE_SUM, dst, a, b, n, s);
            break;
        case KERN_SCALE:
            narrow_loop(PLAIT_FLOAT8_E5M2, KERN_SCALE, dst, a, b, n, s);
            break;
        case KERN_COPY:
            break;
        }
        break;
    default:
        break;
    }
}

/* ---------------------------------------------------------------- dispatch */

static const struct {
    const char *name;
    size_t size;
    bool is_integer;
    bool is_signed; /* integers only: how max/min compare */
} dtype_table[PLAIT_NUM_TYPES] = {
    [PLAIT_INT8] = {"int8", 1, true, true},
    [PLAIT_UINT8] = {"uint8", 1, true, false},
    [PLAIT_INT32] = {"int32", 4, true, true},
    [PLAIT_UINT32] = {"uint32", 4, true, false},
    [PLAIT_INT64] = {"int64", 8, true, true},
    [PLAIT_UINT64] = {"uint64", 8, true, false},
    [PLAIT_FLOAT16] = {"float16", 2, false, false},
    [PLAIT_FLOAT32] = {"float32", 4, false, false},
    [PLAIT_FLOAT64] = {"float64", 8, false, false},
    [PLAIT_BFLOAT16] = {"bfloat16", 2, false, false},
    [PLAIT_FLOAT8_E4M3] = {"float8_e4m3", 1, false, false},
    [PLAIT_FLOAT8_E5M2] = {"float8_e5m2", 1, false, false},
};

static const char *const op_names[PLAIT_RED_NUM_OPS] = {
    [PLAIT_SUM] = "sum", [PLAIT_PROD] = "prod", [PLAIT_MAX] = "max",
    [PLAIT_MIN] = "min", [PLAIT_AVG] = "avg",   [PLAIT_RED_PREMULSUM] = "premulsum",
};

size_t plait_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < PLAIT_NUM_TYPES ? dtype_table[dtype].size : 0;
}

const char *plait_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < PLAIT_NUM_TYPES ? dtype_table[dtype].name : "invalid";
}

const char *plait_op_name(int op)
{
    return op >= 0 && op < PLAIT_RED_NUM_OPS ? op_names[op] : "invalid";
}

#ifdef PLAIT_HAVE_F16C
/* fp16 through F16C (every AVX2 CPU has it). vcvtph2ps is exact, and vcvtps2ph
 * with _MM_FROUND_TO_NEAREST_INT rounds to nearest-even with correct subnormals
 * and overflow to inf, like f32_to_half(). vcvtps2ph keeps a NaN's payload, so
 * NaNs are first replaced by the fp32 NaN 0x7fffe000, whose top mantissa bits
 * narrow to the canonical 0x7fff. Tails shorter than 8 elements use the scalar
 * conversions, so every element gets the same bits as on the generic path. */
__attribute__((target("avx2,f16c"))) static inline __m256 f16c_load8(const unsigned char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

__attribute__((target("avx2,f16c"))) static inline __m128i f16c_narrow8(__m256 v)
{
    const __m256 canonical_nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffe000));
    v = _mm256_blendv_ps(v, canonical_nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* Sum, prod and the scaling kernels in one pass, 8 elements per step. */
__attribute__((target("avx2,f16c"))) static inline PLAIT_INLINE void f16c_arith(enum red_kernel k, unsigned char *d,
                                                                               const unsigned char *x,
                                                                               const unsigned char *y, size_t n,
                                                                               float s)
{
    const __m256 scale = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = f16c_load8(x + 2 * i);
        if (k == KERN_SCALE || k == KERN_SCALE_SUM)
            v = _mm256_cvtph_ps(f16c_narrow8(_mm256_mul_ps(v, scale)));
        if (k == KERN_PROD)
            v = _mm256_mul_ps(v, f16c_load8(y + 2 * i));
        else if (k != KERN_SCALE)
            v = _mm256_add_ps(v, f16c_load8(y + 2 * i));
        _mm_storeu_si128((__m128i *)(void *)(d + 2 * i), f16c_narrow8(v));
    }
    for (; i < n; i++) {
        float v = half_to_f32(((const unaligned_u16 *)(const void *)x)[i]);
        if (k == KERN_SCALE || k == KERN_SCALE_SUM)
            v = half_to_f32(f32_to_half(v * s));
        if (k != KERN_SCALE)
            v = f32_combine(k, v, half_to_f32(((const unaligned_u16 *)(const void *)y)[i]));
        ((unaligned_u16 *)(void *)d)[i] = (uint16_t)f32_to_half(v);
    }
}

__attribute__((target("avx2,f16c"))) static void red_half_f16c(enum red_kernel k, void *dst, const void *a,
                                                              const void *b, size_t n, float s)
{
    switch (k) {
    case KERN_SUM:
        f16c_arith(KERN_SUM, dst, a, b, n, s);
        break;
    case KERN_PROD:
        f16c_arith(KERN_PROD, dst, a, b, n, s);
        break;
    case KERN_SCALE_SUM:
        f16c_arith(KERN_SCALE_SUM, dst, a, b, n, s);
        break;
    case KERN_SCALE:
        f16c_arith(KERN_SCALE, dst, a, b, n, s);
        break;
    case KERN_MAX:
    case KERN_MIN:
    case KERN_COPY:
        break; /* max/min work on the encodings; see narrow_maxmin_bits() */
    }
}

/* Whether red_half_f16c() may run: 0 = not yet known, 1 = no, 2 = yes. Found on
 * first use; racing first calls store the same answer, so a relaxed atomic is
 * enough. CPUID is read once because it is slow (and traps under a hypervisor). */
static int f16c_state;

static bool has_f16c(void)
{
    int state = __atomic_load_n(&f16c_state, __ATOMIC_RELAXED);
    if (state == 0) {
        unsigned eax, ebx, ecx, edx;
        __builtin_cpu_init();
        /* __builtin_cpu_supports() also checks that the OS saves the YMM state. */
        bool is_usable = __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
        state = is_usable ? 2 : 1;
        __atomic_store_n(&f16c_state, state, __ATOMIC_RELAXED);
    }
    return state == 2;
}
#endif

static void red_run(const struct plait_red *r, enum red_kernel k, void *dst, const void *a, const void *b, size_t n)
{
    int dtype = r->dtype;
    bool is_signed = dtype_table[dtype].is_signed;
    if (k == KERN_COPY) {
        if (dst != a)
            memmove(dst, a, n * dtype_table[dtype].size);
        return;
    }
    switch (dtype) {
    case PLAIT_INT8:
    case PLAIT_UINT8:
        red_int8(k, is_signed, dst, a, b, n, (uint8_t)r->scalar_i);
        break;
    case PLAIT_INT32:
    case PLAIT_UINT32:
        red_int32(k, is_signed, dst, a, b, n, (uint32_t)r->scalar_i);
        break;
    case PLAIT_INT64:
    case PLAIT_UINT64:
        red_int64(k, is_signed, dst, a, b, n, r->scalar_i);
        break;
    case PLAIT_FLOAT32:
        red_f32(k, dst, a, b, n, (float)r->scalar_f);
        break;
    case PLAIT_FLOAT64:
        red_f64(k, dst, a, b, n, r->scalar_f);
        break;
    case PLAIT_FLOAT16:
#ifdef PLAIT_HAVE_F16C
        if (k != KERN_MAX && k != KERN_MIN && has_f16c()) {
            red_half_f16c(k, dst, a, b, n, (float)r->scalar_f);
            break;
        }
#endif
        red_narrow(dtype, k, dst, a, b, n, (float)r->scalar_f);
        break;
    case PLAIT_BFLOAT16:
    case PLAIT_FLOAT8_E4M3:
    case PLAIT_FLOAT8_E5M2:
        red_narrow(dtype, k, dst, a, b, n, (float)r->scalar_f);
        break;
    default:
        break;
    }
}

/* Elements per block for integer avg's final step: the division runs over a
 * block while the block is still in L1. */
#define POST_BLOCK 4096

/* Whether the pre-op (scaling) and the post-op (integer avg's division) take
 * effect for r under these flags; r's dtype has been checked. */
static bool red_has_pre(const struct plait_red *r, unsigned flags)
{
    return (flags & PLAIT_RED_PRE) &&
           (r->op == PLAIT_RED_PREMULSUM || (r->op == PLAIT_AVG && !dtype_table[r->dtype].is_integer));
}

static bool red_has_post(const struct plait_red *r, unsigned flags)
{
    return (flags & PLAIT_RED_POST) && r->op == PLAIT_AVG && dtype_table[r->dtype].is_integer && r->nranks > 1;
}

void plait_reduce_apply(const struct plait_red *r, void *dst, const void *a, const void *b, size_t n,
                        unsigned flags)
{
    int dtype = r->dtype;
    int op = r->op;
    if (n == 0 || dtype < 0 || dtype >= PLAIT_NUM_TYPES || op < 0 || op >= PLAIT_RED_NUM_OPS)
        return;
    bool has_pre = red_has_pre(r, flags);
    bool has_post = red_has_post(r, flags);

    enum red_kernel k;
    if (b == NULL)
        k = has_pre ? KERN_SCALE : KERN_COPY;
    else if (has_pre)
        k = KERN_SCALE_SUM;
    else if (op == PLAIT_PROD)
        k = KERN_PROD;
    else if (op == PLAIT_MAX)
        k = KERN_MAX;
    else if (op == PLAIT_MIN)
        k = KERN_MIN;
    else
        k = KERN_SUM;

    if (!has_post) {
        red_run(r, k, dst, a, b, n);
        return;
    }
    size_t esize = dtype_table[dtype].size;
    for (size_t off = 0; off < n; off += POST_BLOCK) {
        size_t m = n - off < POST_BLOCK ? n - off : POST_BLOCK;
        size_t byte_off = off * esize;
        red_run(r, k, (char *)dst + byte_off, (const char *)a + byte_off, b ? (const char *)b + byte_off : NULL, m);
        post_divide(dtype, (char *)dst + byte_off, m, r->nranks);
    }
}

int plait_reduce_is_copy(const struct plait_red *r, unsigned flags)
{
    if (r->dtype < 0 || r->dtype >= PLAIT_NUM_TYPES)
        return flags == 0;
    return !red_has_pre(r, flags) && !red_has_post(r, flags);
}

/* ---------------------------------------------------------------- init */

/* The value `v` as stored in `dtype` and widened back, for the pre-multiplier:
 * the GPU multiplies by a scalar of the data's own type (NCCL builds avg's 1/n as
 * __float2half(float(1.0/n)) for fp16, and likewise for the others), so the CPU
 * must use that rounded value too. */
static double round_to_dtype(int dtype, double v)
{
    float f = (float)v;
    switch (dtype) {
    case PLAIT_FLOAT64:
        return v;
    case PLAIT_FLOAT32:
        return f;
    case PLAIT_FLOAT16:
        return half_to_f32(f32_to_half(f));
    case PLAIT_BFLOAT16:
        return bf16_to_f32(f32_to_bf16(f));
    case PLAIT_FLOAT8_E4M3:
        return e4m3_to_f32(f32_to_e4m3(f));
    case PLAIT_FLOAT8_E5M2:
        return e5m2_to_f32(f32_to_e5m2(f));
    default:
        return v;
    }
}

/* Reads premulsum's scalar: one element of dtype at any alignment. */
static void read_scalar(int dtype, const void *scalar, struct plait_red *r)
{
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    float f32;
    double f64;
    switch (dtype) {
    case PLAIT_INT8:
        memcpy(&u8, scalar, 1);
        r->scalar_i = (uint64_t)(int64_t)(int8_t)u8;
        r->scalar_f = (int8_t)u8;
        break;
    case PLAIT_UINT8:
        memcpy(&u8, scalar, 1);
        r->scalar_i = u8;
        r->scalar_f = u8;
        break;
    case PLAIT_INT32:
        memcpy(&u32, scalar, 4);
        r->scalar_i = (uint64_t)(int64_t)(int32_t)u32;
        r->scalar_f = (int32_t)u32;
        break;
    case PLAIT_UINT32:
        memcpy(&u32, scalar, 4);
        r->scalar_i = u32;
        r->scalar_f = u32;
        break;
    case PLAIT_INT64:
        memcpy(&u64, scalar, 8);
        r->scalar_i = u64;
        r->scalar_f = (double)(int64_t)u64;
        break;
    case PLAIT_UINT64:
        memcpy(&u64, scalar, 8);
        r->scalar_i = u64;
        r->scalar_f = (double)u64;
        break;
    case PLAIT_FLOAT16:
        memcpy(&u16, scalar, 2);
        r->scalar_f = half_to_f32(u16);
        break;
    case PLAIT_BFLOAT16:
        memcpy(&u16, scalar, 2);
        r->scalar_f = bf16_to_f32(u16);
        break;
    case PLAIT_FLOAT32:
        memcpy(&f32, scalar, 4);
        r->scalar_f = f32;
        break;
    case PLAIT_FLOAT64:
        memcpy(&f64, scalar, 8);
        r->scalar_f = f64;
        break;
    case PLAIT_FLOAT8_E4M3:
        memcpy(&u8, scalar, 1);
        r->scalar_f = e4m3_to_f32(u8);
        break;
    case PLAIT_FLOAT8_E5M2:
        memcpy(&u8, scalar, 1);
        r->scalar_f = e5m2_to_f32(u8);
        break;
    default:
        break;
    }
}

plait_result_t plait_red_init(struct plait_red *r, int dtype, int op, const void *scalar, uint64_t nranks)
{
    if (r == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_red_init: r is NULL");
    if (dtype < 0 || dtype >= PLAIT_NUM_TYPES)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_red_init: invalid datatype %d (valid: 0..%d)", dtype,
                           PLAIT_NUM_TYPES - 1);
    if (op < 0 || op >= PLAIT_RED_NUM_OPS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_red_init: invalid reduction op %d (valid: 0..%d)", op,
                           PLAIT_RED_NUM_OPS - 1);
    if (nranks < 1)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_red_init: nranks is 0 (%s %s)", plait_op_name(op),
                           plait_dtype_name(dtype));
    if (op == PLAIT_RED_PREMULSUM && scalar == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_red_init: premulsum on %s without a scalar",
                           plait_dtype_name(dtype));

    struct plait_red red = {
        .dtype = dtype,
        .op = op,
        .nranks = nranks,
        .scalar_f = 1.0,
        .scalar_i = 1,
    };
    if (op == PLAIT_RED_PREMULSUM)
        read_scalar(dtype, scalar, &red);
    else if (op == PLAIT_AVG && !dtype_table[dtype].is_integer)
        red.scalar_f = round_to_dtype(dtype, 1.0 / (double)nranks);
    *r = red;
    return PLAIT_SUCCESS;
}
