/* The coordinator's counters: one enum entry per counter, their persistent
 * names, the mapping from a refusal's outcome to its counter (a table, no
 * name matching), and the Prometheus exposition text of /metrics.
 *
 * Counters live in struct srv_engine (engine_internal.h) as atomics: adding
 * takes no lock. Pending deltas are written to the store by
 * srv__metrics_flush (lock held). Rounds completed and failed, updates
 * accepted and updates quarantined are not persisted as counters: start-up
 * counts them from the rounds, summaries and updates the store holds, so
 * that they are exact after any crash (srv__metrics_derived).
 *
 * May call: the store (counter table), result.h. */
#ifndef STRATA_SERVER_METRICS_H
#define STRATA_SERVER_METRICS_H

#include "result.h"

#include "strata/error.h"

#include <stdint.h>

struct srv_engine;

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

/* Adds d to counter c. Thread-safe, lock-free. */
void srv__ctr_add(struct srv_engine *e, srv_counter c, int64_t d);

/* Writes pending deltas to the store (a failed write keeps them pending,
 * logged). Lock held. */
void srv__metrics_flush(struct srv_engine *e);

/* 1 for the counters start-up derives from the store (never persisted as
 * counters), else 0. */
int srv__metrics_derived(srv_counter c);

/* Loads every persisted counter at start-up. Errors: the store's. */
int srv__metrics_load(struct srv_engine *e, strata_diag *d);

#endif
