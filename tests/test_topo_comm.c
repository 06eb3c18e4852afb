/* The communicator and the topology (core/comm_topo.c, topology/system.c): each
 * rank describes its NUMA node and its host's graph, every host's channel search
 * orders its ranks, all ranks agree on the ring orders, the collectives stay
 * right over those orders; PLAIT_TOPO_FILE, NCCL_TOPO_FILE and
 * PLAIT_TOPO_DUMP_FILE; PLAIT_DEBUG=INFO prints one summary line per host.
 *
 * Ranks are processes (the graph is loaded once per process); "hosts" are made
 * with PLAIT_HOSTID, as in test_hier.c. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"
#include "base/log.h"
#include "topology/topo.h"

#define FAIL(...)                                         \
    do {                                                  \
        snprintf(c->msg, c->msglen, __VA_ARGS__);         \
        return 1;                                         \
    } while (0)

struct comm_case {
    const char *hosts;     /* host letter per rank, "" = one host */
    const char *topo_file; /* PLAIT_TOPO_FILE or NULL */
    int pin;               /* pin rank r to CPU r % 2 */
    char tag[32];          /* log file names */
    int parent;            /* the test process's pid, in log file names */
};

static void log_path(const struct comm_case *k, int rank, char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/plait_test_topo_comm_%s_%d_%d.log", k->tag, k->parent, rank);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strdup(buf);
}

/* An allreduce and an allgather whose results depend on every rank's data, over
 * the ring algorithm (which follows the topology's ring orders). */
static int check_collectives(plait_comm_t comm, int rank, int n, char *msg, size_t len)
{
    static const size_t counts[] = {1, 1000, 300001};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t count = counts[k];
        float *s = malloc(count * sizeof(float)), *r = malloc(count * sizeof(float) * (size_t)n);
        if (!s || !r)
            return snprintf(msg, len, "out of memory"), free(s), free(r), 1;
        for (size_t i = 0; i < count; i++)
            s[i] = (float)((rank + 1) * (int)(i % 7 + 1));
        plait_result_t res = plait_allreduce(s, r, count, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
        for (size_t i = 0; res == PLAIT_SUCCESS && i < count; i++) {
            float want = (float)((int)(i % 7 + 1) * n * (n + 1) / 2);
            if (r[i] != want) {
                snprintf(msg, len, "allreduce count %zu: [%zu] = %g, want %g", count, i, r[i], want);
                free(s), free(r);
                return 1;
            }
        }
        if (res == PLAIT_SUCCESS)
            res = plait_allgather(s, r, count, PLAIT_FLOAT32, comm, NULL);
        for (int q = 0; res == PLAIT_SUCCESS && q < n; q++)
            for (size_t i = 0; i < count; i++)
                if (r[(size_t)q * count + i] != (float)((q + 1) * (int)(i % 7 + 1))) {
                    snprintf(msg, len, "allgather count %zu: block %d [%zu] wrong", count, q, i);
                    free(s), free(r);
                    return 1;
                }
        free(s);
        free(r);
        if (res != PLAIT_SUCCESS) {
            snprintf(msg, len, "count %zu: %s: %s", count, plait_get_error_string(res), plait_get_last_error(comm));
            return 1;
        }
    }
    return 0;
}

