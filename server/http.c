/* strata-server's HTTP layer (see http.h).
 *
 * The only file that knows HTTP status codes and the JSON error envelope:
 * the engine answers with typed results (result.h) and OUTCOMES below maps
 * each outcome to its status and error code string.
 *
 * Each request gets a small state (struct req), made by the URI log
 * callback (on_uri) and kept in MHD's per-request pointer until the
 * completion callback frees it. Bodies are buffered up to a per-route cap:
 * an oversize Content-Length is answered with 413 on the first call (the
 * body is never read); a chunked body that grows past the cap is discarded
 * and answered with 413 at the end. Long-polls suspend the connection
 * (MHD_suspend_connection) instead of blocking a pool thread; the engine
 * resumes it when a round opens or closes, or when its wait ends.
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
#include "http.h"

#include "strata/buf.h"
#include "strata/clock.h"
#include "strata/fileio.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_WAIT_S 30
#define WATCHDOG_MS 200
#define PEM_MAX (1 << 20)

/* One open connection, for the request deadline. */
typedef struct conn {
    int fd;
    int64_t deadline_ms; /* 0: none (the request is in; or parked) */
    struct conn *prev, *next;
} conn;

struct srv_http {
    srv_engine *e;
    const srv_config *cfg;
    struct MHD_Daemon *d;
    char *cert, *key;
    pthread_mutex_t mu; /* the connection list and deadlines */
    pthread_cond_t cv;
    conn *conns;
    int stopping, watching;
    pthread_t watchdog;
};

typedef enum {
    R_NONE,
    R_HEALTH,
    R_METRICS,
    R_STATUS,
    R_CLIENTS,
    R_TASKS,
    R_MODEL,
    R_DELTA,
    R_INIT,
    R_ROUNDS,
    R_ROUND,
    R_UPDATES,
    R_SKIP,
    R_ADMIN_ACTION,
    R_ADMIN_CONFIG
} route;

/* Who may call a route. */
typedef enum { A_PUBLIC, A_CLIENT, A_ADMIN } who;

typedef struct req {
    int started;          /* the handler's first call is done */
    const char *uri_bad;  /* what is wrong with the raw request target; NULL: nothing */
    uintptr_t target_end; /* where the raw target's C string ended in MHD's buffer */
    route rt;
    unsigned long long arg; /* version or round from the path */
    const char *action;     /* admin action from the path */
    who acc;
    int answered; /* a response was queued on the first call */
    int head;     /* the method is HEAD: no body goes out */
    int waited;   /* parked at least once */
    uint64_t client_id;
    strata_buf body; /* capped at max */
    size_t max;
    int too_big;
    int64_t wait_deadline;
} req;

/* Parses a decimal path segment of at most max. Errors: STRATA_EPROTO
 * when it is not one. */
static int parse_id(const char *s, size_t n, unsigned long long max, unsigned long long *out)
{
    if (n == 0 || n > 20)
        return STRATA_EPROTO;
    unsigned long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return STRATA_EPROTO;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (max - d) / 10)
            return STRATA_EPROTO;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Resolves url to a route and the method it accepts. */
