/* strata-sim: runs a whole federation on this machine — a coordinator on a
 * free loopback port and N edge-client processes over a partition of a real
 * data set. This file owns the options, the processes and the run's
 * outcome: it learns the coordinator's address from its start-up line,
 * follows the run through the REST API (follow.c), and has the report
 * written from the coordinator's store (report.c). */
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

typedef struct sim_opts {
    long clients, rounds, seed, local_epochs, batch, deadline, data_shares;
    char *report_from;
    char *model, *data, *partition, *policy, *density, *values, *out, *lr, *server_opt, *server_lr;
    int json;
    char *log_format_name, *log_level_name;
    strata_log_level log_level;
    strata_log_format log_format;
} sim_opts;

/* Exit codes. */
enum { SIM_EXIT_OK = 0, SIM_EXIT_FAIL = 1, SIM_EXIT_USAGE = 2, SIM_EXIT_INTERRUPTED = 130 };

/* How long the coordinator may take to print its address. */
#define START_TIMEOUT_MS 120000
/* How often the run's progress is polled. */
#define POLL_INTERVAL_MS 500

#define OFF(f) offsetof(sim_opts, f)
static const strata_opt OPTS[] = {
    {"clients", STRATA_OPT_INTEGER, OFF(clients), 1, 1000, "N", "edge clients (10)"},
    {"rounds", STRATA_OPT_INTEGER, OFF(rounds), 1, 100000, "R", "rounds (10)"},
    {"model", STRATA_OPT_STRING, OFF(model), 0, 0, "SPEC", "mlp (default), cnn or ARCH.json"},
    {"data", STRATA_OPT_STRING, OFF(data), 0, 0, "DIR", "data set directory; required"},
    {"partition", STRATA_OPT_STRING, OFF(partition), 0, 0, "SPEC",
     "iid (default), dirichlet:ALPHA or shards:S"},
    {"policy", STRATA_OPT_STRING, OFF(policy), 0, 0, "SPEC",
     "the coordinator's budget policy (uniform); none: dense FedAvg"},
    {"density", STRATA_OPT_STRING, OFF(density), 0, 0, "D", "target mean density (0.01)"},
    {"values", STRATA_OPT_STRING, OFF(values), 0, 0, "fp32|fp16|bf16",
     "values format of uploads (fp32)"},
    {"local_epochs", STRATA_OPT_INTEGER, OFF(local_epochs), 1, 1000, "E",
     "client epochs per round (1)"},
    {"batch", STRATA_OPT_INTEGER, OFF(batch), 1, 65536, "B", "client batch size (32)"},
    {"lr", STRATA_OPT_STRING, OFF(lr), 0, 0, "LR", "client learning rate (0.05)"},
    {"server_opt", STRATA_OPT_STRING, OFF(server_opt), 0, 0, "NAME",
     "plain (default), fedavgm, fedadam or fedyogi"},
    {"server_lr", STRATA_OPT_STRING, OFF(server_lr), 0, 0, "X",
     "server learning rate (0: the optimiser's default)"},
    {"round_deadline", STRATA_OPT_INTEGER, OFF(deadline), 1, 86400, "S",
     "round deadline in seconds (120)"},
    {"seed", STRATA_OPT_INTEGER, OFF(seed), 0, (double)LONG_MAX, "S", "seed (1)"},
    {"out", STRATA_OPT_STRING, OFF(out), 0, 0, "DIR", "where the run and its report go (out/sim)"},
    {"json", STRATA_OPT_FLAG, OFF(json), 0, 0, NULL, "end with a JSON summary line"},
    {"report_from", STRATA_OPT_STRING, OFF(report_from), 0, 0, "DIR",
     "run nothing: write the report of the stopped coordinator whose state directory is DIR"},
    {"data_shares", STRATA_OPT_INTEGER, OFF(data_shares), 0, 1000000, "N",
     "with --report-from: the coordinator's --data-shares (adds the clients table)"},
    {"log_format", STRATA_OPT_STRING, OFF(log_format_name), 0, 0, "text|json",
     "text (default) or one JSON object per log line"},
    {"log_level", STRATA_OPT_STRING, OFF(log_level_name), 0, 0, "debug|info|warn|error",
     "the least level logged (info)"},
};
#define NOPTS (sizeof(OPTS) / sizeof(OPTS[0]))

