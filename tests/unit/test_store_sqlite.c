/* What only the store's SQLite backend has (store_sqlite*.c): the state
 * directory's layout and paths, the directory lock, the schema version and
 * the migrations (schema 1; schema 2's payload files moved into the
 * database), the permissions of state.db, the recovery of checkpoint
 * temporary files, and failures only the database can produce (a corrupted
 * payload, a failing write inside a group commit). What every backend must
 * do is in test_store_conformance.c. */
#include "store.h"
#include "test_util.h"

#include "strata/hash.h"

#include <sqlite3.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- Helpers ------------------------------------------------------------ */

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

static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t w = n > 0 ? fwrite(data, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* Whether the file at path holds exactly data[0, n). */
static int file_is(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return 0;
    uint8_t *buf = malloc(n + 1);
    size_t got = buf != NULL ? fread(buf, 1, n + 1, f) : 0;
    fclose(f);
    int same = buf != NULL && got == n && memcmp(buf, data, n) == 0;
    free(buf);
    return same;
}

/* The path of a state directory's file. */
static const char *state_path(const char *dir, strata_store_file file, uint64_t a, uint64_t b,
                              char *buf, size_t len)
{
    if (strata_store_path(dir, file, a, b, buf, len, NULL) != STRATA_OK)
        buf[0] = '\0';
    return buf;
}

/* Opens dir's state.db directly (not through the store). */
static sqlite3 *db_open(const char *dir)
{
    char path[4096];
    sqlite3 *db = NULL;
    if (sqlite3_open(state_path(dir, STRATA_STORE_FILE_DB, 0, 0, path, sizeof(path)), &db) !=
        SQLITE_OK) {
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 10000);
    return db;
}

/* Runs sql on dir's state.db; SQLITE_OK or the error. */
static int db_exec(const char *dir, const char *sql)
{
    sqlite3 *db = db_open(dir);
    if (db == NULL)
        return SQLITE_CANTOPEN;
    char *err = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &err);
    if (rc != SQLITE_OK)
        fprintf(stderr, "%s: %s\n", sql, err ? err : "?");
    sqlite3_free(err);
    sqlite3_close(db);
    return rc;
}

