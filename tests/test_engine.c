/* test_engine.c — the resident pipeline (pipeline/engine.h) on the bundled tiny model: many requests on one
 * load give the same pixels as one-shot runs, no memory growth after the first image of a size, progress
 * after every step, cancellation by flag and by callback, request validation, and the public API's
 * ditrun_pipeline_* over it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ditrun.h"
#include "models/vae_flux2.h"
#include "pipeline/engine.h"
#include "test.h"

typedef struct {
    int calls, last_step, last_steps, in_order;
    double last_elapsed;
    int cancel_at;          /* return non-zero at this step (0 = never) */
    volatile int *flag;     /* set this flag at cancel_at instead of returning non-zero */
} progress_log;

static int on_progress(void *ud, int step, int steps, double elapsed) {
    progress_log *l = ud;
    l->calls++;
    if (step != l->last_step + 1 || elapsed < l->last_elapsed) l->in_order = 0;
    l->last_step = step;
    l->last_steps = steps;
    l->last_elapsed = elapsed;
    if (l->cancel_at && step == l->cancel_at) {
        if (l->flag) { *l->flag = 1; return 0; }
        return 1;
    }
    return 0;
}

static int same(const uint8_t *a, const uint8_t *b, size_t n) { return a && b && !memcmp(a, b, n); }

