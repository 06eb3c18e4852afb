/* A collective larger than 2^31 elements: a 2-rank int8 in-place allreduce (sum)
 * of 2^31 + 67 elements, as threads of one process (init_all) and as processes
 * over shared memory. Catches 32-bit counts or offsets anywhere on the path
 * (schedule, executor, transports, reduction kernels).
 *
 * Rank r's element i is (int8)(i*7 + r*3), so the sum is (int8)(i*14 + 3) in
 * wrapping arithmetic; the check reads the first and last 4096 elements, those
 * around 2^31 and around every multiple of 2^28, and every 65537th element
 * (PLAIT_TEST_LARGE_FULL_CHECK=1: every element). Each rank needs a 2 GiB buffer. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tests/harness.h"

#define LARGE_COUNT (((size_t)1 << 31) + 67)
#define EDGE 4096

struct large_times {
    double fill_s[2], allreduce_s[2], check_s[2];
    size_t checked[2];
};

static int8_t expect_at(size_t i)
{
    return (int8_t)(uint8_t)(i * 14 + 3);
}

static void fill(int8_t *buf, size_t n, int rank)
{
    /* The pattern has period 256 in i: build one block, then copy it. */
    enum { BLOCK = 1 << 16 };
    for (size_t i = 0; i < BLOCK && i < n; i++)
        buf[i] = (int8_t)(uint8_t)(i * 7 + (size_t)rank * 3);
    for (size_t off = BLOCK; off < n; off += BLOCK)
        memcpy(buf + off, buf, n - off < BLOCK ? n - off : BLOCK);
}

/* Checks [lo, hi) (clamped); returns the number of wrong elements, the first in msg. */
static size_t check_range(const int8_t *buf, size_t n, size_t lo, size_t hi, size_t *checked, char *msg, size_t len)
{
    size_t bad = 0;
    if (hi > n)
        hi = n;
    for (size_t i = lo; i < hi; i++) {
        (*checked)++;
        if (buf[i] != expect_at(i)) {
            if (!bad)
                snprintf(msg, len, "element %zu is %d, expected %d", i, buf[i], expect_at(i));
            bad++;
        }
    }
    return bad;
}

static int large_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    struct large_times *t = arg;
    if (n != 2) {
        snprintf(msg, len, "expected 2 ranks, got %d", n);
        return 1;
    }
    int8_t *buf = mmap(NULL, LARGE_COUNT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        snprintf(msg, len, "cannot map %zu bytes", LARGE_COUNT);
        return 1;
    }
    /* Faulting in 2 GiB of small pages dominates the run on small machines. */
    madvise(buf, LARGE_COUNT, MADV_HUGEPAGE);
    double t0 = mr_now();
    fill(buf, LARGE_COUNT, rank);
    double t1 = mr_now();
    plait_result_t r = plait_allreduce(buf, buf, LARGE_COUNT, PLAIT_INT8, PLAIT_SUM, comm, NULL);
    double t2 = mr_now();
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, len, "allreduce of %zu int8: %s: %s", LARGE_COUNT, plait_get_error_string(r),
                 plait_get_last_error(comm));
        munmap(buf, LARGE_COUNT);
        return 1;
    }
    size_t bad = 0, checked = 0;
    char first[256] = "";
    bad += check_range(buf, LARGE_COUNT, 0, EDGE, &checked, first, sizeof(first));
    bad += check_range(buf, LARGE_COUNT, LARGE_COUNT - EDGE, LARGE_COUNT, &checked, first, sizeof(first));
    for (size_t b = (size_t)1 << 28; b <= ((size_t)1 << 31); b += (size_t)1 << 28)
        bad += check_range(buf, LARGE_COUNT, b - EDGE, b + EDGE, &checked, first, sizeof(first));
    for (size_t i = 0; i < LARGE_COUNT; i += 65537)
        bad += check_range(buf, LARGE_COUNT, i, i + 1, &checked, first, sizeof(first));
    const char *full = getenv("PLAIT_TEST_LARGE_FULL_CHECK");
    if (full && *full && *full != '0')
        bad += check_range(buf, LARGE_COUNT, 0, LARGE_COUNT, &checked, first, sizeof(first));
    double t3 = mr_now();
    munmap(buf, LARGE_COUNT);
    t->fill_s[rank] = t1 - t0;
    t->allreduce_s[rank] = t2 - t1;
    t->check_s[rank] = t3 - t2;
    t->checked[rank] = checked;
    if (bad) {
        snprintf(msg, len, "%zu of %zu checked elements wrong; first: %s", bad, checked, first);
        return 1;
    }
    return 0;
}

static void large_case(enum mr_mode mode)
{
    /* Shared with forked ranks: they report their times here. */
    struct large_times *t = mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(t, MAP_FAILED);
    memset(t, 0, sizeof(*t));
    struct mr_shm_set before;
    mr_shm_snapshot(&before);
    setenv("PLAIT_COLL_TIMEOUT", "500", 1);
    char msg[1024];
    double t0 = mr_now();
    int failed = mr_run(mode, 2, large_rank, t, 560, msg, sizeof(msg));
    double total = mr_now() - t0;
    cr_log_info("large int8 allreduce of %zu elements, %s: %.1f s in all; rank 0: fill %.1f s, allreduce %.1f s "
                "(%.2f GB/s), check %.2f s (%zu elements); rank 1: allreduce %.1f s",
                LARGE_COUNT, mr_mode_name(mode), total, t->fill_s[0], t->allreduce_s[0],
                t->allreduce_s[0] > 0 ? (double)LARGE_COUNT / t->allreduce_s[0] / 1e9 : 0.0, t->check_s[0],
                t->checked[0], t->allreduce_s[1]);
    fprintf(stderr, "test_large %s: allreduce of 2^31+67 int8 took %.1f s (rank 0), %.1f s (rank 1); %.1f s in all\n",
            mr_mode_name(mode), t->allreduce_s[0], t->allreduce_s[1], total);
    munmap(t, sizeof(*t));
    char names[1024];
    int left = mr_shm_new_entries(&before, names, sizeof(names));
    mr_shm_set_free(&before);
    cr_expect_eq(failed, 0, "%s: %d rank(s) failed: %s", mr_mode_name(mode), failed, msg);
    cr_expect_eq(left, 0, "%d /dev/shm entries left: %s", left, names);
}

Test(large, allreduce_int8_2g_threads, .timeout = 600)
{
    large_case(MR_THREADS);
}

Test(large, allreduce_int8_2g_shm, .timeout = 600)
{
    large_case(MR_SHM);
}
