/* test_gpu_formats.c — fp8 files, GGUF blocks and LoRA side products on the CUDA backend against the CPU
 * reference (the same checks run on every GPU machine; without one: SKIP, or FAIL with DITRUN_REQUIRE_GPU=1):
 *   - GGUF Linears of every block type: the device dequantization is bf16(CPU reference) bit for bit (read back
 *     through an identity input), the GEMM matches the CPU Linear, the gated add, the prefetch slots and the
 *     cached path give the same numbers;
 *   - e4m3 files run on the fp8 GEMM from their stored codes without a bf16 copy (device memory of the Linear
 *     ~ its codes), per-tensor and per-channel scales, e5m2 re-quantized;
 *   - whole forwards of the fixture written as GGUF Q4_K / Q8_0 and BFL fp8, and with a LoRA adapter as side
 *     product (MLX q4, GGUF) or merged (bf16), CUDA vs CPU;
 *   - timings (not assertions): klein-4B-shape Linears at 4608 tokens, GGUF Q8_0 / Q4_K and fp8 file vs bf16. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"
#include "backends/backend_ext.h"
#include "core/fp8.h"
#include "flux2_fixture_io.h"
#include "io/safetensors.h"
#include "export/flux2_export.h"
#include "quant/ggml_quants.h"
#include "test.h"
#include "synth/synth_dit.h"

/* GEMM vs the f32 CPU Linear on the same weights: bf16 rounding of the dequantized weight (2^-9), of x, and of y,
 * fp32 accumulation order: ~2e-3 expected; 1e-2 (as test_gpu_ops' TOL_GEMM) while a wrong block or row fails. */
#define TOL_GEMM 1e-2
/* fp8 file vs the CPU's exact f32 weights: the activations are rounded to e4m3 per token on the GPU (~2.6% rms per
 * element, ~2-3% on the sums) plus bf16 output rounding: 4e-2. e5m2 files are re-quantized to e4m3 per channel
 * (one more rounding of the weights, ~2.6%): 6e-2. */
#define TOL_FP8_FILE 4e-2
#define TOL_FP8_E5M2 6e-2
/* whole forward of the fixture, CUDA (bf16 activations) vs CPU f32: test_flux2's FLUX2_GPU_TOL */
#define TOL_FORWARD 1e-2
/* ... with fp8 Linears whose activations are quantized per token (the CPU keeps exact activations) */
#define TOL_FORWARD_FP8 6e-2

static dt_backend *G, *C;
static const dt_ext_profiling *GP;   /* G's timing events */
static uint64_t rs = 88172645463325252ull;
static float frand(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2 - 1; }
static float *rand_bf(size_t n, float amp) {
    float *v = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) { v[i] = dt_bf16_round(frand() * amp); if (v[i] == 0) v[i] = dt_bf16_round(amp * 0.25f); }
    return v;
}
static dt_mat up(dt_backend *be, const float *h, int64_t r, int64_t c) {
    dt_mat m = dt_alloc_or_die(be, r, c, be->act_dtype);
    be->upload(be, m, h);
    return m;
}
static float *down(dt_backend *be, dt_mat m) {
    float *h = malloc((size_t)m.rows * m.cols * sizeof(float) + 4);
    be->download(be, h, m);
    return h;
}

/* y = x · Wᵀ on backend be for the Linear src; malloc'd [M, N] */
static float *run_linear(dt_backend *be, const dt_linear_src *src, const float *x, int64_t M) {
    dt_linear *l = be->linear_create(be, src);
    if (!l) return NULL;
    dt_mat xm = up(be, x, M, src->in), ym = dt_alloc_or_die(be, M, src->out, be->act_dtype);
    be->linear(be, ym, xm, l);
    float *y = down(be, ym);
    be->free(be, &xm);
    be->free(be, &ym);
    be->linear_destroy(be, l);
    return y;
}

