/* The store's interface (store.h) over its backends (store_backend.h): each
 * call checks what needs no stored state, zeroes its out-parameters and
 * hands the rest to the handle's operations table. What every backend
 * would do the same way lives here once: the checkpoint paths, the
 * recovery of temporary files, and freeing rounds and lists; the updates'
 * share (prepared updates, put and single commit as group commits of one)
 * lives in store_updates.c. */
#include "store_backend.h"

#include "strata/fileio.h"
#include "strata/hash.h"

#include <jansson.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- Helpers for the backends ------------------------------------------- */

void strata__store_diag_clear(strata_diag *diag)
{
    if (diag != NULL)
        diag->msg[0] = '\0';
}

int64_t strata__store_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int strata__store_make_dir(const char *path, int *created, strata_diag *diag)
{
    *created = 0;
    if (mkdir(path, 0700) == 0) {
        *created = 1;
        return STRATA_OK;
    }
    struct stat st;
    if (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return STRATA_OK;
    return strata_diag_set(diag, STRATA_EIO, "mkdir %s: %s", path, strerror(errno));
}

int strata__store_lock_dir(const char *state_dir, int *lock_fd, strata_diag *diag)
{
    char path[4096];
    int created, any = 0, rc = strata__store_make_dir(state_dir, &created, diag);
    if (rc < 0)
        return rc;
    any |= created;
    rc =
        strata_store_path(state_dir, STRATA_STORE_FILE_CHECKPOINTS, 0, 0, path, sizeof(path), diag);
    if (rc == 0)
        rc = strata__store_make_dir(path, &created, diag);
    if (rc < 0)
        return rc;
    any |= created;
    if (any && (rc = strata_file_fsync_dir(state_dir, diag)) < 0)
        return rc;
    if ((rc = strata_store_path(state_dir, STRATA_STORE_FILE_LOCK, 0, 0, path, sizeof(path),
                                diag)) < 0)
        return rc;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if (errno == EWOULDBLOCK)
            rc = strata_diag_set(diag, STRATA_ESTATE,
                                 "state directory %s is in use by another store", state_dir);
        else
            rc = strata_diag_set(diag, STRATA_EIO, "lock %s: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    *lock_fd = fd;
    return STRATA_OK;
}

int strata__store_recover_files(strata_store *s, strata_diag *diag)
{
    char path[4096];
    int rc =
        strata_store_path(s->dir, STRATA_STORE_FILE_CHECKPOINTS, 0, 0, path, sizeof(path), diag);
    if (rc < 0)
        return rc;
    DIR *d = opendir(path);
    if (d == NULL)
        return strata_diag_set(diag, STRATA_EIO, "opendir %s: %s", path, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, ".tmp.") != NULL && unlinkat(dirfd(d), e->d_name, 0) == 0)
            s->recovered++;
    }
    closedir(d);
    return STRATA_OK;
}

int strata__store_enter(const strata_store *s, const char *what, strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (s == NULL || s->ops == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "%s: NULL store", what);
    return STRATA_OK;
}

/* STRATA_EINVAL unless json is NULL or one valid JSON value. */
static int json_ok(const char *json, const char *what, strata_diag *diag)
{
    if (json == NULL)
        return STRATA_OK;
    json_error_t err;
    json_t *j = json_loads(json, JSON_DECODE_ANY, &err);
    if (j == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "%s is not valid JSON: %s", what, err.text);
    json_decref(j);
    return STRATA_OK;
}

/* STRATA_EINVAL unless name is 1 to STRATA_STORE_COUNTER_NAME_MAX bytes of
 * printable ASCII without spaces. */
static int counter_name_ok(const char *name, strata_diag *diag)
{
    if (name == NULL || name[0] == '\0')
        return strata_diag_set(diag, STRATA_EINVAL, "counter name is empty");
    size_t n = strlen(name);
    if (n > STRATA_STORE_COUNTER_NAME_MAX)
        return strata_diag_set(diag, STRATA_EINVAL, "counter name longer than %d bytes",
                               STRATA_STORE_COUNTER_NAME_MAX);
    for (size_t i = 0; i < n; i++) {
        if (name[i] < 0x21 || name[i] > 0x7e)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "counter name contains a byte that is not printable ASCII");
    }
    return STRATA_OK;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- Opening and closing ------------------------------------------------ */

