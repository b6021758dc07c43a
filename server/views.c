/* The read views: GET /v1/rounds, /v1/rounds/{r} and /v1/status. A closed
 * round shows its stored summary; the open round (and a closed one without
 * a summary) a summary made now from the store's record and the round's
 * live counters.
 *
 * May call: the store (rounds), round.h (the summary document), admin.c
 * (the state name), config.h and jansson. */
#include "engine_internal.h"

#include "strata/clock.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The summary of a round record; lock held (reads the open round). */
static json_t *round_json(srv_engine *e, const strata_store_round *rd)
{
    if (rd->state == STRATA_STORE_ROUND_CLOSED && rd->summary_json != NULL) {
        json_t *j = json_loads(rd->summary_json, 0, NULL);
        if (j != NULL)
            return j;
    }
    int cur = e->open && rd->round == e->next_round;
    int64_t dur = strata_clock_unix_ms() - rd->opened_unix_ms;
    strata_round_summary s = {.round = rd->round,
                              .state = rd->state == STRATA_STORE_ROUND_OPEN ? STRATA_ROUND_OPEN
                                                                            : STRATA_ROUND_CLOSED,
                              .model_version = rd->model_version,
                              .selected = rd->n_selected,
                              .participants = rd->n_updates,
                              .has_stats = 1,
                              .accuracy = NAN,
                              .loss = NAN,
                              .uplink_bytes = cur ? e->uplink : 0,
                              .downlink_bytes = cur ? e->downlink : 0,
                              .dense_uplink_bytes = rd->n_updates * e->total_params * 4,
                              .duration_ms = dur > 0 ? (uint64_t)dur : 0,
                              .has_densities = cur};
    char *t = NULL;
    json_t *j = srv__summary_text(e, &s, &t, NULL) == 0 ? json_loads(t, 0, NULL) : NULL;
    free(t);
    return j;
}

void srv_engine_rounds(srv_engine *e, uint32_t from, size_t limit, srv_result *r)
{
    strata_store_round *rs = NULL;
    size_t n = 0;
    strata_diag d = {{0}};
    pthread_mutex_lock(&e->mu);
    int rc = strata_store_round_list(e->store, from, limit, &rs, &n, &d);
    json_t *arr = json_array();
    for (size_t i = 0; rc == 0 && i < n; i++)
        json_array_append_new(arr, round_json(e, &rs[i]));
    pthread_mutex_unlock(&e->mu);
    strata_store_round_list_free(rs, n);
    if (rc < 0) {
        json_decref(arr);
        srv_result_internal(r, strata_diag_msg(&d, rc));
        return;
    }
    srv__result_json(r, SRV_OK, json_pack("{s:o}", "rounds", arr));
}

void srv_engine_round(srv_engine *e, uint32_t round, srv_result *r)
{
    strata_store_round rd;
    memset(&rd, 0, sizeof(rd));
    int found = 0;
    strata_diag d = {{0}};
    pthread_mutex_lock(&e->mu);
    int rc = strata_store_round_get(e->store, round, &rd, &found, &d);
    json_t *j = rc == 0 && found ? round_json(e, &rd) : NULL;
    pthread_mutex_unlock(&e->mu);
    strata_store_round_cleanup(&rd);
    if (rc < 0)
        srv_result_internal(r, strata_diag_msg(&d, rc));
    else if (!found)
        srv_result_error(r, SRV_E_NOT_FOUND, "no round %u", round);
    else
        srv__result_json(r, SRV_OK, j);
}

void srv_engine_status(srv_engine *e, srv_result *r)
{
    char *cj = srv_config_json(e->cfg, 0);
    json_t *cfg = cj ? json_loads(cj, 0, NULL) : NULL;
    free(cj);
    pthread_mutex_lock(&e->mu);
    const char *state = srv__state_name(e);
    json_t *j = json_pack("{s:s,s:I,s:I,s:I,s:I,s:o}", "state", state, "round",
                          (json_int_t)e->next_round, "total_rounds", (json_int_t)e->cfg->rounds,
                          "model_version", (json_int_t)e->version, "registered_clients",
                          (json_int_t)e->nclients, "config", cfg ? cfg : json_object());
    pthread_mutex_unlock(&e->mu);
    srv__result_json(r, SRV_OK, j);
}
