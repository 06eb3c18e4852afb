/* plait-tune: the cost model and the tuner from the command line
 * (docs/tuning.md).
 *
 *   --calibrate  measures the constants of tuning/model.h on this machine
 *                (memory copies, reductions, flag ping-pongs, plait's own
 *                ping-pong, streams and small collectives over shm, inproc and
 *                socket; --netns: the socket link across two network
 *                namespaces) and writes a constants file (tools/tune/calibrate.c);
 *   --explain    prints, per size, every candidate (algorithm, protocol) the
 *                tuner weighs, its predicted time and busbw, and the one it
 *                picks (--tsv: rows for perf/model_check) (explain.c);
 *   --simulate   predicts every collective and algorithm on N copies of a
 *                recorded host (tests/fixtures/topo) up to thousands of ranks
 *                (simulate.c).
 *
 * This file: the usage text, the command line, --list-algos and main. What the
 * modes share is in common.c (tools/tune/tune.h).
 *
 * Exit status: 0 done, 1 a failure (a file, a measurement, the model), 2 a
 * usage error. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "plait.h"
#include "tools/tune/tune.h"
#include "topology/topo.h"
#include "tuning/model.h"

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
    "  --netns            measure the socket link (alpha.socket, beta.socket) between two network namespaces\n"
    "                     joined by a veth, as between two hosts, instead of over loopback (needs root)\n"
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

static int parse_args(int argc, char **argv, struct tune_args *a)
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
        {"--netns", 1u << MODE_CALIBRATE},
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
                return tune_usage_error("unknown %s '%s'", arg[0] == '-' ? "option" : "argument", arg);
            snprintf(name, sizeof(name), "%s", arg);
        }

        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            if (value)
                return tune_usage_error("%s takes no value (got '%s')", name, arg);
            fputs(usage_text, stdout);
            exit(EXIT_SUCCESS);
        }
        bool is_mode = false;
        for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
            if (strcmp(name, modes[m].name) != 0)
                continue;
            if (value)
                return tune_usage_error("%s takes no value (got '%s')", name, arg);
            if (a->mode && a->mode != modes[m].mode)
                return tune_usage_error("%s: only one of --calibrate, --explain, --simulate, --list-algos at a time",
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
            return tune_usage_error("unknown %s '%s'", arg[0] == '-' ? "option" : "argument", arg);
        seen[which] = applies[which].name;

        if (strcmp(name, "--quick") == 0 || strcmp(name, "--tsv") == 0 || strcmp(name, "--netns") == 0) {
            if (value)
                return tune_usage_error("%s takes no value (got '%s')", name, arg);
            if (name[2] == 'q')
                a->is_quick = true;
            else if (name[2] == 'n')
                a->is_netns = true;
            else
                a->is_tsv = true;
            continue;
        }
        bool is_valued = false;
        for (size_t v = 0; v < sizeof(valued) / sizeof(valued[0]); v++)
            is_valued |= strcmp(name, valued[v]) == 0;
        if (!is_valued)
            return tune_usage_error("unknown option '%s'", arg);
        if (!value) {
            if (i + 1 >= argc)
                return tune_usage_error("%s needs a value", name);
            value = argv[++i];
        }
        if (!*value)
            return tune_usage_error("%s: the value is empty", name);

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
                    return tune_usage_error("--coll '%.*s': unknown collective (valid: %s%s)", (int)len, p, valid_colls,
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
                return tune_usage_error("--ranks '%s': expected a number of ranks from 1 to 65536", value);
            a->has_ranks = true;
        } else if (strcmp(name, "--nodes") == 0) {
            if (!parse_int(value, 1, 4096, &a->nodes))
                return tune_usage_error("--nodes '%s': expected a number of nodes from 1 to 4096", value);
            a->has_nodes = true;
        } else if (strcmp(name, "--link") == 0) {
            if (strcmp(value, "shm") == 0)
                a->link = PLAIT_MLINK_SHM;
            else if (strcmp(value, "inproc") == 0)
                a->link = PLAIT_MLINK_INPROC;
            else if (strcmp(value, "socket") == 0)
                a->link = PLAIT_MLINK_TCP;
            else
                return tune_usage_error("--link '%s': expected shm, inproc or socket", value);
            a->has_link = true;
        } else if (strcmp(name, "--from") == 0 || strcmp(name, "--to") == 0 || strcmp(name, "--size") == 0) {
            uint64_t v;
            if (!parse_size(value, &v))
                return tune_usage_error("%s '%s': expected a size in bytes of at least 1, with an optional K, M, G or "
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
                return tune_usage_error("--step '%s': expected an integer factor of at least 2", value);
            a->has_step = true;
        } else if (strcmp(name, "--channels") == 0) {
            if (!parse_int(value, 1, 64, &a->channels))
                return tune_usage_error("--channels '%s': expected a number of channels from 1 to 64", value);
        } else if (strcmp(name, "--full-budget") == 0) {
            if (!parse_int(value, 0, 3600, &a->full_budget_s))
                return tune_usage_error("--full-budget '%s': expected seconds from 0 to 3600", value);
        } else {
            if (!parse_int(value, 1, 1 << 20, &a->max_full_ranks))
                return tune_usage_error("--max-full-ranks '%s': expected a number of ranks of at least 1", value);
        }
    }

    if (!a->mode)
        return tune_usage_error("no mode: give --calibrate, --explain, --simulate or --list-algos");
    for (size_t k = 0; k < sizeof(applies) / sizeof(applies[0]); k++) {
        if (seen[k] && !(applies[k].modes & (1u << a->mode))) {
            static const char *const mode_names[] = {"", "--calibrate", "--explain", "--simulate", "--list-algos"};
            return tune_usage_error("%s does not apply to %s", seen[k], mode_names[a->mode]);
        }
    }
    if (a->mode != MODE_SIMULATE && a->coll < 0)
        return tune_usage_error("--coll: %s takes one collective", a->mode == MODE_EXPLAIN ? "--explain" : "--list-algos");
    if (a->mode == MODE_SIMULATE && !a->has_colls) {
        a->colls[PLAIT_COLL_ALLREDUCE] = a->colls[PLAIT_COLL_ALLGATHER] = true;
        a->colls[PLAIT_COLL_REDUCESCATTER] = a->colls[PLAIT_COLL_BROADCAST] = true;
        a->colls[PLAIT_COLL_ALLTOALL] = true;
    }
    if (a->mode == MODE_SIMULATE && !a->topo_file)
        return tune_usage_error("--simulate needs --topo FILE (e.g. tests/fixtures/topo/dgx-h100.xml)");
    if (a->mode == MODE_EXPLAIN) {
        if (a->has_nodes && !a->topo_file)
            return tune_usage_error("--nodes needs --topo FILE (without it the machine is this host)");
        if (a->has_link && a->topo_file)
            return tune_usage_error("--link applies to this host; with --topo the links come from the topology");
        if (a->from > a->to)
            return tune_usage_error("--from %llu is above --to %llu", (unsigned long long)a->from,
                               (unsigned long long)a->to);
    }
    return 0;
}

/* ---------------------------------------------------------------- --list-algos */

static int run_list_algos(const struct tune_args *a)
{
    for (int i = 1; i < PLAIT_ALGO_COUNT; i++)
        if (plait_algorithms[i].step && plait_algorithms[i].supports(a->coll, a->ranks))
            printf("%s\n", plait_algorithms[i].name);
    return 0;
}

int main(int argc, char **argv)
{
    struct tune_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    switch (a.mode) {
    case MODE_CALIBRATE:
        return tune_calibrate(&a);
    case MODE_EXPLAIN:
        return tune_explain(&a);
    case MODE_SIMULATE:
        return tune_simulate(&a);
    default:
        return run_list_algos(&a);
    }
}
