/* cuda_attention.cu — scaled dot-product attention on the GPU.
 *
 * Head dim 128 (the DiT and Qwen3 case): a fused flash-style kernel (no Lq x Lk buffer). Each block owns
 * 16*NW query rows of one head (one warp per 16 rows, Q fragments kept in registers); K/V tiles of 64 keys
 * stream through shared memory with cp.async double buffering; S = Q·Kᵀ and O += P·V run on mma.sync
 * m16n8k16 bf16 tensor cores with fp32 accumulation; the softmax is online in fp32 (exp2 domain). GQA reads
 * the kv head h / (hq/hkv) directly. key_bias (additive, -inf = padding) and causal masks are applied per
 * tile; a row that sees no key outputs 0.
 *
 * Other head dims (16, 64, 512 for the VAE, ...) or unaligned views use a generic fallback: per head and
 * chunk of query rows, S = scale·Q·Kᵀ through cuBLASLt (f32), a row softmax kernel writes P (bf16), then
 * O = P·V through cuBLASLt. Correct for any shape; speed secondary. */
#include <math.h>
#include <stdlib.h>

#include "cuda_common.cuh"

#define FA_BC 64   /* keys per tile */
#define FA_HD 128

struct fa_args {
    const __nv_bfloat16 *q, *k, *v;
    __nv_bfloat16 *o;
    int64_t ldq, ldk, ldv, ldo;
    const float *kbias;
    int Lq, Lk, hq, group;  /* group = hq / hkv */
    float scale_log2;
    int causal;
};

/* smem address of 16-byte chunk c of row r in a [rows][128] bf16 tile (256-byte rows, XOR swizzle) */
__device__ __forceinline__ uint32_t fa_off(int r, int c) { return (uint32_t)(r * 256 + ((c ^ (r & 7)) << 4)); }

