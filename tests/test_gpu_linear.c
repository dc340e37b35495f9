/* test_gpu_linear.c — the CUDA backend's Linears against the CPU backend, on fresh random inputs at klein-4B
 * shapes: dense bf16, fp8 (alone and fed by the norm / SwiGLU that produces its input), 4/8-bit quantized weights
 * on every path (cached, fused, transient, mixed), the gated residual Linear, the GEMM-choice cache and the
 * transient prefetch. Big products are compared on a subset of rows (the CPU reference at full size would
 * dominate the run time); the timeit cases also print the product's time (CUDA events, median of 20). What the
 * GPU op tests share: gpu_ops.h.
 *
 * Without a usable GPU: prints SKIP and exits 0, unless DITRUN_REQUIRE_GPU=1 (then FAIL).
 * DITRUN_GPU_ONLY=GROUP[,GROUP] runs only those groups: linear, fp8, f8fuse, quant, prefetch.
 */
#include <unistd.h>

#include "gpu_ops.h"

/* fp8 Linear (e4m3 weights per channel, activations per row):
 * against the CPU emulation: both compute the same e4m3 codes and scales (identical f32 expressions on
 *   bf16-representable inputs), so what remains is fp32 summation order and the bf16 rounding of y
 *   (~1.1e-3 rms; the epilogue mode rounds twice, ~1.6e-3): 4e-3, while one wrong code row or scale fails.
 * against the bf16 Linear (CPU f32 with the same bf16 weights): e4m3 keeps 3 mantissa bits, ~2.6% rms
 *   relative rounding per operand, ~3.7% on the sums (measured 3.4-3.5% in test_fp8): 6e-2. */
#define TOL_FP8_EMU 4e-3
/* fp8 Linear with fast accumulation (the CUDA default; the tensor cores' partial sums are not promoted to fp32
 * every few k-steps, so long sums lose low bits) against the CPU emulation (exact f32 sums): measured 1.9e-3 at
 * K = 3072 growing to 3.0e-3 at K = 12288 (accurate: 1.7e-3 at every K): 6e-3, twice the longest sum's, while one
 * wrong row scale or code row (>= 1e-1) fails. */
#define TOL_FP8_FAST 6e-3
/* The gated residual x += gate ⊙ y through fp8: the increments compared, and x (|x| ~ |gate·y| here) is rounded to
 * bf16 on each side being compared (~2.2e-3 rms of the increment per rounding; measured 3.0e-3 folded vs two-pass,
 * 3.4-3.6e-3 vs the CPU, whose x stays f32, with fast accumulation on top): 6e-3. */
#define TOL_FP8_GATE 6e-3
#define TOL_FP8_VS_BF16 6e-2

/* CPU reference y_ref for the row subset of x (host [M,K]); returns [nsub, N] and fills the subset indices */
static float *cpu_linear_subset(const float *hx, int64_t M, int64_t K, const dt_linear_src *src, int64_t *nsub) {
    int64_t a = M < SUB_A ? M : SUB_A, b = M - a < SUB_B ? M - a : SUB_B;
    int64_t n = a + b;
    float *xs = malloc((size_t)n * K * sizeof(float));
    memcpy(xs, hx, (size_t)a * K * sizeof(float));
    memcpy(xs + a * K, hx + (M - b) * K, (size_t)b * K * sizeof(float));
    dt_linear *cw = C->linear_create(C, src);
    if (!cw) { printf("FAIL cpu linear_create: %s\n", dt_last_error()); exit(1); }
    dt_mat cx = up(C, xs, n, K, DT_F32), cy = dt_alloc_or_die(C, n, src->out, DT_F32);
    C->linear(C, cy, cx, cw);
    float *r = down(C, cy);
    C->free(C, &cx); C->free(C, &cy);
    C->linear_destroy(C, cw);
    free(xs);
    *nsub = n;
    return r;
}
/* the same row subset of a GPU output */
static float *gpu_subset(dt_mat y) {
    int64_t M = y.rows, a = M < SUB_A ? M : SUB_A, b = M - a < SUB_B ? M - a : SUB_B;
    float *r = malloc((size_t)(a + b) * y.cols * sizeof(float) + 4);
    G->download(G, r, dt_mat_rows(y, 0, a));
    if (b) G->download(G, r + a * y.cols, dt_mat_rows(y, M - b, b));
    return r;
}

static void test_linear_dense(int64_t M, int64_t K, int64_t N, int with_bias, int timeit) {
    char name[160];
    snprintf(name, sizeof name, "linear bf16 M=%lld K=%lld N=%lld%s", (long long)M, (long long)K, (long long)N,
             with_bias ? " +bias" : "");
    wsrc w = make_weights(N, K, 0, 0, with_bias);
    float *hx = rand_bf((size_t)M * K, -1.f, 1.f);
    dt_linear *gw = G->linear_create(G, &w.src);
    if (!gw) { T_FAIL(name, "linear_create: %s", dt_last_error()); return; }
    dt_mat x = upa(G, hx, M, K), y = dt_alloc_or_die(G, M, N, DT_BF16);
    poison(G, y);
    G->linear(G, y, x, gw);
    int64_t ns;
    float *ref = cpu_linear_subset(hx, M, K, &w.src, &ns);
    float *got = gpu_subset(y);
    t_check_rel_l2(name, got, ref, (size_t)ns * N, TOL_GEMM);
    if (timeit) time_linear(name, y, x, gw, M, N, K);
    free(ref); free(got); free(hx);
    G->free(G, &x); G->free(G, &y);
    G->linear_destroy(G, gw);
    free_weights(&w);
}

/* fp8 Linear at one shape: CUDA vs the CPU fp8 emulation (tight), vs the bf16 Linear's CPU reference (loose),
 * in both scale modes (cuBLASLt outer-vector scales, and the epilogue pass forced by DITRUN_FP8_SCALES);
 * with timeit: fp8 and bf16 TFLOPS side by side and the activation-quantization pass alone. */
