/* Path classification, NIC affinity and channel search (topology/paths.c,
 * topology/search.c) on graphs built here, each figure derived by hand from
 * docs/topology.md ("Paths", "Channel search") in the comment beside it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "topology/topo.h"

/* ---------------------------------------------------------------- helpers */

static struct plait_topo *g;
static struct plait_topo_paths *P;

static void setup(void)
{
    g = NULL;
    P = NULL;
    cr_assert_eq(plait_topo_create(&g), PLAIT_SUCCESS);
}

static void teardown(void)
{
    plait_topo_paths_free(P);
    plait_topo_free(g);
}

TestSuite(topo_paths, .init = setup, .fini = teardown);

static int add(enum plait_topo_node_type t, const char *name)
{
    int i = plait_topo_add_node(g, t, name);
    cr_assert(i >= 0, "add_node %s: %s", name, plait_last_error_get());
    return i;
}

static int cpu(const char *name)
{
    int i = add(PLAIT_TOPO_CPU, name);
    g->nodes[i].numa = g->nodes[i].index;
    return i;
}

static int sw(const char *name, int numa)
{
    int i = add(PLAIT_TOPO_PCI, name);
    g->nodes[i].numa = numa;
    return i;
}

static int hostbridge(const char *name, int numa)
{
    int i = sw(name, numa);
    g->nodes[i].pci.kind = PLAIT_PCI_HOST_BRIDGE;
    return i;
}

static int gpu(const char *name, int numa)
{
    int i = add(PLAIT_TOPO_GPU, name);
    g->nodes[i].numa = numa;
    g->nodes[i].gpu.sm = 90;
    return i;
}

static int nic(const char *name, int numa, double speed, bool gdr)
{
    int i = add(PLAIT_TOPO_NIC, name);
    g->nodes[i].numa = numa;
    g->nodes[i].nic.speed = speed;
    g->nodes[i].nic.has_gdr = gdr;
    return i;
}

static void link(int a, int b, enum plait_topo_link_type t, int lanes, double bw)
{
    cr_assert_eq(plait_topo_add_link(g, a, b, t, lanes, bw, 0), PLAIT_SUCCESS, "%s", plait_last_error_get());
}

static void pci(int a, int b, double bw) { link(a, b, PLAIT_LINK_PCI, 16, bw); }

static void compute(void)
{
    cr_assert_eq(plait_topo_validate(g), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(plait_topo_paths_compute(g, &P), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(P->n, g->nnodes);
}

static const struct plait_topo_path *path(int a, int b) { return plait_topo_path(P, a, b); }

/* Type, bandwidth, hops, nvlinks and via of a -> b, and the same for b -> a
 * (paths are symmetric: every rule reads a route the same from either end). */
static void expect(int a, int b, enum plait_topo_path_type type, double bw, int hops, int nvlinks, int via)
{
    for (int dir = 0; dir < 2; dir++) {
        const struct plait_topo_path *p = dir == 0 ? path(a, b) : path(b, a);
        const char *x = g->nodes[dir == 0 ? a : b].name, *y = g->nodes[dir == 0 ? b : a].name;
        cr_expect_eq(p->type, type, "%s -> %s: type %s, expected %s", x, y, plait_topo_path_type_name(p->type),
                     plait_topo_path_type_name(type));
        cr_expect_float_eq(p->bw, bw, 1e-9, "%s -> %s: bw %g, expected %g", x, y, p->bw, bw);
        cr_expect_eq(p->hops, hops, "%s -> %s: hops %d, expected %d", x, y, p->hops, hops);
        cr_expect_eq(p->nvlinks, nvlinks, "%s -> %s: nvlinks %d, expected %d", x, y, p->nvlinks, nvlinks);
        cr_expect_eq(p->via, via, "%s -> %s: via %d, expected %d", x, y, p->via, via);
    }
}

static void expect_label(int a, int b, const char *label)
{
    char buf[16];
    plait_topo_path_label(path(a, b), buf, sizeof(buf));
    cr_expect_str_eq(buf, label, "%s -> %s", g->nodes[a].name, g->nodes[b].name);
}

/* ---------------------------------------------------------------- paths */

Test(topo_paths, pix_one_switch)
{
    int c0 = cpu("cpu0"), s0 = sw("sw0", 0), g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 0);
    pci(c0, s0, 63);
    pci(s0, g0, 32);
    pci(s0, g1, 24);
    compute();
    expect(g0, g1, PLAIT_PATH_PIX, 24, 2, 0, -1); /* narrowest link: sw0-gpu1 */
    expect(g0, s0, PLAIT_PATH_PIX, 32, 1, 0, -1);
    expect(g0, c0, PLAIT_PATH_PHB, 32, 2, 0, -1); /* the cpu end makes cpu0-sw0 PHB */
    expect(g0, g0, PLAIT_PATH_LOC, PLAIT_TOPO_LOC_BW, 0, 0, -1);
    expect_label(g0, g1, "PIX");
    expect_label(g0, g0, "X");
}

Test(topo_paths, pxb_switch_hierarchy)
{
    int c0 = cpu("cpu0"), root = sw("sw0", 0), a = sw("sw1", 0), b = sw("sw2", 0);
    int g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 0), g2 = gpu("gpu2", 0);
    pci(c0, root, 63);
    pci(root, a, 63);
    pci(root, b, 50);
    pci(a, g0, 63);
    pci(a, g2, 63);
    pci(b, g1, 63);
    compute();
    expect(g0, g1, PLAIT_PATH_PXB, 50, 4, 0, -1); /* gpu0-sw1-sw0-sw2-gpu1: two switch-switch links */
    expect(g0, g2, PLAIT_PATH_PIX, 63, 2, 0, -1); /* same leaf switch */
    expect(g0, b, PLAIT_PATH_PXB, 50, 3, 0, -1);
}

