/* Strict reading of untrusted JSON documents: the checks that the JSON wire
 * codecs of libstrata (strata/task.h, strata/summary.h) share, so that each
 * codec states only its fields.
 *
 * Every function here treats its input as untrusted and reports failures as
 * STRATA_EPROTO (STRATA_ETOOBIG for a size limit, STRATA_ENOMEM) with a diag
 * that names the field. Text taken from the input (keys, names) is quoted in
 * messages as printable ASCII and truncated, so that a diag is safe to log
 * and to send back in a JSON error body. Nothing here keeps state. */
#ifndef STRATA_JSON_STRICT_H
#define STRATA_JSON_STRICT_H

#include "strata/error.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Room for a quoted piece of input text (see strata__json_quote). */
#define STRATA__JSON_QUOTE_MAX 64
#define STRATA__JSON_QUOTE_SIZE (STRATA__JSON_QUOTE_MAX + 4)

/* Copies up to STRATA__JSON_QUOTE_MAX bytes of s[0, n) into dst
 * (STRATA__JSON_QUOTE_SIZE bytes) with every byte that is not printable
 * ASCII replaced by '?' and "..." appended when s was longer. */
void strata__json_quote(const char *s, size_t n, char *dst);

/* Parses len bytes at buf (borrowed) as one JSON object. The checks run
 * cheapest first: len against max_bytes (STRATA_ETOOBIG), the nesting depth
 * of objects and arrays against max_depth by a scan of the bytes (brackets in
 * strings do not count), then jansson with JSON_REJECT_DUPLICATES (duplicate
 * keys, invalid UTF-8, \u0000 in strings, numbers that overflow a double or a
 * 64-bit integer and trailing bytes are all refused), and the root must be an
 * object. what names the document in messages ("task"). On success *out is a
 * new reference; it is NULL on entry and on error. */
int strata__json_load(const char *buf, size_t len, size_t max_bytes, size_t max_depth,
                      const char *what, json_t **out, strata_diag *diag);

/* The limits of a codec's decoder (the public limits structs of the task
 * and the round summary carry the same three fields). */
typedef struct strata__json_limits {
    size_t max_bytes;      /* the document */
    size_t max_layers;     /* entries of per-layer arrays */
    size_t max_name_bytes; /* one layer name */
} strata__json_limits;

/* A wire codec's decoder: what strata__json_decode needs to know of it. */
typedef struct strata__json_codec {
    const char *what;             /* names the document in messages: "task" */
    size_t max_depth;             /* nesting the document may reach */
    strata__json_limits defaults; /* taken for each field a caller leaves 0 */
    size_t out_size;              /* bytes of the decoded struct */
    /* Reads the loaded root (borrowed) into out (zeroed); errors as above. */
    int (*get)(const json_t *root, const strata__json_limits *lim, void *out, strata_diag *diag);
    /* Releases what get left in out after it failed, and zeroes it. */
    void (*cleanup)(void *out);
} strata__json_codec;

/* Decodes one document with codec c: resets diag, zeroes out, takes each
 * limit from lim (may be NULL) or, when 0 there, from c's defaults, refuses
 * a NULL out or a NULL buf with len > 0 (STRATA_EINVAL), loads the document
 * as strata__json_load does and hands the root to c->get, then releases the
 * root. On error out is cleaned up (zeroed). Returns get's result. */
int strata__json_decode(const strata__json_codec *c, const char *buf, size_t len,
                        const strata__json_limits *lim, void *out, strata_diag *diag);

/* Frees the first n strings of names (NULL entries allowed) and the array.
 * Accepts NULL. */
void strata__json_free_names(char **names, size_t n);

/* Refuses any key of obj that is not among the n names in keys: the message
 * names the first unknown key (quoted) and where, the path of obj ("task",
 * "budgets[2]"). */
int strata__json_known_keys(const json_t *obj, const char *const *keys, size_t n, const char *where,
                            strata_diag *diag);

/* Reads the required key of obj as an integer in [min, max] into *out (0 on
 * entry). A real number (1.0) is not an integer. */
int strata__json_int(const json_t *obj, const char *key, int64_t min, int64_t max,
                     const char *where, int64_t *out, strata_diag *diag);

/* Reads the required key of obj as a number (integer or real; JSON cannot
 * carry NaN or infinity) within the range: at least lo (above lo when
 * lo_open), at most hi (below hi when hi_open). *out is 0 on entry. */
int strata__json_number(const json_t *obj, const char *key, double lo, int lo_open, double hi,
                        int hi_open, const char *where, double *out, strata_diag *diag);

/* Checks that the n bytes at s are a name: 1 to max_len bytes without
 * control characters (below 0x20, or 0x7f). Returns err (STRATA_EPROTO when
 * decoding, STRATA_EINVAL when encoding) otherwise; what names the value in
 * messages ("budgets[2].layer"). UTF-8 validity is jansson's job: it checks
 * every string it reads or writes. */
int strata__json_check_name(const char *s, size_t n, size_t max_len, int err, const char *what,
                            strata_diag *diag);

/* Checks that v (any JSON value) is a string that passes
 * strata__json_check_name; on success *out borrows the string from v. */
int strata__json_name(const json_t *v, size_t max_len, const char *what, const char **out,
                      strata_diag *diag);

/* Duplicates the NUL-terminated s into a new malloc'ed string in *out (NULL
 * on entry). Returns STRATA_ENOMEM on failure. */
int strata__json_strdup(const char *s, char **out);

/* Serialises j (borrowed) compactly with its keys in insertion order into a
 * new malloc'ed NUL-terminated string: *json_out (free with free()) and
 * *len_out (without the NUL). Returns STRATA_ENOMEM when jansson fails. */
int strata__json_dump(const json_t *j, char **json_out, size_t *len_out);

#endif
