/* cuda_elementwise.cu — row-wise and elementwise ops of the CUDA backend: layernorm_mod, rmsnorm (+ shift),
 * head_norm_rope (fused per-head RMSNorm + RoPE), act_mul, gated_add, mul, axpby, copy (strided, with
 * F32<->BF16 conversion), transpose, abs_diff_sums (two sums read back to the host), and small helpers (dtype
 * conversion at upload, bias adds).
 *
 * Elementwise ops run one of two kernels: a vectorised one (8 elements = one 16-byte bf16 load per thread)
 * when every operand's rows are 16-byte aligned, otherwise a scalar one that handles any strides and
 * F32/BF16 mixes. Norms use one block per row (fp32 statistics, the row kept in registers).
 * Rounding imitates the bf16 torch reference where it rounds intermediates. */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

/* Row kernels (norms, act_e4m3) keep up to NORM_NV 8-element vectors per thread in registers. */
#define NORM_NV 4

/* Threads for a row of `cols`: up to NORM_NV 16-byte vectors per thread (measured on the H200: 4 vectors per
 * thread beat 1 per thread for D = 3072, 1.70 vs 1.15 TB/s); longer rows use the scalar kernel. */
static int norm_threads(int64_t cols, int *vec) {
    int64_t nvec = cols / 8;
    int64_t t = (nvec + NORM_NV - 1) / NORM_NV;
    t = (t + 31) / 32 * 32;
    if (t < 64) t = 64;
    if (t > 1024) { *vec = 0; return 512; }
    return (int)t;
}

/* ------------------------------------------------------------------ vector access helpers */
/* V = 8: 8 consecutive elements (caller guarantees 16-byte alignment); V = 1: one element. */
template <int V>
__device__ __forceinline__ void ldv(const dmat &m, int64_t r, int64_t c, float *f) {
    if (V == 8) {
        if (m.isbf) {
            uint4 u = *(const uint4 *)((const __nv_bfloat16 *)m.p + r * m.ld + c);
            bf8_to_f(u, f);
        } else {
            const float4 *p = (const float4 *)((const float *)m.p + r * m.ld + c);
            float4 a = p[0], b = p[1];
            f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
            f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
        }
    } else {
        f[0] = dm_get(m, r, c);
    }
}
template <int V>
__device__ __forceinline__ void stv(const dmat &m, int64_t r, int64_t c, const float *f) {
    if (V == 8) {
        if (m.isbf) {
            *(uint4 *)((__nv_bfloat16 *)m.p + r * m.ld + c) = f_to_bf8(f);
        } else {
            float4 *p = (float4 *)((float *)m.p + r * m.ld + c);
            p[0] = make_float4(f[0], f[1], f[2], f[3]);
            p[1] = make_float4(f[4], f[5], f[6], f[7]);
        }
    } else {
        dm_set(m, r, c, f[0]);
    }
}

/* Host: can this matrix be accessed 8 elements at a time? */
static int vec_ok(const dt_mat &m) {
    if (!m.data) return 1;
    if (m.cols % 8) return 0;
    if (!dtc_aligned16(m.data)) return 0;
    if (m.dtype == DT_BF16) return m.ld % 8 == 0;
    return m.ld % 4 == 0;
}
static int vec_ok_row(const dt_mat &m) {  /* broadcast [1, D] vectors: only the first row is read */
    if (!m.data) return 1;
    return m.cols % 8 == 0 && dtc_aligned16(m.data);
}
static void req_float(const dt_mat &m, const char *op, const char *what) {
    DTC_REQUIRE(!m.data || m.dtype == DT_BF16 || m.dtype == DT_F32, "%s: %s has dtype %s (BF16 or F32 expected)", op,
                what, dt_dtype_name(m.dtype));
}

template <class F, int V>
__global__ void k_ew(F f, int64_t rows, int64_t cols) {
    int64_t cv = cols / V, total = rows * cv;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cv, c = (i - r * cv) * V;
        f.template run<V>(r, c);
    }
}

template <class F>
static void launch_ew(dtc_state *st, const F &f, int64_t rows, int64_t cols, int vec, const char *name) {
    if (rows <= 0 || cols <= 0) return;
    const int threads = 256;
    int64_t total = vec ? rows * (cols / 8) : rows * cols;
    int64_t maxb = (int64_t)st->sm_count * 16;
    int64_t b = (total + threads - 1) / threads;
    if (b > maxb) b = maxb;
    if (vec) k_ew<F, 8><<<(unsigned)b, threads, 0, st->q.stream>>>(f, rows, cols);
    else k_ew<F, 1><<<(unsigned)b, threads, 0, st->q.stream>>>(f, rows, cols);
    CK_LAUNCH("elementwise");
    (void)name;
}

/* ------------------------------------------------------------------ copy */
struct f_copy {
    dmat d, s;
    template <int V>
    __device__ __forceinline__ void run(int64_t r, int64_t c) const {
        float v[V];
        ldv<V>(s, r, c, v);
        stv<V>(d, r, c, v);
    }
};

/* Block shape and grid of the 16-byte-chunk kernels (copy, act_mul) for rows x cw chunks: bx (a multiple of 32,
 * <= 256) covers a row in as few 4-chunk passes as possible with the least idle threads; ~16 blocks per SM, rows
 * looped. */
static void chunk_grid(dtc_state *st, int64_t rows, int64_t cw, dim3 *grid, dim3 *block) {
    int64_t bx = 32;
    for (int64_t k = 1;; k++) {
        bx = ((cw + 4 * k - 1) / (4 * k) + 31) / 32 * 32;
        if (bx <= 256) break;
    }
    const int64_t by = 256 / bx, gx = (cw + bx * 4 - 1) / (bx * 4);
    int64_t gy = (rows + by - 1) / by, maxgy = ((int64_t)st->sm_count * 16 + gx - 1) / gx;
    if (maxgy < 1) maxgy = 1;
    if (gy > maxgy) gy = maxgy;
    if (gy > 65535) gy = 65535;
    *grid = dim3((unsigned)gx, (unsigned)gy);
    *block = dim3((unsigned)bx, (unsigned)by);
}

/* Same-dtype strided copy in 16-byte chunks: a block is bx x by threads, by rows at a time, each thread moving
 * 4 chunks of its row (all loads issued before the stores); no index division. cw = chunks per row. */
__global__ void k_copy16(uint4 *d, int64_t ldd, const uint4 *s, int64_t lds, int64_t rows, int64_t cw) {
    const int64_t c0 = (int64_t)blockIdx.x * blockDim.x * 4 + threadIdx.x;
    for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += (int64_t)gridDim.y * blockDim.y) {
        const uint4 *sr = s + r * lds;
        uint4 *dr = d + r * ldd;
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int64_t c = c0 + (int64_t)u * blockDim.x;
            if (c < cw) v[u] = __ldg(sr + c);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int64_t c = c0 + (int64_t)u * blockDim.x;
            if (c < cw) dr[c] = v[u];
        }
    }
}

