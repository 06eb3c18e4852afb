/*
 * perf/conn_footprint.c — one rank of perf/conn_footprint.sh: what a
 * communicator costs in shared memory, file descriptors and time, and what its
 * first collective or point-to-point call costs compared with the second.
 *
 *   conn_footprint --pattern allreduce|p2p --dir DIR [--timeout S]
 *
 * The rank comes from the launcher's environment (PLAIT_RANK, PLAIT_NRANKS,
 * PLAIT_COMM_ID, PLAIT_SECRET: plait_comm_init_from_env), public API only.
 *
 * Two file barriers, run by the script, keep the launch out of the timings:
 * each rank creates DIR/ready0.<rank> and waits for DIR/go0 before
 * plait_comm_init_from_env (so that init does not include waiting for the last
 * process to be forked), then DIR/ready1.<rank> and waits for DIR/go1 before
 * its first call; a third (ready2/go2) keeps every rank alive until all have
 * measured their footprint after the calls.
 *
 * Patterns: "allreduce": an 8-byte float sum twice, then a 1 MiB one twice;
 * "p2p": each rank sends to rank + 1 and receives from rank - 1 in one group
 * (the only peers it needs), 8 bytes twice, then 1 MiB twice. Each call is
 * blocking (NULL stream) and timed alone.
 *
 * The footprint is read from this process's /proc/self/smaps and
 * /proc/self/fd (descriptors 0-2 not counted) right after init and again after the calls. plait unlinks its
 * shared-memory segments once every rank has mapped them, so they are counted
 * as mappings of "/dev/shm/plait-*", deleted or not, not from /dev/shm.
 *
 * Output, on stdout, one line of key=value per phase:
 *   phase=init|end rank= pid= nranks= init_us= maps= shm_vsz= shm_rss= shm_pss= fds= sockets= other_fds=
 *   phase=calls rank= first8_us= second8_us= first1m_us= second1m_us=
 *   seginit|segend <device> <inode> <offset> <bytes>  one line per mapping, before the
 *       phase's line: the script counts each segment once in the total, however many ranks map it
 */
#define _GNU_SOURCE

#include "plait.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FP_BIG_BYTES (1u << 20)

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void die(const char *what, int rank)
{
    fprintf(stderr, "conn_footprint: rank %d: %s\n", rank, what);
    exit(1);
}

/* Creates DIR/<name>.<rank>, then waits (polling) until DIR/<go> exists. */
static void file_barrier(const char *dir, const char *name, const char *go, int rank, double timeout_s)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.%d", dir, name, rank);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd < 0)
        die("cannot create the barrier file", rank);
    close(fd);
    snprintf(path, sizeof(path), "%s/%s", dir, go);
    double deadline = now_us() + timeout_s * 1e6;
    struct stat st;
    while (stat(path, &st) != 0) {
        if (now_us() > deadline)
            die("timed out waiting for the launcher's barrier", rank);
        usleep(1000);
    }
}

struct footprint {
    int maps;
    unsigned long long vsz, rss, pss;
    int fds, sockets;
};

static int is_plait_shm(const char *path)
{
    return strncmp(path, "/dev/shm/plait-", 15) == 0;
}

/* Sums the smaps entries of /dev/shm/plait-* mappings; with `seg_prefix`,
 * prints one "<seg_prefix> dev inode offset bytes" line per mapping. */
static void read_footprint(struct footprint *fp, const char *seg_prefix, int rank)
{
    memset(fp, 0, sizeof(*fp));
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        die("cannot open /proc/self/smaps", rank);
    char line[4096];
    int in_shm = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned long long lo, hi, off, ino;
        char perms[8], dev[32];
        int pos = 0;
        if (sscanf(line, "%llx-%llx %7s %llx %31s %llu %n", &lo, &hi, perms, &off, dev, &ino, &pos) == 6) {
            char *path = line + pos;
            path[strcspn(path, "\n")] = 0;
            in_shm = is_plait_shm(path);
            if (in_shm) {
                fp->maps++;
                fp->vsz += hi - lo;
                if (seg_prefix)
                    printf("%s %s %llu %llu %llu\n", seg_prefix, dev, ino, off, hi - lo);
            }
            continue;
        }
        if (!in_shm)
            continue;
        unsigned long long kb;
        if (sscanf(line, "Rss: %llu kB", &kb) == 1)
            fp->rss += kb * 1024;
        else if (sscanf(line, "Pss: %llu kB", &kb) == 1)
            fp->pss += kb * 1024;
    }
    fclose(f);

    DIR *d = opendir("/proc/self/fd");
    if (!d)
        die("cannot open /proc/self/fd", rank);
    int self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        /* Not counted: this directory's own descriptor and stdin/stdout/stderr. */
        if (e->d_name[0] == '.' || atoi(e->d_name) == self || atoi(e->d_name) <= 2)
            continue;
        char link[300], target[256];
        snprintf(link, sizeof(link), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof(target) - 1);
        if (n < 0)
            continue;
        target[n] = 0;
        fp->fds++;
        if (strncmp(target, "socket:", 7) == 0)
            fp->sockets++;
        else if (seg_prefix) {
            /* What the other descriptors are: "pipe", "anon_inode:[eventfd]", a path. */
            char *br = strchr(target, ':');
            if (br && strncmp(target, "anon_inode:", 11) != 0)
                *br = 0;
            printf("%sfd %s\n", seg_prefix, target);
        }
    }
    closedir(d);
}

