/* The small XML reader shared by topology/xml.c (plait's format) and
 * topology/nccl_xml.c (NCCL's), and the helpers both use to read attributes
 * strictly and to report "NAME:LINE: reason".
 *
 * The reader builds a tree of elements and attributes in one arena that
 * plait_xml_doc_free releases at once, so that every error path of the two
 * loaders frees everything with one call. It accepts the subset of XML that
 * topology files use (elements, attributes, the five predefined entities and
 * numeric character references, comments, one <?xml ...?> declaration) and
 * rejects the rest. Private to topology/; not thread-safe per document, but
 * documents are independent. */
#ifndef PLAIT_TOPO_XML_INTERNAL_H
#define PLAIT_TOPO_XML_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "topology/topo.h"

/* What the reader accepts; larger inputs are rejected with a message. */
#define PLAIT_XML_MAX_BYTES (64u << 20)
#define PLAIT_XML_MAX_DEPTH 64
#define PLAIT_XML_MAX_NAME 64         /* element and attribute names */
#define PLAIT_XML_MAX_VALUE 1024      /* attribute values, after entities are decoded */
#define PLAIT_XML_MAX_ATTRS 64        /* per element */
#define PLAIT_XML_MAX_ELEMS (1 << 17) /* in a document: nodes, links and NCCL's <nvlink> lines together */

struct plait_xml_attr {
    const char *name;
    const char *value;
    int line; /* of its name, for messages */
};

struct plait_xml_elem {
    const char *name;
    int line; /* of the '<' that opens it */
    int nattrs;
    struct plait_xml_attr *attrs;
    struct plait_xml_elem *parent, *first_child, *last_child, *next;
};

struct plait_xml_arena_block;

struct plait_xml_doc {
    const char *name; /* for messages; not owned */
    struct plait_xml_elem *root;
    int nelems;
    struct plait_xml_arena_block *blocks;
};

/* Parses buf[0..len) into *doc_out (freed with plait_xml_doc_free). `name`
 * names the input in messages and must outlive the document. On malformed
 * text returns PLAIT_ERR_INVALID_ARGUMENT with "NAME:LINE: reason" as the last
 * error; PLAIT_ERR_SYSTEM when out of memory. Nothing is allocated on failure. */
plait_result_t plait_xml_parse(const char *buf, size_t len, const char *name, struct plait_xml_doc **doc_out);
void plait_xml_doc_free(struct plait_xml_doc *doc);

/* Sets the last error to "NAME:LINE: reason" and returns PLAIT_ERR_INVALID_ARGUMENT. */
plait_result_t plait_xml_fail(const struct plait_xml_doc *doc, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with the last error already set (by the graph builder) as the reason. */
plait_result_t plait_xml_fail_last(const struct plait_xml_doc *doc, int line);

/* Attribute `name` of `e` (or its value), or NULL. */
const struct plait_xml_attr *plait_xml_find_attr(const struct plait_xml_elem *e, const char *name);
const char *plait_xml_attr(const struct plait_xml_elem *e, const char *name);
/* The first child of `e` named `name`, or NULL. */
const struct plait_xml_elem *plait_xml_child(const struct plait_xml_elem *e, const char *name);

/* Strict number readers: the whole text must be the number (no blanks, no
 * trailing characters), within [lo, hi]; doubles must be finite. Each fails
 * with "NAME:LINE: <elem> attribute NAME="VALUE" is not a number" or "... is
 * out of range (lo..hi)". When the attribute is absent, *out = dflt. */
plait_result_t plait_xml_get_int(const struct plait_xml_doc *doc, const struct plait_xml_elem *e, const char *attr,
                                 long lo, long hi, long dflt, long *out);
plait_result_t plait_xml_get_double(const struct plait_xml_doc *doc, const struct plait_xml_elem *e,
                                    const char *attr, double lo, double hi, double dflt, double *out);
/* Hexadecimal with or without "0x", at most `hi`. */
plait_result_t plait_xml_get_hex(const struct plait_xml_doc *doc, const struct plait_xml_elem *e, const char *attr,
                                 uint64_t hi, uint64_t dflt, uint64_t *out);
/* Copies a text attribute into dst[len], failing when it does not fit. */
plait_result_t plait_xml_get_str(const struct plait_xml_doc *doc, const struct plait_xml_elem *e, const char *attr,
                                 char *dst, size_t len);

/* The same parses on a bare string; false when malformed or out of range
 * (integers: plait_topo_parse_long). */
bool plait_xml_parse_double(const char *s, double lo, double hi, double *out);
bool plait_xml_parse_hex(const char *s, uint64_t hi, uint64_t *out);

/* Copies `s` for a message: at most 40 characters, non-printable bytes as '?'. */
void plait_xml_quote(const char *s, char *buf, size_t len);

/* NCCL's format (nccl_xml.c): builds *topo from a parsed document whose root is
 * <system>. Errors as plait_xml_fail; the caller frees topo on failure. */
plait_result_t plait_topo_load_nccl(const struct plait_xml_doc *doc, struct plait_topo *topo);

/* For tests and the fuzzer: true when a and b hold the same graph field by
 * field (every node and link attribute, host; not source). Otherwise false
 * with the first difference described in why[len]. */
bool plait_topo_xml_equal(const struct plait_topo *a, const struct plait_topo *b, char *why, size_t len);

#endif
