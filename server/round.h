/* The round lifecycle's internals (round.c and close.c). Their public calls
 * (srv_engine_task, srv_engine_skip, srv_engine_waiter_gone) are declared
 * in engine.h.
 *
 * round.c owns: client selection (live clients first, stragglers benched),
 * opening a round (its task), skips, the round thread, resuming the open
 * round after a restart, and the parked long-polls (waiters). It owns the
 * two wire documents the coordinator stores about a round: the task JSON
 * and the round summary JSON, each built by one function and parsed by one
 * function here. close.c owns closing a round: when it is due, the
 * screening and quarantine of outlying updates, aggregation, the server
 * optimiser's step, the finiteness checks, too few updates, checkpoint,
 * evaluation, summary, stragglers, retries of a close that failed. Both may
 * call the store, aggregate.h, robust.h, models.h (to install a new
 * version), metrics.h and libstrata. */
#ifndef STRATA_SERVER_ROUND_H
#define STRATA_SERVER_ROUND_H

#include "engine.h"
#include "strata/summary.h"

#include <stddef.h>
#include <stdint.h>

struct json_t;

/* Encodes a round summary with the summary codec (strata/summary.h). When
 * s->has_densities, the densities of the open round's budgets (lock held)
 * are filled in under the model's layer names; s's layer fields are left
 * empty again on return. *out is a new string (free()). Errors: as
 * strata_round_summary_encode. */
int srv__summary_text(const srv_engine *e, strata_round_summary *s, char **out, strata_diag *d);

/* What the counters and gauges need to know of a stored round summary. */
typedef struct srv_summary_facts {
    int stopped;                   /* closed unaggregated by an operator */
    int failed;                    /* closed without a new model */
    size_t quarantined_norm;       /* updates quarantined by the screening rule */
    size_t quarantined_non_finite; /* ... and to keep the result finite */
    int evaluated;                 /* the model was evaluated: the next four are set */
    double accuracy, loss;
    size_t eval_samples; /* 0 in summaries written before the key existed */
    uint64_t duration_ms;
} srv_summary_facts;

/* Reads *f from a stored summary text (zeroed on error). Errors: as
 * strata_round_summary_decode. */
int srv__summary_facts(const char *text, srv_summary_facts *f);

/* Resumes the state directory's rounds at start-up: an open round whose
 * model version is older than the latest checkpoint was aggregated before a
 * crash and is closed (summary marked recovered); otherwise its task and
 * selection are restored and its acknowledged updates replayed in the order
 * they were accepted (into the FedAvg aggregate; a robust rule reads them
 * at close). Then counts rounds completed and updates accepted from the
 * store. Start-up only. Errors: the store's, STRATA_EPROTO (unreadable
 * task), STRATA_ENOMEM. */
int srv__round_resume(srv_engine *e, strata_diag *d);

/* Closes the open round without aggregating it (admin stop); no-op when
 * none is open. Lock held. Errors: the store's. */
int srv__round_abandon(srv_engine *e, strata_diag *d);

/* The summary of the open round as far as it is known (no statistics).
 * Lock held. */
strata_round_summary srv__summary_of_open(const srv_engine *e);

/* The wait before the next attempt at a close or an open that failed,
 * after k earlier failures: 1, 2, 4, 8, 16, then 30 seconds (in ms). */
int64_t srv__retry_backoff_ms(unsigned k);

/* 1 when the open round should be closed now (close.c): every selected
 * client answered, enough updates arrived (over-selection), or the deadline
 * passed; for a round whose close failed, when its retry is due. Never
 * while a group commit is in flight. Lock held. */
int srv__round_ready_to_close(const srv_engine *e, int64_t now);

/* Closes the open round (close.c). Called by the round thread with the lock
 * held; drops it for everything but the store's records (uploads for the
 * round are refused meanwhile). The model moves on only when the store has
 * recorded the close; otherwise it is put back, the round stays closing and
 * the close is tried again later with the same updates on the same
 * model. */
void srv__round_close(srv_engine *e);

/* Forgets the open round's state (selection, task, aggregate). Lock held. */
void srv__round_reset(srv_engine *e);

/* Wakes every parked connection. Lock held. */
void srv__waiters_wake_all(srv_engine *e);

/* The round thread: opens a round once min_clients are registered (unless
 * paused or finished), closes it when ready, wakes expired waiters; runs
 * until e->stopping. arg is the engine. */
void *srv__round_thread(void *arg);

#endif
