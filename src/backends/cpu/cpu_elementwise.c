/* cpu_elementwise.c — row-wise CPU ops: LayerNorm+modulation, RMSNorm (+ shift), per-head RMSNorm+RoPE,
 * activations, gated residual adds, products, axpby, copy, transpose and abs_diff_sums (two sums of a pair).
 * Every op honours row strides (ld) and splits rows over the backend's thread pool (abs_diff_sums aside: one thread).
 * Reductions (means, variances) are accumulated in double. */
#include <math.h>
#include <stdlib.h>

#include "cpu_internal.h"

#define ROW_WORK (1 << 15)          /* scalar ops per pool chunk, roughly */
#define HEAD_DIM_MAX 1024

static int has(dt_mat m) { return m.data != NULL; }

static void same_shape(dt_mat a, dt_mat b, const char *op) {
    if (a.rows != b.rows || a.cols != b.cols)
        cpu_fatal("%s: shape mismatch [%lld, %lld] vs [%lld, %lld]", op, (long long)a.rows, (long long)a.cols,
                  (long long)b.rows, (long long)b.cols);
}

static const float *row_vec(dt_mat v, int64_t d, const char *op) {
    if (!has(v)) return NULL;
    const float *p = cpu_f32(v, op);
    if (v.cols != d || v.rows < 1)
        cpu_fatal("%s: vector has shape [%lld, %lld], expected [1, %lld]", op, (long long)v.rows, (long long)v.cols,
                  (long long)d);
    return p;
}

/* ---------------- LayerNorm (no affine) * (1 + scale) + shift ---------------- */
typedef struct {
    float *y; const float *x; const float *shift, *scale;
    int64_t ldy, ldx, D; float eps;
} ln_ctx;

static void ln_task(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    ln_ctx *t = vctx;
    const int64_t D = t->D;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = t->x + r * t->ldx;
        float *yr = t->y + r * t->ldy;
        const double mean = cpu_sum_d(xr, D) / (double)D;
        const double v = cpu_sumsq_d(xr, D, mean);
        const double rstd = 1.0 / sqrt(v / (double)D + (double)t->eps);
        for (int64_t j = 0; j < D; j++) {
            float n = (float)((xr[j] - mean) * rstd);
            float sc = t->scale ? t->scale[j] : 0.0f, sh = t->shift ? t->shift[j] : 0.0f;
            yr[j] = n * (1.0f + sc) + sh;
        }
    }
}

void cpu_layernorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps) {
    same_shape(y, x, "layernorm_mod");
    ln_ctx t = { cpu_f32(y, "layernorm_mod"), cpu_f32(x, "layernorm_mod"), row_vec(shift, x.cols, "layernorm_mod"),
                 row_vec(scale, x.cols, "layernorm_mod"), y.ld, x.ld, x.cols, eps };
    if (x.cols == 0) return;
    dt_pool_run(cpu_of(be)->pool, x.rows, cpu_grain(4 * x.cols, ROW_WORK), ln_task, &t);
}

/* ---------------- RMSNorm ---------------- */
typedef struct {
    float *y; const float *x; const float *w;
    const float *shift;   /* [D] added after the weight (rmsnorm_mod), or NULL */
    int64_t ldy, ldx, D; float off, eps;
} rms_ctx;

static void rms_task(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    rms_ctx *t = vctx;
    const int64_t D = t->D;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = t->x + r * t->ldx;
        float *yr = t->y + r * t->ldy;
        const double ss = cpu_sumsq_d(xr, D, 0.0);
        const float rs = (float)(1.0 / sqrt(ss / (double)D + (double)t->eps));
        if (t->w)
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] * rs) * (t->w[j] + t->off);
        else
            for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * rs;
        if (t->shift)
            for (int64_t j = 0; j < D; j++) yr[j] += t->shift[j];
    }
}

