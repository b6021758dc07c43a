/* The client's state directory (see state.h for what each file holds and
 * how a restarted client recovers): the only place that names its files. */
#include "state.h"

#include "strata/checkpoint.h"
#include "strata/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define F_IDENTITY "identity.json"
#define F_REGISTRATION "registration"
#define F_MODEL "model.safetensors"
#define F_MODEL_ETAG "model.etag"
#define F_RESIDUAL "residual.safetensors"
#define F_RESIDUAL_PENDING "residual.pending.safetensors"
#define F_PENDING_PAYLOAD "pending.bin"
#define F_PENDING_MARK "pending.json"
#define F_RECEIPTS "receipts.log"
#define F_RECEIPTS_OLD "receipts.log.old"

/* Largest small JSON file (identity, marker) read back. */
#define SMALL_FILE_MAX 4096
/* Bytes read from the end of the receipts log to find its last line: far
 * more than one line (a round and a receipt) can hold. */
#define RECEIPT_TAIL 4096

struct strata_client_state {
    char *dir;
    int has_last;        /* the receipts log has a last line */
    uint32_t last_round; /* its round */
};

/* Composes dir/name into buf (PATH_MAX bytes); the directory's length was
 * checked at open, and every name is short, so this cannot truncate. */
static void path_of(const strata_client_state *s, const char *name, char buf[PATH_MAX])
{
    snprintf(buf, PATH_MAX, "%s/%s", s->dir, name);
}

static int remove_file(const strata_client_state *s, const char *name, strata_diag *diag)
{
    char p[PATH_MAX];
    path_of(s, name, p);
    if (unlink(p) != 0 && errno != ENOENT)
        return strata_diag_set(diag, STRATA_EIO, "cannot remove %s: %s", p, strerror(errno));
    return STRATA_OK;
}

/* Reads the round of the receipts log's last line from its tail. */
static int load_last_receipt(strata_client_state *s, strata_diag *diag)
{
    char p[PATH_MAX], tail[RECEIPT_TAIL + 1];
    path_of(s, F_RECEIPTS, p);
    s->has_last = 0;
    s->last_round = 0;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT
                   ? STRATA_OK
                   : strata_diag_set(diag, STRATA_EIO, "cannot open %s: %s", p, strerror(errno));
    int rc = STRATA_OK;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s is not a readable file", p);
        goto out;
    }
    off_t from = st.st_size > RECEIPT_TAIL ? st.st_size - RECEIPT_TAIL : 0;
    ssize_t n = pread(fd, tail, (size_t)(st.st_size - from), from);
    if (n < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "cannot read %s: %s", p, strerror(errno));
        goto out;
    }
    tail[n] = '\0';
    /* The last line starts after the last newline that is not the final
     * byte (a line cut by a crash counts as the last line). */
    const char *last = tail;
    for (ssize_t i = 0; i + 1 < n; i++)
        if (tail[i] == '\n')
            last = tail + i + 1;
    unsigned long r;
    if (sscanf(last, "%lu", &r) == 1 && r <= UINT32_MAX) {
        s->has_last = 1;
        s->last_round = (uint32_t)r;
    }
out:
    close(fd);
    return rc;
}

int strata_client_state_open(const char *dir, strata_client_state **out, strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (dir == NULL || out == NULL)
        return STRATA_EINVAL;
    /* Room for "/" and the longest file name. */
    if (strlen(dir) + 1 + sizeof(F_RESIDUAL_PENDING) >= PATH_MAX)
        return strata_diag_set(diag, STRATA_EINVAL, "state directory path too long");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return strata_diag_set(diag, STRATA_EIO, "cannot create %s: %s", dir, strerror(errno));
    strata_client_state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return STRATA_ENOMEM;
    s->dir = strdup(dir);
    if (s->dir == NULL) {
        free(s);
        return STRATA_ENOMEM;
    }
    int rc = load_last_receipt(s, diag);
    if (rc < 0) {
        strata_client_state_free(s);
        return rc;
    }
    *out = s;
    return STRATA_OK;
}

void strata_client_state_free(strata_client_state *s)
{
    if (s == NULL)
        return;
    free(s->dir);
    free(s);
}

