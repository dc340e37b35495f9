/* serve.h — `ditrun serve`: an HTTP server that keeps a pipeline loaded and answers OpenAI-style image requests.
 *
 * Layout of the layer: api.c (requests and answers as pure functions), queue.c (jobs and the bounded FIFO),
 * worker.c (threads that own a backend and a pipeline each and run the jobs), sse.c (progress as Server-Sent
 * Events), metrics.c (Prometheus text), http.c (libmicrohttpd: routing, limits, auth, CORS, waiting on jobs),
 * web/index.html (the page at GET /, embedded at build time), serve.c (start, ready, drain on SIGTERM/SIGINT). */
#ifndef DT_SERVE_H
#define DT_SERVE_H

#include <stdint.h>

#include "backends/backend.h"
#include "pipeline/generate.h"

#define DT_SERVE_MAX_WORKERS 16
#define DT_SERVE_MAX_ALLOW_HOSTS 16
/* The default --max-pixels: on a GPU 2048x2048 (seconds an image); on the CPU 1024x1024, the models' native size
 * (minutes an image there; a 2048x2048 step of klein-4B took ~6 min on a CPU, its attention 16 times 1024x1024's). */
#define DT_SERVE_MAX_PIXELS_GPU ((int64_t)2048 * 2048)
#define DT_SERVE_MAX_PIXELS_CPU ((int64_t)1024 * 1024)

typedef struct {
    dt_pipeline_opts load;      /* load.model: the pipeline root */
    const char *model_id;       /* the name /v1/models lists (default: the root's folder name) */
    const char *host;           /* address to bind (default 127.0.0.1) */
    int port;                   /* 0 = any free port (printed in the "listening on" line) */
    const char *backend;        /* "cpu", "cuda", "auto" */
    dt_backend_opts be;         /* every worker's backend options (be.device set per worker) */
    int n_workers;              /* one per device, or per group of load.sequence_parallel devices; 1 on the CPU */
    int devices[DT_SERVE_MAX_WORKERS];  /* the CUDA devices: worker w runs on devices[w*N .. w*N + N-1] (N =
                                         * load.sequence_parallel, or 1), its DiT split over them when N > 1 */
    int max_queue;              /* jobs that may wait; past that 429 */
    int64_t max_image_bytes;    /* decoded upload bytes that edit requests (queued, running, answering) hold together;
                                 * past that 429, or 413 for one request alone over it */
    int64_t max_pixels;         /* width * height of one image at most (0: the backend's default,
                                 * DT_SERVE_MAX_PIXELS_CPU on the CPU, DT_SERVE_MAX_PIXELS_GPU on a GPU) */
    int max_steps;
    int max_seq_len;            /* text tokens of every request (0 = 512, as generate) */
    dt_cache_opts cache;        /* step caching of requests that name none (--cache; zero: off) */
    const char *api_key;        /* every /v1 route needs "Authorization: Bearer KEY" (NULL: open) */
    int warmup_w, warmup_h;     /* one image of this size before /health turns ready (0: none) */
    const char *cors_origin;    /* Access-Control-Allow-Origin (NULL: no CORS headers) */
    int request_timeout;        /* seconds a connection has to send a whole request (headers and body), counted from
                                 * its accept or its previous answer, not restarted by each byte; past it: closed */
    int max_client_connections; /* connections one client address may hold at once; past it: closed at accept */
    const char *allow_hosts[DT_SERVE_MAX_ALLOW_HOSTS];  /* Host names accepted besides localhost, IP literals and
                                                         * --host (DNS rebinding defence); n_allow_hosts of them */
    int n_allow_hosts;
} dt_serve_opts;

void dt_serve_opts_default(dt_serve_opts *o);

/* Bind, print "ditrun: listening on http://HOST:PORT" on stdout, load and warm the pipelines (/health answers
 * 503 until then), serve until SIGTERM or SIGINT, then stop accepting, finish the accepted jobs and return 0.
 * Returns 1 when binding or loading fails (dt_last_error says what). */
int dt_serve_run(const dt_serve_opts *o);

#endif
