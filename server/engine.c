/* The engine's composition (see engine.h and engine_internal.h): opening
 * the state directory and the model, giving each module its settings from
 * the configuration and the other modules it may call, the round thread,
 * stopping and freeing. The request calls are engine_api.c's.
 *
 * This file and main.c are the engine's only readers of srv_config's
 * fields: every module gets its own settings from here.
 *
 * May call: every module's start-up and the round thread's calls, the
 * store, robust.h and libstrata (model, checkpoint, data, downlink). */
#include "engine_internal.h"

#include "lgreco.h"

#include "strata/checkpoint.h"
#include "strata/clock.h"
#include "strata/log.h"
#include "strata/stop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How often the round thread looks at the open round without being woken. */
#define TICK_MS 100

/* The model a fresh federation starts from: cfg's architecture,
 * strata_model_init_params with cfg's seed, normalised with the test
 * split's statistics. *out is new (strata_model_free). Errors: the model
 * builder's. */
static int seeded_model(const srv_engine *e, strata_model **out, strata_diag *d)
{
    *out = NULL;
    strata_model *m = NULL;
    int rc = strata_model_new(e->cfg->model, &m, d);
    if (rc < 0)
        return rc;
    strata_model_init_params(m, (uint64_t)e->cfg->seed);
    double mean = 0, sd = 1;
    if ((rc = strata_dataset_stats(srv__eval_test(e->eval), &mean, &sd)) < 0 ||
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
static int load_model(srv_engine *e, strata_model **out, uint64_t *version, strata_diag *d)
{
    *out = NULL;
    *version = 0;
    uint64_t latest = 0;
    int have = 0;
    int rc = strata_store_latest_model_version(e->store, &latest, &have, d);
    if (rc < 0)
        return rc;
    char path[4096];
    strata_model *m = NULL;
    if (have) {
        int found = 0;
        if ((rc = strata_store_file_fetch(e->store, STRATA_STORE_FILE_CHECKPOINT, latest, &found,
                                          d)) < 0 ||
            (rc = strata_store_checkpoint_path(e->store, latest, path, sizeof(path), d)) < 0 ||
            (rc = strata_checkpoint_load(path, &m, d)) < 0)
            return rc;
        strata_model *spec = NULL;
        if ((rc = strata_model_new(e->cfg->model, &spec, d)) < 0)
            goto fail;
        int same = strcmp(strata_model_arch(spec), strata_model_arch(m)) == 0;
        strata_model_free(spec);
        if (!same) {
            rc = strata_diag_set(d, STRATA_EINVAL,
                                 "model: the state directory holds a different architecture");
            goto fail;
        }
        *version = latest;
    } else {
        if ((rc = seeded_model(e, &m, d)) < 0)
            return rc;
        if ((rc = strata_store_checkpoint_path(e->store, 0, path, sizeof(path), d)) < 0 ||
            (rc = strata_checkpoint_save(m, path, d)) < 0 ||
            (rc = strata_store_checkpoint_record(e->store, 0, d)) < 0)
            goto fail;
    }
    size_t dim = srv__eval_test(e->eval)->dim;
    if (strata_model_input_dim(m) != dim) {
        rc =
            strata_diag_set(d, STRATA_EINVAL, "model: input size %zu does not match the data (%zu)",
                            strata_model_input_dim(m), dim);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    strata_model_free(m);
    return rc;
}

/* The model's layout and the payload limits derived from it. */
static int derive_limits(srv_engine *e, const strata_model *m)
{
    const strata_tensor_list *params = strata_model_params((strata_model *)m);
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

/* The distribution of the model clients get (models.h): version 0's
 * recipe when it is the seeded initialisation, and the current version,
 * encoded and published. */
static int open_models(srv_engine *e, uint64_t version, strata_diag *d)
{
    const srv_config *cfg = e->cfg;
    int rc = srv__models_new(e->store, &e->mu, cfg->downlink_on, cfg->downlink_keep, &e->models);
    if (rc < 0)
        return rc;
    if (e->follower)
        srv__models_set_follower(e->models);
    strata_model *seeded = NULL;
    char *recipe = NULL;
    size_t len = 0;
    if (srv__downlink_xhat(e->downlink) != NULL) {
        if ((rc = seeded_model(e, &seeded, d)) == 0)
            rc = srv__downlink_recipe(e->downlink, seeded, version, &recipe, &len, d);
        strata_model_free(seeded);
        if (rc < 0)
            return rc;
        srv__models_set_recipe(e->models, recipe, len);
    }
    strata_model *served = srv__downlink_served(e->downlink);
    char digest[STRATA_DIGEST_HEX_SIZE];
    strata_downlink_digest(strata_model_params(served), digest);
    srv_model_blob blob;
    if ((rc = srv__models_encode(e->models, served, &blob, d)) < 0)
        return rc;
    srv__models_publish(e->models, version, &blob, digest);
    return 0;
}

/* The modules that read the model's layout: the policy, the closer (which
 * takes the model x), the rounds (resumed), the uploads. */
static int open_rounds(srv_engine *e, strata_model *x, uint64_t version,
                       strata_robust_method method, strata_diag *d)
{
    const srv_config *cfg = e->cfg;
    srv_close_config cc = {.rounds = cfg->rounds,
                           .min_updates = cfg->min_updates,
                           .straggler_rounds = cfg->straggler_rounds,
                           .method = method,
                           .trim_fraction = cfg->trim_fraction,
                           .clip_norm = cfg->clip_norm,
                           .screen_factor = cfg->screen_factor,
                           .server_opt = cfg->server_opt,
                           .server_lr = cfg->server_lr,
                           .server_lr_final = cfg->server_lr_final,
                           .total_params = e->total_params,
                           .limits = e->limits,
                           .store = e->rstore,
                           .eval = e->eval,
                           .downlink = e->downlink,
                           .models = e->models,
                           .budgets = e->budgets,
                           .reg = e->reg,
                           .met = e->met,
                           .waiters = e->waiters};
    int rc = srv__close_new(&cc, x, version, &e->close, d);
    if (rc < 0)
        return rc;
    srv_rounds_config rcfg = {.rounds = cfg->rounds,
                              .min_clients = cfg->min_clients,
                              .clients_per_round = cfg->clients_per_round,
                              .min_updates = cfg->min_updates,
                              .seed = cfg->seed,
                              .fraction = cfg->fraction,
                              .over_select = cfg->over_select,
                              .round_deadline = cfg->round_deadline,
                              .local_epochs = cfg->local_epochs,
                              .batch = cfg->batch,
                              .max_steps = cfg->max_steps,
                              .lr = cfg->lr,
                              .momentum = cfg->momentum,
                              .weight_decay = cfg->weight_decay,
                              .prox_mu = cfg->prox_mu,
                              .method = method,
                              .clip_norm = cfg->clip_norm,
                              .downlink = cfg->downlink_on,
                              .nlayers = e->nlayers,
                              .total_params = e->total_params,
                              .names = e->names,
                              .layout = strata_model_params(srv__close_model(e->close)),
                              .limits = e->limits,
                              .store = e->store,
                              .mu = &e->mu,
                              .wake = &e->cv,
                              .met = e->met,
                              .reg = e->reg,
                              .waiters = e->waiters,
                              .models = e->models,
                              .budgets = e->budgets,
                              .mirror = e->follower,
                              .shared = cfg->database != NULL};
    if ((rc = srv__rounds_new(&rcfg, &e->rounds)) < 0 ||
        (rc = srv__round_resume(e->rounds, srv__eval_test(e->eval)->n, d)) < 0 ||
        (rc = srv__lgreco_restore(e->budgets, e->store, srv__round_current(e->rounds), d)) < 0)
        return rc;
    srv_uploads_config uc = {.nlayers = e->nlayers,
                             .numel = e->numel,
                             .names = e->names,
                             .limits = e->limits,
                             .store = e->store,
                             .wstore = e->wstore,
                             .mu = &e->mu,
                             .wake = &e->cv,
                             .met = e->met,
                             .rounds = e->rounds};
    return srv__uploads_new(&uc, &e->uploads);
}

/* The registry and the operator's controls (an operator's stop of an
 * earlier run abandons the open round again and ends the federation). */
static int open_clients(srv_engine *e, strata_diag *d)
{
    const srv_config *cfg = e->cfg;
    srv_registry_config gc = {.enrolment_secret = cfg->enrolment_secret,
                              .enrolment_rate = cfg->enrolment_rate,
                              .upload_rate = cfg->upload_rate,
                              .max_clients = cfg->max_clients,
                              .data_shares = cfg->data_shares,
                              .admin_token_file = cfg->admin_token_file,
                              .jlim = &e->jlim,
                              .store = e->store,
                              .mu = &e->mu,
                              .wake = &e->cv,
                              .met = e->met,
                              .shared = cfg->database != NULL};
    return srv__registry_new(&gc, &e->reg, d);
}

static int open_admin(srv_engine *e, strata_diag *d)
{
    srv_admin_config ac = {.cfg = e->cfg,
                           .jlim = &e->jlim,
                           .store = e->store,
                           .mu = &e->mu,
                           .wake = &e->cv,
                           .rounds = e->rounds,
                           .uploads = e->uploads,
                           .waiters = e->waiters};
    int rc = srv__admin_new(&ac, &e->admin, d);
    if (rc == 0 && srv__admin_stopped(e->admin)) {
        /* (a follower's mirror is the leader's to close) */
        if (e->follower || (rc = srv__round_abandon(e->rounds, d)) == 0)
            srv__round_finish(e->rounds, 1);
    }
    return rc;
}

/* --lease in milliseconds. */
static long lease_ms(const srv_engine *e)
{
    return (long)(e->cfg->lease * 1000.0);
}

/* With a shared store: leads it when no other coordinator does; follows
 * the one that does once the store holds a model version; waits as a
 * standby before that (before any write; the connections opened afterwards
 * are fenced). A lead handed from this process's previous engine is kept. */
static int lead(srv_engine *e, srv_engine_lead *handed, strata_diag *d)
{
    if (e->cfg->database == NULL)
        return STRATA_OK;
    if (e->cfg->coordinator_name != NULL) {
        snprintf(e->holder, sizeof(e->holder), "%s", e->cfg->coordinator_name);
    } else {
        char host[48] = "";
        gethostname(host, sizeof(host) - 1);
        snprintf(e->holder, sizeof(e->holder), "%s:%ld", host[0] != '\0' ? host : "coordinator",
                 (long)getpid());
    }
    if (handed != NULL) {
        e->lease = handed->lease;
        handed->lease = NULL;
        return STRATA_OK;
    }
    volatile sig_atomic_t *stop = strata_stop_install();
    int rc = srv__lease_acquire(e->store, e->holder, lease_ms(e), stop, 1, &e->lease, d);
    if (rc == STRATA_ESTATE && !*stop && e->lease == NULL) {
        e->follower = 1;
        rc = STRATA_OK;
    }
    return rc;
}

/* The watch thread of a coordinator on a shared store (replica.h). */
static int open_replica(srv_engine *e, strata_diag *d)
{
    if (e->cfg->database == NULL)
        return STRATA_OK;
    srv_replica_config pc = {.follower = e->follower,
                             .store = e->store,
                             .mu = &e->mu,
                             .holder = e->holder,
                             .lease_ms = lease_ms(e),
                             .reg = e->reg,
                             .rounds = e->rounds,
                             .models = e->models,
                             .waiters = e->waiters};
    return srv__replica_new(&pc, &e->replica, d);
}

int srv_engine_open(const srv_config *cfg, srv_engine **out, strata_diag *d)
{
    return srv_engine_open_led(cfg, NULL, out, d);
}

void srv_engine_lead_free(srv_engine_lead *lead)
{
    if (lead == NULL)
        return;
    srv__lease_free(lead->lease);
    strata_store_close(lead->store);
    free(lead);
}

int srv_engine_open_led(const srv_config *cfg, srv_engine_lead *handed, srv_engine **out,
                        strata_diag *d)
{
    *out = NULL;
    srv_engine *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        srv_engine_lead_free(handed);
        return STRATA_ENOMEM;
    }
    if (handed != NULL) {
        e->store = handed->store;
        handed->store = NULL;
    }
    e->cfg = cfg;
    e->total_rounds = cfg->rounds;
    e->jlim.max_bytes = (size_t)cfg->max_json_bytes;
    e->jlim.max_depth = (size_t)cfg->max_json_depth;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    strata_model *x = NULL;
    uint64_t version = 0;
    strata_robust_method method = STRATA_ROBUST_FEDAVG;
    int rc;
    if ((rc = srv__metrics_new(&e->met)) < 0 || (rc = srv__waiters_new(&e->waiters)) < 0)
        goto fail;
    strata_set_threads((int)cfg->threads);
    if ((rc = strata_robust_parse(cfg->aggregator, &method, d)) < 0 ||
        (rc = strata_robust_check(method, cfg->trim_fraction, cfg->clip_norm, d)) < 0)
        goto fail;
    if ((rc = e->store != NULL ? 0
              : cfg->database != NULL
                  ? strata_store_open_database(cfg->database, cfg->state_dir, &e->store, d)
                  : strata_store_open(cfg->state_dir, &e->store, d)) < 0 ||
        (rc = lead(e, handed, d)) < 0 ||
        (rc = strata_store_open_secondary(e->store, &e->wstore, d)) < 0 ||
        (rc = strata_store_open_secondary(e->store, &e->rstore, d)) < 0)
        goto fail;
    strata_log_info("state directory %s (%s store; %zu temporary files of an interrupted write "
                    "removed)",
                    strata_store_dir(e->store), strata_store_backend(e->store),
                    strata_store_recovered_files(e->store));
    if ((rc = srv__eval_new(cfg->data, cfg->eval_samples, cfg->rounds, &e->eval, d)) < 0 ||
        (rc = load_model(e, &x, &version, d)) < 0 || (rc = srv__eval_prepare(e->eval, x, d)) < 0 ||
        (rc = derive_limits(e, x)) < 0)
        goto fail;
    srv_budgets_config bc = {.policy = cfg->policy,
                             .values_format = cfg->values_format,
                             .density = cfg->density,
                             .rounds = cfg->rounds,
                             .nlayers = e->nlayers,
                             .numel = e->numel};
    srv_downlink_config dc = {.on = cfg->downlink_on,
                              .name = cfg->downlink,
                              .budget = &cfg->downlink_budget,
                              .seed = cfg->seed,
                              .keep = cfg->downlink_keep,
                              .store = e->store};
    if ((rc = srv__budgets_new(&bc, &e->budgets, d)) < 0 ||
        (rc = srv__downlink_new(&dc, x, version, &e->downlink, d)) < 0 ||
        (rc = open_models(e, version, d)) < 0 ||
        (rc = srv__metrics_load(e->met, e->store, d)) < 0 || (rc = open_clients(e, d)) < 0)
        goto fail;
    rc = open_rounds(e, x, version, method, d); /* takes x */
    x = NULL;
    if (rc < 0 || (rc = open_admin(e, d)) < 0 || (rc = open_replica(e, d)) < 0)
        goto fail;
    srv_engine_lead_free(handed);
    *out = e;
    return 0;
fail:
    srv_engine_lead_free(handed);
    strata_model_free(x);
    srv_engine_free(e);
    return rc;
}

int srv_engine_promoted(srv_engine *e)
{
    return srv__replica_promoted(e->replica);
}

srv_engine_lead *srv_engine_take_lead(srv_engine *e)
{
    srv_lease *L = srv__replica_take_lead(e->replica);
    if (L == NULL)
        return NULL;
    srv_engine_lead *lead = calloc(1, sizeof(*lead));
    if (lead == NULL) {
        srv__lease_free(L);
        return NULL;
    }
    /* The counters go to the store before the connection changes hands. */
    if (e->met != NULL)
        srv__metrics_flush(e->met, e->store);
    srv__registry_flush_seen(e->reg);
    lead->lease = L;
    lead->store = e->store;
    e->store = NULL;
    return lead;
}

void srv_engine_set_waiters(srv_engine *e, srv_waiter_fn suspend, srv_waiter_fn resume)
{
    srv__waiters_set(e->waiters, suspend, resume);
    srv__uploads_set_conn(e->uploads, suspend, resume);
}

/* Before a close: seals the due round in the store, so that no update of
 * it is stored any more, by this coordinator or another of its store, and
 * brings in the updates others stored (srv__round_adopt): the round's
 * updates are then final. A round whose close is being retried was sealed
 * before. The lock is dropped meanwhile. 0, or < 0 when the store failed
 * (logged; the round thread tries again at its next turn). */
static int seal_due_round(srv_engine *e)
{
    if (srv__round_closing(e->rounds))
        return 0;
    uint32_t r = srv__round_current(e->rounds);
    pthread_mutex_unlock(&e->mu);
    strata_diag d = {{0}};
    int rc = strata_store_round_seal(e->rstore, r, &d);
    if (rc == 0)
        rc = srv__round_adopt(e->rounds, e->rstore, &d);
    if (rc < 0 && !e->seal_failing)
        strata_log_warn("round %u: cannot seal it before its close: %s (trying again)", r,
                        strata_diag_msg(&d, rc));
    else if (rc == 0 && e->seal_failing)
        strata_log_info("round %u: sealed for its close", r);
    e->seal_failing = rc < 0;
    pthread_mutex_lock(&e->mu);
    return rc;
}

/* Closes the open round when it is due and no group commit is in flight:
 * sealed first (the lock is dropped meanwhile, so both are checked again
 * after). Lock held. */
static void close_if_due(srv_engine *e, int64_t now)
{
    if (srv__uploads_busy(e->uploads) || !srv__close_due(e->rounds, now))
        return;
    if (seal_due_round(e) < 0)
        return;
    if (!srv__uploads_busy(e->uploads) && srv__close_due(e->rounds, now))
        srv__close_round(e->close, e->rounds);
}

/* The round thread: opens a round once min_clients are registered (unless
 * paused or finished), closes it when due and no group commit is in
 * flight, wakes expired long-polls; runs until e->stopping. */
static void *round_thread(void *arg)
{
    srv_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stopping) {
        int64_t now = strata_clock_unix_ms();
        if (!e->follower) {
            srv__round_maybe_open(e->rounds, srv__admin_paused(e->admin));
            close_if_due(e, now);
        }
        srv__waiters_wake_expired(e->waiters, strata_clock_unix_ms());
        struct timespec ts = strata_clock_abstime_in(TICK_MS);
        if (!e->stopping)
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int srv_engine_start(srv_engine *e)
{
    if (pthread_create(&e->thread, NULL, round_thread, e) != 0)
        return STRATA_ENOMEM;
    e->started = 1;
    int rc = e->lease != NULL ? srv__lease_start(e->lease) : 0;
    return rc == 0 && e->replica != NULL ? srv__replica_start(e->replica) : rc;
}

void srv_engine_stop(srv_engine *e)
{
    srv__replica_stop(e->replica);
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    srv__waiters_close(e->waiters);
    pthread_mutex_unlock(&e->mu);
    if (e->started)
        pthread_join(e->thread, NULL);
    e->started = 0;
    srv__uploads_stop(e->uploads); /* the queued uploads decided, their connections resumed */
}

void srv_engine_free(srv_engine *e)
{
    if (e == NULL)
        return;
    if (e->store != NULL && e->met != NULL)
        srv__metrics_flush(e->met, e->store);
    if (e->reg != NULL)
        srv__registry_flush_seen(e->reg);
    srv__replica_free(e->replica);
    srv__admin_free(e->admin);
    srv__uploads_free(e->uploads);
    srv__rounds_free(e->rounds);
    srv__close_free(e->close);
    srv__downlink_free(e->downlink);
    srv__models_free(e->models);
    srv__budgets_free(e->budgets);
    srv__registry_free(e->reg);
    srv__eval_free(e->eval);
    srv__waiters_free(e->waiters);
    srv__metrics_free(e->met);
    srv__lease_free(e->lease);
    strata_store_close(e->rstore);
    strata_store_close(e->wstore);
    strata_store_close(e->store);
    free(e->numel);
    free(e->names);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
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
