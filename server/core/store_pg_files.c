/* The PostgreSQL backend's files: a model version's checkpoint, server
 * optimiser state, server model and delta, stored by strata__pg_files_put
 * (in the checkpoint record's transaction) in chunks of
 * STRATA_STORE_FILE_CHUNK bytes with their size and SHA-256, fetched into
 * the state directory (the cache) one chunk at a time, and removed. A file
 * is never held whole in memory: one chunk is. */
#include "store_pg.h"

#include "strata/fileio.h"
#include "strata/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const strata_store_file KINDS[] = {
    STRATA_STORE_FILE_CHECKPOINT,
    STRATA_STORE_FILE_SERVER_OPT,
    STRATA_STORE_FILE_SERVER_MODEL,
    STRATA_STORE_FILE_DELTA,
};

/* Reads up to n bytes (fewer only at the end of the file). */
static ssize_t read_full(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -1;
        if (k == 0)
            break;
        got += (size_t)k;
    }
    return (ssize_t)got;
}

/* Stores one file (already known to exist at path) in the open transaction. */
static int put_one(pg_store *s, strata_store_file kind, uint64_t version, const char *path,
                   uint8_t *buf, strata_diag *diag)
{
    pg_params key = {.n = 0};
    strata__pg_int(&key, kind);
    strata__pg_int(&key, (int64_t)version);
    int rc = strata__pg_exec(s, P_FILE_DELETE, &key, "replace a file", diag);
    if (rc == STRATA_OK)
        rc = strata__pg_exec(s, P_FILE_CHUNKS_DELETE, &key, "replace a file", diag);
    if (rc < 0)
        return rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "open %s: %s", path, strerror(errno));
    strata_sha256_ctx h;
    strata_sha256_init(&h);
    int64_t total = 0, chunks = 0;
    for (;;) {
        ssize_t n = read_full(fd, buf, STRATA_STORE_FILE_CHUNK);
        if (n < 0) {
            rc = strata_diag_set(diag, STRATA_EIO, "read %s: %s", path, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        strata_sha256_update(&h, buf, (size_t)n);
        pg_params p = key;
        strata__pg_int(&p, chunks);
        strata__pg_bytes(&p, buf, (size_t)n);
        if ((rc = strata__pg_exec(s, P_FILE_CHUNK_INSERT, &p, "store a file's chunk", diag)) < 0)
            break;
        total += n;
        chunks++;
    }
    close(fd);
    if (rc < 0)
        return rc;
    uint8_t digest[STRATA_SHA256_LEN];
    strata_sha256_final(&h, digest);
    pg_params p = key;
    strata__pg_int(&p, total);
    strata__pg_bytes(&p, digest, sizeof(digest));
    strata__pg_int(&p, chunks);
    return strata__pg_exec(s, P_FILE_HEAD, &p, "store a file", diag);
}

int strata__pg_files_put(pg_store *s, uint64_t version, strata_diag *diag)
{
    uint8_t *buf = NULL;
    int rc = STRATA_OK;
    for (size_t i = 0; rc == STRATA_OK && i < sizeof(KINDS) / sizeof(KINDS[0]); i++) {
        char path[4096];
        struct stat st;
        if ((rc = strata_store_path(s->base.dir, KINDS[i], version, 0, path, sizeof(path), diag)) <
            0)
            break;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (buf == NULL && (buf = malloc(STRATA_STORE_FILE_CHUNK)) == NULL)
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        else
            rc = put_one(s, KINDS[i], version, path, buf, diag);
    }
    free(buf);
    return rc;
}

/* Whether the file at path has `bytes` bytes and that SHA-256. */
static int cache_matches(const char *path, int64_t bytes, const uint8_t *sha, uint8_t *buf)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != bytes)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    strata_sha256_ctx h;
    strata_sha256_init(&h);
    ssize_t n;
    while ((n = read_full(fd, buf, STRATA_STORE_FILE_CHUNK)) > 0)
        strata_sha256_update(&h, buf, (size_t)n);
    close(fd);
    uint8_t got[STRATA_SHA256_LEN];
    strata_sha256_final(&h, got);
    return n == 0 && memcmp(got, sha, sizeof(got)) == 0;
}

