/* Topology discovery (topology/discover.c, hwloc.c, sysfs.c, nvml.c) on
 * machines we don't have, from recorded fixtures in tests/fixtures/:
 *   vm        hwloc/vm.xml (lstopo --of xml on the 2-core development VM) and
 *             sysfs/vm (its /sys/class/net): one CPU node, one virtio NIC
 *   dgx-h100  hwloc/dgx-h100.xml, sysfs/dgx-h100, nvml/dgx-h100.conf, written
 *             from NVIDIA's published DGX H100 figures (hwloc/make_dgx_h100.py)
 *   garbage   sysfs/garbage: wrong values that must be ignored (its README)
 *   c2c-pair  nvml/c2c-pair.conf: NVLink GPU-GPU and GPU-CPU, and C2C
 * and on the live machine. The environment (tests/meson.build) gives
 * PLAIT_TEST_FIXTURES and PLAIT_TEST_FAKE_NVML (tests/fake_nvml.c, built). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "topology/discover.h"
#include "base/log.h"
#include "topology/topo.h"
#include "topology/xml_internal.h"

#define NO_NVML "/nonexistent/libnvidia-ml.so.1"

static const char *fixture(const char *rel)
{
    static char paths[8][1024];
    static int next;
    const char *root = getenv("PLAIT_TEST_FIXTURES");
    cr_assert(root != NULL && *root, "PLAIT_TEST_FIXTURES is not set (run through meson test)");
    char *p = paths[next++ % 8];
    snprintf(p, sizeof(paths[0]), "%s/%s", root, rel);
    return p;
}

static const char *fake_nvml(const char *conf)
{
    const char *lib = getenv("PLAIT_TEST_FAKE_NVML");
    cr_assert(lib != NULL && *lib, "PLAIT_TEST_FAKE_NVML is not set (run through meson test)");
    setenv("PLAIT_FAKE_NVML_CONFIG", fixture(conf), 1);
    return lib;
}

/* ---- the log, to check what discovery says at INFO ---- */

static char log_path[256];

static void log_start(void)
{
    snprintf(log_path, sizeof(log_path), "/tmp/plait-test-discover-%d.log", (int)getpid());
    unlink(log_path);
    setenv("PLAIT_DEBUG", "INFO", 1);
    setenv("PLAIT_DEBUG_SUBSYS", "INIT", 1);
    setenv("PLAIT_DEBUG_FILE", log_path, 1);
    plait_log_configure();
}

/* Stops logging and returns what was logged (malloc'd, "" if nothing). */
static char *log_stop(void)
{
    unsetenv("PLAIT_DEBUG");
    unsetenv("PLAIT_DEBUG_FILE");
    plait_log_configure();
    char *text = calloc(1, 65536);
    cr_assert_not_null(text);
    FILE *f = fopen(log_path, "r");
    if (f != NULL) {
        size_t n = fread(text, 1, 65535, f);
        text[n] = '\0';
        fclose(f);
    }
    unlink(log_path);
    return text;
}

/* ---- graph helpers ---- */

static const struct plait_topo_node *nth(const struct plait_topo *t, enum plait_topo_node_type type, int i)
{
    int n = plait_topo_nth(t, type, i);
    cr_assert(n >= 0, "no %s node %d", plait_topo_node_type_name(type), i);
    return &t->nodes[n];
}

/* The link of `type` between nodes a and b, or NULL. */
static const struct plait_topo_link *link_between(const struct plait_topo *t, int a, int b,
                                                   enum plait_topo_link_type type)
{
    for (int i = 0; i < t->nlinks; i++) {
        const struct plait_topo_link *l = &t->links[i];
        if (l->type == type && ((l->a == a && l->b == b) || (l->a == b && l->b == a)))
            return l;
    }
    return NULL;
}

/* The node a device hangs from: the other end of its only PCI link. */
static int pci_parent(const struct plait_topo *t, int dev)
{
    int found = -1, count = 0;
    for (int i = 0; i < t->nlinks; i++) {
        const struct plait_topo_link *l = &t->links[i];
        if (l->type == PLAIT_LINK_PCI && (l->a == dev || l->b == dev)) {
            found = l->a == dev ? l->b : l->a;
            count++;
        }
    }
    cr_assert_eq(count, 1, "%s has %d PCI links, expected 1", t->nodes[dev].name, count);
    return found;
}

static int node_index(const struct plait_topo *t, const struct plait_topo_node *n)
{
    return (int)(n - t->nodes);
}

static plait_result_t discover(const char *sysfs, const char *hwloc, const char *nvml_lib,
                               struct plait_topo **topo_out)
{
    struct plait_topo_discover_opts opts = {
        .fsroot = sysfs ? fixture(sysfs) : NULL,
        .hwloc_xml = hwloc ? fixture(hwloc) : NULL,
        .nvml_lib = nvml_lib,
    };
    return plait_topo_discover(&opts, topo_out);
}

