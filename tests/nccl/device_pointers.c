/*
 * Device pointers through plait's libnccl.so.2 on a machine without a GPU
 * (issue 4, part 4): until plait has a CUDA backend, a CUDA device buffer must
 * fail cleanly (ncclInvalidUsage and a message), never be read as host memory.
 *
 *   nccl_device_pointers FAKE_LIBCUDA
 *
 * FAKE_LIBCUDA is fake_cuda.c built with the soname libcuda.so.1: once this
 * program has loaded it, the library finds "the CUDA driver" loaded (it never
 * loads one itself) and asks it about each buffer. Checks: host buffers work
 * before and after the driver appears; device memory as send or receive buffer
 * of collectives, point-to-point, registration, ncclMemFree and a premulsum
 * scalar is refused with a message naming it; managed memory runs on the CPU;
 * ncclMemAlloc refuses when the thread has a current CUDA context. Written
 * against NVIDIA's nccl.h, linked against plait's libnccl.so.2; one rank
 * (ncclCommInitAll). One line per check; exit 1 on any failure.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int failures;

static void say(int ok, const char *what, ncclResult_t r)
{
    const char *msg = ncclGetLastError(NULL);
    printf("%s: %s -> %d (%s)%s%s%s\n", ok ? "ok" : "FAIL", what, (int)r, ncclGetErrorString(r),
           r != ncclSuccess ? ": \"" : "", r != ncclSuccess ? msg : "", r != ncclSuccess ? "\"" : "");
    failures += !ok;
}

/* A refusal must be ncclInvalidUsage with a message that says why. */
static void expect_refused(ncclResult_t r, const char *what)
{
    const char *msg = ncclGetLastError(NULL);
    say(r == ncclInvalidUsage && msg && strstr(msg, "device memory"), what, r);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: %s FAKE_LIBCUDA\n", argv[0]);
        return 2;
    }
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitAll(&comm, 1, NULL);
    say(r == ncclSuccess, "ncclCommInitAll (1 rank)", r);
    if (r != ncclSuccess)
        return 1;
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    r = ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, NULL);
    say(r == ncclSuccess && y[3] == 4.0f, "host buffers, no CUDA driver loaded", r);

    void *drv = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!drv) {
        printf("FAIL: cannot load the fake driver %s: %s\n", argv[1], dlerror());
        return 1;
    }
    char *device = dlsym(drv, "fake_device"), *managed = dlsym(drv, "fake_managed");
    int *context_current = dlsym(drv, "fake_context_current");
    if (!device || !managed || !context_current || !dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
        printf("FAIL: %s does not look like the fake libcuda.so.1\n", argv[1]);
        return 1;
    }

    memset(y, 0, sizeof(y));
    r = ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, NULL);
    say(r == ncclSuccess && y[3] == 4.0f, "host buffers with the CUDA driver loaded", r);
    expect_refused(ncclAllReduce(device, y, 4, ncclFloat32, ncclSum, comm, NULL), "ncclAllReduce, device sendbuff");
    expect_refused(ncclAllReduce(x, device, 4, ncclFloat32, ncclSum, comm, NULL), "ncclAllReduce, device recvbuff");
    expect_refused(ncclBroadcast(device, device, 4, ncclFloat32, 0, comm, NULL), "ncclBroadcast in place on device memory");
    expect_refused(ncclBcast(device, 4, ncclFloat32, 0, comm, NULL), "ncclBcast on device memory");
    expect_refused(ncclAllGather(x, device, 4, ncclFloat32, comm, NULL), "ncclAllGather into device memory");
    expect_refused(ncclReduceScatter(device, y, 4, ncclFloat32, ncclSum, comm, NULL), "ncclReduceScatter from device memory");
    expect_refused(ncclAlltoAll(device, y, 4, ncclFloat32, comm, NULL), "ncclAlltoAll from device memory");
    expect_refused(ncclReduce(x, device, 4, ncclFloat32, ncclSum, 0, comm, NULL), "ncclReduce into device memory");
    expect_refused(ncclGather(device, y, 1, ncclFloat32, 0, comm, NULL), "ncclGather from device memory");
    expect_refused(ncclScatter(x, device, 1, ncclFloat32, 0, comm, NULL), "ncclScatter into device memory");
    expect_refused(ncclSend(device, 4, ncclFloat32, 0, comm, NULL), "ncclSend from device memory");
    expect_refused(ncclRecv(device, 4, ncclFloat32, 0, comm, NULL), "ncclRecv into device memory");
    void *handle = NULL;
    expect_refused(ncclCommRegister(comm, device, 1024, &handle), "ncclCommRegister of device memory");
    ncclRedOp_t op;
    expect_refused(ncclRedOpCreatePreMulSum(&op, device, ncclFloat32, ncclScalarDevice, comm),
                   "ncclRedOpCreatePreMulSum with the scalar in device memory");
    expect_refused(ncclMemFree(device), "ncclMemFree of device memory");

    /* Managed memory is reachable from the host: it runs on the CPU. */
    float *m = (float *)managed;
    for (int i = 0; i < 4; i++)
        m[i] = (float)(i + 1);
    r = ncclAllReduce(m, m + 8, 4, ncclFloat32, ncclSum, comm, NULL);
    say(r == ncclSuccess && m[8] == 1.0f && m[11] == 4.0f, "ncclAllReduce on managed memory", r);

    /* After the refusals the communicator still works. */
    memset(y, 0, sizeof(y));
    r = ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, NULL);
    say(r == ncclSuccess && y[0] == 1.0f, "host buffers after the refusals", r);

    void *p = NULL;
    r = ncclMemAlloc(&p, 100);
    say(r == ncclSuccess && p, "ncclMemAlloc without a current CUDA context (host memory)", r);
    if (p)
        ncclMemFree(p);
    *context_current = 1;
    p = NULL;
    r = ncclMemAlloc(&p, 100);
    const char *msg = ncclGetLastError(NULL);
    say(r == ncclInvalidUsage && !p && msg && strstr(msg, "CUDA"), "ncclMemAlloc with a current CUDA context", r);
    *context_current = 0;

    r = ncclCommDestroy(comm);
    say(r == ncclSuccess, "ncclCommDestroy", r);
    printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
