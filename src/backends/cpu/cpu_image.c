/* cpu_image.c — VAE image ops on the CPU. Images are [C, H*W] (channel-major, one image).
 *   conv2d      stride 1, square kernel k, zero padding pad: im2col of a band of output rows
 *               (bounded scratch, ~32 MB) + multi-threaded sgemm with weights [cout, cin*k*k]
 *   conv2d_strided  the same with any stride and per-side zero padding (the encoder's Downsample2D)
 *   group_norm  statistics over (C/groups) x HW accumulated per channel in double, two passes
 *               (mean, then centred squares), affine, optional fused SiLU
 *   upsample2x  nearest neighbour
 *   channel_rmsnorm  per pixel over the channels: sums of squares in double, accumulated channel by
 *               channel over a band of pixels (contiguous rows), then one scaling pass
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "cpu_internal.h"

#define CONV_COL_FLOATS ((size_t)8 << 20)   /* im2col band, 32 MB */

struct dt_conv {
    int cout, cin, k, pad;
    float *w;        /* [cout, cin*k*k] */
    float *bias;     /* [cout] or NULL */
    size_t bytes;    /* counted in mem_stats */
};

dt_conv *cpu_conv_create(dt_backend *be, const float *w, const float *bias, int cout, int cin, int k, int pad) {
    if (!w || cout <= 0 || cin <= 0 || k <= 0 || pad < 0) {
        dt_set_error("cpu backend: conv2d: bad parameters cout %d cin %d k %d pad %d", cout, cin, k, pad);
        return NULL;
    }
    cpu_impl *c = cpu_of(be);
    dt_conv *cv = dt_calloc(1, sizeof *cv);
    cv->cout = cout; cv->cin = cin; cv->k = k; cv->pad = pad;
    size_t n = (size_t)cout * cin * k * k;
    cv->w = dt_malloc(n * sizeof(float));
    memcpy(cv->w, w, n * sizeof(float));
    cv->bytes = n * sizeof(float);
    if (bias) {
        cv->bias = dt_malloc((size_t)cout * sizeof(float));
        memcpy(cv->bias, bias, (size_t)cout * sizeof(float));
        cv->bytes += (size_t)cout * sizeof(float);
    }
    size_t cur = atomic_fetch_add(&c->mem_cur, cv->bytes) + cv->bytes;
    size_t peak = atomic_load(&c->mem_peak);
    while (cur > peak && !atomic_compare_exchange_weak(&c->mem_peak, &peak, cur)) {}
    return cv;
}

void cpu_conv_destroy(dt_backend *be, dt_conv *cv) {
    if (!cv) return;
    atomic_fetch_sub(&cpu_of(be)->mem_cur, cv->bytes);
    free(cv->w);
    free(cv->bias);
    free(cv);
}

typedef struct {
    const float *x; int64_t ldx;
    float *col;                     /* [cin*k*k, np] */
    int h, w, k, stride, pt, pl, wo;
    int64_t oy0, noy;               /* band of output rows */
} im2col_ctx;

static void im2col_task(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    im2col_ctx *t = vctx;
    const int k = t->k, wo = t->wo, s = t->stride;
    const int64_t np = t->noy * wo;
    for (int64_t rr = r0; rr < r1; rr++) {      /* rr = (ci*k + ky)*k + kx */
        const int kx = (int)(rr % k), ky = (int)((rr / k) % k);
        const int64_t ci = rr / ((int64_t)k * k);
        const float *xc = t->x + ci * t->ldx;
        float *dst = t->col + rr * np;
        for (int64_t oy = t->oy0; oy < t->oy0 + t->noy; oy++) {
            float *d = dst + (oy - t->oy0) * wo;
            const int64_t iy = oy * s + ky - t->pt;
            if (iy < 0 || iy >= t->h) { memset(d, 0, (size_t)wo * sizeof(float)); continue; }
            const float *srow = xc + iy * t->w;
            /* valid ox: 0 <= ox*s + kx - pl < w  <=>  ceil((pl - kx)/s) <= ox < ceil((w + pl - kx)/s) */
            const int a = t->pl - kx, b = t->w + t->pl - kx;
            int lo = a <= 0 ? 0 : (a + s - 1) / s, hi = b <= 0 ? 0 : (b + s - 1) / s;      /* [lo, hi) */
            if (hi > wo) hi = wo;
            if (lo > hi) lo = hi;
            for (int ox = 0; ox < lo; ox++) d[ox] = 0.0f;
            if (s == 1) {
                for (int ox = lo; ox < hi; ox++) d[ox] = srow[ox + kx - t->pl];
            } else {
                for (int ox = lo; ox < hi; ox++) d[ox] = srow[ox * s + kx - t->pl];
            }
            for (int ox = hi; ox < wo; ox++) d[ox] = 0.0f;
        }
    }
}

