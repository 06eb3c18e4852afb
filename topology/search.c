/* topology/search.c: being written (docs/topology.md). */
