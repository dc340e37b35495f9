/* test_fp8.c — the fp8 (e4m3) semantics on the CPU: conversion edge values, per-row scaling, and the CPU
 * backend's fp8 Linear (the emulation the CUDA fp8 Linear is tested against in test_gpu_linear) against a
 * double-precision evaluation of the same formula and against the f32 Linear. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "core/fp8.h"
#include "quant/dequant.h"
#include "test.h"

/* Tolerances.
 * Emulation vs double evaluation of sum(e4m3(x)·e4m3(w))·sx·sw: same codes, the only difference is f32
 *   accumulation (K = 512 terms, ~1e-6 relative): 1e-5.
 * fp8 vs f32 Linear: e4m3 keeps 3 mantissa bits (relative rounding up to 2^-4, ~2.6% rms per operand for
 *   values spread over a binade); the error of a sum of products is ~sqrt(2) x that, ~3.7%: 6e-2, while a
 *   wrong scale or a lost row of codes (>= 30%) fails. */
#define TOL_EMU 1e-5
#define TOL_FP8_VS_F32 6e-2

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(float lo, float hi) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 40) * (1.0 / 16777216.0));
}

static void check_code(const char *what, float x, uint8_t want) {
    uint8_t got = dt_f32_to_e4m3(x);
    char name[128];
    snprintf(name, sizeof name, "e4m3(%s) = 0x%02X", what, want);
    T_CHECK(name, got == want, "got 0x%02X", got);
}

static void test_conversion(void) {
    check_code("0", 0.0f, 0x00);
    check_code("-0", -0.0f, 0x80);
    check_code("1", 1.0f, 0x38);
    check_code("1.0625 (tie -> even 1)", 1.0625f, 0x38);
    check_code("1.1875 (tie -> even 1.25)", 1.1875f, 0x3A);
    check_code("-3.1 (-> -3)", -3.1f, 0xC4);
    check_code("2^-6 smallest normal", ldexpf(1, -6), 0x08);
    check_code("2^-9 smallest subnormal", ldexpf(1, -9), 0x01);
    check_code("2^-10 (tie -> even 0)", ldexpf(1, -10), 0x00);
    check_code("3*2^-10 (tie -> even 2^-8)", 3 * ldexpf(1, -10), 0x02);
    check_code("7*2^-10 (tie -> even 4*2^-9)", 7 * ldexpf(1, -10), 0x04);
    check_code("15*2^-10 (subnormal rounds up to 2^-6)", 15 * ldexpf(1, -10), 0x08);
    check_code("448 largest finite", 448.0f, 0x7E);
    check_code("-448", -448.0f, 0xFE);
    check_code("464 (saturates)", 464.0f, 0x7E);
    check_code("1e6 (saturates)", 1e6f, 0x7E);
    check_code("+inf (saturates)", INFINITY, 0x7E);
    check_code("-inf (saturates)", -INFINITY, 0xFE);
    check_code("NaN", NAN, 0x7F);
    /* every finite code round-trips; values are increasing in the code */
    int ok = 1, bad = -1;
    for (int c = 0; c < 0x7F; c++) {
        float v = dt_e4m3_to_f32((uint8_t)c);
        if (dt_f32_to_e4m3(v) != c || dt_f32_to_e4m3(-v) != (c | 0x80) || (c > 0 && !(v > dt_e4m3_to_f32((uint8_t)(c - 1))))) {
            ok = 0; bad = c; break;
        }
    }
    T_CHECK("e4m3 round trip of the 127 finite codes (and their negatives), monotone", ok, "code 0x%02X", bad);
    T_CHECK("e4m3 0x7F decodes to NaN", isnan(dt_e4m3_to_f32(0x7F)) && isnan(dt_e4m3_to_f32(0xFF)), "not NaN");
    T_CHECK("e4m3 0x7E decodes to 448", dt_e4m3_to_f32(0x7E) == 448.0f, "%g", dt_e4m3_to_f32(0x7E));
    /* round to nearest at random points: the result is one of the two neighbours and the closer one */
    ok = 1;
    float badx = 0;
    for (int i = 0; i < 100000 && ok; i++) {
        float x = ldexpf(frand(1.f, 2.f), (int)frand(-12.f, 9.f));
        float v = dt_e4m3_to_f32(dt_f32_to_e4m3(x));
        float lo = 0, hi = 448;
        for (int c = 0; c < 0x7F; c++) {
            float cv = dt_e4m3_to_f32((uint8_t)c);
            if (cv <= x) lo = cv;
            if (cv >= x) { hi = cv; break; }
        }
        float want = x >= 448.f ? 448.f : (x - lo < hi - x ? lo : hi - x < x - lo ? hi : v);
        if (v != want || (v != lo && v != hi && x < 448.f)) { ok = 0; badx = x; }
    }
    T_CHECK("e4m3 rounds to the nearest value (100000 random points)", ok, "x = %.9g", badx);
}

static void test_row_scaling(void) {
    float z[16] = {0};
    uint8_t q[16];
    float s = dt_fp8_quantize_row(z, 16, q, NULL);
    int allz = 1;
    for (int i = 0; i < 16; i++) allz &= q[i] == 0;
    T_CHECK("all-zero row: scale 1, codes 0", s == 1.0f && allz, "scale %g", s);
    float x[4] = {-2.0f, 0.5f, NAN, 1.0f};
    float v[4];
    s = dt_fp8_quantize_row(x, 4, q, v);
    T_CHECK("row amax skips NaN; the amax element maps to -448; NaN stays NaN",
            s == 2.0f / 448.0f && q[0] == 0xFE && v[0] == -448.f && isnan(v[2]), "scale %g code0 0x%02X", s, q[0]);
}

