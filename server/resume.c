/* Resuming the state directory's rounds at start-up (see round.h,
 * srv__round_resume), and the counters and gauges start-up derives from the
 * stored rounds.
 *
 * Crash consistency: the new checkpoint is recorded before the round is
 * closed in the store. On start, an open round whose model version is older
 * than the latest checkpoint was already aggregated: it is closed (with a
 * summary marked "recovered") instead of being replayed. Otherwise the open
 * round's acknowledged updates are replayed into the aggregator in the order
 * they were accepted (a round whose close was failing is such a round: it
 * closes once ready, as it was). Skips are not durable.
 *
 * May call: the store, aggregate.h, metrics.h, models.h, registry.h (sorted
 * ids), libstrata (payload, the task and round-summary codecs). */
#include "round_internal.h"

#include "strata/task.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What the counters and gauges need to know of a stored round summary. */
typedef struct summary_facts {
    int stopped;                   /* closed unaggregated by an operator */
    int failed;                    /* closed without a new model */
    size_t quarantined_norm;       /* updates quarantined by the screening rule */
    size_t quarantined_non_finite; /* ... and to keep the result finite */
    int evaluated;                 /* the model was evaluated: the next four are set */
    double accuracy, loss;
    size_t eval_samples; /* 0 in summaries written before the key existed */
    uint64_t duration_ms;
} summary_facts;

/* Reads *f from a stored summary text (zeroed on error). Errors: as
 * strata_round_summary_decode. */
static int summary_facts_of(const char *text, summary_facts *f)
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

/* Reads the per-layer budgets back from a stored task JSON into b
 * (nlayers entries), and its error-table candidates into R->cands.
 * Errors: STRATA_EPROTO (not a task of this model), STRATA_ENOMEM. */
static int task_decode_budgets(srv_rounds *R, const char *task_json, strata_budget *b,
                               strata_diag *d)
{
    size_t nlayers = R->c.nlayers;
    strata_task t;
    strata_task_limits lim = {.max_layers = nlayers};
    int rc = strata_task_decode(task_json, strlen(task_json), &lim, &t, d);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < t.num_layers && rc == 0; i++)
        if (strcmp(t.layer_names[i], R->c.names[i]) != 0)
            rc = strata_diag_set(d, STRATA_EPROTO, "budgets[%zu]: layer \"%s\" is not \"%s\"", i,
                                 t.layer_names[i], R->c.names[i]);
    if (rc == 0 && t.num_layers != nlayers)
        rc = strata_diag_set(d, STRATA_EPROTO, "%zu budgets for %zu layers", t.num_layers, nlayers);
    if (rc == 0)
        memcpy(b, t.budgets, nlayers * sizeof(*b));
    if (rc == 0 && t.num_candidates > 0) {
        R->cands = t.candidates;
        R->ncands = t.num_candidates;
        t.candidates = NULL;
        t.num_candidates = 0;
    }
    strata_task_cleanup(&t);
    return rc;
}

/* Sets the counters derived from the store (srv__metrics_derived): every
 * acknowledged update has its row, every aggregated round its closed record
 * (a round an operator stopped is closed but was not aggregated; a failed
 * one closed without a new model), and each summary lists its quarantined
 * updates. The gauges are the last evaluated round's. */