static void test_linear_fp8(int64_t M, int64_t K, int64_t N, int bits, int with_bias, int timeit) {
    char base[160], name[400];
    snprintf(base, sizeof base, "linear fp8 (%s) M=%lld K=%lld N=%lld%s", bits ? "from q4 g64" : "from bf16",
             (long long)M, (long long)K, (long long)N, with_bias ? " +bias" : "");
    wsrc w = make_weights(N, K, bits, 64, with_bias);
    float *hx = rand_bf((size_t)M * K, -1.f, 1.f);
    for (int64_t i = 0; i < M * K; i += 97) hx[i] = dt_bf16_round(hx[i] * 6.f);   /* outliers (kept bf16-exact) */
    dt_linear_src s8 = w.src;
    s8.precision = DT_PREC_FP8;
    dt_linear *g8 = G->linear_create(G, &s8);
    dt_linear *gb = timeit ? G->linear_create(G, &w.src) : NULL;
    if (!g8 || (timeit && !gb)) { T_FAIL(base, "linear_create: %s", dt_last_error()); return; }
    dt_mat x = upa(G, hx, M, K), y = dt_alloc_or_die(G, M, N, DT_BF16);
    int64_t ns;
    float *ref8 = cpu_linear_subset(hx, M, K, &s8, &ns);
    float *refb = cpu_linear_subset(hx, M, K, &w.src, &ns);
    /* modes: 0 default (outer-vector scales, fast accumulation), 1 accurate accumulation, 2 epilogue scales
     * (accurate) */
    for (int mode = 0; mode < 3; mode++) {
        CO->fp8_epilogue_scales = mode == 2;
        CO->fp8_accurate_accum = mode >= 1;
        poison(G, y);
        G->linear(G, y, x, g8);
        float *got = gpu_subset(y);
        const char *mn = mode == 2 ? "epilogue scales, accurate accumulation"
                         : mode == 1 ? "accurate accumulation" : "default: fast accumulation";
        snprintf(name, sizeof name, "%s [%s; %s] vs cpu fp8 emulation", base, mn,
                 GF8 ? GF8->scale_mode(G) : "?");
        t_check_rel_l2(name, got, ref8, (size_t)ns * N, mode ? TOL_FP8_EMU : TOL_FP8_FAST);
        snprintf(name, sizeof name, "%s [%s] vs bf16 reference", base, mn);
        t_check_rel_l2(name, got, refb, (size_t)ns * N, TOL_FP8_VS_BF16);
        if (timeit) {
            snprintf(name, sizeof name, "fp8 %s M=%lld K=%lld N=%lld", mode == 2 ? "epilogue" : mode ? "accurate" : "fast",
                     (long long)M, (long long)K, (long long)N);
            time_linear(name, y, x, g8, M, N, K);
        }
        free(got);
        CO->fp8_epilogue_scales = CO->fp8_accurate_accum = 0;
    }
    if (timeit) {
        snprintf(name, sizeof name, "bf16 M=%lld K=%lld N=%lld", (long long)M, (long long)K, (long long)N);
        time_linear(name, y, x, gb, M, N, K);
        if (GF8) {   /* the activation pass alone: read M*K bf16, write M*K codes + M scales */
            void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
            double t[20];
            for (int i = 0; i < 23; i++) {
                GP->event_record(G, e0);
                GF8->quant(G, x);
                GP->event_record(G, e1);
                if (i >= 3) t[i - 3] = GP->event_elapsed_ms(G, e0, e1);
            }
            double ms = median(t, 20);
            printf("TIME %-44s %8.3f ms  %7.1f GB/s\n", "fp8 activation quantize", ms, 3.0 * M * K / (ms * 1e-3) / 1e9);
            GP->event_destroy(G, e0);
            GP->event_destroy(G, e1);
        }
        G->linear_destroy(G, gb);
    }
    free(ref8); free(refb); free(hx);
    G->free(G, &x); G->free(G, &y);
    G->linear_destroy(G, g8);
    free_weights(&w);
}

/* max |a - b| over n values, its index in *at (NaN anywhere counts as infinite). */
static double max_abs_diff(const float *a, const float *b, size_t n, size_t *at) {
    double m = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) d = INFINITY;
        if (d > m) { m = d; *at = i; }
    }
    return m;
}

/* The fp8 Linears' fused inputs (norm_linear, act_linear_gated; CUDA: the norm / SwiGLU writes the e4m3 codes and
 * row scales the GEMM reads, the gate folded into the weight scales with the residual as C):
 * - norm_linear equals the composed ops (layernorm_mod, then linear's quantizing pass) bit for bit: the fused
 *   kernel quantizes the same bf16 values with the same expressions;
 * - act_linear_gated equals act_mul + linear_gated_add bit for bit (same codes, same gated GEMM); against the
 *   two-pass path (a Linear created with dt_linear_src.fp8_unfused: linear into a scratch, then gated_add, which
 *   rounds y and gate·y) and the CPU fp8 emulation on the same bf16 activations: the residual's increment within
 *   TOL_FP8_GATE; the fp8-internals extension's force_unfused on the fused Linear equals that Linear bit for bit;
 * - timeit: fused vs force_unfused, interleaved, median of 15. */
