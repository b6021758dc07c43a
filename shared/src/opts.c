/* Option tables (see strata/opts.h): the command-line parser, the JSON
 * configuration reader and the usage renderer over one descriptor array. */
#include "strata/opts.h"

#include "json_strict.h"
#include "strata/parse.h"

#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nesting a configuration object may reach: scalars only, but a nested
 * value should be refused by its type, with the key named. */
#define OPTS_JSON_DEPTH 8

/* The column where usage help starts. */
#define USAGE_COLUMN 28

static void *field(void *dst, const strata_opt *o)
{
    return (char *)dst + o->offset;
}

/* The descriptor whose key equals the len bytes at name, where '-' in name
 * also matches '_' in the key when kebab is set. */
static const strata_opt *find(const strata_opt *table, size_t n, const char *name, size_t len,
                              int kebab)
{
    for (size_t i = 0; i < n; i++) {
        const char *k = table[i].key;
        if (strlen(k) != len)
            continue;
        size_t j = 0;
        while (j < len && (k[j] == name[j] || (kebab && k[j] == '_' && name[j] == '-')))
            j++;
        if (j == len)
            return &table[i];
    }
    return NULL;
}

void strata_opt_flag(const char *key, char *dst, size_t size)
{
    snprintf(dst, size, "--%s", key);
    for (char *p = dst; *p != '\0'; p++)
        if (*p == '_')
            *p = '-';
}

/* Writes the option's name as it is spelt in messages: "--min-clients" on
 * the command line, "min_clients" in JSON. */
static void opt_name(const strata_opt *o, int argv_form, char *dst, size_t size)
{
    if (argv_form)
        strata_opt_flag(o->key, dst, size);
    else
        snprintf(dst, size, "%s", o->key);
}

static int set_string(void *dst, const strata_opt *o, const char *v)
{
    char *s = strdup(v);
    if (s == NULL)
        return STRATA_ENOMEM;
    char **p = field(dst, o);
    free(*p);
    *p = s;
    return STRATA_OK;
}

/* Range check shared by both sources; text is how the value was written. */
static int check_range(const strata_opt *o, double v, const char *name, const char *text,
                       strata_diag *d)
{
    if (v < o->min && o->min == DBL_TRUE_MIN)
        return strata_diag_set(d, STRATA_EINVAL, "%s: %s must be above 0", name, text);
    if (v < o->min)
        return strata_diag_set(d, STRATA_EINVAL, "%s: %s is below the minimum %g", name, text,
                               o->min);
    if (v > o->max)
        return strata_diag_set(d, STRATA_EINVAL, "%s: %s is above the maximum %g", name, text,
                               o->max);
    return STRATA_OK;
}

/* Sets a string or number option from command-line text. */
static int set_text(void *dst, const strata_opt *o, const char *v, strata_diag *d)
{
    char name[80], q[STRATA__JSON_QUOTE_SIZE];
    opt_name(o, 1, name, sizeof(name));
    strata__json_quote(v, strlen(v), q);
    if (o->kind == STRATA_OPT_STRING)
        return set_string(dst, o, v);
    if (o->kind == STRATA_OPT_INTEGER) {
        long x;
        if (strata_parse_long(v, LONG_MIN, LONG_MAX, &x) < 0)
            return strata_diag_set(d, STRATA_EINVAL, "%s: \"%s\" is not an integer", name, q);
        int rc = check_range(o, (double)x, name, q, d);
        if (rc == STRATA_OK)
            *(long *)field(dst, o) = x;
        return rc;
    }
    double x;
    if (strata_parse_double(v, -DBL_MAX, DBL_MAX, &x) < 0)
        return strata_diag_set(d, STRATA_EINVAL, "%s: \"%s\" is not a number", name, q);
    int rc = check_range(o, x, name, q, d);
    if (rc == STRATA_OK)
        *(double *)field(dst, o) = x;
    return rc;
}

int strata_opts_parse_argv(const strata_opt *table, size_t n, int argc, char *const *argv,
                           void *dst, int *help, strata_diag *d)
{
    *help = 0;
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *help = 1;
            return argc;
        }
        if (strcmp(arg, "--") == 0)
            return i + 1;
        if (strncmp(arg, "--", 2) != 0)
            return i;
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);
        const strata_opt *o = find(table, n, name, len, 1);
        if (o == NULL) {
            char q[STRATA__JSON_QUOTE_SIZE];
            strata__json_quote(arg, len + 2, q);
            return strata_diag_set(d, STRATA_EINVAL, "unknown option '%s'", q);
        }
        char oname[80];
        opt_name(o, 1, oname, sizeof(oname));
        if (o->kind == STRATA_OPT_FLAG) {
            if (eq != NULL)
                return strata_diag_set(d, STRATA_EINVAL, "%s: takes no value", oname);
            *(int *)field(dst, o) = 1;
            continue;
        }
        const char *val;
        if (eq != NULL) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc)
                return strata_diag_set(d, STRATA_EINVAL, "%s: missing value", oname);
            val = argv[++i];
        }
        int rc = set_text(dst, o, val, d);
        if (rc < 0)
            return rc;
    }
    return i;
}

