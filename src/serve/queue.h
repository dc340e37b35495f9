/* queue.h — image jobs and the bounded FIFO between the HTTP threads and the workers.
 *
 * A job is one generation request (1..8 images). The HTTP thread that received it creates it, pushes it and
 * waits on it; a worker pops it, runs it and publishes progress, and its encoder (encoder.h) the images and the end through the job, under the
 * job's lock. Either side may drop its reference first (a client that disconnects, a worker that finishes):
 * the last one frees the job. A disconnecting client sets the job's cancel flag, which the engine checks
 * between steps and before each DiT block (and a queued job is taken out of the queue). */
#ifndef DT_SERVE_QUEUE_H
#define DT_SERVE_QUEUE_H

#include <pthread.h>
#include <stdint.h>

#include "serve/api.h"
#include "serve/image_budget.h"
#include "serve/strbuf.h"

typedef enum { DT_JOB_QUEUED, DT_JOB_RUNNING, DT_JOB_DONE, DT_JOB_FAILED, DT_JOB_CANCELLED } dt_job_state;

typedef struct dt_job dt_job;
struct dt_job {
    dt_api_request req;
    dt_image_budget *budget;        /* where req's decoded images are counted (NULL: none), image_bytes of them; */
    int64_t image_bytes;            /* released when the job is freed */
    volatile int cancel;            /* set by the HTTP side; read by the engine between steps and DiT blocks */

    pthread_mutex_t mu;
    pthread_cond_t cv;              /* signalled on every change below */
    int refs;
    dt_job_state state;
    dt_strbuf events;               /* stream: Server-Sent Events written so far (the HTTP side sends them on) */
    int n_done;                     /* images encoded */
    uint8_t **img;                  /* [req.n] encoded bytes (req.output_format) of finished images (encoder.c) */
    size_t *img_len;
    int *width, *height, *steps;    /* [req.n] of each finished image */
    uint64_t *seeds;
    dt_api_error error;             /* DT_JOB_FAILED */
    int encode_failed;              /* an image could not be encoded (error set): the job ends FAILED */
    double t_submit, t_start, t_end;/* dt_now() seconds; t_end: the device work done (before the last encode) */
    double t_encode, t_denoise, t_decode;   /* sums over the images */
    int passes_computed, passes;    /* transformer passes computed / run, summed over the images */
    double t_image;                 /* seconds encoding the images (output_format), summed */
    int worker;                     /* index of the worker that ran it */
    double cost_steps, cost_pixel_steps;    /* its size for Retry-After: images x steps, and that x pixels */

    dt_job *next;                   /* link in the queue, then in the queue's list of running jobs */
};

/* A new job owning req (moved in), with one reference (the caller's). */
dt_job *dt_job_new(dt_api_request *req);
void dt_job_ref(dt_job *j);
void dt_job_unref(dt_job *j);
/* Publish under the job's lock and wake the waiters. */
void dt_job_set_state(dt_job *j, dt_job_state s);

#define DT_QUEUE_HISTORY 32         /* finished jobs the Retry-After estimate learns from */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;              /* workers wait for jobs */
    dt_job *head, *tail;
    dt_job *run_head;               /* the jobs the workers took (running, or next in a worker's batch) */
    int depth;                      /* jobs waiting (not running) */
    int running;                    /* jobs the workers are running */
    int max_depth;                  /* --max-queue */
    int closed;                     /* no more jobs: workers leave once it is empty */
    struct { double steps, pixel_steps, s; } hist[DT_QUEUE_HISTORY];   /* recent jobs that finished (ring): their
                                                                         * cost_steps, cost_pixel_steps, seconds */
    int n_hist, hist_next;
} dt_queue;

void dt_queue_init(dt_queue *q, int max_depth);
void dt_queue_destroy(dt_queue *q);
/* Append j (the queue takes a reference). 0, or -1 when max_depth jobs already wait, -2 when closed. */
int dt_queue_push(dt_queue *q, dt_job *j);
/* Take j out if it still waits (a cancelled request): 1 taken (its queue reference dropped), 0 not there. */
int dt_queue_remove(dt_queue *q, dt_job *j);
/* Wait for work: up to max jobs, the first in line and then the waiting jobs compatible with it (the same image
 * size, steps and guidance: what one batched forward could run together). Each comes with the queue's reference,
 * now the caller's. Returns how many; 0 when the queue is closed and empty. */
int dt_queue_pop(dt_queue *q, dt_job **jobs, int max);
/* A worker is through with job j (popped from q), which took seconds s: it leaves the running list, and when it
 * finished (DT_JOB_DONE: not cancelled, not failed) its size and time join the history Retry-After learns from. */
void dt_queue_job_done(dt_queue *q, dt_job *j, double s);
/* No more pushes; wakes the workers so they leave once the queue is empty. */
void dt_queue_close(dt_queue *q);
/* Seconds until a new job would likely start (1..3600): the jobs waiting and the rest of the running ones, each
 * estimated as a * cost_steps + b * cost_pixel_steps with a, b fitted to the recent finished jobs (least squares
 * on relative error, both >= 0), divided over the workers. 1 without history. */
int dt_queue_retry_after(dt_queue *q, int n_workers);
void dt_queue_counts(dt_queue *q, int *depth, int *running);
/* j's place in line: 1 = the next to run; 0 when it does not wait (running, finished, taken out). */
int dt_queue_position(dt_queue *q, const dt_job *j);

#endif
