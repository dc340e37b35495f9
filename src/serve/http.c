/* http.c — the HTTP side of the server over libmicrohttpd (one thread per connection): routing, methods (405),
 * body limits (413), bearer-key auth with a constant-time compare (401), CORS only with --cors, the answers of
 * each route, and waiting on a job while watching the client's socket, so that a client that goes away cancels
 * its job (a half-closed one, which only shut its write side, still gets its answer). Hostile clients: a deadline
 * for a whole request per connection (a sweeper thread closes connections past it, however slowly they trickle
 * bytes), a connection limit per client address, a Host that must name this server (421: DNS rebinding), the
 * body's Content-Type (415: cross-site "simple" requests) and a POST's Origin (403), ambiguous framing (400), a NUL
 * in the path (400), our own 414 / 431 below libmicrohttpd's limits. Every 4xx/5xx answer made here is an OpenAI
 * error object (api.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve/page.h"
#include "serve/server.h"
#include "serve/sse.h"

#define IDLE_TIMEOUT_S 120          /* libmicrohttpd's inactivity timeout (restarted by each byte): slow readers */
#define MAX_CONNECTIONS 256
#define WAIT_SLICE_MS 50            /* how often a waiting request looks at its client's socket */
#define SWEEP_MS 100                /* how often the request deadlines are checked */
#define MAX_URL_BYTES (8u << 10)    /* a longer path: 414 */
#define MAX_HEADER_BYTES (32u << 10)    /* more header bytes: 431 */
#define MHD_POOL_BYTES (128u << 10) /* libmicrohttpd's memory per connection: past it, its own (HTML) 414 / 431 */

/* One TCP connection, from accept to close. */
typedef struct http_conn {
    int fd;
    double deadline;                /* dt_now() by which the request being received must be complete; 0 while one
                                     * is being answered */
    struct http_conn *prev, *next;
} http_conn;

struct dt_http {
    struct MHD_Daemon *daemon;
    pthread_mutex_t mu;             /* conns, stop */
    pthread_cond_t cv;
    http_conn *conns;
    int stop;
    pthread_t sweeper;
    int sweeper_started;
};

enum { R_PAGE, R_HEALTH, R_MODELS, R_MODEL, R_METRICS, R_GENERATIONS, R_EDITS, R_NONE };

static const struct {
    const char *path;       /* exact path; R_MODEL: the prefix of /v1/models/{id} */
    int id, post, v1;
    const char *ctype;      /* POST: the body's media type */
} routes[] = {
    {"/", R_PAGE, 0, 0, NULL},
    {"/health", R_HEALTH, 0, 0, NULL},
    {"/metrics", R_METRICS, 0, 0, NULL},
    {"/v1/models", R_MODELS, 0, 1, NULL},
    {"/v1/images/generations", R_GENERATIONS, 1, 1, "application/json"},
    {"/v1/images/edits", R_EDITS, 1, 1, "multipart/form-data"},
};

typedef struct {
    dt_server *srv;
    int started;                /* the access handler has seen the request */
    int nul_in_url;             /* the raw URL has %00 */
    int http11;                 /* HTTP/1.1 (a 1xx may be sent) */
    int probed;                 /* a half-closed client was sent a probe (to tell it from a closed one) */
    int route, post, v1;
    const char *label;          /* metrics route label */
    const char *ctype;          /* POST: the media type the route takes */
    dt_strbuf body;
    size_t limit, received;     /* body bytes allowed, and received so far */
    int too_big;
    struct MHD_PostProcessor *pp;   /* edits: libmicrohttpd's multipart parser, feeding form */
    dt_api_form form;
    int form_bad;               /* the form was refused (form_err) */
    dt_api_error form_err;
    int answered;               /* a response is queued */
    int status;
    dt_job *job;
    size_t sent;                /* stream: event bytes handed to libmicrohttpd */
    int queued_pos;             /* stream: the place in line last sent in a "queued" event (0: none yet) */
    int fd;                     /* the client's socket */
    double t0;
} req_ctx;

/* ---- connections and their request deadlines ---- */

static http_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The connection starts receiving a request (deadline now + --request-timeout), or is done receiving it (0). */
static void conn_receiving(dt_server *s, struct MHD_Connection *c, int on) {
    http_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&s->http->mu);
    k->deadline = on ? dt_now() + s->o.request_timeout : 0;
    pthread_mutex_unlock(&s->http->mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    dt_server *s = cls;
    struct dt_http *h = s->http;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        http_conn *k = dt_calloc(1, sizeof *k);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        k->deadline = dt_now() + s->o.request_timeout;
        pthread_mutex_lock(&h->mu);
        k->next = h->conns;
        if (h->conns) h->conns->prev = k;
        h->conns = k;
        pthread_mutex_unlock(&h->mu);
        *socket_context = k;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        http_conn *k = *socket_context;   /* libmicrohttpd closes the socket after this: the sweeper never sees a
                                           * reused descriptor */
        pthread_mutex_lock(&h->mu);
        if (k->prev) k->prev->next = k->next;
        else h->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&h->mu);
        free(k);
        *socket_context = NULL;
    }
}

