/* inpaint.c — inpainting arithmetic (inpaint.h): kept steps for a strength, scale_noise, the mask on the packed
 * latent grid and the per-step restoration of the kept region. */
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

/* Source coordinate of output index d for a resize of `in` samples to `out` (half-pixel centres, clamped at 0),
 * as torch computes it in float: the index below, the one above (clamped) and the weight of the one above. */
static void bilinear_src(int d, int in, int out, int *i0, int *i1, float *l1) {
    float scale = (float)in / (float)out;
    float src = scale * ((float)d + 0.5f) - 0.5f;
    if (src < 0.0f) src = 0.0f;
    int a = (int)src;
    if (a > in - 1) a = in - 1;
    *i0 = a;
    *i1 = a + (a < in - 1 ? 1 : 0);
    *l1 = src - (float)a;
}

void dt_inpaint_mask_tokens(const float *mask, int H, int W, int h, int w, float *out) {
    for (int y = 0; y < h; y++) {
        int y0, y1;
        float ly1;
        bilinear_src(y, H, h, &y0, &y1, &ly1);
        float ly0 = 1.0f - ly1;
        for (int x = 0; x < w; x++) {
            int x0, x1;
            float lx1;
            bilinear_src(x, W, w, &x0, &x1, &lx1);
            float lx0 = 1.0f - lx1;
            const float *r0 = mask + (size_t)y0 * W, *r1 = mask + (size_t)y1 * W;
            float top = lx0 * r0[x0] + lx1 * r0[x1], bot = lx0 * r1[x0] + lx1 * r1[x1];
            out[(size_t)y * w + x] = ly0 * top + ly1 * bot;
        }
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
