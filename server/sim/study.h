/* strata-sim's studies, shared by study.c (the spec, the grid, running it)
 * and study_report.c (reading the runs' reports; study.csv, the plots,
 * report.md and report.html). Internal to strata-sim. */
#ifndef STRATA_SIM_STUDY_H
#define STRATA_SIM_STUDY_H

#include "sim.h"

#include <stddef.h>

#define MAX_KEYS 48
#define MAX_VALUES 64
#define MAX_RUNS 4096
#define MAX_ARGS (2 * MAX_KEYS + 8)
#define MAX_CSV_LINE ((size_t)1 << 20)

/* One key of the spec: a fixed value (n == 1, !axis) or an axis. */
typedef struct key {
    char *name;
    char *vals[MAX_VALUES];
    size_t n;
    int axis;
} key;

/* One round of a finished run, from its report.csv. */
typedef struct round_row {
    double acc, loss, up, down; /* acc and loss NaN: the round was not evaluated */
    double eval; /* test images behind acc and loss; 0: not evaluated or not reported */
    /* The model's accuracy after the round: acc, or the last evaluated
     * round's when this one was not evaluated (a round that closed without
     * a new model left it as it was); NaN before any evaluation. */
    double model_acc;
} round_row;

/* One run of the grid. */
typedef struct run {
    size_t pick[MAX_KEYS]; /* value index per key */
    char name[512];
    int done;
    round_row *rows;
    size_t nrows;
    char **layers; /* density column names, nlayers of them */
    size_t nlayers;
    double *dens; /* nrows * nlayers */
} run;

typedef struct study {
    key keys[MAX_KEYS];
    size_t nkeys;
    run *runs;
    size_t nruns;
    int k_policy, k_seed, k_density, k_values; /* key indices or -1 */
    const char *out;
} study;

/* A dense run (policy none) ignores density and value format: they are
 * pinned to their first value so that it runs once. */
int sim__study_is_dense(const study *s, const run *r);

/* How many of the study's runs have finished (r->done). */
size_t sim__study_done_count(const study *s);

/* Copies value into out (cap bytes) as a file-name fragment:
 * [A-Za-z0-9.+-] kept, anything else '-'; NULL (a flag) reads "on". */
void sim__study_fragment(char *out, size_t cap, const char *value);

/* Reads out/runs/NAME/report.csv into r (rows and per-layer densities).
 * Errors: STRATA_EIO when it cannot be opened, STRATA_EPROTO when its header
 * lacks a column, STRATA_ENOMEM. */
int sim__study_read_report(const study *s, run *r);

/* Writes out/study.csv, out/plots/, out/report.md and out/report.html from
 * the finished runs (r->done). Errors: STRATA_EIO, STRATA_ENOMEM. */
int sim__study_write_outputs(study *s, size_t nfailed);

#endif
