/* Device reductions and copies for the 12 data types and 6 ops, bit for bit
 * the rules of core/reduce.c (read its top comment):
 *  - every binary step is rounded to the storage type before the next one;
 *    fp32/fp64 use the _rn intrinsics, which nvcc never contracts into an FMA,
 *    and the kernels are built without -ftz/--use_fast_math (subnormals kept,
 *    as on the CPU);
 *  - fp16 sum and prod use the native __hadd2_rn/__hmul2_rn. They round the
 *    exact result once, the CPU rounds it to fp32 first and then to fp16; the
 *    two agree because fp32's 24 bits are at least 2 x 11 + 2 (double rounding
 *    is innocuous for +, x when p' >= 2p + 2, Figueroa 1995), and the product
 *    of two fp16 values is exact in fp32 anyway;
 *  - bf16 sum and prod are computed in fp32 and narrowed with
 *    __floats2bfloat162_rn (the CPU's steps exactly: the native bf16 add of
 *    sm_80 is an FMA whose subnormal handling we have not proven equal);
 *  - fp16/bf16 max and min use the native __hmax2/__hmin2, whose documented
 *    rules (a NaN operand is ignored, two NaNs give the canonical NaN, +0 > -0)
 *    are the CPU's;
 *  - fp8 widens with cuda_fp8.h's exact conversion, computes in fp32 and
 *    narrows with __nv_cvt_float2_to_fp8x2(..., __NV_SATFINITE, ...) (round
 *    to nearest even, saturating finite overflow and infinities); max/min
 *    compare the encodings like the CPU, without converting;
 *  - every narrow result that is a NaN is rewritten to the canonical encoding
 *    (0x7fff, 0x7f) whatever the hardware left in the payload, so NaN results
 *    match the CPU's by construction;
 *  - float avg and premulsum scale a rank's own contribution by the scalar the
 *    host computed (rounded to the type by plait_red_init) and round the
 *    product to the type before summing; integer avg sums (wrapping) and
 *    divides the final result, truncating toward zero; integers wrap.
 *
 * Data moves in 16-byte vectors when dst, a and b share their alignment
 * modulo 16 (a few scalar elements first bring them to a 16-byte boundary),
 * element by element otherwise and in the tails; elements that are not even
 * aligned to their size are assembled from bytes. Every function takes the
 * calling thread's index and the number of threads sharing the work. */
#ifndef PLAIT_REDUCE_DEV_CUH
#define PLAIT_REDUCE_DEV_CUH

#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "plait.h"
#include "core/reduce.h"

