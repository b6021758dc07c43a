/* The coordinator's durable state, behind one interface: registered
 * clients, rounds, updates (their payload bodies included) with receipts,
 * checkpoint records and counters. Every caller (the engine, the HTTP
 * layer's handlers, the round close, strata-sim's report) reaches durable
 * state only through the functions below; each dispatches to the handle's
 * backend (an operations table, store_backend.h): SQLite in a state
 * directory (strata_store_open, the embedded default) or a PostgreSQL
 * database (strata_store_open_database), and
 * tests/unit/test_store_conformance.c runs the same cases against both.
 *
 * A state directory holds
 *
 *   state.db        the SQLite database (WAL): clients, rounds, updates and
 *                   their payloads, checkpoints, counters
 *   checkpoints/model-<V>.safetensors   the global model of version V
 *   checkpoints/server-opt-<V>.safetensors   the server optimiser's state
 *                   after version V (fedavgm, fedadam, fedyogi)
 *   lock            held (flock) by the process that owns the directory
 *   admin.token     the admin bearer token, unless --admin-token-file names
 *                   another file
 *
 * Every one of these paths is composed by strata_store_path alone. (A
 * directory written by schema 2 also had updates/<R>/<C>.bin, one file per
 * payload: the first open migrates them into the database and removes
 * them.)
 *
 * Durability contract. strata_store_update_put (and the commit of a prepared
 * update, strata_store_update_commit and _commit_many) returns STRATA_OK only
 * after the update's row and its payload are committed durably (SQLite:
 * one transaction with synchronous=FULL, so one fsync of the write-ahead
 * log for a whole group commit). A caller may acknowledge the update (HTTP
 * 200) exactly then: after a crash of the process or of the machine the
 * update is listed by strata_store_update_list and its bytes are intact. A
 * commit that did not return is all or nothing: after a crash, either every
 * accepted item of its batch is stored or none is, never part of one.
 *
 * Threads and processes. A strata_store is one connection and may be used
 * by one thread at a time. Exactly one process owns a state directory:
 * strata_store_open takes an exclusive lock and fails with STRATA_ESTATE when
 * another open store (in this or another process) holds it. A thread that
 * needs its own connection gets one from strata_store_open_secondary; all
 * connections may write concurrently (SQLite serialises the write
 * transactions, busy_timeout waits for the lock).
 *
 * Errors. Every function returns STRATA_OK or a negative strata_err and, when
 * diag is not NULL, explains the failure in it: STRATA_EINVAL for bad
 * arguments, STRATA_ESTATE when the call contradicts the stored state
 * (existing round, closed round, ...), STRATA_EIO for file-system and
 * database failures (with the database's message), STRATA_ENOMEM,
 * STRATA_ETOOBIG for a too small caller buffer. Every write is
 * all-or-nothing: on error the transaction is rolled back. Out-parameters
 * are zeroed on entry. Unsigned 64-bit values (ids, versions, sample
 * counts) must fit in int64_t; larger values are STRATA_EINVAL. */
#ifndef STRATA_SERVER_STORE_H
#define STRATA_SERVER_STORE_H

#include "strata/error.h"
#include "strata/hash.h"

#include <stddef.h>
#include <stdint.h>

/* The schema this build creates and reads. An older database is migrated on
 * open; a newer one is refused. */
#define STRATA_STORE_SCHEMA_VERSION 3

#define STRATA_STORE_HASH_LEN STRATA_SHA256_LEN    /* SHA-256 (strata/hash.h) */
#define STRATA_STORE_RECEIPT_LEN 32                /* hex characters of a receipt id */
#define STRATA_STORE_REGISTRATION_MAX 64           /* bytes of a registration id */
#define STRATA_STORE_NAME_MAX 128                  /* bytes of a client name */
#define STRATA_STORE_COUNTER_NAME_MAX 127          /* bytes of a counter name */
#define STRATA_STORE_PAYLOAD_MAX ((size_t)1 << 29) /* bytes of one update's payload */

typedef struct strata_store strata_store;

/* ---- Opening and closing ---------------------------------------------- */

