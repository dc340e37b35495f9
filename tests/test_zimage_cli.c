/* test_zimage_cli.c — the Z-Image family through its front ends, on the fixture's ZImagePipeline folder
 * (tests/fixtures/zimage, tools/zimage_reference.py): `ditrun generate` (the CFG pipeline with --cfg-normalization,
 * --cfg-truncation and --negative-prompt against the reference's pixels, img2img and inpainting against theirs), the
 * options' errors (out of range; another family refusing them by name), `ditrun info` and `synth --pipeline` of the
 * tiny preset, `ditrun bench` of it, `quantize --bits 8` and `--precision fp8` on the pipeline, `forward` on synth's inputs; `ditrun serve` (a real server on an ephemeral port, driven by curl): a generation with the cfg options
 * equal to `ditrun generate`'s image, an img2img edit, 400s for bad values, and the FLUX.2 server refusing them by
 * family; the C API (include/ditrun.h) generating the guidance-0 pipeline from the reference's noise and the
 * img2img case. Skipped with the reason when the fixture folder or the binary is absent. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ditrun.h"
#include "image/image.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "serve_helpers.h"
#include "test.h"
#include "zimage_fixture.h"

/* rgb [n] against FILE's out.image_u8: all but 0.1 % within ±1 (rounding at .5 boundaries after ~1e-6 differences
 * upstream: test_generate's rule, as test_zimage.c). */
static void check_ref_pixels(const char *name, const uint8_t *rgb, size_t n, const char *file) {
    char p[600];
    st_file *io = st_open(fx(file, p, sizeof p));
    const st_tensor *r = io ? st_find(io, "out.image_u8") : NULL;
    if (!r || r->numel != (int64_t)n) {
        T_FAIL(name, "%s has no image of %zu bytes", file, n);
    } else {
        size_t ok = 0;
        int wd = 0;
        const uint8_t *ref = r->data;
        for (size_t k = 0; k < n; k++) {
            const int d = abs((int)rgb[k] - (int)ref[k]);
            ok += d <= 1;
            if (d > wd) wd = d;
        }
        T_CHECK(name, ok >= 0.999 * n, "%zu of %zu within +-1, max difference %d", ok, n, wd);
    }
    if (io) st_close(io);
}

/* The PNG at path against FILE's pixels. */
static void check_png(const char *name, const char *png, const char *file, int w, int h) {
    dt_image im = {0};
    if (dt_image_read_file(png, &im) || im.w != w || im.h != h || im.channels != 3) {
        T_FAIL(name, "%s: %s (%dx%d, %d channels)", png, dt_last_error(), im.w, im.h, im.channels);
    } else {
        check_ref_pixels(name, im.px, (size_t)3 * w * h, file);
    }
    dt_image_free(&im);
}

#define PROMPT "a red fox standing in fresh snow, golden hour"

