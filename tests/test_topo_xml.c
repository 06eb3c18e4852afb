/* Topology XML (topology/xml.c, topology/nccl_xml.c): load(dump(g)) == g on
 * graphs that set every field, every kind of malformed input rejected with
 * "NAME:LINE: reason", out-of-range and dangling attributes, files, and NCCL's
 * format read from hand-written dumps in tests/fixtures/nccl/. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "topology/topo.h"
#include "topology/xml_internal.h"

/* ---------------------------------------------------------------- helpers */

static const char *fixtures(void)
{
    const char *d = getenv("PLAIT_TEST_FIXTURES");
    return d && *d ? d : "tests/fixtures";
}

static struct plait_topo *load_ok(const char *xml)
{
    struct plait_topo *t = NULL;
    plait_result_t r = plait_topo_load_xml_buffer(xml, strlen(xml), "t.xml", &t);
    cr_assert_eq(r, PLAIT_SUCCESS, "load failed: %s\n%s", plait_last_error_get(), xml);
    return t;
}

static struct plait_topo *load_fixture(const char *rel)
{
    char path[4096];
    struct plait_topo *t = NULL;
    snprintf(path, sizeof(path), "%s/%s", fixtures(), rel);
    plait_result_t r = plait_topo_load_xml(path, &t);
    cr_assert_eq(r, PLAIT_SUCCESS, "%s: %s", path, plait_last_error_get());
    return t;
}

/* Loading must fail with INVALID_ARGUMENT and a message that starts with
 * "t.xml:LINE: " (line 0: "t.xml: ", the validation's form) and holds `word`. */
static void expect_error(const char *xml, int line, const char *word)
{
    struct plait_topo *t = (struct plait_topo *)0x1;
    char prefix[32];
    plait_last_error_clear();
    plait_result_t r = plait_topo_load_xml_buffer(xml, strlen(xml), "t.xml", &t);
    const char *msg = plait_last_error_get();
    cr_assert_eq(r, PLAIT_ERR_INVALID_ARGUMENT, "expected a failure (\"%s\"), got %d: %s\n%s", word, r, msg, xml);
    cr_assert_eq(t, (struct plait_topo *)0x1, "topo_out written on failure");
    if (line > 0)
        snprintf(prefix, sizeof(prefix), "t.xml:%d: ", line);
    else
        snprintf(prefix, sizeof(prefix), "t.xml: ");
    cr_assert(strncmp(msg, prefix, strlen(prefix)) == 0, "message \"%s\" does not start with \"%s\"", msg, prefix);
    cr_assert(strstr(msg, word) != NULL, "message \"%s\" does not say \"%s\"", msg, word);
}

/* A graph in plait's format with one element appended inside the root. */
static void expect_node_error(const char *element, int line, const char *word)
{
    char xml[4096];
    snprintf(xml, sizeof(xml),
             "<plait_topology version=\"1\">\n"
             "  <cpu name=\"cpu0\"/>\n"
             "  <gpu name=\"gpu0\" numa=\"0\"/>\n"
             "%s\n"
             "</plait_topology>\n",
             element);
    expect_error(xml, line, word);
}

static void assert_round_trip(const struct plait_topo *g)
{
    char *xml = NULL, *xml2 = NULL, why[512];
    struct plait_topo *back = NULL;
    cr_assert_eq(plait_topo_dump_xml_buffer(g, &xml), PLAIT_SUCCESS, "dump: %s", plait_last_error_get());
    cr_assert_eq(plait_topo_load_xml_buffer(xml, strlen(xml), "dump.xml", &back), PLAIT_SUCCESS, "reload: %s\n%s",
                 plait_last_error_get(), xml);
    cr_assert(plait_topo_xml_equal(g, back, why, sizeof(why)), "load(dump(g)) != g: %s\n%s", why, xml);
    cr_assert_str_eq(back->source, "plait-xml");
    /* The dump of the reloaded graph is the same text: nothing drifts on a second pass. */
    cr_assert_eq(plait_topo_dump_xml_buffer(back, &xml2), PLAIT_SUCCESS);
    cr_assert_str_eq(xml, xml2);
    free(xml);
    free(xml2);
    plait_topo_free(back);
}

static int add(struct plait_topo *t, enum plait_topo_node_type type, const char *name)
{
    int n = plait_topo_add_node(t, type, name);
    cr_assert_geq(n, 0, "add_node %s: %s", name ? name : "(auto)", plait_last_error_get());
    return n;
}

/* Every node type with every field away from its default, strings that need
 * escaping, and bandwidths with no short decimal form. */
static struct plait_topo *make_full_graph(void)
{
    struct plait_topo *t;
    cr_assert_eq(plait_topo_create(&t), PLAIT_SUCCESS);
    snprintf(t->host, sizeof(t->host), "node<1> & \"co\" 'x'");
    int c0 = add(t, PLAIT_TOPO_CPU, "cpu0");
    int c1 = add(t, PLAIT_TOPO_CPU, "socket.1:b");
    struct plait_topo_node *n = &t->nodes[c0];
    n->numa = 0;
    n->cpu.package = 0;
    n->cpu.ncores = 56;
    n->cpu.memory = UINT64_MAX;
    snprintf(n->cpu.arch, sizeof(n->cpu.arch), "x86_64");
    snprintf(n->cpu.vendor, sizeof(n->cpu.vendor), "GenuineIntel");
    snprintf(n->cpu.model, sizeof(n->cpu.model), "Intel(R) Xeon(R) <Platinum> 8480C & co");
    snprintf(n->cpu.cpuset, sizeof(n->cpu.cpuset), "0-55,112-167");
    n = &t->nodes[c1];
    n->numa = 1;
    n->cpu.package = 1;
    n->cpu.ncores = 1 << 20;
    n->cpu.memory = 1099511627776ull;
    snprintf(n->cpu.arch, sizeof(n->cpu.arch), "aarch64");
    snprintf(n->cpu.vendor, sizeof(n->cpu.vendor), "NVIDIA \xc3\xa9"); /* UTF-8 passes through */
    /* Fields outside the spec's list for a CPU still round-trip. */
    n->busid = plait_topo_busid_parse("0001:00:00.0");
    n->pci.gen = 5;
    n->pci.width = 8;
    n->pci.device = 0xbeef;

    int hb = add(t, PLAIT_TOPO_PCI, "hb0");
    n = &t->nodes[hb];
    n->pci.kind = PLAIT_PCI_HOST_BRIDGE;
    n->busid = plait_topo_busid_parse("0000:00:01.0");
    n->pci.gen = 6;
    n->pci.width = 32;
    n->pci.vendor = 0x8086;
    n->pci.device = 0x09a2;
    n->numa = 0;
    int sw = add(t, PLAIT_TOPO_PCI, NULL);
    n = &t->nodes[sw];
    n->busid = plait_topo_busid_parse("ffffff:ff:1f.7");
    n->pci.gen = 1;
    n->pci.width = 1;
    n->numa = 1;

