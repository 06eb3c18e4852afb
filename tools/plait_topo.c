/* plait-topo: the machine as plait sees it (docs/topology.md). By default it
 * discovers this host and prints a one-line summary and the device matrix of
 * `nvidia-smi topo -m` with its legend; it can also load a recorded machine
 * (plait or NCCL XML, or hwloc XML and a /sys tree for discovery), dump the
 * graph as plait's XML, and print bandwidths, every path, the NIC nearest each
 * GPU, the channels the search chooses for N ranks per host, and a Graphviz
 * graph. Exit status: 0 done, 1 a failure (a file, discovery, the search),
 * 2 a usage error. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "plait.h"
#include "topology/topo.h"

#define EXIT_USAGE 2

/* Output sections, a bit each; none asked for means the default set. */
enum {
    OUT_SUMMARY = 1u << 0,
    OUT_MATRIX = 1u << 1, /* with its legend */
    OUT_BW = 1u << 2,
    OUT_PATHS = 1u << 3,
    OUT_AFFINITY = 1u << 4,
    OUT_RANKS = 1u << 5,
    OUT_DOT = 1u << 6,
};
#define OUT_DEFAULT (OUT_SUMMARY | OUT_MATRIX)
#define OUT_ALL (OUT_SUMMARY | OUT_MATRIX | OUT_BW | OUT_PATHS | OUT_AFFINITY | OUT_RANKS | OUT_DOT)

struct args {
    const char *load;
    const char *dump;
    struct plait_topo_discover_opts dopts;
    bool has_discover_opts; /* any of --hwloc-xml, --fsroot, --nvml-lib, --no-nvml */
    unsigned out;
    int ranks; /* 0: not asked (--all then uses one rank per GPU, or per NUMA node) */
    int hosts;
    bool has_hosts;
};

static const char usage_text[] =
    "usage: plait-topo [SOURCE] [OUTPUT...]\n"
    "\n"
    "Prints the machine's topology as plait sees it (docs/topology.md).\n"
    "\n"
    "Source (default: discover this machine):\n"
    "  --load FILE        a graph in plait's XML or NCCL's (NCCL_TOPO_FILE) format\n"
    "  --hwloc-xml FILE   discover with the CPU/PCI part from this hwloc XML\n"
    "  --fsroot DIR       discover with DIR as the root of /sys (a recorded tree)\n"
    "  --nvml-lib PATH    discover GPUs through this NVML library\n"
    "  --no-nvml          discover without NVML (no GPUs)\n"
    "  --dump FILE        write the graph as plait's XML (\"-\": stdout); alone, nothing else is printed\n"
    "\n"
    "Output (default: --summary --matrix):\n"
    "  --summary          one line: host, NUMA nodes and cores, GPUs, NICs, NVSwitch fabrics\n"
    "  --matrix           the path type between every two devices, like `nvidia-smi topo -m`, and its legend\n"
    "  --bw               the bandwidth of the best path between every two devices, GB/s\n"
    "  --paths            every pair of devices (GPUs, NICs, NUMA nodes): type, GB/s, hops, via\n"
    "  --affinity         the NIC nearest each GPU: path type, GB/s, GPUDirect RDMA, NUMA node\n"
    "  --ranks N          the rings and trees channel search chooses for N ranks on this host\n"
    "                     (on GPUs 0..N-1; with no GPU, CPU ranks spread over the NUMA nodes)\n"
    "  --hosts H          with --ranks: H hosts (more than 1: channels enter and leave through NICs)\n"
    "  --dot              a Graphviz graph of the nodes and links\n"
    "  --all              everything above (--ranks defaults to one rank per GPU, or per NUMA node)\n"
    "  --help             this text\n"
    "\n"
    "Exit status: 0 done, 1 failure, 2 usage error.\n";

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("plait-topo: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n\n", stderr);
    fputs(usage_text, stderr);
    return EXIT_USAGE;
}

