/* Unit tests of the coordinator's configuration (server/config.c): its
 * usage text, the command line over a JSON file, and validation. */
#include "config.h"
#include "test_util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_usage_names_every_key(void)
{
    strata_diag d = {{0}};
    int rc = srv_config_usage_check(&d);
    CU_ASSERT_EQUAL(rc, STRATA_OK);
    if (rc != STRATA_OK)
        fprintf(stderr, "%s\n", d.msg);
}

#define BASE "prog", "--state-dir", "s", "--model", "mlp", "--data", "d", "--enrolment-secret", "x"

typedef struct parse_case {
    const char *args[16]; /* NULL-terminated */
    int rc;
    const char *msg; /* substring of the diag on error */
} parse_case;

static const parse_case CASES[] = {
    {{BASE, NULL}, 0, NULL},
    {{BASE, "--rounds=4", "--log-format", "json", "--log-level", "warn", NULL}, 0, NULL},
    {{BASE, "--help", "--bogus", NULL}, 1, NULL},
    {{BASE, "--bogus", "3", NULL}, STRATA_EINVAL, "unknown option '--bogus'"},
    {{BASE, "extra", NULL}, STRATA_EINVAL, "unexpected argument 'extra'"},
    {{BASE, "--rounds", "x", NULL}, STRATA_EINVAL, "--rounds: \"x\" is not an integer"},
    {{BASE, "--lr", "2e9", NULL}, STRATA_EINVAL, "--lr: 2e9 is above the maximum 1e+06"},
    {{BASE, "--values", "fp8", NULL},
     STRATA_EINVAL,
     "values: expected fp32, fp16, bf16, int8 or ternary"},
    {{BASE, "--log-format", "xml", NULL}, STRATA_EINVAL, "log_format: expected text or json"},
    {{BASE, "--log-level", "loud", NULL}, STRATA_EINVAL, "log_level: expected debug"},
    {{"prog", "--model", "mlp", NULL}, STRATA_EINVAL, "state_dir: required"},
    {{BASE, "--screen-factor", "0", NULL}, 0, NULL},
    {{BASE, "--screen-factor", "1", NULL}, 0, NULL},
    {{BASE, "--screen-factor", "0.5", NULL}, STRATA_EINVAL, "screen_factor: 0.5 would quarantine"},
    {{BASE, "--screen-factor", "-1", NULL}, STRATA_EINVAL, "--screen-factor"},
    {{BASE, "--downlink", "none", NULL}, 0, NULL},
    {{BASE, "--downlink", "topk:0.02:int8", "--downlink-keep", "3", NULL}, 0, NULL},
    {{BASE, "--downlink", "fp16", NULL}, 0, NULL},
    {{BASE, "--downlink", "topk", NULL}, STRATA_EINVAL, "downlink: compressor 'topk'"},
    {{BASE, "--downlink", "zip", NULL}, STRATA_EINVAL, "downlink: compressor 'zip'"},
    {{BASE, "--downlink", "topk:0.01", "--downlink-keep", "0", NULL}, 0, NULL},
    {{BASE, "--downlink-keep", "-1", NULL}, STRATA_EINVAL, "--downlink-keep"},
    {{BASE, "--downlink-keep", "4097", NULL}, STRATA_EINVAL, "--downlink-keep"},
};

static void test_parse_table(void)
{
    for (size_t c = 0; c < sizeof(CASES) / sizeof(CASES[0]); c++) {
        int argc = 0;
        while (CASES[c].args[argc] != NULL)
            argc++;
        srv_config cfg;
        srv_config_init(&cfg);
        strata_diag d = {{0}};
        int rc = srv_config_parse(&cfg, argc, (char **)CASES[c].args, &d);
        CU_ASSERT_EQUAL(rc, CASES[c].rc);
        if (CASES[c].msg != NULL) {
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, CASES[c].msg));
            if (strstr(d.msg, CASES[c].msg) == NULL)
                fprintf(stderr, "case %zu: '%s'\n", c, d.msg);
        }
        srv_config_cleanup(&cfg);
    }
}