Test(topo_paths, phb_host_bridge_and_cpu)
{
    /* Socket 0: two switches straight under the CPU. Socket 1: a host bridge
     * node with two switches below it. */
    int c0 = cpu("cpu0"), c1 = cpu("cpu1");
    int s0 = sw("sw0", 0), s1 = sw("sw1", 0), hb = hostbridge("hb1", 1), s2 = sw("sw2", 1), s3 = sw("sw3", 1);
    int g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 0), g2 = gpu("gpu2", 1), g3 = gpu("gpu3", 1), g4 = gpu("gpu4", 1);
    pci(c0, s0, 63);
    pci(c0, s1, 63);
    pci(c1, hb, 63);
    pci(hb, s2, 63);
    pci(hb, s3, 40);
    pci(s0, g0, 63);
    pci(s1, g1, 63);
    pci(s2, g2, 63);
    pci(s3, g3, 63);
    pci(hb, g4, 30); /* a device right below a host bridge: PHB, not PIX */
    link(c0, c1, PLAIT_LINK_SYS, 1, 40);
    compute();
    expect(g0, g1, PLAIT_PATH_PHB, 63, 4, 0, -1);
    expect(g2, g3, PLAIT_PATH_PHB, 40, 4, 0, -1); /* switch - host bridge - switch, not PXB */
    expect(g2, g4, PLAIT_PATH_PHB, 30, 3, 0, -1);
    expect(g0, c0, PLAIT_PATH_PHB, 63, 2, 0, -1);
    expect_label(g0, g1, "PHB");
}

Test(topo_paths, sys_across_sockets)
{
    int c0 = cpu("cpu0"), c1 = cpu("cpu1"), s0 = sw("sw0", 0), s1 = sw("sw1", 1);
    int g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 1);
    pci(c0, s0, 63);
    pci(c1, s1, 63);
    pci(s0, g0, 63);
    pci(s1, g1, 63);
    link(c0, c1, PLAIT_LINK_SYS, 1, 40);
    compute();
    expect(g0, g1, PLAIT_PATH_SYS, 40, 5, 0, -1);
    expect(c0, c1, PLAIT_PATH_SYS, 40, 1, 0, -1);
    expect(g0, c1, PLAIT_PATH_SYS, 40, 3, 0, -1);
    expect_label(g0, g1, "SYS");
}

Test(topo_paths, nvlink_direct_and_nvswitch)
{
    int c0 = cpu("cpu0"), s0 = sw("sw0", 0), nv = add(PLAIT_TOPO_NVS, "nvs0");
    int g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 0), g2 = gpu("gpu2", 0), g3 = gpu("gpu3", 0);
    pci(c0, s0, 63);
    for (int i = 0; i < 4; i++)
        pci(s0, g0 + i, 63);
    link(g0, g1, PLAIT_LINK_NVL, 4, 100);
    link(g2, nv, PLAIT_LINK_NVL, 18, 450);
    link(g3, nv, PLAIT_LINK_NVL, 12, 300);
    compute();
    expect(g0, g1, PLAIT_PATH_NVL, 100, 1, 4, -1);
    expect(g2, g3, PLAIT_PATH_NVL, 300, 2, 12, -1); /* through the NVSwitch: the fewer lanes count */
    expect(g0, g2, PLAIT_PATH_PIX, 63, 2, 0, -1);   /* no NVLink between them */
    expect_label(g0, g1, "NV4");
    expect_label(g2, g3, "NV12");
}

Test(topo_paths, nvb_through_a_gpu)
{
    int c0 = cpu("cpu0"), s0 = sw("sw0", 0);
    int g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 0), g2 = gpu("gpu2", 0);
    pci(c0, s0, 63);
    pci(s0, g0, 63);
    pci(s0, g1, 63);
    pci(s0, g2, 63);
    link(g0, g1, PLAIT_LINK_NVL, 2, 50);
    link(g1, g2, PLAIT_LINK_NVL, 3, 75);
    compute();
    /* NVB (rank 2) beats PIX (rank 4) despite the lower bandwidth. */
    expect(g0, g2, PLAIT_PATH_NVB, 50, 2, 2, g1);
    expect(g0, g1, PLAIT_PATH_NVL, 50, 1, 2, -1);
    expect_label(g0, g2, "NVB");
    /* A switch is not reached through a GPU: gpu0 -> sw0 stays direct. */
    expect(g0, s0, PLAIT_PATH_PIX, 63, 1, 0, -1);
}

