/* The round lifecycle through the engine's C API: a round opens once
 * min_clients are registered, its task, its close and the model version
 * advancing, and a restart resuming the open round without losing or
 * double-counting an acknowledged upload. One client must not poison or
 * halt a federation: an attacker's huge (finite) update is quarantined
 * under every aggregator, a result that is not finite is never
 * checkpointed (the round goes on without the largest updates, or fails
 * with the model unchanged and the next round opens), and a close that
 * fails on the disk is retried until it commits, advancing the model
 * exactly once, in the same process and after a restart. */
#include "server_fixture.h"

#include "store.h"
#include "strata/checkpoint.h"

#include <math.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

/* Counter value from /metrics, or -1. */
static long long metric(fix_engine *f, const char *name)
{
    srv_result r = {0};
    srv_engine_metrics(f->e, &r);
    long long v = -1;
    char want[160];
    snprintf(want, sizeof(want), "\n%s ", name);
    const char *p = r.body ? strstr((const char *)r.body, want) : NULL;
    if (p != NULL)
        v = strtoll(p + strlen(want), NULL, 10);
    srv_result_cleanup(&r);
    return v;
}

/* The JSON view of round r (new reference) or NULL. */
static json_t *round_view(fix_engine *f, uint32_t r)
{
    srv_result res = {0};
    srv_engine_round(f->e, r, &res);
    json_t *j = res.outcome == SRV_OK ? fix_json(&res) : NULL;
    srv_result_cleanup(&res);
    return j;
}

/* Waits for round r's task for every client, then uploads for each of them
 * a dense update of value vals[i] trained on model version v. Returns the
 * number of uploads answered SRV_OK. */
static int upload_round(fix_engine *f, const uint64_t *ids, size_t n, uint32_t r, uint64_t v,
                        const float *vals)
{
    int ok = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *task = fix_wait_task(f, ids[i], 10000);
        int good = task != NULL && json_integer_value(json_object_get(task, "round")) == r &&
                   json_integer_value(json_object_get(task, "model_version")) == (json_int_t)v;
        json_decref(task);
        uint8_t *p = NULL;
        size_t len = 0;
        if (!good || fix_payload(r, v, ids[i], 100, vals[i], &p, &len) != 0)
            continue;
        ok += fix_upload(f, ids[i], r, p, len, NULL) == SRV_OK;
        free(p);
    }
    return ok;
}

/* Checks that checkpoint v1 of the state directory is checkpoint v0 with
 * delta added to every parameter (the plain server step, lr 1, rounded
 * once to float32) and finite throughout. */
static void assert_step(const char *dir, uint64_t v0, uint64_t v1, float delta)
{
    char p0[4096], p1[4096];
    CU_ASSERT_EQUAL_FATAL(
        strata_store_path(dir, STRATA_STORE_FILE_CHECKPOINT, v0, 0, p0, sizeof(p0), NULL), 0);
    CU_ASSERT_EQUAL_FATAL(
        strata_store_path(dir, STRATA_STORE_FILE_CHECKPOINT, v1, 0, p1, sizeof(p1), NULL), 0);
    strata_model *m0 = NULL, *m1 = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_checkpoint_load(p0, &m0, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(strata_checkpoint_load(p1, &m1, NULL), 0);
    const strata_tensor_list *a = strata_model_params(m0), *b = strata_model_params(m1);
    size_t bad = 0, nonfinite = 0;
    for (size_t i = 0; i < a->count; i++)
        for (size_t k = 0; k < a->items[i].numel; k++) {
            float x = a->items[i].data[k], y = b->items[i].data[k];
            nonfinite += !isfinite(y);
            bad += y != (float)((double)x + (double)delta);
        }
    CU_ASSERT_EQUAL(nonfinite, 0);
    CU_ASSERT_EQUAL(bad, 0);
    strata_model_free(m0);
    strata_model_free(m1);
}

static int checkpoint_exists(const char *dir, uint64_t v)
{
    char p[4096];
    struct stat st;
    return strata_store_path(dir, STRATA_STORE_FILE_CHECKPOINT, v, 0, p, sizeof(p), NULL) == 0 &&
           stat(p, &st) == 0;
}

/* The bytes of the payload stored for client's update of round r (read
 * from the state database beside the engine's connection), or -1. */
static long long stored_payload_bytes(const char *dir, uint32_t r, uint64_t client)
{
    char path[4096];
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    long long bytes = -1;
    snprintf(path, sizeof(path), "%s/state.db", dir);
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db,
                           "SELECT length(p.body) FROM updates u JOIN payloads p ON p.seq = u.seq"
                           " WHERE u.round = ?1 AND u.client_id = ?2",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, r);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)client);
        if (sqlite3_step(st) == SQLITE_ROW)
            bytes = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return bytes;
}

