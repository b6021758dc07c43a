/* Closing a round (see round.h): the screening and quarantine of outlying
 * updates, the aggregation (FedAvg re-aggregated from the stored updates
 * when some are left out, or a robust rule over them), the server
 * optimiser's step on the model in place with a copy of its state, the
 * finiteness checks (leaving out the largest updates, else failing the round
 * with the model unchanged), a round with too few updates, the checkpoint,
 * the evaluation, the summary, the stragglers, and the retries of a close
 * that failed for a reason that can pass.
 *
 * Closing: the round's updates are screened by their L2 norms and outliers
 * quarantined (kept stored, left out of the aggregate, listed in the
 * summary); the server step is applied to the model in place with a copy of
 * the optimiser's state, and the aggregate, the model and its evaluation
 * must be finite, else the updates with the largest norms are left out too,
 * and when nothing finite remains the round closes as failed with the model
 * unchanged (docs/algorithm.md, "Screening"). Nothing that is not finite is
 * checkpointed or served. A round closed with fewer than min_updates updates
 * (its deadline passed, or the other selected clients skipped) closes as
 * failed without touching the model.
 *
 * A close that fails (the checkpoint cannot be written, the database is
 * full or busy, out of memory) puts the model and the optimiser back, keeps
 * the round closing (its uploads refused, clients told "no task yet") and
 * is tried again by the round thread after 1, 2, 4, ... up to 30 seconds,
 * with the same updates on the same model. Only a state that retrying cannot
 * mend (a stored, validated update that no longer decodes; the store saying
 * the round is not open) stops the federation; finishing the last round
 * ends it.
 *
 * May call: the store, aggregate.h, robust.h, models.h, metrics.h,
 * registry.h (sorted ids), libstrata (checkpoint, train, payload, clock,
 * log, the round-summary codec). */
#include "round.h"

#include "engine_internal.h"
#include "lgreco.h"

#include "strata/checkpoint.h"
#include "strata/clock.h"
#include "strata/log.h"
#include "strata/summary.h"
#include "strata/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A close or an open that failed for a reason that can pass is retried
 * after 1, 2, 4, 8, 16, then every 30 seconds. */
#define CLOSE_BACKOFF_MIN_MS 1000
#define CLOSE_BACKOFF_MAX_MS 30000

/* The wait before the next attempt after k earlier failures (0 for the
 * first failure). */
int64_t srv__retry_backoff_ms(unsigned k)
{
    int64_t wait = (int64_t)CLOSE_BACKOFF_MIN_MS << (k < 5 ? k : 5);
    return wait < CLOSE_BACKOFF_MAX_MS ? wait : CLOSE_BACKOFF_MAX_MS;
}

/* The screening rule applies from this many updates on (docs/algorithm.md,
 * "Screening"). */
#define SCREEN_MIN_UPDATES 3

int srv__round_ready_to_close(const srv_engine *e, int64_t now)
{
    /* A close that failed waits for its retry. */
    if (e->closing)
        return !e->close_busy && e->close_failures > 0 &&
               strata_clock_mono_ms() >= e->close_retry_ms;
    /* Not while a group commit is in flight: its updates are acknowledged
     * only after they are aggregated. */
    if (!e->open || e->committing)
        return 0;
    /* Every selected client answered, or enough updates arrived (fewer
     * than the selection with over-selection), or the deadline passed:
     * close_round decides whether the updates suffice. */
    if (e->nreported + e->nskipped >= e->nselected)
        return 1;
    if (e->nreported > 0 && e->nreported >= e->enough)
        return 1;
    return now >= e->deadline_ms;
}

/* One accepted update of the round being closed. */
typedef struct close_update {
    uint64_t client_id;
    double weight;     /* its sample count (FedAvg's weight) */
    double norm;       /* the L2 norm of its decoded values, before any clipping */
    int quarantined;   /* 0, or 1 + its strata_quarantine_reason */
    strata_payload *p; /* decoded (robust rules), else NULL */
} close_update;

