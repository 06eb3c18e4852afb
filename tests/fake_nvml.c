/* A fake libnvidia-ml for the discovery tests: the NVML entry points
 * topology/nvml.c uses, answering from a description file named by
 * PLAIT_FAKE_NVML_CONFIG, with NVML's ABI (types declared here, as in nvml.c,
 * so that no NVIDIA header is needed). nvmlInit_v2 (re)reads the file, so a
 * test can point the variable at another machine between discoveries.
 *
 * The format, one item a line, '#' starts a comment:
 *   gpu BUSID MAJOR.MINOR MEMORY_BYTES UUID NAME...   a GPU; the n-th gpu line is NVML index n
 *   nvlink GPU FIRST-LAST TYPE REMOTE VERSION         links FIRST..LAST of GPU (index) are active and
 *                                                     go to TYPE (gpu, switch, cpu, unknown) whose
 *                                                     PCI bus id is REMOTE ('-': NVML cannot say);
 *                                                     VERSION is NVML's nvmlNvlinkVersion_t value
 *   c2c GPU COUNT MBPS                                COUNT active C2C links of MBPS MB/s each
 *   fail FUNCTION                                     that entry point returns NVML_ERROR_UNKNOWN
 * A malformed line makes nvmlInit_v2 fail (NVML_ERROR_UNKNOWN), so a broken
 * fixture cannot pass for a machine without NVML by accident. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK 0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_DRIVER_NOT_LOADED 9
#define ERR_UNKNOWN 999

#define MAX_GPUS 64
#define MAX_LINKS 36
#define MAX_FAIL 16

struct pci_info { /* nvmlPciInfo_t */
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};
struct memory { /* nvmlMemory_t */
    unsigned long long total, free, used;
};
struct c2c_mode { /* nvmlC2cModeInfo_v1_t */
    unsigned is_c2c_enabled;
};
union value {
    double d;
    int si;
    unsigned ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
    unsigned short us;
};
struct field_value { /* nvmlFieldValue_t */
    unsigned field_id, scope_id;
    long long timestamp, latency_usec;
    int value_type;
    int ret;
    union value value;
};

struct link {
    int is_active;
    int type; /* nvmlIntNvLinkDeviceType_t: 0 GPU, 1 IBMNPU, 2 switch, 0xff unknown */
    char remote[32];
    unsigned version;
};

struct gpu {
    char bus_id[32];
    int major, minor;
    unsigned long long memory;
    char uuid[80];
    char name[96];
    struct link links[MAX_LINKS];
    int c2c_count;
    unsigned c2c_mbps;
};

static struct gpu gpus[MAX_GPUS];
static int ngpus;
static int is_initialized;
static char failing[MAX_FAIL][64];
static int nfailing;

static int fails(const char *fn)
{
    for (int i = 0; i < nfailing; i++)
        if (strcmp(failing[i], fn) == 0)
            return 1;
    return 0;
}

static int parse_line(char *line)
{
    char *save, *word = strtok_r(line, " \t\n", &save);
    if (word == NULL || word[0] == '#')
        return 0;
    if (strcmp(word, "gpu") == 0) {
        if (ngpus == MAX_GPUS)
            return -1;
        struct gpu *g = &gpus[ngpus];
        memset(g, 0, sizeof(*g));
        char *bus = strtok_r(NULL, " \t\n", &save), *sm = strtok_r(NULL, " \t\n", &save);
        char *mem = strtok_r(NULL, " \t\n", &save), *uuid = strtok_r(NULL, " \t\n", &save);
        char *name = strtok_r(NULL, "\n", &save);
        if (bus == NULL || sm == NULL || mem == NULL || uuid == NULL || name == NULL ||
            sscanf(sm, "%d.%d", &g->major, &g->minor) != 2)
            return -1;
        snprintf(g->bus_id, sizeof(g->bus_id), "%s", bus);
        g->memory = strtoull(mem, NULL, 10);
        snprintf(g->uuid, sizeof(g->uuid), "%s", uuid);
        snprintf(g->name, sizeof(g->name), "%s", name);
        ngpus++;
        return 0;
    }
    if (strcmp(word, "nvlink") == 0) {
        char *gi = strtok_r(NULL, " \t\n", &save), *range = strtok_r(NULL, " \t\n", &save);
        char *type = strtok_r(NULL, " \t\n", &save), *remote = strtok_r(NULL, " \t\n", &save);
        char *version = strtok_r(NULL, " \t\n", &save);
        int g, first, last, t;
        if (gi == NULL || range == NULL || type == NULL || remote == NULL || version == NULL)
            return -1;
        g = atoi(gi);
        if (g < 0 || g >= ngpus || sscanf(range, "%d-%d", &first, &last) != 2 || first < 0 || last >= MAX_LINKS ||
            first > last)
            return -1;
        if (strcmp(type, "gpu") == 0)
            t = 0;
        else if (strcmp(type, "cpu") == 0)
            t = 1;
        else if (strcmp(type, "switch") == 0)
            t = 2;
        else if (strcmp(type, "unknown") == 0)
            t = 0xff;
        else
            return -1;
        for (int l = first; l <= last; l++) {
            struct link *k = &gpus[g].links[l];
            k->is_active = 1;
            k->type = t;
            snprintf(k->remote, sizeof(k->remote), "%s", strcmp(remote, "-") == 0 ? "" : remote);
            k->version = (unsigned)atoi(version);
        }
        return 0;
    }
    if (strcmp(word, "c2c") == 0) {
        char *gi = strtok_r(NULL, " \t\n", &save), *count = strtok_r(NULL, " \t\n", &save);
        char *mbps = strtok_r(NULL, " \t\n", &save);
        if (gi == NULL || count == NULL || mbps == NULL || atoi(gi) < 0 || atoi(gi) >= ngpus)
            return -1;
        gpus[atoi(gi)].c2c_count = atoi(count);
        gpus[atoi(gi)].c2c_mbps = (unsigned)atoi(mbps);
        return 0;
    }
    if (strcmp(word, "fail") == 0) {
        char *fn = strtok_r(NULL, " \t\n", &save);
        if (fn == NULL || nfailing == MAX_FAIL)
            return -1;
        snprintf(failing[nfailing++], sizeof(failing[0]), "%s", fn);
        return 0;
    }
    return -1;
}

