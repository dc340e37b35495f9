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
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_wgmma.cuh"

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

/* 2^x on the SFU, flushing denormal results to 0 (softmax probabilities below 2^-126 do not matter) */
__device__ __forceinline__ float fexp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

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
            float alpha = fexp2(m_i[hh] - muse);
            float rs = 0.f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float p0 = fexp2(s[j][2 * hh] - muse), p1 = fexp2(s[j][2 * hh + 1] - muse);
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
    k_flash128<NW><<<grid, NW * 32, smem, st->q.stream>>>(a);
    CK_LAUNCH("flash_attention");
}


/* ------------------------------------------------------------------ sm_90a: wgmma flash attention */
/* Two consumer warpgroups per block, 64 query rows each (BR = 128), key tiles of 128. All operands live in
 * shared memory in the 128-byte-swizzled K-major layout wgmma reads: a tile of R rows x 128 bf16 is stored
 * as two halves (columns 0-63, 64-127), each R rows of 128 bytes, 16-byte chunk c of row r at chunk
 * c ^ (r % 8). S = Q·Kᵀ: wgmma m64n128k16 with Q and K from shared memory; O += P·V: P from registers (the
 * S accumulator layout is the A-fragment layout), V from a per-call transposed copy Vt [hkv][128][Lk_pad]
 * so that it too is K-major. */

#define FW_BR 128
#define FW_BC 128

struct fw_args {
    const __nv_bfloat16 *q, *k, *vt;
    __nv_bfloat16 *o;
    int64_t ldq, ldk, ldvt, ldo;
    /* with a key bias (k_bias_tiles): kb2 = bias * log2(e), -inf past Lk, up to ldvt; tl = the key
     * tiles that are not entirely -inf, ascending, each entry tile * 2 + (1 if the tile needs its bias applied,
     * 0 if it is all zeros); *ntl their count. tl == NULL: every tile, no bias. */
    const float *kb2;
    const int *tl, *ntl;
    int Lq, Lk, hq, group;
    float scale_log2;
    int causal;
};


