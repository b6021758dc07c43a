/* Internal to the PostgreSQL backend of the store (server/core/store_pg*.c):
 * struct pg_store, the prepared statements and the plumbing the table
 * families share. Nothing else includes it. The helpers keep the
 * conventions of store.h: they return STRATA_OK or a negative strata_err
 * and explain failures in diag (which may be NULL).
 *
 * One pg_store is one libpq connection. Every write runs in a transaction
 * that first takes a transaction advisory lock of the store (so writers are
 * serialised, as SQLite's BEGIN IMMEDIATE serialises them, and each decides
 * on the state the previous one committed); reads run outside
 * transactions. Parameters go as text (numbers) or binary (bytea); results
 * come back as text, but for the payload read, which asks for binary. */
#ifndef STRATA_SERVER_STORE_PG_H
#define STRATA_SERVER_STORE_PG_H

#include "store_backend.h"

#include <libpq-fe.h>

#include <stddef.h>
#include <stdint.h>

/* The schema this build creates and reads in a PostgreSQL database (its own
 * numbering, independent of the SQLite backend's). */
#define STRATA__PG_SCHEMA_VERSION 4

/* The advisory-lock class ids of the store (the object id is the hash of
 * the store's schema name): one session lock that the leader holds (a sign
 * that it lives: a store that gets it knows the last leader's session
 * ended), one transaction lock taken by every write. */
#define STRATA__PG_LOCK_PRIMARY 1398035024 /* 0x53545250, "STRP" */
#define STRATA__PG_LOCK_WRITE 1398035031   /* 0x53545257, "STRW" */

/* The prepared statements of a connection, by id (SQL in store_pg.c). */
enum {
    P_BEGIN,
    P_WRITE_LOCK,
    P_COMMIT,
    P_ROLLBACK,
    P_CLIENT_INSERT,
    P_CLIENT_BY_TOKEN,
    P_CLIENT_BY_ID,
    P_CLIENT_COUNT,
    P_CLIENT_TOUCH,
    P_CLIENT_SET_TOKEN,
    P_REGISTRATION_GET,
    P_REGISTRATION_INSERT,
    P_ROUND_MAX,
    P_ROUND_OPEN_ANY,
    P_ROUND_INSERT,
    P_ROUND_SEL_INSERT,
    P_CLIENTS_MISSING,
    P_ROUND_GET,
    P_ROUND_LIST,
    P_ROUND_SELECTED,
    P_ROUND_CLOSE,
    P_ROUND_STATE,
    P_ROUND_SEAL,
    P_UPDATE_CHECK,
    P_UPDATE_INSERT,
    P_UPDATE_LIST,
    P_RECEIPT_FIND,
    P_PAYLOAD_GET,
    P_CKPT_RECORD,
    P_CKPT_LATEST,
    P_COUNTER_ADD,
    P_COUNTER_GET,
    P_LEADER_GET,
    P_LEADER_SET,
    P_LEADER_RENEW,
    P_LEADER_EPOCH,
    P_NOTIFY,
    P_CHANNEL,
    P_FILE_DELETE,
    P_FILE_CHUNKS_DELETE,
    P_FILE_HEAD,
    P_FILE_CHUNK_INSERT,
    P_FILE_GET,
    P_FILE_CHUNK_GET,
    N_PG_STMT
};

/* The SQL (store_pg_sql.c): the schema of version 1, migrations[v] raising
 * version v to v + 1 (index 0 unused), and each statement's text. */
extern const char strata__pg_schema_v1[];
extern const char *const strata__pg_migrations[STRATA__PG_SCHEMA_VERSION];
extern const char *const strata__pg_stmt_sql[N_PG_STMT];

typedef struct pg_store {
    strata_store base; /* first: a strata_store * of this backend points here */
    PGconn *conn;
    char *conninfo;
    int lock_fd; /* the state directory's lock; -1 for a secondary */
    int in_tx;
    int64_t epoch;    /* > 0: this connection writes as the leader of that epoch (fenced) */
    int session_lock; /* holds the leader's session lock */
    int stale;        /* reconnected, but the session's set-up failed: reset again */
    char holder[64];
    unsigned notify; /* PG_NOTE_* of the open transaction: sent with its commit */
    int listening;   /* LISTENs on channel (strata_store_changes_listen) */
    int missed;      /* reconnected while listening: notifications may be lost */
    char channel[64];
} pg_store;