static void test_cli(void) {
    char cmd[4096], err[4096], m[600], p[600], png[700], nf[700];
    fx("model", m, sizeof m);
    /* the CFG pipeline: guidance 3, negative prompt, cfg_normalization 1, cfg_truncation 0.3 (cases.json) */
    snprintf(png, sizeof png, "%s/cfg.png", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p '" PROMPT "' --negative-prompt 'blurry, low quality' "
             "--width 64 --height 48 --steps 3 --guidance 3 --cfg-normalization 1 --cfg-truncation 0.3 "
             "--max-sequence-length 64 --noise %s -o %s", serve_exe, m, fx("pipeline_cfg_io.safetensors", p, sizeof p), png);
    int rc = run_err(cmd, err, sizeof err);
    if (rc) T_FAIL("generate: CFG pipeline", "exit %d: %s", rc, err);
    else check_png("generate: CFG pipeline (--cfg-normalization 1 --cfg-truncation 0.3) vs the reference's pixels", png,
                   "pipeline_cfg_io.safetensors", 64, 48);
    /* without the options: the reference's defaults (no normalization, no truncation) give another image */
    snprintf(png, sizeof png, "%s/cfg-default.png", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p '" PROMPT "' --negative-prompt 'blurry, low quality' "
             "--width 64 --height 48 --steps 3 --guidance 3 --max-sequence-length 64 --noise %s -o %s", serve_exe, m,
             fx("pipeline_cfg_io.safetensors", p, sizeof p), png);
    dt_image a = {0};
    rc = run_err(cmd, err, sizeof err) || dt_image_read_file(png, &a);
    size_t diff = 0;
    char refp[700];
    snprintf(refp, sizeof refp, "%s/cfg.png", serve_tmp);
    dt_image b = {0};
    if (!rc && !dt_image_read_file(refp, &b) && a.w == b.w && a.h == b.h)
        for (size_t k = 0; k < (size_t)3 * a.w * a.h; k++) diff += abs((int)a.px[k] - (int)b.px[k]) > 1;
    T_CHECK("generate: the cfg options change the image (defaults: off)", !rc && diff > 100, "rc %d (%s), %zu pixels differ",
            rc, err, diff);
    dt_image_free(&a);
    dt_image_free(&b);
    /* img2img and inpainting from init.png (+ mask.png) with the reference's draws */
    snprintf(nf, sizeof nf, "%s/i2i-noise.safetensors", serve_tmp);
    snprintf(png, sizeof png, "%s/i2i.png", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p '" PROMPT "' --steps 4 --guidance 0 --strength 0.6 "
             "--max-sequence-length 64 --init-image %s --noise %s -o %s", serve_exe, m, fx("init.png", p, sizeof p), nf, png);
    if (zimage_edit_noise("img2img", "img2img_io.safetensors", nf)) T_FAIL("generate: img2img", "fixture lacks its draws");
    else if ((rc = run_err(cmd, err, sizeof err))) T_FAIL("generate: img2img", "exit %d: %s", rc, err);
    else check_png("generate: img2img (--init-image, --strength 0.6) vs the reference's pixels", png, "img2img_io.safetensors",
                   64, 48);
    char mk[600];
    snprintf(nf, sizeof nf, "%s/inp-noise.safetensors", serve_tmp);
    snprintf(png, sizeof png, "%s/inp.png", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p '" PROMPT "' --steps 4 --guidance 0 --strength 0.7 "
             "--max-sequence-length 64 --init-image %s --mask %s --noise %s -o %s", serve_exe, m,
             fx("init.png", p, sizeof p), fx("mask.png", mk, sizeof mk), nf, png);
    if (zimage_edit_noise("inpaint", "inpaint_io.safetensors", nf)) T_FAIL("generate: inpainting", "fixture lacks its draws");
    else if ((rc = run_err(cmd, err, sizeof err))) T_FAIL("generate: inpainting", "exit %d: %s", rc, err);
    else check_png("generate: inpainting (--mask, --strength 0.7) vs the reference's pixels", png, "inpaint_io.safetensors",
                   64, 48);

    /* errors: a value out of range before anything loads; FLUX.2 refuses the options naming its family */
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p x --cfg-truncation -0.5 -o %s/x.png", serve_exe, m,
             serve_tmp);
    rc = run_err(cmd, err, sizeof err);
    T_CHECK("generate: --cfg-truncation -0.5 is out of range", rc == 1 && strstr(err, "--cfg-truncation") &&
            strstr(err, "out of range"), "exit %d: %s", rc, err);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s/model -p x --steps 1 --cfg-normalization 1 -o %s/x.png",
             serve_exe, t_fixtures(), serve_tmp);
    rc = run_err(cmd, err, sizeof err);
    T_CHECK("generate: FLUX.2 refuses --cfg-normalization naming its family", rc == 1 &&
            strstr(err, "cfg_normalization") && strstr(err, "flux2-klein"), "exit %d: %s", rc, err);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p x --steps 1 --width 64 --height 64 --cuda-graph -o %s/x.png", serve_exe, m,
             serve_tmp);
    rc = run_err(cmd, err, sizeof err);
    T_CHECK("generate: --cuda-graph is refused naming Z-Image (no graph replay yet)", rc == 1 && strstr(err, "Z-Image") &&
            strstr(err, "--cuda-graph"), "exit %d: %s", rc, err);
    /* step caching per guidance branch: 6 guided steps, taylorseer=2 computes steps 0-2, 4, 5 of each branch */
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p x --steps 6 --guidance 3 --width 64 --height 64 "
             "--cache taylorseer=2 -o %s/x.png 2>&1", serve_exe, m, serve_tmp);
    FILE *pf = popen(cmd, "r");
    char outl[4096] = "";
    size_t got = pf ? fread(outl, 1, sizeof outl - 1, pf) : 0;
    outl[got] = 0;
    rc = pf ? pclose(pf) : -1;
    T_CHECK("generate: --cache taylorseer=2 on Z-Image with guidance: 10 of 12 transformer passes",
            rc == 0 && strstr(outl, "10 of 12 transformer passes"), "exit %d: %s", rc, outl);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s/model -p x --steps 1 --init-image %s -o %s/x.png",
             serve_exe, t_fixtures(), fx("init.png", p, sizeof p), serve_tmp);
    rc = run_err(cmd, err, sizeof err);
    T_CHECK("generate: FLUX.2 still needs --mask with --init-image (no img2img)", rc == 1 && strstr(err, "needs a mask"),
            "exit %d: %s", rc, err);

    /* a broken folder: a missing component and inconsistent dims are errors naming the files */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/bad", serve_tmp);
    snprintf(cmd, sizeof cmd, "cp -R %s %s && rm -rf %s/vae", m, bad, bad);
    if (system(cmd)) T_FAIL("broken folder", "cannot copy %s", m);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p x -o %s/x.png", serve_exe, bad, serve_tmp);
    rc = run_err(cmd, err, sizeof err);
    T_CHECK("generate: a folder without vae/ is refused naming it", rc == 1 && strstr(err, "bad/vae"), "exit %d: %s", rc, err);
    snprintf(cmd, sizeof cmd, "cp -R %s/vae %s/ && sed -i 's/\"cap_feat_dim\": 32/\"cap_feat_dim\": 64/' "
             "%s/transformer/config.json", m, bad, bad);
    if (system(cmd)) T_FAIL("broken folder", "cannot edit %s", bad);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu --model %s -p x -o %s/x.png", serve_exe, bad, serve_tmp);
    rc = run_err(cmd, err, sizeof err);
    T_CHECK("generate: cap_feat_dim != the text encoder's hidden size names both config files", rc == 1 &&
            strstr(err, "text_encoder/config.json: hidden_size 32") && strstr(err, "transformer/config.json: cap_feat_dim 64"),
            "exit %d: %s", rc, err);

    /* info: the family's transformer geometry and FLUX.1's VAE */
    char out[600];
    snprintf(out, sizeof out, "%s/info.txt", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s info %s > %s", serve_exe, m, out);
    rc = system(cmd);
    char *txt = t_slurp(out, NULL);
    T_CHECK("info: ZImagePipeline, its transformer and AutoencoderKL (scaling, shift)", rc == 0 && txt &&
            strstr(txt, "ZImagePipeline") && strstr(txt, "2 joint + 2 x 2 refiner blocks") &&
            strstr(txt, "scaling 0.3611, shift 0.1159") && !strstr(txt, "decoding as AutoencoderKLFlux2"),
            "exit %d: %s", rc, txt ? txt : "(no output)");
    free(txt);

    /* synth --pipeline of the tiny preset: a folder generate runs (one 2-step image) */
    char sd[600];
    snprintf(sd, sizeof sd, "%s/synth-tiny", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s synth --preset z-image-tiny --pipeline --output %s && %s generate --backend cpu "
             "--model %s -p 'a cat' --width 32 --height 32 --steps 2 -o %s/synth.png", serve_exe, sd, serve_exe, sd, serve_tmp);
    rc = run_err(cmd, err, sizeof err);
    snprintf(png, sizeof png, "%s/synth.png", serve_tmp);
    dt_image im = {0};
    T_CHECK("synth --preset z-image-tiny --pipeline: generate runs it", rc == 0 && !dt_image_read_file(png, &im) &&
            im.w == 32 && im.h == 32, "exit %d: %s", rc, err);
    dt_image_free(&im);
}

