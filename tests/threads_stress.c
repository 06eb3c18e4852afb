/* The threaded parts in one program, for ThreadSanitizer (Criterion's runner
 * does not start under TSan): ranks as threads doing collectives directly and
 * on host streams with events, one thread driving a group over two sets of
 * communicators, a non-blocking init polled from another thread, an abort
 * from another thread while a rank waits in a collective, and connections
 * made on first use by several threads of one rank at once (two stream
 * workers and the rank's own thread, in memory and over sockets). Exits non-zero on any
 * wrong result; TSan's report makes the exit code 66 on a race. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plait.h"

#define R 3
#define M 50000

static int failures;

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fprintf(stderr, " (%s)\n", plait_get_last_error(NULL));                                            \
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                                                \
        }                                                                                                      \
    } while (0)

struct rank_arg {
    plait_comm_t comm;
    int rank;
};

static void *rank_main(void *p)
{
    struct rank_arg *a = p;
    float *x = malloc(M * sizeof(float)), *y = malloc(M * sizeof(float)), *z = malloc(R * M * sizeof(float));
    for (int i = 0; i < M; i++)
        x[i] = (float)(a->rank + 1);
    CHECK(plait_allreduce(x, y, M, PLAIT_FLOAT32, PLAIT_SUM, a->comm, NULL) == PLAIT_SUCCESS && y[M - 1] == 6.0f,
          "rank %d allreduce", a->rank);
    plait_stream_t s1, s2;
    plait_event_t ev;
    plait_stream_create(&s1);
    plait_stream_create(&s2);
    plait_event_create(&ev);
    plait_allgather(x, z, M, PLAIT_FLOAT32, a->comm, s1);
    plait_event_record(ev, s1);
    plait_stream_wait_event(s2, ev);
    plait_allreduce(z, z, R * M, PLAIT_FLOAT32, PLAIT_MAX, a->comm, s2);
    CHECK(plait_stream_synchronize(s2) == PLAIT_SUCCESS && z[0] == 1.0f && z[2 * M] == 3.0f, "rank %d streams",
          a->rank);
    plait_event_destroy(ev);
    plait_stream_destroy(s1);
    plait_stream_destroy(s2);
    free(x);
    free(y);
    free(z);
    return NULL;
}

static void ranks_as_threads(void)
{
    plait_comm_t comms[R];
    CHECK(plait_comm_init_all(comms, R, NULL) == PLAIT_SUCCESS, "init_all");
    pthread_t th[R];
    struct rank_arg args[R];
    for (int r = 0; r < R; r++) {
        args[r] = (struct rank_arg){comms[r], r};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < R; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < R; r++)
        plait_comm_destroy(comms[r]);
}

static void one_thread_two_comm_sets(void)
{
    plait_comm_t a[R], b[R];
    CHECK(plait_comm_init_all(a, R, NULL) == PLAIT_SUCCESS && plait_comm_init_all(b, R, NULL) == PLAIT_SUCCESS,
          "init_all x2");
    int in[R], out_a[R], out_b[R];
    plait_group_start();
    for (int r = 0; r < R; r++) {
        in[r] = r + 1;
        plait_allreduce(&in[r], &out_a[r], 1, PLAIT_INT32, PLAIT_SUM, a[r], NULL);
        plait_allreduce(&in[r], &out_b[r], 1, PLAIT_INT32, PLAIT_MAX, b[r], NULL);
    }
    CHECK(plait_group_end() == PLAIT_SUCCESS, "group_end");
    for (int r = 0; r < R; r++)
        CHECK(out_a[r] == 6 && out_b[r] == 3, "group results rank %d", r);
    for (int r = 0; r < R; r++) {
        plait_comm_destroy(a[r]);
        plait_comm_destroy(b[r]);
    }
}

struct nb_arg {
    plait_unique_id_t id;
    int rank;
    plait_comm_t comm;
};

static void *nb_init(void *p)
{
    struct nb_arg *a = p;
    plait_config_t cfg = PLAIT_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    plait_result_t r = plait_comm_init_rank_config(&a->comm, 2, a->id, a->rank, &cfg);
    CHECK(r == PLAIT_IN_PROGRESS || r == PLAIT_SUCCESS, "nonblocking init %d", a->rank);
    return NULL;
}

static void nonblocking_init(void)
{
    struct nb_arg args[2];
    plait_unique_id_t id;
    CHECK(plait_get_unique_id(&id) == PLAIT_SUCCESS, "unique id");
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        args[r].id = id;
        args[r].rank = r;
        pthread_create(&th[r], NULL, nb_init, &args[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        plait_result_t st = PLAIT_IN_PROGRESS;
        for (int k = 0; k < 20000 && st == PLAIT_IN_PROGRESS; k++) {
            plait_comm_get_async_error(args[r].comm, &st);
            usleep(500);
        }
        CHECK(st == PLAIT_SUCCESS, "nonblocking init %d finished with %d", r, st);
    }
    /* Calls on the NULL stream of a non-blocking communicator run on its own
     * stream: issue both ranks' from this thread, then poll. */
    int in[2] = {5, 7}, out[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        plait_result_t res = plait_allreduce(&in[r], &out[r], 1, PLAIT_INT32, PLAIT_SUM, args[r].comm, NULL);
        CHECK(res == PLAIT_IN_PROGRESS || res == PLAIT_SUCCESS, "nonblocking allreduce %d returned %d", r, res);
    }
    for (int r = 0; r < 2; r++) {
        plait_result_t st = PLAIT_IN_PROGRESS;
        for (int k = 0; k < 20000 && st == PLAIT_IN_PROGRESS; k++) {
            plait_comm_get_async_error(args[r].comm, &st);
            usleep(500);
        }
        CHECK(st == PLAIT_SUCCESS && out[r] == 12, "nonblocking allreduce %d: state %d, result %d", r, st, out[r]);
    }
    for (int r = 0; r < 2; r++)
        plait_comm_destroy(args[r].comm);
}

