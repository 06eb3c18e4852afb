/* The environment variables plait reads, and the parser of their values.
 *
 * Every variable plait reads is listed in one table (env.c) with its default and
 * meaning; plait-info prints it and docs/env.md mirrors it. Where NCCL has the
 * same knob, its NCCL_ name is read too and the PLAIT_ name wins. */
#ifndef PLAIT_ENV_H
#define PLAIT_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "plait.h"

struct plait_env_var {
    const char *name;      /* PLAIT_... */
    const char *nccl_name; /* NCCL_... twin or NULL */
    const char *deflt;     /* default as text, "" if none */
    const char *doc;
};

extern const struct plait_env_var plait_env_table[];
extern const size_t plait_env_table_len;

/* getenv of the PLAIT_ name, else its NCCL_ twin from the table. */
const char *plait_env_get(const char *plait_name);

/* The variables whose values are numbers, with the form and range each
 * accepts: the one description that the parser below applies, plait-info
 * prints and docs/env.md mirrors ("Numeric values"), and tests/test_env.c
 * checks form by form. Every numeric variable plait reads is read through
 * plait_env_number. */
enum plait_env_form {
    PLAIT_ENV_INTEGER = 0, /* decimal digits: "16" */
    PLAIT_ENV_BYTES = 1,   /* decimal digits with an optional K, M or G suffix (x1024^n, either case): "512K" */
    PLAIT_ENV_SECONDS = 2, /* decimal digits with an optional fraction: "120", "0.5" */
};

struct plait_env_number {
    const char *name;
    enum plait_env_form form;
    int has_auto;          /* "auto" (any case) is accepted too: PLAIT_ENV_AUTO */
    double lo, hi;         /* inclusive */
};

extern const struct plait_env_number plait_env_numbers[];
extern const size_t plait_env_numbers_len;

/* What plait_env_number gives for "auto". */
#define PLAIT_ENV_AUTO (-1.0)

/* The one parser of numeric variables: reads `name` (a plait_env_numbers
 * entry; its NCCL_ twin when the PLAIT_ name is unset) and checks it against
 * its form and range. Hexadecimal, exponents, signs, blanks, other suffixes
 * and anything out of range are refused; except that a value read from an
 * NCCL_ spelling (NCCL_BUFFSIZE, NCCL_SHM_DISABLE) of an integer or a size
 * may also be 0x/0X and hexadecimal digits, as NCCL's strtoll(..., 0) reads
 * it. Unset or empty: the table's default
 * (plait_env_table), and *is_set_out = 0 (the value is left alone when that
 * default is empty). Returns PLAIT_ERR_INVALID_ARGUMENT naming the variable
 * read, its value and what it accepts; PLAIT_ERR_INTERNAL for a name not in
 * the table. is_set_out may be NULL. Thread-safe. */
plait_result_t plait_env_number(const char *name, double *value_out, int *is_set_out);

/* The same check on a given text (the variable's own value or a test's),
 * as read from an NCCL_ spelling when is_nccl_spelling (hexadecimal allowed,
 * above): 0 and *value_out, or -1 with the reason in why ("is not ..."). */
int plait_env_number_parse(const struct plait_env_number *spec, const char *text, bool is_nccl_spelling,
                           double *value_out, char *why, size_t why_len);

/* The plait_env_numbers entry of `name`, or NULL when it is not numeric. */
const struct plait_env_number *plait_env_number_find(const char *name);

/* "1..32", "4096..1G", "auto or 0..1": the accepted range as text. */
void plait_env_number_range(const struct plait_env_number *spec, char *buf, size_t len);

#endif