/* Connections past their deadline are shut down: libmicrohttpd's thread then reads the end and closes them. The
 * connection's thread sleeps in poll() meanwhile, so its own inactivity timeout (restarted by every byte a
 * slowloris trickles) cannot do this. */
static void *sweeper_main(void *arg) {
    dt_server *s = arg;
    struct dt_http *h = s->http;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        double now = dt_now();
        for (http_conn *k = h->conns; k; k = k->next)
            if (k->deadline > 0 && now > k->deadline && k->fd >= 0) {
                k->deadline = 0;
                shutdown(k->fd, SHUT_RDWR);
                dt_metrics_request_timeout(&s->m);
                dt_log(2, "ditrun: a connection did not send its request within %d s: closed\n", s->o.request_timeout);
            }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += SWEEP_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- helpers ---- */

/* The client's end of the socket: 0 open, 1 gone (reset, or closed both ways), 2 its write side is shut. 2 is a
 * client that sent its request and waits (shutdown(SHUT_WR), `nc -N`) or one that closed its socket: only a write
 * tells them apart (a closed socket answers it with a reset, which turns this into 1). */
static int peer_state(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {fd, POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return 1;
    return p.revents & POLLRDHUP ? 2 : 0;
}

/* The client of a waiting (not streamed) request went away. A shut write side is probed once with an interim
 * "100 Continue" (any HTTP/1.1 client reads and skips it; an HTTP/1.0 client must not get one, so it is not
 * probed and keeps its answer). */
static int client_gone(req_ctx *r) {
    int st = peer_state(r->fd);
    if (st == 2 && !r->probed && r->http11) {
        static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
        r->probed = 1;
        if (send(r->fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) return 1;
    }
    return st == 1;
}

/* The given key equals the server's: every byte of the server's key is compared, whatever matches. */
static int key_equal(const char *given, const char *key) {
    size_t nk = strlen(key), ng = strlen(given);
    volatile unsigned char d = nk != ng;
    for (size_t i = 0; i < nk; i++) d |= (unsigned char)key[i] ^ (unsigned char)(i < ng ? given[i] : 0);
    return d == 0;
}

static int authorized(dt_server *s, struct MHD_Connection *c) {
    if (!s->o.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, s->o.api_key);
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 501: return "not_implemented_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static void add_common_headers(dt_server *s, struct MHD_Response *resp) {
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (s->o.cors_origin) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, s->o.cors_origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
}

/* Queue body (taken) with status; up to two extra headers (name, value pairs; NULL ends). */
static enum MHD_Result answer(req_ctx *r, struct MHD_Connection *c, int status, const char *ctype, dt_strbuf *body,
                              const char *h1, const char *v1, const char *h2, const char *v2) {
    size_t len;
    char *data = sb_take(body, &len);
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!resp) { free(data); return MHD_NO; }
    add_common_headers(r->srv, resp);
    if (ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (h1) MHD_add_response_header(resp, h1, v1);
    if (h2) MHD_add_response_header(resp, h2, v2);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->answered = 1;
    r->status = status;
    return ret;
}

static enum MHD_Result answer_error(req_ctx *r, struct MHD_Connection *c, const dt_api_error *e, const char *h1,
                                    const char *v1) {
    dt_strbuf b;
    sb_init(&b);
    dt_api_error_json(&b, e);
    return answer(r, c, e->status, "application/json", &b, h1, v1, NULL, NULL);
}

static enum MHD_Result fail(req_ctx *r, struct MHD_Connection *c, int status, const char *param, const char *h1,
                            const char *v1, const char *fmt, ...) DT_PRINTF(7, 8);
static enum MHD_Result fail(req_ctx *r, struct MHD_Connection *c, int status, const char *param, const char *h1,
                            const char *v1, const char *fmt, ...) {
    dt_api_error e;
    dt_api_error_set(&e, status, error_type(status), param, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return answer_error(r, c, &e, h1, v1);
}

/* A job this request no longer waits for: stop it at the next DiT block or step, or take it out of the queue. */
static void cancel_job(req_ctx *r) {
    dt_job *j = r->job;
    if (!j) return;
    __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
    if (dt_queue_remove(&r->srv->q, j)) {
        dt_metrics_cancelled(&r->srv->m);
        dt_job_set_state(j, DT_JOB_CANCELLED);
        dt_log(1, "ditrun: a queued job was cancelled: its client went away\n");
    }
}

/* Wait (job lock held) for the job to change, up to one slice. */
static void wait_slice(dt_job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

/* ---- routes ---- */

static const char *state_name(int st) {
    switch (st) {
    case DT_SRV_READY: return "ok";
    case DT_SRV_LOADING: return "loading";
    case DT_SRV_DRAINING: return "draining";
    default: return "failed";
    }
}

/* What the page sizes its requests by (ready servers): "backend": "cpu", "default_size": "256x256",
 * "max_pixels": N, "size_multiple": M. */
static void serving_fields(dt_server *s, dt_strbuf *b) {
    const int side = dt_server_default_side(s);
    sb_puts(b, "\"backend\": ");
    sb_json_cstr(b, s->backend_name);
    sb_printf(b, ", \"default_size\": \"%dx%d\", \"max_pixels\": %lld", side, side, (long long)s->lim.max_pixels);
}

static enum MHD_Result get_health(req_ctx *r, struct MHD_Connection *c) {
    dt_server *s = r->srv;
    int st = dt_server_state_get(s), depth, running;
    dt_queue_counts(&s->q, &depth, &running);
    dt_strbuf b;
    sb_init(&b);
    sb_printf(&b, "{\"status\": \"%s\", \"model\": ", state_name(st));
    sb_json_cstr(&b, s->model_id);
    sb_printf(&b, ", \"workers\": %d, \"queue_depth\": %d, \"running\": %d, \"uptime\": %.1f", s->n_workers, depth,
              running, dt_now() - s->t_start);
    if (st == DT_SRV_READY) {
        sb_puts(&b, ", ");
        serving_fields(s, &b);
        sb_printf(&b, ", \"size_multiple\": %d", s->lim.info.size_multiple);
    } else {
        dt_api_error e;
        dt_api_error_set(&e, 503, error_type(503), NULL, "%s",
                         st == DT_SRV_LOADING ? "the models are loading and warming up"
                         : st == DT_SRV_DRAINING ? "the server is shutting down" : "the models failed to load");
        sb_puts(&b, ", ");
        dt_strbuf eb;
        sb_init(&eb);
        dt_api_error_json(&eb, &e);
        sb_putn(&b, eb.data + 1, eb.len - 3);    /* the members of the error object, without braces and newline */
        sb_free(&eb);
    }
    sb_puts(&b, "}\n");
    return answer(r, c, st == DT_SRV_READY ? 200 : 503, "application/json", &b, st == DT_SRV_READY ? NULL : "Retry-After",
                  "5", NULL, NULL);
}

static void model_object(dt_server *s, dt_strbuf *b) {
    sb_puts(b, "{\"id\": ");
    sb_json_cstr(b, s->model_id);
    sb_printf(b, ", \"object\": \"model\", \"created\": %lld, \"owned_by\": \"ditrun\"", s->created);
    if (dt_server_state_get(s) == DT_SRV_READY || dt_server_state_get(s) == DT_SRV_DRAINING) {
        const dt_pipeline_info *in = &s->lim.info;
        sb_puts(b, ", \"family\": ");
        sb_json_cstr(b, in->family);
        sb_printf(b, ", \"default_steps\": %d, \"default_guidance\": %g, \"size_multiple\": %d, \"max_side\": %d, "
                  "\"editing\": %s, \"img2img\": %s, \"cfg_shaping\": %s, ", in->default_steps, (double)in->default_guidance,
                  in->size_multiple, in->max_side, in->editing ? "true" : "false", in->img2img ? "true" : "false",
                  in->cfg_shaping ? "true" : "false");
        serving_fields(s, b);
    }
    sb_printf(b, ", \"max_steps\": %d}", s->lim.max_steps);
}

static enum MHD_Result get_models(req_ctx *r, struct MHD_Connection *c, const char *url) {
    dt_server *s = r->srv;
    dt_strbuf b;
    sb_init(&b);
    if (r->route == R_MODEL) {
        const char *id = url + strlen("/v1/models/");
        if (strcmp(id, s->model_id))
            return fail(r, c, 404, "model", NULL, NULL, "model '%.60s' is not served here (this server has '%s')", id,
                        s->model_id);
        model_object(s, &b);
        sb_puts(&b, "\n");
    } else {
        sb_puts(&b, "{\"object\": \"list\", \"data\": [");
        model_object(s, &b);
        sb_puts(&b, "]}\n");
    }
    return answer(r, c, 200, "application/json", &b, NULL, NULL, NULL, NULL);
}

static enum MHD_Result get_metrics(req_ctx *r, struct MHD_Connection *c) {
    dt_server *s = r->srv;
    size_t cur[DT_SERVE_MAX_WORKERS], peak[DT_SERVE_MAX_WORKERS];
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_workers; i++) {
        cur[i] = s->workers[i].mem_current;
        peak[i] = s->workers[i].mem_peak;
    }
    pthread_mutex_unlock(&s->mu);
    dt_metrics_gauges g = {dt_server_state_get(s) == DT_SRV_READY, 0, 0, s->q.max_depth, s->n_workers, cur, peak};
    dt_queue_counts(&s->q, &g.queue_depth, &g.running);
    dt_strbuf b;
    sb_init(&b);
    dt_metrics_text(&s->m, &g, &b);
    return answer(r, c, 200, "text/plain; version=0.0.4; charset=utf-8", &b, NULL, NULL, NULL, NULL);
}

static enum MHD_Result get_page(req_ctx *r, struct MHD_Connection *c) {
    dt_strbuf b;
    sb_init(&b);
    sb_putn(&b, (const char *)dt_serve_page_html, dt_serve_page_html_len);
    return answer(r, c, 200, "text/html; charset=utf-8", &b, "Content-Security-Policy",
                  "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
                  "connect-src 'self'; form-action 'none'; frame-ancestors 'none'", NULL, NULL);
}

/* Stream, job lock held and the job queued: append a "queued" event when its place in line changed. 1 when one
 * was appended. (The queue's lock is taken with the job's released: the queue takes a job's lock under its own.) */
static int queued_event(req_ctx *r) {
    dt_job *j = r->job;
    pthread_mutex_unlock(&j->mu);
    int pos = dt_queue_position(&r->srv->q, j), depth, running;
    dt_queue_counts(&r->srv->q, &depth, &running);
    pthread_mutex_lock(&j->mu);
    if (j->state != DT_JOB_QUEUED || !pos || pos == r->queued_pos) return 0;
    r->queued_pos = pos;
    dt_sse_queued(&j->events, pos, running);
    return 1;
}

/* Stream: hand over the events the worker wrote, wait for more, end with the job. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    req_ctx *r = cls;
    dt_job *j = r->job;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (r->sent < j->events.len) {
            size_t n = j->events.len - r->sent;
            if (n > max) n = max;
            memcpy(buf, j->events.data + r->sent, n);
            r->sent += n;
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->state >= DT_JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (j->state == DT_JOB_QUEUED && queued_event(r)) continue;
        wait_slice(j);
        if (r->sent < j->events.len || j->state >= DT_JOB_DONE) continue;
        int st = peer_state(r->fd);
        if (st == 1) {
            pthread_mutex_unlock(&j->mu);
            cancel_job(r);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (st == 2 && !r->probed) {   /* a shut write side: an event-stream comment as the probe (see client_gone) */
            static const char probe[] = ":\n\n";
            pthread_mutex_unlock(&j->mu);
            r->probed = 1;
            if (max < sizeof probe - 1) return 0;
            memcpy(buf, probe, sizeof probe - 1);
            return (ssize_t)(sizeof probe - 1);
        }
    }
}

/* 503 while loading or shutting down: the answer queued (MHD result in *ret), or 0 when the server is ready. */
static int not_ready(req_ctx *r, struct MHD_Connection *c, enum MHD_Result *ret) {
    int st = dt_server_state_get(r->srv);
    if (st == DT_SRV_READY) return 0;
    *ret = st == DT_SRV_LOADING ? fail(r, c, 503, NULL, "Retry-After", "5", "the models are loading and warming up")
                                : fail(r, c, 503, NULL, NULL, NULL, "the server is shutting down");
    return 1;
}

/* Queue a checked request (taken), wait for it while watching the client, answer (a stream, or the images).
 * image_bytes: its decoded images' reservation in the server's budget, released when the job is freed. */
static enum MHD_Result run_request(req_ctx *r, struct MHD_Connection *c, dt_api_request *req, int64_t image_bytes) {
    dt_server *s = r->srv;
    r->job = dt_job_new(req);
    if (image_bytes > 0) {
        r->job->budget = &s->images;
        r->job->image_bytes = image_bytes;
    }
    const int steps = r->job->req.gen.steps;   /* resolved when the request was checked */
    r->job->cost_steps = (double)r->job->req.n * (steps > 0 ? steps : 1);
    const dt_api_request *jr = &r->job->req;
    const dt_image *first = jr->inpaint || jr->img2img ? &jr->init : jr->n_refs ? &jr->refs[0] : NULL;
    double px = jr->width && jr->height ? (double)jr->width * jr->height : first ? (double)first->w * first->h : 0;
    r->job->cost_pixel_steps = r->job->cost_steps * px;   /* an edit of size "auto": about its first image's */
    int q = dt_queue_push(&s->q, r->job);
    if (q == -1) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", dt_queue_retry_after(&s->q, s->n_workers));
        return fail(r, c, 429, NULL, "Retry-After", ra, "the queue is full (%d requests wait); retry in %s s",
                    s->q.max_depth, ra);
    }
    if (q == -2) return fail(r, c, 503, NULL, NULL, NULL, "the server is shutting down");
    dt_job *j = r->job;
    if (j->req.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_read, r, NULL);
        if (!resp) return MHD_NO;
        add_common_headers(s, resp);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        r->answered = 1;
        r->status = 200;
        return ret;
    }
    pthread_mutex_lock(&j->mu);
    while (j->state < DT_JOB_DONE) {
        wait_slice(j);
        if (j->state < DT_JOB_DONE && client_gone(r)) {
            pthread_mutex_unlock(&j->mu);
            cancel_job(r);
            r->status = 499;
            return MHD_NO;   /* closes the connection */
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (j->state == DT_JOB_FAILED) return answer_error(r, c, &j->error, NULL, NULL);
    if (j->state != DT_JOB_DONE) {
        r->status = 499;
        return MHD_NO;
    }
    dt_strbuf b;
    sb_init(&b);
    dt_api_images_json(&b, (long long)time(NULL), j->req.output_format, j->req.n, j->img, j->img_len, j->seeds);
    char timing[300];
    snprintf(timing, sizeof timing, "queue;dur=%.1f, encode;dur=%.1f, denoise;dur=%.1f, decode;dur=%.1f, "
             "generate;dur=%.1f, image;dur=%.1f, passes;desc=\"%d of %d computed\"", (j->t_start - j->t_submit) * 1e3,
             j->t_encode * 1e3, j->t_denoise * 1e3, j->t_decode * 1e3, (j->t_end - j->t_start) * 1e3,
             j->t_image * 1e3, j->passes_computed, j->passes);
    return answer(r, c, 200, "application/json", &b, "Server-Timing", timing, NULL, NULL);
}

static enum MHD_Result post_generation(req_ctx *r, struct MHD_Connection *c) {
    enum MHD_Result ret;
    if (not_ready(r, c, &ret)) return ret;
    dt_api_request req;
    dt_api_error e;
    if (dt_api_parse_generation(r->body.data ? r->body.data : "", r->body.len, &r->srv->lim, dt_server_seed(r->srv),
                                &req, &e))
        return answer_error(r, c, &e, NULL, NULL);
    return run_request(r, c, &req, 0);
}

/* POST /v1/images/edits: the multipart form (collected by libmicrohttpd's post processor within 32 MiB), its
 * images decoded and checked here, then queued as a generation with reference images / inpainting. */
static enum MHD_Result post_edit(req_ctx *r, struct MHD_Connection *c) {
    enum MHD_Result ret;
    if (not_ready(r, c, &ret)) return ret;
    if (r->form_bad) return answer_error(r, c, &r->form_err, NULL, NULL);
    dt_server *s = r->srv;
    dt_api_request req;
    dt_api_error e;
    /* what the images will hold once decoded, from their headers, reserved before any pixel is decoded */
    int64_t bytes = 0;
    if (dt_api_edit_image_bytes(&r->form, s->lim.info.img2img, &bytes, &e)) return answer_error(r, c, &e, NULL, NULL);
    const double mib = 1024.0 * 1024.0;
    int b = dt_image_budget_reserve(&s->images, bytes);
    if (b == -2)
        return fail(r, c, 413, "image", NULL, NULL, "this edit's images decode to %.1f MiB, more than this server "
                    "holds for all edits together (%.1f MiB, --max-queued-image-bytes)", (double)bytes / mib,
                    (double)s->o.max_image_bytes / mib);
    if (b == -1) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", dt_queue_retry_after(&s->q, s->n_workers));
        return fail(r, c, 429, NULL, "Retry-After", ra, "the edits queued and running hold the server's %.1f MiB of "
                    "decoded images (--max-queued-image-bytes); this one needs %.1f MiB; retry in %s s",
                    (double)s->o.max_image_bytes / mib, (double)bytes / mib, ra);
    }
    int rc = dt_api_parse_edit(&r->form, &s->lim, dt_server_seed(s), &req, &e);
    dt_api_form_free(&r->form);   /* the uploads are decoded: their bytes are not needed any more */
    if (rc) {
        dt_image_budget_release(&s->images, bytes);
        return answer_error(r, c, &e, NULL, NULL);
    }
    return run_request(r, c, &req, bytes);
}