/* Writes the usage text to f. */
static void usage(FILE *f)
{
    strata_buf b;
    strata_buf_init(&b, 1 << 16);
    fputs("usage: strata-sim --clients N --rounds R --model mlp|cnn|ARCH.json --data DIR "
          "[options]\n",
          f);
    if (strata_opts_usage(OPTS, NOPTS, &b) == STRATA_OK)
        fputs((const char *)b.data, f);
    fputs("Starts strata-server on a free loopback port and N strata-client processes (one\n"
          "thread each), follows the run through the coordinator's REST API, shows progress,\n"
          "and writes report.csv and report.md in --out (default out/sim). --policy none runs\n"
          "dense FedAvg. With --json the last line of output is a JSON summary.\n",
          f);
    strata_buf_cleanup(&b);
}

/* Fills *o with the defaults (strings malloc'ed). */
static int sim_opts_init(sim_opts *o)
{
    *o = (sim_opts){.clients = 10,
                    .rounds = 10,
                    .seed = 1,
                    .local_epochs = 1,
                    .batch = 32,
                    .deadline = 120,
                    .log_level = STRATA_LOG_INFO,
                    .log_format = STRATA_LOG_TEXT};
    static const struct {
        size_t off;
        const char *value;
    } defaults[] = {{OFF(model), "mlp"},    {OFF(partition), "iid"},    {OFF(policy), "uniform"},
                    {OFF(density), "0.01"}, {OFF(values), "fp32"},      {OFF(out), "out/sim"},
                    {OFF(lr), "0.05"},      {OFF(server_opt), "plain"}, {OFF(server_lr), "0"}};
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
        if ((*(char **)((char *)o + defaults[i].off) = strdup(defaults[i].value)) == NULL)
            return STRATA_ENOMEM;
    return STRATA_OK;
}

/* Parses the command line into *o (strata_opts_cleanup frees it, also after
 * an error). Returns SIM_EXIT_OK (with *help set when --help was answered)
 * or SIM_EXIT_USAGE. */
static int parse(int argc, char **argv, sim_opts *o, int *help)
{
    *help = 0;
    if (sim_opts_init(o) < 0) {
        strata_log_error("out of memory");
        return SIM_EXIT_FAIL;
    }
    strata_diag d = {{0}};
    int rc = strata_opts_parse_argv(OPTS, NOPTS, argc, argv, o, help, &d);
    if (rc >= 0 && *help) {
        usage(stdout);
        return SIM_EXIT_OK;
    }
    if (rc < 0 ||
        (o->log_format_name != NULL &&
         (rc = strata_log_parse_format(o->log_format_name, &o->log_format, &d)) < 0) ||
        (o->log_level_name != NULL &&
         (rc = strata_log_parse_level(o->log_level_name, &o->log_level, &d)) < 0)) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return SIM_EXIT_USAGE;
    }
    if (rc != argc || (o->data == NULL && o->report_from == NULL)) {
        usage(stderr);
        strata_log_error("--data is required");
        return SIM_EXIT_USAGE;
    }
    return SIM_EXIT_OK;
}

static int mkdirs(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return STRATA_EIO;
            *p = '/';
        }
    return (mkdir(buf, 0755) == 0 || errno == EEXIST) ? STRATA_OK : STRATA_EIO;
}

/* Starts argv[0] with stdout to out_fd (or the log), stderr to the log
 * file (appended to by every writer). Returns the child's pid, or -1. */
