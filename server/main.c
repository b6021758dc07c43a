/* strata-server: the federation coordinator. Parses the configuration,
 * opens the engine (state directory, test split, model), serves the REST API
 * of schemas/api.md until SIGINT or SIGTERM, then shuts down cleanly. */
#include "config.h"
#include "engine.h"
#include "http.h"

#include "strata/log.h"
#include "strata/stop.h"

#include "store.h"

#include <errno.h>
#include <ftw.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set once SIGINT or SIGTERM arrives (strata_stop_install). */
static volatile sig_atomic_t *g_stop;

/* The entries of a state directory a start may create, with whether each
 * existed before it: a start that fails in a directory without a database
 * removes exactly what it made, so that it leaves nothing behind. */
static const strata_store_file FRESH_ENTRIES[] = {
    STRATA_STORE_FILE_DB,          STRATA_STORE_FILE_LOCK,        STRATA_STORE_FILE_UPDATES,
    STRATA_STORE_FILE_CHECKPOINTS, STRATA_STORE_FILE_ADMIN_TOKEN,
};
#define NFRESH (sizeof(FRESH_ENTRIES) / sizeof(FRESH_ENTRIES[0]))

typedef struct fresh_state {
    int dir_existed, fresh; /* fresh: no database yet */
    int existed[NFRESH];
} fresh_state;

static void on_wake(int sig)
{
    (void)sig;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Notes what the state directory holds before the engine opens it. */
static void fresh_note(const char *dir, fresh_state *f)
{
    char path[4200];
    memset(f, 0, sizeof(*f));
    f->dir_existed = exists(dir);
    for (size_t i = 0; i < NFRESH; i++)
        f->existed[i] =
            strata_store_path(dir, FRESH_ENTRIES[i], 0, 0, path, sizeof(path), NULL) == STRATA_OK &&
            exists(path);
    f->fresh = !f->existed[0];
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

/* After a failed start in a fresh state directory, or a standby stopped
 * before it led: removes what the start made (the whole directory when it
 * made the directory). */
static void fresh_undo(const char *dir, const fresh_state *f)
{
    if (!f->fresh)
        return;
    char path[4200];
    if (!f->dir_existed) {
        if (exists(dir) && nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) < 0)
            strata_log_warn("could not remove %s, made by this failed start", dir);
        return;
    }
    static const char *const db_extra[] = {"-wal", "-shm"};
    for (size_t i = 0; i < NFRESH; i++) {
        if (f->existed[i] ||
            strata_store_path(dir, FRESH_ENTRIES[i], 0, 0, path, sizeof(path), NULL) < 0)
            continue;
        if (exists(path) && nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) < 0)
            strata_log_warn("could not remove %s, made by this failed start", path);
        for (size_t k = 0; i == 0 && k < 2; k++) {
            char side[4300];
            snprintf(side, sizeof(side), "%s%s", path, db_extra[k]);
            remove(side);
        }
    }
}

/* strata-server migrate --state-dir DIR --database URL: the SQLite store of
 * DIR into PostgreSQL (strata_store_migrate). */
static int migrate(int argc, char **argv)
{
    const char *dir = NULL, *db = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--state-dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--database") == 0 && i + 1 < argc)
            db = argv[++i];
        else {
            strata_log_error("migrate: unexpected argument '%s' (usage: strata-server migrate "
                             "--state-dir DIR --database URL)",
                             argv[i]);
            return 2;
        }
    }
    if (dir == NULL || db == NULL) {
        strata_log_error("migrate: --state-dir and --database are required");
        return 2;
    }
    umask(077);
    strata_store_migrated m;
    strata_diag d = {{0}};
    int rc = strata_store_migrate(dir, db, &m, &d);
    if (rc < 0) {
        strata_log_error("migrate: %s; the database is unchanged", strata_diag_msg(&d, rc));
        return 1;
    }
    strata_log_info("migrated %s into PostgreSQL: %llu clients, %llu rounds, %llu updates "
                    "(every payload read back and checked), %llu checkpoint records, %llu "
                    "counters; start strata-server with --state-dir %s --database URL",
                    dir, (unsigned long long)m.clients, (unsigned long long)m.rounds,
                    (unsigned long long)m.updates, (unsigned long long)m.checkpoints,
                    (unsigned long long)m.counters, dir);
    return 0;
}

