/* Named float32 tensors and ordered lists of them.
 *
 * A strata_tensor is a row-major float32 array with a name (PyTorch
 * state_dict style, e.g. "conv1.weight") and up to STRATA_MAX_DIMS
 * dimensions. A strata_tensor_list is an ordered set of uniquely named
 * tensors; models, gradients, deltas and residuals are all tensor lists.
 * Not thread-safe: one list is used by one thread at a time. */
#ifndef STRATA_TENSOR_H
#define STRATA_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define STRATA_MAX_DIMS 4
#define STRATA_MAX_NAME 128

typedef struct strata_tensor {
    char *name; /* owned, NUL-terminated */
    int ndim;
    int64_t shape[STRATA_MAX_DIMS];
    size_t numel;
    float *data; /* owned, 64-byte aligned, numel elements */
} strata_tensor;

typedef struct strata_tensor_list {
    size_t count;
    size_t cap;
    strata_tensor *items;
} strata_tensor_list;

/* Allocates a 64-byte aligned float array of n elements, zeroed. Returns NULL
 * on overflow or allocation failure. Free with strata_free_floats(). */
float *strata_alloc_floats(size_t n);
void strata_free_floats(float *p);

/* Computes the element count of a shape; returns STRATA_EINVAL for a bad
 * ndim or a non-positive dimension and STRATA_ETOOBIG on overflow. */
int strata_shape_numel(int ndim, const int64_t *shape, size_t *numel);

/* Initialises an empty list (caller-owned struct). */
void strata_tensor_list_init(strata_tensor_list *l);

/* Frees every tensor of the list and leaves it empty. Accepts NULL. */
void strata_tensor_list_cleanup(strata_tensor_list *l);

/* Appends a tensor named name with the given shape. data (borrowed) is copied
 * when non-NULL; otherwise the tensor is zero-filled. Errors: STRATA_EINVAL
 * for an empty, too long or duplicate name or a bad shape, STRATA_ETOOBIG,
 * STRATA_ENOMEM. On error the list is unchanged. */
int strata_tensor_list_add(strata_tensor_list *l, const char *name, int ndim, const int64_t *shape,
                           const float *data);

/* Returns the tensor named name (borrowed), or NULL. */
strata_tensor *strata_tensor_list_find(const strata_tensor_list *l, const char *name);

/* Total number of elements over all tensors. */
size_t strata_tensor_list_numel(const strata_tensor_list *l);

/* Makes dst (initialised, emptied first) a deep copy of src. */
int strata_tensor_list_copy(strata_tensor_list *dst, const strata_tensor_list *src);

/* Copies src's values into dst, which has src's layout
 * (strata_tensor_list_same_layout); no allocation. */
void strata_tensor_list_copy_values(strata_tensor_list *dst, const strata_tensor_list *src);

/* Makes dst a list with the same names and shapes as src, all zeros. */
int strata_tensor_list_zeros_like(strata_tensor_list *dst, const strata_tensor_list *src);

/* Returns 1 when t has the name (NULL never matches), the ndim and the
 * shape (ndim entries) given, else 0. The one comparison of a tensor's
 * layout: every layout check in Strata goes through it. */
int strata_tensor_has_layout(const strata_tensor *t, const char *name, int ndim,
                             const int64_t *shape);

/* Returns 1 when a and b have the same names, shapes and order, else 0. */
int strata_tensor_list_same_layout(const strata_tensor_list *a, const strata_tensor_list *b);

/* Formats a tensor's shape as "[32, 1, 5, 5]" into buf. */
void strata_tensor_shape_str(const strata_tensor *t, char *buf, size_t len);

#endif
