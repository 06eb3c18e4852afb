/* Topology discovery from sysfs: network ports, GPUDirect RDMA, PCIe link
 * figures. Everything is read under the discovery root (opts->fsroot), so a
 * /sys tree recorded on another machine reads like the real one; recorded
 * trees need no symlinks because a device's PCI address is taken from its
 * uevent file (PCI_SLOT_NAME), never from where its link points.
 *
 * Which ports become NIC nodes:
 * - every port of every RDMA device in /sys/class/infiniband (InfiniBand, and
 *   RoCE whose link layer is Ethernet), unless its state says it is not
 *   ACTIVE: NCCL cannot use a port that is down;
 * - every Ethernet interface in /sys/class/net that no RDMA device already
 *   covers (same PCI function, or named as the RDMA port's netdev), that is
 *   not down, and that has a device behind it. Interfaces without one are
 *   pure software (lo, veth pairs, bridges, tun/tap, ifb, dummy, bonds,
 *   VLANs, macvlans) and carry no traffic of their own: they are skipped, and
 *   so are lo, veth*, docker* and any interface with a bridge/ or tun_flags
 *   entry even if a container's sysfs shows them a device.
 * A port is marked virtual when its driver is paravirtual (virtio_net, Hyper-V
 * netvsc, Xen netfront, the software RDMA drivers rxe and siw) or when it has
 * a device that is not on PCI (its uevent names no PCI_SLOT_NAME). GPUDirect
 * RDMA is possible on the non-virtual RDMA ports when the peer-memory module
 * is loaded (nvidia_peermem, or the older nv_peer_mem's memory_peers entry);
 * plain Ethernet ports never have it (sockets cannot read GPU memory).
 * Every value is checked; one that fails is logged at TRACE and left unknown.
 */
#define _GNU_SOURCE
#include "topology/discover.h"

#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"

#define MAX_ENTRIES 512 /* network ports or RDMA devices on one host: far more than any has */
#define MAX_PORTS 64

struct name {
    char s[PLAIT_TOPO_NAME_LEN];
};

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= PLAIT_TOPO_NAME_LEN || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.' && s[i] != ':')
            return false;
    return true;
}

/* "mlx5_2" before "mlx5_10": runs of digits compare as numbers. */
static int natural_cmp(const void *pa, const void *pb)
{
    const char *a = ((const struct name *)pa)->s, *b = ((const struct name *)pb)->s;
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            char *ea, *eb;
            unsigned long x = strtoul(a, &ea, 10), y = strtoul(b, &eb, 10);
            if (x != y)
                return x < y ? -1 : 1;
            a = ea;
            b = eb;
            continue;
        }
        if (*a != *b)
            return (unsigned char)*a - (unsigned char)*b;
        a++;
        b++;
    }
    return (unsigned char)*a - (unsigned char)*b;
}

/* The entries of directory <root>/<rel> whose names are valid node names,
 * naturally sorted, at most `max`; -1 when the directory cannot be opened. */
static int list_dir(const struct plait_disc *d, const char *rel, struct name *out, int max)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s/%s", d->root, rel);
    if (n < 0 || (size_t)n >= sizeof(path))
        return -1;
    DIR *dir = opendir(path);
    if (dir == NULL)
        return -1;
    int k = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (!name_ok(e->d_name)) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, ".."))
                PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s: ignoring entry with a bad name", path);
            continue;
        }
        if (k == max) {
            PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s: more than %d entries, the rest ignored", path, max);
            break;
        }
        memcpy(out[k++].s, e->d_name, strlen(e->d_name) + 1); /* name_ok bounded its length */
    }
    closedir(dir);
    qsort(out, (size_t)k, sizeof(*out), natural_cmp);
    return k;
}

