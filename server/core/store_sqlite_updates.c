/* The SQLite backend's updates: the group commit of prepared updates (rows
 * and payload bodies in one transaction, one synchronous commit), the list
 * of a round's updates and the verified read of one payload. */
#include "store_sqlite.h"

#include "strata/buf.h"

#include "strata/fileio.h"
#include "strata/hash.h"

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
static int find_update(sq_store *s, uint32_t round, uint64_t client, strata_store_receipt *receipt,
                       int *found, strata_diag *diag)
{
    sqlite3_stmt *st = strata__store_stmt(s, S_UPDATE_GET);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, (int64_t)client);
    int step = sqlite3_step(st), rc = STRATA_OK;
    *found = 0;
    if (step == SQLITE_ROW) {
        *found = 1;
        if (receipt != NULL)
            read_receipt(st, 0, receipt);
    } else if (step != SQLITE_DONE) {
        rc = strata__store_db_error(s, diag, "look up update");
    }
    strata__store_stmt_done(st);
    return rc;
}

/* Decides whether (round, client) may upload the payload whose SHA-256 is
 * sha256: 1 duplicate (receipt filled), 0 acceptable, STRATA_ESTATE with
 * *verdict set when refused (a stored update with other bytes: conflict). */
static int check_put(sq_store *s, uint32_t round, uint64_t client,
                     const uint8_t sha256[STRATA_STORE_HASH_LEN], strata_store_receipt *receipt,
                     strata_store_verdict *verdict, strata_diag *diag)
{
    int found;
    int rc = find_update(s, round, client, receipt, &found, diag);
    if (rc < 0)
        return rc;
    if (found && memcmp(receipt->sha256, sha256, STRATA_STORE_HASH_LEN) != 0) {
        *verdict = STRATA_STORE_REJECT_CONFLICT;
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "client %" PRIu64 " already has an update with other content for "
                             "round %" PRIu32 " (receipt %s); it is kept",
                             client, round, receipt->id);
        memset(receipt, 0, sizeof(*receipt));
        return rc;
    }
    if (found) {
        receipt->duplicate = 1;
        *verdict = STRATA_STORE_DUPLICATE;
        return 1;
    }
    int64_t state;
    int is_null;
    rc = strata__store_query_int(s, S_ROUND_STATE, 1, round, 0, &state, &is_null, "round state",
                                 diag);
    if (rc < 0)
        return rc;
    if (is_null) {
        *verdict = STRATA_STORE_REJECT_UNKNOWN_ROUND;
        return strata_diag_set(diag, STRATA_ESTATE, "round %" PRIu32 " does not exist", round);
    }
    if (state != 0) {
        *verdict = STRATA_STORE_REJECT_ROUND_CLOSED;
        return strata_diag_set(diag, STRATA_ESTATE, "round %" PRIu32 " is %s", round,
                               state == 2 ? "closing" : "closed");
    }
    int64_t one;
    rc = strata__store_query_int(s, S_IS_SELECTED, 2, round, (int64_t)client, &one, &is_null,
                                 "selected client", diag);
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

/* Inserts the row and the payload of an accepted item (in the open
 * transaction). */
static int insert_update(sq_store *s, const strata_store_pending *q, int64_t received,
                         strata_diag *diag)
{
    sqlite3_stmt *st = strata__store_stmt(s, S_UPDATE_INSERT);
    sqlite3_bind_int64(st, 1, q->round);
    sqlite3_bind_int64(st, 2, (int64_t)q->client_id);
    sqlite3_bind_text(st, 3, q->r.id, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 4, q->r.sha256, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, (int64_t)q->r.bytes);
    sqlite3_bind_int64(st, 6, (int64_t)q->r.samples);
    sqlite3_bind_int64(st, 7, received);
    int rc = strata__store_exec_stmt(s, S_UPDATE_INSERT, diag, "insert update");
    if (rc < 0)
        return rc;
    st = strata__store_stmt(s, S_PAYLOAD_INSERT);
    sqlite3_bind_int64(st, 1, sqlite3_last_insert_rowid(s->db));
    sqlite3_bind_blob64(st, 2, q->body, q->r.bytes, SQLITE_STATIC);
    return strata__store_exec_stmt(s, S_PAYLOAD_INSERT, diag, "insert payload");
}

int strata__sqlite_update_find(strata_store *base, uint32_t round, uint64_t client_id,
                               strata_store_receipt *receipt, int *found, strata_diag *diag)
{
    return find_update((sq_store *)base, round, client_id, receipt, found, diag);
}

