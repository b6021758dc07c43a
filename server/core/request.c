/* The coordinator's JSON request parsing (see request.h). */
#include "request.h"

#include "strata/jsonscan.h"

#include <ctype.h>
#include <jansson.h>
#include <string.h>

/* Longest key of the client's body quoted in a diag. */
#define KEY_QUOTE_MAX 64

void srv_json_limits_init(srv_json_limits *lim)
{
    lim->max_bytes = SRV_JSON_DEFAULT_MAX_BYTES;
    lim->max_depth = SRV_JSON_DEFAULT_MAX_DEPTH;
}

int srv_json_parse(const uint8_t *body, size_t len, const srv_json_limits *lim, json_t **out,
                   strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (out == NULL || (body == NULL && len > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "srv_json_parse: NULL argument");
    srv_json_limits def;
    if (lim == NULL) {
        srv_json_limits_init(&def);
        lim = &def;
    }
    if (len > lim->max_bytes)
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "body of %zu bytes is above the JSON limit of %zu", len,
                               lim->max_bytes);
    if (len == 0) {
        *out = json_object();
        return *out != NULL ? STRATA_OK : strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    size_t at = 0;
    if (strata_json_too_deep(body, len, lim->max_depth, &at))
        return strata_diag_set(diag, STRATA_EPROTO, "body: nesting deeper than %zu (byte %zu)",
                               lim->max_depth, at);

    json_error_t je;
    json_t *root = json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        if (json_error_code(&je) == json_error_out_of_memory)
            return strata_diag_set(diag, STRATA_ENOMEM, "body: out of memory");
        char text[JSON_ERROR_TEXT_LENGTH + 4];
        strata_json_quote(je.text, strnlen(je.text, JSON_ERROR_TEXT_LENGTH - 1),
                          JSON_ERROR_TEXT_LENGTH, text);
        return strata_diag_set(diag, STRATA_EPROTO,
                               "body is not valid JSON: %s (line %d, column %d, byte %d)", text,
                               je.line, je.column, je.position);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return strata_diag_set(diag, STRATA_EPROTO, "body: expected a JSON object");
    }
    *out = root;
    return STRATA_OK;
}

/* ---- String rules ---- */

typedef enum {
    TEXT_ANY,       /* any UTF-8 (jansson validated it) */
    TEXT_ASCII,     /* printable ASCII, 0x20 to 0x7e */
    TEXT_PRINTABLE, /* UTF-8 without C0, DEL or C1 controls */
    TEXT_ID,        /* letters, digits, '-' and '_' */
} text_rule;

static int follows_rule(const char *s, size_t n, text_rule rule)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n; i++) {
        if (rule == TEXT_ASCII && (u[i] < 0x20 || u[i] > 0x7e))
            return 0;
        if (rule == TEXT_ID && !isalnum(u[i]) && u[i] != '-' && u[i] != '_')
            return 0;
        if (rule == TEXT_PRINTABLE &&
            (u[i] < 0x20 || u[i] == 0x7f ||
             (u[i] == 0xc2 && i + 1 < n && u[i + 1] >= 0x80 && u[i + 1] <= 0x9f)))
            return 0;
    }
    return 1;
}

/* Copies the string value v of key into dst (max + 1 bytes) when it is a
 * string of min to max bytes, without NUL, following rule. *has is set to 1
 * on success. what describes the rule for the message. */
static int take_string(const json_t *v, const char *key, size_t min, size_t max, text_rule rule,
                       const char *what, char *dst, int *has, strata_diag *diag)
{
    if (!json_is_string(v))
        return strata_diag_set(diag, STRATA_EPROTO, "%s: expected a string", key);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n < min || n > max || memchr(s, '\0', n) != NULL || !follows_rule(s, n, rule))
        return strata_diag_set(diag, STRATA_EPROTO, "%s: expected %zu to %zu bytes of %s", key, min,
                               max, what);
    memcpy(dst, s, n);
    dst[n] = '\0';
    *has = 1;
    return STRATA_OK;
}

/* Fails on the first key of root that is not in allowed (NULL-terminated). */
static int only_keys(json_t *root, const char *const *allowed, const char *allowed_text,
                     strata_diag *diag)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        size_t i = 0;
        while (allowed[i] != NULL && strcmp(allowed[i], key) != 0)
            i++;
        if (allowed[i] == NULL) {
            char q[KEY_QUOTE_MAX + 4];
            strata_json_quote(key, strlen(key), KEY_QUOTE_MAX, q);
            return strata_diag_set(diag, STRATA_EPROTO, "unknown key \"%s\" (allowed: %s)", q,
                                   allowed_text);
        }
    }
    return STRATA_OK;
}

/* ---- Endpoints ---- */

int srv_request_register(const uint8_t *body, size_t len, const srv_json_limits *lim,
                         srv_register_req *out, strata_diag *diag)
{
    static const char *const keys[] = {"name", "enrolment_secret", "registration_id", NULL};
    if (out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "srv_request_register: NULL argument");
    memset(out, 0, sizeof(*out));
    json_t *root = NULL;
    int rc = srv_json_parse(body, len, lim, &root, diag);
    if (rc < 0)
        goto out;
    rc = only_keys(root, keys, "name, enrolment_secret, registration_id", diag);
    if (rc < 0)
        goto out;
    const json_t *name = json_object_get(root, "name");
    if (name != NULL) {
        rc = take_string(name, "name", 0, SRV_NAME_MAX, TEXT_ASCII,
                         "printable ASCII (0x20 to 0x7e)", out->name, &out->has_name, diag);
        if (rc < 0)
            goto out;
    }
    const json_t *secret = json_object_get(root, "enrolment_secret");
    if (secret == NULL) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "enrolment_secret: missing");
        goto out;
    }
    rc = take_string(secret, "enrolment_secret", 1, SRV_SECRET_MAX, TEXT_ANY, "text", out->secret,
                     &out->has_secret, diag);
    if (rc < 0)
        goto out;
    const json_t *reg = json_object_get(root, "registration_id");
    if (reg != NULL)
        rc = take_string(reg, "registration_id", SRV_REGISTRATION_MIN, SRV_REGISTRATION_MAX,
                         TEXT_ID, "letters, digits, '-' or '_'", out->registration_id,
                         &out->has_registration_id, diag);
out:
    json_decref(root);
    if (rc < 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

int srv_request_reason(const uint8_t *body, size_t len, const srv_json_limits *lim,
                       srv_reason_req *out, strata_diag *diag)
{
    static const char *const keys[] = {"reason", NULL};
    if (out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "srv_request_reason: NULL argument");
    memset(out, 0, sizeof(*out));
    json_t *root = NULL;
    int rc = srv_json_parse(body, len, lim, &root, diag);
    if (rc < 0)
        goto out;
    rc = only_keys(root, keys, "reason", diag);
    if (rc < 0)
        goto out;
    const json_t *reason = json_object_get(root, "reason");
    if (reason != NULL)
        rc = take_string(reason, "reason", 0, SRV_REASON_MAX, TEXT_PRINTABLE,
                         "text without control characters", out->reason, &out->has_reason, diag);
out:
    json_decref(root);
    if (rc < 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

int srv_secret_equal(const char *a, const char *b)
{
    if (a == NULL || b == NULL)
        return 0;
    size_t n = strlen(b);
    if (strlen(a) != n)
        return 0;
    /* volatile keeps the compiler from stopping at the first difference. */
    volatile unsigned char diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}
