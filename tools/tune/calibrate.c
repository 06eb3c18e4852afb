/* plait-tune --calibrate: the constants of tuning/model.h measured on this
 * machine (memory copies, reductions, flag ping-pongs, plait's own ping-pong,
 * streams and small collectives over shm, inproc and socket), written to a
 * constants file (docs/tuning.md, "Calibration"). The socket link is measured
 * over loopback, or with --netns between two network namespaces joined by a
 * veth (netns.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "base/env.h"
#include "core/reduce.h"
#include "core/settings.h"
#include "plait.h"
#include "tools/tune/tune.h"
#include "topology/topo.h"
#include "tuning/model.h"
#include "tuning/tuner.h"

/* ---------------------------------------------------------------- --calibrate
 *
 * Every measurement runs in processes or threads of its own, each with a
 * deadline; results come back through memory shared with the parent. Each
 * kind repeats `reps` times and the median is kept: a scheduler tick or a
 * page fault in one repetition does not move it. */

#define CAL_MAX_REPS 16
#define CAL_MAX_RANKS 4
#define CAL_DEADLINE_S 60.0
#define CAL_SLOT 131072 /* the FIFO slot (PLAIT_BUFFSIZE / PLAIT_NSLOTS by default) */

enum bench_kind { BENCH_PINGPONG = 0, BENCH_STREAM, BENCH_ALLREDUCE, BENCH_ALLGATHER, BENCH_REDUCESCATTER };

struct bench_spec {
    int kind;
    size_t bytes;
    int iters;
    int reps;
    bool is_pinned; /* every rank on one core */
};

struct bench_shared {
    _Atomic int id_ready;
    plait_unique_id_t id;
    _Atomic int failed;
    char msg[256];
    int nreps;
    double secs[CAL_MAX_REPS]; /* per operation, rank 0's view */
};

struct cal {
    bool is_quick;
    int ncores;
    int reps;
};

static void bench_fail(struct bench_shared *sh, const char *what, plait_result_t res, plait_comm_t comm)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&sh->failed, &expected, 1))
        snprintf(sh->msg, sizeof(sh->msg), "%s: %s (%s)", what, plait_get_error_string(res),
                 plait_get_last_error(comm));
}

/* One rank's part of a measurement on comm. Rank 0 writes the per-operation
 * times of each repetition. */
static int bench_rank(plait_comm_t comm, int rank, int nranks, const struct bench_spec *s, struct bench_shared *sh)
{
    size_t bytes = s->bytes ? s->bytes : 8;
    char *sbuf = malloc(bytes), *rbuf = malloc(bytes);
    plait_result_t res = PLAIT_SUCCESS;
    if (!sbuf || !rbuf) {
        bench_fail(sh, "malloc", PLAIT_ERR_SYSTEM, comm);
        free(sbuf);
        free(rbuf);
        return 1;
    }
    memset(sbuf, 1, bytes);
    memset(rbuf, 0, bytes);
    const int peer = rank ^ 1;
    const int warm = s->iters / 10 + 2;
    for (int rep = -1; rep < s->reps; rep++) {
        if ((res = plait_barrier(comm, NULL)) != PLAIT_SUCCESS) {
            bench_fail(sh, "plait_barrier", res, comm);
            break;
        }
        const int iters = rep < 0 ? warm : s->iters;
        double t0 = tune_now_s();
        for (int i = 0; i < iters && res == PLAIT_SUCCESS; i++) {
            switch (s->kind) {
            case BENCH_PINGPONG:
                if (rank == 0) {
                    res = plait_send(sbuf, 8, PLAIT_UINT8, peer, comm, NULL);
                    if (res == PLAIT_SUCCESS)
                        res = plait_recv(rbuf, 8, PLAIT_UINT8, peer, comm, NULL);
                } else if (rank == 1) {
                    res = plait_recv(rbuf, 8, PLAIT_UINT8, peer, comm, NULL);
                    if (res == PLAIT_SUCCESS)
                        res = plait_send(sbuf, 8, PLAIT_UINT8, peer, comm, NULL);
                }
                break;
            case BENCH_STREAM: {
                res = plait_group_start();
                if (res == PLAIT_SUCCESS)
                    res = plait_send(sbuf, bytes, PLAIT_UINT8, peer, comm, NULL);
                if (res == PLAIT_SUCCESS)
                    res = plait_recv(rbuf, bytes, PLAIT_UINT8, peer, comm, NULL);
                plait_result_t end = plait_group_end();
                if (res == PLAIT_SUCCESS)
                    res = end;
                break;
            }
            case BENCH_ALLGATHER: /* bytes: the whole output, as nccl-tests' -b */
                res = plait_allgather(sbuf, rbuf, bytes / 4 / (size_t)nranks, PLAIT_FLOAT32, comm, NULL);
                break;
            case BENCH_REDUCESCATTER: /* bytes: the whole input */
                res = plait_reducescatter(sbuf, rbuf, bytes / 4 / (size_t)nranks, PLAIT_FLOAT32, PLAIT_SUM, comm,
                                          NULL);
                break;
            default:
                res = plait_allreduce(sbuf, rbuf, bytes / 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
                break;
            }
        }
        double t = tune_now_s() - t0;
        if (res != PLAIT_SUCCESS) {
            bench_fail(sh, s->kind == BENCH_PINGPONG ? "ping-pong" : s->kind == BENCH_STREAM ? "stream" : "allreduce",
                       res, comm);
            break;
        }
        if (rank == 0 && rep >= 0) {
            /* A ping-pong iteration is a round trip: half of it is one way. */
            sh->secs[rep] = t / iters / (s->kind == BENCH_PINGPONG ? 2 : 1);
            sh->nreps = rep + 1;
        }
    }
    free(sbuf);
    free(rbuf);
    return res == PLAIT_SUCCESS ? 0 : 1;
}

static int pin_to_first_cpu(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return -1;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &set)) {
            CPU_ZERO(&set);
            CPU_SET(c, &set);
            return sched_setaffinity(0, sizeof(set), &set);
        }
    }
    return -1;
}

/* Runs s on nranks forked processes; *out gets the median per-operation
 * seconds. env: "NAME=VALUE" pairs set for the children only (NULL ends).
 * nsfd: NULL, or per rank a network namespace (an open /var/run/netns file)
 * that the child enters before it initialises plait (the parent stays where
 * it is). */
