/* The client registry: registration, the in-memory token index (clients by
 * token hash, so that authenticating a request needs no database lookup),
 * bearer-token parsing, the admin token, and the per-client upload-rate
 * buckets. Its part of struct srv_engine is marked in engine_internal.h.
 *
 * May call: the store (clients, SHA-256), request.h (the registration body),
 * libstrata (fileio: token files and random tokens; clock; log). */
#include "registry.h"

#include "engine_internal.h"

#include "strata/buf.h"
#include "strata/clock.h"
#include "strata/fileio.h"
#include "strata/hash.h"
#include "strata/log.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TOKEN_MAX 256

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

ptrdiff_t srv__id_find(const uint64_t *v, size_t n, uint64_t x)
{
    const uint64_t *p = n ? bsearch(&x, v, n, sizeof(*v), cmp_u64) : NULL;
    return p ? p - v : -1;
}

void srv__id_sort(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_u64);
}

static int cmp_tok(const void *a, const void *b)
{
    return memcmp(a, b, STRATA_STORE_HASH_LEN);
}

/* Inserts (hash, id) into the token index, which holds n entries and has
 * room for one more, keeping it ascending by hash. Lock held. */
static void tok_insert(srv_engine *e, size_t n, const uint8_t hash[STRATA_STORE_HASH_LEN],
                       uint64_t id)
{
    size_t at = 0, hi = n; /* insertion point by hash */
    while (at < hi) {
        size_t mid = at + (hi - at) / 2;
        if (memcmp(e->toks[mid].hash, hash, STRATA_STORE_HASH_LEN) < 0)
            at = mid + 1;
        else
            hi = mid;
    }
    memmove(&e->toks[at + 1], &e->toks[at], (n - at) * sizeof(*e->toks));
    memcpy(e->toks[at].hash, hash, STRATA_STORE_HASH_LEN);
    e->toks[at].id = id;
}

/* Gives registered client id the token hash hash (a repeated registration):
 * its old token stops working. Lock held. */
static void tok_replace(srv_engine *e, uint64_t id, const uint8_t hash[STRATA_STORE_HASH_LEN])
{
    size_t i = 0;
    while (i < e->nclients && e->toks[i].id != id)
        i++;
    if (i == e->nclients)
        return;
    memmove(&e->toks[i], &e->toks[i + 1], (e->nclients - i - 1) * sizeof(*e->toks));
    tok_insert(e, e->nclients - 1, hash, id);
}

/* Adds a registered client (ids arrive ascending), its token hash, and its
 * state: a full upload-rate bucket and the last time it was seen. Lock held
 * (or start-up). */
static int add_client(srv_engine *e, uint64_t id, const uint8_t hash[STRATA_STORE_HASH_LEN],
                      int64_t seen_ms)
{
    size_t need = e->nclients + 1, c1 = e->capclients, c2 = c1, c3 = c1;
    uint64_t *ids = strata_array_grow(e->clients, &c1, need, sizeof(*ids));
    if (ids != NULL)
        e->clients = ids;
    srv_client_state *st = strata_array_grow(e->cstate, &c2, need, sizeof(*st));
    if (st != NULL)
        e->cstate = st;
    srv_tok_entry *k = strata_array_grow(e->toks, &c3, need, sizeof(*k));
    if (k != NULL)
        e->toks = k;
    if (ids == NULL || st == NULL || k == NULL)
        return STRATA_ENOMEM;
    e->capclients = c1; /* the three grew alike, from the same capacity */
    tok_insert(e, e->nclients, hash, id);
    e->cstate[e->nclients] =
        (srv_client_state){.uploads = {(double)e->cfg->upload_rate, strata_clock_unix_ms()},
                           .seen_ms = seen_ms,
                           .stored_ms = seen_ms};
    e->clients[e->nclients++] = id; /* ids grow, the array stays sorted */
    return STRATA_OK;
}

void srv__registry_seen(srv_engine *e, uint64_t client_id)
{
    ptrdiff_t k = srv__id_find(e->clients, e->nclients, client_id);
    if (k >= 0)
        e->cstate[k].seen_ms = strata_clock_unix_ms();
}

void srv__registry_flush_seen(srv_engine *e)
{
    size_t n = 0;
    for (size_t i = 0; i < e->nclients; i++)
        n += e->cstate[i].seen_ms > e->cstate[i].stored_ms;
    if (n == 0)
        return;
    uint64_t *ids = malloc(n * sizeof(*ids));
    int64_t *ms = malloc(n * sizeof(*ms));
    strata_diag d = {{0}};
    int rc = STRATA_ENOMEM;
    if (ids != NULL && ms != NULL) {
        size_t j = 0;
        for (size_t i = 0; i < e->nclients; i++)
            if (e->cstate[i].seen_ms > e->cstate[i].stored_ms) {
                ids[j] = e->clients[i];
                ms[j++] = e->cstate[i].seen_ms;
            }
        rc = strata_store_clients_seen(e->store, ids, ms, n, &d);
    }
    if (rc == STRATA_OK)
        for (size_t i = 0; i < e->nclients; i++)
            e->cstate[i].stored_ms = e->cstate[i].seen_ms;
    else
        strata_log_warn("clients' last-seen times not recorded: %s", strata_diag_msg(&d, rc));
    free(ids);
    free(ms);
}

