/* test_cpu_ops.c — the CPU backend's ops against naive double-precision references written here.
 *
 * Every op runs on fresh random inputs (seeded xorshift) at small shapes and at klein-4B-like
 * shapes where cheap; inputs and outputs are strided views (ld > cols) to check row strides.
 * Linear is checked with F32 / F16 / BF16 dense and MLX affine 4/8-bit weights built here.
 * Ends with timings (not assertions) of linear and attention at 1 thread vs all threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backends/backend.h"
#include "backends/backend_ext.h"
#include "core/fp8.h"
#include "test.h"

/* f32 arithmetic vs a double reference: sums of up to ~3k products round at ~1e-7 relative each;
 * 1e-5 relative L2 leaves ~10x headroom for sgemm/expf/tanhf rounding while catching any real bug. */
#define TOL_F32 1e-5

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t xorshift(void) {
    uint64_t x = rng_state;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return rng_state = x;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)((xorshift() >> 40) * (1.0 / 16777216.0)); }
static float *rand_vec(size_t n, float lo, float hi) {
    float *v = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) v[i] = frand(lo, hi);
    return v;
}

static dt_backend *be;

/* A backend matrix allocated wider than needed, with a column view into it (ld > cols). */
typedef struct { dt_mat base, v; } tm;
static tm tm_new(int64_t rows, int64_t cols, int pad) {
    tm t;
    t.base = dt_alloc_or_die(be, rows, cols + pad, DT_F32);
    t.v = dt_mat_cols(t.base, pad / 2, cols);
    float *junk = rand_vec((size_t)(rows * (cols + pad)), -9, 9);   /* garbage outside the view */
    be->upload(be, t.base, junk);
    free(junk);
    return t;
}
static tm tm_up(const float *host, int64_t rows, int64_t cols, int pad) {
    tm t = tm_new(rows, cols, pad);
    be->upload(be, t.v, host);
    return t;
}
static float *tm_down(tm t) {
    float *h = malloc((size_t)(t.v.rows * t.v.cols) * sizeof(float) + 1);
    be->download(be, h, t.v);
    return h;
}
static void tm_free(tm *t) { be->free(be, &t->base); }

static void to_float(float *dst, const double *src, size_t n) { for (size_t i = 0; i < n; i++) dst[i] = (float)src[i]; }

/* Checks the view's contents against a double reference. */
static int check(const char *name, tm t, const double *ref) {
    size_t n = (size_t)(t.v.rows * t.v.cols);
    float *got = tm_down(t), *rf = malloc(n * sizeof(float) + 1);
    to_float(rf, ref, n);
    int ok = t_check_rel_l2(name, got, rf, n, TOL_F32);
    free(got); free(rf);
    return ok;
}

/* ================================ linear ================================ */
typedef enum { W_F32, W_F16, W_BF16, W_Q4, W_Q8 } wkind;
static const char *wkind_name[] = { "f32", "f16", "bf16", "q4", "q8" };

typedef struct {
    dt_linear_src src;
    void *data, *scales, *biases; float *bias;
    double *wref;     /* [N, K] exact weight values */
} test_w;

static void make_weight(test_w *tw, wkind kind, int64_t N, int64_t K, int group, int with_bias) {
    memset(tw, 0, sizeof *tw);
    tw->wref = malloc((size_t)(N * K) * sizeof(double));
    dt_linear_src *s = &tw->src;
    s->name = "test.linear"; s->out = N; s->in = K;
    if (kind == W_F32 || kind == W_F16 || kind == W_BF16) {
        size_t es = kind == W_F32 ? 4 : 2;
        tw->data = malloc((size_t)(N * K) * es);
        for (int64_t i = 0; i < N * K; i++) {
            float v = frand(-0.05f, 0.05f);
            if (kind == W_F32) { ((float *)tw->data)[i] = v; tw->wref[i] = v; }
            else if (kind == W_F16) { uint16_t h = dt_f32_to_f16(v); ((uint16_t *)tw->data)[i] = h; tw->wref[i] = dt_f16_to_f32(h); }
            else { uint16_t h = dt_f32_to_bf16(v); ((uint16_t *)tw->data)[i] = h; tw->wref[i] = dt_bf16_to_f32(h); }
        }
        s->dtype = kind == W_F32 ? DT_F32 : kind == W_F16 ? DT_F16 : DT_BF16;
    } else {
        int bits = kind == W_Q4 ? 4 : 8, per = 32 / bits;
        uint32_t mask = (1u << bits) - 1;
        int64_t words = K / per, ng = K / group;
        uint32_t *pk = malloc((size_t)(N * words) * 4);
        uint16_t *sc = malloc((size_t)(N * ng) * 2), *bi = malloc((size_t)(N * ng) * 2);
        for (int64_t i = 0; i < N * words; i++) pk[i] = (uint32_t)(xorshift() >> 16);
        for (int64_t i = 0; i < N * ng; i++) {
            float m = frand(0.001f, 0.01f) * (bits == 8 ? 1.0f / 16 : 1.0f);
            sc[i] = dt_f32_to_bf16((xorshift() & 1) ? m : -m);     /* negative scales too */
            bi[i] = dt_f32_to_bf16(frand(-0.06f, 0.06f));
        }
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                uint32_t word = pk[n * words + k / per];
                uint32_t q = (word >> (bits * (k % per))) & mask;   /* element j of a word, low bits first */
                int64_t g = n * ng + k / group;
                tw->wref[n * K + k] = (double)dt_bf16_to_f32(sc[g]) * q + (double)dt_bf16_to_f32(bi[g]);
            }
        tw->data = pk; tw->scales = sc; tw->biases = bi;
        s->bits = bits; s->group_size = group; s->dtype = DT_U32; s->sb_dtype = DT_BF16;
        s->scales = sc; s->biases = bi;
    }
    s->data = tw->data;
    if (with_bias) {
        tw->bias = rand_vec((size_t)N, -1, 1);
        s->bias = tw->bias; s->bias_dtype = DT_F32;
    }
}
static void free_weight(test_w *tw) { free(tw->data); free(tw->scales); free(tw->biases); free(tw->bias); free(tw->wref); }

static void test_linear(wkind kind, int64_t M, int64_t K, int64_t N, int group, int with_bias, int pad) {
    char name[128];
    snprintf(name, sizeof name, "linear %s M=%lld K=%lld N=%lld%s%s", wkind_name[kind], (long long)M, (long long)K,
             (long long)N, with_bias ? " +bias" : "", pad ? " strided" : "");
    test_w tw;
    make_weight(&tw, kind, N, K, group, with_bias);
    float *x = rand_vec((size_t)(M * K), -1, 1);
    double *ref = malloc((size_t)(M * N) * sizeof(double));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const float *xr = x + m * K; const double *wr = tw.wref + n * K;
            double s = with_bias ? tw.bias[n] : 0;
            for (int64_t k = 0; k < K; k++) s += (double)xr[k] * wr[k];
            ref[m * N + n] = s;
        }
    dt_linear *lin = be->linear_create(be, &tw.src);
    if (!lin) { T_FAIL(name, "linear_create: %s", dt_last_error()); }
    else {
        tm tx = tm_up(x, M, K, pad), ty = tm_new(M, N, pad);
        be->linear(be, ty.v, tx.v, lin);
        check(name, ty, ref);
        be->linear_destroy(be, lin);
        tm_free(&tx); tm_free(&ty);
    }
    free(x); free(ref); free_weight(&tw);
}

