/* The coordinator engine's shared state: struct srv_engine, with each
 * module's part marked, and the cross-file helpers (srv__*) of the engine's
 * modules. Only the engine's .c files (engine, round, upload, registry,
 * metrics, models, admin, views, result) include it; nothing here is API.
 *
 * Locking (unchanged by the split into modules):
 *   - one engine mutex, mu, guards every field below unless a field says
 *     otherwise; counters are atomics and need no lock;
 *   - the round thread (round.c) opens and closes rounds; while it closes a
 *     round (close_busy) it drops mu to read the round's stored updates on
 *     wstore, aggregate, step, evaluate, save the checkpoint and encode the
 *     model (closing = 1 keeps uploads of that round out meanwhile, and
 *     leaves the open round's selection and norms to the round thread). A
 *     close that failed for a reason that can pass keeps closing = 1 and is
 *     retried by the round thread (close_failures, close_retry_ms), as is
 *     an open that failed (open_failures, open_retry_ms);
 *   - group commits (upload.c) run on the second store connection, wstore,
 *     with mu released; one committer at a time (committing), and the round
 *     cannot start closing while one is in flight (srv__round_ready_to_close);
 *   - the model itself (model, opt, opt_next, rollback) is touched only by
 *     the round thread and by start-up; a close steps the model in place and
 *     opt_next (a copy of opt's state), and puts the model back from
 *     rollback unless the close commits.
 * A helper documented "lock held" must be called with mu held and returns
 * with it held. */
#ifndef STRATA_SERVER_ENGINE_INTERNAL_H
#define STRATA_SERVER_ENGINE_INTERNAL_H

#include "engine.h"
#include "metrics.h"
#include "models.h"
#include "registry.h"
#include "round.h"
#include "upload.h"

#include "aggregate.h"
#include "request.h"
#include "robust.h"
#include "store.h"

#include "strata/data.h"
#include "strata/downlink.h"
#include "strata/train.h"
#include "strata/model.h"
#include "strata/payload.h"
#include "strata/policy.h"
#include "strata/zframe.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct json_t;

/* A client's token hash and id (registry.c's index, ascending by hash). */
typedef struct srv_tok_entry {
    uint8_t hash[STRATA_STORE_HASH_LEN];
    uint64_t id;
} srv_tok_entry;

/* A rate bucket (registry.c): tokens refilled at a rate a minute up to
 * that rate, as of refilled_ms. */
typedef struct srv_bucket {
    double tokens;
    int64_t refilled_ms;
} srv_bucket;

/* A registered client's state beside its id (registry.c): its upload-rate
 * bucket (upload_rate a minute), when it last asked for a task, and the
 * last-seen time the store holds (written in batches by
 * srv__registry_flush_seen). */
typedef struct srv_client_state {
    srv_bucket uploads;
    int64_t seen_ms, stored_ms;
    uint32_t benched_until; /* round.c: not selected before this round (missed a deadline) */
} srv_client_state;

/* Addresses whose wrong enrolment secrets are counted at once; beyond it the
 * entry refilled longest ago is reused. */
#define SRV_PEERS 1024

/* The longest address text (an IPv6 address, NUL included). */
#define SRV_PEER_MAX 46

/* One address's bucket of wrong enrolment secrets (enrolment_rate a
 * minute). */
typedef struct srv_peer {
    char addr[SRV_PEER_MAX];
    srv_bucket wrong;
} srv_peer;

/* What a selected client has answered for the open round (reported[]). */
enum { SRV_REPORT_NONE = 0, SRV_REPORT_UPDATE = 1, SRV_REPORT_SKIPPED = 2 };

/* A parked long-poll connection (round.c). */
typedef struct srv_waiter {
    void *conn;
    int64_t deadline_ms;
} srv_waiter;

typedef struct srv_pending_upload srv_pending_upload;

struct srv_engine {
    /* ---- engine.c: composition, threads ---- */
    const srv_config *cfg; /* borrowed */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* wakes the round thread */
    pthread_t thread;
    int started, stopping;
    srv_waiter_fn suspend, resume;
    strata_store *store;
    strata_store *wstore; /* second connection: group commits, outside the lock */
    strata_dataset test;
    size_t *eval_idx;      /* --eval-samples: the test images of every round but the last */
    size_t eval_n;         /* entries of eval_idx; 0: every round sees the whole test set */
    strata_model *model;   /* touched only by the round thread (and start-up) */
    strata_policy *policy; /* NULL for --policy none */
    strata_agg *agg;       /* FedAvg's streaming aggregate (unused by robust rules) */
    /* The one model that runs forward: srv__evaluate copies x (or x̂) into
     * it, so that only it keeps activation buffers. Round thread only. */
    strata_model *eval_model;
    strata_server_opt *opt;
    strata_server_opt *opt_next; /* stepped by a close; becomes opt when it commits */
    strata_tensor_list rollback; /* the parameters before a close's step */
    size_t nlayers, total_params, max_body;
    size_t *numel;
    char **names; /* borrowed from the model */
    strata_payload_limits limits;
    srv_json_limits jlim;
    strata_robust_method method;

