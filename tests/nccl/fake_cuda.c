/*
 * A stand-in for the CUDA driver (soname libcuda.so.1) for device_pointers.c:
 * it implements only the calls plait's libnccl.so.2 makes on a loaded driver,
 * with cuda.h's prototypes and constants. fake_device is reported as device
 * memory (and cuMemAlloc_v2 hands out pieces of it), fake_managed as managed
 * memory, any other pointer as unknown to the driver (type 0: host memory,
 * as cuPointerGetAttributes answers for it). A thread's current context is
 * the one it set with cuCtxSetCurrent, else the process-wide one
 * fake_context_current names (0: none); its device is fake_device_ordinal.
 * The counters let the test see what the library did.
 */
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#define FAKE_BYTES (1 << 20)

char fake_device[FAKE_BYTES];
char fake_managed[4096];
int fake_context_current;
int fake_device_ordinal = 3;
int fake_allocs, fake_frees, fake_set_current_calls;

static int fake_context;
static __thread CUcontext thread_context;
static size_t next_alloc;

static int within(CUdeviceptr p, const char *base, size_t bytes)
{
    return p >= (CUdeviceptr)(uintptr_t)base && p < (CUdeviceptr)(uintptr_t)base + bytes;
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes, void **data, CUdeviceptr ptr)
{
    int is_device = within(ptr, fake_device, FAKE_BYTES), is_managed = within(ptr, fake_managed, sizeof(fake_managed));
    for (unsigned int i = 0; i < n; i++) {
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            /* Managed memory reports DEVICE too, as the real driver does. */
            *(unsigned int *)data[i] = is_device || is_managed ? CU_MEMORYTYPE_DEVICE : 0;
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(int *)data[i] = is_managed;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

static CUcontext current(void)
{
    if (thread_context)
        return thread_context;
    return fake_context_current ? (CUcontext)(void *)&fake_context : NULL;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    *pctx = current();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    __atomic_fetch_add(&fake_set_current_calls, 1, __ATOMIC_RELAXED);
    thread_context = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *dev)
{
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = fake_device_ordinal;
    return CUDA_SUCCESS;
}

/* Pieces of fake_device, never reused (the test allocates little). */
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *p, size_t bytes)
{
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes > FAKE_BYTES / 2 - next_alloc)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)(fake_device + FAKE_BYTES / 2 + next_alloc);
    next_alloc += (bytes + 255) / 256 * 256;
    fake_allocs++;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr p)
{
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!within(p, fake_device, FAKE_BYTES))
        return CUDA_ERROR_INVALID_VALUE;
    fake_frees++;
    return CUDA_SUCCESS;
}
