/* strata-server's HTTP layer (see http.h).
 *
 * Each request gets a small state (struct req) in MHD's per-connection
 * pointer, freed in the completion callback. Bodies are buffered up to a
 * per-route cap: an oversize Content-Length is answered with 413 on the
 * first call (the body is never read); a chunked body that grows past the
 * cap is discarded and answered with 413 at the end. Long-polls suspend the
 * connection (MHD_suspend_connection) instead of blocking a pool thread; the
 * engine resumes it when a round opens or closes, or when its wait ends. */
#include "http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define JSON_CAP 65536
#define MAX_WAIT_S 30

struct srv_http {
    srv_engine *e;
    struct MHD_Daemon *d;
};

typedef enum {
    R_NONE,
    R_HEALTH,
    R_METRICS,
    R_STATUS,
    R_CLIENTS,
    R_TASKS,
    R_MODEL,
    R_ROUNDS,
    R_ROUND,
    R_UPDATES
} route;

typedef struct req {
    route rt;
    unsigned long long arg; /* version or round from the path */
    int client;             /* route needs a bearer token */
    int answered;           /* a response was queued on the first call */
    int waited;             /* parked at least once */
    uint64_t client_id;
    uint8_t *body;
    size_t len, cap, max;
    int too_big;
    int64_t wait_deadline;
} req;

/* Parses a decimal path segment of at most max; -1 when it is not one. */
static int parse_id(const char *s, size_t n, unsigned long long max, unsigned long long *out)
{
    if (n == 0 || n > 20)
        return -1;
    unsigned long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (max - d) / 10)
            return -1;
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
    if (strncmp(url, "/v1/models/", 11) == 0) {
        const char *s = url + 11;
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
    }
    return R_NONE;
}

