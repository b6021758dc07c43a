/* strata-sim: bandwidth-limited links (--link-up, --link-down). Each client
 * process runs in its own network namespace, joined to the host by a veth
 * pair with a token-bucket filter (tc tbf) on each end: the namespace's
 * egress is the client's uplink, the host end's egress its downlink. The
 * coordinator listens on the first pair's host address, which every
 * namespace reaches through its own pair (a local address of the host).
 *
 * Names carry strata-sim's pid (namespace "strata-PID-I", interfaces
 * "sPIDh"/"sPIDc" + I in hex) so that runs do not collide; addresses are
 * 10.213.0.0/16, one /30 per client. Everything is made with `ip` and `tc`
 * (iproute2) run directly, without a shell; a setup that fails removes what
 * it made, and sim_links_free removes the rest (also after a stop). Needs
 * root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2. */
#include "sim.h"

#include "strata/log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct sim_links {
    long n;     /* namespaces made (0 .. n-1) */
    long pairs; /* of which with a veth pair */
    unsigned pid;
    char ip[64], tc[64];
    char host[32];
};

/* Runs argv (argv[0] a full path) with its output discarded; 0 when it
 * exits 0. */
static int run_cmd(char *const argv[])
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int find_tool(const char *name, char *out, size_t cap)
{
    static const char *const dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        snprintf(out, cap, "%s/%s", dirs[i], name);
        if (access(out, X_OK) == 0)
            return 0;
    }
    return -1;
}

int sim_link_rate_check(const char *rate)
{
    if (rate == NULL)
        return 0;
    const char *p = rate;
    int digits = 0;
    while (isdigit((unsigned char)*p)) {
        p++;
        digits++;
    }
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p))
            p++;
    }
    if (digits == 0 || digits > 9)
        return STRATA_EINVAL;
    static const char *const units[] = {"bit", "kbit", "mbit", "gbit"};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcmp(p, units[i]) == 0)
            return strtod(rate, NULL) > 0 ? 0 : STRATA_EINVAL;
    return STRATA_EINVAL;
}

static void ns_name(const sim_links *l, long i, char *buf, size_t cap)
{
    snprintf(buf, cap, "strata-%u-%ld", l->pid, i);
}

static void if_name(const sim_links *l, long i, char side, char *buf, size_t cap)
{
    snprintf(buf, cap, "s%x%c%lx", l->pid, side, (unsigned long)i);
}

/* The /30 of client i: host end .1, namespace end .2 of 10.213.X.Y. */
static void addr(long i, int end, char *buf, size_t cap)
{
    unsigned v = (unsigned)i * 4 + (unsigned)end;
    snprintf(buf, cap, "10.213.%u.%u", (v >> 8) & 255, v & 255);
}

const char *sim_links_host(const sim_links *l)
{
    return l->host;
}

int sim_links_wrap(const sim_links *l, long i, char *ns, size_t cap, const char **ip)
{
    if (i < 0 || i >= l->n)
        return STRATA_EINVAL;
    ns_name(l, i, ns, cap);
    *ip = l->ip;
    return 0;
}

void sim_links_free(sim_links *l)
{
    if (l == NULL)
        return;
    for (long i = 0; i < l->n; i++) {
        char ns[64], h[32];
        ns_name(l, i, ns, sizeof(ns));
        if_name(l, i, 'h', h, sizeof(h));
        /* Deleting the namespace destroys its end of the pair, and with it
         * the host end; the host end is deleted first in case the pair
         * never moved. */
        char *del_if[] = {l->ip, "link", "del", h, NULL};
        if (i < l->pairs)
            run_cmd(del_if);
        char *del_ns[] = {l->ip, "netns", "del", ns, NULL};
        if (run_cmd(del_ns) < 0)
            strata_log_warn("could not remove network namespace %s (ip netns del %s)", ns, ns);
    }
    free(l);
}

