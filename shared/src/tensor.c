#include "strata/tensor.h"
#include "strata/buf.h"

#include "strata/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float *strata_alloc_floats(size_t n)
{
    if (n == 0)
        n = 1;
    if (n > (SIZE_MAX - 63) / sizeof(float))
        return NULL;
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (p != NULL)
        memset(p, 0, bytes);
    return p;
}

void strata_free_floats(float *p)
{
    free(p);
}

int strata_shape_numel(int ndim, const int64_t *shape, size_t *numel)
{
    *numel = 0;
    if (ndim < 0 || ndim > STRATA_MAX_DIMS)
        return STRATA_EINVAL;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return STRATA_EINVAL;
        if ((uint64_t)shape[i] > SIZE_MAX / n)
            return STRATA_ETOOBIG;
        n *= (size_t)shape[i];
    }
    if (n > SIZE_MAX / sizeof(float))
        return STRATA_ETOOBIG;
    *numel = n;
    return STRATA_OK;
}

void strata_tensor_list_init(strata_tensor_list *l)
{
    l->count = 0;
    l->cap = 0;
    l->items = NULL;
}

void strata_tensor_list_cleanup(strata_tensor_list *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; i < l->count; i++) {
        free(l->items[i].name);
        strata_free_floats(l->items[i].data);
    }
    free(l->items);
    strata_tensor_list_init(l);
}

strata_tensor *strata_tensor_list_find(const strata_tensor_list *l, const char *name)
{
    for (size_t i = 0; i < l->count; i++)
        if (strcmp(l->items[i].name, name) == 0)
            return &l->items[i];
    return NULL;
}

int strata_tensor_list_add(strata_tensor_list *l, const char *name, int ndim, const int64_t *shape,
                           const float *data)
{
    size_t namelen = name ? strlen(name) : 0;
    if (namelen == 0 || namelen >= STRATA_MAX_NAME || strata_tensor_list_find(l, name) != NULL)
        return STRATA_EINVAL;
    size_t numel;
    int rc = strata_shape_numel(ndim, shape, &numel);
    if (rc < 0)
        return rc;
    strata_tensor *grown = strata_array_grow(l->items, &l->cap, l->count + 1, sizeof(*grown));
    if (grown == NULL)
        return STRATA_ENOMEM;
    l->items = grown;
    strata_tensor t = {0};
    t.name = malloc(namelen + 1);
    t.data = strata_alloc_floats(numel);
    if (t.name == NULL || t.data == NULL) {
        free(t.name);
        strata_free_floats(t.data);
        return STRATA_ENOMEM;
    }
    memcpy(t.name, name, namelen + 1);
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t.shape[i] = shape[i];
    t.numel = numel;
    if (data != NULL)
        memcpy(t.data, data, numel * sizeof(float));
    l->items[l->count++] = t;
    return STRATA_OK;
}

size_t strata_tensor_list_numel(const strata_tensor_list *l)
{
    size_t n = 0;
    for (size_t i = 0; i < l->count; i++)
        n += l->items[i].numel;
    return n;
}

static int copy_list(strata_tensor_list *dst, const strata_tensor_list *src, int with_data)
{
    strata_tensor_list tmp;
    strata_tensor_list_init(&tmp);
    for (size_t i = 0; i < src->count; i++) {
        const strata_tensor *t = &src->items[i];
        int rc =
            strata_tensor_list_add(&tmp, t->name, t->ndim, t->shape, with_data ? t->data : NULL);
        if (rc < 0) {
            strata_tensor_list_cleanup(&tmp);
            return rc;
        }
    }
    strata_tensor_list_cleanup(dst);
    *dst = tmp;
    return STRATA_OK;
}

int strata_tensor_list_copy(strata_tensor_list *dst, const strata_tensor_list *src)
{
    return copy_list(dst, src, 1);
}

void strata_tensor_list_copy_values(strata_tensor_list *dst, const strata_tensor_list *src)
{
    for (size_t i = 0; i < dst->count; i++)
        memcpy(dst->items[i].data, src->items[i].data, dst->items[i].numel * sizeof(float));
}

int strata_tensor_list_zeros_like(strata_tensor_list *dst, const strata_tensor_list *src)
{
    return copy_list(dst, src, 0);
}

int strata_tensor_has_layout(const strata_tensor *t, const char *name, int ndim,
                             const int64_t *shape)
{
    if (t->name == NULL || name == NULL || strcmp(t->name, name) != 0 || t->ndim != ndim)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d])
            return 0;
    return 1;
}

int strata_tensor_list_same_layout(const strata_tensor_list *a, const strata_tensor_list *b)
{
    if (a->count != b->count)
        return 0;
    for (size_t i = 0; i < a->count; i++) {
        const strata_tensor *y = &b->items[i];
        if (!strata_tensor_has_layout(&a->items[i], y->name, y->ndim, y->shape))
            return 0;
    }
    return 1;
}

void strata_tensor_shape_str(const strata_tensor *t, char *buf, size_t len)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, len - off, "[");
    for (int d = 0; d < t->ndim && off < len; d++)
        off +=
            (size_t)snprintf(buf + off, len - off, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (off < len)
        snprintf(buf + off, len - off, "]");
}
