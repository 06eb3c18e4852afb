/* plait-tune: the cost model and the tuner from the command line
 * (docs/tuning.md).
 *
 *   --calibrate  measures the constants of tuning/model.h on this machine
 *                (memory copies, reductions, flag ping-pongs, plait's own
 *                ping-pong, streams and small collectives over shm, inproc and
 *                socket) and writes a constants file;
 *   --explain    prints, per size, every candidate (algorithm, protocol) the
 *                tuner weighs, its predicted time and busbw, and the one it
 *                picks (--tsv: rows for perf/model_check);
 *   --simulate   predicts every collective and algorithm on N copies of a
 *                recorded host (tests/fixtures/topo) up to thousands of ranks.
 *
 * Exit status: 0 done, 1 a failure (a file, a measurement, the model), 2 a
 * usage error. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "base/env.h"
#include "core/settings.h"
#include "tuning/model.h"
#include "plait.h"
#include "core/reduce.h"
#include "topology/topo.h"
#include "tuning/tuner.h"

#define EXIT_USAGE 2
#define DEFAULT_CONSTANTS_FILE "plait-tune-constants.txt"
#define ESIZE 4 /* float, the perf programs' default type */

enum mode { MODE_NONE = 0, MODE_CALIBRATE, MODE_EXPLAIN, MODE_SIMULATE, MODE_LIST_ALGOS };

struct args {
    int mode;
    /* --calibrate */
    const char *out;
    bool is_quick;
    /* --explain / --simulate */
    const char *constants;
    const char *topo_file;
    int coll;                        /* --explain: one collective */
    bool colls[PLAIT_COLL_COUNT];    /* --simulate: the set */
    bool has_colls;
    int ranks;
    bool has_ranks;
    int nodes;
    bool has_nodes;
    int link;                        /* PLAIT_MLINK_SHM, _INPROC, _SOCKET */
    bool has_link;
    int channels;                    /* 0: the default */
    uint64_t from, to, size;
    bool has_from, has_to, has_size;
    int step;
    bool has_step;
    bool is_tsv;
    int max_full_ranks;
    int full_budget_s;               /* --simulate: seconds a full replay above max_full_ranks may take */
};

static const char usage_text[] =
    "usage: plait-tune MODE [OPTIONS]\n"
    "\n"
    "The cost model and the tuner from the command line (docs/tuning.md).\n"
    "\n"
    "Modes:\n"
    "  --calibrate        measure the model's constants on this machine and write a constants file\n"
    "  --explain          every candidate the tuner weighs for one collective, per size, and its pick\n"
    "  --simulate         predict each collective and algorithm on N copies of a recorded host\n"
    "  --list-algos       the algorithms that implement --coll on --ranks ranks, one per line\n"
    "  --help             this text\n"
    "\n"
    "--calibrate options:\n"
    "  --out FILE         where to write the constants (default " DEFAULT_CONSTANTS_FILE ")\n"
    "  --quick            fewer, shorter repetitions (about 2 s instead of 10 s on an idle 2-core machine)\n"
    "\n"
    "--explain options:\n"
    "  --coll C           allreduce, broadcast, reduce, allgather, reducescatter, alltoall, gather, scatter\n"
    "                     (default allreduce)\n"
    "  --ranks N          ranks (default: 2; with --topo: nodes x the host's ranks)\n"
    "  --link L           shm (processes, default), inproc (threads) or socket (TCP) between this host's ranks\n"
    "  --topo FILE        a recorded host (plait or NCCL topology XML) instead of this one; with --nodes N\n"
    "  --nodes N          copies of the --topo host (default 1)\n"
    "  --from SIZE        first size (default 8)\n"
    "  --to SIZE          last size (default 8G)\n"
    "  --step F           size factor between rows, an integer >= 2 (default 4)\n"
    "  --channels N       the most channels a call may use (default: PLAIT_NCHANNELS, 2; with --topo: at\n"
    "                     least the host's rings)\n"
    "  --tsv              rows \"size algo proto channels chunk time_us busbw chosen\" (tab-separated)\n"
    "\n"
    "--simulate options:\n"
    "  --topo FILE        the host (required), e.g. tests/fixtures/topo/dgx-h100.xml\n"
    "  --nodes N          copies of it, 1..4096 (default 1)\n"
    "  --size SIZE        the size of each call (default 1G)\n"
    "  --coll LIST        \"all\" (default: allreduce,allgather,reducescatter,broadcast,alltoall) or a list\n"
    "  --channels N       the most channels a call may use (default: the host's rings, at least PLAIT_NCHANNELS)\n"
    "  --max-full-ranks N algorithms that need the full replay (every rank) are searched (channels, chunk)\n"
    "                     up to N ranks (default 64); above, one point (the most channels, the largest\n"
    "                     chunk) is replayed in a child process within --full-budget seconds\n"
    "  --full-budget S    seconds that one point above --max-full-ranks may take before it is given up\n"
    "                     (default 8; 0: skip those algorithms)\n"
    "\n"
    "Common options:\n"
    "  --constants FILE   the model's constants (default: PLAIT_TUNE_CONSTANTS, else the built-in defaults)\n"
    "\n"
    "Sizes are bytes with an optional K, M, G or T (powers of 1024), as nccl-tests' -b: the whole buffer\n"
    "for allreduce, broadcast, reduce and alltoall, the whole output (per-rank size x ranks) for\n"
    "allgather and gather, the whole input for reducescatter and scatter; float elements (4 bytes).\n"
    "The tuner itself counts bytes per rank for allgather, reducescatter, alltoall, gather, scatter.\n"
    "\n"
    "Exit status: 0 done, 1 failure (a file, a measurement, the model), 2 usage error.\n";

