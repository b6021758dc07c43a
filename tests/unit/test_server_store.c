#include "store.h"
#include "strata/rng.h"
#include "test_util.h"

#include <sqlite3.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------ */

static void token_hash(int i, uint8_t h[STRATA_STORE_HASH_LEN])
{
    char tok[64];
    snprintf(tok, sizeof(tok), "token-%d", i);
    strata_sha256(tok, strlen(tok), h);
}

static strata_store *open_store(const char *dir)
{
    strata_store *s = NULL;
    strata_diag d;
    int rc = strata_store_open(dir, &s, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "open %s: %s\n", dir, strata_diag_msg(&d, rc));
    return s;
}

static int path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Reads a whole small file into buf; returns its length or -1. */
static long read_small(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return (long)n;
}

static int write_small(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* Number of directory entries other than . and .. */
static int count_entries(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void hex(const uint8_t *h, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", h[i]);
}

/* Registers n clients (token-1 .. token-n); ids[i] receives client i+1's id. */
static void add_clients(strata_store *s, int n, uint64_t *ids)
{
    for (int i = 0; i < n; i++) {
        uint8_t h[STRATA_STORE_HASH_LEN];
        token_hash(i + 1, h);
        CU_ASSERT_EQUAL_FATAL(strata_store_client_add(s, h, NULL, NULL, &ids[i], NULL, NULL),
                              STRATA_OK);
    }
}

/* ---- 1. open, reopen, lock, schema version ------------------------------ */

/* The acknowledged updates of a round, counted from the list. */
static int update_count(strata_store *s, uint32_t round, uint64_t *count, strata_diag *d)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(s, round, &ups, &n, d);
    strata_store_update_list_free(ups, n);
    *count = rc == 0 ? n : 0;
    return rc;
}

/* The payload file of an update, as the store names it. */
static int update_path(strata_store *s, uint32_t round, uint64_t id, char *buf, size_t len,
                       strata_diag *d)
{
    return strata_store_path(strata_store_dir(s), STRATA_STORE_FILE_UPDATE, round, id, buf, len, d);
}

static void test_open_reopen_schema(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char path[1200], sub[1024];
    snprintf(sub, sizeof(sub), "%s/state", dir);
    strata_diag d;

    strata_store *s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_STRING_EQUAL(strata_store_dir(s), sub);
    snprintf(path, sizeof(path), "%s/state.db", sub);
    CU_ASSERT(path_exists(path));
    snprintf(path, sizeof(path), "%s/updates", sub);
    CU_ASSERT(path_exists(path));
    snprintf(path, sizeof(path), "%s/checkpoints", sub);
    CU_ASSERT(path_exists(path));

    uint8_t h[32];
    uint64_t id = 0;
    token_hash(1, h);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h, "alpha", NULL, &id, NULL, NULL), STRATA_OK);

    /* The directory is owned by one store at a time. */
    strata_store *second = NULL;
    CU_ASSERT_EQUAL(strata_store_open(sub, &second, &d), STRATA_ESTATE);
    CU_ASSERT_PTR_NULL(second);
    CU_ASSERT(strstr(d.msg, "in use") != NULL);

    /* A secondary connection sees the same data. */
    CU_ASSERT_EQUAL_FATAL(strata_store_open_secondary(s, &second, &d), STRATA_OK);
    strata_store_client c;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_client_get(second, id, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT(memcmp(c.token_hash, h, 32) == 0);
    strata_store_close(second);
    strata_store_close(s);

    /* Data survives close and reopen. */
    s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT(memcmp(c.token_hash, h, 32) == 0);
    CU_ASSERT_STRING_EQUAL(c.name, "alpha");
    strata_store_close(s);

    /* A database of schema version 1 (no registrations) is migrated on
     * open: its clients stay, registration ids work. */
    sqlite3 *db = NULL;
    snprintf(path, sizeof(path), "%s/state.db", sub);
    CU_ASSERT_EQUAL_FATAL(sqlite3_open(path, &db), SQLITE_OK);
    CU_ASSERT_EQUAL(sqlite3_exec(db,
                                 "DROP TABLE registrations; UPDATE schema_version SET version = 1",
                                 NULL, NULL, NULL),
                    SQLITE_OK);
    sqlite3_close(db);
    s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    uint8_t h2[32];
    uint64_t id2 = 0;
    int existed = -1;
    token_hash(2, h2);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h2, NULL, "reg-0123456789ab", &id2, &existed, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(existed, 0);
    strata_store_close(s);
    CU_ASSERT_EQUAL_FATAL(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *vst = NULL;
    CU_ASSERT_EQUAL_FATAL(
        sqlite3_prepare_v2(db, "SELECT max(version) FROM schema_version", -1, &vst, NULL),
        SQLITE_OK);
    CU_ASSERT_EQUAL(sqlite3_step(vst), SQLITE_ROW);
    CU_ASSERT_EQUAL(sqlite3_column_int(vst, 0), STRATA_STORE_SCHEMA_VERSION);
    sqlite3_finalize(vst);
    sqlite3_close(db);

    /* A database written by a newer build is refused with a clear error. */
    CU_ASSERT_EQUAL_FATAL(sqlite3_open(path, &db), SQLITE_OK);
    CU_ASSERT_EQUAL(sqlite3_exec(db, "UPDATE schema_version SET version = 99", NULL, NULL, NULL),
                    SQLITE_OK);
    sqlite3_close(db);
    s = NULL;
    CU_ASSERT_EQUAL(strata_store_open(sub, &s, &d), STRATA_ESTATE);
    CU_ASSERT_PTR_NULL(s);
    CU_ASSERT(strstr(d.msg, "99") != NULL && strstr(d.msg, "newer") != NULL);
    /* The refusal released the lock and changed nothing: it still refuses. */
    CU_ASSERT_EQUAL(strata_store_open(sub, &s, &d), STRATA_ESTATE);

    /* A foreign SQLite database is not taken over. */
    snprintf(sub, sizeof(sub), "%s/foreign", dir);
    mkdir(sub, 0700);
    snprintf(path, sizeof(path), "%s/state.db", sub);
    CU_ASSERT_EQUAL_FATAL(sqlite3_open(path, &db), SQLITE_OK);
    CU_ASSERT_EQUAL(sqlite3_exec(db, "CREATE TABLE t(x)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    CU_ASSERT_EQUAL(strata_store_open(sub, &s, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "not a Strata") != NULL);

    /* Bad arguments. */
    CU_ASSERT_EQUAL(strata_store_open(NULL, &s, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_open("", &s, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_open(sub, NULL, &d), STRATA_EINVAL);
    strata_store_close(NULL);

    strata_test_rmtree(dir);
    free(dir);
}

/* ---- 2. clients --------------------------------------------------------- */

static void test_clients(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_diag d;
    uint8_t h1[32], h2[32], h3[32];
    token_hash(1, h1);
    token_hash(2, h2);
    token_hash(3, h3);
    uint64_t id1 = 0, id2 = 0, id = 7, n = 0;

    CU_ASSERT_EQUAL(strata_store_client_add(s, h1, "edge-1", NULL, &id1, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h2, NULL, NULL, &id2, NULL, &d), STRATA_OK);
    CU_ASSERT(id1 >= 1 && id2 > id1);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 2);

    strata_store_client c;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_client_get(s, id2, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(c.id, id2);
    CU_ASSERT_STRING_EQUAL(c.name, "");
    CU_ASSERT(memcmp(c.token_hash, h2, 32) == 0);
    CU_ASSERT(c.created_unix_ms > 0 && c.last_seen_unix_ms == c.created_unix_ms);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id1, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_STRING_EQUAL(c.name, "edge-1");
    CU_ASSERT_EQUAL(strata_store_client_get(s, 999, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);

    /* A token hash registers once. */
    CU_ASSERT_EQUAL(strata_store_client_add(s, h1, "again", NULL, &id, NULL, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(id, 0);
    CU_ASSERT(strstr(d.msg, "token hash") != NULL);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 2);

    /* A registration id: the first use stores a new client; a repeat (with
     * a new token hash) gets the same client, whose old hash is gone. */
    uint8_t h4[32], h5[32];
    uint64_t r1 = 0, r2 = 0;
    int existed = -1;
    token_hash(4, h4);
    token_hash(5, h5);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h4, "r", "reg-aaaaaaaaaaaa", &r1, &existed, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(existed, 0);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h5, "r", "reg-aaaaaaaaaaaa", &r2, &existed, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(existed, 1);
    CU_ASSERT_EQUAL(r2, r1);
    CU_ASSERT_EQUAL(strata_store_client_get(s, r1, &c, &found, NULL), STRATA_OK);
    CU_ASSERT(memcmp(c.token_hash, h5, 32) == 0);
    /* A token hash in use is refused even with a new registration id. */
    CU_ASSERT_EQUAL(strata_store_client_add(s, h5, "r", "reg-bbbbbbbbbbbb", &r2, &existed, &d),
                    STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, "r", "", &r2, &existed, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 3);

    /* Last-seen times are set in one batch; unknown ids are skipped. */
    uint64_t seen_ids[] = {id1, 999, id2};
    int64_t seen_ms[] = {c.created_unix_ms + 5000, 1, c.created_unix_ms + 7000};
    CU_ASSERT_EQUAL(strata_store_clients_seen(s, seen_ids, seen_ms, 3, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id1, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(c.last_seen_unix_ms, seen_ms[0]);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id2, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(c.last_seen_unix_ms, seen_ms[2]);
    CU_ASSERT_EQUAL(strata_store_client_get(s, 999, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(strata_store_clients_seen(s, NULL, seen_ms, 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_clients_seen(s, NULL, NULL, 0, &d), STRATA_OK);

    /* Bad arguments. */
    char longname[STRATA_STORE_NAME_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, longname, NULL, &id, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, "a\nb", NULL, &id, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(s, NULL, NULL, NULL, &id, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, NULL, NULL, NULL, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_count(s, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 3);

    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- 3. rounds ---------------------------------------------------------- */

static void test_rounds(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_diag d;
    uint64_t ids[3];
    add_clients(s, 3, ids);

    uint32_t last = 9;
    int found = 1;
    CU_ASSERT_EQUAL(strata_store_last_round(s, &last, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);

    uint64_t sel[2] = {ids[2], ids[0]};
    CU_ASSERT_EQUAL(strata_store_round_open(s, 1, 5, sel, 2, 123456789, "{\"density\":0.01}", &d),
                    STRATA_OK);
    char path[1024];
    snprintf(path, sizeof(path), "%s/updates/1", dir);
    CU_ASSERT(path_exists(path));

    strata_store_round r;
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(found, 1);
    CU_ASSERT_EQUAL(r.round, 1);
    CU_ASSERT_EQUAL(r.model_version, 5);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_OPEN);
    CU_ASSERT_EQUAL(r.deadline_unix_ms, 123456789);
    CU_ASSERT(r.opened_unix_ms > 0);
    CU_ASSERT_EQUAL(r.closed_unix_ms, 0);
    CU_ASSERT_EQUAL_FATAL(r.n_selected, 2);
    CU_ASSERT_EQUAL(r.selected[0], ids[0]); /* ascending */
    CU_ASSERT_EQUAL(r.selected[1], ids[2]);
    CU_ASSERT_STRING_EQUAL(r.task_json, "{\"density\":0.01}");
    CU_ASSERT_PTR_NULL(r.summary_json);
    CU_ASSERT_EQUAL(r.n_updates, 0);
    strata_store_round_cleanup(&r);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 2, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);

    /* The same round again, or another while one is open: wrong state. */
    CU_ASSERT_EQUAL(strata_store_round_open(s, 1, 5, sel, 2, 0, NULL, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, sel, 2, 0, NULL, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "still open") != NULL);

    /* Closing: invalid JSON changes nothing; then close, close again. */
    CU_ASSERT_EQUAL(strata_store_round_close(s, 1, "{not json", &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_OPEN);
    strata_store_round_cleanup(&r);
    const char *summary = "{\"accuracy\":0.8,\"participants\":2}";
    CU_ASSERT_EQUAL(strata_store_round_close(s, 1, summary, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 1, summary, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "already closed") != NULL);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 7, NULL, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "no such round") != NULL);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_CLOSED);
    CU_ASSERT_STRING_EQUAL(r.summary_json, summary);
    CU_ASSERT(r.closed_unix_ms >= r.opened_unix_ms);
    strata_store_round_cleanup(&r);

    /* Selection errors. */
    uint64_t unknown[2] = {ids[0], 999};
    uint64_t twice[2] = {ids[1], ids[1]};
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, unknown, 2, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT(strstr(d.msg, "not registered") != NULL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, twice, 2, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, sel, 0, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, sel, 2, 0, "[1,", &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, UINT64_MAX, sel, 2, 0, NULL, &d), STRATA_EINVAL);
    /* None of them left a round behind. */
    CU_ASSERT_EQUAL(strata_store_round_get(s, 2, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);

    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, ids, 3, 0, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 2, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 4, 7, ids, 1, 0, NULL, &d), STRATA_OK);
    /* Rounds only move forward. */
    CU_ASSERT_EQUAL(strata_store_round_close(s, 4, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 3, 7, ids, 1, 0, NULL, &d), STRATA_ESTATE);

    CU_ASSERT_EQUAL(strata_store_last_round(s, &last, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(last, 4);

    strata_store_round *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_round_list(s, 0, 10, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 3);
    CU_ASSERT_EQUAL(list[0].round, 1);
    CU_ASSERT_EQUAL(list[1].round, 2);
    CU_ASSERT_EQUAL(list[2].round, 4);
    CU_ASSERT_EQUAL(list[0].n_selected, 2);
    CU_ASSERT_EQUAL(list[1].n_selected, 3);
    CU_ASSERT_PTR_NULL(list[0].selected);
    CU_ASSERT_STRING_EQUAL(list[0].summary_json, summary);
    strata_store_round_list_free(list, n);
    /* Paging. */
    CU_ASSERT_EQUAL(strata_store_round_list(s, 0, 2, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 2);
    strata_store_round_list_free(list, n);
    CU_ASSERT_EQUAL(strata_store_round_list(s, 3, 2, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 1);
    CU_ASSERT_EQUAL(list[0].round, 4);
    strata_store_round_list_free(list, n);
    CU_ASSERT_EQUAL(strata_store_round_list(s, 5, 2, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT_PTR_NULL(list);
    CU_ASSERT_EQUAL(strata_store_round_list(s, 0, 0, &list, &n, &d), STRATA_EINVAL);

    /* Rounds survive reopening. */
    strata_store_close(s);
    s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_CLOSED);
    CU_ASSERT_EQUAL(r.n_selected, 2);
    strata_store_round_cleanup(&r);

    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- 4. update put ------------------------------------------------------ */

static void test_update_put(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_diag d;
    uint64_t ids[3];
    add_clients(s, 3, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 2, 0, NULL, &d), STRATA_OK);

    strata_store_receipt rc1, rc2;
    strata_store_verdict v = 99;
    const uint8_t abc[3] = {'a', 'b', 'c'};
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[0], abc, 3, 10, &rc1, &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_ACCEPTED);
    CU_ASSERT_EQUAL(rc1.duplicate, 0);
    CU_ASSERT_EQUAL(rc1.bytes, 3);
    CU_ASSERT_EQUAL(rc1.samples, 10);
    CU_ASSERT(rc1.received_unix_ms > 0);
    CU_ASSERT_EQUAL(strlen(rc1.id), STRATA_STORE_RECEIPT_LEN);
    CU_ASSERT(strspn(rc1.id, "0123456789abcdef") == STRATA_STORE_RECEIPT_LEN);
    char shahex[65];
    hex(rc1.sha256, 32, shahex);
    CU_ASSERT_STRING_EQUAL(shahex,
                           "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

    /* The file holds the payload; the row exists. */
    char path[1024];
    uint8_t buf[64];
    CU_ASSERT_EQUAL(update_path(s, 1, ids[0], path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT_EQUAL(read_small(path, buf, sizeof(buf)), 3);
    CU_ASSERT(memcmp(buf, abc, 3) == 0);
    uint64_t count = 0;
    CU_ASSERT_EQUAL(update_count(s, 1, &count, &d), STRATA_OK);
    CU_ASSERT_EQUAL(count, 1);
    strata_store_update *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 1);
    CU_ASSERT_EQUAL(list[0].client_id, ids[0]);
    CU_ASSERT_EQUAL(list[0].round, 1);
    CU_ASSERT_STRING_EQUAL(list[0].receipt.id, rc1.id);
    CU_ASSERT_STRING_EQUAL(list[0].path, path);
    CU_ASSERT_EQUAL(list[0].receipt.samples, 10);
    strata_store_update_list_free(list, n);

    /* A repeat with other bytes is a conflict: refused, the stored update
     * kept. */
    const uint8_t other[5] = {1, 2, 3, 4, 5};
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[0], other, 5, 99, &rc2, &v, &d),
                    STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_CONFLICT);
    CU_ASSERT_EQUAL(rc2.id[0], '\0');
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "other content"));
    /* A byte-identical repeat (even with another sample count) returns the
     * original receipt and changes nothing. */
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[0], abc, 3, 99, &rc2, &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_DUPLICATE);
    CU_ASSERT_EQUAL(rc2.duplicate, 1);
    CU_ASSERT_STRING_EQUAL(rc2.id, rc1.id);
    CU_ASSERT(memcmp(rc2.sha256, rc1.sha256, 32) == 0);
    CU_ASSERT_EQUAL(rc2.bytes, 3);
    CU_ASSERT_EQUAL(rc2.samples, 10);
    CU_ASSERT_EQUAL(rc2.received_unix_ms, rc1.received_unix_ms);
    CU_ASSERT_EQUAL(read_small(path, buf, sizeof(buf)), 3);
    CU_ASSERT(memcmp(buf, abc, 3) == 0);
    CU_ASSERT_EQUAL(update_count(s, 1, &count, &d), STRATA_OK);
    CU_ASSERT_EQUAL(count, 1);

    /* Not selected: refused with its own verdict, no file. */
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[2], abc, 3, 10, &rc2, &v, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_NOT_SELECTED);
    CU_ASSERT(strstr(d.msg, "not selected") != NULL);
    CU_ASSERT_EQUAL(update_path(s, 1, ids[2], path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT(!path_exists(path));
    /* Unknown round. */
    CU_ASSERT_EQUAL(strata_store_update_put(s, 9, ids[0], abc, 3, 10, &rc2, &v, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_UNKNOWN_ROUND);
    /* Bad arguments are EINVAL with verdict 0. */
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[1], abc, 0, 10, &rc2, &v, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(v, STRATA_STORE_ACCEPTED);
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[1], abc, 3, 0, &rc2, &v, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[1], NULL, 3, 1, &rc2, &v, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[1], abc, 3, 1, NULL, &v, &d), STRATA_EINVAL);

    /* Closed round: refused, no file; the earlier upload is still a
     * duplicate (a retry whose answer was lost gets its receipt). */
    CU_ASSERT_EQUAL(strata_store_round_close(s, 1, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[1], abc, 3, 10, &rc2, NULL, &d),
                    STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[1], abc, 3, 10, &rc2, &v, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_ROUND_CLOSED);
    CU_ASSERT_EQUAL(update_path(s, 1, ids[1], path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT(!path_exists(path));
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[0], abc, 3, 10, &rc2, &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_DUPLICATE);
    CU_ASSERT_STRING_EQUAL(rc2.id, rc1.id);

    /* update_read checks the bytes against the acknowledged hash. */
    uint8_t *data = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[0], &data, &len, &d), STRATA_OK);
    CU_ASSERT_EQUAL(len, 3);
    CU_ASSERT(data != NULL && memcmp(data, abc, 3) == 0);
    free(data);
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[1], &data, &len, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(update_path(s, 1, ids[0], path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT_EQUAL(write_small(path, "abd", 3), 0);
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[0], &data, &len, &d), STRATA_EIO);
    CU_ASSERT(strstr(d.msg, "SHA-256") != NULL);
    CU_ASSERT_PTR_NULL(data);
    char small[8];
    CU_ASSERT_EQUAL(update_path(s, 1, ids[0], small, sizeof(small), &d), STRATA_ETOOBIG);

    /* Updates survive reopening, in arrival order. */
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 1, ids, 3, 0, NULL, &d), STRATA_OK);
    for (int i = 2; i >= 0; i--) {
        uint8_t p[4] = {(uint8_t)i, 7, 7, 7};
        CU_ASSERT_EQUAL(strata_store_update_put(s, 2, ids[i], p, 4, (uint64_t)i + 1, &rc2, &v, &d),
                        STRATA_OK);
    }
    strata_store_close(s);
    s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_recovered_files(s), 0);
    CU_ASSERT_EQUAL(strata_store_update_list(s, 2, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 3);
    for (size_t i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(list[i].client_id, ids[2 - i]);
        CU_ASSERT_EQUAL(list[i].receipt.samples, 3 - i);
    }
    strata_store_update_list_free(list, n);
    CU_ASSERT_EQUAL(strata_store_update_list(s, 77, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 0);

    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- 5a. recovery of files without a committed row ---------------------- */

static void test_recovery_orphans(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_diag d;
    uint64_t ids[2];
    add_clients(s, 2, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 2, 0, NULL, &d), STRATA_OK);
    strata_store_receipt r;
    CU_ASSERT_EQUAL(
        strata_store_update_put(s, 1, ids[0], (const uint8_t *)"kept", 4, 1, &r, NULL, &d),
        STRATA_OK);
    strata_store_close(s);

    /* What a crash between publishing the file and committing its row
     * leaves behind, plus an interrupted temporary and a foreign file. */
    char orphan[1024], tmp[1024], ckpt_tmp[1024], foreign[1024], kept[1024];
    snprintf(orphan, sizeof(orphan), "%s/updates/1/%" PRIu64 ".bin", dir, ids[1]);
    snprintf(tmp, sizeof(tmp), "%s/updates/1/%" PRIu64 ".bin.tmp.Ab12Cd", dir, ids[1]);
    snprintf(ckpt_tmp, sizeof(ckpt_tmp), "%s/checkpoints/model-3.safetensors.tmp.Zz99Yy", dir);
    snprintf(foreign, sizeof(foreign), "%s/updates/1/README", dir);
    snprintf(kept, sizeof(kept), "%s/updates/1/%" PRIu64 ".bin", dir, ids[0]);
    CU_ASSERT_EQUAL(write_small(orphan, "orphan", 6), 0);
    CU_ASSERT_EQUAL(write_small(tmp, "half", 4), 0);
    CU_ASSERT_EQUAL(write_small(ckpt_tmp, "ck", 2), 0);
    CU_ASSERT_EQUAL(write_small(foreign, "x", 1), 0);

    s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_recovered_files(s), 3);
    CU_ASSERT(!path_exists(orphan));
    CU_ASSERT(!path_exists(tmp));
    CU_ASSERT(!path_exists(ckpt_tmp));
    CU_ASSERT(path_exists(foreign));
    CU_ASSERT(path_exists(kept));
    strata_store_update *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 1);
    CU_ASSERT_EQUAL(list[0].client_id, ids[0]);
    strata_store_update_list_free(list, n);
    /* The client whose upload was lost uploads again normally. */
    strata_store_verdict v;
    CU_ASSERT_EQUAL(
        strata_store_update_put(s, 1, ids[1], (const uint8_t *)"again", 5, 2, &r, &v, &d),
        STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_ACCEPTED);
    uint8_t *data = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[1], &data, &len, &d), STRATA_OK);
    CU_ASSERT(len == 5 && memcmp(data, "again", 5) == 0);
    free(data);

    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- 5b. a real crash: SIGKILL at a random moment ----------------------- */

#define CRASH_CLIENTS 48

typedef struct {
    uint64_t client;
    char receipt[STRATA_STORE_RECEIPT_LEN + 1];
    uint8_t sha256[STRATA_STORE_HASH_LEN];
} ack_record;

/* The payload client `client` uploads in round `round`: 1 to 20000
 * deterministic bytes. */
static uint8_t *crash_payload(uint32_t round, uint64_t client, size_t *len)
{
    strata_rng rng;
    strata_rng_seed(&rng, round, client);
    *len = 1 + (size_t)strata_rng_below(&rng, 20000);
    uint8_t *p = malloc(*len);
    if (p != NULL) {
        for (size_t i = 0; i < *len; i++)
            p[i] = (uint8_t)strata_rng_u64(&rng);
    }
    return p;
}

static void ack(int fd, uint64_t client, const strata_store_receipt *r)
{
    ack_record a;
    memset(&a, 0, sizeof(a));
    a.client = client;
    memcpy(a.receipt, r->id, sizeof(a.receipt));
    memcpy(a.sha256, r->sha256, sizeof(a.sha256));
    if (write(fd, &a, sizeof(a)) != (ssize_t)sizeof(a))
        _exit(5);
}

/* Uploads in groups of `batch`: prepare each, commit the group in one
 * transaction, acknowledge its members only after the commit said OK. */
static void crash_child_batched(strata_store *s, uint32_t round, const uint64_t *ids, int fd,
                                int batch)
{
    for (int i = 0; i < CRASH_CLIENTS; i += batch) {
        int n = CRASH_CLIENTS - i < batch ? CRASH_CLIENTS - i : batch;
        strata_store_pending *p[CRASH_CLIENTS];
        strata_store_receipt r[CRASH_CLIENTS];
        strata_store_verdict v[CRASH_CLIENTS];
        int res[CRASH_CLIENTS];
        for (int k = 0; k < n; k++) {
            size_t len;
            uint8_t *data = crash_payload(round, ids[i + k], &len);
            if (data == NULL ||
                strata_store_update_prepare(s, round, ids[i + k], data, len, (uint64_t)(i + k) + 1,
                                            &p[k], NULL) != STRATA_OK)
                _exit(4);
            free(data);
        }
        if (strata_store_update_commit_many(s, p, (size_t)n, r, v, res, NULL) != STRATA_OK)
            _exit(4);
        for (int k = 0; k < n; k++) {
            if (res[k] != STRATA_OK)
                _exit(4);
            ack(fd, ids[i + k], &r[k]);
        }
    }
}

static void crash_child(const char *dir, uint32_t round, const uint64_t *ids, int fd, int batch)
{
    strata_store *s = NULL;
    if (strata_store_open(dir, &s, NULL) != STRATA_OK)
        _exit(3);
    if (batch > 1) {
        crash_child_batched(s, round, ids, fd, batch);
        strata_store_close(s);
        _exit(0);
    }
    for (int i = 0; i < CRASH_CLIENTS; i++) {
        size_t len;
        uint8_t *p = crash_payload(round, ids[i], &len);
        strata_store_receipt r;
        if (p == NULL || strata_store_update_put(s, round, ids[i], p, len, (uint64_t)i + 1, &r,
                                                 NULL, NULL) != STRATA_OK)
            _exit(4);
        free(p);
        /* Acknowledge only after the store said OK: this is the 200. */
        ack(fd, ids[i], &r);
    }
    strata_store_close(s);
    _exit(0);
}

/* Kills a child that uploads CRASH_CLIENTS updates (one by one, or in group
 * commits of `batch`) at a random moment, several rounds in a row, and
 * checks what a restart finds. */
static void crash_run(int batch)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    uint64_t ids[CRASH_CLIENTS];
    add_clients(s, CRASH_CLIENTS, ids);
    strata_store_close(s);

    strata_rng rng;
    strata_rng_seed(&rng, (uint64_t)time(NULL), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t total_acked = 0, total_listed = 0;
    for (uint32_t round = 1; round <= 8; round++) {
        s = open_store(dir);
        CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        if (round > 1)
            CU_ASSERT_EQUAL_FATAL(strata_store_round_close(s, round - 1, NULL, NULL), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(
            strata_store_round_open(s, round, round, ids, CRASH_CLIENTS, 0, NULL, NULL), STRATA_OK);
        strata_store_close(s);

        int fds[2];
        CU_ASSERT_EQUAL_FATAL(pipe(fds), 0);
        fflush(NULL);
        pid_t pid = fork();
        CU_ASSERT_FATAL(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            crash_child(dir, round, ids, fds[1], batch);
        }
        close(fds[1]);
        /* Kill somewhere between immediately and well into the uploads. */
        struct timespec delay = {0,
                                 (long)strata_rng_below(&rng, batch > 1 ? 120 : 40) * 1000 * 1000};
        nanosleep(&delay, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        CU_ASSERT(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));

        ack_record acks[CRASH_CLIENTS];
        size_t nack = 0, got = 0;
        uint8_t *raw = (uint8_t *)acks;
        ssize_t k;
        while (got < sizeof(acks) && (k = read(fds[0], raw + got, sizeof(acks) - got)) != 0) {
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0)
                break;
            got += (size_t)k;
        }
        close(fds[0]);
        nack = got / sizeof(ack_record); /* a torn last record is no ack */

        /* Restart: every acknowledged update is there exactly once, intact. */
        s = open_store(dir);
        CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        strata_store_update *list = NULL;
        size_t n = 0;
        CU_ASSERT_EQUAL_FATAL(strata_store_update_list(s, round, &list, &n, NULL), STRATA_OK);
        CU_ASSERT(n >= nack);
        for (size_t a = 0; a < nack; a++) {
            int seen = 0;
            for (size_t i = 0; i < n; i++) {
                if (list[i].client_id != acks[a].client)
                    continue;
                seen++;
                CU_ASSERT_STRING_EQUAL(list[i].receipt.id, acks[a].receipt);
                CU_ASSERT(memcmp(list[i].receipt.sha256, acks[a].sha256, 32) == 0);
            }
            CU_ASSERT_EQUAL(seen, 1);
        }
        /* Everything listed (acknowledged or not) has intact bytes. */
        for (size_t i = 0; i < n; i++) {
            size_t want_len, len = 0;
            uint8_t *want = crash_payload(round, list[i].client_id, &want_len);
            uint8_t *data = NULL;
            CU_ASSERT_EQUAL(
                strata_store_update_read(s, round, list[i].client_id, &data, &len, NULL),
                STRATA_OK);
            CU_ASSERT(want != NULL && len == want_len && memcmp(data, want, len) == 0);
            free(data);
            free(want);
        }
        /* No orphan is left in the round's directory. */
        char rdir[1024];
        snprintf(rdir, sizeof(rdir), "%s/updates/%" PRIu32, dir, round);
        CU_ASSERT_EQUAL(count_entries(rdir), (int)n);
        /* Uploads continue after the restart: the rest of the clients. */
        uint64_t count = 0;
        for (int i = 0; i < CRASH_CLIENTS; i++) {
            size_t len;
            uint8_t *p = crash_payload(round, ids[i], &len);
            strata_store_receipt r;
            CU_ASSERT_EQUAL(
                strata_store_update_put(s, round, ids[i], p, len, (uint64_t)i + 1, &r, NULL, NULL),
                STRATA_OK);
            free(p);
        }
        CU_ASSERT_EQUAL(update_count(s, round, &count, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(count, CRASH_CLIENTS);
        strata_store_update_list_free(list, n);
        strata_store_close(s);
        total_acked += nack;
        total_listed += n;

        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((t1.tv_sec - t0.tv_sec) > 4)
            break;
    }
    fprintf(stderr, "\n    crash test (batch %d): %zu acknowledged, %zu committed at the kills\n",
            batch, total_acked, total_listed);

    strata_test_rmtree(dir);
    free(dir);
}

static void test_crash_sigkill(void)
{
    crash_run(1);
}

static void test_crash_sigkill_group_commit(void)
{
    crash_run(5);
}

/* ---- 5c. concurrent connections racing for the same (client, round) ---- */

#define RACERS 4

typedef struct {
    strata_store *s;
    uint64_t client;
    int index;
    int rc;
    strata_store_receipt receipt;
    strata_store_verdict verdict;
} racer;

static void *race_put(void *arg)
{
    racer *r = arg;
    uint8_t payload[256];
    memset(payload, 7, sizeof(payload)); /* every racer sends the same update */
    r->rc = strata_store_update_put(r->s, 1, r->client, payload, sizeof(payload), 1, &r->receipt,
                                    &r->verdict, NULL);
    return NULL;
}

static void test_concurrent_same_update(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    uint64_t ids[1];
    add_clients(s, 1, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 1, 0, NULL, NULL), STRATA_OK);

    racer r[RACERS];
    pthread_t th[RACERS];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < RACERS; i++) {
        r[i].client = ids[0];
        r[i].index = i;
        CU_ASSERT_EQUAL_FATAL(strata_store_open_secondary(s, &r[i].s, NULL), STRATA_OK);
    }
    for (int i = 0; i < RACERS; i++)
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, race_put, &r[i]), 0);
    for (int i = 0; i < RACERS; i++)
        pthread_join(th[i], NULL);

    /* Exactly one accepted; the others got its receipt; the file holds the
     * bytes once. */
    int accepted = -1, n_accepted = 0;
    for (int i = 0; i < RACERS; i++) {
        CU_ASSERT_EQUAL(r[i].rc, STRATA_OK);
        if (r[i].verdict == STRATA_STORE_ACCEPTED) {
            accepted = i;
            n_accepted++;
        } else {
            CU_ASSERT_EQUAL(r[i].verdict, STRATA_STORE_DUPLICATE);
        }
    }
    CU_ASSERT_EQUAL_FATAL(n_accepted, 1);
    for (int i = 0; i < RACERS; i++)
        CU_ASSERT_STRING_EQUAL(r[i].receipt.id, r[accepted].receipt.id);
    uint8_t *data = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[0], &data, &len, NULL), STRATA_OK);
    CU_ASSERT(len == 256 && data != NULL && data[0] == 7 && data[255] == 7);
    free(data);
    char rdir[1200];
    snprintf(rdir, sizeof(rdir), "%s/updates/1", dir);
    CU_ASSERT_EQUAL(count_entries(rdir), 1);
    for (int i = 0; i < RACERS; i++)
        strata_store_close(r[i].s);
    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- 5d. prepare outside any lock, commit one or a group --------------- */

/* Removes the temporary file of client's prepared update for `round` (to
 * make its publication fail); returns the number removed. */
static int remove_temp_of(const char *dir, uint32_t round, uint64_t client)
{
    char rdir[1024], prefix[64], path[1400];
    snprintf(rdir, sizeof(rdir), "%s/updates/%" PRIu32, dir, round);
    snprintf(prefix, sizeof(prefix), "%" PRIu64 ".bin.tmp.", client);
    DIR *d = opendir(rdir);
    if (d == NULL)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            snprintf(path, sizeof(path), "%s/%s", rdir, e->d_name);
            n += unlink(path) == 0;
        }
    closedir(d);
    return n;
}

static strata_store_pending *prepare(strata_store *s, uint32_t round, uint64_t client,
                                     const char *text, uint64_t samples)
{
    strata_store_pending *p = NULL;
    strata_diag d;
    int rc = strata_store_update_prepare(s, round, client, (const uint8_t *)text, strlen(text),
                                         samples, &p, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "prepare: %s\n", strata_diag_msg(&d, rc));
    return p;
}

static void test_update_prepare_commit(void)
{
    char *dir = strata_test_tmpdir(), *dir2 = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir2);
    strata_store *s = open_store(dir), *s2 = open_store(dir2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s2);
    strata_diag d;
    uint64_t ids[3], ids2[1];
    add_clients(s, 3, ids);
    add_clients(s2, 1, ids2);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 2, 0, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s2, 1, 0, ids2, 1, 0, NULL, &d), STRATA_OK);
    char rdir[1024], path[1024];
    snprintf(rdir, sizeof(rdir), "%s/updates/1", dir);

    /* Prepared: a temporary file, nothing listed. */
    strata_store_pending *p = prepare(s, 1, ids[0], "abc", 10);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(count_entries(rdir), 1);
    uint64_t count = 9;
    CU_ASSERT_EQUAL(update_count(s, 1, &count, &d), STRATA_OK);
    CU_ASSERT_EQUAL(count, 0);
    CU_ASSERT_EQUAL(update_path(s, 1, ids[0], path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT(!path_exists(path));

    /* Committed: the same receipt, file and row as a put. */
    strata_store_receipt r1, r2;
    strata_store_verdict v = 99;
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r1, &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_ACCEPTED);
    CU_ASSERT_EQUAL(r1.duplicate, 0);
    CU_ASSERT_EQUAL(r1.bytes, 3);
    CU_ASSERT_EQUAL(r1.samples, 10);
    CU_ASSERT(r1.received_unix_ms > 0);
    CU_ASSERT_EQUAL(strlen(r1.id), STRATA_STORE_RECEIPT_LEN);
    char shahex[65];
    hex(r1.sha256, 32, shahex);
    CU_ASSERT_STRING_EQUAL(shahex,
                           "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    uint8_t buf[64];
    CU_ASSERT_EQUAL(read_small(path, buf, sizeof(buf)), 3);
    CU_ASSERT(memcmp(buf, "abc", 3) == 0);
    CU_ASSERT_EQUAL(count_entries(rdir), 1);
    strata_store_update *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 1);
    CU_ASSERT_STRING_EQUAL(list[0].receipt.id, r1.id);
    strata_store_update_list_free(list, n);

    /* A second prepared update of the same client with other bytes: a
     * conflict, the file unchanged, the temporary file gone. */
    p = prepare(s, 1, ids[0], "other bytes", 5);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r2, &v, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_CONFLICT);
    CU_ASSERT_EQUAL(read_small(path, buf, sizeof(buf)), 3);
    CU_ASSERT_EQUAL(count_entries(rdir), 1);
    /* The same bytes again: the original receipt. */
    p = prepare(s, 1, ids[0], "abc", 5);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r2, &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_DUPLICATE);
    CU_ASSERT_EQUAL(r2.duplicate, 1);
    CU_ASSERT_STRING_EQUAL(r2.id, r1.id);
    CU_ASSERT_EQUAL(r2.received_unix_ms, r1.received_unix_ms);
    CU_ASSERT_EQUAL(read_small(path, buf, sizeof(buf)), 3);
    CU_ASSERT_EQUAL(count_entries(rdir), 1);

    /* Refusals come from the commit: no file is left. */
    p = prepare(s, 1, ids[2], "abc", 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r2, &v, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_NOT_SELECTED);
    CU_ASSERT(strstr(d.msg, "not selected") != NULL);
    CU_ASSERT_EQUAL(count_entries(rdir), 1);
    p = prepare(s, 7, ids[0], "abc", 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r2, &v, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_UNKNOWN_ROUND);
    snprintf(path, sizeof(path), "%s/updates/7", dir);
    CU_ASSERT_EQUAL(count_entries(path), 0);

    /* Discarding removes the temporary file. */
    p = prepare(s, 1, ids[1], "abc", 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(count_entries(rdir), 2);
    strata_store_pending_free(p);
    strata_store_pending_free(NULL);
    CU_ASSERT_EQUAL(count_entries(rdir), 1);

    /* Bad arguments. */
    const uint8_t abc[3] = {'a', 'b', 'c'};
    p = (strata_store_pending *)&d; /* must be reset to NULL */
    CU_ASSERT_EQUAL(strata_store_update_prepare(s, 1, ids[1], abc, 0, 1, &p, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(p);
    CU_ASSERT_EQUAL(strata_store_update_prepare(s, 1, ids[1], abc, 3, 0, &p, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_prepare(s, 1, ids[1], NULL, 3, 1, &p, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_prepare(NULL, 1, ids[1], abc, 3, 1, &p, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_prepare(s, 1, ids[1], abc, 3, 1, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_prepare(s, 1, UINT64_MAX, abc, 3, 1, &p, &d),
                    STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, NULL, &r2, &v, &d), STRATA_EINVAL);
    p = prepare(s, 1, ids[1], "abc", 1);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, NULL, &v, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(count_entries(rdir), 1); /* the temporary file went with it */
    /* Prepared for another state directory. */
    p = prepare(s2, 1, ids2[0], "abc", 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r2, &v, &d), STRATA_EINVAL);
    snprintf(path, sizeof(path), "%s/updates/1", dir2);
    CU_ASSERT_EQUAL(count_entries(path), 0);

    /* The round closes between prepare and commit: refused, no file. */
    p = prepare(s, 1, ids[1], "late", 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 1, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r2, NULL, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "closed") != NULL);
    CU_ASSERT_EQUAL(count_entries(rdir), 1);

    strata_store_close(s);
    strata_store_close(s2);
    strata_test_rmtree(dir);
    strata_test_rmtree(dir2);
    free(dir);
    free(dir2);
}

static void test_update_commit_many(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_diag d;
    uint64_t ids[8];
    add_clients(s, 8, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 7, 0, NULL, &d), STRATA_OK);
    char rdir[1024];
    snprintf(rdir, sizeof(rdir), "%s/updates/1", dir);
    strata_store_receipt before;
    CU_ASSERT_EQUAL_FATAL(
        strata_store_update_put(s, 1, ids[6], (const uint8_t *)"early", 5, 6, &before, NULL, &d),
        STRATA_OK);

    /* n == 0 does nothing. */
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, NULL, 0, NULL, NULL, NULL, &d), STRATA_OK);

    /* A batch: five new updates, a second one of client 0 with other bytes
     * (a conflict with the first in the same batch), an unselected client
     * and a byte-identical repeat of a client stored before the batch. */
    enum { N = 8 };
    strata_store_pending *p[N];
    const char *text[N] = {"u0", "u1", "u2", "u3", "u4", "u0 again", "x7", "early"};
    const uint64_t who[N] = {ids[0], ids[1], ids[2], ids[3], ids[4], ids[0], ids[7], ids[6]};
    for (int i = 0; i < N; i++) {
        p[i] = prepare(s, 1, who[i], text[i], (uint64_t)i + 1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p[i]);
    }
    CU_ASSERT_EQUAL(count_entries(rdir), 1 + N);
    strata_store_receipt rec[N];
    strata_store_verdict ver[N];
    int res[N];
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, N, rec, ver, res, &d), STRATA_OK);
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(res[i], STRATA_OK);
        CU_ASSERT_EQUAL(ver[i], STRATA_STORE_ACCEPTED);
        CU_ASSERT_EQUAL(rec[i].duplicate, 0);
        CU_ASSERT_EQUAL(rec[i].bytes, 2);
        CU_ASSERT_EQUAL(rec[i].samples, (uint64_t)i + 1);
        CU_ASSERT_EQUAL(strlen(rec[i].id), STRATA_STORE_RECEIPT_LEN);
    }
    CU_ASSERT_EQUAL(res[5], STRATA_ESTATE);
    CU_ASSERT_EQUAL(ver[5], STRATA_STORE_REJECT_CONFLICT);
    CU_ASSERT_EQUAL(res[6], STRATA_ESTATE);
    CU_ASSERT_EQUAL(ver[6], STRATA_STORE_REJECT_NOT_SELECTED);
    CU_ASSERT_EQUAL(res[7], STRATA_OK);
    CU_ASSERT_EQUAL(ver[7], STRATA_STORE_DUPLICATE);
    CU_ASSERT_STRING_EQUAL(rec[7].id, before.id);
    /* Six rows (in batch order after the earlier one), six files, no
     * temporary file left. */
    strata_store_update *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 6);
    CU_ASSERT_EQUAL(list[0].client_id, ids[6]);
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(list[i + 1].client_id, ids[i]);
        CU_ASSERT_STRING_EQUAL(list[i + 1].receipt.id, rec[i].id);
        uint8_t *data = NULL;
        size_t len = 0;
        CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[i], &data, &len, &d), STRATA_OK);
        CU_ASSERT(len == 2 && data != NULL && memcmp(data, text[i], 2) == 0);
        free(data);
    }
    strata_store_update_list_free(list, n);
    CU_ASSERT_EQUAL(count_entries(rdir), 6);

    /* A batch that fails as a whole (the second file cannot be published)
     * commits nothing and leaves no file, not even the first one's. */
    CU_ASSERT_EQUAL_FATAL(strata_store_round_close(s, 1, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 2, 1, ids, 8, 0, NULL, &d), STRATA_OK);
    snprintf(rdir, sizeof(rdir), "%s/updates/2", dir);
    p[0] = prepare(s, 2, ids[5], "five", 5);
    p[1] = prepare(s, 2, ids[7], "seven", 7);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p[0]);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p[1]);
    CU_ASSERT_EQUAL(count_entries(rdir), 2);
    CU_ASSERT_EQUAL_FATAL(remove_temp_of(dir, 2, ids[7]), 1);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 2, rec, ver, res, &d), STRATA_EIO);
    CU_ASSERT(strstr(d.msg, "rename") != NULL);
    CU_ASSERT_EQUAL(res[0], STRATA_EIO);
    CU_ASSERT_EQUAL(res[1], STRATA_EIO);
    CU_ASSERT_EQUAL(ver[0], STRATA_STORE_ACCEPTED);
    CU_ASSERT_EQUAL(rec[0].id[0], '\0');
    uint64_t count = 9;
    CU_ASSERT_EQUAL(update_count(s, 2, &count, &d), STRATA_OK);
    CU_ASSERT_EQUAL(count, 0);
    CU_ASSERT_EQUAL(count_entries(rdir), 0);
    /* Both upload again normally. */
    p[0] = prepare(s, 2, ids[5], "five", 5);
    p[1] = prepare(s, 2, ids[7], "seven", 7);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 2, rec, ver, res, &d), STRATA_OK);
    CU_ASSERT(res[0] == STRATA_OK && res[1] == STRATA_OK);
    CU_ASSERT_EQUAL(update_count(s, 2, &count, &d), STRATA_OK);
    CU_ASSERT_EQUAL(count, 2);
    CU_ASSERT_EQUAL(count_entries(rdir), 2);
    CU_ASSERT_EQUAL(remove_temp_of(dir, 2, ids[5]), 0);

    /* A NULL item fails the whole batch and frees the others. */
    p[0] = prepare(s, 2, ids[0], "zero", 1);
    p[1] = NULL;
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 2, rec, ver, res, &d), STRATA_EINVAL);
    CU_ASSERT(res[0] == STRATA_EINVAL && res[1] == STRATA_EINVAL);
    CU_ASSERT_EQUAL(count_entries(rdir), 2);

    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* Threads prepare updates with the primary store while the main thread
 * commits them in groups on the same store, as a server does when it
 * prepares outside its lock. */
