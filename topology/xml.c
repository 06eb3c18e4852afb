/* Topology XML: a small XML reader of our own, plait's format (load and dump)
 * and the entry points that pick plait's or NCCL's format by the root element
 * (docs/topology.md, "The XML format").
 *
 * The reader is hand-written rather than libxml2 so that it stays small,
 * dependency-free and fuzzable (tests/fuzz/fuzz_topo_xml.c): a topology file
 * comes from outside, and everything in it is checked before use. */
#define _GNU_SOURCE
#include "topology/xml_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "base/file.h"
#include "base/log.h"

/* ------------------------------------------------------------------ arena */

struct plait_xml_arena_block {
    struct plait_xml_arena_block *next;
    size_t used, cap;
    max_align_t data[];
};

#define ARENA_BLOCK (64u << 10)

static void *arena_alloc(struct plait_xml_doc *doc, size_t n)
{
    const size_t align = sizeof(max_align_t);
    n = (n + align - 1) / align * align;
    struct plait_xml_arena_block *b = doc->blocks;
    if (b == NULL || b->cap - b->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        b = malloc(sizeof(*b) + cap);
        if (b == NULL)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = doc->blocks;
        doc->blocks = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    return p;
}

static char *arena_strdup(struct plait_xml_doc *doc, const char *s, size_t n)
{
    char *d = arena_alloc(doc, n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

void plait_xml_doc_free(struct plait_xml_doc *doc)
{
    if (doc == NULL)
        return;
    struct plait_xml_arena_block *b = doc->blocks;
    while (b != NULL) {
        struct plait_xml_arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(doc);
}

/* ------------------------------------------------------------------ messages */

void plait_xml_quote(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    if (len == 0)
        return;
    for (size_t i = 0; s[i] != '\0' && o + 1 < len; i++) {
        if (i == 40) {
            /* Long values are cut: the message must stay one readable line. */
            for (int k = 0; k < 3 && o + 1 < len; k++)
                buf[o++] = '.';
            break;
        }
        unsigned char c = (unsigned char)s[i];
        buf[o++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    buf[o] = '\0';
}

plait_result_t plait_xml_fail(const struct plait_xml_doc *doc, int line, const char *fmt, ...)
{
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%d: %s", doc->name, line, reason);
}

/* ------------------------------------------------------------------ reader */

struct xml_reader {
    struct plait_xml_doc *doc;
    const char *p, *end;
    int line;
    struct plait_xml_elem *open; /* innermost element not yet closed */
    int depth;
    bool has_root, has_decl;
    char value[PLAIT_XML_MAX_VALUE + 8];
};

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_name_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == ':'; }
static bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '.' || c == '-'; }

static bool starts_with(const struct xml_reader *r, const char *s)
{
    size_t n = strlen(s);
    return (size_t)(r->end - r->p) >= n && memcmp(r->p, s, n) == 0;
}

static void skip_space(struct xml_reader *r)
{
    while (r->p < r->end && is_space(*r->p)) {
        if (*r->p == '\n')
            r->line++;
        r->p++;
    }
}

static plait_result_t fail_here(struct xml_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static plait_result_t fail_here(struct xml_reader *r, const char *fmt, ...)
{
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    return plait_xml_fail(r->doc, r->line, "%s", reason);
}

static plait_result_t out_of_memory(void) { return plait_error(PLAIT_ERR_SYSTEM, "topology XML: out of memory"); }

/* Reads a name into the arena. `what` says what the name is for in messages. */
static plait_result_t read_name(struct xml_reader *r, const char *what, const char **out)
{
    const char *s = r->p;
    if (r->p >= r->end || !is_name_start(*r->p)) {
        char c[8];
        if (r->p >= r->end)
            snprintf(c, sizeof(c), "EOF");
        else
            plait_xml_quote((char[]){*r->p, '\0'}, c, sizeof(c));
        return fail_here(r, "expected %s, found '%s'", what, c);
    }
    while (r->p < r->end && is_name_char(*r->p))
        r->p++;
    size_t n = (size_t)(r->p - s);
    if (n > PLAIT_XML_MAX_NAME)
        return fail_here(r, "%s \"%.20s...\" is longer than %d characters", what, s, PLAIT_XML_MAX_NAME);
    *out = arena_strdup(r->doc, s, n);
    return *out ? PLAIT_SUCCESS : out_of_memory();
}

static int put_utf8(char *o, unsigned long cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes one reference starting at '&' into o; returns the bytes written. */
static plait_result_t read_reference(struct xml_reader *r, char *o, int *written)
{
    static const struct {
        const char *name;
        char c;
    } predefined[] = {{"lt", '<'}, {"gt", '>'}, {"amp", '&'}, {"quot", '"'}, {"apos", '\''}};
    const char *s = r->p + 1;
    const char *semi = s;
    while (semi < r->end && semi - s < 12 && *semi != ';')
        semi++;
    if (semi >= r->end || *semi != ';')
        return fail_here(r, "'&' does not start an entity reference (write &amp;)");
    size_t n = (size_t)(semi - s);
    char ref[16];
    memcpy(ref, s, n);
    ref[n] = '\0';
    if (ref[0] == '#') {
        bool hex = ref[1] == 'x';
        const char *digits = ref + (hex ? 2 : 1);
        unsigned long cp = 0;
        if (*digits == '\0')
            return fail_here(r, "character reference &%s; has no digits", ref);
        for (const char *d = digits; *d; d++) {
            int v;
            if (*d >= '0' && *d <= '9')
                v = *d - '0';
            else if (hex && *d >= 'a' && *d <= 'f')
                v = *d - 'a' + 10;
            else if (hex && *d >= 'A' && *d <= 'F')
                v = *d - 'A' + 10;
            else
                return fail_here(r, "character reference &%s; is not a number", ref);
            cp = cp * (hex ? 16 : 10) + (unsigned long)v;
            if (cp > 0x10ffff)
                break;
        }
        /* XML's Char production: no NUL, no other C0 control but tab/LF/CR, no
         * surrogates, nothing past U+10FFFF. */
        if (cp > 0x10ffff || (cp < 0x20 && cp != 0x9 && cp != 0xa && cp != 0xd) || (cp >= 0xd800 && cp <= 0xdfff) ||
            cp == 0xfffe || cp == 0xffff)
            return fail_here(r, "character reference &%s; is not an XML character", ref);
        *written = put_utf8(o, cp);
    } else {
        size_t i;
        for (i = 0; i < sizeof(predefined) / sizeof(predefined[0]); i++)
            if (strcmp(ref, predefined[i].name) == 0)
                break;
        if (i == sizeof(predefined) / sizeof(predefined[0])) {
            char q[48];
            plait_xml_quote(ref, q, sizeof(q));
            return fail_here(r, "unknown entity &%s; (only &lt; &gt; &amp; &quot; &apos; and &#N;)", q);
        }
        o[0] = predefined[i].c;
        *written = 1;
    }
    r->p = semi + 1;
    return PLAIT_SUCCESS;
}

/* Reads a quoted attribute value, decoding references. */
static plait_result_t read_value(struct xml_reader *r, const char *attr, const char **out)
{
    if (r->p >= r->end || (*r->p != '"' && *r->p != '\''))
        return fail_here(r, "attribute %s: value must be in quotes", attr);
    char quote = *r->p;
    r->p++;
    size_t n = 0;
    for (;;) {
        if (r->p >= r->end)
            return fail_here(r, "attribute %s: value is not closed by %c", attr, quote);
        char c = *r->p;
        if (c == quote) {
            r->p++;
            break;
        }
        if (n > PLAIT_XML_MAX_VALUE)
            return fail_here(r, "attribute %s: value is longer than %d characters", attr, PLAIT_XML_MAX_VALUE);
        if (c == '<')
            return fail_here(r, "attribute %s: '<' in a value (write &lt;)", attr);
        if (c == '&') {
            int w = 0;
            plait_result_t st = read_reference(r, r->value + n, &w);
            if (st != PLAIT_SUCCESS)
                return st;
            n += (size_t)w;
            continue;
        }
        if (c == '\n')
            r->line++;
        /* XML normalises literal white space in values to spaces; a real tab
         * or newline has to be written as a character reference. */
        r->value[n++] = is_space(c) ? ' ' : c;
        r->p++;
    }
    if (n > PLAIT_XML_MAX_VALUE)
        return fail_here(r, "attribute %s: value is longer than %d characters", attr, PLAIT_XML_MAX_VALUE);
    *out = arena_strdup(r->doc, r->value, n);
    return *out ? PLAIT_SUCCESS : out_of_memory();
}

/* Reads attributes up to the end of a tag: "/>" or ">" (is_decl: "?>"). */
static plait_result_t read_attrs(struct xml_reader *r, struct plait_xml_elem *e, bool is_decl, bool *is_empty)
{
    struct plait_xml_attr attrs[PLAIT_XML_MAX_ATTRS];
    int n = 0;
    plait_result_t st;
    for (;;) {
        const char *before = r->p;
        skip_space(r);
        if (r->p >= r->end)
            return fail_here(r, "<%s> opened at line %d: tag is not closed", e->name, e->line);
        if (is_decl) {
            if (starts_with(r, "?>")) {
                r->p += 2;
                break;
            }
        } else if (*r->p == '>') {
            r->p++;
            *is_empty = false;
            break;
        } else if (starts_with(r, "/>")) {
            r->p += 2;
            *is_empty = true;
            break;
        }
        if (r->p == before)
            return fail_here(r, "<%s>: attributes must be separated by white space", e->name);
        if (n == PLAIT_XML_MAX_ATTRS)
            return fail_here(r, "<%s> has more than %d attributes", e->name, PLAIT_XML_MAX_ATTRS);
        struct plait_xml_attr *a = &attrs[n];
        a->line = r->line;
        if ((st = read_name(r, "an attribute name", &a->name)) != PLAIT_SUCCESS)
            return st;
        for (int i = 0; i < n; i++)
            if (strcmp(attrs[i].name, a->name) == 0)
                return fail_here(r, "<%s> has two attributes %s", e->name, a->name);
        skip_space(r);
        if (r->p >= r->end || *r->p != '=')
            return fail_here(r, "<%s> attribute %s has no value (expected '=')", e->name, a->name);
        r->p++;
        skip_space(r);
        if ((st = read_value(r, a->name, &a->value)) != PLAIT_SUCCESS)
            return st;
        n++;
    }
    e->nattrs = n;
    if (n > 0) {
        e->attrs = arena_alloc(r->doc, (size_t)n * sizeof(*e->attrs));
        if (e->attrs == NULL)
            return out_of_memory();
        memcpy(e->attrs, attrs, (size_t)n * sizeof(*e->attrs));
    }
    return PLAIT_SUCCESS;
}

static plait_result_t read_comment(struct xml_reader *r)
{
    int line = r->line;
    r->p += 4;
    for (; r->p + 2 < r->end; r->p++) {
        if (r->p[0] == '-' && r->p[1] == '-' && r->p[2] == '>') {
            r->p += 3;
            return PLAIT_SUCCESS;
        }
        if (*r->p == '\n')
            r->line++;
    }
    return plait_xml_fail(r->doc, line, "comment is not closed by -->");
}

static plait_result_t read_declaration(struct xml_reader *r)
{
    struct plait_xml_elem decl = {.name = "?xml", .line = r->line};
    bool unused;
    r->p += 2;
    const char *target = r->p;
    while (r->p < r->end && is_name_char(*r->p))
        r->p++;
    size_t n = (size_t)(r->p - target);
    if (n != 3 || memcmp(target, "xml", 3) != 0) {
        char q[48];
        snprintf(q, sizeof(q), "%.*s", (int)(n > 40 ? 40 : n), target);
        return plait_xml_fail(r->doc, decl.line, "processing instruction <?%s ...?> is not allowed", q);
    }
    if (r->has_decl || r->has_root)
        return plait_xml_fail(r->doc, decl.line, "<?xml ...?> may only start the document");
    r->has_decl = true;
    plait_result_t st = read_attrs(r, &decl, true, &unused);
    if (st != PLAIT_SUCCESS)
        return st;
    const char *enc = plait_xml_attr(&decl, "encoding");
    if (enc != NULL && strcasecmp(enc, "UTF-8") != 0 && strcasecmp(enc, "US-ASCII") != 0) {
        char q[48];
        plait_xml_quote(enc, q, sizeof(q));
        return plait_xml_fail(r->doc, decl.line, "encoding \"%s\" is not supported (UTF-8 only)", q);
    }
    return PLAIT_SUCCESS;
}

static plait_result_t read_start_tag(struct xml_reader *r)
{
    plait_result_t st;
    int line = r->line;
    r->p++;
    struct plait_xml_elem *e = arena_alloc(r->doc, sizeof(*e));
    if (e == NULL)
        return out_of_memory();
    memset(e, 0, sizeof(*e));
    e->line = line;
    if ((st = read_name(r, "an element name after '<'", &e->name)) != PLAIT_SUCCESS)
        return st;
    if (r->open == NULL && r->has_root)
        return plait_xml_fail(r->doc, line, "a second root element <%s> (the document has one)", e->name);
    if (r->depth >= PLAIT_XML_MAX_DEPTH)
        return plait_xml_fail(r->doc, line, "<%s> is nested deeper than %d elements", e->name, PLAIT_XML_MAX_DEPTH);
    if (r->doc->nelems >= PLAIT_XML_MAX_ELEMS)
        return plait_xml_fail(r->doc, line, "more than %d elements", PLAIT_XML_MAX_ELEMS);
    bool is_empty = false;
    if ((st = read_attrs(r, e, false, &is_empty)) != PLAIT_SUCCESS)
        return st;
    r->doc->nelems++;
    e->parent = r->open;
    if (r->open == NULL) {
        r->doc->root = e;
        r->has_root = true;
    } else if (r->open->last_child == NULL) {
        r->open->first_child = r->open->last_child = e;
    } else {
        r->open->last_child->next = e;
        r->open->last_child = e;
    }
    if (!is_empty) {
        r->open = e;
        r->depth++;
    }
    return PLAIT_SUCCESS;
}

static plait_result_t read_end_tag(struct xml_reader *r)
{
    plait_result_t st;
    const char *name;
    int line = r->line;
    r->p += 2;
    if ((st = read_name(r, "an element name after '</'", &name)) != PLAIT_SUCCESS)
        return st;
    skip_space(r);
    if (r->p >= r->end || *r->p != '>')
        return fail_here(r, "</%s> is not closed by '>'", name);
    r->p++;
    if (r->open == NULL)
        return plait_xml_fail(r->doc, line, "</%s> closes no open element", name);
    if (strcmp(name, r->open->name) != 0)
        return plait_xml_fail(r->doc, line, "</%s> closes <%s> opened at line %d", name, r->open->name,
                              r->open->line);
    r->open = r->open->parent;
    r->depth--;
    return PLAIT_SUCCESS;
}

static plait_result_t read_document(struct xml_reader *r)
{
    plait_result_t st = PLAIT_SUCCESS;
    /* A UTF-8 byte order mark is harmless; anything else before the root is checked below. */
    if (starts_with(r, "\xef\xbb\xbf"))
        r->p += 3;
    while (st == PLAIT_SUCCESS) {
        skip_space(r);
        if (r->p >= r->end)
            break;
        if (*r->p != '<') {
            char q[48];
            size_t n = 0;
            while (r->p + n < r->end && r->p[n] != '<' && n < 40)
                n++;
            char text[48];
            memcpy(text, r->p, n);
            text[n] = '\0';
            plait_xml_quote(text, q, sizeof(q));
            return fail_here(r, "text \"%s\" is not allowed (only elements, attributes and comments)", q);
        }
        if (starts_with(r, "<!--"))
            st = read_comment(r);
        else if (starts_with(r, "<!DOCTYPE"))
            return fail_here(r, "DOCTYPE is not allowed");
        else if (starts_with(r, "<![CDATA["))
            return fail_here(r, "CDATA sections are not allowed");
        else if (starts_with(r, "<!"))
            return fail_here(r, "markup declarations (<!...>) are not allowed");
        else if (starts_with(r, "<?"))
            st = read_declaration(r);
        else if (starts_with(r, "</"))
            st = read_end_tag(r);
        else
            st = read_start_tag(r);
    }
    if (st != PLAIT_SUCCESS)
        return st;
    if (r->open != NULL)
        return fail_here(r, "<%s> opened at line %d is never closed", r->open->name, r->open->line);
    if (!r->has_root)
        return fail_here(r, "no root element");
    return PLAIT_SUCCESS;
}

plait_result_t plait_xml_parse(const char *buf, size_t len, const char *name, struct plait_xml_doc **doc_out)
{
    struct plait_xml_doc *doc = calloc(1, sizeof(*doc));
    struct xml_reader *r = malloc(sizeof(*r));
    plait_result_t st;
    if (doc == NULL || r == NULL) {
        st = out_of_memory();
        goto err_free;
    }
    doc->name = name;
    if (len > PLAIT_XML_MAX_BYTES) {
        st = plait_xml_fail(doc, 1, "larger than %u bytes", PLAIT_XML_MAX_BYTES);
        goto err_free;
    }
    /* A NUL byte would end the strings the reader hands out early: refuse it
     * once here rather than in every loop. */
    const char *nul = len ? memchr(buf, '\0', len) : NULL;
    if (nul != NULL) {
        int line = 1;
        for (const char *c = buf; c < nul; c++)
            line += *c == '\n';
        st = plait_xml_fail(doc, line, "NUL byte in the text");
        goto err_free;
    }
    *r = (struct xml_reader){.doc = doc, .p = buf, .end = buf + len, .line = 1};
    st = read_document(r);
    if (st != PLAIT_SUCCESS)
        goto err_free;
    free(r);
    *doc_out = doc;
    return PLAIT_SUCCESS;

err_free:
    free(r);
    plait_xml_doc_free(doc);
    return st;
}

const struct plait_xml_attr *plait_xml_find_attr(const struct plait_xml_elem *e, const char *name)
{
    for (int i = 0; i < e->nattrs; i++)
        if (strcmp(e->attrs[i].name, name) == 0)
            return &e->attrs[i];
    return NULL;
}

const char *plait_xml_attr(const struct plait_xml_elem *e, const char *name)
{
    const struct plait_xml_attr *a = plait_xml_find_attr(e, name);
    return a ? a->value : NULL;
}

const struct plait_xml_elem *plait_xml_child(const struct plait_xml_elem *e, const char *name)
{
    for (const struct plait_xml_elem *c = e->first_child; c != NULL; c = c->next)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

/* ------------------------------------------------------------------ numbers */

bool plait_xml_parse_double(const char *s, double lo, double hi, double *out)
{
    /* strtod also takes blanks, hex floats, "inf" and "nan": allow only a plain decimal. */
    if (*s == '\0')
        return false;
    for (const char *c = s; *c; c++)
        if (!((*c >= '0' && *c <= '9') || *c == '.' || *c == 'e' || *c == 'E' || *c == '+' || *c == '-'))
            return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* ERANGE on underflow still gives a usable (tiny or zero) value; only overflow is refused. */
    if (end == s || *end != '\0' || !isfinite(v) || (errno == ERANGE && fabs(v) > 1.0) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool plait_xml_parse_hex(const char *s, uint64_t hi, uint64_t *out)
{
    const char *d = s;
    if (d[0] == '0' && (d[1] == 'x' || d[1] == 'X'))
        d += 2;
    size_t n = 0;
    for (; d[n]; n++)
        if (!((d[n] >= '0' && d[n] <= '9') || (d[n] >= 'a' && d[n] <= 'f') || (d[n] >= 'A' && d[n] <= 'F')))
            return false;
    if (n == 0)
        return false;
    while (n > 1 && *d == '0') {
        d++;
        n--;
    }
    if (n > 16)
        return false;
    uint64_t v = strtoull(d, NULL, 16);
    if (v > hi)
        return false;
    *out = v;
    return true;
}

static plait_result_t bad_attr(const struct plait_xml_doc *doc, const struct plait_xml_elem *e,
                               const struct plait_xml_attr *a, const char *why)
{
    char q[64];
    plait_xml_quote(a->value, q, sizeof(q));
    return plait_xml_fail(doc, a->line, "<%s> attribute %s=\"%s\" %s", e->name, a->name, q, why);
}

plait_result_t plait_xml_get_int(const struct plait_xml_doc *doc, const struct plait_xml_elem *e, const char *attr,
                                 long lo, long hi, long dflt, long *out)
{
    const struct plait_xml_attr *a = plait_xml_find_attr(e, attr);
    if (a == NULL) {
        *out = dflt;
        return PLAIT_SUCCESS;
    }
    if (!plait_topo_parse_long(a->value, LONG_MIN, LONG_MAX, out))
        return bad_attr(doc, e, a, "is not a number");
    if (*out < lo || *out > hi) {
        char why[96];
        snprintf(why, sizeof(why), "is out of range (%ld..%ld)", lo, hi);
        return bad_attr(doc, e, a, why);
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_xml_get_double(const struct plait_xml_doc *doc, const struct plait_xml_elem *e,
                                    const char *attr, double lo, double hi, double dflt, double *out)
{
    const struct plait_xml_attr *a = plait_xml_find_attr(e, attr);
    if (a == NULL) {
        *out = dflt;
        return PLAIT_SUCCESS;
    }
    if (!plait_xml_parse_double(a->value, -HUGE_VAL, HUGE_VAL, out))
        return bad_attr(doc, e, a, "is not a finite number");
    if (*out < lo || *out > hi) {
        char why[96];
        snprintf(why, sizeof(why), "is out of range (%g..%g)", lo, hi);
        return bad_attr(doc, e, a, why);
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_xml_get_hex(const struct plait_xml_doc *doc, const struct plait_xml_elem *e, const char *attr,
                                 uint64_t hi, uint64_t dflt, uint64_t *out)
{
    const struct plait_xml_attr *a = plait_xml_find_attr(e, attr);
    if (a == NULL) {
        *out = dflt;
        return PLAIT_SUCCESS;
    }
    if (!plait_xml_parse_hex(a->value, UINT64_MAX, out))
        return bad_attr(doc, e, a, "is not a hexadecimal number");
    if (*out > hi) {
        char why[64];
        snprintf(why, sizeof(why), "is out of range (0..0x%" PRIx64 ")", hi);
        return bad_attr(doc, e, a, why);
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_xml_get_str(const struct plait_xml_doc *doc, const struct plait_xml_elem *e, const char *attr,
                                 char *dst, size_t len)
{
    const struct plait_xml_attr *a = plait_xml_find_attr(e, attr);
    if (a == NULL)
        return PLAIT_SUCCESS;
    size_t n = strlen(a->value);
    if (n >= len) {
        char why[64];
        snprintf(why, sizeof(why), "is longer than %zu characters", len - 1);
        return bad_attr(doc, e, a, why);
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)a->value[i] < 0x20 || a->value[i] == 0x7f)
            return bad_attr(doc, e, a, "holds a control character");
    memcpy(dst, a->value, n + 1);
    return PLAIT_SUCCESS;
}

/* ------------------------------------------------------------------ plait's format */

/* One table says which attribute of which element holds which field: the
 * loader reads through it and the dumper writes through it, so that every
 * field the table names survives load(dump(g)). `spec` lists the node types
 * whose element documents the attribute (always written); `extra` the types
 * that accept it too (written only when not at its default), so that a graph
 * that sets, say, a busid on an NVSwitch node still round-trips. */
enum field_kind {
    FK_INT,        /* int, decimal */
    FK_U64,        /* uint64_t, decimal */
    FK_HEX16,      /* uint16_t, "0x%04x" */
    FK_HEX64,      /* uint64_t, "0x%016x" */
    FK_DOUBLE,     /* finite double */
    FK_STR,        /* char[size] */
    FK_BUSID,      /* "dddd:bb:dd.f" or "" */
    FK_BOOL,       /* bool as 0/1 */
    FK_PCI_KIND,   /* "switch" or "hostbridge" */
    FK_LINK_LAYER, /* plait_topo_link_layer_name() */
};

#define T(x) (1u << PLAIT_TOPO_##x)
#define FIELD(member) offsetof(struct plait_topo_node, member), sizeof(((struct plait_topo_node *)0)->member)

struct node_field {
    const char *attr;
    enum field_kind kind;
    size_t offset, size;
    double lo, hi;
    unsigned spec, extra;
};

static const struct node_field node_fields[] = {
    {"kind", FK_PCI_KIND, FIELD(pci.kind), 0, 0, T(PCI), 0},
    {"dev", FK_INT, FIELD(gpu.dev), -1, 1 << 16, T(GPU), 0},
    {"dev", FK_STR, FIELD(nic.dev), 0, 0, T(NIC), 0},
    {"netdev", FK_STR, FIELD(nic.netdev), 0, 0, T(NIC), 0},
    {"port", FK_INT, FIELD(nic.port), 0, 255, T(NIC), 0},
    {"busid", FK_BUSID, FIELD(busid), 0, 0, T(PCI) | T(GPU) | T(NIC), T(CPU) | T(NVS)},
    {"package", FK_INT, FIELD(cpu.package), -1, 4096, T(CPU), 0},
    {"cores", FK_INT, FIELD(cpu.ncores), 0, 1 << 20, T(CPU), 0},
    {"memory", FK_U64, FIELD(cpu.memory), 0, 0, T(CPU), 0},
    {"arch", FK_STR, FIELD(cpu.arch), 0, 0, T(CPU), 0},
    {"vendor", FK_STR, FIELD(cpu.vendor), 0, 0, T(CPU), 0},
    {"model", FK_STR, FIELD(cpu.model), 0, 0, T(CPU), 0},
    {"cpuset", FK_STR, FIELD(cpu.cpuset), 0, 0, T(CPU), 0},
    {"sm", FK_INT, FIELD(gpu.sm), 0, 1000, T(GPU), 0},
    {"model", FK_STR, FIELD(gpu.model), 0, 0, T(GPU), 0},
    {"uuid", FK_STR, FIELD(gpu.uuid), 0, 0, T(GPU), 0},
    {"memory", FK_U64, FIELD(gpu.memory), 0, 0, T(GPU), 0},
    {"nvlinks", FK_INT, FIELD(gpu.nvlinks), 0, 256, T(GPU), 0},
    {"nvlink_version", FK_INT, FIELD(gpu.nvlink_version), 0, 5, T(GPU), 0},
    {"speed", FK_DOUBLE, FIELD(nic.speed), 0, 1e5, T(NIC), 0},
    {"link_layer", FK_LINK_LAYER, FIELD(nic.link_layer), 0, 0, T(NIC), 0},
    {"guid", FK_HEX64, FIELD(nic.guid), 0, 0, T(NIC), 0},
    {"gdr", FK_BOOL, FIELD(nic.has_gdr), 0, 0, T(NIC), 0},
    {"virtual", FK_BOOL, FIELD(nic.is_virtual), 0, 0, T(NIC), 0},
    {"count", FK_INT, FIELD(nvs.count), 0, 4096, T(NVS), 0},
    {"gen", FK_INT, FIELD(pci.gen), 0, 6, T(PCI) | T(GPU) | T(NIC), T(CPU) | T(NVS)},
    {"width", FK_INT, FIELD(pci.width), 0, 32, T(PCI) | T(GPU) | T(NIC), T(CPU) | T(NVS)},
    /* A CPU's vendor attribute is its text vendor: its PCI ids have no attribute. */
    {"vendor", FK_HEX16, FIELD(pci.vendor), 0, 0, T(PCI), T(GPU) | T(NIC) | T(NVS)},
    {"device", FK_HEX16, FIELD(pci.device), 0, 0, T(PCI), T(GPU) | T(NIC) | T(NVS) | T(CPU)},
    {"numa", FK_INT, FIELD(numa), -1, PLAIT_TOPO_MAX_NODES - 1, T(CPU) | T(PCI) | T(GPU) | T(NIC), T(NVS)},
};

#undef FIELD
#undef T

static const struct node_field *find_field(enum plait_topo_node_type type, const char *attr)
{
    for (size_t i = 0; i < sizeof(node_fields) / sizeof(node_fields[0]); i++)
        if (((node_fields[i].spec | node_fields[i].extra) & (1u << type)) && strcmp(node_fields[i].attr, attr) == 0)
            return &node_fields[i];
    return NULL;
}

static plait_result_t set_field(const struct plait_xml_doc *doc, const struct plait_xml_elem *e,
                                const struct plait_xml_attr *a, const struct node_field *f,
                                struct plait_topo_node *n)
{
    char *dst = (char *)n + f->offset;
    switch (f->kind) {
    case FK_INT: {
        long v;
        plait_result_t st = plait_xml_get_int(doc, e, a->name, (long)f->lo, (long)f->hi, 0, &v);
        if (st == PLAIT_SUCCESS) {
            int iv = (int)v;
            memcpy(dst, &iv, sizeof(iv));
        }
        return st;
    }
    case FK_U64: {
        /* Decimal only: strtoull would also take a sign and wrap it. */
        const char *s = a->value;
        uint64_t v = 0;
        if (*s == '\0')
            return bad_attr(doc, e, a, "is not a number");
        for (; *s; s++) {
            if (*s < '0' || *s > '9')
                return bad_attr(doc, e, a, "is not a number");
            if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
                return bad_attr(doc, e, a, "is out of range (0..2^64-1)");
            v = v * 10 + (uint64_t)(*s - '0');
        }
        memcpy(dst, &v, sizeof(v));
        return PLAIT_SUCCESS;
    }
    case FK_HEX16: {
        uint64_t v;
        plait_result_t st = plait_xml_get_hex(doc, e, a->name, 0xffff, 0, &v);
        if (st == PLAIT_SUCCESS) {
            uint16_t hv = (uint16_t)v;
            memcpy(dst, &hv, sizeof(hv));
        }
        return st;
    }
    case FK_HEX64: {
        uint64_t v;
        plait_result_t st = plait_xml_get_hex(doc, e, a->name, UINT64_MAX, 0, &v);
        if (st == PLAIT_SUCCESS)
            memcpy(dst, &v, sizeof(v));
        return st;
    }
    case FK_DOUBLE: {
        double v;
        plait_result_t st = plait_xml_get_double(doc, e, a->name, f->lo, f->hi, 0, &v);
        if (st == PLAIT_SUCCESS)
            memcpy(dst, &v, sizeof(v));
        return st;
    }
    case FK_STR: return plait_xml_get_str(doc, e, a->name, dst, f->size);
    case FK_BUSID: {
        uint64_t v = a->value[0] == '\0' ? PLAIT_TOPO_NO_BUSID : plait_topo_busid_parse(a->value);
        if (a->value[0] != '\0' && v == PLAIT_TOPO_NO_BUSID)
            return bad_attr(doc, e, a, "is not a PCI address (dddd:bb:dd.f)");
        memcpy(dst, &v, sizeof(v));
        return PLAIT_SUCCESS;
    }
    case FK_BOOL: {
        if (strcmp(a->value, "0") != 0 && strcmp(a->value, "1") != 0)
            return bad_attr(doc, e, a, "is not 0 or 1");
        bool v = a->value[0] == '1';
        memcpy(dst, &v, sizeof(v));
        return PLAIT_SUCCESS;
    }
    case FK_PCI_KIND:
        if (strcmp(a->value, "switch") == 0)
            n->pci.kind = PLAIT_PCI_SWITCH;
        else if (strcmp(a->value, "hostbridge") == 0)
            n->pci.kind = PLAIT_PCI_HOST_BRIDGE;
        else
            return bad_attr(doc, e, a, "is neither switch nor hostbridge");
        return PLAIT_SUCCESS;
    case FK_LINK_LAYER:
        for (int l = PLAIT_LINK_LAYER_UNKNOWN; l <= PLAIT_LINK_LAYER_ETHERNET; l++)
            if (strcasecmp(a->value, plait_topo_link_layer_name((enum plait_topo_link_layer)l)) == 0) {
                n->nic.link_layer = (enum plait_topo_link_layer)l;
                return PLAIT_SUCCESS;
            }
        return bad_attr(doc, e, a, "is none of InfiniBand, Ethernet, unknown");
    }
    return bad_attr(doc, e, a, "has an unknown kind");
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= PLAIT_TOPO_NAME_LEN)
        return false;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '.' || *s == ':' || *s == '-'))
            return false;
    return true;
}

static int node_type_of(const char *element)
{
    for (int t = 0; t < PLAIT_TOPO_NODE_TYPES; t++)
        if (strcmp(element, plait_topo_node_type_name((enum plait_topo_node_type)t)) == 0)
            return t;
    return -1;
}

plait_result_t plait_xml_fail_last(const struct plait_xml_doc *doc, int line)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", plait_last_error_get());
    return plait_xml_fail(doc, line, "%s", msg);
}

static plait_result_t load_plait_node(const struct plait_xml_doc *doc, const struct plait_xml_elem *e,
                                      enum plait_topo_node_type type, struct plait_topo *t, int *lines)
{
    const struct plait_xml_attr *na = plait_xml_find_attr(e, "name");
    char q[64];
    if (na == NULL)
        return plait_xml_fail(doc, e->line, "<%s> has no name attribute", e->name);
    if (!name_ok(na->value))
        return bad_attr(doc, e, na, "is not 1..31 characters of [A-Za-z0-9_.:-]");
    int other = plait_topo_find(t, na->value);
    if (other >= 0) {
        plait_xml_quote(na->value, q, sizeof(q));
        return plait_xml_fail(doc, na->line, "<%s> name \"%s\" is already used by the <%s> at line %d", e->name, q,
                              plait_topo_node_type_name(t->nodes[other].type), lines[other]);
    }
    int idx = plait_topo_add_node(t, type, na->value);
    if (idx < 0)
        return plait_xml_fail_last(doc, e->line);
    lines[idx] = e->line;
    struct plait_topo_node *n = &t->nodes[idx];
    bool has_numa = false;
    for (int i = 0; i < e->nattrs; i++) {
        const struct plait_xml_attr *a = &e->attrs[i];
        if (strcmp(a->name, "name") == 0)
            continue;
        const struct node_field *f = find_field(type, a->name);
        if (f == NULL) {
            plait_xml_quote(a->name, q, sizeof(q));
            return plait_xml_fail(doc, a->line, "<%s> has no attribute %s", e->name, q);
        }
        has_numa |= strcmp(a->name, "numa") == 0;
        plait_result_t st = set_field(doc, e, a, f, n);
        if (st != PLAIT_SUCCESS)
            return st;
    }
    /* A NUMA node is its own NUMA node unless the file says otherwise. */
    if (type == PLAIT_TOPO_CPU && !has_numa)
        n->numa = n->index;
    return PLAIT_SUCCESS;
}

static plait_result_t load_plait_link(const struct plait_xml_doc *doc, const struct plait_xml_elem *e,
                                      struct plait_topo *t)
{
    static const char *const known[] = {"a", "b", "type", "lanes", "bw", "latency"};
    int end[2];
    char q[64];
    plait_result_t st;
    for (int i = 0; i < e->nattrs; i++) {
        size_t k;
        for (k = 0; k < sizeof(known) / sizeof(known[0]); k++)
            if (strcmp(e->attrs[i].name, known[k]) == 0)
                break;
        if (k == sizeof(known) / sizeof(known[0])) {
            plait_xml_quote(e->attrs[i].name, q, sizeof(q));
            return plait_xml_fail(doc, e->attrs[i].line, "<link> has no attribute %s", q);
        }
    }
    for (int k = 0; k < 2; k++) {
        const char *which = k == 0 ? "a" : "b";
        const struct plait_xml_attr *a = plait_xml_find_attr(e, which);
        if (a == NULL)
            return plait_xml_fail(doc, e->line, "<link> has no %s attribute", which);
        end[k] = plait_topo_find(t, a->value);
        if (end[k] < 0)
            return bad_attr(doc, e, a, "names no node defined before it");
    }
    const struct plait_xml_attr *ta = plait_xml_find_attr(e, "type");
    if (ta == NULL)
        return plait_xml_fail(doc, e->line, "<link> has no type attribute");
    int type = plait_topo_link_type_parse(ta->value);
    if (type < 0)
        return bad_attr(doc, e, ta, "is none of NVL, C2C, PCI, SYS, NET");
    long lanes;
    double bw, latency;
    /* Without lanes=, a PCIe link is as wide as its device's link says (0:
     * unknown) and every other link counts one. */
    long dflt_lanes = type == PLAIT_LINK_PCI ? 0 : 1;
    if ((st = plait_xml_get_int(doc, e, "lanes", 0, 1024, dflt_lanes, &lanes)) != PLAIT_SUCCESS)
        return st;
    double dflt_bw = plait_topo_link_default_bw(t, (enum plait_topo_link_type)type, end[0], end[1], (int)lanes);
    if ((st = plait_xml_get_double(doc, e, "bw", 1e-6, 1e6, dflt_bw, &bw)) != PLAIT_SUCCESS)
        return st;
    if ((st = plait_xml_get_double(doc, e, "latency", 0, 1e6, 0, &latency)) != PLAIT_SUCCESS)
        return st;
    if (plait_topo_add_link(t, end[0], end[1], (enum plait_topo_link_type)type, (int)lanes, bw, latency) !=
        PLAIT_SUCCESS)
        return plait_xml_fail_last(doc, e->line);
    return PLAIT_SUCCESS;
}

static plait_result_t load_plait(const struct plait_xml_doc *doc, struct plait_topo *t)
{
    const struct plait_xml_elem *root = doc->root;
    plait_result_t st = PLAIT_SUCCESS;
    char q[64];
    for (int i = 0; i < root->nattrs; i++) {
        const struct plait_xml_attr *a = &root->attrs[i];
        if (strcmp(a->name, "version") == 0) {
            if (strcmp(a->value, "1") != 0)
                return bad_attr(doc, root, a, "is not a version this plait reads (1)");
        } else if (strcmp(a->name, "host") == 0) {
            if ((st = plait_xml_get_str(doc, root, "host", t->host, sizeof(t->host))) != PLAIT_SUCCESS)
                return st;
        } else {
            plait_xml_quote(a->name, q, sizeof(q));
            return plait_xml_fail(doc, a->line, "<%s> has no attribute %s", root->name, q);
        }
    }
    int *lines = malloc(PLAIT_TOPO_MAX_NODES * sizeof(*lines));
    if (lines == NULL)
        return out_of_memory();
    for (const struct plait_xml_elem *e = root->first_child; e != NULL && st == PLAIT_SUCCESS; e = e->next) {
        int type = node_type_of(e->name);
        if (e->first_child != NULL) {
            st = plait_xml_fail(doc, e->first_child->line, "<%s> inside <%s>: elements do not nest in this format",
                                e->first_child->name, e->name);
        } else if (type >= 0) {
            st = load_plait_node(doc, e, (enum plait_topo_node_type)type, t, lines);
        } else if (strcmp(e->name, "link") == 0) {
            st = load_plait_link(doc, e, t);
        } else {
            plait_xml_quote(e->name, q, sizeof(q));
            st = plait_xml_fail(doc, e->line, "unknown element <%s> (expected cpu, pci, gpu, nic, nvs or link)", q);
        }
    }
    free(lines);
    return st;
}

/* ------------------------------------------------------------------ locale */

/* strtod and printf follow LC_NUMERIC: a program that called setlocale() for,
 * say, de_DE would read "1.5" as 1 and write "1,5". Each entry point switches
 * its thread to the C locale for its duration. The locale object is made once
 * and kept for the life of the process. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void) { c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

static locale_t enter_c_locale(void)
{
    pthread_once(&c_locale_once, make_c_locale);
    return c_locale != (locale_t)0 ? uselocale(c_locale) : (locale_t)0;
}

static void leave_c_locale(locale_t old)
{
    if (old != (locale_t)0)
        uselocale(old);
}

/* ------------------------------------------------------------------ loading */

static plait_result_t load_buffer(const char *buf, size_t len, const char *name, struct plait_topo **topo_out)
{
    struct plait_xml_doc *doc = NULL;
    struct plait_topo *t = NULL;
    plait_result_t st = plait_xml_parse(buf, len, name, &doc);
    if (st != PLAIT_SUCCESS)
        return st;
    if ((st = plait_topo_create(&t)) != PLAIT_SUCCESS)
        goto err_free_doc;
    if (strcmp(doc->root->name, "plait_topology") == 0) {
        snprintf(t->source, sizeof(t->source), "plait-xml");
        st = load_plait(doc, t);
    } else if (strcmp(doc->root->name, "system") == 0) {
        snprintf(t->source, sizeof(t->source), "nccl-xml");
        st = plait_topo_load_nccl(doc, t);
    } else {
        char q[64];
        plait_xml_quote(doc->root->name, q, sizeof(q));
        st = plait_xml_fail(doc, doc->root->line, "root element <%s> is neither <plait_topology> nor <system> (NCCL)",
                            q);
    }
    if (st != PLAIT_SUCCESS)
        goto err_free_topo;
    if ((st = plait_topo_validate(t)) != PLAIT_SUCCESS) {
        plait_error_context(st, "%s", name);
        goto err_free_topo;
    }
    plait_xml_doc_free(doc);
    *topo_out = t;
    return PLAIT_SUCCESS;

err_free_topo:
    plait_topo_free(t);
err_free_doc:
    plait_xml_doc_free(doc);
    return st;
}

plait_result_t plait_topo_load_xml_buffer(const char *buf, size_t len, const char *name, struct plait_topo **topo_out)
{
    if (topo_out == NULL || (buf == NULL && len > 0))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_load_xml_buffer: %s is NULL",
                           topo_out == NULL ? "topo_out" : "buf");
    if (buf == NULL)
        buf = "";
    locale_t old = enter_c_locale();
    plait_result_t st = load_buffer(buf, len, name ? name : "<buffer>", topo_out);
    leave_c_locale(old);
    return st;
}

plait_result_t plait_topo_load_xml(const char *path, struct plait_topo **topo_out)
{
    if (path == NULL || topo_out == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_load_xml: %s is NULL",
                           path == NULL ? "path" : "topo_out");
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_topo_load_xml: cannot open %s: %s", path, strerror(errno));
    plait_result_t st;
    size_t len = 0, cap = 0;
    char *buf = NULL;
    for (;;) {
        if (len == cap) {
            /* One byte past the limit is enough to know the file is too large. */
            if (cap > PLAIT_XML_MAX_BYTES) {
                st = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: larger than %u bytes", path, PLAIT_XML_MAX_BYTES);
                goto err_free;
            }
            size_t ncap = cap ? 2 * cap : 1 << 16;
            if (ncap > PLAIT_XML_MAX_BYTES + 1)
                ncap = PLAIT_XML_MAX_BYTES + 1;
            char *nbuf = realloc(buf, ncap);
            if (nbuf == NULL) {
                st = out_of_memory();
                goto err_free;
            }
            buf = nbuf;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        st = plait_error(PLAIT_ERR_SYSTEM, "plait_topo_load_xml: cannot read %s: %s", path, strerror(errno));
        goto err_free;
    }
    fclose(f);
    f = NULL;
    st = plait_topo_load_xml_buffer(buf, len, path, topo_out);
err_free:
    if (f != NULL)
        fclose(f);
    free(buf);
    return st;
}

/* ------------------------------------------------------------------ dumping */

struct sbuf {
    char *s;
    size_t len, cap;
    bool is_oom;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
    if (b->is_oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (ns == NULL) {
            b->is_oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        b->is_oom = true; /* every caller formats short numbers; a longer text is a bug */
        return;
    }
    sb_add(b, tmp, (size_t)n);
}

static void sb_escaped(struct sbuf *b, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': sb_add(b, "&amp;", 5); break;
        case '<': sb_add(b, "&lt;", 4); break;
        case '>': sb_add(b, "&gt;", 4); break;
        case '"': sb_add(b, "&quot;", 6); break;
        case '\'': sb_add(b, "&apos;", 6); break;
        default:
            if ((unsigned char)*s < 0x20)
                sb_printf(b, "&#%d;", *s); /* validation refuses these; kept exact anyway */
            else
                sb_add(b, s, 1);
        }
    }
}

/* The shortest %g form that reads back as exactly v, starting from enough
 * digits for the integer part so that 400 reads "400", not "4e+02". */
static void format_double(double v, char *buf, size_t len)
{
    int digits = 1;
    for (double p = 10; digits < 17 && fabs(v) >= p; p *= 10)
        digits++;
    for (int prec = digits; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

static void sb_attr_str(struct sbuf *b, const char *name, const char *value)
{
    sb_printf(b, " %s=\"", name);
    sb_escaped(b, value);
    sb_add(b, "\"", 1);
}

static void dump_field(struct sbuf *b, const struct node_field *f, const struct plait_topo_node *n)
{
    const char *src = (const char *)n + f->offset;
    char num[64];
    switch (f->kind) {
    case FK_INT: {
        int v;
        memcpy(&v, src, sizeof(v));
        snprintf(num, sizeof(num), "%d", v);
        break;
    }
    case FK_U64: {
        uint64_t v;
        memcpy(&v, src, sizeof(v));
        snprintf(num, sizeof(num), "%" PRIu64, v);
        break;
    }
    case FK_HEX16: {
        uint16_t v;
        memcpy(&v, src, sizeof(v));
        snprintf(num, sizeof(num), "0x%04x", (unsigned)v);
        break;
    }
    case FK_HEX64: {
        uint64_t v;
        memcpy(&v, src, sizeof(v));
        snprintf(num, sizeof(num), "0x%016" PRIx64, v);
        break;
    }
    case FK_DOUBLE: {
        double v;
        memcpy(&v, src, sizeof(v));
        format_double(v, num, sizeof(num));
        break;
    }
    case FK_STR: sb_attr_str(b, f->attr, src); return;
    case FK_BUSID: {
        uint64_t v;
        memcpy(&v, src, sizeof(v));
        plait_topo_busid_format(v, num, sizeof(num));
        break;
    }
    case FK_BOOL: {
        bool v;
        memcpy(&v, src, sizeof(v));
        snprintf(num, sizeof(num), "%d", v ? 1 : 0);
        break;
    }
    case FK_PCI_KIND:
        snprintf(num, sizeof(num), "%s", n->pci.kind == PLAIT_PCI_HOST_BRIDGE ? "hostbridge" : "switch");
        break;
    case FK_LINK_LAYER: snprintf(num, sizeof(num), "%s", plait_topo_link_layer_name(n->nic.link_layer)); break;
    }
    sb_attr_str(b, f->attr, num);
}

static plait_result_t dump_buffer(const struct plait_topo *topo, char **xml_out)
{
    struct plait_topo *defaults = NULL;
    struct sbuf b = {0};
    plait_result_t st = plait_topo_validate(topo);
    if (st != PLAIT_SUCCESS)
        return plait_error_context(st, "plait_topo_dump_xml");
    /* One node of each type as plait_topo_add_node makes it: the defaults
     * an `extra` field is compared with. */
    if ((st = plait_topo_create(&defaults)) != PLAIT_SUCCESS)
        return st;
    for (int type = 0; type < PLAIT_TOPO_NODE_TYPES; type++)
        if (plait_topo_add_node(defaults, (enum plait_topo_node_type)type, NULL) != type) {
            st = plait_error_context(PLAIT_ERR_SYSTEM, "plait_topo_dump_xml");
            goto err_free_defaults;
        }

    sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    sb_add(&b, "<plait_topology version=\"1\"", 27);
    sb_attr_str(&b, "host", topo->host);
    sb_add(&b, ">\n", 2);
    for (int i = 0; i < topo->nnodes; i++) {
        const struct plait_topo_node *n = &topo->nodes[i];
        const struct plait_topo_node *d = &defaults->nodes[n->type];
        sb_printf(&b, "  <%s", plait_topo_node_type_name(n->type));
        sb_attr_str(&b, "name", n->name);
        for (size_t k = 0; k < sizeof(node_fields) / sizeof(node_fields[0]); k++) {
            const struct node_field *f = &node_fields[k];
            bool is_spec = f->spec & (1u << n->type);
            bool is_set = memcmp((const char *)n + f->offset, (const char *)d + f->offset, f->size) != 0;
            if (is_spec || ((f->extra & (1u << n->type)) && is_set))
                dump_field(&b, f, n);
        }
        sb_add(&b, "/>\n", 3);
    }
    for (int i = 0; i < topo->nlinks; i++) {
        const struct plait_topo_link *l = &topo->links[i];
        char bw[32], lat[32];
        format_double(l->bw, bw, sizeof(bw));
        format_double(l->latency, lat, sizeof(lat));
        sb_add(&b, "  <link", 7);
        sb_attr_str(&b, "a", topo->nodes[l->a].name);
        sb_attr_str(&b, "b", topo->nodes[l->b].name);
        sb_printf(&b, " type=\"%s\" lanes=\"%d\" bw=\"%s\" latency=\"%s\"/>\n", plait_topo_link_type_name(l->type),
                  l->lanes, bw, lat);
    }
    sb_add(&b, "</plait_topology>\n", 18);
    if (b.is_oom) {
        st = plait_error(PLAIT_ERR_SYSTEM, "plait_topo_dump_xml: out of memory");
        goto err_free_buf;
    }
    plait_topo_free(defaults);
    *xml_out = b.s;
    return PLAIT_SUCCESS;

err_free_buf:
    free(b.s);
err_free_defaults:
    plait_topo_free(defaults);
    return st;
}

plait_result_t plait_topo_dump_xml_buffer(const struct plait_topo *topo, char **xml_out)
{
    if (topo == NULL || xml_out == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_dump_xml_buffer: %s is NULL",
                           topo == NULL ? "topo" : "xml_out");
    locale_t old = enter_c_locale();
    plait_result_t st = dump_buffer(topo, xml_out);
    leave_c_locale(old);
    return st;
}

plait_result_t plait_topo_dump_xml(const struct plait_topo *topo, const char *path)
{
    char *xml = NULL;
    if (path == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_dump_xml: path is NULL");
    plait_result_t st = plait_topo_dump_xml_buffer(topo, &xml);
    if (st != PLAIT_SUCCESS)
        return st;
    char why[PATH_MAX + 256];
    if (plait_file_write(path, xml, strlen(xml), why, sizeof(why)) != 0)
        st = plait_error(PLAIT_ERR_SYSTEM, "plait_topo_dump_xml: %s", why);
    free(xml);
    return st;
}

/* ------------------------------------------------------------------ comparison */

static bool differ(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool differ(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (len > 0)
        vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return false;
}

bool plait_topo_xml_equal(const struct plait_topo *a, const struct plait_topo *b, char *why, size_t len)
{
    if (strcmp(a->host, b->host) != 0)
        return differ(why, len, "host \"%s\" vs \"%s\"", a->host, b->host);
    if (a->nnodes != b->nnodes || a->nlinks != b->nlinks)
        return differ(why, len, "%d nodes, %d links vs %d nodes, %d links", a->nnodes, a->nlinks, b->nnodes,
                      b->nlinks);
    for (int t = 0; t < PLAIT_TOPO_NODE_TYPES; t++)
        if (a->counts[t] != b->counts[t])
            return differ(why, len, "%d vs %d %s nodes", a->counts[t], b->counts[t],
                          plait_topo_node_type_name((enum plait_topo_node_type)t));
    for (int i = 0; i < a->nnodes; i++) {
        const struct plait_topo_node *x = &a->nodes[i], *y = &b->nodes[i];
#define SAME(f) ((x->f) == (y->f))
#define SAME_STR(f) (strcmp(x->f, y->f) == 0)
        const char *what = !SAME(type)                  ? "type"
                           : !SAME_STR(name)            ? "name"
                           : !SAME(index)               ? "index"
                           : !SAME(busid)               ? "busid"
                           : !SAME(numa)                ? "numa"
                           : !SAME(cpu.package)         ? "cpu.package"
                           : !SAME(cpu.ncores)          ? "cpu.ncores"
                           : !SAME(cpu.memory)          ? "cpu.memory"
                           : !SAME_STR(cpu.arch)        ? "cpu.arch"
                           : !SAME_STR(cpu.vendor)      ? "cpu.vendor"
                           : !SAME_STR(cpu.model)       ? "cpu.model"
                           : !SAME_STR(cpu.cpuset)      ? "cpu.cpuset"
                           : !SAME(pci.kind)            ? "pci.kind"
                           : !SAME(pci.gen)             ? "pci.gen"
                           : !SAME(pci.width)           ? "pci.width"
                           : !SAME(pci.vendor)          ? "pci.vendor"
                           : !SAME(pci.device)          ? "pci.device"
                           : !SAME(gpu.dev)             ? "gpu.dev"
                           : !SAME(gpu.sm)              ? "gpu.sm"
                           : !SAME_STR(gpu.model)       ? "gpu.model"
                           : !SAME_STR(gpu.uuid)        ? "gpu.uuid"
                           : !SAME(gpu.memory)          ? "gpu.memory"
                           : !SAME(gpu.nvlinks)         ? "gpu.nvlinks"
                           : !SAME(gpu.nvlink_version)  ? "gpu.nvlink_version"
                           : !SAME_STR(nic.dev)         ? "nic.dev"
                           : !SAME_STR(nic.netdev)      ? "nic.netdev"
                           : !SAME(nic.port)            ? "nic.port"
                           : !SAME(nic.speed)           ? "nic.speed"
                           : !SAME(nic.link_layer)      ? "nic.link_layer"
                           : !SAME(nic.guid)            ? "nic.guid"
                           : !SAME(nic.has_gdr)         ? "nic.has_gdr"
                           : !SAME(nic.is_virtual)      ? "nic.is_virtual"
                           : !SAME(nvs.count)           ? "nvs.count"
                                                        : NULL;
#undef SAME
#undef SAME_STR
        if (what != NULL)
            return differ(why, len, "node %d (%s): %s differs", i, x->name, what);
    }
    for (int i = 0; i < a->nlinks; i++) {
        const struct plait_topo_link *x = &a->links[i], *y = &b->links[i];
        if (x->a != y->a || x->b != y->b || x->type != y->type || x->lanes != y->lanes || x->bw != y->bw ||
            x->latency != y->latency)
            return differ(why, len,
                          "link %d: %d-%d %s lanes %d bw %.17g lat %.17g vs %d-%d %s lanes %d bw %.17g lat %.17g", i,
                          x->a, x->b, plait_topo_link_type_name(x->type), x->lanes, x->bw, x->latency, y->a, y->b,
                          plait_topo_link_type_name(y->type), y->lanes, y->bw, y->latency);
    }
    return true;
}
