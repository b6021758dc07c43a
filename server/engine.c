/* The engine's composition (see engine.h): opening the state directory and
 * the model, wiring the modules' parts of struct srv_engine together
 * (engine_internal.h), starting and stopping the round thread, freeing.
 *
 * May call: every engine module's internals (registry.h, round.h,
 * models.h, metrics.h, admin.c), the store, aggregate.h, robust.h and
 * libstrata (model, checkpoint, data, policy, fileio). */
#include "engine_internal.h"
#include "lgreco.h"

#include "strata/checkpoint.h"
#include "strata/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void srv__opt_path(const srv_engine *e, uint64_t v, char *buf, size_t cap)
{
    if (strata_store_path(strata_store_dir(e->store), STRATA_STORE_FILE_SERVER_OPT, v, 0, buf, cap,
                          NULL) < 0)
        buf[0] = '\0';
}

/* Images per evaluation batch. A model keeps its activation buffers for the
 * largest batch it has run (no gradient buffers: the coordinator's models
 * never run backward), and every evaluation runs on eval_model, whichever
 * model it measures (x, or with a downlink x̂ too): for resnet about 125 MB
 * at 64 against 430 MB at 256, evaluated as fast (docs/benchmarks.md,
 * "Simulator at scale"). */
#define EVAL_BATCH 64

int srv__evaluate(srv_engine *e, strata_model *m, uint32_t r, strata_train_stats *st)
{
    strata_tensor_list_copy_values(strata_model_params(e->eval_model), strata_model_params(m));
    float mean = 0, sd = 1;
    strata_model_get_normalization(m, &mean, &sd);
    int rc = strata_model_set_normalization(e->eval_model, mean, sd);
    if (rc < 0)
        return rc;
    int last = (long)r + 1 >= e->cfg->rounds;
    if (e->eval_n > 0 && !last)
        return strata_evaluate(e->eval_model, &e->test, e->eval_idx, e->eval_n, EVAL_BATCH, st);
    return strata_evaluate(e->eval_model, &e->test, NULL, 0, EVAL_BATCH, st);
}

/* --eval-samples N below the test set's size: N images at even steps over
 * the test set, the same every round. */