/* The value of KEY=value in uevent text, when present and it fits. */
static bool uevent_get(const char *text, const char *key, char *out, size_t len)
{
    size_t klen = strlen(key);
    for (const char *line = text; line != NULL && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, key, klen) != 0 || line[klen] != '=')
            continue;
        const char *v = line + klen + 1;
        size_t vlen = strcspn(v, "\n");
        if (vlen == 0 || vlen >= len)
            return false;
        memcpy(out, v, vlen);
        out[vlen] = '\0';
        return true;
    }
    return false;
}

/* What a device's uevent says: its PCI address and whether its driver is paravirtual. */
struct dev_info {
    bool has_device;   /* the port has a device directory */
    uint64_t busid;    /* PLAIT_TOPO_NO_BUSID when not on PCI or unknown */
    bool is_virtual;
    int cpu;           /* CPU node from numa_node, -1 unknown */
};

static void read_device(const struct plait_disc *d, const char *dir, struct dev_info *info)
{
    static const char *const paravirtual[] = {"virtio_net", "hv_netvsc", "xen-netfront", "vif", "rdma_rxe", "siw"};
    char rel[PATH_MAX], text[4096], val[64];
    *info = (struct dev_info){.busid = PLAIT_TOPO_NO_BUSID, .cpu = -1};
    snprintf(rel, sizeof(rel), "%s/device", dir);
    info->has_device = plait_disc_exists(d, rel);
    snprintf(rel, sizeof(rel), "%s/device/uevent", dir);
    if (plait_disc_read_all(d, rel, text, sizeof(text)) > 0) {
        if (uevent_get(text, "PCI_SLOT_NAME", val, sizeof(val))) {
            info->busid = plait_topo_busid_parse(val);
            if (info->busid == PLAIT_TOPO_NO_BUSID)
                PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s: PCI_SLOT_NAME is not a PCI address", rel);
        } else {
            info->is_virtual = true; /* a device, but not on PCI */
        }
        if (uevent_get(text, "DRIVER", val, sizeof(val)))
            for (size_t i = 0; i < sizeof(paravirtual) / sizeof(paravirtual[0]); i++)
                if (strcmp(val, paravirtual[i]) == 0)
                    info->is_virtual = true;
    } else if (info->has_device) {
        PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s is missing or unreadable: PCI address unknown", rel);
    }
    if (!info->has_device)
        info->is_virtual = true;
    snprintf(rel, sizeof(rel), "%s/device/numa_node", dir);
    long numa;
    if (plait_disc_read(d, rel, val, sizeof(val)) > 0) {
        if (!plait_topo_parse_long(val, -1, PLAIT_DISC_MAX_NUMA - 1, &numa))
            PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s: \"%s\" is not a NUMA node, ignored", rel, val);
        else
            info->cpu = plait_disc_cpu_of_numa(d, numa);
    }
}

/* "400 Gb/sec (4X NDR)" -> 400; 0 when malformed or out of range. */
static double parse_rate(const char *s)
{
    char *end;
    if (!isdigit((unsigned char)*s))
        return 0;
    double v = strtod(s, &end);
    if (end == s || strncmp(end, " Gb/sec", 7) != 0 || !isfinite(v) || v <= 0 || v > 1e5)
        return 0;
    return v;
}

/* A GID ("fe80:0000:0000:0000:0c42:a103:00a4:e2b8": the port GUID is its
 * second half) or a node GUID ("0c42:a103:00a4:e2b8"); 0 when malformed. */
static uint64_t parse_guid(const char *s)
{
    unsigned g[8];
    int used = 0;
    size_t len = strlen(s);
    if (!(len == 39 && sscanf(s, "%4x:%4x:%4x:%4x:%4x:%4x:%4x:%4x%n", &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
                              &g[6], &g[7], &used) == 8 && used == 39) &&
        !(len == 19 && sscanf(s, "%4x:%4x:%4x:%4x%n", &g[4], &g[5], &g[6], &g[7], &used) == 4 && used == 19))
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!isxdigit((unsigned char)s[i]) && s[i] != ':')
            return 0;
    return (uint64_t)g[4] << 48 | (uint64_t)g[5] << 32 | (uint64_t)g[6] << 16 | g[7];
}