/* The integer a one-value query on dir's state.db answers (-1: none). */
static int64_t db_int(const char *dir, const char *sql)
{
    sqlite3 *db = db_open(dir);
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (db != NULL && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static int64_t schema_version(const char *dir)
{
    return db_int(dir, "SELECT max(version) FROM schema_version");
}

static int64_t table_exists(const char *dir, const char *table)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = '%s'", table);
    return db_int(dir, sql);
}

/* A fresh temporary directory and, inside it, the path of a state
 * directory that does not exist yet. */
static char *fresh_dir(char *sub, size_t len)
{
    char *dir = strata_test_tmpdir();
    if (dir != NULL)
        snprintf(sub, len, "%s/state", dir);
    return dir;
}

/* ---- Paths -------------------------------------------------------------- */

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
        {STRATA_STORE_FILE_SERVER_MODEL, 4, 0, "S/checkpoints/server-model-4.safetensors"},
        {STRATA_STORE_FILE_DELTA, 5, 0, "S/checkpoints/delta-5.bin"},
        {STRATA_STORE_FILE_ADMIN_TOKEN, 0, 0, "S/admin.token"},
        {STRATA_STORE_FILE_UPDATE, UINT64_MAX, UINT64_MAX,
         "S/updates/18446744073709551615/18446744073709551615.bin"},
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
    /* Exactly fitting (with its NUL) is fine; one byte less is not. */
    CU_ASSERT_EQUAL(strata_store_path("S", STRATA_STORE_FILE_LOCK, 0, 0, buf, 7, &d), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(buf, "S/lock");
    CU_ASSERT_EQUAL(strata_store_path("S", STRATA_STORE_FILE_LOCK, 0, 0, buf, 6, &d),
                    STRATA_ETOOBIG);
    CU_ASSERT_EQUAL(strata_store_path(NULL, STRATA_STORE_FILE_DB, 0, 0, buf, sizeof(buf), &d),
                    STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_path("S", STRATA_STORE_FILE_DB, 0, 0, NULL, sizeof(buf), &d),
                    STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_path("S", STRATA_STORE_FILE_DB, 0, 0, buf, 0, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_path("S", (strata_store_file)99, 0, 0, buf, sizeof(buf), &d),
                    STRATA_EINVAL);
}

/* ---- Open, reopen, lock ------------------------------------------------- */

static void test_open_reopen(void)
{
    char sub[1024], path[4096];
    char *dir = fresh_dir(sub, sizeof(sub));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_diag d;

    /* The first open makes the directory and its layout; payloads live in
     * the database, so there is no updates/. */
    strata_store *s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_STRING_EQUAL(strata_store_dir(s), sub);
    CU_ASSERT_STRING_EQUAL(strata_store_backend(s), "sqlite");
    CU_ASSERT(path_exists(state_path(sub, STRATA_STORE_FILE_DB, 0, 0, path, sizeof(path))));
    CU_ASSERT(path_exists(state_path(sub, STRATA_STORE_FILE_LOCK, 0, 0, path, sizeof(path))));
    CU_ASSERT(
        path_exists(state_path(sub, STRATA_STORE_FILE_CHECKPOINTS, 0, 0, path, sizeof(path))));
    CU_ASSERT(!path_exists(state_path(sub, STRATA_STORE_FILE_UPDATES, 0, 0, path, sizeof(path))));
    CU_ASSERT_EQUAL(strata_store_recovered_files(s), 0);

    uint8_t h[32];
    uint64_t id = 0;
    token_hash(1, h);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h, "alpha", NULL, &id, NULL, NULL), STRATA_OK);
    uint64_t sel[1] = {id};
    CU_ASSERT_EQUAL(strata_store_round_open(s, 1, 0, sel, 1, 0, NULL, &d), STRATA_OK);
    strata_store_receipt r;
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, id, (const uint8_t *)"abc", 3, 1, &r, NULL, &d),
                    STRATA_OK);
    /* A secondary shares the directory and sees the same data. */
    strata_store *sec = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_store_open_secondary(s, &sec, &d), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(strata_store_dir(sec), sub);
    CU_ASSERT_STRING_EQUAL(strata_store_backend(sec), "sqlite");
    CU_ASSERT_EQUAL(strata_store_recovered_files(sec), 0);
    strata_store_client c;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_client_get(sec, id, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    strata_store_close(sec);
    strata_store_close(s);

    /* Data survives close and reopen. */
    s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT(memcmp(c.token_hash, h, 32) == 0);
    CU_ASSERT_STRING_EQUAL(c.name, "alpha");
    uint8_t *buf = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, id, &buf, &len, &d), STRATA_OK);
    CU_ASSERT(len == 3 && buf != NULL && memcmp(buf, "abc", 3) == 0);
    free(buf);
    CU_ASSERT(!path_exists(state_path(sub, STRATA_STORE_FILE_UPDATES, 0, 0, path, sizeof(path))));
    CU_ASSERT_EQUAL(schema_version(sub), STRATA_STORE_SCHEMA_VERSION);
    strata_store_close(s);

    /* A foreign SQLite database is not taken over. */
    char foreign[1100];
    snprintf(foreign, sizeof(foreign), "%s/foreign", dir);
    CU_ASSERT_EQUAL_FATAL(mkdir(foreign, 0700), 0);
    CU_ASSERT_EQUAL(db_exec(foreign, "CREATE TABLE t(x)"), SQLITE_OK);
    s = (strata_store *)&d;
    CU_ASSERT_EQUAL(strata_store_open(foreign, &s, &d), STRATA_ESTATE);
    CU_ASSERT_PTR_NULL(s);
    CU_ASSERT(strstr(d.msg, "not a Strata") != NULL);
    CU_ASSERT_EQUAL(db_int(foreign, "SELECT count(*) FROM sqlite_schema"), 1);
    /* A file where the directory should be. */
    char file[1100];
    snprintf(file, sizeof(file), "%s/file", dir);
    CU_ASSERT_EQUAL(write_file(file, "x", 1), 0);
    CU_ASSERT_EQUAL(strata_store_open(file, &s, &d), STRATA_EIO);
    CU_ASSERT_PTR_NULL(s);

    /* Bad arguments. */
    CU_ASSERT_EQUAL(strata_store_open(NULL, &s, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_open("", &s, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_open(sub, NULL, &d), STRATA_EINVAL);
    char *longpath = malloc(3100);
    CU_ASSERT_PTR_NOT_NULL_FATAL(longpath);
    memset(longpath, 'a', 3099);
    longpath[0] = '/';
    longpath[3099] = '\0';
    CU_ASSERT_EQUAL(strata_store_open(longpath, &s, &d), STRATA_EINVAL);
    free(longpath);
    CU_ASSERT_EQUAL(strata_store_open_secondary(NULL, &sec, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(sec);
    strata_store_close(NULL);
    CU_ASSERT_PTR_NULL(strata_store_dir(NULL));
    CU_ASSERT_PTR_NULL(strata_store_backend(NULL));
    CU_ASSERT_EQUAL(strata_store_recovered_files(NULL), 0);

    strata_test_rmtree(dir);
    free(dir);
}

/* The directory is owned by one store at a time, in this process or
 * another; the lock dies with its owner. */
static void test_lock(void)
{
    char sub[1024];
    char *dir = fresh_dir(sub, sizeof(sub));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_diag d;
    strata_store *s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);

    strata_store *second = (strata_store *)&d;
    CU_ASSERT_EQUAL(strata_store_open(sub, &second, &d), STRATA_ESTATE);
    CU_ASSERT_PTR_NULL(second);
    CU_ASSERT(strstr(d.msg, "in use") != NULL);
    /* A secondary takes no lock. */
    CU_ASSERT_EQUAL(strata_store_open_secondary(s, &second, &d), STRATA_OK);
    strata_store_close(second);
    strata_store_close(s);
    s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_store_close(s);

    /* Another process holds it until it dies, even by SIGKILL. */
    int fds[2];
    CU_ASSERT_EQUAL_FATAL(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        strata_store *mine = NULL;
        char ok = strata_store_open(sub, &mine, NULL) == STRATA_OK ? 'y' : 'n';
        if (write(fds[1], &ok, 1) != 1)
            _exit(2);
        pause();
        _exit(0);
    }
    close(fds[1]);
    char ok = 0;
    CU_ASSERT_EQUAL(read(fds[0], &ok, 1), 1);
    close(fds[0]);
    CU_ASSERT_EQUAL(ok, 'y');
    CU_ASSERT_EQUAL(strata_store_open(sub, &s, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "in use") != NULL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL(s);
    strata_store_close(s);

    strata_test_rmtree(dir);
    free(dir);
}

/* ---- Schema versions and migrations ------------------------------------- */

/* Schema 1 and the migration to schema 2, exactly as store_sqlite.c
 * defines them (schema_v1, migrate_v2): the databases the migrations start
 * from. */
static const char schema_v1[] =
    "CREATE TABLE schema_version(version INTEGER NOT NULL);"
    "CREATE TABLE clients("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " token_hash BLOB NOT NULL UNIQUE CHECK(length(token_hash) = 32),"
    " name TEXT NOT NULL DEFAULT '',"
    " created_ms INTEGER NOT NULL,"
    " last_seen_ms INTEGER NOT NULL);"
    "CREATE TABLE rounds("
    " round INTEGER PRIMARY KEY CHECK(round BETWEEN 0 AND 4294967295),"
    " model_version INTEGER NOT NULL CHECK(model_version >= 0),"
    " state INTEGER NOT NULL CHECK(state IN (0, 1)),"
    " opened_ms INTEGER NOT NULL,"
    " deadline_ms INTEGER NOT NULL,"
    " closed_ms INTEGER NOT NULL DEFAULT 0,"
    " task TEXT CHECK(task IS NULL OR json_valid(task)),"
    " summary TEXT CHECK(summary IS NULL OR json_valid(summary)));"
    "CREATE TABLE round_clients("
    " round INTEGER NOT NULL REFERENCES rounds(round),"
    " client_id INTEGER NOT NULL REFERENCES clients(id),"
    " PRIMARY KEY(round, client_id)) WITHOUT ROWID;"
    "CREATE TABLE updates("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " round INTEGER NOT NULL REFERENCES rounds(round),"
    " client_id INTEGER NOT NULL REFERENCES clients(id),"
    " receipt TEXT NOT NULL UNIQUE,"
    " sha256 BLOB NOT NULL CHECK(length(sha256) = 32),"
    " bytes INTEGER NOT NULL CHECK(bytes > 0),"
    " samples INTEGER NOT NULL CHECK(samples > 0),"
    " received_ms INTEGER NOT NULL,"
    " UNIQUE(round, client_id));"
    "CREATE TABLE checkpoints("
    " model_version INTEGER PRIMARY KEY,"
    " bytes INTEGER NOT NULL,"
    " recorded_ms INTEGER NOT NULL);"
    "CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;"
    "INSERT INTO schema_version(version) VALUES(1);";

static const char migrate_v2[] =
    "CREATE TABLE registrations("
    " registration_id TEXT PRIMARY KEY,"
    " client_id INTEGER NOT NULL UNIQUE REFERENCES clients(id)) WITHOUT ROWID;"
    "UPDATE schema_version SET version = 2;";

/* The updates of the schema-2 state directory that test_migrate_v2 builds,
 * in the order they were accepted (their seq). */
#define V2_CLIENTS 3

typedef struct v2_update {
    uint32_t round;
    uint64_t client;
    size_t len;
    uint64_t samples;
    const char *receipt;
} v2_update;

static const v2_update V2_UPDATES[] = {
    {1, 2, 20000, 7, "0123456789abcdef0123456789abcdef"},
    {1, 1, 300, 3, "00000000000000000000000000000001"},
    {2, 3, 1, 1, "ffffffffffffffffffffffffffffffff"},
    {2, 1, 70000, 9, "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0"},
};

#define N_V2 (sizeof(V2_UPDATES) / sizeof(V2_UPDATES[0]))

/* Update i's payload (free()). */
static uint8_t *v2_payload(size_t i)
{
    uint8_t *p = malloc(V2_UPDATES[i].len);
    for (size_t k = 0; p != NULL && k < V2_UPDATES[i].len; k++)
        p[k] = (uint8_t)(k * 7 + i * 13 + (k >> 8));
    return p;
}

/* What build_v2 does to update `victim`'s payload file. */
typedef enum { SPOIL_NONE, SPOIL_MISSING, SPOIL_OTHER_BYTES, SPOIL_SHORTER } spoil;

static int bind_exec(sqlite3 *db, sqlite3_stmt *st)
{
    int rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(db);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc;
}

/* Builds a schema-2 state directory at dir by hand: clients 1..3 (client
 * 3 with a registration id), round 1 closed, round 2 open, the rows of
 * V2_UPDATES and their payload files updates/<R>/<C>.bin, a checkpoint
 * record and a counter; then spoils update victim's file as `how` says. */
static int build_v2(const char *dir, spoil how, size_t victim)
{
    if (mkdir(dir, 0700) != 0)
        return -1;
    char path[4096];
    sqlite3 *db = db_open(dir);
    if (db == NULL)
        return -1;
    int rc = sqlite3_exec(db, schema_v1, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, migrate_v2, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db,
                          "INSERT INTO rounds VALUES(1, 0, 1, 1000, 2000, 3000, '{\"a\":1}', '{}');"
                          "INSERT INTO rounds VALUES(2, 1, 0, 4000, 5000, 0, NULL, NULL);"
                          "INSERT INTO checkpoints VALUES(1, 5, 3500);"
                          "INSERT INTO counters VALUES('bytes_in_total', 90301);",
                          NULL, NULL, NULL);
    sqlite3_stmt *cl = NULL, *rcl = NULL, *up = NULL;
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(db, "INSERT INTO clients VALUES(?1, ?2, 'c', 100, 200)", -1, &cl,
                                NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(db, "INSERT INTO round_clients VALUES(?1, ?2)", -1, &rcl, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(db, "INSERT INTO updates VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                                -1, &up, NULL);
    for (int c = 1; rc == SQLITE_OK && c <= V2_CLIENTS; c++) {
        uint8_t h[32];
        token_hash(c, h);
        sqlite3_bind_int64(cl, 1, c);
        sqlite3_bind_blob(cl, 2, h, 32, SQLITE_TRANSIENT);
        rc = bind_exec(db, cl);
        for (int round = 1; rc == SQLITE_OK && round <= 2; round++) {
            sqlite3_bind_int64(rcl, 1, round);
            sqlite3_bind_int64(rcl, 2, c);
            rc = bind_exec(db, rcl);
        }
    }
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "INSERT INTO registrations VALUES('reg-client-3', 3)", NULL, NULL,
                          NULL);
    for (size_t i = 0; rc == SQLITE_OK && i < N_V2; i++) {
        const v2_update *u = &V2_UPDATES[i];
        uint8_t *p = v2_payload(i), h[STRATA_SHA256_LEN];
        if (p == NULL) {
            rc = SQLITE_NOMEM;
            break;
        }
        strata_sha256(p, u->len, h);
        sqlite3_bind_int64(up, 1, (int64_t)i + 10); /* seq: acceptance order */
        sqlite3_bind_int64(up, 2, u->round);
        sqlite3_bind_int64(up, 3, (int64_t)u->client);
        sqlite3_bind_text(up, 4, u->receipt, -1, SQLITE_STATIC);
        sqlite3_bind_blob(up, 5, h, sizeof(h), SQLITE_TRANSIENT);
        sqlite3_bind_int64(up, 6, (int64_t)u->len);
        sqlite3_bind_int64(up, 7, (int64_t)u->samples);
        sqlite3_bind_int64(up, 8, 4500 + (int64_t)i);
        rc = bind_exec(db, up);
        /* The payload file, as schema 2 wrote it. */
        state_path(dir, STRATA_STORE_FILE_UPDATES, 0, 0, path, sizeof(path));
        mkdir(path, 0700);
        state_path(dir, STRATA_STORE_FILE_ROUND_UPDATES, u->round, 0, path, sizeof(path));
        mkdir(path, 0700);
        state_path(dir, STRATA_STORE_FILE_UPDATE, u->round, u->client, path, sizeof(path));
        size_t len = u->len;
        if (i == victim && how == SPOIL_OTHER_BYTES)
            p[len / 2] ^= 0x40;
        if (i == victim && how == SPOIL_SHORTER)
            len--;
        if (rc == SQLITE_OK && !(i == victim && how == SPOIL_MISSING) &&
            write_file(path, p, len) != 0)
            rc = SQLITE_IOERR;
        free(p);
    }
    sqlite3_finalize(cl);
    sqlite3_finalize(rcl);
    sqlite3_finalize(up);
    sqlite3_close(db);
    /* A temporary file an interrupted schema-2 upload left behind. */
    state_path(dir, STRATA_STORE_FILE_UPDATE, 2, 2, path, sizeof(path));
    strcat(path, ".tmp.Ab12Cd");
    if (rc == SQLITE_OK && write_file(path, "half", 4) != 0)
        rc = SQLITE_IOERR;
    return rc == SQLITE_OK ? 0 : -1;
}

/* Whether every payload file of build_v2 is still as it wrote it. */
static int v2_files_untouched(const char *dir, spoil how, size_t victim)
{
    char path[4096];
    int same = 1;
    for (size_t i = 0; i < N_V2; i++) {
        const v2_update *u = &V2_UPDATES[i];
        uint8_t *p = v2_payload(i);
        size_t len = u->len;
        if (i == victim && how == SPOIL_OTHER_BYTES)
            p[len / 2] ^= 0x40;
        if (i == victim && how == SPOIL_SHORTER)
            len--;
        state_path(dir, STRATA_STORE_FILE_UPDATE, u->round, u->client, path, sizeof(path));
        if (i == victim && how == SPOIL_MISSING)
            same &= !path_exists(path);
        else
            same &= file_is(path, p, len);
        free(p);
    }
    return same;
}

/* A database of schema version 1 (no registrations, no payloads) is
 * migrated on open: its clients stay, registration ids work. */
static void test_migrate_v1(void)
{
    char sub[1024];
    char *dir = fresh_dir(sub, sizeof(sub));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_diag d;
    CU_ASSERT_EQUAL_FATAL(mkdir(sub, 0700), 0);
    CU_ASSERT_EQUAL_FATAL(db_exec(sub, schema_v1), SQLITE_OK);
    CU_ASSERT_EQUAL_FATAL(
        db_exec(sub, "INSERT INTO clients VALUES(5, zeroblob(32), 'old', 100, 200)"), SQLITE_OK);

    strata_store *s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_store_client c;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_client_get(s, 5, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_STRING_EQUAL(c.name, "old");
    CU_ASSERT_EQUAL(c.last_seen_unix_ms, 200);
    uint8_t h2[32];
    uint64_t id2 = 0;
    int existed = -1;
    token_hash(2, h2);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h2, NULL, "reg-0123456789ab", &id2, &existed, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(existed, 0);
    CU_ASSERT_EQUAL(id2, 6);
    uint64_t sel[1] = {id2};
    CU_ASSERT_EQUAL(strata_store_round_open(s, 1, 0, sel, 1, 0, NULL, &d), STRATA_OK);
    strata_store_receipt r;
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, id2, (const uint8_t *)"p", 1, 1, &r, NULL, &d),
                    STRATA_OK);
    strata_store_close(s);
    CU_ASSERT_EQUAL(schema_version(sub), STRATA_STORE_SCHEMA_VERSION);
    CU_ASSERT_EQUAL(table_exists(sub, "registrations"), 1);
    CU_ASSERT_EQUAL(table_exists(sub, "payloads"), 1);

    strata_test_rmtree(dir);
    free(dir);
}

/* A schema-2 state directory: the first open moves every payload file into
 * the database, keeps every row, and removes updates/. */
static void test_migrate_v2(void)
{
    char sub[1024], path[4096];
    char *dir = fresh_dir(sub, sizeof(sub));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_diag d;
    CU_ASSERT_EQUAL_FATAL(build_v2(sub, SPOIL_NONE, 0), 0);
    CU_ASSERT_EQUAL(schema_version(sub), 2);
    CU_ASSERT(v2_files_untouched(sub, SPOIL_NONE, 0));

    strata_store *s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT(!path_exists(state_path(sub, STRATA_STORE_FILE_UPDATES, 0, 0, path, sizeof(path))));
    for (int pass = 0; pass < 2; pass++) {
        /* The payloads read back; lists keep the acceptance order and the
         * receipts. */
        for (size_t i = 0; i < N_V2; i++) {
            const v2_update *u = &V2_UPDATES[i];
            uint8_t *want = v2_payload(i), *buf = NULL;
            size_t len = 0;
            CU_ASSERT_EQUAL(strata_store_update_read(s, u->round, u->client, &buf, &len, &d),
                            STRATA_OK);
            CU_ASSERT(want != NULL && buf != NULL && len == u->len && memcmp(buf, want, len) == 0);
            free(buf);
            free(want);
        }
        for (uint32_t round = 1; round <= 2; round++) {
            strata_store_update *list = NULL;
            size_t n = 0, k = 0;
            CU_ASSERT_EQUAL(strata_store_update_list(s, round, &list, &n, &d), STRATA_OK);
            CU_ASSERT_EQUAL_FATAL(n, 2);
            for (size_t i = 0; i < N_V2; i++) {
                if (V2_UPDATES[i].round != round)
                    continue;
                uint8_t *want = v2_payload(i), h[STRATA_SHA256_LEN];
                strata_sha256(want, V2_UPDATES[i].len, h);
                free(want);
                CU_ASSERT_EQUAL(list[k].client_id, V2_UPDATES[i].client);
                CU_ASSERT_STRING_EQUAL(list[k].receipt.id, V2_UPDATES[i].receipt);
                CU_ASSERT(memcmp(list[k].receipt.sha256, h, sizeof(h)) == 0);
                CU_ASSERT_EQUAL(list[k].receipt.bytes, V2_UPDATES[i].len);
                CU_ASSERT_EQUAL(list[k].receipt.samples, V2_UPDATES[i].samples);
                CU_ASSERT_EQUAL(list[k].receipt.received_unix_ms, 4500 + (int64_t)i);
                k++;
            }
            strata_store_update_list_free(list, n);
        }
        if (pass == 0) {
            strata_store_close(s);
            s = open_store(sub);
            CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        }
    }
    /* The rest of the state is as it was, and work goes on: a repeat of a
     * migrated update is a duplicate with its receipt, a new one is stored. */
    uint64_t id = 0;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_registration_find(s, "reg-client-3", &id, &found, &d), STRATA_OK);
    CU_ASSERT(found == 1 && id == 3);
    int64_t v = 0;
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "bytes_in_total", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 90301);
    uint64_t version = 0;
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &version, &found, &d), STRATA_OK);
    CU_ASSERT(found == 1 && version == 1);
    strata_store_round r;
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_CLOSED);
    CU_ASSERT_EQUAL(r.n_updates, 2);
    CU_ASSERT_STRING_EQUAL(r.task_json, "{\"a\":1}");
    strata_store_round_cleanup(&r);
    uint8_t *p = v2_payload(2);
    strata_store_receipt rec;
    strata_store_verdict verdict;
    CU_ASSERT_EQUAL(strata_store_update_put(s, 2, 3, p, V2_UPDATES[2].len, 5, &rec, &verdict, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(verdict, STRATA_STORE_DUPLICATE);
    CU_ASSERT_STRING_EQUAL(rec.id, V2_UPDATES[2].receipt);
    free(p);
    CU_ASSERT_EQUAL(
        strata_store_update_put(s, 2, 2, (const uint8_t *)"new", 3, 1, &rec, &verdict, &d),
        STRATA_OK);
    CU_ASSERT_EQUAL(verdict, STRATA_STORE_ACCEPTED);
    strata_store_close(s);
    CU_ASSERT_EQUAL(schema_version(sub), 3);
    CU_ASSERT_EQUAL(db_int(sub, "SELECT count(*) FROM payloads"), (int64_t)N_V2 + 1);
    CU_ASSERT(!path_exists(state_path(sub, STRATA_STORE_FILE_UPDATES, 0, 0, path, sizeof(path))));

    strata_test_rmtree(dir);
    free(dir);
}

/* A payload file that is missing or differs from its row (other bytes of
 * the same length, or another length) fails the open with STRATA_EIO and
 * changes nothing: the database stays at schema 2, the files stay, and the
 * open succeeds once the file is restored. */
static void test_migrate_v2_refusals(void)
{
    static const struct {
        spoil how;
        size_t victim;
        const char *msg;
    } cases[] = {
        {SPOIL_MISSING, 1, "cannot be read"},
        {SPOIL_OTHER_BYTES, 3, "differs"},
        {SPOIL_SHORTER, 0, "differs"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char sub[1024], path[4096];
        char *dir = fresh_dir(sub, sizeof(sub));
        CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
        strata_diag d;
        spoil how = cases[c].how;
        size_t victim = cases[c].victim;
        CU_ASSERT_EQUAL_FATAL(build_v2(sub, how, victim), 0);
        for (int attempt = 0; attempt < 2; attempt++) {
            strata_store *s = (strata_store *)&d;
            CU_ASSERT_EQUAL(strata_store_open(sub, &s, &d), STRATA_EIO);
            CU_ASSERT_PTR_NULL(s);
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, cases[c].msg));
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "schema 3"));
            CU_ASSERT_EQUAL(schema_version(sub), 2);
            CU_ASSERT_EQUAL(table_exists(sub, "payloads"), 0);
            CU_ASSERT_EQUAL(db_int(sub, "SELECT count(*) FROM updates"), (int64_t)N_V2);
            CU_ASSERT(v2_files_untouched(sub, how, victim));
            state_path(sub, STRATA_STORE_FILE_UPDATE, 2, 2, path, sizeof(path));
            strcat(path, ".tmp.Ab12Cd");
            CU_ASSERT(path_exists(path));
        }
        /* Restored, the file migrates. */
        const v2_update *u = &V2_UPDATES[victim];
        uint8_t *p = v2_payload(victim);
        state_path(sub, STRATA_STORE_FILE_UPDATE, u->round, u->client, path, sizeof(path));
        CU_ASSERT_EQUAL(write_file(path, p, u->len), 0);
        strata_store *s = open_store(sub);
        CU_ASSERT_PTR_NOT_NULL(s);
        uint8_t *buf = NULL;
        size_t len = 0;
        CU_ASSERT_EQUAL(strata_store_update_read(s, u->round, u->client, &buf, &len, &d),
                        STRATA_OK);
        CU_ASSERT(buf != NULL && len == u->len && memcmp(buf, p, len) == 0);
        free(buf);
        free(p);
        strata_store_close(s);
        CU_ASSERT_EQUAL(schema_version(sub), 3);
        CU_ASSERT(
            !path_exists(state_path(sub, STRATA_STORE_FILE_UPDATES, 0, 0, path, sizeof(path))));
        strata_test_rmtree(dir);
        free(dir);
    }
}

