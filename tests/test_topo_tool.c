/* plait-topo as a user runs it: the built tool (PLAIT_TEST_TOPO_TOOL) is executed
 * on the recorded machines of tests/fixtures/topo (PLAIT_TEST_FIXTURES) and on
 * this one, and its output is checked against the fixtures' expected answers
 * (docs/topology.md, "The matrix plait-topo prints"), against itself after a
 * dump and reload, and for its errors and exit statuses. Every run has a
 * deadline; a tool that overruns it is killed and the test fails. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "tests/tool_run.h"
#include "topology/topo.h"

#define RUN_TIMEOUT_S 30.0
#define MAX_DEVS 512
#define CELL_LEN 16
#define MAX_FIXTURES 256

/* ---------------------------------------------------------------- running the tool */

static const char *tool_path(void)
{
    return tool_run_path("PLAIT_TEST_TOPO_TOOL", "plait-topo");
}

static const char *fixtures_dir(void)
{
    static char dir[4096];
    const char *p = getenv("PLAIT_TEST_FIXTURES");
    cr_assert(p && *p, "PLAIT_TEST_FIXTURES is not set (run this test through meson test)");
    snprintf(dir, sizeof(dir), "%s/topo", p);
    return dir;
}

static struct run run_tool(const char *const *args)
{
    return tool_run(tool_path(), "plait-topo", RUN_TIMEOUT_S, args);
}

/* ---------------------------------------------------------------- fixtures */

struct fixture_list {
    int n;
    char name[MAX_FIXTURES][256]; /* NAME of NAME.xml */
    bool has_expected[MAX_FIXTURES];
};

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

static void list_fixtures(struct fixture_list *l)
{
    memset(l, 0, sizeof(*l));
    const char *dir = fixtures_dir();
    DIR *d = opendir(dir);
    /* A missing folder would leave every loop over the fixtures empty, and
     * the tests that run them would pass having checked nothing. */
    cr_assert_not_null(d, "%s: %s (PLAIT_TEST_FIXTURES names the tests/fixtures folder)", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) && l->n < MAX_FIXTURES) {
        size_t len = strlen(e->d_name);
        if (len <= 4 || len >= sizeof(l->name[0]) || strcmp(e->d_name + len - 4, ".xml") != 0)
            continue;
        memcpy(l->name[l->n], e->d_name, len - 4);
        l->name[l->n][len - 4] = '\0';
        l->n++;
    }
    closedir(d);
    cr_assert_gt(l->n, 0, "no NAME.xml fixtures in %s", dir);
    qsort(l->name, (size_t)l->n, sizeof(l->name[0]), cmp_name);
    for (int i = 0; i < l->n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s.expected", dir, l->name[i]);
        l->has_expected[i] = access(path, R_OK) == 0;
    }
}

static void fixture_path(const char *name, const char *ext, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s%s", fixtures_dir(), name, ext);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot read %s: %s", path, strerror(errno));
    char *s = tool_run_read_all(f);
    fclose(f);
    return s;
}

/* ---------------------------------------------------------------- matrices */

struct matrix {
    int nrows, ncols;
    char row[MAX_DEVS][CELL_LEN];
    char col[MAX_DEVS][CELL_LEN];
    char cell[MAX_DEVS][MAX_DEVS][CELL_LEN];
    char problem[256]; /* why a block was rejected, "" when it parsed */
};

static bool is_label(const char *tok)
{
    if (strncmp(tok, "GPU", 3) != 0 && strncmp(tok, "NIC", 3) != 0)
        return false;
    if (!isdigit((unsigned char)tok[3]))
        return false;
    for (const char *p = tok + 3; *p; p++)
        if (!isdigit((unsigned char)*p))
            return false;
    return true;
}

/* Splits a line (modified in place) on whitespace; returns the number of tokens. */
static int tokenize(char *line, char **tok, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, " \t\r", &save); t && n < max; t = strtok_r(NULL, " \t\r", &save))
        tok[n++] = t;
    return n;
}

