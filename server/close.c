/* Closing a round (see close.h): when it is due, and the steps of a close:
 * begin, screen / aggregate / evaluate (close_model.c does the computing),
 * commit, apply, announce. This file owns the closer (struct srv_close:
 * the server's model, the server optimiser and the copies a close steps)
 * and is, with round.c and resume.c, one of the three files that touch the
 * open round's structure (round_internal.h).
 *
 * A round closed with fewer than min_updates updates (its deadline passed,
 * or the other selected clients skipped) closes as failed without touching
 * the model. A model that is not finite is never saved or served: such a
 * round closes as failed with the model unchanged (docs/algorithm.md,
 * "Screening").
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
 * May call: see close.h. */
#include "close_internal.h"

#include "lgreco.h"
#include "round_internal.h"

#include "strata/checkpoint.h"
#include "strata/clock.h"
#include "strata/log.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct srv_close {
    srv_close_config c;
    strata_model *model;         /* x: touched only by the round thread (and start-up) */
    strata_server_opt *opt;      /* the state of the current version */
    strata_server_opt *opt_next; /* stepped by a close; becomes opt when it commits */
    strata_tensor_list rollback; /* the parameters before a close's step */
};

/* Writes the path of the server optimiser's state saved with model version
 * v (STATE_DIR/checkpoints/server-opt-V.safetensors) into buf: the one place
 * that composes it. */
static void opt_path(const srv_close *C, uint64_t v, char *buf, size_t cap)
{
    if (strata_store_path(strata_store_dir(C->c.store), STRATA_STORE_FILE_SERVER_OPT, v, 0, buf,
                          cap, NULL) < 0)
        buf[0] = '\0';
}

int srv__close_new(const srv_close_config *c, strata_model *x, uint64_t version, srv_close **out,
                   strata_diag *d)
{
    *out = NULL;
    srv_close *C = calloc(1, sizeof(*C));
    if (C == NULL) {
        strata_model_free(x);
        return STRATA_ENOMEM;
    }
    C->c = *c;
    C->model = x;
    strata_tensor_list_init(&C->rollback);
    const strata_tensor_list *params = strata_model_params(x);
    strata_server_opt_config oc;
    int rc = strata_server_opt_parse(c->server_opt, &oc, d);
    if (rc == 0) {
        if (c->server_lr > 0) /* else the optimiser's own default */
            oc.lr = c->server_lr;
        oc.lr_final = c->server_lr_final;
        oc.horizon = (uint64_t)c->rounds;
        char opath[4200];
        opt_path(C, version, opath, sizeof(opath));
        struct stat st;
        int found = 0;
        if (version > 0)
            rc = strata_store_file_fetch(C->c.store, STRATA_STORE_FILE_SERVER_OPT, version, &found,
                                         d);
        if (rc < 0)
            ;
        else if (found && stat(opath, &st) == 0)
            rc = strata_server_opt_load(opath, params, &oc, &C->opt, d);
        else
            rc = strata_server_opt_new(params, &oc, &C->opt, d);
    }
    /* A close steps a copy of the optimiser and keeps the parameters it
     * started from, so that a close that does not commit changes nothing. */
    if (rc == 0)
        rc = strata_server_opt_new(params, strata_server_opt_get_config(C->opt), &C->opt_next, d);
    if (rc == 0)
        rc = strata_tensor_list_copy(&C->rollback, params);
    if (rc < 0) {
        srv__close_free(C);
        return rc;
    }
    *out = C;
    return 0;
}

void srv__close_free(srv_close *C)
{
    if (C == NULL)
        return;
    strata_model_free(C->model);
    strata_server_opt_free(C->opt);
    strata_server_opt_free(C->opt_next);
    strata_tensor_list_cleanup(&C->rollback);
    free(C);
}

strata_model *srv__close_model(const srv_close *C)
{
    return C->model;
}

int srv__close_due(const srv_rounds *R, int64_t now)
{
    /* A close that failed waits for its retry. */
    if (R->closing)
        return !R->close_busy && R->close_failures > 0 &&
               strata_clock_mono_ms() >= R->close_retry_ms;
    if (!R->open)
        return 0;
    /* Every selected client answered, or enough updates arrived (fewer
     * than the selection with over-selection), or the deadline passed:
     * the close decides whether the updates suffice. */
    return srv__round_full(R) || now >= R->deadline_ms;
}

