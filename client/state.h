/* The client's state directory: the only module that names its files.
 *
 * A strata-client keeps everything it must remember between runs in one
 * directory (--state-dir, created with mode 0700):
 *
 *   identity.json                 {"client_id":N,"token":"...","server":"URL"}
 *                                 from registration (mode 0600), with
 *                                 "data_share" and "data_shares" when the
 *                                 coordinator assigned a share; kept across
 *                                 federations of the same coordinator
 *   registration                  the registration id (random, mode 0600),
 *                                 written before the first attempt: a
 *                                 registration repeated after a lost answer
 *                                 gets the same client from the coordinator
 *   model.safetensors, model.etag the last downloaded global model and its
 *                                 ETag, revalidated with If-None-Match
 *   residual.safetensors          the error-feedback residuals after the last
 *                                 acknowledged upload
 *   residual.pending.safetensors  the residuals after the staged upload
 *   pending.bin                   the staged upload's payload bytes
 *   pending.json                  {"round":N}: written last, it marks the
 *                                 stage complete
 *   receipts.log                  one line "ROUND RECEIPT" per acknowledged
 *                                 upload, appended and fsync'ed
 *   receipts.log.old              the receipts of the previous federation,
 *                                 moved aside when the coordinator forgot us
 *
 * Recovery: an upload is staged before it is sent (pending residual, then
 * payload, then pending.json, each written durably). A restarted client
 * that finds pending.json re-sends pending.bin; the coordinator answers an
 * update it already holds with its original receipt. Only an acknowledged
 * upload appends its receipt and then renames the pending residual over the
 * current one, so an acknowledged update is never lost and no residual is
 * applied twice; a kill between the two steps re-sends, gets the same
 * receipt, and the receipt is not appended twice (the log's last round is
 * remembered). A refused upload drops the stage and keeps the residuals.
 *
 * The receipts log is never re-read whole: opening the state reads only its
 * tail (its last line) once, and receipts are appended with O_APPEND.
 *
 * A strata_client_state is used by one thread. Every function returns a
 * strata_err; diag (may be NULL) names the file at fault. */
#ifndef STRATA_CLIENT_STATE_H
#define STRATA_CLIENT_STATE_H

#include "strata/ef.h"
#include "strata/error.h"
#include "strata/model.h"
#include "strata/tensor.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Largest payload a staged upload (or a model download) may have. */
#define STRATA_CLIENT_MAX_BODY ((size_t)1 << 31)

typedef struct strata_client_state strata_client_state;

/* The client's identity at the coordinator. */
typedef struct strata_client_identity {
    long long client_id;
    char token[80];
    /* The data share the coordinator assigned (--data-shares): share
     * data_share of data_shares; data_shares 0 when it assigned none. */
    long data_share, data_shares;
} strata_client_identity;

/* Opens the state directory dir (borrowed string, copied), creating it
 * (mode 0700) when absent, and reads the last line of its receipts log.
 * *out is zeroed on entry. Errors: STRATA_EINVAL (NULL argument or a path
 * too long), STRATA_EIO (the directory cannot be created, the log cannot be
 * read), STRATA_ENOMEM. */
int strata_client_state_open(const char *dir, strata_client_state **out, strata_diag *diag);

/* Frees s. Accepts NULL. */
void strata_client_state_free(strata_client_state *s);

/* The directory's path (borrowed from s). */
const char *strata_client_state_dir(const strata_client_state *s);

/* Most data shares a coordinator may assign (the share count of
 * --num-clients). */
#define STRATA_CLIENT_MAX_SHARES 1000000

/* Reads the optional "data_share" and "data_shares" members of the JSON
 * object j (borrowed: identity.json, or the coordinator's registration
 * answer) into id's data_share and data_shares (0 and 0 when both are
 * absent). Errors: STRATA_EPROTO when only one is present or they are not
 * integers with 0 <= data_share < data_shares <= STRATA_CLIENT_MAX_SHARES
 * (id's share fields are then 0). */
int strata_client_identity_share(const json_t *j, strata_client_identity *id);

/* Loads identity.json into *id (zeroed on entry). Errors: STRATA_ESTATE
 * when there is none, STRATA_EPROTO when it is malformed (a data share
 * outside 0..data_shares-1 included), those of strata_file_read_all. */
int strata_client_state_load_identity(const strata_client_state *s, strata_client_identity *id,
                                      strata_diag *diag);

