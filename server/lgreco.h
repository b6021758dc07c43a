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

/* Checks the error table of an upload's metadata (meta, NUL-terminated JSON
 * object, may be NULL) against the open round: exactly e->nlayers rows of
 * e->ncands finite numbers >= 0 when the task asked for one (e->ncands >
 * 0), no "error_table" key otherwise. When table is not NULL it receives
 * the rows (nlayers x ncands). Returns 0, or STRATA_EPROTO with the reason
 * in msg. No lock needed for the parse; e->ncands is read. */
int srv__lgreco_table(const srv_engine *e, size_t ncands, const char *meta, double *table,
                      char *msg, size_t mlen);

/* At the close of round r, which asked for tables: the sample-weighted mean
 * of the tables of the n updates (client ids, weights; those with kept[i]
 * == 0 are left out), read from the store, solved by the policy. Called
 * without the lock (the round's updates are final). Sets e->lg_solved.
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
