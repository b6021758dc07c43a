/* strata-server's engine: registered clients, the open round, the
 * aggregate, the global model and its cache, counters, behind one C API
 * that knows nothing of HTTP. The HTTP layer (http.c) turns requests into
 * these calls and their typed results (result.h) into responses; the unit
 * tests drive the same calls directly.
 *
 * The engine is split by concept; each module owns its state in its own
 * structure (docs/architecture.md has the map, engine_internal.h the
 * composition):
 *   engine.c, engine_api.c  composition: open, the round thread, stop, free,
 *                           and each call below handed to its module;
 *   registry.c   registration, tokens, admin token, rate buckets, selection;
 *   round.c      the open round: opening, tasks, skips, the accept step;
 *   resume.c     the rounds of the state directory at start-up;
 *   close.c      closing a round in steps (close_model.c computes);
 *   upload.c     the upload pipeline and group commit;
 *   models.c     model distribution (the published version, ETags, chains);
 *   downlink.c   x̂ and the deltas; eval.c the test split and evaluation;
 *   budgets.c    the budget policy (lgreco.c its closed loop);
 *   metrics.c    counters, gauges and the /metrics text;
 *   waiters.c    parked long-polls;
 *   admin.c      pause / resume / stop and the configuration view;
 *   views.c      the rounds and status views.
 *
 * Threads: every srv_engine_* call below is thread-safe (one engine mutex
 * around the shared state) unless it says otherwise; none calls back into
 * the caller except through the waiter callbacks. A background thread (the
 * round thread) opens and closes rounds.
 *
 * Results: a call that answers a request fills a caller-owned srv_result
 * (zeroed by the caller, released with srv_result_cleanup) and returns
 * nothing: every refusal and failure is an outcome in the result. Calls
 * that can fail in the C sense return a strata_err. */
#ifndef STRATA_SERVER_ENGINE_H
#define STRATA_SERVER_ENGINE_H

#include "config.h"
#include "result.h"

#include <stddef.h>
#include <stdint.h>

typedef struct srv_engine srv_engine;

/* An upload waiting for its group commit (srv_engine_upload). */
typedef struct srv_upload srv_upload;

/* Called with the engine lock held: suspend parks a waiting connection,
 * resume wakes it (both must not block or call back into the engine). */
typedef void (*srv_waiter_fn)(void *waiter);

/* ---- life cycle (engine.c) ---- */

/* Opens the state directory (creating it on first start), loads the test
 * split, builds or loads the model (the latest checkpoint), the registered
 * clients, the admin token (creating its file on first start), the
 * persisted controls and counters, and resumes the open round (see
 * srv__round_resume in round.h). cfg is borrowed for the engine's lifetime.
 * Blocks on disk. Errors: STRATA_EINVAL for a configuration the state
 * directory or the data contradict (another architecture, an input size
 * that does not match), the store's and the loaders' errors, STRATA_ENOMEM;
 * diag says which. *out is NULL on error. */
int srv_engine_open(const srv_config *cfg, srv_engine **out, strata_diag *diag);

/* With --database: the lead of the store that a follower took
 * (srv_engine_promoted), handed from its engine to the next one. */
typedef struct srv_engine_lead srv_engine_lead;

/* srv_engine_open with a lead taken by the previous engine of this
 * process (lead is taken in every case; NULL: none). With --database and
 * no lead, the engine leads when no other coordinator does, and otherwise
 * follows (serves registration, tasks, uploads, models and views from the
 * store, bidding for the lead) once the store holds a model version; while
 * it holds none, it waits to lead as a standby. */
int srv_engine_open_led(const srv_config *cfg, srv_engine_lead *lead, srv_engine **out,
                        strata_diag *diag);

/* Whether this follower took the lead (the process then stops the engine,
 * takes its lead with srv_engine_take_lead and opens a new one with it);
 * SIGUSR1 tells the process when it happens. Any thread. */
int srv_engine_promoted(srv_engine *e);

/* After srv_engine_stop of a promoted engine: its lead (NULL when none);
 * srv_engine_free then leaves it open. */
srv_engine_lead *srv_engine_take_lead(srv_engine *e);

/* Closes a lead that is not handed on. Accepts NULL. */
void srv_engine_lead_free(srv_engine_lead *lead);

