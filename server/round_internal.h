/* The open round's structure, shared by round.c, close.c and resume.c
 * alone (see round.h), and the helpers they lend each other.
 *
 * Locking: the engine lock (c.mu) guards every field. The round thread is
 * the only one that opens, closes and resets rounds; while it closes one
 * (close_busy) it drops the lock to read the round's stored updates,
 * aggregate, step, evaluate, save and record the close; closing = 1 keeps
 * uploads and skips of that round out meanwhile, so selected, reported,
 * norms, nreported, nskipped, budgets, cands, uplink and agg do not change
 * and the round thread reads them without the lock. downlink keeps being
 * counted under the lock. A close that failed for a reason that can pass
 * keeps closing = 1 and is retried (close_failures, close_retry_ms), as is
 * an open that failed (open_failures, open_retry_ms). */
#ifndef STRATA_SERVER_ROUND_INTERNAL_H
#define STRATA_SERVER_ROUND_INTERNAL_H

#include "round.h"

#include "aggregate.h"

#include "strata/summary.h"

struct srv_rounds {
    srv_rounds_config c;
    uint32_t next_round; /* the open round, or the next to open */
    int open, closing, finished;
    int stopped;             /* finished by an operator's stop */
    int close_busy;          /* a close attempt is running (the lock may be dropped) */
    unsigned close_failures; /* failed close attempts of the open round */
    int64_t close_retry_ms;  /* monotonic time of the next attempt */
    unsigned open_failures;  /* failed attempts at opening next_round */
    int64_t open_retry_ms;   /* monotonic time of the next one */
    uint64_t *selected;      /* ascending */
    size_t nselected;
    uint8_t *reported; /* per selected client: SRV_REPORT_* */
    double *norms;     /* per selected client: its update's L2 norm (FedAvg, as it
                          streamed in; robust rules measure at close) */
    size_t nreported;  /* selected clients whose update was accepted */
    size_t nskipped;   /* selected clients that said they cannot contribute */
    size_t enough;     /* updates that close the round before its deadline */
    strata_budget *budgets;
    strata_budget *cands; /* the task's error-table candidates (lgreco), or NULL */
    size_t ncands;
    char *task_json;
    uint64_t version;   /* the model version the open round's task is for */
    size_t stored_seen; /* the open round's stored updates (in acceptance order)
                           that srv__round_adopt or _mirror_updates went through */
    int64_t opened_ms, deadline_ms;
    /* Bodies of the open round: uplink its accepted updates; downlink the
     * model bodies sent since the last round's summary was stored (a client
     * that fetches after the round it was asked for closed, or before the
     * next one opens, counts in the next round). */
    uint64_t uplink, downlink;
    strata_agg *agg; /* FedAvg's streaming aggregate (unused by robust rules) */
};

/* Forgets the open round's state (selection, task, aggregate, uplink);
 * downlink bytes stay. Lock held. */
void srv__round_reset(srv_rounds *R);

/* The stored summary of the open round before its statistics exist. Lock
 * held (or the round thread while it closes the round). */
strata_round_summary srv__round_summary_of_open(const srv_rounds *R);

/* Encodes a round summary with the summary codec (strata/summary.h). When
 * s->has_densities, the densities of the open round's budgets are filled
 * in under the model's layer names, and, when lg is not NULL (the close
 * solved an lgreco table), the lgreco part. s's layer fields are left
 * empty again on return. *out is a new string (free()). Errors: as
 * strata_round_summary_encode. Lock held, or the round thread. */
int srv__round_summary_text(const srv_rounds *R, strata_round_summary *s, const srv_budgets *lg,
                            char **out, strata_diag *d);

/* The wait before the next attempt at a close or an open that failed,
 * after k earlier failures: 1, 2, 4, 8, 16, then 30 seconds (in ms). */
int64_t srv__retry_backoff_ms(unsigned k);

#endif
