#include "strata/checkpoint.h"
#include "strata/optim.h"
#include "strata/train.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void one_param(strata_tensor_list *l, float w0)
{
    int64_t s[1] = {1};
    strata_tensor_list_init(l);
    strata_tensor_list_add(l, "w", 1, s, &w0);
}

/* Hand-computed steps of PyTorch's SGD for a constant gradient. */
static void test_sgd_hand_computed(void)
{
    static const struct {
        strata_sgd_config cfg;
        int anchored;
        float expect[3]; /* w after steps 1, 2, 3 from w = 1, grad = 0.5 */
    } cases[] = {
        /* plain: w -= 0.1 * 0.5 */
        {{.lr = 0.1f}, 0, {0.95f, 0.90f, 0.85f}},
        /* momentum 0.9: v = 0.5, 0.95, 1.355 */
        {{.lr = 0.1f, .momentum = 0.9f}, 0, {0.95f, 0.855f, 0.7195f}},
        /* nesterov: g + 0.9 v: 0.95, 1.355, 1.7195 */
        {{.lr = 0.1f, .momentum = 0.9f, .nesterov = 1}, 0, {0.905f, 0.7695f, 0.59755f}},
        /* weight decay 0.1: g = 0.5 + 0.1 w */
        {{.lr = 0.1f, .weight_decay = 0.1f}, 0, {0.94f, 0.8806f, 0.821794f}},
        /* FedProx mu = 1 around anchor 1: g = 0.5 + (w - 1) */
        {{.lr = 0.1f, .prox_mu = 1.0f}, 1, {0.95f, 0.905f, 0.8645f}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        strata_tensor_list p, g, anchor;
        one_param(&p, 1.0f);
        one_param(&g, 0.5f);
        one_param(&anchor, 1.0f);
        strata_sgd *o = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_sgd_new(&p, &cases[i].cfg, &o, NULL), STRATA_OK);
        if (cases[i].anchored)
            strata_sgd_set_anchor(o, &anchor);
        for (int s = 0; s < 3; s++) {
            CU_ASSERT_EQUAL(strata_sgd_step(o, &p, &g), STRATA_OK);
            if (fabsf(p.items[0].data[0] - cases[i].expect[s]) > 1e-6f) {
                fprintf(stderr, "case %zu step %d: %.7f != %.7f\n", i, s, p.items[0].data[0],
                        cases[i].expect[s]);
                CU_FAIL("SGD step differs from the hand-computed value");
            }
        }
        strata_sgd_free(o);
        strata_tensor_list_cleanup(&p);
        strata_tensor_list_cleanup(&g);
        strata_tensor_list_cleanup(&anchor);
    }
}