static int failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int failure(const char *fmt, ...)
{
    va_list ap;
    fputs("plait-topo: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return EXIT_FAILURE;
}

/* A whole decimal integer in [lo, hi]; "8x" or "" is not one. */
static bool parse_int(const char *s, int lo, int hi, int *out)
{
    long v;
    if (!plait_topo_parse_long(s, lo, hi, &v))
        return false;
    *out = (int)v;
    return true;
}

/* Options take their value as the next argument or after '=' ("--load=x.xml"),
 * as users of GNU tools expect; a flag given a value is a usage error. */
static int parse_args(int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof(*a));
    a->hosts = 1;
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
            snprintf(name, sizeof(name), "%s", arg);
            if (strlen(arg) >= sizeof(name))
                return usage_error("unknown option '%s'", arg);
        }

        static const struct {
            const char *name;
            unsigned bit;
        } flags[] = {
            {"--summary", OUT_SUMMARY}, {"--matrix", OUT_MATRIX}, {"--bw", OUT_BW},   {"--paths", OUT_PATHS},
            {"--affinity", OUT_AFFINITY}, {"--dot", OUT_DOT},     {"--all", OUT_ALL}, {"--no-nvml", 0},
            {"--help", 0},
        };
        bool is_flag = false;
        for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]); f++) {
            if (strcmp(name, flags[f].name) != 0)
                continue;
            if (value)
                return usage_error("%s takes no value (got '%s')", name, arg);
            a->out |= flags[f].bit;
            is_flag = true;
        }
        if (is_flag) {
            if (strcmp(name, "--help") == 0) {
                fputs(usage_text, stdout);
                exit(EXIT_SUCCESS);
            }
            if (strcmp(name, "--no-nvml") == 0) {
                a->dopts.no_nvml = true;
                a->has_discover_opts = true;
            }
            continue;
        }

        static const char *const valued[] = {"--load", "--dump", "--hwloc-xml", "--fsroot", "--nvml-lib", "--ranks",
                                             "--hosts"};
        bool is_valued = false;
        for (size_t v = 0; v < sizeof(valued) / sizeof(valued[0]); v++)
            is_valued |= strcmp(name, valued[v]) == 0;
        if (!is_valued)
            return usage_error("unknown %s '%s'", arg[0] == '-' ? "option" : "argument", arg);
        if (!value) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", name);
            value = argv[++i];
        }
        if (!*value)
            return usage_error("%s: the value is empty", name);

        if (strcmp(name, "--load") == 0) {
            a->load = value;
        } else if (strcmp(name, "--dump") == 0) {
            a->dump = value;
        } else if (strcmp(name, "--hwloc-xml") == 0) {
            a->dopts.hwloc_xml = value;
            a->has_discover_opts = true;
        } else if (strcmp(name, "--fsroot") == 0) {
            a->dopts.fsroot = value;
            a->has_discover_opts = true;
        } else if (strcmp(name, "--nvml-lib") == 0) {
            a->dopts.nvml_lib = value;
            a->has_discover_opts = true;
        } else if (strcmp(name, "--ranks") == 0) {
            if (!parse_int(value, 1, PLAIT_TOPO_MAX_LOCAL, &a->ranks))
                return usage_error("--ranks '%s': expected a number of ranks from 1 to %d", value,
                                   PLAIT_TOPO_MAX_LOCAL);
            a->out |= OUT_RANKS;
        } else {
            if (!parse_int(value, 1, INT_MAX, &a->hosts))
                return usage_error("--hosts '%s': expected a number of hosts of at least 1", value);
            a->has_hosts = true;
        }
    }
    if (a->load && a->has_discover_opts)
        return usage_error("--load reads a graph from a file; --hwloc-xml, --fsroot, --nvml-lib and --no-nvml "
                           "only apply to discovery");
    if (a->dopts.no_nvml && a->dopts.nvml_lib)
        return usage_error("--no-nvml and --nvml-lib %s contradict each other", a->dopts.nvml_lib);
    if (a->has_hosts && !(a->out & OUT_RANKS))
        return usage_error("--hosts only applies with --ranks or --all");
    if (a->out == 0 && !a->dump)
        a->out = OUT_DEFAULT;
    return 0;
}

/* ---------------------------------------------------------------- labels and formatting */

/* The label the matrix and the fixtures use: GPUi, NICi, CPUi (NUMA node i), NVSi, PCIi. */
static const char *node_label(const struct plait_topo *topo, int n, char *buf, size_t len)
{
    static const char *const prefix[PLAIT_TOPO_NODE_TYPES] = {"CPU", "PCI", "GPU", "NIC", "NVS"};
    const struct plait_topo_node *node = &topo->nodes[n];
    snprintf(buf, len, "%s%d", node->type < PLAIT_TOPO_NODE_TYPES ? prefix[node->type] : "?", node->index);
    return buf;
}

/* GB/s as people read it: "450", "63.0" would claim a precision the figures do
 * not have, so whole numbers lose their decimals and others keep one. */
static const char *fmt_bw(double bw, char *buf, size_t len)
{
    if (fabs(bw - round(bw)) < 0.05)
        snprintf(buf, len, "%.0f", bw);
    else
        snprintf(buf, len, "%.1f", bw);
    return buf;
}

