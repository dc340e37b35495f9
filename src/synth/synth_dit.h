/* synth_dit.h — synthetic transformer checkpoints with random weights, one writer per model (synth_flux2_dit.c,
 * synth_flux2_lora.c, synth_krea2_dit.c), and random forward inputs: for tests at the real geometry, the bench and
 * GPU runs without real weights. The geometry presets they are written at live with the models (flux2_preset,
 * krea2_preset). */
#ifndef DT_SYNTH_DIT_H
#define DT_SYNTH_DIT_H

#include <stdint.h>

#include "models/flux2.h"
#include "models/krea2.h"

/* ---- FLUX.2 (synth_flux2_dit.c, synth_flux2_lora.c) ---- */

/* Write a synthetic checkpoint folder DIR/{config.json, model.safetensors} with random weights of the
 * given geometry (uniform, variance 1/in per Linear), streamed tensor by tensor (memory ~ one tensor).
 * bits = 0 writes bf16 weights; 4 or 8 writes MLX affine quantized Linears with `group` (norms bf16). */
int flux2_synth_write(const flux2_config *c, const char *dir, int bits, int group, uint64_t seed);
/* A random LoRA adapter file (bf16, alpha = rank / 2) for geometry c: every Linear of the blocks, the embedders and
 * the final projection (with `modulation` also the modulation Linears and the final adaptive norm's), written in one
 * of the key layouts adapters come in; the three layouts of one (rank, seed) encode the same update
 * (synth_flux2_lora.c). For tests, the reference check and speed runs. 0 or -1. */
typedef enum { FLUX2_LORA_DIFFUSERS, FLUX2_LORA_KOHYA, FLUX2_LORA_BFL } flux2_lora_layout;
typedef struct {
    int rank;                   /* 1..4096 */
    uint64_t seed;
    flux2_lora_layout layout;
    int modulation;
} flux2_synth_lora_opts;
int flux2_synth_lora(const flux2_config *c, const char *path, const flux2_synth_lora_opts *o);
/* "diffusers", "kohya" or "bfl"; 0, or -1 with an error naming the choices. */
int flux2_lora_layout_parse(const char *name, flux2_lora_layout *out);

/* ---- Krea 2 (synth_krea2_dit.c) ---- */

/* Write DIR/config.json and DIR/model.safetensors with random weights at geometry c: bits 0 = bf16,
 * 4/8 = MLX affine quantized Linears with `group` (Linears whose input width is not a multiple stay
 * bf16). Creates DIR. 0 or -1 (dt_last_error). */
int krea2_synth_write(const krea2_config *c, const char *dir, int bits, int group, uint64_t seed);

/* Random forward inputs for a grid_h x grid_w latent and t text tokens (krea2_forward's layouts):
 * img [N, in_channels] and txt [t, text_layers, text_dim] uniform in [-1, 1), pos [t+N, n_axes] as the
 * pipeline builds them (text rows zero, image rows (0, row, col)), mask [t] (NULL = none) from
 * krea2_synth_mask: the pipeline's [prompt | padding | 5 suffix tokens] layout. */
void krea2_synth_inputs(const krea2_config *c, int grid_h, int grid_w, int t, uint64_t seed, float *img, float *txt,
                        float *pos, uint8_t *mask);
void krea2_synth_mask(int t, uint8_t *mask);

#endif