/* offset of 16-byte chunk c (0..15) of row r in a [R][128] bf16 tile stored as two 128B-swizzled halves */
__device__ __forceinline__ uint32_t fw_off(int r, int c, int half_bytes) {
    return (uint32_t)((c >> 3) * half_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* FA3-style warp specialisation: warpgroup 0 is a producer that streams Q and K/Vt tiles of 128 keys into a
 * 3-stage shared-memory ring with cp.async (fencing its own completed copies for the async proxy, then arriving
 * on the stage's "full" mbarrier); warpgroups 1 and 2 are consumers (64 query rows each) that wait on "full",
 * compute S = Q·Kᵀ, the online softmax (running max and sum per row, exp2 with the scale folded in) and
 * O += P·V, and arrive on the stage's "empty" mbarrier. With no block-wide barrier the two consumers drift apart, so one's softmax overlaps the other's
 * tensor-core work; "ping-pong" additionally alternates their S products with two named barriers (without it the
 * kernel measured 366-432 TFLOPS instead of 424-487 on the H200: PERF.md). Registers are rebalanced with setmaxnreg
 * (producer 24, consumers 240). */
#define F3_THREADS 384
#define F3_STAGES 3
#define F3_SMEM (1024 + 32768 + F3_STAGES * 65536 + 64)


__global__ void __launch_bounds__(F3_THREADS, 1) k_flash128_wg(fw_args a) {
#ifdef DTC_HAVE_WGMMA
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t qs = base;
    auto ks = [&](int st) { return base + 32768u + (uint32_t)st * 65536u; };
    auto vs = [&](int st) { return base + 65536u + (uint32_t)st * 65536u; };
    const uint32_t bars = base + 32768u + F3_STAGES * 65536u;
    auto full = [&](int st) { return bars + (uint32_t)st * 8u; };
    auto empty = [&](int st) { return bars + 32u + (uint32_t)st * 8u; };

    const int tid = threadIdx.x, wg = tid >> 7;
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, kvh = h / a.group;
    const int q0 = qb * FW_BR;
    /* the key tiles this block visits: all (no bias) or the listed ones (bias: fully masked tiles skipped), and
     * with a causal mask only those below lim */
    const int *tl = a.tl;
    const int lim = a.causal ? (q0 + FW_BR + FW_BC - 1) / FW_BC : 0x7fffffff;
    int ntiles;
    if (!tl) {
        ntiles = (a.Lk + FW_BC - 1) / FW_BC;
        if (ntiles > lim) ntiles = lim;
    } else {
        ntiles = *a.ntl;
        if (a.causal) {   /* first entry with tile >= lim (entries ascend) */
            int lo = 0, hi = ntiles;
            while (lo < hi) {
                int mid = (lo + hi) >> 1;
                if ((__ldg(tl + mid) >> 1) < lim) lo = mid + 1;
                else hi = mid;
            }
            ntiles = lo;
        }
    }
    if (tid == 0) {
        for (int st = 0; st < F3_STAGES; st++) {
            mbar_init(full(st), 128);
            mbar_init(empty(st), 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* ---------------- producer ---------------- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        const int pt = tid;
        const __nv_bfloat16 *qg = a.q + (int64_t)h * FA_HD;
        const __nv_bfloat16 *kg = a.k + (int64_t)kvh * FA_HD;
        const __nv_bfloat16 *vg = a.vt + (int64_t)kvh * FA_HD * a.ldvt;
        if (ntiles > 0) {
            for (int i = 0; i < 16; i++) {
                int id = pt + i * 128;
                int r = id >> 4, c = id & 15;
                int gr = q0 + r;
                cp_async16(qs + fw_off(r, c, 16384), qg + (int64_t)(gr < a.Lq ? gr : 0) * a.ldq + c * 8, gr < a.Lq ? 16 : 0);
            }
        }
        for (int t = 0; t < ntiles; t++) {
            const int st = t % F3_STAGES;
            if (t >= F3_STAGES) mbar_wait(empty(st), (uint32_t)(((t - F3_STAGES) / F3_STAGES) & 1));
            const int kb = (tl ? (__ldg(tl + t) >> 1) : t) * FW_BC;
            const uint32_t kd = ks(st), vd = vs(st);
            for (int i = 0; i < 16; i++) {
                int id = pt + i * 128;
                int r = id >> 4, c = id & 15;
                int gk = kb + r;
                cp_async16(kd + fw_off(r, c, 16384), kg + (int64_t)(gk < a.Lk ? gk : 0) * a.ldk + c * 8, gk < a.Lk ? 16 : 0);
                cp_async16(vd + fw_off(r, c, 16384), vg + (int64_t)r * a.ldvt + kb + c * 8, 16);
            }
            cp_async_commit();
            if (t >= 1) {
                cp_async_wait<1>();      /* tile t-1 (and Q) landed */
                fence_proxy_async();     /* make it visible to the tensor cores' async proxy */
                mbar_arrive(full((t - 1) % F3_STAGES));
            }
        }
        if (ntiles > 0) {
            cp_async_wait<0>();
            fence_proxy_async();
            mbar_arrive(full((ntiles - 1) % F3_STAGES));
        }
    } else {
        /* ---------------- consumers ---------------- */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
        const int cw = wg - 1;
        const int lane = tid & 31, wl = (tid >> 5) & 3;
        const int g = lane >> 2, t4 = lane & 3;
        const int row_a = q0 + cw * 64 + wl * 16 + g;
        float o[64];
#pragma unroll
        for (int i = 0; i < 64; i++) o[i] = 0.f;
        reg_fence(o, 64);
        float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};
        if (cw == 1 && ntiles > 0) named_bar_arrive(1, 256);
        for (int t = 0; t < ntiles; t++) {
            const int st = t % F3_STAGES;
            mbar_wait(full(st), (uint32_t)((t / F3_STAGES) & 1));
            named_bar_sync(cw == 0 ? 1 : 2, 256);
            float s[64];
#pragma unroll
            for (int i = 0; i < 64; i++) s[i] = 0.f;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                uint64_t da = wg_desc(qs + (uint32_t)((kk >> 2) * 16384 + cw * 8192 + (kk & 3) * 32));
                uint64_t db = wg_desc(ks(st) + (uint32_t)((kk >> 2) * 16384 + (kk & 3) * 32));
                wgmma_m64n128_ss(s, da, db, kk > 0);
            }
            wg_commit();
            {
                if (cw == 0) named_bar_arrive(2, 256);
                else if (t + 1 < ntiles) named_bar_arrive(1, 256);
            }
            wg_wait0();
            reg_fence(s, 64);

            const int te = tl ? __ldg(tl + t) : t * 2;
            const int kb = (te >> 1) * FW_BC;
            const bool need_mask = (kb + FW_BC > a.Lk) || (a.causal && kb + FW_BC - 1 > q0) || (te & 1);
#pragma unroll
            for (int i = 0; i < 64; i++) s[i] *= a.scale_log2;
            if (need_mask) {
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const int key0 = kb + j * 8 + 2 * t4;
                    float2 b2;
                    if (a.kb2) b2 = __ldg((const float2 *)(a.kb2 + key0));   /* -inf past Lk */
                    else b2 = make_float2(key0 < a.Lk ? 0.f : -INFINITY, key0 + 1 < a.Lk ? 0.f : -INFINITY);
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int key = key0 + e;
                        float add = e ? b2.y : b2.x;
                        float v0 = s[j * 4 + e] + add, v1 = s[j * 4 + 2 + e] + add;
                        if (a.causal) {
                            if (key > row_a) v0 = -INFINITY;
                            if (key > row_a + 8) v1 = -INFINITY;
                        }
                        s[j * 4 + e] = v0;
                        s[j * 4 + 2 + e] = v1;
                    }
                }
            }
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < 16; j++) mx = fmaxf(mx, fmaxf(s[j * 4 + 2 * hh], s[j * 4 + 2 * hh + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float mnew = fmaxf(m_i[hh], mx);
                float muse = mnew == -INFINITY ? 0.f : mnew;
                float alpha = fexp2(m_i[hh] - muse);
                float rs = 0.f;
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    float p0 = fexp2(s[j * 4 + 2 * hh] - muse), p1 = fexp2(s[j * 4 + 2 * hh + 1] - muse);
                    s[j * 4 + 2 * hh] = p0;
                    s[j * 4 + 2 * hh + 1] = p1;
                    rs += p0 + p1;
                }
                l_i[hh] = l_i[hh] * alpha + rs;
                m_i[hh] = mnew;
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    o[j * 4 + 2 * hh] *= alpha;
                    o[j * 4 + 2 * hh + 1] *= alpha;
                }
            }
            uint32_t pa[8][4];
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                pa[kk][0] = pack_bf2(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
                pa[kk][1] = pack_bf2(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
                pa[kk][2] = pack_bf2(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
                pa[kk][3] = pack_bf2(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
            }
            reg_fence(o, 64);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                uint64_t db = wg_desc(vs(st) + (uint32_t)((kk >> 2) * 16384 + (kk & 3) * 32));
                wgmma_m64n128_rs(o, pa[kk], db);
            }
            wg_commit();
            wg_wait0();
            reg_fence(o, 64);
            mbar_arrive(empty(st));
        }
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float l = l_i[hh];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            float inv = l > 0.f ? 1.f / l : 0.f;
            int row = row_a + hh * 8;
            if (row < a.Lq) {
                __nv_bfloat16 *op = a.o + (int64_t)row * a.ldo + (int64_t)h * FA_HD + 2 * t4;
#pragma unroll
                for (int j = 0; j < 16; j++)
                    *(__nv_bfloat162 *)(op + j * 8) =
                        __floats2bfloat162_rn(o[j * 4 + 2 * hh] * inv, o[j * 4 + 2 * hh + 1] * inv);
            }
        }
    }
#endif
}

/* Vt[kvh][d][key] = v[key][kvh*128 + d], keys >= Lk zero (up to ldvt). */
__global__ void k_transpose_v(__nv_bfloat16 *vt, int64_t ldvt, const __nv_bfloat16 *v, int64_t ldv, int Lk) {
    __shared__ __nv_bfloat16 t[32][34];
    const int kvh = blockIdx.z;
    const int k0 = blockIdx.x * 32, d0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int key = k0 + i;
        t[i][threadIdx.x] = key < Lk ? v[(int64_t)key * ldv + (int64_t)kvh * FA_HD + d0 + threadIdx.x] : __float2bfloat16_rn(0.f);
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int d = d0 + i;
        vt[((int64_t)kvh * FA_HD + d) * ldvt + k0 + threadIdx.x] = t[threadIdx.x][i];
    }
}

