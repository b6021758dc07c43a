/* The store's conformance suite: every case below runs against every backend
 * of STORE_BACKENDS, through the interface of store.h alone (registration,
 * rounds, updates and receipts, group commits, counters, checkpoints,
 * concurrent connections, and recovery after the process is killed). What
 * only one backend has (its files, its schema, its migrations) is tested
 * beside it, e.g. test_store_sqlite.c.
 *
 * A backend joins the suite with one line in STORE_BACKENDS and its
 * functions (store_backends.c): it makes a fresh store in a temporary
 * location, opens the store at that location again (after a close, or after
 * the process that had it open was killed), opens a secondary connection,
 * and removes the location. Each backend is one CUnit suite; every case gets
 * a fresh store (the fixture F) from the suite's set-up.
 *
 *   test_store_conformance                     every backend that can run here
 *                                              (PostgreSQL: with STRATA_TEST_PG_URL)
 *   test_store_conformance --backend NAME      that backend's suite only
 *
 * The ctest entry unit.test_store_conformance_postgresql runs the second
 * form inside tests/unit/with_postgres.sh, which provides a PostgreSQL. */
#include "store.h"
#include "store_backends.h"
#include "test_util.h"

#include "strata/hash.h"
#include "strata/rng.h"

#include <CUnit/CUnit.h>
#include <CUnit/TestRun.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- The fixture: a fresh store per case -------------------------------- */

#define MAX_SECONDARIES 16

typedef struct fixture {
    const store_backend *b;
    char *loc;
    strata_store *s; /* the primary connection; NULL while closed */
    strata_store *sec[MAX_SECONDARIES];
    size_t nsec;
} fixture;

static fixture F;
static char suite_names[STORE_N_BACKENDS][64];

static strata_store *fx_open(fixture *f, store_open_how how, const strata_store *primary)
{
    strata_store *s = NULL;
    strata_diag d;
    int rc = f->b->open(how, &f->loc, primary, &s, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "%s: open (%d): %s\n", f->b->name, (int)how, strata_diag_msg(&d, rc));
    return s;
}

/* Makes a fresh store for backend b into *f. */
static void fx_fresh(fixture *f, const store_backend *b)
{
    memset(f, 0, sizeof(*f));
    f->b = b;
    f->s = fx_open(f, STORE_FRESH, NULL);
}

/* Closes every connection of f (secondaries first). */
static void fx_close(fixture *f)
{
    for (size_t i = 0; i < f->nsec; i++)
        strata_store_close(f->sec[i]);
    f->nsec = 0;
    strata_store_close(f->s);
    f->s = NULL;
}

/* Closes f's connections and opens the primary again. */
static strata_store *fx_reopen(fixture *f)
{
    fx_close(f);
    if (f->loc != NULL)
        f->s = fx_open(f, STORE_REOPEN, NULL);
    return f->s;
}

/* A secondary connection of f's primary, closed with f. */
static strata_store *fx_secondary(fixture *f)
{
    if (f->s == NULL || f->nsec == MAX_SECONDARIES)
        return NULL;
    strata_store *s = fx_open(f, STORE_SECONDARY, f->s);
    if (s != NULL)
        f->sec[f->nsec++] = s;
    return s;
}

/* Closes secondary s of f before the others (a process that ends). */
static void fx_close_secondary(fixture *f, strata_store *s)
{
    for (size_t i = 0; i < f->nsec; i++) {
        if (f->sec[i] == s) {
            strata_store_close(s);
            f->sec[i] = f->sec[--f->nsec];
            return;
        }
    }
}

static void fx_remove(fixture *f)
{
    fx_close(f);
    if (f->b != NULL)
        f->b->remove(f->loc);
    f->loc = NULL;
}

/* The backend of the running suite. */
static const store_backend *current_backend(void)
{
    CU_pSuite suite = CU_get_current_suite();
    for (size_t i = 0; suite != NULL && i < STORE_N_BACKENDS; i++)
        if (strcmp(suite->pName, suite_names[i]) == 0)
            return &STORE_BACKENDS[i];
    return NULL;
}

static void case_setup(void)
{
    const store_backend *b = current_backend();
    memset(&F, 0, sizeof(F));
    if (b != NULL)
        fx_fresh(&F, b);
}

static void case_teardown(void)
{
    fx_remove(&F);
}

/* The primary connection of the case's fresh store; ends the case when the
 * backend could not make one. */
#define FRESH_STORE(s)                                                                             \
    strata_store *s = F.s;                                                                         \
    CU_ASSERT_PTR_NOT_NULL_FATAL(s)

/* ---- Helpers ------------------------------------------------------------ */

static void token_hash(int i, uint8_t h[STRATA_STORE_HASH_LEN])
{
    char tok[64];
    snprintf(tok, sizeof(tok), "token-%d", i);
    strata_sha256(tok, strlen(tok), h);
}

/* Registers n clients (token-(base+1) .. token-(base+n)) into ids. */
static void add_clients_from(strata_store *s, int base, int n, uint64_t *ids)
{
    for (int i = 0; i < n; i++) {
        uint8_t h[STRATA_STORE_HASH_LEN];
        token_hash(base + i + 1, h);
        CU_ASSERT_EQUAL_FATAL(strata_store_client_add(s, h, NULL, NULL, &ids[i], NULL, NULL),
                              STRATA_OK);
    }
}

static void add_clients(strata_store *s, int n, uint64_t *ids)
{
    add_clients_from(s, 0, n, ids);
}

static void hex(const uint8_t *h, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", h[i]);
}

/* The payload client `client` uploads in round `round`: 1 to 20000
 * deterministic bytes (free()). */
static uint8_t *payload_of(uint32_t round, uint64_t client, size_t *len)
{
    strata_rng rng;
    strata_rng_seed(&rng, round, client);
    *len = 1 + (size_t)strata_rng_below(&rng, 20000);
    uint8_t *p = malloc(*len);
    if (p != NULL) {
        for (size_t i = 0; i < *len; i++)
            p[i] = (uint8_t)strata_rng_u64(&rng);
    }
    return p;
}

/* The number of listed updates of a round (0 on error). */
static size_t count_updates(strata_store *s, uint32_t round)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(s, round, &ups, &n, NULL);
    strata_store_update_list_free(ups, n);
    return rc == STRATA_OK ? n : 0;
}

/* Whether client's stored payload for round is exactly data[0, len). */
static int reads_back(strata_store *s, uint32_t round, uint64_t client, const void *data,
                      size_t len)
{
    uint8_t *buf = NULL;
    size_t got = 0;
    strata_diag d;
    int rc = strata_store_update_read(s, round, client, &buf, &got, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "read of client %" PRIu64 ", round %" PRIu32 ": %s\n", client, round,
                strata_diag_msg(&d, rc));
    int same = rc == STRATA_OK && buf != NULL && got == len && memcmp(buf, data, len) == 0;
    free(buf);
    return same;
}

static strata_store_pending *prepare_bytes(strata_store *s, uint32_t round, uint64_t client,
                                           const void *data, size_t len, uint64_t samples)
{
    strata_store_pending *p = NULL;
    strata_diag d;
    int rc = strata_store_update_prepare(s, round, client, data, len, samples, &p, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "prepare: %s\n", strata_diag_msg(&d, rc));
    return p;
}

static strata_store_pending *prepare(strata_store *s, uint32_t round, uint64_t client,
                                     const char *text, uint64_t samples)
{
    return prepare_bytes(s, round, client, text, strlen(text), samples);
}

/* The three ways to store one update. */
typedef enum { VIA_PUT, VIA_COMMIT, VIA_COMMIT_MANY } via;

static const char *const VIA_NAME[] = {"put", "prepare + commit", "prepare + commit_many of one"};

/* Stores one update the way `how` says, with put's results. A group commit
 * reports an item's refusal without a message: diag is then not set. */
static int store_via(strata_store *s, via how, uint32_t round, uint64_t client, const void *data,
                     size_t len, uint64_t samples, strata_store_receipt *r, strata_store_verdict *v,
                     strata_diag *d)
{
    if (how == VIA_PUT)
        return strata_store_update_put(s, round, client, data, len, samples, r, v, d);
    strata_store_pending *p = NULL;
    int rc = strata_store_update_prepare(s, round, client, data, len, samples, &p, d);
    if (rc < 0)
        return rc;
    if (how == VIA_COMMIT)
        return strata_store_update_commit(s, p, r, v, d);
    int result = -99;
    rc = strata_store_update_commit_many(s, &p, 1, r, v, &result, d);
    CU_ASSERT_EQUAL(result, rc < 0 ? rc : result);
    return rc < 0 ? rc : result;
}

/* A receipt as a refusal leaves it: all zero. */
static int receipt_is_zero(const strata_store_receipt *r)
{
    static const uint8_t zero[STRATA_STORE_HASH_LEN];
    return r->id[0] == '\0' && memcmp(r->sha256, zero, sizeof(zero)) == 0 && r->bytes == 0 &&
           r->samples == 0 && r->received_unix_ms == 0 && r->duplicate == 0;
}

static int receipt_id_ok(const char *id)
{
    return strlen(id) == STRATA_STORE_RECEIPT_LEN &&
           strspn(id, "0123456789abcdef") == STRATA_STORE_RECEIPT_LEN;
}

/* ---- Clients ------------------------------------------------------------ */

