/* Group semantics: several collectives and point-to-point pairs in one group;
 * one thread driving groups over several communicators (NCCL's single-process
 * multi-rank pattern); nested groups. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"

#define N 1000

static int mixed_group(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    float a[N], a_out[N];
    int32_t b[N];
    double c[N], c_out[N * 8];
    int64_t s[N], r[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)(rank + i);
        b[i] = rank == 1 % n ? i * 3 : -1;
        c[i] = rank * 1000.0 + i;
        s[i] = rank * 100000 + i;
    }
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    plait_result_t res = PLAIT_SUCCESS;
#define TRY(x)                                                                                                  \
    if ((res = (x)) != PLAIT_SUCCESS) {                                                                         \
        snprintf(msg, len, "%s: %s", #x, plait_get_last_error(comm));                                           \
        return 1;                                                                                               \
    }
    TRY(plait_group_start());
    TRY(plait_allreduce(a, a_out, N, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL));
    TRY(plait_send(s, N, PLAIT_INT64, next, comm, NULL));
    TRY(plait_broadcast(b, b, N, PLAIT_INT32, 1 % n, comm, NULL));
    TRY(plait_recv(r, N, PLAIT_INT64, prev, comm, NULL));
    TRY(plait_allgather(c, c_out, N, PLAIT_FLOAT64, comm, NULL));
    TRY(plait_group_end());
    for (int i = 0; i < N; i++) {
        float want = (float)(n * i + n * (n - 1) / 2);
        if (a_out[i] != want) {
            snprintf(msg, len, "allreduce[%d] = %g, want %g", i, a_out[i], want);
            return 1;
        }
        if (b[i] != i * 3) {
            snprintf(msg, len, "broadcast[%d] = %d", i, b[i]);
            return 1;
        }
        if (r[i] != prev * 100000 + i) {
            snprintf(msg, len, "recv[%d] = %lld", i, (long long)r[i]);
            return 1;
        }
        for (int q = 0; q < n; q++)
            if (c_out[q * N + i] != q * 1000.0 + i) {
                snprintf(msg, len, "allgather block %d [%d] = %g", q, i, c_out[q * N + i]);
                return 1;
            }
    }
    return 0;
}

Test(group, mixed_collectives_and_p2p_processes, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SHM, 3, mixed_group, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

Test(group, mixed_collectives_and_p2p_sockets, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SOCKET, 4, mixed_group, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

Test(group, mixed_collectives_and_p2p_threads, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_THREADS, 5, mixed_group, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

/* Many point-to-point calls in one group: more tasks than the executor orders
 * on the stack (SMALL_RUN_TASKS, exec.c), so the lanes are ordered by its
 * hash; messages to one peer must still be matched in issue order, and the
 * collective in the middle must not be overtaken. */
#define NMSG 48

