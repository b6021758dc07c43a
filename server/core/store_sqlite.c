/* The SQLite backend of the store (the embedded default: one state
 * directory on one machine): the schema and its migrations, the prepared
 * statements, opening (layout, directory lock, SQLite connection) and
 * closing, transactions, the small helpers the table families share
 * (store_sqlite.h) and the backend's operations table. The tables live in
 * store_sqlite_clients.c, store_sqlite_rounds.c and
 * store_sqlite_updates.c; the migration of payload files in
 * store_sqlite_migrate.c. */
#include "store_sqlite.h"

#include "strata/fileio.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- Schema and statements -------------------------------------------- */

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

/* Version 2: registration ids, so that a repeated registration (an answer
 * lost to a crash or a cut link) gets the same client. */
static const char migrate_v2[] =
    "CREATE TABLE registrations("
    " registration_id TEXT PRIMARY KEY,"
    " client_id INTEGER NOT NULL UNIQUE REFERENCES clients(id)) WITHOUT ROWID;"
    "UPDATE schema_version SET version = 2;";

/* Version 3: payload bodies in the database (one synchronous commit makes a
 * whole batch of uploads durable) instead of one fsync'ed file each under
 * updates/<round>/<client>.bin; migrate_payload_files moves existing files
 * in. */
static const char migrate_v3[] = "CREATE TABLE payloads("
                                 " seq INTEGER PRIMARY KEY REFERENCES updates(seq),"
                                 " body BLOB NOT NULL);"
                                 "UPDATE schema_version SET version = 3;";

#define ROUND_COLUMNS                                                                              \
    "round, model_version, state, opened_ms, deadline_ms, closed_ms, task, summary,"               \
    " (SELECT count(*) FROM round_clients c WHERE c.round = r.round),"                             \
    " (SELECT count(*) FROM updates u WHERE u.round = r.round)"

