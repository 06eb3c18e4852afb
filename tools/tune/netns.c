/* plait-tune --calibrate --netns: two network namespaces joined by a veth, so
 * that the socket link's constants (alpha.socket, beta.socket) are measured
 * the way ranks on two hosts talk rather than over loopback (docs/tuning.md,
 * "Calibration").
 *
 * The namespaces are made with iproute2 (`ip netns add`, which names them in
 * /var/run/netns), configured, opened, and then their names are removed at
 * once: from then on the namespaces live only as long as this process holds
 * them open (or a benchmark child is inside one), so that whatever ends the
 * tool (a failure, SIGINT, SIGTERM, even SIGKILL) leaves nothing behind, and
 * the kernel deletes the veth with them. While the names exist (the setup, a
 * fraction of a second) SIGINT, SIGTERM and SIGHUP remove them before the
 * signal takes its course; names that a run killed in that window left are
 * removed by the next run (their pid no longer a plait-tune). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/tune/tune.h"

#define NETNS_DIR "/var/run/netns"
#define NETNS_CMD_TIMEOUT_S 10.0
#define NETNS_LINK_TIMEOUT_S 5.0

/* What a signal handler may need: the names still to remove. */
static char netns_paths[2][96];
static volatile sig_atomic_t netns_named[2];
static struct sigaction netns_old_act[3];
static const int netns_signals[3] = {SIGINT, SIGTERM, SIGHUP};

/* Removes namespace i's name as `ip netns delete` does (async-signal-safe). */
static void netns_unname(int i)
{
    if (!netns_named[i])
        return;
    umount2(netns_paths[i], MNT_DETACH);
    unlink(netns_paths[i]);
    netns_named[i] = 0;
}

static void netns_on_signal(int sig)
{
    netns_unname(0);
    netns_unname(1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Catches the signals that would end the tool (not those it ignores, as a
 * background job of a shell ignores SIGINT). */
static bool netns_caught[3];

static void netns_catch_signals(bool is_on)
{
    for (int i = 0; i < 3; i++) {
        if (is_on) {
            netns_caught[i] = false;
            if (sigaction(netns_signals[i], NULL, &netns_old_act[i]) != 0 || netns_old_act[i].sa_handler == SIG_IGN)
                continue;
            struct sigaction sa;
            memset(&sa, 0, sizeof(sa));
            sa.sa_handler = netns_on_signal;
            sigemptyset(&sa.sa_mask);
            for (int j = 0; j < 3; j++)
                sigaddset(&sa.sa_mask, netns_signals[j]);
            netns_caught[i] = sigaction(netns_signals[i], &sa, NULL) == 0;
        } else if (netns_caught[i]) {
            sigaction(netns_signals[i], &netns_old_act[i], NULL);
            netns_caught[i] = false;
        }
    }
}

/* Runs `ip ARGS...` (argv[0] is "ip") with a deadline; 0 when it exits 0,
 * else -1 with the command and the first line of what it said in why. */
static int run_ip(const char *const *argv, char *why, size_t whylen)
{
    char cmd[512];
    size_t len = 0;
    cmd[0] = '\0';
    for (int i = 0; argv[i] && len < sizeof(cmd); i++)
        len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, "%s%s", i ? " " : "", argv[i]);
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        snprintf(why, whylen, "%s: pipe: %s", cmd, strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "%s: fork: %s", cmd, strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(126);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, STDIN_FILENO);
            dup2(devnull, STDOUT_FILENO);
        }
        dup2(pfd[1], STDERR_FILENO);
        execvp("ip", (char *const *)argv);
        execv("/usr/sbin/ip", (char *const *)argv);
        execv("/sbin/ip", (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    char err[512];
    size_t elen = 0;
    const double deadline = tune_now_s() + NETNS_CMD_TIMEOUT_S;
    bool is_late = false;
    for (;;) {
        const double left = deadline - tune_now_s();
        if (left <= 0) {
            is_late = true;
            break;
        }
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        char buf[256];
        ssize_t n = read(pfd[0], buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t take = (size_t)n < sizeof(err) - 1 - elen ? (size_t)n : sizeof(err) - 1 - elen;
        memcpy(err + elen, buf, take);
        elen += take;
    }
    close(pfd[0]);
    err[elen] = '\0';
    err[strcspn(err, "\n")] = '\0';
    if (is_late)
        kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (is_late) {
        snprintf(why, whylen, "%s: no answer within %.0f s", cmd, NETNS_CMD_TIMEOUT_S);
        return -1;
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        snprintf(why, whylen, "%s: no `ip` command (install iproute2)", cmd);
    else
        snprintf(why, whylen, "%s failed: %s", cmd, err[0] ? err : "no message");
    return -1;
}

/* Whether a pid is a running plait-tune (a namespace name's owner). */
static bool pid_is_tune(long pid)
{
    char path[64], comm[64] = "";
    snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    if (!fgets(comm, sizeof(comm), f))
        comm[0] = '\0';
    fclose(f);
    return strncmp(comm, "plait-tune", 10) == 0;
}

/* Names NETNS_PREFIX<pid>[ab] whose run is gone (killed while setting up). */
static void remove_stale(void)
{
    DIR *d = opendir(NETNS_DIR);
    if (!d)
        return;
    const size_t plen = strlen(TUNE_NETNS_PREFIX);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, TUNE_NETNS_PREFIX, plen) != 0)
            continue;
        char *end;
        long pid = strtol(n + plen, &end, 10);
        if (end == n + plen || (end[0] != 'a' && end[0] != 'b') || end[1] || pid == getpid() || pid_is_tune(pid))
            continue;
        char path[sizeof(NETNS_DIR) + 256 + 2];
        snprintf(path, sizeof(path), "%s/%s", NETNS_DIR, n);
        umount2(path, MNT_DETACH);
        if (unlink(path) == 0)
            printf("note: removed the network namespace %s, left by a plait-tune run (pid %ld) that is gone\n", n,
                   pid);
    }
    closedir(d);
}

/* Waits (in a child that enters the namespace) until ifname there is up and
 * running: a veth reports carrier once both its ends are up. */
static int wait_link(int nsfd, const char *ifname, char *why, size_t whylen)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (setns(nsfd, CLONE_NEWNET) != 0)
            _exit(2);
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s < 0)
            _exit(3);
        const double deadline = tune_now_s() + NETNS_LINK_TIMEOUT_S;
        for (;;) {
            struct ifreq ifr;
            memset(&ifr, 0, sizeof(ifr));
            snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
            if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING))
                _exit(0);
            if (tune_now_s() > deadline)
                _exit(1);
            usleep(2000);
        }
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    snprintf(why, whylen, "%s: %s", ifname,
             code == 1   ? "not up and running within 5 s"
             : code == 2 ? "cannot enter its network namespace (setns)"
                         : "cannot query it");
    return -1;
}