    /* ---- registry.c: registered clients, ascending ids, with each one's
     * state (cstate[i] belongs to clients[i]), and the same clients by token
     * hash (ascending), so that authenticating a request needs no database
     * lookup. ---- */
    uint64_t *clients;
    srv_client_state *cstate;
    size_t nclients, capclients;
    srv_tok_entry *toks;
    uint8_t admin_hash[STRATA_STORE_HASH_LEN];
    srv_peer *peers; /* SRV_PEERS entries; addr "" when unused */

    /* ---- admin.c: controls (persisted as store counters) ---- */
    int paused, stopped;
    int stopping_round; /* an admin stop waits for the group commit in flight */

    /* ---- round.c: the open round ---- */
    uint32_t next_round; /* the open round, or the next to open */
    uint64_t version;    /* current global model version */
    int open, closing, finished;
    int close_busy;          /* a close attempt is running (mu may be dropped) */
    unsigned close_failures; /* failed close attempts of the open round */
    int64_t close_retry_ms;  /* monotonic time of the next attempt */
    unsigned open_failures;  /* failed attempts at opening next_round */
    int64_t open_retry_ms;   /* monotonic time of the next one */
    uint64_t *selected;      /* ascending */
    size_t nselected;
    uint8_t *reported; /* per selected client: SRV_REPORT_* */
    double *norms;     /* per selected client: its update's L2 norm (FedAvg, as it
                          streamed in; robust rules measure at close) */
    size_t nreported;  /* selected clients whose update was accepted */
    size_t nskipped;   /* selected clients that said they cannot contribute */
    size_t enough;     /* updates that close the round before its deadline */
    strata_budget *budgets;
    strata_budget *cands; /* the task's error-table candidates (lgreco), or NULL */
    size_t ncands;
    int lg_solved; /* the close being run solved an lgreco table */
    char *task_json;
    int64_t opened_ms, deadline_ms;
    /* Bodies of the open round: uplink its accepted updates; downlink the
     * model bodies sent since the last round's summary was stored (a client
     * that fetches after the round it was asked for closed, or before the
     * next one opens, counts in the next round). */
    uint64_t uplink, downlink;
    /* The gauges of the last round closed with a new model (all but
     * last_agg_s restored from the store at start-up). */
    double last_acc, last_loss, last_agg_s, last_round_s;
    size_t last_eval_samples; /* test images behind last_acc and last_loss */
    srv_waiter *waiters;      /* parked long-polls */
    size_t nwaiters, capwaiters;

    /* ---- models.c: the current version, encoded ---- */
    srv_model_blob cache;   /* version `version`, raw and zstd */
    strata_zctx *zctx;      /* the cache's encoder: start-up and the round thread */
    strata_zctx *old_zctx;  /* older versions' encoder, under old_mu */
    pthread_mutex_t old_mu; /* guards old_zctx only */
    /* x̂ of the version chain bases were last made for, and its digest,
     * read from its checkpoint by the first chain request for that
     * version; under chain_mu, which also makes one compaction at a time. */
    pthread_mutex_t chain_mu;
    strata_tensor_list chain_xhat;
    uint64_t chain_version;
    char chain_digest[STRATA_DIGEST_HEX_SIZE];

    /* ---- downlink.c: with --downlink other than none, model is the
     * server's model x and xhat the model the clients hold (x̂), published
     * one delta a round; xhat is NULL otherwise (clients hold model).
     * Touched like model: by the round thread and start-up; digest is the
     * served version's (guarded by mu). ---- */
    strata_model *xhat;
    strata_tensor_list xhat_rollback; /* x̂ before a close's step */
    char digest[STRATA_DIGEST_HEX_SIZE];
    /* Version 0's recipe (strata/recipe.h, GET /v1/models/0/init): set at
     * start-up when version 0 is the seeded initialisation, else NULL;
     * never changed afterwards (read without the lock). */
    char *recipe;
    size_t recipe_len;

    /* ---- metrics.c: counters (atomics; no lock) ---- */
    _Atomic int64_t ctr[SRV_CTR_COUNT], pending[SRV_CTR_COUNT];