int strata__sqlite_update_commit(strata_store *base, strata_store_pending *const *p, size_t n,
                                 strata_store_receipt *receipts, strata_store_verdict *verdicts,
                                 int *results, strata_diag *item_diag, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    /* Under the write lock: decide (another connection may have stored an
     * update or closed the round since the caller looked) and insert each
     * accepted row with its payload; then one synchronous commit for the
     * lot (one fsync of the write-ahead log). */
    int rc = strata__store_tx_begin(s, diag);
    if (rc < 0)
        goto out;
    int64_t received = strata__store_now_ms();
    for (size_t i = 0; i < n; i++) {
        strata_store_pending *q = p[i];
        strata_diag d;
        d.msg[0] = '\0';
        int c = check_put(s, q->round, q->client_id, q->r.sha256, &receipts[i], &verdicts[i], &d);
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
        rc = insert_update(s, q, received, diag);
        if (rc < 0)
            goto out;
        receipts[i] = q->r;
        receipts[i].received_unix_ms = received;
    }
    rc = strata__store_tx_commit(s, diag);
out:
    if (rc < 0) {
        strata__store_tx_rollback(s);
        for (size_t i = 0; i < n; i++) {
            memset(&receipts[i], 0, sizeof(receipts[i]));
            verdicts[i] = STRATA_STORE_ACCEPTED;
            results[i] = rc;
        }
    }
    return rc;
}

int strata__sqlite_update_list(strata_store *base, uint32_t round, size_t from,
                               strata_store_update **out, size_t *n, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    strata_store_update *arr = NULL;
    size_t k = 0, cap = 0;
    sqlite3_stmt *st = strata__store_stmt(s, S_UPDATE_LIST);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, (int64_t)from);
    int step, rc = STRATA_OK;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        strata_store_update *grown = strata_array_grow(arr, &cap, k + 1, sizeof(*arr));
        if (grown == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
            break;
        }
        arr = grown;
        strata_store_update *u = &arr[k++];
        memset(u, 0, sizeof(*u));
        u->round = round;
        u->client_id = (uint64_t)sqlite3_column_int64(st, 0);
        read_receipt(st, 1, &u->receipt);
    }
    if (rc == STRATA_OK && step != SQLITE_DONE)
        rc = strata__store_db_error(s, diag, "list updates");
    strata__store_stmt_done(st);
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

int strata__sqlite_update_read(strata_store *base, uint32_t round, uint64_t client_id,
                               uint8_t **buf, size_t *len, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    if (!FITS_I64(client_id))
        return strata_diag_set(diag, STRATA_ESTATE,
                               "no update of client %" PRIu64 " for round %" PRIu32, client_id,
                               round);
    sqlite3_stmt *st = strata__store_stmt(s, S_PAYLOAD_GET);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, (int64_t)client_id);
    int step = sqlite3_step(st), rc = STRATA_OK;
    uint8_t *data = NULL;
    if (step == SQLITE_DONE) {
        rc =
            strata_diag_set(diag, STRATA_ESTATE,
                            "no update of client %" PRIu64 " for round %" PRIu32, client_id, round);
    } else if (step != SQLITE_ROW) {
        rc = strata__store_db_error(s, diag, "read update");
    } else {
        const void *body = sqlite3_column_blob(st, 2);
        int64_t bytes = sqlite3_column_int64(st, 0);
        size_t got = (size_t)sqlite3_column_bytes(st, 2);
        const void *sha = sqlite3_column_blob(st, 1);
        uint8_t h[STRATA_STORE_HASH_LEN];
        if (body != NULL)
            strata_sha256(body, got, h);
        if (body == NULL || bytes < 0 || (uint64_t)bytes != got || sha == NULL ||
            sqlite3_column_bytes(st, 1) != STRATA_STORE_HASH_LEN || memcmp(h, sha, sizeof(h)) != 0)
            rc = strata_diag_set(diag, STRATA_EIO,
                                 "update of client %" PRIu64 " for round %" PRIu32
                                 ": the stored payload differs from the acknowledged one",
                                 client_id, round);
        else if ((data = malloc(got)) == NULL)
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        else
            memcpy(data, body, got);
        if (rc == STRATA_OK) {
            *buf = data;
            *len = got;
        }
    }
    strata__store_stmt_done(st);
    return rc;
}