/* libmicrohttpd's post processor hands over the form's parts in pieces. */
static enum MHD_Result on_form_piece(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                     const char *content_type, const char *transfer_encoding, const char *data,
                                     uint64_t off, size_t size) {
    (void)kind;
    (void)content_type;
    (void)transfer_encoding;
    req_ctx *r = cls;
    if (r->form_bad) return MHD_NO;
    if (dt_api_form_add(&r->form, key, filename, data, off, size, &r->form_err)) {
        r->form_bad = 1;
        return MHD_NO;
    }
    return MHD_YES;
}

static void form_refused(req_ctx *r, const char *what) {
    if (r->form_bad) return;
    r->form_bad = 1;
    dt_api_error_set(&r->form_err, 400, "invalid_request_error", NULL, "the multipart/form-data body is %s", what);
}

/* ---- libmicrohttpd callbacks ---- */

static const char *allowed_methods(const req_ctx *r) {
    return r->post ? (r->srv->o.cors_origin ? "POST, OPTIONS" : "POST")
                   : (r->srv->o.cors_origin ? "GET, HEAD, OPTIONS" : "GET, HEAD");
}

/* The request's Host names this server: an IP address (no DNS name, so nothing to rebind), localhost, --host's
 * name or an --allow-host name; the port is not compared. A request without Host (HTTP/1.0; libmicrohttpd refuses
 * HTTP/1.1 without one) passes. */
