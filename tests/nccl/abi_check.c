/*
 * ABI identity of plait's libnccl.so.2 with NVIDIA's NCCL 2.28 (issue 4, part 2).
 *
 * abi_nvidia.c and abi_ours.c evaluate the same list of expressions
 * (abi_entries.h) against NVIDIA's nccl.h and against plait's compat/nccl_abi.h,
 * in separate translation units because both headers declare the same names.
 * This compares the two tables: sizes and offsets of ncclUniqueId,
 * ncclConfig_t and ncclSimInfo_t, what their initializers write, every
 * enumerator (results, data types, ops, scalar residence), the constants
 * (NCCL_SPLIT_NOCOLOR, NCCL_CONFIG_UNDEF_INT, ...), and every prototype.
 * Versions must be at least 2.28.0 rather than equal, so that a newer NCCL
 * toolkit does not fail the test. One line per entry; exit 1 on any mismatch.
 */
#include <stdio.h>
#include <string.h>

#include "tests/nccl/abi_entry.h"

int main(void)
{
    static struct abi_entry nv[ABI_MAX_ENTRIES], ours[ABI_MAX_ENTRIES];
    int n_nv = abi_collect_nvidia(nv);
    int n_ours = abi_collect_ours(ours);
    int failed = 0;
    if (n_nv != n_ours) {
        printf("FAIL: the two tables differ in length (%d and %d): abi_entries.h was compiled differently\n", n_nv,
               n_ours);
        return 1;
    }
    for (int i = 0; i < n_nv; i++) {
        const struct abi_entry *a = &nv[i], *b = &ours[i];
        int ok;
        if (strcmp(a->what, b->what) != 0) {
            printf("FAIL: entry %d is \"%s\" for NVIDIA and \"%s\" for plait\n", i, a->what, b->what);
            failed++;
            continue;
        }
        switch (a->kind) {
        case ABI_AT_LEAST:
            ok = b->value >= 22800 && a->value >= 22800;
            printf("%s: %s: NVIDIA %lld, plait %lld (at least 22800)\n", ok ? "ok" : "FAIL", a->what, a->value,
                   b->value);
            break;
        case ABI_TRUE:
            ok = a->value == 1 && b->value == 1;
            if (ok)
                printf("ok: %s\n", a->what);
            else
                printf("FAIL: %s: %s\n", a->what,
                       a->value != 1 && b->value != 1 ? "in neither header (the test's signature is wrong)"
                       : a->value != 1                ? "not in NVIDIA's header (the test's signature is wrong)"
                                                      : "plait's prototype differs from NVIDIA's");
            break;
        default:
            ok = a->value == b->value;
            printf("%s: %s = %lld%s", ok ? "ok" : "FAIL", a->what, a->value, ok ? "\n" : "");
            if (!ok)
                printf(" in NVIDIA's nccl.h, %lld in plait's\n", b->value);
            break;
        }
        failed += !ok;
    }
    printf("%d ABI facts compared, %d differ\n", n_nv, failed);
    return failed ? 1 : 0;
}