namespace plait_dev {

/* What one call does to each element, chosen once per call (reduce.c's);
 * the _DIV kernels are integer avg's last step (sum or copy, then divide),
 * kept apart so that the 64-bit division is compiled into those alone. */
enum kern { K_SUM, K_PROD, K_MAX, K_MIN, K_SCALE_SUM, K_SCALE, K_COPY, K_SUM_DIV, K_COPY_DIV };

struct params {
    float sf;        /* the pre-multiplier for fp16/bf16/fp8/fp32 */
    double sd;       /* for fp64 */
    uint64_t si;     /* for integers (premulsum), applied wrapping */
    uint64_t nranks; /* integer avg's divisor */
};

template <int DT> struct dtype_info;
#define PLAIT_DEV_DTYPE(dt, sz, integer, sgn)                                                                        \
    template <> struct dtype_info<dt> {                                                                              \
        static constexpr int size = sz;                                                                              \
        static constexpr bool is_int = integer;                                                                      \
        static constexpr bool is_signed = sgn;                                                                       \
    }
PLAIT_DEV_DTYPE(PLAIT_INT8, 1, true, true);
PLAIT_DEV_DTYPE(PLAIT_UINT8, 1, true, false);
PLAIT_DEV_DTYPE(PLAIT_INT32, 4, true, true);
PLAIT_DEV_DTYPE(PLAIT_UINT32, 4, true, false);
PLAIT_DEV_DTYPE(PLAIT_INT64, 8, true, true);
PLAIT_DEV_DTYPE(PLAIT_UINT64, 8, true, false);
PLAIT_DEV_DTYPE(PLAIT_FLOAT16, 2, false, false);
PLAIT_DEV_DTYPE(PLAIT_FLOAT32, 4, false, false);
PLAIT_DEV_DTYPE(PLAIT_FLOAT64, 8, false, false);
PLAIT_DEV_DTYPE(PLAIT_BFLOAT16, 2, false, false);
PLAIT_DEV_DTYPE(PLAIT_FLOAT8_E4M3, 1, false, false);
PLAIT_DEV_DTYPE(PLAIT_FLOAT8_E5M2, 1, false, false);
#undef PLAIT_DEV_DTYPE

/* ---------------------------------------------------------------- integers */

/* Integer avg's post-op: truncation toward zero of the signed value (the
 * magnitude is divided in uint64_t, so the most negative value is fine). */
template <typename U, bool S> __device__ __forceinline__ U post_div(U v, uint64_t d)
{
    if (S) {
        const int64_t x = sizeof(U) == 1 ? (int64_t)(int8_t)v : sizeof(U) == 4 ? (int64_t)(int32_t)v : (int64_t)v;
        const bool is_neg = x < 0;
        const uint64_t mag = is_neg ? 0u - (uint64_t)x : (uint64_t)x;
        const uint64_t q = mag / d;
        return (U)(is_neg ? 0u - q : q);
    }
    return (U)((uint64_t)v / d);
}

template <typename U, bool S, int K> __device__ __forceinline__ U int_op(U x, U y, const params &p)
{
    U v = x;
    if (K == K_SCALE || K == K_SCALE_SUM)
        v = (U)(v * (U)p.si);
    switch (K) {
    case K_SUM:
    case K_SCALE_SUM:
    case K_SUM_DIV:
        v = (U)(v + y);
        break;
    case K_PROD:
        v = (U)(v * y);
        break;
    case K_MAX:
        if (S)
            v = sizeof(U) == 1 ? ((int8_t)x > (int8_t)y ? x : y)
                : sizeof(U) == 4 ? ((int32_t)x > (int32_t)y ? x : y) : ((int64_t)x > (int64_t)y ? x : y);
        else
            v = x > y ? x : y;
        break;
    case K_MIN:
        if (S)
            v = sizeof(U) == 1 ? ((int8_t)x < (int8_t)y ? x : y)
                : sizeof(U) == 4 ? ((int32_t)x < (int32_t)y ? x : y) : ((int64_t)x < (int64_t)y ? x : y);
        else
            v = x < y ? x : y;
        break;
    default:
        break;
    }
    if (K == K_SUM_DIV || K == K_COPY_DIV)
        v = post_div<U, S>(v, p.nranks);
    return v;
}

/* ---------------------------------------------------------------- max/min on encodings (reduce.c's) */

__device__ __forceinline__ uint32_t f32_maxmin_bits(bool is_max, uint32_t x, uint32_t y)
{
    const bool x_nan = (x & 0x7fffffffu) > 0x7f800000u;
    const bool y_nan = (y & 0x7fffffffu) > 0x7f800000u;
    const int32_t kx = (int32_t)(x ^ ((uint32_t)((int32_t)x >> 31) >> 1));
    const int32_t ky = (int32_t)(y ^ ((uint32_t)((int32_t)y >> 31) >> 1));
    uint32_t r = (is_max ? kx > ky : kx < ky) ? x : y;
    r = y_nan ? x : r;
    r = x_nan ? y : r;
    return x_nan && y_nan ? 0x7fffffffu : r;
}

__device__ __forceinline__ uint64_t f64_maxmin_bits(bool is_max, uint64_t x, uint64_t y)
{
    const bool x_nan = (x & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    const bool y_nan = (y & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    const int64_t kx = (int64_t)(x ^ ((uint64_t)((int64_t)x >> 63) >> 1));
    const int64_t ky = (int64_t)(y ^ ((uint64_t)((int64_t)y >> 63) >> 1));
    uint64_t r = (is_max ? kx > ky : kx < ky) ? x : y;
    r = y_nan ? x : r;
    r = x_nan ? y : r;
    return x_nan && y_nan ? 0x7fffffffffffffffull : r;
}

/* fp8 max/min of two encodings (one byte each). */
template <int DT> __device__ __forceinline__ uint32_t fp8_maxmin_bits(bool is_max, uint32_t x, uint32_t y)
{
    const uint32_t sign = 0x80u, mag = 0x7fu;
    const bool x_nan = DT == PLAIT_FLOAT8_E4M3 ? (x & mag) == 0x7fu : (x & mag) > 0x7cu;
    const bool y_nan = DT == PLAIT_FLOAT8_E4M3 ? (y & mag) == 0x7fu : (y & mag) > 0x7cu;
    const uint32_t kx = (x & sign) ? mag - (x & mag) : x | sign;
    const uint32_t ky = (y & sign) ? mag - (y & mag) : y | sign;
    uint32_t r = (is_max ? kx > ky : kx < ky) ? x : y;
    r = y_nan ? x : r;
    r = x_nan ? y : r;
    if (DT == PLAIT_FLOAT8_E5M2)
        r = (r & mag) == 0x7cu ? (r & sign) | 0x7bu : r; /* +-inf narrows (saturates) like any result */
    return x_nan && y_nan ? 0x7fu : r;
}

/* ---------------------------------------------------------------- NaN canonicalisation */

__device__ __forceinline__ uint32_t canon_half2(uint32_t r)
{
    const uint32_t lo = (r & 0x7fffu) > 0x7c00u ? 0x7fffu : (r & 0xffffu);
    const uint32_t hi = ((r >> 16) & 0x7fffu) > 0x7c00u ? 0x7fffu : (r >> 16);
    return lo | hi << 16;
}

__device__ __forceinline__ uint32_t canon_bf162(uint32_t r)
{
    const uint32_t lo = (r & 0x7fffu) > 0x7f80u ? 0x7fffu : (r & 0xffffu);
    const uint32_t hi = ((r >> 16) & 0x7fffu) > 0x7f80u ? 0x7fffu : (r >> 16);
    return lo | hi << 16;
}

template <int DT> __device__ __forceinline__ uint32_t canon_fp8(uint32_t b)
{
    const bool is_nan = DT == PLAIT_FLOAT8_E4M3 ? (b & 0x7fu) == 0x7fu : (b & 0x7fu) > 0x7cu;
    return is_nan ? 0x7fu : b;
}

__device__ __forceinline__ __half2 as_h2(uint32_t u)
{
    __half2 h;
    memcpy(&h, &u, 4);
    return h;
}

__device__ __forceinline__ uint32_t from_h2(__half2 h)
{
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

__device__ __forceinline__ __nv_bfloat162 as_b2(uint32_t u)
{
    __nv_bfloat162 h;
    memcpy(&h, &u, 4);
    return h;
}

__device__ __forceinline__ uint32_t from_b2(__nv_bfloat162 h)
{
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

/* One fp32 binary step of a narrow type's arithmetic. */
template <int K> __device__ __forceinline__ float f32_arith(float x, float y)
{
    return K == K_PROD ? __fmul_rn(x, y) : __fadd_rn(x, y);
}

/* ---------------------------------------------------------------- 32-bit words
 * w32<DT, K>: every element of a 32-bit word (4 bytes, 2 halves, 1 fp32/int32). */

template <int DT, int K> __device__ __forceinline__ uint32_t w32(uint32_t x, uint32_t y, const params &p)
{
    if (DT == PLAIT_INT8 || DT == PLAIT_UINT8) {
        uint32_t r = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint8_t v = int_op<uint8_t, DT == PLAIT_INT8, K>((uint8_t)(x >> (8 * j)), (uint8_t)(y >> (8 * j)), p);
            r |= (uint32_t)v << (8 * j);
        }
        return r;
    } else if (DT == PLAIT_INT32 || DT == PLAIT_UINT32) {
        return int_op<uint32_t, DT == PLAIT_INT32, K>(x, y, p);
    } else if (DT == PLAIT_FLOAT32) {
        if (K == K_MAX || K == K_MIN)
            return f32_maxmin_bits(K == K_MAX, x, y);
        float v = __uint_as_float(x);
        if (K == K_SCALE || K == K_SCALE_SUM)
            v = __fmul_rn(v, p.sf);
        if (K == K_SUM || K == K_SCALE_SUM)
            v = __fadd_rn(v, __uint_as_float(y));
        else if (K == K_PROD)
            v = __fmul_rn(v, __uint_as_float(y));
        return __float_as_uint(v);
    } else if (DT == PLAIT_FLOAT16) {
        __half2 v = as_h2(x);
        if (K == K_MAX)
            return canon_half2(from_h2(__hmax2(v, as_h2(y))));
        if (K == K_MIN)
            return canon_half2(from_h2(__hmin2(v, as_h2(y))));
        if (K == K_SCALE || K == K_SCALE_SUM) {
            /* The scaled contribution is rounded to fp16 before it is summed. */
            float2 f = __half22float2(v);
            f.x = __fmul_rn(f.x, p.sf);
            f.y = __fmul_rn(f.y, p.sf);
            v = as_h2(canon_half2(from_h2(__float22half2_rn(f))));
        }
        if (K == K_SUM || K == K_SCALE_SUM)
            v = __hadd2_rn(v, as_h2(y));
        else if (K == K_PROD)
            v = __hmul2_rn(v, as_h2(y));
        return canon_half2(from_h2(v));
    } else if (DT == PLAIT_BFLOAT16) {
        if (K == K_MAX)
            return canon_bf162(from_b2(__hmax2(as_b2(x), as_b2(y))));
        if (K == K_MIN)
            return canon_bf162(from_b2(__hmin2(as_b2(x), as_b2(y))));
        float2 f = __bfloat1622float2(as_b2(x));
        if (K == K_SCALE || K == K_SCALE_SUM) {
            f.x = __fmul_rn(f.x, p.sf);
            f.y = __fmul_rn(f.y, p.sf);
            f = __bfloat1622float2(as_b2(canon_bf162(from_b2(__floats2bfloat162_rn(f.x, f.y)))));
        }
        if (K != K_SCALE) {
            const float2 g = __bfloat1622float2(as_b2(y));
            f.x = f32_arith<K>(f.x, g.x);
            f.y = f32_arith<K>(f.y, g.y);
        }
        return canon_bf162(from_b2(__floats2bfloat162_rn(f.x, f.y)));
    } else { /* fp8: two pairs of bytes */
        const __nv_fp8_interpretation_t fmt = DT == PLAIT_FLOAT8_E4M3 ? __NV_E4M3 : __NV_E5M2;
        uint32_t r = 0;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint16_t xp = (uint16_t)(x >> (16 * j)), yp = (uint16_t)(y >> (16 * j));
            uint32_t pr;
            if (K == K_MAX || K == K_MIN) {
                pr = fp8_maxmin_bits<DT>(K == K_MAX, xp & 0xffu, yp & 0xffu) |
                     fp8_maxmin_bits<DT>(K == K_MAX, xp >> 8, yp >> 8) << 8;
            } else {
                float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)xp, fmt)));
                if (K == K_SCALE || K == K_SCALE_SUM) {
                    f.x = __fmul_rn(f.x, p.sf);
                    f.y = __fmul_rn(f.y, p.sf);
                    const uint16_t s = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, fmt);
                    const uint16_t sc = (uint16_t)(canon_fp8<DT>(s & 0xffu) | canon_fp8<DT>(s >> 8) << 8);
                    f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sc, fmt)));
                }
                if (K != K_SCALE) {
                    const float2 g =
                        __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)yp, fmt)));
                    f.x = f32_arith<K>(f.x, g.x);
                    f.y = f32_arith<K>(f.y, g.y);
                }
                const uint16_t s = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, fmt);
                pr = canon_fp8<DT>(s & 0xffu) | canon_fp8<DT>(s >> 8) << 8;
            }
            r |= pr << (16 * j);
        }
        return r;
    }
}

