/* libFuzzer target for strata_safetensors_decode.
 *
 * Every input must either be rejected with a message and leave the outputs
 * untouched, or decode to a valid tensor list that encodes and decodes again
 * to the same tensors bit for bit. Anything else aborts. */
#include "strata/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    strata_tensor_list l, again;
    strata_metadata m;
    strata_diag diag;
    strata_tensor_list_init(&l);
    strata_tensor_list_init(&again);
    strata_metadata_init(&m);

    int rc = strata_safetensors_decode(data, size, &l, &m, &diag);
    if (rc < 0) {
        check(diag.msg[0] != '\0' && l.count == 0 && l.items == NULL && m.count == 0);
        return 0;
    }

    size_t total = 0;
    for (size_t i = 0; i < l.count; i++) {
        const strata_tensor *t = &l.items[i];
        size_t numel;
        check(t->name != NULL && t->name[0] != '\0' && t->data != NULL);
        check(strata_shape_numel(t->ndim, t->shape, &numel) == STRATA_OK && numel == t->numel);
        total += numel;
    }
    /* Every element came from at least two input bytes. */
    check(total <= size / 2);

    uint8_t *buf = NULL;
    size_t len = 0;
    check(strata_safetensors_encode(&l, &m, &buf, &len) == STRATA_OK);
    check(strata_safetensors_decode(buf, len, &again, NULL, NULL) == STRATA_OK);
    check(strata_tensor_list_same_layout(&l, &again));
    for (size_t i = 0; i < l.count; i++)
        check(memcmp(l.items[i].data, again.items[i].data, l.items[i].numel * sizeof(float)) == 0);

    free(buf);
    strata_tensor_list_cleanup(&again);
    strata_tensor_list_cleanup(&l);
    strata_metadata_cleanup(&m);
    return 0;
}