/* One message on stderr, "plait-tune: ..." and, for usage errors, a hint at
 * --help; returns code (the exit status). */
static int vreport(int code, bool hint, const char *fmt, va_list ap)
{
    fputs("plait-tune: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(hint ? "\n(plait-tune --help lists the options)\n" : "\n", stderr);
    return code;
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int code = vreport(EXIT_USAGE, true, fmt, ap);
    va_end(ap);
    return code;
}

static int failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int failure(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int code = vreport(EXIT_FAILURE, false, fmt, ap);
    va_end(ap);
    return code;
}

/* A file or value named on the command line that cannot be used: a usage
 * error too (exit 2), but without the hint at --help. */
static int bad_input(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad_input(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int code = vreport(EXIT_USAGE, false, fmt, ap);
    va_end(ap);
    return code;
}

/* ---------------------------------------------------------------- parsing */

static bool parse_int(const char *s, int lo, int hi, int *out)
{
    long v;
    if (!plait_topo_parse_long(s, lo, hi, &v))
        return false;
    *out = (int)v;
    return true;
}

/* "8", "4K", "8G", "1.5M", "64KiB": bytes, at least 1, whole. */
static bool parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-' || *s == '+')
        return false;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0))
        return false;
    double unit = 1;
    switch (*end) {
    case 'k': case 'K': unit = 1024.0; end++; break;
    case 'm': case 'M': unit = 1024.0 * 1024; end++; break;
    case 'g': case 'G': unit = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': unit = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (unit > 1 && *end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return false;
    v *= unit;
    if (v < 1 || v > 0x1p62 || v != floor(v))
        return false;
    *out = (uint64_t)v;
    return true;
}

static const char *human_size(uint64_t b, char *buf, size_t len)
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

static int find_coll(const char *name, size_t len)
{
    for (int c = 0; c < PLAIT_COLL_COUNT; c++) {
        const char *n = plait_coll_name(c);
        if (c != PLAIT_COLL_BARRIER && plait_coll_is_scheduled(c) && strlen(n) == len && strncmp(n, name, len) == 0)
            return c;
    }
    return -1;
}

static const char valid_colls[] = "allreduce, broadcast, reduce, allgather, reducescatter, alltoall, gather, scatter";

