/* The upload pipeline (see upload.h and srv_engine_upload in engine.h).
 * This file alone touches struct srv_uploads.
 *
 * An upload is decoded once (strata_payload_decode, the model's limits) and
 * validated once against the round's task under the lock. When it looks
 * acceptable, its write is prepared before the lock (hash, receipt id, a
 * copy of the body) and it joins the queue of the committer thread, which
 * commits everything queued meanwhile in one transaction on the second
 * store connection, with the lock released. A request's connection is
 * suspended while its upload waits, so an HTTP thread goes on with other
 * connections instead of waiting for the disk, and batches grow with the
 * load, not with the number of HTTP threads. An upload a batch did not take
 * (no longer acceptable when the batch formed) is decided alone by the
 * committer after the batch, and one that was never queued (not
 * acceptable, or no prepared write) by its caller, never beside a group
 * commit, so that the store's order stays the aggregation's. Either way an
 * acknowledged update passes through accept_update exactly once. */
#include "upload.h"

#include "lgreco.h"
#include "result_internal.h"

#include "aggregate.h"

#include "strata/log.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One upload that joined the group commit, from its queueing to its
 * answer. While queued it belongs to the pipeline; once decided (done) to
 * whoever answers it: the caller waiting on cv, or the request of the
 * suspended connection conn, resumed (srv__uploads_answer). */
struct srv_upload {
    strata_store_pending *pend; /* its prepared write; NULL once a commit took it */
    strata_payload *p;          /* owned */
    srv_lgreco_scan ls;         /* its metadata's error table */
    const uint8_t *body;        /* the request's (borrowed: alive until answered or orphaned) */
    uint64_t client_id;
    uint32_t round;
    size_t len;
    ptrdiff_t k;       /* index among the selected clients */
    void *conn;        /* the suspended connection; NULL: the caller waits on cv */
    int done;          /* decided: r holds the answer */
    int orphan;        /* its connection ended first: nobody takes the answer */
    srv_result r;      /* the answer */
    pthread_cond_t cv; /* conn == NULL: its caller waits here */
    struct srv_upload *next;
};

#define ZCTX_IDLE_MAX 64

struct srv_uploads {
    srv_uploads_config c;
    srv_waiter_fn suspend, resume; /* the transport's (srv__uploads_set_conn) */
    /* Prepared uploads queue here; the committer thread commits all queued
     * ones in one transaction. */
    srv_upload *queue, *queue_tail;
    int committing;
    int quiescing; /* an admin stop waits: no new batch starts */
    int stopping;  /* srv__uploads_stop: the committer drains the queue and ends */
    int running;   /* the committer thread runs */
    pthread_t committer;
    pthread_cond_t work_cv;   /* the committer waits here for uploads */
    pthread_cond_t commit_cv; /* those waiting for no commit in flight */
    /* Idle zstd contexts for the decoder, one taken per upload in decode
     * (making one costs about as much as decoding a small update). */
    pthread_mutex_t zmu;
    strata_zctx *zidle[ZCTX_IDLE_MAX];
    size_t nzidle;
};

/* An idle zstd context, or a new one; NULL (no memory) makes the decoder
 * make its own. */
static strata_zctx *zctx_take(srv_uploads *U)
{
    strata_zctx *z = NULL;
    pthread_mutex_lock(&U->zmu);
    if (U->nzidle > 0)
        z = U->zidle[--U->nzidle];
    pthread_mutex_unlock(&U->zmu);
    if (z == NULL && strata_zctx_new(&z) < 0)
        z = NULL;
    return z;
}

static void zctx_give(srv_uploads *U, strata_zctx *z)
{
    if (z == NULL)
        return;
    pthread_mutex_lock(&U->zmu);
    if (U->nzidle < ZCTX_IDLE_MAX) {
        U->zidle[U->nzidle++] = z;
        z = NULL;
    }
    pthread_mutex_unlock(&U->zmu);
    strata_zctx_free(z);
}

static void *committer_main(void *arg);

