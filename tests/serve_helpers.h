/* serve_helpers.h — shared by the `ditrun serve` tests (test_serve.c, test_sp_serve.c): real servers of $BUILD/ditrun
 * with the bundled tiny model on ephemeral ports (started, waited for, stopped), requests to them through curl, the
 * PNG images of an images answer, and `ditrun generate` / `ditrun serve` command lines run to compare with.
 * Header-only (static functions). Call serve_setup first and fill serve_tmp with an existing folder. */
#ifndef DT_TESTS_SERVE_HELPERS_H
#define DT_TESTS_SERVE_HELPERS_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/json.h"
#include "test.h"

/* The program under test, the model it serves, and the folder for the servers' output and the requests' files. */
static char serve_exe[512], serve_model[512], serve_tmp[512];

/* serve_exe = $BUILD/ditrun (build/ditrun without BUILD), serve_model = the bundled tiny model. */
static inline void serve_setup(void) {
    const char *b = getenv("BUILD");
    snprintf(serve_exe, sizeof serve_exe, "%s/ditrun", b && *b ? b : "build");
    snprintf(serve_model, sizeof serve_model, "%s/model", t_fixtures());
}

typedef struct {
    pid_t pid;
    int port;
    char out[600], log[600];   /* its stdout (with the "listening on" line) and its stderr */
} server;

static inline void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Writes n bytes of data to path (best effort). */
static inline void spit(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(data, 1, n, f); fclose(f); }
}

/* Start `ditrun serve --port 0 ...extra` on the CPU (1 thread, max sequence length 8), its output in
 * serve_tmp/NAME.out and .log, and read its port from the "listening on" line: 0, or -1 (it exited, or no port
 * after 30 s). */
static inline int server_start(server *s, const char *name, const char *extra) {
    char cmd[4096];
    snprintf(s->out, sizeof s->out, "%s/%s.out", serve_tmp, name);
    snprintf(s->log, sizeof s->log, "%s/%s.log", serve_tmp, name);
    snprintf(cmd, sizeof cmd, "exec %s serve --model %s --port 0 --backend cpu --threads 1 --max-sequence-length 8 %s "
             ">%s 2>%s", serve_exe, serve_model, extra, s->out, s->log);
    s->pid = fork();
    if (s->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->port = 0;
    for (int i = 0; i < 300 && !s->port; i++) {   /* up to 30 s */
        char *o = t_slurp(s->out, NULL);
        const char *p = o ? strstr(o, "listening on http://127.0.0.1:") : NULL;
        if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        free(o);
        if (!s->port) {
            int st;
            if (waitpid(s->pid, &st, WNOHANG) == s->pid) { s->pid = 0; return -1; }
            sleep_ms(100);
        }
    }
    return s->port ? 0 : -1;
}

/* curl METHOD http://127.0.0.1:PORT/PATH with body (NULL: none; sent as application/json unless extra sets a
 * Content-Type) and extra curl args; returns the HTTP status
 * (0: no answer), *out the body (malloc'd), *hdr the headers (malloc'd) when hdr != NULL. */
static inline int http(const server *s, const char *method, const char *path, const char *body, const char *extra,
                       char **out, char **hdr) {
    char bodyf[600], outf[600], hdrf[600], cmd[4096];
    static int seq;
    int k = __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
    snprintf(bodyf, sizeof bodyf, "%s/req%d.body", serve_tmp, k);
    snprintf(outf, sizeof outf, "%s/req%d.out", serve_tmp, k);
    snprintf(hdrf, sizeof hdrf, "%s/req%d.hdr", serve_tmp, k);
    if (body) spit(bodyf, body, strlen(body));
    /* a body is JSON unless extra names another Content-Type (curl would send form-urlencoded) */
    const char *json = body && !(extra && strcasestr(extra, "Content-Type")) ? "-H 'Content-Type: application/json'" : "";
    snprintf(cmd, sizeof cmd, "curl -s -m 120 -X %s %s%s %s -D %s -o %s -w '%%{http_code}' %s 'http://127.0.0.1:%d%s'",
             method, body ? "--data-binary @" : "", body ? bodyf : "", json, hdrf, outf, extra ? extra : "", s->port,
             path);
    FILE *p = popen(cmd, "r");
    int code = 0;
    if (p) {
        if (fscanf(p, "%d", &code) != 1) code = 0;
        pclose(p);
    }
    if (out) *out = t_slurp(outf, NULL);
    if (hdr) *hdr = t_slurp(hdrf, NULL);
    unlink(bodyf);
    unlink(outf);
    unlink(hdrf);
    return code;
}

/* Wait until /health answers 200 (loaded and warm): 0, or -1 after 120 s. */
static inline int server_ready(const server *s) {
    for (int i = 0; i < 1200; i++) {
        if (http(s, "GET", "/health", NULL, NULL, NULL, NULL) == 200) return 0;
        sleep_ms(100);
    }
    return -1;
}

/* SIGTERM and wait: the exit status (or 128 + signal, or -1 after 60 s: then SIGKILL). Its output files stay. */
static inline int server_stop(server *s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 600; i++) {
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        sleep_ms(100);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}

static inline int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 (padding optional) to bytes (malloc'd, *n of them); NULL on a character outside the alphabet. */
static inline unsigned char *b64decode(const char *s, size_t *n) {
    size_t len = strlen(s), k = 0;
    unsigned char *o = malloc(len / 4 * 3 + 3);
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len && s[i] != '='; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0) { free(o); return NULL; }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) { bits -= 8; o[k++] = (unsigned char)(acc >> bits); }
    }
    *n = k;
    return o;
}