static int parse_args(int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof(*a));
    a->coll = PLAIT_COLL_ALLREDUCE;
    a->ranks = 2;
    a->nodes = 1;
    a->link = PLAIT_MLINK_SHM;
    a->from = 8;
    a->to = 8ull << 30;
    a->size = 1ull << 30;
    a->step = 4;
    a->max_full_ranks = 64;
    a->full_budget_s = 8;

    static const struct {
        const char *name;
        int mode;
    } modes[] = {{"--calibrate", MODE_CALIBRATE},
                 {"--explain", MODE_EXPLAIN},
                 {"--simulate", MODE_SIMULATE},
                 {"--list-algos", MODE_LIST_ALGOS}};
    static const char *const valued[] = {"--out",  "--constants", "--topo",     "--coll",    "--ranks",
                                         "--nodes", "--link",     "--from",     "--to",      "--step",
                                         "--size", "--channels", "--max-full-ranks", "--full-budget"};
    /* Which options each mode takes (bit per mode), so that a misplaced one
     * is reported rather than silently ignored. */
    static const struct {
        const char *name;
        unsigned modes;
    } applies[] = {
        {"--out", 1u << MODE_CALIBRATE},
        {"--quick", 1u << MODE_CALIBRATE},
        {"--constants", 1u << MODE_EXPLAIN | 1u << MODE_SIMULATE},
        {"--topo", 1u << MODE_EXPLAIN | 1u << MODE_SIMULATE},
        {"--coll", 1u << MODE_EXPLAIN | 1u << MODE_SIMULATE | 1u << MODE_LIST_ALGOS},
        {"--ranks", 1u << MODE_EXPLAIN | 1u << MODE_LIST_ALGOS},
        {"--nodes", 1u << MODE_EXPLAIN | 1u << MODE_SIMULATE},
        {"--link", 1u << MODE_EXPLAIN},
        {"--from", 1u << MODE_EXPLAIN},
        {"--to", 1u << MODE_EXPLAIN},
        {"--step", 1u << MODE_EXPLAIN},
        {"--tsv", 1u << MODE_EXPLAIN},
        {"--size", 1u << MODE_SIMULATE},
        {"--channels", 1u << MODE_EXPLAIN | 1u << MODE_SIMULATE},
        {"--max-full-ranks", 1u << MODE_SIMULATE},
        {"--full-budget", 1u << MODE_SIMULATE},
    };
    const char *seen[sizeof(applies) / sizeof(applies[0])] = {0};

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        char name[32];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof(name)) {
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            value = eq + 1;
        } else {
            if (strlen(arg) >= sizeof(name))
                return usage_error("unknown %s '%s'", arg[0] == '-' ? "option" : "argument", arg);
            snprintf(name, sizeof(name), "%s", arg);
        }

        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            if (value)
                return usage_error("%s takes no value (got '%s')", name, arg);
            fputs(usage_text, stdout);
            exit(EXIT_SUCCESS);
        }
        bool is_mode = false;
        for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
            if (strcmp(name, modes[m].name) != 0)
                continue;
            if (value)
                return usage_error("%s takes no value (got '%s')", name, arg);
            if (a->mode && a->mode != modes[m].mode)
                return usage_error("%s: only one of --calibrate, --explain, --simulate, --list-algos at a time",
                                   name);
            a->mode = modes[m].mode;
            is_mode = true;
        }
        if (is_mode)
            continue;

        int which = -1;
        for (size_t k = 0; k < sizeof(applies) / sizeof(applies[0]); k++)
            if (strcmp(name, applies[k].name) == 0)
                which = (int)k;
        if (which < 0)
            return usage_error("unknown %s '%s'", arg[0] == '-' ? "option" : "argument", arg);
        seen[which] = applies[which].name;

        if (strcmp(name, "--quick") == 0 || strcmp(name, "--tsv") == 0) {
            if (value)
                return usage_error("%s takes no value (got '%s')", name, arg);
            if (name[2] == 'q')
                a->is_quick = true;
            else
                a->is_tsv = true;
            continue;
        }
        bool is_valued = false;
        for (size_t v = 0; v < sizeof(valued) / sizeof(valued[0]); v++)
            is_valued |= strcmp(name, valued[v]) == 0;
        if (!is_valued)
            return usage_error("unknown option '%s'", arg);
        if (!value) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", name);
            value = argv[++i];
        }
        if (!*value)
            return usage_error("%s: the value is empty", name);

        if (strcmp(name, "--out") == 0) {
            a->out = value;
        } else if (strcmp(name, "--constants") == 0) {
            a->constants = value;
        } else if (strcmp(name, "--topo") == 0) {
            a->topo_file = value;
        } else if (strcmp(name, "--coll") == 0) {
            a->has_colls = true;
            memset(a->colls, 0, sizeof(a->colls));
            if (strcmp(value, "all") == 0) {
                a->colls[PLAIT_COLL_ALLREDUCE] = a->colls[PLAIT_COLL_ALLGATHER] = true;
                a->colls[PLAIT_COLL_REDUCESCATTER] = a->colls[PLAIT_COLL_BROADCAST] = true;
                a->colls[PLAIT_COLL_ALLTOALL] = true;
                a->coll = -1;
                continue;
            }
            int n = 0;
            for (const char *p = value;;) {
                size_t len = strcspn(p, ",");
                int c = find_coll(p, len);
                if (c < 0)
                    return usage_error("--coll '%.*s': unknown collective (valid: %s%s)", (int)len, p, valid_colls,
                                       a->mode == MODE_SIMULATE ? ", or all" : "");
                a->colls[c] = true;
                a->coll = c;
                n++;
                if (!p[len])
                    break;
                p += len + 1;
            }
            if (n > 1)
                a->coll = -1; /* only --simulate takes a list (checked below) */
        } else if (strcmp(name, "--ranks") == 0) {
            if (!parse_int(value, 1, 1 << 16, &a->ranks))
                return usage_error("--ranks '%s': expected a number of ranks from 1 to 65536", value);
            a->has_ranks = true;
        } else if (strcmp(name, "--nodes") == 0) {
            if (!parse_int(value, 1, 4096, &a->nodes))
                return usage_error("--nodes '%s': expected a number of nodes from 1 to 4096", value);
            a->has_nodes = true;
        } else if (strcmp(name, "--link") == 0) {
            if (strcmp(value, "shm") == 0)
                a->link = PLAIT_MLINK_SHM;
            else if (strcmp(value, "inproc") == 0)
                a->link = PLAIT_MLINK_INPROC;
            else if (strcmp(value, "socket") == 0)
                a->link = PLAIT_MLINK_SOCKET;
            else
                return usage_error("--link '%s': expected shm, inproc or socket", value);
            a->has_link = true;
        } else if (strcmp(name, "--from") == 0 || strcmp(name, "--to") == 0 || strcmp(name, "--size") == 0) {
            uint64_t v;
            if (!parse_size(value, &v))
                return usage_error("%s '%s': expected a size in bytes of at least 1, with an optional K, M, G or "
                                   "T (e.g. 8, 64K, 8G)",
                                   name, value);
            if (name[2] == 'f') {
                a->from = v;
                a->has_from = true;
            } else if (name[2] == 't') {
                a->to = v;
                a->has_to = true;
            } else {
                a->size = v;
                a->has_size = true;
            }
        } else if (strcmp(name, "--step") == 0) {
            if (!parse_int(value, 2, 1 << 20, &a->step))
                return usage_error("--step '%s': expected an integer factor of at least 2", value);
            a->has_step = true;
        } else if (strcmp(name, "--channels") == 0) {
            if (!parse_int(value, 1, 64, &a->channels))
                return usage_error("--channels '%s': expected a number of channels from 1 to 64", value);
        } else if (strcmp(name, "--full-budget") == 0) {
            if (!parse_int(value, 0, 3600, &a->full_budget_s))
                return usage_error("--full-budget '%s': expected seconds from 0 to 3600", value);
        } else {
            if (!parse_int(value, 1, 1 << 20, &a->max_full_ranks))
                return usage_error("--max-full-ranks '%s': expected a number of ranks of at least 1", value);
        }
    }

    if (!a->mode)
        return usage_error("no mode: give --calibrate, --explain, --simulate or --list-algos");
    for (size_t k = 0; k < sizeof(applies) / sizeof(applies[0]); k++) {
        if (seen[k] && !(applies[k].modes & (1u << a->mode))) {
            static const char *const mode_names[] = {"", "--calibrate", "--explain", "--simulate", "--list-algos"};
            return usage_error("%s does not apply to %s", seen[k], mode_names[a->mode]);
        }
    }
    if (a->mode != MODE_SIMULATE && a->coll < 0)
        return usage_error("--coll: %s takes one collective", a->mode == MODE_EXPLAIN ? "--explain" : "--list-algos");
    if (a->mode == MODE_SIMULATE && !a->has_colls) {
        a->colls[PLAIT_COLL_ALLREDUCE] = a->colls[PLAIT_COLL_ALLGATHER] = true;
        a->colls[PLAIT_COLL_REDUCESCATTER] = a->colls[PLAIT_COLL_BROADCAST] = true;
        a->colls[PLAIT_COLL_ALLTOALL] = true;
    }
    if (a->mode == MODE_SIMULATE && !a->topo_file)
        return usage_error("--simulate needs --topo FILE (e.g. tests/fixtures/topo/dgx-h100.xml)");
    if (a->mode == MODE_EXPLAIN) {
        if (a->has_nodes && !a->topo_file)
            return usage_error("--nodes needs --topo FILE (without it the machine is this host)");
        if (a->has_link && a->topo_file)
            return usage_error("--link applies to this host; with --topo the links come from the topology");
        if (a->from > a->to)
            return usage_error("--from %llu is above --to %llu", (unsigned long long)a->from,
                               (unsigned long long)a->to);
    }
    return 0;
}

