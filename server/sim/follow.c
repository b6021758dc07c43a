/* strata-sim: following a run through the coordinator's REST API — GET
 * /v1/status for the run's state and length, GET /v1/rounds for the rounds
 * closed since the last poll (schemas/api.md). */
#include "sim.h"

#include "transport.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Most bytes of a /v1/status body (it carries the coordinator's settings). */
#define STATUS_MAX_BODY ((size_t)1 << 20)
/* Rounds asked for per GET /v1/rounds (the coordinator allows 1 to 1000). */
#define ROUNDS_PAGE 100

struct sim_follow {
    strata_http *http;
    sim_progress progress;
    char *config; /* the "config" object of the last status, compact JSON */
};

static const char *const STATE_NAMES[] = {"waiting", "running", "paused", "finished", "stopped"};

const char *sim_run_state_name(sim_run_state s)
{
    return (unsigned)s < sizeof(STATE_NAMES) / sizeof(STATE_NAMES[0]) ? STATE_NAMES[s] : "?";
}

int sim_follow_new(const char *url, volatile sig_atomic_t *stop, sim_follow **out,
                   strata_diag *diag)
{
    *out = NULL;
    sim_follow *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = strata_http_new(url, NULL, stop, &f->http, diag);
    if (rc < 0) {
        free(f);
        return rc;
    }
    *out = f;
    return STRATA_OK;
}

void sim_follow_free(sim_follow *f)
{
    if (f == NULL)
        return;
    strata_http_free(f->http);
    free(f->config);
    free(f);
}

const sim_progress *sim_follow_progress(const sim_follow *f)
{
    return &f->progress;
}

const char *sim_follow_config(const sim_follow *f)
{
    return f->config;
}

/* GET path; *resp holds a 200 answer's body. */
static int get(sim_follow *f, const char *path, size_t max_body, strata_http_response *resp,
               strata_diag *diag)
{
    int rc =
        strata_http_request(f->http, "GET", path, NULL, NULL, 0, NULL, 0, max_body, resp, diag);
    if (rc < 0)
        return rc;
    if (resp->status != 200)
        return strata_diag_set(diag, STRATA_EPROTO, "GET %s: HTTP %ld", path, resp->status);
    return STRATA_OK;
}

/* Decodes a /v1/status body: its state and total_rounds, and its config
 * object into *config (new indented JSON text; NULL when absent), less the
 * enrolment_secret flag, so that strata-server --config reads it back. */
static int decode_status(const strata_http_response *resp, sim_run_state *state, uint32_t *total,
                         char **config, strata_diag *diag)
{
    *config = NULL;
    json_error_t e;
    json_t *j = json_loadb((const char *)resp->body, resp->len, JSON_REJECT_DUPLICATES, &e);
    if (j == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "GET /v1/status: %s", e.text);
    const char *name = NULL;
    json_int_t t = 0;
    int rc = STRATA_OK;
    if (json_unpack_ex(j, &e, 0, "{s:s,s:I}", "state", &name, "total_rounds", &t) < 0) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "GET /v1/status: %s", e.text);
        goto out;
    }
    if (t < 0 || t > (json_int_t)UINT32_MAX) {
        rc =
            strata_diag_set(diag, STRATA_EPROTO, "GET /v1/status: total_rounds %lld", (long long)t);
        goto out;
    }
    size_t k = 0;
    while (k < sizeof(STATE_NAMES) / sizeof(STATE_NAMES[0]) && strcmp(STATE_NAMES[k], name) != 0)
        k++;
    if (k == sizeof(STATE_NAMES) / sizeof(STATE_NAMES[0])) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "GET /v1/status: unknown state \"%s\"", name);
        goto out;
    }
    *state = (sim_run_state)k;
    *total = (uint32_t)t;
    json_t *cfg = json_object_get(j, "config");
    if (json_is_object(cfg)) {
        json_object_del(cfg, "enrolment_secret"); /* true or false, never the secret */
        if ((*config = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) == NULL)
            rc = strata_diag_set(diag, STRATA_ENOMEM, "GET /v1/status: out of memory");
    }
out:
    json_decref(j);
    return rc;
}

/* Reads the rounds from f->progress.next on, advancing it past each closed
 * one and reporting the aggregated ones. Stops at the first open round. */
static int read_rounds(sim_follow *f, sim_round_fn fn, void *ud, strata_diag *diag)
{
    for (;;) {
        char path[96];
        snprintf(path, sizeof(path), "/v1/rounds?from=%u&limit=%d", f->progress.next, ROUNDS_PAGE);
        strata_http_response resp;
        strata_round_summary *list = NULL;
        size_t n = 0;
        int rc = get(f, path, SIM_ROUNDS_MAX_JSON, &resp, diag);
        if (rc == 0)
            rc = sim_summary_list_decode((const char *)resp.body, resp.len, &list, &n, diag);
        strata_http_response_cleanup(&resp);
        int open = 0;
        for (size_t i = 0; rc == 0 && i < n && !open; i++) {
            const strata_round_summary *s = &list[i];
            if (s->round < f->progress.next) {
                rc = strata_diag_set(diag, STRATA_EPROTO,
                                     "GET /v1/rounds: round %u before the asked-for %u", s->round,
                                     f->progress.next);
            } else if (s->state != STRATA_ROUND_CLOSED) {
                open = 1;
            } else {
                f->progress.next = s->round + 1;
                if (!s->stopped) {
                    f->progress.completed++;
                    if (fn != NULL)
                        fn(ud, s, f->progress.total_rounds);
                }
            }
        }
        sim_summary_list_free(list, n);
        if (rc < 0 || open || n < ROUNDS_PAGE)
            return rc;
    }
}

int sim_follow_poll(sim_follow *f, sim_round_fn fn, void *ud, strata_diag *diag)
{
    strata_http_response resp;
    sim_run_state state = SIM_RUN_WAITING;
    uint32_t total = 0;
    char *config = NULL;
    int rc = get(f, "/v1/status", STATUS_MAX_BODY, &resp, diag);
    if (rc == 0)
        rc = decode_status(&resp, &state, &total, &config, diag);
    strata_http_response_cleanup(&resp);
    if (rc < 0)
        return rc;
    if (config != NULL) {
        free(f->config);
        f->config = config;
    }
    f->progress.state = state;
    f->progress.total_rounds = total;
    f->progress.polled = 1;
    return read_rounds(f, fn, ud, diag);
}
