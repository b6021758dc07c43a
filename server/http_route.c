/* strata-server's routes (see http_internal.h): the path and method of
 * each endpoint, the numbers and query arguments they carry, and the engine
 * call each one makes. */
#include "http_internal.h"

#include "strata/clock.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

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
http_route srv__http_match(const char *url, unsigned long long *arg, const char **method)
{
    *method = "GET";
    if (strcmp(url, "/healthz") == 0)
        return R_HEALTH;
    if (strcmp(url, "/v1/health") == 0)
        return R_LEADER_HEALTH;
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

void srv__http_dispatch(srv_engine *e, struct MHD_Connection *c, http_req *q, srv_result *r,
                        int *parked)
{
    unsigned long long a = 0, b = 0;
    switch (q->rt) {
    case R_HEALTH: {
        char *ok = strdup("ok");
        srv_result_take(r, SRV_OK, SRV_MEDIA_TEXT, (uint8_t *)ok, 2);
        break;
    }
    case R_LEADER_HEALTH:
        srv_engine_health(e, r);
        break;
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
        srv_engine_upload(e, q->client_id, (uint32_t)q->arg, q->body.data, q->body.len, c,
                          &q->upload, r);
        *parked = q->upload != NULL;
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
