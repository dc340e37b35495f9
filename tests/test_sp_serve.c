/* test_sp_serve.c — `ditrun serve --sequence-parallel N` and `--devices` on the CPU: a real server of $BUILD/ditrun on
 * an ephemeral port with the bundled tiny model, its DiT split over 2 thread ranks, driven by curl. The served PNG is
 * byte-identical to `ditrun generate --sequence-parallel 2`'s and within one 8-bit step of the unsplit image; the
 * option errors (GPUs asked of the CPU backend, a bad device list, more ranks than heads) are one error line and
 * exit 1. Data-parallel serving over several GPUs runs in the GPU suite (tools/gpu_run.sh sp). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/json.h"
#include "pipeline/png.h"
#include "test.h"

/* The split forward differs from the unsplit one by GEMM summation order only (rel ~1e-7), which can move a pixel
 * across a rounding boundary of the 8-bit conversion. */
#define SP_PIXEL_TOL 1

static char exe[512], tmpdir[512], model[512];

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct {
    pid_t pid;
    int port;
    char out[600], log[600];
} server;

/* Start `ditrun serve --port 0 ...` and wait for /health to say ready (or the process to exit: -1). */
static int server_start(server *s, const char *extra) {
    char cmd[4096];
    snprintf(s->out, sizeof s->out, "%s/sp-serve.out", tmpdir);
    snprintf(s->log, sizeof s->log, "%s/sp-serve.log", tmpdir);
    snprintf(cmd, sizeof cmd, "exec %s serve --model %s --port 0 --backend cpu --threads 1 --max-sequence-length 8 %s "
             ">%s 2>%s", exe, model, extra, s->out, s->log);
    s->pid = fork();
    if (s->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->port = 0;
    for (int i = 0; i < 300; i++) {   /* up to 30 s */
        char *o = t_slurp(s->out, NULL), *l = t_slurp(s->log, NULL);
        const char *p = o ? strstr(o, "listening on http://127.0.0.1:") : NULL;
        if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        int ready = l && strstr(l, "ditrun: ready");
        free(o);
        free(l);
        if (s->port && ready) return 0;
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) { s->pid = 0; return -1; }
        sleep_ms(100);
    }
    return -1;
}

static void server_stop(server *s) {
    if (s->pid <= 0) return;
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 300; i++) {
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) { s->pid = 0; break; }
        sleep_ms(100);
    }
    if (s->pid > 0) { kill(s->pid, SIGKILL); waitpid(s->pid, NULL, 0); }
    s->pid = 0;
    unlink(s->out);
    unlink(s->log);
}

static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

static unsigned char *b64decode(const char *s, size_t *n) {
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

/* POST one generation; the first image's PNG bytes (malloc'd) or NULL. */
static unsigned char *serve_png(const server *s, const char *body, size_t *n) {
    char bodyf[600], outf[600], cmd[2048];
    snprintf(bodyf, sizeof bodyf, "%s/sp-req.json", tmpdir);
    snprintf(outf, sizeof outf, "%s/sp-req.out", tmpdir);
    FILE *f = fopen(bodyf, "w");
    if (!f) return NULL;
    fputs(body, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "curl -s -m 120 -X POST --data-binary @%s -o %s 'http://127.0.0.1:%d/v1/images/generations'",
             bodyf, outf, s->port);
    unsigned char *png = NULL;
    if (system(cmd) == 0) {
        char *a = t_slurp(outf, NULL);
        json *j = a ? json_parse(a, strlen(a), "answer") : NULL;
        const json *d = j ? json_at(json_get(j, "data"), 0) : NULL;
        const char *b = d ? json_get_str(d, "b64_json") : NULL;
        png = b ? b64decode(b, n) : NULL;
        json_free(j);
        free(a);
    }
    unlink(bodyf);
    unlink(outf);
    return png;
}

/* `ditrun generate` with the request's settings (and extra options) into path: 0 ok. */
static int generate(const char *extra, const char *path) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --backend cpu --threads 1 -q --max-sequence-length 8 "
             "--prompt 'a red fox' --width 40 --height 24 --steps 2 --seed 5 --output %s %s", exe, model, path, extra);
    return system(cmd);
}