static const char *plural(int n, const char *one, const char *many) { return n == 1 ? one : many; }

/* The devices of the matrix in its order: GPUs by index, then NICs by index. */
static int matrix_devices(const struct plait_topo *topo, int *devs)
{
    int n = 0;
    for (int i = 0; i < topo->counts[PLAIT_TOPO_GPU]; i++)
        devs[n++] = plait_topo_nth(topo, PLAIT_TOPO_GPU, i);
    for (int i = 0; i < topo->counts[PLAIT_TOPO_NIC]; i++)
        devs[n++] = plait_topo_nth(topo, PLAIT_TOPO_NIC, i);
    return n;
}

/* ---------------------------------------------------------------- summary */

/* Counts of equal strings, for "8x NVIDIA H100, 2x NVIDIA A100": the few
 * distinct models or NIC kinds a host has, in order of first appearance. */
struct tally {
    int n;
    char key[16][PLAIT_TOPO_STR_LEN + 32];
    int count[16];
    int others; /* beyond the 16 kinds kept */
};

static void tally_add(struct tally *t, const char *key)
{
    for (int i = 0; i < t->n; i++) {
        if (strcmp(t->key[i], key) == 0) {
            t->count[i]++;
            return;
        }
    }
    if (t->n == (int)(sizeof(t->count) / sizeof(t->count[0]))) {
        t->others++;
        return;
    }
    snprintf(t->key[t->n], sizeof(t->key[0]), "%s", key);
    t->count[t->n++] = 1;
}

static void tally_print(const struct tally *t)
{
    printf(" (");
    for (int i = 0; i < t->n; i++)
        printf("%s%dx %s", i ? ", " : "", t->count[i], t->key[i]);
    if (t->others)
        printf(", %d others", t->others);
    printf(")");
}

static void print_summary(const struct plait_topo *topo, const char *origin)
{
    int ncpu = topo->counts[PLAIT_TOPO_CPU], ngpu = topo->counts[PLAIT_TOPO_GPU];
    int nnic = topo->counts[PLAIT_TOPO_NIC], nnvs = topo->counts[PLAIT_TOPO_NVS];
    int cores = 0, switches = 0;
    bool cores_unknown = false;
    struct tally gpus = {0}, nics = {0};
    for (int i = 0; i < topo->nnodes; i++) {
        const struct plait_topo_node *n = &topo->nodes[i];
        char key[PLAIT_TOPO_STR_LEN + 32];
        switch (n->type) {
        case PLAIT_TOPO_CPU:
            cores += n->cpu.ncores;
            cores_unknown |= n->cpu.ncores == 0;
            break;
        case PLAIT_TOPO_GPU:
            tally_add(&gpus, n->gpu.model[0] ? n->gpu.model : "unknown model");
            break;
        case PLAIT_TOPO_NIC:
            if (n->nic.speed > 0)
                snprintf(key, sizeof(key), "%g Gb/s %s%s", n->nic.speed, plait_topo_link_layer_name(n->nic.link_layer),
                         n->nic.is_virtual ? " virtual" : "");
            else
                snprintf(key, sizeof(key), "unknown speed %s%s", plait_topo_link_layer_name(n->nic.link_layer),
                         n->nic.is_virtual ? " virtual" : "");
            tally_add(&nics, key);
            break;
        case PLAIT_TOPO_NVS:
            switches += n->nvs.count;
            break;
        default:
            break;
        }
    }

    printf("host %s: %d NUMA %s", topo->host[0] ? topo->host : "(unknown)", ncpu, plural(ncpu, "node", "nodes"));
    if (cores_unknown && cores == 0)
        printf(" (cores unknown)");
    else
        printf(" (%d%s %s)", cores, cores_unknown ? "+" : "", plural(cores, "core", "cores"));
    if (ngpu) {
        printf(", %d %s", ngpu, plural(ngpu, "GPU", "GPUs"));
        tally_print(&gpus);
    } else {
        printf(", no GPUs");
    }
    if (nnic) {
        printf(", %d %s", nnic, plural(nnic, "NIC", "NICs"));
        tally_print(&nics);
    } else {
        printf(", no NICs");
    }
    if (nnvs) {
        printf(", %d NVSwitch %s", nnvs, plural(nnvs, "fabric", "fabrics"));
        if (switches)
            printf(" (%d %s)", switches, plural(switches, "NVSwitch", "NVSwitches"));
    } else {
        printf(", no NVSwitch");
    }
    /* The source goes last, in brackets, so that a dump and its reload (which
     * differ only there) print the same summary up to it. */
    printf("  [%s: %s]\n", topo->source[0] ? topo->source : "unknown source", origin);
}