#define PREP_THREADS 6
#define PREP_EACH 12

typedef struct {
    strata_store *s;
    const uint64_t *ids;
    int index;
    pthread_mutex_t *mu;
    strata_store_pending **queue;
    size_t *queued;
    int failures;
} preparer;

static void *prepare_loop(void *arg)
{
    preparer *w = arg;
    for (int k = 0; k < PREP_EACH; k++) {
        int c = w->index * PREP_EACH + k;
        size_t len;
        uint8_t *data = crash_payload(1, w->ids[c], &len);
        strata_store_pending *p = NULL;
        if (data == NULL || strata_store_update_prepare(w->s, 1, w->ids[c], data, len,
                                                        (uint64_t)c + 1, &p, NULL) != STRATA_OK)
            w->failures++;
        free(data);
        pthread_mutex_lock(w->mu);
        w->queue[(*w->queued)++] = p; /* NULL on failure, counted above */
        pthread_mutex_unlock(w->mu);
    }
    return NULL;
}

static void test_prepare_concurrent_with_commits(void)
{
    enum { TOTAL = PREP_THREADS * PREP_EACH };
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    uint64_t ids[TOTAL];
    add_clients(s, TOTAL, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, TOTAL, 0, NULL, NULL), STRATA_OK);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    strata_store_pending *queue[TOTAL];
    size_t queued = 0, taken = 0, committed = 0, batches = 0;
    preparer w[PREP_THREADS];
    pthread_t th[PREP_THREADS];
    for (int i = 0; i < PREP_THREADS; i++) {
        w[i] = (preparer){s, ids, i, &mu, queue, &queued, 0};
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, prepare_loop, &w[i]), 0);
    }
    strata_store_receipt rec[TOTAL];
    strata_store_verdict ver[TOTAL];
    int res[TOTAL];
    while (taken < TOTAL) {
        strata_store_pending *batch[TOTAL];
        size_t n = 0;
        pthread_mutex_lock(&mu);
        while (taken < queued)
            batch[n++] = queue[taken++];
        pthread_mutex_unlock(&mu);
        if (n == 0) {
            struct timespec ms = {0, 1000 * 1000};
            nanosleep(&ms, NULL);
            continue;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (batch[i] != NULL)
                batch[k++] = batch[i];
        CU_ASSERT_EQUAL(strata_store_update_commit_many(s, batch, k, rec, ver, res, NULL),
                        STRATA_OK);
        for (size_t i = 0; i < k; i++)
            committed += res[i] == STRATA_OK && ver[i] == STRATA_STORE_ACCEPTED;
        batches++;
    }
    for (int i = 0; i < PREP_THREADS; i++) {
        pthread_join(th[i], NULL);
        CU_ASSERT_EQUAL(w[i].failures, 0);
    }
    CU_ASSERT_EQUAL(committed, TOTAL);
    CU_ASSERT(batches >= 1);
    uint64_t count = 0;
    CU_ASSERT_EQUAL(update_count(s, 1, &count, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(count, TOTAL);
    for (int c = 0; c < TOTAL; c++) {
        size_t want_len, len = 0;
        uint8_t *want = crash_payload(1, ids[c], &want_len), *data = NULL;
        CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[c], &data, &len, NULL), STRATA_OK);
        CU_ASSERT(want != NULL && data != NULL && len == want_len && memcmp(data, want, len) == 0);
        free(data);
        free(want);
    }
    char rdir[1024];
    snprintf(rdir, sizeof(rdir), "%s/updates/1", dir);
    CU_ASSERT_EQUAL(count_entries(rdir), TOTAL);
    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- 6. counters and checkpoints ---------------------------------------- */

static void test_counters(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_diag d;
    int64_t v = -1;

    CU_ASSERT_EQUAL(strata_store_counter_get(s, "updates_accepted_total", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 0);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "updates_accepted_total", 3, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "updates_accepted_total", -1, &d), STRATA_OK);
    strata_store_counter many[2] = {{"bytes_in_total", 1000},
                                    {"updates_rejected_total{reason=\"shape\"}", 1}};
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, many, 2, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, many, 2, &d), STRATA_OK);

    /* Overflow and bad names change nothing. */
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "bytes_in_total", INT64_MAX, &d), STRATA_ETOOBIG);
    strata_store_counter bad[2] = {{"bytes_in_total", 5}, {"has space", 1}};
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, bad, 2, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "", 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, NULL, 1, &d), STRATA_EINVAL);

    strata_store_close(s);
    s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "updates_accepted_total", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 2);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "bytes_in_total", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 2000);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "updates_rejected_total{reason=\"shape\"}", &v, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(v, 2);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "never_added_total", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 0);

    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

