/* plait-info: the library's version, what this build contains, and every
 * environment variable it reads with its default, its value here, what a
 * numeric one accepts, and its meaning (the same tables docs/env.md mirrors).
 * `plait-info --markdown` prints the variables' table as markdown,
 * `plait-info --markdown-numbers` the table of numeric values. */
#include <stdio.h>
#include <string.h>

#include "base/env.h"
#include "plait.h"
#include "plait_config.h"

static const char *form_name(enum plait_env_form form)
{
    switch (form) {
    case PLAIT_ENV_BYTES:
        return "bytes (K, M, G suffixes)";
    case PLAIT_ENV_SECONDS:
        return "seconds (fraction allowed)";
    default:
        return "integer";
    }
}

int main(int argc, char **argv)
{
    const int markdown = argc > 1 && strcmp(argv[1], "--markdown") == 0;
    const int numbers = argc > 1 && strcmp(argv[1], "--markdown-numbers") == 0;
    if (argc > 2 || (argc > 1 && !markdown && !numbers)) {
        fprintf(stderr, "usage: plait-info [--markdown | --markdown-numbers]\n");
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
    if (numbers) {
        printf("| variable | form | accepted values |\n|---|---|---|\n");
        for (size_t i = 0; i < plait_env_numbers_len; i++) {
            const struct plait_env_number *n = &plait_env_numbers[i];
            char range[96];
            plait_env_number_range(n, range, sizeof(range));
            printf("| `%s` | %s | %s |\n", n->name, form_name(n->form), range);
        }
        return 0;
    }
    int version = 0;
    plait_get_version(&version);
    printf("plait %d.%d.%d (version code %d)\n", version / 10000, version / 100 % 100, version % 100, version);
    /* What this build holds, as the code has it (meson.build, core/cuda/):
     * the CUDA backend is always built and loads the driver at run time; its
     * kernels need nvcc at build time. */
    printf("build:\n");
    if (PLAIT_HAVE_CUDA)
        printf("  CUDA backend: yes (driver loaded at run time, PLAIT_CUDA); device kernels: compiled for "
               "compute capabilities %s\n",
               PLAIT_GPU_ARCHS);
    else
        printf("  CUDA backend: yes (driver loaded at run time, PLAIT_CUDA); device kernels: none (built without "
               "nvcc): collectives on device buffers fail with an error, host buffers are unaffected\n");
    printf("  transports: shm, inproc, net (net providers: socket, TCP); no UCX or InfiniBand provider yet (UCX "
           "%s, ibverbs %s at build time)\n",
           PLAIT_HAVE_UCX ? "found" : "absent", PLAIT_HAVE_IBVERBS ? "found" : "absent");
    printf("\nenvironment (PLAIT_ wins over its NCCL_ twin):\n");
    for (size_t i = 0; i < plait_env_table_len; i++) {
        const struct plait_env_var *v = &plait_env_table[i];
        const char *val = plait_env_get(v->name);
        printf("  %-20s = %-12s (default %s%s%s)\n", v->name, val ? val : "(unset)", v->deflt[0] ? v->deflt : "none",
               v->nccl_name ? "; also read as " : "", v->nccl_name ? v->nccl_name : "");
        const struct plait_env_number *n = plait_env_number_find(v->name);
        if (n) {
            char range[96];
            plait_env_number_range(n, range, sizeof(range));
            /* As base/env.c's parser: NCCL's spellings take hexadecimal too. */
            const char *nccl = v->nccl_name ? v->nccl_name : strncmp(v->name, "NCCL_", 5) == 0 ? v->name : NULL;
            printf("      accepts: %s, %s", form_name(n->form), range);
            if (nccl && n->form != PLAIT_ENV_SECONDS)
                printf("; %s also 0x and hexadecimal digits, as NCCL reads it", nccl);
            printf("\n");
        }
        printf("      %s\n", v->doc);
    }
    return 0;
}
