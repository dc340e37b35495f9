/* cpu_linear.c — Linear layers on the CPU: y[M,N] = x[M,K] · Wᵀ (+ bias), W [N,K].
 *
 * Weights stay as the zero-copy host views of dt_linear_src (mmap'd files): F32 dense weights go
 * straight into cblas_sgemm; F16/BF16 dense, MLX affine 4/8-bit, fp8 (value · scale) and GGUF block
 * weights are converted one tile of rows at a time (dt_linear_src_rows_f32) into scratch and multiplied
 * into the matching output columns, so the model is never expanded to f32 as a whole.
 *   small M (<= CPU_SMALL_M, e.g. modulation vectors): each pool thread converts its own chunk of
 *     weight rows and runs a single-threaded sgemm for those output columns;
 *   large M: a ~8 MB tile is converted by the pool, then one multi-threaded sgemm consumes it.
 * fp8 (src->precision == DT_PREC_FP8): the emulation the CUDA fp8 Linear is tested against. At create the
 * weight rows are dequantized to f32 and stored as e4m3 codes [N,K] with one scale per row (core/fp8.h);
 * at run time each activation row is quantized the same way (values kept as unscaled e4m3 in f32), the
 * f32 sgemm multiplies the e4m3 values (exact products, f32 sums), and y[m,n] = acc * sx[m] * sw[n] + bias.
 */
#include <cblas.h>
#include <stdlib.h>

#include "core/fp8.h"
#include "cpu_internal.h"

#define CPU_SMALL_M 64
#define CPU_TILE_BYTES (8u << 20)        /* large-M weight tile (f32) */
#define CPU_CHUNK_BYTES (512u << 10)     /* small-M per-thread weight chunk (f32) */

struct dt_linear {
    dt_linear_src src;     /* views into the caller's mapped weights */
    char *name;            /* own copy of src.name */
    float *bias;           /* [N] f32, or NULL */
    uint8_t *q8;           /* fp8: e4m3 codes [N, K], or NULL */
    float *s8;             /* fp8: per-output-channel scales [N] */
    const char *path;      /* how it runs, in words (linear_path) */
};

/* fp8 weights: rows converted by the pool (each thread its own f32 row buffer). */
typedef struct { cpu_impl *c; dt_linear *w; } q8_ctx;

static void q8_task(void *vctx, int64_t i0, int64_t i1, int tid) {
    q8_ctx *t = vctx;
    const int64_t K = t->w->src.in;
    float *row = cpu_buf_get(&t->c->per_thread[tid], (size_t)K);
    for (int64_t n = i0; n < i1; n++) {
        dt_linear_src_rows_f32(&t->w->src, n, 1, row);
        t->w->s8[n] = dt_fp8_quantize_row(row, K, t->w->q8 + n * K, NULL);
    }
}

dt_linear *cpu_linear_create(dt_backend *be, const dt_linear_src *src) {
    (void)be;
    if (!src || src->out <= 0 || src->in <= 0 || !src->data) {
        dt_set_error("cpu backend: linear '%s': empty weight", src && src->name ? src->name : "?");
        return NULL;
    }
    if (src->out > INT32_MAX || src->in > INT32_MAX) {
        dt_set_error("cpu backend: linear '%s': shape too large for BLAS", src->name ? src->name : "?");
        return NULL;
    }
    if (src->bits == 0) {
        if (!dt_linear_src_dense(src) && !dt_linear_src_fp8(src) && !dt_linear_src_blocks(src)) {
            dt_set_error("cpu backend: linear '%s': unsupported weight dtype %s", src->name ? src->name : "?",
                         dt_dtype_name(src->dtype));
            return NULL;
        }
    } else if (src->bits != 4 && src->bits != 8) {
        dt_set_error("cpu backend: linear '%s': unsupported %d-bit quantization", src->name ? src->name : "?",
                     src->bits);
        return NULL;
    } else if (!src->scales || !src->biases || src->group_size <= 0 || src->in % src->group_size) {
        dt_set_error("cpu backend: linear '%s': bad affine quantization parameters", src->name ? src->name : "?");
        return NULL;
    }
    dt_linear *w = dt_calloc(1, sizeof *w);
    w->src = *src;
    w->name = dt_strdup(src->name ? src->name : "linear");
    w->src.name = w->name;
    if (src->precision == DT_PREC_FP8) {
        w->q8 = dt_malloc((size_t)src->out * (size_t)src->in);
        w->s8 = dt_malloc((size_t)src->out * sizeof(float));
        q8_ctx t = { cpu_of(be), w };
        dt_pool_run(cpu_of(be)->pool, src->out, cpu_grain(src->in, 1 << 18), q8_task, &t);
    }
    if (src->bias) {
        w->bias = dt_malloc((size_t)src->out * sizeof(float));
        if (dt_convert_to_f32(w->bias, src->bias, src->bias_dtype, (size_t)src->out) != 0) {
            dt_set_error("cpu backend: linear '%s': unsupported bias dtype %s", w->name, dt_dtype_name(src->bias_dtype));
            cpu_linear_destroy(be, w);
            return NULL;
        }
    }
    w->path = src->precision == DT_PREC_FP8 ? "fp8 emulated in f32 (e4m3 weights, per-row e4m3 activations)"
              : src->bits ? "dequantized to f32 per tile of rows, then sgemm"
              : "f32 sgemm on the stored weights (converted per tile when not f32)";
    return w;
}