static void gguf_linear(dt_dtype t) {
    char name[128];
    const int64_t N = 192, K = 512, M = 96;
    float *w = rand_bf((size_t)(N * K), 0.05f);
    uint8_t *blk = malloc(dt_dtype_bytes(t, N * K));
    dt_ggml_quant(t, w, N * K, blk);
    dt_linear_src src = {0};
    src.name = "gguf";
    src.out = N;
    src.in = K;
    src.dtype = t;
    src.data = blk;
    src.w_scale = 1;
    /* bit-exact weights: y = I · Wᵀ = Wᵀ (each output one product by 1 and zeros) */
    float *eye = calloc((size_t)(K * K), sizeof(float)), *ref = malloc(sizeof(float) * (size_t)(N * K));
    for (int64_t i = 0; i < K; i++) eye[i * K + i] = 1;
    dt_ggml_dequant(t, blk, N * K, ref);
    float *yg = run_linear(G, &src, eye, K);
    int64_t bad = 0;
    for (int64_t i = 0; yg && i < K; i++)
        for (int64_t n = 0; n < N; n++) bad += yg[i * N + n] != dt_bf16_round(ref[n * K + i]);
    snprintf(name, sizeof name, "gpu_gguf_dequant_bit_exact_%s", dt_dtype_name(t));
    T_CHECK(name, yg && !bad, "%lld of %lld weights differ from bf16(CPU reference)%s", (long long)bad, (long long)(N * K),
            yg ? "" : dt_last_error());
    free(yg);
    /* GEMM vs CPU, plain and gated */
    float *x = rand_bf((size_t)(M * K), 1.0f);
    float *yc = run_linear(C, &src, x, M);
    yg = run_linear(G, &src, x, M);
    snprintf(name, sizeof name, "gpu_gguf_linear_%s", dt_dtype_name(t));
    if (yg && yc) t_check_rel_l2(name, yg, yc, (size_t)(M * N), TOL_GEMM);
    else T_FAIL(name, "%s", dt_last_error());
    {
        float *gate = rand_bf((size_t)N, 1.0f), *x0 = rand_bf((size_t)(M * N), 1.0f), *res[2];
        dt_backend *be2[2] = {G, C};
        for (int b = 0; b < 2; b++) {
            dt_backend *be = be2[b];
            dt_linear *l = be->linear_create(be, &src);
            dt_mat xm = up(be, x0, M, N), am = up(be, x, M, K), gm = up(be, gate, 1, N), ym = dt_alloc_or_die(be, M, N, be->act_dtype);
            dt_linear_gated(be, xm, am, l, gm, ym);
            res[b] = down(be, xm);
            be->free(be, &xm); be->free(be, &am); be->free(be, &gm); be->free(be, &ym);
            be->linear_destroy(be, l);
        }
        snprintf(name, sizeof name, "gpu_gguf_gated_add_%s", dt_dtype_name(t));
        t_check_rel_l2(name, res[0], res[1], (size_t)(M * N), TOL_GEMM);
        free(res[0]); free(res[1]); free(gate); free(x0);
    }
    /* prefetched (when the backend has prefetch slots) and cached dequantization: the same numbers */
    {
        dt_linear *l = G->linear_create(G, &src);
        dt_mat xm = up(G, x, M, K), ym = dt_alloc_or_die(G, M, N, G->act_dtype);
        dt_prefetch(G, l, dt_mat_null(), M);
        G->linear(G, ym, xm, l);
        float *yp = down(G, ym);
        snprintf(name, sizeof name, "gpu_gguf_prefetch_same_%s", dt_dtype_name(t));
        T_CHECK(name, yg && !memcmp(yp, yg, sizeof(float) * (size_t)(M * N)), "prefetched result differs");
        free(yp);
        G->free(G, &xm); G->free(G, &ym);
        G->linear_destroy(G, l);
        dt_backend_opts o = G->opts;
        o.qpath = DT_QPATH_CACHED;
        dt_backend *gc = dt_backend_cuda_create(&o);
        float *ycache = gc ? run_linear(gc, &src, x, M) : NULL;
        snprintf(name, sizeof name, "gpu_gguf_cached_same_%s", dt_dtype_name(t));
        T_CHECK(name, ycache && yg && !memcmp(ycache, yg, sizeof(float) * (size_t)(M * N)), "cached result differs: %s",
                ycache ? "values" : dt_last_error());
        free(ycache);
        if (gc) gc->destroy(gc);
    }
    free(yg); free(yc); free(x); free(eye); free(ref); free(w); free(blk);
}

