/* test_gpu_ops.c — the CUDA backend's row, elementwise and image ops, copies, graphs and memory against the CPU
 * backend, on fresh random inputs at klein-4B and VAE shapes (the Linears: test_gpu_linear.c; attention:
 * test_gpu_attention.c; what they share: gpu_ops.h).
 *
 * The CUDA side keeps bf16 activations, the CPU side f32. GPU outputs are poisoned with NaN before each op, so an
 * unwritten element fails the check. Timings of these kernels are programs of their own in dev/ (`make dev`).
 *
 * Without a usable GPU: prints SKIP and exits 0, unless DITRUN_REQUIRE_GPU=1 (then FAIL).
 * DITRUN_GPU_ONLY=GROUP[,GROUP] runs only those groups: misc, ew, image.
 */
#include "gpu_ops.h"

/* Elementwise/norms against the f32 CPU backend (relative L2): one to three bf16 roundings of intermediates
 * imitating the torch reference (~1.1e-3 each): 8e-3. */
#define TOL_EW 8e-3

/* ------------------------------------------------------------------ row / elementwise ops */
/* Runs `op` on both backends over identical inputs; `nin` inputs of shapes given; output compared. */
static void test_head_norm_rope(int L, int heads, int hd, dt_rope_mode mode, int with_w, int fp32) {
    char name[160];
    snprintf(name, sizeof name, "head_norm_rope L=%d %dx%d %s%s rope_fp32=%d", L, heads, hd,
             mode == DT_ROPE_INTERLEAVED ? "interleaved" : mode == DT_ROPE_HALF ? "half" : "none",
             with_w ? " +norm" : "", fp32);
    int64_t D = (int64_t)heads * hd;
    float *hx = rand_bf((size_t)L * D, -2.f, 2.f);
    float *hw = rand_bf((size_t)hd, 0.5f, 1.5f);
    float *hc = malloc((size_t)L * hd * sizeof(float)), *hs = malloc((size_t)L * hd * sizeof(float));
    for (int r = 0; r < L; r++)
        for (int i = 0; i < hd / 2; i++) {
            float th = frand(-6.f, 6.f);
            int i0 = mode == DT_ROPE_HALF ? i : 2 * i, i1 = mode == DT_ROPE_HALF ? i + hd / 2 : 2 * i + 1;
            hc[(size_t)r * hd + i0] = hc[(size_t)r * hd + i1] = cosf(th);
            hs[(size_t)r * hd + i0] = hs[(size_t)r * hd + i1] = sinf(th);
        }
    /* GPU x is a column view of a wider buffer (ld > cols) */
    dt_mat gbuf = dt_alloc_or_die(G, L, D + 256, DT_BF16), gx = dt_mat_cols(gbuf, 128, D);
    G->upload(G, gx, hx);
    dt_mat gw = with_w ? dt_param_upload(G, hw, hd) : dt_mat_null();
    dt_mat gc = up(G, hc, L, hd, DT_F32), gs = up(G, hs, L, hd, DT_F32);
    int saved = G->opts.rope_fp32;
    G->opts.rope_fp32 = fp32;
    G->head_norm_rope(G, gx, heads, hd, gw, 1e-6f, gc, gs, mode);
    G->opts.rope_fp32 = saved;
    dt_mat cx = up(C, hx, L, D, DT_F32);
    dt_mat cw = with_w ? dt_param_upload(C, hw, hd) : dt_mat_null();
    dt_mat cc = up(C, hc, L, hd, DT_F32), cs = up(C, hs, L, hd, DT_F32);
    C->head_norm_rope(C, cx, heads, hd, cw, 1e-6f, cc, cs, mode);
    float *got = down(G, gx), *ref = down(C, cx);
    t_check_rel_l2(name, got, ref, (size_t)L * D, TOL_EW);
    free(got); free(ref); free(hx); free(hw); free(hc); free(hs);
    G->free(G, &gbuf); G->free(G, &gc); G->free(G, &gs); if (with_w) { G->free(G, &gw); C->free(C, &cw); }
    C->free(C, &cx); C->free(C, &cc); C->free(C, &cs);
}

static void test_layernorm_mod(int64_t M, int64_t D, int with_mod, int inplace) {
    char name[160];
    snprintf(name, sizeof name, "layernorm_mod [%lld,%lld]%s%s", (long long)M, (long long)D, with_mod ? " +mod" : "",
             inplace ? " in-place" : "");
    float *hx = rand_bf((size_t)M * D, -3.f, 5.f), *hs = rand_bf((size_t)D, -1.f, 1.f), *hh = rand_bf((size_t)D, -1.f, 1.f);
    dt_mat gx = upa(G, hx, M, D), gy = inplace ? gx : dt_alloc_or_die(G, M, D, DT_BF16);
    dt_mat gsh = with_mod ? upa(G, hh, 1, D) : dt_mat_null(), gsc = with_mod ? upa(G, hs, 1, D) : dt_mat_null();
    if (!inplace) poison(G, gy);
    G->layernorm_mod(G, gy, gx, gsh, gsc, 1e-6f);
    dt_mat cx = up(C, hx, M, D, DT_F32), cy = dt_alloc_or_die(C, M, D, DT_F32);
    dt_mat csh = with_mod ? up(C, hh, 1, D, DT_F32) : dt_mat_null(), csc = with_mod ? up(C, hs, 1, D, DT_F32) : dt_mat_null();
    C->layernorm_mod(C, cy, cx, csh, csc, 1e-6f);
    float *got = down(G, gy), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)M * D, TOL_EW);
    free(got); free(ref); free(hx); free(hs); free(hh);
    G->free(G, &gx); if (!inplace) G->free(G, &gy); if (with_mod) { G->free(G, &gsh); G->free(G, &gsc); C->free(C, &csh); C->free(C, &csc); }
    C->free(C, &cx); C->free(C, &cy);
}