/* ================================ norms ================================ */
static void test_layernorm(int64_t M, int64_t D, int mod, int alias) {
    char name[96];
    snprintf(name, sizeof name, "layernorm_mod M=%lld D=%lld%s%s", (long long)M, (long long)D, mod ? " mod" : "",
             alias ? " in-place" : "");
    float *x = rand_vec((size_t)(M * D), -2, 2), *sh = rand_vec((size_t)D, -1, 1), *sc = rand_vec((size_t)D, -1, 1);
    for (int64_t i = 0; i < M * D; i++) x[i] += 3.0f;    /* non-zero mean */
    double *ref = malloc((size_t)(M * D) * sizeof(double));
    for (int64_t m = 0; m < M; m++) {
        double mean = 0, var = 0;
        for (int64_t j = 0; j < D; j++) mean += x[m * D + j];
        mean /= D;
        for (int64_t j = 0; j < D; j++) var += (x[m * D + j] - mean) * (x[m * D + j] - mean);
        var /= D;
        for (int64_t j = 0; j < D; j++) {
            double n = (x[m * D + j] - mean) / sqrt(var + 1e-6);
            ref[m * D + j] = mod ? n * (1.0 + sc[j]) + sh[j] : n;
        }
    }
    tm tx = tm_up(x, M, D, 6), ty = alias ? tx : tm_new(M, D, 2);
    tm tsh = tm_up(sh, 1, D, 4), tsc = tm_up(sc, 1, D, 4);
    be->layernorm_mod(be, ty.v, tx.v, mod ? tsh.v : dt_mat_null(), mod ? tsc.v : dt_mat_null(), 1e-6f);
    check(name, ty, ref);
    tm_free(&tx); if (!alias) tm_free(&ty);
    tm_free(&tsh); tm_free(&tsc);
    free(x); free(sh); free(sc); free(ref);
}

/* The double reference of rmsnorm and rmsnorm_mod: ref [M, D] = x * rsqrt(mean(x^2) + eps) * (w + off) + shift
 * (w NULL: a factor 1; shift NULL: none). */
static void rmsnorm_ref(const float *x, int64_t M, int64_t D, const float *w, double off, const float *shift, double eps,
                        double *ref) {
    for (int64_t m = 0; m < M; m++) {
        double ss = 0;
        for (int64_t j = 0; j < D; j++) ss += (double)x[m * D + j] * x[m * D + j];
        double r = 1.0 / sqrt(ss / D + eps);
        for (int64_t j = 0; j < D; j++)
            ref[m * D + j] = x[m * D + j] * r * (w ? w[j] + off : 1.0) + (shift ? shift[j] : 0.0);
    }
}

static void test_rmsnorm(int64_t M, int64_t D, int weight, float off, int alias) {
    char name[96];
    snprintf(name, sizeof name, "rmsnorm M=%lld D=%lld%s offset %g%s", (long long)M, (long long)D,
             weight ? " weighted" : " no-weight", off, alias ? " in-place" : "");
    float *x = rand_vec((size_t)(M * D), -2, 2), *w = rand_vec((size_t)D, -1, 1);
    double *ref = malloc((size_t)(M * D) * sizeof(double));
    rmsnorm_ref(x, M, D, weight ? w : NULL, off, NULL, 1e-5, ref);
    tm tx = tm_up(x, M, D, 4), ty = alias ? tx : tm_new(M, D, 0), tw = tm_up(w, 1, D, 2);
    be->rmsnorm(be, ty.v, tx.v, weight ? tw.v : dt_mat_null(), off, 1e-5f);
    check(name, ty, ref);
    tm_free(&tx); if (!alias) tm_free(&ty);
    tm_free(&tw);
    free(x); free(w); free(ref);
}

/* rmsnorm_mod (Krea 2's modulated norm, the scale folded into w): x * r * w + shift against the double reference. */
static void test_rmsnorm_mod(int64_t M, int64_t D, int weight, int shift, int alias) {
    char name[96];
    snprintf(name, sizeof name, "rmsnorm_mod M=%lld D=%lld%s%s%s", (long long)M, (long long)D,
             weight ? " weighted" : " no-weight", shift ? " +shift" : "", alias ? " in-place" : "");
    float *x = rand_vec((size_t)(M * D), -2, 2), *w = rand_vec((size_t)D, -1, 3), *sh = rand_vec((size_t)D, -1, 1);
    double *ref = malloc((size_t)(M * D) * sizeof(double));
    rmsnorm_ref(x, M, D, weight ? w : NULL, 0.0, shift ? sh : NULL, 1e-5, ref);
    tm tx = tm_up(x, M, D, 4), ty = alias ? tx : tm_new(M, D, 2), tw = tm_up(w, 1, D, 2), ts = tm_up(sh, 1, D, 6);
    be->rmsnorm_mod(be, ty.v, tx.v, weight ? tw.v : dt_mat_null(), shift ? ts.v : dt_mat_null(), 1e-5f);
    check(name, ty, ref);
    tm_free(&tx); if (!alias) tm_free(&ty);
    tm_free(&tw); tm_free(&ts);
    free(x); free(w); free(sh); free(ref);
}

/* rmsnorm_mod_linears: one normed input into three Linears of different widths (q4, bf16 with bias, f32), each
 * against the double reference of the norm and its product; the scratch a holds the norm. */
static void test_rmsnorm_mod_linears(int64_t M, int64_t D) {
    char name[128];
    const int64_t N[3] = {D, D / 4, 72};
    const wkind kind[3] = {W_Q4, W_BF16, W_F32};
    test_w tw[3];
    dt_linear *lin[3];
    tm ty[3];
    dt_mat y[3];
    float *x = rand_vec((size_t)(M * D), -2, 2), *w = rand_vec((size_t)D, 0, 2), *sh = rand_vec((size_t)D, -1, 1);
    double *nrm = malloc((size_t)(M * D) * sizeof(double));
    rmsnorm_ref(x, M, D, w, 0.0, sh, 1e-6, nrm);
    for (int i = 0; i < 3; i++) {
        make_weight(&tw[i], kind[i], N[i], D, 64, i == 1);
        lin[i] = be->linear_create(be, &tw[i].src);
        ty[i] = tm_new(M, N[i], 2 * i);
        y[i] = ty[i].v;
    }
    tm tx = tm_up(x, M, D, 4), ta = tm_new(M, D, 2), tw1 = tm_up(w, 1, D, 0), ts = tm_up(sh, 1, D, 2);
    be->rmsnorm_mod_linears(be, tx.v, tw1.v, ts.v, 1e-6f, ta.v, 3, (const dt_linear *const *)lin, y);
    snprintf(name, sizeof name, "rmsnorm_mod_linears M=%lld D=%lld: the norm in a", (long long)M, (long long)D);
    check(name, ta, nrm);
    for (int i = 0; i < 3; i++) {
        double *ref = malloc((size_t)(M * N[i]) * sizeof(double));
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N[i]; n++) {
                double s = i == 1 ? tw[i].bias[n] : 0;
                for (int64_t k = 0; k < D; k++) s += nrm[m * D + k] * tw[i].wref[n * D + k];
                ref[m * N[i] + n] = s;
            }
        snprintf(name, sizeof name, "rmsnorm_mod_linears M=%lld D=%lld: Linear %d (%s, N=%lld)", (long long)M,
                 (long long)D, i, wkind_name[kind[i]], (long long)N[i]);
        check(name, ty[i], ref);
        free(ref);
        be->linear_destroy(be, lin[i]);
        tm_free(&ty[i]);
        free_weight(&tw[i]);
    }
    tm_free(&tx); tm_free(&ta); tm_free(&tw1); tm_free(&ts);
    free(x); free(w); free(sh); free(nrm);
}

