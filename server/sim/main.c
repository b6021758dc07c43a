/* strata-sim: runs a whole federation on this machine — a coordinator on a
 * free loopback port and N edge-client processes, each on its own shard of
 * a real data set. This file owns the run and its outcome: it starts the
 * coordinator with the run's options (options.c), learns its
 * address from its start-up line, writes the shards (shard.c), starts the
 * clients, follows the run through the REST API (follow.c), and has the
 * report written from the coordinator's store (report.c), also after SIGINT
 * or SIGTERM; the output directory is outdir.c's, studies are study.c's, and
 * starting, reaping and stopping the child processes is procs.c's. */
#include "sim.h"

#include "strata/clock.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/opts.h"
#include "strata/stop.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Set once SIGINT or SIGTERM arrives (strata_stop_install). */
static volatile sig_atomic_t *g_stop;

/* How long the coordinator may take to print its address. */
#define START_TIMEOUT_MS 120000
/* How often the run's progress is polled. */
#define POLL_INTERVAL_MS 500
/* How long one client may take to register before the next starts. */
#define REGISTER_TIMEOUT_MS 60000

/* Waits until client i (state directory cdir) has registered: its
 * identity.json exists (the client's state-directory protocol). Clients
 * register one after the other, so client I gets the same coordinator id in
 * every run and a seeded run samples the same shares. Gives up after
 * REGISTER_TIMEOUT_MS or when the client exits (the run then reports it).
 * Errors: STRATA_ESTATE when the coordinator exited or a stop arrived. */
static int wait_registered(sim_procs *p, long i, const char *cdir)
{
    char id[PATH_MAX];
    if (snprintf(id, sizeof(id), "%s/identity.json", cdir) >= (int)sizeof(id))
        return STRATA_EINVAL;
    strata_deadline until = strata_deadline_in(REGISTER_TIMEOUT_MS);
    while (access(id, F_OK) != 0) {
        if (*g_stop)
            return STRATA_ESTATE;
        if (sim_procs_reap(p)) {
            strata_log_error("the coordinator exited while clients registered");
            return STRATA_ESTATE;
        }
        if (p->clients[i] == 0)
            return STRATA_OK; /* exited: counted as failed */
        if (strata_deadline_expired(until)) {
            strata_log_warn("client %ld has not registered after %d s; going on", i,
                            REGISTER_TIMEOUT_MS / 1000);
            return STRATA_OK;
        }
        usleep(5000);
    }
    return STRATA_OK;
}

/* Starts the N clients against the coordinator at url, each on its shard
 * (shards/I, --partition none), one after the other as each registers. */
