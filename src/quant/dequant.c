/* dequant.c — rows of a Linear as f32 (dequant.h): dense conversion (fp8 codes times their scales), ggml blocks, or
 * MLX affine dequantization. */
#include "dequant.h"

#include "ggml_quants.h"
#include "mlx_affine.h"

void dt_linear_src_rows_f32(const dt_linear_src *s, int64_t r0, int64_t nrows, float *dst) {
    if (dt_linear_src_blocks(s)) {
        const size_t rb = dt_dtype_bytes(s->dtype, s->in);
        for (int64_t r = 0; r < nrows; r++)
            dt_ggml_dequant(s->dtype, (const char *)s->data + (size_t)(r0 + r) * rb, s->in, dst + r * s->in);
        return;
    }
    if (s->bits == 0) {
        size_t es = dt_dtype_size(s->dtype);
        dt_convert_to_f32(dst, (const char *)s->data + (size_t)(r0 * s->in) * es, s->dtype, (size_t)(nrows * s->in));
        if (dt_linear_src_fp8(s))   /* value(code) · scale, one f32 product */
            for (int64_t r = 0; r < nrows; r++) {
                const float sc = dt_linear_src_fp8_scale(s, r0 + r);
                for (int64_t k = 0; k < s->in; k++) dst[r * s->in + k] *= sc;
            }
        return;
    }
    const int64_t words = s->in * s->bits / 32, groups = s->in / s->group_size;
    const size_t ses = dt_dtype_size(s->sb_dtype);
    for (int64_t r = 0; r < nrows; r++) {
        int64_t row = r0 + r;
        mlx_dequant_row(dst + r * s->in, (const uint32_t *)s->data + row * words,
                        (const char *)s->scales + (size_t)(row * groups) * ses,
                        (const char *)s->biases + (size_t)(row * groups) * ses, s->sb_dtype, s->in, s->bits,
                        s->group_size);
    }
}