/* What a write transaction changed (pg_store.notify), sent as one
 * notification of these letters when it commits. */
#define PG_NOTE_CLIENTS 1u /* 'c' */
#define PG_NOTE_ROUNDS 2u  /* 'r' */
#define PG_NOTE_UPDATES 4u /* 'u' */
#define PG_NOTE_MODELS 8u  /* 'm' */

/* At most this many parameters per statement. */
#define PG_MAX_PARAMS 10

/* The parameters of one statement. Numbers are text; bytea are binary. */
typedef struct pg_params {
    const char *v[PG_MAX_PARAMS];
    int len[PG_MAX_PARAMS];
    int fmt[PG_MAX_PARAMS];
    char num[PG_MAX_PARAMS][24];
    int n;
} pg_params;

void strata__pg_int(pg_params *p, int64_t x);
void strata__pg_text(pg_params *p, const char *s); /* NULL: SQL NULL */
void strata__pg_bytes(pg_params *p, const void *b, size_t n);

/* Makes sure that s has a usable connection: when libpq reports it broken
 * (the database server restarted, failed over, or the network was cut) and
 * no transaction is open, connects again (PQreset) and sets the session up
 * again (settings, prepared statements; the leader's session lock is lost).
 * In a transaction a lost connection fails the transaction's statements.
 * strata__pg_run calls it first; so does every statement run outside the
 * prepared set on a connection that may have lived long. */
int strata__pg_ready(pg_store *s, strata_diag *diag);

/* Runs sql (no parameters, outside the prepared set) that returns rows,
 * on a ready connection, as strata__pg_run does; NULL on failure (diag
 * set). The result is the caller's (PQclear). */
PGresult *strata__pg_query(pg_store *s, const char *sql, strata_diag *diag);

/* Runs prepared statement id with p (NULL: no parameters), results as text
 * (binary != 0: binary), and checks that it returned rows (rows != 0) or
 * completed; on failure sets diag (STRATA_EIO with what and PostgreSQL's
 * message) and returns NULL. The result is the caller's (PQclear). */
PGresult *strata__pg_run(pg_store *s, int id, const pg_params *p, int binary, int rows,
                         const char *what, strata_diag *diag);

/* strata__pg_run for a statement without rows: STRATA_OK or STRATA_EIO. */
int strata__pg_exec(pg_store *s, int id, const pg_params *p, const char *what, strata_diag *diag);

/* The first column of the first row as an integer: *is_null (may be NULL)
 * says whether there was no row or a NULL (then *value is 0). */
int strata__pg_query_int(pg_store *s, int id, const pg_params *p, int64_t *value, int *is_null,
                         const char *what, strata_diag *diag);

/* A text-result column as an integer (0 for NULL). */
int64_t strata__pg_col_int(const PGresult *r, int row, int col);

/* Decodes a text-result bytea column ("\x" and hex) into out (exactly len
 * bytes); 0 on success, -1 when the value is NULL or has another length. */
int strata__pg_col_bytes(const PGresult *r, int row, int col, uint8_t *out, size_t len);

/* As strata__pg_col_bytes, into a malloc'ed string of any length (the bytes
 * and a terminating NUL); NULL with *oom = 1 when out of memory, NULL with
 * *oom = 0 when the value is NULL or not hex. */
char *strata__pg_col_bytes_dup(const PGresult *r, int row, int col, size_t *len, int *oom);

/* A malloc'ed copy of a text column (NULL for SQL NULL; NULL with *oom = 1
 * when out of memory). */
char *strata__pg_col_dup(const PGresult *r, int row, int col, int *oom);

/* Starts a write transaction: BEGIN, then the store's write lock. */
int strata__pg_tx_begin(pg_store *s, strata_diag *diag);

/* Commits the open transaction (waiting for the server's WAL flush). */
int strata__pg_tx_commit(pg_store *s, strata_diag *diag);

/* Rolls back the open transaction, if any; keeps the caller's diagnostic. */
void strata__pg_tx_rollback(pg_store *s);

