/* The topology graph: building, lookups, validation, names and data rates. */
#include "topology/topo.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "base/log.h"

static const char *const node_type_names[PLAIT_TOPO_NODE_TYPES] = {"cpu", "pci", "gpu", "nic", "nvs"};
static const char *const link_type_names[PLAIT_LINK_TYPES] = {"NVL", "C2C", "PCI", "SYS", "NET"};
static const char *const path_type_names[PLAIT_PATH_TYPES] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB",
                                                              "P2C", "PXN", "PHB", "SYS", "NET", "DIS"};

const char *plait_topo_node_type_name(enum plait_topo_node_type t)
{
    return (unsigned)t < PLAIT_TOPO_NODE_TYPES ? node_type_names[t] : "?";
}

const char *plait_topo_link_type_name(enum plait_topo_link_type t)
{
    return (unsigned)t < PLAIT_LINK_TYPES ? link_type_names[t] : "?";
}

const char *plait_topo_path_type_name(enum plait_topo_path_type t)
{
    return (unsigned)t < PLAIT_PATH_TYPES ? path_type_names[t] : "?";
}

const char *plait_topo_link_layer_name(enum plait_topo_link_layer l)
{
    switch (l) {
    case PLAIT_LINK_LAYER_IB: return "InfiniBand";
    case PLAIT_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "unknown";
    }
}

static int parse_name(const char *s, const char *const *names, int n)
{
    if (s == NULL)
        return -1;
    for (int i = 0; i < n; i++)
        if (strcasecmp(s, names[i]) == 0)
            return i;
    return -1;
}

int plait_topo_node_type_parse(const char *s) { return parse_name(s, node_type_names, PLAIT_TOPO_NODE_TYPES); }
int plait_topo_link_type_parse(const char *s) { return parse_name(s, link_type_names, PLAIT_LINK_TYPES); }
int plait_topo_path_type_parse(const char *s) { return parse_name(s, path_type_names, PLAIT_PATH_TYPES); }