static void test_fp8_fused(int64_t M, int64_t D, int64_t N1, int64_t lead, int64_t F, int64_t N2, int timeit) {
    char name[200];
    const float eps = 1e-6f;
    const int64_t K2 = lead + F;
    wsrc w1 = make_weights(N1, D, 0, 0, 0), w2 = make_weights(N2, K2, 4, 64, 0);
    dt_linear_src s1 = w1.src, s2 = w2.src;
    s1.precision = s2.precision = DT_PREC_FP8;
    dt_linear_src s2u = s2;
    s2u.fp8_unfused = 1;   /* the same weights, taking their input in a pass of their own */
    dt_linear *g1 = G->linear_create(G, &s1), *g2 = G->linear_create(G, &s2), *g2u = G->linear_create(G, &s2u);
    if (!g1 || !g2 || !g2u || !GF8) { T_FAIL("fp8 fused inputs", "linear_create: %s", GF8 ? dt_last_error() : "no fp8-internals extension"); return; }
    float *hx = rand_bf((size_t)M * D, -2.f, 2.f);
    for (int64_t i = 0; i < M * D; i += 89) hx[i] = dt_bf16_round(hx[i] * 8.f);   /* outliers */
    float *hm = rand_bf((size_t)2 * D, -0.5f, 0.5f);
    dt_mat x = upa(G, hx, M, D), sh = upa(G, hm, 1, D), sc = upa(G, hm + D, 1, D);
    dt_mat a1 = upa(G, hx, M, D), a2 = upa(G, hx, M, D);
    dt_mat y1 = dt_alloc_or_die(G, M, N1, DT_BF16), y2 = dt_alloc_or_die(G, M, N1, DT_BF16);
    poison(G, y1); poison(G, y2);
    G->norm_linear(G, y1, x, sh, sc, eps, g1, a1);
    dt_norm_linear_composed(G, y2, x, sh, sc, eps, g1, a2);
    float *r1 = down(G, y1), *r2 = down(G, y2);
    size_t at;
    double md = max_abs_diff(r1, r2, (size_t)M * N1, &at);
    snprintf(name, sizeof name, "fp8 norm_linear M=%lld D=%lld N=%lld: fused == layernorm_mod + linear bit for bit",
             (long long)M, (long long)D, (long long)N1);
    T_CHECK(name, md == 0, "max |diff| %g at [%zu, %zu]: fused %g, composed %g", md, at / (size_t)N1, at % (size_t)N1,
            r1[at], r2[at]);
    {   /* the CPU fp8 Linear on the GPU's normalized rows (the same bf16 values): the GEMM part */
        float *ha = down(G, a2);
        int64_t ns;
        float *ref = cpu_linear_subset(ha, M, D, &s1, &ns);
        float *got = gpu_subset(y1);
        snprintf(name, sizeof name, "fp8 norm_linear M=%lld D=%lld N=%lld vs cpu fp8 emulation", (long long)M, (long long)D,
                 (long long)N1);
        t_check_rel_l2(name, got, ref, (size_t)ns * N1, TOL_FP8_FAST);   /* the default accumulation */
        free(ha); free(ref); free(got);
    }

    /* act_linear_gated: c = [lead | SiLU(a) * b], x2 += gate ⊙ (c · W2ᵀ) */
    float *hc = rand_bf((size_t)M * K2, -2.f, 2.f), *hab = rand_bf((size_t)M * 2 * F, -3.f, 3.f);
    float *hr = rand_bf((size_t)M * N2, -0.5f, 0.5f), *hg = rand_bf((size_t)N2, 0.5f, 1.5f);
    dt_mat c1 = upa(G, hc, M, K2), c2 = upa(G, hc, M, K2), c3 = upa(G, hc, M, K2), ab = upa(G, hab, M, 2 * F);
    dt_mat av = dt_mat_cols(ab, 0, F), bv = dt_mat_cols(ab, F, F), gate = upa(G, hg, 1, N2);
    dt_mat x1 = upa(G, hr, M, N2), x2 = upa(G, hr, M, N2), x3 = upa(G, hr, M, N2), x4 = upa(G, hr, M, N2);
    dt_mat c4 = upa(G, hc, M, K2);
    dt_mat ys = dt_alloc_or_die(G, M, N2, DT_BF16);
    G->act_linear_gated(G, x1, c1, lead, av, bv, DT_ACT_SILU, g2, gate, ys);
    dt_act_linear_gated_composed(G, x2, c2, lead, av, bv, DT_ACT_SILU, g2, gate, ys);
    G->act_linear_gated(G, x3, c3, lead, av, bv, DT_ACT_SILU, g2u, gate, ys);
    GF8->force_unfused(G, 1);
    G->act_linear_gated(G, x4, c4, lead, av, bv, DT_ACT_SILU, g2, gate, ys);
    GF8->force_unfused(G, 0);
    float *q1 = down(G, x1), *q2 = down(G, x2), *q3 = down(G, x3), *q4 = down(G, x4);
    md = max_abs_diff(q3, q4, (size_t)M * N2, &at);
    snprintf(name, sizeof name, "fp8 act_linear_gated M=%lld N=%lld: force_unfused == a Linear created fp8_unfused bit "
             "for bit", (long long)M, (long long)N2);
    T_CHECK(name, md == 0, "max |diff| %g at [%zu, %zu]", md, at / (size_t)N2, at % (size_t)N2);
    md = max_abs_diff(q1, q2, (size_t)M * N2, &at);
    snprintf(name, sizeof name, "fp8 act_linear_gated M=%lld K=%lld+%lld N=%lld: fused == act_mul + linear_gated_add "
             "bit for bit", (long long)M, (long long)lead, (long long)F, (long long)N2);
    T_CHECK(name, md == 0, "max |diff| %g at [%zu, %zu]: fused %g, composed %g", md, at / (size_t)N2, at % (size_t)N2,
            q1[at], q2[at]);
    {   /* increments of the residual: fused vs two passes, and vs the CPU on the same activations */
        for (size_t i = 0; i < (size_t)M * N2; i++) { q1[i] -= hr[i]; q3[i] -= hr[i]; }
        snprintf(name, sizeof name, "fp8 act_linear_gated M=%lld K=%lld+%lld N=%lld: gate folded vs linear + gated_add",
                 (long long)M, (long long)lead, (long long)F, (long long)N2);
        t_check_rel_l2(name, q1, q3, (size_t)M * N2, TOL_FP8_GATE);
        float *hcc = down(G, c2);   /* [lead | act] as the composed path wrote it (bf16) */
        int64_t ns;
        float *ref = cpu_linear_subset(hcc, M, K2, &s2, &ns);
        int64_t sa = M < SUB_A ? M : SUB_A;
        float *got = malloc((size_t)ns * N2 * sizeof(float));
        for (int64_t r = 0; r < ns; r++) {
            int64_t src = r < sa ? r : M - (ns - r);
            for (int64_t j = 0; j < N2; j++) {
                got[r * N2 + j] = q1[src * N2 + j];
                ref[r * N2 + j] *= hg[j];
            }
        }
        snprintf(name, sizeof name, "fp8 act_linear_gated M=%lld K=%lld+%lld N=%lld vs cpu fp8 emulation", (long long)M,
                 (long long)lead, (long long)F, (long long)N2);
        t_check_rel_l2(name, got, ref, (size_t)ns * N2, TOL_FP8_GATE);
        free(hcc); free(ref); free(got);
    }
    if (timeit) {   /* fused vs force_unfused, interleaved */
        void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
        double t[2][2][15];
        for (int i = 0; i < 18; i++) {
            for (int v = 0; v < 2; v++) {
                int var = (i + v) % 2;   /* rotated order */
                GF8->force_unfused(G, var);
                GP->event_record(G, e0);
                G->norm_linear(G, y1, x, sh, sc, eps, g1, a1);
                GP->event_record(G, e1);
                float t0 = GP->event_elapsed_ms(G, e0, e1);
                GP->event_record(G, e0);
                G->act_linear_gated(G, x1, c1, lead, av, bv, DT_ACT_SILU, g2, gate, ys);
                GP->event_record(G, e1);
                float t1 = GP->event_elapsed_ms(G, e0, e1);
                GF8->force_unfused(G, 0);
                if (i >= 3) { t[var][0][i - 3] = t0; t[var][1][i - 3] = t1; }
            }
        }
        printf("TIME %-44s %8.4f ms fused, %8.4f ms two ops (M=%lld D=%lld N=%lld)\n", "fp8 norm_linear",
               median(t[0][0], 15), median(t[1][0], 15), (long long)M, (long long)D, (long long)N1);
        printf("TIME %-44s %8.4f ms fused, %8.4f ms two ops (M=%lld K=%lld+%lld N=%lld)\n", "fp8 act_linear_gated",
               median(t[0][1], 15), median(t[1][1], 15), (long long)M, (long long)lead, (long long)F, (long long)N2);
        GP->event_destroy(G, e0); GP->event_destroy(G, e1);
    }
    free(r1); free(r2); free(q1); free(q2); free(q3); free(q4);
    free(hx); free(hm); free(hc); free(hab); free(hr); free(hg);
    dt_mat all[] = {x, sh, sc, a1, a2, y1, y2, c1, c2, c3, c4, ab, gate, x1, x2, x3, x4, ys};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) G->free(G, &all[i]);
    G->linear_destroy(G, g1); G->linear_destroy(G, g2); G->linear_destroy(G, g2u);
    free_weights(&w1); free_weights(&w2);
}

/* rmsnorm_mod_linears (Krea 2's modulated norm into q/k/v/gate, D wide, kv Dkv wide): with fp8 Linears the norm
 * writes the e4m3 codes once and every GEMM reads them:
 * - equal to the composed ops (rmsnorm_mod, then each linear's own quantizing pass) bit for bit: the same bf16 values
 *   quantized by the same expressions;
 * - each output against the CPU fp8 emulation on the GPU's normalized rows within TOL_FP8_FAST (the GEMM part);
 * - force_unfused (the A/B arm) gives the composed ops too, bit for bit;
 * - with one Linear not fp8 (a q4 one, as a LoRA'd or odd-shaped Linear may be) the op takes the composed path: equal
 *   to it bit for bit as well;
 * - timeit: fused vs force_unfused, interleaved, median of 15. */
