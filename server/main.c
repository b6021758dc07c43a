/* strata-server: the federation coordinator. Parses the configuration,
 * opens the engine (state directory, test split, model), serves the REST API
 * of schemas/api.md until SIGINT or SIGTERM, then shuts down cleanly. */
#include "config.h"
#include "engine.h"
#include "http.h"

#include "strata/log.h"
#include "strata/stop.h"

#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set once SIGINT or SIGTERM arrives (strata_stop_install). */
static volatile sig_atomic_t *g_stop;

int main(int argc, char **argv)
{
    strata_log_setup("strata-server", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    srv_config cfg;
    srv_config_init(&cfg);
    strata_diag d = {{0}};
    int rc = srv_config_parse(&cfg, argc, argv, &d);
    if (rc == 1) {
        fputs(srv_config_usage, stdout);
        srv_config_cleanup(&cfg);
        return 0;
    }
    if (rc < 0) {
        strata_log_error("%s (see strata-server --help)", strata_diag_msg(&d, rc));
        srv_config_cleanup(&cfg);
        return 2;
    }
    strata_log_setup("strata-server", cfg.log_level_value, cfg.log_format_value);
    /* Request bodies and decoded updates are large and short-lived: keep
     * them in their own mappings, returned to the system when freed, rather
     * than in the heaps of the many HTTP threads (glibc would otherwise raise
     * this threshold after the first such free). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    /* The state directory holds token hashes and the run's history: every
     * file the coordinator creates is 0600 and every directory 0700,
     * whatever the operator's umask (the store also tightens a database
     * left by an older run). */
    umask(077);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    g_stop = strata_stop_install();
    /* Threads started from here on leave the signals to the main thread. */
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    srv_engine *e = NULL;
    srv_http *h = NULL;
    int code = 1;
    unsigned port = 0;
    if ((rc = srv_engine_open(&cfg, &e, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    if ((rc = srv_http_start(e, &cfg, (unsigned)cfg.http_threads, &h, &port, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    if ((rc = srv_engine_start(e)) < 0) {
        strata_log_error("cannot start the round thread");
        goto out;
    }
    /* This line stays on stdout, in this form: tests and strata-sim read
     * the address from it. */
    printf("strata-server: listening on %s://%s:%u\n", cfg.tls_cert ? "https" : "http", cfg.host,
           port);
    fflush(stdout);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    while (!*g_stop)
        pause();
    strata_log_info("stopping");
    code = 0;
out:
    if (e != NULL)
        srv_engine_stop(e);
    srv_http_stop(h);
    srv_engine_free(e);
    srv_config_cleanup(&cfg);
    return code;
}