/* data[i].b64_json of an images answer, decoded; NULL if absent. */
static inline unsigned char *answer_png(const char *body, int i, size_t *n) {
    json *j = body ? json_parse(body, strlen(body), "answer") : NULL;
    const json *d = j ? json_at(json_get(j, "data"), (size_t)i) : NULL;
    const char *b = d ? json_get_str(d, "b64_json") : NULL;
    unsigned char *png = b ? b64decode(b, n) : NULL;
    json_free(j);
    return png;
}

/* `ditrun generate ARGS --output path` with the servers' settings (CPU, 1 thread, max sequence length 8): 0 ok. */
static inline int serve_generate(const char *args, const char *path) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --backend cpu --threads 1 -q --max-sequence-length 8 %s "
             "--output %s", serve_exe, serve_model, args, path);
    return system(cmd);
}

/* Run the shell command cmd (stdout discarded): its exit status (128: it did not exit), its stderr into err. */
static inline int run_err(const char *cmd, char *err, size_t n) {
    char full[8192], errf[600];
    snprintf(errf, sizeof errf, "%s/cmd-err.txt", serve_tmp);
    snprintf(full, sizeof full, "%s >/dev/null 2>%s", cmd, errf);
    int st = system(full);
    char *e = t_slurp(errf, NULL);
    snprintf(err, n, "%s", e ? e : "");
    free(e);
    unlink(errf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Run `ditrun serve ARGS`, which must fail at once (60 s at most): its exit status, its stderr into err. */
static inline int serve_fails(const char *args, char *err, size_t n) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout 60 %s serve %s", serve_exe, args);
    return run_err(cmd, err, n);
}

/* The value of a Prometheus sample line "name value" of the server's /metrics, or -1. */
static inline double metric(const server *s, const char *name) {
    char *m = NULL;
    http(s, "GET", "/metrics", NULL, NULL, &m, NULL);
    double v = -1;
    for (char *line = m ? strtok(m, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        size_t n = strlen(name);
        if (!strncmp(line, name, n) && line[n] == ' ') v = atof(line + n + 1);
    }
    free(m);
    return v;
}

/* Wait until metric name reaches at least v (polled every 50 ms, up to ms): 1, or 0 at the time-out. */
static inline int wait_metric(const server *s, const char *name, double v, int ms) {
    for (int t = 0; t < ms; t += 50) {
        if (metric(s, name) >= v) return 1;
        sleep_ms(50);
    }
    return 0;
}

#endif
