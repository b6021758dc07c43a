/* Unit tests of the round summary JSON codec (strata/summary.h): the
 * coordinator's forms byte for byte (quarantined updates and failed rounds
 * included), non-finite metrics and norms, round trips and table-driven
 * refusals. */
#include "strata/summary.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *NAMES[] = {"fc1.weight", "fc1.bias"};
static double DENS[] = {0.0089, 1.0};

static strata_round_summary closed_summary(void)
{
    strata_round_summary s = {.round = 3,
                              .state = STRATA_ROUND_CLOSED,
                              .model_version = 3,
                              .selected = 10,
                              .participants = 9,
                              .has_stats = 1,
                              .accuracy = 0.7712,
                              .loss = 0.65,
                              .uplink_bytes = 123456,
                              .downlink_bytes = 7890123,
                              .dense_uplink_bytes = 7968400,
                              .duration_ms = 1234,
                              .has_densities = 1,
                              .num_layers = 2,
                              .layer_names = NAMES,
                              .densities = DENS};
    return s;
}

static char *dump(json_t *j)
{
    char *t = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    return t;
}

static json_t *legacy_densities(void)
{
    json_t *o = json_object();
    for (size_t i = 0; i < 2; i++)
        json_object_set_new(o, NAMES[i], json_real(DENS[i]));
    return o;
}

static char *encode(const strata_round_summary *s)
{
    char *json = NULL;
    size_t len = 0;
    strata_diag d;
    int rc = strata_round_summary_encode(s, &json, &len, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "\nencode: %s\n", d.msg);
    CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
    CU_ASSERT_EQUAL(len, strlen(json));
    return json;
}

static int same_double(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

static void assert_same(const strata_round_summary *a, const strata_round_summary *b)
{
    CU_ASSERT_EQUAL(a->round, b->round);
    CU_ASSERT_EQUAL(a->state, b->state);
    CU_ASSERT_EQUAL(a->model_version, b->model_version);
    CU_ASSERT_EQUAL(a->selected, b->selected);
    CU_ASSERT_EQUAL(a->participants, b->participants);
    CU_ASSERT_EQUAL(a->has_stats, b->has_stats);
    if (a->has_stats) {
        CU_ASSERT(same_double(a->accuracy, b->accuracy));
        CU_ASSERT(same_double(a->loss, b->loss));
        CU_ASSERT_EQUAL(a->uplink_bytes, b->uplink_bytes);
        CU_ASSERT_EQUAL(a->downlink_bytes, b->downlink_bytes);
        CU_ASSERT_EQUAL(a->dense_uplink_bytes, b->dense_uplink_bytes);
        CU_ASSERT_EQUAL(a->duration_ms, b->duration_ms);
        CU_ASSERT_EQUAL(a->eval_samples, b->eval_samples);
    }
    CU_ASSERT_EQUAL(a->has_densities, b->has_densities);
    if (!a->has_densities)
        CU_ASSERT_EQUAL(b->num_layers, 0);
    CU_ASSERT_EQUAL_FATAL(a->has_densities ? a->num_layers : 0, b->num_layers);
    for (size_t i = 0; i < b->num_layers; i++) {
        CU_ASSERT_STRING_EQUAL(a->layer_names[i], b->layer_names[i]);
        CU_ASSERT_EQUAL(a->densities[i], b->densities[i]);
    }
    CU_ASSERT_EQUAL_FATAL(a->num_quarantined, b->num_quarantined);
    for (size_t i = 0; i < b->num_quarantined; i++) {
        CU_ASSERT_EQUAL(a->quarantined[i].client_id, b->quarantined[i].client_id);
        CU_ASSERT_EQUAL(a->quarantined[i].reason, b->quarantined[i].reason);
        CU_ASSERT(same_double(a->quarantined[i].norm, b->quarantined[i].norm));
    }
    CU_ASSERT_EQUAL(a->failed, b->failed);
    CU_ASSERT_EQUAL(a->stopped, b->stopped);
    CU_ASSERT_EQUAL(a->recovered, b->recovered);
}

static void round_trip(const strata_round_summary *s)
{
    char *json = encode(s);
    strata_round_summary back;
    strata_diag d;
    CU_ASSERT_EQUAL_FATAL(strata_round_summary_decode(json, strlen(json), NULL, &back, &d),
                          STRATA_OK);
    assert_same(s, &back);
    strata_round_summary_cleanup(&back);
    CU_ASSERT_PTR_NULL(back.layer_names);
    free(json);
}

/* Adds the derived traffic keys the encoder writes after the stats (the
 * dense downlink, totals and ratios of 123456 up, 7890123 down, 7968400
 * dense up). */
static json_t *with_derived(json_t *v, json_t *after)
{
    const double up = 123456, down = 7890123, dense = 7968400;
    json_t *o = json_object();
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        json_object_set(o, key, val);
        if (strcmp(key, "duration_ms") == 0) {
            json_object_set_new(o, "dense_downlink_bytes", json_integer(7968400));
            json_object_set_new(o, "total_bytes", json_integer(123456 + 7890123));
            json_object_set_new(o, "dense_total_bytes", json_integer(2 * 7968400));
            json_object_set_new(o, "uplink_ratio", json_real(dense / up));
            json_object_set_new(o, "downlink_ratio", json_real(dense / down));
            json_object_set_new(o, "total_ratio", json_real(2 * dense / (up + down)));
        }
    }
    if (after != NULL)
        json_object_set_new(o, "densities", after);
    json_decref(v);
    return o;
}

