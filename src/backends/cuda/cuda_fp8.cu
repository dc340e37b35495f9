/* cuda_fp8.cu — the fp8 Linear (--precision fp8, dt_linear_src.precision == DT_PREC_FP8).
 *
 * Weights: converted once at linear_create to e4m3 codes [N, K] with one f32 scale per output channel
 * (amax/448). The source (dense F32/F16/BF16, or MLX 4/8-bit dequantized as scale*q + bias with separate f32
 * multiply and add, like the CPU reference) is read in f32, one block per row: amax, then codes.
 * Activations: one fused kernel per call quantizes each row of x [M, K] to e4m3 with its own dynamic scale
 * (row amax -> scale -> convert), into a reused scratch; or the op that produces x writes the codes and scales
 * itself (norm_linear, act_linear_gated: cuda_elementwise.cu's *_e4m3 kernels, then dtc_fp8_gemm_q).
 * Gated residual (linear_gated_add): the gate multiplies the per-channel weight scales and the residual is the
 * GEMM's C (beta = 1), one GEMM and one rounding of x + gate·y (fp8_gemm_gated).
 * GEMM: one cuBLASLt e4m3 x e4m3 product, fp32 accumulation (fast accumulation unless option fp8_accurate_accum),
 * bf16 (or f32) output,
 * "TN" (both operands K-major: W [N,K] and xq [M,K] row-major, as Hopper's fp8 kernels require), with the two
 * scale vectors applied by cuBLASLt's outer-vector scaling (A/B_SCALE_MODE = OUTER_VEC_32F: weight scales
 * along m = N, activation scales along n = M) and the bias epilogue. If cuBLASLt offers no algorithm for
 * that (or with option fp8_epilogue_scales), the product is written unscaled and one elementwise pass applies
 * y = acc * sx[row] * sw[col] + bias (mode "epilogue"). Codes and scales are computed with the same f32
 * expressions as core/fp8.c (448/amax by IEEE division, one product, RNE + saturation), so both backends
 * produce identical e4m3 values. */
#include <map>
#include <tuple>

#include "cuda_common.cuh"

struct dtc_fp8_w {
    int64_t N, K;
    uint8_t *q;   /* e4m3 codes [N, K] */
    float *s;     /* per-output-channel scales [N] */
};

/* ------------------------------------------------------------------ conversion kernels */
/* (f2e4m3, e4m3x8: cuda_common.cuh) */
/* (block_max of non-negative values: cuda_common.cuh; NaNs are skipped by fmaxf) */

/* Exact small-integer -> float (as in cuda_linear.cuh). */
__device__ __forceinline__ float fp8_u2f(uint32_t u) { return __uint_as_float(0x4B000000u | u) - 8388608.f; }

/* Weight source element (row r of the chunk, column k) in f32. SRC: 0 f32, 1 f16, 2 bf16, 4/8 MLX bits. */
template <int SRC>
__device__ __forceinline__ float wsrc(const void *p, const float2 *sb, int64_t r, int64_t K, int group, int64_t k) {
    if (SRC == 0) return ((const float *)p)[r * K + k];
    if (SRC == 1) return __half2float(((const __half *)p)[r * K + k]);
    if (SRC == 2) return __bfloat162float(((const __nv_bfloat16 *)p)[r * K + k]);
    const int per = 32 / (SRC >= 4 ? SRC : 4);   /* codes per packed word (SRC 4 or 8 here) */
    uint32_t word = ((const uint32_t *)p)[r * (K / per) + k / per];
    const int bits = SRC >= 4 ? SRC : 4;
    uint32_t q = (word >> ((k % per) * bits)) & ((1u << bits) - 1u);
    float2 s = sb[r * (K / group) + k / group];
    return __fadd_rn(__fmul_rn(s.x, fp8_u2f(q)), s.y);   /* scale*q + bias without FMA, like the CPU */
}

/* One block per weight row: q [rows, K] codes, s [rows] scales. */
template <int SRC>
__global__ void k_fp8_weight(const void *p, const float2 *sb, int64_t K, int group, uint8_t *q, float *s) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    float a = 0.f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) a = fmaxf(a, fabsf(wsrc<SRC>(p, sb, r, K, group, k)));
    float amax = block_max(a, sh);
    float inv = amax > 0.f ? 448.f / amax : 1.f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) q[r * K + k] = f2e4m3(__fmul_rn(wsrc<SRC>(p, sb, r, K, group, k), inv));
    if (threadIdx.x == 0) s[r] = amax > 0.f ? amax / 448.f : 1.f;
}

/* Activations: one block per row of x [M, K] (bf16 or f32, strided) -> q [M, K] codes (ld K), s [M].
 * VEC: bf16 rows read as 16-byte vectors (8 elements), codes written 8 at a time. */