/* What the steps of one close attempt decide and hand on. */
typedef struct close_plan {
    uint32_t r;
    uint64_t v;            /* the version the close makes */
    int too_few;           /* fewer updates than --min-updates */
    int late;              /* closed by its deadline: the silent clients were late */
    int stepped;           /* the model moved (a new version) */
    int dl_moved;          /* x̂ moved */
    int lg_solved;         /* the lgreco solve took a new allocation */
    strata_train_stats sx; /* x's evaluation (st is the served model's) */
    char digest[STRATA_DIGEST_HEX_SIZE];
    srv_model_blob blob;
    int64_t dur;
    uint64_t downlink; /* the downlink bytes in the stored summary */
    /* for announce */
    size_t nreported, nskipped, nselected, late_count;
    unsigned failures; /* failed attempts before this one */
    int64_t wait_ms;   /* after a failure: the wait before the retry */
    int gave_up;
    uint64_t kept_version; /* the version served after the attempt */
    char out[768];         /* the progress lines for stdout */
} close_plan;

/* ---- begin (lock held) ------------------------------------------------------ */

/* From here no update of this round can be accepted (closing; no group
 * commit is in flight, see srv__close_due's caller), so the round's stored
 * updates are final: the next steps read them without the lock. */
static void close_begin(srv_close *C, srv_rounds *R, close_job *j, close_plan *p)
{
    R->closing = 1;
    R->close_busy = 1;
    p->r = R->next_round;
    p->v = srv__models_version(C->c.models) + 1;
    p->too_few = R->nreported < (size_t)C->c.min_updates;
    p->late = R->nreported + R->nskipped < R->nselected && R->nreported < R->enough;
    p->nreported = R->nreported;
    p->nskipped = R->nskipped;
    p->nselected = R->nselected;
    p->failures = R->close_failures;
    *j = (close_job){.round = p->r,
                     .store = C->c.store,
                     .limits = &C->c.limits,
                     .method = C->c.method,
                     .clip_norm = C->c.clip_norm,
                     .trim_fraction = C->c.trim_fraction,
                     .screen_factor = C->c.screen_factor,
                     .model = C->model,
                     .opt = C->opt,
                     .opt_next = C->opt_next,
                     .rollback = &C->rollback,
                     .eval = C->c.eval,
                     .streamed = R->agg,
                     .selected = R->selected,
                     .norms = R->norms,
                     .nselected = R->nselected};
}

/* ---- screen, aggregate, evaluate (no lock) ---------------------------------- */

/* The lgreco solve of a round that asked for error tables, over the
 * updates the aggregate kept. */
static int solve_lgreco(srv_close *C, const close_job *j, size_t ncands, int *solved,
                        strata_diag *d)
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
        rc = srv__lgreco_solve(C->c.budgets, C->c.store, &C->c.limits, j->round, ncands, ids, w,
                               kept, j->n, solved, d);
    }
    free(ids);
    free(w);
    free(kept);
    return rc;
}

/* With --downlink: the delta (downlink.h) and the evaluation of x̂, the
 * model clients get, into j->st (x's goes to p->sx); the digest of the
 * served model in every case. On error x̂ is put back and j->st is x's. */
static int downlink_step(srv_close *C, close_job *j, close_plan *p, strata_diag *d)
{
    int rc = srv__downlink_step(C->c.downlink, p->r, p->v, p->digest, d);
    if (rc < 0)
        return rc;
    p->sx = j->st;
    strata_model *xhat = srv__downlink_xhat(C->c.downlink);
    if (xhat != NULL && (rc = srv__eval_run(C->c.eval, xhat, p->r, &j->st)) < 0) {
        strata_diag_set(d, rc, "evaluation of x̂: %s", strata_strerror(rc));
        srv__downlink_rollback(C->c.downlink);
        j->st = p->sx;
        return rc;
    }
    p->dl_moved = 1;
    return 0;
}

/* Screens the round's updates, aggregates the kept ones, steps and
 * evaluates the model (close_model.c), solves lgreco, and makes the
 * downlink step. Too few updates: the round fails without touching the
 * model. */
static int close_compute(srv_close *C, const srv_rounds *R, close_job *j, close_plan *p,
                         strata_diag *d)
{
    int rc = 0;
    if (p->too_few) {
        j->failed = STRATA_ROUND_FAILED_TOO_FEW;
        j->st.loss = j->st.accuracy = NAN; /* not evaluated: null in the summary */
    } else if ((rc = srv__close_gather(j, d)) == 0 && (rc = srv__close_screen(j, d)) == 0) {
        rc = srv__close_find_model(j, d);
    }
    p->stepped = rc == 0 && j->failed == STRATA_ROUND_FAILED_NONE;
    if (p->stepped && R->ncands > 0)
        rc = solve_lgreco(C, j, R->ncands, &p->lg_solved, d);
    if (p->stepped && rc == 0)
        rc = downlink_step(C, j, p, d);
    return rc;
}