static void test_clients(void)
{
    FRESH_STORE(s);
    CU_ASSERT_STRING_EQUAL(strata_store_backend(s), F.b->name);
    strata_diag d;
    uint8_t h1[32], h2[32], h3[32];
    token_hash(1, h1);
    token_hash(2, h2);
    token_hash(3, h3);
    uint64_t id1 = 0, id2 = 0, id = 7, n = 9;

    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 0);
    int existed = -1;
    CU_ASSERT_EQUAL(strata_store_client_add(s, h1, "edge-1", NULL, &id1, &existed, &d), STRATA_OK);
    CU_ASSERT_EQUAL(existed, 0);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h2, NULL, NULL, &id2, NULL, &d), STRATA_OK);
    CU_ASSERT(id1 >= 1 && id2 > id1);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 2);

    strata_store_client c;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_client_get(s, id2, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(c.id, id2);
    CU_ASSERT_STRING_EQUAL(c.name, "");
    CU_ASSERT(memcmp(c.token_hash, h2, 32) == 0);
    CU_ASSERT(c.created_unix_ms > 0 && c.last_seen_unix_ms == c.created_unix_ms);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id1, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_STRING_EQUAL(c.name, "edge-1");
    CU_ASSERT(memcmp(c.token_hash, h1, 32) == 0);
    found = 1;
    CU_ASSERT_EQUAL(strata_store_client_get(s, 999, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(c.id, 0);
    CU_ASSERT_EQUAL(strata_store_client_get(s, UINT64_MAX, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);

    /* A token hash registers once. */
    CU_ASSERT_EQUAL(strata_store_client_add(s, h1, "again", NULL, &id, NULL, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(id, 0);
    CU_ASSERT(strstr(d.msg, "token hash") != NULL);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 2);

    /* A registration id: the first use stores a new client; a repeat (with
     * a new token hash) gets the same client, whose old hash is gone. */
    uint8_t h4[32], h5[32], h6[32];
    uint64_t r1 = 0, r2 = 0;
    token_hash(4, h4);
    token_hash(5, h5);
    token_hash(6, h6);
    CU_ASSERT_EQUAL(strata_store_registration_find(s, "reg-aaaaaaaaaaaa", &r1, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h4, "r", "reg-aaaaaaaaaaaa", &r1, &existed, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(existed, 0);
    CU_ASSERT(r1 > id2);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h5, "r2", "reg-aaaaaaaaaaaa", &r2, &existed, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(existed, 1);
    CU_ASSERT_EQUAL(r2, r1);
    CU_ASSERT_EQUAL(strata_store_client_get(s, r1, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT(memcmp(c.token_hash, h5, 32) == 0);
    CU_ASSERT_STRING_EQUAL(c.name, "r"); /* the name of the first registration stays */
    uint64_t got = 0;
    CU_ASSERT_EQUAL(strata_store_registration_find(s, "reg-aaaaaaaaaaaa", &got, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(got, r1);
    /* The old token hash is free again: another client may have it. */
    uint64_t r3 = 0;
    CU_ASSERT_EQUAL(strata_store_client_add(s, h4, NULL, "reg-cccccccccccc", &r3, &existed, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(existed, 0);
    CU_ASSERT(r3 > r1);
    /* A token hash in use is refused even with a new registration id, and
     * the refusal stores nothing. */
    r2 = 5;
    existed = 5;
    CU_ASSERT_EQUAL(strata_store_client_add(s, h5, "r", "reg-bbbbbbbbbbbb", &r2, &existed, &d),
                    STRATA_ESTATE);
    CU_ASSERT_EQUAL(r2, 0);
    CU_ASSERT_EQUAL(existed, 0);
    CU_ASSERT_EQUAL(strata_store_registration_find(s, "reg-bbbbbbbbbbbb", &got, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    /* Registration ids of 1 to STRATA_STORE_REGISTRATION_MAX bytes. */
    char reg_max[STRATA_STORE_REGISTRATION_MAX + 2];
    memset(reg_max, 'g', sizeof(reg_max) - 1);
    reg_max[sizeof(reg_max) - 1] = '\0';
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, "r", "", &r2, &existed, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, "r", reg_max, &r2, &existed, &d), STRATA_EINVAL);
    reg_max[STRATA_STORE_REGISTRATION_MAX] = '\0';
    CU_ASSERT_EQUAL(strata_store_client_add(s, h6, "r", reg_max, &r2, &existed, &d), STRATA_OK);
    CU_ASSERT_EQUAL(existed, 0);
    CU_ASSERT_EQUAL(strata_store_registration_find(s, reg_max, &got, &found, &d), STRATA_OK);
    CU_ASSERT(found == 1 && got == r2);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 5);

    /* Last-seen times are set in one batch, raised or lowered as given;
     * unknown ids are skipped. */
    CU_ASSERT_EQUAL(strata_store_client_get(s, id1, &c, &found, NULL), STRATA_OK);
    uint64_t seen_ids[] = {id1, 999, id2, UINT64_MAX};
    int64_t seen_ms[] = {c.created_unix_ms + 5000, 1, c.created_unix_ms - 7000, 2};
    CU_ASSERT_EQUAL(strata_store_clients_seen(s, seen_ids, seen_ms, 4, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id1, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(c.last_seen_unix_ms, seen_ms[0]);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id2, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(c.last_seen_unix_ms, seen_ms[2]);
    CU_ASSERT_EQUAL(strata_store_client_get(s, 999, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(strata_store_clients_seen(s, NULL, seen_ms, 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_clients_seen(s, seen_ids, NULL, 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_clients_seen(s, NULL, NULL, 0, &d), STRATA_OK);

    /* Bad arguments change nothing. */
    char longname[STRATA_STORE_NAME_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, longname, NULL, &id, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, "a\nb", NULL, &id, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, "a\x7f", NULL, &id, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(s, NULL, NULL, NULL, &id, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, NULL, NULL, NULL, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_add(NULL, h3, NULL, NULL, &id, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_registration_find(s, NULL, &got, &found, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_registration_find(s, "x", NULL, &found, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id1, NULL, &found, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_count(s, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_count(NULL, &n, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 5);
    /* The longest name is accepted. */
    longname[STRATA_STORE_NAME_MAX] = '\0';
    CU_ASSERT_EQUAL(strata_store_client_add(s, h3, longname, NULL, &id, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(c.name, longname);

    /* A secondary connection sees the same clients; all of it survives
     * closing and reopening. */
    strata_store *sec = fx_secondary(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sec);
    CU_ASSERT_STRING_EQUAL(strata_store_backend(sec), F.b->name);
    CU_ASSERT_EQUAL(strata_store_client_get(sec, r1, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT(memcmp(c.token_hash, h5, 32) == 0);
    CU_ASSERT_EQUAL(strata_store_client_count(sec, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 6);
    s = fx_reopen(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_client_count(s, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 6);
    CU_ASSERT_EQUAL(strata_store_client_get(s, id1, &c, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_STRING_EQUAL(c.name, "edge-1");
    CU_ASSERT(memcmp(c.token_hash, h1, 32) == 0);
    CU_ASSERT_EQUAL(c.last_seen_unix_ms, seen_ms[0]);
    CU_ASSERT_EQUAL(strata_store_registration_find(s, "reg-aaaaaaaaaaaa", &got, &found, &d),
                    STRATA_OK);
    CU_ASSERT(found == 1 && got == r1);
    /* Ids are never reused. */
    uint8_t h7[32];
    token_hash(7, h7);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h7, NULL, NULL, &id2, NULL, &d), STRATA_OK);
    CU_ASSERT(id2 > id);
}

/* ---- Rounds ------------------------------------------------------------- */

static void test_rounds(void)
{
    FRESH_STORE(s);
    strata_diag d;
    uint64_t ids[3];
    add_clients(s, 3, ids);

    uint32_t last = 9;
    int found = 1;
    CU_ASSERT_EQUAL(strata_store_last_round(s, &last, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(last, 0);

    uint64_t sel[2] = {ids[2], ids[0]};
    CU_ASSERT_EQUAL(strata_store_round_open(s, 1, 5, sel, 2, 123456789, "{\"density\":0.01}", &d),
                    STRATA_OK);
    strata_store_round r;
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(found, 1);
    CU_ASSERT_EQUAL(r.round, 1);
    CU_ASSERT_EQUAL(r.model_version, 5);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_OPEN);
    CU_ASSERT_EQUAL(r.deadline_unix_ms, 123456789);
    CU_ASSERT(r.opened_unix_ms > 0);
    CU_ASSERT_EQUAL(r.closed_unix_ms, 0);
    CU_ASSERT_EQUAL_FATAL(r.n_selected, 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r.selected);
    CU_ASSERT_EQUAL(r.selected[0], ids[0]); /* ascending */
    CU_ASSERT_EQUAL(r.selected[1], ids[2]);
    CU_ASSERT_STRING_EQUAL(r.task_json, "{\"density\":0.01}");
    CU_ASSERT_PTR_NULL(r.summary_json);
    CU_ASSERT_EQUAL(r.n_updates, 0);
    strata_store_round_cleanup(&r);
    CU_ASSERT_PTR_NULL(r.selected);
    strata_store_round_cleanup(NULL);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 2, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_PTR_NULL(r.selected);

    /* The same round again, or another while one is open: wrong state. */
    CU_ASSERT_EQUAL(strata_store_round_open(s, 1, 5, sel, 2, 0, NULL, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, sel, 2, 0, NULL, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "still open") != NULL);

    /* Closing: invalid JSON changes nothing; then close, close again. */
    CU_ASSERT_EQUAL(strata_store_round_close(s, 1, "{not json", &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_OPEN);
    strata_store_round_cleanup(&r);
    const char *summary = "{\"accuracy\":0.8,\"participants\":2}";
    CU_ASSERT_EQUAL(strata_store_round_close(s, 1, summary, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 1, summary, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "already closed") != NULL);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 7, NULL, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "no such round") != NULL);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_CLOSED);
    CU_ASSERT_STRING_EQUAL(r.summary_json, summary);
    CU_ASSERT(r.closed_unix_ms >= r.opened_unix_ms);
    strata_store_round_cleanup(&r);

    /* Selection errors, invalid task JSON and a too large model version
     * leave no round behind. */
    uint64_t unknown[2] = {ids[0], 999};
    uint64_t huge[1] = {UINT64_MAX};
    uint64_t twice[3] = {ids[1], ids[0], ids[1]};
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, unknown, 2, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT(strstr(d.msg, "not registered") != NULL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, huge, 1, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, twice, 3, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, sel, 0, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, NULL, 2, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, sel, 2, 0, "[1,", &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, UINT64_MAX, sel, 2, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_open(NULL, 2, 6, sel, 2, 0, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 2, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(strata_store_last_round(s, &last, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(last, 1);

    CU_ASSERT_EQUAL(strata_store_round_open(s, 2, 6, ids, 3, 0, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 2, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 2, &r, &found, &d), STRATA_OK);
    CU_ASSERT_PTR_NULL(r.task_json);
    CU_ASSERT_PTR_NULL(r.summary_json);
    CU_ASSERT_EQUAL(r.n_selected, 3);
    strata_store_round_cleanup(&r);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 4, 7, ids, 1, 0, NULL, &d), STRATA_OK);
    /* Rounds only move forward. */
    CU_ASSERT_EQUAL(strata_store_round_close(s, 4, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 3, 7, ids, 1, 0, NULL, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 4, 7, ids, 1, 0, NULL, &d), STRATA_ESTATE);

    CU_ASSERT_EQUAL(strata_store_last_round(s, &last, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(last, 4);

    strata_store_round *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_round_list(s, 0, 10, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 3);
    CU_ASSERT_EQUAL(list[0].round, 1);
    CU_ASSERT_EQUAL(list[1].round, 2);
    CU_ASSERT_EQUAL(list[2].round, 4);
    CU_ASSERT_EQUAL(list[0].model_version, 5);
    CU_ASSERT_EQUAL(list[0].n_selected, 2);
    CU_ASSERT_EQUAL(list[1].n_selected, 3);
    CU_ASSERT_EQUAL(list[2].n_selected, 1);
    CU_ASSERT_PTR_NULL(list[0].selected);
    CU_ASSERT_STRING_EQUAL(list[0].summary_json, summary);
    CU_ASSERT_STRING_EQUAL(list[0].task_json, "{\"density\":0.01}");
    CU_ASSERT_EQUAL(list[0].state, STRATA_STORE_ROUND_CLOSED);
    strata_store_round_list_free(list, n);
    /* Paging. */
    CU_ASSERT_EQUAL(strata_store_round_list(s, 0, 2, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT_EQUAL(list[1].round, 2);
    strata_store_round_list_free(list, n);
    CU_ASSERT_EQUAL(strata_store_round_list(s, 3, 2, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 1);
    CU_ASSERT_EQUAL(list[0].round, 4);
    strata_store_round_list_free(list, n);
    CU_ASSERT_EQUAL(strata_store_round_list(s, 5, 2, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT_PTR_NULL(list);
    CU_ASSERT_EQUAL(strata_store_round_list(s, 0, 0, &list, &n, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_list(s, 0, 1, NULL, &n, &d), STRATA_EINVAL);
    strata_store_round_list_free(NULL, 0);

    /* Rounds survive reopening. */
    s = fx_reopen(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_CLOSED);
    CU_ASSERT_EQUAL(r.model_version, 5);
    CU_ASSERT_EQUAL(r.deadline_unix_ms, 123456789);
    CU_ASSERT_EQUAL_FATAL(r.n_selected, 2);
    CU_ASSERT(r.selected[0] == ids[0] && r.selected[1] == ids[2]);
    CU_ASSERT_STRING_EQUAL(r.summary_json, summary);
    strata_store_round_cleanup(&r);
    CU_ASSERT_EQUAL(strata_store_last_round(s, &last, &found, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(last, 4);
    /* The next round opens above the last one. */
    CU_ASSERT_EQUAL(strata_store_round_open(s, 5, 8, ids, 2, 0, "{}", &d), STRATA_OK);
}

/* ---- Updates: outcomes of one update, by every way to store it ---------- */

enum { OP_STORE, OP_CLOSE, OP_OPEN };

/* One step of test_update_outcomes. Clients are indices into the case's
 * ids; receipt_of is the step whose receipt this one must return (itself for
 * a newly accepted update), -1 for a refusal (a zero receipt). */
typedef struct outcome_step {
    int op;
    uint32_t round;
    int client;
    const char *bytes;
    size_t len; /* of bytes; 0: strlen(bytes) */
    uint64_t samples;
    int rc;
    strata_store_verdict verdict;
    int receipt_of;
    const char *msg; /* in the diagnostic of put and commit, or NULL */
} outcome_step;

/* Round 1 selects clients 0, 1 and 3; client 2 is registered but not
 * selected; client 4 is an id nobody has. */
static const outcome_step OUTCOME_STEPS[] = {
    {OP_STORE, 1, 0, "abc", 0, 10, STRATA_OK, STRATA_STORE_ACCEPTED, 0, NULL},
    /* A byte-identical repeat (even with another sample count): the
     * original receipt. */
    {OP_STORE, 1, 0, "abc", 0, 99, STRATA_OK, STRATA_STORE_DUPLICATE, 0, NULL},
    /* Other bytes: a conflict; the stored update is kept. */
    {OP_STORE, 1, 0, "abcd", 0, 10, STRATA_ESTATE, STRATA_STORE_REJECT_CONFLICT, -1,
     "other content"},
    {OP_STORE, 1, 2, "abc", 0, 10, STRATA_ESTATE, STRATA_STORE_REJECT_NOT_SELECTED, -1,
     "not selected"},
    {OP_STORE, 1, 4, "abc", 0, 10, STRATA_ESTATE, STRATA_STORE_REJECT_NOT_SELECTED, -1,
     "not selected"},
    {OP_STORE, 9, 1, "abc", 0, 10, STRATA_ESTATE, STRATA_STORE_REJECT_UNKNOWN_ROUND, -1,
     "does not exist"},
    {OP_STORE, 1, 1, "xyz\0\xff", 5, 7, STRATA_OK, STRATA_STORE_ACCEPTED, 6, NULL},
    {OP_CLOSE, 1, 0, NULL, 0, 0, 0, 0, 0, NULL},
    /* A closed round takes no new update ... */
    {OP_STORE, 1, 3, "abc", 0, 10, STRATA_ESTATE, STRATA_STORE_REJECT_ROUND_CLOSED, -1, "closed"},
    /* ... but a retry whose answer was lost still gets its receipt, and
     * other bytes are still a conflict. */
    {OP_STORE, 1, 0, "abc", 0, 10, STRATA_OK, STRATA_STORE_DUPLICATE, 0, NULL},
    {OP_STORE, 1, 1, "xyz\0\xff", 5, 1, STRATA_OK, STRATA_STORE_DUPLICATE, 6, NULL},
    {OP_STORE, 1, 1, "xyz", 0, 7, STRATA_ESTATE, STRATA_STORE_REJECT_CONFLICT, -1, "other content"},
    {OP_OPEN, 2, 0, NULL, 0, 0, 0, 0, 0, NULL},
    /* The same bytes in the next round are a new update. */
    {OP_STORE, 2, 0, "abc", 0, 3, STRATA_OK, STRATA_STORE_ACCEPTED, 13, NULL},
    {OP_STORE, 1, 3, "abc", 0, 10, STRATA_ESTATE, STRATA_STORE_REJECT_ROUND_CLOSED, -1, "closed"},
};

#define N_OUTCOME_STEPS (sizeof(OUTCOME_STEPS) / sizeof(OUTCOME_STEPS[0]))

static size_t step_len(const outcome_step *st)
{
    return st->len != 0 ? st->len : strlen(st->bytes);
}

/* Runs OUTCOME_STEPS on a fresh store with `how`. */
static void run_outcomes(via how)
{
    fixture f;
    fx_fresh(&f, F.b);
    strata_store *s = f.s;
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    strata_diag d;
    uint64_t ids[5];
    add_clients(s, 4, ids);
    ids[4] = ids[3] + 1000;
    uint64_t sel[3] = {ids[0], ids[1], ids[3]};
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, sel, 3, 0, NULL, &d), STRATA_OK);

    strata_store_receipt got[N_OUTCOME_STEPS];
    memset(got, 0, sizeof(got));
    for (size_t i = 0; i < N_OUTCOME_STEPS; i++) {
        const outcome_step *st = &OUTCOME_STEPS[i];
        if (st->op == OP_CLOSE) {
            CU_ASSERT_EQUAL_FATAL(strata_store_round_close(s, st->round, NULL, &d), STRATA_OK);
            continue;
        }
        if (st->op == OP_OPEN) {
            CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, st->round, 1, ids, 4, 0, NULL, &d),
                                  STRATA_OK);
            continue;
        }
        size_t len = step_len(st);
        strata_store_verdict v = (strata_store_verdict)99;
        strata_store_receipt *r = &got[i];
        memset(r, 0x5a, sizeof(*r)); /* must be overwritten */
        d.msg[0] = '\0';
        int rc =
            store_via(s, how, st->round, ids[st->client], st->bytes, len, st->samples, r, &v, &d);
        if (rc != st->rc || v != st->verdict)
            fprintf(stderr, "\n    %s, step %zu: rc %d verdict %d, want %d and %d (%s)\n",
                    VIA_NAME[how], i, rc, (int)v, st->rc, (int)st->verdict, d.msg);
        CU_ASSERT_EQUAL(rc, st->rc);
        CU_ASSERT_EQUAL(v, st->verdict);
        if (st->msg != NULL && how != VIA_COMMIT_MANY)
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, st->msg));
        if (st->receipt_of < 0) {
            CU_ASSERT(receipt_is_zero(r));
            continue;
        }
        if (st->receipt_of == (int)i) { /* a new update */
            uint8_t h[STRATA_STORE_HASH_LEN];
            strata_sha256(st->bytes, len, h);
            CU_ASSERT_EQUAL(r->duplicate, 0);
            CU_ASSERT_EQUAL(r->bytes, len);
            CU_ASSERT_EQUAL(r->samples, st->samples);
            CU_ASSERT(r->received_unix_ms > 0);
            CU_ASSERT(receipt_id_ok(r->id));
            CU_ASSERT(memcmp(r->sha256, h, sizeof(h)) == 0);
            for (size_t k = 0; k < i; k++)
                if (OUTCOME_STEPS[k].op == OP_STORE && OUTCOME_STEPS[k].receipt_of == (int)k)
                    CU_ASSERT_STRING_NOT_EQUAL(got[k].id, r->id);
            continue;
        }
        const strata_store_receipt *o = &got[st->receipt_of];
        CU_ASSERT_EQUAL(r->duplicate, 1);
        CU_ASSERT_STRING_EQUAL(r->id, o->id);
        CU_ASSERT(memcmp(r->sha256, o->sha256, sizeof(o->sha256)) == 0);
        CU_ASSERT_EQUAL(r->bytes, o->bytes);
        CU_ASSERT_EQUAL(r->samples, o->samples);
        CU_ASSERT_EQUAL(r->received_unix_ms, o->received_unix_ms);
    }
    char shahex[65];
    hex(got[0].sha256, 32, shahex);
    CU_ASSERT_STRING_EQUAL(shahex,
                           "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

    /* What is stored: the accepted updates, in acceptance order, with their
     * receipts and bytes; the same after reopening (durable). */
    for (int pass = 0; pass < 2; pass++) {
        strata_store_update *list = NULL;
        size_t n = 0;
        CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(n, 2);
        const int want[2] = {0, 6};
        for (size_t k = 0; k < 2; k++) {
            const strata_store_receipt *o = &got[want[k]];
            CU_ASSERT_EQUAL(list[k].round, 1);
            CU_ASSERT_EQUAL(list[k].client_id, ids[OUTCOME_STEPS[want[k]].client]);
            CU_ASSERT_STRING_EQUAL(list[k].receipt.id, o->id);
            CU_ASSERT(memcmp(list[k].receipt.sha256, o->sha256, 32) == 0);
            CU_ASSERT_EQUAL(list[k].receipt.bytes, o->bytes);
            CU_ASSERT_EQUAL(list[k].receipt.samples, o->samples);
            CU_ASSERT_EQUAL(list[k].receipt.received_unix_ms, o->received_unix_ms);
            CU_ASSERT_EQUAL(list[k].receipt.duplicate, 0);
        }
        strata_store_update_list_free(list, n);
        CU_ASSERT(reads_back(s, 1, ids[0], "abc", 3));
        CU_ASSERT(reads_back(s, 1, ids[1], "xyz\0\xff", 5));
        CU_ASSERT(reads_back(s, 2, ids[0], "abc", 3));
        CU_ASSERT_EQUAL(count_updates(s, 2), 1);
        strata_store_round r;
        int found = 0;
        CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
        CU_ASSERT_EQUAL(r.n_updates, 2);
        strata_store_round_cleanup(&r);
        /* Refused updates left nothing to read. */
        uint8_t *buf = NULL;
        size_t len = 9;
        CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[3], &buf, &len, &d), STRATA_ESTATE);
        CU_ASSERT(buf == NULL && len == 0);
        CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[2], &buf, &len, &d), STRATA_ESTATE);
        CU_ASSERT_EQUAL(strata_store_update_read(s, 9, ids[1], &buf, &len, &d), STRATA_ESTATE);
        CU_ASSERT_EQUAL(count_updates(s, 9), 0);
        if (pass == 0) {
            s = fx_reopen(&f);
            CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        }
    }
    fx_remove(&f);
}

static void test_update_outcomes(void)
{
    for (via how = VIA_PUT; how <= VIA_COMMIT_MANY; how++)
        run_outcomes(how);
}

/* ---- Updates: arguments ------------------------------------------------- */

static void test_update_arguments(void)
{
    FRESH_STORE(s);
    strata_diag d;
    uint64_t ids[2];
    add_clients(s, 2, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 2, 0, NULL, &d), STRATA_OK);
    const uint8_t abc[3] = {'a', 'b', 'c'};
    strata_store_receipt r;
    strata_store_verdict v;

    /* Bad arguments are EINVAL with verdict ACCEPTED's 0, for put and for
     * prepare (whose *out is then NULL). */
    static const struct {
        int payload_null;
        size_t len;
        uint64_t samples;
    } bad[] = {
        {0, 0, 10},
        {0, 3, 0},
        {1, 3, 1},
        {0, 3, (uint64_t)INT64_MAX + 1},
        {0, STRATA_STORE_PAYLOAD_MAX + 1, 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const uint8_t *p = bad[i].payload_null ? NULL : abc;
        v = (strata_store_verdict)99;
        CU_ASSERT_EQUAL(
            strata_store_update_put(s, 1, ids[1], p, bad[i].len, bad[i].samples, &r, &v, &d),
            STRATA_EINVAL);
        CU_ASSERT_EQUAL(v, STRATA_STORE_ACCEPTED);
        CU_ASSERT(receipt_is_zero(&r));
        strata_store_pending *pend = (strata_store_pending *)&d; /* must be reset to NULL */
        CU_ASSERT_EQUAL(
            strata_store_update_prepare(s, 1, ids[1], p, bad[i].len, bad[i].samples, &pend, &d),
            STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(pend);
    }
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[1], abc, 3, 1, NULL, &v, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_put(NULL, 1, ids[1], abc, 3, 1, &r, &v, &d), STRATA_EINVAL);
    strata_store_pending *p = NULL;
    CU_ASSERT_EQUAL(strata_store_update_prepare(NULL, 1, ids[1], abc, 3, 1, &p, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_prepare(s, 1, ids[1], abc, 3, 1, NULL, &d), STRATA_EINVAL);
    /* A client id that no store can hold: put refuses it as not selected,
     * prepare as a bad argument. */
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, UINT64_MAX, abc, 3, 1, &r, &v, &d),
                    STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_NOT_SELECTED);
    CU_ASSERT_EQUAL(strata_store_update_prepare(s, 1, UINT64_MAX, abc, 3, 1, &p, &d),
                    STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(p);

    /* Commits take ownership of the prepared update in every case. */
    CU_ASSERT_EQUAL(strata_store_update_commit(s, NULL, &r, &v, &d), STRATA_EINVAL);
    p = prepare(s, 1, ids[1], "abc", 1);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, NULL, &v, &d), STRATA_EINVAL);
    p = prepare(s, 1, ids[1], "abc", 1);
    CU_ASSERT_EQUAL(strata_store_update_commit(NULL, p, &r, &v, &d), STRATA_EINVAL);
    strata_store_pending_free(NULL);
    p = prepare(s, 1, ids[1], "abc", 1);
    strata_store_pending_free(p); /* discarded */

    /* Group commits: n == 0 does nothing; a NULL array fails the batch and
     * frees its items; a NULL item fails the whole batch and frees the
     * others. */
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, NULL, 0, NULL, NULL, NULL, &d), STRATA_OK);
    strata_store_pending *batch[3];
    strata_store_receipt rec[3];
    strata_store_verdict ver[3];
    int res[3] = {7, 7, 7};
    batch[0] = prepare(s, 1, ids[0], "zero", 1);
    batch[1] = prepare(s, 1, ids[1], "one", 1);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, batch, 2, rec, ver, NULL, &d),
                    STRATA_EINVAL);
    batch[0] = prepare(s, 1, ids[0], "zero", 1);
    batch[1] = prepare(s, 1, ids[1], "one", 1);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, batch, 2, NULL, ver, res, &d),
                    STRATA_EINVAL);
    CU_ASSERT(res[0] == STRATA_EINVAL && res[1] == STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, NULL, 2, rec, ver, res, &d), STRATA_EINVAL);
    batch[0] = prepare(s, 1, ids[0], "zero", 1);
    batch[1] = NULL;
    batch[2] = prepare(s, 1, ids[1], "one", 1);
    res[0] = res[1] = res[2] = 7;
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, batch, 3, rec, ver, res, &d), STRATA_EINVAL);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(res[i], STRATA_EINVAL);
        CU_ASSERT_EQUAL(ver[i], STRATA_STORE_ACCEPTED);
        CU_ASSERT(receipt_is_zero(&rec[i]));
    }
    CU_ASSERT_EQUAL(strata_store_update_commit_many(NULL, batch, 0, rec, ver, res, &d), STRATA_OK);

    /* Reads and lists. */
    uint8_t *buf = (uint8_t *)&d;
    size_t len = 9;
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[0], NULL, &len, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[0], &buf, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(buf);
    CU_ASSERT_EQUAL(strata_store_update_read(NULL, 1, ids[0], &buf, &len, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, UINT64_MAX, &buf, &len, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(len, 0);
    strata_store_update *list = NULL;
    size_t n = 9;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, NULL, &n, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_update_list(NULL, 1, &list, &n, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(n, 0);
    strata_store_update_list_free(NULL, 0);

    /* None of it stored anything. */
    CU_ASSERT_EQUAL(count_updates(s, 1), 0);
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[0], &buf, &len, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[1], &buf, &len, &d), STRATA_ESTATE);
}

/* ---- Updates: prepare, then commit -------------------------------------- */

static void test_prepare_then_commit(void)
{
    FRESH_STORE(s);
    strata_diag d;
    uint64_t ids[2];
    add_clients(s, 2, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 2, 0, NULL, &d), STRATA_OK);

    /* Prepared: nothing is visible, on this connection or another. */
    strata_store *sec = fx_secondary(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sec);
    strata_store_pending *p = prepare(s, 1, ids[0], "abc", 10);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(count_updates(s, 1), 0);
    CU_ASSERT_EQUAL(count_updates(sec, 1), 0);
    uint8_t *buf = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(strata_store_update_read(s, 1, ids[0], &buf, &len, &d), STRATA_ESTATE);
    strata_store_round r;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.n_updates, 0);
    strata_store_round_cleanup(&r);

    /* Committed: visible to both. */
    strata_store_receipt r1, r2;
    strata_store_verdict v = (strata_store_verdict)99;
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r1, &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_ACCEPTED);
    CU_ASSERT_EQUAL(count_updates(sec, 1), 1);
    CU_ASSERT(reads_back(sec, 1, ids[0], "abc", 3));

    /* Discarding a prepared update stores nothing. */
    p = prepare(s, 1, ids[1], "discarded", 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    strata_store_pending_free(p);
    CU_ASSERT_EQUAL(count_updates(s, 1), 1);

    /* The round closes between prepare and commit: the commit decides, and
     * refuses. */
    p = prepare(s, 1, ids[1], "late", 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_store_round_close(sec, 1, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r2, NULL, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "closed") != NULL);
    CU_ASSERT(receipt_is_zero(&r2));
    CU_ASSERT_EQUAL(count_updates(s, 1), 1);

    /* Another connection stores the update between prepare and commit: the
     * commit is a duplicate, with that connection's receipt. */
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 2, 1, ids, 2, 0, NULL, &d), STRATA_OK);
    p = prepare(s, 2, ids[1], "raced", 4);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(
        strata_store_update_put(sec, 2, ids[1], (const uint8_t *)"raced", 5, 3, &r1, &v, &d),
        STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_ACCEPTED);
    CU_ASSERT_EQUAL(strata_store_update_commit(s, p, &r2, &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_DUPLICATE);
    CU_ASSERT_STRING_EQUAL(r2.id, r1.id);
    CU_ASSERT_EQUAL(r2.samples, 3);
    CU_ASSERT_EQUAL(count_updates(s, 2), 1);
}

/* ---- Updates: group commits --------------------------------------------- */

static void test_commit_many(void)
{
    FRESH_STORE(s);
    strata_diag d;
    uint64_t ids[8];
    add_clients(s, 8, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 7, 0, NULL, &d), STRATA_OK);
    strata_store_receipt before;
    CU_ASSERT_EQUAL_FATAL(
        strata_store_update_put(s, 1, ids[6], (const uint8_t *)"early", 5, 6, &before, NULL, &d),
        STRATA_OK);

    /* A batch: five new updates; a second one of client 0 with other bytes
     * (a conflict with the first in the same batch) and one of client 1
     * with the same bytes (a duplicate of the first in the same batch); an
     * unselected client; a byte-identical repeat of a client stored before
     * the batch; a round that does not exist. */
    static const struct {
        const char *text;
        int who; /* index into ids */
        uint32_t round;
        int rc;
        strata_store_verdict verdict;
    } items[] = {
        {"u0", 0, 1, STRATA_OK, STRATA_STORE_ACCEPTED},
        {"u1", 1, 1, STRATA_OK, STRATA_STORE_ACCEPTED},
        {"u2", 2, 1, STRATA_OK, STRATA_STORE_ACCEPTED},
        {"u0 again", 0, 1, STRATA_ESTATE, STRATA_STORE_REJECT_CONFLICT},
        {"u1", 1, 1, STRATA_OK, STRATA_STORE_DUPLICATE}, /* of item 1 */
        {"x7", 7, 1, STRATA_ESTATE, STRATA_STORE_REJECT_NOT_SELECTED},
        {"u3", 3, 1, STRATA_OK, STRATA_STORE_ACCEPTED},
        {"u4", 4, 1, STRATA_OK, STRATA_STORE_ACCEPTED},
        {"early", 6, 1, STRATA_OK, STRATA_STORE_DUPLICATE}, /* of the earlier put */
        {"r9", 5, 9, STRATA_ESTATE, STRATA_STORE_REJECT_UNKNOWN_ROUND},
        {"u5", 5, 1, STRATA_OK, STRATA_STORE_ACCEPTED},
    };
    enum { N = sizeof(items) / sizeof(items[0]) };
    strata_store_pending *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = prepare(s, items[i].round, ids[items[i].who], items[i].text, (uint64_t)i + 1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p[i]);
    }
    strata_store_receipt rec[N];
    strata_store_verdict ver[N];
    int res[N];
    memset(rec, 0x5a, sizeof(rec));
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, N, rec, ver, res, &d), STRATA_OK);
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(res[i], items[i].rc);
        CU_ASSERT_EQUAL(ver[i], items[i].verdict);
        if (items[i].rc != STRATA_OK) {
            CU_ASSERT(receipt_is_zero(&rec[i]));
        } else if (items[i].verdict == STRATA_STORE_ACCEPTED) {
            CU_ASSERT_EQUAL(rec[i].duplicate, 0);
            CU_ASSERT_EQUAL(rec[i].bytes, strlen(items[i].text));
            CU_ASSERT_EQUAL(rec[i].samples, (uint64_t)i + 1);
            CU_ASSERT(rec[i].received_unix_ms > 0);
            CU_ASSERT(receipt_id_ok(rec[i].id));
        }
    }
    /* The duplicates carry the original receipts: the earlier item's ... */
    CU_ASSERT_EQUAL(rec[4].duplicate, 1);
    CU_ASSERT_STRING_EQUAL(rec[4].id, rec[1].id);
    CU_ASSERT_EQUAL(rec[4].samples, 2);
    CU_ASSERT_EQUAL(rec[4].received_unix_ms, rec[1].received_unix_ms);
    /* ... and the one stored before the batch. */
    CU_ASSERT_EQUAL(rec[8].duplicate, 1);
    CU_ASSERT_STRING_EQUAL(rec[8].id, before.id);
    CU_ASSERT_EQUAL(rec[8].samples, 6);
    CU_ASSERT_EQUAL(rec[8].received_unix_ms, before.received_unix_ms);

    /* Seven rows: the earlier one, then the accepted items in batch order. */
    const int order[] = {0, 1, 2, 6, 7, 10};
    strata_store_update *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 7);
    CU_ASSERT_EQUAL(list[0].client_id, ids[6]);
    CU_ASSERT_STRING_EQUAL(list[0].receipt.id, before.id);
    for (int k = 0; k < 6; k++) {
        int i = order[k];
        CU_ASSERT_EQUAL(list[k + 1].client_id, ids[items[i].who]);
        CU_ASSERT_STRING_EQUAL(list[k + 1].receipt.id, rec[i].id);
        CU_ASSERT_EQUAL(list[k + 1].receipt.samples, rec[i].samples);
        CU_ASSERT(reads_back(s, 1, ids[items[i].who], items[i].text, strlen(items[i].text)));
    }
    strata_store_update_list_free(list, n);
    CU_ASSERT(reads_back(s, 1, ids[6], "early", 5));
    CU_ASSERT_EQUAL(count_updates(s, 9), 0);

    /* A batch that fails as a whole commits nothing: then both items upload
     * again normally. */
    CU_ASSERT_EQUAL_FATAL(strata_store_round_close(s, 1, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 2, 1, ids, 8, 0, NULL, &d), STRATA_OK);
    p[0] = prepare(s, 2, ids[5], "five", 5);
    p[1] = NULL;
    p[2] = prepare(s, 2, ids[7], "seven", 7);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 3, rec, ver, res, &d), STRATA_EINVAL);
    CU_ASSERT(res[0] == STRATA_EINVAL && res[1] == STRATA_EINVAL && res[2] == STRATA_EINVAL);
    CU_ASSERT_EQUAL(count_updates(s, 2), 0);
    p[0] = prepare(s, 2, ids[5], "five", 5);
    p[1] = prepare(s, 2, ids[7], "seven", 7);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 2, rec, ver, res, &d), STRATA_OK);
    CU_ASSERT(res[0] == STRATA_OK && res[1] == STRATA_OK);
    CU_ASSERT(ver[0] == STRATA_STORE_ACCEPTED && ver[1] == STRATA_STORE_ACCEPTED);
    CU_ASSERT_EQUAL(count_updates(s, 2), 2);

    /* A batch of refusals only commits nothing and says so per item. */
    p[0] = prepare(s, 1, ids[7], "closed", 1);
    p[1] = prepare(s, 2, ids[7], "other", 1);
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 2, rec, ver, res, &d), STRATA_OK);
    CU_ASSERT(res[0] == STRATA_ESTATE && ver[0] == STRATA_STORE_REJECT_ROUND_CLOSED);
    CU_ASSERT(res[1] == STRATA_ESTATE && ver[1] == STRATA_STORE_REJECT_CONFLICT);
    CU_ASSERT_EQUAL(count_updates(s, 2), 2);

    /* The batch survives reopening. */
    s = fx_reopen(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(count_updates(s, 1), 7);
    CU_ASSERT(reads_back(s, 2, ids[7], "seven", 5));
}

/* ---- Updates: the list's order and the bytes ---------------------------- */

static void test_list_order(void)
{
    FRESH_STORE(s);
    strata_diag d;
    uint64_t ids[6];
    add_clients(s, 6, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 6, 0, NULL, &d), STRATA_OK);
    strata_store *sec = fx_secondary(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sec);

    /* Accepted in this order, by puts, a group commit, a single commit and
     * another connection; ids ascend, so the order is not theirs. */
    const int order[6] = {5, 3, 1, 4, 0, 2};
    strata_store_receipt r;
    for (int k = 0; k < 3; k++) {
        size_t len;
        uint8_t *data = payload_of(1, ids[order[k]], &len);
        CU_ASSERT_EQUAL(
            strata_store_update_put(s, 1, ids[order[k]], data, len, (uint64_t)k + 1, &r, NULL, &d),
            STRATA_OK);
        free(data);
    }
    strata_store_pending *p[2];
    for (int k = 3; k < 5; k++) {
        size_t len;
        uint8_t *data = payload_of(1, ids[order[k]], &len);
        p[k - 3] = prepare_bytes(s, 1, ids[order[k]], data, len, (uint64_t)k + 1);
        free(data);
    }
    strata_store_receipt rec[2];
    strata_store_verdict ver[2];
    int res[2];
    CU_ASSERT_EQUAL(strata_store_update_commit_many(s, p, 2, rec, ver, res, &d), STRATA_OK);
    size_t len;
    uint8_t *data = payload_of(1, ids[order[5]], &len);
    CU_ASSERT_EQUAL(strata_store_update_put(sec, 1, ids[order[5]], data, len, 6, &r, NULL, &d),
                    STRATA_OK);
    free(data);
    /* A duplicate does not move its update. */
    data = payload_of(1, ids[order[0]], &len);
    CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[order[0]], data, len, 1, &r, NULL, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(r.duplicate, 1);
    free(data);

    for (int pass = 0; pass < 2; pass++) {
        strata_store_update *list = NULL;
        size_t n = 0;
        CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, &d), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(n, 6);
        for (int k = 0; k < 6; k++) {
            CU_ASSERT_EQUAL(list[k].client_id, ids[order[k]]);
            CU_ASSERT_EQUAL(list[k].receipt.samples, (uint64_t)k + 1);
            data = payload_of(1, ids[order[k]], &len);
            CU_ASSERT_EQUAL(list[k].receipt.bytes, len);
            CU_ASSERT(reads_back(s, 1, ids[order[k]], data, len));
            free(data);
        }
        strata_store_update_list_free(list, n);
        if (pass == 0) {
            s = fx_reopen(&F);
            CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        }
    }
    /* From a place in that order: what came after it. */
    for (size_t from = 0; from <= 7; from++) {
        strata_store_update *part = NULL;
        size_t m = 99;
        CU_ASSERT_EQUAL(strata_store_update_list_from(s, 1, from, &part, &m, &d), STRATA_OK);
        CU_ASSERT_EQUAL(m, from < 6 ? 6 - from : 0);
        for (size_t k = 0; k < m; k++)
            CU_ASSERT_EQUAL(part[k].client_id, ids[order[from + k]]);
        strata_store_update_list_free(part, m);
    }
    strata_store_update *bad = NULL;
    size_t nb = 0;
    CU_ASSERT_EQUAL(strata_store_update_list_from(s, 1, SIZE_MAX, &bad, &nb, &d), STRATA_EINVAL);
    /* An unknown round lists nothing. */
    strata_store_update *list = (strata_store_update *)&d;
    size_t n = 9;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 77, &list, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT_PTR_NULL(list);
}

/* Payloads of every size class come back byte for byte: one byte, NULs and
 * 0xff, a page and a byte more, megabytes. */
static void test_payload_bytes(void)
{
    FRESH_STORE(s);
    strata_diag d;
    static const size_t sizes[] = {1, 255, 4096, 16384, 16385, 65537, (1u << 20) + 7, 5u << 20};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    uint64_t ids[NS];
    add_clients(s, NS, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, NS, 0, NULL, &d), STRATA_OK);
    uint8_t *data[NS];
    for (size_t i = 0; i < NS; i++) {
        data[i] = malloc(sizes[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(data[i]);
        for (size_t k = 0; k < sizes[i]; k++) /* zeros, 0xff and the rest */
            data[i][k] = (uint8_t)(i % 3 == 0 ? 0 : i % 3 == 1 ? 0xff - (k & 1) : k * 31 + i);
        strata_store_receipt r;
        CU_ASSERT_EQUAL(strata_store_update_put(s, 1, ids[i], data[i], sizes[i], 1, &r, NULL, &d),
                        STRATA_OK);
        CU_ASSERT_EQUAL(r.bytes, sizes[i]);
    }
    s = fx_reopen(&F);
    CU_ASSERT_PTR_NOT_NULL(s);
    for (size_t i = 0; i < NS; i++) {
        if (s != NULL)
            CU_ASSERT(reads_back(s, 1, ids[i], data[i], sizes[i]));
        free(data[i]);
    }
}

/* ---- Counters ----------------------------------------------------------- */

static void test_counters(void)
{
    FRESH_STORE(s);
    strata_diag d;
    int64_t v = -1;

    CU_ASSERT_EQUAL(strata_store_counter_get(s, "updates_accepted_total", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 0);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "updates_accepted_total", 3, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "updates_accepted_total", -1, &d), STRATA_OK);
    strata_store_counter many[2] = {{"bytes_in_total", 1000},
                                    {"updates_rejected_total{reason=\"shape\"}", 1}};
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, many, 2, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, many, 2, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, NULL, 0, &d), STRATA_OK);
    /* One name twice in one batch adds both. */
    strata_store_counter twice[2] = {{"twice_total", 2}, {"twice_total", 5}};
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, twice, 2, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "twice_total", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 7);

    /* Overflow (either way) and bad names change nothing: a batch is all or
     * nothing. */
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "bytes_in_total", INT64_MAX, &d), STRATA_ETOOBIG);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "low_total", -5, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "low_total", INT64_MIN, &d), STRATA_ETOOBIG);
    strata_store_counter over[2] = {{"bytes_in_total", 5}, {"updates_accepted_total", INT64_MAX}};
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, over, 2, &d), STRATA_ETOOBIG);
    strata_store_counter bad[2] = {{"bytes_in_total", 5}, {"has space", 1}};
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, bad, 2, &d), STRATA_EINVAL);
    strata_store_counter empty[2] = {{"bytes_in_total", 5}, {"", 1}};
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, empty, 2, &d), STRATA_EINVAL);
    strata_store_counter unterminated[1];
    memset(unterminated[0].name, 'a', sizeof(unterminated[0].name));
    unterminated[0].value = 1;
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, unterminated, 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_add_many(s, NULL, 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "", 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, NULL, 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "tab\there", 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "caf\xc3\xa9", 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_add(NULL, "x", 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "", &v, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, NULL, &v, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "x", NULL, &d), STRATA_EINVAL);
    /* Names of up to STRATA_STORE_COUNTER_NAME_MAX bytes. */
    char name[STRATA_STORE_COUNTER_NAME_MAX + 2];
    memset(name, 'n', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    CU_ASSERT_EQUAL(strata_store_counter_add(s, name, 1, &d), STRATA_EINVAL);
    name[STRATA_STORE_COUNTER_NAME_MAX] = '\0';
    CU_ASSERT_EQUAL(strata_store_counter_add(s, name, 11, &d), STRATA_OK);
    /* A counter may reach the limits exactly. */
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "max_total", INT64_MAX, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_add(s, "max_total", 1, &d), STRATA_ETOOBIG);

    /* A secondary connection sees them; they survive reopening. */
    strata_store *sec = fx_secondary(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sec);
    CU_ASSERT_EQUAL(strata_store_counter_get(sec, "bytes_in_total", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 2000);
    s = fx_reopen(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    static const struct {
        const char *name;
        int64_t value;
    } want[] = {
        {"updates_accepted_total", 2},
        {"bytes_in_total", 2000},
        {"updates_rejected_total{reason=\"shape\"}", 2},
        {"twice_total", 7},
        {"low_total", -5},
        {"max_total", INT64_MAX},
        {"never_added_total", 0},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        v = -1;
        CU_ASSERT_EQUAL(strata_store_counter_get(s, want[i].name, &v, &d), STRATA_OK);
        CU_ASSERT_EQUAL(v, want[i].value);
    }
    CU_ASSERT_EQUAL(strata_store_counter_get(s, name, &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 11);
}

/* ---- Checkpoints -------------------------------------------------------- */

static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static void test_checkpoints(void)
{
    FRESH_STORE(s);
    strata_diag d;
    uint64_t ver = 9;
    int found = 1;
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &ver, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(ver, 0);

    char path[4096], want[4096];
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 3, path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_path(strata_store_dir(s), STRATA_STORE_FILE_CHECKPOINT, 3, 0, want,
                                      sizeof(want), &d),
                    STRATA_OK);
    CU_ASSERT_STRING_EQUAL(path, want);
    CU_ASSERT(strstr(path, "/checkpoints/model-3.safetensors") != NULL);
    /* Recording needs the file. */
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 3, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &ver, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(write_file(path, "model", 5), 0);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 3, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 2, path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT_EQUAL(write_file(path, "model", 5), 0);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 2, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 2, &d), STRATA_OK); /* replaces */
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &ver, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(ver, 3);
    char small[4];
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 2, small, sizeof(small), &d), STRATA_ETOOBIG);
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 2, NULL, 10, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(NULL, 2, path, sizeof(path), &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, UINT64_MAX, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, NULL, &found, &d), STRATA_EINVAL);

    s = fx_reopen(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &ver, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(ver, 3);
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 10, path, sizeof(path), &d), STRATA_OK);
    CU_ASSERT_EQUAL(write_file(path, "model", 5), 0);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 10, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_latest_model_version(s, &ver, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(ver, 10);
}