static int bench_procs_in(int nranks, const struct bench_spec *s, const char *const *env, const int *nsfd, double *out,
                          char *why, size_t whylen)
{
    struct bench_shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        snprintf(why, whylen, "mmap: %s", strerror(errno));
        return -1;
    }
    memset(sh, 0, sizeof(*sh));
    pid_t pids[CAL_MAX_RANKS] = {0};
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    int started = 0;
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            snprintf(why, whylen, "fork: %s", strerror(errno));
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(1);
            if (nsfd && setns(nsfd[r], CLONE_NEWNET) != 0) {
                int expected = 0;
                if (atomic_compare_exchange_strong(&sh->failed, &expected, 1))
                    snprintf(sh->msg, sizeof(sh->msg), "rank %d: setns into its network namespace: %s", r,
                             strerror(errno));
                _exit(1);
            }
            for (int e = 0; env && env[e]; e++)
                putenv((char *)env[e]);
            if (s->is_pinned && pin_to_first_cpu() != 0) {
                bench_fail(sh, "sched_setaffinity", PLAIT_ERR_SYSTEM, NULL);
                _exit(1);
            }
            /* Rank 0 draws the id (its bootstrap root lives in rank 0), so
             * that the parent starts no thread and forks stay clean. */
            if (r == 0) {
                plait_result_t res = plait_get_unique_id(&sh->id);
                if (res != PLAIT_SUCCESS) {
                    bench_fail(sh, "plait_get_unique_id", res, NULL);
                    atomic_store(&sh->id_ready, -1);
                    _exit(1);
                }
                atomic_store(&sh->id_ready, 1);
            } else {
                double deadline = tune_now_s() + CAL_DEADLINE_S;
                while (atomic_load(&sh->id_ready) == 0 && tune_now_s() < deadline)
                    usleep(100);
                if (atomic_load(&sh->id_ready) != 1)
                    _exit(1);
            }
            plait_comm_t comm;
            plait_result_t res = plait_comm_init_rank(&comm, nranks, sh->id, r);
            if (res != PLAIT_SUCCESS) {
                bench_fail(sh, "plait_comm_init_rank", res, NULL);
                _exit(1);
            }
            int st = bench_rank(comm, r, nranks, s, sh);
            if (st == 0)
                plait_comm_finalize(comm);
            plait_comm_destroy(comm);
            _exit(st);
        }
        pids[r] = pid;
        started++;
    }
    /* Reap with a deadline: a rank stuck in a wait is killed, and so is the
     * rest of the run. */
    double deadline = tune_now_s() + CAL_DEADLINE_S;
    int failed = started < nranks;
    int live = started;
    bool is_killed = started < nranks;
    if (is_killed)
        for (int r = 0; r < started; r++)
            kill(pids[r], SIGKILL);
    while (live > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < started; r++) {
                if (pids[r] == p) {
                    pids[r] = 0;
                    live--;
                    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                        failed = 1;
                        if (!is_killed) {
                            for (int q = 0; q < started; q++)
                                if (pids[q])
                                    kill(pids[q], SIGKILL);
                            is_killed = true;
                        }
                    }
                }
            }
            continue;
        }
        if (p < 0 && errno != EINTR)
            break;
        if (!is_killed && tune_now_s() > deadline) {
            snprintf(why, whylen, "timed out after %.0f s", CAL_DEADLINE_S);
            for (int r = 0; r < started; r++)
                if (pids[r])
                    kill(pids[r], SIGKILL);
            is_killed = true;
            failed = 1;
        }
        usleep(1000);
    }
    if (failed && atomic_load(&sh->failed))
        snprintf(why, whylen, "%s", sh->msg);
    else if (failed && !why[0])
        snprintf(why, whylen, "a rank failed");
    if (!failed && sh->nreps == s->reps)
        *out = tune_median(sh->secs, sh->nreps);
    else
        failed = 1;
    munmap(sh, sizeof(*sh));
    return failed ? -1 : 0;
}

static int bench_procs(int nranks, const struct bench_spec *s, const char *const *env, double *out, char *why,
                       size_t whylen)
{
    return bench_procs_in(nranks, s, env, NULL, out, why, whylen);
}

/* ---- memory: copies and reductions, on min(cores, 2) threads at once */

enum mem_kind { MEM_SEND = 0, MEM_COPY, MEM_REDUCE };

struct mem_thread {
    int kind;
    size_t buf_bytes;
    int reps;
    pthread_barrier_t *bar;
    double secs[CAL_MAX_REPS]; /* per byte */
    int ok;
};

static void *mem_thread_main(void *p)
{
    struct mem_thread *t = p;
    const size_t fifo = 4 * CAL_SLOT;
    char *big = NULL, *big2 = NULL, *ring = NULL;
    t->ok = posix_memalign((void **)&big, 4096, t->buf_bytes) == 0 &&
            posix_memalign((void **)&big2, 4096, t->buf_bytes) == 0 && posix_memalign((void **)&ring, 4096, fifo) == 0;
    if (t->ok) {
        /* Touch every page first: the first pass must not time page faults. */
        memset(big, 1, t->buf_bytes);
        memset(big2, 2, t->buf_bytes);
        memset(ring, 3, fifo);
    }
    struct plait_red red;
    plait_red_init(&red, PLAIT_FLOAT32, PLAIT_SUM, NULL, 2);
    const size_t pieces = t->buf_bytes / CAL_SLOT;
    for (int rep = -1; rep < t->reps; rep++) {
        pthread_barrier_wait(t->bar);
        if (!t->ok)
            continue;
        double t0 = tune_now_s();
        for (size_t i = 0; i < pieces; i++) {
            char *slot = ring + (i % 4) * CAL_SLOT;
            char *piece = big + i * CAL_SLOT;
            switch (t->kind) {
            case MEM_SEND: /* buffer -> slot */
                memcpy(slot, piece, CAL_SLOT);
                break;
            case MEM_COPY: /* slot -> buffer */
                memcpy(piece, slot, CAL_SLOT);
                break;
            default: /* slot + own input -> output */
                plait_reduce_apply(&red, big2 + i * CAL_SLOT, piece, slot, CAL_SLOT / 4, 0);
                break;
            }
        }
        double t1 = tune_now_s();
        if (rep >= 0)
            t->secs[rep] = (t1 - t0) / (double)(pieces * CAL_SLOT);
    }
    free(big);
    free(big2);
    free(ring);
    return NULL;
}

static int mem_measure(int kind, int nthreads, size_t buf_bytes, int reps, double *out)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nthreads);
    struct mem_thread t[2];
    pthread_t th[2];
    for (int i = 0; i < nthreads; i++) {
        t[i] = (struct mem_thread){.kind = kind, .buf_bytes = buf_bytes, .reps = reps, .bar = &bar};
        pthread_create(&th[i], NULL, mem_thread_main, &t[i]);
    }
    int ok = 1;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        ok &= t[i].ok;
    }
    pthread_barrier_destroy(&bar);
    if (!ok)
        return -1;
    /* The slower thread of each repetition: ranks wait for each other. */
    double worst[CAL_MAX_REPS];
    for (int r = 0; r < reps; r++) {
        worst[r] = t[0].secs[r];
        for (int i = 1; i < nthreads; i++)
            if (t[i].secs[r] > worst[r])
                worst[r] = t[i].secs[r];
    }
    *out = tune_median(worst, reps);
    return 0;
}