int srv__uploads_new(const srv_uploads_config *c, srv_uploads **out)
{
    srv_uploads *U = calloc(1, sizeof(*U));
    *out = NULL;
    if (U == NULL)
        return STRATA_ENOMEM;
    U->c = *c;
    pthread_mutex_init(&U->zmu, NULL);
    pthread_cond_init(&U->commit_cv, NULL);
    pthread_cond_init(&U->work_cv, NULL);
    if (pthread_create(&U->committer, NULL, committer_main, U) != 0) {
        srv__uploads_free(U);
        return STRATA_ENOMEM;
    }
    U->running = 1;
    *out = U;
    return 0;
}

void srv__uploads_set_conn(srv_uploads *U, srv_waiter_fn suspend, srv_waiter_fn resume)
{
    pthread_mutex_lock(U->c.mu);
    U->suspend = suspend;
    U->resume = resume;
    pthread_mutex_unlock(U->c.mu);
}

void srv__uploads_stop(srv_uploads *U)
{
    if (U == NULL || !U->running)
        return;
    pthread_mutex_lock(U->c.mu);
    U->stopping = 1;
    pthread_cond_signal(&U->work_cv);
    pthread_mutex_unlock(U->c.mu);
    pthread_join(U->committer, NULL);
    U->running = 0;
}

void srv__uploads_free(srv_uploads *U)
{
    if (U == NULL)
        return;
    srv__uploads_stop(U);
    for (size_t i = 0; i < U->nzidle; i++)
        strata_zctx_free(U->zidle[i]);
    pthread_mutex_destroy(&U->zmu);
    pthread_cond_destroy(&U->commit_cv);
    pthread_cond_destroy(&U->work_cv);
    free(U);
}

int srv__uploads_busy(const srv_uploads *U)
{
    return U->committing;
}

void srv__uploads_wait(srv_uploads *U)
{
    while (U->committing)
        pthread_cond_wait(&U->commit_cv, U->c.mu);
}

void srv__uploads_quiesce(srv_uploads *U)
{
    U->quiescing = 1;
    srv__uploads_wait(U);
    U->quiescing = 0;
}

/* Checks what a decoded update must satisfy whatever its round: the
 * header's round is the URL's, the sample count is a usable weight, and the
 * layers are the model's, in order, with the model's sizes. No lock needed
 * (it reads only what start-up fixed). Returns 0, or STRATA_EPROTO with the
 * reason in msg. */
static int validate_frame(const srv_uploads *U, const strata_payload *p, uint32_t round, char *msg,
                          size_t mlen)
{
    if (p->round != round) {
        snprintf(msg, mlen, "header round %u does not match the URL's round %u", p->round, round);
        return STRATA_EPROTO;
    }
    if (p->sample_count == 0 || (double)p->sample_count > STRATA_AGG_MAX_WEIGHT) {
        snprintf(msg, mlen, "sample_count %llu: expected 1 to 1e12",
                 (unsigned long long)p->sample_count);
        return STRATA_EPROTO;
    }
    if (p->num_layers != U->c.nlayers) {
        snprintf(msg, mlen, "%zu layers, the model has %zu", p->num_layers, U->c.nlayers);
        return STRATA_EPROTO;
    }
    for (size_t i = 0; i < U->c.nlayers; i++) {
        const strata_clayer *l = &p->layers[i];
        if (l->layer_index != i) {
            snprintf(msg, mlen, "layer %zu (%s) is missing", i, U->c.names[i]);
            return STRATA_EPROTO;
        }
        if (l->numel != U->c.numel[i]) {
            snprintf(msg, mlen, "layer %zu (%s): %llu elements, expected %zu", i, U->c.names[i],
                     (unsigned long long)l->numel, U->c.numel[i]);
            return STRATA_EPROTO;
        }
    }
    return 0;
}

/* Checks an update that passed validate_frame against the open round's
 * task: model version, and each layer's compressor, value format and
 * budget. Lock held. Returns 0, or STRATA_EPROTO with the reason in msg. */
