/* NCCL's topology XML (what NCCL_TOPO_DUMP_FILE writes and NCCL_TOPO_FILE
 * reads) turned into plait's graph.
 *
 * The file is a tree: <system> holds one <cpu> per NUMA node; under it nested
 * <pci> elements (PCIe switches), leaves that hold a <gpu> (with its <nvlink>
 * and <c2c> lines) or a <nic> (with one <net> per port). NCCL writes many
 * attributes and elements plait has no use for (rank, maxconn, subsystem ids,
 * <gin>, <pcilink> ...): those are ignored. The ones read are checked as
 * strictly as plait's own format, with the line in the message.
 *
 * Nodes are made type by type (CPUs by NUMA id, GPUs and NICs by NCCL's dev
 * index, PCI switches in file order) so that GPU i is CUDA device i where the
 * file says so, then the links: the PCIe tree, NVLinks (every NVSwitch target
 * merged into one nvs node, as NCCL does), C2C, and SYS between the CPUs of
 * one host. Bandwidths are plait's defaults (plait_topo_link_default_bw),
 * except C2C, whose figure the file gives. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "base/log.h"
#include "topology/xml_internal.h"

/* NCCL's PCI class codes: base class 0x02 network, 0x03 display; 0x068000
 * is what NCCL calls an NVSwitch, 0x068001 a CPU reached over NVLink (POWER). */
#define CLASS_BASE(c) ((c) >> 16)
#define CLASS_NVSWITCH 0x068000u
#define CLASS_NVLINK_CPU 0x068001u
#define CLASS_IB 0x0207u

struct plan {
    enum plait_topo_node_type type;
    const struct plait_xml_elem *el;  /* <cpu>, <pci> (switch), <gpu> or <net> */
    const struct plait_xml_elem *pci; /* a GPU's or NIC's own <pci>; NULL for a NIC right under <cpu> */
    int parent;                       /* plan of the upstream CPU or switch; -1 for a CPU */
    int cpu;                          /* plan of its CPU */
    long key;                         /* order within its type: NUMA id, CUDA dev, NCCL net dev */
    uint64_t host;                    /* a CPU's host_hash: CPUs of different hosts are not joined */
    int node;                         /* index in the graph once made */
};

struct loader {
    const struct plait_xml_doc *doc;
    struct plait_topo *t;
    struct plan *plans;
    int nplans, cap;
};

static plait_result_t oom(void) { return plait_error(PLAIT_ERR_SYSTEM, "topology XML: out of memory"); }

static plait_result_t bad(const struct loader *L, const struct plait_xml_elem *e, const char *attr, const char *why)
{
    const struct plait_xml_attr *a = plait_xml_find_attr(e, attr);
    char q[64];
    plait_xml_quote(a ? a->value : "", q, sizeof(q));
    return plait_xml_fail(L->doc, a ? a->line : e->line, "<%s> attribute %s=\"%s\" %s", e->name, attr, q, why);
}

static int add_plan(struct loader *L, enum plait_topo_node_type type, const struct plait_xml_elem *el,
                    const struct plait_xml_elem *pci, int parent, int cpu, long key)
{
    /* cap is the document's element count, and each element plans at most one node. */
    if (L->nplans >= L->cap)
        return -1;
    L->plans[L->nplans] = (struct plan){.type = type, .el = el, .pci = pci, .parent = parent, .cpu = cpu,
                                        .key = key, .node = -1};
    return L->nplans++;
}

/* ------------------------------------------------------------------ the tree */

static plait_result_t walk_nic(struct loader *L, const struct plait_xml_elem *nic, const struct plait_xml_elem *pci,
                               int parent, int cpu)
{
    plait_result_t st;
    for (const struct plait_xml_elem *net = nic->first_child; net != NULL; net = net->next) {
        long is_net, dev;
        if (strcmp(net->name, "net") != 0)
            continue;
        /* NCCL marks the physical ports it fused into a virtual NIC net="0",
         * and skips ports without a dev index: so do we. */
        if ((st = plait_xml_get_int(L->doc, net, "net", 0, 1, 1, &is_net)) != PLAIT_SUCCESS)
            return st;
        if ((st = plait_xml_get_int(L->doc, net, "dev", -1, 1 << 20, -1, &dev)) != PLAIT_SUCCESS)
            return st;
        if (!is_net || plait_xml_attr(net, "dev") == NULL)
            continue;
        if (add_plan(L, PLAIT_TOPO_NIC, net, pci, parent, cpu, dev) < 0)
            return plait_xml_fail(L->doc, net->line, "too many nodes");
    }
    return PLAIT_SUCCESS;
}

