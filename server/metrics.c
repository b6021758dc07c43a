/* The coordinator's counters and gauges and the /metrics text (see
 * metrics.h): this file alone touches struct srv_metrics.
 *
 * May call: the store (counters), result.c, libstrata (buf, log). */
#include "metrics.h"

#include "strata/buf.h"
#include "strata/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct srv_metrics {
    _Atomic int64_t ctr[SRV_CTR_COUNT], pending[SRV_CTR_COUNT];
    /* The gauges of the last round closed with a new model (all but agg_s
     * restored from the store at start-up); under the engine lock. */
    double acc, loss, agg_s, round_s;
    size_t eval_samples; /* test images behind acc and loss */
};

static const char *const NAMES[SRV_CTR_COUNT] = {
    [SRV_CTR_ROUNDS] = "rounds_completed_total",
    [SRV_CTR_ACCEPTED] = "updates_accepted_total",
    [SRV_CTR_ROUNDS_FAILED] = "rounds_failed_total",
    [SRV_CTR_CLOSE_FAILURES] = "round_close_failures_total",
    [SRV_CTR_SKIPPED] = "updates_skipped_total",
    [SRV_CTR_STRAGGLERS] = "stragglers_total",
    [SRV_CTR_QUARANTINED_NORM] = "updates_quarantined_total{reason=\"norm\"}",
    [SRV_CTR_QUARANTINED_NON_FINITE] = "updates_quarantined_total{reason=\"non_finite\"}",
    [SRV_CTR_BYTES_RX] = "bytes_received_total",
    [SRV_CTR_BYTES_TX] = "bytes_sent_total",
    [SRV_CTR_UPLINK] = "uplink_bytes_total",
    [SRV_CTR_DOWNLINK] = "downlink_bytes_total",
    [SRV_CTR_DENSE] = "dense_fedavg_bytes_total",
#define UPD(c, reason) [SRV_CTR_UPD_##c] = "updates_rejected_total{reason=\"" reason "\"}"
    UPD(BAD_PAYLOAD, "bad_payload"),
    UPD(TOO_LARGE, "too_large"),
    UPD(INVALID, "invalid_update"),
    UPD(NOT_SELECTED, "not_selected"),
    UPD(ROUND_CLOSED, "round_closed"),
    UPD(ROUND_NOT_OPEN, "round_not_open"),
    UPD(UNAUTHORIZED, "unauthorized"),
    UPD(FORBIDDEN, "forbidden"),
    UPD(RATE_LIMITED, "rate_limited"),
    UPD(MEDIA_TYPE, "unsupported_media_type"),
    UPD(CONFLICT, "conflict"),
    UPD(UNAVAILABLE, "unavailable"),
#undef UPD
#define REQ(c, reason) [SRV_CTR_REQ_##c] = "requests_rejected_total{reason=\"" reason "\"}"
    REQ(BAD_REQUEST, "bad_request"),
    REQ(BAD_PAYLOAD, "bad_payload"),
    REQ(TOO_LARGE, "too_large"),
    REQ(UNAUTHORIZED, "unauthorized"),
    REQ(BAD_SECRET, "bad_secret"),
    REQ(FORBIDDEN, "forbidden"),
    REQ(NOT_FOUND, "not_found"),
    REQ(METHOD_NOT_ALLOWED, "method_not_allowed"),
    REQ(UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
    REQ(INVALID_UPDATE, "invalid_update"),
    REQ(NOT_SELECTED, "not_selected"),
    REQ(ROUND_CLOSED, "round_closed"),
    REQ(ROUND_NOT_OPEN, "round_not_open"),
    REQ(RATE_LIMITED, "rate_limited"),
    REQ(TOO_MANY_CLIENTS, "too_many_clients"),
    REQ(NO_DATA_SHARE, "no_data_share"),
    REQ(FINISHED, "finished"),
    REQ(ROUND_CLOSING, "round_closing"),
    REQ(REQUEST_TIMEOUT, "request_timeout"),
    REQ(CONFLICT, "conflict"),
    REQ(UNAVAILABLE, "unavailable"),
    REQ(OTHER, "other"),
#undef REQ
};

/* requests_rejected_total by outcome; SRV_CTR_REQ_OTHER for an outcome
 * without its own counter. 0 (SRV_CTR_ROUNDS) marks "none" here: it is
 * never a refusal's counter. */
static const srv_counter REQ_OF[SRV_OUTCOME_COUNT] = {
    [SRV_E_BAD_REQUEST] = SRV_CTR_REQ_BAD_REQUEST,
    [SRV_E_BAD_PAYLOAD] = SRV_CTR_REQ_BAD_PAYLOAD,
    [SRV_E_TOO_LARGE] = SRV_CTR_REQ_TOO_LARGE,
    [SRV_E_UNAUTHORIZED] = SRV_CTR_REQ_UNAUTHORIZED,
    [SRV_E_BAD_SECRET] = SRV_CTR_REQ_BAD_SECRET,
    [SRV_E_FORBIDDEN] = SRV_CTR_REQ_FORBIDDEN,
    [SRV_E_NOT_FOUND] = SRV_CTR_REQ_NOT_FOUND,
    [SRV_E_METHOD_NOT_ALLOWED] = SRV_CTR_REQ_METHOD_NOT_ALLOWED,
    [SRV_E_UNSUPPORTED_MEDIA_TYPE] = SRV_CTR_REQ_UNSUPPORTED_MEDIA_TYPE,
    [SRV_E_INVALID_UPDATE] = SRV_CTR_REQ_INVALID_UPDATE,
    [SRV_E_NOT_SELECTED] = SRV_CTR_REQ_NOT_SELECTED,
    [SRV_E_ROUND_CLOSED] = SRV_CTR_REQ_ROUND_CLOSED,
    [SRV_E_ROUND_NOT_OPEN] = SRV_CTR_REQ_ROUND_NOT_OPEN,
    [SRV_E_RATE_LIMITED] = SRV_CTR_REQ_RATE_LIMITED,
    [SRV_E_TOO_MANY_CLIENTS] = SRV_CTR_REQ_TOO_MANY_CLIENTS,
    [SRV_E_NO_DATA_SHARE] = SRV_CTR_REQ_NO_DATA_SHARE,
    [SRV_E_FINISHED] = SRV_CTR_REQ_FINISHED,
    [SRV_E_ROUND_CLOSING] = SRV_CTR_REQ_ROUND_CLOSING,
    [SRV_E_REQUEST_TIMEOUT] = SRV_CTR_REQ_REQUEST_TIMEOUT,
    [SRV_E_CONFLICT] = SRV_CTR_REQ_CONFLICT,
    [SRV_E_UNAVAILABLE] = SRV_CTR_REQ_UNAVAILABLE,
};

/* updates_rejected_total by outcome; SRV_CTR_ROUNDS: not counted there. */
static const srv_counter UPD_OF[SRV_OUTCOME_COUNT] = {
    [SRV_E_BAD_PAYLOAD] = SRV_CTR_UPD_BAD_PAYLOAD,
    [SRV_E_TOO_LARGE] = SRV_CTR_UPD_TOO_LARGE,
    [SRV_E_INVALID_UPDATE] = SRV_CTR_UPD_INVALID,
    [SRV_E_NOT_SELECTED] = SRV_CTR_UPD_NOT_SELECTED,
    [SRV_E_ROUND_CLOSED] = SRV_CTR_UPD_ROUND_CLOSED,
    [SRV_E_ROUND_NOT_OPEN] = SRV_CTR_UPD_ROUND_NOT_OPEN,
    [SRV_E_UNAUTHORIZED] = SRV_CTR_UPD_UNAUTHORIZED,
    [SRV_E_FORBIDDEN] = SRV_CTR_UPD_FORBIDDEN,
    [SRV_E_RATE_LIMITED] = SRV_CTR_UPD_RATE_LIMITED,
    [SRV_E_UNSUPPORTED_MEDIA_TYPE] = SRV_CTR_UPD_MEDIA_TYPE,
    [SRV_E_CONFLICT] = SRV_CTR_UPD_CONFLICT,
    [SRV_E_UNAVAILABLE] = SRV_CTR_UPD_UNAVAILABLE,
};

int srv__metrics_new(srv_metrics **out)
{
    *out = calloc(1, sizeof(**out));
    return *out != NULL ? STRATA_OK : STRATA_ENOMEM;
}

void srv__metrics_free(srv_metrics *m)
{
    free(m);
}

void srv__ctr_add(srv_metrics *m, srv_counter c, int64_t d)
{
    atomic_fetch_add(&m->ctr[c], d);
    atomic_fetch_add(&m->pending[c], d);
}

void srv__ctr_set(srv_metrics *m, srv_counter c, int64_t v)
{
    atomic_store(&m->ctr[c], v);
}

void srv__metrics_set_round(srv_metrics *m, double accuracy, double loss, size_t eval_samples,
                            double round_s)
{
    m->acc = accuracy;
    m->loss = loss;
    m->eval_samples = eval_samples;
    m->round_s = round_s;
}

void srv__metrics_set_agg(srv_metrics *m, double agg_s)
{
    m->agg_s = agg_s;
}

int srv__metrics_derived(srv_counter c)
{
    return c == SRV_CTR_ROUNDS || c == SRV_CTR_ACCEPTED || c == SRV_CTR_ROUNDS_FAILED ||
           c == SRV_CTR_QUARANTINED_NORM || c == SRV_CTR_QUARANTINED_NON_FINITE;
}

void srv__metrics_flush(srv_metrics *m, strata_store *s)
{
    strata_store_counter deltas[SRV_CTR_COUNT];
    size_t n = 0;
    int64_t taken[SRV_CTR_COUNT];
    for (int c = 0; c < SRV_CTR_COUNT; c++) {
        taken[c] = srv__metrics_derived(c) ? 0 : atomic_exchange(&m->pending[c], 0);
        if (taken[c] != 0) {
            snprintf(deltas[n].name, sizeof(deltas[n].name), "%s", NAMES[c]);
            deltas[n++].value = taken[c];
        }
    }
    strata_diag d = {{0}};
    if (n > 0 && strata_store_counter_add_many(s, deltas, n, &d) < 0) {
        strata_log_error("saving counters: %s", d.msg);
        for (int c = 0; c < SRV_CTR_COUNT; c++)
            atomic_fetch_add(&m->pending[c], taken[c]);
    }
}

int srv__metrics_load(srv_metrics *m, strata_store *s, strata_diag *d)
{
    for (int c = 0; c < SRV_CTR_COUNT; c++) {
        int64_t v = 0;
        int rc = strata_store_counter_get(s, NAMES[c], &v, d);
        if (rc < 0)
            return rc;
        atomic_store(&m->ctr[c], v);
    }
    return 0;
}

srv_counter srv__metrics_refused_counter(srv_outcome o)
{
    srv_counter c = o >= SRV_E_FIRST && o < SRV_OUTCOME_COUNT ? REQ_OF[o] : SRV_CTR_ROUNDS;
    return c != SRV_CTR_ROUNDS ? c : SRV_CTR_REQ_OTHER;
}

srv_counter srv__metrics_update_refused_counter(srv_outcome o)
{
    srv_counter c = o >= SRV_E_FIRST && o < SRV_OUTCOME_COUNT ? UPD_OF[o] : SRV_CTR_ROUNDS;
    return c != SRV_CTR_ROUNDS ? c : SRV_CTR_COUNT;
}

void srv__metrics_text(const srv_metrics *m, const srv_metrics_live *live, srv_result *r)
{
    static const char *const help[][2] = {
        {"rounds_completed_total", "Rounds closed with a new model."},
        {"updates_accepted_total", "Updates accepted."},
        {"rounds_failed_total",
         "Rounds closed without a new model (the aggregate, model or loss was not finite)."},
        {"round_close_failures_total",
         "Round closes that failed (disk, database) and were retried."},
        {"updates_skipped_total",
         "Selected clients that said they cannot contribute to their round."},
        {"stragglers_total", "Selected clients that did not answer by their round's deadline."},
        {"updates_quarantined_total",
         "Accepted updates left out of their round's aggregate, by reason."},
        {"bytes_received_total", "Request body bytes received."},
        {"bytes_sent_total", "Response body bytes sent."},
        {"uplink_bytes_total", "Bytes of accepted update bodies (payloads)."},
        {"downlink_bytes_total",
         "Bytes of model snapshot, delta-chain and recipe bodies sent (200 answers of GET "
         "/v1/models/{v}, /v1/models/{v}/delta and /v1/models/0/init)."},
        {"dense_fedavg_bytes_total",
         "Bytes dense FedAvg would have sent both ways in the closed rounds (participants x "
         "parameters x 4, up and down): the reference of the compression ratios."},
        {"updates_rejected_total", "Updates refused, by reason."},
        {"requests_rejected_total", "Requests answered with an error, by error code."}};
    strata_buf b;
    strata_buf_init(&b, 1 << 20);
    int rc = strata_buf_reserve(&b, 16384);
    char prev[64] = "";
    for (int c = 0; rc == 0 && c < SRV_CTR_COUNT; c++) {
        char base[64];
        snprintf(base, sizeof(base), "%s", NAMES[c]);
        base[strcspn(base, "{")] = '\0';
        if (strcmp(base, prev) != 0) {
            const char *h = "";
            for (size_t i = 0; i < sizeof(help) / sizeof(help[0]); i++)
                if (strcmp(help[i][0], base) == 0)
                    h = help[i][1];
            rc = strata_buf_appendf(&b, "# HELP strata_%s %s\n# TYPE strata_%s counter\n", base, h,
                                    base);
            snprintf(prev, sizeof(prev), "%s", base);
        }
        if (rc == 0)
            rc = strata_buf_appendf(&b, "strata_%s %lld\n", NAMES[c],
                                    (long long)atomic_load(&m->ctr[c]));
    }
    if (rc == 0)
        rc = strata_buf_appendf(
            &b,
            "# HELP strata_paused 1 while an operator has paused the federation.\n"
            "# TYPE strata_paused gauge\nstrata_paused %d\n"
            "# HELP strata_round_close_pending 1 while a failed round close waits to be "
            "retried.\n"
            "# TYPE strata_round_close_pending gauge\nstrata_round_close_pending %d\n"
            "# HELP strata_aggregation_seconds Server aggregation time of the last round.\n"
            "# TYPE strata_aggregation_seconds gauge\nstrata_aggregation_seconds %.6f\n"
            "# HELP strata_round_duration_seconds Duration of the last round.\n"
            "# TYPE strata_round_duration_seconds gauge\nstrata_round_duration_seconds %.3f\n"
            "# HELP strata_accuracy Test accuracy of the last evaluation.\n"
            "# TYPE strata_accuracy gauge\nstrata_accuracy %.6f\n"
            "# HELP strata_loss Test loss of the last evaluation.\n"
            "# TYPE strata_loss gauge\nstrata_loss %.6f\n"
            "# HELP strata_eval_samples Test images behind strata_accuracy and strata_loss "
            "(fewer than the test set when --eval-samples sampled them).\n"
            "# TYPE strata_eval_samples gauge\nstrata_eval_samples %zu\n"
            "# HELP strata_registered_clients Registered clients.\n"
            "# TYPE strata_registered_clients gauge\nstrata_registered_clients %zu\n"
            "# HELP strata_round Current (open or next) round.\n"
            "# TYPE strata_round gauge\nstrata_round %u\n"
            "# HELP strata_model_version Current global model version.\n"
            "# TYPE strata_model_version gauge\nstrata_model_version %llu\n",
            live->paused, live->close_pending, m->agg_s, m->round_s, m->acc, m->loss,
            m->eval_samples, live->clients, live->round, (unsigned long long)live->model_version);
    if (rc == 0 && live->replica)
        rc = strata_buf_appendf(&b,
                                "# HELP strata_leader 1 when this coordinator leads the store "
                                "(runs the rounds), 0 when it follows (--database).\n"
                                "# TYPE strata_leader gauge\nstrata_leader %d\n",
                                live->leading);
    if (rc == 0 && live->replica && !live->leading && live->store_read_s >= 0)
        rc = strata_buf_appendf(&b,
                                "# HELP strata_store_read_seconds Duration of a follower's last "
                                "read of the leader row (every half second): the database's "
                                "latency.\n"
                                "# TYPE strata_store_read_seconds gauge\n"
                                "strata_store_read_seconds %.6f\n",
                                live->store_read_s);
    if (rc == 0 && live->leading)
        rc = strata_buf_appendf(
            &b,
            "# HELP strata_lease_epoch The epoch of this coordinator's lead of the store "
            "(--database).\n"
            "# TYPE strata_lease_epoch gauge\nstrata_lease_epoch %lld\n"
            "# HELP strata_lease_renewal_age_seconds Time since the lead was taken or its lease "
            "last renewed (the coordinator stops when it reaches the lease).\n"
            "# TYPE strata_lease_renewal_age_seconds gauge\n"
            "strata_lease_renewal_age_seconds %.3f\n"
            "# HELP strata_store_renewal_seconds Duration of the last lease renewal, one write "
            "transaction on the store: the database's latency.\n"
            "# TYPE strata_store_renewal_seconds gauge\nstrata_store_renewal_seconds %.6f\n"
            "# HELP strata_lease_renewal_failures_total Lease renewals that failed (the "
            "database down or unreachable) and were retried.\n"
            "# TYPE strata_lease_renewal_failures_total counter\n"
            "strata_lease_renewal_failures_total %llu\n",
            (long long)live->lease_epoch, live->lease_age_s, live->lease_renew_s,
            (unsigned long long)live->lease_failures);
    if (rc < 0) {
        strata_buf_cleanup(&b);
        srv_result_internal(r, "metrics text too long");
        return;
    }
    size_t len = 0;
    uint8_t *text = strata_buf_take(&b, &len);
    srv_result_take(r, SRV_OK, SRV_MEDIA_EXPOSITION, text, len);
}