/* ---- Concurrent connections --------------------------------------------- */

#define RACERS 4

typedef struct {
    strata_store *s;
    uint64_t client;
    int fill; /* the payload's bytes */
    int rc;
    strata_store_receipt receipt;
    strata_store_verdict verdict;
} racer;

static pthread_barrier_t race_start;

static void *race_put(void *arg)
{
    racer *r = arg;
    uint8_t payload[256];
    memset(payload, r->fill, sizeof(payload));
    pthread_barrier_wait(&race_start);
    r->rc = strata_store_update_put(r->s, 1, r->client, payload, sizeof(payload), 1, &r->receipt,
                                    &r->verdict, NULL);
    return NULL;
}

/* RACERS connections put an update of the same client at once, all with the
 * same bytes (same = 1) or each with its own. */
static void race(int same)
{
    FRESH_STORE(s);
    uint64_t ids[1];
    add_clients(s, 1, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, 1, 0, NULL, NULL), STRATA_OK);
    racer r[RACERS];
    pthread_t th[RACERS];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < RACERS; i++) {
        r[i].client = ids[0];
        r[i].fill = same ? 7 : 10 + i;
        r[i].s = fx_secondary(&F);
        CU_ASSERT_PTR_NOT_NULL_FATAL(r[i].s);
    }
    CU_ASSERT_EQUAL_FATAL(pthread_barrier_init(&race_start, NULL, RACERS), 0);
    for (int i = 0; i < RACERS; i++)
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, race_put, &r[i]), 0);
    for (int i = 0; i < RACERS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&race_start);

    /* Exactly one accepted; the others got its receipt (same bytes) or a
     * conflict (other bytes); it is stored once, with the winner's bytes. */
    int accepted = -1, n_accepted = 0;
    for (int i = 0; i < RACERS; i++) {
        if (r[i].verdict == STRATA_STORE_ACCEPTED) {
            CU_ASSERT_EQUAL(r[i].rc, STRATA_OK);
            accepted = i;
            n_accepted++;
        } else if (same) {
            CU_ASSERT_EQUAL(r[i].rc, STRATA_OK);
            CU_ASSERT_EQUAL(r[i].verdict, STRATA_STORE_DUPLICATE);
        } else {
            CU_ASSERT_EQUAL(r[i].rc, STRATA_ESTATE);
            CU_ASSERT_EQUAL(r[i].verdict, STRATA_STORE_REJECT_CONFLICT);
        }
    }
    CU_ASSERT_EQUAL_FATAL(n_accepted, 1);
    for (int i = 0; same && i < RACERS; i++)
        CU_ASSERT_STRING_EQUAL(r[i].receipt.id, r[accepted].receipt.id);
    uint8_t want[256];
    memset(want, r[accepted].fill, sizeof(want));
    CU_ASSERT(reads_back(s, 1, ids[0], want, sizeof(want)));
    strata_store_update *list = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 1, &list, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, 1);
    CU_ASSERT_STRING_EQUAL(list[0].receipt.id, r[accepted].receipt.id);
    strata_store_update_list_free(list, n);
}

