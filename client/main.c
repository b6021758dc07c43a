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
#include "strata/ef.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/model.h"
#include "strata/opts.h"
#include "strata/stop.h"
#include "strata/partition.h"

#include <stddef.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set once SIGINT or SIGTERM arrives (strata_stop_install). */
static volatile sig_atomic_t *g_stop;

typedef struct options {
    char *server, *state_dir, *data, *partition, *name, *secret, *secret_file, *ca_cert;
    long num_clients, client_index, threads, max_rounds, poll_wait, seed;
    strata_ef_opts ef;
    char *log_format_name, *log_level_name;
    strata_log_level log_level;
    strata_log_format log_format;
} options;

#define OFF(f) offsetof(options, f)
static const strata_opt OPTS[] = {
    {"server", STRATA_OPT_STRING, OFF(server), 0, 0, "URL", "the coordinator's URL; required"},
    {"state_dir", STRATA_OPT_STRING, OFF(state_dir), 0, 0, "DIR",
     "identity, staged uploads, residuals; required"},
    {"data", STRATA_OPT_STRING, OFF(data), 0, 0, "DIR", "data set directory; required"},
    {"partition", STRATA_OPT_STRING, OFF(partition), 0, 0, "SPEC",
     "iid (default), dirichlet:ALPHA, shards:S, or none: --data holds\n"
     "only this client's share (every sample is its own)"},
    {"num_clients", STRATA_OPT_INTEGER, OFF(num_clients), 1, 1000000, "N",
     "clients the training set is split over (default 1, or the coordinator's --data-shares)"},
    {"client_index", STRATA_OPT_INTEGER, OFF(client_index), 0, 999999, "I",
     "this client's share, 0..N-1 (default 0, or the share the coordinator assigned)"},
    {"seed", STRATA_OPT_INTEGER, OFF(seed), 0, (double)LONG_MAX, "S",
     "partition seed, the same for every client (default 1)"},
    {"threads", STRATA_OPT_INTEGER, OFF(threads), 1, 1024, "T", "training threads (default 1)"},
    {"name", STRATA_OPT_STRING, OFF(name), 0, 0, "NAME", "name sent at registration"},
    {"enrolment_secret", STRATA_OPT_STRING, OFF(secret), 0, 0, "S",
     "the federation's enrolment secret (needed to register)"},
    {"enrolment_secret_file", STRATA_OPT_STRING, OFF(secret_file), 0, 0, "F",
     "or: read it from the first line of file F"},
    {"ca_cert", STRATA_OPT_STRING, OFF(ca_cert), 0, 0, "FILE",
     "CA certificate (PEM) to trust for https"},
    {"max_rounds", STRATA_OPT_INTEGER, OFF(max_rounds), 0, 1000000000, "N",
     "stop after N uploaded updates (default: until finished)"},
    {"poll_wait", STRATA_OPT_INTEGER, OFF(poll_wait), 0, 30, "S",
     "long-poll wait for tasks in seconds (default 10)"},
};
static const strata_opt LOG_OPTS[] = {
    {"log_format", STRATA_OPT_STRING, OFF(log_format_name), 0, 0, "F",
     "text (default) or json: one JSON object per log line"},
    {"log_level", STRATA_OPT_STRING, OFF(log_level_name), 0, 0, "L",
     "debug, info (default), warn or error"},
};
#define NOWN (sizeof(OPTS) / sizeof(OPTS[0]))
#define NLOG (sizeof(LOG_OPTS) / sizeof(LOG_OPTS[0]))
#define NOPTS (NOWN + STRATA_EF_NOPTS + NLOG)

/* The whole option table: OPTS, the residual settings' rows
 * (strata_ef_opt_rows, which strata-sim checks its clients' values with),
 * then LOG_OPTS. Built once, before any thread starts. */
static const strata_opt *opts_table(void)
{
    static strata_opt table[NOPTS];
    if (table[0].key == NULL) {
        memcpy(table, OPTS, sizeof(OPTS));
        for (size_t i = 0; i < STRATA_EF_NOPTS; i++) {
            table[NOWN + i] = strata_ef_opt_rows[i];
            table[NOWN + i].offset += OFF(ef);
        }
        memcpy(table + NOWN + STRATA_EF_NOPTS, LOG_OPTS, sizeof(LOG_OPTS));
    }
    return table;
}

/* Writes the usage text to f. */
static void usage(FILE *f)
{
    strata_buf b;
    strata_buf_init(&b, 1 << 16);
    fputs("usage: strata-client --server URL --state-dir DIR --data DIR [options]\n", f);
    if (strata_opts_usage(opts_table(), NOPTS, &b) == STRATA_OK)
        fputs((const char *)b.data, f);
    fputs("Exits 0 when the federation has finished or --max-rounds updates were acknowledged,\n"
          "1 on an error, 2 on a bad command line, 130 when interrupted.\n",
          f);
    strata_buf_cleanup(&b);
}