void dtc_copy(dt_backend *be, dt_mat dst, dt_mat src) {
    DTC_REQUIRE(dst.rows == src.rows && dst.cols == src.cols, "copy: shape mismatch [%lld,%lld] <- [%lld,%lld]",
                (long long)dst.rows, (long long)dst.cols, (long long)src.rows, (long long)src.cols);
    req_float(dst, "copy", "dst");
    req_float(src, "copy", "src");
    dtc_state *st = dtc(be);
    if (dst.rows <= 0 || dst.cols <= 0) return;
    if (dst.dtype == src.dtype) {
        size_t es = dt_dtype_size(dst.dtype);
        if (dst.data == src.data && dst.ld == src.ld) return;
        const size_t rb = (size_t)dst.cols * es;
        if (dst.rows == 1 || (dst.ld == dst.cols && src.ld == src.cols)) {
            /* contiguous: one linear device-to-device copy (SM copy kernel, ~full bandwidth; cudaMemcpy2DAsync
             * runs these on a copy engine at less than half of it) */
            CK(cudaMemcpyAsync(dst.data, src.data, rb * (size_t)dst.rows, cudaMemcpyDeviceToDevice, st->q.stream));
            return;
        }
        if (rb % 16 == 0 && dtc_aligned16(dst.data) && dtc_aligned16(src.data) && ((size_t)dst.ld * es) % 16 == 0 &&
            ((size_t)src.ld * es) % 16 == 0) {
            const int64_t cw = (int64_t)(rb / 16);
            dim3 grid, block;
            chunk_grid(st, dst.rows, cw, &grid, &block);
            k_copy16<<<grid, block, 0, st->q.stream>>>(
                (uint4 *)dst.data, (int64_t)((size_t)dst.ld * es / 16), (const uint4 *)src.data,
                (int64_t)((size_t)src.ld * es / 16), dst.rows, cw);
            CK_LAUNCH("copy16");
            return;
        }
        CK(cudaMemcpy2DAsync(dst.data, (size_t)dst.ld * es, src.data, (size_t)src.ld * es, (size_t)dst.cols * es,
                             (size_t)dst.rows, cudaMemcpyDeviceToDevice, st->q.stream));
        return;
    }
    f_copy f{dtc_dm(dst), dtc_dm(src)};
    launch_ew(st, f, dst.rows, dst.cols, vec_ok(dst) && vec_ok(src), "copy");
}

/* ------------------------------------------------------------------ act_mul, mul, axpby, gated_add */
template <int ACT>
__device__ __forceinline__ float act_f(float x) {
    if (ACT == DT_ACT_SILU) return x / (1.f + __expf(-x));
    if (ACT == DT_ACT_GELU_TANH) {
        const float k0 = 0.7978845608028654f, k1 = 0.044715f;
        return 0.5f * x * (1.f + tanhf(k0 * (x + k1 * x * x * x)));
    }
    if (ACT == DT_ACT_GELU_ERF) return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
    return 1.f / (1.f + __expf(-x));
}

template <int ACT>
struct f_act_mul {
    dmat y, a, b;
    int has_b;
    template <int V>
    __device__ __forceinline__ void run(int64_t r, int64_t c) const {
        float va[V], vb[V];
        ldv<V>(a, r, c, va);
        if (has_b) ldv<V>(b, r, c, vb);
#pragma unroll
        for (int i = 0; i < V; i++) {
            float t = act_f<ACT>(va[i]);
            if (has_b) t = (y.isbf ? bfr(t) : t) * vb[i];  /* act rounded to bf16 first, as the reference */
            va[i] = t;
        }
        stv<V>(y, r, c, va);
    }
};

/* bf16 y = act(a) (· b): the layout of k_copy16 (a block of bx x by threads, each thread 4 chunks of 8 elements
 * of its row, every load issued before the math and the stores, no index division). lda/ldb/ldy in 16-byte
 * chunks; cw = chunks per row. The DiT's SwiGLU: 7% faster than the generic kernel (PERF.md, stop 12). */
template <int ACT, int HAS_B>
__global__ void k_act_mul16(uint4 *y, int64_t ldy, const uint4 *a, int64_t lda, const uint4 *b, int64_t ldb,
                            int64_t rows, int64_t cw) {
    const int64_t c0 = (int64_t)blockIdx.x * blockDim.x * 4 + threadIdx.x;
    for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += (int64_t)gridDim.y * blockDim.y) {
        uint4 va[4], vb[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t c = c0 + (int64_t)u * blockDim.x;
            if (c < cw) {
                va[u] = __ldg(a + r * lda + c);
                if (HAS_B) vb[u] = __ldg(b + r * ldb + c);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t c = c0 + (int64_t)u * blockDim.x;
            if (c >= cw) continue;
            float fa[8], fb[8];
            bf8_to_f(va[u], fa);
            if (HAS_B) bf8_to_f(vb[u], fb);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float t = act_f<ACT>(fa[i]);
                fa[i] = HAS_B ? bfr(t) * fb[i] : t;   /* act rounded to bf16 first, as the reference */
            }
            y[r * ldy + c] = f_to_bf8(fa);
        }
    }
}

/* The end of a row kernel that quantizes: the row's values held in registers (v: this thread's NORM_NV vectors of
 * 8, vector vi = threadIdx.x + j * blockDim.x for vi < nvec) as e4m3 codes into q [row r, ld], and the row's scale
 * into s[r]: the block's amax (amax: this thread's max |v|), codes of v * 448 / amax, scale amax / 448 (an all-zero
 * row: multiplier and scale 1). Every thread of the block calls it (block_max synchronizes). */
__device__ __forceinline__ void row_e4m3_store(float (&v)[NORM_NV][8], float amax, int64_t nvec, int64_t r, int64_t ld,
                                               uint8_t *q, float *s, float *sh) {
    amax = block_max(amax, sh);
    const float inv = amax > 0.f ? 448.f / amax : 1.f;
#pragma unroll
    for (int j = 0; j < NORM_NV; j++) {
        const int64_t vi = threadIdx.x + (int64_t)j * blockDim.x;
        if (vi < nvec) *(uint2 *)(q + r * ld + vi * 8) = e4m3x8(v[j], inv);
    }
    if (threadIdx.x == 0) s[r] = amax > 0.f ? amax / 448.f : 1.f;
}

/* One block per row of [lead | act(a) ⊙ b] (K = 8 * nvec columns, the first 8 * lv from lead): the row's bf16
 * values (act_mul's expression and rounding) kept in registers, their amax, then e4m3 codes q [rows, K] and the
 * row's scale s (dtc_act_e4m3). Pointers to bf16 rows of 16-byte vectors; ld in elements. */
template <int ACT, int HAS_B>
__global__ void k_act_e4m3(const __nv_bfloat16 *lead, int64_t ldl, int64_t lv, const __nv_bfloat16 *a, int64_t lda,
                           const __nv_bfloat16 *b, int64_t ldb, int64_t nvec, uint8_t *q, float *s) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    uint4 raw[NORM_NV], rawb[NORM_NV];