    /* ---- upload.c: group commit. Prepared uploads queue here; one uploader
     * at a time (committing) commits all queued ones in one transaction. ---- */
    srv_pending_upload *queue, *queue_tail;
    int committing;
    pthread_cond_t commit_cv;
};

/* ---- result.c ---- */

/* Sets r to the refusal of a request body that a request.h parser refused
 * with rc (explained in d): SRV_E_TOO_LARGE for STRATA_ETOOBIG, else
 * SRV_E_BAD_REQUEST, with the parser's message. */
void srv__result_bad_body(srv_result *r, int rc, const strata_diag *d);

/* Sets r to outcome o with j (a jansson value, stolen; may be NULL after a
 * failed allocation, then r is SRV_E_INTERNAL) dumped compactly in key
 * order as the JSON body. */
void srv__result_json(srv_result *r, srv_outcome o, struct json_t *j);

/* ---- engine.c ---- */

/* Writes the path of the server optimiser's state saved with model version
 * v (STATE_DIR/checkpoints/server-opt-V.safetensors) into buf: the one place
 * that composes it. */
void srv__opt_path(const srv_engine *e, uint64_t v, char *buf, size_t cap);

/* The model a fresh federation starts from: cfg's architecture,
 * strata_model_init_params with cfg's seed, normalised with the test split's
 * statistics. *out is new (strata_model_free). Errors: the model
 * builder's. */
int srv__seeded_model(const srv_engine *e, strata_model **out, strata_diag *d);

/* Evaluates m for round r into *st: on the test images of eval_idx for
 * every round but the last (--eval-samples), on the whole test set for the
 * last round and without --eval-samples; st->samples says how many. m's
 * parameters and normalisation are copied into eval_model, which runs the
 * batches, so m itself never makes activation buffers. Errors:
 * strata_model_set_normalization's and strata_evaluate's. */
int srv__evaluate(srv_engine *e, strata_model *m, uint32_t r, strata_train_stats *st);

/* ---- downlink.c ---- */

/* The model the clients download and train from: xhat with --downlink,
 * else model (borrowed). */
strata_model *srv__served_model(const srv_engine *e);

/* Start-up, after the model is loaded: with --downlink, loads x̂ from the
 * current version's checkpoint and the server's model x from its file
 * beside it (x = x̂ when there is none: a federation that starts, or turns
 * --downlink on); then the served model's digest. Errors: those of the
 * checkpoint and safetensors readers; STRATA_EINVAL for an x of another
 * layout. */
int srv__downlink_load(srv_engine *e, strata_diag *d);

/* Start-up, after srv__downlink_load: with --downlink, sets e->recipe when
 * version 0's checkpoint is exactly the seeded initialisation
 * (srv__seeded_model: same architecture, normalisation and digest) and the
 * deltas from version 0 are all on disk; logs which. A state directory
 * whose version 0 differs (another seed, a model loaded from elsewhere, a
 * version 0 no longer kept) leaves it NULL: clients take snapshots.
 * Errors: STRATA_ENOMEM (a failed check is not an error). */
int srv__downlink_recipe(srv_engine *e, strata_diag *d);

/* Closing round r into version v, after the server step moved model (x)
 * and its evaluation is in *st: with --downlink, compresses x - x̂ into
 * the delta payload (*delta, *delta_len; free()), moves xhat (its old
 * values kept in xhat_rollback), evaluates it into *st (x's accuracy goes to
 * the log), and writes the delta and x to their files durably; in every
 * case the served model's digest goes to digest. Without the lock. On
 * error xhat is put back. */
int srv__downlink_close(srv_engine *e, uint32_t r, uint64_t v, strata_train_stats *st,
                        char digest[STRATA_DIGEST_HEX_SIZE], strata_diag *d);

/* Puts xhat back after a close that did not commit (no-op without
 * --downlink). */
void srv__downlink_rollback(srv_engine *e);

/* After version v committed (lock held, the new snapshot installed):
 * removes the delta that fell out of the kept window (v - downlink_keep),
 * or with --downlink-keep 0 every delta that no chain ending at v smaller
 * than the zstd snapshot, and of at most STRATA_DOWNLINK_MAX_CHAIN deltas,
 * can hold (so the kept deltas never add up to much more than one
 * snapshot on disk). */
void srv__downlink_prune(srv_engine *e, uint64_t v);

/* ---- admin.c ---- */

/* The federation's state name for /v1/status and admin answers: "stopped",
 * "finished", "paused", "running" or "waiting". Lock held. */
const char *srv__state_name(const srv_engine *e);

/* Reads the persisted controls (paused, stopped) at start-up. */
int srv__admin_load(srv_engine *e, strata_diag *d);

#endif