/* Frees the strings *o owns. */
static void options_cleanup(options *o)
{
    strata_opts_cleanup(opts_table(), NOPTS, o);
}

/* Parses the command line into *o (zeroed on entry, then the defaults;
 * options_cleanup frees it, also after an error). *help is 1 when --help
 * asked for the usage text. Errors: STRATA_EINVAL, after logging what is
 * wrong; STRATA_ENOMEM. */
static int parse_options(int argc, char **argv, options *o, int *help)
{
    *o = (options){.partition = strdup("iid"),
                   .num_clients = 0, /* 0 and -1: not given */
                   .client_index = -1,
                   .threads = 1,
                   .poll_wait = 10,
                   .seed = 1,
                   .ef = STRATA_EF_OPTS_DEFAULT,
                   .log_level = STRATA_LOG_INFO,
                   .log_format = STRATA_LOG_TEXT};
    if (o->partition == NULL)
        return STRATA_ENOMEM;
    strata_diag d = {{0}};
    int rc = strata_opts_parse_argv(opts_table(), NOPTS, argc, argv, o, help, &d);
    if (rc < 0) {
        strata_log_error("%s (see --help)", strata_diag_msg(&d, rc));
        return rc;
    }
    if (*help)
        return STRATA_OK;
    if (rc != argc) {
        strata_log_error("unexpected argument '%s' (see --help)", argv[rc]);
        return STRATA_EINVAL;
    }
    if (!o->server || !o->state_dir || !o->data) {
        strata_log_error("--server, --state-dir and --data are required (see --help)");
        return STRATA_EINVAL;
    }
    if ((o->log_format_name != NULL &&
         (rc = strata_log_parse_format(o->log_format_name, &o->log_format, &d)) < 0) ||
        (o->log_level_name != NULL &&
         (rc = strata_log_parse_level(o->log_level_name, &o->log_level, &d)) < 0)) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return STRATA_EINVAL;
    }
    if (o->client_index >= 0 && o->num_clients > 0 && o->client_index >= o->num_clients) {
        strata_log_error("--client-index must be below --num-clients");
        return STRATA_EINVAL;
    }
    if (o->secret_file != NULL) {
        char line[257];
        size_t n = 0;
        rc = strata_file_read_line(o->secret_file, line, sizeof(line), &n, &d);
        if (o->secret != NULL || rc < 0 || n == 0) {
            strata_log_error("--enrolment-secret-file: %s",
                             o->secret ? "give either it or --enrolment-secret"
                             : rc < 0  ? strata_diag_msg(&d, rc)
                                       : "no secret on its first line");
            return STRATA_EINVAL;
        }
        if ((o->secret = strdup(line)) == NULL)
            return STRATA_ENOMEM;
    }
    return STRATA_OK;
}

/* Settles which share of the training set this client trains on: the one
 * the coordinator assigned (id), which --num-clients and --client-index may
 * repeat but not contradict, else theirs (defaults 1 and 0). Errors:
 * STRATA_EINVAL, logged. */
static int choose_share(const options *o, const strata_client_identity *id, long *index,
                        long *count)
{
    *count = o->num_clients > 0 ? o->num_clients : 1;
    *index = o->client_index >= 0 ? o->client_index : 0;
    if (id->data_shares == 0 && *index >= *count) {
        strata_log_error("--client-index must be below --num-clients (default 1)");
        return STRATA_EINVAL;
    }
    if (id->data_shares == 0)
        return STRATA_OK;
    if ((o->num_clients > 0 && o->num_clients != id->data_shares) ||
        (o->client_index >= 0 && o->client_index != id->data_share)) {
        strata_log_error("--num-clients/--client-index disagree with the share the coordinator "
                         "assigned (%ld of %ld); leave them out",
                         id->data_share, id->data_shares);
        return STRATA_EINVAL;
    }
    *count = id->data_shares;
    *index = id->data_share;
    return STRATA_OK;
}

/* Registers again after the coordinator refused the saved token (its state
 * was reset): the old federation's files are forgotten first. The new
 * registration may come with another data share: the same count switches
 * the round context to it; another count is an error (the partition was
 * made for the old one; a restart makes the new one). */
static int register_again(const options *o, strata_http *h, strata_client_state *st,
                          strata_client_identity *id, strata_client_round_ctx *ctx,
                          const strata_partition *part)
{
    long old_count = 0, old_index = 0, count = 0, index = 0;
    if (choose_share(o, id, &old_index, &old_count) < 0)
        return STRATA_EINVAL;
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
    if ((rc = choose_share(o, id, &index, &count)) < 0)
        return rc;
    if (count != old_count) {
        strata_log_error("the coordinator assigned share %ld of %ld, this run split the data in "
                         "%ld; restart the client",
                         index, count, old_count);
        return STRATA_EINVAL;
    }
    if (index != old_index && part != NULL) { /* --partition none: the data is the share */
        strata_log_info("now training on share %ld of %ld", index, count);
        ctx->mine = part->indices[index];
        ctx->nmine = part->counts[index];
        ctx->client_index = (uint64_t)index;
    }
    return strata_http_set_token(h, id->token);
}