const char *strata_client_state_dir(const strata_client_state *s)
{
    return s->dir;
}

int strata_client_state_load_identity(const strata_client_state *s, strata_client_identity *id,
                                      strata_diag *diag)
{
    memset(id, 0, sizeof(*id));
    char p[PATH_MAX];
    path_of(s, F_IDENTITY, p);
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = strata_file_read_all(p, SMALL_FILE_MAX, &buf, &len, diag);
    if (rc < 0)
        return rc;
    json_t *j = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, NULL);
    free(buf);
    const char *tok = json_string_value(json_object_get(j, "token"));
    json_t *cid = json_object_get(j, "client_id");
    if (tok == NULL || strlen(tok) >= sizeof(id->token) || !json_is_integer(cid)) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "%s lacks a client_id or a token", p);
    } else if (strata_client_identity_share(j, id) < 0) {
        rc = strata_diag_set(diag, STRATA_EPROTO,
                             "%s: data_share must be 0 to data_shares-1, data_shares 1 to %d", p,
                             STRATA_CLIENT_MAX_SHARES);
    } else {
        id->client_id = json_integer_value(cid);
        snprintf(id->token, sizeof(id->token), "%s", tok);
    }
    json_decref(j);
    if (rc < 0)
        memset(id, 0, sizeof(*id));
    return rc;
}

int strata_client_identity_share(const json_t *j, strata_client_identity *id)
{
    id->data_share = id->data_shares = 0;
    json_t *k = json_object_get(j, "data_share"), *n = json_object_get(j, "data_shares");
    if (k == NULL && n == NULL)
        return STRATA_OK;
    if (!json_is_integer(k) || !json_is_integer(n) || json_integer_value(n) < 1 ||
        json_integer_value(n) > STRATA_CLIENT_MAX_SHARES || json_integer_value(k) < 0 ||
        json_integer_value(k) >= json_integer_value(n))
        return STRATA_EPROTO;
    id->data_share = (long)json_integer_value(k);
    id->data_shares = (long)json_integer_value(n);
    return STRATA_OK;
}

int strata_client_state_save_identity(const strata_client_state *s,
                                      const strata_client_identity *id, const char *server,
                                      strata_diag *diag)
{
    char p[PATH_MAX];
    path_of(s, F_IDENTITY, p);
    json_t *j = json_pack("{s:I,s:s,s:s}", "client_id", (json_int_t)id->client_id, "token",
                          id->token, "server", server ? server : "");
    if (j != NULL && id->data_shares > 0 &&
        (json_object_set_new(j, "data_share", json_integer(id->data_share)) != 0 ||
         json_object_set_new(j, "data_shares", json_integer(id->data_shares)) != 0)) {
        json_decref(j);
        j = NULL;
    }
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (text == NULL)
        return STRATA_ENOMEM;
    int rc = strata_file_write_atomic(p, text, strlen(text), 0600, diag);
    free(text);
    return rc;
}

int strata_client_state_registration_id(const strata_client_state *s,
                                        char id[STRATA_CLIENT_REGISTRATION_LEN + 1],
                                        strata_diag *diag)
{
    char p[PATH_MAX];
    path_of(s, F_REGISTRATION, p);
    size_t n = 0;
    char line[STRATA_CLIENT_REGISTRATION_LEN + 2]; /* room to tell a longer line */
    int rc = strata_file_read_line(p, line, sizeof(line), &n, diag);
    if (rc == STRATA_OK && n == STRATA_CLIENT_REGISTRATION_LEN) {
        memcpy(id, line, n + 1);
        return STRATA_OK;
    }
    if (rc < 0 && rc != STRATA_ESTATE && rc != STRATA_ETOOBIG)
        return rc;
    /* None yet (or not one of ours): a new one, durable before it is used. */
    char tok[STRATA_TOKEN_HEX + 1];
    if ((rc = strata_random_token(tok, diag)) < 0)
        return rc;
    memcpy(id, tok, STRATA_CLIENT_REGISTRATION_LEN);
    id[STRATA_CLIENT_REGISTRATION_LEN] = '\0';
    return strata_file_write_atomic(p, id, STRATA_CLIENT_REGISTRATION_LEN, 0600, diag);
}

