/* The seam between the store's interface (store.h) and its backends: the
 * operations table every backend fills, the part of struct strata_store
 * that every backend shares, and the prepared update that the interface
 * builds and a backend commits. Included by store.c and by each backend's
 * files (today the SQLite backend, store_sqlite*.c); nothing else.
 *
 * store.c does what every backend would do the same way: argument checks
 * that need no state, zeroing the out-parameters and clearing diag, the
 * receipt ids and hashes of prepared updates, freeing lists. So an
 * operation below is called with non-NULL s and pointer arguments (those
 * the contract allows to be NULL excepted), out-parameters already zeroed
 * and diag cleared, and implements only what the stored state decides. Each
 * operation's contract is the function of store.h with the same name. */
#ifndef STRATA_SERVER_STORE_BACKEND_H
#define STRATA_SERVER_STORE_BACKEND_H

#include "store.h"

#include <stddef.h>
#include <stdint.h>

/* A prepared update (strata_store_update_prepare): everything a commit
 * needs, computed without a connection. */
struct strata_store_pending {
    uint32_t round;
    uint64_t client_id;
    strata_store_receipt r; /* id, sha256, bytes, samples; received_unix_ms at commit */
    uint8_t *body;          /* a copy of the payload (r.bytes bytes) */
};

typedef struct strata_store_ops {
    const char *name; /* "sqlite" */
    int (*open_secondary)(const strata_store *primary, strata_store **out, strata_diag *diag);
    void (*close)(strata_store *s);

    /* name (never NULL) and registration_id (NULL or 1 to
     * STRATA_STORE_REGISTRATION_MAX bytes) checked. */
    int (*client_add)(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                      const char *name, const char *registration_id, uint64_t *client_id,
                      int *existed, strata_diag *diag);
    int (*registration_find)(strata_store *s, const char *registration_id, uint64_t *client_id,
                             int *found, strata_diag *diag);
    int (*client_get)(strata_store *s, uint64_t client_id, strata_store_client *out, int *found,
                      strata_diag *diag);
    int (*client_find)(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                       strata_store_client *out, int *found, strata_diag *diag);
    int (*client_count)(strata_store *s, uint64_t *count, strata_diag *diag);
    int (*clients_seen)(strata_store *s, const uint64_t *ids, const int64_t *seen_ms, size_t n,
                        strata_diag *diag);

    /* selected: n >= 1 ids (the backend checks that each is registered), sorted ascending without
     * repeats; task_json valid JSON or NULL; model_version fits int64_t. */
    int (*round_open)(strata_store *s, uint32_t round, uint64_t model_version,
                      const uint64_t *selected, size_t n, int64_t deadline_unix_ms,
                      const char *task_json, strata_diag *diag);
    int (*round_get)(strata_store *s, uint32_t round, strata_store_round *out, int *found,
                     strata_diag *diag);
    /* summary_json: valid JSON or NULL. */
    int (*round_close)(strata_store *s, uint32_t round, const char *summary_json,
                       strata_diag *diag);
    int (*round_seal)(strata_store *s, uint32_t round, strata_diag *diag);
    int (*last_round)(strata_store *s, uint32_t *round, int *found, strata_diag *diag);
    int (*round_list)(strata_store *s, uint32_t from, size_t limit, strata_store_round **out,
                      size_t *n, strata_diag *diag);

    /* strata_store_update_commit_many's semantics for the n (non-NULL)
     * items, which stay the caller's (borrowed). item_diag, when not NULL,
     * receives the reason of an item's refusal (n is then 1). */
    int (*update_commit)(strata_store *s, strata_store_pending *const *p, size_t n,
                         strata_store_receipt *receipts, strata_store_verdict *verdicts,
                         int *results, strata_diag *item_diag, strata_diag *diag);
    /* from: the updates to leave out first, in acceptance order (fits int64_t). */
    int (*update_list)(strata_store *s, uint32_t round, size_t from, strata_store_update **out,
                       size_t *n, strata_diag *diag);
    int (*update_find)(strata_store *s, uint32_t round, uint64_t client_id,
                       strata_store_receipt *receipt, int *found, strata_diag *diag);
    int (*update_read)(strata_store *s, uint32_t round, uint64_t client_id, uint8_t **buf,
                       size_t *len, strata_diag *diag);

    /* The checkpoint file exists and has `bytes` bytes (store.c checked). */
    int (*checkpoint_record)(strata_store *s, uint64_t model_version, uint64_t bytes,
                             strata_diag *diag);
    int (*latest_model_version)(strata_store *s, uint64_t *model_version, int *found,
                                strata_diag *diag);

    /* Counter names checked (1 to STRATA_STORE_COUNTER_NAME_MAX bytes of
     * printable ASCII); n >= 1. */
    int (*counter_add_many)(strata_store *s, const strata_store_counter *deltas, size_t n,
                            strata_diag *diag);
    int (*counter_get)(strata_store *s, const char *name, int64_t *value, strata_diag *diag);

    /* Leadership (NULL for a backend whose opener is always the one
     * writer: store.c then answers epoch 1). holder and lease_ms checked. */
    int (*lead)(strata_store *s, const char *holder, int64_t lease_ms, strata_store_leader *out,
                strata_diag *diag);
    int (*renew)(strata_store *s, int64_t lease_ms, strata_diag *diag);
    int (*leader_get)(strata_store *s, strata_store_leader *out, strata_diag *diag);

    /* Change notifications (NULL for a backend without them). timeout_ms
     * checked. */
    int (*changes_listen)(strata_store *s, strata_diag *diag);
    int (*changes_wait)(strata_store *s, int timeout_ms, strata_store_changes *out,
                        strata_diag *diag);

    /* The version's files (NULL for a backend whose files are the state
     * directory's: store.c then checks existence and unlinks). kind is
     * checked; path is its file in the state directory. */
    int (*file_fetch)(strata_store *s, strata_store_file kind, uint64_t version, const char *path,
                      int *found, strata_diag *diag);
    int (*file_remove)(strata_store *s, strata_store_file kind, uint64_t version,
                       strata_diag *diag);
} strata_store_ops;

