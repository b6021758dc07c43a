/* What only the PostgreSQL backend of the store has: its schema versions and
 * migrations. A schema made at an older version (the backend's own version 1
 * and the migrations up to the version under test, with rows in it as that
 * version stored them) is opened by this build: it is migrated to the
 * current version in one transaction and every row reads back through the
 * store's interface; a newer version, a schema that is not a store, and a
 * migration that fails are refused, and leave the schema as it was.
 *
 * Needs STRATA_TEST_PG_URL (the ctest entry runs it inside
 * tests/unit/with_postgres.sh, which starts a throw-away PostgreSQL); it
 * fails without one. The common behaviour of both backends is in
 * test_store_conformance.c. */
#include "store.h"
#include "store_backends.h"
#include "store_pg.h"
#include "test_util.h"

#include <CUnit/CUnit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const store_backend *PG;

/* Rows as schema version 1 stored them: two clients (one registered with a
 * registration id), round 0 open with both selected, one update with its
 * payload (the bytes 01 02 03) and a counter. */
static const char V1_ROWS[] =
    "INSERT INTO clients(token_hash, name, created_ms, last_seen_ms)"
    " VALUES(sha256('token-1'), 'alpha', 1000, 2000), (sha256('token-2'), '', 1100, 2100);"
    "INSERT INTO registrations VALUES('reg-1', 1);"
    "INSERT INTO rounds(round, model_version, state, opened_ms, deadline_ms, task)"
    " VALUES(0, 0, 0, 3000, 9000000000000, '{\"budget\":1}');"
    "INSERT INTO round_clients VALUES(0, 1), (0, 2);"
    "INSERT INTO updates(round, client_id, receipt, sha256, bytes, samples, received_ms)"
    " VALUES(0, 1, 'receipt-1', sha256('\\x010203'::bytea), 3, 42, 3500);"
    "INSERT INTO payloads(seq, body) SELECT seq, '\\x010203'::bytea FROM updates;"
    "INSERT INTO counters VALUES('uploads_total', 7);";

/* A fresh location holding the schema at `version` (1 .. current) with
 * V1_ROWS, and sql_after run last (may be NULL). */
static char *old_store(int version, const char *sql_after)
{
    strata_diag d;
    char *loc = NULL;
    int rc = store_pg_fresh_location(&loc, &d);
    if (rc != STRATA_OK) {
        fprintf(stderr, "fresh location: %s\n", strata_diag_msg(&d, rc));
        return NULL;
    }
    rc = store_pg_exec_at(loc, strata__pg_schema_v1, &d);
    for (int v = 1; v < version && rc == STRATA_OK; v++)
        rc = store_pg_exec_at(loc, strata__pg_migrations[v], &d);
    if (rc == STRATA_OK)
        rc = store_pg_exec_at(loc, V1_ROWS, &d);
    if (rc == STRATA_OK && sql_after != NULL)
        rc = store_pg_exec_at(loc, sql_after, &d);
    if (rc != STRATA_OK) {
        fprintf(stderr, "old store: %s\n", strata_diag_msg(&d, rc));
        PG->remove(loc);
        return NULL;
    }
    return loc;
}

/* A query's text answer at loc ("?" when the query failed). */
static const char *ask(const char *loc, const char *sql, char *buf, size_t n)
{
    strata_diag d;
    if (store_pg_query_at(loc, sql, buf, n, &d) != STRATA_OK)
        snprintf(buf, n, "?");
    return buf;
}

static int version_at(const char *loc)
{
    char buf[32];
    return atoi(ask(loc, "SELECT max(version) FROM schema_version", buf, sizeof(buf)));
}

/* The tables of loc's schema, as "a,b,c" (sorted). */
static const char *tables_at(const char *loc, char *buf, size_t n)
{
    return ask(loc,
               "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables"
               " WHERE schemaname = current_schema()",
               buf, n);
}

static int open_at(char *loc, strata_store **s, strata_diag *d)
{
    return PG->open(STORE_REOPEN, &loc, NULL, s, d);
}

/* Every row of V1_ROWS reads back through the interface of store.h; the
 * open round has `updates` updates by now. */
