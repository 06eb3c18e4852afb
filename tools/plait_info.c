/* plait-info: the library's version, features, and every environment variable
 * it reads with its default, its value here, and its meaning (the same table
 * docs/env.md mirrors). `plait-info --markdown` prints that table as markdown. */
#include <stdio.h>
#include <string.h>

#include "env.h"
#include "plait.h"
#include "plait_config.h"

int main(int argc, char **argv)
{
    int markdown = argc > 1 && strcmp(argv[1], "--markdown") == 0;
    if (argc > 1 && !markdown) {
        fprintf(stderr, "usage: plait-info [--markdown]\n");
        return 2;
    }
    if (markdown) {
        printf("| variable | NCCL twin | default | meaning |\n|---|---|---|---|\n");
        for (size_t i = 0; i < plait_env_table_len; i++) {
            const struct plait_env_var *v = &plait_env_table[i];
            printf("| `%s` | %s%s%s | %s%s%s | %s |\n", v->name, v->nccl_name ? "`" : "",
                   v->nccl_name ? v->nccl_name : "", v->nccl_name ? "`" : "", v->deflt[0] ? "`" : "", v->deflt,
                   v->deflt[0] ? "`" : "", v->doc);
        }
        return 0;
    }
    int version = 0;
    plait_get_version(&version);
    printf("plait %d.%d.%d (version code %d)\n", version / 10000, version / 100 % 100, version % 100, version);
    printf("build: CUDA toolkit %s (the CUDA backend is not part of this release), UCX %s, ibverbs %s\n", PLAIT_HAVE_CUDA ? "found" : "absent",
           PLAIT_HAVE_UCX ? "found" : "absent", PLAIT_HAVE_IBVERBS ? "found" : "absent");
    printf("\nenvironment (PLAIT_ wins over its NCCL_ twin):\n");
    for (size_t i = 0; i < plait_env_table_len; i++) {
        const struct plait_env_var *v = &plait_env_table[i];
        const char *val = plait_env_get(v->name);
        printf("  %-20s = %-12s (default %s%s%s)\n      %s\n", v->name, val ? val : "(unset)",
               v->deflt[0] ? v->deflt : "none", v->nccl_name ? "; also read as " : "",
               v->nccl_name ? v->nccl_name : "", v->doc);
    }
    return 0;
}
