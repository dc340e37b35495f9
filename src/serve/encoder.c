/* encoder.c — a worker's image encoder thread (encoder.h). */
#include "serve/encoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pipeline/image_meta.h"
#include "image/image_out.h"
#include "serve/server.h"
#include "serve/sse.h"

typedef struct item {
    dt_job *j;            /* a reference of its own */
    int index;            /* image index, or -1: the job's end */
    dt_job_state end;
    uint8_t *rgb;         /* [h, w, 3] */
    int w, h, steps;
    struct item *next;
} item;

struct dt_encoder {
    dt_server *srv;
    int worker;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* items added or taken, stop */
    item *head, *tail;
    int images;           /* image items waiting or being encoded */
    int stop;
};

/* Encode image it->index of its job and publish it (or the failure: the job ends FAILED). */
static void encode_image(dt_encoder *e, item *it) {
    dt_server *s = e->srv;
    dt_job *j = it->j;
    const int i = it->index;
    if (__atomic_load_n(&j->cancel, __ATOMIC_RELAXED)) return;   /* nobody waits for it */
    dt_gen_params g = dt_api_image_job(&j->req, i);
    if (!j->req.guidance_given) g.guidance = -1;   /* the metadata records the guidance a client chose */
    dt_image_meta meta;
    dt_image_meta_fill(&meta, &g, it->steps, it->w, it->h, s->o.load.model);
    uint8_t *bytes = NULL;
    size_t len = 0;
    const double t0 = dt_now();
    const int rc = dt_image_out_encode(j->req.output_format, j->req.output_compression, 0, it->rgb, it->w, it->h,
                                       meta.text, meta.n, &bytes, &len);
    const double dt = dt_now() - t0;
    pthread_mutex_lock(&j->mu);
    if (rc) {
        if (!j->encode_failed)
            dt_api_error_set(&j->error, 500, "server_error", NULL, "%s encoding failed: %s",
                             dt_out_format_name(j->req.output_format), dt_last_error());
        j->encode_failed = 1;
    } else {
        j->img[i] = bytes;
        j->img_len[i] = len;
        j->t_image += dt;
        j->n_done = i + 1;
        if (j->req.stream)
            dt_sse_image(&j->events, i, j->seeds[i], dt_out_format_name(j->req.output_format), bytes, len);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* The job's end, after its images: state, the stream's last event, the log line. */
static void end_job(dt_encoder *e, item *it) {
    dt_job *j = it->j;
    dt_job_state end = it->end;
    pthread_mutex_lock(&j->mu);
    if (end == DT_JOB_DONE && j->encode_failed) end = DT_JOB_FAILED;
    if (j->req.stream) {
        if (end == DT_JOB_DONE) dt_sse_done(&j->events, (long long)time(NULL), j->req.n, j->t_end - j->t_start);
        else if (end == DT_JOB_FAILED) dt_sse_error(&j->events, &j->error);
    }
    pthread_mutex_unlock(&j->mu);
    if (end == DT_JOB_DONE)
        dt_log(1, "ditrun: worker %d: %d image%s %dx%d, %d steps: waited %.3f s, encode %.3f s, denoise %.3f s, decode "
                  "%.3f s, server %.3f s, %s %.3f s\n", e->worker, j->req.n, j->req.n > 1 ? "s" : "", j->width[0],
               j->height[0], j->steps[0], j->t_start - j->t_submit, j->t_encode, j->t_denoise, j->t_decode,
               j->t_end - j->t_start, dt_out_format_name(j->req.output_format), j->t_image);
    else
        dt_log(1, "ditrun: worker %d: job %s after %.3f s%s%s\n", e->worker,
               end == DT_JOB_CANCELLED ? "cancelled" : "failed", j->t_end - j->t_start,
               end == DT_JOB_FAILED ? ": " : "", end == DT_JOB_FAILED ? j->error.message : "");
    dt_job_set_state(j, end);
}

static void *encoder_main(void *arg) {
    dt_encoder *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->head && !e->stop) pthread_cond_wait(&e->cv, &e->mu);
        item *it = e->head;
        if (!it) break;   /* stopping, and nothing left */
        pthread_mutex_unlock(&e->mu);
        if (it->index >= 0) encode_image(e, it);
        else end_job(e, it);
        pthread_mutex_lock(&e->mu);
        e->head = it->next;
        if (!e->head) e->tail = NULL;
        if (it->index >= 0) e->images--;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        free(it->rgb);
        dt_job_unref(it->j);
        free(it);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

dt_encoder *dt_encoder_start(dt_server *s, int worker) {
    dt_encoder *e = dt_calloc(1, sizeof *e);
    e->srv = s;
    e->worker = worker;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (pthread_create(&e->thread, NULL, encoder_main, e)) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        free(e);
        dt_set_error("serve: cannot start the image encoder thread of worker %d", worker);
        return NULL;
    }
    return e;
}

static void push(dt_encoder *e, item *it) {
    dt_job_ref(it->j);
    pthread_mutex_lock(&e->mu);
    if (it->index >= 0) {
        while (e->images >= DT_ENCODER_BACKLOG) pthread_cond_wait(&e->cv, &e->mu);
        e->images++;
    }
    if (e->tail) e->tail->next = it;
    else e->head = it;
    e->tail = it;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void dt_encoder_image(dt_encoder *e, dt_job *j, int i, uint8_t *rgb, int w, int h, int steps) {
    item *it = dt_calloc(1, sizeof *it);
    *it = (item){.j = j, .index = i, .rgb = rgb, .w = w, .h = h, .steps = steps};
    push(e, it);
}

void dt_encoder_end(dt_encoder *e, dt_job *j, dt_job_state end) {
    item *it = dt_calloc(1, sizeof *it);
    *it = (item){.j = j, .index = -1, .end = end};
    push(e, it);
}

void dt_encoder_stop(dt_encoder *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