Test(topo_paths, pxn_versus_direct_pix)
{
    /* gpu0 alone under sw0; gpu1, gpu2 and nic0 under sw1; NVLink gpu0-gpu1
     * and gpu1-gpu2; nic1 right under the CPU. */
    int c0 = cpu("cpu0"), s0 = sw("sw0", 0), s1 = sw("sw1", 0);
    int g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 0), g2 = gpu("gpu2", 0);
    int n0 = nic("nic0", 0, 400, true), n1 = nic("nic1", 0, 200, true);
    pci(c0, s0, 63);
    pci(c0, s1, 63);
    pci(s0, g0, 63);
    pci(s1, g1, 63);
    pci(s1, g2, 63);
    pci(s1, n0, 60);
    pci(c0, n1, 30);
    link(g0, g1, PLAIT_LINK_NVL, 18, 450);
    link(g1, g2, PLAIT_LINK_NVL, 18, 450);
    compute();
    /* Direct gpu0-sw0-cpu0-sw1-nic0 is PHB; over NVLink to gpu1 and down its
     * switch it is PXN (better than PHB), bottleneck sw1-nic0. */
    expect(g0, n0, PLAIT_PATH_PXN, 60, 3, 18, g1);
    expect_label(g0, n0, "PXN");
    /* gpu2 has its own PIX path, better than PXN through gpu1. */
    expect(g2, n0, PLAIT_PATH_PIX, 60, 2, 0, -1);
    /* nic1 hangs from the CPU: through gpu1 the PCIe part would be PHB,
     * which PXN does not allow, so gpu0 -> nic1 is the direct PHB path. */
    expect(g0, n1, PLAIT_PATH_PHB, 30, 3, 0, -1);
    /* A route through a GPU ends at a GPU or a NIC: gpu1's switch is reached
     * through the CPU, not through gpu1. */
    expect(g0, s1, PLAIT_PATH_PHB, 63, 3, 0, -1);
    /* A GPU entered over PCIe and left over PCIe is not passed: the NICs and
     * switches of another GPU are reached through the CPU. */
    expect(n0, s0, PLAIT_PATH_PHB, 60, 3, 0, -1);
    /* GPU to GPU over two NVLinks through gpu1: NVB. */
    expect(g0, g2, PLAIT_PATH_NVB, 450, 2, 18, g1);
}

Test(topo_paths, p2c_grace)
{
    /* A Grace Hopper: GPU on C2C to its CPU and on PCIe below it; NIC under a
     * switch below the CPU. */
    int c0 = cpu("cpu0"), s0 = sw("sw0", 0), g0 = gpu("gpu0", 0), n0 = nic("nic0", 0, 400, true);
    link(g0, c0, PLAIT_LINK_C2C, 1, 450);
    pci(c0, g0, 63);
    pci(c0, s0, 60);
    pci(s0, n0, 63);
    compute();
    /* PCIe only: gpu0-cpu0-sw0-nic0 is PHB; C2C then PCIe is P2C (better). */
    expect(g0, n0, PLAIT_PATH_P2C, 60, 3, 0, -1);
    expect(g0, c0, PLAIT_PATH_C2C, 450, 1, 0, -1);
    expect_label(g0, n0, "P2C");
    struct plait_topo_affinity a;
    cr_assert_eq(plait_topo_affinity(g, P, g0, &a), PLAIT_SUCCESS);
    cr_expect_eq(a.nic, n0);
    cr_expect_eq(a.type, PLAIT_PATH_P2C);
    cr_expect(a.has_gdr);
    cr_expect_float_eq(a.bw, 50, 1e-9); /* 60 capped at 400 Gb/s / 8 */
    cr_expect_eq(a.cpu, c0);
}

Test(topo_paths, pxn_over_c2c)
{
    /* Two Grace Hoppers joined by NVLink (and their Graces by SYS), a NIC on
     * each Grace's PCIe. gpu0 -> nic1: over NVLink to gpu1, then gpu1's P2C
     * route (C2C, PCIe): PXN; the other route crosses SYS. */
    int c0 = cpu("cpu0"), c1 = cpu("cpu1"), g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 1);
    int n0 = nic("nic0", 0, 400, true), n1 = nic("nic1", 1, 400, true);
    link(g0, c0, PLAIT_LINK_C2C, 1, 450);
    link(g1, c1, PLAIT_LINK_C2C, 1, 450);
    link(c0, c1, PLAIT_LINK_SYS, 1, 100);
    link(g0, g1, PLAIT_LINK_NVL, 18, 450);
    pci(c0, n0, 63);
    pci(c1, n1, 63);
    compute();
    expect(g0, n1, PLAIT_PATH_PXN, 63, 3, 18, g1);
    expect(g0, n0, PLAIT_PATH_P2C, 63, 2, 0, -1);
    /* The other Grace is reached over SYS, not through gpu1. */
    expect(g0, c1, PLAIT_PATH_SYS, 100, 2, 0, -1);
    /* NIC to NIC never through a GPU: SYS. */
    expect(n0, n1, PLAIT_PATH_SYS, 63, 3, 0, -1);
    struct plait_topo_affinity a;
    cr_assert_eq(plait_topo_affinity(g, P, g1, &a), PLAIT_SUCCESS);
    cr_expect_eq(a.nic, n1);
    cr_expect_eq(a.type, PLAIT_PATH_P2C);
}

