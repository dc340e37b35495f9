/* test_gpu_budget.c — the CUDA pool under a memory budget (dt_cuda_opts.max_vram, --max-vram) and the bundled klein
 * pipeline generated within one (without a GPU: SKIP, or FAIL with DITRUN_REQUIRE_GPU=1):
 *   - a backend whose budget cannot hold its own GEMM workspace is not created (the error names the budget);
 *   - dt_backend_cuda_mem_budget: the budget set, or without one the card's free memory plus what the pool holds;
 *   - the pool gives its cached blocks back before it refuses, refuses an allocation past the budget with the error
 *     naming the budget, the use and the request, and serves one that fits after a refusal; mem_stats' peak never
 *     passes the budget;
 *   - host weights: a q4 Linear whose packed weights stay in pinned host memory gives the device copy's outputs
 *     bit for bit (transient and fused paths, prefetched or not) and takes nothing from the pool but the prefetch's
 *     staging copy of the largest packed form, once; linear_on_host tells it from the device copy; a Krea 2
 *     ff-sized host Linear after a GEMM timed unhinted / hinted / on device weights (TIME lines, no assertion);
 *   - the tiny klein pipeline (tests/fixtures/model) at 256x256 within the budget its plan predicts: the same pixels
 *     as without a budget, the pool's peak within it; a budget below the smallest workable refused before anything
 *     loads (the pool's use unchanged). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend_cuda.h"
#include "backends/backend_ext.h"
#include "pipeline/budget.h"
#include "pipeline/engine.h"
#include "test.h"

#define MiB (1LL << 20)

static dt_backend *cuda_with_budget(int64_t budget) {
    static dt_cuda_opts co;   /* outlives the backend (it copies it) */
    if (dt_cuda_opts_from_env(&co)) return NULL;
    co.max_vram = budget;
    co.gemm_tune = 0;   /* cuBLASLt's first pick: the same GEMMs in every backend (pixels compared across two) */
    return dt_backend_cuda_create(&(dt_backend_opts){.rope_fp32 = 1, .cuda = &co});
}

static void pool_tests(void) {
    /* the cuBLASLt workspace (64 MiB) is the first allocation: a 1 MiB budget cannot create the backend */
    dt_backend *tiny = cuda_with_budget(MiB);
    T_CHECK("budget_below_workspace", !tiny && strstr(dt_last_error(), "memory budget --max-vram 1.0 MiB exceeded"),
            "%s", tiny ? "created" : dt_last_error());
    if (tiny) tiny->destroy(tiny);

    dt_backend *be = cuda_with_budget(0);
    if (!be) { T_FAIL("pool_budget", "%s", dt_last_error()); return; }
    int64_t budget = 0, held0 = 0;
    int rc = dt_backend_cuda_mem_budget(be, &budget, &held0);
    T_CHECK("mem_budget_default", rc == 0 && held0 >= 64 * MiB && budget > held0, "rc %d budget %lld held %lld", rc,
            (long long)budget, (long long)held0);
    /* a budget 24 MiB above what the pool holds: 16 MiB, freed (cached), then 20 MiB (the cache given back first) */
    dt_backend_cuda_opts(be)->max_vram = held0 + 24 * MiB;
    rc = dt_backend_cuda_mem_budget(be, &budget, NULL);
    T_CHECK("mem_budget_set", rc == 0 && budget == held0 + 24 * MiB, "budget %lld", (long long)budget);
    dt_mat a, b, c;
    int ok = be->alloc(be, &a, 4 * MiB, 1, DT_F32) == 0;   /* 16 MiB */
    if (ok) be->free(be, &a);
    ok = ok && be->alloc(be, &b, 5 * MiB, 1, DT_F32) == 0;   /* 20 MiB: only with the cached 16 given back */
    T_CHECK("budget_releases_cache", ok, "%s", dt_last_error());
    /* 8 MiB more does not fit: refused, naming the budget, the use and the request */
    size_t cur = 0, peak = 0;
    be->mem_stats(be, &cur, NULL);
    rc = be->alloc(be, &c, 2 * MiB, 1, DT_F32);
    char want[160], got[400];
    snprintf(got, sizeof got, "%s", dt_last_error());
    snprintf(want, sizeof want, "memory budget --max-vram %.1f MiB exceeded: %.1f MiB in use, 8.0 MiB more asked "
             "(8388608 bytes)", (double)(held0 + 24 * MiB) / MiB, (double)cur / MiB);
    T_CHECK("budget_refuses", rc != 0 && strstr(got, want), "rc %d: '%s' (want '%s')", rc, got, want);
    if (rc == 0) be->free(be, &c);
    rc = be->alloc(be, &c, MiB / 4, 1, DT_F32);   /* 1 MiB still fits */
    T_CHECK("budget_fits_after_refusal", rc == 0, "%s", dt_last_error());
    if (rc == 0) be->free(be, &c);
    be->mem_stats(be, &cur, &peak);
    T_CHECK("budget_peak_within", (int64_t)peak <= held0 + 24 * MiB && (int64_t)peak >= held0 + 20 * MiB,
            "peak %zu, budget %lld", peak, (long long)(held0 + 24 * MiB));
    if (ok) be->free(be, &b);
    be->destroy(be);
}

