/* Topology discovery: the driver (plait_topo_discover), the PCI tree shared by
 * the three sources, the fallback CPU node when hwloc has nothing, and the
 * file helpers sysfs.c and the fallback read /sys and /proc with.
 *
 * PCIe switches. A switch shows up as an upstream port (a PCI-to-PCI bridge)
 * with one downstream port (another bridge) per slot below it; docs/topology.md
 * wants the whole switch as one pci node, so that two devices under one switch
 * are one PCI hop from each other (PIX). Walking up from a device, the bridges
 * alternate downstream port, upstream port, downstream port... and a chain of
 * odd length ends with a root port of the host bridge. So the bridges above a
 * device are paired from the bottom: each pair is one switch (named by its
 * upstream port), and a bridge left over at the top is a root port, which
 * belongs to the CPU like the host bridge itself. The pairing is the same from
 * every device in a subtree, because every endpoint hangs from a downstream or
 * a root port. Host bridges are not kept as nodes: a switch or a device right
 * below one is linked to its CPU node, which classifies the same (PHB).
 */
#define _GNU_SOURCE
#include "topology/discover.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>
#include "base/log.h"

/* ---------------------------------------------------------------- files */

static bool make_path(const struct plait_disc *d, const char *rel, char *path, size_t len)
{
    while (*rel == '/')
        rel++;
    int n = snprintf(path, len, "%s/%s", d->root, rel);
    return n > 0 && (size_t)n < len;
}

bool plait_disc_exists(const struct plait_disc *d, const char *rel)
{
    char path[PATH_MAX];
    struct stat st;
    return make_path(d, rel, path, sizeof(path)) && stat(path, &st) == 0;
}

/* Reads a whole small regular file; -1 when it is not one, cannot be read, is
 * empty, holds a NUL or is len bytes or longer (a sysfs attribute never is). */
static int read_small(const struct plait_disc *d, const char *rel, char *buf, size_t len)
{
    char path[PATH_MAX];
    struct stat st;
    if (len < 2 || !make_path(d, rel, path, sizeof(path)))
        return -1;
    /* O_NONBLOCK: a FIFO planted in a recorded tree must not hang discovery. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            close(fd);
            return -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
        if (got == len) { /* no room left for the terminator: too long to be what we expect */
            close(fd);
            return -1;
        }
    }
    close(fd);
    if (got == 0 || memchr(buf, '\0', got) != NULL)
        return -1;
    buf[got] = '\0';
    return (int)got;
}

int plait_disc_read(const struct plait_disc *d, const char *rel, char *buf, size_t len)
{
    int n = read_small(d, rel, buf, len);
    if (n < 0)
        return -1;
    char *nl = strchr(buf, '\n');
    if (nl != NULL)
        *nl = '\0';
    n = (int)strlen(buf);
    if (n == 0)
        return -1;
    for (int i = 0; i < n; i++)
        if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
            return -1;
    return n;
}

int plait_disc_read_all(const struct plait_disc *d, const char *rel, char *buf, size_t len)
{
    return read_small(d, rel, buf, len);
}

