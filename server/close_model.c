/* The computing steps of a close (see close_internal.h): gathering the
 * round's updates and their norms, the screening and quarantine of
 * outlying updates, the aggregation (FedAvg re-aggregated from the stored
 * updates when some are left out, or a robust rule over them), the server
 * optimiser's step on the model in place with a copy of its state, the
 * evaluation, and the finiteness checks (leaving out the largest updates,
 * else failing the round with the model unchanged; docs/algorithm.md,
 * "Screening"). Nothing here takes the engine lock or writes a file.
 *
 * May call: the store (reading the round's updates), aggregate.h,
 * robust.h, eval.h, registry.h (sorted ids), libstrata (payload, clock,
 * log). */
#include "close_internal.h"

#include "strata/clock.h"
#include "strata/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The screening rule applies from this many updates on (docs/algorithm.md,
 * "Screening"). */
#define SCREEN_MIN_UPDATES 3

void srv__close_job_cleanup(close_job *j)
{
    for (size_t i = 0; j->u != NULL && i < j->n; i++)
        strata_payload_free(j->u[i].p);
    free(j->u);
    j->u = NULL;
    j->n = 0;
}

size_t srv__close_kept(const close_job *j)
{
    size_t k = 0;
    for (size_t i = 0; i < j->n; i++)
        k += j->u[i].quarantined == 0;
    return k;
}

/* Reads stored update i of the job's round from wstore and decodes it into
 * *p. A stored update was decoded and validated when it was accepted, so a
 * decoding error is an impossible state; a read error may pass. */
static int read_update(close_job *j, size_t i, strata_payload **p, strata_diag *d)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = strata_store_update_read(j->store, j->round, j->u[i].client_id, &buf, &len, d);
    if (rc == 0 && (rc = strata_payload_decode(buf, len, j->limits, p, d)) < 0)
        j->impossible = 1;
    free(buf);
    return rc;
}

/* Lists the round's accepted updates with their norms: FedAvg's were
 * measured as they streamed in (the round's norms); for a robust rule every
 * update is read and decoded here, once, and measured. Called without the
 * lock while the round is closing: its stored updates, selection and norms
 * are final then (round_internal.h). */
int srv__close_gather(close_job *j, strata_diag *d)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(j->store, j->round, &ups, &n, d);
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
        ptrdiff_t k = srv__id_find(j->selected, j->nselected, ups[i].client_id);
        j->u[i].norm = k >= 0 && j->method == STRATA_ROBUST_FEDAVG ? j->norms[k] : NAN;
    }
    strata_store_update_list_free(ups, n);
    if (j->method == STRATA_ROBUST_FEDAVG) {
        j->all_streamed = strata_agg_count(j->streamed) == n;
        return 0;
    }
    strata_robust_update *ru = calloc(n ? n : 1, sizeof(*ru));
    double *norms = calloc(n ? n : 1, sizeof(*norms));
    if (ru == NULL || norms == NULL)
        rc = strata_diag_set(d, STRATA_ENOMEM, "out of memory (%zu updates)", n);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = read_update(j, i, &j->u[i].p, d);
        if (rc == 0) {
            ru[i].layers = j->u[i].p->layers;
            ru[i].n_layers = j->u[i].p->num_layers;
        }
    }
    if (rc == 0 && (rc = strata_robust_norms(strata_model_params(j->model), ru, n, norms, d)) < 0)
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
int srv__close_screen(close_job *j, strata_diag *d)
{
    double factor = j->screen_factor;
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
static int aggregate(close_job *j, strata_tensor_list *delta, strata_diag *d)
{
    const strata_tensor_list *layout = strata_model_params(j->model);
    size_t kept = srv__close_kept(j);
    int rc = 0;
    if (j->method == STRATA_ROBUST_FEDAVG) {
        if (j->all_streamed && kept == j->n)
            return strata_agg_mean(j->streamed, delta, d);
        strata_agg *agg = NULL;
        if ((rc = strata_agg_new(layout, &agg)) < 0)
            return strata_diag_set(d, rc, "re-aggregation: %s", strata_strerror(rc));
        for (size_t i = 0; rc == 0 && i < j->n; i++) {
            if (j->u[i].quarantined)
                continue;
            strata_payload *p = NULL;
            rc = read_update(j, i, &p, d);
            if (rc == 0 && (rc = strata_agg_add_clipped(agg, p->layers, p->num_layers,
                                                        j->u[i].weight, j->clip_norm, NULL, d)) < 0)
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
    rc = strata_robust_aggregate(layout, ru, kept, j->method, j->trim_fraction, j->clip_norm, delta,
                                 d);
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
int srv__close_find_model(close_job *j, strata_diag *d)
{
    strata_tensor_list *params = strata_model_params(j->model);
    strata_tensor_list delta;
    strata_tensor_list_init(&delta);
    int rc = strata_tensor_list_zeros_like(&delta, params);
    if (rc < 0)
        return strata_diag_set(d, rc, "out of memory (the aggregate)");
    strata_tensor_list_copy_values(j->rollback, params);
    size_t kept0 = srv__close_kept(j), removed = 0;
    for (;;) {
        strata_round_failure f = STRATA_ROUND_FAILED_NONE;
        double t0 = strata_clock_mono_s();
        j->last_kept = srv__close_kept(j);
        if (kept0 == 0) {
            f = STRATA_ROUND_FAILED_AGGREGATE;
            snprintf(j->failure, sizeof(j->failure), "no update has a finite norm");
        } else if ((rc = aggregate(j, &delta, d)) < 0) {
            break;
        } else if (!all_finite(&delta, "the aggregate", j->failure, sizeof(j->failure))) {
            f = STRATA_ROUND_FAILED_AGGREGATE;
        } else {
            if ((rc = strata_server_opt_copy_state(j->opt_next, j->opt, d)) < 0 ||
                (rc = strata_server_opt_step(j->opt_next, params, &delta, d)) < 0) {
                j->impossible = 1;
                break;
            }
            j->agg_s += strata_clock_mono_s() - t0;
            if (!all_finite(params, "the model", j->failure, sizeof(j->failure))) {
                f = STRATA_ROUND_FAILED_MODEL;
            } else if ((rc = srv__eval_run(j->eval, j->model, j->round, &j->st)) < 0) {
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
                strata_tensor_list_copy_values(params, j->rollback);
        }
        if (f == STRATA_ROUND_FAILED_NONE)
            break;
        strata_log_warn("round %u: %s with %zu of %zu updates", j->round, j->failure,
                        srv__close_kept(j), j->n);
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
        strata_tensor_list_copy_values(params, j->rollback);
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
strata_round_quarantine *srv__close_quarantine_list(const close_job *j, size_t *n, int *nomem)
{
    *n = 0;
    *nomem = 0;
    size_t q = j->n - srv__close_kept(j);
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
