/* The round lifecycle (see round.h).
 *
 * Rounds and model versions advance together: round R trains model version R
 * and its close produces version R + 1. A round opens once at least
 * min_clients are registered; it closes when every selected client reported,
 * or when its deadline passed and at least min_updates were accepted. A round
 * whose deadline passes with fewer updates keeps waiting (the deadline is
 * effectively extended until min_updates arrive); late uploads for a closed
 * round are refused as round_closed.
 *
 * Crash consistency: the new checkpoint is recorded before the round is
 * closed in the store. On start, an open round whose model version is older
 * than the latest checkpoint was already aggregated: it is closed (with a
 * summary marked "recovered") instead of being replayed. Otherwise the open
 * round's acknowledged updates are replayed into the aggregator in the order
 * they were accepted.
 *
 * May call: the store, aggregate.h, robust.h, models.h, metrics.h,
 * registry.h (sorted ids), libstrata (checkpoint, train, policy, payload,
 * rng, clock, log, the task and round-summary codecs). */
#include "round.h"

#include "engine_internal.h"

#include "strata/buf.h"
#include "strata/checkpoint.h"
#include "strata/clock.h"
#include "strata/log.h"
#include "strata/rng.h"
#include "strata/summary.h"
#include "strata/task.h"
#include "strata/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TICK_MS 100

/* ---- the task document ---------------------------------------------------- */

/* The task JSON of round r, through the task codec (strata/task.h). Errors:
 * as strata_task_encode. */
static int task_encode(const srv_engine *e, uint32_t r, int64_t deadline, const strata_budget *b,
                       uint64_t seed, char **out, strata_diag *d)
{
    const srv_config *c = e->cfg;
    strata_task t = {.round = r,
                     .total_rounds = (uint32_t)c->rounds,
                     .model_version = e->version,
                     .deadline_unix_ms = deadline,
                     .values_format = c->values_format,
                     .num_layers = e->nlayers,
                     .layer_names = e->names,
                     .budgets = (strata_budget *)b,
                     .train = {.epochs = (uint32_t)c->local_epochs,
                               .batch = (uint32_t)c->batch,
                               .lr = c->lr,
                               .momentum = c->momentum,
                               .weight_decay = c->weight_decay,
                               .prox_mu = c->prox_mu,
                               .max_steps = (uint64_t)c->max_steps},
                     .seed = seed};
    size_t len;
    return strata_task_encode(&t, out, &len, d);
}

/* Reads the per-layer budgets back from a stored task JSON into b
 * (e->nlayers entries). Errors: STRATA_EPROTO (not a task of this model). */
static int task_decode_budgets(const srv_engine *e, const char *task_json, strata_budget *b,
                               strata_diag *d)
{
    strata_task t;
    strata_task_limits lim = {.max_layers = e->nlayers};
    int rc = strata_task_decode(task_json, strlen(task_json), &lim, &t, d);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < t.num_layers && rc == 0; i++)
        if (strcmp(t.layer_names[i], e->names[i]) != 0)
            rc = strata_diag_set(d, STRATA_EPROTO, "budgets[%zu]: layer \"%s\" is not \"%s\"", i,
                                 t.layer_names[i], e->names[i]);
    if (rc == 0 && t.num_layers != e->nlayers)
        rc = strata_diag_set(d, STRATA_EPROTO, "%zu budgets for %zu layers", t.num_layers,
                             e->nlayers);
    if (rc == 0)
        memcpy(b, t.budgets, e->nlayers * sizeof(*b));
    strata_task_cleanup(&t);
    return rc;
}

/* ---- the summary document -------------------------------------------------- */

