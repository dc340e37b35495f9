/* sampler.c — the flow-matching Euler loop shared by the families (sampler.h). */
#include "sampler.h"

#include <stdio.h>

#include "pipeline/family.h"
#include "pipeline/scheduler.h"

int dt_sample(const dt_sampler *s, float *x, const dt_gen_params *g, double t_request_start, dt_gen_timings *tm,
              dt_gen_observer obs, void *ud) {
    double td = dt_now();
    for (int k = 0; k < s->steps; k++) {
        const int i = s->first + k;
        if (dt_gen_cancelled(g)) return DT_GEN_CANCELLED;
        double ts0 = dt_now();
        /* a forward stopped inside by the request's cancel flag is a cancellation, not an error */
        if (s->predict(s->ctx, i, x, 0, s->v)) return dt_gen_cancelled(g) ? DT_GEN_CANCELLED : -1;
        if (s->cfg) {
            if (s->predict(s->ctx, i, x, 1, s->u)) return dt_gen_cancelled(g) ? DT_GEN_CANCELLED : -1;
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
