/* Moving a store from SQLite to PostgreSQL (strata_store_migrate, behind
 * `strata-server migrate`): the SQLite store of a state directory is
 * brought to the current schema and closed, the PostgreSQL store is opened
 * (which takes the directory's lock for the whole copy, so no coordinator
 * starts meanwhile), and every table is copied row by row in one
 * PostgreSQL transaction, with the ids, receipts, hashes and timestamps it
 * had, and the files of every recorded model version (checkpoints, the
 * server optimiser's state, the server model, deltas) go into the
 * database too. Then each update's payload is read back through the
 * store's interface and checked against its SHA-256. */
#include "store_pg.h"

#include <sqlite3.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One table: what is read from SQLite (every column as text, blobs as hex)
 * and the PostgreSQL statement that stores a row ($1.. the columns; "B"
 * in kinds marks a column that is bytea, sent as binary after decoding). */
typedef struct copy_table {
    const char *name;
    const char *select;
    const char *insert;
    const char *kinds; /* per column: 'i' integer, 't' text, 'n' text or NULL, 'B' bytes */
} copy_table;

static const copy_table TABLES[] = {
    {"clients",
     "SELECT id, hex(token_hash), hex(CAST(name AS BLOB)), created_ms, last_seen_ms"
     " FROM clients ORDER BY id",
     "INSERT INTO clients(id, token_hash, name, created_ms, last_seen_ms)"
     " VALUES($1, $2, $3, $4, $5)",
     "iBBii"},
    {"registrations",
     "SELECT hex(CAST(registration_id AS BLOB)), client_id FROM registrations ORDER BY client_id",
     "INSERT INTO registrations(registration_id, client_id) VALUES($1, $2)", "Bi"},
    {"rounds",
     "SELECT round, model_version, state, opened_ms, deadline_ms, closed_ms, task, summary"
     " FROM rounds ORDER BY round",
     "INSERT INTO rounds(round, model_version, state, opened_ms, deadline_ms, closed_ms, task,"
     " summary) VALUES($1, $2, $3, $4, $5, $6, $7, $8)",
     "iiiiiinn"},
    {"round_clients", "SELECT round, client_id FROM round_clients ORDER BY round, client_id",
     "INSERT INTO round_clients(round, client_id) VALUES($1, $2)", "ii"},
    {"updates",
     "SELECT u.round, u.client_id, u.receipt, hex(u.sha256), u.bytes, u.samples, u.received_ms,"
     " hex(p.body) FROM updates u JOIN payloads p ON p.seq = u.seq ORDER BY u.seq",
     "WITH u AS (INSERT INTO updates(round, client_id, receipt, sha256, bytes, samples,"
     " received_ms) VALUES($1, $2, $3, $4, $5, $6, $7) RETURNING seq)"
     " INSERT INTO payloads(seq, body) SELECT seq, $8::bytea FROM u",
     "iitBiiiB"},
    {"checkpoints", "SELECT model_version, bytes, recorded_ms FROM checkpoints ORDER BY 1",
     "INSERT INTO checkpoints(model_version, bytes, recorded_ms) VALUES($1, $2, $3)", "iii"},
    {"counters", "SELECT name, value FROM counters ORDER BY name",
     "INSERT INTO counters(name, value) VALUES($1, $2)", "ti"},
};
#define NTABLES (sizeof(TABLES) / sizeof(TABLES[0]))
/* Positions in TABLES of the counts strata_store_migrated reports. */
enum { T_CLIENTS = 0, T_ROUNDS = 2, T_UPDATES = 4, T_CHECKPOINTS = 5, T_COUNTERS = 6 };

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes SQLite's upper-case hex() in place; its length in bytes, or -1. */
static long unhex_inplace(char *t)
{
    size_t n = strlen(t);
    if (n % 2 != 0)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval(t[2 * i]), lo = hexval(t[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        t[i] = (char)(hi << 4 | lo);
    }
    return (long)(n / 2);
}

/* Copies one table (in the open PostgreSQL transaction); *rows counts. */
static int copy_one(sqlite3 *db, pg_store *pg, const copy_table *t, uint64_t *rows,
                    strata_diag *diag)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, t->select, -1, &st, NULL) != SQLITE_OK)
        return strata_diag_set(diag, STRATA_EIO, "read %s from SQLite: %s", t->name,
                               sqlite3_errmsg(db));
    int ncol = (int)strlen(t->kinds), step, rc = STRATA_OK;
    *rows = 0;
    while (rc == STRATA_OK && (step = sqlite3_step(st)) == SQLITE_ROW) {
        const char *v[PG_MAX_PARAMS];
        int len[PG_MAX_PARAMS], fmt[PG_MAX_PARAMS];
        char *own[PG_MAX_PARAMS] = {0};
        for (int c = 0; c < ncol && rc == STRATA_OK; c++) {
            const unsigned char *x = sqlite3_column_text(st, c);
            len[c] = 0;
            fmt[c] = 0;
            v[c] = (const char *)x;
            if (x == NULL && t->kinds[c] != 'n') {
                rc = strata_diag_set(diag, STRATA_EIO, "%s: a NULL where the schema has none",
                                     t->name);
            } else if (t->kinds[c] == 'B') {
                own[c] = strdup((const char *)x);
                long n = own[c] != NULL ? unhex_inplace(own[c]) : -1;
                if (own[c] == NULL)
                    rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
                else if (n < 0)
                    rc = strata_diag_set(diag, STRATA_EIO, "%s: a blob SQLite did not hex-encode",
                                         t->name);
                v[c] = own[c];
                len[c] = (int)n;
                fmt[c] = 1;
            }
        }
        if (rc == STRATA_OK) {
            PGresult *r = PQexecParams(pg->conn, t->insert, ncol, NULL, v, len, fmt, 0);
            if (r == NULL || PQresultStatus(r) != PGRES_COMMAND_OK)
                rc =
                    strata_diag_set(diag, STRATA_EIO, "copy %s: %s", t->name,
                                    r != NULL ? PQresultErrorMessage(r) : PQerrorMessage(pg->conn));
            PQclear(r);
        }
        for (int c = 0; c < ncol; c++)
            free(own[c]);
        if (rc == STRATA_OK)
            (*rows)++;
    }
    if (rc == STRATA_OK && step != SQLITE_DONE)
        rc = strata_diag_set(diag, STRATA_EIO, "read %s from SQLite: %s", t->name,
                             sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return rc;
}

