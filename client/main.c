/* strata-client: the edge client's options and its poll loop. It registers
 * with the coordinator (or resumes with the identity in its state
 * directory), settles an upload a previous run staged, then long-polls for
 * tasks and runs each one (round.c) until the federation finishes, the
 * round limit is reached or it is interrupted. The state directory is
 * state.c's, the coordinator's answers session.c's, the HTTP transport
 * transport.c's. The protocol is schemas/api.md. */
#include "round.h"
#include "session.h"
#include "state.h"
#include "transport.h"

#include "strata/data.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/model.h"
#include "strata/parse.h"
#include "strata/partition.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

typedef struct options {
    const char *server, *state_dir, *data, *partition, *name, *secret, *secret_file, *ca_cert;
    char secret_buf[257];
    long num_clients, client_index, threads, max_rounds, poll_wait;
    unsigned long long seed;
    double ef_beta;
    long ef_max_staleness;
    strata_log_level log_level;
    strata_log_format log_format;
} options;

static const char USAGE[] =
    "usage: strata-client --server URL --state-dir DIR --data DIR [options]\n"
    "  --partition SPEC       iid (default), dirichlet:ALPHA or shards:S\n"
    "  --num-clients N        clients the training set is split over (default 1)\n"
    "  --client-index I       this client's share, 0..N-1 (default 0)\n"
    "  --seed S               partition seed, the same for every client (default 1)\n"
    "  --threads T            training threads (default 1)\n"
    "  --name NAME            name sent at registration\n"
    "  --enrolment-secret S   the federation's enrolment secret (needed to register)\n"
    "  --enrolment-secret-file F  or: read it from the first line of file F\n"
    "  --ca-cert FILE         CA certificate (PEM) to trust for https\n"
    "  --max-rounds N         stop after N uploaded updates (default: until finished)\n"
    "  --poll-wait S          long-poll wait for tasks in seconds (default 10)\n"
    "  --ef-beta B            residual decay per missed round, (0, 1] (default 1)\n"
    "  --ef-max-staleness N   drop the residual after N missed rounds (default 0: never)\n"
    "  --log-format F         text (default) or json: one JSON object per log line\n"
    "  --log-level L          debug, info (default), warn or error\n"
    "Exits 0 when the federation has finished, 130 when interrupted.\n";

/* Parses the command line into *o (zeroed on entry, then the defaults).
 * *help is 1 when --help asked for the usage text. Errors: STRATA_EINVAL,
 * after logging what is wrong (and printing the usage text). */
