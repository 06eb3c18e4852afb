/* Writing a file a user named, as a user expects (file.h). */
#define _GNU_SOURCE
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* What a path turned out to be once its symbolic links are followed. */
enum target_kind {
    TARGET_FD,     /* one of this process's descriptors (/dev/stdout, /dev/fd/N) */
    TARGET_DEVICE, /* a FIFO or a character device, opened: written directly */
    TARGET_FILE,   /* a regular file, or nothing yet: written by name */
};

struct target {
    enum target_kind kind;
    int fd;                 /* TARGET_FD: the process's descriptor (not ours); TARGET_DEVICE: ours */
    bool exists;            /* TARGET_FILE: a regular file is there (st is its) */
    struct stat st;
    char path[PATH_MAX];    /* the final target (no symbolic link left) */
    char shown[PATH_MAX + 64]; /* how messages name it: "T" or "T (link L)" */
};

static int fail(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t len, const char *fmt, ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Descriptor N when `p` names one of this process's descriptors, else -1.
 * Those names are links the kernel makes up (/proc/self/fd/1 reads as
 * "pipe:[1234]" or a file's path); reopening them would truncate a
 * redirected stdout or write it from its start, so they are written where
 * they stand, as a shell's `> /dev/stdout` does for its own fd. */
static int fd_alias(const char *p)
{
    static const char *const dirs[] = {"/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"};
    if (strcmp(p, "/dev/stdin") == 0)
        return 0;
    if (strcmp(p, "/dev/stdout") == 0)
        return 1;
    if (strcmp(p, "/dev/stderr") == 0)
        return 2;
    const char *num = NULL;
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]) && !num; i++)
        if (strncmp(p, dirs[i], strlen(dirs[i])) == 0)
            num = p + strlen(dirs[i]);
    char mine[64];
    snprintf(mine, sizeof(mine), "/proc/%d/fd/", (int)getpid());
    if (!num && strncmp(p, mine, strlen(mine)) == 0)
        num = p + strlen(mine);
    if (!num || *num < '0' || *num > '9')
        return -1;
    char *end;
    long n = strtol(num, &end, 10);
    return *end == '\0' && n <= INT_MAX ? (int)n : -1;
}

static int set_blocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

/* Follows `path`'s symbolic links (at most 40, as the kernel does) to what
 * is at their end, and opens it when it is a device. */
static int target_find(const char *path, struct target *t, char *why, size_t len)
{
    memset(t, 0, sizeof(*t));
    t->fd = -1;
    if (path == NULL || *path == '\0')
        return fail(why, len, "the path is empty");
    if (strlen(path) >= sizeof(t->path))
        return fail(why, len, "%.64s...: the path is longer than %d bytes", path, PATH_MAX - 1);
    snprintf(t->path, sizeof(t->path), "%s", path);
    for (int hops = 0;; hops++) {
        const int alias = fd_alias(t->path);
        if (alias >= 0) {
            const int fl = fcntl(alias, F_GETFL);
            if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY)
                return fail(why, len, "%s: descriptor %d of this process is %s", path, alias,
                            fl < 0 ? "not open" : "open for reading only");
            t->kind = TARGET_FD;
            t->fd = alias;
            snprintf(t->shown, sizeof(t->shown), "%s", path);
            return 0;
        }
        if (lstat(t->path, &t->st) != 0) {
            if (errno != ENOENT)
                return fail(why, len, "%s: %s", t->path, strerror(errno));
            break; /* nothing there: a new file */
        }
        if (!S_ISLNK(t->st.st_mode)) {
            t->exists = true;
            break;
        }
        if (hops == 40)
            return fail(why, len, "%s: %s", path, strerror(ELOOP));
        char link[PATH_MAX];
        ssize_t n = readlink(t->path, link, sizeof(link) - 1);
        if (n < 0)
            return fail(why, len, "%s: cannot read the symbolic link: %s", t->path, strerror(errno));
        link[n] = '\0';
        if (link[0] != '/') {
            /* Relative to the directory the link is in. */
            char *slash = strrchr(t->path, '/');
            const size_t dirlen = slash ? (size_t)(slash - t->path) + 1 : 0;
            if (dirlen + (size_t)n >= sizeof(t->path))
                return fail(why, len, "%s: %s", path, strerror(ENAMETOOLONG));
            memmove(t->path + dirlen, link, (size_t)n + 1);
        } else {
            memcpy(t->path, link, (size_t)n + 1);
        }
    }
    if (strcmp(t->path, path) == 0)
        snprintf(t->shown, sizeof(t->shown), "%s", path);
    else
        snprintf(t->shown, sizeof(t->shown), "%s (the target of the link %s)", t->path, path);

    if (!t->exists || S_ISREG(t->st.st_mode)) {
        t->kind = TARGET_FILE;
        return 0;
    }
    if (S_ISDIR(t->st.st_mode))
        return fail(why, len, "%s is a directory", t->shown);
    if (!S_ISFIFO(t->st.st_mode) && !S_ISCHR(t->st.st_mode))
        return fail(why, len, "%s is a %s: only regular files, FIFOs and character devices are written", t->shown,
                    S_ISBLK(t->st.st_mode) ? "block device" : S_ISSOCK(t->st.st_mode) ? "socket" : "special file");
    /* O_NONBLOCK: a FIFO without a reader fails with ENXIO instead of
     * blocking the caller (an init) until one comes. The writes then block as
     * any writer's to a pipe do. */
    t->fd = open(t->path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (t->fd < 0) {
        if (errno == ENXIO && S_ISFIFO(t->st.st_mode))
            return fail(why, len, "%s is a FIFO that no process has open for reading (start the reader first)",
                        t->shown);
        return fail(why, len, "cannot open %s: %s", t->shown, strerror(errno));
    }
    struct stat now;
    if (fstat(t->fd, &now) != 0 || (!S_ISFIFO(now.st_mode) && !S_ISCHR(now.st_mode)) || set_blocking(t->fd) != 0) {
        close(t->fd);
        t->fd = -1;
        return fail(why, len, "%s changed while it was opened", t->shown);
    }
    t->kind = TARGET_DEVICE;
    return 0;
}

