/* topology/discover.c: being written (docs/topology.md). */