template <int NW>
__global__ void __launch_bounds__(NW * 32) k_flash128(fa_args a) {
    constexpr int BR = 16 * NW;
    constexpr int NT = NW * 32;
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *qs = smem;                          /* [BR][128] */
    unsigned char *ks = smem + BR * 256;               /* 2 x [64][128] */
    unsigned char *vs = ks + 2 * FA_BC * 256;          /* 2 x [64][128] */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qb = gridDim.x - 1 - blockIdx.x;         /* heavy (causal) blocks first */
    const int h = blockIdx.y;
    const int kvh = h / a.group;
    const int q0 = qb * BR;
    const __nv_bfloat16 *qg = a.q + (int64_t)h * FA_HD;
    const __nv_bfloat16 *kg = a.k + (int64_t)kvh * FA_HD;
    const __nv_bfloat16 *vg = a.v + (int64_t)kvh * FA_HD;

    int ntiles = (a.Lk + FA_BC - 1) / FA_BC;
    if (a.causal) {
        int lim = (q0 + BR + FA_BC - 1) / FA_BC;
        if (lim < ntiles) ntiles = lim;
    }

    /* Q tile */
    {
        uint32_t qa = smem_u32(qs);
#pragma unroll
        for (int i = 0; i < BR * 16 / NT; i++) {
            int id = tid + i * NT;
            int r = id >> 4, c = id & 15;
            int gr = q0 + r;
            const __nv_bfloat16 *src = qg + (int64_t)(gr < a.Lq ? gr : 0) * a.ldq + c * 8;
            cp_async16(qa + fa_off(r, c), src, gr < a.Lq ? 16 : 0);
        }
    }
    auto load_kv = [&](int stage, int t) {
        uint32_t ka = smem_u32(ks + stage * FA_BC * 256), va = smem_u32(vs + stage * FA_BC * 256);
        int kbase = t * FA_BC;
#pragma unroll
        for (int i = 0; i < FA_BC * 16 / NT; i++) {
            int id = tid + i * NT;
            int r = id >> 4, c = id & 15;
            int gk = kbase + r;
            int ok = gk < a.Lk;
            int64_t row = ok ? gk : 0;
            cp_async16(ka + fa_off(r, c), kg + row * a.ldk + c * 8, ok ? 16 : 0);
            cp_async16(va + fa_off(r, c), vg + row * a.ldv + c * 8, ok ? 16 : 0);
        }
    };
    if (ntiles > 0) load_kv(0, 0);
    cp_async_commit();

    float o[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[i][e] = 0.f;
    float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};
    uint32_t qf[8][4];

    const int g = lane >> 2, t4 = lane & 3;
    const int row0 = q0 + warp * 16 + g;               /* rows row0 and row0 + 8 */
    const float log2e = 1.4426950408889634f;

    for (int t = 0; t < ntiles; t++) {
        const int stage = t & 1;
        if (t + 1 < ntiles) load_kv(stage ^ 1, t + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (t == 0) {
            uint32_t qa = smem_u32(qs);
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                int r = warp * 16 + (lane & 15), c = kk * 2 + (lane >> 4);
                ldmatrix_x4(qa + fa_off(r, c), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
            }
        }
        /* S = Q Kᵀ  (16 x 64 per warp) */
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = 0.f;
        const uint32_t ka = smem_u32(ks + stage * FA_BC * 256);
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
#pragma unroll
            for (int np = 0; np < 4; np++) {
                int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                int c = kk * 2 + ((lane >> 3) & 1);
                uint32_t b0, b1, b2, b3;
                ldmatrix_x4(ka + fa_off(r, c), b0, b1, b2, b3);
                mma_bf16_16816(s[2 * np], qf[kk], b0, b1);
                mma_bf16_16816(s[2 * np + 1], qf[kk], b2, b3);
            }
        }
        /* scale, masks */
        const int kbase = t * FA_BC;
        const bool need_mask = (kbase + FA_BC > a.Lk) || (a.causal && kbase + FA_BC - 1 > q0) || a.kbias;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] *= a.scale_log2;
        if (need_mask) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int key = kbase + j * 8 + 2 * t4 + e;
                    float add = 0.f;
                    if (key >= a.Lk) add = -INFINITY;
                    else if (a.kbias) add = a.kbias[key] * log2e;
                    float v0 = s[j][e] + add, v1 = s[j][2 + e] + add;
                    if (a.causal) {
                        if (key > row0) v0 = -INFINITY;
                        if (key > row0 + 8) v1 = -INFINITY;
                    }
                    s[j][e] = v0;
                    s[j][2 + e] = v1;
                }
            }
        }
        /* online softmax for the thread's two rows */
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) mx = fmaxf(mx, fmaxf(s[j][2 * hh], s[j][2 * hh + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mnew = fmaxf(m_i[hh], mx);
            float muse = mnew == -INFINITY ? 0.f : mnew;
            float alpha = exp2f(m_i[hh] - muse);
            float rs = 0.f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float p0 = exp2f(s[j][2 * hh] - muse), p1 = exp2f(s[j][2 * hh + 1] - muse);
                s[j][2 * hh] = p0;
                s[j][2 * hh + 1] = p1;
                rs += p0 + p1;
            }
            l_i[hh] = l_i[hh] * alpha + rs;
            m_i[hh] = mnew;
#pragma unroll
            for (int d = 0; d < 16; d++) {
                o[d][2 * hh] *= alpha;
                o[d][2 * hh + 1] *= alpha;
            }
        }
        /* O += P V */
        const uint32_t va = smem_u32(vs + stage * FA_BC * 256);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t pa[4];
            pa[0] = pack_bf2(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = pack_bf2(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = pack_bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = pack_bf2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < 8; dp++) {
                int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                int c = dp * 2 + (lane >> 4);
                uint32_t b0, b1, b2, b3;
                ldmatrix_x4_trans(va + fa_off(r, c), b0, b1, b2, b3);
                mma_bf16_16816(o[2 * dp], pa, b0, b1);
                mma_bf16_16816(o[2 * dp + 1], pa, b2, b3);
            }
        }
        __syncthreads();  /* everyone done with this stage before it is refilled */
    }
    cp_async_wait<0>();

    /* normalise and store */
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        float l = l_i[hh];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = l > 0.f ? 1.f / l : 0.f;
        int row = row0 + hh * 8;
        if (row < a.Lq) {
            __nv_bfloat16 *op = a.o + (int64_t)row * a.ldo + (int64_t)h * FA_HD + 2 * t4;
#pragma unroll
            for (int d = 0; d < 16; d++)
                *(__nv_bfloat162 *)(op + d * 8) = __floats2bfloat162_rn(o[d][2 * hh] * inv, o[d][2 * hh + 1] * inv);
        }
    }
}