Test(topo_paths, disconnected)
{
    int c0 = cpu("cpu0"), s0 = sw("sw0", 0), g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 0);
    int n0 = nic("nic0", -1, 100, true);
    pci(c0, s0, 63);
    pci(s0, g0, 63);
    compute();
    expect(g0, g1, PLAIT_PATH_DIS, 0, 0, 0, -1);
    expect_label(g0, g1, "DIS");
    struct plait_topo_affinity a;
    cr_assert_eq(plait_topo_affinity(g, P, g1, &a), PLAIT_SUCCESS);
    cr_expect_eq(a.nic, -1);
    cr_expect_eq(a.type, PLAIT_PATH_DIS);
    cr_expect_not(a.has_gdr);
    (void)n0;
    /* No order connects them: one channel in the given order, no bandwidth. */
    struct plait_topo_search s;
    int devs[2] = {g0, g1};
    cr_assert_eq(plait_topo_search_channels(g, P, devs, 2, false, PLAIT_TOPO_TREE, &s), PLAIT_SUCCESS);
    cr_expect_eq(s.nchannels, 1);
    cr_expect_eq(s.bw, 0);
    cr_expect_eq(s.ch[0].worst, PLAIT_PATH_DIS);
    cr_expect_eq(s.ch[0].order[0], 0);
    cr_expect_eq(s.ch[0].order[1], 1);
}

Test(topo_paths, nics_are_never_passed)
{
    /* Two hosts joined by the network: NIC to NIC is NET, GPU to the far GPU
     * would pass two NICs: DIS. */
    int c0 = cpu("cpu0"), c1 = cpu("cpu1"), g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 1);
    int n0 = nic("nic0", 0, 400, true), n1 = nic("nic1", 1, 400, true);
    pci(c0, g0, 63);
    pci(c0, n0, 63);
    pci(c1, g1, 63);
    pci(c1, n1, 63);
    link(n0, n1, PLAIT_LINK_NET, 1, 50);
    compute();
    expect(n0, n1, PLAIT_PATH_NET, 50, 1, 0, -1);
    expect(g0, g1, PLAIT_PATH_DIS, 0, 0, 0, -1);
    expect(g0, n0, PLAIT_PATH_PHB, 63, 2, 0, -1);
}

/* ---------------------------------------------------------------- affinity */

Test(topo_paths, affinity_nearest_and_spread)
{
    /* gpu0 and gpu1 share sw0 with nic0 and nic1 (equally near: the second GPU
     * takes the NIC the first did not); gpu2 under sw1 with nic2 (no GPUDirect);
     * gpu3 under the CPU directly. */
    int c0 = cpu("cpu0"), s0 = sw("sw0", 0), s1 = sw("sw1", 0);
    int g0 = gpu("gpu0", 0), g1 = gpu("gpu1", 0), g2 = gpu("gpu2", 0), g3 = gpu("gpu3", 0);
    int n0 = nic("nic0", 0, 200, true), n1 = nic("nic1", 0, 200, true), n2 = nic("nic2", 0, 800, false);
    pci(c0, s0, 63);
    pci(c0, s1, 63);
    pci(s0, g0, 63);
    pci(s0, g1, 63);
    pci(s0, n0, 63);
    pci(s0, n1, 63);
    pci(s1, g2, 63);
    pci(s1, n2, 63);
    pci(c0, g3, 63);
    compute();
    struct plait_topo_affinity a;
    cr_assert_eq(plait_topo_affinity(g, P, g0, &a), PLAIT_SUCCESS);
    cr_expect_eq(a.gpu, g0);
    cr_expect_eq(a.nic, n0);
    cr_expect_eq(a.type, PLAIT_PATH_PIX);
    cr_expect_float_eq(a.bw, 25, 1e-9); /* 200 Gb/s / 8 */
    cr_expect(a.has_gdr);
    cr_expect_eq(a.cpu, c0);
    cr_assert_eq(plait_topo_affinity(g, P, g1, &a), PLAIT_SUCCESS);
    cr_expect_eq(a.nic, n1); /* nic0 is gpu0's already */
    cr_assert_eq(plait_topo_affinity(g, P, g2, &a), PLAIT_SUCCESS);
    cr_expect_eq(a.nic, n2);
    cr_expect_float_eq(a.bw, 63, 1e-9); /* 800 Gb/s = 100 GB/s does not cap 63 */
    cr_expect_not(a.has_gdr);           /* PIX, but the NIC has no GPUDirect */
    /* gpu3: every NIC is PHB; nic2's capped bandwidth (63) beats 25. */
    cr_assert_eq(plait_topo_affinity(g, P, g3, &a), PLAIT_SUCCESS);
    cr_expect_eq(a.nic, n2);
    cr_expect_eq(a.type, PLAIT_PATH_PHB);
    cr_expect_not(a.has_gdr);
    /* Not a GPU. */
    cr_expect_eq(plait_topo_affinity(g, P, n0, &a), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_topo_affinity(g, P, -1, &a), PLAIT_ERR_INVALID_ARGUMENT);
}