static int host_allowed(const dt_server *s, const char *host) {
    if (!host) return 1;
    char name[256];
    size_t n;
    if (host[0] == '[') {   /* [IPv6]:port */
        const char *end = strchr(host, ']');
        n = end ? (size_t)(end - host - 1) : sizeof name;
        if (n >= sizeof name) return 0;
        memcpy(name, host + 1, n);
        name[n] = 0;
        struct in6_addr a6;
        return inet_pton(AF_INET6, name, &a6) == 1;
    }
    const char *colon = strchr(host, ':');
    n = colon ? (size_t)(colon - host) : strlen(host);
    if (n == 0 || n >= sizeof name) return 0;
    memcpy(name, host, n);
    name[n] = 0;
    if (n > 1 && name[n - 1] == '.') name[n - 1] = 0;   /* the absolute form "localhost." */
    struct in_addr a4;
    if (inet_pton(AF_INET, name, &a4) == 1 || !strcasecmp(name, "localhost") || !strcasecmp(name, s->o.host)) return 1;
    for (int i = 0; i < s->o.n_allow_hosts; i++)
        if (!strcasecmp(name, s->o.allow_hosts[i])) return 1;
    return 0;
}

/* A POST a browser sent from another site's page: its Origin is neither this server's own (http:// or, behind a TLS
 * proxy, https://, and the Host it was sent to: the page at GET /) nor the --cors origin. Clients other than
 * browsers send no Origin. */