static route match(const char *url, unsigned long long *arg, const char **method)
{
    *method = "GET";
    if (strcmp(url, "/healthz") == 0)
        return R_HEALTH;
    if (strcmp(url, "/metrics") == 0)
        return R_METRICS;
    if (strcmp(url, "/v1/status") == 0)
        return R_STATUS;
    if (strcmp(url, "/v1/tasks/next") == 0)
        return R_TASKS;
    if (strcmp(url, "/v1/rounds") == 0)
        return R_ROUNDS;
    if (strcmp(url, "/v1/clients") == 0) {
        *method = "POST";
        return R_CLIENTS;
    }
    if (strcmp(url, "/v1/admin/config") == 0)
        return R_ADMIN_CONFIG;
    if (strcmp(url, "/v1/admin/pause") == 0 || strcmp(url, "/v1/admin/resume") == 0 ||
        strcmp(url, "/v1/admin/stop") == 0) {
        *method = "POST";
        return R_ADMIN_ACTION;
    }
    if (strncmp(url, "/v1/models/", 11) == 0) {
        const char *s = url + 11;
        const char *slash = strchr(s, '/');
        if (slash != NULL && strcmp(slash, "/init") == 0)
            return slash - s == 1 && s[0] == '0' ? R_INIT : R_NONE;
        if (slash != NULL)
            return strcmp(slash, "/delta") == 0 &&
                           parse_id(s, (size_t)(slash - s), (unsigned long long)INT64_MAX, arg) == 0
                       ? R_DELTA
                       : R_NONE;
        return parse_id(s, strlen(s), (unsigned long long)INT64_MAX, arg) == 0 ? R_MODEL : R_NONE;
    }
    if (strncmp(url, "/v1/rounds/", 11) == 0) {
        const char *s = url + 11;
        const char *slash = strchr(s, '/');
        if (slash == NULL)
            return parse_id(s, strlen(s), UINT32_MAX, arg) == 0 ? R_ROUND : R_NONE;
        if (strcmp(slash, "/updates") == 0 &&
            parse_id(s, (size_t)(slash - s), UINT32_MAX, arg) == 0) {
            *method = "POST";
            return R_UPDATES;
        }
        if (strcmp(slash, "/skip") == 0 && parse_id(s, (size_t)(slash - s), UINT32_MAX, arg) == 0) {
            *method = "POST";
            return R_SKIP;
        }
    }
    return R_NONE;
}

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
static const char *target_problem(const char *uri)
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

/* The one table from outcome to HTTP status and error code string. */
static const struct {
    unsigned status;
    const char *code; /* NULL for successes */
} OUTCOMES[SRV_OUTCOME_COUNT] = {
    [SRV_OK] = {200, NULL},
    [SRV_CREATED] = {201, NULL},
    [SRV_NO_CONTENT] = {204, NULL},
    [SRV_NOT_MODIFIED] = {304, NULL},
    [SRV_E_BAD_REQUEST] = {400, "bad_request"},
    [SRV_E_BAD_PAYLOAD] = {400, "bad_payload"},
    [SRV_E_TOO_LARGE] = {413, "too_large"},
    [SRV_E_UNAUTHORIZED] = {401, "unauthorized"},
    [SRV_E_BAD_SECRET] = {401, "bad_secret"},
    [SRV_E_FORBIDDEN] = {403, "forbidden"},
    [SRV_E_NOT_FOUND] = {404, "not_found"},
    [SRV_E_METHOD_NOT_ALLOWED] = {405, "method_not_allowed"},
    [SRV_E_UNSUPPORTED_MEDIA_TYPE] = {415, "unsupported_media_type"},
    [SRV_E_INVALID_UPDATE] = {422, "invalid_update"},
    [SRV_E_NOT_SELECTED] = {403, "not_selected"},
    [SRV_E_ROUND_CLOSED] = {409, "round_closed"},
    [SRV_E_ROUND_NOT_OPEN] = {409, "round_not_open"},
    [SRV_E_RATE_LIMITED] = {429, "rate_limited"},
    [SRV_E_TOO_MANY_CLIENTS] = {429, "too_many_clients"},
    [SRV_E_NO_DATA_SHARE] = {409, "no_data_share"},
    [SRV_E_FINISHED] = {410, "finished"},
    [SRV_E_ROUND_CLOSING] = {409, "round_closing"},
    [SRV_E_REQUEST_TIMEOUT] = {408, "request_timeout"},
    [SRV_E_CONFLICT] = {409, "conflict"},
    [SRV_E_UNAVAILABLE] = {503, "unavailable"},
    [SRV_E_INTERNAL] = {500, "internal"},
};

static const char *media_type(srv_media m)
{
    switch (m) {
    case SRV_MEDIA_JSON:
        return "application/json";
    case SRV_MEDIA_BINARY:
        return "application/octet-stream";
    case SRV_MEDIA_TEXT:
        return "text/plain";
    case SRV_MEDIA_EXPOSITION:
        return "text/plain; version=0.0.4; charset=utf-8";
    case SRV_MEDIA_NONE:
        break;
    }
    return NULL;
}

