/* libFuzzer target for strata_task_decode.
 *
 * Every decode must either fail with STRATA_EPROTO or STRATA_ETOOBIG, a
 * message and a zeroed task, or succeed with a task that encodes, decodes
 * again to the same task and re-encodes to the same text (the encoding is a
 * function of the task). Anything else aborts. */
#include "strata/task.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond)
{
    if (!cond)
        abort();
}

static int same_task(const strata_task *a, const strata_task *b)
{
    if (a->round != b->round || a->total_rounds != b->total_rounds ||
        a->model_version != b->model_version || a->deadline_unix_ms != b->deadline_unix_ms ||
        a->num_layers != b->num_layers || a->num_candidates != b->num_candidates ||
        a->seed != b->seed)
        return 0;
    const strata_task_train *x = &a->train, *y = &b->train;
    if (x->epochs != y->epochs || x->batch != y->batch || x->lr != y->lr ||
        x->momentum != y->momentum || x->weight_decay != y->weight_decay ||
        x->prox_mu != y->prox_mu || x->max_steps != y->max_steps)
        return 0;
    for (size_t i = 0; i < a->num_layers; i++) {
        const strata_budget *p = &a->budgets[i], *q = &b->budgets[i];
        if (strcmp(a->layer_names[i], b->layer_names[i]) != 0 || p->comp != q->comp ||
            p->density != q->density || p->levels != q->levels || p->rank != q->rank ||
            p->values != q->values)
            return 0;
    }
    for (size_t i = 0; i < a->num_candidates; i++) {
        const strata_budget *p = &a->candidates[i], *q = &b->candidates[i];
        if (p->comp != q->comp || p->density != q->density || p->levels != q->levels ||
            p->rank != q->rank || p->values != q->values)
            return 0;
    }
    return 1;
}

static int is_zero(const strata_task *t)
{
    static const strata_task zero;
    return memcmp(t, &zero, sizeof(zero)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const strata_task_limits lim = {.max_bytes = 1 << 16, .max_layers = 1024};
    strata_task t;
    memset(&t, 0xa5, sizeof(t));
    strata_diag diag;
    int rc = strata_task_decode((const char *)data, size, &lim, &t, &diag);
    if (rc < 0) {
        check((rc == STRATA_EPROTO || rc == STRATA_ETOOBIG) && diag.msg[0] != '\0' && is_zero(&t));
        return 0;
    }
    check(rc == STRATA_OK);
    char *json = NULL, *again = NULL;
    size_t len = 0, again_len = 0;
    check(strata_task_encode(&t, &json, &len, NULL) == STRATA_OK);
    strata_task u;
    check(strata_task_decode(json, len, NULL, &u, NULL) == STRATA_OK);
    check(same_task(&t, &u));
    check(strata_task_encode(&u, &again, &again_len, NULL) == STRATA_OK);
    check(again_len == len && memcmp(json, again, len) == 0);
    free(again);
    free(json);
    strata_task_cleanup(&u);
    strata_task_cleanup(&t);
    check(is_zero(&t));
    return 0;
}
