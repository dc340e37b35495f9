/* test_serve.c — `ditrun serve` end to end: real servers of $BUILD/ditrun on ephemeral ports with the bundled
 * tiny model on the CPU, driven by curl. The served PNG is byte-identical to `ditrun generate`'s; stream events
 * come in order; every bad-request class gets its status and a JSON error object; auth off and on; 429 past
 * --max-queue; output_format png / jpeg / webp with output_compression (generations, edits, streams: the format's
 * magic bytes, decodable, the bytes of `ditrun generate -o x.jpg/.webp`; bad values 400); a client that goes away cancels its job and the next request is served, a half-closed one gets its
 * answer; hostile clients: a slowloris (held sockets closed at the request deadline, one client's connections
 * capped, another client answered meanwhile), cross-site bodies (415), a foreign Host (421), ambiguous framing, a
 * NUL in the path, oversized paths and headers (JSON errors); Retry-After tracks how fast the queue drains; SIGTERM
 * finishes the running request and exits 0; 200 requests at concurrency 8 without a failure and with resident
 * memory growing under 10% after the first 20; on a GPU machine, the server on the CUDA backend (skipped without
 * one). */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/backend.h"
#include "image/image.h"
#include "io/json.h"
#include "image/png.h"
#include "serve/queue.h"
#include "serve_helpers.h"
#include "test.h"

/* Resident memory may grow by this fraction from request 20 to request 200: the allocator settles after the first
 * requests of a size (arenas of the connection threads), and a leak of a few KB per request would show past it. */
#define RSS_GROWTH_TOL 0.10
#define LOAD_REQUESTS 200
#define LOAD_WARM 20
#define LOAD_CONCURRENCY 8

/* `ditrun generate` of the same settings into path: 0 ok. */
static int generate(const char *prompt, int w, int h, int steps, long seed, const char *path) {
    char args[1024];
    snprintf(args, sizeof args, "--prompt '%s' --width %d --height %d --steps %d --seed %ld", prompt, w, h, steps, seed);
    return serve_generate(args, path);
}

static int file_equals(const char *path, const unsigned char *data, size_t n) {
    size_t m = 0;
    char *f = t_slurp(path, &m);
    int eq = f && m == n && !memcmp(f, data, n);
    free(f);
    return eq;
}

/* The error object of an answer has message (non-empty), type and param (the expected one, or null). */
static int error_shape(const char *body, const char *param, char *why, size_t nwhy) {
    json *j = body ? json_parse(body, strlen(body), "error answer") : NULL;
    const json *e = j ? json_get(j, "error") : NULL;
    const char *msg = e ? json_get_str(e, "message") : NULL, *type = e ? json_get_str(e, "type") : NULL;
    const json *p = e ? json_get(e, "param") : NULL;
    int ok = msg && msg[0] && type && p;
    if (ok && param) ok = p->type == JSON_STRING && !strcmp(p->str, param);
    if (ok && !param) ok = p->type == JSON_NULL;
    snprintf(why, nwhy, "%.300s", body ? body : "(no body)");
    json_free(j);
    return ok;
}

/* ---- raw sockets: what curl will not do (half-close, trickle, a chosen source address) ---- */

