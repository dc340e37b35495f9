/* cuda_qmm.cu — the fused 4/8-bit GEMM ("qmm", qpath fused; the auto path's choice at <= 64 rows): packed tiles
 * loaded into shared memory (cp.async, 3 stages), dequantized into a bf16 shared tile inside the main loop, and
 * multiplied with mma.sync m16n8k16 (fp32 accumulation); split-K over the reduction for small grids. Measured
 * 2.2-5x slower than dequantize + cuBLASLt at >= 256 rows (PERF.md), so it serves mat-vec-like sizes. */
#include "cuda_linear.cuh"

/* y[M,N] = x[M,K] · dequant(W)[N,K]ᵀ. Block tile BM x 128 x 64, 4 warps (WARPS_M x WARPS_N), 3-stage cp.async
 * pipeline for x tiles, packed weight tiles and (scale, bias) pairs; each k-tile is dequantized into one bf16
 * shared tile (swizzled 16-byte chunks) and consumed by ldmatrix + mma.sync. */
#define QMM_BN 128
#define QMM_BK 64
#define QMM_STAGES 3
#define QMM_THREADS 128

template <int BITS, int BM>
struct qmm_smem {
    static constexpr int XS = BM * QMM_BK * 2;                 /* bytes of one x stage */
    static constexpr int QS = QMM_BN * QMM_BK * BITS / 8;      /* bytes of one packed stage */
    static constexpr int SS = QMM_BN * 2 * 8;                  /* bytes of one (scale,bias) stage: 2 groups max */
    static constexpr int WS = QMM_BN * QMM_BK * 2;             /* dequantized tile */
    static constexpr int TOTAL = QMM_STAGES * (XS + QS + SS) + WS;
};

struct qmm_args {
    const __nv_bfloat16 *x;
    int64_t ldx;
    const uint32_t *qw;
    const float2 *sb;
    const __nv_bfloat16 *bias;
    void *y;
    int64_t ldy;
    int ybf;
    float *part;  /* split-K partials [splits][M][N] or NULL */
    int M, N, K, group, tiles_per_split;
};

