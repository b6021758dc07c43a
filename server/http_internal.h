/* The HTTP layer's internals, shared by its four files (see http.c): the
 * routes, the per-request state, and the helpers each file lends the others.
 *
 *   http.c        the daemon: start, stop, MHD's callbacks, connections and
 *                 their request deadlines, TLS;
 *   http_edge.c   the checks before a route (framing, target, method,
 *                 credentials, media types, sizes);
 *   http_route.c  from a route to its engine call;
 *   http_send.c   from an outcome to its status, the error envelope, the
 *                 response.
 *
 * Only these files include <microhttpd.h>. */
#ifndef STRATA_SERVER_HTTP_INTERNAL_H
#define STRATA_SERVER_HTTP_INTERNAL_H

#include "http.h"

#include "strata/buf.h"

#include <microhttpd.h>
#include <stdint.h>

/* The longest long-poll a task request may ask for (?wait=), in seconds. */
#define MAX_WAIT_S 30

/* The routes. */
typedef enum {
    R_NONE,
    R_HEALTH,
    R_LEADER_HEALTH,
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
} http_route;

/* Who may call a route. */
typedef enum { A_PUBLIC, A_CLIENT, A_ADMIN } http_who;

/* One request's state, made by on_uri and freed by on_done (http.c). */
typedef struct http_req {
    int started;          /* the handler's first call is done */
    const char *uri_bad;  /* what is wrong with the raw request target; NULL: nothing */
    uintptr_t target_end; /* where the raw target's C string ended in MHD's buffer */
    http_route rt;
    unsigned long long arg; /* version or round from the path */
    const char *action;     /* admin action from the path */
    http_who acc;
    int answered; /* a response was queued on the first call */
    int head;     /* the method is HEAD: no body goes out */
    int waited;   /* parked at least once */
    uint64_t client_id;
    strata_buf body; /* capped at max */
    size_t max;
    int too_big;
    int64_t wait_deadline;
    srv_upload *upload; /* an upload waiting for its group commit, its connection suspended */
} http_req;

/* ---- http_route.c ---- */

/* Resolves url to a route and the method it accepts; for a route with a
 * number in its path (a version or a round) the number goes to *arg. */
http_route srv__http_match(const char *url, unsigned long long *arg, const char **method);

/* Runs request q (its whole body read) as its route's engine call into r.
 * *parked is 1 when the engine parked the connection (a long-poll, or an
 * upload waiting for its group commit, q->upload): r is then untouched and
 * the request is run again when it is resumed. */
void srv__http_dispatch(srv_engine *e, struct MHD_Connection *c, http_req *q, srv_result *r,
                        int *parked);

/* ---- http_edge.c ---- */

/* What is wrong with the raw request target uri (path and query, before
 * unescaping), as a message; NULL when nothing is (rules: http_edge.c). */
const char *srv__http_target_problem(const char *uri);

/* 1 when the request's Content-Type is want (parameters after ';' allowed). */
int srv__http_ctype_is(struct MHD_Connection *c, const char *want);

/* Checks that the request can be read one way only; version is MHD's
 * "HTTP/1.x". Returns 0, or STRATA_EPROTO with r filled. */
int srv__http_check_framing(struct MHD_Connection *c, const char *version, srv_result *r);

/* Checks what can be checked from the headers alone (first call, after the
 * framing and the target): route, method, credentials, content type,
 * declared size, upload rate; sets q's route, access, action and body cap.
 * Returns 0 to read the body, or STRATA_EPROTO with r filled (and *allow
 * for a 405). */
int srv__http_check_headers(srv_engine *e, struct MHD_Connection *c, http_req *q, const char *url,
                            const char *method, srv_result *r, const char **allow);

/* ---- http_send.c ---- */

/* How srv__http_send sends. */
enum {
    SEND_CLOSE = 1, /* Connection: close (MHD closes the connection after the response) */
    SEND_HEAD = 2,  /* the request is HEAD: MHD sends no body, none is counted */
};

/* Queues r (an error in the JSON envelope) with Allow: allow when not NULL,
 * counts a 4xx by its code, the bytes sent and a model body as downlink,
 * and frees r's contents. how: SEND_* flags. */
enum MHD_Result srv__http_send(srv_engine *e, struct MHD_Connection *c, srv_result *r,
                               const char *allow, unsigned how);

#endif
