/* The round lifecycle (see round.h): selection, opening, skips, the round
 * thread, resume; closing is close.c's.
 *
 * Rounds and model versions advance together: round R trains model version
 * R and its close produces version R + 1 (unless it fails). A round opens
 * once at least min_clients are registered; it closes when every selected
 * client answered (an update or a skip), when enough updates arrived (with
 * over-selection), or at its deadline; late uploads for a closed round are
 * refused as round_closed. Selection is a seeded shuffle that puts clients
 * seen lately first and benched stragglers last.
 *
 * Opening a round that fails (the store cannot record it: full or failing)
 * is tried again after the close's backoff; no round is open meanwhile, so
 * clients are told "no task yet".
 *
 * Crash consistency: the new checkpoint is recorded before the round is
 * closed in the store. On start, an open round whose model version is older
 * than the latest checkpoint was already aggregated: it is closed (with a
 * summary marked "recovered") instead of being replayed. Otherwise the open
 * round's acknowledged updates are replayed into the aggregator in the order
 * they were accepted (a round whose close was failing is such a round: it
 * closes once ready, as it was). Skips are not durable.
 *
 * May call: the store, aggregate.h, models.h, metrics.h, registry.h (sorted
 * ids, client state), libstrata (policy, payload, rng, clock, log, the task
 * and round-summary codecs). */
#include "round.h"

#include "engine_internal.h"
#include "lgreco.h"

#include "strata/buf.h"
#include "strata/clock.h"
#include "strata/log.h"
#include "strata/rng.h"
#include "strata/summary.h"
#include "strata/task.h"

#include <jansson.h>
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
                       const strata_budget *cands, size_t ncands, uint64_t seed, char **out,
                       strata_diag *d)
{
    const srv_config *c = e->cfg;
    strata_task t = {.round = r,
                     .total_rounds = (uint32_t)c->rounds,
                     .model_version = e->version,
                     .deadline_unix_ms = deadline,
                     .num_layers = e->nlayers,
                     .layer_names = e->names,
                     .budgets = (strata_budget *)b,
                     .num_candidates = ncands,
                     .candidates = (strata_budget *)cands,
                     .train = {.epochs = (uint32_t)c->local_epochs,
                               .batch = (uint32_t)c->batch,
                               .lr = c->lr,
                               .momentum = c->momentum,
                               .weight_decay = c->weight_decay,
                               .prox_mu = c->prox_mu,
                               .max_steps = (uint64_t)c->max_steps},
                     .seed = seed};
    memcpy(t.model_digest, e->digest, sizeof(t.model_digest));
    t.downlink = e->xhat != NULL;
    size_t len;
    return strata_task_encode(&t, out, &len, d);
}

/* Reads the per-layer budgets back from a stored task JSON into b
 * (e->nlayers entries), and its error-table candidates into e->cands.
 * Errors: STRATA_EPROTO (not a task of this model), STRATA_ENOMEM. */
static int task_decode_budgets(srv_engine *e, const char *task_json, strata_budget *b,
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
    if (rc == 0 && t.num_candidates > 0) {
        e->cands = t.candidates;
        e->ncands = t.num_candidates;
        t.candidates = NULL;
        t.num_candidates = 0;
    }
    strata_task_cleanup(&t);
    return rc;
}

/* ---- the summary document -------------------------------------------------- */

