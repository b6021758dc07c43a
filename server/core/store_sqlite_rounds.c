/* The store's rounds (open, read, close, list, with their selected
 * clients), checkpoint records, and persistent counters. */
#include "store_sqlite.h"

#include "strata/buf.h"

#include "strata/fileio.h"

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

/* ---- Rounds ------------------------------------------------------------- */

int strata__sqlite_round_open(strata_store *base, uint32_t round, uint64_t model_version,
                              const uint64_t *selected, size_t n, int64_t deadline_unix_ms,
                              const char *task_json, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    const uint64_t *sorted = selected;
    int rc = strata__store_tx_begin(s, diag);
    if (rc < 0)
        return rc;
    int64_t v;
    int is_null;
    rc = strata__store_query_int(s, S_ROUND_MAX, 0, 0, 0, &v, &is_null, "last round", diag);
    if (rc < 0)
        goto out;
    if (!is_null && v >= (int64_t)round) {
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "cannot open round %" PRIu32 ": round %" PRId64 " exists", round, v);
        goto out;
    }
    rc = strata__store_query_int(s, S_ROUND_OPEN_ANY, 0, 0, 0, &v, &is_null, "open round", diag);
    if (rc < 0)
        goto out;
    if (!is_null) {
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "cannot open round %" PRIu32 ": round %" PRId64 " is still open",
                             round, v);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        int found = 0;
        if (FITS_I64(sorted[i])) {
            sqlite3_stmt *st = strata__store_stmt(s, S_CLIENT_BY_ID);
            sqlite3_bind_int64(st, 1, (int64_t)sorted[i]);
            rc = strata__store_fetch_client(s, st, NULL, &found, diag);
            if (rc < 0)
                goto out;
        }
        if (!found) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "round %" PRIu32 ": selected client %" PRIu64 " is not registered",
                                 round, sorted[i]);
            goto out;
        }
    }
    sqlite3_stmt *st = strata__store_stmt(s, S_ROUND_INSERT);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, (int64_t)model_version);
    sqlite3_bind_int64(st, 3, strata__store_now_ms());
    sqlite3_bind_int64(st, 4, deadline_unix_ms);
    if (task_json != NULL)
        sqlite3_bind_text(st, 5, task_json, -1, SQLITE_STATIC);
    rc = strata__store_exec_stmt(s, S_ROUND_INSERT, diag, "insert round");
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        st = strata__store_stmt(s, S_ROUND_SEL_INSERT);
        sqlite3_bind_int64(st, 1, round);
        sqlite3_bind_int64(st, 2, (int64_t)sorted[i]);
        rc = strata__store_exec_stmt(s, S_ROUND_SEL_INSERT, diag, "insert selected client");
    }
    if (rc < 0)
        goto out;
    if (rc == STRATA_OK)
        rc = strata__store_tx_commit(s, diag);
out:
    if (rc < 0)
        strata__store_tx_rollback(s);
    return rc;
}

