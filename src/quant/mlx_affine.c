/* mlx_affine.c — reference MLX groupwise affine (de)quantization of one weight row.
 * Packing: 32/bits unsigned values per little-endian uint32, element 0 in the least significant bits.
 * Two quantizer rules: MLX's own (sign of the scale chosen so the larger-magnitude edge is exact, as in
 * ml-explore/mlx affine quantize) and the plain min/max rule used for the test fixtures. */
#include "mlx_affine.h"

#include <math.h>
#include <string.h>

static float load_sb(const void *p, dt_dtype t, int64_t i) {
    switch (t) {
    case DT_BF16: { uint16_t v; memcpy(&v, (const uint16_t *)p + i, 2); return dt_bf16_to_f32(v); }
    case DT_F16: { uint16_t v; memcpy(&v, (const uint16_t *)p + i, 2); return dt_f16_to_f32(v); }
    case DT_F32: { float v; memcpy(&v, (const float *)p + i, 4); return v; }
    default: return 0.0f;
    }
}

void mlx_dequant_row(float *dst, const uint32_t *packed, const void *scales, const void *biases,
                     dt_dtype sb_dtype, int64_t in, int bits, int group) {
    const int per = 32 / bits;
    const uint32_t mask = bits == 32 ? 0xffffffffu : ((1u << bits) - 1u);
    const int64_t ngroups = in / group;
    for (int64_t g = 0; g < ngroups; g++) {
        const float s = load_sb(scales, sb_dtype, g), b = load_sb(biases, sb_dtype, g);
        for (int64_t j = g * group; j < (g + 1) * group; j++) {
            const uint32_t word = packed[j / per];
            const uint32_t q = (word >> ((j % per) * bits)) & mask;
            dst[j] = s * (float)q + b;
        }
    }
}

void mlx_quant_row(const float *src, int64_t in, int bits, int group, mlx_rule rule,
                   uint32_t *packed, uint16_t *scales_bf16, uint16_t *biases_bf16) {
    const int per = 32 / bits;
    const float n_bins = (float)((1u << bits) - 1u);
    memset(packed, 0, (size_t)(in / per) * sizeof(uint32_t));
    for (int64_t g = 0; g < in / group; g++) {
        const float *w = src + g * group;
        float lo = w[0], hi = w[0];
        for (int j = 1; j < group; j++) {
            if (w[j] < lo) lo = w[j];
            if (w[j] > hi) hi = w[j];
        }
        float scale, bias;    /* the values q is computed with */
        uint16_t s16, b16;    /* the stored values */
        if (rule == MLX_RULE_MLX) {
            /* MLX: scale magnitude (max-min)/n_bins (at least 1e-7); negative when the max has the larger
             * magnitude, so that edge / scale is a whole number of steps and the edge is reproduced
             * exactly; q is computed in f32 with the unrounded scale, then scale/bias stored as bf16. */
            const int min_side = fabsf(lo) > fabsf(hi);
            scale = fmaxf((hi - lo) / n_bins, 1e-7f);
            if (!min_side) scale = -scale;
            const float edge = min_side ? lo : hi;
            const float q0 = rintf(edge / scale);
            bias = 0.0f;
            if (q0 != 0.0f) { scale = edge / q0; bias = edge; }
            s16 = dt_f32_to_bf16(scale);
            b16 = dt_f32_to_bf16(bias);
        } else {
            /* min/max: scale and bias rounded to bf16 first, q computed with the stored values */
            s16 = dt_f32_to_bf16((hi - lo) / n_bins);
            b16 = dt_f32_to_bf16(lo);
            scale = dt_bf16_to_f32(s16);
            bias = dt_bf16_to_f32(b16);
        }
        scales_bf16[g] = s16;
        biases_bf16[g] = b16;
        for (int j = 0; j < group; j++) {
            float q = scale != 0.0f ? rintf((w[j] - bias) / scale) : 0.0f;
            if (!(q >= 0.0f)) q = 0.0f; /* also maps NaN to 0 */
            if (q > n_bins) q = n_bins;
            const int64_t idx = g * group + j;
            packed[idx / per] |= (uint32_t)q << ((idx % per) * bits);
        }
    }
}
