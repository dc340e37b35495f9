/* test_sp_generate.c — whole generations with the DiT split over N thread ranks on the CPU (dt_pipeline_opts
 * .sequence_parallel, `ditrun generate --sequence-parallel N`) against the unsplit ones: every step's latents and the
 * decoded pixels. A pipeline whose transformer has 6 heads (the tiny fixture's tokenizer, text encoder, VAE and
 * scheduler around a synthetic 6-head DiT) runs N = 2, 3, 4 on 63 image tokens and 23 text tokens (divisible by none
 * of 2 and 4), a second size on the same loaded pipeline, and classifier-free guidance (two resident prompts); the
 * bundled tiny pipeline runs N = 2 one-shot and through the CLI; the CLI's errors. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ditrun.h"
#include "image/image.h"
#include "model_dirs.h"
#include "models/flux2.h"
#include "pipeline/engine.h"
#include "test.h"

/* Split vs unsplit generation, f32 CPU: per forward the outputs differ by GEMM summation order only (~3e-7, see
 * test_flux2_sp); the Euler steps carry that along without amplifying it much at 4 steps. */
#define SP_GEN_TOL 1e-5
/* 8-bit pixels: a latent difference of ~1e-6 can move a value across a rounding boundary of the 0..255 conversion. */
#define SP_PIXEL_TOL 1

typedef struct {
    float *lat[8];      /* stepK.latents_packed, K < 8 */
    int64_t n;
    int steps;
} latents_obs;

static void observe(void *ud, const char *name, const float *d, int ndim, const int64_t *shape) {
    latents_obs *o = ud;
    int k;
    if (sscanf(name, "step%d.latents_packed", &k) != 1 || k < 0 || k >= 8) return;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    free(o->lat[k]);
    o->lat[k] = malloc(sizeof(float) * (size_t)n);
    memcpy(o->lat[k], d, sizeof(float) * (size_t)n);
    o->n = n;
    if (k + 1 > o->steps) o->steps = k + 1;
}

static void obs_free(latents_obs *o) {
    for (int i = 0; i < 8; i++) free(o->lat[i]);
    memset(o, 0, sizeof *o);
}

typedef struct {
    uint8_t *rgb;
    int w, h;
    latents_obs lat;
} result;

/* One request on pipeline p. 0 or -1. */
static int request(dt_pipeline *p, int w, int h, float guidance, result *r) {
    dt_gen_params g;
    dt_gen_params_default(&g);
    g.prompt = "a lighthouse on a cliff at dusk";
    g.negative_prompt = "blurry";
    g.width = w;
    g.height = h;
    g.max_seq_len = 23;
    g.steps = 3;
    g.seed = 5;
    g.guidance = guidance;
    memset(r, 0, sizeof *r);
    return dt_pipeline_generate(p, &g, &r->rgb, &r->w, &r->h, NULL, observe, &r->lat);
}

static void result_free(result *r) {
    free(r->rgb);
    obs_free(&r->lat);
}

static int max_pixel_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m) m = d;
    }
    return m;
}

/* Every step's latents within SP_GEN_TOL and the pixels within SP_PIXEL_TOL of the unsplit result. */
static void check_same(const char *name, const result *got, const result *ref) {
    if (!got->rgb || !ref->rgb || got->w != ref->w || got->h != ref->h || got->lat.steps != ref->lat.steps ||
        got->lat.n != ref->lat.n || got->lat.steps < 1) {
        T_FAIL(name, "results differ in shape (%dx%d, %d steps vs %dx%d, %d steps)", got->w, got->h, got->lat.steps,
               ref->w, ref->h, ref->lat.steps);
        return;
    }
    double worst = 0;
    for (int k = 0; k < ref->lat.steps; k++) {
        double e = dt_rel_l2(got->lat.lat[k], ref->lat.lat[k], (size_t)ref->lat.n);
        if (e > worst) worst = e;
    }
    int px = max_pixel_diff(got->rgb, ref->rgb, (size_t)ref->w * ref->h * 3);
    T_CHECK(name, worst <= SP_GEN_TOL && px <= SP_PIXEL_TOL, "latents rel_l2 %.3g (tol %.1g), pixels off by %d (tol %d)",
            worst, SP_GEN_TOL, px, SP_PIXEL_TOL);
    if (worst <= SP_GEN_TOL && px <= SP_PIXEL_TOL) printf("# %s: latents rel_l2 %.3g, pixels off by %d\n", name, worst, px);
}

