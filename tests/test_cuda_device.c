/* Device collectives on a real GPU, element-exact against the CPU backend
 * (suite cuda_device). Several ranks share device 0, as threads of this
 * process and as forked processes; every collective x all 12 types x all 6 ops
 * x both placements, counts 0, 1, odd and about a million, with algorithm,
 * protocol, channel count and chunk size forced equal for both backends
 * (tests/cuda_compare.c does the work).
 *
 * Without a GPU (or with only the test double) every test calls
 * cr_skip_test("no CUDA device"): nothing here counts as run on a GPU.
 *
 * Built twice: as a Criterion test, and with -DNO_CRITERION as
 * tests/cuda_device_check, a plain program that perf/gpu_check.sh runs on a
 * GPU machine without Criterion:
 *   cuda_device_check [--threads N | --procs N] [--big COUNT] [--quick]
 *                     [--algo SPEC] [--failures-only] [--allow-double] [--timeout S] [--probe]
 * It prints one line per case and "N passed, N failed"; exit 0 when all
 * passed, 1 on failures, 77 when there is no GPU. --allow-double runs the
 * same cases on the test double (PLAIT_CUDA_LIBRARY), labelled "double". */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda_compare.h"

/* About a million elements, odd, so that every vector width has a tail. */
#define BIG_COUNT ((size_t)(1 << 20) + 3)

/* The full matrix on n threads. */
static void full_config(struct cx_config *cfg, int nranks, size_t big)
{
    cx_config_default(cfg, nranks, big);
    cfg->timeout_s = 600;
}

/* Processes: the reductions and the data movement on a few types. */
static void procs_config(struct cx_config *cfg, int nranks, size_t big)
{
    cx_config_default(cfg, nranks, big);
    cfg->use_procs = 1;
    cfg->types = (1u << 0) | (1u << 7) | (1u << 9) | (1u << 6) | (1u << 10) | (1u << 4);
    cfg->timeout_s = 300;
}

#ifndef NO_CRITERION
#include <criterion/criterion.h>

static void require_gpu(void)
{
    char why[200];
    if (cx_probe(why, sizeof(why)) != CX_PROBE_GPU) {
        printf("cuda_device: %s\n", why);
        cr_skip_test("no CUDA device");
    }
}

/* Skips without a GPU; else runs the cases config gives for nranks. */
static void run_on_gpu(void (*config)(struct cx_config *, int, size_t), int nranks)
{
    require_gpu();
    struct cx_config cfg;
    config(&cfg, nranks, BIG_COUNT);
    long passed = 0, failed = 0;
    int st = cx_run_cases(&cfg, stdout, &passed, &failed);
    printf("%ld passed, %ld failed\n", passed, failed);
    cr_assert(st == 0, "%ld of %ld device cases failed (status %d); see the FAIL lines", failed, passed + failed, st);
}

Test(cuda_device, threads_1, .timeout = 900)
{
    run_on_gpu(full_config, 1);
}

Test(cuda_device, threads_2, .timeout = 900)
{
    run_on_gpu(full_config, 2);
}

Test(cuda_device, threads_4, .timeout = 900)
{
    run_on_gpu(full_config, 4);
}

Test(cuda_device, procs_2, .timeout = 600)
{
    run_on_gpu(procs_config, 2);
}

#else /* NO_CRITERION: tests/cuda_device_check */

static int usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [--threads N | --procs N] [--big COUNT] [--quick] [--algo SPEC] [--failures-only]\n"
            "          [--allow-double] [--timeout S] [--probe]\n"
            "  --probe: only say whether there is a GPU (exit 0) or not (77)\n",
            prog);
    return 2;
}

int main(int argc, char **argv)
{
    int nranks = 2, use_procs = 0, quick = 0, allow_double = 0, failures_only = 0, probe_only = 0;
    size_t big = BIG_COUNT;
    const char *algo = NULL;
    double timeout_s = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--threads") == 0 && v) {
            nranks = atoi(v);
            use_procs = 0;
            i++;
        } else if (strcmp(a, "--procs") == 0 && v) {
            nranks = atoi(v);
            use_procs = 1;
            i++;
        } else if (strcmp(a, "--big") == 0 && v) {
            big = (size_t)strtoull(v, NULL, 0);
            i++;
        } else if (strcmp(a, "--algo") == 0 && v) {
            algo = v;
            i++;
        } else if (strcmp(a, "--timeout") == 0 && v) {
            timeout_s = atof(v);
            i++;
        } else if (strcmp(a, "--quick") == 0) {
            quick = 1;
        } else if (strcmp(a, "--allow-double") == 0) {
            allow_double = 1;
        } else if (strcmp(a, "--probe") == 0) {
            probe_only = 1;
        } else if (strcmp(a, "--failures-only") == 0) {
            failures_only = 1;
        } else {
            return usage(argv[0]);
        }
    }
    if (nranks < 1 || nranks > 64)
        return usage(argv[0]);

    char why[200];
    int kind = cx_probe(why, sizeof(why));
    printf("# cuda_device_check: %s\n", why);
    if (kind == CX_PROBE_NONE || (kind == CX_PROBE_DOUBLE && !allow_double)) {
        printf("SKIP: no CUDA device\n0 passed, 0 failed\n");
        return 77;
    }
    if (probe_only)
        return 0;

    struct cx_config cfg;
    if (use_procs)
        procs_config(&cfg, nranks, big);
    else
        full_config(&cfg, nranks, big);
    if (quick) {
        /* Every collective and op, fewer types: a smoke test. */
        cfg.types = (1u << 0) | (1u << 7) | (1u << 9);
    }
    cfg.algo = algo;
    cfg.print_passes = !failures_only;
    cfg.label = kind == CX_PROBE_GPU ? "gpu" : "double (not a GPU)";
    if (timeout_s > 0)
        cfg.timeout_s = timeout_s;

    long passed = 0, failed = 0;
    int st = cx_run_cases(&cfg, stdout, &passed, &failed);
    printf("%ld passed, %ld failed\n", passed, failed);
    return st == 0 ? 0 : 1;
}
#endif