/* ---- quantize, fp8, forward ---- */

/* Mean |byte difference| of the PNG at path against FILE's reference pixels (-1: unreadable). */
static double png_mean_diff(const char *png, const char *file) {
    char p[600];
    dt_image im = {0};
    st_file *io = st_open(fx(file, p, sizeof p));
    const st_tensor *r = io ? st_find(io, "out.image_u8") : NULL;
    double mean = -1;
    if (r && !dt_image_read_file(png, &im) && im.channels == 3 && (int64_t)3 * im.w * im.h == r->numel) {
        double sum = 0;
        const uint8_t *ref = r->data;
        for (int64_t k = 0; k < r->numel; k++) sum += abs((int)im.px[k] - (int)ref[k]);
        mean = sum / (double)r->numel;
    }
    dt_image_free(&im);
    if (io) st_close(io);
    return mean;
}

/* MLX q8 g32 weights (quantize) run the guidance-0 pipeline near the reference; --precision fp8 runs the blocks in fp8
 * (the Linears' load line says so) with its error against bf16 told; `ditrun forward` takes synth's inputs. */
#define Q8_PIXEL_MEAN 1.0   /* q8 g32: ~0.4% weight error (quantize's report): a fraction of a byte on average */
static void test_formats(void) {
    char cmd[4096], err[8192], m[600], p[600], q[600], png[700];
    fx("model", m, sizeof m);
    snprintf(q, sizeof q, "%s/q8", serve_tmp);
    snprintf(cmd, sizeof cmd, "cp -R %s %s && rm -rf %s/transformer && %s quantize --input %s/transformer --output "
             "%s/transformer/model.safetensors --bits 8 --group-size 32", m, q, q, serve_exe, m, q);
    int rc = run_err(cmd, err, sizeof err);
    snprintf(png, sizeof png, "%s/q8.png", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu -v --model %s -p '" PROMPT "' --width 64 --height 48 --steps 3 "
             "--guidance 0 --max-sequence-length 64 --noise %s -o %s", serve_exe, q,
             fx("pipeline_io.safetensors", p, sizeof p), png);
    if (!rc) rc = run_err(cmd, err, sizeof err);
    double mean = rc ? -1 : png_mean_diff(png, "pipeline_io.safetensors");
    T_CHECK("quantize --bits 8: the q8 transformer runs the pipeline near the reference's pixels",
            rc == 0 && strstr(err, "q8 g32") && mean >= 0 && mean <= Q8_PIXEL_MEAN, "exit %d, mean |diff| %.3f: %.400s",
            rc, mean, err);
    printf("# q8 g32 pipeline: mean |byte difference| %.3f from the reference\n", mean);

    snprintf(png, sizeof png, "%s/fp8.png", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s generate --backend cpu -v --model %s -p '" PROMPT "' --width 64 --height 48 --steps 3 "
             "--guidance 0 --max-sequence-length 64 --noise %s --precision fp8 --compare-bf16 -o %s > %s/fp8.txt 2>&1",
             serve_exe, m, fx("pipeline_io.safetensors", p, sizeof p), png, serve_tmp);
    rc = system(cmd);
    snprintf(p, sizeof p, "%s/fp8.txt", serve_tmp);
    char *out = t_slurp(p, NULL);
    snprintf(err, sizeof err, "%s", out ? out : "");
    const char *r = out ? strstr(out, "rel_l2 ") : NULL;
    const double rel = r ? atof(r + 7) : -1;
    /* fp8 e4m3 rounding of the block Linears' weights and activations: a few percent of the final latents */
    T_CHECK("--precision fp8: the blocks' Linears in fp8, a few % from bf16", rc == 0 && strstr(err, "Linears bf16: fp8") &&
            rel > 0 && rel < 0.1, "exit %d, rel_l2 %g: %.300s", rc, rel, err);
    free(out);

    char in[700];
    snprintf(in, sizeof in, "%s/in.safetensors", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s synth --preset z-image-tiny --inputs %s --image-size 96 --text-tokens 20 && %s forward "
             "--backend cpu --model %s --inputs %s --output %s/fwd.safetensors", serve_exe, in, serve_exe, m, in, serve_tmp);
    rc = run_err(cmd, err, sizeof err);
    snprintf(p, sizeof p, "%s/fwd.safetensors", serve_tmp);
    st_file *f = rc ? NULL : st_open(p);
    T_CHECK("forward: synth's Z-Image inputs (6x6 grid, 20 caption tokens) through the fixture's transformer", f != NULL,
            "exit %d: %.300s", rc, err);
    if (f) st_close(f);
}