static int count_from_store(srv_rounds *R, size_t test_n, strata_diag *d)
{
    int64_t rounds = 0, failed = 0, accepted = 0, q_norm = 0, q_nf = 0;
    uint32_t from = 0;
    for (;;) {
        strata_store_round *rs = NULL;
        size_t n = 0;
        int rc = strata_store_round_list(R->c.store, from, 1000, &rs, &n, d);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < n; i++) {
            accepted += (int64_t)rs[i].n_updates;
            if (rs[i].state != STRATA_STORE_ROUND_CLOSED)
                continue;
            summary_facts f;
            if (rs[i].summary_json == NULL || summary_facts_of(rs[i].summary_json, &f) < 0)
                memset(&f, 0, sizeof(f));
            rounds += !f.stopped && !f.failed;
            failed += f.failed;
            q_norm += (int64_t)f.quarantined_norm;
            q_nf += (int64_t)f.quarantined_non_finite;
            if (f.evaluated) /* the gauges of the last evaluated round */
                srv__metrics_set_round(R->c.met, f.accuracy, f.loss,
                                       f.eval_samples ? f.eval_samples : test_n,
                                       (double)f.duration_ms / 1000.0);
            from = rs[i].round + 1;
        }
        strata_store_round_list_free(rs, n);
        if (n < 1000)
            break;
    }
    srv__ctr_set(R->c.met, SRV_CTR_ROUNDS, rounds);
    srv__ctr_set(R->c.met, SRV_CTR_ROUNDS_FAILED, failed);
    srv__ctr_set(R->c.met, SRV_CTR_ACCEPTED, accepted);
    srv__ctr_set(R->c.met, SRV_CTR_QUARANTINED_NORM, q_norm);
    srv__ctr_set(R->c.met, SRV_CTR_QUARANTINED_NON_FINITE, q_nf);
    return 0;
}

/* Replays the acknowledged updates of the open round: into the FedAvg
 * aggregate (each decoded once), or, for a robust rule, only as reported
 * (close reads them). */
