/* latents.c — Philox noise, pack/unpack, position ids, batch-norm (de)normalization and
 * (un)patchify for the FLUX.2 latent space (see latents.h for the conventions). */
#include "pipeline/latents.h"

#include <math.h>
#include <pthread.h>
#include <unistd.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void dt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;   /* hi/lo of M0·c0 */
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;   /* hi/lo of M1·c2 */
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

static inline double u32_to_unit(uint32_t x) {
    return ((double)x + 0.5) * (1.0 / 4294967296.0);   /* strictly inside (0, 1) */
}

static void randn_range(uint64_t seed, uint64_t stream, uint64_t offset, float *out, size_t n) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const double two_pi = 6.283185307179586476925286766559;
    size_t i = 0;
    while (i < n) {
        uint64_t e = offset + i;
        uint64_t block = e >> 2;
        uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
        uint32_t r[4];
        dt_philox4x32_10(ctr, key, r);
        double z[4];
        for (int p = 0; p < 2; p++) {
            double rad = sqrt(-2.0 * log(u32_to_unit(r[2 * p])));
            double th = two_pi * u32_to_unit(r[2 * p + 1]);
            z[2 * p] = rad * cos(th);
            z[2 * p + 1] = rad * sin(th);
        }
        for (unsigned lane = (unsigned)(e & 3); lane < 4 && i < n; lane++, i++) out[i] = (float)z[lane];
    }
}

typedef struct {
    uint64_t seed, stream, offset;
    float *out;
    size_t n;
} randn_part;

static void *randn_thread(void *arg) {
    randn_part *p = arg;
    randn_range(p->seed, p->stream, p->offset, p->out, p->n);
    return NULL;
}

/* Element i depends only on (seed, stream, offset + i), so ranges can be drawn on several threads with the same
 * values: a 1024² image's 0.5 M normals (log, sqrt, cos, sin in double) take ~15 ms on one core. */
void dt_randn(uint64_t seed, uint64_t stream, uint64_t offset, float *out, size_t n) {
    enum { MAX_THREADS = 16, PER_THREAD_MIN = 32768 };
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = n / PER_THREAD_MIN;
    if (nt > (size_t)(ncpu > 0 ? ncpu : 1)) nt = (size_t)(ncpu > 0 ? ncpu : 1);
    if (nt > MAX_THREADS) nt = MAX_THREADS;
    if (nt < 2) { randn_range(seed, stream, offset, out, n); return; }
    pthread_t th[MAX_THREADS];
    randn_part part[MAX_THREADS];
    size_t per = (n / nt + 3) & ~(size_t)3, i0 = 0;
    size_t started = 0;
    for (size_t t = 0; t < nt && i0 < n; t++) {
        size_t cnt = t + 1 == nt || i0 + per > n ? n - i0 : per;
        part[t] = (randn_part){seed, stream, offset + i0, out + i0, cnt};
        if (t + 1 < nt && pthread_create(&th[t], NULL, randn_thread, &part[t]) == 0) started = t + 1;
        else randn_range(seed, stream, offset + i0, out + i0, cnt);   /* the last range (or a failed start) here */
        i0 += cnt;
    }
    for (size_t t = 0; t < started; t++) pthread_join(th[t], NULL);
}

void dt_latents_noise(uint64_t seed, int c_packed, int h, int w, float *out) {
    dt_randn(seed, 0, 0, out, (size_t)c_packed * (size_t)h * (size_t)w);
}

void dt_latents_pack(const float *x, int C, int h, int w, float *tokens) {
    const size_t hw = (size_t)h * (size_t)w;
    for (size_t p = 0; p < hw; p++)
        for (int c = 0; c < C; c++) tokens[p * (size_t)C + (size_t)c] = x[(size_t)c * hw + p];
}

void dt_latents_unpack(const float *tokens, int C, int h, int w, float *x) {
    const size_t hw = (size_t)h * (size_t)w;
    for (int c = 0; c < C; c++)
        for (size_t p = 0; p < hw; p++) x[(size_t)c * hw + p] = tokens[p * (size_t)C + (size_t)c];
}

void dt_latents_img_ids(int h, int w, float t, float *ids) {
    for (int r = 0; r < h; r++)
        for (int c = 0; c < w; c++) {
            float *p = ids + ((size_t)r * (size_t)w + (size_t)c) * 4;
            p[0] = t; p[1] = (float)r; p[2] = (float)c; p[3] = 0.0f;
        }
}

void dt_latents_txt_ids(int L, float *ids) {
    for (int l = 0; l < L; l++) {
        float *p = ids + (size_t)l * 4;
        p[0] = 0.0f; p[1] = 0.0f; p[2] = 0.0f; p[3] = (float)l;
    }
}

void dt_latents_bn_denorm(float *x, int C, int64_t hw, const float *mean, const float *var, float eps) {
    for (int c = 0; c < C; c++) {
        const float sd = sqrtf(var[c] + eps), m = mean[c];
        float *row = x + (size_t)c * (size_t)hw;
        for (int64_t i = 0; i < hw; i++) {
            float t = row[i] * sd;   /* separate rounding of the product (no FMA under -std=c11) */
            row[i] = t + m;
        }
    }
}

void dt_latents_bn_norm(float *x, int C, int64_t hw, const float *mean, const float *var, float eps) {
    for (int c = 0; c < C; c++) {
        const float sd = sqrtf(var[c] + eps), m = mean[c];
        float *row = x + (size_t)c * (size_t)hw;
        for (int64_t i = 0; i < hw; i++) row[i] = (row[i] - m) / sd;
    }
}

void dt_latents_unpatchify(const float *x, int c, int h, int w, float *out) {
    const size_t hw = (size_t)h * (size_t)w, W2 = 2 * (size_t)w, HW4 = 4 * hw;
    for (int ch = 0; ch < c; ch++)
        for (int dy = 0; dy < 2; dy++)
            for (int dx = 0; dx < 2; dx++) {
                const float *src = x + (size_t)(4 * ch + 2 * dy + dx) * hw;
                float *dst = out + (size_t)ch * HW4;
                for (int r = 0; r < h; r++)
                    for (int col = 0; col < w; col++)
                        dst[(size_t)(2 * r + dy) * W2 + (size_t)(2 * col + dx)] = src[(size_t)r * (size_t)w + (size_t)col];
            }
}

void dt_latents_patchify(const float *x, int c, int h, int w, float *out) {
    const size_t hw = (size_t)h * (size_t)w, W2 = 2 * (size_t)w, HW4 = 4 * hw;
    for (int ch = 0; ch < c; ch++)
        for (int dy = 0; dy < 2; dy++)
            for (int dx = 0; dx < 2; dx++) {
                const float *src = x + (size_t)ch * HW4;
                float *dst = out + (size_t)(4 * ch + 2 * dy + dx) * hw;
                for (int r = 0; r < h; r++)
                    for (int col = 0; col < w; col++)
                        dst[(size_t)r * (size_t)w + (size_t)col] = src[(size_t)(2 * r + dy) * W2 + (size_t)(2 * col + dx)];
            }
}
