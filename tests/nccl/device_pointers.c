/*
 * Device pointers through plait's libnccl.so.2, with a fake CUDA driver that
 * plait itself does not use (issue 4, part 4; the CUDA backend's routing).
 *
 *   nccl_device_pointers FAKE_LIBCUDA
 *
 * FAKE_LIBCUDA is fake_cuda.c built with the soname libcuda.so.1. It is loaded
 * by this program after the communicator exists, so the library finds "the
 * CUDA driver" loaded (it never loads one itself) and asks it about each
 * buffer, while plait, which found no driver at init, has no CUDA backend.
 * Checks: host buffers work before and after the driver appears; device and
 * managed memory as a buffer of any collective or point-to-point call, on the
 * NULL stream or a CUDA stream, is handed to plait's CUDA backend (here:
 * refused with ncclInvalidUsage and a message, never read as host memory);
 * ncclCommRegister records device memory; a premulsum scalar in device memory
 * is refused; ncclMemAlloc/ncclMemFree use the driver's cuMemAlloc_v2 and
 * cuMemFree_v2 under a current context and host memory without one;
 * ncclCommCuDevice is -1 for a communicator made without a context and the
 * context's device (cuCtxGetDevice) otherwise, also when the creation is
 * deferred to ncclGroupEnd (the creating thread gets the caller's context).
 * Written against NVIDIA's nccl.h, linked against plait's libnccl.so.2.
 * One line per check; exit 1 on any failure. The real routing to the CUDA
 * backend, with results, is tested on the CUDA test double (device_double.c).
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <stdint.h>
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

/* Handed to the CUDA backend, which this process's plait lacks: ncclInvalidUsage
 * with a message that says so. */
static void expect_to_cuda(ncclResult_t r, const char *what)
{
    const char *msg = ncclGetLastError(NULL);
    say(r == ncclInvalidUsage && msg && strstr(msg, "device memory") && strstr(msg, "CUDA backend"), what, r);
}