static int validate_task(const srv_uploads *U, const strata_payload *p, const srv_lgreco_scan *ls,
                         char *msg, size_t mlen)
{
    uint64_t version = srv__round_task_version(U->c.rounds);
    size_t ncands = 0;
    const strata_budget *budgets = srv__round_task_budgets(U->c.rounds, &ncands);
    if (p->model_version != version) {
        snprintf(msg, mlen, "header model_version %llu, the round's model is version %llu",
                 (unsigned long long)p->model_version, (unsigned long long)version);
        return STRATA_EPROTO;
    }
    for (size_t i = 0; i < U->c.nlayers; i++) {
        const strata_clayer *l = &p->layers[i];
        const strata_budget *b = &budgets[i];
        const char *nm = U->c.names[i];
        if (l->comp != b->comp) {
            snprintf(msg, mlen, "layer %zu (%s): compressor %s, the task says %s", i, nm,
                     strata_comp_name(l->comp), strata_comp_name(b->comp));
            return STRATA_EPROTO;
        }
        int uses_vf = l->comp == STRATA_COMP_NONE || l->comp == STRATA_COMP_TOPK ||
                      l->comp == STRATA_COMP_RANDK || l->comp == STRATA_COMP_POWERSGD;
        if (uses_vf && l->values_format != b->values) {
            snprintf(msg, mlen, "layer %zu (%s): values %s, the task says %s", i, nm,
                     strata_values_format_name(l->values_format),
                     strata_values_format_name(b->values));
            return STRATA_EPROTO;
        }
        if ((l->comp == STRATA_COMP_TOPK || l->comp == STRATA_COMP_RANDK) &&
            l->count != strata_comp_kept(b->density, l->numel)) {
            snprintf(msg, mlen,
                     "layer %zu (%s): %llu kept elements, the budget (density %g) is %llu", i, nm,
                     (unsigned long long)l->count, b->density,
                     (unsigned long long)strata_comp_kept(b->density, l->numel));
            return STRATA_EPROTO;
        }
        if ((l->comp == STRATA_COMP_QSGD && l->levels != b->levels) ||
            (l->comp == STRATA_COMP_POWERSGD && l->rank != b->rank)) {
            snprintf(msg, mlen, "layer %zu (%s): levels/rank differ from the budget", i, nm);
            return STRATA_EPROTO;
        }
    }
    return srv__lgreco_check(ls, ncands, msg, mlen);
}

/* The one accept step: an update the store just acknowledged of the
 * selected client k, not yet reported in memory, joins the round
 * (srv__round_accept) and is counted. That includes a duplicate: the store
 * holds it but the round does not, which happens when a commit's answer
 * was lost with the database connection (it failed for the coordinator,
 * yet committed) and the client sent the update again; the round then
 * follows the store. Lock held. */
static void accept_update(srv_uploads *U, const strata_payload *p, ptrdiff_t k, size_t len)
{
    srv__round_accept(U->c.rounds, p, k, len);
    srv__ctr_add(U->c.met, SRV_CTR_ACCEPTED, 1);
    srv__ctr_add(U->c.met, SRV_CTR_UPLINK, (int64_t)len);
}

/* A conflict for the open round, of a selected client k the round has no
 * report of: the store holds another update of this client that the round
 * lacks (a commit whose answer was lost with the database connection, and
 * the client then sent other content). The round follows the store, as a
 * restart would rebuild it: the stored update joins the round, and the
 * client is answered the conflict. When the stored update cannot be read,
 * the client is told to retry instead (STRATA_EIO, 503), so that the round
 * is not left waiting for it. st is a store handle the caller may use now.
 * Lock held. */
static int adopt_stored(srv_uploads *U, strata_store *st, uint32_t round, uint64_t cid, ptrdiff_t k)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    strata_diag d = {{0}};
    strata_payload *p = NULL;
    int rc = strata_store_update_read(st, round, cid, &buf, &len, &d);
    if (rc == 0) {
        strata_zctx *z = zctx_take(U);
        rc = z != NULL ? strata_payload_decode_z(z, buf, len, &U->c.limits, &p, &d)
                       : strata_diag_set(&d, STRATA_ENOMEM, "out of memory");
        zctx_give(U, z);
    }
    if (rc == 0) {
        accept_update(U, p, k, len);
        strata_log_info("round %u: client %llu's stored update joins the round (its commit's "
                        "answer was lost; the client's other content is refused)",
                        round, (unsigned long long)cid);
    } else {
        strata_log_error("round %u: the stored update of client %llu cannot join the round: %s",
                         round, (unsigned long long)cid, strata_diag_msg(&d, rc));
        rc = STRATA_EIO;
    }
    strata_payload_free(p);
    free(buf);
    return rc;
}