template <int VEC>
__global__ void k_fp8_act(dmat x, int64_t K, uint8_t *q, float *s) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    float a = 0.f;
    if (VEC) {
        const __nv_bfloat16 *row = (const __nv_bfloat16 *)x.p + r * x.ld;
        for (int64_t c = threadIdx.x; c < K / 8; c += blockDim.x) {
            float f[8];
            bf8_to_f(*(const uint4 *)(row + c * 8), f);
#pragma unroll
            for (int j = 0; j < 8; j++) a = fmaxf(a, fabsf(f[j]));
        }
        float amax = block_max(a, sh);
        float inv = amax > 0.f ? 448.f / amax : 1.f;
        for (int64_t c = threadIdx.x; c < K / 8; c += blockDim.x) {
            float f[8];
            bf8_to_f(*(const uint4 *)(row + c * 8), f);
            *(uint2 *)(q + r * K + c * 8) = e4m3x8(f, inv);
        }
        if (threadIdx.x == 0) s[r] = amax > 0.f ? amax / 448.f : 1.f;
    } else {
        for (int64_t k = threadIdx.x; k < K; k += blockDim.x) a = fmaxf(a, fabsf(dm_get(x, r, k)));
        float amax = block_max(a, sh);
        float inv = amax > 0.f ? 448.f / amax : 1.f;
        for (int64_t k = threadIdx.x; k < K; k += blockDim.x) q[r * K + k] = f2e4m3(__fmul_rn(dm_get(x, r, k), inv));
        if (threadIdx.x == 0) s[r] = amax > 0.f ? amax / 448.f : 1.f;
    }
}

/* Epilogue mode: y[r, c] = y[r, c] * sx[r] * sw[c] (+ bias[c]) in place. */
__global__ void k_fp8_scale(dmat y, int64_t M, int64_t N, const float *sx, const float *sw, const __nv_bfloat16 *bias) {
    int64_t total = M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / N, c = i - r * N;
        float v = dm_get(y, r, c) * sx[r] * sw[c];
        if (bias) v += __bfloat162float(bias[c]);
        dm_set(y, r, c, v);
    }
}

/* ------------------------------------------------------------------ weights */
int dtc_fp8_eligible(const dt_linear_src *src) {
    /* cuBLASLt fp8: K-major operands with 16-byte aligned rows; N % 16 keeps the scale vectors and the
     * bf16 output rows aligned. */
    return src->in % 16 == 0 && src->out % 16 == 0 && (src->bits == 0 || src->bits == 4 || src->bits == 8);
}

void dtc_fp8_weight_free(dtc_state *st, dtc_fp8_w *f) {
    if (!f) return;
    dtc_pool_free(st, f->q);
    dtc_pool_free(st, f->s);
    free(f);
}

