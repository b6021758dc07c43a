/* The coordinator's side of the lgreco policy (docs/algorithm.md "lgreco"):
 * which rounds ask the clients for error tables, the check of a table in an
 * upload's metadata, the solve when such a round closes, and putting the
 * last allocation back after a restart. */
#ifndef SRV_LGRECO_H
#define SRV_LGRECO_H

#include "engine_internal.h"

/* The error-table candidates of round r into a new array *out (*n entries;
 * NULL and 0 when the round asks for none: not lgreco, or r is not a
 * multiple of lgreco_every). Errors: STRATA_ENOMEM. */
int srv__lgreco_candidates(const srv_engine *e, uint32_t r, strata_budget **out, size_t *n);

/* What an upload's metadata holds of an error table, read once before the
 * engine lock is taken (srv__lgreco_scan) and checked against the open
 * round's task under it (srv__lgreco_check). */
typedef struct srv_lgreco_scan {
    int present;   /* an "error_table" key */
    size_t cols;   /* numbers per row (when well formed) */
    char bad[160]; /* why the table is malformed; "" when it is not */
} srv_lgreco_scan;

/* Reads the error table of an upload's metadata (meta, a NUL-terminated
 * JSON object, may be NULL) into *out: well formed is exactly nlayers rows
 * of one same number of finite numbers >= 0. No lock needed. */
void srv__lgreco_scan(const char *meta, size_t nlayers, srv_lgreco_scan *out);

/* Checks a scanned table against the open round's ncands candidates: a
 * well-formed table of ncands columns when ncands > 0, none otherwise.
 * Returns 0, or STRATA_EPROTO with the reason in msg. */
int srv__lgreco_check(const srv_lgreco_scan *s, size_t ncands, char *msg, size_t mlen);

/* Reads the error table of a stored update's metadata into table (nlayers x
 * ncands) with the checks of srv__lgreco_scan and srv__lgreco_check.
 * Returns 0, or STRATA_EPROTO with the reason in msg. */
int srv__lgreco_table(const srv_engine *e, size_t ncands, const char *meta, double *table,
                      char *msg, size_t mlen);

/* At the close of round r, which asked for tables: the tables of the n
 * updates (client ids, weights; those with kept[i] == 0 are left out), read
 * from the store and combined (one or two: their sample-weighted mean;
 * more: the coordinate-wise median, which one lying client cannot steer),
 * solved by the policy. A combined table the policy refuses (errors that
 * overflowed) keeps the last allocation, logged. Called without the lock
 * (the round's updates are final). Sets e->lg_solved when it solved.
 * Errors: those of reading the store, STRATA_ENOMEM. */
int srv__lgreco_solve(srv_engine *e, uint32_t r, const uint64_t *ids, const double *w,
                      const int *kept, size_t n, strata_diag *d);

/* Fills the lgreco part of a closed round's summary (the report and the
 * allocation of the next round, as specifications in specs, nlayers
 * entries of 64 bytes) when the round's close solved a table. */
void srv__lgreco_summary(const srv_engine *e, strata_round_summary *s, char (*specs)[64],
                         char **ptrs);

/* After a restart: puts back the allocation of the last round whose close
 * solved a table (its summary's "lgreco"), if any. Errors: the store's. */
int srv__lgreco_restore(srv_engine *e, strata_diag *d);

#endif