    int g0 = add(t, PLAIT_TOPO_GPU, "gpu0");
    n = &t->nodes[g0];
    n->busid = plait_topo_busid_parse("0000:18:00.0");
    n->numa = 0;
    n->gpu.dev = 0;
    n->gpu.sm = 90;
    snprintf(n->gpu.model, sizeof(n->gpu.model), "NVIDIA H100 80GB HBM3");
    snprintf(n->gpu.uuid, sizeof(n->gpu.uuid), "GPU-ad536355-482f-a87c-b081-8523fb3971c4");
    n->gpu.memory = 85899345920ull;
    n->gpu.nvlinks = 18;
    n->gpu.nvlink_version = 4;
    n->pci.gen = 5;
    n->pci.width = 16;
    n->pci.vendor = 0x10de;
    n->pci.device = 0x2330;
    int g1 = add(t, PLAIT_TOPO_GPU, "gpu1");
    n = &t->nodes[g1];
    n->gpu.dev = 65536;
    n->gpu.sm = 1000;
    n->gpu.nvlinks = 256;
    n->gpu.nvlink_version = 5;

    int nic0 = add(t, PLAIT_TOPO_NIC, "nic0");
    n = &t->nodes[nic0];
    n->busid = plait_topo_busid_parse("0000:19:00.1");
    n->numa = 0;
    snprintf(n->nic.dev, sizeof(n->nic.dev), "mlx5_0");
    snprintf(n->nic.netdev, sizeof(n->nic.netdev), "ibp25s0f1");
    n->nic.port = 2;
    n->nic.speed = 400.0 / 3.0;
    n->nic.link_layer = PLAIT_LINK_LAYER_IB;
    n->nic.guid = 0xa088c20300f1e2d4ull;
    n->nic.has_gdr = true;
    n->pci.gen = 5;
    n->pci.width = 16;
    n->pci.vendor = 0x15b3;
    n->pci.device = 0x1021;
    int nic1 = add(t, PLAIT_TOPO_NIC, "veth-1");
    n = &t->nodes[nic1];
    snprintf(n->nic.dev, sizeof(n->nic.dev), "veth1");
    n->nic.port = 0;
    n->nic.speed = 1e5;
    n->nic.link_layer = PLAIT_LINK_LAYER_ETHERNET;
    n->nic.guid = UINT64_MAX;
    n->nic.is_virtual = true;

    int nvs = add(t, PLAIT_TOPO_NVS, "nvs0");
    n = &t->nodes[nvs];
    n->nvs.count = 4;
    n->busid = plait_topo_busid_parse("0000:c4:00.0");
    n->numa = 1;
    n->pci.gen = 2;
    n->pci.vendor = 0x10de;

    struct {
        int a, b;
        enum plait_topo_link_type type;
        int lanes;
        double bw, latency;
    } links[] = {
        {c0, c1, PLAIT_LINK_SYS, 1, 0.1 + 0.2, 0.25},
        {c0, hb, PLAIT_LINK_PCI, 16, 1e6, 0},
        {hb, sw, PLAIT_LINK_PCI, 0, 1e-6, 1e6},
        {sw, g0, PLAIT_LINK_PCI, 16, 63.008, 1.0 / 3.0},
        {sw, nic0, PLAIT_LINK_PCI, 16, 2.0 / 3.0 * 100, 0},
        {g0, nvs, PLAIT_LINK_NVL, 18, 450, 0},
        {g1, nvs, PLAIT_LINK_NVL, 1024, 123456.789, 0},
        {g0, g1, PLAIT_LINK_NVL, 4, 100, 0},
        {g1, c1, PLAIT_LINK_C2C, 10, 450, 0.001},
        {g0, c0, PLAIT_LINK_NVL, 2, 50, 0},
        {nic0, nic1, PLAIT_LINK_NET, 1, 12.5, 5.5},
        {c1, nic1, PLAIT_LINK_PCI, 4, 4 * 0.985, 0},
    };
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
        cr_assert_eq(plait_topo_add_link(t, links[i].a, links[i].b, links[i].type, links[i].lanes, links[i].bw,
                                         links[i].latency),
                     PLAIT_SUCCESS, "link %zu: %s", i, plait_last_error_get());
    cr_assert_eq(plait_topo_validate(t), PLAIT_SUCCESS, "%s", plait_last_error_get());
    return t;
}

/* ---------------------------------------------------------------- round trips */

Test(topo_xml, round_trip_every_field)
{
    struct plait_topo *t = make_full_graph();
    assert_round_trip(t);
    plait_topo_free(t);
}

Test(topo_xml, round_trip_empty_and_defaults)
{
    struct plait_topo *t;
    cr_assert_eq(plait_topo_create(&t), PLAIT_SUCCESS);
    assert_round_trip(t);
    /* Every node at its defaults: unknown busid, numa -1, dev -1, port 1. */
    for (int type = 0; type < PLAIT_TOPO_NODE_TYPES; type++)
        add(t, (enum plait_topo_node_type)type, NULL);
    assert_round_trip(t);
    plait_topo_free(t);
}

Test(topo_xml, round_trip_fixtures)
{
    /* Every machine the tests describe, in either format. */
    static const char *const dirs[] = {"topo", "comm", "nccl"};
    int loaded = 0;
    for (size_t d = 0; d < sizeof(dirs) / sizeof(dirs[0]); d++) {
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s/%s", fixtures(), dirs[d]);
        DIR *dp = opendir(dir);
        if (dp == NULL)
            continue;
        for (struct dirent *de; (de = readdir(dp)) != NULL;) {
            size_t n = strlen(de->d_name);
            if (n < 5 || strcmp(de->d_name + n - 4, ".xml") != 0)
                continue;
            char rel[1024];
            snprintf(rel, sizeof(rel), "%s/%s", dirs[d], de->d_name);
            struct plait_topo *t = load_fixture(rel);
            assert_round_trip(t);
            plait_topo_free(t);
            loaded++;
        }
        closedir(dp);
    }
    cr_assert_geq(loaded, 3, "the NCCL fixtures at least");
}

Test(topo_xml, round_trip_random_doubles)
{
    /* Bandwidths from a fixed pseudo-random sequence over many magnitudes:
     * the shortest form the dumper writes must read back bit for bit. */
    struct plait_topo *t;
    cr_assert_eq(plait_topo_create(&t), PLAIT_SUCCESS);
    int prev = add(t, PLAIT_TOPO_CPU, NULL);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 300; i++) {
        int n = add(t, PLAIT_TOPO_PCI, NULL);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double bw = ldexp((double)(x >> 11) / 9007199254740992.0 + 0.5, (int)(x % 38) - 19);
        cr_assert_eq(plait_topo_add_link(t, prev, n, PLAIT_LINK_PCI, 16, bw, bw / 7), PLAIT_SUCCESS);
        prev = n;
    }
    assert_round_trip(t);
    plait_topo_free(t);
}

