/* plait_barrier keeps every rank in until every rank has entered, with each
 * barrier algorithm (PLAIT_ALGO=barrier:ring, barrier:dissemination, and the
 * default), on 1, 2, 3, 5 and 8 ranks, as threads and as processes over shared
 * memory (and the default over sockets).
 *
 * Every rank counts itself into a counter per round (memory shared by the
 * threads, or by the forked processes: a MAP_SHARED mapping made before the
 * fork), then calls plait_barrier; when it returns, the counter must already
 * hold every rank. One rank per round, a different one each time, arrives
 * late, so a barrier that let ranks through early would be caught leaving
 * before that rank came. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "tests/harness.h"

#define ROUNDS 12
#define LATE_NS 20000000L /* how late the late rank of a round comes: 20 ms */

struct barrier_state {
    int entered[ROUNDS];
};

static int barrier_rank(plait_comm_t comm, int rank, int nranks, void *arg, char *msg, size_t len)
{
    struct barrier_state *s = arg;
    for (int k = 0; k < ROUNDS; k++) {
        if (rank == k % nranks) {
            const struct timespec late = {.tv_sec = 0, .tv_nsec = LATE_NS};
            nanosleep(&late, NULL);
        }
        __atomic_add_fetch(&s->entered[k], 1, __ATOMIC_SEQ_CST);
        plait_result_t res = plait_barrier(comm, NULL);
        if (res != PLAIT_SUCCESS) {
            snprintf(msg, len, "rank %d: barrier %d: %s: %s", rank, k, plait_get_error_string(res),
                     plait_get_last_error(comm));
            return 1;
        }
        const int seen = __atomic_load_n(&s->entered[k], __ATOMIC_SEQ_CST);
        if (seen != nranks) {
            snprintf(msg, len, "rank %d left barrier %d when %d of %d ranks had entered it (rank %d came late)", rank,
                     k, seen, nranks, k % nranks);
            return 1;
        }
    }
    return 0;
}

/* algo NULL: the default rule's choice (dissemination on one host). */
static void run_barriers(const char *algo, enum mr_mode mode)
{
    static const int ranks[] = {1, 2, 3, 5, 8};
    char spec[64];
    snprintf(spec, sizeof(spec), "barrier:%s", algo ? algo : "auto");
    if (algo)
        setenv("PLAIT_ALGO", spec, 1);
    else
        unsetenv("PLAIT_ALGO");
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
        struct barrier_state *s =
            mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        cr_assert_neq(s, MAP_FAILED, "mmap: %s", strerror(errno));
        memset(s, 0, sizeof(*s));
        char msg[1024] = "";
        const int failed = mr_run(mode, ranks[i], barrier_rank, s, 120, msg, sizeof(msg));
        munmap(s, sizeof(*s));
        cr_assert_eq(failed, 0, "%s barrier, %s, %d ranks: %d rank(s) failed: %s", spec, mr_mode_name(mode),
                     ranks[i], failed, msg);
    }
    unsetenv("PLAIT_ALGO");
}

Test(barrier, dissemination_threads, .timeout = 300)
{
    run_barriers("dissemination", MR_THREADS);
}

Test(barrier, dissemination_shm, .timeout = 300)
{
    run_barriers("dissemination", MR_SHM);
}

Test(barrier, ring_threads, .timeout = 300)
{
    run_barriers("ring", MR_THREADS);
}

Test(barrier, ring_shm, .timeout = 300)
{
    run_barriers("ring", MR_SHM);
}

Test(barrier, default_shm, .timeout = 300)
{
    run_barriers(NULL, MR_SHM);
}

Test(barrier, default_socket, .timeout = 300)
{
    run_barriers(NULL, MR_SOCKET);
}