/* ---- the flag ping-pong: one cache line each way, no plait
 *
 * Each repetition runs for a fixed time, not a fixed count: on a loaded
 * machine a round trip can cost a scheduler time slice, and a fixed count
 * could then take hours. Both sides spin, yielding now and then (always with
 * one core) so that a descheduled peer gets the core back; every wait has a
 * deadline. */

#define FLAG_STOP UINT64_MAX
#define FLAG_SPINS_BEFORE_YIELD 20000

struct flags {
    _Alignas(64) _Atomic uint64_t ping;
    _Alignas(64) _Atomic uint64_t pong;
};

/* Waits until *word == want; false when the deadline passes. */
static bool flag_wait(_Atomic uint64_t *word, uint64_t want, bool always_yield, double deadline)
{
    for (unsigned long spins = 0;; spins++) {
        if (atomic_load_explicit(word, memory_order_acquire) == want)
            return true;
        if (always_yield || spins % FLAG_SPINS_BEFORE_YIELD == FLAG_SPINS_BEFORE_YIELD - 1) {
            sched_yield();
            if (tune_now_s() > deadline)
                return false;
        }
    }
}

/* The responder: echoes every new ping until FLAG_STOP or the deadline. */
static void flag_responder(struct flags *f, bool always_yield)
{
    const double deadline = tune_now_s() + CAL_DEADLINE_S;
    uint64_t seen = 0;
    for (unsigned long spins = 0;; spins++) {
        uint64_t v = atomic_load_explicit(&f->ping, memory_order_acquire);
        if (v == FLAG_STOP)
            return;
        if (v != seen) {
            seen = v;
            atomic_store_explicit(&f->pong, v, memory_order_release);
            continue;
        }
        if (always_yield || spins % FLAG_SPINS_BEFORE_YIELD == FLAG_SPINS_BEFORE_YIELD - 1) {
            sched_yield();
            if (tune_now_s() > deadline)
                return;
        }
    }
}

struct flag_thread {
    struct flags *f;
    bool always_yield;
};

static void *flag_thread_main(void *p)
{
    struct flag_thread *t = p;
    flag_responder(t->f, t->always_yield);
    return NULL;
}

/* One-way latency: half the round trip, the median of `reps` repetitions of
 * rep_s seconds each. is_process: the responder is a forked process over
 * MAP_SHARED memory (shm), else a thread (inproc). */
static int flag_pingpong(bool is_process, double rep_s, int reps, bool always_yield, double *out)
{
    struct flags *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (f == MAP_FAILED)
        return -1;
    atomic_store(&f->ping, 0);
    atomic_store(&f->pong, 0);
    pid_t pid = -1;
    pthread_t th;
    struct flag_thread ft = {.f = f, .always_yield = always_yield};
    if (is_process) {
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0) {
            munmap(f, sizeof(*f));
            return -1;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            flag_responder(f, always_yield);
            _exit(0);
        }
    } else if (pthread_create(&th, NULL, flag_thread_main, &ft) != 0) {
        munmap(f, sizeof(*f));
        return -1;
    }
    double secs[CAL_MAX_REPS];
    uint64_t seq = 0;
    bool ok = true;
    const double deadline = tune_now_s() + CAL_DEADLINE_S;
    for (int rep = -1; rep < reps && ok; rep++) {
        const double t0 = tune_now_s();
        long trips = 0;
        double t = 0;
        do {
            for (int i = 0; i < 256 && ok; i++) {
                atomic_store_explicit(&f->ping, ++seq, memory_order_release);
                ok = flag_wait(&f->pong, seq, always_yield, deadline);
            }
            trips += 256;
            t = tune_now_s() - t0;
        } while (ok && t < rep_s);
        if (rep >= 0)
            secs[rep] = t / (double)trips / 2;
    }
    atomic_store_explicit(&f->ping, FLAG_STOP, memory_order_release);
    if (is_process) {
        if (!ok)
            kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    } else {
        pthread_join(th, NULL);
    }
    munmap(f, sizeof(*f));
    if (!ok)
        return -1;
    *out = tune_median(secs, reps);
    return 0;
}

/* ---- the calibration itself */

/* How busy the machine is while this process sleeps: the share of CPU time
 * /proc/stat counts as not idle over `secs`, or -1 when unknown. Other work
 * running during the calibration skews every figure (a ping-pong partner
 * waiting for a core pays a time slice), so the result is reported. */
static double machine_busy(double secs)
{
    unsigned long long v1[10] = {0}, v2[10] = {0};
    for (int pass = 0; pass < 2; pass++) {
        FILE *f = fopen("/proc/stat", "r");
        if (!f)
            return -1;
        unsigned long long *v = pass ? v2 : v1;
        int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                       &v[6], &v[7]);
        fclose(f);
        if (n < 5)
            return -1;
        if (!pass)
            usleep((useconds_t)(secs * 1e6));
    }
    unsigned long long total = 0, idle = (v2[3] - v1[3]) + (v2[4] - v1[4]);
    for (int i = 0; i < 8; i++)
        total += v2[i] - v1[i];
    return total ? (double)(total - idle) / (double)total : -1;
}

static void say(const char *key, double v, const char *unit_note, const char *how)
{
    if (strstr(key, "beta") || strstr(key, "gamma"))
        printf("  %-20s = %-12.4g s/B  (%7.2f GB/s)  %s%s\n", key, v, v > 0 ? 1e-9 / v : 0.0, how, unit_note);
    else if (strstr(key, "cache_bytes"))
        printf("  %-20s = %-12.4g B    (%8.1f MiB)  %s%s\n", key, v, v / 1048576.0, how, unit_note);
    else if (strstr(key, "factor") || strstr(key, "speedup"))
        printf("  %-20s = %-12.4g x                   %s%s\n", key, v, how, unit_note);
    else
        printf("  %-20s = %-12.4g s    (%8.3f us)   %s%s\n", key, v, v * 1e6, how, unit_note);
}

static void keep_default(const char *key, const char *why)
{
    printf("  %-20s   not measured (%s): keeps its default\n", key, why);
}

/* Fitting through the model. Per-byte engine costs and the hand-off are not
 * what a memcpy loop or a flag shows: the executor's copies run on data the
 * peer just wrote, between polls, in pieces. So they are set to the values at
 * which the model reproduces plait's own collectives, measured here
 * (docs/tuning.md, "Calibration"). */

/* The model's time for `bytes` (nccl-tests' -b: the whole buffer, the whole
 * output of an allgather, the whole input of a reducescatter) of coll by algo
 * with the simple protocol and the executor's defaults (what a forced
 * PLAIT_ALGO runs), on nranks ranks of this host over shm. NAN on failure. */
