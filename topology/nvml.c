/* Topology discovery from NVML, loaded with dlopen so that plait builds and
 * runs on machines without NVIDIA's driver. The types and constants below are
 * NVML's ABI as nvml.h defines it (struct layouts, enum values, versioned
 * entry points), declared here because that header is not installed
 * everywhere; the names are ours.
 *
 * What NVML adds to the graph:
 * - GPU attributes (CUDA index, sm, name, UUID, memory), matched to the GPUs
 *   hwloc found on PCI by bus id; a GPU NVML reports and hwloc did not see is
 *   added and hung from the first CPU node.
 * - NVLinks: each active link of each GPU, grouped by what is at the far end.
 *   Another GPU: one NVL link between the two, lanes = links. An NVSwitch:
 *   as NCCL does, NVSwitch chips are not nodes of their own; all those a set
 *   of GPUs reaches (a fabric: switches joined through a GPU they share) are
 *   one nvs node, count = chips seen, and each GPU gets one NVL link to it
 *   with lanes = its links to any of them. A far end NVML cannot name (no
 *   type, no bus id) is taken for an NVSwitch, as NCCL does. A CPU (POWER's
 *   NPU): an NVL link to the GPU's CPU node.
 * - C2C (Grace Hopper, Grace Blackwell): when NVML reports active C2C links,
 *   one C2C link to the GPU's CPU node, lanes = links, bw = links x the
 *   per-link figure NVML gives (MB/s), else PLAIT_TOPO_C2C_BW.
 * NVML numbers NVLink versions 1.0, 2.0, 2.2, 3.0, 3.1, 4.0, 5.0, 6.0 as 1..8;
 * they map to plait's generations 1, 2, 2, 3, 3, 4, 5, 5 (plait knows five).
 */
#define _GNU_SOURCE
#include "topology/discover.h"

#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"

/* ---- NVML's ABI ---- */
typedef int nvml_return_t; /* nvmlReturn_t: 0 is success */
#define NVML_OK 0
typedef struct nvml_device_st *nvml_device_t;
#define NVML_NVLINK_MAX_LINKS 36
#define NVML_PCI_BUS_ID_LEN 32   /* NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE */
#define NVML_PCI_BUS_ID_V2_LEN 16 /* NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE */
#define NVML_NAME_LEN 96         /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define NVML_UUID_LEN 96         /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define NVML_FEATURE_ENABLED 1
enum nvml_link_remote { /* nvmlIntNvLinkDeviceType_t */
    NVML_REMOTE_GPU = 0,
    NVML_REMOTE_IBMNPU = 1,
    NVML_REMOTE_SWITCH = 2,
    NVML_REMOTE_UNKNOWN = 0xff
};
#define NVML_FI_C2C_LINK_COUNT 170
#define NVML_FI_C2C_LINK_STATUS 171
#define NVML_FI_C2C_LINK_MAX_BW 172 /* MB/s per active link */
enum nvml_value_type {
    NVML_VT_DOUBLE = 0,
    NVML_VT_UINT = 1,
    NVML_VT_ULONG = 2,
    NVML_VT_ULLONG = 3,
    NVML_VT_SLLONG = 4,
    NVML_VT_SINT = 5,
    NVML_VT_USHORT = 6
};

struct nvml_pci_info { /* nvmlPciInfo_t */
    char bus_id_legacy[NVML_PCI_BUS_ID_V2_LEN];
    unsigned domain, bus, device;
    unsigned pci_device_id;    /* device id << 16 | vendor id */
    unsigned pci_subsystem_id;
    char bus_id[NVML_PCI_BUS_ID_LEN];
};

struct nvml_memory { /* nvmlMemory_t (v1) */
    unsigned long long total, free, used;
};

struct nvml_c2c_mode_info { /* nvmlC2cModeInfo_v1_t */
    unsigned is_c2c_enabled;
};

union nvml_value { /* nvmlValue_t */
    double d;
    int si;
    unsigned ui;
    unsigned long ul;
    unsigned long long ull;
    signed long long sll;
    unsigned short us;
};

