/* Unit tests of the client's state directory (client/state.c): identity,
 * model cache, staging and settling, receipts appended and reloaded, and
 * forgetting a federation. */
#include "state.h"
#include "test_util.h"

#include "strata/ef.h"
#include "strata/fileio.h"

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

static int exists(const char *name)
{
    char p[4096];
    path_in(p, sizeof(p), name);
    return access(p, F_OK) == 0;
}

/* The receipts log's text ("" when absent). */
static void read_log(const char *name, char *buf, size_t cap)
{
    char p[4096];
    path_in(p, sizeof(p), name);
    buf[0] = '\0';
    uint8_t *data = NULL;
    size_t len = 0;
    if (strata_file_read_all(p, cap - 1, &data, &len, NULL) == STRATA_OK)
        memcpy(buf, data, len + 1);
    free(data);
}

static strata_client_state *open_state(void)
{
    strata_client_state *s = NULL;
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_client_state_open(g_dir, &s, &d), STRATA_OK);
    return s;
}

static void test_open_creates_dir(void)
{
    char sub[4096];
    path_in(sub, sizeof(sub), "sub");
    strata_client_state *s = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_client_state_open(sub, &s, NULL), STRATA_OK);
    struct stat st;
    CU_ASSERT_EQUAL(stat(sub, &st), 0);
    CU_ASSERT_EQUAL(st.st_mode & 0777, 0700);
    CU_ASSERT_STRING_EQUAL(strata_client_state_dir(s), sub);
    strata_client_state_free(s);
    char inside[4096 + 8];
    snprintf(inside, sizeof(inside), "%s/x/y", sub); /* parent missing */
    CU_ASSERT_EQUAL(strata_client_state_open(inside, &s, NULL), STRATA_EIO);
    CU_ASSERT_PTR_NULL(s);
}