/* ---------------------------------------------------------------- shared helpers */

static double now_s(void)
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

static double median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The constants: --constants FILE, else PLAIT_TUNE_CONSTANTS, else the
 * defaults. *origin says which, for the header lines. */
static int load_constants(const char *path, struct plait_model_consts *k, const char **origin)
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
        return bad_input("%s %s: %s", what, path, plait_get_last_error(NULL));
    *origin = path;
    return 0;
}

/* Bytes the tuner counts for a call of nccl-tests size `size` (-b): count x
 * element size, per rank where the collective's count is per rank. */
static bool is_per_rank(int coll)
{
    return coll == PLAIT_COLL_ALLGATHER || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_ALLTOALL ||
           coll == PLAIT_COLL_GATHER || coll == PLAIT_COLL_SCATTER;
}

static uint64_t tuner_bytes(int coll, uint64_t size, int nranks)
{
    uint64_t count = size / ESIZE;
    if (is_per_rank(coll))
        count /= (uint64_t)nranks;
    return count * ESIZE;
}

/* What a call may use, as a communicator with the environment's settings
 * would allow it (base/env.c, enqueue.c's chunk rule). */
static int tune_space(int coll, int nranks, int channels, struct plait_tune_space *sp)
{
    struct plait_settings set;
    memset(sp, 0, sizeof(*sp));
    if (plait_settings_load(&set) != PLAIT_SUCCESS)
        return failure("the environment's settings: %s", plait_get_last_error(NULL));
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

/* ---------------------------------------------------------------- --list-algos */

static int run_list_algos(const struct args *a)
{
    for (int i = 1; i < PLAIT_ALGO_COUNT; i++)
        if (plait_algorithms[i].step && plait_algorithms[i].supports(a->coll, a->ranks))
            printf("%s\n", plait_algorithms[i].name);
    return 0;
}

/* ---------------------------------------------------------------- --explain */

struct machine_desc {
    char text[256];
};

static int build_machine(const struct args *a, const struct plait_model_consts *k, struct plait_model_machine *m,
                         struct machine_desc *d)
{
    plait_result_t res;
    if (a->topo_file) {
        struct plait_topo *topo = NULL;
        if ((res = plait_topo_load_xml(a->topo_file, &topo)) != PLAIT_SUCCESS)
            return bad_input("--topo %s: %s", a->topo_file, plait_get_last_error(NULL));
        res = plait_model_machine_from_topo(m, topo, a->nodes, k);
        plait_topo_free(topo);
        if (res != PLAIT_SUCCESS)
            return failure("the machine of %s x %d: %s", a->topo_file, a->nodes, plait_get_last_error(NULL));
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
        return failure("the machine of %d ranks on this host: %s", a->ranks, plait_get_last_error(NULL));
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

static int run_explain(const struct args *a)
{
    struct plait_model_consts k;
    const char *origin;
    int rc = load_constants(a->constants, &k, &origin);
    if (rc)
        return rc;
    struct plait_model_machine m;
    memset(&m, 0, sizeof(m));
    struct machine_desc d;
    if ((rc = build_machine(a, &k, &m, &d)))
        return rc;
    if (a->topo_file && a->has_ranks && a->ranks != m.nranks) {
        const int have = m.nranks;
        plait_model_machine_free(&m);
        return usage_error("--ranks %d: %d %s of %s have %d ranks", a->ranks, a->nodes,
                           a->nodes == 1 ? "node" : "nodes", a->topo_file, have);
    }
    const int n = m.nranks;
    struct plait_tune_space sp;
    /* A recorded host brings its own rings (one per channel, as NCCL's):
     * they bound the channels, as in --simulate. */
    int channels = a->channels;
    if (channels == 0 && a->topo_file) {
        struct plait_settings set;
        channels = plait_settings_load(&set) == PLAIT_SUCCESS ? set.nchannels : 2;
        if (m.norder > channels)
            channels = m.norder;
    }
    if ((rc = tune_space(a->coll, n, channels, &sp))) {
        plait_model_machine_free(&m);
        return rc;
    }
    const char *conv = is_per_rank(a->coll)
                           ? (a->coll == PLAIT_COLL_ALLGATHER || a->coll == PLAIT_COLL_GATHER
                                  ? "size = the whole output (per-rank bytes x ranks); the tuner counts size / ranks"
                              : a->coll == PLAIT_COLL_ALLTOALL
                                  ? "size = the whole buffer of a rank; the tuner counts size / ranks"
                                  : "size = the whole input (per-rank bytes x ranks); the tuner counts size / ranks")
                           : "size = the whole buffer (the tuner counts the same)";
    if (a->is_tsv) {
        printf("# plait-tune --explain --coll %s: %s; constants: %s\n", plait_coll_name(a->coll), d.text, origin);
        printf("# %s; float elements\n", conv);
        printf("# size\talgo\tproto\tchannels\tchunk\ttime_us\tbusbw\tchosen\n");
    } else {
        printf("%s on %s\n", plait_coll_name(a->coll), d.text);
        printf("constants: %s\n", origin);
        printf("%s; float elements; busbw as nccl-tests (GB/s); * = the tuner's pick\n", conv);
        printf("channels up to %d, chunk up to %llu B, FIFO %u x %llu B\n\n", sp.max_channels,
               (unsigned long long)sp.max_chunk_bytes, sp.nslots, (unsigned long long)sp.slot_bytes);
        printf("  %10s  %-13s %-6s %3s %9s %13s %11s\n", "size", "algorithm", "proto", "ch", "chunk", "time_us",
               "busbw_GB/s");
    }
    struct plait_tune_candidate cands[PLAIT_ALGO_COUNT * PLAIT_MPROTO_COUNT];
    int status = 0;
    for (uint64_t size = a->from; size <= a->to;) {
        char hs[32];
        uint64_t bytes = tuner_bytes(a->coll, size, n);
        if (bytes == 0) {
            if (!a->is_tsv)
                printf("  %10s  (fewer than one element per rank: skipped)\n", human_size(size, hs, sizeof(hs)));
        } else {
            int nc = 0, best = -1;
            plait_result_t res = plait_tune_candidates(&m, &sp, a->coll, bytes, ESIZE, cands,
                                                       (int)(sizeof(cands) / sizeof(cands[0])), &nc, &best);
            if (res != PLAIT_SUCCESS) {
                failure("size %llu: %s", (unsigned long long)size, plait_get_last_error(NULL));
                status = 1;
                break;
            }
            if (nc == 0 && !a->is_tsv)
                printf("  %10s  (no candidate applies)\n", human_size(size, hs, sizeof(hs)));
            /* The pick is what a communicator's tuner takes for this size (its
             * bucket's decision), which may differ from the fastest row here
             * when the size is not its bucket's lower edge. */
            int pick_algo = -1, pick_proto = -1;
            if (nc > 0 && plait_tune_pick(&m, &sp, a->coll, bytes, &pick_algo, &pick_proto) == PLAIT_SUCCESS) {
                best = -1;
                for (int i = 0; i < nc && best < 0; i++)
                    if (cands[i].choice.proto == pick_proto &&
                        (pick_proto == PLAIT_MPROTO_LL || cands[i].choice.algo == pick_algo))
                        best = i;
            }
            for (int i = 0; i < nc; i++) {
                const struct plait_tune_choice *c = &cands[i].choice;
                const struct plait_model_result *r = &cands[i].result;
                if (a->is_tsv) {
                    printf("%llu\t%s\t%s\t%d\t%u\t%.3f\t%.4f\t%d\n", (unsigned long long)size,
                           c->proto == PLAIT_MPROTO_LL ? "ll" : plait_algorithms[c->algo].name,
                           plait_model_proto_name(c->proto),
                           c->nchannels, c->chunk_bytes, r->time_s * 1e6, r->busbw / 1e9, i == best);
                } else {
                    printf("%c %10s  %-13s %-6s %3d %9u %13.2f %11.3f\n", i == best ? '*' : ' ',
                           i == 0 ? human_size(size, hs, sizeof(hs)) : "",
                           c->proto == PLAIT_MPROTO_LL ? "ll" : plait_algorithms[c->algo].name,
                           plait_model_proto_name(c->proto), c->nchannels, c->chunk_bytes, r->time_s * 1e6,
                           r->busbw / 1e9);
                }
            }
        }
        if (size > a->to / (uint64_t)a->step)
            break;
        size *= (uint64_t)a->step;
    }
    plait_model_machine_free(&m);
    return status;
}

/* ---------------------------------------------------------------- --simulate */

/* What a child sends back for one point (full_point). */
struct point_msg {
    plait_result_t status;
    struct plait_model_result res;
    char why[256];
};

/* One point of an algorithm that needs the full replay above --max-full-ranks:
 * the most channels and the largest chunk (the tuner's first guess for a
 * large call), replayed in a child process that is killed after budget_s.
 * The cost of a full replay grows with ranks x pieces (1 GiB recursive
 * allgather on 4096 ranks: 33M pieces, half a minute), which no rank count
 * predicts well; a deadline does. Returns 0 with *out, 1 when the model
 * declined or failed (why), 2 when the deadline passed. */
static int full_point(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                      uint64_t count, int algo, int budget_s, struct plait_model_call *call,
                      struct plait_model_result *out, char *why, size_t whylen)
{
    plait_model_call_init(call, coll, count, ESIZE, algo, PLAIT_MPROTO_SIMPLE);
    call->slot_bytes = sp->slot_bytes;
    call->nslots = sp->nslots;
    call->radix = sp->radix;
    call->nchannels = sp->max_channels > 0 ? sp->max_channels : 1;
    call->chunk_bytes = sp->max_chunk_bytes;
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, whylen, "pipe: %s", strerror(errno));
        return 1;
    }
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        snprintf(why, whylen, "fork: %s", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        struct point_msg msg;
        memset(&msg, 0, sizeof(msg));
        msg.status = plait_model_time(m, call, PLAIT_MODEL_AUTO, &msg.res);
        if (msg.status != PLAIT_SUCCESS)
            snprintf(msg.why, sizeof(msg.why), "%s", plait_get_last_error(NULL));
        const char *p = (const char *)&msg;
        size_t left = sizeof(msg);
        while (left > 0) {
            const ssize_t w = write(fds[1], p, left);
            if (w <= 0)
                _exit(1);
            p += w;
            left -= (size_t)w;
        }
        _exit(0);
    }
    close(fds[1]);
    struct point_msg msg;
    size_t got = 0;
    const double deadline = now_s() + budget_s;
    int rc = 2;
    for (;;) {
        const double left = deadline - now_s();
        if (left <= 0)
            break;
        struct timeval tv = {.tv_sec = (time_t)left, .tv_usec = (suseconds_t)((left - (double)(time_t)left) * 1e6)};
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(fds[0], &rd);
        const int sel = select(fds[0] + 1, &rd, NULL, NULL, &tv);
        if (sel < 0 && errno == EINTR)
            continue;
        if (sel <= 0)
            break;
        const ssize_t r = read(fds[0], (char *)&msg + got, sizeof(msg) - got);
        if (r <= 0) {
            snprintf(why, whylen, "the replay's process ended without an answer");
            rc = 1;
            break;
        }
        got += (size_t)r;
        if (got == sizeof(msg)) {
            rc = msg.status == PLAIT_SUCCESS ? 0 : 1;
            if (rc == 0)
                *out = msg.res;
            else
                snprintf(why, whylen, "%s", msg.why);
            break;
        }
    }
    close(fds[0]);
    if (rc == 2)
        kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return rc;
}

static int run_simulate(const struct args *a)
{
    struct plait_model_consts k;
    const char *origin;
    int rc = load_constants(a->constants, &k, &origin);
    if (rc)
        return rc;
    struct plait_model_machine m;
    memset(&m, 0, sizeof(m));
    struct machine_desc d;
    double t0 = now_s();
    if ((rc = build_machine(a, &k, &m, &d)))
        return rc;
    const double build_s = now_s() - t0;
    const int n = m.nranks;
    char hs[32];
    printf("simulate: %s\n", d.text);
    printf("size %s per call (nccl-tests -b: whole buffer; allgather output / reducescatter input = per-rank x "
           "ranks); constants: %s\n",
           human_size(a->size, hs, sizeof(hs)), origin);
    printf("machine built in %.1f ms; algorithms that need the full replay: searched up to %d ranks "
           "(--max-full-ranks), above it one point within %d s (--full-budget)\n\n",
           build_s * 1e3, a->max_full_ranks, a->full_budget_s);
    printf("%-14s %-13s %-6s %3s %9s %14s %11s  %-8s %10s\n", "collective", "algorithm", "proto", "ch", "chunk",
           "time_us", "busbw_GB/s", "replay", "model_ms");

    const int order[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_REDUCESCATTER, PLAIT_COLL_BROADCAST,
                         PLAIT_COLL_ALLTOALL,  PLAIT_COLL_REDUCE,    PLAIT_COLL_GATHER,        PLAIT_COLL_SCATTER};
    int status = 0;
    double total_s = 0;
    for (size_t oi = 0; oi < sizeof(order) / sizeof(order[0]); oi++) {
        const int coll = order[oi];
        if (!a->colls[coll])
            continue;
        struct plait_tune_space sp;
        int channels = a->channels;
        if (channels == 0) {
            struct plait_settings set;
            channels = plait_settings_load(&set) == PLAIT_SUCCESS ? set.nchannels : 2;
            if (m.norder > channels)
                channels = m.norder;
        }
        if ((rc = tune_space(coll, n, channels, &sp))) {
            status = rc;
            break;
        }
        uint64_t bytes = tuner_bytes(coll, a->size, n);
        if (bytes == 0) {
            printf("%-14s (%s is less than one element per rank on %d ranks: skipped)\n", plait_coll_name(coll),
                   human_size(a->size, hs, sizeof(hs)), n);
            continue;
        }
        double best_t = INFINITY;
        const char *best_name = NULL;
        int shown = 0;
        /* algo 0: the small-message protocol alone (no schedule allowed); it is
         * listed once, not beside every algorithm. */
        for (int algo = 0; algo < PLAIT_ALGO_COUNT; algo++) {
            if (algo > 0 && !sp.allowed[algo])
                continue;
            shown += algo > 0;
            /* Whether the reduced replay applies: ask for it on a small call
             * (cheap either way). Algorithms that need the full replay cost
             * time in proportion to the ranks; above the cutoff they are
             * skipped with the reason rather than left to run for minutes. */
            struct plait_model_call probe;
            struct plait_model_result pr;
            plait_model_call_init(&probe, coll, (uint64_t)n * 64, ESIZE, algo, PLAIT_MPROTO_SIMPLE);
            probe.nchannels = 1;
            bool is_reduced = algo > 0 && m.nhosts > 1 &&
                              plait_model_time(&m, &probe, PLAIT_MODEL_REDUCED, &pr) == PLAIT_SUCCESS;
            if (algo > 0 && !is_reduced && n > a->max_full_ranks) {
                /* Not rotation-invariant: every rank is replayed. One point,
                 * within the budget, instead of the tuner's search. */
                if (a->full_budget_s == 0) {
                    printf("%-14s %-13s skipped: needs the full replay of %d ranks (not rotation-invariant), above "
                           "--max-full-ranks %d (--full-budget 0)\n",
                           plait_coll_name(coll), plait_algorithms[algo].name, n, a->max_full_ranks);
                    continue;
                }
                struct plait_model_call pc;
                struct plait_model_result r;
                memset(&r, 0, sizeof(r));
                char why[256] = "";
                const double s0 = now_s();
                const int prc = full_point(&m, &sp, coll, bytes / ESIZE, algo, a->full_budget_s, &pc, &r, why,
                                           sizeof(why));
                const double took = now_s() - s0;
                total_s += took;
                if (prc == 2) {
                    printf("%-14s %-13s skipped: the full replay of %d ranks (not rotation-invariant) took more than "
                           "%d s (--full-budget)\n",
                           plait_coll_name(coll), plait_algorithms[algo].name, n, a->full_budget_s);
                    continue;
                }
                if (prc == 1) {
                    printf("%-14s %-13s no prediction: %s\n", plait_coll_name(coll), plait_algorithms[algo].name, why);
                    continue;
                }
                printf("%-14s %-13s %-6s %3d %9llu %14.1f %11.2f  %-8s %10.1f\n", plait_coll_name(coll),
                       plait_algorithms[algo].name, "simple", pc.nchannels, (unsigned long long)pc.chunk_bytes,
                       r.time_s * 1e6, r.busbw / 1e9, r.extrapolated ? "full+1pt" : "full 1pt", took * 1e3);
                if (r.time_s < best_t) {
                    best_t = r.time_s;
                    best_name = plait_algorithms[algo].name;
                }
                continue;
            }
            struct plait_tune_space one = sp;
            memset(one.allowed, 0, sizeof(one.allowed));
            if (algo > 0)
                one.allowed[algo] = 1;
            struct plait_tune_candidate cands[PLAIT_MPROTO_COUNT * 2];
            int nc = 0, best = -1;
            double s0 = now_s();
            plait_result_t res = plait_tune_candidates(&m, &one, coll, bytes, ESIZE, cands,
                                                       (int)(sizeof(cands) / sizeof(cands[0])), &nc, &best);
            double took = now_s() - s0;
            total_s += took;
            if (res != PLAIT_SUCCESS) {
                printf("%-14s %-13s model failed: %s\n", plait_coll_name(coll), plait_algorithms[algo].name,
                       plait_get_last_error(NULL));
                status = 1;
                continue;
            }
            if (nc == 0 && algo == 0)
                continue;
            if (nc == 0) {
                printf("%-14s %-13s no prediction (the model declines this call)\n", plait_coll_name(coll),
                       plait_algorithms[algo].name);
                continue;
            }
            for (int i = 0; i < nc; i++) {
                const struct plait_tune_choice *c = &cands[i].choice;
                const struct plait_model_result *r = &cands[i].result;
                if ((c->proto == PLAIT_MPROTO_LL) != (algo == 0))
                    continue;
                const char *name = c->proto == PLAIT_MPROTO_LL ? "ll" : plait_algorithms[c->algo].name;
                printf("%-14s %-13s %-6s %3d %9u %14.1f %11.2f  %-8s %10.1f\n", plait_coll_name(coll), name,
                       plait_model_proto_name(c->proto), c->nchannels, c->chunk_bytes, r->time_s * 1e6, r->busbw / 1e9,
                       r->mode == PLAIT_MODEL_REDUCED ? (r->extrapolated ? "reduced+" : "reduced")
                                                      : (r->extrapolated ? "full+" : "full"),
                       took * 1e3);
                if (r->time_s < best_t) {
                    best_t = r->time_s;
                    best_name = name;
                }
            }
        }
        if (shown == 0)
            printf("%-14s no algorithm implements it on %d ranks\n", plait_coll_name(coll), n);
        else if (best_name)
            printf("%-14s fastest: %s (%.1f us)\n", plait_coll_name(coll), best_name, best_t * 1e6);
        printf("\n");
    }
    printf("model time in all: %.2f s (replay: reduced = host 0's ranks only, full = every rank; + = two shorter "
           "counts extrapolated; 1pt = one point, the most channels and the largest chunk, not searched)\n",
           total_s);
    plait_model_machine_free(&m);
    return status;
}

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
        double t0 = now_s();
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
        double t = now_s() - t0;
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
 * seconds. env: "NAME=VALUE" pairs set for the children only (NULL ends). */
static int bench_procs(int nranks, const struct bench_spec *s, const char *const *env, double *out, char *why,
                       size_t whylen)
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
                double deadline = now_s() + CAL_DEADLINE_S;
                while (atomic_load(&sh->id_ready) == 0 && now_s() < deadline)
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
    double deadline = now_s() + CAL_DEADLINE_S;
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
        if (!is_killed && now_s() > deadline) {
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
        *out = median(sh->secs, sh->nreps);
    else
        failed = 1;
    munmap(sh, sizeof(*sh));
    return failed ? -1 : 0;
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
        double t0 = now_s();
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
        double t1 = now_s();
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
    *out = median(worst, reps);
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
            if (now_s() > deadline)
                return false;
        }
    }
}

