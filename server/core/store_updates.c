/* The store's interface for updates (store.h): argument checks, prepared
 * updates (hash, random receipt id and a copy of the payload, made without
 * a connection), put and single commit as group commits of one, and the
 * dispatch of lists and reads to the backend. */
#include "store_backend.h"

#include "strata/hash.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

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

void strata_store_pending_free(strata_store_pending *p)
{
    if (p == NULL)
        return;
    free(p->body);
    free(p);
}

/* The argument checks of put and prepare (client ids are checked by the
 * callers, which answer differently). */
static int check_update_args(const void *s, const uint8_t *payload, size_t len, uint64_t samples,
                             const void *out, strata_diag *diag)
{
    if (s == NULL || payload == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update put: NULL argument");
    if (len == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "update put: empty payload");
    if (len > STRATA_STORE_PAYLOAD_MAX)
        return strata_diag_set(diag, STRATA_EINVAL, "update put: %zu bytes, more than %zu", len,
                               STRATA_STORE_PAYLOAD_MAX);
    if (samples == 0 || !FITS_I64(samples))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "update put: sample count %" PRIu64 " out of range", samples);
    return STRATA_OK;
}

/* Hash, receipt id and a copy of the payload: no connection needed. */
static int prepare_update(uint32_t round, uint64_t client_id, const uint8_t *payload, size_t len,
                          uint64_t samples, strata_store_pending **out, strata_diag *diag)
{
    *out = NULL;
    strata_store_pending *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->body = malloc(len)) == NULL) {
        free(p);
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    p->round = round;
    p->client_id = client_id;
    memcpy(p->body, payload, len);
    strata_sha256(payload, len, p->r.sha256);
    p->r.bytes = len;
    p->r.samples = samples;
    int rc = random_receipt(p->r.id, diag);
    if (rc < 0) {
        strata_store_pending_free(p);
        return rc;
    }
    *out = p;
    return STRATA_OK;
}

int strata_store_update_prepare(const strata_store *s, uint32_t round, uint64_t client_id,
                                const uint8_t *payload, size_t len, uint64_t samples,
                                strata_store_pending **out, strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    int rc = check_update_args(s, payload, len, samples, out, diag);
    if (rc < 0)
        return rc;
    if (!FITS_I64(client_id))
        return strata_diag_set(diag, STRATA_EINVAL, "client id %" PRIu64 " is too large",
                               client_id);
    return prepare_update(round, client_id, payload, len, samples, out, diag);
}

/* Runs the backend's commit of n non-NULL items, then frees them. */
static int commit_items(strata_store *s, strata_store_pending *const *p, size_t n,
                        strata_store_receipt *receipts, strata_store_verdict *verdicts,
                        int *results, strata_diag *item_diag, strata_diag *diag)
{
    int rc = STRATA_OK;
    for (size_t i = 0; i < n; i++) {
        memset(&receipts[i], 0, sizeof(receipts[i]));
        verdicts[i] = STRATA_STORE_ACCEPTED;
        results[i] = STRATA_OK;
        if (p[i] == NULL && rc == STRATA_OK)
            rc = strata_diag_set(diag, STRATA_EINVAL, "update commit: NULL item %zu", i);
    }
    if (rc == STRATA_OK)
        rc = s->ops->update_commit(s, p, n, receipts, verdicts, results, item_diag, diag);
    else
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
    for (size_t i = 0; i < n; i++)
        strata_store_pending_free(p[i]);
    return rc;
}

/* Resets a single update's outputs (diag, *verdict ACCEPTED, *receipt
 * zeroed when given) and returns where the verdict goes: verdict, or local
 * when the caller passed none. */
static strata_store_verdict *single_outputs(strata_store_verdict *verdict,
                                            strata_store_verdict *local,
                                            strata_store_receipt *receipt, strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (verdict == NULL)
        verdict = local;
    *verdict = STRATA_STORE_ACCEPTED;
    if (receipt != NULL)
        memset(receipt, 0, sizeof(*receipt));
    return verdict;
}

