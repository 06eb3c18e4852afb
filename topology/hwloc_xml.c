/* hwloc XML rewritten into the form hwloc's minimal parser reads
 * (plait_disc_hwloc_xml_rewrite, discover.h), for hwloc.c.
 *
 * hwloc parses XML with libxml2 only where its plugin is installed (Debian:
 * libhwloc-plugins); otherwise, or with HWLOC_LIBXML_IMPORT=0, its minimal
 * parser reads only the layout hwloc writes: the root element right after the
 * header lines, no comment or processing instruction anywhere, tag names
 * followed by one space, attributes in double quotes with the escapes
 * &#10; &#13; &#9; &quot; &lt; &gt; &amp; only, LF line ends. This reader
 * takes well-formed XML and writes exactly that, so both parsers read the
 * same documents. It needs no hwloc, so that the fuzzer (tests/fuzz) runs it.
 * The input comes from a file: every length is checked, nothing is trusted. */
#include "topology/discover.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"


struct xml_out {
    char *buf;
    size_t len, cap;
    bool is_oom;
};

static void out_add(struct xml_out *o, const char *s, size_t n)
{
    if (o->is_oom)
        return;
    if (o->cap - o->len < n + 1) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap - o->len < n + 1)
            cap *= 2;
        char *b = realloc(o->buf, cap);
        if (b == NULL) {
            o->is_oom = true;
            return;
        }
        o->buf = b;
        o->cap = cap;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

static void out_str(struct xml_out *o, const char *s) { out_add(o, s, strlen(s)); }

struct xml_in {
    const char *p, *end;
    const char *name; /* the file, for messages */
    int line;
};

static bool xml_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
/* ASCII letters, '_' and ':', and every byte of a UTF-8 sequence (names in
 * other scripts are XML; hwloc has none, and rejects what it does not know). */
static bool xml_name_start(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == ':' || (unsigned char)c >= 0x80;
}
static bool xml_name_char(char c) { return xml_name_start(c) || (c >= '0' && c <= '9') || c == '.' || c == '-'; }

static bool in_starts(const struct xml_in *in, const char *s)
{
    size_t n = strlen(s);
    return (size_t)(in->end - in->p) >= n && memcmp(in->p, s, n) == 0;
}

static void in_skip_space(struct xml_in *in)
{
    while (in->p < in->end && xml_space(*in->p))
        in->line += *in->p++ == '\n';
}

static plait_result_t in_fail(const struct xml_in *in, int line, const char *what)
{
    return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: hwloc XML file %s:%d: %s", in->name, line, what);
}

/* Skips up to and past `close` (the construct opened at `line`). */
static plait_result_t in_skip_past(struct xml_in *in, const char *close, int line, const char *what)
{
    size_t n = strlen(close);
    for (; in->p < in->end; in->p++) {
        if ((size_t)(in->end - in->p) >= n && memcmp(in->p, close, n) == 0) {
            in->p += n;
            return PLAIT_SUCCESS;
        }
        in->line += *in->p == '\n';
    }
    return in_fail(in, line, what);
}

/* Comments and processing instructions, wherever they are; false when the
 * next thing is neither. */
static bool skip_misc(struct xml_in *in, plait_result_t *st)
{
    int line = in->line;
    if (in_starts(in, "<!--"))
        *st = in_skip_past(in, "-->", line, "comment is not closed by -->");
    else if (in_starts(in, "<?"))
        *st = in_skip_past(in, "?>", line, "processing instruction is not closed by ?>");
    else
        return false;
    return true;
}

/* <!DOCTYPE ...>, with an internal subset in [...] that may hold quoted
 * strings, comments and declarations. hwloc validates nothing against it. */
static plait_result_t skip_doctype(struct xml_in *in)
{
    int line = in->line, depth = 0;
    in->p += 9;
    while (in->p < in->end) {
        char c = *in->p;
        plait_result_t st = PLAIT_SUCCESS;
        if (depth > 0 && skip_misc(in, &st)) {
            if (st != PLAIT_SUCCESS)
                return st;
            continue;
        }
        if (c == '"' || c == '\'') {
            const char q[2] = {c, '\0'};
            in->p++;
            if ((st = in_skip_past(in, q, line, "DOCTYPE: a quoted string is not closed")) != PLAIT_SUCCESS)
                return st;
            continue;
        }
        in->line += c == '\n';
        in->p++;
        if (c == '[')
            depth++;
        else if (c == ']' && depth > 0)
            depth--;
        else if (c == '>' && depth == 0)
            return PLAIT_SUCCESS;
    }
    return in_fail(in, line, "DOCTYPE is not closed by '>'");
}