struct nvml_field_value { /* nvmlFieldValue_t */
    unsigned field_id, scope_id;
    long long timestamp, latency_usec;
    int value_type; /* nvmlValueType_t */
    nvml_return_t ret;
    union nvml_value value;
};

struct nvml_api {
    void *lib;
    nvml_return_t (*init)(void);
    nvml_return_t (*shutdown)(void);
    nvml_return_t (*count)(unsigned *);
    nvml_return_t (*handle)(unsigned, nvml_device_t *);
    nvml_return_t (*pci_info)(nvml_device_t, struct nvml_pci_info *);
    nvml_return_t (*name)(nvml_device_t, char *, unsigned);
    nvml_return_t (*uuid)(nvml_device_t, char *, unsigned);
    nvml_return_t (*compute_capability)(nvml_device_t, int *, int *);
    nvml_return_t (*memory)(nvml_device_t, struct nvml_memory *);
    nvml_return_t (*nvlink_state)(nvml_device_t, unsigned, int *);
    nvml_return_t (*nvlink_version)(nvml_device_t, unsigned, unsigned *);
    nvml_return_t (*nvlink_remote_pci)(nvml_device_t, unsigned, struct nvml_pci_info *);
    nvml_return_t (*nvlink_remote_type)(nvml_device_t, unsigned, int *);
    nvml_return_t (*c2c_mode)(nvml_device_t, struct nvml_c2c_mode_info *);
    nvml_return_t (*field_values)(nvml_device_t, int, struct nvml_field_value *);
};

/* The entry points, as data: a required one missing means no NVML; an
 * optional one missing leaves its attribute unknown. */
static const struct {
    const char *symbol;
    size_t offset;
    bool is_required;
} nvml_symbols[] = {
    {"nvmlInit_v2", offsetof(struct nvml_api, init), true},
    {"nvmlShutdown", offsetof(struct nvml_api, shutdown), true},
    {"nvmlDeviceGetCount_v2", offsetof(struct nvml_api, count), true},
    {"nvmlDeviceGetHandleByIndex_v2", offsetof(struct nvml_api, handle), true},
    {"nvmlDeviceGetPciInfo_v3", offsetof(struct nvml_api, pci_info), true},
    {"nvmlDeviceGetName", offsetof(struct nvml_api, name), false},
    {"nvmlDeviceGetUUID", offsetof(struct nvml_api, uuid), false},
    {"nvmlDeviceGetCudaComputeCapability", offsetof(struct nvml_api, compute_capability), false},
    {"nvmlDeviceGetMemoryInfo", offsetof(struct nvml_api, memory), false},
    {"nvmlDeviceGetNvLinkState", offsetof(struct nvml_api, nvlink_state), false},
    {"nvmlDeviceGetNvLinkVersion", offsetof(struct nvml_api, nvlink_version), false},
    {"nvmlDeviceGetNvLinkRemotePciInfo_v2", offsetof(struct nvml_api, nvlink_remote_pci), false},
    {"nvmlDeviceGetNvLinkRemoteDeviceType", offsetof(struct nvml_api, nvlink_remote_type), false},
    {"nvmlDeviceGetC2cModeInfoV", offsetof(struct nvml_api, c2c_mode), false},
    {"nvmlDeviceGetFieldValues", offsetof(struct nvml_api, field_values), false},
};

/* Most GPUs one host's NVML may report; more is not a real machine. */
#define MAX_GPUS 256

enum far_end { FAR_GPU, FAR_SWITCH, FAR_CPU };

struct remote {
    enum far_end type;
    uint64_t busid; /* PLAIT_TOPO_NO_BUSID when NVML could not say */
    int count;
};

struct gpu_links {
    int node; /* graph node, -1 when this NVML device was not used */
    int nremote;
    struct remote remote[NVML_NVLINK_MAX_LINKS];
    int fabric; /* key index of its switches' fabric, -1 none */
};

