/* The store's backends as the tests use them (test_store_conformance.c):
 * each makes a fresh store in a new temporary location, opens the store at
 * that location again (after a close, or after the process that had it open
 * was killed), opens a secondary connection, and removes the location.
 *
 * A location is one malloc'ed string, meaningful to its backend only:
 *
 *   sqlite       the state directory, under $TMPDIR
 *   postgresql   "<schema> <directory>": a schema of the database that
 *                $STRATA_TEST_PG_URL names, made for this store alone
 *                (sc_<pid>_<n>; its name has no space), and the state
 *                directory under $TMPDIR for the files outside the
 *                database (everything after the first space)
 *
 * A location is plain bytes, so a child forked by the test opens the store
 * at its parent's location as the parent does. */
#ifndef STRATA_TEST_STORE_BACKENDS_H
#define STRATA_TEST_STORE_BACKENDS_H

#include "store.h"

typedef enum {
    STORE_FRESH,    /* a new, empty store in a new temporary location: *loc is set (malloc'ed) */
    STORE_REOPEN,   /* the primary connection of the store at *loc, again */
    STORE_SECONDARY /* another connection to primary's store */
} store_open_how;

typedef struct store_backend {
    const char *name; /* what strata_store_backend answers */
    /* NULL when the backend can run here, else why not (static). */
    const char *(*unmet)(void);
    /* Opens a connection as `how` says into *out; primary is only used by
     * STORE_SECONDARY, loc by STORE_FRESH (set) and STORE_REOPEN (read).
     * STORE_FRESH may set *loc even when the open fails: remove it then. */
    int (*open)(store_open_how how, char **loc, const strata_store *primary, strata_store **out,
                strata_diag *diag);
    /* Removes everything at loc (no connection is open) and frees loc.
     * Accepts NULL. */
    void (*remove)(char *loc);
    /* 1 when connections of one store may compete for its leadership
     * (strata_store_lead): PostgreSQL; SQLite's one opener always leads. */
    int rivals;
    /* 1 when the store keeps a version's files itself and the state
     * directory is only a cache (strata_store_file_fetch): PostgreSQL. */
    int files_kept;
    /* 1 when the store sends change notifications to its listeners
     * (strata_store_changes_listen): PostgreSQL. */
    int notifies;
} store_backend;

/* Every backend: SQLite, then PostgreSQL (which needs STRATA_TEST_PG_URL,
 * a libpq connection string or URI of a database where it may create and
 * drop schemas; tests/unit/with_postgres.sh runs a command with one set). */
#define STORE_N_BACKENDS 2
extern const store_backend STORE_BACKENDS[STORE_N_BACKENDS];

/* PostgreSQL only, for the tests of what that backend alone has (its
 * schema and migrations, test_store_pg.c): a fresh location whose schema
 * is empty (no store in it yet; open it with the backend's STORE_REOPEN),
 * SQL run at a location (the statements in one transaction, the
 * location's schema first on the search path), and the first column of
 * the first row of a query there as text into buf[n] ("" for NULL or no
 * row). */
int store_pg_fresh_location(char **loc, strata_diag *diag);
int store_pg_exec_at(const char *loc, const char *sql, strata_diag *diag);
int store_pg_query_at(const char *loc, const char *sql, char *buf, size_t n, strata_diag *diag);

/* The backend called name, or NULL. */
const store_backend *store_backend_find(const char *name);

#endif