bool plait_disc_sysfs_pcie(const struct plait_disc *d, uint64_t busid, int *gen_out, int *width_out)
{
    char bus[20], rel[128], val[64];
    long width;
    if (busid == PLAIT_TOPO_NO_BUSID)
        return false;
    plait_topo_busid_format(busid, bus, sizeof(bus));
    snprintf(rel, sizeof(rel), "sys/bus/pci/devices/%s/max_link_speed", bus);
    if (plait_disc_read(d, rel, val, sizeof(val)) <= 0)
        return false;
    /* "16.0 GT/s PCIe" (older kernels: "16 GT/s"): the transfer rate names the generation. */
    static const double rates[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
    char *end;
    double gts = strtod(val, &end);
    int gen = 0;
    if (end != val && strncmp(end, " GT/s", 5) == 0)
        for (int g = 0; g < 6; g++)
            if (fabs(gts - rates[g]) < 0.01)
                gen = g + 1;
    snprintf(rel, sizeof(rel), "sys/bus/pci/devices/%s/max_link_width", bus);
    if (gen == 0 || plait_disc_read(d, rel, val, sizeof(val)) <= 0 || !plait_topo_parse_long(val, 1, 32, &width)) {
        PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s: PCIe link figures unreadable, ignored", bus);
        return false;
    }
    *gen_out = gen;
    *width_out = (int)width;
    return true;
}

/* What the RDMA scan leaves for the Ethernet scan to skip. */
struct claimed {
    struct name netdev[MAX_ENTRIES];
    uint64_t busid[MAX_ENTRIES];
    int nnetdev, nbusid;
};

static plait_result_t add_nic(struct plait_disc *d, const struct plait_topo_nic *nic, const struct dev_info *info,
                              int *node_out)
{
    int n = plait_topo_add_node(d->topo, PLAIT_TOPO_NIC, NULL);
    if (n < 0)
        return PLAIT_ERR_INVALID_ARGUMENT;
    d->topo->nodes[n].nic = *nic;
    d->topo->nodes[n].busid = info->busid;
    *node_out = n;
    return plait_disc_attach(d, n, info->busid, info->cpu);
}

/* The netdev of RDMA port `port` of device directory `dir`: the interface of
 * the same PCI function whose dev_port is port - 1, or the only one there is. */
static void rdma_netdev(const struct plait_disc *d, const char *dir, int port, char *out, size_t len)
{
    struct name nets[16];
    char rel[PATH_MAX], val[32];
    out[0] = '\0';
    snprintf(rel, sizeof(rel), "%s/device/net", dir);
    int k = list_dir(d, rel, nets, 16);
    for (int i = 0; i < k; i++) {
        long dev_port;
        snprintf(rel, sizeof(rel), "%s/device/net/%s/dev_port", dir, nets[i].s);
        if (plait_disc_read(d, rel, val, sizeof(val)) > 0 && plait_topo_parse_long(val, 0, 255, &dev_port) &&
            dev_port == port - 1) {
            snprintf(out, len, "%s", nets[i].s);
            return;
        }
    }
    if (k == 1)
        snprintf(out, len, "%s", nets[0].s);
}

static plait_result_t scan_rdma(struct plait_disc *d, bool has_peermem, struct claimed *cl, int *nrdma)
{
    struct name *devs = calloc(MAX_ENTRIES, sizeof(*devs));
    struct name ports[MAX_PORTS];
    char dir[96], rel[PATH_MAX], val[128];
    plait_result_t r = PLAIT_SUCCESS;
    if (devs == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
    int ndev = list_dir(d, "sys/class/infiniband", devs, MAX_ENTRIES);
    for (int i = 0; i < ndev && r == PLAIT_SUCCESS; i++) {
        struct dev_info info;
        snprintf(dir, sizeof(dir), "sys/class/infiniband/%s", devs[i].s);
        read_device(d, dir, &info);
        if (info.busid != PLAIT_TOPO_NO_BUSID && cl->nbusid < MAX_ENTRIES)
            cl->busid[cl->nbusid++] = info.busid;
        uint64_t node_guid = 0;
        snprintf(rel, sizeof(rel), "%s/node_guid", dir);
        if (plait_disc_read(d, rel, val, sizeof(val)) > 0)
            node_guid = parse_guid(val);
        snprintf(rel, sizeof(rel), "%s/ports", dir);
        int nports = list_dir(d, rel, ports, MAX_PORTS);
        for (int p = 0; p < nports && r == PLAIT_SUCCESS; p++) {
            long port, state;
            if (!plait_topo_parse_long(ports[p].s, 1, 255, &port))
                continue;
            /* "4: ACTIVE"; an unreadable state is not a reason to drop the port. */
            snprintf(rel, sizeof(rel), "%s/ports/%ld/state", dir, port);
            if (plait_disc_read(d, rel, val, sizeof(val)) > 0) {
                char *colon = strchr(val, ':');
                if (colon != NULL)
                    *colon = '\0';
                if (colon != NULL && plait_topo_parse_long(val, 0, 255, &state) && state != 4) {
                    PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s port %ld is not active (state %ld), skipped",
                                devs[i].s, port, state);
                    continue;
                }
            }
            struct plait_topo_nic nic = {.port = (int)port, .is_virtual = info.is_virtual};
            snprintf(nic.dev, sizeof(nic.dev), "%s", devs[i].s);
            snprintf(rel, sizeof(rel), "%s/ports/%ld/rate", dir, port);
            if (plait_disc_read(d, rel, val, sizeof(val)) > 0) {
                nic.speed = parse_rate(val);
                if (nic.speed == 0)
                    PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s port %ld: rate \"%s\" not understood", devs[i].s,
                                port, val);
            }
            snprintf(rel, sizeof(rel), "%s/ports/%ld/link_layer", dir, port);
            if (plait_disc_read(d, rel, val, sizeof(val)) > 0) {
                if (strcmp(val, "InfiniBand") == 0)
                    nic.link_layer = PLAIT_LINK_LAYER_IB;
                else if (strcmp(val, "Ethernet") == 0)
                    nic.link_layer = PLAIT_LINK_LAYER_ETHERNET;
            }
            snprintf(rel, sizeof(rel), "%s/ports/%ld/gids/0", dir, port);
            if (plait_disc_read(d, rel, val, sizeof(val)) > 0)
                nic.guid = parse_guid(val);
            if (nic.guid == 0)
                nic.guid = node_guid;
            nic.has_gdr = has_peermem && !info.is_virtual;
            rdma_netdev(d, dir, (int)port, nic.netdev, sizeof(nic.netdev));
            if (nic.netdev[0] != '\0' && cl->nnetdev < MAX_ENTRIES)
                snprintf(cl->netdev[cl->nnetdev++].s, sizeof(cl->netdev[0].s), "%s", nic.netdev);
            int node;
            r = add_nic(d, &nic, &info, &node);
            (*nrdma)++;
        }
    }
    free(devs);
    return r;
}

