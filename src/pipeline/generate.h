/* generate.h — the FLUX.2-klein text-to-image pipeline (diffusers Flux2KleinPipeline):
 * tokenizer -> Qwen3 taps -> noise -> flow-matching Euler loop over the DiT (optional CFG) ->
 * latent de-normalization -> VAE decode -> 8-bit RGB. See spec section 2. */
#ifndef DT_GENERATE_H
#define DT_GENERATE_H

#include <stdint.h>

#include "backends/backend.h"

#define DT_GEN_MAX_TAPS 16

typedef struct {
    const char *model;          /* pipeline root (model_index.json + component folders) */
    const char *prompt;
    const char *negative_prompt;/* CFG only; default "" as the reference */
    int height, width;          /* pixels; floored to a multiple of 16 (with a warning) */
    int steps;                  /* 0 = default: 4 for distilled models, 50 otherwise */
    uint64_t seed;
    float guidance;             /* < 0 = default 4.0; used only for non-distilled models */
    const char *noise_file;     /* optional safetensors with in.initial_latents [1, C, h, w] */
    int max_seq_len;            /* text tokens (default 512) */
    int taps[DT_GEN_MAX_TAPS];  /* text-encoder hidden-state taps; n_taps = 0: default */
    int n_taps;
    int te_inv_freq_bf16;       /* text encoder RoPE inv_freq rounded to bf16 (how the fixtures were made) */
    int cuda_graph;             /* replay the DiT forward as a CUDA graph after the first steps */
} dt_gen_params;

void dt_gen_params_default(dt_gen_params *p);

/* Observer of intermediate results (tests, --save-latents): names "input_ids", "attention_mask",
 * "prompt_embeds", "sigmas", "timesteps", "stepK.latents_packed", "latents_unpacked", "image_float".
 * data is host f32, n elements; shape [d0, d1, d2, d3] with ndim entries. */
typedef void (*dt_gen_observer)(void *ud, const char *name, const float *data, int ndim, const int64_t *shape);

typedef struct {
    double t_load, t_encode, t_denoise, t_decode, t_total;  /* seconds */
    double t_step[256];                                     /* per step (first 256) */
    int steps;
    int height, width;
} dt_gen_timings;

/* Runs the pipeline on backend be. On success *rgb is malloc'd [height, width, 3] and *w, *h are set.
 * Progress lines go to stderr (dt_log level 1). Returns 0 or -1 (dt_last_error). */
int dt_generate(dt_backend *be, const dt_gen_params *p, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                dt_gen_observer obs, void *obs_ud);

#endif