dtc_fp8_w *dtc_fp8_weight_create(dtc_state *st, const dt_linear_src *src) {
    const char *nm = src->name ? src->name : "?";
    const int64_t N = src->out, K = src->in;
    dtc_fp8_w *f = (dtc_fp8_w *)calloc(1, sizeof *f);
    if (!f) { dt_set_error("cuda: out of host memory"); return NULL; }
    f->N = N;
    f->K = K;
    f->q = (uint8_t *)dtc_pool_alloc(st, (size_t)N * K);
    f->s = (float *)dtc_pool_alloc(st, (size_t)N * sizeof(float));
    if (!f->q || !f->s) { dtc_fp8_weight_free(st, f); return NULL; }
    if (src->dtype == DT_F8_E4M3 && !src->bits) {
        /* an e4m3 file: its codes as stored, its scale (per tensor or per channel) as the per-channel vector */
        float *hs = (float *)malloc((size_t)N * sizeof(float));
        if (!hs) { dt_set_error("cuda: out of host memory"); dtc_fp8_weight_free(st, f); return NULL; }
        for (int64_t r = 0; r < N; r++) hs[r] = dt_linear_src_fp8_scale(src, r);
        CK(cudaMemcpyAsync(f->q, src->data, (size_t)N * K, cudaMemcpyHostToDevice, st->q.stream));
        CK(cudaMemcpyAsync(f->s, hs, (size_t)N * sizeof(float), cudaMemcpyHostToDevice, st->q.stream));
        CK(cudaStreamSynchronize(st->q.stream));
        free(hs);
        return f;
    }
    if (src->bits == 0 && !dt_linear_src_dense(src)) {
        /* e5m2 files, GGUF blocks: dequantized exactly on the host in row chunks, then the f32 path below (one e4m3
         * rounding with per-channel scales) */
        int64_t rows = ((int64_t)1 << 24) / K;
        if (rows < 1) rows = 1;
        if (rows > N) rows = N;
        float *h = (float *)malloc((size_t)(rows * K) * sizeof(float));
        void *stage = dtc_pool_alloc(st, (size_t)(rows * K) * sizeof(float));
        if (!h || !stage) { free(h); dtc_pool_free(st, stage); dtc_fp8_weight_free(st, f); return NULL; }
        for (int64_t r0 = 0; r0 < N; r0 += rows) {
            int64_t nr = N - r0 < rows ? N - r0 : rows;
            dt_linear_src_rows_f32(src, r0, nr, h);
            CK(cudaMemcpyAsync(stage, h, (size_t)(nr * K) * sizeof(float), cudaMemcpyHostToDevice, st->q.stream));
            k_fp8_weight<0><<<(unsigned)nr, 256, 0, st->q.stream>>>(stage, nullptr, K, 1, f->q + r0 * K, f->s + r0);
            CK_LAUNCH("fp8_weight");
            CK(cudaStreamSynchronize(st->q.stream));   /* h and the stage are reused */
        }
        free(h);
        dtc_pool_free(st, stage);
        return f;
    }
    if (src->bits == 0) {
        int sk = src->dtype == DT_F32 ? 0 : src->dtype == DT_F16 ? 1 : src->dtype == DT_BF16 ? 2 : -1;
        if (sk < 0) {
            dt_set_error("cuda: linear %s: unsupported weight dtype %s", nm, dt_dtype_name(src->dtype));
            dtc_fp8_weight_free(st, f);
            return NULL;
        }
        size_t es = dt_dtype_size(src->dtype);
        int64_t rows = ((int64_t)1 << 26) / K;   /* staging: ~64 M elements at a time */
        if (rows < 1) rows = 1;
        if (rows > N) rows = N;
        void *stage = dtc_pool_alloc(st, (size_t)rows * K * es);
        if (!stage) { dtc_fp8_weight_free(st, f); return NULL; }
        for (int64_t r0 = 0; r0 < N; r0 += rows) {
            int64_t nr = N - r0 < rows ? N - r0 : rows;
            CK(cudaMemcpyAsync(stage, (const char *)src->data + (size_t)(r0 * K) * es, (size_t)(nr * K) * es,
                               cudaMemcpyHostToDevice, st->q.stream));
            uint8_t *q = f->q + r0 * K;
            float *s = f->s + r0;
            if (sk == 0) k_fp8_weight<0><<<(unsigned)nr, 256, 0, st->q.stream>>>(stage, nullptr, K, 1, q, s);
            else if (sk == 1) k_fp8_weight<1><<<(unsigned)nr, 256, 0, st->q.stream>>>(stage, nullptr, K, 1, q, s);
            else k_fp8_weight<2><<<(unsigned)nr, 256, 0, st->q.stream>>>(stage, nullptr, K, 1, q, s);
            CK_LAUNCH("fp8_weight");
            CK(cudaStreamSynchronize(st->q.stream));  /* the stage is reused */
        }
        dtc_pool_free(st, stage);
    } else {
        if ((src->bits != 4 && src->bits != 8) || src->group_size <= 0 || K % src->group_size || K % 8) {
            dt_set_error("cuda: linear %s: unsupported quantization bits=%d group=%d in=%lld", nm, src->bits,
                         src->group_size, (long long)K);
            dtc_fp8_weight_free(st, f);
            return NULL;
        }
        int64_t words = K * src->bits / 32, ng = K / src->group_size;
        uint32_t *qw = (uint32_t *)dtc_pool_alloc(st, (size_t)N * words * 4);
        float2 *sb = (float2 *)dtc_pool_alloc(st, (size_t)N * ng * sizeof(float2));
        float2 *h = (float2 *)malloc((size_t)N * ng * sizeof(float2));
        if (!qw || !sb || !h) {
            if (!h) dt_set_error("cuda: out of host memory");
            dtc_pool_free(st, qw);
            dtc_pool_free(st, sb);
            free(h);
            dtc_fp8_weight_free(st, f);
            return NULL;
        }
        dtc_host_scales(src, h, N * ng);
        CK(cudaMemcpyAsync(qw, src->data, (size_t)N * words * 4, cudaMemcpyHostToDevice, st->q.stream));
        CK(cudaMemcpyAsync(sb, h, (size_t)N * ng * sizeof(float2), cudaMemcpyHostToDevice, st->q.stream));
        if (src->bits == 4) k_fp8_weight<4><<<(unsigned)N, 256, 0, st->q.stream>>>(qw, sb, K, src->group_size, f->q, f->s);
        else k_fp8_weight<8><<<(unsigned)N, 256, 0, st->q.stream>>>(qw, sb, K, src->group_size, f->q, f->s);
        CK_LAUNCH("fp8_weight");
        CK(cudaStreamSynchronize(st->q.stream));
        free(h);
        dtc_pool_free(st, qw);
        dtc_pool_free(st, sb);
    }
    return f;
}

/* ------------------------------------------------------------------ activation quantization */
/* The current queue's fp8 scratch for M rows of K: codes [M, K], the scales [M] at codes + M*K rounded up to 256
 * bytes. */
