#include "store.h"

#include "strata/hash.h"

#include <sqlite3.h>

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

enum {
    S_BEGIN,
    S_COMMIT,
    S_ROLLBACK,
    S_CLIENT_INSERT,
    S_CLIENT_BY_TOKEN,
    S_CLIENT_BY_ID,
    S_CLIENT_COUNT,
    S_CLIENT_TOUCH,
    S_JSON_VALID,
    S_ROUND_MAX,
    S_ROUND_OPEN_ANY,
    S_ROUND_INSERT,
    S_ROUND_SEL_INSERT,
    S_ROUND_GET,
    S_ROUND_LIST,
    S_ROUND_SELECTED,
    S_ROUND_CLOSE,
    S_ROUND_STATE,
    S_IS_SELECTED,
    S_UPDATE_GET,
    S_UPDATE_INSERT,
    S_UPDATE_LIST,
    S_UPDATE_COUNT,
    S_CKPT_RECORD,
    S_CKPT_LATEST,
    S_COUNTER_GET,
    S_COUNTER_SET,
    S_COUNTER_LIST,
    N_STMT
};

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
    [S_JSON_VALID] = "SELECT json_valid(?1)",
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
    [S_ROUND_STATE] = "SELECT state FROM rounds WHERE round = ?1",
    [S_IS_SELECTED] = "SELECT 1 FROM round_clients WHERE round = ?1 AND client_id = ?2",
    [S_UPDATE_GET] = "SELECT receipt, sha256, bytes, samples, received_ms FROM updates"
                     " WHERE round = ?1 AND client_id = ?2",
    [S_UPDATE_INSERT] = "INSERT INTO updates(round, client_id, receipt, sha256, bytes, samples,"
                        " received_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [S_UPDATE_LIST] = "SELECT client_id, receipt, sha256, bytes, samples, received_ms FROM updates"
                      " WHERE round = ?1 ORDER BY seq",
    [S_UPDATE_COUNT] = "SELECT count(*) FROM updates WHERE round = ?1",
    [S_CKPT_RECORD] = "INSERT OR REPLACE INTO checkpoints(model_version, bytes, recorded_ms)"
                      " VALUES(?1, ?2, ?3)",
    [S_CKPT_LATEST] = "SELECT max(model_version) FROM checkpoints",
    [S_COUNTER_GET] = "SELECT value FROM counters WHERE name = ?1",
    [S_COUNTER_SET] = "INSERT INTO counters(name, value) VALUES(?1, ?2)"
                      " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
    [S_COUNTER_LIST] = "SELECT name, value FROM counters ORDER BY name",
};

struct strata_store {
    sqlite3 *db;
    sqlite3_stmt *st[N_STMT];
    char *dir;
    int lock_fd; /* -1 for a secondary */
    int sync_full;
    size_t recovered;
};

#define BUSY_TIMEOUT_MS 10000
#define FITS_I64(v) ((uint64_t)(v) <= (uint64_t)INT64_MAX)

/* ---- Small helpers ------------------------------------------------------ */

static void diag_clear(strata_diag *diag)
{
    if (diag != NULL)
        diag->msg[0] = '\0';
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int db_error(strata_store *s, strata_diag *diag, const char *what)
{
    return strata_diag_set(diag, STRATA_EIO, "%s: %s (SQLite error %d)", what,
                           sqlite3_errmsg(s->db), sqlite3_extended_errcode(s->db));
}

/* The prepared statement id, ready to bind (statements are always reset
 * after use). */
static sqlite3_stmt *stmt(strata_store *s, int id)
{
    return s->st[id];
}

static void stmt_done(sqlite3_stmt *st)
{
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

/* Runs a statement that returns no row. */
static int exec_stmt(strata_store *s, int id, strata_diag *diag, const char *what)
{
    sqlite3_stmt *st = stmt(s, id);
    int rc = sqlite3_step(st);
    int ret = rc == SQLITE_DONE ? STRATA_OK : db_error(s, diag, what);
    stmt_done(st);
    return ret;
}

static int tx_commit(strata_store *s, strata_diag *diag)
{
    return exec_stmt(s, S_COMMIT, diag, "COMMIT");
}

/* Rolls back the open transaction, if any; keeps the caller's diagnostic. */
static void tx_rollback(strata_store *s)
{
    if (!sqlite3_get_autocommit(s->db))
        exec_stmt(s, S_ROLLBACK, NULL, "ROLLBACK");
}

static int set_sync(strata_store *s, int full, strata_diag *diag)
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
static int tx_begin_sync(strata_store *s, int full, strata_diag *diag)
{
    int rc = set_sync(s, full, diag);
    if (rc < 0)
        return rc;
    return exec_stmt(s, S_BEGIN, diag, "BEGIN IMMEDIATE");
}

static int tx_begin(strata_store *s, strata_diag *diag)
{
    return tx_begin_sync(s, 1, diag);
}

static int fsync_dir(const char *path, strata_diag *diag)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "open directory %s: %s", path, strerror(errno));
    /* Some file systems cannot fsync a directory and say EINVAL. */
    int rc = STRATA_OK;
    if (fsync(fd) < 0 && errno != EINVAL)
        rc = strata_diag_set(diag, STRATA_EIO, "fsync directory %s: %s", path, strerror(errno));
    close(fd);
    return rc;
}

/* mkdir that accepts an existing directory; *created says whether it made one. */
static int make_dir(const char *path, int *created, strata_diag *diag)
{
    *created = 0;
    if (mkdir(path, 0700) == 0) {
        *created = 1;
        return STRATA_OK;
    }
    struct stat st;
    if (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return STRATA_OK;
    return strata_diag_set(diag, STRATA_EIO, "mkdir %s: %s", path, strerror(errno));
}

static int join(char *buf, size_t len, strata_diag *diag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int join(char *buf, size_t len, strata_diag *diag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len)
        return strata_diag_set(diag, STRATA_ETOOBIG, "path does not fit in %zu bytes", len);
    return STRATA_OK;
}

static char *dup_column_text(sqlite3_stmt *st, int col, int *oom)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    if (t == NULL)
        return NULL;
    char *d = strdup((const char *)t);
    if (d == NULL)
        *oom = 1;
    return d;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int random_receipt(char out[STRATA_STORE_RECEIPT_LEN + 1], strata_diag *diag)
{
    uint8_t r[STRATA_STORE_RECEIPT_LEN / 2];
    size_t got = 0;
    while (got < sizeof(r)) {
        ssize_t n = getrandom(r + got, sizeof(r) - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return strata_diag_set(diag, STRATA_EIO, "getrandom: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof(r); i++) {
        out[2 * i] = hex[r[i] >> 4];
        out[2 * i + 1] = hex[r[i] & 15];
    }
    out[STRATA_STORE_RECEIPT_LEN] = '\0';
    return STRATA_OK;
}

/* Parses a non-empty string of decimal digits without leading zeros (except
 * "0") that fits in max; the rest of the name must equal suffix. */
static int parse_number(const char *name, const char *suffix, uint64_t max, uint64_t *out)
{
    const char *p = name;
    uint64_t v = 0;
    if (!isdigit((unsigned char)*p) || (p[0] == '0' && isdigit((unsigned char)p[1])))
        return 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (max - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    if (strcmp(p, suffix) != 0)
        return 0;
    *out = v;
    return 1;
}

/* ---- Opening ------------------------------------------------------------ */

static int prepare_all(strata_store *s, strata_diag *diag)
{
    for (int i = 0; i < N_STMT; i++) {
        if (sqlite3_prepare_v3(s->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i],
                               NULL) != SQLITE_OK)
            return db_error(s, diag, "prepare");
    }
    return STRATA_OK;
}

static int exec_sql(strata_store *s, const char *sql, strata_diag *diag)
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
static int query_int(strata_store *s, const char *sql, int64_t *value, strata_diag *diag)
{
    sqlite3_stmt *st = NULL;
    *value = -1;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return db_error(s, diag, sql);
    int rc = sqlite3_step(st);
    int ret = STRATA_OK;
    if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        *value = sqlite3_column_int64(st, 0);
    else if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        ret = db_error(s, diag, sql);
    sqlite3_finalize(st);
    return ret;
}

/* Creates the schema in an empty database, checks the version of an existing
 * one (migrating older versions would happen here) and refuses a newer one. */
static int check_schema(strata_store *s, int may_create, strata_diag *diag)
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
                                 s->dir);
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
                             s->dir, version, STRATA_STORE_SCHEMA_VERSION);
        goto out;
    }
    if (version < 1) {
        rc =
            strata_diag_set(diag, STRATA_ESTATE, "%s/state.db has no valid schema version", s->dir);
        goto out;
    }
    /* Version 1 is the first; migrations from older versions go here. */
    rc = exec_sql(s, "COMMIT", diag);