/* A database written by a newer build is refused with a clear error, and
 * left alone. */
static void test_schema_newer(void)
{
    char sub[1024];
    char *dir = fresh_dir(sub, sizeof(sub));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_diag d;
    strata_store *s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_store_close(s);
    CU_ASSERT_EQUAL(schema_version(sub), STRATA_STORE_SCHEMA_VERSION);

    CU_ASSERT_EQUAL(db_exec(sub, "UPDATE schema_version SET version = 99"), SQLITE_OK);
    for (int attempt = 0; attempt < 2; attempt++) {
        /* The refusal released the lock: it refuses again for the version. */
        s = (strata_store *)&d;
        CU_ASSERT_EQUAL(strata_store_open(sub, &s, &d), STRATA_ESTATE);
        CU_ASSERT_PTR_NULL(s);
        CU_ASSERT(strstr(d.msg, "99") != NULL && strstr(d.msg, "newer") != NULL);
        CU_ASSERT_EQUAL(schema_version(sub), 99);
    }
    /* Schema version 4, the next one, is newer too. */
    CU_ASSERT_EQUAL(db_exec(sub, "UPDATE schema_version SET version = 4"), SQLITE_OK);
    CU_ASSERT_EQUAL(strata_store_open(sub, &s, &d), STRATA_ESTATE);
    /* A version below 1 is no schema. */
    CU_ASSERT_EQUAL(db_exec(sub, "UPDATE schema_version SET version = 0"), SQLITE_OK);
    CU_ASSERT_EQUAL(strata_store_open(sub, &s, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(db_exec(sub, "UPDATE schema_version SET version = 3"), SQLITE_OK);
    s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL(s);
    strata_store_close(s);

    strata_test_rmtree(dir);
    free(dir);
}

/* ---- Permissions -------------------------------------------------------- */

/* The mode bits of path, or -1. */
static int mode_of(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

/* state.db and its write-ahead log and shared-memory files are 0600 whatever
 * the umask, and an open makes them so again. */
static void test_db_permissions(void)
{
    char sub[1024], db[4096], file[4200];
    char *dir = fresh_dir(sub, sizeof(sub));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    mode_t old = umask(022);
    strata_store *s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    state_path(sub, STRATA_STORE_FILE_DB, 0, 0, db, sizeof(db));
    static const char *const suffixes[] = {"", "-wal", "-shm"};
    int seen = 0;
    for (size_t i = 0; i < 3; i++) {
        snprintf(file, sizeof(file), "%s%s", db, suffixes[i]);
        if (!path_exists(file))
            continue;
        seen++;
        CU_ASSERT_EQUAL(mode_of(file), 0600);
    }
    CU_ASSERT(seen >= 1);
    CU_ASSERT_EQUAL(mode_of(state_path(sub, STRATA_STORE_FILE_LOCK, 0, 0, file, sizeof(file))),
                    0600);
    strata_store_close(s);
    /* Left readable by others (an older run, a copy): fixed on open. */
    CU_ASSERT_EQUAL(chmod(db, 0644), 0);
    s = open_store(sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(mode_of(db), 0600);
    snprintf(file, sizeof(file), "%s-wal", db);
    if (path_exists(file))
        CU_ASSERT_EQUAL(mode_of(file), 0600);
    strata_store_close(s);
    umask(old);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- Recovery of checkpoint temporary files ----------------------------- */

static void test_recovery_checkpoint_temps(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_diag d;
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    char ckpt[4096];
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 3, ckpt, sizeof(ckpt), &d), STRATA_OK);
    CU_ASSERT_EQUAL(write_file(ckpt, "model", 5), 0);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 3, &d), STRATA_OK);
    strata_store_close(s);

    /* What interrupted checkpoint writes (temp-then-rename) leave behind,
     * beside files that are not temporary. */
    char tmp[3][4200], keep[2][4200], base[4096];
    state_path(dir, STRATA_STORE_FILE_CHECKPOINT, 4, 0, base, sizeof(base));
    snprintf(tmp[0], sizeof(tmp[0]), "%s.tmp.Zz99Yy", base);
    state_path(dir, STRATA_STORE_FILE_SERVER_OPT, 4, 0, base, sizeof(base));
    snprintf(tmp[1], sizeof(tmp[1]), "%s.tmp.Q1w2E3", base);
    state_path(dir, STRATA_STORE_FILE_DELTA, 4, 0, base, sizeof(base));
    snprintf(tmp[2], sizeof(tmp[2]), "%s.tmp.abcdef", base);
    snprintf(keep[0], sizeof(keep[0]), "%s", ckpt);
    state_path(dir, STRATA_STORE_FILE_CHECKPOINTS, 0, 0, base, sizeof(base));
    snprintf(keep[1], sizeof(keep[1]), "%s/README", base);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(write_file(tmp[i], "half", 4), 0);
    CU_ASSERT_EQUAL(write_file(keep[1], "x", 1), 0);

    s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_recovered_files(s), 3);
    for (int i = 0; i < 3; i++)
        CU_ASSERT(!path_exists(tmp[i]));
    CU_ASSERT(file_is(keep[0], "model", 5));
    CU_ASSERT(path_exists(keep[1]));
    uint64_t version = 0;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &version, &found, &d), STRATA_OK);
    CU_ASSERT(found == 1 && version == 3);
    /* A secondary recovers nothing; the next open has nothing left to. */
    strata_store *sec = NULL;
    CU_ASSERT_EQUAL(write_file(tmp[0], "half", 4), 0);
    CU_ASSERT_EQUAL_FATAL(strata_store_open_secondary(s, &sec, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_recovered_files(sec), 0);
    CU_ASSERT(path_exists(tmp[0]));
    strata_store_close(sec);
    strata_store_close(s);
    s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_recovered_files(s), 1);
    strata_store_close(s);
    s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_recovered_files(s), 0);
    strata_store_close(s);

    strata_test_rmtree(dir);
    free(dir);
}