int srv__summary_text(const srv_engine *e, strata_round_summary *s, char **out, strata_diag *d)
{
    *out = NULL;
    double *dens = NULL;
    if (s->has_densities) {
        dens = calloc(e->nlayers ? e->nlayers : 1, sizeof(*dens));
        if (dens == NULL)
            return strata_diag_set(d, STRATA_ENOMEM, "out of memory");
        for (size_t i = 0; i < e->nlayers; i++)
            dens[i] = e->budgets != NULL ? e->budgets[i].density : 1.0;
        s->num_layers = e->nlayers;
        s->layer_names = e->names;
        s->densities = dens;
    }
    size_t len;
    int rc = strata_round_summary_encode(s, out, &len, d);
    s->layer_names = NULL;
    s->densities = NULL;
    s->num_layers = 0;
    free(dens);
    return rc;
}

int srv__summary_stopped(const char *text, int *stopped)
{
    *stopped = 0;
    strata_round_summary s;
    int rc = strata_round_summary_decode(text, strlen(text), NULL, &s, NULL);
    if (rc == 0)
        *stopped = s.stopped;
    strata_round_summary_cleanup(&s);
    return rc;
}

/* The stored summary of the open round, before its statistics exist. */
static strata_round_summary summary_of_open(const srv_engine *e)
{
    strata_round_summary s = {.round = e->next_round,
                              .state = STRATA_ROUND_CLOSED,
                              .model_version = e->version,
                              .selected = e->nselected,
                              .participants = e->nreported};
    return s;
}

/* ---- waiters --------------------------------------------------------------- */

void srv__waiters_wake_all(srv_engine *e)
{
    for (size_t i = 0; i < e->nwaiters; i++)
        e->resume(e->waiters[i].conn);
    e->nwaiters = 0;
}

/* Wakes the waiters whose wait ended by now. Lock held. */
static void wake_expired(srv_engine *e, int64_t now)
{
    size_t j = 0;
    for (size_t i = 0; i < e->nwaiters; i++) {
        if (e->waiters[i].deadline_ms <= now)
            e->resume(e->waiters[i].conn);
        else
            e->waiters[j++] = e->waiters[i];
    }
    e->nwaiters = j;
}

int srv_engine_task(srv_engine *e, uint64_t client_id, int64_t deadline_ms, void *conn, int *parked,
                    srv_result *r)
{
    *parked = 0;
    pthread_mutex_lock(&e->mu);
    srv__registry_seen(e, client_id);
    if (e->finished) {
        int stopped = e->stopped;
        pthread_mutex_unlock(&e->mu);
        if (stopped)
            srv_result_error(r, SRV_E_FINISHED, "the federation was stopped by its operator");
        else
            srv_result_error(r, SRV_E_FINISHED, "the federation has completed all %ld rounds",
                             e->cfg->rounds);
        return STRATA_OK;
    }
    ptrdiff_t k = e->open && !e->closing ? srv__id_find(e->selected, e->nselected, client_id) : -1;
    if (k >= 0 && !e->reported[k]) {
        char *t = strdup(e->task_json);
        pthread_mutex_unlock(&e->mu);
        srv_result_take(r, SRV_OK, SRV_MEDIA_JSON, (uint8_t *)t, t ? strlen(t) : 0);
        return STRATA_OK;
    }
    if (!e->stopping && conn != NULL && strata_clock_unix_ms() < deadline_ms) {
        srv_waiter *w = strata_array_grow(e->waiters, &e->capwaiters, e->nwaiters + 1, sizeof(*w));
        if (w == NULL)
            goto no_task;
        e->waiters = w;
        e->waiters[e->nwaiters].conn = conn;
        e->waiters[e->nwaiters++].deadline_ms = deadline_ms;
        e->suspend(conn);
        pthread_mutex_unlock(&e->mu);
        *parked = 1;
        return STRATA_OK;
    }
no_task:
    pthread_mutex_unlock(&e->mu);
    srv_result_take(r, SRV_NO_CONTENT, SRV_MEDIA_NONE, NULL, 0);
    r->retry_after = 1;
    return STRATA_OK;
}

void srv_engine_waiter_gone(srv_engine *e, void *conn)
{
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; i < e->nwaiters; i++)
        if (e->waiters[i].conn == conn) {
            e->waiters[i] = e->waiters[--e->nwaiters];
            break;
        }
    pthread_mutex_unlock(&e->mu);
}

