/* The machine as one graph: what topology discovery builds, what the XML files
 * hold, what path classification and channel search read.
 *
 * Nodes are devices and the places they hang from (NUMA nodes, PCIe switches
 * and host bridges, GPUs, network ports, NVSwitch fabrics); links are the wires
 * between them (NVLink, C2C, PCIe, the inter-socket fabric, the network), kept
 * once per pair and read in both directions. Every attribute that comes from
 * outside (hwloc, sysfs, NVML, an XML file) goes through plait_topo_validate
 * before anything else reads it.
 *
 * This header is private (topology/). Thread-safety: a graph is built by one
 * thread; once built it is read-only and may be read from any thread. */
#ifndef PLAIT_TOPO_H
#define PLAIT_TOPO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "plait.h"

/* Bounds on what a file or a machine may describe; anything larger is rejected. */
#define PLAIT_TOPO_MAX_NODES 4096
#define PLAIT_TOPO_MAX_LINKS 16384
#define PLAIT_TOPO_NAME_LEN 32
#define PLAIT_TOPO_STR_LEN 64
/* A NUMA node's CPU list: long enough for BIOSes that number CPUs alternately
 * between sockets ("0,2,4,...", about 5 bytes a CPU). */
#define PLAIT_TOPO_CPUSET_LEN 1024
/* Most ranks one host's channel search orders (a GB200 NVL72 rack's GPUs fit). */
#define PLAIT_TOPO_MAX_LOCAL 128
#define PLAIT_TOPO_MAX_CHANNELS 32

/* A PCI address packed as domain << 20 | bus << 12 | device << 4 | function,
 * which sorts like the text "dddd:bb:dd.f". */
#define PLAIT_TOPO_NO_BUSID UINT64_MAX

enum plait_topo_node_type {
    PLAIT_TOPO_CPU = 0, /* one NUMA node: its cores and memory (package = socket) */
    PLAIT_TOPO_PCI,     /* a PCIe switch (or one of its ports) or a host bridge */
    PLAIT_TOPO_GPU,
    PLAIT_TOPO_NIC, /* one network port (IB or Ethernet); two ports of one card are two nodes */
    PLAIT_TOPO_NVS, /* an NVSwitch fabric: all the NVSwitches a set of GPUs reaches, merged as NCCL does */
    PLAIT_TOPO_NODE_TYPES
};

enum plait_topo_link_type {
    PLAIT_LINK_NVL = 0, /* NVLink (lanes = links) */
    PLAIT_LINK_C2C,     /* NVLink-C2C between a GPU and a Grace CPU */
    PLAIT_LINK_PCI,     /* PCIe (lanes = width) */
    PLAIT_LINK_SYS,     /* between NUMA nodes or sockets (UPI, Infinity Fabric, Grace's NVLink-C2C) */
    PLAIT_LINK_NET,     /* the network, for graphs that span hosts */
    PLAIT_LINK_TYPES
};

/* Path types between two devices, best first, with NCCL's meanings
 * (docs/topology.md):
 *   LOC  the same device
 *   NVL  NVLink, directly or through NVSwitches
 *   NVB  NVLink through an intermediate GPU
 *   C2C  GPU to its CPU over NVLink-C2C
 *   PIX  through at most one PCIe bridge
 *   PXB  through several PCIe bridges, not crossing a host bridge
 *   P2C  GPU -> C2C -> CPU -> PCIe -> NIC (Grace)
 *   PXN  GPU -> NVLink -> another GPU -> PCIe -> NIC
 *   PHB  through a PCIe host bridge (the CPU of one NUMA node)
 *   SYS  across the link between NUMA nodes or sockets
 *   NET  across the network
 *   DIS  not connected */
enum plait_topo_path_type {
    PLAIT_PATH_LOC = 0,
    PLAIT_PATH_NVL,
    PLAIT_PATH_NVB,
    PLAIT_PATH_C2C,
    PLAIT_PATH_PIX,
    PLAIT_PATH_PXB,
    PLAIT_PATH_P2C,
    PLAIT_PATH_PXN,
    PLAIT_PATH_PHB,
    PLAIT_PATH_SYS,
    PLAIT_PATH_NET,
    PLAIT_PATH_DIS,
    PLAIT_PATH_TYPES
};