static void test_rmsnorm(int64_t M, int64_t D, int with_w, float woff) {
    char name[160];
    snprintf(name, sizeof name, "rmsnorm [%lld,%lld]%s offset=%g", (long long)M, (long long)D, with_w ? " +w" : "", woff);
    float *hx = rand_bf((size_t)M * D, -3.f, 3.f), *hw = rand_bf((size_t)D, -0.5f, 1.5f);
    dt_mat gx = upa(G, hx, M, D), gy = dt_alloc_or_die(G, M, D, DT_BF16);
    dt_mat gw = with_w ? dt_param_upload(G, hw, D) : dt_mat_null();
    poison(G, gy);
    G->rmsnorm(G, gy, gx, gw, woff, 1e-6f);
    dt_mat cx = up(C, hx, M, D, DT_F32), cy = dt_alloc_or_die(C, M, D, DT_F32);
    dt_mat cw = with_w ? dt_param_upload(C, hw, D) : dt_mat_null();
    C->rmsnorm(C, cy, cx, cw, woff, 1e-6f);
    float *got = down(G, gy), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)M * D, TOL_EW);
    free(got); free(ref); free(hx); free(hw);
    G->free(G, &gx); G->free(G, &gy); if (with_w) { G->free(G, &gw); C->free(C, &cw); }
    C->free(C, &cx); C->free(C, &cy);
}

/* rmsnorm_mod (Krea 2's modulated norm: the scale folded into w, plus a bf16 shift row) against the CPU within TOL_EW,
 * and against what it replaces on the GPU, rmsnorm then gated_add(y, shift, ones): bit for bit (the product rounded
 * to bf16 before the shift is added, as rmsnorm stores it). D % 8 != 0 takes the scalar kernel. */
static void test_rmsnorm_mod(int64_t M, int64_t D, int inplace) {
    char name[160];
    snprintf(name, sizeof name, "rmsnorm_mod [%lld,%lld]%s", (long long)M, (long long)D, inplace ? " in-place" : "");
    float *hx = rand_bf((size_t)M * D, -3.f, 3.f), *hw = rand_bf((size_t)D, 0.f, 2.5f), *hs = rand_bf((size_t)D, -1.f, 1.f);
    float *h1 = malloc((size_t)M * D * sizeof(float));
    for (int64_t i = 0; i < M * D; i++) h1[i] = 1.f;
    dt_mat gx = upa(G, hx, M, D), gy = inplace ? gx : dt_alloc_or_die(G, M, D, DT_BF16);
    dt_mat gw = dt_param_upload(G, hw, D), gs = upa(G, hs, 1, D), g1 = upa(G, h1, M, D);
    dt_mat gr = dt_alloc_or_die(G, M, D, DT_BF16);
    if (!inplace) poison(G, gy);
    poison(G, gr);
    G->rmsnorm(G, gr, gx, gw, 0.f, 1e-6f);   /* the two passes it replaces */
    G->gated_add(G, gr, gs, g1);
    G->rmsnorm_mod(G, gy, gx, gw, gs, 1e-6f);
    dt_mat cx = up(C, hx, M, D, DT_F32), cy = dt_alloc_or_die(C, M, D, DT_F32);
    dt_mat cw = dt_param_upload(C, hw, D), cs = up(C, hs, 1, D, DT_F32);
    C->rmsnorm_mod(C, cy, cx, cw, cs, 1e-6f);
    float *got = down(G, gy), *two = down(G, gr), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)M * D, TOL_EW);
    size_t diff = 0;
    for (size_t i = 0; i < (size_t)M * D; i++) diff += memcmp(&got[i], &two[i], sizeof(float)) != 0;
    snprintf(name, sizeof name, "rmsnorm_mod [%lld,%lld]%s == rmsnorm + gated_add(shift, ones) bit for bit", (long long)M,
             (long long)D, inplace ? " in-place" : "");
    T_CHECK(name, diff == 0, "%zu of %lld values differ", diff, (long long)(M * D));
    free(got); free(two); free(ref); free(hx); free(hw); free(hs); free(h1);
    G->free(G, &gx); if (!inplace) G->free(G, &gy);
    G->free(G, &gw); G->free(G, &gs); G->free(G, &g1); G->free(G, &gr);
    C->free(C, &cx); C->free(C, &cy); C->free(C, &cw); C->free(C, &cs);
}

static const char *act_name(dt_act a) {
    return a == DT_ACT_SILU ? "silu" : a == DT_ACT_GELU_TANH ? "gelu_tanh" : a == DT_ACT_GELU_ERF ? "gelu_erf" : "sigmoid";
}

