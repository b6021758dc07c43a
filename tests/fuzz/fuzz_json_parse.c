/* libFuzzer target for srv_json_parse, the size- and depth-limited JSON
 * parser in front of every coordinator request.
 *
 * Each input is parsed as a request body twice, under the default limits
 * and under small ones (512 bytes, depth 3), and the outcome is compared
 * with an oracle built from jansson alone: the body must be accepted
 * exactly when it is empty, or it is at most max_bytes long, jansson parses
 * it (duplicates rejected) into an object, and the object's tree is at most
 * max_depth deep. So the depth scanner that runs before jansson must agree
 * with the real nesting on every input. An accepted body must equal
 * jansson's tree and come back equal after a compact dump and a second
 * parse; a refused one must leave *out NULL and a non-empty, printable
 * ASCII message, with STRATA_ETOOBIG exactly for an oversize body and
 * STRATA_EPROTO otherwise.
 *
 * When the input is valid UTF-8 it is also written by jansson as the string
 * value of {"s": <input>} (quotes and backslashes escaped, brackets left as
 * they are): that body is depth 1 whatever the input holds, so it must be
 * accepted whenever it fits the size limit and the input has no NUL. This
 * aims the fuzzer at the scanner's handling of strings and escapes.
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

/* Nesting depth of v: 0 for a scalar, 1 + the deepest child otherwise. */
static size_t depth_of(const json_t *v)
{
    size_t d = 0, k;
    const char *key;
    json_t *child;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, key, child)
        {
            k = depth_of(child);
            d = k > d ? k : d;
        }
        return d + 1;
    }
    if (json_is_array(v)) {
        json_array_foreach(v, k, child)
        {
            size_t c = depth_of(child);
            d = c > d ? c : d;
        }
        return d + 1;
    }
    return 0;
}

static void run(const uint8_t *data, size_t size, const srv_json_limits *lim)
{
    json_t *out = (json_t *)&out;
    strata_diag diag;
    diag.msg[0] = '\0';
    int rc = srv_json_parse(data, size, lim, &out, &diag);

    int want_ok;
    json_t *ref = NULL;
    if (size > lim->max_bytes) {
        want_ok = 0;
        check(rc == STRATA_ETOOBIG);
    } else if (size == 0) {
        want_ok = 1;
        ref = json_object();
        check(ref != NULL);
    } else {
        json_error_t je;
        ref = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
        want_ok = ref != NULL && json_is_object(ref) && depth_of(ref) <= lim->max_depth;
    }

    if (!want_ok) {
        check(rc < 0 && out == NULL && diag.msg[0] != '\0' && printable_ascii(diag.msg));
        check(size > lim->max_bytes ? rc == STRATA_ETOOBIG : rc == STRATA_EPROTO);
        json_decref(ref);
        return;
    }
    check(rc == STRATA_OK && out != NULL && json_is_object(out));
    check(json_equal(out, ref));
    check(depth_of(out) <= lim->max_depth);

    /* A compact dump of the tree parses again to the same tree. */
    char *dump = json_dumps(out, JSON_COMPACT);
    check(dump != NULL);
    size_t n = strlen(dump);
    if (n <= lim->max_bytes) {
        json_t *again = NULL;
        check(srv_json_parse((const uint8_t *)dump, n, lim, &again, NULL) == STRATA_OK);
        check(json_equal(again, out));
        json_decref(again);
    }
    free(dump);
    json_decref(ref);
    json_decref(out);
}

static void as_string_value(const uint8_t *data, size_t size, const srv_json_limits *lim)
{
    json_t *v = json_stringn((const char *)data, size);
    if (v == NULL) /* not UTF-8 */
        return;
    json_t *o = json_object();
    check(o != NULL && json_object_set_new(o, "s", v) == 0);
    char *body = json_dumps(o, JSON_COMPACT | (size % 2 ? JSON_ENSURE_ASCII : 0));
    check(body != NULL);
    size_t n = strlen(body);
    json_t *out = NULL;
    int rc = srv_json_parse((const uint8_t *)body, n, lim, &out, NULL);
    if (n > lim->max_bytes)
        check(rc == STRATA_ETOOBIG);
    else if (memchr(data, '\0', size) != NULL)
        check(rc == STRATA_EPROTO);
    else
        check(rc == STRATA_OK && json_equal(out, o));
    json_decref(out);
    free(body);
    json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    srv_json_limits def;
    srv_json_limits_init(&def);
    static const srv_json_limits small = {.max_bytes = 512, .max_depth = 3};
    run(data, size, &def);
    run(data, size, &small);
    as_string_value(data, size, &def);
    as_string_value(data, size, &small);
    return 0;
}
