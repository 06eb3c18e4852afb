#include "cuda/kernel.h"
extern "C" __global__ void plait_kernel(struct plait_kargs a) {}