int tune_netns_create(struct tune_netns *n, char *why, size_t whylen)
{
    memset(n, 0, sizeof(*n));
    n->fd[0] = n->fd[1] = -1;
    if (geteuid() != 0) {
        snprintf(why, whylen,
                 "needs root: it creates two network namespaces and a veth between them (CAP_SYS_ADMIN, "
                 "CAP_NET_ADMIN); run it as root, or without --netns to measure the socket link over loopback");
        return -1;
    }
    remove_stale();
    const long pid = (long)getpid();
    for (int i = 0; i < 2; i++) {
        snprintf(n->name[i], sizeof(n->name[i]), "%s%ld%c", TUNE_NETNS_PREFIX, pid, 'a' + i);
        snprintf(n->addr[i], sizeof(n->addr[i]), "%s.%d", TUNE_NETNS_SUBNET, i + 1);
        snprintf(netns_paths[i], sizeof(netns_paths[i]), "%s/%s", NETNS_DIR, n->name[i]);
    }
    snprintf(n->ifname_env, sizeof(n->ifname_env), "PLAIT_SOCKET_IFNAME=%s%ld", TUNE_NETNS_PREFIX, pid);
    netns_catch_signals(true);

    int rc = 0;
    char cidr[2][32];
    for (int i = 0; i < 2 && !rc; i++) {
        snprintf(cidr[i], sizeof(cidr[i]), "%s/30", n->addr[i]);
        netns_named[i] = 1; /* before it exists: a signal during `ip netns add` removes it too */
        rc = run_ip((const char *[]){"ip", "netns", "add", n->name[i], NULL}, why, whylen);
    }
    /* The veth is made inside A with its other end in B: it never appears in
     * this (the root) namespace. Each namespace is named after its end. */
    if (!rc)
        rc = run_ip((const char *[]){"ip", "-n", n->name[0], "link", "add", n->name[0], "type", "veth", "peer",
                                     "name", n->name[1], "netns", n->name[1], NULL},
                    why, whylen);
    for (int i = 0; i < 2 && !rc; i++) {
        rc = run_ip((const char *[]){"ip", "-n", n->name[i], "addr", "add", cidr[i], "dev", n->name[i], NULL}, why,
                    whylen);
        if (!rc)
            rc = run_ip((const char *[]){"ip", "-n", n->name[i], "link", "set", "dev", n->name[i], "up", NULL}, why,
                        whylen);
        if (!rc)
            rc = run_ip((const char *[]){"ip", "-n", n->name[i], "link", "set", "dev", "lo", "up", NULL}, why,
                        whylen);
    }
    for (int i = 0; i < 2 && !rc; i++) {
        n->fd[i] = open(netns_paths[i], O_RDONLY | O_CLOEXEC);
        if (n->fd[i] < 0) {
            snprintf(why, whylen, "%s: %s", netns_paths[i], strerror(errno));
            rc = -1;
        }
    }
    /* From here the open files hold the namespaces: the names can go. */
    netns_unname(0);
    netns_unname(1);
    netns_catch_signals(false);
    for (int i = 0; i < 2 && !rc; i++)
        rc = wait_link(n->fd[i], n->name[i], why, whylen);
    if (rc) {
        tune_netns_destroy(n);
        return -1;
    }
    n->is_on = true;
    return 0;
}

void tune_netns_destroy(struct tune_netns *n)
{
    for (int i = 0; i < 2; i++) {
        if (n->fd[i] >= 0)
            close(n->fd[i]);
        n->fd[i] = -1;
    }
    n->is_on = false;
}
