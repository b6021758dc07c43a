/* The coordinator's leadership of a shared store (with --database): a
 * coordinator waits as a standby until it leads the store
 * (strata_store_lead), then renews its lease from a thread of its own, and
 * stops the process (SIGTERM to itself) when it was fenced (another
 * coordinator took over) or could not renew within its lease. With SQLite
 * there is no lease: the directory lock makes the coordinator the one
 * writer.
 *
 * Owns srv_lease: its own store connection (opened once leading, so fenced
 * like the engine's), the holder's name, the lease, the renewal thread and
 * the last renewal. May call: the store, log. */
#ifndef STRATA_SERVER_LEASE_H
#define STRATA_SERVER_LEASE_H

#include "store.h"

#include "strata/error.h"

#include <signal.h>

typedef struct srv_lease srv_lease;

/* Leads primary's store as holder for lease_ms, waiting as a standby
 * (logging once who leads, polling every 250 ms) while another leads, and
 * through outages of the database (STRATA_EIO: logged once, tried again
 * every 250 ms); gives up with STRATA_ESTATE when *stop becomes set. With
 * follow, returns STRATA_ESTATE (*out NULL) as soon as another leads a
 * store that holds a model version, which this coordinator can then serve
 * as a follower. *out is the caller's (srv__lease_free). */
int srv__lease_acquire(strata_store *primary, const char *holder, long lease_ms,
                       volatile sig_atomic_t *stop, int follow, srv_lease **out, strata_diag *d);

/* One bid for the lead of primary's store, without waiting: STRATA_OK
 * with *out (the caller's) when this coordinator leads now, STRATA_ESTATE
 * when another does, STRATA_EIO. */
int srv__lease_try(strata_store *primary, const char *holder, long lease_ms, srv_lease **out,
                   strata_diag *d);

/* Starts the renewal thread (once; again is a no-op): every lease/3 ms (lease/10 after a failed
 * renewal); fenced, or no renewal for a
 * whole lease, logs why and sends SIGTERM to the process. */
int srv__lease_start(srv_lease *L);

/* The leader's facts for GET /v1/health: its epoch, name and lease time
 * left as the store says now, and how long that read took (ms). */
int srv__lease_health(srv_lease *L, strata_store_leader *now, double *latency_ms, strata_diag *d);

/* What /metrics shows of the lead. */
typedef struct srv_lease_gauges {
    int64_t epoch;
    double renewed_age_s;    /* since the lead was taken or last renewed */
    double renew_s;          /* the last successful renewal's duration (a write
                                transaction on the store: the database's latency) */
    uint64_t renew_failures; /* failed renewals since the lead was taken */
} srv_lease_gauges;

/* Fills g; never waits for the database. */
void srv__lease_gauges(srv_lease *L, srv_lease_gauges *g);

/* Stops the thread (when started) and frees L; accepts NULL. */
void srv__lease_free(srv_lease *L);

#endif
