/* strata-sim's internal modules: round summaries as the sim reads them
 * (summary.c), following a run through the coordinator's REST API
 * (follow.c) and the report built from the coordinator's store (report.c). */
#ifndef STRATA_SIM_H
#define STRATA_SIM_H

#include "strata/error.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* ---- round summaries (summary.c) ---------------------------------------- */

/* One round's summary as GET /v1/rounds and the store's round records give
 * it (schemas/api.md). Fields a summary leaves out are 0 (a round an
 * operator stopped has no metrics). */
typedef struct sim_summary {
    uint32_t round;
    int closed;  /* state "closed" (else "open") */
    int stopped; /* closed by an operator without aggregation */
    long participants;
    double accuracy, loss;
    double uplink_bytes, downlink_bytes, dense_uplink_bytes, duration_ms;
    size_t ndensities;    /* per-layer densities, in the summary's order */
    char **density_names; /* malloc'ed */
    double *densities;
} sim_summary;

/* Most bytes of one summary's or one page of summaries' JSON text. */
#define SIM_SUMMARY_MAX_JSON ((size_t)16 << 20)

void sim_summary_init(sim_summary *s);
void sim_summary_cleanup(sim_summary *s);

/* Decodes one summary from len bytes of JSON text into *out (initialised
 * here; clean it up even on error). Errors: STRATA_ETOOBIG above
 * SIM_SUMMARY_MAX_JSON, STRATA_EPROTO for text that is not JSON or a
 * summary with a missing or mistyped field (diag says which),
 * STRATA_ENOMEM. */
int sim_summary_decode(const char *text, size_t len, sim_summary *out, strata_diag *diag);

/* Decodes the body of GET /v1/rounds ({"rounds": [summary, ...]}) into a
 * new array *out of *n summaries (NULL and 0 on entry; release with
 * sim_summary_list_free, also after an error). Errors as above. */
int sim_summary_list_decode(const char *text, size_t len, sim_summary **out, size_t *n,
                            strata_diag *diag);
void sim_summary_list_free(sim_summary *list, size_t n);

/* ---- following a run (follow.c) ----------------------------------------- */

typedef enum {
    SIM_RUN_WAITING = 0,
    SIM_RUN_RUNNING,
    SIM_RUN_PAUSED,
    SIM_RUN_FINISHED,
    SIM_RUN_STOPPED
} sim_run_state;

/* Where the run stands, as of the last successful poll. */
typedef struct sim_progress {
    sim_run_state state;
    uint32_t total_rounds; /* the run's length */
    uint32_t next;         /* the first round not yet seen closed */
    uint32_t completed;    /* closed rounds that were aggregated */
    int polled;            /* 1 once a poll succeeded */
} sim_progress;

typedef struct sim_follow sim_follow;

/* Called once per newly closed, aggregated round, in round order. s is
 * borrowed for the call. */
typedef void (*sim_round_fn)(void *ud, const sim_summary *s, uint32_t total_rounds);

/* Follows the coordinator at url ("http://127.0.0.1:PORT"). stop (borrowed,
 * may be NULL) aborts requests when it becomes non-zero. Errors: those of
 * strata_http_new. */
int sim_follow_new(const char *url, volatile sig_atomic_t *stop, sim_follow **out,
                   strata_diag *diag);
void sim_follow_free(sim_follow *f);

/* One poll: GET /v1/status, then GET /v1/rounds for the rounds closed since
 * the last poll, calling fn for each aggregated one. Errors: STRATA_EIO when
 * the coordinator does not answer, STRATA_EPROTO for an unexpected status
 * code or body, STRATA_ESTATE when stopped, STRATA_ETOOBIG, STRATA_ENOMEM;
 * the progress then stays as it was, less any rounds already reported. */
int sim_follow_poll(sim_follow *f, sim_round_fn fn, void *ud, strata_diag *diag);

/* The progress as of the last poll (borrowed from f). */
const sim_progress *sim_follow_progress(const sim_follow *f);

/* The name of a state as GET /v1/status spells it. */
const char *sim_run_state_name(sim_run_state s);

/* ---- the report (report.c) ---------------------------------------------- */

/* What the report's header states about the run (borrowed strings). */
typedef struct sim_run_info {
    long clients, rounds, seed;
    const char *model, *partition, *policy, *density, *values;
} sim_run_info;

/* Reads every round record of the coordinator's store in state_dir (the
 * coordinator must have exited) and writes out_dir/report.csv and
 * out_dir/report.md; logs a one-line summary and, when json is set, prints
 * the JSON summary as the last line of standard output. Errors:
 * STRATA_EIO when the store cannot be read or a report file cannot be
 * written (logged), or the store's errors. */
int sim_report_write(const char *state_dir, const char *out_dir, const sim_run_info *info,
                     int json);

#endif