#pragma unroll
    for (int j = 0; j < NORM_NV; j++) {   /* every load before the math */
        const int64_t vi = threadIdx.x + (int64_t)j * blockDim.x;
        if (vi < lv) {
            raw[j] = __ldg((const uint4 *)(lead + r * ldl + vi * 8));
        } else if (vi < nvec) {
            raw[j] = __ldg((const uint4 *)(a + r * lda + (vi - lv) * 8));
            if (HAS_B) rawb[j] = __ldg((const uint4 *)(b + r * ldb + (vi - lv) * 8));
        }
    }
    float v[NORM_NV][8];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_NV; j++) {
        const int64_t vi = threadIdx.x + (int64_t)j * blockDim.x;
        if (vi >= nvec) continue;
        bf8_to_f(raw[j], v[j]);
        if (vi >= lv) {
            float fb[8];
            if (HAS_B) bf8_to_f(rawb[j], fb);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float t = act_f<ACT>(v[j][i]);
                v[j][i] = bfr(HAS_B ? bfr(t) * fb[i] : t);   /* as k_act_mul16 stores it */
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[j][i]));
    }
    row_e4m3_store(v, amax, nvec, r, nvec * 8, q, s, sh);
}

template <int ACT>
static void act_e4m3_t(dtc_state *st, dt_mat lead, dt_mat a, dt_mat b, uint8_t *q, float *s, int threads) {
    const int64_t lv = lead.cols / 8, nvec = lv + a.cols / 8;
    const __nv_bfloat16 *lp = (const __nv_bfloat16 *)lead.data;
    if (b.data)
        k_act_e4m3<ACT, 1><<<(unsigned)a.rows, threads, 0, st->q.stream>>>(lp, lead.ld, lv, (const __nv_bfloat16 *)a.data,
                                                                         a.ld, (const __nv_bfloat16 *)b.data, b.ld, nvec,
                                                                         q, s);
    else
        k_act_e4m3<ACT, 0><<<(unsigned)a.rows, threads, 0, st->q.stream>>>(lp, lead.ld, lv, (const __nv_bfloat16 *)a.data,
                                                                         a.ld, nullptr, 0, nvec, q, s);
}

int dtc_act_e4m3(dtc_state *st, dt_mat lead, dt_mat a, dt_mat b, dt_act act, uint8_t *q, float *s) {
    DTC_REQUIRE(!b.data || (b.rows == a.rows && b.cols == a.cols), "act_mul: a/b shape mismatch");
    DTC_REQUIRE(lead.cols == 0 || lead.rows == a.rows, "act_linear_gated: c has %lld rows, a %lld",
                (long long)lead.rows, (long long)a.rows);
    if (a.rows <= 0) return 0;
    int ok = dtc_vec8_ok(a) && (!b.data || dtc_vec8_ok(b)) && (lead.cols == 0 || dtc_vec8_ok(lead)) &&
             dtc_aligned16(q) && a.rows < 2147483647LL && a.cols > 0;
    int t = norm_threads(lead.cols + a.cols, &ok);
    if (!ok || t > 512) return -1;   /* longer rows: the two-op path */
    switch (act) {
    case DT_ACT_SILU: act_e4m3_t<DT_ACT_SILU>(st, lead, a, b, q, s, t); break;
    case DT_ACT_GELU_TANH: act_e4m3_t<DT_ACT_GELU_TANH>(st, lead, a, b, q, s, t); break;
    case DT_ACT_GELU_ERF: act_e4m3_t<DT_ACT_GELU_ERF>(st, lead, a, b, q, s, t); break;
    default: act_e4m3_t<DT_ACT_SIGMOID>(st, lead, a, b, q, s, t); break;
    }
    CK_LAUNCH("act_e4m3");
    return 0;
}

template <int ACT>
static void act_mul_t(dtc_state *st, dt_mat y, dt_mat a, dt_mat b) {
    const int has_b = b.data != nullptr;
    if (y.dtype == DT_BF16 && a.dtype == DT_BF16 && (!has_b || b.dtype == DT_BF16) && vec_ok(y) && vec_ok(a) &&
        vec_ok(b) && y.rows > 0 && y.cols > 0) {
        dim3 grid, block;
        const int64_t cw = y.cols / 8;
        chunk_grid(st, y.rows, cw, &grid, &block);
        if (has_b)
            k_act_mul16<ACT, 1><<<grid, block, 0, st->q.stream>>>((uint4 *)y.data, y.ld / 8, (const uint4 *)a.data,
                                                               a.ld / 8, (const uint4 *)b.data, b.ld / 8, y.rows, cw);
        else
            k_act_mul16<ACT, 0><<<grid, block, 0, st->q.stream>>>((uint4 *)y.data, y.ld / 8, (const uint4 *)a.data,
                                                               a.ld / 8, nullptr, 0, y.rows, cw);
        CK_LAUNCH("act_mul16");
        return;
    }
    f_act_mul<ACT> f{dtc_dm(y), dtc_dm(a), dtc_dm(b), has_b};
    launch_ew(st, f, y.rows, y.cols, vec_ok(y) && vec_ok(a) && vec_ok(b), "act_mul");
}

void dtc_act_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b, dt_act act) {
    DTC_REQUIRE(y.rows == a.rows && y.cols == a.cols, "act_mul: y/a shape mismatch");
    DTC_REQUIRE(!b.data || (b.rows == a.rows && b.cols == a.cols), "act_mul: b shape mismatch");
    req_float(y, "act_mul", "y"); req_float(a, "act_mul", "a"); req_float(b, "act_mul", "b");
    dtc_state *st = dtc(be);
    switch (act) {
    case DT_ACT_SILU: act_mul_t<DT_ACT_SILU>(st, y, a, b); break;
    case DT_ACT_GELU_TANH: act_mul_t<DT_ACT_GELU_TANH>(st, y, a, b); break;
    case DT_ACT_GELU_ERF: act_mul_t<DT_ACT_GELU_ERF>(st, y, a, b); break;
    case DT_ACT_SIGMOID: act_mul_t<DT_ACT_SIGMOID>(st, y, a, b); break;
    default: DTC_REQUIRE(0, "act_mul: unknown activation %d", (int)act);
    }
}

struct f_mul {
    dmat y, a, b;
    template <int V>
    __device__ __forceinline__ void run(int64_t r, int64_t c) const {
        float va[V], vb[V];
        ldv<V>(a, r, c, va);
        ldv<V>(b, r, c, vb);
#pragma unroll
        for (int i = 0; i < V; i++) va[i] *= vb[i];
        stv<V>(y, r, c, va);
    }
};

void dtc_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b) {
    DTC_REQUIRE(y.rows == a.rows && y.cols == a.cols && b.rows == a.rows && b.cols == a.cols, "mul: shape mismatch");
    req_float(y, "mul", "y"); req_float(a, "mul", "a"); req_float(b, "mul", "b");
    f_mul f{dtc_dm(y), dtc_dm(a), dtc_dm(b)};
    launch_ew(dtc(be), f, y.rows, y.cols, vec_ok(y) && vec_ok(a) && vec_ok(b), "mul");
}

struct f_axpby {
    dmat y, a, b;
    float alpha, beta;
    int has_b;
    template <int V>
    __device__ __forceinline__ void run(int64_t r, int64_t c) const {
        float va[V], vb[V];
        ldv<V>(a, r, c, va);
        if (has_b) ldv<V>(b, r, c, vb);
#pragma unroll
        for (int i = 0; i < V; i++) va[i] = has_b ? fmaf(alpha, va[i], beta * vb[i]) : alpha * va[i];
        stv<V>(y, r, c, va);
    }
};

