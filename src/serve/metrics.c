/* metrics.c — counters and histograms behind one lock, written in the Prometheus text format (metrics.h). */
#include "serve/metrics.h"

#include <string.h>

static const double bounds[DT_METRICS_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120};

void dt_metrics_init(dt_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void dt_metrics_destroy(dt_metrics *m) { pthread_mutex_destroy(&m->mu); }

void dt_metrics_request(dt_metrics *m, const char *route, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_req && !(m->req[i].status == status && !strcmp(m->req[i].route, route))) i++;
    if (i == m->n_req && i < DT_METRICS_MAX_SERIES) {
        m->req[i].route = route;
        m->req[i].status = status;
        m->req[i].count = 0;
        m->n_req++;
    }
    if (i < m->n_req) m->req[i].count++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(dt_histogram *h, double s) {
    h->sum += s;
    h->count++;
    for (int i = 0; i < DT_METRICS_BUCKETS; i++)
        if (s <= bounds[i]) h->le[i]++;
}

void dt_metrics_latency(dt_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    observe(&m->latency, s);
    pthread_mutex_unlock(&m->mu);
}

void dt_metrics_image(dt_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    observe(&m->image_s, s);
    m->images++;
    pthread_mutex_unlock(&m->mu);
}

void dt_metrics_cancelled(dt_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->cancelled++;
    pthread_mutex_unlock(&m->mu);
}

void dt_metrics_request_timeout(dt_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->request_timeouts++;
    pthread_mutex_unlock(&m->mu);
}

static void histogram_text(dt_strbuf *o, const char *name, const char *help, const dt_histogram *h) {
    sb_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < DT_METRICS_BUCKETS; i++)
        sb_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)h->le[i]);
    sb_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count, name,
              h->sum, name, (unsigned long long)h->count);
}

void dt_metrics_text(dt_metrics *m, const dt_metrics_gauges *g, dt_strbuf *o) {
    pthread_mutex_lock(&m->mu);
    sb_puts(o, "# HELP ditrun_requests_total HTTP requests answered, by route and status.\n"
               "# TYPE ditrun_requests_total counter\n");
    for (int i = 0; i < m->n_req; i++)
        sb_printf(o, "ditrun_requests_total{route=\"%s\",status=\"%d\"} %llu\n", m->req[i].route, m->req[i].status,
                  (unsigned long long)m->req[i].count);
    histogram_text(o, "ditrun_request_duration_seconds",
                   "Image generation requests answered 200: seconds from receipt to the answer (queue included).",
                   &m->latency);
    histogram_text(o, "ditrun_image_seconds", "Server-side seconds per image (encode, denoise, decode).", &m->image_s);
    sb_printf(o, "# HELP ditrun_images_total Images generated.\n# TYPE ditrun_images_total counter\n"
                 "ditrun_images_total %llu\n"
                 "# HELP ditrun_jobs_cancelled_total Jobs cancelled because their client went away.\n"
                 "# TYPE ditrun_jobs_cancelled_total counter\nditrun_jobs_cancelled_total %llu\n"
                 "# HELP ditrun_request_timeouts_total Connections closed at the --request-timeout deadline: a request "
                 "not complete in time, or a kept-alive connection idle that long.\n# TYPE ditrun_request_timeouts_total counter\n"
                 "ditrun_request_timeouts_total %llu\n",
              (unsigned long long)m->images, (unsigned long long)m->cancelled,
              (unsigned long long)m->request_timeouts);
    pthread_mutex_unlock(&m->mu);
    sb_printf(o, "# HELP ditrun_ready 1 when the models are loaded and warm.\n# TYPE ditrun_ready gauge\nditrun_ready %d\n"
                 "# HELP ditrun_queue_depth Jobs waiting for a worker.\n# TYPE ditrun_queue_depth gauge\n"
                 "ditrun_queue_depth %d\n"
                 "# HELP ditrun_queue_limit Jobs that may wait (--max-queue).\n# TYPE ditrun_queue_limit gauge\n"
                 "ditrun_queue_limit %d\n"
                 "# HELP ditrun_jobs_running Jobs the workers are running.\n# TYPE ditrun_jobs_running gauge\n"
                 "ditrun_jobs_running %d\n",
              g->ready, g->queue_depth, g->max_queue, g->running);
    sb_puts(o, "# HELP ditrun_device_memory_bytes Device memory a worker's backend holds now.\n"
               "# TYPE ditrun_device_memory_bytes gauge\n");
    for (int i = 0; i < g->n_workers; i++)
        sb_printf(o, "ditrun_device_memory_bytes{worker=\"%d\"} %zu\n", i, g->mem_current[i]);
    sb_puts(o, "# HELP ditrun_device_memory_peak_bytes The most device memory a worker's backend has held.\n"
               "# TYPE ditrun_device_memory_peak_bytes gauge\n");
    for (int i = 0; i < g->n_workers; i++)
        sb_printf(o, "ditrun_device_memory_peak_bytes{worker=\"%d\"} %zu\n", i, g->mem_peak[i]);
}