/* Run `ditrun serve ARGS` that must fail at once: exit status, stderr into err. */
static int serve_fails(const char *args, char *err, size_t n) {
    char cmd[2048], errf[600];
    snprintf(errf, sizeof errf, "%s/sp-serve-err.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "timeout 60 %s serve --model %s --port 0 %s >/dev/null 2>%s", exe, model, args, errf);
    int st = system(cmd);
    char *e = t_slurp(errf, NULL);
    snprintf(err, n, "%s", e ? e : "");
    free(e);
    unlink(errf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int one_error_line(const char *err, const char *needle) {
    const char *e = strstr(err, "ditrun: error:");
    return e && strstr(e, needle) && !strstr(e + 1, "ditrun: error:");
}

int main(void) {
    const char *b = getenv("BUILD");
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s", tmp);
    snprintf(model, sizeof model, "%s/model", t_fixtures());

    server s;
    if (server_start(&s, "--sequence-parallel 2")) {
        char *l = t_slurp(s.log, NULL);
        T_FAIL("serve --sequence-parallel 2: starts", "%s", l ? l : "(no log)");
        free(l);
    } else {
        size_t n = 0;
        unsigned char *png = serve_png(&s, "{\"prompt\": \"a red fox\", \"size\": \"40x24\", \"steps\": 2, \"seed\": 5}", &n);
        char *log = t_slurp(s.log, NULL);
        T_CHECK("serve --sequence-parallel 2: the worker's DiT runs on 2 thread ranks",
                log && strstr(log, "sequence parallel: 2 ranks (threads)"), "log: %s", log ? log : "");
        free(log);
        char split[600], whole[600], got[600];
        snprintf(split, sizeof split, "%s/sp-gen2.png", tmpdir);
        snprintf(whole, sizeof whole, "%s/sp-gen1.png", tmpdir);
        snprintf(got, sizeof got, "%s/sp-served.png", tmpdir);
        int g2 = generate("--sequence-parallel 2", split), g1 = generate("", whole);
        size_t m = 0;
        char *ref = t_slurp(split, &m);
        T_CHECK("serve --sequence-parallel 2: the PNG is byte-identical to generate --sequence-parallel 2's",
                png && g2 == 0 && ref && m == n && !memcmp(ref, png, n), "%zu bytes served, generate rc %d (%zu bytes)",
                n, g2, m);
        free(ref);
        uint8_t *a = NULL, *c = NULL;
        int wa = 0, ha = 0, wc = 0, hc = 0, px = -1;
        if (png) {
            FILE *f = fopen(got, "wb");
            if (f) { fwrite(png, 1, n, f); fclose(f); }
        }
        if (png && g1 == 0 && dt_png_read(got, &a, &wa, &ha, NULL, NULL) == 0 &&
            dt_png_read(whole, &c, &wc, &hc, NULL, NULL) == 0 && wa == wc && ha == hc) {
            px = 0;
            for (size_t i = 0; i < (size_t)wa * ha * 3; i++) {
                int d = abs((int)a[i] - (int)c[i]);
                if (d > px) px = d;
            }
        }
        T_CHECK("serve --sequence-parallel 2: within one 8-bit step of the unsplit image", px >= 0 && px <= SP_PIXEL_TOL,
                "pixels off by %d (generate rc %d)", px, g1);
        free(a); free(c); free(png);
        unlink(split); unlink(whole); unlink(got);
        server_stop(&s);
    }

    char err[4096];
    int rc = serve_fails("--backend cpu --devices all", err, sizeof err);
    T_CHECK("serve --devices on the cpu backend: one error line, exit 1", rc == 1 && one_error_line(err, "--devices picks GPUs"),
            "exit %d: %s", rc, err);
    rc = serve_fails("--backend cuda --devices 0,x", err, sizeof err);
    T_CHECK("serve --devices with a bad list or no GPU: one error line, exit 1",
            rc == 1 && one_error_line(err, "--devices"), "exit %d: %s", rc, err);
    rc = serve_fails("--backend cpu --sequence-parallel 3", err, sizeof err);
    T_CHECK("serve --sequence-parallel 3 on a 2-head model: the worker's load error, exit 1",
            rc == 1 && strstr(err, "the transformer has 2 attention heads"), "exit %d: %s", rc, err);
    rc = serve_fails("--backend cpu --sequence-parallel 99", err, sizeof err);
    T_CHECK("serve --sequence-parallel 99: out of range, exit 1", rc == 1 && one_error_line(err, "--sequence-parallel"),
            "exit %d: %s", rc, err);
    return T_DONE();
}