int strata_store_update_commit(strata_store *s, strata_store_pending *p,
                               strata_store_receipt *receipt, strata_store_verdict *verdict,
                               strata_diag *diag)
{
    strata_store_verdict v_local;
    verdict = single_outputs(verdict, &v_local, receipt, diag);
    if (s == NULL || p == NULL || receipt == NULL) {
        strata_store_pending_free(p);
        return strata_diag_set(diag, STRATA_EINVAL, "update commit: NULL argument");
    }
    int result;
    int rc = commit_items(s, &p, 1, receipt, verdict, &result, diag, diag);
    return rc < 0 ? rc : result;
}

int strata_store_update_commit_many(strata_store *s, strata_store_pending *const *p, size_t n,
                                    strata_store_receipt *receipts, strata_store_verdict *verdicts,
                                    int *results, strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (n == 0)
        return STRATA_OK;
    if (s == NULL || p == NULL || receipts == NULL || verdicts == NULL || results == NULL) {
        for (size_t i = 0; p != NULL && i < n; i++)
            strata_store_pending_free(p[i]);
        for (size_t i = 0; results != NULL && i < n; i++)
            results[i] = STRATA_EINVAL;
        return strata_diag_set(diag, STRATA_EINVAL, "update commit: NULL argument");
    }
    return commit_items(s, p, n, receipts, verdicts, results, NULL, diag);
}

int strata_store_update_put(strata_store *s, uint32_t round, uint64_t client_id,
                            const uint8_t *payload, size_t len, uint64_t samples,
                            strata_store_receipt *receipt, strata_store_verdict *verdict,
                            strata_diag *diag)
{
    strata_store_verdict v_local;
    verdict = single_outputs(verdict, &v_local, receipt, diag);
    int rc = check_update_args(s, payload, len, samples, receipt, diag);
    if (rc < 0)
        return rc;
    if (!FITS_I64(client_id)) {
        *verdict = STRATA_STORE_REJECT_NOT_SELECTED;
        return strata_diag_set(diag, STRATA_ESTATE,
                               "client %" PRIu64 " is not selected for round %" PRIu32, client_id,
                               round);
    }
    strata_store_pending *p = NULL;
    rc = prepare_update(round, client_id, payload, len, samples, &p, diag);
    if (rc < 0)
        return rc;
    int result;
    rc = commit_items(s, &p, 1, receipt, verdict, &result, diag, diag);
    return rc < 0 ? rc : result;
}

int strata_store_update_list(strata_store *s, uint32_t round, strata_store_update **out, size_t *n,
                             strata_diag *diag)
{
    return strata_store_update_list_from(s, round, 0, out, n, diag);
}

int strata_store_update_list_from(strata_store *s, uint32_t round, size_t from,
                                  strata_store_update **out, size_t *n, strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (n != NULL)
        *n = 0;
    int rc = strata__store_enter(s, "update list", diag);
    if (rc < 0)
        return rc;
    if (out == NULL || n == NULL || !FITS_I64(from))
        return strata_diag_set(diag, STRATA_EINVAL, "update list: NULL argument or bad start");
    return s->ops->update_list(s, round, from, out, n, diag);
}

void strata_store_update_list_free(strata_store_update *updates, size_t n)
{
    (void)n; /* the entries own nothing */
    free(updates);
}

int strata_store_update_find(strata_store *s, uint32_t round, uint64_t client_id,
                             strata_store_receipt *receipt, int *found, strata_diag *diag)
{
    if (receipt != NULL)
        memset(receipt, 0, sizeof(*receipt));
    if (found != NULL)
        *found = 0;
    int rc = strata__store_enter(s, "update find", diag);
    if (rc < 0)
        return rc;
    if (found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update find: NULL argument");
    if (!FITS_I64(client_id))
        return STRATA_OK;
    return s->ops->update_find(s, round, client_id, receipt, found, diag);
}

int strata_store_update_read(strata_store *s, uint32_t round, uint64_t client_id, uint8_t **buf,
                             size_t *len, strata_diag *diag)
{
    if (buf != NULL)
        *buf = NULL;
    if (len != NULL)
        *len = 0;
    int rc = strata__store_enter(s, "update read", diag);
    if (rc < 0)
        return rc;
    if (buf == NULL || len == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update read: NULL argument");
    if (!FITS_I64(client_id))
        return strata_diag_set(diag, STRATA_ESTATE,
                               "no update of client %" PRIu64 " for round %" PRIu32, client_id,
                               round);
    return s->ops->update_read(s, round, client_id, buf, len, diag);
}