static void test_concurrent_same_update(void)
{
    race(1);
}

static void test_concurrent_conflicting_updates(void)
{
    race(0);
}

/* Threads prepare updates with the primary store while the main thread
 * commits them in groups on the same store, as a server does when it
 * prepares outside its lock; other threads commit on their own
 * connections meanwhile. */
#define PREP_THREADS 6
#define PREP_EACH 12
#define WRITERS 2
#define WRITER_EACH 10

typedef struct {
    strata_store *s;
    const uint64_t *ids;
    int index;
    pthread_mutex_t *mu;
    strata_store_pending **queue;
    size_t *queued;
    int failures;
} preparer;

static void *prepare_loop(void *arg)
{
    preparer *w = arg;
    for (int k = 0; k < PREP_EACH; k++) {
        int c = w->index * PREP_EACH + k;
        size_t len;
        uint8_t *data = payload_of(1, w->ids[c], &len);
        strata_store_pending *p = NULL;
        if (data == NULL || strata_store_update_prepare(w->s, 1, w->ids[c], data, len,
                                                        (uint64_t)c + 1, &p, NULL) != STRATA_OK)
            w->failures++;
        free(data);
        pthread_mutex_lock(w->mu);
        w->queue[(*w->queued)++] = p; /* NULL on failure, counted above */
        pthread_mutex_unlock(w->mu);
    }
    return NULL;
}