/* ---- commit (no lock) -------------------------------------------------------- */

/* The store refused to close round r as not open (STRATA_ESTATE). After a
 * failed attempt that is what a COMMIT reported as failed but written after
 * all leaves behind: the round is closed with this attempt's outcome, and 0
 * is returned. Otherwise it is an impossible state. */
static int already_closed(srv_close *C, const close_plan *p, close_job *j)
{
    strata_store_round rd;
    memset(&rd, 0, sizeof(rd));
    int found = 0;
    strata_diag qd = {{0}};
    int closed = p->failures > 0 &&
                 strata_store_round_get(C->c.store, p->r, &rd, &found, &qd) == 0 && found &&
                 rd.state == STRATA_STORE_ROUND_CLOSED;
    strata_store_round_cleanup(&rd);
    if (closed) {
        strata_log_warn("round %u: an earlier close attempt was committed after all", p->r);
        return 0;
    }
    j->impossible = 1;
    return STRATA_ESTATE;
}

/* The new version's files: the downlink's delta and x, the checkpoint of
 * the served model, the optimiser's state, and the served model encoded for
 * distribution. */
static int write_version(srv_close *C, const close_job *j, close_plan *p, strata_diag *d)
{
    char path[4096], opath[4200];
    strata_model *served = srv__downlink_served(C->c.downlink);
    int rc = srv__downlink_write(C->c.downlink, p->r, p->v, j->st.accuracy, p->sx.accuracy, d);
    if (rc == 0)
        rc = strata_store_checkpoint_path(C->c.store, p->v, path, sizeof(path), d);
    if (rc == 0)
        rc = strata_checkpoint_save(served, path, d);
    if (rc == 0) {
        opt_path(C, p->v, opath, sizeof(opath));
        rc = strata_server_opt_save(C->opt_next, opath, d);
    }
    if (rc == 0)
        rc = srv__models_encode(C->c.models, served, &p->blob, d);
    return rc;
}

/* Writes the new version's files, then records the close in the store
 * (the checkpoint first, so that a crash in between is recovered as an
 * aggregated round) with the round's summary. */
static int close_commit(srv_close *C, srv_rounds *R, close_job *j, close_plan *p, strata_diag *d)
{
    int rc = 0;
    if (p->stepped && (rc = write_version(C, j, p, d)) == 0)
        rc = strata_store_checkpoint_record(C->c.store, p->v, d);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(R->c.mu);
    p->downlink = R->downlink;
    pthread_mutex_unlock(R->c.mu);
    p->dur = strata_clock_unix_ms() - R->opened_ms;
    strata_round_summary s = srv__round_summary_of_open(R);
    s.has_stats = s.has_densities = 1;
    s.accuracy = j->st.accuracy;
    s.loss = j->st.loss;
    s.eval_samples = j->st.samples;
    s.uplink_bytes = R->uplink;
    s.downlink_bytes = p->downlink;
    s.dense_uplink_bytes = p->nreported * C->c.total_params * 4;
    s.duration_ms = p->dur > 0 ? (uint64_t)p->dur : 0;
    s.failed = j->failed;
    int nomem = 0;
    s.quarantined = srv__close_quarantine_list(j, &s.num_quarantined, &nomem);
    char *sum = NULL;
    rc = nomem ? strata_diag_set(d, STRATA_ENOMEM, "out of memory (the summary)")
               : srv__round_summary_text(R, &s, p->lg_solved ? C->c.budgets : NULL, &sum, d);
    if (rc == STRATA_EINVAL)
        j->impossible = 1;
    if (rc == 0)
        rc = strata_store_round_close(C->c.store, p->r, sum, d);
    if (rc == STRATA_ESTATE)
        rc = already_closed(C, p, j);
    free(sum);
    free(s.quarantined);
    return rc;
}

/* ---- apply (lock held) ------------------------------------------------------- */

/* After a close attempt that did not commit: the model, x̂ and the encoded
 * version are put back; the round stays closing and the round thread tries
 * again after a capped exponential backoff, unless the failure is a state
 * that retrying cannot mend (then no further rounds are served). */