/* Replaces an error result's body with the JSON error envelope
 * {"error":{"code":...,"message":...}}. */
static void error_envelope(srv_result *r)
{
    json_t *j = json_pack("{s:{s:s,s:s}}", "error", "code", OUTCOMES[r->outcome].code, "message",
                          r->message);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (s == NULL) {
        r->outcome = SRV_E_INTERNAL;
        s = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}");
    }
    free(r->body);
    r->body = (uint8_t *)s;
    r->len = s ? strlen(s) : 0;
    r->media = SRV_MEDIA_JSON;
}

/* How send_resp sends. */
enum {
    SEND_CLOSE = 1, /* Connection: close (MHD closes the connection after the response) */
    SEND_HEAD = 2,  /* the request is HEAD: MHD sends no body, none is counted */
};

/* Queues r (an error in the JSON envelope) with Allow: allow when not NULL,
 * counts a 4xx by its code and frees r's contents. */
static enum MHD_Result send_resp(srv_http *h, struct MHD_Connection *c, srv_result *r,
                                 const char *allow, unsigned how)
{
    if ((unsigned)r->outcome >= SRV_OUTCOME_COUNT)
        srv_result_error(r, SRV_E_INTERNAL, "internal error");
    if (srv_outcome_is_error(r->outcome))
        error_envelope(r);
    unsigned status = OUTCOMES[r->outcome].status;
    struct MHD_Response *resp;
    size_t len = r->len;
    if (r->body != NULL && status != 204 && status != 304) {
        resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
        if (resp != NULL)
            r->body = NULL; /* owned by the response now */
    } else {
        len = 0;
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    if (resp == NULL) {
        srv_result_cleanup(r);
        return MHD_NO;
    }
    const char *ctype = media_type(r->media);
    if (ctype != NULL && status != 204)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (r->etag[0] != '\0')
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, r->etag);
    if (r->zstd)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_ENCODING, "zstd");
    if (r->retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", r->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (allow != NULL)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (how & SEND_CLOSE)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    if (how & SEND_HEAD)
        len = 0;
    if (status >= 400 && status < 500)
        srv_engine_count_refused(h->e, r->outcome);
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    srv_engine_count_bytes(h->e, 0, len);
    if (r->downlink && status == 200 && len > 0)
        srv_engine_count_downlink(h->e, len);
    srv_result_cleanup(r);
    return ok;
}

static int want_zstd(struct MHD_Connection *c)
{
    const char *ae =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT_ENCODING);
    if (ae == NULL)
        return 0;
    for (const char *p = strstr(ae, "zstd"); p != NULL; p = strstr(p + 4, "zstd")) {
        int start = p == ae || p[-1] == ' ' || p[-1] == ',';
        int end = p[4] == '\0' || p[4] == ',' || p[4] == ';' || p[4] == ' ';
        if (start && end)
            return strncmp(p + 4, ";q=", 3) != 0 || strtod(p + 7, NULL) > 0;
    }
    return 0;
}

/* Parses an optional non-negative integer query argument. */
static int query_ulong(struct MHD_Connection *c, const char *key, unsigned long long def,
                       unsigned long long max, unsigned long long *out)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    if (v == NULL) {
        *out = def;
        return 0;
    }
    return parse_id(v, strlen(v), max, out);
}

/* Room for a peer address as text (an IPv6 address and its NUL). */
#define SRV_PEER_TEXT INET6_ADDRSTRLEN

/* Writes the connection's peer address as text into out ("" when unknown). */
static void peer_address(struct MHD_Connection *c, char out[SRV_PEER_TEXT])
{
    out[0] = '\0';
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci != NULL ? ci->client_addr : NULL;
    if (sa == NULL)
        return;
    const void *a =
        sa->sa_family == AF_INET    ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
        : sa->sa_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                                    : NULL;
    if (a == NULL || inet_ntop(sa->sa_family, a, out, SRV_PEER_TEXT) == NULL)
        out[0] = '\0';
}