/* ---- Failures only the database produces -------------------------------- */

/* A payload changed, shortened or lost behind the store's back reads as
 * STRATA_EIO (corruption), never as other bytes or as no update. */
static void test_read_detects_corruption(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_diag d;
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    uint8_t h[32];
    uint64_t ids[3];
    for (int i = 0; i < 3; i++) {
        token_hash(i + 1, h);
        CU_ASSERT_EQUAL_FATAL(strata_store_client_add(s, h, NULL, NULL, &ids[i], NULL, &d),
                              STRATA_OK);
    }
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 3, 0, NULL, &d), STRATA_OK);
    strata_store_receipt r;
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL_FATAL(
            strata_store_update_put(s, 1, ids[i], (const uint8_t *)"abc", 3, 1, &r, NULL, &d),
            STRATA_OK);
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "UPDATE payloads SET body = X'616264' WHERE seq = (SELECT seq FROM updates WHERE "
             "client_id = %" PRIu64 ");"
             "UPDATE payloads SET body = X'6162' WHERE seq = (SELECT seq FROM updates WHERE "
             "client_id = %" PRIu64 ");"
             "DELETE FROM payloads WHERE seq = (SELECT seq FROM updates WHERE client_id = %" PRIu64
             ");",
             ids[0], ids[1], ids[2]);
    CU_ASSERT_EQUAL(db_exec(dir, sql), SQLITE_OK);
    for (int i = 0; i < 3; i++) {
        uint8_t *buf = (uint8_t *)&d;
        size_t len = 9;
        CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[i], &buf, &len, &d), STRATA_EIO);
        CU_ASSERT(strstr(d.msg, "differs") != NULL);
        CU_ASSERT_PTR_NULL(buf);
        CU_ASSERT_EQUAL(len, 0);
    }
    /* The rows are still listed: the upload was acknowledged. */
    strata_store_update *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 3);
    strata_store_update_list_free(list, n);
    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

