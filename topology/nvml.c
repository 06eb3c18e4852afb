/* topology/nvml.c: being written (docs/topology.md). */