uint8_t *dtc_fp8_act_scratch(dtc_state *st, int64_t M, int64_t K, float **sx) {
    size_t qbytes = ((size_t)(M * K) + 255) & ~(size_t)255;
    uint8_t *q = (uint8_t *)dtc_scratch_get(st, &st->q.s_fp8, qbytes + (size_t)M * sizeof(float));
    *sx = (float *)(q + qbytes);
    return q;
}

/* x [M, K] (bf16/f32, any ld) -> codes [M, K] + scales [M] in that scratch; returns the codes. */
uint8_t *dtc_fp8_quant_act(dtc_state *st, dt_mat x, float **sx) {
    const int64_t M = x.rows, K = x.cols;
    uint8_t *q = dtc_fp8_act_scratch(st, M, K, sx);
    int threads = K >= 8192 ? 256 : 128;
    DTC_REQUIRE(M < 2147483647LL, "fp8 linear: %lld rows", (long long)M);
    if (M <= 0) return q;
    if (dtc_vec8_ok(x) && K % 8 == 0) k_fp8_act<1><<<(unsigned)M, threads, 0, st->q.stream>>>(dtc_dm(x), K, q, *sx);
    else k_fp8_act<0><<<(unsigned)M, threads, 0, st->q.stream>>>(dtc_dm(x), K, q, *sx);
    CK_LAUNCH("fp8_act");
    return q;
}

void dtc_fp8_quant(dt_backend *be, dt_mat x) {
    dtc_state *st = dtc(be);
    float *sx;
    if (x.rows > 0) (void)dtc_fp8_quant_act(st, x, &sx);
}

/* ------------------------------------------------------------------ fp8 attention inputs */
/* q, k, v of one attention call: bf16 views in, contiguous e4m3 codes out (one scale per tensor). */
struct f8att {
    const __nv_bfloat16 *x[3];
    uint8_t *d[3];
    int64_t rows[3], cols[3], ld[3];
};

/* Per-tensor amax (blockIdx.y = tensor) into amax[t * 4] as f32 bits (non-negative floats order like their
 * bits; NaNs skipped by fmaxf). VEC: rows read as 16-byte vectors (cols % 8 == 0, ld % 8 == 0, aligned). */
template <int VEC>
__global__ void k_att_amax(f8att a, unsigned *amax) {
    __shared__ float sh[32];
    const int t = blockIdx.y;
    const int64_t cols = a.cols[t], per = VEC ? cols / 8 : cols, n = a.rows[t] * per;
    float m = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / per, c = i - r * per;
        if (VEC) {
            float f[8];
            bf8_to_f(*(const uint4 *)(a.x[t] + r * a.ld[t] + c * 8), f);
#pragma unroll
            for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
        } else {
            m = fmaxf(m, fabsf(__bfloat162float(a.x[t][r * a.ld[t] + c])));
        }
    }
    m = block_max(m, sh);
    if (threadIdx.x == 0 && m > 0.f) atomicMax(amax + t * 4, __float_as_uint(m));
}

/* Codes e4m3(x * (448 / amax)) into d[t] [rows, cols] (ld cols), the expressions of core/fp8.c; block 0 also
 * writes the scales cuDNN reads (slots of 4 floats: 3 + t: amax / 448, 6: 1/448, 7: 448, 8: O's scale, 1 or
 * 448 / amax(v) for an e4m3 O). */
template <int VEC>
__global__ void k_att_quant(f8att a, float *sc, int o_fp8) {
    /* tensors and blocks in the reverse order of k_att_amax: what it read last (v's tail) may still be in L2 */
    const int t = 2 - (int)blockIdx.y;
    const unsigned bx = gridDim.x - 1 - blockIdx.x;
    const float amax = sc[t * 4];
    const float inv = amax > 0.f ? 448.f / amax : 1.f;
    if (bx == 0 && threadIdx.x == 0) {
        sc[(3 + t) * 4] = amax > 0.f ? amax / 448.f : 1.f;
        if (t == 0) { sc[6 * 4] = 1.f / 448.f; sc[7 * 4] = 448.f; }
        if (t == 2) sc[8 * 4] = o_fp8 ? inv : 1.f;   /* an e4m3 O spans |O| <= amax(v) */
    }
    const int64_t cols = a.cols[t], per = VEC ? cols / 8 : cols, n = a.rows[t] * per;
    for (int64_t i = bx * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / per, c = i - r * per;
        if (VEC) {
            float f[8];
            bf8_to_f(*(const uint4 *)(a.x[t] + r * a.ld[t] + c * 8), f);
            *(uint2 *)(a.d[t] + r * cols + c * 8) = e4m3x8(f, inv);
        } else {
            a.d[t][r * cols + c] = f2e4m3(__fmul_rn(__bfloat162float(a.x[t][r * a.ld[t] + c]), inv));
        }
    }
}