typedef struct {
    strata_store *s;
    const uint64_t *ids; /* WRITER_EACH clients of its own */
    int failures;
} writer;

static void *writer_loop(void *arg)
{
    writer *w = arg;
    for (int k = 0; k < WRITER_EACH; k++) {
        size_t len;
        uint8_t *data = payload_of(1, w->ids[k], &len);
        strata_store_receipt r;
        strata_store_verdict v;
        if (data == NULL ||
            strata_store_update_put(w->s, 1, w->ids[k], data, len, 1, &r, &v, NULL) != STRATA_OK ||
            v != STRATA_STORE_ACCEPTED)
            w->failures++;
        free(data);
    }
    return NULL;
}

static void test_prepare_concurrent_with_commits(void)
{
    enum { PREPARED = PREP_THREADS * PREP_EACH, TOTAL = PREPARED + WRITERS * WRITER_EACH };
    FRESH_STORE(s);
    uint64_t ids[TOTAL];
    add_clients(s, TOTAL, ids);
    CU_ASSERT_EQUAL_FATAL(strata_store_round_open(s, 1, 0, ids, TOTAL, 0, NULL, NULL), STRATA_OK);
    writer wr[WRITERS];
    pthread_t wth[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        wr[i] = (writer){fx_secondary(&F), ids + PREPARED + i * WRITER_EACH, 0};
        CU_ASSERT_PTR_NOT_NULL_FATAL(wr[i].s);
    }
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    strata_store_pending *queue[PREPARED];
    size_t queued = 0, taken = 0, committed = 0, batches = 0;
    preparer w[PREP_THREADS];
    pthread_t th[PREP_THREADS];
    for (int i = 0; i < PREP_THREADS; i++) {
        w[i] = (preparer){s, ids, i, &mu, queue, &queued, 0};
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, prepare_loop, &w[i]), 0);
    }
    for (int i = 0; i < WRITERS; i++)
        CU_ASSERT_EQUAL_FATAL(pthread_create(&wth[i], NULL, writer_loop, &wr[i]), 0);
    strata_store_receipt rec[PREPARED];
    strata_store_verdict ver[PREPARED];
    int res[PREPARED];
    while (taken < PREPARED) {
        strata_store_pending *batch[PREPARED];
        size_t n = 0;
        pthread_mutex_lock(&mu);
        while (taken < queued)
            batch[n++] = queue[taken++];
        pthread_mutex_unlock(&mu);
        if (n == 0) {
            struct timespec ms = {0, 1000 * 1000};
            nanosleep(&ms, NULL);
            continue;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (batch[i] != NULL)
                batch[k++] = batch[i];
        CU_ASSERT_EQUAL(strata_store_update_commit_many(s, batch, k, rec, ver, res, NULL),
                        STRATA_OK);
        for (size_t i = 0; i < k; i++)
            committed += res[i] == STRATA_OK && ver[i] == STRATA_STORE_ACCEPTED;
        batches++;
    }
    for (int i = 0; i < PREP_THREADS; i++) {
        pthread_join(th[i], NULL);
        CU_ASSERT_EQUAL(w[i].failures, 0);
    }
    for (int i = 0; i < WRITERS; i++) {
        pthread_join(wth[i], NULL);
        CU_ASSERT_EQUAL(wr[i].failures, 0);
    }
    CU_ASSERT_EQUAL(committed, PREPARED);
    CU_ASSERT(batches >= 1);
    CU_ASSERT_EQUAL(count_updates(s, 1), TOTAL);
    for (int c = 0; c < TOTAL; c++) {
        size_t len;
        uint8_t *want = payload_of(1, ids[c], &len);
        CU_ASSERT(want != NULL && reads_back(s, 1, ids[c], want, len));
        free(want);
    }
}