void dtc_axpby(dt_backend *be, dt_mat y, float alpha, dt_mat a, float beta, dt_mat b) {
    DTC_REQUIRE(y.rows == a.rows && y.cols == a.cols, "axpby: y/a shape mismatch");
    DTC_REQUIRE(!b.data || (b.rows == a.rows && b.cols == a.cols), "axpby: b shape mismatch");
    req_float(y, "axpby", "y"); req_float(a, "axpby", "a"); req_float(b, "axpby", "b");
    f_axpby f{dtc_dm(y), dtc_dm(a), dtc_dm(b), alpha, beta, b.data != nullptr};
    launch_ew(dtc(be), f, y.rows, y.cols, vec_ok(y) && vec_ok(a) && vec_ok(b), "axpby");
}

/* flow_step (backend.h): the sampler's guidance + Euler update on F32 latents, each operation rounded to f32 in
 * dt_flow_guided's order (no contraction into FMAs: _rn intrinsics), so it equals the host loop bit for bit. */
struct f_flow_step {
    dmat x, v, u;
    float g, dt;
    int has_u, from_cond;
    template <int V>
    __device__ __forceinline__ void run(int64_t r, int64_t c) const {
        float vx[V], vv[V], vu[V];
        ldv<V>(x, r, c, vx);
        ldv<V>(v, r, c, vv);
        if (has_u) ldv<V>(u, r, c, vu);
#pragma unroll
        for (int i = 0; i < V; i++) {
            float w = vv[i];
            if (has_u) {
                const float s = __fmul_rn(g, __fsub_rn(vv[i], vu[i]));
                w = from_cond ? __fadd_rn(vv[i], s) : __fadd_rn(vu[i], s);
            }
            vx[i] = __fadd_rn(vx[i], __fmul_rn(dt, w));
        }
        stv<V>(x, r, c, vx);
    }
};

void dtc_flow_step(dt_backend *be, dt_mat x, dt_mat v, dt_mat u, float guidance, int from_cond, float dt) {
    DTC_REQUIRE(x.rows == v.rows && x.cols == v.cols && (!u.data || (u.rows == x.rows && u.cols == x.cols)),
                "flow_step: x/v/u shape mismatch");
    DTC_REQUIRE(x.dtype == DT_F32 && v.dtype == DT_F32 && (!u.data || u.dtype == DT_F32),
                "flow_step: the latents and velocities must be F32");
    f_flow_step f{dtc_dm(x), dtc_dm(v), dtc_dm(u), guidance, dt, u.data != nullptr, from_cond};
    launch_ew(dtc(be), f, x.rows, x.cols, vec_ok(x) && vec_ok(v) && vec_ok(u), "flow_step");
}

/* abs_diff_sums (backend.h) in two launches, deterministic for a given grid (no atomics): k_abs_diff_sums writes
 * each block's sums of |a − b| and |b| over its grid-stride share of rows x cols to part[block] (each thread sums in
 * double the values widened to f32, then to double, as the host reference does; then the block reduces), and
 * k_abs_diff_sums_final adds the blocks' sums in a fixed order into s[0], s[1]. */
#define ADS_THREADS 256
/* The block's sums of d and p (every thread's), valid in thread 0. */
__device__ __forceinline__ void ads_block_sum(double &d, double &p) {
    __shared__ double sh[2][ADS_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        d += __shfl_xor_sync(0xffffffffu, d, o);
        p += __shfl_xor_sync(0xffffffffu, p, o);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { sh[0][warp] = d; sh[1][warp] = p; }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < ADS_THREADS / 32; w++) { d += sh[0][w]; p += sh[1][w]; }
}

__global__ void k_abs_diff_sums(dmat a, dmat b, int64_t rows, int64_t cols, double2 *part) {
    double d = 0.0, p = 0.0;
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i - r * cols;
        const double va = (double)dm_get(a, r, c), vb = (double)dm_get(b, r, c);
        d += fabs(va - vb);
        p += fabs(vb);
    }
    ads_block_sum(d, p);
    if (threadIdx.x == 0) part[blockIdx.x] = make_double2(d, p);
}

__global__ void k_abs_diff_sums_final(const double2 *part, int nb, double *s) {
    double d = 0.0, p = 0.0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) { d += part[i].x; p += part[i].y; }
    ads_block_sum(d, p);
    if (threadIdx.x == 0) { s[0] = d; s[1] = p; }
}

void dtc_abs_diff_sums(dt_backend *be, dt_mat a, dt_mat b, double out[2]) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(a.rows == b.rows && a.cols == b.cols, "abs_diff_sums: a [%lld,%lld] and b [%lld,%lld] differ",
                (long long)a.rows, (long long)a.cols, (long long)b.rows, (long long)b.cols);
    DTC_REQUIRE(a.data && b.data, "abs_diff_sums: a and b must have data");
    req_float(a, "abs_diff_sums", "a"); req_float(b, "abs_diff_sums", "b");
    out[0] = out[1] = 0.0;
    if (a.rows <= 0 || a.cols <= 0) return;
    int64_t blocks = (a.rows * a.cols + ADS_THREADS - 1) / ADS_THREADS;
    if (blocks > (int64_t)st->sm_count * 8) blocks = (int64_t)st->sm_count * 8;
    /* scratch: the two sums, then the blocks' partial sums */
    double *s = (double *)dtc_scratch_get(st, &st->s_misc, (size_t)(1 + blocks) * sizeof(double2));
    double2 *part = (double2 *)s + 1;
    k_abs_diff_sums<<<(unsigned)blocks, ADS_THREADS, 0, st->q.stream>>>(dtc_dm(a), dtc_dm(b), a.rows, a.cols, part);
    CK_LAUNCH("abs_diff_sums");
    k_abs_diff_sums_final<<<1, ADS_THREADS, 0, st->q.stream>>>(part, (int)blocks, s);
    CK_LAUNCH("abs_diff_sums final");
    dtc_prefetch_join(st);
    CK(cudaMemcpyAsync(out, s, 2 * sizeof(double), cudaMemcpyDeviceToHost, st->q.stream));
    CK(cudaStreamSynchronize(st->q.stream));
}

struct f_gated_add {
    dmat x, g, y;
    int has_g;
    template <int V>
    __device__ __forceinline__ void run(int64_t r, int64_t c) const {
        float vx[V], vy[V], vg[V];
        ldv<V>(x, r, c, vx);
        ldv<V>(y, r, c, vy);
        if (has_g) ldv<V>(g, 0, c, vg);
#pragma unroll
        for (int i = 0; i < V; i++) {
            float t = vy[i];
            if (has_g) {
                t *= vg[i];
                if (x.isbf) t = bfr(t);  /* gate product rounded, then the residual add (reference order) */
            }
            vx[i] += t;
        }
        stv<V>(x, r, c, vx);
    }
};