static void test_checkpoints(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_diag d;
    uint64_t ver = 9;
    int found = 1;
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &ver, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);

    char path[1024], want[1024];
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 3, path, sizeof(path), &d), STRATA_OK);
    snprintf(want, sizeof(want), "%s/checkpoints/model-3.safetensors", dir);
    CU_ASSERT_STRING_EQUAL(path, want);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 3, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(write_small(path, "model", 5), 0);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 3, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 2, path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT_EQUAL(write_small(path, "model", 5), 0);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 2, &d), STRATA_OK);
    char small[4];
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 2, small, sizeof(small), &d), STRATA_ETOOBIG);

    strata_store_close(s);
    s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &ver, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(ver, 3);

    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* Every file of the state directory, and the refusals. */
static void test_paths(void)
{
    static const struct {
        strata_store_file f;
        uint64_t a, b;
        const char *want;
    } cases[] = {
        {STRATA_STORE_FILE_DB, 0, 0, "S/state.db"},
        {STRATA_STORE_FILE_LOCK, 0, 0, "S/lock"},
        {STRATA_STORE_FILE_UPDATES, 0, 0, "S/updates"},
        {STRATA_STORE_FILE_ROUND_UPDATES, 7, 0, "S/updates/7"},
        {STRATA_STORE_FILE_UPDATE, 7, 42, "S/updates/7/42.bin"},
        {STRATA_STORE_FILE_CHECKPOINTS, 0, 0, "S/checkpoints"},
        {STRATA_STORE_FILE_CHECKPOINT, 3, 0, "S/checkpoints/model-3.safetensors"},
        {STRATA_STORE_FILE_SERVER_OPT, 3, 0, "S/checkpoints/server-opt-3.safetensors"},
        {STRATA_STORE_FILE_ADMIN_TOKEN, 0, 0, "S/admin.token"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        CU_ASSERT_EQUAL(
            strata_store_path("S", cases[i].f, cases[i].a, cases[i].b, buf, sizeof(buf), NULL),
            STRATA_OK);
        CU_ASSERT_STRING_EQUAL(buf, cases[i].want);
    }
    strata_diag d;
    CU_ASSERT_EQUAL(strata_store_path("S", STRATA_STORE_FILE_UPDATE, 1, 2, buf, 8, &d),
                    STRATA_ETOOBIG);
    CU_ASSERT_STRING_EQUAL(buf, "");
    CU_ASSERT_EQUAL(strata_store_path(NULL, STRATA_STORE_FILE_DB, 0, 0, buf, sizeof(buf), &d),
                    STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_path("S", (strata_store_file)99, 0, 0, buf, sizeof(buf), &d),
                    STRATA_EINVAL);
}

int main(void)
{
    CU_TestInfo store_tests[] = {
        {"state directory paths", test_paths},
        {"open, reopen, lock, schema version", test_open_reopen_schema},
        {"clients", test_clients},
        {"rounds", test_rounds},
        {"update put: durable, idempotent, refusals", test_update_put},
        {"recovery removes uncommitted files", test_recovery_orphans},
        {"SIGKILL at random moments loses no acknowledged update", test_crash_sigkill},
        {"concurrent connections store one update once", test_concurrent_same_update},
        {"prepare, then commit: the same outcomes as put", test_update_prepare_commit},
        {"group commit: per-item outcomes, all or nothing", test_update_commit_many},
        {"prepare in threads while another commits", test_prepare_concurrent_with_commits},
        {"SIGKILL during group commits loses no acknowledged update",
         test_crash_sigkill_group_commit},
        {"counters persist", test_counters},
        {"checkpoints", test_checkpoints},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"store", NULL, NULL, NULL, NULL, store_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
