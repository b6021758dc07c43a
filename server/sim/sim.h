/* strata-sim's internal modules: its options (options.c), pages of round
 * summaries (summary.c), following a run through the coordinator's REST API
 * (follow.c), the report built from the coordinator's store (report.c), the
 * per-client shards of the training set (shard.c), the output directory
 * (outdir.c), SVG plots (plot.c) and studies: grids of runs (study.c,
 * study_report.c, study.h), and the child processes (procs.c).
 */
#ifndef STRATA_SIM_H
#define STRATA_SIM_H

#include "strata/error.h"
#include "strata/log.h"
#include "strata/summary.h"

#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- options (options.c) ------------------------------------------------ */

/* Exit codes. */
enum { SIM_EXIT_OK = 0, SIM_EXIT_FAIL = 1, SIM_EXIT_USAGE = 2, SIM_EXIT_INTERRUPTED = 130 };

/* The number of options strata-sim passes through (to the coordinator or
 * to every client). */
#define SIM_NPASS 26

/* strata-sim's options (strings malloc'ed; sim_opts_cleanup frees them). */
typedef struct sim_opts {
    long clients, rounds, seed, deadline, data_shares;
    char *model, *data, *partition, *policy, *density, *values, *out, *study, *report_from;
    char *link_up, *link_down; /* tc rates ("1mbit"), NULL: no link limit */
    double target_accuracy;    /* 0: none */
    char *pass[SIM_NPASS];     /* the value of pass-through option i, NULL when not given */
    int json, resume;
    char *log_format_name, *log_level_name;
    strata_log_level log_level;
    strata_log_format log_format;
} sim_opts;

/* Parses the command line into *o (sim_opts_cleanup frees it, also after an
 * error); with --resume, the options saved in --out's run.json with the
 * command line's on top. Returns SIM_EXIT_OK (with *help set when --help was
 * answered, the usage on standard output), or SIM_EXIT_USAGE or
 * SIM_EXIT_FAIL after logging what is wrong. */
int sim_opts_parse(int argc, char **argv, sim_opts *o, int *help);
void sim_opts_cleanup(sim_opts *o);

/* Writes the run's options (not those of one invocation: --out, --resume,
 * --json, --log-*, --study) to path as one JSON object, atomically. Errors:
 * those of strata_file_write_atomic, STRATA_ENOMEM. */
int sim_opts_save(const sim_opts *o, const char *path, strata_diag *d);

/* The key (snake_case) of pass-through option i < SIM_NPASS; NULL above. */
const char *sim_opts_pass_key(size_t i);

/* 1 when pass-through option i goes to every client, 0 when to the
 * coordinator (or i >= SIM_NPASS). */
int sim_opts_pass_client(size_t i);

/* The value given for pass-through option key, or NULL. */
const char *sim_opts_pass_get(const sim_opts *o, const char *key);

/* ---- bandwidth-limited links (links.c) ---------------------------------- */

typedef struct sim_links sim_links;

/* 0 when rate is NULL or a tc rate strata-sim accepts (a positive number
 * and bit, kbit, mbit or gbit: "1mbit", "512kbit"), else STRATA_EINVAL. */
int sim_link_rate_check(const char *rate);

/* Puts each of n clients behind its own link: a network namespace joined
 * to the host by a veth pair, with up (the namespace's egress) and down
 * (the host end's egress) as tbf rates (either may be NULL: no cap that
 * way). All or nothing: on error (not root, no ip or tc, a command that
 * fails) everything made is removed and diag says what failed. */
int sim_links_new(long n, const char *up, const char *down, sim_links **out, strata_diag *d);

/* The host address the coordinator listens on (borrowed). */
const char *sim_links_host(const sim_links *l);

/* Client i's namespace name (into ns) and the path of ip, to run the
 * client as "ip netns exec NS ...". */
int sim_links_wrap(const sim_links *l, long i, char *ns, size_t cap, const char **ip);

/* Removes every namespace and veth pair of l and frees it. Accepts NULL. */
void sim_links_free(sim_links *l);

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

/* A summary's accuracy or loss as text in buf: printed with prec decimals,
 * or `none` when it is unknown (NaN: the round was not evaluated, as a
 * round that failed). Returns buf. */
const char *sim_metric_text(double v, int prec, const char *none, char *buf, size_t cap);

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

