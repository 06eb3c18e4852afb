/* Files plait writes where a user points it (base/file.h): PLAIT_TOPO_DUMP_FILE
 * (rank 0's topology dump), plait-topo --dump (plait_topo_dump_xml),
 * plait-tune --calibrate's constants (plait_model_consts_save) and
 * PLAIT_DEBUG_FILE. A symbolic link is followed and kept, a FIFO is written
 * (and one without a reader is an error at once, never a wait), a character
 * device is written and stays a device, /dev/fd/N is the open descriptor, a
 * regular file keeps its mode, an unwritable directory is a clear error.
 * Everything happens in a scratch directory named after the pid. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "tuning/model.h"
#include "topology/topo.h"

static char scratch[256];

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(p) == 0 || errno == ENOENT ? 0 : -1;
}

static void scratch_make(void)
{
    snprintf(scratch, sizeof(scratch), "/tmp/plait_test_file_output_%d_XXXXXX", (int)getpid());
    cr_assert_not_null(mkdtemp(scratch), "mkdtemp: %s", strerror(errno));
    chmod(scratch, 0755); /* the unprivileged child of unwritable_directory must enter it */
    umask(022);
}

static void scratch_remove(void)
{
    if (scratch[0]) {
        char sub[300];
        snprintf(sub, sizeof(sub), "%s/ro", scratch);
        chmod(sub, 0755);
        nftw(scratch, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
}

TestSuite(file_output, .init = scratch_make, .fini = scratch_remove, .timeout = 60);

static void in_scratch(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", scratch, name);
}

static struct plait_topo *small_topo(void)
{
    struct plait_topo *t = NULL;
    cr_assert_eq(plait_topo_create(&t), PLAIT_SUCCESS, "plait_topo_create: %s", plait_last_error_get());
    cr_assert_geq(plait_topo_add_node(t, PLAIT_TOPO_CPU, NULL), 0, "add_node: %s", plait_last_error_get());
    return t;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s cannot be read: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        fwrite(chunk, 1, n, m);
    fclose(f);
    fclose(m);
    return buf;
}

static void write_text(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    cr_assert_eq(chmod(path, mode), 0);
}

/* No temporary file left behind in `dir`: only the names given. */
static void expect_only(const char *dir, const char *const *names, int n)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ls -A '%s'", dir);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[512];
    while (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\n")] = '\0';
        int known = 0;
        for (int i = 0; i < n; i++)
            known |= strcmp(line, names[i]) == 0;
        cr_expect(known, "%s holds an unexpected file %s (a temporary left behind?)", dir, line);
    }
    pclose(p);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static plait_result_t dump_to(const char *path)
{
    setenv("PLAIT_TOPO_DUMP_FILE", path, 1);
    struct plait_topo *t = small_topo();
    plait_result_t r = plait_topo_dump_once(t);
    plait_topo_free(t);
    return r;
}

/* Runs fn(arg) in a child process (as nobody when `drop_root` and this is
 * root) and returns its exit status; a child still running after 30 s (a
 * write that blocks) is killed and fails the test, and the scratch directory
 * is removed either way by the suite's fini. fn returns 0 when all is well,
 * else prints why to stderr. */
static int in_child(int (*fn)(const char *), const char *arg, bool drop_root)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (drop_root && geteuid() == 0 &&
            (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0))
            _exit(3);
        _exit(fn(arg));
    }
    int status = 0;
    const double deadline = now_s() + 30;
    pid_t w;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_s() < deadline)
        usleep(10000);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        cr_assert_fail("the write to %s did not return within 30 s", arg);
    }
    cr_assert(WIFEXITED(status), "the child writing %s died of signal %d", arg, WTERMSIG(status));
    cr_assert_neq(WEXITSTATUS(status), 3, "the child could not drop root");
    return WEXITSTATUS(status);
}

/* ---------------------------------------------------------------- symbolic links */