void dtc_gated_add(dt_backend *be, dt_mat x, dt_mat gate, dt_mat y) {
    DTC_REQUIRE(x.rows == y.rows && x.cols == y.cols, "gated_add: x/y shape mismatch");
    DTC_REQUIRE(!gate.data || gate.cols == x.cols, "gated_add: gate has %lld columns, x %lld", (long long)gate.cols,
                (long long)x.cols);
    req_float(x, "gated_add", "x"); req_float(y, "gated_add", "y"); req_float(gate, "gated_add", "gate");
    f_gated_add f{dtc_dm(x), dtc_dm(gate), dtc_dm(y), gate.data != nullptr};
    launch_ew(dtc(be), f, x.rows, x.cols, vec_ok(x) && vec_ok(y) && vec_ok_row(gate), "gated_add");
}

/* ------------------------------------------------------------------ row norms */

/* y = LN(x) * (1 + scale) + shift, fp32 stats; vectorised path. F8: instead of y, the row's bf16 values as e4m3
 * codes q [rows, cols] (row stride cols) with one scale per row s (dtc_layernorm_mod_e4m3). */
template <int F8>
__global__ void k_layernorm_mod_vec(dmat y, dmat x, dmat shift, dmat scale, int has_shift, int has_scale,
                                    int64_t cols, float eps, uint8_t *q8, float *s8) {
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    int nvec = (int)(cols / 8);
    float v[NORM_NV][8];
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_NV; j++) {
        int vi = threadIdx.x + j * blockDim.x;
        if (vi < nvec) {
            ldv<8>(x, r, (int64_t)vi * 8, v[j]);
#pragma unroll
            for (int i = 0; i < 8; i++) s += v[j][i];
        }
    }
    float mean = block_sum(s, sh) / (float)cols;
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_NV; j++) {
        int vi = threadIdx.x + j * blockDim.x;
        if (vi < nvec) {
#pragma unroll
            for (int i = 0; i < 8; i++) { float d = v[j][i] - mean; q += d * d; }
        }
    }
    float rstd = rsqrtf(block_sum(q, sh) / (float)cols + eps);
    int rb = F8 || y.isbf;
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_NV; j++) {
        int vi = threadIdx.x + j * blockDim.x;
        if (vi < nvec) {
            float sc[8], sf[8];
            if (has_scale) ldv<8>(scale, 0, (int64_t)vi * 8, sc);
            if (has_shift) ldv<8>(shift, 0, (int64_t)vi * 8, sf);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float n = (v[j][i] - mean) * rstd;
                if (rb) n = bfr(n);
                if (has_scale) { float m1 = 1.f + sc[i]; if (rb) m1 = bfr(m1); n = n * m1; if (rb) n = bfr(n); }
                if (has_shift) n += sf[i];
                if (F8) { n = bfr(n); amax = fmaxf(amax, fabsf(n)); }   /* the bf16 value the unfused y holds */
                v[j][i] = n;
            }
            if (!F8) stv<8>(y, r, (int64_t)vi * 8, v[j]);
        }
    }
    if (F8) row_e4m3_store(v, amax, nvec, r, cols, q8, s8, sh);
}

/* Scalar fallback: any strides/dtypes; three passes over the row. */
__global__ void k_layernorm_mod_gen(dmat y, dmat x, dmat shift, dmat scale, int has_shift, int has_scale,
                                    int64_t cols, float eps) {
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    float s = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += dm_get(x, r, c);
    float mean = block_sum(s, sh) / (float)cols;
    float q = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) { float d = dm_get(x, r, c) - mean; q += d * d; }
    float rstd = rsqrtf(block_sum(q, sh) / (float)cols + eps);
    int rb = y.isbf;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float n = (dm_get(x, r, c) - mean) * rstd;
        if (rb) n = bfr(n);
        if (has_scale) { float m1 = 1.f + dm_get(scale, 0, c); if (rb) m1 = bfr(m1); n *= m1; if (rb) n = bfr(n); }
        if (has_shift) n += dm_get(shift, 0, c);
        dm_set(y, r, c, n);
    }
}

/* layernorm_mod's checks of x and its modulation vectors (both entry points). */
static void layernorm_mod_check(const dt_mat &x, const dt_mat &shift, const dt_mat &scale) {
    DTC_REQUIRE(!shift.data || shift.cols == x.cols, "layernorm_mod: shift has %lld columns, x %lld",
                (long long)shift.cols, (long long)x.cols);
    DTC_REQUIRE(!scale.data || scale.cols == x.cols, "layernorm_mod: scale has %lld columns, x %lld",
                (long long)scale.cols, (long long)x.cols);
    req_float(x, "layernorm_mod", "x");
    req_float(shift, "layernorm_mod", "shift"); req_float(scale, "layernorm_mod", "scale");
}

void dtc_layernorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps) {
    DTC_REQUIRE(y.rows == x.rows && y.cols == x.cols, "layernorm_mod: y/x shape mismatch");
    layernorm_mod_check(x, shift, scale);
    req_float(y, "layernorm_mod", "y");
    dtc_state *st = dtc(be);
    if (x.rows <= 0 || x.cols <= 0) return;
    int vec = vec_ok(x) && vec_ok(y) && vec_ok_row(shift) && vec_ok_row(scale);
    int threads = norm_threads(x.cols, &vec);
    DTC_REQUIRE(x.rows < 2147483647LL, "layernorm_mod: too many rows");
    if (vec)
        k_layernorm_mod_vec<0><<<(unsigned)x.rows, threads, 0, st->q.stream>>>(dtc_dm(y), dtc_dm(x), dtc_dm(shift),
                                                                            dtc_dm(scale), shift.data != nullptr,
                                                                            scale.data != nullptr, x.cols, eps,
                                                                            nullptr, nullptr);
    else
        k_layernorm_mod_gen<<<(unsigned)x.rows, 256, 0, st->q.stream>>>(dtc_dm(y), dtc_dm(x), dtc_dm(shift),
                                                                     dtc_dm(scale), shift.data != nullptr,
                                                                     scale.data != nullptr, x.cols, eps);
    CK_LAUNCH("layernorm_mod");
}

int dtc_layernorm_mod_e4m3(dtc_state *st, dt_mat x, dt_mat shift, dt_mat scale, float eps, uint8_t *q, float *s) {
    layernorm_mod_check(x, shift, scale);
    if (x.rows <= 0 || x.cols <= 0) return 0;
    int vec = vec_ok(x) && vec_ok_row(shift) && vec_ok_row(scale) && x.rows < 2147483647LL && dtc_aligned16(q);
    int threads = norm_threads(x.cols, &vec);
    if (!vec) return -1;
    dmat none = {nullptr, 0, 1};
    k_layernorm_mod_vec<1><<<(unsigned)x.rows, threads, 0, st->q.stream>>>(none, dtc_dm(x), dtc_dm(shift), dtc_dm(scale),
                                                                        shift.data != nullptr, scale.data != nullptr,
                                                                        x.cols, eps, q, s);
    CK_LAUNCH("layernorm_mod_e4m3");
    return 0;
}

/* y = x * rsqrt(mean(x^2) + eps) * (w + w_offset) (+ shift); w is an F32 param row (or absent = 1), shift a [1, D]
 * row (rmsnorm_mod; has_shift 0: none). With a shift the product is rounded to y's dtype first (the value rmsnorm
 * would store), then the shift added: rmsnorm + gated_add(y, shift, ones) in one pass. F8: instead of y, the row's
 * bf16 values as e4m3 codes q8 [rows, cols] (row stride cols) with one scale per row s8 (dtc_rmsnorm_mod_e4m3). */