int main(void) {
    dt_log_level = 0;
    char root[512];
    snprintf(root, sizeof root, "%s/model", t_fixtures());
    dt_backend *be = dt_backend_cpu_create(&(dt_backend_opts){0});
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.model = root;
    dt_gen_params g;
    dt_gen_params_default(&g);
    g.prompt = "a red fox standing in fresh snow";
    g.width = g.height = 64;
    g.max_seq_len = 32;
    g.seed = 11;

    /* one-shot reference */
    uint8_t *one = NULL;
    int w1 = 0, h1 = 0;
    T_CHECK("one-shot generate", dt_generate(be, &lo, &g, &one, &w1, &h1, NULL, NULL, NULL) == 0 && w1 == 64 && h1 == 64,
            "%s", dt_last_error());

    dt_pipeline *p = dt_pipeline_load(be, &lo);
    if (!p) { T_FAIL("pipeline load", "%s", dt_last_error()); return T_DONE(); }
    const dt_pipeline_info *in = dt_pipeline_get_info(p);
    dt_vae_config vc;
    int vc_ok = dt_vae_read_config(root, &vc) == 0;
    /* size multiple = VAE scale factor x 2x2 patches (16 for FLUX.2's x8 VAE; the tiny fixture's VAE is x4) */
    T_CHECK("pipeline info", vc_ok && !strcmp(in->family, "flux2-klein") && in->distilled == 1 && in->default_steps == 4 &&
                                 in->size_multiple == vc.scale_factor * vc.patch,
            "family %s distilled %d steps %d multiple %d", in->family, in->distilled, in->default_steps, in->size_multiple);

    /* the same request three times on one load: identical to the one-shot pixels every time, and after the first
     * image the backend's peak memory does not grow (activations and scratch are reused) */
    size_t n = (size_t)64 * 64 * 3, peak1 = 0, peak3 = 0;
    int all_same = 1, cached[3] = {-1, -1, -1};
    for (int r = 0; r < 3; r++) {
        uint8_t *img = NULL;
        int w, h;
        progress_log pl = {0, 0, 0, 1, 0, 0, NULL};
        g.progress = on_progress;
        g.progress_ud = &pl;
        dt_gen_timings tm;
        int rc = dt_pipeline_generate(p, &g, &img, &w, &h, &tm, NULL, NULL);
        if (rc) { T_FAIL("resident generate", "request %d: %s", r, dt_last_error()); all_same = 0; break; }
        all_same &= w == 64 && h == 64 && same(img, one, n);
        cached[r] = tm.prompts_cached;
        if (r == 0)
            T_CHECK("progress once per step, in order", pl.calls == 4 && pl.last_steps == 4 && pl.in_order && tm.steps == 4,
                    "%d calls, last %d/%d, in order %d", pl.calls, pl.last_step, pl.last_steps, pl.in_order);
        be->mem_stats(be, NULL, r == 0 ? &peak1 : &peak3);
        free(img);
    }
    g.progress = NULL;
    T_CHECK("resident requests equal the one-shot image", all_same, "pixels differ");
    T_CHECK("no memory growth after the first image", peak3 == peak1, "peak %zu after the first, %zu after the third", peak1, peak3);
    /* the prompt's features are reused by the next request with the same text and length (same pixels, above) */
    T_CHECK("the same prompt again: its features reused", cached[0] == 0 && cached[1] == 1 && cached[2] == 1,
            "prompts cached %d %d %d", cached[0], cached[1], cached[2]);
    {   /* another prompt encodes (another image); back to the first encodes again and gives the first image; the
         * same text at another length encodes */
        dt_gen_timings t1, t2, t3;
        uint8_t *i1 = NULL, *i2 = NULL, *i3 = NULL;
        int w, h;
        g.prompt = "a lighthouse on a cliff at dusk";
        int rc1 = dt_pipeline_generate(p, &g, &i1, &w, &h, &t1, NULL, NULL);
        g.prompt = "a red fox standing in fresh snow";
        int rc2 = dt_pipeline_generate(p, &g, &i2, &w, &h, &t2, NULL, NULL);
        g.max_seq_len = 40;
        int rc3 = dt_pipeline_generate(p, &g, &i3, &w, &h, &t3, NULL, NULL);
        g.max_seq_len = 32;
        T_CHECK("prompt features: another prompt, back, another length", !rc1 && !rc2 && !rc3 && !same(i1, one, n) &&
                    same(i2, one, n) && t1.prompts_cached == 0 && t2.prompts_cached == 0 && t3.prompts_cached == 0,
                "rc %d %d %d, cached %d %d %d", rc1, rc2, rc3, t1.prompts_cached, t2.prompts_cached, t3.prompts_cached);
        free(i1);
        free(i2);
        free(i3);
    }

    /* another seed gives another image; the same seed again the first one (no state leaks between requests) */
    uint8_t *b = NULL, *c = NULL;
    int w, h;
    g.seed = 12;
    int rc = dt_pipeline_generate(p, &g, &b, &w, &h, NULL, NULL, NULL);
    g.seed = 11;
    rc |= dt_pipeline_generate(p, &g, &c, &w, &h, NULL, NULL, NULL);
    T_CHECK("another seed, another image; back to the first", rc == 0 && !same(b, one, n) && same(c, one, n), "rc %d", rc);
    free(b);
    free(c);

    /* cancellation: by the progress callback, by the flag (set from the callback here), and the next request works */
    progress_log pl = {0, 0, 0, 1, 0, 2, NULL};
    g.progress = on_progress;
    g.progress_ud = &pl;
    uint8_t *img = NULL;
    rc = dt_pipeline_generate(p, &g, &img, &w, &h, NULL, NULL, NULL);
    T_CHECK("cancel by callback", rc == DT_GEN_CANCELLED && !img && pl.calls == 2 && strstr(dt_last_error(), "cancel"),
            "rc %d, %d calls, %s", rc, pl.calls, dt_last_error());
    volatile int flag = 0;
    progress_log pf = {0, 0, 0, 1, 0, 1, &flag};
    g.progress_ud = &pf;
    g.cancel = &flag;
    rc = dt_pipeline_generate(p, &g, &img, &w, &h, NULL, NULL, NULL);
    T_CHECK("cancel by flag between steps", rc == DT_GEN_CANCELLED && !img && pf.calls == 1, "rc %d, %d calls", rc, pf.calls);
    flag = 1;
    rc = dt_pipeline_generate(p, &g, &img, &w, &h, NULL, NULL, NULL);
    T_CHECK("a set flag cancels before any step", rc == DT_GEN_CANCELLED && pf.calls == 1, "rc %d", rc);
    g.cancel = NULL;
    g.progress = NULL;
    rc = dt_pipeline_generate(p, &g, &img, &w, &h, NULL, NULL, NULL);
    T_CHECK("the request after a cancelled one", rc == 0 && same(img, one, n), "rc %d: %s", rc, dt_last_error());
    free(img);
    img = NULL;

    /* request validation: each bad field named */
    struct { const char *name, *want; int steps, width, height, seq; float guid; const char *prompt; } bad[] = {
        {"no prompt", "prompt", 0, 64, 64, 32, -1, NULL},
        {"too many steps", "steps", 1001, 64, 64, 32, -1, "x"},
        {"negative steps", "steps", -3, 64, 64, 32, -1, "x"},
        {"size under the multiple", "smaller than", 0, 4, 64, 32, -1, "x"},
        {"size over the limit", "over 8192", 0, 64, 9000, 32, -1, "x"},
        {"sequence too long", "sequence", 0, 64, 64, 40000, -1, "x"},
        {"guidance too large", "guidance", 0, 64, 64, 32, 1000, "x"},
        {"guidance NaN", "guidance", 0, 64, 64, 32, 0.0f / 0.0f, "x"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_gen_params q = g;
        q.prompt = bad[i].prompt;
        q.steps = bad[i].steps;
        q.width = bad[i].width;
        q.height = bad[i].height;
        q.max_seq_len = bad[i].seq;
        q.guidance = bad[i].guid;
        rc = dt_pipeline_generate(p, &q, &img, &w, &h, NULL, NULL, NULL);
        char nm[96];
        snprintf(nm, sizeof nm, "rejected: %s", bad[i].name);
        T_CHECK(nm, rc == -1 && !img && strstr(dt_last_error(), bad[i].want), "rc %d: %s", rc, dt_last_error());
    }
    dt_gen_params q = g;
    float few[3] = {0, 0, 0};
    q.noise = few;
    q.noise_len = 3;
    rc = dt_pipeline_generate(p, &q, &img, &w, &h, NULL, NULL, NULL);
    T_CHECK("rejected: noise of the wrong size", rc == -1 && strstr(dt_last_error(), "noise"), "rc %d: %s", rc, dt_last_error());
    dt_pipeline_free(p);

    /* load errors */
    dt_pipeline_opts bad_lo = lo;
    bad_lo.model = "/nonexistent/model";
    T_CHECK("load: missing folder", !dt_pipeline_load(be, &bad_lo) && strstr(dt_last_error(), "nonexistent"), "%s",
            dt_last_error());
    char tr[600];
    snprintf(tr, sizeof tr, "%s/transformer", root);
    bad_lo.model = tr;
    T_CHECK("load: a component folder, not a pipeline root", !dt_pipeline_load(be, &bad_lo) &&
                                                                 strstr(dt_last_error(), "model_index.json"),
            "%s", dt_last_error());

    /* CUDA: the same resident behaviour (warm requests identical, no device-memory growth after the first) */
    if (dt_backend_cuda_available()) {
        dt_backend *cu = dt_backend_cuda_create(&(dt_backend_opts){.rope_fp32 = 1});
        dt_pipeline *pc = cu ? dt_pipeline_load(cu, &lo) : NULL;
        if (!pc) T_FAIL("cuda pipeline load", "%s", dt_last_error());
        else {
            uint8_t *im[3] = {NULL, NULL, NULL};
            size_t pk[3] = {0, 0, 0};
            int ok = 1;
            for (int r = 0; r < 3 && ok; r++) {
                ok = dt_pipeline_generate(pc, &g, &im[r], &w, &h, NULL, NULL, NULL) == 0;
                cu->mem_stats(cu, NULL, &pk[r]);
            }
            T_CHECK("cuda resident requests", ok, "%s", dt_last_error());
            T_CHECK("cuda warm requests give identical pixels", ok && same(im[1], im[2], n), "pixels differ");
            T_CHECK("cuda no device-memory growth after the first image", ok && pk[2] == pk[0], "peak %zu, %zu, %zu",
                    pk[0], pk[1], pk[2]);
            for (int r = 0; r < 3; r++) free(im[r]);
            dt_pipeline_free(pc);
        }
        if (cu) cu->destroy(cu);
    } else if (t_require_gpu_env()) {
        T_FAIL("cuda resident pipeline", "DITRUN_REQUIRE_GPU=1 but no CUDA GPU is usable");
    } else {
        T_SKIP("cuda resident pipeline", "no CUDA GPU available on this machine");
    }

    /* the public API over the same engine */
    ditrun_engine *e = ditrun_engine_create("cpu", 0);
    ditrun_load_opts plo = ditrun_load_defaults();
    plo.model = root;
    ditrun_pipeline *pp = e ? ditrun_pipeline_load(e, &plo) : NULL;
    if (!pp) T_FAIL("api pipeline load", "%s", ditrun_last_error());
    else {
        ditrun_pipeline_info pi = ditrun_pipeline_describe(pp);
        T_CHECK("api describe", !strcmp(pi.family, "flux2-klein") && pi.default_steps == 4, "%s %d", pi.family,
                pi.default_steps);
        ditrun_generate_opts o = ditrun_generate_defaults();
        o.prompt = g.prompt;
        o.width = o.height = 64;
        o.max_sequence_length = 32;
        o.seed = 11;
        ditrun_image im;
        rc = ditrun_pipeline_generate(pp, &o, &im);
        T_CHECK("api pipeline generate equals the one-shot image", rc == 0 && im.width == 64 && same(im.rgb, one, n),
                "rc %d: %s", rc, ditrun_last_error());
        ditrun_image_free(&im);
        ditrun_pipeline_free(pp);
    }
    ditrun_engine_free(e);
    free(one);
    be->destroy(be);
    return T_DONE();
}
