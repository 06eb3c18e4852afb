/* Topology discovery from hwloc: NUMA nodes become CPU nodes, joined by SYS
 * links, and the PCI tree (bridges and devices, with I/O discovery on) is
 * recorded for discover.c, which hangs GPUs and NICs from it.
 *
 * Choices:
 * - A CPU node is a NUMA node that has CPUs. Memory-only NUMA nodes (CXL
 *   expanders, HBM, a Grace Hopper GPU's memory) carry no ranks and no PCI
 *   devices hang from them, so they are left out; the OS NUMA index of each CPU
 *   node is kept (d->numa_os) to map sysfs's numa_node values.
 * - The graph describes the machine, not this process's cgroup: disallowed
 *   CPUs are included, so a NUMA node's cpuset is what nvidia-smi shows.
 * - SYS links join every pair of CPU nodes. Two NUMA nodes of one package (SNC,
 *   NPS) talk over the die's mesh or Infinity Fabric, which carries at least
 *   twice what a socket-to-socket link (UPI, xGMI) does, so they get
 *   2 x PLAIT_TOPO_SYS_BW = 80 GB/s; NUMA nodes in different packages get
 *   PLAIT_TOPO_SYS_BW = 40 GB/s, topo.h's conservative inter-socket figure.
 * - hwloc gives a PCIe link as one figure (GB/s after encoding, all lanes);
 *   plait_disc_pcie_decode turns it back into gen and width (see there).
 * - An XML file is read by plait and handed to hwloc rewritten
 *   (plait_disc_hwloc_xml_rewrite), never by path: hwloc parses XML with
 *   libxml2 only where its plugin is installed (Debian: libhwloc-plugins), and
 *   otherwise (or with HWLOC_LIBXML_IMPORT=0) with a minimal parser that reads
 *   only files laid out exactly as hwloc writes them; a comment or a DOCTYPE
 *   on a line of its own makes it fail. The rewritten copy reads the same
 *   with either parser, so what plait finds does not depend on that package.
 */
#include "topology/discover.h"

#include <errno.h>
#include <hwloc.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"

/* How much wider the bandwidth within one package is than across packages (see above). */
#define SAME_PACKAGE_SYS_FACTOR 2.0

void plait_disc_pcie_decode(double gbps, int *gen_out, int *width_out)
{
    /* One figure cannot tell gen1 x16 from gen2 x8 (both 4 GB/s): prefer the
     * widths GPUs, NICs and switches are built with, x16 first, and take the
     * first width some generation matches within 10% (adjacent generations
     * differ by 2x, so one width never matches two). The pair chosen always
     * reproduces the bandwidth, which is what the paths read. */
    static const int widths[] = {16, 8, 4, 2, 1, 32};
    *gen_out = 0;
    *width_out = 0;
    if (!isfinite(gbps) || gbps <= 0)
        return;
    for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++)
        for (int g = 0; g < 6; g++) {
            /* topo.h's per-lane rates, which hwloc's figures follow */
            double expect = plait_topo_pci_bw(g + 1, widths[w]);
            if (fabs(gbps - expect) <= 0.10 * expect) {
                *gen_out = g + 1;
                *width_out = widths[w];
                return;
            }
        }
}

/* The CPU node (per-type index) an I/O object's locality says, from the
 * NUMA nodes of its first non-I/O ancestor; -1 unknown. When the ancestor
 * covers several (hwloc put the device under the whole machine or a package
 * of several NUMA nodes), the first is taken, as NCCL does. */
static int io_cpu(const struct plait_disc *d, hwloc_topology_t t, hwloc_obj_t o)
{
    hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t, o);
    if (a == NULL || a->nodeset == NULL)
        return -1;
    for (int os = hwloc_bitmap_first(a->nodeset); os >= 0; os = hwloc_bitmap_next(a->nodeset, os)) {
        int cpu = plait_disc_cpu_of_numa(d, os);
        if (cpu >= 0)
            return cpu;
    }
    return -1;
}

static void fill_pci(struct plait_disc_pci *p, const struct hwloc_pcidev_attr_s *a)
{
    p->busid = (uint64_t)a->domain << 20 | (uint64_t)a->bus << 12 | (uint64_t)(a->dev & 0x1f) << 4 | (a->func & 7);
    p->vendor = a->vendor_id;
    p->device = a->device_id;
    p->class_id = a->class_id;
    plait_disc_pcie_decode(a->linkspeed, &p->gen, &p->width);
}

struct walk {
    struct plait_disc *d;
    hwloc_topology_t t;
    bool is_full; /* the PCI table filled up: the rest is left out */
    plait_result_t status;
};

/* Records I/O object `o` (a bridge or a PCI device) under table entry
 * `parent`, then its I/O children. OS devices (block, network names) are not
 * needed: sysfs names the network ports. */