enum plait_topo_link_layer { PLAIT_LINK_LAYER_UNKNOWN = 0, PLAIT_LINK_LAYER_IB, PLAIT_LINK_LAYER_ETHERNET };

enum plait_topo_pci_kind { PLAIT_PCI_SWITCH = 0, PLAIT_PCI_HOST_BRIDGE };

struct plait_topo_cpu {
    int package;                 /* socket, -1 unknown */
    int ncores;                  /* cores in this NUMA node, 0 unknown */
    uint64_t memory;             /* bytes, 0 unknown */
    char arch[16];               /* "x86_64", "aarch64", "" */
    char vendor[PLAIT_TOPO_STR_LEN]; /* "GenuineIntel", "AuthenticAMD", "NVIDIA" (Grace), "" */
    char model[PLAIT_TOPO_STR_LEN];
    char cpuset[PLAIT_TOPO_CPUSET_LEN]; /* hwloc list form "0-55,112-167", "" unknown */
};

struct plait_topo_pci {
    enum plait_topo_pci_kind kind;
    int gen;          /* PCIe generation 1..6, 0 unknown */
    int width;        /* lanes of the upstream link, 0 unknown */
    uint16_t vendor;  /* PCI ids, 0 unknown */
    uint16_t device;
};

struct plait_topo_gpu {
    int dev;                  /* CUDA/NVML index, -1 unknown */
    int sm;                   /* compute capability major*10+minor (90 = H100), 0 unknown */
    char model[PLAIT_TOPO_STR_LEN];
    char uuid[PLAIT_TOPO_STR_LEN];
    uint64_t memory;          /* bytes, 0 unknown */
    int nvlinks;              /* NVLinks up, all remote ends together */
    int nvlink_version;       /* 1..5, 0 none/unknown */
};

struct plait_topo_nic {
    char dev[PLAIT_TOPO_NAME_LEN];    /* "mlx5_0" (IB device) or "eth0" (netdev without IB device) */
    char netdev[PLAIT_TOPO_NAME_LEN]; /* associated netdev ("ib0", "enp1s0"), "" none */
    int port;                         /* IB port number (1-based), 1 for Ethernet */
    double speed;                     /* Gb/s (400 for NDR), 0 unknown */
    enum plait_topo_link_layer link_layer;
    uint64_t guid;                    /* port GUID, 0 unknown */
    bool has_gdr;                     /* GPUDirect RDMA possible (peer memory module present) */
    bool is_virtual;                  /* virtio, veth, bridges: no real NIC behind it */
};

struct plait_topo_nvs {
    int count; /* NVSwitch chips merged into this node, 0 unknown */
};

struct plait_topo_node {
    enum plait_topo_node_type type;
    char name[PLAIT_TOPO_NAME_LEN]; /* unique in the graph: "cpu0", "pci3", "gpu0", "nic2", "nvs0" */
    int index;                      /* per type, dense from 0: GPU i is the i-th GPU node */
    uint64_t busid;                 /* PCI address or PLAIT_TOPO_NO_BUSID */
    int numa;                       /* NUMA node (CPU node's index) it is attached to, -1 unknown */
    struct plait_topo_cpu cpu;      /* only the member of `type` is meaningful, */
    struct plait_topo_pci pci;      /* except pci.gen/width/vendor/device, also those of a GPU's or NIC's own link */
    struct plait_topo_gpu gpu;
    struct plait_topo_nic nic;
    struct plait_topo_nvs nvs;
};

struct plait_topo_link {
    int a, b;                       /* node indices, a != b; read in both directions */
    enum plait_topo_link_type type;
    int lanes;                      /* NVLinks or PCIe lanes; 1 for SYS/NET/C2C unless known */
    double bw;                      /* GB/s in each direction */
    double latency;                 /* microseconds, 0 unknown */
};

struct plait_topo {
    char host[PLAIT_TOPO_STR_LEN];  /* where it was discovered, "" unknown */
    char source[PLAIT_TOPO_NAME_LEN]; /* "discovered", "plait-xml", "nccl-xml" */
    int nnodes, cap_nodes;
    struct plait_topo_node *nodes;
    int nlinks, cap_links;
    struct plait_topo_link *links;
    int counts[PLAIT_TOPO_NODE_TYPES]; /* nodes per type */
};

