/* Option tables: one array of descriptors drives an executable's command
 * line (--kebab-case) and, where it has one, its JSON configuration file
 * (the same keys in snake_case).
 *
 * A descriptor names a field of the caller's options struct by its offset:
 *
 *   typedef struct { char *data; long rounds; double lr; int json; } my_opts;
 *   static const strata_opt OPTS[] = {
 *       {"data", STRATA_OPT_STRING, offsetof(my_opts, data), 0, 0, "DIR", "data set"},
 *       {"rounds", STRATA_OPT_INTEGER, offsetof(my_opts, rounds), 1, 1000, "N", "rounds"},
 *       {"lr", STRATA_OPT_DOUBLE, offsetof(my_opts, lr), 0, 1e6, "X", "learning rate"},
 *       {"json", STRATA_OPT_FLAG, offsetof(my_opts, json), 0, 0, NULL, "JSON output"},
 *   };
 *
 * The field types are fixed by the kind: char * (STRING: NULL or a malloc'ed
 * string the struct owns; set defaults with strdup), long (INTEGER), double
 * (DOUBLE), int (FLAG: 0 or 1). Numbers must lie in [min, max]; a DOUBLE
 * whose min is DBL_TRUE_MIN must be above 0 (and is refused as such). The
 * functions keep no state and are thread-safe on distinct structs; the table
 * is borrowed. Error messages name the option (`--rounds: "x" is not an
 * integer`, `lr: 2e+09 is above the maximum 1e+06`) and quote input text as
 * printable ASCII, so they are safe to log. */
#ifndef STRATA_OPTS_H
#define STRATA_OPTS_H

#include "strata/buf.h"
#include "strata/error.h"

#include <stddef.h>

typedef enum {
    STRATA_OPT_STRING = 0,  /* char *, a malloc'ed copy */
    STRATA_OPT_INTEGER = 1, /* long, base 10, in [min, max] */
    STRATA_OPT_DOUBLE = 2,  /* double, finite, in [min, max] */
    STRATA_OPT_FLAG = 3     /* int; no value on the command line, a boolean in JSON */
} strata_opt_kind;

typedef struct strata_opt {
    const char *key;      /* snake_case; the command line spells it --kebab-case */
    strata_opt_kind kind; /* the field's type, see above */
    size_t offset;        /* offsetof the field in the caller's struct */
    double min, max;      /* INTEGER and DOUBLE: the inclusive range; min DBL_TRUE_MIN: above 0 */
    const char *value;    /* the value's placeholder in the usage text ("N"); NULL for a flag */
    const char *help;     /* one line of help; '\n' starts a continuation line */
} strata_opt;

/* The largest JSON document strata_opts_apply_json reads. */
#define STRATA_OPTS_JSON_MAX (1u << 20)

/* Parses the command line argv[1 .. argc) into dst: `--key value` and
 * `--key=value` for strings and numbers, `--key` alone for flags, with the
 * table's keys written in kebab-case (--min-clients for min_clients). A
 * repeated option overrides the earlier one: the last one wins. `--help` or
 * `-h` sets *help to 1 (0 on entry) and stops there (returning argc).
 * Parsing stops at the first argument that does not start with "--"
 * (positional), or after a lone "--"; the return value is the index of the
 * first positional argument, argc when there is none, so a caller that
 * takes none refuses `rc != argc`. Errors: STRATA_EINVAL for an unknown
 * option, a missing value, a value given to a flag, a value that is not a
 * number or out of range (diag names the option); STRATA_ENOMEM. On error
 * dst holds the values parsed so far (strata_opts_cleanup frees them). */
int strata_opts_parse_argv(const strata_opt *table, size_t n, int argc, char *const *argv,
                           void *dst, int *help, strata_diag *diag);

/* Applies one JSON object of len bytes at json (borrowed) to dst: every
 * key must be in the table with a value of its kind (a string, an integer,
 * a number, a boolean) in range, or null, which leaves the option as it
 * was (its default, unless an earlier document set it). Strict: unknown
 * keys, wrong types, values out of range, duplicate keys, invalid JSON and
 * documents above STRATA_OPTS_JSON_MAX bytes are errors (STRATA_EINVAL;
 * STRATA_ETOOBIG for the size; STRATA_ENOMEM) whose message starts
 * "config: " and names the key. On error dst holds the keys applied before
 * the failing one. */
int strata_opts_apply_json(const strata_opt *table, size_t n, const char *json, size_t len,
                           void *dst, strata_diag *diag);

/* Appends the usage lines of the table to out, one option a line:
 * "  --key VALUE" padded to a column, then its help (continuation lines
 * indented to the same column). Errors: those of strata_buf_appendf. */
int strata_opts_usage(const strata_opt *table, size_t n, strata_buf *out);

/* Writes key (snake_case) as the command line spells it, "--kebab-case",
 * to dst: at most size - 1 characters and a NUL (size > 0). */
void strata_opt_flag(const char *key, char *dst, size_t size);

/* Frees the STRING fields of dst the table names and sets them to NULL. */
void strata_opts_cleanup(const strata_opt *table, size_t n, void *dst);

#endif
