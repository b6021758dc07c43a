/* The store's updates: durable put, prepare and (group) commit, list,
 * count and verified read of payload files, and the open-time recovery of
 * payload files that no committed row describes. */
#include "store_internal.h"

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

/* Parses a non-empty string of decimal digits without leading zeros (except
 * "0") that fits in max; the rest of the name must equal suffix. */
static int parse_number(const char *name, const char *suffix, uint64_t max, uint64_t *out)
{
    const char *p = name;
    uint64_t v = 0;
    if (!isdigit((unsigned char)*p) || (p[0] == '0' && isdigit((unsigned char)p[1])))
        return 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (max - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    if (strcmp(p, suffix) != 0)
        return 0;
    *out = v;
    return 1;
}

/* Removes the update files that have no committed row and leftover
 * temporary files in one round directory. */
static int recover_round_dir(strata_store *s, int rfd, const char *path, uint32_t round,
                             strata_diag *diag)
{
    DIR *d = fdopendir(rfd);
    if (d == NULL) {
        close(rfd);
        return strata_diag_set(diag, STRATA_EIO, "opendir %s: %s", path, strerror(errno));
    }
    int rc = STRATA_OK;
    size_t removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint64_t client;
        int orphan = 0;
        if (strstr(e->d_name, ".tmp.") != NULL) {
            orphan = 1;
        } else if (parse_number(e->d_name, ".bin", INT64_MAX, &client)) {
            sqlite3_stmt *st = strata__store_stmt(s, S_UPDATE_GET);
            sqlite3_bind_int64(st, 1, round);
            sqlite3_bind_int64(st, 2, (int64_t)client);
            int step = sqlite3_step(st);
            if (step != SQLITE_ROW && step != SQLITE_DONE)
                rc = strata__store_db_error(s, diag, "recovery: look up update");
            strata__store_stmt_done(st);
            if (rc < 0)
                break;
            orphan = step == SQLITE_DONE;
        }
        if (orphan) {
            if (unlinkat(dirfd(d), e->d_name, 0) < 0) {
                rc = strata_diag_set(diag, STRATA_EIO, "remove %s/%s: %s", path, e->d_name,
                                     strerror(errno));
                break;
            }
            removed++;
        }
    }
    if (rc == STRATA_OK && removed > 0 && fsync(dirfd(d)) < 0 && errno != EINVAL)
        rc = strata_diag_set(diag, STRATA_EIO, "fsync directory %s: %s", path, strerror(errno));
    closedir(d);
    s->recovered += removed;
    return rc;
}