/* ---------------------------------------------------------------- matrices */

static void numa_affinity(const struct plait_topo *topo, int n, const char **cpuset, char *numa, size_t len)
{
    int numa_idx = topo->nodes[n].numa;
    int cpu = numa_idx >= 0 ? plait_topo_nth(topo, PLAIT_TOPO_CPU, numa_idx) : -1;
    *cpuset = cpu >= 0 && topo->nodes[cpu].cpu.cpuset[0] ? topo->nodes[cpu].cpu.cpuset : "N/A";
    if (numa_idx >= 0)
        snprintf(numa, len, "%d", numa_idx);
    else
        snprintf(numa, len, "N/A");
}

/* One matrix over the GPUs and NICs; `cell` writes the text of a (row, col)
 * pair. Columns are as wide as their widest cell so that the output stays
 * readable and splits on whitespace into the tokens the fixtures list. */
typedef void (*cell_fn)(const struct plait_topo *topo, const struct plait_topo_paths *paths, int from, int to,
                        char *buf, size_t len);

static void path_cell(const struct plait_topo *topo, const struct plait_topo_paths *paths, int from, int to, char *buf,
                      size_t len)
{
    (void)topo;
    plait_topo_path_label(plait_topo_path(paths, from, to), buf, len);
}

static void bw_cell(const struct plait_topo *topo, const struct plait_topo_paths *paths, int from, int to, char *buf,
                    size_t len)
{
    (void)topo;
    const struct plait_topo_path *p = plait_topo_path(paths, from, to);
    if (from == to)
        snprintf(buf, len, "X");
    else if (p->type == PLAIT_PATH_DIS || p->bw <= 0)
        snprintf(buf, len, "-");
    else
        fmt_bw(p->bw, buf, len);
}

static int print_matrix(const struct plait_topo *topo, const struct plait_topo_paths *paths, cell_fn cell)
{
    int ndev = topo->counts[PLAIT_TOPO_GPU] + topo->counts[PLAIT_TOPO_NIC];
    if (ndev == 0) {
        printf("no GPUs and no NICs: no devices to show\n");
        return 0;
    }
    int *devs = malloc(sizeof(int) * (size_t)ndev);
    if (!devs)
        return failure("out of memory");
    matrix_devices(topo, devs);

    char buf[PLAIT_TOPO_STR_LEN], numa[16];
    const char *cpuset;
    int width = 4, cpuset_width = (int)strlen("CPU Affinity");
    for (int r = 0; r < ndev; r++) {
        if ((int)strlen(node_label(topo, devs[r], buf, sizeof(buf))) > width)
            width = (int)strlen(buf);
        for (int c = 0; c < ndev; c++) {
            cell(topo, paths, devs[r], devs[c], buf, sizeof(buf));
            if ((int)strlen(buf) > width)
                width = (int)strlen(buf);
        }
        numa_affinity(topo, devs[r], &cpuset, numa, sizeof(numa));
        if ((int)strlen(cpuset) > cpuset_width)
            cpuset_width = (int)strlen(cpuset);
    }
    width += 2;

    if (topo->counts[PLAIT_TOPO_GPU] == 0)
        printf("no GPUs\n");
    printf("%-*s", width, "");
    for (int c = 0; c < ndev; c++)
        printf("%-*s", width, node_label(topo, devs[c], buf, sizeof(buf)));
    printf("%-*s  %s\n", cpuset_width, "CPU Affinity", "NUMA Affinity");
    for (int r = 0; r < ndev; r++) {
        printf("%-*s", width, node_label(topo, devs[r], buf, sizeof(buf)));
        for (int c = 0; c < ndev; c++) {
            cell(topo, paths, devs[r], devs[c], buf, sizeof(buf));
            printf("%-*s", width, buf);
        }
        numa_affinity(topo, devs[r], &cpuset, numa, sizeof(numa));
        printf("%-*s  %s\n", cpuset_width, cpuset, numa);
    }
    free(devs);
    return 0;
}