/* Opens (creating when missing) the state directory state_dir with the
 * SQLite backend: creates the layout, takes the directory lock, opens
 * state.db in WAL mode with busy_timeout, synchronous=FULL and foreign keys
 * on, creates or migrates the schema (schema 2's payload files move into
 * the database; a file that is missing or differs from its row fails the
 * open with STRATA_EIO and changes nothing), and recovers: removes the
 * temporary files left by an interrupted checkpoint write (see
 * strata_store_recovered_files). Errors: STRATA_ESTATE when the directory is
 * locked by another store or the database has a newer schema version,
 * STRATA_EIO for file-system or SQLite failures. *out is owned by the caller
 * (strata_store_close). */
int strata_store_open(const char *state_dir, strata_store **out, strata_diag *diag);

/* Opens the store in the PostgreSQL database that `database` names (a libpq
 * connection string or URI, e.g. "postgresql://strata@db:5432/strata" or
 * "host=/run/pg port=5432 dbname=strata"; the tables live in the first
 * schema of the connection's search_path), with state_dir holding the files
 * that are not in the database yet (checkpoints, admin.token; created when
 * missing, like strata_store_open's). Takes the directory lock, creates or
 * migrates the schema in one transaction and recovers the directory's
 * temporary files. Several processes may open one database's store; the one
 * that may write as the coordinator is the leader (strata_store_lead), and
 * a leader's writes are fenced by its epoch. Every write transaction takes
 * a transaction advisory lock first, so writers are serialised as SQLite's
 * are; commits wait for the server's WAL flush (synchronous_commit on); a
 * session idle in a transaction for 5 s is ended by the server (a paused
 * process cannot hold the write lock). Errors: STRATA_ESTATE when the
 * directory is locked, the schema is newer or the schema is not a Strata
 * store's, STRATA_EIO for connection and SQL failures (with PostgreSQL's
 * message). */
int strata_store_open_database(const char *database, const char *state_dir, strata_store **out,
                               strata_diag *diag);

/* What strata_store_migrate copied. */
typedef struct strata_store_migrated {
    uint64_t clients, rounds, updates, checkpoints, counters;
} strata_store_migrated;

/* Moves the SQLite store of state_dir into the PostgreSQL database
 * `database` (as strata_store_open_database names it; its store must hold
 * no client and no round): brings the SQLite store to the current schema,
 * then, holding the directory's lock, copies every client, registration,
 * round, selection, update with its payload, checkpoint record and counter
 * in one PostgreSQL transaction (ids, receipts, hashes and times kept),
 * with the files of every recorded model version, and reads every payload
 * back through the store, checking its SHA-256. state.db and the files are
 * left as they were (but for a schema migration). out (may
 * be NULL) receives the counts. Errors: STRATA_ESTATE (no SQLite store,
 * a non-empty database store, a lock held), STRATA_EIO; on error the
 * database is left as it was. */
int strata_store_migrate(const char *state_dir, const char *database, strata_store_migrated *out,
                         strata_diag *diag);

/* Opens another connection to primary's state directory for use by another
 * thread of the same process; no lock is taken and no recovery runs. Every
 * secondary must be closed before its primary. */
int strata_store_open_secondary(const strata_store *primary, strata_store **out, strata_diag *diag);

/* Finalises the prepared statements, closes the connection and (for a
 * primary) releases the lock. Accepts NULL. */
void strata_store_close(strata_store *s);

/* The state directory (borrowed; lives as long as s). */
const char *strata_store_dir(const strata_store *s);

/* The name of s's backend ("sqlite" or "postgresql"; borrowed, static). */
const char *strata_store_backend(const strata_store *s);

/* The files and folders of a state directory. */
typedef enum {
    STRATA_STORE_FILE_DB,            /* state.db */
    STRATA_STORE_FILE_LOCK,          /* lock */
    STRATA_STORE_FILE_UPDATES,       /* updates (schema 2; read by its migration) */
    STRATA_STORE_FILE_ROUND_UPDATES, /* updates/<a: round> (schema 2) */
    STRATA_STORE_FILE_UPDATE,        /* updates/<a: round>/<b: client>.bin (schema 2) */
    STRATA_STORE_FILE_CHECKPOINTS,   /* checkpoints */
    STRATA_STORE_FILE_CHECKPOINT,    /* checkpoints/model-<a: version>.safetensors */
    STRATA_STORE_FILE_SERVER_OPT,    /* checkpoints/server-opt-<a: version>.safetensors */
    STRATA_STORE_FILE_SERVER_MODEL,  /* checkpoints/server-model-<a: version>.safetensors */
    STRATA_STORE_FILE_DELTA,         /* checkpoints/delta-<a: version>.bin */
    STRATA_STORE_FILE_ADMIN_TOKEN    /* admin.token */
} strata_store_file;

