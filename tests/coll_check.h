/* Inputs and expected outputs for collective tests, per type and op.
 *
 * Inputs are periodic in the element index (period CC_PERIOD), so the expected
 * result of a reduction depends only on (index mod period) and is computed once
 * per call in a table, by a reference reduction written independently of plait:
 * integers in wrapping 64-bit arithmetic truncated to the type, floats as small
 * integers whose sums and products are exact in every type (so the order of the
 * reduction does not matter), except avg, checked within a tolerance. */
#ifndef PLAIT_TEST_COLL_CHECK_H
#define PLAIT_TEST_COLL_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"

#define CC_PERIOD 90
#define CC_NUM_OPS 6 /* sum, prod, max, min, avg, premulsum */
#define CC_PREMUL 5

size_t cc_size(int dtype);
int cc_is_float(int dtype);
const char *cc_type_name(int dtype);
const char *cc_op_name(int op);

/* Writes element i of rank r's input for (dtype, op) into buf[i]. */
void cc_fill(void *buf, size_t count, int dtype, int op, int rank, size_t index_base);

/* The premulsum scalar for dtype (one element of dtype, in *out). */
void cc_premul_scalar(int dtype, void *out);

struct cc_expect {
    int dtype, op, nranks;
    double f[CC_PERIOD];     /* float types: exact value */
    uint64_t u[CC_PERIOD];   /* integer types: bits truncated to the type */
    double tol;
};

void cc_expect_init(struct cc_expect *e, int dtype, int op, int nranks);

/* Counts mismatches of buf[0..count) against the expectation for indices
 * index_base + i. Writes the first mismatch's description into msg. */
size_t cc_check(const struct cc_expect *e, const void *buf, size_t count, size_t index_base, char *msg, size_t len);

/* Data-movement collectives: byte pattern of rank r at byte offset j. */
void cc_fill_bytes(void *buf, size_t bytes, int rank, size_t byte_base);
size_t cc_check_bytes(const void *buf, size_t bytes, int rank, size_t byte_base, char *msg, size_t len);

#endif