/* Writes the stored file's chunks to fd; checks their total and hash. */
static int download(pg_store *s, const pg_params *key, int64_t bytes, const uint8_t *sha,
                    int64_t chunks, int fd, const char *path, strata_diag *diag)
{
    strata_sha256_ctx h;
    strata_sha256_init(&h);
    int64_t total = 0;
    int rc = STRATA_OK;
    for (int64_t c = 0; rc == STRATA_OK && c < chunks; c++) {
        pg_params p = *key;
        strata__pg_int(&p, c);
        PGresult *r = strata__pg_run(s, P_FILE_CHUNK_GET, &p, 1, 1, "read a file's chunk", diag);
        if (r == NULL)
            return STRATA_EIO;
        if (PQntuples(r) != 1) {
            rc = strata_diag_set(diag, STRATA_EIO,
                                 "%s: chunk %" PRId64 " of %" PRId64 " is missing in the database",
                                 path, c, chunks);
        } else {
            size_t n = (size_t)PQgetlength(r, 0, 0);
            strata_sha256_update(&h, PQgetvalue(r, 0, 0), n);
            rc = strata_file_write_all(fd, PQgetvalue(r, 0, 0), n, diag);
            total += (int64_t)n;
        }
        PQclear(r);
    }
    uint8_t got[STRATA_SHA256_LEN];
    strata_sha256_final(&h, got);
    if (rc == STRATA_OK && (total != bytes || memcmp(got, sha, sizeof(got)) != 0))
        rc = strata_diag_set(diag, STRATA_EIO,
                             "%s: the database's chunks (%" PRId64
                             " bytes) differ from the file it recorded (%" PRId64 " bytes)",
                             path, total, bytes);
    if (rc == STRATA_OK && fsync(fd) != 0)
        rc = strata_diag_set(diag, STRATA_EIO, "fsync %s: %s", path, strerror(errno));
    return rc;
}

int strata__pg_file_fetch(strata_store *base, strata_store_file kind, uint64_t version,
                          const char *path, int *found, strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    pg_params key = {.n = 0};
    strata__pg_int(&key, kind);
    strata__pg_int(&key, (int64_t)version);
    PGresult *r = strata__pg_run(s, P_FILE_GET, &key, 0, 1, "look up a file", diag);
    if (r == NULL)
        return STRATA_EIO;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STRATA_OK; /* *found = 0 */
    }
    int64_t bytes = strata__pg_col_int(r, 0, 0), chunks = strata__pg_col_int(r, 0, 2);
    uint8_t sha[STRATA_SHA256_LEN];
    int bad = strata__pg_col_bytes(r, 0, 1, sha, sizeof(sha));
    PQclear(r);
    if (bad)
        return strata_diag_set(diag, STRATA_EIO, "%s: the database's record has no valid hash",
                               path);
    uint8_t *buf = malloc(STRATA_STORE_FILE_CHUNK);
    if (buf == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = STRATA_OK;
    if (!cache_matches(path, bytes, sha, buf)) {
        char tmp[4200];
        snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) {
            rc = strata_diag_set(diag, STRATA_EIO, "open %s: %s", tmp, strerror(errno));
        } else {
            rc = download(s, &key, bytes, sha, chunks, fd, path, diag);
            if (close(fd) != 0 && rc == STRATA_OK)
                rc = strata_diag_set(diag, STRATA_EIO, "close %s: %s", tmp, strerror(errno));
            if (rc == STRATA_OK && rename(tmp, path) != 0)
                rc = strata_diag_set(diag, STRATA_EIO, "rename %s: %s", tmp, strerror(errno));
            if (rc < 0)
                unlink(tmp);
        }
        if (rc == STRATA_OK) {
            char dir[4096];
            snprintf(dir, sizeof(dir), "%s", path);
            char *slash = strrchr(dir, '/');
            if (slash != NULL) {
                *slash = '\0';
                rc = strata_file_fsync_dir(dir, diag);
            }
        }
    }
    free(buf);
    if (rc == STRATA_OK)
        *found = 1;
    return rc;
}

int strata__pg_file_remove(strata_store *base, strata_store_file kind, uint64_t version,
                           strata_diag *diag)
{
    pg_store *s = (pg_store *)base;
    int rc = strata__pg_tx_begin(s, diag);
    if (rc < 0)
        return rc;
    pg_params key = {.n = 0};
    strata__pg_int(&key, kind);
    strata__pg_int(&key, (int64_t)version);
    rc = strata__pg_exec(s, P_FILE_DELETE, &key, "remove a file", diag);
    if (rc == STRATA_OK)
        rc = strata__pg_exec(s, P_FILE_CHUNKS_DELETE, &key, "remove a file", diag);
    return strata__pg_tx_end(s, rc, diag);
}
