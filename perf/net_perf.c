/* Point-to-point bandwidth and latency of a net provider between two
 * processes (the Socket provider by default; loopback unless
 * PLAIT_SOCKET_IFNAME says otherwise).
 *
 *   net_perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-w WINDOW] [-t SECONDS]
 *            [-T NTHREADS] [-S NSOCKS_PER_THREAD]
 *
 * -T/-S set PLAIT_SOCKET_NTHREADS/PLAIT_NSOCKS_PERTHREAD for both processes.
 * Per size: one-way streaming with WINDOW requests in flight for about
 * SECONDS (GB/s as the receiver sees it, 1 GB = 1e9 bytes), then a ping-pong
 * of the same size over a second connection the other way (half the round
 * trip, microseconds). The parent forks the sender before anything of plait
 * runs; the handles travel over pipes. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"
#include "transports/net/provider.h"

static const struct plait_net_provider *const P = &plait_net_socket;

static void die(const char *what)
{
    fprintf(stderr, "net_perf: %s: %s\n", what, plait_last_error_get());
    exit(1);
}

static void xwrite(int fd, const void *b, size_t n)
{
    if (write(fd, b, n) != (ssize_t)n) {
        perror("net_perf: pipe write");
        exit(1);
    }
}

static void xread(int fd, void *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)b + got, n - got);
        if (r <= 0) {
            fprintf(stderr, "net_perf: pipe read: %s\n", r == 0 ? "peer exited" : strerror(errno));
            exit(1);
        }
        got += (size_t)r;
    }
}

static void wait_req(void *req)
{
    const double deadline = plait_now() + 60;
    for (;;) {
        int done = 0;
        if (P->test(req, &done, NULL) != PLAIT_SUCCESS)
            die("test");
        if (done)
            return;
        /* Let the helper threads (and the peer, on a small machine) run:
         * a spinning caller would hold the core they need until its tick. */
        sched_yield();
        if (plait_now() > deadline) {
            fprintf(stderr, "net_perf: a request took more than 60 s\n");
            exit(1);
        }
    }
}

/* The receiving side of one connection: listen, hand the handle over, accept. */
static void *open_recv(void *ctx, int to_peer, void **lcomm)
{
    uint8_t h[PLAIT_NET_HANDLE_BYTES];
    void *r = NULL;
    if (P->listen(ctx, 0, h, lcomm) != PLAIT_SUCCESS)
        die("listen");
    xwrite(to_peer, h, sizeof(h));
    const double deadline = plait_now() + 30;
    while (!r) {
        if (P->accept(*lcomm, &r) != PLAIT_SUCCESS)
            die("accept");
        if (plait_now() > deadline) {
            fprintf(stderr, "net_perf: accept not done after 30 s\n");
            exit(1);
        }
    }
    return r;
}

static void *open_send(void *ctx, int from_peer)
{
    uint8_t h[PLAIT_NET_HANDLE_BYTES];
    void *s = NULL;
    xread(from_peer, h, sizeof(h));
    const double deadline = plait_now() + 30;
    while (!s) {
        if (P->connect(ctx, 0, h, &s) != PLAIT_SUCCESS)
            die("connect");
        if (plait_now() > deadline) {
            fprintf(stderr, "net_perf: connect not done after 30 s\n");
            exit(1);
        }
    }
    return s;
}

struct opts {
    size_t minb, maxb;
    int factor, window;
    double seconds;
};

/* Iterations for a size: agreed by both sides from the same formula. */
static long iters_for(const struct opts *o, size_t size)
{
    /* Aim at ~seconds at 2 GB/s, at least 20, at most 200000. */
    double n = o->seconds * 2e9 / (double)(size ? size : 1);
    if (n < 20)
        n = 20;
    if (n > 200000)
        n = 200000;
    return (long)n;
}