out:
    /* The prepared statements do not exist yet. */
    if (rc < 0 && !sqlite3_get_autocommit(s->db))
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

static int connect_db(strata_store *s, int may_create, strata_diag *diag)
{
    char path[4096];
    int rc = join(path, sizeof(path), diag, "%s/state.db", s->dir);
    if (rc < 0)
        return rc;
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (may_create ? SQLITE_OPEN_CREATE : 0);
    if (sqlite3_open_v2(path, &s->db, flags, NULL) != SQLITE_OK) {
        if (s->db == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "sqlite3_open_v2: out of memory");
        return db_error(s, diag, path);
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);

    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "PRAGMA journal_mode = WAL", -1, &st, NULL) != SQLITE_OK)
        return db_error(s, diag, "PRAGMA journal_mode");
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

/* Removes the update files that have no committed row and leftover
 * temporary files in one round directory. */
static int recover_round_dir(strata_store *s, int rfd, const char *path, uint32_t round,
                             strata_diag *diag)
{
    DIR *d = fdopendir(rfd);
    if (d == NULL) {
        close(rfd);
        return strata_diag_set(diag, STRATA_EIO, "opendir %s: %s", path, strerror(errno));
    }
    int rc = STRATA_OK;
    size_t removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint64_t client;
        int orphan = 0;
        if (strstr(e->d_name, ".tmp.") != NULL) {
            orphan = 1;
        } else if (parse_number(e->d_name, ".bin", INT64_MAX, &client)) {
            sqlite3_stmt *st = stmt(s, S_UPDATE_GET);
            sqlite3_bind_int64(st, 1, round);
            sqlite3_bind_int64(st, 2, (int64_t)client);
            int step = sqlite3_step(st);
            if (step != SQLITE_ROW && step != SQLITE_DONE)
                rc = db_error(s, diag, "recovery: look up update");
            stmt_done(st);
            if (rc < 0)
                break;
            orphan = step == SQLITE_DONE;
        }
        if (orphan) {
            if (unlinkat(dirfd(d), e->d_name, 0) < 0) {
                rc = strata_diag_set(diag, STRATA_EIO, "remove %s/%s: %s", path, e->d_name,
                                     strerror(errno));
                break;
            }
            removed++;
        }
    }
    if (rc == STRATA_OK && removed > 0 && fsync(dirfd(d)) < 0 && errno != EINVAL)
        rc = strata_diag_set(diag, STRATA_EIO, "fsync directory %s: %s", path, strerror(errno));
    closedir(d);
    s->recovered += removed;
    return rc;
}

static int recover(strata_store *s, strata_diag *diag)
{
    char path[4096], sub[4096];
    int rc = join(path, sizeof(path), diag, "%s/updates", s->dir);
    if (rc < 0)
        return rc;
    DIR *d = opendir(path);
    if (d == NULL)
        return strata_diag_set(diag, STRATA_EIO, "opendir %s: %s", path, strerror(errno));
    struct dirent *e;
    while (rc == STRATA_OK && (e = readdir(d)) != NULL) {
        uint64_t round;
        if (!parse_number(e->d_name, "", UINT32_MAX, &round))
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            continue; /* not a directory: not ours */
        rc = join(sub, sizeof(sub), diag, "%s/%s", path, e->d_name);
        if (rc == STRATA_OK)
            rc = recover_round_dir(s, fd, sub, (uint32_t)round, diag);
        else
            close(fd);
    }
    closedir(d);
    if (rc < 0)
        return rc;

    /* Temporary files of an interrupted checkpoint write. */
    rc = join(path, sizeof(path), diag, "%s/checkpoints", s->dir);
    if (rc < 0)
        return rc;
    d = opendir(path);
    if (d == NULL)
        return strata_diag_set(diag, STRATA_EIO, "opendir %s: %s", path, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, ".tmp.") != NULL && unlinkat(dirfd(d), e->d_name, 0) == 0)
            s->recovered++;
    }
    closedir(d);
    return STRATA_OK;
}

static strata_store *store_alloc(const char *dir)
{
    strata_store *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->lock_fd = -1;
    s->dir = strdup(dir);
    if (s->dir == NULL) {
        free(s);
        return NULL;
    }
    return s;
}

int strata_store_open(const char *state_dir, strata_store **out, strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    if (state_dir == NULL || state_dir[0] == '\0' || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "store open: NULL or empty argument");
    if (strlen(state_dir) > 3000)
        return strata_diag_set(diag, STRATA_EINVAL, "store open: state directory path too long");

    strata_store *s = store_alloc(state_dir);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    char path[4096];
    int created, any = 0, rc = make_dir(state_dir, &created, diag);
    if (rc < 0)
        goto fail;
    static const char *const subdirs[] = {"updates", "checkpoints"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", state_dir, subdirs[i]);
        rc = make_dir(path, &created, diag);
        if (rc < 0)
            goto fail;
        any |= created;
    }
    if (any && (rc = fsync_dir(state_dir, diag)) < 0)
        goto fail;

    snprintf(path, sizeof(path), "%s/lock", state_dir);
    s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lock_fd < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        if (errno == EWOULDBLOCK)
            rc = strata_diag_set(diag, STRATA_ESTATE,
                                 "state directory %s is in use by another store", state_dir);
        else
            rc = strata_diag_set(diag, STRATA_EIO, "lock %s: %s", path, strerror(errno));
        goto fail;
    }
    rc = connect_db(s, 1, diag);
    if (rc < 0)
        goto fail;
    rc = recover(s, diag);
    if (rc < 0)
        goto fail;
    *out = s;
    return STRATA_OK;
fail:
    strata_store_close(s);
    return rc;
}

int strata_store_open_secondary(const strata_store *primary, strata_store **out, strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    if (primary == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "store open secondary: NULL argument");
    strata_store *s = store_alloc(primary->dir);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = connect_db(s, 0, diag);
    if (rc < 0) {
        strata_store_close(s);
        return rc;
    }
    *out = s;
    return STRATA_OK;
}

void strata_store_close(strata_store *s)
{
    if (s == NULL)
        return;
    for (int i = 0; i < N_STMT; i++)
        sqlite3_finalize(s->st[i]);
    sqlite3_close(s->db);
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* releases the flock */
    free(s->dir);
    free(s);
}