bool plait_topo_parse_long(const char *s, long lo, long hi, long *out)
{
    if (s == NULL)
        return false;
    const char *d = s + (*s == '-' || *s == '+');
    if (*d < '0' || *d > '9')
        return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

uint64_t plait_topo_busid_parse(const char *s)
{
    unsigned dom = 0, bus, dev, fn;
    int used = 0;
    if (s == NULL || strlen(s) > 16)
        return PLAIT_TOPO_NO_BUSID;
    /* No field may be longer than its hex digits allow: %x would wrap a
     * 9-digit domain into a small, wrong one. */
    for (const char *f = s; *f;) {
        size_t digits = strspn(f, "0123456789abcdefABCDEF");
        if (digits == 0 || digits > 8)
            return PLAIT_TOPO_NO_BUSID;
        f += digits;
        if (*f == ':' || *f == '.')
            f++;
    }
    /* Both the long and the short form must end exactly after the function. */
    if (sscanf(s, "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &used) == 4 && s[used] == '\0') {
        /* long form */
    } else if (dom = 0, used = 0, sscanf(s, "%x:%x.%x%n", &bus, &dev, &fn, &used) == 3 && s[used] == '\0') {
        /* short form */
    } else {
        return PLAIT_TOPO_NO_BUSID;
    }
    for (const char *p = s; *p; p++)
        if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.')
            return PLAIT_TOPO_NO_BUSID;
    if (dom > 0xffffffu || bus > 0xff || dev > 0x1f || fn > 0x7)
        return PLAIT_TOPO_NO_BUSID;
    return (uint64_t)dom << 20 | (uint64_t)bus << 12 | (uint64_t)dev << 4 | fn;
}

void plait_topo_busid_format(uint64_t busid, char *buf, size_t len)
{
    if (len == 0)
        return;
    if (busid == PLAIT_TOPO_NO_BUSID) {
        buf[0] = '\0';
        return;
    }
    snprintf(buf, len, "%04" PRIx64 ":%02" PRIx64 ":%02" PRIx64 ".%" PRIx64, busid >> 20, (busid >> 12) & 0xff,
             (busid >> 4) & 0xff, busid & 0xf);
}

double plait_topo_pci_bw(int gen, int width)
{
    static const double per_lane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563};
    if (gen <= 0 || gen > 6)
        gen = 3;
    if (width <= 0 || width > 32)
        width = 16;
    return per_lane[gen] * width;
}

double plait_topo_nvlink_bw(int version, int sm)
{
    static const double per_link[] = {0, 20, 25, 25, 25, 50};
    if (version <= 0 || version > 5) {
        if (sm >= 100)
            version = 5;
        else if (sm >= 90)
            version = 4;
        else if (sm >= 80)
            version = 3;
        else
            version = 2;
    }
    return per_link[version];
}

plait_result_t plait_topo_create(struct plait_topo **topo_out)
{
    struct plait_topo *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
    *topo_out = t;
    return PLAIT_SUCCESS;
}

void plait_topo_free(struct plait_topo *topo)
{
    if (topo == NULL)
        return;
    free(topo->nodes);
    free(topo->links);
    free(topo);
}

static bool is_printable_name(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.' && *s != ':')
            return false;
    return true;
}

int plait_topo_add_node(struct plait_topo *topo, enum plait_topo_node_type type, const char *name)
{
    char gen[PLAIT_TOPO_NAME_LEN];
    if ((unsigned)type >= PLAIT_TOPO_NODE_TYPES) {
        plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: node type %d is not one of cpu, pci, gpu, nic, nvs",
                    (int)type);
        return -1;
    }
    if (topo->nnodes >= PLAIT_TOPO_MAX_NODES) {
        plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: more than %d nodes", PLAIT_TOPO_MAX_NODES);
        return -1;
    }
    if (name == NULL) {
        snprintf(gen, sizeof(gen), "%s%d", node_type_names[type], topo->counts[type]);
        name = gen;
    }
    if (strlen(name) >= PLAIT_TOPO_NAME_LEN || !is_printable_name(name)) {
        plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                    "topology: node name \"%.40s\" must be 1..%d characters of [A-Za-z0-9_.:-]", name,
                    PLAIT_TOPO_NAME_LEN - 1);
        return -1;
    }
    if (plait_topo_find(topo, name) >= 0) {
        plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: two nodes are named \"%s\"", name);
        return -1;
    }
    if (topo->nnodes == topo->cap_nodes) {
        int cap = topo->cap_nodes ? 2 * topo->cap_nodes : 16;
        struct plait_topo_node *n = realloc(topo->nodes, (size_t)cap * sizeof(*n));
        if (n == NULL) {
            plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
            return -1;
        }
        topo->nodes = n;
        topo->cap_nodes = cap;
    }
    struct plait_topo_node *n = &topo->nodes[topo->nnodes];
    memset(n, 0, sizeof(*n));
    n->type = type;
    snprintf(n->name, sizeof(n->name), "%s", name);
    n->index = topo->counts[type]++;
    n->busid = PLAIT_TOPO_NO_BUSID;
    n->numa = -1;
    n->cpu.package = -1;
    n->gpu.dev = -1;
    n->nic.port = 1;
    return topo->nnodes++;
}