int strata__store_recover(strata_store *s, strata_diag *diag)
{
    char path[4096], sub[4096];
    int rc = strata_store_path(s->dir, STRATA_STORE_FILE_UPDATES, 0, 0, path, sizeof(path), diag);
    if (rc < 0)
        return rc;
    DIR *d = opendir(path);
    if (d == NULL)
        return strata_diag_set(diag, STRATA_EIO, "opendir %s: %s", path, strerror(errno));
    struct dirent *e;
    while (rc == STRATA_OK && (e = readdir(d)) != NULL) {
        uint64_t round;
        if (!parse_number(e->d_name, "", UINT32_MAX, &round))
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            continue; /* not a directory: not ours */
        rc = strata__store_join(sub, sizeof(sub), diag, "%s/%s", path, e->d_name);
        if (rc == STRATA_OK)
            rc = recover_round_dir(s, fd, sub, (uint32_t)round, diag);
        else
            close(fd);
    }
    closedir(d);
    if (rc < 0)
        return rc;

    /* Temporary files of an interrupted checkpoint write. */
    rc = strata_store_path(s->dir, STRATA_STORE_FILE_CHECKPOINTS, 0, 0, path, sizeof(path), diag);
    if (rc < 0)
        return rc;
    d = opendir(path);
    if (d == NULL)
        return strata_diag_set(diag, STRATA_EIO, "opendir %s: %s", path, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, ".tmp.") != NULL && unlinkat(dirfd(d), e->d_name, 0) == 0)
            s->recovered++;
    }
    closedir(d);
    return STRATA_OK;
}

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
static int find_update(strata_store *s, uint32_t round, uint64_t client,
                       strata_store_receipt *receipt, int *found, strata_diag *diag)
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
static int check_put(strata_store *s, uint32_t round, uint64_t client,
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
        return strata_diag_set(diag, STRATA_ESTATE, "round %" PRIu32 " is closed", round);
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

struct strata_store_pending {
    uint32_t round;
    uint64_t client_id;
    strata_store_receipt r; /* id, sha256, bytes, samples; received_unix_ms at commit */
    char *final;            /* updates/<round>/<client>.bin */
    char *tmp;              /* the temporary file; NULL once published */
    size_t dir_len;         /* final[0, dir_len) is the round directory */
    int published;          /* renamed to final, row not yet committed */
};

void strata_store_pending_free(strata_store_pending *p)
{
    if (p == NULL)
        return;
    if (p->tmp != NULL)
        unlink(p->tmp);
    free(p->tmp);
    free(p->final);
    free(p);
}

/* The argument checks shared by put and prepare (client ids are checked by
 * the callers, which answer differently). */
static int check_update_args(const void *s, const uint8_t *payload, size_t len, uint64_t samples,
                             const void *out, strata_diag *diag)
{
    if (s == NULL || payload == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update put: NULL argument");
    if (len == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "update put: empty payload");
    if (samples == 0 || !FITS_I64(samples) || !FITS_I64(len))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "update put: sample count %" PRIu64 " out of range", samples);
    return STRATA_OK;
}

/* The slow half of a put: directory, hash, receipt id, temporary file
 * (written and fsync'ed). Uses only s->dir. */
static int prepare_update(const strata_store *s, uint32_t round, uint64_t client_id,
                          const uint8_t *payload, size_t len, uint64_t samples,
                          strata_store_pending **out, strata_diag *diag)
{
    char final[4096], dir[4096], parent[4096];
    int created;
    *out = NULL;
    int rc = strata_store_path(s->dir, STRATA_STORE_FILE_UPDATE, round, client_id, final,
                               sizeof(final), diag);
    if (rc < 0)
        return rc;
    strata_store_pending *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    p->round = round;
    p->client_id = client_id;
    p->dir_len = (size_t)(strrchr(final, '/') - final);
    p->final = strdup(final);
    if (p->final == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        goto fail;
    }
    memcpy(dir, final, p->dir_len);
    dir[p->dir_len] = '\0';
    /* strata_store_round_open makes the directory; this covers a put for a
     * round whose directory was lost. */
    rc = strata__store_make_dir(dir, &created, diag);
    if (rc == STRATA_OK && created) {
        rc = strata_store_path(s->dir, STRATA_STORE_FILE_UPDATES, 0, 0, parent, sizeof(parent),
                               diag);
        if (rc == STRATA_OK)
            rc = strata_file_fsync_dir(parent, diag);
    }
    if (rc < 0)
        goto fail;
    strata_sha256(payload, len, p->r.sha256);
    p->r.bytes = len;
    p->r.samples = samples;
    rc = random_receipt(p->r.id, diag);
    if (rc < 0)
        goto fail;
    rc = strata_file_write_temp(final, payload, len, 0600, &p->tmp, diag);
    if (rc < 0)
        goto fail;
    *out = p;
    return STRATA_OK;
fail:
    strata_store_pending_free(p);
    return rc;
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
    return prepare_update(s, round, client_id, payload, len, samples, out, diag);
}

/* Removes the published files of a failed batch that no committed row
 * describes. Runs under the write lock (taken again after the rollback), so
 * that no other connection can be between publishing the same path and
 * committing its row; when the lock cannot be had, recovery removes the
 * files at the next open. */
static void unpublish(strata_store *s, strata_store_pending *const *p, size_t n)
{
    size_t any = 0;
    for (size_t i = 0; i < n; i++)
        any += p[i]->published;
    if (any == 0 || strata__store_tx_begin(s, NULL) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        int found = 1;
        if (p[i]->published &&
            find_update(s, p[i]->round, p[i]->client_id, NULL, &found, NULL) == STRATA_OK && !found)
            unlink(p[i]->final);
        p[i]->published = 0;
    }
    strata__store_tx_rollback(s);
}

/* Commits n prepared updates in one transaction (see
 * strata_store_update_commit_many). item_diag, when not NULL, receives the
 * reason of a refusal (used for a single update); diag the reason of a
 * failure of the whole batch. Frees every p[i]. */
static int commit_batch(strata_store *s, strata_store_pending *const *p, size_t n,
                        strata_store_receipt *receipts, strata_store_verdict *verdicts,
                        int *results, strata_diag *item_diag, strata_diag *diag)
{
    char path[4096];
    int rc = STRATA_OK;
    for (size_t i = 0; i < n; i++) {
        memset(&receipts[i], 0, sizeof(receipts[i]));
        verdicts[i] = STRATA_STORE_ACCEPTED;
        results[i] = STRATA_OK;
        if (p[i] == NULL) {
            rc = strata_diag_set(diag, STRATA_EINVAL, "update commit: NULL item %zu", i);
        } else if (strata_store_path(s->dir, STRATA_STORE_FILE_UPDATE, p[i]->round, p[i]->client_id,
                                     path, sizeof(path), NULL) < 0 ||
                   strcmp(path, p[i]->final) != 0) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "update commit: item %zu was prepared for another state "
                                 "directory",
                                 i);
        }
    }
    if (rc < 0)
        goto out;
    /* Under the write lock: decide (another connection may have stored an
     * update or closed the round since the caller looked), publish each
     * accepted file and insert its row; make the directories durable; then
     * one synchronous commit for the lot. */
    rc = strata__store_tx_begin(s, diag);
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
        if (rename(q->tmp, q->final) < 0) {
            rc = strata_diag_set(diag, STRATA_EIO, "rename %s to %s: %s", q->tmp, q->final,
                                 strerror(errno));
            goto out;
        }
        free(q->tmp);
        q->tmp = NULL;
        q->published = 1;
        sqlite3_stmt *st = strata__store_stmt(s, S_UPDATE_INSERT);
        sqlite3_bind_int64(st, 1, q->round);
        sqlite3_bind_int64(st, 2, (int64_t)q->client_id);
        sqlite3_bind_text(st, 3, q->r.id, -1, SQLITE_STATIC);
        sqlite3_bind_blob(st, 4, q->r.sha256, STRATA_STORE_HASH_LEN, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, (int64_t)q->r.bytes);
        sqlite3_bind_int64(st, 6, (int64_t)q->r.samples);
        sqlite3_bind_int64(st, 7, received);
        rc = strata__store_exec_stmt(s, S_UPDATE_INSERT, diag, "insert update");
        if (rc < 0)
            goto out;
        receipts[i] = q->r;
        receipts[i].received_unix_ms = received;
    }
    /* One fsync per directory that received a file (one per round). */
    for (size_t i = 0; i < n; i++) {
        if (!p[i]->published)
            continue;
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = p[j]->published && p[j]->dir_len == p[i]->dir_len &&
                   memcmp(p[j]->final, p[i]->final, p[i]->dir_len) == 0;
        if (seen)
            continue;
        memcpy(path, p[i]->final, p[i]->dir_len);
        path[p[i]->dir_len] = '\0';
        rc = strata_file_fsync_dir(path, diag);
        if (rc < 0)
            goto out;
    }
    rc = strata__store_tx_commit(s, diag);
    if (rc == STRATA_OK)
        for (size_t i = 0; i < n; i++)
            p[i]->published = 0; /* the files belong to their committed rows */
