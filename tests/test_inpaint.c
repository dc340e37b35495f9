/* test_inpaint.c — the inpainting arithmetic (pipeline/inpaint.h): kept steps for a strength (float64 as the
 * reference), scale_noise, the per-step restoration, and the restoration against the inpaint fixture (with the
 * mask on the packed grid from image/edit_prep.h): in the kept region (mask 0) the reference's latents after each
 * step are the init latents re-noised at the next sigma, and the init latents themselves after the last step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "image/edit_prep.h"
#include "io/safetensors.h"
#include "pipeline/inpaint.h"
#include "pipeline/latents.h"
#include "pipeline/scheduler.h"
#include "test.h"

/* Float32 mixing of float32 values: a few roundings of values of order 1. */
#define MIX_TOL 1e-6

static void steps_for_strength(void) {
    /* expected (t_start) from Python's float arithmetic: int(max(steps - min(steps * s, steps), 0)) */
    static const struct { int steps; double s; int t_start; } v[] = {
        {4, 0.6, 1}, {4, 1.0, 0}, {4, 0.25, 3}, {4, 0.2, 3}, {10, 0.3, 7}, {28, 0.7, 8}, {50, 0.85, 7}, {3, 0.1, 2},
        {7, 0.35, 4}, {1, 0.01, 0},
    };
    int bad = -1;
    for (size_t i = 0; i < sizeof v / sizeof v[0] && bad < 0; i++) {
        int ts = -1, nr = -1;
        if (dt_inpaint_steps(v[i].steps, v[i].s, &ts, &nr) || ts != v[i].t_start || nr != v[i].steps - v[i].t_start)
            bad = (int)i;
    }
    T_CHECK("inpaint steps for a strength (float64 as the reference)", bad < 0, "case %d (%d steps, strength %g)", bad,
            bad >= 0 ? v[bad].steps : 0, bad >= 0 ? v[bad].s : 0.0);
    static const double out_of_range[] = {0.0, -0.1, 1.0000001, 2.0, 0.0 / 0.0};
    int accepted = 0;
    for (size_t i = 0; i < sizeof out_of_range / sizeof out_of_range[0]; i++) {
        int ts, nr;
        if (dt_inpaint_steps(4, out_of_range[i], &ts, &nr) == 0) accepted++;
        else if (!strstr(dt_last_error(), "--strength")) accepted += 100;
    }
    T_CHECK("inpaint strength outside (0, 1] refused with an error naming --strength", accepted == 0, "%d", accepted);
}

static void mixing(void) {
    float x[3] = {1.0f, -2.0f, 0.5f}, nz[3] = {0.25f, 4.0f, -1.0f}, o[3];
    dt_scale_noise(o, x, nz, 3, 0.75f);   /* 0.75 n + 0.25 x, exact in binary */
    T_CHECK("scale_noise = sigma noise + (1 - sigma) x", o[0] == 0.4375f && o[1] == 2.5f && o[2] == -0.625f,
            "%g %g %g", o[0], o[1], o[2]);
    /* restore: token 0 kept (m 0), token 1 repainted (m 1), token 2 half; C = 2 */
    float lat[6] = {9, 9, 9, 9, 9, 9}, init[6] = {1, 2, 3, 4, 5, 6}, noise[6] = {-1, -2, -3, -4, -5, -6}, m[3] = {0, 1, 0.5f};
    dt_inpaint_restore(lat, init, noise, m, 3, 2, 0.5f, 0);
    /* kept: 0.5 noise + 0.5 init = 0; repainted: 9; half: 0.5 * 0 + 0.5 * 9 */
    T_CHECK("restore: kept region re-noised at the next sigma, repainted region untouched",
            lat[0] == 0 && lat[1] == 0 && lat[2] == 9 && lat[3] == 9 && lat[4] == 4.5f && lat[5] == 4.5f,
            "%g %g %g %g %g %g", lat[0], lat[1], lat[2], lat[3], lat[4], lat[5]);
    float lat2[6] = {9, 9, 9, 9, 9, 9};
    dt_inpaint_restore(lat2, init, noise, m, 3, 2, 0.5f, 1);
    T_CHECK("restore after the last step: the init latents themselves",
            lat2[0] == 1 && lat2[1] == 2 && lat2[2] == 9 && lat2[4] == 7 && lat2[5] == 7.5f, "%g %g %g %g %g", lat2[0],
            lat2[1], lat2[2], lat2[4], lat2[5]);
}

