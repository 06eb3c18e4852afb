/* The recorded machines of tests/fixtures/topo against their expected answers.
 *
 * Each NAME.xml there describes a machine we do not have (a DGX H100, a GB200
 * tray, PCIe-only boxes, ...), written by hand from a public source that its
 * header cites; NAME.expected beside it holds what plait must compute from it,
 * also derived by hand (docs/topology.md, "Fixtures and their expected answers";
 * tests/fixtures/topo/README.md). This file loads every machine with the XML
 * loader, computes its paths, and checks every matrix cell, every affinity line,
 * every path line and every search line. A fixture's differences are gathered
 * and reported together, so one run shows everything that is off; an expected
 * file that does not parse fails naming its line.
 *
 * The fixtures folder is PLAIT_TEST_FIXTURES (tests/meson.build sets it to the
 * source tree's tests/fixtures) followed by /topo. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "plait.h"
#include "topology/topo.h"

#define LABEL_LEN 16
#define MSG_LEN 512
/* Bandwidths in an expected file are compared within 1% (docs/topology.md). */
#define BW_TOLERANCE 0.01

/* ---------------------------------------------------------------- a growing report */

struct report {
    char *buf;
    size_t len, cap;
    int count;
};

static void report_add(struct report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report_add(struct report *r, const char *fmt, ...)
{
    char line[MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    size_t need = strlen(line) + 4;
    if (r->len + need + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        while (cap < r->len + need + 1)
            cap *= 2;
        char *b = realloc(r->buf, cap);
        cr_assert_not_null(b, "out of memory");
        r->buf = b;
        r->cap = cap;
    }
    r->len += (size_t)snprintf(r->buf + r->len, r->cap - r->len, "  %s\n", line);
    r->count++;
}

static const char *report_text(const struct report *r) { return r->buf ? r->buf : ""; }

/* ---------------------------------------------------------------- labels */

/* "GPU3" -> (PLAIT_TOPO_GPU, 3). Prefixes as docs/topology.md names them; the
 * index is decimal without sign or leading zeros (except "0"). */
static bool label_parse(const char *s, enum plait_topo_node_type *type, int *index)
{
    static const struct {
        const char *prefix;
        enum plait_topo_node_type type;
    } kinds[] = {{"GPU", PLAIT_TOPO_GPU}, {"NIC", PLAIT_TOPO_NIC}, {"CPU", PLAIT_TOPO_CPU},
                 {"NVS", PLAIT_TOPO_NVS}, {"PCI", PLAIT_TOPO_PCI}};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        size_t n = strlen(kinds[k].prefix);
        if (strncmp(s, kinds[k].prefix, n) != 0)
            continue;
        const char *d = s + n;
        if (!isdigit((unsigned char)d[0]) || (d[0] == '0' && d[1] != '\0') || strlen(d) > 6)
            return false;
        for (const char *p = d; *p; p++)
            if (!isdigit((unsigned char)*p))
                return false;
        *type = kinds[k].type;
        *index = atoi(d);
        return true;
    }
    return false;
}

/* The node a label names in `topo`, or -1. */
static int label_node(const struct plait_topo *topo, const char *label)
{
    enum plait_topo_node_type type;
    int index;
    if (!label_parse(label, &type, &index))
        return -1;
    return plait_topo_nth(topo, type, index);
}

/* The label of node `n` ("GPU3"), for messages. */
static void node_label(const struct plait_topo *topo, int n, char *buf, size_t len)
{
    static const char *const prefix[PLAIT_TOPO_NODE_TYPES] = {"CPU", "PCI", "GPU", "NIC", "NVS"};
    if (n < 0 || n >= topo->nnodes) {
        snprintf(buf, len, "none");
        return;
    }
    const struct plait_topo_node *node = &topo->nodes[n];
    snprintf(buf, len, "%s%d", (unsigned)node->type < PLAIT_TOPO_NODE_TYPES ? prefix[node->type] : "?", node->index);
}

/* ---------------------------------------------------------------- the expected file */

enum line_kind { LINE_AFFINITY, LINE_PATH, LINE_SEARCH };

struct exp_line {
    enum line_kind kind;
    int lineno;
    char a[LABEL_LEN], b[LABEL_LEN];  /* affinity: GPU, NIC; path: from, to */
    enum plait_topo_path_type type;   /* affinity, path */
    bool has_gdr;                     /* affinity: gdr (true) or nogdr */
    bool has_bw, has_hops, has_channels;
    double bw;                        /* path, search */
    int hops;                         /* path */
    int channels;                     /* search */
    enum plait_topo_pattern pattern;  /* search */
    bool all_gpus;                    /* search: devs=all */
    int ndevs;
    char devs[PLAIT_TOPO_MAX_LOCAL][LABEL_LEN];
    int hosts;                        /* search: 1 or 2 */
};

struct expected {
    bool has_matrix;
    int matrix_line;
    int ncols;
    char (*cols)[LABEL_LEN];
    int nrows;
    int *row_line;
    char (*cells)[LABEL_LEN]; /* nrows x ncols, row-major */
    int nlines, cap_lines;
    struct exp_line *lines;
};

static void expected_free(struct expected *e)
{
    free(e->cols);
    free(e->row_line);
    free(e->cells);
    free(e->lines);
    memset(e, 0, sizeof(*e));
}

/* Splits `line` in place on blanks; at most `max` tokens, returns how many
 * there are (more than `max` reads as max + 1). */
static int tokenize(char *line, char **tok, int max)
{
    int n = 0;
    for (char *p = line;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (*p == '\0')
            break;
        if (n == max)
            return max + 1;
        tok[n++] = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\r')
            p++;
        if (*p)
            *p++ = '\0';
    }
    return n;
}

/* A matrix cell as plait-topo prints it: X, NV<n>, or a path type other than LOC/NVL. */
static bool cell_valid(const char *s)
{
    if (strcmp(s, "X") == 0)
        return true;
    if (strncmp(s, "NV", 2) == 0 && isdigit((unsigned char)s[2]) && s[2] != '0') {
        for (const char *p = s + 2; *p; p++)
            if (!isdigit((unsigned char)*p))
                return false;
        return strlen(s) < 8;
    }
    int t = plait_topo_path_type_parse(s);
    return t >= 0 && t != PLAIT_PATH_LOC && t != PLAIT_PATH_NVL && strcmp(s, plait_topo_path_type_name(t)) == 0;
}

/* A path type written in upper case as docs/topology.md spells it ("PXN"). */
static bool type_parse(const char *s, enum plait_topo_path_type *out)
{
    int t = plait_topo_path_type_parse(s);
    if (t < 0 || strcmp(s, plait_topo_path_type_name(t)) != 0)
        return false;
    *out = (enum plait_topo_path_type)t;
    return true;
}

static bool number_parse(const char *s, double *out)
{
    char *end;
    if (*s == '\0' || isspace((unsigned char)*s))
        return false;
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || errno != 0 || !isfinite(v) || v < 0)
        return false;
    *out = v;
    return true;
}

