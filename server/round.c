/* The round lifecycle (see round.h): the open round's state, opening a
 * round, task requests, skips, the accept step of an upload, abandoning the
 * open round, and its summary document; closing is close.c's, resuming at
 * start-up resume.c's.
 *
 * A round opens once at least min_clients are registered; it closes when
 * every selected client answered (an update or a skip), when enough updates
 * arrived (with over-selection), or at its deadline; late uploads for a
 * closed round are refused as round_closed. Selection is the registry's
 * seeded shuffle that puts clients seen lately first and benched
 * stragglers last.
 *
 * Opening a round that fails (the store cannot record it: full or failing)
 * is tried again after the close's backoff; no round is open meanwhile, so
 * clients are told "no task yet".
 *
 * May call: the store, aggregate.h, registry.h, budgets.h, lgreco.h (the
 * summary's lgreco part), models.h, metrics.h, waiters.h, libstrata
 * (payload, clock, log, the task and round-summary codecs) and jansson. */
#include "round_internal.h"

#include "lgreco.h"
#include "result_internal.h"

#include "strata/clock.h"
#include "strata/log.h"
#include "strata/rng.h"
#include "strata/task.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A close or an open that failed for a reason that can pass is retried
 * after 1, 2, 4, 8, 16, then every 30 seconds. */
#define BACKOFF_MIN_MS 1000
#define BACKOFF_MAX_MS 30000

int64_t srv__retry_backoff_ms(unsigned k)
{
    int64_t wait = (int64_t)BACKOFF_MIN_MS << (k < 5 ? k : 5);
    return wait < BACKOFF_MAX_MS ? wait : BACKOFF_MAX_MS;
}

int srv__rounds_new(const srv_rounds_config *c, srv_rounds **out)
{
    *out = NULL;
    srv_rounds *R = calloc(1, sizeof(*R));
    if (R == NULL)
        return STRATA_ENOMEM;
    R->c = *c;
    int rc = strata_agg_new(c->layout, &R->agg);
    if (rc < 0) {
        free(R);
        return rc;
    }
    *out = R;
    return 0;
}

void srv__rounds_free(srv_rounds *R)
{
    if (R == NULL)
        return;
    srv__round_reset(R);
    strata_agg_free(R->agg);
    free(R);
}

/* ---- the task document ---------------------------------------------------- */

/* The task JSON of round r, through the task codec (strata/task.h). Errors:
 * as strata_task_encode. Lock held. */