/* A TCP connection to the server from source address src (NULL: the kernel's choice): the socket, or -1. */
static int tcp_connect(const server *s, const char *src) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    if (src && (inet_pton(AF_INET, src, &a.sin_addr) != 1 || bind(fd, (struct sockaddr *)&a, sizeof a))) {
        close(fd);
        return -1;
    }
    a.sin_port = htons((uint16_t)s->port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_str(int fd, const char *p) {
    for (size_t n = strlen(p); n;) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* What the server sends until it closes the connection (or ms pass): malloc'd, NUL-terminated. */
static char *recv_all(int fd, int ms) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    double end = dt_now() + ms / 1e3;
    for (;;) {
        int left = (int)((end - dt_now()) * 1e3);
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        if (n == cap) b = realloc(b, (cap *= 2) + 1);
        ssize_t k = recv(fd, b + n, cap - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    b[n] = 0;
    return b;
}

/* A generation request as raw HTTP/1.1 bytes (into out). */
static void raw_generation(char *out, size_t n, const char *json_body) {
    snprintf(out, n, "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(json_body), json_body);
}

static void test_images(const server *s) {
    char *body = NULL;
    int code = http(s, "POST", "/v1/images/generations",
                    "{\"prompt\": \"a red fox\", \"size\": \"32x24\", \"steps\": 2, \"seed\": 5, \"n\": 2}", NULL, &body,
                    NULL);
    T_CHECK("serve: generation answers 200", code == 200, "status %d: %.200s", code, body ? body : "");
    char ref[600];
    for (int i = 0; i < 2; i++) {
        snprintf(ref, sizeof ref, "%s/ref%d.png", serve_tmp, i);
        int grc = generate("a red fox", 32, 24, 2, 5 + i, ref);
        size_t n = 0;
        unsigned char *png = answer_png(body, i, &n);
        char name[96];
        snprintf(name, sizeof name, "serve: image %d (seed %d) byte-identical to ditrun generate's PNG", i, 5 + i);
        T_CHECK(name, grc == 0 && png && file_equals(ref, png, n), "generate rc %d, %zu bytes served", grc, n);
        if (png && i == 0) {   /* and its pixels and text chunks, read back */
            char got[600];
            snprintf(got, sizeof got, "%s/got.png", serve_tmp);
            spit(got, (const char *)png, n);
            uint8_t *a = NULL, *b = NULL;
            int wa, ha, wb, hb, nt = 0;
            dt_png_text *t = NULL;
            int ok = dt_png_read(got, &a, &wa, &ha, &t, &nt) == 0 && dt_png_read(ref, &b, &wb, &hb, NULL, NULL) == 0 &&
                     wa == 32 && ha == 24 && wb == 32 && hb == 24 && !memcmp(a, b, 32 * 24 * 3);
            const char *seed = dt_png_text_get(t, nt, "seed"), *prompt = dt_png_text_get(t, nt, "prompt");
            T_CHECK("serve: pixels equal generate's, text chunks hold prompt and seed",
                    ok && seed && !strcmp(seed, "5") && prompt && !strcmp(prompt, "a red fox"), "pixels or chunks differ");
            free(a);
            free(b);
            dt_png_text_free(t, nt);
        }
        free(png);
    }
    free(body);
}

static void test_stream(const server *s) {
    char *body = NULL, *hdr = NULL;
    int code = http(s, "POST", "/v1/images/generations",
                    "{\"prompt\": \"a red fox\", \"size\": \"32x24\", \"steps\": 3, \"seed\": 5, \"stream\": true}", "-N",
                    &body, &hdr);
    /* expected: progress 1, 2, 3, then image, then done (after an optional "queued") */
    const char *want[] = {"event: progress", "event: progress", "event: progress", "event: image", "event: done"};
    const char *p = body;
    int ok = code == 200 && hdr && strstr(hdr, "text/event-stream") && p;
    char why[200] = "";
    /* first maybe "queued" (the request reached the queue before the idle worker took it): place 1, none running */
    while (ok && (p = strstr(p, "event: ")) && !strncmp(p, "event: queued\ndata: ", 20)) {
        const char *end = strstr(p, "\n\n");
        json *j = end ? json_parse(p + 20, (size_t)(end - p - 20), "queued event") : NULL;
        if (!j || json_get_int(j, "position", -1) != 1 || json_get_int(j, "running", -1) != 0) {
            ok = 0;
            snprintf(why, sizeof why, "a queued event with position %lld, running %lld (want 1, 0)",
                     j ? (long long)json_get_int(j, "position", -1) : -1, j ? (long long)json_get_int(j, "running", -1) : -1);
        }
        json_free(j);
        p = end;
    }
    for (int k = 0; ok && k < 5; k++) {
        p = strstr(p, "event: ");
        if (!p || strncmp(p, want[k], strlen(want[k]))) { ok = 0; snprintf(why, sizeof why, "event %d is not '%s'", k, want[k]); break; }
        const char *data = strstr(p, "data: ");
        const char *end = data ? strstr(data, "\n\n") : NULL;
        if (!data || !end) { ok = 0; snprintf(why, sizeof why, "event %d has no data line", k); break; }
        json *j = json_parse(data + 6, (size_t)(end - data - 6), "event");
        if (!j) { ok = 0; snprintf(why, sizeof why, "event %d: %s", k, dt_last_error()); break; }
        if (k < 3 && (json_get_int(j, "step", -1) != k + 1 || json_get_int(j, "steps", -1) != 3 ||
                      json_get_num(j, "elapsed", -1) < 0)) {
            ok = 0;
            snprintf(why, sizeof why, "progress event %d: step %lld of %lld", k, (long long)json_get_int(j, "step", -1),
                     (long long)json_get_int(j, "steps", -1));
        }
        if (k == 3) {   /* the streamed image is the one generate writes for seed 5 with 3 steps */
            const char *b = json_get_str(j, "b64_json");
            size_t n = 0;
            unsigned char *png = b ? b64decode(b, &n) : NULL;
            char ref[600];
            snprintf(ref, sizeof ref, "%s/ref-stream.png", serve_tmp);
            if (!png || generate("a red fox", 32, 24, 3, 5, ref) || !file_equals(ref, png, n)) {
                ok = 0;
                snprintf(why, sizeof why, "the streamed image differs from generate's");
            }
            free(png);
        }
        json_free(j);
        p = end;
    }
    T_CHECK("serve: stream events in order (3 progress, image = generate's, done)", ok, "status %d: %s", code, why);
    free(body);
    free(hdr);
}

/* The bytes are in format fmt ("png", "jpeg", "webp") by their magic, and decode to w x h. */
static int is_format(const unsigned char *b, size_t n, const char *fmt, int w, int h) {
    int magic = 0;
    if (!strcmp(fmt, "png")) magic = n > 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8);
    if (!strcmp(fmt, "jpeg")) magic = n > 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
    if (!strcmp(fmt, "webp")) magic = n > 12 && !memcmp(b, "RIFF", 4) && !memcmp(b + 8, "WEBP", 4);
    dt_image im;
    if (!magic || dt_image_decode(b, n, fmt, &im)) return 0;
    int ok = im.w == w && im.h == h && im.channels == 3;
    dt_image_free(&im);
    return ok;
}

/* output_format / output_compression: generations (each format: the answer names it, the bytes are the format's and
 * equal `ditrun generate -o x.EXT --output-compression C`), a stream's image event, an edit (multipart fields). */
static void test_formats(const server *s) {
    static const struct { const char *fmt, *ext; int compression; } fs[] = {
        {"png", "png", -1}, {"jpeg", "jpg", 90}, {"webp", "webp", 80}, {"png", "png", 0}};
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
        char req[300], comp[64] = "", args[300], ref[600], name[200];
        if (fs[k].compression >= 0) snprintf(comp, sizeof comp, ", \"output_compression\": %d", fs[k].compression);
        /* the jpeg request writes its integers as 2.0 and 5e0: JSON numbers of integral value are those integers */
        snprintf(req, sizeof req, "{\"prompt\": \"a red fox\", \"size\": \"32x24\", \"steps\": %s, \"seed\": %s, "
                 "\"output_format\": \"%s\"%s}", k == 1 ? "2.0" : "2", k == 1 ? "5e0" : "5", fs[k].fmt, comp);
        char *body = NULL;
        int code = http(s, "POST", "/v1/images/generations", req, NULL, &body, NULL);
        json *j = body ? json_parse(body, strlen(body), "answer") : NULL;
        const char *said = j ? json_get_str(j, "output_format") : NULL;
        size_t n = 0;
        unsigned char *img = answer_png(body, 0, &n);
        snprintf(ref, sizeof ref, "%s/fmt-ref.%s", serve_tmp, fs[k].ext);
        int k_args = snprintf(args, sizeof args, "--prompt 'a red fox' --width 32 --height 24 --steps 2 --seed 5");
        if (fs[k].compression >= 0)
            snprintf(args + k_args, sizeof args - (size_t)k_args, " --output-compression %d", fs[k].compression);
        int grc = serve_generate(args, ref);
        snprintf(name, sizeof name, "serve formats: output_format %s, output_compression %d: 200, named in the answer, "
                 "%s bytes of 32x24", fs[k].fmt, fs[k].compression, fs[k].fmt);
        T_CHECK(name, code == 200 && said && !strcmp(said, fs[k].fmt) && img && is_format(img, n, fs[k].fmt, 32, 24),
                "status %d, output_format %s, %zu bytes: %.200s", code, said ? said : "(none)", n, body ? body : "");
        snprintf(name, sizeof name, "serve formats: %s (compression %d) the bytes of ditrun generate -o x.%s", fs[k].fmt,
                 fs[k].compression, fs[k].ext);
        T_CHECK(name, grc == 0 && img && file_equals(ref, img, n), "generate rc %d; the files differ", grc);
        json_free(j);
        free(img);
        free(body);
    }
    /* a stream's image event carries the format */
    char *body = NULL;
    int code = http(s, "POST", "/v1/images/generations",
                    "{\"prompt\": \"a red fox\", \"size\": \"32x24\", \"steps\": 2, \"seed\": 5, \"stream\": true, "
                    "\"output_format\": \"jpeg\", \"output_compression\": 70}", "-N", &body, NULL);
    const char *ev = body ? strstr(body, "event: image\ndata: ") : NULL;
    const char *end = ev ? strstr(ev, "\n\n") : NULL;
    json *j = end ? json_parse(ev + 19, (size_t)(end - ev - 19), "image event") : NULL;
    const char *said = j ? json_get_str(j, "output_format") : NULL, *b64 = j ? json_get_str(j, "b64_json") : NULL;
    size_t n = 0;
    unsigned char *img = b64 ? b64decode(b64, &n) : NULL;
    T_CHECK("serve formats: a stream's image event names output_format jpeg and holds a JPEG",
            code == 200 && said && !strcmp(said, "jpeg") && img && is_format(img, n, "jpeg", 32, 24), "status %d: %.200s",
            code, body ? body : "");
    json_free(j);
    free(img);
    free(body);
    /* an edit: the multipart fields */
    char form[1200];
    snprintf(form, sizeof form, "-F 'image[]=@%s/edit/ref0.png' -F 'prompt=a snow leopard' -F seed=5 -F steps=2 "
             "-F output_format=webp -F output_compression=50", t_fixtures());
    code = http(s, "POST", "/v1/images/edits", NULL, form, &body, NULL);
    img = answer_png(body, 0, &n);
    T_CHECK("serve formats: an edit with output_format=webp, output_compression=50 answers a 96x72 WebP",
            code == 200 && body && strstr(body, "\"output_format\": \"webp\"") && img && is_format(img, n, "webp", 96, 72),
            "status %d: %.200s", code, body ? body : "");
    free(img);
    free(body);
    snprintf(form, sizeof form, "-F 'image[]=@%s/edit/ref0.png' -F 'prompt=a snow leopard' -F output_compression=-1",
             t_fixtures());
    code = http(s, "POST", "/v1/images/edits", NULL, form, &body, NULL);
    char why[400];
    T_CHECK("serve formats: an edit with output_compression=-1 -> 400 naming it",
            code == 400 && error_shape(body, "output_compression", why, sizeof why), "status %d: %s", code, body ? body : "");
    free(body);
}

static void test_bad_requests(const server *s) {
    static const struct {
        const char *name, *method, *path, *body;
        int status;
        const char *param;
    } cases[] = {
        {"malformed JSON", "POST", "/v1/images/generations", "{\"prompt\": ", 400, NULL},
        {"not an object", "POST", "/v1/images/generations", "[1, 2]", 400, NULL},
        {"empty body", "POST", "/v1/images/generations", "", 400, NULL},
        {"missing prompt", "POST", "/v1/images/generations", "{\"size\": \"16x16\"}", 400, "prompt"},
        {"prompt of the wrong type", "POST", "/v1/images/generations", "{\"prompt\": 7}", 400, "prompt"},
        {"n of the wrong type", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"n\": \"2\"}", 400, "n"},
        {"size not WxH", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"big\"}", 400, "size"},
        {"size zero", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"0x16\"}", 400, "size"},
        {"size negative", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"-16x16\"}", 400, "size"},
        {"size over --max-pixels", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"4096x4096\"}", 400,
         "size"},
        {"size not a multiple of the model's", "POST", "/v1/images/generations",
         "{\"prompt\": \"x\", \"size\": \"17x16\"}", 400, "size"},
        {"steps 0", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"steps\": 0}", 400, "steps"},
        {"steps over --max-steps", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"steps\": 51}", 400, "steps"},
        {"n 0", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"n\": 0}", 400, "n"},
        {"n 9", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"n\": 9}", 400, "n"},
        {"guidance negative", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"guidance\": -1}", 400, "guidance"},
        {"seed fractional", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"seed\": 1.5}", 400, "seed"},
        {"steps 1e300 (integral, out of range)", "POST", "/v1/images/generations",
         "{\"prompt\": \"x\", \"steps\": 1e300}", 400, "steps"},
        {"seed 1e19 (over int64)", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"seed\": 1e19}", 400, "seed"},
        {"response_format url", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"response_format\": \"url\"}",
         400, "response_format"},
        {"unknown parameter", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"noise_file\": \"/etc/passwd\"}",
         400, "noise_file"},
        {"another model", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"model\": \"/etc/passwd\"}", 400,
         "model"},
        {"output_format gif", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"output_format\": \"gif\"}", 400,
         "output_format"},
        {"output_format not a string", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"output_format\": 1}",
         400, "output_format"},
        {"output_compression 101", "POST", "/v1/images/generations",
         "{\"prompt\": \"x\", \"output_format\": \"jpeg\", \"output_compression\": 101}", 400, "output_compression"},
        {"output_compression -1", "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"output_compression\": -1}",
         400, "output_compression"},
        {"output_compression fractional", "POST", "/v1/images/generations",
         "{\"prompt\": \"x\", \"output_compression\": 50.5}", 400, "output_compression"},
        {"output_compression a string", "POST", "/v1/images/generations",
         "{\"prompt\": \"x\", \"output_compression\": \"high\"}", 400, "output_compression"},
        {"unknown route", "GET", "/v1/nothing", NULL, 404, NULL},
        {"wrong method on a GET route", "POST", "/health", "{}", 405, NULL},
        {"wrong method on a POST route", "GET", "/v1/images/generations", NULL, 405, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *body = NULL, name[128], why[400];
        int code = http(s, cases[i].method, cases[i].path, cases[i].body, NULL, &body, NULL);
        snprintf(name, sizeof name, "serve: %s -> %d with a JSON error", cases[i].name, cases[i].status);
        int shape = error_shape(body, cases[i].param, why, sizeof why);
        T_CHECK(name, code == cases[i].status && shape, "status %d, body %s", code, why);
        free(body);
    }
    /* a body over 1 MiB: 413, by Content-Length and by a chunked upload */
    size_t big = (1u << 20) + 10;
    char *b = malloc(big + 1);
    memset(b, ' ', big);
    memcpy(b, "{\"prompt\": \"x\"}", 15);
    b[big] = 0;
    for (int chunked = 0; chunked < 2; chunked++) {
        char *body = NULL, why[400];
        int code = http(s, "POST", "/v1/images/generations", b, chunked ? "-H 'Transfer-Encoding: chunked'" : NULL, &body,
                        NULL);
        T_CHECK(chunked ? "serve: chunked body over 1 MiB -> 413 with a JSON error"
                        : "serve: body over 1 MiB -> 413 with a JSON error",
                code == 413 && error_shape(body, NULL, why, sizeof why), "status %d, body %s", code, why);
        free(body);
    }
    free(b);
    /* still serving after all that */
    int code = http(s, "GET", "/health", NULL, NULL, NULL, NULL);
    T_CHECK("serve: healthy after the bad requests", code == 200, "status %d", code);
}

/* ---- half-closed clients, and clients that really go away ---- */

static void test_half_close(const server *s) {
    /* the request, then shutdown(SHUT_WR) as `nc -N` does: the answer still comes (after an interim 100, if any) */
    char req[1024];
    raw_generation(req, sizeof req, "{\"prompt\": \"a red fox\", \"size\": \"64x64\", \"steps\": 8, \"seed\": 5}");
    int fd = tcp_connect(s, NULL);
    char *resp = fd >= 0 && !send_str(fd, req) && !shutdown(fd, SHUT_WR) ? recv_all(fd, 60000) : NULL;
    if (fd >= 0) close(fd);
    const char *fin = resp ? strstr(resp, "HTTP/1.1 200") : NULL;
    const char *json = fin ? strstr(fin, "\r\n\r\n") : NULL;
    size_t n = 0;
    unsigned char *png = json ? answer_png(json + 4, 0, &n) : NULL;
    T_CHECK("serve: a half-closed client (request sent, write side shut) gets its 200 and its PNG",
            png && n > 8 && !memcmp(png, "\x89PNG", 4), "%.200s", resp ? resp : "(no answer)");
    free(png);
    free(resp);
    /* the same with an event stream: every event up to done */
    raw_generation(req, sizeof req, "{\"prompt\": \"a red fox\", \"size\": \"64x64\", \"steps\": 8, \"stream\": true}");
    fd = tcp_connect(s, NULL);
    resp = fd >= 0 && !send_str(fd, req) && !shutdown(fd, SHUT_WR) ? recv_all(fd, 60000) : NULL;
    if (fd >= 0) close(fd);
    T_CHECK("serve: a half-closed stream client gets its events up to done",
            resp && strstr(resp, "HTTP/1.1 200") && strstr(resp, "event: image") && strstr(resp, "event: done"),
            "%.200s", resp ? resp : "(no answer)");
    free(resp);
    /* an HTTP/1.0 client, which must not get an interim 1xx, half-closed: its answer without a probe */
    static const char b10[] = "{\"prompt\": \"a red fox\", \"size\": \"64x64\", \"steps\": 8}";
    snprintf(req, sizeof req, "POST /v1/images/generations HTTP/1.0\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s", strlen(b10), b10);
    fd = tcp_connect(s, NULL);
    resp = fd >= 0 && !send_str(fd, req) && !shutdown(fd, SHUT_WR) ? recv_all(fd, 60000) : NULL;
    if (fd >= 0) close(fd);
    json = resp ? strstr(resp, "\r\n\r\n") : NULL;
    png = json ? answer_png(json + 4, 0, &n) : NULL;
    T_CHECK("serve: a half-closed HTTP/1.0 client gets its 200 and PNG, and no interim 100",
            resp && !strncmp(resp, "HTTP/1.", 7) && !strncmp(resp + 8, " 200", 4) && png && n > 8,
            "%.200s", resp ? resp : "(no answer)");
    free(png);
    free(resp);
    /* a client that closes its socket while its (not streamed) job runs still cancels it */
    double c0 = metric(s, "ditrun_jobs_cancelled_total"), images0 = metric(s, "ditrun_images_total");
    raw_generation(req, sizeof req, "{\"prompt\": \"gone\", \"size\": \"128x128\", \"steps\": 40}");
    fd = tcp_connect(s, NULL);
    int sent = fd >= 0 && !send_str(fd, req);
    int running = sent && wait_metric(s, "ditrun_jobs_running", 1, 20000);
    if (fd >= 0) close(fd);
    int cancelled = wait_metric(s, "ditrun_jobs_cancelled_total", c0 + 1, 20000);
    T_CHECK("serve: a client that closes its socket (no stream) cancels its running job",
            running && cancelled && metric(s, "ditrun_images_total") == images0, "sent %d, running %d, cancelled %d",
            sent, running, cancelled);
}

/* ---- requests a hostile page or client sends ---- */

#define MAX_URL_BYTES (8 << 10)         /* the server's limits (http.c): a longer path is 414 */
#define MAX_HEADER_BYTES (32 << 10)     /* more header bytes: 431 */

static void test_hostile_requests(const server *s) {
    const char *gen = "{\"prompt\": \"x\", \"size\": \"16x16\", \"steps\": 1}";
    char hdrf[600], big_path[MAX_URL_BYTES + 64], host_port[160], foreign[160];
    snprintf(hdrf, sizeof hdrf, "%s/big-header.txt", serve_tmp);
    FILE *f = fopen(hdrf, "w");
    if (f) {   /* one header line over the limit */
        fputs("X-Padding: ", f);
        for (int i = 0; i < MAX_HEADER_BYTES + 100; i++) fputc('a', f);
        fputc('\n', f);
        fclose(f);
    }
    snprintf(big_path, sizeof big_path, "/v1/");
    memset(big_path + 4, 'a', MAX_URL_BYTES);
    big_path[4 + MAX_URL_BYTES] = 0;
    char big_hdr[700];
    snprintf(big_hdr, sizeof big_hdr, "-H @%s", hdrf);
    snprintf(host_port, sizeof host_port, "-H 'Host: rebind.evil.example:%d'", s->port);
    snprintf(foreign, sizeof foreign, "-H 'Host: evil.example'");
    char gen_lengths[100];
    snprintf(gen_lengths, sizeof gen_lengths, "-H 'Content-Length: %zu' -H 'Content-Length: 7'", strlen(gen));
    const struct {
        const char *name, *method, *path, *body, *extra;
        int status;
    } cases[] = {
        {"a cross-site text/plain POST", "POST", "/v1/images/generations", gen,
         "-H 'Content-Type: text/plain' -H 'Origin: http://evil.example'", 415},
        {"a form-urlencoded POST (curl -d's default)", "POST", "/v1/images/generations", gen,
         "-H 'Content-Type: application/x-www-form-urlencoded'", 415},
        {"a POST without Content-Type", "POST", "/v1/images/generations", gen, "-H 'Content-Type:'", 415},
        {"a text/plain edit", "POST", "/v1/images/edits", "prompt=x", "-H 'Content-Type: text/plain'", 415},
        {"a cross-site multipart edit (a form on another site)", "POST", "/v1/images/edits", NULL,
         "-F prompt=x -H 'Origin: http://evil.example'", 403},
        {"a foreign Host", "GET", "/v1/models", NULL, foreign, 421},
        {"a rebound name with this port", "POST", "/v1/images/generations", gen, host_port, 421},
        {"Content-Length headers that differ (the first one the whole body)", "POST", "/v1/images/generations", gen,
         gen_lengths, 400},
        {"Content-Length with Transfer-Encoding", "POST", "/v1/images/generations", gen,
         "-H 'Transfer-Encoding: chunked' -H 'Content-Length: 40'", 400},
        {"a NUL in the path", "GET", "/health%00.html", NULL, NULL, 400},
        {"a NUL in a /v1 path", "GET", "/v1/models%00/x", NULL, NULL, 400},
        {"headers over 32 KiB", "GET", "/health", NULL, big_hdr, 431},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *body = NULL, name[160], why[400];
        int code = http(s, cases[i].method, cases[i].path, cases[i].body, cases[i].extra, &body, NULL);
        snprintf(name, sizeof name, "serve: %s -> %d with a JSON error", cases[i].name, cases[i].status);
        int shape = error_shape(body, NULL, why, sizeof why);
        T_CHECK(name, code == cases[i].status && shape, "status %d, body %s", code, why);
        free(body);
    }
    unlink(hdrf);
    /* a path over 8 KiB (longer than a curl command line here): raw */
    char *req = malloc(sizeof big_path + 128);
    sprintf(req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", big_path);
    int fd = tcp_connect(s, NULL);
    char *resp = fd >= 0 && !send_str(fd, req) ? recv_all(fd, 20000) : NULL, why[400];
    if (fd >= 0) close(fd);
    const char *json = resp ? strstr(resp, "\r\n\r\n") : NULL;
    T_CHECK("serve: a path over 8 KiB -> 414 with a JSON error",
            resp && !strncmp(resp, "HTTP/1.1 414", 12) && json && error_shape(json + 4, NULL, why, sizeof why),
            "%.200s", resp ? resp : "(no answer)");
    free(resp);
    free(req);
    /* what a legitimate client sends passes */
    int c1 = http(s, "POST", "/v1/images/generations", gen, "-H 'Content-Type: application/json; charset=utf-8'", NULL,
                  NULL);
    char lh[160], v6[160];
    snprintf(lh, sizeof lh, "-H 'Host: localhost:%d'", s->port);
    snprintf(v6, sizeof v6, "-H 'Host: [::1]:%d'", s->port);
    int c2 = http(s, "GET", "/v1/models", NULL, lh, NULL, NULL), c3 = http(s, "GET", "/v1/models", NULL, v6, NULL, NULL);
    char own[160];
    snprintf(own, sizeof own, "-H 'Origin: http://127.0.0.1:%d'", s->port);
    int c4 = http(s, "POST", "/v1/images/generations", gen, own, NULL, NULL);
    snprintf(own, sizeof own, "-H 'Origin: https://127.0.0.1:%d'", s->port);   /* the page behind a TLS proxy */
    int c5 = http(s, "POST", "/v1/images/generations", gen, own, NULL, NULL);
    T_CHECK("serve: JSON with a charset, Host localhost:PORT and [::1]:PORT, the page's own Origin (http, https) -> 200",
            c1 == 200 && c2 == 200 && c3 == 200 && c4 == 200 && c5 == 200, "status %d, %d, %d, %d, %d", c1, c2, c3, c4,
            c5);
}

/* ---- POST /v1/images/edits ---- */

/* `ditrun generate` with editing arguments (args) into path: 0 ok. */
static int generate_edit(const char *prompt, const char *args, const char *path) {
    char all[4096];
    snprintf(all, sizeof all, "--prompt '%s' %s", prompt, args);
    return serve_generate(all, path);
}

/* An edit request (curl -F args) whose first image must equal `ditrun generate` with cli_args, pixel for pixel (and
 * byte for byte: the same PNG text chunks). */
static void edit_equals_generate(const server *s, const char *name, const char *form, const char *cli_args, int ew,
                                 int eh) {
    char *body = NULL, ref[600], got[600], nm[200];
    int code = http(s, "POST", "/v1/images/edits", NULL, form, &body, NULL);
    size_t n = 0;
    unsigned char *png = answer_png(body, 0, &n);
    snprintf(ref, sizeof ref, "%s/edit-ref.png", serve_tmp);
    snprintf(got, sizeof got, "%s/edit-got.png", serve_tmp);
    unlink(ref);
    if (png) spit(got, (const char *)png, n);
    int grc = generate_edit("a snow leopard", cli_args, ref);
    uint8_t *a = NULL, *b = NULL;
    int wa = 0, ha = 0, wb = 0, hb = 0;
    int ok = code == 200 && png && grc == 0 && dt_png_read(got, &a, &wa, &ha, NULL, NULL) == 0 &&
             dt_png_read(ref, &b, &wb, &hb, NULL, NULL) == 0;
    snprintf(nm, sizeof nm, "serve edits: %s: %dx%d, the pixels of generate's", name, ew, eh);
    T_CHECK(nm, ok && wa == ew && ha == eh && wb == ew && hb == eh && !memcmp(a, b, (size_t)ew * eh * 3),
            "status %d, generate %d, %dx%d vs %dx%d: %.200s", code, grc, wa, ha, wb, hb, ok ? "pixels differ" : body);
    snprintf(nm, sizeof nm, "serve edits: %s: the PNG bytes of generate's", name);
    T_CHECK(nm, ok && file_equals(ref, png, n), "the PNGs differ");
    free(a);
    free(b);
    free(png);
    free(body);
}

/* A small RGB image file of w x h (a gradient). */
static void write_png(const char *path, int w, int h) {
    uint8_t *rgb = malloc((size_t)w * h * 3), *png = NULL;
    for (int i = 0; i < w * h * 3; i++) rgb[i] = (uint8_t)(i * 7);
    size_t n = 0;
    if (dt_png_encode(rgb, w, h, NULL, 0, &png, &n) == 0) spit(path, (const char *)png, n);
    free(rgb);
    free(png);
}

static void test_edits(const server *s) {
    char fx[600], form[2048], args[2048];
    snprintf(fx, sizeof fx, "%s/edit", t_fixtures());
    /* one reference: the output takes its prepared size (100x77 -> 96x72) */
    snprintf(form, sizeof form, "-F 'image[]=@%s/ref0.png' -F 'prompt=a snow leopard' -F seed=5 -F steps=2", fx);
    snprintf(args, sizeof args, "--image %s/ref0.png --seed 5 --steps 2", fx);
    edit_equals_generate(s, "one reference", form, args, 96, 72);
    /* two references in order (RGB, RGBA), a size of our choice, 'image' as the field name */
    snprintf(form, sizeof form, "-F 'image=@%s/ref0.png' -F 'image=@%s/ref1.png' -F 'prompt=a snow leopard' -F seed=7 "
             "-F steps=2 -F size=64x48", fx, fx);
    snprintf(args, sizeof args, "--image %s/ref0.png --image %s/ref1.png --seed 7 --steps 2 --width 64 --height 48", fx, fx);
    edit_equals_generate(s, "two references at 64x48", form, args, 64, 48);
    /* inpainting: the first image with the mask (white = repaint), the init image's size; its integers written as
     * 3e0 and 4.0 (a field of integral value is that integer) */
    snprintf(form, sizeof form, "-F 'image[]=@%s/ref9.png' -F 'mask=@%s/mask.png' -F 'prompt=a snow leopard' -F seed=3e0 "
             "-F steps=4.0 -F strength=0.6", fx, fx);
    snprintf(args, sizeof args, "--init-image %s/ref9.png --mask %s/mask.png --strength 0.6 --seed 3 --steps 4", fx, fx);
    edit_equals_generate(s, "inpainting", form, args, 72, 64);

    /* refused: 400 with the API's error object naming the parameter */
    char small[600], wide[600], big[600];
    snprintf(small, sizeof small, "%s/side63.png", serve_tmp);
    snprintf(wide, sizeof wide, "%s/aspect9.png", serve_tmp);
    snprintf(big, sizeof big, "%s/big.bin", serve_tmp);
    write_png(small, 63, 80);
    write_png(wide, 9 * 64 + 8, 64);
    static const struct { const char *name, *form; const char *param; } bad[] = {
        {"truncated PNG", "-F 'image[]=@tests/images/bad_truncated_rgb_png.png'", "image"},
        {"truncated JPEG", "-F 'image[]=@tests/images/bad_truncated_rgb420_jpg.jpg'", "image"},
        {"truncated WebP", "-F 'image[]=@tests/images/bad_truncated_lossy_webp.webp'", "image"},
        {"16-bit PNG", "-F 'image[]=@tests/images/bad_rgb16.png'", "image"},
        {"CMYK JPEG", "-F 'image[]=@tests/images/bad_cmyk.jpg'", "image"},
        {"not an image", "-F 'image[]=@tests/images/bad_not_image.png'", "image"},
        {"a 63-pixel side", "-F 'image[]=@SMALL'", "image"},
        {"aspect ratio over 8", "-F 'image[]=@WIDE'", "image"},
        {"a mask of another size", "-F 'image[]=@FX/ref9.png' -F 'mask=@FX/ref0.png'", "mask"},
        {"strength without a mask", "-F 'image[]=@FX/ref0.png' -F strength=0.5", "strength"},
        {"strength 0", "-F 'image[]=@FX/ref9.png' -F 'mask=@FX/mask.png' -F strength=0", "strength"},
        {"strength 1.5", "-F 'image[]=@FX/ref9.png' -F 'mask=@FX/mask.png' -F strength=1.5", "strength"},
        {"no image", "", "image"},
        {"an empty image", "-F 'image[]=@/dev/null;filename=empty.png'", "image"},
        {"n not a number", "-F 'image[]=@FX/ref0.png' -F n=two", "n"},
        {"n a fraction", "-F 'image[]=@FX/ref0.png' -F n=2.5", "n"},
        {"size not WxH", "-F 'image[]=@FX/ref0.png' -F size=big", "size"},
        {"unknown parameter", "-F 'image[]=@FX/ref0.png' -F noise_file=/etc/passwd", "noise_file"},
        {"prompt given twice", "-F 'image[]=@FX/ref0.png' -F prompt=y", "prompt"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char f[1024], nm[160], why[400], *body = NULL;
        size_t o = 0;
        for (const char *p = bad[i].form; *p && o < sizeof f - 700;) {   /* SMALL, WIDE, FX placeholders */
            if (!strncmp(p, "SMALL", 5)) { o += (size_t)snprintf(f + o, sizeof f - o, "%s", small); p += 5; }
            else if (!strncmp(p, "WIDE", 4)) { o += (size_t)snprintf(f + o, sizeof f - o, "%s", wide); p += 4; }
            else if (!strncmp(p, "FX", 2)) { o += (size_t)snprintf(f + o, sizeof f - o, "%s", fx); p += 2; }
            else f[o++] = *p++;
        }
        f[o] = 0;
        snprintf(form, sizeof form, "%s -F 'prompt=x' -F steps=1", f);
        int code = http(s, "POST", "/v1/images/edits", NULL, form, &body, NULL);
        snprintf(nm, sizeof nm, "serve edits: %s -> 400 naming '%s'", bad[i].name, bad[i].param);
        T_CHECK(nm, code == 400 && error_shape(body, bad[i].param, why, sizeof why), "status %d, body %s", code, why);
        free(body);
    }
    /* not a form: 415; a JSON body is not an edit request */
    char *body = NULL, why[400];
    int code = http(s, "POST", "/v1/images/edits", "{\"prompt\": \"x\"}", "-H 'Content-Type: application/json'", &body,
                    NULL);
    T_CHECK("serve edits: a JSON body -> 415 with a JSON error", code == 415 && error_shape(body, NULL, why, sizeof why),
            "status %d, body %s", code, why);
    free(body);
    /* a multipart body cut short (no closing boundary): 400 */
    const char *cut = "--XyZ\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nx\r\n--XyZ\r\nContent-Disposition: "
                      "form-data; name=\"image[]\"; filename=\"a.png\"\r\n\r\n\x89PNG";
    code = http(s, "POST", "/v1/images/edits", cut, "-H 'Content-Type: multipart/form-data; boundary=XyZ'", &body, NULL);
    T_CHECK("serve edits: a multipart body cut short -> 400 with a JSON error",
            code == 400 && error_shape(body, NULL, why, sizeof why),
            "status %d, body %s", code, why);
    free(body);
    /* over 32 MiB: 413 before the body is read */
    FILE *bf = fopen(big, "wb");
    if (bf) {
        if (ftruncate(fileno(bf), (32 << 20) + 4096)) {}
        fclose(bf);
    }
    snprintf(form, sizeof form, "-F 'image[]=@%s' -F prompt=x", big);
    code = http(s, "POST", "/v1/images/edits", NULL, form, &body, NULL);
    T_CHECK("serve edits: a body over 32 MiB -> 413 with a JSON error", code == 413 && error_shape(body, NULL, why, sizeof why),
            "status %d, body %s", code, why);
    free(body);
    unlink(big);
    code = http(s, "GET", "/health", NULL, NULL, NULL, NULL);
    T_CHECK("serve edits: healthy after the bad requests", code == 200, "status %d", code);
}

static void test_auth(void) {
    char keyf[600];
    snprintf(keyf, sizeof keyf, "%s/key.txt", serve_tmp);
    spit(keyf, "s3cret-key\n", 11);
    char extra[800];
    snprintf(extra, sizeof extra, "--api-key-file %s --allow-host Box.example --allow-host other.example", keyf);
    server s;
    if (server_start(&s, "auth", extra) || server_ready(&s)) { T_FAIL("serve: start with --api-key-file", "see %s", s.log); return; }
    char *body = NULL, why[400];
    int c1 = http(&s, "GET", "/v1/models", NULL, NULL, &body, NULL);
    T_CHECK("serve: auth on, no key -> 401 with a JSON error", c1 == 401 && error_shape(body, NULL, why, sizeof why),
            "status %d %s", c1, why);
    free(body);
    int c2 = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"16x16\", \"steps\": 1}",
                  "-H 'Authorization: Bearer s3cret-kez'", NULL, NULL);
    int c3 = http(&s, "GET", "/v1/models", NULL, "-H 'Authorization: Bearer s3cret-key-and-more'", NULL, NULL);
    T_CHECK("serve: auth on, wrong key -> 401", c2 == 401 && c3 == 401, "status %d, %d", c2, c3);
    int c4 = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"16x16\", \"steps\": 1}",
                  "-H 'Authorization: Bearer s3cret-key'", NULL, NULL);
    int c5 = http(&s, "GET", "/health", NULL, NULL, NULL, NULL);
    T_CHECK("serve: auth on, right key -> 200; /health open", c4 == 200 && c5 == 200, "status %d, %d", c4, c5);
    char *hdr = NULL;
    http(&s, "GET", "/v1/models", NULL, "-H 'Authorization: Bearer s3cret-key' -H 'Origin: http://evil.example'", NULL,
         &hdr);
    T_CHECK("serve: no CORS headers without --cors", hdr && !strcasestr(hdr, "Access-Control-Allow-Origin"), "%s",
            hdr ? hdr : "");
    free(hdr);
    char h1[160], h2[160];
    snprintf(h1, sizeof h1, "-H 'Host: box.example:%d'", s.port);
    snprintf(h2, sizeof h2, "-H 'Host: box.example.evil.example:%d'", s.port);
    int a1 = http(&s, "GET", "/health", NULL, h1, NULL, NULL), a2 = http(&s, "GET", "/health", NULL, h2, NULL, NULL);
    T_CHECK("serve: --allow-host NAME: Host NAME:PORT -> 200 (any case), another name -> 421", a1 == 200 && a2 == 421,
            "status %d, %d", a1, a2);
    T_CHECK("serve: auth server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

/* Start a slow streaming request in the background (curl, its pid). */
static pid_t slow_request(const server *s, int steps) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec curl -s -N -o /dev/null -X POST -H 'Content-Type: application/json' --data-binary '{\"prompt\": \"slow\", \"size\": "
             "\"128x128\", \"steps\": %d, \"stream\": true}' http://127.0.0.1:%d/v1/images/generations", steps, s->port);
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return p;
}

static void test_queue_and_cancel(void) {
    server s;
    if (server_start(&s, "queue", "--max-queue 1 --cors http://page.example") || server_ready(&s)) {
        T_FAIL("serve: start with --max-queue 1", "see %s", s.log);
        return;
    }
    pid_t a = slow_request(&s, 40);
    int running = wait_metric(&s, "ditrun_jobs_running", 1, 20000);
    pid_t b = slow_request(&s, 40);
    int queued = wait_metric(&s, "ditrun_queue_depth", 1, 20000);
    char *body = NULL, *hdr = NULL, why[400];
    int code = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"16x16\", \"steps\": 1}", NULL,
                    &body, &hdr);
    T_CHECK("serve: past --max-queue -> 429 with Retry-After and a JSON error",
            running && queued && code == 429 && hdr && strcasestr(hdr, "Retry-After:") &&
                error_shape(body, NULL, why, sizeof why),
            "running %d queued %d, status %d %s", running, queued, code, why);
    T_CHECK("serve: --cors sends Access-Control-Allow-Origin", hdr && strstr(hdr, "http://page.example"), "%s",
            hdr ? hdr : "");
    free(body);
    free(hdr);
    /* the client of the running job goes away: its job stops between steps, the queued one runs */
    double images0 = metric(&s, "ditrun_images_total");
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    int cancelled = wait_metric(&s, "ditrun_jobs_cancelled_total", 1, 20000);
    int next_runs = wait_metric(&s, "ditrun_jobs_running", 1, 20000) && metric(&s, "ditrun_queue_depth") == 0;
    T_CHECK("serve: a client that disconnects cancels its running job", cancelled &&
                metric(&s, "ditrun_images_total") == images0, "cancelled %d, images %g -> %g", cancelled, images0,
            metric(&s, "ditrun_images_total"));
    /* the queued job's client goes away as well, then a new request is served */
    kill(b, SIGKILL);
    waitpid(b, NULL, 0);
    int cancelled2 = wait_metric(&s, "ditrun_jobs_cancelled_total", 2, 20000);
    code = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"16x16\", \"steps\": 1}", NULL,
                NULL, NULL);
    T_CHECK("serve: after the cancellations the next request is served", next_runs && cancelled2 && code == 200,
            "next ran %d, second cancel %d, status %d", next_runs, cancelled2, code);
    T_CHECK("serve: queue server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

/* ---- A request becomes the engine's job once, without a server: resolved when checked, and still pointing at its
 * own images after moving into a queue job ---- */
static void test_request_job(void) {
    dt_api_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.model_id = "model";
    lim.info.editing = 1;
    lim.info.size_multiple = 16;
    lim.info.max_side = 4096;
    lim.info.default_steps = 4;
    lim.info.default_guidance = 2.5f;
    lim.max_pixels = 1 << 20;
    lim.max_steps = 50;
    uint8_t *rgb = malloc(100 * 77 * 3), *png = NULL;
    for (int i = 0; i < 100 * 77 * 3; i++) rgb[i] = (uint8_t)(i * 7);
    size_t n = 0;
    dt_png_encode(rgb, 100, 77, NULL, 0, &png, &n);
    free(rgb);
    dt_api_form f;
    dt_api_form_init(&f);
    dt_api_error e;
    int rc = dt_api_form_add(&f, "image[]", "ref.png", (const char *)png, 0, n, &e);
    if (rc == 0) rc = dt_api_form_add(&f, "prompt", NULL, "a snow leopard", 0, 14, &e);
    if (rc == 0) rc = dt_api_form_add(&f, "seed", NULL, "9", 0, 1, &e);
    free(png);
    dt_api_request r;
    if (rc == 0) rc = dt_api_parse_edit(&f, &lim, 42, &r, &e);
    dt_api_form_free(&f);
    if (rc) { T_FAIL("serve: an edit request's job", "parse: %s", e.message); return; }
    /* the model's defaults filled in once (the client gave neither steps nor guidance), size "auto" left to the engine */
    const int resolved = r.steps == 0 && r.guidance < 0 && r.gen.steps == 4 && r.gen.guidance == 2.5f &&
                         r.gen.max_seq_len == 512 && r.gen.width == 0 && r.gen.height == 0;
    dt_job *j = dt_job_new(&r);
    const dt_gen_params g2 = dt_api_image_job(&j->req, 2);
    T_CHECK("serve: an edit request's job is resolved when checked and follows the request into its queue job",
            resolved && j->req.gen.refs == j->req.refs && j->req.gen.n_refs == 1 && j->req.gen.ref_names[0] ==
                j->req.ref_names[0] && j->req.gen.prompt == j->req.prompt && !j->req.gen.init_image &&
                g2.seed == 11 && g2.refs == j->req.refs && g2.steps == 4,
            "resolved %d, refs %p vs %p, seed %llu, steps %d", resolved, (const void *)j->req.gen.refs,
            (const void *)j->req.refs, (unsigned long long)g2.seed, g2.steps);
    dt_job_unref(j);
}

/* ---- Retry-After from the queue's history, without a server: jobs of known cost ---- */

/* A job of n images w x h with steps steps, its cost set as http.c sets it, in state st. */
static dt_job *cost_job(int n, int w, int h, int steps, dt_job_state st) {
    dt_api_request req;
    memset(&req, 0, sizeof req);
    req.n = n;
    req.width = w;
    req.height = h;
    req.steps = steps;
    dt_job *j = dt_job_new(&req);
    j->cost_steps = (double)n * steps;
    j->cost_pixel_steps = j->cost_steps * w * h;
    j->state = st;
    return j;
}

/* A worker that took job j and is through with it after s seconds (j freed). */
static void finish(dt_queue *q, dt_job *j, double s) {
    dt_queue_push(q, j);
    dt_job *got = NULL;
    if (dt_queue_pop(q, &got, 1) == 1) {
        dt_queue_job_done(q, got, s);
        dt_job_unref(got);
    }
    dt_job_unref(j);
}

static void test_retry_estimate(void) {
    /* jobs that take 0.02 s per step plus 2e-6 s per pixel-step, of three shapes, and one cancelled after 300 s */
    const double a = 0.02, b = 2e-6;
    dt_queue q;
    dt_queue_init(&q, 8);
    static const int shapes[][3] = {{64, 64, 4}, {256, 256, 12}, {128, 64, 30}};
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 3; k++) {
            dt_job *j = cost_job(1, shapes[k][0], shapes[k][1], shapes[k][2], DT_JOB_DONE);
            finish(&q, j, a * j->cost_steps + b * j->cost_pixel_steps);
        }
    finish(&q, cost_job(1, 1024, 1024, 50, DT_JOB_CANCELLED), 300);
    /* waiting: two 512x512 images of 20 steps (21.77 s) and one 64x64 of 4 (0.11 s): 21.9 s, 22 in whole seconds */
    dt_job *w1 = cost_job(2, 512, 512, 20, DT_JOB_QUEUED), *w2 = cost_job(1, 64, 64, 4, DT_JOB_QUEUED);
    dt_queue_push(&q, w1);
    dt_queue_push(&q, w2);
    double want = a * (w1->cost_steps + w2->cost_steps) + b * (w1->cost_pixel_steps + w2->cost_pixel_steps);
    int one = dt_queue_retry_after(&q, 1), two = dt_queue_retry_after(&q, 2);
    char name[200];
    snprintf(name, sizeof name, "serve: Retry-After from the fitted cost of the waiting jobs: %d s (exact %.2f s), "
             "%d s over 2 workers; a cancelled 300 s job left out", one, want, two);
    T_CHECK(name, one == (int)ceil(want) && two == (int)ceil(want / 2), "got %d and %d", one, two);
    dt_queue_close(&q);
    dt_job_unref(w1);
    dt_job_unref(w2);
    dt_queue_destroy(&q);
}

/* The slowloris server: requests must be complete within SLOW_TIMEOUT_S, SLOW_PER_CLIENT connections per address;
 * the attacker opens more sockets than the server's 256 connections and trickles a header line (or a body byte)
 * into each every SLOW_TICK_MS, far faster than libmicrohttpd's inactivity timeout. */
#define SLOW_TIMEOUT_S 2
#define SLOW_PER_CLIENT 4
#define SLOW_SOCKETS 260
#define SLOW_TICK_MS 200
/* A held connection closes within one sweep (0.1 s) past the deadline; the rest is scheduling on a loaded machine. */
#define SLOW_SLACK_S 1.5
/* the attacker's address, one no earlier request came from: the readiness probe's connection (from 127.0.0.1) may
 * still count against its address's quota while libmicrohttpd cleans it up (seen once on a loaded GPU machine: 3 of
 * the 4 held) */
#define SLOW_ATTACKER "127.0.0.3"

static void test_slowloris(void) {
    server s;
    char extra[128];
    snprintf(extra, sizeof extra, "--request-timeout %d --max-client-connections %d", SLOW_TIMEOUT_S, SLOW_PER_CLIENT);
    if (server_start(&s, "slowloris", extra) || server_ready(&s)) {
        T_FAIL("serve: start (slowloris)", "see %s", s.log);
        return;
    }
    static int fd[SLOW_SOCKETS];
    static double closed[SLOW_SOCKETS];   /* seconds after the start when the server closed it; 0 open */
    double t0 = dt_now();
    for (int i = 0; i < SLOW_SOCKETS; i++) {
        fd[i] = tcp_connect(&s, SLOW_ATTACKER);
        closed[i] = 0;
        /* the first one finishes its headers and trickles a body; the others never finish their headers */
        const char *start = i == 0 ? "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                     "application/json\r\nContent-Length: 100000\r\n\r\n{"
                                   : "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n";
        if (fd[i] < 0 || send_str(fd[i], start)) closed[i] = dt_now() - t0;
    }
    /* while they are held, another client (another address) is answered */
    double t1 = dt_now();
    int h = http(&s, "GET", "/health", NULL, "--interface 127.0.0.2", NULL, NULL);
    int g = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"16x16\", \"steps\": 1}",
                 "--interface 127.0.0.2", NULL, NULL);
    double t_other = dt_now() - t1;
    for (int open = 1; open && dt_now() - t0 < SLOW_TIMEOUT_S + SLOW_SLACK_S + 1;) {
        open = 0;
        for (int i = 0; i < SLOW_SOCKETS; i++) {
            if (closed[i]) continue;
            const char *more = i == 0 ? " " : "X-Slow: 1\r\n";
            char b[64];
            ssize_t k = send(fd[i], more, strlen(more), MSG_NOSIGNAL | MSG_DONTWAIT);
            ssize_t r = k < 0 ? 0 : recv(fd[i], b, sizeof b, MSG_DONTWAIT);
            if (k < 0 || r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closed[i] = dt_now() - t0;
            else open++;
        }
        sleep_ms(SLOW_TICK_MS);
    }
    int at_once = 0, held = 0, still = 0;
    double first_held = 1e9, last_held = 0;
    for (int i = 0; i < SLOW_SOCKETS; i++) {
        if (!closed[i]) still++;
        else if (closed[i] < SLOW_TIMEOUT_S * 0.75) at_once++;
        else {
            held++;
            if (closed[i] < first_held) first_held = closed[i];
            if (closed[i] > last_held) last_held = closed[i];
        }
        if (fd[i] >= 0) close(fd[i]);
    }
    T_CHECK("serve: while a slowloris holds its sockets, another client's /health and generation -> 200",
            h == 200 && g == 200, "status %d, %d after %.2f s", h, g, t_other);
    char name[200];
    snprintf(name, sizeof name, "serve: slowloris: %d of %d connections held (--max-client-connections %d), the rest "
             "closed at once", held + still, SLOW_SOCKETS, SLOW_PER_CLIENT);
    T_CHECK(name, held + still == SLOW_PER_CLIENT && at_once == SLOW_SOCKETS - SLOW_PER_CLIENT, "%d closed at once",
            at_once);
    snprintf(name, sizeof name, "serve: slowloris: held connections closed %.2f..%.2f s after they opened "
             "(--request-timeout %d, + %.1f s) though they trickle bytes", held ? first_held : 0, last_held,
             SLOW_TIMEOUT_S, SLOW_SLACK_S);
    T_CHECK(name, still == 0 && held == SLOW_PER_CLIENT && first_held >= SLOW_TIMEOUT_S - 0.1 &&
                      last_held <= SLOW_TIMEOUT_S + SLOW_SLACK_S, "%d still open", still);
    /* gone: the attacker's address is served again, and the closings were counted */
    int code = 0;
    for (int i = 0; i < 20 && code != 200; i++) {   /* (libmicrohttpd forgets closed connections in its own time) */
        code = http(&s, "GET", "/health", NULL, "--interface " SLOW_ATTACKER, NULL, NULL);
        if (code != 200) sleep_ms(100);
    }
    double timeouts = metric(&s, "ditrun_request_timeouts_total");
    T_CHECK("serve: after the slowloris its address is served and /metrics counts the timeouts",
            code == 200 && timeouts == SLOW_PER_CLIENT, "status %d, %g timeouts", code, timeouts);
    T_CHECK("serve: slowloris server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

/* A generation request in the background (curl, its pid); its answer is dropped. */
static pid_t background_request(const server *s, const char *json_body) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec curl -s -o /dev/null -X POST -H 'Content-Type: application/json' --data-binary '%s' "
             "http://127.0.0.1:%d/v1/images/generations", json_body, s->port);
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return p;
}

/* Retry-After is whole seconds, at least 1, and estimates the rest of a running job: one second of slack over the
 * drain time measured. */
#define RETRY_SLACK_S 1

static void test_retry_after(void) {
    server s;
    if (server_start(&s, "retry", "--max-queue 1") || server_ready(&s)) {
        T_FAIL("serve: start (retry)", "see %s", s.log);
        return;
    }
    /* history: a big job (seconds), a big one cancelled after a second, two small ones (a tenth of a second) */
    int big = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"big\", \"size\": \"256x256\", \"steps\": 12}",
                   NULL, NULL, NULL);
    pid_t c = slow_request(&s, 100);   /* --max-steps: several seconds, far longer than the second it runs before its client goes */
    int ran = wait_metric(&s, "ditrun_jobs_running", 1, 20000);
    sleep_ms(1000);
    kill(c, SIGKILL);
    waitpid(c, NULL, 0);
    int cancelled = wait_metric(&s, "ditrun_jobs_cancelled_total", 1, 20000);
    int s1 = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"a\", \"size\": \"32x32\", \"steps\": 4}",
                  NULL, NULL, NULL);
    int s2 = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"b\", \"size\": \"64x32\", \"steps\": 6}",
                  NULL, NULL, NULL);
    /* a small job running (about a second), one queued: the next request gets 429, and the queue then drains */
    pid_t x = background_request(&s, "{\"prompt\": \"x\", \"size\": \"64x64\", \"steps\": 40}");
    int running = wait_metric(&s, "ditrun_jobs_running", 1, 20000);
    pid_t y = background_request(&s, "{\"prompt\": \"y\", \"size\": \"32x32\", \"steps\": 8}");
    int queued = wait_metric(&s, "ditrun_queue_depth", 1, 20000);
    double t = dt_now();
    char *hdr = NULL;
    int code = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"z\", \"size\": \"32x32\", \"steps\": 8}",
                    NULL, NULL, &hdr);
    const char *ra = hdr ? strcasestr(hdr, "Retry-After:") : NULL;
    int retry = ra ? atoi(ra + 12) : -1;
    while (dt_now() - t < 60 && (metric(&s, "ditrun_queue_depth") > 0 || metric(&s, "ditrun_jobs_running") > 0))
        sleep_ms(20);
    double drained = dt_now() - t;
    waitpid(x, NULL, 0);
    waitpid(y, NULL, 0);
    char name[200];
    snprintf(name, sizeof name, "serve: Retry-After %d s for a queue that drained in %.2f s (<= ceil + %d) after a big "
             "job and a cancelled one", retry, drained, RETRY_SLACK_S);
    T_CHECK(name, big == 200 && ran && cancelled && s1 == 200 && s2 == 200 && running && queued && code == 429 &&
                      retry >= 1 && retry <= (int)ceil(drained) + RETRY_SLACK_S,
            "big %d, cancelled %d, small %d %d, running %d, queued %d, status %d", big, cancelled, s1, s2, running,
            queued, code);
    free(hdr);
    T_CHECK("serve: retry server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

/* A streamed request in the background whose events go to the file out (curl, its pid). */
static pid_t stream_to(const server *s, const char *prompt, int steps, const char *out) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "exec curl -s -N -o '%s' -X POST -H 'Content-Type: application/json' --data-binary "
             "'{\"prompt\": \"%s\", \"size\": \"128x128\", \"steps\": %d, \"stream\": true}' "
             "http://127.0.0.1:%d/v1/images/generations", out, prompt, steps, s->port);
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return p;
}