static void fp8_file_linear(dt_dtype t, int per_channel) {
    char name[128];
    const int64_t N = 1024, K = 1024, M = 128;
    float *w = rand_bf((size_t)(N * K), 0.05f), *sc = malloc(sizeof(float) * (size_t)N);
    uint8_t *codes = malloc((size_t)(N * K));
    float amax = dt_fp8_amax(w, N * K), maxc = t == DT_F8_E4M3 ? DT_E4M3_MAX : 57344.0f;
    for (int64_t r = 0; r < N; r++) {
        sc[r] = (per_channel ? dt_fp8_amax(w + r * K, K) : amax) / maxc;
        for (int64_t k = 0; k < K; k++)
            codes[r * K + k] = t == DT_F8_E4M3 ? dt_f32_to_e4m3(w[r * K + k] / sc[r]) : dt_f32_to_e5m2(w[r * K + k] / sc[r]);
    }
    dt_linear_src src = {0};
    src.name = "fp8";
    src.out = N;
    src.in = K;
    src.dtype = t;
    src.data = codes;
    src.w_scale = sc[0];
    if (per_channel) { src.w_scales = sc; src.w_scales_dtype = DT_F32; }
    size_t cur0, peak;
    G->sync(G);
    G->mem_stats(G, &cur0, &peak);
    dt_linear *l = G->linear_create(G, &src);
    size_t cur1;
    G->sync(G);
    G->mem_stats(G, &cur1, &peak);
    snprintf(name, sizeof name, "gpu_fp8_file_no_bf16_copy_%s%s", dt_dtype_name(t), per_channel ? "_channel" : "");
    T_CHECK(name, l && cur1 - cur0 < (size_t)(N * K) * 3 / 2, "the Linear holds %.2f MB for %.2f MB of codes",
            (cur1 - cur0) / 1e6, N * K / 1e6);
    if (l) G->linear_destroy(G, l);
    float *x = rand_bf((size_t)(M * K), 1.0f), *yc = run_linear(C, &src, x, M), *yg = run_linear(G, &src, x, M);
    snprintf(name, sizeof name, "gpu_fp8_file_linear_%s%s", dt_dtype_name(t), per_channel ? "_channel" : "");
    if (yg && yc) t_check_rel_l2(name, yg, yc, (size_t)(M * N), t == DT_F8_E4M3 ? TOL_FP8_FILE : TOL_FP8_E5M2);
    else T_FAIL(name, "%s", dt_last_error());
    free(x); free(yc); free(yg); free(w); free(sc); free(codes);
}

/* forward of MODEL (with an optional adapter) on be */
static float *forward(dt_backend *be, const char *model, const char *lora, int side, size_t *n) {
    fx_inputs fi;
    if (fx_load_inputs(&fi)) return NULL;
    dt_lora_spec spec;
    flux2_load_opts o = {0};
    if (lora && !dt_lora_spec_parse(lora, &spec)) { o.loras = &spec; o.n_loras = 1; o.lora_side = side; }
    flux2_model *m = flux2_load_ex(be, model, &o);
    float *out = NULL;
    if (m) {
        *n = (size_t)fi.n * flux2_get_config(m)->out_channels;
        out = malloc(sizeof(float) * *n);
        if (flux2_forward(m, fi.img, fi.n, fi.txt, fi.t, fi.ts, fi.img_ids, fi.txt_ids, out, NULL, NULL)) { free(out); out = NULL; }
        flux2_free(m);
    }
    fx_free_inputs(&fi);
    return out;
}

static void model_case(const char *name, const char *model, const char *lora, int side, double tol) {
    size_t n = 0, n2 = 0;
    float *g = forward(G, model, lora, side, &n), *c = forward(C, model, lora, side, &n2);
    if (!g || !c || n != n2) T_FAIL(name, "%s", dt_last_error());
    else t_check_rel_l2(name, g, c, n, tol);
    free(g);
    free(c);
}

static void time_linear(const char *label, const dt_linear_src *src, int64_t M) {
    dt_linear *l = G->linear_create(G, src);
    if (!l) { printf("# %s: %s\n", label, dt_last_error()); return; }
    float *x = rand_bf((size_t)(M * src->in), 1.0f);
    dt_mat xm = up(G, x, M, src->in), ym = dt_alloc_or_die(G, M, src->out, G->act_dtype);
    void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
    double best = 1e30;
    for (int it = 0; it < 12; it++) {
        GP->event_record(G, e0);
        G->linear(G, ym, xm, l);
        GP->event_record(G, e1);
        double ms = GP->event_elapsed_ms(G, e0, e1);
        if (it >= 2 && ms < best) best = ms;
    }
    printf("# time %-40s M=%lld N=%lld K=%lld: %.3f ms (%.0f TFLOPS)\n", label, (long long)M, (long long)src->out,
           (long long)src->in, best, 2.0 * M * src->out * src->in / (best * 1e-3) / 1e12);
    GP->event_destroy(G, e0);
    GP->event_destroy(G, e1);
    G->free(G, &xm);
    G->free(G, &ym);
    G->linear_destroy(G, l);
    free(x);
}