/* ---- Recovery after the process is killed ------------------------------- */

#define CRASH_CLIENTS 48
#define CRASH_ROUNDS 10
#define CRASH_SECONDS 4

typedef struct {
    uint64_t client;
    char receipt[STRATA_STORE_RECEIPT_LEN + 1];
    uint8_t sha256[STRATA_STORE_HASH_LEN];
} ack_record;

/* How a child stores its updates: batches of sizes[k % n] in turn (1: a
 * single put, more: a group commit of prepared updates). */
typedef struct {
    const int *sizes;
    size_t n;
} crash_plan;

/* The size of batch k that starts at update `at`. */
static int batch_size(const crash_plan *plan, size_t k, int at)
{
    int size = plan->sizes[k % plan->n];
    return CRASH_CLIENTS - at < size ? CRASH_CLIENTS - at : size;
}

static void ack(int fd, uint64_t client, const strata_store_receipt *r)
{
    ack_record a;
    memset(&a, 0, sizeof(a));
    a.client = client;
    memcpy(a.receipt, r->id, sizeof(a.receipt));
    memcpy(a.sha256, r->sha256, sizeof(a.sha256));
    if (write(fd, &a, sizeof(a)) != (ssize_t)sizeof(a))
        _exit(5);
}

/* The child: opens the store and uploads every client's update for the
 * round in the plan's batches, acknowledging (on fd) each update only after
 * its store call said OK: that is the HTTP 200. Never returns. */
static void crash_child(const char *loc, const crash_plan *plan, uint32_t round,
                        const uint64_t *ids, int fd)
{
    strata_store *s = NULL;
    char *where = (char *)loc;
    if (F.b->open(STORE_REOPEN, &where, NULL, &s, NULL) != STRATA_OK)
        _exit(3);
    int at = 0;
    for (size_t k = 0; at < CRASH_CLIENTS; k++) {
        int n = batch_size(plan, k, at);
        strata_store_pending *p[CRASH_CLIENTS];
        strata_store_receipt r[CRASH_CLIENTS];
        strata_store_verdict v[CRASH_CLIENTS];
        int res[CRASH_CLIENTS];
        for (int i = 0; i < n; i++) {
            size_t len;
            uint8_t *data = payload_of(round, ids[at + i], &len);
            if (data == NULL)
                _exit(4);
            int rc = n == 1 ? strata_store_update_put(s, round, ids[at], data, len,
                                                      (uint64_t)at + 1, &r[0], &v[0], NULL)
                            : strata_store_update_prepare(s, round, ids[at + i], data, len,
                                                          (uint64_t)(at + i) + 1, &p[i], NULL);
            free(data);
            if (rc != STRATA_OK)
                _exit(4);
            res[i] = STRATA_OK;
        }
        if (n > 1 && strata_store_update_commit_many(s, p, (size_t)n, r, v, res, NULL) != STRATA_OK)
            _exit(4);
        for (int i = 0; i < n; i++) {
            if (res[i] != STRATA_OK || v[i] != STRATA_STORE_ACCEPTED)
                _exit(4);
            ack(fd, ids[at + i], &r[i]);
        }
        at += n;
    }
    strata_store_close(s);
    _exit(0);
}

/* Reads acknowledgements into acks[*n, want) until there are `want` or the
 * child closed the pipe; a torn last record is no acknowledgement. *bytes
 * counts the bytes read so far (a record may span two calls). */
static void read_acks(int fd, ack_record *acks, size_t want, size_t *bytes)
{
    uint8_t *raw = (uint8_t *)acks;
    ssize_t k;
    while (*bytes < want * sizeof(*acks) &&
           (k = read(fd, raw + *bytes, want * sizeof(*acks) - *bytes)) != 0) {
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            break;
        *bytes += (size_t)k;
    }
}

/* Kills a child that uploads CRASH_CLIENTS updates as `plan` says at a
 * random moment, several rounds in a row, and checks what a restart finds:
 * every acknowledged update listed exactly once with its receipt and bytes;
 * what is listed is whole batches in the child's order (a commit that did
 * not return is all or nothing); every listed update reads back intact. */