Test(topo_xml, written_by_hand_defaults)
{
    /* The spec's example: bandwidths absent are computed. */
    struct plait_topo *t = load_ok(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<!-- the example of docs/topology.md -->\n"
        "<plait_topology version=\"1\" host=\"example\">\n"
        "  <cpu name=\"cpu0\" package=\"0\" cores=\"56\" cpuset=\"0-55\"/>\n"
        "  <pci name=\"sw0\" kind=\"switch\" busid=\"0000:15:00.0\" gen=\"5\" width=\"16\" numa=\"0\"/>\n"
        "  <gpu name='gpu0' dev='0' busid='0000:18:00.0' sm='90' nvlinks='18' numa='0'/>\n"
        "  <nic name=\"nic0\" dev=\"mlx5_0\" busid=\"0000:19:00.0\" speed=\"400\" link_layer=\"InfiniBand\"\n"
        "       gdr=\"1\" numa=\"0\"></nic>\n"
        "  <link a=\"cpu0\" b=\"sw0\" type=\"PCI\" lanes=\"16\"/>\n"
        "  <link a=\"sw0\" b=\"gpu0\" type=\"PCI\" lanes=\"16\"/>\n"
        "  <link a=\"sw0\" b=\"nic0\" type=\"PCI\" lanes=\"16\" latency=\"1.5\"/>\n"
        "</plait_topology>\n");
    cr_assert_str_eq(t->host, "example");
    cr_assert_str_eq(t->source, "plait-xml");
    cr_assert_eq(t->nnodes, 4);
    cr_assert_eq(t->nlinks, 3);
    cr_assert_eq(t->nodes[0].numa, 0, "a CPU node is its own NUMA node");
    cr_assert_eq(t->nodes[2].gpu.sm, 90);
    cr_assert_eq(t->nodes[2].busid, plait_topo_busid_parse("0000:18:00.0"));
    cr_assert_eq(t->nodes[3].nic.link_layer, PLAIT_LINK_LAYER_IB);
    cr_assert(t->nodes[3].nic.has_gdr);
    cr_assert_float_eq(t->links[0].bw, plait_topo_pci_bw(5, 16), 1e-9);
    cr_assert_float_eq(t->links[2].latency, 1.5, 1e-12);
    plait_topo_free(t);

    /* NVLink without bw: lanes x the GPU's per-link rate; SYS and C2C constants. */
    t = load_ok("<plait_topology>\n"
                "<cpu name=\"c\"/><gpu name=\"g\" sm=\"90\"/><gpu name=\"h\" nvlink_version=\"5\"/><cpu name=\"d\"/>\n"
                "<link a=\"g\" b=\"h\" type=\"NVL\" lanes=\"4\"/><link a=\"c\" b=\"d\" type=\"SYS\"/>\n"
                "<link a=\"c\" b=\"h\" type=\"C2C\"/>\n"
                "</plait_topology>");
    cr_assert_float_eq(t->links[0].bw, 4 * 25.0, 1e-9);
    cr_assert_float_eq(t->links[1].bw, PLAIT_TOPO_SYS_BW, 1e-9);
    cr_assert_eq(t->links[1].lanes, 1);
    cr_assert_float_eq(t->links[2].bw, PLAIT_TOPO_C2C_BW, 1e-9);
    plait_topo_free(t);
}

Test(topo_xml, entities_and_references)
{
    struct plait_topo *t = load_ok("<plait_topology host=\"a&lt;b&gt;c&amp;d&quot;e&apos;f&#65;&#x42;&#xe9;\">"
                                   "<cpu name=\"cpu0\" model=\"  spaced\tout\n\"/></plait_topology>");
    cr_assert_str_eq(t->host, "a<b>c&d\"e'fAB\xc3\xa9");
    /* Literal white space in a value is normalised to spaces, as XML says. */
    cr_assert_str_eq(t->nodes[0].cpu.model, "  spaced out ");
    plait_topo_free(t);
}

Test(topo_xml, dump_refuses_an_invalid_graph)
{
    struct plait_topo *t;
    char *xml = (char *)0x1;
    cr_assert_eq(plait_topo_create(&t), PLAIT_SUCCESS);
    add(t, PLAIT_TOPO_GPU, NULL);
    t->nodes[0].gpu.sm = 5000;
    cr_assert_eq(plait_topo_dump_xml_buffer(t, &xml), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(xml, (char *)0x1);
    cr_assert(strstr(plait_last_error_get(), "gpu0") != NULL, "%s", plait_last_error_get());
    plait_topo_free(t);
}

Test(topo_xml, decimal_comma_locale)
{
    /* A program that set a locale with a decimal comma must still read and write "63.008". */
    const char *const names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"};
    const char *set = NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && set == NULL; i++)
        set = setlocale(LC_NUMERIC, names[i]);
    if (set == NULL)
        cr_skip_test("no locale with a decimal comma is installed");
    struct plait_topo *t = load_ok("<plait_topology><cpu name=\"c\"/><pci name=\"p\"/>"
                                   "<link a=\"c\" b=\"p\" type=\"PCI\" bw=\"63.008\"/></plait_topology>");
    cr_assert_float_eq(t->links[0].bw, 63.008, 1e-12);
    char *xml;
    cr_assert_eq(plait_topo_dump_xml_buffer(t, &xml), PLAIT_SUCCESS);
    cr_assert(strstr(xml, "bw=\"63.008\"") != NULL, "%s", xml);
    setlocale(LC_NUMERIC, "C");
    free(xml);
    plait_topo_free(t);
}

/* ---------------------------------------------------------------- files */

Test(topo_xml, files)
{
    char path[] = "/tmp/plait-topo-xml-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    struct plait_topo *t = make_full_graph(), *back = NULL;
    cr_assert_eq(plait_topo_dump_xml(t, path), PLAIT_SUCCESS, "%s", plait_last_error_get());
    cr_assert_eq(plait_topo_load_xml(path, &back), PLAIT_SUCCESS, "%s", plait_last_error_get());
    char why[256];
    cr_assert(plait_topo_xml_equal(t, back, why, sizeof(why)), "%s", why);
    plait_topo_free(back);

    /* Errors in a file name the file. */
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("<plait_topology>\n<gpu name=\"g\" sm=\"abc\"/>\n</plait_topology>\n", f);
    fclose(f);
    cr_assert_eq(plait_topo_load_xml(path, &back), PLAIT_ERR_INVALID_ARGUMENT);
    char want[128];
    snprintf(want, sizeof(want), "%s:2: <gpu> attribute sm=\"abc\" is not a number", path);
    cr_assert_str_eq(plait_last_error_get(), want);
    unlink(path);

    cr_assert_eq(plait_topo_load_xml(path, &back), PLAIT_ERR_SYSTEM);
    cr_assert(strstr(plait_last_error_get(), path) != NULL, "%s", plait_last_error_get());
    cr_assert(strstr(plait_last_error_get(), "No such file") != NULL, "%s", plait_last_error_get());
    cr_assert_eq(plait_topo_load_xml("/", &back), PLAIT_ERR_SYSTEM, "a directory: %s", plait_last_error_get());
    cr_assert_eq(plait_topo_dump_xml(t, "/nonexistent-dir/x.xml"), PLAIT_ERR_SYSTEM);
    cr_assert(strstr(plait_last_error_get(), "/nonexistent-dir/x.xml") != NULL, "%s", plait_last_error_get());
    plait_topo_free(t);
}

