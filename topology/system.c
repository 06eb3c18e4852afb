/* The graph this process uses (PLAIT_TOPO_FILE, NCCL_TOPO_FILE or discovery),
 * the NUMA node a rank runs on, and the one-line summary of a host. */
#define _GNU_SOURCE
#include "topology/topo.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/env.h"
#include "base/file.h"
#include "base/log.h"

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static struct plait_topo *topo_global;
static plait_result_t topo_status;
static char topo_error[512];

/* PLAIT_TOPO_FILE is plait's own setting and strict: a file that cannot be
 * used fails init. NCCL_TOPO_FILE keeps NCCL's behaviour, so that jobs written
 * for NCCL keep running: a WARN, then discovery. */
static void topo_load_once(void)
{
    const char *mine = getenv("PLAIT_TOPO_FILE");
    const char *nccl = getenv("NCCL_TOPO_FILE");
    struct plait_topo *t = NULL;
    plait_result_t r;

    if (mine && *mine) {
        r = plait_topo_load_xml(mine, &t);
        if (r != PLAIT_SUCCESS) {
            topo_status = plait_error_context(r, "PLAIT_TOPO_FILE=%s", mine);
            snprintf(topo_error, sizeof(topo_error), "%s", plait_last_error_get());
            return;
        }
        PLAIT_INFO(PLAIT_SUBSYS_GRAPH, "topology: loaded from PLAIT_TOPO_FILE=%s (%s)", mine, t->source);
    } else if (nccl && *nccl) {
        r = plait_topo_load_xml(nccl, &t);
        if (r == PLAIT_SUCCESS)
            PLAIT_INFO(PLAIT_SUBSYS_GRAPH, "topology: loaded from NCCL_TOPO_FILE=%s (%s)", nccl, t->source);
        else
            PLAIT_WARN(PLAIT_SUBSYS_ENV, "NCCL_TOPO_FILE=%s cannot be used (%s); discovering the machine instead",
                       nccl, plait_last_error_get());
    }
    if (t == NULL) {
        r = plait_topo_discover(NULL, &t);
        if (r != PLAIT_SUCCESS) {
            /* Discovery degrades, it never stops a job: a machine it cannot
             * describe (a graph over the limits, a broken driver) runs as one
             * NUMA node, which is what plait assumed before it had a topology. */
            PLAIT_WARN(PLAIT_SUBSYS_GRAPH, "topology: discovery failed (%s); using one NUMA node instead",
                       plait_last_error_get());
            t = NULL;
            if (plait_topo_create(&t) != PLAIT_SUCCESS || plait_topo_add_node(t, PLAIT_TOPO_CPU, NULL) < 0) {
                plait_topo_free(t);
                topo_status = PLAIT_ERR_SYSTEM;
                snprintf(topo_error, sizeof(topo_error), "topology: out of memory");
                return;
            }
            snprintf(t->source, sizeof(t->source), "fallback");
        }
    }
    topo_global = t;
}

plait_result_t plait_topo_get(const struct plait_topo **topo_out)
{
    pthread_once(&topo_once, topo_load_once);
    if (topo_global == NULL)
        return plait_error(topo_status ? topo_status : PLAIT_ERR_INTERNAL, "%s", topo_error);
    *topo_out = topo_global;
    return PLAIT_SUCCESS;
}

plait_result_t plait_topo_dump_once(const struct plait_topo *topo)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static int dumped;
    const char *var = getenv("PLAIT_TOPO_DUMP_FILE") ? "PLAIT_TOPO_DUMP_FILE" : "NCCL_TOPO_DUMP_FILE";
    const char *path = plait_env_get("PLAIT_TOPO_DUMP_FILE");
    plait_result_t r = PLAIT_SUCCESS;
    if (path == NULL || *path == '\0')
        return PLAIT_SUCCESS;
    pthread_mutex_lock(&lock);
    if (!dumped) {
        /* Rank 0 of several communicators, in several processes, may dump at
         * once: plait_file_write makes a regular file one whole dump (a
         * temporary renamed into place) and writes a FIFO, a device or
         * /dev/stdout as such (base/file.h). */
        char *xml = NULL;
        char why[PATH_MAX + 256];
        dumped = 1;
        if ((r = plait_topo_dump_xml_buffer(topo, &xml)) == PLAIT_SUCCESS &&
            plait_file_write(path, xml, strlen(xml), why, sizeof(why)) != 0)
            r = plait_error(PLAIT_ERR_SYSTEM, "%s=%s: %s", var, path, why);
        free(xml);
        if (r == PLAIT_SUCCESS)
            PLAIT_INFO(PLAIT_SUBSYS_GRAPH, "topology: written to %s", path);
        else
            PLAIT_WARN(PLAIT_SUBSYS_GRAPH, "topology: cannot dump: %s", plait_last_error_get());
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* Whether cpu `c` is in the hwloc list "0-55,112-167". */
static bool cpuset_has(const char *list, int c)
{
    const char *p = list;
    while (*p) {
        char *end;
        long lo = strtol(p, &end, 10), hi;
        if (end == p || lo < 0)
            return false;
        hi = lo;
        if (*end == '-') {
            p = end + 1;
            hi = strtol(p, &end, 10);
            if (end == p || hi < lo)
                return false;
        }
        if (c >= lo && c <= hi)
            return true;
        if (*end != ',')
            return false;
        p = end + 1;
    }
    return false;
}

int plait_topo_cpu_of_self(const struct plait_topo *topo)
{
    cpu_set_t set;
    int cpu = -1;
    /* Where the thread may run, not where it happens to run now: a rank bound
     * to a NUMA node belongs there, and an unbound rank is put on the node of
     * its first allowed CPU on every run, so that ring orders do not change
     * with the scheduler's whims. */
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) {
                cpu = c;
                break;
            }
    }
    if (cpu < 0)
        cpu = sched_getcpu();
    int first = -1;
    for (int i = 0; i < topo->nnodes; i++) {
        const struct plait_topo_node *n = &topo->nodes[i];
        if (n->type != PLAIT_TOPO_CPU)
            continue;
        if (first < 0)
            first = n->index;
        if (cpu >= 0 && n->cpu.cpuset[0] && cpuset_has(n->cpu.cpuset, cpu))
            return n->index;
    }
    return first;
}

