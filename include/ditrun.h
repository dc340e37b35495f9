/* ditrun.h — the public C API of libditrun (build/libditrun.a).
 *
 * One image:
 *   ditrun_engine *e = ditrun_engine_create("auto", 0);            // cuda when a GPU is usable
 *   ditrun_image img;
 *   ditrun_generate_opts o = ditrun_generate_defaults();
 *   o.model = "FLUX.2-klein-4B"; o.prompt = "a fox in the snow";
 *   if (ditrun_generate(e, &o, &img) == 0) { ...img.rgb [h][w][3]...; ditrun_image_free(&img); }
 *   else fprintf(stderr, "%s\n", ditrun_last_error());
 *   ditrun_engine_free(e);
 *
 * Many images with the models kept loaded (what a server does):
 *   ditrun_load_opts lo = ditrun_load_defaults(); lo.model = "FLUX.2-klein-4B";
 *   ditrun_pipeline *p = ditrun_pipeline_load(e, &lo);
 *   for (...) { o.prompt = ...; o.seed = ...; ditrun_pipeline_generate(p, &o, &img); ... }
 *   ditrun_pipeline_free(p);
 *
 * Lower level: ditrun_transformer_load / ditrun_transformer_forward run one DiT step on host arrays.
 * Every function returns 0 / non-NULL on success; on failure ditrun_last_error() says what, naming
 * the file, tensor or option. Thread safety: one engine per thread; a pipeline runs one request at a
 * time (its cancel flag may be set from another thread). */
#ifndef DITRUN_H
#define DITRUN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char *ditrun_version(void);
const char *ditrun_last_error(void);

typedef struct ditrun_engine ditrun_engine;
/* backend: "cpu", "cuda" or "auto"; threads: CPU threads (0 = all cores). */
ditrun_engine *ditrun_engine_create(const char *backend, int threads);
void ditrun_engine_free(ditrun_engine *e);
const char *ditrun_engine_backend(const ditrun_engine *e);
/* Precision of the DiT blocks' Linears for transformers loaded (or generations started) from now on:
 * "bf16" (default) or "fp8" (e4m3 weights with per-output-channel scales, e4m3 activations with per-token
 * scales; opt-in: see ditrun forward --compare-bf16 for its error). -1 on an unknown value. */
int ditrun_engine_set_precision(ditrun_engine *e, const char *precision);
/* Precision of the DiT blocks' attention (FLUX.2) for transformers loaded from now on: "bf16" (default) or "fp8"
 * (e4m3 Q/K/V/P with one scale per tensor; CUDA through cuDNN's fp8 attention; opt-in). -1 on an unknown value. */
int ditrun_engine_set_attn_precision(ditrun_engine *e, const char *precision);

/* Progress after each denoising step (step = 1..steps; seconds since the request started). Return non-zero to
 * cancel the request. */
typedef int (*ditrun_progress_fn)(void *user, int step, int steps, double elapsed_s);

/* An input image for editing: a file (path), or PNG/JPEG/WebP bytes in memory (data, size; name, if set, is used in
 * error messages). */
typedef struct {
    const char *path;
    const void *data;
    size_t size;
    const char *name;
} ditrun_image_input;

typedef struct {
    const char *model;          /* pipeline root (ditrun_generate only; a pipeline knows its own) */
    const char *prompt;
    const char *negative_prompt;/* classifier-free guidance only; NULL = "" as the reference */
    int width, height;          /* 0 = 1024; floored to the model's size multiple (16 for FLUX.2) */
    int steps;                  /* 0 = model default (4 distilled, 50 base) */
    uint64_t seed;
    float guidance;             /* < 0 = the model's default (4.0, base models only) */
    int max_sequence_length;    /* 0 = 512 */
    const float *noise;         /* optional initial noise (the model's in.initial_latents layout), noise_len values */
    int64_t noise_len;
    ditrun_progress_fn progress;/* optional, called after each step */
    void *progress_user;
    const volatile int *cancel; /* optional: set non-zero (any thread) to stop the request at a step or DiT block */
    /* image editing (FLUX.2-klein; a Flux2KleinKVPipeline model caches the references' attention keys/values): */
    const ditrun_image_input *images;      /* reference images in order (n_images, at most 16); width/height left
                                            * at 0 come from the first one (resized to 1024x1024 pixels of area when
                                            * larger, cropped to the size multiple) */
    int n_images;
    const ditrun_image_input *init_image;  /* inpainting: the image to edit (its size is the output size); without a
                                            * mask img2img where the model has it (Z-Image) */
    const ditrun_image_input *mask;        /* inpainting: the init image's size, white = repaint, black = keep */
    double strength;                       /* inpainting, img2img: (0, 1], the share of the steps that run; 0 = 0.8 */
    const char *cache;          /* step caching (README, "Step caching"): NULL or "off", "first-block=T",
                                 * "taylorseer=N[:ORDER]"; a bad value fails the request */
    int vae_tiling, vae_tile_size;         /* ditrun_generate only (a pipeline has them in ditrun_load_opts): tiled
                                            * VAE decoding/encoding, see ditrun_load_opts */
    int guidance_batch;                    /* ditrun_generate only: see ditrun_load_opts */
    int64_t max_vram;                      /* ditrun_generate only: a GPU memory budget in bytes for this call: the
                                            * image is planned within it (the VAE tiles when needed; a budget below
                                            * the smallest workable fails before loading, naming it) and a CUDA
                                            * engine's pool refuses to hold more; 0 = the card's free memory */
    /* Z-Image's guidance shaping (other models fail a request that sets them); < 0 = not given (off, 1): */
    float cfg_normalization;    /* > 0: the guided prediction's norm capped at this times the prompt's */
    float cfg_truncation;       /* no guidance on steps whose (1000 − t)/1000 exceeds it (> 1: never) */
} ditrun_generate_opts;

