#include "store_backends.h"
#include "test_util.h"

#include <libpq-fe.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- SQLite: a state directory under $TMPDIR ---------------------------- */

static const char *sqlite_unmet(void)
{
    return NULL;
}

static int sqlite_open(store_open_how how, char **loc, const strata_store *primary,
                       strata_store **out, strata_diag *diag)
{
    if (how == STORE_SECONDARY)
        return strata_store_open_secondary(primary, out, diag);
    if (how == STORE_FRESH && (*loc = strata_test_tmpdir()) == NULL)
        return strata_diag_set(diag, STRATA_EIO, "cannot make a temporary directory");
    return strata_store_open(*loc, out, diag);
}

static void sqlite_remove(char *loc)
{
    strata_test_rmtree(loc);
    free(loc);
}

/* ---- PostgreSQL: a schema of $STRATA_TEST_PG_URL's database ------------- */

#define PG_SCHEMA_MAX 63 /* PostgreSQL's identifier limit (NAMEDATALEN - 1) */

static const char *pg_url(void)
{
    const char *url = getenv("STRATA_TEST_PG_URL");
    return url != NULL && *url != '\0' ? url : NULL;
}

static const char *pg_unmet(void)
{
    return pg_url() != NULL ? NULL
                            : "STRATA_TEST_PG_URL is not set (tests/unit/with_postgres.sh runs a "
                              "command with a throw-away PostgreSQL and sets it)";
}

static void pg_quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* libpq's last error on c without its final newline (into buf[n]). */
static const char *pg_error(PGconn *c, char *buf, size_t n)
{
    snprintf(buf, n, "%s", PQerrorMessage(c));
    size_t len = strlen(buf);
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
        buf[--len] = '\0';
    return buf;
}

/* Runs sql (one or more statements, one transaction) on a connection of
 * its own to $STRATA_TEST_PG_URL, with schema (when not NULL) first on the
 * search path; the notices (e.g. of DROP ... CASCADE) are not printed.
 * *res (when given) receives the last statement's result. */
static int pg_run(const char *schema, const char *sql, PGresult **res, strata_diag *diag)
{
    if (pg_url() == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "%s", pg_unmet());
    char *text = NULL;
    if (asprintf(&text, "%s%s%s%s", schema != NULL ? "SET search_path TO " : "",
                 schema != NULL ? schema : "", schema != NULL ? "; " : "", sql) < 0)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    PGconn *c = PQconnectdb(pg_url());
    int rc = STRATA_OK;
    char err[400];
    if (c == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "libpq: out of memory");
    } else if (PQstatus(c) != CONNECTION_OK) {
        rc = strata_diag_set(diag, STRATA_EIO, "cannot connect to STRATA_TEST_PG_URL: %s",
                             pg_error(c, err, sizeof(err)));
    } else {
        PQsetNoticeProcessor(c, pg_quiet, NULL);
        PGresult *r = PQexec(c, text);
        ExecStatusType st = PQresultStatus(r);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
            rc = strata_diag_set(diag, STRATA_EIO, "%s: %s", sql, pg_error(c, err, sizeof(err)));
        if (rc == STRATA_OK && res != NULL)
            *res = r;
        else
            PQclear(r);
    }
    PQfinish(c);
    free(text);
    return rc;
}

static int pg_exec(const char *sql, strata_diag *diag)
{
    return pg_run(NULL, sql, NULL, diag);
}

/* Writes value between single quotes, as a connection string quotes it. */
static void pg_put_value(FILE *f, const char *value)
{
    fputc('\'', f);
    for (const char *p = value; *p != '\0'; p++) {
        if (*p == '\'' || *p == '\\')
            fputc('\\', f);
        fputc(*p, f);
    }
    fputc('\'', f);
}

/* The connection string of the store in schema, into *out (malloc'ed):
 * $STRATA_TEST_PG_URL's parameters (it may be a keyword/value string or a
 * URI) in keyword/value form, with "-c search_path=<schema>" added to its
 * `options`. */