/* Key-bias preparation for the wgmma kernel (one block of 1024 threads, 8 tiles of 128 keys per round): kb2[key] =
 * bias[key] * log2(e) (-inf for keys >= Lk) for key < ntiles * 128, and the list of tiles that are not entirely
 * -inf, ascending, entry = tile * 2 + (tile has a nonzero bias). A padding mask thus costs nothing on its all-zero
 * tiles, and its fully masked tiles are never loaded. */
__global__ void __launch_bounds__(1024) k_bias_tiles(const float *kbias, int Lk, int ntiles, float *kb2, int *tl, int *ntl) {
    __shared__ int wz[32], wn[32];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int cnt = 0;   /* meaningful in thread 0 */
    for (int t0 = 0; t0 < ntiles; t0 += 8) {
        const int t = t0 + (tid >> 7);
        const int key = t * FW_BC + (tid & 127);
        float b = -INFINITY;
        if (key < Lk) b = kbias[key];
        if (t < ntiles) kb2[key] = b * 1.4426950408889634f;
        const int z = __all_sync(0xffffffffu, b == 0.f), n = __all_sync(0xffffffffu, b == -INFINITY);
        if (lane == 0) { wz[warp] = z; wn[warp] = n; }
        __syncthreads();
        if (tid == 0) {
            for (int i = 0; i < 8 && t0 + i < ntiles; i++) {
                int allz = wz[4 * i] & wz[4 * i + 1] & wz[4 * i + 2] & wz[4 * i + 3];
                int alln = wn[4 * i] & wn[4 * i + 1] & wn[4 * i + 2] & wn[4 * i + 3];
                if (!alln) tl[cnt++] = (t0 + i) * 2 + (allz ? 0 : 1);
            }
        }
        __syncthreads();
    }
    if (tid == 0) *ntl = cnt;
}