static pid_t spawn(char *const argv[], const char *log, int out_fd)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, STDERR_FILENO);
        dup2(out_fd >= 0 ? out_fd : fd, STDOUT_FILENO);
    }
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv(argv[0], argv);
    strata_log_error("cannot run %s: %s", argv[0], strerror(errno));
    _exit(127);
}

/* The coordinator's standard output: its start-up line, then whatever it
 * prints, which is copied to its log. */
typedef struct server_out {
    int fd;     /* read end of the pipe (non-blocking) */
    int log_fd; /* server.log, opened for appending; -1 when not open */
    char buf[8192];
    size_t len;
} server_out;

/* Reads what the pipe holds (waiting up to wait_ms) and copies it to the
 * log. Returns the number of bytes read, 0 at end of file or when nothing
 * came. */
static size_t server_out_read(server_out *so, int wait_ms)
{
    struct pollfd pf = {so->fd, POLLIN, 0};
    if (poll(&pf, 1, wait_ms) <= 0)
        return 0;
    size_t room = sizeof(so->buf) - 1 - so->len;
    ssize_t k = read(so->fd, so->buf + so->len, room);
    if (k <= 0)
        return 0;
    if (so->log_fd >= 0 && write(so->log_fd, so->buf + so->len, (size_t)k) < 0)
        strata_log_debug("copying the coordinator's output: %s", strerror(errno));
    so->len += (size_t)k;
    return (size_t)k;
}

/* Looks for the start-up line "strata-server: listening on URL" among the
 * complete lines read so far (see docs/operations.md); copies URL into url
 * and returns 1 when it is there. Lines before it are dropped. */
static int server_out_listening(server_out *so, char *url, size_t cap)
{
    static const char MARK[] = "listening on ";
    char *nl;
    while ((nl = memchr(so->buf, '\n', so->len)) != NULL) {
        *nl = '\0';
        const char *p = strstr(so->buf, MARK);
        int found = p != NULL;
        if (found) {
            snprintf(url, cap, "%s", p + strlen(MARK));
            url[strcspn(url, "\r")] = '\0';
        }
        so->len -= (size_t)(nl + 1 - so->buf);
        memmove(so->buf, nl + 1, so->len);
        if (found)
            return 1;
    }
    if (so->len == sizeof(so->buf) - 1)
        so->len = 0; /* an overlong line: drop it */
    return 0;
}

/* The child processes of the run. */
typedef struct procs {
    pid_t server; /* -1 once it has exited */
    pid_t *clients;
    long nclients, done, failed;
} procs;

/* Reaps the children that have exited; returns 1 when the server is one. */
static int procs_reap(procs *p)
{
    int status, server_exited = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid == p->server) {
            p->server = -1;
            server_exited = 1;
            continue;
        }
        for (long i = 0; i < p->nclients; i++)
            if (p->clients[i] == pid) {
                p->clients[i] = 0;
                p->done++;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    p->failed++;
            }
    }
    return server_exited;
}

/* Ends every child that still runs (SIGTERM) and waits for it. */
static void procs_stop(procs *p)
{
    for (long i = 0; p->clients != NULL && i < p->nclients; i++)
        if (p->clients[i] > 0 && kill(p->clients[i], 0) == 0) {
            kill(p->clients[i], SIGTERM);
            waitpid(p->clients[i], NULL, 0);
        }
    if (p->server > 0) {
        kill(p->server, SIGTERM);
        waitpid(p->server, NULL, 0);
        p->server = -1;
    }
}