static void test_head_norm_rope(int64_t L, int H, int hd, int norm, dt_rope_mode mode) {
    char name[96];
    static const char *mn[] = { "none", "interleaved", "half" };
    snprintf(name, sizeof name, "head_norm_rope L=%lld H=%d hd=%d norm=%d rope=%s", (long long)L, H, hd, norm, mn[mode]);
    const int64_t D = (int64_t)H * hd;
    float *x = rand_vec((size_t)(L * D), -2, 2), *w = rand_vec((size_t)hd, 0.5f, 1.5f);
    float *cs = malloc((size_t)(L * hd) * sizeof(float)), *sn = malloc((size_t)(L * hd) * sizeof(float));
    for (int64_t i = 0; i < L * hd; i++) { float a = frand(-6, 6); cs[i] = cosf(a); sn[i] = sinf(a); }
    double *ref = malloc((size_t)(L * D) * sizeof(double)), *tmp = malloc((size_t)hd * sizeof(double));
    for (int64_t l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            const float *xh = x + l * D + (int64_t)h * hd;
            double r = 1;
            if (norm) {
                double ss = 0;
                for (int i = 0; i < hd; i++) ss += (double)xh[i] * xh[i];
                r = 1.0 / sqrt(ss / hd + 1e-6);
            }
            for (int i = 0; i < hd; i++) tmp[i] = xh[i] * r * (norm ? w[i] : 1.0);
            double *o = ref + l * D + (int64_t)h * hd;
            const float *c = cs + l * hd, *s = sn + l * hd;
            for (int i = 0; i < hd; i++) {
                if (mode == DT_ROPE_INTERLEAVED)
                    o[i] = (i % 2 == 0) ? tmp[i] * c[i] - tmp[i + 1] * s[i] : tmp[i] * c[i] + tmp[i - 1] * s[i];
                else if (mode == DT_ROPE_HALF)
                    o[i] = (i < hd / 2) ? tmp[i] * c[i] - tmp[i + hd / 2] * s[i] : tmp[i] * c[i] + tmp[i - hd / 2] * s[i];
                else
                    o[i] = tmp[i];
            }
        }
    tm tx = tm_up(x, L, D, 10), tw = tm_up(w, 1, hd, 2), tc = tm_up(cs, L, hd, 4), ts = tm_up(sn, L, hd, 6);
    be->head_norm_rope(be, tx.v, H, hd, norm ? tw.v : dt_mat_null(), 1e-6f, tc.v, ts.v, mode);
    check(name, tx, ref);
    tm_free(&tx); tm_free(&tw); tm_free(&tc); tm_free(&ts);
    free(x); free(w); free(cs); free(sn); free(ref); free(tmp);
}

/* ================================ attention ================================ */
/* q/k/v are column slices of one fused [L, (Hq + 2 Hkv) hd] matrix, as after a fused QKV Linear. */
static void test_attention(int64_t Lq, int64_t Lk, int hq, int hkv, int hd, int use_bias, int causal, int npad,
                           int mask_all_first) {
    char name[128];
    snprintf(name, sizeof name, "attention Lq=%lld Lk=%lld hq=%d hkv=%d hd=%d%s%s", (long long)Lq, (long long)Lk, hq,
             hkv, hd, use_bias ? " key_bias" : "", causal ? " causal" : "");
    const int64_t Dq = (int64_t)hq * hd, Dk = (int64_t)hkv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = rand_vec((size_t)(Lq * Dq), -2, 2), *k = rand_vec((size_t)(Lk * Dk), -2, 2),
          *v = rand_vec((size_t)(Lk * Dk), -1, 1), *kb = malloc((size_t)Lk * sizeof(float) + 4);
    for (int64_t j = 0; j < Lk; j++) kb[j] = j >= Lk - npad ? -INFINITY : frand(-0.5f, 0.5f);
    if (mask_all_first) kb[0] = -INFINITY;       /* with causal: query 0 sees no key at all */
    double *ref = calloc((size_t)(Lq * Dq), sizeof(double)), *p = malloc((size_t)Lk * sizeof(double));
    for (int h = 0; h < hq; h++) {
        const int kvh = h / (hq / hkv);
        for (int64_t i = 0; i < Lq; i++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < Lk; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[i * Dq + h * hd + d] * k[j * Dk + kvh * hd + d];
                s = s * scale + (use_bias ? kb[j] : 0.0);
                if (causal && j > i) s = -INFINITY;
                p[j] = s;
                if (s > mx) mx = s;
            }
            if (mx == -INFINITY) continue;           /* fully masked: output 0 */
            double sum = 0;
            for (int64_t j = 0; j < Lk; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int64_t j = 0; j < Lk; j++) o += p[j] * v[j * Dk + kvh * hd + d];
                ref[i * Dq + h * hd + d] = o / sum;
            }
        }
    }
    /* fused QKV-like layout when Lq == Lk, separate matrices otherwise */
    tm tq, tk, tv, fused = { 0 };
    if (Lq == Lk) {
        fused = tm_new(Lq, Dq + 2 * Dk, 0);
        tq.v = dt_mat_cols(fused.v, 0, Dq); tk.v = dt_mat_cols(fused.v, Dq, Dk); tv.v = dt_mat_cols(fused.v, Dq + Dk, Dk);
        be->upload(be, tq.v, q); be->upload(be, tk.v, k); be->upload(be, tv.v, v);
    } else {
        tq = tm_up(q, Lq, Dq, 4); tk = tm_up(k, Lk, Dk, 8); tv = tm_up(v, Lk, Dk, 2);
    }
    tm to = tm_new(Lq, Dq, 4), tb = tm_up(kb, 1, Lk, 2);
    be->attention(be, to.v, tq.v, tk.v, tv.v, hq, hkv, hd, scale, use_bias ? tb.v : dt_mat_null(), causal);
    float *got = tm_down(to);
    int finite = 1;
    for (int64_t i = 0; i < Lq * Dq; i++) finite &= isfinite(got[i]) != 0;
    free(got);
    if (!finite) T_FAIL(name, "non-finite output");
    else check(name, to, ref);
    if (Lq == Lk) tm_free(&fused); else { tm_free(&tq); tm_free(&tk); tm_free(&tv); }
    tm_free(&to); tm_free(&tb);
    free(q); free(k); free(v); free(kb); free(ref); free(p);
}

/* fp8 attention (backend.h: attention_fp8) against the definition evaluated here: per-tensor e4m3 codes of q, k,
 * v (the f32 expressions of core/fp8.h), scores and softmax in double, P rounded as e4m3(448 P), sums in double.
 * Tolerance 5e-4: the backend's softmax is f32, so a P value within ~1e-7 of an e4m3 rounding boundary may land
 * one e4m3 step (6%) away (a handful of the ~2M probabilities), moving its row by far less than this.
 * Also: fp8 vs the exact bf16-free attention must differ (the quantization ran) but stay under 10% (random
 * inputs, no structure: the P rounding alone is ~2-4% of the output). */