/* The coordinator's settings (the "config" object of GET /v1/status, less
 * its enrolment_secret flag: a config file for strata-server --config) as
 * of the last poll that had them, as indented JSON text borrowed from f;
 * NULL before. */
const char *sim_follow_config(const sim_follow *f);

/* The name of a state as GET /v1/status spells it. */
const char *sim_run_state_name(sim_run_state s);

/* ---- the report (report.c) ---------------------------------------------- */

/* What the report's header states about the run (borrowed strings). */
typedef struct sim_run_info {
    long clients, rounds, seed;
    long data_shares; /* the coordinator's --data-shares; 0: none */
    const char *model, *partition, *policy, *density, *values;
    const char *sampling;            /* "all", "N per round" or "fraction F" */
    const char *given;               /* the other coordinator options given ("--key value ..."),
                                        "" or NULL: none */
    const char *client_given;        /* the client options given, as given */
    const char *downlink;            /* the coordinator's --downlink ("none" when not given) */
    const char *link_up, *link_down; /* per-client link rates, NULL: none */
    double target_accuracy;          /* 0: no time-to-target line */
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

/* ---- per-client shards (shard.c) ---------------------------------------- */

/* Loads the training split of data_dir, splits it over nclients with the
 * partitioner (spec, seed) exactly as strata-client --partition spec
 * --num-clients nclients --seed seed would, and writes client c's share to
 * base/c/ as raw IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte)
 * that strata-client --partition none --data base/c reads back
 * sample-for-sample, in the same order. Creates base and its folders;
 * existing files are overwritten. Errors: those of strata_data_load_dir and
 * strata_partition_new (diag says which), STRATA_EINVAL for a data set of
 * more than one channel, STRATA_EIO when a file cannot be written,
 * STRATA_ENOMEM. */
int sim_shards_write(const char *data_dir, const char *spec, long nclients, long seed,
                     const char *base, strata_diag *diag);

/* ---- the output directory (outdir.c) ------------------------------------ */

/* Creates path and its missing parents (mode 0755). Errors: STRATA_EINVAL
 * (path too long), STRATA_EIO. */
int sim_mkdirs(const char *path);

/* What a run keeps in --out. */
enum {
    SIM_OUT_STATE = 0,  /* state/: the coordinator's state directory */
    SIM_OUT_CLIENTS,    /* clients/: each client's state directory and log */
    SIM_OUT_SHARDS,     /* shards/: each client's share of the training set */
    SIM_OUT_SERVER_LOG, /* server.log */
    SIM_OUT_SECRET,     /* enrolment.secret */
    SIM_OUT_RUN_JSON,   /* run.json: the run's options, for --resume */
    SIM_OUT_COORD_JSON, /* coordinator.json: the coordinator's settings */
    SIM_OUT_REPORT_CSV, /* report.csv */
    SIM_OUT_REPORT_MD,  /* report.md */
    SIM_OUT_ENTRIES
};

typedef struct sim_out {
    char path[SIM_OUT_ENTRIES][PATH_MAX]; /* OUT/entry */
    int existed[SIM_OUT_ENTRIES];         /* present before this run started */
    int holds_run;                        /* state/ or run.json was there */
    char created_top[PATH_MAX];           /* the first folder sim_out_create made, or "" */
} sim_out;

/* Composes the paths of out's entries into *o and notes which exist.
 * Creates nothing. Errors: STRATA_EINVAL for a path too long. */
int sim_out_open(const char *out, sim_out *o, strata_diag *diag);

/* Creates out (with its missing parents) and out/clients. Errors:
 * STRATA_EIO. */
int sim_out_create(const char *out, sim_out *o, strata_diag *diag);

/* Removes what this run created: the folders sim_out_create made, or else
 * every entry that was not there at sim_out_open. Entries that existed are
 * left as they are. */
void sim_out_discard(const sim_out *o);

/* Copies into line (cap bytes) the coordinator's last error line in its log
 * (its message, after the level), or its last line when none is an error.
 * Returns 1 when it found one, 0 when the log is missing or empty. */
int sim_out_error_line(const char *log, char *line, size_t cap);

/* ---- SVG plots (plot.c) ------------------------------------------------- */

/* One line of a plot: n points (x[i], y[i]) with a band from lo[i] to hi[i]
 * (all borrowed). Points with x <= 0 are left out (the x axis is
 * logarithmic). */
typedef struct sim_plot_line {
    const char *label;
    const double *x, *y, *lo, *hi;
    size_t n;
} sim_plot_line;

/* Writes an SVG line plot to path: a logarithmic x axis over whole decades,
 * a linear y axis, one coloured line with a shaded band per entry of lines
 * and a legend. Errors: STRATA_EINVAL when no point has x > 0 and a known
 * y, STRATA_EIO when the file cannot be written. */
int sim_plot_lines(const char *path, const char *title, const char *xlabel, const char *ylabel,
                   const sim_plot_line *lines, size_t nlines);

/* Writes an SVG heat map to path: nrows rows named rows[r], ncols columns
 * (rounds), cell (r, c) coloured by v[r * ncols + c] on a logarithmic scale
 * between the smallest and largest positive value (values <= 0 white).
 * Errors: STRATA_EINVAL when there is no positive value, STRATA_EIO. */
int sim_plot_heatmap(const char *path, const char *title, const char *const *rows, size_t nrows,
                     size_t ncols, const double *v);

/* ---- studies (study.c) -------------------------------------------------- */

/* Checks the command line of one run of a study (options.c implements it
 * as sim_study_check) (argv[0 .. argc), the
 * options only, no executable, no --out): 0 when strata-sim would accept
 * it, else an error with diag saying why. */
typedef int (*sim_study_check_fn)(int argc, char **argv, strata_diag *diag);
int sim_study_check(int argc, char **argv, strata_diag *diag);

/* Runs the study described by the JSON file spec_path into out: every key
 * is a strata-sim option (snake_case), a list of values makes that option
 * an axis of the grid, and each point of the grid is one strata-sim run
 * (self, the executable) in out/runs/NAME. A run that finished before is
 * skipped, one that was stopped is resumed. Then writes out/study.csv (one
 * row per run and round), SVG plots in out/plots and out/report.md and
 * out/report.html. check validates each run's options before any runs. stop (borrowed)
 * ends the study: the running run is stopped (it can be resumed) and the
 * report covers the finished runs. Returns 0 when every run finished, 130
 * when stopped, 2 for a spec that is not valid (nothing is run; the message
 * says what is wrong), 1 when a run failed. */
int sim_study_run(const char *spec_path, const char *out, const char *self,
                  sim_study_check_fn check, volatile sig_atomic_t *stop);

/* ---- child processes (procs.c) ------------------------------------------ */

/* A growing argument vector; every string is a malloc'ed copy. */
typedef struct sim_argv {
    char *v[160];
    size_t n;
} sim_argv;

/* The coordinator's standard output: its start-up line, then whatever it
 * prints, which is copied to its log. */
typedef struct sim_server_out {
    int fd;     /* read end of the pipe (non-blocking) */
    int log_fd; /* server.log, opened for appending; -1 when not open */
    char buf[8192];
    size_t len;
} sim_server_out;

/* The child processes of the run. */
typedef struct sim_procs {
    pid_t server; /* -1 once it has exited */
    pid_t *clients;
    long nclients, done, failed;
} sim_procs;

/* Appends a copy of s. Errors: STRATA_ENOMEM (also when full). */
int sim_argv_add(sim_argv *a, const char *s);

/* Appends "--kebab-key" and value. Errors: STRATA_ENOMEM. */
int sim_argv_add_opt(sim_argv *a, const char *key, const char *value);

/* Frees the copies. */
void sim_argv_cleanup(sim_argv *a);

/* Starts argv[0] with stdout to out_fd (or the log), stderr to the log
 * file (appended to by every writer, so a resumed run keeps the earlier
 * lines). Returns the child's pid, or -1. */
pid_t sim_spawn(char *const argv[], const char *log, int out_fd);

/* Reads what the coordinator's pipe holds (waiting up to wait_ms) and
 * copies it to the log. Returns the number of bytes read, 0 at end of file
 * or when nothing came. */
size_t sim_server_out_read(sim_server_out *so, int wait_ms);

/* Looks for the start-up line "strata-server: listening on URL" among the
 * complete lines read so far (see docs/operations.md); copies URL into url
 * and returns 1 when it is there. Lines before it are dropped. */
int sim_server_out_listening(sim_server_out *so, char *url, size_t cap);

/* Reaps the children that have exited; returns 1 when the server is one. */
int sim_procs_reap(sim_procs *p);

/* Ends every child that still runs (SIGTERM; SIGKILL after 30 s) and waits
 * for it: the clients first, all at once, then the coordinator, which saves
 * its state as it stops. */
void sim_procs_stop(sim_procs *p);

#endif
