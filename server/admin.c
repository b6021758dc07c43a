/* Admin controls and the admin configuration view: pause, resume and stop,
 * persisted as store counters so that they survive restarts, and the full
 * configuration for GET /v1/admin/config. Its part of struct srv_engine is
 * marked in engine_internal.h.
 *
 * May call: the store (counters), request.h (the action body), round.h (an
 * admin stop abandons the open round), config.h, libstrata (log) and
 * jansson. */
#include "engine_internal.h"

#include "strata/log.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Persistent federation controls (admin pause and stop), kept as counters. */
#define CONTROL_PAUSED "control_paused"
#define CONTROL_STOPPED "control_stopped"

const char *srv__state_name(const srv_engine *e)
{
    return e->stopped    ? "stopped"
           : e->finished ? "finished"
           : e->paused   ? "paused"
           : e->open     ? "running"
                         : "waiting";
}

int srv__admin_load(srv_engine *e, strata_diag *d)
{
    int64_t paused = 0, stopped = 0;
    int rc;
    if ((rc = strata_store_counter_get(e->store, CONTROL_PAUSED, &paused, d)) < 0 ||
        (rc = strata_store_counter_get(e->store, CONTROL_STOPPED, &stopped, d)) < 0)
        return rc;
    e->paused = paused != 0;
    e->stopped = stopped != 0;
    return 0;
}

/* Sets a persistent control counter to value. Lock held. */
static int control_set(srv_engine *e, const char *name, int *field, int value, strata_diag *d)
{
    if (*field == value)
        return 0;
    int rc = strata_store_counter_add(e->store, name, value - *field, d);
    if (rc == 0)
        *field = value;
    return rc;
}

/* An admin stop: waits for the group commit in flight (no new batch starts
 * meanwhile), then persists the stop and abandons the open round; a failed
 * stop changes nothing. Lock held. */
static int admin_stop(srv_engine *e, strata_diag *d)
{
    e->stopping_round = 1; /* no new batch starts */
    while (e->committing)
        pthread_cond_wait(&e->commit_cv, &e->mu);
    e->stopping_round = 0;
    int was = e->stopped;
    int rc = control_set(e, CONTROL_STOPPED, &e->stopped, 1, d);
    if (rc == 0 && (rc = srv__round_abandon(e, d)) < 0) {
        strata_diag ud = {{0}}; /* undo: a failed stop changes nothing */
        control_set(e, CONTROL_STOPPED, &e->stopped, was, &ud);
    }
    if (rc == 0)
        e->finished = 1;
    return rc;
}

void srv_engine_admin(srv_engine *e, const char *action, const uint8_t *body, size_t len,
                      srv_result *r)
{
    strata_diag d = {{0}};
    srv_reason_req rq;
    int rc = srv_request_reason(body, len, &e->jlim, &rq, &d);
    if (rc < 0) {
        srv__result_bad_body(r, rc, &d);
        return;
    }
    const char *reason = rq.has_reason ? rq.reason : NULL;
    pthread_mutex_lock(&e->mu);
    if (strcmp(action, "pause") == 0) {
        rc = control_set(e, CONTROL_PAUSED, &e->paused, 1, &d);
    } else if (strcmp(action, "resume") == 0) {
        rc = control_set(e, CONTROL_PAUSED, &e->paused, 0, &d);
    } else if (strcmp(action, "stop") == 0) {
        /* Refused only while a close attempt runs; a close waiting for its
         * retry is abandoned like an open round. */
        if (!e->stopped && e->close_busy) {
            pthread_mutex_unlock(&e->mu);
            srv_result_error(r, SRV_E_ROUND_CLOSING, "a round is being aggregated; try again");
            r->retry_after = 1;
            return;
        }
        rc = admin_stop(e, &d);
    } else {
        pthread_mutex_unlock(&e->mu);
        srv_result_error(r, SRV_E_NOT_FOUND, "no admin action '%s'", action);
        return;
    }
    if (rc == 0) {
        strata_log_info("admin %s%s%s", action, reason ? ": " : "", reason ? reason : "");
        pthread_cond_broadcast(&e->cv);
        srv__waiters_wake_all(e);
    }
    const char *state = srv__state_name(e);
    pthread_mutex_unlock(&e->mu);
    /* The store failing to write (STRATA_EIO: storage full or failing)
     * passes; the control is unchanged and the operator may retry. */
    if (rc == STRATA_EIO)
        srv_result_unavailable(r, action, strata_diag_msg(&d, rc));
    else if (rc < 0)
        srv_result_internal(r, strata_diag_msg(&d, rc));
    else
        srv__result_json(r, SRV_OK, json_pack("{s:s}", "state", state));
}

void srv_engine_admin_config(srv_engine *e, srv_result *r)
{
    char *cj = srv_config_json(e->cfg, 1);
    json_t *cfg = cj ? json_loads(cj, 0, NULL) : NULL;
    free(cj);
    if (cfg == NULL) {
        srv_result_error(r, SRV_E_INTERNAL, "out of memory");
        return;
    }
    srv__result_json(r, SRV_OK, json_pack("{s:o}", "config", cfg));
}
