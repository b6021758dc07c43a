/* strata-server's HTTP layer: the REST API of schemas/api.md over
 * libmicrohttpd (the only file that includes <microhttpd.h>). */
#ifndef STRATA_SERVER_HTTP_H
#define STRATA_SERVER_HTTP_H

#include "engine.h"

typedef struct srv_http srv_http;

/* Binds cfg's host:port (port 0 picks a free one) and starts serving
 * requests for e with a pool of threads, over HTTPS when cfg names a TLS
 * certificate and key, with cfg's connection and request limits. e and cfg
 * are borrowed and must outlive the server. *bound_port receives the port. */
int srv_http_start(srv_engine *e, const srv_config *cfg, unsigned threads, srv_http **out,
                   unsigned *bound_port, strata_diag *diag);

/* Stops serving and frees h. Accepts NULL. Call srv_engine_stop first so
 * that no connection stays suspended. */
void srv_http_stop(srv_http *h);

#endif