static void flash_wg_launch(dtc_state *st, const fa_args &a0, const __nv_bfloat16 *v, int64_t ldv, int hkv) {
    static bool attr = false;
    if (!attr) {  /* raise the kernel's shared-memory limit, once */
        CK(cudaFuncSetAttribute(k_flash128_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, F3_SMEM));
        attr = true;
    }
    const int64_t ldvt = (int64_t)(a0.Lk + FW_BC - 1) / FW_BC * FW_BC;
    __nv_bfloat16 *vt = (__nv_bfloat16 *)dtc_scratch_get(st, &st->s_vt, (size_t)hkv * FA_HD * ldvt * 2);
    dim3 tg((unsigned)(ldvt / 32), FA_HD / 32, (unsigned)hkv);
    k_transpose_v<<<tg, dim3(32, 8), 0, st->q.stream>>>(vt, ldvt, v, ldv, a0.Lk);
    CK_LAUNCH("transpose_v");
    fw_args a;
    a.q = a0.q; a.k = a0.k; a.vt = vt; a.o = a0.o;
    a.ldq = a0.ldq; a.ldk = a0.ldk; a.ldvt = ldvt; a.ldo = a0.ldo;
    a.kb2 = nullptr;
    a.tl = a.ntl = nullptr;
    a.Lq = a0.Lq; a.Lk = a0.Lk; a.hq = a0.hq; a.group = a0.group;
    a.scale_log2 = a0.scale_log2;
    a.causal = a0.causal;
    if (a0.kbias) {
        const int nt = (int)(ldvt / FW_BC);
        size_t kb_bytes = ((size_t)ldvt * 4 + 255) / 256 * 256;
        char *buf = (char *)dtc_scratch_get(st, &st->s_mask, kb_bytes + ((size_t)nt + 1) * 4);
        float *kb2 = (float *)buf;
        int *tl = (int *)(buf + kb_bytes);
        k_bias_tiles<<<1, 1024, 0, st->q.stream>>>(a0.kbias, a0.Lk, nt, kb2, tl, tl + nt);
        CK_LAUNCH("bias_tiles");
        a.kb2 = kb2;
        a.tl = tl;
        a.ntl = tl + nt;
    }
    dim3 grid((unsigned)((a.Lq + FW_BR - 1) / FW_BR), (unsigned)a.hq);
    k_flash128_wg<<<grid, F3_THREADS, F3_SMEM, st->q.stream>>>(a);
    CK_LAUNCH("flash_attention_wgmma");
}