/* One write(2) that cannot raise SIGPIPE. A pipe or FIFO whose reader is
 * gone (a log reader that exited, `| head`) fails the write with EPIPE and
 * also raises SIGPIPE, whose default action ends the process: a library's
 * dump or log line must not end its host program. SIGPIPE is blocked in
 * this thread around the write (a write's SIGPIPE is sent to the writing
 * thread), and the one the write raised is taken off the pending set before
 * the mask is restored, unless one was pending before: that one is the
 * program's own and stays. */
static ssize_t write_nosigpipe(int fd, const void *p, size_t n)
{
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    if (pthread_sigmask(SIG_BLOCK, &pipe_set, &old) != 0)
        return write(fd, p, n);
    const bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    const ssize_t w = write(fd, p, n);
    const int err = errno;
    if (w < 0 && err == EPIPE && !was_pending) {
        const struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = err;
    return w;
}

/* Writes all n bytes: 0, or -1 with errno (EIO for a write that made no
 * progress). */
static int write_fd_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t w = write_nosigpipe(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* A descriptor of the process's that its owner made non-blocking. */
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
                return -1;
            continue;
        }
        if (w < 0)
            return -1;
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int write_all(int fd, const void *data, size_t n, const char *shown, char *why, size_t len)
{
    if (write_fd_all(fd, data, n) != 0)
        return fail(why, len, "cannot write %s: %s", shown, strerror(errno));
    return 0;
}

/* A stream over a pipe, FIFO or device whose writes go through
 * write_fd_all (no SIGPIPE; a descriptor made non-blocking by its owner is
 * waited for), closing fd when closed. */
static ssize_t stream_write(void *cookie, const char *buf, size_t n)
{
    return write_fd_all((int)(intptr_t)cookie, buf, n) == 0 ? (ssize_t)n : -1;
}

static int stream_close(void *cookie)
{
    return close((int)(intptr_t)cookie);
}

static FILE *stream_open(int fd)
{
    const cookie_io_functions_t io = {.write = stream_write, .close = stream_close};
    return fopencookie((void *)(intptr_t)fd, "w", io);
}

/* Truncates and writes a regular file where it is: for files the
 * temporary-and-rename cannot replace faithfully (see plait_file_write). */
static int write_in_place(const struct target *t, const void *data, size_t n, char *why, size_t len)
{
    int fd = open(t->path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
    if (fd < 0)
        return fail(why, len, "cannot open %s: %s", t->shown, strerror(errno));
    int r = write_all(fd, data, n, t->shown, why, len);
    if (close(fd) != 0 && r == 0)
        r = fail(why, len, "cannot write %s: %s", t->shown, strerror(errno));
    return r;
}

int plait_file_write(const char *path, const void *data, size_t n, char *why, size_t len)
{
    struct target t;
    if (target_find(path, &t, why, len) != 0)
        return -1;
    if (t.kind == TARGET_FD)
        return write_all(t.fd, data, n, t.shown, why, len);
    if (t.kind == TARGET_DEVICE) {
        int r = write_all(t.fd, data, n, t.shown, why, len);
        if (close(t.fd) != 0 && r == 0)
            r = fail(why, len, "cannot write %s: %s", t.shown, strerror(errno));
        return r;
    }
    /* A file with several names would lose the others to a rename. */
    if (t.exists && t.st.st_nlink > 1)
        return write_in_place(&t, data, n, why, len);

    /* The temporary lies in the target's own directory (a rename cannot
     * cross file systems), hidden by its leading dot from readers that list
     * the directory. O_EXCL: never someone else's file. */
    static unsigned counter;
    char dir[PATH_MAX], tmp[PATH_MAX];
    const char *slash = strrchr(t.path, '/');
    const char *base = slash ? slash + 1 : t.path;
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == t.path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - t.path), t.path);
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const unsigned k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
        if ((size_t)snprintf(tmp, sizeof(tmp), "%.*s.%s.%d.%u.%lx.tmp", (int)(base - t.path), t.path, base,
                             (int)getpid(), k, (unsigned long)ts.tv_nsec) >= sizeof(tmp))
            return fail(why, len, "%s: %s", t.shown, strerror(ENAMETOOLONG));
        /* 0666 less the umask, as any new file; an existing file's mode below. */
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOCTTY | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        const int err = errno;
        /* A writable file in a directory this process may not write: what
         * any program would do, write the file itself. */
        if ((err == EACCES || err == EPERM) && t.exists && access(t.path, W_OK) == 0)
            return write_in_place(&t, data, n, why, len);
        /* A name so near NAME_MAX that the temporary's longer one does not
         * fit beside it: write (or create) the file itself, not atomically,
         * rather than refuse a name any program can write. */
        if (err == ENAMETOOLONG)
            return write_in_place(&t, data, n, why, len);
        return fail(why, len, "cannot create %s: cannot create a file in its directory %s: %s", t.shown, dir,
                    strerror(err));
    }
    if (t.exists) {
        bool is_kept = fchmod(fd, t.st.st_mode & 07777) == 0;
        if (is_kept && (t.st.st_uid != geteuid() || t.st.st_gid != getegid()))
            is_kept = fchown(fd, t.st.st_uid, t.st.st_gid) == 0 && fchmod(fd, t.st.st_mode & 07777) == 0;
        if (!is_kept) {
            /* Another user's file (in a directory we may write): a new file
             * would change its owner, so write it where it is. */
            close(fd);
            unlink(tmp);
            return write_in_place(&t, data, n, why, len);
        }
    }
    int r = write_all(fd, data, n, t.shown, why, len);
    if (close(fd) != 0 && r == 0)
        r = fail(why, len, "cannot write %s: %s", t.shown, strerror(errno));
    if (r == 0 && rename(tmp, t.path) != 0)
        r = fail(why, len, "cannot rename %s to %s: %s", tmp, t.shown, strerror(errno));
    if (r != 0)
        unlink(tmp);
    return r;
}

