/* linear_set.h — the Linears of one model: resolved from a checkpoint (dense or MLX affine),
 * prepared by the backend, kept in one list for cleanup, with a short description of the weight
 * formats seen ("bf16", "q4 g64", "bf16+q4 g32", ...). Shared by every model loader and the bench. */
#ifndef DT_LINEAR_SET_H
#define DT_LINEAR_SET_H

#include "backends/backend.h"
#include "io/weights.h"

typedef struct {
    dt_backend *be;
    dt_linear **all;
    int n;
    char fmt[96];
} dt_linear_set;

/* Resolve NAME ([out, in]; <= 0 = from the file; want_bias as dt_weights_linear) and prepare it.
 * NULL on error (dt_last_error names the file and tensor). */
dt_linear *dt_linear_set_load(dt_linear_set *s, const dt_weights *w, const char *name, int64_t out, int64_t in,
                              int want_bias);
/* Prepare an already resolved Linear. NULL on error. */
dt_linear *dt_linear_set_add(dt_linear_set *s, const dt_linear_src *src);
/* Destroy every Linear of the set (s->be must be set) and reset it. */
void dt_linear_set_free(dt_linear_set *s);

#endif
