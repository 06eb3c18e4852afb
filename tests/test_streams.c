/* Host streams and events: calls on a stream return at once and run in issue
 * order on the stream's worker; synchronize and events wait for them. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "tests/harness.h"

enum { M = 1 << 18 };

static int stream_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    static __thread float x[M], y[M];
    plait_stream_t s;
    plait_event_t ev;
    if (plait_stream_create(&s) || plait_event_create(&ev)) {
        snprintf(msg, len, "create: %s", plait_get_last_error(NULL));
        return 1;
    }
    for (int i = 0; i < M; i++)
        x[i] = (float)(rank + 1);
    /* y = sum x, then y = sum y in place: the second depends on the first */
    if (plait_allreduce(x, y, M, PLAIT_FLOAT32, PLAIT_SUM, comm, s) ||
        plait_allreduce(y, y, M, PLAIT_FLOAT32, PLAIT_SUM, comm, s) || plait_event_record(ev, s)) {
        snprintf(msg, len, "enqueue: %s", plait_get_last_error(comm));
        return 1;
    }
    if (plait_event_synchronize(ev)) {
        snprintf(msg, len, "event sync: %s", plait_get_last_error(comm));
        return 1;
    }
    float want = (float)(n * (n * (n + 1) / 2));
    for (int i = 0; i < M; i += 101)
        if (y[i] != want) {
            snprintf(msg, len, "y[%d] = %g, want %g", i, y[i], want);
            return 1;
        }
    /* a second stream waits for an event recorded on the first */
    plait_stream_t s2;
    plait_event_t ev2;
    plait_stream_create(&s2);
    plait_event_create(&ev2);
    plait_allgather(x, y, M / n, PLAIT_FLOAT32, comm, s);
    plait_event_record(ev2, s);
    plait_stream_wait_event(s2, ev2);
    plait_allreduce(y, y, M, PLAIT_FLOAT32, PLAIT_MAX, comm, s2);
    plait_result_t r = plait_stream_synchronize(s2);
    if (r) {
        snprintf(msg, len, "stream sync: %s", plait_get_last_error(comm));
        return 1;
    }
    for (int q = 0; q < n; q++)
        if (y[q * (M / n)] != (float)(q + 1)) {
            snprintf(msg, len, "allgather+max block %d = %g", q, y[q * (M / n)]);
            return 1;
        }
    plait_stream_destroy(s);
    plait_stream_destroy(s2);
    plait_event_destroy(ev);
    plait_event_destroy(ev2);
    return 0;
}

Test(streams, ordered_on_a_stream_processes, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_SHM, 3, stream_rank, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

Test(streams, ordered_on_a_stream_threads, .timeout = 120)
{
    char msg[1024];
    cr_assert_eq(mr_run(MR_THREADS, 2, stream_rank, NULL, 100, msg, sizeof(msg)), 0, "%s", msg);
}

Test(streams, null_stream_event_is_complete)
{
    plait_event_t ev;
    cr_assert_eq(plait_event_create(&ev), PLAIT_SUCCESS);
    cr_assert_eq(plait_event_synchronize(ev), PLAIT_SUCCESS); /* never recorded */
    cr_assert_eq(plait_event_record(ev, NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_event_synchronize(ev), PLAIT_SUCCESS);
    cr_assert_eq(plait_stream_synchronize(NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_event_destroy(ev), PLAIT_SUCCESS);
    cr_assert_eq(plait_stream_create(NULL), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_event_create(NULL), PLAIT_ERR_INVALID_ARGUMENT);
}