/* Wakes the round thread when it may close the open round now that an
 * update or a batch was decided (srv__round_full; the deadline wakes it on
 * its own). Waking it for every update instead costs two context switches
 * and a turn of the engine lock per upload. Lock held. */
static void wake_round_thread_if_full(srv_uploads *U)
{
    if (srv__round_full(U->c.rounds))
        pthread_cond_broadcast(U->c.wake);
}

static void receipt_result(srv_result *r, uint32_t round, const strata_store_receipt *rc)
{
    srv__result_json(r, SRV_OK,
                     json_pack("{s:I,s:s,s:b}", "round", (json_int_t)round, "receipt", rc->id,
                               "duplicate", rc->duplicate ? 1 : 0));
}

/* Answers a store refusal, counted; msg is the store's explanation. */
static void verdict_result(srv_uploads *U, srv_result *r, uint32_t round, strata_store_verdict v,
                           const char *msg)
{
    if (v == STRATA_STORE_REJECT_CONFLICT) {
        srv__ctr_add(U->c.met, SRV_CTR_UPD_CONFLICT, 1);
        if (msg[0] != '\0')
            srv_result_error(r, SRV_E_CONFLICT, "%s", msg);
        else
            srv_result_error(r, SRV_E_CONFLICT,
                             "an update with other content is stored for round %u; it is kept",
                             round);
    } else if (v == STRATA_STORE_REJECT_NOT_SELECTED) {
        srv__ctr_add(U->c.met, SRV_CTR_UPD_NOT_SELECTED, 1);
        srv_result_error(r, SRV_E_NOT_SELECTED, "this client was not selected for round %u", round);
    } else if (v == STRATA_STORE_REJECT_ROUND_CLOSED) {
        srv__ctr_add(U->c.met, SRV_CTR_UPD_ROUND_CLOSED, 1);
        srv_result_error(r, SRV_E_ROUND_CLOSED, "round %u is closed", round);
    } else {
        srv__ctr_add(U->c.met, SRV_CTR_UPD_ROUND_NOT_OPEN, 1);
        srv_result_error(r, SRV_E_ROUND_NOT_OPEN, "round %u has not opened", round);
    }
}

/* The result of a store put or commit: receipt, refusal, or a failure to
 * make the update durable (storage full or failing): nothing was
 * acknowledged, so the client is told to retry later, and the detail (paths,
 * SQLite's words) goes to the log only. */
static void stored_result(srv_uploads *U, srv_result *r, uint32_t round, int rc,
                          const strata_store_receipt *rec, strata_store_verdict v, const char *msg)
{
    if (rc == STRATA_ESTATE) {
        verdict_result(U, r, round, v, msg);
    } else if (rc < 0) {
        strata_log_error("round %u: an update could not be stored: %s", round, msg);
        srv__ctr_add(U->c.met, SRV_CTR_UPD_UNAVAILABLE, 1);
        srv_result_error(r, SRV_E_UNAVAILABLE,
                         "the coordinator cannot store updates now; retry later");
        r->retry_after = SRV_UNAVAILABLE_RETRY_S;
    } else {
        receipt_result(r, round, rec);
    }
}

/* Decides an upload that no batch took, alone (lock held on entry and
 * exit): pend is its prepared file or NULL (taken by a commit, or freed by
 * the caller when still set on return via *pend). */
