/* strata-sim's child processes: their command lines, starting them with
 * their output in their logs, the coordinator's standard output (its
 * start-up line), reaping and stopping them (see sim.h). */
#include "sim.h"

#include "strata/clock.h"
#include "strata/opts.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long stopped children may take to exit before they are killed. */
#define STOP_TIMEOUT_MS 30000

int sim_argv_add(sim_argv *a, const char *s)
{
    if (a->n + 2 > sizeof(a->v) / sizeof(a->v[0]) || (a->v[a->n] = strdup(s)) == NULL)
        return STRATA_ENOMEM;
    a->v[++a->n] = NULL;
    return STRATA_OK;
}

/* Adds "--kebab-key" and value. */
int sim_argv_add_opt(sim_argv *a, const char *key, const char *value)
{
    char flag[96];
    strata_opt_flag(key, flag, sizeof(flag));
    return sim_argv_add(a, flag) < 0 ? STRATA_ENOMEM : sim_argv_add(a, value);
}

void sim_argv_cleanup(sim_argv *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    a->n = 0;
}

/* Starts argv[0] with stdout to out_fd (or the log), stderr to the log
 * file (appended to by every writer, so a resumed run keeps the earlier
 * lines). Returns the child's pid, or -1. */
pid_t sim_spawn(char *const argv[], const char *log, int out_fd)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
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

/* Reads what the pipe holds (waiting up to wait_ms) and copies it to the
 * log. Returns the number of bytes read, 0 at end of file or when nothing
 * came. */
size_t sim_server_out_read(sim_server_out *so, int wait_ms)
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
int sim_server_out_listening(sim_server_out *so, char *url, size_t cap)
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

/* Reaps the children that have exited; returns 1 when the server is one. */
int sim_procs_reap(sim_procs *p)
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

/* Waits up to STOP_TIMEOUT_MS for *pid to exit, then kills it; sets *pid
 * to 0. */
static void wait_or_kill(pid_t *pid, strata_deadline until)
{
    while (*pid > 0) {
        pid_t r = waitpid(*pid, NULL, WNOHANG);
        if (r == *pid || (r < 0 && errno != EINTR)) {
            *pid = 0;
        } else if (strata_deadline_expired(until)) {
            kill(*pid, SIGKILL);
            waitpid(*pid, NULL, 0);
            *pid = 0;
        } else {
            usleep(20000);
        }
    }
}

/* Ends every child that still runs (SIGTERM; SIGKILL after
 * STOP_TIMEOUT_MS) and waits for it: the clients first, all at once, then
 * the coordinator, which saves its state as it stops. */
void sim_procs_stop(sim_procs *p)
{
    for (long i = 0; p->clients != NULL && i < p->nclients; i++)
        if (p->clients[i] > 0)
            kill(p->clients[i], SIGTERM);
    strata_deadline until = strata_deadline_in(STOP_TIMEOUT_MS);
    for (long i = 0; p->clients != NULL && i < p->nclients; i++)
        wait_or_kill(&p->clients[i], until);
    if (p->server > 0) {
        kill(p->server, SIGTERM);
        wait_or_kill(&p->server, strata_deadline_in(STOP_TIMEOUT_MS));
        p->server = -1;
    }
}