/* Starts the N clients against the coordinator at url. */
static int start_clients(const sim_opts *o, procs *p, const char *client_bin, const char *url,
                         const char *clients_dir, const char *secret_file)
{
    char s_clients[32], s_seed[32];
    snprintf(s_clients, sizeof(s_clients), "%ld", o->clients);
    snprintf(s_seed, sizeof(s_seed), "%ld", o->seed);
    for (long i = 0; i < o->clients; i++) {
        char cdir[PATH_MAX], clog[PATH_MAX], idx[32];
        if (snprintf(cdir, sizeof(cdir), "%s/%ld", clients_dir, i) >= (int)sizeof(cdir) ||
            snprintf(clog, sizeof(clog), "%s/%ld.log", clients_dir, i) >= (int)sizeof(clog)) {
            strata_log_error("path too long: %s", clients_dir);
            return STRATA_EINVAL;
        }
        snprintf(idx, sizeof(idx), "%ld", i);
        char *cargv[] = {(char *)client_bin,
                         "--server",
                         (char *)url,
                         "--state-dir",
                         cdir,
                         "--data",
                         (char *)o->data,
                         "--partition",
                         (char *)o->partition,
                         "--num-clients",
                         s_clients,
                         "--client-index",
                         idx,
                         "--seed",
                         s_seed,
                         "--threads",
                         "1",
                         "--enrolment-secret-file",
                         (char *)secret_file,
                         NULL};
        if ((p->clients[i] = spawn(cargv, clog, -1)) < 0) {
            p->clients[i] = 0;
            strata_log_error("cannot start a client: %s", strerror(errno));
            return STRATA_EIO;
        }
    }
    return STRATA_OK;
}

/* Shows one closed round: a status line on a terminal, a log line
 * otherwise. */
static void show_round(void *ud, const strata_round_summary *s, uint32_t total)
{
    int *tty = ud;
    char line[256];
    snprintf(line, sizeof(line),
             "round %u/%u: %llu updates, accuracy %.4f, loss %.4f, uplink %llu bytes, %llu ms",
             s->round, total, (unsigned long long)s->participants, sim_summary_metric(s->accuracy),
             sim_summary_metric(s->loss), (unsigned long long)s->uplink_bytes,
             (unsigned long long)s->duration_ms);
    if (*tty) {
        fprintf(stderr, "\r\033[K%s", line);
        fflush(stderr);
    } else {
        strata_log_info("%s", line);
    }
}

/* One poll of the run's progress; a coordinator that does not answer is
 * reported once until it answers again. */
static void poll_progress(sim_follow *f, int *tty, int *failing)
{
    strata_diag d = {{0}};
    int rc = sim_follow_poll(f, show_round, tty, &d);
    if (rc < 0 && rc != STRATA_ESTATE && !*failing)
        strata_log_warn("following the run: %s", strata_diag_msg(&d, rc));
    *failing = rc < 0;
}

/* The run itself: waits for the coordinator's address, starts the clients
 * and follows the rounds until every client has exited. Returns the exit
 * code. */
static int run(const sim_opts *o, procs *p, server_out *so, const char *client_bin,
               const char *clients_dir, const char *secret_file, const char *log)
{
    char url[256] = "";
    strata_deadline start = strata_deadline_in(START_TIMEOUT_MS);
    while (!*g_stop && !server_out_listening(so, url, sizeof(url))) {
        server_out_read(so, 200);
        if (procs_reap(p)) {
            strata_log_error("the coordinator exited early; see %s", log);
            return SIM_EXIT_FAIL;
        }
        if (strata_deadline_expired(start)) {
            strata_log_error("the coordinator did not start; see %s", log);
            return SIM_EXIT_FAIL;
        }
    }
    if (*g_stop)
        return SIM_EXIT_INTERRUPTED;
    strata_log_info("coordinator at %s, starting %ld clients (%s)", url, o->clients, o->partition);
    sim_follow *f = NULL;
    strata_diag d = {{0}};
    int rc = sim_follow_new(url, g_stop, &f, &d);
    if (rc < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return SIM_EXIT_FAIL;
    }
    int code = SIM_EXIT_FAIL, tty = isatty(STDERR_FILENO), failing = 0;
    if (start_clients(o, p, client_bin, url, clients_dir, secret_file) < 0)
        goto out;
    int64_t next_poll = 0;
    while (!*g_stop && p->done < p->nclients) {
        server_out_read(so, 200);
        so->len = 0; /* after the start-up line the output is only logged */
        if (strata_clock_mono_ms() >= next_poll) {
            poll_progress(f, &tty, &failing);
            next_poll = strata_clock_mono_ms() + POLL_INTERVAL_MS;
        }
        if (procs_reap(p)) {
            if (tty)
                fputc('\n', stderr);
            strata_log_error("the coordinator exited early; see %s", log);
            goto out;
        }
    }
    if (*g_stop) {
        code = SIM_EXIT_INTERRUPTED;
        goto out;
    }
    /* Every client has exited: the rounds closed since the last poll. */
    poll_progress(f, &tty, &failing);
    if (tty)
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
    code = SIM_EXIT_OK;
out:
    sim_follow_free(f);
    return code;
}

