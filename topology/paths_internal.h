/* The route search behind plait_topo_paths_compute, shared with the channel
 * search (search.c), which needs not only each best path's figures but the
 * links it crosses, to count the load of a set of channels on every link
 * direction. Private to topology/. */
#ifndef PLAIT_TOPO_PATHS_INTERNAL_H
#define PLAIT_TOPO_PATHS_INTERNAL_H

#include "topology/topo.h"

/* A reusable workspace for best-path searches over one graph. The graph must
 * outlive it and not change while it is used. Not thread-safe (one per thread). */
struct plait_topo_router;

/* PLAIT_ERR_SYSTEM when out of memory, PLAIT_ERR_INVALID_ARGUMENT when a link
 * names a node that does not exist. */
plait_result_t plait_topo_router_create(const struct plait_topo *topo, struct plait_topo_router **router_out);
void plait_topo_router_free(struct plait_topo_router *router);

/* The best paths from `src` to every node, into row[0..topo->nnodes) (the row
 * of plait_topo_paths_compute's matrix). PLAIT_ERR_SYSTEM when out of memory. */
plait_result_t plait_topo_router_run(struct plait_topo_router *router, int src, struct plait_topo_path *row);

/* After plait_topo_router_run(src): the best route from src to `dst` as
 * directed links, 2 * link index + (1 when it is crossed from its b end to its
 * a end), in order from src. Returns how many links it has (0 for src itself,
 * -1 when dst is unreachable); writes at most `max` of them. */
int plait_topo_router_route(const struct plait_topo_router *router, int dst, int *dlinks, int max);

#endif