static void test_open_task_close(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, NULL), 0);
    uint64_t a = 0, b = 0;
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &a, NULL), SRV_CREATED);
    /* One client of the two min_clients: no round opens. */
    CU_ASSERT_PTR_NULL(fix_wait_task(&f, a, 300));
    srv_result r = {0};
    int parked = 1;
    CU_ASSERT_EQUAL(srv_engine_task(f.e, a, 0, NULL, &parked, &r), STRATA_OK);
    CU_ASSERT_EQUAL(parked, 0);
    CU_ASSERT_EQUAL(r.outcome, SRV_NO_CONTENT);
    CU_ASSERT_EQUAL(r.retry_after, 1);
    srv_result_cleanup(&r);

    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &b, NULL), SRV_CREATED);
    json_t *task = fix_wait_task(&f, a, 5000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(task);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "round")), 0);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "total_rounds")), 3);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "model_version")), 0);
    CU_ASSERT_EQUAL(json_array_size(json_object_get(task, "error_candidates")), 0);
    CU_ASSERT(json_integer_value(json_object_get(task, "deadline_unix_ms")) > 0);
    json_t *budgets = json_object_get(task, "budgets");
    strata_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_model_new("mlp", &m, NULL), 0);
    CU_ASSERT_EQUAL(json_array_size(budgets), strata_model_params(m)->count);
    for (size_t i = 0; i < json_array_size(budgets); i++) {
        json_t *b = json_array_get(budgets, i);
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(b, "values")), "fp32");
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(b, "layer")),
                               strata_model_params(m)->items[i].name);
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(b, "compressor")), "none");
    }
    strata_model_free(m);
    CU_ASSERT_PTR_NOT_NULL(json_object_get(json_object_get(task, "train"), "epochs"));
    json_decref(task);

    /* Both upload: the round closes and version 1 appears. */
    uint64_t ids[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        uint8_t *p = NULL;
        size_t len = 0;
        CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, ids[i], 100, 0.01f, &p, &len), 0);
        CU_ASSERT_EQUAL(fix_upload(&f, ids[i], 0, p, len, NULL), SRV_OK);
        free(p);
    }
    CU_ASSERT_TRUE(fix_wait_version(&f, 1, 20000));
    srv_engine_model(f.e, 1, 0, NULL, &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_OK);
    CU_ASSERT_STRING_EQUAL(r.etag, "\"m1\"");
    CU_ASSERT(r.len > 1000);
    srv_result_cleanup(&r);
    srv_engine_model(f.e, 1, 1, "\"m1\"", &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_NOT_MODIFIED);
    srv_result_cleanup(&r);
    srv_engine_model(f.e, 0, 1, NULL, &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_OK);
    CU_ASSERT_EQUAL(r.zstd, 1);
    srv_result_cleanup(&r);
    srv_engine_model(f.e, 7, 0, NULL, &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_E_NOT_FOUND);
    srv_result_cleanup(&r);

    srv_engine_round(f.e, 0, &r);
    json_t *s = fix_json(&r);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "state")), "closed");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 2);
    CU_ASSERT(json_is_real(json_object_get(s, "accuracy")));
    json_decref(s);
    srv_result_cleanup(&r);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 1);
    CU_ASSERT_EQUAL(metric(&f, "strata_updates_accepted_total"), 2);
    /* Round 1 opens for version 1. */
    task = fix_wait_task(&f, b, 5000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(task);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "round")), 1);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "model_version")), 1);
    json_decref(task);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

