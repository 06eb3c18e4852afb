/* topology/system.c: being written (docs/topology.md). */