static plait_result_t walk_pci(struct loader *L, const struct plait_xml_elem *e, int parent, int cpu)
{
    plait_result_t st;
    uint64_t cls;
    if ((st = plait_xml_get_hex(L->doc, e, "class", 0xffffff, UINT64_MAX, &cls)) != PLAIT_SUCCESS)
        return st;
    /* What the element holds says what it is, as in NCCL: a <gpu> makes it a
     * GPU, a <nic> a NIC whatever its class. */
    const struct plait_xml_elem *gpu = plait_xml_child(e, "gpu");
    if (gpu != NULL) {
        long dev;
        if ((st = plait_xml_get_int(L->doc, gpu, "dev", -1, 1 << 16, -1, &dev)) != PLAIT_SUCCESS)
            return st;
        if (add_plan(L, PLAIT_TOPO_GPU, gpu, e, parent, cpu, dev) < 0)
            return plait_xml_fail(L->doc, gpu->line, "too many nodes");
        return PLAIT_SUCCESS;
    }
    bool has_nic = false;
    for (const struct plait_xml_elem *c = e->first_child; c != NULL; c = c->next)
        if (strcmp(c->name, "nic") == 0) {
            has_nic = true;
            if ((st = walk_nic(L, c, e, parent, cpu)) != PLAIT_SUCCESS)
                return st;
        }
    if (has_nic)
        return PLAIT_SUCCESS;
    /* A GPU, NIC or NVSwitch NCCL described no further is not a switch: no node. */
    if (cls != UINT64_MAX && (CLASS_BASE(cls) == 0x02 || CLASS_BASE(cls) == 0x03 || (cls >> 8) == 0x0680))
        return PLAIT_SUCCESS;
    int p = add_plan(L, PLAIT_TOPO_PCI, e, NULL, parent, cpu, 0);
    if (p < 0)
        return plait_xml_fail(L->doc, e->line, "too many nodes");
    for (const struct plait_xml_elem *c = e->first_child; c != NULL; c = c->next)
        if (strcmp(c->name, "pci") == 0 && (st = walk_pci(L, c, p, cpu)) != PLAIT_SUCCESS)
            return st;
    return PLAIT_SUCCESS;
}

static plait_result_t walk_cpu(struct loader *L, const struct plait_xml_elem *e)
{
    plait_result_t st;
    long numa;
    uint64_t host;
    if ((st = plait_xml_get_int(L->doc, e, "numaid", -1, PLAIT_TOPO_MAX_NODES, -1, &numa)) != PLAIT_SUCCESS)
        return st;
    if ((st = plait_xml_get_hex(L->doc, e, "host_hash", UINT64_MAX, 0, &host)) != PLAIT_SUCCESS)
        return st;
    /* An unknown NUMA id sorts after the known ones. */
    int c = add_plan(L, PLAIT_TOPO_CPU, e, NULL, -1, -1, numa < 0 ? PLAIT_TOPO_MAX_NODES + 1 : numa);
    if (c < 0)
        return plait_xml_fail(L->doc, e->line, "too many nodes");
    L->plans[c].cpu = c;
    L->plans[c].host = host;
    for (const struct plait_xml_elem *k = e->first_child; k != NULL; k = k->next) {
        if (strcmp(k->name, "pci") == 0)
            st = walk_pci(L, k, c, c);
        else if (strcmp(k->name, "nic") == 0)
            st = walk_nic(L, k, NULL, c, c);
        if (st != PLAIT_SUCCESS)
            return st;
    }
    return PLAIT_SUCCESS;
}

/* ------------------------------------------------------------------ attributes */

/* sysfs's link speed as NCCL copies it: "16.0 GT/s PCIe" (or "16 GT/s" from
 * kernels before 5.7, "Unknown" when the kernel does not know). */
