/* Parked long-polls (see waiters.h). This file alone touches struct
 * srv_waiters. */
#include "waiters.h"

#include "strata/buf.h"

#include <stdlib.h>

/* A parked long-poll connection. */
typedef struct waiter {
    void *conn;
    int64_t deadline_ms;
} waiter;

struct srv_waiters {
    waiter *v;
    size_t n, cap;
    int closed; /* the engine stops: nothing is parked any more */
    srv_waiter_fn suspend, resume;
};

int srv__waiters_new(srv_waiters **out)
{
    *out = calloc(1, sizeof(**out));
    return *out != NULL ? STRATA_OK : STRATA_ENOMEM;
}

void srv__waiters_free(srv_waiters *w)
{
    if (w == NULL)
        return;
    free(w->v);
    free(w);
}

void srv__waiters_set(srv_waiters *w, srv_waiter_fn suspend, srv_waiter_fn resume)
{
    w->suspend = suspend;
    w->resume = resume;
}

int srv__waiters_park(srv_waiters *w, void *conn, int64_t deadline_ms)
{
    if (w->closed)
        return 0;
    waiter *v = strata_array_grow(w->v, &w->cap, w->n + 1, sizeof(*v));
    if (v == NULL)
        return 0;
    w->v = v;
    w->v[w->n].conn = conn;
    w->v[w->n++].deadline_ms = deadline_ms;
    w->suspend(conn);
    return 1;
}

void srv__waiters_gone(srv_waiters *w, void *conn)
{
    for (size_t i = 0; i < w->n; i++)
        if (w->v[i].conn == conn) {
            w->v[i] = w->v[--w->n];
            break;
        }
}

void srv__waiters_wake_all(srv_waiters *w)
{
    for (size_t i = 0; i < w->n; i++)
        w->resume(w->v[i].conn);
    w->n = 0;
}

void srv__waiters_wake_expired(srv_waiters *w, int64_t now)
{
    size_t j = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (w->v[i].deadline_ms <= now)
            w->resume(w->v[i].conn);
        else
            w->v[j++] = w->v[i];
    }
    w->n = j;
}

void srv__waiters_close(srv_waiters *w)
{
    w->closed = 1;
    srv__waiters_wake_all(w);
}