static void run(int is_parent, int to_peer, int from_peer, const struct opts *o)
{
    void *ctx = NULL;
    if (P->init(&ctx, 0, NULL) != PLAIT_SUCCESS)
        die("init");
    /* Connection 1: child -> parent (bandwidth); 2: parent -> child (pong). */
    void *l1 = NULL, *l2 = NULL, *r = NULL, *s = NULL;
    if (is_parent) {
        r = open_recv(ctx, to_peer, &l1);
        s = open_send(ctx, from_peer);
    } else {
        s = open_send(ctx, from_peer);
        r = open_recv(ctx, to_peer, &l2);
    }
    char *buf = malloc(o->maxb * (size_t)o->window + 1);
    char *one = malloc(o->maxb + 1);
    if (!buf || !one) {
        fprintf(stderr, "net_perf: out of memory\n");
        exit(1);
    }
    memset(buf, 1, o->maxb * (size_t)o->window + 1);
    memset(one, 2, o->maxb + 1);
    if (is_parent) {
        struct plait_net_properties props;
        if (P->get_properties(ctx, 0, &props) != PLAIT_SUCCESS)
            die("get_properties");
        printf("# provider %s, device %s, %s threads x %s sockets per thread\n", P->name, props.name,
               getenv("PLAIT_SOCKET_NTHREADS") ? getenv("PLAIT_SOCKET_NTHREADS") : "auto",
               getenv("PLAIT_NSOCKS_PERTHREAD") ? getenv("PLAIT_NSOCKS_PERTHREAD") : "auto");
        printf("# %12s %10s %10s %12s\n", "bytes", "iters", "GB/s", "latency_us");
    }
    for (size_t size = o->minb; size <= o->maxb; size = size * (size_t)o->factor) {
        const long n = iters_for(o, size);
        void *reqs[64];
        int tag[1] = {0};
        /* Streaming, window requests in flight, round robin over the window's buffers. */
        char sync = 0;
        if (is_parent)
            xwrite(to_peer, &sync, 1);
        else
            xread(from_peer, &sync, 1);
        double t0 = plait_now();
        long posted = 0, doneq = 0;
        while (doneq < n) {
            while (posted < n && posted - doneq < o->window) {
                char *b = buf + (size_t)(posted % o->window) * o->maxb;
                void *req = NULL;
                plait_result_t st;
                if (is_parent) {
                    void *d[1] = {b};
                    size_t c[1] = {size};
                    st = P->irecv(r, 1, d, c, tag, NULL, &req);
                } else {
                    st = P->isend(s, b, size, 0, NULL, &req);
                }
                if (st != PLAIT_SUCCESS)
                    die(is_parent ? "irecv" : "isend");
                if (!req)
                    break;
                reqs[posted % o->window] = req;
                posted++;
            }
            wait_req(reqs[doneq % o->window]);
            doneq++;
        }
        double t1 = plait_now();
        double gbs = (double)size * (double)n / (t1 - t0) / 1e9;
        /* Ping-pong: the parent sends on its send comm, the child answers. */
        const long np = n / 10 < 10 ? 10 : (n / 10 > 20000 ? 20000 : n / 10);
        if (is_parent)
            xread(from_peer, &sync, 1);
        else
            xwrite(to_peer, &sync, 1);
        double p0 = plait_now();
        for (long i = 0; i < np; i++) {
            void *sq = NULL, *rq = NULL, *d[1] = {one};
            size_t c[1] = {size};
            if (is_parent) {
                if (P->isend(s, one, size, 0, NULL, &sq) != PLAIT_SUCCESS || !sq)
                    die("isend");
                if (P->irecv(r, 1, d, c, tag, NULL, &rq) != PLAIT_SUCCESS || !rq)
                    die("irecv");
                wait_req(sq);
                wait_req(rq);
            } else {
                if (P->irecv(r, 1, d, c, tag, NULL, &rq) != PLAIT_SUCCESS || !rq)
                    die("irecv");
                wait_req(rq);
                if (P->isend(s, one, size, 0, NULL, &sq) != PLAIT_SUCCESS || !sq)
                    die("isend");
                wait_req(sq);
            }
        }
        double lat = (plait_now() - p0) / (double)np / 2 * 1e6;
        if (is_parent) {
            printf("  %12zu %10ld %10.3f %12.2f\n", size, n, gbs, lat);
            fflush(stdout);
        }
        if (size == 0)
            size = 1;
    }
    P->close_send(s);
    P->close_recv(r);
    if (l1)
        P->close_listen(l1);
    if (l2)
        P->close_listen(l2);
    P->finalize(ctx);
    free(buf);
    free(one);
}

int main(int argc, char **argv)
{
    struct opts o = {8, 64u << 20, 8, 8, 0.5};
    int c;
    while ((c = getopt(argc, argv, "b:e:f:w:t:T:S:h")) != -1) {
        switch (c) {
        case 'b':
            o.minb = strtoull(optarg, NULL, 0);
            break;
        case 'e':
            o.maxb = strtoull(optarg, NULL, 0);
            break;
        case 'f':
            o.factor = atoi(optarg);
            break;
        case 'w':
            o.window = atoi(optarg);
            break;
        case 't':
            o.seconds = atof(optarg);
            break;
        case 'T':
            setenv("PLAIT_SOCKET_NTHREADS", optarg, 1);
            break;
        case 'S':
            setenv("PLAIT_NSOCKS_PERTHREAD", optarg, 1);
            break;
        default:
            fprintf(stderr, "usage: net_perf [-b MIN] [-e MAX] [-f FACTOR] [-w WINDOW 1..32] [-t SECONDS] "
                            "[-T NTHREADS] [-S NSOCKS_PER_THREAD]\n");
            return 2;
        }
    }
    if (o.factor < 2 || o.window < 1 || o.window > 32 || o.minb > o.maxb || o.maxb > (1ull << 30)) {
        fprintf(stderr, "net_perf: bad arguments (factor >= 2, window 1..32, min <= max <= 1 GiB)\n");
        return 2;
    }
    if (!getenv("PLAIT_SOCKET_IFNAME") && !getenv("NCCL_SOCKET_IFNAME"))
        setenv("PLAIT_SOCKET_IFNAME", "=lo", 1);
    int p2c[2], c2p[2];
    if (pipe(p2c) != 0 || pipe(c2p) != 0) {
        perror("net_perf: pipe");
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("net_perf: fork");
        return 1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p2c[1]);
        close(c2p[0]);
        run(0, c2p[1], p2c[0], &o);
        _exit(0);
    }
    close(p2c[0]);
    close(c2p[1]);
    run(1, p2c[1], c2p[0], &o);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