int srv__summary_text(const srv_engine *e, strata_round_summary *s, char **out, strata_diag *d)
{
    *out = NULL;
    double *dens = NULL;
    /* budget specifications: the round's, then the lgreco allocation */
    size_t nl = e->nlayers ? e->nlayers : 1;
    char(*specs)[64] = NULL;
    char **ptrs = NULL;
    if (s->has_densities) {
        dens = calloc(nl, sizeof(*dens));
        specs = calloc(2 * nl, sizeof(*specs));
        ptrs = calloc(2 * nl, sizeof(*ptrs));
        if (dens == NULL || specs == NULL || ptrs == NULL) {
            free(dens);
            free(specs);
            free(ptrs);
            return strata_diag_set(d, STRATA_ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < e->nlayers; i++) {
            dens[i] = e->budgets != NULL ? e->budgets[i].density : 1.0;
            if (e->budgets != NULL)
                ptrs[i] = strata_budget_format(&e->budgets[i], 1, specs[i], sizeof(specs[i]));
        }
        s->num_layers = e->nlayers;
        s->layer_names = e->names;
        s->densities = dens;
        s->compressors = e->budgets != NULL ? ptrs : NULL;
        srv__lgreco_summary(e, s, specs + nl, ptrs + nl);
    }
    size_t len;
    int rc = strata_round_summary_encode(s, out, &len, d);
    s->layer_names = NULL;
    s->densities = NULL;
    s->compressors = NULL;
    s->lg_allocation = NULL;
    s->has_lgreco = 0;
    s->num_layers = 0;
    free(dens);
    free(specs);
    free(ptrs);
    return rc;
}

int srv__summary_facts(const char *text, srv_summary_facts *f)
{
    memset(f, 0, sizeof(*f));
    strata_round_summary s;
    int rc = strata_round_summary_decode(text, strlen(text), NULL, &s, NULL);
    if (rc == 0) {
        f->stopped = s.stopped;
        f->failed = s.failed != STRATA_ROUND_FAILED_NONE;
        f->evaluated = !isnan(s.accuracy);
        f->accuracy = s.accuracy;
        f->loss = s.loss;
        f->eval_samples = s.eval_samples;
        f->duration_ms = s.duration_ms;
        for (size_t i = 0; i < s.num_quarantined; i++) {
            if (s.quarantined[i].reason == STRATA_QUARANTINE_NORM)
                f->quarantined_norm++;
            else
                f->quarantined_non_finite++;
        }
    }
    strata_round_summary_cleanup(&s);
    return rc;
}

/* The stored summary of the open round, before its statistics exist. */
strata_round_summary srv__summary_of_open(const srv_engine *e)
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
    const char *reason = rq.has_reason ? rq.reason : NULL;
    pthread_mutex_lock(&e->mu);
    /* A batch in flight may hold this client's update: decide after it. */
    while (e->committing)
        pthread_cond_wait(&e->commit_cv, &e->mu);
    ptrdiff_t k =
        e->open && round == e->next_round ? srv__id_find(e->selected, e->nselected, client_id) : -1;
    srv_outcome o = SRV_OK;
    if (e->finished && !e->open)
        o = SRV_E_FINISHED;
    else if (!e->open || round > e->next_round)
        o = round < e->next_round ? SRV_E_ROUND_CLOSED : SRV_E_ROUND_NOT_OPEN;
    else if (round < e->next_round || e->closing)
        o = SRV_E_ROUND_CLOSED;
    else if (k < 0)
        o = SRV_E_NOT_SELECTED;
    else if (e->reported[k] == SRV_REPORT_UPDATE)
        o = SRV_E_CONFLICT;
    if (o == SRV_OK && e->reported[k] == SRV_REPORT_NONE) {
        e->reported[k] = SRV_REPORT_SKIPPED;
        e->nskipped++;
        srv__ctr_add(e, SRV_CTR_SKIPPED, 1);
        strata_log_info("round %u: client %llu cannot contribute%s%s", round,
                        (unsigned long long)client_id, reason != NULL ? ": " : "",
                        reason != NULL ? reason : "");
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    switch (o) {
    case SRV_OK:
        srv__result_json(r, SRV_OK,
                         json_pack("{s:I,s:b}", "round", (json_int_t)round, "skipped", 1));
        break;
    case SRV_E_FINISHED:
        srv_result_error(r, o, "the federation has finished");
        break;
    case SRV_E_ROUND_CLOSED:
        srv_result_error(r, o, "round %u is closed", round);
        break;
    case SRV_E_ROUND_NOT_OPEN:
        srv_result_error(r, o, "round %u has not opened", round);
        break;
    case SRV_E_NOT_SELECTED:
        srv_result_error(r, o, "this client was not selected for round %u", round);
        break;
    default:
        srv_result_error(r, SRV_E_CONFLICT,
                         "this client's update for round %u was accepted; it cannot skip it",
                         round);
        break;
    }
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
    free(e->norms);
    e->norms = NULL;
    free(e->budgets);
    free(e->cands);
    free(e->task_json);
    e->selected = NULL;
    e->reported = NULL;
    e->budgets = NULL;
    e->cands = NULL;
    e->ncands = 0;
    e->lg_solved = 0;
    e->task_json = NULL;
    e->nselected = e->nreported = e->nskipped = e->enough = 0;
    e->open = e->closing = 0;
    e->close_failures = 0;
    e->close_retry_ms = 0;
    e->uplink = 0;
    strata_agg_reset(e->agg);
}

/* A client counts as live when it asked for a task this recently. */
#define LIVE_MS 60000

/* Where registered client i stands for round r's selection: 0 live, 1 not
 * seen lately, 2 benched (it missed a deadline). Lock held. */
static int selection_class(const srv_engine *e, size_t i, uint32_t r, int64_t now)
{
    const srv_client_state *c = &e->cstate[i];
    if (c->benched_until > r)
        return 2;
    return now - c->seen_ms <= LIVE_MS ? 0 : 1;
}

/* Chooses ks of the registered clients for round r into sel (room for
 * every registered client), ascending: a seeded shuffle (the same seed and
 * round give the same order), then live clients first, clients not seen
 * lately next, benched ones last. Lock held. */
static void select_clients(const srv_engine *e, uint32_t r, size_t ks, uint64_t *sel)
{
    size_t n = e->nclients;
    size_t *idx = malloc((n ? n : 1) * sizeof(*idx));
    strata_rng rng;
    strata_rng_seed(&rng, (uint64_t)e->cfg->seed, 0x5e1ec7ULL + r);
    if (idx == NULL) { /* no memory for the ordering: the first ks by id */
        memcpy(sel, e->clients, ks * sizeof(*sel));
        return;
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    for (size_t i = 0; i < n; i++) {
        size_t j = i + (size_t)strata_rng_below(&rng, n - i);
        size_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    int64_t now = strata_clock_unix_ms();
    size_t taken = 0;
    for (int cls = 0; cls < 3 && taken < ks; cls++)
        for (size_t i = 0; i < n && taken < ks; i++)
            if (selection_class(e, idx[i], r, now) == cls)
                sel[taken++] = e->clients[idx[i]];
    free(idx);
    srv__id_sort(sel, ks);
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
    /* Over-selection: ks clients are asked, the round closes once `enough`
     * updates arrived. */
    size_t need = k, ks = k;
    if (c->over_select > 0) {
        double want = ceil((double)k * (1.0 + c->over_select));
        ks = want < (double)n ? (size_t)want : n;
        need = (size_t)c->min_updates > k ? (size_t)c->min_updates : k;
        need = need < ks ? need : ks;
    }
    int rc = STRATA_ENOMEM;
    uint64_t *sel = malloc((n ? n : 1) * sizeof(*sel));
    strata_budget *b = calloc(e->nlayers, sizeof(*b));
    uint8_t *rep = calloc(ks ? ks : 1, 1);
    double *norms = calloc(ks ? ks : 1, sizeof(*norms));
    char *tj = NULL;
    strata_budget *cands = NULL;
    size_t ncands = 0;
    if (sel == NULL || b == NULL || rep == NULL || norms == NULL)
        goto fail;
    select_clients(e, r, ks, sel);
    k = ks;
    if (e->policy == NULL) {
        for (size_t i = 0; i < e->nlayers; i++)
            b[i] = (strata_budget){
                .comp = STRATA_COMP_NONE, .density = 1.0, .values = c->values_format};
    } else if ((rc = strata_policy_budgets(e->policy, e->numel, e->nlayers, c->density, r,
                                           (uint32_t)c->rounds, b, d)) < 0) {
        goto fail;
    }
    int64_t now = strata_clock_unix_ms();
    int64_t deadline = now + (int64_t)(c->round_deadline * 1000.0);
    uint64_t seed = strata_mix64((uint64_t)c->seed ^ strata_mix64(r)) & ((1ULL << 53) - 1);
    if ((rc = srv__lgreco_candidates(e, r, &cands, &ncands)) < 0 ||
        (rc = task_encode(e, r, deadline, b, cands, ncands, seed, &tj, d)) < 0)
        goto fail;
    if ((rc = strata_store_round_open(e->store, r, e->version, sel, k, deadline, tj, d)) < 0)
        goto fail;
    srv__registry_flush_seen(e);
    srv__round_reset(e);
    e->selected = sel;
    e->nselected = k;
    e->reported = rep;
    e->norms = norms;
    e->enough = need;
    e->budgets = b;
    e->cands = cands;
    e->ncands = ncands;
    e->task_json = tj;
    e->opened_ms = now;
    e->deadline_ms = deadline;
    e->open = 1;
    return 0;
fail:
    free(tj);
    free(sel);
    free(cands);
    free(b);
    free(rep);
    free(norms);
    return rc;
}

/* Opens the next round when one is due, or waits for the retry of an open
 * that failed (the store could not record the round: full or failing;
 * nothing was opened). Lock held. */
static void maybe_open(srv_engine *e)
{
    if (e->finished || e->paused || e->open || e->nclients < (size_t)e->cfg->min_clients ||
        strata_clock_mono_ms() < e->open_retry_ms)
        return;
    strata_diag d = {{0}};
    int rc = open_round(e, &d);
    if (rc < 0) {
        int64_t wait = srv__retry_backoff_ms(e->open_failures++);
        e->open_retry_ms = strata_clock_mono_ms() + wait;
        strata_log_error("opening round %u failed (attempt %u): %s; retrying in %lld s",
                         e->next_round, e->open_failures, strata_diag_msg(&d, rc),
                         (long long)(wait / 1000));
        return;
    }
    if (e->open_failures > 0)
        strata_log_info("round %u: opened after %u failed attempts", e->next_round,
                        e->open_failures);
    e->open_failures = 0;
    e->open_retry_ms = 0;
    srv__waiters_wake_all(e);
}

void *srv__round_thread(void *arg)
{
    srv_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stopping) {
        int64_t now = strata_clock_unix_ms();
        maybe_open(e);
        if (srv__round_ready_to_close(e, now))
            srv__round_close(e);
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
    strata_round_summary s = srv__summary_of_open(e);
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

/* Sets the counters derived from the store (srv__metrics_derived): every
 * acknowledged update has its row, every aggregated round its closed record
 * (a round an operator stopped is closed but was not aggregated; a failed
 * one closed without a new model), and each summary lists its quarantined
 * updates. */
static int count_from_store(srv_engine *e, strata_diag *d)
{
    int64_t rounds = 0, failed = 0, accepted = 0, q_norm = 0, q_nf = 0;
    uint32_t from = 0;
    for (;;) {
        strata_store_round *rs = NULL;
        size_t n = 0;
        int rc = strata_store_round_list(e->store, from, 1000, &rs, &n, d);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < n; i++) {
            accepted += (int64_t)rs[i].n_updates;
            if (rs[i].state != STRATA_STORE_ROUND_CLOSED)
                continue;
            srv_summary_facts f;
            if (rs[i].summary_json == NULL || srv__summary_facts(rs[i].summary_json, &f) < 0)
                memset(&f, 0, sizeof(f));
            rounds += !f.stopped && !f.failed;
            failed += f.failed;
            q_norm += (int64_t)f.quarantined_norm;
            q_nf += (int64_t)f.quarantined_non_finite;
            if (f.evaluated) { /* the gauges of the last evaluated round */
                e->last_acc = f.accuracy;
                e->last_loss = f.loss;
                e->last_eval_samples = f.eval_samples ? f.eval_samples : e->test.n;
                e->last_round_s = (double)f.duration_ms / 1000.0;
            }
            from = rs[i].round + 1;
        }
        strata_store_round_list_free(rs, n);
        if (n < 1000)
            break;
    }
    e->ctr[SRV_CTR_ROUNDS] = rounds;
    e->ctr[SRV_CTR_ROUNDS_FAILED] = failed;
    e->ctr[SRV_CTR_ACCEPTED] = accepted;
    e->ctr[SRV_CTR_QUARANTINED_NORM] = q_norm;
    e->ctr[SRV_CTR_QUARANTINED_NON_FINITE] = q_nf;
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
        double norm = NAN;
        if (e->method == STRATA_ROBUST_FEDAVG) {
            rc = strata_store_update_read(e->store, e->next_round, ups[i].client_id, &buf, &len, d);
            if (rc == 0)
                rc = strata_payload_decode(buf, len, &e->limits, &p, d);
            if (rc == 0)
                rc = strata_agg_add_clipped(e->agg, p->layers, p->num_layers,
                                            (double)ups[i].receipt.samples, e->cfg->clip_norm,
                                            &norm, d);
        }
        ptrdiff_t k = srv__id_find(e->selected, e->nselected, ups[i].client_id);
        if (rc == 0 && k >= 0)
            e->norms[k] = norm;
        if (rc == 0 && k >= 0 && !e->reported[k]) {
            e->reported[k] = SRV_REPORT_UPDATE;
            e->nreported++;
            e->uplink += len;
        }
        strata_payload_free(p);
        free(buf);
    }
    strata_store_update_list_free(ups, n);
    return rc;
}

/* The updates that close a resumed round early: its whole selection, or
 * with over-selection the share of it the round needed (the selection
 * divided by 1 + over_select, rounded down, and at least --min-updates).
 * Skips are not durable: a client that skipped before the restart is asked
 * again. */
static size_t enough_after_restart(const srv_engine *e)
{
    size_t ks = e->nselected, need = ks;
    if (e->cfg->over_select > 0) {
        need = (size_t)floor((double)ks / (1.0 + e->cfg->over_select));
        if (need < (size_t)e->cfg->min_updates)
            need = (size_t)e->cfg->min_updates;
        need = need < ks ? need : ks;
    }
    return need;
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
            e->norms = calloc(e->nselected ? e->nselected : 1, sizeof(*e->norms));
            e->budgets = calloc(e->nlayers, sizeof(*e->budgets));
            if (e->reported == NULL || e->norms == NULL || e->budgets == NULL ||
                e->task_json == NULL)
                rc = STRATA_ENOMEM;
            strata_diag td;
            if (rc == 0 && task_decode_budgets(e, e->task_json, e->budgets, &td) < 0)
                rc = strata_diag_set(d, STRATA_EPROTO, "round %u: unreadable task: %s", last,
                                     td.msg);
            e->open = 1;
            e->enough = enough_after_restart(e);
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
