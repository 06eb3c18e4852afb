/* topology/hwloc.c: being written (docs/topology.md). */