static void test_restart_resumes(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, NULL), 0);
    uint64_t a = 0, b = 0;
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &a, NULL), SRV_CREATED);
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &b, NULL), SRV_CREATED);
    json_t *task = fix_wait_task(&f, a, 5000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(task);
    json_decref(task);
    uint8_t *pa = NULL, *pb = NULL;
    size_t la = 0, lb = 0;
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, a, 100, 0.01f, &pa, &la), 0);
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, b, 50, -0.02f, &pb, &lb), 0);
    int dup = 1;
    CU_ASSERT_EQUAL(fix_upload(&f, a, 0, pa, la, &dup), SRV_OK);
    CU_ASSERT_EQUAL(dup, 0);
    fix_close(&f);

    /* Restarted: round 0 is still open with a's update counted once. */
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, NULL), 0);
    srv_result r = {0};
    srv_engine_round(f.e, 0, &r);
    json_t *s = fix_json(&r);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "state")), "open");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 1);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "uplink_bytes")), (json_int_t)la);
    json_decref(s);
    srv_result_cleanup(&r);
    CU_ASSERT_EQUAL(metric(&f, "strata_updates_accepted_total"), 1);
    int parked = 0;
    srv_engine_task(f.e, a, 0, NULL, &parked, &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_NO_CONTENT); /* a reported already */
    srv_result_cleanup(&r);
    task = fix_wait_task(&f, b, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(task);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "round")), 0);
    json_decref(task);
    /* a's repeat is a duplicate with the same receipt; nothing counted. */
    CU_ASSERT_EQUAL(fix_upload(&f, a, 0, pa, la, &dup), SRV_OK);
    CU_ASSERT_EQUAL(dup, 1);
    CU_ASSERT_EQUAL(metric(&f, "strata_updates_accepted_total"), 1);
    CU_ASSERT_EQUAL(srv_engine_start(f.e), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, b, 0, pb, lb, &dup), SRV_OK);
    CU_ASSERT_TRUE(fix_wait_version(&f, 1, 20000));
    srv_engine_round(f.e, 0, &r);
    s = fix_json(&r);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 2);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "uplink_bytes")), (json_int_t)(la + lb));
    json_decref(s);
    srv_result_cleanup(&r);
    CU_ASSERT_EQUAL(metric(&f, "strata_updates_accepted_total"), 2);
    fix_close(&f);
    free(pa);
    free(pb);
    strata_test_rmtree(dir);
    free(dir);
}

#define ATTACK 1e30f

/* One client of three sends 1e30 everywhere (finite, well formed) under each
 * aggregator with default screening: its update is quarantined (stored,
 * counted, listed in the summary, left out of the aggregate), the round
 * completes and the new model is exactly the honest one and finite. */
static void test_attacker_quarantined(void)
{
    static const char *const cases[][5] = {
        {"--min-clients", "3", NULL},
        {"--min-clients", "3", "--aggregator", "trimmed-mean", NULL},
        {"--min-clients", "3", "--aggregator", "median", NULL},
        {"--min-clients", "3", "--clip-norm", "100", NULL},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char *dir = strata_test_tmpdir();
        CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
        fix_engine f;
        CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, cases[c]), 0);
        uint64_t ids[3];
        for (int i = 0; i < 3; i++)
            CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
        const float vals[3] = {0.01f, ATTACK, 0.01f};
        CU_ASSERT_EQUAL(upload_round(&f, ids, 3, 0, 0, vals), 3);
        CU_ASSERT_TRUE_FATAL(fix_wait_version(&f, 1, 20000));
        json_t *s = round_view(&f, 0);
        json_t *q = json_object_get(s, "quarantined");
        CU_ASSERT_EQUAL(json_array_size(q), 1);
        json_t *q0 = json_array_get(q, 0);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(q0, "client_id")), (json_int_t)ids[1]);
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(q0, "reason")), "norm");
        CU_ASSERT(json_number_value(json_object_get(q0, "norm")) > 1e30);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 3);
        CU_ASSERT(json_is_real(json_object_get(s, "loss")));
        CU_ASSERT_PTR_NULL(json_object_get(s, "failed"));
        json_decref(s);
        CU_ASSERT_EQUAL(metric(&f, "strata_updates_quarantined_total{reason=\"norm\"}"), 1);
        CU_ASSERT_EQUAL(metric(&f, "strata_updates_quarantined_total{reason=\"non_finite\"}"), 0);
        CU_ASSERT_EQUAL(metric(&f, "strata_updates_accepted_total"), 3);
        CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 1);
        assert_step(dir, 0, 1, 0.01f);
        /* The attacker's update stays stored; the next round runs. */
        CU_ASSERT(stored_payload_bytes(dir, 0, ids[1]) > 0);
        json_t *task = fix_wait_task(&f, ids[1], 5000);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "round")), 1);
        json_decref(task);
        if (c == 0) {
            /* Counted from the stored summaries: exact after a restart. */
            fix_close(&f);
            CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, cases[c]), 0);
            CU_ASSERT_EQUAL(metric(&f, "strata_updates_quarantined_total{reason=\"norm\"}"), 1);
            CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 1);
        }
        fix_close(&f);
        strata_test_rmtree(dir);
        free(dir);
    }
}

