/* The client registry through the engine's C API: registration, token
 * authentication, the admin token, the rate buckets. */
#include "server_fixture.h"

#include "store.h"

static void test_register_and_auth(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, NULL), 0);
    uint64_t a = 0, b = 0, x = 0;
    char auth_a[128], auth_b[128];
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &a, auth_a), SRV_CREATED);
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &b, auth_b), SRV_CREATED);
    CU_ASSERT(a >= 1 && b > a);
    CU_ASSERT_EQUAL(fix_register(&f, "wrong", &x, NULL), SRV_E_BAD_SECRET);

    srv_result r = {0};
    const char *bad = "{\"enrolment_secret\":1}";
    srv_engine_register(f.e, "127.0.0.1", (const uint8_t *)bad, strlen(bad), &r);
    CU_ASSERT_EQUAL(r.outcome, SRV_E_BAD_REQUEST);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.message, "enrolment_secret"));
    srv_result_cleanup(&r);

    uint64_t id = 99;
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, auth_a, &id, &r), STRATA_OK);
    CU_ASSERT_EQUAL(id, a);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, auth_b, &id, &r), STRATA_OK);
    CU_ASSERT_EQUAL(id, b);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, "Bearer 0123456789abcdef", &id, &r), STRATA_EPROTO);
    CU_ASSERT_EQUAL(id, 0);
    CU_ASSERT_EQUAL(r.outcome, SRV_E_UNAUTHORIZED);
    CU_ASSERT_STRING_EQUAL(r.message, "unknown token");
    srv_result_cleanup(&r);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, NULL, &id, &r), STRATA_EPROTO);
    CU_ASSERT_EQUAL(r.outcome, SRV_E_UNAUTHORIZED);
    srv_result_cleanup(&r);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, "Basic abc", &id, &r), STRATA_EPROTO);
    srv_result_cleanup(&r);

    /* A client's token is not the admin's. */
    CU_ASSERT_EQUAL(srv_engine_admin_auth(f.e, auth_a, &r), STRATA_EPROTO);
    CU_ASSERT_EQUAL(r.outcome, SRV_E_FORBIDDEN);
    srv_result_cleanup(&r);
    char path[4200], tok[300], admin[320];
    snprintf(path, sizeof(path), "%s/admin.token", dir);
    FILE *fp = fopen(path, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(fp);
    CU_ASSERT_PTR_NOT_NULL(fgets(tok, sizeof(tok), fp));
    fclose(fp);
    tok[strcspn(tok, "\n")] = '\0';
    snprintf(admin, sizeof(admin), "Bearer %s", tok);
    CU_ASSERT_EQUAL(srv_engine_admin_auth(f.e, admin, &r), STRATA_OK);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, admin, &id, &r), STRATA_EPROTO);
    srv_result_cleanup(&r);
    fix_close(&f);

    /* Tokens survive a restart (the index is rebuilt from the store). */
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, NULL), 0);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, auth_b, &id, &r), STRATA_OK);
    CU_ASSERT_EQUAL(id, b);
    CU_ASSERT_EQUAL(srv_engine_admin_auth(f.e, admin, &r), STRATA_OK);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Registers with registration id reg; the answer's outcome, client id and
 * data share (-1 when the answer has none). */
static srv_outcome register_share(fix_engine *f, const char *reg, uint64_t *id, long *share)
{
    char body[256];
    snprintf(body, sizeof(body), "{\"enrolment_secret\":\"%s\",\"registration_id\":\"%s\"}",
             FIX_SECRET, reg);
    srv_result r = {0};
    srv_engine_register(f->e, "127.0.0.1", (const uint8_t *)body, strlen(body), &r);
    srv_outcome o = r.outcome;
    json_t *j = fix_json(&r);
    *id = (uint64_t)json_integer_value(json_object_get(j, "client_id"));
    json_t *sh = json_object_get(j, "data_share");
    *share = json_is_integer(sh) ? (long)json_integer_value(sh) : -1;
    if (sh != NULL)
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "data_shares")), 3);
    json_decref(j);
    srv_result_cleanup(&r);
    return o;
}

/* --data-shares 3: the first three clients get shares 0, 1, 2 in the order
 * they registered; a repeated registration keeps its share, also after a
 * restart; a fourth client is refused and nothing is stored. */
