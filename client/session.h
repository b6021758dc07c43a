/* The client's session with the coordinator: registration (POST
 * /v1/clients) and the task long-poll (GET /v1/tasks/next), each turned
 * into a typed result. The protocol is schemas/api.md. */
#ifndef STRATA_CLIENT_SESSION_H
#define STRATA_CLIENT_SESSION_H

#include "state.h"
#include "transport.h"

#include "strata/error.h"
#include "strata/task.h"

/* Largest JSON answer read from the coordinator. */
#define STRATA_CLIENT_MAX_JSON ((size_t)1 << 20)

/* Registers with the coordinator at server (borrowed; saved beside the
 * identity) through h, sending name and the enrolment secret (both
 * borrowed, may be NULL), and saves the identity it gets in st. *id is
 * zeroed on entry. Logs why it failed. Errors: those of the transport,
 * STRATA_EPROTO (refused, or an answer without a client id and token),
 * those of strata_client_state_save_identity. */
int strata_client_session_register(strata_http *h, strata_client_state *st, const char *server,
                                   const char *name, const char *secret,
                                   strata_client_identity *id);

/* What one task poll gave. */
typedef enum {
    STRATA_CLIENT_POLL_TASK = 0,     /* a task: *task holds it */
    STRATA_CLIENT_POLL_NONE = 1,     /* none yet: poll again after *retry_after s */
    STRATA_CLIENT_POLL_FINISHED = 2, /* the federation has finished (410) */
    STRATA_CLIENT_POLL_UNKNOWN = 3   /* the coordinator refused our token (401) */
} strata_client_poll;

/* Long-polls for the next task, waiting up to wait_s seconds at the
 * coordinator (transient failures are retried until stopped). *outcome,
 * *task (release with strata_task_cleanup) and *retry_after are zeroed on
 * entry. Logs why it failed. Errors: those of the transport (STRATA_ESTATE
 * when stopped), STRATA_EPROTO for any other status or a task that
 * strata_task_decode refuses. */
int strata_client_session_poll(strata_http *h, long wait_s, strata_client_poll *outcome,
                               strata_task *task, double *retry_after);

#endif
