/* Element-wise reductions and copies for the 12 data types and 6 ops.
 *
 * Rounding rule (docs/architecture.md, section 13): every binary step is computed in at least fp32 (fp64
 * for fp64) and rounded to the storage type, nearest-even, before the next step,
 * so the CPU and GPU executors give the same bits for the same schedule. Integer
 * arithmetic wraps (computed unsigned). Float avg and premulsum scale each rank's
 * contribution once, when it enters the reduction ("pre"); integer avg sums and
 * divides the final result, truncating like NCCL ("post"). */
#ifndef PLAIT_REDUCE_H
#define PLAIT_REDUCE_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"

/* Internal op codes: the public ones plus the run-time premultiplied sum. */
enum { PLAIT_RED_PREMULSUM = PLAIT_NUM_OPS, PLAIT_RED_NUM_OPS };

/* A reduction as the executor applies it. */
struct plait_red {
    int dtype;       /* plait_datatype_t */
    int op;          /* PLAIT_SUM..PLAIT_AVG or PLAIT_RED_PREMULSUM */
    uint64_t nranks; /* for avg */
    /* The pre-multiplier: premulsum's scalar, or 1/nranks for float avg. For
     * integer types (premulsum only) the integer value, applied wrapping. For
     * float avg, 1/nranks is rounded to the data type first (NCCL's
     * __float2half(float(1.0/n)) and likewise), so scalar_f is exactly the value
     * the GPU multiplies by. */
    double scalar_f;
    uint64_t scalar_i;
};

/* Flags of plait_reduce_apply(). */
#define PLAIT_RED_PRE 1u  /* `a` is this rank's own input: apply the pre-op (scale) to it */
#define PLAIT_RED_POST 2u /* the result is final: apply the post-op (integer avg: divide by nranks) */

/* Fills r for (dtype, op, nranks). `scalar` points to one element of dtype for
 * premulsum (ignored otherwise). Returns PLAIT_ERR_INVALID_ARGUMENT for a bad
 * dtype/op (never crashes). */
plait_result_t plait_red_init(struct plait_red *r, int dtype, int op, const void *scalar, uint64_t nranks);

/* dst[i] = post(pre(a[i]) OP b[i]) for i < n, each of `pre`/`post` applied only
 * when its flag is set. With b == NULL: dst[i] = post(pre(a[i])) (a copy, possibly
 * transformed; a plain copy keeps the bits). dst may equal a or b exactly (no
 * partial overlap). Pointers need no particular alignment; the bulk runs
 * vectorised. n may be 0. `r` must have been filled by plait_red_init(). Does not
 * allocate, lock or log; thread-safe. NaN, signed-zero and saturation rules: see
 * the top of reduce.c. */
void plait_reduce_apply(const struct plait_red *r, void *dst, const void *a, const void *b, size_t n,
                        unsigned flags);

/* Whether plait_reduce_apply(r, dst, a, NULL, n, flags) is a plain copy of a's
 * bits (no pre-op or post-op takes effect): the executor may then send a
 * itself rather than a transformed copy (single copy). */
int plait_reduce_is_copy(const struct plait_red *r, unsigned flags);

/* Size in bytes of one element; 0 for an invalid type. */
size_t plait_dtype_size(int dtype);

/* Names for messages ("float32", "sum"); "invalid" when out of range. */
const char *plait_dtype_name(int dtype);
const char *plait_op_name(int op);

/* Scalar conversions, exposed for tests and for the perf tool's checks. Widening
 * is exact; narrowing rounds to nearest-even, subnormals included. fp16 and bf16
 * overflow to inf; any NaN narrows to the canonical 0x7fff (as CUDA does). */
float plait_half_to_float(uint16_t h);
uint16_t plait_float_to_half(float f);
float plait_bf16_to_float(uint16_t h);
uint16_t plait_float_to_bf16(float f);
float plait_e4m3_to_float(uint8_t v);
uint8_t plait_float_to_e4m3(float f); /* saturating to +-448 (+-inf too), any NaN -> 0x7f */
float plait_e5m2_to_float(uint8_t v);
uint8_t plait_float_to_e5m2(float f); /* saturating to +-57344 (as CUDA's __NV_SATFINITE), any NaN -> 0x7f */

#endif