static void apply_failure(srv_close *C, srv_rounds *R, close_job *j, close_plan *p)
{
    if (p->stepped)
        strata_tensor_list_copy_values(strata_model_params(C->model), &C->rollback);
    if (p->dl_moved)
        srv__downlink_rollback(C->c.downlink);
    srv__model_blob_cleanup(&p->blob);
    R->close_busy = 0;
    p->kept_version = srv__models_version(C->c.models);
    if (j->impossible) {
        p->gave_up = 1;
        R->closing = 0;
        R->open = 0;
        R->finished = 1;
        srv__waiters_wake_all(C->c.waiters);
        return;
    }
    p->wait_ms = srv__retry_backoff_ms(R->close_failures++);
    R->close_retry_ms = strata_clock_mono_ms() + p->wait_ms;
    p->failures = R->close_failures;
    srv__ctr_add(C->c.met, SRV_CTR_CLOSE_FAILURES, 1);
}

/* Counts the quarantined updates and the stragglers (each selected client
 * that answered nothing by the deadline is not selected again for the next
 * straggler_rounds rounds while others can be; clients left waiting by an
 * early close, with over-selection, were not late). */
static void apply_counts(srv_close *C, const srv_rounds *R, const close_job *j, close_plan *p)
{
    for (size_t i = 0; i < j->n; i++) {
        if (j->u[i].quarantined == 1 + STRATA_QUARANTINE_NORM)
            srv__ctr_add(C->c.met, SRV_CTR_QUARANTINED_NORM, 1);
        else if (j->u[i].quarantined)
            srv__ctr_add(C->c.met, SRV_CTR_QUARANTINED_NON_FINITE, 1);
    }
    srv__ctr_add(C->c.met, SRV_CTR_DENSE, (int64_t)(2 * p->nreported * C->c.total_params * 4));
    for (size_t k = 0; p->late && k < R->nselected; k++) {
        if (R->reported[k] != SRV_REPORT_NONE)
            continue;
        p->late_count++;
        if (C->c.straggler_rounds > 0)
            srv__registry_bench(C->c.reg, R->selected[k],
                                p->r + 1 + (uint32_t)C->c.straggler_rounds);
    }
    if (p->late_count > 0)
        srv__ctr_add(C->c.met, SRV_CTR_STRAGGLERS, (int64_t)p->late_count);
}

/* Appends a printf text to the plan's progress lines (cut at their
 * buffer's end). */
static void out_add(close_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_add(close_plan *p, const char *fmt, ...)
{
    size_t o = strlen(p->out);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->out + o, sizeof(p->out) - o, fmt, ap);
    va_end(ap);
}

/* The progress lines (stdout, in this form: operators and tests read
 * them). */
static void progress_lines(srv_close *C, const close_job *j, close_plan *p, uint64_t uplink)
{
    size_t nq = j->n - srv__close_kept(j);
    p->out[0] = '\0';
    if (p->stepped) {
        out_add(p,
                "round %u/%ld: %zu updates, accuracy %.4f, loss %.4f, uplink %llu bytes, %lld ms",
                p->r, C->c.rounds, p->nreported, j->st.accuracy, j->st.loss,
                (unsigned long long)uplink, (long long)p->dur);
        if (nq > 0)
            out_add(p, ", %zu quarantined", nq);
        if (C->c.server_lr_final > 0) /* the rate of this step (opt_next now: before it) */
            out_add(p, ", server lr %.4g", strata_server_opt_lr(C->opt_next));
        out_add(p, "\n");
    } else if (p->too_few) {
        out_add(p, "round %u/%ld: %zu updates, failed (%s), model stays at version %llu, %lld ms\n",
                p->r, C->c.rounds, p->nreported, strata_round_failure_name(j->failed),
                (unsigned long long)p->kept_version, (long long)p->dur);
    } else {
        out_add(p,
                "round %u/%ld: %zu updates, failed (%s), %zu quarantined, model stays at version "
                "%llu, %lld ms\n",
                p->r, C->c.rounds, p->nreported, strata_round_failure_name(j->failed), nq,
                (unsigned long long)p->kept_version, (long long)p->dur);
    }
    if (p->r + 1 >= (uint32_t)C->c.rounds)
        out_add(p, "strata-server: finished %ld rounds\n", C->c.rounds);
}

/* The close committed: the optimiser's new state and the new version
 * published (models.h), the gauges and counters, the stragglers benched,
 * the round reset and the next one due (or the federation finished), the
 * parked long-polls woken. Memory only. */
