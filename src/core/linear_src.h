/* linear_src.h — the host description of a Linear's weights (dense, MLX affine, fp8 or GGUF blocks; zero-copy views
 * into whatever holds them): what a model hands a backend's linear_create (backends/backend.h) and what the weight
 * reader (io/weights.h) resolves from the files. In core so that the backend interface needs no file reader. */
#ifndef DT_LINEAR_SRC_H
#define DT_LINEAR_SRC_H

#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host description of a Linear's weights (zero-copy views into the mapped files). */
typedef struct {
    const char *name;          /* NAME (without .weight) */
    int64_t out, in;           /* logical shape [out, in] */
    int bits;                  /* 0 = dense; 4 or 8 = MLX affine */
    int group_size;            /* affine only */
    dt_dtype dtype;            /* dense: F32/F16/BF16 of data; affine: U32 */
    const void *data;          /* dense [out,in] / packed u32 [out, in*bits/32] */
    dt_dtype sb_dtype;         /* affine: dtype of scales and biases (BF16/F16/F32) */
    const void *scales;        /* affine: [out, in/group_size] */
    const void *biases;        /* affine: [out, in/group_size] */
    float w_scale;             /* fp8: the per-tensor scale (1 when the file has none) */
    const void *w_scales;      /* fp8: per-output-channel scales [out] (NULL: w_scale for every row) */
    dt_dtype w_scales_dtype;   /* fp8: their dtype (F32/BF16/F16) */
    float input_scale;         /* fp8: the file's static activation scale, 0 when absent (reports only) */
    dt_dtype bias_dtype;       /* dtype of the optional Linear bias */
    const void *bias;          /* optional [out], NULL when the Linear has no bias */
    dt_precision precision;    /* requested run precision (core/common.h; dt_weights_linear sets DT_PREC_BF16) */
    int fp8_unfused;           /* fp8 Linears: 1 = quantize the input in a pass of its own and run a gated residual as
                                * linear + gated_add (the A/B arm of --precision fp8), 0 = take e4m3 activations from
                                * the producing norm / SwiGLU (norm_linear, act_linear_gated) and fold the gate into
                                * the GEMM where the backend can (CUDA) */
} dt_linear_src;

/* bits == 0 forms by dtype */
static inline int dt_linear_src_dense(const dt_linear_src *s) {
    return !s->bits && (s->dtype == DT_F32 || s->dtype == DT_F16 || s->dtype == DT_BF16);
}
static inline int dt_linear_src_fp8(const dt_linear_src *s) {
    return !s->bits && dt_dtype_is_fp8(s->dtype);
}
static inline int dt_linear_src_blocks(const dt_linear_src *s) { return !s->bits && dt_dtype_is_block(s->dtype); }
/* Scale of row r of an fp8 Linear. */
float dt_linear_src_fp8_scale(const dt_linear_src *s, int64_t r);

/* Rows [r0, r0+nrows) of a Linear as a Linear of its own (zero copy: views into s's bytes, bias included). */
dt_linear_src dt_linear_src_rows(const dt_linear_src *s, int64_t r0, int64_t nrows);

#ifdef __cplusplus
}
#endif
#endif