template <int NW>
static void flash_launch(dtc_state *st, const fa_args &a) {
    constexpr int BR = 16 * NW;
    const int smem = BR * 256 + 4 * FA_BC * 256;
    static bool attr = false;
    if (!attr) {
        CK(cudaFuncSetAttribute(k_flash128<NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr = true;
    }
    dim3 grid((unsigned)((a.Lq + BR - 1) / BR), (unsigned)a.hq);
    k_flash128<NW><<<grid, NW * 32, smem, st->stream>>>(a);
    CK_LAUNCH("flash_attention");
}

/* ------------------------------------------------------------------ generic fallback */
/* P[r, :] = softmax(S[r, :] + bias) with causal mask (query index q0 + r); S f32 [rows][lds], P bf16. */
__global__ void k_softmax_rows(const float *S, int64_t lds, __nv_bfloat16 *P, int64_t ldp, int Lk, const float *kbias,
                               int causal, int q0) {
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    const float *srow = S + r * lds;
    __nv_bfloat16 *prow = P + r * ldp;
    int qi = q0 + (int)r;
    auto val = [&](int j) -> float {
        float v = srow[j];
        if (kbias) v += kbias[j];
        if (causal && j > qi) v = -INFINITY;
        return v;
    };
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < Lk; j += blockDim.x) mx = fmaxf(mx, val(j));
    mx = warp_max(mx);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = mx;
    __syncthreads();
    {
        int nw = (blockDim.x + 31) >> 5;
        float t = (int)(threadIdx.x & 31) < nw ? sh[threadIdx.x & 31] : -INFINITY;
        mx = warp_max(t);
    }
    float muse = mx == -INFINITY ? 0.f : mx;
    float s = 0.f;
    for (int j = threadIdx.x; j < Lk; j += blockDim.x) s += __expf(val(j) - muse);
    s = block_sum(s, sh);
    float inv = s > 0.f ? 1.f / s : 0.f;
    for (int j = threadIdx.x; j < Lk; j += blockDim.x) prow[j] = __float2bfloat16_rn(__expf(val(j) - muse) * inv);
}

static void attention_generic(dtc_state *st, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd,
                              float scale, const float *kbias, int causal) {
    const int64_t Lq = q.rows, Lk = k.rows;
    const int64_t ldsp = (Lk + 7) / 8 * 8;
    int64_t qc = ((int64_t)1 << 26) / ldsp;  /* S chunk <= 256 MB */
    if (qc < 16) qc = 16;
    if (qc > Lq) qc = Lq;
    size_t sbytes = (size_t)qc * ldsp * 4, pbytes = (size_t)qc * ldsp * 2;
    char *buf = (char *)dtc_scratch_get(st, &st->s_attn, sbytes + pbytes + 256);
    float *S = (float *)buf;
    __nv_bfloat16 *P = (__nv_bfloat16 *)(buf + ((sbytes + 255) / 256) * 256);
    const int grp = hq / hkv;
    for (int h = 0; h < hq; h++) {
        const __nv_bfloat16 *Kh = (const __nv_bfloat16 *)k.data + (int64_t)(h / grp) * hd;
        const __nv_bfloat16 *Vh = (const __nv_bfloat16 *)v.data + (int64_t)(h / grp) * hd;
        for (int64_t c0 = 0; c0 < Lq; c0 += qc) {
            int64_t n = Lq - c0 < qc ? Lq - c0 : qc;
            const __nv_bfloat16 *Qc = (const __nv_bfloat16 *)q.data + c0 * q.ld + (int64_t)h * hd;
            /* S[n, Lk] = scale · Qc[n, hd] · Khᵀ  (column-major: Sᵀ[Lk, n] = Kh · Qcᵀ) */
            dtc_gemm(st, 1, 0, Lk, n, hd, Kh, k.ld, Qc, q.ld, S, ldsp, DT_F32, scale, nullptr);
            k_softmax_rows<<<(unsigned)n, 256, 0, st->stream>>>(S, ldsp, P, ldsp, (int)Lk, kbias, causal, (int)c0);
            CK_LAUNCH("softmax_rows");
            /* O[n, hd] = P[n, Lk] · Vh[Lk, hd]  (column-major: Oᵀ[hd, n] = Vhᵀ · Pᵀ) */
            void *Oc = (char *)o.data + (size_t)(c0 * o.ld + (int64_t)h * hd) * dt_dtype_size(o.dtype);
            dtc_gemm(st, 0, 0, hd, n, Lk, Vh, v.ld, P, ldsp, Oc, o.ld, o.dtype, 1.f, nullptr);
        }
    }
}

void dtc_attention(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale,
                   dt_mat key_bias, int causal) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(hq > 0 && hkv > 0 && hq % hkv == 0 && hd > 0, "attention: bad heads hq=%d hkv=%d hd=%d", hq, hkv, hd);
    DTC_REQUIRE(q.cols >= (int64_t)hq * hd && o.cols >= (int64_t)hq * hd && k.cols >= (int64_t)hkv * hd &&
                    v.cols >= (int64_t)hkv * hd,
                "attention: q/o need %d columns, k/v %d", hq * hd, hkv * hd);
    DTC_REQUIRE(o.rows == q.rows && k.rows == v.rows, "attention: o/q or k/v row counts differ");
    DTC_REQUIRE(q.dtype == DT_BF16 && k.dtype == DT_BF16 && v.dtype == DT_BF16,
                "attention: q/k/v must be BF16 (got %s/%s/%s)", dt_dtype_name(q.dtype), dt_dtype_name(k.dtype),
                dt_dtype_name(v.dtype));
    DTC_REQUIRE(o.dtype == DT_BF16 || o.dtype == DT_F32, "attention: o dtype %s", dt_dtype_name(o.dtype));
    DTC_REQUIRE(!key_bias.data || (key_bias.dtype == DT_F32 && key_bias.cols >= k.rows),
                "attention: key_bias must be F32 [1, %lld]", (long long)k.rows);
    if (q.rows <= 0) return;
    const float *kb = (const float *)key_bias.data;
    int fast = hd == FA_HD && o.dtype == DT_BF16 && q.ld % 8 == 0 && k.ld % 8 == 0 && v.ld % 8 == 0 &&
               o.ld % 2 == 0 && dtc_aligned16(q.data) && dtc_aligned16(k.data) && dtc_aligned16(v.data) &&
               ((uintptr_t)o.data & 3) == 0 && q.rows < (1LL << 30) && k.rows < (1LL << 30) && k.rows > 0;
    if (fast) {
        fa_args a;
        a.q = (const __nv_bfloat16 *)q.data;
        a.k = (const __nv_bfloat16 *)k.data;
        a.v = (const __nv_bfloat16 *)v.data;
        a.o = (__nv_bfloat16 *)o.data;
        a.ldq = q.ld; a.ldk = k.ld; a.ldv = v.ld; a.ldo = o.ld;
        a.kbias = kb;
        a.Lq = (int)q.rows;
        a.Lk = (int)k.rows;
        a.hq = hq;
        a.group = hq / hkv;
        a.scale_log2 = scale * 1.4426950408889634f;
        a.causal = causal;
        /* DITRUN_CUDA_FA_WARPS=8: 128-row blocks (benchmark knob; default 4 warps, 64 rows) */
        const char *nw = getenv("DITRUN_CUDA_FA_WARPS");
        if (nw && nw[0] == '8') flash_launch<8>(st, a);
        else flash_launch<4>(st, a);
        return;
    }
    if (k.rows <= 0) {  /* no keys: every row sees nothing -> 0 */
        for (int h = 0; h < hq; h++) {
            dt_mat oh = dt_mat_cols(o, (int64_t)h * hd, hd);
            CK(cudaMemset2DAsync(oh.data, (size_t)o.ld * dt_dtype_size(o.dtype), 0, (size_t)hd * dt_dtype_size(o.dtype),
                                 (size_t)o.rows, st->stream));
        }
        return;
    }
    attention_generic(st, o, q, k, v, hq, hkv, hd, scale, kb, causal);
}