/* Screening off: the attacker's update makes the loss non-finite, so the
 * round is aggregated again without the largest update (quarantined as
 * non_finite); nothing non-finite is ever checkpointed. */
static void test_non_finite_left_out(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {"--min-clients", "3", "--screen-factor", "0", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, extra), 0);
    uint64_t ids[3];
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    const float vals[3] = {ATTACK, 0.01f, 0.01f};
    CU_ASSERT_EQUAL(upload_round(&f, ids, 3, 0, 0, vals), 3);
    CU_ASSERT_TRUE_FATAL(fix_wait_version(&f, 1, 20000));
    json_t *s = round_view(&f, 0);
    json_t *q0 = json_array_get(json_object_get(s, "quarantined"), 0);
    CU_ASSERT_EQUAL(json_array_size(json_object_get(s, "quarantined")), 1);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(q0, "client_id")), (json_int_t)ids[0]);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(q0, "reason")), "non_finite");
    json_decref(s);
    CU_ASSERT_EQUAL(metric(&f, "strata_updates_quarantined_total{reason=\"non_finite\"}"), 1);
    CU_ASSERT_EQUAL(metric(&f, "strata_updates_quarantined_total{reason=\"norm\"}"), 0);
    assert_step(dir, 0, 1, 0.01f);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Every update is huge: no subset gives a finite loss, so the round closes
 * as failed with the model unchanged (no checkpoint, summary says why) and
 * the next round opens on the same version, and completes. */
static void test_failed_round_moves_on(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {"--min-clients", "3", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, extra), 0);
    uint64_t ids[3];
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    const float bad[3] = {ATTACK, ATTACK, ATTACK};
    CU_ASSERT_EQUAL(upload_round(&f, ids, 3, 0, 0, bad), 3);
    json_t *s = NULL;
    for (int t = 0; t < 1000; t++) {
        s = round_view(&f, 0);
        if (json_is_string(json_object_get(s, "failed")))
            break;
        json_decref(s);
        s = NULL;
        fix_sleep_ms(20);
    }
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "state")), "closed");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "failed")), "loss_not_finite");
    CU_ASSERT(json_is_null(json_object_get(s, "loss")));
    CU_ASSERT(json_is_null(json_object_get(s, "accuracy")));
    CU_ASSERT_PTR_NULL(json_object_get(s, "quarantined"));
    json_decref(s);
    CU_ASSERT_EQUAL(fix_version(&f), 0);
    CU_ASSERT_FALSE(checkpoint_exists(dir, 1));
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_failed_total"), 1);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 0);
    /* Round 1 trains the unchanged version 0 and completes. */
    const float good[3] = {0.01f, 0.01f, 0.01f};
    CU_ASSERT_EQUAL(upload_round(&f, ids, 3, 1, 0, good), 3);
    CU_ASSERT_TRUE_FATAL(fix_wait_version(&f, 1, 20000));
    assert_step(dir, 0, 1, 0.01f);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 1);
    fix_close(&f);
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, extra), 0);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_failed_total"), 1);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 1);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Skips round r for client id; returns the outcome. */
static srv_outcome skip(fix_engine *f, uint64_t id, uint32_t r)
{
    const char *body = "{\"reason\":\"update not finite\"}";
    srv_result res = {0};
    srv_engine_skip(f->e, id, r, (const uint8_t *)body, strlen(body), &res);
    srv_outcome o = res.outcome;
    srv_result_cleanup(&res);
    return o;
}

/* Waits (up to timeout_ms) until round r is closed; returns its view (new
 * reference) or NULL. */
static json_t *wait_closed(fix_engine *f, uint32_t r, long timeout_ms)
{
    for (long t = 0; t <= timeout_ms; t += 20) {
        json_t *s = round_view(f, r);
        const char *st = json_string_value(json_object_get(s, "state"));
        if (st != NULL && strcmp(st, "closed") == 0)
            return s;
        json_decref(s);
        fix_sleep_ms(20);
    }
    return NULL;
}

