/* queue.c — jobs (reference counted, one lock each) and the bounded FIFO the workers take them from (queue.h). */
#include "serve/queue.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

dt_job *dt_job_new(dt_api_request *req) {
    dt_job *j = dt_calloc(1, sizeof *j);
    j->req = *req;
    memset(req, 0, sizeof *req);
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;   /* waits are timed on the monotonic clock (http.c) */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    j->state = DT_JOB_QUEUED;
    sb_init(&j->events);
    j->png = dt_calloc((size_t)j->req.n, sizeof *j->png);
    j->png_len = dt_calloc((size_t)j->req.n, sizeof *j->png_len);
    j->rgb = dt_calloc((size_t)j->req.n, sizeof *j->rgb);
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
    for (int i = 0; i < j->req.n; i++) {
        free(j->png[i]);
        free(j->rgb[i]);
    }
    free(j->png);
    free(j->png_len);
    free(j->rgb);
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
        q->running += n;
    }
    pthread_mutex_unlock(&q->mu);
    return n;
}

void dt_queue_job_done(dt_queue *q, double s) {
    pthread_mutex_lock(&q->mu);
    q->running--;
    q->ema_job_s = q->ema_job_s > 0 ? 0.8 * q->ema_job_s + 0.2 * s : s;
    pthread_mutex_unlock(&q->mu);
}

void dt_queue_close(dt_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int dt_queue_retry_after(dt_queue *q, int n_workers) {
    pthread_mutex_lock(&q->mu);
    double s = q->ema_job_s * (q->depth + q->running) / (n_workers > 0 ? n_workers : 1);
    pthread_mutex_unlock(&q->mu);
    int r = (int)ceil(s);
    return r < 1 ? 1 : r > 3600 ? 3600 : r;
}

void dt_queue_counts(dt_queue *q, int *depth, int *running) {
    pthread_mutex_lock(&q->mu);
    *depth = q->depth;
    *running = q->running;
    pthread_mutex_unlock(&q->mu);
}