plait_result_t plait_topo_add_link(struct plait_topo *topo, int a, int b, enum plait_topo_link_type type, int lanes,
                                   double bw, double latency)
{
    if (a < 0 || b < 0 || a >= topo->nnodes || b >= topo->nnodes)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: link between node %d and node %d: no such node",
                           a, b);
    if (a == b)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: link from %s to itself", topo->nodes[a].name);
    if ((unsigned)type >= PLAIT_LINK_TYPES)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: link %s-%s: type %d unknown", topo->nodes[a].name,
                           topo->nodes[b].name, (int)type);
    if (!isfinite(bw) || bw <= 0 || bw > 1e6 || !isfinite(latency) || latency < 0 || latency > 1e6 || lanes < 0 ||
        lanes > 1024)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "topology: link %s-%s: bandwidth %g GB/s, latency %g us or lanes %d out of range",
                           topo->nodes[a].name, topo->nodes[b].name, bw, latency, lanes);
    for (int i = 0; i < topo->nlinks; i++) {
        const struct plait_topo_link *l = &topo->links[i];
        if (l->type == type && ((l->a == a && l->b == b) || (l->a == b && l->b == a)))
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: two %s links between %s and %s",
                               link_type_names[type], topo->nodes[a].name, topo->nodes[b].name);
    }
    if (topo->nlinks >= PLAIT_TOPO_MAX_LINKS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: more than %d links", PLAIT_TOPO_MAX_LINKS);
    if (topo->nlinks == topo->cap_links) {
        int cap = topo->cap_links ? 2 * topo->cap_links : 16;
        struct plait_topo_link *l = realloc(topo->links, (size_t)cap * sizeof(*l));
        if (l == NULL)
            return plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
        topo->links = l;
        topo->cap_links = cap;
    }
    topo->links[topo->nlinks++] =
        (struct plait_topo_link){.a = a, .b = b, .type = type, .lanes = lanes, .bw = bw, .latency = latency};
    return PLAIT_SUCCESS;
}

int plait_topo_find(const struct plait_topo *topo, const char *name)
{
    for (int i = 0; i < topo->nnodes; i++)
        if (strcmp(topo->nodes[i].name, name) == 0)
            return i;
    return -1;
}

int plait_topo_find_busid(const struct plait_topo *topo, enum plait_topo_node_type type, uint64_t busid)
{
    if (busid == PLAIT_TOPO_NO_BUSID)
        return -1;
    for (int i = 0; i < topo->nnodes; i++)
        if (topo->nodes[i].type == type && topo->nodes[i].busid == busid)
            return i;
    return -1;
}

int plait_topo_nth(const struct plait_topo *topo, enum plait_topo_node_type type, int index)
{
    for (int i = 0; i < topo->nnodes; i++)
        if (topo->nodes[i].type == type && topo->nodes[i].index == index)
            return i;
    return -1;
}

static bool str_ok(const char *s, size_t len)
{
    size_t n = strnlen(s, len);
    if (n == len)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

static bool finite_in(double v, double lo, double hi) { return isfinite(v) && v >= lo && v <= hi; }

static plait_result_t bad_node(const struct plait_topo_node *n, const char *what)
{
    return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: %s node \"%s\": %s", plait_topo_node_type_name(n->type),
                       n->name, what);
}