int main(int argc, char **argv)
{
    strata_log_setup("strata-server", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    if (argc > 1 && strcmp(argv[1], "migrate") == 0)
        return migrate(argc, argv);
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
    sigaddset(&set, SIGUSR1);
    g_stop = strata_stop_install();
    /* SIGUSR1: a follower took the lead (replica.c); it only ends the wait. */
    struct sigaction wake = {.sa_handler = on_wake};
    sigemptyset(&wake.sa_mask);
    sigaction(SIGUSR1, &wake, NULL);
    /* Threads started from here on leave the signals to the main thread. */
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    int code = 1, started = 0;
    unsigned port = cfg.port;
    fresh_state fresh;
    fresh_note(cfg.state_dir, &fresh);
    /* One engine after another: a follower that takes the lead of the
     * store (SIGUSR1) stops its engine and opens the next as the leader,
     * on the same port, with the lead handed over. */
    srv_engine_lead *lead = NULL;
    for (;;) {
        srv_engine *e = NULL;
        srv_http *h = NULL;
        int promoted = 0;
        code = 1;
        rc = srv_engine_open_led(&cfg, lead, &e, &d);
        lead = NULL; /* taken, in every case */
        if (rc < 0) {
            /* A standby stopped by SIGINT or SIGTERM stops cleanly. */
            if (*g_stop) {
                strata_log_info("%s", strata_diag_msg(&d, rc));
                code = 0;
            } else {
                strata_log_error("%s", strata_diag_msg(&d, rc));
            }
            break;
        }
        srv_http_opts ho = {.host = cfg.host,
                            .port = port,
                            .tls_cert = cfg.tls_cert,
                            .tls_key = cfg.tls_key,
                            .connection_timeout = cfg.connection_timeout,
                            .max_connections = cfg.max_connections,
                            .request_timeout = cfg.request_timeout,
                            .threads = (unsigned)cfg.http_threads};
        if ((rc = srv_http_start(e, &ho, &h, &port, &d)) < 0) {
            strata_log_error("%s", strata_diag_msg(&d, rc));
        } else if ((rc = srv_engine_start(e)) < 0) {
            strata_log_error("cannot start the round thread");
        } else {
            if (!started) {
                /* This line stays on stdout, in this form: tests and
                 * strata-sim read the address from it. */
                printf("strata-server: listening on %s://%s:%u\n", cfg.tls_cert ? "https" : "http",
                       cfg.host, port);
                fflush(stdout);
            }
            started = 1;
            /* The signals stay blocked but while sigsuspend waits, so none
             * is taken between the test and the wait. */
            sigset_t waiting;
            pthread_sigmask(SIG_BLOCK, NULL, &waiting);
            sigdelset(&waiting, SIGINT);
            sigdelset(&waiting, SIGTERM);
            sigdelset(&waiting, SIGUSR1);
            while (!*g_stop && !(promoted = srv_engine_promoted(e)))
                sigsuspend(&waiting);
            code = 0;
        }
        if (!promoted)
            strata_log_info("stopping");
        srv_engine_stop(e);
        srv_http_stop(h);
        if (promoted)
            lead = srv_engine_take_lead(e);
        srv_engine_free(e);
        if (!promoted || rc < 0 || *g_stop)
            break;
    }
    srv_engine_lead_free(lead);
    if (!started) /* a failed start, or a standby stopped before it led */
        fresh_undo(cfg.state_dir, &fresh);
    srv_config_cleanup(&cfg);
    return code;
}