static bool load_api(struct nvml_api *api, const char *path)
{
    memset(api, 0, sizeof(*api));
    api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (api->lib == NULL) {
        const char *why = dlerror();
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: no NVML (%s): GPU attributes from PCI only", why ? why : path);
        return false;
    }
    for (size_t i = 0; i < sizeof(nvml_symbols) / sizeof(nvml_symbols[0]); i++) {
        void *sym = dlsym(api->lib, nvml_symbols[i].symbol);
        if (sym == NULL && nvml_symbols[i].is_required) {
            PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: no NVML (%s lacks %s): GPU attributes from PCI only", path,
                       nvml_symbols[i].symbol);
            dlclose(api->lib);
            api->lib = NULL;
            return false;
        }
        /* POSIX guarantees a data pointer from dlsym converts to a function pointer. */
        memcpy((char *)api + nvml_symbols[i].offset, &sym, sizeof(sym));
    }
    return true;
}

static uint64_t pci_busid(const struct nvml_pci_info *p)
{
    char id[NVML_PCI_BUS_ID_LEN + 1];
    memcpy(id, p->bus_id, NVML_PCI_BUS_ID_LEN);
    id[NVML_PCI_BUS_ID_LEN] = '\0';
    uint64_t b = plait_topo_busid_parse(id);
    if (b == PLAIT_TOPO_NO_BUSID && id[0] == '\0' && (p->domain | p->bus | p->device) != 0 && p->bus <= 0xff &&
        p->device <= 0x1f && p->domain <= 0xffffff)
        b = (uint64_t)p->domain << 20 | (uint64_t)p->bus << 12 | (uint64_t)p->device << 4;
    return b;
}

static int map_nvlink_version(unsigned v)
{
    static const int plait_gen[] = {0, 1, 2, 2, 3, 3, 4, 5, 5};
    return v < sizeof(plait_gen) / sizeof(plait_gen[0]) ? plait_gen[v] : 0;
}

static void fill_gpu(const struct nvml_api *api, nvml_device_t h, unsigned index, struct plait_topo_node *g)
{
    char buf[NVML_NAME_LEN > NVML_UUID_LEN ? NVML_NAME_LEN : NVML_UUID_LEN];
    int major, minor;
    struct nvml_memory mem;
    g->gpu.dev = (int)index;
    memset(buf, 0, sizeof(buf));
    if (api->name && api->name(h, buf, NVML_NAME_LEN) == NVML_OK)
        plait_disc_copy_text(g->gpu.model, sizeof(g->gpu.model), buf, NVML_NAME_LEN);
    memset(buf, 0, sizeof(buf));
    if (api->uuid && api->uuid(h, buf, NVML_UUID_LEN) == NVML_OK)
        plait_disc_copy_text(g->gpu.uuid, sizeof(g->gpu.uuid), buf, NVML_UUID_LEN);
    if (api->compute_capability && api->compute_capability(h, &major, &minor) == NVML_OK && major > 0 &&
        major < 100 && minor >= 0 && minor < 10)
        g->gpu.sm = major * 10 + minor;
    if (api->memory && api->memory(h, &mem) == NVML_OK && mem.total < (1ULL << 50))
        g->gpu.memory = mem.total;
}

/* The far ends of GPU h's active NVLinks, grouped; sets nvlinks and the version. */
static void read_nvlinks(const struct plait_disc *d, const struct nvml_api *api, nvml_device_t h,
                         struct plait_topo_node *g, struct gpu_links *gl)
{
    if (api->nvlink_state == NULL)
        return;
    for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
        int active = 0, type = NVML_REMOTE_UNKNOWN;
        unsigned version = 0;
        struct nvml_pci_info pci;
        if (api->nvlink_state(h, l, &active) != NVML_OK || active != NVML_FEATURE_ENABLED)
            continue;
        uint64_t busid = PLAIT_TOPO_NO_BUSID;
        memset(&pci, 0, sizeof(pci));
        if (api->nvlink_remote_pci && api->nvlink_remote_pci(h, l, &pci) == NVML_OK)
            busid = pci_busid(&pci);
        if (api->nvlink_remote_type == NULL || api->nvlink_remote_type(h, l, &type) != NVML_OK)
            type = NVML_REMOTE_UNKNOWN;
        enum far_end end;
        if (type == NVML_REMOTE_GPU)
            end = FAR_GPU;
        else if (type == NVML_REMOTE_IBMNPU)
            end = FAR_CPU;
        else if (type == NVML_REMOTE_SWITCH)
            end = FAR_SWITCH;
        else
            end = plait_topo_find_busid(d->topo, PLAIT_TOPO_GPU, busid) >= 0 ? FAR_GPU : FAR_SWITCH;
        if (api->nvlink_version && api->nvlink_version(h, l, &version) == NVML_OK) {
            int v = map_nvlink_version(version);
            if (v > g->gpu.nvlink_version)
                g->gpu.nvlink_version = v;
        }
        g->gpu.nvlinks++;
        int k = 0;
        while (k < gl->nremote && !(gl->remote[k].type == end && gl->remote[k].busid == busid))
            k++;
        if (k == gl->nremote)
            gl->remote[gl->nremote++] = (struct remote){.type = end, .busid = busid, .count = 0};
        gl->remote[k].count++;
    }
}