/* A write that fails inside a group commit (here a trigger makes the
 * database refuse one payload) rolls the whole batch back: no item is
 * stored, every result is the error, no receipt is given; the same happens
 * to a single put, whose verdict stays ACCEPTED's 0. */
static void test_group_commit_database_failure(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    strata_diag d;
    strata_store *s = open_store(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    uint8_t h[32];
    uint64_t ids[3];
    for (int i = 0; i < 3; i++) {
        token_hash(i + 1, h);
        CU_ASSERT_EQUAL_FATAL(strata_store_client_add(s, h, NULL, NULL, &ids[i], NULL, &d),
                              STRATA_OK);
    }
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 3, 0, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(db_exec(dir, "CREATE TRIGGER refuse BEFORE INSERT ON payloads"
                                       " WHEN NEW.body = CAST('seven' AS BLOB)"
                                       " BEGIN SELECT RAISE(ABORT, 'injected failure'); END"),
                          SQLITE_OK);

    strata_store_pending *p[3] = {NULL, NULL, NULL};
    const char *text[3] = {"five", "seven", "nine"};
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL_FATAL(strata_store_update_prepare(s, 1, ids[i], (const uint8_t *)text[i],
                                                          strlen(text[i]), 1, &p[i], &d),
                              STRATA_OK);
    strata_store_receipt rec[3];
    strata_store_verdict ver[3];
    int res[3];
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 3, rec, ver, res, &d), STRATA_EIO);
    CU_ASSERT(strstr(d.msg, "injected failure") != NULL);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(res[i], STRATA_EIO);
        CU_ASSERT_EQUAL(ver[i], STRATA_STORE_ACCEPTED);
        CU_ASSERT_EQUAL(rec[i].id[0], '\0');
        CU_ASSERT_EQUAL(rec[i].bytes, 0);
    }
    strata_store_update *list = NULL;
    size_t n = 9;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT_EQUAL(db_int(dir, "SELECT count(*) FROM payloads"), 0);
    strata_store_verdict v = (strata_store_verdict)99;
    CU_ASSERT_EQUAL(
        strata_store_update_put(s, 1, ids[1], (const uint8_t *)"seven", 5, 1, &rec[0], &v, &d),
        STRATA_EIO);
    CU_ASSERT_EQUAL(v, STRATA_STORE_ACCEPTED);
    CU_ASSERT_EQUAL(rec[0].id[0], '\0');
    CU_ASSERT_EQUAL(db_int(dir, "SELECT count(*) FROM updates"), 0);

    /* Once the database takes writes again, the batch is stored anew. */
    CU_ASSERT_EQUAL_FATAL(db_exec(dir, "DROP TRIGGER refuse"), SQLITE_OK);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL_FATAL(strata_store_update_prepare(s, 1, ids[i], (const uint8_t *)text[i],
                                                          strlen(text[i]), 1, &p[i], &d),
                              STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 3, rec, ver, res, &d), STRATA_OK);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(res[i], STRATA_OK);
        CU_ASSERT_EQUAL(ver[i], STRATA_STORE_ACCEPTED);
    }
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 3);
    strata_store_update_list_free(list, n);
    strata_store_close(s);
    strata_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"state directory paths", test_paths},
        {"open, reopen, layout, bad arguments", test_open_reopen},
        {"the directory lock: one primary, in this process or another", test_lock},
        {"schema 1 is migrated", test_migrate_v1},
        {"schema 2's payload files move into the database", test_migrate_v2},
        {"schema 2 with a missing or different payload file is refused unchanged",
         test_migrate_v2_refusals},
        {"a newer schema version is refused", test_schema_newer},
        {"state.db is 0600", test_db_permissions},
        {"recovery removes checkpoint temporary files", test_recovery_checkpoint_temps},
        {"update read detects a corrupted payload", test_read_detects_corruption},
        {"a database failure in a group commit stores nothing", test_group_commit_database_failure},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"store (sqlite)", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
