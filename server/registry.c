/* The client registry (see registry.h): registration, the in-memory token
 * index (clients by token hash, so that authenticating a request needs no
 * database lookup), bearer-token parsing, the admin token, the per-client
 * upload-rate buckets and last-seen times, and the selection order of a
 * round. This file alone touches struct srv_registry.
 *
 * May call: the store (clients, SHA-256), request.h (the registration body),
 * metrics.h, libstrata (fileio: token files and random tokens; clock; rng;
 * log). */
#include "registry.h"

#include "result_internal.h"

#include "strata/buf.h"
#include "strata/clock.h"
#include "strata/fileio.h"
#include "strata/hash.h"
#include "strata/log.h"
#include "strata/rng.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TOKEN_MAX 256

/* A client's token hash and id (the token index, ascending by hash). */
typedef struct tok_entry {
    uint8_t hash[STRATA_STORE_HASH_LEN];
    uint64_t id;
} tok_entry;

/* A rate bucket: tokens refilled at a rate a minute up to that rate, as of
 * refilled_ms. */
typedef struct bucket {
    double tokens;
    int64_t refilled_ms;
} bucket;

/* A registered client's state beside its id: its upload-rate bucket
 * (upload_rate a minute), when it last asked for a task, the last-seen time
 * the store holds (written in batches by srv__registry_flush_seen), and the
 * round before which it is not selected (it missed a deadline). */
typedef struct client_state {
    bucket uploads;
    int64_t seen_ms, stored_ms;
    uint32_t benched_until;
} client_state;

/* Addresses whose wrong enrolment secrets are counted at once; beyond it the
 * entry refilled longest ago is reused. */
#define PEERS 1024

/* The longest address text (an IPv6 address, NUL included). */
#define PEER_MAX 46

/* One address's bucket of wrong enrolment secrets (enrolment_rate a
 * minute). */
typedef struct peer {
    char addr[PEER_MAX];
    bucket wrong;
} peer;

/* The registered clients, ascending ids, with each one's state (cstate[i]
 * belongs to clients[i]), and the same clients by token hash (ascending). */
struct srv_registry {
    srv_registry_config c;
    uint64_t *clients;
    client_state *cstate;
    size_t nclients, capclients;
    tok_entry *toks;
    uint8_t admin_hash[STRATA_STORE_HASH_LEN];
    peer *peers;     /* PEERS entries; addr "" when unused */
    bucket lookups;  /* a shared store's lookups of unknown tokens */
    uint64_t synced; /* every client of the store up to this id is here */
};

static int load_clients(srv_registry *g, strata_diag *d);
static double bucket_wait_ms(bucket *b, double rate, int64_t now);

/* Store lookups of unknown tokens a minute (a bucket that holds as many):
 * a burst of clients that registered elsewhere passes, a stream of bad
 * tokens costs the store little. */
#define LOOKUPS_PER_MINUTE 6000

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
static void tok_insert(srv_registry *g, size_t n, const uint8_t hash[STRATA_STORE_HASH_LEN],
                       uint64_t id)
{
    size_t at = 0, hi = n; /* insertion point by hash */
    while (at < hi) {
        size_t mid = at + (hi - at) / 2;
        if (memcmp(g->toks[mid].hash, hash, STRATA_STORE_HASH_LEN) < 0)
            at = mid + 1;
        else
            hi = mid;
    }
    memmove(&g->toks[at + 1], &g->toks[at], (n - at) * sizeof(*g->toks));
    memcpy(g->toks[at].hash, hash, STRATA_STORE_HASH_LEN);
    g->toks[at].id = id;
}

/* Gives registered client id the token hash hash (a repeated registration):
 * its old token stops working. Lock held. */
static void tok_replace(srv_registry *g, uint64_t id, const uint8_t hash[STRATA_STORE_HASH_LEN])
{
    size_t i = 0;
    while (i < g->nclients && g->toks[i].id != id)
        i++;
    if (i == g->nclients)
        return;
    memmove(&g->toks[i], &g->toks[i + 1], (g->nclients - i - 1) * sizeof(*g->toks));
    tok_insert(g, g->nclients - 1, hash, id);
}

/* Adds a registered client, its token hash, and its state: a full
 * upload-rate bucket and the last time it was seen. Ids mostly arrive
 * ascending, but on a shared store another coordinator's client may come
 * after a higher one registered here: it goes to its place. Lock held (or
 * start-up). */