const char *strata_store_dir(const strata_store *s)
{
    return s != NULL ? s->dir : NULL;
}

size_t strata_store_recovered_files(const strata_store *s)
{
    return s != NULL ? s->recovered : 0;
}

/* ---- Clients ------------------------------------------------------------ */

static void read_client(sqlite3_stmt *st, strata_store_client *c)
{
    c->id = (uint64_t)sqlite3_column_int64(st, 0);
    const void *h = sqlite3_column_blob(st, 1);
    if (h != NULL && sqlite3_column_bytes(st, 1) == STRATA_STORE_HASH_LEN)
        memcpy(c->token_hash, h, STRATA_STORE_HASH_LEN);
    const unsigned char *name = sqlite3_column_text(st, 2);
    snprintf(c->name, sizeof(c->name), "%s", name ? (const char *)name : "");
    c->created_unix_ms = sqlite3_column_int64(st, 3);
    c->last_seen_unix_ms = sqlite3_column_int64(st, 4);
}

/* Runs S_CLIENT_BY_TOKEN or S_CLIENT_BY_ID, already bound. */
static int fetch_client(strata_store *s, sqlite3_stmt *st, strata_store_client *out, int *found,
                        strata_diag *diag)
{
    int step = sqlite3_step(st), rc = STRATA_OK;
    if (step == SQLITE_ROW) {
        *found = 1;
        if (out != NULL)
            read_client(st, out);
    } else if (step != SQLITE_DONE) {
        rc = db_error(s, diag, "look up client");
    }
    stmt_done(st);
    return rc;
}

