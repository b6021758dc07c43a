/* The capped growable buffer (see strata/buf.h). */
#include "strata/buf.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void strata_buf_init(strata_buf *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

int strata_buf_reserve(strata_buf *b, size_t extra)
{
    if (extra > b->max || b->len > b->max - extra)
        return STRATA_ETOOBIG;
    size_t need = b->len + extra + 1; /* the NUL */
    if (need <= b->cap)
        return STRATA_OK;
    size_t cap = b->cap < 64 ? 64 : b->cap;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    if (cap > b->max + 1 && need <= b->max + 1)
        cap = b->max + 1;
    uint8_t *p = realloc(b->data, cap);
    if (p == NULL)
        return STRATA_ENOMEM;
    if (b->data == NULL)
        p[0] = '\0';
    b->data = p;
    b->cap = cap;
    return STRATA_OK;
}

void strata_buf_commit(strata_buf *b, size_t n)
{
    assert(b->data != NULL && n < b->cap - b->len);
    b->len += n;
    b->data[b->len] = '\0';
}

int strata_buf_append(strata_buf *b, const void *p, size_t n)
{
    int rc = strata_buf_reserve(b, n);
    if (rc < 0)
        return rc;
    if (n > 0)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return STRATA_OK;
}

int strata_buf_appendf(strata_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return STRATA_EINVAL;
    if ((size_t)n < sizeof small)
        return strata_buf_append(b, small, (size_t)n);
    int rc = strata_buf_reserve(b, (size_t)n);
    if (rc < 0)
        return rc;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return STRATA_OK;
}

uint8_t *strata_buf_take(strata_buf *b, size_t *len)
{
    uint8_t *p = b->data;
    if (len != NULL)
        *len = b->len;
    strata_buf_init(b, b->max);
    return p;
}

void *strata_array_grow(void *arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return arr;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return NULL;
        ncap *= 2;
    }
    if (elem == 0 || ncap > SIZE_MAX / elem)
        return NULL;
    void *p = realloc(arr, ncap * elem);
    if (p != NULL)
        *cap = ncap;
    return p;
}

void strata_buf_reset(strata_buf *b)
{
    b->len = 0;
    if (b->data != NULL)
        b->data[0] = '\0';
}

void strata_buf_cleanup(strata_buf *b)
{
    if (b == NULL)
        return;
    free(b->data);
    strata_buf_init(b, b->max);
}
