/* libFuzzer target for srv_request_reason (the body of POST
 * /v1/admin/{pause,resume,stop}).
 *
 * Each input is used twice:
 *   1. as the request body itself. A refused body must leave the request
 *      all zeros, a non-empty printable ASCII message and STRATA_EPROTO or
 *      STRATA_ETOOBIG. An accepted one must hold a reason that follows the
 *      rule (checked here on decoded code points, independently of the
 *      byte-level check of the parser), match what jansson finds in the
 *      body, and come back identical after being written as JSON and
 *      parsed again.
 *   2. when it is valid UTF-8, as the raw value of {"reason": <input>}
 *      written by jansson: accepted exactly when the value follows the rule
 *      (at most 200 bytes; no code point below U+0020, none from U+007F to
 *      U+009F), and then given back byte for byte.
 * Anything else aborts. */
#include "request.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond)
{
    if (!cond)
        abort();
}

static int printable_ascii(const char *s)
{
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e)
            return 0;
    return 1;
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *u = p;
    for (size_t i = 0; i < n; i++)
        if (u[i] != 0)
            return 0;
    return 1;
}

/* The rule on s[0, n), valid UTF-8, decoded to code points. */
static int reason_ok(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n > SRV_REASON_MAX)
        return 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = u[i] < 0x80 ? 1 : u[i] < 0xe0 ? 2 : u[i] < 0xf0 ? 3 : 4;
        check(i + k <= n);
        cp = k == 1 ? u[i] : (uint32_t)(u[i] & (0xff >> (k + 1)));
        for (size_t j = 1; j < k; j++)
            cp = (cp << 6) | (u[i + j] & 0x3f);
        if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f))
            return 0;
        i += k;
    }
    return 1;
}

static void as_body(const uint8_t *data, size_t size)
{
    srv_reason_req r;
    strata_diag diag;
    memset(&r, 0x5a, sizeof(r));
    diag.msg[0] = '\0';
    int rc = srv_request_reason(data, size, NULL, &r, &diag);
    if (rc < 0) {
        check(rc == STRATA_EPROTO || rc == STRATA_ETOOBIG);
        check(all_zero(&r, sizeof(r)));
        check(diag.msg[0] != '\0' && printable_ascii(diag.msg));
        return;
    }
    check(rc == STRATA_OK && (r.has_reason == 0 || r.has_reason == 1));
    size_t n = strnlen(r.reason, sizeof(r.reason));
    check(n <= SRV_REASON_MAX && reason_ok(r.reason, n));
    check(r.has_reason || n == 0);
    check(all_zero(r.reason + n, sizeof(r.reason) - n));

    /* jansson sees the same key and string. */
    if (size > 0) {
        json_t *ref = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
        check(ref != NULL && json_is_object(ref));
        check(json_object_size(ref) == (size_t)r.has_reason);
        if (r.has_reason)
            check(strcmp(json_string_value(json_object_get(ref, "reason")), r.reason) == 0);
        json_decref(ref);
    }

    /* Written back as JSON, it parses to the same request. */
    json_t *o = r.has_reason ? json_pack("{s:s}", "reason", r.reason) : json_object();
    check(o != NULL);
    char *body = json_dumps(o, JSON_COMPACT);
    check(body != NULL);
    srv_reason_req again;
    check(srv_request_reason((const uint8_t *)body, strlen(body), NULL, &again, NULL) == STRATA_OK);
    check(memcmp(&again, &r, sizeof(r)) == 0);
    free(body);
    json_decref(o);
}

static void as_value(const uint8_t *data, size_t size)
{
    json_t *v = json_stringn((const char *)data, size);
    if (v == NULL) /* not UTF-8 */
        return;
    json_t *o = json_object();
    check(o != NULL && json_object_set_new(o, "reason", v) == 0);
    char *body = json_dumps(o, JSON_COMPACT | (size % 2 ? JSON_ENSURE_ASCII : 0));
    check(body != NULL);
    int ok = memchr(data, '\0', size) == NULL && reason_ok((const char *)data, size);
    srv_reason_req r;
    int rc = srv_request_reason((const uint8_t *)body, strlen(body), NULL, &r, NULL);
    check((rc == STRATA_OK) == ok);
    if (rc == STRATA_OK)
        check(r.has_reason && strlen(r.reason) == size && memcmp(r.reason, data, size) == 0);
    else
        check(rc == STRATA_EPROTO && all_zero(&r, sizeof(r)));
    free(body);
    json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    as_body(data, size);
    as_value(data, size);
    return 0;
}