/* Reads every update back through the interface and checks it. */
static int verify(strata_store *s, uint64_t *payloads, strata_diag *diag)
{
    uint32_t last = 0;
    int found = 0;
    int rc = strata_store_last_round(s, &last, &found, diag);
    *payloads = 0;
    for (uint64_t r = 0; rc == STRATA_OK && found && r <= last; r++) {
        strata_store_update *list = NULL;
        size_t n = 0;
        rc = strata_store_update_list(s, (uint32_t)r, &list, &n, diag);
        for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
            uint8_t *buf = NULL;
            size_t len = 0;
            rc = strata_store_update_read(s, (uint32_t)r, list[i].client_id, &buf, &len, diag);
            free(buf);
            (*payloads)++;
        }
        strata_store_update_list_free(list, n);
    }
    return rc;
}

int strata_store_migrate(const char *state_dir, const char *database, strata_store_migrated *out,
                         strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (state_dir == NULL || database == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "migrate: NULL argument");
    char path[4096];
    int rc = strata_store_path(state_dir, STRATA_STORE_FILE_DB, 0, 0, path, sizeof(path), diag);
    if (rc < 0)
        return rc;
    FILE *probe = fopen(path, "rb");
    if (probe == NULL)
        return strata_diag_set(diag, STRATA_ESTATE, "%s: no SQLite store to migrate", path);
    fclose(probe);
    /* The SQLite store at the current schema, its recovery done. */
    strata_store *src = NULL;
    if ((rc = strata_store_open(state_dir, &src, diag)) < 0)
        return rc;
    strata_store_close(src);

    strata_store *dst = NULL;
    if ((rc = strata_store_open_database(database, state_dir, &dst, diag)) < 0)
        return rc;
    pg_store *pg = (pg_store *)dst;
    uint64_t clients = 0;
    uint32_t last;
    int found = 0;
    if ((rc = strata_store_client_count(dst, &clients, diag)) == STRATA_OK &&
        (rc = strata_store_last_round(dst, &last, &found, diag)) == STRATA_OK &&
        (clients > 0 || found))
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "the database's store is not empty (%" PRIu64 " clients%s); migrate "
                             "into an empty schema",
                             clients, found ? ", rounds" : "");
    sqlite3 *db = NULL;
    if (rc == STRATA_OK &&
        sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK)
        rc = strata_diag_set(diag, STRATA_EIO, "open %s: %s", path,
                             db != NULL ? sqlite3_errmsg(db) : "out of memory");
    if (rc == STRATA_OK)
        rc = strata__pg_tx_begin(pg, diag);
    uint64_t rows[NTABLES] = {0};
    for (size_t i = 0; rc == STRATA_OK && i < NTABLES; i++)
        rc = copy_one(db, pg, &TABLES[i], &rows[i], diag);
    /* The files of every recorded version, so that the state directory
     * becomes a cache. */
    sqlite3_stmt *vs = NULL;
    if (rc == STRATA_OK &&
        sqlite3_prepare_v2(db, "SELECT model_version FROM checkpoints ORDER BY 1", -1, &vs, NULL) !=
            SQLITE_OK)
        rc = strata_diag_set(diag, STRATA_EIO, "read checkpoints from SQLite: %s",
                             sqlite3_errmsg(db));
    while (rc == STRATA_OK && sqlite3_step(vs) == SQLITE_ROW)
        rc = strata__pg_files_put(pg, (uint64_t)sqlite3_column_int64(vs, 0), diag);
    sqlite3_finalize(vs);
    if (rc == STRATA_OK) {
        /* New clients continue after the copied ids. */
        PGresult *r = PQexec(pg->conn, "SELECT setval(pg_get_serial_sequence('clients', 'id'),"
                                       " (SELECT coalesce(max(id), 0) + 1 FROM clients), false)");
        if (r == NULL || PQresultStatus(r) != PGRES_TUPLES_OK)
            rc = strata_diag_set(diag, STRATA_EIO, "client id sequence: %s",
                                 r != NULL ? PQresultErrorMessage(r) : PQerrorMessage(pg->conn));
        PQclear(r);
    }
    if (rc == STRATA_OK)
        rc = strata__pg_tx_commit(pg, diag);
    else
        strata__pg_tx_rollback(pg);
    sqlite3_close(db);
    uint64_t checked = 0;
    if (rc == STRATA_OK)
        rc = verify(dst, &checked, diag);
    if (rc == STRATA_OK && checked != rows[T_UPDATES])
        rc = strata_diag_set(diag, STRATA_EIO,
                             "%" PRIu64 " updates copied but %" PRIu64 " read back",
                             rows[T_UPDATES], checked);
    strata_store_close(dst);
    if (rc == STRATA_OK && out != NULL) {
        out->clients = rows[T_CLIENTS];
        out->rounds = rows[T_ROUNDS];
        out->updates = rows[T_UPDATES];
        out->checkpoints = rows[T_CHECKPOINTS];
        out->counters = rows[T_COUNTERS];
    }
    return rc;
}
