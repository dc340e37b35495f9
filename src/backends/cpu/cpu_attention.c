/* cpu_attention.c — scaled dot-product attention on the CPU (float32, bounded memory).
 *
 * Work is split into tasks of (query head h, block of bq queries); each pool thread computes
 *   S[bq, Lk'] = scale · Q_blk · K_hᵀ   (single-threaded sgemm, strided head slices, no copies)
 *   S += key_bias; causal mask; softmax per row in f32 (max subtraction, sum in double)
 *   O_blk[bq, hd] = P · V_h            (sgemm straight into o's head columns)
 * in its own scratch of bq × Lk floats, so memory is O(threads · bq · Lk), never L × L × H.
 * GQA: query head h reads kv head h / (Hq / Hkv). Causal: query i sees keys j <= i (Lk' shrinks
 * per block). A row whose keys are all masked (-inf) produces output 0 instead of NaN.
 * fp8 attention (cpu_attention_fp8, no bias / mask; definition in backend.h): q, k, v are replaced by their
 * e4m3 values (unscaled) in scratch copies, the per-tensor scales fold into the two sgemms' alphas, and each
 * softmax row is rounded as e4m3(448 P) before P · V.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "core/fp8.h"
#include "cpu_internal.h"

#define ATT_SCRATCH_FLOATS ((size_t)1 << 20)    /* ~4 MB of scores per thread */
#define ATT_BQ_MAX 128
#define ATT_BQ_MIN 16

typedef struct {
    cpu_impl *c;
    const float *q, *k, *v; float *o;   /* q/o [Lq, Hq*hd], k/v [Lk, Hkv*hd] */
    int64_t ldq, ldk, ldv, ldo;
    int hq, hkv, hd;
    int64_t Lq, Lk, bq, nqb;
    float scale;
    const float *kb;                    /* [Lk] additive bias or NULL */
    int causal;
    int p_fp8;                          /* fp8 attention: P rounded to e4m3(448 P) */
    float oscale;                       /* alpha of P · V (1, or s_v / 448 in fp8 attention) */
} att_ctx;

