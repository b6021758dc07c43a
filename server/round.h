/* The round lifecycle's internals (round.c). Its public calls
 * (srv_engine_task, srv_engine_waiter_gone) are declared in engine.h.
 *
 * round.c owns: client selection, opening a round (its task), the deadline,
 * closing (aggregation orchestration, the server optimiser's step,
 * checkpoint, evaluation, summary), resuming the open round after a
 * restart, the round thread, and the parked long-polls (waiters). It owns
 * the two wire documents the coordinator stores about a round: the task
 * JSON and the round summary JSON, each built by one function and parsed by
 * one function here. It may call the store, aggregate.h, robust.h,
 * models.h (to install a new version), metrics.h and libstrata. */
#ifndef STRATA_SERVER_ROUND_H
#define STRATA_SERVER_ROUND_H

#include "engine.h"

#include <stdint.h>

struct json_t;

/* The summary of a round, as stored when it closes and as the read views
 * show it. Which keys it has: round, state, model_version, selected,
 * participants always; then either the statistics (has_stats: accuracy and
 * loss, or nulls without has_eval; uplink, downlink and dense uplink bytes,
 * duration; densities when with_densities) or one marker (stopped: closed
 * by an operator without aggregation; recovered: closed at start-up after a
 * crash that followed its aggregation). */
typedef struct srv_round_summary {
    uint32_t round;
    const char *state; /* "open" or "closed"; static */
    uint64_t model_version;
    uint64_t selected, participants;
    int has_stats, has_eval, with_densities;
    double accuracy, loss;
    uint64_t uplink, downlink, dense_uplink;
    int64_t duration_ms;
    int stopped, recovered;
} srv_round_summary;

/* The summary as a new JSON object (densities from the open round's
 * budgets, so lock held when with_densities). NULL when out of memory. */
struct json_t *srv__summary_json(const srv_engine *e, const srv_round_summary *s);

/* Reads what start-up needs back from a stored summary text: *stopped is 1
 * when an operator stopped the round. Errors: STRATA_EPROTO (not a JSON
 * object). */
int srv__summary_parse(const char *text, int *stopped);

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

/* Forgets the open round's state (selection, task, aggregate). Lock held. */
void srv__round_reset(srv_engine *e);

/* Wakes every parked connection. Lock held. */
void srv__waiters_wake_all(srv_engine *e);

/* The round thread: opens a round once min_clients are registered (unless
 * paused or finished), closes it when ready, wakes expired waiters; runs
 * until e->stopping. arg is the engine. */
void *srv__round_thread(void *arg);

#endif