static int cross_site(const dt_server *s, const char *origin, const char *host) {
    if (!origin) return 0;
    if (s->o.cors_origin && (!strcmp(s->o.cors_origin, "*") || !strcasecmp(origin, s->o.cors_origin))) return 0;
    const char *rest = !strncasecmp(origin, "http://", 7)    ? origin + 7
                       : !strncasecmp(origin, "https://", 8) ? origin + 8
                                                             : NULL;
    return !(host && rest && !strcasecmp(rest, host));
}

/* The Content-Type header names media type want (parameters such as charset or boundary may follow). */
static int media_type_is(const char *ct, const char *want) {
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strlen(want);
    if (strncasecmp(ct, want, n)) return 0;
    ct += n;
    while (*ct == ' ' || *ct == '\t') ct++;
    return *ct == 0 || *ct == ';';
}

/* What the request's headers hold, for the checks libmicrohttpd leaves to us. */
typedef struct {
    size_t bytes;               /* names and values, with ": " and CRLF */
    int n_length;               /* Content-Length headers */
    const char *length;         /* the first one's value */
    int lengths_differ;
    int chunked;                /* a Transfer-Encoding header */
} header_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    header_scan *h = cls;
    if (!value) value = "";
    h->bytes += strlen(key) + strlen(value) + 4;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        if (h->n_length++ == 0) h->length = value;
        else if (strcmp(h->length, value)) h->lengths_differ = 1;
    }
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) h->chunked = 1;
    return MHD_YES;
}