Test(file_output, dump_symlink_target_replaced_link_kept)
{
    /* The link in one directory, its target in another: the target is
     * replaced in its own directory, the link stays a link. */
    char dir_a[300], dir_b[300], target[400], link[400];
    in_scratch(dir_a, sizeof(dir_a), "a");
    in_scratch(dir_b, sizeof(dir_b), "b");
    cr_assert_eq(mkdir(dir_a, 0755), 0);
    cr_assert_eq(mkdir(dir_b, 0755), 0);
    snprintf(target, sizeof(target), "%s/real.xml", dir_b);
    snprintf(link, sizeof(link), "%s/topo.xml", dir_a);
    write_text(target, "old contents\n", 0644);
    cr_assert_eq(symlink("../b/real.xml", link), 0, "symlink: %s", strerror(errno));

    plait_result_t r = dump_to(link);
    cr_assert_eq(r, PLAIT_SUCCESS, "dump through a symlink failed: %s", plait_last_error_get());
    struct stat st;
    cr_assert_eq(lstat(link, &st), 0);
    cr_expect(S_ISLNK(st.st_mode), "%s is no longer a symbolic link (mode %o)", link, (unsigned)st.st_mode);
    char *xml = read_file(target);
    cr_expect(strstr(xml, "<plait_topology") != NULL, "the link's target does not hold the dump:\n%.200s", xml);
    free(xml);
    struct plait_topo *back = NULL;
    cr_expect_eq(plait_topo_load_xml(link, &back), PLAIT_SUCCESS, "the dump does not load: %s",
                 plait_last_error_get());
    plait_topo_free(back);
    const char *in_a[] = {"topo.xml"}, *in_b[] = {"real.xml"};
    expect_only(dir_a, in_a, 1);
    expect_only(dir_b, in_b, 1);
}

Test(file_output, dump_dangling_symlink_creates_target)
{
    char link[300], target[300];
    in_scratch(link, sizeof(link), "link.xml");
    in_scratch(target, sizeof(target), "new-target.xml");
    cr_assert_eq(symlink("new-target.xml", link), 0);
    cr_assert_eq(dump_to(link), PLAIT_SUCCESS, "%s", plait_last_error_get());
    struct stat st;
    cr_assert_eq(lstat(link, &st), 0);
    cr_expect(S_ISLNK(st.st_mode), "the dangling link was replaced");
    cr_assert_eq(stat(target, &st), 0, "the link's target was not created");
    cr_expect(S_ISREG(st.st_mode));
    cr_expect_eq(st.st_mode & 0777, 0644, "a new file is 0666 less the umask (022), got %o",
                 (unsigned)(st.st_mode & 0777));
}

/* ---------------------------------------------------------------- FIFOs */

struct reader {
    int fd;
    char *data;
    size_t len;
    int done; /* 1: EOF seen; -1: deadline */
};

static void *read_fifo(void *arg)
{
    struct reader *rd = arg;
    FILE *m = open_memstream(&rd->data, &rd->len);
    const double deadline = now_s() + 45;
    for (;;) {
        struct pollfd p = {.fd = rd->fd, .events = POLLIN};
        if (now_s() > deadline) {
            rd->done = -1;
            break;
        }
        if (poll(&p, 1, 200) <= 0)
            continue;
        char buf[8192];
        ssize_t n = read(rd->fd, buf, sizeof(buf));
        if (n > 0) {
            fwrite(buf, 1, (size_t)n, m);
        } else if (n == 0) {
            rd->done = 1; /* the writer closed */
            break;
        } else if (errno != EAGAIN && errno != EINTR) {
            rd->done = -1;
            break;
        }
    }
    fclose(m);
    return NULL;
}

Test(file_output, dump_fifo_with_reader_gets_data)
{
    char fifo[300];
    in_scratch(fifo, sizeof(fifo), "topo.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    /* The reader's end is open before the dump starts; the dump (larger than
     * a pipe's buffer, maybe) is read while it is written. */
    struct reader rd = {.fd = open(fifo, O_RDONLY | O_NONBLOCK)};
    cr_assert_geq(rd.fd, 0, "open the FIFO for reading: %s", strerror(errno));
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, read_fifo, &rd), 0);

    plait_result_t r = dump_to(fifo);
    struct stat st;
    cr_assert_eq(lstat(fifo, &st), 0);
    cr_assert(S_ISFIFO(st.st_mode), "the FIFO was replaced by a file of mode %o", (unsigned)st.st_mode);
    cr_assert_eq(r, PLAIT_SUCCESS, "dump to a FIFO with a reader failed: %s", plait_last_error_get());
    pthread_join(th, NULL);
    close(rd.fd);
    cr_assert_eq(rd.done, 1, "the reader saw no end of the dump within 45 s (%zu bytes read)", rd.len);
    cr_expect(rd.data && strstr(rd.data, "<plait_topology") != NULL && strstr(rd.data, "</plait_topology>") != NULL,
              "the reader did not get the whole dump (%zu bytes)", rd.len);
    free(rd.data);
}