/* ---- (a) the development VM ---- */

Test(discover, vm_recorded)
{
    struct plait_topo *t = NULL;
    log_start();
    plait_result_t r = discover("sysfs/vm", "hwloc/vm.xml", NO_NVML, &t);
    char *log = log_stop();
    cr_assert_eq(r, PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(plait_topo_validate(t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_str_eq(t->host, "vm");
    cr_expect_str_eq(t->source, "discovered");
    cr_assert_eq(t->counts[PLAIT_TOPO_CPU], 1);
    cr_expect_eq(t->counts[PLAIT_TOPO_GPU], 0);
    cr_expect_eq(t->counts[PLAIT_TOPO_PCI], 0);
    cr_expect_eq(t->counts[PLAIT_TOPO_NVS], 0);
    const struct plait_topo_node *cpu = nth(t, PLAIT_TOPO_CPU, 0);
    cr_expect_eq(cpu->cpu.ncores, 2);
    cr_expect_eq(cpu->cpu.package, 0);
    cr_expect_eq(cpu->cpu.memory, 25276059648ULL);
    cr_expect_str_eq(cpu->cpu.cpuset, "0-1");
    cr_expect_str_eq(cpu->cpu.arch, "x86_64");
    cr_expect_str_eq(cpu->cpu.vendor, "AuthenticAMD");
    cr_expect_str_eq(cpu->cpu.model, "AMD EPYC");
    cr_expect_eq(cpu->numa, 0);
    /* eth0 only: lo is loopback, ifb0/ifb1 have no device (and are down). */
    cr_assert_eq(t->counts[PLAIT_TOPO_NIC], 1);
    const struct plait_topo_node *nic = nth(t, PLAIT_TOPO_NIC, 0);
    cr_expect_str_eq(nic->nic.dev, "eth0");
    cr_expect_str_eq(nic->nic.netdev, "eth0");
    cr_expect(nic->nic.is_virtual, "virtio_net must be marked virtual");
    cr_expect_eq(nic->nic.link_layer, PLAIT_LINK_LAYER_ETHERNET);
    cr_expect_eq(nic->nic.speed, 0.0, "speed -1 is unknown");
    cr_expect(!nic->nic.has_gdr);
    cr_expect_eq(nic->busid, PLAIT_TOPO_NO_BUSID, "virtio's uevent names no PCI slot");
    cr_expect_eq(nic->numa, 0);
    cr_expect_eq(pci_parent(t, node_index(t, nic)), node_index(t, cpu));
    cr_expect(strstr(log, "topology: no NVML (") != NULL, "log: %s", log);
    cr_expect(strstr(log, "GPU attributes from PCI only") != NULL, "log: %s", log);
    cr_expect(strstr(log, " WARN ") == NULL, "a degraded source must not WARN: %s", log);
    free(log);
    plait_topo_free(t);
}

/* ---- (b) a DGX H100 ---- */

static const unsigned dgx_nic_bus[8] = {0x18, 0x40, 0x4f, 0x5e, 0x9a, 0xc0, 0xce, 0xdc};
static const unsigned dgx_gpu_bus[8] = {0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf};
static const char *const dgx_nic_dev[8] = {"mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5",
                                           "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"};

static uint64_t busid(unsigned bus) { return (uint64_t)bus << 12; }

Test(discover, dgx_h100)
{
    struct plait_topo *t = NULL;
    plait_result_t r = discover("sysfs/dgx-h100", "hwloc/dgx-h100.xml", fake_nvml("nvml/dgx-h100.conf"), &t);
    cr_assert_eq(r, PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(plait_topo_validate(t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_str_eq(t->host, "dgx-h100");
    cr_assert_eq(t->counts[PLAIT_TOPO_CPU], 2);
    cr_assert_eq(t->counts[PLAIT_TOPO_GPU], 8, "the NVSwitches (class 0680) are not GPUs");
    cr_assert_eq(t->counts[PLAIT_TOPO_NIC], 8);
    cr_assert_eq(t->counts[PLAIT_TOPO_NVS], 1);
    cr_assert_eq(t->counts[PLAIT_TOPO_PCI], 8, "one node per switch; root ports, host bridges and NVMe left out");

    static const char *const cpusets[2] = {"0-55,112-167", "56-111,168-223"};
    for (int c = 0; c < 2; c++) {
        const struct plait_topo_node *cpu = nth(t, PLAIT_TOPO_CPU, c);
        cr_expect_eq(cpu->cpu.ncores, 56);
        cr_expect_eq(cpu->cpu.package, c);
        cr_expect_eq(cpu->cpu.memory, 1ULL << 40);
        cr_expect_str_eq(cpu->cpu.cpuset, cpusets[c]);
        cr_expect_str_eq(cpu->cpu.vendor, "GenuineIntel");
        cr_expect_str_eq(cpu->cpu.model, "Intel(R) Xeon(R) Platinum 8480C");
    }
    const struct plait_topo_link *sys =
        link_between(t, plait_topo_nth(t, PLAIT_TOPO_CPU, 0), plait_topo_nth(t, PLAIT_TOPO_CPU, 1), PLAIT_LINK_SYS);
    cr_assert_not_null(sys);
    cr_expect_eq(sys->bw, PLAIT_TOPO_SYS_BW, "two packages: the inter-socket figure");

    const struct plait_topo_node *nvs = nth(t, PLAIT_TOPO_NVS, 0);
    cr_expect_eq(nvs->nvs.count, 4, "four NVSwitch chips merged into one node");
    for (int i = 0; i < 8; i++) {
        const struct plait_topo_node *g = nth(t, PLAIT_TOPO_GPU, i);
        const struct plait_topo_node *n = nth(t, PLAIT_TOPO_NIC, i);
        int gi = node_index(t, g), ni = node_index(t, n);
        cr_expect_eq(g->busid, busid(dgx_gpu_bus[i]), "GPU %d", i);
        cr_expect_eq(g->gpu.dev, i);
        cr_expect_eq(g->gpu.sm, 90);
        cr_expect_str_eq(g->gpu.model, "NVIDIA H100 80GB HBM3");
        cr_expect_eq(g->gpu.memory, 85520809984ULL);
        cr_expect_eq(g->gpu.nvlinks, 18);
        cr_expect_eq(g->gpu.nvlink_version, 4, "NVML's 6 is NVLink 4.0");
        cr_expect(strncmp(g->gpu.uuid, "GPU-8c1fd7a2-", 13) == 0, "uuid %s", g->gpu.uuid);
        cr_expect_eq(g->numa, i < 4 ? 0 : 1);
        cr_expect_eq(g->pci.gen, 5);
        cr_expect_eq(g->pci.width, 16);
        cr_expect_eq(g->pci.vendor, 0x10de);
        const struct plait_topo_link *nvl = link_between(t, gi, node_index(t, nvs), PLAIT_LINK_NVL);
        cr_assert_not_null(nvl, "GPU %d has no NVLink to the NVSwitch node", i);
        cr_expect_eq(nvl->lanes, 18);
        cr_expect_eq(nvl->bw, 18 * 25.0);
        for (int j = 0; j < 8; j++)
            cr_expect_null(link_between(t, gi, plait_topo_nth(t, PLAIT_TOPO_GPU, j), PLAIT_LINK_NVL));

        cr_expect_str_eq(n->nic.dev, dgx_nic_dev[i]);
        char netdev[16];
        snprintf(netdev, sizeof(netdev), "ibp%us0", dgx_nic_bus[i]);
        cr_expect_str_eq(n->nic.netdev, netdev);
        cr_expect_eq(n->nic.port, 1);
        cr_expect_eq(n->nic.speed, 400.0);
        cr_expect_eq(n->nic.link_layer, PLAIT_LINK_LAYER_IB);
        cr_expect(n->nic.has_gdr, "nvidia_peermem is loaded");
        cr_expect(!n->nic.is_virtual);
        cr_expect_eq(n->nic.guid, 0xa088c20300471000ULL + (uint64_t)i);
        cr_expect_eq(n->busid, busid(dgx_nic_bus[i]));
        cr_expect_eq(n->numa, i < 4 ? 0 : 1);

        /* The NIC and the GPU under one switch node, named by its upstream port,
         * which hangs from the right CPU node. */
        int sw = pci_parent(t, gi);
        cr_assert_eq(t->nodes[sw].type, PLAIT_TOPO_PCI);
        cr_expect_eq(pci_parent(t, ni), sw, "NIC %d is not under GPU %d's switch", i, i);
        cr_expect_eq(t->nodes[sw].pci.kind, PLAIT_PCI_SWITCH);
        cr_expect_eq(t->nodes[sw].busid, busid(dgx_nic_bus[i] - 2));
        cr_expect_eq(t->nodes[sw].pci.gen, 5);
        cr_expect_eq(t->nodes[sw].pci.width, 16);
        cr_expect_eq(t->nodes[sw].numa, i < 4 ? 0 : 1);
        const struct plait_topo_link *up =
            link_between(t, sw, plait_topo_nth(t, PLAIT_TOPO_CPU, i < 4 ? 0 : 1), PLAIT_LINK_PCI);
        cr_assert_not_null(up, "switch of GPU %d is not linked to its CPU", i);
        cr_expect(fabs(up->bw - plait_topo_pci_bw(5, 16)) < 1e-9);
        cr_expect_eq(up->lanes, 16);
    }
    plait_topo_free(t);
}

/* ---- (c) no NVML ---- */

Test(discover, dgx_h100_without_nvml)
{
    struct plait_topo *t = NULL;
    log_start();
    plait_last_error_clear();
    plait_result_t r = discover("sysfs/dgx-h100", "hwloc/dgx-h100.xml", NO_NVML, &t);
    char *log = log_stop();
    cr_assert_eq(r, PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_str_eq(plait_last_error_get(), "", "a missing NVML is not an error");
    cr_expect(strstr(log, "INFO INIT topology: no NVML (") != NULL, "log: %s", log);
    cr_expect(strstr(log, " WARN ") == NULL, "log: %s", log);
    cr_assert_eq(t->counts[PLAIT_TOPO_GPU], 8);
    cr_expect_eq(t->counts[PLAIT_TOPO_NVS], 0);
    for (int i = 0; i < 8; i++) {
        const struct plait_topo_node *g = nth(t, PLAIT_TOPO_GPU, i);
        cr_expect_eq(g->busid, busid(dgx_gpu_bus[i]));
        cr_expect_eq(g->gpu.dev, -1);
        cr_expect_eq(g->gpu.sm, 0);
        cr_expect_eq(g->gpu.nvlinks, 0);
        cr_expect_eq(g->pci.vendor, 0x10de);
        cr_expect_eq(g->pci.device, 0x2330);
        cr_expect_eq(g->numa, i < 4 ? 0 : 1);
    }
    cr_expect_eq(plait_topo_validate(t), PLAIT_SUCCESS);
    free(log);
    plait_topo_free(t);
}

Test(discover, nvml_init_fails)
{
    struct plait_topo *t = NULL;
    log_start();
    plait_result_t r = discover("sysfs/dgx-h100", "hwloc/dgx-h100.xml", fake_nvml("nvml/init-fails.conf"), &t);
    char *log = log_stop();
    cr_assert_eq(r, PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect(strstr(log, "topology: no NVML (nvmlInit_v2 failed") != NULL, "log: %s", log);
    cr_expect_eq(t->counts[PLAIT_TOPO_GPU], 8);
    cr_expect_eq(nth(t, PLAIT_TOPO_GPU, 0)->gpu.sm, 0);
    free(log);
    plait_topo_free(t);
}

Test(discover, no_nvml_option)
{
    struct plait_topo *t = NULL;
    struct plait_topo_discover_opts opts = {.fsroot = fixture("sysfs/dgx-h100"),
                                            .hwloc_xml = fixture("hwloc/dgx-h100.xml"),
                                            .nvml_lib = fake_nvml("nvml/dgx-h100.conf"),
                                            .no_nvml = true};
    cr_assert_eq(plait_topo_discover(&opts, &t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect_eq(t->counts[PLAIT_TOPO_GPU], 8);
    cr_expect_eq(t->counts[PLAIT_TOPO_NVS], 0, "no_nvml must not load NVML");
    plait_topo_free(t);
}

/* ---- NVLink to a GPU and to a CPU, C2C ---- */

Test(discover, nvlink_gpu_cpu_and_c2c)
{
    struct plait_topo *t = NULL;
    plait_result_t r = discover("sysfs/vm", "hwloc/vm.xml", fake_nvml("nvml/c2c-pair.conf"), &t);
    cr_assert_eq(r, PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(plait_topo_validate(t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(t->counts[PLAIT_TOPO_GPU], 2, "GPUs NVML reports and hwloc did not see are added");
    cr_expect_eq(t->counts[PLAIT_TOPO_NVS], 0);
    int g0 = plait_topo_nth(t, PLAIT_TOPO_GPU, 0), g1 = plait_topo_nth(t, PLAIT_TOPO_GPU, 1);
    int cpu = plait_topo_nth(t, PLAIT_TOPO_CPU, 0);
    cr_expect_eq(t->nodes[g0].busid, busid(0x01));
    cr_expect_eq(t->nodes[g1].gpu.sm, 80);
    cr_expect_eq(t->nodes[g0].gpu.nvlink_version, 3, "NVML's 4 is NVLink 3.0");
    cr_expect_eq(t->nodes[g1].gpu.nvlinks, 6);
    cr_expect_eq(pci_parent(t, g0), cpu);
    const struct plait_topo_link *nvl = link_between(t, g0, g1, PLAIT_LINK_NVL);
    cr_assert_not_null(nvl);
    cr_expect_eq(nvl->lanes, 4);
    int nvl_pairs = 0;
    for (int i = 0; i < t->nlinks; i++)
        nvl_pairs += t->links[i].type == PLAIT_LINK_NVL && (t->links[i].a == g0 || t->links[i].b == g0);
    cr_expect_eq(nvl_pairs, 1, "one link per GPU pair, not one per direction");
    const struct plait_topo_link *npu = link_between(t, g1, cpu, PLAIT_LINK_NVL);
    cr_assert_not_null(npu);
    cr_expect_eq(npu->lanes, 2);
    const struct plait_topo_link *c2c = link_between(t, g0, cpu, PLAIT_LINK_C2C);
    cr_assert_not_null(c2c);
    cr_expect_eq(c2c->lanes, 10);
    cr_expect(fabs(c2c->bw - 450.0) < 1e-9, "10 links x 45000 MB/s: %g", c2c->bw);
    cr_expect_null(link_between(t, g1, cpu, PLAIT_LINK_C2C));
    plait_topo_free(t);
}

/* ---- (d) garbage in /sys ---- */

Test(discover, garbage_sysfs)
{
    struct plait_topo *t = NULL;
    plait_result_t r = discover("sysfs/garbage", "hwloc/dgx-h100.xml", NO_NVML, &t);
    cr_assert_eq(r, PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(plait_topo_validate(t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(t->counts[PLAIT_TOPO_NIC], 4, "see tests/fixtures/sysfs/garbage/README");

    const struct plait_topo_node *n0 = nth(t, PLAIT_TOPO_NIC, 0);
    cr_expect_str_eq(n0->nic.dev, "mlx5_0");
    cr_expect_eq(n0->nic.speed, 0.0, "rate \"abc\"");
    cr_expect_eq(n0->nic.guid, 0ULL);
    cr_expect_eq(n0->nic.link_layer, PLAIT_LINK_LAYER_IB);
    cr_expect(!n0->nic.has_gdr, "no peer-memory module in this tree");
    cr_expect_eq(n0->busid, busid(0x18));
    cr_expect_eq(n0->numa, 0, "numa_node 99999 ignored, NUMA from hwloc");
    cr_expect_eq(t->nodes[pci_parent(t, node_index(t, n0))].busid, busid(0x16));

    const struct plait_topo_node *n1 = nth(t, PLAIT_TOPO_NIC, 1);
    cr_expect_str_eq(n1->nic.dev, "mlx5_1");
    cr_expect_eq(n1->busid, PLAIT_TOPO_NO_BUSID, "no uevent");
    cr_expect_eq(n1->numa, 1);
    cr_expect(!n1->nic.is_virtual, "a device without a readable uevent is not known to be virtual");
    cr_expect_eq(n1->nic.speed, 200.0);
    cr_expect_eq(n1->nic.link_layer, PLAIT_LINK_LAYER_ETHERNET);
    cr_expect_eq(pci_parent(t, node_index(t, n1)), plait_topo_nth(t, PLAIT_TOPO_CPU, 1));

    const struct plait_topo_node *n2 = nth(t, PLAIT_TOPO_NIC, 2);
    cr_expect_str_eq(n2->nic.dev, "mlx5_3");
    cr_expect_eq(n2->nic.speed, 0.0, "rate 1e999");
    cr_expect_eq(n2->nic.link_layer, PLAIT_LINK_LAYER_UNKNOWN);
    cr_expect_eq(n2->busid, busid(0x40));
    cr_expect_eq(n2->numa, 0);

    const struct plait_topo_node *n3 = nth(t, PLAIT_TOPO_NIC, 3);
    cr_expect_str_eq(n3->nic.dev, "eth9");
    cr_expect_eq(n3->nic.speed, 0.0, "speed \"fast\"");
    cr_expect_eq(n3->busid, PLAIT_TOPO_NO_BUSID, "a 5000-byte uevent is not read");
    cr_expect(!n3->nic.is_virtual);
    cr_expect_eq(n3->numa, 0);
    plait_topo_free(t);
}

/* ---- hwloc unavailable: one CPU node from sysconf and /proc ---- */

Test(discover, hwloc_fallback)
{
    struct plait_topo *t = NULL;
    /* hwloc's component list "stop" ends discovery before any component ran:
     * its load of this machine fails, as it may in a locked-down container. */
    setenv("HWLOC_COMPONENTS", "stop", 1);
    log_start();
    plait_result_t r = discover("sysfs/vm", NULL, NO_NVML, &t);
    char *log = log_stop();
    cr_assert_eq(r, PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_expect(strstr(log, "one CPU node from sysconf and /proc instead") != NULL, "log: %s", log);
    cr_assert_eq(t->counts[PLAIT_TOPO_CPU], 1);
    cr_expect_eq(t->counts[PLAIT_TOPO_PCI], 0);
    cr_expect(nth(t, PLAIT_TOPO_CPU, 0)->cpu.ncores > 0);
    cr_expect_eq(t->counts[PLAIT_TOPO_NIC], 1, "sysfs still read");
    cr_expect_eq(nth(t, PLAIT_TOPO_NIC, 0)->numa, 0);
    cr_expect_eq(plait_topo_validate(t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    free(log);
    plait_topo_free(t);
}

/* ---- hwloc XML files, whatever parser hwloc has ----
 * hwloc reads XML with libxml2 only where its plugin is installed (Debian:
 * libhwloc-plugins); without it, or with HWLOC_LIBXML_IMPORT=0, its minimal
 * parser reads only files laid out exactly as hwloc writes them (no comment,
 * one attribute separator, double quotes). plait hands hwloc a rewritten copy,
 * so that both parsers read the same files. */

static char *read_whole(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert(n > 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* A file with `text`, unique to this process; returns its path (static). */
static const char *write_temp(const char *tag, const char *text)
{
    static char path[8][256];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, sizeof(path[0]), "/tmp/plait-test-hwloc-%s-%d.xml", tag, (int)getpid());
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s: %s", p, strerror(errno));
    cr_assert_eq(fputs(text, f) >= 0, true);
    cr_assert_eq(fclose(f), 0);
    return p;
}

static plait_result_t discover_file(const char *sysfs, const char *xml_path, struct plait_topo **topo_out)
{
    struct plait_topo_discover_opts opts = {.fsroot = fixture(sysfs), .hwloc_xml = xml_path, .nvml_lib = NO_NVML};
    return plait_topo_discover(&opts, topo_out);
}

/* The same document as a person or another tool might write it: CRLF line
 * ends, a DOCTYPE with an internal subset, comments and a processing
 * instruction (inside and around the root), attributes on lines of their own
 * and in single quotes, white space around '=' and before "/>", predefined
 * entities where plain characters would do. libxml2 reads every one of these
 * as the original. */
static char *mangle(const char *xml)
{
    size_t n = strlen(xml);
    size_t cap = n * 4 + 1024;
    char *out = malloc(cap);
    cr_assert_not_null(out);
    size_t o = 0;
    int line = 0;
    bool in_tag = false, in_value = false;
    const char *decl_end = strstr(xml, "?>");
    cr_assert_not_null(decl_end);
    size_t head = (size_t)(decl_end + 2 - xml);
    memcpy(out, xml, head);
    o = head;
    o += (size_t)sprintf(out + o, "\r\n<!-- a comment before the DOCTYPE -->\r\n"
                                  "<!DOCTYPE topology [\r\n  <!ELEMENT topology ANY> <!-- ']>' -->\r\n]>\r\n"
                                  "<?plait an instruction?>\r\n");
    for (size_t i = head; i < n; i++) {
        char c = xml[i];
        cr_assert(o + 64 < cap);
        if (in_value) {
            if (c == '"') {
                out[o++] = '\'';
                in_value = false;
            } else if (c == 'x' && i > 0 && xml[i - 1] == '0') {
                o += (size_t)sprintf(out + o, "&#x78;"); /* "0x" */
            } else {
                out[o++] = c;
            }
            continue;
        }
        if (in_tag && c == '"') {
            out[o++] = '\'';
            in_value = true;
            continue;
        }
        if (in_tag && c == ' ') {
            o += (size_t)sprintf(out + o, "\r\n\t  ");
            continue;
        }
        if (in_tag && c == '=') {
            o += (size_t)sprintf(out + o, " = ");
            continue;
        }
        if (in_tag && c == '/' && xml[i + 1] == '>') {
            o += (size_t)sprintf(out + o, " />");
            i++;
            in_tag = false;
            continue;
        }
        if (c == '<' && xml[i + 1] != '/')
            in_tag = true;
        if (c == '>')
            in_tag = false;
        if (c == '\n') {
            if (line++ % 7 == 3)
                o += (size_t)sprintf(out + o, "\r\n<!-- line %d -->\r\n", line);
            else
                o += (size_t)sprintf(out + o, "\r\n");
            if (line % 11 == 5)
                o += (size_t)sprintf(out + o, "<?plait pi %d?>\r\n", line);
            continue;
        }
        out[o++] = c;
    }
    o += (size_t)sprintf(out + o, "<!-- after the root -->\r\n");
    out[o] = '\0';
    return out;
}

/* The fixtures, and a rewritten copy of each, read by hwloc's minimal parser:
 * the same graph as the fixture read as it is. */
Test(discover, minimal_xml_parser)
{
    static const char *const machines[][2] = {{"hwloc/vm.xml", "sysfs/vm"}, {"hwloc/dgx-h100.xml", "sysfs/dgx-h100"}};
    setenv("HWLOC_LIBXML_IMPORT", "0", 1);
    for (size_t m = 0; m < sizeof(machines) / sizeof(machines[0]); m++) {
        struct plait_topo *plain = NULL, *mangled = NULL;
        plait_result_t r = discover_file(machines[m][1], fixture(machines[m][0]), &plain);
        cr_assert_eq(r, PLAIT_SUCCESS, "%s with HWLOC_LIBXML_IMPORT=0: %s", machines[m][0], plait_last_error_get());
        char *orig = read_whole(fixture(machines[m][0]));
        char *text = mangle(orig);
        const char *path = write_temp(m == 0 ? "vm" : "dgx", text);
        r = discover_file(machines[m][1], path, &mangled);
        unlink(path);
        cr_assert_eq(r, PLAIT_SUCCESS, "rewritten %s with HWLOC_LIBXML_IMPORT=0: %s", machines[m][0],
                     plait_last_error_get());
        char why[256] = "";
        cr_expect(plait_topo_xml_equal(plain, mangled, why, sizeof(why)), "%s: %s", machines[m][0], why);
        free(text);
        free(orig);
        plait_topo_free(plain);
        plait_topo_free(mangled);
    }
    /* The DGX's numbers, as dgx_h100 checks them with hwloc's default parser. */
    struct plait_topo *t = NULL;
    cr_assert_eq(discover_file("sysfs/dgx-h100", fixture("hwloc/dgx-h100.xml"), &t), PLAIT_SUCCESS, "%s",
                 plait_last_error_get());
    cr_expect_str_eq(t->host, "dgx-h100");
    cr_expect_eq(t->counts[PLAIT_TOPO_CPU], 2);
    cr_expect_eq(t->counts[PLAIT_TOPO_GPU], 8);
    cr_expect_eq(t->counts[PLAIT_TOPO_NIC], 8);
    cr_expect_eq(t->counts[PLAIT_TOPO_PCI], 8);
    plait_topo_free(t);
}

/* The same rewritten copies with hwloc's default parser (libxml2 where
 * libhwloc-plugins is installed): still the fixture's graph. */
Test(discover, rewritten_xml_default_parser)
{
    unsetenv("HWLOC_LIBXML_IMPORT");
    struct plait_topo *plain = NULL, *mangled = NULL;
    cr_assert_eq(discover_file("sysfs/dgx-h100", fixture("hwloc/dgx-h100.xml"), &plain), PLAIT_SUCCESS, "%s",
                 plait_last_error_get());
    cr_assert_eq(plain->counts[PLAIT_TOPO_CPU], 2, "%s read as it is", fixture("hwloc/dgx-h100.xml"));
    cr_assert_eq(plain->counts[PLAIT_TOPO_PCI], 8);
    char *orig = read_whole(fixture("hwloc/dgx-h100.xml"));
    char *text = mangle(orig);
    const char *path = write_temp("dgx-default", text);
    plait_result_t r = discover_file("sysfs/dgx-h100", path, &mangled);
    unlink(path);
    cr_assert_eq(r, PLAIT_SUCCESS, "%s", plait_last_error_get());
    char why[256] = "";
    cr_expect(plait_topo_xml_equal(plain, mangled, why, sizeof(why)), "%s", why);
    free(text);
    free(orig);
    plait_topo_free(plain);
    plait_topo_free(mangled);
}

/* A file hwloc cannot read is an error naming the file and why, never a
 * silent fallback to one CPU node (which made a DGX look like a laptop). */
Test(discover, hwloc_xml_errors)
{
    struct plait_topo *t = NULL;
    const char *missing = "/nonexistent/plait-hwloc.xml";
    cr_assert_neq(discover_file("sysfs/vm", missing, &t), PLAIT_SUCCESS);
    const char *e = plait_last_error_get();
    cr_expect(strstr(e, missing) != NULL && strstr(e, "No such file") != NULL, "error: %s", e);

    /* Well-formed XML that is no hwloc topology (an unknown object type):
     * the minimal parser's failure says what to install. */
    const char *path = write_temp("bogus", "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n"
                                           "  <object type=\"NoSuchType\" os_index=\"0\"/>\n</topology>\n");
    setenv("HWLOC_LIBXML_IMPORT", "0", 1);
    plait_result_t r = discover_file("sysfs/vm", path, &t);
    e = plait_last_error_get();
    cr_expect_neq(r, PLAIT_SUCCESS);
    cr_expect(strstr(e, path) != NULL, "error names the file: %s", e);
    cr_expect(strstr(e, "libhwloc-plugins") != NULL && strstr(e, "HWLOC_LIBXML_IMPORT") != NULL,
              "error says what to install: %s", e);

    /* Malformed XML: the line and the reason, from plait's own reading. */
    const char *bad = write_temp("bad", "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n"
                                        "  <object type=\"Machine\" os_index=\"0\n</topology>\n");
    r = discover_file("sysfs/vm", bad, &t);
    e = plait_last_error_get();
    cr_expect_neq(r, PLAIT_SUCCESS);
    cr_expect(strstr(e, bad) != NULL && strstr(e, ":3:") != NULL, "error names file and line: %s", e);
    unlink(path);
    unlink(bad);
}

/* ---- (e) this machine ---- */

/* Physical cores among the online CPUs, from /sys alone (not from hwloc). */
static int sysfs_cores(int *online_out)
{
    int cores = 0, online = 0;
    for (int c = 0; c < 65536; c++) {
        char path[128], buf[256];
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d", c);
            if (access(path, F_OK) != 0)
                break;
            continue; /* offline */
        }
        if (fgets(buf, sizeof(buf), f) != NULL) {
            online++;
            if (atoi(buf) == c)
                cores++;
        }
        fclose(f);
    }
    *online_out = online;
    return cores;
}

Test(discover, live_machine)
{
    struct plait_topo *t = NULL;
    cr_assert_eq(plait_topo_discover(NULL, &t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(plait_topo_validate(t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_geq(t->counts[PLAIT_TOPO_CPU], 1);
    int online, cores = sysfs_cores(&online), total = 0;
    long conf = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < t->counts[PLAIT_TOPO_CPU]; c++) {
        const struct plait_topo_node *cpu = nth(t, PLAIT_TOPO_CPU, c);
        cr_expect_gt(cpu->cpu.ncores, 0);
        cr_expect_neq(cpu->cpu.cpuset[0], '\0');
        total += cpu->cpu.ncores;
    }
    cr_expect_eq(online, conf, "sysfs and sysconf disagree on the online CPUs");
    cr_expect_eq(total, cores, "cores in the graph (%d) vs physical cores online (%d)", total, cores);
    if (cores == online) /* no SMT (this VM): a core is a CPU */
        cr_expect_eq(total, conf);
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    cr_expect(strncmp(t->host, host, sizeof(t->host) - 1) == 0);
    plait_topo_free(t);
}

/* Many discoveries: no state left behind (run under valgrind for leaks). */
Test(discover, repeated)
{
    for (int i = 0; i < 20; i++) {
        struct plait_topo *t = NULL;
        cr_assert_eq(discover("sysfs/dgx-h100", "hwloc/dgx-h100.xml", fake_nvml("nvml/dgx-h100.conf"), &t),
                     PLAIT_SUCCESS, "%s", plait_last_error_get());
        cr_assert_eq(t->counts[PLAIT_TOPO_GPU], 8);
        cr_assert_eq(t->counts[PLAIT_TOPO_NVS], 1);
        plait_topo_free(t);
    }
}

Test(discover, bad_arguments)
{
    struct plait_topo_discover_opts opts = {.fsroot = NULL};
    cr_expect_eq(plait_topo_discover(&opts, NULL), PLAIT_ERR_INVALID_ARGUMENT);
    char longroot[PATH_MAX + 10];
    memset(longroot, 'a', sizeof(longroot) - 1);
    longroot[sizeof(longroot) - 1] = '\0';
    opts.fsroot = longroot;
    struct plait_topo *t = NULL;
    cr_expect_eq(plait_topo_discover(&opts, &t), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_null(t, "topo_out is set only on success");
}

Test(discover, pcie_decode)
{
    static const struct {
        double gbps;
        int gen, width;
    } cases[] = {
        {63.015385, 5, 16}, {31.507692, 4, 16}, {15.753846, 3, 16}, {7.876923, 2, 16}, /* gen3 x8 reads as gen2 x16 */
        {3.938462, 1, 16}, {126.030769, 6, 16}, {0.25, 1, 1}, {0, 0, 0}, {-1, 0, 0}, {NAN, 0, 0}, {1000, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int gen = -1, width = -1;
        plait_disc_pcie_decode(cases[i].gbps, &gen, &width);
        cr_expect(gen == cases[i].gen && width == cases[i].width, "%g GB/s -> gen%d x%d, expected gen%d x%d",
                  cases[i].gbps, gen, width, cases[i].gen, cases[i].width);
        if (gen > 0)
            cr_expect(fabs(plait_topo_pci_bw(gen, width) - cases[i].gbps) <= 0.1 * cases[i].gbps);
    }
}