static void q8_tensor(const float *x, size_t n, double *vals, double *scale) {
    float amax = 0.f;
    for (size_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float inv = amax > 0.f ? 448.0f / amax : 1.f;
    for (size_t i = 0; i < n; i++) vals[i] = dt_e4m3_to_f32(dt_f32_to_e4m3(x[i] * inv));
    *scale = amax > 0.f ? (double)(amax / 448.0f) : 1.0;
}

static void test_attention_fp8(int64_t Lq, int64_t Lk, int hq, int hkv, int hd) {
    char name[128];
    snprintf(name, sizeof name, "attention fp8 Lq=%lld Lk=%lld hq=%d hkv=%d hd=%d", (long long)Lq, (long long)Lk, hq,
             hkv, hd);
    const int64_t Dq = (int64_t)hq * hd, Dk = (int64_t)hkv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = rand_vec((size_t)(Lq * Dq), -2, 2), *k = rand_vec((size_t)(Lk * Dk), -2, 2),
          *v = rand_vec((size_t)(Lk * Dk), -1, 1);
    double *q8 = malloc(sizeof(double) * (size_t)(Lq * Dq)), *k8 = malloc(sizeof(double) * (size_t)(Lk * Dk)),
           *v8 = malloc(sizeof(double) * (size_t)(Lk * Dk)), sq, sk, sv;
    q8_tensor(q, (size_t)(Lq * Dq), q8, &sq);
    q8_tensor(k, (size_t)(Lk * Dk), k8, &sk);
    q8_tensor(v, (size_t)(Lk * Dk), v8, &sv);
    double *ref = calloc((size_t)(Lq * Dq), sizeof(double)), *p = malloc((size_t)Lk * sizeof(double));
    for (int h = 0; h < hq; h++) {
        const int kvh = h / (hq / hkv);
        for (int64_t i = 0; i < Lq; i++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < Lk; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += q8[i * Dq + h * hd + d] * k8[j * Dk + kvh * hd + d];
                p[j] = s * scale * sq * sk;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = 0; j < Lk; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
            for (int64_t j = 0; j < Lk; j++) p[j] = dt_e4m3_to_f32(dt_f32_to_e4m3((float)(448.0 * p[j] / sum)));
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int64_t j = 0; j < Lk; j++) o += p[j] * v8[j * Dk + kvh * hd + d];
                ref[i * Dq + h * hd + d] = o * sv / 448.0;
            }
        }
    }
    tm tq = tm_up(q, Lq, Dq, 4), tk = tm_up(k, Lk, Dk, 8), tv = tm_up(v, Lk, Dk, 2), to = tm_new(Lq, Dq, 4);
    T_CHECK("attention_fp8 present on the CPU backend", be->attention_fp8 != NULL, "attention_fp8 is NULL");
    if (!be->attention_fp8) return;
    be->attention_fp8(be, to.v, tq.v, tk.v, tv.v, hq, hkv, hd, scale);
    size_t n = (size_t)(Lq * Dq);
    float *got = tm_down(to), *rf = malloc(n * sizeof(float) + 1);
    to_float(rf, ref, n);
    t_check_rel_l2(name, got, rf, n, 5e-4);
    be->attention(be, to.v, tq.v, tk.v, tv.v, hq, hkv, hd, scale, dt_mat_null(), 0);
    float *exact = tm_down(to);
    double e = dt_rel_l2(got, exact, n);
    char nm2[200];
    snprintf(nm2, sizeof nm2, "%s vs exact attention (rel L2 %.2f%%)", name, 100 * e);
    T_CHECK(nm2, e > 1e-3 && e < 0.10, "rel L2 %.4g (expected between 0.1%% and 10%%)", e);
    free(got); free(rf); free(exact);
    tm_free(&tq); tm_free(&tk); tm_free(&tv); tm_free(&to);
    free(q); free(k); free(v); free(q8); free(k8); free(v8); free(ref); free(p);
}

/* ================================ elementwise ================================ */
static double act_ref(double x, dt_act a) {
    switch (a) {
    case DT_ACT_SILU: return x / (1 + exp(-x));
    case DT_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case DT_ACT_GELU_ERF: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case DT_ACT_SIGMOID: return 1 / (1 + exp(-x));
    }
    return x;
}

static void test_act_mul(dt_act act, int with_b, int alias) {
    static const char *an[] = { "silu", "gelu_tanh", "gelu_erf", "sigmoid" };
    char name[96];
    const int64_t M = 13, D = 300;
    snprintf(name, sizeof name, "act_mul %s%s%s", an[act], with_b ? " * b" : "", alias ? " in-place" : "");
    float *a = rand_vec((size_t)(M * D), -6, 6), *b = rand_vec((size_t)(M * D), -2, 2);
    a[0] = -100.0f; a[1] = 100.0f; a[2] = 0.0f;     /* saturation edges */
    double *ref = malloc((size_t)(M * D) * sizeof(double));
    for (int64_t i = 0; i < M * D; i++) ref[i] = act_ref(a[i], act) * (with_b ? b[i] : 1.0);
    tm ta = tm_up(a, M, D, 4), tb = tm_up(b, M, D, 2), ty = alias ? ta : tm_new(M, D, 6);
    be->act_mul(be, ty.v, ta.v, with_b ? tb.v : dt_mat_null(), act);
    check(name, ty, ref);
    tm_free(&ta); tm_free(&tb); if (!alias) tm_free(&ty);
    free(a); free(b); free(ref);
}

/* flow_step (the sampler's guidance + Euler update) against the host loop's own arithmetic (dt_sample before the
 * device path: dt_flow_guided into v, then x + dt·v), bit for bit: the same f32 operations in the same order; on
 * strided views, without u and with both guidance rules. */
static void test_flow_step(void) {
    const int64_t M = 13, D = 64;
    const size_t n = (size_t)(M * D);
    float *x = rand_vec(n, -3, 3), *v = rand_vec(n, -2, 2), *u = rand_vec(n, -2, 2), *want = malloc(n * sizeof(float));
    const float g = 4.5f, dt = 0.6f - 0.6333333f;
    static const char *const what[] = {"flow_step without guidance", "flow_step u + g(v - u)", "flow_step v + g(v - u)"};
    for (int mode = 0; mode < 3; mode++) {
        for (size_t i = 0; i < n; i++) {
            float w = v[i];
            if (mode == 1) w = u[i] + g * (v[i] - u[i]);
            if (mode == 2) w = v[i] + g * (v[i] - u[i]);
            want[i] = x[i] + dt * w;
        }
        tm tx = tm_up(x, M, D, 4), tv = tm_up(v, M, D, 2), tu = tm_up(u, M, D, 6);
        be->flow_step(be, tx.v, tv.v, mode ? tu.v : dt_mat_null(), g, mode == 2, dt);
        float *got = tm_down(tx);
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++) if (got[i] != want[i]) bad = i;
        T_CHECK(what[mode], bad == n, "element %zu: %.9g, the host loop %.9g", bad, bad < n ? got[bad] : 0.f,
                bad < n ? want[bad] : 0.f);
        free(got);
        tm_free(&tx); tm_free(&tv); tm_free(&tu);
    }
    free(x); free(v); free(u); free(want);
}