/* unaligned = 1: operands are column views starting at column 1 (scalar path) */
static void test_act_mul(int64_t M, int64_t N, dt_act act, int with_b, int unaligned) {
    char name[160];
    snprintf(name, sizeof name, "act_mul %s [%lld,%lld]%s%s", act_name(act), (long long)M, (long long)N,
             with_b ? " *b" : "", unaligned ? " unaligned" : "");
    float *ha = rand_bf((size_t)M * N, -6.f, 6.f), *hb = rand_bf((size_t)M * N, -2.f, 2.f);
    int off = unaligned ? 1 : 0;
    dt_mat ba = dt_alloc_or_die(G, M, N + 2, DT_BF16), bb = dt_alloc_or_die(G, M, N + 2, DT_BF16);
    dt_mat by = dt_alloc_or_die(G, M, N + 2, DT_BF16);
    dt_mat ga = dt_mat_cols(ba, off, N), gb = dt_mat_cols(bb, off, N), gy = dt_mat_cols(by, off, N);
    G->upload(G, ga, ha); G->upload(G, gb, hb);
    poison(G, gy);
    G->act_mul(G, gy, ga, with_b ? gb : dt_mat_null(), act);
    dt_mat ca = up(C, ha, M, N, DT_F32), cb = up(C, hb, M, N, DT_F32), cy = dt_alloc_or_die(C, M, N, DT_F32);
    C->act_mul(C, cy, ca, with_b ? cb : dt_mat_null(), act);
    float *got = down(G, gy), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)M * N, TOL_EW);
    free(got); free(ref); free(ha); free(hb);
    G->free(G, &ba); G->free(G, &bb); G->free(G, &by);
    C->free(C, &ca); C->free(C, &cb); C->free(C, &cy);
}

static void test_gated_add(int64_t M, int64_t D, int with_gate) {
    char name[160];
    snprintf(name, sizeof name, "gated_add [%lld,%lld]%s", (long long)M, (long long)D, with_gate ? " +gate" : "");
    float *hx = rand_bf((size_t)M * D, -4.f, 4.f), *hy = rand_bf((size_t)M * D, -2.f, 2.f), *hg = rand_bf((size_t)D, -1.f, 1.f);
    dt_mat gx = upa(G, hx, M, D), gy = upa(G, hy, M, D), gg = with_gate ? upa(G, hg, 1, D) : dt_mat_null();
    G->gated_add(G, gx, gg, gy);
    dt_mat cx = up(C, hx, M, D, DT_F32), cy = up(C, hy, M, D, DT_F32), cg = with_gate ? up(C, hg, 1, D, DT_F32) : dt_mat_null();
    C->gated_add(C, cx, cg, cy);
    float *got = down(G, gx), *ref = down(C, cx);
    t_check_rel_l2(name, got, ref, (size_t)M * D, TOL_EW);
    free(got); free(ref); free(hx); free(hy); free(hg);
    G->free(G, &gx); G->free(G, &gy); if (with_gate) { G->free(G, &gg); C->free(C, &cg); }
    C->free(C, &cx); C->free(C, &cy);
}

static void test_mul_axpby(int64_t M, int64_t N) {
    char name[160];
    float *ha = rand_bf((size_t)M * N, -3.f, 3.f), *hb = rand_bf((size_t)M * N, -3.f, 3.f);
    dt_mat ga = upa(G, ha, M, N), gb = upa(G, hb, M, N), gy = dt_alloc_or_die(G, M, N, DT_BF16);
    dt_mat ca = up(C, ha, M, N, DT_F32), cb = up(C, hb, M, N, DT_F32), cy = dt_alloc_or_die(C, M, N, DT_F32);
    for (int t = 0; t < 3; t++) {
        poison(G, gy);
        if (t == 0) {
            snprintf(name, sizeof name, "mul [%lld,%lld]", (long long)M, (long long)N);
            G->mul(G, gy, ga, gb); C->mul(C, cy, ca, cb);
        } else if (t == 1) {
            snprintf(name, sizeof name, "axpby [%lld,%lld]", (long long)M, (long long)N);
            G->axpby(G, gy, 0.75f, ga, -1.25f, gb); C->axpby(C, cy, 0.75f, ca, -1.25f, cb);
        } else {
            snprintf(name, sizeof name, "axpby (no b) [%lld,%lld]", (long long)M, (long long)N);
            G->axpby(G, gy, -0.3f, ga, 2.f, dt_mat_null()); C->axpby(C, cy, -0.3f, ca, 2.f, dt_mat_null());
        }
        float *got = down(G, gy), *ref = down(C, cy);
        t_check_rel_l2(name, got, ref, (size_t)M * N, TOL_EW);
        free(got); free(ref);
    }
    free(ha); free(hb);
    G->free(G, &ga); G->free(G, &gb); G->free(G, &gy);
    C->free(C, &ca); C->free(C, &cb); C->free(C, &cy);
}

/* flow_step on the GPU against the CPU op (which equals the host sampler loop, test_cpu_ops): F32 latents, every
 * operation rounded to f32 in the same order on both, so bit for bit; Krea 2's 1024² latent shape [4096, 64] and an
 * odd one (the scalar path). */
