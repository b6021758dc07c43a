/* Parked long-poll connections (waiters.c): a task request that finds no
 * task waits until a round opens or closes, the federation stops, or its
 * own wait ends, without holding an HTTP thread.
 *
 * waiters.c owns the list in its own structure (srv_waiters). Every call
 * is made with the engine lock held; the suspend and resume callbacks (the
 * HTTP layer's) run under it and must not block or call back into the
 * engine. It calls no other engine module. */
#ifndef STRATA_SERVER_WAITERS_H
#define STRATA_SERVER_WAITERS_H

#include "engine.h"

#include <stdint.h>

typedef struct srv_waiters srv_waiters;

/* An empty list (srv__waiters_free). Errors: STRATA_ENOMEM. */
int srv__waiters_new(srv_waiters **out);

/* Frees w (the parked connections are the HTTP layer's). Accepts NULL. */
void srv__waiters_free(srv_waiters *w);

/* Sets the callbacks (before any connection is parked). */
void srv__waiters_set(srv_waiters *w, srv_waiter_fn suspend, srv_waiter_fn resume);

/* Parks conn until deadline_ms (Unix ms): calls suspend. Returns 1 when
 * parked; 0 when not (the list is closed, or no memory for it): the caller
 * answers now. */
int srv__waiters_park(srv_waiters *w, void *conn, int64_t deadline_ms);

/* Forgets conn (its connection ended). */
void srv__waiters_gone(srv_waiters *w, void *conn);

/* Wakes every parked connection. */
void srv__waiters_wake_all(srv_waiters *w);

/* Wakes the connections whose wait ended by now (Unix ms). */
void srv__waiters_wake_expired(srv_waiters *w, int64_t now);

/* Wakes every parked connection and parks none from now on (the engine
 * stops). */
void srv__waiters_close(srv_waiters *w);

#endif