/* ---- bench ---- */

/* `ditrun bench --preset z-image-tiny` on the CPU (ledger only, 2 reps): its JSON lines say Z-Image's geometry, a
 * finite forward and a joint-block ledger whose ops sum to the block (the prefix totals' definition). */
static void test_bench(void) {
    char cmd[2048], err[4096], js[600];
    snprintf(js, sizeof js, "%s/bench.json", serve_tmp);
    snprintf(cmd, sizeof cmd, "%s bench --backend cpu --preset z-image-tiny --reps 2 --warmup 1 --only ledger "
             "--cache-dir %s --json %s", serve_exe, serve_tmp, js);
    int rc = run_err(cmd, err, sizeof err);
    char *t = t_slurp(js, NULL);
    const char *setup = t ? strstr(t, "\"model\":\"zimage\"") : NULL;
    const char *fwd = t ? strstr(t, "\"name\":\"zimage_forward\"") : NULL;
    T_CHECK("bench --preset z-image-tiny: Z-Image setup, finite forward, joint-block ledger", rc == 0 && setup &&
            strstr(t, "\"dim\":32") && fwd && strstr(fwd, "\"finite\":1") && strstr(t, "q/k/v GEMM (stacked)"),
            "exit %d: %.300s / %.300s", rc, err, t ? t : "(no json)");
    free(t);
}