void dtc_attn_fp8_quant(dtc_state *st, dt_mat q, dt_mat k, dt_mat v, uint8_t *q8, uint8_t *k8, uint8_t *v8,
                        float *sc, int o_fp8) {
    f8att a;
    const dt_mat m[3] = {q, k, v};
    uint8_t *d[3] = {q8, k8, v8};
    int vec = 1;
    int64_t most = 0;
    for (int t = 0; t < 3; t++) {
        DTC_REQUIRE(m[t].dtype == DT_BF16, "attention fp8: q/k/v must be BF16");
        a.x[t] = (const __nv_bfloat16 *)m[t].data;
        a.d[t] = d[t];
        a.rows[t] = m[t].rows;
        a.cols[t] = m[t].cols;
        a.ld[t] = m[t].ld;
        vec &= dtc_vec8_ok(m[t]) && m[t].cols % 8 == 0 && ((uintptr_t)d[t] & 7) == 0;
        int64_t n = m[t].rows * m[t].cols;
        most = n > most ? n : most;
    }
    int64_t per_block = 256LL * (vec ? 8 : 1) * 4;   /* ~4 vectors per thread */
    int64_t gx = (most + per_block - 1) / per_block;
    int64_t cap = (int64_t)st->sm_count * 8;
    dim3 grid((unsigned)(gx < 1 ? 1 : gx > cap ? cap : gx), 3);
    CK(cudaMemsetAsync(sc, 0, 3 * 4 * sizeof(float), st->q.stream));
    if (vec) k_att_amax<1><<<grid, 256, 0, st->q.stream>>>(a, (unsigned *)sc);
    else k_att_amax<0><<<grid, 256, 0, st->q.stream>>>(a, (unsigned *)sc);
    CK_LAUNCH("att_amax");
    if (vec) k_att_quant<1><<<grid, 256, 0, st->q.stream>>>(a, sc, o_fp8);
    else k_att_quant<0><<<grid, 256, 0, st->q.stream>>>(a, sc, o_fp8);
    CK_LAUNCH("att_quant");
}

/* o (bf16, any ld) = src [rows, cols] (ld lds): the fp8 attention's output when cuDNN cannot write bf16; f16, or
 * e4m3 codes times *scale. */
template <int F8>
__global__ void k_att_out(dmat o, const void *src, const float *scale, int64_t lds, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    const float s = F8 ? *scale : 1.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i - r * cols;
        float v;
        if (F8) {
            __nv_fp8_e4m3 e;
            e.__x = ((const uint8_t *)src)[r * lds + c];
            v = (float)e * s;
        } else {
            v = __half2float(((const __half *)src)[r * lds + c]);
        }
        dm_set(o, r, c, v);
    }
}
/* The e4m3 case 8 elements at a time (cols, lds, o.ld multiples of 8; aligned): 8-byte loads, 16-byte stores. */
__global__ void k_att_out8(__nv_bfloat16 *o, int64_t ldo, const uint8_t *src, const float *scale, int64_t lds,
                           int64_t rows, int64_t cols) {
    const int64_t per = cols / 8, n = rows * per;
    const float s = *scale;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / per, c = (i - r * per) * 8;
        const uint2 u = *(const uint2 *)(src + r * lds + c);
        float f[8];
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const __nv_fp8x2_e4m3 *p2 = (const __nv_fp8x2_e4m3 *)&u;
            float2 t = (float2)p2[h];
            f[2 * h] = t.x * s;
            f[2 * h + 1] = t.y * s;
        }
        *(uint4 *)(o + r * ldo + c) = f_to_bf8(f);
    }
}
void dtc_attn_fp8_out(dtc_state *st, dt_mat o, const void *src, int64_t lds, int f8, const float *scale) {
    const int64_t n = o.rows * o.cols;
    if (n <= 0) return;
    int64_t gx = (n + 1023) / 1024, cap = (int64_t)st->sm_count * 16;
    unsigned g = (unsigned)(gx > cap ? cap : gx);
    if (f8 && dtc_vec8_ok(o) && o.cols % 8 == 0 && lds % 8 == 0 && ((uintptr_t)src & 7) == 0) {
        k_att_out8<<<g, 256, 0, st->q.stream>>>((__nv_bfloat16 *)o.data, o.ld, (const uint8_t *)src, scale, lds,
                                                  o.rows, o.cols);
        CK_LAUNCH("att_out8");
        return;
    }
    if (f8) k_att_out<1><<<g, 256, 0, st->q.stream>>>(dtc_dm(o), src, scale, lds, o.rows, o.cols);
    else k_att_out<0><<<g, 256, 0, st->q.stream>>>(dtc_dm(o), src, scale, lds, o.rows, o.cols);
    CK_LAUNCH("att_out");
}

