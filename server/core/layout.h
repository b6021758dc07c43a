/* The model layout copies that server/core's aggregate (aggregate.c) and
 * server optimisers (server_opt.c) keep: names, shapes and flat offsets of
 * a model's tensors, copied once so that the objects do not borrow the
 * model. Internal to server/core. */
#ifndef STRATA_SERVER_LAYOUT_H
#define STRATA_SERVER_LAYOUT_H

#include "strata/error.h"
#include "strata/tensor.h"

#include <stddef.h>
#include <stdint.h>

typedef struct strata__layout_entry {
    char *name;
    int ndim;
    int64_t shape[STRATA_MAX_DIMS];
    size_t numel;
    size_t offset; /* first element in a flat model-sized array */
} strata__layout_entry;

typedef struct strata__layout {
    size_t count;
    size_t total; /* elements over all tensors */
    size_t bytes; /* heap bytes owned */
    strata__layout_entry *items;
} strata__layout;

/* Frees l's copies and zeroes it. */
void strata__layout_cleanup(strata__layout *l);

/* Copies the names and shapes of src (borrowed) into dst (zeroed first).
 * Errors: STRATA_EINVAL (an empty list, a tensor whose shape does not give
 * its element count or that is too large for a compressed layer),
 * STRATA_ETOOBIG (the total overflows), STRATA_ENOMEM. */
int strata__layout_copy(strata__layout *dst, const strata_tensor_list *src);

/* Checks that list l has exactly layout lay (names, shapes, order) and data;
 * what names the list in the message. Errors: STRATA_EINVAL. */
int strata__layout_match(const strata__layout *lay, const strata_tensor_list *l, const char *what,
                         strata_diag *diag);

#endif