/* ---------------------------------------------------------------- search */

/* A DGX H100: 8 GPUs on NVSwitches (18 NVLink4 lanes, 450 GB/s each), each
 * with its own PCIe Gen5 switch (63 GB/s) and 400 Gb/s NIC, four per socket. */
static int dgx_gpus[8], dgx_nics[8];
static void build_dgx(void)
{
    int c[2] = {cpu("cpu0"), cpu("cpu1")};
    int nv = add(PLAIT_TOPO_NVS, "nvs0");
    link(c[0], c[1], PLAIT_LINK_SYS, 1, 40);
    char name[32];
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof(name), "sw%d", i);
        int s = sw(name, i / 4);
        snprintf(name, sizeof(name), "gpu%d", i);
        dgx_gpus[i] = gpu(name, i / 4);
        snprintf(name, sizeof(name), "nic%d", i);
        dgx_nics[i] = nic(name, i / 4, 400, true);
        pci(c[i / 4], s, 63);
        pci(s, dgx_gpus[i], 63);
        pci(s, dgx_nics[i], 63);
        link(dgx_gpus[i], nv, PLAIT_LINK_NVL, 18, 450);
    }
    compute();
}

static void expect_permutation(const struct plait_topo_channel *ch, int n)
{
    bool seen[PLAIT_TOPO_MAX_LOCAL] = {false};
    cr_assert_eq(ch->n, n);
    for (int i = 0; i < n; i++) {
        cr_assert(ch->order[i] >= 0 && ch->order[i] < n);
        cr_assert_not(seen[ch->order[i]], "rank %d twice", ch->order[i]);
        seen[ch->order[i]] = true;
    }
}

static struct plait_topo_search S;

Test(topo_paths, search_nvswitch_ring)
{
    build_dgx();
    cr_assert_eq(plait_topo_search_channels(g, P, dgx_gpus, 8, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS, "%s",
                 plait_last_error_get());
    /* Each GPU's 18 lanes carry one hop out and one in: 450 with one ring, and
     * k rings give k * 450 / k, so one. */
    cr_expect_eq(S.pattern, PLAIT_TOPO_RING);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, 450, 1e-6);
    cr_expect_float_eq(S.ch[0].bw, 450, 1e-6);
    cr_expect_eq(S.ch[0].worst, PLAIT_PATH_NVL);
    cr_expect_eq(S.ch[0].nic_in, -1);
    cr_expect_eq(S.ch[0].nic_out, -1);
    expect_permutation(&S.ch[0], 8);
}

Test(topo_paths, search_two_dgx_hosts)
{
    build_dgx();
    for (int pat = 0; pat < 2; pat++) {
        cr_assert_eq(plait_topo_search_channels(g, P, dgx_gpus, 8, true, (enum plait_topo_pattern)pat, &S),
                     PLAIT_SUCCESS, "%s", plait_last_error_get());
        /* Each channel's traffic crosses one NIC in and one out at 50 GB/s:
         * with every NIC used once each way, 8 * 50 = 400 (NVLink loads of 7
         * per direction leave 64 each, PCIe 63); a ninth channel would share a
         * NIC: 9 * 25. */
        cr_expect_eq(S.nchannels, 8, "pattern %d", pat);
        cr_expect_float_eq(S.bw, 400, 1e-6);
        int used_in[8] = {0}, used_out[8] = {0};
        for (int k = 0; k < S.nchannels; k++) {
            const struct plait_topo_channel *ch = &S.ch[k];
            expect_permutation(ch, 8);
            cr_expect_float_eq(ch->bw, 50, 1e-6);
            /* The NIC beside the entry GPU, and beside the exit GPU. */
            cr_expect_eq(ch->nic_in, dgx_nics[ch->order[0]]);
            cr_expect_eq(ch->nic_out, dgx_nics[ch->order[7]]);
            used_in[g->nodes[ch->nic_in].index]++;
            used_out[g->nodes[ch->nic_out].index]++;
        }
        for (int i = 0; i < 8; i++) {
            cr_expect_eq(used_in[i], 1, "nic%d in", i);
            cr_expect_eq(used_out[i], 1, "nic%d out", i);
        }
    }
    /* One GPU leaving the host: its own NIC bounds it, one channel. */
    cr_assert_eq(plait_topo_search_channels(g, P, dgx_gpus + 3, 1, true, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, 50, 1e-6);
    cr_expect_eq(S.ch[0].nic_in, dgx_nics[3]);
    cr_expect_eq(S.ch[0].nic_out, dgx_nics[3]);
}

/* Two sockets joined by a 20 GB/s link, each with one Gen5 switch (63 GB/s)
 * and n/2 GPUs below it. GPU i's devs position is a shuffle so that the
 * search, not the input order, has to group them. */
static int pcie_gpus[16];
static void build_pcie_box(int n)
{
    int c0 = cpu("cpu0"), c1 = cpu("cpu1"), s0 = sw("sw0", 0), s1 = sw("sw1", 1);
    pci(c0, s0, 63);
    pci(c1, s1, 63);
    link(c0, c1, PLAIT_LINK_SYS, 1, 20);
    char name[32];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "gpu%d", i);
        int x = gpu(name, i < n / 2 ? 0 : 1);
        pci(i < n / 2 ? s0 : s1, x, 63);
        pcie_gpus[(i * 5 + 1) % n] = x; /* 5 is coprime with 4 and 16 */
    }
    compute();
}