int strata_client_state_model_etag(const strata_client_state *s, char *etag, size_t cap)
{
    if (cap == 0)
        return STRATA_EINVAL;
    etag[0] = '\0';
    char p[PATH_MAX];
    path_of(s, F_MODEL_ETAG, p);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (strata_file_read_all(p, cap - 1, &buf, &len, NULL) == STRATA_OK) {
        memcpy(etag, buf, len);
        etag[len] = '\0';
    }
    free(buf);
    return STRATA_OK;
}

int strata_client_state_save_model(const strata_client_state *s, const uint8_t *body, size_t len,
                                   const char *etag, strata_diag *diag)
{
    char p[PATH_MAX], ep[PATH_MAX];
    path_of(s, F_MODEL, p);
    path_of(s, F_MODEL_ETAG, ep);
    int rc = strata_file_write_atomic(p, body, len, 0644, diag);
    if (rc == STRATA_OK)
        rc = strata_file_write_atomic(ep, etag, strlen(etag), 0644, diag);
    return rc;
}

int strata_client_state_load_model(const strata_client_state *s, strata_model **m,
                                   strata_diag *diag)
{
    char p[PATH_MAX];
    path_of(s, F_MODEL, p);
    return strata_checkpoint_load(p, m, diag);
}

int strata_client_state_load_residuals(const strata_client_state *s,
                                       const strata_tensor_list *layout, strata_ef **ef,
                                       strata_diag *diag)
{
    *ef = NULL;
    char p[PATH_MAX];
    path_of(s, F_RESIDUAL, p);
    if (access(p, F_OK) != 0)
        return STRATA_OK;
    int rc = strata_ef_load(p, layout, ef, diag);
    if (rc < 0 && diag != NULL) {
        strata_diag d = *diag;
        strata_diag_set(diag, rc, "residuals %s: %s", p, strata_diag_msg(&d, rc));
    }
    return rc;
}

int strata_client_state_stage(const strata_client_state *s, const strata_ef *ef, uint32_t round,
                              const uint8_t *wire, size_t len, strata_diag *diag)
{
    char rp[PATH_MAX], bp[PATH_MAX], jp[PATH_MAX], mark[64];
    path_of(s, F_RESIDUAL_PENDING, rp);
    path_of(s, F_PENDING_PAYLOAD, bp);
    path_of(s, F_PENDING_MARK, jp);
    int n = snprintf(mark, sizeof(mark), "{\"round\":%u}", round);
    int rc = strata_ef_save(ef, rp, diag);
    if (rc == STRATA_OK)
        rc = strata_file_write_atomic(bp, wire, len, 0600, diag);
    if (rc == STRATA_OK)
        rc = strata_file_write_atomic(jp, mark, (size_t)n, 0600, diag);
    return rc;
}

int strata_client_state_staged(const strata_client_state *s, int *staged, uint32_t *round)
{
    if (staged == NULL || round == NULL)
        return STRATA_EINVAL;
    *staged = 0;
    *round = 0;
    char p[PATH_MAX];
    path_of(s, F_PENDING_MARK, p);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (strata_file_read_all(p, SMALL_FILE_MAX, &buf, &len, NULL) < 0)
        return STRATA_OK;
    json_t *j = json_loadb((const char *)buf, len, 0, NULL);
    free(buf);
    json_t *r = json_object_get(j, "round");
    if (json_is_integer(r) && json_integer_value(r) >= 0 &&
        json_integer_value(r) <= (json_int_t)UINT32_MAX) {
        *staged = 1;
        *round = (uint32_t)json_integer_value(r);
    } else {
        unlink(p);
    }
    json_decref(j);
    return STRATA_OK;
}

int strata_client_state_staged_payload(const strata_client_state *s, uint8_t **wire, size_t *len,
                                       strata_diag *diag)
{
    char p[PATH_MAX];
    path_of(s, F_PENDING_PAYLOAD, p);
    return strata_file_read_all(p, STRATA_CLIENT_MAX_BODY, wire, len, diag);
}

