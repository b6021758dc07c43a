/* The store's clients table: registration by token hash, look-ups, the
 * count, and last-seen times. */
#include "store_sqlite.h"

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
int strata__store_fetch_client(sq_store *s, sqlite3_stmt *st, strata_store_client *out, int *found,
                               strata_diag *diag)
{
    int step = sqlite3_step(st), rc = STRATA_OK;
    if (step == SQLITE_ROW) {
        *found = 1;
        if (out != NULL)
            read_client(st, out);
    } else if (step != SQLITE_DONE) {
        rc = strata__store_db_error(s, diag, "look up client");
    }
    strata__store_stmt_done(st);
    return rc;
}

/* The client registered with registration id reg: *found and *id. */
static int registration_get(sq_store *s, const char *reg, uint64_t *id, int *found,
                            strata_diag *diag)
{
    int64_t v = 0;
    int is_null = 1;
    sqlite3_stmt *st = strata__store_stmt(s, S_REGISTRATION_GET);
    sqlite3_bind_text(st, 1, reg, -1, SQLITE_STATIC);
    int step = sqlite3_step(st), rc = STRATA_OK;
    if (step == SQLITE_ROW) {
        is_null = 0;
        v = sqlite3_column_int64(st, 0);
    } else if (step != SQLITE_DONE) {
        rc = strata__store_db_error(s, diag, "look up registration");
    }
    strata__store_stmt_done(st);
    *found = !is_null;
    *id = (uint64_t)v;
    return rc;
}

/* Stores a new client (and its registration id when reg is not NULL). */
static int insert_client(sq_store *s, const uint8_t *token_hash, const char *name, size_t nlen,
                         const char *reg, uint64_t *id, strata_diag *diag)
{
    sqlite3_stmt *st = strata__store_stmt(s, S_CLIENT_INSERT);
    sqlite3_bind_blob(st, 1, token_hash, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, (int)nlen, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, strata__store_now_ms());
    int rc = strata__store_exec_stmt(s, S_CLIENT_INSERT, diag, "insert client");
    if (rc < 0)
        return rc;
    *id = (uint64_t)sqlite3_last_insert_rowid(s->db);
    if (reg == NULL)
        return STRATA_OK;
    st = strata__store_stmt(s, S_REGISTRATION_INSERT);
    sqlite3_bind_text(st, 1, reg, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (int64_t)*id);
    return strata__store_exec_stmt(s, S_REGISTRATION_INSERT, diag, "insert registration");
}

int strata__sqlite_client_add(strata_store *base, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                              const char *name, const char *registration_id, uint64_t *client_id,
                              int *existed, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    size_t nlen = strlen(name);
    int rc = strata__store_tx_begin(s, diag);
    if (rc < 0)
        return rc;
    int found = 0;
    sqlite3_stmt *st = strata__store_stmt(s, S_CLIENT_BY_TOKEN);
    sqlite3_bind_blob(st, 1, token_hash, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
    rc = strata__store_fetch_client(s, st, NULL, &found, diag);
    if (rc < 0)
        goto out;
    if (found) {
        rc = strata_diag_set(diag, STRATA_ESTATE, "a client with this token hash is registered");
        goto out;
    }
    uint64_t id = 0;
    int known = 0;
    if (registration_id != NULL &&
        (rc = registration_get(s, registration_id, &id, &known, diag)) < 0)
        goto out;
    if (known) {
        st = strata__store_stmt(s, S_CLIENT_SET_TOKEN);
        sqlite3_bind_int64(st, 1, (int64_t)id);
        sqlite3_bind_blob(st, 2, token_hash, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
        rc = strata__store_exec_stmt(s, S_CLIENT_SET_TOKEN, diag, "replace token");
    } else {
        rc = insert_client(s, token_hash, name, nlen, registration_id, &id, diag);
    }
    if (rc < 0)
        goto out;
    rc = strata__store_tx_commit(s, diag);
    if (rc == STRATA_OK) {
        *client_id = id;
        if (existed != NULL)
            *existed = known;
    }
out:
    if (rc < 0)
        strata__store_tx_rollback(s);
    return rc;
}

int strata__sqlite_registration_find(strata_store *base, const char *registration_id,
                                     uint64_t *client_id, int *found, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    return registration_get(s, registration_id, client_id, found, diag);
}

int strata__sqlite_client_get(strata_store *base, uint64_t client_id, strata_store_client *out,
                              int *found, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    if (!FITS_I64(client_id))
        return STRATA_OK;
    sqlite3_stmt *st = strata__store_stmt(s, S_CLIENT_BY_ID);
    sqlite3_bind_int64(st, 1, (int64_t)client_id);
    return strata__store_fetch_client(s, st, out, found, diag);
}

int strata__sqlite_client_find(strata_store *base, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                               strata_store_client *out, int *found, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = strata__store_stmt(s, S_CLIENT_BY_TOKEN);
    sqlite3_bind_blob(st, 1, token_hash, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
    return strata__store_fetch_client(s, st, out, found, diag);
}

int strata__sqlite_client_count(strata_store *base, uint64_t *count, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    int64_t v;
    int rc = strata__store_query_int(s, S_CLIENT_COUNT, 0, 0, 0, &v, NULL, "count clients", diag);
    if (rc == STRATA_OK)
        *count = (uint64_t)v;
    return rc;
}

int strata__sqlite_clients_seen(strata_store *base, const uint64_t *ids, const int64_t *seen_ms,
                                size_t n, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    int rc = strata__store_tx_begin_sync(s, 0, diag);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n && rc == STRATA_OK; i++) {
        if (!FITS_I64(ids[i]))
            continue;
        sqlite3_stmt *st = strata__store_stmt(s, S_CLIENT_TOUCH);
        sqlite3_bind_int64(st, 1, (int64_t)ids[i]);
        sqlite3_bind_int64(st, 2, seen_ms[i]);
        rc = strata__store_exec_stmt(s, S_CLIENT_TOUCH, diag, "record last-seen time");
    }
    if (rc == STRATA_OK)
        rc = strata__store_tx_commit(s, diag);
    if (rc < 0)
        strata__store_tx_rollback(s);
    return rc;
}
