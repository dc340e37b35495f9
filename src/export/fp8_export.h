/* fp8_export.h — a transformer checkpoint written as an fp8 folder (`ditrun convert --format fp8|fp8-channel|
 * fp8-e5m2` for the families that name their block Linears here: Krea 2, Z-Image). */
#ifndef DT_FP8_EXPORT_H
#define DT_FP8_EXPORT_H

#include <stddef.h>

#include "core/common.h"
#include "io/json.h"

/* What a family tells the writer. */
typedef struct {
    const char *cls, *title;   /* config.json's _class_name (the family's transformer class) and the family in messages */
    /* 0, or -1 with the error naming `what` (the config's path) when cfg is not a valid config of the family */
    int (*check_config)(const json *cfg, const char *what);
    /* 1 when NAME ("...weight") is a block Linear's weight written in fp8; its base (without ".weight") into base */
    int (*block_linear)(const char *name, char *base, size_t blen);
} dt_fp8_export_family;

/* Write the transformer at INPUT (folder or pipeline root, safetensors: dense, MLX-quantized or fp8) as the folder
 * OUTPUT (config.json + diffusion_pytorch_model.safetensors) with the block Linears as fp8 codes of `type`
 * (F8_E4M3 / F8_E5M2) + NAME.weight_scale (per tensor, or per output channel with per_channel) + NAME.input_scale
 * (1), every other tensor as stored. *written = tensors written (scales not counted). 0, or -1 with an error (OUTPUT
 * left untouched). */
int dt_fp8_export(const char *input, const char *output, dt_dtype type, int per_channel, const dt_fp8_export_family *fam,
                  int *written);

#endif
