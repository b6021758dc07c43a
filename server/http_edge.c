/* The edge of strata-server's HTTP layer (see http.c): what is checked
 * before a request reaches its route.
 *
 * The edge. On the handler's first call, before the route, the credentials
 * or the body are looked at, in this order (each refusal is a JSON error,
 * counted by its code like every 4xx; an answer given on the first call
 * makes MHD close the connection after it, reading neither the rest of the
 * body nor a request behind it):
 * - Framing: 400 bad_request, with Connection: close, for more than one
 *   Content-Length, Content-Length with Transfer-Encoding, a
 *   Transfer-Encoding other than one header of exactly "chunked",
 *   Transfer-Encoding in HTTP/1.0, a header name that is not an RFC 9110
 *   token (MHD keeps "Transfer-Encoding :" as a header of another name and
 *   would frame by Content-Length), a header line continued on the next
 *   (obs-fold: MHD glues the continuation to the name, so
 *   "Content-Length:\r\n 5" would frame no body), and an HTTP/1.1 request
 *   without exactly one Host. MHD frames by the first such header it finds
 *   and a proxy in front may frame by another: a request that could be read
 *   two ways is read neither way.
 * - The request target as sent: MHD unescapes the path before the handler
 *   sees it, so on_uri, which MHD calls with the raw target, judges it
 *   there: 400 bad_request, with Connection: close, for a byte outside
 *   printable ASCII, a '%' not followed by two hex digits, an escaped
 *   control character (%00 to %1F, %7F), and, in the path, an escaped '/'.
 *   A raw NUL byte ends the C string MHD hands over early; the handler sees
 *   it because MHD ends the target at the space before the HTTP version,
 *   in the same buffer.
 * - The method: GET routes answer HEAD too (the same status and headers;
 *   MHD sends no body); a 405 lists the route's methods in Allow.
 * - Media types (415 unsupported_media_type): POST /v1/clients needs
 *   Content-Type application/json (parameters after ';' allowed); the admin
 *   POSTs and POST /v1/rounds/{round}/skip refuse any other Content-Type,
 *   and need application/json when they carry a body (a Content-Length
 *   above 0 on the first call; a chunked body that is not empty at the
 *   end); uploads need application/octet-stream.
 * What the handler never sees, MHD answers itself with an HTML page that
 * Strata does not count: a malformed or overflowing Content-Length (400,
 * 413; MHD 0.9.75 sends its status line and headers twice there), a header
 * line without a colon or a request line without a version (400), a
 * request line or headers above its buffer (414, 431), an HTTP version
 * other than 1.x (505) and a malformed chunked body (400). A NUL byte in a
 * header value ends the value MHD stores; the rest of the line is lost.
 */
#include "http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The value of hex digit ch, or -1. */
static int hex_value(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* What is wrong with the raw request target uri (path and query, before
 * unescaping), as a message; NULL when nothing is. The rules are in the
 * header comment. */
const char *srv__http_target_problem(const char *uri)
{
    if (uri == NULL || uri[0] == '\0')
        return "request target: missing";
    int in_path = 1;
    for (const char *p = uri; *p != '\0'; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch <= 0x20 || ch >= 0x7f)
            return "request target: a byte outside printable ASCII";
        if (ch == '?')
            in_path = 0;
        if (ch != '%')
            continue;
        int hi = hex_value(p[1]);
        int lo = hi < 0 ? -1 : hex_value(p[2]);
        if (lo < 0)
            return "request target: a '%' not followed by two hex digits";
        int v = hi * 16 + lo;
        if (v == 0)
            return "request target: an escaped NUL (%00)";
        if (v < 0x20 || v == 0x7f)
            return "request target: an escaped control character";
        if (in_path && v == '/')
            return "request target: an escaped '/' (%2F) in the path";
        p += 2;
    }
    return NULL;
}

/* 1 when the request's Content-Type is want (parameters after ';' allowed). */
int srv__http_ctype_is(struct MHD_Connection *c, const char *want)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    size_t n = strlen(want);
    return ct != NULL && strncasecmp(ct, want, n) == 0 &&
           (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

/* What the headers that frame a request say (gathered by frame_header). */
typedef struct framing {
    unsigned content_length;    /* Content-Length headers */
    unsigned transfer_encoding; /* Transfer-Encoding headers */
    unsigned host;              /* Host headers */
    int te_other;               /* a Transfer-Encoding value other than "chunked" */
    int bad_name;               /* a header name that is not a token */
    int folded;                 /* a header line continued on the next (obs-fold) */
} framing;

/* 1 when ch is a tchar of RFC 9110 (the characters of a header name). */
static int is_tchar(char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

/* 1 when key and value lie as MHD 0.9.75 leaves a header that stood on one
 * line: the name, the NUL that replaced the colon, blanks, the value, in
 * its read buffer. MHD appends a continuation line (obs-fold) to a copy of
 * the name, which no longer ends where the value's line has its NUL; the
 * value is then what stood on the first line. Reads only the value's line
 * back to that NUL. */
static int one_line(const char *key, const char *value)
{
    if (value == NULL)
        return 0;
    const char *p = value;
    while (p[-1] == ' ' || p[-1] == '\t')
        p--;
    return p[-1] == '\0' && (uintptr_t)(p - 1) == (uintptr_t)key + strlen(key);
}

/* MHD_KeyValueIterator over the request headers: adds one to cls (a
 * framing). */
static enum MHD_Result frame_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    (void)kind;
    framing *f = cls;
    if (key == NULL || key[0] == '\0') {
        f->bad_name = 1;
        return MHD_YES;
    }
    for (const char *p = key; *p != '\0'; p++)
        if (!is_tchar(*p))
            f->bad_name = 1;
    if (!one_line(key, value))
        f->folded = 1;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        f->content_length++;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        f->transfer_encoding++;
        if (value == NULL || strcmp(value, "chunked") != 0)
            f->te_other = 1;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
        f->host++;
    }
    return MHD_YES;
}

