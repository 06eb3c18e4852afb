/* API misuse through plait's libnccl.so.2: a destroyed, an aborted and a
 * garbage ncclComm_t, and counts whose byte sizes cannot be a buffer, return
 * ncclInvalidArgument (ncclInvalidUsage for an aborted communicator, as
 * before) with a message naming the argument; never a crash. Linked against
 * the shim, with its own declarations (compat/nccl_abi.h). */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compat/nccl_abi.h"

#define EXPECT_NCCL(call, code, word)                                                                             \
    do {                                                                                                          \
        ncclResult_t r_ = (call);                                                                                 \
        cr_expect_eq(r_, code, "%s returned %d (%s), expected %d", #call, r_, ncclGetErrorString(r_), code);     \
        cr_expect(strstr(ncclGetLastError(NULL), word) != NULL, "%s: message \"%s\" does not name \"%s\"", #call, \
                  ncclGetLastError(NULL), word);                                                                  \
    } while (0)

static void stale_calls(ncclComm_t c, ncclResult_t code, const char *word)
{
    float x[4] = {0}, y[4];
    int v;
    ncclResult_t ae;
    EXPECT_NCCL(ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, c, NULL), code, word);
    EXPECT_NCCL(ncclBroadcast(x, y, 4, ncclFloat32, 0, c, NULL), code, word);
    EXPECT_NCCL(ncclAllGather(x, y, 1, ncclFloat32, c, NULL), code, word);
    EXPECT_NCCL(ncclSend(x, 1, ncclFloat32, 0, c, NULL), code, word);
    EXPECT_NCCL(ncclCommCount(c, &v), code, word);
    EXPECT_NCCL(ncclCommUserRank(c, &v), code, word);
    EXPECT_NCCL(ncclCommCuDevice(c, &v), code, word);
    EXPECT_NCCL(ncclCommGetAsyncError(c, &ae), code, word);
    EXPECT_NCCL(ncclCommFinalize(c), code, word);
    EXPECT_NCCL(ncclCommDestroy(c), code, word);
    EXPECT_NCCL(ncclCommAbort(c), code, word);
    cr_expect_not_null(ncclGetLastError(c));
}

Test(nccl_misuse, destroyed_and_garbage_comms, .timeout = 60)
{
    ncclComm_t c[2];
    cr_assert_eq(ncclCommInitAll(c, 2, NULL), ncclSuccess, "%s", ncclGetLastError(NULL));
    cr_assert_eq(ncclCommDestroy(c[0]), ncclSuccess);
    cr_assert_eq(ncclCommDestroy(c[1]), ncclSuccess);
    stale_calls(c[0], ncclInvalidArgument, "comm");
    /* a new communicator is not taken for a destroyed one */
    ncclComm_t fresh;
    cr_assert_eq(ncclCommInitAll(&fresh, 1, NULL), ncclSuccess, "%s", ncclGetLastError(NULL));
    cr_expect(fresh != c[0] && fresh != c[1], "a new communicator got a destroyed one's address");
    if (fresh != c[0])
        stale_calls(c[0], ncclInvalidArgument, "comm");
    static uint64_t junk[512];
    memset(junk, 0x5a, sizeof(junk));
    stale_calls((ncclComm_t)(uintptr_t)0x10, ncclInvalidArgument, "comm");
    stale_calls((ncclComm_t)junk, ncclInvalidArgument, "comm");
    /* an aborted one: the usage error it always was */
    ncclComm_t a;
    cr_assert_eq(ncclCommInitAll(&a, 1, NULL), ncclSuccess, "%s", ncclGetLastError(NULL));
    cr_assert_eq(ncclCommAbort(a), ncclSuccess);
    stale_calls(a, ncclInvalidUsage, "abort");
    float x[4] = {1, 2, 3, 4}, y[4];
    cr_expect_eq(ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, fresh, NULL), ncclSuccess, "%s",
                 ncclGetLastError(NULL));
    cr_expect_eq(ncclCommDestroy(fresh), ncclSuccess);
}

Test(nccl_misuse, count_overflow, .timeout = 60)
{
    ncclComm_t c;
    cr_assert_eq(ncclCommInitAll(&c, 1, NULL), ncclSuccess, "%s", ncclGetLastError(NULL));
    static float x[16], y[16];
    EXPECT_NCCL(ncclAllReduce(x, y, SIZE_MAX / 8, ncclFloat32, ncclSum, c, NULL), ncclInvalidArgument, "count");
    EXPECT_NCCL(ncclReduce(x, y, SIZE_MAX / 8, ncclFloat32, ncclSum, 0, c, NULL), ncclInvalidArgument, "count");
    EXPECT_NCCL(ncclBcast(x, SIZE_MAX / 8, ncclFloat32, 0, c, NULL), ncclInvalidArgument, "count");
    EXPECT_NCCL(ncclAllGather(x, y, SIZE_MAX / 8, ncclFloat32, c, NULL), ncclInvalidArgument, "count");
    EXPECT_NCCL(ncclAlltoAll(x, y, SIZE_MAX / 8, ncclFloat32, c, NULL), ncclInvalidArgument, "count");
    EXPECT_NCCL(ncclRecv(y, SIZE_MAX / 8, ncclFloat32, 0, c, NULL), ncclInvalidArgument, "count");
    cr_expect_eq(ncclAllReduce(x, y, 16, ncclFloat32, ncclSum, c, NULL), ncclSuccess, "%s", ncclGetLastError(NULL));
    cr_expect_eq(ncclCommDestroy(c), ncclSuccess);
}