const char *cpu_linear_path(dt_backend *be, const dt_linear *w) {
    (void)be;
    return w->path;
}

void cpu_linear_destroy(dt_backend *be, dt_linear *w) {
    (void)be;
    if (!w) return;
    free(w->bias);
    free(w->q8);
    free(w->s8);
    free(w->name);
    free(w);
}

/* ---- small M: per-thread chunk conversion + single-threaded sgemm ---- */
typedef struct {
    cpu_impl *c;
    const dt_linear *w;
    const float *x; int64_t ldx;     /* x [M, K] */
    float *y; int64_t ldy;           /* y [M, N] */
    int64_t M, K, chunk;
} small_ctx;

static void small_task(void *vctx, int64_t i0, int64_t i1, int tid) {
    small_ctx *t = vctx;
    float *buf = cpu_buf_get(&t->c->per_thread[tid], (size_t)(t->chunk * t->K));
    for (int64_t n0 = i0 * t->chunk; n0 < i1 * t->chunk && n0 < t->w->src.out; n0 += t->chunk) {
        int64_t nr = t->w->src.out - n0 < t->chunk ? t->w->src.out - n0 : t->chunk;
        dt_linear_src_rows_f32(&t->w->src, n0, nr, buf);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->M, (int)nr, (int)t->K, 1.0f, t->x, (int)t->ldx,
                    buf, (int)t->K, 0.0f, t->y + n0, (int)t->ldy);
    }
}

/* ---- large M: pool converts a tile of rows ---- */
typedef struct {
    const dt_linear_src *src;
    float *buf;          /* tile [nt, K] */
    int64_t n0, K;
} conv_ctx;

static void conv_task(void *vctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    conv_ctx *t = vctx;
    dt_linear_src_rows_f32(t->src, t->n0 + i0, i1 - i0, t->buf + i0 * t->K);
}

/* ---- bias add over rows ---- */
typedef struct { float *y; int64_t ldy, N; const float *bias; } bias_ctx;

static void bias_task(void *vctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    bias_ctx *t = vctx;
    for (int64_t r = i0; r < i1; r++) {
        float *restrict yr = t->y + r * t->ldy;
        const float *restrict b = t->bias;
        for (int64_t j = 0; j < t->N; j++) yr[j] += b[j];
    }
}

/* ---- fp8 emulation ---- */
typedef struct { const float *x; int64_t ldx, K; float *xq, *sx; } xq_ctx;

static void xq_task(void *vctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    xq_ctx *t = vctx;
    for (int64_t r = i0; r < i1; r++) t->sx[r] = dt_fp8_quantize_row(t->x + r * t->ldx, t->K, NULL, t->xq + r * t->K);
}

typedef struct { const uint8_t *q; const float *lut; float *buf; int64_t n0, K; } q8conv_ctx;

static void q8conv_task(void *vctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    q8conv_ctx *t = vctx;
    for (int64_t r = i0; r < i1; r++) {
        const uint8_t *q = t->q + (t->n0 + r) * t->K;
        float *d = t->buf + r * t->K;
        for (int64_t k = 0; k < t->K; k++) d[k] = t->lut[q[k]];
    }
}

typedef struct { float *y; int64_t ldy, N; const float *sx, *sw; } scale_ctx;

static void scale_task(void *vctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    scale_ctx *t = vctx;
    for (int64_t r = i0; r < i1; r++) {
        float *restrict yr = t->y + r * t->ldy;
        const float sx = t->sx[r];
        for (int64_t j = 0; j < t->N; j++) yr[j] = yr[j] * sx * t->sw[j];
    }
}

/* Weight rows dequantized per tile: a multiple of 64 whose f32 copy fits CPU_TILE_BYTES (at least 64, at most N). */
static int64_t tile_rows(int64_t K, int64_t N) {
    int64_t nt = (int64_t)(CPU_TILE_BYTES / sizeof(float)) / K;
    nt = nt / 64 * 64;
    if (nt < 64) nt = 64;
    if (nt > N) nt = N;
    return nt;
}