static void print_legend(const struct plait_topo *topo)
{
    /* In plait's order of preference, best first, as docs/topology.md defines them. */
    static const char legend[] = "Legend:\n"
                                 "\n"
                                 "  X    = the device itself\n"
                                 "  NV#  = NVLink, directly or through NVSwitches; # = the fewest links on the way\n"
                                 "  NVB  = NVLink through another GPU on the way\n"
                                 "  C2C  = a GPU and its own CPU over NVLink-C2C (Grace)\n"
                                 "  PIX  = PCIe through at most one PCIe switch\n"
                                 "  PXB  = PCIe through several PCIe switches, without reaching a host bridge\n"
                                 "  P2C  = GPU over C2C to its CPU, then down PCIe to the device (Grace)\n"
                                 "  PXN  = GPU over NVLink to another GPU, then to the NIC beside it (PIX, PXB or P2C)\n"
                                 "  PHB  = PCIe through a host bridge, that is through the CPU of one NUMA node\n"
                                 "  SYS  = across the link between NUMA nodes or sockets (UPI, Infinity Fabric)\n"
                                 "  NET  = across the network, between hosts\n"
                                 "  DIS  = not connected\n";
    printf("\n%s", legend);
    if (topo->counts[PLAIT_TOPO_NIC] == 0)
        return;
    printf("\nNIC Legend:\n\n");
    for (int i = 0; i < topo->counts[PLAIT_TOPO_NIC]; i++) {
        int n = plait_topo_nth(topo, PLAIT_TOPO_NIC, i);
        if (n < 0)
            continue;
        const struct plait_topo_nic *nic = &topo->nodes[n].nic;
        char speed[32];
        if (nic->speed > 0)
            snprintf(speed, sizeof(speed), "%g Gb/s", nic->speed);
        else
            snprintf(speed, sizeof(speed), "speed unknown");
        printf("  NIC%d: %s (port %d%s%s, %s %s%s)\n", i, nic->dev[0] ? nic->dev : topo->nodes[n].name, nic->port,
               nic->netdev[0] ? ", " : "", nic->netdev, speed, plait_topo_link_layer_name(nic->link_layer),
               nic->is_virtual ? ", virtual" : "");
    }
}

/* ---------------------------------------------------------------- paths and affinity */

static void print_paths(const struct plait_topo *topo, const struct plait_topo_paths *paths)
{
    /* NUMA nodes count as devices here: CPU ranks run on them. */
    static const enum plait_topo_node_type kinds[] = {PLAIT_TOPO_GPU, PLAIT_TOPO_NIC, PLAIT_TOPO_CPU};
    int ndev = 0;
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        ndev += topo->counts[kinds[k]];
    printf("Paths (from -> to; GB/s in that direction):\n\n");
    printf("  %-7s %-7s %-5s %9s %5s %8s %s\n", "from", "to", "type", "GB/s", "hops", "nvlinks", "via");
    for (size_t kf = 0; kf < sizeof(kinds) / sizeof(kinds[0]); kf++) {
        for (int i = 0; i < topo->counts[kinds[kf]]; i++) {
            int from = plait_topo_nth(topo, kinds[kf], i);
            for (size_t kt = 0; kt < sizeof(kinds) / sizeof(kinds[0]); kt++) {
                for (int j = 0; j < topo->counts[kinds[kt]]; j++) {
                    int to = plait_topo_nth(topo, kinds[kt], j);
                    if (from < 0 || to < 0 || from == to)
                        continue;
                    const struct plait_topo_path *p = plait_topo_path(paths, from, to);
                    char a[16], b[16], via[16], bw[32], nvl[16];
                    if (p->via >= 0 && p->via < topo->nnodes)
                        node_label(topo, p->via, via, sizeof(via));
                    else
                        snprintf(via, sizeof(via), "-");
                    if (p->type == PLAIT_PATH_NVL || p->type == PLAIT_PATH_NVB)
                        snprintf(nvl, sizeof(nvl), "%d", p->nvlinks);
                    else
                        snprintf(nvl, sizeof(nvl), "-");
                    printf("  %-7s %-7s %-5s %9s %5d %8s %s\n", node_label(topo, from, a, sizeof(a)),
                           node_label(topo, to, b, sizeof(b)), plait_topo_path_type_name(p->type),
                           p->type == PLAIT_PATH_DIS ? "-" : fmt_bw(p->bw, bw, sizeof(bw)), p->hops, nvl, via);
                }
            }
        }
    }
    if (ndev < 2)
        printf("  (fewer than two devices)\n");
}