static bool pcie_gen(const char *s, int *gen)
{
    static const struct {
        double gts;
        int gen;
    } rates[] = {{2.5, 1}, {5, 2}, {8, 3}, {16, 4}, {32, 5}, {64, 6}};
    if (*s == '\0' || strncmp(s, "Unknown", 7) == 0) {
        *gen = 0;
        return true;
    }
    const char *sp = strchr(s, ' ');
    if (sp == NULL || sp - s > 8 || (strcmp(sp, " GT/s") != 0 && strcmp(sp, " GT/s PCIe") != 0))
        return false;
    char num[16];
    memcpy(num, s, (size_t)(sp - s));
    num[sp - s] = '\0';
    double v;
    if (!plait_xml_parse_double(num, 0, 1000, &v))
        return false;
    for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
        if (v == rates[i].gts) {
            *gen = rates[i].gen;
            return true;
        }
    return false;
}

/* A device's own PCIe link and address, from its <pci> element. */
static plait_result_t read_pci(const struct loader *L, const struct plait_xml_elem *pci, struct plait_topo_node *n)
{
    plait_result_t st;
    long width;
    uint64_t vendor, device;
    const char *busid = plait_xml_attr(pci, "busid");
    if (busid != NULL) {
        n->busid = plait_topo_busid_parse(busid);
        if (n->busid == PLAIT_TOPO_NO_BUSID)
            return bad(L, pci, "busid", "is not a PCI address (dddd:bb:dd.f)");
    }
    const char *speed = plait_xml_attr(pci, "link_speed");
    if (speed != NULL && !pcie_gen(speed, &n->pci.gen))
        return bad(L, pci, "link_speed", "is not a PCIe link speed (\"16.0 GT/s PCIe\")");
    if ((st = plait_xml_get_int(L->doc, pci, "link_width", 0, 32, 0, &width)) != PLAIT_SUCCESS)
        return st;
    n->pci.width = (int)width;
    if ((st = plait_xml_get_hex(L->doc, pci, "vendor", 0xffff, 0, &vendor)) != PLAIT_SUCCESS ||
        (st = plait_xml_get_hex(L->doc, pci, "device", 0xffff, 0, &device)) != PLAIT_SUCCESS)
        return st;
    n->pci.vendor = (uint16_t)vendor;
    n->pci.device = (uint16_t)device;
    return PLAIT_SUCCESS;
}

/* Linux's cpumask ("0000ffff,00000000": 32-bit hex words, the most
 * significant first) in hwloc's list form ("32-47"). A list too long for the
 * field is left out: the rest of the node is still right. */
static plait_result_t read_affinity(const struct loader *L, const struct plait_xml_elem *e, char *out, size_t len)
{
    plait_result_t st;
    const char *s = plait_xml_attr(e, "affinity");
    long offset;
    uint32_t words[PLAIT_XML_MAX_VALUE / 2 + 1];
    int nwords = 0;
    if (s == NULL)
        return PLAIT_SUCCESS;
    if ((st = plait_xml_get_int(L->doc, e, "affinity_offset", 0, 1 << 20, 0, &offset)) != PLAIT_SUCCESS)
        return st;
    for (const char *w = s;;) {
        const char *comma = strchr(w, ',');
        size_t n = comma ? (size_t)(comma - w) : strlen(w);
        char word[12];
        uint64_t v;
        if (n == 0 || n > 8)
            return bad(L, e, "affinity", "is not a CPU mask (32-bit hex words separated by commas)");
        memcpy(word, w, n);
        word[n] = '\0';
        if (word[0] == '0' && (word[1] == 'x' || word[1] == 'X'))
            return bad(L, e, "affinity", "is not a CPU mask (32-bit hex words separated by commas)");
        if (!plait_xml_parse_hex(word, UINT32_MAX, &v))
            return bad(L, e, "affinity", "is not a CPU mask (32-bit hex words separated by commas)");
        words[nwords++] = (uint32_t)v;
        if (comma == NULL)
            break;
        w = comma + 1;
    }
    size_t o = 0;
    long nbits = 32L * nwords;
    out[0] = '\0';
    for (long i = 0; i < nbits;) {
        if (!(words[nwords - 1 - i / 32] >> (i % 32) & 1)) {
            i++;
            continue;
        }
        long j = i;
        while (j + 1 < nbits && (words[nwords - 1 - (j + 1) / 32] >> ((j + 1) % 32) & 1))
            j++;
        int n = j > i ? snprintf(out + o, len - o, "%s%ld-%ld", o ? "," : "", i + offset, j + offset)
                      : snprintf(out + o, len - o, "%s%ld", o ? "," : "", i + offset);
        if (n < 0 || (size_t)n >= len - o) {
            PLAIT_INFO(PLAIT_SUBSYS_GRAPH, "%s:%d: CPU affinity %.40s... is too long to keep", L->doc->name, e->line,
                       s);
            out[0] = '\0';
            return PLAIT_SUCCESS;
        }
        o += (size_t)n;
        i = j + 1;
    }
    return PLAIT_SUCCESS;
}

