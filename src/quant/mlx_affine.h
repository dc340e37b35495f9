/* mlx_affine.h — MLX groupwise affine quantization (the readable reference; backends must match it).
 *
 * A weight row of `in` values is split into groups of `group` consecutive values; each group has a
 * scale s and bias b (stored as BF16/F16/F32) and w = s*q + b with q unsigned in [0, 2^bits - 1].
 * Packing: 32/bits values per little-endian uint32, element 0 in the least significant bits.
 * Scales may be negative (MLX picks the sign so the larger-magnitude edge is exact).
 */
#ifndef DT_MLX_AFFINE_H
#define DT_MLX_AFFINE_H

#include <stdint.h>

#include "../core/common.h"

/* Dequantize one row: packed [in*bits/32] u32, scales/biases [in/group] of sb_dtype -> dst [in]. */
void mlx_dequant_row(float *dst, const uint32_t *packed, const void *scales, const void *biases,
                     dt_dtype sb_dtype, int64_t in, int bits, int group);

/* Quantizer rules for one row (src [in] f32 -> packed, scales, biases as BF16):
 *   MLX_RULE_MLX    : MLX's own: scale=(max-min)/(2^b-1) with sign chosen so the larger-magnitude
 *                     edge is exact, bias = that edge, q = clip(round((w-bias)/scale)).
 *   MLX_RULE_MINMAX : scale = bf16((max-min)/(2^b-1)), bias = bf16(min),
 *                     q = round-half-even((w-bias)/scale) clamped. */
typedef enum { MLX_RULE_MLX = 0, MLX_RULE_MINMAX = 1 } mlx_rule;
void mlx_quant_row(const float *src, int64_t in, int bits, int group, mlx_rule rule,
                   uint32_t *packed, uint16_t *scales_bf16, uint16_t *biases_bf16);

#endif