/* ---- open ------------------------------------------------------------------ */

void srv__round_reset(srv_engine *e)
{
    free(e->selected);
    free(e->reported);
    free(e->budgets);
    free(e->task_json);
    e->selected = NULL;
    e->reported = NULL;
    e->budgets = NULL;
    e->task_json = NULL;
    e->nselected = e->nreported = 0;
    e->open = 0;
    e->uplink = e->downlink = 0;
    strata_agg_reset(e->agg);
}

/* Opens round e->next_round. Lock held. */
static int open_round(srv_engine *e, strata_diag *d)
{
    const srv_config *c = e->cfg;
    uint32_t r = e->next_round;
    size_t n = e->nclients, k = n;
    if (c->clients_per_round > 0)
        k = (size_t)c->clients_per_round < n ? (size_t)c->clients_per_round : n;
    else if (c->fraction > 0) {
        k = (size_t)ceil(c->fraction * (double)n);
        k = k < 1 ? 1 : k > n ? n : k;
    }
    int rc = STRATA_ENOMEM;
    uint64_t *sel = malloc(n * sizeof(*sel));
    strata_budget *b = calloc(e->nlayers, sizeof(*b));
    uint8_t *rep = calloc(k, 1);
    char *tj = NULL;
    if (sel == NULL || b == NULL || rep == NULL)
        goto fail;
    memcpy(sel, e->clients, n * sizeof(*sel));
    strata_rng rng;
    strata_rng_seed(&rng, (uint64_t)c->seed, 0x5e1ec7ULL + r);
    for (size_t i = 0; i < k; i++) {
        size_t j = i + (size_t)strata_rng_below(&rng, n - i);
        uint64_t t = sel[i];
        sel[i] = sel[j];
        sel[j] = t;
    }
    srv__id_sort(sel, k);
    if (e->policy == NULL) {
        for (size_t i = 0; i < e->nlayers; i++) {
            b[i].comp = STRATA_COMP_NONE;
            b[i].density = 1.0;
        }
    } else if ((rc = strata_policy_budgets(e->policy, e->numel, e->nlayers, c->density, r,
                                           (uint32_t)c->rounds, b, d)) < 0) {
        goto fail;
    }
    int64_t now = strata_clock_unix_ms();
    int64_t deadline = now + (int64_t)(c->round_deadline * 1000.0);
    uint64_t seed = strata_mix64((uint64_t)c->seed ^ strata_mix64(r)) & ((1ULL << 53) - 1);
    if ((rc = task_encode(e, r, deadline, b, seed, &tj, d)) < 0)
        goto fail;
    if ((rc = strata_store_round_open(e->store, r, e->version, sel, k, deadline, tj, d)) < 0)
        goto fail;
    srv__registry_flush_seen(e);
    srv__round_reset(e);
    e->selected = sel;
    e->nselected = k;
    e->reported = rep;
    e->budgets = b;
    e->task_json = tj;
    e->opened_ms = now;
    e->deadline_ms = deadline;
    e->open = 1;
    return 0;
fail:
    free(tj);
    free(sel);
    free(b);
    free(rep);
    return rc;
}

/* ---- close ----------------------------------------------------------------- */

/* Lock held. */
static int ready_to_close(const srv_engine *e, int64_t now)
{
    /* Not while a group commit is in flight: its updates are acknowledged
     * only after they are aggregated. */
    if (!e->open || e->closing || e->committing || e->nreported == 0)
        return 0;
    if (e->nreported == e->nselected)
        return 1;
    return now >= e->deadline_ms && e->nreported >= (size_t)e->cfg->min_updates;
}

/* The round's coordinate-wise robust aggregate (trimmed mean or median) of
 * its accepted updates, read back from the store, each once, into delta.
 * The robust rules need every update at once; the FedAvg accumulator is
 * not fed for them (upload.c). Called without the lock while the round is
 * closing: it uses the second store connection, which group commits leave
 * alone then. */