static void att_task(void *vctx, int64_t t0, int64_t t1, int tid) {
    att_ctx *a = vctx;
    float *S = cpu_buf_get(&a->c->per_thread[tid], (size_t)(a->bq * a->Lk));
    for (int64_t task = t0; task < t1; task++) {
        const int h = (int)(task / a->nqb);
        const int kvh = h / (a->hq / a->hkv);
        const int64_t q0 = (task % a->nqb) * a->bq;
        const int64_t nq = a->Lq - q0 < a->bq ? a->Lq - q0 : a->bq;
        int64_t nk = a->Lk;
        if (a->causal && q0 + nq < nk) nk = q0 + nq;
        float *O = a->o + q0 * a->ldo + (int64_t)h * a->hd;
        if (nk <= 0) {   /* causal with no keys at all: every row fully masked */
            for (int64_t r = 0; r < nq; r++) memset(O + r * a->ldo, 0, (size_t)a->hd * sizeof(float));
            continue;
        }
        const float *Q = a->q + q0 * a->ldq + (int64_t)h * a->hd;
        const float *K = a->k + (int64_t)kvh * a->hd;
        const float *V = a->v + (int64_t)kvh * a->hd;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, a->hd, a->scale, Q, (int)a->ldq, K,
                    (int)a->ldk, 0.0f, S, (int)nk);
        for (int64_t r = 0; r < nq; r++) {
            float *s = S + r * nk;
            int64_t lim = nk;
            if (a->causal && q0 + r + 1 < lim) lim = q0 + r + 1;
            if (a->kb) for (int64_t j = 0; j < lim; j++) s[j] += a->kb[j];
            float mx = -INFINITY;
            for (int64_t j = 0; j < lim; j++) mx = s[j] > mx ? s[j] : mx;
            if (mx == -INFINITY) {          /* fully masked row -> output 0 */
                memset(s, 0, (size_t)nk * sizeof(float));
                continue;
            }
            double sum = 0;
            for (int64_t j = 0; j < lim; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
            const float inv = (float)(1.0 / sum);
            for (int64_t j = 0; j < lim; j++) s[j] *= inv;
            if (a->p_fp8)
                for (int64_t j = 0; j < lim; j++) s[j] = dt_e4m3_to_f32(dt_f32_to_e4m3(s[j] * DT_E4M3_MAX));
            for (int64_t j = lim; j < nk; j++) s[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, a->hd, (int)nk, a->oscale, S, (int)nk, V,
                    (int)a->ldv, 0.0f, O, (int)a->ldo);
    }
}

/* x [rows, cols] (ld) -> e4m3 values (unscaled) in dst [rows, cols] (ld cols); returns the tensor's scale
 * amax/448 (1 when amax is 0), the same expressions as core/fp8.c's rows but with one amax per tensor. */
static float fp8_tensor(const float *x, int64_t rows, int64_t cols, int64_t ld, float *dst) {
    float amax = 0.f;
    for (int64_t r = 0; r < rows; r++) {
        float m = dt_fp8_amax(x + r * ld, cols);
        amax = m > amax ? m : amax;
    }
    const float inv = amax > 0.f ? DT_E4M3_MAX / amax : 1.f;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = dt_e4m3_to_f32(dt_f32_to_e4m3(x[r * ld + c] * inv));
    return amax > 0.f ? amax / DT_E4M3_MAX : 1.f;
}

static void attention_run(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd,
                          float scale, dt_mat key_bias, int causal, int fp8) {
    cpu_impl *c = cpu_of(be);
    att_ctx a = { c, cpu_f32(q, "attention"), cpu_f32(k, "attention"), cpu_f32(v, "attention"),
                  cpu_f32(o, "attention"), q.ld, k.ld, v.ld, o.ld, hq, hkv, hd, q.rows, k.rows, 0, 0, scale, NULL,
                  causal, 0, 1.f };
    CPU_REQUIRE(hq > 0 && hkv > 0 && hd > 0 && hq % hkv == 0, "attention", "bad heads %d / kv heads %d / head dim %d",
                hq, hkv, hd);
    CPU_REQUIRE(q.cols == (int64_t)hq * hd && o.cols == q.cols && o.rows == q.rows && k.cols == (int64_t)hkv * hd &&
                v.cols == k.cols && v.rows == k.rows, "attention",
                "shapes o [%lld, %lld] q [%lld, %lld] k [%lld, %lld] v [%lld, %lld] for %d/%d heads of %d",
                (long long)o.rows, (long long)o.cols, (long long)q.rows, (long long)q.cols, (long long)k.rows,
                (long long)k.cols, (long long)v.rows, (long long)v.cols, hq, hkv, hd);
    CPU_REQUIRE(q.ld <= INT32_MAX && k.ld <= INT32_MAX && v.ld <= INT32_MAX && o.ld <= INT32_MAX &&
                k.rows <= INT32_MAX, "attention", "matrix too large");
    CPU_REQUIRE(o.data != k.data && o.data != v.data, "attention", "o must not alias k or v");
    if (key_bias.data) {
        a.kb = cpu_f32(key_bias, "attention");
        CPU_REQUIRE(key_bias.cols == k.rows, "attention", "key_bias [%lld, %lld] for %lld keys",
                    (long long)key_bias.rows, (long long)key_bias.cols, (long long)k.rows);
    }
    if (q.rows == 0) return;
    float *f8 = NULL;   /* fp8 attention: e4m3 values of q, k, v */
    if (fp8) {
        const size_t nq = (size_t)q.rows * q.cols, nk = (size_t)k.rows * k.cols;
        f8 = malloc((nq + 2 * nk) * sizeof(float) + 4);
        CPU_REQUIRE(f8 != NULL, "attention", "out of memory for the fp8 copies (%zu floats)", nq + 2 * nk);
        const float sq = fp8_tensor(a.q, q.rows, q.cols, q.ld, f8);
        const float sk = fp8_tensor(a.k, k.rows, k.cols, k.ld, f8 + nq);
        const float sv = fp8_tensor(a.v, v.rows, v.cols, v.ld, f8 + nq + nk);
        a.q = f8; a.k = f8 + nq; a.v = f8 + nq + nk;
        a.ldq = q.cols; a.ldk = k.cols; a.ldv = v.cols;
        a.scale = scale * sq * sk;
        a.p_fp8 = 1;
        a.oscale = sv / DT_E4M3_MAX;
    }
    int64_t Lk = k.rows > 0 ? k.rows : 1;
    int64_t bq = (int64_t)ATT_SCRATCH_FLOATS / Lk;
    if (bq > ATT_BQ_MAX) bq = ATT_BQ_MAX;
    if (bq < ATT_BQ_MIN) bq = ATT_BQ_MIN;
    /* keep at least ~2 tasks per thread when the problem is small */
    while (bq > ATT_BQ_MIN && hq * ((q.rows + bq - 1) / bq) < 2 * c->threads) bq /= 2;
    a.bq = bq;
    a.nqb = (q.rows + bq - 1) / bq;
    cpu_blas_threads(c, 1);
    dt_pool_run(c->pool, (int64_t)hq * a.nqb, 1, att_task, &a);
    free(f8);
}

void cpu_attention(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale,
                   dt_mat key_bias, int causal) {
    attention_run(be, o, q, k, v, hq, hkv, hd, scale, key_bias, causal, 0);
}

void cpu_attention_fp8(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale) {
    attention_run(be, o, q, k, v, hq, hkv, hd, scale, dt_mat_null(), 0, 1);
}