/* Sets one option from a JSON value. */
static int set_json(void *dst, const strata_opt *o, const json_t *v, strata_diag *d)
{
    char text[64];
    if (json_is_null(v)) /* not set: the value before stays */
        return STRATA_OK;
    switch (o->kind) {
    case STRATA_OPT_STRING:
        if (!json_is_string(v))
            return strata_diag_set(d, STRATA_EINVAL, "config: %s: expected a string", o->key);
        return set_string(dst, o, json_string_value(v));
    case STRATA_OPT_FLAG:
        if (!json_is_boolean(v))
            return strata_diag_set(d, STRATA_EINVAL, "config: %s: expected true or false", o->key);
        *(int *)field(dst, o) = json_is_true(v);
        return STRATA_OK;
    case STRATA_OPT_INTEGER: {
        if (!json_is_integer(v))
            return strata_diag_set(d, STRATA_EINVAL, "config: %s: expected an integer", o->key);
        json_int_t x = json_integer_value(v);
        snprintf(text, sizeof(text), "%" JSON_INTEGER_FORMAT, x);
        char name[80];
        snprintf(name, sizeof(name), "config: %s", o->key);
        int rc = check_range(o, (double)x, name, text, d);
        if (rc == STRATA_OK)
            *(long *)field(dst, o) = (long)x;
        return rc;
    }
    case STRATA_OPT_DOUBLE: {
        if (!json_is_number(v))
            return strata_diag_set(d, STRATA_EINVAL, "config: %s: expected a number", o->key);
        double x = json_number_value(v);
        snprintf(text, sizeof(text), "%g", x);
        char name[80];
        snprintf(name, sizeof(name), "config: %s", o->key);
        int rc = check_range(o, x, name, text, d);
        if (rc == STRATA_OK)
            *(double *)field(dst, o) = x;
        return rc;
    }
    }
    return strata_diag_set(d, STRATA_EINVAL, "config: %s: unknown option kind", o->key);
}

int strata_opts_apply_json(const strata_opt *table, size_t n, const char *json, size_t len,
                           void *dst, strata_diag *d)
{
    json_t *root = NULL;
    int rc =
        strata__json_load(json, len, STRATA_OPTS_JSON_MAX, OPTS_JSON_DEPTH, "config", &root, d);
    if (rc < 0)
        return rc == STRATA_EPROTO ? STRATA_EINVAL : rc;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        const strata_opt *o = find(table, n, key, strlen(key), 0);
        if (o == NULL) {
            char q[STRATA__JSON_QUOTE_SIZE];
            strata__json_quote(key, strlen(key), q);
            rc = strata_diag_set(d, STRATA_EINVAL, "config: unknown key \"%s\"", q);
            goto out;
        }
        if ((rc = set_json(dst, o, v, d)) < 0)
            goto out;
    }
out:
    json_decref(root);
    return rc;
}

int strata_opts_usage(const strata_opt *table, size_t n, strata_buf *out)
{
    for (size_t i = 0; i < n; i++) {
        const strata_opt *o = &table[i];
        char name[80];
        opt_name(o, 1, name, sizeof(name));
        int w = 0, rc;
        size_t before = out->len;
        if (o->kind == STRATA_OPT_FLAG || o->value == NULL)
            rc = strata_buf_appendf(out, "  %s", name);
        else
            rc = strata_buf_appendf(out, "  %s %s", name, o->value);
        if (rc < 0)
            return rc;
        w = (int)(out->len - before);
        const char *h = o->help != NULL ? o->help : "";
        if (w + 1 > USAGE_COLUMN)
            rc = strata_buf_appendf(out, "\n%*s", USAGE_COLUMN, "");
        else
            rc = strata_buf_appendf(out, "%*s", USAGE_COLUMN - w, "");
        if (rc < 0)
            return rc;
        for (;;) {
            size_t line = strcspn(h, "\n");
            if ((rc = strata_buf_append(out, h, line)) < 0 ||
                (rc = strata_buf_append(out, "\n", 1)) < 0)
                return rc;
            if (h[line] == '\0')
                break;
            h += line + 1;
            if ((rc = strata_buf_appendf(out, "%*s", USAGE_COLUMN, "")) < 0)
                return rc;
        }
    }
    return STRATA_OK;
}

void strata_opts_cleanup(const strata_opt *table, size_t n, void *dst)
{
    for (size_t i = 0; i < n; i++)
        if (table[i].kind == STRATA_OPT_STRING) {
            char **p = field(dst, &table[i]);
            free(*p);
            *p = NULL;
        }
}