/* Composes the path of file under state_dir into buf (len bytes); a and b
 * are the numbers the file's name needs (see strata_store_file), ignored
 * otherwise. The one place that names the state directory's files.
 * Errors: STRATA_EINVAL (NULL argument, unknown file), STRATA_ETOOBIG when
 * the path does not fit (buf is then ""). Thread-safe. */
int strata_store_path(const char *state_dir, strata_store_file file, uint64_t a, uint64_t b,
                      char *buf, size_t len, strata_diag *diag);

/* Number of temporary files the recovery of strata_store_open removed (0
 * for a secondary). */
size_t strata_store_recovered_files(const strata_store *s);

/* ---- Clients ---------------------------------------------------------- */

typedef struct strata_store_client {
    uint64_t id; /* assigned by the store, >= 1, never reused */
    uint8_t token_hash[STRATA_STORE_HASH_LEN];
    char name[STRATA_STORE_NAME_MAX + 1]; /* "" when none was given */
    int64_t created_unix_ms;
    int64_t last_seen_unix_ms;
} strata_store_client;

/* Registers a client identified by the SHA-256 of its bearer token (the token
 * itself is never stored). name may be NULL; at most STRATA_STORE_NAME_MAX
 * bytes, no control characters. registration_id (may be NULL: none) is the
 * client's name for this registration, 1 to STRATA_STORE_REGISTRATION_MAX
 * bytes: when a client registered with it before, that client's token hash
 * becomes token_hash (its old token stops working), *existed is 1 and
 * *client_id is its id; otherwise a new client is stored with it (*existed
 * 0). One transaction. Errors: STRATA_EINVAL (bad argument), STRATA_ESTATE
 * when another client has this token hash. */
int strata_store_client_add(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                            const char *name, const char *registration_id, uint64_t *client_id,
                            int *existed, strata_diag *diag);

/* Looks up the client registered with registration_id (borrowed): *found
 * 1 and its id in *client_id, or *found 0 (both zeroed on entry). Changes
 * nothing. Errors: STRATA_EINVAL (NULL argument), the database's. */
int strata_store_registration_find(strata_store *s, const char *registration_id,
                                   uint64_t *client_id, int *found, strata_diag *diag);

/* Looks a client up by id. Not registered: STRATA_OK with *found = 0. */
int strata_store_client_get(strata_store *s, uint64_t client_id, strata_store_client *out,
                            int *found, strata_diag *diag);

/* Looks a client up by the SHA-256 of its token. Not registered: STRATA_OK
 * with *found = 0. */
int strata_store_client_find(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                             strata_store_client *out, int *found, strata_diag *diag);

int strata_store_client_count(strata_store *s, uint64_t *count, strata_diag *diag);

/* Sets the last-seen time of clients ids[0, n) to seen_ms[i] (Unix ms;
 * raises or lowers it as given), in one transaction committed without an
 * fsync of its own (synchronous=NORMAL): a power loss may forget the latest
 * times, a process crash does not. Unknown ids are skipped. Errors:
 * STRATA_EINVAL (NULL argument), STRATA_EIO (nothing is changed). */
int strata_store_clients_seen(strata_store *s, const uint64_t *ids, const int64_t *seen_ms,
                              size_t n, strata_diag *diag);

/* ---- Rounds ----------------------------------------------------------- */

typedef enum {
    STRATA_STORE_ROUND_OPEN = 0,
    STRATA_STORE_ROUND_CLOSED = 1
} strata_store_round_state;

typedef struct strata_store_round {
    uint32_t round;
    uint64_t model_version;
    strata_store_round_state state;
    int64_t opened_unix_ms;
    int64_t deadline_unix_ms;
    int64_t closed_unix_ms; /* 0 while open */
    int sealed;             /* open, but taking no more updates (strata_store_round_seal) */
    uint64_t *selected;     /* owned, ascending; NULL in lists (see round_list) */
    size_t n_selected;      /* always set */
    uint64_t n_updates;     /* acknowledged updates */
    char *task_json;        /* owned; NULL when none was given */
    char *summary_json;     /* owned; NULL while open or when none was given */
} strata_store_round;

/* Frees what a strata_store_round owns and zeroes it. Accepts NULL. */
void strata_store_round_cleanup(strata_store_round *r);