/* ---- NVSwitch fabrics: union-find over the switches' bus ids ---- */

struct fabrics {
    uint64_t key[MAX_GPUS * 4]; /* distinct switch bus ids (NO_BUSID stands for "some switch") */
    int parent[MAX_GPUS * 4];
    int nkeys;
    int node[MAX_GPUS * 4]; /* nvs node of a root key, -1 */
};

static int fabric_key(struct fabrics *f, uint64_t busid)
{
    for (int i = 0; i < f->nkeys; i++)
        if (f->key[i] == busid)
            return i;
    if (f->nkeys == (int)(sizeof(f->key) / sizeof(f->key[0])))
        return -1;
    f->key[f->nkeys] = busid;
    f->parent[f->nkeys] = f->nkeys;
    f->node[f->nkeys] = -1;
    return f->nkeys++;
}

static int fabric_root(struct fabrics *f, int k)
{
    while (f->parent[k] != k)
        k = f->parent[k] = f->parent[f->parent[k]];
    return k;
}

static plait_result_t add_nvl(struct plait_disc *d, int a, int b, int lanes)
{
    double bw = plait_topo_link_default_bw(d->topo, PLAIT_LINK_NVL, a, b, lanes);
    return plait_topo_add_link(d->topo, a, b, PLAIT_LINK_NVL, lanes, bw, 0);
}

static int cpu_node_of(const struct plait_disc *d, int gpu)
{
    int numa = d->topo->nodes[gpu].numa;
    return plait_topo_nth(d->topo, PLAIT_TOPO_CPU, numa >= 0 ? numa : 0);
}

static plait_result_t add_nvlink_graph(struct plait_disc *d, struct gpu_links *gl, int ngpu)
{
    struct plait_topo *t = d->topo;
    plait_result_t r = PLAIT_SUCCESS;
    struct fabrics *f = malloc(sizeof(*f));
    if (f == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
    f->nkeys = 0;
    for (int i = 0; i < ngpu; i++) {
        gl[i].fabric = -1;
        for (int k = 0; gl[i].node >= 0 && k < gl[i].nremote; k++) {
            if (gl[i].remote[k].type != FAR_SWITCH)
                continue;
            int key = fabric_key(f, gl[i].remote[k].busid);
            if (key < 0)
                continue;
            if (gl[i].fabric < 0)
                gl[i].fabric = key;
            else
                f->parent[fabric_root(f, key)] = fabric_root(f, gl[i].fabric);
        }
    }
    for (int i = 0; i < ngpu && r == PLAIT_SUCCESS; i++) {
        int g = gl[i].node;
        int to_switch = 0, to_cpu = 0;
        for (int k = 0; g >= 0 && k < gl[i].nremote && r == PLAIT_SUCCESS; k++) {
            const struct remote *rm = &gl[i].remote[k];
            if (rm->type == FAR_SWITCH) {
                to_switch += rm->count;
            } else if (rm->type == FAR_CPU) {
                /* A CPU shows up once per NPU function (POWER9: one PCI
                 * function per link), all of them one node here: one link. */
                to_cpu += rm->count;
            } else {
                int peer = plait_topo_find_busid(t, PLAIT_TOPO_GPU, rm->busid);
                /* Each pair once, from the GPU of lower node index; its own count of links. */
                if (peer > g)
                    r = add_nvl(d, g, peer, rm->count);
                else if (peer < 0)
                    PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: %s has NVLinks to an unknown GPU, ignored",
                                t->nodes[g].name);
            }
        }
        if (r == PLAIT_SUCCESS && to_cpu > 0) {
            int c = cpu_node_of(d, g);
            if (c >= 0)
                r = add_nvl(d, g, c, to_cpu);
        }
        if (r != PLAIT_SUCCESS || to_switch == 0 || gl[i].fabric < 0)
            continue;
        int root = fabric_root(f, gl[i].fabric);
        if (f->node[root] < 0) {
            int n = plait_topo_add_node(t, PLAIT_TOPO_NVS, NULL);
            if (n < 0) {
                r = PLAIT_ERR_INVALID_ARGUMENT;
                break;
            }
            int chips = 0;
            for (int k = 0; k < f->nkeys; k++)
                if (fabric_root(f, k) == root && f->key[k] != PLAIT_TOPO_NO_BUSID)
                    chips++;
            t->nodes[n].nvs.count = chips;
            f->node[root] = n;
        }
        r = add_nvl(d, g, f->node[root], to_switch);
    }
    free(f);
    return r;
}

