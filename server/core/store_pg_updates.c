/* The PostgreSQL backend's updates: the group commit of prepared updates
 * (rows and payload bodies in one transaction, one synchronous commit), the
 * list of a round's updates and the verified read of one payload. */
#include "store_pg.h"

#include "strata/buf.h"
#include "strata/hash.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fills r from a text-result row whose receipt columns (receipt, sha256,
 * bytes, samples, received_ms) start at col. */
static void read_receipt(const PGresult *res, int row, int col, strata_store_receipt *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "%s", PQgetvalue(res, row, col));
    strata__pg_col_bytes(res, row, col + 1, r->sha256, STRATA_STORE_HASH_LEN);
    r->bytes = (uint64_t)strata__pg_col_int(res, row, col + 2);
    r->samples = (uint64_t)strata__pg_col_int(res, row, col + 3);
    r->received_unix_ms = strata__pg_col_int(res, row, col + 4);
}

/* Decides whether q may be stored: 1 duplicate (receipt filled), 0
 * acceptable, STRATA_ESTATE with *verdict set when refused. */
static int check_put(pg_store *s, const strata_store_pending *q, strata_store_receipt *receipt,
                     strata_store_verdict *verdict, strata_diag *diag)
{
    pg_params p = {.n = 0};
    strata__pg_int(&p, q->round);
    strata__pg_int(&p, (int64_t)q->client_id);
    PGresult *r = strata__pg_run(s, P_UPDATE_CHECK, &p, 0, 1, "look up update", diag);
    if (r == NULL)
        return STRATA_EIO;
    int rc = 0;
    int no_round = PQgetisnull(r, 0, 0), state = (int)strata__pg_col_int(r, 0, 0);
    int selected = strcmp(PQgetvalue(r, 0, 1), "t") == 0, stored = !PQgetisnull(r, 0, 2);
    if (stored)
        read_receipt(r, 0, 2, receipt);
    PQclear(r);
    if (stored && memcmp(receipt->sha256, q->r.sha256, STRATA_STORE_HASH_LEN) != 0) {
        *verdict = STRATA_STORE_REJECT_CONFLICT;
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "client %" PRIu64 " already has an update with other content for "
                             "round %" PRIu32 " (receipt %s); it is kept",
                             q->client_id, q->round, receipt->id);
        memset(receipt, 0, sizeof(*receipt));
    } else if (stored) {
        receipt->duplicate = 1;
        *verdict = STRATA_STORE_DUPLICATE;
        rc = 1;
    } else if (no_round) {
        *verdict = STRATA_STORE_REJECT_UNKNOWN_ROUND;
        rc = strata_diag_set(diag, STRATA_ESTATE, "round %" PRIu32 " does not exist", q->round);
    } else if (state != 0) {
        *verdict = STRATA_STORE_REJECT_ROUND_CLOSED;
        rc = strata_diag_set(diag, STRATA_ESTATE, "round %" PRIu32 " is %s", q->round,
                             state == 2 ? "closing" : "closed");
    } else if (!selected) {
        *verdict = STRATA_STORE_REJECT_NOT_SELECTED;
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "client %" PRIu64 " is not selected for round %" PRIu32, q->client_id,
                             q->round);
    }
    return rc;
}

/* Inserts the row and the payload of an accepted item (in the open
 * transaction). */
static int insert_update(pg_store *s, const strata_store_pending *q, int64_t received,
                         strata_diag *diag)
{
    pg_params p = {.n = 0};
    strata__pg_int(&p, q->round);
    strata__pg_int(&p, (int64_t)q->client_id);
    strata__pg_text(&p, q->r.id);
    strata__pg_bytes(&p, q->r.sha256, STRATA_STORE_HASH_LEN);
    strata__pg_int(&p, (int64_t)q->r.bytes);
    strata__pg_int(&p, (int64_t)q->r.samples);
    strata__pg_int(&p, received);
    strata__pg_bytes(&p, q->body, q->r.bytes);
    return strata__pg_exec(s, P_UPDATE_INSERT, &p, "insert update", diag);
}

/* A COMMIT whose answer was lost with the connection may have committed.
 * On a new connection, the receipt of one row the transaction inserted
 * (receipts are unique) tells: present, the transaction committed
 * (STRATA_OK); absent, it did not (failed, the commit's error). When the
 * database cannot be reached yet, the outcome stays unknown and the commit
 * fails: a client then sends its update again and gets it back as a
 * duplicate. */
static int commit_outcome(pg_store *s, const char *receipt, int failed, strata_diag *diag)
{
    strata__pg_tx_rollback(s); /* forgets the lost transaction */
    pg_params p = {.n = 0};
    strata__pg_text(&p, receipt);
    strata_diag d = {{0}};
    PGresult *r = strata__pg_run(s, P_RECEIPT_FIND, &p, 0, 1, "look up a receipt", &d);
    if (r == NULL)
        return failed;
    int committed = PQntuples(r) > 0;
    PQclear(r);
    if (committed)
        strata__store_diag_clear(diag);
    return committed ? STRATA_OK : failed;
}

int strata__pg_update_find(strata_store *base, uint32_t round, uint64_t client_id,
                           strata_store_receipt *receipt, int *found, strata_diag *diag)
{
    pg_params p = {.n = 0};
    strata__pg_int(&p, round);
    strata__pg_int(&p, (int64_t)client_id);
    PGresult *r =
        strata__pg_run((pg_store *)base, P_UPDATE_CHECK, &p, 0, 1, "look up update", diag);
    if (r == NULL)
        return STRATA_EIO;
    *found = !PQgetisnull(r, 0, 2);
    if (*found && receipt != NULL)
        read_receipt(r, 0, 2, receipt);
    PQclear(r);
    return STRATA_OK;
}

