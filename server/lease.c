/* The coordinator's leadership of a shared store (see lease.h). */
#include "lease.h"

#include "strata/clock.h"
#include "strata/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct srv_lease {
    strata_store *store; /* own connection, fenced with the lead's epoch */
    char holder[64];
    long lease_ms;
    int64_t epoch;
    pthread_mutex_t mu; /* the connection (renewal thread and health) and the fields below */
    pthread_cond_t cv;
    pthread_t thread;
    int started, stopping;
    /* Written by the renewal thread alone; read by srv__lease_gauges under
     * gmu (the renewal thread holds mu while it waits for the database). */
    pthread_mutex_t gmu;
    int64_t renewed_ms; /* monotonic time the lead was taken or last renewed */
    double renew_s;     /* the last successful renewal's duration */
    uint64_t failures;  /* failed renewals */
};

/* A standby's pause between two tries: 250 ms, or STRATA_ESTATE when *stop
 * is set. The main thread keeps SIGINT and SIGTERM blocked while the engine
 * opens (main.c: the threads it starts leave them to it), so the pause
 * takes them itself (sigtimedwait) and sets *stop as the handler would. */
static int stand_by(volatile sig_atomic_t *stop, strata_diag *d)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    struct timespec t = {0, 250 * 1000000L};
    if (stop == NULL) {
        nanosleep(&t, NULL);
        return STRATA_OK;
    }
    if (!*stop && sigtimedwait(&set, NULL, &t) > 0)
        *stop = 1;
    return *stop ? strata_diag_set(d, STRATA_ESTATE, "stopped while standing by") : STRATA_OK;
}

