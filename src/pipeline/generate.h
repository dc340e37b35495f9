/* generate.h — what one image request and one pipeline load ask for, what they report back, and the
 * one-shot entry point (load, generate one image, free) that `ditrun generate` and the tests use.
 * The resident pipeline that keeps models loaded across many requests is pipeline/engine.h. */
#ifndef DT_GENERATE_H
#define DT_GENERATE_H

#include <stdint.h>

#include "backends/backend.h"
#include "models/lora.h"
#include "pipeline/step_cache.h"
#include "image/image.h"

#define DT_GEN_MAX_TAPS 16
#define DT_GEN_MAX_RANKS 16     /* sequence-parallel ranks (models/flux2_sp.h) */
#define DT_GEN_MAX_REFS 16      /* reference images per request */
#define DT_GEN_DEFAULT_STRENGTH 0.8    /* inpainting strength when none is given (the reference's default) */

/* Load-time choices of a pipeline (they decide what is loaded and how). */
typedef struct {
    const char *model;          /* pipeline root (model_index.json + component folders) */
    int taps[DT_GEN_MAX_TAPS];  /* text-encoder hidden-state taps; n_taps = 0: the model's default */
    int n_taps;
    int te_inv_freq_bf16;       /* text encoder RoPE inv_freq rounded to bf16 (how the fixtures were made) */
    int cuda_graph;             /* replay the DiT forward as a CUDA graph after the first steps */
    int guidance_batch;         /* --guidance-batch on: classifier-free guidance's prompt and negative prompt in one
                                 * forward per step (a batch of 2) where the family's model can (Krea 2, FLUX.2 base)
                                 * and no step cache is on (dt_pipeline_opts_default: 1); 0: two forwards */
    int release_text_encoder;   /* free the text encoder after each prompt and reload it for the next: peak memory
                                 * is the larger of text encoder and DiT + VAE instead of their sum (one-shot runs) */
    const dt_lora_spec *loras;  /* LoRA adapters for the DiT, n_loras of them (copied by dt_pipeline_load) */
    int n_loras;
    int lora_side;              /* side products for dense weights too instead of merging (comparisons) */
    int sequence_parallel;      /* N > 1: the DiT's forward split over N ranks (docs/sequence-parallel.md): N GPUs on
                                 * CUDA, N thread ranks on the CPU backend; 0 or 1: unsplit */
    int sp_devices[DT_GEN_MAX_RANKS];   /* CUDA device of rank r; n_sp_devices = 0: the backend's device + r */
    int n_sp_devices;
    int vae_tiling;             /* decode (and encode) images larger than a tile in overlapping tiles, blended, as
                                 * diffusers' enable_tiling (models/vae_tiling.h): memory follows the tile */
    int vae_tile;               /* its tile side in pixels; 0 = the VAE's default (FLUX.2: config sample_size,
                                 * 1024; Qwen-Image: 256) */
    int64_t max_vram;           /* the memory budget the load is planned within (pipeline/budget.h: dt_generate,
                                 * generate --count, serve): the VAE tiles and the text encoder is released when the
                                 * plan needs it, and a budget below the smallest workable is refused before anything
                                 * loads; 0 = a CUDA backend's own (its max_vram, else the card's free memory). The
                                 * pool's own bound is the backend's (dt_cuda_opts.max_vram) */
    dt_precision precision;     /* --precision: the DiT blocks' Linears (fp8: e4m3, families with an fp8 mode) */
    dt_precision attn_precision;/* --attn-precision: the DiT blocks' attention */
    int fp8_unfused;            /* A/B arm of fp8 Linears: input quantized in a pass of its own (flux2_load_opts) */
} dt_pipeline_opts;

void dt_pipeline_opts_default(dt_pipeline_opts *o);

/* Progress after each denoising step (step = 1..steps, seconds since the request started). Returning
 * non-zero cancels the request (as *cancel != 0 does). */
typedef int (*dt_gen_progress)(void *ud, int step, int steps, double elapsed_s);