static plait_result_t make_node(struct loader *L, struct plan *p)
{
    plait_result_t st;
    struct plait_topo *t = L->t;
    int idx = plait_topo_add_node(t, p->type, NULL);
    if (idx < 0)
        return plait_xml_fail_last(L->doc, p->el->line);
    p->node = idx;
    struct plait_topo_node *n = &t->nodes[idx];
    const struct plait_xml_elem *e = p->el;
    n->numa = p->type == PLAIT_TOPO_CPU ? n->index : t->nodes[L->plans[p->cpu].node].index;
    switch (p->type) {
    case PLAIT_TOPO_CPU: {
        const char *arch = plait_xml_attr(e, "arch");
        /* NCCL says arm64 where the kernel (and plait) say aarch64. */
        if (arch != NULL && strcmp(arch, "arm64") == 0)
            snprintf(n->cpu.arch, sizeof(n->cpu.arch), "aarch64");
        else if ((st = plait_xml_get_str(L->doc, e, "arch", n->cpu.arch, sizeof(n->cpu.arch))) != PLAIT_SUCCESS)
            return st;
        if ((st = plait_xml_get_str(L->doc, e, "vendor", n->cpu.vendor, sizeof(n->cpu.vendor))) != PLAIT_SUCCESS)
            return st;
        return read_affinity(L, e, n->cpu.cpuset, sizeof(n->cpu.cpuset));
    }
    case PLAIT_TOPO_PCI: n->pci.kind = PLAIT_PCI_SWITCH; return read_pci(L, e, n);
    case PLAIT_TOPO_GPU: {
        long sm;
        n->gpu.dev = (int)p->key;
        if ((st = plait_xml_get_int(L->doc, e, "sm", 0, 1000, 0, &sm)) != PLAIT_SUCCESS)
            return st;
        n->gpu.sm = (int)sm;
        return read_pci(L, p->pci, n);
    }
    case PLAIT_TOPO_NIC: {
        long port, mbps, gdr;
        uint64_t guid;
        if ((st = plait_xml_get_str(L->doc, e, "name", n->nic.dev, sizeof(n->nic.dev))) != PLAIT_SUCCESS ||
            (st = plait_xml_get_int(L->doc, e, "port", 0, 255, 1, &port)) != PLAIT_SUCCESS ||
            (st = plait_xml_get_int(L->doc, e, "speed", -1, 100000000, 0, &mbps)) != PLAIT_SUCCESS ||
            (st = plait_xml_get_hex(L->doc, e, "guid", UINT64_MAX, 0, &guid)) != PLAIT_SUCCESS ||
            (st = plait_xml_get_int(L->doc, e, "gdr", 0, 1, 0, &gdr)) != PLAIT_SUCCESS)
            return st;
        n->nic.port = (int)port;
        /* NCCL writes Mb/s, and -1 or 0 where the driver reports no speed. */
        n->nic.speed = mbps > 0 ? (double)mbps / 1000.0 : 0.0;
        n->nic.guid = guid;
        n->nic.has_gdr = gdr != 0;
        if (p->pci == NULL)
            return PLAIT_SUCCESS;
        uint64_t cls;
        if ((st = plait_xml_get_hex(L->doc, p->pci, "class", 0xffffff, UINT64_MAX, &cls)) != PLAIT_SUCCESS)
            return st;
        /* ConnectX in InfiniBand mode is an "InfiniBand controller"; in Ethernet (RoCE) mode an Ethernet one. */
        if (cls != UINT64_MAX && CLASS_BASE(cls) == 0x02)
            n->nic.link_layer = (cls >> 8) == CLASS_IB ? PLAIT_LINK_LAYER_IB : PLAIT_LINK_LAYER_ETHERNET;
        return read_pci(L, p->pci, n);
    }
    default: return plait_xml_fail(L->doc, e->line, "internal: unexpected node type");
    }
}

struct order {
    long key;
    int plan;
};

static int order_cmp(const void *x, const void *y)
{
    const struct order *a = x, *b = y;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return (a->plan > b->plan) - (a->plan < b->plan);
}