static int many_p2p_group(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    static _Thread_local int32_t s[NMSG][16], r[NMSG][16];
    float a[64], a_out[64];
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (int k = 0; k < NMSG; k++)
        for (int i = 0; i < 16; i++) {
            s[k][i] = rank * 1000000 + k * 100 + i;
            r[k][i] = -1;
        }
    for (int i = 0; i < 64; i++)
        a[i] = (float)(rank + i);
    plait_result_t res = PLAIT_SUCCESS;
    if ((res = plait_group_start()) != PLAIT_SUCCESS)
        goto fail;
    for (int k = 0; k < NMSG && res == PLAIT_SUCCESS; k++) {
        if (k == NMSG / 2)
            res = plait_allreduce(a, a_out, 64, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
        if (res == PLAIT_SUCCESS)
            res = plait_send(s[k], 16, PLAIT_INT32, next, comm, NULL);
        if (res == PLAIT_SUCCESS)
            res = plait_recv(r[k], 16, PLAIT_INT32, prev, comm, NULL);
    }
    if (res == PLAIT_SUCCESS)
        res = plait_group_end();
    if (res != PLAIT_SUCCESS)
        goto fail;
    for (int k = 0; k < NMSG; k++)
        for (int i = 0; i < 16; i++)
            if (r[k][i] != prev * 1000000 + k * 100 + i) {
                snprintf(msg, len, "message %d [%d] = %d, want %d (out of order?)", k, i, r[k][i],
                         prev * 1000000 + k * 100 + i);
                return 1;
            }
    for (int i = 0; i < 64; i++)
        if (a_out[i] != (float)(n * i + n * (n - 1) / 2)) {
            snprintf(msg, len, "allreduce[%d] = %g", i, a_out[i]);
            return 1;
        }
    return 0;
fail:
    snprintf(msg, len, "%s: %s", plait_get_error_string(res), plait_get_last_error(comm));
    return 1;
}

Test(group, many_p2p_in_one_group_processes, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SHM, 3, many_p2p_group, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

Test(group, many_p2p_in_one_group_threads, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_THREADS, 4, many_p2p_group, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

/* One thread, every rank of two communicators, one group: the pattern that
 * must not deadlock (each rank's call would block alone). */
Test(group, one_thread_drives_two_communicators, .timeout = 120)
{
    enum { R = 4, M = 100000 };
    plait_comm_t ca[R], cb[R];
    cr_assert_eq(plait_comm_init_all(ca, R, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    cr_assert_eq(plait_comm_init_all(cb, R, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    static float in[R][M], out_a[R][M], out_b[R][M];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < M; i++)
            in[r][i] = (float)(r + 1);
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(plait_group_start(), PLAIT_SUCCESS);
        for (int r = 0; r < R; r++) {
            cr_assert_eq(plait_allreduce(in[r], out_a[r], M, PLAIT_FLOAT32, PLAIT_SUM, ca[r], NULL), PLAIT_SUCCESS);
            cr_assert_eq(plait_allreduce(in[r], out_b[r], M, PLAIT_FLOAT32, PLAIT_MAX, cb[r], NULL), PLAIT_SUCCESS);
        }
        cr_assert_eq(plait_group_end(), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
        for (int r = 0; r < R; r++)
            for (int i = 0; i < M; i += 997) {
                cr_assert_float_eq(out_a[r][i], 10.0f, 0, "round %d rank %d sum", round, r);
                cr_assert_float_eq(out_b[r][i], 4.0f, 0, "round %d rank %d max", round, r);
            }
    }
    for (int r = 0; r < R; r++) {
        plait_comm_destroy(ca[r]);
        plait_comm_destroy(cb[r]);
    }
}

/* Nested groups launch at the outermost end; a send/recv exchange between two
 * ranks driven from one thread only works if both are in one launch. */
Test(group, nested_groups_launch_at_the_outermost_end, .timeout = 60)
{
    plait_comm_t c[2];
    cr_assert_eq(plait_comm_init_all(c, 2, NULL), PLAIT_SUCCESS);
    static int64_t s0[1 << 20], s1[1 << 20], r0[1 << 20], r1[1 << 20];
    for (int i = 0; i < (1 << 20); i++) {
        s0[i] = i;
        s1[i] = -i;
    }
    cr_assert_eq(plait_group_start(), PLAIT_SUCCESS);
    cr_assert_eq(plait_group_start(), PLAIT_SUCCESS);
    cr_assert_eq(plait_send(s0, 1 << 20, PLAIT_INT64, 1, c[0], NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_recv(r0, 1 << 20, PLAIT_INT64, 1, c[0], NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_group_end(), PLAIT_SUCCESS);
    cr_assert_eq(plait_send(s1, 1 << 20, PLAIT_INT64, 0, c[1], NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_recv(r1, 1 << 20, PLAIT_INT64, 0, c[1], NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_group_end(), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    for (int i = 0; i < (1 << 20); i += 4099) {
        cr_assert_eq(r0[i], -i);
        cr_assert_eq(r1[i], i);
    }
    plait_comm_destroy(c[0]);
    plait_comm_destroy(c[1]);
}
