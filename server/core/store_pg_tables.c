/* The PostgreSQL backend's clients (registration by token hash, look-ups,
 * the count, last-seen times), rounds (open, read, close, list, with their
 * selected clients), checkpoint records and persistent counters. */
#include "store_pg.h"

#include "strata/buf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Clients ------------------------------------------------------------ */

/* Reads the client of row 0 (id, token_hash, name, created, last seen). */
static int read_client(const PGresult *r, strata_store_client *c, strata_diag *diag)
{
    c->id = (uint64_t)strata__pg_col_int(r, 0, 0);
    strata__pg_col_bytes(r, 0, 1, c->token_hash, STRATA_STORE_HASH_LEN);
    size_t len = 0;
    int oom = 0;
    char *name = strata__pg_col_bytes_dup(r, 0, 2, &len, &oom);
    if (oom)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    snprintf(c->name, sizeof(c->name), "%s", name != NULL ? name : "");
    free(name);
    c->created_unix_ms = strata__pg_col_int(r, 0, 3);
    c->last_seen_unix_ms = strata__pg_col_int(r, 0, 4);
    return STRATA_OK;
}

/* Runs P_CLIENT_BY_TOKEN or P_CLIENT_BY_ID with p: *found, and *out when
 * not NULL. */
static int fetch_client(pg_store *s, int id, const pg_params *p, strata_store_client *out,
                        int *found, strata_diag *diag)
{
    PGresult *r = strata__pg_run(s, id, p, 0, 1, "look up client", diag);
    if (r == NULL)
        return STRATA_EIO;
    int rc = STRATA_OK;
    *found = PQntuples(r) > 0;
    if (*found && out != NULL)
        rc = read_client(r, out, diag);
    PQclear(r);
    return rc;
}

static int registration_get(pg_store *s, const char *reg, uint64_t *id, int *found,
                            strata_diag *diag)
{
    pg_params p = {.n = 0};
    strata__pg_bytes(&p, reg, strlen(reg));
    int64_t v;
    int is_null;
    int rc =
        strata__pg_query_int(s, P_REGISTRATION_GET, &p, &v, &is_null, "look up registration", diag);
    *found = rc == STRATA_OK && !is_null;
    *id = *found ? (uint64_t)v : 0;
    return rc;
}

/* Stores a new client (and its registration id when reg is not NULL). */
static int insert_client(pg_store *s, const uint8_t *token_hash, const char *name, const char *reg,
                         uint64_t *id, strata_diag *diag)
{
    pg_params p = {.n = 0};
    strata__pg_bytes(&p, token_hash, STRATA_STORE_HASH_LEN);
    strata__pg_bytes(&p, name, strlen(name));
    strata__pg_int(&p, strata__store_now_ms());
    int64_t v;
    int is_null;
    int rc = strata__pg_query_int(s, P_CLIENT_INSERT, &p, &v, &is_null, "insert client", diag);
    if (rc < 0)
        return rc;
    *id = (uint64_t)v;
    if (reg == NULL)
        return STRATA_OK;
    pg_params q = {.n = 0};
    strata__pg_bytes(&q, reg, strlen(reg));
    strata__pg_int(&q, v);
    return strata__pg_exec(s, P_REGISTRATION_INSERT, &q, "insert registration", diag);
}

int strata__pg_client_add(strata_store *base, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                          const char *name, const char *registration_id, uint64_t *client_id,
                          int *existed, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    int rc = strata__pg_tx_begin(s, diag);
    if (rc < 0)
        return rc;
    pg_params p = {.n = 0};
    strata__pg_bytes(&p, token_hash, STRATA_STORE_HASH_LEN);
    int found = 0, known = 0;
    uint64_t id = 0;
    rc = fetch_client(s, P_CLIENT_BY_TOKEN, &p, NULL, &found, diag);
    if (rc == STRATA_OK && found)
        rc = strata_diag_set(diag, STRATA_ESTATE, "a client with this token hash is registered");
    if (rc == STRATA_OK && registration_id != NULL)
        rc = registration_get(s, registration_id, &id, &known, diag);
    if (rc == STRATA_OK && known) {
        pg_params q = {.n = 0};
        strata__pg_int(&q, (int64_t)id);
        strata__pg_bytes(&q, token_hash, STRATA_STORE_HASH_LEN);
        rc = strata__pg_exec(s, P_CLIENT_SET_TOKEN, &q, "replace token", diag);
    } else if (rc == STRATA_OK) {
        rc = insert_client(s, token_hash, name, registration_id, &id, diag);
    }
    s->notify |= PG_NOTE_CLIENTS;
    if (rc == STRATA_OK)
        rc = strata__pg_tx_commit(s, diag);
    if (rc < 0) {
        strata__pg_tx_rollback(s);
        return rc;
    }
    *client_id = id;
    if (existed != NULL)
        *existed = known;
    return STRATA_OK;
}

