/* sampler.h — the flow-matching Euler loop every family runs: for each step, the model's velocity
 * (one pass, or two with classifier-free guidance), the guidance combination, the Euler update,
 * per-step observation, timing, progress and cancellation. The model itself is a callback. */
#ifndef DT_SAMPLER_H
#define DT_SAMPLER_H

#include <stddef.h>

#include "backends/backend.h"
#include "pipeline/generate.h"

/* How the two passes combine (v = velocity of the positive prompt, u = of the negative one). */
typedef enum {
    DT_CFG_FROM_UNCOND = 0,   /* u + g·(v − u)   (FLUX.2-klein, as its diffusers pipeline) */
    DT_CFG_FROM_COND,         /* v + g·(v − u)   (Krea 2) */
} dt_cfg_rule;

/* v [n] = the model's velocity at step i for latents x [n]; pass 0 = the prompt, 1 = the negative prompt.
 * fbc: the pass's First Block Cache state for the forward (NULL: every block runs). 0 or -1 (dt_last_error). */
typedef int (*dt_predict_fn)(void *ctx, int step, const float *x, int pass, float *v, dt_fbc_branch *fbc);
/* The same on backend matrices x, v [rows, n / rows] F32 (the device path, taken when no step cache is on): queued
 * work, 0 or -1. */
typedef int (*dt_predict_dev_fn)(void *ctx, int step, dt_mat x, int pass, dt_mat v);
/* Both passes of step i in one forward (the guidance batch: the prompt and the negative prompt as a batch of 2):
 * v [n] = pass 0's velocity, u [n] = pass 1's, as predict would give them. 0 or -1. */
typedef int (*dt_predict_pair_fn)(void *ctx, int step, const float *x, float *v, float *u);
/* The same on backend matrices (the device path): queued work, 0 or -1. */
typedef int (*dt_predict_pair_dev_fn)(void *ctx, int step, dt_mat x, dt_mat v, dt_mat u);
/* Optional, after step i's update of x (e.g. inpainting restores the kept region). */
typedef void (*dt_after_step_fn)(void *ctx, int step, float *x);
/* Optional family guidance (with cfg; Z-Image): the guidance scale of step i (<= 0: the step runs pass 0 only). */
typedef float (*dt_step_guidance_fn)(void *ctx, int step);
/* Optional family combination (with cfg): v [n] = the guided velocity of step i from v (pass 0) and u (pass 1) at
 * scale g, in place of the rule's elementwise one (Z-Image's cfg_normalization needs the whole prediction's norms). */
typedef void (*dt_cfg_combine_fn)(void *ctx, int step, float g, float *v, const float *u, size_t n);

typedef struct {
    int steps;                  /* steps to run: sigmas[first .. first + steps] */
    int first;                  /* index of the first sigma (> 0 when a strength skips the noisiest steps) */
    const float *sigmas;        /* [first + steps + 1] */
    const float *timesteps;     /* [first + steps] (for the log) */
    int cfg;                    /* two passes per step */
    float guidance;
    dt_cfg_rule rule;
    size_t n;                   /* latent values (tokens × channels) */
    const int64_t *obs_shape;   /* shape of the latents for "stepK.latents_packed" (3 dims) */
    dt_predict_fn predict;
    dt_after_step_fn after_step;
    dt_step_guidance_fn step_guidance;   /* NULL: every step guided at `guidance` */
    dt_cfg_combine_fn combine;           /* NULL: `rule` */
    void *ctx;
    float *v, *u;               /* scratch [n] each (u only with cfg) */
    /* Optional device path (used when predict_dev and be are set and after_step is NULL): the latents stay on be as
     * an F32 [rows, n / rows] matrix between steps, uploaded once and downloaded at the end (and for each observed
     * step); the guidance and the Euler update run as be->flow_step, equal to the host loop bit for bit. Not taken
     * with step_guidance or combine. */
    dt_predict_dev_fn predict_dev;
    dt_backend *be;
    int64_t rows;               /* latent tokens (n / rows channels each) */
    /* Optional guidance batch (with cfg; the family sets them when --guidance-batch is on and its model can): a
     * guided step's two passes in one forward (predict_pair, or predict_pair_dev on the device path). Not taken with
     * a step cache (each branch keeps its own state: two passes, said in the -v log). */
    dt_predict_pair_fn predict_pair;
    dt_predict_pair_dev_fn predict_pair_dev;
} dt_sampler;

/* Run the loop on x [n] in place. Progress and cancellation from g, step caching from g->cache (per guidance
 * branch; tm->passes_computed of tm->passes); per-step timings into tm.
 * 0, -1 or DT_GEN_CANCELLED. */
int dt_sample(const dt_sampler *s, float *x, const dt_gen_params *g, double t_request_start, dt_gen_timings *tm,
              dt_gen_observer obs, void *ud);

#endif