static void test_rmsnorm_mod_linears(int64_t M, int64_t D, int64_t Dkv, int timeit) {
    char name[200];
    const float eps = 1e-5f;
    const int64_t N[4] = {D, Dkv, Dkv, D};
    wsrc w[4];
    dt_linear *g[4], *q4 = NULL;
    dt_linear_src src[4];
    for (int i = 0; i < 4; i++) {
        w[i] = make_weights(N[i], D, i == 3 ? 4 : 0, 64, 0);
        src[i] = w[i].src;
        src[i].precision = DT_PREC_FP8;
        g[i] = G->linear_create(G, &src[i]);
        if (!g[i] || !GF8) { T_FAIL("fp8 rmsnorm_mod_linears", "linear_create: %s", GF8 ? dt_last_error() : "no fp8-internals extension"); return; }
    }
    q4 = G->linear_create(G, &w[3].src);   /* the last one again in bf16 (transient q4) */
    float *hx = rand_bf((size_t)M * D, -2.f, 2.f);
    for (int64_t i = 0; i < M * D; i += 89) hx[i] = dt_bf16_round(hx[i] * 8.f);   /* outliers */
    float *hw = rand_bf((size_t)D, 0.f, 2.f), *hs = rand_bf((size_t)D, -0.5f, 0.5f);
    dt_mat x = upa(G, hx, M, D), nw = dt_param_upload(G, hw, D), sh = upa(G, hs, 1, D);
    dt_mat a1 = dt_alloc_or_die(G, M, D, DT_BF16), a2 = dt_alloc_or_die(G, M, D, DT_BF16);
    dt_mat y1[4], y2[4], y3[4];
    for (int i = 0; i < 4; i++) {
        y1[i] = dt_alloc_or_die(G, M, N[i], DT_BF16); y2[i] = dt_alloc_or_die(G, M, N[i], DT_BF16);
        y3[i] = dt_alloc_or_die(G, M, N[i], DT_BF16);
        poison(G, y1[i]); poison(G, y2[i]); poison(G, y3[i]);
    }
    const dt_linear *const lin[4] = {g[0], g[1], g[2], g[3]};
    G->rmsnorm_mod_linears(G, x, nw, sh, eps, a1, 4, lin, y1);
    dt_rmsnorm_mod_linears_composed(G, x, nw, sh, eps, a2, 4, lin, y2);
    GF8->force_unfused(G, 1);
    G->rmsnorm_mod_linears(G, x, nw, sh, eps, a1, 4, lin, y3);
    GF8->force_unfused(G, 0);
    float *ha = down(G, a2);   /* the normalized rows (bf16), as the composed path wrote them */
    for (int i = 0; i < 4; i++) {
        float *r1 = down(G, y1[i]), *r2 = down(G, y2[i]), *r3 = down(G, y3[i]);
        size_t at;
        double md = max_abs_diff(r1, r2, (size_t)M * N[i], &at), mu = max_abs_diff(r3, r2, (size_t)M * N[i], &at);
        snprintf(name, sizeof name, "fp8 rmsnorm_mod_linears M=%lld D=%lld Linear %d (N=%lld): fused == rmsnorm_mod + "
                 "linear bit for bit (force_unfused too)", (long long)M, (long long)D, i, (long long)N[i]);
        T_CHECK(name, md == 0 && mu == 0, "max |diff| fused %g, force_unfused %g", md, mu);
        int64_t ns;
        float *ref = cpu_linear_subset(ha, M, D, &src[i], &ns), *got = gpu_subset(y1[i]);
        snprintf(name, sizeof name, "fp8 rmsnorm_mod_linears M=%lld D=%lld Linear %d (N=%lld) vs cpu fp8 emulation",
                 (long long)M, (long long)D, i, (long long)N[i]);
        t_check_rel_l2(name, got, ref, (size_t)ns * N[i], TOL_FP8_FAST);
        free(r1); free(r2); free(r3); free(ref); free(got);
    }
    if (q4) {   /* one Linear not fp8: the composed ops */
        const dt_linear *const mixed[4] = {g[0], g[1], g[2], q4};
        for (int i = 0; i < 4; i++) { poison(G, y1[i]); poison(G, y2[i]); }
        G->rmsnorm_mod_linears(G, x, nw, sh, eps, a1, 4, mixed, y1);
        dt_rmsnorm_mod_linears_composed(G, x, nw, sh, eps, a2, 4, mixed, y2);
        double md = 0;
        for (int i = 0; i < 4; i++) {
            float *r1 = down(G, y1[i]), *r2 = down(G, y2[i]);
            size_t at;
            double d = max_abs_diff(r1, r2, (size_t)M * N[i], &at);
            if (d > md) md = d;
            free(r1); free(r2);
        }
        snprintf(name, sizeof name, "rmsnorm_mod_linears M=%lld D=%lld with a q4 Linear among fp8 ones == the composed "
                 "ops bit for bit", (long long)M, (long long)D);
        T_CHECK(name, md == 0, "max |diff| %g", md);
    } else {
        T_FAIL("rmsnorm_mod_linears with a q4 Linear", "linear_create: %s", dt_last_error());
    }
    if (timeit) {   /* fused vs force_unfused, interleaved */
        void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
        double t[2][15];
        for (int i = 0; i < 18; i++)
            for (int v = 0; v < 2; v++) {
                int var = (i + v) % 2;   /* rotated order */
                GF8->force_unfused(G, var);
                GP->event_record(G, e0);
                G->rmsnorm_mod_linears(G, x, nw, sh, eps, a1, 4, lin, y1);
                GP->event_record(G, e1);
                float t0 = GP->event_elapsed_ms(G, e0, e1);
                GF8->force_unfused(G, 0);
                if (i >= 3) t[var][i - 3] = t0;
            }
        printf("TIME %-44s %8.4f ms fused, %8.4f ms rmsnorm_mod + 4 quantizing passes (M=%lld D=%lld Dkv=%lld)\n",
               "fp8 rmsnorm_mod_linears (q/k/v/gate)", median(t[0], 15), median(t[1], 15), (long long)M, (long long)D,
               (long long)Dkv);
        GP->event_destroy(G, e0); GP->event_destroy(G, e1);
    }
    free(ha); free(hx); free(hw); free(hs);
    G->free(G, &x); G->free(G, &nw); G->free(G, &sh); G->free(G, &a1); G->free(G, &a2);
    for (int i = 0; i < 4; i++) {
        G->free(G, &y1[i]); G->free(G, &y2[i]); G->free(G, &y3[i]);
        G->linear_destroy(G, g[i]);
        free_weights(&w[i]);
    }
    if (q4) G->linear_destroy(G, q4);
}

/* e4m3 edge values through the CUDA fp8 Linear: identity weights (each row's amax 1 -> code 448, scale 1/448) and
 * an activation row whose amax is 448 (scale 1), so y = the e4m3 value of each x (bf16 holds it exactly): 0,
 * subnormals, ties to even, ±448; compared exactly with the CPU emulation (whose conversion test_fp8 checks
 * value by value). A NaN activation: fmaxf skips it in the amax, and its output row becomes NaN (NaN·0 in
 * the sum) on both backends. */
