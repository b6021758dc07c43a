/* strata-sim: decoding round summaries (the objects of GET /v1/rounds and
 * of the store's round records) into sim_summary. The only place the sim
 * reads a summary's JSON. */
#include "sim.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void sim_summary_init(sim_summary *s)
{
    memset(s, 0, sizeof(*s));
}

void sim_summary_cleanup(sim_summary *s)
{
    for (size_t i = 0; s->density_names != NULL && i < s->ndensities; i++)
        free(s->density_names[i]);
    free(s->density_names);
    free(s->densities);
    sim_summary_init(s);
}

/* *out = the number at key, 0 when the key is absent or null. */
static int opt_number(json_t *j, const char *key, double *out, strata_diag *diag)
{
    json_t *v = json_object_get(j, key);
    *out = 0.0;
    if (v == NULL || json_is_null(v))
        return STRATA_OK;
    if (!json_is_number(v))
        return strata_diag_set(diag, STRATA_EPROTO, "round summary: \"%s\" is not a number", key);
    *out = json_number_value(v);
    return STRATA_OK;
}

static int decode_densities(json_t *dj, sim_summary *s, strata_diag *diag)
{
    if (dj == NULL || json_is_null(dj))
        return STRATA_OK;
    if (!json_is_object(dj))
        return strata_diag_set(diag, STRATA_EPROTO,
                               "round summary: \"densities\" is not an object");
    size_t n = json_object_size(dj);
    if (n == 0)
        return STRATA_OK;
    s->density_names = calloc(n, sizeof(char *));
    s->densities = calloc(n, sizeof(double));
    if (s->density_names == NULL || s->densities == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "round summary: out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(dj, k, v)
    {
        if (!json_is_number(v))
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "round summary: density of \"%s\" is not a number", k);
        if ((s->density_names[s->ndensities] = strdup(k)) == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "round summary: out of memory");
        s->densities[s->ndensities++] = json_number_value(v);
    }
    return STRATA_OK;
}

/* Decodes one summary object (borrowed) into *s (initialised). */
static int decode_object(json_t *j, sim_summary *s, strata_diag *diag)
{
    json_error_t e;
    json_int_t round = 0, participants = 0;
    const char *state = NULL;
    int stopped = 0;
    json_t *dens = NULL;
    if (json_unpack_ex(j, &e, 0, "{s:I,s:s,s?b,s?I,s?o}", "round", &round, "state", &state,
                       "stopped", &stopped, "participants", &participants, "densities", &dens) < 0)
        return strata_diag_set(diag, STRATA_EPROTO, "round summary: %s", e.text);
    if (round < 0 || round > (json_int_t)UINT32_MAX || participants < 0)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "round summary: round or participants out of range");
    if (strcmp(state, "closed") != 0 && strcmp(state, "open") != 0)
        return strata_diag_set(diag, STRATA_EPROTO, "round summary: unknown state \"%s\"", state);
    s->round = (uint32_t)round;
    s->closed = strcmp(state, "closed") == 0;
    s->stopped = stopped;
    s->participants = (long)participants;
    int rc;
    if ((rc = opt_number(j, "accuracy", &s->accuracy, diag)) < 0 ||
        (rc = opt_number(j, "loss", &s->loss, diag)) < 0 ||
        (rc = opt_number(j, "uplink_bytes", &s->uplink_bytes, diag)) < 0 ||
        (rc = opt_number(j, "downlink_bytes", &s->downlink_bytes, diag)) < 0 ||
        (rc = opt_number(j, "dense_uplink_bytes", &s->dense_uplink_bytes, diag)) < 0 ||
        (rc = opt_number(j, "duration_ms", &s->duration_ms, diag)) < 0)
        return rc;
    return decode_densities(dens, s, diag);
}

/* Parses len bytes of JSON text into *out (a new reference). */
static int load(const char *text, size_t len, json_t **out, strata_diag *diag)
{
    *out = NULL;
    if (len > SIM_SUMMARY_MAX_JSON)
        return strata_diag_set(diag, STRATA_ETOOBIG, "round summaries: %zu bytes, more than %zu",
                               len, SIM_SUMMARY_MAX_JSON);
    json_error_t e;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    if (*out == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "round summaries: %s (offset %d)", e.text,
                               e.position);
    return STRATA_OK;
}

int sim_summary_decode(const char *text, size_t len, sim_summary *out, strata_diag *diag)
{
    sim_summary_init(out);
    json_t *j = NULL;
    int rc = load(text, len, &j, diag);
    if (rc == 0)
        rc = decode_object(j, out, diag);
    json_decref(j);
    return rc;
}

int sim_summary_list_decode(const char *text, size_t len, sim_summary **out, size_t *n,
                            strata_diag *diag)
{
    *out = NULL;
    *n = 0;
    json_t *j = NULL, *arr = NULL;
    int rc = load(text, len, &j, diag);
    if (rc < 0)
        goto out;
    json_error_t e;
    if (json_unpack_ex(j, &e, JSON_STRICT, "{s:o}", "rounds", &arr) < 0 || !json_is_array(arr)) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "round list: %s",
                             arr == NULL ? e.text : "\"rounds\" is not an array");
        goto out;
    }
    size_t count = json_array_size(arr);
    if (count == 0)
        goto out;
    if ((*out = calloc(count, sizeof(sim_summary))) == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "round list: out of memory");
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        *n = i + 1;
        sim_summary_init(&(*out)[i]);
        if ((rc = decode_object(json_array_get(arr, i), &(*out)[i], diag)) < 0)
            goto out;
    }
out:
    json_decref(j);
    return rc;
}

void sim_summary_list_free(sim_summary *list, size_t n)
{
    for (size_t i = 0; list != NULL && i < n; i++)
        sim_summary_cleanup(&list[i]);
    free(list);
}