typedef struct { float *y; int64_t ldy, n; const float *b; } cbias_ctx;

static void cbias_task(void *vctx, int64_t c0, int64_t c1, int tid) {
    (void)tid;
    cbias_ctx *t = vctx;
    for (int64_t c = c0; c < c1; c++) {
        float *yr = t->y + c * t->ldy;
        const float b = t->b[c];
        for (int64_t j = 0; j < t->n; j++) yr[j] += b;
    }
}

/* y [cout, ho*wo] = conv(x [cin, h*w]) with stride s and zero padding pt/pl/pb/pr. */
static void conv_run(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *cv, int h, int w, int s, int pt, int pl,
                     int pb, int pr, const char *op) {
    cpu_impl *c = cpu_of(be);
    const float *X = cpu_f32(x, op);
    float *Y = cpu_f32(y, op);
    CPU_REQUIRE(s >= 1 && pt >= 0 && pl >= 0 && pb >= 0 && pr >= 0, "conv2d", "stride %d pads %d %d %d %d", s, pt, pl, pb, pr);
    const int ho = h + pt + pb >= cv->k ? (h + pt + pb - cv->k) / s + 1 : 0;
    const int wo = w + pl + pr >= cv->k ? (w + pl + pr - cv->k) / s + 1 : 0;
    CPU_REQUIRE(h > 0 && w > 0 && ho > 0 && wo > 0 && x.rows == cv->cin && x.cols == (int64_t)h * w &&
                y.rows == cv->cout && y.cols == (int64_t)ho * wo, "conv2d",
                "x [%lld, %lld] y [%lld, %lld] for %dx%d image, conv %d->%d k %d stride %d pads %d %d %d %d",
                (long long)x.rows, (long long)x.cols, (long long)y.rows, (long long)y.cols, h, w, cv->cin, cv->cout,
                cv->k, s, pt, pl, pb, pr);
    CPU_REQUIRE(X != Y, "conv2d", "y must not alias x");
    CPU_REQUIRE(x.ld <= INT32_MAX && y.ld <= INT32_MAX, "conv2d", "image too large");
    const int64_t ckk = (int64_t)cv->cin * cv->k * cv->k;
    if (cv->k == 1 && s == 1 && pt == 0 && pl == 0 && pb == 0 && pr == 0) {   /* 1x1: plain product, no im2col */
        cpu_blas_threads(c, c->threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, cv->cout, (int)(ho * wo), cv->cin, 1.0f, cv->w,
                    cv->cin, X, (int)x.ld, 0.0f, Y, (int)y.ld);
    } else {
        int64_t band = (int64_t)(CONV_COL_FLOATS / (size_t)(ckk * wo));
        if (band < 1) band = 1;
        if (band > ho) band = ho;
        float *col = cpu_buf_get(&c->shared, (size_t)(ckk * band * wo));
        for (int64_t oy0 = 0; oy0 < ho; oy0 += band) {
            const int64_t noy = ho - oy0 < band ? ho - oy0 : band;
            const int64_t np = noy * wo;
            CPU_REQUIRE(np <= INT32_MAX, "conv2d", "band too large");
            im2col_ctx t = { X, x.ld, col, h, w, cv->k, s, pt, pl, wo, oy0, noy };
            dt_pool_run(c->pool, ckk, cpu_grain(np, 1 << 15), im2col_task, &t);
            cpu_blas_threads(c, c->threads);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, cv->cout, (int)np, (int)ckk, 1.0f, cv->w, (int)ckk,
                        col, (int)np, 0.0f, Y + oy0 * wo, (int)y.ld);
        }
    }
    if (cv->bias) {
        cbias_ctx t = { Y, y.ld, (int64_t)ho * wo, cv->bias };
        dt_pool_run(c->pool, cv->cout, cpu_grain((int64_t)ho * wo, 1 << 16), cbias_task, &t);
    }
}

void cpu_conv2d(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *cv, int h, int w) {
    conv_run(be, y, x, cv, h, w, 1, cv->pad, cv->pad, cv->pad, cv->pad, "conv2d");
}

