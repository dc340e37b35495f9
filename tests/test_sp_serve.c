/* test_sp_serve.c — `ditrun serve --sequence-parallel N` and `--devices` on the CPU: a real server of $BUILD/ditrun on
 * an ephemeral port with the bundled tiny model, its DiT split over 2 thread ranks, driven by curl. The served PNG is
 * byte-identical to `ditrun generate --sequence-parallel 2`'s and within one 8-bit step of the unsplit image; the
 * option errors (GPUs asked of the CPU backend, a bad device list, more ranks than heads) are one error line and
 * exit 1. Data-parallel serving over several GPUs runs in the GPU suite (tools/gpu_run.sh sp). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image/png.h"
#include "serve_helpers.h"
#include "test.h"

/* The split forward differs from the unsplit one by GEMM summation order only (rel ~1e-7), which can move a pixel
 * across a rounding boundary of the 8-bit conversion. */
#define SP_PIXEL_TOL 1

/* `ditrun generate` with the request's settings (and extra options) into path: 0 ok. */
static int generate(const char *extra, const char *path) {
    char args[1024];
    snprintf(args, sizeof args, "--prompt 'a red fox' --width 40 --height 24 --steps 2 --seed 5 %s", extra);
    return serve_generate(args, path);
}

/* `ditrun serve --model MODEL --port 0 ARGS`, which must fail at once: exit status, stderr into err. */
static int fails(const char *args, char *err, size_t n) {
    char all[2048];
    snprintf(all, sizeof all, "--model %s --port 0 %s", serve_model, args);
    return serve_fails(all, err, n);
}

static int one_error_line(const char *err, const char *needle) {
    const char *e = strstr(err, "ditrun: error:");
    return e && strstr(e, needle) && !strstr(e + 1, "ditrun: error:");
}

int main(void) {
    serve_setup();
    snprintf(serve_tmp, sizeof serve_tmp, "%s", t_tmp_root());

    server s;
    if (server_start(&s, "sp-serve", "--sequence-parallel 2") || server_ready(&s)) {
        char *l = t_slurp(s.log, NULL);
        T_FAIL("serve --sequence-parallel 2: starts", "%s", l ? l : "(no log)");
        free(l);
        server_stop(&s);
    } else {
        char *answer = NULL;
        http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"a red fox\", \"size\": \"40x24\", \"steps\": 2, \"seed\": 5}",
             NULL, &answer, NULL);
        size_t n = 0;
        unsigned char *png = answer_png(answer, 0, &n);
        free(answer);
        char *log = t_slurp(s.log, NULL);
        T_CHECK("serve --sequence-parallel 2: the worker's DiT runs on 2 thread ranks",
                log && strstr(log, "sequence parallel: 2 ranks (threads)"), "log: %s", log ? log : "");
        free(log);
        char split[600], whole[600], got[600];
        snprintf(split, sizeof split, "%s/sp-gen2.png", serve_tmp);
        snprintf(whole, sizeof whole, "%s/sp-gen1.png", serve_tmp);
        snprintf(got, sizeof got, "%s/sp-served.png", serve_tmp);
        int g2 = generate("--sequence-parallel 2", split), g1 = generate("", whole);
        size_t m = 0;
        char *ref = t_slurp(split, &m);
        T_CHECK("serve --sequence-parallel 2: the PNG is byte-identical to generate --sequence-parallel 2's",
                png && g2 == 0 && ref && m == n && !memcmp(ref, png, n), "%zu bytes served, generate rc %d (%zu bytes)",
                n, g2, m);
        free(ref);
        uint8_t *a = NULL, *c = NULL;
        int wa = 0, ha = 0, wc = 0, hc = 0, px = -1;
        if (png) spit(got, (const char *)png, n);
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
    unlink(s.out);
    unlink(s.log);

    char err[4096];
    int rc = fails("--backend cpu --devices all", err, sizeof err);
    T_CHECK("serve --devices on the cpu backend: one error line, exit 1", rc == 1 && one_error_line(err, "--devices picks GPUs"),
            "exit %d: %s", rc, err);
    rc = fails("--backend cuda --devices 0,x", err, sizeof err);
    T_CHECK("serve --devices with a bad list or no GPU: one error line, exit 1",
            rc == 1 && one_error_line(err, "--devices"), "exit %d: %s", rc, err);
    rc = fails("--backend cpu --sequence-parallel 3", err, sizeof err);
    T_CHECK("serve --sequence-parallel 3 on a 2-head model: the worker's load error, exit 1",
            rc == 1 && strstr(err, "the transformer has 2 attention heads"), "exit %d: %s", rc, err);
    rc = fails("--backend cpu --sequence-parallel 99", err, sizeof err);
    T_CHECK("serve --sequence-parallel 99: out of range, exit 1", rc == 1 && one_error_line(err, "--sequence-parallel"),
            "exit %d: %s", rc, err);
    return T_DONE();
}
