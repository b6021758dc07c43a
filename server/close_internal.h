/* One close attempt's job, shared by close.c (which fills its inputs and
 * runs the steps) and close_model.c (which screens, aggregates, steps and
 * evaluates) alone. Everything here runs on the round thread without the
 * engine lock. */
#ifndef STRATA_SERVER_CLOSE_INTERNAL_H
#define STRATA_SERVER_CLOSE_INTERNAL_H

#include "close.h"

#include "aggregate.h"

#include "strata/summary.h"
#include "strata/train.h"

/* One accepted update of the round being closed. */
typedef struct close_update {
    uint64_t client_id;
    double weight;     /* its sample count (FedAvg's weight) */
    double norm;       /* the L2 norm of its decoded values, before any clipping */
    int quarantined;   /* 0, or 1 + its strata_quarantine_reason */
    strata_payload *p; /* decoded (robust rules), else NULL */
} close_update;

/* One attempt at closing round `round`: what it works on (borrowed), its
 * updates in the order they were accepted, which of them the aggregate
 * leaves out, and the outcome. */
typedef struct close_job {
    /* inputs */
    uint32_t round;
    strata_store *store; /* the round thread's connection */
    const strata_payload_limits *limits;
    strata_robust_method method;
    double clip_norm, trim_fraction, screen_factor;
    strata_model *model;          /* x, stepped in place */
    strata_server_opt *opt;       /* the state before the step */
    strata_server_opt *opt_next;  /* stepped: a copy of opt's state */
    strata_tensor_list *rollback; /* x before the step */
    srv_eval *eval;
    const strata_agg *streamed; /* FedAvg's aggregate of the round */
    const uint64_t *selected;   /* the round's selection and its streamed norms */
    const double *norms;
    size_t nselected;
    /* the updates */
    close_update *u;
    size_t n;
    int all_streamed; /* FedAvg: streamed holds exactly these n updates */
    /* the outcome */
    double median; /* the median norm the screening compared with; NaN: not applied */
    strata_round_failure failed;
    char failure[256]; /* what was not finite, when failed */
    size_t last_kept;  /* updates the last attempt aggregated */
    strata_train_stats st;
    double agg_s;
    int impossible; /* the error is a state that retrying cannot mend */
} close_job;

/* Lists the round's accepted updates with their norms: FedAvg's were
 * measured as they streamed in; for a robust rule every update is read and
 * decoded here, once, and measured. Errors: the store's, the decoder's
 * (impossible), STRATA_ENOMEM. */
int srv__close_gather(close_job *j, strata_diag *d);

/* The screening rule (docs/algorithm.md, "Screening"): an update whose norm
 * is not finite is quarantined as non_finite; with screen_factor > 0 and at
 * least 3 finite norms whose median M is above 0, every update whose norm
 * is above screen_factor * M is quarantined as norm. Sets j->median (NaN
 * when the rule did not apply). Errors: STRATA_ENOMEM. */
int srv__close_screen(close_job *j, strata_diag *d);

/* Finds the round's new model: aggregates the updates the screening kept,
 * applies the server step to the model (in place) with opt_next, evaluates
 * it, checks that the aggregate, the model and its evaluation are finite,
 * and otherwise puts the model back from rollback and leaves out the
 * updates with the largest norms until they are, or none is left to leave
 * out: then the round fails (j->failed, the model unchanged, and only the
 * screening's quarantines stand). On success the model holds the new
 * parameters (rollback the old) and opt_next the new state. Errors: those
 * of the aggregation, the step and the evaluation, with the model put
 * back. */
int srv__close_find_model(close_job *j, strata_diag *d);

/* Updates the job keeps (not quarantined). */
size_t srv__close_kept(const close_job *j);

/* The quarantined updates of a job in ascending client id order, for the
 * summary (a new array, or NULL with *n = 0 when there are none; *nomem
 * when it could not be made). */
strata_round_quarantine *srv__close_quarantine_list(const close_job *j, size_t *n, int *nomem);

/* Frees the job's updates. */
void srv__close_job_cleanup(close_job *j);

#endif