static int print_affinity(const struct plait_topo *topo, const struct plait_topo_paths *paths)
{
    printf("Nearest NIC per GPU:\n\n");
    if (topo->counts[PLAIT_TOPO_GPU] == 0) {
        printf("  no GPUs\n");
        return 0;
    }
    printf("  %-6s %-6s %-12s %-5s %8s %-4s %s\n", "GPU", "NIC", "device", "type", "GB/s", "GDR", "NUMA");
    for (int i = 0; i < topo->counts[PLAIT_TOPO_GPU]; i++) {
        int g = plait_topo_nth(topo, PLAIT_TOPO_GPU, i);
        struct plait_topo_affinity aff;
        plait_result_t r = plait_topo_affinity(topo, paths, g, &aff);
        if (r != PLAIT_SUCCESS)
            return failure("nearest NIC of GPU%d: %s", i, plait_last_error_get());
        char a[16], b[16], bw[32], numa[16];
        if (aff.cpu >= 0)
            snprintf(numa, sizeof(numa), "%d", topo->nodes[aff.cpu].index);
        else
            snprintf(numa, sizeof(numa), "N/A");
        if (aff.nic < 0) {
            printf("  %-6s %-6s %-12s %-5s %8s %-4s %s\n", node_label(topo, g, a, sizeof(a)), "none", "-", "-", "-",
                   "no", numa);
            continue;
        }
        const struct plait_topo_node *nic = &topo->nodes[aff.nic];
        printf("  %-6s %-6s %-12s %-5s %8s %-4s %s\n", node_label(topo, g, a, sizeof(a)),
               node_label(topo, aff.nic, b, sizeof(b)), nic->nic.dev[0] ? nic->nic.dev : nic->name,
               plait_topo_path_type_name(aff.type), fmt_bw(aff.bw, bw, sizeof(bw)), aff.has_gdr ? "yes" : "no", numa);
    }
    return 0;
}

/* ---------------------------------------------------------------- channel search */

static const char *rank_label(const struct plait_topo *topo, const int *devs, int ndevs, bool is_cpu, int rank,
                              char *buf, size_t len)
{
    char dev[16];
    if (rank < 0 || rank >= ndevs) {
        snprintf(buf, len, "?%d", rank);
        return buf;
    }
    node_label(topo, devs[rank], dev, sizeof(dev));
    /* Several CPU ranks share a NUMA node: the rank tells them apart. */
    if (is_cpu)
        snprintf(buf, len, "%s/r%d", dev, rank);
    else
        snprintf(buf, len, "%s", dev);
    return buf;
}

static const char *nic_label(const struct plait_topo *topo, int nic, char *buf, size_t len)
{
    if (nic < 0 || nic >= topo->nnodes) {
        snprintf(buf, len, "-");
        return buf;
    }
    char l[16];
    const struct plait_topo_node *n = &topo->nodes[nic];
    snprintf(buf, len, "%s(%s)", node_label(topo, nic, l, sizeof(l)), n->nic.dev[0] ? n->nic.dev : n->name);
    return buf;
}

static int print_ranks(const struct plait_topo *topo, const struct plait_topo_paths *paths, int nranks, int hosts)
{
    int ngpu = topo->counts[PLAIT_TOPO_GPU], ncpu = topo->counts[PLAIT_TOPO_CPU];
    bool is_cpu = ngpu == 0;
    if (!is_cpu && nranks > ngpu)
        return failure("--ranks %d: this machine has %d %s; ranks go on GPUs 0..N-1", nranks, ngpu,
                       plural(ngpu, "GPU", "GPUs"));
    if (is_cpu && ncpu == 0)
        return failure("--ranks %d: this machine has neither GPUs nor NUMA nodes to place ranks on", nranks);
    int devs[PLAIT_TOPO_MAX_LOCAL];
    for (int r = 0; r < nranks; r++)
        devs[r] = is_cpu ? plait_topo_nth(topo, PLAIT_TOPO_CPU, r % ncpu) : plait_topo_nth(topo, PLAIT_TOPO_GPU, r);
    bool multi_host = hosts > 1;

    printf("Channels for %d %s per host on %s, %d %s%s:\n", nranks, plural(nranks, "rank", "ranks"),
           is_cpu ? "the NUMA nodes (CPU ranks, round-robin)" : "GPUs", hosts, plural(hosts, "host", "hosts"),
           multi_host ? " (multi_host: each channel enters and leaves through NICs)" : "");
    static const struct {
        enum plait_topo_pattern pattern;
        const char *name;
    } patterns[] = {{PLAIT_TOPO_RING, "ring"}, {PLAIT_TOPO_TREE, "tree"}};
    for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++) {
        struct plait_topo_search *s = calloc(1, sizeof(*s));
        if (!s)
            return failure("out of memory");
        if (plait_topo_search_channels(topo, paths, devs, nranks, multi_host, patterns[p].pattern, s) !=
            PLAIT_SUCCESS) {
            int rc = failure("%s search for %d ranks: %s", patterns[p].name, nranks, plait_last_error_get());
            free(s);
            return rc;
        }
        char bw[32], l[48];
        printf("\n%s: %d %s, total %s GB/s\n", patterns[p].name, s->nchannels,
               plural(s->nchannels, "channel", "channels"), fmt_bw(s->bw, bw, sizeof(bw)));
        for (int c = 0; c < s->nchannels && c < PLAIT_TOPO_MAX_CHANNELS; c++) {
            const struct plait_topo_channel *ch = &s->ch[c];
            printf("  channel %2d: ", c);
            if (ch->nic_in >= 0 || multi_host)
                printf("%s -> ", nic_label(topo, ch->nic_in, l, sizeof(l)));
            for (int k = 0; k < ch->n && k < PLAIT_TOPO_MAX_LOCAL; k++)
                printf("%s%s", k ? " " : "", rank_label(topo, devs, nranks, is_cpu, ch->order[k], l, sizeof(l)));
            if (ch->nic_out >= 0 || multi_host)
                printf(" -> %s", nic_label(topo, ch->nic_out, l, sizeof(l)));
            else if (patterns[p].pattern == PLAIT_TOPO_RING && ch->n > 1)
                printf(" -> %s", rank_label(topo, devs, nranks, is_cpu, ch->order[0], l, sizeof(l)));
            printf("   %s GB/s, worst hop %s\n", fmt_bw(ch->bw, bw, sizeof(bw)), plait_topo_path_type_name(ch->worst));
        }
        free(s);
    }
    return 0;
}