static void test_flow_step(int64_t M, int64_t N) {
    char name[160];
    float *hx = rand_bf((size_t)M * N, -3.f, 3.f), *hv = rand_bf((size_t)M * N, -2.f, 2.f), *hu = rand_bf((size_t)M * N, -2.f, 2.f);
    for (size_t i = 0; i < (size_t)M * N; i++) hx[i] += 1e-4f * (float)(i % 7);   /* f32 values beyond bf16 */
    const float g = 4.5f, dt = 0.6f - 0.6333333f;
    for (int mode = 0; mode < 3; mode++) {
        dt_mat gx = up(G, hx, M, N, DT_F32), gv = up(G, hv, M, N, DT_F32), gu = up(G, hu, M, N, DT_F32);
        dt_mat cx = up(C, hx, M, N, DT_F32), cv = up(C, hv, M, N, DT_F32), cu = up(C, hu, M, N, DT_F32);
        G->flow_step(G, gx, gv, mode ? gu : dt_mat_null(), g, mode == 2, dt);
        C->flow_step(C, cx, cv, mode ? cu : dt_mat_null(), g, mode == 2, dt);
        float *got = down(G, gx), *ref = down(C, cx);
        size_t bad = (size_t)M * N;
        for (size_t i = 0; i < (size_t)M * N && bad == (size_t)M * N; i++) if (got[i] != ref[i]) bad = i;
        snprintf(name, sizeof name, "flow_step %s [%lld,%lld] equals the CPU bit for bit",
                 mode == 0 ? "without guidance" : mode == 1 ? "u + g(v - u)" : "v + g(v - u)", (long long)M, (long long)N);
        T_CHECK(name, bad == (size_t)M * N, "element %zu: %.9g vs %.9g", bad, bad < (size_t)M * N ? got[bad] : 0.f,
                bad < (size_t)M * N ? ref[bad] : 0.f);
        free(got); free(ref);
        G->free(G, &gx); G->free(G, &gv); G->free(G, &gu);
        C->free(C, &cx); C->free(C, &cv); C->free(C, &cu);
    }
    free(hx); free(hv); free(hu);
}

/* abs_diff_sums (First Block Cache's decision: Σ|a − b|, Σ|b|) on the GPU against the CPU op, over the same values
 * (bf16-representable; on the GPU bf16, or f32 with f32 = 1, on the CPU f32), a as a column view of a wider buffer
 * (ld > cols). Each element's |a − b| and |b| is the same double on both; only the summation order differs (per
 * thread, per block, then over the blocks, against one row-major loop), a relative error of at most n·2⁻⁵³ (1.4e-9 at
 * Krea 2's 1024² residual [4096, 3072]): TOL_ADS 1e-8 holds that, while one lost element of 12.6M (8e-8) fails. */
#define TOL_ADS 1e-8
static void test_abs_diff_sums(int64_t M, int64_t N, int f32) {
    char name[160];
    const size_t n = (size_t)M * N;
    const dt_dtype gt = f32 ? DT_F32 : DT_BF16;
    float *hb = rand_bf(n, -3.f, 3.f), *ha = malloc(n * sizeof(float) + 4);
    /* a: a residual close to the last one (b), every fifth element equal */
    for (size_t i = 0; i < n; i++) ha[i] = i % 5 ? dt_bf16_round(hb[i] + frand(-0.2f, 0.2f)) : hb[i];
    dt_mat gbuf = dt_alloc_or_die(G, M, N + 24, gt), ga = dt_mat_cols(gbuf, 8, N), gb = up(G, hb, M, N, gt);
    G->upload(G, ga, ha);
    dt_mat ca = up(C, ha, M, N, DT_F32), cb = up(C, hb, M, N, DT_F32);
    double got[2] = {-1.0, -1.0}, want[2] = {-2.0, -2.0};
    G->abs_diff_sums(G, ga, gb, got);
    C->abs_diff_sums(C, ca, cb, want);
    const double e0 = fabs(got[0] - want[0]) / want[0], e1 = fabs(got[1] - want[1]) / want[1];
    snprintf(name, sizeof name, "abs_diff_sums %s [%lld,%lld] (a strided) = the CPU's (rel %.2g, %.2g <= %g)",
             f32 ? "f32" : "bf16", (long long)M, (long long)N, e0, e1, TOL_ADS);
    T_CHECK(name, e0 <= TOL_ADS && e1 <= TOL_ADS, "GPU %.17g %.17g, CPU %.17g %.17g", got[0], got[1], want[0], want[1]);
    double again[2] = {-1.0, -1.0};
    G->abs_diff_sums(G, ga, gb, again);
    snprintf(name, sizeof name, "abs_diff_sums %s [%lld,%lld] twice: the same sums bit for bit (a fixed order)",
             f32 ? "f32" : "bf16", (long long)M, (long long)N);
    T_CHECK(name, again[0] == got[0] && again[1] == got[1], "%.17g %.17g, then %.17g %.17g", got[0], got[1], again[0],
            again[1]);
    G->abs_diff_sums(G, gb, gb, got);
    snprintf(name, sizeof name, "abs_diff_sums %s [%lld,%lld] of a matrix with itself: 0 and the CPU's sum of |b|",
             f32 ? "f32" : "bf16", (long long)M, (long long)N);
    T_CHECK(name, got[0] == 0.0 && fabs(got[1] - want[1]) <= TOL_ADS * want[1], "GPU %.17g %.17g, CPU |b| %.17g",
            got[0], got[1], want[1]);
    free(ha); free(hb);
    G->free(G, &gbuf); G->free(G, &gb);
    C->free(C, &ca); C->free(C, &cb);
}