/* One attempt at closing round `round`: its updates in the order they were
 * accepted, which of them the aggregate leaves out, and the outcome. */
typedef struct close_job {
    uint32_t round;
    close_update *u;
    size_t n;
    int streamed;  /* FedAvg: e->agg holds exactly these n updates */
    double median; /* the median norm the screening compared with; NaN: not applied */
    strata_round_failure failed;
    char failure[256]; /* what was not finite, when failed */
    size_t last_kept;  /* updates the last attempt aggregated */
    strata_train_stats st;
    double agg_s;
    int impossible; /* the error is a state that retrying cannot mend */
} close_job;

static void close_job_cleanup(close_job *j)
{
    for (size_t i = 0; j->u != NULL && i < j->n; i++)
        strata_payload_free(j->u[i].p);
    free(j->u);
    j->u = NULL;
    j->n = 0;
}

static size_t count_kept(const close_job *j)
{
    size_t k = 0;
    for (size_t i = 0; i < j->n; i++)
        k += j->u[i].quarantined == 0;
    return k;
}

/* Reads stored update i of the job's round from wstore and decodes it into
 * *p. A stored update was decoded and validated when it was accepted, so a
 * decoding error is an impossible state; a read error may pass. */
static int read_update(srv_engine *e, close_job *j, size_t i, strata_payload **p, strata_diag *d)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = strata_store_update_read(e->wstore, j->round, j->u[i].client_id, &buf, &len, d);
    if (rc == 0 && (rc = strata_payload_decode(buf, len, &e->limits, p, d)) < 0)
        j->impossible = 1;
    free(buf);
    return rc;
}

/* Lists the round's accepted updates with their norms: FedAvg's were
 * measured as they streamed in (e->norms); for a robust rule every update
 * is read and decoded here, once, and measured. Called without the lock
 * while the round is closing: its stored updates, selection and norms are
 * final then (engine_internal.h). */
static int gather(srv_engine *e, close_job *j, strata_diag *d)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(e->wstore, j->round, &ups, &n, d);
    if (rc < 0)
        return rc;
    j->u = calloc(n ? n : 1, sizeof(*j->u));
    if (j->u == NULL) {
        strata_store_update_list_free(ups, n);
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory (%zu updates)", n);
    }
    j->n = n;
    for (size_t i = 0; i < n; i++) {
        j->u[i].client_id = ups[i].client_id;
        j->u[i].weight = (double)ups[i].receipt.samples;
        ptrdiff_t k = srv__id_find(e->selected, e->nselected, ups[i].client_id);
        j->u[i].norm = k >= 0 && e->method == STRATA_ROBUST_FEDAVG ? e->norms[k] : NAN;
    }
    strata_store_update_list_free(ups, n);
    if (e->method == STRATA_ROBUST_FEDAVG) {
        j->streamed = strata_agg_count(e->agg) == n;
        return 0;
    }
    strata_robust_update *ru = calloc(n ? n : 1, sizeof(*ru));
    double *norms = calloc(n ? n : 1, sizeof(*norms));
    if (ru == NULL || norms == NULL)
        rc = strata_diag_set(d, STRATA_ENOMEM, "out of memory (%zu updates)", n);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = read_update(e, j, i, &j->u[i].p, d);
        if (rc == 0) {
            ru[i].layers = j->u[i].p->layers;
            ru[i].n_layers = j->u[i].p->num_layers;
        }
    }
    if (rc == 0 && (rc = strata_robust_norms(strata_model_params(e->model), ru, n, norms, d)) < 0)
        j->impossible = 1;
    for (size_t i = 0; rc == 0 && i < n; i++)
        j->u[i].norm = norms[i];
    free(ru);
    free(norms);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The screening rule (docs/algorithm.md, "Screening"): an update whose norm
 * is not finite is quarantined as non_finite; with factor > 0 and at least
 * SCREEN_MIN_UPDATES finite norms whose median M is above 0, every update
 * whose norm is above factor * M is quarantined as norm. Sets j->median (NaN
 * when the rule did not apply). */