/* Opens round `round` for model_version with the n selected (registered,
 * distinct) clients and a deadline (the store records it; enforcing it is the
 * caller's job). task_json (may be NULL) is any valid JSON the caller wants
 * back after a restart, e.g. the task's budgets. Rounds open in increasing
 * order and one at a time. Errors: STRATA_ESTATE when a round numbered
 * `round` or higher exists or another round is still open; STRATA_EINVAL for
 * n == 0, duplicate or unregistered clients, invalid JSON. */
int strata_store_round_open(strata_store *s, uint32_t round, uint64_t model_version,
                            const uint64_t *selected, size_t n, int64_t deadline_unix_ms,
                            const char *task_json, strata_diag *diag);

/* Reads round `round` into *out (caller cleans it up with
 * strata_store_round_cleanup). Unknown round: STRATA_OK with *found = 0. */
int strata_store_round_get(strata_store *s, uint32_t round, strata_store_round *out, int *found,
                           strata_diag *diag);

/* Closes an open round and stores its summary (metrics) JSON, which may be
 * NULL. After this, uploads for the round are rejected. Errors: STRATA_ESTATE
 * for an unknown or already closed round; STRATA_EINVAL for invalid JSON. */
int strata_store_round_close(strata_store *s, uint32_t round, const char *summary_json,
                             strata_diag *diag);

/* Ends the uploads of open round `round`, the first write of its close:
 * from this call's commit on, every commit of an update for the round (by
 * any connection of any process) is refused with
 * STRATA_STORE_REJECT_ROUND_CLOSED, so the updates a closer lists next are
 * final. The round stays open (reads back with sealed = 1) until
 * strata_store_round_close. Sealing a sealed round changes nothing.
 * Errors: STRATA_ESTATE for an unknown or closed round. */
int strata_store_round_seal(strata_store *s, uint32_t round, strata_diag *diag);

/* The highest round number. No round yet: STRATA_OK with *found = 0. */
int strata_store_last_round(strata_store *s, uint32_t *round, int *found, strata_diag *diag);

/* Lists up to `limit` (>= 1) rounds numbered `from` or higher, ascending,
 * into a new array *out of *n entries (free with
 * strata_store_round_list_free; *out is NULL when *n is 0). The next page
 * starts at the last round + 1. `selected` is NULL in the entries;
 * n_selected is set. */
int strata_store_round_list(strata_store *s, uint32_t from, size_t limit, strata_store_round **out,
                            size_t *n, strata_diag *diag);

void strata_store_round_list_free(strata_store_round *rounds, size_t n);

/* ---- Updates ---------------------------------------------------------- */

typedef struct strata_store_receipt {
    char id[STRATA_STORE_RECEIPT_LEN + 1]; /* random, lowercase hex */
    uint8_t sha256[STRATA_STORE_HASH_LEN]; /* of the payload */
    uint64_t bytes;
    uint64_t samples;
    int64_t received_unix_ms;
    int duplicate; /* 1: this put repeated an earlier one, nothing changed */
} strata_store_receipt;

/* Why strata_store_update_put accepted or refused an update. */
typedef enum {
    STRATA_STORE_ACCEPTED = 0,             /* stored now (HTTP 200) */
    STRATA_STORE_DUPLICATE = 1,            /* stored before; original receipt (200) */
    STRATA_STORE_REJECT_UNKNOWN_ROUND = 2, /* STRATA_ESTATE (HTTP 404 or 409) */
    STRATA_STORE_REJECT_ROUND_CLOSED = 3,  /* STRATA_ESTATE (HTTP 409) */
    STRATA_STORE_REJECT_NOT_SELECTED = 4,  /* STRATA_ESTATE (HTTP 403) */
    STRATA_STORE_REJECT_CONFLICT = 5       /* STRATA_ESTATE: other bytes stored (HTTP 409) */
} strata_store_verdict;

/* Stores client_id's update for round `round` durably (see the contract at
 * the top): payload (borrowed, 1 to STRATA_STORE_PAYLOAD_MAX bytes) and
 * its metadata go to the database, and *receipt describes it. samples > 0 is the FedAvg weight.
 *
 * Idempotent by (client, round): when the client already has an update for
 * the round with the same bytes (SHA-256), nothing changes (even when the
 * round has closed since) and the call returns STRATA_OK with the ORIGINAL
 * receipt, receipt->duplicate = 1 and *verdict = STRATA_STORE_DUPLICATE.
 * When the stored update's bytes differ, nothing changes either and the
 * call refuses with STRATA_STORE_REJECT_CONFLICT.
 *
 * Refusals return STRATA_ESTATE and say why in *verdict: unknown round,
 * closed round, a client not selected for the round, or a conflict. verdict may be NULL.
 * Other errors (EINVAL, EIO, ENOMEM) leave *verdict at ACCEPTED's value 0 and
 * must not be acknowledged. */
