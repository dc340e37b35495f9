/* test_ggml_quants.c — GGUF block types and safetensors fp8 dtypes against vectors built from the published
 * definitions by tools/ggml_vectors.py (fixtures/ggml_vectors.safetensors): dequantization must match bit for
 * bit. Then the round-to-nearest quantizer: quantize -> dequantize error per type within its bit budget, and
 * the e4m3 / e5m2 encoders round-trip every finite code. */
#include <string.h>

#include "core/fp8.h"
#include "io/safetensors.h"
#include "quant/ggml_quants.h"
#include "test.h"

/* Relative L2 of quantize -> dequantize on Gaussian-like data, per type: the bit budget's expectation with
 * margin (RTN on 32/256-value blocks: ~2^-bits relative step; measured values are printed by the test). */
static const struct { dt_dtype t; double tol; } rtn_tol[] = {
    {DT_Q4_0, 0.12}, {DT_Q4_1, 0.10}, {DT_Q5_0, 0.06}, {DT_Q5_1, 0.05},
    {DT_Q8_0, 0.008}, {DT_Q4_K, 0.12}, {DT_Q5_K, 0.06}, {DT_Q6_K, 0.03},
};

static int same_bits(float a, float b) {
    if (a != a && b != b) return 1;   /* NaN vs NaN (payloads are not part of the definitions) */
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

static uint32_t lcg(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }
static float gauss(uint32_t *s) {
    float u = 0;
    for (int i = 0; i < 12; i++) u += (float)(lcg(s) & 0xFFFF) / 65536.0f;
    return u - 6.0f;
}

int main(void) {
    char path[512], name[128];
    snprintf(path, sizeof path, "%s/ggml_vectors.safetensors", t_fixtures());
    st_file *f = st_open(path);
    if (!f) { T_FAIL("ggml_vectors_open", "%s", dt_last_error()); return T_DONE(); }
    const dt_dtype types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        dt_dtype t = types[k];
        snprintf(name, sizeof name, "%s.blocks", dt_dtype_name(t));
        const st_tensor *b = st_find(f, name);
        snprintf(name, sizeof name, "%s.values", dt_dtype_name(t));
        const st_tensor *v = st_find(f, name);
        snprintf(name, sizeof name, "ggml_dequant_bit_exact_%s", dt_dtype_name(t));
        if (!b || !v || b->nbytes != dt_dtype_bytes(t, v->numel)) { T_FAIL(name, "vectors missing or sized wrong"); continue; }
        float *got = dt_malloc(sizeof(float) * (size_t)v->numel);
        const float *ref = v->data;
        int rc = dt_ggml_dequant(t, b->data, v->numel, got);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < v->numel; i++)
            if (!same_bits(got[i], ref[i])) { bad++; if (first < 0) first = i; }
        T_CHECK(name, rc == 0 && bad == 0, "rc %d, %lld of %lld values differ (first [%lld] got %.9g want %.9g)", rc,
                (long long)bad, (long long)v->numel, (long long)first, first >= 0 ? got[first] : 0.0,
                first >= 0 ? ref[first] : 0.0);
        free(got);
    }
    for (int e = 0; e < 2; e++) {
        const st_tensor *v = st_find(f, e ? "F8_E5M2.values" : "F8_E4M3.values");
        const char *nm = e ? "fp8_e5m2_decode_all_codes" : "fp8_e4m3_decode_all_codes";
        if (!v || v->numel != 256) { T_FAIL(nm, "vectors missing"); continue; }
        uint8_t codes[256];
        float got[256];
        for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
        dt_convert_to_f32(got, codes, e ? DT_F8_E5M2 : DT_F8_E4M3, 256);
        int bad = 0;
        for (int c = 0; c < 256; c++) bad += !same_bits(got[c], ((const float *)v->data)[c]);
        T_CHECK(nm, bad == 0, "%d of 256 codes decode differently", bad);
    }
    st_close(f);

    /* encoders: every finite code survives decode -> encode */
    {
        int bad4 = 0, bad5 = 0;
        for (int c = 0; c < 256; c++) {
            float v4 = dt_e4m3_to_f32((uint8_t)c), v5 = dt_e5m2_to_f32((uint8_t)c);
            if (v4 == v4 && dt_f32_to_e4m3(v4) != (uint8_t)c && !(v4 == 0 && (c & 0x7F) == 0)) bad4++;
            if (v5 == v5 && dt_f32_to_e5m2(v5) != (uint8_t)c) bad5++;
        }
        T_CHECK("fp8_e4m3_encode_round_trip", bad4 == 0, "%d codes", bad4);
        T_CHECK("fp8_e5m2_encode_round_trip", bad5 == 0, "%d codes", bad5);
        /* ties go to even; past 57344 + half a step e5m2 overflows to inf */
        T_CHECK("fp8_e5m2_encode_ties", dt_f32_to_e5m2(1.125f) == 0x3C && dt_f32_to_e5m2(1.375f) == 0x3E &&
                dt_f32_to_e5m2(61439.0f) == 0x7B && dt_f32_to_e5m2(61440.0f) == 0x7C && dt_f32_to_e5m2(-1e9f) == 0xFC,
                "1.125 -> %02x, 1.375 -> %02x, 61439 -> %02x, 61440 -> %02x", dt_f32_to_e5m2(1.125f),
                dt_f32_to_e5m2(1.375f), dt_f32_to_e5m2(61439.0f), dt_f32_to_e5m2(61440.0f));
    }

    /* quantizer: round trip error per type */
    {
        const int64_t n = 256 * 64;
        float *x = dt_malloc(sizeof(float) * n), *y = dt_malloc(sizeof(float) * n);
        uint8_t *blk = dt_malloc((size_t)n * 2);
        uint32_t seed = 99;
        for (int64_t i = 0; i < n; i++) x[i] = gauss(&seed) * (1.0f + (float)(i / 256 % 7));
        for (size_t k = 0; k < sizeof rtn_tol / sizeof rtn_tol[0]; k++) {
            dt_dtype t = rtn_tol[k].t;
            snprintf(name, sizeof name, "ggml_quant_round_trip_%s", dt_dtype_name(t));
            if (dt_ggml_quant(t, x, n, blk) || dt_ggml_dequant(t, blk, n, y)) { T_FAIL(name, "rc"); continue; }
            t_check_rel_l2(name, y, x, (size_t)n, rtn_tol[k].tol);
        }
        /* bad sizes are refused */
        T_CHECK("ggml_quant_rejects_partial_block", dt_ggml_quant(DT_Q4_K, x, 255, blk) == -1 &&
                dt_ggml_dequant(DT_Q8_0, blk, 33, y) == -1 && dt_ggml_dequant(DT_BF16, blk, 32, y) == -1, "accepted");
        free(x); free(y); free(blk);
    }
    return T_DONE();
}