FILE *plait_file_open(const char *path, bool is_append, char *why, size_t len)
{
    struct target t;
    if (target_find(path, &t, why, len) != 0)
        return NULL;
    int fd = t.fd;
    if (t.kind == TARGET_FD && (fd = fcntl(t.fd, F_DUPFD_CLOEXEC, 3)) < 0) {
        fail(why, len, "%s: cannot duplicate descriptor %d: %s", path, t.fd, strerror(errno));
        return NULL;
    }
    if (t.kind == TARGET_FILE) {
        /* O_NONBLOCK in case a FIFO took the file's place since the look. */
        fd = open(t.path, O_WRONLY | O_CREAT | O_NOCTTY | O_CLOEXEC | O_NONBLOCK | (is_append ? O_APPEND : O_TRUNC),
                  0666);
        struct stat now;
        if (fd < 0) {
            if (errno == ENXIO)
                fail(why, len, "%s is a FIFO that no process has open for reading (start the reader first)",
                     t.shown);
            else
                fail(why, len, "cannot open %s: %s", t.shown, strerror(errno));
            return NULL;
        }
        if (fstat(fd, &now) != 0 || !(S_ISREG(now.st_mode) || S_ISFIFO(now.st_mode) || S_ISCHR(now.st_mode)) ||
            set_blocking(fd) != 0) {
            close(fd);
            fail(why, len, "%s changed while it was opened", t.shown);
            return NULL;
        }
    }
    /* A regular file cannot raise SIGPIPE: a plain stream. Anything else,
     * and /dev/stdout whatever it is (fdopen's "a" would also set O_APPEND
     * on the description the program's own stdout shares), goes through
     * stream_write. */
    struct stat st;
    const bool is_regular = t.kind != TARGET_FD && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    FILE *f = is_regular ? fdopen(fd, is_append ? "a" : "w") : stream_open(fd);
    if (f == NULL) {
        fail(why, len, "cannot open %s: %s", t.shown, strerror(errno));
        close(fd);
    }
    return f;
}