/* What every backend's handle starts with (a backend's own structure has
 * it as its first member). */
struct strata_store {
    const strata_store_ops *ops;
    char *dir;        /* the state directory (checkpoints, lock, admin token) */
    size_t recovered; /* files the open's recovery removed */
};

/* Whether an unsigned value fits a signed 64-bit column. */
#define FITS_I64(v) ((uint64_t)(v) <= (uint64_t)INT64_MAX)

/* Helpers of store.c for the backends. */

/* Clears diag and checks that s is a store; the prologue of every call
 * that dispatches to the backend. */
int strata__store_enter(const strata_store *s, const char *what, strata_diag *diag);

/* Empties diag's message (diag may be NULL). */
void strata__store_diag_clear(strata_diag *diag);

/* Wall-clock time in Unix milliseconds (stored timestamps). */
int64_t strata__store_now_ms(void);

/* mkdir (mode 0700) that accepts an existing directory; *created says
 * whether it made one. */
int strata__store_make_dir(const char *path, int *created, strata_diag *diag);

/* Makes the state directory's layout (state_dir and its checkpoints/,
 * 0700; the directory fsync'ed when one was created) and takes its lock
 * into *lock_fd (flock, exclusive). Errors: STRATA_ESTATE when another store
 * holds the lock, STRATA_EIO. */
int strata__store_lock_dir(const char *state_dir, int *lock_fd, strata_diag *diag);

/* Open-time recovery of the files every backend keeps in the state
 * directory: removes the temporary files of interrupted checkpoint writes,
 * counting them in s->recovered. */
int strata__store_recover_files(strata_store *s, strata_diag *diag);

/* The backends' operations (store_sqlite.c, store_pg.c). */
extern const strata_store_ops strata__store_sqlite_ops;
extern const strata_store_ops strata__store_pg_ops;

#endif