static void test_data_shares(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {"--data-shares", "3", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, extra), 0);
    static const char *const regs[] = {"replica-aaaaaaaaaaaa", "replica-bbbbbbbbbbbb",
                                       "replica-cccccccccccc"};
    uint64_t ids[3] = {0}, id = 0;
    long share = -2;
    for (long i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(register_share(&f, regs[i], &ids[i], &share), SRV_CREATED);
        CU_ASSERT_EQUAL(share, i);
    }
    CU_ASSERT_EQUAL(register_share(&f, "replica-dddddddddddd", &id, &share), SRV_E_NO_DATA_SHARE);
    CU_ASSERT_EQUAL(id, 0);
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &id, NULL), SRV_E_NO_DATA_SHARE);
    CU_ASSERT_EQUAL(register_share(&f, regs[1], &id, &share), SRV_OK);
    CU_ASSERT_EQUAL(id, ids[1]);
    CU_ASSERT_EQUAL(share, 1);
    srv_result r = {0};
    srv_engine_metrics(f.e, &r);
    CU_ASSERT_PTR_NOT_NULL(strstr((char *)r.body, "strata_registered_clients 3\n"));
    srv_result_cleanup(&r);
    fix_close(&f);
    /* After a restart the places are the same, and the refusal stands. */
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, extra), 0);
    CU_ASSERT_EQUAL(register_share(&f, regs[2], &id, &share), SRV_OK);
    CU_ASSERT_EQUAL(id, ids[2]);
    CU_ASSERT_EQUAL(share, 2);
    CU_ASSERT_EQUAL(register_share(&f, "replica-eeeeeeeeeeee", &id, &share), SRV_E_NO_DATA_SHARE);
    fix_close(&f);
    /* Without --data-shares the answer has no share. */
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, NULL), 0);
    CU_ASSERT_EQUAL(register_share(&f, regs[0], &id, &share), SRV_OK);
    CU_ASSERT_EQUAL(id, ids[0]);
    CU_ASSERT_EQUAL(share, -1);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

static void test_rate_limit_and_capacity(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {"--upload-rate", "3", "--max-clients", "2", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, extra), 0);
    uint64_t a = 0, b = 0, c = 0;
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &a, NULL), SRV_CREATED);
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &b, NULL), SRV_CREATED);
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &c, NULL), SRV_E_TOO_MANY_CLIENTS);
    srv_result r = {0};
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(srv_engine_rate_take(f.e, a, &r), STRATA_OK);
    CU_ASSERT_EQUAL(srv_engine_rate_take(f.e, a, &r), STRATA_ESTATE);
    CU_ASSERT_EQUAL(r.outcome, SRV_E_RATE_LIMITED);
    CU_ASSERT(r.retry_after >= 1 && r.retry_after <= 20);
    srv_result_cleanup(&r);
    /* Buckets are per client. */
    CU_ASSERT_EQUAL(srv_engine_rate_take(f.e, b, &r), STRATA_OK);
    srv_engine_metrics(f.e, &r);
    CU_ASSERT_EQUAL(r.media, SRV_MEDIA_EXPOSITION);
    CU_ASSERT_PTR_NOT_NULL(
        strstr((char *)r.body, "strata_updates_rejected_total{reason=\"rate_limited\"} 1\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr((char *)r.body, "strata_registered_clients 2\n"));
    srv_result_cleanup(&r);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Registers from address peer with secret; returns the outcome and the
 * result's Retry-After in *retry (may be NULL). */
static srv_outcome register_from(fix_engine *f, const char *peer, const char *secret, int *retry)
{
    char body[256];
    snprintf(body, sizeof(body), "{\"enrolment_secret\":\"%s\"}", secret);
    srv_result r = {0};
    srv_engine_register(f->e, peer, (const uint8_t *)body, strlen(body), &r);
    srv_outcome o = r.outcome;
    if (retry != NULL)
        *retry = r.retry_after;
    srv_result_cleanup(&r);
    return o;
}

/* Wrong enrolment secrets are limited per address: after enrolment_rate
 * of them the address waits (even with the right secret); other addresses
 * are not affected. */
static void test_enrolment_limit(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    const char *extra[] = {"--enrolment-rate", "3", NULL};
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, extra), 0);
    int retry = 0;
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(register_from(&f, "10.0.0.1", "guess", NULL), SRV_E_BAD_SECRET);
    CU_ASSERT_EQUAL(register_from(&f, "10.0.0.1", "guess", &retry), SRV_E_RATE_LIMITED);
    CU_ASSERT(retry >= 1 && retry <= 20);
    CU_ASSERT_EQUAL(register_from(&f, "10.0.0.1", FIX_SECRET, NULL), SRV_E_RATE_LIMITED);
    CU_ASSERT_EQUAL(register_from(&f, "fe80::1", FIX_SECRET, NULL), SRV_CREATED);
    CU_ASSERT_EQUAL(register_from(&f, NULL, "guess", NULL), SRV_E_BAD_SECRET);
    /* Many addresses: the table reuses old entries, every answer stays
     * defined. */
    char addr[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(addr, sizeof(addr), "10.1.%d.%d", i / 256, i % 256);
        CU_ASSERT_EQUAL(register_from(&f, addr, "guess", NULL), SRV_E_BAD_SECRET);
    }
    srv_result r = {0};
    srv_engine_status(f.e, &r);
    json_t *j = fix_json(&r);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "registered_clients")), 1);
    json_decref(j);
    srv_result_cleanup(&r);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* Registers with a registration id; writes the id and "Bearer TOKEN". */