/* ---- serve ---- */

static void test_serve(void) {
    fx("model", serve_model, sizeof serve_model);
    server s;
    if (server_start(&s, "zimage", "") || server_ready(&s)) {
        T_FAIL("serve: Z-Image server starts", "see %s", s.log);
        server_stop(&s);
        return;
    }
    char *body = NULL;
    /* a generation with the cfg options equals `ditrun generate` with the same settings */
    int code = http(&s, "POST", "/v1/images/generations",
                    "{\"prompt\": \"a fox\", \"size\": \"64x48\", \"steps\": 3, \"seed\": 5, \"guidance\": 3, "
                    "\"negative_prompt\": \"blurry\", \"cfg_normalization\": 1, \"cfg_truncation\": 0.3}",
                    NULL, &body, NULL);
    size_t n = 0;
    unsigned char *png = code == 200 ? answer_png(body, 0, &n) : NULL;
    char path[700], gen[700];
    snprintf(path, sizeof path, "%s/served.png", serve_tmp);
    snprintf(gen, sizeof gen, "%s/generated.png", serve_tmp);
    if (png) spit(path, (const char *)png, n);
    int g = serve_generate("-p 'a fox' --width 64 --height 48 --steps 3 --seed 5 --guidance 3 --negative-prompt blurry "
                           "--cfg-normalization 1 --cfg-truncation 0.3", gen);
    dt_image a = {0}, b = {0};
    int same = png && g == 0 && !dt_image_read_file(path, &a) && !dt_image_read_file(gen, &b) && a.w == 64 &&
               a.h == 48 && b.w == a.w && b.h == a.h && !memcmp(a.px, b.px, (size_t)3 * a.w * a.h);
    T_CHECK("serve: cfg_normalization / cfg_truncation generation equals ditrun generate's image", same,
            "HTTP %d, generate %d, %dx%d vs %dx%d: %.200s", code, g, a.w, a.h, b.w, b.h, body ? body : "");
    dt_image_free(&a);
    dt_image_free(&b);
    free(png);
    free(body);
    body = NULL;
    char *hdr = NULL;   /* "cache" per request: 6 guided steps, each branch caching 4 (its first and last computed) */
    code = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"size\": \"64x48\", \"steps\": 6, "
                "\"guidance\": 3, \"cache\": \"first-block=1000000\"}", NULL, &body, &hdr);
    T_CHECK("serve: \"cache\" on Z-Image: Server-Timing says 4 of 12 passes computed", code == 200 && hdr &&
            strstr(hdr, "passes;desc=\"4 of 12 computed\""), "HTTP %d: %.300s %.300s", code, hdr ? hdr : "",
            body ? body : "");
    free(hdr);
    free(body);
    /* /v1/models says what this family takes */
    body = NULL;
    code = http(&s, "GET", "/v1/models", NULL, NULL, &body, NULL);
    T_CHECK("serve: /v1/models says z-image, img2img and cfg_shaping", code == 200 && body &&
            strstr(body, "\"family\": \"z-image\"") && strstr(body, "\"img2img\": true") &&
            strstr(body, "\"cfg_shaping\": true"), "HTTP %d: %.300s", code, body ? body : "");
    free(body);
    /* bad values: 400 naming the field */
    static const char *const bad[][2] = {
        {"{\"prompt\": \"x\", \"size\": \"64x48\", \"cfg_truncation\": \"high\"}", "cfg_truncation"},
        {"{\"prompt\": \"x\", \"size\": \"64x48\", \"cfg_normalization\": -1}", "cfg_normalization"},
        {"{\"prompt\": \"x\", \"size\": \"64x48\", \"cfg_normalization\": 101}", "cfg_normalization"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        body = NULL;
        code = http(&s, "POST", "/v1/images/generations", bad[i][0], NULL, &body, NULL);
        char name[200];
        snprintf(name, sizeof name, "serve: 400 for %s", bad[i][0]);
        T_CHECK(name, code == 400 && body && strstr(body, bad[i][1]), "HTTP %d: %s", code, body ? body : "");
        free(body);
    }
    /* an edit with one image and no mask: img2img at the image's size */
    char extra[1400], ip[600];
    snprintf(extra, sizeof extra, "-F 'image[]=@%s' -F 'prompt=a fox' -F steps=4 -F strength=0.6 -F seed=3",
             fx("init.png", ip, sizeof ip));
    body = NULL;
    code = http(&s, "POST", "/v1/images/edits", NULL, extra, &body, NULL);
    png = code == 200 ? answer_png(body, 0, &n) : NULL;
    dt_image e = {0};
    T_CHECK("serve: an edit without a mask is img2img at the init image's size", png &&
            !dt_image_decode(png, n, "answer", &e) && e.w == 64 && e.h == 48, "HTTP %d: %.300s", code, body ? body : "");
    dt_image_free(&e);
    free(png);
    free(body);
    server_stop(&s);

    /* the FLUX.2 server refuses the options naming its family */
    snprintf(serve_model, sizeof serve_model, "%s/model", t_fixtures());
    if (server_start(&s, "klein", "") || server_ready(&s)) {
        T_FAIL("serve: FLUX.2 server starts", "see %s", s.log);
        server_stop(&s);
        return;
    }
    body = NULL;
    code = http(&s, "POST", "/v1/images/generations", "{\"prompt\": \"x\", \"cfg_truncation\": 0.5}", NULL, &body, NULL);
    T_CHECK("serve: FLUX.2 answers 400 to cfg_truncation, naming its family", code == 400 && body &&
            strstr(body, "cfg_truncation") && strstr(body, "flux2-klein"), "HTTP %d: %s", code, body ? body : "");
    free(body);
    server_stop(&s);
}

