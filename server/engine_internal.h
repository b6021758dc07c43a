/* The engine's composition: struct srv_engine, which holds the modules'
 * structures and the threads and connections they share. Only engine.c
 * (opening, the round thread, freeing), engine_api.c (the request calls)
 * and views.c (the read views) include it; every other module owns its
 * state in its own structure and is handed what it may use at start-up.
 *
 * Module map (docs/architecture.md has the table): registry.h (clients,
 * tokens, buckets), round.h (the open round), close.h (closing rounds, the
 * server's model and optimiser), upload.h (group commit), models.h (the
 * published version), downlink.h (x̂), eval.h (the test split), budgets.h
 * (the policy), metrics.h (counters and gauges), waiters.h (parked
 * long-polls), admin.h (controls).
 *
 * Locking: one engine mutex, mu, guards the modules' state as each
 * module's header says; counters are atomics. The round thread opens and
 * closes rounds; a close drops mu for everything but its memory steps
 * (close.h). Group commits run on the second store connection, wstore,
 * with mu released; the round thread has its own connection, rstore. */
#ifndef STRATA_SERVER_ENGINE_INTERNAL_H
#define STRATA_SERVER_ENGINE_INTERNAL_H

#include "engine.h"

#include "admin.h"
#include "budgets.h"
#include "close.h"
#include "downlink.h"
#include "eval.h"
#include "lease.h"
#include "metrics.h"
#include "models.h"
#include "registry.h"
#include "replica.h"
#include "round.h"
#include "upload.h"
#include "waiters.h"

#include "request.h"
#include "store.h"

#include <pthread.h>
#include <stddef.h>

struct srv_engine {
    const srv_config *cfg; /* borrowed */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* wakes the round thread */
    pthread_t thread;
    int started, stopping;
    strata_store *store;  /* under mu */
    strata_store *wstore; /* group commits, outside mu */
    strata_store *rstore; /* the round thread's (closes), outside mu */
    srv_json_limits jlim;
    size_t max_body;
    long total_rounds; /* the run's rounds (the status view) */
    /* the model's layout, fixed at open */
    size_t nlayers, total_params;
    size_t *numel;
    char **names; /* borrowed from the model */
    strata_payload_limits limits;
    /* the modules */
    srv_metrics *met;
    srv_eval *eval;
    srv_waiters *waiters;
    srv_registry *reg;
    srv_budgets *budgets;
    srv_models *models;
    srv_downlink *downlink;
    srv_rounds *rounds;
    srv_close *close;
    srv_uploads *uploads;
    srv_admin *admin;
    srv_lease *lease; /* with --database: this coordinator's leadership; NULL with SQLite */
    /* With --database: follower (another coordinator leads; the engine
     * serves, but opens and closes no round), the watch thread, and this
     * coordinator's name in the lease. */
    int follower;
    int seal_failing; /* the round thread's last seal failed (logged once) */
    srv_replica *replica;
    char holder[64];
};

/* A follower's lead, handed from its engine to the next (main.c). */
struct srv_engine_lead {
    strata_store *store; /* the primary connection that leads */
    srv_lease *lease;
};

#endif
