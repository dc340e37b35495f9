/* test_placement.c — the device-memory placement planner (pipeline/placement.h) on the CPU: which parts stay
 * resident, whether the VAE is tiled, the predicted phase peaks, and the one-line error naming the smallest workable
 * budget, for a one-shot run and a resident pipeline at sizes whose phases are worked out by hand below; the sizes
 * of the bundled pipelines (dt_place_sizes_for) and `ditrun info --size --max-vram`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "io/weights.h"
#include "models/vae_flux2.h"
#include "models/vae_qwenimage.h"
#include "pipeline/budget.h"
#include "pipeline/placement.h"
#include "model_dirs.h"
#include "serve_helpers.h"
#include "test.h"

/* $BUILD/ditrun (build/ditrun without BUILD), as make test runs it */
static const char *exe_dir(void) {
    const char *b = getenv("BUILD");
    return b && *b ? b : "build";
}

#define GiB (1LL << 30)
#define G10(x) ((int64_t)((x) * GiB / 10))   /* x tenths of a GiB: exact sums in the checks */

/* A text encoder of 8 GiB, a 2 GiB transformer, a 0.2 GiB VAE; activations: encode 0.5, a forward 1.0, the untiled
 * decode 8.0 (a large image), one tile 1.5. */
static dt_place_sizes sizes(int resident) {
    dt_place_sizes s = {.text_encoder = G10(80), .transformer = G10(20), .vae = G10(2), .te_act = G10(5),
                        .dit_act = G10(10), .vae_act = G10(80), .vae_tile_act = G10(15), .resident = resident};
    return s;
}

static void expect(const char *name, int64_t budget, const dt_place_sizes *s, int ok, int rel, int tiled, int64_t peak) {
    dt_place_plan p;
    int rc = dt_place_plan_make(budget, s, &p);
    T_CHECK(name, (rc == 0) == ok && p.release_text_encoder == rel && p.vae_tiling == tiled && p.peak == peak,
            "rc %d release %d tiled %d peak %lld (want ok %d release %d tiled %d peak %lld)", rc, p.release_text_encoder,
            p.vae_tiling, (long long)p.peak, ok, rel, tiled, (long long)peak);
}

/* Runs cmd (stdout and stderr to tmp/out.txt, tmp/err.txt): its exit status (-1 when it did not exit). */
static int run(const char *tmp, const char *cmd) {
    char full[3000];
    snprintf(full, sizeof full, "%s > %s/out.txt 2> %s/err.txt", cmd, tmp, tmp);
    int st = system(full);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *tmp_file(const char *tmp, const char *name) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", tmp, name);
    return t_slurp(p, NULL);
}

static int same_file(const char *tmp, const char *a, const char *b) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", tmp, a);
    snprintf(pb, sizeof pb, "%s/%s", tmp, b);
    size_t na = 0, nb = 0;
    char *x = t_slurp(pa, &na), *y = t_slurp(pb, &nb);
    int r = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return r;
}

/* The plan acted on (pipeline/budget.h): dt_budget_apply's load options for budgets around the bundled pipeline's
 * plans, the CLI's refusal of bad sizes in every command that takes --max-vram, the exact one-line refusal before
 * loading (generate, generate --count, serve), and images made under a budget: the VAE tiled exactly as
 * --vae-tiling, the text encoder reloaded per prompt with the same pixels. */