void plait_disc_copy_text(char *dst, size_t dstlen, const char *src, size_t srclen)
{
    size_t o = 0;
    if (dstlen == 0)
        return;
    for (size_t i = 0; i < srclen && src[i] != '\0' && o + 1 < dstlen; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    dst[o] = '\0';
}

/* ---------------------------------------------------------------- the PCI tree */

int plait_disc_pci_add(struct plait_disc *d, const struct plait_disc_pci *p)
{
    /* Parents come before children, which keeps every walk up the tree finite. */
    if (p->parent < -1 || p->parent >= d->npci || d->npci >= PLAIT_DISC_MAX_PCI)
        return -1;
    if (d->npci == d->cap_pci) {
        int cap = d->cap_pci ? 2 * d->cap_pci : 64;
        struct plait_disc_pci *n = realloc(d->pci, (size_t)cap * sizeof(*n));
        if (n == NULL)
            return -1;
        d->pci = n;
        d->cap_pci = cap;
    }
    d->pci[d->npci] = *p;
    d->pci[d->npci].node = -1;
    return d->npci++;
}

int plait_disc_pci_find(const struct plait_disc *d, uint64_t busid)
{
    if (busid == PLAIT_TOPO_NO_BUSID)
        return -1;
    for (int i = 0; i < d->npci; i++)
        if (!d->pci[i].is_hostbridge && d->pci[i].busid == busid)
            return i;
    return -1;
}

int plait_disc_cpu_of_numa(const struct plait_disc *d, long os_numa)
{
    int ncpu = d->topo->counts[PLAIT_TOPO_CPU];
    if (os_numa < 0 || os_numa >= PLAIT_DISC_MAX_NUMA)
        return -1;
    for (int i = 0; i < ncpu && i < PLAIT_DISC_MAX_NUMA; i++)
        if (d->numa_os[i] == os_numa)
            return i;
    /* One CPU node (no NUMA, or the fallback) stands for the whole machine. */
    return ncpu == 1 ? 0 : -1;
}

static plait_result_t add_pci_link(struct plait_disc *d, int up, int down)
{
    struct plait_topo *t = d->topo;
    int lanes = t->nodes[down].pci.width;
    double bw = plait_topo_link_default_bw(t, PLAIT_LINK_PCI, up, down, lanes);
    return plait_topo_add_link(t, up, down, PLAIT_LINK_PCI, lanes, bw, 0);
}

/* The graph node device `i` hangs from: the switch nearest above it (made,
 * with the switches above it, when first needed) or `cpu_node`. See the top
 * of this file for why bridges are paired. */
static int switch_above(struct plait_disc *d, int i, int cpu_node, int cpu, plait_result_t *status_out)
{
    int chain[64], k = 0;
    for (int p = d->pci[i].parent; p >= 0 && d->pci[p].is_bridge; p = d->pci[p].parent) {
        if (k == (int)(sizeof(chain) / sizeof(chain[0])))
            break; /* deeper than any real machine: the switches further up are left out */
        chain[k++] = p;
    }
    int parent = cpu_node;
    /* Upstream ports are chain[1], chain[3], ...: make them top-down. */
    for (int h = (k % 2 == 0 ? k - 1 : k - 2); h >= 1; h -= 2) {
        struct plait_disc_pci *up = &d->pci[chain[h]];
        if (up->node < 0) {
            int n = plait_topo_add_node(d->topo, PLAIT_TOPO_PCI, NULL);
            if (n < 0) {
                *status_out = PLAIT_ERR_INVALID_ARGUMENT;
                return -1;
            }
            struct plait_topo_node *sw = &d->topo->nodes[n];
            sw->pci.kind = PLAIT_PCI_SWITCH;
            sw->busid = up->busid;
            sw->pci.gen = up->gen;
            sw->pci.width = up->width;
            plait_disc_sysfs_pcie(d, up->busid, &sw->pci.gen, &sw->pci.width);
            sw->pci.vendor = up->vendor;
            sw->pci.device = up->device;
            sw->numa = cpu;
            plait_result_t r = add_pci_link(d, parent, n);
            if (r != PLAIT_SUCCESS) {
                *status_out = r;
                return -1;
            }
            up->node = n;
        }
        parent = up->node;
    }
    return parent;
}

plait_result_t plait_disc_attach(struct plait_disc *d, int node, uint64_t busid, int cpu)
{
    struct plait_topo *t = d->topo;
    int i = plait_disc_pci_find(d, busid);
    if (i >= 0 && d->pci[i].cpu >= 0)
        cpu = d->pci[i].cpu;
    if (cpu < 0 && t->counts[PLAIT_TOPO_CPU] == 1)
        cpu = 0;
    int cpu_node = plait_topo_nth(t, PLAIT_TOPO_CPU, cpu >= 0 ? cpu : 0);
    if (cpu_node < 0)
        return plait_error(PLAIT_ERR_INTERNAL, "topology: discovery has no CPU node to attach %s to",
                           t->nodes[node].name);
    int parent = cpu_node;
    if (i >= 0) {
        plait_result_t status = PLAIT_SUCCESS;
        parent = switch_above(d, i, cpu_node, cpu, &status);
        if (parent < 0)
            return status;
        struct plait_topo_node *n = &t->nodes[node];
        n->pci.gen = d->pci[i].gen;
        n->pci.width = d->pci[i].width;
        if (n->pci.vendor == 0) {
            n->pci.vendor = d->pci[i].vendor;
            n->pci.device = d->pci[i].device;
        }
    }
    plait_disc_sysfs_pcie(d, busid, &t->nodes[node].pci.gen, &t->nodes[node].pci.width);
    t->nodes[node].numa = cpu;
    return add_pci_link(d, parent, node);
}

/* ---------------------------------------------------------------- without hwloc */

/* The first number of a CPU list ("3-5,9" -> 3), -1 if none. */
static long list_first(const char *s)
{
    char *end;
    if (!isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno == 0 && v >= 0 && v < (1L << 20) ? v : -1;
}

static bool is_cpu_list(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s) && *s != ',' && *s != '-')
            return false;
    return true;
}

