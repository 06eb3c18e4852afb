/*
 * perf/membw.c — a STREAM-like memory bandwidth probe: the triad
 * a[i] = b[i] + s * c[i] on three arrays of doubles far larger than the
 * last-level cache, with 1 and 2 threads (or the counts given by -t).
 *
 *   membw [-s MiB per array (default 128)] [-n tries (default 10)] [-t 1,2]
 *
 * Each thread count runs `tries` times; the best (shortest) try is reported, as
 * STREAM does, because the machine can only make a run slower, never faster.
 * Bytes are counted as STREAM counts them: 3 x 8 bytes per element (read b,
 * read c, write a). The write-allocate read of a that most CPUs also perform is
 * not counted, so the real traffic is up to 4/3 of the figure.
 *
 * Output: '#' comment lines, then one line per thread count:
 *   triad <threads> <GB/s> <best seconds>
 * (GB = 1e9 bytes), which perf/compare.sh reads.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MEMBW_MAX_THREADS 64
#define MEMBW_SCALAR 3.0

struct membw_shared {
    double *a, *b, *c;
    size_t n;
    int nthreads;
    int tries;
    pthread_barrier_t barrier;
    double best_s;
};

struct membw_thread {
    struct membw_shared *sh;
    int index;
};

static double membw_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void membw_range(const struct membw_shared *sh, int index, size_t *lo_out, size_t *hi_out)
{
    size_t per = sh->n / (size_t)sh->nthreads;
    size_t lo = per * (size_t)index;
    *lo_out = lo;
    *hi_out = index == sh->nthreads - 1 ? sh->n : lo + per;
}

static void membw_triad(double *restrict a, const double *restrict b, const double *restrict c, size_t lo,
                        size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        a[i] = b[i] + MEMBW_SCALAR * c[i];
}

static void *membw_thread_main(void *p)
{
    struct membw_thread *t = p;
    struct membw_shared *sh = t->sh;
    size_t lo, hi;

    membw_range(sh, t->index, &lo, &hi);
    /* First touch by the thread that later streams the range, so that on a NUMA
     * machine its pages are local to it. */
    for (size_t i = lo; i < hi; i++) {
        sh->a[i] = 0.0;
        sh->b[i] = 1.0 + (double)(i & 1023);
        sh->c[i] = 2.0;
    }
    for (int k = 0; k < sh->tries; k++) {
        double t0 = 0.0;
        pthread_barrier_wait(&sh->barrier);
        if (t->index == 0)
            t0 = membw_now();
        membw_triad(sh->a, sh->b, sh->c, lo, hi);
        pthread_barrier_wait(&sh->barrier);
        if (t->index == 0) {
            double s = membw_now() - t0;
            if (sh->best_s == 0.0 || s < sh->best_s)
                sh->best_s = s;
        }
    }
    return NULL;
}

/* Runs the triad with `nthreads` threads; returns the best time in seconds, or
 * a negative value on failure (reported). */
static double membw_run(double *a, double *b, double *c, size_t n, int nthreads, int tries)
{
    struct membw_shared sh = {.a = a, .b = b, .c = c, .n = n, .nthreads = nthreads, .tries = tries};
    struct membw_thread th[MEMBW_MAX_THREADS];
    pthread_t tids[MEMBW_MAX_THREADS];
    int started = 0, err;

    err = pthread_barrier_init(&sh.barrier, NULL, (unsigned)nthreads);
    if (err) {
        fprintf(stderr, "membw: pthread_barrier_init: %s\n", strerror(err));
        return -1.0;
    }
    for (; started < nthreads; started++) {
        th[started] = (struct membw_thread){&sh, started};
        err = pthread_create(&tids[started], NULL, membw_thread_main, &th[started]);
        if (err) {
            /* The threads already started would wait at the barrier forever. */
            fprintf(stderr, "membw: pthread_create: %s\n", strerror(err));
            exit(1);
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    pthread_barrier_destroy(&sh.barrier);

    /* The results are read back so that the stores cannot be optimised away,
     * and so that a wrong loop cannot report a bandwidth. */
    for (size_t i = 0; i < n; i += 4099) {
        double want = 1.0 + (double)(i & 1023) + MEMBW_SCALAR * 2.0;
        if (a[i] != want) {
            fprintf(stderr, "membw: wrong result at %zu: %g, expected %g\n", i, a[i], want);
            return -1.0;
        }
    }
    return sh.best_s;
}

static void membw_usage(FILE *f)
{
    fprintf(f, "usage: membw [-s MiB per array (default 128)] [-n tries (default 10)] [-t thread counts (default 1,2)]\n");
}

int main(int argc, char **argv)
{
    long mib = 128, tries = 10;
    int counts[MEMBW_MAX_THREADS], ncounts = 0;
    const char *list = "1,2";

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            membw_usage(stdout);
            return 0;
        }
        if (i + 1 >= argc || (strcmp(arg, "-s") && strcmp(arg, "-n") && strcmp(arg, "-t"))) {
            membw_usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
        char *end = NULL;
        errno = 0;
        if (strcmp(arg, "-t") == 0) {
            list = val;
            continue;
        }
        long v = strtol(val, &end, 10);
        if (errno || *end || v < 1 || v > (1L << 20)) {
            fprintf(stderr, "membw: invalid value '%s' for %s\n", val, arg);
            return 2;
        }
        if (strcmp(arg, "-s") == 0)
            mib = v;
        else
            tries = v;
    }
    for (const char *p = list; *p;) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MEMBW_MAX_THREADS || ncounts == MEMBW_MAX_THREADS ||
            (*end != ',' && *end != '\0')) {
            fprintf(stderr, "membw: invalid thread counts '%s' (comma-separated, 1..%d)\n", list, MEMBW_MAX_THREADS);
            return 2;
        }
        counts[ncounts++] = (int)v;
        p = *end ? end + 1 : end;
    }

    size_t n = (size_t)mib * 1024 * 1024 / sizeof(double);
    double *a = NULL, *b = NULL, *c = NULL;
    if (posix_memalign((void **)&a, 4096, n * sizeof(double)) || posix_memalign((void **)&b, 4096, n * sizeof(double)) ||
        posix_memalign((void **)&c, 4096, n * sizeof(double))) {
        fprintf(stderr, "membw: cannot allocate 3 x %ld MiB\n", mib);
        free(a);
        free(b);
        return 1;
    }

    printf("# membw: STREAM-like triad a[i] = b[i] + %g * c[i], 3 arrays x %ld MiB of double, best of %ld\n",
           MEMBW_SCALAR, mib, tries);
    printf("# bytes counted: 3 x 8 per element (read b, read c, write a), as STREAM; GB = 1e9 bytes\n");
    printf("# %-5s %7s %9s  %s\n", "", "threads", "GB/s", "best s");
    fflush(stdout);
    int status = 0;
    for (int k = 0; k < ncounts; k++) {
        double s = membw_run(a, b, c, n, counts[k], (int)tries);
        if (s <= 0) {
            status = 1;
            break;
        }
        printf("triad %7d %9.2f  %.6f\n", counts[k], 3.0 * 8.0 * (double)n / s / 1e9, s);
        fflush(stdout);
    }
    free(a);
    free(b);
    free(c);
    return status;
}