static void test_fp8_edges(void) {
    const int64_t K = 32, N = 32, M = 2;
    uint16_t *wb = calloc((size_t)(N * K), 2);
    for (int64_t i = 0; i < N; i++) wb[i * K + i] = dt_f32_to_bf16(1.f);
    dt_linear_src src;
    memset(&src, 0, sizeof src);
    src.name = "identity"; src.out = N; src.in = K; src.dtype = DT_BF16; src.data = wb; src.precision = DT_PREC_FP8;
    float hx[2 * 32];
    const float vals[16] = {448.f, 0.f, 0x1p-9f, 0x1p-10f, 3 * 0x1p-10f, 7 * 0x1p-10f, 15 * 0x1p-10f, 1.0625f,
                            1.1875f, -3.1f, 0x1p-6f, -0x1p-9f, 300.f, -447.f, 0.0302f, 17.5f};
    for (int k = 0; k < 32; k++) hx[k] = dt_bf16_round(vals[k % 16] * (k >= 16 ? -1.f : 1.f));
    for (int k = 0; k < 32; k++) hx[32 + k] = k == 5 ? NAN : 1.f;
    dt_linear *g = G->linear_create(G, &src);
    dt_linear *c = C->linear_create(C, &src);
    if (!g || !c) { T_FAIL("fp8 edge values", "linear_create: %s", dt_last_error()); free(wb); return; }
    dt_mat x = upa(G, hx, M, K), y = dt_alloc_or_die(G, M, N, DT_BF16);
    poison(G, y);
    G->linear(G, y, x, g);
    float *got = down(G, y);
    dt_mat cx = up(C, hx, M, K, DT_F32), cy = dt_alloc_or_die(C, M, N, DT_F32);
    C->linear(C, cy, cx, c);
    float *ref = down(C, cy);
    int ok = 1, bad = -1;
    for (int k = 0; k < 32 && ok; k++) if (got[k] != dt_bf16_round(ref[k])) { ok = 0; bad = k; }
    T_CHECK("fp8 edge values (0, subnormals, ties, +-448) equal the CPU emulation exactly", ok,
            "x[%d] = %.9g: gpu %.9g cpu %.9g", bad, bad >= 0 ? hx[bad] : 0.f, bad >= 0 ? got[bad] : 0.f, bad >= 0 ? ref[bad] : 0.f);
    ok = 1;
    for (int k = 0; k < 32; k++) ok &= isnan(got[32 + k]) && isnan(ref[32 + k]);
    T_CHECK("fp8: a NaN activation makes its output row NaN on both backends", ok, "gpu %g cpu %g", got[32], ref[32]);
    free(got); free(ref); free(wb);
    G->free(G, &x); G->free(G, &y); C->free(C, &cx); C->free(C, &cy);
    G->linear_destroy(G, g);
    C->linear_destroy(C, c);
}

static const char *qpath_name(dt_qpath p) {
    return p == DT_QPATH_FUSED ? "fused" : p == DT_QPATH_TRANSIENT ? "transient" : p == DT_QPATH_CACHED ? "cached" :
           p == DT_QPATH_MIXED ? "mixed" : "auto";
}

/* One quantized shape: CACHED (dequantized at create), FUSED and TRANSIENT (same packed linear, path switched at
 * call time) and MIXED (re-laid at create for the sm_90a mixed-input GEMM; where the device or geometry cannot use
 * it the Linear keeps the packed layout and auto's path), each against the CPU, and the paths against each other. */
/* GEMM algorithm tuning persists: a backend that tuned a Linear's shape writes the choice to its gemm_cache file,
 * a second backend reads it back (same algorithm: the same output bits). */
static void test_gemm_tune_cache(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/ditrun-gemm-algos-%d.txt", (int)getpid());
    unlink(path);
    dt_cuda_opts co = *CO;
    co.gemm_tune = 1;
    snprintf(co.gemm_cache, sizeof co.gemm_cache, "%s", path);
    const int64_t M = 2048, K = 1024, N = 2048;   /* 8.6 GFLOP, 2048 tokens: tuned */
    wsrc w = make_weights(N, K, 0, 0, 0);
    float *hx = rand_bf((size_t)M * K, -1.f, 1.f), *out[2] = {NULL, NULL};
    for (int b = 0; b < 2; b++) {
        dt_backend_opts o = {0};
        o.rope_fp32 = 1;
        o.cuda = &co;
        dt_backend *be = dt_backend_cuda_create(&o);
        if (!be) { T_FAIL("gemm tuning cache", "backend: %s", dt_last_error()); break; }
        dt_linear *l = be->linear_create(be, &w.src);
        dt_mat x = upa(be, hx, M, K), y = dt_alloc_or_die(be, M, N, DT_BF16);
        be->linear(be, y, x, l);
        out[b] = down(be, y);
        be->free(be, &x); be->free(be, &y);
        be->linear_destroy(be, l);
        be->destroy(be);
        if (b == 0) {
            FILE *f = fopen(path, "r");
            char line[1024];
            int found = 0;
            while (f && fgets(line, sizeof line, f)) found |= strstr(line, " 2048 2048 1024 ") != NULL;
            if (f) fclose(f);
            T_CHECK("gemm tuning: the tuned choice is written to the gemm_cache file", found, "no line for m=n=2048 k=1024 in %s", path);
        }
    }
    if (out[0] && out[1]) t_check_rel_l2("gemm tuning: a second backend reuses the persisted choice (same output)", out[1], out[0], (size_t)(M * N), 0.0);
    free(out[0]); free(out[1]); free(hx);
    free_weights(&w);
    unlink(path);
}

/* linear_gated_add (x += gate ⊙ a·Wᵀ; q4 transient: the gate folded into the dequantized rows, one accumulating
 * GEMM; other weights: linear + gated_add inside) against linear + gated_add on the GPU
 * (itself checked against the CPU above), compared on the increment x_after - x_before. bits = 0: bf16 weights.
 * gate_f32: the gate as an F32 row instead of bf16. Timed against the two-op path when timeit. */
#define TOL_GATED 1e-2   /* gate·w rounded to bf16 once, the sum once, instead of y, gate·y and x + ... */
static void test_linear_gated(int64_t M, int64_t K, int64_t N, int bits, int gate_f32, int mixed, int timeit) {
    char name[200];
    snprintf(name, sizeof name, "linear_gated_add %s%s M=%lld K=%lld N=%lld gate %s", bits ? "q4 g64" : "bf16",
             mixed ? " mixed" : "", (long long)M, (long long)K, (long long)N, gate_f32 ? "f32" : "bf16");
    if (!G->linear_gated_add) { T_FAIL(name, "the CUDA backend has no linear_gated_add"); return; }
    wsrc w = make_weights(N, K, bits, 64, 0);
    float *ha = rand_bf((size_t)M * K, -1.f, 1.f), *hx = rand_bf((size_t)M * N, -1.f, 1.f), *hg = rand_bf((size_t)N, -1.f, 1.f);
    dt_qpath saved = G->opts.qpath;
    if (mixed) G->opts.qpath = DT_QPATH_MIXED;
    dt_linear *gw = G->linear_create(G, &w.src);
    G->opts.qpath = saved;
    if (!gw) { T_FAIL(name, "linear_create: %s", dt_last_error()); return; }
    dt_mat a = upa(G, ha, M, K), x1 = upa(G, hx, M, N), x2 = upa(G, hx, M, N), y = dt_alloc_or_die(G, M, N, DT_BF16);
    dt_mat g = up(G, hg, 1, N, gate_f32 ? DT_F32 : DT_BF16);
    G->linear_gated_add(G, x1, a, gw, g);
    G->linear(G, y, a, gw);
    G->gated_add(G, x2, g, y);
    float *f1 = down(G, x1), *f2 = down(G, x2);
    for (size_t i = 0; i < (size_t)(M * N); i++) { f1[i] -= hx[i]; f2[i] -= hx[i]; }
    t_check_rel_l2(name, f1, f2, (size_t)(M * N), TOL_GATED);
    if (timeit) {
        void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
        double tf[20], tu[20];
        for (int i = 0; i < 23; i++) {   /* interleaved: fused, then linear + gated_add */
            GP->event_record(G, e0);
            G->linear_gated_add(G, x1, a, gw, g);
            GP->event_record(G, e1);
            if (i >= 3) tf[i - 3] = GP->event_elapsed_ms(G, e0, e1);
            GP->event_record(G, e0);
            G->linear(G, y, a, gw);
            G->gated_add(G, x2, g, y);
            GP->event_record(G, e1);
            if (i >= 3) tu[i - 3] = GP->event_elapsed_ms(G, e0, e1);
        }
        printf("TIME %-44s %8.4f ms fused  %8.4f ms linear+gated_add\n", name, median(tf, 20), median(tu, 20));
        GP->event_destroy(G, e0); GP->event_destroy(G, e1);
    }
    free(f1); free(f2); free(ha); free(hx); free(hg);
    G->free(G, &a); G->free(G, &x1); G->free(G, &x2); G->free(G, &y); G->free(G, &g);
    G->linear_destroy(G, gw);
    free_weights(&w);
}