Test(topo_xml, null_arguments)
{
    struct plait_topo *t;
    char *xml;
    cr_assert_eq(plait_topo_load_xml_buffer(NULL, 3, "x", &t), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_topo_load_xml_buffer("", 0, "x", NULL), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_topo_load_xml(NULL, &t), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_topo_dump_xml_buffer(NULL, &xml), PLAIT_ERR_INVALID_ARGUMENT);
    /* No name: messages say <buffer>. */
    cr_assert_eq(plait_topo_load_xml_buffer("<x/>", 4, NULL, &t), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert(strncmp(plait_last_error_get(), "<buffer>:1: ", 12) == 0, "%s", plait_last_error_get());
}

/* ---------------------------------------------------------------- malformed XML */

Test(topo_xml, malformed_markup)
{
    expect_error("<plait_topology>\n<cpu name=\"c\">\n</pci>\n</plait_topology>", 3,
                 "</pci> closes <cpu> opened at line 2");
    expect_error("<plait_topology>\n<cpu name=\"c\">\n", 3, "<cpu> opened at line 2 is never closed");
    expect_error("<plait_topology>\n</plait_topology>\n</x>", 3, "closes no open element");
    expect_error("", 1, "no root element");
    expect_error("  \n<!-- only a comment -->\n", 3, "no root element");
    expect_error("<plait_topology/>\n<plait_topology/>", 2, "second root");
    expect_error("<!DOCTYPE x [ <!ENTITY a \"b\"> ]>\n<plait_topology/>", 1, "DOCTYPE");
    expect_error("<plait_topology>\n<![CDATA[x]]>\n</plait_topology>", 2, "CDATA");
    expect_error("<plait_topology>\n<!ELEMENT x ANY>\n</plait_topology>", 2, "markup declarations");
    expect_error("<plait_topology>\nhello\n</plait_topology>", 2, "text \"hello");
    expect_error("<plait_topology>\n<!-- never closed\n\n", 2, "comment is not closed");
    expect_error("<plait_topology/>\n<?xml version=\"1.0\"?>", 2, "may only start");
    expect_error("<?xml version=\"1.0\"?>\n<?xml version=\"1.0\"?><plait_topology/>", 2, "may only start");
    expect_error("<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><plait_topology/>", 1, "encoding");
    expect_error("<?xml-stylesheet href=\"a\"?><plait_topology/>", 1, "processing instruction");
    expect_error("<plait_topology>\n<1cpu/>\n</plait_topology>", 2, "expected an element name");
    expect_error("<plait_topology>\n<cpu name=\"c\"", 2, "tag is not closed");
    expect_error("<plait_topology>\n<cpu name=\"c\" / >\n</plait_topology>", 2, "expected an attribute name");
    expect_error("<plait_topology>\n</plait_topology", 2, "not closed by '>'");
    char nul[] = "<plait_topology>\n\n<cpu name=\"c\"/>\0</plait_topology>";
    struct plait_topo *t;
    cr_assert_eq(plait_topo_load_xml_buffer(nul, sizeof(nul) - 1, "t.xml", &t), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(plait_last_error_get(), "t.xml:3: NUL byte in the text");
}

Test(topo_xml, malformed_attributes)
{
    expect_error("<plait_topology>\n<cpu name=\"a\" name=\"b\"/>\n</plait_topology>", 2, "two attributes name");
    expect_error("<plait_topology>\n<cpu name=c/>\n</plait_topology>", 2, "value must be in quotes");
    expect_error("<plait_topology>\n<cpu name/>\n</plait_topology>", 2, "has no value");
    expect_error("<plait_topology>\n<cpu name=\"a\"model=\"b\"/>\n</plait_topology>", 2, "separated by white space");
    expect_error("<plait_topology>\n<cpu name=\"a\nb/>\n", 4, "not closed by \"");
    expect_error("<plait_topology>\n<cpu name=\"a<b\"/>\n</plait_topology>", 2, "'<' in a value");
    expect_error("<plait_topology>\n<cpu name=\"&foo;\"/>\n</plait_topology>", 2, "unknown entity &foo;");
    expect_error("<plait_topology>\n<cpu name=\"a & b\"/>\n</plait_topology>", 2, "does not start an entity");
    expect_error("<plait_topology>\n<cpu name=\"&#0;\"/>\n</plait_topology>", 2, "not an XML character");
    expect_error("<plait_topology>\n<cpu name=\"&#xd800;\"/>\n</plait_topology>", 2, "not an XML character");
    expect_error("<plait_topology>\n<cpu name=\"&#x110000;\"/>\n</plait_topology>", 2, "not an XML character");
    expect_error("<plait_topology>\n<cpu name=\"&#12a;\"/>\n</plait_topology>", 2, "is not a number");
    expect_error("<plait_topology>\n<cpu name=\"&#;\"/>\n</plait_topology>", 2, "has no digits");
    /* Over-long names and values. */
    char xml[8192], name[80], value[1100];
    memset(name, 'e', 65);
    name[65] = '\0';
    snprintf(xml, sizeof(xml), "<plait_topology>\n<%s/>\n</plait_topology>", name);
    expect_error(xml, 2, "longer than 64 characters");
    snprintf(xml, sizeof(xml), "<plait_topology>\n<cpu %s=\"1\"/>\n</plait_topology>", name);
    expect_error(xml, 2, "longer than 64 characters");
    memset(value, 'v', 1025);
    value[1025] = '\0';
    snprintf(xml, sizeof(xml), "<plait_topology>\n<cpu name=\"%s\"/>\n</plait_topology>", value);
    expect_error(xml, 2, "longer than 1024 characters");
    /* Too many attributes on one element. */
    size_t o = (size_t)snprintf(xml, sizeof(xml), "<plait_topology>\n<cpu");
    for (int i = 0; i < 65; i++)
        o += (size_t)snprintf(xml + o, sizeof(xml) - o, " a%d=\"1\"", i);
    snprintf(xml + o, sizeof(xml) - o, "/>\n</plait_topology>");
    expect_error(xml, 2, "more than 64 attributes");
}

Test(topo_xml, too_deep_and_too_large)
{
    char *xml = malloc(1 << 20);
    size_t o = 0;
    for (int i = 0; i < 65; i++)
        o += (size_t)sprintf(xml + o, "<e%d>\n", i);
    for (int i = 64; i >= 0; i--)
        o += (size_t)sprintf(xml + o, "</e%d>\n", i);
    expect_error(xml, 65, "nested deeper than 64");

    /* PLAIT_TOPO_MAX_NODES + 1 nodes: the one too many is named by its line. */
    o = (size_t)sprintf(xml, "<plait_topology>\n");
    for (int i = 0; i <= PLAIT_TOPO_MAX_NODES; i++)
        o += (size_t)sprintf(xml + o, "<pci name=\"p%d\"/>\n", i);
    sprintf(xml + o, "</plait_topology>\n");
    expect_error(xml, PLAIT_TOPO_MAX_NODES + 2, "more than 4096 nodes");
    free(xml);
}

/* ---------------------------------------------------------------- plait's format: content */

Test(topo_xml, out_of_range_attributes)
{
    expect_node_error("<gpu name=\"g\" sm=\"abc\"/>", 4, "<gpu> attribute sm=\"abc\" is not a number");
    expect_node_error("<gpu name=\"g\" sm=\" 90\"/>", 4, "is not a number");
    expect_node_error("<gpu name=\"g\" sm=\"90x\"/>", 4, "is not a number");
    expect_node_error("<gpu name=\"g\" sm=\"99999999999999999999\"/>", 4, "is not a number");
    expect_node_error("<gpu name=\"g\" sm=\"1001\"/>", 4, "is out of range (0..1000)");
    expect_node_error("<pci name=\"p\" gen=\"9\"/>", 4, "<pci> attribute gen=\"9\" is out of range (0..6)");
    expect_node_error("<pci name=\"p\" width=\"-1\"/>", 4, "width=\"-1\" is out of range");
    expect_node_error("<pci name=\"p\" kind=\"bridge\"/>", 4, "neither switch nor hostbridge");
    expect_node_error("<pci name=\"p\" vendor=\"0x10000\"/>", 4, "out of range (0..0xffff)");
    expect_node_error("<pci name=\"p\" vendor=\"10de \"/>", 4, "not a hexadecimal number");
    expect_node_error("<nic name=\"n\" speed=\"-1\"/>", 4, "speed=\"-1\" is out of range");
    expect_node_error("<nic name=\"n\" speed=\"1e400\"/>", 4, "is not a finite number");
    expect_node_error("<nic name=\"n\" speed=\"nan\"/>", 4, "is not a finite number");
    expect_node_error("<nic name=\"n\" speed=\"0x10\"/>", 4, "is not a finite number");
    expect_node_error("<nic name=\"n\" link_layer=\"RoCE\"/>", 4, "none of InfiniBand");
    expect_node_error("<nic name=\"n\" gdr=\"yes\"/>", 4, "is not 0 or 1");
    expect_node_error("<nic name=\"n\" guid=\"0xZZ\"/>", 4, "not a hexadecimal number");
    expect_node_error("<nic name=\"n\" guid=\"0x11112222333344445\"/>", 4, "not a hexadecimal number");
    expect_node_error("<nic name=\"n\" dev=\"a-very-long-device-name-of-40-chars\"/>", 4, "longer than 31");
    expect_node_error("<nic name=\"n\" port=\"256\"/>", 4, "out of range (0..255)");
    expect_node_error("<cpu name=\"c1\" memory=\"-1\"/>", 4, "memory=\"-1\" is not a number");
    expect_node_error("<cpu name=\"c1\" memory=\"18446744073709551616\"/>", 4, "out of range");
    expect_node_error("<cpu name=\"c1\" arch=\"x86_64-with-a-long-tail\"/>", 4, "longer than 15");
    expect_node_error("<cpu name=\"c1\" model=\"a&#9;b\"/>", 4, "control character");
    expect_node_error("<gpu name=\"g\" busid=\"junk\"/>", 4, "busid=\"junk\" is not a PCI address");
    expect_node_error("<gpu name=\"g\" busid=\"0000:18:00.0x\"/>", 4, "is not a PCI address");
    expect_node_error("<gpu name=\"g\" busid=\"0000:100:00.0\"/>", 4, "is not a PCI address");
    expect_node_error("<nvs name=\"s\" count=\"4097\"/>", 4, "out of range");
    expect_node_error("<gpu name=\"g\" numa=\"4096\"/>", 4, "out of range");
    /* Multi-line tags: the line is the attribute's. */
    expect_node_error("<gpu name=\"g\"\n     dev=\"0\"\n     sm=\"x\"/>", 6, "sm=\"x\"");
}

Test(topo_xml, names_and_references)
{
    expect_node_error("<gpu name=\"gpu0\"/>", 4, "name \"gpu0\" is already used by the <gpu> at line 3");
    expect_node_error("<nic name=\"cpu0\"/>", 4, "already used by the <cpu> at line 2");
    expect_node_error("<gpu/>", 4, "<gpu> has no name attribute");
    expect_node_error("<gpu name=\"\"/>", 4, "is not 1..31 characters");
    expect_node_error("<gpu name=\"a b\"/>", 4, "is not 1..31 characters");
    expect_node_error("<gpu name=\"abcdefghijabcdefghijabcdefghij12\"/>", 4, "is not 1..31 characters");
    expect_node_error("<gpu name=\"g\" colour=\"red\"/>", 4, "<gpu> has no attribute colour");
    expect_node_error("<nvs name=\"s\" sm=\"90\"/>", 4, "<nvs> has no attribute sm");
    expect_node_error("<switch name=\"s\"/>", 4, "unknown element <switch>");
    expect_node_error("<GPU name=\"s\"/>", 4, "unknown element <GPU>");
    expect_node_error("<gpu name=\"g\">\n<nvlink/>\n</gpu>", 5, "elements do not nest");
    expect_node_error("<link a=\"cpu0\" b=\"gpu1\" type=\"PCI\"/>", 4, "b=\"gpu1\" names no node defined before it");
    expect_node_error("<link a=\"gpu9\" b=\"cpu0\" type=\"PCI\"/>\n<gpu name=\"gpu9\"/>", 4,
                      "a=\"gpu9\" names no node defined before it");
    expect_node_error("<link b=\"cpu0\" type=\"PCI\"/>", 4, "<link> has no a attribute");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\"/>", 4, "<link> has no type attribute");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"USB\"/>", 4, "none of NVL, C2C, PCI, SYS, NET");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"PCI\" speed=\"1\"/>", 4, "<link> has no attribute speed");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"PCI\" bw=\"nan\"/>", 4, "bw=\"nan\" is not a finite number");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"PCI\" bw=\"inf\"/>", 4, "is not a finite number");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"PCI\" bw=\"0\"/>", 4, "out of range");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"PCI\" bw=\"1e7\"/>", 4, "out of range");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"PCI\" latency=\"-1\"/>", 4, "out of range");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"PCI\" lanes=\"2000\"/>", 4, "out of range (0..1024)");
    expect_node_error("<link a=\"gpu0\" b=\"gpu0\" type=\"NVL\"/>", 4, "to itself");
    expect_node_error("<link a=\"cpu0\" b=\"gpu0\" type=\"PCI\"/>\n<link a=\"gpu0\" b=\"cpu0\" type=\"PCI\"/>", 5,
                      "two PCI links");
    expect_error("<plait_topology version=\"2\"/>", 1, "version=\"2\" is not a version this plait reads");
    expect_error("<plait_topology hostname=\"x\"/>", 1, "has no attribute hostname");
    expect_error("<topology/>", 1, "root element <topology> is neither <plait_topology> nor <system>");
}