/* Runs the federation the options describe; returns the exit code. */
static int sim_main(const sim_opts *op)
{
    const sim_opts o = *op;
    int rc;
    g_stop = strata_stop_install();

    char self[PATH_MAX], bindir[PATH_MAX], server_bin[PATH_MAX], client_bin[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        strata_log_error("cannot find its own directory");
        return SIM_EXIT_FAIL;
    }
    self[n] = '\0';
    snprintf(bindir, sizeof(bindir), "%s", dirname(self));
    if (snprintf(server_bin, sizeof(server_bin), "%s/strata-server", bindir) >=
            (int)sizeof(server_bin) ||
        snprintf(client_bin, sizeof(client_bin), "%s/strata-client", bindir) >=
            (int)sizeof(client_bin)) {
        strata_log_error("path too long: %s", bindir);
        return SIM_EXIT_FAIL;
    }

    char state[PATH_MAX], clients_dir[PATH_MAX], log[PATH_MAX];
    snprintf(state, sizeof(state), "%s/state", o.out);
    snprintf(clients_dir, sizeof(clients_dir), "%s/clients", o.out);
    snprintf(log, sizeof(log), "%s/server.log", o.out);
    struct stat st;
    if (stat(state, &st) == 0) {
        strata_log_error("%s already holds a run; choose another --out or remove it", o.out);
        return SIM_EXIT_USAGE;
    }
    if (mkdirs(o.out) < 0 || mkdirs(clients_dir) < 0) {
        strata_log_error("cannot create %s: %s", o.out, strerror(errno));
        return SIM_EXIT_FAIL;
    }
    /* A fresh enrolment secret for this federation, in a file only this user
     * can read (not on any command line). */
    char secret_file[PATH_MAX], secret[STRATA_TOKEN_HEX + 1];
    strata_diag sd = {{0}};
    snprintf(secret_file, sizeof(secret_file), "%s/enrolment.secret", o.out);
    if ((rc = strata_random_token(secret, &sd)) < 0 ||
        (rc = strata_file_write_atomic(secret_file, secret, STRATA_TOKEN_HEX, 0600, &sd)) < 0) {
        strata_log_error("%s", strata_diag_msg(&sd, rc));
        return SIM_EXIT_FAIL;
    }

    char s_clients[32], s_rounds[32], s_seed[32], s_epochs[32], s_batch[32], s_deadline[32];
    snprintf(s_clients, sizeof(s_clients), "%ld", o.clients);
    snprintf(s_rounds, sizeof(s_rounds), "%ld", o.rounds);
    snprintf(s_seed, sizeof(s_seed), "%ld", o.seed);
    snprintf(s_epochs, sizeof(s_epochs), "%ld", o.local_epochs);
    snprintf(s_batch, sizeof(s_batch), "%ld", o.batch);
    snprintf(s_deadline, sizeof(s_deadline), "%ld", o.deadline);
    char *sargv[] = {server_bin,
                     "--state-dir",
                     state,
                     "--model",
                     (char *)o.model,
                     "--data",
                     (char *)o.data,
                     "--host",
                     "127.0.0.1",
                     "--port",
                     "0",
                     "--rounds",
                     s_rounds,
                     "--min-clients",
                     s_clients,
                     "--clients-per-round",
                     s_clients,
                     "--round-deadline",
                     s_deadline,
                     "--policy",
                     (char *)o.policy,
                     "--density",
                     (char *)o.density,
                     "--values",
                     (char *)o.values,
                     "--local-epochs",
                     s_epochs,
                     "--batch",
                     s_batch,
                     "--lr",
                     (char *)o.lr,
                     "--server-opt",
                     (char *)o.server_opt,
                     "--server-lr",
                     (char *)o.server_lr,
                     "--seed",
                     s_seed,
                     "--threads",
                     "1",
                     "--enrolment-secret-file",
                     secret_file,
                     NULL};
    procs p = {.server = -1, .nclients = o.clients};
    server_out so = {.fd = -1, .log_fd = -1};
    int pfd[2];
    if ((p.clients = calloc((size_t)o.clients, sizeof(pid_t))) == NULL || pipe(pfd) != 0) {
        strata_log_error("cannot start the coordinator: %s", strerror(errno));
        free(p.clients);
        return SIM_EXIT_FAIL;
    }
    fcntl(pfd[0], F_SETFD, FD_CLOEXEC);
    fcntl(pfd[1], F_SETFD, FD_CLOEXEC);
    p.server = spawn(sargv, log, pfd[1]);
    close(pfd[1]);
    so.fd = pfd[0];
    fcntl(so.fd, F_SETFL, fcntl(so.fd, F_GETFL) | O_NONBLOCK);
    int code = SIM_EXIT_FAIL;
    if (p.server < 0) {
        strata_log_error("cannot start the coordinator: %s", strerror(errno));
        goto stop;
    }
    /* The child truncates the log as it starts; appending from here on
     * keeps both writers' lines. */
    so.log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    code = run(&o, &p, &so, client_bin, clients_dir, secret_file, log);
stop:
    procs_stop(&p);
    while (server_out_read(&so, 0) > 0)
        so.len = 0;
    close(so.fd);
    if (so.log_fd >= 0)
        close(so.log_fd);
    free(p.clients);
    if (code != SIM_EXIT_OK)
        return code;

    sim_run_info info = {.clients = o.clients,
                         .rounds = o.rounds,
                         .seed = o.seed,
                         .model = o.model,
                         .partition = o.partition,
                         .policy = o.policy,
                         .density = o.density,
                         .values = o.values};
    return sim_report_write(state, o.out, &info, o.json) < 0 ? SIM_EXIT_FAIL : SIM_EXIT_OK;
}

