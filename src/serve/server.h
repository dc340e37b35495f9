/* server.h — the state the files of the serve layer share (internal to src/serve/). */
#ifndef DT_SERVE_SERVER_H
#define DT_SERVE_SERVER_H

#include <pthread.h>

#include "pipeline/engine.h"
#include "serve/api.h"
#include "serve/encoder.h"
#include "serve/metrics.h"
#include "serve/queue.h"
#include "serve/serve.h"

typedef enum { DT_SRV_LOADING, DT_SRV_READY, DT_SRV_DRAINING, DT_SRV_FAILED } dt_server_state;

typedef struct dt_server dt_server;

/* One worker: a thread with its own backend and pipeline (one per device). */
typedef struct {
    dt_server *srv;
    int index;
    pthread_t thread;
    int started;
    dt_backend *be;
    dt_pipeline *pl;
    dt_encoder *enc;                /* its image encoder thread (encoder.h) */
    size_t mem_current, mem_peak;   /* device memory after its last job (srv->mu) */
    int64_t max_pixels;             /* the largest image its memory plan was made for (--max-pixels or load's choice) */
    /* the estimate of a request's time (worker.c), from this worker's measured images: seconds per denoising step
     * at two token counts (est_tokens[0] the latest; [1] one at least 25% apart, 0 = none yet), and the last
     * image's text encoding seconds and VAE decode seconds per pixel */
    double est_tokens[2], est_step_s[2];
    double est_encode_s, est_decode_s_per_px;
} dt_worker;

struct dt_server {
    dt_serve_opts o;
    char model_id[128];
    dt_api_limits lim;              /* lim.info and lim.max_pixels valid from DT_SRV_READY on */
    const char *backend_name;       /* "cpu", "cuda": the first loaded worker's (valid from DT_SRV_READY on) */
    int state;                      /* dt_server_state, atomic */
    double t_start;
    long long created;              /* unix time of start (/v1/models) */

    pthread_mutex_t mu;             /* the fields below */
    pthread_cond_t cv;
    int n_loaded;                   /* workers loaded and warm */
    char load_error[512];
    int inflight;                   /* HTTP requests between their first callback and their completion */
    uint64_t rng;                   /* seeds for requests that name none */

    dt_queue q;
    dt_image_budget images;         /* decoded bytes of the edits' uploads (--max-queued-image-bytes) */
    dt_metrics m;
    dt_worker workers[DT_SERVE_MAX_WORKERS];
    int n_workers;
    struct dt_http *http;           /* http.c: the daemon, its connections and their request deadlines */
};

static inline int dt_server_state_get(dt_server *s) { return __atomic_load_n(&s->state, __ATOMIC_ACQUIRE); }
static inline void dt_server_state_set(dt_server *s, int st) { __atomic_store_n(&s->state, st, __ATOMIC_RELEASE); }

/* worker.c: start every worker (each loads, warms up, reports to srv->cv, then runs jobs until the queue closes). */
int dt_workers_start(dt_server *s);
void dt_workers_join(dt_server *s);

/* http.c: bind and serve (port 0: any; *bound_port gets it); stop accepting; stop. */
int dt_http_start(dt_server *s, int *bound_port);
void dt_http_quiesce(dt_server *s);
void dt_http_stop(dt_server *s);

/* The side of the page's default square image: 256 on the CPU backend (seconds there, where 1024 takes minutes),
 * else 1024 (serve.c); of the server's backend (valid from DT_SRV_READY on) or of a backend by name. */
int dt_server_default_side(const dt_server *s);
int dt_serve_default_side(const char *backend_name);

/* A seed for a request that names none (serve.c). */
uint64_t dt_server_seed(dt_server *s);

#endif