Test(topo_xml, validation_names_the_file)
{
    /* What only the whole graph can tell is plait_topo_validate's, prefixed with the name. */
    expect_node_error("<pci name=\"p\" numa=\"3\"/>", 0, "numa names no cpu node");
    expect_node_error("<cpu name=\"c1\"/>\n<link a=\"cpu0\" b=\"c1\" type=\"NVL\"/>", 0,
                      "a NVL link cannot join cpu node cpu0 and cpu node c1");
    expect_node_error("<nvs name=\"s\"/>\n<link a=\"s\" b=\"gpu0\" type=\"PCI\"/>", 0, "cannot join");
}

/* ---------------------------------------------------------------- NCCL's format */

static int count_links(const struct plait_topo *t, enum plait_topo_link_type type)
{
    int n = 0;
    for (int i = 0; i < t->nlinks; i++)
        n += t->links[i].type == type;
    return n;
}

static const struct plait_topo_link *find_link(const struct plait_topo *t, int a, int b,
                                               enum plait_topo_link_type type)
{
    for (int i = 0; i < t->nlinks; i++) {
        const struct plait_topo_link *l = &t->links[i];
        if (l->type == type && ((l->a == a && l->b == b) || (l->a == b && l->b == a)))
            return l;
    }
    return NULL;
}

