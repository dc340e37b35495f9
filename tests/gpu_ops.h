/* gpu_ops.h — what the GPU op tests (tests/test_gpu_*.c) and the kernel studies (dev/) share: the random inputs,
 * the two backends (G: CUDA, C: the CPU reference) and their setup, host <-> device helpers, random Linear
 * weights, and the event timing of a Linear. Header-only; each program includes it once.
 *
 * Inputs are drawn at random (never zeros) and rounded to bf16 before they go to both backends, so the two see
 * identical values. DITRUN_SEED=N fixes the random seed (default: time based, printed).
 */
#ifndef DT_TESTS_GPU_OPS_H
#define DT_TESTS_GPU_OPS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend_cuda.h"
#include "backends/backend_ext.h"
#include "test.h"

/* GEMMs against the f32 CPU backend (relative L2): the only differences are fp32 accumulation order and the
 * final bf16 rounding of y (relative error 2^-9 per element, ~1.1e-3 rms); quantized paths also round the
 * dequantized weight to bf16 (another ~1.1e-3). 1e-2 leaves headroom while a lost k-tile or a wrong group
 * (>= 0.1) fails. */
#define TOL_GEMM 1e-2
/* Two quantized paths against each other: same bf16 weights, different summation order, both outputs bf16
 * rounded: ~1.6e-3 expected; 5e-3. */
#define TOL_QPATH 5e-3

static uint64_t rng_state __attribute__((unused));
static inline uint64_t xorshift(void) {
    uint64_t x = rng_state;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return rng_state = x;
}
static inline float frand(float lo, float hi) { return lo + (hi - lo) * (float)((xorshift() >> 40) * (1.0 / 16777216.0)); }
static inline float *rand_bf(size_t n, float lo, float hi) {   /* random values representable in bf16 */
    float *v = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) {
        float f = dt_bf16_round(frand(lo, hi));
        if (f == 0.f) f = dt_bf16_round(hi * 0.25f);   /* never zeros */
        v[i] = f;
    }
    return v;
}

static dt_backend *G __attribute__((unused)), *C __attribute__((unused));   /* GPU, CPU */
static dt_cuda_opts *CO __attribute__((unused));
static const dt_ext_profiling *GP __attribute__((unused));         /* G's timing events (backend_ext.h) */
static const dt_ext_fp8_internals *GF8 __attribute__((unused));    /* G's fp8 Linear internals */     /* G's live options: a test pins a variant around its calls and restores it */

static inline dt_mat up(dt_backend *be, const float *h, int64_t rows, int64_t cols, dt_dtype t) {
    dt_mat m = dt_alloc_or_die(be, rows, cols, t);
    be->upload(be, m, h);
    return m;
}
static inline dt_mat upa(dt_backend *be, const float *h, int64_t rows, int64_t cols) { return up(be, h, rows, cols, be->act_dtype); }
static inline float *down(dt_backend *be, dt_mat m) {
    float *h = malloc((size_t)m.rows * m.cols * sizeof(float) + 4);
    be->download(be, h, m);
    return h;
}
static inline void poison(dt_backend *be, dt_mat m) {
    size_t n = (size_t)m.rows * m.cols;
    float *h = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    be->upload(be, m, h);
    free(h);
}
/* Row subsets used for the big ops: the first SUB_A rows and the last SUB_B rows. */
#define SUB_A 128
#define SUB_B 64

static inline double median(double *v, int n) {
    for (int i = 1; i < n; i++) for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return v[n / 2];
}

static inline void pause_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Opens the two backends (G, CO, C) with the test programs' options and seeds the random inputs. Returns -1 when
 * ready, else the exit status the program should end with now: 0 after "SKIP prog: no CUDA GPU" (1 instead with
 * DITRUN_REQUIRE_GPU=1), 1 when a backend cannot be created. *t_create (may be NULL): the CUDA backend's creation
 * time in seconds. */
static inline int gpu_ops_open(const char *prog, double *t_create) {
    if (!dt_backend_cuda_available()) {
        if (t_require_gpu_env()) {
            printf("FAIL %s: no CUDA GPU available (DITRUN_REQUIRE_GPU=1)\n", prog);
            return 1;
        }
        printf("SKIP %s: no CUDA GPU available (no device or driver)\n", prog);
        return 0;
    }
    const char *se = getenv("DITRUN_SEED");
    uint64_t seed = se && *se ? strtoull(se, NULL, 10) : (uint64_t)time(NULL);
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    printf("# %s seed %llu (DITRUN_SEED to repeat)\n", prog, (unsigned long long)seed);
    dt_backend_opts o;
    memset(&o, 0, sizeof o);
    o.rope_fp32 = 1;
    o.qpath = DT_QPATH_AUTO;
    double tc0 = dt_now();
    G = dt_backend_cuda_create(&o);
    if (t_create) *t_create = dt_now() - tc0;
    if (!G) { printf("FAIL %s: cuda backend: %s\n", prog, dt_last_error()); return 1; }
    CO = dt_backend_cuda_opts(G);
    GP = dt_backend_profiling(G);
    GF8 = dt_backend_fp8_internals(G);
    if (!GP) { printf("FAIL %s: cuda backend: no profiling extension\n", prog); return 1; }
    C = dt_backend_cpu_create(&o);
    if (!C) { printf("FAIL %s: cpu backend: %s\n", prog, dt_last_error()); return 1; }
    return -1;
}
/* Prints the CUDA backend's memory high-water mark and destroys both backends. */
static inline void gpu_ops_close(void) {
    size_t cur, peak;
    G->mem_stats(G, &cur, &peak);
    printf("# gpu memory: current %.1f MiB, peak %.1f MiB\n", cur / 1048576.0, peak / 1048576.0);
    G->destroy(G);
    C->destroy(C);
}

