/* dequant.h — a Linear's weights as f32 values, whatever their stored form (dense F32/F16/BF16 converted, fp8 codes
 * times their scales, ggml blocks (ggml_quants.h), MLX affine 4/8-bit with mlx_affine.h's reference rule). The CPU
 * backend, the loaders that need a few rows on the host (embedding lookups, stacked mixed formats, LoRA merges), the
 * CUDA backend's uploads of forms it has no kernel for, and the bench read weights through it. */
#ifndef DT_DEQUANT_H
#define DT_DEQUANT_H

#include "../io/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows [r0, r0+nrows) of the Linear s as f32 dst [nrows, s->in]. Works for every form of io/weights.h. */
void dt_linear_src_rows_f32(const dt_linear_src *s, int64_t r0, int64_t nrows, float *dst);

#ifdef __cplusplus
}
#endif

#endif
