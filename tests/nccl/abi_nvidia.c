/* The ABI facts of abi_entries.h, evaluated against NVIDIA's nccl.h (found on
 * the include path given by meson: the CUDA toolkit's include/). */
#include <nccl.h>

#include "tests/nccl/abi_entries.h"

int abi_collect_nvidia(struct abi_entry *out)
{
    return abi_collect(out);
}