static int find_label(const char (*labels)[CELL_LEN], int n, const char *label)
{
    for (int i = 0; i < n; i++)
        if (strcmp(labels[i], label) == 0)
            return i;
    return -1;
}

static struct matrix *matrix_new(void)
{
    struct matrix *m = calloc(1, sizeof(*m));
    cr_assert(m, "out of memory");
    return m;
}

/* Reads header and rows into m from lines[first..nlines); rows end at the
 * first line whose first token is not a device label (or is `end` when
 * is_expected). Device cells only: the tool's affinity columns after them are
 * not read. */
static void parse_rows(char **lines, int first, int nlines, bool is_expected, struct matrix *m)
{
    char *tok[MAX_DEVS + 8];
    char *hdr = strdup(lines[first]);
    int n = tokenize(hdr, tok, MAX_DEVS + 8);
    for (int i = 0; i < n && is_label(tok[i]) && m->ncols < MAX_DEVS; i++)
        snprintf(m->col[m->ncols++], CELL_LEN, "%s", tok[i]);
    if (is_expected && m->ncols != n)
        snprintf(m->problem, sizeof(m->problem), "header token '%s' is not a device label", tok[m->ncols]);
    free(hdr);
    for (int l = first + 1; l < nlines && m->nrows < MAX_DEVS; l++) {
        char *line = strdup(lines[l]);
        n = tokenize(line, tok, MAX_DEVS + 8);
        bool is_row = n > 0 && is_label(tok[0]);
        if (!is_row) {
            if (is_expected && !(n > 0 && strcmp(tok[0], "end") == 0) && !m->problem[0])
                snprintf(m->problem, sizeof(m->problem), "line '%s' inside the block is neither a row nor 'end'",
                         lines[l]);
            free(line);
            break;
        }
        if (n - 1 < m->ncols && !m->problem[0])
            snprintf(m->problem, sizeof(m->problem), "row %s has %d cells for %d columns", tok[0], n - 1, m->ncols);
        if (is_expected && n - 1 > m->ncols && !m->problem[0])
            snprintf(m->problem, sizeof(m->problem), "row %s has %d cells for %d columns", tok[0], n - 1, m->ncols);
        int r = m->nrows++;
        snprintf(m->row[r], CELL_LEN, "%s", tok[0]);
        for (int c = 0; c < m->ncols; c++)
            snprintf(m->cell[r][c], CELL_LEN, "%s", c + 1 < n ? tok[c + 1] : "");
        free(line);
    }
}

static int split_lines(char *text, char ***lines_out)
{
    int cap = 64, n = 0;
    char **lines = malloc(sizeof(char *) * (size_t)cap);
    cr_assert(lines);
    for (char *p = text; p && *p;) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        if (n == cap) {
            cap *= 2;
            lines = realloc(lines, sizeof(char *) * (size_t)cap);
            cr_assert(lines);
        }
        lines[n++] = p;
        p = nl ? nl + 1 : NULL;
    }
    *lines_out = lines;
    return n;
}

/* The matrix the tool printed: its header is the first line that starts with
 * blanks followed by a device label. Returns false when there is none. */
static bool parse_tool_matrix(const char *output, struct matrix *m)
{
    char *text = strdup(output), **lines;
    int n = split_lines(text, &lines);
    bool found = false;
    for (int l = 0; l < n && !found; l++) {
        if (lines[l][0] != ' ' && lines[l][0] != '\t')
            continue;
        char *copy = strdup(lines[l]), *tok[1];
        if (tokenize(copy, tok, 1) == 1 && is_label(tok[0])) {
            parse_rows(lines, l, n, false, m);
            found = true;
        }
        free(copy);
    }
    free(lines);
    free(text);
    return found;
}