/* ------------------------------------------------------------------ cuBLASLt fp8 GEMM */
struct f8_key {
    int dtd, has_bias, outer, fast, ad, acc;   /* acc: D = product + D (beta = 1, the gated residual) */
    int64_t m, n, k, ldd;
    bool operator<(const f8_key &o) const {
        return std::tie(dtd, has_bias, outer, fast, ad, acc, m, n, k, ldd) <
               std::tie(o.dtd, o.has_bias, o.outer, o.fast, o.ad, o.acc, o.m, o.n, o.k, o.ldd);
    }
};
struct f8_entry {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int ok;              /* 0: cuBLASLt has no algorithm for this key (kept so the heuristic runs once) */
};
struct dtc_fp8_cache {
    std::map<f8_key, f8_entry> m;
    int n_outer_ok = 0, n_outer_fail = 0;   /* GEMM shapes with / without an outer-vector-scaled algorithm */
};
static void f8_entry_free(f8_entry &e) {
    if (e.op) cublasLtMatmulDescDestroy(e.op);
    if (e.la) cublasLtMatrixLayoutDestroy(e.la);
    if (e.lb) cublasLtMatrixLayoutDestroy(e.lb);
    if (e.ld) cublasLtMatrixLayoutDestroy(e.ld);
}

void dtc_fp8_cache_free(dtc_state *st) {
    if (!st->fp8_cache) return;
    for (auto &kv : st->fp8_cache->m)
        if (kv.second.ok) f8_entry_free(kv.second);
    delete st->fp8_cache;
    st->fp8_cache = nullptr;
}

static int fp8_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 2 && (a % (uintptr_t)al)) al >>= 1;
    return al;
}

/* Builds the descriptor and asks the heuristic; 0 ok, -1 when cuBLASLt has no algorithm (entry freed). */
static int f8_build(dtc_state *st, const f8_key &key, const void *sw, const void *sx, const void *bias, f8_entry &e) {
    memset(&e, 0, sizeof e);
    CKLT(cublasLtMatmulDescCreate(&e.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    int8_t fast = (int8_t)key.fast;
    CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    if (key.outer) {
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
    }
    if (key.has_bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        cudaDataType_t bt = CUDA_R_16BF;
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    cudaDataType_t dt = key.dtd == (int)DT_F32 ? CUDA_R_32F : CUDA_R_16BF;
    CKLT(cublasLtMatrixLayoutCreate(&e.la, CUDA_R_8F_E4M3, key.k, key.m, key.k));
    CKLT(cublasLtMatrixLayoutCreate(&e.lb, CUDA_R_8F_E4M3, key.k, key.n, key.k));
    CKLT(cublasLtMatrixLayoutCreate(&e.ld, dt, key.m, key.n, key.ldd));
    cublasLtMatmulPreference_t pref;
    CKLT(cublasLtMatmulPreferenceCreate(&pref));
    CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &st->lt_ws_size,
                                              sizeof st->lt_ws_size));
    uint32_t d32 = (uint32_t)key.ad;
    CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &d32, sizeof d32));
    CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &d32, sizeof d32));
    cublasLtMatmulHeuristicResult_t res;
    int cnt = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(st->lt, e.op, e.la, e.lb, e.ld, e.ld, pref, 1, &res, &cnt);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || cnt < 1) {
        if (st->verbose)
            fprintf(stderr, "ditrun: cuda: fp8 GEMM m=%lld n=%lld k=%lld (%s scales): no cuBLASLt algorithm (%s)\n",
                    (long long)key.m, (long long)key.n, (long long)key.k, key.outer ? "outer-vector" : "no",
                    s != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(s) : "heuristic returned none");
        f8_entry_free(e);
        return -1;
    }
    e.algo = res.algo;
    e.ok = 1;
    return 0;
}

/* Scales in a pass of their own instead of cuBLASLt's outer-vector mode (option fp8_epilogue_scales). */
static int fp8_epilogue_forced(const dtc_state *st) { return st->o.fp8_epilogue_scales; }
/* Fast accumulation (cuBLASLt's FAST_ACCUM: no periodic promotion of the tensor cores' partial sums) is the
 * default: −2.6 ms per 1024² fp8 forward at the same forward error (PERF.md, stop 16); option fp8_accurate_accum
 * selects the accurate mode. */
static int fp8_fast(const dtc_state *st) { return !st->o.fp8_accurate_accum; }

const char *dtc_fp8_scale_mode(dtc_state *st) {
    if (fp8_epilogue_forced(st)) return "epilogue (forced by the fp8_epilogue_scales option)";
    dtc_fp8_cache *c = st->fp8_cache;
    if (!c || c->n_outer_ok + c->n_outer_fail == 0) return "untested";
    if (!c->n_outer_fail) return "outer-vector (cuBLASLt)";
    if (!c->n_outer_ok) return "epilogue (cuBLASLt has no outer-vector algorithm)";
    static char buf[96];
    snprintf(buf, sizeof buf, "outer-vector for %d shapes, epilogue for %d", c->n_outer_ok, c->n_outer_fail);
    return buf;
}

