/* The client registry (registry.c): registered clients by id and by token
 * hash (so that authenticating a request needs no database lookup), each
 * client's state (upload-rate bucket, when it last asked for a task, the
 * round before which it is not selected again), the admin token, the
 * wrong-secret buckets of addresses, and the order in which a round selects
 * clients.
 *
 * registry.c owns all of it in its own structure (srv_registry). The
 * engine lock guards it: calls marked "lock held" need it, the others take
 * it. It may call the store, request.h, metrics.h and libstrata; it calls
 * no other engine module.
 *
 * Also here: the sorted-id helpers every module uses. */
#ifndef STRATA_SERVER_REGISTRY_H
#define STRATA_SERVER_REGISTRY_H

#include "metrics.h"
#include "request.h"
#include "result.h"
#include "store.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_registry srv_registry;

/* What the registry is given at start-up (copied; pointers borrowed for its
 * lifetime). */
typedef struct srv_registry_config {
    const char *enrolment_secret;
    long enrolment_rate; /* wrong secrets a minute from one address */
    long upload_rate;    /* uploads a minute from one client */
    long max_clients;
    long data_shares;             /* 0: none */
    const char *admin_token_file; /* NULL: STATE_DIR/admin.token */
    const srv_json_limits *jlim;  /* request bodies */
    strata_store *store;          /* used under the engine lock */
    pthread_mutex_t *mu;          /* the engine lock */
    pthread_cond_t *wake;         /* wakes the round thread (a client registered) */
    srv_metrics *met;
    /* Other coordinators register clients in the store too (--database): a
     * token not known here is looked up there (srv__registry_auth). */
    int shared;
} srv_registry_config;

/* Index of x in the ascending array v[0, n), or -1. */
ptrdiff_t srv__id_find(const uint64_t *v, size_t n, uint64_t x);

/* Sorts v[0, n) ascending. */
void srv__id_sort(uint64_t *v, size_t n);

/* Loads every registered client of the store into a new registry, then
 * reads the admin token file (admin_token_file, default
 * STATE_DIR/admin.token), creating it with a random token (mode 0600) on
 * first start. Start-up only. Errors: the store's and the file's, with
 * diag; STRATA_EINVAL for a token file whose first line is not a token of
 * 16 to 256 printable characters; STRATA_ENOMEM. */
int srv__registry_new(const srv_registry_config *c, srv_registry **out, strata_diag *d);

/* Frees g. Accepts NULL. */
void srv__registry_free(srv_registry *g);

/* Adds the clients that other coordinators of a shared store registered
 * since (those with an id above the registry's highest); wakes the round
 * thread when there are any. Takes the lock (and reads the store under
 * it). Errors: the store's (the clients read so far stay). */
int srv__registry_sync(srv_registry *g, strata_diag *d);

/* srv_engine_register, srv_engine_auth, srv_engine_admin_auth and
 * srv_engine_rate_take (engine.h says what each answers). Each takes the
 * lock. */
void srv__registry_register(srv_registry *g, const char *peer, const uint8_t *body, size_t len,
                            srv_result *r);
int srv__registry_auth(srv_registry *g, const char *authorization, uint64_t *client_id,
                       srv_result *r);
int srv__registry_admin_auth(srv_registry *g, const char *authorization, srv_result *r);
int srv__registry_rate_take(srv_registry *g, uint64_t client_id, srv_result *r);

/* Registered clients. Lock held. */
size_t srv__registry_count(const srv_registry *g);

/* Notes in memory that client_id was seen now (unknown ids are ignored).
 * Lock held; no store access, so the task path never waits on the disk. */
void srv__registry_seen(srv_registry *g, uint64_t client_id);

/* Writes the last-seen times noted since the previous flush to the store,
 * in one transaction; a failure is logged and retried at the next flush,
 * never an error of the caller. Lock held (the round thread calls it when
 * a round opens, and shutdown). */
void srv__registry_flush_seen(srv_registry *g);

/* Chooses ks of the registered clients for round r into sel (room for ks),
 * ascending: a shuffle seeded with seed and r (the same seed and round give
 * the same order), then clients seen in the last minute first, clients not
 * seen lately next, clients benched for r (srv__registry_bench) last. ks is
 * at most srv__registry_count. Lock held. */
void srv__registry_select(const srv_registry *g, uint64_t seed, uint32_t r, size_t ks,
                          uint64_t *sel);

/* Benches client_id (a straggler): it is selected before round `until` only
 * when no other client can be. Unknown ids are ignored. Lock held. */
void srv__registry_bench(srv_registry *g, uint64_t client_id, uint32_t until);

#endif
