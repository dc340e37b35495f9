/* sampler.c — the flow-matching Euler loop shared by the families (sampler.h). */
#include "sampler.h"

#include <stdio.h>
#include <string.h>

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

/* The device path's matrices: x, v, u F32 [rows, n / rows] on s->be (u only with cfg). */
typedef struct {
    dt_mat x, v, u;
} dev_mats;

static void dev_free(dt_backend *be, dev_mats *d) {
    dt_mat *all[] = {&d->x, &d->v, &d->u};
    for (int i = 0; i < 3; i++)
        if (all[i]->data) be->free(be, all[i]);
}

static int dev_alloc(const dt_sampler *s, dev_mats *d) {
    dt_backend *be = s->be;
    const int64_t cols = (int64_t)s->n / s->rows;
    memset(d, 0, sizeof *d);
    if ((int64_t)s->n != s->rows * cols) {
        dt_set_error("sampler: %zu latent values are not %lld rows", s->n, (long long)s->rows);
        return -1;
    }
    if (be->alloc(be, &d->x, s->rows, cols, DT_F32) || be->alloc(be, &d->v, s->rows, cols, DT_F32) ||
        (s->cfg && be->alloc(be, &d->u, s->rows, cols, DT_F32))) {
        dev_free(be, d);
        return -1;
    }
    return 0;
}

/* Both passes of step k counted as computed (the guidance batch: one forward, no step cache). */
static void count_pair(dt_step_cache *sc, int k) {
    sc->paired += 2;
    sc->total += 2;
    sc->computed += 2;
    sc->decisions[2 * k] = sc->decisions[2 * k + 1] = 1.0f;
}

/* Step k (schedule index i) on the host: the passes (the model, or the step cache's stand-in; both in one forward
 * with the guidance batch) into s->v / s->u, the guided velocity into s->v, then the Euler update of x. */
static int host_step(const dt_sampler *s, dt_step_cache *sc, int k, float *x, int pair) {
    const int i = s->first + k;
    const float gs = s->step_guidance ? s->step_guidance(s->ctx, i) : s->guidance;
    const int guided = s->cfg && (!s->step_guidance || gs > 0.0f);   /* an unguided step runs pass 0 only */
    if (guided && pair) {
        if (s->predict_pair(s->ctx, i, x, s->v, s->u)) return -1;
        count_pair(sc, k);
    } else if (pass(s, sc, k, x, 0, s->v)) {
        return -1;
    }
    if (guided) {
        if (!pair && pass(s, sc, k, x, 1, s->u)) return -1;
        if (s->combine) {
            s->combine(s->ctx, i, gs, s->v, s->u, s->n);
        } else {
            const int from_cond = s->rule == DT_CFG_FROM_COND;
            float *v = s->v;
            const float *u = s->u;
            for (size_t j = 0; j < s->n; j++) v[j] = dt_flow_guided(v[j], u[j], gs, from_cond);
        }
    }
    dt_euler_step(x, s->v, s->n, s->sigmas[i], s->sigmas[i + 1]);
    if (s->after_step) s->after_step(s->ctx, i, x);
    return 0;
}

/* Step k on the device (no step cache): the passes into d->v / d->u (one forward with the guidance batch), then
 * flow_step (the Euler step's dt as dt_euler_step has it). */
static int dev_step(const dt_sampler *s, dt_step_cache *sc, int k, const dev_mats *d, int pair) {
    const int i = s->first + k;
    if (s->cfg && pair) {
        if (s->predict_pair_dev(s->ctx, i, d->x, d->v, d->u)) return -1;
        count_pair(sc, k);
    } else {
        for (int b = 0; b <= s->cfg; b++) {
            if (s->predict_dev(s->ctx, i, d->x, b, b ? d->u : d->v)) return -1;
            sc->total++;
            sc->computed++;
            sc->decisions[2 * k + b] = 1.0f;
        }
    }
    const float dt = s->sigmas[i + 1] - s->sigmas[i];
    s->be->flow_step(s->be, d->x, d->v, s->cfg ? d->u : dt_mat_null(), s->guidance, s->rule == DT_CFG_FROM_COND, dt);
    return s->be->sync(s->be);
}