static int eval_subset(srv_engine *e, strata_diag *d)
{
    size_t n = (size_t)e->cfg->eval_samples, count = e->test.n;
    if (n == 0 || n >= count)
        return STRATA_OK;
    e->eval_idx = malloc(n * sizeof(*e->eval_idx));
    if (e->eval_idx == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory (the evaluation subset)");
    for (size_t i = 0; i < n; i++)
        e->eval_idx[i] = (size_t)((double)i * (double)count / (double)n);
    e->eval_n = n;
    return STRATA_OK;
}

int srv__seeded_model(const srv_engine *e, strata_model **out, strata_diag *d)
{
    *out = NULL;
    strata_model *m = NULL;
    int rc = strata_model_new(e->cfg->model, &m, d);
    if (rc < 0)
        return rc;
    strata_model_init_params(m, (uint64_t)e->cfg->seed);
    double mean = 0, sd = 1;
    if ((rc = strata_dataset_stats(&e->test, &mean, &sd)) < 0 ||
        (rc = strata_model_set_normalization(m, (float)mean, sd > 0 ? (float)sd : 1.0f)) < 0) {
        strata_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* The global model: the latest checkpoint of the state directory (which
 * must hold cfg's architecture), or a new one, initialised from the seed
 * and normalised with the test split's statistics, saved as version 0. */
static int load_model(srv_engine *e, strata_diag *d)
{
    const srv_config *cfg = e->cfg;
    uint64_t latest = 0;
    int have = 0;
    int rc = strata_store_latest_model_version(e->store, &latest, &have, d);
    if (rc < 0)
        return rc;
    char path[4096];
    if (have) {
        if ((rc = strata_store_checkpoint_path(e->store, latest, path, sizeof(path), d)) < 0 ||
            (rc = strata_checkpoint_load(path, &e->model, d)) < 0)
            return rc;
        strata_model *spec = NULL;
        if ((rc = strata_model_new(cfg->model, &spec, d)) < 0)
            return rc;
        int same = strcmp(strata_model_arch(spec), strata_model_arch(e->model)) == 0;
        strata_model_free(spec);
        if (!same)
            return strata_diag_set(d, STRATA_EINVAL,
                                   "model: the state directory holds a different architecture");
        e->version = latest;
    } else {
        if ((rc = srv__seeded_model(e, &e->model, d)) < 0)
            return rc;
        if ((rc = strata_store_checkpoint_path(e->store, 0, path, sizeof(path), d)) < 0 ||
            (rc = strata_checkpoint_save(e->model, path, d)) < 0 ||
            (rc = strata_store_checkpoint_record(e->store, 0, d)) < 0)
            return rc;
    }
    if (strata_model_input_dim(e->model) != e->test.dim)
        return strata_diag_set(d, STRATA_EINVAL,
                               "model: input size %zu does not match the data (%zu)",
                               strata_model_input_dim(e->model), e->test.dim);
    return 0;
}

/* eval_model: the model's architecture, its values copied in by each
 * srv__evaluate. */
static int new_eval_model(srv_engine *e, strata_diag *d)
{
    const char *arch = strata_model_arch(e->model);
    return strata_model_from_json(arch, strlen(arch), &e->eval_model, d);
}

/* The model's layout and the payload limits derived from it. */
static int derive_limits(srv_engine *e)
{
    const strata_tensor_list *params = strata_model_params(e->model);
    e->nlayers = params->count;
    e->numel = calloc(e->nlayers, sizeof(*e->numel));
    e->names = calloc(e->nlayers, sizeof(*e->names));
    if (e->numel == NULL || e->names == NULL)
        return STRATA_ENOMEM;
    size_t maxl = 0;
    for (size_t i = 0; i < e->nlayers; i++) {
        e->numel[i] = params->items[i].numel;
        e->names[i] = params->items[i].name; /* borrowed from the model */
        e->total_params += e->numel[i];
        maxl = e->numel[i] > maxl ? e->numel[i] : maxl;
    }
    /* A dense fp32 layer is 4 bytes an element; TOPK at most 5 + 4. */
    uint64_t bound = (uint64_t)e->total_params * 9 + (uint64_t)e->nlayers * 128 + (2u << 20);
    e->limits.max_decoded_bytes = bound;
    e->limits.max_layers = (uint32_t)e->nlayers;
    e->limits.max_layer_numel = maxl;
    e->limits.max_total_numel = e->total_params;
    e->max_body = e->cfg->max_body_bytes > 0 ? (size_t)e->cfg->max_body_bytes : (size_t)bound;
    return 0;
}

/* The server optimiser, with its state saved beside the current version
 * when there is one. */
static int load_server_opt(srv_engine *e, strata_diag *d)
{
    const strata_tensor_list *params = strata_model_params(e->model);
    strata_server_opt_config oc;
    int rc = strata_server_opt_parse(e->cfg->server_opt, &oc, d);
    if (rc < 0)
        return rc;
    if (e->cfg->server_lr > 0) /* else the optimiser's own default */
        oc.lr = e->cfg->server_lr;
    oc.lr_final = e->cfg->server_lr_final;
    oc.horizon = (uint64_t)e->cfg->rounds;
    char opath[4200];
    srv__opt_path(e, e->version, opath, sizeof(opath));
    struct stat st;
    if (e->version > 0 && stat(opath, &st) == 0)
        return strata_server_opt_load(opath, params, &oc, &e->opt, d);
    return strata_server_opt_new(params, &oc, &e->opt, d);
}

int srv_engine_open(const srv_config *cfg, srv_engine **out, strata_diag *d)
{
    *out = NULL;
    srv_engine *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return STRATA_ENOMEM;
    e->cfg = cfg;
    e->jlim.max_bytes = (size_t)cfg->max_json_bytes;
    e->jlim.max_depth = (size_t)cfg->max_json_depth;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->commit_cv, NULL);
    strata_dataset_init(&e->test);
    strata_tensor_list_init(&e->rollback);
    strata_tensor_list_init(&e->xhat_rollback);
    int rc;
    if ((rc = srv__models_init(e)) < 0)
        goto fail;
    strata_set_threads((int)cfg->threads);
    if (strcmp(cfg->policy, "none") != 0 &&
        (rc = strata_policy_parse(cfg->policy, &e->policy, d)) < 0)
        goto fail;
    if (e->policy != NULL && (rc = strata_policy_set_values(e->policy, cfg->values_format, d)) < 0)
        goto fail;
    if (e->policy == NULL && (unsigned)cfg->values_format > STRATA_VALUES_BF16) {
        rc = strata_diag_set(d, STRATA_EINVAL,
                             "values %s: --policy none sends every layer dense (fp32, fp16 or "
                             "bf16)",
                             strata_values_format_name(cfg->values_format));
        goto fail;
    }
    if ((rc = strata_robust_parse(cfg->aggregator, &e->method, d)) < 0 ||
        (rc = strata_robust_check(e->method, cfg->trim_fraction, cfg->clip_norm, d)) < 0)
        goto fail;
    if ((rc = strata_store_open(cfg->state_dir, &e->store, d)) < 0 ||
        (rc = strata_store_open_secondary(e->store, &e->wstore, d)) < 0)
        goto fail;
    if ((rc = strata_data_load_dir(cfg->data, "test", 0, &e->test, d)) < 0 ||
        (rc = eval_subset(e, d)) < 0)
        goto fail;
    if ((rc = load_model(e, d)) < 0 || (rc = new_eval_model(e, d)) < 0 ||
        (rc = derive_limits(e)) < 0 || (rc = srv__downlink_load(e, d)) < 0 ||
        (rc = srv__downlink_recipe(e, d)) < 0)
        goto fail;
    if ((rc = strata_agg_new(strata_model_params(e->model), &e->agg)) < 0)
        goto fail;
    if ((rc = load_server_opt(e, d)) < 0 || (rc = srv__metrics_load(e, d)) < 0)
        goto fail;
    /* A close steps a copy of the optimiser and keeps the parameters it
     * started from, so that a close that does not commit changes nothing. */
    if ((rc = strata_server_opt_new(strata_model_params(e->model),
                                    strata_server_opt_get_config(e->opt), &e->opt_next, d)) < 0 ||
        (rc = strata_tensor_list_copy(&e->rollback, strata_model_params(e->model))) < 0)
        goto fail;
    if ((rc = srv__registry_load(e, d)) < 0 || (rc = srv__round_resume(e, d)) < 0 ||
        (rc = srv__lgreco_restore(e, d)) < 0)
        goto fail;
    srv_model_blob blob;
    if ((rc = srv__model_encode(e, &blob, d)) < 0)
        goto fail;
    srv__model_install(e, &blob);
    if ((rc = srv__admin_load(e, d)) < 0)
        goto fail;
    if (e->stopped && (rc = srv__round_abandon(e, d)) < 0)
        goto fail;
    e->finished = e->stopped || (!e->open && e->next_round >= (uint32_t)cfg->rounds);
    *out = e;
    return 0;
fail:
    srv_engine_free(e);
    return rc;
}

void srv_engine_set_waiters(srv_engine *e, srv_waiter_fn suspend, srv_waiter_fn resume)
{
    e->suspend = suspend;
    e->resume = resume;
}

int srv_engine_start(srv_engine *e)
{
    if (pthread_create(&e->thread, NULL, srv__round_thread, e) != 0)
        return STRATA_ENOMEM;
    e->started = 1;
    return 0;
}

void srv_engine_stop(srv_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    srv__waiters_wake_all(e);
    pthread_mutex_unlock(&e->mu);
    if (e->started)
        pthread_join(e->thread, NULL);
    e->started = 0;
}

void srv_engine_free(srv_engine *e)
{
    if (e == NULL)
        return;
    if (e->store != NULL) {
        srv__metrics_flush(e);
        srv__registry_flush_seen(e);
    }
    srv__round_reset(e);
    strata_store_close(e->wstore);
    strata_store_close(e->store);
    strata_dataset_cleanup(&e->test);
    free(e->eval_idx);
    strata_model_free(e->model);
    strata_model_free(e->eval_model);
    strata_model_free(e->xhat);
    free(e->recipe);
    strata_tensor_list_cleanup(&e->xhat_rollback);
    strata_policy_free(e->policy);
    strata_agg_free(e->agg);
    strata_server_opt_free(e->opt);
    strata_server_opt_free(e->opt_next);
    strata_tensor_list_cleanup(&e->rollback);
    free(e->numel);
    free(e->names);
    srv__registry_cleanup(e);
    srv__models_cleanup(e);
    free(e->waiters);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->commit_cv);
    free(e);
}

size_t srv_engine_max_body(const srv_engine *e)
{
    return e->max_body;
}

size_t srv_engine_max_json(const srv_engine *e)
{
    return (size_t)e->cfg->max_json_bytes;
}
