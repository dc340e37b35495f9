/* block_cache.h — First Block Cache inside a DiT forward (diffusers' FirstBlockCacheConfig semantics, NOTES.md
 * "Step caching"): after the first block the change of its image-row residual decides whether the other blocks
 * run or the residual they added on the last computed pass is added instead. One dt_fbc_branch per guidance
 * branch; the sampler owns it, a family's forward (flux2_set_block_cache, krea2_set_block_cache) uses it.
 * Everything runs through the backend interface; the decision reduces the residuals on the backend
 * (abs_diff_sums: two sums, 16 bytes to the host). */
#ifndef DT_BLOCK_CACHE_H
#define DT_BLOCK_CACHE_H

#include "backends/backend.h"

typedef struct {
    /* set by the sampler before each pass */
    float threshold;     /* skip when mean|r - r_prev| / mean|r_prev| <= threshold */
    int force;           /* 1: this pass runs every block (first and last step) */
    /* set by the forward */
    int computed;        /* 1: the last pass ran every block; 0: it added the cached residual */
    double diff;         /* the last pass's relative difference (-1: none, it had no earlier residual) */
    /* state of the last computed pass (its rows × cols; new shapes start over) */
    dt_backend *be;      /* the backend the device buffers live on */
    int64_t rows, cols;
    dt_mat head;         /* [rows, cols] device: the first block's input, then its residual, then its output */
    dt_mat prev;         /* [rows, cols] device: the last computed pass's first-block residual (output − input) */
    dt_mat tail;         /* [rows, cols] device: the last block's output − the first block's (image rows) */
    int have_prev, have_tail;
} dt_fbc_branch;

/* Before a forward of rows × cols image rows (outside any captured graph): (re)allocates on the first call and
 * after a shape or backend change (the state starts over). 0 or -1 (dt_last_error). */
int dt_fbc_prepare(dt_backend *be, dt_fbc_branch *f, int64_t rows, int64_t cols);
/* Before the first block: img [rows, cols] (the image rows of the stream) is copied aside. */
void dt_fbc_begin(dt_backend *be, dt_fbc_branch *f, dt_mat img);
/* After the first block: 1 when the remaining blocks must run (then call dt_fbc_end after the last one), 0 when
 * the cached residual was added to img and the remaining blocks are to be skipped. Sets f->computed, f->diff. */
int dt_fbc_after_head(dt_backend *be, dt_fbc_branch *f, dt_mat img);
/* After the last block of a computed pass: the residual the remaining blocks added is kept. */
void dt_fbc_end(dt_backend *be, dt_fbc_branch *f, dt_mat img);
/* Free the state (buffers on the backend they were made on); f can be reused. */
void dt_fbc_free(dt_fbc_branch *f);

#endif