/* ---- building (topo.c) ---- */

/* An empty graph. PLAIT_ERR_SYSTEM when out of memory. */
plait_result_t plait_topo_create(struct plait_topo **topo_out);
void plait_topo_free(struct plait_topo *topo);

/* Adds a node of `type` named `name` (NULL: "<type><index>", e.g. "gpu3") with
 * every attribute at its "unknown" value and index = the next one of its type.
 * Returns the node index, or -1 with the last error set (name taken or too
 * long, too many nodes, out of memory). The pointer from plait_topo_node()
 * is invalidated by the next add. */
int plait_topo_add_node(struct plait_topo *topo, enum plait_topo_node_type type, const char *name);

/* Adds an undirected link. PLAIT_ERR_INVALID_ARGUMENT for a bad index, a self
 * link, a duplicate pair of the same type, bw <= 0 or not finite. */
plait_result_t plait_topo_add_link(struct plait_topo *topo, int a, int b, enum plait_topo_link_type type, int lanes,
                                   double bw, double latency);

/* Node lookups: index or -1. */
int plait_topo_find(const struct plait_topo *topo, const char *name);
int plait_topo_find_busid(const struct plait_topo *topo, enum plait_topo_node_type type, uint64_t busid);
/* The node of `type` with per-type index `index`, or -1. */
int plait_topo_nth(const struct plait_topo *topo, enum plait_topo_node_type type, int index);

/* Checks every attribute and link against its range (names unique and
 * printable, indices dense per type, NUMA references existing CPU nodes, PCIe
 * gen 0..6 and width 0..32, speeds and bandwidths finite and in range, links
 * between existing distinct nodes, NVLink only between GPUs/NVS/CPUs, C2C only
 * GPU-CPU...). On failure returns PLAIT_ERR_INVALID_ARGUMENT with a last error
 * naming the node or link and the attribute. */
plait_result_t plait_topo_validate(const struct plait_topo *topo);

/* ---- names and units (topo.c) ---- */

const char *plait_topo_node_type_name(enum plait_topo_node_type t); /* "cpu", "pci", "gpu", "nic", "nvs" */
const char *plait_topo_link_type_name(enum plait_topo_link_type t); /* "NVL", "C2C", "PCI", "SYS", "NET" */
const char *plait_topo_path_type_name(enum plait_topo_path_type t); /* "LOC" ... "DIS" */
const char *plait_topo_link_layer_name(enum plait_topo_link_layer l); /* "unknown", "InfiniBand", "Ethernet" */
/* Parse the names above (case-insensitive); -1 if unknown. */
int plait_topo_node_type_parse(const char *s);
int plait_topo_link_type_parse(const char *s);
int plait_topo_path_type_parse(const char *s);

/* A whole decimal integer in [lo, hi], with an optional sign and nothing
 * else (no blanks, no trailing text), into *out; false otherwise (s NULL too). */
bool plait_topo_parse_long(const char *s, long lo, long hi, long *out);

/* "dddd:bb:dd.f" (or "bb:dd.f", domain 0) -> packed; PLAIT_TOPO_NO_BUSID if malformed. */
uint64_t plait_topo_busid_parse(const char *s);
/* Packed -> "dddd:bb:dd.f" (buf of >= 16 bytes); "" for PLAIT_TOPO_NO_BUSID. */
void plait_topo_busid_format(uint64_t busid, char *buf, size_t len);

/* Data rates, GB/s in each direction. PCIe: per lane after encoding
 * (gen1 0.25, gen2 0.5, gen3 0.985, gen4 1.969, gen5 3.938, gen6 7.563) times
 * width; unknown gen/width read as gen3 x16. NVLink: per link by version
 * (v1 20, v2 25, v3 25, v4 25, v5 50); version 0 reads as the one the GPU's sm
 * implies (70: 2, 80: 3, 90: 4, 100: 5). C2C: 450 per GPU (Grace Hopper and
 * Grace Blackwell: 900 GB/s both ways). SYS: 40 (a conservative inter-socket
 * figure; the XML may give the machine's own). NET: speed Gb/s / 8. */
double plait_topo_pci_bw(int gen, int width);
double plait_topo_nvlink_bw(int version, int sm);
#define PLAIT_TOPO_C2C_BW 450.0
#define PLAIT_TOPO_SYS_BW 40.0

