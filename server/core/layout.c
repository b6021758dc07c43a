/* Model layout copies (see layout.h). */
#include "layout.h"

#include "strata/compress.h"

#include <stdlib.h>
#include <string.h>

void strata__layout_cleanup(strata__layout *l)
{
    if (l->items != NULL)
        for (size_t i = 0; i < l->count; i++)
            free(l->items[i].name);
    free(l->items);
    memset(l, 0, sizeof(*l));
}

/* Copies the names and shapes of src (borrowed) into dst (zeroed first). */
int strata__layout_copy(strata__layout *dst, const strata_tensor_list *src)
{
    memset(dst, 0, sizeof(*dst));
    if (src->count == 0 || src->count > SIZE_MAX / sizeof(strata__layout_entry))
        return STRATA_EINVAL;
    dst->items = calloc(src->count, sizeof(strata__layout_entry));
    if (dst->items == NULL)
        return STRATA_ENOMEM;
    dst->bytes = src->count * sizeof(strata__layout_entry);
    dst->count = src->count;
    for (size_t i = 0; i < src->count; i++) {
        const strata_tensor *t = &src->items[i];
        strata__layout_entry *e = &dst->items[i];
        size_t numel = 0;
        int rc = strata_shape_numel(t->ndim, t->shape, &numel);
        if (rc < 0 || numel != t->numel || t->name == NULL ||
            (uint64_t)numel > STRATA_CLAYER_MAX_NUMEL) {
            strata__layout_cleanup(dst);
            return rc < 0 ? rc : STRATA_EINVAL;
        }
        if (dst->total > SIZE_MAX - numel) {
            strata__layout_cleanup(dst);
            return STRATA_ETOOBIG;
        }
        size_t len = strlen(t->name) + 1;
        e->name = malloc(len);
        if (e->name == NULL) {
            strata__layout_cleanup(dst);
            return STRATA_ENOMEM;
        }
        memcpy(e->name, t->name, len);
        dst->bytes += len;
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof(e->shape));
        e->numel = numel;
        e->offset = dst->total;
        dst->total += numel;
    }
    return STRATA_OK;
}

/* Checks that list l has exactly layout lay (names, shapes, order) and data;
 * what names the list in the message. */
int strata__layout_match(const strata__layout *lay, const strata_tensor_list *l, const char *what,
                         strata_diag *diag)
{
    if (l->count != lay->count)
        return strata_diag_set(diag, STRATA_EINVAL, "%s has %zu tensors, the model has %zu", what,
                               l->count, lay->count);
    for (size_t i = 0; i < lay->count; i++) {
        const strata_tensor *t = &l->items[i];
        const strata__layout_entry *e = &lay->items[i];
        if (!strata_tensor_has_layout(t, e->name, e->ndim, e->shape) || t->numel != e->numel ||
            t->data == NULL)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "%s: tensor %zu (%s) does not match the model's %s", what, i,
                                   t->name != NULL ? t->name : "?", e->name);
    }
    return STRATA_OK;
}