static plait_result_t make_nodes(struct loader *L)
{
    static const enum plait_topo_node_type types[] = {PLAIT_TOPO_CPU, PLAIT_TOPO_PCI, PLAIT_TOPO_GPU,
                                                      PLAIT_TOPO_NIC};
    plait_result_t st = PLAIT_SUCCESS;
    struct order *ord = malloc((size_t)(L->nplans ? L->nplans : 1) * sizeof(*ord));
    if (ord == NULL)
        return oom();
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]) && st == PLAIT_SUCCESS; k++) {
        int n = 0;
        for (int i = 0; i < L->nplans; i++)
            if (L->plans[i].type == types[k]) {
                /* Unknown dev indices (-1) go last; switches keep file order. */
                long key = types[k] == PLAIT_TOPO_PCI ? 0 : L->plans[i].key < 0 ? LONG_MAX : L->plans[i].key;
                ord[n++] = (struct order){.key = key, .plan = i};
            }
        qsort(ord, (size_t)n, sizeof(*ord), order_cmp);
        for (int i = 0; i < n && st == PLAIT_SUCCESS; i++)
            st = make_node(L, &L->plans[ord[i].plan]);
    }
    free(ord);
    return st;
}

/* ------------------------------------------------------------------ links */

struct peer {
    int a, b;                /* GPU node indices, a < b */
    long lanes_ab, lanes_ba; /* as each end counts them */
    int line;                /* of the first <nvlink> naming the pair */
};

struct nvl_state {
    long *nvs_lanes, *cpu_lanes; /* per GPU index */
    const char **switches;       /* distinct NVSwitch targets */
    int nswitches;
    struct peer *peers;
    int npeers, cap_peers;
};

static plait_result_t read_nvlink(struct loader *L, struct nvl_state *s, const struct plan *g,
                                  const struct plait_xml_elem *e)
{
    plait_result_t st;
    struct plait_topo *t = L->t;
    struct plait_topo_node *gpu = &t->nodes[g->node];
    long count;
    uint64_t tclass;
    if (plait_xml_attr(e, "count") == NULL)
        return plait_xml_fail(L->doc, e->line, "<nvlink> has no count attribute");
    if ((st = plait_xml_get_int(L->doc, e, "count", 0, 256, 0, &count)) != PLAIT_SUCCESS ||
        (st = plait_xml_get_hex(L->doc, e, "tclass", 0xffffff, UINT64_MAX, &tclass)) != PLAIT_SUCCESS)
        return st;
    if (count == 0)
        return PLAIT_SUCCESS;
    if (gpu->gpu.nvlinks + count > 256)
        return plait_xml_fail(L->doc, e->line, "<gpu> at line %d has more than 256 NVLinks", g->el->line);
    gpu->gpu.nvlinks += (int)count;
    const char *target = plait_xml_attr(e, "target");
    uint64_t busid = target ? plait_topo_busid_parse(target) : PLAIT_TOPO_NO_BUSID;
    int peer = plait_topo_find_busid(t, PLAIT_TOPO_GPU, busid);
    /* Without tclass (older dumps), a target that is one of our GPUs is that
     * GPU and anything else is taken for an NVSwitch, as NCCL does for the
     * targets it cannot see. */
    bool is_gpu = tclass == UINT64_MAX ? peer >= 0 : CLASS_BASE(tclass) == 0x03;
    if (is_gpu) {
        if (busid == PLAIT_TOPO_NO_BUSID)
            return bad(L, e, "target", "is not a PCI address (dddd:bb:dd.f)");
        if (peer < 0) {
            PLAIT_INFO(PLAIT_SUBSYS_GRAPH, "%s:%d: NVLink to GPU %s, which the file does not describe, left out",
                       L->doc->name, e->line, target);
            return PLAIT_SUCCESS;
        }
        if (peer == g->node)
            return bad(L, e, "target", "is the GPU itself");
        int a = peer < g->node ? peer : g->node, b = peer < g->node ? g->node : peer;
        int k;
        for (k = 0; k < s->npeers; k++)
            if (s->peers[k].a == a && s->peers[k].b == b)
                break;
        if (k == s->npeers) {
            if (s->npeers == s->cap_peers) {
                int cap = s->cap_peers ? 2 * s->cap_peers : 64;
                struct peer *np = realloc(s->peers, (size_t)cap * sizeof(*np));
                if (np == NULL)
                    return oom();
                s->peers = np;
                s->cap_peers = cap;
            }
            s->peers[k] = (struct peer){.a = a, .b = b, .line = e->line};
            s->npeers++;
        }
        if (g->node == a)
            s->peers[k].lanes_ab += count;
        else
            s->peers[k].lanes_ba += count;
    } else if (tclass == CLASS_NVLINK_CPU) {
        s->cpu_lanes[gpu->index] += count;
    } else {
        s->nvs_lanes[gpu->index] += count;
        const char *name = target ? target : "";
        int k;
        for (k = 0; k < s->nswitches; k++)
            if (strcmp(s->switches[k], name) == 0)
                break;
        if (k == s->nswitches && s->nswitches < 4096)
            s->switches[s->nswitches++] = name;
    }
    return PLAIT_SUCCESS;
}