/* This client's samples: share index of count of the partition, or with
 * --partition none every sample of the data set (a directory that holds
 * only this client's share, as strata-sim writes them); *part (NULL for
 * none) and *all own what *mine points into. */
static int own_share(const options *o, const strata_dataset *ds, long index, long count,
                     strata_partition **part, size_t **all, const size_t **mine, size_t *n_mine,
                     strata_diag *d)
{
    *part = NULL;
    *all = NULL;
    if (strcmp(o->partition, "none") != 0) {
        int rc = strata_partition_new(ds->y, ds->n, ds->num_classes, o->partition, (size_t)count,
                                      (unsigned long long)o->seed, part, d);
        if (rc < 0)
            return rc;
        *mine = (*part)->indices[index];
        *n_mine = (*part)->counts[index];
        return STRATA_OK;
    }
    if (ds->n > SIZE_MAX / sizeof(size_t) || (*all = malloc(ds->n * sizeof(size_t))) == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory");
    for (size_t i = 0; i < ds->n; i++)
        (*all)[i] = i;
    *mine = *all;
    *n_mine = ds->n;
    return STRATA_OK;
}

/* Polls for tasks and runs them until the federation finishes (returns
 * STRATA_OK with *finished 1), --max-rounds acknowledged uploads (STRATA_OK),
 * a stop (STRATA_ESTATE), or an error: a task request that failed for good
 * (after the transport's retries) or a round that failed, logged. */
static int poll_loop(const options *o, strata_client_round_ctx *rc_ctx, strata_client_identity *id,
                     const strata_partition *part, int *finished)
{
    *finished = 0;
    long uploaded = 0;
    int reregistered = 0;
    int rc = STRATA_OK;
    while (!*g_stop && (o->max_rounds == 0 || uploaded < o->max_rounds)) {
        strata_client_poll outcome;
        strata_task t;
        double wait;
        if ((rc = strata_client_session_poll(rc_ctx->http, o->poll_wait, &outcome, &t, &wait)) < 0)
            return *g_stop ? STRATA_ESTATE : rc; /* logged */
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
            if ((rc = register_again(o, rc_ctx->http, rc_ctx->state, id, rc_ctx, part)) < 0)
                return rc;
            reregistered = 1;
            continue;
        }
        reregistered = 0;
        strata_client_upload result;
        rc = strata_client_round_run(rc_ctx, &t, &result);
        strata_task_cleanup(&t);
        if (rc < 0 && !*g_stop)
            return rc;
        if (rc == STRATA_OK && result == STRATA_CLIENT_ACKED)
            uploaded++; /* a refused update is dropped and not counted */
    }
    return *g_stop ? STRATA_ESTATE : STRATA_OK;
}

int main(int argc, char **argv)
{
    strata_log_setup("strata-client", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    options o;
    int help;
    if (parse_options(argc, argv, &o, &help) < 0) {
        options_cleanup(&o);
        return 2;
    }
    if (help) {
        usage(stdout);
        options_cleanup(&o);
        return 0;
    }
    strata_log_setup("strata-client", o.log_level, o.log_format);
    g_stop = strata_stop_install();
    strata_dataset ds;
    strata_dataset_init(&ds);
    strata_partition *part = NULL;
    size_t *all = NULL, n_mine = 0;
    const size_t *mine = NULL;
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
    if ((rc = strata_http_new(o.server, o.ca_cert, g_stop, &h, &d)) < 0) {
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
    long index = 0, count = 1;
    if (choose_share(&o, &id, &index, &count) < 0) {
        code = 2;
        goto out;
    }
    if ((rc = own_share(&o, &ds, index, count, &part, &all, &mine, &n_mine, &d)) < 0) {
        strata_log_error("--partition: %s", strata_diag_msg(&d, rc));
        code = 2;
        goto out;
    }
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
                                   .mine = mine,
                                   .nmine = n_mine,
                                   .client_index = (uint64_t)index,
                                   .ef_beta = o.ef.beta,
                                   .ef_max_staleness = (uint32_t)o.ef.max_staleness,
                                   .progress =
                                       isatty(STDERR_FILENO) && o.log_format == STRATA_LOG_TEXT,
                                   .stop = g_stop};
    int settled;
    strata_client_upload result;
    if (strata_client_round_settle(&ctx, &settled, &result) < 0)
        goto out;
    strata_log_info("%zu training samples (share %ld of %ld, partition %s)", ctx.nmine, index,
                    count, o.partition);
    int finished;
    if (poll_loop(&o, &ctx, &id, part, &finished) == STRATA_OK)
        code = 0;
out:
    if (*g_stop)
        code = 130; /* interrupted: state is saved, a restart continues */
    strata_http_free(h);
    strata_client_state_free(st);
    strata_partition_free(part);
    free(all);
    strata_dataset_cleanup(&ds);
    options_cleanup(&o);
    return code;
}
