/* ggml_quants.h — the block-quantized weight types of GGUF files (ggml's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K, Q6_K): byte layouts, dequantization (the reference every backend must match bit for bit)
 * and a simple round-to-nearest quantizer for writing files.
 *
 * A row of n values (n a multiple of the block size) is n / QK consecutive blocks. Byte layouts (little
 * endian; f16 = IEEE half), as in ggml's ggml-common.h:
 *   Q4_0  32 values, 18 B: d f16 | qs[16]          x[j] = ((qs[j] & 15) - 8)·d, x[j+16] = ((qs[j] >> 4) - 8)·d
 *   Q4_1  32 values, 20 B: d f16 | m f16 | qs[16]  x = q·d + m (q = nibble as above, unsigned)
 *   Q5_0  32 values, 22 B: d | qh u32 | qs[16]     5th bit of value j is bit j of qh; x = (q5 - 16)·d
 *   Q5_1  32 values, 24 B: d | m | qh u32 | qs[16] x = q5·d + m
 *   Q8_0  32 values, 34 B: d | qs[32] int8         x = qs·d
 *   Q4_K  256 values, 144 B: d | dmin | scales[12] | qs[128]: 8 sub-blocks of 32 with 6-bit scale sc and
 *         min mn (packed in scales[12]); x = (d·sc)·q - (dmin·mn); each 64 values share 32 bytes of qs
 *         (low nibbles: the first 32, high nibbles: the next 32)
 *   Q5_K  256 values, 176 B: d | dmin | scales[12] | qh[32] | qs[128]: as Q4_K with a 5th bit from qh
 *         (bit 2i / 2i+1 of qh[l] for the i-th 64-value group)
 *   Q6_K  256 values, 210 B: ql[128] | qh[64] | scales[16] int8 | d: 16 sub-blocks of 16;
 *         x = (d·sc)·(q6 - 32)
 * Arithmetic is f32 with one rounding per written operation, in the order above (no fused multiply-add),
 * exactly as the reference C code reads without floating-point contraction. */
#ifndef DT_GGML_QUANTS_H
#define DT_GGML_QUANTS_H

#include <stdint.h>

#include "../core/common.h"

/* Dequantize n values (n % block == 0) of block type t from blocks to dst. 0, or -1 when t is not a block
 * type or n is not a multiple of its block size. */
int dt_ggml_dequant(dt_dtype t, const void *blocks, int64_t n, float *dst);

/* Quantize n values of src into blocks of type t: round to nearest, block scales from each block's range
 * (sub-block scales of the K types quantized against the super-block's largest). Not ggml's own search
 * for the best scales: valid blocks of comparable error, for writers and tests. 0 or -1 as above. */
int dt_ggml_quant(dt_dtype t, const float *src, int64_t n, void *blocks);

#endif
