/* zimage_export.h — write a Z-Image transformer as an fp8 checkpoint folder (zimage_export.c): what `ditrun convert
 * --format fp8` writes for Z-Image. */
#ifndef DT_ZIMAGE_EXPORT_H
#define DT_ZIMAGE_EXPORT_H

#include "core/common.h"

/* Write the Z-Image transformer at INPUT (folder or pipeline root, safetensors: dense, MLX-quantized or fp8) as the
 * folder OUTPUT (config.json + diffusion_pytorch_model.safetensors) with the blocks' attention and FFN Linears as fp8
 * codes of `type` (F8_E4M3 / F8_E5M2) + NAME.weight_scale (per tensor, or per output channel with per_channel) +
 * NAME.input_scale (1), every other tensor as stored (export/fp8_export.h). 0 or -1 (OUTPUT untouched).
 * zimage_export.c. */
int zimage_export_fp8(const char *input, const char *output, dt_dtype type, int per_channel, int *written);

#endif