/* Sets the waiter callbacks (before srv_engine_start; not thread-safe). */
void srv_engine_set_waiters(srv_engine *e, srv_waiter_fn suspend, srv_waiter_fn resume);

/* Starts the round thread. Errors: STRATA_ENOMEM (no thread). */
int srv_engine_start(srv_engine *e);

/* Stops the round thread (waits for it, so it may block while a round
 * closes) and wakes every parked connection. Idempotent. */
void srv_engine_stop(srv_engine *e);

/* Flushes counters, closes the store, frees everything. Accepts NULL. Call
 * srv_engine_stop first; no other call may be in flight. */
void srv_engine_free(srv_engine *e);

/* Largest update body accepted, in bytes (fixed at open). */
size_t srv_engine_max_body(const srv_engine *e);

/* Largest JSON request body accepted, in bytes (fixed at open). */
size_t srv_engine_max_json(const srv_engine *e);

/* ---- registry (registry.c) ---- */

/* Checks a client's Authorization header value (borrowed, may be NULL):
 * "Bearer TOKEN" with a registered client's token. Returns STRATA_OK with
 * *client_id set, or STRATA_EPROTO with *client_id 0 and r set to
 * SRV_E_UNAUTHORIZED (missing, malformed or unknown token). No I/O, but
 * with --database, where another coordinator may have registered the
 * client a moment ago: an unknown token is looked up in the store (at most
 * 6,000 a minute; beyond, r is SRV_E_UNAVAILABLE with Retry-After 1). */
int srv_engine_auth(srv_engine *e, const char *authorization, uint64_t *client_id, srv_result *r);

/* Checks an admin request's Authorization header: STRATA_OK when it carries
 * the admin token; otherwise STRATA_EPROTO with r set to SRV_E_UNAUTHORIZED
 * (missing or unknown token) or SRV_E_FORBIDDEN (a client's token). */
int srv_engine_admin_auth(srv_engine *e, const char *authorization, srv_result *r);

/* Registers a client from the JSON body of POST /v1/clients (borrowed),
 * sent from address peer (text, borrowed; NULL or "" when unknown): checks
 * the enrolment secret, makes a random token, stores the client (durably,
 * before answering) and indexes its token hash. An address that sent
 * enrolment_rate wrong secrets within a minute is refused before anything
 * else until its bucket refills. r: SRV_CREATED (SRV_OK for a repeated
 * registration id) with {"client_id", "token"}, plus "data_share" (the
 * client's place in the order of registration) and "data_shares" when
 * data_shares is configured; SRV_E_RATE_LIMITED with Retry-After,
 * SRV_E_BAD_REQUEST / SRV_E_TOO_LARGE (the body), SRV_E_BAD_SECRET,
 * SRV_E_TOO_MANY_CLIENTS (max_clients), SRV_E_NO_DATA_SHARE (a new client
 * when every data share is taken: nothing is stored), SRV_E_INTERNAL. Blocks on the store's commit
 * under the engine lock. */
void srv_engine_register(srv_engine *e, const char *peer, const uint8_t *body, size_t len,
                         srv_result *r);

/* Takes one upload from the client's rate bucket (upload_rate per minute).
 * Returns STRATA_OK, or STRATA_ESTATE with r set to SRV_E_RATE_LIMITED and
 * its Retry-After (counted as a refused update). Unknown ids pass. */
int srv_engine_rate_take(srv_engine *e, uint64_t client_id, srv_result *r);

/* ---- rounds (round.c) ---- */

/* Answers a task request of an authenticated client. When the client is
 * selected for the open round and has not reported: r is SRV_OK with the
 * task JSON. When the federation is finished or stopped: SRV_E_FINISHED.
 * Otherwise, when waiter is not NULL and now is before deadline_ms (Unix
 * ms), the waiter is parked (suspend is called under the lock) and
 * *parked is 1: the caller asks again after resume (a round opened or
 * closed, or the wait ended) and r is untouched. Else r is SRV_NO_CONTENT
 * with Retry-After 1. Returns STRATA_OK (a failed allocation for the
 * waiter list answers SRV_NO_CONTENT). Never blocks. */
int srv_engine_task(srv_engine *e, uint64_t client_id, int64_t deadline_ms, void *waiter,
                    int *parked, srv_result *r);