/* The bandwidth a link of `type` and `lanes` between nodes a and b has when no
 * one says otherwise (discovery without figures, XML without bw=): PCI from the
 * gen of whichever end is a PCI node or device below it (lanes 0 = that node's
 * width), NVL lanes * per-link rate of the GPU end, C2C and SYS the constants,
 * NET the NIC's speed. Always > 0. */
double plait_topo_link_default_bw(const struct plait_topo *topo, enum plait_topo_link_type type, int a, int b,
                                  int lanes);

/* ---- XML (xml.c) ---- */

/* Loads a graph from plait's XML format or NCCL's (<system>, as NCCL_TOPO_FILE
 * and NCCL_TOPO_DUMP_FILE hold it), chosen by the root element. `name` is used
 * in messages ("FILE:LINE: reason"). The result is validated. Never trusts the
 * input: malformed text, out-of-range attributes, dangling references and
 * oversized graphs fail with PLAIT_ERR_INVALID_ARGUMENT and a message naming
 * the line and the reason; nothing is leaked. */
plait_result_t plait_topo_load_xml_buffer(const char *buf, size_t len, const char *name, struct plait_topo **topo_out);
/* The same from a file; PLAIT_ERR_SYSTEM when it cannot be read (names the file and errno). */
plait_result_t plait_topo_load_xml(const char *path, struct plait_topo **topo_out);
/* Writes plait's XML format; load(dump(g)) equals g. The buffer form returns a
 * malloc'd NUL-terminated string. */
plait_result_t plait_topo_dump_xml_buffer(const struct plait_topo *topo, char **xml_out);
plait_result_t plait_topo_dump_xml(const struct plait_topo *topo, const char *path);

/* ---- discovery (discover.c, hwloc.c, sysfs.c, nvml.c) ---- */

struct plait_topo_discover_opts {
    const char *fsroot;    /* prefix for /sys (like hwloc's HWLOC_FSROOT); NULL or "" = "/" */
    const char *hwloc_xml; /* build the CPU/PCI part from this hwloc XML instead of the live machine */
    const char *nvml_lib;  /* library to dlopen for NVML; NULL = "libnvidia-ml.so.1" */
    bool no_nvml;          /* skip NVML */
};

/* Discovers this machine (or the one `opts` points at): hwloc for NUMA nodes,
 * packages, cores and the PCI tree; sysfs for network ports; NVML for GPUs and
 * NVLinks. A missing source is an INFO line, not an error: with nothing but
 * /proc and /sys the result is still a correct CPU/NUMA graph. The result is
 * validated. opts may be NULL. */
plait_result_t plait_topo_discover(const struct plait_topo_discover_opts *opts, struct plait_topo **topo_out);

/* ---- paths (paths.c) ---- */

struct plait_topo_path {
    enum plait_topo_path_type type;
    double bw;    /* bottleneck GB/s in the direction from -> to; 0 for DIS */
    int hops;     /* links crossed; 0 for LOC */
    int nvlinks;  /* for NVL/NVB: the fewest NVLinks along the path (nvidia-smi's NV#) */
    int via;      /* the intermediate GPU of an NVB or PXN path, else -1 */
};

struct plait_topo_paths {
    int n; /* = topo->nnodes */
    struct plait_topo_path *p; /* n * n, row = from */
};

/* The best path between every pair of nodes: among the paths of the best type,
 * the one of most bandwidth, then fewest hops (docs/topology.md, "Paths"). */
plait_result_t plait_topo_paths_compute(const struct plait_topo *topo, struct plait_topo_paths **paths_out);
void plait_topo_paths_free(struct plait_topo_paths *paths);
/* The matrix cell of a path as plait-topo prints it: "X" (LOC), "NV<n>" (NVL,
 * n = nvlinks, nvidia-smi's notation), otherwise the type's name ("PIX"). */
void plait_topo_path_label(const struct plait_topo_path *path, char *buf, size_t len);
/* Bandwidth of a LOC path (a device to itself, two ranks on one NUMA node), GB/s. */
#define PLAIT_TOPO_LOC_BW 5000.0
static inline const struct plait_topo_path *plait_topo_path(const struct plait_topo_paths *paths, int from, int to)
{
    return &paths->p[(size_t)from * (size_t)paths->n + (size_t)to];
}