__global__ void k_softmax_rows(const float *S, int64_t lds, __nv_bfloat16 *P, int64_t ldp, int Lk, const float *kbias,
                               int causal, int q0);

void dtc_preload_attention(dtc_state *st) {
    (void)st;
    dtc_preload_fn((const void *)k_flash128<4>);
    dtc_preload_fn((const void *)k_flash128_wg);
    dtc_preload_fn((const void *)k_transpose_v);
    dtc_preload_fn((const void *)k_bias_tiles);
    dtc_preload_fn((const void *)k_softmax_rows);
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
    /* S chunk <= 256 MB of f32: the P·V GEMM's output is [hd, chunk], so chunks of 1024 rows gave it only
     * (hd/128)·8 output tiles (32 for the VAE's single 512-wide head over 16384 tokens: a quarter of the SMs) */
    int64_t qc = ((int64_t)1 << 26) / ldsp;
    if (qc < 16) qc = 16;
    if (qc > Lq) qc = Lq;
    size_t sbytes = (size_t)qc * ldsp * 4, pbytes = (size_t)qc * ldsp * 2;
    const int tr = st->o.trace > 0;   /* host time of each step of the first chunk */
    double tt[5];
    tt[0] = dt_now();
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
            const int first = tr && h == 0 && c0 == 0;
            if (first) tt[1] = dt_now();
            dtc_gemm(st, 1, 0, Lk, n, hd, Kh, k.ld, Qc, q.ld, S, ldsp, DT_F32, scale, nullptr);
            if (first) tt[2] = dt_now();
            k_softmax_rows<<<(unsigned)n, 256, 0, st->q.stream>>>(S, ldsp, P, ldsp, (int)Lk, kbias, causal, (int)c0);
            CK_LAUNCH("softmax_rows");
            if (first) tt[3] = dt_now();
            /* O[n, hd] = P[n, Lk] · Vh[Lk, hd]  (column-major: Oᵀ[hd, n] = Vhᵀ · Pᵀ) */
            void *Oc = (char *)o.data + (size_t)(c0 * o.ld + (int64_t)h * hd) * dt_dtype_size(o.dtype);
            dtc_gemm(st, 0, 0, hd, n, Lk, Vh, v.ld, P, ldsp, Oc, o.ld, o.dtype, 1.f, nullptr);
            if (first) {
                tt[4] = dt_now();
                fprintf(stderr,
                        "ditrun: cuda trace:   generic attention (host ms, first chunk): scratch %.3f, S gemm %.3f, "
                        "softmax %.3f, PV gemm %.3f\n",
                        (tt[1] - tt[0]) * 1e3, (tt[2] - tt[1]) * 1e3, (tt[3] - tt[2]) * 1e3, (tt[4] - tt[3]) * 1e3);
            }
        }
    }
}

