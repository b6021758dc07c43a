/* The coordinator's JSON request parsing: size and depth limits, and one
 * strict parser per JSON request body.
 *
 * Every function here is pure: it reads the bytes it is given, touches no
 * engine, socket or global state, and may be called from any thread at the
 * same time as any other. Bodies are untrusted; nothing in them is asserted
 * on.
 *
 * Errors, for every parser:
 *   STRATA_ETOOBIG  the body is longer than the limit's max_bytes;
 *   STRATA_EPROTO   the body is not acceptable: nesting deeper than the
 *                   limit's max_depth, not JSON (bad syntax, bad UTF-8,
 *                   \u0000 in a string, trailing bytes), a duplicate key,
 *                   not an object at the top, an unknown key, a value of the
 *                   wrong type, a missing required key or a value that
 *                   breaks its rule;
 *   STRATA_EINVAL   a NULL argument (a caller bug, never the body's fault);
 *   STRATA_ENOMEM   allocation failed.
 * When diag is not NULL it receives one sentence saying what was wrong,
 * naming the key where one is at fault. It is safe to send back to the
 * client and to log: it is printable ASCII, and the client text it may quote
 * (an unknown key, up to 64 bytes; the excerpt in jansson's message) has
 * every other byte replaced by '?'. Out-parameters are zeroed on entry and
 * stay zeroed on error. */
#ifndef STRATA_SERVER_REQUEST_H
#define STRATA_SERVER_REQUEST_H

#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>

/* jansson's value type, kept opaque here: only request.c and its callers' .c
 * files include <jansson.h>. */
struct json_t;

/* ---- Limits and the generic parser ---- */

/* Default largest body, in bytes, a JSON request may have. */
#define SRV_JSON_DEFAULT_MAX_BYTES 65536

/* Default deepest nesting of objects and arrays: the top-level object is
 * depth 1, an array inside it depth 2, and so on. */
#define SRV_JSON_DEFAULT_MAX_DEPTH 16

typedef struct srv_json_limits {
    size_t max_bytes; /* longest body accepted; default SRV_JSON_DEFAULT_MAX_BYTES */
    size_t max_depth; /* deepest nesting accepted; default SRV_JSON_DEFAULT_MAX_DEPTH */
} srv_json_limits;

/* Fills lim with the defaults above. */
void srv_json_limits_init(srv_json_limits *lim);

/* Parses body[0, len) (borrowed; need not be NUL-terminated; may be NULL
 * when len is 0) into a new JSON object in *out, which the caller releases
 * with json_decref. lim (borrowed) may be NULL for the defaults.
 *
 * The checks run in this order, each before any work the next one costs:
 *   1. len > max_bytes is STRATA_ETOOBIG, before any byte is read;
 *   2. the nesting depth is measured by a linear scan that skips strings
 *      (and the escapes inside them); deeper than max_depth is STRATA_EPROTO,
 *      before jansson builds anything;
 *   3. jansson parses the body with JSON_REJECT_DUPLICATES and without
 *      JSON_ALLOW_NUL: bad syntax, invalid UTF-8, "\u0000", a duplicate key
 *      or bytes after the value are STRATA_EPROTO with jansson's message and
 *      the line, column and byte offset where it stopped;
 *   4. the value must be an object (STRATA_EPROTO otherwise).
 * An empty body (len == 0) is an empty object: every endpoint that takes a
 * JSON body accepts "no body" exactly as it accepts "{}", and rejects it,
 * if it must, for a missing key. A body of only white space is not empty
 * and is STRATA_EPROTO. */
int srv_json_parse(const uint8_t *body, size_t len, const srv_json_limits *lim, struct json_t **out,
                   strata_diag *diag);

/* ---- POST /v1/clients ---- */

/* Longest client name, in bytes. */
#define SRV_NAME_MAX 64

/* Longest enrolment secret, in bytes. */
#define SRV_SECRET_MAX 256

/* Shortest and longest registration id, in bytes. */
#define SRV_REGISTRATION_MIN 16
#define SRV_REGISTRATION_MAX 64

typedef struct srv_register_req {
    char name[SRV_NAME_MAX + 1];                    /* NUL-terminated; "" when has_name is 0 */
    int has_name;                                   /* 1 when the body had "name" */
    char secret[SRV_SECRET_MAX + 1];                /* NUL-terminated */
    int has_secret;                                 /* 1 on success (the key is required) */
    char registration_id[SRV_REGISTRATION_MAX + 1]; /* "" when has_registration_id is 0 */
    int has_registration_id;
} srv_register_req;

/* Parses the body of POST /v1/clients (see srv_json_parse for the limits,
 * lim may be NULL) into *out. The body is an object with exactly these
 * keys:
 *   "name"              optional string of 0 to SRV_NAME_MAX printable ASCII
 *                       characters (0x20 to 0x7e);
 *   "enrolment_secret"  required string of 1 to SRV_SECRET_MAX bytes of any
 *                       UTF-8 text without NUL;
 *   "registration_id"   optional string of SRV_REGISTRATION_MIN to
 *                       SRV_REGISTRATION_MAX letters, digits, '-' or '_':
 *                       the client's choice, the same for every attempt
 *                       of one registration.
 * Any other key, a value that is not a string, a missing secret or a value
 * that breaks its rule is STRATA_EPROTO; the message names the key. The
 * secret is only extracted here: compare it with srv_secret_equal. Errors:
 * those listed at the top of this header; *out is all zeros on error. */
int srv_request_register(const uint8_t *body, size_t len, const srv_json_limits *lim,
                         srv_register_req *out, strata_diag *diag);

/* ---- POST /v1/admin/{pause,resume,stop} ---- */

/* Longest reason, in bytes. */
#define SRV_REASON_MAX 200

typedef struct srv_reason_req {
    char reason[SRV_REASON_MAX + 1]; /* NUL-terminated; "" when has_reason is 0 */
    int has_reason;                  /* 1 when the body had "reason" */
} srv_reason_req;

/* Parses a body that may carry a reason: an admin action's (POST
 * /v1/admin/{pause,resume,stop}) or a skip's (POST
 * /v1/rounds/{round}/skip) (see srv_json_parse for the limits,
 * lim may be NULL) into *out. The body is empty, or an object with at most
 * the key
 *   "reason"  string of 0 to SRV_REASON_MAX bytes of printable UTF-8 text:
 *             no C0 control character (U+0000 to U+001F, so no newline or
 *             tab), no DEL (U+007F) and no C1 control (U+0080 to U+009F),
 *             so that it can be written to a log line as it is.
 * Anything else is STRATA_EPROTO, naming the key. Errors: those listed at
 * the top of this header; *out is all zeros on error. */
int srv_request_reason(const uint8_t *body, size_t len, const srv_json_limits *lim,
                       srv_reason_req *out, strata_diag *diag);

/* ---- Secrets ---- */

/* Returns 1 when the NUL-terminated strings a (for example what a client
 * sent) and b (the secret the coordinator holds) are equal, 0 otherwise or
 * when either is NULL. For inputs of equal length the time taken depends
 * only on the length of b, not on where the strings differ; strings of
 * different lengths return 0 after reading both lengths (so the length of
 * the secret is not hidden). */
int srv_secret_equal(const char *a, const char *b);

#endif