static plait_result_t add_link(struct loader *L, int line, int a, int b, enum plait_topo_link_type type, int lanes,
                               double bw)
{
    if (bw <= 0)
        bw = plait_topo_link_default_bw(L->t, type, a, b, lanes);
    if (plait_topo_add_link(L->t, a, b, type, lanes, bw, 0) != PLAIT_SUCCESS)
        return plait_xml_fail_last(L->doc, line);
    return PLAIT_SUCCESS;
}

static plait_result_t make_nvlinks(struct loader *L)
{
    plait_result_t st = PLAIT_SUCCESS;
    struct plait_topo *t = L->t;
    int ngpus = t->counts[PLAIT_TOPO_GPU];
    struct nvl_state s = {0};
    s.nvs_lanes = calloc((size_t)ngpus + 1, sizeof(long));
    s.cpu_lanes = calloc((size_t)ngpus + 1, sizeof(long));
    s.switches = calloc(4096, sizeof(*s.switches));
    if (s.nvs_lanes == NULL || s.cpu_lanes == NULL || s.switches == NULL) {
        st = oom();
        goto out;
    }
    for (int i = 0; i < L->nplans && st == PLAIT_SUCCESS; i++) {
        const struct plan *g = &L->plans[i];
        if (g->type != PLAIT_TOPO_GPU)
            continue;
        for (const struct plait_xml_elem *e = g->el->first_child; e != NULL && st == PLAIT_SUCCESS; e = e->next)
            if (strcmp(e->name, "nvlink") == 0)
                st = read_nvlink(L, &s, g, e);
    }
    if (st != PLAIT_SUCCESS)
        goto out;
    int nvs = -1;
    for (int i = 0; i < L->nplans && st == PLAIT_SUCCESS; i++) {
        const struct plan *g = &L->plans[i];
        if (g->type != PLAIT_TOPO_GPU)
            continue;
        int gi = t->nodes[g->node].index;
        if (s.nvs_lanes[gi] > 0) {
            if (nvs < 0) {
                /* One node for all of them: which NVSwitch chip a lane lands on
                 * does not change any path, and NCCL merges them the same way. */
                nvs = plait_topo_add_node(t, PLAIT_TOPO_NVS, NULL);
                if (nvs < 0) {
                    st = plait_xml_fail_last(L->doc, g->el->line);
                    break;
                }
                t->nodes[nvs].nvs.count = s.nswitches;
            }
            st = add_link(L, g->el->line, g->node, nvs, PLAIT_LINK_NVL, (int)s.nvs_lanes[gi], 0);
        }
        if (st == PLAIT_SUCCESS && s.cpu_lanes[gi] > 0)
            st = add_link(L, g->el->line, g->node, L->plans[g->cpu].node, PLAIT_LINK_NVL, (int)s.cpu_lanes[gi], 0);
    }
    for (int k = 0; k < s.npeers && st == PLAIT_SUCCESS; k++) {
        /* Both ends list the link; should they disagree, the larger count is the wire. */
        const struct peer *p = &s.peers[k];
        long lanes = p->lanes_ab > p->lanes_ba ? p->lanes_ab : p->lanes_ba;
        st = add_link(L, p->line, p->a, p->b, PLAIT_LINK_NVL, (int)lanes, 0);
    }
out:
    free(s.nvs_lanes);
    free(s.cpu_lanes);
    free(s.switches);
    free(s.peers);
    return st;
}