void cpu_conv2d_strided(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *cv, int h, int w, int stride, int pad_top,
                        int pad_left, int pad_bottom, int pad_right) {
    conv_run(be, y, x, cv, h, w, stride, pad_top, pad_left, pad_bottom, pad_right, "conv2d_strided");
}

/* ---------------- GroupNorm ---------------- */
typedef struct {
    float *y; const float *x; int64_t ldy, ldx, hw;
    int cg;                        /* channels per group */
    double *acc;                   /* [C] per-channel partial sums */
    const double *gmean, *grstd;   /* [groups] */
    const float *gamma, *beta;
    int pass, silu;
} gn_ctx;

static void gn_task(void *vctx, int64_t c0, int64_t c1, int tid) {
    (void)tid;
    gn_ctx *t = vctx;
    for (int64_t ch = c0; ch < c1; ch++) {
        const float *xr = t->x + ch * t->ldx;
        const int64_t g = ch / t->cg;
        if (t->pass == 0) {
            t->acc[ch] = cpu_sum_d(xr, t->hw);
        } else if (t->pass == 1) {
            t->acc[ch] = cpu_sumsq_d(xr, t->hw, t->gmean[g]);
        } else {
            float *yr = t->y + ch * t->ldy;
            const double m = t->gmean[g], rs = t->grstd[g];
            const float ga = t->gamma ? t->gamma[ch] : 1.0f, be = t->beta ? t->beta[ch] : 0.0f;
            for (int64_t j = 0; j < t->hw; j++) {
                float v = (float)((xr[j] - m) * rs) * ga + be;
                yr[j] = t->silu ? v / (1.0f + expf(-v)) : v;
            }
        }
    }
}

void cpu_group_norm(dt_backend *be, dt_mat y, dt_mat x, int groups, dt_mat gamma, dt_mat beta, float eps, int silu) {
    CPU_REQUIRE(y.rows == x.rows && y.cols == x.cols, "group_norm", "y [%lld, %lld] for x [%lld, %lld]",
                (long long)y.rows, (long long)y.cols, (long long)x.rows, (long long)x.cols);
    const int64_t C = x.rows, HW = x.cols;
    CPU_REQUIRE(groups > 0 && C % groups == 0, "group_norm", "%lld channels not divisible into %d groups", (long long)C,
                groups);
    gn_ctx t = { cpu_f32(y, "group_norm"), cpu_f32(x, "group_norm"), y.ld, x.ld, HW, (int)(C / groups), NULL, NULL,
                 NULL, NULL, NULL, 0, silu };
    if (gamma.data) {
        t.gamma = cpu_f32(gamma, "group_norm");
        CPU_REQUIRE(gamma.cols == C, "group_norm", "gamma has %lld entries for %lld channels", (long long)gamma.cols,
                    (long long)C);
    }
    if (beta.data) {
        t.beta = cpu_f32(beta, "group_norm");
        CPU_REQUIRE(beta.cols == C, "group_norm", "beta has %lld entries for %lld channels", (long long)beta.cols,
                    (long long)C);
    }
    if (C == 0 || HW == 0) return;
    dt_pool *pool = cpu_of(be)->pool;
    double *acc = dt_malloc((size_t)C * sizeof(double));
    double *gm = dt_malloc((size_t)groups * 2 * sizeof(double)), *gr = gm + groups;
    const double n = (double)t.cg * (double)HW;
    t.acc = acc; t.gmean = gm; t.grstd = gr;
    const int64_t grain = cpu_grain(HW, 1 << 16);
    t.pass = 0;
    dt_pool_run(pool, C, grain, gn_task, &t);
    for (int g = 0; g < groups; g++) {
        double s = 0;
        for (int i = 0; i < t.cg; i++) s += acc[(int64_t)g * t.cg + i];
        gm[g] = s / n;
    }
    t.pass = 1;
    dt_pool_run(pool, C, grain, gn_task, &t);
    for (int g = 0; g < groups; g++) {
        double s = 0;
        for (int i = 0; i < t.cg; i++) s += acc[(int64_t)g * t.cg + i];
        gr[g] = 1.0 / sqrt(s / n + (double)eps);
    }
    t.pass = 2;
    dt_pool_run(pool, C, cpu_grain(4 * HW, 1 << 16), gn_task, &t);
    free(acc);
    free(gm);
}

/* ---------------- nearest 2x upsample ---------------- */
typedef struct { float *y; const float *x; int64_t ldy, ldx; int h, w; } up_ctx;