/* Answers that need no body, given on the first call: a NUL in the path, 414, 431, ambiguous framing (400, and the
 * connection closes), a foreign Host (421), 404, 405, CORS preflight, 401, 415, a cross-site POST (403), 413 by
 * Content-Length. MHD_YES with nothing queued when the request goes on. */
static enum MHD_Result first_call(req_ctx *r, struct MHD_Connection *c, const char *url, const char *method) {
    dt_server *s = r->srv;
    r->route = R_NONE;
    r->label = "other";
    if (r->nul_in_url) return fail(r, c, 400, NULL, NULL, NULL, "the path has a NUL byte (%%00)");
    if (strlen(url) > MAX_URL_BYTES)
        return fail(r, c, 414, NULL, NULL, NULL, "the path is %zu bytes; at most %u are accepted", strlen(url),
                    MAX_URL_BYTES);
    header_scan hs = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_header, &hs);
    if (hs.bytes > MAX_HEADER_BYTES)
        return fail(r, c, 431, NULL, NULL, NULL, "the request's headers are %zu bytes; at most %u are accepted",
                    hs.bytes, MAX_HEADER_BYTES);
    if (hs.lengths_differ)
        return fail(r, c, 400, NULL, MHD_HTTP_HEADER_CONNECTION, "close",
                    "the request has Content-Length headers with different values");
    if (hs.n_length && hs.chunked)
        return fail(r, c, 400, NULL, MHD_HTTP_HEADER_CONNECTION, "close",
                    "the request has both Content-Length and Transfer-Encoding");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (!host_allowed(s, host))
        return fail(r, c, 421, NULL, NULL, NULL, "Host '%.80s' is not a name of this server (it answers to localhost, "
                    "IP addresses and the names given with --allow-host)", host);
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) {
            r->route = routes[i].id;
            r->post = routes[i].post;
            r->v1 = routes[i].v1;
            r->label = routes[i].path;
            r->ctype = routes[i].ctype;
        }
    if (r->route == R_NONE && !strncmp(url, "/v1/models/", 11) && url[11]) {
        r->route = R_MODEL;
        r->v1 = 1;
        r->label = "/v1/models/{id}";
    }
    if (r->route == R_NONE) return fail(r, c, 404, NULL, NULL, NULL, "no such route: %.80s", url);
    if (!strcmp(method, "OPTIONS") && s->o.cors_origin) {
        dt_strbuf b;
        sb_init(&b);
        return answer(r, c, 204, NULL, &b, "Access-Control-Allow-Methods", allowed_methods(r),
                      "Access-Control-Allow-Headers", "Authorization, Content-Type");
    }
    int ok = r->post ? !strcmp(method, "POST") : (!strcmp(method, "GET") || !strcmp(method, "HEAD"));
    if (!ok)
        return fail(r, c, 405, NULL, MHD_HTTP_HEADER_ALLOW, allowed_methods(r), "method %.16s is not allowed on %s (%s)",
                    method, url, allowed_methods(r));
    if (r->v1 && !authorized(s, c))
        return fail(r, c, 401, NULL, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer",
                    "missing or wrong API key (send Authorization: Bearer KEY)");
    if (r->post) {
        /* a page on another site may send text/plain, form-urlencoded or multipart bodies without asking (no CORS
         * preflight): generations take only JSON, edits only multipart, and a browser's POST must come from this
         * server's page or the --cors origin */
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        if (!media_type_is(ct, r->ctype))
            return fail(r, c, 415, NULL, NULL, NULL, "%s takes only Content-Type: %s (this request has %.60s)", url,
                        r->ctype, ct ? ct : "missing");
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
        if (cross_site(s, origin, host))
            return fail(r, c, 403, NULL, NULL, NULL, "a request from a page of %.80s is refused (this server's own page "
                        "and --cors ORIGIN are allowed)", origin);
        r->limit = r->route == R_EDITS ? DT_API_EDIT_BODY_LIMIT : DT_API_BODY_LIMIT;
        if (hs.length && strtoull(hs.length, NULL, 10) > r->limit)
            return fail(r, c, 413, NULL, NULL, NULL, "the request body is %s bytes; at most %zu are accepted here",
                        hs.length, r->limit);
    }
    if (r->route == R_EDITS) {
        r->pp = MHD_create_post_processor(c, 64 * 1024, on_form_piece, r);
        if (!r->pp)
            return fail(r, c, 400, NULL, NULL, NULL, "an edit request is a multipart/form-data body (image[] files, "
                        "prompt, optional mask, ...)");
    }
    return MHD_YES;
}

