/* strata-sim: runs a whole federation on this machine — a coordinator on a
 * free loopback port and N edge-client processes over a partition of a real
 * data set — shows progress, and writes report.csv and report.md from the
 * coordinator's round records. */
#include "store.h"

#include "strata/fileio.h"
#include "strata/parse.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

typedef struct sim_opts {
    long clients, rounds, seed, local_epochs, batch, deadline;
    const char *model, *data, *partition, *policy, *density, *values, *out, *lr, *server_opt;
    int json;
} sim_opts;

static const char USAGE[] =
    "usage: strata-sim --clients N --rounds R --model mlp|cnn|ARCH.json --data DIR\n"
    "                  [--partition iid|dirichlet:ALPHA|shards:S] [--policy SPEC] [--density D]\n"
    "                  [--values fp32|fp16|bf16] [--local-epochs E] [--batch B] [--lr LR]\n"
    "                  [--server-opt plain|fedavgm|fedadam|fedyogi] [--round-deadline S]\n"
    "                  [--seed S] [--out DIR] [--json]\n"
    "Starts strata-server on a free loopback port and N strata-client processes (one\n"
    "thread each), shows progress, and writes report.csv and report.md in --out\n"
    "(default out/sim). --policy none runs dense FedAvg. With --json the last line of\n"
    "output is a JSON summary.\n";

static int parse(int argc, char **argv, sim_opts *o)
{
    static const struct option opts[] = {
        {"clients", required_argument, NULL, 'c'},
        {"rounds", required_argument, NULL, 'r'},
        {"model", required_argument, NULL, 'm'},
        {"data", required_argument, NULL, 'd'},
        {"partition", required_argument, NULL, 'p'},
        {"policy", required_argument, NULL, 'P'},
        {"density", required_argument, NULL, 'D'},
        {"values", required_argument, NULL, 'v'},
        {"local-epochs", required_argument, NULL, 'e'},
        {"batch", required_argument, NULL, 'b'},
        {"lr", required_argument, NULL, 'l'},
        {"server-opt", required_argument, NULL, 'o'},
        {"round-deadline", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'O'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (sim_opts){.clients = 10,
                    .rounds = 10,
                    .seed = 1,
                    .local_epochs = 1,
                    .batch = 32,
                    .deadline = 120,
                    .model = "mlp",
                    .partition = "iid",
                    .policy = "uniform",
                    .density = "0.01",
                    .values = "fp32",
                    .out = "out/sim",
                    .lr = "0.05",
                    .server_opt = "plain"};
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case 'c':
            bad = strata_parse_long(optarg, 1, 1000, &o->clients);
            break;
        case 'r':
            bad = strata_parse_long(optarg, 1, 100000, &o->rounds);
            break;
        case 'e':
            bad = strata_parse_long(optarg, 1, 1000, &o->local_epochs);
            break;
        case 'b':
            bad = strata_parse_long(optarg, 1, 65536, &o->batch);
            break;
        case 't':
            bad = strata_parse_long(optarg, 1, 86400, &o->deadline);
            break;
        case 's':
            bad = strata_parse_long(optarg, 0, __LONG_MAX__, &o->seed);
            break;
        case 'm':
            o->model = optarg;
            break;
        case 'd':
            o->data = optarg;
            break;
        case 'p':
            o->partition = optarg;
            break;
        case 'P':
            o->policy = optarg;
            break;
        case 'D':
            o->density = optarg;
            break;
        case 'v':
            o->values = optarg;
            break;
        case 'l':
            o->lr = optarg;
            break;
        case 'o':
            o->server_opt = optarg;
            break;
        case 'O':
            o->out = optarg;
            break;
        case 'j':
            o->json = 1;
            break;
        case 'h':
            fputs(USAGE, stdout);
            exit(0);
        default:
            fputs(USAGE, stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "strata-sim: invalid value '%s' for --%s\n", optarg, opts[li].name);
            return 2;
        }
    }
    if (optind != argc || o->data == NULL) {
        fputs(USAGE, stderr);
        fprintf(stderr, "strata-sim: --data is required\n");
        return 2;
    }
    return 0;
}

static int mkdirs(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return (mkdir(buf, 0755) == 0 || errno == EEXIST) ? 0 : -1;
}

