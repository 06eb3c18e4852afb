/* topology/nccl_xml.c: being written (docs/topology.md). */