static int robust_mean(srv_engine *e, strata_tensor_list *delta, strata_diag *d)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(e->wstore, e->next_round, &ups, &n, d);
    strata_payload **ps = rc == 0 ? calloc(n ? n : 1, sizeof(*ps)) : NULL;
    strata_robust_update *ru = rc == 0 ? calloc(n ? n : 1, sizeof(*ru)) : NULL;
    if (rc == 0 && (ps == NULL || ru == NULL))
        rc = STRATA_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        rc = strata_store_update_read(e->wstore, e->next_round, ups[i].client_id, &buf, &len, d);
        if (rc == 0)
            rc = strata_payload_decode(buf, len, &e->limits, &ps[i], d);
        free(buf);
        if (rc == 0) {
            ru[i].layers = ps[i]->layers;
            ru[i].n_layers = ps[i]->num_layers;
        }
    }
    if (rc == 0)
        rc = strata_robust_aggregate(strata_model_params(e->model), ru, n, e->method,
                                     e->cfg->trim_fraction, e->cfg->clip_norm, delta, d);
    for (size_t i = 0; ps != NULL && i < n; i++)
        strata_payload_free(ps[i]);
    free(ps);
    free(ru);
    strata_store_update_list_free(ups, n);
    return rc;
}

/* Stops serving rounds after a failure that retrying cannot mend. Lock
 * held. */
static void give_up(srv_engine *e)
{
    e->closing = 0;
    e->open = 0;
    e->finished = 1;
    srv__waiters_wake_all(e);
}

/* Closes the open round: aggregate, server step, checkpoint, evaluation,
 * store. Called by the round thread with the lock held; drops it while
 * saving and evaluating (uploads for the round are refused meanwhile). */
static void close_round(srv_engine *e)
{
    strata_diag d = {{0}};
    uint32_t r = e->next_round;
    uint64_t v = e->version + 1;
    strata_tensor_list *params = strata_model_params(e->model);
    strata_tensor_list delta;
    strata_tensor_list_init(&delta);
    double t0 = strata_clock_mono_s();
    int rc = strata_tensor_list_zeros_like(&delta, params);
    /* From here no update of this round can be accepted (closing; no group
     * commit is in flight, see ready_to_close), so the round's stored
     * updates are final: the robust rules read them without the lock. */
    e->closing = 1;
    if (rc == 0 && e->method == STRATA_ROBUST_FEDAVG) {
        rc = strata_agg_mean(e->agg, &delta, &d);
    } else if (rc == 0) {
        pthread_mutex_unlock(&e->mu);
        rc = robust_mean(e, &delta, &d);
        pthread_mutex_lock(&e->mu);
    }
    if (rc == 0)
        rc = strata_server_opt_step(e->opt, params, &delta, &d);
    strata_tensor_list_cleanup(&delta);
    if (rc < 0) {
        /* Retrying cannot help (the same updates give the same failure):
         * stop serving rounds, loudly, instead of looping. */
        strata_log_error("round %u: aggregation failed: %s; no further rounds", r,
                         strata_diag_msg(&d, rc));
        give_up(e);
        return;
    }
    double agg_s = strata_clock_mono_s() - t0;
    pthread_mutex_unlock(&e->mu);

    char path[4096], opath[4200];
    srv_model_blob blob = {0};
    strata_train_stats st = {0};
    rc = strata_store_checkpoint_path(e->store, v, path, sizeof(path), &d);
    if (rc == 0)
        rc = strata_checkpoint_save(e->model, path, &d);
    if (rc == 0) {
        srv__opt_path(e, v, opath, sizeof(opath));
        rc = strata_server_opt_save(e->opt, opath, &d);
    }
    if (rc == 0)
        rc = strata_evaluate(e->model, &e->test, NULL, 0, 256, &st);
    if (rc == 0)
        rc = srv__model_encode(e, &blob, &d);

    pthread_mutex_lock(&e->mu);
    if (rc == 0)
        rc = strata_store_checkpoint_record(e->store, v, &d);
    int64_t dur = strata_clock_unix_ms() - e->opened_ms;
    if (rc == 0) {
        strata_round_summary s = summary_of_open(e);
        s.has_stats = s.has_densities = 1;
        s.accuracy = st.accuracy;
        s.loss = st.loss;
        s.uplink_bytes = e->uplink;
        s.downlink_bytes = e->downlink;
        s.dense_uplink_bytes = e->nreported * e->total_params * 4;
        s.duration_ms = dur > 0 ? (uint64_t)dur : 0;
        char *sum = NULL;
        rc = srv__summary_text(e, &s, &sum, &d);
        if (rc == 0)
            rc = strata_store_round_close(e->store, r, sum, &d);
        free(sum);
    }
    if (rc < 0) {
        /* The model in memory moved on but nothing durable says so: stop
         * serving rounds rather than diverge from the state directory. */
        strata_log_error("round %u: closing failed: %s; no further rounds", r,
                         strata_diag_msg(&d, rc));
        srv__model_blob_cleanup(&blob);
        give_up(e);
        return;
    }
    srv__model_install(e, &blob);
    e->version = v;
    e->last_acc = st.accuracy;
    e->last_loss = st.loss;
    e->last_agg_s = agg_s;
    e->last_round_s = (double)dur / 1000.0;
    e->have_last = 1;
    srv__ctr_add(e, SRV_CTR_ROUNDS, 1);
    srv__metrics_flush(e);
    /* Progress lines stay on stdout, in this form: operators and tests read
     * them. */
    printf("round %u/%ld: %zu updates, accuracy %.4f, loss %.4f, uplink %llu bytes, %lld ms\n", r,
           e->cfg->rounds, e->nreported, st.accuracy, st.loss, (unsigned long long)e->uplink,
           (long long)dur);
    fflush(stdout);
    srv__round_reset(e);
    e->closing = 0;
    e->next_round = r + 1;
    if (e->next_round >= (uint32_t)e->cfg->rounds) {
        e->finished = 1;
        printf("strata-server: finished %ld rounds\n", e->cfg->rounds);
        fflush(stdout);
    }
    srv__waiters_wake_all(e);
}