/* Reads the ROUND_COLUMNS of the current row. */
static int read_round(sqlite3_stmt *st, strata_store_round *r, strata_diag *diag)
{
    int oom = 0;
    memset(r, 0, sizeof(*r));
    r->round = (uint32_t)sqlite3_column_int64(st, 0);
    r->model_version = (uint64_t)sqlite3_column_int64(st, 1);
    r->state = sqlite3_column_int(st, 2) ? STRATA_STORE_ROUND_CLOSED : STRATA_STORE_ROUND_OPEN;
    r->opened_unix_ms = sqlite3_column_int64(st, 3);
    r->deadline_unix_ms = sqlite3_column_int64(st, 4);
    r->closed_unix_ms = sqlite3_column_int64(st, 5);
    r->sealed = r->state == STRATA_STORE_ROUND_OPEN && r->closed_unix_ms != 0;
    if (r->sealed)
        r->closed_unix_ms = 0;
    r->task_json = strata__store_dup_column_text(st, 6, &oom);
    r->summary_json = strata__store_dup_column_text(st, 7, &oom);
    r->n_selected = (size_t)sqlite3_column_int64(st, 8);
    r->n_updates = (uint64_t)sqlite3_column_int64(st, 9);
    if (oom) {
        strata_store_round_cleanup(r);
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    return STRATA_OK;
}

static int read_selected(sq_store *s, strata_store_round *r, strata_diag *diag)
{
    size_t cap = r->n_selected > 0 ? r->n_selected : 1, n = 0;
    r->selected = malloc(cap * sizeof(uint64_t));
    if (r->selected == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    sqlite3_stmt *st = strata__store_stmt(s, S_ROUND_SELECTED);
    sqlite3_bind_int64(st, 1, r->round);
    int step, rc = STRATA_OK;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        uint64_t *grown = strata_array_grow(r->selected, &cap, n + 1, sizeof(uint64_t));
        if (grown == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
            break;
        }
        r->selected = grown;
        r->selected[n++] = (uint64_t)sqlite3_column_int64(st, 0);
    }
    if (rc == STRATA_OK && step != SQLITE_DONE)
        rc = strata__store_db_error(s, diag, "read selected clients");
    strata__store_stmt_done(st);
    r->n_selected = n;
    return rc;
}

int strata__sqlite_round_get(strata_store *base, uint32_t round, strata_store_round *out,
                             int *found, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = strata__store_stmt(s, S_ROUND_GET);
    sqlite3_bind_int64(st, 1, round);
    int step = sqlite3_step(st), rc = STRATA_OK;
    if (step == SQLITE_ROW)
        rc = read_round(st, out, diag);
    else if (step != SQLITE_DONE)
        rc = strata__store_db_error(s, diag, "read round");
    strata__store_stmt_done(st);
    if (rc == STRATA_OK && step == SQLITE_ROW) {
        rc = read_selected(s, out, diag);
        if (rc < 0)
            strata_store_round_cleanup(out);
        else
            *found = 1;
    }
    return rc;
}

/* Closes (S_ROUND_CLOSE, with the summary) or seals (S_ROUND_SEAL) open
 * round `round` in one transaction. An UPDATE that changed no row says why
 * from the round's state: no such round, or closed already; a sealed round
 * sealed again is no change (STRATA_OK). */
static int round_update(sq_store *s, int id, uint32_t round, const char *summary_json,
                        strata_diag *diag)
{
    int closing = id == S_ROUND_CLOSE;
    int rc = strata__store_tx_begin(s, diag);
    if (rc < 0)
        return rc;
    sqlite3_stmt *st = strata__store_stmt(s, id);
    sqlite3_bind_int64(st, 1, round);
    sqlite3_bind_int64(st, 2, strata__store_now_ms());
    if (closing && summary_json != NULL)
        sqlite3_bind_text(st, 3, summary_json, -1, SQLITE_STATIC);
    rc = strata__store_exec_stmt(s, id, diag, closing ? "close round" : "seal round");
    if (rc == STRATA_OK && sqlite3_changes(s->db) == 0) {
        int64_t state;
        int is_null;
        rc = strata__store_query_int(s, S_ROUND_STATE, 1, round, 0, &state, &is_null, "round state",
                                     diag);
        if (rc == STRATA_OK && (is_null || state == 1 || closing))
            rc = strata_diag_set(diag, STRATA_ESTATE, "cannot %s round %" PRIu32 ": %s",
                                 closing ? "close" : "seal", round,
                                 is_null ? "no such round" : "already closed");
    }
    if (rc == STRATA_OK)
        rc = strata__store_tx_commit(s, diag);
    if (rc < 0)
        strata__store_tx_rollback(s);
    return rc;
}

int strata__sqlite_round_close(strata_store *base, uint32_t round, const char *summary_json,
                               strata_diag *diag)
{
    return round_update((sq_store *)base, S_ROUND_CLOSE, round, summary_json, diag);
}

int strata__sqlite_round_seal(strata_store *base, uint32_t round, strata_diag *diag)
{
    return round_update((sq_store *)base, S_ROUND_SEAL, round, NULL, diag);
}

int strata__sqlite_last_round(strata_store *base, uint32_t *round, int *found, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    int64_t v;
    int is_null;
    int rc = strata__store_query_int(s, S_ROUND_MAX, 0, 0, 0, &v, &is_null, "last round", diag);
    if (rc == STRATA_OK && !is_null) {
        *round = (uint32_t)v;
        *found = 1;
    }
    return rc;
}

int strata__sqlite_round_list(strata_store *base, uint32_t from, size_t limit,
                              strata_store_round **out, size_t *n, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    if (limit > 100000)
        limit = 100000;
    strata_store_round *arr = calloc(limit, sizeof(*arr));
    if (arr == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    sqlite3_stmt *st = strata__store_stmt(s, S_ROUND_LIST);
    sqlite3_bind_int64(st, 1, from);
    sqlite3_bind_int64(st, 2, (int64_t)limit);
    size_t k = 0;
    int step, rc = STRATA_OK;
    while (k < limit && (step = sqlite3_step(st)) == SQLITE_ROW) {
        rc = read_round(st, &arr[k], diag);
        if (rc < 0)
            break;
        k++;
    }
    if (rc == STRATA_OK && k < limit && step != SQLITE_DONE)
        rc = strata__store_db_error(s, diag, "list rounds");
    strata__store_stmt_done(st);
    if (rc < 0 || k == 0) {
        strata_store_round_list_free(arr, k);
        return rc;
    }
    *out = arr;
    *n = k;
    return STRATA_OK;
}

/* ---- Checkpoints -------------------------------------------------------- */

int strata__sqlite_checkpoint_record(strata_store *base, uint64_t model_version, uint64_t bytes,
                                     strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    int rc = strata__store_tx_begin(s, diag);
    if (rc < 0)
        return rc;
    sqlite3_stmt *q = strata__store_stmt(s, S_CKPT_RECORD);
    sqlite3_bind_int64(q, 1, (int64_t)model_version);
    sqlite3_bind_int64(q, 2, (int64_t)bytes);
    sqlite3_bind_int64(q, 3, strata__store_now_ms());
    rc = strata__store_exec_stmt(s, S_CKPT_RECORD, diag, "record checkpoint");
    if (rc == STRATA_OK)
        rc = strata__store_tx_commit(s, diag);
    if (rc < 0)
        strata__store_tx_rollback(s);
    return rc;
}

int strata__sqlite_latest_model_version(strata_store *base, uint64_t *model_version, int *found,
                                        strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    int64_t v;
    int is_null;
    int rc =
        strata__store_query_int(s, S_CKPT_LATEST, 0, 0, 0, &v, &is_null, "latest checkpoint", diag);
    if (rc == STRATA_OK && !is_null) {
        *model_version = (uint64_t)v;
        *found = 1;
    }
    return rc;
}

/* ---- Counters ----------------------------------------------------------- */

int strata__sqlite_counter_add_many(strata_store *base, const strata_store_counter *deltas,
                                    size_t n, strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    int rc = strata__store_tx_begin_sync(s, 0, diag);
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        const char *name = deltas[i].name;
        int64_t d = deltas[i].value, cur;
        sqlite3_stmt *st = strata__store_stmt(s, S_COUNTER_GET);
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        rc = strata__store_query_int(s, S_COUNTER_GET, 0, 0, 0, &cur, NULL, "read counter", diag);
        if (rc < 0)
            break;
        if ((d > 0 && cur > INT64_MAX - d) || (d < 0 && cur < INT64_MIN - d)) {
            rc = strata_diag_set(diag, STRATA_ETOOBIG, "counter %s would overflow", name);
            break;
        }
        st = strata__store_stmt(s, S_COUNTER_SET);
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, cur + d);
        rc = strata__store_exec_stmt(s, S_COUNTER_SET, diag, "write counter");
    }
    if (rc == STRATA_OK)
        rc = strata__store_tx_commit(s, diag);
    if (rc < 0)
        strata__store_tx_rollback(s);
    return rc;
}

int strata__sqlite_counter_get(strata_store *base, const char *name, int64_t *value,
                               strata_diag *diag)
{
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = strata__store_stmt(s, S_COUNTER_GET);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    return strata__store_query_int(s, S_COUNTER_GET, 0, 0, 0, value, NULL, "read counter", diag);
}