/* Waits (up to timeout_ms) until round r is open; 1 when it is. */
static int wait_open(fix_engine *f, uint32_t r, long timeout_ms)
{
    for (long t = 0; t <= timeout_ms; t += 20) {
        json_t *s = round_view(f, r);
        const char *st = json_string_value(json_object_get(s, "state"));
        int open = st != NULL && strcmp(st, "open") == 0;
        json_decref(s);
        if (open)
            return 1;
        fix_sleep_ms(20);
    }
    return 0;
}

/* 1 when client id gets a task for round r within timeout_ms. */
static int has_task(fix_engine *f, uint64_t id, uint32_t r, long timeout_ms)
{
    json_t *t = fix_wait_task(f, id, timeout_ms);
    int yes = t != NULL && json_integer_value(json_object_get(t, "round")) == r;
    json_decref(t);
    return yes;
}

/* A client that cannot contribute says so: the round closes with the
 * others' updates without waiting for its deadline (60 s here), the client
 * cannot upload to it afterwards, and it contributes to the next round. */
static void test_skip(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {"--min-clients", "3", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, extra), 0);
    uint64_t ids[3];
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    CU_ASSERT_TRUE(has_task(&f, ids[0], 0, 10000));
    CU_ASSERT_EQUAL(skip(&f, ids[0], 1), SRV_E_ROUND_NOT_OPEN);
    CU_ASSERT_EQUAL(skip(&f, ids[0], 0), SRV_OK);
    CU_ASSERT_EQUAL(skip(&f, ids[0], 0), SRV_OK); /* a repeat */
    uint8_t *p = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, ids[0], 100, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, ids[0], 0, p, len, NULL), SRV_E_CONFLICT);
    free(p);
    const float vals[2] = {0.01f, 0.01f};
    CU_ASSERT_EQUAL(upload_round(&f, ids + 1, 2, 0, 0, vals), 2);
    CU_ASSERT_EQUAL(
        skip(&f, ids[1], 0) == SRV_E_CONFLICT || skip(&f, ids[1], 0) == SRV_E_ROUND_CLOSED, 1);
    json_t *s = wait_closed(&f, 0, 10000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 2);
    CU_ASSERT_PTR_NULL(json_object_get(s, "failed"));
    json_decref(s);
    CU_ASSERT_TRUE(fix_wait_version(&f, 1, 10000));
    CU_ASSERT_EQUAL(skip(&f, ids[0], 0), SRV_E_ROUND_CLOSED);
    CU_ASSERT_EQUAL(metric(&f, "strata_updates_skipped_total"), 1);
    CU_ASSERT_EQUAL(metric(&f, "strata_stragglers_total"), 0);
    /* Round 1: the client that skipped contributes. */
    const float all[3] = {0.01f, 0.01f, 0.01f};
    CU_ASSERT_EQUAL(upload_round(&f, ids, 3, 1, 1, all), 3);
    CU_ASSERT_TRUE(fix_wait_version(&f, 2, 10000));
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Every selected client skips: the round closes at once as failed
 * (too_few_updates), the model stays, the next round opens. A round whose
 * deadline passes without an update closes the same way, and its silent
 * clients are counted as stragglers. */
static void test_too_few_updates(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {
        "--min-clients", "2", "--round-deadline", "3", "--straggler-rounds", "0", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, extra), 0);
    uint64_t ids[2];
    for (int i = 0; i < 2; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    CU_ASSERT_TRUE_FATAL(has_task(&f, ids[0], 0, 10000));
    CU_ASSERT_EQUAL(skip(&f, ids[0], 0), SRV_OK);
    CU_ASSERT_EQUAL(skip(&f, ids[1], 0), SRV_OK);
    json_t *s = wait_closed(&f, 0, 10000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "failed")), "too_few_updates");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 0);
    /* Not evaluated: null accuracy and loss, no eval_samples. */
    CU_ASSERT_TRUE(json_is_null(json_object_get(s, "accuracy")));
    CU_ASSERT_TRUE(json_is_null(json_object_get(s, "loss")));
    CU_ASSERT_PTR_NULL(json_object_get(s, "eval_samples"));
    json_decref(s);
    CU_ASSERT_EQUAL(fix_version(&f), 0);
    /* Round 1: nobody answers; the deadline closes it, failed. */
    CU_ASSERT_TRUE_FATAL(has_task(&f, ids[0], 1, 10000));
    s = wait_closed(&f, 1, 15000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "failed")), "too_few_updates");
    json_decref(s);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_failed_total"), 2);
    CU_ASSERT_EQUAL(metric(&f, "strata_stragglers_total"), 2);
    CU_ASSERT_EQUAL(fix_version(&f), 0);
    CU_ASSERT_FALSE(checkpoint_exists(dir, 1));
    /* Round 2 still opens and completes. */
    const float vals[2] = {0.01f, 0.01f};
    CU_ASSERT_EQUAL(upload_round(&f, ids, 2, 2, 0, vals), 2);
    CU_ASSERT_TRUE(fix_wait_version(&f, 1, 10000));
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* With over-selection a round closes once the updates it needs arrived,
 * and the clients it did not wait for are not stragglers. A selected client
 * that misses a deadline is not selected for the next --straggler-rounds
 * rounds while others can be. */
