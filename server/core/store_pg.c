/* The PostgreSQL backend of the store (libpq): running statements,
 * opening (the state directory's lock, the connection, the primary's
 * advisory lock, the schema and its migrations, the prepared statements)
 * and closing, transactions, the helpers the table families share
 * (store_pg.h) and the backend's operations table. The SQL lives in
 * store_pg_sql.c, the tables in store_pg_tables.c and store_pg_updates.c. */
#include "store_pg.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- Parameters and results ---------------------------------------------- */

void strata__pg_int(pg_params *p, int64_t x)
{
    snprintf(p->num[p->n], sizeof(p->num[p->n]), "%" PRId64, x);
    p->v[p->n] = p->num[p->n];
    p->len[p->n] = 0;
    p->fmt[p->n] = 0;
    p->n++;
}

void strata__pg_text(pg_params *p, const char *s)
{
    p->v[p->n] = s;
    p->len[p->n] = 0;
    p->fmt[p->n] = 0;
    p->n++;
}

void strata__pg_bytes(pg_params *p, const void *b, size_t n)
{
    p->v[p->n] = (const char *)b;
    p->len[p->n] = (int)n;
    p->fmt[p->n] = 1;
    p->n++;
}

/* STRATA_EIO with what and the connection's (or the result's) message. */
static int pg_error(pg_store *s, const PGresult *r, const char *what, strata_diag *diag)
{
    const char *msg = r != NULL ? PQresultErrorMessage(r) : "";
    if (msg == NULL || msg[0] == '\0')
        msg = PQerrorMessage(s->conn);
    char clean[400];
    snprintf(clean, sizeof(clean), "%s", msg != NULL ? msg : "?");
    size_t n = strlen(clean);
    while (n > 0 && (clean[n - 1] == '\n' || clean[n - 1] == ' '))
        clean[--n] = '\0';
    return strata_diag_set(diag, STRATA_EIO, "%s: %s (PostgreSQL)", what, clean);
}

/* The name a connection prepares statement id under. */
static void stmt_name(int id, char name[16])
{
    snprintf(name, 16, "s%d", id);
}

/* Prepared statement id with p, or (id < 0) the text sql. */
static PGresult *run_once(pg_store *s, int id, const pg_params *p, int binary, const char *sql)
{
    if (id < 0)
        return PQexec(s->conn, sql);
    char name[16];
    stmt_name(id, name);
    return PQexecPrepared(s->conn, name, p != NULL ? p->n : 0, p != NULL ? p->v : NULL,
                          p != NULL ? p->len : NULL, p != NULL ? p->fmt : NULL, binary);
}

/* run_once on a ready connection. libpq learns that a connection broke
 * (the database server went down since the last statement) only from the
 * statement that fails on it: a statement that ran alone (a read, a BEGIN,
 * the session lock's try) did nothing, so it runs once more on a new
 * connection. Inside a transaction the transaction is lost and the
 * caller's write fails; the next one reconnects. NULL when not ready. */
static PGresult *run_ready(pg_store *s, int id, const pg_params *p, int binary, const char *sql,
                           ExecStatusType want, strata_diag *diag)
{
    if (strata__pg_ready(s, diag) < 0)
        return NULL;
    PGresult *r = run_once(s, id, p, binary, sql);
    if ((r == NULL || PQresultStatus(r) != want) && !s->in_tx &&
        PQstatus(s->conn) == CONNECTION_BAD) {
        PQclear(r);
        r = NULL;
        if (strata__pg_ready(s, diag) == STRATA_OK)
            r = run_once(s, id, p, binary, sql);
    }
    return r;
}

PGresult *strata__pg_query(pg_store *s, const char *sql, strata_diag *diag)
{
    PGresult *r = run_ready(s, -1, NULL, 0, sql, PGRES_TUPLES_OK, diag);
    if (r == NULL || PQresultStatus(r) != PGRES_TUPLES_OK) {
        pg_error(s, r, sql, diag);
        PQclear(r);
        return NULL;
    }
    return r;
}