int strata_store_open_secondary(const strata_store *primary, strata_store **out, strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    int rc = strata__store_enter(primary, "store open secondary", diag);
    if (rc < 0)
        return rc;
    if (out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "store open secondary: NULL argument");
    return primary->ops->open_secondary(primary, out, diag);
}

void strata_store_close(strata_store *s)
{
    if (s != NULL)
        s->ops->close(s);
}

const char *strata_store_dir(const strata_store *s)
{
    return s != NULL ? s->dir : NULL;
}

const char *strata_store_backend(const strata_store *s)
{
    return s != NULL ? s->ops->name : NULL;
}

size_t strata_store_recovered_files(const strata_store *s)
{
    return s != NULL ? s->recovered : 0;
}

/* ---- Clients ------------------------------------------------------------ */

int strata_store_client_add(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                            const char *name, const char *registration_id, uint64_t *client_id,
                            int *existed, strata_diag *diag)
{
    if (client_id != NULL)
        *client_id = 0;
    if (existed != NULL)
        *existed = 0;
    int rc = strata__store_enter(s, "client add", diag);
    if (rc < 0)
        return rc;
    if (token_hash == NULL || client_id == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client add: NULL argument");
    if (name == NULL)
        name = "";
    size_t nlen = strlen(name);
    if (nlen > STRATA_STORE_NAME_MAX)
        return strata_diag_set(diag, STRATA_EINVAL, "client name longer than %d bytes",
                               STRATA_STORE_NAME_MAX);
    for (size_t i = 0; i < nlen; i++) {
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return strata_diag_set(diag, STRATA_EINVAL, "client name contains a control character");
    }
    if (registration_id != NULL &&
        (registration_id[0] == '\0' || strlen(registration_id) > STRATA_STORE_REGISTRATION_MAX))
        return strata_diag_set(diag, STRATA_EINVAL, "registration id: 1 to %d bytes",
                               STRATA_STORE_REGISTRATION_MAX);
    return s->ops->client_add(s, token_hash, name, registration_id, client_id, existed, diag);
}

int strata_store_registration_find(strata_store *s, const char *registration_id,
                                   uint64_t *client_id, int *found, strata_diag *diag)
{
    if (client_id != NULL)
        *client_id = 0;
    if (found != NULL)
        *found = 0;
    int rc = strata__store_enter(s, "registration find", diag);
    if (rc < 0)
        return rc;
    if (registration_id == NULL || client_id == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "registration find: NULL argument");
    return s->ops->registration_find(s, registration_id, client_id, found, diag);
}

int strata_store_client_find(strata_store *s, const uint8_t token_hash[STRATA_STORE_HASH_LEN],
                             strata_store_client *out, int *found, strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (found != NULL)
        *found = 0;
    int rc = strata__store_enter(s, "client find", diag);
    if (rc < 0)
        return rc;
    if (token_hash == NULL || out == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client find: NULL argument");
    return s->ops->client_find(s, token_hash, out, found, diag);
}

int strata_store_client_get(strata_store *s, uint64_t client_id, strata_store_client *out,
                            int *found, strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (found != NULL)
        *found = 0;
    int rc = strata__store_enter(s, "client get", diag);
    if (rc < 0)
        return rc;
    if (out == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client get: NULL argument");
    return s->ops->client_get(s, client_id, out, found, diag);
}

int strata_store_client_count(strata_store *s, uint64_t *count, strata_diag *diag)
{
    if (count != NULL)
        *count = 0;
    int rc = strata__store_enter(s, "client count", diag);
    if (rc < 0)
        return rc;
    if (count == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "client count: NULL argument");
    return s->ops->client_count(s, count, diag);
}

int strata_store_clients_seen(strata_store *s, const uint64_t *ids, const int64_t *seen_ms,
                              size_t n, strata_diag *diag)
{
    int rc = strata__store_enter(s, "clients seen", diag);
    if (rc < 0)
        return rc;
    if (n > 0 && (ids == NULL || seen_ms == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "clients seen: NULL argument");
    return n == 0 ? STRATA_OK : s->ops->clients_seen(s, ids, seen_ms, n, diag);
}

/* ---- Rounds ------------------------------------------------------------- */

void strata_store_round_cleanup(strata_store_round *r)
{
    if (r == NULL)
        return;
    free(r->selected);
    free(r->task_json);
    free(r->summary_json);
    memset(r, 0, sizeof(*r));
}

void strata_store_round_list_free(strata_store_round *rounds, size_t n)
{
    if (rounds == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        strata_store_round_cleanup(&rounds[i]);
    free(rounds);
}

int strata_store_round_open(strata_store *s, uint32_t round, uint64_t model_version,
                            const uint64_t *selected, size_t n, int64_t deadline_unix_ms,
                            const char *task_json, strata_diag *diag)
{
    int rc = strata__store_enter(s, "round open", diag);
    if (rc < 0)
        return rc;
    if (selected == NULL && n > 0)
        return strata_diag_set(diag, STRATA_EINVAL, "round open: NULL argument");
    if (n == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "round %" PRIu32 ": no client selected", round);
    if (!FITS_I64(model_version))
        return strata_diag_set(diag, STRATA_EINVAL, "model version %" PRIu64 " is too large",
                               model_version);
    if (n > SIZE_MAX / sizeof(uint64_t))
        return strata_diag_set(diag, STRATA_EINVAL, "too many selected clients");
    if ((rc = json_ok(task_json, "task", diag)) < 0)
        return rc;
    uint64_t *sorted = malloc(n * sizeof(*sorted));
    if (sorted == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    memcpy(sorted, selected, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), cmp_u64);
    for (size_t i = 1; i < n && rc == STRATA_OK; i++) {
        if (sorted[i] == sorted[i - 1])
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "round %" PRIu32 ": client %" PRIu64 " selected twice", round,
                                 sorted[i]);
    }
    if (rc == STRATA_OK)
        rc = s->ops->round_open(s, round, model_version, sorted, n, deadline_unix_ms, task_json,
                                diag);
    free(sorted);
    return rc;
}

int strata_store_round_get(strata_store *s, uint32_t round, strata_store_round *out, int *found,
                           strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (found != NULL)
        *found = 0;
    int rc = strata__store_enter(s, "round get", diag);
    if (rc < 0)
        return rc;
    if (out == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "round get: NULL argument");
    return s->ops->round_get(s, round, out, found, diag);
}

int strata_store_round_close(strata_store *s, uint32_t round, const char *summary_json,
                             strata_diag *diag)
{
    int rc = strata__store_enter(s, "round close", diag);
    if (rc == STRATA_OK)
        rc = json_ok(summary_json, "round summary", diag);
    return rc < 0 ? rc : s->ops->round_close(s, round, summary_json, diag);
}

int strata_store_round_seal(strata_store *s, uint32_t round, strata_diag *diag)
{
    int rc = strata__store_enter(s, "round seal", diag);
    return rc < 0 ? rc : s->ops->round_seal(s, round, diag);
}

int strata_store_last_round(strata_store *s, uint32_t *round, int *found, strata_diag *diag)
{
    if (round != NULL)
        *round = 0;
    if (found != NULL)
        *found = 0;
    int rc = strata__store_enter(s, "last round", diag);
    if (rc < 0)
        return rc;
    if (round == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "last round: NULL argument");
    return s->ops->last_round(s, round, found, diag);
}

int strata_store_round_list(strata_store *s, uint32_t from, size_t limit, strata_store_round **out,
                            size_t *n, strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (n != NULL)
        *n = 0;
    int rc = strata__store_enter(s, "round list", diag);
    if (rc < 0)
        return rc;
    if (out == NULL || n == NULL || limit == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "round list: NULL argument or zero limit");
    return s->ops->round_list(s, from, limit, out, n, diag);
}

/* ---- Checkpoints -------------------------------------------------------- */

int strata_store_checkpoint_path(const strata_store *s, uint64_t model_version, char *buf,
                                 size_t len, strata_diag *diag)
{
    strata__store_diag_clear(diag);
    if (s == NULL || buf == NULL || len == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "checkpoint path: NULL argument");
    return strata_store_path(s->dir, STRATA_STORE_FILE_CHECKPOINT, model_version, 0, buf, len,
                             diag);
}

int strata_store_checkpoint_record(strata_store *s, uint64_t model_version, strata_diag *diag)
{
    int rc = strata__store_enter(s, "checkpoint record", diag);
    if (rc < 0)
        return rc;
    if (!FITS_I64(model_version))
        return strata_diag_set(diag, STRATA_EINVAL, "model version %" PRIu64 " is too large",
                               model_version);
    char path[4096];
    rc = strata_store_checkpoint_path(s, model_version, path, sizeof(path), diag);
    if (rc < 0)
        return rc;
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode))
        return strata_diag_set(diag, STRATA_ESTATE, "checkpoint %s does not exist", path);
    return s->ops->checkpoint_record(s, model_version, (uint64_t)st.st_size, diag);
}

int strata_store_latest_model_version(strata_store *s, uint64_t *model_version, int *found,
                                      strata_diag *diag)
{
    if (model_version != NULL)
        *model_version = 0;
    if (found != NULL)
        *found = 0;
    int rc = strata__store_enter(s, "latest model version", diag);
    if (rc < 0)
        return rc;
    if (model_version == NULL || found == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "latest model version: NULL argument");
    return s->ops->latest_model_version(s, model_version, found, diag);
}

/* ---- Counters ----------------------------------------------------------- */

int strata_store_counter_add_many(strata_store *s, const strata_store_counter *deltas, size_t n,
                                  strata_diag *diag)
{
    int rc = strata__store_enter(s, "counter add", diag);
    if (rc < 0)
        return rc;
    if (deltas == NULL && n > 0)
        return strata_diag_set(diag, STRATA_EINVAL, "counter add: NULL argument");
    for (size_t i = 0; i < n; i++) {
        if (memchr(deltas[i].name, '\0', sizeof(deltas[i].name)) == NULL)
            return strata_diag_set(diag, STRATA_EINVAL, "counter name is not terminated");
        if ((rc = counter_name_ok(deltas[i].name, diag)) < 0)
            return rc;
    }
    return n == 0 ? STRATA_OK : s->ops->counter_add_many(s, deltas, n, diag);
}

int strata_store_counter_add(strata_store *s, const char *name, int64_t delta, strata_diag *diag)
{
    int rc = strata__store_enter(s, "counter add", diag);
    if (rc < 0)
        return rc;
    if ((rc = counter_name_ok(name, diag)) < 0)
        return rc;
    strata_store_counter c;
    snprintf(c.name, sizeof(c.name), "%s", name);
    c.value = delta;
    return s->ops->counter_add_many(s, &c, 1, diag);
}

int strata_store_counter_get(strata_store *s, const char *name, int64_t *value, strata_diag *diag)
{
    if (value != NULL)
        *value = 0;
    int rc = strata__store_enter(s, "counter get", diag);
    if (rc < 0)
        return rc;
    if (value == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "counter get: NULL argument");
    if ((rc = counter_name_ok(name, diag)) < 0)
        return rc;
    return s->ops->counter_get(s, name, value, diag);
}

/* ---- Leadership --------------------------------------------------------- */

int strata_store_lead(strata_store *s, const char *holder, int64_t lease_ms,
                      strata_store_leader *out, strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    int rc = strata__store_enter(s, "lead", diag);
    if (rc < 0)
        return rc;
    size_t n = holder != NULL ? strlen(holder) : 0;
    if (n == 0 || n >= sizeof(out->holder))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "lead: the holder's name must be 1 to %zu bytes",
                               sizeof(out->holder) - 1);
    for (size_t i = 0; i < n; i++)
        if (holder[i] < 0x21 || holder[i] > 0x7e)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "lead: the holder's name must be printable ASCII");
    if (lease_ms < 100 || lease_ms > 3600000)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "lead: a lease of %" PRId64 " ms is not in [100, 3600000]",
                               lease_ms);
    if (s->ops->lead == NULL) {
        if (out != NULL) {
            out->epoch = 1;
            snprintf(out->holder, sizeof(out->holder), "%s", holder);
            out->expires_in_ms = lease_ms;
        }
        return STRATA_OK;
    }
    strata_store_leader tmp;
    return s->ops->lead(s, holder, lease_ms, out != NULL ? out : &tmp, diag);
}