/* Reads an integer field value; false when NVML has none. */
static bool field_long(const struct nvml_field_value *v, long long *out)
{
    if (v->ret != NVML_OK)
        return false;
    switch (v->value_type) {
    case NVML_VT_UINT: *out = v->value.ui; return true;
    case NVML_VT_SINT: *out = v->value.si; return true;
    case NVML_VT_ULONG: *out = (long long)v->value.ul; return true;
    case NVML_VT_ULLONG: *out = (long long)v->value.ull; return true;
    case NVML_VT_SLLONG: *out = v->value.sll; return true;
    case NVML_VT_USHORT: *out = v->value.us; return true;
    default: return false;
    }
}

static plait_result_t add_c2c(struct plait_disc *d, const struct nvml_api *api, nvml_device_t h, int g)
{
    int links = 0;
    double bw = 0;
    if (api->field_values != NULL) {
        struct nvml_field_value fv = {.field_id = NVML_FI_C2C_LINK_COUNT};
        long long count = 0;
        if (api->field_values(h, 1, &fv) == NVML_OK && field_long(&fv, &count) && count > 0 && count <= 64) {
            for (int l = 0; l < count; l++) {
                struct nvml_field_value two[2] = {{.field_id = NVML_FI_C2C_LINK_STATUS, .scope_id = (unsigned)l},
                                                  {.field_id = NVML_FI_C2C_LINK_MAX_BW, .scope_id = (unsigned)l}};
                long long up = 0, mbps = 0;
                if (api->field_values(h, 2, two) != NVML_OK || !field_long(&two[0], &up) || up != 1)
                    continue;
                links++;
                if (field_long(&two[1], &mbps) && mbps > 0 && mbps < 10000000)
                    bw += (double)mbps / 1000.0;
            }
        }
    }
    if (links == 0 && api->c2c_mode != NULL) {
        struct nvml_c2c_mode_info mode = {0};
        if (api->c2c_mode(h, &mode) == NVML_OK && mode.is_c2c_enabled == 1)
            links = 1;
    }
    if (links == 0)
        return PLAIT_SUCCESS;
    int c = cpu_node_of(d, g);
    if (c < 0)
        return PLAIT_SUCCESS;
    if (!(bw > 0) || !isfinite(bw))
        bw = PLAIT_TOPO_C2C_BW;
    return plait_topo_add_link(d->topo, g, c, PLAIT_LINK_C2C, links, bw, 0);
}