typedef struct { uint8_t *rgb; int width, height; } ditrun_image;   /* rgb [height][width][3] */

/* What a cancelled request returns (ditrun_last_error() says so). */
#define DITRUN_CANCELLED (-2)

ditrun_generate_opts ditrun_generate_defaults(void);
int ditrun_generate(ditrun_engine *e, const ditrun_generate_opts *o, ditrun_image *out);
void ditrun_image_free(ditrun_image *img);

/* ---- resident pipelines: components loaded once, many images ---- */
typedef struct ditrun_pipeline ditrun_pipeline;
typedef struct {
    const char *model;                  /* pipeline root (model_index.json, tokenizer/, text_encoder/, ...) */
    int text_encoder_layers[16];        /* hidden-state taps; n = 0: the model's default */
    int n_text_encoder_layers;
    int cuda_graph;                     /* replay the DiT forward as a CUDA graph */
    int guidance_batch;                 /* 1: a guided step's prompt and negative prompt in one forward (a batch of
                                         * 2, each weight read once) where the model can (Krea 2, FLUX.2 base) and no
                                         * step cache is on (ditrun_load_defaults: 1, measured faster); 0: two
                                         * forwards */
    int release_text_encoder;           /* free the text encoder between prompts (less memory, slower) */
    int sequence_parallel;              /* N > 1: the DiT split over N GPUs (the engine's device and the next N-1;
                                         * NCCL) or N CPU thread ranks; call load, generate and free from one thread */
    const char *const *loras;           /* LoRA adapters for the DiT as "FILE[:SCALE]" (FLUX.2-klein), n_loras of
                                         * them (at most 8): merged into dense weights, side products on quantized */
    int n_loras;
    int vae_tiling;                     /* decode/encode images larger than a tile in overlapping tiles, blended as
                                         * diffusers' enable_tiling: VAE memory follows the tile, not the image */
    int vae_tile_size;                  /* the tile side in pixels, a multiple of 4 x the VAE's factor (32 for the
                                         * released VAEs); 0 = the VAE's default (FLUX.2 1024, Qwen-Image 256) */
} ditrun_load_opts;
typedef struct {
    const char *family;                 /* "flux2-klein", "krea2", ... */
    int distilled, default_steps;
    float default_guidance;
    int size_multiple, max_side;        /* sizes are floored to size_multiple; max_side pixels at most */
    int editing;                        /* takes reference images and inpainting inputs */
    int kv_refs;                        /* caches the references' attention keys/values (Flux2KleinKVPipeline) */
    int img2img;                        /* an init image without a mask is img2img (Z-Image) */
    int cfg_shaping;                    /* takes cfg_normalization / cfg_truncation (Z-Image) */
} ditrun_pipeline_info;

ditrun_load_opts ditrun_load_defaults(void);
/* Loads every component now (the engine's precision settings apply). The engine must outlive it. */
ditrun_pipeline *ditrun_pipeline_load(ditrun_engine *e, const ditrun_load_opts *o);
void ditrun_pipeline_free(ditrun_pipeline *p);
ditrun_pipeline_info ditrun_pipeline_describe(const ditrun_pipeline *p);
/* One image (o->model is ignored). 0, -1 or DITRUN_CANCELLED. */
int ditrun_pipeline_generate(ditrun_pipeline *p, const ditrun_generate_opts *o, ditrun_image *out);

/* One FLUX.2 transformer step. Arrays are f32 host memory:
 *   img [n_img, in_channels], txt [n_txt, joint_dim], img_ids [n_img, 4], txt_ids [n_txt, 4],
 *   out [n_img, out_channels]; timestep = sigma in [0, 1]. */
typedef struct ditrun_transformer ditrun_transformer;
ditrun_transformer *ditrun_transformer_load(ditrun_engine *e, const char *path);
void ditrun_transformer_free(ditrun_transformer *t);
int ditrun_transformer_dims(const ditrun_transformer *t, int *in_channels, int *out_channels, int *joint_dim);
int ditrun_transformer_forward(ditrun_transformer *t, const float *img, int n_img, const float *txt, int n_txt,
                               float timestep, const float *img_ids, const float *txt_ids, float *out);

#ifdef __cplusplus
}
#endif
#endif