/* Ends the open transaction: commits it when rc is STRATA_OK, else (or when
 * the commit fails) rolls it back; returns rc or the commit's failure. */
int strata__pg_tx_end(pg_store *s, int rc, strata_diag *diag);

/* The operations of strata__store_pg_ops (store_pg.c, store_pg_tables.c,
 * store_pg_updates.c; contracts in store_backend.h and store.h). */
int strata__pg_open_secondary(const strata_store *primary, strata_store **out, strata_diag *diag);
void strata__pg_close(strata_store *s);
int strata__pg_client_add(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                          const char *name, const char *registration_id, uint64_t *client_id,
                          int *existed, strata_diag *diag);
int strata__pg_registration_find(strata_store *s, const char *registration_id, uint64_t *client_id,
                                 int *found, strata_diag *diag);
int strata__pg_client_get(strata_store *s, uint64_t client_id, strata_store_client *out, int *found,
                          strata_diag *diag);
int strata__pg_client_find(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                           strata_store_client *out, int *found, strata_diag *diag);
int strata__pg_client_count(strata_store *s, uint64_t *count, strata_diag *diag);
int strata__pg_clients_seen(strata_store *s, const uint64_t *ids, const int64_t *seen_ms, size_t n,
                            strata_diag *diag);
int strata__pg_round_open(strata_store *s, uint32_t round, uint64_t model_version,
                          const uint64_t *selected, size_t n, int64_t deadline_unix_ms,
                          const char *task_json, strata_diag *diag);
int strata__pg_round_get(strata_store *s, uint32_t round, strata_store_round *out, int *found,
                         strata_diag *diag);
int strata__pg_round_close(strata_store *s, uint32_t round, const char *summary_json,
                           strata_diag *diag);
int strata__pg_round_seal(strata_store *s, uint32_t round, strata_diag *diag);
int strata__pg_changes_listen(strata_store *s, strata_diag *diag);
int strata__pg_changes_wait(strata_store *s, int timeout_ms, strata_store_changes *out,
                            strata_diag *diag);
int strata__pg_last_round(strata_store *s, uint32_t *round, int *found, strata_diag *diag);
int strata__pg_round_list(strata_store *s, uint32_t from, size_t limit, strata_store_round **out,
                          size_t *n, strata_diag *diag);
int strata__pg_update_find(strata_store *s, uint32_t round, uint64_t client_id,
                           strata_store_receipt *receipt, int *found, strata_diag *diag);
int strata__pg_update_commit(strata_store *s, strata_store_pending *const *p, size_t n,
                             strata_store_receipt *receipts, strata_store_verdict *verdicts,
                             int *results, strata_diag *item_diag, strata_diag *diag);
int strata__pg_update_list(strata_store *s, uint32_t round, size_t from, strata_store_update **out,
                           size_t *n, strata_diag *diag);
int strata__pg_update_read(strata_store *s, uint32_t round, uint64_t client_id, uint8_t **buf,
                           size_t *len, strata_diag *diag);
int strata__pg_checkpoint_record(strata_store *s, uint64_t model_version, uint64_t bytes,
                                 strata_diag *diag);
int strata__pg_latest_model_version(strata_store *s, uint64_t *model_version, int *found,
                                    strata_diag *diag);
int strata__pg_counter_add_many(strata_store *s, const strata_store_counter *deltas, size_t n,
                                strata_diag *diag);
int strata__pg_counter_get(strata_store *s, const char *name, int64_t *value, strata_diag *diag);
/* Stores, in the open transaction, each of version's files that is in the
 * state directory (store_pg_files.c). */
int strata__pg_files_put(pg_store *s, uint64_t version, strata_diag *diag);
int strata__pg_file_fetch(strata_store *s, strata_store_file kind, uint64_t version,
                          const char *path, int *found, strata_diag *diag);
int strata__pg_file_remove(strata_store *s, strata_store_file kind, uint64_t version,
                           strata_diag *diag);
int strata__pg_lead(strata_store *s, const char *holder, int64_t lease_ms, strata_store_leader *out,
                    strata_diag *diag);
int strata__pg_renew(strata_store *s, int64_t lease_ms, strata_diag *diag);
int strata__pg_leader_get(strata_store *s, strata_store_leader *out, strata_diag *diag);

#endif
