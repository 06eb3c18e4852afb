/* The build had no nvcc: no kernels. Device collectives fail with a clear
 * error (core/cuda/conn.c); host collectives are unaffected. */
#include <stddef.h>
#include "core/cuda/cu.h"

const void *plait_cuda_fatbin(size_t *bytes)
{
    *bytes = 0;
    return NULL;
}