/* The responder: echoes every new ping until FLAG_STOP or the deadline. */
static void flag_responder(struct flags *f, bool always_yield)
{
    const double deadline = now_s() + CAL_DEADLINE_S;
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
            if (now_s() > deadline)
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
    const double deadline = now_s() + CAL_DEADLINE_S;
    for (int rep = -1; rep < reps && ok; rep++) {
        const double t0 = now_s();
        long trips = 0;
        double t = 0;
        do {
            for (int i = 0; i < 256 && ok; i++) {
                atomic_store_explicit(&f->ping, ++seq, memory_order_release);
                ok = flag_wait(&f->pong, seq, always_yield, deadline);
            }
            trips += 256;
            t = now_s() - t0;
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
    *out = median(secs, reps);
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

static int run_calibrate(const struct args *a)
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
            return bad_input("--out %s: %s", out, strerror(errno));
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

    struct plait_model_consts k;
    plait_model_consts_default(&k);
    const int C = PLAIT_MENGINE_CPU;
    const double t_start = now_s();
    const int nthreads = c.ncores < 2 ? 1 : 2;
    char why[300];
    int nfailed = 0;
    char comment[2048];
    size_t clen = 0;
    comment[0] = '\0';

    printf("plait-tune --calibrate%s: %d %s available; medians of %d repetitions\n", a->is_quick ? " --quick" : "",
           c.ncores, c.ncores == 1 ? "core" : "cores", c.reps);
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

    /* TCP over loopback. */
    printf("\nplait, 2 processes over TCP (PLAIT_TRANSPORT=socket, loopback):\n");
    static const char *const env_sock[] = {"PLAIT_TRANSPORT=socket", "PLAIT_PROTO=simple", "PLAIT_CMA=0", NULL};
    double pp_sock = NAN;
    why[0] = '\0';
    if (bench_procs(2, &pp, env_sock, &pp_sock, why, sizeof(why)) == 0 && isfinite(cpu_part)) {
        printf("  8 B ping-pong, half round trip: %.3f us\n", pp_sock * 1e6);
        v = pp_sock - cpu_part;
        if (v <= 0)
            v = pp_sock / 2;
        k.alpha[PLAIT_MLINK_SOCKET] = v;
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
    if (bench_procs(2, &sst, env_sock, &v, why, sizeof(why)) == 0) {
        v /= (double)stream_bytes;
        k.beta[PLAIT_MLINK_SOCKET] = v;
        say("beta.socket", v, "", "2 processes exchanging over TCP, per byte");
    } else {
        printf("  stream failed: %s\n", why);
        keep_default("beta.socket", "the stream failed");
        nfailed++;
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
    const double took = now_s() - t_start;
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32];
    strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M UTC", gmtime_r(&now, &tm));
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    clen += (size_t)snprintf(comment + clen, sizeof(comment) - clen,
                             "plait-tune --calibrate%s on %s, %s, %d cores, %.0f s; medians of %d repetitions.\n"
                             "GPU, NVLink, PCIe and NET constants are the defaults (not measured here).",
                             a->is_quick ? " --quick" : "", host, stamp, c.ncores, took, c.reps);
    if (busy > 0.15)
        clen += (size_t)snprintf(comment + clen, sizeof(comment) - clen,
                                 "\nWARNING: the machine was busy (%.0f%% CPU used by others): figures are skewed.",
                                 busy * 100);
    if (nfailed)
        snprintf(comment + clen, sizeof(comment) - clen, "\n%d constants could not be measured and keep defaults.",
                 nfailed);
    plait_result_t res = plait_model_consts_save(out, &k, comment);
    if (res != PLAIT_SUCCESS)
        return failure("writing %s: %s", out, plait_get_last_error(NULL));
    printf("\nwrote %s (%.1f s)%s\n", out, took,
           nfailed ? "; some constants keep their defaults (see above)" : "");
    printf("use it: PLAIT_TUNE_CONSTANTS=%s, or plait-tune --explain --constants %s\n", out, out);
    return nfailed ? EXIT_FAILURE : 0;
}

int main(int argc, char **argv)
{
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    switch (a.mode) {
    case MODE_CALIBRATE:
        return run_calibrate(&a);
    case MODE_EXPLAIN:
        return run_explain(&a);
    case MODE_SIMULATE:
        return run_simulate(&a);
    default:
        return run_list_algos(&a);
    }
}