/* Matches NVML device i to its GPU node (made when hwloc did not see it). */
static plait_result_t gpu_node_for(struct plait_disc *d, const struct nvml_api *api, nvml_device_t h, unsigned i,
                                   int *node_out)
{
    struct nvml_pci_info pci;
    *node_out = -1;
    memset(&pci, 0, sizeof(pci));
    if (api->pci_info(h, &pci) != NVML_OK)
        return PLAIT_SUCCESS;
    uint64_t busid = pci_busid(&pci);
    if (busid == PLAIT_TOPO_NO_BUSID) {
        PLAIT_TRACE(PLAIT_SUBSYS_INIT, "topology: NVML device %u has no usable bus id, ignored", i);
        return PLAIT_SUCCESS;
    }
    int n = plait_topo_find_busid(d->topo, PLAIT_TOPO_GPU, busid);
    if (n >= 0) {
        if (d->topo->nodes[n].gpu.dev >= 0)
            return PLAIT_SUCCESS; /* NVML named this bus id twice */
        *node_out = n;
        return PLAIT_SUCCESS;
    }
    n = plait_topo_add_node(d->topo, PLAIT_TOPO_GPU, NULL);
    if (n < 0)
        return PLAIT_ERR_INVALID_ARGUMENT;
    d->topo->nodes[n].busid = busid;
    d->topo->nodes[n].pci.vendor = (uint16_t)(pci.pci_device_id & 0xffff);
    d->topo->nodes[n].pci.device = (uint16_t)(pci.pci_device_id >> 16);
    plait_result_t r = plait_disc_attach(d, n, busid, -1);
    if (r == PLAIT_SUCCESS)
        *node_out = n;
    return r;
}

plait_result_t plait_disc_nvml(struct plait_disc *d)
{
    struct nvml_api api;
    const char *path = d->opts->nvml_lib ? d->opts->nvml_lib : "libnvidia-ml.so.1";
    unsigned count = 0;
    struct gpu_links *gl = NULL;
    nvml_device_t *handles = NULL;
    plait_result_t r = PLAIT_SUCCESS;
    if (d->opts->no_nvml) {
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: NVML not used (no_nvml): GPU attributes from PCI only");
        return PLAIT_SUCCESS;
    }
    if (!load_api(&api, path))
        return PLAIT_SUCCESS;
    nvml_return_t e = api.init();
    if (e != NVML_OK) {
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: no NVML (nvmlInit_v2 failed: error %d): GPU attributes from PCI only",
                   e);
        goto err_close;
    }
    e = api.count(&count);
    if (e != NVML_OK || count > MAX_GPUS) {
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: NVML device count failed (error %d, count %u): GPU attributes from "
                   "PCI only", e, count);
        goto err_shutdown;
    }
    gl = calloc(count ? count : 1, sizeof(*gl));
    if (gl == NULL) {
        r = plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
        goto err_shutdown;
    }
    handles = calloc(count ? count : 1, sizeof(*handles));
    if (handles == NULL) {
        r = plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory");
        goto err_free_links;
    }
    /* All GPUs first, so that NVLinks to GPUs hwloc missed find their ends. */
    for (unsigned i = 0; i < count && r == PLAIT_SUCCESS; i++) {
        gl[i].node = -1;
        if (api.handle(i, &handles[i]) != NVML_OK) {
            PLAIT_INFO(PLAIT_SUBSYS_INIT, "topology: NVML has no handle for GPU %u: its attributes from PCI only", i);
            continue;
        }
        r = gpu_node_for(d, &api, handles[i], i, &gl[i].node);
        if (r == PLAIT_SUCCESS && gl[i].node >= 0)
            fill_gpu(&api, handles[i], i, &d->topo->nodes[gl[i].node]);
    }
    for (unsigned i = 0; i < count && r == PLAIT_SUCCESS; i++)
        if (gl[i].node >= 0)
            read_nvlinks(d, &api, handles[i], &d->topo->nodes[gl[i].node], &gl[i]);
    if (r == PLAIT_SUCCESS)
        r = add_nvlink_graph(d, gl, (int)count);
    for (unsigned i = 0; i < count && r == PLAIT_SUCCESS; i++)
        if (gl[i].node >= 0)
            r = add_c2c(d, &api, handles[i], gl[i].node);
    free(handles);
err_free_links:
    free(gl);
err_shutdown:
    api.shutdown();
err_close:
    dlclose(api.lib);
    return r;
}