/* abs_diff_sums (First Block Cache's decision) against the straightforward double loop over the elements in row-major
 * order, the loop block_cache.c ran on the downloaded residuals before the op existed. The op sums in that same order,
 * so the tolerance is TOL_ADS = 0: equal bit for bit (the cache's CPU decisions stay those of that loop, which
 * test_cache compares with diffusers). Strided views (ld > cols); b as a host BF16 view (each value widened). */
#define TOL_ADS 0.0
static void test_abs_diff_sums(int64_t M, int64_t D, int bf16_b) {
    char name[128];
    const size_t n = (size_t)(M * D);
    float *a = rand_vec(n, -2, 2), *b = rand_vec(n, -2, 2);
    for (size_t i = 0; i < n; i++) {   /* magnitudes over 2^-30..2^10, so the sums round and their order shows */
        const float s = ldexpf(1.0f, (int)(xorshift() % 41) - 30);
        a[i] *= s;
        b[i] *= s;
    }
    for (size_t i = 0; i < n; i += 3) a[i] = b[i];   /* some equal elements, as a slowly changing residual has */
    uint16_t *hb = malloc(n * 2 + 2);
    if (bf16_b)
        for (size_t i = 0; i < n; i++) { hb[i] = dt_f32_to_bf16(b[i]); b[i] = dt_bf16_to_f32(hb[i]); }
    double want[2] = {0.0, 0.0};
    for (size_t i = 0; i < n; i++) {
        want[0] += fabs((double)a[i] - (double)b[i]);
        want[1] += fabs((double)b[i]);
    }
    tm ta = tm_up(a, M, D, 4), tb = tm_up(b, M, D, 6);
    dt_mat bm = bf16_b ? (dt_mat){ hb, M, D, D, DT_BF16 } : tb.v;
    double got[2] = {-1.0, -1.0};
    be->abs_diff_sums(be, ta.v, bm, got);
    snprintf(name, sizeof name, "abs_diff_sums [%lld,%lld]%s: the row-major double loop's sums", (long long)M,
             (long long)D, bf16_b ? " (b bf16)" : "");
    T_CHECK(name, fabs(got[0] - want[0]) <= TOL_ADS * want[0] && fabs(got[1] - want[1]) <= TOL_ADS * want[1],
            "sums %.17g %.17g, the loop %.17g %.17g", got[0], got[1], want[0], want[1]);
    /* a matrix with itself: no difference */
    be->abs_diff_sums(be, ta.v, ta.v, got);
    snprintf(name, sizeof name, "abs_diff_sums [%lld,%lld] of a matrix with itself: 0", (long long)M, (long long)D);
    T_CHECK(name, got[0] == 0.0 && got[1] > 0.0, "sums %.17g %.17g", got[0], got[1]);
    tm_free(&ta); tm_free(&tb);
    free(a); free(b); free(hb);
}

static void test_small_elementwise(void) {
    const int64_t M = 17, D = 257;
    const size_t n = (size_t)(M * D);
    float *a = rand_vec(n, -2, 2), *b = rand_vec(n, -2, 2), *g = rand_vec((size_t)D, -1, 1);
    double *ref = malloc(n * sizeof(double));
    /* gated_add with and without gate */
    for (int gated = 0; gated < 2; gated++) {
        for (size_t i = 0; i < n; i++) ref[i] = a[i] + (gated ? (double)g[i % D] : 1.0) * b[i];
        tm tx = tm_up(a, M, D, 4), ty = tm_up(b, M, D, 2), tg = tm_up(g, 1, D, 2);
        be->gated_add(be, tx.v, gated ? tg.v : dt_mat_null(), ty.v);
        check(gated ? "gated_add gate" : "gated_add plain", tx, ref);
        tm_free(&tx); tm_free(&ty); tm_free(&tg);
    }
    /* mul */
    {
        for (size_t i = 0; i < n; i++) ref[i] = (double)a[i] * b[i];
        tm ta = tm_up(a, M, D, 4), tb = tm_up(b, M, D, 2), ty = tm_new(M, D, 8);
        be->mul(be, ty.v, ta.v, tb.v);
        check("mul", ty, ref);
        be->mul(be, tb.v, ta.v, tb.v);                 /* y aliases b */
        check("mul in-place", tb, ref);
        tm_free(&ta); tm_free(&tb); tm_free(&ty);
    }
    /* axpby, with b, without b, aliased */
    {
        const float al = 0.75f, bt = -1.5f;
        tm ta = tm_up(a, M, D, 4), tb = tm_up(b, M, D, 2), ty = tm_new(M, D, 0);
        for (size_t i = 0; i < n; i++) ref[i] = (double)al * a[i] + (double)bt * b[i];
        be->axpby(be, ty.v, al, ta.v, bt, tb.v);
        check("axpby", ty, ref);
        be->axpby(be, tb.v, al, ta.v, bt, tb.v);
        check("axpby in-place (y = b)", tb, ref);
        for (size_t i = 0; i < n; i++) ref[i] = (double)al * a[i];
        be->axpby(be, ty.v, al, ta.v, 0.0f, dt_mat_null());
        check("axpby b=NULL", ty, ref);
        tm_free(&ta); tm_free(&tb); tm_free(&ty);
    }
    /* copy between strided views, and F32 -> BF16 -> F32 through host BF16 views */
    {
        for (size_t i = 0; i < n; i++) ref[i] = a[i];
        tm ta = tm_up(a, M, D, 4), ty = tm_new(M, D, 10);
        be->copy(be, ty.v, ta.v);
        check("copy strided", ty, ref);
        uint16_t *hb = malloc((size_t)(M * (D + 3)) * 2);
        dt_mat bm = { hb, M, D, D + 3, DT_BF16 };
        be->copy(be, bm, ta.v);
        be->copy(be, ty.v, bm);
        for (size_t i = 0; i < n; i++) ref[i] = dt_bf16_round(a[i]);
        check("copy f32->bf16->f32", ty, ref);
        free(hb);
        tm_free(&ta); tm_free(&ty);
    }
    /* transpose */
    {
        double *rt = malloc(n * sizeof(double));
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < D; j++) rt[j * M + i] = a[i * D + j];
        tm ta = tm_up(a, M, D, 4), ty = tm_new(D, M, 3);
        be->transpose(be, ty.v, ta.v);
        check("transpose", ty, rt);
        free(rt);
        tm_free(&ta); tm_free(&ty);
    }
    free(a); free(b); free(g); free(ref);
}