/* A request's context, made when its request line is in (libmicrohttpd's URI log callback, which sees the URL before
 * it is unescaped: a %00 would cut the path short, "/health%00.html" into "/health"). */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)c;
    dt_server *s = cls;
    req_ctx *r = dt_calloc(1, sizeof *r);
    r->srv = s;
    r->t0 = dt_now();
    r->fd = -1;
    sb_init(&r->body);
    size_t n = strcspn(uri, "?");
    for (size_t i = 0; i + 2 < n; i++)
        if (uri[i] == '%' && uri[i + 1] == '0' && uri[i + 2] == '0') r->nul_in_url = 1;
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    dt_server *s = cls;
    req_ctx *r = *con_cls;
    if (!r) r = *con_cls = on_uri(s, url, c);
    if (!r->started) {   /* from here on the request counts as in flight: a drain waits for its answer */
        r->started = 1;
        pthread_mutex_lock(&s->mu);
        s->inflight++;
        pthread_mutex_unlock(&s->mu);
        r->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) r->fd = ci->connect_fd;
        return first_call(r, c, url, method);
    }
    if (!*upload_size) conn_receiving(s, c, 0);   /* the whole request is in: no deadline while it is answered */
    if (r->answered) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        r->received += *upload_size;
        if (!r->too_big && r->received > r->limit) {
            r->too_big = 1;
            sb_free(&r->body);
            dt_api_form_free(&r->form);
        }
        if (!r->too_big && r->pp) {
            if (!r->form_bad && MHD_post_process(r->pp, upload, *upload_size) != MHD_YES) form_refused(r, "malformed");
        } else if (!r->too_big) {
            sb_putn(&r->body, upload, *upload_size);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->pp) {   /* the whole body is in: the parser must have reached its end */
        if (MHD_destroy_post_processor(r->pp) != MHD_YES) form_refused(r, "incomplete or malformed");
        r->pp = NULL;
    }
    if (r->too_big)
        return fail(r, c, 413, NULL, NULL, NULL, "the request body is over %zu bytes, the most accepted here", r->limit);
    switch (r->route) {
    case R_PAGE: return get_page(r, c);
    case R_HEALTH: return get_health(r, c);
    case R_MODELS:
    case R_MODEL: return get_models(r, c, url);
    case R_METRICS: return get_metrics(r, c);
    case R_GENERATIONS: return post_generation(r, c);
    case R_EDITS: return post_edit(r, c);
    default: return fail(r, c, 404, NULL, NULL, NULL, "no such route: %.80s", url);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    dt_server *s = cls;
    conn_receiving(s, c, 1);   /* the next request on this connection has its own deadline */
    req_ctx *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    int status = r->status ? r->status : 499;
    if (r->job) {
        pthread_mutex_lock(&r->job->mu);
        int finished = r->job->state >= DT_JOB_DONE, done = r->job->state == DT_JOB_DONE;
        pthread_mutex_unlock(&r->job->mu);
        if (!finished) cancel_job(r);
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !done) status = status == 200 ? 499 : status;
        else if (status == 200) dt_metrics_latency(&s->m, dt_now() - r->t0);
        dt_job_unref(r->job);
    }
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && status < 400) status = 499;
    if (r->started) dt_metrics_request(&s->m, r->label ? r->label : "other", status);   /* (else libmicrohttpd
                                                                                         * refused it itself) */
    if (r->pp) MHD_destroy_post_processor(r->pp);
    dt_api_form_free(&r->form);
    sb_free(&r->body);
    int started = r->started;
    free(r);
    if (!started) return;
    pthread_mutex_lock(&s->mu);
    s->inflight--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (dt_log_level < 2) return;
    fprintf(stderr, "ditrun: http: ");
    vfprintf(stderr, fmt, ap);
}

