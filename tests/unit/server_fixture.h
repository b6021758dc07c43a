/* A coordinator engine on a real temporary state directory with the
 * Fashion-MNIST test split and the mlp model, driven through its C API
 * (engine.h) without HTTP: for test_server_registry, test_server_round and
 * test_server_upload. Header-only (static inline functions) so that each test
 * binary stays one file. */
#ifndef STRATA_TEST_SERVER_FIXTURE_H
#define STRATA_TEST_SERVER_FIXTURE_H

#include "engine.h"
#include "store.h"
#include "test_util.h"

#include "strata/model.h"
#include "strata/payload.h"

#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FIX_SECRET "fixture-s3cret"

typedef struct fix_engine {
    srv_config cfg;
    srv_engine *e;
} fix_engine;

static inline void fix_noop_waiter(void *w)
{
    (void)w;
}

/* Opens (and, with start, starts) an engine on dir with extra command-line
 * options (NULL-terminated). Returns 0 or the open's error. */
static inline int fix_open(fix_engine *f, const char *dir, int start, const char *const *extra)
{
    memset(f, 0, sizeof(*f));
    const char *argv[64] = {"strata-server",
                            "--state-dir",
                            dir,
                            "--model",
                            "mlp",
                            "--data",
                            strata_test_data_dir(),
                            "--enrolment-secret",
                            FIX_SECRET,
                            "--rounds",
                            "3",
                            "--threads",
                            "1",
                            "--policy",
                            "none"};
    int argc = 15;
    for (size_t i = 0; extra != NULL && extra[i] != NULL && argc < 63; i++)
        argv[argc++] = extra[i];
    srv_config_init(&f->cfg);
    strata_diag d = {{0}};
    int rc = srv_config_parse(&f->cfg, argc, (char **)argv, &d);
    if (rc == 0)
        rc = srv_engine_open(&f->cfg, &f->e, &d);
    if (rc < 0) {
        fprintf(stderr, "fixture: %s\n", strata_diag_msg(&d, rc));
        srv_config_cleanup(&f->cfg);
        return rc;
    }
    srv_engine_set_waiters(f->e, fix_noop_waiter, fix_noop_waiter);
    return start ? srv_engine_start(f->e) : 0;
}

/* A connection of the test's own to the engine's state.db in dir (SQLite
 * store), waiting up to 10 s for the engine's locks; NULL when it cannot be
 * opened. Close it with sqlite3_close. */
static inline sqlite3 *fix_state_db(const char *dir)
{
    char path[4096];
    sqlite3 *h = NULL;
    if (strata_store_path(dir, STRATA_STORE_FILE_DB, 0, 0, path, sizeof(path), NULL) < 0)
        return NULL;
    if (sqlite3_open(path, &h) != SQLITE_OK) {
        sqlite3_close(h);
        return NULL;
    }
    sqlite3_busy_timeout(h, 10000);
    return h;
}

static inline void fix_close(fix_engine *f)
{
    if (f->e != NULL) {
        srv_engine_stop(f->e);
        srv_engine_free(f->e);
        srv_config_cleanup(&f->cfg);
    }
    f->e = NULL;
}

/* The result's JSON body (new reference) or NULL. */
static inline json_t *fix_json(const srv_result *r)
{
    if (r->body == NULL || r->media != SRV_MEDIA_JSON)
        return NULL;
    return json_loadb((const char *)r->body, r->len, 0, NULL);
}

/* Registers a client; writes its id and "Bearer TOKEN" header. Returns the
 * outcome. */
static inline srv_outcome fix_register(fix_engine *f, const char *secret, uint64_t *id,
                                       char auth[128])
{
    char body[256];
    snprintf(body, sizeof(body), "{\"name\":\"c\",\"enrolment_secret\":\"%s\"}", secret);
    srv_result r = {0};
    srv_engine_register(f->e, "127.0.0.1", (const uint8_t *)body, strlen(body), &r);
    srv_outcome o = r.outcome;
    json_t *j = fix_json(&r);
    *id = (uint64_t)json_integer_value(json_object_get(j, "client_id"));
    const char *tok = json_string_value(json_object_get(j, "token"));
    if (auth != NULL)
        snprintf(auth, 128, "Bearer %s", tok != NULL ? tok : "");
    json_decref(j);
    srv_result_cleanup(&r);
    return o;
}