static void budget_tests(const char *tmp) {
    char root[600], cmd[2000];
    snprintf(root, sizeof root, "%s/model", t_fixtures());
    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){0});
    const int elem = (int)dt_dtype_size(be->act_dtype);
    /* one image of 128x128, 32 text tokens, 64 px tiles: the untiled decode is the peak, tiling lowers it */
    dt_place_sizes s;
    dt_place_plan untiled, tiled;
    int ok = dt_place_sizes_for(root, 128, 128, 32, elem, 64, 0, 1, &s) == 0;
    ok = ok && dt_place_plan_make(0, &s, &untiled) == 0 && dt_place_plan_make(untiled.peak - 1, &s, &tiled) == 0;
    T_CHECK("budget_fixture_tiles", ok && !untiled.vae_tiling && tiled.vae_tiling && tiled.peak < untiled.peak,
            "the bundled pipeline at 128x128 has no budget that needs tiling (%s)", ok ? "peaks" : dt_last_error());
    int prev = dt_log_level;
    dt_log_level = 0;
    for (int k = 0; k < 3 && ok; k++) {   /* no budget, the untiled peak exactly, one byte less */
        const int64_t b = k == 0 ? 0 : k == 1 ? untiled.peak : untiled.peak - 1;
        dt_pipeline_opts o;
        dt_pipeline_opts_default(&o);
        o.model = root;
        o.vae_tile = 64;
        o.max_vram = b;
        dt_place_plan pl;
        int rc = dt_budget_apply(be, &o, 128, 128, 32, 0, &pl);
        char name[64];
        snprintf(name, sizeof name, "budget_apply_oneshot_%d", k);
        T_CHECK(name, rc == 0 && o.vae_tiling == (k == 2) && pl.vae_tiling == (k == 2) &&
                          o.release_text_encoder == (b > 0),   /* (one image: always released under a budget) */
                "budget %lld: rc %d tiling %d", (long long)b, rc, o.vae_tiling);
    }
    /* a loaded pipeline at 64x64 (one tile): below everything resident the text encoder is released */
    dt_place_plan res, rel;
    int rok = dt_place_sizes_for(root, 64, 64, 32, elem, 0, 1, 1, &s) == 0 && dt_place_plan_make(0, &s, &res) == 0 &&
              dt_place_plan_make(res.peak - 1, &s, &rel) == 0;
    T_CHECK("budget_fixture_releases", rok && !res.release_text_encoder && rel.release_text_encoder && rel.peak < res.peak,
            "the bundled pipeline at 64x64 has no budget that releases the text encoder");
    if (rok) {
        dt_pipeline_opts o;
        dt_pipeline_opts_default(&o);
        o.model = root;
        o.max_vram = rel.peak;
        int rc = dt_budget_apply(be, &o, 64, 64, 32, 1, NULL);
        T_CHECK("budget_apply_resident_releases", rc == 0 && o.release_text_encoder && !o.vae_tiling, "rc %d release %d",
                rc, o.release_text_encoder);
        o.max_vram = rel.peak - 1;
        o.release_text_encoder = 0;
        rc = dt_budget_apply(be, &o, 64, 64, 32, 1, NULL);
        char want[200], b1[32], b2[32];
        snprintf(want, sizeof want, "64x64: memory budget %s is below the smallest workable %s for this model and size",
                 dt_place_bytes(rel.peak - 1, b1, sizeof b1), dt_place_bytes(rel.peak, b2, sizeof b2));
        T_CHECK("budget_apply_refuses", rc == -1 && strstr(dt_last_error(), want), "rc %d: %s (want %s)", rc,
                dt_last_error(), want);
    }
    dt_log_level = prev;
    be->destroy(be);

    /* bad sizes: every command that takes --max-vram refuses them before any work, naming the option */
    const char *bad[] = {"0", "-4G", "12x", "G", "1.5Q", "8GB2", ""};
    const char *cmds[] = {"generate -p x -o %s/bad.png", "serve --port 0", "forward --inputs %s/none.safetensors "
                          "--output %s/o.safetensors", "bench"};
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++)
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            char sub[600];
            snprintf(sub, sizeof sub, cmds[c], tmp, tmp);
            snprintf(cmd, sizeof cmd, "timeout 60 %s/ditrun %s --backend cpu --max-vram '%s'", exe_dir(), sub, bad[k]);
            int st = run(tmp, cmd);
            char *err = tmp_file(tmp, "err.txt"), name[64], want[80];
            snprintf(want, sizeof want, "--max-vram: '%s' is not a size like 12G", bad[k]);
            snprintf(name, sizeof name, "bad_size_%.8s_%zu", cmds[c], k);
            T_CHECK(name, st == 1 && err && strstr(err, want) && !strchr(strchr(err, '\n') + 1, '\n'),
                    "%s: status %d, stderr: %s", cmd, st, err ? err : "(none)");
            free(err);
        }

    /* the exact refusal of generate, one line, nothing written: the smallest workable of the plan at 64x64 */
    dt_place_sizes s64;
    dt_place_plan p64;
    dt_place_sizes_for(root, 64, 64, 32, elem, 0, 0, 1, &s64);
    dt_place_plan_make(0, &s64, &p64);
    char b1[32], want[400];
    snprintf(want, sizeof want, "ditrun: error: 64x64: memory budget 1.0 KiB is below the smallest workable %s for this "
             "model and size (text encoder released, VAE untiled)\n", dt_place_bytes(p64.peak, b1, sizeof b1));
    snprintf(cmd, sizeof cmd, "%s/ditrun generate --model %s -p x -o %s/r.png --backend cpu -q --width 64 --height 64 "
             "--max-sequence-length 32 --max-vram 1K", exe_dir(), root, tmp);
    int st = run(tmp, cmd);
    char *err = tmp_file(tmp, "err.txt"), *png = tmp_file(tmp, "r.png");
    T_CHECK("generate_refusal_exact", st == 1 && err && !strcmp(err, want) && !png, "status %d, stderr '%s' (want '%s')",
            st, err ? err : "", want);
    free(err);
    free(png);
    /* --count plans a loaded pipeline: refused the same way, with the loaded pipeline's smallest */
    snprintf(cmd, sizeof cmd, "%s/ditrun generate --model %s -p x -o %s/r.png --backend cpu -q --width 64 --height 64 "
             "--max-sequence-length 32 --count 2 --max-vram %lld", exe_dir(), root, tmp, (long long)(rel.peak - 1));
    st = run(tmp, cmd);
    err = tmp_file(tmp, "err.txt");
    snprintf(want, sizeof want, "is below the smallest workable %s", dt_place_bytes(rel.peak, b1, sizeof b1));
    T_CHECK("generate_count_refusal", st == 1 && err && strstr(err, want), "status %d, stderr %s", st, err ? err : "");
    free(err);
    /* serve: refused before the models load, naming the size it plans for */
    snprintf(cmd, sizeof cmd, "timeout 60 %s/ditrun serve --model %s --port 0 --backend cpu --max-pixels 4096 "
             "--max-sequence-length 32 --max-vram 1K", exe_dir(), root);
    double t0 = dt_now();
    st = run(tmp, cmd);
    err = tmp_file(tmp, "err.txt");
    T_CHECK("serve_refusal", st == 1 && err && strstr(err, "64x64: memory budget 1.0 KiB is below the smallest workable") &&
                                 strstr(err, "--max-pixels 4096") && !strstr(err, "loaded on"),
            "status %d after %.1f s, stderr %s", st, dt_now() - t0, err ? err : "");
    free(err);

    /* a budget that needs tiling: the image is the --vae-tiling one, byte for byte (and tiling changes it here) */
    if (ok) {
        const char *arm[3] = {"", "--vae-tiling --vae-tile-size 64", ""};   /* (a tile size alone asks for tiles) */
        char extra[80];
        snprintf(extra, sizeof extra, "--vae-tile-size 64 --max-vram %lld", (long long)tiled.peak);
        arm[2] = extra;
        for (int k = 0; k < 3; k++) {
            snprintf(cmd, sizeof cmd, "%s/ditrun generate --model %s -p 'a fox' -o %s/t%d.png --backend cpu "
                     "--width 128 --height 128 --max-sequence-length 32 --steps 1 %s", exe_dir(), root,
                     tmp, k, arm[k]);
            st = run(tmp, cmd);
            if (st) T_FAIL("budget_tiles_image", "%s: status %d", cmd, st);
        }
        err = tmp_file(tmp, "err.txt");
        T_CHECK("budget_tiles_image", same_file(tmp, "t1.png", "t2.png") && !same_file(tmp, "t0.png", "t1.png") && err &&
                                          strstr(err, "memory plan at 128x128 within") && strstr(err, "VAE tiled"),
                "budget image == tiled %d, untiled == tiled %d; log %s", same_file(tmp, "t1.png", "t2.png"),
                same_file(tmp, "t0.png", "t1.png"), err ? err : "");
        free(err);
    }
    /* --count 2 under a budget that releases the text encoder: logged, and the same two images as without */
    if (rok) {
        for (int k = 0; k < 2; k++) {
            char extra[80] = "";
            if (k) snprintf(extra, sizeof extra, "--max-vram %lld", (long long)rel.peak);
            snprintf(cmd, sizeof cmd, "%s/ditrun generate --model %s -p 'a fox' -o %s/c%d.png --backend cpu --width 64 "
                     "--height 64 --max-sequence-length 32 --steps 1 --count 2 %s", exe_dir(), root, tmp, k, extra);
            st = run(tmp, cmd);
            if (st) T_FAIL("budget_releases_count", "%s: status %d", cmd, st);
        }
        err = tmp_file(tmp, "err.txt");
        T_CHECK("budget_releases_count", same_file(tmp, "c0-1.png", "c1-1.png") && same_file(tmp, "c0-2.png", "c1-2.png") &&
                                             err && strstr(err, "(loaded pipeline) within") &&
                                             strstr(err, "text encoder released"),
                "images equal %d %d; log %s", same_file(tmp, "c0-1.png", "c1-1.png"),
                same_file(tmp, "c0-2.png", "c1-2.png"), err ? err : "");
        free(err);
    }
}