/* The node a device's PCIe link goes up to. */
static int parent_of(const struct plait_topo *t, int n)
{
    for (int i = 0; i < t->nlinks; i++)
        if (t->links[i].type == PLAIT_LINK_PCI && t->links[i].b == n)
            return t->links[i].a;
    return -1;
}

Test(topo_xml, nccl_dgx_a100_like)
{
    struct plait_topo *t = load_fixture("nccl/dgx-a100-like.xml");
    cr_assert_str_eq(t->source, "nccl-xml");
    cr_assert_eq(t->counts[PLAIT_TOPO_CPU], 2);
    cr_assert_eq(t->counts[PLAIT_TOPO_PCI], 12);
    cr_assert_eq(t->counts[PLAIT_TOPO_GPU], 8);
    cr_assert_eq(t->counts[PLAIT_TOPO_NIC], 10);
    cr_assert_eq(t->counts[PLAIT_TOPO_NVS], 1, "the six NVSwitches are one node");

    /* CPUs by NUMA id: numaid 1 (listed second) is cpu0; affinity as a list. */
    int c0 = plait_topo_nth(t, PLAIT_TOPO_CPU, 0), c1 = plait_topo_nth(t, PLAIT_TOPO_CPU, 1);
    cr_assert_str_eq(t->nodes[c0].cpu.cpuset, "16-31,144-159");
    cr_assert_str_eq(t->nodes[c1].cpu.cpuset, "96-111,224-239");
    cr_assert_str_eq(t->nodes[c0].cpu.vendor, "AuthenticAMD");
    cr_assert_str_eq(t->nodes[c0].cpu.arch, "x86_64");
    cr_assert(find_link(t, c0, c1, PLAIT_LINK_SYS) != NULL);

    /* GPUs by CUDA index, on the NUMA node the file puts them. */
    int nvs = plait_topo_nth(t, PLAIT_TOPO_NVS, 0);
    cr_assert_eq(t->nodes[nvs].nvs.count, 6);
    for (int i = 0; i < 8; i++) {
        int g = plait_topo_nth(t, PLAIT_TOPO_GPU, i);
        const struct plait_topo_node *n = &t->nodes[g];
        cr_assert_eq(n->gpu.dev, i);
        cr_assert_eq(n->gpu.sm, 80);
        cr_assert_eq(n->gpu.nvlinks, 12);
        cr_assert_eq(n->numa, i < 4 ? 0 : 1, "gpu%d on NUMA %d", i, n->numa);
        cr_assert_eq(n->pci.gen, 4);
        cr_assert_eq(n->pci.width, 16);
        cr_assert_eq(n->pci.vendor, 0x10de);
        cr_assert_eq(n->pci.device, 0x20b0);
        const struct plait_topo_link *l = find_link(t, g, nvs, PLAIT_LINK_NVL);
        cr_assert_not_null(l, "gpu%d has no NVLink to the NVSwitch node", i);
        cr_assert_eq(l->lanes, 12);
        cr_assert_float_eq(l->bw, 12 * 25.0, 1e-9);
        /* GPU <- bridge <- switch <- CPU: two switch levels. */
        int br = parent_of(t, g), sw = parent_of(t, br);
        cr_assert_eq(t->nodes[br].type, PLAIT_TOPO_PCI);
        cr_assert_eq(t->nodes[sw].type, PLAIT_TOPO_PCI);
        cr_assert_eq(parent_of(t, sw), i < 4 ? c0 : c1);
        const struct plait_topo_link *up = find_link(t, br, g, PLAIT_LINK_PCI);
        cr_assert_eq(up->lanes, 16);
        cr_assert_float_eq(up->bw, plait_topo_pci_bw(4, 16), 1e-9);
    }
    cr_assert_eq(t->nodes[plait_topo_nth(t, PLAIT_TOPO_GPU, 0)].busid, plait_topo_busid_parse("0000:14:00.0"));

    /* NICs by NCCL's dev: Gb/s, InfiniBand from the PCI class, next to their GPUs' switch. */
    for (int i = 0; i < 10; i++) {
        const struct plait_topo_node *n = &t->nodes[plait_topo_nth(t, PLAIT_TOPO_NIC, i)];
        char dev[16];
        snprintf(dev, sizeof(dev), "mlx5_%d", i);
        cr_assert_str_eq(n->nic.dev, dev);
        cr_assert(n->nic.has_gdr);
        if (i < 8) {
            cr_assert_float_eq(n->nic.speed, 200.0, 1e-9);
            cr_assert_eq(n->nic.link_layer, PLAIT_LINK_LAYER_IB);
            cr_assert_eq(n->nic.port, 1);
            cr_assert_eq(n->numa, i < 4 ? 0 : 1);
            int g = plait_topo_nth(t, PLAIT_TOPO_GPU, i);
            cr_assert_eq(parent_of(t, plait_topo_nth(t, PLAIT_TOPO_NIC, i)), parent_of(t, parent_of(t, g)),
                         "nic%d is not on gpu%d's switch", i, i);
        }
    }
    /* The dual-port Ethernet card: two nodes, one address, each port its own speed. */
    const struct plait_topo_node *e8 = &t->nodes[plait_topo_nth(t, PLAIT_TOPO_NIC, 8)];
    const struct plait_topo_node *e9 = &t->nodes[plait_topo_nth(t, PLAIT_TOPO_NIC, 9)];
    cr_assert_eq(e8->nic.link_layer, PLAIT_LINK_LAYER_ETHERNET);
    cr_assert_eq(e8->busid, e9->busid);
    cr_assert_float_eq(e8->nic.speed, 200.0, 1e-9);
    cr_assert_float_eq(e9->nic.speed, 100.0, 1e-9);
    cr_assert_eq(e9->nic.port, 2);
    cr_assert_eq(e8->nic.guid, 0x1c34da0300a1c000ull);

    cr_assert_eq(count_links(t, PLAIT_LINK_PCI), 30);
    cr_assert_eq(count_links(t, PLAIT_LINK_NVL), 8);
    cr_assert_eq(t->nlinks, 39);
    plait_topo_free(t);
}