static int load(void)
{
    const char *path = getenv("PLAIT_FAKE_NVML_CONFIG");
    char line[512];
    ngpus = 0;
    nfailing = 0;
    if (path == NULL)
        return ERR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return ERR_DRIVER_NOT_LOADED;
    int bad = 0;
    while (!bad && fgets(line, sizeof(line), f) != NULL)
        bad = parse_line(line) != 0;
    fclose(f);
    return bad ? ERR_UNKNOWN : OK;
}

/* The device handle is a pointer to its gpus[] entry. */
static struct gpu *dev(void *h)
{
    struct gpu *g = h;
    return is_initialized && g >= gpus && g < gpus + ngpus ? g : NULL;
}

static void fill_pci(struct pci_info *p, const char *bus_id, unsigned ids)
{
    unsigned dom = 0, bus = 0, device = 0, fn = 0;
    memset(p, 0, sizeof(*p));
    snprintf(p->bus_id, sizeof(p->bus_id), "%s", bus_id);
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &device, &fn) == 4) {
        p->domain = dom;
        p->bus = bus;
        p->device = device;
        snprintf(p->bus_id_legacy, sizeof(p->bus_id_legacy), "%04X:%02X:%02X.0", dom & 0xffff, bus, device);
    }
    p->pci_device_id = ids;
}

int nvmlInit_v2(void)
{
    int r = load();
    if (r == OK && fails("nvmlInit_v2"))
        r = ERR_UNKNOWN;
    is_initialized = r == OK;
    return r;
}

int nvmlShutdown(void)
{
    if (!is_initialized)
        return ERR_UNINITIALIZED;
    is_initialized = 0;
    return OK;
}

int nvmlDeviceGetCount_v2(unsigned *count)
{
    if (!is_initialized)
        return ERR_UNINITIALIZED;
    if (count == NULL)
        return ERR_INVALID_ARGUMENT;
    if (fails("nvmlDeviceGetCount_v2"))
        return ERR_UNKNOWN;
    *count = (unsigned)ngpus;
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle)
{
    if (!is_initialized)
        return ERR_UNINITIALIZED;
    if (handle == NULL || index >= (unsigned)ngpus)
        return ERR_INVALID_ARGUMENT;
    if (fails("nvmlDeviceGetHandleByIndex_v2"))
        return ERR_UNKNOWN;
    *handle = &gpus[index];
    return OK;
}

int nvmlDeviceGetPciInfo_v3(void *h, struct pci_info *pci)
{
    struct gpu *g = dev(h);
    if (g == NULL || pci == NULL)
        return ERR_INVALID_ARGUMENT;
    if (fails("nvmlDeviceGetPciInfo_v3"))
        return ERR_UNKNOWN;
    fill_pci(pci, g->bus_id, 0x233010de);
    return OK;
}

static int copy_string(char *out, unsigned length, const char *s)
{
    if (out == NULL)
        return ERR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return ERR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return OK;
}

