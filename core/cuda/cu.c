/* The CUDA driver loaded with dlopen (cu.h) and the classification of user
 * buffers by memory kind.
 *
 * libplait.so never links libcuda: a binary must start on machines without a
 * driver. The library is opened once per process, on first need, and every
 * function plait calls is resolved by the versioned symbol name that cuda.h's
 * macros pick for the legacy default stream API (cuMemAlloc -> cuMemAlloc_v2,
 * cuStreamWaitValue64 -> cuStreamWaitValue64_v2, ...): calling an unversioned
 * symbol would get the ABI of an older CUDA. */
#define _GNU_SOURCE
#include "core/cuda/cu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/log.h"
#include "core/cuda/kernel.h"

/* The table's functions by symbol name. Resolved in this order; the first
 * one missing makes the library unusable, named in the INFO line. */
static const struct cu_symbol {
    const char *name;
    size_t offset; /* of the function pointer in struct plait_cu */
} cu_symbols[] = {
    {"cuInit", offsetof(struct plait_cu, Init)},
    {"cuDriverGetVersion", offsetof(struct plait_cu, DriverGetVersion)},
    {"cuDeviceGetCount", offsetof(struct plait_cu, DeviceGetCount)},
    {"cuDeviceGet", offsetof(struct plait_cu, DeviceGet)},
    {"cuDeviceGetAttribute", offsetof(struct plait_cu, DeviceGetAttribute)},
    {"cuDeviceGetPCIBusId", offsetof(struct plait_cu, DeviceGetPCIBusId)},
    {"cuDevicePrimaryCtxRetain", offsetof(struct plait_cu, DevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease_v2", offsetof(struct plait_cu, DevicePrimaryCtxRelease)},
    {"cuCtxGetCurrent", offsetof(struct plait_cu, CtxGetCurrent)},
    {"cuCtxSetCurrent", offsetof(struct plait_cu, CtxSetCurrent)},
    {"cuCtxGetDevice", offsetof(struct plait_cu, CtxGetDevice)},
    {"cuCtxSynchronize", offsetof(struct plait_cu, CtxSynchronize)},
    {"cuCtxEnablePeerAccess", offsetof(struct plait_cu, CtxEnablePeerAccess)},
    {"cuPointerGetAttributes", offsetof(struct plait_cu, PointerGetAttributes)},
    {"cuMemAlloc_v2", offsetof(struct plait_cu, MemAlloc)},
    {"cuMemFree_v2", offsetof(struct plait_cu, MemFree)},
    {"cuMemGetAddressRange_v2", offsetof(struct plait_cu, MemGetAddressRange)},
    {"cuMemHostAlloc", offsetof(struct plait_cu, MemHostAlloc)},
    {"cuMemFreeHost", offsetof(struct plait_cu, MemFreeHost)},
    {"cuMemHostGetDevicePointer_v2", offsetof(struct plait_cu, MemHostGetDevicePointer)},
    {"cuMemcpyHtoD_v2", offsetof(struct plait_cu, MemcpyHtoD)},
    {"cuMemcpyDtoH_v2", offsetof(struct plait_cu, MemcpyDtoH)},
    {"cuMemcpyAsync", offsetof(struct plait_cu, MemcpyAsync)},
    {"cuMemcpyHtoDAsync_v2", offsetof(struct plait_cu, MemcpyHtoDAsync)},
    {"cuMemsetD8Async", offsetof(struct plait_cu, MemsetD8Async)},
    {"cuModuleLoadData", offsetof(struct plait_cu, ModuleLoadData)},
    {"cuModuleUnload", offsetof(struct plait_cu, ModuleUnload)},
    {"cuModuleGetFunction", offsetof(struct plait_cu, ModuleGetFunction)},
    {"cuLaunchKernel", offsetof(struct plait_cu, LaunchKernel)},
    {"cuStreamCreateWithPriority", offsetof(struct plait_cu, StreamCreateWithPriority)},
    {"cuStreamGetPriority", offsetof(struct plait_cu, StreamGetPriority)},
    {"cuStreamDestroy_v2", offsetof(struct plait_cu, StreamDestroy)},
    {"cuStreamSynchronize", offsetof(struct plait_cu, StreamSynchronize)},
    {"cuStreamQuery", offsetof(struct plait_cu, StreamQuery)},
    {"cuStreamWaitEvent", offsetof(struct plait_cu, StreamWaitEvent)},
    {"cuStreamIsCapturing", offsetof(struct plait_cu, StreamIsCapturing)},
    {"cuEventCreate", offsetof(struct plait_cu, EventCreate)},
    {"cuEventRecord", offsetof(struct plait_cu, EventRecord)},
    {"cuEventQuery", offsetof(struct plait_cu, EventQuery)},
    {"cuEventSynchronize", offsetof(struct plait_cu, EventSynchronize)},
    {"cuEventDestroy_v2", offsetof(struct plait_cu, EventDestroy)},
    {"cuIpcGetMemHandle", offsetof(struct plait_cu, IpcGetMemHandle)},
    {"cuIpcOpenMemHandle_v2", offsetof(struct plait_cu, IpcOpenMemHandle)},
    {"cuIpcCloseMemHandle", offsetof(struct plait_cu, IpcCloseMemHandle)},
    {"cuLaunchHostFunc", offsetof(struct plait_cu, LaunchHostFunc)},
    {"cuGetErrorName", offsetof(struct plait_cu, GetErrorName)},
    {"cuGetErrorString", offsetof(struct plait_cu, GetErrorString)},
    {"cuStreamWaitValue64_v2", offsetof(struct plait_cu, StreamWaitValue64)},
    {"cuStreamWriteValue64_v2", offsetof(struct plait_cu, StreamWriteValue64)},
    {"cuStreamBeginCapture_v2", offsetof(struct plait_cu, StreamBeginCapture)},
    {"cuStreamEndCapture", offsetof(struct plait_cu, StreamEndCapture)},
    {"cuGraphInstantiateWithFlags", offsetof(struct plait_cu, GraphInstantiate)},
    {"cuGraphLaunch", offsetof(struct plait_cu, GraphLaunch)},
    {"cuGraphDestroy", offsetof(struct plait_cu, GraphDestroy)},
    {"cuGraphExecDestroy", offsetof(struct plait_cu, GraphExecDestroy)},
    {"cuThreadExchangeStreamCaptureMode", offsetof(struct plait_cu, ThreadExchangeStreamCaptureMode)},
};

/* Filled once by cu_load (under cu_once), read-only afterwards. cu_loaded is
 * &cu_table when the driver is usable. */
static struct plait_cu cu_table;
static const struct plait_cu *cu_loaded;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

/* The test double's hook: the kernels it runs are the host emulations, handed
 * to it by name (the double cannot run the fatbin). */
typedef int (*cu_double_set_kernel_fn)(const char *name, void (*fn)(const void *, unsigned, unsigned),
                                       size_t params_bytes);

static void cu_unusable(int is_required, const char *why)
{
    if (is_required)
        PLAIT_WARN(PLAIT_SUBSYS_INIT, "no CUDA device (%s)", why);
    else
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "no CUDA device (%s)", why);
}

static int cu_hand_kernels_to_double(void *lib, char *why, size_t len)
{
    cu_double_set_kernel_fn set_kernel;
    *(void **)&set_kernel = dlsym(lib, "plait_cuda_double_set_kernel");
    if (set_kernel == NULL) {
        snprintf(why, len, "test double %s lacks plait_cuda_double_set_kernel", cu_table.path);
        return -1;
    }
    if (set_kernel(PLAIT_KERNEL_NAME, plait_kernel_emulate, sizeof(struct plait_kargs)) != 0 ||
        set_kernel(PLAIT_REDUCE_KERNEL_NAME, plait_reduce_local_emulate, sizeof(struct plait_kreduce_args)) != 0) {
        snprintf(why, len, "test double %s refused plait's kernel emulations", cu_table.path);
        return -1;
    }
    return 0;
}

static void cu_load(void)
{
    /* The INFO line may come before any communicator init (a buffer
     * classified first): read PLAIT_DEBUG now. */
    plait_log_configure();
    double setting = PLAIT_ENV_AUTO;
    if (plait_env_number("PLAIT_CUDA", &setting, NULL) != PLAIT_SUCCESS) {
        /* Every communicator init fails on it (plait_settings_load); a
         * buffer classified before any init is host memory. */
        PLAIT_WARN(PLAIT_SUBSYS_ENV, "%s: the CUDA backend stays off", plait_last_error_get());
        return;
    }
    if (setting == 0) {
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "CUDA backend off (PLAIT_CUDA=0)");
        return;
    }
    const int is_required = setting == 1;

    const char *path = plait_env_get("PLAIT_CUDA_LIBRARY");
    if (path == NULL || *path == '\0')
        path = "libcuda.so.1";
    snprintf(cu_table.path, sizeof(cu_table.path), "%s", path);

    char why[512];
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *err = dlerror();
        snprintf(why, sizeof(why), "dlopen %s: %s", path, err ? err : "failed");
        cu_unusable(is_required, why);
        return;
    }
    for (size_t i = 0; i < sizeof(cu_symbols) / sizeof(cu_symbols[0]); i++) {
        void *sym = dlsym(lib, cu_symbols[i].name);
        if (sym == NULL) {
            snprintf(why, sizeof(why), "%s lacks %s: a CUDA driver older than plait needs", path, cu_symbols[i].name);
            goto err_close;
        }
        memcpy((char *)&cu_table + cu_symbols[i].offset, &sym, sizeof(sym));
    }
    cu_table.lib = lib;
    cu_table.is_double = dlsym(lib, "plait_cuda_double_info") != NULL;
    if (cu_table.is_double && cu_hand_kernels_to_double(lib, why, sizeof(why)) != 0)
        goto err_close;

    /* cuInit creates no context: a host-only program that only classifies
     * its buffers stays without one. */
    int res = cu_table.Init(0);
    if (res != PLAIT_CU_SUCCESS) {
        char err[160];
        snprintf(why, sizeof(why), "cuInit: %s", plait_cu_strerror(res, err, sizeof(err)));
        goto err_close;
    }
    int version = 0;
    if (cu_table.DriverGetVersion(&version) != PLAIT_CU_SUCCESS)
        version = 0;
    cu_table.driver_version = version;
    /* The driver leaves the count unwritten when it fails. */
    int count = 0;
    res = cu_table.DeviceGetCount(&count);
    if (res != PLAIT_CU_SUCCESS || count <= 0) {
        char err[160];
        if (res != PLAIT_CU_SUCCESS)
            snprintf(why, sizeof(why), "cuDeviceGetCount: %s", plait_cu_strerror(res, err, sizeof(err)));
        else
            snprintf(why, sizeof(why), "%s reports 0 devices", path);
        goto err_close;
    }
    cu_table.ndevices = count;
    if (cu_table.is_double)
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "CUDA: test double %s (not a GPU): %d device(s)", path, count);
    else
        PLAIT_INFO(PLAIT_SUBSYS_INIT, "CUDA: %d device(s), driver %d.%d (%s)", count, version / 1000,
                   (version % 1000) / 10, path);
    cu_loaded = &cu_table;
    return;