/* w64<DT, K>: one 8-byte element (int64, uint64, fp64). */
template <int DT, int K> __device__ __forceinline__ uint64_t w64(uint64_t x, uint64_t y, const params &p)
{
    if (DT == PLAIT_FLOAT64) {
        if (K == K_MAX || K == K_MIN)
            return f64_maxmin_bits(K == K_MAX, x, y);
        double v = __longlong_as_double((long long)x);
        if (K == K_SCALE || K == K_SCALE_SUM)
            v = __dmul_rn(v, p.sd);
        if (K == K_SUM || K == K_SCALE_SUM)
            v = __dadd_rn(v, __longlong_as_double((long long)y));
        else if (K == K_PROD)
            v = __dmul_rn(v, __longlong_as_double((long long)y));
        return (uint64_t)__double_as_longlong(v);
    }
    return int_op<uint64_t, DT == PLAIT_INT64, K>(x, y, p);
}

/* 8 bytes of elements: the unit of LL lines, and half a vector. */
template <int DT, int K> __device__ __forceinline__ uint64_t w8(uint64_t x, uint64_t y, const params &p)
{
    if (dtype_info<DT>::size == 8)
        return w64<DT, K>(x, y, p);
    return (uint64_t)w32<DT, K>((uint32_t)x, (uint32_t)y, p) |
           (uint64_t)w32<DT, K>((uint32_t)(x >> 32), (uint32_t)(y >> 32), p) << 32;
}

