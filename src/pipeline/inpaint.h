/* inpaint.h — the inpainting arithmetic of the FLUX.2-klein pipeline (diffusers Flux2KleinInpaintPipeline, with
 * FlowMatchEulerDiscreteScheduler.scale_noise): which steps of the schedule run for a strength, the noise mixed with
 * the init image's latents at the first kept timestep, and the kept region restored after each step from the init
 * latents re-noised at the next timestep (the mask on the packed latent grid comes from image/edit_prep.h).
 *
 * Latents here are packed tokens [N, C] (N = h·w, token = row·w + col) in the normalized latent space; the mask is
 * one value per token (1 = repaint, 0 = keep). Float32 throughout, each product and sum rounded as torch does. */
#ifndef DT_INPAINT_H
#define DT_INPAINT_H

#include <stddef.h>

/* The steps a strength keeps (the reference's get_timesteps): init = min(steps · strength, steps) in float64,
 * t_start = (int)max(steps − init, 0); steps t_start .. steps−1 of the full schedule run (*n_run of them).
 * strength must be in (0, 1] (then at least one step runs); else an error naming it. steps >= 1. 0 or -1. */
int dt_inpaint_steps(int steps, double strength, int *t_start, int *n_run);

/* Flow-matching forward process: out[i] = sigma · noise[i] + (1 − sigma) · x[i] (out may alias x or noise). */
void dt_scale_noise(float *out, const float *x, const float *noise, size_t n, float sigma);

/* After a step: x = (1 − m) · init' + m · x per token (mask m [N], broadcast over the C channels), where init' is
 * the init latents re-noised with `noise` at sigma_next (the schedule's next sigma), or the init latents
 * themselves after the last step (last = 1). x, init, noise [N, C]. */
void dt_inpaint_restore(float *x, const float *init, const float *noise, const float *mask, int N, int C,
                        float sigma_next, int last);

#endif