void plait_topo_summary(const struct plait_topo *topo, char *buf, size_t len)
{
    int cores = 0;
    size_t o = 0;
    for (int i = 0; i < topo->nnodes; i++)
        if (topo->nodes[i].type == PLAIT_TOPO_CPU)
            cores += topo->nodes[i].cpu.ncores;
    o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "%d NUMA node%s (%d cores), %d GPU%s",
                          topo->counts[PLAIT_TOPO_CPU], topo->counts[PLAIT_TOPO_CPU] == 1 ? "" : "s", cores,
                          topo->counts[PLAIT_TOPO_GPU], topo->counts[PLAIT_TOPO_GPU] == 1 ? "" : "s");
    int g = plait_topo_nth(topo, PLAIT_TOPO_GPU, 0);
    if (g >= 0 && topo->nodes[g].gpu.model[0])
        o += (size_t)snprintf(buf + o, o < len ? len - o : 0, " (%s)", topo->nodes[g].gpu.model);
    if (topo->counts[PLAIT_TOPO_NVS])
        o += (size_t)snprintf(buf + o, o < len ? len - o : 0, ", %d NVSwitch fabric%s", topo->counts[PLAIT_TOPO_NVS],
                              topo->counts[PLAIT_TOPO_NVS] == 1 ? "" : "s");
    o += (size_t)snprintf(buf + o, o < len ? len - o : 0, ", %d NIC%s", topo->counts[PLAIT_TOPO_NIC],
                          topo->counts[PLAIT_TOPO_NIC] == 1 ? "" : "s");
    const char *sep = " (";
    for (int i = 0; i < topo->nnodes && o < len; i++) {
        const struct plait_topo_node *n = &topo->nodes[i];
        if (n->type != PLAIT_TOPO_NIC)
            continue;
        if (n->nic.speed > 0)
            o += (size_t)snprintf(buf + o, len - o, "%s%s %s %g Gb/s%s", sep, n->nic.dev,
                                  plait_topo_link_layer_name(n->nic.link_layer), n->nic.speed,
                                  n->nic.is_virtual ? " virtual" : "");
        else
            o += (size_t)snprintf(buf + o, len - o, "%s%s %s%s", sep, n->nic.dev,
                                  plait_topo_link_layer_name(n->nic.link_layer), n->nic.is_virtual ? " virtual" : "");
        sep = ", ";
    }
    if (*sep == ',' && o < len)
        snprintf(buf + o, len - o, ")");
}

static pthread_once_t paths_once = PTHREAD_ONCE_INIT;
static struct plait_topo_paths *paths_global;

static void paths_once_fn(void)
{
    const struct plait_topo *t;
    if (plait_topo_get(&t) == PLAIT_SUCCESS && plait_topo_paths_compute(t, &paths_global) != PLAIT_SUCCESS)
        paths_global = NULL;
}

plait_result_t plait_topo_get_paths(const struct plait_topo_paths **paths_out)
{
    const struct plait_topo *t;
    plait_result_t r = plait_topo_get(&t);
    if (r != PLAIT_SUCCESS)
        return r;
    pthread_once(&paths_once, paths_once_fn);
    if (paths_global == NULL)
        return plait_error(PLAIT_ERR_INTERNAL, "topology: the paths of this machine's graph could not be computed");
    *paths_out = paths_global;
    return PLAIT_SUCCESS;
}

/* FNV-1a over what makes two graphs the same machine for channel search. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t plait_topo_hash(const struct plait_topo *topo)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv(h, &topo->nnodes, sizeof(topo->nnodes));
    h = fnv(h, &topo->nlinks, sizeof(topo->nlinks));
    for (int i = 0; i < topo->nnodes; i++) {
        const struct plait_topo_node *n = &topo->nodes[i];
        int t = (int)n->type;
        h = fnv(h, &t, sizeof(t));
        h = fnv(h, n->name, strlen(n->name));
        h = fnv(h, &n->busid, sizeof(n->busid));
        h = fnv(h, &n->numa, sizeof(n->numa));
    }
    for (int i = 0; i < topo->nlinks; i++) {
        const struct plait_topo_link *l = &topo->links[i];
        int v[4] = {l->a, l->b, (int)l->type, l->lanes};
        h = fnv(h, v, sizeof(v));
        h = fnv(h, &l->bw, sizeof(l->bw));
    }
    return h;
}