int strata_store_update_put(strata_store *s, uint32_t round, uint64_t client_id,
                            const uint8_t *payload, size_t len, uint64_t samples,
                            strata_store_receipt *receipt, strata_store_verdict *verdict,
                            strata_diag *diag);

/* ---- Updates in two steps: prepare, then commit (alone or in groups) -----
 *
 * strata_store_update_put is strata_store_update_prepare followed by
 * strata_store_update_commit. A caller that serialises its store calls under
 * a lock can run the part that needs no connection (hashing and copying
 * the payload) before taking the lock, and commit several prepared updates
 * in one transaction (one synchronous commit for all). The
 * durability contract is the same: an update may be acknowledged only once
 * its commit says so. */

/* An update ready to commit: a copy of its payload, its SHA-256 and its
 * receipt id; nothing stored yet. Opaque. */
typedef struct strata_store_pending strata_store_pending;

/* Copies client_id's payload for `round` (borrowed, len > 0 bytes),
 * computes its SHA-256 and draws a receipt id. Touches no connection (s is
 * only checked for NULL), so it may run in any thread at the same time as any other call on s or
 * its secondaries (typically before the caller takes the lock that serialises its use of s).
 * Nothing becomes visible to readers; the round, the selection and duplicates are checked by the
 * commit. *out (pass it to a commit, or discard it with strata_store_pending_free) is NULL on
 * error. Errors: STRATA_EINVAL for the argument checks of strata_store_update_put (len > 0, samples
 * > 0, ids and sizes that fit), STRATA_EIO (no random bytes for the receipt), STRATA_ENOMEM. */
int strata_store_update_prepare(const strata_store *s, uint32_t round, uint64_t client_id,
                                const uint8_t *payload, size_t len, uint64_t samples,
                                strata_store_pending **out, strata_diag *diag);

/* Discards a prepared update (frees it).
 * Accepts NULL. Thread-safe for distinct pendings. */
void strata_store_pending_free(strata_store_pending *p);

/* Commits a prepared update with exactly the outcomes, refusals and
 * durability of strata_store_update_put (receipt, verdict, STRATA_ESTATE for
 * a refusal, other errors must not be acknowledged). Takes ownership of p,
 * which is freed in every case. Like every call that uses s's connection: one thread at a time
 * per s. STRATA_EINVAL when p or receipt is NULL. */
int strata_store_update_commit(strata_store *s, strata_store_pending *p,
                               strata_store_receipt *receipt, strata_store_verdict *verdict,
                               strata_diag *diag);

/* Group commit: commits the n (distinct) prepared updates p[0..n-1] in one
 * write transaction, with one synchronous (synchronous=FULL) commit for all
 * of them. Item i gets
 * results[i] = STRATA_OK (accepted, or a duplicate with the original
 * receipt) or STRATA_ESTATE (refused: verdicts[i] says why), and receipts[i]
 * and verdicts[i] as strata_store_update_put would set them. Items of one
 * batch are decided in order, so a second item for the same (round, client)
 * is a duplicate of the first.
 *
 * Returns STRATA_OK when the transaction committed: every item whose
 * results[i] is STRATA_OK is then durable and may be acknowledged. Any other
 * return (STRATA_EIO, STRATA_ENOMEM; STRATA_EINVAL for a NULL array or item)
 * fails the whole batch: results[i] hold that error for every i, no item may
 * be acknowledged and the transaction is rolled back (a retry is then
 * stored anew, or
 * answered as a duplicate should a failed COMMIT have reached the disk after
 * all, as with strata_store_update_put). Takes ownership of every p[i]
 * (freed in every case). receipts, verdicts and results have n entries each;
 * n == 0 does nothing. */
int strata_store_update_commit_many(strata_store *s, strata_store_pending *const *p, size_t n,
                                    strata_store_receipt *receipts, strata_store_verdict *verdicts,
                                    int *results, strata_diag *diag);