/* The "matrix ... end" block of a NAME.expected file (comments: '#' lines). */
static bool parse_expected_matrix(const char *path, struct matrix *m)
{
    char *text = slurp(path), **lines;
    int n = split_lines(text, &lines);
    int start = -1;
    for (int l = 0; l < n && start < 0; l++) {
        char *copy = strdup(lines[l]), *tok[2];
        int k = tokenize(copy, tok, 2);
        if (k == 1 && strcmp(tok[0], "matrix") == 0)
            start = l + 1;
        free(copy);
    }
    /* Comments and blank lines between "matrix" and the header are allowed. */
    while (start >= 0 && start < n) {
        char *copy = strdup(lines[start]), *tok[1];
        int k = tokenize(copy, tok, 1);
        bool skip = k == 0 || tok[0][0] == '#';
        free(copy);
        if (!skip)
            break;
        start++;
    }
    if (start >= 0 && start < n)
        parse_rows(lines, start, n, true, m);
    free(lines);
    free(text);
    return start >= 0 && start < n;
}

/* Compares every cell of `want` with `got` by label, reporting each difference
 * (cr_expect: the test goes on and lists them all). Returns how many differ. */
static int compare_matrices(const char *what, const struct matrix *want, const struct matrix *got)
{
    int bad = 0;
    for (int c = 0; c < got->ncols; c++) {
        if (find_label((const char(*)[CELL_LEN])want->col, want->ncols, got->col[c]) < 0) {
            cr_expect_fail("%s: the tool prints column %s, which the expected matrix does not have", what, got->col[c]);
            bad++;
        }
    }
    for (int r = 0; r < got->nrows; r++) {
        if (find_label((const char(*)[CELL_LEN])want->row, want->nrows, got->row[r]) < 0) {
            cr_expect_fail("%s: the tool prints row %s, which the expected matrix does not have", what, got->row[r]);
            bad++;
        }
    }
    for (int r = 0; r < want->nrows; r++) {
        int gr = find_label((const char(*)[CELL_LEN])got->row, got->nrows, want->row[r]);
        if (gr < 0) {
            cr_expect_fail("%s: row %s is missing from the tool's matrix", what, want->row[r]);
            bad++;
            continue;
        }
        for (int c = 0; c < want->ncols; c++) {
            int gc = find_label((const char(*)[CELL_LEN])got->col, got->ncols, want->col[c]);
            if (gc < 0) {
                if (r == 0) {
                    cr_expect_fail("%s: column %s is missing from the tool's matrix", what, want->col[c]);
                    bad++;
                }
                continue;
            }
            if (strcmp(want->cell[r][c], got->cell[gr][gc]) != 0) {
                cr_expect_fail("%s: %s -> %s: expected %s, plait-topo prints %s", what, want->row[r], want->col[c],
                               want->cell[r][c], got->cell[gr][gc][0] ? got->cell[gr][gc] : "(nothing)");
                bad++;
            }
        }
    }
    return bad;
}

/* ---------------------------------------------------------------- output pieces */

/* The summary line ("host NAME: ...") without its trailing "[source: origin]",
 * which is the only part a dump and its reload may differ in. */
