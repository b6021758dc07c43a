/* Unit tests of strata/opts.h: the command line, JSON configuration and
 * usage text over one option table. */
#include "strata/opts.h"
#include "test_util.h"

#include <float.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct demo {
    char *data, *name;
    long rounds, min_clients;
    double lr;
    int json;
} demo;

static const strata_opt TABLE[] = {
    {"data", STRATA_OPT_STRING, offsetof(demo, data), 0, 0, "DIR", "data set directory"},
    {"name", STRATA_OPT_STRING, offsetof(demo, name), 0, 0, "NAME", "a name\nsecond line"},
    {"rounds", STRATA_OPT_INTEGER, offsetof(demo, rounds), 1, 1000, "N", "rounds (30)"},
    {"min_clients", STRATA_OPT_INTEGER, offsetof(demo, min_clients), 0, 10, "N", "clients"},
    {"lr", STRATA_OPT_DOUBLE, offsetof(demo, lr), 0, 1e6, "X", "learning rate"},
    {"json", STRATA_OPT_FLAG, offsetof(demo, json), 0, 0, NULL, "JSON output"},
};
#define NTABLE (sizeof(TABLE) / sizeof(TABLE[0]))

static void demo_init(demo *o)
{
    memset(o, 0, sizeof(*o));
    o->name = strdup("default");
    o->rounds = 30;
    o->lr = 0.05;
}

#define MAXARGS 8

typedef struct argv_case {
    const char *args[MAXARGS]; /* after argv[0], NULL-terminated */
    int rc;                    /* expected return: >= 0 the positional index */
    const char *msg;           /* expected diag (substring) on error */
    long rounds, min_clients;
    double lr;
    int json, help;
    const char *data, *name;
} argv_case;

static const argv_case ARGV_CASES[] = {
    {{NULL}, 1, NULL, 30, 0, 0.05, 0, 0, NULL, "default"},
    {{"--rounds", "5", "--lr=0.5", NULL}, 4, NULL, 5, 0, 0.5, 0, 0, NULL, "default"},
    {{"--min-clients", "3", "--json", "--data=x", NULL},
     5,
     NULL,
     30,
     3,
     0.05,
     1,
     0,
     "x",
     "default"},
    {{"--rounds", "5", "--rounds", "7", NULL}, 5, NULL, 7, 0, 0.05, 0, 0, NULL, "default"},
    {{"--name", "a", "--name=b", NULL}, 4, NULL, 30, 0, 0.05, 0, 0, NULL, "b"},
    {{"--rounds", "2", "FILE", "--rounds", "9", NULL}, 3, NULL, 2, 0, 0.05, 0, 0, NULL, "default"},
    {{"--", "--rounds", NULL}, 2, NULL, 30, 0, 0.05, 0, 0, NULL, "default"},
    {{"--help", "--bogus", NULL}, 3, NULL, 30, 0, 0.05, 0, 1, NULL, "default"},
    {{"--data=", NULL}, 2, NULL, 30, 0, 0.05, 0, 0, "", "default"},
    {.args = {"--rounds", "x", NULL},
     .rc = STRATA_EINVAL,
     .msg = "--rounds: \"x\" is not an integer"},
    {.args = {"--rounds", "1.5", NULL},
     .rc = STRATA_EINVAL,
     .msg = "--rounds: \"1.5\" is not an integer"},
    {.args = {"--rounds", "0", NULL},
     .rc = STRATA_EINVAL,
     .msg = "--rounds: 0 is below the minimum 1"},
    {.args = {"--lr", "2e9", NULL},
     .rc = STRATA_EINVAL,
     .msg = "--lr: 2e9 is above the maximum 1e+06"},
    {.args = {"--lr", "nan", NULL}, .rc = STRATA_EINVAL, .msg = "--lr: \"nan\" is not a number"},
    {.args = {"--lr", "", NULL}, .rc = STRATA_EINVAL, .msg = "--lr: \"\" is not a number"},
    {.args = {"--rounds", NULL}, .rc = STRATA_EINVAL, .msg = "--rounds: missing value"},
    {.args = {"--json=1", NULL}, .rc = STRATA_EINVAL, .msg = "--json: takes no value"},
    {.args = {"--bogus=3", NULL}, .rc = STRATA_EINVAL, .msg = "unknown option '--bogus'"},
    {.args = {"--min-client", "3", NULL},
     .rc = STRATA_EINVAL,
     .msg = "unknown option '--min-client'"},
};

