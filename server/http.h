/* strata-server's HTTP layer: the REST API of schemas/api.md over
 * libmicrohttpd (server/http*.c are the only files that include
 * <microhttpd.h>; http_internal.h says which does what). */
#ifndef STRATA_SERVER_HTTP_H
#define STRATA_SERVER_HTTP_H

#include "engine.h"

typedef struct srv_http srv_http;

/* What the HTTP layer needs of the configuration (main.c fills it from
 * srv_config; the strings are borrowed). */
typedef struct srv_http_opts {
    const char *host;     /* an IPv4 address, or "localhost" */
    long port;            /* 0: a free one */
    const char *tls_cert; /* PEM files; NULL: plain HTTP */
    const char *tls_key;
    long connection_timeout; /* idle seconds before MHD closes a connection */
    long max_connections;    /* over all pool threads */
    long request_timeout;    /* seconds for a whole request to arrive */
    unsigned threads;        /* the pool */
} srv_http_opts;

/* Binds o's host:port (port 0 picks a free one) and starts serving
 * requests for e with a pool of o->threads threads, over HTTPS when o names
 * a TLS certificate and key, with o's connection and request limits. e and
 * o's strings are borrowed and must outlive the server (o itself is
 * copied). *bound_port receives the port. */
int srv_http_start(srv_engine *e, const srv_http_opts *o, srv_http **out, unsigned *bound_port,
                   strata_diag *diag);

/* Stops serving and frees h. Accepts NULL. Call srv_engine_stop first so
 * that no connection stays suspended. */
void srv_http_stop(srv_http *h);

#endif