static void test_stragglers_and_over_selection(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *over[] = {"--min-clients", "4", "--clients-per-round", "2", "--over-select",
                          "0.5",           NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, over), 0);
    uint64_t ids[4], sel[4];
    for (int i = 0; i < 4; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    size_t ns = 0;
    CU_ASSERT_TRUE_FATAL(wait_open(&f, 0, 10000));
    for (int i = 0; i < 4; i++)
        if (has_task(&f, ids[i], 0, 100))
            sel[ns++] = ids[i];
    CU_ASSERT_EQUAL_FATAL(ns, 3); /* 2 needed, 50% more */
    const float vals[3] = {0.01f, 0.01f, 0.01f};
    CU_ASSERT_EQUAL(upload_round(&f, sel, 2, 0, 0, vals), 2);
    json_t *s = wait_closed(&f, 0, 10000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "selected")), 3);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 2);
    json_decref(s);
    CU_ASSERT_TRUE(fix_wait_version(&f, 1, 10000));
    CU_ASSERT_EQUAL(metric(&f, "strata_stragglers_total"), 0);
    fix_close(&f);
    strata_test_rmtree(dir);

    CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
    const char *late[] = {"--min-clients",
                          "3",
                          "--clients-per-round",
                          "2",
                          "--round-deadline",
                          "4",
                          "--straggler-rounds",
                          "2",
                          NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, late), 0);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    ns = 0;
    CU_ASSERT_TRUE_FATAL(wait_open(&f, 0, 10000));
    for (int i = 0; i < 3; i++)
        if (has_task(&f, ids[i], 0, 100))
            sel[ns++] = ids[i];
    CU_ASSERT_EQUAL_FATAL(ns, 2);
    CU_ASSERT_EQUAL(upload_round(&f, sel, 1, 0, 0, vals), 1); /* sel[1] stays silent */
    s = wait_closed(&f, 0, 15000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 1);
    json_decref(s);
    CU_ASSERT_EQUAL(metric(&f, "strata_stragglers_total"), 1);
    /* Rounds 1 and 2 ask the two others. */
    for (uint32_t r = 1; r <= 2; r++) {
        uint64_t got[3];
        size_t ng = 0;
        CU_ASSERT_TRUE_FATAL(wait_open(&f, r, 10000));
        for (int i = 0; i < 3; i++)
            if (ids[i] != sel[1] && has_task(&f, ids[i], r, 100))
                got[ng++] = ids[i];
        CU_ASSERT_EQUAL(ng, 2);
        CU_ASSERT_FALSE(has_task(&f, sel[1], r, 100));
        CU_ASSERT_EQUAL(upload_round(&f, got, ng, r, r, vals), (int)ng);
        CU_ASSERT_TRUE(fix_wait_version(&f, (long long)r + 1, 10000));
    }
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Makes the checkpoints directory unusable (a regular file in its place,
 * which stops writes for root too) or puts it back. */
static int checkpoints_broken(const char *dir, int broken)
{
    char ck[4096], away[4200];
    if (strata_store_path(dir, STRATA_STORE_FILE_CHECKPOINTS, 0, 0, ck, sizeof(ck), NULL) < 0)
        return -1;
    snprintf(away, sizeof(away), "%s.away", ck);
    if (!broken)
        return unlink(ck) == 0 && rename(away, ck) == 0 ? 0 : -1;
    if (rename(ck, away) < 0)
        return -1;
    FILE *fp = fopen(ck, "w");
    return fp != NULL && fclose(fp) == 0 ? 0 : -1;
}