static void cpu_linear_fp8(cpu_impl *c, float *Y, int64_t ldy, const float *X, int64_t ldx, int64_t M,
                           const dt_linear *w) {
    const int64_t K = w->src.in, N = w->src.out;
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = dt_e4m3_to_f32((uint8_t)i);
    /* activations: unscaled e4m3 values [M, K] and row scales [M] in one scratch */
    float *xq = dt_malloc((size_t)(M * K + M) * sizeof(float));
    float *sx = xq + M * K;
    xq_ctx xt = { X, ldx, K, xq, sx };
    dt_pool_run(c->pool, M, cpu_grain(K, 1 << 16), xq_task, &xt);
    int64_t nt = tile_rows(K, N);
    float *buf = cpu_buf_get(&c->shared, (size_t)(nt * K));
    for (int64_t n0 = 0; n0 < N; n0 += nt) {
        int64_t nr = N - n0 < nt ? N - n0 : nt;
        q8conv_ctx t = { w->q8, lut, buf, n0, K };
        dt_pool_run(c->pool, nr, (nr + 4 * c->threads - 1) / (4 * c->threads), q8conv_task, &t);
        cpu_blas_threads(c, c->threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)nr, (int)K, 1.0f, xq, (int)K, buf, (int)K,
                    0.0f, Y + n0, (int)ldy);
    }
    scale_ctx st = { Y, ldy, N, sx, w->s8 };
    dt_pool_run(c->pool, M, cpu_grain(N, 1 << 16), scale_task, &st);
    free(xq);
}

void cpu_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w) {
    cpu_impl *c = cpu_of(be);
    const float *X = cpu_f32(x, "linear");
    float *Y = cpu_f32(y, "linear");
    const int64_t M = x.rows, K = x.cols, N = w->src.out;
    CPU_REQUIRE(K == w->src.in && y.cols == N && y.rows == M, "linear",
                "'%s' [%lld, %lld] got x [%lld, %lld] y [%lld, %lld]", w->name, (long long)N, (long long)w->src.in,
                (long long)x.rows, (long long)x.cols, (long long)y.rows, (long long)y.cols);
    CPU_REQUIRE(M <= INT32_MAX && x.ld <= INT32_MAX && y.ld <= INT32_MAX, "linear", "'%s': matrix too large", w->name);
    CPU_REQUIRE(M == 0 || X != Y, "linear", "'%s': y must not alias x", w->name);
    if (M == 0) return;

    if (w->q8) {
        cpu_linear_fp8(c, Y, y.ld, X, x.ld, M, w);
    } else if (w->src.bits == 0 && w->src.dtype == DT_F32) {
        const float *W = w->src.data;
        cpu_blas_threads(c, c->threads);
        if (M == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)N, (int)K, 1.0f, W, (int)K, X, 1, 0.0f, Y, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, X, (int)x.ld, W, (int)K,
                        0.0f, Y, (int)y.ld);
    } else if (M <= CPU_SMALL_M) {
        int64_t chunk = (int64_t)(CPU_CHUNK_BYTES / sizeof(float)) / K;
        int64_t fair = (N + 2 * c->threads - 1) / (2 * c->threads);   /* at least ~2 chunks per thread */
        if (chunk > fair) chunk = fair;
        if (chunk < 8) chunk = 8;
        small_ctx t = { c, w, X, x.ld, Y, y.ld, M, K, chunk };
        cpu_blas_threads(c, 1);
        dt_pool_run(c->pool, (N + chunk - 1) / chunk, 1, small_task, &t);
    } else {
        int64_t nt = tile_rows(K, N);
        float *buf = cpu_buf_get(&c->shared, (size_t)(nt * K));
        for (int64_t n0 = 0; n0 < N; n0 += nt) {
            int64_t nr = N - n0 < nt ? N - n0 : nt;
            conv_ctx t = { &w->src, buf, n0, K };
            dt_pool_run(c->pool, nr, (nr + 4 * c->threads - 1) / (4 * c->threads), conv_task, &t);
            cpu_blas_threads(c, c->threads);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)nr, (int)K, 1.0f, X, (int)x.ld, buf,
                        (int)K, 0.0f, Y + n0, (int)y.ld);
        }
    }
    if (w->bias) {
        bias_ctx t = { Y, y.ld, N, w->bias };
        dt_pool_run(c->pool, M, cpu_grain(N, 1 << 16), bias_task, &t);
    }
}
