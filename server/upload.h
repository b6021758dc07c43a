/* The upload pipeline (upload.c; its public calls are srv_engine_upload and
 * its companions in engine.h): decoding an update once, validating it once
 * against the open round's task, preparing its durable write outside the
 * lock, the group commit on the second store connection, and handing each
 * acknowledged update to the round's accept step (round.h) exactly once.
 *
 * upload.c owns the group commit in its own structure (srv_uploads): the
 * queue of prepared uploads, the committer thread (one commit at a time,
 * the lock released during its commit, one batch of everything queued
 * meanwhile), whether a commit is in flight and whether an admin stop
 * holds new batches back. The engine lock guards it. An upload that joins
 * the queue from a request suspends its connection (the transport's
 * callbacks, srv__uploads_set_conn) instead of holding an HTTP thread
 * while it waits for the disk; the committer resumes it once decided. A
 * round cannot start closing while a batch is in flight (the round thread
 * asks srv__uploads_busy), so every acknowledged update is aggregated.
 *
 * May call: the store, round.h (the open round's task and accept step),
 * lgreco.h (the error-table checks), metrics.h, libstrata (payload) and
 * jansson (receipts). */
#ifndef STRATA_SERVER_UPLOAD_H
#define STRATA_SERVER_UPLOAD_H

#include "engine.h"
#include "metrics.h"
#include "result.h"
#include "round.h"
#include "store.h"

#include "strata/payload.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Most uploads committed in one transaction. */
#define SRV_BATCH_MAX 256

typedef struct srv_uploads srv_uploads;

/* What the pipeline is given at start-up (copied; pointers borrowed). */
typedef struct srv_uploads_config {
    size_t nlayers;
    const size_t *numel; /* per layer */
    char **names;        /* per layer (borrowed from the model) */
    strata_payload_limits limits;
    strata_store *store;  /* used under the engine lock */
    strata_store *wstore; /* the group commits' connection, used without it */
    pthread_mutex_t *mu;
    pthread_cond_t *wake; /* wakes the round thread (an update was accepted) */
    srv_metrics *met;
    srv_rounds *rounds;
} srv_uploads_config;

/* An idle pipeline with its committer thread. Errors: STRATA_ENOMEM. */
int srv__uploads_new(const srv_uploads_config *c, srv_uploads **out);

/* Sets the transport's callbacks that suspend and resume a connection
 * (called with the lock held; they must not block). Until they are set,
 * every caller waits for its upload's commit. Takes the lock. */
void srv__uploads_set_conn(srv_uploads *U, srv_waiter_fn suspend, srv_waiter_fn resume);

/* Ends the committer thread once it has decided every queued upload (their
 * connections resumed); later uploads are decided by their callers, one at
 * a time. Takes the lock. Accepts NULL; idempotent. */
void srv__uploads_stop(srv_uploads *U);

/* Stops U (srv__uploads_stop) and frees it. Accepts NULL. */
void srv__uploads_free(srv_uploads *U);

/* srv_engine_upload (engine.h). Takes the lock. */
void srv__uploads_upload(srv_uploads *U, uint64_t client_id, uint32_t round, const uint8_t *body,
                         size_t len, void *conn, srv_upload **queued, srv_result *r);

/* srv_engine_upload_answer (engine.h). Takes the lock. */
void srv__uploads_answer(srv_uploads *U, srv_upload *u, srv_result *r);

/* srv_engine_upload_gone (engine.h). Takes the lock. */
void srv__uploads_gone(srv_uploads *U, srv_upload *u);

/* 1 while a group commit is in flight. Lock held. */
int srv__uploads_busy(const srv_uploads *U);

/* Waits for the group commit in flight, if any (a skip decides after it).
 * Lock held. */
void srv__uploads_wait(srv_uploads *U);

/* Waits for the group commit in flight with no new batch starting
 * meanwhile (an admin stop). Lock held. */
void srv__uploads_quiesce(srv_uploads *U);

#endif