/* ---------------------------------------------------------------- Graphviz */

/* Text from a file or a device inside a DOT string: quotes and backslashes escaped. */
static void dot_escaped(const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        if ((unsigned char)*s >= 0x20)
            putchar(*s);
    }
}

static void print_dot(const struct plait_topo *topo)
{
    static const char *const shape[PLAIT_TOPO_NODE_TYPES] = {"box", "ellipse", "box3d", "hexagon", "diamond"};
    printf("graph \"");
    dot_escaped(topo->host[0] ? topo->host : "topology");
    printf("\" {\n  node [fontname=\"monospace\"];\n");
    for (int i = 0; i < topo->nnodes; i++) {
        const struct plait_topo_node *n = &topo->nodes[i];
        char l[16], busid[24];
        plait_topo_busid_format(n->busid, busid, sizeof(busid));
        printf("  \"");
        dot_escaped(n->name);
        printf("\" [shape=%s, label=\"%s\\n", n->type < PLAIT_TOPO_NODE_TYPES ? shape[n->type] : "ellipse",
               node_label(topo, i, l, sizeof(l)));
        dot_escaped(n->name);
        switch (n->type) {
        case PLAIT_TOPO_CPU:
            printf("\\nNUMA %d, %d cores", n->index, n->cpu.ncores);
            break;
        case PLAIT_TOPO_PCI:
            printf("\\n%s%s%s", n->pci.kind == PLAIT_PCI_HOST_BRIDGE ? "host bridge" : "switch", busid[0] ? " " : "",
                   busid);
            break;
        case PLAIT_TOPO_GPU:
            printf("\\n");
            dot_escaped(n->gpu.model[0] ? n->gpu.model : "GPU");
            printf("%s%s", busid[0] ? " " : "", busid);
            break;
        case PLAIT_TOPO_NIC:
            printf("\\n");
            dot_escaped(n->nic.dev);
            printf(" %g Gb/s", n->nic.speed);
            break;
        case PLAIT_TOPO_NVS:
            printf("\\n%d NVSwitches", n->nvs.count);
            break;
        default:
            break;
        }
        printf("\"];\n");
    }
    for (int i = 0; i < topo->nlinks; i++) {
        const struct plait_topo_link *k = &topo->links[i];
        if (k->a < 0 || k->a >= topo->nnodes || k->b < 0 || k->b >= topo->nnodes)
            continue;
        char bw[32];
        printf("  \"");
        dot_escaped(topo->nodes[k->a].name);
        printf("\" -- \"");
        dot_escaped(topo->nodes[k->b].name);
        printf("\" [label=\"%s x%d %s GB/s\"];\n", plait_topo_link_type_name(k->type), k->lanes,
               fmt_bw(k->bw, bw, sizeof(bw)));
    }
    printf("}\n");
}

/* ---------------------------------------------------------------- main */

/* The loader's message already names the file ("FILE:LINE: reason"); say it
 * once, not twice. */
static int load_failed(const char *what, const char *file)
{
    const char *msg = plait_last_error_get();
    if (file && strstr(msg, file))
        return failure("%s: %s", what, msg);
    if (file)
        return failure("%s %s: %s", what, file, msg[0] ? msg : "failed");
    return failure("%s: %s", what, msg[0] ? msg : "failed");
}

