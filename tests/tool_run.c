/* Running a built tool from a Criterion test (tool_run.h). */
#define _GNU_SOURCE
#include "tests/tool_run.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *tool_run_path(const char *envvar, const char *name)
{
    const char *p = getenv(envvar);
    cr_assert(p && *p, "%s is not set (run this test through meson test)", envvar);
    cr_assert(access(p, X_OK) == 0, "%s is not built at %s: %s", name, p, strerror(errno));
    return p;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *tool_run_read_all(FILE *f)
{
    fflush(f);
    if (fseek(f, 0, SEEK_END) != 0)
        return strdup("");
    long len = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)(len > 0 ? len : 0) + 1);
    cr_assert(buf);
    size_t got = len > 0 ? fread(buf, 1, (size_t)len, f) : 0;
    buf[got] = '\0';
    return buf;
}

struct run tool_run(const char *tool, const char *name, double timeout_s, const char *const *args)
{
    const char *argv[64];
    int argc = 0;
    argv[argc++] = tool;
    for (int i = 0; args[i]; i++) {
        cr_assert(argc < 63, "too many arguments");
        argv[argc++] = args[i];
    }
    argv[argc] = NULL;

    struct run r = {.status = -1};
    for (int i = 0; argv[i]; i++)
        snprintf(r.cmd + strlen(r.cmd), sizeof(r.cmd) - strlen(r.cmd), "%s%s", i ? " " : "",
                 i ? argv[i] : name);

    FILE *out = tmpfile(), *err = tmpfile();
    cr_assert(out && err, "tmpfile: %s", strerror(errno));
    fflush(NULL);
    const double t0 = now_s();
    const pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid > 0)
        setpgid(pid, pid); /* also here: no race with the kill below */
    if (pid == 0) {
        /* A group of its own: --calibrate and --simulate fork, and a
         * deadline kills the tool with all of its processes. Out of the
         * test's group, it would outlive a test killed by Criterion's or
         * meson's timeout: it dies with the test instead. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(126);
        dup2(fileno(out), STDOUT_FILENO);
        dup2(fileno(err), STDERR_FILENO);
        execv(tool, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", tool, strerror(errno));
        _exit(127);
    }

    const double deadline = t0 + timeout_s;
    int status = 0;
    for (;;) {
        pid_t p = waitpid(pid, &status, WNOHANG);
        if (p == pid)
            break;
        if (now_s() > deadline) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            r.timed_out = true;
            break;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    r.secs = now_s() - t0;
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = tool_run_read_all(out);
    r.err = tool_run_read_all(err);
    fclose(out);
    fclose(err);
    cr_log_info("%s: exit %d in %.2f s", r.cmd, r.status, r.secs);
    cr_assert(!r.timed_out, "%s: still running after %.0f s (killed)\nstdout:\n%.2000s\nstderr:\n%.2000s", r.cmd,
              timeout_s, r.out, r.err);
    return r;
}

void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
}

void tool_run_rmdir(const char *dir)
{
    if (!dir || !dir[0])
        return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[512];
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}
