/* The SQLite backend's migration of schema 2 to 3: payload bodies move from
 * one file per update (updates/<round>/<client>.bin) into the payloads
 * table. Runs once, in the transaction that raises the schema version, so
 * that a crash leaves either the old layout or the new one. */
#include "store_sqlite.h"

#include "strata/fileio.h"
#include "strata/hash.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Checks one update's file against its row and inserts it as the payload
 * of row seq (ins is bound and stepped here). */
static int migrate_one(sq_store *s, sqlite3_stmt *ins, int64_t seq, uint32_t round, uint64_t client,
                       uint64_t bytes, const void *sha, strata_diag *diag)
{
    char path[4096];
    int rc = strata_store_path(s->base.dir, STRATA_STORE_FILE_UPDATE, round, client, path,
                               sizeof(path), diag);
    if (rc < 0)
        return rc;
    uint8_t *data = NULL;
    size_t len = 0;
    rc = strata_file_read_all(path, (size_t)STRATA_STORE_PAYLOAD_MAX, &data, &len, diag);
    if (rc < 0)
        return strata_diag_set(diag, STRATA_EIO,
                               "migrating %s/state.db to schema 3: the update of client %" PRIu64
                               " for round %" PRIu32 " cannot be read (%s); restore the file or "
                               "keep running the older version",
                               s->base.dir, client, round, path);
    uint8_t h[STRATA_STORE_HASH_LEN];
    strata_sha256(data, len, h);
    if (len != bytes || sha == NULL || memcmp(h, sha, sizeof(h)) != 0) {
        free(data);
        return strata_diag_set(diag, STRATA_EIO,
                               "migrating %s/state.db to schema 3: %s differs from the "
                               "acknowledged update (length or SHA-256)",
                               s->base.dir, path);
    }
    sqlite3_bind_int64(ins, 1, seq);
    sqlite3_bind_blob64(ins, 2, data, len, SQLITE_STATIC);
    int step = sqlite3_step(ins);
    rc = step == SQLITE_DONE ? STRATA_OK : strata__store_db_error(s, diag, "migrate payload");
    sqlite3_reset(ins);
    sqlite3_clear_bindings(ins);
    free(data);
    return rc;
}

int strata__store_migrate_payload_files(sq_store *s, strata_diag *diag)
{
    sqlite3_stmt *list = NULL, *ins = NULL;
    int rc = STRATA_OK;
    if (sqlite3_prepare_v2(s->db, "SELECT seq, round, client_id, bytes, sha256 FROM updates", -1,
                           &list, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db, "INSERT INTO payloads(seq, body) VALUES(?1, ?2)", -1, &ins,
                           NULL) != SQLITE_OK) {
        rc = strata__store_db_error(s, diag, "migrate payloads: prepare");
        goto out;
    }
    int step;
    while (rc == STRATA_OK && (step = sqlite3_step(list)) == SQLITE_ROW)
        rc = migrate_one(
            s, ins, sqlite3_column_int64(list, 0), (uint32_t)sqlite3_column_int64(list, 1),
            (uint64_t)sqlite3_column_int64(list, 2), (uint64_t)sqlite3_column_int64(list, 3),
            sqlite3_column_blob(list, 4), diag);
    if (rc == STRATA_OK && step != SQLITE_DONE)
        rc = strata__store_db_error(s, diag, "migrate payloads: list updates");
out:
    sqlite3_finalize(list);
    sqlite3_finalize(ins);
    return rc;
}

/* Removes the files of one directory (not recursive) and the directory. */
static void remove_dir_files(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    rmdir(path);
}

void strata__store_remove_payload_files(const sq_store *s)
{
    char path[4096], sub[4400];
    if (strata_store_path(s->base.dir, STRATA_STORE_FILE_UPDATES, 0, 0, path, sizeof(path), NULL) <
        0)
        return;
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        remove_dir_files(sub);
    }
    closedir(d);
    rmdir(path);
    strata_file_fsync_dir(s->base.dir, NULL);
}