int main(int argc, char **argv)
{
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;

    struct plait_topo *topo = NULL;
    struct plait_topo_paths *paths = NULL;
    char origin[PATH_MAX + 32];
    plait_last_error_clear();
    if (a.load) {
        if (plait_topo_load_xml(a.load, &topo) != PLAIT_SUCCESS)
            return load_failed("--load", a.load);
        snprintf(origin, sizeof(origin), "%s", a.load);
    } else {
        if (plait_topo_discover(a.has_discover_opts ? &a.dopts : NULL, &topo) != PLAIT_SUCCESS) {
            const char *file = a.dopts.hwloc_xml ? a.dopts.hwloc_xml : a.dopts.fsroot;
            return load_failed("discovery", file);
        }
        snprintf(origin, sizeof(origin), "this machine");
        if (a.has_discover_opts)
            snprintf(origin, sizeof(origin), "%s%s%s%s%s", a.dopts.hwloc_xml ? "hwloc " : "",
                     a.dopts.hwloc_xml ? a.dopts.hwloc_xml : "", a.dopts.fsroot ? " fsroot " : "",
                     a.dopts.fsroot ? a.dopts.fsroot : "", a.dopts.no_nvml ? " no NVML" : "");
    }

    rc = EXIT_SUCCESS;
    if (a.dump) {
        if (strcmp(a.dump, "-") == 0) {
            char *xml = NULL;
            if (plait_topo_dump_xml_buffer(topo, &xml) != PLAIT_SUCCESS) {
                rc = failure("--dump -: %s", plait_last_error_get());
                goto out_free_topo;
            }
            fputs(xml, stdout);
            free(xml);
        } else if (plait_topo_dump_xml(topo, a.dump) != PLAIT_SUCCESS) {
            rc = load_failed("--dump", a.dump);
            goto out_free_topo;
        }
    }

    if (a.out & ~(unsigned)(OUT_SUMMARY | OUT_DOT)) {
        if (plait_topo_paths_compute(topo, &paths) != PLAIT_SUCCESS) {
            rc = failure("computing paths: %s", plait_last_error_get());
            goto out_free_topo;
        }
    }

    /* Sections are separated by a blank line and always come in this order. */
    bool first = true;
    if (a.out & OUT_SUMMARY) {
        print_summary(topo, origin);
        first = false;
    }
    if (a.out & OUT_MATRIX) {
        if (!first)
            putchar('\n');
        first = false;
        if ((rc = print_matrix(topo, paths, path_cell)) != 0)
            goto out_free_paths;
        if (topo->counts[PLAIT_TOPO_GPU] + topo->counts[PLAIT_TOPO_NIC] > 0)
            print_legend(topo);
    }
    if (a.out & OUT_BW) {
        if (!first)
            putchar('\n');
        first = false;
        printf("Bandwidth of the best path, GB/s (row -> column):\n\n");
        if ((rc = print_matrix(topo, paths, bw_cell)) != 0)
            goto out_free_paths;
    }
    if (a.out & OUT_PATHS) {
        if (!first)
            putchar('\n');
        first = false;
        print_paths(topo, paths);
    }
    if (a.out & OUT_AFFINITY) {
        if (!first)
            putchar('\n');
        first = false;
        if ((rc = print_affinity(topo, paths)) != 0)
            goto out_free_paths;
    }
    if (a.out & OUT_RANKS) {
        if (!first)
            putchar('\n');
        first = false;
        int nranks = a.ranks;
        if (nranks == 0) /* --all without --ranks: every GPU, or one CPU rank per NUMA node */
            nranks = topo->counts[PLAIT_TOPO_GPU] ? topo->counts[PLAIT_TOPO_GPU] : topo->counts[PLAIT_TOPO_CPU];
        if (nranks > PLAIT_TOPO_MAX_LOCAL)
            nranks = PLAIT_TOPO_MAX_LOCAL;
        if (nranks == 0)
            printf("Channels: no GPUs and no NUMA nodes to place ranks on\n");
        else if ((rc = print_ranks(topo, paths, nranks, a.hosts)) != 0)
            goto out_free_paths;
    }
    if (a.out & OUT_DOT) {
        if (!first)
            putchar('\n');
        print_dot(topo);
    }

out_free_paths:
    if (paths)
        plait_topo_paths_free(paths);
out_free_topo:
    plait_topo_free(topo);
    /* A full disk or a closed pipe must not read as success to a script. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "plait-topo: writing the output: %s\n", strerror(errno));
        if (rc == EXIT_SUCCESS)
            rc = EXIT_FAILURE;
    }
    return rc;
}
