/* Closing rounds (close.c and close_model.c): when the open round is due to
 * close, and closing it in steps. The closer owns the round thread's side
 * of the federation in its own structure (srv_close): the server's model x
 * (stepped in place by a close, put back from its copy unless the close
 * commits), the server optimiser and the copy of its state a close steps,
 * and the round thread's own store connection. Only start-up and the round
 * thread touch them.
 *
 * A close runs in steps (docs/architecture.md, "Closing a round"):
 *   begin     (lock held)    the round becomes closing: its uploads are
 *                            refused from here on, so its updates are final;
 *   screen, aggregate, evaluate
 *             (no lock)      quarantine outlying updates by their norms,
 *                            aggregate the kept ones, step the model,
 *                            evaluate it (eval.h) and check it is finite,
 *                            leaving out the largest updates until it is;
 *                            the lgreco solve; the downlink step and the
 *                            evaluation of x̂;
 *   commit    (no lock)      the checkpoint, the optimiser's state, the
 *                            downlink files, the encoded model, then the
 *                            store's records on the round thread's own
 *                            connection;
 *   apply     (lock held)    memory only: the new version published
 *                            (models.h), the round reset and the next one
 *                            due, or, after a failure, the model put back
 *                            and a retry planned;
 *   announce  (no lock)      the progress lines on stdout, the log lines,
 *                            old downlink files removed, counters saved.
 * Polls and uploads for the next round never wait for the disk or for an
 * evaluation of a close: the lock is held only for the memory steps.
 *
 * May call: the store, aggregate.h, robust.h, eval.h, downlink.h,
 * models.h, budgets.h and lgreco.h, registry.h (stragglers), metrics.h,
 * waiters.h, round_internal.h and libstrata. */
#ifndef STRATA_SERVER_CLOSE_H
#define STRATA_SERVER_CLOSE_H

#include "budgets.h"
#include "downlink.h"
#include "eval.h"
#include "metrics.h"
#include "models.h"
#include "registry.h"
#include "round.h"
#include "waiters.h"

#include "robust.h"

#include "strata/model.h"
#include "strata/payload.h"

#include <stddef.h>
#include <stdint.h>

typedef struct srv_close srv_close;

/* What the closer is given at start-up (copied; pointers borrowed). */
typedef struct srv_close_config {
    long rounds, min_updates, straggler_rounds;
    strata_robust_method method;
    double trim_fraction, clip_norm, screen_factor;
    const char *server_opt; /* --server-opt */
    double server_lr;       /* 0: the optimiser's default */
    double server_lr_final;
    size_t total_params;
    strata_payload_limits limits;
    strata_store *store; /* the round thread's own connection: used without the lock */
    srv_eval *eval;
    srv_downlink *downlink;
    srv_models *models;
    srv_budgets *budgets;
    srv_registry *reg;
    srv_metrics *met;
    srv_waiters *waiters;
} srv_close_config;

/* Takes the model x of model version `version` and makes the server
 * optimiser, with its state saved beside that version when there is one,
 * and the copies a close steps. Start-up. Errors: the optimiser's (its
 * name, its file), STRATA_ENOMEM; *out is NULL and x freed on error. */
int srv__close_new(const srv_close_config *c, strata_model *x, uint64_t version, srv_close **out,
                   strata_diag *d);

/* Frees C and the model. Accepts NULL. */
void srv__close_free(srv_close *C);

/* The server's model x (borrowed: its layout never changes; its values
 * belong to the round thread). */
strata_model *srv__close_model(const srv_close *C);

/* 1 when the open round should be closed now: every selected client
 * answered, enough updates arrived (over-selection), or the deadline
 * passed; for a round whose close failed, when its retry is due. The
 * caller checks that no group commit is in flight. Lock held. */
int srv__close_due(const srv_rounds *R, int64_t now);

/* Closes the open round in the steps above. Called by the round thread
 * with the lock held; returns with it held, having dropped it for every
 * step but begin and apply. The model moves on only when the store has
 * recorded the close; otherwise it is put back, the round stays closing
 * and the close is tried again later with the same updates on the same
 * model. */
void srv__close_round(srv_close *C, srv_rounds *R);

#endif
