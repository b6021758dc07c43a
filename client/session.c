/* The client's session with the coordinator: registration and the task
 * long-poll (see session.h). */
#include "session.h"

#include "strata/log.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int strata_client_session_register(strata_http *h, strata_client_state *st, const char *server,
                                   const char *name, const char *secret, strata_client_identity *id)
{
    memset(id, 0, sizeof(*id));
    strata_http_response r = {0};
    strata_diag d = {{0}};
    char *body = NULL;
    json_t *req = NULL, *j = NULL;
    /* One registration id for every attempt: a repeat after a lost answer
     * gets the same client (with a new token). */
    char reg[STRATA_CLIENT_REGISTRATION_LEN + 1];
    int rc = strata_client_state_registration_id(st, reg, &d);
    if (rc < 0) {
        strata_log_error("registration id: %s", strata_diag_msg(&d, rc));
        return rc;
    }
    rc = STRATA_ENOMEM;
    req = json_pack("{s:s}", "registration_id", reg);
    if (req == NULL || (name && json_object_set_new(req, "name", json_string(name)) != 0) ||
        (secret && json_object_set_new(req, "enrolment_secret", json_string(secret)) != 0) ||
        (body = json_dumps(req, JSON_COMPACT)) == NULL)
        goto out;
    rc = strata_http_request_retry(h, "POST", "/v1/clients", "application/json",
                                   (const uint8_t *)body, strlen(body), NULL, 0,
                                   STRATA_CLIENT_MAX_JSON, 0, 30.0, &r, &d);
    if (rc < 0) {
        strata_log_error("registration failed: %s", strata_diag_msg(&d, rc));
        goto out;
    }
    j = r.status == 201 || r.status == 200
            ? json_loadb((const char *)r.body, r.len, JSON_REJECT_DUPLICATES, NULL)
            : NULL;
    const char *tok = json_string_value(json_object_get(j, "token"));
    json_t *cid = json_object_get(j, "client_id");
    if (tok == NULL || strlen(tok) >= sizeof(id->token) || !json_is_integer(cid)) {
        strata_log_error("registration refused (HTTP %ld): %s", r.status,
                         r.body ? (char *)r.body : "");
        rc = STRATA_EPROTO;
        goto out;
    }
    if (strata_client_identity_share(j, id) < 0) {
        strata_log_error("registration answer (HTTP %ld): a malformed data_share or data_shares",
                         r.status);
        rc = STRATA_EPROTO;
        goto out;
    }
    id->client_id = json_integer_value(cid);
    snprintf(id->token, sizeof(id->token), "%s", tok);
    if ((rc = strata_client_state_save_identity(st, id, server, &d)) < 0)
        strata_log_error("cannot save the identity: %s", strata_diag_msg(&d, rc));
out:
    if (rc < 0)
        memset(id, 0, sizeof(*id));
    json_decref(j);
    json_decref(req);
    free(body);
    strata_http_response_cleanup(&r);
    return rc;
}

int strata_client_session_poll(strata_http *h, long wait_s, strata_client_poll *outcome,
                               strata_task *task, double *retry_after)
{
    *outcome = STRATA_CLIENT_POLL_NONE;
    memset(task, 0, sizeof(*task));
    *retry_after = 0;
    char path[64];
    snprintf(path, sizeof(path), "/v1/tasks/next?wait=%ld", wait_s);
    strata_http_response r;
    strata_diag d = {{0}};
    int rc = strata_http_request_retry(h, "GET", path, NULL, NULL, 0, NULL, 0,
                                       STRATA_CLIENT_MAX_JSON, 0, 30.0, &r, &d);
    if (rc < 0) {
        if (rc != STRATA_ESTATE)
            strata_log_error("polling failed: %s", strata_diag_msg(&d, rc));
        return rc;
    }
    switch (r.status) {
    case 200:
        rc = strata_task_decode((const char *)r.body, r.len, NULL, task, &d);
        if (rc < 0)
            strata_log_error("bad task: %s", strata_diag_msg(&d, rc));
        else
            *outcome = STRATA_CLIENT_POLL_TASK;
        break;
    case 204:
        *retry_after = r.retry_after >= 0 ? r.retry_after : 1.0;
        break;
    case 401:
        *outcome = STRATA_CLIENT_POLL_UNKNOWN;
        break;
    case 410:
        *outcome = STRATA_CLIENT_POLL_FINISHED;
        break;
    default:
        strata_log_error("task request refused (HTTP %ld): %s", r.status, (char *)r.body);
        rc = STRATA_EPROTO;
        break;
    }
    strata_http_response_cleanup(&r);
    return rc;
}