static plait_result_t validate_node(const struct plait_topo *topo, const struct plait_topo_node *n)
{
    if (!str_ok(n->name, sizeof(n->name)) || !is_printable_name(n->name))
        return bad_node(n, "name is not 1..31 characters of [A-Za-z0-9_.:-]");
    if (n->numa < -1 || (n->numa >= 0 && plait_topo_nth(topo, PLAIT_TOPO_CPU, n->numa) < 0))
        return bad_node(n, "numa names no cpu node");
    if (n->busid != PLAIT_TOPO_NO_BUSID && (n->busid >> 20) > 0xffffffu)
        return bad_node(n, "busid out of range");
    if (n->pci.gen < 0 || n->pci.gen > 6 || n->pci.width < 0 || n->pci.width > 32)
        return bad_node(n, "PCIe gen (0..6) or width (0..32) out of range");
    switch (n->type) {
    case PLAIT_TOPO_CPU:
        if (n->cpu.package < -1 || n->cpu.package > 4096 || n->cpu.ncores < 0 || n->cpu.ncores > 1 << 20)
            return bad_node(n, "package or cores out of range");
        if (!str_ok(n->cpu.arch, sizeof(n->cpu.arch)) || !str_ok(n->cpu.vendor, sizeof(n->cpu.vendor)) ||
            !str_ok(n->cpu.model, sizeof(n->cpu.model)) || !str_ok(n->cpu.cpuset, sizeof(n->cpu.cpuset)))
            return bad_node(n, "arch, vendor, model or cpuset is not printable text");
        break;
    case PLAIT_TOPO_PCI:
        if ((unsigned)n->pci.kind > PLAIT_PCI_HOST_BRIDGE)
            return bad_node(n, "kind is neither switch nor host bridge");
        break;
    case PLAIT_TOPO_GPU:
        if (n->gpu.dev < -1 || n->gpu.dev > 1 << 16 || n->gpu.sm < 0 || n->gpu.sm > 1000 || n->gpu.nvlinks < 0 ||
            n->gpu.nvlinks > 256 || n->gpu.nvlink_version < 0 || n->gpu.nvlink_version > 5)
            return bad_node(n, "dev, sm, nvlinks or nvlink_version out of range");
        if (!str_ok(n->gpu.model, sizeof(n->gpu.model)) || !str_ok(n->gpu.uuid, sizeof(n->gpu.uuid)))
            return bad_node(n, "model or uuid is not printable text");
        break;
    case PLAIT_TOPO_NIC:
        if (!str_ok(n->nic.dev, sizeof(n->nic.dev)) || !str_ok(n->nic.netdev, sizeof(n->nic.netdev)))
            return bad_node(n, "dev or netdev is not printable text");
        if (n->nic.port < 0 || n->nic.port > 255 || !finite_in(n->nic.speed, 0, 1e5) ||
            (unsigned)n->nic.link_layer > PLAIT_LINK_LAYER_ETHERNET)
            return bad_node(n, "port (0..255), speed (0..100000 Gb/s) or link layer out of range");
        break;
    case PLAIT_TOPO_NVS:
        if (n->nvs.count < 0 || n->nvs.count > 4096)
            return bad_node(n, "count out of range");
        break;
    default:
        return bad_node(n, "unknown type");
    }
    return PLAIT_SUCCESS;
}

static bool link_allowed(enum plait_topo_link_type t, enum plait_topo_node_type x, enum plait_topo_node_type y)
{
    switch (t) {
    case PLAIT_LINK_NVL:
        /* GPU-GPU, GPU-NVSwitch, NVSwitch-NVSwitch, and GPU-CPU on NVLink-attached POWER CPUs. */
        return (x == PLAIT_TOPO_GPU || x == PLAIT_TOPO_NVS || x == PLAIT_TOPO_CPU) &&
               (y == PLAIT_TOPO_GPU || y == PLAIT_TOPO_NVS || y == PLAIT_TOPO_CPU) &&
               !(x == PLAIT_TOPO_CPU && y == PLAIT_TOPO_CPU);
    case PLAIT_LINK_C2C:
        return (x == PLAIT_TOPO_GPU && y == PLAIT_TOPO_CPU) || (x == PLAIT_TOPO_CPU && y == PLAIT_TOPO_GPU);
    case PLAIT_LINK_PCI:
        return x != PLAIT_TOPO_NVS && y != PLAIT_TOPO_NVS && !(x == PLAIT_TOPO_CPU && y == PLAIT_TOPO_CPU);
    case PLAIT_LINK_SYS: return x == PLAIT_TOPO_CPU && y == PLAIT_TOPO_CPU;
    case PLAIT_LINK_NET: return x == PLAIT_TOPO_NIC && y == PLAIT_TOPO_NIC;
    default: return false;
    }
}

