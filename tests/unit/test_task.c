/* Unit tests of the task JSON codec (strata/task.h): the exact text the
 * coordinator sends, round trips of every field, and table-driven
 * refusals of malformed, out-of-range, oversize and unknown input. */
#include "strata/task.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *NAMES[] = {"fc1.weight", "fc1.bias"};

static strata_task sample_task(strata_budget *b)
{
    b[0] = (strata_budget){.comp = STRATA_COMP_TOPK, .density = 0.25, .values = STRATA_VALUES_FP16};
    b[1] = (strata_budget){.comp = STRATA_COMP_NONE, .density = 1.0, .values = STRATA_VALUES_FP16};
    strata_task t = {.round = 3,
                     .total_rounds = 30,
                     .model_version = 3,
                     .deadline_unix_ms = 1764672000000LL,
                     .num_layers = 2,
                     .layer_names = NAMES,
                     .budgets = b,
                     .train = {.epochs = 2,
                               .batch = 32,
                               .lr = 0.5,
                               .momentum = 0.5,
                               .weight_decay = 0.0,
                               .prox_mu = 0.0,
                               .max_steps = 0},
                     .seed = 123456};
    return t;
}

static const char BASE[] =
    "{\"round\":3,\"total_rounds\":30,\"model_version\":3,\"deadline_unix_ms\":1764672000000,"
    "\"budgets\":[{\"layer\":\"fc1.weight\",\"compressor\":\"topk\","
    "\"density\":0.25,\"levels\":0,\"rank\":0,\"values\":\"fp16\"},{\"layer\":\"fc1.bias\","
    "\"compressor\":\"none\","
    "\"density\":1.0,\"levels\":0,\"rank\":0,\"values\":\"fp16\"}],\"error_candidates\":[],"
    "\"train\":{\"epochs\":2,\"batch\":32,\"lr\":0.5,"
    "\"momentum\":0.5,\"weight_decay\":0.0,\"prox_mu\":0.0,\"max_steps\":0},\"seed\":123456}";

static void assert_same_task(const strata_task *a, const strata_task *b)
{
    CU_ASSERT_EQUAL(a->round, b->round);
    CU_ASSERT_EQUAL(a->total_rounds, b->total_rounds);
    CU_ASSERT_EQUAL(a->model_version, b->model_version);
    CU_ASSERT_EQUAL(a->deadline_unix_ms, b->deadline_unix_ms);
    CU_ASSERT_EQUAL_FATAL(a->num_candidates, b->num_candidates);
    for (size_t i = 0; i < a->num_candidates; i++) {
        CU_ASSERT_EQUAL(a->candidates[i].comp, b->candidates[i].comp);
        CU_ASSERT_EQUAL(a->candidates[i].density, b->candidates[i].density);
        CU_ASSERT_EQUAL(a->candidates[i].levels, b->candidates[i].levels);
        CU_ASSERT_EQUAL(a->candidates[i].values, b->candidates[i].values);
    }
    CU_ASSERT_EQUAL_FATAL(a->num_layers, b->num_layers);
    for (size_t i = 0; i < a->num_layers; i++) {
        CU_ASSERT_STRING_EQUAL(a->layer_names[i], b->layer_names[i]);
        CU_ASSERT_EQUAL(a->budgets[i].comp, b->budgets[i].comp);
        CU_ASSERT_EQUAL(a->budgets[i].density, b->budgets[i].density);
        CU_ASSERT_EQUAL(a->budgets[i].levels, b->budgets[i].levels);
        CU_ASSERT_EQUAL(a->budgets[i].rank, b->budgets[i].rank);
        CU_ASSERT_EQUAL(a->budgets[i].values, b->budgets[i].values);
    }
    CU_ASSERT_EQUAL(a->train.epochs, b->train.epochs);
    CU_ASSERT_EQUAL(a->train.batch, b->train.batch);
    CU_ASSERT_EQUAL(a->train.lr, b->train.lr);
    CU_ASSERT_EQUAL(a->train.momentum, b->train.momentum);
    CU_ASSERT_EQUAL(a->train.weight_decay, b->train.weight_decay);
    CU_ASSERT_EQUAL(a->train.prox_mu, b->train.prox_mu);
    CU_ASSERT_EQUAL(a->train.max_steps, b->train.max_steps);
    CU_ASSERT_EQUAL(a->seed, b->seed);
}

