/* inpaint.c — inpainting arithmetic (inpaint.h): kept steps for a strength, scale_noise and the per-step
 * restoration of the kept region. */
#include "pipeline/inpaint.h"

#include "core/common.h"

int dt_inpaint_steps(int steps, double strength, int *t_start, int *n_run) {
    if (!(strength > 0.0 && strength <= 1.0)) {
        dt_set_error("inpaint: --strength %g is out of range (0, 1]", strength);
        return -1;
    }
    if (steps < 1) { dt_set_error("inpaint: %d steps", steps); return -1; }
    double init = (double)steps * strength;
    if (init > steps) init = steps;
    double start = (double)steps - init;
    int ts = (int)(start > 0.0 ? start : 0.0);   /* < steps, as strength > 0: at least one step runs */
    *t_start = ts;
    *n_run = steps - ts;
    return 0;
}

void dt_scale_noise(float *out, const float *x, const float *noise, size_t n, float sigma) {
    const float keep = 1.0f - sigma;
    for (size_t i = 0; i < n; i++) {
        float a = sigma * noise[i], b = keep * x[i];
        out[i] = a + b;
    }
}

void dt_inpaint_restore(float *x, const float *init, const float *noise, const float *mask, int N, int C,
                        float sigma_next, int last) {
    const float keep_s = 1.0f - sigma_next;
    for (int i = 0; i < N; i++) {
        const float m = mask[i], km = 1.0f - m;
        float *xr = x + (size_t)i * C;
        const float *ir = init + (size_t)i * C, *nr = noise + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            float proper = ir[c];
            if (!last) {
                float a = sigma_next * nr[c], b = keep_s * ir[c];
                proper = a + b;
            }
            float kept = km * proper, fresh = m * xr[c];
            xr[c] = kept + fresh;
        }
    }
}