/* Host weights (dt_cuda_opts.host_weights): a random q4 g64 Linear [1024, 512] created with its packed weights in
 * pinned host memory computes exactly what the device copy computes (the same dequantization and GEMM, reading other
 * memory), at 256 rows (transient; also after a prefetch hint, which copies the packed form to the device first) and
 * 8 rows (fused qmm), and the pool holds none of its packed bytes but the prefetch's one staging copy. */
static void host_weights_tests(void) {
    enum { N = 1024, K = 512, G = 64 };
    uint32_t *qw = malloc((size_t)N * K / 8 * 4);
    uint16_t *sc = malloc((size_t)N * (K / G) * 2), *bi = malloc((size_t)N * (K / G) * 2);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < N * K / 8; i++) { r ^= r << 13; r ^= r >> 7; r ^= r << 17; qw[i] = (uint32_t)r; }
    for (int i = 0; i < N * (K / G); i++) { sc[i] = dt_f32_to_bf16(0.01f + 0.001f * (i % 7)); bi[i] = dt_f32_to_bf16(-0.05f); }
    dt_linear_src src = {.name = "host_q4", .out = N, .in = K, .bits = 4, .group_size = G, .dtype = DT_U32, .data = qw,
                         .sb_dtype = DT_BF16, .scales = sc, .biases = bi, .precision = DT_PREC_BF16};
    dt_backend *be = cuda_with_budget(0);
    if (!be) { T_FAIL("host_weights", "%s", dt_last_error()); free(qw); free(sc); free(bi); return; }
    dt_linear *dev = be->linear_create(be, &src);
    size_t c0 = 0, c1 = 0;
    be->mem_stats(be, &c0, NULL);
    dt_backend_cuda_opts(be)->host_weights = 1;
    dt_linear *host = be->linear_create(be, &src);
    be->mem_stats(be, &c1, NULL);
    dt_linear *host2 = be->linear_create(be, &src);   /* a second one: the stage is shared */
    dt_backend_cuda_opts(be)->host_weights = 0;
    size_t c2 = 0;
    be->mem_stats(be, &c2, NULL);
    const char *path = host ? be->linear_path(be, host) : "";
    const size_t stage = (size_t)N * K / 2 + (size_t)N * (K / G) * 8;   /* codes + f32 (scale, bias) pairs */
    T_CHECK("host_weights_off_the_pool", dev && host && host2 && c1 - c0 == stage && c2 == c1 &&
                                             strstr(path, "host memory"),
            "pool %zu -> %zu -> %zu (only the prefetch's staging copy of the packed form, %zu bytes, once); path "
            "'%s'; %s", c0, c1, c2, stage, path, dt_last_error());
    T_CHECK("host_weights_on_host", host && dt_linear_on_host(be, host) && dev && !dt_linear_on_host(be, dev), "%s",
            "linear_on_host does not tell the host copy from the device copy");
    const int rows[2] = {256, 8};
    for (int k = 0; k < 2 && dev && host && host2; k++) {
        float *x = malloc((size_t)rows[k] * K * sizeof(float)), *ya = malloc((size_t)rows[k] * N * sizeof(float)),
              *yb = malloc((size_t)rows[k] * N * sizeof(float));
        for (int i = 0; i < rows[k] * K; i++) x[i] = dt_bf16_round((float)((i * 37) % 101) / 101.f - 0.5f);
        dt_mat X = dt_alloc_or_die(be, rows[k], K, DT_BF16), A = dt_alloc_or_die(be, rows[k], N, DT_BF16),
               B = dt_alloc_or_die(be, rows[k], N, DT_BF16);
        be->upload(be, X, x);
        be->linear(be, A, X, dev);
        be->linear(be, B, X, host);
        be->download(be, ya, A);
        be->download(be, yb, B);
        char name[64];
        snprintf(name, sizeof name, "host_weights_same_output_%d_rows", rows[k]);
        T_CHECK(name, !memcmp(ya, yb, (size_t)rows[k] * N * sizeof(float)) && ya[0] == ya[0],
                "outputs differ (first %g vs %g)", ya[0], yb[0]);
        /* hinted first (256 rows, transient: the packed form staged by the copy engine, then dequantized; at 8
         * rows the hint does nothing: the fused qmm reads the host memory in place) */
        dt_prefetch(be, host2, dt_mat_null(), rows[k]);
        be->linear(be, B, X, host2);
        be->download(be, yb, B);
        snprintf(name, sizeof name, "host_weights_prefetched_same_output_%d_rows", rows[k]);
        T_CHECK(name, !memcmp(ya, yb, (size_t)rows[k] * N * sizeof(float)), "outputs differ (first %g vs %g)", ya[0],
                yb[0]);
        be->free(be, &X);
        be->free(be, &A);
        be->free(be, &B);
        free(x);
        free(ya);
        free(yb);
    }
    if (dev) be->linear_destroy(be, dev);
    if (host) be->linear_destroy(be, host);
    if (host2) be->linear_destroy(be, host2);
    be->destroy(be);
    free(qw);
    free(sc);
    free(bi);
}