int strata_store_renew(strata_store *s, int64_t lease_ms, strata_diag *diag)
{
    int rc = strata__store_enter(s, "renew", diag);
    if (rc < 0)
        return rc;
    if (lease_ms < 100 || lease_ms > 3600000)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "renew: a lease of %" PRId64 " ms is not in [100, 3600000]",
                               lease_ms);
    return s->ops->renew != NULL ? s->ops->renew(s, lease_ms, diag) : STRATA_OK;
}

int strata_store_leader_get(strata_store *s, strata_store_leader *out, strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    int rc = strata__store_enter(s, "leader get", diag);
    if (rc < 0)
        return rc;
    if (out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "leader get: NULL argument");
    if (s->ops->leader_get == NULL) {
        out->epoch = 1;
        snprintf(out->holder, sizeof(out->holder), "%s", "this process");
        out->expires_in_ms = INT64_MAX;
        out->lock_held = 1;
        return STRATA_OK;
    }
    return s->ops->leader_get(s, out, diag);
}

/* ---- Change notifications ------------------------------------------------ */

int strata_store_changes_listen(strata_store *s, strata_diag *diag)
{
    int rc = strata__store_enter(s, "changes listen", diag);
    if (rc < 0)
        return rc;
    if (s->ops->changes_listen == NULL)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "the %s store sends no change notifications (one process owns it)",
                               s->ops->name);
    return s->ops->changes_listen(s, diag);
}