/* ---- the C API ---- */

static void test_c_api(void) {
    char m[600], p[600];
    ditrun_engine *e = ditrun_engine_create("cpu", 1);
    ditrun_load_opts lo = ditrun_load_defaults();
    lo.model = fx("model", m, sizeof m);
    ditrun_pipeline *pl = e ? ditrun_pipeline_load(e, &lo) : NULL;
    if (!pl) { T_FAIL("api: load the ZImagePipeline folder", "%s", ditrun_last_error()); ditrun_engine_free(e); return; }
    ditrun_pipeline_info in = ditrun_pipeline_describe(pl);
    T_CHECK("api: describe says z-image, img2img, cfg shaping", !strcmp(in.family, "z-image") && in.img2img &&
            in.cfg_shaping && in.editing, "%s %d %d", in.family, in.img2img, in.cfg_shaping);
    /* the guidance-0 pipeline from the reference's initial latents (the noise array) */
    st_file *io = st_open(fx("pipeline_io.safetensors", p, sizeof p));
    const st_tensor *t = io ? st_find(io, "in.initial_latents") : NULL;
    float *noise = t ? st_to_f32(t) : NULL;
    ditrun_generate_opts o = ditrun_generate_defaults();
    o.prompt = PROMPT;
    o.width = 64;
    o.height = 48;
    o.steps = 3;
    o.guidance = 0;
    o.max_sequence_length = 64;
    o.noise = noise;
    o.noise_len = t ? t->numel : 0;
    ditrun_image img = {0};
    int rc = noise ? ditrun_pipeline_generate(pl, &o, &img) : -1;
    if (rc || img.width != 64 || img.height != 48) T_FAIL("api: pipeline", "rc %d (%s)", rc, ditrun_last_error());
    else check_ref_pixels("api: guidance-0 pipeline from the reference's noise vs its pixels", img.rgb, 3 * 64 * 48,
                          "pipeline_io.safetensors");
    ditrun_image_free(&img);
    /* img2img: the init image as bytes in memory */
    size_t len = 0;
    char *bytes = t_slurp(fx("init.png", p, sizeof p), &len);
    ditrun_image_input init = {.data = bytes, .size = len, .name = "init.png"};
    o = ditrun_generate_defaults();
    o.prompt = PROMPT;
    o.steps = 4;
    o.guidance = 0;
    o.strength = 0.6;
    o.init_image = &init;
    rc = ditrun_pipeline_generate(pl, &o, &img);
    T_CHECK("api: img2img from an in-memory init image, its size", rc == 0 && img.width == 64 && img.height == 48,
            "rc %d (%s), %dx%d", rc, ditrun_last_error(), img.width, img.height);
    ditrun_image_free(&img);
    free(bytes);
    free(noise);
    if (io) st_close(io);
    ditrun_pipeline_free(pl);
    ditrun_engine_free(e);
}

int main(void) {
    serve_setup();
    if (!zimage_fixtures_present()) {
        T_SKIP("zimage front ends", "%s is absent (tools/zimage_reference.py writes it)", g_dir);
        return T_DONE();
    }
    if (access(serve_exe, X_OK)) { T_SKIP("zimage front ends", "%s not built", serve_exe); return T_DONE(); }
    if (t_tmpdir(serve_tmp, sizeof serve_tmp, "zimage-cli")) { T_FAIL("setup", "no temp folder"); return T_DONE(); }
    test_cli();
    test_formats();
    test_bench();
    test_serve();
    test_c_api();
    t_rmtree(serve_tmp);
    return T_DONE();
}