static void upload_alone(srv_uploads *U, uint64_t cid, uint32_t round, const strata_payload *p,
                         const srv_lgreco_scan *ls, const uint8_t *body, size_t len,
                         strata_store_pending **pend, srv_result *r)
{
    /* Never beside a group commit, so the store's order stays the
     * aggregation's. */
    srv__uploads_wait(U);
    strata_diag d = {{0}};
    strata_store_receipt rec;
    strata_store_verdict v = STRATA_STORE_ACCEPTED;
    char msg[512];
    srv_rounds *R = U->c.rounds;
    int open = srv__round_is_open(R), closing = srv__round_closing(R);
    uint32_t current = srv__round_current(R);
    ptrdiff_t k = open && round == current ? srv__round_find(R, cid) : -1;
    int reported = k >= 0 ? srv__round_report(R, k) : SRV_REPORT_NONE;
    if (reported == SRV_REPORT_SKIPPED) {
        srv__ctr_add(U->c.met, SRV_CTR_UPD_CONFLICT, 1);
        srv_result_error(r, SRV_E_CONFLICT,
                         "this client said it cannot contribute to round %u; it takes no update "
                         "for it now",
                         round);
        return;
    }
    if (open && round == current && !closing && !reported) {
        if (k < 0) {
            verdict_result(U, r, round, STRATA_STORE_REJECT_NOT_SELECTED, "");
            return;
        }
        if (validate_task(U, p, ls, msg, sizeof(msg)) < 0) {
            srv__ctr_add(U->c.met, SRV_CTR_UPD_INVALID, 1);
            srv_result_error(r, SRV_E_INVALID_UPDATE, "%s", msg);
            return;
        }
        int rc = *pend != NULL ? strata_store_update_commit(U->c.store, *pend, &rec, &v, &d)
                               : strata_store_update_put(U->c.store, round, cid, body, len,
                                                         p->sample_count, &rec, &v, &d);
        *pend = NULL;  /* the commit took it */
        if (rc == 0) { /* a duplicate too: see accept_update */
            accept_update(U, p, k, len);
            wake_round_thread_if_full(U);
        } else if (rc == STRATA_ESTATE && v == STRATA_STORE_REJECT_CONFLICT) {
            rc = adopt_stored(U, U->c.store, round, cid, k) < 0 ? STRATA_EIO : rc;
            wake_round_thread_if_full(U);
        }
        stored_result(U, r, round, rc, &rec, v, strata_diag_msg(&d, rc));
    } else if (closing && round == current && !reported) {
        verdict_result(U, r, round,
                       k < 0 ? STRATA_STORE_REJECT_NOT_SELECTED : STRATA_STORE_REJECT_ROUND_CLOSED,
                       "");
    } else if (!open && round >= current) {
        verdict_result(U, r, round, STRATA_STORE_REJECT_UNKNOWN_ROUND, "");
    } else {
        /* A closed round (or a repeat for the open one): the store answers
         * duplicates with the original receipt and refuses the rest. */
        int rc = strata_store_update_put(U->c.store, round, cid, body, len, p->sample_count, &rec,
                                         &v, &d);
        stored_result(U, r, round, rc, &rec, v, strata_diag_msg(&d, rc));
    }
}

static void upload_free(srv_upload *u)
{
    if (u == NULL)
        return;
    strata_store_pending_free(u->pend);
    strata_payload_free(u->p);
    srv_result_cleanup(&u->r);
    if (u->conn == NULL)
        pthread_cond_destroy(&u->cv);
    free(u);
}

/* Moves a decided upload's answer into r and frees the upload. */
static void take_answer(srv_upload *u, srv_result *r)
{
    *r = u->r;
    u->r.body = NULL;
    upload_free(u);
}

/* Marks u decided and hands it to whoever answers it: wakes its waiting
 * caller or resumes its connection (the request then takes the answer with
 * srv__uploads_answer); an orphan is freed. Lock held. */
static void decided(srv_uploads *U, srv_upload *u)
{
    u->done = 1;
    if (u->orphan)
        upload_free(u);
    else if (u->conn != NULL)
        U->resume(u->conn);
    else
        pthread_cond_signal(&u->cv);
}

/* One group commit (lock held on entry and exit; released during the
 * commit, so that more uploads queue meanwhile): takes the queued uploads
 * that are still acceptable (the open round, not closing, client selected
 * and not yet reported), commits them in one transaction on the second
 * store connection, accepts the acknowledged ones and decides them. The
 * round cannot start closing while a batch is in flight (ready_to_close),
 * so every acknowledged update is aggregated. The uploads no longer
 * acceptable are then decided one by one by upload_alone, with no commit in
 * flight, so that the store's order stays the aggregation's. */
