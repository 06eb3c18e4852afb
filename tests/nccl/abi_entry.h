/* One fact of NCCL's ABI, as one header declares it (tests/nccl/abi_check.c). */
#ifndef NCCL_TEST_ABI_ENTRY_H
#define NCCL_TEST_ABI_ENTRY_H

enum abi_kind {
    ABI_EQUAL,     /* a size, offset or value: plait's must equal NVIDIA's */
    ABI_AT_LEAST,  /* a version: plait's must be at least 2.28.0 (22800) */
    ABI_TRUE       /* a prototype matches the signature written in abi_entries.h (1), in both headers */
};

struct abi_entry {
    const char *what; /* the expression, as written */
    long long value;
    enum abi_kind kind;
};

#define ABI_MAX_ENTRIES 512

/* Each fills `out` (ABI_MAX_ENTRIES at most) and returns the number of entries:
 * the same expressions in the same order, evaluated against NVIDIA's nccl.h
 * (abi_nvidia.c) and against plait's compat/nccl_abi.h (abi_ours.c). */
int abi_collect_nvidia(struct abi_entry *out);
int abi_collect_ours(struct abi_entry *out);

#endif