/* ================================ image ops ================================ */
/* conv2d (strided = 0: stride 1, symmetric pad pt) or conv2d_strided against a direct double-precision sum. */
static void conv_case(int cin, int cout, int k, int stride, int pt, int pl, int pb, int pr, int h, int w, int with_bias,
                      int strided) {
    char name[128];
    if (strided)
        snprintf(name, sizeof name, "conv2d_strided %d->%d k=%d /%d pads %d,%d,%d,%d %dx%d%s", cin, cout, k, stride, pt,
                 pl, pb, pr, h, w, with_bias ? " +bias" : "");
    else
        snprintf(name, sizeof name, "conv2d %d->%d k=%d pad=%d %dx%d%s", cin, cout, k, pt, h, w, with_bias ? " +bias" : "");
    const int ho = (h + pt + pb - k) / stride + 1, wo = (w + pl + pr - k) / stride + 1;
    float *x = rand_vec((size_t)cin * h * w, -1, 1), *wt = rand_vec((size_t)cout * cin * k * k, -0.2f, 0.2f),
          *bias = rand_vec((size_t)cout, -1, 1);
    double *ref = malloc((size_t)cout * ho * wo * sizeof(double));
    for (int co = 0; co < cout; co++)
        for (int oy = 0; oy < ho; oy++)
            for (int ox = 0; ox < wo; ox++) {
                double s = with_bias ? bias[co] : 0;
                for (int ci = 0; ci < cin; ci++)
                    for (int ky = 0; ky < k; ky++)
                        for (int kx = 0; kx < k; kx++) {
                            int iy = oy * stride + ky - pt, ix = ox * stride + kx - pl;
                            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                            s += (double)wt[((co * cin + ci) * k + ky) * k + kx] * x[(size_t)ci * h * w + iy * w + ix];
                        }
                ref[((size_t)co * ho + oy) * wo + ox] = s;
            }
    dt_conv *cv = be->conv_create(be, wt, with_bias ? bias : NULL, cout, cin, k, strided ? 0 : pt);
    tm tx = tm_up(x, cin, (int64_t)h * w, 4), ty = tm_new(cout, (int64_t)ho * wo, 2);
    if (strided) be->conv2d_strided(be, ty.v, tx.v, cv, h, w, stride, pt, pl, pb, pr);
    else be->conv2d(be, ty.v, tx.v, cv, h, w);
    check(name, ty, ref);
    be->conv_destroy(be, cv);
    tm_free(&tx); tm_free(&ty);
    free(x); free(wt); free(bias); free(ref);
}

static void test_conv2d(int cin, int cout, int k, int pad, int h, int w, int with_bias) {
    conv_case(cin, cout, k, 1, pad, pad, pad, pad, h, w, with_bias, 0);
}

static void test_group_norm(int C, int HW, int groups, int silu, float offset) {
    char name[96];
    snprintf(name, sizeof name, "group_norm C=%d HW=%d groups=%d%s mean %g", C, HW, groups, silu ? " +silu" : "",
             offset);
    float *x = rand_vec((size_t)C * HW, -1, 1), *ga = rand_vec((size_t)C, 0.5f, 1.5f), *bt = rand_vec((size_t)C, -1, 1);
    for (size_t i = 0; i < (size_t)C * HW; i++) x[i] += offset;
    double *ref = malloc((size_t)C * HW * sizeof(double));
    const int cg = C / groups;
    for (int g = 0; g < groups; g++) {
        double m = 0, v = 0, n = (double)cg * HW;
        for (int c = g * cg; c < (g + 1) * cg; c++)
            for (int j = 0; j < HW; j++) m += x[(size_t)c * HW + j];
        m /= n;
        for (int c = g * cg; c < (g + 1) * cg; c++)
            for (int j = 0; j < HW; j++) v += (x[(size_t)c * HW + j] - m) * (x[(size_t)c * HW + j] - m);
        v /= n;
        for (int c = g * cg; c < (g + 1) * cg; c++)
            for (int j = 0; j < HW; j++) {
                double y = (x[(size_t)c * HW + j] - m) / sqrt(v + 1e-6) * ga[c] + bt[c];
                ref[(size_t)c * HW + j] = silu ? y / (1 + exp(-y)) : y;
            }
    }
    tm tx = tm_up(x, C, HW, 4), ty = tm_new(C, HW, 2), tg = tm_up(ga, 1, C, 2), tb = tm_up(bt, 1, C, 0);
    be->group_norm(be, ty.v, tx.v, groups, tg.v, tb.v, 1e-6f, silu);
    check(name, ty, ref);
    tm_free(&tx); tm_free(&ty); tm_free(&tg); tm_free(&tb);
    free(x); free(ga); free(bt); free(ref);
}

/* Channel RMS norm (F.normalize over C, times sqrt(C) and gamma), one all-zero pixel column (clamped norm: 0,
 * not NaN), optional SiLU, out of place on strided views and in place. */
static void test_channel_rmsnorm(int C, int HW, int silu, int with_gamma) {
    char name[96];
    snprintf(name, sizeof name, "channel_rmsnorm C=%d HW=%d%s%s", C, HW, silu ? " +silu" : "", with_gamma ? " gamma" : "");
    float *x = rand_vec((size_t)C * HW, -2, 2), *ga = rand_vec((size_t)C, 0.5f, 1.5f);
    for (int c = 0; c < C; c++) x[(size_t)c * HW + HW / 2] = 0.0f;
    double *ref = malloc((size_t)C * HW * sizeof(double));
    for (int j = 0; j < HW; j++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[(size_t)c * HW + j] * x[(size_t)c * HW + j];
        double n = sqrt(ss) > 1e-12 ? sqrt(ss) : 1e-12;
        for (int c = 0; c < C; c++) {
            double y = x[(size_t)c * HW + j] / n * sqrt((double)C) * (with_gamma ? ga[c] : 1.0);
            ref[(size_t)c * HW + j] = silu ? y / (1 + exp(-y)) : y;
        }
    }
    tm tx = tm_up(x, C, HW, 4), ty = tm_new(C, HW, 2), tg = tm_up(ga, 1, C, 0);
    be->channel_rmsnorm(be, ty.v, tx.v, with_gamma ? tg.v : dt_mat_null(), silu);
    check(name, ty, ref);
    be->channel_rmsnorm(be, tx.v, tx.v, with_gamma ? tg.v : dt_mat_null(), silu);
    strcat(name, " in place");
    check(name, tx, ref);
    tm_free(&tx); tm_free(&ty); tm_free(&tg);
    free(x); free(ga); free(ref);
}

static void test_upsample(void) {
    const int C = 5, h = 7, w = 9;
    float *x = rand_vec((size_t)C * h * w, -1, 1);
    double *ref = malloc((size_t)C * 4 * h * w * sizeof(double));
    for (int c = 0; c < C; c++)
        for (int y = 0; y < 2 * h; y++)
            for (int xx = 0; xx < 2 * w; xx++) ref[((size_t)c * 2 * h + y) * 2 * w + xx] = x[((size_t)c * h + y / 2) * w + xx / 2];
    tm tx = tm_up(x, C, h * w, 4), ty = tm_new(C, 4 * h * w, 2);
    be->upsample2x(be, ty.v, tx.v, h, w);
    check("upsample2x 5x7x9", ty, ref);
    tm_free(&tx); tm_free(&ty);
    free(x); free(ref);
}

/* ================================ backend plumbing ================================ */
static void test_memory(void) {
    size_t c0, p0, c1, p1, c2;
    be->mem_stats(be, &c0, &p0);
    dt_mat m;
    int rc = be->alloc(be, &m, 100, 250, DT_F32);
    be->mem_stats(be, &c1, &p1);
    T_CHECK("alloc f32 + mem_stats", rc == 0 && m.ld == 250 && ((uintptr_t)m.data % 64) == 0 &&
            c1 >= c0 + 100 * 250 * 4 && p1 >= c1, "rc %d cur %zu -> %zu peak %zu", rc, c0, c1, p1);
    be->free(be, &m);
    be->mem_stats(be, &c2, NULL);
    T_CHECK("free returns memory", c2 == c0 && m.data == NULL, "cur %zu (was %zu)", c2, c0);
    dt_mat b;
    rc = be->alloc(be, &b, 4, 4, DT_BF16);
    T_CHECK("alloc bf16 rejected", rc != 0 && strstr(dt_last_error(), "F32"), "rc %d: %s", rc, dt_last_error());
    T_CHECK("act_dtype f32 and sync", be->act_dtype == DT_F32 && be->sync(be) == 0, "act %d", (int)be->act_dtype);
}