static int task_encode(const srv_rounds *R, uint32_t r, int64_t deadline, const strata_budget *b,
                       const strata_budget *cands, size_t ncands, uint64_t seed, char **out,
                       strata_diag *d)
{
    const srv_rounds_config *c = &R->c;
    strata_task t = {.round = r,
                     .total_rounds = (uint32_t)c->rounds,
                     .model_version = srv__models_version(c->models),
                     .deadline_unix_ms = deadline,
                     .num_layers = c->nlayers,
                     .layer_names = c->names,
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
    srv__models_digest(c->models, t.model_digest);
    t.downlink = c->downlink;
    size_t len;
    return strata_task_encode(&t, out, &len, d);
}

/* ---- the summary document -------------------------------------------------- */

int srv__round_summary_text(const srv_rounds *R, strata_round_summary *s, const srv_budgets *lg,
                            char **out, strata_diag *d)
{
    *out = NULL;
    double *dens = NULL;
    /* budget specifications: the round's, then the lgreco allocation */
    size_t nlayers = R->c.nlayers, nl = nlayers ? nlayers : 1;
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
        for (size_t i = 0; i < nlayers; i++) {
            dens[i] = R->budgets != NULL ? R->budgets[i].density : 1.0;
            if (R->budgets != NULL)
                ptrs[i] = strata_budget_format(&R->budgets[i], 1, specs[i], sizeof(specs[i]));
        }
        s->num_layers = nlayers;
        s->layer_names = R->c.names;
        s->densities = dens;
        s->compressors = R->budgets != NULL ? ptrs : NULL;
        /* the allocation of the round after this one (or of the last) */
        uint32_t next =
            R->next_round + 1 < (uint32_t)R->c.rounds ? R->next_round + 1 : R->next_round;
        if (lg != NULL)
            srv__lgreco_summary(lg, next, s, specs + nl, ptrs + nl);
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

strata_round_summary srv__round_summary_of_open(const srv_rounds *R)
{
    strata_round_summary s = {.round = R->next_round,
                              .state = STRATA_ROUND_CLOSED,
                              .model_version = srv__models_version(R->c.models),
                              .selected = R->nselected,
                              .participants = R->nreported};
    return s;
}

void srv__round_live_summary(const srv_rounds *R, const strata_store_round *rd, char **text)
{
    int cur = R->open && rd->round == R->next_round;
    int64_t dur = strata_clock_unix_ms() - rd->opened_unix_ms;
    strata_round_summary s = {.round = rd->round,
                              .state = rd->state == STRATA_STORE_ROUND_OPEN ? STRATA_ROUND_OPEN
                                                                            : STRATA_ROUND_CLOSED,
                              .model_version = rd->model_version,
                              .selected = rd->n_selected,
                              .participants = rd->n_updates,
                              .has_stats = 1,
                              .accuracy = NAN,
                              .loss = NAN,
                              .uplink_bytes = cur ? R->uplink : 0,
                              .downlink_bytes = cur ? R->downlink : 0,
                              .dense_uplink_bytes = rd->n_updates * R->c.total_params * 4,
                              .duration_ms = dur > 0 ? (uint64_t)dur : 0,
                              .has_densities = cur};
    if (srv__round_summary_text(R, &s, NULL, text, NULL) < 0)
        *text = NULL;
}

/* ---- state ------------------------------------------------------------------- */

uint32_t srv__round_current(const srv_rounds *R)
{
    return R->next_round;
}

int srv__round_is_open(const srv_rounds *R)
{
    return R->open;
}

int srv__round_closing(const srv_rounds *R)
{
    return R->closing;
}

int srv__round_finished(const srv_rounds *R)
{
    return R->finished;
}

int srv__round_close_busy(const srv_rounds *R)
{
    return R->close_busy;
}

int srv__round_close_pending(const srv_rounds *R)
{
    return R->close_failures > 0;
}

void srv__round_finish(srv_rounds *R, int by_operator)
{
    R->finished = 1;
    if (by_operator)
        R->stopped = 1;
}

void srv__round_count_downlink(srv_rounds *R, uint64_t len)
{
    R->downlink += len;
}

/* ---- uploads ------------------------------------------------------------------ */

ptrdiff_t srv__round_find(const srv_rounds *R, uint64_t client_id)
{
    return R->open ? srv__id_find(R->selected, R->nselected, client_id) : -1;
}

int srv__round_report(const srv_rounds *R, ptrdiff_t k)
{
    return R->reported[k];
}

uint64_t srv__round_task_version(const srv_rounds *R)
{
    return R->open ? R->version : srv__models_version(R->c.models);
}

const strata_budget *srv__round_task_budgets(const srv_rounds *R, size_t *ncands)
{
    *ncands = R->ncands;
    return R->budgets;
}

int srv__round_full(const srv_rounds *R)
{
    return R->nreported + R->nskipped >= R->nselected ||
           (R->nreported > 0 && R->nreported >= R->enough);
}

void srv__round_accept(srv_rounds *R, const strata_payload *p, ptrdiff_t k, size_t len)
{
    if (R->c.method == STRATA_ROBUST_FEDAVG && !R->c.mirror) {
        strata_diag d = {{0}};
        int rc = strata_agg_add_clipped(R->agg, p->layers, p->num_layers, (double)p->sample_count,
                                        R->c.clip_norm, &R->norms[k], &d);
        if (rc < 0) /* the validation and the decoder make this unreachable */
            strata_log_error("round %u: stored update not aggregated: %s", R->next_round,
                             strata_diag_msg(&d, rc));
    }
    R->reported[k] = SRV_REPORT_UPDATE;
    R->nreported++;
    R->uplink += len;
}

/* ---- tasks and skips ------------------------------------------------------------ */

/* On a shared store, the check before a task is handed out: whether the
 * store holds the client's update for the open round already (it uploaded
 * through another coordinator, whose notification has not arrived). A failed lookup
 * answers no: the task is handed out, and an upload of the same round is
 * then refused or taken as the store decides. Lock held. */
static int stored_elsewhere(const srv_rounds *R, uint64_t client_id)
{
    int found = 0;
    return strata_store_update_find(R->c.store, R->next_round, client_id, NULL, &found, NULL) ==
               STRATA_OK &&
           found;
}

void srv__round_task(srv_rounds *R, uint64_t client_id, int64_t deadline_ms, void *conn,
                     int *parked, srv_result *r)
{
    *parked = 0;
    pthread_mutex_lock(R->c.mu);
    srv__registry_seen(R->c.reg, client_id);
    if (R->finished) {
        int stopped = R->stopped;
        pthread_mutex_unlock(R->c.mu);
        if (stopped)
            srv_result_error(r, SRV_E_FINISHED, "the federation was stopped by its operator");
        else
            srv_result_error(r, SRV_E_FINISHED, "the federation has completed all %ld rounds",
                             R->c.rounds);
        return;
    }
    ptrdiff_t k = R->open && !R->closing ? srv__id_find(R->selected, R->nselected, client_id) : -1;
    if (k >= 0 && !R->reported[k] && R->c.shared && stored_elsewhere(R, client_id)) {
        /* Uploaded through another coordinator a moment ago: a mirror
         * notes it, a leader's watch thread is about to adopt it. */
        if (R->c.mirror) {
            R->reported[k] = SRV_REPORT_UPDATE;
            R->nreported++;
        }
        k = -1;
    }
    if (k >= 0 && !R->reported[k]) {
        char *t = strdup(R->task_json);
        pthread_mutex_unlock(R->c.mu);
        srv_result_take(r, SRV_OK, SRV_MEDIA_JSON, (uint8_t *)t, t ? strlen(t) : 0);
        return;
    }
    if (conn != NULL && strata_clock_unix_ms() < deadline_ms &&
        srv__waiters_park(R->c.waiters, conn, deadline_ms)) {
        pthread_mutex_unlock(R->c.mu);
        *parked = 1;
        return;
    }
    pthread_mutex_unlock(R->c.mu);
    srv_result_take(r, SRV_NO_CONTENT, SRV_MEDIA_NONE, NULL, 0);
    r->retry_after = 1;
}

void srv__round_skip(srv_rounds *R, uint64_t client_id, uint32_t round, const char *reason,
                     srv_result *r)
{
    ptrdiff_t k =
        R->open && round == R->next_round ? srv__id_find(R->selected, R->nselected, client_id) : -1;
    srv_outcome o = SRV_OK;
    if (R->finished && !R->open)
        o = SRV_E_FINISHED;
    else if (!R->open || round > R->next_round)
        o = round < R->next_round ? SRV_E_ROUND_CLOSED : SRV_E_ROUND_NOT_OPEN;
    else if (round < R->next_round || R->closing)
        o = SRV_E_ROUND_CLOSED;
    else if (k < 0)
        o = SRV_E_NOT_SELECTED;
    else if (R->reported[k] == SRV_REPORT_UPDATE)
        o = SRV_E_CONFLICT;
    if (o == SRV_OK && R->reported[k] == SRV_REPORT_NONE) {
        R->reported[k] = SRV_REPORT_SKIPPED;
        R->nskipped++;
        srv__ctr_add(R->c.met, SRV_CTR_SKIPPED, 1);
        strata_log_info("round %u: client %llu cannot contribute%s%s", round,
                        (unsigned long long)client_id, reason != NULL ? ": " : "",
                        reason != NULL ? reason : "");
        pthread_cond_broadcast(R->c.wake);
    }
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

/* ---- open ------------------------------------------------------------------ */

void srv__round_reset(srv_rounds *R)
{
    free(R->selected);
    free(R->reported);
    free(R->norms);
    free(R->budgets);
    free(R->cands);
    free(R->task_json);
    R->selected = NULL;
    R->reported = NULL;
    R->norms = NULL;
    R->budgets = NULL;
    R->cands = NULL;
    R->ncands = 0;
    R->task_json = NULL;
    R->nselected = R->nreported = R->nskipped = R->enough = R->stored_seen = 0;
    R->open = R->closing = 0;
    R->close_failures = 0;
    R->close_retry_ms = 0;
    R->uplink = 0;
    strata_agg_reset(R->agg);
}

/* Opens round R->next_round. Lock held. */
static int open_round(srv_rounds *R, strata_diag *d)
{
    const srv_rounds_config *c = &R->c;
    uint32_t r = R->next_round;
    size_t n = srv__registry_count(c->reg), k = n;
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
    strata_budget *b = calloc(c->nlayers, sizeof(*b));
    uint8_t *rep = calloc(ks ? ks : 1, 1);
    double *norms = calloc(ks ? ks : 1, sizeof(*norms));
    char *tj = NULL;
    strata_budget *cands = NULL;
    size_t ncands = 0;
    if (sel == NULL || b == NULL || rep == NULL || norms == NULL)
        goto fail;
    srv__registry_select(c->reg, (uint64_t)c->seed, r, ks, sel);
    k = ks;
    int64_t now = strata_clock_unix_ms();
    int64_t deadline = now + (int64_t)(c->round_deadline * 1000.0);
    uint64_t seed = strata_mix64((uint64_t)c->seed ^ strata_mix64(r)) & ((1ULL << 53) - 1);
    if ((rc = srv__budgets_of_round(c->budgets, r, b, &cands, &ncands, d)) < 0 ||
        (rc = task_encode(R, r, deadline, b, cands, ncands, seed, &tj, d)) < 0)
        goto fail;
    if ((rc = strata_store_round_open(c->store, r, srv__models_version(c->models), sel, k, deadline,
                                      tj, d)) < 0)
        goto fail;
    srv__registry_flush_seen(c->reg);
    srv__round_reset(R);
    R->selected = sel;
    R->nselected = k;
    R->reported = rep;
    R->norms = norms;
    R->enough = need;
    R->budgets = b;
    R->cands = cands;
    R->ncands = ncands;
    R->task_json = tj;
    R->version = srv__models_version(c->models);
    R->opened_ms = now;
    R->deadline_ms = deadline;
    R->open = 1;
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

void srv__round_maybe_open(srv_rounds *R, int paused)
{
    if (R->finished || paused || R->open ||
        srv__registry_count(R->c.reg) < (size_t)R->c.min_clients ||
        strata_clock_mono_ms() < R->open_retry_ms)
        return;
    strata_diag d = {{0}};
    int rc = open_round(R, &d);
    if (rc < 0) {
        int64_t wait = srv__retry_backoff_ms(R->open_failures++);
        R->open_retry_ms = strata_clock_mono_ms() + wait;
        strata_log_error("opening round %u failed (attempt %u): %s; retrying in %lld s",
                         R->next_round, R->open_failures, strata_diag_msg(&d, rc),
                         (long long)(wait / 1000));
        return;
    }
    if (R->open_failures > 0)
        strata_log_info("round %u: opened after %u failed attempts", R->next_round,
                        R->open_failures);
    R->open_failures = 0;
    R->open_retry_ms = 0;
    srv__waiters_wake_all(R->c.waiters);
}

int srv__round_abandon(srv_rounds *R, strata_diag *d)
{
    if (!R->open)
        return 0;
    strata_round_summary s = srv__round_summary_of_open(R);
    s.stopped = 1;
    char *t = NULL;
    int rc = srv__round_summary_text(R, &s, NULL, &t, d);
    if (rc == 0)
        rc = strata_store_round_close(R->c.store, R->next_round, t, d);
    free(t);
    if (rc == 0) {
        srv__round_reset(R);
        R->next_round++;
    }
    return rc;
}