static enum MHD_Result send_resp(srv_http *h, struct MHD_Connection *c, srv_resp *r,
                                 const char *allow)
{
    struct MHD_Response *resp;
    size_t len = r->len;
    if (r->body != NULL && r->status != 204 && r->status != 304) {
        resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
        if (resp != NULL)
            r->body = NULL; /* owned by the response now */
    } else {
        len = 0;
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    if (resp == NULL) {
        srv_resp_cleanup(r);
        return MHD_NO;
    }
    if (r->ctype != NULL && r->status != 204)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->ctype);
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
    enum MHD_Result ok = MHD_queue_response(c, r->status, resp);
    MHD_destroy_response(resp);
    srv_engine_count_bytes(h->e, 0, len);
    srv_resp_cleanup(r);
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

static void dispatch(srv_http *h, struct MHD_Connection *c, req *q, srv_resp *r, int *parked)
{
    srv_engine *e = h->e;
    unsigned long long a = 0, b = 0;
    switch (q->rt) {
    case R_HEALTH:
        r->status = 200;
        r->ctype = "text/plain";
        r->body = (uint8_t *)strdup("ok");
        r->len = r->body ? 2 : 0;
        break;
    case R_METRICS:
        srv_engine_metrics(e, r);
        break;
    case R_STATUS:
        srv_engine_status(e, r);
        break;
    case R_CLIENTS:
        srv_engine_register(e, q->body, q->len, r);
        break;
    case R_TASKS:
        if (!q->waited) {
            if (query_ulong(c, "wait", 0, MAX_WAIT_S, &a) < 0) {
                srv_resp_error(r, 400, "bad_request", "wait: expected an integer 0 to %d",
                               MAX_WAIT_S);
                break;
            }
            q->wait_deadline = srv_now_ms() + (int64_t)a * 1000;
        }
        q->waited = 1;
        *parked = srv_engine_task(e, q->client_id, q->wait_deadline, c, r);
        break;
    case R_MODEL:
        srv_engine_model(
            e, q->arg, want_zstd(c),
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH), r);
        break;
    case R_ROUNDS:
        if (query_ulong(c, "from", 0, UINT32_MAX, &a) < 0 ||
            query_ulong(c, "limit", 100, 1000, &b) < 0 || b == 0) {
            srv_resp_error(r, 400, "bad_request",
                           "from: expected a round number; limit: expected 1 to 1000");
            break;
        }
        srv_engine_rounds(e, (uint32_t)a, (size_t)b, r);
        break;
    case R_ROUND:
        srv_engine_round(e, (uint32_t)q->arg, r);
        break;
    case R_UPDATES:
        srv_engine_upload(e, q->client_id, (uint32_t)q->arg, q->body, q->len, r);
        break;
    case R_NONE:
        srv_resp_error(r, 404, "not_found", "no such endpoint");
        break;
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    srv_http *h = cls;
    req *q = *con_cls;
    srv_resp r;
    memset(&r, 0, sizeof(r));
    if (q == NULL) {
        q = calloc(1, sizeof(*q));
        if (q == NULL)
            return MHD_NO;
        *con_cls = q;
        const char *allowed;
        q->rt = match(url, &q->arg, &allowed);
        q->client = q->rt == R_TASKS || q->rt == R_MODEL || q->rt == R_UPDATES;
        q->max = q->rt == R_UPDATES ? srv_engine_max_body(h->e) : JSON_CAP;
        if (q->rt != R_NONE && strcmp(method, allowed) != 0) {
            q->answered = 1;
            srv_resp_error(&r, 405, "method_not_allowed", "%s %s: use %s", method, url, allowed);
            return send_resp(h, c, &r, allowed);
        }
        if (q->client) {
            const char *auth =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
            if (srv_engine_auth(h->e, auth, &q->client_id, &r) < 0) {
                q->answered = 1;
                if (q->rt == R_UPDATES)
                    srv_engine_count_reject(h->e, "unauthorized");
                return send_resp(h, c, &r, NULL);
            }
        }
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl != NULL && strtoull(cl, NULL, 10) > q->max) {
            q->answered = 1;
            if (q->rt == R_UPDATES)
                srv_engine_count_reject(h->e, "too_large");
            srv_resp_error(&r, 413, "too_large", "body of %s bytes is above the limit of %zu", cl,
                           q->max);
            return send_resp(h, c, &r, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        srv_engine_count_bytes(h->e, n, 0);
        if (q->answered || q->too_big)
            return MHD_YES;
        if (n > q->max - q->len) {
            q->too_big = 1;
            free(q->body);
            q->body = NULL;
            q->len = q->cap = 0;
            return MHD_YES;
        }
        if (q->len + n > q->cap) {
            size_t cap = q->cap ? q->cap : 4096;
            while (cap < q->len + n)
                cap = cap > q->max / 2 ? q->max : cap * 2;
            uint8_t *p = realloc(q->body, cap);
            if (p == NULL)
                return MHD_NO;
            q->body = p;
            q->cap = cap;
        }
        memcpy(q->body + q->len, upload_data, n);
        q->len += n;
        return MHD_YES;
    }
    if (q->answered)
        return MHD_YES;
    if (q->too_big) {
        if (q->rt == R_UPDATES)
            srv_engine_count_reject(h->e, "too_large");
        srv_resp_error(&r, 413, "too_large", "body above the limit of %zu bytes", q->max);
        return send_resp(h, c, &r, NULL);
    }
    int parked = 0;
    dispatch(h, c, q, &r, &parked);
    if (parked)
        return MHD_YES;
    return send_resp(h, c, &r, NULL);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode toe)
{
    (void)c;
    (void)toe;
    srv_http *h = cls;
    req *q = *con_cls;
    if (q == NULL)
        return;
    if (q->waited)
        srv_engine_waiter_gone(h->e, c);
    free(q->body);
    free(q);
    *con_cls = NULL;
}

static void suspend_conn(void *conn)
{
    MHD_suspend_connection(conn);
}

static void resume_conn(void *conn)
{
    MHD_resume_connection(conn);
}

int srv_http_start(srv_engine *e, const char *host, unsigned port, unsigned threads, srv_http **out,
                   unsigned *bound_port, strata_diag *diag)
{
    *out = NULL;
    *bound_port = 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    const char *addr = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return strata_diag_set(diag, STRATA_EINVAL, "host: '%s' is not an IPv4 address", host);
    srv_http *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return STRATA_ENOMEM;
    h->e = e;
    srv_engine_set_waiters(e, suspend_conn, resume_conn);
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
                                MHD_ALLOW_SUSPEND_RESUME,
                            (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, threads,
                            MHD_OPTION_CONNECTION_TIMEOUT, 60u, MHD_OPTION_CONNECTION_LIMIT, 1024u,
                            MHD_OPTION_NOTIFY_COMPLETED, on_done, h, MHD_OPTION_END);
    if (h->d == NULL) {
        free(h);
        return strata_diag_set(diag, STRATA_EIO, "cannot listen on %s:%u", host, port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = info ? info->port : port;
    *out = h;
    return 0;
}

void srv_http_stop(srv_http *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->d);
    free(h);
}
