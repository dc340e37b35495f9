/* fp8.c — e4m3 conversion and per-row scaling (see fp8.h for the exact semantics). */
#include "fp8.h"
#include "common.h"

#include <math.h>

uint8_t dt_f32_to_e4m3(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    if (isnan(x)) return (uint8_t)(sign | 0x7F);
    float a = fabsf(x);
    if (a >= DT_E4M3_MAX) return (uint8_t)(sign | 0x7E);        /* saturate (inf included) */
    int e;
    (void)frexpf(a, &e);                                          /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;                                                       /* a = 1.m * 2^e */
    int code;
    if (a == 0.0f) {
        code = 0;
    } else if (e < -6) {                                          /* subnormal: units of 2^-9 */
        code = (int)rintf(ldexpf(a, 9));                          /* 0..8; 8 = smallest normal (code 8) */
    } else {
        int m = (int)rintf(ldexpf(a, 3 - e)) - 8;                 /* 3 mantissa bits, RNE (exact scaling) */
        if (m == 8) { m = 0; e += 1; }
        code = ((e + 7) << 3) | m;
        if (code > 0x7E) code = 0x7E;
    }
    return (uint8_t)(sign | code);
}

float dt_e4m3_to_f32(uint8_t c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 15 && m == 7) return s ? -NAN : NAN;
    if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return s ? -v : v;
}

float dt_e5m2_to_f32(uint8_t c) { return dt_f16_to_f32((uint16_t)(c << 8)); }

uint8_t dt_f32_to_e5m2(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    if (isnan(x)) return (uint8_t)(sign | 0x7F);
    float a = fabsf(x);
    if (a >= 61440.0f) return (uint8_t)(sign | 0x7C);            /* past the tie above 57344: ±inf */
    int e, code;
    (void)frexpf(a, &e);
    e -= 1;                                                       /* a = 1.m * 2^e */
    if (a == 0.0f) {
        code = 0;
    } else if (e < -14) {                                         /* subnormal: units of 2^-16 */
        code = (int)rintf(ldexpf(a, 16));                         /* 0..4; 4 = smallest normal */
    } else {
        int m = (int)rintf(ldexpf(a, 2 - e)) - 4;                 /* 2 mantissa bits, RNE (exact scaling) */
        if (m == 4) { m = 0; e += 1; }
        code = ((e + 15) << 2) | m;
    }
    return (uint8_t)(sign | code);
}

float dt_fp8_amax(const float *x, int64_t n) {
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));   /* fmaxf skips NaN */
    return a;
}

float dt_fp8_quantize_row(const float *x, int64_t n, uint8_t *codes, float *vals) {
    float amax = dt_fp8_amax(x, n);
    float inv = amax > 0.0f ? DT_E4M3_MAX / amax : 1.0f;
    float scale = amax > 0.0f ? amax / DT_E4M3_MAX : 1.0f;
    for (int64_t i = 0; i < n; i++) {
        uint8_t c = dt_f32_to_e4m3(x[i] * inv);
        if (codes) codes[i] = c;
        if (vals) vals[i] = dt_e4m3_to_f32(c);
    }
    return scale;
}