/* Physical cores among the online CPUs of `list`: a CPU is a core's first
 * thread when its own number opens its sibling list. 0 when unreadable. */
static int count_cores(const struct plait_disc *d, const char *list)
{
    int cores = 0;
    const char *s = list;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s || a < 0)
            return 0;
        if (*end == '-') {
            s = end + 1;
            b = strtol(s, &end, 10);
            if (end == s || b < a || b - a > (1L << 20))
                return 0;
        }
        for (long c = a; c <= b; c++) {
            char rel[96], sib[256];
            snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%ld/topology/core_cpus_list", c);
            if (plait_disc_read(d, rel, sib, sizeof(sib)) < 0) {
                snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%ld/topology/thread_siblings_list", c);
                if (plait_disc_read(d, rel, sib, sizeof(sib)) < 0)
                    sib[0] = '\0';
            }
            long first = list_first(sib);
            if (first < 0 || first == c)
                cores++;
        }
        s = end;
        if (*s == ',')
            s++;
        else if (*s != '\0')
            return 0;
    }
    return cores;
}

/* Vendor and model from /proc/cpuinfo's first processor (x86 names them). */
static void read_cpuinfo(const struct plait_disc *d, struct plait_topo_cpu *cpu)
{
    char path[PATH_MAX], line[512];
    if (!make_path(d, "proc/cpuinfo", path, sizeof(path)))
        return;
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return;
    for (int lines = 0; lines < 256 && fgets(line, sizeof(line), f) != NULL; lines++) {
        if (line[0] == '\n')
            break;
        char *colon = strchr(line, ':');
        if (colon == NULL)
            continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        v[strcspn(v, "\n")] = '\0';
        if (strncmp(line, "vendor_id", 9) == 0)
            plait_disc_copy_text(cpu->vendor, sizeof(cpu->vendor), v, strlen(v));
        else if (strncmp(line, "model name", 10) == 0)
            plait_disc_copy_text(cpu->model, sizeof(cpu->model), v, strlen(v));
    }
    fclose(f);
}

