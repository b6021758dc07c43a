/* strata-sim: decoding a page of GET /v1/rounds. The envelope is read here;
 * every summary in it goes through the round-summary codec
 * (strata/summary.h), the one reader of a summary's keys. */
#include "sim.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sim_metric_text(double v, int prec, const char *none, char *buf, size_t cap)
{
    if (isnan(v))
        snprintf(buf, cap, "%s", none);
    else
        snprintf(buf, cap, "%.*f", prec, v);
    return buf;
}

int sim_summary_list_decode(const char *text, size_t len, strata_round_summary **out, size_t *n,
                            strata_diag *diag)
{
    *out = NULL;
    *n = 0;
    if (len > SIM_ROUNDS_MAX_JSON)
        return strata_diag_set(diag, STRATA_ETOOBIG, "round list: %zu bytes, more than %zu", len,
                               SIM_ROUNDS_MAX_JSON);
    json_error_t e;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e), *arr = NULL;
    int rc = STRATA_OK;
    if (j == NULL) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "round list: %s (offset %d)", e.text, e.position);
        goto out;
    }
    if (json_unpack_ex(j, &e, JSON_STRICT, "{s:o}", "rounds", &arr) < 0 || !json_is_array(arr)) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "round list: %s",
                             arr == NULL ? e.text : "\"rounds\" is not an array");
        goto out;
    }
    size_t count = json_array_size(arr);
    if (count == 0)
        goto out;
    if ((*out = calloc(count, sizeof(strata_round_summary))) == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "round list: out of memory");
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        /* The codec decodes text: each element is re-serialised as is. */
        char *one = json_dumps(json_array_get(arr, i), JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (one == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "round list: out of memory");
            goto out;
        }
        strata_diag d = {{0}};
        rc = strata_round_summary_decode(one, strlen(one), NULL, &(*out)[i], &d);
        free(one);
        if (rc < 0) {
            strata_diag_set(diag, rc, "round list, entry %zu: %s", i, strata_diag_msg(&d, rc));
            goto out;
        }
        *n = i + 1;
    }
out:
    json_decref(j);
    return rc;
}

void sim_summary_list_free(strata_round_summary *list, size_t n)
{
    for (size_t i = 0; list != NULL && i < n; i++)
        strata_round_summary_cleanup(&list[i]);
    free(list);
}