static void test_linear_quant(int64_t M, int64_t K, int64_t N, int bits, int group, int with_bias, int timeit) {
    char base[160], name[200];
    snprintf(base, sizeof base, "linear q%d g%d M=%lld K=%lld N=%lld%s%s%s", bits, group, (long long)M, (long long)K,
             (long long)N, with_bias ? " +bias" : "", CO->qgemm_f32_math ? " (mixed math f32)" : "",
             CO->qgemm_direct_epilogue ? " (mixed epilogue direct)" : "");
    wsrc w = make_weights(N, K, bits, group, with_bias);
    float *hx = rand_bf((size_t)M * K, -1.f, 1.f);
    dt_qpath saved = G->opts.qpath;
    dt_linear *gc = linear_as(&w, DT_QPATH_CACHED, 0), *gp = linear_as(&w, DT_QPATH_FUSED, 0);
    dt_linear *gm = linear_as(&w, DT_QPATH_MIXED, 0);
    if (!gc || !gp || !gm) { T_FAIL(base, "linear_create: %s", dt_last_error()); return; }
    dt_mat x = upa(G, hx, M, K), y = dt_alloc_or_die(G, M, N, DT_BF16);
    int64_t ns;
    float *ref = cpu_linear_subset(hx, M, K, &w.src, &ns);
    float *outs[4];
    dt_qpath paths[4] = {DT_QPATH_CACHED, DT_QPATH_FUSED, DT_QPATH_TRANSIENT, DT_QPATH_MIXED};
    for (int p = 0; p < 4; p++) {
        G->opts.qpath = paths[p] == DT_QPATH_CACHED || paths[p] == DT_QPATH_MIXED ? DT_QPATH_AUTO : paths[p];
        dt_linear *lw = paths[p] == DT_QPATH_CACHED ? gc : paths[p] == DT_QPATH_MIXED ? gm : gp;
        poison(G, y);
        G->linear(G, y, x, lw);
        outs[p] = gpu_subset(y);
        snprintf(name, sizeof name, "%s %s vs cpu", base, qpath_name(paths[p]));
        t_check_rel_l2(name, outs[p], ref, (size_t)ns * N, TOL_GEMM);
        if (timeit) time_linear(name, y, x, lw, M, N, K);
    }
    snprintf(name, sizeof name, "%s fused vs cached", base);
    t_check_rel_l2(name, outs[1], outs[0], (size_t)ns * N, TOL_QPATH);
    snprintf(name, sizeof name, "%s transient vs cached", base);
    t_check_rel_l2(name, outs[2], outs[0], (size_t)ns * N, TOL_QPATH);
    snprintf(name, sizeof name, "%s mixed vs cached", base);
    t_check_rel_l2(name, outs[3], outs[0], (size_t)ns * N, TOL_QPATH);
    G->opts.qpath = saved;
    for (int p = 0; p < 4; p++) free(outs[p]);
    free(ref); free(hx);
    G->free(G, &x); G->free(G, &y);
    G->linear_destroy(G, gc);
    G->linear_destroy(G, gp);
    G->linear_destroy(G, gm);
    free_weights(&w);
}


/* The mixed GEMM writing f32 y (its staged epilogue moves 4-float chunks) with a bias, against the CPU and against
 * the cached path writing the same f32 y. */
static void test_linear_mixed_f32out(int64_t M, int64_t K, int64_t N) {
    char name[160];
    snprintf(name, sizeof name, "linear q4 g64 M=%lld K=%lld N=%lld +bias f32 out", (long long)M, (long long)K, (long long)N);
    wsrc w = make_weights(N, K, 4, 64, 1);
    float *hx = rand_bf((size_t)M * K, -1.f, 1.f);
    dt_linear *gm = linear_as(&w, DT_QPATH_MIXED, 0), *gc = linear_as(&w, DT_QPATH_CACHED, 0);
    if (!gm || !gc) { T_FAIL(name, "linear_create: %s", dt_last_error()); return; }
    dt_mat x = upa(G, hx, M, K), y = dt_alloc_or_die(G, M, N, DT_F32);
    int64_t ns;
    float *ref = cpu_linear_subset(hx, M, K, &w.src, &ns);
    poison(G, y);
    G->linear(G, y, x, gm);
    float *om = gpu_subset(y);
    poison(G, y);
    G->linear(G, y, x, gc);
    float *oc = gpu_subset(y);
    char n2[200];
    snprintf(n2, sizeof n2, "%s mixed vs cpu", name);
    t_check_rel_l2(n2, om, ref, (size_t)ns * N, TOL_GEMM);
    snprintf(n2, sizeof n2, "%s mixed vs cached", name);
    t_check_rel_l2(n2, om, oc, (size_t)ns * N, TOL_QPATH);
    free(om); free(oc); free(ref); free(hx);
    G->free(G, &x); G->free(G, &y);
    G->linear_destroy(G, gm);
    G->linear_destroy(G, gc);
    free_weights(&w);
}

/* ------------------------------------------------------------------ transient prefetch */
/* linear_prefetch (the transient 4-bit dequantization ahead, on a low-priority stream, into one of two slots)
 * must not change any result: every sequence below is compared bit for bit with the same Linears run without
 * hints. Covered: hints matched in order, a hint overtaken by another Linear, a third hint while both slots are
 * taken (ignored) and a Linear that must evict one, a gated hint for a plain linear (no match), a destroyed
 * Linear whose pending slot must not match its successor at the same address, and hints inside a graph. */