/* Waits (up to timeout_ms) for a counter to reach at least v. */
static int wait_metric(fix_engine *f, const char *name, long long v, long timeout_ms)
{
    for (long t = 0; t <= timeout_ms; t += 20) {
        if (metric(f, name) >= v)
            return 1;
        fix_sleep_ms(20);
    }
    return 0;
}

/* A close whose checkpoint cannot be written is retried, not fatal: the
 * round stays closing (clients get "no task yet", never "finished"), the
 * model does not move, and once the disk is back the same updates are
 * aggregated onto the same model, exactly once. The same after a restart
 * while a retry is pending. */
static void test_close_retried(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, NULL), 0);
    uint64_t ids[2];
    for (int i = 0; i < 2; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    const float vals[2] = {0.01f, 0.01f};
    CU_ASSERT_EQUAL(upload_round(&f, ids, 1, 0, 0, vals), 1);
    CU_ASSERT_EQUAL_FATAL(checkpoints_broken(dir, 1), 0);
    CU_ASSERT_EQUAL(upload_round(&f, ids + 1, 1, 0, 0, vals), 1);
    CU_ASSERT_TRUE(wait_metric(&f, "strata_round_close_failures_total", 1, 10000));
    CU_ASSERT_EQUAL(metric(&f, "strata_round_close_pending"), 1);
    CU_ASSERT_EQUAL(fix_version(&f), 0);
    srv_result r = {0};
    int parked = 0;
    srv_engine_task(f.e, ids[0], 0, NULL, &parked, &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_NO_CONTENT);
    CU_ASSERT_EQUAL(r.retry_after, 1);
    srv_result_cleanup(&r);
    srv_engine_status(f.e, &r);
    json_t *st = fix_json(&r);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(st, "state")), "running");
    json_decref(st);
    srv_result_cleanup(&r);
    json_t *s = round_view(&f, 0);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "state")), "open");
    json_decref(s);
    /* A second attempt fails too (after 1 s), then the disk is back. */
    CU_ASSERT_TRUE(wait_metric(&f, "strata_round_close_failures_total", 2, 10000));
    CU_ASSERT_EQUAL(fix_version(&f), 0);
    CU_ASSERT_EQUAL_FATAL(checkpoints_broken(dir, 0), 0);
    CU_ASSERT_TRUE_FATAL(fix_wait_version(&f, 1, 20000));
    assert_step(dir, 0, 1, 0.01f);
    CU_ASSERT_EQUAL(metric(&f, "strata_round_close_pending"), 0);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 1);
    s = round_view(&f, 0);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "state")), "closed");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(s, "participants")), 2);
    json_decref(s);

    /* Round 1 fails to close; the coordinator stops while the retry is
     * pending and resumes after the disk is back. */
    CU_ASSERT_EQUAL_FATAL(checkpoints_broken(dir, 1), 0);
    CU_ASSERT_EQUAL(upload_round(&f, ids, 2, 1, 1, vals), 2);
    CU_ASSERT_TRUE(wait_metric(&f, "strata_round_close_failures_total", 3, 10000));
    CU_ASSERT_EQUAL(fix_version(&f), 1);
    fix_close(&f);
    CU_ASSERT_EQUAL_FATAL(checkpoints_broken(dir, 0), 0);
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, NULL), 0);
    CU_ASSERT_TRUE_FATAL(fix_wait_version(&f, 2, 20000));
    assert_step(dir, 1, 2, 0.01f);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 2);
    CU_ASSERT(metric(&f, "strata_round_close_failures_total") >= 3);
    json_t *task = fix_wait_task(&f, ids[0], 5000);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "round")), 2);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "model_version")), 2);
    json_decref(task);

    /* An operator may stop the federation while a close waits for its
     * retry: the round is closed unaggregated. */
    CU_ASSERT_EQUAL_FATAL(checkpoints_broken(dir, 1), 0);
    CU_ASSERT_EQUAL(upload_round(&f, ids, 2, 2, 2, vals), 2);
    long long failures = metric(&f, "strata_round_close_failures_total");
    CU_ASSERT_TRUE(wait_metric(&f, "strata_round_close_failures_total", failures + 1, 10000));
    srv_engine_admin(f.e, "stop", NULL, 0, &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_OK);
    srv_result_cleanup(&r);
    s = round_view(&f, 2);
    CU_ASSERT(json_is_true(json_object_get(s, "stopped")));
    json_decref(s);
    CU_ASSERT_EQUAL(fix_version(&f), 2);
    CU_ASSERT_EQUAL(metric(&f, "strata_round_close_pending"), 0);
    CU_ASSERT_EQUAL_FATAL(checkpoints_broken(dir, 0), 0);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Makes the store refuse to close a round, as a full disk or an I/O error
 * at commit would (a trigger on the rounds table's state, added or dropped
 * over a connection of the test's own; the seal before a close, which sets
 * closed_ms only, passes), or lets it again. */