typedef struct strata_store_update {
    uint32_t round;
    uint64_t client_id;
    strata_store_receipt receipt; /* duplicate = 0 */
} strata_store_update;

/* Lists the acknowledged updates of a round in the order they were accepted
 * (replaying them in this order reproduces a streaming aggregate exactly)
 * into a new array (free with strata_store_update_list_free). An unknown
 * round gives an empty list. */
int strata_store_update_list(strata_store *s, uint32_t round, strata_store_update **out, size_t *n,
                             strata_diag *diag);

/* strata_store_update_list without the first `from` updates of that order
 * (which never changes: an update is only ever appended to it), so that a
 * caller that listed them before reads only what came since. */
int strata_store_update_list_from(strata_store *s, uint32_t round, size_t from,
                                  strata_store_update **out, size_t *n, strata_diag *diag);

void strata_store_update_list_free(strata_store_update *updates, size_t n);

/* Looks up client_id's update for a round: *found 1 and its receipt in
 * *receipt (duplicate = 0; may be NULL), or *found 0. Changes nothing.
 * Errors: STRATA_EINVAL (NULL found), the database's. */
int strata_store_update_find(strata_store *s, uint32_t round, uint64_t client_id,
                             strata_store_receipt *receipt, int *found, strata_diag *diag);

/* Reads client_id's payload for a round into a new buffer *buf (free()) and
 * checks its length and SHA-256 against the row. Errors: STRATA_ESTATE when
 * there is no such update, STRATA_EIO when the stored bytes do not match
 * (corruption). */
int strata_store_update_read(strata_store *s, uint32_t round, uint64_t client_id, uint8_t **buf,
                             size_t *len, strata_diag *diag);

/* ---- Leadership --------------------------------------------------------- */

/* Who leads the store: the coordinator that may write to it. */
typedef struct strata_store_leader {
    int64_t epoch;         /* raised by every change of leader; 0: none yet */
    char holder[64];       /* the leader's name (strata_store_lead's holder) */
    int64_t expires_in_ms; /* its lease's time left (<= 0: expired) */
    int lock_held;         /* some session holds the leader's lock (strata_store_lead): the
                              leader's process is alive or the lock was just taken (1 for
                              a store whose opener always leads) */
} strata_store_leader;

/* Makes s (and every secondary opened from it afterwards) the store's
 * leader under the name holder (1 to 63 printable ASCII bytes) for
 * lease_ms (100 to 3,600,000) milliseconds, when no other leader's lease
 * runs: none yet, its lease expired, or its session ended (it died). The
 * epoch goes up by one; from then on every write transaction of s and of
 * its secondaries first checks, in the same transaction, that the store's
 * epoch is still this one, and fails with STRATA_ESTATE ("fenced")
 * otherwise, so that a leader that was paused or cut off past its lease
 * never writes again. *out (may be NULL) receives the leader after the
 * call. Errors: STRATA_ESTATE when another leader's lease runs (*out says
 * whose and for how long), STRATA_EIO. The SQLite backend, whose
 * directory lock already makes its opener the one writer, always grants
 * it (epoch 1). The times are the database server's clock. */
int strata_store_lead(strata_store *s, const char *holder, int64_t lease_ms,
                      strata_store_leader *out, strata_diag *diag);

/* Renews the lease of s's leadership for lease_ms from now. Errors:
 * STRATA_ESTATE when s does not lead (never did, or was fenced: another
 * leader took over), STRATA_EIO. */
int strata_store_renew(strata_store *s, int64_t lease_ms, strata_diag *diag);

/* The store's current leader (epoch 0 and an empty holder when none). */
int strata_store_leader_get(strata_store *s, strata_store_leader *out, strata_diag *diag);

/* ---- Change notifications ----------------------------------------------- */

/* What changed in the store since the last strata_store_changes_wait. */
typedef struct strata_store_changes {
    int clients; /* a client registered (or registered again) */
    int rounds;  /* a round opened, was sealed or closed */
    int updates; /* updates were stored */
    int models;  /* a model version was recorded */
} strata_store_changes;

/* Subscribes s's connection to the store's change notifications, which
 * every commit of a write sends, whichever process's connection made it
 * (PostgreSQL: LISTEN/NOTIFY on a channel of the store's schema). s is
 * then for the caller's waits alone (one thread). Errors: STRATA_EINVAL for
 * a backend without notifications (SQLite: one process owns its store),
 * STRATA_EIO. */