Test(topo_xml, nccl_pcie_2gpu)
{
    struct plait_topo *t = load_fixture("nccl/pcie-2gpu.xml");
    cr_assert_eq(t->counts[PLAIT_TOPO_CPU], 1);
    cr_assert_eq(t->counts[PLAIT_TOPO_PCI], 0);
    cr_assert_eq(t->counts[PLAIT_TOPO_GPU], 2);
    cr_assert_eq(t->counts[PLAIT_TOPO_NIC], 1);
    cr_assert_eq(t->counts[PLAIT_TOPO_NVS], 0);
    int c = plait_topo_nth(t, PLAIT_TOPO_CPU, 0);
    int g0 = plait_topo_nth(t, PLAIT_TOPO_GPU, 0), g1 = plait_topo_nth(t, PLAIT_TOPO_GPU, 1);
    cr_assert_str_eq(t->nodes[c].cpu.cpuset, "0-31");
    cr_assert_eq(t->nodes[g0].pci.gen, 3, "\"8 GT/s\" is gen3");
    cr_assert_eq(t->nodes[g1].pci.width, 8);
    const struct plait_topo_link *l = find_link(t, c, g1, PLAIT_LINK_PCI);
    cr_assert_not_null(l);
    cr_assert_float_eq(l->bw, plait_topo_pci_bw(3, 8), 1e-9);
    /* Both GPUs list the bridge: one link of 4 lanes. */
    l = find_link(t, g0, g1, PLAIT_LINK_NVL);
    cr_assert_not_null(l);
    cr_assert_eq(l->lanes, 4);
    cr_assert_eq(t->nodes[g0].gpu.nvlinks, 4);
    /* The NIC right under <cpu>: no PCI address, Mb/s -> Gb/s, NCCL's local bandwidth. */
    int nic = plait_topo_nth(t, PLAIT_TOPO_NIC, 0);
    cr_assert_str_eq(t->nodes[nic].nic.dev, "eno1");
    cr_assert_float_eq(t->nodes[nic].nic.speed, 10.0, 1e-9);
    cr_assert_eq(t->nodes[nic].busid, PLAIT_TOPO_NO_BUSID);
    l = find_link(t, c, nic, PLAIT_LINK_PCI);
    cr_assert_not_null(l);
    cr_assert_float_eq(l->bw, PLAIT_TOPO_LOC_BW, 1e-9);
    cr_assert_eq(t->nlinks, 4);
    plait_topo_free(t);
}

Test(topo_xml, nccl_gh200)
{
    struct plait_topo *t = load_fixture("nccl/gh200.xml");
    int c = plait_topo_nth(t, PLAIT_TOPO_CPU, 0), g = plait_topo_nth(t, PLAIT_TOPO_GPU, 0);
    cr_assert_str_eq(t->nodes[c].cpu.arch, "aarch64", "NCCL's arm64");
    cr_assert_str_eq(t->nodes[c].cpu.cpuset, "0-95");
    const struct plait_topo_link *l = find_link(t, g, c, PLAIT_LINK_C2C);
    cr_assert_not_null(l);
    cr_assert_eq(l->lanes, 10);
    cr_assert_float_eq(l->bw, 450.0, 1e-9, "10 x 45000 MB/s");
    int nvs = plait_topo_nth(t, PLAIT_TOPO_NVS, 0);
    cr_assert_geq(nvs, 0, "the invisible NVSwitch is still an nvs node");
    l = find_link(t, g, nvs, PLAIT_LINK_NVL);
    cr_assert_eq(l->lanes, 18);
    cr_assert_float_eq(l->bw, 18 * 25.0, 1e-9);
    const struct plait_topo_node *nic = &t->nodes[plait_topo_nth(t, PLAIT_TOPO_NIC, 0)];
    cr_assert_float_eq(nic->nic.speed, 400.0, 1e-9);
    cr_assert_eq(nic->pci.gen, 5);
    cr_assert_eq(t->nodes[g].busid, plait_topo_busid_parse("0009:01:00.0"));
    plait_topo_free(t);
}

#define NCCL_HEAD "<system version=\"1\">\n<cpu numaid=\"0\" arch=\"x86_64\">\n"
#define NCCL_TAIL "</cpu>\n</system>\n"

Test(topo_xml, nccl_details)
{
    /* Unknown elements and attributes are NCCL's business; a GPU listing a
     * peer the file does not hold is left without that link. */
    struct plait_topo *t = load_ok(
        "<system version=\"1\" extra=\"x\">\n"
        "<cpu numaid=\"1\" host_hash=\"0x1\" arch=\"x86_64\" unknown=\"y\">\n"
        "<pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"Unknown\" link_width=\"0\" future=\"1\">\n"
        "<gpu dev=\"0\" sm=\"70\" mlopart=\"0\"><nvlink target=\"0000:02:00.0\" count=\"6\" tclass=\"0x030200\"/>"
        "<nvlink target=\"0000:01:00.0\" count=\"0\" tclass=\"0x030200\"/><whatever/></gpu>\n"
        "</pci>\n"
        "<pci busid=\"0000:03:00.0\" class=\"0x010802\" link_speed=\"2.5 GT/s PCIe\" link_width=\"4\"/>\n"
        "<pci busid=\"0000:04:00.0\" class=\"0x020000\" link_speed=\"64.0 GT/s PCIe\" link_width=\"16\"/>\n"
        "<nic><net name=\"fused0\" dev=\"1\" net=\"0\"/><net name=\"nodev\"/><gin dev=\"3\"/></nic>\n"
        "<gpu dev=\"5\"/>\n"
        "</cpu>\n"
        "<cpu numaid=\"0\" host_hash=\"0x2\"/>\n"
        "<future/>\n"
        "</system>\n");
    cr_assert_eq(t->counts[PLAIT_TOPO_GPU], 1);
    cr_assert_eq(t->counts[PLAIT_TOPO_NIC], 0, "net=\"0\", no dev and <gin> make no NIC");
    cr_assert_eq(t->counts[PLAIT_TOPO_PCI], 1, "an NVMe drive is a PCI node, as in NCCL; a bare NIC is not");
    cr_assert_eq(t->counts[PLAIT_TOPO_CPU], 2);
    cr_assert_eq(count_links(t, PLAIT_LINK_NVL), 0);
    cr_assert_eq(count_links(t, PLAIT_LINK_SYS), 0, "CPUs of two hosts are not joined");
    int g = plait_topo_nth(t, PLAIT_TOPO_GPU, 0);
    cr_assert_eq(t->nodes[g].gpu.nvlinks, 6);
    cr_assert_eq(t->nodes[g].pci.gen, 0);
    cr_assert_eq(t->nodes[g].numa, 1, "numaid 1 sorts after numaid 0");
    const struct plait_topo_node *p = &t->nodes[plait_topo_nth(t, PLAIT_TOPO_PCI, 0)];
    cr_assert_eq(p->pci.gen, 1);
    cr_assert_eq(p->pci.width, 4);
    plait_topo_free(t);

    /* Without tclass: a target that is one of the file's GPUs is that GPU. */
    t = load_ok(NCCL_HEAD
                "<pci busid=\"0000:01:00.0\"><gpu dev=\"0\" sm=\"80\"><nvlink target=\"0000:02:00.0\" count=\"2\"/>"
                "<nvlink target=\"0000:02:00.0\" count=\"2\"/><nvlink target=\"0000:ff:00.0\" count=\"4\"/>"
                "<nvlink target=\"\" count=\"1\" tclass=\"0x068001\"/></gpu></pci>\n"
                "<pci busid=\"0000:02:00.0\"><gpu dev=\"1\" sm=\"80\"><nvlink target=\"0000:01:00.0\" count=\"3\"/>"
                "</gpu></pci>\n" NCCL_TAIL);
    int g0 = plait_topo_nth(t, PLAIT_TOPO_GPU, 0), g1 = plait_topo_nth(t, PLAIT_TOPO_GPU, 1);
    const struct plait_topo_link *l = find_link(t, g0, g1, PLAIT_LINK_NVL);
    cr_assert_not_null(l);
    cr_assert_eq(l->lanes, 4, "the larger of the two ends' counts");
    cr_assert_eq(t->counts[PLAIT_TOPO_NVS], 1);
    cr_assert_eq(find_link(t, g0, plait_topo_nth(t, PLAIT_TOPO_NVS, 0), PLAIT_LINK_NVL)->lanes, 4);
    cr_assert_eq(find_link(t, g0, plait_topo_nth(t, PLAIT_TOPO_CPU, 0), PLAIT_LINK_NVL)->lanes, 1);
    cr_assert_eq(t->nodes[g0].gpu.nvlinks, 9);
    plait_topo_free(t);

    /* NIC speeds NCCL writes as -1 or 0 mean unknown; port 0 is kept. */
    t = load_ok(NCCL_HEAD "<nic><net name=\"a\" dev=\"0\" speed=\"-1\" port=\"0\"/></nic>\n" NCCL_TAIL);
    cr_assert_float_eq(t->nodes[plait_topo_nth(t, PLAIT_TOPO_NIC, 0)].nic.speed, 0.0, 1e-12);
    plait_topo_free(t);

    /* CPUs numbered alternately between sockets: a long list, kept whole. */
    t = load_ok("<system><cpu affinity=\"55555555,55555555,55555555\"/></system>");
    cr_assert_str_eq(t->nodes[0].cpu.cpuset, "0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32,34,36,38,40,42,44,46,48,50,"
                                             "52,54,56,58,60,62,64,66,68,70,72,74,76,78,80,82,84,86,88,90,92,94");
    plait_topo_free(t);
    /* One that does not fit the field (320 CPUs, ~1400 characters) is left out, not an error. */
    {
        char doc[1024] = "<system><cpu affinity=\"";
        for (int w = 0; w < 20; w++)
            strcat(doc, w ? ",55555555" : "55555555");
        strcat(doc, "\"/></system>");
        t = load_ok(doc);
        cr_assert_str_eq(t->nodes[0].cpu.cpuset, "");
        plait_topo_free(t);
    }
    t = load_ok("<system><cpu affinity=\"00000001,80000000\" affinity_offset=\"64\"/></system>");
    cr_assert_str_eq(t->nodes[0].cpu.cpuset, "95-96");
    plait_topo_free(t);
}