static plait_result_t add_fallback_cpu(struct plait_disc *d)
{
    int n = plait_topo_add_node(d->topo, PLAIT_TOPO_CPU, NULL);
    if (n < 0)
        return PLAIT_ERR_INVALID_ARGUMENT;
    struct plait_topo_cpu *cpu = &d->topo->nodes[n].cpu;
    char online[PLAIT_TOPO_STR_LEN];
    if (plait_disc_read(d, "sys/devices/system/cpu/online", online, sizeof(online)) > 0 && is_cpu_list(online)) {
        snprintf(cpu->cpuset, sizeof(cpu->cpuset), "%s", online);
        cpu->ncores = count_cores(d, online);
    }
    if (cpu->ncores <= 0) {
        long on = sysconf(_SC_NPROCESSORS_ONLN);
        cpu->ncores = on > 0 && on < (1L << 20) ? (int)on : 0;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
        cpu->memory = (uint64_t)pages * (uint64_t)page;
    struct utsname u;
    if (uname(&u) == 0)
        plait_disc_copy_text(cpu->arch, sizeof(cpu->arch), u.machine, sizeof(u.machine));
    read_cpuinfo(d, cpu);
    d->topo->nodes[n].numa = 0;
    d->numa_os[0] = -1;
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- the driver */

static int cmp_busid(const void *a, const void *b, void *arg)
{
    const struct plait_disc *d = arg;
    uint64_t x = d->pci[*(const int *)a].busid, y = d->pci[*(const int *)b].busid;
    return x < y ? -1 : x > y;
}

/* GPUs as PCI shows them (NVIDIA display or 3D controllers), in bus order so
 * that GPU i is the i-th by PCI address, as NVML numbers them. */
static plait_result_t add_pci_gpus(struct plait_disc *d)
{
    int *idx = malloc((size_t)(d->npci > 0 ? d->npci : 1) * sizeof(*idx));
    int k = 0;
    if (idx == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
    for (int i = 0; i < d->npci; i++) {
        const struct plait_disc_pci *p = &d->pci[i];
        if (!p->is_bridge && !p->is_hostbridge && p->vendor == 0x10de &&
            (p->class_id == 0x0300 || p->class_id == 0x0302))
            idx[k++] = i;
    }
    qsort_r(idx, (size_t)k, sizeof(*idx), cmp_busid, d);
    plait_result_t r = PLAIT_SUCCESS;
    for (int j = 0; j < k && r == PLAIT_SUCCESS; j++) {
        int n = plait_topo_add_node(d->topo, PLAIT_TOPO_GPU, NULL);
        if (n < 0) {
            r = PLAIT_ERR_INVALID_ARGUMENT;
            break;
        }
        struct plait_topo_node *g = &d->topo->nodes[n];
        g->busid = d->pci[idx[j]].busid;
        g->pci.vendor = d->pci[idx[j]].vendor;
        g->pci.device = d->pci[idx[j]].device;
        r = plait_disc_attach(d, n, g->busid, -1);
    }
    free(idx);
    return r;
}

static plait_result_t set_root(struct plait_disc *d, const char *fsroot)
{
    d->root[0] = '\0';
    if (fsroot == NULL)
        return PLAIT_SUCCESS;
    size_t n = strlen(fsroot);
    while (n > 0 && fsroot[n - 1] == '/')
        n--;
    /* Leave room below the prefix for the longest relative path we build. */
    if (n + 256 >= sizeof(d->root))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_discover: fsroot is longer than %zu characters",
                           sizeof(d->root) - 256);
    memcpy(d->root, fsroot, n);
    d->root[n] = '\0';
    return PLAIT_SUCCESS;
}

plait_result_t plait_topo_discover(const struct plait_topo_discover_opts *opts, struct plait_topo **topo_out)
{
    static const struct plait_topo_discover_opts defaults = {0};
    struct plait_disc *d;
    plait_result_t r;
    if (topo_out == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_discover: topo_out is NULL");
    /* The context is large (PATH_MAX and the NUMA table): keep it off the stack. */
    d = calloc(1, sizeof(*d));
    if (d == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
    d->opts = opts ? opts : &defaults;
    for (int i = 0; i < PLAIT_DISC_MAX_NUMA; i++)
        d->numa_os[i] = -1;
    r = set_root(d, d->opts->fsroot);
    if (r != PLAIT_SUCCESS)
        goto err_free_ctx;
    r = plait_topo_create(&d->topo);
    if (r != PLAIT_SUCCESS)
        goto err_free_ctx;
    snprintf(d->topo->source, sizeof(d->topo->source), "discovered");
    if (d->opts->hwloc_xml == NULL) {
        char host[256] = "";
        if (gethostname(host, sizeof(host) - 1) == 0)
            plait_disc_copy_text(d->topo->host, sizeof(d->topo->host), host, sizeof(host));
    }

    r = plait_disc_hwloc(d);
    /* Only the live machine falls back: a file the caller named that cannot
     * be loaded is an error, not a one-CPU graph that looks like an answer. */
    if (r == PLAIT_ERR_SYSTEM && d->topo->nnodes == 0 && d->opts->hwloc_xml == NULL) {
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: %s; one CPU node from sysconf and /proc instead",
                   plait_last_error_get());
        plait_last_error_clear();
        d->npci = 0;
        r = add_fallback_cpu(d);
        if (r != PLAIT_SUCCESS)
            goto err_free_topo;
    } else if (r != PLAIT_SUCCESS) {
        goto err_free_topo;
    }
    r = add_pci_gpus(d);
    if (r != PLAIT_SUCCESS)
        goto err_free_topo;
    r = plait_disc_nvml(d);
    if (r != PLAIT_SUCCESS)
        goto err_free_topo;
    r = plait_disc_sysfs(d);
    if (r != PLAIT_SUCCESS)
        goto err_free_topo;
    r = plait_topo_validate(d->topo);
    if (r != PLAIT_SUCCESS) {
        plait_error_context(r, "plait_topo_discover: the discovered graph is invalid");
        goto err_free_topo;
    }
    const int *c = d->topo->counts;
    PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: discovered %d cpu, %d pci, %d gpu, %d nic, %d nvs nodes, %d links",
               c[PLAIT_TOPO_CPU], c[PLAIT_TOPO_PCI], c[PLAIT_TOPO_GPU], c[PLAIT_TOPO_NIC], c[PLAIT_TOPO_NVS],
               d->topo->nlinks);
    *topo_out = d->topo;
    free(d->pci);
    free(d);
    return PLAIT_SUCCESS;

err_free_topo:
    plait_topo_free(d->topo);
err_free_ctx:
    free(d->pci);
    free(d);
    return r;
}