static void test_file_then_command_line(void)
{
    char path[] = "/tmp/strata-config-XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    const char *json = "{\"rounds\": 7, \"lr\": 0.5, \"log_level\": \"debug\", "
                       "\"values\": \"bf16\"}";
    CU_ASSERT_EQUAL_FATAL(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    const char *argv[] = {BASE, "--rounds", "3", "--config", path, "--log-format=json"};
    srv_config cfg;
    srv_config_init(&cfg);
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(srv_config_parse(&cfg, sizeof(argv) / sizeof(argv[0]), (char **)argv, &d), 0);
    CU_ASSERT_EQUAL(cfg.rounds, 3);
    CU_ASSERT_DOUBLE_EQUAL(cfg.lr, 0.5, 1e-12);
    CU_ASSERT_EQUAL(cfg.values_format, STRATA_VALUES_BF16);
    CU_ASSERT_EQUAL(cfg.log_level_value, STRATA_LOG_DEBUG);
    CU_ASSERT_EQUAL(cfg.log_format_value, STRATA_LOG_JSON);
    srv_config_cleanup(&cfg);

    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("{\"min_clients\": 1, \"bogus_key\": 3}", f);
    fclose(f);
    srv_config_init(&cfg);
    CU_ASSERT_EQUAL(srv_config_parse(&cfg, sizeof(argv) / sizeof(argv[0]), (char **)argv, &d),
                    STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, path));
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "unknown key \"bogus_key\""));
    srv_config_cleanup(&cfg);
    unlink(path);
}

/* The public view shows an option left unset (0 where its minimum is above
 * 0) as null, keeps files and credentials out, and loads back as a --config
 * file to the same view. */
static void test_view_round_trip(void)
{
    const char *argv[] = {BASE, "--rounds", "9", "--server-lr", "5", "--downlink", "topk:0.01"};
    srv_config cfg;
    srv_config_init(&cfg);
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL_FATAL(srv_config_parse(&cfg, sizeof(argv) / sizeof(argv[0]), (char **)argv, &d),
                          0);
    char *view = srv_config_json(&cfg, 0);
    char *full = srv_config_json(&cfg, 1);
    srv_config_cleanup(&cfg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(view);
    CU_ASSERT_PTR_NOT_NULL_FATAL(full);
    json_t *o = json_loads(view, 0, NULL);
    json_t *f = json_loads(full, 0, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_TRUE(json_is_null(json_object_get(o, "fraction")));
    CU_ASSERT_TRUE(json_is_null(json_object_get(o, "clients_per_round")));
    CU_ASSERT_TRUE(json_is_null(json_object_get(o, "max_body_bytes")));
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(o, "rounds")), 9);
    CU_ASSERT_TRUE(json_is_true(json_object_get(o, "enrolment_secret")));
    CU_ASSERT_PTR_NULL(json_object_get(o, "state_dir"));
    CU_ASSERT_PTR_NULL(json_object_get(o, "enrolment_secret_file"));
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(f, "state_dir")), "s");

    /* The view as a config file: the secret flag is not a value to load. */
    json_object_del(o, "enrolment_secret");
    char path[] = "/tmp/strata-config-XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    CU_ASSERT_EQUAL_FATAL(json_dump_file(o, path, 0), 0);
    const char *again[] = {BASE, "--config", path};
    srv_config_init(&cfg);
    CU_ASSERT_EQUAL(srv_config_parse(&cfg, sizeof(again) / sizeof(again[0]), (char **)again, &d),
                    0);
    char *view2 = srv_config_json(&cfg, 0);
    CU_ASSERT_PTR_NOT_NULL(view2);
    if (view2 != NULL)
        CU_ASSERT_STRING_EQUAL(view2, view);
    srv_config_cleanup(&cfg);
    unlink(path);
    free(view2);
    json_decref(o);
    json_decref(f);
    free(view);
    free(full);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"usage names every key", test_usage_names_every_key},
        {"command lines", test_parse_table},
        {"file then command line", test_file_then_command_line},
        {"public view round trip", test_view_round_trip},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"server config", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