/* The cached entry for key (building it on first use); NULL when cuBLASLt has no algorithm. */
static f8_entry *f8_get(dtc_state *st, const f8_key &key, const void *sw, const void *sx, const void *bias) {
    if (!st->fp8_cache) st->fp8_cache = new dtc_fp8_cache();
    dtc_fp8_cache *c = st->fp8_cache;
    auto it = c->m.find(key);
    if (it == c->m.end()) {
        f8_entry e;
        int rc = f8_build(st, key, sw, sx, bias, e);
        if (rc) memset(&e, 0, sizeof e);
        if (key.outer && !key.acc) (rc ? c->n_outer_fail : c->n_outer_ok)++;
        it = c->m.emplace(key, e).first;
    }
    return it->second.ok ? &it->second : nullptr;
}

/* sw'[n] = sw[n] * gate[n] (gate bf16 or f32): the gate folded into the weights' per-channel scales. */
__global__ void k_fp8_gate_scale(float *d, const float *sw, const void *gate, int g32, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = g32 ? ((const float *)gate)[i] : __bfloat162float(((const __nv_bfloat16 *)gate)[i]);
    d[i] = sw[i] * g;
}

/* x[M,N] += gate ⊙ (xq · Wᵀ) in one GEMM: the gate folded into the weight scales (outer-vector mode), the residual
 * as C = D = x with beta = 1. 0 = queued; -1 = not available here (no bias allowed, outer-vector scaling and an
 * algorithm for it needed; nothing queued). The sum is rounded once (the two-op path rounds y, gate·y and x + ..). */
static int fp8_gemm_gated(dtc_state *st, dt_mat x, const uint8_t *xq, const float *sx, const dtc_fp8_w *f, dt_mat gate) {
    if (fp8_epilogue_forced(st) || (gate.data && gate.dtype != DT_BF16 && gate.dtype != DT_F32)) return -1;
    f8_key key;
    key.dtd = (int)x.dtype;
    key.fast = fp8_fast(st);
    key.ad = fp8_align(x.data);
    key.acc = 1;
    key.outer = 1;
    key.has_bias = 0;
    key.m = f->N;
    key.n = x.rows;
    key.k = f->K;
    key.ldd = x.ld;
    const float *swp = f->s;
    if (gate.data) {
        float *g = (float *)dtc_scratch_get(st, &st->q.s_fp8g, (size_t)f->N * sizeof(float));
        k_fp8_gate_scale<<<dtc_blocks(f->N, 256), 256, 0, st->q.stream>>>(g, f->s, gate.data, gate.dtype == DT_F32, f->N);
        CK_LAUNCH("fp8_gate_scale");
        swp = g;
    }
    f8_entry *ep = f8_get(st, key, swp, sx, nullptr);
    if (!ep) return -1;
    f8_entry &e = *ep;
    const void *sxp = sx;
    CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &swp, sizeof swp));
    CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sxp, sizeof sxp));
    float alpha = 1.f, beta = 1.f;
    cublasStatus_t rs = cublasLtMatmul(st->lt, e.op, &alpha, f->q, e.la, xq, e.lb, &beta, x.data, e.ld, x.data, e.ld,
                                       &e.algo, st->q.lt_ws, st->lt_ws_size, st->q.stream);
    if (rs == CUBLAS_STATUS_SUCCESS) return 0;
    if (st->verbose)
        fprintf(stderr, "ditrun: cuda: fp8 GEMM m=%lld n=%lld k=%lld with the residual as C: %s; two passes\n",
                (long long)key.m, (long long)key.n, (long long)key.k, cublasGetStatusString(rs));
    f8_entry_free(e);
    e.ok = 0;
    return -1;
}