static int replay_updates(srv_rounds *R, strata_diag *d)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(R->c.store, R->next_round, &ups, &n, d);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint8_t *buf = NULL;
        size_t len = (size_t)ups[i].receipt.bytes;
        strata_payload *p = NULL;
        double norm = NAN;
        if (R->c.method == STRATA_ROBUST_FEDAVG && !R->c.mirror) {
            rc = strata_store_update_read(R->c.store, R->next_round, ups[i].client_id, &buf, &len,
                                          d);
            if (rc == 0)
                rc = strata_payload_decode(buf, len, &R->c.limits, &p, d);
            if (rc == 0)
                rc = strata_agg_add_clipped(R->agg, p->layers, p->num_layers,
                                            (double)ups[i].receipt.samples, R->c.clip_norm, &norm,
                                            d);
        }
        ptrdiff_t k = srv__id_find(R->selected, R->nselected, ups[i].client_id);
        if (rc == 0 && k >= 0)
            R->norms[k] = norm;
        if (rc == 0 && k >= 0 && !R->reported[k]) {
            R->reported[k] = SRV_REPORT_UPDATE;
            R->nreported++;
            R->uplink += len;
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
static size_t enough_after_restart(const srv_rounds *R)
{
    size_t ks = R->nselected, need = ks;
    if (R->c.over_select > 0) {
        need = (size_t)floor((double)ks / (1.0 + R->c.over_select));
        if (need < (size_t)R->c.min_updates)
            need = (size_t)R->c.min_updates;
        need = need < ks ? need : ks;
    }
    return need;
}

/* Closes round `last` (its record rd), aggregated before a crash. */
static int close_recovered(srv_rounds *R, uint32_t last, const strata_store_round *rd,
                           strata_diag *d)
{
    strata_round_summary s = {.round = last,
                              .state = STRATA_ROUND_CLOSED,
                              .model_version = rd->model_version,
                              .selected = rd->n_selected,
                              .participants = rd->n_updates,
                              .recovered = 1};
    char *t = NULL;
    int rc = srv__round_summary_text(R, &s, NULL, &t, d);
    if (rc == 0)
        rc = strata_store_round_close(R->c.store, last, t, d);
    free(t);
    return rc;
}

/* Restores open round `last` (its record rd, whose selection and task are
 * taken) and replays its updates. */
static int reopen(srv_rounds *R, uint32_t last, strata_store_round *rd, strata_diag *d)
{
    int rc = 0;
    R->next_round = last;
    R->selected = rd->selected;
    rd->selected = NULL;
    R->nselected = rd->n_selected;
    R->task_json = rd->task_json;
    rd->task_json = NULL;
    R->version = rd->model_version;
    R->opened_ms = rd->opened_unix_ms;
    /* A round sealed before the restart takes no update any more: it is
     * due now (a follower's mirror shows it closing). */
    R->deadline_ms = rd->sealed ? rd->opened_unix_ms : rd->deadline_unix_ms;
    R->closing = R->c.mirror && rd->sealed;
    R->reported = calloc(R->nselected ? R->nselected : 1, 1);
    R->norms = calloc(R->nselected ? R->nselected : 1, sizeof(*R->norms));
    R->budgets = calloc(R->c.nlayers, sizeof(*R->budgets));
    if (R->reported == NULL || R->norms == NULL || R->budgets == NULL || R->task_json == NULL)
        rc = STRATA_ENOMEM;
    strata_diag td;
    if (rc == 0 && task_decode_budgets(R, R->task_json, R->budgets, &td) < 0)
        rc = strata_diag_set(d, STRATA_EPROTO, "round %u: unreadable task: %s", last, td.msg);
    R->open = 1;
    R->enough = enough_after_restart(R);
    if (rc == 0)
        rc = replay_updates(R, d);
    return rc;
}

static int resume_state(srv_rounds *R, strata_diag *d)
{
    uint32_t last = 0;
    int found = 0;
    int rc = strata_store_last_round(R->c.store, &last, &found, d);
    if (rc < 0 || !found)
        return rc;
    strata_store_round rd;
    memset(&rd, 0, sizeof(rd));
    int f2 = 0;
    if ((rc = strata_store_round_get(R->c.store, last, &rd, &f2, d)) < 0)
        return rc;
    R->next_round = last + 1;
    if (rd.state == STRATA_STORE_ROUND_OPEN) {
        /* Aggregated and checkpointed before the crash: just close it. */
        if (rd.model_version < srv__models_version(R->c.models))
            rc = R->c.mirror ? 0 : close_recovered(R, last, &rd, d);
        else
            rc = reopen(R, last, &rd, d);
    }
    strata_store_round_cleanup(&rd);
    return rc;
}

/* Whether the stored update of client_id for `round` is one the open
 * round still lacks: its index among the selected clients, or -1. A skip
 * the client sent here does not count against it: its update, stored
 * through another coordinator, was acknowledged. Lock held. */
static ptrdiff_t lacking(const srv_rounds *R, uint32_t round, uint64_t client_id)
{
    if (!R->open || R->closing || R->c.mirror || R->next_round != round)
        return -1;
    ptrdiff_t k = srv__id_find(R->selected, R->nselected, client_id);
    return k >= 0 && R->reported[k] != SRV_REPORT_UPDATE ? k : -1;
}

int srv__round_adopt(srv_rounds *R, strata_store *st, strata_diag *d)
{
    size_t n_adopted = 0;
    pthread_mutex_lock(R->c.mu);
    int open = R->open && !R->closing && !R->c.mirror;
    uint32_t round = R->next_round;
    size_t from = R->stored_seen;
    pthread_mutex_unlock(R->c.mu);
    strata_store_update *ups = NULL;
    size_t n = 0, done = 0; /* done: the updates gone through (a failed read stops) */
    int rc = open ? strata_store_update_list_from(st, round, from, &ups, &n, d) : 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        pthread_mutex_lock(R->c.mu);
        ptrdiff_t k = lacking(R, round, ups[i].client_id);
        pthread_mutex_unlock(R->c.mu);
        if (k < 0) {
            done = i + 1;
            continue;
        }
        uint8_t *buf = NULL;
        size_t len = 0;
        strata_payload *p = NULL;
        strata_diag pd = {{0}};
        rc = strata_store_update_read(st, round, ups[i].client_id, &buf, &len, d);
        int bad = rc == 0 ? strata_payload_decode(buf, len, &R->c.limits, &p, &pd) : 0;
        if (bad < 0) /* another coordinator took it: another configuration? */
            strata_log_error("round %u: the update of client %llu that another coordinator "
                             "stored cannot be decoded here (%s); it is left out",
                             round, (unsigned long long)ups[i].client_id,
                             strata_diag_msg(&pd, bad));
        pthread_mutex_lock(R->c.mu);
        if (rc == 0 && bad == 0 && (k = lacking(R, round, ups[i].client_id)) >= 0) {
            if (R->reported[k] == SRV_REPORT_SKIPPED) {
                R->reported[k] = SRV_REPORT_NONE;
                R->nskipped--;
            }
            srv__round_accept(R, p, k, len);
            srv__ctr_add(R->c.met, SRV_CTR_ACCEPTED, 1); /* derived: not saved */
            n_adopted++;
        }
        pthread_mutex_unlock(R->c.mu);
        strata_payload_free(p);
        free(buf);
        if (rc == 0)
            done = i + 1;
    }
    strata_store_update_list_free(ups, n);
    pthread_mutex_lock(R->c.mu);
    if (R->next_round == round && R->open && from + done > R->stored_seen)
        R->stored_seen = from + done;
    if (n_adopted > 0 && srv__round_full(R))
        pthread_cond_broadcast(R->c.wake);
    pthread_mutex_unlock(R->c.mu);
    return rc;
}

