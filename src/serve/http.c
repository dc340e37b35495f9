/* http.c — the HTTP side of the server over libmicrohttpd (one thread per connection): routing, methods (405),
 * body limits (413), bearer-key auth with a constant-time compare (401), CORS only with --cors, the answers of
 * each route, and waiting on a job while watching the client's socket, so that a client that goes away cancels
 * its job. Every 4xx/5xx answer is an OpenAI error object (api.h). */
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

#include "pipeline/image_meta.h"
#include "pipeline/png.h"
#include "serve/page.h"
#include "serve/server.h"

#define IDLE_TIMEOUT_S 120          /* an idle connection (no request) is closed after this */
#define MAX_CONNECTIONS 256
#define WAIT_SLICE_MS 50            /* how often a waiting request looks at its client's socket */

enum { R_PAGE, R_HEALTH, R_MODELS, R_MODEL, R_METRICS, R_GENERATIONS, R_EDITS, R_NONE };

static const struct {
    const char *path;       /* exact path; R_MODEL: the prefix of /v1/models/{id} */
    int id, post, v1;
} routes[] = {
    {"/", R_PAGE, 0, 0},
    {"/health", R_HEALTH, 0, 0},
    {"/metrics", R_METRICS, 0, 0},
    {"/v1/models", R_MODELS, 0, 1},
    {"/v1/images/generations", R_GENERATIONS, 1, 1},
    {"/v1/images/edits", R_EDITS, 1, 1},
};

typedef struct {
    dt_server *srv;
    int route, post, v1;
    const char *label;          /* metrics route label */
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
    int fd;                     /* the client's socket */
    double t0;
} req_ctx;

/* ---- helpers ---- */

static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
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

/* A job this request no longer waits for: stop it between steps, or take it out of the queue. */
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
    if (st != DT_SRV_READY) {
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
        sb_printf(b, ", \"default_steps\": %d, \"size_multiple\": %d, \"max_side\": %d", in->default_steps,
                  in->size_multiple, in->max_side);
    }
    sb_printf(b, ", \"max_pixels\": %lld, \"max_steps\": %d}", (long long)s->lim.max_pixels, s->lim.max_steps);
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
        wait_slice(j);
        if (r->sent == j->events.len && j->state < DT_JOB_DONE && client_gone(r->fd)) {
            pthread_mutex_unlock(&j->mu);
            cancel_job(r);
            return MHD_CONTENT_READER_END_WITH_ERROR;
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
        if (j->state < DT_JOB_DONE && client_gone(r->fd)) {
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
    /* the PNGs, here rather than in the worker, which runs the next job meanwhile */
    double t_png = dt_now();
    for (int i = 0; i < j->req.n; i++) {
        if (j->png[i] || !j->rgb[i]) continue;
        dt_gen_params g;
        dt_api_gen_params(&j->req, &s->lim, i, &g);
        dt_image_meta meta;
        dt_image_meta_fill(&meta, &g, j->steps[i], j->width[i], j->height[i], s->o.load.model);
        if (dt_png_encode(j->rgb[i], j->width[i], j->height[i], meta.text, meta.n, &j->png[i], &j->png_len[i]))
            return fail(r, c, 500, NULL, NULL, NULL, "PNG encoding failed: %s", dt_last_error());
        free(j->rgb[i]);
        j->rgb[i] = NULL;
    }
    t_png = dt_now() - t_png;
    dt_strbuf b;
    sb_init(&b);
    dt_api_images_json(&b, (long long)time(NULL), j->req.n, j->png, j->png_len, j->seeds);
    char timing[200];
    snprintf(timing, sizeof timing, "queue;dur=%.1f, encode;dur=%.1f, denoise;dur=%.1f, decode;dur=%.1f, "
             "generate;dur=%.1f, png;dur=%.1f", (j->t_start - j->t_submit) * 1e3, j->t_encode * 1e3, j->t_denoise * 1e3,
             j->t_decode * 1e3, (j->t_end - j->t_start) * 1e3, t_png * 1e3);
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
    if (dt_api_edit_image_bytes(&r->form, &bytes, &e)) return answer_error(r, c, &e, NULL, NULL);
    const double mib = 1024.0 * 1024.0;
    int b = dt_image_budget_reserve(&s->images, bytes);
    if (b == -2)
        return fail(r, c, 413, "image", NULL, NULL, "this edit's images decode to %.1f MiB, more than this server holds "
                    "for all edits together (%.1f MiB, --max-queued-image-bytes)", (double)bytes / mib,
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

/* Answers that need no body, given on the first call: 404, 405, CORS preflight, 401, 413 by Content-Length.
 * MHD_YES with nothing queued when the request goes on. */
static enum MHD_Result first_call(req_ctx *r, struct MHD_Connection *c, const char *url, const char *method) {
    dt_server *s = r->srv;
    r->route = R_NONE;
    r->label = "other";
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) {
            r->route = routes[i].id;
            r->post = routes[i].post;
            r->v1 = routes[i].v1;
            r->label = routes[i].path;
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
        r->limit = r->route == R_EDITS ? DT_API_EDIT_BODY_LIMIT : DT_API_BODY_LIMIT;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > r->limit)
            return fail(r, c, 413, NULL, NULL, NULL, "the request body is %s bytes; at most %zu are accepted here", cl,
                        r->limit);
    }
    if (r->route == R_EDITS) {
        r->pp = MHD_create_post_processor(c, 64 * 1024, on_form_piece, r);
        if (!r->pp)
            return fail(r, c, 400, NULL, NULL, NULL, "an edit request is a multipart/form-data body (image[] files, "
                        "prompt, optional mask, ...)");
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    dt_server *s = cls;
    req_ctx *r = *con_cls;
    if (!r) {
        r = dt_calloc(1, sizeof *r);
        r->srv = s;
        r->t0 = dt_now();
        r->fd = -1;
        sb_init(&r->body);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) r->fd = ci->connect_fd;
        *con_cls = r;
        pthread_mutex_lock(&s->mu);
        s->inflight++;
        pthread_mutex_unlock(&s->mu);
        return first_call(r, c, url, method);
    }
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
    (void)c;
    dt_server *s = cls;
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
    dt_metrics_request(&s->m, r->label ? r->label : "other", status);
    if (r->pp) MHD_destroy_post_processor(r->pp);
    dt_api_form_free(&r->form);
    sb_free(&r->body);
    free(r);
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
    errno = 0;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->o.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_END);
    if (!d) {
        dt_set_error("serve: cannot listen on %s port %d%s%s", s->o.host, s->o.port, errno ? ": " : "",
                     errno ? strerror(errno) : "");
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = di ? di->port : s->o.port;
    s->daemon = d;
    return 0;
}

void dt_http_quiesce(dt_server *s) {
    if (!s->daemon) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void dt_http_stop(dt_server *s) {
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
