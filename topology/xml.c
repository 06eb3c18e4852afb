/* topology/xml.c: being written (docs/topology.md). */