int strata_store_client_add(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                            const char *name, uint64_t *client_id, strata_diag *diag)
{
    diag_clear(diag);
    if (client_id != NULL)
        *client_id = 0;
    if (s == NULL || token_hash == NULL || client_id == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client add: NULL argument");
    if (name == NULL)
        name = "";
    size_t nlen = strlen(name);
    if (nlen > STRATA_STORE_NAME_MAX)
        return strata_diag_set(diag, STRATA_EINVAL, "client name longer than %d bytes",
                               STRATA_STORE_NAME_MAX);
    for (size_t i = 0; i < nlen; i++) {
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return strata_diag_set(diag, STRATA_EINVAL, "client name contains a control character");
    }
    int rc = tx_begin(s, diag);
    if (rc < 0)
        return rc;
    int found = 0;
    sqlite3_stmt *st = stmt(s, S_CLIENT_BY_TOKEN);
    sqlite3_bind_blob(st, 1, token_hash, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
    rc = fetch_client(s, st, NULL, &found, diag);
    if (rc < 0)
        goto out;
    if (found) {
        rc = strata_diag_set(diag, STRATA_ESTATE, "a client with this token hash is registered");
        goto out;
    }
    st = stmt(s, S_CLIENT_INSERT);
    sqlite3_bind_blob(st, 1, token_hash, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, (int)nlen, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now_ms());
    rc = exec_stmt(s, S_CLIENT_INSERT, diag, "insert client");
    if (rc < 0)
        goto out;
    uint64_t id = (uint64_t)sqlite3_last_insert_rowid(s->db);
    rc = tx_commit(s, diag);
    if (rc == STRATA_OK)
        *client_id = id;
out:
    if (rc < 0)
        tx_rollback(s);
    return rc;
}

int strata_store_client_by_token(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                                 strata_store_client *out, int *found, strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (found != NULL)
        *found = 0;
    if (s == NULL || token_hash == NULL || out == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client by token: NULL argument");
    sqlite3_stmt *st = stmt(s, S_CLIENT_BY_TOKEN);
    sqlite3_bind_blob(st, 1, token_hash, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
    return fetch_client(s, st, out, found, diag);
}

int strata_store_client_get(strata_store *s, uint64_t client_id, strata_store_client *out,
                            int *found, strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (found != NULL)
        *found = 0;
    if (s == NULL || out == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client get: NULL argument");
    if (!FITS_I64(client_id))
        return STRATA_OK;
    sqlite3_stmt *st = stmt(s, S_CLIENT_BY_ID);
    sqlite3_bind_int64(st, 1, (int64_t)client_id);
    return fetch_client(s, st, out, found, diag);
}

/* Runs a bound statement that yields one integer. */
static int step_int(strata_store *s, int id, int64_t *value, int *is_null, const char *what,
                    strata_diag *diag)
{
    sqlite3_stmt *st = stmt(s, id);
    int step = sqlite3_step(st), rc = STRATA_OK;
    *value = 0;
    if (is_null != NULL)
        *is_null = 1;
    if (step == SQLITE_ROW) {
        if (is_null != NULL)
            *is_null = sqlite3_column_type(st, 0) == SQLITE_NULL;
        *value = sqlite3_column_int64(st, 0);
    } else if (step != SQLITE_DONE) {
        rc = db_error(s, diag, what);
    }
    stmt_done(st);
    return rc;
}

int strata_store_client_count(strata_store *s, uint64_t *count, strata_diag *diag)
{
    diag_clear(diag);
    if (count != NULL)
        *count = 0;
    if (s == NULL || count == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client count: NULL argument");
    int64_t v;
    int rc = step_int(s, S_CLIENT_COUNT, &v, NULL, "count clients", diag);
    if (rc == STRATA_OK)
        *count = (uint64_t)v;
    return rc;
}

int strata_store_client_touch(strata_store *s, uint64_t client_id, strata_diag *diag)
{
    diag_clear(diag);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client touch: NULL argument");
    if (!FITS_I64(client_id))
        return strata_diag_set(diag, STRATA_ESTATE, "no client %" PRIu64, client_id);
    int rc = set_sync(s, 0, diag);
    if (rc < 0)
        return rc;
    sqlite3_stmt *st = stmt(s, S_CLIENT_TOUCH);
    sqlite3_bind_int64(st, 1, (int64_t)client_id);
    sqlite3_bind_int64(st, 2, now_ms());
    rc = exec_stmt(s, S_CLIENT_TOUCH, diag, "touch client");
    if (rc == STRATA_OK && sqlite3_changes(s->db) == 0)
        rc = strata_diag_set(diag, STRATA_ESTATE, "no client %" PRIu64, client_id);
    int rc2 = set_sync(s, 1, rc < 0 ? NULL : diag);
    return rc < 0 ? rc : rc2;
}

/* ---- Rounds ------------------------------------------------------------- */

static int json_ok(strata_store *s, const char *json, const char *what, strata_diag *diag)
{
    if (json == NULL)
        return STRATA_OK;
    sqlite3_stmt *st = stmt(s, S_JSON_VALID);
    sqlite3_bind_text(st, 1, json, -1, SQLITE_STATIC);
    int64_t v;
    int rc = step_int(s, S_JSON_VALID, &v, NULL, "json_valid", diag);
    if (rc == STRATA_OK && v != 1)
        rc = strata_diag_set(diag, STRATA_EINVAL, "%s is not valid JSON", what);
    return rc;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int strata_store_round_open(strata_store *s, uint32_t round, uint64_t model_version,
                            const uint64_t *selected, size_t n, int64_t deadline_unix_ms,
                            const char *task_json, strata_diag *diag)
{
    diag_clear(diag);
    if (s == NULL || (selected == NULL && n > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "round open: NULL argument");
    if (n == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "round %" PRIu32 ": no client selected", round);
    if (!FITS_I64(model_version))
        return strata_diag_set(diag, STRATA_EINVAL, "model version %" PRIu64 " is too large",
                               model_version);
    if (n > SIZE_MAX / sizeof(uint64_t))
        return strata_diag_set(diag, STRATA_EINVAL, "too many selected clients");
    int rc = json_ok(s, task_json, "task", diag);
    if (rc < 0)
        return rc;
    uint64_t *sorted = malloc(n * sizeof(*sorted));
    if (sorted == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    memcpy(sorted, selected, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), cmp_u64);
    for (size_t i = 1; i < n; i++) {
        if (sorted[i] == sorted[i - 1]) {
            uint64_t twice = sorted[i];
            free(sorted);
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "round %" PRIu32 ": client %" PRIu64 " selected twice", round,
                                   twice);
        }
    }

    char dir[4096];
    int created;
    rc = tx_begin(s, diag);
    if (rc < 0)
        goto out;
    int64_t v;
    int is_null;
    rc = step_int(s, S_ROUND_MAX, &v, &is_null, "last round", diag);
    if (rc < 0)
        goto out;
    if (!is_null && v >= (int64_t)round) {
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "cannot open round %" PRIu32 ": round %" PRId64 " exists", round, v);
        goto out;
    }
    rc = step_int(s, S_ROUND_OPEN_ANY, &v, &is_null, "open round", diag);
    if (rc < 0)
        goto out;
    if (!is_null) {
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "cannot open round %" PRIu32 ": round %" PRId64 " is still open",
                             round, v);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        int found = 0;
        if (FITS_I64(sorted[i])) {
            sqlite3_stmt *st = stmt(s, S_CLIENT_BY_ID);
            sqlite3_bind_int64(st, 1, (int64_t)sorted[i]);
            rc = fetch_client(s, st, NULL, &found, diag);
            if (rc < 0)
                goto out;
        }
        if (!found) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "round %" PRIu32 ": selected client %" PRIu64 " is not registered",
                                 round, sorted[i]);
            goto out;
        }
    }
    sqlite3_stmt *st = stmt(s, S_ROUND_INSERT);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, (int64_t)model_version);
    sqlite3_bind_int64(st, 3, now_ms());
    sqlite3_bind_int64(st, 4, deadline_unix_ms);
    if (task_json != NULL)
        sqlite3_bind_text(st, 5, task_json, -1, SQLITE_STATIC);
    rc = exec_stmt(s, S_ROUND_INSERT, diag, "insert round");
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        st = stmt(s, S_ROUND_SEL_INSERT);
        sqlite3_bind_int64(st, 1, round);
        sqlite3_bind_int64(st, 2, (int64_t)sorted[i]);
        rc = exec_stmt(s, S_ROUND_SEL_INSERT, diag, "insert selected client");
    }
    if (rc < 0)
        goto out;
    /* The payload directory exists before any upload can be accepted. */
    rc = join(dir, sizeof(dir), diag, "%s/updates/%" PRIu32, s->dir, round);
    if (rc == STRATA_OK)
        rc = make_dir(dir, &created, diag);
    if (rc == STRATA_OK && created) {
        char parent[4096];
        snprintf(parent, sizeof(parent), "%s/updates", s->dir);
        rc = fsync_dir(parent, diag);
    }
    if (rc == STRATA_OK)
        rc = tx_commit(s, diag);
out:
    if (rc < 0)
        tx_rollback(s);
    free(sorted);
    return rc;
}

void strata_store_round_cleanup(strata_store_round *r)
{
    if (r == NULL)
        return;
    free(r->selected);
    free(r->task_json);
    free(r->summary_json);
    memset(r, 0, sizeof(*r));
}

/* Reads the ROUND_COLUMNS of the current row. */
static int read_round(sqlite3_stmt *st, strata_store_round *r, strata_diag *diag)
{
    int oom = 0;
    memset(r, 0, sizeof(*r));
    r->round = (uint32_t)sqlite3_column_int64(st, 0);
    r->model_version = (uint64_t)sqlite3_column_int64(st, 1);
    r->state = sqlite3_column_int(st, 2) ? STRATA_STORE_ROUND_CLOSED : STRATA_STORE_ROUND_OPEN;
    r->opened_unix_ms = sqlite3_column_int64(st, 3);
    r->deadline_unix_ms = sqlite3_column_int64(st, 4);
    r->closed_unix_ms = sqlite3_column_int64(st, 5);
    r->task_json = dup_column_text(st, 6, &oom);
    r->summary_json = dup_column_text(st, 7, &oom);
    r->n_selected = (size_t)sqlite3_column_int64(st, 8);
    r->n_updates = (uint64_t)sqlite3_column_int64(st, 9);
    if (oom) {
        strata_store_round_cleanup(r);
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    return STRATA_OK;
}

static int read_selected(strata_store *s, strata_store_round *r, strata_diag *diag)
{
    size_t cap = r->n_selected > 0 ? r->n_selected : 1, n = 0;
    r->selected = malloc(cap * sizeof(uint64_t));
    if (r->selected == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    sqlite3_stmt *st = stmt(s, S_ROUND_SELECTED);
    sqlite3_bind_int64(st, 1, r->round);
    int step, rc = STRATA_OK;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        if (n == cap) {
            uint64_t *grown = cap <= SIZE_MAX / 2 / sizeof(uint64_t)
                                  ? realloc(r->selected, 2 * cap * sizeof(uint64_t))
                                  : NULL;
            if (grown == NULL) {
                rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
                break;
            }
            r->selected = grown;
            cap *= 2;
        }
        r->selected[n++] = (uint64_t)sqlite3_column_int64(st, 0);
    }
    if (rc == STRATA_OK && step != SQLITE_DONE)
        rc = db_error(s, diag, "read selected clients");
    stmt_done(st);
    r->n_selected = n;
    return rc;
}

int strata_store_round_get(strata_store *s, uint32_t round, strata_store_round *out, int *found,
                           strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (found != NULL)
        *found = 0;
    if (s == NULL || out == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "round get: NULL argument");
    sqlite3_stmt *st = stmt(s, S_ROUND_GET);
    sqlite3_bind_int64(st, 1, round);
    int step = sqlite3_step(st), rc = STRATA_OK;
    if (step == SQLITE_ROW)
        rc = read_round(st, out, diag);
    else if (step != SQLITE_DONE)
        rc = db_error(s, diag, "read round");
    stmt_done(st);
    if (rc == STRATA_OK && step == SQLITE_ROW) {
        rc = read_selected(s, out, diag);
        if (rc < 0)
            strata_store_round_cleanup(out);
        else
            *found = 1;
    }
    return rc;
}

int strata_store_round_close(strata_store *s, uint32_t round, const char *summary_json,
                             strata_diag *diag)
{
    diag_clear(diag);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "round close: NULL argument");
    int rc = json_ok(s, summary_json, "round summary", diag);
    if (rc < 0)
        return rc;
    rc = tx_begin(s, diag);
    if (rc < 0)
        return rc;
    sqlite3_stmt *st = stmt(s, S_ROUND_CLOSE);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, now_ms());
    if (summary_json != NULL)
        sqlite3_bind_text(st, 3, summary_json, -1, SQLITE_STATIC);
    rc = exec_stmt(s, S_ROUND_CLOSE, diag, "close round");
    if (rc == STRATA_OK && sqlite3_changes(s->db) == 0) {
        int64_t state;
        int is_null;
        st = stmt(s, S_ROUND_STATE);
        sqlite3_bind_int64(st, 1, round);
        rc = step_int(s, S_ROUND_STATE, &state, &is_null, "round state", diag);
        if (rc == STRATA_OK)
            rc = strata_diag_set(diag, STRATA_ESTATE, "cannot close round %" PRIu32 ": %s", round,
                                 is_null ? "no such round" : "already closed");
    }
    if (rc == STRATA_OK)
        rc = tx_commit(s, diag);
    if (rc < 0)
        tx_rollback(s);
    return rc;
}

