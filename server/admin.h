/* The operator's controls (admin.c): pause, resume and stop, persisted as
 * store counters so that they survive restarts, the federation's state name
 * (/v1/status and admin answers), and the configuration view.
 *
 * admin.c owns the controls in its own structure (srv_admin), guarded by
 * the engine lock. An admin stop waits for the group commit in flight
 * (upload.h), abandons the open round and ends the federation (round.h),
 * and wakes the parked long-polls (waiters.h); nothing calls back into
 * admin.c but the engine's composition.
 *
 * May call: the store (counters), request.h (the action body), round.h,
 * upload.h, waiters.h, config.h, libstrata (log) and jansson. */
#ifndef STRATA_SERVER_ADMIN_H
#define STRATA_SERVER_ADMIN_H

#include "config.h"
#include "request.h"
#include "result.h"
#include "round.h"
#include "store.h"
#include "upload.h"
#include "waiters.h"

#include <pthread.h>

typedef struct srv_admin srv_admin;

/* What the controls are given at start-up (pointers borrowed). */
typedef struct srv_admin_config {
    const srv_config *cfg; /* for the configuration view only (srv_config_json) */
    const srv_json_limits *jlim;
    strata_store *store; /* used under the engine lock */
    pthread_mutex_t *mu;
    pthread_cond_t *wake; /* wakes the round thread */
    srv_rounds *rounds;
    srv_uploads *uploads;
    srv_waiters *waiters;
} srv_admin_config;

/* Reads the persisted controls into a new srv_admin. Start-up. Errors: the
 * store's, STRATA_ENOMEM. */
int srv__admin_new(const srv_admin_config *c, srv_admin **out, strata_diag *d);

/* Frees a. Accepts NULL. */
void srv__admin_free(srv_admin *a);

/* 1 while an operator has paused the federation (no new round opens).
 * Lock held. */
int srv__admin_paused(const srv_admin *a);

/* 1 once an operator has stopped the federation. Lock held. */
int srv__admin_stopped(const srv_admin *a);

/* The federation's state name: "stopped", "finished", "paused", "running"
 * or "waiting". Lock held. */
const char *srv__admin_state_name(const srv_admin *a);

/* srv_engine_admin and srv_engine_admin_config (engine.h). Each takes the
 * lock as it needs. */
void srv__admin_action(srv_admin *a, const char *action, const uint8_t *body, size_t len,
                       srv_result *r);
void srv__admin_config_view(const srv_admin *a, srv_result *r);

#endif