void *srv__round_thread(void *arg)
{
    srv_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stopping) {
        int64_t now = strata_clock_unix_ms();
        if (!e->finished && !e->paused && !e->open && e->nclients >= (size_t)e->cfg->min_clients) {
            strata_diag d = {{0}};
            int rc = open_round(e, &d);
            if (rc < 0)
                strata_log_error("opening round %u: %s", e->next_round, strata_diag_msg(&d, rc));
            else
                srv__waiters_wake_all(e);
        }
        if (ready_to_close(e, now))
            close_round(e);
        wake_expired(e, strata_clock_unix_ms());
        struct timespec ts = strata_clock_abstime_in(TICK_MS);
        if (!e->stopping)
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int srv__round_abandon(srv_engine *e, strata_diag *d)
{
    if (!e->open)
        return 0;
    strata_round_summary s = summary_of_open(e);
    s.stopped = 1;
    char *t = NULL;
    int rc = srv__summary_text(e, &s, &t, d);
    if (rc == 0)
        rc = strata_store_round_close(e->store, e->next_round, t, d);
    free(t);
    if (rc == 0) {
        srv__round_reset(e);
        e->next_round++;
    }
    return rc;
}

/* ---- resume ---------------------------------------------------------------- */

/* Sets the rounds-completed and updates-accepted counters from the store:
 * every acknowledged update has its row, every aggregated round its closed
 * record (a round an operator stopped is closed but was not aggregated). */
static int count_from_store(srv_engine *e, strata_diag *d)
{
    int64_t rounds = 0, accepted = 0;
    uint32_t from = 0;
    for (;;) {
        strata_store_round *rs = NULL;
        size_t n = 0;
        int rc = strata_store_round_list(e->store, from, 1000, &rs, &n, d);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < n; i++) {
            accepted += (int64_t)rs[i].n_updates;
            int stopped = 0;
            if (rs[i].state == STRATA_STORE_ROUND_CLOSED &&
                (rs[i].summary_json == NULL ||
                 srv__summary_stopped(rs[i].summary_json, &stopped) < 0 || !stopped))
                rounds++;
            from = rs[i].round + 1;
        }
        strata_store_round_list_free(rs, n);
        if (n < 1000)
            break;
    }
    e->ctr[SRV_CTR_ROUNDS] = rounds;
    e->ctr[SRV_CTR_ACCEPTED] = accepted;
    return 0;
}