template <int F8>
__global__ void k_rmsnorm_vec(dmat y, dmat x, const float *w, float woff, dmat shift, int has_shift, int64_t cols,
                              float eps, uint8_t *q8, float *s8) {
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    int nvec = (int)(cols / 8);
    float v[NORM_NV][8];
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_NV; j++) {
        int vi = threadIdx.x + j * blockDim.x;
        if (vi < nvec) {
            ldv<8>(x, r, (int64_t)vi * 8, v[j]);
#pragma unroll
            for (int i = 0; i < 8; i++) q += v[j][i] * v[j][i];
        }
    }
    float rr = rsqrtf(block_sum(q, sh) / (float)cols + eps);
    const int rb = F8 || y.isbf;
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_NV; j++) {
        int vi = threadIdx.x + j * blockDim.x;
        if (vi < nvec) {
            float sf[8];
            if (has_shift) ldv<8>(shift, 0, (int64_t)vi * 8, sf);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float m = w ? w[vi * 8 + i] + woff : 1.f;
                float n = v[j][i] * rr * m;
                if (has_shift) {
                    if (rb) n = bfr(n);
                    n += sf[i];
                }
                if (F8) { n = bfr(n); amax = fmaxf(amax, fabsf(n)); }   /* the bf16 value the unfused y holds */
                v[j][i] = n;
            }
            if (!F8) stv<8>(y, r, (int64_t)vi * 8, v[j]);
        }
    }
    if (F8) row_e4m3_store(v, amax, nvec, r, cols, q8, s8, sh);
}

__global__ void k_rmsnorm_gen(dmat y, dmat x, const float *w, float woff, dmat shift, int has_shift, int64_t cols,
                              float eps) {
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    float q = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) { float t = dm_get(x, r, c); q += t * t; }
    float rr = rsqrtf(block_sum(q, sh) / (float)cols + eps);
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float m = w ? w[c] + woff : 1.f;
        float n = dm_get(x, r, c) * rr * m;
        if (has_shift) {
            if (y.isbf) n = bfr(n);
            n += dm_get(shift, 0, c);
        }
        dm_set(y, r, c, n);
    }
}

/* The weight and shift rows of a norm of x (rmsnorm, rmsnorm_mod and its e4m3 form; NULL data: none). */
static void rmsnorm_check(dt_mat x, dt_mat w, dt_mat shift, const char *op) {
    DTC_REQUIRE(!w.data || (w.cols == x.cols && w.dtype == DT_F32), "%s: weight must be F32 [1, %lld]", op,
                (long long)x.cols);
    DTC_REQUIRE(!shift.data || shift.cols == x.cols, "%s: shift has %lld columns, x %lld", op, (long long)shift.cols,
                (long long)x.cols);
    req_float(x, op, "x"); req_float(shift, op, "shift");
}

/* rmsnorm and rmsnorm_mod (shift NULL data: none). */
static void rmsnorm_run(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, float w_offset, dt_mat shift, float eps,
                        const char *op) {
    DTC_REQUIRE(y.rows == x.rows && y.cols == x.cols, "%s: y/x shape mismatch", op);
    rmsnorm_check(x, w, shift, op);
    req_float(y, op, "y");
    dtc_state *st = dtc(be);
    if (x.rows <= 0 || x.cols <= 0) return;
    DTC_REQUIRE(x.rows < 2147483647LL, "%s: too many rows", op);
    int vec = vec_ok(x) && vec_ok(y) && vec_ok_row(shift);
    int threads = norm_threads(x.cols, &vec);
    if (vec)
        k_rmsnorm_vec<0><<<(unsigned)x.rows, threads, 0, st->q.stream>>>(dtc_dm(y), dtc_dm(x), (const float *)w.data,
                                                                      w_offset, dtc_dm(shift), shift.data != nullptr,
                                                                      x.cols, eps, nullptr, nullptr);
    else
        k_rmsnorm_gen<<<(unsigned)x.rows, 256, 0, st->q.stream>>>(dtc_dm(y), dtc_dm(x), (const float *)w.data,
                                                               w_offset, dtc_dm(shift), shift.data != nullptr, x.cols,
                                                               eps);
    CK_LAUNCH("rmsnorm");
}

void dtc_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, float w_offset, float eps) {
    rmsnorm_run(be, y, x, w, w_offset, dt_mat_null(), eps, "rmsnorm");
}

void dtc_rmsnorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, dt_mat shift, float eps) {
    rmsnorm_run(be, y, x, w, 0.f, shift, eps, "rmsnorm_mod");
}

int dtc_rmsnorm_mod_e4m3(dtc_state *st, dt_mat x, dt_mat w, dt_mat shift, float eps, uint8_t *q, float *s) {
    rmsnorm_check(x, w, shift, "rmsnorm_mod");
    if (x.rows <= 0 || x.cols <= 0) return 0;
    int vec = vec_ok(x) && vec_ok_row(shift) && x.rows < 2147483647LL && dtc_aligned16(q);
    int threads = norm_threads(x.cols, &vec);
    if (!vec) return -1;
    dmat none = {nullptr, 0, 1};
    k_rmsnorm_vec<1><<<(unsigned)x.rows, threads, 0, st->q.stream>>>(none, dtc_dm(x), (const float *)w.data, 0.f,
                                                                  dtc_dm(shift), shift.data != nullptr, x.cols, eps,
                                                                  q, s);
    CK_LAUNCH("rmsnorm_mod_e4m3");
    return 0;
}

/* ------------------------------------------------------------------ head_norm_rope */
/* RoPE of one pair. The element at position i gets y_i = x_i*cos_i -/+ partner*sin_i. FP32: fp32 math and
 * one rounding; otherwise cos/sin and both products are rounded to bf16 (the Qwen3 bf16 reference). */
template <int FP32>
__device__ __forceinline__ float rope_one(float xi, float xp, float c, float s, float sign) {
    if (FP32) return fmaf(xi, c, sign * xp * s);
    float t1 = bfr(xi * bfr(c)), t2 = bfr(xp * bfr(s));
    return sign > 0 ? t1 + t2 : t1 - t2;
}

/* Fast path: hd = 128, bf16 x. One warp per row: each lane owns 4 consecutive elements of a head, loads its
 * cos/sin/weight values once and walks the row's heads HNR_UNROLL at a time (loads first, then the math), so
 * the f32 tables are read once per row instead of once per head. */