/* ================================ timings ================================ */
/* linear f32 (and MLX q4 at all threads) M=1024 K=N=3072, attention 24 heads x 128 x 1024 tokens. */
static void timings(void) {
    dt_backend_opts o1 = { 0 }, on = { 0 };
    o1.threads = 1;
    dt_backend *saved = be;
    const int64_t M = 1024, K = 3072, N = 3072, L = 1024;
    const int H = 24, hd = 128;
    test_w tw, tq;
    make_weight(&tw, W_F32, N, K, 0, 1);
    make_weight(&tq, W_Q4, N, K, 64, 1);
    float *x = rand_vec((size_t)(M * K), -1, 1), *qkv = rand_vec((size_t)(L * 3 * H * hd), -1, 1);
    for (int pass = 0; pass < 2; pass++) {
        be = dt_backend_cpu_create(pass == 0 ? &o1 : &on);
        if (!be) { printf("timing: %s\n", dt_last_error()); break; }
        dt_linear *lf = be->linear_create(be, &tw.src), *lq = be->linear_create(be, &tq.src);
        dt_mat tx = dt_alloc_or_die(be, M, K, DT_F32), ty = dt_alloc_or_die(be, M, N, DT_F32);
        dt_mat tqkv = dt_alloc_or_die(be, L, 3 * H * hd, DT_F32), to = dt_alloc_or_die(be, L, H * hd, DT_F32);
        be->upload(be, tx, x); be->upload(be, tqkv, qkv);
        const dt_ext_profiling *pf = dt_backend_profiling(be);
        void *e0 = pf->event_create(be), *e1 = pf->event_create(be);
        be->linear(be, dt_mat_rows(ty, 0, 64), dt_mat_rows(tx, 0, 64), lf);     /* warm-up: threads, pages */
        pf->event_record(be, e0); be->linear(be, ty, tx, lf); pf->event_record(be, e1);
        float ms_f = pf->event_elapsed_ms(be, e0, e1), ms_q = 0;
        if (pass == 1) {
            pf->event_record(be, e0); be->linear(be, ty, tx, lq); pf->event_record(be, e1);
            ms_q = pf->event_elapsed_ms(be, e0, e1);
        }
        pf->event_record(be, e0);
        be->attention(be, to, dt_mat_cols(tqkv, 0, H * hd), dt_mat_cols(tqkv, H * hd, H * hd),
                      dt_mat_cols(tqkv, 2 * H * hd, H * hd), H, H, hd, 1.0f / sqrtf((float)hd), dt_mat_null(), 0);
        pf->event_record(be, e1);
        float ms_a = pf->event_elapsed_ms(be, e0, e1);
        double gf = 2.0 * M * K * N * 1e-9, ga = 4.0 * L * L * H * hd * 1e-9;
        printf("timing cpu threads=%d: linear f32 %lldx%lldx%lld %.1f ms (%.1f GFLOP/s)", be->opts.threads,
               (long long)M, (long long)K, (long long)N, ms_f, gf / (ms_f * 1e-3));
        if (pass == 1) printf("; linear q4 %.1f ms (%.1f GFLOP/s)", ms_q, gf / (ms_q * 1e-3));
        printf("; attention %dx%dx%lld %.1f ms (%.1f GFLOP/s)\n", H, hd, (long long)L, ms_a, ga / (ms_a * 1e-3));
        pf->event_destroy(be, e0); pf->event_destroy(be, e1);
        be->free(be, &tx); be->free(be, &ty); be->free(be, &tqkv); be->free(be, &to);
        be->linear_destroy(be, lf); be->linear_destroy(be, lq);
        be->destroy(be);
    }
    printf("timing: OpenBLAS kernels '%s'%s\n", openblas_get_corename(),
           getenv("OPENBLAS_CORETYPE") ? " (from OPENBLAS_CORETYPE)" : "");
    be = saved;
    free(x); free(qkv); free_weight(&tw); free_weight(&tq);
}

/* dt_power_begin/add/end over a scripted power_sample (a copy of the CPU backend whose profiling extension has it):
 * medians (odd and even counts), range, capped count; a backend without extensions, one without power_sample and a
 * failing sampler give an empty summary (n = 0). */
static const int fake_mhz[6] = {1560, 1980, 1305, 1620, 1590, 1500};
static int fake_i, fake_fail;
static int fake_power(dt_backend *b, dt_power_sample *p) {
    (void)b;
    if (fake_fail) return -1;
    memset(p, 0, sizeof *p);
    int i = fake_i++ % 6;
    p->sm_mhz = fake_mhz[i];
    p->sm_max_mhz = 1980;
    p->power_w = 600.0 + 10.0 * i;
    p->limit_w = 700.0;
    p->reasons = fake_mhz[i] < 1980 ? 0x4 : 0x1;
    return 0;
}
static dt_ext_profiling fake_pf;
static const void *fake_get_ext(dt_backend *b, const char *name) {
    (void)b;
    return !strcmp(name, DT_EXT_PROFILING) ? &fake_pf : NULL;
}
static void test_power_summary(void) {
    dt_backend fake = *be;
    fake.get_ext = NULL;
    dt_power_acc a;
    dt_power_begin(&a, &fake, 8);
    dt_power_add(&a);
    dt_power_summary s = dt_power_end(&a);
    T_CHECK("power summary: a backend without extensions gives n = 0", s.n == 0, "n = %d", s.n);
    fake_pf = *dt_backend_profiling(be);
    T_CHECK("cpu profiling extension: events, no power sensor", fake_pf.event_create && !fake_pf.power_sample, "%s",
            "power_sample set");
    fake.get_ext = fake_get_ext;
    dt_power_begin(&a, &fake, 8);
    dt_power_add(&a);
    s = dt_power_end(&a);
    T_CHECK("power summary: a backend without power_sample gives n = 0", s.n == 0, "n = %d", s.n);
    fake_pf.power_sample = fake_power;
    fake_i = 0;
    fake_fail = 0;
    dt_power_begin(&a, &fake, 5);   /* the begin probe takes sample 0; five more fit */
    for (int k = 0; k < 7; k++) dt_power_add(&a);
    s = dt_power_end(&a);
    /* samples 1..5: 1980 1305 1620 1590 1500 -> median 1590, min 1305, max 1980, capped 4; watts 610..650 -> 630 */
    T_CHECK("power summary: median, range and capped count of 5 samples (2 over max dropped)",
            s.n == 5 && s.sm_mhz_med == 1590 && s.sm_mhz_min == 1305 && s.sm_mhz_max == 1980 && s.capped == 4 &&
                s.power_w_med == 630.0 && s.limit_w == 700.0 && s.sm_max_mhz == 1980,
            "n %d med %.0f min %.0f max %.0f capped %d power %.1f", s.n, s.sm_mhz_med, s.sm_mhz_min, s.sm_mhz_max, s.capped,
            s.power_w_med);
    fake_i = 0;
    dt_power_begin(&a, &fake, 4);
    for (int k = 0; k < 4; k++) dt_power_add(&a);
    s = dt_power_end(&a);   /* samples 1..4: 1980 1305 1620 1590 -> median (1590 + 1620) / 2 */
    T_CHECK("power summary: even count takes the mean of the middle two", s.n == 4 && s.sm_mhz_med == 1605.0,
            "n %d med %.1f", s.n, s.sm_mhz_med);
    fake_fail = 1;
    dt_power_begin(&a, &fake, 4);
    dt_power_add(&a);
    s = dt_power_end(&a);
    T_CHECK("power summary: a failing sampler gives n = 0", s.n == 0, "n = %d", s.n);
}