static void check_v1_rows(strata_store *s, uint64_t updates)
{
    strata_diag d;
    strata_store_client c;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_client_get(s, 1, &c, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_STRING_EQUAL(c.name, "alpha");
    CU_ASSERT_EQUAL(c.created_unix_ms, 1000);
    CU_ASSERT_EQUAL(c.last_seen_unix_ms, 2000);
    uint64_t id = 0, count = 0;
    CU_ASSERT_EQUAL(strata_store_registration_find(s, "reg-1", &id, &found, &d), STRATA_OK);
    CU_ASSERT(found == 1 && id == 1);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &count, &d), STRATA_OK);
    CU_ASSERT_EQUAL(count, 2);

    strata_store_round r;
    memset(&r, 0, sizeof(r));
    CU_ASSERT_EQUAL(strata_store_round_get(s, 0, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(found, 1);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_OPEN);
    CU_ASSERT_EQUAL(r.n_selected, 2);
    CU_ASSERT_EQUAL(r.n_updates, updates);
    CU_ASSERT(r.task_json != NULL && strstr(r.task_json, "budget") != NULL);
    strata_store_round_cleanup(&r);

    uint8_t *buf = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(strata_store_update_read(s, 0, 1, &buf, &len, &d), STRATA_OK);
    CU_ASSERT(len == 3 && buf != NULL && buf[0] == 1 && buf[1] == 2 && buf[2] == 3);
    free(buf);
    int64_t value = 0;
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "uploads_total", &value, &d), STRATA_OK);
    CU_ASSERT_EQUAL(value, 7);
}

/* What the migrations added works: the lease (version 2) and the files
 * (version 3); an update of the open round is stored after the old one. */
static void check_current_features(strata_store *s)
{
    strata_diag d;
    strata_store_leader l;
    int rc = strata_store_lead(s, "migrated", 5000, &l, &d);
    CU_ASSERT_EQUAL(rc, STRATA_OK);
    if (rc != STRATA_OK)
        fprintf(stderr, "lead: %s\n", strata_diag_msg(&d, rc));
    CU_ASSERT(l.epoch >= 1);
    int found = 1;
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_CHECKPOINT, 0, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    const uint8_t payload[] = {9, 8, 7, 6};
    strata_store_receipt receipt;
    strata_store_verdict verdict;
    CU_ASSERT_EQUAL(
        strata_store_update_put(s, 0, 2, payload, sizeof(payload), 5, &receipt, &verdict, &d),
        STRATA_OK);
    CU_ASSERT_EQUAL(verdict, STRATA_STORE_ACCEPTED);
    strata_store_update *u = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 0, &u, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 2);
    if (n == 2) {
        CU_ASSERT_STRING_EQUAL(u[0].receipt.id, "receipt-1");
        CU_ASSERT_EQUAL(u[0].receipt.samples, 42);
        CU_ASSERT_EQUAL(u[1].client_id, 2);
    }
    strata_store_update_list_free(u, n);
}

/* Each older version opens migrated, its rows intact, and reopens as it is. */
static void test_migrate_older(void)
{
    for (int version = 1; version < STRATA__PG_SCHEMA_VERSION; version++) {
        /* At version 2, a lease an earlier leader held (expired): the new
         * leader's epoch comes after it. */
        char *loc = old_store(version, version >= 2 ? "INSERT INTO leader VALUES(1, 5, 'old', 0,"
                                                      " false)"
                                                    : NULL);
        CU_ASSERT_PTR_NOT_NULL_FATAL(loc);
        CU_ASSERT_EQUAL(version_at(loc), version);
        strata_store *s = NULL;
        strata_diag d;
        int rc = open_at(loc, &s, &d);
        CU_ASSERT_EQUAL(rc, STRATA_OK);
        if (rc != STRATA_OK) {
            fprintf(stderr, "open at version %d: %s\n", version, strata_diag_msg(&d, rc));
            PG->remove(loc);
            continue;
        }
        CU_ASSERT_EQUAL(version_at(loc), STRATA__PG_SCHEMA_VERSION);
        check_v1_rows(s, 1);
        strata_store_leader before;
        CU_ASSERT_EQUAL(strata_store_leader_get(s, &before, &d), STRATA_OK);
        CU_ASSERT_EQUAL(before.epoch, version >= 2 ? 5 : 0);
        check_current_features(s);
        strata_store_leader after;
        CU_ASSERT_EQUAL(strata_store_leader_get(s, &after, &d), STRATA_OK);
        CU_ASSERT_EQUAL(after.epoch, before.epoch + 1);
        strata_store_close(s);

        char t1[512], t2[512];
        tables_at(loc, t1, sizeof(t1));
        s = NULL;
        CU_ASSERT_EQUAL(open_at(loc, &s, &d), STRATA_OK);
        CU_ASSERT_EQUAL(version_at(loc), STRATA__PG_SCHEMA_VERSION);
        CU_ASSERT_STRING_EQUAL(tables_at(loc, t2, sizeof(t2)), t1);
        if (s != NULL)
            check_v1_rows(s, 2);
        strata_store_close(s);
        PG->remove(loc);
    }
}

