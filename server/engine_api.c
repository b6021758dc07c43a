/* The engine's request calls (engine.h): each srv_engine_* call handed to
 * the module that answers it, with the lock taken here where the answer
 * composes two modules. The read views are views.c's.
 *
 * May call: registry.h, round.h, upload.h, models.h, admin.h, metrics.h,
 * waiters.h, lease.h, request.h and result_internal.h. */
#include "engine_internal.h"

#include "result_internal.h"

#include "strata/clock.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* ---- registry ---- */

int srv_engine_auth(srv_engine *e, const char *authorization, uint64_t *client_id, srv_result *r)
{
    return srv__registry_auth(e->reg, authorization, client_id, r);
}

int srv_engine_admin_auth(srv_engine *e, const char *authorization, srv_result *r)
{
    return srv__registry_admin_auth(e->reg, authorization, r);
}

void srv_engine_register(srv_engine *e, const char *peer, const uint8_t *body, size_t len,
                         srv_result *r)
{
    srv__registry_register(e->reg, peer, body, len, r);
}

int srv_engine_rate_take(srv_engine *e, uint64_t client_id, srv_result *r)
{
    return srv__registry_rate_take(e->reg, client_id, r);
}

/* ---- rounds ---- */

int srv_engine_task(srv_engine *e, uint64_t client_id, int64_t deadline_ms, void *waiter,
                    int *parked, srv_result *r)
{
    srv__round_task(e->rounds, client_id, deadline_ms, waiter, parked, r);
    return STRATA_OK;
}

void srv_engine_skip(srv_engine *e, uint64_t client_id, uint32_t round, const uint8_t *body,
                     size_t len, srv_result *r)
{
    srv_reason_req rq;
    strata_diag pd = {{0}};
    int prc = srv_request_reason(body, len, &e->jlim, &rq, &pd);
    if (prc < 0) {
        srv__result_bad_body(r, prc, &pd);
        return;
    }
    pthread_mutex_lock(&e->mu);
    /* A batch in flight may hold this client's update: decide after it. */
    srv__uploads_wait(e->uploads);
    srv__round_skip(e->rounds, client_id, round, rq.has_reason ? rq.reason : NULL, r);
    pthread_mutex_unlock(&e->mu);
}

void srv_engine_waiter_gone(srv_engine *e, void *waiter)
{
    pthread_mutex_lock(&e->mu);
    srv__waiters_gone(e->waiters, waiter);
    pthread_mutex_unlock(&e->mu);
}

/* ---- uploads ---- */

void srv_engine_upload(srv_engine *e, uint64_t client_id, uint32_t round, const uint8_t *body,
                       size_t len, void *conn, srv_upload **queued, srv_result *r)
{
    srv__uploads_upload(e->uploads, client_id, round, body, len, conn, queued, r);
}

void srv_engine_upload_answer(srv_engine *e, srv_upload *u, srv_result *r)
{
    srv__uploads_answer(e->uploads, u, r);
}

void srv_engine_upload_gone(srv_engine *e, srv_upload *u)
{
    srv__uploads_gone(e->uploads, u);
}

/* ---- models ---- */

void srv_engine_model_init(srv_engine *e, srv_result *r)
{
    srv__models_init(e->models, r);
}

void srv_engine_model_delta(srv_engine *e, uint64_t to, uint64_t from, const char *if_none_match,
                            srv_result *r)
{
    srv__models_delta(e->models, to, from, if_none_match, r);
}

void srv_engine_model(srv_engine *e, uint64_t version, int want_zstd, const char *if_none_match,
                      srv_result *r)
{
    srv__models_get(e->models, version, want_zstd, if_none_match, r);
}

/* ---- admin ---- */

void srv_engine_admin(srv_engine *e, const char *action, const uint8_t *body, size_t len,
                      srv_result *r)
{
    if (e->follower) { /* the leader's engine decides; its address is the operator's */
        srv_result_error(r, SRV_E_UNAVAILABLE,
                         "this coordinator (%s) follows; send admin actions to the one that "
                         "leads the store (GET /v1/health names it)",
                         e->holder);
        r->retry_after = 1;
        return;
    }
    srv__admin_action(e->admin, action, body, len, r);
}

