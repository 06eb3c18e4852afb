/* Rank threads for the CUDA tests on the test double (cuda_ranks.h). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tests/cuda_ranks.h"
#include "tests/harness.h"

struct cuda_ranks {
    int n;
    unsigned flags;
    plait_unique_id_t id;
    cuda_rank_fn fn;
    pthread_barrier_t barrier;
};

int cuda_stream_open(const struct plait_cu *cu, void **s, plait_stream_t *ps)
{
    return cu->StreamCreateWithPriority(s, PLAIT_CU_STREAM_NON_BLOCKING, 0) || plait_stream_from_cuda(*s, ps);
}

void cuda_stream_close(const struct plait_cu *cu, void *s, plait_stream_t ps)
{
    plait_stream_destroy(ps);
    cu->StreamDestroy(s);
}

static void *rank_thread(void *p)
{
    struct cuda_rank *e = p;
    const unsigned flags = e->sh->flags;
    void *ctx = NULL;
    e->result = 1;
    if ((flags & CUDA_RANKS_CONTEXT) && (e->cu->DevicePrimaryCtxRetain(&ctx, 0) || e->cu->CtxSetCurrent(ctx))) {
        snprintf(e->msg, sizeof(e->msg), "rank %d: no context", e->rank);
        goto out;
    }
    if (plait_comm_init_rank(&e->comm, e->n, e->sh->id, e->rank)) {
        snprintf(e->msg, sizeof(e->msg), "rank %d: init: %s", e->rank, plait_get_last_error(NULL));
        goto out;
    }
    if ((flags & CUDA_RANKS_STREAM) && cuda_stream_open(e->cu, &e->stream, &e->ps)) {
        snprintf(e->msg, sizeof(e->msg), "rank %d: stream: %s", e->rank, plait_get_last_error(NULL));
        goto out_comm;
    }
    e->result = e->sh->fn(e, e->msg, sizeof(e->msg));
    if (flags & CUDA_RANKS_STREAM)
        cuda_stream_close(e->cu, e->stream, e->ps);
out_comm:
    plait_comm_destroy(e->comm);
out:
    __atomic_store_n(&e->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

void cuda_run_ranks(int n, unsigned flags, cuda_rank_fn fn, void *arg, double timeout_s)
{
    const struct plait_cu *cu = plait_cu_get();
    cr_assert(cu && cu->is_double, "plait did not load the CUDA test double");
    cr_assert(n >= 1 && n <= CUDA_RANKS_MAX, "%d ranks", n);
    struct cuda_ranks sh;
    struct cuda_rank env[CUDA_RANKS_MAX];
    pthread_t tid[CUDA_RANKS_MAX];
    memset(&sh, 0, sizeof(sh));
    memset(env, 0, sizeof(env));
    sh.n = n;
    sh.flags = flags;
    sh.fn = fn;
    pthread_barrier_init(&sh.barrier, NULL, (unsigned)n);
    cr_assert_eq(plait_get_unique_id(&sh.id), PLAIT_SUCCESS);
    for (int r = 0; r < n; r++) {
        env[r].sh = &sh;
        env[r].cu = cu;
        env[r].rank = r;
        env[r].n = n;
        env[r].arg = arg;
        cr_assert_eq(pthread_create(&tid[r], NULL, rank_thread, &env[r]), 0);
    }
    const double deadline = mr_now() + timeout_s;
    for (int r = 0; r < n; r++) {
        while (!__atomic_load_n(&env[r].done, __ATOMIC_ACQUIRE)) {
            cr_assert(mr_now() < deadline, "rank %d still running after %.0f s", r, timeout_s);
            usleep(2000);
        }
        pthread_join(tid[r], NULL);
    }
    for (int r = 0; r < n; r++)
        cr_expect_eq(env[r].result, 0, "rank %d: %s", r, env[r].msg);
    pthread_barrier_destroy(&sh.barrier);
}

void cuda_rank_barrier(struct cuda_rank *e)
{
    pthread_barrier_wait(&e->sh->barrier);
}