static srv_outcome register_with_id(fix_engine *f, const char *reg, uint64_t *id, char auth[128])
{
    char body[256];
    snprintf(body, sizeof(body), "{\"enrolment_secret\":\"%s\",\"registration_id\":\"%s\"}",
             FIX_SECRET, reg);
    srv_result r = {0};
    srv_engine_register(f->e, "127.0.0.1", (const uint8_t *)body, strlen(body), &r);
    srv_outcome o = r.outcome;
    json_t *j = fix_json(&r);
    *id = (uint64_t)json_integer_value(json_object_get(j, "client_id"));
    const char *tok = json_string_value(json_object_get(j, "token"));
    snprintf(auth, 128, "Bearer %s", tok != NULL ? tok : "");
    json_decref(j);
    srv_result_cleanup(&r);
    return o;
}

/* A repeated registration (its answer was lost) gets the same client and a
 * new token; the old token stops working; no second client appears, also
 * after a restart. */
static void test_idempotent_registration(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, NULL), 0);
    uint64_t a = 0, b = 0, c = 0, id = 0;
    char auth_a[128], auth_b[128], auth_c[128];
    CU_ASSERT_EQUAL(register_with_id(&f, "0123456789abcdef", &a, auth_a), SRV_CREATED);
    CU_ASSERT_EQUAL(register_with_id(&f, "0123456789abcdef", &b, auth_b), SRV_OK);
    CU_ASSERT_EQUAL(b, a);
    CU_ASSERT_STRING_NOT_EQUAL(auth_a, auth_b);
    srv_result r = {0};
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, auth_a, &id, &r), STRATA_EPROTO);
    srv_result_cleanup(&r);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, auth_b, &id, &r), STRATA_OK);
    CU_ASSERT_EQUAL(id, a);
    CU_ASSERT_EQUAL(register_with_id(&f, "another-registration", &c, auth_c), SRV_CREATED);
    CU_ASSERT(c > a);
    fix_close(&f);
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, NULL), 0);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, auth_b, &id, &r), STRATA_OK);
    CU_ASSERT_EQUAL(id, a);
    CU_ASSERT_EQUAL(srv_engine_auth(f.e, auth_a, &id, &r), STRATA_EPROTO);
    srv_result_cleanup(&r);
    srv_engine_status(f.e, &r);
    json_t *j = fix_json(&r);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "registered_clients")), 2);
    json_decref(j);
    srv_result_cleanup(&r);
    fix_close(&f);
    strata_test_rmtree(dir);
    free(dir);
}

/* A task request marks the client as seen; the time reaches the store when
 * a round opens or the engine closes, and only for clients that asked. */
static void test_last_seen(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    fix_engine f;
    CU_ASSERT_EQUAL_FATAL(fix_open(&f, dir, 0, NULL), 0);
    uint64_t a = 0, b = 0;
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &a, NULL), SRV_CREATED);
    CU_ASSERT_EQUAL(fix_register(&f, FIX_SECRET, &b, NULL), SRV_CREATED);
    fix_sleep_ms(30);
    srv_result r = {0};
    int parked = 1;
    CU_ASSERT_EQUAL(srv_engine_task(f.e, a, 0, NULL, &parked, &r), STRATA_OK);
    CU_ASSERT_EQUAL(r.outcome, SRV_NO_CONTENT);
    CU_ASSERT_EQUAL(parked, 0);
    srv_result_cleanup(&r);
    fix_close(&f);

    strata_store *s = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_store_open(dir, &s, NULL), STRATA_OK);
    strata_store_client ca, cb;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_client_get(s, a, &ca, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_client_get(s, b, &cb, &found, NULL), STRATA_OK);
    CU_ASSERT(ca.last_seen_unix_ms >= ca.created_unix_ms + 30);
    CU_ASSERT_EQUAL(cb.last_seen_unix_ms, cb.created_unix_ms);
    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    CU_TestInfo tests[] = {{"register and authenticate", test_register_and_auth},
                           {"rate limit and capacity", test_rate_limit_and_capacity},
                           {"last-seen times", test_last_seen},
                           {"enrolment limit per address", test_enrolment_limit},
                           {"idempotent registration", test_idempotent_registration},
                           {"data shares", test_data_shares},
                           CU_TEST_INFO_NULL};
    CU_SuiteInfo suites[] = {{"server_registry", NULL, NULL, NULL, NULL, tests},
                             CU_SUITE_INFO_NULL};
    return strata_test_run(suites);
}