/* Random Linear weights [N, K]: bf16 (bits 0) or MLX affine packed (bits 4/8, group), optional bf16 bias; the
 * host arrays behind src are owned by the struct (free_weights). */
typedef struct {
    dt_linear_src src;
    uint16_t *wbf;
    uint32_t *packed;
    uint16_t *scales, *biases, *bias;
} wsrc;

static inline wsrc make_weights(int64_t N, int64_t K, int bits, int group, int with_bias) {
    wsrc w;
    memset(&w, 0, sizeof w);
    w.src.name = "test";
    w.src.out = N;
    w.src.in = K;
    w.src.bits = bits;
    if (bits == 0) {
        w.wbf = malloc((size_t)N * K * 2);
        float a = 1.f / sqrtf((float)K) * 1.7f;
        for (int64_t i = 0; i < N * K; i++) {
            uint16_t b = dt_f32_to_bf16(frand(-a, a));
            if (b == 0) b = 0x3c00;
            w.wbf[i] = b;
        }
        w.src.dtype = DT_BF16;
        w.src.data = w.wbf;
    } else {
        int64_t words = K * bits / 32, ng = K / group;
        w.packed = malloc((size_t)N * words * 4);
        for (int64_t i = 0; i < N * words; i++) w.packed[i] = (uint32_t)(xorshift() >> 17);
        w.scales = malloc((size_t)N * ng * 2);
        w.biases = malloc((size_t)N * ng * 2);
        float qmax = (float)((1 << bits) - 1);
        float a = 1.f / sqrtf((float)K) * 1.7f;
        for (int64_t i = 0; i < N * ng; i++) {
            float s = frand(0.3f, 1.f) * 2.f * a / qmax;
            if (xorshift() & 1) s = -s;                    /* MLX scales can be negative */
            w.scales[i] = dt_f32_to_bf16(s);
            w.biases[i] = dt_f32_to_bf16(s > 0 ? -a * frand(0.8f, 1.f) : a * frand(0.8f, 1.f));
        }
        w.src.dtype = DT_U32;
        w.src.data = w.packed;
        w.src.group_size = group;
        w.src.sb_dtype = DT_BF16;
        w.src.scales = w.scales;
        w.src.biases = w.biases;
    }
    if (with_bias) {
        w.bias = malloc((size_t)N * 2);
        for (int64_t i = 0; i < N; i++) w.bias[i] = dt_f32_to_bf16(frand(-0.5f, 0.5f));
        w.src.bias_dtype = DT_BF16;
        w.src.bias = w.bias;
    }
    return w;
}
static inline void free_weights(wsrc *w) { free(w->wbf); free(w->packed); free(w->scales); free(w->biases); free(w->bias); }

/* A Linear of w created under quantized path qp (f32_math: the mixed GEMM's f32 dequantization even for
 * bf16-exact scales); the backend's options are restored. */
static inline dt_linear *linear_as(const wsrc *w, dt_qpath qp, int f32_math) {
    dt_qpath saved = G->opts.qpath;
    int saved_math = CO->qgemm_f32_math;
    G->opts.qpath = qp;
    CO->qgemm_f32_math = f32_math;
    dt_linear *l = G->linear_create(G, &w->src);
    CO->qgemm_f32_math = saved_math;
    G->opts.qpath = saved;
    return l;
}

/* QK-norm weights [1, hd] and RoPE tables cos / sin [L, hd] (random, in range) on G, for the studies of the
 * single block's attention (dev/). */
static inline void norm_rope_params(int64_t L, int64_t hd, dt_mat *nw, dt_mat *cs, dt_mat *sn) {
    float *hw = rand_bf((size_t)hd, 0.5f, 1.5f);
    *nw = dt_param_upload(G, hw, hd);
    float *hcs = malloc((size_t)L * hd * 2 * sizeof(float));
    for (int64_t i = 0; i < L * hd; i++) { float t = 0.001f * (float)(i % 9973); hcs[i] = cosf(t); hcs[L * hd + i] = sinf(t); }
    *cs = up(G, hcs, L, hd, DT_F32);
    *sn = up(G, hcs + L * hd, L, hd, DT_F32);
    free(hw); free(hcs);
}

/* Event timing of G->linear: 3 warm-up calls, the median of 20, in ms. */
static inline double linear_ms(dt_mat y, dt_mat x, dt_linear *w) {
    void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
    for (int i = 0; i < 3; i++) G->linear(G, y, x, w);
    double t[20];
    for (int i = 0; i < 20; i++) {
        GP->event_record(G, e0);
        G->linear(G, y, x, w);
        GP->event_record(G, e1);
        t[i] = GP->event_elapsed_ms(G, e0, e1);
    }
    GP->event_destroy(G, e0);
    GP->event_destroy(G, e1);
    return median(t, 20);
}

/* linear_ms as one TIME line with its TFLOPS. */
static inline void time_linear(const char *name, dt_mat y, dt_mat x, dt_linear *w, int64_t M, int64_t N, int64_t K) {
    double ms = linear_ms(y, x, w);
    printf("TIME %-44s %8.3f ms  %7.1f TFLOPS\n", name, ms, 2.0 * M * N * K / (ms * 1e-3) / 1e12);
}

#endif
