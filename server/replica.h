/* One coordinator among several on a shared store (with --database): the
 * watch thread, which waits for the store's change notifications on a
 * connection of its own (LISTEN/NOTIFY, strata_store_changes_wait) and
 * brings this coordinator's view up to date:
 *
 *   every coordinator   the clients that others registered (the registry);
 *   the leader          the updates that followers stored for the open
 *                       round (srv__round_adopt), so that the round fills
 *                       and closes as if they had been uploaded here;
 *   a follower          the published model version (srv__models_follow),
 *                       the open round (srv__round_mirror) and who reported
 *                       in it (srv__round_mirror_updates), then wakes
 *                       its parked long-polls; every REPLICA_BID_MS it
 *                       reads the leader row and bids for the lead when the
 *                       lease ran out or nobody holds the leader's lock;
 *                       once it leads, it renews the lease and asks the
 *                       process to open its engine again as the leader
 *                       (SIGUSR1; main.c), handing over the store and the
 *                       lease (srv__replica_take_lead).
 *
 * Without a notification for REPLICA_REREAD_MS the view is read again in
 * full (a listening connection may be cut without an error).
 *
 * Owns srv_replica: the listening connection, the thread, the lead a
 * follower took. May call: the store, lease, registry, round, models,
 * waiters, log. */
#ifndef STRATA_SERVER_REPLICA_H
#define STRATA_SERVER_REPLICA_H

#include "lease.h"
#include "models.h"
#include "registry.h"
#include "round.h"
#include "waiters.h"

#include "store.h"

#include <pthread.h>

typedef struct srv_replica srv_replica;

/* What the replica is handed (copied; pointers borrowed). */
typedef struct srv_replica_config {
    int follower;        /* another coordinator leads the store */
    strata_store *store; /* the engine's primary connection: used under mu */
    pthread_mutex_t *mu; /* the engine lock */
    const char *holder;  /* this coordinator's name, for a follower's bid */
    long lease_ms;       /* the lease a bid asks for */
    srv_registry *reg;
    srv_rounds *rounds;
    srv_models *models;
    srv_waiters *waiters;
} srv_replica_config;

/* Opens the watch thread's connection (a secondary of c->store) and
 * listens on it. Errors: the store's. */
int srv__replica_new(const srv_replica_config *c, srv_replica **out, strata_diag *d);

/* Starts the watch thread. Errors: STRATA_ENOMEM. */
int srv__replica_start(srv_replica *P);

/* Stops the watch thread (waits for it). Idempotent. */
void srv__replica_stop(srv_replica *P);

/* A follower's last read of the leader row (every REPLICA_BID_MS, on the
 * watch connection), in seconds: the database's latency as it sees it;
 * -1 before the first (and for a leader). Any thread. */
double srv__replica_read_s(srv_replica *P);

/* Whether a follower took the lead (then the process opens its engine
 * again); any thread. */
int srv__replica_promoted(srv_replica *P);

/* After srv__replica_stop: the lease a follower took (NULL when none),
 * handed to the caller with it. */
srv_lease *srv__replica_take_lead(srv_replica *P);

/* Closes the connection and frees P (and a lease not taken). Accepts NULL. */
void srv__replica_free(srv_replica *P);

#endif