static void test_sgd_cosine_and_errors(void)
{
    strata_tensor_list p;
    one_param(&p, 1.0f);
    strata_sgd *o = NULL;
    strata_sgd_config cfg = {.lr = 0.2f, .decay_steps = 4};
    CU_ASSERT_EQUAL_FATAL(strata_sgd_new(&p, &cfg, &o, NULL), STRATA_OK);
    const float want[6] = {0.2f, 0.170710678f, 0.1f, 0.029289322f, 0.0f, 0.0f};
    for (int s = 0; s < 6; s++) {
        CU_ASSERT(fabsf(strata_sgd_current_lr(o) - want[s]) < 1e-6f);
        strata_sgd_step(o, &p, &p);
    }
    strata_sgd_reset(o);
    CU_ASSERT(fabsf(strata_sgd_current_lr(o) - 0.2f) < 1e-7f);
    strata_sgd_free(o);

    static const strata_sgd_config bad[] = {
        {.lr = 0.0f},
        {.lr = -1.0f},
        {.lr = 0.1f, .momentum = 1.0f},
        {.lr = 0.1f, .weight_decay = -1.0f},
        {.lr = 0.1f, .prox_mu = -0.5f},
        {.lr = 0.1f, .nesterov = 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        strata_diag d = {{0}};
        o = (strata_sgd *)0x1;
        CU_ASSERT_EQUAL(strata_sgd_new(&p, &bad[i], &o, &d), STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(o);
        CU_ASSERT(d.msg[0] != '\0');
    }
    strata_tensor_list_cleanup(&p);
}

/* A tiny synthetic task: the class is the index of the largest feature. */
static void make_task(strata_dataset *d, size_t n, uint64_t seed)
{
    strata_dataset_init(d);
    d->n = n;
    d->channels = 1;
    d->height = 1;
    d->width = 8;
    d->dim = 8;
    d->num_classes = 8;
    d->x = strata_alloc_floats(n * 8);
    d->y = malloc(n);
    strata_rng r;
    strata_rng_seed(&r, seed, 0);
    for (size_t i = 0; i < n; i++) {
        size_t best = 0;
        for (size_t j = 0; j < 8; j++) {
            d->x[i * 8 + j] = (float)strata_rng_uniform(&r);
            if (d->x[i * 8 + j] > d->x[i * 8 + best])
                best = j;
        }
        d->y[i] = (uint8_t)best;
    }
}

static void test_train_learns_and_checkpoint(void)
{
    const char *arch = "{\"input\":[8],\"layers\":[{\"type\":\"linear\",\"name\":\"fc1\","
                       "\"out_features\":32},{\"type\":\"relu\"},{\"type\":\"linear\","
                       "\"name\":\"fc2\",\"out_features\":8}]}";
    strata_dataset train, test;
    make_task(&train, 4000, 1);
    make_task(&test, 1000, 2);
    strata_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_model_from_json(arch, strlen(arch), &m, NULL), STRATA_OK);
    strata_model_init_params(m, 3);
    strata_model_set_normalization(m, 0.5f, 0.25f);
    strata_train_stats before, st, after;
    CU_ASSERT_EQUAL(strata_evaluate(m, &test, NULL, 0, 100, &before), STRATA_OK);
    strata_sgd *o = NULL;
    strata_sgd_config cfg = {.lr = 0.05f, .momentum = 0.9f};
    CU_ASSERT_EQUAL_FATAL(strata_sgd_new(strata_model_params(m), &cfg, &o, NULL), STRATA_OK);
    strata_rng r;
    strata_rng_seed(&r, 4, 0);
    for (int e = 0; e < 10; e++)
        CU_ASSERT_EQUAL(strata_train_epoch(m, o, &train, NULL, 0, 32, 0, &r, NULL, NULL, &st),
                        STRATA_OK);
    CU_ASSERT_EQUAL(st.samples, 4000);
    CU_ASSERT_EQUAL(st.steps, 125);
    CU_ASSERT_EQUAL(strata_evaluate(m, &test, NULL, 0, 100, &after), STRATA_OK);
    printf("\n    accuracy %.3f -> %.3f ", before.accuracy, after.accuracy);
    CU_ASSERT(after.accuracy > 0.85);
    CU_ASSERT(after.loss < before.loss);

    /* max_steps and a subset */
    size_t subset[3] = {5, 7, 3999};
    CU_ASSERT_EQUAL(strata_train_epoch(m, o, &train, subset, 3, 2, 1, &r, NULL, NULL, &st),
                    STRATA_OK);
    CU_ASSERT_EQUAL(st.steps, 1);
    CU_ASSERT_EQUAL(st.samples, 2);
    size_t bad_subset[1] = {4000};
    CU_ASSERT_EQUAL(strata_train_epoch(m, o, &train, bad_subset, 1, 2, 0, &r, NULL, NULL, &st),
                    STRATA_EINVAL);

    /* checkpoint round trip keeps parameters, architecture and normalisation */
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char path[1024];
    snprintf(path, sizeof(path), "%s/m.safetensors", dir);
    strata_train_stats ref;
    CU_ASSERT_EQUAL(strata_evaluate(m, &test, NULL, 0, 100, &ref), STRATA_OK);
    CU_ASSERT_EQUAL(strata_checkpoint_save(m, path, NULL), STRATA_OK);
    strata_model *m2 = NULL;
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL_FATAL(strata_checkpoint_load(path, &m2, &d), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(strata_model_arch(m2), strata_model_arch(m));
    float mean, std;
    strata_model_get_normalization(m2, &mean, &std);
    CU_ASSERT(mean == 0.5f && std == 0.25f);
    strata_tensor_list *a = strata_model_params(m), *b = strata_model_params(m2);
    CU_ASSERT_FATAL(strata_tensor_list_same_layout(a, b));
    for (size_t i = 0; i < a->count; i++)
        CU_ASSERT_EQUAL(memcmp(a->items[i].data, b->items[i].data, a->items[i].numel * 4), 0);
    strata_train_stats again;
    CU_ASSERT_EQUAL(strata_evaluate(m2, &test, NULL, 0, 100, &again), STRATA_OK);
    CU_ASSERT_EQUAL(again.accuracy, ref.accuracy);
    CU_ASSERT_EQUAL(again.loss, ref.loss);

    /* a checkpoint whose tensors do not match its architecture is refused */
    strata_metadata meta;
    strata_metadata_init(&meta);
    strata_checkpoint_metadata(m, &meta);
    strata_tensor_list wrong;
    strata_tensor_list_init(&wrong);
    int64_t s1[1] = {3};
    strata_tensor_list_add(&wrong, "fc1.weight", 1, s1, NULL);
    CU_ASSERT_EQUAL(strata_safetensors_write(path, &wrong, &meta, NULL), STRATA_OK);
    strata_model *m3 = NULL;
    CU_ASSERT_EQUAL(strata_checkpoint_load(path, &m3, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NULL(m3);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "do not match"));
    /* an architecture far larger than the file is refused without building it */
    strata_metadata_set(&meta, STRATA_META_ARCH,
                        "{\"input\":[256],\"layers\":[{\"type\":\"linear\",\"name\":\"fc1\","
                        "\"out_features\":1000000}]}");
    CU_ASSERT_EQUAL(strata_safetensors_write(path, &wrong, &meta, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_checkpoint_load(path, &m3, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "257000000 in the architecture"));
    /* and one without architecture metadata */
    strata_metadata_cleanup(&meta);
    strata_metadata_init(&meta);
    CU_ASSERT_EQUAL(strata_safetensors_write(path, a, &meta, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_checkpoint_load(path, &m3, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, STRATA_META_ARCH));
    /* and a malformed normalisation entry */
    strata_checkpoint_metadata(m, &meta);
    strata_metadata_set(&meta, STRATA_META_NORM, "0.5;0.25");
    CU_ASSERT_EQUAL(strata_safetensors_write(path, a, &meta, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_checkpoint_load(path, &m3, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, STRATA_META_NORM));

    strata_metadata_cleanup(&meta);
    strata_tensor_list_cleanup(&wrong);
    strata_test_rmtree(dir);
    free(dir);
    strata_model_free(m);
    strata_model_free(m2);
    strata_sgd_free(o);
    strata_dataset_cleanup(&train);
    strata_dataset_cleanup(&test);
}

static void test_parse_normalization(void)
{
    float m, s;
    CU_ASSERT_EQUAL(strata_parse_normalization("0.2860,0.3530", &m, &s), STRATA_OK);
    CU_ASSERT(fabsf(m - 0.286f) < 1e-7f && fabsf(s - 0.353f) < 1e-7f);
    static const char *const bad[] = {"", "1", "1,", ",1", "1,0", "1,-1", "a,b", "1,2,3", "nan,1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CU_ASSERT_EQUAL(strata_parse_normalization(bad[i], &m, &s), STRATA_EINVAL);
}

int main(void)
{
    strata_set_threads(0);
    CU_TestInfo optim_tests[] = {
        {"SGD variants match hand-computed steps", test_sgd_hand_computed},
        {"cosine schedule and config errors", test_sgd_cosine_and_errors},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo train_tests[] = {
        {"training learns; checkpoint round trip", test_train_learns_and_checkpoint},
        {"normalisation strings", test_parse_normalization},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"optim", NULL, NULL, NULL, NULL, optim_tests},
        {"train", NULL, NULL, NULL, NULL, train_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