static void walk_io(struct walk *w, hwloc_obj_t o, int parent)
{
    struct plait_disc_pci p = {.busid = PLAIT_TOPO_NO_BUSID, .parent = parent, .cpu = -1};
    if (w->status != PLAIT_SUCCESS || w->is_full)
        return;
    if (o->type == HWLOC_OBJ_BRIDGE) {
        if (o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
            p.is_hostbridge = true;
        } else {
            p.is_bridge = true;
            fill_pci(&p, &o->attr->bridge.upstream.pci);
        }
    } else if (o->type == HWLOC_OBJ_PCI_DEVICE) {
        fill_pci(&p, &o->attr->pcidev);
    } else {
        return;
    }
    p.cpu = io_cpu(w->d, w->t, o);
    int me = plait_disc_pci_add(w->d, &p);
    if (me < 0) {
        if (w->d->npci >= PLAIT_DISC_MAX_PCI) {
            PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: hwloc reports more than %d PCI objects; the rest are left out",
                       PLAIT_DISC_MAX_PCI);
            w->is_full = true;
        } else {
            w->status = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: out of memory for the PCI tree");
        }
        return;
    }
    for (hwloc_obj_t c = o->io_first_child; c != NULL; c = c->next_sibling)
        walk_io(w, c, me);
}

/* Every normal object may carry I/O children (hwloc attaches them to the
 * deepest object that covers their locality). */
static void walk_normal(struct walk *w, hwloc_obj_t o)
{
    for (hwloc_obj_t c = o->io_first_child; c != NULL; c = c->next_sibling)
        walk_io(w, c, -1);
    for (hwloc_obj_t c = o->first_child; c != NULL; c = c->next_sibling)
        walk_normal(w, c);
}

static const char *info_of(hwloc_obj_t pkg, hwloc_obj_t root, const char *name)
{
    const char *v = pkg ? hwloc_obj_get_info_by_name(pkg, name) : NULL;
    if (v == NULL)
        v = hwloc_obj_get_info_by_name(root, name);
    return v;
}

static void copy_info(char *dst, size_t len, const char *v)
{
    if (v != NULL)
        plait_disc_copy_text(dst, len, v, strlen(v));
}

static plait_result_t add_cpus(struct plait_disc *d, hwloc_topology_t t)
{
    hwloc_obj_t root = hwloc_get_root_obj(t);
    int nnuma = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    int npkg = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
    int with_cpus = 0;
    for (int i = 0; i < nnuma; i++) {
        hwloc_obj_t numa = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (numa != NULL && numa->cpuset != NULL && !hwloc_bitmap_iszero(numa->cpuset))
            with_cpus++;
    }
    if (with_cpus == 0)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: hwloc reports no NUMA node with CPUs");
    if (with_cpus > PLAIT_DISC_MAX_NUMA)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: hwloc reports %d NUMA nodes with CPUs (at most %d)", with_cpus,
                           PLAIT_DISC_MAX_NUMA);
    for (int i = 0; i < nnuma; i++) {
        hwloc_obj_t numa = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (numa == NULL || numa->cpuset == NULL || hwloc_bitmap_iszero(numa->cpuset))
            continue;
        hwloc_obj_t pkg = NULL;
        for (int k = 0; k < npkg && pkg == NULL; k++) {
            hwloc_obj_t p = hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, (unsigned)k);
            if (p != NULL && p->cpuset != NULL && hwloc_bitmap_intersects(p->cpuset, numa->cpuset))
                pkg = p;
        }
        int n = plait_topo_add_node(d->topo, PLAIT_TOPO_CPU, NULL);
        if (n < 0)
            return PLAIT_ERR_INVALID_ARGUMENT;
        struct plait_topo_node *node = &d->topo->nodes[n];
        struct plait_topo_cpu *cpu = &node->cpu;
        node->numa = node->index;
        d->numa_os[node->index] = numa->os_index < PLAIT_DISC_MAX_NUMA ? (int)numa->os_index : -1;
        if (pkg != NULL)
            cpu->package = pkg->os_index != HWLOC_UNKNOWN_INDEX && pkg->os_index <= 4096 ? (int)pkg->os_index
                                                                                         : (int)pkg->logical_index;
        /* Without Core objects (some recorded files) the PUs are the best count there is. */
        int cores = hwloc_get_nbobjs_inside_cpuset_by_type(t, numa->cpuset, HWLOC_OBJ_CORE);
        if (cores <= 0)
            cores = hwloc_bitmap_weight(numa->cpuset);
        cpu->ncores = cores > 0 && cores <= (1 << 20) ? cores : 0;
        cpu->memory = numa->attr ? numa->attr->numanode.local_memory : 0;
        copy_info(cpu->arch, sizeof(cpu->arch), hwloc_obj_get_info_by_name(root, "Architecture"));
        copy_info(cpu->vendor, sizeof(cpu->vendor), info_of(pkg, root, "CPUVendor"));
        copy_info(cpu->model, sizeof(cpu->model), info_of(pkg, root, "CPUModel"));
        /* A list that does not fit is left unknown rather than cut into a wrong one. */
        char list[PLAIT_TOPO_CPUSET_LEN];
        int len = hwloc_bitmap_list_snprintf(list, sizeof(list), numa->cpuset);
        if (len > 0 && (size_t)len < sizeof(list))
            snprintf(cpu->cpuset, sizeof(cpu->cpuset), "%s", list);
    }
    return PLAIT_SUCCESS;
}