static void test_prefetch(void) {
    const char *nm = "prefetch";
    if (!G->linear_prefetch) { T_SKIP(nm, "the backend prefetches nothing (DITRUN_CUDA_PREFETCH=0)"); return; }
    const int64_t M = 1024, K = 3072, NA = 3072, NB = 9216;
    wsrc wa = make_weights(NA, K, 4, 64, 0), wb = make_weights(NB, K, 4, 64, 0), wc = make_weights(NA, K, 8, 64, 0);
    dt_linear *A = G->linear_create(G, &wa.src), *B = G->linear_create(G, &wb.src), *Cw = G->linear_create(G, &wc.src);
    float *hx = rand_bf((size_t)M * K, -1.f, 1.f), *hs = rand_bf((size_t)M * NB, -1.f, 1.f), *hg = rand_bf((size_t)NB, -1.f, 1.f);
    dt_mat x = upa(G, hx, M, K), g = up(G, hg, 1, NB, DT_F32), none = dt_mat_null();
    dt_mat ya = dt_alloc_or_die(G, M, NA, DT_BF16), yc = dt_alloc_or_die(G, M, NA, DT_BF16), sb = upa(G, hs, M, NB);
    /* references: no hints */
    G->linear(G, ya, x, A);
    float *ra = down(G, ya);
    G->linear(G, yc, x, Cw);
    float *rc = down(G, yc);
    G->linear_gated_add(G, sb, x, B, g);
    float *rb = down(G, sb);
#define PF_RESET() (poison(G, ya), poison(G, yc), G->upload(G, sb, hs))
#define PF_CHECK(what)                                                                                   \
    do {                                                                                                 \
        char n_[160];                                                                                    \
        float *fa = down(G, ya), *fb = down(G, sb), *fc = down(G, yc);                                   \
        snprintf(n_, sizeof n_, "prefetch %s: linear", what); t_check_rel_l2(n_, fa, ra, (size_t)(M * NA), 0.0); \
        snprintf(n_, sizeof n_, "prefetch %s: gated", what); t_check_rel_l2(n_, fb, rb, (size_t)(M * NB), 0.0);  \
        snprintf(n_, sizeof n_, "prefetch %s: q8", what); t_check_rel_l2(n_, fc, rc, (size_t)(M * NA), 0.0);     \
        free(fa); free(fb); free(fc);                                                                    \
    } while (0)
    PF_RESET();
    G->linear_prefetch(G, A, none, M);
    G->linear_prefetch(G, B, g, M);
    G->linear(G, ya, x, A);
    G->linear_gated_add(G, sb, x, B, g);
    G->linear(G, yc, x, Cw);
    PF_CHECK("in order");
    PF_RESET();
    G->linear_prefetch(G, A, none, M);
    G->linear_gated_add(G, sb, x, B, g);     /* not the hinted Linear */
    G->linear(G, yc, x, Cw);
    G->linear(G, ya, x, A);                  /* its hint, still pending */
    PF_CHECK("overtaken");
    PF_RESET();
    G->linear_prefetch(G, A, none, M);
    G->linear_prefetch(G, B, g, M);
    G->linear_prefetch(G, Cw, none, M);      /* both slots taken: ignored */
    G->linear(G, yc, x, Cw);                 /* evicts the older hint (A) */
    G->linear_gated_add(G, sb, x, B, g);
    G->linear(G, ya, x, A);
    PF_CHECK("third hint");
    PF_RESET();
    G->linear_prefetch(G, A, g, M);          /* gated hint (as if A were gated with g's first columns) */
    G->linear(G, ya, x, A);                  /* plain: no match */
    G->linear_gated_add(G, sb, x, B, g);
    G->linear(G, yc, x, Cw);
    PF_CHECK("gate mismatch");
    /* a destroyed Linear's pending hint must not serve the next Linear made at the same address */
    G->linear_prefetch(G, Cw, none, M);
    G->linear_destroy(G, Cw);
    Cw = G->linear_create(G, &wa.src);       /* A's weights now */
    PF_RESET();
    G->linear(G, yc, x, Cw);
    {
        float *fc = down(G, yc);
        t_check_rel_l2("prefetch: a destroyed Linear's hint is dropped", fc, ra, (size_t)(M * NA), 0.0);
        free(fc);
    }
    G->linear_destroy(G, Cw);
    Cw = G->linear_create(G, &wc.src);
    /* inside a graph, with a hint pending from before the capture */
    PF_RESET();
    G->linear_prefetch(G, B, g, M);
    if (G->capture_begin(G) != 0) { T_FAIL(nm, "capture_begin: %s", dt_last_error()); return; }
    G->linear_prefetch(G, A, none, M);
    G->linear_prefetch(G, Cw, none, M);
    G->linear(G, ya, x, A);
    G->linear(G, yc, x, Cw);
    G->linear_prefetch(G, B, g, M);
    G->linear_gated_add(G, sb, x, B, g);
    void *gr = G->capture_end(G);
    if (!gr) { T_FAIL(nm, "capture_end: %s", dt_last_error()); return; }
    PF_RESET();
    int rcode = G->graph_launch(G, gr);
    rcode |= G->sync(G);
    T_CHECK("prefetch: graph replay returns 0", rcode == 0, "%s", dt_last_error());
    PF_CHECK("graph replay");
    G->graph_destroy(G, gr);
#undef PF_RESET
#undef PF_CHECK
    free(ra); free(rb); free(rc); free(hx); free(hs); free(hg);
    G->free(G, &x); G->free(G, &g); G->free(G, &ya); G->free(G, &yc); G->free(G, &sb);
    G->linear_destroy(G, A); G->linear_destroy(G, B); G->linear_destroy(G, Cw);
    free_weights(&wa); free_weights(&wb); free_weights(&wc);
}

/* linear_path names the path each prepared Linear takes (the -v summary): dense bf16, the 4-bit paths chosen at create
 * (transient, cached, mixed where the card and kernel mode allow it: backends/cuda_paths.c, so this checks the
 * backend takes the decided path under DITRUN_CUDA_KERNELS=portable too), fp8 asked for (an error below compute 8.9),
 * and fp8 asked for on a shape the fp8 GEMM cannot take (kept in bf16). */
static void test_linear_paths(void) {
    wsrc wq = make_weights(256, 256, 4, 64, 0), wd = make_weights(256, 256, 0, 0, 0), wo = make_weights(100, 256, 0, 0, 0);
    int major = 0, minor = 0;
    dt_backend_cuda_device_info(G->opts.device, NULL, 0, &major, &minor);
    const int sm90a = dt_cuda_ops_path(DT_CUDA_OPS_QLINEAR, major, minor, CO->kernels) == DT_CUDA_PATH_SM90A;
    const int fp8 = dt_cuda_ops_path(DT_CUDA_OPS_FP8, major, minor, CO->kernels) == DT_CUDA_PATH_CUBLASLT;
    printf("# compute %d.%d, kernels %s: quantized linear %s, fp8 %s\n", major, minor, dt_cuda_kernels_name(CO->kernels),
           sm90a ? "sm90a" : "portable", fp8 ? "cublaslt" : "none");
    struct { const char *nm; const wsrc *w; dt_qpath qp; dt_precision prec; const char *want; } c[] = {
        {"bf16", &wd, DT_QPATH_AUTO, DT_PREC_BF16, "dense bf16, cuBLASLt"},
        {"q4 auto", &wq, DT_QPATH_AUTO, DT_PREC_BF16, "transient: dequantized to bf16 before each cuBLASLt GEMM"},
        {"q4 cached", &wq, DT_QPATH_CACHED, DT_PREC_BF16, "cached: dequantized to bf16 once at load"},
        {"q4 mixed", &wq, DT_QPATH_MIXED, DT_PREC_BF16, sm90a ? "mixed: packed weights dequantized in registers"
                                                              : "transient: dequantized to bf16 before each cuBLASLt GEMM"},
        {"q4 fp8", &wq, DT_QPATH_AUTO, DT_PREC_FP8, fp8 ? "fp8: e4m3 weights with per-channel scales" : NULL},
        {"bf16 fp8 out 100", &wo, DT_QPATH_AUTO, DT_PREC_FP8, fp8 ? "dense bf16 (fp8 asked for" : NULL},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        dt_linear_src src = c[i].w->src;
        src.precision = c[i].prec;
        dt_qpath saved = G->opts.qpath;
        G->opts.qpath = c[i].qp;
        dt_linear *l = G->linear_create(G, &src);
        G->opts.qpath = saved;
        const char *p = l && G->linear_path ? G->linear_path(G, l) : NULL;
        char name[96];
        snprintf(name, sizeof name, "linear_path %s", c[i].nm);
        if (!c[i].want)   /* fp8 below compute 8.9: a clear error at create */
            T_CHECK(name, !l && strstr(dt_last_error(), "compute capability 8.9"), "created (%s), or error '%s'",
                    p ? p : "?", dt_last_error());
        else
            T_CHECK(name, p && strstr(p, c[i].want), "got '%s', want '%s...'", p ? p : "(none)", c[i].want);
        if (l) G->linear_destroy(G, l);
    }
    free_weights(&wq); free_weights(&wd); free_weights(&wo);
}