static void commit_batch(srv_uploads *U)
{
    U->committing = 1;
    srv_upload *batch[SRV_BATCH_MAX], *untaken = NULL, **untaken_tail = &untaken;
    strata_store_pending *pp[SRV_BATCH_MAX];
    size_t n = 0;
    while (U->queue != NULL && n < SRV_BATCH_MAX) {
        srv_upload *q = U->queue;
        U->queue = q->next;
        if (U->queue == NULL)
            U->queue_tail = NULL;
        q->next = NULL;
        if (q->orphan) { /* nobody to answer: nothing is stored */
            upload_free(q);
            continue;
        }
        q->k = q->round == srv__round_current(U->c.rounds) && !srv__round_closing(U->c.rounds) &&
                       !U->quiescing
                   ? srv__round_find(U->c.rounds, q->client_id)
                   : -1;
        if (q->k < 0 || srv__round_report(U->c.rounds, q->k)) {
            *untaken_tail = q;
            untaken_tail = &q->next;
            continue;
        }
        pp[n] = q->pend;
        batch[n++] = q;
    }
    if (n > 0) {
        strata_store_receipt recs[SRV_BATCH_MAX];
        strata_store_verdict vs[SRV_BATCH_MAX];
        int results[SRV_BATCH_MAX];
        strata_diag d = {{0}};
        pthread_mutex_unlock(U->c.mu);
        int rc = strata_store_update_commit_many(U->c.wstore, pp, n, recs, vs, results, &d);
        pthread_mutex_lock(U->c.mu);
        for (size_t i = 0; i < n; i++) {
            srv_upload *q = batch[i];
            q->pend = NULL; /* the commit took it */
            /* A follower's round may have been read again meanwhile (a
             * leader's cannot change during a commit): its place, if any. */
            q->k = q->round == srv__round_current(U->c.rounds) && srv__round_is_open(U->c.rounds)
                       ? srv__round_find(U->c.rounds, q->client_id)
                       : -1;
            int lacks = q->k >= 0 && !srv__round_report(U->c.rounds, q->k);
            if (results[i] == 0 && lacks)
                accept_update(U, q->p, q->k, q->len);
            else if (results[i] == STRATA_ESTATE && vs[i] == STRATA_STORE_REJECT_CONFLICT && lacks)
                results[i] = adopt_stored(U, U->c.wstore, q->round, q->client_id, q->k) < 0
                                 ? STRATA_EIO
                                 : results[i];
            stored_result(U, &q->r, q->round, results[i], &recs[i], vs[i],
                          rc < 0 ? strata_diag_msg(&d, rc) : "");
        }
    }
    U->committing = 0;
    pthread_cond_broadcast(&U->commit_cv);
    wake_round_thread_if_full(U);
    for (size_t i = 0; i < n; i++)
        decided(U, batch[i]);
    while (untaken != NULL) {
        srv_upload *q = untaken;
        untaken = q->next;
        if (!q->orphan) /* (its body went with its connection) */
            upload_alone(U, q->client_id, q->round, q->p, &q->ls, q->body, q->len, &q->pend, &q->r);
        decided(U, q);
    }
}

/* The committer thread: one group commit after another while uploads
 * queue; at srv__uploads_stop it drains the queue and ends. */
static void *committer_main(void *arg)
{
    srv_uploads *U = arg;
    pthread_mutex_lock(U->c.mu);
    for (;;) {
        while (U->queue == NULL && !U->stopping)
            pthread_cond_wait(&U->work_cv, U->c.mu);
        if (U->queue == NULL)
            break;
        commit_batch(U);
    }
    pthread_mutex_unlock(U->c.mu);
    return NULL;
}

