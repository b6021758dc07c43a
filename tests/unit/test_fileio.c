#include "strata/fileio.h"
#include "test_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *g_dir;

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

static void test_write_atomic(void)
{
    char p[4096];
    path_in(p, sizeof(p), "w.txt");
    CU_ASSERT_EQUAL(strata_file_write_atomic(p, "one\n", 4, 0600, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_file_write_atomic(p, "two\nrest", 8, 0600, NULL), STRATA_OK);
    struct stat st;
    CU_ASSERT_EQUAL_FATAL(stat(p, &st), 0);
    CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
    CU_ASSERT_EQUAL(st.st_size, 8);
    char line[16];
    size_t n = 99;
    CU_ASSERT_EQUAL(strata_file_read_line(p, line, sizeof(line), &n, NULL), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(line, "two");
    CU_ASSERT_EQUAL(n, 3);
}

/* The two-phase form: the temporary file holds the bytes with the mode and
 * nothing appears at the final path until the caller renames it. */
static void test_write_temp(void)
{
    char p[4096];
    path_in(p, sizeof(p), "t.bin");
    char *tmp = (char *)"unset";
    CU_ASSERT_EQUAL_FATAL(strata_file_write_temp(p, "abc", 3, 0640, &tmp, NULL), STRATA_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tmp);
    CU_ASSERT_EQUAL(strncmp(tmp, p, strlen(p)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(tmp, ".tmp."));
    struct stat st;
    CU_ASSERT_NOT_EQUAL(stat(p, &st), 0);
    CU_ASSERT_EQUAL_FATAL(stat(tmp, &st), 0);
    CU_ASSERT_EQUAL(st.st_size, 3);
    mode_t mask = umask(0);
    umask(mask);
    CU_ASSERT_EQUAL(st.st_mode & 0777, 0640 & ~mask);
    CU_ASSERT_EQUAL(rename(tmp, p), 0);
    free(tmp);
    char line[8];
    CU_ASSERT_EQUAL(strata_file_read_line(p, line, sizeof(line), NULL, NULL), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(line, "abc");

    /* A directory that does not exist: an error, *tmp NULL, nothing left. */
    char q[4096];
    path_in(q, sizeof(q), "missing/t.bin");
    strata_diag d = {{0}};
    tmp = (char *)"unset";
    CU_ASSERT_EQUAL(strata_file_write_temp(q, "abc", 3, 0600, &tmp, &d), STRATA_EIO);
    CU_ASSERT_PTR_NULL(tmp);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "missing"));
    CU_ASSERT_EQUAL(strata_file_write_temp(NULL, "abc", 3, 0600, &tmp, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_file_write_temp(q, "abc", 3, 0600, NULL, NULL), STRATA_EINVAL);
}

/* One case of strata_file_read_line: file content, buffer size, result. */
typedef struct {
    const char *content; /* NULL: no file */
    size_t cap;
    int rc;
    const char *line;
} line_case;

static void test_read_line(void)
{
    static const line_case cases[] = {
        {"secret\n", 16, STRATA_OK, "secret"},
        {"secret\r\nsecond\n", 16, STRATA_OK, "secret"},
        {"no newline", 16, STRATA_OK, "no newline"},
        {"", 16, STRATA_OK, ""},
        {"\nsecond", 16, STRATA_OK, ""},
        {"abcdefghijklmn\n", 16, STRATA_OK, "abcdefghijklmn"}, /* cap - 2 bytes: fits */
        {"abcdefghijklmno\n", 16, STRATA_ETOOBIG, ""},         /* cap - 1 bytes: too long */
        {"abcdefghijklmnopqrstuvwxyz", 16, STRATA_ETOOBIG, ""},
        {NULL, 16, STRATA_ESTATE, ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char p[4096];
        snprintf(p, sizeof(p), "%s/line-%zu", g_dir, i);
        if (cases[i].content != NULL) {
            FILE *f = fopen(p, "w");
            CU_ASSERT_PTR_NOT_NULL_FATAL(f);
            fputs(cases[i].content, f);
            fclose(f);
        }
        char buf[64];
        memset(buf, 'x', sizeof(buf));
        size_t n = 99;
        strata_diag d = {{0}};
        int rc = strata_file_read_line(p, buf, cases[i].cap, &n, &d);
        CU_ASSERT_EQUAL(rc, cases[i].rc);
        CU_ASSERT_STRING_EQUAL(buf, cases[i].line);
        CU_ASSERT_EQUAL(n, strlen(cases[i].line));
        if (rc < 0)
            CU_ASSERT(strstr(d.msg, p) != NULL); /* the message names the file */
    }
    char buf[4];
    CU_ASSERT_EQUAL(strata_file_read_line(NULL, buf, sizeof(buf), NULL, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_file_read_line("x", buf, 1, NULL, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_file_read_line(g_dir, buf, sizeof(buf), NULL, NULL), STRATA_EIO);
}

/* One case of strata_file_read_all: file content (NULL: no file), cap, result. */
typedef struct {
    const char *content;
    size_t max;
    int rc;
} all_case;

static void test_read_all(void)
{
    static const all_case cases[] = {
        {"hello", 5, STRATA_OK},      {"hello", 100, STRATA_OK}, {"", 0, STRATA_OK},
        {"hello", 4, STRATA_ETOOBIG}, {NULL, 10, STRATA_ESTATE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char p[4096];
        snprintf(p, sizeof(p), "%s/all-%zu", g_dir, i);
        if (cases[i].content != NULL)
            CU_ASSERT_EQUAL_FATAL(
                strata_file_write_atomic(p, cases[i].content, strlen(cases[i].content), 0600, NULL),
                STRATA_OK);
        uint8_t *data = (uint8_t *)"x";
        size_t n = 99;
        strata_diag d = {{0}};
        CU_ASSERT_EQUAL(strata_file_read_all(p, cases[i].max, &data, &n, &d), cases[i].rc);
        if (cases[i].rc == STRATA_OK) {
            CU_ASSERT_PTR_NOT_NULL_FATAL(data);
            CU_ASSERT_EQUAL(n, strlen(cases[i].content));
            CU_ASSERT_EQUAL(data[n], '\0');
            CU_ASSERT_STRING_EQUAL((char *)data, cases[i].content);
        } else {
            CU_ASSERT_PTR_NULL(data);
            CU_ASSERT_EQUAL(n, 0);
            CU_ASSERT(strstr(d.msg, p) != NULL);
        }
        free(data);
    }
    /* A directory is not a regular file. */
    uint8_t *data = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_file_read_all(g_dir, 100, &data, &n, NULL), STRATA_EIO);
    CU_ASSERT_PTR_NULL(data);
}

static void test_write_all_and_fsync_dir(void)
{
    char p[4096];
    path_in(p, sizeof(p), "raw.bin");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CU_ASSERT_FATAL(fd >= 0);
    static const char data[] = "0123456789";
    CU_ASSERT_EQUAL(strata_file_write_all(fd, data, 10, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_file_write_all(fd, NULL, 0, NULL), STRATA_OK);
    close(fd);
    uint8_t *back = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(strata_file_read_all(p, 100, &back, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 10);
    CU_ASSERT(back != NULL && memcmp(back, data, 10) == 0);
    free(back);
    strata_diag d;
    CU_ASSERT_EQUAL(strata_file_write_all(-1, data, 10, &d), STRATA_EINVAL);
    fd = open(p, O_RDONLY);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(strata_file_write_all(fd, data, 10, &d), STRATA_EIO); /* read-only */
    close(fd);
    CU_ASSERT_EQUAL(strata_file_fsync_dir(g_dir, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_file_fsync_dir(p, &d), STRATA_EIO); /* not a directory */
    CU_ASSERT_EQUAL(strata_file_fsync_dir(NULL, NULL), STRATA_EINVAL);
}

static void test_random_token(void)
{
    char a[STRATA_TOKEN_HEX + 1], b[STRATA_TOKEN_HEX + 1];
    CU_ASSERT_EQUAL(strata_random_token(a, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_random_token(b, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strlen(a), STRATA_TOKEN_HEX);
    CU_ASSERT_EQUAL(strspn(a, "0123456789abcdef"), STRATA_TOKEN_HEX);
    CU_ASSERT(strcmp(a, b) != 0);
}

static int setup(void)
{
    g_dir = strata_test_tmpdir();
    return g_dir == NULL;
}

static int teardown(void)
{
    strata_test_rmtree(g_dir);
    free(g_dir);
    return 0;
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"atomic write, mode, replace", test_write_atomic},
        {"temporary file, published by the caller", test_write_temp},
        {"first line of a file", test_read_line},
        {"whole file, capped", test_read_all},
        {"write all, directory fsync", test_write_all_and_fsync_dir},
        {"random tokens", test_random_token},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"fileio", setup, teardown, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
