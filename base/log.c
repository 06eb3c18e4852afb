/* Logging and per-thread last-error messages. */
#define _GNU_SOURCE
#include "base/log.h"
#include "base/file.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PLAIT_ERRMSG_MAX 1024

static __thread char last_error[PLAIT_ERRMSG_MAX];

/* Configuration is written under the mutex and read without it: the level and
 * mask are plain ints read atomically, and the FILE pointer is replaced only
 * under the mutex, which every writer holds while printing. */
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static int log_level_value = PLAIT_LOG_NONE;
static unsigned log_mask = PLAIT_SUBSYS_ALL;
static FILE *log_file;
static int log_file_is_ours;
static char log_file_path[1024]; /* the expanded PLAIT_DEBUG_FILE that log_file is, when ours */
static struct stat log_file_stat;  /* what was at that path when it was opened */
static char log_host[64];

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
    {"INIT", PLAIT_SUBSYS_INIT},   {"BOOTSTRAP", PLAIT_SUBSYS_BOOTSTRAP}, {"TRANSPORT", PLAIT_SUBSYS_TRANSPORT},
    {"NET", PLAIT_SUBSYS_TRANSPORT}, {"COLL", PLAIT_SUBSYS_COLL},         {"P2P", PLAIT_SUBSYS_P2P},
    {"GROUP", PLAIT_SUBSYS_GROUP}, {"STREAM", PLAIT_SUBSYS_STREAM},       {"ENV", PLAIT_SUBSYS_ENV},
    {"GRAPH", PLAIT_SUBSYS_GRAPH},
    {"TUNING", PLAIT_SUBSYS_TUNING},
    {"ALL", PLAIT_SUBSYS_ALL},
};

static const char *subsys_name(unsigned subsys)
{
    for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
        if (subsys_names[i].bit == subsys)
            return subsys_names[i].name;
    return "PLAIT";
}

static unsigned parse_subsys(const char *spec)
{
    if (!spec || !*spec)
        return PLAIT_SUBSYS_INIT | PLAIT_SUBSYS_BOOTSTRAP | PLAIT_SUBSYS_TRANSPORT | PLAIT_SUBSYS_ENV | PLAIT_SUBSYS_GRAPH;
    int invert = spec[0] == '^';
    if (invert)
        spec++;
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
            if (strcasecmp(tok, subsys_names[i].name) == 0)
                mask |= subsys_names[i].bit;
    return invert ? ~mask : mask;
}