int strata_store_changes_wait(strata_store *s, int timeout_ms, strata_store_changes *out,
                              strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    int rc = strata__store_enter(s, "changes wait", diag);
    if (rc < 0)
        return rc;
    if (out == NULL || timeout_ms < 0 || timeout_ms > 60000)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "changes wait: NULL argument or a timeout not in [0, 60000] ms");
    if (s->ops->changes_wait == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "changes wait: the %s store does not listen",
                               s->ops->name);
    return s->ops->changes_wait(s, timeout_ms, out, diag);
}

/* ---- A version's files -------------------------------------------------- */

static int version_file(strata_store_file kind)
{
    return kind == STRATA_STORE_FILE_CHECKPOINT || kind == STRATA_STORE_FILE_SERVER_OPT ||
           kind == STRATA_STORE_FILE_SERVER_MODEL || kind == STRATA_STORE_FILE_DELTA;
}

int strata_store_file_fetch(strata_store *s, strata_store_file kind, uint64_t version, int *found,
                            strata_diag *diag)
{
    if (found != NULL)
        *found = 0;
    int rc = strata__store_enter(s, "file fetch", diag);
    if (rc < 0)
        return rc;
    if (found == NULL || !version_file(kind) || !FITS_I64(version))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "file fetch: NULL argument or not a version's "
                               "file");
    char path[4096];
    if ((rc = strata_store_path(s->dir, kind, version, 0, path, sizeof(path), diag)) < 0)
        return rc;
    if (s->ops->file_fetch != NULL)
        return s->ops->file_fetch(s, kind, version, path, found, diag);
    struct stat st;
    *found = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    return STRATA_OK;
}

int strata_store_file_remove(strata_store *s, strata_store_file kind, uint64_t version,
                             strata_diag *diag)
{
    int rc = strata__store_enter(s, "file remove", diag);
    if (rc < 0)
        return rc;
    if (!version_file(kind) || !FITS_I64(version))
        return strata_diag_set(diag, STRATA_EINVAL, "file remove: not a version's file");
    char path[4096];
    if ((rc = strata_store_path(s->dir, kind, version, 0, path, sizeof(path), diag)) < 0)
        return rc;
    if (s->ops->file_remove != NULL && (rc = s->ops->file_remove(s, kind, version, diag)) < 0)
        return rc;
    if (unlink(path) < 0 && errno != ENOENT)
        return strata_diag_set(diag, STRATA_EIO, "unlink %s: %s", path, strerror(errno));
    return STRATA_OK;
}