static int start_clients(const sim_opts *o, sim_procs *p, const char *client_bin, const char *url,
                         const sim_out *od, const sim_links *links)
{
    char s_clients[32], s_seed[32];
    snprintf(s_clients, sizeof(s_clients), "%ld", o->clients);
    snprintf(s_seed, sizeof(s_seed), "%ld", o->seed);
    const char *clients_dir = od->path[SIM_OUT_CLIENTS];
    for (long i = 0; i < o->clients; i++) {
        char cdir[PATH_MAX], clog[PATH_MAX], shard[PATH_MAX], idx[32];
        if (snprintf(cdir, sizeof(cdir), "%s/%ld", clients_dir, i) >= (int)sizeof(cdir) ||
            snprintf(clog, sizeof(clog), "%s/%ld.log", clients_dir, i) >= (int)sizeof(clog) ||
            snprintf(shard, sizeof(shard), "%s/%ld", od->path[SIM_OUT_SHARDS], i) >=
                (int)sizeof(shard)) {
            strata_log_error("path too long: %s", clients_dir);
            return STRATA_EINVAL;
        }
        snprintf(idx, sizeof(idx), "%ld", i);
        /* Behind a link: "ip netns exec NS" runs the client in its
         * namespace (ip execs it: the pid is the client's). */
        sim_argv a = {0};
        char ns[64];
        const char *ip = NULL;
        int rc = STRATA_OK;
        if (links != NULL && sim_links_wrap(links, i, ns, sizeof(ns), &ip) == 0) {
            const char *wrap[] = {ip, "netns", "exec", ns};
            for (size_t k = 0; rc == 0 && k < sizeof(wrap) / sizeof(wrap[0]); k++)
                rc = sim_argv_add(&a, wrap[k]);
        }
        const char *fixed[][2] = {{"server", url},
                                  {"state_dir", cdir},
                                  {"data", shard},
                                  {"partition", "none"},
                                  {"num_clients", s_clients},
                                  {"client_index", idx},
                                  {"seed", s_seed},
                                  {"threads", "1"},
                                  {"enrolment_secret_file", od->path[SIM_OUT_SECRET]}};
        if (rc == 0)
            rc = sim_argv_add(&a, client_bin);
        for (size_t k = 0; rc == 0 && k < sizeof(fixed) / sizeof(fixed[0]); k++)
            rc = sim_argv_add_opt(&a, fixed[k][0], fixed[k][1]);
        for (size_t k = 0; rc == 0 && k < SIM_NPASS; k++)
            if (o->pass[k] != NULL && sim_opts_pass_client(k))
                rc = sim_argv_add_opt(&a, sim_opts_pass_key(k), o->pass[k]);
        if (rc < 0) {
            sim_argv_cleanup(&a);
            strata_log_error("out of memory (a client's command line)");
            return rc;
        }
        p->clients[i] = sim_spawn(a.v, clog, -1);
        int err = errno;
        sim_argv_cleanup(&a);
        if (p->clients[i] < 0) {
            p->clients[i] = 0;
            strata_log_error("cannot start a client: %s", strerror(err));
            return STRATA_EIO;
        }
        rc = wait_registered(p, i, cdir);
        if (rc < 0)
            return rc;
    }
    return STRATA_OK;
}

/* Shows one closed round: a status line on a terminal, a log line
 * otherwise. */
static void show_round(void *ud, const strata_round_summary *s, uint32_t total)
{
    int *tty = ud;
    char line[256], acc[32], loss[32];
    snprintf(line, sizeof(line),
             "round %u/%u: %llu updates, accuracy %s, loss %s, uplink %llu bytes, %llu ms",
             s->round, total, (unsigned long long)s->participants,
             sim_metric_text(s->accuracy, 4, "none", acc, sizeof(acc)),
             sim_metric_text(s->loss, 4, "none", loss, sizeof(loss)),
             (unsigned long long)s->uplink_bytes, (unsigned long long)s->duration_ms);
    if (*tty) {
        fprintf(stderr, "\r\033[K%s", line);
        fflush(stderr);
    } else {
        strata_log_info("%s", line);
    }
}

/* Following the run: how progress is shown and what was saved. */
typedef struct follow_ui {
    int tty;                 /* progress as a status line on a terminal */
    int failing;             /* the last poll failed (reported once) */
    int config_saved;        /* coordinator.json is written */
    const char *config_path; /* OUT/coordinator.json (borrowed) */
} follow_ui;

/* One poll of the run's progress; a coordinator that does not answer is
 * reported once until it answers again. The first settings seen are saved
 * to coordinator.json. */
static void poll_progress(sim_follow *f, follow_ui *ui)
{
    strata_diag d = {{0}};
    int rc = sim_follow_poll(f, show_round, &ui->tty, &d);
    if (rc < 0 && rc != STRATA_ESTATE && !ui->failing)
        strata_log_warn("following the run: %s", strata_diag_msg(&d, rc));
    ui->failing = rc < 0;
    const char *cfg = sim_follow_config(f);
    if (!ui->config_saved && cfg != NULL) {
        ui->config_saved = 1;
        if ((rc = strata_file_write_atomic(ui->config_path, cfg, strlen(cfg), 0644, &d)) < 0)
            strata_log_warn("%s", strata_diag_msg(&d, rc));
    }
}

