/* The round lifecycle through the engine's C API: a round opens once
 * min_clients are registered, its task, its close and the model version
 * advancing, and a restart resuming the open round without losing or
 * double-counting an acknowledged upload. */
#include "server_fixture.h"

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
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(task, "values")), "fp32");
    CU_ASSERT(json_integer_value(json_object_get(task, "deadline_unix_ms")) > 0);
    json_t *budgets = json_object_get(task, "budgets");
    strata_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_model_new("mlp", &m, NULL), 0);
    CU_ASSERT_EQUAL(json_array_size(budgets), strata_model_params(m)->count);
    for (size_t i = 0; i < json_array_size(budgets); i++) {
        json_t *b = json_array_get(budgets, i);
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

int main(void)
{
    CU_TestInfo tests[] = {{"open, task, close", test_open_task_close},
                           {"restart resumes the open round", test_restart_resumes},
                           CU_TEST_INFO_NULL};
    CU_SuiteInfo suites[] = {{"server_round", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
    return strata_test_run(suites);
}
