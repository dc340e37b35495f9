/* engine.h — a resident pipeline: tokenizer, text encoder, transformer and VAE loaded once, then any
 * number of image requests. The model family (FLUX.2-klein, Krea 2, ...) is picked from the root's
 * model_index.json (`_class_name`) and implemented behind dt_family (pipeline/family.h).
 *
 * After the first image of a size, a request allocates no new device memory: the DiT's activations
 * are kept per (image tokens, text tokens) and the backend reuses freed blocks.
 * One pipeline serves one request at a time (a server runs one worker per pipeline). */
#ifndef DT_ENGINE_H
#define DT_ENGINE_H

#include "pipeline/generate.h"

typedef struct dt_pipeline dt_pipeline;

/* What a loaded pipeline is. */
typedef struct {
    const char *family;         /* "flux2-klein", "krea2", ... */
    const char *class_name;     /* model_index.json's _class_name */
    int distilled;              /* is_distilled: no classifier-free guidance by default */
    int default_steps;
    float default_guidance;     /* what guidance < 0 means */
    int size_multiple;          /* width and height are floored to multiples of this */
    int size_round_up;          /* 1: rounded up instead (Krea 2, as its reference pipeline) */
    int max_side;               /* the largest width/height the schedule and the positions allow */
    int editing;                /* takes reference images and inpainting inputs (dt_gen_params.refs, init_image) */
    int kv_refs;                /* references are KV-cached (Flux2KleinKVPipeline) */
    int img2img;                /* an init image without a mask is img2img (Z-Image) */
    int cfg_shaping;            /* takes cfg_normalization / cfg_truncation (Z-Image) */
    int64_t max_image_tokens;   /* the most (W / size_multiple)·(H / size_multiple) its time shift holds; 0 = no bound */
} dt_pipeline_info;

/* Load every component of the pipeline at o->model on be. NULL on error (dt_last_error names the file). */
dt_pipeline *dt_pipeline_load(dt_backend *be, const dt_pipeline_opts *o);
void dt_pipeline_free(dt_pipeline *p);
const dt_pipeline_info *dt_pipeline_get_info(const dt_pipeline *p);
dt_backend *dt_pipeline_backend(const dt_pipeline *p);

/* A request's defaults filled in from the pipeline's description (steps, guidance, text tokens, 1024x1024) and its
 * ranges checked, without running it; width and height are floored to the size multiple (rounded up when the
 * pipeline's size_round_up is set). With editing inputs a side left at 0 stays 0 (the family takes it from the first
 * reference; inpainting from the init image), and the inputs are checked together (a mask needs an init image and
 * the other way round, strength in (0, 1] and only with an init image, at most DT_GEN_MAX_REFS references).
 * 0 or -1 (dt_last_error).
 * dt_pipeline_generate resolves every request through this; a server checks requests with it before queueing. */
int dt_gen_params_resolve(const dt_pipeline_info *in, dt_gen_params *g);

/* Generate one image (see dt_generate for the outputs): g resolved (dt_gen_params_resolve), then run.
 * 0, -1 (dt_last_error) or DT_GEN_CANCELLED. */
int dt_pipeline_generate(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                         dt_gen_observer obs, void *obs_ud);
/* The same for a request already resolved against this pipeline's info (a server resolves each request once, when
 * it checks it before queueing: serve/api.c), run as it is. */
int dt_pipeline_generate_resolved(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h,
                                  dt_gen_timings *tm, dt_gen_observer obs, void *obs_ud);

#endif