static int pg_conninfo(const char *schema, char **out, strata_diag *diag)
{
    *out = NULL;
    if (pg_url() == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "%s", pg_unmet());
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(pg_url(), &err);
    if (opts == NULL) {
        int rc = err != NULL ? strata_diag_set(diag, STRATA_EINVAL, "STRATA_TEST_PG_URL: %s", err)
                             : strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        PQfreemem(err);
        return rc;
    }
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    if (f == NULL) {
        PQconninfoFree(opts);
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    const char *options = NULL;
    for (const PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        if (o->val == NULL)
            continue;
        if (strcmp(o->keyword, "options") == 0) {
            options = o->val;
            continue;
        }
        fprintf(f, "%s=", o->keyword);
        pg_put_value(f, o->val);
        fputc(' ', f);
    }
    fputs("options=", f);
    char *value = NULL;
    if (asprintf(&value, "%s%s-c search_path=%s", options != NULL ? options : "",
                 options != NULL ? " " : "", schema) < 0)
        value = NULL;
    if (value != NULL)
        pg_put_value(f, value);
    int bad = value == NULL || ferror(f);
    free(value);
    PQconninfoFree(opts);
    if (fclose(f) != 0 || bad) {
        free(s);
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    *out = s;
    return STRATA_OK;
}

/* Splits a location into its schema (into schema[PG_SCHEMA_MAX + 1]) and
 * its directory (returned, borrowed from loc). */
static const char *pg_split(const char *loc, char *schema, strata_diag *diag)
{
    const char *space = loc != NULL ? strchr(loc, ' ') : NULL;
    if (space == NULL || space == loc || space - loc > PG_SCHEMA_MAX || space[1] == '\0') {
        strata_diag_set(diag, STRATA_EINVAL, "not a PostgreSQL test location: %s",
                        loc != NULL ? loc : "(null)");
        return NULL;
    }
    memcpy(schema, loc, (size_t)(space - loc));
    schema[space - loc] = '\0';
    return space + 1;
}

/* A new location: a state directory and a new, empty schema. A schema of
 * the same name that a killed earlier run (with this process id) left
 * behind is dropped first. */
static int pg_fresh(char **loc, strata_diag *diag)
{
    static unsigned counter;
    char schema[PG_SCHEMA_MAX + 1], sql[3 * PG_SCHEMA_MAX + 64];
    snprintf(schema, sizeof(schema), "sc_%ld_%u", (long)getpid(), ++counter);
    snprintf(sql, sizeof(sql), "DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s", schema,
             schema);
    char *dir = strata_test_tmpdir();
    if (dir == NULL)
        return strata_diag_set(diag, STRATA_EIO, "cannot make a temporary directory");
    int rc = pg_exec(sql, diag);
    size_t len = strlen(schema) + 1 + strlen(dir) + 1;
    char *s = rc == STRATA_OK ? malloc(len) : NULL;
    if (rc == STRATA_OK && s == NULL)
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    if (rc != STRATA_OK) {
        strata_test_rmtree(dir);
        free(dir);
        return rc;
    }
    snprintf(s, len, "%s %s", schema, dir);
    free(dir);
    *loc = s;
    return STRATA_OK;
}

static int pg_open(store_open_how how, char **loc, const strata_store *primary, strata_store **out,
                   strata_diag *diag)
{
    if (how == STORE_SECONDARY)
        return strata_store_open_secondary(primary, out, diag);
    if (how == STORE_FRESH) {
        int rc = pg_fresh(loc, diag);
        if (rc != STRATA_OK)
            return rc;
    }
    char schema[PG_SCHEMA_MAX + 1];
    const char *dir = pg_split(*loc, schema, diag);
    if (dir == NULL)
        return STRATA_EINVAL;
    char *conninfo = NULL;
    int rc = pg_conninfo(schema, &conninfo, diag);
    if (rc == STRATA_OK)
        rc = strata_store_open_database(conninfo, dir, out, diag);
    free(conninfo);
    return rc;
}

static void pg_remove(char *loc)
{
    if (loc == NULL)
        return;
    char schema[PG_SCHEMA_MAX + 1], sql[PG_SCHEMA_MAX + 64];
    strata_diag d;
    const char *dir = pg_split(loc, schema, &d);
    if (dir == NULL) {
        fprintf(stderr, "postgresql: %s\n", d.msg);
        free(loc);
        return;
    }
    snprintf(sql, sizeof(sql), "DROP SCHEMA IF EXISTS %s CASCADE", schema);
    int rc = pg_exec(sql, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "postgresql: cannot remove schema %s: %s\n", schema,
                strata_diag_msg(&d, rc));
    strata_test_rmtree(dir);
    free(loc);
}

int store_pg_fresh_location(char **loc, strata_diag *diag)
{
    *loc = NULL;
    return pg_fresh(loc, diag);
}

/* pg_run with loc's schema. */
static int pg_at(const char *loc, const char *sql, PGresult **res, strata_diag *diag)
{
    char schema[PG_SCHEMA_MAX + 1];
    if (pg_split(loc, schema, diag) == NULL)
        return STRATA_EINVAL;
    return pg_run(schema, sql, res, diag);
}

int store_pg_exec_at(const char *loc, const char *sql, strata_diag *diag)
{
    return pg_at(loc, sql, NULL, diag);
}

int store_pg_query_at(const char *loc, const char *sql, char *buf, size_t n, strata_diag *diag)
{
    PGresult *r = NULL;
    buf[0] = '\0';
    int rc = pg_at(loc, sql, &r, diag);
    if (rc == STRATA_OK && PQntuples(r) > 0 && PQnfields(r) > 0 && !PQgetisnull(r, 0, 0))
        snprintf(buf, n, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

/* ---- The list ----------------------------------------------------------- */

const store_backend STORE_BACKENDS[STORE_N_BACKENDS] = {
    {"sqlite", sqlite_unmet, sqlite_open, sqlite_remove, 0, 0, 0},
    {"postgresql", pg_unmet, pg_open, pg_remove, 1, 1, 1},
};

const store_backend *store_backend_find(const char *name)
{
    for (size_t i = 0; name != NULL && i < STORE_N_BACKENDS; i++)
        if (strcmp(STORE_BACKENDS[i].name, name) == 0)
            return &STORE_BACKENDS[i];
    return NULL;
}