static void test_argv(void)
{
    for (size_t c = 0; c < sizeof(ARGV_CASES) / sizeof(ARGV_CASES[0]); c++) {
        const argv_case *k = &ARGV_CASES[c];
        char *argv[MAXARGS + 1] = {"prog"};
        int argc = 1;
        while (k->args[argc - 1] != NULL)
            argv[argc] = (char *)k->args[argc - 1], argc++;
        demo o;
        demo_init(&o);
        strata_diag d = {{0}};
        int help = 7;
        int rc = strata_opts_parse_argv(TABLE, NTABLE, argc, argv, &o, &help, &d);
        CU_ASSERT_EQUAL(rc, k->rc);
        if (rc != k->rc)
            fprintf(stderr, "case %zu: rc %d (%s)\n", c, rc, d.msg);
        if (k->rc < 0) {
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, k->msg));
            if (strstr(d.msg, k->msg) == NULL)
                fprintf(stderr, "case %zu: '%s'\n", c, d.msg);
        } else {
            CU_ASSERT_EQUAL(help, k->help);
            CU_ASSERT_EQUAL(o.rounds, k->rounds);
            CU_ASSERT_EQUAL(o.min_clients, k->min_clients);
            CU_ASSERT_DOUBLE_EQUAL(o.lr, k->lr, 1e-12);
            CU_ASSERT_EQUAL(o.json, k->json);
            CU_ASSERT((o.data == NULL) == (k->data == NULL));
            if (o.data != NULL && k->data != NULL)
                CU_ASSERT_STRING_EQUAL(o.data, k->data);
            CU_ASSERT_STRING_EQUAL(o.name, k->name);
        }
        strata_opts_cleanup(TABLE, NTABLE, &o);
        CU_ASSERT_PTR_NULL(o.name);
        CU_ASSERT_PTR_NULL(o.data);
    }
}

typedef struct json_case {
    const char *json;
    int rc;
    const char *msg;
    long rounds;
    double lr;
    int json_flag;
    const char *name;
} json_case;

static const json_case JSON_CASES[] = {
    {"{}", 0, NULL, 30, 0.05, 0, "default"},
    {"{\"rounds\": 4, \"lr\": 1, \"json\": true, \"name\": \"n\"}", 0, NULL, 4, 1, 1, "n"},
    {"{\"lr\": 0.25, \"json\": false}", 0, NULL, 30, 0.25, 0, "default"},
    {"{\"rounds\": null, \"lr\": null, \"json\": null, \"name\": null}", 0, NULL, 30, 0.05, 0,
     "default"},
    {.json = "{\"bogus_key\": 3}", .rc = STRATA_EINVAL, .msg = "config: unknown key \"bogus_key\""},
    {.json = "{\"min-clients\": 3}", .rc = STRATA_EINVAL, .msg = "unknown key \"min-clients\""},
    {.json = "{\"rounds\": \"5\"}",
     .rc = STRATA_EINVAL,
     .msg = "config: rounds: expected an integer"},
    {.json = "{\"rounds\": 5.0}",
     .rc = STRATA_EINVAL,
     .msg = "config: rounds: expected an integer"},
    {.json = "{\"rounds\": 5000}",
     .rc = STRATA_EINVAL,
     .msg = "config: rounds: 5000 is above the maximum 1000"},
    {.json = "{\"lr\": 2e9}",
     .rc = STRATA_EINVAL,
     .msg = "config: lr: 2e+09 is above the maximum 1e+06"},
    {.json = "{\"lr\": -1}", .rc = STRATA_EINVAL, .msg = "config: lr: -1 is below the minimum 0"},
    {.json = "{\"lr\": \"x\"}", .rc = STRATA_EINVAL, .msg = "config: lr: expected a number"},
    {.json = "{\"name\": 3}", .rc = STRATA_EINVAL, .msg = "config: name: expected a string"},
    {.json = "{\"json\": 1}", .rc = STRATA_EINVAL, .msg = "config: json: expected true or false"},
    {.json = "{\"data\": [\"x\"]}", .rc = STRATA_EINVAL, .msg = "config: data: expected a string"},
    {.json = "{\"rounds\": 1, \"rounds\": 2}", .rc = STRATA_EINVAL, .msg = "config: invalid JSON"},
    {.json = "[1]", .rc = STRATA_EINVAL, .msg = "config: expected a JSON object"},
    {.json = "{\"rounds\": 1", .rc = STRATA_EINVAL, .msg = "config: invalid JSON"},
};