void srv_engine_admin_config(srv_engine *e, srv_result *r)
{
    srv__admin_config_view(e->admin, r);
}

/* ---- metrics ---- */

void srv_engine_metrics(srv_engine *e, srv_result *r)
{
    pthread_mutex_lock(&e->mu);
    srv_metrics_live live = {.paused = srv__admin_paused(e->admin),
                             .close_pending = srv__round_close_pending(e->rounds),
                             .clients = srv__registry_count(e->reg),
                             .round = srv__round_current(e->rounds),
                             .model_version = srv__models_version(e->models)};
    live.replica = e->cfg->database != NULL;
    live.store_read_s = srv__replica_read_s(e->replica);
    if (e->lease != NULL) {
        srv_lease_gauges g;
        srv__lease_gauges(e->lease, &g);
        live.leading = 1;
        live.lease_epoch = g.epoch;
        live.lease_age_s = g.renewed_age_s;
        live.lease_renew_s = g.renew_s;
        live.lease_failures = g.renew_failures;
    }
    srv__metrics_text(e->met, &live, r);
    pthread_mutex_unlock(&e->mu);
}

void srv_engine_count_bytes(srv_engine *e, uint64_t in, uint64_t out)
{
    if (in)
        srv__ctr_add(e->met, SRV_CTR_BYTES_RX, (int64_t)in);
    if (out)
        srv__ctr_add(e->met, SRV_CTR_BYTES_TX, (int64_t)out);
}

void srv_engine_count_downlink(srv_engine *e, uint64_t len)
{
    pthread_mutex_lock(&e->mu);
    srv__round_count_downlink(e->rounds, len);
    pthread_mutex_unlock(&e->mu);
    srv__ctr_add(e->met, SRV_CTR_DOWNLINK, (int64_t)len);
}

void srv_engine_count_refused(srv_engine *e, srv_outcome o)
{
    srv__ctr_add(e->met, srv__metrics_refused_counter(o), 1);
}

void srv_engine_count_update_refused(srv_engine *e, srv_outcome o)
{
    srv_counter c = srv__metrics_update_refused_counter(o);
    if (c != SRV_CTR_COUNT)
        srv__ctr_add(e->met, c, 1);
}

/* ---- health ---- */

void srv_engine_health(srv_engine *e, srv_result *r)
{
    strata_store_leader now;
    memset(&now, 0, sizeof(now));
    double ms = 0;
    strata_diag d = {{0}};
    int rc = STRATA_OK;
    if (e->lease != NULL) {
        rc = srv__lease_health(e->lease, &now, &ms, &d);
    } else if (e->follower) {
        pthread_mutex_lock(&e->mu);
        double t0 = strata_clock_mono_s();
        rc = strata_store_leader_get(e->store, &now, &d);
        ms = (strata_clock_mono_s() - t0) * 1e3;
        pthread_mutex_unlock(&e->mu);
    } else {
        now.epoch = 1;
        snprintf(now.holder, sizeof(now.holder), "%s", "this coordinator");
    }
    if (rc < 0) {
        srv_result_error(r, SRV_E_UNAVAILABLE, "%s: %s",
                         e->follower ? "this follower cannot reach the store"
                                     : "this coordinator does not lead the store",
                         strata_diag_msg(&d, rc));
        return;
    }
    srv__result_json(
        r, SRV_OK,
        json_pack("{s:b, s:b, s:b, s:s, s:I, s:s, s:o, s:f}", "live", 1, "ready", 1, "leader",
                  !e->follower, "store", strata_store_backend(e->store), "epoch",
                  (json_int_t)now.epoch, "holder", now.holder, "lease_ms_left",
                  e->cfg->database != NULL ? json_integer(now.expires_in_ms) : json_null(),
                  "store_latency_ms", ms));
}