static void up_task(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    up_ctx *t = vctx;
    const int w = t->w, w2 = 2 * t->w;
    for (int64_t r = r0; r < r1; r++) {          /* r = c*h + iy */
        const int64_t ch = r / t->h, iy = r % t->h;
        const float *s = t->x + ch * t->ldx + iy * w;
        float *d0 = t->y + ch * t->ldy + (2 * iy) * w2, *d1 = d0 + w2;
        for (int ix = 0; ix < w; ix++) d0[2 * ix] = d0[2 * ix + 1] = s[ix];
        memcpy(d1, d0, (size_t)w2 * sizeof(float));
    }
}

void cpu_upsample2x(dt_backend *be, dt_mat y, dt_mat x, int h, int w) {
    CPU_REQUIRE(h > 0 && w > 0 && x.cols == (int64_t)h * w && y.rows == x.rows && y.cols == 4 * x.cols, "upsample2x",
                "x [%lld, %lld] y [%lld, %lld] for a %dx%d image", (long long)x.rows, (long long)x.cols,
                (long long)y.rows, (long long)y.cols, h, w);
    up_ctx t = { cpu_f32(y, "upsample2x"), cpu_f32(x, "upsample2x"), y.ld, x.ld, h, w };
    CPU_REQUIRE(t.y != t.x, "upsample2x", "y must not alias x");
    dt_pool_run(cpu_of(be)->pool, x.rows * h, cpu_grain(4 * (int64_t)w, 1 << 16), up_task, &t);
}

/* ---------------- channel RMS norm ---------------- */
#define CRN_BAND 256   /* pixels per task: the band's sums stay in a small stack array */

typedef struct {
    float *y; const float *x; int64_t ldy, ldx, C, hw;
    const float *gamma;
    float scale;        /* sqrt(C) */
    int silu;
} crn_ctx;

static void crn_task(void *vctx, int64_t b0, int64_t b1, int tid) {
    (void)tid;
    crn_ctx *t = vctx;
    double ss[CRN_BAND];
    float inv[CRN_BAND];
    for (int64_t b = b0; b < b1; b++) {
        const int64_t p0 = b * CRN_BAND, np = t->hw - p0 < CRN_BAND ? t->hw - p0 : CRN_BAND;
        for (int64_t j = 0; j < np; j++) ss[j] = 0.0;
        for (int64_t c = 0; c < t->C; c++) {
            const float *xr = t->x + c * t->ldx + p0;
            for (int64_t j = 0; j < np; j++) ss[j] += (double)xr[j] * xr[j];
        }
        for (int64_t j = 0; j < np; j++) {
            double n = sqrt(ss[j]);
            inv[j] = (float)(1.0 / (n > 1e-12 ? n : 1e-12));
        }
        for (int64_t c = 0; c < t->C; c++) {
            const float *xr = t->x + c * t->ldx + p0;
            float *yr = t->y + c * t->ldy + p0;
            const float g = t->gamma ? t->gamma[c] : 1.0f;
            for (int64_t j = 0; j < np; j++) {
                float v = xr[j] * inv[j] * t->scale * g;
                yr[j] = t->silu ? v / (1.0f + expf(-v)) : v;
            }
        }
    }
}

void cpu_channel_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat gamma, int silu) {
    CPU_REQUIRE(y.rows == x.rows && y.cols == x.cols, "channel_rmsnorm", "y [%lld, %lld] for x [%lld, %lld]",
                (long long)y.rows, (long long)y.cols, (long long)x.rows, (long long)x.cols);
    crn_ctx t = { cpu_f32(y, "channel_rmsnorm"), cpu_f32(x, "channel_rmsnorm"), y.ld, x.ld, x.rows, x.cols, NULL,
                  sqrtf((float)x.rows), silu };
    if (gamma.data) {
        t.gamma = cpu_f32(gamma, "channel_rmsnorm");
        CPU_REQUIRE(gamma.cols == x.rows, "channel_rmsnorm", "gamma has %lld entries for %lld channels",
                    (long long)gamma.cols, (long long)x.rows);
    }
    if (x.rows == 0 || x.cols == 0) return;
    const int64_t bands = (x.cols + CRN_BAND - 1) / CRN_BAND;
    dt_pool_run(cpu_of(be)->pool, bands, cpu_grain(x.rows * CRN_BAND * 2, 1 << 16), crn_task, &t);
}
