/* Private to topology discovery: discover.c (the driver and the PCI tree),
 * hwloc.c (CPUs, NUMA nodes and the PCI tree), sysfs.c (network ports) and
 * nvml.c (GPUs and NVLinks). Nothing outside these four files includes it.
 *
 * Discovery runs in one thread on a graph of its own: hwloc first (CPU nodes,
 * SYS links, the PCI objects recorded in `pci`, GPU nodes found on PCI), then
 * NVML (GPU attributes, NVSwitch fabrics, NVLink and C2C links), then sysfs
 * (NIC nodes). Devices are hung from the PCI tree by plait_disc_attach, which
 * creates the switch nodes they need on the way. */
#ifndef PLAIT_TOPO_DISCOVER_H
#define PLAIT_TOPO_DISCOVER_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "topology/topo.h"

/* Most PCI objects (bridges and devices) and CPU-bearing NUMA nodes discovery
 * keeps; a machine or a recorded file with more is cut there (INFO line). */
#define PLAIT_DISC_MAX_PCI 4096
#define PLAIT_DISC_MAX_NUMA 1024

/* One PCI object hwloc reported: a PCI-to-PCI bridge (a switch port or a root
 * port), a host bridge, or a device. */
struct plait_disc_pci {
    uint64_t busid;     /* own address; PLAIT_TOPO_NO_BUSID for a host bridge */
    int parent;         /* index in plait_disc.pci of the object above, -1 at the top */
    int cpu;            /* per-type index of the CPU node the subtree hangs from, -1 unknown */
    bool is_bridge;     /* PCI-to-PCI bridge */
    bool is_hostbridge;
    uint16_t vendor, device;
    uint16_t class_id;  /* base class << 8 | subclass (0x0302: 3D controller) */
    int gen, width;     /* its upstream link, 0 unknown */
    int node;           /* graph node made for it (a switch's upstream port), -1 none yet */
};

struct plait_disc {
    struct plait_topo *topo;
    const struct plait_topo_discover_opts *opts; /* never NULL */
    char root[PATH_MAX]; /* opts->fsroot without a trailing '/', "" for the real root */
    struct plait_disc_pci *pci;
    int npci, cap_pci;
    int numa_os[PLAIT_DISC_MAX_NUMA]; /* OS NUMA index of CPU node i (per-type index), -1 unknown */
};

/* ---- hwloc.c ---- */

/* Loads hwloc (the live machine, or opts->hwloc_xml) and adds the CPU nodes
 * with the SYS links between them, and records the PCI tree in d->pci.
 * PLAIT_ERR_SYSTEM (with the last error saying why) when hwloc cannot load
 * the live machine or reports no CPU-bearing NUMA node: the graph is untouched
 * and the caller falls back. An XML file that cannot be read or loaded is an
 * error naming it and why (with what to install where hwloc lacks libxml2).
 * Any other failure is a graph error to pass on. */
plait_result_t plait_disc_hwloc(struct plait_disc *d);

/* Rewrites XML document xml[0..len) (`name` for messages) into the form
 * hwloc's minimal parser reads, which libxml2 reads the same: from the root
 * element on, without comments, processing instructions or DOCTYPE, each
 * attribute after one space in double quotes with hwloc's escapes, LF line
 * ends; element text is kept as it is. *out (malloc'd, NUL-terminated, *out_len
 * bytes before the NUL) on success; PLAIT_ERR_INVALID_ARGUMENT with
 * "topology: hwloc XML file NAME:LINE: reason" on malformed XML. */
plait_result_t plait_disc_hwloc_xml_rewrite(const char *xml, size_t len, const char *name, char **out,
                                            size_t *out_len);

/* Decodes hwloc's link speed (GB/s, all lanes together, after encoding) into a
 * PCIe generation and width; both 0 when it matches none. */
void plait_disc_pcie_decode(double gbps, int *gen_out, int *width_out);

/* ---- sysfs.c ---- */

/* Adds one NIC node per InfiniBand/RoCE port and per Ethernet interface
 * without an RDMA device, read under d->root. Bad values are ignored with a
 * TRACE line; only graph errors fail. */
plait_result_t plait_disc_sysfs(struct plait_disc *d);

/* PCIe generation and width of the device at `busid` from
 * sys/bus/pci/devices/<busid>/max_link_{speed,width}: what the link can do,
 * where hwloc reports what it does now (an idle GPU drops to gen1). False when
 * unknown; the outputs are then untouched. */
bool plait_disc_sysfs_pcie(const struct plait_disc *d, uint64_t busid, int *gen_out, int *width_out);

/* ---- nvml.c ---- */

/* Fills GPU attributes from NVML and adds the NVSwitch, NVLink and C2C part.
 * A missing library or a failing call is an INFO line; only graph errors fail. */
plait_result_t plait_disc_nvml(struct plait_disc *d);

/* ---- discover.c: helpers the three sources share ---- */

/* Appends a PCI object; returns its index or -1 (out of memory, or the table is full). */
int plait_disc_pci_add(struct plait_disc *d, const struct plait_disc_pci *p);
/* Index in d->pci of the object with this address, or -1. */
int plait_disc_pci_find(const struct plait_disc *d, uint64_t busid);

/* The CPU node (per-type index) of OS NUMA node `os_numa`, -1 when there is
 * no such node; with a single CPU node every valid NUMA index maps to it. */
int plait_disc_cpu_of_numa(const struct plait_disc *d, long os_numa);

/* Hangs device node `node` (a GPU or a NIC) from the graph by a PCI link: below
 * the PCIe switch above `busid` in the hwloc tree (creating the switch nodes up
 * to the CPU), or else from CPU node `cpu` (per-type index; -1 unknown: the
 * first CPU node). Sets the node's numa, and its own link's gen/width when
 * hwloc knows them. */
plait_result_t plait_disc_attach(struct plait_disc *d, int node, uint64_t busid, int cpu);

/* Reads the first line of <root>/<rel> into buf (without its newline).
 * Returns its length, or -1 when the file cannot be read, is empty, holds a
 * NUL or another control character, or does not fit in buf. */
int plait_disc_read(const struct plait_disc *d, const char *rel, char *buf, size_t len);
/* The whole of <root>/<rel> (a uevent file), NUL-terminated; its length, or
 * -1 as above (control characters other than newline and tab are allowed). */
int plait_disc_read_all(const struct plait_disc *d, const char *rel, char *buf, size_t len);
/* Whether <root>/<rel> exists. */
bool plait_disc_exists(const struct plait_disc *d, const char *rel);
/* Copies printable ASCII from src (at most srclen bytes) into dst, replacing
 * anything else by '?', truncating to fit; dst is always terminated. */
void plait_disc_copy_text(char *dst, size_t dstlen, const char *src, size_t srclen);

#endif