static void test_copy_transpose(void) {
    const int64_t M = 1000, N = 3000;
    float *h = rand_bf((size_t)M * N, -5.f, 5.f);
    /* bf16 strided view -> f32 contiguous -> bf16 view: exact (values are bf16) */
    dt_mat big = dt_alloc_or_die(G, M, N + 40, DT_BF16), v = dt_mat_cols(big, 24, N);
    G->upload(G, v, h);
    dt_mat f = dt_alloc_or_die(G, M, N, DT_F32);
    poison(G, f);
    G->copy(G, f, v);
    dt_mat back = dt_alloc_or_die(G, M, N + 1, DT_BF16), bv = dt_mat_cols(back, 1, N);
    poison(G, bv);
    G->copy(G, bv, f);
    float *got = down(G, bv);
    t_check_rel_l2("copy bf16 view -> f32 -> bf16 unaligned view", got, h, (size_t)M * N, 0.0);
    free(got);
    /* f32 (non-bf16 values) -> bf16 rounds to nearest even */
    float *hf = malloc((size_t)M * N * sizeof(float)), *hr = malloc((size_t)M * N * sizeof(float));
    for (int64_t i = 0; i < M * N; i++) { hf[i] = frand(-5.f, 5.f); hr[i] = dt_bf16_round(hf[i]); }
    G->upload(G, f, hf);
    G->copy(G, v, f);
    got = down(G, v);
    t_check_rel_l2("copy f32 -> bf16 (round to nearest even)", got, hr, (size_t)M * N, 0.0);
    free(got);
    /* transpose */
    dt_mat t = dt_alloc_or_die(G, N, M, DT_BF16);
    poison(G, t);
    G->transpose(G, t, v);
    got = down(G, t);
    float *ref = malloc((size_t)M * N * sizeof(float));
    for (int64_t i = 0; i < M; i++) for (int64_t j = 0; j < N; j++) ref[j * M + i] = hr[i * N + j];
    t_check_rel_l2("transpose [1000,3000] strided", got, ref, (size_t)M * N, 0.0);
    free(got); free(ref); free(h); free(hf); free(hr);
    G->free(G, &big); G->free(G, &f); G->free(G, &back); G->free(G, &t);
}

/* ------------------------------------------------------------------ image ops */
static void test_conv2d(int cin, int cout, int k, int h, int w, int with_bias) {
    char name[160];
    snprintf(name, sizeof name, "conv2d %d->%d k%d %dx%d%s", cin, cout, k, h, w, with_bias ? " +bias" : "");
    int64_t HW = (int64_t)h * w;
    float *hx = rand_bf((size_t)cin * HW, -2.f, 2.f);
    float *hw = rand_bf((size_t)cout * cin * k * k, -0.1f, 0.1f), *hb = rand_bf((size_t)cout, -1.f, 1.f);
    dt_conv *gc = G->conv_create(G, hw, with_bias ? hb : NULL, cout, cin, k, k / 2);
    dt_conv *cc = C->conv_create(C, hw, with_bias ? hb : NULL, cout, cin, k, k / 2);
    if (!gc || !cc) { T_FAIL(name, "conv_create: %s", dt_last_error()); return; }
    dt_mat gx = upa(G, hx, cin, HW), gy = dt_alloc_or_die(G, cout, HW, DT_BF16);
    poison(G, gy);
    G->conv2d(G, gy, gx, gc, h, w);
    dt_mat cx = up(C, hx, cin, HW, DT_F32), cy = dt_alloc_or_die(C, cout, HW, DT_F32);
    C->conv2d(C, cy, cx, cc, h, w);
    float *got = down(G, gy), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)cout * HW, TOL_GEMM);
    free(got); free(ref); free(hx); free(hw); free(hb);
    G->free(G, &gx); G->free(G, &gy); C->free(C, &cx); C->free(C, &cy);
    G->conv_destroy(G, gc); C->conv_destroy(C, cc);
}

/* conv2d_strided (the VAE encoder's Downsample2D: stride 2, bottom/right padding) vs the CPU reference. */
static void test_conv2d_strided(int cin, int cout, int k, int h, int w, int stride, int pt, int pl, int pb, int pr) {
    char name[160];
    snprintf(name, sizeof name, "conv2d_strided %d->%d k%d %dx%d /%d pads %d,%d,%d,%d", cin, cout, k, h, w, stride, pt, pl,
             pb, pr);
    const int ho = (h + pt + pb - k) / stride + 1, wo = (w + pl + pr - k) / stride + 1;
    int64_t HW = (int64_t)h * w, HWo = (int64_t)ho * wo;
    float *hx = rand_bf((size_t)cin * HW, -2.f, 2.f);
    float *hw = rand_bf((size_t)cout * cin * k * k, -0.1f, 0.1f), *hb = rand_bf((size_t)cout, -1.f, 1.f);
    dt_conv *gc = G->conv_create(G, hw, hb, cout, cin, k, 0);
    dt_conv *cc = C->conv_create(C, hw, hb, cout, cin, k, 0);
    if (!gc || !cc) { T_FAIL(name, "conv_create: %s", dt_last_error()); return; }
    dt_mat gx = upa(G, hx, cin, HW), gy = dt_alloc_or_die(G, cout, HWo, DT_BF16);
    poison(G, gy);
    G->conv2d_strided(G, gy, gx, gc, h, w, stride, pt, pl, pb, pr);
    dt_mat cx = up(C, hx, cin, HW, DT_F32), cy = dt_alloc_or_die(C, cout, HWo, DT_F32);
    C->conv2d_strided(C, cy, cx, cc, h, w, stride, pt, pl, pb, pr);
    float *got = down(G, gy), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)cout * HWo, TOL_GEMM);
    free(got); free(ref); free(hx); free(hw); free(hb);
    G->free(G, &gx); G->free(G, &gy); C->free(C, &cx); C->free(C, &cy);
    G->conv_destroy(G, gc); C->conv_destroy(C, cc);
}

