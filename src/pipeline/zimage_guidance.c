/* zimage_guidance.c — Z-Image's guidance schedule and combination (zimage_guidance.h). */
#include "zimage_guidance.h"

#include <math.h>

float zimage_step_guidance(float guidance, float cfg_truncation, float timestep) {
    if (!(guidance > 0.0f)) return 0.0f;
    const float t_norm = (1000.0f - timestep) / 1000.0f;   /* f32, as the reference's tensor arithmetic */
    if (cfg_truncation <= 1.0f && t_norm > cfg_truncation) return 0.0f;
    return guidance;
}

void zimage_cfg_combine(const float *pos, const float *neg, size_t n, float g, float cfg_normalization, float *out) {
    double pos2 = 0, out2 = 0;
    for (size_t i = 0; i < n; i++) {
        const float p = pos[i], v = p + g * (p - neg[i]);
        pos2 += (double)p * p;
        out2 += (double)v * v;
        out[i] = v;
    }
    if (!(cfg_normalization > 0.0f)) return;
    const float max_norm = (float)sqrt(pos2) * cfg_normalization, norm = (float)sqrt(out2);
    if (norm > max_norm) {
        const float k = max_norm / norm;
        for (size_t i = 0; i < n; i++) out[i] *= k;
    }
}