/* Its event stream tells a waiting request its place in line, again each time it moves up. */
static void test_queue_position(void) {
    server s;
    if (server_start(&s, "position", "") || server_ready(&s)) {
        T_FAIL("serve: start (queue position)", "see %s", s.log);
        return;
    }
    char out_c[600];
    snprintf(out_c, sizeof out_c, "%s/position-c.sse", serve_tmp);
    pid_t a = slow_request(&s, 100);                        /* runs */
    int ok = wait_metric(&s, "ditrun_jobs_running", 1, 20000);
    pid_t b = slow_request(&s, 100);                        /* waits first */
    ok = ok && wait_metric(&s, "ditrun_queue_depth", 1, 20000);
    pid_t c = stream_to(&s, "third", 2, out_c);             /* waits second, then first, then runs */
    ok = ok && wait_metric(&s, "ditrun_queue_depth", 2, 20000);
    kill(a, SIGKILL);                                       /* b runs, c moves up */
    waitpid(a, NULL, 0);
    ok = ok && wait_metric(&s, "ditrun_queue_depth", 1, 20000);
    sleep_ms(300);                                          /* c's stream looks every 50 ms */
    kill(b, SIGKILL);                                       /* c runs and finishes */
    waitpid(b, NULL, 0);
    int st = -1;
    waitpid(c, &st, 0);
    char *sse = t_slurp(out_c, NULL);
    /* the positions in order, then progress */
    int pos[8], np = 0;
    const char *p = sse, *key = "\"type\": \"queued\", \"position\": ";
    while (p && (p = strstr(p, key)) && np < 8) {
        p += strlen(key);
        pos[np++] = atoi(p);
    }
    const char *prog = sse ? strstr(sse, "event: progress") : NULL, *last_q = sse ? strstr(sse, "event: queued") : NULL;
    while (last_q && strstr(last_q + 1, "event: queued")) last_q = strstr(last_q + 1, "event: queued");
    T_CHECK("serve: a waiting stream gets 'queued' position 2, then 1, then its progress and image",
            ok && WIFEXITED(st) && WEXITSTATUS(st) == 0 && np == 2 && pos[0] == 2 && pos[1] == 1 && prog && last_q < prog &&
                strstr(sse, "event: done"),
            "queue steps seen %d, curl status %d, positions %d: %d %d, progress after them %d", ok, st, np,
            np > 0 ? pos[0] : -1, np > 1 ? pos[1] : -1, prog && last_q < prog);
    free(sse);
    T_CHECK("serve: position server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

/* The seconds in the log line of the last finished job of size WxH ("... WxH, ...: ... server S s"), and the
 * estimate logged before it ("... WxH, ...: estimated E s"): 0, or -1 when either is missing. */
static int logged_times(const char *log, const char *size, double *estimate, double *server_s) {
    char pat[64];
    snprintf(pat, sizeof pat, "image %s, ", size);
    const char *est = NULL, *fin = NULL;
    for (const char *p = log; p && (p = strstr(p, pat)); p++) {
        const char *line_end = strchr(p, '\n');
        const char *e = strstr(p, "estimated "), *f = strstr(p, "server ");
        if (e && (!line_end || e < line_end)) est = e + strlen("estimated ");
        if (f && (!line_end || f < line_end) && est) fin = f + strlen("server ");
    }
    if (!est || !fin) return -1;
    *estimate = atof(est);
    *server_s = atof(fin);
    return 0;
}

/* What a CPU server says about itself (/health), its --max-pixels default, and its logged estimate of a request. */
static void test_cpu_defaults_and_estimate(void) {
    server s;
    if (server_start(&s, "estimate", "") || server_ready(&s)) {
        T_FAIL("serve: start (estimate)", "see %s", s.log);
        return;
    }
    char *body = NULL, why[400] = "";
    int code = http(&s, "GET", "/health", NULL, NULL, &body, NULL);
    T_CHECK("serve: a CPU server's /health says backend cpu, default_size 256x256, max_pixels 1024x1024",
            code == 200 && body && strstr(body, "\"backend\": \"cpu\"") && strstr(body, "\"default_size\": \"256x256\"") &&
                strstr(body, "\"max_pixels\": 1048576") && strstr(body, "\"size_multiple\": 8"),
            "status %d: %s", code, body ? body : "");
    free(body);
    body = NULL;
    code = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"1024x1032\", \"steps\": 1}",
                NULL, &body, NULL);
    T_CHECK("serve: on the CPU a request over 1024x1024 pixels is refused by default (400)",
            code == 400 && error_shape(body, "size", why, sizeof why), "status %d %s", code, why);
    free(body);
    /* 64x64, then 128x128 three times: the last is estimated from two measured sizes (the a*T + b*T^2 fit), the
     * latest a warm 128x128 (the first image of a size is slower: its activations are allocated then) */
    const char *reqs[] = {"64x64", "128x128", "128x128", "128x128"};
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        char req[200];
        snprintf(req, sizeof req, "{\"prompt\": \"x\", \"size\": \"%s\", \"steps\": 4, \"seed\": 1}", reqs[i]);
        ok &= http(&s, "POST", "/v1/images/generations", req, NULL, NULL, NULL) == 200;
    }
    char *log = t_slurp(s.log, NULL);
    double est = 0, got = 0;
    int have = log && logged_times(log, "128x128", &est, &got) == 0;
    const int first_said = log && strstr(log, "1 image 64x64, 4 steps: no estimate yet") != NULL;
    /* the same size as the warm image measured just before: within a factor 2 (timing noise of a shared machine) */
    T_CHECK("serve: the first request logs 'no estimate yet', a repeated size an estimate within 2x of its time",
            ok && first_said && have && got > 0 && est > got / 2 && est < got * 2,
            "requests ok %d, first said %d, estimate %.3f s vs server %.3f s", ok, first_said, est, got);
    free(log);
    T_CHECK("serve: estimate server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

static void test_drain(void) {
    server s;
    /* a warm-up long enough to be seen: /health and generations answer 503 until it is done */
    if (server_start(&s, "drain", "--warmup 192x192")) { T_FAIL("serve: start (drain)", "see %s", s.log); return; }
    char *hb = NULL, *gb = NULL, why[400], why2[400];
    int h503 = http(&s, "GET", "/health", NULL, NULL, &hb, NULL);
    int g503 = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"16x16\", \"steps\": 1}",
                    NULL, &gb, NULL);
    T_CHECK("serve: while warming up, /health and generations -> 503 with a JSON error",
            h503 == 503 && g503 == 503 && error_shape(hb, NULL, why, sizeof why) && error_shape(gb, NULL, why2, sizeof why2)
                && strstr(hb, "\"status\": \"loading\""),
            "health %d %s; generation %d %s", h503, why, g503, why2);
    free(hb);
    free(gb);
    T_CHECK("serve: /health turns 200 after the warm-up", server_ready(&s) == 0, "still not ready after 120 s");
    char outf[600], cmd[2048];
    snprintf(outf, sizeof outf, "%s/drain.out", serve_tmp);
    /* a job of a few seconds on the CPU (a 64x64 6-step one could finish between two polls of the metric) */
    snprintf(cmd, sizeof cmd, "exec curl -s -o %s -w '%%{http_code}' -X POST -H 'Content-Type: application/json' --data-binary '{\"prompt\": \"drain\", "
             "\"size\": \"128x128\", \"steps\": 40}' http://127.0.0.1:%d/v1/images/generations > %s.code", outf, s.port, outf);
    pid_t c = fork();
    if (c == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int running = wait_metric(&s, "ditrun_jobs_running", 1, 20000);
    int rc = server_stop(&s);
    int st = 0;
    waitpid(c, &st, 0);
    char codef[700];
    snprintf(codef, sizeof codef, "%s.code", outf);
    char *code = t_slurp(codef, NULL);
    size_t n = 0;
    char *body = t_slurp(outf, NULL);
    unsigned char *png = answer_png(body, 0, &n);
    T_CHECK("serve: SIGTERM finishes the running request (200 with its image) and exits 0",
            running && rc == 0 && code && !strcmp(code, "200") && png && n > 8,
            "running %d, exit %d, status %s, %zu PNG bytes", running, rc, code ? code : "?", n);
    free(code);
    free(body);
    free(png);
}

static long rss_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

/* n requests at concurrency c through xargs; returns how many were not 200. */
static int load(const server *s, int n, int c) {
    char bodyf[600], codes[600], cmd[2048];
    snprintf(bodyf, sizeof bodyf, "%s/load.json", serve_tmp);
    snprintf(codes, sizeof codes, "%s/load.codes", serve_tmp);
    const char *body = "{\"prompt\": \"a small fox\", \"size\": \"16x16\", \"steps\": 1}";
    spit(bodyf, body, strlen(body));
    snprintf(cmd, sizeof cmd, "seq %d | xargs -P %d -I{} curl -s -m 60 -o /dev/null -w '%%{http_code}\\n' -X POST "
             "-H 'Content-Type: application/json' --data-binary @%s http://127.0.0.1:%d/v1/images/generations > %s", n, c, bodyf, s->port, codes);
    if (system(cmd)) return n;
    char *t = t_slurp(codes, NULL);
    int ok = 0;
    for (char *l = t ? strtok(t, "\n") : NULL; l; l = strtok(NULL, "\n")) ok += !strcmp(l, "200");
    free(t);
    return n - ok;
}

static void test_load(void) {
    server s;
    if (server_start(&s, "load", "--max-queue 64") || server_ready(&s)) { T_FAIL("serve: start (load)", "see %s", s.log); return; }
    double t0 = dt_now();
    int bad1 = load(&s, LOAD_WARM, LOAD_CONCURRENCY);
    long rss1 = rss_kb(s.pid);
    int bad2 = load(&s, LOAD_REQUESTS - LOAD_WARM, LOAD_CONCURRENCY);
    long rss2 = rss_kb(s.pid);
    double t = dt_now() - t0;
    double growth = rss1 > 0 ? (double)(rss2 - rss1) / (double)rss1 : 1;
    char name[128];
    snprintf(name, sizeof name, "serve: %d requests at concurrency %d, 0 failures (%.1f s)", LOAD_REQUESTS,
             LOAD_CONCURRENCY, t);
    T_CHECK(name, bad1 + bad2 == 0, "%d failed", bad1 + bad2);
    snprintf(name, sizeof name, "serve: resident memory after %d vs %d requests: %+.1f%% (%ld -> %ld kB) < %.0f%%",
             LOAD_WARM, LOAD_REQUESTS, growth * 100, rss1, rss2, RSS_GROWTH_TOL * 100);
#if defined(__SANITIZE_ADDRESS__)
    T_SKIP(name, "AddressSanitizer keeps freed memory in quarantine (a leak shows as LeakSanitizer's exit status of the "
                 "server instead)");
    (void)growth;
#else
    T_CHECK(name, rss1 > 0 && growth < RSS_GROWTH_TOL, "grew %.1f%%", growth * 100);
#endif
    T_CHECK("serve: load server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

/* The GPU's image differs from the CPU's by bf16 rounding: 99% of pixels within +-3 (as tests/test_generate.c). */
#define GPU_PX_TOL 3
#define GPU_PX_FRAC 0.99

/* The server on the CUDA backend (its worker thread creates the backend): an image close to the CPU's. */
static void test_cuda(void) {
    if (!dt_backend_cuda_available()) {
        if (t_require_gpu_env()) T_FAIL("serve: cuda", "DITRUN_REQUIRE_GPU=1 but no CUDA GPU is usable");
        else T_SKIP("serve: cuda", "no CUDA GPU available on this machine");
        return;
    }
    server s;
    if (server_start(&s, "cuda", "--backend cuda") || server_ready(&s)) {
        T_FAIL("serve: start on cuda", "see %s", s.log);
        return;
    }
    char *body = NULL, got[600], ref[600];
    int code = http(&s, "POST", "/v1/images/generations",
                    "{\"prompt\": \"a red fox\", \"size\": \"64x48\", \"steps\": 2, \"seed\": 5}", NULL, &body, NULL);
    size_t n = 0;
    unsigned char *png = answer_png(body, 0, &n);
    snprintf(got, sizeof got, "%s/cuda.png", serve_tmp);
    snprintf(ref, sizeof ref, "%s/cuda-ref.png", serve_tmp);
    if (png) spit(got, (const char *)png, n);
    uint8_t *a = NULL, *b = NULL;
    int wa = 0, ha = 0, wb = 0, hb = 0;
    int ok = code == 200 && png && generate("a red fox", 64, 48, 2, 5, ref) == 0 &&
             dt_png_read(got, &a, &wa, &ha, NULL, NULL) == 0 && dt_png_read(ref, &b, &wb, &hb, NULL, NULL) == 0 &&
             wa == 64 && ha == 48 && wb == 64 && hb == 48;
    size_t close = 0, total = 64 * 48 * 3;
    for (size_t i = 0; ok && i < total; i++) close += abs((int)a[i] - (int)b[i]) <= GPU_PX_TOL;
    char name[160];
    snprintf(name, sizeof name, "serve: cuda image vs the CPU's: %.2f%% of values within +-%d (>= %.0f%%)",
             ok ? 100.0 * (double)close / (double)total : 0.0, GPU_PX_TOL, GPU_PX_FRAC * 100);
    T_CHECK(name, ok && (double)close >= GPU_PX_FRAC * (double)total, "status %d: %s", code, ok ? "too different" : "no image");
    free(a);
    free(b);
    free(png);
    free(body);
    T_CHECK("serve: cuda server stops with 0", server_stop(&s) == 0, "see %s", s.log);
}

/* Bad command lines: exit 1 with one "ditrun: error:" line naming the problem (and no server left running). */
static void test_bad_options(void) {
    static const struct { const char *args, *needle; } cases[] = {
        {"--max-queue 0", "--max-queue"},
        {"--warmup big", "--warmup"},
        {"--port 70000", "--port"},
        {"--api-key-file /nonexistent/key.txt", "/nonexistent/key.txt"},
        {"--model /nonexistent/model", "/nonexistent/model"},
        {"--host name.invalid", "name.invalid"},
        {"--frobnicate", "--frobnicate"},
        {"--request-timeout 0", "--request-timeout"},
        {"--max-client-connections 0", "--max-client-connections"},
        {"--allow-host evil.example:80", "--allow-host"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024], err[4096], name[160];
        snprintf(args, sizeof args, "--port 0 --backend cpu -q %s", cases[i].args);
        int rc = serve_fails(args, err, sizeof err);
        int lines = 0;
        for (char *p = err; p && *p; p++) lines += *p == '\n';
        snprintf(name, sizeof name, "serve: '%s' -> exit 1 with one error line", cases[i].args);
        T_CHECK(name, rc == 1 && strstr(err, "ditrun: error:") && strstr(err, cases[i].needle) && lines == 1,
                "status %d, stderr: %s", rc, err);
    }
}

int main(void) {
    serve_setup();
    if (access(serve_exe, X_OK)) { T_SKIP("serve", "%s not built", serve_exe); return T_DONE(); }
    if (system("curl --version >/dev/null 2>&1")) { T_SKIP("serve", "curl is not installed (.ci/install-deps)"); return T_DONE(); }
    snprintf(serve_tmp, sizeof serve_tmp, "/tmp/ditrun_serve_XXXXXX");
    if (!mkdtemp(serve_tmp)) { T_FAIL("serve: tmpdir", "mkdtemp failed"); return T_DONE(); }
    server s;
    if (server_start(&s, "main", "--max-steps 50 --max-pixels 1048576")) {
        T_FAIL("serve: start", "no 'listening on' line; see %s", s.log);
        return T_DONE();
    }
    T_PASS("serve: listening on an ephemeral port");
    T_CHECK("serve: /health turns 200", server_ready(&s) == 0, "not ready after 120 s");
    int code;
    char *body = NULL;
    code = http(&s, "GET", "/v1/models", NULL, NULL, &body, NULL);
    T_CHECK("serve: /v1/models lists the model", code == 200 && body && strstr(body, "\"id\": \"model\""), "status %d %s",
            code, body ? body : "");
    free(body);
    code = http(&s, "GET", "/", NULL, NULL, &body, NULL);
    T_CHECK("serve: GET / is the page", code == 200 && body && strstr(body, "<html"), "status %d", code);
    free(body);
    test_images(&s);
    test_stream(&s);
    test_bad_requests(&s);
    test_half_close(&s);
    test_hostile_requests(&s);
    test_edits(&s);
    test_formats(&s);
    code = http(&s, "GET", "/metrics", NULL, NULL, &body, NULL);
    T_CHECK("serve: /metrics counts requests by status and has the latency histogram and device memory",
            code == 200 && body && strstr(body, "ditrun_requests_total{route=\"/v1/images/generations\",status=\"400\"}") &&
                strstr(body, "ditrun_request_duration_seconds_bucket{le=\"+Inf\"}") &&
                strstr(body, "ditrun_device_memory_bytes{worker=\"0\"}"),
            "status %d", code);
    free(body);
    T_CHECK("serve: main server stops with 0", server_stop(&s) == 0, "see %s", s.log);
    test_bad_options();
    test_request_job();
    test_retry_estimate();
    test_auth();
    test_queue_and_cancel();
    test_slowloris();
    test_retry_after();
    test_queue_position();
    test_cpu_defaults_and_estimate();
    test_drain();
    test_load();
    test_cuda();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", serve_tmp);
    if (!t_failed && system(cmd)) {}
    return T_DONE();
}