static void dispatch(srv_http *h, struct MHD_Connection *c, req *q, srv_result *r, int *parked)
{
    srv_engine *e = h->e;
    unsigned long long a = 0, b = 0;
    switch (q->rt) {
    case R_HEALTH: {
        char *ok = strdup("ok");
        srv_result_take(r, SRV_OK, SRV_MEDIA_TEXT, (uint8_t *)ok, 2);
        break;
    }
    case R_METRICS:
        srv_engine_metrics(e, r);
        break;
    case R_STATUS:
        srv_engine_status(e, r);
        break;
    case R_CLIENTS: {
        char peer[SRV_PEER_TEXT];
        peer_address(c, peer);
        srv_engine_register(e, peer, q->body.data, q->body.len, r);
        break;
    }
    case R_TASKS:
        if (!q->waited) {
            if (query_ulong(c, "wait", 0, MAX_WAIT_S, &a) < 0) {
                srv_result_error(r, SRV_E_BAD_REQUEST, "wait: expected an integer 0 to %d",
                                 MAX_WAIT_S);
                break;
            }
            q->wait_deadline = strata_clock_unix_ms() + (int64_t)a * 1000;
        }
        q->waited = 1;
        srv_engine_task(e, q->client_id, q->wait_deadline, c, parked, r);
        break;
    case R_MODEL:
        srv_engine_model(
            e, q->arg, want_zstd(c),
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH), r);
        break;
    case R_DELTA:
        if (MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "from") == NULL ||
            query_ulong(c, "from", 0, (unsigned long long)INT64_MAX, &a) < 0 || a >= q->arg) {
            srv_result_error(r, SRV_E_BAD_REQUEST, "from: expected a model version below %llu",
                             q->arg);
            break;
        }
        srv_engine_model_delta(
            e, q->arg, a,
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH), r);
        break;
    case R_INIT:
        srv_engine_model_init(e, r);
        break;
    case R_ROUNDS:
        if (query_ulong(c, "from", 0, UINT32_MAX, &a) < 0 ||
            query_ulong(c, "limit", 100, 1000, &b) < 0 || b == 0) {
            srv_result_error(r, SRV_E_BAD_REQUEST,
                             "from: expected a round number; limit: expected 1 to 1000");
            break;
        }
        srv_engine_rounds(e, (uint32_t)a, (size_t)b, r);
        break;
    case R_ROUND:
        srv_engine_round(e, (uint32_t)q->arg, r);
        break;
    case R_UPDATES:
        srv_engine_upload(e, q->client_id, (uint32_t)q->arg, q->body.data, q->body.len, r);
        break;
    case R_SKIP:
        srv_engine_skip(e, q->client_id, (uint32_t)q->arg, q->body.data, q->body.len, r);
        break;
    case R_ADMIN_CONFIG:
        srv_engine_admin_config(e, r);
        break;
    case R_ADMIN_ACTION:
        srv_engine_admin(e, q->action, q->body.data, q->body.len, r);
        break;
    case R_NONE:
        srv_result_error(r, SRV_E_NOT_FOUND, "no such endpoint");
        break;
    }
}