/* One image request. */
typedef struct {
    const char *prompt;
    const char *negative_prompt;/* CFG only; default "" as the reference */
    int height, width;          /* pixels (0 = the model's default, 1024); floored to the model's size multiple */
    int steps;                  /* 0 = default: 4 for distilled models, 50 otherwise */
    uint64_t seed;
    float guidance;             /* < 0 = the model's default */
    int max_seq_len;            /* text tokens (0 = 512) */
    const char *noise_file;     /* optional safetensors with in.initial_latents (the model's noise layout) */
    const float *noise;         /* or the noise itself (noise_len values), the same layout */
    int64_t noise_len;
    dt_gen_progress progress;   /* optional */
    void *progress_ud;
    const volatile int *cancel; /* optional: non-zero cancels; checked between steps and before each DiT block */
    /* image editing (pipelines whose info.editing is set), decoded images (image/image.h) the caller keeps: */
    const dt_image *refs;       /* reference images in order (n_refs, 0..DT_GEN_MAX_REFS); a size not given comes
                                 * from the first one (after its preparation) */
    const char *const *ref_names;   /* their names in messages (file names; NULL: "reference image k") */
    int n_refs;
    const dt_image *init_image; /* inpainting (img2img without a mask where info.img2img): the image to edit (sets the
                                 * output size; height/width are ignored) */
    const dt_image *mask;       /* inpainting: white = repaint, the init image's size */
    const char *init_name, *mask_name;   /* their names in messages (NULL: "init image", "mask") */
    double strength;            /* inpainting: how much is repainted, (0, 1]; 0 = DT_GEN_DEFAULT_STRENGTH (a double: the
                                 * kept steps are floor(steps - steps·strength) in float64, as the reference computes) */
    dt_cache_opts cache;        /* step caching (pipeline/step_cache.h); zero: off */
    /* Guidance shaping (pipelines whose info.cfg_shaping is set: Z-Image; the others refuse a set one): */
    int cfg_normalization_set, cfg_truncation_set;   /* 1: the value below was given */
    float cfg_normalization;    /* > 0: the guided prediction's L2 norm capped at this times the prompt's (0: off, the
                                 * default) */
    float cfg_truncation;       /* guidance off on steps whose (1000 − timestep)/1000 exceeds it; > 1: never (default 1) */
} dt_gen_params;

void dt_gen_params_default(dt_gen_params *p);

/* Observer of intermediate results (tests, --save-latents): names "input_ids", "attention_mask",
 * "prompt_embeds", "sigmas", "timesteps", "stepK.latents_packed" (K counts the steps that run), "latents_unpacked",
 * "image_float", "cache_computed" [steps, 2] (per step and guidance branch, 1 = the transformer ran in full;
 * pipeline/step_cache.h); with editing inputs also "ref_latents_packed" [1, R, C] and "ref_ids" [1, R, 4] (every reference
 * token: for inpainting the init image's first).
 * data is host f32, n elements; shape [d0, d1, d2, d3] with ndim entries. */
typedef void (*dt_gen_observer)(void *ud, const char *name, const float *data, int ndim, const int64_t *shape);

typedef struct {
    double t_load, t_encode, t_denoise, t_decode, t_total;  /* seconds */
    double t_images;                                        /* editing: image preparation + VAE encoding */
    int prompts_cached;         /* prompts (positive, negative) whose features the previous request left (not encoded) */
    int refs_cached;            /* editing: 1 when the previous request's reference images were these (not encoded) */
    double t_step[256];                                     /* per step (first 256) */
    int steps;
    int height, width;
    int passes_computed, passes; /* transformer passes run in full / in all (fewer computed with a step cache) */
    int passes_paired;          /* of them, passes that ran two in one forward (the guidance batch) */
} dt_gen_timings;

/* The error code of a request stopped by its cancel flag or progress callback (dt_last_error says so). */
#define DT_GEN_CANCELLED (-2)

/* One-shot: load the pipeline, generate one image, free it. On success *rgb is malloc'd [height, width, 3]
 * and *w, *h are set. Progress lines go to stderr (dt_log level 1). Returns 0, -1 (dt_last_error) or
 * DT_GEN_CANCELLED. */
int dt_generate(dt_backend *be, const dt_pipeline_opts *lo, const dt_gen_params *p, uint8_t **rgb, int *w, int *h,
                dt_gen_timings *tm, dt_gen_observer obs, void *obs_ud);

#endif
