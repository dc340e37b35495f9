/* sampler.c — the flow-matching Euler loop shared by the families (sampler.h). */
#include "sampler.h"

#include <stdio.h>

#include "pipeline/family.h"
#include "pipeline/scheduler.h"

/* Pass `branch` of loop step k into out [n]: the model, or TaylorSeer's extrapolation. */
static int pass(const dt_sampler *s, dt_step_cache *sc, int k, const float *x, int branch, float *out) {
    const int i = s->first + k;
    sc->total++;
    if (!dt_taylorseer_computes(sc, k)) {
        dt_taylorseer_predict(sc, branch, k, out);
        return 0;
    }
    dt_fbc_branch *f = dt_step_cache_fbc(sc, branch, k);
    if (s->predict(s->ctx, i, x, branch, out, f)) return -1;
    sc->computed += f ? f->computed : 1;
    sc->decisions[2 * k + branch] = f ? (float)f->computed : 1.0f;
    if (f && f->diff >= 0)
        dt_log(2, "ditrun: step %d pass %d: first block's residual changed by %.4g: %s\n", k + 1, branch, f->diff,
               f->computed ? "computed" : "cached");
    dt_taylorseer_update(sc, branch, k, out);
    return 0;
}

static int sample_loop(const dt_sampler *s, dt_step_cache *sc, float *x, const dt_gen_params *g,
                       double t_request_start, dt_gen_timings *tm, dt_gen_observer obs, void *ud) {
    double td = dt_now();
    for (int k = 0; k < s->steps; k++) {
        const int i = s->first + k;
        if (dt_gen_cancelled(g)) return DT_GEN_CANCELLED;
        double ts0 = dt_now();
        if (pass(s, sc, k, x, 0, s->v)) return -1;
        if (s->cfg) {
            if (pass(s, sc, k, x, 1, s->u)) return -1;
            const float gs = s->guidance;
            float *v = s->v;
            const float *u = s->u;
            if (s->rule == DT_CFG_FROM_UNCOND)
                for (size_t j = 0; j < s->n; j++) v[j] = u[j] + gs * (v[j] - u[j]);
            else
                for (size_t j = 0; j < s->n; j++) v[j] = v[j] + gs * (v[j] - u[j]);
        }
        dt_euler_step(x, s->v, s->n, s->sigmas[i], s->sigmas[i + 1]);
        if (s->after_step) s->after_step(s->ctx, i, x);
        double dt = dt_now() - ts0;
        if (k < 256) tm->t_step[k] = dt;
        char nm[48];
        snprintf(nm, sizeof nm, "step%d.latents_packed", k);
        if (obs && s->obs_shape)
            dt_gen_observe(obs, ud, nm, x, 3, s->obs_shape[0], s->obs_shape[1], s->obs_shape[2], 0);
        /* a caller with a progress callback (a server, an API user) reports steps itself: the line only when verbose */
        dt_log(g->progress ? 2 : 1, "ditrun: step %d/%d  t=%.1f  %.3f s\n", k + 1, s->steps, s->timesteps[i], dt);
        if (g->progress && g->progress(g->progress_ud, k + 1, s->steps, dt_now() - t_request_start)) {
            dt_set_error("generate: cancelled after step %d of %d", k + 1, s->steps);
            return DT_GEN_CANCELLED;
        }
    }
    tm->t_denoise = dt_now() - td;
    return 0;
}

int dt_sample(const dt_sampler *s, float *x, const dt_gen_params *g, double t_request_start, dt_gen_timings *tm,
              dt_gen_observer obs, void *ud) {
    dt_step_cache sc;
    dt_step_cache_init(&sc, &g->cache, s->steps, s->n);
    int rc = sample_loop(s, &sc, x, g, t_request_start, tm, obs, ud);
    tm->passes_computed = sc.computed;
    tm->passes = sc.total;
    if (rc == 0) dt_gen_observe(obs, ud, "cache_computed", sc.decisions, 2, s->steps, 2, 0, 0);
    dt_step_cache_free(&sc);
    return rc;
}