static int socket_of(int node) { return g->nodes[node].numa; }

static int socket_changes(const struct plait_topo_channel *ch, const int *devs, bool closed)
{
    int c = 0;
    for (int i = 0; i + 1 < ch->n + (closed ? 1 : 0); i++)
        c += socket_of(devs[ch->order[i]]) != socket_of(devs[ch->order[(i + 1) % ch->n]]);
    return c;
}

Test(topo_paths, search_pcie_socket_bottleneck)
{
    build_pcie_box(4);
    cr_assert_eq(plait_topo_search_channels(g, P, pcie_gpus, 4, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    /* Any ring crosses the socket link at least once each way: k rings load it
     * k per direction, so 20 in all, one ring, crossing exactly twice. */
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, 20, 1e-6);
    cr_expect_eq(S.ch[0].worst, PLAIT_PATH_SYS);
    cr_expect_eq(socket_changes(&S.ch[0], pcie_gpus, true), 2);
    /* A chain crosses once, one way: a second chain crossing the other way
     * doubles it (GPU links then carry 2 * 20 < 63). 40 with 2 chains. */
    cr_assert_eq(plait_topo_search_channels(g, P, pcie_gpus, 4, false, PLAIT_TOPO_TREE, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 2);
    cr_expect_float_eq(S.bw, 40, 1e-6);
    for (int k = 0; k < S.nchannels; k++)
        cr_expect_eq(socket_changes(&S.ch[k], pcie_gpus, false), 1);
    cr_expect_neq(socket_of(pcie_gpus[S.ch[0].order[0]]), socket_of(pcie_gpus[S.ch[1].order[0]]));
}

Test(topo_paths, search_pcie_heuristic_16)
{
    /* 16 ranks: above the exhaustive limit, the greedy rings must still group
     * each socket's GPUs: 20 GB/s, one ring crossing twice. */
    build_pcie_box(16);
    cr_assert_eq(plait_topo_search_channels(g, P, pcie_gpus, 16, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, 20, 1e-6);
    expect_permutation(&S.ch[0], 16);
    cr_expect_eq(socket_changes(&S.ch[0], pcie_gpus, true), 2);
}

Test(topo_paths, search_nvlink_mesh_4)
{
    /* 4 GPUs, every pair joined by 4 NVLink4 lanes (100 GB/s each way). A ring
     * uses 4 of the 12 arc directions. The 12 arcs cannot be split into 3
     * disjoint directed Hamilton cycles (Tillson: the complete digraph on 4
     * vertices has no such decomposition), so 3 rings load some arc twice
     * (150). The 6 directed rings (3 cycles, both ways) load every arc exactly
     * twice: 6 * 100/2 = 300, the most: 12 arcs * 100 / 4 arcs per ring = 3
     * rings' worth. Fewer channels: 5 -> some arc 2 (250), 2 -> 200, 1 -> 100. */
    int c0 = cpu("cpu0"), s0 = sw("sw0", 0), x[4];
    pci(c0, s0, 63);
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof(name), "gpu%d", i);
        x[i] = gpu(name, 0);
        pci(s0, x[i], 63);
    }
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            link(x[i], x[j], PLAIT_LINK_NVL, 4, 100);
    compute();
    expect(x[0], x[3], PLAIT_PATH_NVL, 100, 1, 4, -1);
    cr_assert_eq(plait_topo_search_channels(g, P, x, 4, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 6);
    cr_expect_float_eq(S.bw, 300, 1e-6);
    int arcs[4][4] = {{0}};
    for (int k = 0; k < S.nchannels; k++) {
        expect_permutation(&S.ch[k], 4);
        cr_expect_float_eq(S.ch[k].bw, 50, 1e-6);
        cr_expect_eq(S.ch[k].worst, PLAIT_PATH_NVL);
        for (int i = 0; i < 4; i++)
            arcs[S.ch[k].order[i]][S.ch[k].order[(i + 1) % 4]]++;
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            if (i != j)
                cr_expect_eq(arcs[i][j], 2, "arc %d->%d", i, j);
}

Test(topo_paths, search_cpu_ranks)
{
    int c0 = cpu("cpu0"), c1 = cpu("cpu1");
    link(c0, c1, PLAIT_LINK_SYS, 1, 40);
    compute();
    /* Three ranks on one NUMA node: the ring's 3 hops are LOC hops on it,
     * sharing its 5000: B = 5000/3; k rings, 3k hops: the same total. */
    int one[3] = {c0, c0, c0};
    cr_assert_eq(plait_topo_search_channels(g, P, one, 3, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.ch[0].bw, PLAIT_TOPO_LOC_BW / 3, 1e-6);
    cr_expect_float_eq(S.bw, PLAIT_TOPO_LOC_BW / 3, 1e-6);
    /* The chain has 2 hops: 2500. */
    cr_assert_eq(plait_topo_search_channels(g, P, one, 3, false, PLAIT_TOPO_TREE, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, PLAIT_TOPO_LOC_BW / 2, 1e-6);
    cr_expect_eq(S.ch[0].worst, PLAIT_PATH_LOC);
    expect_permutation(&S.ch[0], 3);
    /* Two nodes, two ranks each: the ring crosses the 40 GB/s link once each
     * way when each node's ranks are next to each other: 40, one channel. */
    int two[4] = {c0, c1, c0, c1};
    cr_assert_eq(plait_topo_search_channels(g, P, two, 4, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, 40, 1e-6);
    cr_expect_eq(S.ch[0].worst, PLAIT_PATH_SYS);
    cr_expect_eq(socket_changes(&S.ch[0], two, true), 2);
}

Test(topo_paths, search_one_rank_and_duplicates)
{
    build_dgx();
    /* One rank, one host: its ring is a LOC hop (its chain has none: the
     * same bound). */
    cr_assert_eq(plait_topo_search_channels(g, P, dgx_gpus, 1, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, PLAIT_TOPO_LOC_BW, 1e-6);
    cr_expect_eq(S.ch[0].worst, PLAIT_PATH_LOC);
    cr_assert_eq(plait_topo_search_channels(g, P, dgx_gpus, 1, false, PLAIT_TOPO_TREE, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, PLAIT_TOPO_LOC_BW, 1e-6);
    cr_expect_eq(S.ch[0].n, 1);
    cr_expect_eq(S.ch[0].order[0], 0);
    cr_expect_float_eq(S.ch[0].bw, PLAIT_TOPO_LOC_BW, 1e-6);
    /* Two ranks on gpu0, one on gpu1: the two gpu0 ranks sit together (one
     * LOC hop, 5000), the others cross the NVSwitch once each way: 450. */
    int devs[3] = {dgx_gpus[0], dgx_gpus[1], dgx_gpus[0]};
    cr_assert_eq(plait_topo_search_channels(g, P, devs, 3, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, 450, 1e-6);
    expect_permutation(&S.ch[0], 3);
}

Test(topo_paths, search_bad_arguments)
{
    build_dgx();
    int devs[PLAIT_TOPO_MAX_LOCAL + 1];
    for (int i = 0; i <= PLAIT_TOPO_MAX_LOCAL; i++)
        devs[i] = dgx_gpus[i % 8];
    cr_expect_eq(plait_topo_search_channels(g, P, devs, 0, false, PLAIT_TOPO_RING, &S), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(plait_last_error_get(), "ndevs 0") != NULL, "%s", plait_last_error_get());
    cr_expect_eq(plait_topo_search_channels(g, P, devs, PLAIT_TOPO_MAX_LOCAL + 1, false, PLAIT_TOPO_RING, &S),
                 PLAIT_ERR_INVALID_ARGUMENT);
    devs[1] = -1;
    cr_expect_eq(plait_topo_search_channels(g, P, devs, 4, false, PLAIT_TOPO_RING, &S), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(plait_last_error_get(), "devs[1]") != NULL, "%s", plait_last_error_get());
    devs[1] = g->nnodes;
    cr_expect_eq(plait_topo_search_channels(g, P, devs, 4, true, PLAIT_TOPO_RING, &S), PLAIT_ERR_INVALID_ARGUMENT);
    devs[1] = dgx_nics[0];
    cr_expect_eq(plait_topo_search_channels(g, P, devs, 4, false, PLAIT_TOPO_TREE, &S), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(plait_last_error_get(), "nic0") != NULL, "%s", plait_last_error_get());
    devs[1] = dgx_gpus[1];
    cr_expect_eq(plait_topo_search_channels(g, P, devs, 4, false, PLAIT_TOPO_RING, NULL), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_topo_search_channels(g, P, NULL, 4, false, PLAIT_TOPO_RING, &S), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_topo_search_channels(g, P, devs, 4, false, (enum plait_topo_pattern)7, &S),
                 PLAIT_ERR_INVALID_ARGUMENT);
}

/* ---------------------------------------------------------------- scale */

/* A GB200 NVL72 rack as one graph: 18 trays of 2 Grace CPUs and 4 GPUs (two
 * per CPU over C2C, 900 GB/s NVLink5 to the NVSwitch fabric), 4 NICs behind
 * PCIe switches per tray, the trays' NICs on a network; ~300 nodes. */
static int rack_gpus[72];
static void build_rack(void)
{
    int nv = add(PLAIT_TOPO_NVS, "nvs0");
    char name[32];
    int prev_nic = -1;
    for (int t = 0; t < 18; t++) {
        int c[2];
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof(name), "cpu%d", 2 * t + k);
            c[k] = cpu(name);
        }
        link(c[0], c[1], PLAIT_LINK_SYS, 1, 300);
        for (int k = 0; k < 4; k++) {
            int numa = g->nodes[c[k / 2]].index;
            snprintf(name, sizeof(name), "hb%d", 4 * t + k);
            int hb = hostbridge(name, numa);
            snprintf(name, sizeof(name), "sw%d", 4 * t + k);
            int s = sw(name, numa);
            snprintf(name, sizeof(name), "gpu%d", 4 * t + k);
            int x = gpu(name, numa);
            g->nodes[x].gpu.sm = 100;
            rack_gpus[4 * t + k] = x;
            snprintf(name, sizeof(name), "nic%d", 4 * t + k);
            int n = nic(name, numa, 400, true);
            link(x, c[k / 2], PLAIT_LINK_C2C, 1, 450);
            link(x, nv, PLAIT_LINK_NVL, 18, 900);
            pci(c[k / 2], hb, 63);
            pci(hb, s, 63);
            pci(s, n, 63);
            if (prev_nic >= 0)
                link(prev_nic, n, PLAIT_LINK_NET, 1, 50);
            prev_nic = n;
        }
    }
    for (int i = g->nnodes; i < 300; i++) {
        snprintf(name, sizeof(name), "spare%d", i);
        int s = sw(name, 0);
        pci(plait_topo_nth(g, PLAIT_TOPO_CPU, 0), s, 16);
    }
}

Test(topo_paths, speed_300_nodes)
{
    build_rack();
    cr_assert_geq(g->nnodes, 300);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    compute();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect_lt(s, 2.0, "paths of %d nodes took %.3f s", g->nnodes, s);
    int nic0 = plait_topo_find(g, "nic0"), nic1 = plait_topo_find(g, "nic1"), nic2 = plait_topo_find(g, "nic2");
    int nic3 = plait_topo_find(g, "nic3"), nic4 = plait_topo_find(g, "nic4");
    /* Across trays over the fabric. */
    expect(rack_gpus[0], rack_gpus[71], PLAIT_PATH_NVL, 900, 2, 18, -1);
    /* Its own NIC: C2C to the Grace, then host bridge, switch, NIC: P2C. */
    expect(rack_gpus[0], nic0, PLAIT_PATH_P2C, 63, 4, 0, -1);
    expect(rack_gpus[0], nic1, PLAIT_PATH_P2C, 63, 4, 0, -1); /* gpu1's NIC hangs from the same CPU */
    /* nic2 is under the other Grace: over NVLink to gpu2, then gpu2's P2C
     * route to it: PXN (over C2C), better than SYS over the Grace-Grace link.
     * The other Grace itself is not reached through a GPU: SYS. */
    expect(rack_gpus[0], nic2, PLAIT_PATH_PXN, 63, 6, 18, rack_gpus[2]);
    expect(rack_gpus[0], plait_topo_find(g, "cpu1"), PLAIT_PATH_SYS, 300, 2, 0, -1);
    /* Every path reads the same from both ends. */
    for (int a = 0; a < g->nnodes; a++)
        for (int b = 0; b < a; b++) {
            const struct plait_topo_path *p = path(a, b), *q = path(b, a);
            cr_assert(p->type == q->type && p->bw == q->bw && p->hops == q->hops && p->nvlinks == q->nvlinks &&
                          p->via == q->via,
                      "%s <-> %s differ", g->nodes[a].name, g->nodes[b].name);
        }
    /* NICs of one tray reach each other over PCIe (PHB beats NET); those of
     * two trays only over the network. */
    expect(nic0, nic1, PLAIT_PATH_PHB, 63, 6, 0, -1);
    expect(nic3, nic4, PLAIT_PATH_NET, 50, 1, 0, -1);

    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(plait_topo_search_channels(g, P, rack_gpus, 72, false, PLAIT_TOPO_RING, &S), PLAIT_SUCCESS);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect_lt(s, 10.0, "search over 72 GPUs took %.3f s", s);
    cr_expect_eq(S.nchannels, 1);
    cr_expect_float_eq(S.bw, 900, 1e-6);
    cr_expect_eq(S.ch[0].worst, PLAIT_PATH_NVL);
    expect_permutation(&S.ch[0], 72);
}

Test(topo_paths, null_arguments)
{
    cr_expect_eq(plait_topo_paths_compute(NULL, &P), PLAIT_ERR_INVALID_ARGUMENT);
    cr_expect_eq(plait_topo_paths_compute(g, NULL), PLAIT_ERR_INVALID_ARGUMENT);
    plait_topo_paths_free(NULL);
    /* An empty graph has an empty matrix. */
    cr_assert_eq(plait_topo_paths_compute(g, &P), PLAIT_SUCCESS);
    cr_expect_eq(P->n, 0);
}
