/* Internal to the store (server/core/store_*.c): the definition of struct
 * sq_store, the prepared-statement table and the plumbing the table
 * families share. Nothing outside server/core/store_*.c includes it. All
 * helpers keep the conventions of store.h: they return STRATA_OK or a
 * negative strata_err and explain failures in diag (which may be NULL). */
#ifndef STRATA_SERVER_STORE_INTERNAL_H
#define STRATA_SERVER_STORE_INTERNAL_H

#include "store_backend.h"

#include <sqlite3.h>

#include <stddef.h>
#include <stdint.h>

/* The prepared statements of a connection, by id (SQL in store_sqlite.c). */
enum {
    S_BEGIN,
    S_COMMIT,
    S_ROLLBACK,
    S_CLIENT_INSERT,
    S_CLIENT_BY_TOKEN,
    S_CLIENT_BY_ID,
    S_CLIENT_COUNT,
    S_CLIENT_TOUCH,
    S_CLIENT_SET_TOKEN,
    S_REGISTRATION_GET,
    S_REGISTRATION_INSERT,
    S_ROUND_MAX,
    S_ROUND_OPEN_ANY,
    S_ROUND_INSERT,
    S_ROUND_SEL_INSERT,
    S_ROUND_GET,
    S_ROUND_LIST,
    S_ROUND_SELECTED,
    S_ROUND_CLOSE,
    S_ROUND_STATE,
    S_ROUND_SEAL,
    S_IS_SELECTED,
    S_UPDATE_GET,
    S_UPDATE_INSERT,
    S_UPDATE_LIST,
    S_PAYLOAD_INSERT,
    S_PAYLOAD_GET,
    S_UPDATE_COUNT,
    S_CKPT_RECORD,
    S_CKPT_LATEST,
    S_COUNTER_GET,
    S_COUNTER_SET,
    S_COUNTER_LIST,
    N_STMT
};

typedef struct sq_store {
    strata_store base; /* first: a strata_store * of this backend points here */
    sqlite3 *db;
    sqlite3_stmt *st[N_STMT];
    int lock_fd; /* -1 for a secondary */
    int sync_full;
} sq_store;

#define BUSY_TIMEOUT_MS 10000
#define STRATA__STORE_PAGE_SIZE "16384" /* bytes; see connect_db */

/* Sets diag from the connection's last SQLite error, prefixed by what;
 * returns STRATA_EIO. */
int strata__store_db_error(sq_store *s, strata_diag *diag, const char *what);

/* The prepared statement id (borrowed from s), ready to bind: statements are
 * always reset and unbound after use (strata__store_stmt_done). */
sqlite3_stmt *strata__store_stmt(sq_store *s, int id);

/* Resets statement st and clears its bindings. */
void strata__store_stmt_done(sqlite3_stmt *st);

/* Steps the bound statement id, which returns no row, and resets it;
 * STRATA_EIO (with what) on failure. */
int strata__store_exec_stmt(sq_store *s, int id, strata_diag *diag, const char *what);

/* Switches the connection's synchronous mode: FULL (full != 0: commits are
 * fsync'ed) or NORMAL. No-op when already in that mode. */
int strata__store_set_sync(sq_store *s, int full, strata_diag *diag);

/* Starts a write transaction (BEGIN IMMEDIATE) whose COMMIT is fsync'ed
 * (full) or not. Every write transaction says which, so a failed switch back
 * cannot leave a later acknowledgement without its fsync. */
int strata__store_tx_begin_sync(sq_store *s, int full, strata_diag *diag);

/* strata__store_tx_begin_sync with full = 1. */
int strata__store_tx_begin(sq_store *s, strata_diag *diag);

/* Commits the open transaction. */
int strata__store_tx_commit(sq_store *s, strata_diag *diag);

/* Rolls back the open transaction, if any; keeps the caller's diagnostic. */
void strata__store_tx_rollback(sq_store *s);

/* The prologue every single-value getter shares: binds the nkeys (0 to 2)
 * integer keys k1, k2 to parameters ?1, ?2 of statement id (with nkeys 0
 * the caller has bound what it needs), steps it once and reads column 0 of
 * the row into *value (0 when there is no row or the value is NULL);
 * *is_null (may be NULL) says whether there was no row or a NULL. The
 * statement is reset. STRATA_EIO (with what) on an SQLite failure. */
int strata__store_query_int(sq_store *s, int id, int nkeys, int64_t k1, int64_t k2, int64_t *value,
                            int *is_null, const char *what, strata_diag *diag);