static double model_at(const struct plait_model_consts *k, int coll, int algo, int nranks, size_t bytes)
{
    const struct plait_topo *topo = NULL;
    if (plait_topo_get(&topo) != PLAIT_SUCCESS)
        topo = NULL;
    struct plait_model_machine m;
    if (plait_tune_machine_local(&m, nranks, PLAIT_MLINK_SHM, topo, k) != PLAIT_SUCCESS)
        return NAN;
    uint64_t count = bytes / 4;
    if (coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER)
        count /= (uint64_t)nranks;
    struct plait_model_call c;
    plait_model_call_init(&c, coll, count, 4, algo, PLAIT_MPROTO_SIMPLE);
    struct plait_model_result r;
    const double t = plait_model_time(&m, &c, PLAIT_MODEL_FULL, &r) == PLAIT_SUCCESS ? r.time_s : NAN;
    plait_model_machine_free(&m);
    return t;
}

/* Sets *slot (and *slot2 unless NULL) to the x in [lo, hi] at which the
 * model's time for the call equals `target` (bisection: the time grows with
 * x). When even a bound misses, x is that bound and *note says so. */
static double fit_constant(struct plait_model_consts *k, double *slot, double *slot2, double lo, double hi, int coll,
                           int algo, int nranks, size_t bytes, double target, const char **note)
{
    *note = "";
    /* Which way the time moves with x: probe both bounds. */
    *slot = lo;
    if (slot2)
        *slot2 = lo;
    const double t_lo = model_at(k, coll, algo, nranks, bytes);
    *slot = hi;
    if (slot2)
        *slot2 = hi;
    const double t_hi = model_at(k, coll, algo, nranks, bytes);
    const bool grows = !(t_hi < t_lo);
    for (int i = 0; i < 60; i++) {
        const double x = 0.5 * (lo + hi);
        *slot = x;
        if (slot2)
            *slot2 = x;
        const double t = model_at(k, coll, algo, nranks, bytes);
        if (!isfinite(t))
            break;
        if ((t < target) == grows)
            lo = x;
        else
            hi = x;
    }
    const double x = 0.5 * (lo + hi);
    *slot = x;
    if (slot2)
        *slot2 = x;
    const double t = model_at(k, coll, algo, nranks, bytes);
    if (isfinite(t) && fabs(t - target) > 0.02 * target)
        *note = t > target ? " (the model is slower than measured even at the bound)"
                           : " (the model is faster than measured even at the bound)";
    return x;
}

/* A host's last-level cache from sysfs (the highest cache level of cpu0),
 * or 0 when unknown. */
static double llc_bytes(void)
{
    double best = 0;
    int best_level = 0;
    for (int i = 0; i < 8; i++) {
        char path[96], buf[64];
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        int level = 0;
        if (fscanf(f, "%d", &level) != 1)
            level = 0;
        fclose(f);
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r")))
            continue;
        if (!fgets(buf, sizeof(buf), f))
            buf[0] = '\0';
        fclose(f);
        char *end = NULL;
        double v = strtod(buf, &end);
        if (end && (*end == 'K' || *end == 'k'))
            v *= 1024;
        else if (end && *end == 'M')
            v *= 1024 * 1024;
        if (level > best_level && v > 0) {
            best_level = level;
            best = v;
        }
    }
    return best;
}

/* Measures coll by algo (forced) with `bytes` on nranks processes; NAN on failure. */
static double measure_coll(int kind, const char *algo_env, int nranks, size_t bytes, int iters, int reps)
{
    const char *env[] = {algo_env, "PLAIT_PROTO=simple", NULL};
    struct bench_spec sp = {.kind = kind, .bytes = bytes, .iters = iters, .reps = reps};
    char why[300] = "";
    double v = NAN;
    if (bench_procs(nranks, &sp, env, &v, why, sizeof(why)) != 0) {
        printf("  %s on %d ranks, %zu B failed: %s\n", algo_env, nranks, bytes, why);
        return NAN;
    }
    printf("  %-28s %d ranks %9zu B: %10.2f us\n", algo_env, nranks, bytes, v * 1e6);
    return v;
}

/* One run of the joint refinement: a collective, forced, on this host. */
struct cal_point {
    int kind;            /* enum bench_kind */
    const char *env;     /* PLAIT_ALGO=... */
    int coll, algo, nranks;
    size_t bytes;
    double meas;         /* seconds, NAN when the run failed */
};

/* The spread of the model around the points: the mean of
 * log(model / measured)^2 over the points that ran. */
static double cal_cost(const struct plait_model_consts *k, const struct cal_point *pt, int n)
{
    double sum = 0;
    int used = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(pt[i].meas) || pt[i].meas <= 0)
            continue;
        const double t = model_at(k, pt[i].coll, pt[i].algo, pt[i].nranks, pt[i].bytes);
        if (!isfinite(t) || t <= 0)
            return INFINITY;
        const double e = log(t / pt[i].meas);
        sum += e * e;
        used++;
    }
    return used ? sum / used : INFINITY;
}

/* Coordinate descent on the logs of the constants in slots[] (each within
 * [lo, hi], *slot2s[i] kept equal to *slots[i] when set): a golden-section
 * search per constant, three sweeps. Returns the final cost. */
static double cal_refine(struct plait_model_consts *k, double *const *slots, double *const *slot2s, const double *lo,
                         const double *hi, int nslots, const struct cal_point *pt, int npt)
{
    const double g = 0.6180339887498949;
    double best = cal_cost(k, pt, npt);
    for (int sweep = 0; sweep < 3; sweep++) {
        for (int j = 0; j < nslots; j++) {
            const double keep = *slots[j];
            double a = log(lo[j]), b = log(hi[j]);
            double x1 = b - g * (b - a), x2 = a + g * (b - a);
#define CAL_SET(x)                      \
    do {                                \
        *slots[j] = exp(x);             \
        if (slot2s[j])                  \
            *slot2s[j] = exp(x);        \
    } while (0)
            CAL_SET(x1);
            double f1 = cal_cost(k, pt, npt);
            CAL_SET(x2);
            double f2 = cal_cost(k, pt, npt);
            for (int it = 0; it < 30; it++) {
                if (f1 < f2) {
                    b = x2;
                    x2 = x1;
                    f2 = f1;
                    x1 = b - g * (b - a);
                    CAL_SET(x1);
                    f1 = cal_cost(k, pt, npt);
                } else {
                    a = x1;
                    x1 = x2;
                    f1 = f2;
                    x2 = a + g * (b - a);
                    CAL_SET(x2);
                    f2 = cal_cost(k, pt, npt);
                }
            }
            const double x = f1 < f2 ? x1 : x2, f = f1 < f2 ? f1 : f2;
            if (f < best) {
                CAL_SET(x);
                best = f;
            } else {
                *slots[j] = keep;
                if (slot2s[j])
                    *slot2s[j] = keep;
            }
#undef CAL_SET
        }
    }
    return best;
}