/* tbf on dev (in namespace ns, or the host when NULL) at rate. */
static int shape(const sim_links *l, const char *ns, const char *dev, const char *rate)
{
    char *with_ns[] = {(char *)l->tc, "-n",      (char *)ns, "qdisc", "add",        "dev",
                       (char *)dev,   "root",    "tbf",      "rate",  (char *)rate, "burst",
                       "16kb",        "latency", "200ms",    NULL};
    char *host[] = {(char *)l->tc, "qdisc",      "add",   "dev",  (char *)dev, "root",  "tbf",
                    "rate",        (char *)rate, "burst", "16kb", "latency",   "200ms", NULL};
    return run_cmd(ns != NULL ? with_ns : host);
}

int sim_links_new(long n, const char *up, const char *down, sim_links **out, strata_diag *d)
{
    *out = NULL;
    if (n > 16000)
        return strata_diag_set(d, STRATA_EINVAL, "--link-up/--link-down: at most 16000 clients");
    if (geteuid() != 0)
        return strata_diag_set(d, STRATA_ESTATE,
                               "--link-up/--link-down need root (network namespaces, veth pairs "
                               "and tc); nothing was set up");
    sim_links *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return STRATA_ENOMEM;
    l->pid = (unsigned)getpid();
    if (find_tool("ip", l->ip, sizeof(l->ip)) < 0 || find_tool("tc", l->tc, sizeof(l->tc)) < 0) {
        free(l);
        return strata_diag_set(d, STRATA_ESTATE,
                               "--link-up/--link-down need iproute2's ip and tc; nothing was set "
                               "up");
    }
    addr(0, 1, l->host, sizeof(l->host));
    const char *step = "";
    long i;
    int rc = 0;
    for (i = 0; i < n && rc == 0; i++) {
        char ns[64], h[32], c[32], ha[32], ca[32], hcidr[40], ccidr[40];
        ns_name(l, i, ns, sizeof(ns));
        if_name(l, i, 'h', h, sizeof(h));
        if_name(l, i, 'c', c, sizeof(c));
        addr(i, 1, ha, sizeof(ha));
        addr(i, 2, ca, sizeof(ca));
        snprintf(hcidr, sizeof(hcidr), "%s/30", ha);
        snprintf(ccidr, sizeof(ccidr), "%s/30", ca);
        char *add_ns[] = {l->ip, "netns", "add", ns, NULL};
        step = "ip netns add";
        if ((rc = run_cmd(add_ns)) < 0)
            break;
        l->n = i + 1;
        char *add_pair[] = {l->ip, "link", "add", h, "type", "veth", "peer", "name", c, NULL};
        step = "ip link add ... type veth";
        if ((rc = run_cmd(add_pair)) < 0)
            break;
        l->pairs = i + 1;
        char *move[] = {l->ip, "link", "set", c, "netns", ns, NULL};
        char *haddr[] = {l->ip, "addr", "add", hcidr, "dev", h, NULL};
        char *hup[] = {l->ip, "link", "set", h, "up", NULL};
        char *caddr[] = {l->ip, "-n", ns, "addr", "add", ccidr, "dev", c, NULL};
        char *cup[] = {l->ip, "-n", ns, "link", "set", c, "up", NULL};
        char *lo[] = {l->ip, "-n", ns, "link", "set", "lo", "up", NULL};
        char *route[] = {l->ip, "-n", ns, "route", "add", "default", "via", ha, NULL};
        step = "ip link/addr/route";
        if ((rc = run_cmd(move)) < 0 || (rc = run_cmd(haddr)) < 0 || (rc = run_cmd(hup)) < 0 ||
            (rc = run_cmd(caddr)) < 0 || (rc = run_cmd(cup)) < 0 || (rc = run_cmd(lo)) < 0 ||
            (rc = run_cmd(route)) < 0)
            break;
        step = "tc qdisc add ... tbf";
        if ((down != NULL && (rc = shape(l, NULL, h, down)) < 0) ||
            (up != NULL && (rc = shape(l, ns, c, up)) < 0))
            break;
    }
    if (rc < 0) {
        sim_links_free(l);
        return strata_diag_set(d, STRATA_ESTATE,
                               "--link-up/--link-down: %s failed for client %ld (does this "
                               "machine allow network namespaces?); everything set up was "
                               "removed",
                               step, i);
    }
    *out = l;
    return 0;
}