static int comm_child(struct mr_child *c, void *arg)
{
    const struct comm_case *k = arg;
    char hostid[64], logpath[160];
    if (k->hosts[0]) {
        snprintf(hostid, sizeof(hostid), "plait-test-topo-%c", k->hosts[c->rank]);
        setenv("PLAIT_HOSTID", hostid, 1);
    }
    if (k->topo_file)
        setenv("PLAIT_TOPO_FILE", k->topo_file, 1);
    if (k->pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(c->rank % 2, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0)
            FAIL("cannot pin rank %d to CPU %d", c->rank, c->rank % 2);
    }
    log_path(k, c->rank, logpath, sizeof(logpath));
    unlink(logpath);
    setenv("PLAIT_ALGO", "ring", 1);
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    setenv("PLAIT_DEBUG", "INFO", 1);
    setenv("PLAIT_DEBUG_SUBSYS", "INIT,GRAPH", 1);
    setenv("PLAIT_DEBUG_FILE", logpath, 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r)
        FAIL("init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
    int bad = check_collectives(comm, c->rank, c->nranks, c->msg, c->msglen);
    plait_comm_destroy(comm);
    return bad;
}

static void run_case(struct comm_case *k, int n)
{
    char msg[2048];
    struct mr_procs *p = mr_procs_start(n, comm_child, k, 0, 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 200, msg, sizeof(msg));
    mr_procs_free(p);
    cr_assert_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
}

/* The ranks of "ring 0 over ranks ..." in a log, or 0 if there is none. */
static int ring_in_log(const char *log, int *ranks, int max)
{
    const char *at = strstr(log, "ring 0 over ranks ");
    if (at == NULL)
        return 0;
    at += strlen("ring 0 over ranks ");
    int k = 0;
    char *end;
    for (long v = strtol(at, &end, 10); end != at && k < max; v = strtol(at, &end, 10)) {
        ranks[k++] = (int)v;
        at = end;
    }
    return k;
}

static int count_lines(const char *log, const char *needle)
{
    int k = 0;
    for (const char *p = log; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        k++;
    return k;
}

/* Ranks 0 and 2 on host a, 1 and 3 on host b: the ring visits each host's ranks
 * together (0 2 1 3), and each host says once what it has. */
Test(topo_comm, interleaved_hosts_ring_grouped_one_line_per_host, .timeout = 240)
{
    struct comm_case k = {.hosts = "abab", .tag = "hosts", .parent = (int)getpid()};
    run_case(&k, 4);
    char path[160];
    int lines = 0;
    for (int r = 0; r < 4; r++) {
        log_path(&k, r, path, sizeof(path));
        char *log = read_file(path);
        cr_assert_not_null(log, "rank %d wrote no log at %s", r, path);
        int here = count_lines(log, "topology: host ");
        lines += here;
        if (r < 2) {
            /* ranks 0 and 1 are local rank 0 of hosts a and b */
            cr_expect_eq(here, 2, "rank %d (local rank 0): want its host's summary and search lines, got %d:\n%s", r,
                         here, log);
            cr_expect(strstr(log, ": 2 ranks, ") != NULL, "rank %d: no \"2 ranks\" summary:\n%s", r, log);
            cr_expect(strstr(log, "NUMA node") != NULL, "rank %d: the summary names no NUMA node:\n%s", r, log);
            int ring[8], m = ring_in_log(log, ring, 8);
            cr_expect_eq(m, 2, "rank %d: want the host's two ranks in its ring line:\n%s", r, log);
            if (m == 2)
                cr_expect(ring[0] == r && ring[1] == r + 2, "rank %d: host ring %d %d, want %d %d", r, ring[0],
                          ring[1], r, r + 2);
        } else {
            cr_expect_eq(here, 0, "rank %d is not its host's first rank but printed a host line:\n%s", r, log);
        }
        free(log);
        unlink(path);
    }
    cr_expect_eq(lines, 4, "want 2 lines per host (summary, search), got %d", lines);
}

/* Two NUMA nodes (a fixture: CPU 0 and CPU 1), ranks pinned alternately: the
 * search orders them so that the ring crosses between the nodes twice, not four
 * times; the collectives stay right over that order. */
Test(topo_comm, numa_nodes_group_ranks, .timeout = 240)
{
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
        cr_skip_test("needs 2 online CPUs to pin ranks to two NUMA nodes");
    char file[512];
    snprintf(file, sizeof(file), "%s/comm/two-numa-2cpu.xml", getenv("PLAIT_TEST_FIXTURES"));
    struct comm_case k = {.hosts = "", .topo_file = file, .pin = 1, .tag = "numa", .parent = (int)getpid()};
    run_case(&k, 4);
    char path[160];
    log_path(&k, 0, path, sizeof(path));
    char *log = read_file(path);
    cr_assert_not_null(log, "rank 0 wrote no log");
    int ring[8], m = ring_in_log(log, ring, 8);
    cr_assert_eq(m, 4, "no ring of 4 ranks in rank 0's log:\n%s", log);
    int crossings = 0;
    for (int i = 0; i < 4; i++)
        crossings += ring[i] % 2 != ring[(i + 1) % 4] % 2;
    cr_expect_eq(crossings, 2, "ring %d %d %d %d crosses between NUMA nodes %d times, want 2", ring[0], ring[1],
                 ring[2], ring[3], crossings);
    cr_expect(strstr(log, "2 NUMA nodes") != NULL, "the summary should count 2 NUMA nodes:\n%s", log);
    /* Each ring crosses the 40 GB/s SYS link once each way: 40 GB/s, and a
     * second channel would only share it. */
    cr_expect(strstr(log, "1 channel found, 40.0 GB/s") != NULL, "want one channel of 40 GB/s:\n%s", log);
    free(log);
    for (int r = 0; r < 4; r++) {
        log_path(&k, r, path, sizeof(path));
        unlink(path);
    }
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static const char malformed[] = "<?xml version=\"1.0\"?>\n<plait_topology version=\"1\">\n  <cpu name=\"cpu0\"\n";

/* PLAIT_TOPO_FILE is strict: init fails, naming the variable, the file and the line. */
Test(topo_comm, bad_plait_topo_file_fails_init, .timeout = 60)
{
    char path[128];
    snprintf(path, sizeof(path), "/tmp/plait_test_topo_bad_%d.xml", (int)getpid());
    write_text(path, malformed);
    setenv("PLAIT_TOPO_FILE", path, 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_all(&comm, 1, NULL);
    const char *err = plait_get_last_error(NULL);
    unlink(path);
    cr_assert_neq(r, PLAIT_SUCCESS, "init succeeded with a malformed PLAIT_TOPO_FILE");
    cr_expect(strstr(err, "PLAIT_TOPO_FILE") != NULL, "the error does not name the variable: %s", err);
    cr_expect(strstr(err, path) != NULL, "the error does not name the file: %s", err);
    cr_expect(strstr(err, ":3") != NULL || strstr(err, ":4") != NULL, "the error gives no line: %s", err);
}

/* NCCL_TOPO_FILE keeps NCCL's leniency: a WARN with the reason, then discovery. */
Test(topo_comm, bad_nccl_topo_file_warns_and_discovers, .timeout = 60)
{
    char path[128], logpath[128];
    snprintf(path, sizeof(path), "/tmp/plait_test_topo_nccl_bad_%d.xml", (int)getpid());
    snprintf(logpath, sizeof(logpath), "/tmp/plait_test_topo_nccl_bad_%d.log", (int)getpid());
    write_text(path, malformed);
    setenv("NCCL_TOPO_FILE", path, 1);
    setenv("PLAIT_DEBUG", "WARN", 1);
    setenv("PLAIT_DEBUG_FILE", logpath, 1);
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_all(&comm, 1, NULL);
    cr_assert_eq(r, PLAIT_SUCCESS, "init failed: %s", plait_get_last_error(NULL));
    plait_comm_destroy(comm);
    char *log = read_file(logpath);
    unlink(path);
    unlink(logpath);
    cr_assert_not_null(log, "no log written");
    cr_expect(strstr(log, "NCCL_TOPO_FILE") != NULL && strstr(log, path) != NULL,
              "no WARN naming NCCL_TOPO_FILE and the file:\n%s", log);
    free(log);
}

/* PLAIT_TOPO_DUMP_FILE: rank 0 writes the graph it uses; it loads back to the
 * same graph as discovering this machine gives. */
Test(topo_comm, dump_file_written_and_reloads, .timeout = 120)
{
    char path[128];
    snprintf(path, sizeof(path), "/tmp/plait_test_topo_dump_%d.xml", (int)getpid());
    unlink(path);
    setenv("PLAIT_TOPO_DUMP_FILE", path, 1);
    plait_comm_t comms[2];
    plait_result_t r = plait_comm_init_all(comms, 2, NULL);
    cr_assert_eq(r, PLAIT_SUCCESS, "init failed: %s", plait_get_last_error(NULL));
    plait_comm_destroy(comms[0]);
    plait_comm_destroy(comms[1]);
    struct plait_topo *loaded = NULL, *found = NULL;
    r = plait_topo_load_xml(path, &loaded);
    unlink(path);
    cr_assert_eq(r, PLAIT_SUCCESS, "the dump does not load: %s", plait_last_error_get());
    cr_assert_eq(plait_topo_discover(NULL, &found), PLAIT_SUCCESS, "discovery: %s", plait_last_error_get());
    cr_expect_eq(loaded->nnodes, found->nnodes, "dump has %d nodes, discovery %d", loaded->nnodes, found->nnodes);
    cr_expect_eq(loaded->nlinks, found->nlinks, "dump has %d links, discovery %d", loaded->nlinks, found->nlinks);
    cr_expect_eq(plait_topo_hash(loaded), plait_topo_hash(found), "the dump is not the discovered graph");
    cr_expect(loaded->counts[PLAIT_TOPO_CPU] >= 1, "no NUMA node in the dump");
    plait_topo_free(loaded);
    plait_topo_free(found);
}
