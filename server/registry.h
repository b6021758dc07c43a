/* The client registry's internals (registry.c): sorted id arrays and
 * start-up loading. Its public calls (srv_engine_register, _auth,
 * _admin_auth, _rate_take) are declared in engine.h.
 *
 * registry.c owns: registration, the token index, bearer parsing, the admin
 * token file, rate buckets, clients' last-seen times. It may call the store, request.h and
 * libstrata. */
#ifndef STRATA_SERVER_REGISTRY_H
#define STRATA_SERVER_REGISTRY_H

#include "engine.h"

#include <stddef.h>
#include <stdint.h>

/* Index of x in the ascending array v[0, n), or -1. */
ptrdiff_t srv__id_find(const uint64_t *v, size_t n, uint64_t x);

/* Sorts v[0, n) ascending. */
void srv__id_sort(uint64_t *v, size_t n);

/* Loads every registered client of the store into the registry, then reads
 * the admin token file (cfg admin_token_file, default STATE_DIR/admin.token),
 * creating it with a random token (mode 0600) on first start. Start-up only
 * (no lock). Errors: the store's and the file's, with diag;
 * STRATA_EINVAL for a token file whose first line is not a token of 16 to
 * 256 printable characters. */
int srv__registry_load(srv_engine *e, strata_diag *d);

/* Notes in memory that client_id was seen now (unknown ids are ignored).
 * Lock held; no store access, so the task path never waits on the disk. */
void srv__registry_seen(srv_engine *e, uint64_t client_id);

/* Writes the last-seen times noted since the previous flush to the store,
 * in one transaction; a failure is logged and retried at the next flush,
 * never an error of the caller. Lock held, no group commit in flight (the
 * round thread calls it when a round opens, and shutdown). */
void srv__registry_flush_seen(srv_engine *e);

/* Frees the registry's arrays. */
void srv__registry_cleanup(srv_engine *e);

#endif