static void test_group_norm(int Ch, int h, int w, int groups, int silu) {
    char name[160];
    snprintf(name, sizeof name, "group_norm C=%d %dx%d g%d%s", Ch, h, w, groups, silu ? " +silu" : "");
    int64_t HW = (int64_t)h * w;
    float *hx = rand_bf((size_t)Ch * HW, -2.f, 6.f), *hg = rand_bf((size_t)Ch, 0.5f, 1.5f), *hb = rand_bf((size_t)Ch, -1.f, 1.f);
    dt_mat gx = upa(G, hx, Ch, HW), gy = dt_alloc_or_die(G, Ch, HW, DT_BF16);
    dt_mat gg = dt_param_upload(G, hg, Ch), gb = dt_param_upload(G, hb, Ch);
    poison(G, gy);
    G->group_norm(G, gy, gx, groups, gg, gb, 1e-6f, silu);
    dt_mat cx = up(C, hx, Ch, HW, DT_F32), cy = dt_alloc_or_die(C, Ch, HW, DT_F32);
    dt_mat cg = dt_param_upload(C, hg, Ch), cb = dt_param_upload(C, hb, Ch);
    C->group_norm(C, cy, cx, groups, cg, cb, 1e-6f, silu);
    float *got = down(G, gy), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)Ch * HW, TOL_EW);
    free(got); free(ref); free(hx); free(hg); free(hb);
    G->free(G, &gx); G->free(G, &gy); G->free(G, &gg); G->free(G, &gb);
    C->free(C, &cx); C->free(C, &cy); C->free(C, &cg); C->free(C, &cb);
}

static void test_upsample(int Ch, int h, int w) {
    char name[160];
    snprintf(name, sizeof name, "upsample2x C=%d %dx%d", Ch, h, w);
    int64_t HW = (int64_t)h * w;
    float *hx = rand_bf((size_t)Ch * HW, -2.f, 2.f);
    dt_mat gx = upa(G, hx, Ch, HW), gy = dt_alloc_or_die(G, Ch, 4 * HW, DT_BF16);
    poison(G, gy);
    G->upsample2x(G, gy, gx, h, w);
    dt_mat cx = up(C, hx, Ch, HW, DT_F32), cy = dt_alloc_or_die(C, Ch, 4 * HW, DT_F32);
    C->upsample2x(C, cy, cx, h, w);
    float *got = down(G, gy), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)Ch * 4 * HW, 0.0);
    free(got); free(ref); free(hx);
    G->free(G, &gx); G->free(G, &gy); C->free(C, &cx); C->free(C, &cy);
}

/* image_rgb8 against the host formula (dt_image_u8), byte for byte: random values beyond [-1, 1], the rounding
 * boundaries k + 0.5 of v/2·255 + 127.5, and NaN / ±inf; from an f32 and a bf16 image. */
static void test_image_rgb8(int64_t hw, dt_dtype dt) {
    char name[160];
    snprintf(name, sizeof name, "image_rgb8 %lld pixels %s", (long long)hw, dt_dtype_name(dt));
    float *hx = rand_bf((size_t)3 * hw, -1.3f, 1.3f);
    for (int64_t i = 0; i < 3 * hw && i < 512; i++) hx[i] = ((float)(i % 256) + 0.5f) / 127.5f - 1.0f;
    hx[3 * hw - 1] = NAN;
    hx[3 * hw - 2] = INFINITY;
    hx[3 * hw - 3] = -INFINITY;
    if (dt == DT_BF16)
        for (int64_t i = 0; i < 3 * hw; i++) hx[i] = dt_bf16_to_f32(dt_f32_to_bf16(hx[i]));
    dt_mat gx = dt_alloc_or_die(G, 3, hw, dt);
    G->upload(G, gx, hx);
    uint8_t *got = malloc((size_t)hw * 3);
    memset(got, 0xAB, (size_t)hw * 3);
    G->image_rgb8(G, got, gx);
    size_t bad = 0, first = 0;
    for (int64_t p = 0; p < hw; p++)
        for (int c = 0; c < 3; c++)
            if (got[p * 3 + c] != dt_image_u8(hx[(size_t)c * hw + p], NULL) && !bad++) first = (size_t)(p * 3 + c);
    T_CHECK(name, bad == 0, "%zu of %lld bytes differ from the host formula (first at %zu: %d vs %d)", bad,
            (long long)(3 * hw), first, bad ? got[first] : 0,
            bad ? dt_image_u8(hx[(first % 3) * (size_t)hw + first / 3], NULL) : 0);
    free(got); free(hx);
    G->free(G, &gx);
}