/* The lease just taken (l) as *out, with its own connection. */
static int made(strata_store *primary, const char *holder, long lease_ms,
                const strata_store_leader *l, srv_lease **out, strata_diag *d)
{
    int rc;
    srv_lease *L = calloc(1, sizeof(*L));
    if (L == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory");
    snprintf(L->holder, sizeof(L->holder), "%s", holder);
    L->lease_ms = lease_ms;
    L->epoch = l->epoch;
    L->renewed_ms = strata_clock_mono_ms(); /* the lead was just taken */
    pthread_mutex_init(&L->mu, NULL);
    pthread_mutex_init(&L->gmu, NULL);
    pthread_cond_init(&L->cv, NULL);
    if ((rc = strata_store_open_secondary(primary, &L->store, d)) < 0) {
        srv__lease_free(L);
        return rc;
    }
    strata_log_info("leading the store as %s (epoch %lld, lease %ld ms)", holder,
                    (long long)l->epoch, lease_ms);
    *out = L;
    return STRATA_OK;
}

/* Whether the store holds a model version: a federation a follower can
 * serve. */
static int servable(strata_store *primary)
{
    uint64_t v = 0;
    int found = 0;
    return strata_store_latest_model_version(primary, &v, &found, NULL) == STRATA_OK && found;
}

int srv__lease_acquire(strata_store *primary, const char *holder, long lease_ms,
                       volatile sig_atomic_t *stop, int follow, srv_lease **out, strata_diag *d)
{
    *out = NULL;
    strata_store_leader l;
    int rc, waited = 0, failing = 0;
    for (;;) {
        rc = strata_store_lead(primary, holder, lease_ms, &l, d);
        if (rc == STRATA_EIO) {
            /* The database is down or unreachable: a standby waits it out
             * (its connection is made again at the next try). */
            if (!failing)
                strata_log_warn("cannot reach the store to take or wait for the lead: %s "
                                "(trying again)",
                                strata_diag_msg(d, rc));
            failing = 1;
            if ((rc = stand_by(stop, d)) < 0)
                return rc;
            continue;
        }
        if (failing)
            strata_log_info("the store is reachable again");
        failing = 0;
        if (rc != STRATA_ESTATE || l.epoch <= 0)
            break;
        if (follow && servable(primary)) {
            strata_log_info("following: %s leads the store (epoch %lld); this coordinator (%s) "
                            "serves beside it and takes over when its session ends or its "
                            "lease runs out",
                            l.holder, (long long)l.epoch, holder);
            return rc;
        }
        if (!waited)
            strata_log_info("standby: %s leads the store (epoch %lld); this coordinator (%s) "
                            "takes over when its session ends or its lease runs out "
                            "(%lld ms left)",
                            l.holder, (long long)l.epoch, holder, (long long)l.expires_in_ms);
        waited = 1;
        if ((rc = stand_by(stop, d)) < 0)
            return rc;
    }
    return rc < 0 ? rc : made(primary, holder, lease_ms, &l, out, d);
}

int srv__lease_try(strata_store *primary, const char *holder, long lease_ms, srv_lease **out,
                   strata_diag *d)
{
    *out = NULL;
    strata_store_leader l;
    int rc = strata_store_lead(primary, holder, lease_ms, &l, d);
    return rc < 0 ? rc : made(primary, holder, lease_ms, &l, out, d);
}

static void *renew_thread(void *arg)
{
    srv_lease *L = arg;
    pthread_mutex_lock(&L->mu);
    int failed = 0;
    while (!L->stopping) {
        /* A third of the lease between renewals; after a failed one (the
         * database down or unreachable) a tenth, so that an outage shorter
         * than the lease does not cost the lead. */
        struct timespec ts = strata_clock_abstime_in(L->lease_ms / (failed ? 10 : 3));
        pthread_cond_timedwait(&L->cv, &L->mu, &ts);
        if (L->stopping)
            break;
        strata_diag d = {{0}};
        double t0 = strata_clock_mono_s();
        int rc = strata_store_renew(L->store, L->lease_ms, &d);
        double took = strata_clock_mono_s() - t0;
        int64_t now = strata_clock_mono_ms();
        failed = rc < 0;
        pthread_mutex_lock(&L->gmu);
        if (rc == STRATA_OK) {
            L->renewed_ms = now;
            L->renew_s = took;
        } else {
            L->failures++;
        }
        pthread_mutex_unlock(&L->gmu);
        if (rc == STRATA_OK)
            continue;
        if (rc == STRATA_ESTATE || now - L->renewed_ms >= L->lease_ms) {
            strata_log_error("%s: this coordinator (%s, epoch %lld) no longer leads the store; "
                             "stopping",
                             rc == STRATA_ESTATE ? strata_diag_msg(&d, rc)
                                                 : "no renewal of the lease for a whole lease",
                             L->holder, (long long)L->epoch);
            L->stopping = 1;
            kill(getpid(), SIGTERM);
            break;
        }
        strata_log_warn("renewing the lease: %s (retrying)", strata_diag_msg(&d, rc));
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

int srv__lease_start(srv_lease *L)
{
    if (L->started)
        return STRATA_OK;
    if (pthread_create(&L->thread, NULL, renew_thread, L) != 0)
        return STRATA_EIO;
    L->started = 1;
    return STRATA_OK;
}

int srv__lease_health(srv_lease *L, strata_store_leader *now, double *latency_ms, strata_diag *d)
{
    pthread_mutex_lock(&L->mu);
    double t0 = strata_clock_mono_s();
    int rc = strata_store_leader_get(L->store, now, d);
    *latency_ms = (strata_clock_mono_s() - t0) * 1e3;
    pthread_mutex_unlock(&L->mu);
    if (rc == STRATA_OK && now->epoch != L->epoch)
        rc = strata_diag_set(d, STRATA_ESTATE, "%s leads the store (epoch %lld)", now->holder,
                             (long long)now->epoch);
    return rc;
}

void srv__lease_gauges(srv_lease *L, srv_lease_gauges *g)
{
    pthread_mutex_lock(&L->gmu);
    g->epoch = L->epoch;
    g->renewed_age_s = (double)(strata_clock_mono_ms() - L->renewed_ms) / 1e3;
    g->renew_s = L->renew_s;
    g->renew_failures = L->failures;
    pthread_mutex_unlock(&L->gmu);
}

void srv__lease_free(srv_lease *L)
{
    if (L == NULL)
        return;
    if (L->started) {
        pthread_mutex_lock(&L->mu);
        L->stopping = 1;
        pthread_cond_broadcast(&L->cv);
        pthread_mutex_unlock(&L->mu);
        pthread_join(L->thread, NULL);
    }
    strata_store_close(L->store);
    pthread_mutex_destroy(&L->mu);
    pthread_mutex_destroy(&L->gmu);
    pthread_cond_destroy(&L->cv);
    free(L);
}