static void print_footprint(const char *phase, int rank, int nranks, double init_us, const struct footprint *fp)
{
    printf("phase=%s rank=%d pid=%d nranks=%d init_us=%.0f maps=%d shm_vsz=%llu shm_rss=%llu shm_pss=%llu fds=%d "
           "sockets=%d other_fds=%d\n",
           phase, rank, (int)getpid(), nranks, init_us, fp->maps, fp->vsz, fp->rss, fp->pss, fp->fds, fp->sockets,
           fp->fds - fp->sockets);
    fflush(stdout);
}

static plait_result_t one_call(int p2p, const float *send, float *recv, size_t count, int rank, int nranks,
                               plait_comm_t comm)
{
    if (!p2p)
        return plait_allreduce(send, recv, count, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    plait_result_t res = plait_group_start();
    if (res != PLAIT_SUCCESS)
        return res;
    res = plait_send(send, count, PLAIT_FLOAT32, (rank + 1) % nranks, comm, NULL);
    if (res == PLAIT_SUCCESS)
        res = plait_recv(recv, count, PLAIT_FLOAT32, (rank + nranks - 1) % nranks, comm, NULL);
    plait_result_t end = plait_group_end();
    return res != PLAIT_SUCCESS ? res : end;
}

static double timed_call(int p2p, const float *send, float *recv, size_t count, int rank, int nranks,
                         plait_comm_t comm)
{
    double t0 = now_us();
    plait_result_t res = one_call(p2p, send, recv, count, rank, nranks, comm);
    double t = now_us() - t0;
    if (res != PLAIT_SUCCESS) {
        fprintf(stderr, "conn_footprint: rank %d: %s of %zu floats: %s (%s)\n", rank, p2p ? "send/recv" : "allreduce",
                count, plait_get_error_string(res), plait_get_last_error(comm));
        exit(1);
    }
    /* allreduce: every rank's input is 1 + rank, so each output is n(n+1)/2;
     * p2p: the previous rank's 1 + rank. Both exact in float here. */
    int prev = (rank + nranks - 1) % nranks;
    float want = p2p ? (float)(1 + prev) : (float)nranks * (float)(nranks + 1) / 2.0f;
    for (size_t i = 0; i < count; i++)
        if (recv[i] != want) {
            fprintf(stderr, "conn_footprint: rank %d: wrong result at %zu: %g, expected %g\n", rank, i,
                    (double)recv[i], (double)want);
            exit(1);
        }
    return t;
}

int main(int argc, char **argv)
{
    const char *pattern = "allreduce", *dir = NULL;
    double timeout_s = 600;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pattern") && i + 1 < argc)
            pattern = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout_s = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s --pattern allreduce|p2p --dir DIR [--timeout S]\n", argv[0]);
            return 2;
        }
    }
    int p2p = !strcmp(pattern, "p2p");
    if (!dir || (!p2p && strcmp(pattern, "allreduce"))) {
        fprintf(stderr, "usage: %s --pattern allreduce|p2p --dir DIR [--timeout S]\n", argv[0]);
        return 2;
    }
    const char *r_env = getenv("PLAIT_RANK");
    int rank = r_env ? atoi(r_env) : -1;

    file_barrier(dir, "ready0", "go0", rank, timeout_s);
    plait_comm_t comm = NULL;
    double t0 = now_us();
    plait_result_t res = plait_comm_init_from_env(&comm, NULL);
    double init_us = now_us() - t0;
    if (res != PLAIT_SUCCESS) {
        fprintf(stderr, "conn_footprint: rank %d: plait_comm_init_from_env: %s (%s)\n", rank,
                plait_get_error_string(res), plait_get_last_error(NULL));
        return 1;
    }
    int nranks = 0;
    if (plait_comm_count(comm, &nranks) != PLAIT_SUCCESS || plait_comm_rank(comm, &rank) != PLAIT_SUCCESS)
        die("cannot read the communicator's rank and size", rank);

    struct footprint fp;
    read_footprint(&fp, "seginit", rank);
    print_footprint("init", rank, nranks, init_us, &fp);

    size_t big = FP_BIG_BYTES / sizeof(float);
    float *send = malloc(big * sizeof(float)), *recv = malloc(big * sizeof(float));
    if (!send || !recv)
        die("out of memory", rank);
    for (size_t i = 0; i < big; i++)
        send[i] = (float)(1 + rank);

    file_barrier(dir, "ready1", "go1", rank, timeout_s);
    double f8 = timed_call(p2p, send, recv, 2, rank, nranks, comm);
    double s8 = timed_call(p2p, send, recv, 2, rank, nranks, comm);
    double f1m = timed_call(p2p, send, recv, big, rank, nranks, comm);
    double s1m = timed_call(p2p, send, recv, big, rank, nranks, comm);
    printf("phase=calls rank=%d first8_us=%.1f second8_us=%.1f first1m_us=%.1f second1m_us=%.1f\n", rank, f8, s8,
           f1m, s1m);

    read_footprint(&fp, "segend", rank);
    print_footprint("end", rank, nranks, init_us, &fp);
    /* No rank finalizes (and closes what its peers watch) before all have measured. */
    file_barrier(dir, "ready2", "go2", rank, timeout_s);

    res = plait_comm_finalize(comm);
    plait_result_t dres = plait_comm_destroy(comm);
    free(send);
    free(recv);
    if (res != PLAIT_SUCCESS || dres != PLAIT_SUCCESS) {
        fprintf(stderr, "conn_footprint: rank %d: finalize/destroy: %s\n", rank,
                plait_get_error_string(res != PLAIT_SUCCESS ? res : dres));
        return 1;
    }
    return 0;
}
