#include "tests/coll_check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/reduce.h" /* scalar conversions only (tested on their own in test_reduce) */

static const size_t sizes[PLAIT_NUM_TYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const char *const type_names[PLAIT_NUM_TYPES] = {"int8",    "uint8",   "int32",    "uint32",
                                                        "int64",   "uint64",  "float16",  "float32",
                                                        "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
static const char *const op_names[CC_NUM_OPS] = {"sum", "prod", "max", "min", "avg", "premulsum"};

size_t cc_size(int dtype)
{
    return sizes[dtype];
}

int cc_is_float(int dtype)
{
    return dtype >= PLAIT_FLOAT16;
}

const char *cc_type_name(int dtype)
{
    return type_names[dtype];
}

const char *cc_op_name(int op)
{
    return op_names[op];
}

static int is_signed(int dtype)
{
    return dtype == PLAIT_INT8 || dtype == PLAIT_INT32 || dtype == PLAIT_INT64;
}

static uint64_t mask_of(int dtype)
{
    size_t s = sizes[dtype];
    return s == 8 ? ~0ull : ((1ull << (8 * s)) - 1);
}

static int64_t as_signed(uint64_t v, int dtype)
{
    size_t bits = 8 * sizes[dtype];
    if (bits == 64)
        return (int64_t)v;
    uint64_t sign = 1ull << (bits - 1);
    v &= mask_of(dtype);
    return (int64_t)((v ^ sign) - sign);
}

/* Integer inputs: arbitrary bits (wrapping arithmetic is order-independent). */
static uint64_t int_value(int rank, size_t i)
{
    uint64_t k = (uint64_t)(i % CC_PERIOD);
    return (k * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(rank + 1) * 0xC2B2AE3D27D4EB4Full) ^ (k << 7);
}

/* Float inputs: small integers, exact in every type and in every partial result. */
static double float_value(int op, int rank, size_t i)
{
    size_t k = i % CC_PERIOD;
    switch (op) {
    case PLAIT_PROD:
        return (((k + (size_t)rank) % 2) ? -1.0 : 1.0) * (((k + 2 * (size_t)rank) % 5 == 0) ? 2.0 : 1.0);
    case PLAIT_MAX:
    case PLAIT_MIN:
        return (double)((k * 5 + (size_t)rank * 3) % 9) - 4.0;
    default:
        return (double)((k + (size_t)rank) % 3) - 1.0;
    }
}

static void store_float(void *buf, size_t i, int dtype, double v)
{
    switch (dtype) {
    case PLAIT_FLOAT16: ((uint16_t *)buf)[i] = plait_float_to_half((float)v); break;
    case PLAIT_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case PLAIT_FLOAT64: ((double *)buf)[i] = v; break;
    case PLAIT_BFLOAT16: ((uint16_t *)buf)[i] = plait_float_to_bf16((float)v); break;
    case PLAIT_FLOAT8_E4M3: ((uint8_t *)buf)[i] = plait_float_to_e4m3((float)v); break;
    case PLAIT_FLOAT8_E5M2: ((uint8_t *)buf)[i] = plait_float_to_e5m2((float)v); break;
    }
}

static double load_float(const void *buf, size_t i, int dtype)
{
    switch (dtype) {
    case PLAIT_FLOAT16: return plait_half_to_float(((const uint16_t *)buf)[i]);
    case PLAIT_FLOAT32: return ((const float *)buf)[i];
    case PLAIT_FLOAT64: return ((const double *)buf)[i];
    case PLAIT_BFLOAT16: return plait_bf16_to_float(((const uint16_t *)buf)[i]);
    case PLAIT_FLOAT8_E4M3: return plait_e4m3_to_float(((const uint8_t *)buf)[i]);
    default: return plait_e5m2_to_float(((const uint8_t *)buf)[i]);
    }
}

static void store_int(void *buf, size_t i, int dtype, uint64_t v)
{
    switch (sizes[dtype]) {
    case 1: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case 4: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    default: ((uint64_t *)buf)[i] = v; break;
    }
}

static uint64_t load_int(const void *buf, size_t i, int dtype)
{
    switch (sizes[dtype]) {
    case 1: return ((const uint8_t *)buf)[i];
    case 4: return ((const uint32_t *)buf)[i];
    default: return ((const uint64_t *)buf)[i];
    }
}

void cc_premul_scalar(int dtype, void *out)
{
    if (cc_is_float(dtype))
        store_float(out, 0, dtype, 2.0);
    else
        store_int(out, 0, dtype, 3);
}

/* buf[0..bytes) holds a pattern of period `period` bytes in its first
 * min(bytes, period) bytes: copies it over the rest, doubling. */
static void tile(unsigned char *buf, size_t bytes, size_t period)
{
    size_t done = period;
    while (done < bytes) {
        size_t n = bytes - done < done ? bytes - done : done;
        memcpy(buf + done, buf, n);
        done += n;
    }
}

/* Every input is periodic in the element index (period CC_PERIOD): the first
 * period is written element by element, the rest copied from it. */
void cc_fill(void *buf, size_t count, int dtype, int op, int rank, size_t base)
{
    const size_t first = count < CC_PERIOD ? count : CC_PERIOD;
    if (cc_is_float(dtype)) {
        double period[CC_PERIOD];
        for (size_t k = 0; k < CC_PERIOD; k++)
            period[k] = float_value(op, rank, k);
        for (size_t i = 0; i < first; i++)
            store_float(buf, i, dtype, period[(base + i) % CC_PERIOD]);
    } else {
        for (size_t i = 0; i < first; i++)
            store_int(buf, i, dtype, int_value(rank, base + i));
    }
    tile(buf, count * sizes[dtype], CC_PERIOD * sizes[dtype]);
}

void cc_expect_init(struct cc_expect *e, int dtype, int op, int nranks)
{
    e->dtype = dtype;
    e->op = op;
    e->nranks = nranks;
    e->tol = 0;
    for (size_t k = 0; k < CC_PERIOD; k++) {
        if (cc_is_float(dtype)) {
            double acc = float_value(op, 0, k);
            if (op == CC_PREMUL)
                acc *= 2.0;
            for (int r = 1; r < nranks; r++) {
                double v = float_value(op, r, k);
                switch (op) {
                case PLAIT_PROD: acc *= v; break;
                case PLAIT_MAX: acc = v > acc ? v : acc; break;
                case PLAIT_MIN: acc = v < acc ? v : acc; break;
                case CC_PREMUL: acc += 2.0 * v; break;
                default: acc += v; break;
                }
            }
            if (op == PLAIT_AVG)
                acc /= nranks;
            e->f[k] = acc;
        } else {
            const uint64_t m = mask_of(dtype);
            uint64_t acc = int_value(0, k) & m;
            if (op == CC_PREMUL)
                acc = (acc * 3) & m;
            for (int r = 1; r < nranks; r++) {
                uint64_t v = int_value(r, k) & m;
                switch (op) {
                case PLAIT_PROD: acc = (acc * v) & m; break;
                case PLAIT_MAX:
                    if (is_signed(dtype) ? as_signed(v, dtype) > as_signed(acc, dtype) : v > acc)
                        acc = v;
                    break;
                case PLAIT_MIN:
                    if (is_signed(dtype) ? as_signed(v, dtype) < as_signed(acc, dtype) : v < acc)
                        acc = v;
                    break;
                case CC_PREMUL: acc = (acc + v * 3) & m; break;
                default: acc = (acc + v) & m; break;
                }
            }
            if (op == PLAIT_AVG) {
                if (is_signed(dtype))
                    acc = (uint64_t)(as_signed(acc, dtype) / (int64_t)nranks) & m;
                else
                    acc = acc / (uint64_t)nranks;
            }
            e->u[k] = acc;
        }
    }
    if (op == PLAIT_AVG && cc_is_float(dtype)) {
        static const double eps[PLAIT_NUM_TYPES] = {0, 0, 0, 0, 0, 0, 0x1p-10, 0x1p-23, 0x1p-52, 0x1p-7, 0x1p-3, 0x1p-2};
        e->tol = (nranks + 1) * eps[dtype] * 2.0;
    }
}

static size_t check_slow(const struct cc_expect *e, const void *buf, size_t from, size_t to, size_t base,
                         size_t bad, char *msg, size_t len)
{
    for (size_t i = from; i < to; i++) {
        size_t k = (base + i) % CC_PERIOD;
        int ok;
        if (cc_is_float(e->dtype)) {
            double got = load_float(buf, i, e->dtype);
            ok = fabs(got - e->f[k]) <= e->tol;
            if (!ok && bad == 0)
                snprintf(msg, len, "%s %s: element %zu is %g, expected %g", cc_type_name(e->dtype),
                         cc_op_name(e->op), i, got, e->f[k]);
        } else {
            uint64_t got = load_int(buf, i, e->dtype);
            ok = got == e->u[k];
            if (!ok && bad == 0)
                snprintf(msg, len, "%s %s: element %zu is 0x%llx, expected 0x%llx", cc_type_name(e->dtype),
                         cc_op_name(e->op), i, (unsigned long long)got, (unsigned long long)e->u[k]);
        }
        bad += !ok;
    }
    return bad;
}

/* Each element is checked against the expectation for its index mod
 * CC_PERIOD. The first period is checked element by element; when all of it
 * is right, a later period whose bytes equal it is right too (same indices mod
 * the period, same values), and only a period that differs is checked element
 * by element. The count and the first mismatch are those of checking every
 * element. */
size_t cc_check(const struct cc_expect *e, const void *buf, size_t count, size_t base, char *msg, size_t len)
{
    const size_t first = count < CC_PERIOD ? count : CC_PERIOD;
    const size_t es = sizes[e->dtype];
    const unsigned char *b = buf;
    size_t bad = check_slow(e, buf, 0, first, base, 0, msg, len);
    for (size_t i = first; i < count; i += CC_PERIOD) {
        const size_t n = count - i < CC_PERIOD ? count - i : CC_PERIOD;
        if (bad || memcmp(b + i * es, b, n * es) != 0)
            bad = check_slow(e, buf, i, i + n, base, bad, msg, len);
    }
    return bad;
}

static inline uint8_t byte_at(int rank, size_t j)
{
    return (uint8_t)(j * 131u + (size_t)rank * 29u + (j >> 9) + 7u);
}

/* byte_at is periodic in the byte index: j * 131 and j >> 9 both move by a
 * multiple of 256 when j moves by 2^17. */
#define CC_BYTE_PERIOD ((size_t)1 << 17)

void cc_fill_bytes(void *buf, size_t bytes, int rank, size_t base)
{
    uint8_t *b = buf;
    const size_t first = bytes < CC_BYTE_PERIOD ? bytes : CC_BYTE_PERIOD;
    for (size_t j = 0; j < first; j++)
        b[j] = byte_at(rank, base + j);
    tile(buf, bytes, CC_BYTE_PERIOD);
}

static size_t check_bytes_slow(const uint8_t *b, size_t from, size_t to, int rank, size_t base, size_t bad,
                               char *msg, size_t len)
{
    for (size_t j = from; j < to; j++)
        if (b[j] != byte_at(rank, base + j)) {
            if (!bad)
                snprintf(msg, len, "byte %zu is 0x%02x, expected 0x%02x (from rank %d)", j, b[j],
                         byte_at(rank, base + j), rank);
            bad++;
        }
    return bad;
}

/* As cc_check: the first period byte by byte, a later one by comparing it
 * with the first when that was all right. */
size_t cc_check_bytes(const void *buf, size_t bytes, int rank, size_t base, char *msg, size_t len)
{
    const uint8_t *b = buf;
    const size_t first = bytes < CC_BYTE_PERIOD ? bytes : CC_BYTE_PERIOD;
    size_t bad = check_bytes_slow(b, 0, first, rank, base, 0, msg, len);
    for (size_t j = first; j < bytes; j += CC_BYTE_PERIOD) {
        const size_t n = bytes - j < CC_BYTE_PERIOD ? bytes - j : CC_BYTE_PERIOD;
        if (bad || memcmp(b + j, b, n) != 0)
            bad = check_bytes_slow(b, j, j + n, rank, base, bad, msg, len);
    }
    return bad;
}