/* Records that client_id, selected for the open round `round`, cannot
 * contribute to it (its update is not finite, say), so that the round need
 * not wait for it. body (borrowed; len bytes, may be empty) is
 * srv_request_reason's: its reason is logged; a bad body is
 * SRV_E_BAD_REQUEST or SRV_E_TOO_LARGE. Waits for a
 * group commit in flight. r: SRV_OK with {"round", "skipped": true} (also
 * for a repeat); SRV_E_CONFLICT (its update was accepted already),
 * SRV_E_NOT_SELECTED, SRV_E_ROUND_CLOSED (the round closed or is closing),
 * SRV_E_ROUND_NOT_OPEN, SRV_E_FINISHED. Counted in updates_skipped_total.
 * A skip is not durable: after a coordinator restart the client is asked
 * again. */
void srv_engine_skip(srv_engine *e, uint64_t client_id, uint32_t round, const uint8_t *body,
                     size_t len, srv_result *r);

/* Forgets a parked waiter (its connection ended). */
void srv_engine_waiter_gone(srv_engine *e, void *waiter);

/* ---- uploads (upload.c) ---- */

/* Takes a client's update for round (from the URL) as the payload body
 * (borrowed until it is answered). Decodes it once (the model's sizes are
 * the limits), checks that it is the client's and that its frame fits the
 * model (header round, sample count, layers) whatever the round, validates
 * it against the round's task when the round is open, and stores it
 * durably (group commit) before answering; an acknowledged update is
 * aggregated (FedAvg) or kept for the round's robust rule. r: SRV_OK with
 * {"round", "receipt", "duplicate"} (a byte-identical repeat gets the
 * original receipt); SRV_E_BAD_PAYLOAD, SRV_E_INVALID_UPDATE,
 * SRV_E_FORBIDDEN (the payload names another client), SRV_E_NOT_SELECTED,
 * SRV_E_ROUND_CLOSED, SRV_E_ROUND_NOT_OPEN, SRV_E_CONFLICT (a repeat with
 * other bytes; the stored update stays), SRV_E_UNAVAILABLE with Retry-After
 * (the store could not make it durable: nothing acknowledged). Client input
 * never gives SRV_E_INTERNAL. Each refusal is counted.
 *
 * An update that joins a group commit waits for its batch's commit: with a
 * connection conn (and the waiter callbacks set), conn is suspended
 * instead, *queued is set and r is untouched; once the upload is decided
 * conn is resumed and the request takes its answer with
 * srv_engine_upload_answer (or, when its connection ends first, hands it
 * back with srv_engine_upload_gone). Otherwise *queued is NULL and r is the
 * answer. */
void srv_engine_upload(srv_engine *e, uint64_t client_id, uint32_t round, const uint8_t *body,
                       size_t len, void *conn, srv_upload **queued, srv_result *r);

/* The answer of a queued upload whose connection was resumed, into r; frees
 * u. */
void srv_engine_upload_answer(srv_engine *e, srv_upload *u, srv_result *r);

/* Hands back a queued upload whose connection ended before it was answered
 * (the answer, when there is one, is dropped; an update already committed
 * stays acknowledged, and the client's retry gets its receipt). */
void srv_engine_upload_gone(srv_engine *e, srv_upload *u);

/* ---- models (models.c) ---- */

/* Answers GET /v1/models/0/init: SRV_OK with version 0's recipe
 * (strata/recipe.h, JSON), counted as downlink; SRV_E_NOT_FOUND when there
 * is none (--downlink none, a version 0 that is not the seeded
 * initialisation) or the delta from version 0 to 1 is no longer kept;
 * SRV_E_INTERNAL. */
void srv_engine_model_init(srv_engine *e, srv_result *r);

/* Answers a request for the deltas from model version `from` to `to`
 * (GET /v1/models/{to}/delta?from=from; from < to, checked by the caller)
 * as one chain (strata/downlink.h): SRV_OK with the chain and the ETag
 * "d<from>-<to>" (quoted); SRV_NOT_MODIFIED when if_none_match is that
 * ETag; SRV_E_NOT_FOUND (the client takes the snapshot instead) when the
 * coordinator publishes no deltas (--downlink none), `to` is newer than
 * the current version, a delta of the chain is no longer kept, the chain
 * would be longer than STRATA_DOWNLINK_MAX_CHAIN deltas, or the
 * chain would not be smaller than the current snapshot (zstd); SRV_E_INTERNAL.
 * Reads the delta files without the engine lock. */