void cpu_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, float w_offset, float eps) {
    same_shape(y, x, "rmsnorm");
    rms_ctx t = { cpu_f32(y, "rmsnorm"), cpu_f32(x, "rmsnorm"), row_vec(w, x.cols, "rmsnorm"), NULL, y.ld, x.ld,
                  x.cols, w_offset, eps };
    if (x.cols == 0) return;
    dt_pool_run(cpu_of(be)->pool, x.rows, cpu_grain(3 * x.cols, ROW_WORK), rms_task, &t);
}

void cpu_rmsnorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, dt_mat shift, float eps) {
    same_shape(y, x, "rmsnorm_mod");
    rms_ctx t = { cpu_f32(y, "rmsnorm_mod"), cpu_f32(x, "rmsnorm_mod"), row_vec(w, x.cols, "rmsnorm_mod"),
                  row_vec(shift, x.cols, "rmsnorm_mod"), y.ld, x.ld, x.cols, 0.0f, eps };
    if (x.cols == 0) return;
    dt_pool_run(cpu_of(be)->pool, x.rows, cpu_grain(4 * x.cols, ROW_WORK), rms_task, &t);
}

/* ---------------- per-head RMSNorm + RoPE (in place) ---------------- */
typedef struct {
    float *x; int64_t ldx; int heads, hd;
    const float *w; float eps;
    const float *cos, *sin; int64_t ldc, lds;
    dt_rope_mode mode;
} hnr_ctx;

static void hnr_task(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    hnr_ctx *t = vctx;
    const int hd = t->hd, half = t->hd / 2;
    float tmp[HEAD_DIM_MAX];
    for (int64_t r = r0; r < r1; r++) {
        const float *c = t->cos ? t->cos + r * t->ldc : NULL;
        const float *s = t->sin ? t->sin + r * t->lds : NULL;
        for (int h = 0; h < t->heads; h++) {
            float *xh = t->x + r * t->ldx + (int64_t)h * hd;
            if (t->w) {
                const double ss = cpu_sumsq_d(xh, hd, 0.0);
                const float rs = (float)(1.0 / sqrt(ss / hd + (double)t->eps));
                for (int i = 0; i < hd; i++) tmp[i] = (xh[i] * rs) * t->w[i];
            } else {
                for (int i = 0; i < hd; i++) tmp[i] = xh[i];
            }
            if (t->mode == DT_ROPE_INTERLEAVED) {
                for (int i = 0; i < hd; i += 2) {
                    const float a = tmp[i], b = tmp[i + 1];
                    xh[i] = a * c[i] - b * s[i];
                    xh[i + 1] = b * c[i + 1] + a * s[i + 1];
                }
            } else if (t->mode == DT_ROPE_HALF) {
                for (int i = 0; i < half; i++) xh[i] = tmp[i] * c[i] - tmp[i + half] * s[i];
                for (int i = half; i < hd; i++) xh[i] = tmp[i] * c[i] + tmp[i - half] * s[i];
            } else {
                for (int i = 0; i < hd; i++) xh[i] = tmp[i];
            }
        }
    }
}

void cpu_head_norm_rope(dt_backend *be, dt_mat x, int heads, int hd, dt_mat w, float eps, dt_mat cos, dt_mat sin,
                        dt_rope_mode mode) {
    hnr_ctx t = { cpu_f32(x, "head_norm_rope"), x.ld, heads, hd, row_vec(w, hd, "head_norm_rope"), eps,
                  NULL, NULL, 0, 0, mode };
    CPU_REQUIRE(heads > 0 && hd > 0 && hd <= HEAD_DIM_MAX && (int64_t)heads * hd == x.cols && hd % 2 == 0,
                "head_norm_rope", "x [%lld, %lld] with %d heads of %d (head dim must be even and <= %d)",
                (long long)x.rows, (long long)x.cols, heads, hd, HEAD_DIM_MAX);
    if (mode != DT_ROPE_NONE) {
        CPU_REQUIRE(mode == DT_ROPE_INTERLEAVED || mode == DT_ROPE_HALF, "head_norm_rope", "bad RoPE mode %d", (int)mode);
        t.cos = cpu_f32(cos, "head_norm_rope");
        t.sin = cpu_f32(sin, "head_norm_rope");
        CPU_REQUIRE(t.cos && t.sin && cos.rows >= x.rows && sin.rows >= x.rows && cos.cols == hd && sin.cols == hd,
                    "head_norm_rope", "RoPE tables [%lld, %lld] / [%lld, %lld] do not cover x [%lld, %d heads x %d]",
                    (long long)cos.rows, (long long)cos.cols, (long long)sin.rows, (long long)sin.cols,
                    (long long)x.rows, heads, hd);
        t.ldc = cos.ld; t.lds = sin.ld;
    } else if (!t.w) {
        return;
    }
    dt_pool_run(cpu_of(be)->pool, x.rows, cpu_grain(4 * x.cols, ROW_WORK), hnr_task, &t);
}

