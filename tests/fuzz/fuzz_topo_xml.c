/* libFuzzer target for the topology XML loader (topology/xml.c, nccl_xml.c):
 * any input must load or fail cleanly (no crash, leak or undefined behaviour
 * under ASan/UBSan), and every input that loads must survive a round trip:
 * dump, reload, and compare field by field, so that the dumper is fuzzed too.
 * The same input goes through the hwloc XML rewriter (topology/hwloc_xml.c).
 * Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topology/discover.h"
#include "base/log.h"
#include "topology/topo.h"
#include "topology/xml_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct plait_topo *t = NULL, *back = NULL;
    char *xml = NULL;
    char why[512];
    /* The hwloc XML rewriter (topology/hwloc_xml.c) on the same input: no
     * crash, failures name the input, and what it writes is a fixed point
     * (rewritten again, it stays byte for byte the same). */
    char *rw = NULL, *rw2 = NULL;
    size_t rw_len = 0, rw2_len = 0;
    if (plait_disc_hwloc_xml_rewrite((const char *)data, size, "fuzz.xml", &rw, &rw_len) == PLAIT_SUCCESS) {
        if (plait_disc_hwloc_xml_rewrite(rw, rw_len, "rewritten.xml", &rw2, &rw2_len) != PLAIT_SUCCESS) {
            fprintf(stderr, "the rewrite does not rewrite: %s\n%s", plait_last_error_get(), rw);
            abort();
        }
        if (rw2_len != rw_len || memcmp(rw, rw2, rw_len) != 0) {
            fprintf(stderr, "rewrite(rewrite(x)) != rewrite(x):\n%s\n----\n%s", rw, rw2);
            abort();
        }
        free(rw2);
        free(rw);
    } else if (strstr(plait_last_error_get(), "fuzz.xml") == NULL) {
        fprintf(stderr, "hwloc XML rewrite error without the input's name: %s\n", plait_last_error_get());
        abort();
    }
    if (plait_topo_load_xml_buffer((const char *)data, size, "fuzz.xml", &t) != PLAIT_SUCCESS) {
        /* Every failure must say where: "fuzz.xml:LINE: ..." or "fuzz.xml: ...". */
        if (strncmp(plait_last_error_get(), "fuzz.xml:", 9) != 0) {
            fprintf(stderr, "error without the input's name: %s\n", plait_last_error_get());
            abort();
        }
        return 0;
    }
    if (plait_topo_dump_xml_buffer(t, &xml) != PLAIT_SUCCESS) {
        fprintf(stderr, "a loaded graph does not dump: %s\n", plait_last_error_get());
        abort();
    }
    if (plait_topo_load_xml_buffer(xml, strlen(xml), "dump.xml", &back) != PLAIT_SUCCESS) {
        fprintf(stderr, "a dump does not reload: %s\n%s", plait_last_error_get(), xml);
        abort();
    }
    if (!plait_topo_xml_equal(t, back, why, sizeof(why))) {
        fprintf(stderr, "load(dump(g)) != g: %s\n%s", why, xml);
        abort();
    }
    free(xml);
    plait_topo_free(back);
    plait_topo_free(t);
    return 0;
}
