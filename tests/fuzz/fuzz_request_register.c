/* libFuzzer target for srv_request_register (the body of POST /v1/clients)
 * and srv_secret_equal.
 *
 * Each input is used twice:
 *   1. as the request body itself. A refused body must leave the request
 *      all zeros, a non-empty printable ASCII message and STRATA_EPROTO or
 *      STRATA_ETOOBIG. An accepted one must give a request that follows
 *      every rule (secret of 1 to 256 bytes without NUL; name, when present,
 *      of at most 64 printable ASCII bytes; unused bytes zero), that holds
 *      exactly the keys and strings jansson finds in the body, and that
 *      comes back identical after being written as JSON and parsed again.
 *   2. when both halves are valid UTF-8, as the raw values of a body
 *      {"name": <first half>, "enrolment_secret": <second half>} written by
 *      jansson: the body must be accepted exactly when both values follow
 *      their rules (checked here independently), and then give them back
 *      byte for byte.
 * srv_secret_equal must agree with strcmp on every pair it is given.
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

static int printable_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
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

static void check_secret_equal(const char *a, const char *b)
{
    check(srv_secret_equal(a, b) == (strcmp(a, b) == 0));
    check(srv_secret_equal(b, a) == (strcmp(a, b) == 0));
    check(srv_secret_equal(a, a) == 1);
    check(srv_secret_equal(a, NULL) == 0 && srv_secret_equal(NULL, a) == 0);
}

/* Checks an accepted request against the rules; returns nothing. */
static void check_rules(const srv_register_req *r)
{
    size_t ns = strnlen(r->secret, sizeof(r->secret));
    size_t nn = strnlen(r->name, sizeof(r->name));
    check(r->has_secret == 1 && ns >= 1 && ns <= SRV_SECRET_MAX);
    check(r->has_name == 0 || r->has_name == 1);
    check(nn <= SRV_NAME_MAX && printable_ascii(r->name, nn));
    check(r->has_name || nn == 0);
    check(all_zero(r->secret + ns, sizeof(r->secret) - ns));
    check(all_zero(r->name + nn, sizeof(r->name) - nn));
}

/* Writes r as a JSON body and parses it again: the same request. */
static void check_round_trip(const srv_register_req *r)
{
    json_t *o = json_pack("{s:s}", "enrolment_secret", r->secret);
    check(o != NULL);
    if (r->has_name)
        check(json_object_set_new(o, "name", json_string(r->name)) == 0);
    char *body = json_dumps(o, JSON_COMPACT);
    check(body != NULL);
    srv_register_req again;
    check(srv_request_register((const uint8_t *)body, strlen(body), NULL, &again, NULL) ==
          STRATA_OK);
    check(memcmp(&again, r, sizeof(again)) == 0);
    free(body);
    json_decref(o);
}

static void as_body(const uint8_t *data, size_t size)
{
    srv_register_req r;
    strata_diag diag;
    memset(&r, 0xa5, sizeof(r));
    diag.msg[0] = '\0';
    int rc = srv_request_register(data, size, NULL, &r, &diag);
    if (rc < 0) {
        check(rc == STRATA_EPROTO || rc == STRATA_ETOOBIG);
        check(all_zero(&r, sizeof(r)));
        check(diag.msg[0] != '\0' && printable_ascii(diag.msg, strlen(diag.msg)));
        return;
    }
    check(rc == STRATA_OK);
    check_rules(&r);

    /* jansson sees the same keys and strings. */
    json_t *ref = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    check(ref != NULL && json_is_object(ref));
    check(json_object_size(ref) == (size_t)(1 + r.has_name));
    const json_t *s = json_object_get(ref, "enrolment_secret");
    check(s != NULL && strcmp(json_string_value(s), r.secret) == 0);
    if (r.has_name)
        check(strcmp(json_string_value(json_object_get(ref, "name")), r.name) == 0);
    json_decref(ref);

    check_round_trip(&r);
    check_secret_equal(r.name, r.secret);
}

static void as_values(const uint8_t *data, size_t size)
{
    size_t half = size / 2;
    const char *name = (const char *)data, *secret = (const char *)data + half;
    size_t nn = half, ns = size - half;
    json_t *jn = json_stringn(name, nn), *js = json_stringn(secret, ns);
    if (jn == NULL || js == NULL) { /* not UTF-8 */
        json_decref(jn);
        json_decref(js);
        return;
    }
    json_t *o = json_object();
    check(o != NULL && json_object_set_new(o, "name", jn) == 0 &&
          json_object_set_new(o, "enrolment_secret", js) == 0);
    char *body = json_dumps(o, JSON_COMPACT | (size % 2 ? JSON_ENSURE_ASCII : 0));
    check(body != NULL);

    int name_ok = nn <= SRV_NAME_MAX && printable_ascii(name, nn);
    int secret_ok = ns >= 1 && ns <= SRV_SECRET_MAX && memchr(secret, '\0', ns) == NULL;
    srv_register_req r;
    int rc = srv_request_register((const uint8_t *)body, strlen(body), NULL, &r, NULL);
    check((rc == STRATA_OK) == (name_ok && secret_ok));
    if (rc == STRATA_OK) {
        check_rules(&r);
        check(r.has_name && strlen(r.name) == nn && memcmp(r.name, name, nn) == 0);
        check(strlen(r.secret) == ns && memcmp(r.secret, secret, ns) == 0);
    } else {
        check(rc == STRATA_EPROTO && all_zero(&r, sizeof(r)));
    }
    free(body);
    json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    as_body(data, size);
    as_values(data, size);
    return 0;
}
