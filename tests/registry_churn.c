/* The handle registry (base/handle.c) under churn, for ThreadSanitizer (suite
 * tsan; Criterion's runner does not start under TSan, so tests/test_misuse.c's
 * registry_under_churn cannot run there): churner threads create and destroy
 * communicators (one rank; some aborted), streams and events, many live at
 * once so that the tables grow while readers walk them, while caller threads
 * use their own live handles (every call must succeed) and pass the handles
 * the churners destroyed and garbage pointers (every call must be refused).
 *
 * A stale handle is passed only to calls that another argument makes fail
 * after the handle check (a garbage stream or event, a NULL out-pointer), and
 * only of kinds destroyed too few times for its address to be a newer
 * object's (see below). Exits non-zero on a wrong result; TSan's report makes
 * the exit code 66 on a race. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "plait.h"

#define CHURNERS 3
#define CALLERS 2
#define ROUNDS 7
#define EVENTS0 32 /* events live at once per churner in the first round, twice as many in each next */
#define STREAMS 16 /* per churner, made over the rounds */
#define COMMS 3    /* one-rank communicators per round (the last is aborted) */
/* Stale handles are passed only of kinds destroyed fewer times than the
 * quarantine holds (64 per kind, base/handle.c): 3 x 7 x 3 = 63 communicators
 * and 3 x 16 (+ the callers' 2, at the end) streams, so no stale handle's
 * address can have gone to a newer object, which a caller would then read
 * while its owner destroys it. Events are destroyed by the thousand: only
 * garbage ones are passed. */
_Static_assert(CHURNERS * ROUNDS * COMMS < 64 && CHURNERS * STREAMS + CALLERS < 64, "within the quarantine");

static int failures;
static int churners_left = CHURNERS;
static int callers_ready;

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fprintf(stderr, " (%s)\n", plait_get_last_error(NULL));                                            \
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                                                \
        }                                                                                                      \
    } while (0)

/* The last handles a churner destroyed (0: none yet). */
static uintptr_t stale_comm, stale_stream;
/* Never handles: inside a static array and a page that is never mapped. */
static char garbage[256];

static void *churner(void *p)
{
    const int id = (int)(intptr_t)p;
    /* The tables grow while the callers run, not before. */
    while (__atomic_load_n(&callers_ready, __ATOMIC_ACQUIRE) < CALLERS)
        usleep(1000);
    plait_event_t *ev = malloc(sizeof(*ev) * (EVENTS0 << (ROUNDS - 1)));
    plait_stream_t st[STREAMS];
    int nst = 0;
    for (int round = 0; round < ROUNDS; round++) {
        /* Twice as many events live as the last round: the event table grows
         * (to 8192 slots by the last round) while the callers read it. */
        const int nev = EVENTS0 << round;
        for (int i = 0; i < nev; i++)
            CHECK(plait_event_create(&ev[i]) == PLAIT_SUCCESS, "churner %d: event_create", id);
        /* Streams stay live to the end (their table grows once, past 48). */
        for (const int want = STREAMS * (round + 1) / ROUNDS; nst < want; nst++)
            CHECK(plait_stream_create(&st[nst]) == PLAIT_SUCCESS, "churner %d: stream_create", id);
        for (int i = 0; i < nst; i++)
            CHECK(plait_event_record(ev[i], st[i]) == PLAIT_SUCCESS, "churner %d: event_record", id);
        for (int c = 0; c < COMMS; c++) {
            plait_comm_t comm;
            if (plait_comm_init_all(&comm, 1, NULL) != PLAIT_SUCCESS) {
                CHECK(0, "churner %d: comm_init_all", id);
                continue;
            }
            int x = 1, y = 0;
            CHECK(plait_allreduce(&x, &y, 1, PLAIT_INT32, PLAIT_SUM, comm, st[0]) == PLAIT_SUCCESS &&
                      plait_stream_synchronize(st[0]) == PLAIT_SUCCESS && y == 1,
                  "churner %d: allreduce on its own comm", id);
            CHECK((c == 1 ? plait_comm_abort(comm) : plait_comm_destroy(comm)) == PLAIT_SUCCESS,
                  "churner %d: comm %s", id, c == 1 ? "abort" : "destroy");
            __atomic_store_n(&stale_comm, (uintptr_t)comm, __ATOMIC_RELEASE);
        }
        for (int i = 0; i < nev; i++)
            CHECK(plait_event_destroy(ev[i]) == PLAIT_SUCCESS, "churner %d: event_destroy", id);
    }
    for (int i = 0; i < nst; i++) {
        CHECK(plait_stream_destroy(st[i]) == PLAIT_SUCCESS, "churner %d: stream_destroy", id);
        __atomic_store_n(&stale_stream, (uintptr_t)st[i], __ATOMIC_RELEASE);
    }
    free(ev);
    __atomic_sub_fetch(&churners_left, 1, __ATOMIC_ACQ_REL);
    return NULL;
}