/* The four forms the coordinator wrote with its own format strings before
 * the codec existed: the same keys, order and number spelling, with the
 * derived traffic keys after the stats. */
static void test_legacy_forms(void)
{
    strata_round_summary s = closed_summary();
    char *want = dump(with_derived(
        json_pack("{s:I,s:s,s:I,s:I,s:I,s:f,s:f,s:I,s:I,s:I,s:I}", "round", (json_int_t)3, "state",
                  "closed", "model_version", (json_int_t)3, "selected", (json_int_t)10,
                  "participants", (json_int_t)9, "accuracy", 0.7712, "loss", 0.65, "uplink_bytes",
                  (json_int_t)123456, "downlink_bytes", (json_int_t)7890123, "dense_uplink_bytes",
                  (json_int_t)7968400, "duration_ms", (json_int_t)1234),
        legacy_densities()));
    char *got = encode(&s);
    CU_ASSERT_STRING_EQUAL(got, want);
    free(got);
    free(want);
    round_trip(&s);

    strata_round_summary stop = {.round = 4,
                                 .state = STRATA_ROUND_CLOSED,
                                 .model_version = 4,
                                 .selected = 10,
                                 .participants = 2,
                                 .stopped = 1};
    want = dump(json_pack("{s:I,s:s,s:I,s:I,s:I,s:b}", "round", (json_int_t)4, "state", "closed",
                          "model_version", (json_int_t)4, "selected", (json_int_t)10,
                          "participants", (json_int_t)2, "stopped", 1));
    got = encode(&stop);
    CU_ASSERT_STRING_EQUAL(got, want);
    CU_ASSERT_STRING_EQUAL(got, "{\"round\":4,\"state\":\"closed\",\"model_version\":4,"
                                "\"selected\":10,\"participants\":2,\"stopped\":true}");
    free(got);
    free(want);
    round_trip(&stop);

    strata_round_summary rec = stop;
    rec.stopped = 0;
    rec.recovered = 1;
    want = dump(json_pack("{s:I,s:s,s:I,s:I,s:I,s:b}", "round", (json_int_t)4, "state", "closed",
                          "model_version", (json_int_t)4, "selected", (json_int_t)10,
                          "participants", (json_int_t)2, "recovered", 1));
    got = encode(&rec);
    CU_ASSERT_STRING_EQUAL(got, want);
    free(got);
    free(want);
    round_trip(&rec);

    /* The view of a round without a stored summary: the open round with its
     * densities, and a closed one without. */
    strata_round_summary view = closed_summary();
    view.state = STRATA_ROUND_OPEN;
    view.accuracy = NAN;
    view.loss = NAN;
    json_t *v =
        json_pack("{s:I,s:s,s:I,s:I,s:I,s:n,s:n,s:I,s:I,s:I,s:I}", "round", (json_int_t)3, "state",
                  "open", "model_version", (json_int_t)3, "selected", (json_int_t)10,
                  "participants", (json_int_t)9, "accuracy", "loss", "uplink_bytes",
                  (json_int_t)123456, "downlink_bytes", (json_int_t)7890123, "dense_uplink_bytes",
                  (json_int_t)7968400, "duration_ms", (json_int_t)1234);
    want = dump(with_derived(v, legacy_densities()));
    got = encode(&view);
    CU_ASSERT_STRING_EQUAL(got, want);
    free(got);
    free(want);
    round_trip(&view);
    view.state = STRATA_ROUND_CLOSED;
    view.has_densities = 0;
    got = encode(&view);
    want = dump(with_derived(
        json_pack("{s:I,s:s,s:I,s:I,s:I,s:n,s:n,s:I,s:I,s:I,s:I}", "round", (json_int_t)3, "state",
                  "closed", "model_version", (json_int_t)3, "selected", (json_int_t)10,
                  "participants", (json_int_t)9, "accuracy", "loss", "uplink_bytes",
                  (json_int_t)123456, "downlink_bytes", (json_int_t)7890123, "dense_uplink_bytes",
                  (json_int_t)7968400, "duration_ms", (json_int_t)1234),
        NULL));
    CU_ASSERT_STRING_EQUAL(got, want);
    free(got);
    free(want);
    round_trip(&view);
}