/* Replays the acknowledged updates of the open round: into the FedAvg
 * aggregate (each decoded once), or, for a robust rule, only as reported
 * (close reads them). */
static int replay_updates(srv_engine *e, strata_diag *d)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(e->store, e->next_round, &ups, &n, d);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint8_t *buf = NULL;
        size_t len = (size_t)ups[i].receipt.bytes;
        strata_payload *p = NULL;
        if (e->method == STRATA_ROBUST_FEDAVG) {
            rc = strata_store_update_read(e->store, e->next_round, ups[i].client_id, &buf, &len, d);
            if (rc == 0)
                rc = strata_payload_decode(buf, len, &e->limits, &p, d);
            if (rc == 0)
                rc = strata_agg_add_clipped(e->agg, p->layers, p->num_layers,
                                            (double)ups[i].receipt.samples, e->cfg->clip_norm, NULL,
                                            d);
        }
        ptrdiff_t k = srv__id_find(e->selected, e->nselected, ups[i].client_id);
        if (rc == 0 && k >= 0 && !e->reported[k]) {
            e->reported[k] = 1;
            e->nreported++;
            e->uplink += len;
        }
        strata_payload_free(p);
        free(buf);
    }
    strata_store_update_list_free(ups, n);
    return rc;
}

static int resume_state(srv_engine *e, strata_diag *d)
{
    uint32_t last = 0;
    int found = 0;
    int rc = strata_store_last_round(e->store, &last, &found, d);
    if (rc < 0 || !found)
        return rc;
    strata_store_round rd;
    memset(&rd, 0, sizeof(rd));
    int f2 = 0;
    if ((rc = strata_store_round_get(e->store, last, &rd, &f2, d)) < 0)
        return rc;
    e->next_round = last + 1;
    if (rd.state == STRATA_STORE_ROUND_OPEN) {
        if (rd.model_version < e->version) {
            /* Aggregated and checkpointed before the crash: just close it. */
            strata_round_summary s = {.round = last,
                                      .state = STRATA_ROUND_CLOSED,
                                      .model_version = rd.model_version,
                                      .selected = rd.n_selected,
                                      .participants = rd.n_updates,
                                      .recovered = 1};
            char *t = NULL;
            rc = srv__summary_text(e, &s, &t, d);
            if (rc == 0)
                rc = strata_store_round_close(e->store, last, t, d);
            free(t);
        } else {
            e->next_round = last;
            e->selected = rd.selected;
            rd.selected = NULL;
            e->nselected = rd.n_selected;
            e->task_json = rd.task_json;
            rd.task_json = NULL;
            e->opened_ms = rd.opened_unix_ms;
            e->deadline_ms = rd.deadline_unix_ms;
            e->reported = calloc(e->nselected ? e->nselected : 1, 1);
            e->budgets = calloc(e->nlayers, sizeof(*e->budgets));
            if (e->reported == NULL || e->budgets == NULL || e->task_json == NULL)
                rc = STRATA_ENOMEM;
            strata_diag td;
            if (rc == 0 && task_decode_budgets(e, e->task_json, e->budgets, &td) < 0)
                rc = strata_diag_set(d, STRATA_EPROTO, "round %u: unreadable task: %s", last,
                                     td.msg);
            e->open = 1;
            if (rc == 0)
                rc = replay_updates(e, d);
        }
    }
    strata_store_round_cleanup(&rd);
    return rc;
}

int srv__round_resume(srv_engine *e, strata_diag *d)
{
    int rc = resume_state(e, d);
    return rc < 0 ? rc : count_from_store(e, d);
}
