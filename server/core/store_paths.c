/* Every path of the state directory, composed here and nowhere else (see
 * strata_store_path in store.h; docs/operations.md lists them). */
#include "store.h"

#include "strata/error.h"

#include <inttypes.h>
#include <stdio.h>

int strata_store_path(const char *state_dir, strata_store_file file, uint64_t a, uint64_t b,
                      char *buf, size_t len, strata_diag *diag)
{
    if (state_dir == NULL || buf == NULL || len == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "state path: NULL argument");
    buf[0] = '\0';
    int n;
    switch (file) {
    case STRATA_STORE_FILE_DB:
        n = snprintf(buf, len, "%s/state.db", state_dir);
        break;
    case STRATA_STORE_FILE_LOCK:
        n = snprintf(buf, len, "%s/lock", state_dir);
        break;
    case STRATA_STORE_FILE_UPDATES:
        n = snprintf(buf, len, "%s/updates", state_dir);
        break;
    case STRATA_STORE_FILE_ROUND_UPDATES:
        n = snprintf(buf, len, "%s/updates/%" PRIu64, state_dir, a);
        break;
    case STRATA_STORE_FILE_UPDATE:
        n = snprintf(buf, len, "%s/updates/%" PRIu64 "/%" PRIu64 ".bin", state_dir, a, b);
        break;
    case STRATA_STORE_FILE_CHECKPOINTS:
        n = snprintf(buf, len, "%s/checkpoints", state_dir);
        break;
    case STRATA_STORE_FILE_CHECKPOINT:
        n = snprintf(buf, len, "%s/checkpoints/model-%" PRIu64 ".safetensors", state_dir, a);
        break;
    case STRATA_STORE_FILE_SERVER_OPT:
        n = snprintf(buf, len, "%s/checkpoints/server-opt-%" PRIu64 ".safetensors", state_dir, a);
        break;
    case STRATA_STORE_FILE_SERVER_MODEL:
        n = snprintf(buf, len, "%s/checkpoints/server-model-%" PRIu64 ".safetensors", state_dir, a);
        break;
    case STRATA_STORE_FILE_DELTA:
        n = snprintf(buf, len, "%s/checkpoints/delta-%" PRIu64 ".bin", state_dir, a);
        break;
    case STRATA_STORE_FILE_ADMIN_TOKEN:
        n = snprintf(buf, len, "%s/admin.token", state_dir);
        break;
    default:
        return strata_diag_set(diag, STRATA_EINVAL, "state path: unknown file %d", (int)file);
    }
    if (n < 0 || (size_t)n >= len) {
        buf[0] = '\0';
        return strata_diag_set(diag, STRATA_ETOOBIG, "state path under %s is too long", state_dir);
    }
    return STRATA_OK;
}
