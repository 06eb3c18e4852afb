/*
 * A stand-in for the CUDA driver (soname libcuda.so.1) for device_pointers.c:
 * it implements only the two calls plait's libnccl.so.2 asks a loaded driver,
 * with cuda.h's prototypes and constants. fake_device is reported as device
 * memory, fake_managed as managed memory, any other pointer is unknown to the
 * driver (CUDA_ERROR_INVALID_VALUE, i.e. host memory). fake_context_current
 * says whether the calling thread has a current context.
 */
#include <cuda.h>
#include <stdint.h>

#define FAKE_BYTES 4096

char fake_device[FAKE_BYTES];
char fake_managed[FAKE_BYTES];
int fake_context_current;

static int within(CUdeviceptr p, const char *base)
{
    return p >= (CUdeviceptr)(uintptr_t)base && p < (CUdeviceptr)(uintptr_t)base + FAKE_BYTES;
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    int is_device = within(ptr, fake_device), is_managed = within(ptr, fake_managed);
    if (!is_device && !is_managed)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        /* Managed memory reports DEVICE too, as the real driver does. */
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = (unsigned int)is_managed;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    static int context;
    *pctx = fake_context_current ? (CUcontext)(void *)&context : NULL;
    return CUDA_SUCCESS;
}