static inline void fix_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (up to timeout_ms) for a task for client id; returns the task JSON
 * (new reference) or NULL. */
static inline json_t *fix_wait_task(fix_engine *f, uint64_t id, long timeout_ms)
{
    for (long t = 0; t <= timeout_ms; t += 20) {
        srv_result r = {0};
        int parked = 0;
        srv_engine_task(f->e, id, 0, NULL, &parked, &r);
        json_t *j = r.outcome == SRV_OK ? fix_json(&r) : NULL;
        srv_result_cleanup(&r);
        if (j != NULL)
            return j;
        fix_sleep_ms(20);
    }
    return NULL;
}

/* The current model version from /v1/status. */
static inline long long fix_version(fix_engine *f)
{
    srv_result r = {0};
    srv_engine_status(f->e, &r);
    json_t *j = fix_json(&r);
    long long v = (long long)json_integer_value(json_object_get(j, "model_version"));
    json_decref(j);
    srv_result_cleanup(&r);
    return v;
}

/* Encodes an update of the mlp model: every layer dense fp32, value x. */
static inline int fix_payload(uint32_t round, uint64_t version, uint64_t client, uint64_t samples,
                              float x, uint8_t **out, size_t *len)
{
    strata_model *m = NULL;
    if (strata_model_new("mlp", &m, NULL) < 0)
        return -1;
    const strata_tensor_list *params = strata_model_params(m);
    strata_clayer *layers = calloc(params->count, sizeof(*layers));
    int rc = layers ? 0 : -1;
    strata_budget b = {.comp = STRATA_COMP_NONE, .density = 1.0};
    for (size_t i = 0; rc == 0 && i < params->count; i++) {
        const strata_tensor *t = &params->items[i];
        float *v = malloc(t->numel * sizeof(*v));
        if (v == NULL) {
            rc = -1;
            break;
        }
        for (size_t k = 0; k < t->numel; k++)
            v[k] = x;
        rc = strata_compress(v, t->numel, t->ndim, t->shape, &b, STRATA_VALUES_FP32, 0, NULL,
                             &layers[i], NULL);
        layers[i].layer_index = (uint32_t)i;
        free(v);
    }
    strata_payload p = {.round = round,
                        .model_version = version,
                        .client_id = client,
                        .sample_count = samples,
                        .num_layers = params->count,
                        .layers = layers};
    if (rc == 0)
        rc = strata_payload_encode(&p, 0, out, len, NULL);
    if (layers != NULL)
        strata_clayers_free(layers, params->count);
    strata_model_free(m);
    return rc;
}

/* Uploads a payload; returns the outcome and, for SRV_OK, *duplicate. */
static inline srv_outcome fix_upload(fix_engine *f, uint64_t client, uint32_t round,
                                     const uint8_t *body, size_t len, int *duplicate)
{
    srv_result r = {0};
    srv_upload *queued = NULL; /* no connection: the call waits for its commit */
    srv_engine_upload(f->e, client, round, body, len, NULL, &queued, &r);
    CU_ASSERT_PTR_NULL(queued);
    srv_outcome o = r.outcome;
    if (srv_outcome_is_error(o)) /* for the log of a failing test */
        fprintf(stderr, "upload of client %llu, round %u: outcome %d: %s\n",
                (unsigned long long)client, round, (int)o, r.message);
    json_t *j = fix_json(&r);
    if (duplicate != NULL)
        *duplicate = json_is_true(json_object_get(j, "duplicate"));
    json_decref(j);
    srv_result_cleanup(&r);
    return o;
}

/* Waits (up to timeout_ms) for the model version to reach v. */
static inline int fix_wait_version(fix_engine *f, long long v, long timeout_ms)
{
    for (long t = 0; t <= timeout_ms; t += 20) {
        if (fix_version(f) >= v)
            return 1;
        fix_sleep_ms(20);
    }
    return 0;
}

#endif
