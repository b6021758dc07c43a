/* The coordinator's side of the lgreco policy (lgreco.c; docs/algorithm.md
 * "lgreco"; the candidates of a round are budgets.h's): the check of a
 * table in an upload's metadata, the solve when a round that asked for
 * tables closes, the lgreco part of its summary, and putting the last
 * allocation back after a restart. */
#ifndef SRV_LGRECO_H
#define SRV_LGRECO_H

#include "budgets.h"

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

/* At the close of round r, which asked for tables of ncands candidates:
 * the tables of the n updates (client ids, weights; those with kept[i] == 0
 * are left out), read from the store through s (a connection the caller may
 * use now; each payload decoded with lim) and combined (one or two: their
 * sample-weighted mean; more: the coordinate-wise median, which one lying
 * client cannot steer), solved by the policy. A combined table the policy
 * refuses (errors that overflowed) keeps the last allocation, logged.
 * *solved is 1 when the policy took a new allocation. Called without the
 * lock (the round's updates are final). Errors: those of reading the
 * store, STRATA_EPROTO (a stored table that is not one), STRATA_ENOMEM. */
int srv__lgreco_solve(srv_budgets *B, strata_store *s, const strata_payload_limits *lim, uint32_t r,
                      size_t ncands, const uint64_t *ids, const double *w, const int *kept,
                      size_t n, int *solved, strata_diag *d);

/* Fills the lgreco part of a closed round's summary when its close solved
 * a table: the report and the allocation of round next (the round after
 * it, or the last), as specifications in specs (nlayers entries of 64
 * bytes) pointed to by ptrs. */
void srv__lgreco_summary(const srv_budgets *B, uint32_t next, strata_round_summary *s,
                         char (*specs)[64], char **ptrs);

/* After a restart: puts back the allocation of the last round before
 * next_round whose close solved a table (its summary's "lgreco"), if any.
 * Errors: the store's. */
int srv__lgreco_restore(srv_budgets *B, strata_store *s, uint32_t next_round, strata_diag *d);

#endif