static const char *const stmt_sql[N_STMT] = {
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_CLIENT_INSERT] = "INSERT INTO clients(token_hash, name, created_ms, last_seen_ms)"
                        " VALUES(?1, ?2, ?3, ?3)",
    [S_CLIENT_BY_TOKEN] = "SELECT id, token_hash, name, created_ms, last_seen_ms FROM clients"
                          " WHERE token_hash = ?1",
    [S_CLIENT_BY_ID] = "SELECT id, token_hash, name, created_ms, last_seen_ms FROM clients"
                       " WHERE id = ?1",
    [S_CLIENT_COUNT] = "SELECT count(*) FROM clients",
    [S_CLIENT_TOUCH] = "UPDATE clients SET last_seen_ms = ?2 WHERE id = ?1",
    [S_CLIENT_SET_TOKEN] = "UPDATE clients SET token_hash = ?2 WHERE id = ?1",
    [S_REGISTRATION_GET] = "SELECT client_id FROM registrations WHERE registration_id = ?1",
    [S_REGISTRATION_INSERT] =
        "INSERT INTO registrations(registration_id, client_id) VALUES(?1, ?2)",
    [S_ROUND_MAX] = "SELECT max(round) FROM rounds",
    [S_ROUND_OPEN_ANY] = "SELECT round FROM rounds WHERE state = 0 LIMIT 1",
    [S_ROUND_INSERT] =
        "INSERT INTO rounds(round, model_version, state, opened_ms, deadline_ms, task)"
        " VALUES(?1, ?2, 0, ?3, ?4, ?5)",
    [S_ROUND_SEL_INSERT] = "INSERT INTO round_clients(round, client_id) VALUES(?1, ?2)",
    [S_ROUND_GET] = "SELECT " ROUND_COLUMNS " FROM rounds r WHERE round = ?1",
    [S_ROUND_LIST] = "SELECT " ROUND_COLUMNS " FROM rounds r WHERE round >= ?1 ORDER BY round"
                     " LIMIT ?2",
    [S_ROUND_SELECTED] = "SELECT client_id FROM round_clients WHERE round = ?1 ORDER BY client_id",
    [S_ROUND_CLOSE] = "UPDATE rounds SET state = 1, closed_ms = ?2, summary = ?3"
                      " WHERE round = ?1 AND state = 0",
    /* 0 open, 1 closed, 2 sealed (open, closed_ms set by the seal). */
    [S_ROUND_STATE] = "SELECT CASE WHEN state <> 0 THEN 1 WHEN closed_ms <> 0 THEN 2 ELSE 0 END"
                      " FROM rounds WHERE round = ?1",
    [S_ROUND_SEAL] = "UPDATE rounds SET closed_ms = ?2 WHERE round = ?1 AND state = 0"
                     " AND closed_ms = 0",
    [S_IS_SELECTED] = "SELECT 1 FROM round_clients WHERE round = ?1 AND client_id = ?2",
    [S_UPDATE_GET] = "SELECT receipt, sha256, bytes, samples, received_ms FROM updates"
                     " WHERE round = ?1 AND client_id = ?2",
    [S_UPDATE_INSERT] = "INSERT INTO updates(round, client_id, receipt, sha256, bytes, samples,"
                        " received_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [S_UPDATE_LIST] = "SELECT client_id, receipt, sha256, bytes, samples, received_ms FROM updates"
                      " WHERE round = ?1 ORDER BY seq LIMIT -1 OFFSET ?2",
    [S_PAYLOAD_INSERT] = "INSERT INTO payloads(seq, body) VALUES(?1, ?2)",
    /* LEFT JOIN: an update whose payload row is missing is corruption
     * (STRATA_EIO), not "no such update". */
    [S_PAYLOAD_GET] = "SELECT u.bytes, u.sha256, p.body FROM updates u LEFT JOIN payloads p"
                      " ON p.seq = u.seq WHERE u.round = ?1 AND u.client_id = ?2",
    [S_UPDATE_COUNT] = "SELECT count(*) FROM updates WHERE round = ?1",
    [S_CKPT_RECORD] = "INSERT OR REPLACE INTO checkpoints(model_version, bytes, recorded_ms)"
                      " VALUES(?1, ?2, ?3)",
    [S_CKPT_LATEST] = "SELECT max(model_version) FROM checkpoints",
    [S_COUNTER_GET] = "SELECT value FROM counters WHERE name = ?1",
    [S_COUNTER_SET] = "INSERT INTO counters(name, value) VALUES(?1, ?2)"
                      " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
    [S_COUNTER_LIST] = "SELECT name, value FROM counters ORDER BY name",
};

/* ---- Small helpers ------------------------------------------------------ */

int strata__store_db_error(sq_store *s, strata_diag *diag, const char *what)
{
    return strata_diag_set(diag, STRATA_EIO, "%s: %s (SQLite error %d)", what,
                           sqlite3_errmsg(s->db), sqlite3_extended_errcode(s->db));
}

/* The prepared statement id, ready to bind (statements are always reset
 * after use). */
sqlite3_stmt *strata__store_stmt(sq_store *s, int id)
{
    return s->st[id];
}

