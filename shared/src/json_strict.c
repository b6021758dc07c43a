/* Strict reading of untrusted JSON documents for the wire codecs (see
 * json_strict.h). */
#include "json_strict.h"
#include "strata/jsonscan.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

void strata_json_quote(const char *s, size_t n, size_t cap, char *dst)
{
    size_t k = n < cap ? n : cap;
    for (size_t i = 0; i < k; i++)
        dst[i] = (s[i] >= 0x20 && s[i] <= 0x7e) ? s[i] : '?';
    if (n > cap) {
        memcpy(dst + k, "...", 3);
        k += 3;
    }
    dst[k] = '\0';
}

void strata__json_quote(const char *s, size_t n, char *dst)
{
    strata_json_quote(s, n, STRATA__JSON_QUOTE_MAX, dst);
}

int strata_json_too_deep(const void *buf, size_t n, size_t max, size_t *at)
{
    const unsigned char *p = buf;
    size_t depth = 0;
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > max) {
                *at = i;
                return 1;
            }
        } else if ((c == '}' || c == ']') && depth > 0) {
            depth--;
        }
    }
    return 0;
}

int strata__json_load(const char *buf, size_t len, size_t max_bytes, size_t max_depth,
                      const char *what, json_t **out, strata_diag *diag)
{
    *out = NULL;
    if (len > max_bytes)
        return strata_diag_set(diag, STRATA_ETOOBIG, "%s: %zu bytes, above the limit of %zu", what,
                               len, max_bytes);
    size_t at = 0;
    if (strata_json_too_deep(buf, len, max_depth, &at))
        return strata_diag_set(diag, STRATA_EPROTO, "%s: nesting deeper than %zu (byte %zu)", what,
                               max_depth, at);
    json_error_t je;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        if (json_error_code(&je) == json_error_out_of_memory)
            return strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory", what);
        char text[STRATA__JSON_QUOTE_SIZE];
        strata__json_quote(je.text, strnlen(je.text, sizeof(je.text)), text);
        return strata_diag_set(diag, STRATA_EPROTO, "%s: invalid JSON at byte %d: %s", what,
                               je.position, text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return strata_diag_set(diag, STRATA_EPROTO, "%s: expected a JSON object", what);
    }
    *out = root;
    return STRATA_OK;
}

int strata__json_known_keys(const json_t *obj, const char *const *keys, size_t n, const char *where,
                            strata_diag *diag)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        (void)v;
        size_t i = 0;
        while (i < n && strcmp(key, keys[i]) != 0)
            i++;
        if (i == n) {
            char q[STRATA__JSON_QUOTE_SIZE];
            strata__json_quote(key, strlen(key), q);
            return strata_diag_set(diag, STRATA_EPROTO, "%s: unknown key \"%s\"", where, q);
        }
    }
    return STRATA_OK;
}

int strata__json_int(const json_t *obj, const char *key, int64_t min, int64_t max,
                     const char *where, int64_t *out, strata_diag *diag)
{
    *out = 0;
    const json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "%s.%s: missing", where, key);
    if (!json_is_integer(v))
        return strata_diag_set(diag, STRATA_EPROTO, "%s.%s: expected an integer", where, key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s.%s: %" PRId64 " is not in [%" PRId64 ", %" PRId64 "]", where,
                               key, (int64_t)x, min, max);
    *out = (int64_t)x;
    return STRATA_OK;
}

int strata__json_number(const json_t *obj, const char *key, double lo, int lo_open, double hi,
                        int hi_open, const char *where, double *out, strata_diag *diag)
{
    *out = 0.0;
    const json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "%s.%s: missing", where, key);
    if (!json_is_number(v))
        return strata_diag_set(diag, STRATA_EPROTO, "%s.%s: expected a number", where, key);
    double x = json_number_value(v);
    int low_ok = lo_open ? x > lo : x >= lo;
    int high_ok = hi_open ? x < hi : x <= hi;
    if (!low_ok || !high_ok)
        return strata_diag_set(diag, STRATA_EPROTO, "%s.%s: %.17g is not in %c%.17g, %.17g%c",
                               where, key, x, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    *out = x;
    return STRATA_OK;
}

int strata__json_check_name(const char *s, size_t n, size_t max_len, int err, const char *what,
                            strata_diag *diag)
{
    if (s == NULL || n == 0 || n > max_len)
        return strata_diag_set(diag, err, "%s: %zu bytes, expected 1 to %zu", what, n, max_len);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return strata_diag_set(diag, err, "%s: control character 0x%02x at byte %zu", what, c,
                                   i);
    }
    return STRATA_OK;
}

int strata__json_name(const json_t *v, size_t max_len, const char *what, const char **out,
                      strata_diag *diag)
{
    *out = NULL;
    if (!json_is_string(v))
        return strata_diag_set(diag, STRATA_EPROTO, "%s: expected a string", what);
    const char *s = json_string_value(v);
    int rc = strata__json_check_name(s, json_string_length(v), max_len, STRATA_EPROTO, what, diag);
    if (rc == 0)
        *out = s;
    return rc;
}

int strata__json_strdup(const char *s, char **out)
{
    size_t n = strlen(s);
    *out = malloc(n + 1);
    if (*out == NULL)
        return STRATA_ENOMEM;
    memcpy(*out, s, n + 1);
    return STRATA_OK;
}

int strata__json_dump(const json_t *j, char **json_out, size_t *len_out)
{
    const size_t flags = JSON_COMPACT | JSON_PRESERVE_ORDER;
    size_t n = json_dumpb(j, NULL, 0, flags);
    if (n == 0)
        return STRATA_ENOMEM;
    char *s = malloc(n + 1);
    if (s == NULL)
        return STRATA_ENOMEM;
    if (json_dumpb(j, s, n, flags) != n) {
        free(s);
        return STRATA_ENOMEM;
    }
    s[n] = '\0';
    *json_out = s;
    *len_out = n;
    return STRATA_OK;
}

int strata__json_decode(const strata__json_codec *c, const char *buf, size_t len,
                        const strata__json_limits *lim, void *out, strata_diag *diag)
{
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (out == NULL || (buf == NULL && len > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "%s decode: NULL argument", c->what);
    memset(out, 0, c->out_size);
    strata__json_limits l = c->defaults;
    if (lim != NULL) {
        l.max_bytes = lim->max_bytes ? lim->max_bytes : l.max_bytes;
        l.max_layers = lim->max_layers ? lim->max_layers : l.max_layers;
        l.max_name_bytes = lim->max_name_bytes ? lim->max_name_bytes : l.max_name_bytes;
    }
    json_t *root = NULL;
    int rc = strata__json_load(buf != NULL ? buf : "", len, l.max_bytes, c->max_depth, c->what,
                               &root, diag);
    if (rc == STRATA_OK)
        rc = c->get(root, &l, out, diag);
    json_decref(root);
    if (rc < 0)
        c->cleanup(out);
    return rc;
}

void strata__json_free_names(char **names, size_t n)
{
    for (size_t i = 0; names != NULL && i < n; i++)
        free(names[i]);
    free(names);
}