struct abort_arg {
    plait_comm_t comm;
    plait_result_t result;
};

static void *waiter(void *p)
{
    struct abort_arg *a = p;
    int x = 1, y;
    a->result = plait_allreduce(&x, &y, 1, PLAIT_INT32, PLAIT_SUM, a->comm, NULL);
    return NULL;
}

static void abort_from_another_thread(void)
{
    plait_comm_t c[2];
    CHECK(plait_comm_init_all(c, 2, NULL) == PLAIT_SUCCESS, "init_all abort");
    struct abort_arg a = {c[0], PLAIT_SUCCESS};
    pthread_t th;
    pthread_create(&th, NULL, waiter, &a);
    usleep(50000);
    plait_comm_abort(c[0]);
    pthread_join(th, NULL);
    CHECK(a.result != PLAIT_SUCCESS, "aborted allreduce succeeded");
    plait_comm_destroy(c[1]);
}

/* ---------------------------------------------------------------- first uses from several threads */

#define P 5
#define PC 1000

struct fu_arg {
    plait_comm_t comm;
    int rank;
};

static void *first_use_main(void *p)
{
    struct fu_arg *a = p;
    const int r = a->rank;
    int32_t *s = malloc(sizeof(int32_t) * PC * 6), *got = malloc(sizeof(int32_t) * PC * 6);
    for (int i = 0; i < PC * 6; i++)
        s[i] = r * 1000000 + i;
    plait_stream_t s1, s2;
    plait_stream_create(&s1);
    plait_stream_create(&s2);
    /* stream 1: ring +-1, stream 2: +-2, this thread: an alltoall (all pairs) */
    plait_group_start();
    plait_send(s, PC, PLAIT_INT32, (r + 1) % P, a->comm, s1);
    plait_recv(got, PC, PLAIT_INT32, (r + P - 1) % P, a->comm, s1);
    plait_group_end();
    plait_group_start();
    plait_send(s + PC, PC, PLAIT_INT32, (r + 2) % P, a->comm, s2);
    plait_recv(got + PC, PC, PLAIT_INT32, (r + P - 2) % P, a->comm, s2);
    plait_group_end();
    int32_t *all_s = malloc(sizeof(int32_t) * PC * P), *all_r = malloc(sizeof(int32_t) * PC * P);
    for (int i = 0; i < PC * P; i++)
        all_s[i] = r * 1000000 + i;
    CHECK(plait_alltoall(all_s, all_r, PC, PLAIT_INT32, a->comm, NULL) == PLAIT_SUCCESS, "rank %d first-use alltoall",
          r);
    CHECK(plait_stream_synchronize(s1) == PLAIT_SUCCESS && plait_stream_synchronize(s2) == PLAIT_SUCCESS,
          "rank %d first-use streams", r);
    CHECK(got[0] == ((r + P - 1) % P) * 1000000 && got[PC] == ((r + P - 2) % P) * 1000000 + PC &&
              all_r[PC * ((r + 1) % P)] == ((r + 1) % P) * 1000000 + PC * r,
          "rank %d first-use results", r);
    plait_stream_destroy(s1);
    plait_stream_destroy(s2);
    free(s);
    free(got);
    free(all_s);
    free(all_r);
    return NULL;
}

static void first_use_from_threads(const char *transport)
{
    setenv("PLAIT_TRANSPORT", transport, 1);
    plait_comm_t comms[P];
    CHECK(plait_comm_init_all(comms, P, NULL) == PLAIT_SUCCESS, "init_all first use (%s)", transport);
    pthread_t th[P];
    struct fu_arg args[P];
    for (int r = 0; r < P; r++) {
        args[r] = (struct fu_arg){comms[r], r};
        pthread_create(&th[r], NULL, first_use_main, &args[r]);
    }
    for (int r = 0; r < P; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < P; r++)
        plait_comm_destroy(comms[r]);
    unsetenv("PLAIT_TRANSPORT");
}

int main(void)
{
    first_use_from_threads("auto");
    first_use_from_threads("socket");
    ranks_as_threads();
    one_thread_two_comm_sets();
    nonblocking_init();
    abort_from_another_thread();
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("threads_stress ok\n");
    return 0;
}
