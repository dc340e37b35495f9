/* worker.c — the worker threads: each creates its own backend, loads the pipeline, warms it up at the --warmup
 * size, reports ready, then runs jobs from the queue until it closes: every image through the resident engine
 * (progress and cancellation between steps). A streamed image is encoded to PNG here; the others are handed over as
 * pixels and encoded by the HTTP thread that answers (http.c), while this worker runs the next job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipeline/image_meta.h"
#include "pipeline/png.h"
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
    dt_job_state end = DT_JOB_DONE;
    int steps_run = 0, W = 0, H = 0;
    for (int i = 0; i < j->req.n && end == DT_JOB_DONE; i++) {
        dt_gen_params g;
        dt_api_gen_params(&j->req, &s->lim, i, &g);
        progress_ctx pc = {j, i};
        g.progress = on_progress;
        g.progress_ud = &pc;
        g.cancel = &j->cancel;
        uint8_t *rgb = NULL, *png = NULL;
        size_t png_len = 0;
        int iw = 0, ih = 0;
        dt_gen_timings tm;
        int rc = dt_pipeline_generate(w->pl, &g, &rgb, &iw, &ih, &tm, NULL, NULL);
        if (rc == 0 && j->req.stream) {   /* the stream carries the PNG; otherwise the HTTP thread encodes it */
            dt_image_meta meta;
            dt_image_meta_fill(&meta, &g, tm.steps, iw, ih, s->o.load.model);
            rc = dt_png_encode(rgb, iw, ih, meta.text, meta.n, &png, &png_len);
            free(rgb);
            rgb = NULL;
        }
        pthread_mutex_lock(&j->mu);
        if (rc == DT_GEN_CANCELLED) {
            end = DT_JOB_CANCELLED;
        } else if (rc) {
            end = DT_JOB_FAILED;
            dt_api_error_set(&j->error, 500, "server_error", NULL, "generation failed: %s", dt_last_error());
            if (j->req.stream) dt_sse_error(&j->events, &j->error);
        } else {
            j->png[i] = png;
            j->png_len[i] = png_len;
            j->rgb[i] = rgb;
            rgb = NULL;
            j->width[i] = iw;
            j->height[i] = ih;
            j->steps[i] = tm.steps;
            j->seeds[i] = g.seed;
            j->n_done = i + 1;
            j->t_encode += tm.t_encode;
            j->t_denoise += tm.t_denoise;
            j->passes_computed += tm.passes_computed;
            j->passes += tm.passes;
            j->t_decode += tm.t_decode;
            if (j->req.stream) dt_sse_image(&j->events, i, g.seed, png, png_len);
            steps_run = tm.steps;
            W = iw;
            H = ih;
        }
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        free(rgb);
        if (rc == 0) dt_metrics_image(&s->m, tm.t_encode + tm.t_denoise + tm.t_decode);
    }
    pthread_mutex_lock(&j->mu);
    j->t_end = dt_now();
    if (end == DT_JOB_DONE && j->req.stream) dt_sse_done(&j->events, (long long)time(NULL), j->req.n, j->t_end - j->t_start);
    pthread_mutex_unlock(&j->mu);
    if (end == DT_JOB_CANCELLED) dt_metrics_cancelled(&s->m);
    if (end == DT_JOB_DONE)
        dt_log(1, "ditrun: worker %d: %d image%s %dx%d, %d steps: waited %.3f s, encode %.3f s, denoise %.3f s, decode "
                  "%.3f s, server %.3f s\n", w->index, j->req.n, j->req.n > 1 ? "s" : "", W, H, steps_run,
               j->t_start - j->t_submit, j->t_encode, j->t_denoise, j->t_decode, j->t_end - j->t_start);
    else
        dt_log(1, "ditrun: worker %d: job %s after %.3f s%s%s\n", w->index,
               end == DT_JOB_CANCELLED ? "cancelled" : "failed", j->t_end - j->t_start,
               end == DT_JOB_FAILED ? ": " : "", end == DT_JOB_FAILED ? j->error.message : "");
    dt_job_set_state(j, end);
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
    pthread_mutex_lock(&s->mu);
    if (rc) {
        if (!s->load_error[0]) snprintf(s->load_error, sizeof s->load_error, "worker %d: %s", w->index, dt_last_error());
    } else {
        if (s->n_loaded == 0) s->lim.info = *dt_pipeline_get_info(w->pl);
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
            dt_queue_job_done(&s->q, dt_now() - t0);
            dt_job_unref(jobs[i]);
        }
        sample_memory(w);
    }
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