int strata__pg_registration_find(strata_store *base, const char *registration_id,
                                 uint64_t *client_id, int *found, strata_diag *diag)
{
    return registration_get((pg_store *)base, registration_id, client_id, found, diag);
}

int strata__pg_client_get(strata_store *base, uint64_t client_id, strata_store_client *out,
                          int *found, strata_diag *diag)
{
    if (!FITS_I64(client_id))
        return STRATA_OK;
    pg_params p = {.n = 0};
    strata__pg_int(&p, (int64_t)client_id);
    return fetch_client((pg_store *)base, P_CLIENT_BY_ID, &p, out, found, diag);
}

int strata__pg_client_find(strata_store *base, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                           strata_store_client *out, int *found, strata_diag *diag)
{
    pg_params p = {.n = 0};
    strata__pg_bytes(&p, token_hash, STRATA_STORE_HASH_LEN);
    return fetch_client((pg_store *)base, P_CLIENT_BY_TOKEN, &p, out, found, diag);
}

int strata__pg_client_count(strata_store *base, uint64_t *count, strata_diag *diag)
{
    int64_t v;
    int rc = strata__pg_query_int((pg_store *)base, P_CLIENT_COUNT, NULL, &v, NULL, "count clients",
                                  diag);
    if (rc == STRATA_OK)
        *count = (uint64_t)v;
    return rc;
}

int strata__pg_clients_seen(strata_store *base, const uint64_t *ids, const int64_t *seen_ms,
                            size_t n, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    int rc = strata__pg_tx_begin(s, diag);
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        if (!FITS_I64(ids[i]))
            continue;
        pg_params p = {.n = 0};
        strata__pg_int(&p, (int64_t)ids[i]);
        strata__pg_int(&p, seen_ms[i]);
        rc = strata__pg_exec(s, P_CLIENT_TOUCH, &p, "record last-seen time", diag);
    }
    return strata__pg_tx_end(s, rc, diag);
}

/* ---- Rounds ------------------------------------------------------------- */

/* The ids as a PostgreSQL array literal, "{1,2,3}" (malloc'ed). */
static char *id_array(const uint64_t *ids, size_t n)
{
    if (n > SIZE_MAX / 24 - 1)
        return NULL;
    char *a = malloc(n * 21 + 3);
    if (a == NULL)
        return NULL;
    size_t k = 0;
    a[k++] = '{';
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(a + k, 22, i > 0 ? ",%" PRIu64 : "%" PRIu64, ids[i]);
    a[k++] = '}';
    a[k] = '\0';
    return a;
}

int strata__pg_round_open(strata_store *base, uint32_t round, uint64_t model_version,
                          const uint64_t *selected, size_t n, int64_t deadline_unix_ms,
                          const char *task_json, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    for (size_t i = 0; i < n; i++) {
        if (!FITS_I64(selected[i]))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "round %" PRIu32 ": selected client %" PRIu64
                                   " is not registered",
                                   round, selected[i]);
    }
    char *ids = id_array(selected, n);
    if (ids == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = strata__pg_tx_begin(s, diag);
    int64_t v;
    int is_null;
    if (rc == STRATA_OK)
        rc = strata__pg_query_int(s, P_ROUND_MAX, NULL, &v, &is_null, "last round", diag);
    if (rc == STRATA_OK && !is_null && v >= (int64_t)round)
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "cannot open round %" PRIu32 ": round %" PRId64 " exists", round, v);
    if (rc == STRATA_OK)
        rc = strata__pg_query_int(s, P_ROUND_OPEN_ANY, NULL, &v, &is_null, "open round", diag);
    if (rc == STRATA_OK && !is_null)
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "cannot open round %" PRIu32 ": round %" PRId64 " is still open",
                             round, v);
    pg_params a = {.n = 0};
    strata__pg_text(&a, ids);
    if (rc == STRATA_OK)
        rc = strata__pg_query_int(s, P_CLIENTS_MISSING, &a, &v, &is_null, "selected clients", diag);
    if (rc == STRATA_OK && !is_null)
        rc = strata_diag_set(diag, STRATA_EINVAL,
                             "round %" PRIu32 ": selected client %" PRId64 " is not registered",
                             round, v);
    if (rc == STRATA_OK) {
        pg_params p = {.n = 0};
        strata__pg_int(&p, round);
        strata__pg_int(&p, (int64_t)model_version);
        strata__pg_int(&p, strata__store_now_ms());
        strata__pg_int(&p, deadline_unix_ms);
        strata__pg_text(&p, task_json);
        rc = strata__pg_exec(s, P_ROUND_INSERT, &p, "insert round", diag);
    }
    if (rc == STRATA_OK) {
        pg_params p = {.n = 0};
        strata__pg_int(&p, round);
        strata__pg_text(&p, ids);
        rc = strata__pg_exec(s, P_ROUND_SEL_INSERT, &p, "insert selected clients", diag);
    }
    s->notify |= PG_NOTE_ROUNDS;
    if (rc == STRATA_OK)
        rc = strata__pg_tx_commit(s, diag);
    if (rc < 0)
        strata__pg_tx_rollback(s);
    free(ids);
    return rc;
}

