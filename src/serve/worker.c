/* worker.c — the worker threads: each creates its own backend, loads the pipeline, warms it up at the --warmup
 * size, reports ready, then runs jobs from the queue until it closes: every image through the resident engine
 * (progress and cancellation between steps). Each finished image goes to the worker's encoder thread (encoder.c) as
 * pixels, which encodes it and ends the job while this worker runs the next image. Each request's time is estimated
 * from the images measured before and logged as it starts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "image/edit_prep.h"
#include "pipeline/budget.h"
#include "serve/encoder.h"
#include "serve/server.h"
#include "serve/sse.h"

/* Jobs a worker takes at once. The engine runs one image at a time; the queue can already hand over several
 * compatible jobs for a batched forward. */
#define DT_WORKER_BATCH 1

typedef struct {
    dt_job *job;
    int index;
} progress_ctx;

static int on_progress(void *ud, int step, int steps, double elapsed_image) {
    (void)elapsed_image;
    progress_ctx *pc = ud;
    dt_job *j = pc->job;
    pthread_mutex_lock(&j->mu);
    if (j->req.stream) dt_sse_progress(&j->events, pc->index, j->req.n, step, steps, dt_now() - j->t_start);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

/* ---- the estimate of a request's time, logged when it starts ----
 * One image = text encoding + steps x (seconds per step at its token count) + VAE decode. A step's seconds at T
 * tokens (image tokens (W/m)(H/m) for the size multiple m, plus the text tokens) follow a*T (the Linears) +
 * b*T^2 (attention). With two measured token counts the two coefficients are solved from them; with one, the
 * estimate is the range between scaling it linearly and quadratically; text encoding is the last measured, decode
 * scales with pixels. Every finished image (and the warm-up) is a measurement. Edits are estimated as a generation
 * of the output size (their reference tokens and the images' VAE encoding are not counted). */

/* (the pipeline's own description: the server's lim.info is set only after the warm-up) */
static double step_tokens(const dt_worker *w, int iw, int ih) {
    const int m = dt_pipeline_get_info(w->pl)->size_multiple > 0 ? dt_pipeline_get_info(w->pl)->size_multiple : 16;
    return (double)(iw / m) * (ih / m) + (w->srv->o.max_seq_len > 0 ? w->srv->o.max_seq_len : 512);
}

/* A measured image: its size and timings (tm->t_denoise over tm->steps steps). */
static void est_record(dt_worker *w, int iw, int ih, const dt_gen_timings *tm) {
    if (tm->steps < 1 || iw < 1 || ih < 1) return;
    const double T = step_tokens(w, iw, ih), st = tm->t_denoise / tm->steps;
    const double T0 = w->est_tokens[0];
    if (T0 > 0 && fabs(T - T0) > 0.25 * fmax(T, T0)) {   /* a second token count: keep the latest as the other */
        w->est_tokens[1] = T0;
        w->est_step_s[1] = w->est_step_s[0];
    } else if (w->est_tokens[1] > 0 && fabs(T - w->est_tokens[1]) <= 0.25 * fmax(T, w->est_tokens[1])) {
        w->est_tokens[1] = 0;   /* the older point is about this count too: drop it, the new one replaces both */
    }
    w->est_tokens[0] = T;
    w->est_step_s[0] = st;
    w->est_encode_s = tm->t_encode;
    w->est_decode_s_per_px = tm->t_decode / ((double)iw * ih);
}

/* Seconds for n images of w x h in steps steps: *lo..*hi (equal when two token counts were measured). 0, or -1
 * before any measurement. */
static int est_seconds(const dt_worker *w, int iw, int ih, int steps, int n, double *lo, double *hi) {
    if (w->est_tokens[0] <= 0) return -1;
    const double T = step_tokens(w, iw, ih), T0 = w->est_tokens[0], s0 = w->est_step_s[0];
    double step_lo, step_hi;
    const double T1 = w->est_tokens[1], s1 = w->est_step_s[1];
    double a = -1, b = -1;
    if (T1 > 0) {   /* a*T + b*T^2 through both points */
        const double det = T0 * T1 * (T1 - T0);
        a = (s0 * T1 * T1 - s1 * T0 * T0) / det;
        b = (T0 * s1 - T1 * s0) / det;
    }
    if (a >= 0 && b >= 0) {
        step_lo = step_hi = a * T + b * T * T;
    } else {   /* one point (or two that no such curve fits): linear to quadratic from the latest */
        const double r = T / T0;
        step_lo = s0 * fmin(r, r * r);
        step_hi = s0 * fmax(r, r * r);
    }
    const double fixed = w->est_encode_s + w->est_decode_s_per_px * iw * ih;
    *lo = n * (fixed + steps * step_lo);
    *hi = n * (fixed + steps * step_hi);
    return 0;
}

static void est_log(const dt_worker *w, const dt_job *j) {
    const dt_server *s = w->srv;
    dt_gen_params g = j->req.gen;   /* resolved when the request was checked */
    if (j->req.edit && (g.width < 1 || g.height < 1)) {   /* size "auto": the first image's prepared size (api_edit.c) */
        const dt_image *first = j->req.inpaint || j->req.img2img ? &j->req.init : &j->req.refs[0];
        const int m = s->lim.info.size_multiple > 0 ? s->lim.info.size_multiple : 1;
        int aw, ah;
        dt_prep_area_size(first->w, first->h, &aw, &ah);
        if (g.width < 1) g.width = aw / m * m;
        if (g.height < 1) g.height = ah / m * m;
    }
    if (g.width < 1 || g.height < 1) return;
    double lo, hi;
    if (est_seconds(w, g.width, g.height, g.steps, j->req.n, &lo, &hi)) {
        dt_log(1, "ditrun: worker %d: %d image%s %dx%d, %d steps: no estimate yet (the first image measures the "
                  "%s backend)\n", w->index, j->req.n, j->req.n > 1 ? "s" : "", g.width, g.height, g.steps, w->be->name);
        return;
    }
    if (hi - lo < 0.05 * hi || (long)(lo * 10 + 0.5) == (long)(hi * 10 + 0.5))
        dt_log(1, "ditrun: worker %d: %d image%s %dx%d, %d steps: estimated %.1f s\n", w->index, j->req.n,
               j->req.n > 1 ? "s" : "", g.width, g.height, g.steps, hi);
    else
        dt_log(1, "ditrun: worker %d: %d image%s %dx%d, %d steps: estimated %.1f to %.1f s (one size measured so far: "
                  "linear to quadratic in tokens)\n", w->index, j->req.n, j->req.n > 1 ? "s" : "", g.width, g.height,
               g.steps, lo, hi);
}

static void sample_memory(dt_worker *w) {
    size_t cur = 0, peak = 0;
    if (w->be->mem_stats) w->be->mem_stats(w->be, &cur, &peak);
    pthread_mutex_lock(&w->srv->mu);
    w->mem_current = cur;
    w->mem_peak = peak;
    pthread_mutex_unlock(&w->srv->mu);
}

static void run_job(dt_worker *w, dt_job *j) {
    dt_server *s = w->srv;
    pthread_mutex_lock(&j->mu);
    j->worker = w->index;
    j->t_start = dt_now();
    pthread_mutex_unlock(&j->mu);
    if (__atomic_load_n(&j->cancel, __ATOMIC_RELAXED)) {
        dt_metrics_cancelled(&s->m);
        dt_job_set_state(j, DT_JOB_CANCELLED);
        return;
    }
    dt_job_set_state(j, DT_JOB_RUNNING);
    est_log(w, j);
    dt_job_state end = DT_JOB_DONE;
    for (int i = 0; i < j->req.n && end == DT_JOB_DONE; i++) {
        dt_gen_params g = dt_api_image_job(&j->req, i);
        progress_ctx pc = {j, i};
        g.progress = on_progress;
        g.progress_ud = &pc;
        g.cancel = &j->cancel;
        uint8_t *rgb = NULL;
        int iw = 0, ih = 0;
        dt_gen_timings tm;
        int rc = dt_pipeline_generate_resolved(w->pl, &g, &rgb, &iw, &ih, &tm, NULL, NULL);   /* resolved in api.c */
        pthread_mutex_lock(&j->mu);
        if (rc == DT_GEN_CANCELLED) {
            end = DT_JOB_CANCELLED;
        } else if (rc) {
            end = DT_JOB_FAILED;
            dt_api_error_set(&j->error, 500, "server_error", NULL, "generation failed: %s", dt_last_error());
        } else {
            j->width[i] = iw;
            j->height[i] = ih;
            j->steps[i] = tm.steps;
            j->seeds[i] = g.seed;
            j->t_encode += tm.t_encode;
            j->t_denoise += tm.t_denoise;
            j->passes_computed += tm.passes_computed;
            j->passes += tm.passes;
            j->t_decode += tm.t_decode;
        }
        pthread_mutex_unlock(&j->mu);
        if (rc == 0) {
            dt_metrics_image(&s->m, tm.t_encode + tm.t_denoise + tm.t_decode);
            est_record(w, iw, ih, &tm);
            dt_encoder_image(w->enc, j, i, rgb, iw, ih, tm.steps);   /* the bytes while the next image runs */
        } else {
            free(rgb);
        }
    }
    pthread_mutex_lock(&j->mu);
    j->t_end = dt_now();
    pthread_mutex_unlock(&j->mu);
    if (end == DT_JOB_CANCELLED) dt_metrics_cancelled(&s->m);
    dt_encoder_end(w->enc, j, end);
}

/* Load the pipeline on this worker's backend and run the warm-up image. 0 or -1 (dt_last_error). */
static int load(dt_worker *w) {
    dt_server *s = w->srv;
    dt_backend_opts bo = s->o.be;
    dt_pipeline_opts lo = s->o.load;
    const int ranks = lo.sequence_parallel > 1 ? lo.sequence_parallel : 1;   /* this worker's devices */
    bo.device = s->o.devices[w->index * ranks];
    for (int r = 0; r < ranks && ranks > 1; r++) lo.sp_devices[r] = s->o.devices[w->index * ranks + r];
    lo.n_sp_devices = ranks > 1 ? ranks : 0;
    w->be = dt_backend_create(s->o.backend, &bo);
    if (!w->be) return -1;
    /* the memory plan of the largest image served (--max-pixels as a square; --max-vram or the card's free memory):
     * the VAE tiles, or the text encoder is reloaded per new prompt, when the budget needs it; a budget nothing fits
     * is refused before the models load. Without --max-pixels the largest image is the default (2048x2048 on a GPU)
     * or, where that plan would slow every image (host weights, a text encoder reloaded per prompt, two guidance
     * passes, VAE tiles smaller than the default size) or not fit, the largest side down to the page's default size
     * whose plan is that size's (dt_budget_largest_side). */
    const int cpu = !strcmp(w->be->name, "cpu"), T = s->o.max_seq_len ? s->o.max_seq_len : 512;
    int64_t mp = s->o.max_pixels ? s->o.max_pixels : cpu ? DT_SERVE_MAX_PIXELS_CPU : DT_SERVE_MAX_PIXELS_GPU;
    int side = (int)sqrt((double)mp) / 16 * 16;
    side = side < 16 ? 16 : side > 16384 ? 16384 : side;
    if (!s->o.max_pixels) {   /* (never below the page's default size, nor the warm-up image's) */
        char why[300];
        int floor_side = dt_serve_default_side(w->be->name);
        if (s->o.warmup_w > floor_side) floor_side = s->o.warmup_w;
        if (s->o.warmup_h > floor_side) floor_side = s->o.warmup_h;
        const int fit = dt_budget_largest_side(w->be, &lo, side, floor_side, T, 1, why, sizeof why);
        if (fit < side) {
            dt_log(1, "ditrun: worker %d: images up to %dx%d (%lld pixels): %s (--max-pixels %lld plans for it "
                      "anyway)\n", w->index, fit, fit, (long long)fit * fit, why, (long long)mp);
            side = fit;
            mp = (int64_t)fit * fit;
        }
    }
    w->max_pixels = mp;
    if ((int64_t)s->o.warmup_w * s->o.warmup_h > mp) {
        dt_set_error("--warmup %dx%d is larger than the largest image served (%lld pixels; --max-pixels)",
                     s->o.warmup_w, s->o.warmup_h, (long long)mp);
        return -1;
    }
    if (dt_budget_apply(w->be, &lo, side, side, T, 1, NULL)) {
        char why[700];
        snprintf(why, sizeof why, "%s", dt_last_error());
        dt_set_error("%s (serve plans for its largest image, --max-pixels %lld)", why, (long long)mp);
        return -1;
    }
    double t0 = dt_now();
    w->pl = dt_pipeline_load(w->be, &lo);
    if (!w->pl) return -1;
    const dt_pipeline_info *in = dt_pipeline_get_info(w->pl);
    char where[160] = "";
    if (!strcmp(w->be->name, "cuda")) {
        int k = snprintf(where, sizeof where, " device%s", ranks > 1 ? "s" : "");
        for (int r = 0; r < ranks && k < (int)sizeof where - 8; r++)
            k += snprintf(where + k, sizeof where - (size_t)k, "%s%d", r ? "+" : " ", s->o.devices[w->index * ranks + r]);
    }
    dt_log(1, "ditrun: worker %d: %s (%s) loaded on %s%s in %.2f s\n", w->index, s->model_id, in->family, w->be->name,
           where, dt_now() - t0);
    if (s->o.warmup_w > 0) {
        dt_gen_params g;
        dt_gen_params_default(&g);
        g.prompt = "warm-up";
        g.width = s->o.warmup_w;
        g.height = s->o.warmup_h;
        g.max_seq_len = s->o.max_seq_len;
        uint8_t *rgb = NULL;
        int iw, ih;
        dt_gen_timings tm;
        double t1 = dt_now();
        if (dt_pipeline_generate(w->pl, &g, &rgb, &iw, &ih, &tm, NULL, NULL)) return -1;
        free(rgb);
        est_record(w, iw, ih, &tm);
        dt_log(1, "ditrun: worker %d: warm-up image %dx%d, %d steps in %.2f s\n", w->index, iw, ih, tm.steps,
               dt_now() - t1);
    }
    sample_memory(w);
    return 0;
}

static void *worker_main(void *arg) {
    dt_worker *w = arg;
    dt_server *s = w->srv;
    int rc = load(w);
    if (rc == 0 && !(w->enc = dt_encoder_start(s, w->index))) rc = -1;
    pthread_mutex_lock(&s->mu);
    if (rc) {
        if (!s->load_error[0]) snprintf(s->load_error, sizeof s->load_error, "worker %d: %s", w->index, dt_last_error());
    } else {
        if (s->n_loaded == 0) {
            s->lim.info = *dt_pipeline_get_info(w->pl);
            s->backend_name = w->be->name;
        }
        /* without --max-pixels: the smallest of the workers' largest images */
        if (!s->o.max_pixels && (!s->lim.max_pixels || w->max_pixels < s->lim.max_pixels))
            s->lim.max_pixels = w->max_pixels;
        s->n_loaded++;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (rc) return NULL;
    dt_job *jobs[DT_WORKER_BATCH];
    int n;
    while ((n = dt_queue_pop(&s->q, jobs, DT_WORKER_BATCH)) > 0) {
        for (int i = 0; i < n; i++) {
            double t0 = dt_now();
            run_job(w, jobs[i]);
            dt_queue_job_done(&s->q, jobs[i], dt_now() - t0);
            dt_job_unref(jobs[i]);
        }
        sample_memory(w);
    }
    dt_encoder_stop(w->enc);   /* the last jobs' images encoded and their ends published */
    w->enc = NULL;
    return NULL;
}

int dt_workers_start(dt_server *s) {
    for (int i = 0; i < s->n_workers; i++) {
        dt_worker *w = &s->workers[i];
        w->srv = s;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w)) {
            dt_set_error("serve: cannot start worker thread %d", i);
            return -1;
        }
        w->started = 1;
    }
    return 0;
}

void dt_workers_join(dt_server *s) {
    for (int i = 0; i < s->n_workers; i++) {
        dt_worker *w = &s->workers[i];
        if (w->started) pthread_join(w->thread, NULL);
        w->started = 0;
        dt_pipeline_free(w->pl);
        w->pl = NULL;
        if (w->be) w->be->destroy(w->be);
        w->be = NULL;
    }
}
