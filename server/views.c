/* The read views: GET /v1/rounds, /v1/rounds/{r} and /v1/status (see
 * engine.h). A closed round shows its stored summary; the open round (and a
 * closed one without a summary) a summary made now from the store's record
 * and the round's live counters (round.h).
 *
 * May call: the store (rounds), round.h, admin.h (the state name),
 * models.h, registry.h, config.h and jansson. */
#include "engine_internal.h"

#include "result_internal.h"

#include <jansson.h>
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
    char *t = NULL;
    srv__round_live_summary(e->rounds, rd, &t);
    json_t *j = t != NULL ? json_loads(t, 0, NULL) : NULL;
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
    const char *state = srv__admin_state_name(e->admin);
    json_t *j = json_pack(
        "{s:s,s:I,s:I,s:I,s:I,s:o}", "state", state, "round",
        (json_int_t)srv__round_current(e->rounds), "total_rounds", (json_int_t)e->total_rounds,
        "model_version", (json_int_t)srv__models_version(e->models), "registered_clients",
        (json_int_t)srv__registry_count(e->reg), "config", cfg ? cfg : json_object());
    pthread_mutex_unlock(&e->mu);
    srv__result_json(r, SRV_OK, j);
}
