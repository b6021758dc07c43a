/* The coordinator's counters: one enum entry per counter, their persistent
 * names, the mapping from a refusal's outcome to its counter (a table, no
 * name matching), and the Prometheus exposition text of /metrics.
 *
 * metrics.c owns them in its own structure (srv_metrics): the counters as
 * atomics, so that adding takes no lock, the deltas not yet written to the
 * store, and the gauges of the last round closed with a new model (guarded
 * by the engine lock). Pending deltas are written to the store by
 * srv__metrics_flush. Rounds completed and failed, updates
 * accepted and updates quarantined are not persisted as counters: start-up
 * counts them from the rounds, summaries and updates the store holds, so
 * that they are exact after any crash (srv__metrics_derived).
 *
 * May call: the store (counter table), result.h. Called by every engine
 * module that counts; it calls none of them. */
#ifndef STRATA_SERVER_METRICS_H
#define STRATA_SERVER_METRICS_H

#include "result.h"

#include "strata/error.h"

#include <stdint.h>

#include "store.h"

#include <stddef.h>

typedef struct srv_metrics srv_metrics;

typedef enum srv_counter {
    SRV_CTR_ROUNDS,
    SRV_CTR_ACCEPTED,
    SRV_CTR_ROUNDS_FAILED,  /* closed without a new model (a non-finite result) */
    SRV_CTR_CLOSE_FAILURES, /* close attempts that failed and will be retried */
    SRV_CTR_SKIPPED,        /* selected clients that said they cannot contribute */
    SRV_CTR_STRAGGLERS,     /* selected clients that did not answer by the deadline */
    /* updates_quarantined_total{reason=...}: left out of an aggregate */
    SRV_CTR_QUARANTINED_NORM,
    SRV_CTR_QUARANTINED_NON_FINITE,
    SRV_CTR_BYTES_RX,
    SRV_CTR_BYTES_TX,
    SRV_CTR_UPLINK,   /* accepted update bodies */
    SRV_CTR_DOWNLINK, /* model and delta bodies sent (200) */
    SRV_CTR_DENSE,    /* what dense FedAvg would have sent both ways, by closed round */
    /* updates_rejected_total{reason=...}: refused uploads */
    SRV_CTR_UPD_BAD_PAYLOAD,
    SRV_CTR_UPD_TOO_LARGE,
    SRV_CTR_UPD_INVALID,
    SRV_CTR_UPD_NOT_SELECTED,
    SRV_CTR_UPD_ROUND_CLOSED,
    SRV_CTR_UPD_ROUND_NOT_OPEN,
    SRV_CTR_UPD_UNAUTHORIZED,
    SRV_CTR_UPD_FORBIDDEN,
    SRV_CTR_UPD_RATE_LIMITED,
    SRV_CTR_UPD_MEDIA_TYPE,
    SRV_CTR_UPD_CONFLICT,
    SRV_CTR_UPD_UNAVAILABLE,
    /* requests_rejected_total{reason=...}: every refused request, by code */
    SRV_CTR_REQ_BAD_REQUEST,
    SRV_CTR_REQ_BAD_PAYLOAD,
    SRV_CTR_REQ_TOO_LARGE,
    SRV_CTR_REQ_UNAUTHORIZED,
    SRV_CTR_REQ_BAD_SECRET,
    SRV_CTR_REQ_FORBIDDEN,
    SRV_CTR_REQ_NOT_FOUND,
    SRV_CTR_REQ_METHOD_NOT_ALLOWED,
    SRV_CTR_REQ_UNSUPPORTED_MEDIA_TYPE,
    SRV_CTR_REQ_INVALID_UPDATE,
    SRV_CTR_REQ_NOT_SELECTED,
    SRV_CTR_REQ_ROUND_CLOSED,
    SRV_CTR_REQ_ROUND_NOT_OPEN,
    SRV_CTR_REQ_RATE_LIMITED,
    SRV_CTR_REQ_TOO_MANY_CLIENTS,
    SRV_CTR_REQ_NO_DATA_SHARE,
    SRV_CTR_REQ_FINISHED,
    SRV_CTR_REQ_ROUND_CLOSING,
    SRV_CTR_REQ_REQUEST_TIMEOUT,
    SRV_CTR_REQ_CONFLICT,
    SRV_CTR_REQ_UNAVAILABLE,
    SRV_CTR_REQ_OTHER,
    SRV_CTR_COUNT
} srv_counter;

/* A new set of counters, all 0 (srv__metrics_free). Errors: STRATA_ENOMEM. */
int srv__metrics_new(srv_metrics **out);

/* Frees m. Accepts NULL. */
void srv__metrics_free(srv_metrics *m);

/* Adds d to counter c. Thread-safe, lock-free. */
void srv__ctr_add(srv_metrics *m, srv_counter c, int64_t d);

/* Sets counter c to v (start-up: the counters derived from the store). */
void srv__ctr_set(srv_metrics *m, srv_counter c, int64_t v);

/* Writes pending deltas to the store through s, a connection the caller
 * may use now (a failed write keeps them pending, logged). Needs no
 * lock. */
void srv__metrics_flush(srv_metrics *m, strata_store *s);

/* 1 for the counters start-up derives from the store (never persisted as
 * counters), else 0. */
int srv__metrics_derived(srv_counter c);

/* Loads every persisted counter at start-up. Errors: the store's. */
int srv__metrics_load(srv_metrics *m, strata_store *s, strata_diag *d);

/* Sets the gauges of the last evaluated round: its test accuracy and loss,
 * the test images behind them, and its duration in seconds. Lock held (or
 * start-up). */
void srv__metrics_set_round(srv_metrics *m, double accuracy, double loss, size_t eval_samples,
                            double round_s);

/* Sets the gauge of the last round's aggregation time, in seconds. Lock
 * held. */
void srv__metrics_set_agg(srv_metrics *m, double agg_s);

/* What the /metrics text shows of the other modules, gathered under the
 * engine lock by its caller. */
typedef struct srv_metrics_live {
    int paused;             /* an operator paused the federation */
    int close_pending;      /* a failed round close waits for its retry */
    size_t clients;         /* registered clients */
    uint32_t round;         /* the open round, or the next to open */
    uint64_t model_version; /* the current global model version */
    /* With --database: one coordinator of several on the store (replica),
     * and its lead of the store (lease.h) when it leads */
    int replica;
    double store_read_s; /* a follower's last read of the leader row (-1: none) */
    int leading;
    int64_t lease_epoch;
    double lease_age_s, lease_renew_s;
    uint64_t lease_failures;
} srv_metrics_live;

/* The Prometheus text exposition of every counter and gauge into r:
 * SRV_OK with SRV_MEDIA_EXPOSITION, or SRV_E_INTERNAL. Lock held. */
void srv__metrics_text(const srv_metrics *m, const srv_metrics_live *live, srv_result *r);

/* The counter of requests refused with outcome o (requests_rejected_total;
 * SRV_CTR_REQ_OTHER for an outcome without its own). */
srv_counter srv__metrics_refused_counter(srv_outcome o);

/* The counter of uploads refused with outcome o (updates_rejected_total),
 * or SRV_CTR_COUNT when o has none. */
srv_counter srv__metrics_update_refused_counter(srv_outcome o);

#endif