/* Timing, not an assertion (what tools/gpu_run.sh vram reports): a Krea 2 ff-sized q4 g64 Linear [16384, 6144] with
 * its packed weights in host memory on 4608 rows (a 1024² image and 512 text tokens), run after a GEMM of the same
 * size on device weights: unhinted (its dequantization reads host memory in place, after that GEMM), hinted before
 * that GEMM (the packed form copied by the copy engine while the GEMM runs, as Krea 2's blocks do with host weights),
 * and both on device weights. Median of 5 after a warm-up, CUDA events. */
static void host_weights_timing(void) {
    enum { N = 16384, K = 6144, G = 64, M = 4608 };
    uint32_t *qw = malloc((size_t)N * K / 8 * 4);
    uint16_t *sc = malloc((size_t)N * (K / G) * 2), *bi = malloc((size_t)N * (K / G) * 2);
    float *x = malloc((size_t)M * K * sizeof(float));
    uint64_t r = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < (size_t)N * K / 8; i++) { r ^= r << 13; r ^= r >> 7; r ^= r << 17; qw[i] = (uint32_t)r; }
    for (size_t i = 0; i < (size_t)N * (K / G); i++) { sc[i] = dt_f32_to_bf16(0.002f); bi[i] = dt_f32_to_bf16(-0.015f); }
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)((i * 37) % 101) / 101.f - 0.5f;
    dt_linear_src src = {.name = "ff_q4", .out = N, .in = K, .bits = 4, .group_size = G, .dtype = DT_U32, .data = qw,
                         .sb_dtype = DT_BF16, .scales = sc, .biases = bi, .precision = DT_PREC_BF16};
    dt_backend *be = cuda_with_budget(0);
    const dt_ext_profiling *pf = be ? dt_backend_profiling(be) : NULL;
    dt_linear *dev = be ? be->linear_create(be, &src) : NULL, *host = NULL;
    if (dev) {
        dt_backend_cuda_opts(be)->host_weights = 1;
        host = be->linear_create(be, &src);
        dt_backend_cuda_opts(be)->host_weights = 0;
    }
    if (!pf || !dev || !host || !be->linear_prefetch) {
        T_SKIP("host_weights_timing", "%s", be && !be->linear_prefetch ? "no prefetch (no_prefetch)" : dt_last_error());
    } else {
        dt_mat X = dt_alloc_or_die(be, M, K, DT_BF16), Y = dt_alloc_or_die(be, M, N, DT_BF16);
        be->upload(be, X, x);
        void *e0 = pf->event_create(be), *e1 = pf->event_create(be);
        static const char *const what[3] = {"device weights, GEMM + GEMM", "host weights unhinted: GEMM + Linear",
                                            "host weights hinted: GEMM + Linear"};
        double t[3][5];
        for (int rep = 0; rep < 6; rep++)
            for (int v = 0; v < 3; v++) {
                pf->event_record(be, e0);
                if (v == 2) dt_prefetch(be, host, dt_mat_null(), M);
                be->linear(be, Y, X, dev);
                be->linear(be, Y, X, v == 0 ? dev : host);
                pf->event_record(be, e1);
                float ms = pf->event_elapsed_ms(be, e0, e1);
                if (rep) t[v][rep - 1] = ms;
            }
        for (int v = 0; v < 3; v++) {
            for (int i = 1; i < 5; i++)   /* (insertion sort: the median of 5) */
                for (int j = i; j > 0 && t[v][j] < t[v][j - 1]; j--) { double s2 = t[v][j]; t[v][j] = t[v][j - 1]; t[v][j - 1] = s2; }
            printf("TIME host weights, q4 [%d, %d] x %d rows, %-38s %8.3f ms\n", N, K, M, what[v], t[v][2]);
        }
        pf->event_destroy(be, e0);
        pf->event_destroy(be, e1);
        be->free(be, &X);
        be->free(be, &Y);
    }
    if (dev) be->linear_destroy(be, dev);
    if (host) be->linear_destroy(be, host);
    if (be) be->destroy(be);
    free(qw); free(sc); free(bi); free(x);
}