/* Starts argv[0] with stdout to out_fd (or a log), stderr to the log file. */
static pid_t spawn(char *const argv[], const char *log, int out_fd)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, STDERR_FILENO);
        dup2(out_fd >= 0 ? out_fd : fd, STDOUT_FILENO);
    }
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv(argv[0], argv);
    fprintf(stderr, "strata-sim: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

static double num(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

int main(int argc, char **argv)
{
    sim_opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0)
        return rc;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    char self[PATH_MAX], bindir[PATH_MAX], server_bin[PATH_MAX], client_bin[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        fprintf(stderr, "strata-sim: cannot find its own directory\n");
        return 1;
    }
    self[n] = '\0';
    snprintf(bindir, sizeof(bindir), "%s", dirname(self));
    if (snprintf(server_bin, sizeof(server_bin), "%s/strata-server", bindir) >=
            (int)sizeof(server_bin) ||
        snprintf(client_bin, sizeof(client_bin), "%s/strata-client", bindir) >=
            (int)sizeof(client_bin)) {
        fprintf(stderr, "strata-sim: path too long\n");
        return 1;
    }

    char state[PATH_MAX], clients_dir[PATH_MAX], log[PATH_MAX];
    snprintf(state, sizeof(state), "%s/state", o.out);
    snprintf(clients_dir, sizeof(clients_dir), "%s/clients", o.out);
    struct stat st;
    if (stat(state, &st) == 0) {
        fprintf(stderr, "strata-sim: %s already holds a run; choose another --out or remove it\n",
                o.out);
        return 2;
    }
    if (mkdirs(o.out) != 0 || mkdirs(clients_dir) != 0) {
        fprintf(stderr, "strata-sim: cannot create %s: %s\n", o.out, strerror(errno));
        return 1;
    }
    /* A fresh enrolment secret for this federation, in a file only this user
     * can read (not on any command line). */
    char secret_file[PATH_MAX], secret[STRATA_TOKEN_HEX + 1];
    strata_diag sd = {{0}};
    snprintf(secret_file, sizeof(secret_file), "%s/enrolment.secret", o.out);
    if (strata_random_token(secret, &sd) < 0) {
        fprintf(stderr, "strata-sim: %s\n", strata_diag_msg(&sd, STRATA_EIO));
        return 1;
    }
    int src = strata_file_write_atomic(secret_file, secret, STRATA_TOKEN_HEX, 0600, &sd);
    if (src < 0) {
        fprintf(stderr, "strata-sim: %s\n", strata_diag_msg(&sd, src));
        return 1;
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
                     "--seed",
                     s_seed,
                     "--threads",
                     "1",
                     "--enrolment-secret-file",
                     secret_file,
                     NULL};
    int pfd[2];
    if (pipe(pfd) != 0)
        return 1;
    snprintf(log, sizeof(log), "%s/server.log", o.out);
    pid_t server = spawn(sargv, log, pfd[1]);
    close(pfd[1]);
    int out_fd = pfd[0];
    fcntl(out_fd, F_SETFL, fcntl(out_fd, F_GETFL) | O_NONBLOCK);
    char lines[8192], url[256] = "";
    size_t alen = 0;
    int code = 1, tty = isatty(STDERR_FILENO), server_done = 0;
    pid_t *cpids = calloc((size_t)o.clients, sizeof(pid_t));
    long done_clients = 0, failed_clients = 0, last_round = -1, total_rounds = o.rounds;
    json_t *rounds = NULL;
    time_t start = time(NULL);
    if (cpids == NULL)
        goto stop;
    /* One loop reads the coordinator's lines (the address first, then one
     * line per closed round) and reaps the processes as they end. */
    while (!g_stop) {
        struct pollfd pf = {out_fd, POLLIN, 0};
        if (poll(&pf, 1, 200) > 0) {
            ssize_t k = read(out_fd, lines + alen, sizeof(lines) - 1 - alen);
            if (k > 0)
                alen += (size_t)k;
        }
        char *nl;
        while ((nl = memchr(lines, '\n', alen)) != NULL) {
            *nl = '\0';
            const char *line = lines, *p = strstr(line, "listening on ");
            long r, total;
            if (url[0] == '\0' && p != NULL) {
                snprintf(url, sizeof(url), "%s", p + strlen("listening on "));
                url[strcspn(url, "\r")] = '\0';
                fprintf(stderr, "strata-sim: coordinator at %s, starting %ld clients (%s)\n", url,
                        o.clients, o.partition);
                for (long i = 0; i < o.clients; i++) {
                    char cdir[PATH_MAX], clog[PATH_MAX], idx[32];
                    if (snprintf(cdir, sizeof(cdir), "%s/%ld", clients_dir, i) >=
                            (int)sizeof(cdir) ||
                        snprintf(clog, sizeof(clog), "%s/%ld.log", clients_dir, i) >=
                            (int)sizeof(clog)) {
                        fprintf(stderr, "strata-sim: path too long\n");
                        goto stop;
                    }
                    snprintf(idx, sizeof(idx), "%ld", i);
                    char *cargv[] = {client_bin,
                                     "--server",
                                     url,
                                     "--state-dir",
                                     cdir,
                                     "--data",
                                     (char *)o.data,
                                     "--partition",
                                     (char *)o.partition,
                                     "--num-clients",
                                     s_clients,
                                     "--client-index",
                                     idx,
                                     "--seed",
                                     s_seed,
                                     "--threads",
                                     "1",
                                     "--enrolment-secret-file",
                                     secret_file,
                                     NULL};
                    cpids[i] = spawn(cargv, clog, -1);
                }
            } else if (sscanf(line, "round %ld/%ld", &r, &total) == 2) {
                last_round = r;
                total_rounds = total;
                if (tty)
                    fprintf(stderr, "\r\033[K%s", line);
                else
                    fprintf(stderr, "%s\n", line);
            }
            alen -= (size_t)(nl + 1 - lines);
            memmove(lines, nl + 1, alen);
        }
        if (alen == sizeof(lines) - 1)
            alen = 0; /* an overlong line: drop it */
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            if (pid == server) {
                server = -1;
                server_done = 1;
                continue;
            }
            for (long i = 0; i < o.clients; i++)
                if (cpids[i] == pid) {
                    cpids[i] = 0;
                    done_clients++;
                    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                        failed_clients++;
                }
        }
        if (server_done) {
            fprintf(stderr, "\nstrata-sim: the coordinator exited early; see %s\n", log);
            goto stop;
        }
        if (url[0] == '\0' && time(NULL) - start > 120) {
            fprintf(stderr, "strata-sim: the coordinator did not start; see %s\n", log);
            goto stop;
        }
        if (url[0] != '\0' && done_clients == o.clients)
            break;
    }
    if (tty)
        fputc('\n', stderr);
    if (!g_stop && (failed_clients > 0 || last_round + 1 < total_rounds)) {
        fprintf(stderr,
                "strata-sim: %ld of %ld clients failed and %ld of %ld rounds finished; see the "
                "logs in %s\n",
                failed_clients, o.clients, last_round + 1, total_rounds, o.out);
        goto stop;
    }
    code = g_stop ? 130 : 0;
stop:
    for (long i = 0; cpids && i < o.clients; i++)
        if (cpids[i] > 0 && kill(cpids[i], 0) == 0) {
            kill(cpids[i], SIGTERM);
            waitpid(cpids[i], NULL, 0);
        }
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
    }
    close(out_fd);
    free(cpids);
    if (code != 0)
        return code;

    /* Report from the coordinator's records. */
    strata_store *s = NULL;
    strata_diag d = {{0}};
    strata_store_round *list = NULL;
    size_t nr = 0;
    if (strata_store_open(state, &s, &d) < 0 ||
        strata_store_round_list(s, 0, 1000000, &list, &nr, &d) < 0) {
        fprintf(stderr, "strata-sim: cannot read the coordinator's records: %s\n", d.msg);
        strata_store_close(s);
        return 1;
    }
    char csv[PATH_MAX], md[PATH_MAX];
    snprintf(csv, sizeof(csv), "%s/report.csv", o.out);
    snprintf(md, sizeof(md), "%s/report.md", o.out);
    FILE *fc = fopen(csv, "w"), *fm = fopen(md, "w");
    if (fc == NULL || fm == NULL) {
        fprintf(stderr, "strata-sim: cannot write the report in %s\n", o.out);
        code = 1;
    } else {
        fprintf(fc, "round,participants,accuracy,loss,uplink_bytes,downlink_bytes,"
                    "dense_uplink_bytes,compression_ratio");
        /* One density column per layer, named after the first summary. */
        for (size_t i = 0; i < nr; i++) {
            json_t *sj = list[i].summary_json ? json_loads(list[i].summary_json, 0, NULL) : NULL;
            json_t *dj = json_object_get(sj, "densities");
            if (json_is_object(dj)) {
                const char *k;
                json_t *v;
                json_object_foreach(dj, k, v)
                {
                    (void)v;
                    fprintf(fc, ",density:%s", k);
                }
                json_decref(sj);
                break;
            }
            json_decref(sj);
        }
        fputc('\n', fc);
        fprintf(fm,
                "# strata-sim report\n\n%ld clients, %ld rounds, model %s, partition %s, policy "
                "%s, density %s, values %s, seed %ld\n\n"
                "| round | participants | accuracy | loss | uplink bytes | downlink bytes | "
                "compression |\n|---|---|---|---|---|---|---|\n",
                o.clients, o.rounds, o.model, o.partition, o.policy, o.density, o.values, o.seed);
    }
    rounds = json_array();
    double up = 0, down = 0, dense = 0, acc = 0;
    json_t *last_densities = NULL;
    for (size_t i = 0; fc && fm && i < nr; i++) {
        if (list[i].summary_json == NULL)
            continue;
        json_t *sj = json_loads(list[i].summary_json, 0, NULL);
        if (sj == NULL)
            continue;
        double u = num(sj, "uplink_bytes"), dn = num(sj, "downlink_bytes");
        double de = num(sj, "dense_uplink_bytes");
        acc = num(sj, "accuracy");
        up += u;
        down += dn;
        dense += de;
        long parts = (long)json_integer_value(json_object_get(sj, "participants"));
        fprintf(fc, "%u,%ld,%.6f,%.6f,%.0f,%.0f,%.0f,%.2f", list[i].round, parts, acc,
                num(sj, "loss"), u, dn, de, u > 0 ? de / u : 0.0);
        const char *lk;
        json_t *lv;
        json_object_foreach(json_object_get(sj, "densities"), lk, lv)
        {
            fprintf(fc, ",%.6f", json_number_value(lv));
        }
        fputc('\n', fc);
        fprintf(fm, "| %u | %ld | %.4f | %.4f | %.0f | %.0f | %.1fx |\n", list[i].round, parts, acc,
                num(sj, "loss"), u, dn, u > 0 ? de / u : 0.0);
        json_decref(last_densities);
        last_densities = json_incref(json_object_get(sj, "densities"));
        json_array_append_new(rounds, sj);
    }
    if (fm != NULL && last_densities != NULL && json_is_object(last_densities)) {
        fprintf(fm, "\nPer-layer densities of the last round (every round's are in "
                    "report.csv):\n\n| tensor | density |\n|---|---|\n");
        const char *k;
        json_t *v;
        json_object_foreach(last_densities, k, v)
        {
            fprintf(fm, "| %s | %.6f |\n", k, json_number_value(v));
        }
    }
    if (fm != NULL)
        fprintf(fm,
                "\nTotal: uplink %.0f bytes (dense updates would be %.0f, %.1fx more), "
                "downlink %.0f bytes, final accuracy %.4f.\n",
                up, dense, up > 0 ? dense / up : 0.0, down, acc);
    if (fc)
        fclose(fc);
    if (fm)
        fclose(fm);
    json_decref(last_densities);
    fprintf(stderr,
            "strata-sim: %zu rounds, final accuracy %.4f, uplink %.0f bytes (%.1fx less "
            "than dense), report in %s\n",
            nr, acc, up, up > 0 ? dense / up : 0.0, md);
    if (o.json) {
        json_t *sum =
            json_pack("{s:f,s:I,s:I,s:f,s:f,s:f,s:s}", "final_accuracy", acc, "rounds",
                      (json_int_t)nr, "clients", (json_int_t)o.clients, "uplink_bytes", up,
                      "downlink_bytes", down, "dense_uplink_bytes", dense, "report", md);
        char *text = json_dumps(sum, JSON_COMPACT | JSON_PRESERVE_ORDER);
        puts(text);
        free(text);
        json_decref(sum);
    }
    json_decref(rounds);
    strata_store_round_list_free(list, nr);
    strata_store_close(s);
    return code;
}