static void crash_run(const crash_plan *plan)
{
    FRESH_STORE(s);
    uint64_t ids[CRASH_CLIENTS];
    add_clients(s, CRASH_CLIENTS, ids);
    fx_close(&F);

    strata_rng rng;
    strata_rng_seed(&rng, (uint64_t)time(NULL), (uint64_t)getpid());
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t total_acked = 0, total_listed = 0, kills = 0;
    for (uint32_t round = 1; round <= CRASH_ROUNDS; round++) {
        s = fx_reopen(&F);
        CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        if (round > 1)
            CU_ASSERT_EQUAL_FATAL(strata_store_round_close(s, round - 1, NULL, NULL), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(
            strata_store_round_open(s, round, round, ids, CRASH_CLIENTS, 0, NULL, NULL), STRATA_OK);
        fx_close(&F); /* the child is the store's one owner */

        int fds[2];
        CU_ASSERT_EQUAL_FATAL(pipe(fds), 0);
        fflush(NULL);
        pid_t pid = fork();
        CU_ASSERT_FATAL(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            crash_child(F.loc, plan, round, ids, fds[1]);
        }
        close(fds[1]);
        /* The kill comes at a random moment of the child's work, whatever
         * the machine's speed: after a random number of acknowledgements
         * (none: possibly before it opened the store), then 0 to 3 ms. */
        ack_record acks[CRASH_CLIENTS];
        size_t bytes = 0;
        read_acks(fds[0], acks, (size_t)strata_rng_below(&rng, CRASH_CLIENTS), &bytes);
        struct timespec delay = {0, (long)strata_rng_below(&rng, 3000) * 1000};
        nanosleep(&delay, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        CU_ASSERT(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));
        kills += WIFSIGNALED(status);
        read_acks(fds[0], acks, CRASH_CLIENTS, &bytes);
        size_t nack = bytes / sizeof(ack_record);
        close(fds[0]);

        /* Restart. */
        s = fx_reopen(&F);
        CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        strata_store_update *list = NULL;
        size_t n = 0;
        CU_ASSERT_EQUAL_FATAL(strata_store_update_list(s, round, &list, &n, NULL), STRATA_OK);
        CU_ASSERT(n >= nack);
        /* Every acknowledged update is there exactly once, with its receipt. */
        for (size_t a = 0; a < nack; a++) {
            int seen = 0;
            for (size_t i = 0; i < n; i++) {
                if (list[i].client_id != acks[a].client)
                    continue;
                seen++;
                CU_ASSERT_STRING_EQUAL(list[i].receipt.id, acks[a].receipt);
                CU_ASSERT(memcmp(list[i].receipt.sha256, acks[a].sha256, 32) == 0);
            }
            CU_ASSERT_EQUAL(seen, 1);
        }
        /* What is listed is the child's first n updates, in its order, and
         * n ends a batch. */
        int at = 0, boundary = n == 0;
        for (size_t k = 0; at < CRASH_CLIENTS && !boundary; k++) {
            at += batch_size(plan, k, at);
            boundary = (size_t)at == n;
        }
        CU_ASSERT(boundary);
        if (!boundary)
            fprintf(stderr, "\n    round %" PRIu32 ": %zu listed, not a whole batch\n", round, n);
        for (size_t i = 0; i < n && i < CRASH_CLIENTS; i++)
            CU_ASSERT_EQUAL(list[i].client_id, ids[i]);
        /* Everything listed (acknowledged or not) has intact bytes. */
        for (size_t i = 0; i < n; i++) {
            size_t want_len, len = 0;
            uint8_t *want = payload_of(round, list[i].client_id, &want_len), *data = NULL;
            CU_ASSERT_EQUAL(
                strata_store_update_read(s, round, list[i].client_id, &data, &len, NULL),
                STRATA_OK);
            uint8_t h[STRATA_STORE_HASH_LEN] = {0};
            if (data != NULL)
                strata_sha256(data, len, h);
            CU_ASSERT(memcmp(h, list[i].receipt.sha256, sizeof(h)) == 0);
            CU_ASSERT_EQUAL(list[i].receipt.bytes, len);
            CU_ASSERT(want != NULL && data != NULL && len == want_len &&
                      memcmp(data, want, len) == 0);
            free(data);
            free(want);
        }
        /* Uploads continue after the restart: the rest of the clients, and
         * a duplicate for those stored. */
        for (int i = 0; i < CRASH_CLIENTS; i++) {
            size_t len;
            uint8_t *p = payload_of(round, ids[i], &len);
            strata_store_receipt r;
            strata_store_verdict v;
            CU_ASSERT_EQUAL(
                strata_store_update_put(s, round, ids[i], p, len, (uint64_t)i + 1, &r, &v, NULL),
                STRATA_OK);
            CU_ASSERT_EQUAL(v, (size_t)i < n ? STRATA_STORE_DUPLICATE : STRATA_STORE_ACCEPTED);
            free(p);
        }
        CU_ASSERT_EQUAL(count_updates(s, round), CRASH_CLIENTS);
        strata_store_update_list_free(list, n);
        total_acked += nack;
        total_listed += n;

        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((t1.tv_sec - t0.tv_sec) > CRASH_SECONDS)
            break;
    }
    fprintf(stderr, "\n    %s: %zu kills, %zu acknowledged, %zu committed at the kills\n",
            F.b->name, kills, total_acked, total_listed);
}

static void test_crash_puts(void)
{
    static const int sizes[] = {1};
    crash_plan plan = {sizes, 1};
    crash_run(&plan);
}

static void test_crash_group_commits(void)
{
    static const int sizes[] = {5};
    crash_plan plan = {sizes, 1};
    crash_run(&plan);
}

static void test_crash_mixed(void)
{
    static const int sizes[] = {1, 4, 1, 7, 2, 3};
    crash_plan plan = {sizes, sizeof(sizes) / sizeof(sizes[0])};
    crash_run(&plan);
}

/* ---- The runner --------------------------------------------------------- */

/* ---- A version's files ------------------------------------------------------ */

/* The file's bytes into buf (cap); the length, or -1 when it is missing. */
static long read_back(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return (long)n;
}

static void test_files(void)
{
    FRESH_STORE(s);
    strata_diag d;
    int found = 7;
    char ck[4096], opt[4096], buf[64];
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_DB, 1, &found, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_CHECKPOINT, 1, NULL, &d),
                    STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_file_remove(s, STRATA_STORE_FILE_LOCK, 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_CHECKPOINT, 4, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(strata_store_path(strata_store_dir(s), STRATA_STORE_FILE_CHECKPOINT, 4, 0, ck,
                                      sizeof(ck), &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_path(strata_store_dir(s), STRATA_STORE_FILE_SERVER_OPT, 4, 0, opt,
                                      sizeof(opt), &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(write_file(ck, "model four", 10), 0);
    CU_ASSERT_EQUAL(write_file(opt, "opt", 3), 0);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 4, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_CHECKPOINT, 4, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(read_back(ck, buf, sizeof(buf)), 10);
    /* The directory emptied (a new machine, a lost disk) and a cached file
     * altered: a store that keeps the files puts them back as recorded. */
    CU_ASSERT_EQUAL(unlink(ck), 0);
    CU_ASSERT_EQUAL(write_file(opt, "OPT", 3), 0);
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_CHECKPOINT, 4, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, F.b->files_kept);
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_SERVER_OPT, 4, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    long n = read_back(opt, buf, sizeof(buf));
    CU_ASSERT(n == 3 && memcmp(buf, F.b->files_kept ? "opt" : "OPT", 3) == 0);
    if (F.b->files_kept) {
        CU_ASSERT_EQUAL(read_back(ck, buf, sizeof(buf)), 10);
        CU_ASSERT(memcmp(buf, "model four", 10) == 0);
        /* A secondary and a reopened store see them too. */
        strata_store *sec = fx_secondary(&F);
        CU_ASSERT_PTR_NOT_NULL_FATAL(sec);
        CU_ASSERT_EQUAL(unlink(ck), 0);
        CU_ASSERT_EQUAL(strata_store_file_fetch(sec, STRATA_STORE_FILE_CHECKPOINT, 4, &found, &d),
                        STRATA_OK);
        CU_ASSERT_EQUAL(found, 1);
        CU_ASSERT_EQUAL(read_back(ck, buf, sizeof(buf)), 10);
    }
    /* Removed: from the directory and from the store. */
    CU_ASSERT_EQUAL(strata_store_file_remove(s, STRATA_STORE_FILE_SERVER_OPT, 4, &d), STRATA_OK);
    CU_ASSERT_EQUAL(read_back(opt, buf, sizeof(buf)), -1);
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_SERVER_OPT, 4, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(strata_store_file_remove(s, STRATA_STORE_FILE_SERVER_OPT, 4, &d), STRATA_OK);
    s = fx_reopen(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_file_fetch(s, STRATA_STORE_FILE_CHECKPOINT, 4, &found, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(found, F.b->files_kept); /* SQLite's copy was the unlinked file */
}

/* ---- Finding a client by its token ----------------------------------------- */

/* A client is found by its token hash, on any connection; a registration
 * again under the same registration id moves it to the new hash. */
static void test_client_find(void)
{
    FRESH_STORE(s);
    strata_diag d;
    uint64_t ids[2];
    add_clients(s, 2, ids);
    uint8_t h[STRATA_STORE_HASH_LEN], h9[STRATA_STORE_HASH_LEN];
    token_hash(2, h);
    token_hash(9, h9);
    strata_store_client c;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_client_find(s, h, &c, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(c.id, ids[1]);
    CU_ASSERT(memcmp(c.token_hash, h, sizeof(h)) == 0);
    CU_ASSERT_EQUAL(strata_store_client_find(s, h9, &c, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
    CU_ASSERT_EQUAL(c.id, 0);
    CU_ASSERT_EQUAL(strata_store_client_find(s, NULL, &c, &found, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_client_find(s, h, NULL, &found, &d), STRATA_EINVAL);
    uint64_t id = 0;
    uint8_t h7[STRATA_STORE_HASH_LEN];
    token_hash(7, h7);
    CU_ASSERT_EQUAL(strata_store_client_add(s, h7, "seven", "reg-7", &id, NULL, &d), STRATA_OK);
    int existed = 0;
    uint64_t again = 0;
    CU_ASSERT_EQUAL(strata_store_client_add(s, h9, "seven", "reg-7", &again, &existed, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(existed, 1);
    strata_store *sec = fx_secondary(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sec);
    CU_ASSERT_EQUAL(strata_store_client_find(sec, h9, &c, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(c.id, id);
    CU_ASSERT_EQUAL(strata_store_client_find(sec, h7, &c, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(found, 0);
}

/* ---- Sealing a round ------------------------------------------------------- */

/* A sealed round stays open, but no connection stores an update for it any
 * more (a duplicate still gets its receipt); it closes as an open round
 * does, and sealing is refused for unknown and closed rounds. */
static void test_seal(void)
{
    FRESH_STORE(s);
    strata_diag d;
    uint64_t ids[3];
    add_clients(s, 3, ids);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 0, 0, ids, 3, 0, NULL, &d), STRATA_OK);
    strata_store_receipt rec;
    strata_store_verdict v;
    CU_ASSERT_EQUAL(strata_store_update_put(s, 0, ids[0], (const uint8_t *)"a", 1, 1, &rec, &v, &d),
                    STRATA_OK);
    strata_store_receipt got;
    int have = 0;
    CU_ASSERT_EQUAL(strata_store_update_find(s, 0, ids[0], &got, &have, &d), STRATA_OK);
    CU_ASSERT_EQUAL(have, 1);
    CU_ASSERT_STRING_EQUAL(got.id, rec.id);
    CU_ASSERT_EQUAL(got.bytes, 1);
    CU_ASSERT_EQUAL(got.samples, 1);
    CU_ASSERT_EQUAL(strata_store_update_find(s, 0, ids[1], &got, &have, &d), STRATA_OK);
    CU_ASSERT_EQUAL(have, 0);
    CU_ASSERT_EQUAL(strata_store_update_find(s, 7, ids[0], NULL, &have, &d), STRATA_OK);
    CU_ASSERT_EQUAL(have, 0);
    CU_ASSERT_EQUAL(strata_store_update_find(s, 0, ids[0], NULL, NULL, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_round_seal(s, 0, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_seal(s, 0, &d), STRATA_OK); /* again: nothing changes */
    strata_store_round r;
    int found = 0;
    CU_ASSERT_EQUAL(strata_store_round_get(s, 0, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_OPEN);
    CU_ASSERT_EQUAL(r.sealed, 1);
    CU_ASSERT_EQUAL(r.closed_unix_ms, 0);
    CU_ASSERT_EQUAL(r.n_updates, 1);
    strata_store_round_cleanup(&r);
    /* Refused on another connection too; the duplicate keeps its receipt. */
    strata_store *sec = fx_secondary(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sec);
    CU_ASSERT_EQUAL(
        strata_store_update_put(sec, 0, ids[1], (const uint8_t *)"b", 1, 1, &rec, &v, &d),
        STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_ROUND_CLOSED);
    CU_ASSERT(strstr(d.msg, "closing") != NULL);
    strata_store_pending *p = NULL;
    CU_ASSERT_EQUAL(strata_store_update_prepare(sec, 0, ids[2], (const uint8_t *)"c", 1, 1, &p, &d),
                    STRATA_OK);
    int res = 0;
    CU_ASSERT_EQUAL(strata_store_update_commit_many(sec, &p, 1, &rec, &v, &res, &d), STRATA_OK);
    CU_ASSERT_EQUAL(res, STRATA_ESTATE);
    CU_ASSERT_EQUAL(v, STRATA_STORE_REJECT_ROUND_CLOSED);
    CU_ASSERT_EQUAL(
        strata_store_update_put(sec, 0, ids[0], (const uint8_t *)"a", 1, 1, &rec, &v, &d),
        STRATA_OK);
    CU_ASSERT_EQUAL(v, STRATA_STORE_DUPLICATE);
    strata_store_update *ups = NULL;
    size_t n = 9;
    CU_ASSERT_EQUAL(strata_store_update_list(s, 0, &ups, &n, &d), STRATA_OK);
    CU_ASSERT_EQUAL(n, 1);
    strata_store_update_list_free(ups, n);
    /* It survives a reopen, then closes; a closed or unknown round is not
     * sealed. */
    s = fx_reopen(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 0, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.sealed, 1);
    strata_store_round_cleanup(&r);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 0, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 0, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.state, STRATA_STORE_ROUND_CLOSED);
    CU_ASSERT_EQUAL(r.sealed, 0);
    CU_ASSERT(r.closed_unix_ms > 0);
    strata_store_round_cleanup(&r);
    CU_ASSERT_EQUAL(strata_store_round_seal(s, 0, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "already closed") != NULL);
    CU_ASSERT_EQUAL(strata_store_round_seal(s, 5, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "no such round") != NULL);
    /* The next round opens unsealed. */
    CU_ASSERT_EQUAL(strata_store_round_open(s, 1, 0, ids, 3, 0, NULL, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_get(s, 1, &r, &found, &d), STRATA_OK);
    CU_ASSERT_EQUAL(r.sealed, 0);
    strata_store_round_cleanup(&r);
}

/* ---- Change notifications ------------------------------------------------- */

/* The changes a listener sees within 5 s of a write on another connection
 * (notifications may come in several parts). */
static strata_store_changes await_changes(strata_store *l, int want_ms)
{
    strata_store_changes all = {0, 0, 0, 0}, one;
    strata_diag d;
    for (int waited = 0; waited < want_ms; waited += 100) {
        if (strata_store_changes_wait(l, 100, &one, &d) != STRATA_OK)
            break;
        all.clients |= one.clients;
        all.rounds |= one.rounds;
        all.updates |= one.updates;
        all.models |= one.models;
    }
    return all;
}

/* Every committed write of another connection notifies a listener with what
 * it changed; a rolled-back write and a read notify nothing. A backend
 * without notifications refuses to listen. */
static void test_changes(void)
{
    FRESH_STORE(s);
    strata_diag d;
    strata_store_changes c;
    CU_ASSERT_EQUAL(strata_store_changes_wait(s, 0, &c, &d), STRATA_EINVAL); /* not listening */
    CU_ASSERT_EQUAL(strata_store_changes_wait(s, -1, &c, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_changes_listen(NULL, &d), STRATA_EINVAL);
    strata_store *l = fx_secondary(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(l);
    if (!F.b->notifies) {
        CU_ASSERT_EQUAL(strata_store_changes_listen(l, &d), STRATA_EINVAL);
        CU_ASSERT(strstr(d.msg, "no change notifications") != NULL);
        return;
    }
    CU_ASSERT_EQUAL_FATAL(strata_store_changes_listen(l, &d), STRATA_OK);
    c = await_changes(l, 300);
    CU_ASSERT(!c.clients && !c.rounds && !c.updates && !c.models);
    uint64_t ids[2];
    add_clients(s, 2, ids);
    c = await_changes(l, 300);
    CU_ASSERT(c.clients && !c.rounds && !c.updates && !c.models);
    CU_ASSERT_EQUAL(strata_store_round_open(s, 0, 0, ids, 2, 0, NULL, &d), STRATA_OK);
    c = await_changes(l, 300);
    CU_ASSERT(!c.clients && c.rounds && !c.updates);
    strata_store_receipt rec;
    strata_store_verdict v;
    CU_ASSERT_EQUAL(strata_store_update_put(s, 0, ids[0], (const uint8_t *)"a", 1, 1, &rec, &v, &d),
                    STRATA_OK);
    c = await_changes(l, 300);
    CU_ASSERT(c.updates && !c.rounds);
    /* A duplicate and a refusal store nothing: no notification. */
    CU_ASSERT_EQUAL(strata_store_update_put(s, 0, ids[0], (const uint8_t *)"a", 1, 1, &rec, &v, &d),
                    STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_update_put(s, 9, ids[0], (const uint8_t *)"a", 1, 1, &rec, &v, &d),
                    STRATA_ESTATE);
    c = await_changes(l, 300);
    CU_ASSERT(!c.updates);
    CU_ASSERT_EQUAL(strata_store_round_seal(s, 0, &d), STRATA_OK);
    c = await_changes(l, 300);
    CU_ASSERT(c.rounds);
    char ck[4096];
    CU_ASSERT_EQUAL(strata_store_checkpoint_path(s, 1, ck, sizeof(ck), &d), STRATA_OK);
    CU_ASSERT_EQUAL(write_file(ck, "model", 5), 0);
    CU_ASSERT_EQUAL(strata_store_checkpoint_record(s, 1, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_round_close(s, 0, NULL, &d), STRATA_OK);
    c = await_changes(l, 300);
    CU_ASSERT(c.models && c.rounds && !c.clients);
    /* Refused writes (closing again) notify nothing; the listener itself
     * may still read. */
    CU_ASSERT_EQUAL(strata_store_round_close(s, 0, NULL, &d), STRATA_ESTATE);
    c = await_changes(l, 300);
    CU_ASSERT(!c.rounds);
    uint64_t count = 0;
    CU_ASSERT_EQUAL(strata_store_client_count(l, &count, &d), STRATA_OK);
    CU_ASSERT_EQUAL(count, 2);
}

/* ---- Leadership ----------------------------------------------------------- */

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void test_leadership(void)
{
    FRESH_STORE(s);
    strata_diag d;
    strata_store_leader l;
    int64_t v;
    CU_ASSERT_EQUAL(strata_store_lead(s, "", 1000, &l, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_lead(s, "has space", 1000, &l, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_lead(s, "a", 50, &l, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_lead(NULL, "a", 1000, &l, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_renew(s, 10, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_store_leader_get(s, NULL, &d), STRATA_EINVAL);
    if (!F.b->rivals) {
        /* The one opener leads, always. */
        CU_ASSERT_EQUAL(strata_store_lead(s, "a", 1000, &l, &d), STRATA_OK);
        CU_ASSERT(l.epoch >= 1);
        CU_ASSERT_EQUAL(strata_store_renew(s, 1000, &d), STRATA_OK);
        CU_ASSERT_EQUAL(strata_store_leader_get(s, &l, &d), STRATA_OK);
        CU_ASSERT(l.epoch >= 1 && l.expires_in_ms > 0);
        CU_ASSERT_EQUAL(l.lock_held, 1);
        CU_ASSERT_EQUAL(strata_store_counter_add(s, "after-lead", 1, &d), STRATA_OK);
        return;
    }
    /* Nobody leads a fresh store; renewing without leading is refused. */
    CU_ASSERT_EQUAL(strata_store_leader_get(s, &l, &d), STRATA_OK);
    CU_ASSERT_EQUAL(l.epoch, 0);
    CU_ASSERT_EQUAL(strata_store_renew(s, 1000, &d), STRATA_ESTATE);
    strata_store *a = fx_secondary(&F), *b = fx_secondary(&F), *c = fx_secondary(&F);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_EQUAL_FATAL(strata_store_lead(a, "a", 60000, &l, &d), STRATA_OK);
    const int64_t e = l.epoch;
    CU_ASSERT(e >= 1);
    CU_ASSERT_STRING_EQUAL(l.holder, "a");
    CU_ASSERT(l.expires_in_ms > 50000 && l.expires_in_ms <= 60000);
    /* A rival waits while the lease runs and the leader lives. */
    CU_ASSERT_EQUAL(strata_store_lead(b, "b", 60000, &l, &d), STRATA_ESTATE);
    CU_ASSERT_STRING_EQUAL(l.holder, "a");
    CU_ASSERT_EQUAL(l.epoch, e);
    CU_ASSERT(strstr(d.msg, "a leads") != NULL);
    CU_ASSERT_EQUAL(strata_store_leader_get(c, &l, &d), STRATA_OK);
    CU_ASSERT_EQUAL(l.lock_held, 1); /* a's session holds the lock */
    CU_ASSERT_EQUAL(strata_store_counter_add(a, "led", 1, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_renew(a, 60000, &d), STRATA_OK);
    /* Leading again renews: the same epoch. */
    CU_ASSERT_EQUAL(strata_store_lead(a, "a", 60000, &l, &d), STRATA_OK);
    CU_ASSERT_EQUAL(l.epoch, e);

    /* A lease that expires (the leader paused, its session alive) is taken
     * over, and the old leader is fenced: no write, no renewal, no taking
     * the lead back while the new lease runs. */
    CU_ASSERT_EQUAL(strata_store_lead(a, "a", 100, &l, &d), STRATA_OK);
    sleep_ms(300);
    CU_ASSERT_EQUAL_FATAL(strata_store_lead(b, "b", 60000, &l, &d), STRATA_OK);
    CU_ASSERT_EQUAL(l.epoch, e + 1);
    CU_ASSERT_STRING_EQUAL(l.holder, "b");
    CU_ASSERT_EQUAL(strata_store_counter_add(a, "led", 1, &d), STRATA_ESTATE);
    CU_ASSERT(strstr(d.msg, "fenced") != NULL);
    CU_ASSERT_EQUAL(strata_store_renew(a, 60000, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_lead(a, "a", 60000, &l, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(l.epoch, e + 1);
    uint64_t ids[1];
    uint8_t h[32];
    token_hash(77, h);
    CU_ASSERT_EQUAL(strata_store_client_add(a, h, "x", NULL, &ids[0], NULL, &d), STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_store_counter_get(c, "led", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 1); /* the fenced write left nothing */
    CU_ASSERT_EQUAL(strata_store_counter_add(b, "led", 1, &d), STRATA_OK);

    /* When the old leader's session ends, the new one gets the session
     * lock at its next renewal; when the new one's session ends in turn,
     * a rival takes over at once, its lease notwithstanding. */
    fx_close_secondary(&F, a);
    /* The server ends a's session (and frees its lock) a moment after the
     * close: b's renewals try the lock each time. */
    for (int i = 0; i < 20; i++) {
        CU_ASSERT_EQUAL(strata_store_renew(b, 60000, &d), STRATA_OK);
        sleep_ms(50);
    }
    CU_ASSERT_EQUAL(strata_store_lead(c, "c", 60000, &l, &d), STRATA_ESTATE);
    fx_close_secondary(&F, b);
    /* Nobody holds the lock once b's session ended (seen without a bid). */
    int held = 1;
    for (int i = 0; i < 40 && held; i++) {
        CU_ASSERT_EQUAL(strata_store_leader_get(s, &l, &d), STRATA_OK);
        held = l.lock_held;
        if (held)
            sleep_ms(50);
    }
    CU_ASSERT_EQUAL(held, 0);
    CU_ASSERT_STRING_EQUAL(l.holder, "b");
    int took = STRATA_ESTATE;
    for (int i = 0; i < 40 && took != STRATA_OK; i++) { /* the server ends the session */
        took = strata_store_lead(c, "c", 60000, &l, &d);
        if (took != STRATA_OK)
            sleep_ms(50);
    }
    CU_ASSERT_EQUAL_FATAL(took, STRATA_OK);
    CU_ASSERT_EQUAL(l.epoch, e + 2);
    CU_ASSERT_STRING_EQUAL(l.holder, "c");
    CU_ASSERT_EQUAL(strata_store_counter_add(c, "led", 1, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_counter_get(s, "led", &v, &d), STRATA_OK);
    CU_ASSERT_EQUAL(v, 3);
    /* A connection opened from the leader writes as the leader. */
    strata_store *c2 = fx_open(&F, STORE_SECONDARY, c);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c2);
    CU_ASSERT_EQUAL(strata_store_counter_add(c2, "led", 1, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_store_leader_get(c2, &l, &d), STRATA_OK);
    CU_ASSERT_EQUAL(l.epoch, e + 2);
    strata_store_close(c2);
}

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: %s [--backend NAME]\n  NAME:", argv0);
    for (size_t i = 0; i < STORE_N_BACKENDS; i++)
        fprintf(stderr, " %s", STORE_BACKENDS[i].name);
    fprintf(stderr, "\n");
    return 2;
}

int main(int argc, char **argv)
{
    /* With --backend, that backend's suite (which must be able to run);
     * else every backend that can run here. */
    const store_backend *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") != 0 || i + 1 == argc)
            return usage(argv[0]);
        only = store_backend_find(argv[++i]);
        if (only == NULL) {
            fprintf(stderr, "%s: unknown backend %s\n", argv[0], argv[i]);
            return usage(argv[0]);
        }
    }
    if (only != NULL && only->unmet() != NULL) {
        fprintf(stderr, "%s: the %s backend cannot run: %s\n", argv[0], only->name, only->unmet());
        return 1;
    }

    static CU_TestInfo cases[] = {
        {"clients: ids, token hashes, names, registration ids, last seen", test_clients},
        {"rounds: open, get, close, list, last; refusals", test_rounds},
        {"updates: put, commit and commit_many of one give the same outcomes",
         test_update_outcomes},
        {"updates: bad arguments store nothing", test_update_arguments},
        {"updates: prepared is invisible until committed; the commit decides",
         test_prepare_then_commit},
        {"group commit: per-item outcomes in order, all or nothing", test_commit_many},
        {"update list: acceptance order, across connections and reopening, from a place",
         test_list_order},
        {"update read: exact bytes of every size", test_payload_bytes},
        {"counters: add, add_many all or nothing, names, overflow, persistence", test_counters},
        {"checkpoints: record, latest", test_checkpoints},
        {"leadership: lead, renew, expiry, fencing, a dead leader's place", test_leadership},
        {"files: a version's files recorded, fetched into the directory, removed", test_files},
        {"client find: by token hash, on any connection, after a new token", test_client_find},
        {"seal: a sealed round takes no update on any connection, then closes; update find",
         test_seal},
        {"changes: committed writes notify listeners of what changed", test_changes},
        {"concurrent connections store one update once", test_concurrent_same_update},
        {"concurrent conflicting updates: one wins", test_concurrent_conflicting_updates},
        {"prepare in threads while others commit", test_prepare_concurrent_with_commits},
        {"SIGKILL during single puts loses no acknowledged update", test_crash_puts},
        {"SIGKILL during group commits loses no acknowledged update", test_crash_group_commits},
        {"SIGKILL during mixed puts and group commits", test_crash_mixed},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[STORE_N_BACKENDS + 1];
    size_t n = 0;
    for (size_t i = 0; i < STORE_N_BACKENDS; i++) {
        const store_backend *b = &STORE_BACKENDS[i];
        snprintf(suite_names[i], sizeof(suite_names[i]), "store conformance: %s", b->name);
        if (only != NULL ? b != only : b->unmet() != NULL) {
            if (only == NULL)
                fprintf(stderr, "%s: skipping the %s backend: %s\n", argv[0], b->name, b->unmet());
            continue;
        }
        suites[n++] = (CU_SuiteInfo){suite_names[i], NULL, NULL, case_setup, case_teardown, cases};
    }
    suites[n] = (CU_SuiteInfo)CU_SUITE_INFO_NULL;
    return strata_test_run(suites);
}