/* The shape and dtype preconditions both attention ops share (what names the op in the message). */
static void attention_check(const char *what, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd) {
    DTC_REQUIRE(hq > 0 && hkv > 0 && hq % hkv == 0 && hd > 0, "%s: bad heads hq=%d hkv=%d hd=%d", what, hq, hkv, hd);
    DTC_REQUIRE(q.cols >= (int64_t)hq * hd && o.cols >= (int64_t)hq * hd && k.cols >= (int64_t)hkv * hd &&
                    v.cols >= (int64_t)hkv * hd,
                "%s: q/o need %d columns, k/v %d", what, hq * hd, hkv * hd);
    DTC_REQUIRE(o.rows == q.rows && k.rows == v.rows, "%s: o/q or k/v row counts differ", what);
    DTC_REQUIRE(q.dtype == DT_BF16 && k.dtype == DT_BF16 && v.dtype == DT_BF16,
                "%s: q/k/v must be BF16 (got %s/%s/%s)", what, dt_dtype_name(q.dtype), dt_dtype_name(k.dtype),
                dt_dtype_name(v.dtype));
}

void dtc_attention(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale,
                   dt_mat key_bias, int causal) {
    dtc_state *st = dtc(be);
    attention_check("attention", o, q, k, v, hq, hkv, hd);
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
        /* o.attn (backend_cuda.h): AUTO = cuDNN's fused SDPA (cuda_cudnn.cu) where it measured faster (no key bias)
         * and loads, else ours; sm_90a paths (st->hopper): the wgmma kernel with ping-pong (fastest of ours measured on the H200: 424
         * TFLOPS at 24 heads x 4608 tokens, 487 at 16896; without ping-pong 366-432, the mma.sync kernel 280:
         * PERF.md), other GPUs, --kernels portable or o.attn = MMA: the mma.sync kernel */
        const dt_cuda_attn pick = st->o.attn;
        if (dtc_cudnn_attention(st, o, q, k, v, hq, hkv, scale, kb, causal, pick) == 0) return;
        if (st->hopper && pick != DT_CUDA_ATTN_MMA) {
            flash_wg_launch(st, a, (const __nv_bfloat16 *)v.data, v.ld, hkv);
            return;
        }
        flash_launch<4>(st, a);
        return;
    }
    if (k.rows <= 0) {  /* no keys: every row sees nothing -> 0 */
        for (int h = 0; h < hq; h++) {
            dt_mat oh = dt_mat_cols(o, (int64_t)h * hd, hd);
            CK(cudaMemset2DAsync(oh.data, (size_t)o.ld * dt_dtype_size(o.dtype), 0, (size_t)hd * dt_dtype_size(o.dtype),
                                 (size_t)o.rows, st->q.stream));
        }
        return;
    }
    attention_generic(st, o, q, k, v, hq, hkv, hd, scale, kb, causal);
}

/* fp8 attention (backend.h: attention_fp8) through cuDNN's fp8 flash attention; no kernel of ours computes the
 * same thing, so without cuDNN (or an fp8 engine for the shape) it is a clear error. */
void dtc_attention_fp8(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale) {
    dtc_state *st = dtc(be);
    attention_check("attention fp8", o, q, k, v, hq, hkv, hd);
    DTC_REQUIRE(o.dtype == DT_BF16, "attention fp8: o must be BF16 (got %s)", dt_dtype_name(o.dtype));
    if (q.rows <= 0) return;
    DTC_REQUIRE(k.rows > 0, "attention fp8: no keys");
    const char *why = "";
    if (dtc_cudnn_attention_fp8(st, o, q, k, v, hq, hkv, hd, scale, &why) == 0) return;
    DTC_REQUIRE(0, "attention fp8 (--attn-precision fp8; Lq=%lld Lk=%lld, %d/%d heads x %d): cuDNN cannot run it: %s",
                (long long)q.rows, (long long)k.rows, hq, hkv, hd, why);
}
