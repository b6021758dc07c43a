/* Admin controls and the admin configuration view (see admin.h): pause,
 * resume and stop, persisted as store counters so that they survive
 * restarts, and the full configuration for GET /v1/admin/config. This file
 * alone touches struct srv_admin. */
#include "admin.h"

#include "result_internal.h"

#include "strata/log.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Persistent federation controls (admin pause and stop), kept as counters. */
#define CONTROL_PAUSED "control_paused"
#define CONTROL_STOPPED "control_stopped"

struct srv_admin {
    srv_admin_config c;
    int paused, stopped;
};

const char *srv__admin_state_name(const srv_admin *a)
{
    return a->stopped                         ? "stopped"
           : srv__round_finished(a->c.rounds) ? "finished"
           : a->paused                        ? "paused"
           : srv__round_is_open(a->c.rounds)  ? "running"
                                              : "waiting";
}

int srv__admin_paused(const srv_admin *a)
{
    return a->paused;
}

int srv__admin_stopped(const srv_admin *a)
{
    return a->stopped;
}

int srv__admin_new(const srv_admin_config *c, srv_admin **out, strata_diag *d)
{
    *out = NULL;
    srv_admin *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return STRATA_ENOMEM;
    a->c = *c;
    int64_t paused = 0, stopped = 0;
    int rc;
    if ((rc = strata_store_counter_get(c->store, CONTROL_PAUSED, &paused, d)) < 0 ||
        (rc = strata_store_counter_get(c->store, CONTROL_STOPPED, &stopped, d)) < 0) {
        free(a);
        return rc;
    }
    a->paused = paused != 0;
    a->stopped = stopped != 0;
    *out = a;
    return 0;
}

void srv__admin_free(srv_admin *a)
{
    free(a);
}

/* Sets a persistent control counter to value. Lock held. */
static int control_set(srv_admin *a, const char *name, int *field, int value, strata_diag *d)
{
    if (*field == value)
        return 0;
    int rc = strata_store_counter_add(a->c.store, name, value - *field, d);
    if (rc == 0)
        *field = value;
    return rc;
}

/* An admin stop: waits for the group commit in flight (no new batch starts
 * meanwhile), then persists the stop, abandons the open round and ends the
 * federation; a failed stop changes nothing. Lock held. */
static int admin_stop(srv_admin *a, strata_diag *d)
{
    srv__uploads_quiesce(a->c.uploads);
    int was = a->stopped;
    int rc = control_set(a, CONTROL_STOPPED, &a->stopped, 1, d);
    if (rc == 0 && (rc = srv__round_abandon(a->c.rounds, d)) < 0) {
        strata_diag ud = {{0}}; /* undo: a failed stop changes nothing */
        control_set(a, CONTROL_STOPPED, &a->stopped, was, &ud);
    }
    if (rc == 0)
        srv__round_finish(a->c.rounds, 1);
    return rc;
}

void srv__admin_action(srv_admin *a, const char *action, const uint8_t *body, size_t len,
                       srv_result *r)
{
    strata_diag d = {{0}};
    srv_reason_req rq;
    int rc = srv_request_reason(body, len, a->c.jlim, &rq, &d);
    if (rc < 0) {
        srv__result_bad_body(r, rc, &d);
        return;
    }
    const char *reason = rq.has_reason ? rq.reason : NULL;
    pthread_mutex_lock(a->c.mu);
    if (strcmp(action, "pause") == 0) {
        rc = control_set(a, CONTROL_PAUSED, &a->paused, 1, &d);
    } else if (strcmp(action, "resume") == 0) {
        rc = control_set(a, CONTROL_PAUSED, &a->paused, 0, &d);
    } else if (strcmp(action, "stop") == 0) {
        /* Refused only while a close attempt runs; a close waiting for its
         * retry is abandoned like an open round. */
        if (!a->stopped && srv__round_close_busy(a->c.rounds)) {
            pthread_mutex_unlock(a->c.mu);
            srv_result_error(r, SRV_E_ROUND_CLOSING, "a round is being aggregated; try again");
            r->retry_after = 1;
            return;
        }
        rc = admin_stop(a, &d);
    } else {
        pthread_mutex_unlock(a->c.mu);
        srv_result_error(r, SRV_E_NOT_FOUND, "no admin action '%s'", action);
        return;
    }
    if (rc == 0) {
        strata_log_info("admin %s%s%s", action, reason ? ": " : "", reason ? reason : "");
        pthread_cond_broadcast(a->c.wake);
        srv__waiters_wake_all(a->c.waiters);
    }
    const char *state = srv__admin_state_name(a);
    pthread_mutex_unlock(a->c.mu);
    /* The store failing to write (STRATA_EIO: storage full or failing)
     * passes; the control is unchanged and the operator may retry. */
    if (rc == STRATA_EIO)
        srv_result_unavailable(r, action, strata_diag_msg(&d, rc));
    else if (rc < 0)
        srv_result_internal(r, strata_diag_msg(&d, rc));
    else
        srv__result_json(r, SRV_OK, json_pack("{s:s}", "state", state));
}

void srv__admin_config_view(const srv_admin *a, srv_result *r)
{
    char *cj = srv_config_json(a->c.cfg, 1);
    json_t *cfg = cj ? json_loads(cj, 0, NULL) : NULL;
    free(cj);
    if (cfg == NULL) {
        srv_result_error(r, SRV_E_INTERNAL, "out of memory");
        return;
    }
    srv__result_json(r, SRV_OK, json_pack("{s:o}", "config", cfg));
}