static int dump_fifo_without_reader(const char *fifo)
{
    const double t0 = now_s();
    plait_result_t r = dump_to(fifo);
    const double took = now_s() - t0;
    const char *msg = plait_last_error_get();
    if (r == PLAIT_SUCCESS) {
        fprintf(stderr, "a dump to a FIFO nobody reads succeeded\n");
        return 1;
    }
    if (!strstr(msg, "PLAIT_TOPO_DUMP_FILE") || !strstr(msg, fifo) || !strstr(msg, "reading")) {
        fprintf(stderr, "the error does not name the variable, the FIFO and the missing reader: %s\n", msg);
        return 1;
    }
    if (took > 5.0) {
        fprintf(stderr, "the failure took %.1f s\n", took);
        return 1;
    }
    return 0;
}

Test(file_output, dump_fifo_without_reader_fails_at_once)
{
    char fifo[300];
    in_scratch(fifo, sizeof(fifo), "nobody.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    const int rc = in_child(dump_fifo_without_reader, fifo, false);
    struct stat st;
    cr_assert_eq(lstat(fifo, &st), 0);
    cr_expect(S_ISFIFO(st.st_mode), "the FIFO was replaced by a file of mode %o", (unsigned)st.st_mode);
    cr_expect_eq(rc, 0, "see the child's message above");
}

/* ---------------------------------------------------------------- devices, descriptors */

Test(file_output, dump_char_device_not_replaced)
{
    /* Root may make its own null device here, so that a regression replaces
     * that one, not the machine's /dev/null. */
    char dev[300];
    in_scratch(dev, sizeof(dev), "null");
    if (mknod(dev, S_IFCHR | 0666, makedev(1, 3)) != 0)
        snprintf(dev, sizeof(dev), "/dev/null");
    struct stat before, after;
    cr_assert_eq(stat(dev, &before), 0);
    cr_assert(S_ISCHR(before.st_mode), "%s is not a character device", dev);
    plait_result_t r = dump_to(dev);
    cr_assert_eq(lstat(dev, &after), 0, "%s is gone", dev);
    cr_assert(S_ISCHR(after.st_mode) && after.st_rdev == before.st_rdev,
              "%s was replaced (now mode %o)", dev, (unsigned)after.st_mode);
    cr_expect_eq(r, PLAIT_SUCCESS, "dump to %s failed: %s", dev, plait_last_error_get());
}

Test(file_output, dump_dev_fd_writes_the_open_descriptor)
{
    /* NCCL_TOPO_DUMP_FILE=/dev/stdout with stdout redirected (>>) to a log:
     * the dump goes after what the log holds, at the descriptor's offset. */
    char log[300];
    in_scratch(log, sizeof(log), "stdout.log");
    write_text(log, "before the dump\n", 0644);
    int fd = open(log, O_WRONLY | O_APPEND);
    cr_assert_geq(fd, 0);
    char path[64];
    snprintf(path, sizeof(path), "/dev/fd/%d", fd);
    unsetenv("PLAIT_TOPO_DUMP_FILE");
    setenv("NCCL_TOPO_DUMP_FILE", path, 1);
    struct plait_topo *t = small_topo();
    plait_result_t r = plait_topo_dump_once(t);
    plait_topo_free(t);
    cr_assert_eq(r, PLAIT_SUCCESS, "dump to %s failed: %s", path, plait_last_error_get());
    cr_assert_eq(write(fd, "after\n", 6), 6);
    close(fd);
    char *text = read_file(log);
    cr_expect(strncmp(text, "before the dump\n", 16) == 0, "the log's start was overwritten:\n%.200s", text);
    const char *xml = strstr(text, "<plait_topology");
    cr_expect(xml != NULL, "the dump is not in the log:\n%.300s", text);
    const size_t n = strlen(text);
    cr_expect(n > 6 && strcmp(text + n - 6, "after\n") == 0, "the descriptor's offset did not follow the dump");
    free(text);
}

/* ---------------------------------------------------------------- regular files */

Test(file_output, dump_regular_file_keeps_mode)
{
    char path[300];
    in_scratch(path, sizeof(path), "topo.xml");
    write_text(path, "old contents\n", 0640);
    cr_assert_eq(dump_to(path), PLAIT_SUCCESS, "%s", plait_last_error_get());
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect(S_ISREG(st.st_mode));
    cr_expect_eq(st.st_mode & 07777, 0640, "mode %o after the dump, 0640 before", (unsigned)(st.st_mode & 07777));
    char *xml = read_file(path);
    cr_expect(strstr(xml, "<plait_topology") != NULL && strstr(xml, "old contents") == NULL, "not replaced:\n%.200s", xml);
    free(xml);
    const char *names[] = {"topo.xml"};
    expect_only(scratch, names, 1);
}

/* A name near NAME_MAX (255 bytes) leaves no room for the temporary's
 * longer name beside it: the file is then written where it is, as any
 * program would, not refused. */
Test(file_output, dump_long_name_written)
{
    char name[256], path[600];
    memset(name, 'x', 250);
    snprintf(name + 250, sizeof(name) - 250, ".xml");
    in_scratch(path, sizeof(path), name);
    for (int exists = 0; exists < 2; exists++) {
        if (exists)
            write_text(path, "old contents\n", 0640);
        else
            unlink(path);
        struct plait_topo *t = small_topo();
        plait_result_t r = plait_topo_dump_xml(t, path); /* plait-topo --dump PATH */
        plait_topo_free(t);
        cr_assert_eq(r, PLAIT_SUCCESS, "dump to a %zu-byte name (%s): %s", strlen(name), exists ? "existing" : "new",
                     plait_last_error_get());
        char *xml = read_file(path);
        cr_expect(strstr(xml, "<plait_topology") != NULL && strstr(xml, "old contents") == NULL, "not written:\n%.200s",
                  xml);
        free(xml);
    }
}

/* The dump into a directory this process may not write. Root may write
 * anywhere, so as root a child that has given up root does it. */
static int dump_unwritable(const char *path)
{
    plait_result_t r = dump_to(path);
    const char *msg = plait_last_error_get();
    if (r != PLAIT_SUCCESS && strstr(msg, "PLAIT_TOPO_DUMP_FILE") && strstr(msg, path) &&
        strstr(msg, strerror(EACCES)) && !strstr(msg, ".tmp"))
        return 0;
    fprintf(stderr, "dump into an unwritable directory: status %d, error: %s\n", (int)r, msg);
    return 1;
}

Test(file_output, dump_unwritable_directory_clear_error)
{
    char dir[300], path[400];
    in_scratch(dir, sizeof(dir), "ro");
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof(path), "%s/topo.xml", dir);
    cr_assert_eq(chmod(dir, 0555), 0);
    cr_expect_eq(in_child(dump_unwritable, path, true), 0,
                 "the error did not name PLAIT_TOPO_DUMP_FILE, %s and the OS error (see stderr above)", path);
    struct stat st;
    cr_expect_neq(stat(path, &st), 0, "a file was created in the unwritable directory");
}