void strata__store_stmt_done(sqlite3_stmt *st)
{
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

/* Runs a statement that returns no row. */
int strata__store_exec_stmt(sq_store *s, int id, strata_diag *diag, const char *what)
{
    sqlite3_stmt *st = strata__store_stmt(s, id);
    int rc = sqlite3_step(st);
    int ret = rc == SQLITE_DONE ? STRATA_OK : strata__store_db_error(s, diag, what);
    strata__store_stmt_done(st);
    return ret;
}

int strata__store_tx_commit(sq_store *s, strata_diag *diag)
{
    return strata__store_exec_stmt(s, S_COMMIT, diag, "COMMIT");
}

/* Rolls back the open transaction, if any; keeps the caller's diagnostic. */
void strata__store_tx_rollback(sq_store *s)
{
    if (!sqlite3_get_autocommit(s->db))
        strata__store_exec_stmt(s, S_ROLLBACK, NULL, "ROLLBACK");
}

int strata__store_set_sync(sq_store *s, int full, strata_diag *diag)
{
    if (s->sync_full == full)
        return STRATA_OK;
    /* Not a reusable prepared statement: SQLite applies a PRAGMA's setting
     * when the statement is compiled, so stepping it again need not. */
    char *err = NULL;
    if (sqlite3_exec(s->db, full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL",
                     NULL, NULL, &err) != SQLITE_OK) {
        int rc = strata_diag_set(diag, STRATA_EIO, "PRAGMA synchronous: %s", err ? err : "?");
        sqlite3_free(err);
        return rc;
    }
    s->sync_full = full;
    return STRATA_OK;
}

/* Starts a write transaction whose COMMIT is fsync'ed (full) or not. Every
 * write transaction says which, so a failed switch back cannot leave a later
 * acknowledgement without its fsync. */
int strata__store_tx_begin_sync(sq_store *s, int full, strata_diag *diag)
{
    int rc = strata__store_set_sync(s, full, diag);
    if (rc < 0)
        return rc;
    return strata__store_exec_stmt(s, S_BEGIN, diag, "BEGIN IMMEDIATE");
}

int strata__store_tx_begin(sq_store *s, strata_diag *diag)
{
    return strata__store_tx_begin_sync(s, 1, diag);
}

int strata__store_join(char *buf, size_t len, strata_diag *diag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len)
        return strata_diag_set(diag, STRATA_ETOOBIG, "path does not fit in %zu bytes", len);
    return STRATA_OK;
}

char *strata__store_dup_column_text(sqlite3_stmt *st, int col, int *oom)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    if (t == NULL)
        return NULL;
    char *d = strdup((const char *)t);
    if (d == NULL)
        *oom = 1;
    return d;
}

int strata__store_query_int(sq_store *s, int id, int nkeys, int64_t k1, int64_t k2, int64_t *value,
                            int *is_null, const char *what, strata_diag *diag)
{
    sqlite3_stmt *st = strata__store_stmt(s, id);
    if (nkeys >= 1)
        sqlite3_bind_int64(st, 1, k1);
    if (nkeys >= 2)
        sqlite3_bind_int64(st, 2, k2);
    int step = sqlite3_step(st), rc = STRATA_OK;
    *value = 0;
    if (is_null != NULL)
        *is_null = 1;
    if (step == SQLITE_ROW) {
        if (is_null != NULL)
            *is_null = sqlite3_column_type(st, 0) == SQLITE_NULL;
        *value = sqlite3_column_int64(st, 0);
    } else if (step != SQLITE_DONE) {
        rc = strata__store_db_error(s, diag, what);
    }
    strata__store_stmt_done(st);
    return rc;
}

/* ---- Opening ------------------------------------------------------------ */

static int prepare_all(sq_store *s, strata_diag *diag)
{
    for (int i = 0; i < N_STMT; i++) {
        if (sqlite3_prepare_v3(s->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i],
                               NULL) != SQLITE_OK)
            return strata__store_db_error(s, diag, "prepare");
    }
    return STRATA_OK;
}

static int exec_sql(sq_store *s, const char *sql, strata_diag *diag)
{
    char *err = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &err) != SQLITE_OK) {
        int rc = strata_diag_set(diag, STRATA_EIO, "%s: %s", sql, err ? err : "?");
        sqlite3_free(err);
        return rc;
    }
    return STRATA_OK;
}

/* Runs a one-value query; *value is -1 when the result is NULL or no row. */
static int query_int(sq_store *s, const char *sql, int64_t *value, strata_diag *diag)
{
    sqlite3_stmt *st = NULL;
    *value = -1;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return strata__store_db_error(s, diag, sql);
    int rc = sqlite3_step(st);
    int ret = STRATA_OK;
    if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        *value = sqlite3_column_int64(st, 0);
    else if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        ret = strata__store_db_error(s, diag, sql);
    sqlite3_finalize(st);
    return ret;
}

