/* The CUDA kernels: plait_kernel interprets a launch (kernel.h) with the body
 * the host emulation runs too (kernel_body.h), given the GPU's hooks here;
 * plait_reduce_local is the local element-wise reduction. Built by nvcc into
 * a fatbin (meson.build) that core/cuda/cu.c loads with cuModuleLoadData and
 * whose entries it finds by these names (extern "C": no mangling). */
#include <stdint.h>

#include "core/cuda/kernel.h"
#include "core/cuda/reduce_dev.cuh"

/* ---------------------------------------------------------------- hooks (kernel_body.h) */

#define PLAIT_KB_FN static __device__ __noinline__
#define PLAIT_KB_TID threadIdx.x
#define PLAIT_KB_NTHREADS blockDim.x
#define PLAIT_KB_SYNC() __syncthreads()

static __device__ __forceinline__ void plait_kb_copy(void *dst, const void *src, uint64_t bytes)
{
    plait_dev::copy(dst, src, bytes, threadIdx.x, blockDim.x);
}

static __device__ __forceinline__ void plait_kb_reduce(const struct plait_dev_op *op, void *dst, const void *a,
                                                       const void *b, uint64_t n, unsigned flags)
{
    plait_dev_reduce(op->dtype, op->redop, op->nranks, op->scalar_f, op->scalar_i, dst, a, b, n, flags, threadIdx.x,
                     blockDim.x);
}

static __device__ __forceinline__ uint64_t plait_kb_reduce8(const struct plait_dev_op *op, uint64_t a, uint64_t b,
                                                            int has_b, uint32_t n, unsigned flags)
{
    (void)n; /* all 8 bytes are combined; the caller keeps its n elements */
    return plait_dev_reduce8(op->dtype, op->redop, op->nranks, op->scalar_f, op->scalar_i, a, b, has_b, flags);
}

static __device__ __forceinline__ uint64_t plait_kb_ld64(const char *p)
{
    return *(const uint64_t *)p;
}

static __device__ __forceinline__ void plait_kb_st64(char *p, uint64_t v)
{
    *(uint64_t *)p = v;
}

/* An LL line {data0, flag, data1, flag}: one 16-byte volatile store, so the
 * reader sees each data word together with its flag (8 bytes when the piece
 * ends in the line's first half). */
static __device__ __forceinline__ void plait_kb_ll_store(char *line, uint64_t v, int whole, uint32_t flag)
{
    const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
    if (whole)
        asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(lo), "r"(flag), "r"(hi),
                     "r"(flag)
                     : "memory");
    else
        asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(line), "r"(lo), "r"(flag) : "memory");
}

static __device__ __forceinline__ int plait_kb_ll_load(const char *line, int whole, uint32_t flag, uint64_t *v)
{
    uint32_t d0, f0, d1 = 0, f1 = flag;
    if (whole)
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                     : "l"(line)
                     : "memory");
    else
        asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(d0), "=r"(f0) : "l"(line) : "memory");
    if (f0 != flag || f1 != flag)
        return 0;
    *v = (uint64_t)d0 | (uint64_t)d1 << 32;
    return 1;
}

static __device__ __forceinline__ void plait_kb_fence(int scope)
{
    if (scope == PLAIT_SCOPE_SYS)
        __threadfence_system();
    else
        __threadfence();
}

static __device__ __forceinline__ uint64_t plait_kb_cas64(uint64_t *p, uint64_t expect, uint64_t desired)
{
    return atomicCAS_system((unsigned long long *)p, (unsigned long long)expect, (unsigned long long)desired);
}

/* lanes_done is device memory touched by this launch's CTAs only; the body
 * fences at system scope around the add. */
static __device__ __forceinline__ uint32_t plait_kb_add32(uint32_t *p, uint32_t v)
{
    return atomicAdd(p, v);
}

static __device__ __forceinline__ uint32_t plait_kb_ld32_relaxed(const volatile uint32_t *p)
{
    return *p;
}

static __device__ __forceinline__ uint64_t plait_kb_ld64_relaxed(const uint64_t *p)
{
    return *(const volatile uint64_t *)p;
}

static __device__ __forceinline__ uint64_t plait_kb_clock_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* The leader spins on L2 for a while (a piece usually arrives within a few
 * microseconds), then backs off so that a long wait leaves the SM's issue
 * slots to the CTAs doing work. */
static __device__ __forceinline__ void plait_kb_pause(uint32_t spins)
{
    if (spins > 1024)
        __nanosleep(128);
}

#include "core/cuda/kernel_body.h"

/* ---------------------------------------------------------------- kernels */

/* One CTA per lane, PLAIT_KERNEL_THREADS threads. The parameter block is a
 * __grid_constant__: the body takes its address without a local copy. */
extern "C" __global__ void __launch_bounds__(PLAIT_KERNEL_THREADS, PLAIT_KERNEL_CTAS_PER_SM)
    plait_kernel(const __grid_constant__ struct plait_kargs a)
{
    __shared__ struct plait_kb_shared sh;
    plait_kb_run(&a, blockIdx.x, gridDim.x, &sh);
}

/* dst = post(pre(a) OP b) over n elements, grid-stride: the whole grid shares
 * one range, each thread taking every (gridDim.x * blockDim.x)-th vector. */
extern "C" __global__ void __launch_bounds__(PLAIT_KERNEL_THREADS)
    plait_reduce_local(const __grid_constant__ struct plait_kreduce_args a)
{
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t nth = (uint64_t)gridDim.x * blockDim.x;
    plait_dev_reduce(a.dtype, a.redop, a.nranks, a.scalar_f, a.scalar_i, a.dst, a.a, a.b, a.n, a.flags, tid, nth);
}