/* ---------------------------------------------------------------- element access */

/* One element of size ES at p, aligned or not, in the low bytes of a word. */
template <int ES> __device__ __forceinline__ uint64_t ld_elem(const char *p, bool is_aligned)
{
    if (is_aligned) {
        if (ES == 1)
            return *(const uint8_t *)p;
        if (ES == 2)
            return *(const uint16_t *)p;
        if (ES == 4)
            return *(const uint32_t *)p;
        return *(const uint64_t *)p;
    }
    uint64_t v = 0;
#pragma unroll
    for (int i = 0; i < ES; i++)
        v |= (uint64_t)(uint8_t)p[i] << (8 * i);
    return v;
}

template <int ES> __device__ __forceinline__ void st_elem(char *p, uint64_t v, bool is_aligned)
{
    if (is_aligned) {
        if (ES == 1)
            *(uint8_t *)p = (uint8_t)v;
        else if (ES == 2)
            *(uint16_t *)p = (uint16_t)v;
        else if (ES == 4)
            *(uint32_t *)p = (uint32_t)v;
        else
            *(uint64_t *)p = v;
        return;
    }
#pragma unroll
    for (int i = 0; i < ES; i++)
        p[i] = (char)(uint8_t)(v >> (8 * i));
}

template <int DT, int K> __device__ __forceinline__ uint4 vec_op(uint4 x, uint4 y, const params &p)
{
    const uint64_t lo = w8<DT, K>((uint64_t)x.x | (uint64_t)x.y << 32, (uint64_t)y.x | (uint64_t)y.y << 32, p);
    const uint64_t hi = w8<DT, K>((uint64_t)x.z | (uint64_t)x.w << 32, (uint64_t)y.z | (uint64_t)y.w << 32, p);
    return make_uint4((uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi, (uint32_t)(hi >> 32));
}

/* Vectors processed per thread per round: independent 16-byte loads in
 * flight (2 for fp8, whose conversions make each vector long already). */
#define PLAIT_DEV_UNROLL 4
template <int DT> struct unroll {
    static constexpr int n = DT == PLAIT_FLOAT8_E4M3 || DT == PLAIT_FLOAT8_E5M2 ? 2 : PLAIT_DEV_UNROLL;
};

/* dst[i] = K(a[i], b[i]) for i < n, shared by nth threads. */
template <int DT, int K>
__device__ __noinline__ void red_run(char *d, const char *a, const char *b, uint64_t n, params p, uint64_t tid,
                                     uint64_t nth)
{
    constexpr int ES = dtype_info<DT>::size;
    constexpr uint64_t PER = 16 / ES;
    constexpr bool has_b = K != K_SCALE && K != K_COPY && K != K_COPY_DIV;
    const uintptr_t ud = (uintptr_t)d, ua = (uintptr_t)a, ub = has_b ? (uintptr_t)b : ud;
    uint64_t head = n, nvec = 0;
    if (((ud ^ ua) & 15u) == 0 && ((ud ^ ub) & 15u) == 0 && ud % ES == 0) {
        head = (uint64_t)((16u - (ud & 15u)) & 15u) / ES;
        head = head < n ? head : n;
        nvec = (n - head) / PER;
    }
    const uint4 *va = (const uint4 *)(a + head * ES);
    const uint4 *vb = (const uint4 *)(b + (has_b ? head * ES : 0));
    uint4 *vd = (uint4 *)(d + head * ES);
    constexpr int U = unroll<DT>::n;
    uint64_t i = tid;
    for (; i + (U - 1) * nth < nvec; i += U * nth) {
        uint4 x[U], y[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            x[u] = va[i + u * nth];
            y[u] = has_b ? vb[i + u * nth] : x[u];
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            vd[i + u * nth] = vec_op<DT, K>(x[u], y[u], p);
    }
    for (; i < nvec; i += nth)
        vd[i] = vec_op<DT, K>(va[i], has_b ? vb[i] : va[i], p);
    /* Scalars: the head before the first vector and the tail after the last. */
    const uint64_t tail0 = head + nvec * PER;
    const uint64_t nscalar = head + (n - tail0);
    const bool is_aligned = ((ud | ua | ub) % ES) == 0;
    for (uint64_t j = tid; j < nscalar; j += nth) {
        const uint64_t e = j < head ? j : tail0 + (j - head);
        const uint64_t x = ld_elem<ES>(a + e * ES, is_aligned);
        const uint64_t y = has_b ? ld_elem<ES>(b + e * ES, is_aligned) : x;
        st_elem<ES>(d + e * ES, w8<DT, K>(x, y, p), is_aligned);
    }
}

/* Bytes copied with units of W bytes once src and dst are W-aligned. */
template <typename W>
__device__ __forceinline__ void copy_units(char *d, const char *s, uint64_t bytes, uint64_t tid, uint64_t nth)
{
    constexpr uint64_t WS = sizeof(W);
    uint64_t head = (WS - (uintptr_t)d % WS) % WS;
    head = head < bytes ? head : bytes;
    const uint64_t nunits = (bytes - head) / WS;
    const W *vs = (const W *)(s + head);
    W *vd = (W *)(d + head);
    uint64_t i = tid;
    for (; i + (PLAIT_DEV_UNROLL - 1) * nth < nunits; i += PLAIT_DEV_UNROLL * nth) {
        W x[PLAIT_DEV_UNROLL];
#pragma unroll
        for (int u = 0; u < PLAIT_DEV_UNROLL; u++)
            x[u] = vs[i + u * nth];
#pragma unroll
        for (int u = 0; u < PLAIT_DEV_UNROLL; u++)
            vd[i + u * nth] = x[u];
    }
    for (; i < nunits; i += nth)
        vd[i] = vs[i];
    const uint64_t tail0 = head + nunits * WS;
    const uint64_t nscalar = head + (bytes - tail0);
    for (uint64_t j = tid; j < nscalar; j += nth) {
        const uint64_t e = j < head ? j : tail0 + (j - head);
        d[e] = s[e];
    }
}

/* A copy of `bytes` bytes: 16-byte units when src and dst agree modulo 16,
 * else the widest unit they agree on. */
__device__ __noinline__ void copy(void *dst, const void *src, uint64_t bytes, uint64_t tid, uint64_t nth)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    if (d == s || bytes == 0)
        return;
    const uintptr_t x = (uintptr_t)d ^ (uintptr_t)s;
    if ((x & 15u) == 0)
        copy_units<uint4>(d, s, bytes, tid, nth);
    else if ((x & 7u) == 0)
        copy_units<uint2>(d, s, bytes, tid, nth);
    else if ((x & 3u) == 0)
        copy_units<uint32_t>(d, s, bytes, tid, nth);
    else if ((x & 1u) == 0)
        copy_units<uint16_t>(d, s, bytes, tid, nth);
    else
        copy_units<uint8_t>(d, s, bytes, tid, nth);
}

/* The kernel a call runs (reduce.c's choice), and its parameters. */
__device__ __forceinline__ int choose(int dtype, int redop, uint64_t nranks, double scalar_f, uint64_t scalar_i,
                                      bool has_b, unsigned flags, params *p)
{
    const bool is_int = dtype <= PLAIT_UINT64;
    const bool has_pre = (flags & PLAIT_RED_PRE) && (redop == PLAIT_RED_PREMULSUM || (redop == PLAIT_AVG && !is_int));
    p->sf = (float)scalar_f;
    p->sd = scalar_f;
    p->si = scalar_i;
    p->nranks = nranks;
    if ((flags & PLAIT_RED_POST) && redop == PLAIT_AVG && is_int && nranks > 1)
        return has_b ? K_SUM_DIV : K_COPY_DIV;
    if (!has_b)
        return has_pre ? K_SCALE : K_COPY;
    if (has_pre)
        return K_SCALE_SUM;
    if (redop == PLAIT_PROD)
        return K_PROD;
    if (redop == PLAIT_MAX)
        return K_MAX;
    if (redop == PLAIT_MIN)
        return K_MIN;
    return K_SUM;
}

template <int DT>
__device__ __forceinline__ void red_dispatch(int k, char *d, const char *a, const char *b, uint64_t n,
                                             const params &p, uint64_t tid, uint64_t nth)
{
    switch (k) {
    case K_SUM:
        red_run<DT, K_SUM>(d, a, b, n, p, tid, nth);
        break;
    case K_PROD:
        red_run<DT, K_PROD>(d, a, b, n, p, tid, nth);
        break;
    case K_MAX:
        red_run<DT, K_MAX>(d, a, b, n, p, tid, nth);
        break;
    case K_MIN:
        red_run<DT, K_MIN>(d, a, b, n, p, tid, nth);
        break;
    case K_SCALE_SUM:
        red_run<DT, K_SCALE_SUM>(d, a, b, n, p, tid, nth);
        break;
    case K_SCALE:
        red_run<DT, K_SCALE>(d, a, b, n, p, tid, nth);
        break;
    case K_SUM_DIV:
        if (dtype_info<DT>::is_int)
            red_run<DT, K_SUM_DIV>(d, a, b, n, p, tid, nth);
        break;
    case K_COPY_DIV:
        if (dtype_info<DT>::is_int)
            red_run<DT, K_COPY_DIV>(d, a, b, n, p, tid, nth);
        break;
    default: /* K_COPY: plait_dev_reduce copies */
        break;
    }
}

template <int DT> __device__ __forceinline__ uint64_t red8_dispatch(int k, uint64_t a, uint64_t b, const params &p)
{
    switch (k) {
    case K_SUM:
        return w8<DT, K_SUM>(a, b, p);
    case K_PROD:
        return w8<DT, K_PROD>(a, b, p);
    case K_MAX:
        return w8<DT, K_MAX>(a, b, p);
    case K_MIN:
        return w8<DT, K_MIN>(a, b, p);
    case K_SCALE_SUM:
        return w8<DT, K_SCALE_SUM>(a, b, p);
    case K_SCALE:
        return w8<DT, K_SCALE>(a, a, p);
    case K_SUM_DIV:
        return dtype_info<DT>::is_int ? w8<DT, K_SUM_DIV>(a, b, p) : a;
    case K_COPY_DIV:
        return dtype_info<DT>::is_int ? w8<DT, K_COPY_DIV>(a, a, p) : a;
    default:
        return a;
    }
}

} /* namespace plait_dev */

