/* strata-server's configuration: defaults, a JSON config file and
 * command-line overrides (the keys are the same, snake_case in the file,
 * --kebab-case on the command line). */
#ifndef STRATA_SERVER_CONFIG_H
#define STRATA_SERVER_CONFIG_H

#include "request.h"
#include "strata/compress.h"
#include "strata/error.h"
#include "strata/log.h"

#include <stddef.h>
#include <stdint.h>

typedef struct srv_config {
    char *database;         /* a PostgreSQL connection string or URI; NULL: SQLite in state_dir */
    char *coordinator_name; /* the leader's name in a shared store (NULL: HOST:PID) */
    double lease;           /* seconds of a leader's lease in a shared store */
    char *state_dir, *model, *data, *host, *policy, *server_opt, *values, *aggregator;
    char *downlink; /* as given; parsed into downlink_budget (none: dense snapshots) */
    char *enrolment_secret, *enrolment_secret_file, *admin_token_file, *tls_cert, *tls_key;
    char *log_format, *log_level; /* as given; parsed into the two fields below */
    long port, rounds, min_clients, clients_per_round, min_updates, local_epochs, batch, max_steps,
        threads, http_threads, seed, eval_samples;
    /* Limits. */
    long max_body_bytes, max_json_bytes, max_json_depth, max_connections, connection_timeout,
        request_timeout, max_clients, data_shares, upload_rate, enrolment_rate, straggler_rounds,
        downlink_keep;
    double fraction, round_deadline, density, lr, momentum, weight_decay, prox_mu, server_lr,
        server_lr_final, trim_fraction, clip_norm, screen_factor, over_select;
    strata_values_format values_format;
    int downlink_on; /* --downlink other than none */
    strata_budget downlink_budget;
    strata_log_format log_format_value;
    strata_log_level log_level_value;
} srv_config;

/* Fills cfg with the defaults. */
void srv_config_init(srv_config *cfg);

/* Frees the strings cfg owns. */
void srv_config_cleanup(srv_config *cfg);

/* Parses argv: first the file named by --config (when present), then every
 * other option over it (an option given twice: the last one wins). Returns
 * 0 on success, 1 when --help was asked for, and STRATA_EINVAL with diag
 * naming the key for an unknown, repeated-in-file, or invalid key or value,
 * a positional argument, or a missing required key; STRATA_ENOMEM. */
int srv_config_parse(srv_config *cfg, int argc, char **argv, strata_diag *diag);

/* The configuration as a new JSON object text (free()); NULL when out of
 * memory. The enrolment secret is never shown (true: one is set); a
 * number left unset (0 where the option's minimum is above 0: fraction,
 * clients_per_round, max_body_bytes) is null, which a config file reads
 * back as unset. full = 0
 * also leaves out file paths and TLS settings (the public /v1/status view);
 * full = 1 is the admin view. */
char *srv_config_json(const srv_config *cfg, int full);

/* The --help text. */
extern const char srv_config_usage[];

/* Checks that srv_config_usage describes every option ("  --key "): 0, or
 * STRATA_EINVAL with diag naming the first one it leaves out. */
int srv_config_usage_check(strata_diag *diag);

#endif
