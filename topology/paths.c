/* topology/paths.c: being written (docs/topology.md). */
