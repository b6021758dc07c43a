/* The compressed downlink on the coordinator (downlink.c; docs/algorithm.md,
 * "Downlink"): with --downlink other than none, the model the clients hold
 * (x̂) beside the server's model x, one delta payload per closed round with
 * the server's residual x - x̂ carried to the next, the files that make
 * both durable with the checkpoint, the pruning of old deltas, and the
 * check that version 0 is the seeded initialisation (its recipe).
 *
 * downlink.c owns x̂, its copy before a close's step and the delta being
 * made in its own structure (srv_downlink); x is borrowed from the round
 * thread's close. Like x, they are touched only by start-up and the round
 * thread, without the engine lock. Without --downlink the structure holds
 * nothing and the served model is x.
 *
 * May call: the store (paths), libstrata (downlink, checkpoint,
 * safetensors, payload, recipe, fileio, log). */
#ifndef STRATA_SERVER_DOWNLINK_H
#define STRATA_SERVER_DOWNLINK_H

#include "store.h"

#include "strata/compress.h"
#include "strata/downlink.h"
#include "strata/model.h"

#include <stddef.h>
#include <stdint.h>

typedef struct srv_downlink srv_downlink;

/* What the downlink is given at start-up (copied; pointers borrowed). */
typedef struct srv_downlink_config {
    int on;                      /* --downlink other than none */
    const char *name;            /* --downlink as given (for the log) */
    const strata_budget *budget; /* the deltas' compressor */
    long seed;                   /* --seed */
    long keep;                   /* --downlink-keep */
    strata_store *store;         /* paths only */
} srv_downlink_config;

/* Start-up, after the model x (borrowed for the downlink's lifetime) of
 * version `version` is loaded: with --downlink, loads x̂ from the version's
 * checkpoint and the server's model x from its file beside it (x = x̂ when
 * there is none: a federation that starts, or turns --downlink on).
 * Errors: those of the checkpoint and safetensors readers; STRATA_EINVAL for
 * an x of another layout; STRATA_ENOMEM. */
int srv__downlink_new(const srv_downlink_config *c, strata_model *x, uint64_t version,
                      srv_downlink **out, strata_diag *d);

/* Frees dl. Accepts NULL. */
void srv__downlink_free(srv_downlink *dl);

/* The model the clients download and train from: x̂ with --downlink, else
 * x (borrowed). */
strata_model *srv__downlink_served(const srv_downlink *dl);

/* x̂ with --downlink, else NULL. */
strata_model *srv__downlink_xhat(const srv_downlink *dl);

/* Start-up: when version 0's checkpoint is exactly seeded (the seeded
 * initialisation: same architecture, normalisation and digest) and the
 * deltas from version 0 are all on disk (current version `version`), sets
 * *recipe (a new JSON text, *len bytes) to its recipe; logs which. A state
 * directory whose version 0 differs leaves *recipe NULL: clients take
 * snapshots. Always NULL without --downlink. Errors: STRATA_ENOMEM (a
 * failed check is not an error). */
int srv__downlink_recipe(srv_downlink *dl, const strata_model *seeded, uint64_t version,
                         char **recipe, size_t *len, strata_diag *d);

/* Closing round r into version v, after the server step moved x: with
 * --downlink, compresses x - x̂ into the delta payload (kept until
 * srv__downlink_write or srv__downlink_rollback) and moves x̂ (its old
 * values kept). In every case the served model's digest goes to digest.
 * Round thread, without the lock. On error x̂ is put back. */
int srv__downlink_step(srv_downlink *dl, uint32_t r, uint64_t v,
                       char digest[STRATA_DIGEST_HEX_SIZE], strata_diag *d);

/* After the step and the evaluation of x̂ (xhat_acc) and x (x_acc): writes
 * the delta and x to their files durably and logs the round's downlink.
 * No-op without --downlink. Round thread, without the lock. Errors: the
 * file writers'; the caller then calls srv__downlink_rollback. */
int srv__downlink_write(srv_downlink *dl, uint32_t r, uint64_t v, double xhat_acc, double x_acc,
                        strata_diag *d);

/* Puts x̂ back after a close that did not commit and forgets the delta
 * (no-op without --downlink). */
void srv__downlink_rollback(srv_downlink *dl);

/* After version v committed: forgets the delta, then removes x of the
 * version before and the delta that fell out of the kept window
 * (v - downlink_keep), or with --downlink-keep 0 every delta that no chain
 * ending at v smaller than the zstd snapshot (snapshot bytes), and of at
 * most STRATA_DOWNLINK_MAX_CHAIN deltas, can hold. Round thread, without
 * the lock (file removals). */
void srv__downlink_prune(srv_downlink *dl, uint64_t v, size_t snapshot);

#endif
