/* The upload pipeline through the engine's C API: accepted, duplicate, not
 * selected, wrong round, wrong client, invalid and malformed payloads, each
 * with its typed outcome and counter; and an update the store holds but the
 * round lacks (a commit whose answer was lost) joining the round. */
#include "server_fixture.h"

#include "strata/hash.h"

static void test_outcomes(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    /* Three clients, two selected per round. */
    const char *extra[] = {"--min-clients", "3", "--clients-per-round", "2", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, extra), 0);
    uint64_t ids[3];
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    uint64_t sel[2], out = 0;
    size_t ns = 0;
    for (long t = 0; t < 5000 && ns == 0; t += 50) {
        for (int i = 0; i < 3; i++) {
            json_t *task = fix_wait_task(&f, ids[i], 0);
            if (task != NULL && ns < 2)
                sel[ns++] = ids[i];
            else if (task == NULL)
                out = ids[i];
            json_decref(task);
        }
        if (ns < 2) {
            ns = 0;
            fix_sleep_ms(50);
        }
    }
    CU_ASSERT_EQUAL_FATAL(ns, 2);
    CU_ASSERT_NOT_EQUAL_FATAL(out, 0);

    uint8_t *p = NULL;
    size_t len = 0;
    int dup = 0;
    /* Not selected. */
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, out, 10, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, out, 0, p, len, NULL), SRV_E_NOT_SELECTED);
    free(p);
    /* A payload for another client than the token's. */
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, sel[1], 10, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, p, len, NULL), SRV_E_FORBIDDEN);
    free(p);
    /* Header round 0 for URL round 1 (not open), and round 0 for URL 0 but
     * with the wrong model version. */
    CU_ASSERT_EQUAL_FATAL(fix_payload(1, 0, sel[0], 10, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 1, p, len, NULL), SRV_E_ROUND_NOT_OPEN);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, p, len, NULL), SRV_E_INVALID_UPDATE);
    free(p);
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 5, sel[0], 10, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, p, len, NULL), SRV_E_INVALID_UPDATE);
    free(p);
    /* Zero samples. */
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, sel[0], 0, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, p, len, NULL), SRV_E_INVALID_UPDATE);
    free(p);
    /* Not a payload at all; empty. */
    const uint8_t junk[] = "not a payload";
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, junk, sizeof(junk), NULL), SRV_E_BAD_PAYLOAD);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, junk, 0, NULL), SRV_E_BAD_PAYLOAD);

    /* Accepted, then a duplicate with the original receipt. */
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, sel[0], 10, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, p, len, &dup), SRV_OK);
    CU_ASSERT_EQUAL(dup, 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, p, len, &dup), SRV_OK);
    CU_ASSERT_EQUAL(dup, 1);
    free(p);
    /* A repeat with other content: a conflict, the first update kept. */
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, sel[0], 10, 0.02f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, p, len, NULL), SRV_E_CONFLICT);
    free(p);
    /* The second selected client closes round 0; a late upload for it is
     * refused as closed. */
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, sel[1], 10, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[1], 0, p, len, &dup), SRV_OK);
    free(p);
    CU_ASSERT_TRUE(fix_wait_version(&f, 1, 20000));
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, out, 10, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, out, 0, p, len, NULL), SRV_E_ROUND_CLOSED);
    free(p);
    /* Every path validates first: zero samples for the closed round (a
     * repeat of an accepted client) and for a round that never opened. */
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, sel[0], 0, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 0, p, len, NULL), SRV_E_INVALID_UPDATE);
    free(p);
    CU_ASSERT_EQUAL_FATAL(fix_payload(7, 1, sel[0], 0, 0.01f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, sel[0], 7, p, len, NULL), SRV_E_INVALID_UPDATE);
    free(p);

    srv_result r = {0};
    srv_engine_metrics(f.e, &r);
    const char *m = (const char *)r.body;
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(m, "strata_updates_accepted_total 2\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(m, "strata_updates_rejected_total{reason=\"not_selected\"} 1\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(m, "strata_updates_rejected_total{reason=\"forbidden\"} 1\n"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(m, "strata_updates_rejected_total{reason=\"invalid_update\"} 5\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(m, "strata_updates_rejected_total{reason=\"conflict\"} 1\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(m, "strata_updates_rejected_total{reason=\"bad_payload\"} 2\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(m, "strata_updates_rejected_total{reason=\"round_closed\"} 1\n"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(m, "strata_updates_rejected_total{reason=\"round_not_open\"} 1\n"));
    srv_result_cleanup(&r);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* The robust rules keep their results without the FedAvg accumulator: a
 * median over three updates closes the round. */
static void test_robust_round(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {"--min-clients", "3", "--aggregator", "median", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, extra), 0);
    uint64_t ids[3];
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    json_t *task = fix_wait_task(&f, ids[0], 5000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(task);
    json_decref(task);
    const float x[3] = {0.01f, 0.02f, 5.0f};
    for (int i = 0; i < 3; i++) {
        uint8_t *p = NULL;
        size_t len = 0;
        CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, ids[i], 10, x[i], &p, &len), 0);
        CU_ASSERT_EQUAL(fix_upload(&f, ids[i], 0, p, len, NULL), SRV_OK);
        free(p);
    }
    CU_ASSERT_TRUE(fix_wait_version(&f, 1, 20000));
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Stores client cid's update body for round 0 in dir's state.db over a
 * connection of the test's own, behind the engine's back: what a commit
 * leaves when it succeeded in the database but its answer was lost (the
 * coordinator then holds no report of it). */
static int store_behind(const char *dir, uint64_t cid, const uint8_t *body, size_t len,
                        uint64_t samples)
{
    uint8_t h[STRATA_SHA256_LEN];
    strata_sha256(body, len, h);
    sqlite3 *c = fix_state_db(dir);
    sqlite3_stmt *st = NULL;
    if (c == NULL)
        return -1;
    int rc = sqlite3_exec(c, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c,
                                "INSERT INTO updates(round, client_id, receipt, sha256, bytes,"
                                " samples, received_ms) VALUES(0, ?, 'lost-commit-receipt', ?, ?,"
                                " ?, 1)",
                                -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, (sqlite3_int64)cid);
        sqlite3_bind_blob(st, 2, h, (int)sizeof(h), SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)len);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)samples);
        rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c, "INSERT INTO payloads(seq, body) VALUES(last_insert_rowid(), ?)",
                                -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_blob(st, 1, body, (int)len, SQLITE_TRANSIENT);
        rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(c, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        fprintf(stderr, "store_behind: %s\n", sqlite3_errmsg(c));
    sqlite3_close(c);
    return rc == SQLITE_OK ? 0 : -1;
}

/* The store holds an update of a selected client that the round lacks; the
 * client then sends other content: it is answered 409 and the stored update
 * joins the round (the round follows the store, as a restart rebuilds it),
 * so the round closes when the other client reports, not at its deadline.
 * A resend of the stored bytes afterwards is a duplicate. */
static void test_conflict_after_lost_commit(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {"--min-clients", "2", "--round-deadline", "600", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 1, extra), 0);
    uint64_t ids[2];
    for (int i = 0; i < 2; i++)
        CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &ids[i], NULL), SRV_CREATED);
    json_t *task = fix_wait_task(&f, ids[0], 5000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(task);
    json_decref(task);

    uint8_t *a = NULL, *b = NULL, *p = NULL;
    size_t alen = 0, blen = 0, len = 0;
    int dup = -1;
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, ids[0], 10, 0.01f, &a, &alen), 0);
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, ids[0], 10, 0.03f, &b, &blen), 0);
    CU_ASSERT_EQUAL_FATAL(store_behind(dir, ids[0], a, alen, 10), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, ids[0], 0, b, blen, NULL), SRV_E_CONFLICT);
    CU_ASSERT_EQUAL_FATAL(fix_payload(0, 0, ids[1], 10, 0.02f, &p, &len), 0);
    CU_ASSERT_EQUAL(fix_upload(&f, ids[1], 0, p, len, &dup), SRV_OK);
    CU_ASSERT_EQUAL(dup, 0);
    /* Both selected clients reported: the close comes now, not at the
     * 600 s deadline. */
    CU_ASSERT_TRUE(fix_wait_version(&f, 1, 20000));
    /* The stored bytes, resent to the closed round: a duplicate. */
    CU_ASSERT_EQUAL(fix_upload(&f, ids[0], 0, a, alen, &dup), SRV_OK);
    CU_ASSERT_EQUAL(dup, 1);

    srv_result r = {0};
    srv_engine_metrics(f.e, &r);
    const char *m = (const char *)r.body;
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(m, "strata_updates_accepted_total 2\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(m, "strata_updates_rejected_total{reason=\"conflict\"} 1\n"));
    srv_result_cleanup(&r);
    free(a);
    free(b);
    free(p);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    CU_TestInfo tests[] = {{"typed outcomes", test_outcomes},
                           {"robust round", test_robust_round},
                           {"a conflict after a lost commit: the stored update joins the round",
                            test_conflict_after_lost_commit},
                           CU_TEST_INFO_NULL};
    CU_SuiteInfo suites[] = {{"server_upload", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
    return strata_test_run(suites);
}