static int add_client(srv_registry *g, uint64_t id, const uint8_t hash[STRATA_STORE_HASH_LEN],
                      int64_t seen_ms)
{
    size_t need = g->nclients + 1, c1 = g->capclients, c2 = c1, c3 = c1;
    uint64_t *ids = strata_array_grow(g->clients, &c1, need, sizeof(*ids));
    if (ids != NULL)
        g->clients = ids;
    client_state *st = strata_array_grow(g->cstate, &c2, need, sizeof(*st));
    if (st != NULL)
        g->cstate = st;
    tok_entry *k = strata_array_grow(g->toks, &c3, need, sizeof(*k));
    if (k != NULL)
        g->toks = k;
    if (ids == NULL || st == NULL || k == NULL)
        return STRATA_ENOMEM;
    g->capclients = c1; /* the three grew alike, from the same capacity */
    tok_insert(g, g->nclients, hash, id);
    size_t at = g->nclients;
    while (at > 0 && g->clients[at - 1] > id)
        at--;
    memmove(&g->clients[at + 1], &g->clients[at], (g->nclients - at) * sizeof(*g->clients));
    memmove(&g->cstate[at + 1], &g->cstate[at], (g->nclients - at) * sizeof(*g->cstate));
    g->cstate[at] = (client_state){.uploads = {(double)g->c.upload_rate, strata_clock_unix_ms()},
                                   .seen_ms = seen_ms,
                                   .stored_ms = seen_ms};
    g->clients[at] = id;
    g->nclients++;
    return STRATA_OK;
}

void srv__registry_seen(srv_registry *g, uint64_t client_id)
{
    ptrdiff_t k = srv__id_find(g->clients, g->nclients, client_id);
    if (k >= 0)
        g->cstate[k].seen_ms = strata_clock_unix_ms();
}

