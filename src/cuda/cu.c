/* cu: being written (issue 8). */
int plait_cuda_placeholder_cu;