#define HNR_UNROLL 4
#define HNR_ROWS 8   /* rows (warps) per block */
template <int FP32>
__device__ __forceinline__ uint2 hnr_one(uint2 u, int lane, bool has_w, float4 ww, float eps, int mode, float4 c,
                                         float4 s) {
    float v[4];
    {
        float2 a = __bfloat1622float2(*(__nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(__nv_bfloat162 *)&u.y);
        v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
    }
    if (has_w) {
        float q = v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
        float rr = rsqrtf(warp_sum(q) * (1.f / 128.f) + eps);
        v[0] = bfr(v[0] * rr * ww.x); v[1] = bfr(v[1] * rr * ww.y);
        v[2] = bfr(v[2] * rr * ww.z); v[3] = bfr(v[3] * rr * ww.w);
    }
    if (mode != DT_ROPE_NONE) {
        float o[4];
        if (mode == DT_ROPE_INTERLEAVED) {
            o[0] = rope_one<FP32>(v[0], v[1], c.x, s.x, -1.f);
            o[1] = rope_one<FP32>(v[1], v[0], c.y, s.y, +1.f);
            o[2] = rope_one<FP32>(v[2], v[3], c.z, s.z, -1.f);
            o[3] = rope_one<FP32>(v[3], v[2], c.w, s.w, +1.f);
        } else {  /* HALF: partner of i is i +/- 64, held by lane ^ 16 */
            float pv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) pv[i] = __shfl_xor_sync(0xffffffffu, v[i], 16);
            float sg = lane < 16 ? -1.f : 1.f;
            o[0] = rope_one<FP32>(v[0], pv[0], c.x, s.x, sg);
            o[1] = rope_one<FP32>(v[1], pv[1], c.y, s.y, sg);
            o[2] = rope_one<FP32>(v[2], pv[2], c.z, s.z, sg);
            o[3] = rope_one<FP32>(v[3], pv[3], c.w, s.w, sg);
        }
        v[0] = o[0]; v[1] = o[1]; v[2] = o[2]; v[3] = o[3];
    }
    __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
    uint2 out;
    out.x = *(uint32_t *)&a;
    out.y = *(uint32_t *)&b;
    return out;
}

template <int FP32>
__global__ void __launch_bounds__(HNR_ROWS * 32) k_head_norm_rope128(__nv_bfloat16 *x, int64_t ldx, int64_t rows,
                                                                    int heads, const float *w, float eps,
                                                                    const float *cosp, int64_t ldc, const float *sinp,
                                                                    int64_t lds, int mode) {
    const int64_t r = (int64_t)blockIdx.x * HNR_ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    float4 c = make_float4(0.f, 0.f, 0.f, 0.f), s = c, ww = c;
    if (mode != DT_ROPE_NONE) {
        c = *(const float4 *)(cosp + r * ldc + lane * 4);
        s = *(const float4 *)(sinp + r * lds + lane * 4);
    }
    if (w) ww = *(const float4 *)(w + lane * 4);
    __nv_bfloat16 *row = x + r * ldx + lane * 4;
    for (int h0 = 0; h0 < heads; h0 += HNR_UNROLL) {
        uint2 u[HNR_UNROLL];
#pragma unroll
        for (int j = 0; j < HNR_UNROLL; j++)
            if (h0 + j < heads) u[j] = *(const uint2 *)(row + (int64_t)(h0 + j) * 128);
#pragma unroll
        for (int j = 0; j < HNR_UNROLL; j++)
            if (h0 + j < heads) *(uint2 *)(row + (int64_t)(h0 + j) * 128) = hnr_one<FP32>(u[j], lane, w != nullptr, ww, eps, mode, c, s);
    }
}

/* Generic: any hd (even), any dtype; one warp per (row, head). */
template <int FP32>
__global__ void k_head_norm_rope_gen(dmat x, int64_t rows, int heads, int hd, const float *w, float eps, dmat cs,
                                     dmat sn, int mode) {
    int64_t wid = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (wid >= rows * heads) return;
    int64_t r = wid / heads;
    int64_t c0 = (wid - r * heads) * hd;
    float rr = 1.f;
    if (w) {
        float q = 0.f;
        for (int i = lane; i < hd; i += 32) { float t = dm_get(x, r, c0 + i); q += t * t; }
        rr = rsqrtf(warp_sum(q) / (float)hd + eps);
    }
    int rb = x.isbf;
#define NRM(i, val) (w ? (rb ? bfr((val) * rr * w[i]) : (val) * rr * w[i]) : (val))
    if (mode == DT_ROPE_NONE) {
        if (!w) return;
        for (int i = lane; i < hd; i += 32) dm_set(x, r, c0 + i, NRM(i, dm_get(x, r, c0 + i)));
        return;
    }
    int half = hd / 2;
    for (int p = lane; p < half; p += 32) {
        int i0, i1;
        if (mode == DT_ROPE_INTERLEAVED) { i0 = 2 * p; i1 = 2 * p + 1; }
        else { i0 = p; i1 = p + half; }
        float a = NRM(i0, dm_get(x, r, c0 + i0)), b = NRM(i1, dm_get(x, r, c0 + i1));
        float ya = rope_one<FP32>(a, b, dm_get(cs, r, i0), dm_get(sn, r, i0), -1.f);
        float yb = rope_one<FP32>(b, a, dm_get(cs, r, i1), dm_get(sn, r, i1), +1.f);
        dm_set(x, r, c0 + i0, ya);
        dm_set(x, r, c0 + i1, yb);
    }
#undef NRM
}

void dtc_head_norm_rope(dt_backend *be, dt_mat x, int heads, int hd, dt_mat w, float eps, dt_mat cos, dt_mat sin,
                        dt_rope_mode mode) {
    DTC_REQUIRE(heads > 0 && hd > 0 && (int64_t)heads * hd <= x.cols, "head_norm_rope: %d heads x %d > %lld columns",
                heads, hd, (long long)x.cols);
    DTC_REQUIRE(!w.data || (w.dtype == DT_F32 && w.cols == hd), "head_norm_rope: weight must be F32 [1, %d]", hd);
    req_float(x, "head_norm_rope", "x");
    if (mode != DT_ROPE_NONE) {
        DTC_REQUIRE(hd % 2 == 0, "head_norm_rope: odd head dim %d", hd);
        DTC_REQUIRE(cos.data && sin.data && cos.dtype == DT_F32 && sin.dtype == DT_F32 && cos.rows >= x.rows &&
                        sin.rows >= x.rows && cos.cols >= hd && sin.cols >= hd,
                    "head_norm_rope: cos/sin must be F32 [%lld, %d]", (long long)x.rows, hd);
    }
    dtc_state *st = dtc(be);
    if (x.rows <= 0) return;
    if (mode == DT_ROPE_NONE && !w.data) return;
    int fp32 = be->opts.rope_fp32 != 0;
    int64_t warps = x.rows * heads;
    unsigned blocks = dtc_blocks(warps * 32, 256);
    const unsigned row_blocks = (unsigned)((x.rows + HNR_ROWS - 1) / HNR_ROWS);
    int fast = hd == 128 && x.dtype == DT_BF16 && x.ld % 4 == 0 && ((uintptr_t)x.data & 7) == 0 &&
               (mode == DT_ROPE_NONE || (cos.ld % 4 == 0 && sin.ld % 4 == 0 && dtc_aligned16(cos.data) &&
                                         dtc_aligned16(sin.data))) &&
               (!w.data || dtc_aligned16(w.data));
    if (fast) {
        if (fp32)
            k_head_norm_rope128<1><<<row_blocks, HNR_ROWS * 32, 0, st->q.stream>>>((__nv_bfloat16 *)x.data, x.ld, x.rows, heads,
                                                                   (const float *)w.data, eps, (const float *)cos.data,
                                                                   cos.ld, (const float *)sin.data, sin.ld, mode);
        else
            k_head_norm_rope128<0><<<row_blocks, HNR_ROWS * 32, 0, st->q.stream>>>((__nv_bfloat16 *)x.data, x.ld, x.rows, heads,
                                                                   (const float *)w.data, eps, (const float *)cos.data,
                                                                   cos.ld, (const float *)sin.data, sin.ld, mode);
    } else {
        if (fp32)
            k_head_norm_rope_gen<1><<<blocks, 256, 0, st->q.stream>>>(dtc_dm(x), x.rows, heads, hd, (const float *)w.data,
                                                                    eps, dtc_dm(cos), dtc_dm(sin), mode);
        else
            k_head_norm_rope_gen<0><<<blocks, 256, 0, st->q.stream>>>(dtc_dm(x), x.rows, heads, hd, (const float *)w.data,
                                                                    eps, dtc_dm(cos), dtc_dm(sin), mode);
    }
    CK_LAUNCH("head_norm_rope");
}