/* A pipeline root in dir: the fixture's components (symlinks) around a synthetic 6-head transformer;
 * distilled = 0 writes a model_index.json without is_distilled (CFG with the negative prompt). */
static int make_pipeline(const char *dir, const char *fixture_root, int distilled) {
    static const char *const links[] = {"tokenizer", "text_encoder", "vae", "scheduler", NULL};
    char transformer[PATH_MAX];
    snprintf(transformer, sizeof transformer, "%s/transformer", dir);
    return linked_pipeline_root(dir, fixture_root, links, distilled
                                    ? "{\"_class_name\": \"Flux2KleinPipeline\", \"is_distilled\": true}\n"
                                    : "{\"_class_name\": \"Flux2KleinPipeline\", \"is_distilled\": false}\n") ||
           write_six_heads(transformer, 31);
}

static dt_pipeline *load(dt_backend *be, const char *root, int ranks) {
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.model = root;
    lo.sequence_parallel = ranks;
    dt_pipeline *p = dt_pipeline_load(be, &lo);
    if (!p) printf("# load %s with %d ranks: %s\n", root, ranks, dt_last_error());
    return p;
}

/* ---- the CLI ---- */
static char exe[512], tmpdir[512];

static int run(const char *args, char *err, size_t errlen) {
    char cmd[4096], errf[600];
    snprintf(errf, sizeof errf, "%s/stderr.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", exe, args, errf);
    int st = system(cmd);
    FILE *f = fopen(errf, "r");
    size_t n = f ? fread(err, 1, errlen - 1, f) : 0;
    err[n] = 0;
    if (f) fclose(f);
    unlink(errf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* `ditrun ARGS` with stdout into out: exit status. */
static int run_out(const char *args, char *out, size_t outlen) {
    char cmd[4096], outf[600];
    snprintf(outf, sizeof outf, "%s/stdout.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>/dev/null", exe, args, outf);
    int st = system(cmd);
    FILE *f = fopen(outf, "r");
    size_t n = f ? fread(out, 1, outlen - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
    unlink(outf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void cli_forward_tests(void) {
    char args[2048], out[4096], err[4096];
    const char *fx = t_fixtures();
    snprintf(args, sizeof args, "forward --backend cpu --model %s/model --inputs %s/transformer_io.safetensors "
             "--sequence-parallel 2 --compare-unsplit --repeat 2", fx, fx);
    int rc = run_out(args, out, sizeof out);
    const char *p = strstr(out, "split (2 ranks) vs unsplit forward: rel_l2 ");
    double rel = p ? atof(p + strlen("split (2 ranks) vs unsplit forward: rel_l2 ")) : -1;
    T_CHECK("cli: forward --sequence-parallel 2 --compare-unsplit reports the difference and the speed-up",
            rc == 0 && p && rel >= 0 && rel <= SP_GEN_TOL && strstr(out, "unsplit: "), "exit %d, rel %.3g: %s", rc, rel,
            out);
    snprintf(args, sizeof args, "forward --backend cpu --model %s/model --inputs %s/transformer_io.safetensors "
             "--compare-unsplit", fx, fx);
    rc = run(args, err, sizeof err);
    T_CHECK("cli: forward --compare-unsplit without --sequence-parallel refused", rc == 1 &&
            strstr(err, "--compare-unsplit needs --sequence-parallel"), "exit %d: %s", rc, err);
    snprintf(args, sizeof args, "forward --backend cpu --model %s/model --inputs %s/transformer_io.safetensors "
             "--sequence-parallel 2 --trace --output %s/t.st", fx, fx, tmpdir);
    rc = run(args, err, sizeof err);
    T_CHECK("cli: forward --sequence-parallel with --trace refused", rc == 1 && strstr(err, "--trace is not available"),
            "exit %d: %s", rc, err);
}

static void cli_tests(const char *fixture_root) {
    char args[2048], err[4096], a[600], b[600];
    snprintf(a, sizeof a, "%s/sp1.png", tmpdir);
    snprintf(b, sizeof b, "%s/sp2.png", tmpdir);
    const char *common = "--backend cpu --prompt 'a red fox in snow' --height 56 --width 72 --seed 9 "
                         "--max-sequence-length 23";
    snprintf(args, sizeof args, "generate --model %s %s --output %s", fixture_root, common, a);
    int rc1 = run(args, err, sizeof err);
    snprintf(args, sizeof args, "generate --model %s %s --output %s --sequence-parallel 2", fixture_root, common, b);
    int rc2 = run(args, err, sizeof err);
    dt_image ia = {0}, ib = {0};
    int ok = rc1 == 0 && rc2 == 0 && dt_image_read_file(a, &ia) == 0 && dt_image_read_file(b, &ib) == 0;
    uint8_t *ra = ok ? dt_image_to_rgb(&ia) : NULL, *rb = ok ? dt_image_to_rgb(&ib) : NULL;
    ok = ok && ra && rb && ia.w == 72 && ia.h == 56 && ib.w == ia.w && ib.h == ia.h;
    int px = ok ? max_pixel_diff(ra, rb, (size_t)ia.w * ia.h * 3) : -1;
    T_CHECK("cli: generate --sequence-parallel 2 (CPU thread ranks) == unsplit PNG", ok && px <= SP_PIXEL_TOL,
            "exit %d / %d, pixels off by %d: %s", rc1, rc2, px, err);
    T_CHECK("cli: --sequence-parallel on the cpu backend says it runs thread ranks", strstr(err, "2 thread ranks") != NULL,
            "stderr: %s", err);
    free(ra); free(rb);
    dt_image_free(&ia); dt_image_free(&ib);
    unlink(a); unlink(b);

    snprintf(args, sizeof args, "generate --model %s %s --output %s --sequence-parallel 3", fixture_root, common, a);
    int rc = run(args, err, sizeof err);
    T_CHECK("cli: more ranks than attention heads: one error line naming them", rc == 1 &&
            strstr(err, "ditrun: error: --sequence-parallel 3: the transformer has 2 attention heads") &&
            access(a, F_OK) != 0, "exit %d: %s", rc, err);
    snprintf(args, sizeof args, "generate --model %s %s --output %s --sequence-parallel 0", fixture_root, common, a);
    rc = run(args, err, sizeof err);
    T_CHECK("cli: --sequence-parallel 0 refused", rc == 1 && strstr(err, "--sequence-parallel") && strstr(err, "range"),
            "exit %d: %s", rc, err);
    snprintf(args, sizeof args, "generate --model %s %s --output %s --sequence-parallel 17", fixture_root, common, a);
    rc = run(args, err, sizeof err);
    T_CHECK("cli: --sequence-parallel 17 refused", rc == 1 && strstr(err, "--sequence-parallel") && strstr(err, "range"),
            "exit %d: %s", rc, err);
}

int main(void) {
    dt_log_level = 0;
    char fixture_root[512], six[512], six_cfg[512];
    snprintf(fixture_root, sizeof fixture_root, "%s/model", t_fixtures());
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s", tmp);
    snprintf(six, sizeof six, "%s/ditrun-sp-gen6-%d", tmp, (int)getpid());
    snprintf(six_cfg, sizeof six_cfg, "%s/ditrun-sp-gen6cfg-%d", tmp, (int)getpid());
    const char *b = getenv("BUILD");
    snprintf(exe, sizeof exe, "%s/ditrun", b && *b ? b : "build");

    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){.threads = 2});
    if (make_pipeline(six, fixture_root, 1) || make_pipeline(six_cfg, fixture_root, 0)) {
        T_FAIL("sp generate: a 6-head pipeline", "cannot write it in %s: %s", tmp, dt_last_error());
    } else {
        /* 56x72 with the fixture VAE (x4, 2x2 patches): 7x9 = 63 image tokens; 23 text tokens */
        dt_pipeline *p1 = load(be, six, 1);
        result ref, ref2;
        int ok = p1 && request(p1, 72, 56, -1, &ref) == 0 && request(p1, 48, 40, -1, &ref2) == 0;
        if (!ok) T_FAIL("sp generate: unsplit reference", "%s", dt_last_error());
        dt_pipeline_free(p1);
        for (int N = 2; ok && N <= 4; N++) {
            char name[160];
            dt_pipeline *p = load(be, six, N);
            result got;
            snprintf(name, sizeof name, "sp generate: 6 heads, %d ranks, 63 image + 23 text tokens, 3 steps == unsplit",
                     N);
            if (!p || request(p, 72, 56, -1, &got)) T_FAIL(name, "%s", dt_last_error());
            else check_same(name, &got, &ref);
            result_free(&got);
            if (p && N == 4) {   /* the same loaded ranks, another size: 6x5 = 30 image tokens */
                if (request(p, 48, 40, -1, &got)) T_FAIL("sp generate: 4 ranks, a second size on the same pipeline", "%s",
                                                         dt_last_error());
                else check_same("sp generate: 4 ranks, a second size (30 image tokens) on the same pipeline == unsplit",
                                &got, &ref2);
                result_free(&got);
            }
            dt_pipeline_free(p);
        }
        result_free(&ref);
        result_free(&ref2);

        /* classifier-free guidance: the prompt and the negative prompt resident on every rank */
        p1 = load(be, six_cfg, 1);
        dt_pipeline *p3 = load(be, six_cfg, 3);
        result c1, c3;
        if (!p1 || !p3 || request(p1, 72, 56, 3.5f, &c1) || request(p3, 72, 56, 3.5f, &c3))
            T_FAIL("sp generate: CFG", "%s", dt_last_error());
        else
            check_same("sp generate: 3 ranks, classifier-free guidance (two resident prompts) == unsplit", &c3, &c1);
        result_free(&c1);
        result_free(&c3);
        dt_pipeline_free(p1);
        dt_pipeline_free(p3);
    }
    t_rmtree(six);
    t_rmtree(six_cfg);

    /* the bundled tiny pipeline one-shot (the text encoder released before the DiT loads), 2 ranks */
    {
        dt_pipeline_opts lo;
        dt_pipeline_opts_default(&lo);
        lo.model = fixture_root;
        dt_gen_params g;
        dt_gen_params_default(&g);
        g.prompt = "a red fox";
        g.width = 72;
        g.height = 56;
        g.max_seq_len = 23;
        g.seed = 3;
        result r1 = {0}, r2 = {0};
        int rc1 = dt_generate(be, &lo, &g, &r1.rgb, &r1.w, &r1.h, NULL, observe, &r1.lat);
        lo.sequence_parallel = 2;
        int rc2 = dt_generate(be, &lo, &g, &r2.rgb, &r2.w, &r2.h, NULL, observe, &r2.lat);
        if (rc1 || rc2) T_FAIL("sp generate: tiny pipeline one-shot", "%s", dt_last_error());
        else check_same("sp generate: bundled tiny pipeline one-shot, 2 ranks == unsplit", &r2, &r1);
        result_free(&r1);
        result_free(&r2);
    }
    /* a family without a split forward refuses it at load */
    {
        char k2[600];
        snprintf(k2, sizeof k2, "%s/krea2", t_fixtures());
        dt_pipeline *p = load(be, k2, 2);
        T_CHECK("sp generate: a Krea 2 pipeline refuses --sequence-parallel, naming it",
                !p && strstr(dt_last_error(), "--sequence-parallel is not implemented for krea2"), "%s",
                p ? "loaded" : dt_last_error());
        dt_pipeline_free(p);
    }
    be->destroy(be);

    /* the public API: ditrun_load_opts.sequence_parallel */
    {
        ditrun_engine *e = ditrun_engine_create("cpu", 2);
        ditrun_load_opts lo = ditrun_load_defaults();
        lo.model = fixture_root;
        ditrun_pipeline *p1 = e ? ditrun_pipeline_load(e, &lo) : NULL;
        lo.sequence_parallel = 2;
        ditrun_pipeline *p2 = e ? ditrun_pipeline_load(e, &lo) : NULL;
        ditrun_generate_opts o = ditrun_generate_defaults();
        o.prompt = "a red fox";
        o.width = 72;
        o.height = 56;
        o.max_sequence_length = 23;
        o.seed = 8;
        ditrun_image a = {0}, b = {0};
        int ok = p1 && p2 && ditrun_pipeline_generate(p1, &o, &a) == 0 && ditrun_pipeline_generate(p2, &o, &b) == 0 &&
                 a.width == b.width && a.height == b.height;
        int px = ok ? max_pixel_diff(a.rgb, b.rgb, (size_t)a.width * a.height * 3) : -1;
        T_CHECK("api: ditrun_load_opts.sequence_parallel = 2 == unsplit image", ok && px <= SP_PIXEL_TOL,
                "pixels off by %d: %s", px, ditrun_last_error());
        ditrun_image_free(&a);
        ditrun_image_free(&b);
        ditrun_pipeline_free(p1);
        ditrun_pipeline_free(p2);
        ditrun_engine_free(e);
    }
    cli_tests(fixture_root);
    cli_forward_tests();
    return T_DONE();
}