/* ---------------- elementwise binary family ---------------- */
enum { EW_ACT_MUL, EW_MUL, EW_AXPBY };
typedef struct {
    int kind; dt_act act;
    float *y; const float *a, *b;       /* b may be NULL */
    int64_t ldy, lda, ldb, cols;
    float alpha, beta;
} ew_ctx;

static inline float act_f(float v, dt_act act) {
    switch (act) {
    case DT_ACT_SILU: return v / (1.0f + expf(-v));
    case DT_ACT_GELU_TANH: {
        const float k = 0.7978845608028654f;   /* sqrt(2/pi) */
        return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
    case DT_ACT_GELU_ERF: return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    case DT_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    }
    return v;
}

static void ew_task(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    ew_ctx *t = vctx;
    const int64_t n = t->cols;
    for (int64_t r = r0; r < r1; r++) {
        float *y = t->y + r * t->ldy;
        const float *a = t->a + r * t->lda;
        const float *b = t->b ? t->b + r * t->ldb : NULL;
        switch (t->kind) {
        case EW_ACT_MUL:
            switch (t->act) {   /* one loop per activation so the switch stays out of the inner loop */
#define ACT_LOOP(A) { if (b) { for (int64_t j = 0; j < n; j++) y[j] = act_f(a[j], A) * b[j]; } \
                    else { for (int64_t j = 0; j < n; j++) y[j] = act_f(a[j], A); } } break;
            case DT_ACT_SILU: ACT_LOOP(DT_ACT_SILU)
            case DT_ACT_GELU_TANH: ACT_LOOP(DT_ACT_GELU_TANH)
            case DT_ACT_GELU_ERF: ACT_LOOP(DT_ACT_GELU_ERF)
            case DT_ACT_SIGMOID: ACT_LOOP(DT_ACT_SIGMOID)
#undef ACT_LOOP
            }
            break;
        case EW_MUL:
            for (int64_t j = 0; j < n; j++) y[j] = a[j] * b[j];
            break;
        case EW_AXPBY:
            if (b) for (int64_t j = 0; j < n; j++) y[j] = t->alpha * a[j] + t->beta * b[j];
            else for (int64_t j = 0; j < n; j++) y[j] = t->alpha * a[j];
            break;
        }
    }
}

void cpu_act_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b, dt_act act) {
    same_shape(y, a, "act_mul");
    ew_ctx t = { EW_ACT_MUL, act, cpu_f32(y, "act_mul"), cpu_f32(a, "act_mul"), NULL, y.ld, a.ld, 0, a.cols, 1, 0 };
    if (has(b)) { same_shape(y, b, "act_mul"); t.b = cpu_f32(b, "act_mul"); t.ldb = b.ld; }
    CPU_REQUIRE(act >= DT_ACT_SILU && act <= DT_ACT_SIGMOID, "act_mul", "bad activation %d", (int)act);
    dt_pool_run(cpu_of(be)->pool, y.rows, cpu_grain(16 * y.cols, ROW_WORK), ew_task, &t);
}

typedef struct { float *x; const float *g, *y; int64_t ldx, ldy, cols; } ga_ctx;