out:
    if (rc < 0) {
        strata__store_tx_rollback(s);
        int have_all = 1;
        for (size_t i = 0; i < n; i++)
            have_all &= p[i] != NULL;
        if (have_all)
            unpublish(s, p, n);
        for (size_t i = 0; i < n; i++) {
            memset(&receipts[i], 0, sizeof(receipts[i]));
            verdicts[i] = STRATA_STORE_ACCEPTED;
            results[i] = rc;
        }
    }
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
    int rc = commit_batch(s, &p, 1, receipt, verdict, &result, diag, diag);
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
    return commit_batch(s, p, n, receipts, verdicts, results, NULL, diag);
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
    /* Cheap refusals and duplicates before any file is written. */
    uint8_t sha[STRATA_STORE_HASH_LEN];
    strata_sha256(payload, len, sha);
    rc = check_put(s, round, client_id, sha, receipt, verdict, diag);
    if (rc != 0)
        return rc < 0 ? rc : STRATA_OK;
    strata_store_pending *p = NULL;
    rc = prepare_update(s, round, client_id, payload, len, samples, &p, diag);
    if (rc < 0)
        return rc;
    int result;
    rc = commit_batch(s, &p, 1, receipt, verdict, &result, diag, diag);
    return rc < 0 ? rc : result;
}