int strata_store_last_round(strata_store *s, uint32_t *round, int *found, strata_diag *diag)
{
    diag_clear(diag);
    if (round != NULL)
        *round = 0;
    if (found != NULL)
        *found = 0;
    if (s == NULL || round == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "last round: NULL argument");
    int64_t v;
    int is_null;
    int rc = step_int(s, S_ROUND_MAX, &v, &is_null, "last round", diag);
    if (rc == STRATA_OK && !is_null) {
        *round = (uint32_t)v;
        *found = 1;
    }
    return rc;
}

void strata_store_round_list_free(strata_store_round *rounds, size_t n)
{
    if (rounds == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        strata_store_round_cleanup(&rounds[i]);
    free(rounds);
}

int strata_store_round_list(strata_store *s, uint32_t from, size_t limit, strata_store_round **out,
                            size_t *n, strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    if (n != NULL)
        *n = 0;
    if (s == NULL || out == NULL || n == NULL || limit == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "round list: NULL argument or zero limit");
    if (limit > 100000)
        limit = 100000;
    strata_store_round *arr = calloc(limit, sizeof(*arr));
    if (arr == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    sqlite3_stmt *st = stmt(s, S_ROUND_LIST);
    sqlite3_bind_int64(st, 1, from);
    sqlite3_bind_int64(st, 2, (int64_t)limit);
    size_t k = 0;
    int step, rc = STRATA_OK;
    while (k < limit && (step = sqlite3_step(st)) == SQLITE_ROW) {
        rc = read_round(st, &arr[k], diag);
        if (rc < 0)
            break;
        k++;
    }
    if (rc == STRATA_OK && k < limit && step != SQLITE_DONE)
        rc = db_error(s, diag, "list rounds");
    stmt_done(st);
    if (rc < 0 || k == 0) {
        strata_store_round_list_free(arr, k);
        return rc;
    }
    *out = arr;
    *n = k;
    return STRATA_OK;
}

/* ---- Updates ------------------------------------------------------------ */

/* Fills r from an S_UPDATE_GET / S_UPDATE_LIST row whose receipt columns
 * start at `col`. */
static void read_receipt(sqlite3_stmt *st, int col, strata_store_receipt *r)
{
    memset(r, 0, sizeof(*r));
    const unsigned char *id = sqlite3_column_text(st, col);
    snprintf(r->id, sizeof(r->id), "%s", id ? (const char *)id : "");
    const void *h = sqlite3_column_blob(st, col + 1);
    if (h != NULL && sqlite3_column_bytes(st, col + 1) == STRATA_STORE_HASH_LEN)
        memcpy(r->sha256, h, STRATA_STORE_HASH_LEN);
    r->bytes = (uint64_t)sqlite3_column_int64(st, col + 2);
    r->samples = (uint64_t)sqlite3_column_int64(st, col + 3);
    r->received_unix_ms = sqlite3_column_int64(st, col + 4);
}

/* Looks up an existing update of (round, client); *found says whether one
 * exists. */
static int find_update(strata_store *s, uint32_t round, uint64_t client,
                       strata_store_receipt *receipt, int *found, strata_diag *diag)
{
    sqlite3_stmt *st = stmt(s, S_UPDATE_GET);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, (int64_t)client);
    int step = sqlite3_step(st), rc = STRATA_OK;
    *found = 0;
    if (step == SQLITE_ROW) {
        *found = 1;
        if (receipt != NULL)
            read_receipt(st, 0, receipt);
    } else if (step != SQLITE_DONE) {
        rc = db_error(s, diag, "look up update");
    }
    stmt_done(st);
    return rc;
}

/* Decides whether (round, client) may upload: 1 duplicate (receipt filled),
 * 0 acceptable, STRATA_ESTATE with *verdict set when refused. */
static int check_put(strata_store *s, uint32_t round, uint64_t client,
                     strata_store_receipt *receipt, strata_store_verdict *verdict,
                     strata_diag *diag)
{
    int found;
    int rc = find_update(s, round, client, receipt, &found, diag);
    if (rc < 0)
        return rc;
    if (found) {
        receipt->duplicate = 1;
        *verdict = STRATA_STORE_DUPLICATE;
        return 1;
    }
    int64_t state;
    int is_null;
    sqlite3_stmt *st = stmt(s, S_ROUND_STATE);
    sqlite3_bind_int64(st, 1, round);
    rc = step_int(s, S_ROUND_STATE, &state, &is_null, "round state", diag);
    if (rc < 0)
        return rc;
    if (is_null) {
        *verdict = STRATA_STORE_REJECT_UNKNOWN_ROUND;
        return strata_diag_set(diag, STRATA_ESTATE, "round %" PRIu32 " does not exist", round);
    }
    if (state != 0) {
        *verdict = STRATA_STORE_REJECT_ROUND_CLOSED;
        return strata_diag_set(diag, STRATA_ESTATE, "round %" PRIu32 " is closed", round);
    }
    st = stmt(s, S_IS_SELECTED);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, (int64_t)client);
    int64_t one;
    rc = step_int(s, S_IS_SELECTED, &one, &is_null, "selected client", diag);
    if (rc < 0)
        return rc;
    if (is_null) {
        *verdict = STRATA_STORE_REJECT_NOT_SELECTED;
        return strata_diag_set(diag, STRATA_ESTATE,
                               "client %" PRIu64 " is not selected for round %" PRIu32, client,
                               round);
    }
    return 0;
}

int strata_store_update_path(const strata_store *s, uint32_t round, uint64_t client_id, char *buf,
                             size_t len, strata_diag *diag)
{
    diag_clear(diag);
    if (s == NULL || buf == NULL || len == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "update path: NULL argument");
    return join(buf, len, diag, "%s/updates/%" PRIu32 "/%" PRIu64 ".bin", s->dir, round, client_id);
}

/* Writes the payload to a new temporary file next to `final`, fsync'ed and
 * closed; tmp receives its name. */
static int write_temp(const char *final, const uint8_t *p, size_t n, char *tmp, size_t tmplen,
                      strata_diag *diag)
{
    int rc = join(tmp, tmplen, diag, "%s.tmp.XXXXXX", final);
    if (rc < 0)
        return rc;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "create %s: %s", tmp, strerror(errno));
    if (write_all(fd, p, n) < 0 || fsync(fd) < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "write %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return rc;
    }
    if (close(fd) < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "close %s: %s", tmp, strerror(errno));
        unlink(tmp);
        return rc;
    }
    return STRATA_OK;
}

struct strata_store_pending {
    uint32_t round;
    uint64_t client_id;
    strata_store_receipt r; /* id, sha256, bytes, samples; received_unix_ms at commit */
    char *final;            /* updates/<round>/<client>.bin */
    char *tmp;              /* the temporary file; NULL once published */
    size_t dir_len;         /* final[0, dir_len) is the round directory */
    int published;          /* renamed to final, row not yet committed */
};