/* How a run ended. */
typedef enum {
    RUN_DONE = 0,     /* every round finished */
    RUN_FAILED,       /* it ran, then failed: the output stays */
    RUN_START_FAILED, /* it never ran: what this start created goes */
    RUN_INTERRUPTED   /* SIGINT or SIGTERM */
} run_end;

/* Logs why the coordinator did not start, with its own error line. */
static void start_failure(const char *log, const char *what)
{
    char line[1024];
    if (sim_out_error_line(log, line, sizeof(line)))
        strata_log_error("the coordinator %s: %s", what, line);
    else
        strata_log_error("the coordinator %s (no output)", what);
}

/* The run itself: waits for the coordinator's address, saves the options,
 * writes the shards, starts the clients and follows the rounds until every
 * client has exited. */
static run_end run(const sim_opts *o, sim_procs *p, sim_server_out *so, const char *client_bin,
                   const sim_out *od, const sim_links *links)
{
    const char *log = od->path[SIM_OUT_SERVER_LOG];
    char url[256] = "";
    strata_deadline start = strata_deadline_in(START_TIMEOUT_MS);
    while (!*g_stop && !sim_server_out_listening(so, url, sizeof(url))) {
        sim_server_out_read(so, 200);
        if (sim_procs_reap(p)) {
            start_failure(log, "did not start");
            return RUN_START_FAILED;
        }
        if (strata_deadline_expired(start)) {
            start_failure(log, "did not start in time");
            return RUN_START_FAILED;
        }
    }
    if (*g_stop)
        return od->holds_run ? RUN_INTERRUPTED : RUN_START_FAILED;
    strata_diag d = {{0}};
    int rc;
    if ((rc = sim_opts_save(o, od->path[SIM_OUT_RUN_JSON], &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return RUN_START_FAILED;
    }
    strata_log_info("coordinator at %s; writing the shards of %ld clients (%s)", url, o->clients,
                    o->partition);
    if ((rc = sim_shards_write(o->data, o->partition, o->clients, o->seed, od->path[SIM_OUT_SHARDS],
                               &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return od->holds_run ? RUN_FAILED : RUN_START_FAILED;
    }
    sim_follow *f = NULL;
    if ((rc = sim_follow_new(url, g_stop, &f, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return RUN_FAILED;
    }
    run_end end = RUN_FAILED;
    follow_ui ui = {.tty = isatty(STDERR_FILENO), .config_path = od->path[SIM_OUT_COORD_JSON]};
    if (start_clients(o, p, client_bin, url, od, links) < 0) {
        if (*g_stop)
            end = RUN_INTERRUPTED;
        goto out;
    }
    int64_t next_poll = 0;
    while (!*g_stop && p->done < p->nclients) {
        sim_server_out_read(so, 200);
        so->len = 0; /* after the start-up line the output is only logged */
        if (strata_clock_mono_ms() >= next_poll) {
            poll_progress(f, &ui);
            next_poll = strata_clock_mono_ms() + POLL_INTERVAL_MS;
        }
        if (sim_procs_reap(p)) {
            if (ui.tty)
                fputc('\n', stderr);
            strata_log_error("the coordinator exited early; see %s", log);
            goto out;
        }
    }
    if (*g_stop) {
        if (ui.tty)
            fputc('\n', stderr);
        end = RUN_INTERRUPTED;
        goto out;
    }
    /* Every client has exited: the rounds closed since the last poll. */
    poll_progress(f, &ui);
    if (ui.tty)
        fputc('\n', stderr);
    const sim_progress *pr = sim_follow_progress(f);
    long total = pr->polled ? (long)pr->total_rounds : o->rounds;
    if (p->failed > 0 || (long)pr->completed < total) {
        strata_log_error("%ld of %ld clients failed and %u of %ld rounds finished (the "
                         "coordinator's state: %s); see the logs in %s",
                         p->failed, p->nclients, pr->completed, total,
                         pr->polled ? sim_run_state_name(pr->state) : "unknown", o->out);
        goto out;
    }
    end = RUN_DONE;
out:
    sim_follow_free(f);
    return end;
}

/* Finds strata-server and strata-client beside this executable. */
static int find_binaries(char *server_bin, char *client_bin, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return STRATA_EIO;
    self[n] = '\0';
    const char *dir = dirname(self);
    if (snprintf(server_bin, cap, "%s/strata-server", dir) >= (int)cap ||
        snprintf(client_bin, cap, "%s/strata-client", dir) >= (int)cap)
        return STRATA_EINVAL;
    return STRATA_OK;
}

/* The coordinator's command line: the run's settings, then every
 * coordinator option of PASS given. */
static int server_argv(const sim_opts *o, const char *server_bin, const sim_out *od,
                       const char *host, sim_argv *a)
{
    char s_clients[32], s_rounds[32], s_seed[32], s_deadline[32];
    snprintf(s_clients, sizeof(s_clients), "%ld", o->clients);
    snprintf(s_rounds, sizeof(s_rounds), "%ld", o->rounds);
    snprintf(s_seed, sizeof(s_seed), "%ld", o->seed);
    snprintf(s_deadline, sizeof(s_deadline), "%ld", o->deadline);
    const char *fixed[][2] = {{"state_dir", od->path[SIM_OUT_STATE]},
                              {"model", o->model},
                              {"data", o->data},
                              {"host", host},
                              {"port", "0"},
                              {"rounds", s_rounds},
                              {"min_clients", s_clients},
                              {"round_deadline", s_deadline},
                              {"policy", o->policy},
                              {"density", o->density},
                              {"values", o->values},
                              {"seed", s_seed},
                              {"enrolment_secret_file", od->path[SIM_OUT_SECRET]}};
    int rc = sim_argv_add(a, server_bin);
    for (size_t i = 0; rc == 0 && i < sizeof(fixed) / sizeof(fixed[0]); i++)
        rc = sim_argv_add_opt(a, fixed[i][0], fixed[i][1]);
    for (size_t i = 0; rc == 0 && i < SIM_NPASS; i++)
        if (o->pass[i] != NULL && !sim_opts_pass_client(i))
            rc = sim_argv_add_opt(a, sim_opts_pass_key(i), o->pass[i]);
    return rc;
}

/* Writes the pass-through options given that go to the clients (client 1)
 * or to the coordinator (0; but the sampling and the downlink, which the
 * header states on their own) as "--key value" pairs into buf, ending in
 * " ..." when cap bytes (at least 8) cannot hold them all. */
static void pass_text(const sim_opts *o, int client, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < SIM_NPASS; i++) {
        const char *key = sim_opts_pass_key(i);
        if (o->pass[i] == NULL || sim_opts_pass_client(i) != client ||
            strcmp(key, "clients_per_round") == 0 || strcmp(key, "fraction") == 0 ||
            strcmp(key, "downlink") == 0)
            continue;
        char flag[64];
        strata_opt_flag(key, flag, sizeof(flag));
        int w = snprintf(buf + len, cap - len, "%s%s %s", len ? " " : "", flag, o->pass[i]);
        if (w < 0 || (size_t)w >= cap - len) {
            /* More than the buffer holds: say so rather than drop them. */
            size_t at = len + 5 <= cap ? len : cap - 5;
            snprintf(buf + at, cap - at, "%s...", at ? " " : "");
            break;
        }
        len += (size_t)w;
    }
}

/* The report header's settings: the options o holds, with sampling and
 * given (the coordinator's options given and those of the clients, by
 * pass_text) written into the caller's buffers. */
static sim_run_info run_info(const sim_opts *o, char *sampling, size_t ns, char given[2][1024])
{
    const char *cpr = sim_opts_pass_get(o, "clients_per_round"),
               *fr = sim_opts_pass_get(o, "fraction");
    if (cpr != NULL)
        snprintf(sampling, ns, "%s", cpr);
    else if (fr != NULL)
        snprintf(sampling, ns, "fraction %s", fr);
    else
        snprintf(sampling, ns, "all");
    pass_text(o, 0, given[0], sizeof(given[0]));
    pass_text(o, 1, given[1], sizeof(given[1]));
    const char *downlink = sim_opts_pass_get(o, "downlink");
    return (sim_run_info){.clients = o->clients,
                          .rounds = o->rounds,
                          .seed = o->seed,
                          .model = o->model,
                          .partition = o->partition,
                          .policy = o->policy,
                          .density = o->density,
                          .values = o->values,
                          .sampling = sampling,
                          .given = given[0],
                          .client_given = given[1],
                          .downlink = downlink != NULL ? downlink : "none",
                          .link_up = o->link_up,
                          .link_down = o->link_down,
                          .target_accuracy = o->target_accuracy};
}

/* Writes the report of the rounds the store holds; returns the exit code
 * for a run that ended with end. */
static int finish(const sim_opts *o, const sim_out *od, run_end end)
{
    char sampling[64], given[2][1024];
    sim_run_info info = run_info(o, sampling, sizeof(sampling), given);
    int rc = sim_report_write(od->path[SIM_OUT_STATE], o->out, &info, o->json);
    if (end == RUN_INTERRUPTED) {
        strata_log_warn("interrupted; the report covers the finished rounds. Continue with: "
                        "strata-sim --out %s --resume",
                        o->out);
        return SIM_EXIT_INTERRUPTED;
    }
    return rc < 0 || end != RUN_DONE ? SIM_EXIT_FAIL : SIM_EXIT_OK;
}

/* Runs the federation the options describe; returns the exit code. */
static int sim_main(const sim_opts *o)
{
    int rc;
    g_stop = strata_stop_install();
    char server_bin[PATH_MAX], client_bin[PATH_MAX];
    if (find_binaries(server_bin, client_bin, sizeof(server_bin)) < 0) {
        strata_log_error("cannot find strata-server and strata-client beside strata-sim");
        return SIM_EXIT_FAIL;
    }
    sim_out od;
    strata_diag d = {{0}};
    if ((rc = sim_out_open(o->out, &od, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return SIM_EXIT_USAGE;
    }
    if (od.holds_run && !o->resume) {
        strata_log_error("%s already holds a run; continue it with --resume, or choose another "
                         "--out",
                         o->out);
        return SIM_EXIT_USAGE;
    }
    if (!od.holds_run && o->resume) {
        strata_log_error("%s holds no run to resume", o->out);
        return SIM_EXIT_USAGE;
    }
    if ((rc = sim_out_create(o->out, &od, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        sim_out_discard(&od);
        return SIM_EXIT_FAIL;
    }
    /* A fresh enrolment secret for a new federation, in a file only this
     * user can read (not on any command line); a resumed one keeps its. */
    char secret[STRATA_TOKEN_HEX + 1];
    if (!od.existed[SIM_OUT_SECRET] &&
        ((rc = strata_random_token(secret, &d)) < 0 ||
         (rc = strata_file_write_atomic(od.path[SIM_OUT_SECRET], secret, STRATA_TOKEN_HEX, 0600,
                                        &d)) < 0)) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        sim_out_discard(&od);
        return SIM_EXIT_FAIL;
    }
    sim_argv sargv = {.n = 0};
    sim_procs p = {.server = -1, .nclients = o->clients};
    sim_server_out so = {.fd = -1, .log_fd = -1};
    int pfd[2] = {-1, -1};
    run_end end = RUN_START_FAILED;
    sim_links *links = NULL;
    if (o->link_up != NULL || o->link_down != NULL) {
        if ((rc = sim_links_new(o->clients, o->link_up, o->link_down, &links, &d)) < 0) {
            strata_log_error("%s", strata_diag_msg(&d, rc));
            goto stop;
        }
        strata_log_info("%ld clients behind their own links: uplink %s, downlink %s", o->clients,
                        o->link_up ? o->link_up : "uncapped",
                        o->link_down ? o->link_down : "uncapped");
    }
    if (server_argv(o, server_bin, &od, links ? sim_links_host(links) : "127.0.0.1", &sargv) < 0 ||
        (p.clients = calloc((size_t)o->clients, sizeof(pid_t))) == NULL || pipe(pfd) != 0) {
        strata_log_error("cannot start the coordinator: %s", strerror(errno));
        goto stop;
    }
    fcntl(pfd[0], F_SETFD, FD_CLOEXEC);
    fcntl(pfd[1], F_SETFD, FD_CLOEXEC);
    p.server = sim_spawn(sargv.v, od.path[SIM_OUT_SERVER_LOG], pfd[1]);
    int spawn_err = errno;
    close(pfd[1]);
    so.fd = pfd[0];
    fcntl(so.fd, F_SETFL, fcntl(so.fd, F_GETFL) | O_NONBLOCK);
    if (p.server < 0) {
        strata_log_error("cannot start the coordinator: %s", strerror(spawn_err));
        goto stop;
    }
    so.log_fd = open(od.path[SIM_OUT_SERVER_LOG], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    end = run(o, &p, &so, client_bin, &od, links);
stop:
    sim_procs_stop(&p);
    sim_links_free(links);
    while (so.fd >= 0 && sim_server_out_read(&so, 0) > 0)
        so.len = 0;
    if (so.fd >= 0)
        close(so.fd);
    if (so.log_fd >= 0)
        close(so.log_fd);
    free(p.clients);
    sim_argv_cleanup(&sargv);
    if (end == RUN_START_FAILED) {
        if (!od.holds_run)
            sim_out_discard(&od);
        return *g_stop ? SIM_EXIT_INTERRUPTED : SIM_EXIT_FAIL;
    }
    return finish(o, &od, end);
}

/* Runs the study --study names into --out; returns the exit code. */
static int study_main(const sim_opts *o)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        strata_log_error("cannot find its own executable");
        return SIM_EXIT_FAIL;
    }
    self[n] = '\0';
    return sim_study_run(o->study, o->out, self, sim_study_check, strata_stop_install());
}

/* --report-from: the report of a coordinator's state directory (the
 * coordinator stopped), in --out; the header's settings are the options
 * given. */
static int report_only(const sim_opts *o)
{
    if (sim_report_check(o->report_from) < 0)
        return SIM_EXIT_FAIL;
    if (sim_mkdirs(o->out) < 0) {
        strata_log_error("cannot create %s", o->out);
        return SIM_EXIT_FAIL;
    }
    char sampling[64], given[2][1024];
    sim_run_info info = run_info(o, sampling, sizeof(sampling), given);
    info.data_shares = o->data_shares;
    return sim_report_write(o->report_from, o->out, &info, o->json) < 0 ? SIM_EXIT_FAIL
                                                                        : SIM_EXIT_OK;
}

int main(int argc, char **argv)
{
    strata_log_setup("strata-sim", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    sim_opts o;
    int help = 0, rc = sim_opts_parse(argc, argv, &o, &help);
    if (rc == SIM_EXIT_OK && !help) {
        strata_log_setup("strata-sim", o.log_level, o.log_format);
        rc = o.study != NULL         ? study_main(&o)
             : o.report_from != NULL ? report_only(&o)
                                     : sim_main(&o);
    }
    sim_opts_cleanup(&o);
    return rc;
}
