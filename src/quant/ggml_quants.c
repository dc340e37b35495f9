/* ggml_quants.c — dequantization and a round-to-nearest quantizer for GGUF's block types (layouts and
 * arithmetic: ggml_quants.h). Written from the published block definitions; tests/test_ggml_quants.c checks
 * dequantization bit for bit against vectors that tools/ggml_vectors.py packs independently. */
#include "ggml_quants.h"

#include <math.h>
#include <string.h>

static float h2f(const uint8_t *p) { return dt_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
static void f2h(uint8_t *p, float v) { uint16_t h = dt_f32_to_f16(v); p[0] = (uint8_t)h; p[1] = (uint8_t)(h >> 8); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void wr32(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24); }

/* 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of a Q4_K / Q5_K block. */
static void k_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void deq_q4_0(const uint8_t *b, float *y) {
    const float d = h2f(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

static void deq_q4_1(const uint8_t *b, float *y) {
    const float d = h2f(b), m = h2f(b + 2);
    for (int j = 0; j < 16; j++) {
        float a = (float)(b[4 + j] & 0xF) * d, c = (float)(b[4 + j] >> 4) * d;
        y[j] = a + m;
        y[j + 16] = c + m;
    }
}

static void deq_q5_0(const uint8_t *b, float *y) {
    const float d = h2f(b);
    const uint32_t qh = rd32(b + 2);
    for (int j = 0; j < 16; j++) {
        int h0 = (int)((qh >> j) & 1u) << 4, h1 = (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = (float)(((b[6 + j] & 0xF) | h0) - 16) * d;
        y[j + 16] = (float)(((b[6 + j] >> 4) | h1) - 16) * d;
    }
}

static void deq_q5_1(const uint8_t *b, float *y) {
    const float d = h2f(b), m = h2f(b + 2);
    const uint32_t qh = rd32(b + 4);
    for (int j = 0; j < 16; j++) {
        int h0 = (int)((qh >> j) & 1u) << 4, h1 = (int)((qh >> (j + 16)) & 1u) << 4;
        float a = (float)((b[8 + j] & 0xF) | h0) * d, c = (float)((b[8 + j] >> 4) | h1) * d;
        y[j] = a + m;
        y[j + 16] = c + m;
    }
}

static void deq_q8_0(const uint8_t *b, float *y) {
    const float d = h2f(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q4_K (hb == NULL) and Q5_K (hb = qh[32]): 4 groups of 64 values, each from 32 bytes of qs. */
static void deq_k45(const uint8_t *b, const uint8_t *hb, const uint8_t *qs, float *y) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4;
    for (int g = 0; g < 4; g++) {
        int sc, mn;
        k_scale_min(2 * g, scales, &sc, &mn);
        const float d1 = d * (float)sc, m1 = dmin * (float)mn;
        k_scale_min(2 * g + 1, scales, &sc, &mn);
        const float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * g + l] & 0xF, hi = qs[32 * g + l] >> 4;
            if (hb) {
                lo |= ((hb[l] >> (2 * g)) & 1) << 4;
                hi |= ((hb[l] >> (2 * g + 1)) & 1) << 4;
            }
            float a = d1 * (float)lo, c = d2 * (float)hi;
            y[64 * g + l] = a - m1;
            y[64 * g + 32 + l] = c - m2;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = h2f(b + 208);
    for (int n = 0; n < 2; n++) {
        for (int l = 0; l < 32; l++) {
            int q[4];
            q[0] = ((ql[64 * n + l] & 0xF) | (((qh[32 * n + l] >> 0) & 3) << 4)) - 32;
            q[1] = ((ql[64 * n + l + 32] & 0xF) | (((qh[32 * n + l] >> 2) & 3) << 4)) - 32;
            q[2] = ((ql[64 * n + l] >> 4) | (((qh[32 * n + l] >> 4) & 3) << 4)) - 32;
            q[3] = ((ql[64 * n + l + 32] >> 4) | (((qh[32 * n + l] >> 6) & 3) << 4)) - 32;
            for (int k = 0; k < 4; k++) {
                int v = 128 * n + 32 * k + l;
                float ds = d * (float)sc[v / 16];
                y[v] = ds * (float)q[k];
            }
        }
    }
}

int dt_ggml_dequant(dt_dtype t, const void *blocks, int64_t n, float *dst) {
    if (!dt_dtype_is_block(t)) return -1;
    const int qk = dt_dtype_block_elems(t);
    const size_t bb = dt_dtype_block_bytes(t);
    if (n < 0 || n % qk) return -1;
    const uint8_t *b = blocks;
    for (int64_t i = 0; i < n / qk; i++, b += bb, dst += qk) {
        switch (t) {
        case DT_Q4_0: deq_q4_0(b, dst); break;
        case DT_Q4_1: deq_q4_1(b, dst); break;
        case DT_Q5_0: deq_q5_0(b, dst); break;
        case DT_Q5_1: deq_q5_1(b, dst); break;
        case DT_Q8_0: deq_q8_0(b, dst); break;
        case DT_Q4_K: deq_k45(b, NULL, b + 16, dst); break;
        case DT_Q5_K: deq_k45(b, b + 16, b + 48, dst); break;
        case DT_Q6_K: deq_q6_k(b, dst); break;
        default: return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ quantizers */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Symmetric 32-value blocks (Q4_0, Q5_0, Q8_0): the value of largest magnitude maps to the end of the range. */
static void q_sym32(const float *x, uint8_t *b, int bits) {
    float amax = 0, vmax = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); vmax = x[j]; }
    if (bits == 8) {
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        f2h(b, d);
        for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)clampi((int)lrintf(x[j] * id), -127, 127);
        return;
    }
    const int half = 1 << (bits - 1), top = 2 * half - 1;
    const float d = vmax / (float)-half, id = d ? 1.0f / d : 0.0f;
    f2h(b, d);
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = clampi((int)lrintf(x[j] * id) + half, 0, top);
    uint8_t *qs = b + (bits == 4 ? 2 : 6);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    if (bits == 5) wr32(b + 2, qh);
}

/* Asymmetric 32-value blocks (Q4_1, Q5_1): x = q·d + m over [min, max]. */
static void q_asym32(const float *x, uint8_t *b, int bits) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) { lo = fminf(lo, x[j]); hi = fmaxf(hi, x[j]); }
    const int top = (1 << bits) - 1;
    const float d = (hi - lo) / (float)top, id = d ? 1.0f / d : 0.0f;
    f2h(b, d);
    f2h(b + 2, lo);
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = clampi((int)lrintf((x[j] - lo) * id), 0, top);
    uint8_t *qs = b + (bits == 4 ? 4 : 8);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    if (bits == 5) wr32(b + 4, qh);
}

/* Q4_K / Q5_K: 8 sub-blocks of 32, x ≈ (d·sc)·q - (dmin·mn) with 6-bit sc, mn and min <= 0. */
static void q_k45(const float *x, uint8_t *b, int bits) {
    const int top = (1 << bits) - 1;
    float scale[8], mins[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = x[32 * j];
        for (int l = 0; l < 32; l++) { lo = fminf(lo, x[32 * j + l]); hi = fmaxf(hi, x[32 * j + l]); }
        scale[j] = (hi - lo) / (float)top;
        mins[j] = -lo;
        smax = fmaxf(smax, scale[j]);
        mmax = fmaxf(mmax, mins[j]);
    }
    const float d = smax / 63.0f, dmin = mmax / 63.0f;
    f2h(b, d);
    f2h(b + 2, dmin);
    const float dh = h2f(b), dminh = h2f(b + 2);
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = dh > 0 ? clampi((int)lrintf(scale[j] / dh), 0, 63) : 0;
        mn[j] = dminh > 0 ? clampi((int)lrintf(mins[j] / dminh), 0, 63) : 0;
    }
    uint8_t *s = b + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
    uint8_t *qh = bits == 5 ? b + 16 : NULL, *qs = bits == 5 ? b + 48 : b + 16;
    if (qh) memset(qh, 0, 32);
    int q[256];
    for (int j = 0; j < 8; j++) {
        const float d1 = dh * (float)sc[j], m1 = dminh * (float)mn[j], id = d1 ? 1.0f / d1 : 0.0f;
        for (int l = 0; l < 32; l++) q[32 * j + l] = clampi((int)lrintf((x[32 * j + l] + m1) * id), 0, top);
    }
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            int lo = q[64 * g + l], hi = q[64 * g + 32 + l];
            qs[32 * g + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
            if (qh) qh[l] |= (uint8_t)(((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
        }
}

/* Q6_K: 16 sub-blocks of 16, x ≈ (d·sc)·(q - 32) with int8 sc. */
static void q_q6_k(const float *x, uint8_t *b) {
    float scale[16], smax = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0, vmax = 0;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * j + l]) > amax) { amax = fabsf(x[16 * j + l]); vmax = x[16 * j + l]; }
        scale[j] = vmax / -32.0f;
        smax = fmaxf(smax, fabsf(scale[j]));
    }
    const float d = smax / 127.0f;
    f2h(b + 208, d);
    const float dh = h2f(b + 208);
    int8_t *sc = (int8_t *)(b + 192);
    int q[256];
    for (int j = 0; j < 16; j++) {
        sc[j] = (int8_t)(dh > 0 ? clampi((int)lrintf(scale[j] / dh), -127, 127) : 0);
        const float ds = dh * (float)sc[j], id = ds ? 1.0f / ds : 0.0f;
        for (int l = 0; l < 16; l++) q[16 * j + l] = clampi((int)lrintf(x[16 * j + l] * id), -32, 31) + 32;
    }
    uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            int q1 = q[128 * n + l], q2 = q[128 * n + l + 32], q3 = q[128 * n + l + 64], q4 = q[128 * n + l + 96];
            ql[64 * n + l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
            ql[64 * n + l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
            qh[32 * n + l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
}

int dt_ggml_quant(dt_dtype t, const float *src, int64_t n, void *blocks) {
    if (!dt_dtype_is_block(t)) return -1;
    const int qk = dt_dtype_block_elems(t);
    const size_t bb = dt_dtype_block_bytes(t);
    if (n < 0 || n % qk) return -1;
    uint8_t *b = blocks;
    for (int64_t i = 0; i < n / qk; i++, b += bb, src += qk) {
        memset(b, 0, bb);
        switch (t) {
        case DT_Q4_0: q_sym32(src, b, 4); break;
        case DT_Q5_0: q_sym32(src, b, 5); break;
        case DT_Q8_0: q_sym32(src, b, 8); break;
        case DT_Q4_1: q_asym32(src, b, 4); break;
        case DT_Q5_1: q_asym32(src, b, 5); break;
        case DT_Q4_K: q_k45(src, b, 4); break;
        case DT_Q5_K: q_k45(src, b, 5); break;
        case DT_Q6_K: q_q6_k(src, b); break;
        default: return -1;
        }
    }
    return 0;
}