plait_result_t plait_topo_validate(const struct plait_topo *topo)
{
    int seen[PLAIT_TOPO_NODE_TYPES] = {0};
    if (topo->nnodes < 0 || topo->nnodes > PLAIT_TOPO_MAX_NODES || topo->nlinks < 0 ||
        topo->nlinks > PLAIT_TOPO_MAX_LINKS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: %d nodes and %d links (at most %d and %d)",
                           topo->nnodes, topo->nlinks, PLAIT_TOPO_MAX_NODES, PLAIT_TOPO_MAX_LINKS);
    if (!str_ok(topo->host, sizeof(topo->host)) || !str_ok(topo->source, sizeof(topo->source)))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: host or source is not printable text");
    for (int i = 0; i < topo->nnodes; i++) {
        const struct plait_topo_node *n = &topo->nodes[i];
        if ((unsigned)n->type >= PLAIT_TOPO_NODE_TYPES)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: node %d has unknown type %d", i, (int)n->type);
        if (n->index != seen[n->type])
            return bad_node(n, "per-type indices are not dense in order");
        seen[n->type]++;
        for (int j = 0; j < i; j++)
            if (strcmp(topo->nodes[j].name, n->name) == 0)
                return bad_node(n, "name used twice");
        plait_result_t r = validate_node(topo, n);
        if (r != PLAIT_SUCCESS)
            return r;
    }
    for (int i = 0; i < topo->nlinks; i++) {
        const struct plait_topo_link *l = &topo->links[i];
        if (l->a < 0 || l->b < 0 || l->a >= topo->nnodes || l->b >= topo->nnodes || l->a == l->b)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: link %d joins node %d and node %d", i, l->a,
                               l->b);
        const struct plait_topo_node *x = &topo->nodes[l->a], *y = &topo->nodes[l->b];
        if ((unsigned)l->type >= PLAIT_LINK_TYPES || !link_allowed(l->type, x->type, y->type))
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: a %s link cannot join %s node %s and %s node %s",
                               plait_topo_link_type_name(l->type), node_type_names[x->type], x->name,
                               node_type_names[y->type], y->name);
        if (!finite_in(l->bw, 1e-6, 1e6) || !finite_in(l->latency, 0, 1e6) || l->lanes < 0 || l->lanes > 1024)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                               "topology: link %s-%s: bandwidth %g GB/s, latency %g us or lanes %d out of range",
                               x->name, y->name, l->bw, l->latency, l->lanes);
    }
    for (int t = 0; t < PLAIT_TOPO_NODE_TYPES; t++)
        if (seen[t] != topo->counts[t])
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: %s node count %d does not match its nodes (%d)",
                               node_type_names[t], topo->counts[t], seen[t]);
    return PLAIT_SUCCESS;
}

double plait_topo_link_default_bw(const struct plait_topo *topo, enum plait_topo_link_type type, int a, int b,
                                  int lanes)
{
    const struct plait_topo_node *x = &topo->nodes[a], *y = &topo->nodes[b];
    switch (type) {
    case PLAIT_LINK_NVL: {
        const struct plait_topo_node *g = x->type == PLAIT_TOPO_GPU ? x : y->type == PLAIT_TOPO_GPU ? y : NULL;
        double per = g ? plait_topo_nvlink_bw(g->gpu.nvlink_version, g->gpu.sm) : plait_topo_nvlink_bw(0, 0);
        return per * (lanes > 0 ? lanes : 1);
    }
    case PLAIT_LINK_C2C: return PLAIT_TOPO_C2C_BW;
    case PLAIT_LINK_SYS: return PLAIT_TOPO_SYS_BW;
    case PLAIT_LINK_NET: {
        double s = x->nic.speed > 0 && y->nic.speed > 0 ? fmin(x->nic.speed, y->nic.speed) : 100.0;
        return s / 8.0;
    }
    case PLAIT_LINK_PCI:
    default: {
        /* The downstream end (the one that is not a CPU, and of two PCI nodes the
         * child, b by convention) says how the link was trained. */
        const struct plait_topo_node *d = y->type != PLAIT_TOPO_CPU ? y : x;
        int gen = d->pci.gen;
        int width = lanes > 0 ? lanes : d->pci.width;
        if (gen == 0 && x->type == PLAIT_TOPO_PCI)
            gen = x->pci.gen;
        return plait_topo_pci_bw(gen, width);
    }
    }
}
