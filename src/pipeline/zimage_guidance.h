/* zimage_guidance.h — Z-Image's classifier-free guidance as ZImagePipeline defines it: on when guidance_scale > 0;
 * per step, cfg_truncation turns it off once t_norm = (1000 − timestep) / 1000 exceeds it; the combined prediction
 * pos + g·(pos − neg) is scaled back to at most cfg_normalization · ‖pos‖₂ when cfg_normalization > 0. NOTES.md
 * ("Z-Image").
 */
#ifndef DT_ZIMAGE_GUIDANCE_H
#define DT_ZIMAGE_GUIDANCE_H

#include <stddef.h>

/* The guidance scale of the step at scheduler timestep `timestep` (1000·sigma): `guidance`, or 0 when guidance is
 * off (guidance <= 0) or truncated (cfg_truncation <= 1 and (1000 − timestep)/1000 > cfg_truncation). A step with
 * scale 0 runs the positive prompt only. */
float zimage_step_guidance(float guidance, float cfg_truncation, float timestep);

/* out [n] = pos + g·(pos − neg) over one image's whole prediction, then, with cfg_normalization > 0, scaled by
 * cfg_normalization·‖pos‖ / ‖out‖ when ‖out‖ exceeds cfg_normalization·‖pos‖ (L2 norms over all n values). out may
 * alias pos or neg. */
void zimage_cfg_combine(const float *pos, const float *neg, size_t n, float g, float cfg_normalization, float *out);

#endif