/* ------------------------------------------------------------------ transpose */
__global__ void k_transpose(dmat y, dmat x, int64_t rows, int64_t cols) {
    __shared__ float t[32][33];
    int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int64_t r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) t[i][threadIdx.x] = dm_get(x, r, c);
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int64_t c = c0 + i, r = r0 + threadIdx.x;  /* y[c, r] = x[r, c] */
        if (r < rows && c < cols) dm_set(y, c, r, t[threadIdx.x][i]);
    }
}

void dtc_transpose(dt_backend *be, dt_mat y, dt_mat x) {
    DTC_REQUIRE(y.rows == x.cols && y.cols == x.rows, "transpose: y [%lld,%lld] is not x [%lld,%lld] transposed",
                (long long)y.rows, (long long)y.cols, (long long)x.rows, (long long)x.cols);
    req_float(y, "transpose", "y"); req_float(x, "transpose", "x");
    if (x.rows <= 0 || x.cols <= 0) return;
    DTC_REQUIRE((x.rows + 31) / 32 < 65536, "transpose: too many rows");
    dim3 grid((unsigned)((x.cols + 31) / 32), (unsigned)((x.rows + 31) / 32));
    k_transpose<<<grid, dim3(32, 8), 0, dtc(be)->q.stream>>>(dtc_dm(y), dtc_dm(x), x.rows, x.cols);
    CK_LAUNCH("transpose");
}

/* ------------------------------------------------------------------ helpers for upload and biases */
__global__ void k_to_bf16(__nv_bfloat16 *dst, const void *src, int t, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v;
        if (t == 0) v = ((const float *)src)[i];
        else if (t == 1) v = __half2float(((const __half *)src)[i]);
        else v = __bfloat162float(((const __nv_bfloat16 *)src)[i]);
        dst[i] = __float2bfloat16_rn(v);
    }
}

void dtc_convert_to_bf16(dtc_state *st, __nv_bfloat16 *dst, const void *src, dt_dtype t, int64_t n) {
    if (n <= 0) return;
    int code = t == DT_F32 ? 0 : t == DT_F16 ? 1 : 2;
    DTC_REQUIRE(t == DT_F32 || t == DT_F16 || t == DT_BF16, "convert: dtype %s", dt_dtype_name(t));
    int64_t b = (n + 255) / 256;
    if (b > (int64_t)st->sm_count * 32) b = (int64_t)st->sm_count * 32;
    k_to_bf16<<<(unsigned)b, 256, 0, st->q.stream>>>(dst, src, code, n);
    CK_LAUNCH("convert_to_bf16");
}

struct f_row_bias {
    dmat m;
    const __nv_bfloat16 *b;
    template <int V>
    __device__ __forceinline__ void run(int64_t r, int64_t c) const {
        float v[V];
        ldv<V>(m, r, c, v);
#pragma unroll
        for (int i = 0; i < V; i++) v[i] += __bfloat162float(b[c + i]);
        stv<V>(m, r, c, v);
    }
};
void dtc_add_row_bias(dtc_state *st, dt_mat m, const __nv_bfloat16 *bias) {
    f_row_bias f{dtc_dm(m), bias};
    launch_ew(st, f, m.rows, m.cols, vec_ok(m), "row_bias");
}

struct f_col_bias {
    dmat m;
    const float *b;
    template <int V>
    __device__ __forceinline__ void run(int64_t r, int64_t c) const {
        float v[V];
        ldv<V>(m, r, c, v);
        float bb = b[r];
#pragma unroll
        for (int i = 0; i < V; i++) v[i] += bb;
        stv<V>(m, r, c, v);
    }
};
void dtc_add_col_bias(dtc_state *st, dt_mat m, const float *bias) {
    f_col_bias f{dtc_dm(m), bias};
    launch_ew(st, f, m.rows, m.cols, vec_ok(m), "col_bias");
}

/* ------------------------------------------------------------------ preloading (see cuda_common.cuh) */
template <class F>
static void preload_ew() {
    dtc_preload_fn((const void *)k_ew<F, 1>);
    dtc_preload_fn((const void *)k_ew<F, 8>);
}
void dtc_preload_elementwise(dtc_state *st) {
    (void)st;
    preload_ew<f_copy>();
    preload_ew<f_act_mul<DT_ACT_SILU>>();
    preload_ew<f_act_mul<DT_ACT_GELU_TANH>>();
    preload_ew<f_act_mul<DT_ACT_GELU_ERF>>();
    preload_ew<f_act_mul<DT_ACT_SIGMOID>>();
    preload_ew<f_mul>();
    preload_ew<f_axpby>();
    preload_ew<f_gated_add>();
    preload_ew<f_row_bias>();
    preload_ew<f_col_bias>();
    dtc_preload_fn((const void *)k_copy16);
    dtc_preload_fn((const void *)k_abs_diff_sums);
    dtc_preload_fn((const void *)k_abs_diff_sums_final);
    dtc_preload_fn((const void *)k_act_mul16<DT_ACT_SILU, 1>);
    dtc_preload_fn((const void *)k_act_mul16<DT_ACT_GELU_TANH, 1>);
    dtc_preload_fn((const void *)k_act_mul16<DT_ACT_GELU_TANH, 0>);
    dtc_preload_fn((const void *)k_layernorm_mod_vec<0>);
    dtc_preload_fn((const void *)k_layernorm_mod_vec<1>);
    dtc_preload_fn((const void *)k_act_e4m3<DT_ACT_SILU, 1>);
    dtc_preload_fn((const void *)k_layernorm_mod_gen);
    dtc_preload_fn((const void *)k_rmsnorm_vec<0>);
    dtc_preload_fn((const void *)k_rmsnorm_vec<1>);
    dtc_preload_fn((const void *)k_rmsnorm_gen);
    dtc_preload_fn((const void *)k_head_norm_rope128<0>);
    dtc_preload_fn((const void *)k_head_norm_rope128<1>);
    dtc_preload_fn((const void *)k_head_norm_rope_gen<0>);
    dtc_preload_fn((const void *)k_head_norm_rope_gen<1>);
    dtc_preload_fn((const void *)k_transpose);
    dtc_preload_fn((const void *)k_to_bf16);
}
