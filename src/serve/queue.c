/* queue.c — jobs (reference counted, one lock each) and the bounded FIFO the workers take them from (queue.h). */
#include "serve/queue.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

dt_job *dt_job_new(dt_api_request *req) {
    dt_job *j = dt_calloc(1, sizeof *j);
    dt_api_request_move(&j->req, req);
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;   /* waits are timed on the monotonic clock (http.c) */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    j->state = DT_JOB_QUEUED;
    sb_init(&j->events);
    j->img = dt_calloc((size_t)j->req.n, sizeof *j->img);
    j->img_len = dt_calloc((size_t)j->req.n, sizeof *j->img_len);
    j->width = dt_calloc((size_t)j->req.n, sizeof *j->width);
    j->height = dt_calloc((size_t)j->req.n, sizeof *j->height);
    j->steps = dt_calloc((size_t)j->req.n, sizeof *j->steps);
    j->seeds = dt_calloc((size_t)j->req.n, sizeof *j->seeds);
    j->t_submit = dt_now();
    j->worker = -1;
    return j;
}

void dt_job_ref(dt_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void dt_job_unref(dt_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    for (int i = 0; i < j->req.n; i++) free(j->img[i]);
    free(j->img);
    free(j->img_len);
    free(j->width);
    free(j->height);
    free(j->steps);
    free(j->seeds);
    sb_free(&j->events);
    dt_api_request_free(&j->req);
    if (j->budget) dt_image_budget_release(j->budget, j->image_bytes);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void dt_job_set_state(dt_job *j, dt_job_state s) {
    pthread_mutex_lock(&j->mu);
    j->state = s;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void dt_queue_init(dt_queue *q, int max_depth) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->max_depth = max_depth;
}

void dt_queue_destroy(dt_queue *q) {
    while (q->head) {
        dt_job *j = q->head;
        q->head = j->next;
        dt_job_unref(j);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

int dt_queue_push(dt_queue *q, dt_job *j) {
    pthread_mutex_lock(&q->mu);
    int rc = q->closed ? -2 : q->depth >= q->max_depth ? -1 : 0;
    if (rc == 0) {
        dt_job_ref(j);
        j->next = NULL;
        if (q->tail) q->tail->next = j;
        else q->head = j;
        q->tail = j;
        q->depth++;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

/* Unlink j (whose predecessor is prev, NULL for the head); caller holds q->mu. */
static void unlink_job(dt_queue *q, dt_job *prev, dt_job *j) {
    if (prev) prev->next = j->next;
    else q->head = j->next;
    if (q->tail == j) q->tail = prev;
    j->next = NULL;
    q->depth--;
}

int dt_queue_remove(dt_queue *q, dt_job *j) {
    pthread_mutex_lock(&q->mu);
    dt_job *prev = NULL, *it = q->head;
    while (it && it != j) {
        prev = it;
        it = it->next;
    }
    if (it) unlink_job(q, prev, it);
    pthread_mutex_unlock(&q->mu);
    if (it) dt_job_unref(j);
    return it != NULL;
}

static int compatible(const dt_job *a, const dt_job *b) {
    return !a->req.edit && !b->req.edit && a->req.width == b->req.width && a->req.height == b->req.height && a->req.steps == b->req.steps &&
           a->req.guidance == b->req.guidance;
}

int dt_queue_pop(dt_queue *q, dt_job **jobs, int max) {
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->closed) pthread_cond_wait(&q->cv, &q->mu);
    int n = 0;
    if (q->head && max > 0) {
        dt_job *first = q->head;
        unlink_job(q, NULL, first);
        jobs[n++] = first;
        dt_job *prev = NULL, *it = q->head;
        while (it && n < max) {
            dt_job *next = it->next;
            if (compatible(first, it)) {
                unlink_job(q, prev, it);
                jobs[n++] = it;
            } else {
                prev = it;
            }
            it = next;
        }
        for (int i = 0; i < n; i++) {
            jobs[i]->next = q->run_head;
            q->run_head = jobs[i];
        }
        q->running += n;
    }
    pthread_mutex_unlock(&q->mu);
    return n;
}

void dt_queue_job_done(dt_queue *q, dt_job *j, double s) {
    pthread_mutex_lock(&j->mu);
    int done = j->state == DT_JOB_DONE;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&q->mu);
    for (dt_job **p = &q->run_head; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            j->next = NULL;
            break;
        }
    q->running--;
    if (done && s > 0 && j->cost_steps > 0) {   /* a cancelled or failed job says nothing about the speed */
        q->hist[q->hist_next].steps = j->cost_steps;
        q->hist[q->hist_next].pixel_steps = j->cost_pixel_steps;
        q->hist[q->hist_next].s = s;
        q->hist_next = (q->hist_next + 1) % DT_QUEUE_HISTORY;
        if (q->n_hist < DT_QUEUE_HISTORY) q->n_hist++;
    }
    pthread_mutex_unlock(&q->mu);
}

/* Seconds per step (*a) and per pixel-step (*b) of the recent finished jobs: least squares on the relative error
 * of s ~ a * steps + b * pixel_steps, both >= 0. When the history cannot tell the two apart (every job of one
 * shape) or one comes out negative, the better one-term fit. Caller holds q->mu; 0 when there is no history. */
static int fit_speed(const dt_queue *q, double *a, double *b) {
    double uu = 0, uv = 0, vv = 0, u1 = 0, v1 = 0;
    for (int i = 0; i < q->n_hist; i++) {   /* rows (steps / s, pixel_steps / s), target 1 */
        double u = q->hist[i].steps / q->hist[i].s, v = q->hist[i].pixel_steps / q->hist[i].s;
        uu += u * u;
        uv += u * v;
        vv += v * v;
        u1 += u;
        v1 += v;
    }
    if (q->n_hist == 0 || uu <= 0 || vv <= 0) return 0;
    double det = uu * vv - uv * uv;
    if (det > 1e-9 * uu * vv) {
        *a = (u1 * vv - v1 * uv) / det;
        *b = (v1 * uu - u1 * uv) / det;
        if (*a >= 0 && *b >= 0) return 1;
    }
    double a1 = u1 / uu, b1 = v1 / vv;   /* one term: residual sum n - u1^2/uu, resp. n - v1^2/vv */
    *a = u1 * u1 / uu > v1 * v1 / vv ? a1 : 0;
    *b = *a > 0 ? 0 : b1;
    return 1;
}

void dt_queue_close(dt_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int dt_queue_retry_after(dt_queue *q, int n_workers) {
    double a = 0, b = 0, total = 0, now = dt_now();
    pthread_mutex_lock(&q->mu);
    if (fit_speed(q, &a, &b)) {
        for (const dt_job *j = q->head; j; j = j->next) total += a * j->cost_steps + b * j->cost_pixel_steps;
        for (dt_job *j = q->run_head; j; j = j->next) {
            double est = a * j->cost_steps + b * j->cost_pixel_steps;
            pthread_mutex_lock(&j->mu);   /* t_start is set before the job turns RUNNING */
            if (j->state == DT_JOB_RUNNING) est -= now - j->t_start;
            pthread_mutex_unlock(&j->mu);
            total += est > 0 ? est : 0;
        }
    }
    pthread_mutex_unlock(&q->mu);
    double s = total / (n_workers > 0 ? n_workers : 1);
    return s < 1 ? 1 : s > 3600 ? 3600 : (int)ceil(s);
}

void dt_queue_counts(dt_queue *q, int *depth, int *running) {
    pthread_mutex_lock(&q->mu);
    *depth = q->depth;
    *running = q->running;
    pthread_mutex_unlock(&q->mu);
}

int dt_queue_position(dt_queue *q, const dt_job *j) {
    pthread_mutex_lock(&q->mu);
    int pos = 1;
    const dt_job *it = q->head;
    while (it && it != j) {
        it = it->next;
        pos++;
    }
    pthread_mutex_unlock(&q->mu);
    return it ? pos : 0;
}
