/* The ABI facts of abi_entries.h, evaluated against plait's own declarations. */
#include "compat/nccl_abi.h"

#include "tests/nccl/abi_entries.h"

int abi_collect_ours(struct abi_entry *out)
{
    return abi_collect(out);
}
