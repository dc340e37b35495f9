/* common.c — dtype table, error slot, logging, checked allocation, f16 conversion, timers. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"
#include "fp8.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* name, bytes per element (0: block type), values per block, bytes per block (ggml-common.h's block structs) */
static const struct { const char *name; size_t size; int belems; size_t bbytes; } dtype_table[DT_DTYPE_COUNT] = {
    [DT_F32] = {"F32", 4, 1, 4},  [DT_F16] = {"F16", 2, 1, 2}, [DT_BF16] = {"BF16", 2, 1, 2}, [DT_U32] = {"U32", 4, 1, 4},
    [DT_I32] = {"I32", 4, 1, 4},  [DT_I64] = {"I64", 8, 1, 8}, [DT_U8] = {"U8", 1, 1, 1},     [DT_BOOL] = {"BOOL", 1, 1, 1},
    [DT_F64] = {"F64", 8, 1, 8},  [DT_I8] = {"I8", 1, 1, 1},   [DT_U16] = {"U16", 2, 1, 2},   [DT_I16] = {"I16", 2, 1, 2},
    [DT_F8_E4M3] = {"F8_E4M3", 1, 1, 1}, [DT_F8_E5M2] = {"F8_E5M2", 1, 1, 1},
    [DT_Q4_0] = {"Q4_0", 0, 32, 18},  [DT_Q4_1] = {"Q4_1", 0, 32, 20},   [DT_Q5_0] = {"Q5_0", 0, 32, 22},
    [DT_Q5_1] = {"Q5_1", 0, 32, 24},  [DT_Q8_0] = {"Q8_0", 0, 32, 34},   [DT_Q4_K] = {"Q4_K", 0, 256, 144},
    [DT_Q5_K] = {"Q5_K", 0, 256, 176}, [DT_Q6_K] = {"Q6_K", 0, 256, 210},
};

const char *dt_dtype_name(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtype_table[t].name : "?"; }
size_t dt_dtype_size(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtype_table[t].size : 0; }
int dt_dtype_is_block(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT && dtype_table[t].size == 0; }
int dt_dtype_is_fp8(dt_dtype t) { return t == DT_F8_E4M3 || t == DT_F8_E5M2; }
int dt_dtype_block_elems(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtype_table[t].belems : 1; }
size_t dt_dtype_block_bytes(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtype_table[t].bbytes : 0; }

static _Thread_local char err_buf[1024];

void dt_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
}
const char *dt_last_error(void) { return err_buf[0] ? err_buf : "unknown error"; }
void dt_clear_error(void) { err_buf[0] = 0; }

int dt_log_level = 1;
void dt_log(int level, const char *fmt, ...) {
    if (level > dt_log_level) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

static void oom(size_t n) {
    fprintf(stderr, "ditrun: error: out of host memory allocating %zu bytes\n", n);
    exit(1);
}
void *dt_malloc(size_t n) { void *p = malloc(n ? n : 1); if (!p) oom(n); return p; }
void *dt_calloc(size_t n, size_t s) { void *p = calloc(n ? n : 1, s ? s : 1); if (!p) oom(n * s); return p; }
void *dt_realloc(void *q, size_t n) { void *p = realloc(q, n ? n : 1); if (!p) oom(n); return p; }
void *dt_grow(void *p, size_t *cap, size_t need, size_t first) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : first;
    while (need > c) c *= 2;
    *cap = c;
    return dt_realloc(p, c);
}
char *dt_strdup(const char *s) { size_t n = strlen(s) + 1; char *p = dt_malloc(n); memcpy(p, s, n); return p; }

float dt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { /* subnormal */
            float f = ldexpf((float)man, -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 112) << 23) | (man << 13);
    float f; memcpy(&f, &u, 4); return f;
}

uint16_t dt_f32_to_f16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf (65520 rounds up) */
    if (a < 0x38800000u) { /* subnormal or zero in f16 */
        float af; memcpy(&af, &a, 4);
        float r = af * 16777216.0f; /* 2^24: value in units of the smallest subnormal */
        uint32_t q = (uint32_t)lrintf(r);
        return (uint16_t)(sign | q);
    }
    uint32_t e = ((a >> 23) - 112) << 10, m = (a >> 13) & 0x3ffu, rest = a & 0x1fffu;
    uint32_t h = e | m;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

int dt_convert_to_f32(float *dst, const void *src, dt_dtype t, size_t n) {
    switch (t) {
    case DT_F32: memcpy(dst, src, n * 4); return 0;
    case DT_BF16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(s[i]); return 0; }
    case DT_F16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = dt_f16_to_f32(s[i]); return 0; }
    case DT_F64: { const double *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case DT_F8_E4M3: { const uint8_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = dt_e4m3_to_f32(s[i]); return 0; }
    case DT_F8_E5M2: { const uint8_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = dt_e5m2_to_f32(s[i]); return 0; }
    default: return -1;
    }
}

double dt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double dt_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (!(num == num)) return INFINITY;
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

int dt_precision_from_name(const char *name, dt_precision *out) {
    if (name && !strcmp(name, "bf16")) *out = DT_PREC_BF16;
    else if (name && !strcmp(name, "fp8")) *out = DT_PREC_FP8;
    else return -1;
    return 0;
}