static void test_exact_text(void)
{
    strata_budget b[2];
    strata_task t = sample_task(b);
    char *json = (char *)&json;
    size_t len = 99;
    strata_diag d;
    CU_ASSERT_EQUAL_FATAL(strata_task_encode(&t, &json, &len, &d), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(json, BASE);
    CU_ASSERT_EQUAL(len, strlen(BASE));
    free(json);
}

/* The text is the one the coordinator built with its own format string
 * before the codec existed: the same keys, order and number spelling. */
static void test_matches_legacy_format(void)
{
    strata_budget b[3] = {
        {.comp = STRATA_COMP_TOPK, .density = 0.0089, .values = STRATA_VALUES_BF16},
        {.comp = STRATA_COMP_QSGD, .density = 1.0, .levels = 15},
        {.comp = STRATA_COMP_POWERSGD, .density = 0.3, .rank = 4, .values = STRATA_VALUES_BF16}};
    strata_budget cand[2] = {{.comp = STRATA_COMP_TOPK, .density = 0.001},
                             {.comp = STRATA_COMP_QSGD, .density = 1.0, .levels = 4}};
    char *names[3] = {"conv1.weight", "fc1.weight", "fc2.weight"};
    strata_task t = {.round = 17,
                     .total_rounds = 100,
                     .model_version = 16,
                     .deadline_unix_ms = 1700000000123LL,
                     .num_layers = 3,
                     .layer_names = names,
                     .budgets = b,
                     .num_candidates = 2,
                     .candidates = cand,
                     .train = {.epochs = 1,
                               .batch = 64,
                               .lr = 0.05,
                               .momentum = 0.9,
                               .weight_decay = 1e-4,
                               .prox_mu = 0.01,
                               .max_steps = 250},
                     .seed = (1ULL << 53) - 1};
    json_t *arr = json_array();
    for (size_t i = 0; i < 3; i++)
        json_array_append_new(arr, json_pack("{s:s,s:s,s:f,s:i,s:i,s:s}", "layer", names[i],
                                             "compressor", strata_comp_name(b[i].comp), "density",
                                             b[i].density, "levels", (int)b[i].levels, "rank",
                                             (int)b[i].rank, "values",
                                             strata_values_format_name(b[i].values)));
    json_t *carr = json_array();
    for (size_t i = 0; i < 2; i++)
        json_array_append_new(carr, json_pack("{s:s,s:f,s:i,s:i,s:s}", "compressor",
                                              strata_comp_name(cand[i].comp), "density",
                                              cand[i].density, "levels", (int)cand[i].levels,
                                              "rank", (int)cand[i].rank, "values", "fp32"));
    const strata_task_train *tr = &t.train;
    json_t *legacy =
        json_pack("{s:I,s:I,s:I,s:I,s:o,s:o,s:{s:I,s:I,s:f,s:f,s:f,s:f,s:I},s:I}", "round",
                  (json_int_t)t.round, "total_rounds", (json_int_t)t.total_rounds, "model_version",
                  (json_int_t)t.model_version, "deadline_unix_ms", (json_int_t)t.deadline_unix_ms,
                  "budgets", arr, "error_candidates", carr, "train", "epochs",
                  (json_int_t)tr->epochs, "batch", (json_int_t)tr->batch, "lr", tr->lr, "momentum",
                  tr->momentum, "weight_decay", tr->weight_decay, "prox_mu", tr->prox_mu,
                  "max_steps", (json_int_t)tr->max_steps, "seed", (json_int_t)t.seed);
    char *want = json_dumps(legacy, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(legacy);
    char *json = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(strata_task_encode(&t, &json, &len, NULL), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(json, want);

    strata_task back;
    strata_diag d;
    CU_ASSERT_EQUAL_FATAL(strata_task_decode(json, len, NULL, &back, &d), STRATA_OK);
    assert_same_task(&t, &back);
    strata_task_cleanup(&back);
    CU_ASSERT_EQUAL(back.num_layers, 0);
    CU_ASSERT_PTR_NULL(back.budgets);
    free(want);
    free(json);
}

static void test_round_trip_every_field(void)
{
    strata_budget b[2];
    strata_task t = sample_task(b);
    strata_task out;
    strata_diag d;
    CU_ASSERT_EQUAL_FATAL(strata_task_decode(BASE, strlen(BASE), NULL, &out, &d), STRATA_OK);
    assert_same_task(&t, &out);
    strata_task_cleanup(&out);

    /* The optional digest and downlink flag. */
    strata_task td = t;
    memset(td.model_digest, 'a', 64);
    td.model_digest[64] = '\0';
    td.downlink = 1;
    char *js = NULL;
    size_t jl = 0;
    CU_ASSERT_EQUAL_FATAL(strata_task_encode(&td, &js, &jl, &d), STRATA_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(js, "\"downlink\":true"));
    CU_ASSERT_EQUAL_FATAL(strata_task_decode(js, jl, NULL, &out, &d), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(out.model_digest, td.model_digest);
    CU_ASSERT_EQUAL(out.downlink, 1);
    strata_task_cleanup(&out);
    free(js);
    td.model_digest[3] = 'G';
    CU_ASSERT_EQUAL(strata_task_encode(&td, &js, &jl, &d), STRATA_EINVAL);

    /* Extremes of every range. */
    static char *one[] = {"x"};
    strata_budget eb = {.comp = STRATA_COMP_RANDK, .density = 4.9e-324};
    strata_task e = {.round = UINT32_MAX,
                     .total_rounds = UINT32_MAX,
                     .model_version = INT64_MAX,
                     .deadline_unix_ms = INT64_MAX,
                     .num_layers = 1,
                     .layer_names = one,
                     .budgets = &eb,
                     .train = {.epochs = INT32_MAX,
                               .batch = INT32_MAX,
                               .lr = 3.4028234663852886e38,
                               .momentum = 0.99999999999999989,
                               .weight_decay = 1e-300,
                               .prox_mu = 7.0,
                               .max_steps = INT64_MAX},
                     .seed = (1ULL << 53) - 1};
    char *json = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(strata_task_encode(&e, &json, &len, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_task_decode(json, len, NULL, &out, &d), STRATA_OK);
    assert_same_task(&e, &out);
    strata_task_cleanup(&out);
    free(json);

    /* No layers at all, and a UTF-8 layer name. */
    static char *utf[] = {"caf\xc3\xa9.w"};
    e.num_layers = 0;
    e.layer_names = NULL;
    e.budgets = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_task_encode(&e, &json, &len, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_task_decode(json, len, NULL, &out, &d), STRATA_OK);
    CU_ASSERT_EQUAL(out.num_layers, 0);
    strata_task_cleanup(&out);
    free(json);
    e.num_layers = 1;
    e.layer_names = utf;
    e.budgets = &eb;
    CU_ASSERT_EQUAL_FATAL(strata_task_encode(&e, &json, &len, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_task_decode(json, len, NULL, &out, &d), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(out.layer_names[0], utf[0]);
    strata_task_cleanup(&out);
    free(json);
    strata_task_cleanup(NULL);
}

/* BASE with the first occurrence of from replaced by to (malloc'ed): the
 * inputs of the refusal table are built as edits of the valid text. */
static char *mutate(const char *from, const char *to)
{
    const char *at = NULL;
    size_t nf = strlen(from);
    for (size_t i = 0; at == NULL && i + nf <= sizeof(BASE) - 1; i++)
        if (memcmp(BASE + i, from, nf) == 0)
            at = BASE + i;
    if (at == NULL)
        fprintf(stderr, "pattern not in BASE: %s\n", from);
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    size_t pre = (size_t)(at - BASE), nt = strlen(to);
    char *s = malloc(sizeof(BASE) - nf + nt);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    memcpy(s, BASE, pre);
    memcpy(s + pre, to, nt);
    strcpy(s + pre + nt, at + nf);
    return s;
}

static void test_refusals(void)
{
    static const struct {
        const char *from, *to;
        int rc;
        const char *msg;
    } cases[] = {
        /* wrong types */
        {"\"round\":3", "\"round\":3.0", STRATA_EPROTO, "task.round: expected an integer"},
        {"\"model_version\":3", "\"model_version\":\"3\"", STRATA_EPROTO,
         "task.model_version: expected an integer"},
        {"\"values\":\"fp16\"", "\"values\":1", STRATA_EPROTO,
         "budgets[0].values: expected a string"},
        {"\"error_candidates\":[]", "\"error_candidates\":{}", STRATA_EPROTO,
         "task.error_candidates: expected an array"},
        {"\"error_candidates\":[]", "\"error_candidates\":[{\"compressor\":\"sign\"}]",
         STRATA_EPROTO, "error_candidates[0].density: missing"},
        {"\"error_candidates\":[]",
         "\"error_candidates\":[{\"layer\":\"x\",\"compressor\":\"sign\",\"density\":1,"
         "\"levels\":0,\"rank\":0,\"values\":\"fp32\"}]",
         STRATA_EPROTO, "error_candidates[0]: unknown key \"layer\""},
        {"\"error_candidates\":[]",
         "\"error_candidates\":[{\"compressor\":\"sign\",\"density\":1,\"levels\":0,"
         "\"rank\":0,\"values\":\"fp16\"}]",
         STRATA_EPROTO, "error_candidates[0]: sign does not take values fp16"},
        {"\"budgets\":[{\"layer\":\"fc1.weight\",\"compressor\":\"topk\",\"density\":0.25,"
         "\"levels\":0,\"rank\":0,\"values\":\"fp16\"},{\"layer\":\"fc1.bias\",\"compressor\":"
         "\"none\","
         "\"density\":1.0,\"levels\":0,\"rank\":0,\"values\":\"fp16\"}]",
         "\"budgets\":{}", STRATA_EPROTO, "task.budgets: expected an array"},
        {"\"budgets\":[{\"layer\":\"fc1.weight\"", "\"budgets\":[7,{\"layer\":\"fc1.weight\"",
         STRATA_EPROTO, "budgets[0]: expected an object"},
        {"\"layer\":\"fc1.bias\"", "\"layer\":12", STRATA_EPROTO,
         "budgets[1].layer: expected a string"},
        {"\"compressor\":\"topk\"", "\"compressor\":null", STRATA_EPROTO,
         "budgets[0].compressor: expected a string"},
        {"\"density\":0.25", "\"density\":true", STRATA_EPROTO,
         "budgets[0].density: expected a number"},
        {"\"levels\":0,", "\"levels\":0.5,", STRATA_EPROTO,
         "budgets[0].levels: expected an integer"},
        {"\"train\":{", "\"train\":[{", STRATA_EPROTO, "invalid JSON"},
        {"\"lr\":0.5", "\"lr\":\"0.5\"", STRATA_EPROTO, "train.lr: expected a number"},
        {"\"seed\":123456", "\"seed\":1.5", STRATA_EPROTO, "task.seed: expected an integer"},
        {"\"seed\":123456", "\"seed\":123456,\"model_digest\":\"abc\"", STRATA_EPROTO,
         "task.model_digest: expected 64 lowercase hex digits"},
        {"\"seed\":123456", "\"seed\":123456,\"downlink\":1", STRATA_EPROTO,
         "task.downlink: expected true or false"},
        /* out of range */
        {"\"round\":3", "\"round\":-1", STRATA_EPROTO, "task.round: -1 is not in [0, 4294967295]"},
        {"\"round\":3", "\"round\":4294967296", STRATA_EPROTO, "task.round"},
        {"\"total_rounds\":30", "\"total_rounds\":0", STRATA_EPROTO, "task.total_rounds"},
        {"\"model_version\":3", "\"model_version\":-3", STRATA_EPROTO, "task.model_version"},
        {"\"deadline_unix_ms\":1764672000000", "\"deadline_unix_ms\":-5", STRATA_EPROTO,
         "task.deadline_unix_ms"},
        {"\"values\":\"fp16\"", "\"values\":\"fp64\"", STRATA_EPROTO,
         "budgets[0].values: unknown values format \"fp64\""},
        {"\"values\":\"fp16\"", "\"values\":\"FP16\"", STRATA_EPROTO, "budgets[0].values"},
        {"\"density\":0.25", "\"density\":0", STRATA_EPROTO,
         "budgets[0].density: 0 is not in (0, 1]"},
        {"\"density\":0.25", "\"density\":-0.25", STRATA_EPROTO, "budgets[0].density"},
        {"\"density\":1.0", "\"density\":1.0000001", STRATA_EPROTO, "budgets[1].density"},
        {"\"compressor\":\"topk\"", "\"compressor\":\"zip\"", STRATA_EPROTO,
         "budgets[0].compressor: unknown compressor \"zip\""},
        {"\"compressor\":\"topk\"", "\"compressor\":\"qsgd\"", STRATA_EPROTO,
         "budgets[0]: qsgd levels 0 is not in [1, 127]"},
        {"\"compressor\":\"topk\"", "\"compressor\":\"powersgd\"", STRATA_EPROTO,
         "budgets[0]: powersgd rank"},
        {"\"layer\":\"fc1.weight\"", "\"layer\":\"\"", STRATA_EPROTO, "budgets[0].layer: 0 bytes"},
        {"\"layer\":\"fc1.weight\"", "\"layer\":\"fc\\u0001\"", STRATA_EPROTO,
         "budgets[0].layer: control character 0x01"},
        {"\"levels\":0,", "\"levels\":-1,", STRATA_EPROTO, "budgets[0].levels"},
        {"\"rank\":0,\"values\":\"fp16\"}]", "\"rank\":2147483648,\"values\":\"fp16\"}]",
         STRATA_EPROTO, "budgets[1].rank"},
        {"\"epochs\":2", "\"epochs\":0", STRATA_EPROTO, "train.epochs: 0 is not in [1, "},
        {"\"batch\":32", "\"batch\":-32", STRATA_EPROTO, "train.batch"},
        {"\"lr\":0.5", "\"lr\":-0.5", STRATA_EPROTO, "train.lr"},
        {"\"lr\":0.5", "\"lr\":1e300", STRATA_EPROTO, "train.lr"},
        {"\"momentum\":0.5", "\"momentum\":1", STRATA_EPROTO, "train.momentum: 1 is not in [0, 1)"},
        {"\"weight_decay\":0.0", "\"weight_decay\":-1e-9", STRATA_EPROTO, "train.weight_decay"},
        {"\"prox_mu\":0.0", "\"prox_mu\":-1", STRATA_EPROTO, "train.prox_mu"},
        {"\"max_steps\":0", "\"max_steps\":-1", STRATA_EPROTO, "train.max_steps"},
        {"\"seed\":123456", "\"seed\":9007199254740992", STRATA_EPROTO, "task.seed"},
        /* missing, unknown and duplicate keys */
        {",\"seed\":123456", "", STRATA_EPROTO, "task.seed: missing"},
        {"\"round\":3,", "", STRATA_EPROTO, "task.round: missing"},
        {",\"values\":\"fp16\"}", "}", STRATA_EPROTO, "budgets[0].values: missing"},
        {"\"error_candidates\":[],", "", STRATA_EPROTO, "task.error_candidates: missing"},
        {",\"train\":{\"epochs\":2,\"batch\":32,\"lr\":0.5,\"momentum\":0.5,\"weight_decay\":0.0,"
         "\"prox_mu\":0.0,\"max_steps\":0}",
         "", STRATA_EPROTO, "task.train: missing"},
        {"\"budgets\":[{\"layer\":\"fc1.weight\",\"compressor\":\"topk\",\"density\":0.25,"
         "\"levels\":0,\"rank\":0,\"values\":\"fp16\"},{\"layer\":\"fc1.bias\",\"compressor\":"
         "\"none\","
         "\"density\":1.0,\"levels\":0,\"rank\":0,\"values\":\"fp16\"}],",
         "", STRATA_EPROTO, "task.budgets: missing"},
        {"\"layer\":\"fc1.weight\",", "", STRATA_EPROTO, "budgets[0].layer: missing"},
        {"\"compressor\":\"none\",", "", STRATA_EPROTO, "budgets[1].compressor: missing"},
        {"\"density\":0.25,", "", STRATA_EPROTO, "budgets[0].density: missing"},
        {",\"max_steps\":0", "", STRATA_EPROTO, "train.max_steps: missing"},
        {"\"seed\":123456", "\"seed\":123456,\"extra\":1", STRATA_EPROTO,
         "task: unknown key \"extra\""},
        {"\"seed\":123456", "\"seed\":123456,\"bad\\u0001key\":1", STRATA_EPROTO,
         "task: unknown key \"bad?key\""},
        {"\"values\":\"fp16\"}]", "\"values\":\"fp16\",\"bits\":8}]", STRATA_EPROTO,
         "budgets[1]: unknown key \"bits\""},
        {"\"max_steps\":0", "\"max_steps\":0,\"nesterov\":true", STRATA_EPROTO,
         "train: unknown key \"nesterov\""},
        {"\"seed\":123456", "\"seed\":123456,\"seed\":1", STRATA_EPROTO, "duplicate object key"},
        {"\"lr\":0.5", "\"lr\":0.5,\"lr\":0.5", STRATA_EPROTO, "duplicate object key"},
        /* not JSON, non-finite numbers, nesting */
        {"\"lr\":0.5", "\"lr\":NaN", STRATA_EPROTO, "invalid JSON"},
        {"\"lr\":0.5", "\"lr\":Infinity", STRATA_EPROTO, "invalid JSON"},
        {"\"lr\":0.5", "\"lr\":1e999", STRATA_EPROTO, "invalid JSON"},
        {"\"round\":3", "\"round\":99999999999999999999", STRATA_EPROTO, "invalid JSON"},
        {"\"seed\":123456", "\"seed\":[[[[1]]]]", STRATA_EPROTO, "nesting deeper than 3"},
        {"\"seed\":123456", "\"seed\":{\"a\":{}}", STRATA_EPROTO, "task.seed: expected an integer"},
        {"\"seed\":123456", "\"seed\":{\"a\":{\"b\":{}}}", STRATA_EPROTO, "nesting deeper than 3"},
        {"\"seed\":123456}", "\"seed\":123456}x", STRATA_EPROTO, "invalid JSON"},
        {"\"seed\":123456}", "\"seed\":123456}{}", STRATA_EPROTO, "invalid JSON"},
        {"{\"round\"", "[{\"round\"", STRATA_EPROTO, "nesting deeper than 3"},
        {"{\"round\"", "\"{\"round\"", STRATA_EPROTO, "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *s = mutate(cases[i].from, cases[i].to);
        strata_task t;
        memset(&t, 0xab, sizeof(t));
        strata_diag d;
        int rc = strata_task_decode(s, strlen(s), NULL, &t, &d);
        if (rc != cases[i].rc || strstr(d.msg, cases[i].msg) == NULL)
            fprintf(stderr, "\ncase %zu (%s): rc %d, diag \"%s\"\n", i, cases[i].to, rc, d.msg);
        CU_ASSERT_EQUAL(rc, cases[i].rc);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, cases[i].msg));
        CU_ASSERT_EQUAL(t.num_layers, 0);
        CU_ASSERT_PTR_NULL(t.budgets);
        CU_ASSERT_PTR_NULL(t.layer_names);
        free(s);
    }
}

static void test_bytes_and_limits(void)
{
    strata_task t;
    strata_diag d;
    size_t n = strlen(BASE);
    /* Truncated at every length. */
    for (size_t k = 0; k < n; k++) {
        CU_ASSERT_EQUAL(strata_task_decode(BASE, k, NULL, &t, &d), STRATA_EPROTO);
        CU_ASSERT(d.msg[0] != '\0');
    }
    /* A NUL byte inside the text. */
    char *s = malloc(n + 1);
    memcpy(s, BASE, n + 1);
    s[20] = '\0';
    CU_ASSERT_EQUAL(strata_task_decode(s, n, NULL, &t, &d), STRATA_EPROTO);
    free(s);
    CU_ASSERT_EQUAL(strata_task_decode("", 0, NULL, &t, &d), STRATA_EPROTO);
    CU_ASSERT_EQUAL(strata_task_decode(NULL, 0, NULL, &t, &d), STRATA_EPROTO);
    CU_ASSERT_EQUAL(strata_task_decode("[]", 2, NULL, &t, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "task: expected a JSON object"));
    CU_ASSERT_EQUAL(strata_task_decode(NULL, 5, NULL, &t, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_task_decode(BASE, n, NULL, NULL, &d), STRATA_EINVAL);

    /* Limits: size before parsing, layer count before allocation, names. */
    strata_task_limits lim = {.max_bytes = n - 1};
    CU_ASSERT_EQUAL(strata_task_decode(BASE, n, &lim, &t, &d), STRATA_ETOOBIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "above the limit"));
    lim.max_bytes = n;
    CU_ASSERT_EQUAL(strata_task_decode(BASE, n, &lim, &t, &d), STRATA_OK);
    strata_task_cleanup(&t);
    strata_task_limits one = {.max_layers = 1};
    CU_ASSERT_EQUAL(strata_task_decode(BASE, n, &one, &t, &d), STRATA_ETOOBIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "task.budgets: 2 entries, above the limit of 1"));
    CU_ASSERT_PTR_NULL(t.budgets);
    strata_task_limits names = {.max_name_bytes = 8};
    CU_ASSERT_EQUAL(strata_task_decode(BASE, n, &names, &t, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "budgets[0].layer: 10 bytes, expected 1 to 8"));
    /* The default name limit is the tensor name limit. */
    char *longer =
        mutate("\"fc1.bias\"", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                               "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                               "aaaaaaaaaaaaaaaa\"");
    CU_ASSERT_EQUAL(strata_task_decode(longer, strlen(longer), NULL, &t, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "budgets[1].layer: 128 bytes"));
    free(longer);
}

static void test_encode_refusals(void)
{
    strata_budget b[2];
    strata_task good = sample_task(b);
    char *json = (char *)&json;
    size_t len = 7;
    strata_diag d;
    CU_ASSERT_EQUAL(strata_task_encode(NULL, &json, &len, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(json);
    CU_ASSERT_EQUAL(len, 0);
    CU_ASSERT_EQUAL(strata_task_encode(&good, NULL, &len, &d), STRATA_EINVAL);

    static const struct {
        int field;
        const char *msg;
    } cases[] = {
        {0, "total_rounds"},
        {1, "budgets[0]: unknown values format"},
        {2, "budgets[0].density"},
        {3, "budgets[1].compressor"},
        {4, "budgets[0]: qsgd levels"},
        {5, "train.epochs"},
        {6, "train.lr"},
        {7, "train.momentum"},
        {8, "seed"},
        {9, "budgets: NULL"},
        {10, "budgets[1].layer"},
        {11, "deadline_unix_ms"},
        {12, "train.prox_mu"},
        {13, "model_version"},
        {14, "train.max_steps"},
    };
    static char *bad_names[] = {"fc1.weight", "tab\there"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        strata_budget bb[2];
        strata_task t = sample_task(bb);
        switch (cases[i].field) {
        case 0:
            t.total_rounds = 0;
            break;
        case 1:
            bb[0].values = (strata_values_format)9;
            break;
        case 2:
            bb[0].density = NAN;
            break;
        case 3:
            bb[1].comp = (strata_compressor_id)8;
            break;
        case 4:
            bb[0].comp = STRATA_COMP_QSGD;
            break;
        case 5:
            t.train.epochs = 0;
            break;
        case 6:
            t.train.lr = INFINITY;
            break;
        case 7:
            t.train.momentum = 1.0;
            break;
        case 8:
            t.seed = 1ULL << 53;
            break;
        case 9:
            t.layer_names = NULL;
            break;
        case 10:
            t.layer_names = bad_names;
            break;
        case 11:
            t.deadline_unix_ms = -1;
            break;
        case 12:
            t.train.prox_mu = NAN;
            break;
        case 13:
            t.model_version = UINT64_MAX;
            break;
        case 14:
            t.train.max_steps = UINT64_MAX;
            break;
        }
        int rc = strata_task_encode(&t, &json, &len, &d);
        if (rc != STRATA_EINVAL || strstr(d.msg, cases[i].msg) == NULL)
            fprintf(stderr, "\nencode case %zu: rc %d, diag \"%s\"\n", i, rc, d.msg);
        CU_ASSERT_EQUAL(rc, STRATA_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, cases[i].msg));
        CU_ASSERT_PTR_NULL(json);
    }
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"exact text", test_exact_text},
        {"same text as the legacy format string", test_matches_legacy_format},
        {"round trip of every field and range extremes", test_round_trip_every_field},
        {"refusals: types, ranges, keys, JSON", test_refusals},
        {"truncation, NUL, limits", test_bytes_and_limits},
        {"encoder refuses what the decoder would", test_encode_refusals},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"task", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