/* SYS links between NUMA nodes: every pair while that stays small; beyond
 * MAX_PAIRED_NUMA nodes (n^2/2 links would crowd out everything else) each
 * node joins the first node of its package and the packages' first nodes are
 * paired, which keeps every path between sockets SYS. */
#define MAX_PAIRED_NUMA 64

static int package_head(const struct plait_topo *t, int n)
{
    if (t->nodes[n].cpu.package < 0)
        return n; /* unknown package: its own */
    for (int i = 0; i < n; i++)
        if (t->nodes[i].type == PLAIT_TOPO_CPU && t->nodes[i].cpu.package == t->nodes[n].cpu.package)
            return i;
    return n;
}

static plait_result_t add_sys_links(struct plait_disc *d)
{
    struct plait_topo *t = d->topo;
    bool all_pairs = t->counts[PLAIT_TOPO_CPU] <= MAX_PAIRED_NUMA;
    for (int a = 0; a < t->nnodes; a++) {
        for (int b = a + 1; b < t->nnodes; b++) {
            const struct plait_topo_node *x = &t->nodes[a], *y = &t->nodes[b];
            if (x->type != PLAIT_TOPO_CPU || y->type != PLAIT_TOPO_CPU)
                continue;
            bool same_pkg = x->cpu.package >= 0 && x->cpu.package == y->cpu.package;
            if (!all_pairs) {
                bool joined = same_pkg ? package_head(t, b) == a
                                       : package_head(t, a) == a && package_head(t, b) == b;
                if (!joined)
                    continue;
            }
            double bw = same_pkg ? SAME_PACKAGE_SYS_FACTOR * PLAIT_TOPO_SYS_BW : PLAIT_TOPO_SYS_BW;
            plait_result_t r = plait_topo_add_link(t, a, b, PLAIT_LINK_SYS, 1, bw, 0);
            if (r != PLAIT_SUCCESS)
                return r;
        }
    }
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- XML files */

/* The largest hwloc XML file read (a machine of 10,000 PUs with its PCI tree
 * writes a few MB). */
#define HWLOC_XML_MAX_BYTES (64u << 20)

/* Whether this hwloc reads XML with libxml2: a document only libxml2 reads
 * (a comment before the root, which the minimal parser refuses) loads. */
static bool hwloc_has_libxml(void)
{
    static const char probe[] =
        "<?xml version=\"1.0\"?>\n<!-- probe -->\n<topology version=\"2.0\">\n"
        "<object type=\"Machine\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" allowed_cpuset=\"0x1\" "
        "nodeset=\"0x1\" complete_nodeset=\"0x1\" allowed_nodeset=\"0x1\" gp_index=\"1\">\n"
        "<object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\" "
        "complete_nodeset=\"0x1\" gp_index=\"2\" local_memory=\"1048576\"/>\n"
        "<object type=\"PU\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\" "
        "complete_nodeset=\"0x1\" gp_index=\"3\"/>\n</object>\n</topology>\n";
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0)
        return false;
    bool ok = hwloc_topology_set_xmlbuffer(t, probe, (int)sizeof(probe)) == 0 && hwloc_topology_load(t) == 0;
    hwloc_topology_destroy(t);
    return ok;
}

/* Reads `path` whole (at most HWLOC_XML_MAX_BYTES) into a NUL-terminated buffer. */
static plait_result_t read_xml_file(const char *path, char **buf_out, size_t *len_out)
{
    plait_result_t st;
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: cannot open hwloc XML file %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        st = plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory reading %s", path);
        goto err_close;
    }
    for (;;) {
        if (cap - len < 2) {
            if (cap >= HWLOC_XML_MAX_BYTES) {
                st = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: hwloc XML file %s is larger than %u bytes",
                                 path, HWLOC_XML_MAX_BYTES);
                goto err_free;
            }
            char *b = realloc(buf, cap * 2);
            if (b == NULL) {
                st = plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory reading %s", path);
                goto err_free;
            }
            buf = b;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        st = plait_error(PLAIT_ERR_SYSTEM, "topology: cannot read hwloc XML file %s: %s", path, strerror(errno));
        goto err_free;
    }
    fclose(f);
    buf[len] = '\0';
    *buf_out = buf;
    *len_out = len;
    return PLAIT_SUCCESS;