static int within(const void *p, const char *base, size_t bytes)
{
    return (uintptr_t)p >= (uintptr_t)base && (uintptr_t)p < (uintptr_t)base + bytes;
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
    int *context_current = dlsym(drv, "fake_context_current"), *allocs = dlsym(drv, "fake_allocs");
    int *frees = dlsym(drv, "fake_frees"), *set_current_calls = dlsym(drv, "fake_set_current_calls");
    if (!device || !managed || !context_current || !allocs || !frees || !set_current_calls ||
        !dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
        printf("FAIL: %s does not look like the fake libcuda.so.1\n", argv[1]);
        return 1;
    }
    /* A CUDA stream handle: the library only passes it on. */
    cudaStream_t stream = (cudaStream_t)(void *)(device + 64);

    memset(y, 0, sizeof(y));
    r = ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, NULL);
    say(r == ncclSuccess && y[3] == 4.0f, "host buffers with the CUDA driver loaded", r);
    r = ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, stream);
    say(r == ncclSuccess && y[3] == 4.0f, "host buffers with a CUDA stream (not used)", r);
    memset(y, 0, sizeof(y));
    expect_to_cuda(ncclAllReduce(device, y, 4, ncclFloat32, ncclSum, comm, NULL), "ncclAllReduce, device sendbuff");
    say(y[0] == 0.0f, "the refused call left the host recvbuff alone", ncclSuccess);
    expect_to_cuda(ncclAllReduce(x, device, 4, ncclFloat32, ncclSum, comm, stream), "ncclAllReduce, device recvbuff");
    expect_to_cuda(ncclBroadcast(device, device, 4, ncclFloat32, 0, comm, stream), "ncclBroadcast in place on device memory");
    expect_to_cuda(ncclBcast(device, 4, ncclFloat32, 0, comm, NULL), "ncclBcast on device memory");
    expect_to_cuda(ncclAllGather(x, device, 4, ncclFloat32, comm, stream), "ncclAllGather into device memory");
    expect_to_cuda(ncclReduceScatter(device, y, 4, ncclFloat32, ncclSum, comm, NULL), "ncclReduceScatter from device memory");
    expect_to_cuda(ncclAlltoAll(device, y, 4, ncclFloat32, comm, stream), "ncclAlltoAll from device memory");
    expect_to_cuda(ncclReduce(x, device, 4, ncclFloat32, ncclSum, 0, comm, NULL), "ncclReduce into device memory");
    expect_to_cuda(ncclGather(device, y, 1, ncclFloat32, 0, comm, stream), "ncclGather from device memory");
    expect_to_cuda(ncclScatter(x, device, 1, ncclFloat32, 0, comm, NULL), "ncclScatter into device memory");
    expect_to_cuda(ncclSend(device, 4, ncclFloat32, 0, comm, stream), "ncclSend from device memory");
    expect_to_cuda(ncclRecv(device, 4, ncclFloat32, 0, comm, NULL), "ncclRecv into device memory");
    /* Managed memory belongs to the CUDA backend too. */
    expect_to_cuda(ncclAllReduce(managed, managed + 64, 4, ncclFloat32, ncclSum, comm, stream),
                   "ncclAllReduce on managed memory");

    void *handle = NULL;
    r = ncclCommRegister(comm, device, 1024, &handle);
    say(r == ncclSuccess && handle, "ncclCommRegister of device memory (recorded)", r);
    if (handle) {
        r = ncclCommDeregister(comm, handle);
        say(r == ncclSuccess, "ncclCommDeregister of it", r);
    }
    ncclRedOp_t op;
    r = ncclRedOpCreatePreMulSum(&op, device, ncclFloat32, ncclScalarDevice, comm);
    const char *msg = ncclGetLastError(NULL);
    say(r == ncclInvalidUsage && msg && strstr(msg, "device memory") && strstr(msg, "host"),
        "ncclRedOpCreatePreMulSum with the scalar in device memory is refused", r);

    /* After the refusals the communicator still works. */
    memset(y, 0, sizeof(y));
    r = ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, NULL);
    say(r == ncclSuccess && y[0] == 1.0f, "host buffers after the refusals", r);
    int dev = -2;
    r = ncclCommCuDevice(comm, &dev);
    say(r == ncclSuccess && dev == -1, "ncclCommCuDevice of a communicator made without a context: -1", r);

    void *p = NULL;
    int a0 = *allocs, f0 = *frees;
    r = ncclMemAlloc(&p, 100);
    say(r == ncclSuccess && p && !within(p, device, 1 << 20) && *allocs == a0,
        "ncclMemAlloc without a current CUDA context (host memory)", r);
    if (p) {
        r = ncclMemFree(p);
        say(r == ncclSuccess && *frees == f0, "ncclMemFree of host memory (free)", r);
    }
    *context_current = 1;
    p = NULL;
    r = ncclMemAlloc(&p, 100);
    say(r == ncclSuccess && within(p, device, 1 << 20) && *allocs == a0 + 1,
        "ncclMemAlloc with a current CUDA context: cuMemAlloc_v2", r);
    r = ncclMemFree(p);
    say(r == ncclSuccess && *frees == f0 + 1, "ncclMemFree of it: cuMemFree_v2", r);

    /* Communicators made with a current context take its device (3 in the
     * fake driver); plait, without a driver of its own, makes them host ones. */
    ncclUniqueId id;
    ncclComm_t c1 = NULL, c2 = NULL;
    r = ncclGetUniqueId(&id);
    if (r == ncclSuccess)
        r = ncclCommInitRank(&c1, 1, id, 0);
    dev = -2;
    if (r == ncclSuccess)
        r = ncclCommCuDevice(c1, &dev);
    say(r == ncclSuccess && dev == 3, "ncclCommCuDevice of a communicator made with a context: its device", r);
    int sets = *set_current_calls;
    r = ncclGetUniqueId(&id);
    if (r == ncclSuccess)
        r = ncclGroupStart();
    if (r == ncclSuccess) {
        r = ncclCommInitRank(&c2, 1, id, 0);
        ncclResult_t e = ncclGroupEnd();
        r = r ? r : e;
    }
    dev = -2;
    if (r == ncclSuccess)
        r = ncclCommCuDevice(c2, &dev);
    say(r == ncclSuccess && dev == 3 && *set_current_calls > sets,
        "creation deferred to ncclGroupEnd: made under the caller's context (cuCtxSetCurrent), its device", r);
    *context_current = 0;
    ncclCommDestroy(c1);
    ncclCommDestroy(c2);

    r = ncclCommDestroy(comm);
    say(r == ncclSuccess, "ncclCommDestroy", r);
    printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