static int calibrate(const struct tune_args *a, struct tune_netns *ns)
{
    struct cal c = {.is_quick = a->is_quick};
    cpu_set_t cs;
    c.ncores = sched_getaffinity(0, sizeof(cs), &cs) == 0 ? CPU_COUNT(&cs) : 1;
    c.reps = a->is_quick ? 5 : 9;
    const char *out = a->out ? a->out : DEFAULT_CONSTANTS_FILE;
    /* Refuse an unwritable path now, not after the measurements (and
     * without leaving an empty file behind). */
    {
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", out);
        char *slash = strrchr(dir, '/');
        if (slash == dir)
            slash[1] = '\0';
        else if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof(dir), ".");
        if (access(out, F_OK) == 0 ? access(out, W_OK) != 0 : access(dir, W_OK | X_OK) != 0)
            return tune_bad_input("--out %s: %s", out, strerror(errno));
    }

    /* The measurements set what they need; a user's own choices would skew them. */
    static const char *const cleared[] = {"PLAIT_ALGO",       "NCCL_ALGO",  "PLAIT_PROTO",       "NCCL_PROTO",
                                          "PLAIT_NCHANNELS",  "PLAIT_CMA",  "PLAIT_TRANSPORT",   "PLAIT_TUNE_FILE",
                                          "PLAIT_TUNE_CONSTANTS", "PLAIT_SPIN_US", "PLAIT_CHUNK_SIZE", "PLAIT_BUFFSIZE",
                                          "PLAIT_NSLOTS", "NCCL_BUFFSIZE"};
    for (size_t i = 0; i < sizeof(cleared) / sizeof(cleared[0]); i++) {
        if (getenv(cleared[i])) {
            printf("note: %s is ignored while calibrating\n", cleared[i]);
            unsetenv(cleared[i]);
        }
    }
    setenv("PLAIT_COLL_TIMEOUT", "30", 1);

    /* --netns: the namespaces first, so that a machine that cannot make them
     * is told now, not after the other measurements. */
    char nswhy[512];
    if (a->is_netns && tune_netns_create(ns, nswhy, sizeof(nswhy)) != 0)
        return tune_failure("--netns: %s", nswhy);
    char sock_mode[160];
    if (ns->is_on)
        snprintf(sock_mode, sizeof(sock_mode), "two network namespaces over a veth (%s %s <-> %s %s)", ns->name[0],
                 ns->addr[0], ns->name[1], ns->addr[1]);
    else
        snprintf(sock_mode, sizeof(sock_mode), "loopback (2 processes of this host)");

    struct plait_model_consts k;
    plait_model_consts_default(&k);
    const int C = PLAIT_MENGINE_CPU;
    const double t_start = tune_now_s();
    const int nthreads = c.ncores < 2 ? 1 : 2;
    char why[300];
    int nfailed = 0;
    char comment[2048];
    size_t clen = 0;
    comment[0] = '\0';

    printf("plait-tune --calibrate%s%s: %d %s available; medians of %d repetitions\n", a->is_quick ? " --quick" : "",
           ns->is_on ? " --netns" : "", c.ncores, c.ncores == 1 ? "core" : "cores", c.reps);
    printf("socket: %s\n", sock_mode);
    const double busy = machine_busy(0.2);
    if (busy > 0.15)
        printf("warning: the machine is busy (%.0f%% of its CPU time used by others while this tool slept):\n"
               "         every figure below will be skewed (a peer waiting for a core pays a time slice);\n"
               "         calibrate on a quiet machine\n",
               busy * 100);

    /* Memory: what the engine does per byte. */
    printf("\nmemory (%d thread%s at once, 128 KiB pieces over a %d MiB buffer, a 4-slot FIFO ring):\n", nthreads,
           nthreads == 1 ? "" : "s", 64);
    const size_t buf = 64u << 20;
    double v;
    if (mem_measure(MEM_SEND, nthreads, buf, c.reps, &v) == 0) {
        k.send_beta[C] = v;
        say("send_beta.cpu", v, "", "memcpy buffer -> slot, per byte");
    } else {
        keep_default("send_beta.cpu", "out of memory");
        nfailed++;
    }
    if (mem_measure(MEM_COPY, nthreads, buf, c.reps, &v) == 0) {
        k.copy_beta[C] = v;
        say("copy_beta.cpu", v, "", "memcpy slot -> buffer, per byte");
    } else {
        keep_default("copy_beta.cpu", "out of memory");
        nfailed++;
    }
    if (mem_measure(MEM_REDUCE, nthreads, buf, c.reps, &v) == 0) {
        k.gamma[C] = v;
        say("gamma.cpu", v, "", "plait_reduce_apply float sum, slot + input -> output, per byte");
    } else {
        keep_default("gamma.cpu", "out of memory");
        nfailed++;
    }

    /* Flags: the hardware's one-way latency. */
    printf("\nflag ping-pong (one cache line each way, half a round trip):\n");
    const bool may_yield = c.ncores < 2;
    const double flag_rep_s = a->is_quick ? 0.02 : 0.1;
    double alpha_shm = k.alpha[PLAIT_MLINK_SHM];
    if (flag_pingpong(true, flag_rep_s, c.reps, may_yield, &v) == 0) {
        k.alpha[PLAIT_MLINK_SHM] = alpha_shm = v;
        say("alpha.shm", v, may_yield ? " (one core: with sched_yield)" : "", "two processes over MAP_SHARED memory");
    } else {
        keep_default("alpha.shm", "fork failed, or the other process stopped answering");
        nfailed++;
    }
    if (flag_pingpong(false, flag_rep_s, c.reps, may_yield, &v) == 0) {
        k.alpha[PLAIT_MLINK_INPROC] = v;
        say("alpha.inproc", v, may_yield ? " (one core: with sched_yield)" : "", "two threads of one process");
    } else {
        keep_default("alpha.inproc", "pthread_create failed, or the other thread stopped answering");
        nfailed++;
    }

    /* plait's own small calls: call and step overheads. */
    printf("\nplait, 2 processes over shm:\n");
    const int pp_iters = a->is_quick ? 3000 : 10000;
    struct bench_spec pp = {.kind = BENCH_PINGPONG, .bytes = 8, .iters = pp_iters, .reps = c.reps};
    static const char *const env_ring[] = {"PLAIT_ALGO=allreduce:ring", "PLAIT_PROTO=simple", "PLAIT_NCHANNELS=1",
                                           NULL};
    double pp_shm = NAN, ring8 = NAN;
    why[0] = '\0';
    if (bench_procs(2, &pp, env_ring, &pp_shm, why, sizeof(why)) == 0)
        printf("  8 B send/recv ping-pong, half round trip: %.3f us  (= call + step + alpha.shm)\n", pp_shm * 1e6);
    else
        printf("  8 B ping-pong failed: %s\n", why);
    struct bench_spec ar8 = {.kind = BENCH_ALLREDUCE, .bytes = 8, .iters = pp_iters, .reps = c.reps};
    why[0] = '\0';
    if (bench_procs(2, &ar8, env_ring, &ring8, why, sizeof(why)) == 0)
        printf("  8 B ring allreduce, 1 channel, simple: %.3f us  (= call + 2 (step + alpha.shm) + tiny)\n",
               ring8 * 1e6);
    else
        printf("  8 B ring allreduce failed: %s\n", why);
    double step_plus_alpha = NAN, call = NAN, step = NAN;
    if (isfinite(pp_shm) && isfinite(ring8)) {
        step_plus_alpha = ring8 - pp_shm;
        call = pp_shm - step_plus_alpha; /* = 2 pp - ring */
        step = step_plus_alpha - alpha_shm;
        const char *note = "";
        if (step_plus_alpha <= 0 || call <= 0 || step <= 0)
            note = " (the fit gave a non-positive value: clamped)";
        if (step_plus_alpha <= 0)
            step_plus_alpha = pp_shm / 2;
        if (call <= 0)
            call = 0.1e-6;
        if (step <= 0)
            step = 0.05e-6;
        k.call_overhead[C] = call;
        k.step_overhead[C] = step;
        say("call_overhead.cpu", call, note, "2 x ping-pong - ring allreduce");
        say("step_overhead.cpu", step, note, "ring allreduce - ping-pong - alpha.shm");
    } else {
        keep_default("call_overhead.cpu", "a plait run failed");
        keep_default("step_overhead.cpu", "a plait run failed");
        nfailed += 2;
    }
    const double cpu_part = isfinite(call) ? call + step : NAN; /* what a ping-pong pays beside the wire */

    /* The wire between two cores is a cache line's trip: the bytes are
     * carried by the engines' copies (fitted below), so beta.shm and
     * beta.inproc only keep pieces in order: a rate well above a core's copy
     * rate. */
    k.beta[PLAIT_MLINK_SHM] = k.beta[PLAIT_MLINK_INPROC] = 1.0 / 100e9;
    say("beta.shm", k.beta[PLAIT_MLINK_SHM], "", "the engines' copies carry the bytes (set, not measured)");
    say("beta.inproc", k.beta[PLAIT_MLINK_INPROC], "", "the same between threads (set, not measured)");

    /* Engine per-byte costs, fitted through the model to plait's ring
     * collectives on 2 processes: a cached size (1 MiB), then one far beyond
     * the cache (64 MiB) for the memory factor. */
    printf("\nengine costs, fitted so that the model reproduces plait's ring on 2 processes:\n");
    const double llc = llc_bytes();
    if (llc > 0) {
        k.cache_bytes = llc;
        say("cache_bytes", llc, "", "the last-level cache of cpu0 (sysfs)");
    } else {
        keep_default("cache_bytes", "sysfs does not say");
    }
    const int it_small = a->is_quick ? 100 : 400, it_big = a->is_quick ? 3 : 10;
    const double ag1 = measure_coll(BENCH_ALLGATHER, "PLAIT_ALGO=allgather:ring", 2, 1u << 20, it_small, c.reps);
    const double rs1 = measure_coll(BENCH_REDUCESCATTER, "PLAIT_ALGO=reducescatter:ring", 2, 1u << 20, it_small,
                                    c.reps);
    const double ag64 = measure_coll(BENCH_ALLGATHER, "PLAIT_ALGO=allgather:ring", 2, 64u << 20, it_big, c.reps);
    const char *note = "";
    k.mem_factor[C] = 1.0; /* 1 MiB calls fit the cache: fit the cached rates first */
    if (isfinite(ag1)) {
        v = fit_constant(&k, &k.send_beta[C], &k.copy_beta[C], 0, 1e-8, PLAIT_COLL_ALLGATHER, PLAIT_ALGO_RING, 2,
                         1u << 20, ag1, &note);
        say("send_beta.cpu", v, note, "= copy_beta: the model's 1 MiB ring allgather = measured");
        say("copy_beta.cpu", v, note, "(an allgather only copies: into slots and out of them)");
    } else {
        keep_default("send_beta.cpu / copy_beta.cpu", "the allgather failed (memcpy figures kept)");
        nfailed += 2;
    }
    if (isfinite(rs1)) {
        v = fit_constant(&k, &k.gamma[C], NULL, 0, 1e-8, PLAIT_COLL_REDUCESCATTER, PLAIT_ALGO_RING, 2, 1u << 20, rs1,
                         &note);
        say("gamma.cpu", v, note, "the model's 1 MiB ring reducescatter = measured");
    } else {
        keep_default("gamma.cpu", "the reducescatter failed (the reduction loop's figure kept)");
        nfailed++;
    }
    /* Local steps (a rank's own buffers): one-shot allreduce receives every
     * peer's chunk into SCRATCH, then reduces locally. */
    const double os1 = measure_coll(BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:oneshot", 2, 1u << 20, it_small,
                                    c.reps);
    if (isfinite(os1)) {
        v = fit_constant(&k, &k.local_speedup[C], NULL, 1.0, 20.0, PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_ONESHOT, 2,
                         1u << 20, os1, &note);
        say("local_speedup.cpu", v, note, "the model's 1 MiB one-shot allreduce = measured");
    } else {
        keep_default("local_speedup.cpu", "the one-shot allreduce failed");
        nfailed++;
    }
    if (isfinite(ag64)) {
        v = fit_constant(&k, &k.mem_factor[C], NULL, 1.0, 10.0, PLAIT_COLL_ALLGATHER, PLAIT_ALGO_RING, 2, 64u << 20,
                         ag64, &note);
        say("mem_factor.cpu", v, note, "the model's 64 MiB ring allgather = measured");
    } else {
        k.mem_factor[C] = 2.0;
        keep_default("mem_factor.cpu", "the 64 MiB allgather failed");
        nfailed++;
    }

    /* TCP: over loopback, or (--netns) between two network namespaces over a
     * veth, rank 0 (and the bootstrap root) in A, rank 1 in B, both on the
     * veth (PLAIT_SOCKET_IFNAME names both ends). */
    printf("\nplait, 2 processes over TCP (PLAIT_TRANSPORT=socket; socket: %s):\n", sock_mode);
    const char *env_sock[] = {"PLAIT_TRANSPORT=socket", "PLAIT_PROTO=simple", "PLAIT_CMA=0",
                              ns->is_on ? ns->ifname_env : NULL, NULL};
    const int *sock_ns = ns->is_on ? ns->fd : NULL;
    double pp_sock = NAN;
    why[0] = '\0';
    if (bench_procs_in(2, &pp, env_sock, sock_ns, &pp_sock, why, sizeof(why)) == 0 && isfinite(cpu_part)) {
        printf("  8 B ping-pong, half round trip: %.3f us\n", pp_sock * 1e6);
        v = pp_sock - cpu_part;
        if (v <= 0)
            v = pp_sock / 2;
        k.alpha[PLAIT_MLINK_TCP] = v;
        say("alpha.socket", v, "", "ping-pong - call - step");
    } else {
        printf("  ping-pong failed: %s\n", why[0] ? why : "no call/step overheads to subtract");
        keep_default("alpha.socket", "the ping-pong failed");
        nfailed++;
    }
    const size_t stream_bytes = 16u << 20;
    struct bench_spec sst = {.kind = BENCH_STREAM, .bytes = stream_bytes, .iters = a->is_quick ? 3 : 16,
                             .reps = c.reps};
    why[0] = '\0';
    if (bench_procs_in(2, &sst, env_sock, sock_ns, &v, why, sizeof(why)) == 0) {
        v /= (double)stream_bytes;
        k.beta[PLAIT_MLINK_TCP] = v;
        say("beta.socket", v, "", "2 processes exchanging over TCP, per byte");
    } else {
        printf("  stream failed: %s\n", why);
        keep_default("beta.socket", "the stream failed");
        nfailed++;
    }
    if (ns->is_on) {
        /* Nothing else runs in them: let the namespaces (and the veth) go. */
        tune_netns_destroy(ns);
        printf("  (the namespaces and the veth are removed)\n");
    }

    /* Time-slicing: more ranks than cores. With fewer than CAL_MAX_RANKS
     * cores, a ring allreduce on CAL_MAX_RANKS processes is what the hand-off
     * decides; the model's is fitted to it. With more cores, two processes
     * pinned to one core show the hand-off of a ping-pong. */
    if (c.ncores < CAL_MAX_RANKS) {
        printf("\nplait, %d processes on %d cores (time-sliced):\n", CAL_MAX_RANKS, c.ncores);
        const double ar16 = measure_coll(BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:ring", CAL_MAX_RANKS, 16384,
                                         a->is_quick ? 300 : 1500, c.reps);
        if (isfinite(ar16)) {
            v = fit_constant(&k, &k.handoff, NULL, 0, 100e-6, PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_RING, CAL_MAX_RANKS,
                             16384, ar16, &note);
            say("handoff", v, note, "the model's 16 KiB ring allreduce on more ranks than cores = measured");
        } else {
            keep_default("handoff", "the time-sliced allreduce failed");
            nfailed++;
        }
    } else {
        printf("\nplait, 2 processes pinned to one core:\n");
        struct bench_spec pin = pp;
        pin.is_pinned = true;
        pin.iters = a->is_quick ? 2000 : 10000;
        double pp_pin = NAN;
        why[0] = '\0';
        if (bench_procs(2, &pin, env_ring, &pp_pin, why, sizeof(why)) == 0 && isfinite(pp_shm)) {
            printf("  8 B ping-pong, half round trip: %.3f us\n", pp_pin * 1e6);
            v = pp_pin - pp_shm;
            note = "";
            if (v <= 0) {
                v = pp_pin / 2;
                note = " (pinned was not slower: half the pinned figure)";
            }
            k.handoff = v;
            say("handoff", v, note, "pinned ping-pong - unpinned ping-pong");
        } else {
            printf("  ping-pong failed: %s\n", why[0] ? why : "no unpinned figure");
            keep_default("handoff", "the pinned ping-pong failed");
            nfailed++;
        }
    }

    /* Joint refinement: the constants above come from one run each; the
     * model must also hold across rank counts, sizes and algorithms, so the
     * engine costs, the memory factor, the hand-off and the call overhead are
     * refined together to minimise the model's mean squared log error over a
     * small grid of plait's own collectives (docs/tuning.md, "Calibration";
     * perf/model_check checks the result on a larger grid). */
    printf("\njoint refinement over plait's collectives (PLAIT_PROTO=simple, algorithm forced):\n");
    struct cal_point pts[] = {
        {BENCH_ALLGATHER, "PLAIT_ALGO=allgather:ring", PLAIT_COLL_ALLGATHER, PLAIT_ALGO_RING, 2, 1u << 20, NAN},
        {BENCH_REDUCESCATTER, "PLAIT_ALGO=reducescatter:ring", PLAIT_COLL_REDUCESCATTER, PLAIT_ALGO_RING, 2, 1u << 20,
         NAN},
        {BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:oneshot", PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_ONESHOT, 2, 1u << 20, NAN},
        {BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:ring", PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_RING, 2, 65536, NAN},
        {BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:tree", PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_TREE, 2, 1u << 20, NAN},
        {BENCH_ALLGATHER, "PLAIT_ALGO=allgather:ring", PLAIT_COLL_ALLGATHER, PLAIT_ALGO_RING, 2, 16384, NAN},
        {BENCH_ALLGATHER, "PLAIT_ALGO=allgather:ring", PLAIT_COLL_ALLGATHER, PLAIT_ALGO_RING, 2, 64u << 20, NAN},
        {BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:ring", PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_RING, 3, 256u << 10, NAN},
        {BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:tree", PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_TREE, 3, 1u << 20, NAN},
        {BENCH_ALLGATHER, "PLAIT_ALGO=allgather:ring", PLAIT_COLL_ALLGATHER, PLAIT_ALGO_RING, 4, 65536, NAN},
        {BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:ring", PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_RING, 4, 16384, NAN},
        {BENCH_ALLREDUCE, "PLAIT_ALGO=allreduce:recursive", PLAIT_COLL_ALLREDUCE, PLAIT_ALGO_RECURSIVE, 4, 1u << 20,
         NAN},
        {BENCH_REDUCESCATTER, "PLAIT_ALGO=reducescatter:ring", PLAIT_COLL_REDUCESCATTER, PLAIT_ALGO_RING, 4, 4u << 20,
         NAN},
    };
    const int npts = (int)(sizeof(pts) / sizeof(pts[0]));
    for (int i = 0; i < npts; i++) {
        if (pts[i].nranks > c.ncores && c.ncores >= CAL_MAX_RANKS)
            continue;
        const int iters = pts[i].bytes >= (16u << 20) ? it_big : pts[i].bytes >= (1u << 20) ? it_small / 4 : it_small;
        pts[i].meas = measure_coll(pts[i].kind, pts[i].env, pts[i].nranks, pts[i].bytes, iters, c.reps);
    }
    const double before = cal_cost(&k, pts, npts);
    double *const slots[] = {&k.send_beta[C], &k.gamma[C], &k.local_speedup[C], &k.mem_factor[C], &k.handoff,
                             &k.call_overhead[C], &k.step_overhead[C]};
    double *const slot2s[] = {&k.copy_beta[C], NULL, NULL, NULL, NULL, NULL, NULL};
    const double lo[] = {1e-12, 1e-12, 1.0, 1.0, 1e-8, 1e-8, 1e-9};
    const double hi[] = {1e-9, 1e-9, 20.0, 10.0, 50e-6, 20e-6, 5e-6};
    const double after =
        cal_refine(&k, slots, slot2s, lo, hi, (int)(sizeof(slots) / sizeof(slots[0])), pts, npts);
    printf("  rms log error over the grid: %.3f -> %.3f (about %.0f%% -> %.0f%%)\n", sqrt(before), sqrt(after),
           (exp(sqrt(before)) - 1) * 100, (exp(sqrt(after)) - 1) * 100);
    say("send_beta.cpu", k.send_beta[C], "", "refined (= copy_beta.cpu)");
    say("gamma.cpu", k.gamma[C], "", "refined");
    say("local_speedup.cpu", k.local_speedup[C], "", "refined");
    say("mem_factor.cpu", k.mem_factor[C], "", "refined");
    say("handoff", k.handoff, "", "refined");
    say("call_overhead.cpu", k.call_overhead[C], "", "refined");
    say("step_overhead.cpu", k.step_overhead[C], "", "refined");
    for (int i = 0; i < npts; i++)
        if (isfinite(pts[i].meas))
            printf("  %-32s %d ranks %9zu B: measured %10.2f us, model %10.2f us\n", pts[i].env, pts[i].nranks,
                   pts[i].bytes, pts[i].meas * 1e6,
                   model_at(&k, pts[i].coll, pts[i].algo, pts[i].nranks, pts[i].bytes) * 1e6);

    /* The small-message path. */
    printf("\nsmall-message path (allreduce, PLAIT_PROTO=auto, no algorithm forced):\n");
    struct bench_spec ll = {.kind = BENCH_ALLREDUCE, .iters = pp_iters, .reps = c.reps};
    double t2_8 = NAN, t2_4k = NAN, t3_8 = NAN, t3_4k = NAN;
    ll.bytes = 8;
    if (bench_procs(2, &ll, NULL, &t2_8, why, sizeof(why)) == 0)
        printf("  2 ranks, 8 B:    %.3f us\n", t2_8 * 1e6);
    ll.bytes = 4096;
    if (bench_procs(2, &ll, NULL, &t2_4k, why, sizeof(why)) == 0)
        printf("  2 ranks, 4 KiB:  %.3f us\n", t2_4k * 1e6);
    if (c.ncores >= 3) {
        ll.bytes = 8;
        if (bench_procs(3, &ll, NULL, &t3_8, why, sizeof(why)) == 0)
            printf("  3 ranks, 8 B:    %.3f us\n", t3_8 * 1e6);
        ll.bytes = 4096;
        if (bench_procs(3, &ll, NULL, &t3_4k, why, sizeof(why)) == 0)
            printf("  3 ranks, 4 KiB:  %.3f us\n", t3_4k * 1e6);
    }
    if (isfinite(t2_8) && isfinite(t2_4k)) {
        /* t = ll_call + (n-1)(ll_alpha + bytes ll_beta). Two sizes give
         * ll_beta; two rank counts separate ll_call from ll_alpha. With one
         * rank count, ll_alpha is the flag latency: the LL exchange is a flag
         * in the peer's cache line. */
        double b2 = (t2_4k - t2_8) / (4096 - 8);
        double lb = b2, la, lc;
        const char *how_a, *how_c;
        if (isfinite(t3_8) && isfinite(t3_4k)) {
            double b3 = ((t3_4k - t3_8) / (4096 - 8)) / 2;
            lb = (b2 + b3) / 2;
            la = (t3_8 - t2_8) - 8 * lb;
            lc = t2_8 - la - 8 * lb;
            how_a = "t(3 ranks, 8 B) - t(2 ranks, 8 B)";
            how_c = "t(2 ranks, 8 B) - ll_alpha - 8 ll_beta";
        } else {
            la = alpha_shm;
            lc = t2_8 - la - 8 * lb;
            how_a = "= alpha.shm (fewer than 3 cores: 3 ranks not measured)";
            how_c = "t(2 ranks, 8 B) - ll_alpha - 8 ll_beta";
        }
        const char *note = "";
        if (lb <= 0 || la <= 0 || lc <= 0)
            note = " (the fit gave a non-positive value: clamped)";
        if (lb <= 0)
            lb = 1e-12;
        if (la <= 0)
            la = alpha_shm > 0 ? alpha_shm : 0.1e-6;
        if (lc <= 0)
            lc = 0.1e-6;
        k.ll_beta[C] = lb;
        k.ll_alpha[C] = la;
        k.ll_call[C] = lc;
        say("ll_beta.cpu", lb, note, "(t(4 KiB) - t(8 B)) / 4088 B per peer");
        say("ll_alpha.cpu", la, note, how_a);
        say("ll_call.cpu", lc, note, how_c);
    } else {
        printf("  failed: %s\n", why);
        keep_default("ll_beta.cpu / ll_alpha.cpu / ll_call.cpu", "a run failed");
        nfailed += 3;
    }

    printf("\nno GPU: gpu constants are defaults (alpha/beta of nvlink, pcie and net; every *.gpu key)\n");
    const double took = tune_now_s() - t_start;
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32];
    strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M UTC", gmtime_r(&now, &tm));
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    clen += (size_t)snprintf(comment + clen, sizeof(comment) - clen,
                             "plait-tune --calibrate%s%s on %s, %s, %d cores, %.0f s; medians of %d repetitions.\n"
                             "socket: %s: alpha.socket, beta.socket measured there.\n"
                             "GPU, NVLink, PCIe and NET constants are the defaults (not measured here).",
                             a->is_quick ? " --quick" : "", a->is_netns ? " --netns" : "", host, stamp, c.ncores,
                             took, c.reps, sock_mode);
    if (busy > 0.15)
        clen += (size_t)snprintf(comment + clen, sizeof(comment) - clen,
                                 "\nWARNING: the machine was busy (%.0f%% CPU used by others): figures are skewed.",
                                 busy * 100);
    if (nfailed)
        snprintf(comment + clen, sizeof(comment) - clen, "\n%d constants could not be measured and keep defaults.",
                 nfailed);
    plait_result_t res = plait_model_consts_save(out, &k, comment);
    if (res != PLAIT_SUCCESS)
        return tune_failure("writing %s: %s", out, plait_get_last_error(NULL));
    printf("\nwrote %s (%.1f s)%s\n", out, took,
           nfailed ? "; some constants keep their defaults (see above)" : "");
    printf("use it: PLAIT_TUNE_CONSTANTS=%s, or plait-tune --explain --constants %s\n", out, out);
    return nfailed ? EXIT_FAILURE : 0;
}

int tune_calibrate(const struct tune_args *a)
{
    struct tune_netns ns = {.fd = {-1, -1}};
    const int rc = calibrate(a, &ns);
    tune_netns_destroy(&ns);
    return rc;
}