int strata_store_changes_listen(strata_store *s, strata_diag *diag);

/* Waits up to timeout_ms (0 to 60,000) for notifications on a listening s
 * and takes every one that has arrived: *out says what changed (all 0:
 * nothing within the timeout). After the connection was lost (and made
 * again here), every field is 1: notifications sent meanwhile are lost,
 * so the caller reads everything again. Errors: STRATA_EINVAL (s does not
 * listen), STRATA_EIO (the database cannot be reached; wait again
 * later). */
int strata_store_changes_wait(strata_store *s, int timeout_ms, strata_store_changes *out,
                              strata_diag *diag);

/* ---- Checkpoints ------------------------------------------------------ */

/* Writes the path of model_version's checkpoint into buf (len bytes):
 * <dir>/checkpoints/model-<version>.safetensors. STRATA_ETOOBIG when it does
 * not fit. Save the model there with strata_checkpoint_save (durable,
 * temp-then-rename), then call strata_store_checkpoint_record. */
int strata_store_checkpoint_path(const strata_store *s, uint64_t model_version, char *buf,
                                 size_t len, strata_diag *diag);

/* Records that model_version's checkpoint file is complete (it must exist).
 * Recording a version again replaces the record. With PostgreSQL, the same
 * transaction also stores in the database each of the version's files
 * that is in the state directory (STRATA_STORE_FILE_CHECKPOINT,
 * _SERVER_OPT, _SERVER_MODEL, _DELTA; read in chunks of
 * STRATA_STORE_FILE_CHUNK bytes, with their size and SHA-256), so that the
 * directory is only a cache: a coordinator started with an empty one
 * fetches what it reads (strata_store_file_fetch). */
int strata_store_checkpoint_record(strata_store *s, uint64_t model_version, strata_diag *diag);

#define STRATA_STORE_FILE_CHUNK ((size_t)4 << 20)

/* Makes sure the file `kind` of `version` (one of the four kinds above) is
 * at its path in the state directory as the store keeps it: *found = 1
 * when it is (then it may be read), 0 when the store has no such file.
 * SQLite: the directory's file is the store's copy; *found says whether it
 * exists. PostgreSQL: a file in the directory that has the stored size and
 * SHA-256 is kept; otherwise the stored one is written there (chunk by
 * chunk, to a temporary file, checked, fsync'ed and renamed). Errors:
 * STRATA_EINVAL (another kind), STRATA_EIO (including a stored file whose
 * chunks do not add up to its size and hash). */
int strata_store_file_fetch(strata_store *s, strata_store_file kind, uint64_t version, int *found,
                            strata_diag *diag);

/* Removes the file `kind` of `version` from the state directory and, with
 * PostgreSQL, from the database (a leader's write: fenced). A file that is
 * not there is no error. */
int strata_store_file_remove(strata_store *s, strata_store_file kind, uint64_t version,
                             strata_diag *diag);

/* The highest recorded model version. None: STRATA_OK with *found = 0. */
int strata_store_latest_model_version(strata_store *s, uint64_t *model_version, int *found,
                                      strata_diag *diag);

/* ---- Persistent counters (for /metrics) ------------------------------- */

/* A counter's name and value; a delta in strata_store_counter_add_many. */
typedef struct strata_store_counter {
    char name[STRATA_STORE_COUNTER_NAME_MAX + 1];
    int64_t value;
} strata_store_counter;

/* Adds delta to counter `name` (created at 0): 1 to
 * STRATA_STORE_COUNTER_NAME_MAX printable ASCII bytes, e.g.
 * `updates_rejected_total{reason="shape"}`. STRATA_ETOOBIG when the sum
 * would overflow int64_t (the counter is unchanged). Like clients_seen,
 * committed with synchronous=NORMAL: survives a process crash; a power loss
 * may forget the latest additions. Counters that must match acknowledged
 * data exactly should be derived from the updates instead. */
int strata_store_counter_add(strata_store *s, const char *name, int64_t delta, strata_diag *diag);

/* Adds n deltas in one transaction (all or nothing). */
int strata_store_counter_add_many(strata_store *s, const strata_store_counter *deltas, size_t n,
                                  strata_diag *diag);

/* The counter's value; 0 for a counter never added to. */
int strata_store_counter_get(strata_store *s, const char *name, int64_t *value, strata_diag *diag);

#endif