static bool int_parse(const char *s, int *out)
{
    if (*s == '\0' || strlen(s) > 6)
        return false;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p))
            return false;
    *out = atoi(s);
    return true;
}

/* "key=value" with the given key: the value, or NULL. */
static const char *option_value(const char *tok, const char *key)
{
    size_t n = strlen(key);
    return strncmp(tok, key, n) == 0 && tok[n] == '=' ? tok + n + 1 : NULL;
}

static struct exp_line *new_line(struct expected *e, enum line_kind kind, int lineno)
{
    if (e->nlines == e->cap_lines) {
        int cap = e->cap_lines ? 2 * e->cap_lines : 16;
        struct exp_line *l = realloc(e->lines, (size_t)cap * sizeof(*l));
        cr_assert_not_null(l, "out of memory");
        e->lines = l;
        e->cap_lines = cap;
    }
    struct exp_line *l = &e->lines[e->nlines++];
    memset(l, 0, sizeof(*l));
    l->kind = kind;
    l->lineno = lineno;
    return l;
}

static bool fail_at(char *err, size_t errlen, const char *name, int lineno, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static bool fail_at(char *err, size_t errlen, const char *name, int lineno, const char *fmt, ...)
{
    char why[MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(err, errlen, "%s:%d: %s", name, lineno, why);
    return false;
}

#define MAX_TOKENS 1024

static bool parse_affinity(struct expected *e, char **tok, int n, const char *name, int ln, char *err, size_t errlen)
{
    enum plait_topo_node_type ta, tb;
    int ia, ib;
    if (n != 5)
        return fail_at(err, errlen, name, ln, "affinity takes 4 fields: affinity GPUi NICj TYPE gdr|nogdr");
    if (!label_parse(tok[1], &ta, &ia) || ta != PLAIT_TOPO_GPU)
        return fail_at(err, errlen, name, ln, "affinity: \"%s\" is not a GPU label", tok[1]);
    if (!label_parse(tok[2], &tb, &ib) || tb != PLAIT_TOPO_NIC)
        return fail_at(err, errlen, name, ln, "affinity: \"%s\" is not a NIC label", tok[2]);
    struct exp_line *l = new_line(e, LINE_AFFINITY, ln);
    if (!type_parse(tok[3], &l->type))
        return fail_at(err, errlen, name, ln, "affinity: \"%s\" is not a path type", tok[3]);
    if (strcmp(tok[4], "gdr") != 0 && strcmp(tok[4], "nogdr") != 0)
        return fail_at(err, errlen, name, ln, "affinity: \"%s\" is neither gdr nor nogdr", tok[4]);
    l->has_gdr = strcmp(tok[4], "gdr") == 0;
    snprintf(l->a, sizeof(l->a), "%s", tok[1]);
    snprintf(l->b, sizeof(l->b), "%s", tok[2]);
    return true;
}

static bool parse_path(struct expected *e, char **tok, int n, const char *name, int ln, char *err, size_t errlen)
{
    enum plait_topo_node_type t;
    int idx;
    if (n < 4 || n > 6)
        return fail_at(err, errlen, name, ln, "path takes: path A B TYPE [bw=GB/s] [hops=N]");
    for (int k = 1; k <= 2; k++)
        if (!label_parse(tok[k], &t, &idx))
            return fail_at(err, errlen, name, ln, "path: \"%s\" is not a device label (GPUi, NICi, CPUi, NVSi, PCIi)",
                           tok[k]);
    struct exp_line *l = new_line(e, LINE_PATH, ln);
    snprintf(l->a, sizeof(l->a), "%s", tok[1]);
    snprintf(l->b, sizeof(l->b), "%s", tok[2]);
    if (!type_parse(tok[3], &l->type))
        return fail_at(err, errlen, name, ln, "path: \"%s\" is not a path type", tok[3]);
    for (int k = 4; k < n; k++) {
        const char *v;
        if ((v = option_value(tok[k], "bw")) != NULL && !l->has_bw) {
            if (!number_parse(v, &l->bw))
                return fail_at(err, errlen, name, ln, "path: bw \"%s\" is not a number >= 0", v);
            l->has_bw = true;
        } else if ((v = option_value(tok[k], "hops")) != NULL && !l->has_hops) {
            if (!int_parse(v, &l->hops))
                return fail_at(err, errlen, name, ln, "path: hops \"%s\" is not a count", v);
            l->has_hops = true;
        } else {
            return fail_at(err, errlen, name, ln, "path: \"%s\" is not bw=GB/s or hops=N (or is given twice)",
                           tok[k]);
        }
    }
    return true;
}

static bool parse_search(struct expected *e, char **tok, int n, const char *name, int ln, char *err, size_t errlen)
{
    if (n < 5 || n > 6)
        return fail_at(err, errlen, name, ln, "search takes: search ring|tree devs=LIST|all hosts=1|2 bw=GB/s [channels=N]");
    struct exp_line *l = new_line(e, LINE_SEARCH, ln);
    if (strcmp(tok[1], "ring") == 0)
        l->pattern = PLAIT_TOPO_RING;
    else if (strcmp(tok[1], "tree") == 0)
        l->pattern = PLAIT_TOPO_TREE;
    else
        return fail_at(err, errlen, name, ln, "search: \"%s\" is neither ring nor tree", tok[1]);
    const char *v = option_value(tok[2], "devs");
    if (v == NULL || *v == '\0')
        return fail_at(err, errlen, name, ln, "search: the second field must be devs=LIST or devs=all");
    if (strcmp(v, "all") == 0) {
        l->all_gpus = true;
    } else {
        char list[2048];
        snprintf(list, sizeof(list), "%s", v);
        if (strlen(v) >= sizeof(list))
            return fail_at(err, errlen, name, ln, "search: devs list too long");
        char *save = NULL;
        if (list[0] == ',' || list[strlen(list) - 1] == ',' || strstr(list, ",,"))
            return fail_at(err, errlen, name, ln, "search: empty entry in devs=%s", v);
        for (char *d = strtok_r(list, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
            enum plait_topo_node_type t;
            int idx;
            if (!label_parse(d, &t, &idx) || (t != PLAIT_TOPO_GPU && t != PLAIT_TOPO_CPU))
                return fail_at(err, errlen, name, ln, "search: \"%s\" in devs is neither a GPU nor a CPU label", d);
            if (l->ndevs == PLAIT_TOPO_MAX_LOCAL)
                return fail_at(err, errlen, name, ln, "search: more than %d devs", PLAIT_TOPO_MAX_LOCAL);
            snprintf(l->devs[l->ndevs++], LABEL_LEN, "%s", d);
        }
    }
    v = option_value(tok[3], "hosts");
    if (v == NULL || (strcmp(v, "1") != 0 && strcmp(v, "2") != 0))
        return fail_at(err, errlen, name, ln, "search: the third field must be hosts=1 or hosts=2");
    l->hosts = v[0] - '0';
    v = option_value(tok[4], "bw");
    if (v == NULL || !number_parse(v, &l->bw))
        return fail_at(err, errlen, name, ln, "search: the fourth field must be bw=GB/s (a number >= 0)");
    l->has_bw = true;
    if (n == 6) {
        v = option_value(tok[5], "channels");
        if (v == NULL || !int_parse(v, &l->channels) || l->channels < 1)
            return fail_at(err, errlen, name, ln, "search: the fifth field, if any, must be channels=N (N >= 1)");
        l->has_channels = true;
    }
    return true;
}

/* Parses the text of an expected file (`name` for messages) into *e. On a
 * malformed line returns false with "NAME:LINE: reason" in err; *e is then to
 * be freed all the same. */
static bool expected_parse(const char *text, const char *name, struct expected *e, char *err, size_t errlen)
{
    memset(e, 0, sizeof(*e));
    char *copy = strdup(text);
    cr_assert_not_null(copy, "out of memory");
    char **tok = malloc(MAX_TOKENS * sizeof(*tok));
    cr_assert_not_null(tok, "out of memory");
    bool ok = true, in_matrix = false, have_header = false, matrix_done = false;
    int ln = 0;
    /* strtok_r would skip empty lines and lose the numbering: split by hand. */
    for (char *line = copy, *next; line && ok; line = next) {
        ln++;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        const char *p = line;
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (*p == '\0' || *p == '#')
            continue;
        int n = tokenize(line, tok, MAX_TOKENS);
        if (n > MAX_TOKENS) {
            ok = fail_at(err, errlen, name, ln, "more than %d fields", MAX_TOKENS);
            break;
        }
        if (in_matrix) {
            if (n == 1 && strcmp(tok[0], "end") == 0) {
                if (!have_header || e->nrows != e->ncols)
                    ok = fail_at(err, errlen, name, ln, "the matrix has %d rows for %d columns", e->nrows, e->ncols);
                in_matrix = false;
                matrix_done = true;
                continue;
            }
            if (!have_header) {
                e->ncols = n;
                e->cols = calloc((size_t)n, sizeof(*e->cols));
                e->row_line = calloc((size_t)n, sizeof(*e->row_line));
                e->cells = calloc((size_t)n * (size_t)n, sizeof(*e->cells));
                cr_assert(e->cols && e->row_line && e->cells, "out of memory");
                for (int c = 0; c < n && ok; c++) {
                    enum plait_topo_node_type t;
                    int idx;
                    if (!label_parse(tok[c], &t, &idx) || (t != PLAIT_TOPO_GPU && t != PLAIT_TOPO_NIC))
                        ok = fail_at(err, errlen, name, ln, "matrix header: \"%s\" is not a GPU or NIC label", tok[c]);
                    else
                        snprintf(e->cols[c], LABEL_LEN, "%s", tok[c]);
                }
                have_header = true;
                continue;
            }
            if (e->nrows == e->ncols) {
                ok = fail_at(err, errlen, name, ln, "matrix: more rows than the %d columns (missing \"end\"?)", e->ncols);
                break;
            }
            if (n != e->ncols + 1) {
                ok = fail_at(err, errlen, name, ln, "matrix row has %d cells, the header %d columns", n - 1, e->ncols);
                break;
            }
            if (strcmp(tok[0], e->cols[e->nrows]) != 0) {
                ok = fail_at(err, errlen, name, ln, "matrix row \"%s\" where the header's order wants \"%s\"", tok[0],
                             e->cols[e->nrows]);
                break;
            }
            for (int c = 0; c < e->ncols; c++) {
                if (!cell_valid(tok[c + 1])) {
                    ok = fail_at(err, errlen, name, ln, "matrix cell \"%s\" (column %s) is not X, NV<n> or a path type",
                                 tok[c + 1], e->cols[c]);
                    break;
                }
                if ((c == e->nrows) != (strcmp(tok[c + 1], "X") == 0)) {
                    ok = fail_at(err, errlen, name, ln, "matrix: X must be on the diagonal and only there (column %s)",
                                 e->cols[c]);
                    break;
                }
                snprintf(e->cells[(size_t)e->nrows * (size_t)e->ncols + (size_t)c], LABEL_LEN, "%s", tok[c + 1]);
            }
            e->row_line[e->nrows++] = ln;
            continue;
        }
        if (strcmp(tok[0], "matrix") == 0) {
            if (n != 1)
                ok = fail_at(err, errlen, name, ln, "\"matrix\" stands alone on its line");
            else if (e->has_matrix)
                ok = fail_at(err, errlen, name, ln, "a second matrix");
            e->has_matrix = true;
            e->matrix_line = ln;
            in_matrix = true;
        } else if (strcmp(tok[0], "affinity") == 0) {
            ok = parse_affinity(e, tok, n, name, ln, err, errlen);
        } else if (strcmp(tok[0], "path") == 0) {
            ok = parse_path(e, tok, n, name, ln, err, errlen);
        } else if (strcmp(tok[0], "search") == 0) {
            ok = parse_search(e, tok, n, name, ln, err, errlen);
        } else {
            ok = fail_at(err, errlen, name, ln, "unknown line \"%s\" (matrix, affinity, path, search or # comment)",
                         tok[0]);
        }
    }
    if (ok && in_matrix)
        ok = fail_at(err, errlen, name, e->matrix_line, "the matrix has no \"end\"");
    if (ok && !matrix_done)
        ok = fail_at(err, errlen, name, 1, "no matrix (every fixture states its full matrix)");
    free(tok);
    free(copy);
    return ok;
}

/* ---------------------------------------------------------------- files */

static const char *fixtures_dir(void)
{
    static char dir[4096];
    const char *root = getenv("PLAIT_TEST_FIXTURES");
    if (root == NULL || *root == '\0')
        root = "tests/fixtures"; /* run from the source tree */
    snprintf(dir, sizeof(dir), "%s/topo", root);
    return dir;
}

/* The whole file, NUL-terminated, or NULL with errno set. */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len < cap - 1)
            break;
        char *b = realloc(buf, cap * 2);
        if (b == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b;
        cap *= 2;
    }
    int saved = errno;
    bool bad = ferror(f);
    fclose(f);
    if (buf == NULL || bad) {
        free(buf);
        errno = bad ? saved : ENOMEM;
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

/* ---------------------------------------------------------------- checking one fixture */

static bool bw_close(double got, double want)
{
    if (want == 0)
        return got == 0;
    return fabs(got - want) <= BW_TOLERANCE * want;
}

static void check_matrix(const struct plait_topo *topo, const struct plait_topo_paths *paths,
                         const struct expected *e, struct report *r)
{
    int ngpu = topo->counts[PLAIT_TOPO_GPU], nnic = topo->counts[PLAIT_TOPO_NIC];
    /* The matrix is the full one: every GPU, then every NIC, by index. */
    bool complete = e->ncols == ngpu + nnic;
    for (int c = 0; complete && c < e->ncols; c++) {
        char want[LABEL_LEN];
        if (c < ngpu)
            snprintf(want, sizeof(want), "GPU%d", c);
        else
            snprintf(want, sizeof(want), "NIC%d", c - ngpu);
        complete = strcmp(want, e->cols[c]) == 0;
    }
    if (!complete)
        report_add(r, "line %d: the matrix lists %d devices (%s ... ), the graph has %d GPUs and %d NICs: "
                      "the expected matrix must list GPU0..GPU%d then NIC0..NIC%d",
                   e->matrix_line, e->ncols, e->ncols ? e->cols[0] : "none", ngpu, nnic, ngpu - 1, nnic - 1);
    for (int i = 0; i < e->nrows; i++) {
        int from = label_node(topo, e->cols[i]);
        if (from < 0) {
            report_add(r, "line %d: %s: no such device in the graph", e->row_line[i], e->cols[i]);
            continue;
        }
        for (int j = 0; j < e->ncols; j++) {
            int to = label_node(topo, e->cols[j]);
            if (to < 0)
                continue; /* reported on its own row */
            char got[LABEL_LEN];
            plait_topo_path_label(plait_topo_path(paths, from, to), got, sizeof(got));
            const char *want = e->cells[(size_t)i * (size_t)e->ncols + (size_t)j];
            if (strcmp(got, want) != 0)
                report_add(r, "line %d: matrix %s -> %s: expected %s, got %s", e->row_line[i], e->cols[i], e->cols[j],
                           want, got);
        }
    }
}

static void check_affinity(const struct plait_topo *topo, const struct plait_topo_paths *paths,
                           const struct exp_line *l, struct report *r)
{
    int gpu = label_node(topo, l->a);
    if (gpu < 0) {
        report_add(r, "line %d: affinity %s: no such GPU in the graph", l->lineno, l->a);
        return;
    }
    struct plait_topo_affinity aff;
    memset(&aff, 0, sizeof(aff));
    plait_result_t rc = plait_topo_affinity(topo, paths, gpu, &aff);
    if (rc != PLAIT_SUCCESS) {
        report_add(r, "line %d: affinity %s: plait_topo_affinity failed: %s", l->lineno, l->a,
                   plait_get_last_error(NULL));
        return;
    }
    char got_nic[LABEL_LEN];
    node_label(topo, aff.nic, got_nic, sizeof(got_nic));
    const char *got_gdr = aff.has_gdr ? "gdr" : "nogdr", *want_gdr = l->has_gdr ? "gdr" : "nogdr";
    if (strcmp(got_nic, l->b) != 0 || aff.type != l->type || aff.has_gdr != l->has_gdr)
        report_add(r, "line %d: affinity %s: expected %s %s %s, got %s %s %s", l->lineno, l->a, l->b,
                   plait_topo_path_type_name(l->type), want_gdr, got_nic, plait_topo_path_type_name(aff.type),
                   got_gdr);
}

static void check_path(const struct plait_topo *topo, const struct plait_topo_paths *paths,
                       const struct exp_line *l, struct report *r)
{
    int a = label_node(topo, l->a), b = label_node(topo, l->b);
    if (a < 0 || b < 0) {
        report_add(r, "line %d: path %s -> %s: %s is no device of the graph", l->lineno, l->a, l->b,
                   a < 0 ? l->a : l->b);
        return;
    }
    const struct plait_topo_path *p = plait_topo_path(paths, a, b);
    bool same = p->type == l->type && (!l->has_bw || bw_close(p->bw, l->bw)) && (!l->has_hops || p->hops == l->hops);
    if (!same) {
        char want_bw[32] = "", want_hops[32] = "";
        if (l->has_bw)
            snprintf(want_bw, sizeof(want_bw), " bw=%g", l->bw);
        if (l->has_hops)
            snprintf(want_hops, sizeof(want_hops), " hops=%d", l->hops);
        report_add(r, "line %d: path %s -> %s: expected %s%s%s, got %s bw=%g hops=%d", l->lineno, l->a, l->b,
                   plait_topo_path_type_name(l->type), want_bw, want_hops, plait_topo_path_type_name(p->type), p->bw,
                   p->hops);
    }
}

static void check_search(const struct plait_topo *topo, const struct plait_topo_paths *paths,
                         const struct exp_line *l, struct report *r)
{
    int devs[PLAIT_TOPO_MAX_LOCAL], ndevs = 0;
    char what[MSG_LEN];
    snprintf(what, sizeof(what), "search %s hosts=%d", l->pattern == PLAIT_TOPO_RING ? "ring" : "tree", l->hosts);
    if (l->all_gpus) {
        int ngpu = topo->counts[PLAIT_TOPO_GPU];
        if (ngpu == 0 || ngpu > PLAIT_TOPO_MAX_LOCAL) {
            report_add(r, "line %d: %s devs=all: the graph has %d GPUs", l->lineno, what, ngpu);
            return;
        }
        for (int g = 0; g < ngpu; g++)
            devs[ndevs++] = plait_topo_nth(topo, PLAIT_TOPO_GPU, g);
    } else {
        for (int d = 0; d < l->ndevs; d++) {
            devs[ndevs] = label_node(topo, l->devs[d]);
            if (devs[ndevs] < 0) {
                report_add(r, "line %d: %s: %s: no such device in the graph", l->lineno, what, l->devs[d]);
                return;
            }
            ndevs++;
        }
    }
    struct plait_topo_search *out = calloc(1, sizeof(*out));
    cr_assert_not_null(out, "out of memory");
    plait_result_t rc = plait_topo_search_channels(topo, paths, devs, ndevs, l->hosts == 2, l->pattern, out);
    if (rc != PLAIT_SUCCESS) {
        report_add(r, "line %d: %s: plait_topo_search_channels failed (%s): %s", l->lineno, what,
                   plait_get_error_string(rc), plait_get_last_error(NULL));
    } else if (!bw_close(out->bw, l->bw) || (l->has_channels && out->nchannels != l->channels)) {
        char want_ch[32] = "";
        if (l->has_channels)
            snprintf(want_ch, sizeof(want_ch), " channels=%d", l->channels);
        report_add(r, "line %d: %s: expected bw=%g%s, got bw=%g channels=%d (per channel %g)", l->lineno, what,
                   l->bw, want_ch, out->bw, out->nchannels, out->nchannels > 0 ? out->ch[0].bw : 0.0);
    }
    free(out);
}

/* Loads NAME.xml, parses NAME.expected, and fails with every difference listed. */
static void check_fixture(const char *name)
{
    char xml[4096], exp[4096], err[MSG_LEN];
    snprintf(xml, sizeof(xml), "%s/%s.xml", fixtures_dir(), name);
    snprintf(exp, sizeof(exp), "%s/%s.expected", fixtures_dir(), name);

    char *text = read_file(exp);
    cr_assert_not_null(text, "%s: cannot read: %s (PLAIT_TEST_FIXTURES names the tests/fixtures folder)", exp,
                       strerror(errno));
    struct expected e;
    bool parsed = expected_parse(text, exp, &e, err, sizeof(err));
    free(text);
    if (!parsed) {
        expected_free(&e);
        cr_expect_fail("malformed expected file: %s", err);
        return;
    }

    struct plait_topo *topo = NULL;
    plait_result_t rc = plait_topo_load_xml(xml, &topo);
    if (rc != PLAIT_SUCCESS) {
        expected_free(&e);
        cr_expect_fail("%s: plait_topo_load_xml failed (%s): %s", xml, plait_get_error_string(rc),
                       plait_get_last_error(NULL));
        return;
    }
    struct plait_topo_paths *paths = NULL;
    rc = plait_topo_paths_compute(topo, &paths);
    if (rc != PLAIT_SUCCESS) {
        plait_topo_free(topo);
        expected_free(&e);
        cr_expect_fail("%s: plait_topo_paths_compute failed (%s): %s", xml, plait_get_error_string(rc),
                       plait_get_last_error(NULL));
        return;
    }

    struct report r = {0};
    check_matrix(topo, paths, &e, &r);
    int nchecks[3] = {0};
    for (int i = 0; i < e.nlines; i++) {
        const struct exp_line *l = &e.lines[i];
        nchecks[l->kind]++;
        switch (l->kind) {
        case LINE_AFFINITY: check_affinity(topo, paths, l, &r); break;
        case LINE_PATH: check_path(topo, paths, l, &r); break;
        case LINE_SEARCH: check_search(topo, paths, l, &r); break;
        }
    }
    /* Every GPU's NIC is part of the expected answer (docs/topology.md). */
    int ngpu = topo->counts[PLAIT_TOPO_GPU];
    for (int g = 0; g < ngpu; g++) {
        char label[LABEL_LEN];
        snprintf(label, sizeof(label), "GPU%d", g);
        bool found = false;
        for (int i = 0; i < e.nlines && !found; i++)
            found = e.lines[i].kind == LINE_AFFINITY && strcmp(e.lines[i].a, label) == 0;
        if (!found)
            report_add(&r, "%s has no affinity line for %s", exp, label);
    }
    int ncells = e.nrows * e.ncols;
    plait_topo_paths_free(paths);
    plait_topo_free(topo);
    expected_free(&e);
    if (r.count > 0) {
        cr_expect_fail("%s: %d differences from %s:\n%s", name, r.count, exp, report_text(&r));
        free(r.buf);
        return;
    }
    cr_log_info("%s: %d matrix cells, %d affinity, %d path and %d search lines as expected", name, ncells,
                nchecks[LINE_AFFINITY], nchecks[LINE_PATH], nchecks[LINE_SEARCH]);
}

/* ---------------------------------------------------------------- the machines, one test each */

Test(topo_fixtures, dgx_h100) { check_fixture("dgx-h100"); }
Test(topo_fixtures, dgx_a100) { check_fixture("dgx-a100"); }
Test(topo_fixtures, pcie_8gpu) { check_fixture("pcie-8gpu"); }
Test(topo_fixtures, nvlink_mesh_4gpu) { check_fixture("nvlink-mesh-4gpu"); }
Test(topo_fixtures, gb200_tray) { check_fixture("gb200-tray"); }
Test(topo_fixtures, vm_2core) { check_fixture("vm-2core"); }

/* ---------------------------------------------------------------- the folder itself */

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

/* Whether an XML comment of `text` cites a source ("source:" or a URL). */
static bool cites_source(const char *text)
{
    for (const char *p = strstr(text, "<!--"); p; p = strstr(p, "<!--")) {
        const char *end = strstr(p + 4, "-->");
        if (end == NULL)
            return false;
        size_t n = (size_t)(end - p);
        char *comment = strndup(p, n);
        if (comment == NULL)
            return false;
        bool yes = strcasestr(comment, "source:") || strstr(comment, "http://") || strstr(comment, "https://");
        free(comment);
        if (yes)
            return true;
        p = end + 3;
    }
    return false;
}

/* Every machine has its answer beside it and says where it comes from; every
 * answer has its machine; and the six machines the tests above name are there. */
Test(topo_fixtures, every_fixture_has_expected_and_source)
{
    const char *dir = fixtures_dir();
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s: %s (PLAIT_TEST_FIXTURES names the tests/fixtures folder)", dir, strerror(errno));
    struct report r = {0};
    int nxml = 0;
    for (struct dirent *ent; (ent = readdir(d)) != NULL;) {
        const char *f = ent->d_name;
        char path[4096], other[4096];
        if (has_suffix(f, ".xml")) {
            nxml++;
            snprintf(path, sizeof(path), "%s/%s", dir, f);
            snprintf(other, sizeof(other), "%s/%.*s.expected", dir, (int)(strlen(f) - 4), f);
            struct stat st;
            if (stat(other, &st) != 0)
                report_add(&r, "%s has no %.*s.expected beside it", f, (int)(strlen(f) - 4), f);
            char *text = read_file(path);
            if (text == NULL)
                report_add(&r, "%s: cannot read: %s", f, strerror(errno));
            else if (!cites_source(text))
                report_add(&r, "%s cites no source (an XML comment with \"source:\" or a URL)", f);
            free(text);
        } else if (has_suffix(f, ".expected")) {
            snprintf(other, sizeof(other), "%s/%.*s.xml", dir, (int)(strlen(f) - 9), f);
            struct stat st;
            if (stat(other, &st) != 0)
                report_add(&r, "%s has no %.*s.xml beside it", f, (int)(strlen(f) - 9), f);
        }
    }
    closedir(d);
    static const char *const named[] = {"dgx-h100", "dgx-a100", "pcie-8gpu", "nvlink-mesh-4gpu", "gb200-tray",
                                        "vm-2core"};
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s.xml", dir, named[i]);
        if (stat(path, &st) != 0)
            report_add(&r, "%s.xml is missing (a test above is named after it)", named[i]);
    }
    if (nxml == 0)
        report_add(&r, "no fixtures at all in %s", dir);
    if (r.count > 0)
        cr_expect_fail("%s:\n%s", dir, report_text(&r));
    free(r.buf);
}

/* Every fixture's expected file parses: a typo in one is named by its line,
 * independently of what the code under test computes. */
Test(topo_fixtures, every_expected_file_parses)
{
    const char *dir = fixtures_dir();
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s: %s", dir, strerror(errno));
    struct report r = {0};
    for (struct dirent *ent; (ent = readdir(d)) != NULL;) {
        if (!has_suffix(ent->d_name, ".expected"))
            continue;
        char path[4096], err[MSG_LEN];
        snprintf(path, sizeof(path), "%s/%s", dir, ent->d_name);
        char *text = read_file(path);
        if (text == NULL) {
            report_add(&r, "%s: cannot read: %s", path, strerror(errno));
            continue;
        }
        struct expected e;
        if (!expected_parse(text, path, &e, err, sizeof(err)))
            report_add(&r, "%s", err);
        expected_free(&e);
        free(text);
    }
    closedir(d);
    if (r.count > 0)
        cr_expect_fail("malformed expected files:\n%s", report_text(&r));
    free(r.buf);
}

/* The parser of expected files is strict: each of these is rejected, naming
 * the line at fault. */
Test(topo_fixtures, malformed_expected_is_rejected)
{
    static const struct {
        const char *text;
        int line;
    } bad[] = {
        {"matrix\n  GPU0 GPU1\nGPU0 X NV18\nGPU1 NV18 X\n", 1},             /* no end */
        {"matrix\n  GPU0 GPU1\nGPU0 X NV18\nGPU1 NV18\nend\n", 4},          /* short row */
        {"matrix\n  GPU0 GPU1\nGPU1 NV18 X\nGPU0 X NV18\nend\n", 3},        /* rows out of order */
        {"matrix\n  GPU0 GPU1\nGPU0 X NVL\nGPU1 NV18 X\nend\n", 3},         /* NVL is not a cell */
        {"matrix\n  GPU0 GPU1\nGPU0 NV18 X\nGPU1 NV18 X\nend\n", 3},        /* X off the diagonal */
        {"matrix\n  GPU0 FOO1\nGPU0 X PIX\nFOO1 PIX X\nend\n", 2},          /* bad label */
        {"matrix\n  GPU0\nGPU0 X\nend\naffinity GPU0 NIC0 PIX\n", 5},       /* missing gdr */
        {"matrix\n  GPU0\nGPU0 X\nend\naffinity NIC0 GPU0 PIX gdr\n", 5},   /* swapped */
        {"matrix\n  GPU0\nGPU0 X\nend\npath GPU0 GPU1 NVL bw=abc\n", 5},    /* bad number */
        {"matrix\n  GPU0\nGPU0 X\nend\npath GPU0 GPU1 NVL bw=1 bw=2\n", 5}, /* twice */
        {"matrix\n  GPU0\nGPU0 X\nend\npath GPU0 GPU1 nvl\n", 5},           /* lower case type */
        {"matrix\n  GPU0\nGPU0 X\nend\nsearch star devs=all hosts=1 bw=1\n", 5},
        {"matrix\n  GPU0\nGPU0 X\nend\nsearch ring devs=GPU0,,GPU1 hosts=1 bw=1\n", 5},
        {"matrix\n  GPU0\nGPU0 X\nend\nsearch ring devs=all hosts=3 bw=1\n", 5},
        {"matrix\n  GPU0\nGPU0 X\nend\nsearch ring devs=all hosts=1 bw=1 channels=0\n", 5},
        {"matrix\n  GPU0\nGPU0 X\nend\n\n# fine\nbogus line\n", 7},
        {"# nothing but comments\n", 1}, /* no matrix */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct expected e;
        char err[MSG_LEN] = "", want[64];
        bool ok = expected_parse(bad[i].text, "t.expected", &e, err, sizeof(err));
        expected_free(&e);
        snprintf(want, sizeof(want), "t.expected:%d: ", bad[i].line);
        cr_expect(!ok, "case %zu was accepted:\n%s", i, bad[i].text);
        cr_expect(strncmp(err, want, strlen(want)) == 0, "case %zu: the message \"%s\" does not start with \"%s\"", i,
                  err, want);
    }
    /* And the spec's own example parses. */
    static const char example[] = "# comments (the source, how each figure was derived)\n"
                                  "matrix\n"
                                  "        GPU0  GPU1  NIC0\n"
                                  "GPU0    X     NV18  PIX\n"
                                  "GPU1    NV18  X     PXN\n"
                                  "NIC0    PIX   PXN   X\n"
                                  "end\n"
                                  "affinity GPU0 NIC0 PIX gdr\n"
                                  "affinity GPU1 NIC0 PXN gdr\n"
                                  "path GPU0 GPU1 NVL bw=450 hops=2\n"
                                  "search ring devs=GPU0,GPU1 hosts=1 bw=450\n"
                                  "search ring devs=GPU0,GPU1 hosts=2 bw=50 channels=1\n"
                                  "search tree devs=all hosts=2 bw=50\n";
    struct expected e;
    char err[MSG_LEN] = "";
    bool ok = expected_parse(example, "example", &e, err, sizeof(err));
    cr_expect(ok, "the example of docs/topology.md does not parse: %s", err);
    cr_expect_eq(e.ncols, 3);
    cr_expect_eq(e.nlines, 6);
    expected_free(&e);
}
