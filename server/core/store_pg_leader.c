/* The PostgreSQL backend's leadership: the leader row (epoch, holder,
 * lease expiry on the database server's clock), taking it, renewing it,
 * reading it. The fence itself, the epoch check at the start of every
 * write transaction of a leading connection, is in strata__pg_tx_begin.
 *
 * A leader also holds the store's session advisory lock while it can, and
 * the leader row says whether it did at its last renewal. A store that
 * gets the lock while the row says the leader holds it knows that the
 * leader's session ended (its process died or its connection was cut) and
 * takes over at once, unless the database server started after that
 * renewal: a restart ends every session, the leader's too, while the
 * leader itself may be alive and about to reconnect, so then it waits for
 * the lease to expire as for a leader that is paused or cut off (which
 * keeps its session but loses its lease). A store that gets the lock but
 * does not take over lets it go again, so that the leader takes it back at
 * its next renewal. A leader that took over from a paused one cannot have
 * the lock until that one's session ends: it tries again at each renewal,
 * and until it has it nobody takes over before its lease expires. */
#include "store_pg.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define PG_STR_(x) #x
#define PG_STR(x) PG_STR_(x)

/* Tries to take the session lock once (no-op when held). */
static int try_session_lock(pg_store *s, strata_diag *diag)
{
    if (s->session_lock)
        return STRATA_OK;
    PGresult *r = strata__pg_query(s,
                                   "SELECT pg_try_advisory_lock(" PG_STR(
                                       STRATA__PG_LOCK_PRIMARY) ", hashtext(current_schema()))",
                                   diag);
    if (r == NULL)
        return STRATA_EIO;
    s->session_lock = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    return STRATA_OK;
}

/* Lets the session lock go (a store that got it but does not lead). */
static void drop_session_lock(pg_store *s)
{
    strata_diag d;
    PGresult *r = strata__pg_query(s,
                                   "SELECT pg_advisory_unlock(" PG_STR(
                                       STRATA__PG_LOCK_PRIMARY) ", hashtext(current_schema()))",
                                   &d);
    if (r != NULL)
        s->session_lock = 0;
    PQclear(r);
}

/* Reads the leader row (in or out of a transaction): *locked, the leader
 * held the session lock at its last renewal; *restarted, the database
 * server started after that renewal. */
static int read_leader(pg_store *s, strata_store_leader *out, int *locked, int *restarted,
                       strata_diag *diag)
{
    memset(out, 0, sizeof(*out));
    *locked = 0;
    *restarted = 0;
    PGresult *r = strata__pg_run(s, P_LEADER_GET, NULL, 0, 1, "read the leader", diag);
    if (r == NULL)
        return STRATA_EIO;
    if (PQntuples(r) > 0) {
        out->epoch = strata__pg_col_int(r, 0, 0);
        snprintf(out->holder, sizeof(out->holder), "%s", PQgetvalue(r, 0, 1));
        out->expires_in_ms = strata__pg_col_int(r, 0, 2);
        *locked = strcmp(PQgetvalue(r, 0, 3), "t") == 0;
        *restarted = strcmp(PQgetvalue(r, 0, 4), "t") == 0;
        out->lock_held = strcmp(PQgetvalue(r, 0, 5), "t") == 0;
    }
    PQclear(r);
    return STRATA_OK;
}

int strata__pg_lead(strata_store *base, const char *holder, int64_t lease_ms,
                    strata_store_leader *out, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    int rc = try_session_lock(s, diag);
    if (rc < 0)
        return rc;
    int64_t fenced = s->epoch;
    s->epoch = 0; /* deciding now; no fence on this transaction */
    if ((rc = strata__pg_tx_begin(s, diag)) < 0) {
        s->epoch = fenced;
        return rc;
    }
    strata_store_leader cur;
    int locked = 0, restarted = 0;
    rc = read_leader(s, &cur, &locked, &restarted, diag);
    int mine = rc == STRATA_OK && fenced > 0 && cur.epoch == fenced;
    /* Its session ended: the row says it held the lock, now we do, and no
     * restart of the database server ended it. */
    int gone = locked && s->session_lock && !restarted;
    if (rc == STRATA_OK && !mine && cur.epoch > 0 && cur.expires_in_ms > 0 && !gone) {
        *out = cur;
        rc = strata_diag_set(diag, STRATA_ESTATE,
                             "%s leads the store (epoch %" PRId64 ", its lease runs %" PRId64
                             " ms more)",
                             cur.holder, cur.epoch, cur.expires_in_ms);
    }
    int64_t epoch = mine ? fenced : cur.epoch + 1;
    if (rc == STRATA_OK) {
        pg_params p = {.n = 0};
        strata__pg_int(&p, epoch);
        strata__pg_text(&p, holder);
        strata__pg_int(&p, lease_ms);
        strata__pg_text(&p, s->session_lock ? "true" : "false");
        rc = strata__pg_exec(s, P_LEADER_SET, &p, "take the lead", diag);
    }
    if (rc == STRATA_OK)
        rc = read_leader(s, out, &locked, &restarted, diag);
    if (rc == STRATA_OK)
        rc = strata__pg_tx_commit(s, diag);
    if (rc < 0) {
        strata__pg_tx_rollback(s);
        s->epoch = fenced;
        if (rc == STRATA_ESTATE && s->session_lock)
            drop_session_lock(s);
        return rc;
    }
    s->epoch = epoch;
    snprintf(s->holder, sizeof(s->holder), "%s", holder);
    return STRATA_OK;
}

int strata__pg_renew(strata_store *base, int64_t lease_ms, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    if (s->epoch <= 0)
        return strata_diag_set(diag, STRATA_ESTATE, "renew: this store does not lead");
    int rc = try_session_lock(s, diag);
    if (rc == STRATA_OK)
        rc = strata__pg_tx_begin(s, diag); /* fails "fenced" when another took over */
    if (rc < 0)
        return rc;
    pg_params p = {.n = 0};
    strata__pg_int(&p, s->epoch);
    strata__pg_int(&p, lease_ms);
    strata__pg_text(&p, s->session_lock ? "true" : "false");
    rc = strata__pg_exec(s, P_LEADER_RENEW, &p, "renew the lease", diag);
    return strata__pg_tx_end(s, rc, diag);
}

int strata__pg_leader_get(strata_store *base, strata_store_leader *out, strata_diag *diag)
{
    int locked, restarted;
    return read_leader((pg_store *)base, out, &locked, &restarted, diag);
}