template <int BITS, int BM, int WARPS_M, int WARPS_N>
__global__ void __launch_bounds__(QMM_THREADS) k_qmm(qmm_args a) {
    typedef qmm_smem<BITS, BM> S;
    constexpr int WTM = BM / WARPS_M, WTN = QMM_BN / WARPS_N;
    constexpr int MT = WTM / 16, NT = WTN / 8;
    constexpr int QW = QMM_BK * BITS / 32;       /* packed words per row per tile: 8 or 16 */
    constexpr int QCH = QW / 4;                   /* 16-byte chunks per row: 2 or 4 */
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *xs_base = smem;
    unsigned char *qs_base = smem + QMM_STAGES * S::XS;
    unsigned char *ss_base = qs_base + QMM_STAGES * S::QS;
    __nv_bfloat16 *ws = (__nv_bfloat16 *)(ss_base + QMM_STAGES * S::SS);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int n0 = blockIdx.x * QMM_BN, m0 = blockIdx.y * BM;
    const int ktiles = a.K / QMM_BK;
    const int kt0 = blockIdx.z * a.tiles_per_split;
    int kt1 = kt0 + a.tiles_per_split;
    if (kt1 > ktiles) kt1 = ktiles;
    const int nkt = kt1 - kt0;
    const int ng_row = a.K / a.group;            /* groups per weight row */
    const int ng_tile = a.group < QMM_BK ? QMM_BK / a.group : 1;  /* groups touched by one tile: 1 or 2 */
    const int64_t wrow_words = (int64_t)a.K * BITS / 32;

    auto load_stage = [&](int stage, int kt) {
        const int k0 = kt * QMM_BK;
        uint32_t xs = smem_u32(xs_base + stage * S::XS);
#pragma unroll
        for (int i = 0; i < (BM * 8 + QMM_THREADS - 1) / QMM_THREADS; i++) {
            int id = tid + i * QMM_THREADS;
            if (id < BM * 8) {
                int r = id >> 3, c = id & 7;
                int gm = m0 + r;
                const __nv_bfloat16 *src = a.x + (int64_t)(gm < a.M ? gm : 0) * a.ldx + k0 + c * 8;
                cp_async16(xs + (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)), src, gm < a.M ? 16 : 0);
            }
        }
        uint32_t qs = smem_u32(qs_base + stage * S::QS);
#pragma unroll
        for (int i = 0; i < QMM_BN * QCH / QMM_THREADS; i++) {
            int id = tid + i * QMM_THREADS;
            int r = id / QCH, c = id % QCH;
            int gn = n0 + r;
            const uint32_t *src = a.qw + (int64_t)(gn < a.N ? gn : 0) * wrow_words + (int64_t)k0 * BITS / 32 + c * 4;
            cp_async16(qs + (uint32_t)(r * QW * 4 + c * 16), src, gn < a.N ? 16 : 0);
        }
        uint32_t ss = smem_u32(ss_base + stage * S::SS);
        const int g0 = k0 / a.group;
        for (int id = tid; id < QMM_BN * ng_tile; id += QMM_THREADS) {
            int r = id / ng_tile, j = id % ng_tile;
            int gn = n0 + r;
            const float2 *src = a.sb + (int64_t)(gn < a.N ? gn : 0) * ng_row + g0 + j;
            cp_async8(ss + (uint32_t)((r * 2 + j) * 8), src, gn < a.N ? 8 : 0);
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

#pragma unroll
    for (int s = 0; s < QMM_STAGES - 1; s++) {
        if (s < nkt) load_stage(s, kt0 + s);
        cp_async_commit();
    }

    for (int it = 0; it < nkt; it++) {
        const int stage = it % QMM_STAGES;
        cp_async_wait<QMM_STAGES - 2>();
        __syncthreads();  /* stage `it` landed; every warp finished the previous MMA on ws */
        {
            int nx = it + QMM_STAGES - 1;
            if (nx < nkt) load_stage(nx % QMM_STAGES, kt0 + nx);
            cp_async_commit();
        }
        /* dequantize the packed tile into ws [128][64] bf16 */
        {
            const uint32_t *qs = (const uint32_t *)(qs_base + stage * S::QS);
            const float2 *ss = (const float2 *)(ss_base + stage * S::SS);
            const int k0 = (kt0 + it) * QMM_BK;
#pragma unroll
            for (int i = 0; i < QMM_BN * 8 / QMM_THREADS; i++) {
                int id = tid + i * QMM_THREADS;
                int r = id >> 3, c = id & 7;
                int gj = ng_tile == 1 ? 0 : ((c * 8) / a.group);
                (void)k0;
                float2 s = ss[r * 2 + gj];
                float f[8];
                if (BITS == 4) {
                    uint32_t q = qs[r * QW + c];
#pragma unroll
                    for (int j = 0; j < 8; j++) f[j] = fmaf(s.x, u2f((q >> (4 * j)) & 15u), s.y);
                } else {
                    uint2 q = *(const uint2 *)(qs + r * QW + c * 2);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        f[j] = fmaf(s.x, u2f((q.x >> (8 * j)) & 255u), s.y);
                        f[4 + j] = fmaf(s.x, u2f((q.y >> (8 * j)) & 255u), s.y);
                    }
                }
                *(uint4 *)(ws + r * 64 + ((c ^ (r & 7)) << 3)) = f_to_bf8(f);
            }
        }
        __syncthreads();
        const uint32_t xs = smem_u32(xs_base + stage * S::XS);
        const uint32_t wsa = smem_u32(ws);
#pragma unroll
        for (int ks = 0; ks < QMM_BK / 16; ks++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int r = wm * WTM + mt * 16 + (lane & 15);
                int c = ks * 2 + (lane >> 4);
                ldmatrix_x4(xs + (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)), af[mt][0], af[mt][1], af[mt][2],
                            af[mt][3]);
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                int r = wn * WTN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                int c = ks * 2 + ((lane >> 3) & 1);
                uint32_t b0, b1, b2, b3;
                ldmatrix_x4(wsa + (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16_16816(acc[mt][2 * np], af[mt], b0, b1);
                    mma_bf16_16816(acc[mt][2 * np + 1], af[mt], b2, b3);
                }
            }
        }
    }
    cp_async_wait<0>();

    /* epilogue */
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int col = n0 + wn * WTN + nt * 8 + 2 * t4;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int row = m0 + wm * WTM + mt * 16 + g + hh * 8;
                if (row >= a.M) continue;
                float v0 = acc[mt][nt][2 * hh], v1 = acc[mt][nt][2 * hh + 1];
                if (a.part) {
                    float *p = a.part + ((int64_t)blockIdx.z * a.M + row) * a.N;
                    if (col < a.N) p[col] = v0;
                    if (col + 1 < a.N) p[col + 1] = v1;
                    continue;
                }
                if (a.bias) {
                    if (col < a.N) v0 += __bfloat162float(a.bias[col]);
                    if (col + 1 < a.N) v1 += __bfloat162float(a.bias[col + 1]);
                }
                if (a.ybf) {
                    __nv_bfloat16 *p = (__nv_bfloat16 *)a.y + (int64_t)row * a.ldy + col;
                    if (col + 1 < a.N && ((((uintptr_t)p) & 3) == 0)) {
                        *(__nv_bfloat162 *)p = __floats2bfloat162_rn(v0, v1);
                    } else {
                        if (col < a.N) p[0] = __float2bfloat16_rn(v0);
                        if (col + 1 < a.N) p[1] = __float2bfloat16_rn(v1);
                    }
                } else {
                    float *p = (float *)a.y + (int64_t)row * a.ldy + col;
                    if (col < a.N) p[0] = v0;
                    if (col + 1 < a.N) p[1] = v1;
                }
            }
        }
    }
}