int dt_http_start(dt_server *s, int *bound_port) {
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o.port);
    int gai = getaddrinfo(s->o.host, port, &hints, &ai);
    if (gai || !ai) {
        dt_set_error("serve: --host %s: %s", s->o.host, gai ? gai_strerror(gai) : "no address");
        return -1;
    }
    struct sockaddr_storage addr;
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen < sizeof addr ? ai->ai_addrlen : sizeof addr);
    int v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    struct dt_http *h = dt_calloc(1, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->http = h;
    errno = 0;
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)s->o.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)s->o.max_client_connections, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)MHD_POOL_BYTES,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!h->daemon) {
        dt_set_error("serve: cannot listen on %s port %d%s%s", s->o.host, s->o.port, errno ? ": " : "",
                     errno ? strerror(errno) : "");
        dt_http_stop(s);
        return -1;
    }
    if (pthread_create(&h->sweeper, NULL, sweeper_main, s)) {
        dt_set_error("serve: cannot start the request deadline thread");
        dt_http_stop(s);
        return -1;
    }
    h->sweeper_started = 1;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = di ? di->port : s->o.port;
    return 0;
}

void dt_http_quiesce(dt_server *s) {
    if (!s->http || !s->http->daemon) return;
    MHD_socket fd = MHD_quiesce_daemon(s->http->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void dt_http_stop(dt_server *s) {
    struct dt_http *h = s->http;
    if (!h) return;
    if (h->daemon) MHD_stop_daemon(h->daemon);   /* closes every connection (each leaves h->conns) */
    if (h->sweeper_started) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->sweeper, NULL);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
    s->http = NULL;
}
