/* plait-info as a user runs it: what it says of this build is what this build
 * is (plait_config.h, the CUDA backend that is always built, the transports
 * that exist), and nothing it prints is stale. */
#include <criterion/criterion.h>
#include <string.h>

#include "plait_config.h"
#include "tests/tool_run.h"

static struct run info(const char *arg)
{
    const char *tool = tool_run_path("PLAIT_TEST_INFO_TOOL", "plait-info");
    const char *const args[] = {arg, NULL};
    struct run r = tool_run(tool, "plait-info", 30, arg ? args : args + 1);
    cr_assert_eq(r.status, 0, "%s exited with %d:\n%s", r.cmd, r.status, r.err);
    return r;
}

Test(info_tool, build_features_are_true)
{
    struct run r = info(NULL);
    cr_expect(strstr(r.out, "not part of this release") == NULL,
              "plait-info says the CUDA backend is not part of this release; it is built (core/cuda/):\n%s", r.out);
    cr_expect(strstr(r.out, "CUDA backend: yes") != NULL, "no line saying the CUDA backend is built:\n%.600s", r.out);
    if (PLAIT_HAVE_CUDA) {
        char want[160];
        snprintf(want, sizeof(want), "device kernels: compiled for compute capabilities %s", PLAIT_GPU_ARCHS);
        cr_expect(strstr(r.out, want) != NULL, "nvcc built the kernels, but plait-info does not say \"%s\":\n%.600s",
                  want, r.out);
    } else {
        cr_expect(strstr(r.out, "device kernels: none (built without nvcc)") != NULL,
                  "built without nvcc, but plait-info does not say there are no device kernels:\n%.600s", r.out);
    }
    /* UCX and ibverbs are only detected: no net provider uses them. */
    cr_expect(strstr(r.out, "transports: shm, inproc, net (net providers: socket, TCP); no UCX or InfiniBand "
                            "provider yet") != NULL,
              "the transports line is not the transports plait has:\n%.600s", r.out);
    run_free(&r);
}

Test(info_tool, numeric_variables_say_what_they_accept)
{
    struct run r = info(NULL);
    cr_expect(strstr(r.out, "accepts: seconds (fraction allowed), 0..1000000000") != NULL,
              "PLAIT_TIMEOUT's accepted values are not printed:\n%.2000s", r.out);
    cr_expect(strstr(r.out, "accepts: bytes (K, M, G suffixes), 4K..1G; NCCL_BUFFSIZE also 0x and hexadecimal "
                            "digits, as NCCL reads it") != NULL,
              "PLAIT_BUFFSIZE's line does not say that NCCL_BUFFSIZE takes hexadecimal:\n%.4000s", r.out);
    run_free(&r);
    r = info("--markdown-numbers");
    cr_expect(strstr(r.out, "| `PLAIT_CUDA` | integer | auto or 0..1 |") != NULL, "%s", r.out);
    run_free(&r);
}

Test(info_tool, usage_error)
{
    const char *tool = tool_run_path("PLAIT_TEST_INFO_TOOL", "plait-info");
    const char *const args[] = {"--bogus", NULL};
    struct run r = tool_run(tool, "plait-info", 30, args);
    cr_expect_eq(r.status, 2, "plait-info --bogus exited with %d", r.status);
    cr_expect(strstr(r.err, "usage: plait-info") != NULL, "%s", r.err);
    run_free(&r);
}
