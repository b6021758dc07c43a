/* strata-server's round engine: registered clients, the open round, the
 * streaming aggregate, the global model and its cache, counters. Every
 * srv_engine_* call is thread-safe (one mutex around the engine state); a
 * background thread opens and closes rounds. The HTTP layer (http.c) turns
 * requests into these calls and their srv_resp into responses. */
#ifndef STRATA_SERVER_ENGINE_H
#define STRATA_SERVER_ENGINE_H

#include "config.h"

#include <stddef.h>
#include <stdint.h>

/* A response: status, body (malloc'ed, may be NULL) and a few headers. */
typedef struct srv_resp {
    unsigned status;
    uint8_t *body;
    size_t len;
    const char *ctype; /* static string */
    char etag[32];     /* "" for none */
    int zstd;          /* 1: Content-Encoding: zstd */
    int retry_after;   /* seconds; 0: no Retry-After */
    const char *code;  /* static error code of an error response, else NULL */
} srv_resp;

/* Frees the body and zeroes r. */
void srv_resp_cleanup(srv_resp *r);

/* Sets r to the JSON error object {"error":{"code":code,"message":...}}. */
void srv_resp_error(srv_resp *r, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef struct srv_engine srv_engine;

/* Called with the engine lock held: suspend parks a waiting connection,
 * resume wakes it (both must not block or call back into the engine). */
typedef void (*srv_waiter_fn)(void *waiter);

/* Opens the store, loads the test split, builds or resumes the model and
 * the open round. cfg is borrowed for the engine's lifetime. */
int srv_engine_open(const srv_config *cfg, srv_engine **out, strata_diag *diag);

/* Sets the waiter callbacks (before srv_engine_start). */
void srv_engine_set_waiters(srv_engine *e, srv_waiter_fn suspend, srv_waiter_fn resume);

/* Starts the round thread. */
int srv_engine_start(srv_engine *e);

/* Stops the round thread and wakes every waiting connection. */
void srv_engine_stop(srv_engine *e);

/* Flushes counters, closes the store, frees everything. Accepts NULL. */
void srv_engine_free(srv_engine *e);

/* Largest update body accepted. */
size_t srv_engine_max_body(const srv_engine *e);

/* Adds to the bytes-received and bytes-sent counters. */
void srv_engine_count_bytes(srv_engine *e, uint64_t in, uint64_t out);

/* Checks an Authorization header value (may be NULL). Returns 0 and the
 * client id, or fills r with 401 and returns -1. */
int srv_engine_auth(srv_engine *e, const char *authorization, uint64_t *client_id, srv_resp *r);

void srv_engine_register(srv_engine *e, const uint8_t *body, size_t len, srv_resp *r);

/* Answers a task request. When there is no task now and now_ms < the wait
 * deadline, parks waiter (calls suspend under the lock) and returns 1: the
 * caller answers again after resume. Otherwise fills r and returns 0. */
int srv_engine_task(srv_engine *e, uint64_t client_id, int64_t deadline_ms, void *waiter,
                    srv_resp *r);

/* Forgets a parked waiter (its connection ended). */
void srv_engine_waiter_gone(srv_engine *e, void *waiter);

void srv_engine_model(srv_engine *e, uint64_t version, int want_zstd, const char *if_none_match,
                      srv_resp *r);
void srv_engine_upload(srv_engine *e, uint64_t client_id, uint32_t round, const uint8_t *body,
                       size_t len, srv_resp *r);
/* Counts a refused upload by reason (for /metrics). */
void srv_engine_count_reject(srv_engine *e, const char *reason);

/* Counts a refused request by its error code (strata_requests_rejected_total). */
void srv_engine_count_error(srv_engine *e, const char *code);

/* Takes one upload from the client's rate bucket. Returns 0, or fills r
 * with 429 (and Retry-After) and returns -1. */
int srv_engine_rate_take(srv_engine *e, uint64_t client_id, srv_resp *r);

/* Checks an admin request's Authorization header: 0 when it carries the
 * admin token; otherwise fills r with 401 (missing or unknown token) or 403
 * (a client's token) and returns -1. */
int srv_engine_admin_auth(srv_engine *e, const char *authorization, srv_resp *r);

/* Admin actions: "pause" (no new round opens; the open one runs on),
 * "resume", "stop" (ends the federation now; the open round is closed
 * without aggregation). Persistent across restarts. body: empty or
 * {"reason": "..."}, logged. */
void srv_engine_admin(srv_engine *e, const char *action, const uint8_t *body, size_t len,
                      srv_resp *r);

/* The full configuration (admin view). */
void srv_engine_admin_config(srv_engine *e, srv_resp *r);

/* Limits of JSON request bodies. */
size_t srv_engine_max_json(const srv_engine *e);
void srv_engine_rounds(srv_engine *e, uint32_t from, size_t limit, srv_resp *r);
void srv_engine_round(srv_engine *e, uint32_t round, srv_resp *r);
void srv_engine_status(srv_engine *e, srv_resp *r);
void srv_engine_metrics(srv_engine *e, srv_resp *r);

/* Current time in Unix milliseconds. */
int64_t srv_now_ms(void);

#endif