void strata_store_pending_free(strata_store_pending *p)
{
    if (p == NULL)
        return;
    if (p->tmp != NULL)
        unlink(p->tmp);
    free(p->tmp);
    free(p->final);
    free(p);
}

/* The argument checks shared by put and prepare (client ids are checked by
 * the callers, which answer differently). */
static int check_update_args(const void *s, const uint8_t *payload, size_t len, uint64_t samples,
                             const void *out, strata_diag *diag)
{
    if (s == NULL || payload == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update put: NULL argument");
    if (len == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "update put: empty payload");
    if (samples == 0 || !FITS_I64(samples) || !FITS_I64(len))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "update put: sample count %" PRIu64 " out of range", samples);
    return STRATA_OK;
}

/* The slow half of a put: directory, hash, receipt id, temporary file
 * (written and fsync'ed). Uses only s->dir. */
static int prepare_update(const strata_store *s, uint32_t round, uint64_t client_id,
                          const uint8_t *payload, size_t len, uint64_t samples,
                          strata_store_pending **out, strata_diag *diag)
{
    char final[4096], tmp[4200], dir[4096], parent[4096];
    int created;
    *out = NULL;
    int rc = join(final, sizeof(final), diag, "%s/updates/%" PRIu32 "/%" PRIu64 ".bin", s->dir,
                  round, client_id);
    if (rc < 0)
        return rc;
    strata_store_pending *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    p->round = round;
    p->client_id = client_id;
    p->dir_len = (size_t)(strrchr(final, '/') - final);
    p->final = strdup(final);
    if (p->final == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        goto fail;
    }
    memcpy(dir, final, p->dir_len);
    dir[p->dir_len] = '\0';
    /* strata_store_round_open makes the directory; this covers a put for a
     * round whose directory was lost. */
    rc = make_dir(dir, &created, diag);
    if (rc == STRATA_OK && created) {
        snprintf(parent, sizeof(parent), "%s/updates", s->dir);
        rc = fsync_dir(parent, diag);
    }
    if (rc < 0)
        goto fail;
    strata_sha256(payload, len, p->r.sha256);
    p->r.bytes = len;
    p->r.samples = samples;
    rc = random_receipt(p->r.id, diag);
    if (rc < 0)
        goto fail;
    rc = write_temp(final, payload, len, tmp, sizeof(tmp), diag);
    if (rc < 0)
        goto fail;
    p->tmp = strdup(tmp);
    if (p->tmp == NULL) {
        unlink(tmp);
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        goto fail;
    }
    *out = p;
    return STRATA_OK;
fail:
    strata_store_pending_free(p);
    return rc;
}

int strata_store_update_prepare(const strata_store *s, uint32_t round, uint64_t client_id,
                                const uint8_t *payload, size_t len, uint64_t samples,
                                strata_store_pending **out, strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    int rc = check_update_args(s, payload, len, samples, out, diag);
    if (rc < 0)
        return rc;
    if (!FITS_I64(client_id))
        return strata_diag_set(diag, STRATA_EINVAL, "client id %" PRIu64 " is too large",
                               client_id);
    return prepare_update(s, round, client_id, payload, len, samples, out, diag);
}

/* Removes the published files of a failed batch that no committed row
 * describes. Runs under the write lock (taken again after the rollback), so
 * that no other connection can be between publishing the same path and
 * committing its row; when the lock cannot be had, recovery removes the
 * files at the next open. */
static void unpublish(strata_store *s, strata_store_pending *const *p, size_t n)
{
    size_t any = 0;
    for (size_t i = 0; i < n; i++)
        any += p[i]->published;
    if (any == 0 || tx_begin(s, NULL) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        int found = 1;
        if (p[i]->published &&
            find_update(s, p[i]->round, p[i]->client_id, NULL, &found, NULL) == STRATA_OK && !found)
            unlink(p[i]->final);
        p[i]->published = 0;
    }
    tx_rollback(s);
}

/* Commits n prepared updates in one transaction (see
 * strata_store_update_commit_many). item_diag, when not NULL, receives the
 * reason of a refusal (used for a single update); diag the reason of a
 * failure of the whole batch. Frees every p[i]. */
static int commit_batch(strata_store *s, strata_store_pending *const *p, size_t n,
                        strata_store_receipt *receipts, strata_store_verdict *verdicts,
                        int *results, strata_diag *item_diag, strata_diag *diag)
{
    char path[4096];
    int rc = STRATA_OK;
    for (size_t i = 0; i < n; i++) {
        memset(&receipts[i], 0, sizeof(receipts[i]));
        verdicts[i] = STRATA_STORE_ACCEPTED;
        results[i] = STRATA_OK;
        if (p[i] == NULL) {
            rc = strata_diag_set(diag, STRATA_EINVAL, "update commit: NULL item %zu", i);
        } else if (strata_store_update_path(s, p[i]->round, p[i]->client_id, path, sizeof(path),
                                            NULL) < 0 ||
                   strcmp(path, p[i]->final) != 0) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "update commit: item %zu was prepared for another state "
                                 "directory",
                                 i);
        }
    }
    if (rc < 0)
        goto out;
    /* Under the write lock: decide (another connection may have stored an
     * update or closed the round since the caller looked), publish each
     * accepted file and insert its row; make the directories durable; then
     * one synchronous commit for the lot. */
    rc = tx_begin(s, diag);
    if (rc < 0)
        goto out;
    int64_t received = now_ms();
    for (size_t i = 0; i < n; i++) {
        strata_store_pending *q = p[i];
        strata_diag d;
        d.msg[0] = '\0';
        int c = check_put(s, q->round, q->client_id, &receipts[i], &verdicts[i], &d);
        if (c == 1)
            continue; /* a duplicate: the original receipt, STRATA_OK */
        if (c == STRATA_ESTATE && verdicts[i] != STRATA_STORE_ACCEPTED) {
            results[i] = STRATA_ESTATE;
            if (item_diag != NULL)
                *item_diag = d;
            continue;
        }
        if (c < 0) {
            rc = c;
            if (diag != NULL)
                *diag = d;
            goto out;
        }
        if (rename(q->tmp, q->final) < 0) {
            rc = strata_diag_set(diag, STRATA_EIO, "rename %s to %s: %s", q->tmp, q->final,
                                 strerror(errno));
            goto out;
        }
        free(q->tmp);
        q->tmp = NULL;
        q->published = 1;
        sqlite3_stmt *st = stmt(s, S_UPDATE_INSERT);
        sqlite3_bind_int64(st, 1, q->round);
        sqlite3_bind_int64(st, 2, (int64_t)q->client_id);
        sqlite3_bind_text(st, 3, q->r.id, -1, SQLITE_STATIC);
        sqlite3_bind_blob(st, 4, q->r.sha256, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, (int64_t)q->r.bytes);
        sqlite3_bind_int64(st, 6, (int64_t)q->r.samples);
        sqlite3_bind_int64(st, 7, received);
        rc = exec_stmt(s, S_UPDATE_INSERT, diag, "insert update");
        if (rc < 0)
            goto out;
        receipts[i] = q->r;
        receipts[i].received_unix_ms = received;
    }
    /* One fsync per directory that received a file (one per round). */
    for (size_t i = 0; i < n; i++) {
        if (!p[i]->published)
            continue;
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = p[j]->published && p[j]->dir_len == p[i]->dir_len &&
                   memcmp(p[j]->final, p[i]->final, p[i]->dir_len) == 0;
        if (seen)
            continue;
        memcpy(path, p[i]->final, p[i]->dir_len);
        path[p[i]->dir_len] = '\0';
        rc = fsync_dir(path, diag);
        if (rc < 0)
            goto out;
    }
    rc = tx_commit(s, diag);
    if (rc == STRATA_OK)
        for (size_t i = 0; i < n; i++)
            p[i]->published = 0; /* the files belong to their committed rows */