static int parse_options(int argc, char **argv, options *o, int *help)
{
    *help = 0;
    static const struct option opts[] = {
        {"server", required_argument, NULL, 'S'},
        {"state-dir", required_argument, NULL, 'd'},
        {"data", required_argument, NULL, 'D'},
        {"partition", required_argument, NULL, 'p'},
        {"num-clients", required_argument, NULL, 'n'},
        {"client-index", required_argument, NULL, 'i'},
        {"seed", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 't'},
        {"name", required_argument, NULL, 'N'},
        {"enrolment-secret", required_argument, NULL, 'e'},
        {"enrolment-secret-file", required_argument, NULL, 'E'},
        {"ca-cert", required_argument, NULL, 'c'},
        {"max-rounds", required_argument, NULL, 'r'},
        {"poll-wait", required_argument, NULL, 'w'},
        {"ef-beta", required_argument, NULL, 'b'},
        {"ef-max-staleness", required_argument, NULL, 'm'},
        {"log-format", required_argument, NULL, 'F'},
        {"log-level", required_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (options){.partition = "iid",
                   .num_clients = 1,
                   .threads = 1,
                   .poll_wait = 10,
                   .seed = 1,
                   .ef_beta = 1.0,
                   .log_level = STRATA_LOG_INFO,
                   .log_format = STRATA_LOG_TEXT};
    int c, li = 0;
    long v;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        switch (c) {
        case 'S':
            o->server = optarg;
            break;
        case 'd':
            o->state_dir = optarg;
            break;
        case 'D':
            o->data = optarg;
            break;
        case 'p':
            o->partition = optarg;
            break;
        case 'N':
            o->name = optarg;
            break;
        case 'e':
            o->secret = optarg;
            break;
        case 'E':
            o->secret_file = optarg;
            break;
        case 'c':
            o->ca_cert = optarg;
            break;
        case 'n':
            if (strata_parse_long(optarg, 1, 1000000, &o->num_clients))
                goto bad;
            break;
        case 'i':
            if (strata_parse_long(optarg, 0, 999999, &o->client_index))
                goto bad;
            break;
        case 's':
            if (strata_parse_long(optarg, 0, __LONG_MAX__, &v))
                goto bad;
            o->seed = (unsigned long long)v;
            break;
        case 't':
            if (strata_parse_long(optarg, 1, 1024, &o->threads))
                goto bad;
            break;
        case 'r':
            if (strata_parse_long(optarg, 0, 1000000000, &o->max_rounds))
                goto bad;
            break;
        case 'w':
            if (strata_parse_long(optarg, 0, 30, &o->poll_wait))
                goto bad;
            break;
        case 'm':
            if (strata_parse_long(optarg, 0, 1000000000, &o->ef_max_staleness))
                goto bad;
            break;
        case 'b': {
            char *end;
            o->ef_beta = strtod(optarg, &end);
            if (end == optarg || *end || !(o->ef_beta > 0.0 && o->ef_beta <= 1.0))
                goto bad;
            break;
        }
        case 'F':
            if (strata_log_parse_format(optarg, &o->log_format, NULL) < 0)
                goto bad;
            break;
        case 'L':
            if (strata_log_parse_level(optarg, &o->log_level, NULL) < 0)
                goto bad;
            break;
        case 'h':
            *help = 1;
            return STRATA_OK;
        default:
            fputs(USAGE, stderr);
            return STRATA_EINVAL;
        }
    }
    if (optind != argc || !o->server || !o->state_dir || !o->data) {
        fputs(USAGE, stderr);
        strata_log_error("--server, --state-dir and --data are required");
        return STRATA_EINVAL;
    }
    if (o->client_index >= o->num_clients) {
        strata_log_error("--client-index must be below --num-clients");
        return STRATA_EINVAL;
    }
    if (o->secret_file != NULL) {
        strata_diag d = {{0}};
        size_t n = 0;
        int rc =
            strata_file_read_line(o->secret_file, o->secret_buf, sizeof(o->secret_buf), &n, &d);
        if (o->secret != NULL || rc < 0 || n == 0) {
            strata_log_error("--enrolment-secret-file: %s",
                             o->secret ? "give either it or --enrolment-secret"
                             : rc < 0  ? strata_diag_msg(&d, rc)
                                       : "no secret on its first line");
            return STRATA_EINVAL;
        }
        o->secret = o->secret_buf;
    }
    return STRATA_OK;
bad:
    strata_log_error("invalid value '%s' for --%s", optarg, opts[li].name);
    return STRATA_EINVAL;
}

/* Registers again after the coordinator refused the saved token (its state
 * was reset): the old federation's files are forgotten first. */
static int register_again(const options *o, strata_http *h, strata_client_state *st,
                          strata_client_identity *id)
{
    strata_log_warn("the coordinator refused the saved token (its state was reset?); "
                    "registering again and starting afresh");
    strata_diag d = {{0}};
    int rc = strata_http_set_token(h, NULL);
    if (rc < 0)
        return rc;
    if ((rc = strata_client_state_forget(st, &d)) < 0)
        strata_log_warn("%s", strata_diag_msg(&d, rc));
    if ((rc = strata_client_session_register(h, st, o->server, o->name, o->secret, id)) < 0)
        return rc;
    return strata_http_set_token(h, id->token);
}

/* Polls for tasks and runs them until the federation finishes (returns
 * STRATA_OK with *finished 1), --max-rounds acknowledged uploads (STRATA_OK),
 * a stop, or an error. */
static int poll_loop(const options *o, strata_client_round_ctx *rc_ctx, strata_client_identity *id,
                     int *finished)
{
    *finished = 0;
    long uploaded = 0;
    int reregistered = 0;
    int rc = STRATA_OK;
    while (!g_stop && (o->max_rounds == 0 || uploaded < o->max_rounds)) {
        strata_client_poll outcome;
        strata_task t;
        double wait;
        if (strata_client_session_poll(rc_ctx->http, o->poll_wait, &outcome, &t, &wait) < 0)
            break; /* logged; ends the run as the round limit does */
        if (outcome == STRATA_CLIENT_POLL_FINISHED) {
            strata_log_info("the federation has finished");
            *finished = 1;
            return STRATA_OK;
        }
        if (outcome == STRATA_CLIENT_POLL_NONE) {
            strata_http_sleep(rc_ctx->http, wait); /* a stop ends the loop above */
            continue;
        }
        if (outcome == STRATA_CLIENT_POLL_UNKNOWN) {
            if (reregistered) {
                strata_log_error("task request refused (HTTP 401) after registering again");
                return STRATA_EPROTO;
            }
            if ((rc = register_again(o, rc_ctx->http, rc_ctx->state, id)) < 0)
                return rc;
            reregistered = 1;
            continue;
        }
        reregistered = 0;
        strata_client_upload result;
        rc = strata_client_round_run(rc_ctx, &t, &result);
        strata_task_cleanup(&t);
        if (rc < 0 && !g_stop)
            return rc;
        if (rc == STRATA_OK && result == STRATA_CLIENT_ACKED)
            uploaded++; /* a refused update is dropped and not counted */
    }
    return g_stop ? STRATA_ESTATE : STRATA_OK;
}

int main(int argc, char **argv)
{
    strata_log_setup("strata-client", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    options o;
    int help;
    if (parse_options(argc, argv, &o, &help) < 0)
        return 2;
    if (help) {
        fputs(USAGE, stdout);
        return 0;
    }
    strata_log_setup("strata-client", o.log_level, o.log_format);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    strata_dataset ds;
    strata_dataset_init(&ds);
    strata_partition *part = NULL;
    strata_http *h = NULL;
    strata_client_state *st = NULL;
    strata_diag d = {{0}};
    int code = 1, rc;
    if ((rc = strata_client_state_open(o.state_dir, &st, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    strata_set_threads((int)o.threads);
    if ((rc = strata_data_load_dir(o.data, "train", 0, &ds, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    if ((rc = strata_partition_new(ds.y, ds.n, ds.num_classes, o.partition, (size_t)o.num_clients,
                                   o.seed, &part, &d)) < 0) {
        strata_log_error("--partition: %s", strata_diag_msg(&d, rc));
        code = 2;
        goto out;
    }
    if ((rc = strata_http_new(o.server, o.ca_cert, &g_stop, &h, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        code = 2;
        goto out;
    }
    strata_client_identity id;
    if (strata_client_state_load_identity(st, &id, NULL) == STRATA_OK)
        strata_log_info("resuming as client %lld", id.client_id);
    else if (strata_client_session_register(h, st, o.server, o.name, o.secret, &id) == STRATA_OK)
        strata_log_info("registered as client %lld", id.client_id);
    else
        goto out;
    if (strata_http_set_token(h, id.token) < 0)
        goto out;
    int has_last;
    uint32_t last;
    if (strata_client_state_last_receipt(st, &has_last, &last) == STRATA_OK && has_last)
        strata_log_debug("last acknowledged round: %u", last);
    strata_client_round_ctx ctx = {.http = h,
                                   .state = st,
                                   .id = &id,
                                   .data = &ds,
                                   .mine = part->indices[o.client_index],
                                   .nmine = part->counts[o.client_index],
                                   .client_index = (uint64_t)o.client_index,
                                   .ef_beta = o.ef_beta,
                                   .ef_max_staleness = (uint32_t)o.ef_max_staleness,
                                   .progress =
                                       isatty(STDERR_FILENO) && o.log_format == STRATA_LOG_TEXT,
                                   .stop = &g_stop};
    int settled;
    strata_client_upload result;
    if (strata_client_round_settle(&ctx, &settled, &result) < 0)
        goto out;
    strata_log_info("%zu training samples (share %ld of %ld, partition %s)", ctx.nmine,
                    o.client_index, o.num_clients, o.partition);
    int finished;
    if (poll_loop(&o, &ctx, &id, &finished) == STRATA_OK)
        code = 0;
out:
    if (g_stop)
        code = 130; /* interrupted: state is saved, a restart continues */
    strata_http_free(h);
    strata_client_state_free(st);
    strata_partition_free(part);
    strata_dataset_cleanup(&ds);
    return code;
}