/* Saves id and the coordinator's URL server (borrowed) as identity.json,
 * durably, mode 0600. Errors: STRATA_ENOMEM, those of
 * strata_file_write_atomic. */
int strata_client_state_save_identity(const strata_client_state *s,
                                      const strata_client_identity *id, const char *server,
                                      strata_diag *diag);

/* Length of a registration id (hex characters). */
#define STRATA_CLIENT_REGISTRATION_LEN 32

/* The registration id for this state directory into id (NUL-terminated):
 * the saved one, or a new random one, saved durably (mode 0600) before it
 * is returned. Errors: STRATA_EIO (no randomness, or the file cannot be
 * written or read; diag names it). */
int strata_client_state_registration_id(const strata_client_state *s,
                                        char id[STRATA_CLIENT_REGISTRATION_LEN + 1],
                                        strata_diag *diag);

/* Copies the cached model's ETag into etag (cap bytes); "" when no model is
 * cached or its ETag does not fit. Never fails for a missing file. Errors:
 * STRATA_EINVAL (cap 0). */
int strata_client_state_model_etag(const strata_client_state *s, char *etag, size_t cap);

/* Caches a downloaded model: its safetensors bytes (borrowed) and its ETag.
 * Errors: those of strata_file_write_atomic. */
int strata_client_state_save_model(const strata_client_state *s, const uint8_t *body, size_t len,
                                   const char *etag, strata_diag *diag);

/* Loads the cached model into *m (zeroed on entry). Errors: those of
 * strata_checkpoint_load. */
int strata_client_state_load_model(const strata_client_state *s, strata_model **m,
                                   strata_diag *diag);

/* Loads the current residuals, shaped like layout (borrowed), into *ef
 * (zeroed on entry); *ef stays NULL when there are none yet. Errors: those
 * of strata_ef_load. */
int strata_client_state_load_residuals(const strata_client_state *s,
                                       const strata_tensor_list *layout, strata_ef **ef,
                                       strata_diag *diag);

/* Stages the upload of round: the residuals after it (ef, borrowed), the
 * payload (wire, borrowed) and, last, the marker. Errors: those of
 * strata_ef_save and strata_file_write_atomic (the stage is then
 * incomplete and ignored at the next start). */
int strata_client_state_stage(const strata_client_state *s, const strata_ef *ef, uint32_t round,
                              const uint8_t *wire, size_t len, strata_diag *diag);

/* Reports a complete stage: *staged 1 and its round in *round, or *staged
 * 0 (both zeroed on entry). A marker that cannot be read as a round is
 * removed. Never fails for a missing stage. Errors: STRATA_EINVAL (NULL
 * argument). */
int strata_client_state_staged(const strata_client_state *s, int *staged, uint32_t *round);

/* Reads the staged payload into *wire (free()) of *len bytes (both zeroed
 * on entry). Errors: those of strata_file_read_all. */
int strata_client_state_staged_payload(const strata_client_state *s, uint8_t **wire, size_t *len,
                                       strata_diag *diag);

/* Settles the stage of round. With a receipt (borrowed): appends
 * "ROUND RECEIPT" to the receipts log (unless its last line already is that
 * round) with fsync, then installs the pending residuals. With receipt
 * NULL (refused, or unreadable): drops the pending residuals. Either way
 * the payload and the marker are removed. Every step is tried; the first
 * error is returned (STRATA_EINVAL for a receipt that is not one word,
 * STRATA_EIO; diag says which step failed). */
int strata_client_state_settle(strata_client_state *s, uint32_t round, const char *receipt,
                               strata_diag *diag);

/* The round of the receipts log's last line in *round, with *present 1; or
 * *present 0 when the log is empty or absent (both zeroed on entry).
 * Errors: STRATA_EINVAL (NULL argument). */
int strata_client_state_last_receipt(const strata_client_state *s, int *present, uint32_t *round);

/* Removes the residuals (current and pending), so that the next round
 * starts from zero residuals. Errors: STRATA_EIO (diag names the file). */
int strata_client_state_reset_residuals(strata_client_state *s, strata_diag *diag);

/* Forgets the federation (the coordinator no longer knows us): removes
 * residuals, the stage, the cached model and the registration id, and moves
 * the receipts log to receipts.log.old. The identity file stays (it is
 * replaced on the next registration). Errors: STRATA_EIO (diag names the file; every file is
 * still tried). */
int strata_client_state_forget(strata_client_state *s, strata_diag *diag);

#endif