int strata__pg_update_commit(strata_store *base, strata_store_pending *const *p, size_t n,
                             strata_store_receipt *receipts, strata_store_verdict *verdicts,
                             int *results, strata_diag *item_diag, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    /* Under the write lock: decide (another connection may have stored an
     * update or closed the round since the caller looked) and insert each
     * accepted row with its payload; then one commit for the lot. */
    int rc = strata__pg_tx_begin(s, diag);
    if (rc < 0)
        goto out;
    int64_t received = strata__store_now_ms();
    const char *stored_one = NULL; /* the receipt of a row this transaction inserts */
    for (size_t i = 0; i < n; i++) {
        strata_store_pending *q = p[i];
        if (q->r.bytes > (uint64_t)INT32_MAX) {
            rc = strata_diag_set(diag, STRATA_ETOOBIG,
                                 "an update of %" PRIu64 " bytes is larger than a PostgreSQL "
                                 "parameter may be",
                                 q->r.bytes);
            goto out;
        }
        strata_diag d;
        d.msg[0] = '\0';
        int c = check_put(s, q, &receipts[i], &verdicts[i], &d);
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
        if ((rc = insert_update(s, q, received, diag)) < 0)
            goto out;
        receipts[i] = q->r;
        receipts[i].received_unix_ms = received;
        if (stored_one == NULL)
            stored_one = q->r.id;
        s->notify |= PG_NOTE_UPDATES;
    }
    rc = strata__pg_tx_commit(s, diag);
    if (rc < 0 && stored_one != NULL && PQstatus(s->conn) == CONNECTION_BAD)
        rc = commit_outcome(s, stored_one, rc, diag);
out:
    if (rc < 0) {
        strata__pg_tx_rollback(s);
        for (size_t i = 0; i < n; i++) {
            memset(&receipts[i], 0, sizeof(receipts[i]));
            verdicts[i] = STRATA_STORE_ACCEPTED;
            results[i] = rc;
        }
    }
    return rc;
}

int strata__pg_update_list(strata_store *base, uint32_t round, size_t from,
                           strata_store_update **out, size_t *n, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    pg_params p = {.n = 0};
    strata__pg_int(&p, round);
    strata__pg_int(&p, (int64_t)from);
    PGresult *r = strata__pg_run(s, P_UPDATE_LIST, &p, 0, 1, "list updates", diag);
    if (r == NULL)
        return STRATA_EIO;
    size_t k = (size_t)PQntuples(r);
    if (k == 0) {
        PQclear(r);
        return STRATA_OK;
    }
    strata_store_update *arr = calloc(k, sizeof(*arr));
    if (arr == NULL) {
        PQclear(r);
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < k; i++) {
        arr[i].round = round;
        arr[i].client_id = (uint64_t)strata__pg_col_int(r, (int)i, 0);
        read_receipt(r, (int)i, 1, &arr[i].receipt);
    }
    PQclear(r);
    *out = arr;
    *n = k;
    return STRATA_OK;
}

/* A big-endian 8-byte integer of a binary result. */
static int64_t be64(const char *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | (uint8_t)b[i];
    return (int64_t)v;
}

int strata__pg_update_read(strata_store *base, uint32_t round, uint64_t client_id, uint8_t **buf,
                           size_t *len, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    if (!FITS_I64(client_id))
        return strata_diag_set(diag, STRATA_ESTATE,
                               "no update of client %" PRIu64 " for round %" PRIu32, client_id,
                               round);
    pg_params p = {.n = 0};
    strata__pg_int(&p, round);
    strata__pg_int(&p, (int64_t)client_id);
    PGresult *r = strata__pg_run(s, P_PAYLOAD_GET, &p, 1, 1, "read update", diag);
    if (r == NULL)
        return STRATA_EIO;
    int rc = STRATA_OK;
    if (PQntuples(r) == 0) {
        rc =
            strata_diag_set(diag, STRATA_ESTATE,
                            "no update of client %" PRIu64 " for round %" PRIu32, client_id, round);
    } else {
        int64_t bytes = PQgetlength(r, 0, 0) == 8 ? be64(PQgetvalue(r, 0, 0)) : -1;
        int has_body = !PQgetisnull(r, 0, 2);
        size_t got = has_body ? (size_t)PQgetlength(r, 0, 2) : 0;
        const char *body = PQgetvalue(r, 0, 2);
        uint8_t h[STRATA_STORE_HASH_LEN];
        if (has_body)
            strata_sha256(body, got, h);
        uint8_t *data = NULL;
        if (!has_body || bytes < 0 || (uint64_t)bytes != got ||
            PQgetlength(r, 0, 1) != STRATA_STORE_HASH_LEN ||
            memcmp(h, PQgetvalue(r, 0, 1), sizeof(h)) != 0)
            rc = strata_diag_set(diag, STRATA_EIO,
                                 "update of client %" PRIu64 " for round %" PRIu32
                                 ": the stored payload differs from the acknowledged one",
                                 client_id, round);
        else if ((data = malloc(got > 0 ? got : 1)) == NULL)
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        else
            memcpy(data, body, got);
        if (rc == STRATA_OK) {
            *buf = data;
            *len = got;
        }
    }
    PQclear(r);
    return rc;
}
