/* flux2_export.h — write a FLUX.2 transformer as the fp8 and GGUF single files other tools publish (BFL key
 * names; layouts in flux2_export.c): what `ditrun convert --format` writes, and how the tests and benchmarks
 * make such files from any checkpoint ditrun reads. */
#ifndef DT_FLUX2_EXPORT_H
#define DT_FLUX2_EXPORT_H

#include "core/common.h"

typedef struct {
    int gguf;           /* 0: fp8 safetensors, 1: GGUF */
    dt_dtype type;      /* fp8: F8_E4M3 / F8_E5M2; GGUF: Q4_0..Q6_K, or BF16 / F16 / F32 */
    int comfy;          /* fp8: ComfyUI's scaled-fp8 layout instead of BFL's; GGUF: ComfyUI-GGUF's names instead of
                         * stable-diffusion.cpp's */
    int per_channel;    /* fp8: one weight scale per output channel instead of per tensor */
} flux2_export_opts;

/* INPUT: any FLUX.2 transformer (file, folder, pipeline root; any layout and weight form). OUTPUT: the file.
 * *written = tensors written (scales not counted). 0, or -1 with an error (OUTPUT is left untouched). */
int flux2_export(const char *input, const char *output, const flux2_export_opts *o, int *written);

#endif