int main(void) {
    int rc = gpu_ops_open("gpu_linear", NULL);
    if (rc >= 0) return rc;
    const char *only = getenv("DITRUN_GPU_ONLY");
#define RUN(group) (!only || !*only || strstr(only, group))
    if (only && !strcmp(only, "prefetch")) test_prefetch();
    if (RUN("linear")) {
        double ts = dt_now();
        test_linear_paths();
        test_linear_dense(4608, 3072, 3072, 0, 1);
        test_linear_dense(4608, 3072, 27648, 0, 1);
        test_linear_dense(4608, 12288, 3072, 0, 1);
        test_linear_dense(77, 256, 320, 1, 0);
        test_linear_dense(1, 3072, 18432, 0, 0);
        printf("# section linear %.1f s\n", dt_now() - ts);
    }
    if (RUN("fp8")) {
        double ts = dt_now();
        test_fp8_edges();
        test_linear_fp8(4608, 3072, 27648, 0, 0, 1);   /* single block qkv_mlp */
        test_linear_fp8(4608, 12288, 3072, 0, 0, 1);   /* single block to_out */
        test_linear_fp8(4608, 3072, 3072, 0, 0, 1);    /* double block q/k/v/out */
        test_linear_fp8(4096, 3072, 18432, 0, 0, 1);   /* double block ff.linear_in (image stream) */
        test_linear_fp8(4096, 9216, 3072, 0, 0, 1);    /* double block ff.linear_out */
        test_linear_fp8(512, 3072, 3072, 4, 1, 0);     /* text stream, from 4-bit, bias epilogue */
        test_linear_fp8(1, 3072, 18432, 0, 1, 0);      /* one row */
        test_linear_fp8(77, 256, 320, 4, 1, 0);        /* odd M */
        printf("# section fp8 %.1f s\n", dt_now() - ts);
    }
    if (RUN("fp8") || RUN("f8fuse")) {
        double tf = dt_now();
        test_fp8_fused(4608, 3072, 27648, 3072, 9216, 3072, 1);   /* single block: proj; [attention | SwiGLU] -> out */
        test_fp8_fused(4096, 3072, 18432, 0, 9216, 3072, 1);      /* double block image stream: ff in / ff out */
        test_fp8_fused(77, 256, 320, 64, 192, 144, 0);            /* odd M, short rows */
        test_rmsnorm_mod_linears(4608, 6144, 1536, 1);   /* Krea 2 1024² block: q/k/v/gate (48:12 heads of 128) */
        test_rmsnorm_mod_linears(77, 512, 128, 0);       /* odd M, short rows (the tiny fixture's widths) */
        printf("# section f8fuse %.1f s\n", dt_now() - tf);
    }
    if (RUN("quant")) {
        double ts = dt_now();
        test_gemm_tune_cache();
        test_prefetch();
        test_linear_gated(4608, 12288, 3072, 4, 0, 0, 1);   /* single block out projection, q4 transient */
        test_linear_gated(4608, 12288, 3072, 4, 0, 1, 1);   /* the same, mixed-input GEMM (epilogue gate) */
        test_linear_gated(4608, 12288, 3072, 0, 0, 0, 1);   /* the same, bf16 weights (two-op path inside) */
        test_linear_gated(4096, 3072, 3072, 4, 1, 0, 0);    /* double block to_out, f32 gate */
        test_linear_gated(4096, 3072, 3072, 4, 1, 1, 0);    /* the same, mixed */
        test_linear_gated(512, 9216, 3072, 4, 0, 0, 0);     /* text stream ff out */
        test_linear_gated(512, 9216, 3072, 4, 0, 1, 0);     /* the same, mixed */
        test_linear_gated(40, 3072, 3072, 4, 0, 0, 0);      /* fused-qmm size: the fallback */
        test_linear_quant(4608, 3072, 3072, 4, 64, 0, 1);
        test_linear_quant(4608, 3072, 3072, 8, 64, 0, 0);
        test_linear_quant(4608, 3072, 27648, 4, 64, 0, 1);
        test_linear_quant(4608, 3072, 27648, 8, 64, 0, 0);
        test_linear_quant(1, 3072, 18432, 4, 64, 0, 1);
        test_linear_quant(40, 3072, 3072, 4, 64, 1, 1);
        test_linear_quant(512, 3072, 9216, 4, 64, 0, 1);
        test_linear_quant(17, 1024, 1000, 4, 32, 0, 0);
        test_linear_quant(64, 2048, 768, 8, 128, 1, 0);
        /* mixed-input GEMM edges: token tails, groups 32 / 128, 8-bit, the smallest eligible K and N, bias */
        test_linear_quant(4096, 3072, 18432, 4, 64, 0, 1);
        test_linear_quant(4608, 12288, 3072, 4, 64, 0, 1);
        test_linear_quant(200, 1024, 384, 4, 32, 1, 0);
        test_linear_quant(333, 128, 256, 8, 128, 0, 0);
        test_linear_quant(129, 64, 128, 4, 64, 1, 0);
        test_linear_quant(1000, 512, 640, 8, 32, 0, 0);
        CO->qgemm_f32_math = 1;   /* the mixed GEMM's f32 dequantization (scales not bf16-exact) */
        test_linear_quant(4608, 3072, 3072, 4, 64, 1, 0);
        test_linear_quant(200, 1024, 384, 4, 32, 0, 0);
        CO->qgemm_f32_math = 0;
        test_linear_mixed_f32out(300, 1024, 640);
        CO->qgemm_direct_epilogue = 1;   /* the per-element epilogue (also taken for unaligned y) */
        test_linear_mixed_f32out(300, 1024, 640);
        test_linear_quant(200, 1024, 384, 4, 32, 1, 0);
        test_linear_gated(512, 9216, 3072, 4, 1, 1, 0);
        CO->qgemm_direct_epilogue = 0;
        printf("# section quant %.1f s\n", dt_now() - ts);
    }
    gpu_ops_close();
    return T_DONE();
}