static int round_close_refused(const char *dir, int refused)
{
    sqlite3 *h = fix_state_db(dir);
    int rc = h != NULL ? SQLITE_OK : SQLITE_CANTOPEN;
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(h,
                          refused
                              ? "CREATE TRIGGER test_refuse_close BEFORE UPDATE OF state ON rounds "
                                "BEGIN SELECT RAISE(ABORT, 'database or disk is full "
                                "(injected)'); END"
                              : "DROP TRIGGER test_refuse_close",
                          NULL, NULL, NULL);
    sqlite3_close(h);
    return rc == SQLITE_OK ? 0 : -1;
}

/* The store refuses the close's commit after the new checkpoint was
 * recorded: the model in memory is put back and the retry commits the same
 * step once. A coordinator restarted while such a retry is pending finds
 * the new checkpoint recorded and closes the round as recovered. */
static void test_close_retried_db_refused(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, NULL), 0);
    uint64_t ids[2];
    for (int i = 0; i < 2; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    const float vals[2] = {0.01f, 0.01f};
    CU_ASSERT_EQUAL(upload_round(&f, ids, 1, 0, 0, vals), 1);
    CU_ASSERT_EQUAL_FATAL(round_close_refused(dir, 1), 0);
    CU_ASSERT_EQUAL(upload_round(&f, ids + 1, 1, 0, 0, vals), 1);
    CU_ASSERT_TRUE(wait_metric(&f, "strata_round_close_failures_total", 1, 10000));
    CU_ASSERT_EQUAL(fix_version(&f), 0);
    CU_ASSERT_TRUE(checkpoint_exists(dir, 1)); /* written and recorded, not served */
    srv_result r = {0};
    srv_engine_model(f.e, 1, 0, NULL, &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_E_NOT_FOUND);
    srv_result_cleanup(&r);
    CU_ASSERT_EQUAL_FATAL(round_close_refused(dir, 0), 0);
    CU_ASSERT_TRUE_FATAL(fix_wait_version(&f, 1, 20000));
    assert_step(dir, 0, 1, 0.01f);
    CU_ASSERT_EQUAL(metric(&f, "strata_rounds_completed_total"), 1);

    CU_ASSERT_EQUAL_FATAL(round_close_refused(dir, 1), 0);
    CU_ASSERT_EQUAL(upload_round(&f, ids, 2, 1, 1, vals), 2);
    CU_ASSERT_TRUE(wait_metric(&f, "strata_round_close_failures_total", 2, 10000));
    CU_ASSERT_EQUAL(fix_version(&f), 1);
    fix_close(&f);
    CU_ASSERT_EQUAL_FATAL(round_close_refused(dir, 0), 0);
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, NULL), 0);
    CU_ASSERT_EQUAL(fix_version(&f), 2);
    assert_step(dir, 1, 2, 0.01f);
    json_t *s = round_view(&f, 1);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(s, "state")), "closed");
    CU_ASSERT(json_is_true(json_object_get(s, "recovered")));
    json_decref(s);
    json_t *task = fix_wait_task(&f, ids[1], 5000);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "round")), 2);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(task, "model_version")), 2);
    json_decref(task);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"a client that cannot contribute skips", test_skip},
        {"too few updates: the round fails, the next opens", test_too_few_updates},
        {"stragglers and over-selection", test_stragglers_and_over_selection},
        {"open, task, close", test_open_task_close},
        {"restart resumes the open round", test_restart_resumes},
        {"an attacker's 1e30 update is quarantined (every aggregator)", test_attacker_quarantined},
        {"a non-finite result leaves the largest update out", test_non_finite_left_out},
        {"a round that cannot be made finite fails; the next opens", test_failed_round_moves_on},
        {"a close that fails on the disk is retried, once committed", test_close_retried},
        {"a close the database refuses is retried, once committed", test_close_retried_db_refused},
        CU_TEST_INFO_NULL};
    CU_SuiteInfo suites[] = {{"server_round", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
    return strata_test_run(suites);
}