int nvmlDeviceGetName(void *h, char *name, unsigned length)
{
    struct gpu *g = dev(h);
    if (g == NULL)
        return ERR_INVALID_ARGUMENT;
    return fails("nvmlDeviceGetName") ? ERR_UNKNOWN : copy_string(name, length, g->name);
}

int nvmlDeviceGetUUID(void *h, char *uuid, unsigned length)
{
    struct gpu *g = dev(h);
    if (g == NULL)
        return ERR_INVALID_ARGUMENT;
    return fails("nvmlDeviceGetUUID") ? ERR_UNKNOWN : copy_string(uuid, length, g->uuid);
}

int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor)
{
    struct gpu *g = dev(h);
    if (g == NULL || major == NULL || minor == NULL)
        return ERR_INVALID_ARGUMENT;
    if (fails("nvmlDeviceGetCudaComputeCapability"))
        return ERR_UNKNOWN;
    *major = g->major;
    *minor = g->minor;
    return OK;
}

int nvmlDeviceGetMemoryInfo(void *h, struct memory *m)
{
    struct gpu *g = dev(h);
    if (g == NULL || m == NULL)
        return ERR_INVALID_ARGUMENT;
    if (fails("nvmlDeviceGetMemoryInfo"))
        return ERR_UNKNOWN;
    m->total = g->memory;
    m->free = g->memory;
    m->used = 0;
    return OK;
}

static struct link *link_of(void *h, unsigned l)
{
    struct gpu *g = dev(h);
    return g != NULL && l < MAX_LINKS ? &g->links[l] : NULL;
}

int nvmlDeviceGetNvLinkState(void *h, unsigned l, int *is_active)
{
    struct link *k = link_of(h, l);
    if (k == NULL || is_active == NULL)
        return ERR_INVALID_ARGUMENT;
    if (fails("nvmlDeviceGetNvLinkState"))
        return ERR_UNKNOWN;
    *is_active = k->is_active;
    return OK;
}

int nvmlDeviceGetNvLinkVersion(void *h, unsigned l, unsigned *version)
{
    struct link *k = link_of(h, l);
    if (k == NULL || version == NULL)
        return ERR_INVALID_ARGUMENT;
    if (!k->is_active || fails("nvmlDeviceGetNvLinkVersion"))
        return ERR_NOT_SUPPORTED;
    *version = k->version;
    return OK;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(void *h, unsigned l, struct pci_info *pci)
{
    struct link *k = link_of(h, l);
    if (k == NULL || pci == NULL)
        return ERR_INVALID_ARGUMENT;
    if (!k->is_active || fails("nvmlDeviceGetNvLinkRemotePciInfo_v2"))
        return ERR_NOT_SUPPORTED;
    fill_pci(pci, k->remote, 0);
    return OK;
}

int nvmlDeviceGetNvLinkRemoteDeviceType(void *h, unsigned l, int *type)
{
    struct link *k = link_of(h, l);
    if (k == NULL || type == NULL)
        return ERR_INVALID_ARGUMENT;
    if (!k->is_active || fails("nvmlDeviceGetNvLinkRemoteDeviceType"))
        return ERR_NOT_SUPPORTED;
    *type = k->type;
    return OK;
}

int nvmlDeviceGetC2cModeInfoV(void *h, struct c2c_mode *mode)
{
    struct gpu *g = dev(h);
    if (g == NULL || mode == NULL)
        return ERR_INVALID_ARGUMENT;
    if (fails("nvmlDeviceGetC2cModeInfoV"))
        return ERR_UNKNOWN;
    mode->is_c2c_enabled = g->c2c_count > 0;
    return OK;
}

/* Fields 170 (C2C link count), 171 (a link's status) and 172 (its MB/s). */
int nvmlDeviceGetFieldValues(void *h, int count, struct field_value *v)
{
    struct gpu *g = dev(h);
    if (g == NULL || v == NULL || count < 0)
        return ERR_INVALID_ARGUMENT;
    if (fails("nvmlDeviceGetFieldValues"))
        return ERR_UNKNOWN;
    for (int i = 0; i < count; i++) {
        v[i].value_type = 1; /* unsigned int */
        v[i].ret = OK;
        switch (v[i].field_id) {
        case 170: v[i].value.ui = (unsigned)g->c2c_count; break;
        case 171: v[i].value.ui = v[i].scope_id < (unsigned)g->c2c_count; break;
        case 172: v[i].value.ui = v[i].scope_id < (unsigned)g->c2c_count ? g->c2c_mbps : 0; break;
        default: v[i].ret = ERR_NOT_SUPPORTED; break;
        }
    }
    return OK;
}