int srv__round_mirror_updates(srv_rounds *R, strata_store *st, strata_diag *d)
{
    pthread_mutex_lock(R->c.mu);
    int open = R->open && R->c.mirror;
    uint32_t round = R->next_round;
    size_t from = R->stored_seen;
    pthread_mutex_unlock(R->c.mu);
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = open ? strata_store_update_list_from(st, round, from, &ups, &n, d) : 0;
    pthread_mutex_lock(R->c.mu);
    int same = rc == 0 && R->open && R->next_round == round;
    for (size_t i = 0; same && i < n; i++) {
        ptrdiff_t k = srv__id_find(R->selected, R->nselected, ups[i].client_id);
        if (k >= 0 && !R->reported[k]) {
            R->reported[k] = SRV_REPORT_UPDATE;
            R->nreported++;
        }
    }
    if (same && from + n > R->stored_seen)
        R->stored_seen = from + n;
    pthread_mutex_unlock(R->c.mu);
    strata_store_update_list_free(ups, n);
    return rc;
}

void srv__round_catch_up(srv_rounds *R, uint32_t round)
{
    int behind = R->c.mirror &&
                 ((round == R->next_round && !R->open) || (R->open && round == R->next_round + 1));
    uint32_t last = 0;
    int found = 0;
    strata_diag d = {{0}};
    /* Only a round the store has (one cheap read first): an upload for a
     * round that does not exist yet costs no re-read. */
    int rc = behind ? strata_store_last_round(R->c.store, &last, &found, &d) : 0;
    if (rc == 0 && behind && found && last >= round)
        rc = srv__round_mirror(R, &d);
    if (rc < 0)
        strata_log_warn("round %u: cannot read the leader's round: %s", round,
                        strata_diag_msg(&d, rc));
}

int srv__round_mirror(srv_rounds *R, strata_diag *d)
{
    srv__round_reset(R);
    int rc = resume_state(R, d);
    if (rc < 0)
        srv__round_reset(R);
    R->finished = R->stopped || (!R->open && R->next_round >= (uint32_t)R->c.rounds);
    return rc;
}

int srv__round_resume(srv_rounds *R, size_t test_n, strata_diag *d)
{
    int rc = resume_state(R, d);
    if (rc == 0)
        rc = count_from_store(R, test_n, d);
    if (rc == 0 && !R->open && R->next_round >= (uint32_t)R->c.rounds)
        R->finished = 1;
    return rc;
}