static int screen(close_job *j, double factor, strata_diag *d)
{
    j->median = NAN;
    double *v = calloc(j->n ? j->n : 1, sizeof(*v));
    if (v == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory (%zu norms)", j->n);
    size_t m = 0;
    for (size_t i = 0; i < j->n; i++) {
        if (isfinite(j->u[i].norm))
            v[m++] = j->u[i].norm;
        else
            j->u[i].quarantined = 1 + STRATA_QUARANTINE_NON_FINITE;
    }
    if (factor > 0 && m >= SCREEN_MIN_UPDATES) {
        qsort(v, m, sizeof(*v), cmp_double);
        double med = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
        if (med > 0) {
            j->median = med;
            for (size_t i = 0; i < j->n; i++)
                if (j->u[i].quarantined == 0 && j->u[i].norm > factor * med)
                    j->u[i].quarantined = 1 + STRATA_QUARANTINE_NORM;
        }
    }
    free(v);
    return 0;
}

/* The aggregate of the updates the job keeps, into delta (the model's
 * layout). FedAvg: the streamed mean when it keeps them all, else the
 * round re-aggregated from the stored updates it keeps, in the order they
 * were accepted, each read once (exactly what streaming only those would
 * have given). Robust rules: the rule over the kept decoded updates. */
static int aggregate(srv_engine *e, close_job *j, strata_tensor_list *delta, strata_diag *d)
{
    const strata_tensor_list *layout = strata_model_params(e->model);
    size_t kept = count_kept(j);
    int rc = 0;
    if (e->method == STRATA_ROBUST_FEDAVG) {
        if (j->streamed && kept == j->n)
            return strata_agg_mean(e->agg, delta, d);
        strata_agg *agg = NULL;
        if ((rc = strata_agg_new(layout, &agg)) < 0)
            return strata_diag_set(d, rc, "re-aggregation: %s", strata_strerror(rc));
        for (size_t i = 0; rc == 0 && i < j->n; i++) {
            if (j->u[i].quarantined)
                continue;
            strata_payload *p = NULL;
            rc = read_update(e, j, i, &p, d);
            if (rc == 0 &&
                (rc = strata_agg_add_clipped(agg, p->layers, p->num_layers, j->u[i].weight,
                                             e->cfg->clip_norm, NULL, d)) < 0)
                j->impossible = 1;
            strata_payload_free(p);
        }
        if (rc == 0)
            rc = strata_agg_mean(agg, delta, d);
        strata_agg_free(agg);
        return rc;
    }
    strata_robust_update *ru = calloc(kept ? kept : 1, sizeof(*ru));
    if (ru == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory (%zu updates)", kept);
    size_t k = 0;
    for (size_t i = 0; i < j->n; i++)
        if (!j->u[i].quarantined) {
            ru[k].layers = j->u[i].p->layers;
            ru[k++].n_layers = j->u[i].p->num_layers;
        }
    rc = strata_robust_aggregate(layout, ru, kept, e->method, e->cfg->trim_fraction,
                                 e->cfg->clip_norm, delta, d);
    if (rc == STRATA_EPROTO || rc == STRATA_EINVAL)
        j->impossible = 1;
    free(ru);
    return rc;
}

/* 1 when every element of l is finite; otherwise 0, with the first element
 * that is not described in msg. */
static int all_finite(const strata_tensor_list *l, const char *what, char *msg, size_t cap)
{
    for (size_t i = 0; i < l->count; i++) {
        const float *x = l->items[i].data;
        for (size_t k = 0; k < l->items[i].numel; k++)
            if (!isfinite(x[k])) {
                snprintf(msg, cap, "%s %s[%zu] is %s", what, l->items[i].name, k,
                         isnan(x[k]) ? "NaN" : "infinite");
                return 0;
            }
    }
    return 1;
}

/* Leaves out one more batch of the kept updates with the largest norms
 * (quarantined as non_finite): 1 in all, then 2, 4, ... in all, at most all
 * but one of those the screening kept (kept0). Returns 0 when none is left
 * to leave out. */
static int leave_out_more(close_job *j, size_t kept0, size_t *removed)
{
    if (*removed + 1 >= kept0)
        return 0;
    size_t want = *removed == 0 ? 1 : *removed * 2;
    if (want > kept0 - 1)
        want = kept0 - 1;
    for (; *removed < want; (*removed)++) {
        size_t best = j->n;
        for (size_t i = 0; i < j->n; i++)
            if (!j->u[i].quarantined && (best == j->n || j->u[i].norm > j->u[best].norm))
                best = i;
        j->u[best].quarantined = 1 + STRATA_QUARANTINE_NON_FINITE;
    }
    return 1;
}

/* Finds the round's new model: aggregates the updates the screening kept,
 * applies the server step to the model (in place) with opt_next (a copy of
 * opt's state), checks that the aggregate, the model and its evaluation are
 * finite, and otherwise puts the model back from rollback and leaves out
 * the updates with the largest norms (leave_out_more) until they are, or
 * none is left to leave out: then the round fails (j->failed, the model
 * unchanged, and only the screening's quarantines stand). On success the
 * model holds the new parameters (rollback the old) and opt_next the new
 * state. Called without the lock. Errors: those of the aggregation, the
 * step and the evaluation, with the model put back. */
static int find_model(srv_engine *e, close_job *j, strata_diag *d)
{
    strata_tensor_list *params = strata_model_params(e->model);
    strata_tensor_list delta;
    strata_tensor_list_init(&delta);
    int rc = strata_tensor_list_zeros_like(&delta, params);
    if (rc < 0)
        return strata_diag_set(d, rc, "out of memory (the aggregate)");
    strata_tensor_list_copy_values(&e->rollback, params);
    size_t kept0 = count_kept(j), removed = 0;
    for (;;) {
        strata_round_failure f = STRATA_ROUND_FAILED_NONE;
        double t0 = strata_clock_mono_s();
        j->last_kept = count_kept(j);
        if (kept0 == 0) {
            f = STRATA_ROUND_FAILED_AGGREGATE;
            snprintf(j->failure, sizeof(j->failure), "no update has a finite norm");
        } else if ((rc = aggregate(e, j, &delta, d)) < 0) {
            break;
        } else if (!all_finite(&delta, "the aggregate", j->failure, sizeof(j->failure))) {
            f = STRATA_ROUND_FAILED_AGGREGATE;
        } else {
            if ((rc = strata_server_opt_copy_state(e->opt_next, e->opt, d)) < 0 ||
                (rc = strata_server_opt_step(e->opt_next, params, &delta, d)) < 0) {
                j->impossible = 1;
                break;
            }
            j->agg_s += strata_clock_mono_s() - t0;
            if (!all_finite(params, "the model", j->failure, sizeof(j->failure))) {
                f = STRATA_ROUND_FAILED_MODEL;
            } else if ((rc = srv__evaluate(e, e->model, j->round, &j->st)) < 0) {
                strata_diag_set(d, rc, "evaluation: %s", strata_strerror(rc));
                break;
            } else if (!isfinite(j->st.loss) || !isfinite(j->st.accuracy)) {
                int loss_bad = !isfinite(j->st.loss);
                double x = loss_bad ? j->st.loss : j->st.accuracy;
                f = STRATA_ROUND_FAILED_LOSS;
                snprintf(j->failure, sizeof(j->failure), "the model's evaluation %s is %s",
                         loss_bad ? "loss" : "accuracy", isnan(x) ? "NaN" : "infinite");
            }
            if (f != STRATA_ROUND_FAILED_NONE)
                strata_tensor_list_copy_values(params, &e->rollback);
        }
        if (f == STRATA_ROUND_FAILED_NONE)
            break;
        strata_log_warn("round %u: %s with %zu of %zu updates", j->round, j->failure, count_kept(j),
                        j->n);
        if (!leave_out_more(j, kept0, &removed)) {
            for (size_t i = 0; i < j->n; i++)
                if (j->u[i].quarantined == 1 + STRATA_QUARANTINE_NON_FINITE &&
                    isfinite(j->u[i].norm))
                    j->u[i].quarantined = 0;
            j->failed = f;
            memset(&j->st, 0, sizeof(j->st));
            j->st.loss = j->st.accuracy = NAN;
            break;
        }
    }
    if (rc < 0)
        strata_tensor_list_copy_values(params, &e->rollback);
    strata_tensor_list_cleanup(&delta);
    return rc;
}

static int cmp_client(const void *a, const void *b)
{
    uint64_t x = ((const strata_round_quarantine *)a)->client_id;
    uint64_t y = ((const strata_round_quarantine *)b)->client_id;
    return x < y ? -1 : x > y;
}

/* The quarantined updates of a job in ascending client id order, for the
 * summary (a new array, or NULL with *n = 0 when there are none). */
static strata_round_quarantine *quarantine_list(const close_job *j, size_t *n, int *nomem)
{
    *n = 0;
    *nomem = 0;
    size_t q = j->n - count_kept(j);
    if (q == 0)
        return NULL;
    strata_round_quarantine *out = calloc(q, sizeof(*out));
    if (out == NULL) {
        *nomem = 1;
        return NULL;
    }
    for (size_t i = 0; i < j->n; i++)
        if (j->u[i].quarantined) {
            strata_round_quarantine *o = &out[(*n)++];
            o->client_id = j->u[i].client_id;
            o->reason = (strata_quarantine_reason)(j->u[i].quarantined - 1);
            o->norm = j->u[i].norm;
        }
    qsort(out, *n, sizeof(*out), cmp_client);
    return out;
}

/* Logs the job's quarantined updates and counts them. Lock held. */
static void report_quarantine(srv_engine *e, const close_job *j)
{
    for (size_t i = 0; i < j->n; i++) {
        const close_update *u = &j->u[i];
        if (u->quarantined == 1 + STRATA_QUARANTINE_NORM) {
            srv__ctr_add(e, SRV_CTR_QUARANTINED_NORM, 1);
            strata_log_warn("round %u: client %llu's update quarantined (norm): its L2 norm "
                            "%.4g is above %g times the round's median norm %.4g",
                            j->round, (unsigned long long)u->client_id, u->norm,
                            e->cfg->screen_factor, j->median);
        } else if (u->quarantined) {
            srv__ctr_add(e, SRV_CTR_QUARANTINED_NON_FINITE, 1);
            strata_log_warn("round %u: client %llu's update quarantined (non_finite): L2 norm "
                            "%.4g; with it the aggregate, model or loss was not finite",
                            j->round, (unsigned long long)u->client_id, u->norm);
        }
    }
}

/* After round r closed at its deadline: each selected client that answered
 * nothing (no update, no skip) is counted and not selected again for the
 * next straggler_rounds rounds while others can be. (Clients left waiting
 * by an early close, with over-selection, were not late.) Lock held. */
static void bench_stragglers(srv_engine *e, uint32_t r)
{
    size_t late = 0;
    for (size_t k = 0; k < e->nselected; k++) {
        if (e->reported[k] != SRV_REPORT_NONE)
            continue;
        late++;
        ptrdiff_t i = srv__id_find(e->clients, e->nclients, e->selected[k]);
        if (i >= 0 && e->cfg->straggler_rounds > 0)
            e->cstate[i].benched_until = r + 1 + (uint32_t)e->cfg->straggler_rounds;
    }
    if (late == 0)
        return;
    srv__ctr_add(e, SRV_CTR_STRAGGLERS, (int64_t)late);
    strata_log_info("round %u: %zu of %zu selected clients did not answer by the deadline%s", r,
                    late, e->nselected,
                    e->cfg->straggler_rounds > 0 ? "; they wait before being selected again" : "");
}

/* Stops serving rounds after a state that retrying cannot mend. Lock
 * held. */
static void give_up(srv_engine *e)
{
    e->closing = 0;
    e->open = 0;
    e->finished = 1;
    srv__waiters_wake_all(e);
}

/* After a close attempt that did not commit: the round stays closing and
 * the round thread tries again after a capped exponential backoff, unless
 * the failure is a state that retrying cannot mend. Lock held. */
static void close_failed(srv_engine *e, uint32_t r, int impossible, const strata_diag *d, int rc)
{
    if (impossible) {
        strata_log_error("round %u: closing is impossible: %s; this cannot pass by retrying "
                         "(a stored update or the store contradicts the round); no further "
                         "rounds",
                         r, strata_diag_msg(d, rc));
        give_up(e);
        return;
    }
    int64_t wait = srv__retry_backoff_ms(e->close_failures++);
    e->close_retry_ms = strata_clock_mono_ms() + wait;
    srv__ctr_add(e, SRV_CTR_CLOSE_FAILURES, 1);
    strata_log_error("round %u: closing failed (attempt %u): %s; the model stays at version %llu; "
                     "retrying in %lld s",
                     r, e->close_failures, strata_diag_msg(d, rc), (unsigned long long)e->version,
                     (long long)(wait / 1000));
}

/* The store refused to close round r as not open (STRATA_ESTATE). After a
 * failed attempt that is what a COMMIT reported as failed but
 * written after all leaves behind: the round is closed with this attempt's
 * outcome, and 0 is returned. Otherwise it is an impossible state. Lock
 * held. */
static int already_closed(srv_engine *e, uint32_t r, close_job *j)
{
    strata_store_round rd;
    memset(&rd, 0, sizeof(rd));
    int found = 0;
    strata_diag qd = {{0}};
    int closed = e->close_failures > 0 &&
                 strata_store_round_get(e->store, r, &rd, &found, &qd) == 0 && found &&
                 rd.state == STRATA_STORE_ROUND_CLOSED;
    strata_store_round_cleanup(&rd);
    if (closed) {
        strata_log_warn("round %u: an earlier close attempt was committed after all", r);
        return 0;
    }
    j->impossible = 1;
    return STRATA_ESTATE;
}

/* The lgreco solve of a round that asked for error tables, over the
 * updates the aggregate kept. */
static int solve_lgreco(srv_engine *e, const close_job *j, strata_diag *d)
{
    uint64_t *ids = calloc(j->n + 1, sizeof(*ids));
    double *w = calloc(j->n + 1, sizeof(*w));
    int *kept = calloc(j->n + 1, sizeof(*kept));
    int rc = strata_diag_set(d, STRATA_ENOMEM, "out of memory (%zu updates)", j->n);
    if (ids != NULL && w != NULL && kept != NULL) {
        for (size_t i = 0; i < j->n; i++) {
            ids[i] = j->u[i].client_id;
            w[i] = j->u[i].weight;
            kept[i] = j->u[i].quarantined == 0;
        }
        rc = srv__lgreco_solve(e, j->round, ids, w, kept, j->n, d);
    }
    free(ids);
    free(w);
    free(kept);
    return rc;
}

/* Closes the open round: screening, aggregate, server step, evaluation,
 * checkpoint, store (docs/algorithm.md, "Screening"; docs/operations.md,
 * "Closing a round"). Called by the round thread with the lock held; drops
 * it for everything but the store's records (uploads for the round are
 * refused meanwhile). The model moves on only when the store has recorded
 * the close: otherwise it is put back, the round stays closing and the
 * close is tried again later with the same updates on the same model. */
void srv__round_close(srv_engine *e)
{
    strata_diag d = {{0}};
    uint32_t r = e->next_round;
    uint64_t v = e->version + 1;
    strata_tensor_list *params = strata_model_params(e->model);
    /* From here no update of this round can be accepted (closing; no group
     * commit is in flight, see srv__round_ready_to_close), so the round's stored
     * updates are final: they are read without the lock. */
    e->closing = 1;
    e->close_busy = 1;
    close_job j = {.round = r};
    srv_model_blob blob = {0};
    char path[4096], opath[4200];
    /* Too few updates (the deadline passed, or every other selected client
     * skipped): the round closes without touching the model. */
    int too_few = e->nreported < (size_t)e->cfg->min_updates;
    /* Closed by its deadline (not every client answered, not enough
     * updates for an early close): the silent clients were late. */
    int late = e->nreported + e->nskipped < e->nselected && e->nreported < e->enough;
    pthread_mutex_unlock(&e->mu);

    int rc = 0;
    if (too_few) {
        j.failed = STRATA_ROUND_FAILED_TOO_FEW;
        j.st.loss = j.st.accuracy = NAN; /* not evaluated: null in the summary */
    } else if ((rc = gather(e, &j, &d)) == 0 && (rc = screen(&j, e->cfg->screen_factor, &d)) == 0)
        rc = find_model(e, &j, &d);
    int stepped = rc == 0 && j.failed == STRATA_ROUND_FAILED_NONE;
    if (stepped && e->ncands > 0)
        rc = solve_lgreco(e, &j, &d);
    /* With --downlink: the delta, x̂ and its evaluation (what clients
     * get); the digest of the served model in every case. */
    char digest[STRATA_DIGEST_HEX_SIZE] = "";
    int dl_moved = 0, dl_rc = 0;
    if (stepped && rc == 0) {
        dl_rc = srv__downlink_close(e, r, v, &j.st, digest, &d);
        dl_moved = dl_rc == 0;
    }
    /* A model that is not finite is never saved or served: a failed round
     * keeps the current version. A failed downlink step fails the attempt
     * (it is retried). */
    if (stepped && dl_rc < 0)
        rc = dl_rc;
    else if (stepped) {
        rc = strata_store_checkpoint_path(e->store, v, path, sizeof(path), &d);
        if (rc == 0)
            rc = strata_checkpoint_save(srv__served_model(e), path, &d);
        if (rc == 0) {
            srv__opt_path(e, v, opath, sizeof(opath));
            rc = strata_server_opt_save(e->opt_next, opath, &d);
        }
        if (rc == 0)
            rc = srv__model_encode(e, &blob, &d);
    }

    pthread_mutex_lock(&e->mu);
    if (rc == 0 && stepped)
        rc = strata_store_checkpoint_record(e->store, v, &d);
    int64_t dur = strata_clock_unix_ms() - e->opened_ms;
    if (rc == 0) {
        strata_round_summary s = srv__summary_of_open(e);
        s.has_stats = s.has_densities = 1;
        s.accuracy = j.st.accuracy;
        s.loss = j.st.loss;
        s.eval_samples = j.st.samples;
        s.uplink_bytes = e->uplink;
        s.downlink_bytes = e->downlink;
        s.dense_uplink_bytes = e->nreported * e->total_params * 4;
        s.duration_ms = dur > 0 ? (uint64_t)dur : 0;
        s.failed = j.failed;
        int nomem = 0;
        s.quarantined = quarantine_list(&j, &s.num_quarantined, &nomem);
        char *sum = NULL;
        rc = nomem ? strata_diag_set(&d, STRATA_ENOMEM, "out of memory (the summary)")
                   : srv__summary_text(e, &s, &sum, &d);
        if (rc == STRATA_EINVAL)
            j.impossible = 1;
        if (rc == 0)
            rc = strata_store_round_close(e->store, r, sum, &d);
        if (rc == STRATA_ESTATE)
            rc = already_closed(e, r, &j);
        free(sum);
        free(s.quarantined);
    }
    if (rc < 0) {
        if (stepped)
            strata_tensor_list_copy_values(params, &e->rollback);
        if (dl_moved)
            srv__downlink_rollback(e);
        srv__model_blob_cleanup(&blob);
        close_job_cleanup(&j);
        e->close_busy = 0;
        close_failed(e, r, j.impossible, &d, rc);
        return;
    }
    report_quarantine(e, &j);
    srv__ctr_add(e, SRV_CTR_DENSE, (int64_t)(2 * e->nreported * e->total_params * 4));
    size_t nq = j.n - count_kept(&j);
    if (stepped) {
        strata_server_opt *t = e->opt;
        e->opt = e->opt_next;
        e->opt_next = t;
        srv__model_install(e, &blob);
        e->version = v;
        memcpy(e->digest, digest, sizeof(e->digest));
        srv__downlink_prune(e, v);
        e->last_acc = j.st.accuracy;
        e->last_loss = j.st.loss;
        e->last_eval_samples = j.st.samples;
        e->last_agg_s = j.agg_s;
        e->last_round_s = (double)dur / 1000.0;
        srv__ctr_add(e, SRV_CTR_ROUNDS, 1);
        /* Progress lines stay on stdout, in this form: operators and tests
         * read them. */
        printf("round %u/%ld: %zu updates, accuracy %.4f, loss %.4f, uplink %llu bytes, %lld ms", r,
               e->cfg->rounds, e->nreported, j.st.accuracy, j.st.loss,
               (unsigned long long)e->uplink, (long long)dur);
        if (nq > 0)
            printf(", %zu quarantined", nq);
        if (e->cfg->server_lr_final > 0) /* the rate of this step (e->opt_next: before it) */
            printf(", server lr %.4g", strata_server_opt_lr(e->opt_next));
        printf("\n");
    } else if (too_few) {
        srv__ctr_add(e, SRV_CTR_ROUNDS_FAILED, 1);
        strata_log_warn("round %u: closed with %zu updates, fewer than --min-updates %ld (%zu of "
                        "%zu selected clients skipped); the model stays at version %llu",
                        r, e->nreported, e->cfg->min_updates, e->nskipped, e->nselected,
                        (unsigned long long)e->version);
        printf("round %u/%ld: %zu updates, failed (%s), model stays at version %llu, %lld ms\n", r,
               e->cfg->rounds, e->nreported, strata_round_failure_name(j.failed),
               (unsigned long long)e->version, (long long)dur);
    } else {
        srv__ctr_add(e, SRV_CTR_ROUNDS_FAILED, 1);
        strata_log_error("round %u: failed (%s): %s with %zu of %zu updates, after leaving out "
                         "those with the largest norms; the model stays at version %llu",
                         r, strata_round_failure_name(j.failed), j.failure, j.last_kept, j.n,
                         (unsigned long long)e->version);
        printf("round %u/%ld: %zu updates, failed (%s), %zu quarantined, model stays at version "
               "%llu, %lld ms\n",
               r, e->cfg->rounds, e->nreported, strata_round_failure_name(j.failed), nq,
               (unsigned long long)e->version, (long long)dur);
    }
    fflush(stdout);
    if (e->close_failures > 0)
        strata_log_info("round %u: closed after %u failed attempts", r, e->close_failures);
    if (late)
        bench_stragglers(e, r);
    srv__metrics_flush(e);
    close_job_cleanup(&j);
    srv__round_reset(e);
    e->downlink = 0; /* in the stored summary */
    e->close_busy = 0;
    e->next_round = r + 1;
    if (e->next_round >= (uint32_t)e->cfg->rounds) {
        e->finished = 1;
        printf("strata-server: finished %ld rounds\n", e->cfg->rounds);
        fflush(stdout);
    }
    srv__waiters_wake_all(e);
}