struct plait_topo_affinity {
    int gpu;     /* node index */
    int nic;     /* node index of the nearest NIC, -1 none */
    enum plait_topo_path_type type; /* path type GPU -> NIC */
    double bw;   /* path bandwidth, capped by the NIC's speed */
    bool has_gdr; /* GPUDirect RDMA possible: NIC has it and the path is PIX/PXB (or P2C/PXN where that applies) */
    int cpu;     /* node index of the GPU's NUMA node, -1 unknown */
};

/* The NIC nearest to `gpu` (best path type, then bandwidth, then fewest GPUs
 * already sharing it, then index). PLAIT_ERR_INVALID_ARGUMENT if `gpu` is not a GPU. */
plait_result_t plait_topo_affinity(const struct plait_topo *topo, const struct plait_topo_paths *paths, int gpu,
                                   struct plait_topo_affinity *out);

/* ---- channel search (search.c) ---- */

enum plait_topo_pattern { PLAIT_TOPO_RING = 0, PLAIT_TOPO_TREE };

struct plait_topo_channel {
    int n;                           /* local ranks in order[] */
    int order[PLAIT_TOPO_MAX_LOCAL]; /* local rank indices (positions in the search's devs[]), ring/chain order */
    int nic_in, nic_out;             /* NIC node indices where the inter-host traffic enters and leaves; -1 single host */
    double bw;                       /* this channel's bandwidth, GB/s */
    enum plait_topo_path_type worst; /* worst path type between neighbours */
};

struct plait_topo_search {
    enum plait_topo_pattern pattern;
    int nchannels;
    struct plait_topo_channel ch[PLAIT_TOPO_MAX_CHANNELS];
    double bw;    /* all channels together (nchannels * per-channel bw, links shared counted once) */
};

/* The rings (or tree chains) over the local ranks whose devices are devs[0..ndevs)
 * (node indices: a GPU, or the CPU node of a CPU rank) that maximise the
 * bottleneck bandwidth: NVLink before PCIe, each channel's inter-host hop on
 * the NIC nearest its entry/exit GPU, channels spread over NICs. `multi_host`
 * says whether the ring leaves the host. */
plait_result_t plait_topo_search_channels(const struct plait_topo *topo, const struct plait_topo_paths *paths,
                                          const int *devs, int ndevs, bool multi_host,
                                          enum plait_topo_pattern pattern, struct plait_topo_search *out);

/* ---- this process's graph (system.c) ---- */

/* The graph this process uses: PLAIT_TOPO_FILE (or NCCL_TOPO_FILE) if set,
 * otherwise discovered, once per process; dumped to PLAIT_TOPO_DUMP_FILE (or
 * NCCL_TOPO_DUMP_FILE) the first time. The graph is owned by plait and lives
 * until exit. */
plait_result_t plait_topo_get(const struct plait_topo **topo_out);

/* Writes `topo` to PLAIT_TOPO_DUMP_FILE (or NCCL_TOPO_DUMP_FILE) the first time
 * it is called in this process with the variable set (rank 0 of a communicator
 * calls it, as NCCL dumps from rank 0); later calls do nothing. A failure is a
 * WARN and its status. */
plait_result_t plait_topo_dump_once(const struct plait_topo *topo);

/* The per-type index of the cpu node (NUMA node) the calling thread belongs
 * to: the node whose cpuset holds the first CPU of the thread's affinity (a
 * bound rank: its node; an unbound one: the first node, on every run); the
 * first cpu node when none matches; -1 when the graph has no cpu node. */
int plait_topo_cpu_of_self(const struct plait_topo *topo);

/* The paths of plait_topo_get's graph, computed once per process. */
plait_result_t plait_topo_get_paths(const struct plait_topo_paths **paths_out);

/* A hash of the nodes and links: ranks of one host compare theirs to know that
 * they searched the same graph. */
uint64_t plait_topo_hash(const struct plait_topo *topo);

/* One line: "2 NUMA nodes (112 cores), 8 GPUs (NVIDIA H100), 1 NVSwitch fabric,
 * 8 NICs (mlx5_0 InfiniBand 400 Gb/s, ...)". */
void plait_topo_summary(const struct plait_topo *topo, char *buf, size_t len);

#endif