/* Start `serve ...extra` as NAME and wait until it is ready: 0, or -1 after failing TEST with its log. */
static int start_or_fail(server *sv, const char *test, const char *name, const char *extra) {
    if (server_start(sv, name, extra) == 0 && server_ready(sv) == 0) return 0;
    char *log = t_slurp(sv->log, NULL);
    T_FAIL(test, "the server did not start: %s", log ? log : "");
    free(log);
    if (sv->pid) server_stop(sv);
    return -1;
}

/* serve under a budget that keeps everything but the text encoder (64x64, the servers' 8 text tokens): the plan is
 * logged, and two requests with two prompts (the encoder reloaded for the second) give ditrun generate's bytes. */
static void serve_test(const char *tmp) {
    serve_setup();
    snprintf(serve_tmp, sizeof serve_tmp, "%s", tmp);
    dt_place_sizes s;
    dt_place_plan res, rel;
    if (dt_place_sizes_for(serve_model, 64, 64, 8, 4, 0, 1, 1, &s) || dt_place_plan_make(0, &s, &res) ||
        dt_place_plan_make(res.peak - 1, &s, &rel) || !rel.release_text_encoder) {
        T_FAIL("serve_budget", "no budget releases the text encoder (%s)", dt_last_error());
        return;
    }
    char extra[200];
    snprintf(extra, sizeof extra, "--max-pixels 4096 --max-vram %lld", (long long)rel.peak);
    server sv;
    if (start_or_fail(&sv, "serve_budget", "budget", extra)) return;
    const char *prompts[2] = {"a red fox", "a grey owl"};
    int same = 0;
    for (int k = 0; k < 2; k++) {
        char req[200], args[200], ref[600], *body = NULL;
        snprintf(req, sizeof req, "{\"prompt\": \"%s\", \"size\": \"64x64\", \"steps\": 1, \"seed\": 3}", prompts[k]);
        int code = http(&sv, "POST", "/v1/images/generations", req, NULL, &body, NULL);
        size_t n = 0;
        unsigned char *png = answer_png(body, 0, &n);
        snprintf(args, sizeof args, "--prompt '%s' --width 64 --height 64 --steps 1 --seed 3", prompts[k]);
        snprintf(ref, sizeof ref, "%s/serve-ref%d.png", tmp, k);
        size_t rn = 0;
        char *rb = serve_generate(args, ref) == 0 ? t_slurp(ref, &rn) : NULL;
        same += code == 200 && png && rb && rn == n && !memcmp(rb, png, n);
        free(rb);
        free(png);
        free(body);
    }
    server_stop(&sv);
    char *log = t_slurp(sv.log, NULL);
    T_CHECK("serve_budget_releases", same == 2 && log && strstr(log, "memory plan at 64x64 (loaded pipeline) within") &&
                                          strstr(log, "text encoder released"),
            "%d of 2 images equal generate's; log %s", same, log ? log : "");
    free(log);
}

/* What a plan costs a served image of floor_side (the things budget.c weighs), as bits: no fit, host weights, the
 * text encoder reloaded per prompt, two guidance passes, VAE tiles smaller than floor_side. */
static unsigned served_cost(int rc, const dt_place_plan *p, int floor_side) {
    return (rc ? 16u : 0u) | (p->host_weights ? 8u : 0u) | (p->release_text_encoder ? 4u : 0u) |
           (p->guidance_two_passes ? 2u : 0u) | (p->vae_tiling && (p->vae_tile_px <= 0 || p->vae_tile_px < floor_side));
}

/* The log of `serve ...extra` started as NAME that is expected to stop by itself at start (refused): run to its end
 * (stopped if it did come up) and read back (the caller frees it). */
static char *refused_server_log(const char *name, const char *extra) {
    server sv;
    if (server_start(&sv, name, extra) == 0) {
        server_ready(&sv);
        server_stop(&sv);
    }
    return t_slurp(sv.log, NULL);
}

