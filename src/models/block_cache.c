/* block_cache.c — First Block Cache's per-branch state and decision (block_cache.h). */
#include "block_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

void dt_fbc_free(dt_fbc_branch *f) {
    if (f->be) {
        if (f->head.data) f->be->free(f->be, &f->head);
        if (f->tail.data) f->be->free(f->be, &f->tail);
    }
    free(f->prev);
    free(f->cur);
    f->be = NULL;
    f->prev = f->cur = NULL;
    f->head = f->tail = dt_mat_null();
    f->rows = f->cols = 0;
    f->have_tail = 0;
}

int dt_fbc_prepare(dt_backend *be, dt_fbc_branch *f, int64_t rows, int64_t cols) {
    if (f->be == be && f->rows == rows && f->cols == cols && f->head.data) return 0;
    dt_fbc_free(f);
    f->be = be;
    if (be->alloc(be, &f->head, rows, cols, be->act_dtype) || be->alloc(be, &f->tail, rows, cols, be->act_dtype)) {
        dt_fbc_free(f);
        return -1;
    }
    f->rows = rows;
    f->cols = cols;
    f->cur = dt_malloc(sizeof(float) * (size_t)(rows * cols));
    return 0;
}

void dt_fbc_begin(dt_backend *be, dt_fbc_branch *f, dt_mat img) { be->copy(be, f->head, img); }

int dt_fbc_after_head(dt_backend *be, dt_fbc_branch *f, dt_mat img) {
    const size_t n = (size_t)(f->rows * f->cols);
    be->axpby(be, f->head, 1.0f, img, -1.0f, f->head);   /* the first block's residual */
    be->download(be, f->cur, f->head);
    int compute = 1;
    f->diff = -1.0;
    if (f->prev && f->have_tail) {
        double d = 0.0, p = 0.0;   /* the means' common 1/n cancels */
        for (size_t i = 0; i < n; i++) {
            d += fabs((double)f->cur[i] - (double)f->prev[i]);
            p += fabs((double)f->prev[i]);
        }
        f->diff = p > 0.0 ? d / p : INFINITY;
        compute = f->force || !(f->diff <= (double)f->threshold);
    }
    f->computed = compute;
    if (!compute) {
        be->axpby(be, img, 1.0f, img, 1.0f, f->tail);
        return 0;
    }
    if (!f->prev) f->prev = dt_malloc(sizeof(float) * n);
    float *t = f->prev;   /* this pass's residual becomes the one to compare with */
    f->prev = f->cur;
    f->cur = t;
    be->copy(be, f->head, img);   /* the first block's output, for the tail residual */
    return 1;
}

void dt_fbc_end(dt_backend *be, dt_fbc_branch *f, dt_mat img) {
    be->axpby(be, f->tail, 1.0f, img, -1.0f, f->head);
    f->have_tail = 1;
}
