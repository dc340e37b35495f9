/* fp8.h — OCP FP8 (E5M2 conversions below; safetensors' F8_E4M3 / F8_E5M2 dtypes decode through these).
 * E4M3 ("e4m3fn": 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities,
 * 0x7F/0xFF = NaN, largest finite ±448, smallest subnormal 2^-9) and the per-row scaling both backends use
 * for the fp8 Linear (--precision fp8):
 *   scale  = amax / 448            (amax = max |v| over the row, NaNs skipped; amax == 0 gives scale 1)
 *   code_i = e4m3(v_i * (448 / amax))   round to nearest even, |.| > 448 saturates to ±448, NaN stays NaN
 * so v_i ≈ e4m3_value(code_i) * scale. The CUDA kernels compute the same expressions in the same order
 * (one f32 division for 448/amax, one f32 product per element), so both backends get identical codes. */
#ifndef DT_FP8_H
#define DT_FP8_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_E4M3_MAX 448.0f

/* f32 -> e4m3 code: round to nearest even, saturating (±inf and |x| > 448 -> ±448), NaN -> 0x7F|sign. */
uint8_t dt_f32_to_e4m3(float x);
/* e4m3 code -> f32 (exact); 0x7F / 0xFF -> NaN. */
float dt_e4m3_to_f32(uint8_t c);
/* OCP FP8 E5M2 (1 sign, 5 exponent bits with bias 15, 2 mantissa bits: the top byte of an IEEE half, with
 * infinities and NaNs) -> f32 (exact). */
float dt_e5m2_to_f32(uint8_t c);
/* f32 -> e5m2 code: round to nearest even, overflow (|x| >= 61440, past the last tie) -> ±inf, NaN stays NaN. */
uint8_t dt_f32_to_e5m2(float x);
/* max |x[i]| over n values (NaNs skipped). */
float dt_fp8_amax(const float *x, int64_t n);
/* Quantize one row of n values: codes[n] (may be NULL) and/or vals[n] (the e4m3 values as f32, unscaled;
 * may be NULL). Returns the row's scale (amax / 448, or 1 when amax == 0). */
float dt_fp8_quantize_row(const float *x, int64_t n, uint8_t *codes, float *vals);

#ifdef __cplusplus
}
#endif
#endif