err_free:
    free(buf);
err_close:
    fclose(f);
    return st;
}

/* Hands hwloc the rewritten `path`; on failure the last error says why and,
 * where hwloc lacks libxml2, what to install. */
static plait_result_t set_xml(hwloc_topology_t t, const char *path, char **xml_out)
{
    char *raw = NULL, *xml = NULL;
    size_t raw_len = 0, len = 0;
    plait_result_t st = read_xml_file(path, &raw, &raw_len);
    if (st != PLAIT_SUCCESS)
        return st;
    st = plait_disc_hwloc_xml_rewrite(raw, raw_len, path, &xml, &len);
    free(raw);
    if (st != PLAIT_SUCCESS)
        return st;
    if (len >= (size_t)INT32_MAX || hwloc_topology_set_xmlbuffer(t, xml, (int)len + 1) != 0) {
        free(xml);
        return plait_error(PLAIT_ERR_SYSTEM, "topology: hwloc refused the XML of %s: %s", path, strerror(errno));
    }
    *xml_out = xml; /* hwloc copies it at load, not before: keep it until then */
    return PLAIT_SUCCESS;
}

static plait_result_t xml_load_failed(const char *path, int err)
{
    if (hwloc_has_libxml())
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "topology: hwloc (with libxml2) cannot load XML file %s (%s): it is not a topology as "
                           "`lstopo --of xml` writes it (HWLOC_XML_VERBOSE=1 prints hwloc's reason)",
                           path, strerror(err));
    return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                       "topology: hwloc cannot load XML file %s (%s): this hwloc reads XML without libxml2 "
                       "(libhwloc-plugins is not installed, or HWLOC_LIBXML_IMPORT=0 is set) and its minimal parser "
                       "says no more; install libhwloc-plugins (Debian, Ubuntu) for full XML support and hwloc's "
                       "own diagnostics (HWLOC_XML_VERBOSE=1), and check that the file is hwloc's XML, as "
                       "`lstopo --of xml` writes it",
                       path, strerror(err));
}

plait_result_t plait_disc_hwloc(struct plait_disc *d)
{
    hwloc_topology_t t;
    const char *xml = d->opts->hwloc_xml;
    char *xml_text = NULL;
    plait_result_t r;
    if (hwloc_topology_init(&t) != 0)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: hwloc_topology_init failed");
    /* KEEP_ALL: every bridge on the way to a device is needed to see the switches. */
    if (hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL) != 0 ||
        hwloc_topology_set_flags(t, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED) != 0) {
        r = plait_error(PLAIT_ERR_SYSTEM, "topology: hwloc refused the I/O filter or flags");
        goto err_destroy;
    }
#if HWLOC_API_VERSION >= 0x00020100
    /* Device discovery is ours (NVML, sysfs): hwloc's GPU plugins would load
     * OpenCL, CUDA or NVML themselves, which is slow and may create contexts.
     * Its libpciaccess plugin leaks what it allocates for PCI names on every
     * load (libpciaccess 0.17, under valgrind); on Linux hwloc then reads
     * /sys/bus/pci itself, link speeds included. A name this hwloc lacks is
     * refused, which changes nothing. */
    static const char *const unwanted[] = {"pci", "opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"};
    for (size_t i = 0; i < sizeof(unwanted) / sizeof(unwanted[0]); i++)
        (void)hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, unwanted[i]);
#endif
    if (xml != NULL && (r = set_xml(t, xml, &xml_text)) != PLAIT_SUCCESS)
        goto err_destroy;
    if (hwloc_topology_load(t) != 0) {
        int err = errno;
        if (xml != NULL)
            r = xml_load_failed(xml, err);
        else
            r = plait_error(PLAIT_ERR_SYSTEM, "topology: hwloc cannot load this machine's topology: %s",
                            strerror(err));
        goto err_destroy;
    }
    hwloc_obj_t root = hwloc_get_root_obj(t);
    if (xml != NULL)
        copy_info(d->topo->host, sizeof(d->topo->host), hwloc_obj_get_info_by_name(root, "HostName"));

    r = add_cpus(d, t);
    if (r != PLAIT_SUCCESS)
        goto err_destroy;
    r = add_sys_links(d);
    if (r != PLAIT_SUCCESS)
        goto err_destroy;
    struct walk w = {.d = d, .t = t, .status = PLAIT_SUCCESS};
    walk_normal(&w, root);
    r = w.status;
err_destroy:
    hwloc_topology_destroy(t);
    free(xml_text);
    return r;
}