/* Reads the ROUND_COLUMNS of row `row`. */
static int read_round(const PGresult *r, int row, strata_store_round *out, strata_diag *diag)
{
    int oom = 0;
    memset(out, 0, sizeof(*out));
    out->round = (uint32_t)strata__pg_col_int(r, row, 0);
    out->model_version = (uint64_t)strata__pg_col_int(r, row, 1);
    out->state =
        strata__pg_col_int(r, row, 2) ? STRATA_STORE_ROUND_CLOSED : STRATA_STORE_ROUND_OPEN;
    out->opened_unix_ms = strata__pg_col_int(r, row, 3);
    out->deadline_unix_ms = strata__pg_col_int(r, row, 4);
    out->closed_unix_ms = strata__pg_col_int(r, row, 5);
    out->sealed = out->state == STRATA_STORE_ROUND_OPEN && out->closed_unix_ms != 0;
    if (out->sealed)
        out->closed_unix_ms = 0;
    out->task_json = strata__pg_col_dup(r, row, 6, &oom);
    out->summary_json = strata__pg_col_dup(r, row, 7, &oom);
    out->n_selected = (size_t)strata__pg_col_int(r, row, 8);
    out->n_updates = (uint64_t)strata__pg_col_int(r, row, 9);
    if (oom) {
        strata_store_round_cleanup(out);
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    return STRATA_OK;
}

static int read_selected(pg_store *s, strata_store_round *out, strata_diag *diag)
{
    pg_params p = {.n = 0};
    strata__pg_int(&p, out->round);
    PGresult *r = strata__pg_run(s, P_ROUND_SELECTED, &p, 0, 1, "read selected clients", diag);
    if (r == NULL)
        return STRATA_EIO;
    size_t n = (size_t)PQntuples(r);
    out->selected = malloc((n > 0 ? n : 1) * sizeof(uint64_t));
    if (out->selected == NULL) {
        PQclear(r);
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        out->selected[i] = (uint64_t)strata__pg_col_int(r, (int)i, 0);
    out->n_selected = n;
    PQclear(r);
    return STRATA_OK;
}

int strata__pg_round_get(strata_store *base, uint32_t round, strata_store_round *out, int *found,
                         strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    pg_params p = {.n = 0};
    strata__pg_int(&p, round);
    PGresult *r = strata__pg_run(s, P_ROUND_GET, &p, 0, 1, "read round", diag);
    if (r == NULL)
        return STRATA_EIO;
    int rc = STRATA_OK, have = PQntuples(r) > 0;
    if (have)
        rc = read_round(r, 0, out, diag);
    PQclear(r);
    if (rc == STRATA_OK && have) {
        rc = read_selected(s, out, diag);
        if (rc < 0)
            strata_store_round_cleanup(out);
        else
            *found = 1;
    }
    return rc;
}

/* Closes (P_ROUND_CLOSE, with the summary) or seals (P_ROUND_SEAL) open
 * round `round` in one transaction. An UPDATE that changed no row says why
 * from the round's state: no such round, or closed already; a sealed round
 * sealed again is no change (STRATA_OK). */
static int round_update(pg_store *s, int id, uint32_t round, const char *summary_json,
                        strata_diag *diag)
{
    int closing = id == P_ROUND_CLOSE;
    int rc = strata__pg_tx_begin(s, diag);
    if (rc < 0)
        return rc;
    pg_params p = {.n = 0};
    strata__pg_int(&p, round);
    strata__pg_int(&p, strata__store_now_ms());
    if (closing)
        strata__pg_text(&p, summary_json);
    s->notify |= PG_NOTE_ROUNDS;
    PGresult *r = strata__pg_run(s, id, &p, 0, 0, closing ? "close round" : "seal round", diag);
    if (r == NULL)
        rc = STRATA_EIO;
    if (r != NULL && strcmp(PQcmdTuples(r), "0") == 0) {
        pg_params q = {.n = 0};
        strata__pg_int(&q, round);
        int64_t state;
        int is_null;
        rc = strata__pg_query_int(s, P_ROUND_STATE, &q, &state, &is_null, "round state", diag);
        if (rc == STRATA_OK && (is_null || state == 1 || closing))
            rc = strata_diag_set(diag, STRATA_ESTATE, "cannot %s round %" PRIu32 ": %s",
                                 closing ? "close" : "seal", round,
                                 is_null ? "no such round" : "already closed");
    }
    PQclear(r);
    return strata__pg_tx_end(s, rc, diag);
}

int strata__pg_round_close(strata_store *base, uint32_t round, const char *summary_json,
                           strata_diag *diag)
{
    return round_update((pg_store *)base, P_ROUND_CLOSE, round, summary_json, diag);
}

int strata__pg_round_seal(strata_store *base, uint32_t round, strata_diag *diag)
{
    return round_update((pg_store *)base, P_ROUND_SEAL, round, NULL, diag);
}

int strata__pg_last_round(strata_store *base, uint32_t *round, int *found, strata_diag *diag)
{
    int64_t v;
    int is_null;
    int rc =
        strata__pg_query_int((pg_store *)base, P_ROUND_MAX, NULL, &v, &is_null, "last round", diag);
    if (rc == STRATA_OK && !is_null) {
        *round = (uint32_t)v;
        *found = 1;
    }
    return rc;
}

int strata__pg_round_list(strata_store *base, uint32_t from, size_t limit, strata_store_round **out,
                          size_t *n, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    if (limit > 100000)
        limit = 100000;
    pg_params p = {.n = 0};
    strata__pg_int(&p, from);
    strata__pg_int(&p, (int64_t)limit);
    PGresult *r = strata__pg_run(s, P_ROUND_LIST, &p, 0, 1, "list rounds", diag);
    if (r == NULL)
        return STRATA_EIO;
    size_t k = (size_t)PQntuples(r);
    if (k == 0) {
        PQclear(r);
        return STRATA_OK;
    }
    strata_store_round *arr = calloc(k, sizeof(*arr));
    int rc = arr != NULL ? STRATA_OK : strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    size_t done = 0;
    for (; rc == STRATA_OK && done < k; done++)
        rc = read_round(r, (int)done, &arr[done], diag);
    PQclear(r);
    if (rc < 0) {
        strata_store_round_list_free(arr, done);
        return rc;
    }
    *out = arr;
    *n = k;
    return STRATA_OK;
}

/* ---- Checkpoints -------------------------------------------------------- */

int strata__pg_checkpoint_record(strata_store *base, uint64_t model_version, uint64_t bytes,
                                 strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    int rc = strata__pg_tx_begin(s, diag);
    if (rc < 0)
        return rc;
    pg_params p = {.n = 0};
    strata__pg_int(&p, (int64_t)model_version);
    strata__pg_int(&p, (int64_t)bytes);
    strata__pg_int(&p, strata__store_now_ms());
    rc = strata__pg_exec(s, P_CKPT_RECORD, &p, "record checkpoint", diag);
    if (rc == STRATA_OK)
        rc = strata__pg_files_put(s, model_version, diag);
    s->notify |= PG_NOTE_MODELS;
    return strata__pg_tx_end(s, rc, diag);
}

int strata__pg_latest_model_version(strata_store *base, uint64_t *model_version, int *found,
                                    strata_diag *diag)
{
    int64_t v;
    int is_null;
    int rc = strata__pg_query_int((pg_store *)base, P_CKPT_LATEST, NULL, &v, &is_null,
                                  "latest checkpoint", diag);
    if (rc == STRATA_OK && !is_null) {
        *model_version = (uint64_t)v;
        *found = 1;
    }
    return rc;
}

/* ---- Counters ----------------------------------------------------------- */

int strata__pg_counter_add_many(strata_store *base, const strata_store_counter *deltas, size_t n,
                                strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    int rc = strata__pg_tx_begin(s, diag);
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        pg_params p = {.n = 0};
        strata__pg_text(&p, deltas[i].name);
        strata__pg_int(&p, deltas[i].value);
        int64_t v;
        int is_null;
        rc = strata__pg_query_int(s, P_COUNTER_ADD, &p, &v, &is_null, "write counter", diag);
        if (rc == STRATA_OK && is_null)
            rc = strata_diag_set(diag, STRATA_ETOOBIG, "counter %s would overflow", deltas[i].name);
    }
    return strata__pg_tx_end(s, rc, diag);
}

int strata__pg_counter_get(strata_store *base, const char *name, int64_t *value, strata_diag *diag)
{
    pg_params p = {.n = 0};
    strata__pg_text(&p, name);
    return strata__pg_query_int((pg_store *)base, P_COUNTER_GET, &p, value, NULL, "read counter",
                                diag);
}