/* 1 when the request's Content-Type is want (parameters after ';' allowed). */
static int ctype_is(struct MHD_Connection *c, const char *want)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    size_t n = strlen(want);
    return ct != NULL && strncasecmp(ct, want, n) == 0 &&
           (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

/* The connection record of c (set in on_connection). */
static conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

/* Sets the connection's request deadline: 0 clears it; otherwise
 * request_timeout seconds from now. */
static void set_deadline(srv_http *h, struct MHD_Connection *c, int arm)
{
    conn *k = conn_of(c);
    if (k == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    k->deadline_ms = arm ? strata_clock_unix_ms() + (int64_t)h->cfg->request_timeout * 1000 : 0;
    pthread_mutex_unlock(&h->mu);
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
static int check_framing(struct MHD_Connection *c, const char *version, srv_result *r)
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
static int check_headers(srv_http *h, struct MHD_Connection *c, req *q, const char *url,
                         const char *method, srv_result *r, const char **allow)
{
    const char *allowed;
    q->rt = match(url, &q->arg, &allowed);
    q->acc = q->rt == R_TASKS || q->rt == R_MODEL || q->rt == R_DELTA || q->rt == R_INIT ||
                     q->rt == R_UPDATES || q->rt == R_SKIP
                 ? A_CLIENT
             : q->rt == R_ADMIN_ACTION || q->rt == R_ADMIN_CONFIG ? A_ADMIN
                                                                  : A_PUBLIC;
    q->action = q->rt == R_ADMIN_ACTION ? url + strlen("/v1/admin/") : NULL;
    q->max = q->rt == R_UPDATES ? srv_engine_max_body(h->e) : srv_engine_max_json(h->e);
    strata_buf_init(&q->body, q->max);
    int get = strcmp(allowed, MHD_HTTP_METHOD_GET) == 0;
    if (q->rt != R_NONE && strcmp(method, allowed) != 0 && !(get && q->head)) {
        *allow = get ? "GET, HEAD" : allowed;
        srv_result_error(r, SRV_E_METHOD_NOT_ALLOWED, "%s %s: use %s", method, url, *allow);
        return STRATA_EPROTO;
    }
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (q->acc == A_CLIENT && srv_engine_auth(h->e, auth, &q->client_id, r) < 0) {
        if (q->rt == R_UPDATES)
            srv_engine_count_update_refused(h->e, SRV_E_UNAUTHORIZED);
        return STRATA_EPROTO;
    }
    if (q->acc == A_ADMIN && srv_engine_admin_auth(h->e, auth, r) < 0)
        return STRATA_EPROTO;
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (q->rt == R_UPDATES && !ctype_is(c, "application/octet-stream")) {
        srv_engine_count_update_refused(h->e, SRV_E_UNSUPPORTED_MEDIA_TYPE);
        srv_result_error(r, SRV_E_UNSUPPORTED_MEDIA_TYPE,
                         "Content-Type: expected application/octet-stream, got %s",
                         ct ? ct : "none");
        return STRATA_EPROTO;
    }
    int declared_body = cl != NULL && strtoull(cl, NULL, 10) > 0;
    int reason_body = q->rt == R_ADMIN_ACTION || q->rt == R_SKIP;
    if ((q->rt == R_CLIENTS || (reason_body && (ct != NULL || declared_body))) &&
        !ctype_is(c, "application/json")) {
        srv_result_error(r, SRV_E_UNSUPPORTED_MEDIA_TYPE,
                         "Content-Type: expected application/json, got %s", ct ? ct : "none");
        return STRATA_EPROTO;
    }
    if (cl != NULL && strtoull(cl, NULL, 10) > q->max) {
        if (q->rt == R_UPDATES)
            srv_engine_count_update_refused(h->e, SRV_E_TOO_LARGE);
        srv_result_error(r, SRV_E_TOO_LARGE, "body of %s bytes is above the limit of %zu", cl,
                         q->max);
        return STRATA_EPROTO;
    }
    if (q->rt == R_UPDATES && srv_engine_rate_take(h->e, q->client_id, r) < 0)
        return STRATA_EPROTO;
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    srv_http *h = cls;
    req *q = *con_cls;
    srv_result r;
    memset(&r, 0, sizeof(r));
    if (q == NULL)
        return MHD_NO; /* on_uri found no memory */
    if (!q->started) {
        q->started = 1;
        q->head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
        unsigned how = q->head ? SEND_HEAD : 0;
        const char *allow = NULL;
        int rc = check_framing(c, version, &r);
        if (rc < 0) {
            how |= SEND_CLOSE;
        } else if (q->uri_bad == NULL && (uintptr_t)version != q->target_end + 1) {
            /* MHD ends the target at the space before the version; a NUL
             * byte of the request line ended its C string earlier. */
            q->uri_bad = "request target: a NUL byte";
        }
        if (rc == 0 && q->uri_bad != NULL) {
            srv_result_error(&r, SRV_E_BAD_REQUEST, "%s", q->uri_bad);
            how |= SEND_CLOSE;
            rc = STRATA_EPROTO;
        }
        if (rc == 0)
            rc = check_headers(h, c, q, url, method, &r, &allow);
        if (rc < 0) {
            q->answered = 1;
            set_deadline(h, c, 0);
            return send_resp(h, c, &r, allow, how);
        }
        return MHD_YES;
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        srv_engine_count_bytes(h->e, n, 0);
        if (q->answered || q->too_big)
            return MHD_YES;
        int rc = strata_buf_append(&q->body, upload_data, n);
        if (rc == STRATA_ETOOBIG) {
            q->too_big = 1;
            strata_buf_cleanup(&q->body);
            return MHD_YES;
        }
        return rc < 0 ? MHD_NO : MHD_YES;
    }
    set_deadline(h, c, 0); /* the whole request is in */
    if (q->answered)
        return MHD_YES;
    unsigned how = q->head ? SEND_HEAD : 0;
    if (q->too_big) {
        if (q->rt == R_UPDATES)
            srv_engine_count_update_refused(h->e, SRV_E_TOO_LARGE);
        srv_result_error(&r, SRV_E_TOO_LARGE, "body above the limit of %zu bytes", q->max);
        return send_resp(h, c, &r, NULL, how);
    }
    if ((q->rt == R_ADMIN_ACTION || q->rt == R_SKIP) && q->body.len > 0 &&
        !ctype_is(c, "application/json")) {
        /* a chunked body: its size was not declared on the first call */
        srv_result_error(&r, SRV_E_UNSUPPORTED_MEDIA_TYPE,
                         "Content-Type: expected application/json with a body, got none");
        return send_resp(h, c, &r, NULL, how);
    }
    int parked = 0;
    dispatch(h, c, q, &r, &parked);
    if (parked)
        return MHD_YES;
    return send_resp(h, c, &r, NULL, how);
}

/* MHD's URI log callback, called with the raw request target (before MHD
 * unescapes it) once per request, before the headers are read: makes the
 * request's state, which MHD hands to on_request and on_done, and judges
 * the target. NULL (no memory) makes on_request refuse the request. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    (void)c;
    req *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->uri_bad = target_problem(uri);
    q->target_end = uri != NULL ? (uintptr_t)(uri + strlen(uri)) : 0;
    return q;
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    srv_http *h = cls;
    req *q = *con_cls;
    if (q == NULL)
        return;
    if (q->waited)
        srv_engine_waiter_gone(h->e, c);
    strata_buf_cleanup(&q->body);
    free(q);
    *con_cls = NULL;
    set_deadline(h, c, 1); /* the next request on this connection */
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    srv_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn *k = calloc(1, sizeof(*k));
        if (k == NULL || ci == NULL) {
            free(k);
            return; /* no deadline for this one; the idle timeout still applies */
        }
        k->fd = ci->connect_fd;
        pthread_mutex_lock(&h->mu);
        k->deadline_ms = strata_clock_unix_ms() + (int64_t)h->cfg->request_timeout * 1000;
        k->next = h->conns;
        if (h->conns != NULL)
            h->conns->prev = k;
        h->conns = k;
        pthread_mutex_unlock(&h->mu);
        *socket_context = k;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context != NULL) {
        conn *k = *socket_context;
        pthread_mutex_lock(&h->mu);
        if (k->prev != NULL)
            k->prev->next = k->next;
        else
            h->conns = k->next;
        if (k->next != NULL)
            k->next->prev = k->prev;
        pthread_mutex_unlock(&h->mu);
        free(k);
        *socket_context = NULL;
    }
}

/* Shuts down the sockets of connections past their request deadline. */
static void *watchdog(void *arg)
{
    srv_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        int64_t now = strata_clock_unix_ms();
        for (conn *k = h->conns; k != NULL; k = k->next)
            if (k->deadline_ms != 0 && now > k->deadline_ms) {
                k->deadline_ms = 0;
                shutdown(k->fd, SHUT_RDWR);
                srv_engine_count_refused(h->e, SRV_E_REQUEST_TIMEOUT);
            }
        struct timespec ts = strata_clock_abstime_in(WATCHDOG_MS);
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void suspend_conn(void *conn)
{
    MHD_suspend_connection(conn);
}

static void resume_conn(void *conn)
{
    MHD_resume_connection(conn);
}

/* Reads a whole PEM file (MHD takes the contents, not a path). */
static int read_pem(const char *what, const char *path, char **out, strata_diag *diag)
{
    uint8_t *buf = NULL;
    size_t n = 0;
    strata_diag fd = {{0}};
    int rc = strata_file_read_all(path, PEM_MAX, &buf, &n, &fd);
    if (rc == STRATA_ENOMEM)
        return rc;
    if (rc == STRATA_ESTATE || rc == STRATA_EIO)
        return strata_diag_set(diag, STRATA_EIO, "%s: %s", what, strata_diag_msg(&fd, rc));
    if (rc < 0 || n == 0 || strstr((char *)buf, "-----BEGIN ") == NULL) {
        free(buf);
        return strata_diag_set(diag, STRATA_EINVAL, "%s: %s: not a PEM file of at most %d bytes",
                               what, path, PEM_MAX);
    }
    *out = (char *)buf;
    return 0;
}

static void http_free(srv_http *h)
{
    if (h->watching) {
        pthread_mutex_lock(&h->mu);
        h->stopping = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->watchdog, NULL);
    }
    if (h->d != NULL)
        MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->cert);
    free(h->key);
    free(h);
}