int main(void) {
    (void)fx_forward_check;
    if (!dt_backend_cuda_available()) {
        if (t_require_gpu_env()) { printf("FAIL gpu_formats: no CUDA GPU available (DITRUN_REQUIRE_GPU=1)\n"); return 1; }
        printf("SKIP gpu_formats: no CUDA GPU available (no device or driver)\n");
        return 0;
    }
    dt_log_level = 0;
    dt_backend_opts o;
    memset(&o, 0, sizeof o);
    o.rope_fp32 = 1;
    G = dt_backend_cuda_create(&o);
    C = dt_backend_cpu_create(&o);
    if (!G || !C) { printf("FAIL gpu_formats: backends: %s\n", dt_last_error()); return 1; }
    if (!(GP = dt_backend_profiling(G))) { printf("FAIL gpu_formats: no profiling extension\n"); return 1; }
    const dt_dtype types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) gguf_linear(types[i]);
    fp8_file_linear(DT_F8_E4M3, 0);
    fp8_file_linear(DT_F8_E4M3, 1);
    fp8_file_linear(DT_F8_E5M2, 0);

    /* whole forwards of the fixture in these formats, and with an adapter */
    char tmp[512], model[512], p[700], q4[600];
    if (t_tmpdir(tmp, sizeof tmp, "gpu-formats")) { T_FAIL("gpu_formats_tmpdir", "mkdtemp"); return T_DONE(); }
    snprintf(model, sizeof model, "%s/model", t_fixtures());
    snprintf(q4, sizeof q4, "%s/transformer-q4", t_fixtures());
    static const struct { const char *name, *file; flux2_export_opts o; double tol; } mc[] = {
        {"gpu_forward_gguf_q4_k", "k.gguf", {1, DT_Q4_K, 1, 0}, TOL_FORWARD},
        {"gpu_forward_gguf_q8_0_sdcpp", "s.gguf", {1, DT_Q8_0, 0, 0}, TOL_FORWARD},
        {"gpu_forward_fp8_file", "f.safetensors", {0, DT_F8_E4M3, 0, 0}, TOL_FORWARD_FP8},
    };
    int written;
    for (size_t i = 0; i < sizeof mc / sizeof mc[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", tmp, mc[i].file);
        if (flux2_export(model, p, &mc[i].o, &written)) { T_FAIL(mc[i].name, "%s", dt_last_error()); continue; }
        model_case(mc[i].name, p, NULL, 0, mc[i].tol);
    }
    snprintf(p, sizeof p, "%s/lora.safetensors", tmp);
    flux2_config tiny;
    flux2_preset("tiny", &tiny);
    if (flux2_synth_lora(&tiny, p, &(flux2_synth_lora_opts){8, 3, FLUX2_LORA_DIFFUSERS, 0})) T_FAIL("gpu_formats_lora_file", "%s", dt_last_error());
    model_case("gpu_forward_lora_side_on_mlx_q4", q4, p, 0, TOL_FORWARD);
    model_case("gpu_forward_lora_merged_bf16", model, p, 0, TOL_FORWARD);
    model_case("gpu_forward_lora_side_bf16", model, p, 1, TOL_FORWARD);
    char k[700];
    snprintf(k, sizeof k, "%s/k.gguf", tmp);
    model_case("gpu_forward_lora_side_on_gguf_q4_k", k, p, 0, TOL_FORWARD);

    /* timings at klein-4B shapes (4608 tokens = 1024^2 + 512 text): the single block's fused projection */
    {
        const int64_t N = 27648, K = 3072, M = 4608;
        float *w = rand_bf((size_t)(N * K), 0.02f);
        dt_linear_src s = {0};
        s.name = "time";
        s.out = N;
        s.in = K;
        s.w_scale = 1;
        uint16_t *wb = malloc(sizeof(uint16_t) * (size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) wb[i] = dt_f32_to_bf16(w[i]);
        s.dtype = DT_BF16;
        s.data = wb;
        time_linear("bf16", &s, M);
        const dt_dtype tt[] = {DT_Q8_0, DT_Q4_K};
        for (int i = 0; i < 2; i++) {
            uint8_t *b = malloc(dt_dtype_bytes(tt[i], N * K));
            dt_ggml_quant(tt[i], w, N * K, b);
            s.dtype = tt[i];
            s.data = b;
            char lab[64];
            snprintf(lab, sizeof lab, "GGUF %s (transient dequant + GEMM)", dt_dtype_name(tt[i]));
            time_linear(lab, &s, M);
            free(b);
        }
        uint8_t *c8 = malloc((size_t)(N * K));
        float amax = dt_fp8_amax(w, N * K);
        for (int64_t i = 0; i < N * K; i++) c8[i] = dt_f32_to_e4m3(w[i] * (DT_E4M3_MAX / amax));
        s.dtype = DT_F8_E4M3;
        s.data = c8;
        s.w_scale = amax / DT_E4M3_MAX;
        time_linear("fp8 e4m3 file (per-token activations)", &s, M);
        free(c8);
        free(wb);
        free(w);
    }
    snprintf(p, sizeof p, "rm -rf '%s'", tmp);
    if (system(p)) {}
    G->destroy(G);
    C->destroy(C);
    return T_DONE();
}
