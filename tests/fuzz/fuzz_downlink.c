/* libFuzzer target for a downlink delta chain as a client reads it:
 * strata_downlink_chain_split, then each part through strata_payload_decode
 * and strata_downlink_meta_parse, then strata_downlink_apply (or, for a
 * part whose metadata marks a base, strata_downlink_apply_base) onto a
 * small model (two tensors of 6 and 3 elements).
 *
 * Every step must either fail with an error (and leave the model as it
 * was: its digest unchanged) or succeed; a split that succeeds gives parts
 * that lie inside the input and cover it exactly. Anything else aborts. */
#include "strata/downlink.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t **parts = NULL;
    size_t *lens = NULL, n = 0;
    strata_diag d;
    if (strata_downlink_chain_split(data, size, &parts, &lens, &n, &d) != STRATA_OK) {
        check(parts == NULL && lens == NULL && n == 0);
        return 0;
    }
    size_t covered = 8;
    for (size_t i = 0; i < n; i++) {
        check(parts[i] >= data && parts[i] + lens[i] <= data + size);
        covered += 4 + lens[i];
    }
    check(covered == size);
    strata_tensor_list m;
    strata_tensor_list_init(&m);
    int64_t a[1] = {6}, b[1] = {3};
    check(strata_tensor_list_add(&m, "a", 1, a, NULL) == STRATA_OK);
    check(strata_tensor_list_add(&m, "b", 1, b, NULL) == STRATA_OK);
    strata_payload_limits lim = {.max_total_numel = 1024, .max_layer_numel = 1024};
    for (size_t i = 0; i < n; i++) {
        strata_payload *p = NULL;
        if (strata_payload_decode(parts[i], lens[i], &lim, &p, &d) != STRATA_OK) {
            check(p == NULL);
            continue;
        }
        uint64_t from, to;
        char hex[STRATA_DIGEST_HEX_SIZE], before[STRATA_DIGEST_HEX_SIZE],
            after[STRATA_DIGEST_HEX_SIZE];
        if (strata_downlink_meta_parse(p, &from, &to, hex, &d) == STRATA_OK)
            check(to > from && strlen(hex) == 64);
        strata_downlink_digest(&m, before);
        int base = strata_downlink_meta_is_base(p);
        if ((base ? strata_downlink_apply_base(&m, p, &d) : strata_downlink_apply(&m, p, &d)) !=
            STRATA_OK) {
            strata_downlink_digest(&m, after);
            check(strcmp(before, after) == 0);
        }
        strata_payload_free(p);
    }
    strata_tensor_list_cleanup(&m);
    free(parts);
    free(lens);
    return 0;
}