int srv_http_start(srv_engine *e, const srv_config *cfg, unsigned threads, srv_http **out,
                   unsigned *bound_port, strata_diag *diag)
{
    *out = NULL;
    *bound_port = 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)cfg->port);
    const char *addr = strcmp(cfg->host, "localhost") == 0 ? "127.0.0.1" : cfg->host;
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return strata_diag_set(diag, STRATA_EINVAL, "host: '%s' is not an IPv4 address", cfg->host);
    srv_http *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return STRATA_ENOMEM;
    h->e = e;
    h->cfg = cfg;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    int rc = 0;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    if (cfg->tls_cert != NULL) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            rc = strata_diag_set(diag, STRATA_EINVAL, "tls_cert: libmicrohttpd lacks TLS");
            goto fail;
        }
        if ((rc = read_pem("tls_cert", cfg->tls_cert, &h->cert, diag)) < 0 ||
            (rc = read_pem("tls_key", cfg->tls_key, &h->key, diag)) < 0)
            goto fail;
        flags |= MHD_USE_TLS;
    }
    srv_engine_set_waiters(e, suspend_conn, resume_conn);
    struct MHD_OptionItem tls[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, h->cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, h->key},
        {MHD_OPTION_END, 0, NULL},
    };
    if (h->cert == NULL)
        tls[0].option = MHD_OPTION_END;
    h->d = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)cfg->connection_timeout, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections, MHD_OPTION_NOTIFY_COMPLETED, on_done, h,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_URI_LOG_CALLBACK, on_uri, h,
        MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    if (h->d == NULL) {
        rc = strata_diag_set(diag, STRATA_EIO, "cannot listen on %s:%ld%s", cfg->host, cfg->port,
                             h->cert ? " (or the TLS certificate and key do not match)" : "");
        goto fail;
    }
    if (pthread_create(&h->watchdog, NULL, watchdog, h) != 0) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    h->watching = 1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = info ? info->port : (unsigned)cfg->port;
    *out = h;
    return 0;
fail:
    http_free(h);
    return rc;
}

void srv_http_stop(srv_http *h)
{
    if (h != NULL)
        http_free(h);
}