/* One 256x256 image of the bundled pipeline on be (o->max_vram planned): 0 or -1; *rgb malloc'd. */
static int one_image(dt_backend *be, dt_pipeline_opts *o, uint8_t **rgb) {
    dt_gen_params g;
    dt_gen_params_default(&g);
    g.prompt = "a red fox in fresh snow";
    g.width = g.height = 256;
    g.steps = 2;
    g.seed = 11;
    g.max_seq_len = 32;
    int w, h;
    return dt_generate(be, o, &g, rgb, &w, &h, NULL, NULL, NULL);
}

static void pipeline_tests(void) {
    char root[512];
    snprintf(root, sizeof root, "%s/model", t_fixtures());
    dt_pipeline_opts o;
    dt_pipeline_opts_default(&o);
    o.model = root;
    uint8_t *ref = NULL, *img = NULL;
    dt_backend *be = cuda_with_budget(0);
    int ok = be && one_image(be, &o, &ref) == 0;
    T_CHECK("klein_unbounded", ok, "%s", dt_last_error());
    if (be) be->destroy(be);
    /* the plan's predicted peak for this image, as the budget of both the plan and the pool */
    dt_place_sizes s;
    dt_place_plan p;
    if (dt_place_sizes_for(root, 256, 256, 32, 2, 0, 0, 1, &s) || dt_place_plan_make(0, &s, &p)) {
        T_FAIL("klein_budget_plan", "%s", dt_last_error());
        free(ref);
        return;
    }
    be = cuda_with_budget(p.peak);
    o.max_vram = p.peak;
    ok = ok && be && one_image(be, &o, &img) == 0;
    size_t cur = 0, peak = 0;
    if (be) be->mem_stats(be, &cur, &peak);
    T_CHECK("klein_within_budget", ok && (int64_t)peak <= p.peak && ref && img && !memcmp(ref, img, 256 * 256 * 3),
            "%s; peak %zu of budget %lld; pixels %s", ok ? "ok" : dt_last_error(), peak, (long long)p.peak,
            ref && img && !memcmp(ref, img, 256 * 256 * 3) ? "equal" : "differ");
    printf("klein tiny 256x256: pool peak %.1f MiB, predicted %.1f MiB\n", peak / 1048576.0, p.peak / 1048576.0);
    free(img);
    img = NULL;
    /* below the smallest workable: refused before loading (nothing allocated) */
    size_t before = 0, after = 0;
    if (be) be->mem_stats(be, &before, NULL);
    o.max_vram = p.min_budget - 1;
    int rc = be ? one_image(be, &o, &img) : 0;
    if (be) be->mem_stats(be, &after, NULL);
    T_CHECK("klein_refused_before_loading", be && rc == -1 && strstr(dt_last_error(), "below the smallest workable") &&
                                                after == before && !img,
            "rc %d, use %zu -> %zu: %s", rc, before, after, dt_last_error());
    free(img);
    free(ref);
    if (be) be->destroy(be);
}

int main(void) {
    dt_log_level = 0;
    if (!dt_backend_cuda_available()) {
        if (t_require_gpu_env()) T_FAIL("gpu_budget", "DITRUN_REQUIRE_GPU=1 but no CUDA GPU is usable");
        else T_SKIP("gpu_budget", "no CUDA GPU available on this machine");
        return T_DONE();
    }
    pool_tests();
    host_weights_tests();
    host_weights_timing();
    pipeline_tests();
    return T_DONE();
}
