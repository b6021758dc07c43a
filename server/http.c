/* strata-server's HTTP layer (see http.h): the daemon. This file owns
 * starting and stopping libmicrohttpd, its callbacks, the connection list
 * and each connection's request deadline (a watchdog thread), and TLS.
 *
 * The HTTP layer (http.c, http_edge.c, http_route.c, http_send.c; see
 * http_internal.h) is the only part of strata-server that knows HTTP
 * status codes and the JSON error envelope: the engine answers with typed
 * results (result.h) and http_send.c maps each outcome to its status and
 * error code string.
 *
 * Each request gets a small state (struct http_req), made by the URI log
 * callback (on_uri) and kept in MHD's per-request pointer until the
 * completion callback frees it. Bodies are buffered up to a per-route cap:
 * an oversize Content-Length is answered with 413 on the first call (the
 * body is never read); a chunked body that grows past the cap is discarded
 * and answered with 413 at the end. Long-polls suspend the connection
 * (MHD_suspend_connection) instead of blocking a pool thread; the engine
 * resumes it when a round opens or closes, or when its wait ends. So does
 * an upload waiting for its group commit: the engine resumes it once its
 * batch is committed, and the request then sends the answer.
 */
#include "http_internal.h"

#include "strata/clock.h"
#include "strata/fileio.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

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
    srv_http_opts o; /* the strings borrowed */
    struct MHD_Daemon *d;
    char *cert, *key;
    pthread_mutex_t mu; /* the connection list and deadlines */
    pthread_cond_t cv;
    conn *conns;
    int stopping, watching;
    pthread_t watchdog;
};

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
    k->deadline_ms = arm ? strata_clock_unix_ms() + (int64_t)h->o.request_timeout * 1000 : 0;
    pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    srv_http *h = cls;
    http_req *q = *con_cls;
    srv_result r;
    memset(&r, 0, sizeof(r));
    if (q == NULL)
        return MHD_NO; /* on_uri found no memory */
    if (!q->started) {
        q->started = 1;
        q->head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
        unsigned how = q->head ? SEND_HEAD : 0;
        const char *allow = NULL;
        int rc = srv__http_check_framing(c, version, &r);
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
            rc = srv__http_check_headers(h->e, c, q, url, method, &r, &allow);
        if (rc < 0) {
            q->answered = 1;
            set_deadline(h, c, 0);
            return srv__http_send(h->e, c, &r, allow, how);
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
    if (q->upload != NULL) { /* resumed: its group commit decided it */
        srv_engine_upload_answer(h->e, q->upload, &r);
        q->upload = NULL;
        return srv__http_send(h->e, c, &r, NULL, how);
    }
    if (q->too_big) {
        if (q->rt == R_UPDATES)
            srv_engine_count_update_refused(h->e, SRV_E_TOO_LARGE);
        srv_result_error(&r, SRV_E_TOO_LARGE, "body above the limit of %zu bytes", q->max);
        return srv__http_send(h->e, c, &r, NULL, how);
    }
    if ((q->rt == R_ADMIN_ACTION || q->rt == R_SKIP) && q->body.len > 0 &&
        !srv__http_ctype_is(c, "application/json")) {
        /* a chunked body: its size was not declared on the first call */
        srv_result_error(&r, SRV_E_UNSUPPORTED_MEDIA_TYPE,
                         "Content-Type: expected application/json with a body, got none");
        return srv__http_send(h->e, c, &r, NULL, how);
    }
    int parked = 0;
    srv__http_dispatch(h->e, c, q, &r, &parked);
    if (parked)
        return MHD_YES;
    return srv__http_send(h->e, c, &r, NULL, how);
}

/* MHD's URI log callback, called with the raw request target (before MHD
 * unescapes it) once per request, before the headers are read: makes the
 * request's state, which MHD hands to on_request and on_done, and judges
 * the target. NULL (no memory) makes on_request refuse the request. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    (void)c;
    http_req *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->uri_bad = srv__http_target_problem(uri);
    q->target_end = uri != NULL ? (uintptr_t)(uri + strlen(uri)) : 0;
    return q;
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    srv_http *h = cls;
    http_req *q = *con_cls;
    if (q == NULL)
        return;
    if (q->waited)
        srv_engine_waiter_gone(h->e, c);
    if (q->upload != NULL)
        srv_engine_upload_gone(h->e, q->upload);
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
        k->deadline_ms = strata_clock_unix_ms() + (int64_t)h->o.request_timeout * 1000;
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

int srv_http_start(srv_engine *e, const srv_http_opts *o, srv_http **out, unsigned *bound_port,
                   strata_diag *diag)
{
    *out = NULL;
    *bound_port = 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)o->port);
    const char *addr = strcmp(o->host, "localhost") == 0 ? "127.0.0.1" : o->host;
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return strata_diag_set(diag, STRATA_EINVAL, "host: '%s' is not an IPv4 address", o->host);
    srv_http *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return STRATA_ENOMEM;
    h->e = e;
    h->o = *o;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    int rc = 0;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    if (o->tls_cert != NULL) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            rc = strata_diag_set(diag, STRATA_EINVAL, "tls_cert: libmicrohttpd lacks TLS");
            goto fail;
        }
        if ((rc = read_pem("tls_cert", o->tls_cert, &h->cert, diag)) < 0 ||
            (rc = read_pem("tls_key", o->tls_key, &h->key, diag)) < 0)
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
        flags, (uint16_t)o->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, o->threads,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->connection_timeout, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)o->max_connections, MHD_OPTION_NOTIFY_COMPLETED, on_done, h,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_URI_LOG_CALLBACK, on_uri, h,
        MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    if (h->d == NULL) {
        rc = strata_diag_set(diag, STRATA_EIO, "cannot listen on %s:%ld%s", o->host, o->port,
                             h->cert ? " (or the TLS certificate and key do not match)" : "");
        goto fail;
    }
    if (pthread_create(&h->watchdog, NULL, watchdog, h) != 0) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    h->watching = 1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = info ? info->port : (unsigned)o->port;
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
