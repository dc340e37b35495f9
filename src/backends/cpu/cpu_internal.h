/* cpu_internal.h — private state and helpers shared by the CPU backend's source files.
 *
 * The CPU backend is the float32 reference: every activation and parameter matrix is F32 host
 * memory (64-byte aligned). Heavy products go through OpenBLAS cblas_sgemm; everything else is
 * split over rows / heads / groups with the backend's own pthread pool (threadpool.h).
 */
#ifndef DT_CPU_INTERNAL_H
#define DT_CPU_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "backends/backend.h"
#include "quant/dequant.h"
#include "threadpool.h"

typedef struct {
    float *p;
    size_t n;          /* capacity in floats */
} cpu_buf;

typedef struct {
    int threads;               /* participants in pool work and OpenBLAS threads for big GEMMs */
    dt_pool *pool;
    atomic_size_t mem_cur, mem_peak;
    cpu_buf shared;            /* one op-wide scratch (linear weight tiles, conv im2col columns) */
    cpu_buf *per_thread;       /* [threads] scratch owned by pool participant tid */
} cpu_impl;

static inline cpu_impl *cpu_of(dt_backend *be) { return (cpu_impl *)be->impl; }

/* Print "ditrun: error: cpu backend: ..." and exit(1) (ops have no error return). */
void cpu_fatal(const char *fmt, ...) DT_PRINTF(1, 2) __attribute__((noreturn));

/* Grow-only scratch: returns a buffer of at least n floats (64-byte aligned). */
float *cpu_buf_get(cpu_buf *b, size_t n);
void cpu_buf_free(cpu_buf *b);

/* Set OpenBLAS's (process-wide) thread count; cached; call only from the thread issuing ops. */
void cpu_blas_threads(cpu_impl *c, int n);

/* Element pointer of an F32 matrix; exits if m is not F32 (name = op name for the message). */
static inline float *cpu_f32(dt_mat m, const char *op) {
    if (m.dtype != DT_F32) cpu_fatal("%s: expected an F32 matrix, got %s", op, dt_dtype_name(m.dtype));
    return (float *)m.data;
}
/* Shape check: exits with a clear line when false. */
#define CPU_REQUIRE(cond, op, ...) do { if (!(cond)) cpu_fatal(op ": " __VA_ARGS__); } while (0)

/* Row grain for pool work so each chunk carries roughly `work` scalar operations. */
static inline int64_t cpu_grain(int64_t per_row, int64_t work) {
    if (per_row < 1) per_row = 1;
    int64_t g = work / per_row;
    return g < 1 ? 1 : g;
}

/* Sums in double with 8 independent partial sums (breaks the add latency chain; vectorisable). */
static inline double cpu_sum_d(const float *x, int64_t n) {
    double p[8] = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) p[u] += x[j + u];
    for (; j < n; j++) p[0] += x[j];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}
/* sum of (x - c)^2 in double */
static inline double cpu_sumsq_d(const float *x, int64_t n, double c) {
    double p[8] = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) { double d = x[j + u] - c; p[u] += d * d; }
    for (; j < n; j++) { double d = x[j] - c; p[0] += d * d; }
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* ---- ops, one file each family ---- */
/* cpu_linear.c */
dt_linear *cpu_linear_create(dt_backend *be, const dt_linear_src *src);
void cpu_linear_destroy(dt_backend *be, dt_linear *w);
const char *cpu_linear_path(dt_backend *be, const dt_linear *w);
void cpu_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w);
/* cpu_attention.c */
void cpu_attention(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale,
                   dt_mat key_bias, int causal);
void cpu_attention_fp8(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale);
/* cpu_elementwise.c */
void cpu_layernorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps);
void cpu_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, float w_offset, float eps);
void cpu_rmsnorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, dt_mat shift, float eps);
void cpu_head_norm_rope(dt_backend *be, dt_mat x, int heads, int hd, dt_mat w, float eps, dt_mat cos, dt_mat sin,
                        dt_rope_mode mode);
void cpu_act_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b, dt_act act);
void cpu_gated_add(dt_backend *be, dt_mat x, dt_mat gate, dt_mat y);
void cpu_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b);
void cpu_axpby(dt_backend *be, dt_mat y, float alpha, dt_mat a, float beta, dt_mat b);
void cpu_flow_step(dt_backend *be, dt_mat x, dt_mat v, dt_mat u, float guidance, int from_cond, float dt);
void cpu_copy(dt_backend *be, dt_mat dst, dt_mat src);
void cpu_transpose(dt_backend *be, dt_mat y, dt_mat x);
void cpu_abs_diff_sums(dt_backend *be, dt_mat a, dt_mat b, double out[2]);
/* cpu_image.c */
dt_conv *cpu_conv_create(dt_backend *be, const float *w, const float *bias, int cout, int cin, int k, int pad);
void cpu_conv_destroy(dt_backend *be, dt_conv *c);
void cpu_conv2d(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w);
void cpu_conv2d_strided(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w, int stride, int pad_top,
                        int pad_left, int pad_bottom, int pad_right);
void cpu_group_norm(dt_backend *be, dt_mat y, dt_mat x, int groups, dt_mat gamma, dt_mat beta, float eps, int silu);
void cpu_upsample2x(dt_backend *be, dt_mat y, dt_mat x, int h, int w);
void cpu_channel_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat gamma, int silu);

#endif