/* CPU fp8 Linear vs a double evaluation of the defined formula, and vs the f32 Linear. */
static void test_linear(int bits) {
    const int64_t M = 64, K = 512, N = 256;
    dt_backend_opts o;
    memset(&o, 0, sizeof o);
    o.threads = 2;
    dt_backend *be = dt_backend_cpu_create(&o);
    if (!be) { T_FAIL("cpu backend", "%s", dt_last_error()); return; }
    float *hx = malloc(sizeof(float) * M * K), *wf = malloc(sizeof(float) * N * K);
    uint16_t *wb = malloc(2 * N * K), *bias = malloc(2 * N);
    for (int64_t i = 0; i < M * K; i++) hx[i] = frand(-2.f, 2.f) * (i % 7 == 0 ? 8.f : 1.f);
    for (int64_t i = 0; i < N * K; i++) { wb[i] = dt_f32_to_bf16(frand(-0.05f, 0.05f)); }
    for (int64_t i = 0; i < N; i++) bias[i] = dt_f32_to_bf16(frand(-0.5f, 0.5f));
    dt_linear_src src;
    memset(&src, 0, sizeof src);
    src.name = "fp8test";
    src.out = N; src.in = K; src.dtype = DT_BF16; src.data = wb; src.bias = bias; src.bias_dtype = DT_BF16;
    uint32_t *packed = NULL;
    uint16_t *sc = NULL, *bi = NULL;
    if (bits) {   /* the same weights as 4-bit MLX affine (group 64) */
        int g = 64;
        int64_t ng = K / g, words = K * bits / 32;
        packed = calloc((size_t)(N * words), 4);
        sc = malloc(2 * N * ng); bi = malloc(2 * N * ng);
        for (int64_t i = 0; i < N * words; i++) { frand(0, 1); packed[i] = (uint32_t)(rng >> 17); }
        for (int64_t i = 0; i < N * ng; i++) { sc[i] = dt_f32_to_bf16(frand(0.002f, 0.01f) * (i & 1 ? -1 : 1)); bi[i] = dt_f32_to_bf16(frand(-0.04f, 0.04f)); }
        src.bits = bits; src.group_size = g; src.dtype = DT_U32; src.data = packed;
        src.sb_dtype = DT_BF16; src.scales = sc; src.biases = bi;
    }
    dt_linear_src_rows_f32(&src, 0, N, wf);
    dt_linear *l32 = be->linear_create(be, &src);
    src.precision = DT_PREC_FP8;
    dt_linear *l8 = be->linear_create(be, &src);
    if (!l32 || !l8) { T_FAIL("cpu linear_create", "%s", dt_last_error()); return; }
    dt_mat x = dt_alloc_or_die(be, M, K, DT_F32), y32 = dt_alloc_or_die(be, M, N, DT_F32), y8 = dt_alloc_or_die(be, M, N, DT_F32);
    be->upload(be, x, hx);
    be->linear(be, y32, x, l32);
    be->linear(be, y8, x, l8);
    float *g32 = malloc(sizeof(float) * M * N), *g8 = malloc(sizeof(float) * M * N), *ref = malloc(sizeof(float) * M * N);
    be->download(be, g32, y32);
    be->download(be, g8, y8);
    /* the defined formula in double */
    float *xv = malloc(sizeof(float) * M * K), *wv = malloc(sizeof(float) * N * K), *sx = malloc(sizeof(float) * M),
          *sw = malloc(sizeof(float) * N);
    for (int64_t m = 0; m < M; m++) sx[m] = dt_fp8_quantize_row(hx + m * K, K, NULL, xv + m * K);
    for (int64_t n = 0; n < N; n++) sw[n] = dt_fp8_quantize_row(wf + n * K, K, NULL, wv + n * K);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) acc += (double)xv[m * K + k] * wv[n * K + k];
            ref[m * N + n] = (float)(acc * sx[m] * sw[n] + dt_bf16_to_f32(bias[n]));
        }
    char name[128];
    snprintf(name, sizeof name, "cpu fp8 linear (%s weights) vs the e4m3 formula in double", bits ? "q4" : "bf16");
    t_check_rel_l2(name, g8, ref, (size_t)(M * N), TOL_EMU);
    snprintf(name, sizeof name, "cpu fp8 linear (%s weights) vs f32 linear", bits ? "q4" : "bf16");
    t_check_rel_l2(name, g8, g32, (size_t)(M * N), TOL_FP8_VS_F32);
    double e = dt_rel_l2(g8, g32, (size_t)(M * N));
    snprintf(name, sizeof name, "cpu fp8 linear (%s weights) is not the f32 linear (rel_l2 %.3g > 1e-3)", bits ? "q4" : "bf16", e);
    T_CHECK(name, e > 1e-3, "fp8 path not taken? rel_l2 %.3g", e);
    be->free(be, &x); be->free(be, &y32); be->free(be, &y8);
    be->linear_destroy(be, l32);
    be->linear_destroy(be, l8);
    be->destroy(be);
    free(hx); free(wf); free(wb); free(bias); free(packed); free(sc); free(bi);
    free(g32); free(g8); free(ref); free(xv); free(wv); free(sx); free(sw);
}

int main(void) {
    test_conversion();
    test_row_scaling();
    test_linear(0);
    test_linear(4);
    return T_DONE();
}