/* snprintf into buf (len bytes); STRATA_ETOOBIG when the result does not fit. */
int strata__store_join(char *buf, size_t len, strata_diag *diag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A malloc'ed copy of text column col of the current row (NULL for SQL NULL;
 * NULL with *oom = 1 when out of memory). */
char *strata__store_dup_column_text(sqlite3_stmt *st, int col, int *oom);

/* Steps the bound statement st (S_CLIENT_BY_TOKEN or S_CLIENT_BY_ID) and
 * resets it: *found = 1 and *out filled (out may be NULL) when the client
 * exists. Defined with the clients (store_sqlite_clients.c). */
int strata__store_fetch_client(sq_store *s, sqlite3_stmt *st, strata_store_client *out, int *found,
                               strata_diag *diag);

/* The migration from schema 2 (store_sqlite_migrate.c), inside check_schema's
 * transaction, after the payloads table exists: copies every stored
 * update's file updates/<round>/<client>.bin into the database after
 * checking its length and SHA-256 against the row. Errors: STRATA_EIO
 * naming the update whose file is missing or differs (the database is left
 * at schema 2, the files untouched). */
int strata__store_migrate_payload_files(sq_store *s, strata_diag *diag);

/* After the migration committed: removes updates/ and everything in it
 * (best effort; what cannot be removed is left, never read again). */
void strata__store_remove_payload_files(const sq_store *s);

/* The operations of strata__store_sqlite_ops (one per file of the
 * backend; contracts in store_backend.h and store.h). */
int strata__sqlite_open_secondary(const strata_store *primary, strata_store **out,
                                  strata_diag *diag);
void strata__sqlite_close(strata_store *s);
int strata__sqlite_client_add(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                              const char *name, const char *registration_id, uint64_t *client_id,
                              int *existed, strata_diag *diag);
int strata__sqlite_registration_find(strata_store *s, const char *registration_id,
                                     uint64_t *client_id, int *found, strata_diag *diag);
int strata__sqlite_client_get(strata_store *s, uint64_t client_id, strata_store_client *out,
                              int *found, strata_diag *diag);
int strata__sqlite_client_find(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                               strata_store_client *out, int *found, strata_diag *diag);
int strata__sqlite_client_count(strata_store *s, uint64_t *count, strata_diag *diag);
int strata__sqlite_clients_seen(strata_store *s, const uint64_t *ids, const int64_t *seen_ms,
                                size_t n, strata_diag *diag);
int strata__sqlite_round_open(strata_store *s, uint32_t round, uint64_t model_version,
                              const uint64_t *selected, size_t n, int64_t deadline_unix_ms,
                              const char *task_json, strata_diag *diag);
int strata__sqlite_round_get(strata_store *s, uint32_t round, strata_store_round *out, int *found,
                             strata_diag *diag);
int strata__sqlite_round_seal(strata_store *s, uint32_t round, strata_diag *diag);
int strata__sqlite_round_close(strata_store *s, uint32_t round, const char *summary_json,
                               strata_diag *diag);
int strata__sqlite_last_round(strata_store *s, uint32_t *round, int *found, strata_diag *diag);
int strata__sqlite_round_list(strata_store *s, uint32_t from, size_t limit,
                              strata_store_round **out, size_t *n, strata_diag *diag);
int strata__sqlite_update_find(strata_store *s, uint32_t round, uint64_t client_id,
                               strata_store_receipt *receipt, int *found, strata_diag *diag);
int strata__sqlite_update_commit(strata_store *s, strata_store_pending *const *p, size_t n,
                                 strata_store_receipt *receipts, strata_store_verdict *verdicts,
                                 int *results, strata_diag *item_diag, strata_diag *diag);
int strata__sqlite_update_list(strata_store *s, uint32_t round, size_t from,
                               strata_store_update **out, size_t *n, strata_diag *diag);
int strata__sqlite_update_read(strata_store *s, uint32_t round, uint64_t client_id, uint8_t **buf,
                               size_t *len, strata_diag *diag);
int strata__sqlite_checkpoint_record(strata_store *s, uint64_t model_version, uint64_t bytes,
                                     strata_diag *diag);
int strata__sqlite_latest_model_version(strata_store *s, uint64_t *model_version, int *found,
                                        strata_diag *diag);
int strata__sqlite_counter_add_many(strata_store *s, const strata_store_counter *deltas, size_t n,
                                    strata_diag *diag);
int strata__sqlite_counter_get(strata_store *s, const char *name, int64_t *value,
                               strata_diag *diag);

#endif