void srv__registry_flush_seen(srv_registry *g)
{
    size_t n = 0;
    for (size_t i = 0; i < g->nclients; i++)
        n += g->cstate[i].seen_ms > g->cstate[i].stored_ms;
    if (n == 0)
        return;
    uint64_t *ids = malloc(n * sizeof(*ids));
    int64_t *ms = malloc(n * sizeof(*ms));
    strata_diag d = {{0}};
    int rc = STRATA_ENOMEM;
    if (ids != NULL && ms != NULL) {
        size_t j = 0;
        for (size_t i = 0; i < g->nclients; i++)
            if (g->cstate[i].seen_ms > g->cstate[i].stored_ms) {
                ids[j] = g->clients[i];
                ms[j++] = g->cstate[i].seen_ms;
            }
        rc = strata_store_clients_seen(g->c.store, ids, ms, n, &d);
    }
    if (rc == STRATA_OK)
        for (size_t i = 0; i < g->nclients; i++)
            g->cstate[i].stored_ms = g->cstate[i].seen_ms;
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

static const tok_entry *tok_find(const srv_registry *g, const uint8_t *hash)
{
    return g->nclients ? bsearch(hash, g->toks, g->nclients, sizeof(*g->toks), cmp_tok) : NULL;
}

/* On a shared store, a token this registry does not know may be one that
 * another coordinator gave a client a moment ago (a new registration, or
 * one again under its registration id): looked up in the store, the client
 * is added (with every other new one) or takes its new token here too.
 * Lock held. */
static const tok_entry *lookup_token(srv_registry *g, const uint8_t *hash, int *throttled)
{
    int64_t now = strata_clock_unix_ms();
    if (!g->c.shared)
        return NULL;
    if (bucket_wait_ms(&g->lookups, LOOKUPS_PER_MINUTE, now) > 0) {
        *throttled = 1;
        return NULL;
    }
    g->lookups.tokens -= 1.0;
    strata_store_client c;
    int found = 0;
    if (strata_store_client_find(g->c.store, hash, &c, &found, NULL) < 0 || !found)
        return NULL;
    if (srv__id_find(g->clients, g->nclients, c.id) >= 0)
        tok_replace(g, c.id, hash);
    else if (load_clients(g, NULL) < 0)
        return NULL;
    return tok_find(g, hash);
}

/* Looks a bearer token up among the clients: 1 and the id when found, 0
 * when not, 2 when a shared store's lookup was not made now (too many
 * unknown tokens: the caller asks the client to retry). Takes the lock. */
static int client_of_token(srv_registry *g, const char *tok, uint64_t *client_id)
{
    uint8_t hash[STRATA_STORE_HASH_LEN];
    strata_sha256(tok, strlen(tok), hash);
    int throttled = 0;
    pthread_mutex_lock(g->c.mu);
    const tok_entry *k = tok_find(g, hash);
    if (k == NULL)
        k = lookup_token(g, hash, &throttled);
    *client_id = k ? k->id : 0;
    pthread_mutex_unlock(g->c.mu);
    return k != NULL ? 1 : throttled ? 2 : 0;
}

int srv__registry_auth(srv_registry *g, const char *h, uint64_t *client_id, srv_result *r)
{
    *client_id = 0;
    const char *tok = bearer(h);
    if (tok == NULL) {
        srv_result_error(r, SRV_E_UNAUTHORIZED, "missing or malformed bearer token");
        return STRATA_EPROTO;
    }
    int known = client_of_token(g, tok, client_id);
    if (known == 2) {
        srv_result_error(r, SRV_E_UNAVAILABLE, "too many unknown tokens to look up now; retry");
        r->retry_after = 1;
        return STRATA_EPROTO;
    }
    if (!known) {
        srv_result_error(r, SRV_E_UNAUTHORIZED, "unknown token");
        return STRATA_EPROTO;
    }
    return STRATA_OK;
}

int srv__registry_admin_auth(srv_registry *g, const char *h, srv_result *r)
{
    const char *tok = bearer(h);
    if (tok == NULL) {
        srv_result_error(r, SRV_E_UNAUTHORIZED, "missing or malformed admin bearer token");
        return STRATA_EPROTO;
    }
    uint8_t hash[STRATA_STORE_HASH_LEN];
    strata_sha256(tok, strlen(tok), hash);
    if (hash_equal(hash, g->admin_hash))
        return STRATA_OK;
    uint64_t id = 0;
    if (client_of_token(g, tok, &id) == 1)
        srv_result_error(r, SRV_E_FORBIDDEN, "client %llu's token cannot use admin endpoints",
                         (unsigned long long)id);
    else
        srv_result_error(r, SRV_E_UNAUTHORIZED, "unknown admin token");
    return STRATA_EPROTO;
}

/* Refills b at rate tokens a minute (its capacity) up to now and returns
 * the milliseconds until it holds one token (0 when it does). */
static double bucket_wait_ms(bucket *b, double rate, int64_t now)
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

int srv__registry_rate_take(srv_registry *g, uint64_t client_id, srv_result *r)
{
    pthread_mutex_lock(g->c.mu);
    ptrdiff_t k = srv__id_find(g->clients, g->nclients, client_id);
    double wait_ms = 0;
    if (k >= 0) {
        bucket *b = &g->cstate[k].uploads;
        wait_ms = bucket_wait_ms(b, (double)g->c.upload_rate, strata_clock_unix_ms());
        if (wait_ms == 0)
            b->tokens -= 1.0;
    }
    pthread_mutex_unlock(g->c.mu);
    if (wait_ms == 0)
        return STRATA_OK;
    srv__ctr_add(g->c.met, SRV_CTR_UPD_RATE_LIMITED, 1);
    srv_result_error(r, SRV_E_RATE_LIMITED, "more than %ld uploads in a minute from this client",
                     g->c.upload_rate);
    retry_after(r, wait_ms);
    return STRATA_ESTATE;
}

/* The wrong-secret bucket of address addr (NULL or "": unknown, one bucket
 * for all such), made full when it has none, in a free entry or else in the
 * one refilled longest ago. Lock held. */
static bucket *peer_bucket(srv_registry *g, const char *addr, int64_t now)
{
    const char *key = addr != NULL && addr[0] != '\0' ? addr : "?";
    peer *victim = NULL;
    for (size_t i = 0; i < PEERS; i++) {
        peer *p = &g->peers[i];
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
    victim->wrong = (bucket){(double)g->c.enrolment_rate, now};
    return &victim->wrong;
}

/* The data share a registration with registration id reg (NULL: none)
 * gets: a client's share is its place in the order of registration (ids
 * ascend and are never reused, so the place never changes), the place of
 * the client reg names when it registered before, else the next one.
 * Lock held. */
static int share_of(srv_registry *g, const char *reg, size_t *share, strata_diag *d)
{
    *share = g->nclients;
    if (reg == NULL || g->c.data_shares == 0)
        return STRATA_OK;
    uint64_t id = 0;
    int found = 0;
    int rc = strata_store_registration_find(g->c.store, reg, &id, &found, d);
    ptrdiff_t k = found ? srv__id_find(g->clients, g->nclients, id) : -1;
    if (rc == STRATA_OK && k >= 0)
        *share = (size_t)k;
    return rc;
}

void srv__registry_register(srv_registry *g, const char *peer, const uint8_t *body, size_t len,
                            srv_result *r)
{
    /* An address that sent enrolment_rate wrong secrets within a minute
     * waits, whatever it sends now: guessing the secret stays slow. */
    double rate = (double)g->c.enrolment_rate;
    int64_t now = strata_clock_unix_ms();
    pthread_mutex_lock(g->c.mu);
    double wait_ms = bucket_wait_ms(peer_bucket(g, peer, now), rate, now);
    pthread_mutex_unlock(g->c.mu);
    if (wait_ms > 0) {
        srv_result_error(r, SRV_E_RATE_LIMITED,
                         "more than %ld wrong enrolment secrets in a minute from this address",
                         g->c.enrolment_rate);
        retry_after(r, wait_ms);
        return;
    }
    srv_register_req rq;
    strata_diag pd = {{0}};
    int prc = srv_request_register(body, len, g->c.jlim, &rq, &pd);
    if (prc < 0) {
        srv__result_bad_body(r, prc, &pd);
        return;
    }
    if (!srv_secret_equal(rq.secret, g->c.enrolment_secret)) {
        pthread_mutex_lock(g->c.mu);
        peer_bucket(g, peer, now)->tokens -= 1.0;
        pthread_mutex_unlock(g->c.mu);
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
    pthread_mutex_lock(g->c.mu);
    if (g->nclients >= (size_t)g->c.max_clients) {
        pthread_mutex_unlock(g->c.mu);
        srv_result_error(r, SRV_E_TOO_MANY_CLIENTS, "the federation is full (%ld clients)",
                         g->c.max_clients);
        return;
    }
    const char *reg = rq.has_registration_id ? rq.registration_id : NULL;
    size_t share = 0;
    int rc = share_of(g, reg, &share, &d);
    if (rc == STRATA_OK && g->c.data_shares > 0 && share >= (size_t)g->c.data_shares) {
        pthread_mutex_unlock(g->c.mu);
        srv_result_error(r, SRV_E_NO_DATA_SHARE, "all %ld data shares are taken (--data-shares)",
                         g->c.data_shares);
        return;
    }
    int existed = 0;
    if (rc == STRATA_OK)
        rc = strata_store_client_add(g->c.store, hash, name, reg, &id, &existed, &d);
    if (rc == 0 && existed)
        tok_replace(g, id, hash);
    else if (rc == 0)
        rc = add_client(g, id, hash, strata_clock_unix_ms());
    pthread_cond_broadcast(g->c.wake);
    pthread_mutex_unlock(g->c.mu);
    /* The store failing to write (STRATA_EIO: storage full or failing)
     * passes: nothing was registered, and the client retries. */
    if (rc == STRATA_EIO)
        srv_result_unavailable(r, "registration", strata_diag_msg(&d, rc));
    else if (rc < 0)
        srv_result_internal(r, strata_diag_msg(&d, rc));
    else if (g->c.data_shares > 0)
        srv__result_json(r, existed ? SRV_OK : SRV_CREATED,
                         json_pack("{s:I,s:s,s:I,s:I}", "client_id", (json_int_t)id, "token", tok,
                                   "data_share", (json_int_t)share, "data_shares",
                                   (json_int_t)g->c.data_shares));
    else
        srv__result_json(r, existed ? SRV_OK : SRV_CREATED,
                         json_pack("{s:I,s:s}", "client_id", (json_int_t)id, "token", tok));
}

/* Every registered client of the store that the registry does not have
 * yet, by id: those above the ids it has read from the store before (a
 * shared store's other coordinators register clients too, so an id this
 * registry gave out says nothing of the ones below it). */
static int load_clients(srv_registry *g, strata_diag *d)
{
    uint64_t count = 0;
    int rc = strata_store_client_count(g->c.store, &count, d);
    /* Ids are assigned ascending from 1 and never deleted; allow gaps. */
    for (uint64_t id = g->synced + 1, misses = 0; rc == 0 && g->nclients < count && misses < 100000;
         id++) {
        if (srv__id_find(g->clients, g->nclients, id) >= 0)
            continue;
        strata_store_client cl;
        int found = 0;
        rc = strata_store_client_get(g->c.store, id, &cl, &found, d);
        if (rc == 0 && found)
            rc = add_client(g, id, cl.token_hash, cl.last_seen_unix_ms);
        else
            misses++;
    }
    if (rc == 0 && g->nclients >= count && g->nclients > 0)
        g->synced = g->clients[g->nclients - 1];
    return rc;
}

/* The admin token file: cfg admin_token_file, else STATE_DIR/admin.token.
 * The one place that composes this path. */
static void admin_token_path(const srv_registry *g, char *buf, size_t cap)
{
    if (g->c.admin_token_file != NULL)
        snprintf(buf, cap, "%s", g->c.admin_token_file);
    else if (strata_store_path(strata_store_dir(g->c.store), STRATA_STORE_FILE_ADMIN_TOKEN, 0, 0,
                               buf, cap, NULL) < 0)
        buf[0] = '\0';
}

/* Reads the admin token file, creating it with a random token (mode 0600)
 * when it does not exist, and keeps the token's hash. */
static int load_admin_token(srv_registry *g, strata_diag *d)
{
    char path[4200];
    admin_token_path(g, path, sizeof(path));
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
    strata_sha256(tok, n, g->admin_hash);
    return 0;
}

int srv__registry_new(const srv_registry_config *c, srv_registry **out, strata_diag *d)
{
    *out = NULL;
    srv_registry *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory");
    g->c = *c;
    g->lookups = (bucket){LOOKUPS_PER_MINUTE, strata_clock_unix_ms()};
    g->peers = calloc(PEERS, sizeof(*g->peers));
    int rc = g->peers == NULL ? strata_diag_set(d, STRATA_ENOMEM, "out of memory") : 0;
    if (rc == 0)
        rc = load_clients(g, d);
    if (rc == 0)
        rc = load_admin_token(g, d);
    if (rc < 0) {
        srv__registry_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int srv__registry_sync(srv_registry *g, strata_diag *d)
{
    pthread_mutex_lock(g->c.mu);
    size_t before = g->nclients;
    int rc = load_clients(g, d);
    if (g->nclients > before)
        pthread_cond_broadcast(g->c.wake);
    pthread_mutex_unlock(g->c.mu);
    return rc;
}

void srv__registry_free(srv_registry *g)
{
    if (g == NULL)
        return;
    free(g->clients);
    free(g->cstate);
    free(g->toks);
    free(g->peers);
    free(g);
}

size_t srv__registry_count(const srv_registry *g)
{
    return g->nclients;
}

void srv__registry_bench(srv_registry *g, uint64_t client_id, uint32_t until)
{
    ptrdiff_t i = srv__id_find(g->clients, g->nclients, client_id);
    if (i >= 0)
        g->cstate[i].benched_until = until;
}

/* A client counts as live when it asked for a task this recently. */
#define LIVE_MS 60000

/* Where registered client i stands for round r's selection: 0 live, 1 not
 * seen lately, 2 benched (it missed a deadline). Lock held. */
static int selection_class(const srv_registry *g, size_t i, uint32_t r, int64_t now)
{
    const client_state *c = &g->cstate[i];
    if (c->benched_until > r)
        return 2;
    return now - c->seen_ms <= LIVE_MS ? 0 : 1;
}

void srv__registry_select(const srv_registry *g, uint64_t seed, uint32_t r, size_t ks,
                          uint64_t *sel)
{
    size_t n = g->nclients;
    size_t *idx = malloc((n ? n : 1) * sizeof(*idx));
    strata_rng rng;
    strata_rng_seed(&rng, seed, 0x5e1ec7ULL + r);
    if (idx == NULL) { /* no memory for the ordering: the first ks by id */
        memcpy(sel, g->clients, ks * sizeof(*sel));
        return;
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    for (size_t i = 0; i < n; i++) {
        size_t j = i + (size_t)strata_rng_below(&rng, n - i);
        size_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    int64_t now = strata_clock_unix_ms();
    size_t taken = 0;
    for (int cls = 0; cls < 3 && taken < ks; cls++)
        for (size_t i = 0; i < n && taken < ks; i++)
            if (selection_class(g, idx[i], r, now) == cls)
                sel[taken++] = g->clients[idx[i]];
    free(idx);
    srv__id_sort(sel, ks);
}