/* dst[i] = post(pre(a[i]) OP b[i]) for i < n (b NULL: a transformed copy),
 * as plait_reduce_apply; the work is shared by nth threads, this one being
 * tid. dst may equal a or b exactly. An invalid dtype or op does nothing. */
__device__ __noinline__ void plait_dev_reduce(int dtype, int redop, uint64_t nranks, double scalar_f,
                                              uint64_t scalar_i, void *dst, const void *a, const void *b, uint64_t n,
                                              unsigned flags, uint64_t tid, uint64_t nth)
{
    using namespace plait_dev;
    if (n == 0 || dtype < 0 || dtype >= PLAIT_NUM_TYPES || redop < 0 || redop >= PLAIT_RED_NUM_OPS)
        return;
    params p;
    const int k = choose(dtype, redop, nranks, scalar_f, scalar_i, b != 0, flags, &p);
    char *d = (char *)dst;
    const char *x = (const char *)a, *y = (const char *)b;
    if (k == K_COPY) {
        static const uint8_t size[PLAIT_NUM_TYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
        copy(d, x, n * size[dtype], tid, nth);
        return;
    }
    switch (dtype) {
    case PLAIT_INT8:
        red_dispatch<PLAIT_INT8>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_UINT8:
        red_dispatch<PLAIT_UINT8>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_INT32:
        red_dispatch<PLAIT_INT32>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_UINT32:
        red_dispatch<PLAIT_UINT32>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_INT64:
        red_dispatch<PLAIT_INT64>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_UINT64:
        red_dispatch<PLAIT_UINT64>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_FLOAT16:
        red_dispatch<PLAIT_FLOAT16>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_FLOAT32:
        red_dispatch<PLAIT_FLOAT32>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_FLOAT64:
        red_dispatch<PLAIT_FLOAT64>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_BFLOAT16:
        red_dispatch<PLAIT_BFLOAT16>(k, d, x, y, n, p, tid, nth);
        break;
    case PLAIT_FLOAT8_E4M3:
        red_dispatch<PLAIT_FLOAT8_E4M3>(k, d, x, y, n, p, tid, nth);
        break;
    default:
        red_dispatch<PLAIT_FLOAT8_E5M2>(k, d, x, y, n, p, tid, nth);
        break;
    }
}

/* The same on the elements packed in 8 bytes (an LL line's payload), by one
 * thread: the result's bytes past the caller's elements are don't-cares. */
__device__ __noinline__ uint64_t plait_dev_reduce8(int dtype, int redop, uint64_t nranks, double scalar_f,
                                                   uint64_t scalar_i, uint64_t a, uint64_t b, int has_b,
                                                   unsigned flags)
{
    using namespace plait_dev;
    if (dtype < 0 || dtype >= PLAIT_NUM_TYPES || redop < 0 || redop >= PLAIT_RED_NUM_OPS)
        return a;
    params p;
    const int k = choose(dtype, redop, nranks, scalar_f, scalar_i, has_b != 0, flags, &p);
    switch (dtype) {
    case PLAIT_INT8:
        return red8_dispatch<PLAIT_INT8>(k, a, b, p);
    case PLAIT_UINT8:
        return red8_dispatch<PLAIT_UINT8>(k, a, b, p);
    case PLAIT_INT32:
        return red8_dispatch<PLAIT_INT32>(k, a, b, p);
    case PLAIT_UINT32:
        return red8_dispatch<PLAIT_UINT32>(k, a, b, p);
    case PLAIT_INT64:
        return red8_dispatch<PLAIT_INT64>(k, a, b, p);
    case PLAIT_UINT64:
        return red8_dispatch<PLAIT_UINT64>(k, a, b, p);
    case PLAIT_FLOAT16:
        return red8_dispatch<PLAIT_FLOAT16>(k, a, b, p);
    case PLAIT_FLOAT32:
        return red8_dispatch<PLAIT_FLOAT32>(k, a, b, p);
    case PLAIT_FLOAT64:
        return red8_dispatch<PLAIT_FLOAT64>(k, a, b, p);
    case PLAIT_BFLOAT16:
        return red8_dispatch<PLAIT_BFLOAT16>(k, a, b, p);
    case PLAIT_FLOAT8_E4M3:
        return red8_dispatch<PLAIT_FLOAT8_E4M3>(k, a, b, p);
    default:
        return red8_dispatch<PLAIT_FLOAT8_E5M2>(k, a, b, p);
    }
}

#endif