Test(topo_xml, nccl_malformed)
{
    expect_error(NCCL_HEAD "<pci busid=\"0000:zz:00.0\" class=\"0x060400\"/>\n" NCCL_TAIL, 3,
                 "<pci> attribute busid=\"0000:zz:00.0\" is not a PCI address");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\" link_speed=\"fast\"/>\n" NCCL_TAIL, 3,
                 "link_speed=\"fast\" is not a PCIe link speed");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\" link_speed=\"20 GT/s\"/>\n" NCCL_TAIL, 3,
                 "is not a PCIe link speed");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\" link_width=\"64\"/>\n" NCCL_TAIL, 3, "out of range (0..32)");
    expect_error(NCCL_HEAD "<pci class=\"display\"/>\n" NCCL_TAIL, 3, "class=\"display\" is not a hexadecimal");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu dev=\"x\"/>\n</pci>\n" NCCL_TAIL, 4,
                 "<gpu> attribute dev=\"x\" is not a number");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu sm=\"eighty\"/>\n</pci>\n" NCCL_TAIL, 4,
                 "sm=\"eighty\" is not a number");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu>\n<nvlink target=\"0000:02:00.0\"/>\n</gpu>\n</pci>\n"
                 NCCL_TAIL, 5, "<nvlink> has no count attribute");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu>\n<nvlink count=\"two\"/>\n</gpu>\n</pci>\n" NCCL_TAIL,
                 5, "count=\"two\" is not a number");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu>\n<nvlink count=\"2\" tclass=\"0x030200\" "
                 "target=\"nope\"/>\n</gpu>\n</pci>\n" NCCL_TAIL, 5, "target=\"nope\" is not a PCI address");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu>\n<nvlink count=\"2\" tclass=\"0x030200\" "
                 "target=\"0000:01:00.0\"/>\n</gpu>\n</pci>\n" NCCL_TAIL, 5, "is the GPU itself");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu>\n<nvlink count=\"200\"/>\n<nvlink count=\"200\"/>\n"
                 "</gpu>\n</pci>\n" NCCL_TAIL, 6, "more than 256 NVLinks");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu>\n<c2c bw=\"a lot\" count=\"1\"/>\n</gpu>\n</pci>\n"
                 NCCL_TAIL, 5, "bw=\"a lot\" is not a number");
    expect_error(NCCL_HEAD "<pci busid=\"0000:01:00.0\">\n<gpu>\n<c2c bw=\"1000\"/>\n</gpu>\n</pci>\n" NCCL_TAIL, 5,
                 "<c2c> has no count attribute");
    expect_error(NCCL_HEAD "<nic>\n<net name=\"mlx5_0\" dev=\"0\" speed=\"fast\"/>\n</nic>\n" NCCL_TAIL, 4,
                 "<net> attribute speed=\"fast\" is not a number");
    expect_error(NCCL_HEAD "<nic>\n<net name=\"mlx5_0\" dev=\"0\" speed=\"-2\"/>\n</nic>\n" NCCL_TAIL, 4,
                 "out of range");
    expect_error(NCCL_HEAD "<nic>\n<net name=\"mlx5_0\" dev=\"0\" guid=\"0xq\"/>\n</nic>\n" NCCL_TAIL, 4,
                 "guid=\"0xq\" is not a hexadecimal number");
    expect_error(NCCL_HEAD "<nic>\n<net name=\"mlx5_0\" dev=\"0\" gdr=\"2\"/>\n</nic>\n" NCCL_TAIL, 4,
                 "gdr=\"2\" is out of range");
    expect_error(NCCL_HEAD "<nic>\n<net name=\"an-interface-name-longer-than-31\" dev=\"0\"/>\n</nic>\n" NCCL_TAIL, 4,
                 "longer than 31");
    expect_error("<system>\n<cpu numaid=\"zero\"/>\n</system>", 2, "numaid=\"zero\" is not a number");
    expect_error("<system>\n<cpu affinity=\"fffff,0x1\"/>\n</system>", 2, "is not a CPU mask");
    expect_error("<system>\n<cpu affinity=\"123456789\"/>\n</system>", 2, "is not a CPU mask");
    expect_error("<system>\n<cpu affinity=\"ff,,ff\"/>\n</system>", 2, "is not a CPU mask");
    expect_error("<system>\n<cpu host_hash=\"-1\"/>\n</system>", 2, "host_hash=\"-1\" is not a hexadecimal");
    expect_error("<system version=\"1\">\n</system>", 1, "<system> holds no <cpu>");
}