/* Creates the schema in an empty database, checks the version of an existing
 * one (migrating older versions, oldest first, in one transaction) and refuses a newer one. */
static int check_schema(sq_store *s, int may_create, strata_diag *diag)
{
    int64_t have, tables, version;
    int rc = exec_sql(s, "BEGIN IMMEDIATE", diag);
    if (rc < 0)
        return rc;
    rc = query_int(s,
                   "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = "
                   "'schema_version'",
                   &have, diag);
    if (rc < 0)
        goto out;
    if (have == 0) {
        rc = query_int(s, "SELECT count(*) FROM sqlite_schema", &tables, diag);
        if (rc < 0)
            goto out;
        if (tables != 0 || !may_create) {
            rc = strata_diag_set(diag, STRATA_ESTATE,
                                 "%s/state.db is not a Strata state database (no schema_version)",
                                 s->base.dir);
            goto out;
        }
        rc = exec_sql(s, schema_v1, diag);
        if (rc < 0)
            goto out;
    }
    rc = query_int(s, "SELECT max(version) FROM schema_version", &version, diag);
    if (rc < 0)
        goto out;
    if (version > STRATA_STORE_SCHEMA_VERSION) {
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "%s/state.db has schema version %" PRId64
                             ", newer than the version %d this build supports; refusing to open it",
                             s->base.dir, version, STRATA_STORE_SCHEMA_VERSION);
        goto out;
    }
    if (version < 1) {
        rc = strata_diag_set(diag, STRATA_ESTATE, "%s/state.db has no valid schema version",
                             s->base.dir);
        goto out;
    }
    /* Migrations, oldest first, in the same transaction. */
    if (version < 2 && (rc = exec_sql(s, migrate_v2, diag)) < 0)
        goto out;
    if (version < 3 && ((rc = exec_sql(s, migrate_v3, diag)) < 0 ||
                        (rc = strata__store_migrate_payload_files(s, diag)) < 0))
        goto out;
    rc = exec_sql(s, "COMMIT", diag);
    if (rc == STRATA_OK && version < 3)
        strata__store_remove_payload_files(s);
out:
    /* The prepared statements do not exist yet. */
    if (rc < 0 && !sqlite3_get_autocommit(s->db))
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

static int connect_db(sq_store *s, int may_create, strata_diag *diag)
{
    char path[4096];
    int rc = strata_store_path(s->base.dir, STRATA_STORE_FILE_DB, 0, 0, path, sizeof(path), diag);
    if (rc < 0)
        return rc;
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (may_create ? SQLITE_OPEN_CREATE : 0);
    if (sqlite3_open_v2(path, &s->db, flags, NULL) != SQLITE_OK) {
        if (s->db == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "sqlite3_open_v2: out of memory");
        return strata__store_db_error(s, diag, path);
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);
    /* The page size of a database created now (no-op on an existing one):
     * large enough that a typical payload fits one page, so that a group
     * commit writes few pages to the write-ahead log. */
    rc = exec_sql(s, "PRAGMA page_size = " STRATA__STORE_PAGE_SIZE, diag);
    if (rc < 0)
        return rc;

    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "PRAGMA journal_mode = WAL", -1, &st, NULL) != SQLITE_OK)
        return strata__store_db_error(s, diag, "PRAGMA journal_mode");
    int step = sqlite3_step(st);
    const unsigned char *mode = step == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
    int wal = mode != NULL && strcmp((const char *)mode, "wal") == 0;
    sqlite3_finalize(st);
    if (!wal)
        return strata_diag_set(diag, STRATA_EIO, "%s: cannot switch to WAL mode", path);
    rc = exec_sql(s, "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON", diag);
    if (rc < 0)
        return rc;
    s->sync_full = 1;
    rc = check_schema(s, may_create, diag);
    if (rc < 0)
        return rc;
    return prepare_all(s, diag);
}