/* --report-from: the report of a coordinator's state directory (the
 * coordinator stopped), in --out; the header's settings are the options
 * given. */
static int report_only(const sim_opts *o)
{
    if (sim_report_check(o->report_from) < 0)
        return SIM_EXIT_FAIL;
    if (mkdirs(o->out) < 0) {
        strata_log_error("cannot create %s", o->out);
        return SIM_EXIT_FAIL;
    }
    sim_run_info info = {.clients = o->clients,
                         .rounds = o->rounds,
                         .seed = o->seed,
                         .data_shares = o->data_shares,
                         .model = o->model,
                         .partition = o->partition,
                         .policy = o->policy,
                         .density = o->density,
                         .values = o->values};
    return sim_report_write(o->report_from, o->out, &info, o->json) < 0 ? SIM_EXIT_FAIL
                                                                        : SIM_EXIT_OK;
}

int main(int argc, char **argv)
{
    strata_log_setup("strata-sim", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    sim_opts o;
    int help = 0, rc = parse(argc, argv, &o, &help);
    if (rc == SIM_EXIT_OK && !help) {
        strata_log_setup("strata-sim", o.log_level, o.log_format);
        rc = o.report_from != NULL ? report_only(&o) : sim_main(&o);
    }
    strata_opts_cleanup(OPTS, NOPTS, &o);
    return rc;
}