/* ---------------------------------------------------------------- the other writers */

static int topo_dump_xml_fifo(const char *fifo)
{
    struct plait_topo *t = small_topo();
    plait_result_t r = plait_topo_dump_xml(t, fifo);
    plait_topo_free(t);
    if (r != PLAIT_SUCCESS && strstr(plait_last_error_get(), "reading"))
        return 0;
    fprintf(stderr, "plait_topo_dump_xml to a FIFO nobody reads: status %d, error: %s\n", (int)r,
            r ? plait_last_error_get() : "none");
    return 1;
}

Test(file_output, topo_dump_xml_fifo_without_reader_fails_at_once)
{
    /* plait-topo --dump FILE. */
    char fifo[300];
    in_scratch(fifo, sizeof(fifo), "dump.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_expect_eq(in_child(topo_dump_xml_fifo, fifo, false), 0, "see the child's message above");
}

static int consts_save_fifo(const char *fifo)
{
    struct plait_model_consts k;
    plait_model_consts_default(&k);
    plait_result_t r = plait_model_consts_save(fifo, &k, "test");
    if (r != PLAIT_SUCCESS && strstr(plait_last_error_get(), fifo) && strstr(plait_last_error_get(), "reading"))
        return 0;
    fprintf(stderr, "plait_model_consts_save to a FIFO nobody reads: status %d, error: %s\n", (int)r,
            r ? plait_last_error_get() : "none");
    return 1;
}

Test(file_output, consts_save_fifo_without_reader_fails_at_once)
{
    /* plait-tune --calibrate --out FILE. */
    char fifo[300];
    in_scratch(fifo, sizeof(fifo), "consts.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_expect_eq(in_child(consts_save_fifo, fifo, false), 0, "see the child's message above");
}

Test(file_output, consts_save_symlink_and_mode_kept)
{
    char target[300], link[300];
    in_scratch(target, sizeof(target), "consts.real");
    in_scratch(link, sizeof(link), "consts.txt");
    write_text(target, "# old\n", 0600);
    cr_assert_eq(symlink(target, link), 0);
    struct plait_model_consts k, back;
    plait_model_consts_default(&k);
    cr_assert_eq(plait_model_consts_save(link, &k, "test"), PLAIT_SUCCESS, "%s", plait_last_error_get());
    struct stat st;
    cr_assert_eq(lstat(link, &st), 0);
    cr_expect(S_ISLNK(st.st_mode), "the link was replaced");
    cr_assert_eq(stat(target, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600, "mode %o, 0600 before", (unsigned)(st.st_mode & 0777));
    cr_expect_eq(plait_model_consts_load(link, &back), PLAIT_SUCCESS, "%s", plait_last_error_get());
    const char *names[] = {"consts.real", "consts.txt"};
    expect_only(scratch, names, 2);
}

static int debug_file_fifo(const char *fifo)
{
    setenv("PLAIT_DEBUG", "INFO", 1);
    setenv("PLAIT_DEBUG_FILE", fifo, 1);
    plait_log_configure();
    return 0;
}

Test(file_output, debug_file_fifo_without_reader_does_not_block)
{
    /* PLAIT_DEBUG_FILE: logging is configured at every init; without a
     * reader the log goes to stderr, with a WARN saying why. */
    char fifo[300];
    in_scratch(fifo, sizeof(fifo), "log.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_expect_eq(in_child(debug_file_fifo, fifo, false), 0);
    struct stat st;
    cr_assert_eq(lstat(fifo, &st), 0);
    cr_expect(S_ISFIFO(st.st_mode));
}

/* ---------------------------------------------------------------- a reader that went away */

/* A write to a pipe or FIFO whose reader is gone raises SIGPIPE, whose
 * default action ends the process: a dump or a log line must fail with
 * EPIPE instead, and the program (say, a training job whose log reader
 * exited) go on. */
static int write_closed_pipe(const char *unused)
{
    (void)unused;
    int p[2];
    if (pipe(p) != 0)
        return 10;
    close(p[0]);
    char path[64], why[1400] = "";
    snprintf(path, sizeof(path), "/dev/fd/%d", p[1]);
    const int r = plait_file_write(path, "<topology/>\n", 12, why, sizeof(why));
    close(p[1]);
    if (r == -1 && strstr(why, strerror(EPIPE)))
        return 0;
    fprintf(stderr, "plait_file_write to a pipe nobody reads any more: %d, %s\n", r, why);
    return 1;
}

Test(file_output, write_to_a_gone_reader_fails_without_sigpipe)
{
    cr_expect_eq(in_child(write_closed_pipe, "a pipe whose reader is closed", false), 0,
                 "see the child's message above");
}

static int log_to_fifo_reader_gone(const char *fifo)
{
    /* The reader is there when the log is opened, and leaves. */
    int reader = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (reader < 0)
        return 10;
    char why[1400] = "";
    FILE *f = plait_file_open(fifo, true, why, sizeof(why));
    if (f == NULL) {
        fprintf(stderr, "plait_file_open of a FIFO with a reader: %s\n", why);
        return 1;
    }
    close(reader);
    const int put = fprintf(f, "a log line\n");
    const int flushed = fflush(f);
    const int err = errno;
    fclose(f);
    if (flushed == EOF && err == EPIPE)
        return 0;
    fprintf(stderr, "a log line to a FIFO whose reader left: fprintf %d, fflush %d (%s)\n", put, flushed,
            strerror(err));
    return 1;
}

Test(file_output, log_stream_to_a_gone_reader_fails_without_sigpipe)
{
    char fifo[300];
    in_scratch(fifo, sizeof(fifo), "log.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_expect_eq(in_child(log_to_fifo_reader_gone, fifo, false), 0, "see the child's message above");
}

/* ---------------------------------------------------------------- one log file per process */

/* PLAIT_DEBUG_FILE is opened once, not at every init: each communicator init
 * and plait_get_unique_id configures the log, and closing a FIFO's only writer
 * to reopen it ends the reader's stream (`cat fifo` sees end of file and exits,
 * and what follows goes nowhere). Counted by inotify: the FIFO is opened for
 * writing once and never closed until the log is turned off. */
static int log_opened_once(const char *fifo)
{
    const int reader = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* `cat fifo` */
    const int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (reader < 0 || in < 0 || inotify_add_watch(in, fifo, IN_OPEN | IN_CLOSE_WRITE) < 0)
        return 10;
    setenv("PLAIT_DEBUG", "WARN", 1);
    setenv("PLAIT_DEBUG_FILE", fifo, 1);
    for (int i = 0; i < 3; i++) {
        plait_log_configure(); /* as each init does */
        PLAIT_WARN(PLAIT_SUBSYS_INIT, "line %d", i);
    }
    int opens = 0, closes = 0;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0)
        for (char *p = buf; p < buf + n; p += sizeof(struct inotify_event) + ((struct inotify_event *)p)->len) {
            const struct inotify_event *e = (const void *)p;
            opens += (e->mask & IN_OPEN) != 0;
            closes += (e->mask & IN_CLOSE_WRITE) != 0;
        }
    char text[4096] = "";
    size_t got = 0;
    ssize_t k;
    while (got < sizeof(text) - 1 && (k = read(reader, text + got, sizeof(text) - 1 - got)) > 0)
        got += (size_t)k;
    text[got] = '\0';
    const int has_lines = strstr(text, "line 0") && strstr(text, "line 1") && strstr(text, "line 2");
    if (opens == 1 && closes == 0 && has_lines)
        return 0;
    fprintf(stderr, "3 log configurations: the FIFO was opened %d times and its writer closed %d times; it "
                    "holds: %s\n", opens, closes, text);
    return 1;
}

Test(file_output, debug_file_opened_once_per_process)
{
    char fifo[300];
    in_scratch(fifo, sizeof(fifo), "log-once.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_expect_eq(in_child(log_opened_once, fifo, false), 0, "see the child's message above");
}

/* ... but a log file removed (or rotated away) between two inits is created
 * anew at its name, as when every init opened it. */
static int log_reopened_after_removal(const char *path)
{
    setenv("PLAIT_DEBUG", "WARN", 1);
    setenv("PLAIT_DEBUG_FILE", path, 1);
    plait_log_configure();
    PLAIT_WARN(PLAIT_SUBSYS_INIT, "before the removal");
    if (unlink(path) != 0)
        return 10;
    plait_log_configure();
    PLAIT_WARN(PLAIT_SUBSYS_INIT, "after the removal");
    FILE *f = fopen(path, "r");
    char text[4096] = "";
    const size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    text[n] = '\0';
    if (f)
        fclose(f);
    if (strstr(text, "after the removal") && !strstr(text, "before the removal"))
        return 0;
    fprintf(stderr, "the log file removed between two inits %s: %s\n", f ? "holds" : "is not there again", text);
    return 1;
}

Test(file_output, debug_file_removed_between_inits_is_created_again)
{
    char path[300];
    in_scratch(path, sizeof(path), "rotated.log");
    cr_expect_eq(in_child(log_reopened_after_removal, path, false), 0, "see the child's message above");
}