/* 1 when tok is 1 to TOKEN_MAX printable characters without spaces. */
static int bearer_token_ok(const char *tok)
{
    size_t n = strlen(tok);
    if (n == 0 || n > TOKEN_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (tok[i] <= 0x20 || tok[i] >= 0x7f)
            return 0;
    return 1;
}

/* The token of an "Authorization: Bearer TOKEN" value, or NULL. */
static const char *bearer(const char *h)
{
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    return bearer_token_ok(h + 7) ? h + 7 : NULL;
}

static int hash_equal(const uint8_t *a, const uint8_t *b)
{
    unsigned diff = 0;
    for (int i = 0; i < STRATA_STORE_HASH_LEN; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

/* Looks a bearer token up among the clients: 1 and the id when found, 0
 * when not. Takes the lock. */
static int client_of_token(srv_engine *e, const char *tok, uint64_t *client_id)
{
    uint8_t hash[STRATA_STORE_HASH_LEN];
    strata_sha256(tok, strlen(tok), hash);
    pthread_mutex_lock(&e->mu);
    const srv_tok_entry *k =
        e->nclients ? bsearch(hash, e->toks, e->nclients, sizeof(*e->toks), cmp_tok) : NULL;
    *client_id = k ? k->id : 0;
    pthread_mutex_unlock(&e->mu);
    return k != NULL;
}

int srv_engine_auth(srv_engine *e, const char *h, uint64_t *client_id, srv_result *r)
{
    *client_id = 0;
    const char *tok = bearer(h);
    if (tok == NULL) {
        srv_result_error(r, SRV_E_UNAUTHORIZED, "missing or malformed bearer token");
        return STRATA_EPROTO;
    }
    if (!client_of_token(e, tok, client_id)) {
        srv_result_error(r, SRV_E_UNAUTHORIZED, "unknown token");
        return STRATA_EPROTO;
    }
    return STRATA_OK;
}

int srv_engine_admin_auth(srv_engine *e, const char *h, srv_result *r)
{
    const char *tok = bearer(h);
    if (tok == NULL) {
        srv_result_error(r, SRV_E_UNAUTHORIZED, "missing or malformed admin bearer token");
        return STRATA_EPROTO;
    }
    uint8_t hash[STRATA_STORE_HASH_LEN];
    strata_sha256(tok, strlen(tok), hash);
    if (hash_equal(hash, e->admin_hash))
        return STRATA_OK;
    uint64_t id = 0;
    if (client_of_token(e, tok, &id))
        srv_result_error(r, SRV_E_FORBIDDEN, "client %llu's token cannot use admin endpoints",
                         (unsigned long long)id);
    else
        srv_result_error(r, SRV_E_UNAUTHORIZED, "unknown admin token");
    return STRATA_EPROTO;
}

/* Refills b at rate tokens a minute (its capacity) up to now and returns
 * the milliseconds until it holds one token (0 when it does). */
static double bucket_wait_ms(srv_bucket *b, double rate, int64_t now)
{
    double per_ms = rate / 60000.0, t = b->tokens + (double)(now - b->refilled_ms) * per_ms;
    b->tokens = t > rate ? rate : t;
    b->refilled_ms = now;
    return b->tokens >= 1.0 ? 0.0 : (1.0 - b->tokens) / per_ms;
}

/* Sets r's Retry-After to wait_ms rounded up to a second, at least 1. */
static void retry_after(srv_result *r, double wait_ms)
{
    r->retry_after = (int)ceil(wait_ms / 1000.0);
    if (r->retry_after < 1)
        r->retry_after = 1;
}

int srv_engine_rate_take(srv_engine *e, uint64_t client_id, srv_result *r)
{
    pthread_mutex_lock(&e->mu);
    ptrdiff_t k = srv__id_find(e->clients, e->nclients, client_id);
    double wait_ms = 0;
    if (k >= 0) {
        srv_bucket *b = &e->cstate[k].uploads;
        wait_ms = bucket_wait_ms(b, (double)e->cfg->upload_rate, strata_clock_unix_ms());
        if (wait_ms == 0)
            b->tokens -= 1.0;
    }
    pthread_mutex_unlock(&e->mu);
    if (wait_ms == 0)
        return STRATA_OK;
    srv__ctr_add(e, SRV_CTR_UPD_RATE_LIMITED, 1);
    srv_result_error(r, SRV_E_RATE_LIMITED, "more than %ld uploads in a minute from this client",
                     e->cfg->upload_rate);
    retry_after(r, wait_ms);
    return STRATA_ESTATE;
}

/* The wrong-secret bucket of address addr (NULL or "": unknown, one bucket
 * for all such), made full when it has none, in a free entry or else in the
 * one refilled longest ago. Lock held. */
static srv_bucket *peer_bucket(srv_engine *e, const char *addr, int64_t now)
{
    const char *key = addr != NULL && addr[0] != '\0' ? addr : "?";
    srv_peer *victim = NULL;
    for (size_t i = 0; i < SRV_PEERS; i++) {
        srv_peer *p = &e->peers[i];
        if (p->addr[0] == '\0') {
            if (victim == NULL || victim->addr[0] != '\0')
                victim = p;
        } else if (strncmp(p->addr, key, sizeof(p->addr)) == 0) {
            return &p->wrong;
        } else if (victim == NULL ||
                   (victim->addr[0] != '\0' && p->wrong.refilled_ms < victim->wrong.refilled_ms)) {
            victim = p;
        }
    }
    snprintf(victim->addr, sizeof(victim->addr), "%s", key);
    victim->wrong = (srv_bucket){(double)e->cfg->enrolment_rate, now};
    return &victim->wrong;
}

/* The data share a registration with registration id reg (NULL: none)
 * gets: a client's share is its place in the order of registration (ids
 * ascend and are never reused, so the place never changes), the place of
 * the client reg names when it registered before, else the next one.
 * Lock held. */
static int share_of(srv_engine *e, const char *reg, size_t *share, strata_diag *d)
{
    *share = e->nclients;
    if (reg == NULL || e->cfg->data_shares == 0)
        return STRATA_OK;
    uint64_t id = 0;
    int found = 0;
    int rc = strata_store_registration_find(e->store, reg, &id, &found, d);
    ptrdiff_t k = found ? srv__id_find(e->clients, e->nclients, id) : -1;
    if (rc == STRATA_OK && k >= 0)
        *share = (size_t)k;
    return rc;
}

void srv_engine_register(srv_engine *e, const char *peer, const uint8_t *body, size_t len,
                         srv_result *r)
{
    /* An address that sent enrolment_rate wrong secrets within a minute
     * waits, whatever it sends now: guessing the secret stays slow. */
    double rate = (double)e->cfg->enrolment_rate;
    int64_t now = strata_clock_unix_ms();
    pthread_mutex_lock(&e->mu);
    double wait_ms = bucket_wait_ms(peer_bucket(e, peer, now), rate, now);
    pthread_mutex_unlock(&e->mu);
    if (wait_ms > 0) {
        srv_result_error(r, SRV_E_RATE_LIMITED,
                         "more than %ld wrong enrolment secrets in a minute from this address",
                         e->cfg->enrolment_rate);
        retry_after(r, wait_ms);
        return;
    }
    srv_register_req rq;
    strata_diag pd = {{0}};
    int prc = srv_request_register(body, len, &e->jlim, &rq, &pd);
    if (prc < 0) {
        srv__result_bad_body(r, prc, &pd);
        return;
    }
    if (!srv_secret_equal(rq.secret, e->cfg->enrolment_secret)) {
        pthread_mutex_lock(&e->mu);
        peer_bucket(e, peer, now)->tokens -= 1.0;
        pthread_mutex_unlock(&e->mu);
        srv_result_error(r, SRV_E_BAD_SECRET, "wrong enrolment_secret");
        return;
    }
    const char *name = rq.has_name ? rq.name : NULL;
    uint8_t hash[STRATA_STORE_HASH_LEN];
    char tok[STRATA_TOKEN_HEX + 1];
    strata_diag td = {{0}};
    if (strata_random_token(tok, &td) < 0) {
        srv_result_internal(r, strata_diag_msg(&td, STRATA_EIO));
        return;
    }
    strata_sha256(tok, STRATA_TOKEN_HEX, hash);
    uint64_t id = 0;
    strata_diag d = {{0}};
    pthread_mutex_lock(&e->mu);
    if (e->nclients >= (size_t)e->cfg->max_clients) {
        pthread_mutex_unlock(&e->mu);
        srv_result_error(r, SRV_E_TOO_MANY_CLIENTS, "the federation is full (%ld clients)",
                         e->cfg->max_clients);
        return;
    }
    const char *reg = rq.has_registration_id ? rq.registration_id : NULL;
    size_t share = 0;
    int rc = share_of(e, reg, &share, &d);
    if (rc == STRATA_OK && e->cfg->data_shares > 0 && share >= (size_t)e->cfg->data_shares) {
        pthread_mutex_unlock(&e->mu);
        srv_result_error(r, SRV_E_NO_DATA_SHARE, "all %ld data shares are taken (--data-shares)",
                         e->cfg->data_shares);
        return;
    }
    int existed = 0;
    if (rc == STRATA_OK)
        rc = strata_store_client_add(e->store, hash, name, reg, &id, &existed, &d);
    if (rc == 0 && existed)
        tok_replace(e, id, hash);
    else if (rc == 0)
        rc = add_client(e, id, hash, strata_clock_unix_ms());
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    /* The store failing to write (STRATA_EIO: storage full or failing)
     * passes: nothing was registered, and the client retries. */
    if (rc == STRATA_EIO)
        srv_result_unavailable(r, "registration", strata_diag_msg(&d, rc));
    else if (rc < 0)
        srv_result_internal(r, strata_diag_msg(&d, rc));
    else if (e->cfg->data_shares > 0)
        srv__result_json(r, existed ? SRV_OK : SRV_CREATED,
                         json_pack("{s:I,s:s,s:I,s:I}", "client_id", (json_int_t)id, "token", tok,
                                   "data_share", (json_int_t)share, "data_shares",
                                   (json_int_t)e->cfg->data_shares));
    else
        srv__result_json(r, existed ? SRV_OK : SRV_CREATED,
                         json_pack("{s:I,s:s}", "client_id", (json_int_t)id, "token", tok));
}

/* Every registered client of the store, by id. */
static int load_clients(srv_engine *e, strata_diag *d)
{
    uint64_t count = 0;
    int rc = strata_store_client_count(e->store, &count, d);
    /* Ids are assigned ascending from 1 and never deleted; allow gaps. */
    for (uint64_t id = 1, misses = 0; rc == 0 && e->nclients < count && misses < 100000; id++) {
        strata_store_client cl;
        int found = 0;
        rc = strata_store_client_get(e->store, id, &cl, &found, d);
        if (rc == 0 && found)
            rc = add_client(e, id, cl.token_hash, cl.last_seen_unix_ms);
        else
            misses++;
    }
    return rc;
}

/* The admin token file: cfg admin_token_file, else STATE_DIR/admin.token.
 * The one place that composes this path. */
static void admin_token_path(const srv_engine *e, char *buf, size_t cap)
{
    if (e->cfg->admin_token_file != NULL)
        snprintf(buf, cap, "%s", e->cfg->admin_token_file);
    else if (strata_store_path(strata_store_dir(e->store), STRATA_STORE_FILE_ADMIN_TOKEN, 0, 0, buf,
                               cap, NULL) < 0)
        buf[0] = '\0';
}

/* Reads the admin token file, creating it with a random token (mode 0600)
 * when it does not exist, and keeps the token's hash. */
static int load_admin_token(srv_engine *e, strata_diag *d)
{
    char path[4200];
    admin_token_path(e, path, sizeof(path));
    char tok[TOKEN_MAX + 2];
    size_t n = 0;
    int rc = strata_file_read_line(path, tok, sizeof(tok), &n, d);
    if (rc == STRATA_ESTATE) { /* first start: make one */
        if ((rc = strata_random_token(tok, d)) < 0)
            return rc;
        tok[STRATA_TOKEN_HEX] = '\n';
        if ((rc = strata_file_write_atomic(path, tok, STRATA_TOKEN_HEX + 1, 0600, d)) < 0)
            return rc;
        strata_log_info("new admin token in %s", path);
        rc = strata_file_read_line(path, tok, sizeof(tok), &n, d);
    }
    if (rc < 0 && rc != STRATA_ETOOBIG)
        return rc; /* diag names the file and the error */
    if (rc < 0 || n < 16 || bearer_token_ok(tok) == 0)
        return strata_diag_set(d, STRATA_EINVAL,
                               "admin_token_file: %s: the first line must be a token of 16 to %d "
                               "printable characters without spaces",
                               path, TOKEN_MAX);
    strata_sha256(tok, n, e->admin_hash);
    return 0;
}

int srv__registry_load(srv_engine *e, strata_diag *d)
{
    e->peers = calloc(SRV_PEERS, sizeof(*e->peers));
    if (e->peers == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory");
    int rc = load_clients(e, d);
    return rc < 0 ? rc : load_admin_token(e, d);
}

void srv__registry_cleanup(srv_engine *e)
{
    free(e->clients);
    free(e->cstate);
    free(e->toks);
    free(e->peers);
    e->peers = NULL;
    e->clients = NULL;
    e->cstate = NULL;
    e->toks = NULL;
    e->nclients = e->capclients = 0;
}
