/* serve.c — the server's life: bind, load and warm the workers (health 503 until then), serve, and on SIGTERM or
 * SIGINT drain: stop accepting, finish every accepted job, answer it, exit 0 (serve.h). A second signal while
 * draining stops at once. */
#include "serve/serve.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "serve/server.h"

void dt_serve_opts_default(dt_serve_opts *o) {
    memset(o, 0, sizeof *o);
    dt_pipeline_opts_default(&o->load);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->backend = "auto";
    o->be.rope_fp32 = 1;
    o->n_workers = 1;
    o->max_queue = 16;
    o->max_image_bytes = (int64_t)2 << 30;
    o->max_pixels = 0;   /* the backend's default, once the first worker has loaded (worker.c) */
    o->max_steps = 100;
    o->request_timeout = 60;
    o->max_client_connections = 32;
}

int dt_serve_default_side(const char *backend_name) { return backend_name && !strcmp(backend_name, "cpu") ? 256 : 1024; }

int dt_server_default_side(const dt_server *s) { return dt_serve_default_side(s->backend_name); }

uint64_t dt_server_seed(dt_server *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t x = s->rng;   /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->rng = x;
    pthread_mutex_unlock(&s->mu);
    return (x * 0x2545F4914F6CDD1DULL) >> 32;   /* 0 .. 2^32-1: short enough to type into `ditrun generate --seed` */
}

/* The last folder name of the model root ("FLUX.2-klein-4B" for /models/FLUX.2-klein-4B/). */
static void default_model_id(const char *root, char *out, size_t n) {
    size_t len = strlen(root);
    while (len > 1 && root[len - 1] == '/') len--;
    size_t b = len;
    while (b > 0 && root[b - 1] != '/') b--;
    snprintf(out, n, "%.*s", (int)(len - b), root + b);
    if (!out[0]) snprintf(out, n, "model");
}

/* SIGTERM/SIGINT: the handler (whichever thread the kernel picks, including threads libraries started before main)
 * writes the signal number into a pipe that the main thread polls; a second signal while draining exits at once. */
static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t draining_now;

static void on_signal(int sig) {
    if (draining_now) _exit(128 + sig);
    unsigned char b = (unsigned char)sig;
    int saved = errno;
    if (write(sig_pipe[1], &b, 1) < 0) {}
    errno = saved;
}

/* Wait for a signal, up to ms milliseconds: the signal number, or 0. */
static int wait_signal(int ms) {
    struct pollfd p = {sig_pipe[0], POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return 0;
    unsigned char b = 0;
    return read(sig_pipe[0], &b, 1) == 1 ? b : 0;
}

static void drain(dt_server *s) {
    dt_server_state_set(s, DT_SRV_DRAINING);
    dt_http_quiesce(s);                 /* no new connections */
    dt_queue_close(&s->q);              /* workers finish what is queued, then leave */
    dt_workers_join(s);
    /* the HTTP threads hand the last answers over */
    pthread_mutex_lock(&s->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    while (s->inflight > 0)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT) break;
    int left = s->inflight;
    pthread_mutex_unlock(&s->mu);
    if (left) dt_log(1, "ditrun: %d request%s still open after 30 s; closing them\n", left, left > 1 ? "s" : "");
    dt_http_stop(s);
}

int dt_serve_run(const dt_serve_opts *o) {
    dt_server *s = dt_calloc(1, sizeof *s);
    s->o = *o;
    s->n_workers = o->n_workers < 1 ? 1 : o->n_workers > DT_SERVE_MAX_WORKERS ? DT_SERVE_MAX_WORKERS : o->n_workers;
    if (o->model_id) snprintf(s->model_id, sizeof s->model_id, "%s", o->model_id);
    else default_model_id(o->load.model, s->model_id, sizeof s->model_id);
    s->lim.model_id = s->model_id;
    s->lim.max_pixels = o->max_pixels;
    s->lim.max_steps = o->max_steps;
    s->lim.max_seq_len = o->max_seq_len;
    s->lim.cache = o->cache;
    s->t_start = dt_now();
    s->created = (long long)time(NULL);
    if (getrandom(&s->rng, sizeof s->rng, 0) != (ssize_t)sizeof s->rng || !s->rng)
        s->rng = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^ 0x9E3779B97F4A7C15ULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    dt_queue_init(&s->q, o->max_queue);
    dt_image_budget_init(&s->images, o->max_image_bytes);
    dt_metrics_init(&s->m);
    dt_server_state_set(s, DT_SRV_LOADING);

    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK)) {
        fprintf(stderr, "ditrun: error: serve: pipe: %s\n", strerror(errno));
        return 1;
    }
    struct sigaction sa, old_term, old_int;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1, port = 0;
    if (dt_http_start(s, &port)) {
        fprintf(stderr, "ditrun: error: %s\n", dt_last_error());
        goto out;
    }
    const char *h = o->host;
    int v6 = strchr(h, ':') != NULL;
    printf("ditrun: listening on http://%s%s%s:%d\n", v6 ? "[" : "", h, v6 ? "]" : "", port);
    fflush(stdout);
    if (dt_workers_start(s)) {
        fprintf(stderr, "ditrun: error: %s\n", dt_last_error());
        dt_server_state_set(s, DT_SRV_FAILED);
        dt_queue_close(&s->q);
        dt_workers_join(s);
        dt_http_stop(s);
        goto out;
    }
    /* loading: until every worker is warm, one failed, or a signal */
    int sig = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int loaded = s->n_loaded, failed = s->load_error[0] != 0;
        pthread_mutex_unlock(&s->mu);
        if (failed || loaded == s->n_workers) break;
        if ((sig = wait_signal(100))) break;
    }
    if (s->load_error[0] || sig) {
        if (s->load_error[0]) fprintf(stderr, "ditrun: error: %s\n", s->load_error);
        else dt_log(1, "ditrun: signal %d while loading: stopping\n", sig);
        dt_server_state_set(s, DT_SRV_FAILED);
        dt_queue_close(&s->q);
        dt_workers_join(s);
        dt_http_stop(s);
        rc = s->load_error[0] ? 1 : 0;
        goto out;
    }
    dt_server_state_set(s, DT_SRV_READY);
    dt_log(1, "ditrun: ready (%d worker%s, %.2f s after start)\n", s->n_workers, s->n_workers > 1 ? "s" : "",
           dt_now() - s->t_start);
    while (!(sig = wait_signal(1000))) {}
    dt_log(1, "ditrun: %s: finishing the accepted requests (a second signal stops at once)\n",
           sig == SIGTERM ? "SIGTERM" : "SIGINT");
    draining_now = 1;
    drain(s);
    dt_log(1, "ditrun: stopped\n");
    rc = 0;
out:
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    draining_now = 0;
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    sig_pipe[0] = sig_pipe[1] = -1;
    dt_metrics_destroy(&s->m);
    dt_queue_destroy(&s->q);
    dt_image_budget_destroy(&s->images);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
}