/* A call that must be refused: any error but success or a crash. */
#define REFUSED(call, what)                                                                                    \
    do {                                                                                                       \
        plait_result_t r_ = (call);                                                                            \
        CHECK(r_ == PLAIT_ERR_INVALID_ARGUMENT || r_ == PLAIT_ERR_INVALID_USAGE,                               \
              "caller %d: %s with a stale or garbage handle returned %d", id, what, (int)r_);                  \
    } while (0)

static void *caller(void *p)
{
    const int id = (int)(intptr_t)p;
    plait_comm_t comm;
    plait_stream_t s;
    plait_event_t e;
    if (plait_comm_init_all(&comm, 1, NULL) != PLAIT_SUCCESS || plait_stream_create(&s) != PLAIT_SUCCESS ||
        plait_event_create(&e) != PLAIT_SUCCESS) {
        CHECK(0, "caller %d: setup", id);
        return NULL;
    }
    plait_stream_t bad_stream = (plait_stream_t)(void *)&garbage[16 * id];
    plait_event_t bad_event = (plait_event_t)(void *)&garbage[16 * id + 128];
    long calls = 0;
    __atomic_add_fetch(&callers_ready, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&churners_left, __ATOMIC_ACQUIRE) > 0 || calls < 200) {
        calls++;
        /* Live handles: never refused, whatever the tables do meanwhile. */
        float x[2] = {1, 2}, y[2] = {0, 0};
        CHECK(plait_allreduce(x, y, 2, PLAIT_FLOAT32, PLAIT_SUM, comm, s) == PLAIT_SUCCESS &&
                  plait_event_record(e, s) == PLAIT_SUCCESS && plait_event_synchronize(e) == PLAIT_SUCCESS &&
                  y[1] == 2.0f,
              "caller %d: call %ld on live handles", id, calls);
        /* Garbage handles. */
        REFUSED(plait_stream_synchronize(bad_stream), "stream_synchronize");
        REFUSED(plait_event_synchronize(bad_event), "event_synchronize");
        REFUSED(plait_comm_count((plait_comm_t)(void *)&garbage[64 + id], &(int){0}), "comm_count");
        REFUSED(plait_allreduce(x, y, 2, PLAIT_FLOAT32, PLAIT_SUM, comm, bad_stream), "allreduce");
        /* Stale handles (perhaps a newer object's address by now). */
        const uintptr_t sc = __atomic_load_n(&stale_comm, __ATOMIC_ACQUIRE);
        const uintptr_t ss = __atomic_load_n(&stale_stream, __ATOMIC_ACQUIRE);
        if (sc) {
            REFUSED(plait_comm_count((plait_comm_t)sc, NULL), "comm_count");
            REFUSED(plait_allreduce(x, y, 2, PLAIT_FLOAT32, PLAIT_SUM, (plait_comm_t)sc, bad_stream),
                    "allreduce");
        }
        if (ss)
            REFUSED(plait_stream_wait_event((plait_stream_t)ss, bad_event), "stream_wait_event");
        REFUSED(plait_event_record(bad_event, s), "event_record");
    }
    CHECK(plait_event_destroy(e) == PLAIT_SUCCESS && plait_stream_destroy(s) == PLAIT_SUCCESS &&
              plait_comm_destroy(comm) == PLAIT_SUCCESS,
          "caller %d: teardown", id);
    printf("caller %d: %ld rounds of calls\n", id, calls);
    return NULL;
}

int main(void)
{
    pthread_t ch[CHURNERS], ca[CALLERS];
    for (int i = 0; i < CALLERS; i++)
        pthread_create(&ca[i], NULL, caller, (void *)(intptr_t)i);
    for (int i = 0; i < CHURNERS; i++)
        pthread_create(&ch[i], NULL, churner, (void *)(intptr_t)i);
    for (int i = 0; i < CHURNERS; i++)
        pthread_join(ch[i], NULL);
    for (int i = 0; i < CALLERS; i++)
        pthread_join(ca[i], NULL);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("registry_churn ok\n");
    return 0;
}