static void test_identity(void)
{
    strata_client_state *s = open_state();
    strata_client_identity id = {.client_id = 99};
    CU_ASSERT_EQUAL(strata_client_state_load_identity(s, &id, NULL), STRATA_ESTATE);
    CU_ASSERT_EQUAL(id.client_id, 0);
    strata_client_identity saved = {.client_id = 42};
    snprintf(saved.token, sizeof(saved.token), "%s", "abc123");
    CU_ASSERT_EQUAL(strata_client_state_save_identity(s, &saved, "http://x:1", NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_load_identity(s, &id, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(id.client_id, 42);
    CU_ASSERT_STRING_EQUAL(id.token, "abc123");
    char p[4096];
    path_in(p, sizeof(p), "identity.json");
    struct stat st;
    CU_ASSERT_EQUAL(stat(p, &st), 0);
    CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
    /* A malformed identity is refused, not half-read. */
    CU_ASSERT_EQUAL(strata_file_write_atomic(p, "{\"client_id\":\"7\"}", 17, 0600, NULL),
                    STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_load_identity(s, &id, NULL), STRATA_EPROTO);
    CU_ASSERT_EQUAL(id.client_id, 0);
    /* A data share the coordinator assigned is kept with the identity. */
    saved.data_share = 3;
    saved.data_shares = 5;
    CU_ASSERT_EQUAL(strata_client_state_save_identity(s, &saved, "http://x:1", NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_load_identity(s, &id, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(id.data_share, 3);
    CU_ASSERT_EQUAL(id.data_shares, 5);
    /* A share outside 0..N-1, or half of one, is refused. */
    static const char *const bad[] = {
        "{\"client_id\":1,\"token\":\"t\",\"data_share\":5,\"data_shares\":5}",
        "{\"client_id\":1,\"token\":\"t\",\"data_share\":-1,\"data_shares\":5}",
        "{\"client_id\":1,\"token\":\"t\",\"data_share\":0,\"data_shares\":0}",
        "{\"client_id\":1,\"token\":\"t\",\"data_share\":0}",
        "{\"client_id\":1,\"token\":\"t\",\"data_shares\":2}",
        "{\"client_id\":1,\"token\":\"t\",\"data_share\":\"0\",\"data_shares\":2}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CU_ASSERT_EQUAL(strata_file_write_atomic(p, bad[i], strlen(bad[i]), 0600, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_client_state_load_identity(s, &id, NULL), STRATA_EPROTO);
        CU_ASSERT_EQUAL(id.client_id + id.data_share + id.data_shares, 0);
    }
    strata_client_state_free(s);
}

/* The registration id is made once, kept across opens, and forgotten with
 * the federation. */
static void test_registration_id(void)
{
    strata_client_state *s = open_state();
    char a[STRATA_CLIENT_REGISTRATION_LEN + 1], b[STRATA_CLIENT_REGISTRATION_LEN + 1];
    CU_ASSERT_EQUAL_FATAL(strata_client_state_registration_id(s, a, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strlen(a), STRATA_CLIENT_REGISTRATION_LEN);
    strata_client_state_free(s);
    s = open_state();
    CU_ASSERT_EQUAL_FATAL(strata_client_state_registration_id(s, b, NULL), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(a, b);
    char p[4096];
    path_in(p, sizeof(p), "registration");
    struct stat st;
    CU_ASSERT_EQUAL(stat(p, &st), 0);
    CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
    CU_ASSERT_EQUAL(strata_client_state_forget(s, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_client_state_registration_id(s, b, NULL), STRATA_OK);
    CU_ASSERT_STRING_NOT_EQUAL(a, b);
    strata_client_state_free(s);
}

static void test_model_etag(void)
{
    strata_client_state *s = open_state();
    char etag[16] = "junk";
    CU_ASSERT_EQUAL(strata_client_state_model_etag(s, etag, sizeof(etag)), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(etag, "");
    const uint8_t body[] = "not a model";
    CU_ASSERT_EQUAL(strata_client_state_save_model(s, body, sizeof(body), "\"v3\"", NULL),
                    STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_model_etag(s, etag, sizeof(etag)), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(etag, "\"v3\"");
    /* An ETag that does not fit is no ETag. */
    CU_ASSERT_EQUAL(strata_client_state_model_etag(s, etag, 4), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(etag, "");
    strata_model *m = NULL;
    CU_ASSERT_NOT_EQUAL(strata_client_state_load_model(s, &m, NULL), STRATA_OK);
    CU_ASSERT_PTR_NULL(m);
    strata_client_state_free(s);
}

/* A one-tensor residual state. */
static strata_ef *small_ef(strata_tensor_list *layout)
{
    strata_tensor_list_init(layout);
    const int64_t shape[1] = {4};
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(layout, "w", 1, shape, NULL), STRATA_OK);
    strata_ef *ef = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(layout, 1.0, 0, &ef), STRATA_OK);
    return ef;
}

static void test_stage_and_settle(void)
{
    strata_client_state *s = open_state();
    strata_tensor_list layout;
    strata_ef *ef = small_ef(&layout);
    strata_ef *loaded = (strata_ef *)1;
    CU_ASSERT_EQUAL(strata_client_state_load_residuals(s, &layout, &loaded, NULL), STRATA_OK);
    CU_ASSERT_PTR_NULL(loaded); /* none yet */

    int staged = 1;
    uint32_t round = 7;
    CU_ASSERT_EQUAL(strata_client_state_staged(s, &staged, &round), STRATA_OK);
    CU_ASSERT_EQUAL(staged, 0);
    const uint8_t wire[] = {1, 2, 3, 4, 5};
    CU_ASSERT_EQUAL(strata_client_state_stage(s, ef, 3, wire, sizeof(wire), NULL), STRATA_OK);
    CU_ASSERT_TRUE(exists("pending.json"));
    CU_ASSERT_TRUE(exists("pending.bin"));
    CU_ASSERT_TRUE(exists("residual.pending.safetensors"));
    CU_ASSERT_FALSE(exists("residual.safetensors"));
    CU_ASSERT_EQUAL(strata_client_state_staged(s, &staged, &round), STRATA_OK);
    CU_ASSERT_EQUAL(staged, 1);
    CU_ASSERT_EQUAL(round, 3);
    uint8_t *got = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(strata_client_state_staged_payload(s, &got, &len, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(len, sizeof(wire));
    CU_ASSERT_TRUE(got != NULL && memcmp(got, wire, len) == 0);
    free(got);

    /* Acknowledged: receipt appended, residuals installed, stage gone. */
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 3, "r3", NULL), STRATA_OK);
    CU_ASSERT_FALSE(exists("pending.json"));
    CU_ASSERT_FALSE(exists("pending.bin"));
    CU_ASSERT_FALSE(exists("residual.pending.safetensors"));
    CU_ASSERT_TRUE(exists("residual.safetensors"));
    CU_ASSERT_EQUAL(strata_client_state_load_residuals(s, &layout, &loaded, NULL), STRATA_OK);
    CU_ASSERT_PTR_NOT_NULL(loaded);
    strata_ef_free(loaded);

    /* Refused: the pending residuals go, the current ones stay. */
    CU_ASSERT_EQUAL(strata_client_state_stage(s, ef, 4, wire, sizeof(wire), NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 4, NULL, NULL), STRATA_OK);
    CU_ASSERT_FALSE(exists("pending.json"));
    CU_ASSERT_FALSE(exists("residual.pending.safetensors"));
    CU_ASSERT_TRUE(exists("residual.safetensors"));
    char log[256];
    read_log("receipts.log", log, sizeof(log));
    CU_ASSERT_STRING_EQUAL(log, "3 r3\n");

    /* A marker without a round is removed. */
    char p[4096];
    path_in(p, sizeof(p), "pending.json");
    CU_ASSERT_EQUAL(strata_file_write_atomic(p, "{\"round\":-1}", 12, 0600, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_staged(s, &staged, &round), STRATA_OK);
    CU_ASSERT_EQUAL(staged, 0);
    CU_ASSERT_FALSE(exists("pending.json"));
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&layout);
    strata_client_state_free(s);
}

static void test_receipts_append_and_reload(void)
{
    char p[4096];
    path_in(p, sizeof(p), "receipts.log");
    unlink(p); /* start without the earlier tests' receipts */
    strata_client_state *s = open_state();
    int present = 1;
    uint32_t last = 9;
    CU_ASSERT_EQUAL(strata_client_state_last_receipt(s, &present, &last), STRATA_OK);
    CU_ASSERT_EQUAL(present, 0);
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 0, "aa", NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 1, "bb", NULL), STRATA_OK);
    /* The same round again (a re-sent stage): not appended twice. */
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 1, "bb", NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 2, "two words", NULL), STRATA_EINVAL);
    strata_client_state_free(s);

    /* A new run reads the last line back, without re-reading the rest. */
    s = open_state();
    CU_ASSERT_EQUAL(strata_client_state_last_receipt(s, &present, &last), STRATA_OK);
    CU_ASSERT_EQUAL(present, 1);
    CU_ASSERT_EQUAL(last, 1);
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 1, "bb", NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 2, "cc", NULL), STRATA_OK);
    char log[256];
    read_log("receipts.log", log, sizeof(log));
    CU_ASSERT_STRING_EQUAL(log, "0 aa\n1 bb\n2 cc\n");

    /* Forgetting the federation moves the log aside and removes the rest. */
    strata_tensor_list layout;
    strata_ef *ef = small_ef(&layout);
    const uint8_t wire[] = {9};
    CU_ASSERT_EQUAL(strata_client_state_stage(s, ef, 3, wire, 1, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_save_model(s, wire, 1, "e", NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_client_state_forget(s, NULL), STRATA_OK);
    CU_ASSERT_FALSE(exists("receipts.log"));
    CU_ASSERT_FALSE(exists("pending.json"));
    CU_ASSERT_FALSE(exists("residual.safetensors"));
    CU_ASSERT_FALSE(exists("model.safetensors"));
    CU_ASSERT_TRUE(exists("identity.json"));
    read_log("receipts.log.old", log, sizeof(log));
    CU_ASSERT_STRING_EQUAL(log, "0 aa\n1 bb\n2 cc\n");
    CU_ASSERT_EQUAL(strata_client_state_last_receipt(s, &present, &last), STRATA_OK);
    CU_ASSERT_EQUAL(present, 0);
    CU_ASSERT_EQUAL(strata_client_state_settle(s, 0, "new", NULL), STRATA_OK);
    read_log("receipts.log", log, sizeof(log));
    CU_ASSERT_STRING_EQUAL(log, "0 new\n");
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&layout);
    strata_client_state_free(s);
}

static void test_receipts_tail_of_long_log(void)
{
    /* A log far longer than the tail that is read: the last line still
     * counts, and a line cut by a crash is the last line. */
    char p[4096];
    path_in(p, sizeof(p), "receipts.log");
    FILE *f = fopen(p, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    for (int r = 0; r < 5000; r++)
        fprintf(f, "%d %064d\n", r, r);
    fputs("5000 cut", f);
    fclose(f);
    strata_client_state *s = open_state();
    int present = 0;
    uint32_t last = 0;
    CU_ASSERT_EQUAL(strata_client_state_last_receipt(s, &present, &last), STRATA_OK);
    CU_ASSERT_EQUAL(present, 1);
    CU_ASSERT_EQUAL(last, 5000);
    strata_client_state_free(s);
    unlink(p);
}

static int suite_init(void)
{
    g_dir = strata_test_tmpdir();
    return g_dir ? 0 : -1;
}

static int suite_clean(void)
{
    strata_test_rmtree(g_dir);
    free(g_dir);
    return 0;
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"registration id", test_registration_id},
        {"open creates the directory", test_open_creates_dir},
        {"identity", test_identity},
        {"model cache and ETag", test_model_etag},
        {"stage and settle", test_stage_and_settle},
        {"receipts append and reload", test_receipts_append_and_reload},
        {"receipts tail of a long log", test_receipts_tail_of_long_log},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"client_state", suite_init, suite_clean, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
