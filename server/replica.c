/* One coordinator among several on a shared store (see replica.h). */
#include "replica.h"

#include "strata/clock.h"
#include "strata/log.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The longest wait for a notification, and a follower's time between two
 * bids for the lead: a leader that died is replaced within about this
 * (its session ends with it) plus the new leader's start-up. */
#define REPLICA_WAIT_MS 500
#define REPLICA_BID_MS 500

/* Without a notification for this long the view is read again in full: a
 * listening connection cut without an error (a half-open TCP connection)
 * loses notifications silently. */
#define REPLICA_REREAD_MS 10000

struct srv_replica {
    srv_replica_config c;
    strata_store *lstore; /* the watch thread's, listening */
    pthread_t thread;
    int started;
    atomic_int stopping, promoted;
    atomic_llong read_ns; /* the last read of the leader row, in ns (-1: none yet) */
    srv_lease *lead;      /* a follower's, once it took the lead */
};

int srv__replica_new(const srv_replica_config *c, srv_replica **out, strata_diag *d)
{
    *out = NULL;
    srv_replica *P = calloc(1, sizeof(*P));
    if (P == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory");
    P->c = *c;
    atomic_store(&P->read_ns, -1);
    int rc = strata_store_open_secondary(c->store, &P->lstore, d);
    if (rc == 0)
        rc = strata_store_changes_listen(P->lstore, d);
    if (rc < 0) {
        srv__replica_free(P);
        return rc;
    }
    *out = P;
    return 0;
}

/* Logs a failed step of the watch once per streak of failures. */
static void failed(int *failing, const char *what, const strata_diag *d, int rc)
{
    if (!*failing)
        strata_log_warn("%s: %s (trying again)", what, strata_diag_msg(d, rc));
    *failing = 1;
}

/* A follower's view: the published version, then the open round (the
 * leader records a version before it closes the round that made it and
 * opens the next), then its parked long-polls ask again. */
static int follow(srv_replica *P, strata_diag *d)
{
    uint64_t v = 0;
    int found = 0;
    int rc = strata_store_latest_model_version(P->lstore, &v, &found, d);
    if (rc == 0 && found)
        rc = srv__models_follow(P->c.models, v, d);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(P->c.mu);
    rc = srv__round_mirror(P->c.rounds, d);
    srv__waiters_wake_all(P->c.waiters);
    pthread_mutex_unlock(P->c.mu);
    return rc;
}

/* Brings the view up to date with what changed (all 1: everything). */
static int apply(srv_replica *P, const strata_store_changes *ch, strata_diag *d)
{
    int rc = 0;
    if (ch->clients)
        rc = srv__registry_sync(P->c.reg, d);
    if (rc == 0 && !P->c.follower && (ch->updates || ch->rounds))
        rc = srv__round_adopt(P->c.rounds, P->lstore, d);
    if (rc == 0 && P->c.follower && (ch->models || ch->rounds))
        rc = follow(P, d);
    if (rc == 0 && P->c.follower && ch->updates)
        rc = srv__round_mirror_updates(P->c.rounds, P->lstore, d);
    return rc;
}

/* A follower's bid for the lead, made only when the leader row says the
 * lease ran out or no session holds the leader's lock (a read on the
 * watch connection, without the engine lock: a bid is a write transaction,
 * which waits for the store's other writes). Once it leads, its lease is
 * renewed from then on and the process opens its engine again as the
 * leader (main.c waits for SIGUSR1). */
static void bid(srv_replica *P)
{
    strata_store_leader l;
    double t0 = strata_clock_mono_s();
    int rc = strata_store_leader_get(P->lstore, &l, NULL);
    if (rc == STRATA_OK)
        atomic_store(&P->read_ns, (long long)((strata_clock_mono_s() - t0) * 1e9));
    if (rc == STRATA_OK && l.epoch > 0 && l.expires_in_ms > 0 && l.lock_held)
        return; /* the leader lives */
    strata_diag d = {{0}};
    pthread_mutex_lock(P->c.mu);
    rc = srv__lease_try(P->c.store, P->c.holder, P->c.lease_ms, &P->lead, &d);
    pthread_mutex_unlock(P->c.mu);
    if (rc == 0 && srv__lease_start(P->lead) == 0) {
        strata_log_info("this follower (%s) leads the store now: opening the round engine",
                        P->c.holder);
        atomic_store(&P->promoted, 1);
        kill(getpid(), SIGUSR1);
    } else if (rc == 0) { /* no renewal thread: let the lead go */
        srv__lease_free(P->lead);
        P->lead = NULL;
    }
}

static void pause_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void *watch_main(void *arg)
{
    srv_replica *P = arg;
    /* Whatever changed before the thread listened is read once first. */
    strata_store_changes ch = {1, 1, 1, 1};
    int failing = 0, waiting = 0;
    int64_t next_bid = 0, last_note = strata_clock_mono_ms();
    while (!atomic_load(&P->stopping)) {
        strata_diag d = {{0}};
        int rc = apply(P, &ch, &d);
        if (rc < 0) {
            failed(&failing, "bringing this coordinator up to date with the store", &d, rc);
            ch = (strata_store_changes){1, 1, 1, 1}; /* again, in full */
            pause_ms(REPLICA_WAIT_MS);
        } else if (failing) {
            strata_log_info("up to date with the store again");
            failing = 0;
        }
        if (P->c.follower && strata_clock_mono_ms() >= next_bid) {
            bid(P);
            if (atomic_load(&P->promoted))
                break;
            next_bid = strata_clock_mono_ms() + REPLICA_BID_MS;
        }
        strata_store_changes got;
        rc = strata_store_changes_wait(P->lstore, REPLICA_WAIT_MS, &got, &d);
        if (rc < 0) {
            failed(&waiting, "waiting for the store's notifications", &d, rc);
            pause_ms(REPLICA_WAIT_MS);
            continue;
        }
        waiting = 0;
        int any = got.clients || got.rounds || got.updates || got.models;
        int64_t now = strata_clock_mono_ms();
        if (any)
            last_note = now;
        else if (now - last_note >= REPLICA_REREAD_MS) {
            got = (strata_store_changes){1, 1, 1, 1};
            last_note = now;
        }
        if (!failing) {
            ch = got;
        } else { /* keep the full re-read pending, add what came */
            ch.clients |= got.clients;
            ch.rounds |= got.rounds;
            ch.updates |= got.updates;
            ch.models |= got.models;
        }
    }
    return NULL;
}

int srv__replica_start(srv_replica *P)
{
    if (pthread_create(&P->thread, NULL, watch_main, P) != 0)
        return STRATA_ENOMEM;
    P->started = 1;
    return 0;
}

void srv__replica_stop(srv_replica *P)
{
    if (P == NULL || !P->started)
        return;
    atomic_store(&P->stopping, 1);
    pthread_join(P->thread, NULL);
    P->started = 0;
}

double srv__replica_read_s(srv_replica *P)
{
    long long ns = P != NULL ? atomic_load(&P->read_ns) : -1;
    return ns < 0 ? -1.0 : (double)ns / 1e9;
}

int srv__replica_promoted(srv_replica *P)
{
    return P != NULL && atomic_load(&P->promoted);
}

srv_lease *srv__replica_take_lead(srv_replica *P)
{
    if (P == NULL)
        return NULL;
    srv_lease *L = P->lead;
    P->lead = NULL;
    return L;
}

void srv__replica_free(srv_replica *P)
{
    if (P == NULL)
        return;
    srv__replica_stop(P);
    srv__lease_free(P->lead);
    strata_store_close(P->lstore);
    free(P);
}