__global__ void k_splitk_reduce(const float *part, int splits, int M, int N, const __nv_bfloat16 *bias, dmat y) {
    int64_t total = (int64_t)M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int z = 0; z < splits; z++) s += part[(int64_t)z * total + i];
        int64_t r = i / N, c = i - r * N;
        if (bias) s += __bfloat162float(bias[c]);
        dm_set(y, r, c, s);
    }
}

template <int BITS, int BM, int WM, int WN>
static void qmm_launch(dtc_state *st, const qmm_args &a0, int splits) {
    qmm_args a = a0;
    typedef qmm_smem<BITS, BM> S;
    static bool attr_set = false;  /* per instantiation */
    if (!attr_set) {
        CK(cudaFuncSetAttribute(k_qmm<BITS, BM, WM, WN>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::TOTAL));
        attr_set = true;
    }
    int ktiles = a.K / QMM_BK;
    a.tiles_per_split = (ktiles + splits - 1) / splits;
    dim3 grid((unsigned)((a.N + QMM_BN - 1) / QMM_BN), (unsigned)((a.M + BM - 1) / BM), (unsigned)splits);
    k_qmm<BITS, BM, WM, WN><<<grid, QMM_THREADS, S::TOTAL, st->q.stream>>>(a);
    CK_LAUNCH("qmm");
}

template <int BITS>
static void qmm_dispatch(dtc_state *st, const qmm_args &a, int splits) {
    if (a.M <= 16) qmm_launch<BITS, 16, 1, 4>(st, a, splits);
    else if (a.M <= 32) qmm_launch<BITS, 32, 2, 2>(st, a, splits);
    else qmm_launch<BITS, 64, 2, 2>(st, a, splits);
}

int dtc_qmm_linear(dtc_state *st, dt_mat y, dt_mat x, const dt_linear *w) {
    const int ok = w->in % QMM_BK == 0 && w->group >= 32 && x.ld % 8 == 0 && dtc_aligned16(x.data) &&
                   x.rows < (1LL << 30) && w->out < (1LL << 30);
    if (!ok) return -1;
    qmm_args a;
    a.x = (const __nv_bfloat16 *)x.data;
    a.ldx = x.ld;
    a.qw = w->qw;
    a.sb = w->sb;
    a.bias = w->bias;
    a.y = y.data;
    a.ldy = y.ld;
    a.ybf = y.dtype == DT_BF16;
    a.part = nullptr;
    a.M = (int)x.rows;
    a.N = (int)w->out;
    a.K = (int)w->in;
    a.group = w->group;
    int bm = a.M <= 16 ? 16 : a.M <= 32 ? 32 : 64;
    int64_t blocks = (int64_t)((a.N + QMM_BN - 1) / QMM_BN) * ((a.M + bm - 1) / bm);
    int ktiles = a.K / QMM_BK;
    int splits = 1;
    int64_t target = (int64_t)st->sm_count * 2;
    if (blocks < target) {
        splits = (int)((target + blocks - 1) / blocks);
        int maxs = ktiles / 4 > 0 ? ktiles / 4 : 1;  /* at least 4 k-tiles (256 columns) per split */
        if (splits > maxs) splits = maxs;
        if (splits > 32) splits = 32;
        if (splits < 1) splits = 1;
        int per = (ktiles + splits - 1) / splits;
        splits = (ktiles + per - 1) / per;
    }
    if (splits > 1) {
        a.part = (float *)dtc_scratch_get(st, &st->q.s_split, (size_t)splits * a.M * a.N * sizeof(float));
    }
    if (w->bits == 4) qmm_dispatch<4>(st, a, splits);
    else qmm_dispatch<8>(st, a, splits);
    if (splits > 1) {
        int64_t total = (int64_t)a.M * a.N;
        int64_t b = (total + 255) / 256;
        if (b > (int64_t)st->sm_count * 16) b = (int64_t)st->sm_count * 16;
        k_splitk_reduce<<<(unsigned)b, 256, 0, st->q.stream>>>(a.part, splits, a.M, a.N, w->bias, dtc_dm(y));
        CK_LAUNCH("splitk_reduce");
    }
    return 0;
}

/* ------------------------------------------------------------------ preloading (see cuda_common.cuh) */
template <int BITS, int BM, int WM, int WN>
static void preload_qmm() {
    dtc_preload_fn((const void *)k_qmm<BITS, BM, WM, WN>);
    cudaFuncSetAttribute(k_qmm<BITS, BM, WM, WN>, cudaFuncAttributeMaxDynamicSharedMemorySize, qmm_smem<BITS, BM>::TOTAL);
    cudaGetLastError();
}
void dtc_preload_qmm(dtc_state *st) {
    (void)st;
    preload_qmm<4, 16, 1, 4>();
    preload_qmm<4, 32, 2, 2>();
    preload_qmm<4, 64, 2, 2>();
    preload_qmm<8, 16, 1, 4>();
    preload_qmm<8, 32, 2, 2>();
    preload_qmm<8, 64, 2, 2>();
    dtc_preload_fn((const void *)k_splitk_reduce);
}