/* The fixture: mask.png (white = repaint) prepared for the init image ref9.png (dt_prep_mask: binarized, on the 8x9
 * packed grid); in the tokens it keeps entirely (mask 0), the reference's latents after the last step are the init
 * latents, and after each earlier step the init latents re-noised at the next sigma with in.noise. */
static void fixture(void) {
    char p[600], mp[600];
    snprintf(p, sizeof p, "%s/edit/inpaint_io.safetensors", t_fixtures());
    st_file *io = st_open(p);
    snprintf(p, sizeof p, "%s/edit/ref9.png", t_fixtures());
    snprintf(mp, sizeof mp, "%s/edit/mask.png", t_fixtures());
    dt_image init = {0}, mk = {0};
    dt_prep_image prep = {0};
    float *m = NULL;
    const int multiple = 8;   /* the tiny VAE: 2 x vae_scale_factor 4 */
    if (!io || dt_image_read_file(p, &init) || dt_image_read_file(mp, &mk) || dt_prep_init_image(&init, p, multiple, &prep) ||
        dt_prep_mask(&mk, mp, init.w, init.h, prep.w, prep.h, multiple, NULL, &m)) {
        T_FAIL("inpaint fixture", "%s", dt_last_error());
        st_close(io); dt_image_free(&init); dt_image_free(&mk); dt_prep_image_free(&prep);
        return;
    }
    const st_tensor *nz = st_find(io, "in.noise");
    int C = (int)nz->shape[1], h = (int)nz->shape[2], w = (int)nz->shape[3], N = h * w, steps = 4, ts, nr;
    float *nf = st_to_f32(nz), *noise = malloc(sizeof(float) * (size_t)N * C);
    dt_latents_pack(nf, C, h, w, noise);
    float sig[5], tsv[4];
    dt_sched_config sc;
    snprintf(p, sizeof p, "%s/model/scheduler", t_fixtures());
    int ok = dt_sched_config_load(p, &sc) == 0 && dt_schedule_make(&sc, steps, N, sig, tsv) == 0 &&
             dt_inpaint_steps(steps, 0.6, &ts, &nr) == 0;
    int kept = 0, repaint = 0;
    for (int i = 0; i < N; i++) { kept += m[i] == 0.0f; repaint += m[i] == 1.0f; }
    T_CHECK("inpaint fixture: the mask keeps and repaints tokens", ok && kept > 0 && repaint > 0 && nr == 3,
            "%d kept, %d repainted, %d steps", kept, repaint, nr);
    const st_tensor *last = st_find(io, "mid.step2.latents_packed");
    float *init_lat = last ? st_to_f32(last) : NULL;   /* kept tokens: the init latents */
    for (int k = 0; ok && init_lat && k < nr - 1; k++) {
        char nm[128], rn[64];
        snprintf(rn, sizeof rn, "mid.step%d.latents_packed", k);
        const st_tensor *t = st_find(io, rn);
        float *ref = st_to_f32(t), *got = malloc(sizeof(float) * (size_t)N * C);
        memcpy(got, ref, sizeof(float) * (size_t)N * C);
        /* recompute the kept rows from init and noise at sigma[t_start + k + 1]; the repainted rows stay as they are */
        dt_inpaint_restore(got, init_lat, noise, m, N, C, sig[ts + k + 1], 0);
        float *a = malloc(sizeof(float) * (size_t)kept * C), *b = malloc(sizeof(float) * (size_t)kept * C);
        int j = 0;
        for (int i = 0; i < N; i++)
            if (m[i] == 0.0f) {
                memcpy(a + (size_t)j * C, got + (size_t)i * C, sizeof(float) * C);
                memcpy(b + (size_t)j * C, ref + (size_t)i * C, sizeof(float) * C);
                j++;
            }
        snprintf(nm, sizeof nm, "inpaint fixture step %d: kept tokens = init re-noised at the next sigma", k);
        t_check_rel_l2(nm, a, b, (size_t)kept * C, MIX_TOL);
        free(a); free(b); free(ref); free(got);
    }
    if (!init_lat) T_FAIL("inpaint fixture", "mid.step2.latents_packed missing");
    free(init_lat); free(nf); free(noise); free(m);
    dt_image_free(&init); dt_image_free(&mk); dt_prep_image_free(&prep);
    st_close(io);
}

int main(void) {
    steps_for_strength();
    mixing();
    fixture();
    return T_DONE();
}