/* Appends "ROUND RECEIPT\n" to the receipts log with fsync, unless its last
 * line already records round. */
static int append_receipt(strata_client_state *s, uint32_t round, const char *receipt,
                          strata_diag *diag)
{
    if (s->has_last && s->last_round == round)
        return STRATA_OK;
    if (receipt[0] == '\0' || strpbrk(receipt, " \t\r\n") != NULL || strlen(receipt) > 200)
        return strata_diag_set(diag, STRATA_EINVAL, "receipt of round %u is not one word", round);
    char p[PATH_MAX], line[256];
    path_of(s, F_RECEIPTS, p);
    int n = snprintf(line, sizeof(line), "%u %s\n", round, receipt);
    int fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "cannot open %s: %s", p, strerror(errno));
    int rc = STRATA_OK;
    if (write(fd, line, (size_t)n) != n || fsync(fd) != 0)
        rc = strata_diag_set(diag, STRATA_EIO, "cannot append to %s: %s", p, strerror(errno));
    close(fd);
    if (rc == STRATA_OK) {
        s->has_last = 1;
        s->last_round = round;
    }
    return rc;
}

/* Keeps the first error of a sequence of steps. */
static void keep_first(int *rc, int step)
{
    if (*rc == STRATA_OK)
        *rc = step;
}

int strata_client_state_settle(strata_client_state *s, uint32_t round, const char *receipt,
                               strata_diag *diag)
{
    int rc = STRATA_OK;
    if (receipt != NULL) {
        keep_first(&rc, append_receipt(s, round, receipt, diag));
        char from[PATH_MAX], to[PATH_MAX];
        path_of(s, F_RESIDUAL_PENDING, from);
        path_of(s, F_RESIDUAL, to);
        if (rename(from, to) != 0 && errno != ENOENT)
            keep_first(&rc,
                       strata_diag_set(rc == STRATA_OK ? diag : NULL, STRATA_EIO,
                                       "cannot install the new residuals: %s", strerror(errno)));
    } else {
        keep_first(&rc, remove_file(s, F_RESIDUAL_PENDING, rc == STRATA_OK ? diag : NULL));
    }
    keep_first(&rc, remove_file(s, F_PENDING_MARK, rc == STRATA_OK ? diag : NULL));
    keep_first(&rc, remove_file(s, F_PENDING_PAYLOAD, rc == STRATA_OK ? diag : NULL));
    return rc;
}

int strata_client_state_last_receipt(const strata_client_state *s, int *present, uint32_t *round)
{
    if (present == NULL || round == NULL)
        return STRATA_EINVAL;
    *present = s->has_last;
    *round = s->has_last ? s->last_round : 0;
    return STRATA_OK;
}

int strata_client_state_reset_residuals(strata_client_state *s, strata_diag *diag)
{
    int rc = remove_file(s, F_RESIDUAL, diag);
    keep_first(&rc, remove_file(s, F_RESIDUAL_PENDING, rc == STRATA_OK ? diag : NULL));
    return rc;
}

int strata_client_state_forget(strata_client_state *s, strata_diag *diag)
{
    static const char *const federation[] = {
        F_RESIDUAL, F_RESIDUAL_PENDING, F_PENDING_PAYLOAD, F_PENDING_MARK,
        F_MODEL,    F_MODEL_ETAG,       F_REGISTRATION};
    int rc = STRATA_OK;
    for (size_t i = 0; i < sizeof(federation) / sizeof(federation[0]); i++)
        keep_first(&rc, remove_file(s, federation[i], rc == STRATA_OK ? diag : NULL));
    char from[PATH_MAX], to[PATH_MAX];
    path_of(s, F_RECEIPTS, from);
    path_of(s, F_RECEIPTS_OLD, to);
    if (rename(from, to) != 0 && errno != ENOENT)
        keep_first(&rc, strata_diag_set(rc == STRATA_OK ? diag : NULL, STRATA_EIO,
                                        "cannot move %s aside: %s", from, strerror(errno)));
    s->has_last = 0;
    s->last_round = 0;
    return rc;
}