/* serve without --max-pixels under a budget too small for the default largest image (1024x1024 on the CPU) at its
 * plan: it serves the largest side (256 + 64 k, found here by a plain scan from the top) whose plan is 256x256's,
 * says so, reports it as max_pixels, answers an image at 256x256 and refuses one over the side; a warm-up image
 * larger than the largest served is refused at start. */
static void serve_largest_test(const char *tmp) {
    serve_setup();
    snprintf(serve_tmp, sizeof serve_tmp, "%s", tmp);
    dt_place_sizes s;
    dt_place_plan p;
    /* the budget: 512x512's resident plan exactly (f32 activations, the servers' 8 text tokens) */
    if (dt_place_sizes_for(serve_model, 512, 512, 8, 4, 0, 1, 1, &s) || dt_place_plan_make(0, &s, &p)) {
        T_FAIL("serve_largest", "no plan at 512x512 (%s)", dt_last_error());
        return;
    }
    const int64_t budget = p.peak;
    unsigned cost[13];
    for (int k = 0; k <= 12; k++) {   /* sides 256 .. 1024 */
        int rc = dt_place_sizes_for(serve_model, 256 + 64 * k, 256 + 64 * k, 8, 4, 0, 1, 1, &s) ? -1
                 : dt_place_plan_make(budget, &s, &p);
        cost[k] = rc < 0 ? 16u : served_cost(rc, &p, 256);
    }
    dt_clear_error();
    int want = 256;
    for (int k = 12; k >= 0; k--)
        if (!(cost[k] & ~cost[0])) { want = 256 + 64 * k; break; }
    if (want < 512 || want >= 1024) {   /* (the budget was chosen so that 512 fits and 1024 does not) */
        T_FAIL("serve_largest", "the scan found %d (costs at 1024: %u, 256: %u)", want, cost[12], cost[0]);
        return;
    }
    char extra[200], want_log[120], want_json[80];
    snprintf(extra, sizeof extra, "--max-vram %lld", (long long)budget);
    server sv;
    if (start_or_fail(&sv, "serve_largest", "largest", extra)) return;
    char *models = NULL, *ok = NULL, *big = NULL, req[200];
    int cm = http(&sv, "GET", "/v1/models", NULL, NULL, &models, NULL);
    snprintf(req, sizeof req, "{\"prompt\": \"a fox\", \"size\": \"256x256\", \"steps\": 1, \"seed\": 3}");
    int c1 = http(&sv, "POST", "/v1/images/generations", req, NULL, &ok, NULL);
    snprintf(req, sizeof req, "{\"prompt\": \"a fox\", \"size\": \"%dx%d\", \"steps\": 1}", want + 8, want);
    int c2 = http(&sv, "POST", "/v1/images/generations", req, NULL, &big, NULL);
    server_stop(&sv);
    char *log = t_slurp(sv.log, NULL);
    snprintf(want_log, sizeof want_log, "images up to %dx%d (%lld pixels): 1024x1024 ", want, want,
             (long long)want * want);
    snprintf(want_json, sizeof want_json, "\"max_pixels\": %lld", (long long)want * want);
    T_CHECK("serve_largest_side", cm == 200 && models && strstr(models, want_json) && log && strstr(log, want_log) &&
                                      strstr(log, "(--max-pixels 1048576 plans for it anyway)"),
            "models %d %s; log %s", cm, models ? models : "", log ? log : "");
    T_CHECK("serve_largest_answers", c1 == 200 && c2 == 400 && big && strstr(big, "pixels"),
            "256x256: %d; %dx%d: %d %s", c1, want + 8, want, c2, big ? big : "");
    free(models);
    free(ok);
    free(big);
    free(log);
    /* an explicit --max-pixels is planned as asked (here: nothing fits it, refused) */
    snprintf(extra, sizeof extra, "--max-vram %lld --max-pixels 1048576", (long long)budget);
    log = refused_server_log("largest-explicit", extra);
    T_CHECK("serve_largest_explicit", log && strstr(log, "1024x1024: memory budget") && !strstr(log, "images up to"),
            "log %s", log ? log : "");
    free(log);
    /* a budget that not even the default size fits: planned (and refused) at that size, not at the largest */
    log = refused_server_log("largest-none", "--max-vram 1K");
    T_CHECK("serve_largest_none_fits", log && strstr(log, "images up to 256x256 (65536 pixels): 1024x1024 does not fit") &&
                                           strstr(log, "256x256: memory budget 1.0 KiB is below the smallest workable"),
            "log %s", log ? log : "");
    free(log);
    /* a warm-up image larger than the largest served */
    log = refused_server_log("largest-warmup", "--warmup 2048x2048");
    T_CHECK("serve_warmup_too_large", log && strstr(log, "--warmup 2048x2048 is larger than the largest image served "
                                                         "(1048576 pixels; --max-pixels)"),
            "log %s", log ? log : "");
    free(log);
}

