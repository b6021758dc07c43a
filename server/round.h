/* The rounds (round.c, close.c, resume.c): the open round's state and its
 * life cycle. Round R trains model version R and its close produces
 * version R + 1 (unless it fails).
 *
 * round.c owns the open round in its own structure (srv_rounds,
 * round_internal.h, which only round.c, close.c and resume.c include):
 * its selection, what each selected client answered, the FedAvg aggregate
 * of its accepted updates and their norms, its task, its deadline, its
 * bytes, and whether it is open, closing or the federation finished. The
 * engine lock guards it; while a round closes (close.c) the round thread
 * reads its final updates, selection and norms without the lock (uploads
 * and skips for it are refused meanwhile).
 *
 * round.c: opening (selection through registry.h, budgets through
 * budgets.h, the task document through round_doc.h), answering task
 * requests (parking long-polls in waiters.h), skips, the accept step of an
 * upload, abandoning the open round (admin stop), the live view of the open
 * round. close.c: when a round is due to close, and closing it in steps
 * (close.h). resume.c: the rounds of the state directory at start-up.
 *
 * May call: the store, aggregate.h, registry.h, budgets.h, models.h (the
 * published version and digest), metrics.h, waiters.h, round_doc.h and
 * libstrata. Nothing here calls upload.c or admin.c: they call in. */
#ifndef STRATA_SERVER_ROUND_H
#define STRATA_SERVER_ROUND_H

#include "budgets.h"
#include "metrics.h"
#include "models.h"
#include "registry.h"
#include "result.h"
#include "store.h"
#include "waiters.h"

#include "robust.h"

#include "strata/payload.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_rounds srv_rounds;

/* What a selected client has answered for the open round. */
enum { SRV_REPORT_NONE = 0, SRV_REPORT_UPDATE = 1, SRV_REPORT_SKIPPED = 2 };

/* What the rounds are given at start-up (copied; pointers borrowed). */
typedef struct srv_rounds_config {
    long rounds, min_clients, clients_per_round, min_updates, seed;
    double fraction, over_select, round_deadline; /* round_deadline in seconds */
    /* the task's local-training settings */
    long local_epochs, batch, max_steps;
    double lr, momentum, weight_decay, prox_mu;
    strata_robust_method method; /* FedAvg streams accepted updates into the aggregate */
    double clip_norm;
    int downlink; /* --downlink: tasks say the model comes as deltas */
    /* the model's layout */
    size_t nlayers, total_params;
    char **names; /* borrowed from the model */
    const strata_tensor_list *layout;
    strata_payload_limits limits;
    strata_store *store; /* used under the engine lock */
    pthread_mutex_t *mu;
    pthread_cond_t *wake; /* wakes the round thread */
    srv_metrics *met;
    srv_registry *reg;
    srv_waiters *waiters;
    srv_models *models;
    srv_budgets *budgets;
    /* A follower's (another coordinator leads the store): the open round is
     * the store's, read again by srv__round_mirror; nothing is aggregated,
     * opened or closed here. */
    int mirror;
    /* Other coordinators take uploads for this store too (--database). */
    int shared;
} srv_rounds_config;

/* No round open yet (srv__round_resume restores the state directory's).
 * Errors: STRATA_ENOMEM, the aggregate's. */
int srv__rounds_new(const srv_rounds_config *c, srv_rounds **out);

/* Frees R. Accepts NULL. */
void srv__rounds_free(srv_rounds *R);

/* ---- resume.c ---- */

/* Resumes the state directory's rounds at start-up: an open round whose
 * model version is older than the published one was aggregated before a
 * crash and is closed (summary marked recovered); otherwise its task and
 * selection are restored and its acknowledged updates replayed in the order
 * they were accepted (into the FedAvg aggregate; a robust rule reads them
 * at close). Then counts rounds completed and updates accepted from the
 * store (metrics.h's derived counters) and restores the gauges of the last
 * evaluated round (test_n: the test images of a summary that does not say).
 * Start-up only. Errors: the store's, STRATA_EPROTO (unreadable task),
 * STRATA_ENOMEM. */
int srv__round_resume(srv_rounds *R, size_t test_n, strata_diag *d);

/* A follower's view of the leader's round (c.mirror): forgets the open
 * round and reads the store's again, as the resumption does but without a
 * write or an aggregate (an open round whose model version is older than
 * the published one is the leader's to close: not open here); a sealed
 * round is closing. Lock held. Errors: the store's, STRATA_EPROTO,
 * STRATA_ENOMEM (then no round is open here). */
int srv__round_mirror(srv_rounds *R, strata_diag *d);

