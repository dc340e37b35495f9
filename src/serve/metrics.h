/* metrics.h — the server's counters and histograms, and their Prometheus text exposition (GET /metrics):
 * requests by route and status, request latency of image generations, server-side seconds per image,
 * queue depth, running jobs, device memory per worker, connections closed at the request deadline. */
#ifndef DT_SERVE_METRICS_H
#define DT_SERVE_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/strbuf.h"

#define DT_METRICS_MAX_SERIES 64
#define DT_METRICS_BUCKETS 12

typedef struct {
    double sum;
    uint64_t count;
    uint64_t le[DT_METRICS_BUCKETS];    /* cumulative counts at the bucket bounds */
} dt_histogram;

typedef struct {
    pthread_mutex_t mu;
    struct { const char *route; int status; uint64_t count; } req[DT_METRICS_MAX_SERIES];
    int n_req;
    dt_histogram latency;       /* image generation requests answered 200, submit to answer */
    dt_histogram image_s;       /* server-side seconds per image (encode + denoise + decode) */
    uint64_t images, cancelled;
    uint64_t request_timeouts;  /* connections closed for not sending their request in time */
} dt_metrics;

/* The gauges sampled when /metrics is asked. */
typedef struct {
    int ready;
    int queue_depth, running, max_queue;
    int n_workers;
    const size_t *mem_current, *mem_peak;   /* [n_workers] device bytes */
} dt_metrics_gauges;

void dt_metrics_init(dt_metrics *m);
void dt_metrics_destroy(dt_metrics *m);
/* route: a fixed string (the known routes, or "other": unknown paths share one series). */
void dt_metrics_request(dt_metrics *m, const char *route, int status);
void dt_metrics_latency(dt_metrics *m, double seconds);
void dt_metrics_image(dt_metrics *m, double seconds);
void dt_metrics_cancelled(dt_metrics *m);
void dt_metrics_request_timeout(dt_metrics *m);
void dt_metrics_text(dt_metrics *m, const dt_metrics_gauges *g, dt_strbuf *out);

#endif
