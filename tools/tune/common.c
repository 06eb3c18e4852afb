/* plait-tune: what its modes share (tools/tune/tune.h): error reports, sizes,
 * time, the constants, the tuner's view of a call, the modelled machine. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algorithms/algorithms.h"
#include "core/settings.h"
#include "plait.h"
#include "tools/tune/tune.h"
#include "topology/topo.h"
#include "tuning/model.h"
#include "tuning/tuner.h"

/* One message on stderr, "plait-tune: ..." and, for usage errors, a hint at
 * --help; returns code (the exit status). */
static int vreport(int code, bool hint, const char *fmt, va_list ap)
{
    fputs("plait-tune: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(hint ? "\n(plait-tune --help lists the options)\n" : "\n", stderr);
    return code;
}

int tune_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int code = vreport(EXIT_USAGE, true, fmt, ap);
    va_end(ap);
    return code;
}

int tune_failure(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int code = vreport(EXIT_FAILURE, false, fmt, ap);
    va_end(ap);
    return code;
}

/* A file or value named on the command line that cannot be used: a usage
 * error too (exit 2), but without the hint at --help. */
int tune_bad_input(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int code = vreport(EXIT_USAGE, false, fmt, ap);
    va_end(ap);
    return code;
}
const char *tune_human_size(uint64_t b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    uint64_t v = b;
    while (u < 4 && v >= 1024 && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, "%llu %s", (unsigned long long)v, units[u]);
    return buf;
}

/* ---------------------------------------------------------------- shared helpers */

double tune_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

double tune_median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The constants: --constants FILE, else PLAIT_TUNE_CONSTANTS, else the
 * defaults. *origin says which, for the header lines. */
int tune_load_constants(const char *path, struct plait_model_consts *k, const char **origin)
{
    plait_model_consts_default(k);
    *origin = "built-in defaults";
    const char *env = getenv("PLAIT_TUNE_CONSTANTS");
    const char *what = "--constants";
    if (!path && env && *env) {
        path = env;
        what = "PLAIT_TUNE_CONSTANTS";
    }
    if (!path)
        return 0;
    plait_result_t res = plait_model_consts_load(path, k);
    if (res != PLAIT_SUCCESS)
        return tune_bad_input("%s %s: %s", what, path, plait_get_last_error(NULL));
    *origin = path;
    return 0;
}

/* Bytes the tuner counts for a call of nccl-tests size `size` (-b): count x
 * element size, per rank where the collective's count is per rank. */
bool tune_is_per_rank(int coll)
{
    return coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_ALLTOALL ||
           coll == PLAIT_COLL_GATHER || coll == PLAIT_COLL_SCATTER;
}

uint64_t tune_tuner_bytes(int coll, uint64_t size, int nranks)
{
    uint64_t count = size / ESIZE;
    if (tune_is_per_rank(coll))
        count /= (uint64_t)nranks;
    return count * ESIZE;
}

/* What a call may use, as a communicator with the environment's settings
 * would allow it (base/env.c, enqueue.c's chunk rule). */
int tune_space(int coll, int nranks, int channels, struct plait_tune_space *sp)
{
    struct plait_settings set;
    memset(sp, 0, sizeof(*sp));
    if (plait_settings_load(&set) != PLAIT_SUCCESS)
        return tune_failure("the environment's settings: %s", plait_get_last_error(NULL));
    for (int a = 1; a < PLAIT_ALGO_COUNT; a++)
        sp->allowed[a] = plait_algorithms[a].step && plait_algorithms[a].supports(coll, nranks);
    sp->max_channels = channels > 0 ? channels : set.nchannels;
    sp->slot_bytes = set.slot_bytes;
    sp->nslots = set.nslots;
    sp->max_chunk_bytes = (uint64_t)(set.nslots / 2) * set.slot_bytes;
    if (set.chunk_bytes < sp->max_chunk_bytes)
        sp->max_chunk_bytes = set.chunk_bytes;
    sp->radix = set.tree_radix;
    return 0;
}

int tune_build_machine(const struct tune_args *a, const struct plait_model_consts *k, struct plait_model_machine *m,
                       struct tune_machine_desc *d)
{
    plait_result_t res;
    if (a->topo_file) {
        struct plait_topo *topo = NULL;
        if ((res = plait_topo_load_xml(a->topo_file, &topo)) != PLAIT_SUCCESS)
            return tune_bad_input("--topo %s: %s", a->topo_file, plait_get_last_error(NULL));
        res = plait_model_machine_from_topo(m, topo, a->nodes, k);
        plait_topo_free(topo);
        if (res != PLAIT_SUCCESS)
            return tune_failure("the machine of %s x %d: %s", a->topo_file, a->nodes, plait_get_last_error(NULL));
        snprintf(d->text, sizeof(d->text), "%d %s of %s, %d ranks (%d per node, %s engine, %s within a node, %s "
                 "between, %d %s per node)",
                 a->nodes, a->nodes == 1 ? "node" : "nodes", a->topo_file, m->nranks, m->nranks / m->nhosts,
                 plait_model_engine_name(m->engine), plait_model_link_name(m->intra_link),
                 plait_model_link_name(m->inter_link), m->nics_per_host, m->nics_per_host == 1 ? "NIC" : "NICs");
        return 0;
    }
    const struct plait_topo *topo = NULL;
    const char *topo_note = "";
    if (plait_topo_get(&topo) != PLAIT_SUCCESS) {
        topo = NULL;
        topo_note = " (topology unknown: no time-slicing modelled)";
    }
    if ((res = plait_tune_machine_local(m, a->ranks, a->link, topo, k)) != PLAIT_SUCCESS)
        return tune_failure("the machine of %d ranks on this host: %s", a->ranks, plait_get_last_error(NULL));
    char ll[64] = "no LL";
    if (m->ll_ok)
        snprintf(ll, sizeof(ll), "LL up to %llu B per rank pair", (unsigned long long)m->ll_max_bytes);
    char cores[32] = "cores unknown";
    if (m->cores_per_host > 0)
        snprintf(cores, sizeof(cores), "%d cores", m->cores_per_host);
    snprintf(d->text, sizeof(d->text), "this host, %d ranks over %s, %s, %s%s", a->ranks,
             plait_model_link_name(a->link), cores, ll, topo_note);
    return 0;
}