int main(int argc, char **argv) {
    int do_timing = !(argc > 1 && !strcmp(argv[1], "--no-timing")) && !getenv("DITRUN_NO_TIMING");
    be = dt_backend_cpu_create(&(dt_backend_opts){ 0 });
    if (!be) { T_FAIL("cpu backend create", "%s", dt_last_error()); return T_DONE(); }
    T_PASS("cpu backend create");
    test_memory();
    test_power_summary();

    /* linear: every weight format at a small strided shape (+ bias), then paths and real shapes */
    for (int kd = W_F32; kd <= W_Q8; kd++) test_linear((wkind)kd, 5, 128, 72, kd == W_Q8 ? 32 : 64, 1, 6);
    test_linear(W_BF16, 1, 256, 96, 0, 1, 0);           /* M = 1 (modulation vector) */
    test_linear(W_F32, 1, 256, 96, 0, 0, 2);            /* M = 1 dense f32 (gemv) */
    test_linear(W_Q4, 1, 3072, 1024, 64, 1, 0);
    test_linear(W_Q8, 3, 3072, 1024, 64, 0, 4);
    test_linear(W_F32, 64, 3072, 3072, 0, 1, 0);        /* klein-4B-like */
    test_linear(W_Q4, 64, 3072, 1024, 64, 0, 2);
    test_linear(W_F16, 96, 3072, 1400, 0, 1, 4);        /* large-M tiled path, 3 tiles (last partial) */
    test_linear(W_Q8, 70, 512, 300, 128, 1, 0);

    test_layernorm(7, 96, 1, 0);
    test_layernorm(7, 96, 0, 1);
    test_layernorm(16, 3072, 1, 1);
    test_rmsnorm(9, 80, 1, 0.0f, 0);
    test_rmsnorm(9, 80, 1, 1.0f, 1);
    test_rmsnorm(9, 80, 0, 0.0f, 0);
    test_rmsnorm(16, 3072, 1, 0.0f, 0);
    test_rmsnorm_mod(9, 80, 1, 1, 0);
    test_rmsnorm_mod(9, 80, 1, 1, 1);
    test_rmsnorm_mod(9, 80, 0, 1, 0);
    test_rmsnorm_mod(9, 80, 1, 0, 0);
    test_rmsnorm_mod(16, 3072, 1, 1, 0);
    test_rmsnorm_mod_linears(7, 256);
    for (int norm = 0; norm < 2; norm++)
        for (int mode = DT_ROPE_NONE; mode <= DT_ROPE_HALF; mode++) test_head_norm_rope(9, 3, 16, norm, (dt_rope_mode)mode);
    test_head_norm_rope(300, 24, 128, 1, DT_ROPE_INTERLEAVED);

    test_attention(7, 11, 4, 2, 16, 1, 0, 3, 0);
    test_attention(9, 9, 2, 2, 8, 0, 1, 0, 0);
    test_attention(9, 9, 4, 1, 8, 1, 1, 2, 1);          /* query 0 fully masked -> 0, not NaN */
    test_attention(5, 6, 2, 1, 8, 1, 0, 6, 0);          /* every key padded -> all 0 */
    test_attention(300, 300, 24, 24, 128, 0, 0, 0, 0);  /* klein-4B-like heads */
    test_attention(200, 200, 8, 2, 64, 1, 1, 37, 0);    /* GQA + padding + causal */
    test_attention(150, 333, 4, 4, 32, 1, 0, 20, 0);    /* cross lengths, odd sizes */
    test_attention_fp8(9, 13, 2, 1, 16);                /* GQA, tiny */
    test_attention_fp8(300, 300, 24, 24, 128);          /* klein-4B-like heads */
    test_attention_fp8(150, 333, 4, 2, 64);             /* cross lengths */

    for (int a = DT_ACT_SILU; a <= DT_ACT_SIGMOID; a++) {
        test_act_mul((dt_act)a, 1, 0);
        test_act_mul((dt_act)a, 0, a == DT_ACT_GELU_TANH);
    }
    test_act_mul(DT_ACT_SILU, 1, 1);
    test_small_elementwise();
    test_flow_step();
    test_abs_diff_sums(1, 1, 0);
    test_abs_diff_sums(17, 257, 0);
    test_abs_diff_sums(64, 3072, 0);                    /* Krea 2's width */
    test_abs_diff_sums(13, 300, 1);

    test_conv2d(3, 4, 3, 1, 5, 6, 1);
    test_conv2d(16, 32, 3, 1, 20, 24, 1);
    test_conv2d(16, 8, 1, 0, 20, 24, 1);
    test_conv2d(6, 5, 3, 0, 9, 8, 0);                   /* valid padding: smaller output */
    test_conv2d(512, 4, 3, 1, 48, 64, 1);               /* im2col in several row bands */
    /* the VAE encoder's Downsample2D: pad bottom/right by one, 3x3 stride 2 (even and odd sizes) */
    conv_case(8, 6, 3, 2, 0, 0, 1, 1, 16, 12, 1, 1);
    conv_case(5, 7, 3, 2, 0, 0, 1, 1, 9, 13, 0, 1);
    conv_case(512, 4, 3, 2, 0, 0, 1, 1, 96, 128, 1, 1);  /* several row bands */
    conv_case(4, 3, 3, 1, 1, 1, 1, 1, 7, 5, 1, 1);       /* stride 1 through the strided op = conv2d */
    conv_case(3, 5, 3, 3, 2, 0, 1, 2, 11, 10, 1, 1);     /* stride 3, four different pads */
    conv_case(6, 4, 1, 2, 0, 0, 0, 0, 10, 8, 1, 1);      /* 1x1 stride 2 */
    test_group_norm(64, 480, 32, 0, 0.0f);
    test_group_norm(64, 480, 32, 1, 0.0f);
    test_group_norm(32, 1000, 8, 0, 50.0f);             /* large mean: stats must stay accurate */
    test_channel_rmsnorm(96, 1000, 1, 1);
    test_channel_rmsnorm(3, 517, 0, 0);
    test_upsample();

    {   /* events (the profiling extension) */
        const dt_ext_profiling *pf = dt_backend_profiling(be);
        void *e0 = pf->event_create(be), *e1 = pf->event_create(be);
        pf->event_record(be, e0); pf->event_record(be, e1);
        float ms = pf->event_elapsed_ms(be, e0, e1);
        T_CHECK("events", ms >= 0 && ms < 1000, "%g ms", ms);
        pf->event_destroy(be, e0); pf->event_destroy(be, e1);
        T_CHECK("cpu backend: no fp8-internals extension", !dt_backend_fp8_internals(be), "%s", "present");
    }
    if (do_timing) timings();
    be->destroy(be);
    return T_DONE();
}
