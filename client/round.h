/* One round of the client: download the task's model (ETag-cached in the
 * state directory), train on the client's share, apply error feedback and
 * the task's budgets, encode the payload, stage it in the state directory
 * and upload it; and, after a restart, settle an upload a previous run
 * staged. */
#ifndef STRATA_CLIENT_ROUND_H
#define STRATA_CLIENT_ROUND_H

#include "state.h"
#include "transport.h"

#include "strata/data.h"
#include "strata/error.h"
#include "strata/task.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* What a round needs, all borrowed for the round's duration. */
typedef struct strata_client_round_ctx {
    strata_http *http;
    strata_client_state *state;
    const strata_client_identity *id;
    const strata_dataset *data;
    const size_t *mine; /* indices of the client's share of data */
    size_t nmine;
    uint64_t client_index;       /* seeds the client's shuffling stream */
    double ef_beta;              /* residual decay per missed round, (0, 1] */
    uint32_t ef_max_staleness;   /* 0: never drop */
    int progress;                /* draw a progress bar on standard error */
    volatile sig_atomic_t *stop; /* non-zero: abandon after the batch in progress */
} strata_client_round_ctx;

/* How the coordinator answered an upload. */
typedef enum {
    STRATA_CLIENT_ACKED = 0,   /* acknowledged: receipt recorded, residuals installed */
    STRATA_CLIENT_REFUSED = 1, /* refused: the update and its residuals are dropped */
    STRATA_CLIENT_SKIPPED = 2  /* no usable update (not finite): the coordinator was told,
                                  the residuals start afresh */
} strata_client_upload;

/* Runs task t (borrowed) to its upload; *result (zeroed on entry) says how
 * the coordinator answered. Logs what it did and why it failed. Errors:
 * STRATA_ESTATE when stopped, those of the transport (the staged upload is
 * then kept for the next start), STRATA_EPROTO (the model does not fit the
 * task), and those of training, compression, encoding and staging. */
int strata_client_round_run(const strata_client_round_ctx *c, const strata_task *t,
                            strata_client_upload *result);

/* At start-up: re-sends the upload a previous run staged, if any, and
 * settles it. *settled (zeroed on entry) is 1 when there was one, with its
 * answer in *result. Errors: those of the transport (the stage is kept). */
int strata_client_round_settle(const strata_client_round_ctx *c, int *settled,
                               strata_client_upload *result);

#endif
