/* krea2_pipeline.h — the Krea 2 text-to-image pipeline (diffusers Krea2Pipeline) on one backend:
 * Qwen-Image template -> Qwen3-VL hidden-state taps (krea2_prompt.h) -> noise [z, h, w] packed p×p ->
 * flow-matching Euler loop over the Krea 2 transformer (resolution-dependent time shift, or mu = 1.15
 * for distilled checkpoints; classifier-free guidance cond + g·(cond − uncond) whenever g > 0) ->
 * unpack, de-normalize by latents_mean / latents_std -> Qwen-Image VAE decoder -> 8-bit RGB.
 *
 * A pipeline root is Krea 2 when its model_index.json says `_class_name: Krea2Pipeline`; it carries
 * `text_encoder_select_layers` (the taps), `is_distilled` and `patch_size`.
 */
#ifndef DT_KREA2_PIPELINE_H
#define DT_KREA2_PIPELINE_H

#include <stdint.h>

#include "backends/backend.h"
#include "pipeline/generate.h"

/* 1 when ROOT/model_index.json names Krea2Pipeline, 0 otherwise (no error set). */
int dt_krea2_is_pipeline(const char *root);

typedef struct dt_krea2_pipe dt_krea2_pipe;

/* Open a Krea 2 pipeline root: model_index.json, tokenizer, scheduler and every component's geometry are
 * read and checked against each other; weights are loaded on first use (dt_krea2_pipe_generate) and kept.
 * taps/n_taps override text_encoder_select_layers when n_taps > 0. NULL on error (dt_last_error). */
dt_krea2_pipe *dt_krea2_pipe_open(dt_backend *be, const char *root, const int *taps, int n_taps, int te_inv_freq_bf16);
void dt_krea2_pipe_free(dt_krea2_pipe *k);

/* Free the text encoder after each prompt and reload it for the next (one-shot runs: peak memory is the
 * larger of text encoder and transformer + VAE instead of their sum). Default 0: keep it. */
void dt_krea2_pipe_release_text_encoder(dt_krea2_pipe *k, int on);

/* Generate one image with p (its model-independent fields: prompt, negative_prompt, height, width, steps,
 * seed, guidance, noise_file, max_seq_len). Defaults: 28 steps and guidance 4.5, or 8 steps and guidance 0
 * for distilled checkpoints; height/width rounded up to multiples of vae_scale_factor·patch_size (as the
 * reference). --noise: in.initial_latents [1, z, H/s, W/s], the latent grid before packing.
 * Observer names: prompt_embeds [1,T,taps,D], prompt_mask [1,T], sigmas, timesteps, stepK.latents_packed
 * [1,N,z·p²], latents_unpacked [1,z,H/s,W/s] (de-normalized), image_float [1,H,W,3].
 * *rgb malloc'd [H, W, 3]. 0 or -1 (dt_last_error). */
int dt_krea2_pipe_generate(dt_krea2_pipe *k, const dt_gen_params *p, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                           dt_gen_observer obs, void *obs_ud);

/* One-shot: open, generate one image with the text encoder released before the transformer loads, free
 * (what dt_generate does for a Krea 2 root). */
int dt_krea2_generate(dt_backend *be, const dt_gen_params *p, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                      dt_gen_observer obs, void *obs_ud);

#endif
