/* strata-sim's internal modules: pages of round summaries (summary.c), following a run through the
 * coordinator's REST API (follow.c) and the report built from the coordinator's store (report.c).
 */
#ifndef STRATA_SIM_H
#define STRATA_SIM_H

#include "strata/error.h"
#include "strata/summary.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* ---- round summaries (summary.c) ---------------------------------------- */

/* Most bytes of one page of GET /v1/rounds. */
#define SIM_ROUNDS_MAX_JSON ((size_t)16 << 20)

/* Decodes the body of GET /v1/rounds ({"rounds": [summary, ...]}, len
 * bytes) into a new array *out of *n summaries, each through
 * strata_round_summary_decode (NULL and 0 on entry; release with
 * sim_summary_list_free, also after an error). Errors: STRATA_ETOOBIG above
 * SIM_ROUNDS_MAX_JSON, STRATA_EPROTO for a body that is not such an object
 * or a summary the decoder refuses (diag says which), STRATA_ENOMEM. */
int sim_summary_list_decode(const char *text, size_t len, strata_round_summary **out, size_t *n,
                            strata_diag *diag);
void sim_summary_list_free(strata_round_summary *list, size_t n);

/* A summary's accuracy or loss for display: 0 when it is unknown (NaN). */
double sim_summary_metric(double v);

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
typedef void (*sim_round_fn)(void *ud, const strata_round_summary *s, uint32_t total_rounds);

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
    long data_shares; /* the coordinator's --data-shares; 0: none */
    const char *model, *partition, *policy, *density, *values;
} sim_run_info;

/* Reads every round record of the coordinator's store in state_dir (the
 * coordinator must have exited) and writes out_dir/report.csv and
 * out_dir/report.md (with info->data_shares, also a table of the clients:
 * each one's data share and accepted updates); logs a one-line summary and, when json is set,
 * prints the JSON summary as the last line of standard output. Errors: STRATA_EIO when the store
 * cannot be read or a report file cannot be written (logged), or the store's errors. */
/* Checks that state_dir holds a coordinator's store (its database exists)
 * and that no coordinator has it open, without creating or changing
 * anything there. Errors (logged): STRATA_ESTATE when there is no store,
 * the store's (STRATA_ESTATE when it is locked: a coordinator runs). */
int sim_report_check(const char *state_dir);

int sim_report_write(const char *state_dir, const char *out_dir, const sim_run_info *info,
                     int json);

#endif