/* eval_samples: written after "loss" when the round was evaluated, absent
 * for 0; read back; 0, a negative count and a count without the stats are
 * refused by the decoder, a count without the stats by the encoder. */
static void test_eval_samples(void)
{
    strata_round_summary s = closed_summary();
    s.eval_samples = 500;
    char *json = encode(&s);
    CU_ASSERT_PTR_NOT_NULL(strstr(json, ",\"eval_samples\":500,\"uplink_bytes\":"));
    free(json);
    round_trip(&s);
    s.eval_samples = 0;
    json = encode(&s);
    CU_ASSERT_PTR_NULL(strstr(json, "eval_samples"));
    free(json);
    round_trip(&s);
    /* The encoder refuses what the decoder would: a count without stats. */
    s.has_stats = 0;
    s.eval_samples = 5;
    json = (char *)&json;
    size_t len = 1;
    strata_diag ed;
    CU_ASSERT_EQUAL(strata_round_summary_encode(&s, &json, &len, &ed), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(json);
    CU_ASSERT_PTR_NOT_NULL(strstr(ed.msg, "eval_samples: without the round statistics"));

    static const char *bad[] = {
        "{\"round\":1,\"state\":\"closed\",\"model_version\":1,\"selected\":2,"
        "\"participants\":2,\"accuracy\":0.5,\"loss\":0.25,\"eval_samples\":0,"
        "\"uplink_bytes\":1,\"downlink_bytes\":2,\"dense_uplink_bytes\":3,\"duration_ms\":4}",
        "{\"round\":1,\"state\":\"closed\",\"model_version\":1,\"selected\":2,"
        "\"participants\":2,\"accuracy\":0.5,\"loss\":0.25,\"eval_samples\":-5,"
        "\"uplink_bytes\":1,\"downlink_bytes\":2,\"dense_uplink_bytes\":3,\"duration_ms\":4}",
        "{\"round\":1,\"state\":\"closed\",\"model_version\":1,\"selected\":2,"
        "\"participants\":2,\"eval_samples\":100}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        strata_round_summary back;
        strata_diag d;
        CU_ASSERT_EQUAL(strata_round_summary_decode(bad[i], strlen(bad[i]), NULL, &back, &d),
                        STRATA_EPROTO);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "summary.eval_samples"));
    }
}

