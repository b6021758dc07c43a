/* strata-sim: the output directory — what a run keeps there, whether it
 * already holds one, taking it for a new run, removing what a failed start
 * created, and the coordinator's own error line from its log. */
#include "sim.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The entries a run creates in --out, in the order of the paths struct. */
static const char *const ENTRIES[SIM_OUT_ENTRIES] = {
    "state",    "clients",          "shards",     "server.log", "enrolment.secret",
    "run.json", "coordinator.json", "report.csv", "report.md"};

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Creates path and its missing parents; *top receives the first directory
 * created ("" when it existed). */
static int mkdirs(const char *path, char *top, size_t cap)
{
    char buf[PATH_MAX];
    top[0] = '\0';
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return STRATA_EINVAL;
    size_t len = strlen(buf);
    for (char *p = buf + 1; p <= buf + len; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0755) == 0) {
            if (top[0] == '\0')
                snprintf(top, cap, "%s", buf);
        } else if (errno != EEXIST) {
            return STRATA_EIO;
        }
        *p = c;
    }
    return STRATA_OK;
}

int sim_mkdirs(const char *path)
{
    char top[PATH_MAX];
    return mkdirs(path, top, sizeof(top));
}

int sim_out_open(const char *out, sim_out *o, strata_diag *diag)
{
    memset(o, 0, sizeof(*o));
    for (size_t i = 0; i < SIM_OUT_ENTRIES; i++) {
        if (snprintf(o->path[i], sizeof(o->path[i]), "%s/%s", out, ENTRIES[i]) >=
            (int)sizeof(o->path[i]))
            return strata_diag_set(diag, STRATA_EINVAL, "--out: path too long");
        o->existed[i] = exists(o->path[i]);
    }
    o->holds_run = o->existed[SIM_OUT_STATE] || o->existed[SIM_OUT_RUN_JSON];
    return STRATA_OK;
}

int sim_out_create(const char *out, sim_out *o, strata_diag *diag)
{
    if (mkdirs(out, o->created_top, sizeof(o->created_top)) < 0 ||
        (mkdir(o->path[SIM_OUT_CLIENTS], 0755) != 0 && errno != EEXIST))
        return strata_diag_set(diag, STRATA_EIO, "cannot create %s: %s", out, strerror(errno));
    return STRATA_OK;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* Removes the tree at path; returns 0 or -1. */
static int remove_tree(const char *path)
{
    if (!exists(path))
        return 0;
    return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

void sim_out_discard(const sim_out *o)
{
    if (o->created_top[0] != '\0') {
        remove_tree(o->created_top);
        return;
    }
    for (size_t i = 0; i < SIM_OUT_ENTRIES; i++)
        if (!o->existed[i])
            remove_tree(o->path[i]);
}

int sim_out_error_line(const char *log, char *line, size_t cap)
{
    line[0] = '\0';
    FILE *f = fopen(log, "r");
    if (f == NULL)
        return 0;
    char buf[1024], last[1024] = "";
    int found = 0;
    while (fgets(buf, sizeof(buf), f) != NULL) {
        buf[strcspn(buf, "\r\n")] = '\0';
        if (buf[0] == '\0')
            continue;
        /* Text lines read "TIME error strata-server: ...", JSON lines carry
         * "level":"error". */
        const char *e = strstr(buf, " error ");
        if (e != NULL || strstr(buf, "\"level\":\"error\"") != NULL) {
            snprintf(line, cap, "%s", e != NULL ? e + 7 : buf);
            found = 1;
        }
        snprintf(last, sizeof(last), "%s", buf);
    }
    fclose(f);
    if (!found && last[0] != '\0') {
        snprintf(line, cap, "%s", last);
        found = 1;
    }
    return found;
}
