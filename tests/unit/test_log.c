#include "strata/clock.h"
#include "strata/log.h"
#include "test_util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs fn with standard error sent to a temporary file and returns what it
 * wrote (malloc'ed). */
static char *capture(void (*fn)(void))
{
    char path[] = "/tmp/strata-log-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return NULL;
    unlink(path);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    char *out = calloc((size_t)n + 1, 1);
    if (out != NULL && pread(fd, out, (size_t)n, 0) != n) {
        free(out);
        out = NULL;
    }
    close(fd);
    return out;
}

static void write_text(void)
{
    strata_log_setup("strata-test", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    strata_log_debug("hidden %d", 1);
    strata_log_info("round %d closed", 3);
    strata_log_error("bad\nline\x01");
}

static void test_text(void)
{
    char *out = capture(write_text);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT(strstr(out, "hidden") == NULL);
    char *l1 = out, *l2 = strchr(out, '\n');
    CU_ASSERT_PTR_NOT_NULL_FATAL(l2);
    *l2++ = '\0';
    /* 2026-12-02T19:06:16.123Z info strata-test: round 3 closed */
    CU_ASSERT_EQUAL(strlen(l1), 24 + strlen(" info strata-test: round 3 closed"));
    CU_ASSERT_EQUAL(l1[4], '-');
    CU_ASSERT_EQUAL(l1[10], 'T');
    CU_ASSERT_EQUAL(l1[23], 'Z');
    CU_ASSERT_STRING_EQUAL(l1 + 24, " info strata-test: round 3 closed");
    /* Control bytes cannot start a new line. */
    CU_ASSERT(strstr(l2, " error strata-test: bad?line?\n") != NULL);
    CU_ASSERT_EQUAL(strchr(l2, '\n')[1], '\0');
    free(out);
}

static void write_json(void)
{
    strata_log_setup("strata-test", STRATA_LOG_DEBUG, STRATA_LOG_JSON);
    strata_log_debug("quote \" back\\slash \x7f tab\t high \xc3\xa9");
    char big[STRATA_LOG_LINE_MAX + 100];
    memset(big, '"', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    strata_log_warn("%s", big);
    strata_log_setup("strata", STRATA_LOG_INFO, STRATA_LOG_TEXT);
}

static void test_json(void)
{
    char *out = capture(write_json);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    char *save = NULL;
    int lines = 0;
    for (char *l = strtok_r(out, "\n", &save); l != NULL; l = strtok_r(NULL, "\n", &save)) {
        json_error_t err;
        json_t *j = json_loads(l, JSON_REJECT_DUPLICATES, &err);
        CU_ASSERT_PTR_NOT_NULL_FATAL(j);
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "prog")), "strata-test");
        const char *level = json_string_value(json_object_get(j, "level"));
        const char *msg = json_string_value(json_object_get(j, "msg"));
        CU_ASSERT_PTR_NOT_NULL_FATAL(msg);
        CU_ASSERT_EQUAL(strlen(json_string_value(json_object_get(j, "ts"))), 24);
        if (lines == 0) {
            CU_ASSERT_STRING_EQUAL(level, "debug");
            static const char want[] = "quote \" back\\slash \x7f tab\t high ";
            CU_ASSERT(strncmp(msg, want, sizeof want - 1) == 0);
            /* Bytes >= 0x80 arrive as \u00XX: two characters of two bytes each. */
            CU_ASSERT_EQUAL(strlen(msg), sizeof want - 1 + 4);
        } else {
            CU_ASSERT_STRING_EQUAL(level, "warn");
            CU_ASSERT(strlen(msg) > 500);
            CU_ASSERT(strlen(l) <= STRATA_LOG_LINE_MAX + 64);
        }
        json_decref(j);
        lines++;
    }
    CU_ASSERT_EQUAL(lines, 2);
    free(out);
}

static void test_parse(void)
{
    strata_log_format f;
    strata_log_level l;
    strata_diag d;
    CU_ASSERT_EQUAL(strata_log_parse_format("json", &f, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(f, STRATA_LOG_JSON);
    CU_ASSERT_EQUAL(strata_log_parse_format("text", &f, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(f, STRATA_LOG_TEXT);
    CU_ASSERT_EQUAL(strata_log_parse_format("xml", &f, &d), STRATA_EINVAL);
    CU_ASSERT(strstr(d.msg, "xml") != NULL);
    CU_ASSERT_EQUAL(strata_log_parse_level("warn", &l, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(l, STRATA_LOG_WARN);
    CU_ASSERT_EQUAL(strata_log_parse_level("loud", &l, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_log_parse_level(NULL, &l, NULL), STRATA_EINVAL);
}

static void test_deadline(void)
{
    strata_deadline never = strata_deadline_in(-1);
    CU_ASSERT_FALSE(strata_deadline_expired(never));
    CU_ASSERT_EQUAL(strata_deadline_left_ms(never), INT64_MAX);
    strata_deadline now = strata_deadline_in(0);
    CU_ASSERT_TRUE(strata_deadline_expired(now));
    CU_ASSERT_EQUAL(strata_deadline_left_ms(now), 0);
    strata_deadline later = strata_deadline_in(60000);
    CU_ASSERT_FALSE(strata_deadline_expired(later));
    int64_t left = strata_deadline_left_ms(later);
    CU_ASSERT(left > 59000 && left <= 60000);
    int64_t a = strata_clock_mono_ms();
    usleep(20000);
    CU_ASSERT(strata_clock_mono_ms() - a >= 19);
    CU_ASSERT(strata_clock_unix_ms() > 1700000000000LL);
    struct timespec wall, at = strata_clock_abstime_in(1999);
    clock_gettime(CLOCK_REALTIME, &wall);
    CU_ASSERT(at.tv_nsec >= 0 && at.tv_nsec < 1000000000L);
    double ahead = (double)(at.tv_sec - wall.tv_sec) + (double)(at.tv_nsec - wall.tv_nsec) * 1e-9;
    CU_ASSERT(ahead > 1.9 && ahead <= 2.0);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"text lines", test_text},
        {"JSON lines are valid JSON", test_json},
        {"level and format names", test_parse},
        {"deadlines", test_deadline},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"log", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
