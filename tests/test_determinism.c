/* Determinism (docs/algorithms.md): the same call on the same communicator,
 * algorithm and chunking gives bit-identical results from run to run, and every
 * rank of an allreduce gets the same bits. Inputs are random floats, so the
 * result depends on the order of the reduction: a schedule that summed in a
 * different order on different ranks or runs would show. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "tests/harness.h"

enum { N = 300007 };

static int determinism_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    float *x = malloc(N * sizeof(float)), *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    float *all = malloc((size_t)n * N * sizeof(float));
    uint16_t *h = malloc(N * sizeof(uint16_t)), *ha = malloc(N * sizeof(uint16_t)), *hb = malloc(N * sizeof(uint16_t));
    unsigned seed = 12345u + (unsigned)rank * 7919u;
    for (int i = 0; i < N; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 1e3f;
        h[i] = (uint16_t)(0x3c00 + (seed >> 20) % 0x800); /* fp16 values in [1, 2) and above */
    }
    int bad = 0;
    for (int round = 0; round < 3 && !bad; round++) {
        if (plait_allreduce(x, a, N, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL) ||
            plait_allreduce(x, b, N, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL) ||
            plait_allreduce(h, ha, N, PLAIT_FLOAT16, PLAIT_SUM, comm, NULL) ||
            plait_allreduce(h, hb, N, PLAIT_FLOAT16, PLAIT_AVG, comm, NULL)) {
            snprintf(msg, len, "allreduce: %s", plait_get_last_error(comm));
            bad = 1;
            break;
        }
        if (memcmp(a, b, N * sizeof(float)) != 0) {
            snprintf(msg, len, "two identical float allreduces gave different bits (round %d)", round);
            bad = 1;
        }
        /* every rank has the same bits: gather everyone's result and compare */
        if (!bad && plait_allgather(a, all, N, PLAIT_FLOAT32, comm, NULL)) {
            snprintf(msg, len, "allgather: %s", plait_get_last_error(comm));
            bad = 1;
        }
        for (int q = 0; q < n && !bad; q++)
            if (memcmp(all + (size_t)q * N, a, N * sizeof(float)) != 0) {
                snprintf(msg, len, "rank %d's float sum differs from rank %d's", q, rank);
                bad = 1;
            }
        uint16_t *hall = (uint16_t *)all;
        if (!bad && plait_allgather(ha, hall, N, PLAIT_FLOAT16, comm, NULL)) {
            snprintf(msg, len, "allgather: %s", plait_get_last_error(comm));
            bad = 1;
        }
        for (int q = 0; q < n && !bad; q++)
            if (memcmp(hall + (size_t)q * N, ha, N * sizeof(uint16_t)) != 0) {
                snprintf(msg, len, "rank %d's fp16 sum differs from rank %d's", q, rank);
                bad = 1;
            }
    }
    free(x);
    free(a);
    free(b);
    free(all);
    free(h);
    free(ha);
    free(hb);
    return bad;
}

Test(determinism, threads_5, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_THREADS, 5, determinism_rank, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

Test(determinism, shm_3, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SHM, 3, determinism_rank, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

Test(determinism, socket_4, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SOCKET, 4, determinism_rank, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

/* Every allreduce algorithm of the table, forced: the same guarantees (the
 * allgather that compares the ranks' results keeps its default). */
Test(determinism, every_allreduce_algorithm, .timeout = 300)
{
    int tried = 0;
    for (int a = 0; a < PLAIT_ALGO_COUNT; a++) {
        const struct plait_algorithm *al = &plait_algorithms[a];
        if (!al->step || !al->supports(PLAIT_COLL_ALLREDUCE, 5))
            continue;
        char spec[64], msg[1024];
        snprintf(spec, sizeof(spec), "allreduce:%s", al->name);
        setenv("PLAIT_ALGO", spec, 1);
        int failed = mr_run(MR_THREADS, 5, determinism_rank, NULL, 100, msg, sizeof(msg));
        unsetenv("PLAIT_ALGO");
        cr_expect_eq(failed, 0, "%s: %s", al->name, msg);
        cr_log_info("allreduce:%s deterministic on 5 ranks", al->name);
        tried++;
    }
    cr_assert_geq(tried, 5, "only %d allreduce algorithms in the table", tried);
}