static void apply_success(srv_close *C, srv_rounds *R, const close_job *j, close_plan *p)
{
    uint64_t uplink = R->uplink;
    apply_counts(C, R, j, p);
    if (p->stepped) {
        strata_server_opt *t = C->opt;
        C->opt = C->opt_next;
        C->opt_next = t;
        srv__models_publish(C->c.models, p->v, &p->blob, p->digest);
        srv__metrics_set_round(C->c.met, j->st.accuracy, j->st.loss, j->st.samples,
                               (double)p->dur / 1000.0);
        srv__metrics_set_agg(C->c.met, j->agg_s);
        srv__ctr_add(C->c.met, SRV_CTR_ROUNDS, 1);
    } else {
        srv__ctr_add(C->c.met, SRV_CTR_ROUNDS_FAILED, 1);
    }
    p->kept_version = srv__models_version(C->c.models);
    progress_lines(C, j, p, uplink);
    srv__round_reset(R);
    R->downlink -= p->downlink; /* in the stored summary; later bytes are the next round's */
    R->close_busy = 0;
    R->next_round = p->r + 1;
    if (R->next_round >= (uint32_t)C->c.rounds)
        R->finished = 1;
    srv__waiters_wake_all(C->c.waiters);
}

/* ---- announce (no lock) ------------------------------------------------------ */

/* Logs the job's quarantined updates. */
static void log_quarantine(const srv_close *C, const close_job *j)
{
    for (size_t i = 0; i < j->n; i++) {
        const close_update *u = &j->u[i];
        if (u->quarantined == 1 + STRATA_QUARANTINE_NORM)
            strata_log_warn("round %u: client %llu's update quarantined (norm): its L2 norm "
                            "%.4g is above %g times the round's median norm %.4g",
                            j->round, (unsigned long long)u->client_id, u->norm, C->c.screen_factor,
                            j->median);
        else if (u->quarantined)
            strata_log_warn("round %u: client %llu's update quarantined (non_finite): L2 norm "
                            "%.4g; with it the aggregate, model or loss was not finite",
                            j->round, (unsigned long long)u->client_id, u->norm);
    }
}

/* After a failed attempt: says why and what happens next. */
static void announce_failure(const close_plan *p, const strata_diag *d, int rc)
{
    if (p->gave_up)
        strata_log_error("round %u: closing is impossible: %s; this cannot pass by retrying "
                         "(a stored update or the store contradicts the round); no further "
                         "rounds",
                         p->r, strata_diag_msg(d, rc));
    else
        strata_log_error("round %u: closing failed (attempt %u): %s; the model stays at version "
                         "%llu; retrying in %lld s",
                         p->r, p->failures, strata_diag_msg(d, rc),
                         (unsigned long long)p->kept_version, (long long)(p->wait_ms / 1000));
}

/* After a committed close: the log lines, the progress lines, the old
 * downlink files removed, the counters saved. */
static void announce_success(srv_close *C, const close_job *j, const close_plan *p)
{
    log_quarantine(C, j);
    if (p->too_few)
        strata_log_warn("round %u: closed with %zu updates, fewer than --min-updates %ld (%zu of "
                        "%zu selected clients skipped); the model stays at version %llu",
                        p->r, p->nreported, C->c.min_updates, p->nskipped, p->nselected,
                        (unsigned long long)p->kept_version);
    else if (!p->stepped)
        strata_log_error("round %u: failed (%s): %s with %zu of %zu updates, after leaving out "
                         "those with the largest norms; the model stays at version %llu",
                         p->r, strata_round_failure_name(j->failed), j->failure, j->last_kept, j->n,
                         (unsigned long long)p->kept_version);
    fputs(p->out, stdout);
    fflush(stdout);
    if (p->failures > 0)
        strata_log_info("round %u: closed after %u failed attempts", p->r, p->failures);
    if (p->late_count > 0)
        strata_log_info("round %u: %zu of %zu selected clients did not answer by the deadline%s",
                        p->r, p->late_count, p->nselected,
                        C->c.straggler_rounds > 0 ? "; they wait before being selected again" : "");
    if (p->stepped)
        srv__downlink_prune(C->c.downlink, p->v, srv__models_snapshot_bytes(C->c.models));
    srv__metrics_flush(C->c.met, C->c.store);
}

void srv__close_round(srv_close *C, srv_rounds *R)
{
    strata_diag d = {{0}};
    close_job j;
    close_plan p;
    memset(&p, 0, sizeof(p));
    close_begin(C, R, &j, &p);
    pthread_mutex_unlock(R->c.mu);

    int rc = close_compute(C, R, &j, &p, &d);
    if (rc == 0)
        rc = close_commit(C, R, &j, &p, &d);

    pthread_mutex_lock(R->c.mu);
    if (rc < 0)
        apply_failure(C, R, &j, &p);
    else
        apply_success(C, R, &j, &p);
    pthread_mutex_unlock(R->c.mu);

    if (rc < 0)
        announce_failure(&p, &d, rc);
    else
        announce_success(C, &j, &p);
    srv__close_job_cleanup(&j);
    pthread_mutex_lock(R->c.mu);
}