/* Expands %h (host name) and %p (pid) in PLAIT_DEBUG_FILE. */
static void expand_path(const char *pattern, char *out, size_t len)
{
    size_t o = 0;
    for (const char *p = pattern; *p && o + 1 < len; p++) {
        if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
            char tmp[64];
            if (p[1] == 'h')
                snprintf(tmp, sizeof(tmp), "%s", log_host);
            else
                snprintf(tmp, sizeof(tmp), "%d", (int)getpid());
            int n = snprintf(out + o, len - o, "%s", tmp);
            o += n > 0 ? (size_t)n : 0;
            if (o >= len)
                o = len - 1;
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

static const char *env2(const char *plait_name, const char *nccl_name)
{
    const char *v = getenv(plait_name);
    return v ? v : getenv(nccl_name);
}

/* A fork while another thread logs must not leave the child's copy of the
 * mutex locked for ever. */
static void log_prefork(void)
{
    pthread_mutex_lock(&log_mutex);
}

static void log_postfork(void)
{
    pthread_mutex_unlock(&log_mutex);
}

static void log_register_atfork(void)
{
    pthread_atfork(log_prefork, log_postfork, log_postfork);
}

void plait_log_configure(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, log_register_atfork);
    pthread_mutex_lock(&log_mutex);
    gethostname(log_host, sizeof(log_host) - 1);
    char *dot = strchr(log_host, '.');
    if (dot)
        *dot = '\0';
    const char *lvl = env2("PLAIT_DEBUG", "NCCL_DEBUG");
    int level = PLAIT_LOG_NONE;
    if (lvl) {
        if (strcasecmp(lvl, "WARN") == 0)
            level = PLAIT_LOG_WARN;
        else if (strcasecmp(lvl, "INFO") == 0)
            level = PLAIT_LOG_INFO;
        else if (strcasecmp(lvl, "TRACE") == 0)
            level = PLAIT_LOG_TRACE;
        else if (strcasecmp(lvl, "VERSION") == 0)
            level = PLAIT_LOG_NONE;
    }
    unsigned mask = parse_subsys(env2("PLAIT_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS"));
    const char *file = env2("PLAIT_DEBUG_FILE", "NCCL_DEBUG_FILE");
    char path[1024] = "";
    const int wants_file = file && *file && level > PLAIT_LOG_NONE;
    if (wants_file)
        expand_path(file, path, sizeof(path));
    /* Every init configures the log; the file it names stays open across
     * them. Closing and reopening it each time would, for a FIFO, close its
     * only writer, and the reader (`cat fifo`) would see the end of its
     * stream. A new name (or %p after a fork), or another file at the name
     * (the log was rotated or removed), opens the file now there. */
    struct stat now;
    const int is_same = log_file_is_ours && log_file && wants_file && strcmp(path, log_file_path) == 0 &&
                        stat(path, &now) == 0 && now.st_dev == log_file_stat.st_dev &&
                        now.st_ino == log_file_stat.st_ino;
    if (log_file_is_ours && log_file && !is_same) {
        fclose(log_file);
        log_file = NULL;
        log_file_is_ours = 0;
        log_file_path[0] = '\0';
    }
    if (wants_file && !log_file_is_ours) {
        /* A FIFO nobody reads is an error here, not a blocked init (base/file.h). */
        char why[1400];
        FILE *f = plait_file_open(path, true, why, sizeof(why));
        if (f) {
            setvbuf(f, NULL, _IOLBF, 0);
            log_file = f;
            log_file_is_ours = 1;
            snprintf(log_file_path, sizeof(log_file_path), "%s", path);
            if (stat(path, &log_file_stat) != 0)
                memset(&log_file_stat, 0, sizeof(log_file_stat)); /* reopened next time */
        } else {
            /* The log goes to stderr instead; say why once, there. */
            static int warned;
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                fprintf(stderr, "%s:%d:%d plait WARN %s=%s: %s; logging to stderr\n", log_host,
                        (int)getpid(), (int)syscall(SYS_gettid),
                        getenv("PLAIT_DEBUG_FILE") ? "PLAIT_DEBUG_FILE" : "NCCL_DEBUG_FILE", file, why);
        }
    }
    __atomic_store_n(&log_mask, mask, __ATOMIC_RELAXED);
    __atomic_store_n(&log_level_value, level, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&log_mutex);
}

int plait_log_level(void)
{
    return __atomic_load_n(&log_level_value, __ATOMIC_ACQUIRE);
}

static void vlog(int level, unsigned subsys, const char *fmt, va_list ap)
{
    static const char *level_names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char msg[PLAIT_ERRMSG_MAX + 128];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    pthread_mutex_lock(&log_mutex);
    FILE *f = log_file ? log_file : stderr;
    if (level == PLAIT_LOG_WARN)
        fprintf(f, "%s:%d:%d plait WARN %s\n", log_host, (int)getpid(), (int)syscall(SYS_gettid), msg);
    else
        fprintf(f, "%s:%d:%d plait %s %s %s\n", log_host, (int)getpid(), (int)syscall(SYS_gettid),
                level_names[level], subsys_name(subsys), msg);
    fflush(f);
    pthread_mutex_unlock(&log_mutex);
}

int plait_log_enabled(int level, unsigned subsys)
{
    if (level > plait_log_level())
        return 0;
    return level <= PLAIT_LOG_WARN || (__atomic_load_n(&log_mask, __ATOMIC_RELAXED) & subsys) != 0;
}

void plait_log(int level, unsigned subsys, const char *fmt, ...)
{
    if (level > plait_log_level())
        return;
    if (level > PLAIT_LOG_WARN && !(__atomic_load_n(&log_mask, __ATOMIC_RELAXED) & subsys))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, subsys, fmt, ap);
    va_end(ap);
}

void plait_log_always(const char *fmt, ...)
{
    char msg[PLAIT_ERRMSG_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mutex);
    if (!log_host[0]) {
        gethostname(log_host, sizeof(log_host) - 1);
        char *dot = strchr(log_host, '.');
        if (dot)
            *dot = '\0';
    }
    int pid = (int)getpid(), tid = (int)syscall(SYS_gettid);
    fprintf(stderr, "%s:%d:%d plait WARN %s\n", log_host, pid, tid, msg);
    fflush(stderr);
    /* A log file is open only while a level is set: the line belongs there too. */
    if (log_file && log_file != stderr) {
        fprintf(log_file, "%s:%d:%d plait WARN %s\n", log_host, pid, tid, msg);
        fflush(log_file);
    }
    pthread_mutex_unlock(&log_mutex);
}

plait_result_t plait_error(plait_result_t result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    if (plait_log_level() >= PLAIT_LOG_WARN)
        plait_log(PLAIT_LOG_WARN, PLAIT_SUBSYS_ALL, "%s", last_error);
    return result;
}

plait_result_t plait_error_quiet(plait_result_t result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return result;
}

plait_result_t plait_error_context(plait_result_t result, const char *fmt, ...)
{
    char ctx[PLAIT_ERRMSG_MAX];
    char old[PLAIT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof(ctx), fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof(old));
    /* Composed by hand: the two parts may together exceed the buffer, and the
     * context matters more than the tail of the old message. */
    size_t n = strnlen(ctx, sizeof(last_error) - 3);
    memcpy(last_error, ctx, n);
    memcpy(last_error + n, ": ", 2);
    n += 2;
    size_t rest = strnlen(old, sizeof(old));
    if (rest > sizeof(last_error) - 1 - n)
        rest = sizeof(last_error) - 1 - n;
    memcpy(last_error + n, old, rest);
    last_error[n + rest] = '\0';
    return result;
}

const char *plait_last_error_get(void)
{
    return last_error;
}

void plait_last_error_clear(void)
{
    last_error[0] = '\0';
}
