/* krea2_export.h — write a Krea 2 transformer as an fp8 checkpoint folder (krea2_export.c): what `ditrun convert
 * --format fp8` writes for Krea 2. */
#ifndef DT_KREA2_EXPORT_H
#define DT_KREA2_EXPORT_H

#include "core/common.h"

/* Write the Krea 2 transformer at INPUT (folder or pipeline root, safetensors: dense, MLX-quantized or fp8) as the
 * folder OUTPUT (config.json + diffusion_pytorch_model.safetensors) with the transformer blocks' Linears as fp8 codes
 * of `type` (F8_E4M3 / F8_E5M2) + NAME.weight_scale (per tensor, or per output channel with per_channel) +
 * NAME.input_scale (1), every other tensor as stored. *written = tensors written (scales not counted). 0, or -1 with
 * an error (OUTPUT left untouched). krea2_export.c. */
int krea2_export_fp8(const char *input, const char *output, dt_dtype type, int per_channel, int *written);

#endif