out:
    if (rc < 0) {
        tx_rollback(s);
        int have_all = 1;
        for (size_t i = 0; i < n; i++)
            have_all &= p[i] != NULL;
        if (have_all)
            unpublish(s, p, n);
        for (size_t i = 0; i < n; i++) {
            memset(&receipts[i], 0, sizeof(receipts[i]));
            verdicts[i] = STRATA_STORE_ACCEPTED;
            results[i] = rc;
        }
    }
    for (size_t i = 0; i < n; i++)
        strata_store_pending_free(p[i]);
    return rc;
}

int strata_store_update_commit(strata_store *s, strata_store_pending *p,
                               strata_store_receipt *receipt, strata_store_verdict *verdict,
                               strata_diag *diag)
{
    strata_store_verdict v_local;
    diag_clear(diag);
    if (verdict == NULL)
        verdict = &v_local;
    *verdict = STRATA_STORE_ACCEPTED;
    if (receipt != NULL)
        memset(receipt, 0, sizeof(*receipt));
    if (s == NULL || p == NULL || receipt == NULL) {
        strata_store_pending_free(p);
        return strata_diag_set(diag, STRATA_EINVAL, "update commit: NULL argument");
    }
    int result;
    int rc = commit_batch(s, &p, 1, receipt, verdict, &result, diag, diag);
    return rc < 0 ? rc : result;
}

int strata_store_update_commit_many(strata_store *s, strata_store_pending *const *p, size_t n,
                                    strata_store_receipt *receipts, strata_store_verdict *verdicts,
                                    int *results, strata_diag *diag)
{
    diag_clear(diag);
    if (n == 0)
        return STRATA_OK;
    if (s == NULL || p == NULL || receipts == NULL || verdicts == NULL || results == NULL) {
        for (size_t i = 0; p != NULL && i < n; i++)
            strata_store_pending_free(p[i]);
        for (size_t i = 0; results != NULL && i < n; i++)
            results[i] = STRATA_EINVAL;
        return strata_diag_set(diag, STRATA_EINVAL, "update commit: NULL argument");
    }
    return commit_batch(s, p, n, receipts, verdicts, results, NULL, diag);
}

int strata_store_update_put(strata_store *s, uint32_t round, uint64_t client_id,
                            const uint8_t *payload, size_t len, uint64_t samples,
                            strata_store_receipt *receipt, strata_store_verdict *verdict,
                            strata_diag *diag)
{
    strata_store_verdict v_local;
    diag_clear(diag);
    if (verdict == NULL)
        verdict = &v_local;
    *verdict = STRATA_STORE_ACCEPTED;
    if (receipt != NULL)
        memset(receipt, 0, sizeof(*receipt));
    int rc = check_update_args(s, payload, len, samples, receipt, diag);
    if (rc < 0)
        return rc;
    if (!FITS_I64(client_id)) {
        *verdict = STRATA_STORE_REJECT_NOT_SELECTED;
        return strata_diag_set(diag, STRATA_ESTATE,
                               "client %" PRIu64 " is not selected for round %" PRIu32, client_id,
                               round);
    }
    /* Cheap refusals and duplicates before any file is written. */
    rc = check_put(s, round, client_id, receipt, verdict, diag);
    if (rc != 0)
        return rc < 0 ? rc : STRATA_OK;
    strata_store_pending *p = NULL;
    rc = prepare_update(s, round, client_id, payload, len, samples, &p, diag);
    if (rc < 0)
        return rc;
    int result;
    rc = commit_batch(s, &p, 1, receipt, verdict, &result, diag, diag);
    return rc < 0 ? rc : result;
}

void strata_store_update_list_free(strata_store_update *updates, size_t n)
{
    if (updates == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free(updates[i].path);
    free(updates);
}

int strata_store_update_list(strata_store *s, uint32_t round, strata_store_update **out, size_t *n,
                             strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    if (n != NULL)
        *n = 0;
    if (s == NULL || out == NULL || n == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update list: NULL argument");
    strata_store_update *arr = NULL;
    size_t k = 0, cap = 0;
    char path[4096];
    sqlite3_stmt *st = stmt(s, S_UPDATE_LIST);
    sqlite3_bind_int64(st, 1, round);
    int step, rc = STRATA_OK;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            strata_store_update *grown =
                ncap <= SIZE_MAX / sizeof(*arr) ? realloc(arr, ncap * sizeof(*arr)) : NULL;
            if (grown == NULL) {
                rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
                break;
            }
            arr = grown;
            cap = ncap;
        }
        strata_store_update *u = &arr[k];
        memset(u, 0, sizeof(*u));
        u->round = round;
        u->client_id = (uint64_t)sqlite3_column_int64(st, 0);
        read_receipt(st, 1, &u->receipt);
        rc = strata_store_update_path(s, round, u->client_id, path, sizeof(path), diag);
        if (rc < 0)
            break;
        u->path = strdup(path);
        if (u->path == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
            break;
        }
        k++;
    }
    if (rc == STRATA_OK && step != SQLITE_DONE)
        rc = db_error(s, diag, "list updates");
    stmt_done(st);
    if (rc < 0) {
        strata_store_update_list_free(arr, k);
        return rc;
    }
    if (k == 0) {
        free(arr);
        arr = NULL;
    }
    *out = arr;
    *n = k;
    return STRATA_OK;
}

int strata_store_update_count(strata_store *s, uint32_t round, uint64_t *count, strata_diag *diag)
{
    diag_clear(diag);
    if (count != NULL)
        *count = 0;
    if (s == NULL || count == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update count: NULL argument");
    sqlite3_stmt *st = stmt(s, S_UPDATE_COUNT);
    sqlite3_bind_int64(st, 1, round);
    int64_t v;
    int rc = step_int(s, S_UPDATE_COUNT, &v, NULL, "count updates", diag);
    if (rc == STRATA_OK)
        *count = (uint64_t)v;
    return rc;
}

int strata_store_update_read(strata_store *s, uint32_t round, uint64_t client_id, uint8_t **buf,
                             size_t *len, strata_diag *diag)
{
    diag_clear(diag);
    if (buf != NULL)
        *buf = NULL;
    if (len != NULL)
        *len = 0;
    if (s == NULL || buf == NULL || len == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update read: NULL argument");
    strata_store_receipt r;
    int found = 0, rc = STRATA_OK;
    if (FITS_I64(client_id))
        rc = find_update(s, round, client_id, &r, &found, diag);
    if (rc < 0)
        return rc;
    if (!found)
        return strata_diag_set(diag, STRATA_ESTATE,
                               "no update of client %" PRIu64 " for round %" PRIu32, client_id,
                               round);
    char path[4096];
    rc = strata_store_update_path(s, round, client_id, path, sizeof(path), diag);
    if (rc < 0)
        return rc;
    if (r.bytes > SIZE_MAX)
        return strata_diag_set(diag, STRATA_ETOOBIG, "%s: too large", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "open %s: %s", path, strerror(errno));
    struct stat st;
    uint8_t *data = NULL;
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != r.bytes) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s: size differs from the acknowledged %" PRIu64,
                             path, r.bytes);
        goto out;
    }
    data = malloc((size_t)r.bytes);
    if (data == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        goto out;
    }
    size_t got = 0;
    while (got < r.bytes) {
        ssize_t k = read(fd, data + got, (size_t)r.bytes - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            rc = strata_diag_set(diag, STRATA_EIO, "read %s: %s", path,
                                 k < 0 ? strerror(errno) : "short file");
            goto out;
        }
        got += (size_t)k;
    }
    uint8_t h[STRATA_STORE_HASH_LEN];
    strata_sha256(data, got, h);
    if (memcmp(h, r.sha256, sizeof(h)) != 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s: SHA-256 differs from the acknowledged one",
                             path);
        goto out;
    }
    *buf = data;
    *len = got;
    data = NULL;