/* Checks that the request can be read one way only (the framing rules of
 * the header comment); version is MHD's "HTTP/1.x". Returns 0, or
 * STRATA_EPROTO with r filled. */
int srv__http_check_framing(struct MHD_Connection *c, const char *version, srv_result *r)
{
    framing f;
    memset(&f, 0, sizeof(f));
    MHD_get_connection_values(c, MHD_HEADER_KIND, frame_header, &f);
    int http10 = strcmp(version, MHD_HTTP_VERSION_1_0) == 0;
    const char *why = NULL;
    if (f.folded)
        why = "a header line continued on the next (obs-fold)";
    else if (f.bad_name)
        why = "a header name that is not a token";
    else if (f.content_length > 1)
        why = "more than one Content-Length";
    else if (f.content_length > 0 && f.transfer_encoding > 0)
        why = "both Content-Length and Transfer-Encoding";
    else if (f.transfer_encoding > 1 || f.te_other)
        why = "a Transfer-Encoding other than one 'chunked'";
    else if (f.transfer_encoding > 0 && http10)
        why = "Transfer-Encoding in HTTP/1.0";
    else if (!http10 && f.host == 0)
        why = "no Host header";
    else if (f.host > 1)
        why = "more than one Host header";
    if (why == NULL)
        return 0;
    srv_result_error(r, SRV_E_BAD_REQUEST, "request framing: %s", why);
    return STRATA_EPROTO;
}

/* Checks what can be checked from the headers alone (first call, after the
 * framing and the target): method, credentials, content type, declared
 * size, upload rate. Returns 0 to read the body, or STRATA_EPROTO with r
 * filled (and *allow for a 405). */
int srv__http_check_headers(srv_engine *e, struct MHD_Connection *c, http_req *q, const char *url,
                            const char *method, srv_result *r, const char **allow)
{
    const char *allowed;
    q->rt = srv__http_match(url, &q->arg, &allowed);
    q->acc = q->rt == R_TASKS || q->rt == R_MODEL || q->rt == R_DELTA || q->rt == R_INIT ||
                     q->rt == R_UPDATES || q->rt == R_SKIP
                 ? A_CLIENT
             : q->rt == R_ADMIN_ACTION || q->rt == R_ADMIN_CONFIG ? A_ADMIN
                                                                  : A_PUBLIC;
    q->action = q->rt == R_ADMIN_ACTION ? url + strlen("/v1/admin/") : NULL;
    q->max = q->rt == R_UPDATES ? srv_engine_max_body(e) : srv_engine_max_json(e);
    strata_buf_init(&q->body, q->max);
    int get = strcmp(allowed, MHD_HTTP_METHOD_GET) == 0;
    if (q->rt != R_NONE && strcmp(method, allowed) != 0 && !(get && q->head)) {
        *allow = get ? "GET, HEAD" : allowed;
        srv_result_error(r, SRV_E_METHOD_NOT_ALLOWED, "%s %s: use %s", method, url, *allow);
        return STRATA_EPROTO;
    }
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (q->acc == A_CLIENT && srv_engine_auth(e, auth, &q->client_id, r) < 0) {
        if (q->rt == R_UPDATES)
            srv_engine_count_update_refused(e, SRV_E_UNAUTHORIZED);
        return STRATA_EPROTO;
    }
    if (q->acc == A_ADMIN && srv_engine_admin_auth(e, auth, r) < 0)
        return STRATA_EPROTO;
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (q->rt == R_UPDATES && !srv__http_ctype_is(c, "application/octet-stream")) {
        srv_engine_count_update_refused(e, SRV_E_UNSUPPORTED_MEDIA_TYPE);
        srv_result_error(r, SRV_E_UNSUPPORTED_MEDIA_TYPE,
                         "Content-Type: expected application/octet-stream, got %s",
                         ct ? ct : "none");
        return STRATA_EPROTO;
    }
    int declared_body = cl != NULL && strtoull(cl, NULL, 10) > 0;
    int reason_body = q->rt == R_ADMIN_ACTION || q->rt == R_SKIP;
    if ((q->rt == R_CLIENTS || (reason_body && (ct != NULL || declared_body))) &&
        !srv__http_ctype_is(c, "application/json")) {
        srv_result_error(r, SRV_E_UNSUPPORTED_MEDIA_TYPE,
                         "Content-Type: expected application/json, got %s", ct ? ct : "none");
        return STRATA_EPROTO;
    }
    if (cl != NULL && strtoull(cl, NULL, 10) > q->max) {
        if (q->rt == R_UPDATES)
            srv_engine_count_update_refused(e, SRV_E_TOO_LARGE);
        srv_result_error(r, SRV_E_TOO_LARGE, "body of %s bytes is above the limit of %zu", cl,
                         q->max);
        return STRATA_EPROTO;
    }
    if (q->rt == R_UPDATES && srv_engine_rate_take(e, q->client_id, r) < 0)
        return STRATA_EPROTO;
    return 0;
}
