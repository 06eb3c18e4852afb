/* kernel_host: being written (issue 8). */
int plait_cuda_placeholder_kernel_host;