out:
    free(data);
    close(fd);
    return rc;
}

/* ---- Checkpoints -------------------------------------------------------- */

int strata_store_checkpoint_path(const strata_store *s, uint64_t model_version, char *buf,
                                 size_t len, strata_diag *diag)
{
    diag_clear(diag);
    if (s == NULL || buf == NULL || len == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "checkpoint path: NULL argument");
    return join(buf, len, diag, "%s/checkpoints/model-%" PRIu64 ".safetensors", s->dir,
                model_version);
}

int strata_store_checkpoint_record(strata_store *s, uint64_t model_version, strata_diag *diag)
{
    diag_clear(diag);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "checkpoint record: NULL argument");
    if (!FITS_I64(model_version))
        return strata_diag_set(diag, STRATA_EINVAL, "model version %" PRIu64 " is too large",
                               model_version);
    char path[4096];
    int rc = strata_store_checkpoint_path(s, model_version, path, sizeof(path), diag);
    if (rc < 0)
        return rc;
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode))
        return strata_diag_set(diag, STRATA_ESTATE, "checkpoint %s does not exist", path);
    rc = tx_begin(s, diag);
    if (rc < 0)
        return rc;
    sqlite3_stmt *q = stmt(s, S_CKPT_RECORD);
    sqlite3_bind_int64(q, 1, (int64_t)model_version);
    sqlite3_bind_int64(q, 2, (int64_t)st.st_size);
    sqlite3_bind_int64(q, 3, now_ms());
    rc = exec_stmt(s, S_CKPT_RECORD, diag, "record checkpoint");
    if (rc == STRATA_OK)
        rc = tx_commit(s, diag);
    if (rc < 0)
        tx_rollback(s);
    return rc;
}

int strata_store_latest_model_version(strata_store *s, uint64_t *model_version, int *found,
                                      strata_diag *diag)
{
    diag_clear(diag);
    if (model_version != NULL)
        *model_version = 0;
    if (found != NULL)
        *found = 0;
    if (s == NULL || model_version == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "latest model version: NULL argument");
    int64_t v;
    int is_null;
    int rc = step_int(s, S_CKPT_LATEST, &v, &is_null, "latest checkpoint", diag);
    if (rc == STRATA_OK && !is_null) {
        *model_version = (uint64_t)v;
        *found = 1;
    }
    return rc;
}

/* ---- Counters ----------------------------------------------------------- */

static int counter_name_ok(const char *name, strata_diag *diag)
{
    if (name == NULL || name[0] == '\0')
        return strata_diag_set(diag, STRATA_EINVAL, "counter name is empty");
    size_t n = strlen(name);
    if (n > STRATA_STORE_COUNTER_NAME_MAX)
        return strata_diag_set(diag, STRATA_EINVAL, "counter name longer than %d bytes",
                               STRATA_STORE_COUNTER_NAME_MAX);
    for (size_t i = 0; i < n; i++) {
        if (name[i] < 0x21 || name[i] > 0x7e)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "counter name contains a byte that is not printable ASCII");
    }
    return STRATA_OK;
}

int strata_store_counter_add_many(strata_store *s, const strata_store_counter *deltas, size_t n,
                                  strata_diag *diag)
{
    diag_clear(diag);
    if (s == NULL || (deltas == NULL && n > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "counter add: NULL argument");
    for (size_t i = 0; i < n; i++) {
        if (memchr(deltas[i].name, '\0', sizeof(deltas[i].name)) == NULL)
            return strata_diag_set(diag, STRATA_EINVAL, "counter name is not terminated");
        int rc = counter_name_ok(deltas[i].name, diag);
        if (rc < 0)
            return rc;
    }
    if (n == 0)
        return STRATA_OK;
    int rc = tx_begin_sync(s, 0, diag);
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        const char *name = deltas[i].name;
        int64_t d = deltas[i].value, cur;
        sqlite3_stmt *st = stmt(s, S_COUNTER_GET);
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        rc = step_int(s, S_COUNTER_GET, &cur, NULL, "read counter", diag);
        if (rc < 0)
            break;
        if ((d > 0 && cur > INT64_MAX - d) || (d < 0 && cur < INT64_MIN - d)) {
            rc = strata_diag_set(diag, STRATA_ETOOBIG, "counter %s would overflow", name);
            break;
        }
        st = stmt(s, S_COUNTER_SET);
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, cur + d);
        rc = exec_stmt(s, S_COUNTER_SET, diag, "write counter");
    }
    if (rc == STRATA_OK)
        rc = tx_commit(s, diag);
    if (rc < 0)
        tx_rollback(s);
    return rc;
}

int strata_store_counter_add(strata_store *s, const char *name, int64_t delta, strata_diag *diag)
{
    diag_clear(diag);
    int rc = counter_name_ok(name, diag);
    if (rc < 0)
        return rc;
    strata_store_counter c;
    snprintf(c.name, sizeof(c.name), "%s", name);
    c.value = delta;
    return strata_store_counter_add_many(s, &c, 1, diag);
}

int strata_store_counter_get(strata_store *s, const char *name, int64_t *value, strata_diag *diag)
{
    diag_clear(diag);
    if (value != NULL)
        *value = 0;
    if (s == NULL || value == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "counter get: NULL argument");
    int rc = counter_name_ok(name, diag);
    if (rc < 0)
        return rc;
    sqlite3_stmt *st = stmt(s, S_COUNTER_GET);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    return step_int(s, S_COUNTER_GET, value, NULL, "read counter", diag);
}

int strata_store_counter_list(strata_store *s, strata_store_counter **out, size_t *n,
                              strata_diag *diag)
{
    diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    if (n != NULL)
        *n = 0;
    if (s == NULL || out == NULL || n == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "counter list: NULL argument");
    strata_store_counter *arr = NULL;
    size_t k = 0, cap = 0;
    sqlite3_stmt *st = stmt(s, S_COUNTER_LIST);
    int step, rc = STRATA_OK;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            strata_store_counter *grown =
                ncap <= SIZE_MAX / sizeof(*arr) ? realloc(arr, ncap * sizeof(*arr)) : NULL;
            if (grown == NULL) {
                rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
                break;
            }
            arr = grown;
            cap = ncap;
        }
        const unsigned char *name = sqlite3_column_text(st, 0);
        snprintf(arr[k].name, sizeof(arr[k].name), "%s", name ? (const char *)name : "");
        arr[k].value = sqlite3_column_int64(st, 1);
        k++;
    }
    if (rc == STRATA_OK && step != SQLITE_DONE)
        rc = db_error(s, diag, "list counters");
    stmt_done(st);
    if (rc < 0 || k == 0) {
        free(arr);
        return rc;
    }
    *out = arr;
    *n = k;
    return STRATA_OK;
}