static plait_result_t make_c2c(struct loader *L, const struct plan *g)
{
    plait_result_t st;
    long lanes = 0;
    double bw = 0;
    int line = 0;
    for (const struct plait_xml_elem *e = g->el->first_child; e != NULL; e = e->next) {
        long count, mbps;
        if (strcmp(e->name, "c2c") != 0)
            continue;
        if (plait_xml_attr(e, "count") == NULL)
            return plait_xml_fail(L->doc, e->line, "<c2c> has no count attribute");
        /* bw is each link's rate in MB/s (NVML's figure). */
        if ((st = plait_xml_get_int(L->doc, e, "count", 0, 64, 0, &count)) != PLAIT_SUCCESS ||
            (st = plait_xml_get_int(L->doc, e, "bw", 0, 10000000, 0, &mbps)) != PLAIT_SUCCESS)
            return st;
        if (lanes + count > 1024)
            return plait_xml_fail(L->doc, e->line, "<gpu> at line %d has more than 1024 C2C links", g->el->line);
        lanes += count;
        bw += (double)mbps * (double)count / 1000.0;
        line = e->line;
    }
    if (lanes == 0)
        return PLAIT_SUCCESS;
    return add_link(L, line, g->node, L->plans[g->cpu].node, PLAIT_LINK_C2C, (int)lanes,
                    bw > 0 ? bw : PLAIT_TOPO_C2C_BW);
}

static plait_result_t make_links(struct loader *L)
{
    plait_result_t st = PLAIT_SUCCESS;
    struct plait_topo *t = L->t;
    /* The plan of each CPU node, by its index: nodes were made sorted. */
    int *cpu_plan = malloc(((size_t)t->counts[PLAIT_TOPO_CPU] + 1) * sizeof(*cpu_plan));
    if (cpu_plan == NULL)
        return oom();
    for (int i = 0; i < L->nplans; i++)
        if (L->plans[i].type == PLAIT_TOPO_CPU)
            cpu_plan[t->nodes[L->plans[i].node].index] = i;
    for (int i = 0; i < L->nplans && st == PLAIT_SUCCESS; i++) {
        const struct plan *p = &L->plans[i];
        if (p->parent < 0)
            continue;
        int up = L->plans[p->parent].node;
        /* A NIC NCCL hangs right under <cpu> has no PCIe link it knows of; NCCL
         * gives that hop local bandwidth and so do we. */
        double bw = p->type == PLAIT_TOPO_NIC && p->pci == NULL ? PLAIT_TOPO_LOC_BW : 0;
        st = add_link(L, p->el->line, up, p->node, PLAIT_LINK_PCI, t->nodes[p->node].pci.width, bw);
    }
    if (st == PLAIT_SUCCESS)
        st = make_nvlinks(L);
    for (int i = 0; i < L->nplans && st == PLAIT_SUCCESS; i++)
        if (L->plans[i].type == PLAIT_TOPO_GPU)
            st = make_c2c(L, &L->plans[i]);
    /* NUMA nodes of one host are joined pairwise, as NCCL joins its CPUs. */
    for (int i = 0; i < t->counts[PLAIT_TOPO_CPU] && st == PLAIT_SUCCESS; i++)
        for (int j = i + 1; j < t->counts[PLAIT_TOPO_CPU] && st == PLAIT_SUCCESS; j++) {
            const struct plan *x = &L->plans[cpu_plan[i]], *y = &L->plans[cpu_plan[j]];
            if (x->host == y->host)
                st = add_link(L, y->el->line, x->node, y->node, PLAIT_LINK_SYS, 1, 0);
        }
    free(cpu_plan);
    return st;
}

plait_result_t plait_topo_load_nccl(const struct plait_xml_doc *doc, struct plait_topo *topo)
{
    plait_result_t st = PLAIT_SUCCESS;
    struct loader L = {.doc = doc, .t = topo, .cap = doc->nelems};
    L.plans = calloc((size_t)L.cap + 1, sizeof(*L.plans));
    if (L.plans == NULL)
        return oom();
    for (const struct plait_xml_elem *e = doc->root->first_child; e != NULL && st == PLAIT_SUCCESS; e = e->next)
        if (strcmp(e->name, "cpu") == 0)
            st = walk_cpu(&L, e);
    if (st == PLAIT_SUCCESS && plait_xml_child(doc->root, "cpu") == NULL)
        st = plait_xml_fail(doc, doc->root->line, "<system> holds no <cpu>");
    if (st == PLAIT_SUCCESS)
        st = make_nodes(&L);
    if (st == PLAIT_SUCCESS)
        st = make_links(&L);
    free(L.plans);
    return st;
}