static char *summary_of(const char *output)
{
    const char *p = output;
    while (p && *p) {
        if (strncmp(p, "host ", 5) == 0) {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            char *s = strndup(p, len);
            char *br = strstr(s, "  [");
            if (br)
                *br = '\0';
            return s;
        }
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    return NULL;
}

/* The output after the summary line: the matrix, its affinity columns and the legend. */
static const char *after_summary(const char *output)
{
    const char *p = strstr(output, "host ");
    if (!p)
        return output;
    p = strchr(p, '\n');
    return p ? p + 1 : "";
}

/* Reports the first line where two outputs differ. */
static void expect_same_text(const char *what, const char *a, const char *b)
{
    if (strcmp(a, b) == 0)
        return;
    int line = 1;
    while (*a && *a == *b) {
        if (*a == '\n')
            line++;
        a++;
        b++;
    }
    while (line > 1 && a[-1] != '\n') { /* back to the start of the differing line */
        a--;
        b--;
    }
    cr_expect_fail("%s differ at line %d:\n  before: %.*s\n  after:  %.*s", what, line, (int)strcspn(a, "\n"), a,
                   (int)strcspn(b, "\n"), b);
}

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/plait-topo-test-XXXXXX");
    cr_assert(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void remove_tmpdir(void)
{
    tool_run_rmdir(tmpdir);
}

TestSuite(topo_tool, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 110);

/* ---------------------------------------------------------------- (1) the matrix of every fixture */

Test(topo_tool, matrix_matches_fixtures)
{
    struct fixture_list *l = calloc(1, sizeof(*l));
    cr_assert(l);
    list_fixtures(l);
    int checked = 0, failed = 0;
    for (int i = 0; i < l->n; i++) {
        if (!l->has_expected[i]) {
            /* Every fixture has its answer beside it (tests/fixtures/topo/README.md). */
            cr_expect_fail("%s/%s.xml has no %s.expected beside it", fixtures_dir(), l->name[i], l->name[i]);
            failed++;
            continue;
        }
        char xml[4096], expected[4096];
        fixture_path(l->name[i], ".xml", xml, sizeof(xml));
        fixture_path(l->name[i], ".expected", expected, sizeof(expected));
        checked++;

        struct matrix *want = matrix_new(), *got = matrix_new();
        if (!parse_expected_matrix(expected, want) || want->problem[0] || want->nrows == 0) {
            cr_expect_fail("%s: no valid 'matrix ... end' block: %s", expected,
                           want->problem[0] ? want->problem : "no block or no rows");
            failed++;
            goto next;
        }
        struct run r = run_tool((const char *[]){"--load", xml, "--matrix", NULL});
        if (r.status != 0) {
            cr_expect_fail("plait-topo --load %s --matrix: exit %d\n%s", xml, r.status, r.err);
            failed++;
        } else if (!parse_tool_matrix(r.out, got)) {
            cr_expect_fail("plait-topo --load %s --matrix printed no matrix:\n%s", xml, r.out);
            failed++;
        } else if (got->problem[0]) {
            cr_expect_fail("%s: the tool's matrix is malformed: %s\n%s", l->name[i], got->problem, r.out);
            failed++;
        } else if (compare_matrices(l->name[i], want, got) > 0) {
            failed++;
        } else {
            cr_log_info("%s: %d x %d matrix as expected", l->name[i], want->nrows, want->ncols);
        }
        run_free(&r);
    next:
        free(want);
        free(got);
    }
    /* The fixtures are written alongside this tool: an empty folder must not read as a pass. */
    cr_assert(checked > 0, "no fixtures to check: %s has no NAME.xml with NAME.expected beside it", fixtures_dir());
    cr_assert_eq(failed, 0, "%d fixture(s) failed (listed above: no NAME.expected, or cells of the matrix differ), "
                 "%d checked", failed, checked);
    free(l);
}

/* ---------------------------------------------------------------- (2) dump, reload, same output */

/* `dump_args` makes the graph and dumps it to `dump`; `print_args` prints the
 * same graph without dumping. The reload must print the same summary, matrix
 * and legend. */
static void check_roundtrip(const char *what, const char *const *print_args, const char *dump)
{
    const char *args[16];
    int n = 0;
    for (; print_args[n]; n++)
        args[n] = print_args[n];
    args[n] = "--dump";
    args[n + 1] = dump;
    args[n + 2] = NULL;

    unlink(dump);
    struct run d = run_tool(args);
    cr_expect_eq(d.status, 0, "%s: --dump %s: exit %d\n%s", what, dump, d.status, d.err);
    cr_expect_str_empty(d.out, "%s: --dump alone must print nothing, printed:\n%s", what, d.out);
    run_free(&d);
    struct stat st;
    if (stat(dump, &st) != 0 || st.st_size == 0) {
        cr_expect_fail("%s: --dump %s wrote no file", what, dump);
        return;
    }

    struct run before = run_tool(print_args);
    struct run after = run_tool((const char *[]){"--load", dump, NULL});
    cr_expect_eq(before.status, 0, "%s: exit %d\n%s", what, before.status, before.err);
    cr_expect_eq(after.status, 0, "%s: --load of its dump: exit %d\n%s", what, after.status, after.err);
    if (before.status == 0 && after.status == 0) {
        char *s1 = summary_of(before.out), *s2 = summary_of(after.out);
        cr_expect(s1 && s2, "%s: no summary line ('host ...'):\n%s\n---\n%s", what, before.out, after.out);
        if (s1 && s2)
            cr_expect_str_eq(s1, s2, "%s: the summary changed across --dump/--load:\n  before: %s\n  after:  %s",
                             what, s1, s2);
        free(s1);
        free(s2);
        struct matrix *m1 = matrix_new(), *m2 = matrix_new();
        bool h1 = parse_tool_matrix(before.out, m1), h2 = parse_tool_matrix(after.out, m2);
        cr_expect_eq(h1, h2, "%s: a matrix before the dump: %d, after: %d", what, h1, h2);
        if (h1 && h2)
            compare_matrices(what, m1, m2);
        free(m1);
        free(m2);
        expect_same_text(what, after_summary(before.out), after_summary(after.out));
    }
    run_free(&before);
    run_free(&after);

    /* "-" writes the XML to stdout. */
    args[n + 1] = "-";
    struct run s = run_tool(args);
    cr_expect_eq(s.status, 0, "%s: --dump -: exit %d\n%s", what, s.status, s.err);
    cr_expect(strstr(s.out, "<plait_topology") != NULL, "%s: --dump - printed no <plait_topology> document:\n%.2000s",
              what, s.out);
    run_free(&s);
}

Test(topo_tool, dump_then_load_prints_the_same)
{
    char dump[256];
    snprintf(dump, sizeof(dump), "%s/dump.xml", tmpdir);
    check_roundtrip("this machine", (const char *[]){NULL}, dump);

    struct fixture_list *l = calloc(1, sizeof(*l));
    cr_assert(l);
    list_fixtures(l);
    for (int i = 0; i < l->n; i++) {
        char xml[4096];
        fixture_path(l->name[i], ".xml", xml, sizeof(xml));
        check_roundtrip(l->name[i], (const char *[]){"--load", xml, NULL}, dump);
    }
    free(l);
}

/* ---------------------------------------------------------------- (3) malformed files */

/* The message must name the file, and the loader's "FILE:LINE:" must reach the user. */
static void expect_load_error(const char *what, const char *content)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.xml", tmpdir, what);
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s: %s", path, strerror(errno));
    fputs(content, f);
    fclose(f);

    struct run r = run_tool((const char *[]){"--load", path, "--matrix", NULL});
    cr_expect_eq(r.status, 1, "%s: --load of a malformed file: exit %d, want 1\n%s", what, r.status, r.err);
    const char *at = strstr(r.err, path);
    cr_expect(at != NULL, "%s: the message does not name the file %s:\n%s", what, path, r.err);
    bool has_line = false;
    for (; at; at = strstr(at + 1, path)) {
        const char *p = at + strlen(path);
        has_line |= p[0] == ':' && isdigit((unsigned char)p[1]);
    }
    cr_expect(has_line, "%s: the message has no line number (%s:LINE):\n%s", what, path, r.err);
    run_free(&r);
}

Test(topo_tool, malformed_file_names_file_and_line)
{
    expect_load_error("unclosed_tag", "<plait_topology version=\"1\" host=\"x\">\n"
                                      "  <cpu name=\"cpu0\" cores=\"4\"/>\n"
                                      "  <gpu name=\"gpu0\" sm=\"90\"\n"
                                      "</plait_topology>\n");
    expect_load_error("dangling_link", "<plait_topology version=\"1\" host=\"x\">\n"
                                       "  <cpu name=\"cpu0\"/>\n"
                                       "  <link a=\"cpu0\" b=\"gpu7\" type=\"PCI\"/>\n"
                                       "</plait_topology>\n");
    expect_load_error("bad_gen", "<plait_topology version=\"1\" host=\"x\">\n"
                                 "  <cpu name=\"cpu0\"/>\n"
                                 "  <pci name=\"sw0\" kind=\"switch\" gen=\"42\" numa=\"0\"/>\n"
                                 "</plait_topology>\n");

    /* A file that is not there: a failure (1) naming it, not a usage error. */
    char missing[256];
    snprintf(missing, sizeof(missing), "%s/no-such-file.xml", tmpdir);
    struct run r = run_tool((const char *[]){"--load", missing, NULL});
    cr_expect_eq(r.status, 1, "--load of a missing file: exit %d, want 1\n%s", r.status, r.err);
    cr_expect(strstr(r.err, missing) != NULL, "--load of a missing file: the message does not name it:\n%s", r.err);
    run_free(&r);
}

/* ---------------------------------------------------------------- (4) usage errors */

static void expect_usage_error(const char *const *args, const char *mention)
{
    struct run r = run_tool(args);
    cr_expect_eq(r.status, 2, "plait-topo %s ...: exit %d, want 2 (usage)\n%s", args[0], r.status, r.err);
    cr_expect(strstr(r.err, "usage") != NULL, "plait-topo %s ...: no usage text on stderr:\n%s", args[0], r.err);
    cr_expect(strstr(r.err, mention) != NULL, "plait-topo %s ...: the message does not mention '%s':\n%s", args[0],
              mention, r.err);
    run_free(&r);
}

Test(topo_tool, usage_errors_exit_2)
{
    expect_usage_error((const char *[]){"--frobnicate", NULL}, "--frobnicate");
    expect_usage_error((const char *[]){"--matrix", "stray", NULL}, "stray");
    expect_usage_error((const char *[]){"--load", NULL}, "--load");
    expect_usage_error((const char *[]){"--ranks", "many", NULL}, "--ranks");
    expect_usage_error((const char *[]){"--ranks", "0", NULL}, "--ranks");
    expect_usage_error((const char *[]){"--hosts", "2", NULL}, "--hosts");
    expect_usage_error((const char *[]){"--load", "x.xml", "--fsroot", "/", NULL}, "--load");

    struct run r = run_tool((const char *[]){"--help", NULL});
    cr_expect_eq(r.status, 0, "--help: exit %d", r.status);
    cr_expect(strstr(r.out, "usage") != NULL, "--help printed no usage on stdout:\n%s", r.out);
    run_free(&r);
}

/* ---------------------------------------------------------------- (5) this machine */

Test(topo_tool, live_machine_summary)
{
    struct run r = run_tool((const char *[]){NULL});
    cr_assert_eq(r.status, 0, "plait-topo on this machine: exit %d\n%s", r.status, r.err);
    char *s = summary_of(r.out);
    cr_assert(s, "no summary line ('host NAME: ...') in:\n%s", r.out);
    const char *colon = strstr(s, ": ");
    int numa = 0;
    cr_assert(colon && sscanf(colon + 2, "%d NUMA node", &numa) == 1,
              "the summary does not begin with the NUMA node count: %s", s);
    cr_expect_geq(numa, 1, "the summary has %d NUMA nodes: %s", numa, s);
    cr_log_info("%s", s);
    free(s);
    run_free(&r);
}

/* ---------------------------------------------------------------- (6) channels of two DGX H100 */

Test(topo_tool, ranks_dgx_h100_two_hosts)
{
    char xml[4096];
    fixture_path("dgx-h100", ".xml", xml, sizeof(xml));
    cr_assert_eq(access(xml, R_OK), 0, "the fixture %s cannot be read: %s", xml, strerror(errno));

    struct run r = run_tool((const char *[]){"--ranks", "8", "--hosts", "2", "--load", xml, NULL});
    cr_assert_eq(r.status, 0, "--ranks 8 --hosts 2: exit %d\n%s", r.status, r.err);
    /* docs/topology.md: 8 channels, one per NIC; the NICs bound them at 8 x 50 GB/s. */
    const char *ring = strstr(r.out, "\nring: ");
    ring = ring ? ring + 1 : (strncmp(r.out, "ring: ", 6) == 0 ? r.out : NULL);
    cr_assert(ring, "no 'ring:' line in:\n%s", r.out);
    int nch = 0;
    double total = 0;
    cr_assert(sscanf(ring, "ring: %d channel%*[s], total %lf GB/s", &nch, &total) == 2 ||
                  sscanf(ring, "ring: %d channel, total %lf GB/s", &nch, &total) == 2,
              "cannot read the ring line: %.*s", (int)strcspn(ring, "\n"), ring);
    cr_expect_eq(nch, 8, "ring: %d channels, want 8\n%s", nch, r.out);
    cr_expect(fabs(total - 400.0) <= 4.0, "ring: total %.1f GB/s, want 400 (within 1%%)\n%s", total, r.out);
    /* One line per channel under the ring heading, each entering and leaving through a NIC. */
    int lines = 0;
    for (const char *p = strchr(ring, '\n'); p && strncmp(p + 1, "  channel", 9) == 0; p = strchr(p + 1, '\n')) {
        lines++;
        const char *end = strchr(p + 1, '\n');
        int len = end ? (int)(end - p - 1) : (int)strlen(p + 1);
        cr_expect(memmem(p + 1, (size_t)len, "NIC", 3) != NULL, "a ring channel without its NICs: %.*s", len, p + 1);
    }
    cr_expect_eq(lines, nch, "the ring heading says %d channels, %d are listed\n%s", nch, lines, r.out);
    cr_expect(strstr(r.out, "\ntree: ") != NULL, "no 'tree:' section in:\n%s", r.out);
    run_free(&r);
}

/* ---------------------------------------------------------------- (7) Graphviz */

static void check_dot(const char *what, const char *const *args, const struct plait_topo *topo)
{
    struct run r = run_tool(args);
    cr_expect_eq(r.status, 0, "%s: --dot: exit %d\n%s", what, r.status, r.err);
    cr_expect(strncmp(r.out, "graph", 5) == 0 || strncmp(r.out, "digraph", 7) == 0,
              "%s: --dot output does not start with graph/digraph:\n%.500s", what, r.out);
    int missing = 0;
    for (int i = 0; i < topo->nnodes; i++) {
        char quoted[PLAIT_TOPO_NAME_LEN + 2];
        snprintf(quoted, sizeof(quoted), "\"%s\"", topo->nodes[i].name);
        if (!strstr(r.out, quoted) && missing++ < 20)
            cr_expect_fail("%s: --dot does not mention node %s", what, topo->nodes[i].name);
    }
    cr_expect_eq(missing, 0, "%s: %d of %d nodes missing from --dot", what, missing, topo->nnodes);
    run_free(&r);
}

Test(topo_tool, dot_mentions_every_node)
{
    /* The node names come from the library itself, the same graph the tool reads. */
    struct plait_topo *topo = NULL;
    cr_assert_eq(plait_topo_discover(NULL, &topo), PLAIT_SUCCESS, "discovery: %s", plait_last_error_get());
    check_dot("this machine", (const char *[]){"--dot", NULL}, topo);
    plait_topo_free(topo);

    struct fixture_list *l = calloc(1, sizeof(*l));
    cr_assert(l);
    list_fixtures(l);
    for (int i = 0; i < l->n; i++) {
        char xml[4096];
        fixture_path(l->name[i], ".xml", xml, sizeof(xml));
        topo = NULL;
        if (plait_topo_load_xml(xml, &topo) != PLAIT_SUCCESS) {
            cr_expect_fail("%s: %s", xml, plait_last_error_get());
            continue;
        }
        check_dot(l->name[i], (const char *[]){"--load", xml, "--dot", NULL}, topo);
        plait_topo_free(topo);
    }
    free(l);
}