/* Makes the database and its WAL and shared-memory files 0600 (SQLite
 * creates them with the umask's permissions, and an older run may have left
 * them readable by others). Errors: STRATA_EIO when one cannot be changed. */
static int private_db_files(const sq_store *s, strata_diag *diag)
{
    static const char *const suffixes[] = {"", "-wal", "-shm"};
    char db[4096], path[4200];
    int rc = strata_store_path(s->base.dir, STRATA_STORE_FILE_DB, 0, 0, db, sizeof(db), diag);
    for (size_t i = 0; rc == STRATA_OK && i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        snprintf(path, sizeof(path), "%s%s", db, suffixes[i]);
        if (chmod(path, 0600) < 0 && errno != ENOENT)
            rc = strata_diag_set(diag, STRATA_EIO, "chmod %s: %s", path, strerror(errno));
    }
    return rc;
}

static sq_store *store_alloc(const char *dir)
{
    sq_store *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->base.ops = &strata__store_sqlite_ops;
    s->lock_fd = -1;
    s->base.dir = strdup(dir);
    if (s->base.dir == NULL) {
        free(s);
        return NULL;
    }
    return s;
}

int strata_store_open(const char *state_dir, strata_store **out, strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    if (state_dir == NULL || state_dir[0] == '\0' || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "store open: NULL or empty argument");
    if (strlen(state_dir) > 3000)
        return strata_diag_set(diag, STRATA_EINVAL, "store open: state directory path too long");

    sq_store *s = store_alloc(state_dir);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = strata__store_lock_dir(state_dir, &s->lock_fd, diag);
    if (rc < 0)
        goto fail;
    rc = connect_db(s, 1, diag);
    if (rc == STRATA_OK)
        rc = private_db_files(s, diag);
    if (rc < 0)
        goto fail;
    rc = strata__store_recover_files(&s->base, diag);
    if (rc < 0)
        goto fail;
    *out = &s->base;
    return STRATA_OK;
fail:
    strata__sqlite_close(&s->base);
    return rc;
}

int strata__sqlite_open_secondary(const strata_store *primary, strata_store **out,
                                  strata_diag *diag)
{
    sq_store *s = store_alloc(primary->dir);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = connect_db(s, 0, diag);
    if (rc < 0) {
        strata__sqlite_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return STRATA_OK;
}

void strata__sqlite_close(strata_store *base)
{
    sq_store *s = (sq_store *)base;
    if (s == NULL)
        return;
    for (int i = 0; i < N_STMT; i++)
        sqlite3_finalize(s->st[i]);
    sqlite3_close(s->db);
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* releases the flock */
    free(s->base.dir);
    free(s);
}

const strata_store_ops strata__store_sqlite_ops = {
    .name = "sqlite",
    .open_secondary = strata__sqlite_open_secondary,
    .close = strata__sqlite_close,
    .client_add = strata__sqlite_client_add,
    .registration_find = strata__sqlite_registration_find,
    .client_get = strata__sqlite_client_get,
    .client_find = strata__sqlite_client_find,
    .client_count = strata__sqlite_client_count,
    .clients_seen = strata__sqlite_clients_seen,
    .round_open = strata__sqlite_round_open,
    .round_get = strata__sqlite_round_get,
    .round_close = strata__sqlite_round_close,
    .round_seal = strata__sqlite_round_seal,
    .last_round = strata__sqlite_last_round,
    .round_list = strata__sqlite_round_list,
    .update_commit = strata__sqlite_update_commit,
    .update_list = strata__sqlite_update_list,
    .update_find = strata__sqlite_update_find,
    .update_read = strata__sqlite_update_read,
    .checkpoint_record = strata__sqlite_checkpoint_record,
    .latest_model_version = strata__sqlite_latest_model_version,
    .counter_add_many = strata__sqlite_counter_add_many,
    .counter_get = strata__sqlite_counter_get,
};