static void test_non_finite(void)
{
    strata_round_summary s = closed_summary();
    const double bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 3; i++) {
        s.accuracy = bad[i];
        s.loss = bad[2 - i];
        char *json = encode(&s);
        strata_round_summary back;
        strata_diag d;
        CU_ASSERT_EQUAL_FATAL(strata_round_summary_decode(json, strlen(json), NULL, &back, &d),
                              STRATA_OK);
        CU_ASSERT(isnan(back.accuracy));
        CU_ASSERT(isnan(back.loss));
        CU_ASSERT_EQUAL(back.has_stats, 1);
        CU_ASSERT_EQUAL(back.num_layers, 2);
        strata_round_summary_cleanup(&back);
        free(json);
    }
    /* A stopped flag is a field, and false is the same as absent. */
    const char *f = "{\"round\":1,\"state\":\"closed\",\"model_version\":1,\"selected\":1,"
                    "\"participants\":0,\"stopped\":false,\"recovered\":true}";
    strata_round_summary back;
    CU_ASSERT_EQUAL_FATAL(strata_round_summary_decode(f, strlen(f), NULL, &back, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(back.stopped, 0);
    CU_ASSERT_EQUAL(back.recovered, 1);
    CU_ASSERT_EQUAL(back.has_stats, 0);
    CU_ASSERT_TRUE(isnan(back.accuracy)); /* not evaluated: unknown, not 0 */
    CU_ASSERT_TRUE(isnan(back.loss));
    CU_ASSERT_EQUAL(back.has_densities, 0);
    strata_round_summary_cleanup(&back);
    strata_round_summary_cleanup(NULL);

    /* Extremes and an empty densities object. */
    strata_round_summary e = {.round = UINT32_MAX,
                              .state = STRATA_ROUND_OPEN,
                              .model_version = INT64_MAX,
                              .selected = INT64_MAX,
                              .participants = INT64_MAX,
                              .has_stats = 1,
                              .accuracy = -1e308,
                              .loss = 4.9e-324,
                              .uplink_bytes = INT64_MAX,
                              .downlink_bytes = 0,
                              .dense_uplink_bytes = INT64_MAX,
                              .duration_ms = 0,
                              .has_densities = 1,
                              .stopped = 1,
                              .recovered = 1};
    round_trip(&e);
}

/* A round with quarantined updates, and a failed one: the keys after the
 * densities, in order; a non-finite norm is null and reads back as NaN. */
static void test_quarantined_failed(void)
{
    strata_round_quarantine q[] = {
        {.client_id = 3, .reason = STRATA_QUARANTINE_NORM, .norm = 1e22},
        {.client_id = 9, .reason = STRATA_QUARANTINE_NON_FINITE, .norm = INFINITY}};
    strata_round_summary s = closed_summary();
    s.num_quarantined = 2;
    s.quarantined = q;
    char *got = encode(&s);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(got, "\"fc1.bias\":1.0},\"quarantined\":[{\"client_id\":3,\"reason\":\"norm\","
                    "\"norm\":1e22},{\"client_id\":9,\"reason\":\"non_finite\",\"norm\":null}]}"));
    free(got);
    strata_round_summary back;
    got = encode(&s);
    CU_ASSERT_EQUAL_FATAL(strata_round_summary_decode(got, strlen(got), NULL, &back, NULL),
                          STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(back.num_quarantined, 2);
    CU_ASSERT_EQUAL(back.quarantined[0].client_id, 3);
    CU_ASSERT_EQUAL(back.quarantined[0].norm, 1e22);
    CU_ASSERT_EQUAL(back.quarantined[1].reason, STRATA_QUARANTINE_NON_FINITE);
    CU_ASSERT(isnan(back.quarantined[1].norm));
    strata_round_summary_cleanup(&back);
    CU_ASSERT_PTR_NULL(back.quarantined);
    CU_ASSERT_EQUAL(back.num_quarantined, 0);
    free(got);
    q[1].norm = NAN;
    round_trip(&s);

    /* Failed: the model stayed; accuracy and loss null, the reason named. */
    s.failed = STRATA_ROUND_FAILED_LOSS;
    s.accuracy = NAN;
    s.loss = INFINITY;
    got = encode(&s);
    CU_ASSERT_PTR_NOT_NULL(strstr(got, "\"accuracy\":null,\"loss\":null,"));
    CU_ASSERT_PTR_NOT_NULL(strstr(got, "\"norm\":null}],\"failed\":\"loss_not_finite\"}"));
    free(got);
    s.loss = NAN;
    round_trip(&s);
    s.num_quarantined = 0;
    s.quarantined = NULL;
    for (int f = STRATA_ROUND_FAILED_AGGREGATE; f <= STRATA_ROUND_FAILED_TOO_FEW; f++) {
        s.failed = (strata_round_failure)f;
        got = encode(&s);
        char want[64];
        snprintf(want, sizeof(want), "\"failed\":\"%s\"}",
                 strata_round_failure_name((strata_round_failure)f));
        CU_ASSERT_PTR_NOT_NULL(strstr(got, want));
        free(got);
        round_trip(&s);
    }
    CU_ASSERT_STRING_EQUAL(strata_round_failure_name(STRATA_ROUND_FAILED_MODEL),
                           "model_not_finite");
    CU_ASSERT_STRING_EQUAL(strata_round_failure_name((strata_round_failure)9), "?");
    CU_ASSERT_STRING_EQUAL(strata_quarantine_reason_name(STRATA_QUARANTINE_NON_FINITE),
                           "non_finite");
    CU_ASSERT_STRING_EQUAL(strata_quarantine_reason_name((strata_quarantine_reason)5), "?");

    /* An empty array is the same as no key. */
    const char *e = "{\"round\":1,\"state\":\"closed\",\"model_version\":1,\"selected\":1,"
                    "\"participants\":0,\"quarantined\":[]}";
    CU_ASSERT_EQUAL_FATAL(strata_round_summary_decode(e, strlen(e), NULL, &back, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(back.num_quarantined, 0);
    CU_ASSERT_PTR_NULL(back.quarantined);
    strata_round_summary_cleanup(&back);
}

static const char BASE[] =
    "{\"round\":3,\"state\":\"closed\",\"model_version\":3,\"selected\":10,\"participants\":9,"
    "\"accuracy\":0.5,\"loss\":0.25,\"uplink_bytes\":100,\"downlink_bytes\":200,"
    "\"dense_uplink_bytes\":300,\"duration_ms\":1234,\"densities\":{\"fc1.weight\":0.5,"
    "\"fc1.bias\":1.0},\"quarantined\":[{\"client_id\":4,\"reason\":\"norm\",\"norm\":1e9},"
    "{\"client_id\":7,\"reason\":\"non_finite\",\"norm\":null}],\"failed\":\"loss_not_finite\"}";

/* BASE with the first occurrence of from replaced by to (malloc'ed): the
 * inputs of the refusal table are built as edits of the valid text. */
static char *mutate(const char *from, const char *to)
{
    const char *at = NULL;
    size_t nf = strlen(from);
    for (size_t i = 0; at == NULL && i + nf <= sizeof(BASE) - 1; i++)
        if (memcmp(BASE + i, from, nf) == 0)
            at = BASE + i;
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
    strata_round_summary ok;
    CU_ASSERT_EQUAL_FATAL(strata_round_summary_decode(BASE, strlen(BASE), NULL, &ok, NULL),
                          STRATA_OK);
    CU_ASSERT_STRING_EQUAL(ok.layer_names[1], "fc1.bias");
    CU_ASSERT_EQUAL(ok.densities[0], 0.5);
    CU_ASSERT_EQUAL(ok.num_quarantined, 2);
    CU_ASSERT_EQUAL(ok.quarantined[1].client_id, 7);
    CU_ASSERT_EQUAL(ok.failed, STRATA_ROUND_FAILED_LOSS);
    strata_round_summary_cleanup(&ok);

    static const struct {
        const char *from, *to;
        int rc;
        const char *msg;
    } cases[] = {
        {"\"round\":3", "\"round\":3.0", STRATA_EPROTO, "summary.round: expected an integer"},
        {"\"round\":3", "\"round\":-3", STRATA_EPROTO, "summary.round: -3 is not in"},
        {"\"round\":3", "\"round\":4294967296", STRATA_EPROTO, "summary.round"},
        {"\"state\":\"closed\"", "\"state\":\"done\"", STRATA_EPROTO,
         "summary.state: expected \"open\" or \"closed\""},
        {"\"state\":\"closed\"", "\"state\":1", STRATA_EPROTO, "summary.state"},
        {"\"selected\":10", "\"selected\":0", STRATA_EPROTO, "summary.selected"},
        {"\"participants\":9", "\"participants\":\"9\"", STRATA_EPROTO,
         "summary.participants: expected an integer"},
        {"\"model_version\":3", "\"model_version\":-1", STRATA_EPROTO, "summary.model_version"},
        {"\"accuracy\":0.5", "\"accuracy\":\"high\"", STRATA_EPROTO,
         "summary.accuracy: expected a number"},
        {"\"loss\":0.25", "\"loss\":true", STRATA_EPROTO, "summary.loss: expected a number"},
        {"\"uplink_bytes\":100", "\"uplink_bytes\":-100", STRATA_EPROTO, "summary.uplink_bytes"},
        {"\"duration_ms\":1234", "\"duration_ms\":-1", STRATA_EPROTO, "summary.duration_ms"},
        {"\"duration_ms\":1234", "\"duration_ms\":null", STRATA_EPROTO, "summary.duration_ms"},
        {"\"densities\":{\"fc1.weight\":0.5,\"fc1.bias\":1.0}", "\"densities\":[{\"a\":1}]",
         STRATA_EPROTO, "summary.densities: expected an object"},
        {"\"densities\":{", "\"densities\":[[{", STRATA_EPROTO, "nesting deeper than 3"},
        {"\"densities\":{\"fc1.weight\":0.5,\"fc1.bias\":1.0}", "\"densities\":[]", STRATA_EPROTO,
         "summary.densities: expected an object"},
        {"\"fc1.weight\":0.5", "\"fc1.weight\":0", STRATA_EPROTO,
         "summary.densities.fc1.weight: 0 is not in (0, 1]"},
        {"\"fc1.bias\":1.0", "\"fc1.bias\":1.5", STRATA_EPROTO, "summary.densities.fc1.bias"},
        {"\"fc1.bias\":1.0", "\"fc1.bias\":null", STRATA_EPROTO, "expected a number"},
        {"\"fc1.bias\":1.0", "\"\":1.0", STRATA_EPROTO, "summary.densities key 1: 0 bytes"},
        {"\"fc1.bias\":1.0", "\"a\\tb\":1.0", STRATA_EPROTO, "control character 0x09"},
        {",\"loss\":0.25", "", STRATA_EPROTO,
         "summary.loss: missing (the round statistics come together)"},
        {"\"round\":3,", "", STRATA_EPROTO, "summary.round: missing"},
        {"\"state\":\"closed\",", "", STRATA_EPROTO, "summary.state: missing"},
        {"\"selected\":10,", "", STRATA_EPROTO, "summary.selected: missing"},
        {"\"round\":3", "\"round\":3,\"extra\":0", STRATA_EPROTO, "summary: unknown key \"extra\""},
        {"\"round\":3", "\"round\":3,\"round\":3", STRATA_EPROTO, "duplicate object key"},
        {"\"fc1.bias\":1.0", "\"fc1.weight\":1.0", STRATA_EPROTO, "duplicate object key"},
        {"\"round\":3", "\"round\":3,\"stopped\":1", STRATA_EPROTO,
         "summary.stopped: expected true or false"},
        {"\"round\":3", "\"round\":3,\"recovered\":\"yes\"", STRATA_EPROTO, "summary.recovered"},
        {"\"accuracy\":0.5", "\"accuracy\":NaN", STRATA_EPROTO, "invalid JSON"},
        {"\"loss\":0.25", "\"loss\":-Infinity", STRATA_EPROTO, "invalid JSON"},
        {"\"loss\":0.25", "\"loss\":1e400", STRATA_EPROTO, "invalid JSON"},
        {"finite\"}", "finite\"}]", STRATA_EPROTO, "invalid JSON"},
        {"finite\"}", "finite\"", STRATA_EPROTO, "invalid JSON"},
        {"\"round\":3", "\"round\":[[[3]]]", STRATA_EPROTO, "nesting deeper than 3"},
        {"\"round\":3", "\"round\":[[3]]", STRATA_EPROTO, "summary.round: expected an integer"},
        /* quarantined and failed */
        {"\"failed\":\"loss_not_finite\"", "\"failed\":\"loss_not_finite\",\"quarantined\":{}",
         STRATA_EPROTO, "duplicate object key"},
        {"\"quarantined\":[{\"client_id\":4,\"reason\":\"norm\",\"norm\":1e9},{\"client_id\":7,"
         "\"reason\":\"non_finite\",\"norm\":null}]",
         "\"quarantined\":{}", STRATA_EPROTO, "summary.quarantined: expected an array"},
        {"{\"client_id\":4", "4,{\"client_id\":4", STRATA_EPROTO,
         "summary.quarantined[0]: expected an object"},
        {"\"client_id\":4", "\"client_id\":0", STRATA_EPROTO,
         "summary.quarantined[0].client_id: 0 is not in [1, "},
        {"\"client_id\":4", "\"client_id\":\"4\"", STRATA_EPROTO,
         "summary.quarantined[0].client_id: expected an integer"},
        {"\"client_id\":7", "\"client_id\":4", STRATA_EPROTO,
         "summary.quarantined[1].client_id: 4 does not ascend (after 4)"},
        {"\"client_id\":7", "\"client_id\":3", STRATA_EPROTO, "does not ascend"},
        {"\"reason\":\"norm\"", "\"reason\":\"big\"", STRATA_EPROTO,
         "summary.quarantined[0].reason: expected \"norm\" or \"non_finite\""},
        {"\"reason\":\"norm\"", "\"reason\":1", STRATA_EPROTO, "quarantined[0].reason"},
        {"\"norm\":1e9", "\"norm\":-1", STRATA_EPROTO,
         "summary.quarantined[0].norm: -1 is not in [0, "},
        {"\"norm\":1e9", "\"norm\":\"x\"", STRATA_EPROTO,
         "summary.quarantined[0].norm: expected a number"},
        {",\"norm\":null", "", STRATA_EPROTO, "summary.quarantined[1].norm: missing"},
        {"\"client_id\":4,", "", STRATA_EPROTO, "summary.quarantined[0].client_id: missing"},
        {"\"norm\":1e9", "\"norm\":1e9,\"why\":1", STRATA_EPROTO,
         "summary.quarantined[0]: unknown key \"why\""},
        {"\"norm\":1e9", "\"norm\":1e9,\"norm\":1", STRATA_EPROTO, "duplicate object key"},
        {"\"participants\":9", "\"participants\":1", STRATA_EPROTO,
         "summary.quarantined: 2 entries, more than the 1 participants"},
        {"\"failed\":\"loss_not_finite\"", "\"failed\":\"oops\"", STRATA_EPROTO,
         "summary.failed: expected \"aggregate_not_finite\""},
        {"\"failed\":\"loss_not_finite\"", "\"failed\":true", STRATA_EPROTO, "summary.failed"},
        {"\"failed\":\"loss_not_finite\"", "\"failed\":\"\"", STRATA_EPROTO, "summary.failed"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *s = mutate(cases[i].from, cases[i].to);
        strata_round_summary out;
        memset(&out, 0x5a, sizeof(out));
        strata_diag d;
        int rc = strata_round_summary_decode(s, strlen(s), NULL, &out, &d);
        if (rc != cases[i].rc || strstr(d.msg, cases[i].msg) == NULL)
            fprintf(stderr, "\ncase %zu (%s): rc %d, diag \"%s\"\n", i, cases[i].to, rc, d.msg);
        CU_ASSERT_EQUAL(rc, cases[i].rc);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, cases[i].msg));
        CU_ASSERT_EQUAL(out.num_layers, 0);
        CU_ASSERT_PTR_NULL(out.layer_names);
        CU_ASSERT_PTR_NULL(out.densities);
        CU_ASSERT_EQUAL(out.num_quarantined, 0);
        CU_ASSERT_PTR_NULL(out.quarantined);
        free(s);
    }

    /* Truncated at every length, limits, arguments. */
    strata_round_summary out;
    strata_diag d;
    size_t n = strlen(BASE);
    for (size_t k = 0; k < n; k++)
        CU_ASSERT_EQUAL(strata_round_summary_decode(BASE, k, NULL, &out, &d), STRATA_EPROTO);
    strata_summary_limits lim = {.max_bytes = n - 1};
    CU_ASSERT_EQUAL(strata_round_summary_decode(BASE, n, &lim, &out, &d), STRATA_ETOOBIG);
    lim = (strata_summary_limits){.max_layers = 1};
    CU_ASSERT_EQUAL(strata_round_summary_decode(BASE, n, &lim, &out, &d), STRATA_ETOOBIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "summary.densities: 2 entries, above the limit of 1"));
    lim = (strata_summary_limits){.max_name_bytes = 9};
    CU_ASSERT_EQUAL(strata_round_summary_decode(BASE, n, &lim, &out, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "key 0: 10 bytes, expected 1 to 9"));
    CU_ASSERT_EQUAL(strata_round_summary_decode("7", 1, NULL, &out, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "summary: invalid JSON"));
    CU_ASSERT_EQUAL(strata_round_summary_decode("[1]", 3, NULL, &out, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "summary: expected a JSON object"));
    CU_ASSERT_EQUAL(strata_round_summary_decode(NULL, 3, NULL, &out, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_round_summary_decode(BASE, n, NULL, NULL, &d), STRATA_EINVAL);
}

static void test_encode_refusals(void)
{
    char *json = (char *)&json;
    size_t len = 3;
    strata_diag d;
    CU_ASSERT_EQUAL(strata_round_summary_encode(NULL, &json, &len, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(json);
    CU_ASSERT_EQUAL(len, 0);
    static char *dup[] = {"a", "a"};
    static char *ctrl[] = {"a", "b\n"};
    static double bad_d[] = {0.5, 0.0};
    static const char *msgs[] = {"state",
                                 "selected",
                                 "model_version",
                                 "duration_ms",
                                 "appears twice",
                                 "control character",
                                 "layer 1: 0 is not in",
                                 "densities: NULL",
                                 "failed: unknown value 5",
                                 "quarantined: NULL array for 1 entries",
                                 "quarantined: 2 entries, more than the 1 participants",
                                 "quarantined[1].client_id: 5 does not ascend (after 5)",
                                 "quarantined[0].client_id: 0 is not in",
                                 "quarantined[1].reason: unknown value 2",
                                 "quarantined[0].norm: -1 is negative"};
    for (int i = 0; i < 15; i++) {
        strata_round_summary s = closed_summary();
        strata_round_quarantine q[2] = {{.client_id = 5, .norm = 1}, {.client_id = 6, .norm = 2}};
        s.num_quarantined = i >= 10 ? 2 : 0;
        s.quarantined = q;
        switch (i) {
        case 0:
            s.state = (strata_round_state)2;
            break;
        case 1:
            s.selected = 0;
            break;
        case 2:
            s.model_version = UINT64_MAX;
            break;
        case 3:
            s.duration_ms = (uint64_t)INT64_MAX + 1;
            break;
        case 4:
            s.layer_names = dup;
            break;
        case 5:
            s.layer_names = ctrl;
            break;
        case 6:
            s.densities = bad_d;
            break;
        case 7:
            s.densities = NULL;
            break;
        case 8:
            s.failed = (strata_round_failure)5;
            break;
        case 9:
            s.num_quarantined = 1;
            s.quarantined = NULL;
            break;
        case 10:
            s.participants = 1;
            break;
        case 11:
            q[1].client_id = 5;
            break;
        case 12:
            q[0].client_id = 0;
            break;
        case 13:
            q[1].reason = (strata_quarantine_reason)2;
            break;
        case 14:
            q[0].norm = -1;
            break;
        }
        int rc = strata_round_summary_encode(&s, &json, &len, &d);
        if (rc != STRATA_EINVAL || strstr(d.msg, msgs[i]) == NULL)
            fprintf(stderr, "\nencode case %d: rc %d, diag \"%s\"\n", i, rc, d.msg);
        CU_ASSERT_EQUAL(rc, STRATA_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, msgs[i]));
        CU_ASSERT_PTR_NULL(json);
    }
    /* Unused groups are not checked: a stopped summary ignores its arrays. */
    strata_round_summary s = closed_summary();
    s.has_densities = 0;
    s.densities = NULL;
    s.has_stats = 0;
    s.duration_ms = UINT64_MAX;
    CU_ASSERT_EQUAL(strata_round_summary_encode(&s, &json, &len, &d), STRATA_OK);
    free(json);
}

/* The round's budgets ("compressors") and an lgreco solve: the exact text,
 * a round trip, and refusals of each part. */
static void test_compressors_lgreco(void)
{
    static char *SPECS[] = {"topk:0.0089:int8", "none"};
    static char *ALLOC[] = {"topk:0.001:fp16", "fp16"};
    strata_round_summary s = closed_summary();
    s.compressors = SPECS;
    s.has_lgreco = 1;
    s.lg_error_budget = 10.5;
    s.lg_chosen_error = 10.25;
    s.lg_bytes = 1702.5;
    s.lg_uniform_bytes = 11959.5;
    s.lg_allocation = ALLOC;
    char *json = encode(&s);
    CU_ASSERT_PTR_NOT_NULL_FATAL(json);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(json, "\"compressors\":{\"fc1.weight\":\"topk:0.0089:int8\",\"fc1.bias\":\"none\"},"
                     "\"lgreco\":{\"fell_back\":false,\"error_budget\":10.5,\"chosen_error\":10.25,"
                     "\"bytes\":1702.5,\"uniform_bytes\":11959.5,\"allocation\":{\"fc1.weight\":"
                     "\"topk:0.001:fp16\",\"fc1.bias\":\"fp16\"}}"));
    strata_round_summary back;
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL_FATAL(strata_round_summary_decode(json, strlen(json), NULL, &back, &d),
                          STRATA_OK);
    CU_ASSERT(back.has_lgreco && !back.lg_fell_back);
    CU_ASSERT_EQUAL(back.lg_chosen_error, 10.25);
    CU_ASSERT_STRING_EQUAL(back.compressors[0], "topk:0.0089:int8");
    CU_ASSERT_STRING_EQUAL(back.lg_allocation[1], "fp16");
    strata_round_summary_cleanup(&back);

    static const struct {
        const char *from, *to, *msg;
    } bad[] = {
        {"\"topk:0.0089:int8\"", "\"topk:2\"", "summary.compressors: layer 0"},
        {"\"fc1.bias\":\"none\"}", "\"fc1.bias\":\"none\",\"x\":\"none\"}",
         "expected the 2 layers"},
        {"\"compressors\":{\"fc1.weight\"", "\"compressors\":{\"fc2.weight\"", "not layer 0"},
        {"\"fell_back\":false", "\"fell_back\":0", "fell_back: expected a boolean"},
        {"\"chosen_error\":10.25", "\"chosen_error\":-1", "summary.lgreco.chosen_error"},
        {"\"bytes\":1702.5,", "", "summary.lgreco.bytes: missing"},
        {"\"fc1.bias\":\"fp16\"}}", "\"fc1.bias\":\"qsgd:0\"}}", "lgreco.allocation: layer 1"},
        {"\"uniform_bytes\":11959.5", "\"uniform_bytes\":1,\"more\":1", "unknown key \"more\""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *at = strstr(json, bad[i].from);
        CU_ASSERT_PTR_NOT_NULL_FATAL(at);
        size_t pre = (size_t)(at - json), nf = strlen(bad[i].from), nt = strlen(bad[i].to);
        char *t = malloc(strlen(json) - nf + nt + 1);
        memcpy(t, json, pre);
        memcpy(t + pre, bad[i].to, nt);
        strcpy(t + pre + nt, at + nf);
        memset(&d, 0, sizeof(d));
        int rc = strata_round_summary_decode(t, strlen(t), NULL, &back, &d);
        CU_ASSERT_EQUAL(rc, STRATA_EPROTO);
        if (strstr(d.msg, bad[i].msg) == NULL)
            fprintf(stderr, "\ncase %zu: %s\n", i, d.msg);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, bad[i].msg));
        free(t);
    }
    free(json);
    /* the encoder refuses what the decoder would */
    char *out = NULL;
    size_t len = 0;
    s.lg_bytes = NAN;
    CU_ASSERT_EQUAL(strata_round_summary_encode(&s, &out, &len, &d), STRATA_EINVAL);
    s.lg_bytes = 1.0;
    s.has_densities = 0;
    CU_ASSERT_EQUAL(strata_round_summary_encode(&s, &out, &len, &d), STRATA_EINVAL);
    s.has_densities = 1;
    ALLOC[0] = "topk";
    CU_ASSERT_EQUAL(strata_round_summary_encode(&s, &out, &len, &d), STRATA_EINVAL);
    ALLOC[0] = "topk:0.001:fp16";
    CU_ASSERT_PTR_NULL(out);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"the coordinator's four forms, byte for byte", test_legacy_forms},
        {"non-finite metrics become null, flags, extremes", test_non_finite},
        {"eval_samples: written when evaluated, checked", test_eval_samples},
        {"quarantined updates and failed rounds", test_quarantined_failed},
        {"refusals: types, ranges, keys, JSON, limits", test_refusals},
        {"encoder refuses what the decoder would", test_encode_refusals},
        {"budgets and lgreco solves", test_compressors_lgreco},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"summary", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