int main(void) {
    /* one image: the encoder is released (it runs alone: 8.5); the decode runs beside the transformer's weights and
     * its forward's buffers: untiled 2.2 + 1 + 8 = 11.2, tiled 4.7 */
    char line0[300];
    dt_place_sizes one = sizes(0);
    const int64_t dit = G10(20) + G10(2) + G10(10);   /* transformer, VAE, the forward's buffers */
    expect("oneshot_unbounded", 0, &one, 1, 1, 0, dit + G10(80));
    expect("oneshot_roomy", 12 * GiB, &one, 1, 1, 0, dit + G10(80));
    expect("oneshot_tiles_when_needed", 9 * GiB, &one, 1, 1, 1, G10(85));
    expect("oneshot_exact_fit", G10(85), &one, 1, 1, 1, G10(85));
    expect("oneshot_too_small", 8 * GiB, &one, 0, 1, 1, G10(85));
    dt_place_plan p;
    dt_place_plan_make(8 * GiB, &one, &p);
    T_CHECK("oneshot_error_names_smallest", strstr(dt_last_error(), "8.00 GiB is below the smallest workable 8.50 GiB") &&
                strstr(dt_last_error(), "text encoder released, VAE tiled"),
            "%s", dt_last_error());
    T_CHECK("oneshot_phases", p.phase_peak[DT_PHASE_ENCODE] == G10(85) && p.phase_peak[DT_PHASE_DENOISE] == dit &&
                                  p.phase_peak[DT_PHASE_DECODE] == dit + G10(15) && p.min_budget == G10(85),
            "phases %lld %lld %lld min %lld", (long long)p.phase_peak[0], (long long)p.phase_peak[1],
            (long long)p.phase_peak[2], (long long)p.min_budget);

    /* the guidance batch (two sequences: the forward's buffers 2.0 for 1.0): one image, tiled, denoise 2.2 + 2.0 = 4.2 +
     * one tile 1.5 = 5.7 with the batch, 4.7 without; the batch goes before any other economy: with 10 GiB untiled
     * (2.2 + 2 + 8 = 12.2 with it, 11.2 without) neither fits, tiled with it (5.7 beside the encoder's 8.5) does;
     * with a one-tile image (no tiling) at 11.5 GiB, dropping the batch (11.2) is the plan */
    {
        dt_place_sizes b = sizes(0);
        b.dit_act = G10(20);
        b.dit_batch = 2;
        dt_place_plan q;
        T_CHECK("batch_kept_when_roomy", dt_place_plan_make(13 * GiB, &b, &q) == 0 && !q.guidance_two_passes &&
                                             !q.vae_tiling && q.peak == G10(20) + G10(2) + G10(20) + G10(80),
                "two passes %d tiled %d peak %lld", q.guidance_two_passes, q.vae_tiling, (long long)q.peak);
        T_CHECK("batch_dropped_before_tiling", dt_place_plan_make(G10(115), &b, &q) == 0 && q.guidance_two_passes &&
                                                   !q.vae_tiling && q.peak == dit + G10(80),
                "two passes %d tiled %d peak %lld", q.guidance_two_passes, q.vae_tiling, (long long)q.peak);
        char line[400];
        dt_place_plan_describe(&q, line, sizeof line);
        T_CHECK("batch_dropped_described", strstr(line, "guidance in two passes") != NULL, "%s", line);
        T_CHECK("batch_tiled_with_it", dt_place_plan_make(10 * GiB, &b, &q) == 0 && !q.guidance_two_passes &&
                                           q.vae_tiling && q.peak == G10(85),
                "two passes %d tiled %d peak %lld", q.guidance_two_passes, q.vae_tiling, (long long)q.peak);
        b.dit_batch = 1;
        b.dit_act = G10(10);
        T_CHECK("batch_none_never_two_passes", dt_place_plan_make(G10(115), &b, &q) == 0 && !q.guidance_two_passes,
                "two passes %d", q.guidance_two_passes);
    }

    /* resident: all kept (the encoder's weights and buffers 8.5 beside 3.2) = 11.7 / 11.7 / 19.7; tiled 13.2;
     * encoder released: encode still 11.7 (the transformer is loaded), denoise 3.2, decode 11.2 untiled, 4.7 tiled */
    dt_place_sizes res = sizes(1);
    const int64_t te = G10(80) + G10(5);
    expect("resident_unbounded", 0, &res, 1, 0, 0, te + dit + G10(80));
    expect("resident_roomy", 20 * GiB, &res, 1, 0, 0, te + dit + G10(80));
    expect("resident_tiles_first", 14 * GiB, &res, 1, 0, 1, te + dit + G10(15));
    expect("resident_then_releases", 12 * GiB, &res, 1, 1, 0, te + dit);
    expect("resident_too_small", 11 * GiB, &res, 0, 1, 0, te + dit);
    T_CHECK("resident_error", strstr(dt_last_error(), "smallest workable 11.70 GiB"), "%s", dt_last_error());

    /* an image of one tile: tiling is never chosen (it would change nothing) */
    dt_place_sizes small = sizes(1);
    small.vae_tile_act = 0;
    small.vae_act = G10(5);
    expect("one_tile_never_tiles", te + dit + G10(5), &small, 1, 0, 0, te + dit + G10(5));
    expect("one_tile_releases_instead", te + dit + G10(5) - 1, &small, 1, 1, 0, te + dit);

    /* an image of one tile whose half tile is a candidate: taken only when nothing else fits, named in the line */
    dt_place_sizes half = sizes(0);
    half.vae_tile_act = 0;
    half.vae_small_tile_act = G10(10);
    half.vae_small_tile_px = 512;
    expect("half_tile_untiled_first", dit + G10(80), &half, 1, 1, 0, dit + G10(80));
    expect("half_tile_when_needed", 10 * GiB, &half, 1, 1, 1, G10(85));
    dt_place_plan_make(10 * GiB, &half, &p);
    dt_place_plan_describe(&p, line0, sizeof line0);
    T_CHECK("half_tile_px", p.vae_tile_px == 512 && strstr(line0, "VAE tiled (512 px tiles);"), "%d '%s'", p.vae_tile_px,
            line0);

    /* the decode's grow-only scratch (0.3 untiled, 0.1 per tile): in the decode, and in a loaded pipeline from then
     * on (the next prompt's encode and denoise hold it too) */
    dt_place_sizes sc = sizes(0);
    sc.vae_scratch[0] = G10(3);
    sc.vae_scratch[1] = G10(1);
    dt_place_plan_make(0, &sc, &p);
    T_CHECK("vae_scratch_oneshot", p.phase_peak[DT_PHASE_DENOISE] == dit && p.phase_peak[DT_PHASE_DECODE] == dit + G10(80) + G10(3),
            "denoise %lld decode %lld", (long long)p.phase_peak[1], (long long)p.phase_peak[2]);
    sc.resident = 1;
    dt_place_plan_make(14 * GiB, &sc, &p);   /* resident, tiled: 8.5 + 3.2 + 0.1 held, + 1.5 in the decode */
    T_CHECK("vae_scratch_resident", p.vae_tiling && p.phase_peak[DT_PHASE_ENCODE] == te + dit + G10(1) &&
                                        p.phase_peak[DT_PHASE_DENOISE] == te + dit + G10(1) &&
                                        p.phase_peak[DT_PHASE_DECODE] == te + dit + G10(15) + G10(1),
            "tiled %d phases %lld %lld %lld", p.vae_tiling, (long long)p.phase_peak[0], (long long)p.phase_peak[1],
            (long long)p.phase_peak[2]);

    /* host weights, the last resort: the packed 4/8-bit bytes (7 of the encoder's 8 GiB, 1.8 of the transformer's 2)
     * leave the device; one image at 3 GiB: tiled 0.2 + 0.2 + 1 + 1.5 = 2.9 */
    dt_place_sizes hw = sizes(0);
    hw.te_packed = G10(70);
    hw.transformer_packed = G10(18);
    hw.host_ok = 1;
    const int64_t hw_peak = G10(20) - G10(18) + G10(2) + G10(10) + G10(15);
    expect("host_weights_last_resort", 3 * GiB, &hw, 1, 1, 1, hw_peak);
    dt_place_plan_make(3 * GiB, &hw, &p);
    dt_place_plan_describe(&p, line0, sizeof line0);
    T_CHECK("host_weights_plan", p.host_weights && p.phase_peak[DT_PHASE_ENCODE] == G10(80) - G10(70) + G10(5) &&
                                     strstr(line0, "VAE tiled, 4/8-bit weights in host memory;"),
            "host %d encode %lld '%s'", p.host_weights, (long long)p.phase_peak[0], line0);
    dt_place_plan_make(9 * GiB, &hw, &p);
    T_CHECK("host_weights_not_before_needed", !p.host_weights && p.peak == G10(85), "host %d peak %lld", p.host_weights,
            (long long)p.peak);
    T_CHECK("host_weights_smallest", dt_place_plan_make(2 * GiB, &hw, &p) == -1 && p.min_budget == hw_peak &&
                                         strstr(dt_last_error(), "VAE tiled, 4/8-bit weights in host memory)"),
            "%s", dt_last_error());
    hw.host_ok = 0;   /* another backend, or --qpath cached / mixed */
    expect("host_weights_not_ok", 3 * GiB, &hw, 0, 1, 1, G10(85));

    /* a transformer that does not fit with its forward, without host weights (host_ok 0): no plan */
    dt_place_sizes big = sizes(0);
    big.transformer = 30 * GiB;
    expect("transformer_too_big", 24 * GiB, &big, 0, 1, 1, 30 * GiB + G10(2) + G10(10) + G10(15));

    /* the backend's workspaces in every phase; the dequantized-weight buffers: the text encoder's alone while it
     * runs first (one-shot), the larger of the two once the transformer has loaded (grow-only) */
    dt_place_sizes q = sizes(0);
    q.workspace = G10(1);
    q.te_qbuf = G10(2);
    q.dit_qbuf = G10(3);
    dt_place_plan_make(0, &q, &p);
    T_CHECK("workspace_and_qbuf_oneshot", p.phase_peak[DT_PHASE_ENCODE] == G10(1) + G10(80) + G10(5) + G10(2) &&
                                              p.phase_peak[DT_PHASE_DENOISE] == G10(1) + G10(20) + G10(2) + G10(3) + G10(10) &&
                                              p.phase_peak[DT_PHASE_DECODE] == G10(1) + G10(20) + G10(2) + G10(3) + G10(10) + G10(80) &&
                                              p.peak == p.phase_peak[DT_PHASE_DECODE],
            "phases %lld %lld %lld", (long long)p.phase_peak[0], (long long)p.phase_peak[1], (long long)p.phase_peak[2]);
    q.resident = 1;   /* the next prompt is encoded with the transformer's buffers held: 0.1 + 8.5 + 2.2 + 0.3 + 1 */
    dt_place_plan_make(0, &q, &p);
    T_CHECK("workspace_and_qbuf_resident", p.phase_peak[DT_PHASE_ENCODE] == G10(1) + te + G10(20) + G10(2) + G10(3) + G10(10) &&
                                               p.peak == G10(1) + te + G10(20) + G10(2) + G10(3) + G10(10) + G10(80),
            "encode %lld peak %lld", (long long)p.phase_peak[0], (long long)p.peak);

    char line[256];
    dt_place_plan_make(9 * GiB, &one, &p);
    dt_place_plan_describe(&p, line, sizeof line);
    T_CHECK("describe", !strcmp(line, "text encoder released, VAE tiled; predicted peak 8.50 GiB (encode 8.50 GiB, "
                                      "denoise 3.20 GiB, decode 4.70 GiB); smallest workable 8.50 GiB"),
            "'%s'", line);
    char b[32];
    T_CHECK("bytes_mib", !strcmp(dt_place_bytes(300LL << 20, b, sizeof b), "300.0 MiB"), "'%s'", b);

    /* the bundled pipelines' sizes: weights = the files' bytes (f32 at 2 bytes for bf16 activations), the VAE decode
     * exactly its config's count (untiled; tiled with 64 px tiles at 256x192), one tile's only when it tiles */
    char root[600], dir[700];
    const char *roots[2] = {"model", "krea2"};
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "sizes_%s", roots[k]);
        snprintf(root, sizeof root, "%s/%s", t_fixtures(), roots[k]);
        dt_place_sizes ps;
        if (dt_place_sizes_for(root, 256, 192, 64, 2, 64, 1, 1, &ps)) { T_FAIL(name, "%s", dt_last_error()); continue; }
        snprintf(dir, sizeof dir, "%s/transformer", root);
        dt_weights *w = dt_weights_open(dir);
        int64_t tb = 0;
        for (size_t i = 0; w && i < dt_weights_count(w); i++) {
            const st_tensor *t = dt_weights_at(w, i);
            tb += t->dtype == DT_F32 ? (int64_t)t->nbytes / 2 : (int64_t)t->nbytes;
        }
        dt_weights_close(w);
        snprintf(dir, sizeof dir, "%s/vae", root);
        int64_t va, vt;
        if (k == 0) {
            dt_vae_config c;
            dt_vae_read_config(dir, &c);
            va = dt_vae_decode_act_bytes(&c, 0, 192 / 4, 256 / 4, 2);
            vt = dt_vae_decode_act_bytes(&c, 64, 192 / 4, 256 / 4, 2);
        } else {
            static dt_qvae_config c;
            dt_qvae_read_config(dir, &c);
            va = dt_qvae_decode_act_bytes(&c, 0, 192 / 4, 256 / 4, 2);
            vt = dt_qvae_decode_act_bytes(&c, 64, 192 / 4, 256 / 4, 2);
        }
        T_CHECK(name, ps.transformer == tb && ps.text_encoder > 0 && ps.vae > 0 && ps.vae_act == va && ps.vae_tile_act == vt &&
                          vt < va && ps.dit_act > 0 && ps.te_act > 0 && ps.resident == 1,
                "transformer %lld (files %lld), vae act %lld (%lld), tile %lld (%lld)", (long long)ps.transformer,
                (long long)tb, (long long)ps.vae_act, (long long)va, (long long)ps.vae_tile_act, (long long)vt);
        snprintf(name, sizeof name, "sizes_%s_one_tile", roots[k]);
        T_CHECK(name, dt_place_sizes_for(root, 64, 64, 64, 2, 64, 0, 1, &ps) == 0 && ps.vae_tile_act == 0,
                "a 64x64 image with 64 px tiles has a tile size %lld", (long long)ps.vae_tile_act);
    }
    /* the guidance batch: a pipeline that runs guidance (Krea 2's fixture, FLUX.2's fixture as a base model) runs a
     * guided step's two passes in one forward (twice the rows: the forward's activations exactly doubled, and the
     * plan's denoise peak grows by them); a distilled one (FLUX.2's fixture) runs no guidance (unchanged);
     * --guidance-batch off (guidance_batch 0) plans one sequence */
    char base[512];
    static const char *const parts[] = {"scheduler", "text_encoder", "tokenizer", "transformer", "vae", NULL};
    char fx[600];
    snprintf(fx, sizeof fx, "%s/model", t_fixtures());
    const int have_base = t_tmpdir(base, sizeof base, "placement-base") == 0 &&
                          (rmdir(base), linked_pipeline_root(base, fx, parts,
                                        "{\"_class_name\": \"Flux2KleinPipeline\", \"is_distilled\": false}\n")) == 0;
    if (!have_base) T_FAIL("sizes_guidance_batch", "cannot link a base FLUX.2 pipeline into %s", base);
    for (int k = 0; k < 3; k++) {
        char name[128];
        if (k == 2 && !have_base) break;
        if (k < 2) snprintf(root, sizeof root, "%s/%s", t_fixtures(), roots[k]);
        else snprintf(root, sizeof root, "%s", base);
        dt_place_sizes on, off;
        dt_place_plan pon, poff;
        int ok = dt_place_sizes_for(root, 256, 192, 64, 2, 0, 0, 1, &on) == 0 &&
                 dt_place_sizes_for(root, 256, 192, 64, 2, 0, 0, 0, &off) == 0 && dt_place_plan_make(0, &on, &pon) == 0 &&
                 dt_place_plan_make(0, &off, &poff) == 0;
        const int batched = k > 0;
        snprintf(name, sizeof name, "sizes_%s_guidance_batch: forward activations %s", k < 2 ? roots[k] : "flux2_base",
                 batched ? "doubled (2 sequences), denoise peak grows by them" : "unchanged (distilled: no guidance)");
        T_CHECK(name, ok && on.dit_batch == (batched ? 2 : 1) && off.dit_batch == 1 &&
                          on.dit_act == (batched ? 2 : 1) * off.dit_act &&
                          pon.phase_peak[DT_PHASE_DENOISE] - poff.phase_peak[DT_PHASE_DENOISE] == on.dit_act - off.dit_act,
                "batch %d / %d, activations %lld / %lld, denoise %lld / %lld", on.dit_batch, off.dit_batch,
                (long long)on.dit_act, (long long)off.dit_act, (long long)pon.phase_peak[DT_PHASE_DENOISE],
                (long long)poff.phase_peak[DT_PHASE_DENOISE]);
    }
    if (have_base) t_rmtree(base);
    /* no tile asked: the default tile (FLUX.2: sample_size 1024, one tile at 768x768) and the half tile (512) */
    {
        snprintf(root, sizeof root, "%s/model", t_fixtures());
        snprintf(dir, sizeof dir, "%s/vae", root);
        dt_vae_config c;
        dt_place_sizes ps;
        int ok = dt_vae_read_config(dir, &c) == 0 && dt_place_sizes_for(root, 768, 768, 64, 2, 0, 0, 1, &ps) == 0;
        const int64_t want = ok ? dt_vae_decode_act_bytes(&c, 512, 768 / c.scale_factor, 768 / c.scale_factor, 2) : -1;
        T_CHECK("sizes_half_tile", ok && ps.vae_tile_px == 1024 && ps.vae_tile_act == 0 && ps.vae_small_tile_px == 512 &&
                                       ps.vae_small_tile_act == want && want > 0 && want < ps.vae_act,
                "tile %d (%lld), half %d (%lld, want %lld)", ok ? ps.vae_tile_px : -1, ok ? (long long)ps.vae_tile_act : -1,
                ok ? ps.vae_small_tile_px : -1, ok ? (long long)ps.vae_small_tile_act : -1, (long long)want);
    }
    /* a q4 transformer (ditrun quantize of the fixture's): its packed weights with the scales and biases as the
     * device's f32 pairs, all of it what host weights move off the device */
    {
        char q[300], cmd[1600];
        if (t_tmpdir(q, sizeof q, "placement-q4") == 0) {
            snprintf(cmd, sizeof cmd, "mkdir -p %s/p/transformer && %s/ditrun quantize -q --input %s/model/transformer "
                     "--output %s/p/transformer/model.safetensors --bits 4 --group-size 32 > /dev/null 2>&1 && "
                     "f=$(cd %s/model && pwd) && cd %s/p && for d in text_encoder vae tokenizer scheduler "
                     "model_index.json; do ln -s $f/$d .; done", q, exe_dir(), t_fixtures(), q, t_fixtures(), q);
            int st = system(cmd);
            snprintf(root, sizeof root, "%s/p", q);
            snprintf(dir, sizeof dir, "%s/p/transformer", q);
            dt_place_sizes ps;
            dt_weights *w = st == 0 ? dt_weights_open(dir) : NULL;
            int64_t packed = 0, other = 0;
            int n_u32 = 0;
            for (size_t i = 0; w && i < dt_weights_count(w); i++) {
                const st_tensor *t = dt_weights_at(w, i);
                const size_t ln = strlen(t->name);
                if (t->dtype == DT_U32) packed += (int64_t)t->nbytes, n_u32++;
                else if (ln > 7 && (!strcmp(t->name + ln - 7, ".scales") || !strcmp(t->name + ln - 7, ".biases")))
                    packed += t->numel * 4;   /* bf16 in the file, f32 on the device */
                else other += t->dtype == DT_F32 ? (int64_t)t->nbytes / 2 : (int64_t)t->nbytes;
            }
            dt_weights_close(w);
            int rc = st == 0 ? dt_place_sizes_for(root, 64, 64, 32, 2, 0, 0, 1, &ps) : -1;
            T_CHECK("sizes_q4_packed", rc == 0 && n_u32 > 0 && ps.transformer_packed == packed &&
                                           ps.transformer == packed + other && ps.te_packed == 0 && ps.dit_qbuf > 0,
                    "status %d rc %d: packed %lld (want %lld), transformer %lld (want %lld)", st, rc,
                    rc ? -1LL : (long long)ps.transformer_packed, (long long)packed,
                    rc ? -1LL : (long long)ps.transformer, (long long)(packed + other));
            t_rmtree(q);
        } else {
            T_FAIL("sizes_q4_packed", "no temporary folder");
        }
    }
    snprintf(root, sizeof root, "%s/edit", t_fixtures());
    T_CHECK("sizes_not_a_pipeline", dt_place_sizes_for(root, 64, 64, 64, 2, 0, 0, 1, &one) != 0, "sized a folder of images");

    /* ditrun info: the plan lines, and exit 1 with the smallest workable budget under a budget too small */
    char tmp[300], cmd[1200];
    if (t_tmpdir(tmp, sizeof tmp, "placement")) { T_FAIL("info_plan", "no temporary folder"); return T_DONE(); }
    snprintf(cmd, sizeof cmd, "%s/ditrun info %s/model --size 512x512 > %s/out.txt 2> %s/err.txt", exe_dir(), t_fixtures(), tmp, tmp);
    int st = system(cmd);
    snprintf(dir, sizeof dir, "%s/out.txt", tmp);
    char *out = t_slurp(dir, NULL);
    T_CHECK("info_plan", WIFEXITED(st) && WEXITSTATUS(st) == 0 && out && strstr(out, "memory at 512x512") &&
                             strstr(out, "plan (generate, budget none): text encoder released, VAE untiled") &&
                             strstr(out, "plan (serve, budget none): text encoder resident"),
            "status %d, output: %s", st, out ? out : "(none)");
    free(out);
    snprintf(cmd, sizeof cmd, "%s/ditrun info %s/model --size 512x512 --max-vram 1M > %s/out.txt 2> %s/err.txt",
             exe_dir(), t_fixtures(), tmp, tmp);
    st = system(cmd);
    snprintf(dir, sizeof dir, "%s/err.txt", tmp);
    char *err = t_slurp(dir, NULL);
    T_CHECK("info_budget_too_small", WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && strstr(err, "--max-vram 1.0 MiB") &&
                                         !strchr(strchr(err, '\n') + 1, '\n'),
            "status %d, stderr: %s", st, err ? err : "(none)");
    free(err);
    snprintf(dir, sizeof dir, "%s/out.txt", tmp);
    out = t_slurp(dir, NULL);
    T_CHECK("info_budget_names_smallest", out && strstr(out, "is below the smallest workable"), "output: %s",
            out ? out : "(none)");
    free(out);
    /* generate --max-vram: a malformed size, and a budget nothing fits (refused before loading, one line) */
    const char *cases[2][3] = {{"12x", "is not a size like 12G", "generate_max_vram_malformed"},
                               {"1K", "below the smallest workable", "generate_max_vram_too_small"}};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s/ditrun generate --model %s/model -p x -o %s/x.png --backend cpu -q --max-vram %s "
                 "> /dev/null 2> %s/err.txt", exe_dir(), t_fixtures(), tmp, cases[k][0], tmp);
        st = system(cmd);
        snprintf(dir, sizeof dir, "%s/err.txt", tmp);
        err = t_slurp(dir, NULL);
        snprintf(dir, sizeof dir, "%s/x.png", tmp);
        T_CHECK(cases[k][2], WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && strstr(err, cases[k][1]) &&
                                 access(dir, F_OK) != 0,
                "status %d, stderr: %s", st, err ? err : "(none)");
        free(err);
    }
    budget_tests(tmp);
    serve_test(tmp);
    serve_largest_test(tmp);
    t_rmtree(tmp);
    return T_DONE();
}
