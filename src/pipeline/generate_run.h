/* generate_run.h — the one generate skeleton every family's `generate` slot (family.h) runs: text encoding → noise →
 * schedule → sampling → decoding, with the family-specific parts as hooks. The skeleton owns the order, the timings
 * (load, encode, denoise via the sampler, decode, total), the cancellation checks between stages, the DiT's cancel
 * flag around the loop, the observer events it can name itself ("sigmas", "timesteps", the sampler's
 * "stepK.latents_packed" and "cache_computed", "image_float"), the buffers of the common path (noise grid, latent
 * tokens, schedule, velocities) and the output image; step caching, the device-side flow_step and CUDA graphs stay
 * in the sampler and the DiT (sampler.h, step_cache.h, dit.h), which the skeleton calls as the families did.
 *
 * Adopting it (a family's generate):
 *   static int NAME_generate(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h,
 *                            dt_gen_timings *tm, dt_gen_observer obs, void *ud) {
 *       NAME_request q = {0};                         // the family's per-request state (the hooks' ctx)
 *       return dt_generate_run(p, g, &NAME_hooks, &q, rgb, w, h, tm, obs, ud);
 *   }
 * with a static const dt_gen_hooks NAME_hooks = {...}. Each hook gets the request's state `r` (below: p, g, tm,
 * obs/ud, and what the earlier hooks set) and the family's ctx; each returns 0 or -1 with dt_last_error set (prepare's
 * value is passed on as it is, e.g. DT_GEN_CANCELLED; the skeleton checks cancellation itself after the prompts and
 * after the loop). Required: load_text, encode, load_models, geometry,
 * pack, schedule, sampler, decode; optional (NULL): prepare, sampled, finish. finish runs on every exit, success or
 * not (a failed prepare included): free the ctx's buffers there. */
#ifndef DT_GENERATE_RUN_H
#define DT_GENERATE_RUN_H

#include "models/dit.h"
#include "pipeline/family.h"
#include "pipeline/sampler.h"

/* One request as it runs: what the skeleton gives the hooks, and what they tell it. */
typedef struct {
    /* ---- given ---- */
    dt_pipeline *p;
    const dt_gen_params *g;     /* resolved by the engine (dt_gen_params_resolve): prompt set, steps > 0, sizes */
    dt_gen_timings *tm;
    dt_gen_observer obs;        /* NULL: nothing observed */
    void *ud;
    double t_start;             /* dt_now() when the request started (the sampler's progress clock) */
    /* ---- set by prepare (or left): ---- */
    int cfg;                    /* classifier-free guidance: two DiT passes per step (0: one) */
    /* ---- set by load_models: ---- */
    dt_dit *dit;                /* the DiT (its cancel flag is set around the loop) */
    /* ---- set by geometry: ---- */
    int H, W;                   /* output pixels */
    int nc, nh, nw;             /* the noise grid [nc, nh, nw] as drawn (dt_gen_noise) or read (--noise) */
    int N, C;                   /* latent tokens and channels per token: the sampled latents x [N, C] */
    char layout[160];           /* the noise grid's shape in messages ("[1, C, h, w] for a WxH image") */
} dt_gen_run;

typedef struct {
    /* Before anything loads: refuse what the family cannot run, prepare editing inputs (a bad image fails before
     * any model runs), set r->cfg. Optional. */
    int (*prepare)(void *ctx, dt_gen_run *r);
    /* The text encoder resident when this request needs it (a family caching prompt features may skip it).
     * Timed as load. */
    int (*load_text)(void *ctx, dt_gen_run *r);
    /* The prompts (and with r->cfg the negative prompt) encoded into the ctx, observed ("input_ids",
     * "attention_mask", "prompt_embeds", ...), the encoder released when the pipeline releases it
     * (dt_family_release_text_encoder). Timed as encode. */
    int (*encode)(void *ctx, dt_gen_run *r);
    /* DiT and VAE resident (already, unless the pipeline releases its text encoder); sets r->dit. Timed as load. */
    int (*load_models)(void *ctx, dt_gen_run *r);
    /* The request's geometry once the models are loaded: r->H, W, nc, nh, nw, N, C and r->layout (a family with
     * editing inputs encodes them here, and they may set the size). */
    int (*geometry)(void *ctx, dt_gen_run *r);
    /* The noise grid noise [nc, nh, nw] as latent tokens x [N, C] (the family's packing), and the positions the
     * DiT reads kept in the ctx. */
    void (*pack)(void *ctx, dt_gen_run *r, const float *noise, float *x);
    /* sigmas [steps + 1] and timesteps [steps] for r->g->steps over N tokens (the family's time shift). */
    int (*schedule)(void *ctx, dt_gen_run *r, float *sigmas, float *timesteps);
    /* The sampling loop's family part, on the dt_sampler the skeleton filled (steps = g->steps, first = 0, sigmas,
     * timesteps, cfg, guidance, n = N·C, obs_shape [1, N, C], v, u, be = the pipeline's backend, rows = N): set
     * predict (and predict_dev for the device path, after_step, rule) with ctx; a family starting later (inpainting)
     * moves first/steps, sets r->tm->steps and mixes x. Put the text features and references on the DiT here. */
    int (*sampler)(void *ctx, dt_gen_run *r, float *x, dt_sampler *sm);
    /* After the loop, with its result rc (0, -1, DT_GEN_CANCELLED): e.g. drop per-request references. Optional. */
    void (*sampled)(void *ctx, dt_gen_run *r, int rc);
    /* The sampled latents x [N, C] decoded: unpacked, de-normalized, observed as "latents_unpacked", through the
     * VAE into img [3, H, W] f32 (when the request is observed: img set, rgb NULL) or straight into rgb [H, W, 3]
     * 8-bit (img NULL). */
    int (*decode)(void *ctx, dt_gen_run *r, const float *x, float *img, uint8_t *rgb);
    /* Every exit (success, failure, cancellation), with the request's result rc: free the ctx's buffers. Optional. */
    void (*finish)(void *ctx, dt_gen_run *r, int rc);
} dt_gen_hooks;

/* Run one request through the hooks (the dt_family.generate contract: *rgb malloc'd [H, W, 3], *w, *h set on
 * success; timings into tm). 0, -1 (dt_last_error) or DT_GEN_CANCELLED. */
int dt_generate_run(dt_pipeline *p, const dt_gen_params *g, const dt_gen_hooks *h, void *ctx, uint8_t **rgb, int *w,
                    int *hgt, dt_gen_timings *tm, dt_gen_observer obs, void *ud);

#endif