void srv_engine_model_delta(srv_engine *e, uint64_t to, uint64_t from, const char *if_none_match,
                            srv_result *r);

/* Answers a request for model version (safetensors bytes; one zstd frame of
 * them when want_zstd). if_none_match (borrowed, may be NULL) is the
 * request's If-None-Match. r: SRV_OK with the bytes, the ETag "m<version>"
 * (quoted) and the zstd flag; SRV_NOT_MODIFIED (with the ETag) when
 * if_none_match is that ETag or "*"; SRV_E_NOT_FOUND for a version newer
 * than the current one or no longer kept; SRV_E_INTERNAL. The current
 * version comes from memory; an older one is read from its checkpoint
 * (blocks on disk, without the engine lock). */
void srv_engine_model(srv_engine *e, uint64_t version, int want_zstd, const char *if_none_match,
                      srv_result *r);

/* ---- admin (admin.c) ---- */

/* Admin actions: "pause" (no new round opens; the open one runs on),
 * "resume", "stop" (ends the federation now; the open round is closed
 * without aggregation; waits for a group commit in flight). Persistent
 * across restarts. body (borrowed): empty or {"reason": "..."}, logged. r:
 * SRV_OK with {"state"}; SRV_E_BAD_REQUEST / SRV_E_TOO_LARGE (the body),
 * SRV_E_NOT_FOUND (unknown action), SRV_E_ROUND_CLOSING (stop while a round
 * is being aggregated; Retry-After 1), SRV_E_INTERNAL. */
void srv_engine_admin(srv_engine *e, const char *action, const uint8_t *body, size_t len,
                      srv_result *r);

/* The full configuration (admin view): SRV_OK with {"config"}. */
void srv_engine_admin_config(srv_engine *e, srv_result *r);

/* ---- views (views.c) ---- */

/* Up to limit rounds from round from on: SRV_OK with {"rounds": [...]}
 * (each a round summary), or SRV_E_INTERNAL. Reads the store under the
 * engine lock. */
void srv_engine_rounds(srv_engine *e, uint32_t from, size_t limit, srv_result *r);

/* One round's summary: SRV_OK, SRV_E_NOT_FOUND or SRV_E_INTERNAL. */
void srv_engine_round(srv_engine *e, uint32_t round, srv_result *r);

/* The federation's state, round, model version, clients and public
 * configuration: SRV_OK with a JSON object. */
void srv_engine_status(srv_engine *e, srv_result *r);

/* GET /v1/health: 200 {"live", "ready", "leader" (all true), "store",
 * "epoch", "holder", "lease_ms_left", "store_latency_ms"} while this
 * coordinator leads its store, read from the store now. A coordinator
 * listens only once it is open and leads (a standby does not listen); 503
 * unavailable when the store says another leads (this one is about to
 * stop) or cannot be read. With SQLite the coordinator always leads
 * (epoch 1, lease_ms_left null). */
void srv_engine_health(srv_engine *e, srv_result *r);

/* ---- metrics (metrics.c) ---- */

/* The Prometheus text exposition of every counter and gauge: SRV_OK with
 * SRV_MEDIA_EXPOSITION, or SRV_E_INTERNAL. */
void srv_engine_metrics(srv_engine *e, srv_result *r);

/* Adds to the bytes-received and bytes-sent counters. Lock-free. */
void srv_engine_count_bytes(srv_engine *e, uint64_t in, uint64_t out);

/* Counts len bytes of a model or delta body sent (200): the downlink bytes
 * of the open round (or, between rounds, of the next one) and the
 * downlink_bytes_total counter. Takes the lock. */
void srv_engine_count_downlink(srv_engine *e, uint64_t len);

/* Counts a refused request by its outcome (an error outcome) in
 * strata_requests_rejected_total{reason=...}. Lock-free. */
void srv_engine_count_refused(srv_engine *e, srv_outcome o);

/* Counts an upload the transport refused before srv_engine_upload (its
 * credentials, media type or size) in strata_updates_rejected_total by the
 * refusal's outcome; outcomes without such a counter are ignored.
 * Lock-free. */
void srv_engine_count_update_refused(srv_engine *e, srv_outcome o);

#endif