static void test_json(void)
{
    for (size_t c = 0; c < sizeof(JSON_CASES) / sizeof(JSON_CASES[0]); c++) {
        const json_case *k = &JSON_CASES[c];
        demo o;
        demo_init(&o);
        strata_diag d = {{0}};
        int rc = strata_opts_apply_json(TABLE, NTABLE, k->json, strlen(k->json), &o, &d);
        CU_ASSERT_EQUAL(rc, k->rc);
        if (rc != k->rc)
            fprintf(stderr, "json case %zu: rc %d (%s)\n", c, rc, d.msg);
        if (k->rc < 0) {
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, k->msg));
            if (strstr(d.msg, k->msg) == NULL)
                fprintf(stderr, "json case %zu: '%s'\n", c, d.msg);
        } else {
            CU_ASSERT_EQUAL(o.rounds, k->rounds);
            CU_ASSERT_DOUBLE_EQUAL(o.lr, k->lr, 1e-12);
            CU_ASSERT_EQUAL(o.json, k->json_flag);
            CU_ASSERT_STRING_EQUAL(o.name, k->name);
        }
        strata_opts_cleanup(TABLE, NTABLE, &o);
    }
}

static void test_json_size_cap(void)
{
    size_t n = STRATA_OPTS_JSON_MAX + 16;
    char *big = malloc(n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(big);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    demo o;
    demo_init(&o);
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_opts_apply_json(TABLE, NTABLE, big, n, &o, &d), STRATA_ETOOBIG);
    strata_opts_cleanup(TABLE, NTABLE, &o);
    free(big);
}

static void test_usage(void)
{
    strata_buf b;
    strata_buf_init(&b, 1 << 16);
    CU_ASSERT_EQUAL_FATAL(strata_opts_usage(TABLE, NTABLE, &b), STRATA_OK);
    const char *u = (const char *)b.data;
    CU_ASSERT_PTR_NOT_NULL(strstr(u, "  --data DIR                data set directory\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(u, "  --name NAME               a name\n"
                                     "                            second line\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(u, "  --min-clients N           clients\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(u, "  --json                    JSON output\n"));
    strata_buf_cleanup(&b);
    /* A buffer too small for the text fails instead of cutting it. */
    strata_buf_init(&b, 40);
    CU_ASSERT_EQUAL(strata_opts_usage(TABLE, NTABLE, &b), STRATA_ETOOBIG);
    strata_buf_cleanup(&b);
}

static void test_flag(void)
{
    char f[32];
    strata_opt_flag("clients_per_round", f, sizeof(f));
    CU_ASSERT_STRING_EQUAL(f, "--clients-per-round");
    strata_opt_flag("lr", f, sizeof(f));
    CU_ASSERT_STRING_EQUAL(f, "--lr");
    /* Cut to the buffer, still terminated. */
    strata_opt_flag("min_clients", f, 7);
    CU_ASSERT_STRING_EQUAL(f, "--min-");
}

/* A DOUBLE whose minimum is DBL_TRUE_MIN takes a value above 0, and the
 * error for 0 or below says so instead of printing the smallest double. */
static void test_open_bound(void)
{
    static const strata_opt ROWS[] = {
        {"beta", STRATA_OPT_DOUBLE, 0, DBL_TRUE_MIN, 1, "B", "decay, (0, 1]"},
    };
    static const char *const BAD[] = {"0", "-0.5", "0.0"};
    for (size_t i = 0; i < sizeof(BAD) / sizeof(BAD[0]); i++) {
        char *argv[] = {"prog", "--beta", (char *)BAD[i], NULL};
        double beta = 0.5;
        int help = 0;
        strata_diag d = {{0}};
        CU_ASSERT_EQUAL(strata_opts_parse_argv(ROWS, 1, 3, argv, &beta, &help, &d), STRATA_EINVAL);
        char want[64];
        snprintf(want, sizeof(want), "--beta: %s must be above 0", BAD[i]);
        CU_ASSERT_STRING_EQUAL(d.msg, want);
        CU_ASSERT_DOUBLE_EQUAL(beta, 0.5, 0);
    }
    char *argv[] = {"prog", "--beta", "1e-300", NULL};
    double beta = 0.5;
    int help = 0;
    CU_ASSERT_EQUAL(strata_opts_parse_argv(ROWS, 1, 3, argv, &beta, &help, NULL), 3);
    CU_ASSERT_DOUBLE_EQUAL(beta, 1e-300, 0);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"command lines", test_argv},
        {"JSON configuration", test_json},
        {"JSON size cap", test_json_size_cap},
        {"usage text", test_usage},
        {"a key spelt as its command-line flag", test_flag},
        {"an open lower bound at 0", test_open_bound},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"opts", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