static void test_channel_rmsnorm(int Ch, int h, int w, int silu) {
    char name[160];
    snprintf(name, sizeof name, "channel_rmsnorm C=%d %dx%d%s", Ch, h, w, silu ? " +silu" : "");
    int64_t HW = (int64_t)h * w;
    float *hx = rand_bf((size_t)Ch * HW, -2.f, 6.f), *hg = rand_bf((size_t)Ch, 0.5f, 1.5f);
    for (int c = 0; c < Ch; c++) hx[(size_t)c * HW] = 0.0f;   /* an all-zero pixel: clamped norm, 0 out */
    dt_mat gx = upa(G, hx, Ch, HW), gy = dt_alloc_or_die(G, Ch, HW, DT_BF16), gg = dt_param_upload(G, hg, Ch);
    poison(G, gy);
    G->channel_rmsnorm(G, gy, gx, gg, silu);
    dt_mat cx = up(C, hx, Ch, HW, DT_F32), cy = dt_alloc_or_die(C, Ch, HW, DT_F32), cg = dt_param_upload(C, hg, Ch);
    C->channel_rmsnorm(C, cy, cx, cg, silu);
    float *got = down(G, gy), *ref = down(C, cy);
    t_check_rel_l2(name, got, ref, (size_t)Ch * HW, TOL_EW);
    free(got); free(ref); free(hx); free(hg);
    G->free(G, &gx); G->free(G, &gy); G->free(G, &gg);
    C->free(C, &cx); C->free(C, &cy); C->free(C, &cg);
}

/* Same-dtype copies between strided views: 16-byte aligned (copy kernel) and unaligned (cudaMemcpy2DAsync),
 * checked exactly (dev/time_elementwise.c times them). */
static void test_copy_views(void) {
    const int64_t M = 1000, N = 3000;
    float *h = rand_bf((size_t)M * N, -5.f, 5.f);
    dt_mat a = dt_alloc_or_die(G, M, N + 40, DT_BF16), av = dt_mat_cols(a, 24, N);
    dt_mat b = dt_alloc_or_die(G, M, N + 16, DT_BF16), bv = dt_mat_cols(b, 8, N);
    G->upload(G, av, h);
    {
        poison(G, bv);
        G->copy(G, bv, av);
        float *got = down(G, bv);
        t_check_rel_l2("copy bf16 strided views (kernel)", got, h, (size_t)M * N, 0.0);
        free(got);
    }
    dt_mat cv = dt_mat_cols(b, 1, N - 1), avu = dt_mat_cols(a, 25, N - 1);   /* unaligned: cudaMemcpy2D */
    poison(G, cv);
    G->copy(G, cv, avu);
    float *got = down(G, cv), *ref = malloc((size_t)M * (N - 1) * sizeof(float));
    for (int64_t i = 0; i < M; i++) memcpy(ref + i * (N - 1), h + i * N + 1, (size_t)(N - 1) * sizeof(float));
    t_check_rel_l2("copy bf16 unaligned strided views", got, ref, (size_t)M * (N - 1), 0.0);
    free(ref);
    free(got);
    G->free(G, &a); G->free(G, &b);
    free(h);
}

/* ------------------------------------------------------------------ graphs, events, memory */
static void test_graph(void) {
    const int64_t M = 512, D = 1024;
    wsrc w = make_weights(D, D, 0, 0, 0);
    dt_linear *lw = G->linear_create(G, &w.src);
    float *hx = rand_bf((size_t)M * D, -2.f, 2.f), *hs = rand_bf((size_t)D, -1.f, 1.f);
    dt_mat x = upa(G, hx, M, D), sc = upa(G, hs, 1, D), h = dt_alloc_or_die(G, M, D, DT_BF16);
    dt_mat y = dt_alloc_or_die(G, M, D, DT_BF16);
    /* eager */
    G->layernorm_mod(G, h, x, dt_mat_null(), sc, 1e-6f);
    G->linear(G, y, h, lw);
    G->gated_add(G, y, sc, h);
    float *eager = down(G, y);
    poison(G, y);
    if (!G->capture_begin || G->capture_begin(G) != 0) { T_FAIL("graph capture", "capture_begin: %s", dt_last_error()); return; }
    G->layernorm_mod(G, h, x, dt_mat_null(), sc, 1e-6f);
    G->linear(G, y, h, lw);
    G->gated_add(G, y, sc, h);
    void *gr = G->capture_end(G);
    if (!gr) { T_FAIL("graph capture", "capture_end: %s", dt_last_error()); return; }
    int rc = G->graph_launch(G, gr);
    rc |= G->graph_launch(G, gr);
    rc |= G->sync(G);
    float *replay = down(G, y);
    T_CHECK("graph capture + replay returns 0", rc == 0, "%s", dt_last_error());
    t_check_rel_l2("graph replay == eager", replay, eager, (size_t)M * D, 0.0);
    G->graph_destroy(G, gr);
    free(eager); free(replay); free(hx); free(hs);
    G->free(G, &x); G->free(G, &sc); G->free(G, &h); G->free(G, &y);
    G->linear_destroy(G, lw);
    free_weights(&w);
}

