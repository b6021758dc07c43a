/* libFuzzer target for strata_round_summary_decode.
 *
 * Every decode must either fail with STRATA_EPROTO or STRATA_ETOOBIG, a
 * message and a zeroed summary, or succeed with a summary that encodes,
 * decodes again to the same summary (NaN metrics and norms compare equal,
 * quarantined entries and the failure included) and
 * re-encodes to the same text. Anything else aborts. */
#include "strata/summary.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond)
{
    if (!cond)
        abort();
}

static int same_double(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

static int same_summary(const strata_round_summary *a, const strata_round_summary *b)
{
    if (a->round != b->round || a->state != b->state || a->model_version != b->model_version ||
        a->selected != b->selected || a->participants != b->participants ||
        a->has_stats != b->has_stats || a->has_densities != b->has_densities ||
        a->num_layers != b->num_layers || a->num_quarantined != b->num_quarantined ||
        a->failed != b->failed || a->stopped != b->stopped || a->recovered != b->recovered)
        return 0;
    if (a->has_stats &&
        (!same_double(a->accuracy, b->accuracy) || !same_double(a->loss, b->loss) ||
         a->uplink_bytes != b->uplink_bytes || a->downlink_bytes != b->downlink_bytes ||
         a->dense_uplink_bytes != b->dense_uplink_bytes || a->duration_ms != b->duration_ms))
        return 0;
    for (size_t i = 0; i < a->num_layers; i++)
        if (strcmp(a->layer_names[i], b->layer_names[i]) != 0 || a->densities[i] != b->densities[i])
            return 0;
    for (size_t i = 0; i < a->num_quarantined; i++) {
        const strata_round_quarantine *p = &a->quarantined[i], *q = &b->quarantined[i];
        if (p->client_id != q->client_id || p->reason != q->reason ||
            !same_double(p->norm, q->norm))
            return 0;
    }
    return 1;
}

static int is_zero(const strata_round_summary *s)
{
    static const strata_round_summary zero;
    return memcmp(s, &zero, sizeof(zero)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const strata_summary_limits lim = {.max_bytes = 1 << 16, .max_layers = 1024};
    strata_round_summary s;
    memset(&s, 0xa5, sizeof(s));
    strata_diag diag;
    int rc = strata_round_summary_decode((const char *)data, size, &lim, &s, &diag);
    if (rc < 0) {
        check((rc == STRATA_EPROTO || rc == STRATA_ETOOBIG) && diag.msg[0] != '\0' && is_zero(&s));
        return 0;
    }
    check(rc == STRATA_OK);
    char *json = NULL, *again = NULL;
    size_t len = 0, again_len = 0;
    check(strata_round_summary_encode(&s, &json, &len, NULL) == STRATA_OK);
    strata_round_summary u;
    check(strata_round_summary_decode(json, len, NULL, &u, NULL) == STRATA_OK);
    check(same_summary(&s, &u));
    check(strata_round_summary_encode(&u, &again, &again_len, NULL) == STRATA_OK);
    check(again_len == len && memcmp(json, again, len) == 0);
    free(again);
    free(json);
    strata_round_summary_cleanup(&u);
    strata_round_summary_cleanup(&s);
    check(is_zero(&s));
    return 0;
}