/* y[M,N] = xq · Wᵀ (+ bias) from activation codes xq [M, K] and row scales sx [M]. */
static void fp8_gemm(dtc_state *st, dt_mat y, const uint8_t *xq, const float *sx, const dtc_fp8_w *f,
                     const __nv_bfloat16 *bias) {
    f8_key key;
    key.dtd = (int)y.dtype;
    key.fast = fp8_fast(st);
    key.ad = fp8_align(y.data);
    key.acc = 0;
    key.m = f->N;
    key.n = y.rows;
    key.k = f->K;
    key.ldd = y.ld;
    /* the unscaled product, then the epilogue pass (scales and bias) */
    auto epilogue_entry = [&]() {
        key.outer = 0;
        key.has_bias = 0;
        f8_entry *e0 = f8_get(st, key, f->s, sx, bias);
        DTC_REQUIRE(e0, "fp8 linear: cuBLASLt has no e4m3 algorithm for m=%lld n=%lld k=%lld ldd=%lld (alignment %d)",
                    (long long)key.m, (long long)key.n, (long long)key.k, (long long)key.ldd, key.ad);
        return e0;
    };
    f8_entry *ep = nullptr;
    if (!fp8_epilogue_forced(st)) {
        key.outer = 1;
        key.has_bias = bias && y.dtype == DT_BF16;
        ep = f8_get(st, key, f->s, sx, bias);
    }
    if (!ep) ep = epilogue_entry();
    float alpha = 1.f, beta = 0.f;
    for (;;) {
        f8_entry &e = *ep;
        if (key.outer) {
            const void *swp = f->s, *sxp = sx;
            CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &swp, sizeof swp));
            CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sxp, sizeof sxp));
        }
        if (key.has_bias)
            CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        cublasStatus_t rs = cublasLtMatmul(st->lt, e.op, &alpha, f->q, e.la, xq, e.lb, &beta, y.data, e.ld, y.data, e.ld,
                                           &e.algo, st->q.lt_ws, st->lt_ws_size, st->q.stream);
        if (rs == CUBLAS_STATUS_SUCCESS) break;
        if (!key.outer) dtc_fatal("cublasLtMatmul (fp8)", __FILE__, __LINE__, cublasGetStatusString(rs));
        /* the heuristic offered an outer-vector algorithm that does not run: epilogue mode for this shape */
        if (st->verbose)
            fprintf(stderr, "ditrun: cuda: fp8 GEMM m=%lld n=%lld k=%lld: outer-vector scaling failed (%s); epilogue pass\n",
                    (long long)key.m, (long long)key.n, (long long)key.k, cublasGetStatusString(rs));
        f8_entry_free(e);
        e.ok = 0;
        st->fp8_cache->n_outer_ok--;
        st->fp8_cache->n_outer_fail++;
        ep = epilogue_entry();
    }
    if (!key.outer) {
        int64_t total = y.rows * y.cols;
        int64_t b = (total + 255) / 256;
        if (b > (int64_t)st->sm_count * 16) b = (int64_t)st->sm_count * 16;
        k_fp8_scale<<<(unsigned)b, 256, 0, st->q.stream>>>(dtc_dm(y), y.rows, y.cols, sx, f->s, bias);
        CK_LAUNCH("fp8_scale");
    } else if (bias && !key.has_bias) {
        dtc_add_row_bias(st, y, bias);
    }
}

void dtc_fp8_gemm_q(dt_backend *be, dt_mat x, const uint8_t *xq, const float *sx, const dtc_fp8_w *f,
                    const __nv_bfloat16 *bias, dt_mat gate, int acc) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(x.cols == f->N, "fp8 linear: output has %lld columns, W %lld rows", (long long)x.cols, (long long)f->N);
    if (x.rows <= 0) return;
    if (!acc) {
        fp8_gemm(st, x, xq, sx, f, bias);
        return;
    }
    if (!bias && fp8_gemm_gated(st, x, xq, sx, f, gate) == 0) return;
    void *yp = dtc_scratch_get(st, &st->q.s_lga, (size_t)x.rows * x.cols * 2);
    dt_mat y = {yp, x.rows, x.cols, x.cols, DT_BF16};
    fp8_gemm(st, y, xq, sx, f, bias);
    dtc_gated_add(be, x, gate, y);
}

void dtc_fp8_linear(dtc_state *st, dt_mat y, dt_mat x, const dtc_fp8_w *f, const __nv_bfloat16 *bias) {
    DTC_REQUIRE(x.cols == f->K && y.cols == f->N && y.rows == x.rows,
                "fp8 linear: y[%lld,%lld] = x[%lld,%lld] · W[%lld,%lld]ᵀ shape mismatch", (long long)y.rows,
                (long long)y.cols, (long long)x.rows, (long long)x.cols, (long long)f->N, (long long)f->K);
    if (x.rows <= 0) return;
    float *sx;
    uint8_t *xq = dtc_fp8_quant_act(st, x, &sx);
    fp8_gemm(st, y, xq, sx, f, bias);
}

/* ------------------------------------------------------------------ preloading (see cuda_common.cuh) */
void dtc_preload_fp8(dtc_state *st) {
    (void)st;
    dtc_preload_fn((const void *)k_fp8_weight<0>);
    dtc_preload_fn((const void *)k_fp8_weight<1>);
    dtc_preload_fn((const void *)k_fp8_weight<2>);
    dtc_preload_fn((const void *)k_fp8_weight<4>);
    dtc_preload_fn((const void *)k_fp8_weight<8>);
    dtc_preload_fn((const void *)k_fp8_act<0>);
    dtc_preload_fn((const void *)k_fp8_act<1>);
    dtc_preload_fn((const void *)k_fp8_scale);
    dtc_preload_fn((const void *)k_att_amax<0>);
    dtc_preload_fn((const void *)k_att_amax<1>);
    dtc_preload_fn((const void *)k_att_quant<0>);
    dtc_preload_fn((const void *)k_att_quant<1>);
    dtc_preload_fn((const void *)k_att_out<0>);
    dtc_preload_fn((const void *)k_att_out<1>);
    dtc_preload_fn((const void *)k_att_out8);
}