/* A follower's view of the open round's updates: every client whose update
 * st holds for it (stored through any coordinator) has reported, so it is
 * not given the task again. Reads st without the lock, takes it to mark
 * them. Errors: the store's. */
int srv__round_mirror_updates(srv_rounds *R, strata_store *st, strata_diag *d);

/* A mirror that an upload finds behind the leader (for the round it does
 * not hold open, or the one after it, when the store has that round):
 * reads the store's round again first, as srv__round_mirror, so that the
 * upload is decided on the leader's round (a failure is logged and leaves
 * no round open here until the next re-read). No-op for a leader or a
 * round the mirror holds open. Lock held. */
void srv__round_catch_up(srv_rounds *R, uint32_t round);

/* The leader's share of updates that other coordinators of its store
 * took: every update st holds for the open round (not closing) from a
 * selected client the round has no report of is read, decoded and
 * accepted (aggregated, counted) as if it had been uploaded here; the
 * round thread is woken when the round is then full; a skip the client
 * sent here gives way to its stored update. Reads the store without the
 * lock (st is the caller's connection), takes it to accept. An update
 * that does not decode here is logged and left out. No-op for a mirror.
 * Errors: the store's (a later call tries again). */
int srv__round_adopt(srv_rounds *R, strata_store *st, strata_diag *d);

/* ---- round.c: the round thread and the engine's composition ---- */

/* Opens the next round when one is due (not paused, not finished, enough
 * clients registered, no retry pending), or notes a failed open for a retry
 * after the close's backoff. Lock held. */
void srv__round_maybe_open(srv_rounds *R, int paused);

/* Closes the open round without aggregating it (admin stop); no-op when
 * none is open. Lock held, no close attempt running. Errors: the store's. */
int srv__round_abandon(srv_rounds *R, strata_diag *d);

/* Ends the federation: no round opens any more; by_operator says it was
 * stopped (tasks are refused with that reason). Lock held. */
void srv__round_finish(srv_rounds *R, int by_operator);

/* The open round, or the next to open; whether one is open, closing, the
 * federation finished, a close attempt running, a failed close waiting for
 * its retry. Lock held (or the round thread). */
uint32_t srv__round_current(const srv_rounds *R);
int srv__round_is_open(const srv_rounds *R);
int srv__round_closing(const srv_rounds *R);
int srv__round_finished(const srv_rounds *R);
int srv__round_close_busy(const srv_rounds *R);
int srv__round_close_pending(const srv_rounds *R);

/* srv_engine_task (engine.h). Takes the lock. */
void srv__round_task(srv_rounds *R, uint64_t client_id, int64_t deadline_ms, void *waiter,
                     int *parked, srv_result *r);

/* srv_engine_skip's decision for client_id and round (reason borrowed, may
 * be NULL: logged). Lock held, no group commit in flight. */
void srv__round_skip(srv_rounds *R, uint64_t client_id, uint32_t round, const char *reason,
                     srv_result *r);

/* Counts len bytes of a model body sent: the downlink bytes of the open
 * round (or, between rounds, of the next one). Lock held. */
void srv__round_count_downlink(srv_rounds *R, uint64_t len);

/* The summary text of a stored round record rd that has no stored summary
 * (the open round, or a closed one without one), made now from the record
 * and, for the open round, its live bytes and budgets: *text is new
 * (free()), or NULL when out of memory. Lock held. */
void srv__round_live_summary(const srv_rounds *R, const strata_store_round *rd, char **text);

/* ---- round.c: what an upload needs (upload.c) ---- */

/* The index of client_id among the open round's selected clients, or -1
 * (none open, or not selected). Lock held. */
ptrdiff_t srv__round_find(const srv_rounds *R, uint64_t client_id);

/* What selected client k answered (SRV_REPORT_*). Lock held. */
int srv__round_report(const srv_rounds *R, ptrdiff_t k);

/* The open round's task: the model version it trains, its per-layer
 * budgets (nlayers) and the number of its error-table candidates. Lock
 * held. */
uint64_t srv__round_task_version(const srv_rounds *R);
const strata_budget *srv__round_task_budgets(const srv_rounds *R, size_t *ncands);

/* 1 when the open round may close before its deadline: every selected
 * client answered, or enough updates arrived. Lock held. */
int srv__round_full(const srv_rounds *R);

/* The one accept step of an update the store just acknowledged (not a
 * duplicate) from selected client k: FedAvg streams it into the aggregate
 * and records its L2 norm for the close's screening (a robust rule reads
 * and measures the stored update at close instead); k is marked reported
 * and len counted as uplink. Lock held. */
void srv__round_accept(srv_rounds *R, const strata_payload *p, ptrdiff_t k, size_t len);

#endif
