/* block_cache.c — First Block Cache's per-branch state and decision (block_cache.h). */
#include "block_cache.h"

#include <math.h>

void dt_fbc_free(dt_fbc_branch *f) {
    if (f->be) {
        if (f->head.data) f->be->free(f->be, &f->head);
        if (f->prev.data) f->be->free(f->be, &f->prev);
        if (f->tail.data) f->be->free(f->be, &f->tail);
    }
    f->be = NULL;
    f->head = f->prev = f->tail = dt_mat_null();
    f->rows = f->cols = 0;
    f->have_prev = f->have_tail = 0;
}

int dt_fbc_prepare(dt_backend *be, dt_fbc_branch *f, int64_t rows, int64_t cols) {
    if (f->be == be && f->rows == rows && f->cols == cols && f->head.data) return 0;
    dt_fbc_free(f);
    f->be = be;
    if (be->alloc(be, &f->head, rows, cols, be->act_dtype) || be->alloc(be, &f->prev, rows, cols, be->act_dtype) ||
        be->alloc(be, &f->tail, rows, cols, be->act_dtype)) {
        dt_fbc_free(f);
        return -1;
    }
    f->rows = rows;
    f->cols = cols;
    return 0;
}

void dt_fbc_begin(dt_backend *be, dt_fbc_branch *f, dt_mat img) { be->copy(be, f->head, img); }

int dt_fbc_after_head(dt_backend *be, dt_fbc_branch *f, dt_mat img) {
    be->axpby(be, f->head, 1.0f, img, -1.0f, f->head);   /* the first block's residual */
    int compute = 1;
    f->diff = -1.0;
    if (f->have_prev && f->have_tail) {
        double s[2];   /* Σ|r − r_prev|, Σ|r_prev|: the means' common 1/n cancels */
        be->abs_diff_sums(be, f->head, f->prev, s);
        f->diff = s[1] > 0.0 ? s[0] / s[1] : INFINITY;
        compute = f->force || !(f->diff <= (double)f->threshold);
    }
    f->computed = compute;
    if (!compute) {
        be->axpby(be, img, 1.0f, img, 1.0f, f->tail);
        return 0;
    }
    be->copy(be, f->prev, f->head);   /* this pass's residual becomes the one to compare with */
    f->have_prev = 1;
    be->copy(be, f->head, img);       /* the first block's output, for the tail residual */
    return 1;
}

void dt_fbc_end(dt_backend *be, dt_fbc_branch *f, dt_mat img) {
    be->axpby(be, f->tail, 1.0f, img, -1.0f, f->head);
    f->have_tail = 1;
}