static int sample_loop(const dt_sampler *s, dt_step_cache *sc, float *x, const dt_gen_params *g,
                       double t_request_start, dt_gen_timings *tm, dt_gen_observer obs, void *ud) {
    double td = dt_now();
    const int dev = s->predict_dev && s->be && s->rows > 0 && !s->after_step && !s->step_guidance && !s->combine &&
                    sc->o.kind == DT_CACHE_OFF;
    /* the guidance batch where the family offers it for this path, unless a step cache keeps per-branch state */
    const int offered = s->cfg && (dev ? s->predict_pair_dev != NULL : s->predict_pair != NULL);
    const int pair = offered && sc->o.kind == DT_CACHE_OFF;
    if (offered && !pair)
        dt_log(2, "ditrun: guidance batch: two passes per step (the step cache keeps each guidance branch's state)\n");
    else if (pair)
        dt_log(2, "ditrun: guidance batch: the prompt and the negative prompt in one forward per step\n");
    dev_mats d;
    memset(&d, 0, sizeof d);
    if (dev) {
        if (dev_alloc(s, &d)) return -1;
        s->be->upload(s->be, d.x, x);
    }
    int rc = 0;
    for (int k = 0; k < s->steps; k++) {
        const int i = s->first + k;
        if (dt_gen_cancelled(g)) { rc = DT_GEN_CANCELLED; break; }
        double ts0 = dt_now();
        /* a forward stopped inside by the request's cancel flag is a cancellation, not an error */
        if (dev ? dev_step(s, sc, k, &d, pair) : host_step(s, sc, k, x, pair)) { rc = dt_gen_cancelled(g) ? DT_GEN_CANCELLED : -1; break; }
        double dt = dt_now() - ts0;
        if (k < 256) tm->t_step[k] = dt;
        char nm[48];
        snprintf(nm, sizeof nm, "step%d.latents_packed", k);
        if (obs && s->obs_shape) {
            if (dev) s->be->download(s->be, x, d.x);
            dt_gen_observe(obs, ud, nm, x, 3, s->obs_shape[0], s->obs_shape[1], s->obs_shape[2], 0);
        }
        /* a caller with a progress callback (a server, an API user) reports steps itself: the line only when verbose */
        dt_log(g->progress ? 2 : 1, "ditrun: step %d/%d  t=%.1f  %.3f s\n", k + 1, s->steps, s->timesteps[i], dt);
        if (g->progress && g->progress(g->progress_ud, k + 1, s->steps, dt_now() - t_request_start)) {
            dt_set_error("generate: cancelled after step %d of %d", k + 1, s->steps);
            rc = DT_GEN_CANCELLED;
            break;
        }
    }
    if (dev) {
        if (rc == 0) s->be->download(s->be, x, d.x);
        dev_free(s->be, &d);
    }
    if (rc == 0) tm->t_denoise = dt_now() - td;
    return rc;
}

int dt_sample(const dt_sampler *s, float *x, const dt_gen_params *g, double t_request_start, dt_gen_timings *tm,
              dt_gen_observer obs, void *ud) {
    dt_step_cache sc;
    dt_step_cache_init(&sc, &g->cache, s->steps, s->n);
    int rc = sample_loop(s, &sc, x, g, t_request_start, tm, obs, ud);
    tm->passes_computed = sc.computed;
    tm->passes = sc.total;
    tm->passes_paired = sc.paired;
    if (rc == 0) dt_gen_observe(obs, ud, "cache_computed", sc.decisions, 2, s->steps, 2, 0, 0);
    dt_step_cache_free(&sc);
    return rc;
}