void strata_store_update_list_free(strata_store_update *updates, size_t n)
{
    if (updates == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free(updates[i].path);
    free(updates);
}

int strata_store_update_list(strata_store *s, uint32_t round, strata_store_update **out, size_t *n,
                             strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (out != NULL)
        *out = NULL;
    if (n != NULL)
        *n = 0;
    if (s == NULL || out == NULL || n == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update list: NULL argument");
    strata_store_update *arr = NULL;
    size_t k = 0, cap = 0;
    char path[4096];
    sqlite3_stmt *st = strata__store_stmt(s, S_UPDATE_LIST);
    sqlite3_bind_int64(st, 1, round);
    int step, rc = STRATA_OK;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        strata_store_update *grown = strata_array_grow(arr, &cap, k + 1, sizeof(*arr));
        if (grown == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
            break;
        }
        arr = grown;
        strata_store_update *u = &arr[k];
        memset(u, 0, sizeof(*u));
        u->round = round;
        u->client_id = (uint64_t)sqlite3_column_int64(st, 0);
        read_receipt(st, 1, &u->receipt);
        rc = strata_store_path(s->dir, STRATA_STORE_FILE_UPDATE, round, u->client_id, path,
                               sizeof(path), diag);
        if (rc < 0)
            break;
        u->path = strdup(path);
        if (u->path == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
            break;
        }
        k++;
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

int strata_store_update_read(strata_store *s, uint32_t round, uint64_t client_id, uint8_t **buf,
                             size_t *len, strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (buf != NULL)
        *buf = NULL;
    if (len != NULL)
        *len = 0;
    if (s == NULL || buf == NULL || len == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "update read: NULL argument");
    strata_store_receipt r;
    int found = 0, rc = STRATA_OK;
    if (FITS_I64(client_id))
        rc = find_update(s, round, client_id, &r, &found, diag);
    if (rc < 0)
        return rc;
    if (!found)
        return strata_diag_set(diag, STRATA_ESTATE,
                               "no update of client %" PRIu64 " for round %" PRIu32, client_id,
                               round);
    char path[4096];
    rc = strata_store_path(s->dir, STRATA_STORE_FILE_UPDATE, round, client_id, path, sizeof(path),
                           diag);
    if (rc < 0)
        return rc;
    if (r.bytes > SIZE_MAX)
        return strata_diag_set(diag, STRATA_ETOOBIG, "%s: too large", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "open %s: %s", path, strerror(errno));
    struct stat st;
    uint8_t *data = NULL;
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != r.bytes) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s: size differs from the acknowledged %" PRIu64,
                             path, r.bytes);
        goto out;
    }
    data = malloc((size_t)r.bytes);
    if (data == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        goto out;
    }
    size_t got = 0;
    while (got < r.bytes) {
        ssize_t k = read(fd, data + got, (size_t)r.bytes - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            rc = strata_diag_set(diag, STRATA_EIO, "read %s: %s", path,
                                 k < 0 ? strerror(errno) : "short file");
            goto out;
        }
        got += (size_t)k;
    }
    uint8_t h[STRATA_STORE_HASH_LEN];
    strata_sha256(data, got, h);
    if (memcmp(h, r.sha256, sizeof(h)) != 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s: SHA-256 differs from the acknowledged one",
                             path);
        goto out;
    }
    *buf = data;
    *len = got;
    data = NULL;
out:
    free(data);
    close(fd);
    return rc;
}