static void ga_task(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    ga_ctx *t = vctx;
    for (int64_t r = r0; r < r1; r++) {
        float *restrict x = t->x + r * t->ldx;
        const float *restrict y = t->y + r * t->ldy;
        if (t->g) { const float *restrict g = t->g; for (int64_t j = 0; j < t->cols; j++) x[j] += g[j] * y[j]; }
        else for (int64_t j = 0; j < t->cols; j++) x[j] += y[j];
    }
}

void cpu_gated_add(dt_backend *be, dt_mat x, dt_mat gate, dt_mat y) {
    same_shape(x, y, "gated_add");
    ga_ctx t = { cpu_f32(x, "gated_add"), row_vec(gate, x.cols, "gated_add"), cpu_f32(y, "gated_add"), x.ld, y.ld,
                 x.cols };
    dt_pool_run(cpu_of(be)->pool, x.rows, cpu_grain(x.cols, ROW_WORK), ga_task, &t);
}

void cpu_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b) {
    same_shape(y, a, "mul");
    same_shape(y, b, "mul");
    ew_ctx t = { EW_MUL, DT_ACT_SILU, cpu_f32(y, "mul"), cpu_f32(a, "mul"), cpu_f32(b, "mul"), y.ld, a.ld, b.ld,
                 a.cols, 1, 0 };
    dt_pool_run(cpu_of(be)->pool, y.rows, cpu_grain(y.cols, ROW_WORK), ew_task, &t);
}

void cpu_axpby(dt_backend *be, dt_mat y, float alpha, dt_mat a, float beta, dt_mat b) {
    same_shape(y, a, "axpby");
    ew_ctx t = { EW_AXPBY, DT_ACT_SILU, cpu_f32(y, "axpby"), cpu_f32(a, "axpby"), NULL, y.ld, a.ld, 0, a.cols, alpha,
                 beta };
    if (has(b)) { same_shape(y, b, "axpby"); t.b = cpu_f32(b, "axpby"); t.ldb = b.ld; }
    dt_pool_run(cpu_of(be)->pool, y.rows, cpu_grain(2 * y.cols, ROW_WORK), ew_task, &t);
}

/* ---------------- flow_step (the sampler's guidance + Euler update; backend.h) ---------------- */
void cpu_flow_step(dt_backend *be, dt_mat x, dt_mat v, dt_mat u, float guidance, int from_cond, float dt) {
    (void)be;
    same_shape(x, v, "flow_step");
    if (has(u)) same_shape(x, u, "flow_step");
    float *xp = cpu_f32(x, "flow_step");
    const float *vp = cpu_f32(v, "flow_step"), *up = has(u) ? cpu_f32(u, "flow_step") : NULL;
    for (int64_t r = 0; r < x.rows; r++)
        for (int64_t c = 0; c < x.cols; c++) {
            const float w = up ? dt_flow_guided(vp[r * v.ld + c], up[r * u.ld + c], guidance, from_cond)
                               : vp[r * v.ld + c];
            xp[r * x.ld + c] = xp[r * x.ld + c] + dt * w;
        }
}

/* ---------------- abs_diff_sums (First Block Cache's decision; backend.h) ---------------- */
/* One element widened to f32. */
static float elem_f32(dt_mat m, int64_t r, int64_t c) {
    if (m.dtype == DT_BF16) return dt_bf16_to_f32(((const uint16_t *)m.data)[r * m.ld + c]);
    return ((const float *)m.data)[r * m.ld + c];
}

/* On one thread in row-major element order, so the sums (and the decisions made from them) are the same on every
 * run and thread count. */
void cpu_abs_diff_sums(dt_backend *be, dt_mat a, dt_mat b, double out[2]) {
    (void)be;
    same_shape(a, b, "abs_diff_sums");
    CPU_REQUIRE((a.dtype == DT_F32 || a.dtype == DT_BF16) && (b.dtype == DT_F32 || b.dtype == DT_BF16),
                "abs_diff_sums", "unsupported dtypes %s, %s", dt_dtype_name(a.dtype), dt_dtype_name(b.dtype));
    double d = 0.0, p = 0.0;
    for (int64_t r = 0; r < a.rows; r++)
        for (int64_t c = 0; c < a.cols; c++) {
            const double va = elem_f32(a, r, c), vb = elem_f32(b, r, c);
            d += fabs(va - vb);
            p += fabs(vb);
        }
    out[0] = d;
    out[1] = p;
}

