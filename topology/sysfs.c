/* topology/sysfs.c: being written (docs/topology.md). */