static plait_result_t copy_name(struct xml_in *in, struct xml_out *o, const char *what)
{
    const char *s = in->p;
    if (in->p >= in->end || !xml_name_start(*in->p)) {
        char msg[96];
        snprintf(msg, sizeof(msg), "expected %s", what);
        return in_fail(in, in->line, msg);
    }
    while (in->p < in->end && xml_name_char(*in->p))
        in->p++;
    out_add(o, s, (size_t)(in->p - s));
    return PLAIT_SUCCESS;
}

/* One reference at '&' in an attribute value, decoded (UTF-8) into `o`. */
static plait_result_t decode_reference(struct xml_in *in, char *dec, size_t *n_out, int line)
{
    static const struct {
        const char *name;
        char c;
    } predefined[] = {{"lt;", '<'}, {"gt;", '>'}, {"amp;", '&'}, {"quot;", '"'}, {"apos;", '\''}};
    in->p++;
    for (size_t i = 0; i < sizeof(predefined) / sizeof(predefined[0]); i++)
        if (in_starts(in, predefined[i].name)) {
            in->p += strlen(predefined[i].name);
            dec[0] = predefined[i].c;
            *n_out = 1;
            return PLAIT_SUCCESS;
        }
    if (in->p >= in->end || *in->p != '#')
        return in_fail(in, line, "unknown entity in an attribute value (write &amp; for '&')");
    in->p++;
    bool is_hex = in->p < in->end && *in->p == 'x';
    in->p += is_hex;
    unsigned long cp = 0;
    int digits = 0;
    for (; in->p < in->end && *in->p != ';'; in->p++, digits++) {
        char c = *in->p;
        int v = c >= '0' && c <= '9' ? c - '0'
                : is_hex && c >= 'a' && c <= 'f' ? c - 'a' + 10
                : is_hex && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                  : -1;
        if (v < 0 || digits > 8)
            return in_fail(in, line, "bad character reference in an attribute value");
        cp = cp * (is_hex ? 16 : 10) + (unsigned long)v;
    }
    if (in->p >= in->end || digits == 0 || cp == 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return in_fail(in, line, "bad character reference in an attribute value");
    in->p++;
    if (cp < 0x80) {
        dec[0] = (char)cp;
        *n_out = 1;
    } else if (cp < 0x800) {
        dec[0] = (char)(0xc0 | (cp >> 6));
        dec[1] = (char)(0x80 | (cp & 0x3f));
        *n_out = 2;
    } else if (cp < 0x10000) {
        dec[0] = (char)(0xe0 | (cp >> 12));
        dec[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        dec[2] = (char)(0x80 | (cp & 0x3f));
        *n_out = 3;
    } else {
        dec[0] = (char)(0xf0 | (cp >> 18));
        dec[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        dec[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        dec[3] = (char)(0x80 | (cp & 0x3f));
        *n_out = 4;
    }
    return PLAIT_SUCCESS;
}

/* A quoted value, decoded as XML does (references, literal white space as
 * spaces), written between double quotes with exactly the escapes hwloc's
 * minimal parser decodes. */
static plait_result_t copy_value(struct xml_in *in, struct xml_out *o, int line)
{
    if (in->p >= in->end || (*in->p != '"' && *in->p != '\''))
        return in_fail(in, line, "an attribute value must be in quotes");
    char quote = *in->p++;
    out_str(o, "\"");
    for (;;) {
        if (in->p >= in->end)
            return in_fail(in, line, "an attribute value is not closed");
        char c = *in->p;
        if (c == quote) {
            in->p++;
            break;
        }
        if (c == '<')
            return in_fail(in, line, "'<' in an attribute value (write &lt;)");
        char dec[4] = {c};
        size_t n = 1;
        if (c == '&') {
            plait_result_t st = decode_reference(in, dec, &n, line);
            if (st != PLAIT_SUCCESS)
                return st;
        } else {
            in->line += c == '\n';
            /* CR LF is one line end, and a line end in a value one space. */
            if (c == '\r' && in->p + 1 < in->end && in->p[1] == '\n') {
                in->p++;
                in->line++;
            }
            if (xml_space(c))
                dec[0] = ' ';
            in->p++;
        }
        for (size_t i = 0; i < n; i++) {
            switch (dec[i]) {
            case '\n': out_str(o, "&#10;"); break;
            case '\r': out_str(o, "&#13;"); break;
            case '\t': out_str(o, "&#9;"); break;
            case '"': out_str(o, "&quot;"); break;
            case '<': out_str(o, "&lt;"); break;
            case '>': out_str(o, "&gt;"); break;
            case '&': out_str(o, "&amp;"); break;
            default: out_add(o, &dec[i], 1); break;
            }
        }
    }
    out_str(o, "\"");
    return PLAIT_SUCCESS;
}

/* A start tag from its '<': the name, then each attribute after one space,
 * then ">" or "/>". *is_empty says which. */
static plait_result_t copy_start_tag(struct xml_in *in, struct xml_out *o, bool *is_empty)
{
    int line = in->line;
    plait_result_t st;
    in->p++;
    out_str(o, "<");
    if ((st = copy_name(in, o, "an element name after '<'")) != PLAIT_SUCCESS)
        return st;
    for (;;) {
        const char *before = in->p;
        in_skip_space(in);
        if (in->p >= in->end)
            return in_fail(in, line, "a tag is not closed");
        if (*in->p == '>' || in_starts(in, "/>")) {
            *is_empty = *in->p == '/';
            in->p += *is_empty ? 2 : 1;
            out_str(o, *is_empty ? "/>" : ">");
            return PLAIT_SUCCESS;
        }
        if (in->p == before)
            return in_fail(in, in->line, "attributes must be separated by white space");
        int attr_line = in->line;
        out_str(o, " ");
        if ((st = copy_name(in, o, "an attribute name")) != PLAIT_SUCCESS)
            return st;
        in_skip_space(in);
        if (in->p >= in->end || *in->p != '=')
            return in_fail(in, attr_line, "an attribute has no value (expected '=')");
        in->p++;
        in_skip_space(in);
        out_str(o, "=");
        if ((st = copy_value(in, o, attr_line)) != PLAIT_SUCCESS)
            return st;
    }
}

plait_result_t plait_disc_hwloc_xml_rewrite(const char *xml, size_t len, const char *name, char **out,
                                            size_t *out_len)
{
    struct xml_in in = {.p = xml, .end = xml + len, .name = name, .line = 1};
    struct xml_out o = {0};
    plait_result_t st = PLAIT_SUCCESS;
    int depth = 0;
    bool has_root = false;
    if (memchr(xml, '\0', len) != NULL) {
        st = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology: hwloc XML file %s holds a NUL byte", name);
        goto err_free;
    }
    if (in_starts(&in, "\xef\xbb\xbf"))
        in.p += 3;
    /* Before and after the root element: white space, the declaration,
     * comments, processing instructions and the DOCTYPE, none of which hwloc
     * needs. The rewritten document starts at its root element. */
    while (st == PLAIT_SUCCESS && in.p < in.end) {
        if (depth == 0) {
            in_skip_space(&in);
            if (in.p >= in.end || skip_misc(&in, &st))
                continue;
            if (!has_root && in_starts(&in, "<!DOCTYPE")) {
                st = skip_doctype(&in);
                continue;
            }
            if (has_root || *in.p != '<' || !(in.p + 1 < in.end && xml_name_start(in.p[1]))) {
                st = in_fail(&in, in.line, has_root ? "text or markup after the root element"
                                                    : "expected the root element (<topology ...>)");
                continue;
            }
        }
        if (skip_misc(&in, &st))
            continue;
        if (in_starts(&in, "<![CDATA[") || in_starts(&in, "<!")) {
            st = in_fail(&in, in.line, "CDATA sections and <!...> declarations are not hwloc XML");
        } else if (in_starts(&in, "</")) {
            int line = in.line;
            in.p += 2;
            out_str(&o, "</");
            if ((st = copy_name(&in, &o, "an element name after '</'")) != PLAIT_SUCCESS)
                continue;
            in_skip_space(&in);
            if (in.p >= in.end || *in.p != '>') {
                st = in_fail(&in, line, "an end tag is not closed by '>'");
                continue;
            }
            in.p++;
            out_str(&o, ">");
            depth--;
        } else if (*in.p == '<') {
            bool is_empty = false;
            if ((st = copy_start_tag(&in, &o, &is_empty)) == PLAIT_SUCCESS && !is_empty)
                depth++;
            has_root = true;
        } else {
            /* Text (white space between tags, or an element's content):
             * copied as it is, line ends as XML reads them (LF). */
            const char *s = in.p;
            while (in.p < in.end && *in.p != '<' && *in.p != '\r')
                in.line += *in.p++ == '\n';
            out_add(&o, s, (size_t)(in.p - s));
            if (in.p < in.end && *in.p == '\r') {
                in.p++;
                if (in.p < in.end && *in.p == '\n')
                    in.p++;
                in.line++;
                out_str(&o, "\n");
            }
        }
    }
    if (st == PLAIT_SUCCESS && (!has_root || depth != 0))
        st = in_fail(&in, in.line, has_root ? "the root element is not closed" : "no root element");
    if (st == PLAIT_SUCCESS && o.is_oom)
        st = plait_error(PLAIT_ERR_SYSTEM, "topology: out of memory rewriting hwloc XML file %s", name);
    if (st != PLAIT_SUCCESS)
        goto err_free;
    *out = o.buf;
    *out_len = o.len;
    return PLAIT_SUCCESS;

err_free:
    free(o.buf);
    return st;
}