void srv__uploads_upload(srv_uploads *U, uint64_t cid, uint32_t round, const uint8_t *body,
                         size_t len, void *conn, srv_upload **queued, srv_result *r)
{
    *queued = NULL;
    strata_diag d = {{0}};
    strata_payload *p = NULL;
    strata_zctx *z = len > 0 ? zctx_take(U) : NULL;
    int rc = len > 0 ? strata_payload_decode_z(z, body, len, &U->c.limits, &p, &d) : STRATA_EPROTO;
    zctx_give(U, z);
    if (rc == STRATA_ETOOBIG) {
        /* The decoder's limits are the model's sizes: a well-formed payload
         * that is larger than the model does not match it. */
        srv__ctr_add(U->c.met, SRV_CTR_UPD_INVALID, 1);
        srv_result_error(r, SRV_E_INVALID_UPDATE, "larger than the model: %s",
                         strata_diag_msg(&d, rc));
        return;
    }
    if (rc < 0) {
        srv__ctr_add(U->c.met, SRV_CTR_UPD_BAD_PAYLOAD, 1);
        srv_result_error(r, SRV_E_BAD_PAYLOAD, "%s",
                         len == 0 ? "empty body" : strata_diag_msg(&d, rc));
        return;
    }
    if (p->client_id != cid) {
        srv__ctr_add(U->c.met, SRV_CTR_UPD_FORBIDDEN, 1);
        srv_result_error(r, SRV_E_FORBIDDEN,
                         "the payload is for client %llu; this token belongs to client %llu",
                         (unsigned long long)p->client_id, (unsigned long long)cid);
        strata_payload_free(p);
        return;
    }
    char msg[512];
    if (validate_frame(U, p, round, msg, sizeof(msg)) < 0) {
        srv__ctr_add(U->c.met, SRV_CTR_UPD_INVALID, 1);
        srv_result_error(r, SRV_E_INVALID_UPDATE, "%s", msg);
        strata_payload_free(p);
        return;
    }
    srv_lgreco_scan ls; /* the metadata's error table, read before the lock */
    srv__lgreco_scan(p->metadata_json, U->c.nlayers, &ls);
    /* The prepared write (hash, receipt id, a copy of the body) is made
     * before the lock when the upload looks acceptable; the group commit
     * decides. When it is not needed after all, or fails here, it is
     * discarded and the checks of upload_alone answer as they would
     * without it. */
    strata_store_pending *pend = NULL;
    pthread_mutex_lock(U->c.mu);
    srv__round_catch_up(U->c.rounds, round);
    ptrdiff_t k = round == srv__round_current(U->c.rounds) && !srv__round_closing(U->c.rounds)
                      ? srv__round_find(U->c.rounds, cid)
                      : -1;
    int candidate = k >= 0 && !U->stopping && !srv__round_report(U->c.rounds, k) &&
                    validate_task(U, p, &ls, msg, sizeof(msg)) == 0;
    pthread_mutex_unlock(U->c.mu);
    if (candidate && strata_store_update_prepare(U->c.store, round, cid, body, len, p->sample_count,
                                                 &pend, &d) < 0)
        pend = NULL;
    srv_upload *u = pend != NULL ? calloc(1, sizeof(*u)) : NULL;
    pthread_mutex_lock(U->c.mu);
    if (u != NULL && !U->stopping) {
        *u = (srv_upload){.pend = pend,
                          .p = p,
                          .ls = ls,
                          .body = body,
                          .client_id = cid,
                          .round = round,
                          .len = len};
        if (conn == NULL || U->resume == NULL)
            pthread_cond_init(&u->cv, NULL);
        else
            u->conn = conn;
        if (U->queue_tail != NULL)
            U->queue_tail->next = u;
        else
            U->queue = u;
        U->queue_tail = u;
        pthread_cond_signal(&U->work_cv);
        if (u->conn != NULL) {
            U->suspend(conn); /* resumed once decided (decided) */
            *queued = u;
            pthread_mutex_unlock(U->c.mu);
            return;
        }
        while (!u->done)
            pthread_cond_wait(&u->cv, U->c.mu);
        pthread_mutex_unlock(U->c.mu);
        take_answer(u, r);
        return;
    }
    free(u);
    upload_alone(U, cid, round, p, &ls, body, len, &pend, r);
    pthread_mutex_unlock(U->c.mu);
    strata_store_pending_free(pend);
    strata_payload_free(p);
}

void srv__uploads_answer(srv_uploads *U, srv_upload *u, srv_result *r)
{
    pthread_mutex_lock(U->c.mu);
    int done = u->done;
    if (done) {
        take_answer(u, r);
    } else { /* not resumed by decided: never; kept for the committer */
        u->orphan = 1;
    }
    pthread_mutex_unlock(U->c.mu);
    if (!done)
        srv_result_internal(r, "an upload's connection resumed before its commit was decided");
}

void srv__uploads_gone(srv_uploads *U, srv_upload *u)
{
    pthread_mutex_lock(U->c.mu);
    if (u->done)
        upload_free(u);
    else
        u->orphan = 1; /* the committer frees it */
    pthread_mutex_unlock(U->c.mu);
}