PGresult *strata__pg_run(pg_store *s, int id, const pg_params *p, int binary, int rows,
                         const char *what, strata_diag *diag)
{
    ExecStatusType want = rows ? PGRES_TUPLES_OK : PGRES_COMMAND_OK;
    PGresult *r = run_ready(s, id, p, binary, NULL, want, diag);
    if (r == NULL || PQresultStatus(r) != want) {
        pg_error(s, r, what, diag);
        PQclear(r);
        return NULL;
    }
    return r;
}

int strata__pg_exec(pg_store *s, int id, const pg_params *p, const char *what, strata_diag *diag)
{
    PGresult *r = strata__pg_run(s, id, p, 0, 0, what, diag);
    if (r == NULL)
        return STRATA_EIO;
    PQclear(r);
    return STRATA_OK;
}

int64_t strata__pg_col_int(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

int strata__pg_query_int(pg_store *s, int id, const pg_params *p, int64_t *value, int *is_null,
                         const char *what, strata_diag *diag)
{
    *value = 0;
    if (is_null != NULL)
        *is_null = 1;
    PGresult *r = strata__pg_run(s, id, p, 0, 1, what, diag);
    if (r == NULL)
        return STRATA_EIO;
    if (PQntuples(r) > 0 && !PQgetisnull(r, 0, 0)) {
        *value = strata__pg_col_int(r, 0, 0);
        if (is_null != NULL)
            *is_null = 0;
    }
    PQclear(r);
    return STRATA_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes the "\x..." text of a bytea into out (cap bytes at most); the
 * number of bytes, or -1 when it is not that form or too long. */
static long unhex(const char *t, uint8_t *out, size_t cap)
{
    if (t[0] != '\\' || t[1] != 'x')
        return -1;
    size_t n = strlen(t + 2);
    if (n % 2 != 0 || n / 2 > cap)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval(t[2 + 2 * i]), lo = hexval(t[3 + 2 * i]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return (long)(n / 2);
}

int strata__pg_col_bytes(const PGresult *r, int row, int col, uint8_t *out, size_t len)
{
    if (PQgetisnull(r, row, col))
        return -1;
    return unhex(PQgetvalue(r, row, col), out, len) == (long)len ? 0 : -1;
}

char *strata__pg_col_bytes_dup(const PGresult *r, int row, int col, size_t *len, int *oom)
{
    *len = 0;
    if (PQgetisnull(r, row, col))
        return NULL;
    const char *t = PQgetvalue(r, row, col);
    size_t cap = strlen(t) / 2 + 1;
    char *d = malloc(cap);
    if (d == NULL) {
        *oom = 1;
        return NULL;
    }
    long n = unhex(t, (uint8_t *)d, cap - 1);
    if (n < 0) {
        free(d);
        return NULL;
    }
    d[n] = '\0';
    *len = (size_t)n;
    return d;
}

char *strata__pg_col_dup(const PGresult *r, int row, int col, int *oom)
{
    if (PQgetisnull(r, row, col))
        return NULL;
    char *d = strdup(PQgetvalue(r, row, col));
    if (d == NULL)
        *oom = 1;
    return d;
}

/* ---- Transactions -------------------------------------------------------- */

int strata__pg_tx_begin(pg_store *s, strata_diag *diag)
{
    int rc = strata__pg_exec(s, P_BEGIN, NULL, "BEGIN", diag);
    if (rc < 0)
        return rc;
    s->in_tx = 1;
    s->notify = 0;
    PGresult *r = strata__pg_run(s, P_WRITE_LOCK, NULL, 0, 1, "take the store's write lock", diag);
    if (r == NULL) {
        strata__pg_tx_rollback(s);
        return STRATA_EIO;
    }
    PQclear(r);
    if (s->epoch > 0) { /* the fence: still the leader of our epoch? */
        r = strata__pg_run(s, P_LEADER_EPOCH, NULL, 0, 1, "read the leader's epoch", diag);
        if (r == NULL) {
            strata__pg_tx_rollback(s);
            return STRATA_EIO;
        }
        int64_t now = PQntuples(r) > 0 ? strata__pg_col_int(r, 0, 0) : 0;
        int rc = STRATA_OK;
        if (now != s->epoch)
            rc = strata_diag_set(diag, STRATA_ESTATE,
                                 "fenced: %s leads the store (epoch %" PRId64
                                 "), no longer this coordinator (epoch %" PRId64 ")",
                                 PQntuples(r) > 0 ? PQgetvalue(r, 0, 1) : "nobody", now, s->epoch);
        PQclear(r);
        if (rc < 0) {
            strata__pg_tx_rollback(s);
            return rc;
        }
    }
    return STRATA_OK;
}

int strata__pg_tx_commit(pg_store *s, strata_diag *diag)
{
    if (s->notify != 0) { /* delivered to the listeners when the commit is */
        static const char letters[] = "crum";
        char what[8];
        size_t n = 0;
        for (unsigned i = 0; i < 4; i++)
            if (s->notify & (1u << i))
                what[n++] = letters[i];
        what[n] = '\0';
        pg_params p = {.n = 0};
        strata__pg_text(&p, what);
        PGresult *r = strata__pg_run(s, P_NOTIFY, &p, 0, 1, "notify the store's listeners", diag);
        if (r == NULL)
            return STRATA_EIO;
        PQclear(r);
        s->notify = 0;
    }
    int rc = strata__pg_exec(s, P_COMMIT, NULL, "COMMIT", diag);
    if (rc == STRATA_OK)
        s->in_tx = 0;
    return rc;
}

void strata__pg_tx_rollback(pg_store *s)
{
    if (!s->in_tx)
        return;
    PGresult *r = PQexec(s->conn, "ROLLBACK");
    PQclear(r);
    s->in_tx = 0;
}

int strata__pg_tx_end(pg_store *s, int rc, strata_diag *diag)
{
    if (rc == STRATA_OK)
        rc = strata__pg_tx_commit(s, diag);
    if (rc < 0)
        strata__pg_tx_rollback(s);
    return rc;
}

/* ---- Opening ------------------------------------------------------------ */

/* Runs sql (no parameters, possibly several statements) outside the
 * prepared set. */
static int exec_sql(pg_store *s, const char *sql, const char *what, strata_diag *diag)
{
    PGresult *r = PQexec(s->conn, sql);
    ExecStatusType st = r != NULL ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    int rc =
        st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? STRATA_OK : pg_error(s, r, what, diag);
    PQclear(r);
    return rc;
}

/* A one-value query outside the prepared set: *value (-1 for NULL or no
 * row), or the text into text (len bytes) when text is not NULL. */
static int query_one(pg_store *s, const char *sql, int64_t *value, char *text, size_t len,
                     strata_diag *diag)
{
    PGresult *r = PQexec(s->conn, sql);
    if (r == NULL || PQresultStatus(r) != PGRES_TUPLES_OK) {
        int rc = pg_error(s, r, sql, diag);
        PQclear(r);
        return rc;
    }
    int null = PQntuples(r) == 0 || PQgetisnull(r, 0, 0);
    if (value != NULL)
        *value = null ? -1 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    if (text != NULL)
        snprintf(text, len, "%s", null ? "" : PQgetvalue(r, 0, 0));
    PQclear(r);
    return STRATA_OK;
}

/* Creates the schema in an empty schema, checks the version of an existing
 * one (migrating older versions, oldest first, in the same transaction) and
 * refuses a newer one or foreign tables. */
static int check_schema(pg_store *s, int may_create, strata_diag *diag)
{
    char schema[256];
    int64_t have, tables, version;
    int rc = query_one(s, "SELECT current_schema()", NULL, schema, sizeof(schema), diag);
    if (rc < 0)
        return rc;
    if (schema[0] == '\0')
        return strata_diag_set(diag, STRATA_ESTATE,
                               "the database connection's search_path names no existing schema");
    if ((rc = strata__pg_tx_begin(s, diag)) < 0)
        return rc;
    rc = query_one(s, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()", &tables,
                   NULL, 0, diag);
    if (rc == STRATA_OK)
        rc = query_one(s,
                       "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
                       " AND tablename = 'schema_version'",
                       &have, NULL, 0, diag);
    if (rc < 0)
        goto out;
    if (have == 0) {
        if (tables != 0 || !may_create) {
            rc = strata_diag_set(diag, STRATA_ESTATE,
                                 "schema %s of the database is not a Strata store (no "
                                 "schema_version table)",
                                 schema);
            goto out;
        }
        if ((rc = exec_sql(s, strata__pg_schema_v1, "create the schema", diag)) < 0)
            goto out;
    }
    if ((rc = query_one(s, "SELECT max(version) FROM schema_version", &version, NULL, 0, diag)) < 0)
        goto out;
    if (version > STRATA__PG_SCHEMA_VERSION) {
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "schema %s has store schema version %" PRId64
                             ", newer than the version %d this build supports; refusing to open it",
                             schema, version, STRATA__PG_SCHEMA_VERSION);
        goto out;
    }
    if (version < 1) {
        rc = strata_diag_set(diag, STRATA_ESTATE, "schema %s has no valid store schema version",
                             schema);
        goto out;
    }
    for (int64_t v = version; v < STRATA__PG_SCHEMA_VERSION && rc == STRATA_OK; v++)
        rc = exec_sql(s, strata__pg_migrations[v], "migrate the schema", diag);
    if (rc == STRATA_OK)
        rc = strata__pg_tx_commit(s, diag);
out:
    if (rc < 0)
        strata__pg_tx_rollback(s);
    return rc;
}

/* Prepares statements [from, to). */
static int prepare(pg_store *s, int from, int to, strata_diag *diag)
{
    int rc = STRATA_OK;
    for (int i = from; rc == STRATA_OK && i < to; i++) {
        char name[16];
        stmt_name(i, name);
        PGresult *r = PQprepare(s->conn, name, strata__pg_stmt_sql[i], 0, NULL);
        if (r == NULL || PQresultStatus(r) != PGRES_COMMAND_OK)
            rc = pg_error(s, r, "prepare", diag);
        PQclear(r);
    }
    return rc;
}

/* The session's settings. A leader paused in the middle of a transaction
 * (holding the write lock) loses its session after 5 s, so that the others
 * may go on. */
static int setup_session(pg_store *s, strata_diag *diag)
{
    return exec_sql(s,
                    "SET synchronous_commit = on; SET client_min_messages = warning;"
                    " SET idle_in_transaction_session_timeout = '5s'",
                    "set up the session", diag);
}

/* Connects and prepares the transaction statements (those that name the
 * tables follow once the schema is there). A connection attempt gives up
 * after CONNECT_TIMEOUT_S unless the connection string sets its own
 * connect_timeout (libpq's default is to wait for the operating system's
 * TCP timeout, minutes, and the store may be reached with the engine's lock
 * held). */
#define CONNECT_TIMEOUT_S "10"
static int connect_db(pg_store *s, strata_diag *diag)
{
    const char *const keys[] = {"connect_timeout", "dbname", NULL};
    const char *const vals[] = {CONNECT_TIMEOUT_S, s->conninfo, NULL};
    s->conn = PQconnectdbParams(keys, vals, 1); /* the string's own values win */
    if (s->conn == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "PQconnectdb: out of memory");
    if (PQstatus(s->conn) != CONNECTION_OK)
        return pg_error(s, NULL, "connect to the database", diag);
    int rc = setup_session(s, diag);
    return rc == STRATA_OK ? prepare(s, 0, P_ROLLBACK + 1, diag) : rc;
}

static int listen_channel(pg_store *s, strata_diag *diag);

int strata__pg_ready(pg_store *s, strata_diag *diag)
{
    if (PQstatus(s->conn) == CONNECTION_OK && !s->stale)
        return STRATA_OK;
    if (s->in_tx) /* its statements fail; the caller rolls back, then we reconnect */
        return strata_diag_set(diag, STRATA_EIO,
                               "the connection to the database was lost in a transaction");
    /* The server restarted, failed over or was cut off: the session, its
     * prepared statements and its session lock are gone. The leader's
     * lock is taken again at a renewal; a standby that gets it first
     * after a restart of the database server lets it go again and waits
     * for the lease (store_pg_leader.c). */
    s->session_lock = 0;
    PQreset(s->conn);
    if (PQstatus(s->conn) != CONNECTION_OK)
        return pg_error(s, NULL, "reconnect to the database", diag);
    int rc = setup_session(s, diag);
    if (rc == STRATA_OK)
        rc = prepare(s, 0, N_PG_STMT, diag);
    if (rc == STRATA_OK && s->listening)
        rc = listen_channel(s, diag);
    s->missed |= s->listening; /* what was sent while the session was gone is lost */
    s->stale = rc < 0; /* a half-set-up session is not used: the next call resets it again */
    return rc;
}

/* ---- Change notifications ------------------------------------------------- */

/* LISTEN on the store's channel (its name read once, quoted here). */
static int listen_channel(pg_store *s, strata_diag *diag)
{
    if (s->channel[0] == '\0') {
        PGresult *r = strata__pg_run(s, P_CHANNEL, NULL, 0, 1, "name the store's channel", diag);
        if (r == NULL)
            return STRATA_EIO;
        snprintf(s->channel, sizeof(s->channel), "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
    }
    char *id = PQescapeIdentifier(s->conn, s->channel, strlen(s->channel));
    if (id == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    char sql[128];
    snprintf(sql, sizeof(sql), "LISTEN %s", id);
    PQfreemem(id);
    return exec_sql(s, sql, "listen to the store's channel", diag);
}

int strata__pg_changes_listen(strata_store *base, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    int rc = strata__pg_ready(s, diag);
    if (rc == STRATA_OK)
        rc = listen_channel(s, diag);
    if (rc == STRATA_OK)
        s->listening = 1;
    return rc;
}

/* Takes the notifications libpq has read into *out; 1 when there was one. */
static int take_notes(pg_store *s, strata_store_changes *out)
{
    int any = 0;
    PGnotify *n;
    while ((n = PQnotifies(s->conn)) != NULL) {
        const char *w = n->extra != NULL ? n->extra : "";
        out->clients |= strchr(w, 'c') != NULL;
        out->rounds |= strchr(w, 'r') != NULL;
        out->updates |= strchr(w, 'u') != NULL;
        out->models |= strchr(w, 'm') != NULL;
        any = 1;
        PQfreemem(n);
    }
    return any;
}

int strata__pg_changes_wait(strata_store *base, int timeout_ms, strata_store_changes *out,
                            strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    if (!s->listening)
        return strata_diag_set(diag, STRATA_EINVAL, "changes wait: the store does not listen");
    int rc = strata__pg_ready(s, diag);
    if (rc < 0)
        return rc;
    if (s->missed) {
        s->missed = 0;
        *out = (strata_store_changes){1, 1, 1, 1};
        return STRATA_OK;
    }
    if (PQconsumeInput(s->conn) == 0)
        return pg_error(s, NULL, "read notifications", diag);
    if (take_notes(s, out))
        return STRATA_OK;
    struct pollfd pfd = {.fd = PQsocket(s->conn), .events = POLLIN};
    int pr = poll(&pfd, 1, timeout_ms);
    if (pr < 0 && errno != EINTR)
        return strata_diag_set(diag, STRATA_EIO, "poll the database connection: %s",
                               strerror(errno));
    if (pr > 0 && PQconsumeInput(s->conn) == 0)
        return pg_error(s, NULL, "read notifications", diag);
    take_notes(s, out);
    return STRATA_OK;
}

static pg_store *store_alloc(const char *conninfo, const char *dir)
{
    pg_store *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->base.ops = &strata__store_pg_ops;
    s->lock_fd = -1;
    s->conninfo = strdup(conninfo);
    s->base.dir = strdup(dir);
    if (s->conninfo == NULL || s->base.dir == NULL) {
        free(s->conninfo);
        free(s->base.dir);
        free(s);
        return NULL;
    }
    return s;
}

int strata_store_open_database(const char *database, const char *state_dir, strata_store **out,
                               strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    if (database == NULL || database[0] == '\0' || state_dir == NULL || state_dir[0] == '\0' ||
        out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "store open: NULL or empty argument");
    if (strlen(state_dir) > 3000)
        return strata_diag_set(diag, STRATA_EINVAL, "store open: state directory path too long");
    pg_store *s = store_alloc(database, state_dir);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = strata__store_lock_dir(state_dir, &s->lock_fd, diag);
    if (rc == STRATA_OK)
        rc = connect_db(s, diag);
    if (rc == STRATA_OK)
        rc = check_schema(s, 1, diag);
    if (rc == STRATA_OK)
        rc = prepare(s, P_ROLLBACK + 1, N_PG_STMT, diag);
    if (rc == STRATA_OK)
        rc = strata__store_recover_files(&s->base, diag);
    if (rc < 0) {
        strata__pg_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return STRATA_OK;
}

int strata__pg_open_secondary(const strata_store *primary, strata_store **out, strata_diag *diag)
{
    const pg_store *p = (const pg_store *)primary;
    pg_store *s = store_alloc(p->conninfo, primary->dir);
    if (s == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = connect_db(s, diag);
    if (rc == STRATA_OK)
        rc = check_schema(s, 0, diag);
    if (rc == STRATA_OK)
        rc = prepare(s, P_ROLLBACK + 1, N_PG_STMT, diag);
    if (rc < 0) {
        strata__pg_close(&s->base);
        return rc;
    }
    s->epoch = p->epoch; /* writes as the primary's leadership, fenced alike */
    memcpy(s->holder, p->holder, sizeof(s->holder));
    *out = &s->base;
    return STRATA_OK;
}

void strata__pg_close(strata_store *base)
{
    pg_store *s = (pg_store *)base;
    if (s == NULL)
        return;
    PQfinish(s->conn); /* ends the session: its advisory locks go with it */
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    free(s->conninfo);
    free(s->base.dir);
    free(s);
}

const strata_store_ops strata__store_pg_ops = {
    .name = "postgresql",
    .open_secondary = strata__pg_open_secondary,
    .close = strata__pg_close,
    .client_add = strata__pg_client_add,
    .registration_find = strata__pg_registration_find,
    .client_get = strata__pg_client_get,
    .client_find = strata__pg_client_find,
    .client_count = strata__pg_client_count,
    .clients_seen = strata__pg_clients_seen,
    .round_open = strata__pg_round_open,
    .round_get = strata__pg_round_get,
    .round_close = strata__pg_round_close,
    .round_seal = strata__pg_round_seal,
    .last_round = strata__pg_last_round,
    .round_list = strata__pg_round_list,
    .update_commit = strata__pg_update_commit,
    .update_list = strata__pg_update_list,
    .update_find = strata__pg_update_find,
    .update_read = strata__pg_update_read,
    .checkpoint_record = strata__pg_checkpoint_record,
    .latest_model_version = strata__pg_latest_model_version,
    .counter_add_many = strata__pg_counter_add_many,
    .counter_get = strata__pg_counter_get,
    .lead = strata__pg_lead,
    .renew = strata__pg_renew,
    .leader_get = strata__pg_leader_get,
    .changes_listen = strata__pg_changes_listen,
    .changes_wait = strata__pg_changes_wait,
    .file_fetch = strata__pg_file_fetch,
    .file_remove = strata__pg_file_remove,
};