/* ---------------- copy (F32 / BF16 either side) ---------------- */
typedef struct { dt_mat dst, src; } cp_ctx;

static void cp_task(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    cp_ctx *t = vctx;
    const int64_t n = t->src.cols;
    for (int64_t r = r0; r < r1; r++) {
        char *d = (char *)t->dst.data + (size_t)(r * t->dst.ld) * dt_dtype_size(t->dst.dtype);
        const char *s = (const char *)t->src.data + (size_t)(r * t->src.ld) * dt_dtype_size(t->src.dtype);
        if (t->dst.dtype == t->src.dtype) {
            memmove(d, s, (size_t)n * dt_dtype_size(t->src.dtype));
        } else if (t->dst.dtype == DT_F32) {      /* BF16 -> F32 */
            const uint16_t *sp = (const uint16_t *)s; float *dp = (float *)d;
            for (int64_t j = 0; j < n; j++) dp[j] = dt_bf16_to_f32(sp[j]);
        } else {                                  /* F32 -> BF16 */
            const float *sp = (const float *)s; uint16_t *dp = (uint16_t *)d;
            for (int64_t j = 0; j < n; j++) dp[j] = dt_f32_to_bf16(sp[j]);
        }
    }
}

void cpu_copy(dt_backend *be, dt_mat dst, dt_mat src) {
    same_shape(dst, src, "copy");
    CPU_REQUIRE((dst.dtype == DT_F32 || dst.dtype == DT_BF16) && (src.dtype == DT_F32 || src.dtype == DT_BF16), "copy",
                "unsupported dtypes %s -> %s", dt_dtype_name(src.dtype), dt_dtype_name(dst.dtype));
    cp_ctx t = { dst, src };
    dt_pool_run(cpu_of(be)->pool, src.rows, cpu_grain(src.cols, 1 << 17), cp_task, &t);
}

/* ---------------- transpose: y[N, M] = x[M, N]ᵀ, 32x32 blocks ---------------- */
#define TB 32
typedef struct { float *y; const float *x; int64_t ldy, ldx, M, N; } tr_ctx;

static void tr_task(void *vctx, int64_t b0, int64_t b1, int tid) {
    (void)tid;
    tr_ctx *t = vctx;
    for (int64_t bi = b0; bi < b1; bi++) {            /* block row of x */
        const int64_t i0 = bi * TB, i1 = i0 + TB < t->M ? i0 + TB : t->M;
        for (int64_t j0 = 0; j0 < t->N; j0 += TB) {
            const int64_t j1 = j0 + TB < t->N ? j0 + TB : t->N;
            for (int64_t j = j0; j < j1; j++)
                for (int64_t i = i0; i < i1; i++) t->y[j * t->ldy + i] = t->x[i * t->ldx + j];
        }
    }
}

void cpu_transpose(dt_backend *be, dt_mat y, dt_mat x) {
    CPU_REQUIRE(y.rows == x.cols && y.cols == x.rows, "transpose", "y [%lld, %lld] for x [%lld, %lld]",
                (long long)y.rows, (long long)y.cols, (long long)x.rows, (long long)x.cols);
    tr_ctx t = { cpu_f32(y, "transpose"), cpu_f32(x, "transpose"), y.ld, x.ld, x.rows, x.cols };
    CPU_REQUIRE(t.y != t.x || x.rows * x.cols <= 1, "transpose", "y must not alias x");
    dt_pool_run(cpu_of(be)->pool, (x.rows + TB - 1) / TB, cpu_grain(TB * x.cols, 1 << 16), tr_task, &t);
}