static bool is_claimed(const struct claimed *cl, const char *ifname, uint64_t busid)
{
    for (int i = 0; i < cl->nnetdev; i++)
        if (strcmp(cl->netdev[i].s, ifname) == 0)
            return true;
    for (int i = 0; busid != PLAIT_TOPO_NO_BUSID && i < cl->nbusid; i++)
        if (cl->busid[i] == busid)
            return true;
    return false;
}

static bool is_software(const struct plait_disc *d, const char *ifname)
{
    static const char *const prefixes[] = {"veth", "docker"};
    char rel[PATH_MAX];
    if (strcmp(ifname, "lo") == 0)
        return true;
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
        if (strncmp(ifname, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    snprintf(rel, sizeof(rel), "sys/class/net/%s/bridge", ifname);
    if (plait_disc_exists(d, rel))
        return true;
    snprintf(rel, sizeof(rel), "sys/class/net/%s/tun_flags", ifname);
    if (plait_disc_exists(d, rel))
        return true;
    snprintf(rel, sizeof(rel), "sys/class/net/%s/device", ifname);
    return !plait_disc_exists(d, rel);
}

static plait_result_t scan_ethernet(struct plait_disc *d, const struct claimed *cl)
{
    struct name *ifs = calloc(MAX_ENTRIES, sizeof(*ifs));
    char dir[96], rel[PATH_MAX], val[64];
    plait_result_t r = PLAIT_SUCCESS;
    if (ifs == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
    int nif = list_dir(d, "sys/class/net", ifs, MAX_ENTRIES);
    if (nif < 0)
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: cannot read %s/sys/class/net: no Ethernet ports", d->root);
    for (int i = 0; i < nif && r == PLAIT_SUCCESS; i++) {
        const char *ifname = ifs[i].s;
        long type, mbps;
        if (is_software(d, ifname))
            continue;
        snprintf(dir, sizeof(dir), "sys/class/net/%s", ifname);
        /* ARPHRD_ETHER only: IPoIB (32) belongs to its RDMA device, the rest is not a network port. */
        snprintf(rel, sizeof(rel), "%s/type", dir);
        if (plait_disc_read(d, rel, val, sizeof(val)) <= 0 || !plait_topo_parse_long(val, 0, 65535, &type) ||
            type != 1)
            continue;
        snprintf(rel, sizeof(rel), "%s/operstate", dir);
        if (plait_disc_read(d, rel, val, sizeof(val)) > 0 &&
            (strcmp(val, "down") == 0 || strcmp(val, "lowerlayerdown") == 0 || strcmp(val, "notpresent") == 0)) {
            PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s is %s, skipped", ifname, val);
            continue;
        }
        struct dev_info info;
        read_device(d, dir, &info);
        if (is_claimed(cl, ifname, info.busid))
            continue;
        struct plait_topo_nic nic = {.port = 1, .link_layer = PLAIT_LINK_LAYER_ETHERNET,
                                     .is_virtual = info.is_virtual};
        snprintf(nic.dev, sizeof(nic.dev), "%s", ifname);
        snprintf(nic.netdev, sizeof(nic.netdev), "%s", ifname);
        /* Mb/s; -1 (virtio, link down) means unknown. 100 Tb/s bounds anything real. */
        snprintf(rel, sizeof(rel), "%s/speed", dir);
        if (plait_disc_read(d, rel, val, sizeof(val)) > 0) {
            if (plait_topo_parse_long(val, -1, 100000000L, &mbps)) {
                if (mbps > 0)
                    nic.speed = (double)mbps / 1000.0;
            } else {
                PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s: speed \"%s\" not understood", ifname, val);
            }
        }
        int node;
        r = add_nic(d, &nic, &info, &node);
    }
    free(ifs);
    return r;
}

plait_result_t plait_disc_sysfs(struct plait_disc *d)
{
    struct claimed *cl = calloc(1, sizeof(*cl));
    int nrdma = 0;
    if (cl == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
    bool has_peermem = plait_disc_exists(d, "sys/module/nvidia_peermem") ||
                       plait_disc_exists(d, "sys/kernel/mm/memory_peers/nv_mem");
    plait_result_t r = scan_rdma(d, has_peermem, cl, &nrdma);
    if (r == PLAIT_SUCCESS)
        r = scan_ethernet(d, cl);
    if (r == PLAIT_SUCCESS && nrdma > 0 && d->topo->counts[PLAIT_TOPO_GPU] > 0 && !has_peermem)
        PLAIT_INFO(PLAIT_SUBSYS_INIT,
                   "topology: no GPUDirect RDMA (neither nvidia_peermem nor nv_peer_mem is loaded)");
    free(cl);
    return r;
}
