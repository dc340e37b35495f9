/* generate_run.c — the generate skeleton of every family (generate_run.h): prepare → text encoder → prompts →
 * DiT + VAE → geometry → noise → schedule → sampling loop → decode, each family part a hook. */
#include <stdlib.h>

#include "pipeline/generate_run.h"

int dt_generate_run(dt_pipeline *p, const dt_gen_params *g, const dt_gen_hooks *h, void *ctx, uint8_t **rgb_out,
                    int *w_out, int *h_out, dt_gen_timings *tm, dt_gen_observer obs, void *ud) {
    dt_gen_run r = {.p = p, .g = g, .tm = tm, .obs = obs, .ud = ud, .t_start = dt_now()};
    float *lat = NULL, *x = NULL, *v = NULL, *u = NULL, *sigmas = NULL, *timesteps = NULL, *img = NULL;
    uint8_t *rgb = NULL;
    int rc = -1;
    if (h->prepare && (rc = h->prepare(ctx, &r))) goto done;
    rc = -1;

    /* ---- text: the encoder (when needed), the prompts ---- */
    double t0 = dt_now();
    if (h->load_text(ctx, &r)) goto done;
    tm->t_load += dt_now() - t0;
    t0 = dt_now();
    if (h->encode(ctx, &r)) goto done;
    tm->t_encode = dt_now() - t0;
    if (dt_gen_cancelled(g)) { rc = DT_GEN_CANCELLED; goto done; }

    /* ---- DiT + VAE (already resident unless the pipeline releases its text encoder) ---- */
    t0 = dt_now();
    if (h->load_models(ctx, &r)) goto done;
    tm->t_load += dt_now() - t0;
    if (h->geometry(ctx, &r)) goto done;
    tm->height = r.H;
    tm->width = r.W;
    tm->steps = g->steps;

    /* ---- noise [nc, nh, nw] -> latent tokens x [N, C] ---- */
    const size_t n = (size_t)r.N * r.C;
    lat = dt_malloc(sizeof(float) * (size_t)r.nc * r.nh * r.nw);
    if (dt_gen_noise(g, lat, r.nc, r.nh, r.nw, r.layout)) goto done;
    x = dt_malloc(sizeof(float) * n);
    h->pack(ctx, &r, lat, x);

    /* ---- schedule ---- */
    sigmas = dt_malloc(sizeof(float) * (size_t)(g->steps + 1));
    timesteps = dt_malloc(sizeof(float) * (size_t)g->steps);
    if (h->schedule(ctx, &r, sigmas, timesteps)) goto done;
    dt_gen_observe(obs, ud, "sigmas", sigmas, 1, g->steps + 1, 0, 0, 0);
    dt_gen_observe(obs, ud, "timesteps", timesteps, 1, g->steps, 0, 0, 0);

    /* ---- denoising loop ---- */
    v = dt_malloc(sizeof(float) * n);
    if (r.cfg) u = dt_malloc(sizeof(float) * n);
    const int64_t shape[3] = {1, r.N, r.C};
    dt_sampler sm = {.steps = g->steps, .first = 0, .sigmas = sigmas, .timesteps = timesteps, .cfg = r.cfg,
                     .guidance = g->guidance, .n = n, .obs_shape = shape, .v = v, .u = u, .be = p->be, .rows = r.N};
    if (h->sampler(ctx, &r, x, &sm)) goto done;
    dt_dit_set_cancel(r.dit, g->cancel);   /* checked per block (a split forward: per step) */
    rc = dt_sample(&sm, x, g, r.t_start, tm, obs, ud);
    dt_dit_set_cancel(r.dit, NULL);
    if (h->sampled) h->sampled(ctx, &r, rc);
    if (rc) goto done;
    rc = -1;
    if (dt_gen_cancelled(g)) { rc = DT_GEN_CANCELLED; goto done; }

    /* ---- latents -> image ---- */
    double tdec = dt_now();
    if (obs) {   /* the float image is observed too */
        img = dt_malloc(sizeof(float) * 3 * (size_t)r.H * r.W);
        if (h->decode(ctx, &r, x, img, NULL)) goto done;
        rgb = dt_gen_image_rgb(img, r.H, r.W, obs, ud);
    } else {
        rgb = dt_malloc(3 * (size_t)r.H * r.W);
        if (h->decode(ctx, &r, x, NULL, rgb)) goto done;
    }
    tm->t_decode = dt_now() - tdec;
    tm->t_total = dt_now() - r.t_start;
    *rgb_out = rgb;
    rgb = NULL;
    *w_out = r.W;
    *h_out = r.H;
    rc = 0;
done:
    if (h->finish) h->finish(ctx, &r, rc);
    free(lat); free(x); free(v); free(u); free(sigmas); free(timesteps); free(img); free(rgb);
    return rc;
}
