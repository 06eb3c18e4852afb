/*
 * The ABI facts that tests/nccl/abi_check.c compares, as C expressions over
 * NCCL's names. This file is included twice, in two translation units: once
 * after NVIDIA's nccl.h (abi_nvidia.c) and once after plait's compat/nccl_abi.h
 * (abi_ours.c); each evaluates the same list, in the same order, against its
 * header. The two headers declare the same names, so no unit may see both.
 *
 * The signatures below are function types written from NCCL 2.28's API
 * reference; __builtin_types_compatible_p checks each header's prototype
 * against them (1 = compatible) without stopping the build when one differs,
 * so that the test names the function instead.
 */
#include <stddef.h>
#include <stdint.h>

#include "tests/nccl/abi_entry.h"

typedef ncclResult_t abi_sig_mem_alloc(void **, size_t);
typedef ncclResult_t abi_sig_mem_free(void *);
typedef ncclResult_t abi_sig_get_version(int *);
typedef ncclResult_t abi_sig_get_unique_id(ncclUniqueId *);
typedef ncclResult_t abi_sig_init_rank_config(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
typedef ncclResult_t abi_sig_init_rank(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t abi_sig_init_all(ncclComm_t *, int, const int *);
typedef ncclResult_t abi_sig_init_rank_scalable(ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *);
typedef ncclResult_t abi_sig_comm(ncclComm_t);
typedef ncclResult_t abi_sig_revoke(ncclComm_t, int);
typedef ncclResult_t abi_sig_split(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
typedef ncclResult_t abi_sig_shrink(ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int);
typedef const char *abi_sig_error_string(ncclResult_t);
typedef const char *abi_sig_last_error(ncclComm_t);
typedef void abi_sig_reset_debug_init(void);
typedef ncclResult_t abi_sig_async_error(ncclComm_t, ncclResult_t *);
typedef ncclResult_t abi_sig_comm_int(const ncclComm_t, int *);
typedef ncclResult_t abi_sig_register(const ncclComm_t, void *, size_t, void **);
typedef ncclResult_t abi_sig_deregister(const ncclComm_t, void *);
typedef ncclResult_t abi_sig_window_register(ncclComm_t, void *, size_t, ncclWindow_t *, int);
typedef ncclResult_t abi_sig_window_deregister(ncclComm_t, ncclWindow_t);
typedef ncclResult_t abi_sig_premulsum(ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t, ncclComm_t);
typedef ncclResult_t abi_sig_redop_destroy(ncclRedOp_t, ncclComm_t);
typedef ncclResult_t abi_sig_reduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                                    cudaStream_t);
typedef ncclResult_t abi_sig_bcast(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t abi_sig_rooted(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t abi_sig_reduction(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                       cudaStream_t);
typedef ncclResult_t abi_sig_movement(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t abi_sig_send(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t abi_sig_recv(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t abi_sig_group(void);
typedef ncclResult_t abi_sig_group_simulate_end(ncclSimInfo_t *);

#define ABI_EQ(expr) ((struct abi_entry){#expr, (long long)(expr), ABI_EQUAL})
#define ABI_VERSION(expr) ((struct abi_entry){#expr, (long long)(expr), ABI_AT_LEAST})
#define ABI_OFFSET(type, field) ((struct abi_entry){"offsetof(" #type ", " #field ")", (long long)offsetof(type, field), ABI_EQUAL})
#define ABI_SIG(fn, sig) ((struct abi_entry){"prototype of " #fn " is " #sig, __builtin_types_compatible_p(__typeof__(fn), sig), ABI_TRUE})

/* ncclResetDebugInit is marked deprecated in NVIDIA's header; naming it is the point here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static int abi_collect(struct abi_entry *e)
{
    const ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    const ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    int n = 0;

    /* Handles and the unique id. */
    e[n++] = ABI_EQ(NCCL_UNIQUE_ID_BYTES);
    e[n++] = ABI_EQ(sizeof(ncclUniqueId));
    e[n++] = ABI_EQ(_Alignof(ncclUniqueId));
    e[n++] = ABI_EQ(sizeof(ncclComm_t));
    e[n++] = ABI_EQ(sizeof(ncclWindow_t));
    e[n++] = ABI_EQ(sizeof(cudaStream_t));
    e[n++] = ABI_EQ((intptr_t)NCCL_COMM_NULL);

    /* ncclConfig_t: size, alignment, every field's offset and size. */
    e[n++] = ABI_EQ(sizeof(ncclConfig_t));
    e[n++] = ABI_EQ(_Alignof(ncclConfig_t));
    e[n++] = ABI_OFFSET(ncclConfig_t, size);
    e[n++] = ABI_OFFSET(ncclConfig_t, magic);
    e[n++] = ABI_OFFSET(ncclConfig_t, version);
    e[n++] = ABI_OFFSET(ncclConfig_t, blocking);
    e[n++] = ABI_OFFSET(ncclConfig_t, cgaClusterSize);
    e[n++] = ABI_OFFSET(ncclConfig_t, minCTAs);
    e[n++] = ABI_OFFSET(ncclConfig_t, maxCTAs);
    e[n++] = ABI_OFFSET(ncclConfig_t, netName);
    e[n++] = ABI_OFFSET(ncclConfig_t, splitShare);
    e[n++] = ABI_OFFSET(ncclConfig_t, trafficClass);
    e[n++] = ABI_OFFSET(ncclConfig_t, commName);
    e[n++] = ABI_OFFSET(ncclConfig_t, collnetEnable);
    e[n++] = ABI_OFFSET(ncclConfig_t, CTAPolicy);
    e[n++] = ABI_OFFSET(ncclConfig_t, shrinkShare);
    e[n++] = ABI_OFFSET(ncclConfig_t, nvlsCTAs);
    e[n++] = ABI_OFFSET(ncclConfig_t, nChannelsPerNetPeer);
    e[n++] = ABI_OFFSET(ncclConfig_t, nvlinkCentricSched);
    e[n++] = ABI_EQ(sizeof(cfg.size));
    e[n++] = ABI_EQ(sizeof(cfg.magic));
    e[n++] = ABI_EQ(sizeof(cfg.version));
    e[n++] = ABI_EQ(sizeof(cfg.netName));
    e[n++] = ABI_EQ(sizeof(cfg.commName));
    e[n++] = ABI_EQ(sizeof(cfg.nvlinkCentricSched));

    /* What NCCL_CONFIG_INITIALIZER writes. */
    e[n++] = ABI_EQ(cfg.size);
    e[n++] = ABI_EQ(cfg.magic);
    e[n++] = ABI_VERSION(cfg.version);
    e[n++] = ABI_EQ(cfg.blocking);
    e[n++] = ABI_EQ(cfg.cgaClusterSize);
    e[n++] = ABI_EQ(cfg.minCTAs);
    e[n++] = ABI_EQ(cfg.maxCTAs);
    e[n++] = ABI_EQ((intptr_t)cfg.netName);
    e[n++] = ABI_EQ(cfg.splitShare);
    e[n++] = ABI_EQ(cfg.trafficClass);
    e[n++] = ABI_EQ((intptr_t)cfg.commName);
    e[n++] = ABI_EQ(cfg.collnetEnable);
    e[n++] = ABI_EQ(cfg.CTAPolicy);
    e[n++] = ABI_EQ(cfg.shrinkShare);
    e[n++] = ABI_EQ(cfg.nvlsCTAs);
    e[n++] = ABI_EQ(cfg.nChannelsPerNetPeer);
    e[n++] = ABI_EQ(cfg.nvlinkCentricSched);

    /* ncclSimInfo_t and its initializer. */
    e[n++] = ABI_EQ(sizeof(ncclSimInfo_t));
    e[n++] = ABI_OFFSET(ncclSimInfo_t, size);
    e[n++] = ABI_OFFSET(ncclSimInfo_t, magic);
    e[n++] = ABI_OFFSET(ncclSimInfo_t, version);
    e[n++] = ABI_OFFSET(ncclSimInfo_t, estimatedTime);
    e[n++] = ABI_EQ(sim.size);
    e[n++] = ABI_EQ(sim.magic);
    e[n++] = ABI_VERSION(sim.version);
    e[n++] = ABI_EQ(sim.estimatedTime * 1000.0f);

    /* Constants. */
    e[n++] = ABI_EQ(NCCL_CONFIG_UNDEF_INT);
    e[n++] = ABI_EQ((intptr_t)NCCL_CONFIG_UNDEF_PTR);
    e[n++] = ABI_EQ(NCCL_SPLIT_NOCOLOR);
    e[n++] = ABI_EQ(NCCL_UNDEF_FLOAT * 1000.0f);
    e[n++] = ABI_EQ(NCCL_WIN_DEFAULT);
    e[n++] = ABI_EQ(NCCL_WIN_COLL_SYMMETRIC);
    e[n++] = ABI_EQ(NCCL_WIN_REQUIRED_ALIGNMENT);
    e[n++] = ABI_EQ(NCCL_CTA_POLICY_DEFAULT);
    e[n++] = ABI_EQ(NCCL_CTA_POLICY_EFFICIENCY);
    e[n++] = ABI_EQ(NCCL_CTA_POLICY_ZERO);
    e[n++] = ABI_EQ(NCCL_SHRINK_DEFAULT);
    e[n++] = ABI_EQ(NCCL_SHRINK_ABORT);
    e[n++] = ABI_EQ(NCCL_REVOKE_DEFAULT);
    e[n++] = ABI_VERSION(NCCL_VERSION_CODE);
    e[n++] = ABI_EQ(NCCL_VERSION(2, 28, 0));
    e[n++] = ABI_EQ(NCCL_VERSION(2, 8, 4));
    e[n++] = ABI_EQ(NCCL_VERSION(3, 0, 1));

    /* Results. */
    e[n++] = ABI_EQ(sizeof(ncclResult_t));
    e[n++] = ABI_EQ(ncclSuccess);
    e[n++] = ABI_EQ(ncclUnhandledCudaError);
    e[n++] = ABI_EQ(ncclSystemError);
    e[n++] = ABI_EQ(ncclInternalError);
    e[n++] = ABI_EQ(ncclInvalidArgument);
    e[n++] = ABI_EQ(ncclInvalidUsage);
    e[n++] = ABI_EQ(ncclRemoteError);
    e[n++] = ABI_EQ(ncclInProgress);
    e[n++] = ABI_EQ(ncclNumResults);

    /* Data types, with their aliases. */
    e[n++] = ABI_EQ(sizeof(ncclDataType_t));
    e[n++] = ABI_EQ(ncclInt8);
    e[n++] = ABI_EQ(ncclChar);
    e[n++] = ABI_EQ(ncclUint8);
    e[n++] = ABI_EQ(ncclInt32);
    e[n++] = ABI_EQ(ncclInt);
    e[n++] = ABI_EQ(ncclUint32);
    e[n++] = ABI_EQ(ncclInt64);
    e[n++] = ABI_EQ(ncclUint64);
    e[n++] = ABI_EQ(ncclFloat16);
    e[n++] = ABI_EQ(ncclHalf);
    e[n++] = ABI_EQ(ncclFloat32);
    e[n++] = ABI_EQ(ncclFloat);
    e[n++] = ABI_EQ(ncclFloat64);
    e[n++] = ABI_EQ(ncclDouble);
    e[n++] = ABI_EQ(ncclBfloat16);
    e[n++] = ABI_EQ(ncclFloat8e4m3);
    e[n++] = ABI_EQ(ncclFloat8e5m2);
    e[n++] = ABI_EQ(ncclNumTypes);

    /* Reduction operations. */
    e[n++] = ABI_EQ(sizeof(ncclRedOp_t));
    e[n++] = ABI_EQ(ncclSum);
    e[n++] = ABI_EQ(ncclProd);
    e[n++] = ABI_EQ(ncclMax);
    e[n++] = ABI_EQ(ncclMin);
    e[n++] = ABI_EQ(ncclAvg);
    e[n++] = ABI_EQ(ncclNumOps);
    e[n++] = ABI_EQ(ncclMaxRedOp);

    /* Scalar residence. */
    e[n++] = ABI_EQ(sizeof(ncclScalarResidence_t));
    e[n++] = ABI_EQ(ncclScalarDevice);
    e[n++] = ABI_EQ(ncclScalarHostImmediate);

    /* Prototypes of every function nccl.h declares, and of their pncclX twins. */
    e[n++] = ABI_SIG(ncclMemAlloc, abi_sig_mem_alloc);
    e[n++] = ABI_SIG(pncclMemAlloc, abi_sig_mem_alloc);
    e[n++] = ABI_SIG(ncclMemFree, abi_sig_mem_free);
    e[n++] = ABI_SIG(pncclMemFree, abi_sig_mem_free);
    e[n++] = ABI_SIG(ncclGetVersion, abi_sig_get_version);
    e[n++] = ABI_SIG(pncclGetVersion, abi_sig_get_version);
    e[n++] = ABI_SIG(ncclGetUniqueId, abi_sig_get_unique_id);
    e[n++] = ABI_SIG(pncclGetUniqueId, abi_sig_get_unique_id);
    e[n++] = ABI_SIG(ncclCommInitRankConfig, abi_sig_init_rank_config);
    e[n++] = ABI_SIG(pncclCommInitRankConfig, abi_sig_init_rank_config);
    e[n++] = ABI_SIG(ncclCommInitRank, abi_sig_init_rank);
    e[n++] = ABI_SIG(pncclCommInitRank, abi_sig_init_rank);
    e[n++] = ABI_SIG(ncclCommInitAll, abi_sig_init_all);
    e[n++] = ABI_SIG(pncclCommInitAll, abi_sig_init_all);
    e[n++] = ABI_SIG(ncclCommInitRankScalable, abi_sig_init_rank_scalable);
    e[n++] = ABI_SIG(pncclCommInitRankScalable, abi_sig_init_rank_scalable);
    e[n++] = ABI_SIG(ncclCommFinalize, abi_sig_comm);
    e[n++] = ABI_SIG(pncclCommFinalize, abi_sig_comm);
    e[n++] = ABI_SIG(ncclCommDestroy, abi_sig_comm);
    e[n++] = ABI_SIG(pncclCommDestroy, abi_sig_comm);
    e[n++] = ABI_SIG(ncclCommAbort, abi_sig_comm);
    e[n++] = ABI_SIG(pncclCommAbort, abi_sig_comm);
    e[n++] = ABI_SIG(ncclCommRevoke, abi_sig_revoke);
    e[n++] = ABI_SIG(pncclCommRevoke, abi_sig_revoke);
    e[n++] = ABI_SIG(ncclCommSplit, abi_sig_split);
    e[n++] = ABI_SIG(pncclCommSplit, abi_sig_split);
    e[n++] = ABI_SIG(ncclCommShrink, abi_sig_shrink);
    e[n++] = ABI_SIG(pncclCommShrink, abi_sig_shrink);
    e[n++] = ABI_SIG(ncclGetErrorString, abi_sig_error_string);
    e[n++] = ABI_SIG(pncclGetErrorString, abi_sig_error_string);
    e[n++] = ABI_SIG(ncclGetLastError, abi_sig_last_error);
    e[n++] = ABI_SIG(pncclGetLastError, abi_sig_last_error);
    e[n++] = ABI_SIG(ncclResetDebugInit, abi_sig_reset_debug_init);
    e[n++] = ABI_SIG(pncclResetDebugInit, abi_sig_reset_debug_init);
    e[n++] = ABI_SIG(ncclCommGetAsyncError, abi_sig_async_error);
    e[n++] = ABI_SIG(pncclCommGetAsyncError, abi_sig_async_error);
    e[n++] = ABI_SIG(ncclCommCount, abi_sig_comm_int);
    e[n++] = ABI_SIG(pncclCommCount, abi_sig_comm_int);
    e[n++] = ABI_SIG(ncclCommCuDevice, abi_sig_comm_int);
    e[n++] = ABI_SIG(pncclCommCuDevice, abi_sig_comm_int);
    e[n++] = ABI_SIG(ncclCommUserRank, abi_sig_comm_int);
    e[n++] = ABI_SIG(pncclCommUserRank, abi_sig_comm_int);
    e[n++] = ABI_SIG(ncclCommRegister, abi_sig_register);
    e[n++] = ABI_SIG(pncclCommRegister, abi_sig_register);
    e[n++] = ABI_SIG(ncclCommDeregister, abi_sig_deregister);
    e[n++] = ABI_SIG(pncclCommDeregister, abi_sig_deregister);
    e[n++] = ABI_SIG(ncclCommWindowRegister, abi_sig_window_register);
    e[n++] = ABI_SIG(pncclCommWindowRegister, abi_sig_window_register);
    e[n++] = ABI_SIG(ncclCommWindowDeregister, abi_sig_window_deregister);
    e[n++] = ABI_SIG(pncclCommWindowDeregister, abi_sig_window_deregister);
    e[n++] = ABI_SIG(ncclRedOpCreatePreMulSum, abi_sig_premulsum);
    e[n++] = ABI_SIG(pncclRedOpCreatePreMulSum, abi_sig_premulsum);
    e[n++] = ABI_SIG(ncclRedOpDestroy, abi_sig_redop_destroy);
    e[n++] = ABI_SIG(pncclRedOpDestroy, abi_sig_redop_destroy);
    e[n++] = ABI_SIG(ncclReduce, abi_sig_reduce);
    e[n++] = ABI_SIG(pncclReduce, abi_sig_reduce);
    e[n++] = ABI_SIG(ncclBcast, abi_sig_bcast);
    e[n++] = ABI_SIG(pncclBcast, abi_sig_bcast);
    e[n++] = ABI_SIG(ncclBroadcast, abi_sig_rooted);
    e[n++] = ABI_SIG(pncclBroadcast, abi_sig_rooted);
    e[n++] = ABI_SIG(ncclAllReduce, abi_sig_reduction);
    e[n++] = ABI_SIG(pncclAllReduce, abi_sig_reduction);
    e[n++] = ABI_SIG(ncclReduceScatter, abi_sig_reduction);
    e[n++] = ABI_SIG(pncclReduceScatter, abi_sig_reduction);
    e[n++] = ABI_SIG(ncclAllGather, abi_sig_movement);
    e[n++] = ABI_SIG(pncclAllGather, abi_sig_movement);
    e[n++] = ABI_SIG(ncclAlltoAll, abi_sig_movement);
    e[n++] = ABI_SIG(pncclAlltoAll, abi_sig_movement);
    e[n++] = ABI_SIG(ncclGather, abi_sig_rooted);
    e[n++] = ABI_SIG(pncclGather, abi_sig_rooted);
    e[n++] = ABI_SIG(ncclScatter, abi_sig_rooted);
    e[n++] = ABI_SIG(pncclScatter, abi_sig_rooted);
    e[n++] = ABI_SIG(ncclSend, abi_sig_send);
    e[n++] = ABI_SIG(pncclSend, abi_sig_send);
    e[n++] = ABI_SIG(ncclRecv, abi_sig_recv);
    e[n++] = ABI_SIG(pncclRecv, abi_sig_recv);
    e[n++] = ABI_SIG(ncclGroupStart, abi_sig_group);
    e[n++] = ABI_SIG(pncclGroupStart, abi_sig_group);
    e[n++] = ABI_SIG(ncclGroupEnd, abi_sig_group);
    e[n++] = ABI_SIG(pncclGroupEnd, abi_sig_group);
    e[n++] = ABI_SIG(ncclGroupSimulateEnd, abi_sig_group_simulate_end);
    e[n++] = ABI_SIG(pncclGroupSimulateEnd, abi_sig_group_simulate_end);
    return n;
}

#pragma GCC diagnostic pop