err_close:
    cu_unusable(is_required, why);
    /* The table may be half filled: plait_cu_strerror must not call into a
     * closed library. */
    memset(&cu_table, 0, sizeof(cu_table));
    dlclose(lib);
}

const struct plait_cu *plait_cu_get(void)
{
    pthread_once(&cu_once, cu_load);
    return cu_loaded;
}

const char *plait_cu_strerror(int res, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (cu_table.GetErrorName == NULL || cu_table.GetErrorName(res, &name) != PLAIT_CU_SUCCESS)
        name = NULL;
    if (cu_table.GetErrorString == NULL || cu_table.GetErrorString(res, &text) != PLAIT_CU_SUCCESS)
        text = NULL;
    if (name != NULL)
        snprintf(buf, len, "%s: %s", name, text ? text : "(no description)");
    else
        snprintf(buf, len, "CUDA error %d", res);
    return buf;
}

plait_result_t plait_cu_error(int res, const char *what, const char *call)
{
    char err[160];
    return plait_error(PLAIT_ERR_UNHANDLED_CUDA, "%s: %s failed: %s", what, call, plait_cu_strerror(res, err, sizeof(err)));
}

int plait_mem_kind(const void *p, int *device)
{
    if (device != NULL)
        *device = -1;
    if (p == NULL)
        return PLAIT_MEM_HOST;
    const struct plait_cu *cu = plait_cu_get();
    if (cu == NULL)
        return PLAIT_MEM_HOST;
    /* Zeroed so that a driver writing fewer bytes (IS_MANAGED as a bool) or
     * nothing (a pointer it does not know: "default NULL values") reads as
     * "not CUDA memory". */
    unsigned int type = 0, is_managed = 0;
    int ordinal = -1;
    int attrs[3] = {PLAIT_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, PLAIT_CU_POINTER_ATTRIBUTE_IS_MANAGED,
                    PLAIT_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[3] = {&type, &is_managed, &ordinal};
    if (cu->PointerGetAttributes(3, attrs, data, (plait_cudevptr)(uintptr_t)p) != PLAIT_CU_SUCCESS)
        return PLAIT_MEM_HOST;
    switch (type) {
    case PLAIT_CU_MEMORYTYPE_HOST:
        return PLAIT_MEM_REGISTERED;
    case PLAIT_CU_MEMORYTYPE_DEVICE:
    case PLAIT_CU_MEMORYTYPE_UNIFIED:
        if (device != NULL)
            *device = ordinal;
        return is_managed ? PLAIT_MEM_MANAGED : PLAIT_MEM_DEVICE;
    default:
        return PLAIT_MEM_HOST;
    }
}

const char *plait_mem_kind_name(int kind)
{
    switch (kind) {
    case PLAIT_MEM_HOST:
        return "host";
    case PLAIT_MEM_REGISTERED:
        return "registered host";
    case PLAIT_MEM_DEVICE:
        return "device";
    case PLAIT_MEM_MANAGED:
        return "managed";
    default:
        return "unknown";
    }
}

/* ---------------------------------------------------------------- IPC imports */

struct ipc_import {
    plait_cu_ipc_handle handle;
    void *ctx; /* the context it is mapped in: ranks of one process on other devices map it again */
    plait_cudevptr ptr;
    int users;
    struct ipc_import *next;
};

static pthread_mutex_t ipc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ipc_import *ipc_imports;

int plait_cu_ipc_open(const struct plait_cu *cu, const plait_cu_ipc_handle *h, plait_cudevptr *p_out)
{
    void *ctx = NULL;
    if (cu->CtxGetCurrent(&ctx) != PLAIT_CU_SUCCESS)
        ctx = NULL;
    pthread_mutex_lock(&ipc_lock);
    for (struct ipc_import *im = ipc_imports; im; im = im->next)
        if (im->ctx == ctx && memcmp(&im->handle, h, sizeof(*h)) == 0) {
            im->users++;
            *p_out = im->ptr;
            pthread_mutex_unlock(&ipc_lock);
            return PLAIT_CU_SUCCESS;
        }
    struct ipc_import *im = calloc(1, sizeof(*im));
    if (!im) {
        pthread_mutex_unlock(&ipc_lock);
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    }
    plait_cudevptr p = 0;
    int r = cu->IpcOpenMemHandle(&p, *h, PLAIT_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != PLAIT_CU_SUCCESS) {
        pthread_mutex_unlock(&ipc_lock);
        free(im);
        return r;
    }
    im->handle = *h;
    im->ctx = ctx;
    im->ptr = p;
    im->users = 1;
    im->next = ipc_imports;
    ipc_imports = im;
    pthread_mutex_unlock(&ipc_lock);
    *p_out = p;
    return PLAIT_CU_SUCCESS;
}

int plait_cu_ipc_close(const struct plait_cu *cu, plait_cudevptr p)
{
    pthread_mutex_lock(&ipc_lock);
    for (struct ipc_import **pp = &ipc_imports; *pp; pp = &(*pp)->next) {
        struct ipc_import *im = *pp;
        if (im->ptr != p)
            continue;
        int r = PLAIT_CU_SUCCESS;
        if (--im->users == 0) {
            *pp = im->next;
            r = cu->IpcCloseMemHandle(p);
            free(im);
        }
        pthread_mutex_unlock(&ipc_lock);
        return r;
    }
    pthread_mutex_unlock(&ipc_lock);
    return 1; /* CUDA_ERROR_INVALID_VALUE: not opened here */
}

/* ---------------------------------------------------------------- capture mode */

int plait_cu_capture_relax(const struct plait_cu *cu)
{
    int mode = PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED;
    if (cu && cu->ThreadExchangeStreamCaptureMode(&mode) != PLAIT_CU_SUCCESS)
        mode = PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED; /* nothing was exchanged: restoring it is a no-op */
    return mode;
}

void plait_cu_capture_restore(const struct plait_cu *cu, int mode)
{
    if (cu && mode != PLAIT_CU_STREAM_CAPTURE_MODE_RELAXED)
        cu->ThreadExchangeStreamCaptureMode(&mode);
}

/* ---------------------------------------------------------------- setup copies */

int plait_cu_sync_copy(const struct plait_cu *cu, void *dst, const void *src, size_t bytes)
{
    void *s = NULL;
    int r = cu->StreamCreateWithPriority(&s, PLAIT_CU_STREAM_NON_BLOCKING, 0);
    if (r)
        return r;
    r = cu->MemcpyAsync((plait_cudevptr)(uintptr_t)dst, (plait_cudevptr)(uintptr_t)src, bytes, s);
    const int r2 = cu->StreamSynchronize(s);
    cu->StreamDestroy(s);
    return r ? r : r2;
}

int plait_cu_sync_fill(const struct plait_cu *cu, plait_cudevptr dst, unsigned char v, size_t bytes)
{
    void *s = NULL;
    int r = cu->StreamCreateWithPriority(&s, PLAIT_CU_STREAM_NON_BLOCKING, 0);
    if (r)
        return r;
    r = cu->MemsetD8Async(dst, v, bytes, s);
    const int r2 = cu->StreamSynchronize(s);
    cu->StreamDestroy(s);
    return r ? r : r2;
}