/* A version newer than this build's, or below 1, is refused unchanged. */
static void test_newer_refused(void)
{
    const char *bad[] = {"UPDATE schema_version SET version = 99",
                         "UPDATE schema_version SET version = 0"};
    for (size_t i = 0; i < 2; i++) {
        char *loc = old_store(STRATA__PG_SCHEMA_VERSION, bad[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(loc);
        char t1[512], t2[512], count[32];
        tables_at(loc, t1, sizeof(t1));
        int before = version_at(loc);
        strata_store *s = NULL;
        strata_diag d;
        CU_ASSERT_EQUAL(open_at(loc, &s, &d), STRATA_ESTATE);
        CU_ASSERT_PTR_NULL(s);
        CU_ASSERT(strstr(d.msg, i == 0 ? "newer" : "no valid store schema version") != NULL);
        if (i == 0)
            CU_ASSERT(strstr(d.msg, "99") != NULL);
        CU_ASSERT_EQUAL(version_at(loc), before);
        CU_ASSERT_STRING_EQUAL(tables_at(loc, t2, sizeof(t2)), t1);
        CU_ASSERT_STRING_EQUAL(ask(loc, "SELECT count(*) FROM updates", count, sizeof(count)), "1");
        strata_store_close(s);
        PG->remove(loc);
    }
}

/* A schema with tables but no schema_version is not a store: refused, and
 * nothing is created in it. */
static void test_not_a_store(void)
{
    strata_diag d;
    char *loc = NULL;
    CU_ASSERT_EQUAL_FATAL(store_pg_fresh_location(&loc, &d), STRATA_OK);
    CU_ASSERT_EQUAL(store_pg_exec_at(loc, "CREATE TABLE other(x int)", &d), STRATA_OK);
    strata_store *s = NULL;
    CU_ASSERT_EQUAL(open_at(loc, &s, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "not a Strata store") != NULL);
    char t[512];
    CU_ASSERT_STRING_EQUAL(tables_at(loc, t, sizeof(t)), "other");
    PG->remove(loc);
}

/* A migration that fails (here: version 3's table `files` already exists
 * in a version-1 schema) rolls every step back: the schema stays at
 * version 1 without version 2's table; once the obstacle is gone, the same
 * open migrates it. */
static void test_failed_migration_changes_nothing(void)
{
    char *loc = old_store(1, "CREATE TABLE files(x int)");
    CU_ASSERT_PTR_NOT_NULL_FATAL(loc);
    char t1[512], t2[512];
    tables_at(loc, t1, sizeof(t1));
    strata_store *s = NULL;
    strata_diag d;
    int rc = open_at(loc, &s, &d);
    CU_ASSERT(rc < 0);
    CU_ASSERT_PTR_NULL(s);
    CU_ASSERT(strstr(d.msg, "migrate the schema") != NULL);
    CU_ASSERT_EQUAL(version_at(loc), 1);
    CU_ASSERT_STRING_EQUAL(tables_at(loc, t2, sizeof(t2)), t1);
    CU_ASSERT(strstr(t2, "leader") == NULL);

    CU_ASSERT_EQUAL(store_pg_exec_at(loc, "DROP TABLE files", &d), STRATA_OK);
    CU_ASSERT_EQUAL(open_at(loc, &s, &d), STRATA_OK);
    CU_ASSERT_EQUAL(version_at(loc), STRATA__PG_SCHEMA_VERSION);
    if (s != NULL)
        check_v1_rows(s, 1);
    strata_store_close(s);
    PG->remove(loc);
}

static int suite_init(void)
{
    PG = store_backend_find("postgresql");
    if (PG == NULL || PG->unmet() != NULL) {
        fprintf(stderr, "test_store_pg: %s\n",
                PG != NULL ? PG->unmet() : "no PostgreSQL backend in the list");
        return 1; /* CUnit reports the suite's set-up as failed */
    }
    return 0;
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"every older schema version is migrated, its rows intact", test_migrate_older},
        {"a newer or invalid schema version is refused unchanged", test_newer_refused},
        {"a schema that is not a store is refused unchanged", test_not_a_store},
        {"a failed migration changes nothing", test_failed_migration_changes_nothing},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"store (postgresql)", suite_init, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