static void test_memory(void) {
    size_t c0, p0, c1, p1, c2, p2;
    G->mem_stats(G, &c0, &p0);
    dt_mat m = dt_alloc_or_die(G, 1000, 1000, DT_F32);
    G->mem_stats(G, &c1, &p1);
    G->free(G, &m);
    G->mem_stats(G, &c2, &p2);
    T_CHECK("mem_stats tracks alloc/free", c1 >= c0 + 4000000 && c2 == c0 && p1 >= c1 && p2 >= p1,
            "current %zu -> %zu -> %zu, peak %zu -> %zu", c0, c1, c2, p1, p2);
    dt_mat huge;
    int rc = G->alloc(G, &huge, (int64_t)1 << 40, 1 << 10, DT_F32);  /* 4 PiB */
    T_CHECK("alloc failure returns -1 with a message", rc == -1 && strstr(dt_last_error(), "out of device memory"),
            "rc=%d msg=%s", rc, dt_last_error());
}

int main(void) {
    int rc = gpu_ops_open("gpu_ops", NULL);
    if (rc >= 0) return rc;
    const char *only = getenv("DITRUN_GPU_ONLY");
#define RUN(group) (!only || !*only || strstr(only, group))
    if (RUN("misc")) {
        double ts = dt_now();
        test_memory();
        test_copy_transpose();
        test_copy_views();
        test_graph();
        printf("# section misc %.1f s\n", dt_now() - ts);
    }
    if (RUN("ew")) {
        double ts = dt_now();
        test_layernorm_mod(4608, 3072, 1, 0);
        test_layernorm_mod(4608, 3072, 1, 1);
        test_layernorm_mod(333, 3000, 0, 0);
        test_rmsnorm(4608, 3072, 1, 0.f);
        test_rmsnorm(512, 2560, 1, 1.f);
        test_rmsnorm(77, 1000, 0, 0.f);
        test_rmsnorm_mod(4608, 3072, 0);   /* Krea 2 rows at a klein-like width */
        test_rmsnorm_mod(1024, 6144, 1);
        test_rmsnorm_mod(77, 2500, 0);     /* scalar kernel */
        for (int fp = 1; fp >= 0; fp--) {
            test_head_norm_rope(4608, 24, 128, DT_ROPE_INTERLEAVED, 1, fp);
            test_head_norm_rope(512, 32, 128, DT_ROPE_HALF, 1, fp);
        }
        test_head_norm_rope(300, 4, 64, DT_ROPE_INTERLEAVED, 1, 1);
        test_head_norm_rope(300, 4, 64, DT_ROPE_HALF, 0, 1);
        test_head_norm_rope(300, 8, 128, DT_ROPE_NONE, 1, 1);
        test_head_norm_rope(77, 6, 128, DT_ROPE_INTERLEAVED, 1, 1);   /* heads not a multiple of 4 */
        for (int a = DT_ACT_SILU; a <= DT_ACT_SIGMOID; a++) test_act_mul(1024, 9216, (dt_act)a, 1, 0);
        test_act_mul(1024, 9216, DT_ACT_SILU, 0, 0);
        test_act_mul(100, 1000, DT_ACT_GELU_TANH, 1, 1);
        test_gated_add(4608, 3072, 1);
        test_gated_add(4608, 3072, 0);
        test_mul_axpby(1024, 3072);
        test_flow_step(4096, 64);
        test_flow_step(77, 33);
        test_abs_diff_sums(4096, 3072, 0);   /* Krea 2's 1024² image rows */
        test_abs_diff_sums(77, 333, 0);
        test_abs_diff_sums(100, 200, 1);
        printf("# section ew %.1f s\n", dt_now() - ts);
    }
    if (RUN("image")) {
        double ts = dt_now();
        test_conv2d(128, 256, 3, 64, 64, 1);
        test_conv2d(256, 128, 1, 64, 64, 1);
        test_conv2d(32, 512, 3, 37, 29, 0);
        test_conv2d(64, 32, 3, 24, 40, 1);
        test_conv2d(16, 16, 3, 8, 8, 0);
        test_conv2d(128, 3, 3, 64, 64, 1);   /* conv_out: the direct few-output-channel kernel */
        test_conv2d(96, 1, 3, 37, 29, 0);
        test_conv2d(40, 4, 3, 19, 23, 1);
        test_conv2d_strided(128, 128, 3, 64, 64, 2, 0, 0, 1, 1);   /* Downsample2D */
        test_conv2d_strided(64, 64, 3, 37, 29, 2, 0, 0, 1, 1);     /* odd sizes */
        test_conv2d_strided(1024, 8, 3, 256, 256, 2, 0, 0, 1, 1);  /* im2col in two pixel chunks (K = 9216) */
        test_conv2d_strided(16, 8, 3, 20, 18, 3, 2, 0, 1, 2);      /* another stride, four different pads */
        test_conv2d_strided(128, 3, 3, 32, 32, 1, 1, 1, 1, 1);     /* stride 1 + same padding given per call, 3 outputs */
        test_image_rgb8(1000003, DT_F32);
        test_image_rgb8(4096, DT_BF16);
        test_group_norm(256, 64, 64, 32, 1);
        test_group_norm(128, 48, 40, 32, 0);
        test_group_norm(64, 5, 7, 32, 1);
        test_upsample(64, 32, 48);
        test_upsample(3, 5, 7);
        test_channel_rmsnorm(384, 64, 64, 1);
        test_channel_rmsnorm(96, 48, 40, 0);
        test_channel_rmsnorm(3, 5, 7, 1);
        printf("# section image %.1f s\n", dt_now() - ts);
    }
    gpu_ops_close();
    return T_DONE();
}
