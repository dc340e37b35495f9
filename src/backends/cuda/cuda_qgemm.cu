/* cuda_qgemm.cu — mixed-input GEMM for 4-bit / 8-bit weights on Hopper (sm_90a): y = x · dequant(W)ᵀ with the
 * weights dequantized in registers inside the GEMM, never written out as bf16.
 *
 * The product is computed transposed, yᵀ[N, M] = W[N, K] · xᵀ, so that the quantized weights are wgmma's A
 * operand, the one that may come from registers: each consumer thread reads its packed A fragment from shared
 * memory, dequantizes it (scale·q + bias in f32, rounded to bf16 — the transient path's numbers) and feeds the
 * tensor cores; x tiles are B, loaded by TMA into the 128-byte-swizzled K-major layout wgmma reads.
 *
 * Weights are re-laid once at load ("fragment order", dtc_qgemm_pack): for each block of 128 rows and each
 * 64-column slab, one contiguous chunk in which consumer thread t of warpgroup g finds its 16 (4-bit) or 32 (8-bit)
 * bytes for the slab's four k16 steps; (scale, bias) pairs as [N/128][K/group][128]. Same bytes as the MLX
 * layout, so the packed model's memory is unchanged.
 *
 * Block: 384 threads = a producer warpgroup (one thread issues TMA for x and bulk copies for the packed weights
 * and their scales into a STAGES-deep ring, "full"/"empty" mbarriers) and two consumer warpgroups of 64 weight
 * rows each; tile 128 weight rows x NT (192 or 128) tokens. Epilogue: + bias[n], · gate[n], + y (accumulate),
 * bf16 or f32.
 *
 * (A variant that dequantized in a warpgroup of its own into a shared-memory A tile, consumers running
 * shared-memory wgmmas like a dense GEMM, measured slower: 517-524 TFLOPS, converter-bound; PERF.md, stop 11.)
 *
 * Measured on the H200 (PERF.md, stop 11): 600-640 TFLOPS at the klein-4B shapes, against 770-790 for the
 * transient path (dequantize pass + cuBLASLt); the dequantization in the main loop is not hidden behind the
 * tensor cores (the same kernel without the dequantization math ran at 690-730). So the mixed path saves memory (no bf16
 * copy of any weight, 0.6 GB less peak at 1024²), not time (forward 66.5 vs 57.7 ms). */
#include <cuda.h>
#include <dlfcn.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_wgmma.cuh"

#define QG_ROWS 128        /* weight rows per block (two consumer warpgroups x 64) */
#define QG_BK 64           /* columns per slab: one 128-byte swizzle atom of bf16 */
#define QG_THREADS 384
#define QG_SB_BYTES 4096   /* (scale, bias) bytes per stage: 128 rows x up to 4 groups (group 16) */

template <int BITS, int NT>
struct qg_cfg {
    static constexpr int XS = NT * QG_BK * 2;                 /* x tile bytes */
    static constexpr int WS = QG_ROWS * QG_BK * BITS / 8;     /* packed weight bytes */
    static constexpr int STAGE = XS + WS + QG_SB_BYTES;
    static constexpr int STAGES = (200 * 1024) / STAGE > 6 ? 6 : (200 * 1024) / STAGE;
    static constexpr int SMEM = 1024 + STAGES * STAGE + 2 * STAGES * 8;
    static_assert(STAGES * STAGE >= NT * (QG_ROWS + 4) * 4, "the epilogue's staging tile must fit in the stage ring");
};

struct qg_args {
    const uint32_t *q;          /* fragment-ordered packed weights */
    const float2 *sb;           /* [N/128][ng][128] (scale, bias) */
    const __nv_bfloat16 *bias;  /* [N] or NULL */
    const void *gate;           /* [N] (bf16, or f32 when gate_f32) or NULL */
    void *y;                    /* [M, ldy] bf16 or f32 */
    int64_t ldy;
    int M, N, K, group, ybf, gate_f32, accumulate;
    int staged;                 /* y rows 16-byte aligned: the epilogue goes through shared memory (RS kernel) */
};

#ifdef DTC_HAVE_WGMMA
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ uint32_t bf2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}
#endif

/* A thread's packed words of one slab: 4 (4-bit) or 8 (8-bit) u32, from the slab's chunk in shared memory. */
template <int BITS>
__device__ __forceinline__ void qg_load_words(uint32_t *w, uint32_t wsm, int t) {
#ifdef DTC_HAVE_WGMMA
    if (BITS == 4) {
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(wsm + t * 16));
    } else {
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(wsm + t * 32));
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(w[4]), "=r"(w[5]), "=r"(w[6]), "=r"(w[7]) : "r"(wsm + t * 32 + 16));
    }
#endif
}

/* Bit offset of element slot e (0..7, see qg_convert) inside its packed 32-bit word. 4-bit: the two elements of
 * fragment register k (slots 2k, 2k+1) sit in nibbles k and k+4, i.e. in the low and high 16-bit halves at the
 * same offset, so one mask-and-or yields both as bf16. 8-bit: slots 0-3 in word 0, 4-7 in word 1, byte e % 4. */
__host__ __device__ __forceinline__ int qg_bitpos(int bits, int e) {
    return bits == 4 ? 4 * ((e & 1) ? 4 + (e >> 1) : (e >> 1)) : 8 * (e & 3);
}

/* The (scale, bias) entries of rows r0 (= row) and r1 (= row + 8) for k16 step j of a slab: raw 8-byte entries,
 * f32 pairs (QG_F32) or bf16x2 pairs with each value duplicated (QG_BF16). */
__device__ __forceinline__ void qg_load_sb(uint4 &s, uint32_t sbsm, int row, int j, int group) {
#ifdef DTC_HAVE_WGMMA
    const int gl = group < 64 ? (j * 16) / group : 0;
    const uint32_t p = sbsm + (uint32_t)(gl * QG_ROWS + row) * 8u;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(s.x), "=r"(s.y) : "r"(p));
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(s.z), "=r"(s.w) : "r"(p + 64u));
#endif
}

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));   /* (a & b) | c */
    return d;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

/* A 4-bit pair: nibbles at bits [4k, 4k+4) and [4k+16, 4k+20) of q as bf16 s·q + b (the kernel's bf16x2 math:
 * the mask-and-or makes the exact bf16 pair 128 + q, the subtraction is exact, the fma rounds once; s2 / b2 hold
 * the scale and bias twice). */
__device__ __forceinline__ uint32_t q4pair_bf16(uint32_t q, int k, uint32_t s2, uint32_t b2) {
    uint32_t x = lop3_and_or(q >> (4 * k), 0x000F000Fu, 0x43004300u);
    __nv_bfloat162 y = __hsub2(*(__nv_bfloat162 *)&x, __floats2bfloat162_rn(128.f, 128.f));
    __nv_bfloat162 r = __hfma2(y, *(__nv_bfloat162 *)&s2, *(__nv_bfloat162 *)&b2);
    return *(uint32_t *)&r;
}
/* One BITS-bit value at bit offset pos of word w as f32 s·q + b (the kernel's f32 math): the value is moved into
 * the mantissa of 2^23 (lop3 for 4 bits, prmt of byte pos/8 for 8 bits) and 2^23 subtracted, exactly. */
template <int BITS>
__device__ __forceinline__ float q_f32(uint32_t w, int pos, float s, float b) {
    const uint32_t m = BITS == 4 ? lop3_and_or(w >> pos, 15u, 0x4B000000u) : prmt(w, 0x4B000000u, 0x7440u | (uint32_t)(pos >> 3));
    return fmaf(s, __uint_as_float(m) - 8388608.f, b);
}

/* Dequantization modes of the kernel. */
#define QG_F32 0    /* scale·q + bias as an f32 fma, rounded to bf16 (any scale dtype; the transient path's numbers) */
#define QG_BF16 1   /* 4-bit with bf16-exact scales and biases: (q + 128 - 128) exact in bf16, then one bf16x2 fma
                     * per register (one rounding of the exact product-sum; f32 then bf16 rounds twice) */

/* A fragment of k16 step j (4 registers) from the slab's words: rows r0 / r1 of the thread's warp, columns
 * c = 2·(lane%4) + {0,1} and c + 8. Element slot e: e = 4·(c ≥ 8) + 2·(row is r1) + (c odd); register k holds
 * slots 2k (low) and 2k+1 (high), rows r0 for even k, r1 for odd k. */
template <int BITS, int MODE>
__device__ __forceinline__ void qg_convert(uint32_t *a, const uint32_t *w, int j, uint4 s) {
#ifdef DTC_HAVE_WGMMA
    if (MODE == QG_BF16 && BITS == 4) {
#pragma unroll
        for (int k = 0; k < 4; k++) a[k] = q4pair_bf16(w[j], k, (k & 1) ? s.z : s.x, (k & 1) ? s.w : s.y);
    } else {
        const float s0 = __uint_as_float(s.x), b0 = __uint_as_float(s.y), s1 = __uint_as_float(s.z),
                    b1 = __uint_as_float(s.w);
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            f[e] = q_f32<BITS>(BITS == 4 ? w[j] : w[2 * j + (e >> 2)], qg_bitpos(BITS, e), (e & 2) ? s1 : s0, (e & 2) ? b1 : b0);
        a[0] = bf2(f[0], f[1]);
        a[1] = bf2(f[2], f[3]);
        a[2] = bf2(f[4], f[5]);
        a[3] = bf2(f[6], f[7]);
    }
#endif
}

/* The producer thread: streams slab s of the block's x tile (TMA), packed weights and their
 * (scale, bias) entries (bulk copies) into stage s % STAGES once the consumers released its previous use. */
template <int STAGES, int XS, int WS, class XF, class WF, class SF, class FF, class EF>
__device__ __forceinline__ void qg_produce(const CUtensorMap *xmap, const qg_args &a, int m0, int rb, XF xs, WF ws,
                                           SF sbs, FF full, EF empty) {
#ifdef DTC_HAVE_WGMMA
    const int ns = a.K / QG_BK, ng = a.K / a.group;
    const int gslab = a.group < QG_BK ? QG_BK / a.group : 1;
    const char *wq = (const char *)a.q + (size_t)rb * ns * WS;
    const float2 *sb = a.sb + (size_t)rb * ng * QG_ROWS;
    const uint32_t sbytes = (uint32_t)gslab * QG_ROWS * 8u;
    for (int s = 0; s < ns; s++) {
        const int st = s % STAGES;
        if (s >= STAGES) mbar_wait(empty(st), (uint32_t)((s / STAGES - 1) & 1));
        mbar_expect_tx(full(st), (uint32_t)(XS + WS) + sbytes);
        tma_load_2d(xs(st), xmap, s * QG_BK, m0, full(st));
        bulk_load(ws(st), wq + (size_t)s * WS, WS, full(st));
        bulk_load(sbs(st), sb + (size_t)(s * QG_BK / a.group) * QG_ROWS, sbytes, full(st));
    }
#endif
}

/* The epilogue. d: a consumer thread's accumulators of its warp's 16 weight rows (row, row + 8 of
 * the block's 128) x NT tokens in the wgmma D layout; ctid: the thread's index among the 256 consumers.
 * y[tok, n] = (d + bias[n]) · gate[n] (+ y[tok, n]). Staged (a.staged): the tile goes through the shared
 * memory at base (the stage ring, free once both consumer warpgroups passed their last slab: the caller's ring
 * must hold NT x 132 floats) and y moves in 16-byte chunks; otherwise per-element stores. */
template <int NT>
__device__ __forceinline__ void qg_epilogue(const float *d, const qg_args &a, unsigned char *smem_raw, uint32_t base,
                                            int m0, int rb, int row, int t4, int ctid) {
#ifdef DTC_HAVE_WGMMA
    const int n0 = rb * QG_ROWS + row, n1 = n0 + 8;
    float b0 = 0.f, b1 = 0.f, g0 = 1.f, g1 = 1.f;
    if (a.bias) { b0 = __bfloat162float(a.bias[n0]); b1 = __bfloat162float(a.bias[n1]); }
    if (a.gate) {
        if (a.gate_f32) { g0 = ((const float *)a.gate)[n0]; g1 = ((const float *)a.gate)[n1]; }
        else { g0 = __bfloat162float(((const __nv_bfloat16 *)a.gate)[n0]); g1 = __bfloat162float(((const __nv_bfloat16 *)a.gate)[n1]); }
    }
    if (a.staged) {
        /* f32 values [token][128 + 4 pad] (conflict-free writes), then 16-byte coalesced loads / stores of y
         * rows; the named barrier keeps a warpgroup from overwriting stages the other still reads */
        named_bar_sync(1, 256);
        float *stg = (float *)(smem_raw + (base - smem_u32(smem_raw)));
        constexpr int LDS = QG_ROWS + 4;
#pragma unroll
        for (int j8 = 0; j8 < NT / 8; j8++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                stg[(j8 * 8 + 2 * t4 + (e & 1)) * LDS + row + ((e & 2) ? 8 : 0)] =
                    (d[j8 * 4 + e] + ((e & 2) ? b1 : b0)) * ((e & 2) ? g1 : g0);
        named_bar_sync(1, 256);
        const int per = a.ybf ? 8 : 4, cpr = QG_ROWS / per;   /* chunks per token row */
        for (int c = ctid; c < NT * cpr; c += 256) {
            const int tl = c / cpr, nc = (c - tl * cpr) * per, tok = m0 + tl;
            if (tok >= a.M) continue;
            const float *src = stg + tl * LDS + nc;
            const int64_t o = (int64_t)tok * a.ldy + (int64_t)rb * QG_ROWS + nc;
            if (a.ybf) {
                float f[8];
                *(float4 *)f = *(const float4 *)src;
                *(float4 *)(f + 4) = *(const float4 *)(src + 4);
                uint4 *yp = (uint4 *)((__nv_bfloat16 *)a.y + o);
                if (a.accumulate) {
                    uint4 old = *yp;
                    const __nv_bfloat16 *h = (const __nv_bfloat16 *)&old;
#pragma unroll
                    for (int q = 0; q < 8; q++) f[q] += __bfloat162float(h[q]);
                }
                uint4 outv;
                outv.x = bf2(f[0], f[1]);
                outv.y = bf2(f[2], f[3]);
                outv.z = bf2(f[4], f[5]);
                outv.w = bf2(f[6], f[7]);
                *yp = outv;
            } else {
                float4 v = *(const float4 *)src;
                float4 *yp = (float4 *)((float *)a.y + o);
                if (a.accumulate) {
                    const float4 old = *yp;
                    v.x += old.x; v.y += old.y; v.z += old.z; v.w += old.w;
                }
                *yp = v;
            }
        }
        return;
    }
#pragma unroll
    for (int j8 = 0; j8 < NT / 8; j8++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int tok = m0 + j8 * 8 + 2 * t4 + (e & 1);
            if (tok >= a.M) continue;
            const int n = (e & 2) ? n1 : n0;
            float v = (d[j8 * 4 + e] + ((e & 2) ? b1 : b0)) * ((e & 2) ? g1 : g0);
            const int64_t o = (int64_t)tok * a.ldy + n;
            if (a.ybf) {
                __nv_bfloat16 *y = (__nv_bfloat16 *)a.y;
                if (a.accumulate) v += __bfloat162float(y[o]);
                y[o] = __float2bfloat16_rn(v);
            } else {
                float *y = (float *)a.y;
                if (a.accumulate) v += y[o];
                y[o] = v;
            }
        }
    }
#endif
}

template <int BITS, int NT, int MODE>
__global__ void __launch_bounds__(QG_THREADS, 1) k_qgemm(const __grid_constant__ CUtensorMap xmap, qg_args a) {
#ifdef DTC_HAVE_WGMMA
    using C = qg_cfg<BITS, NT>;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    auto xs = [&](int st) { return base + (uint32_t)st * C::XS; };
    auto ws = [&](int st) { return base + (uint32_t)C::STAGES * C::XS + (uint32_t)st * C::WS; };
    auto sbs = [&](int st) { return base + (uint32_t)C::STAGES * (C::XS + C::WS) + (uint32_t)st * QG_SB_BYTES; };
    const uint32_t bars = base + (uint32_t)C::STAGES * C::STAGE;
    auto full = [&](int st) { return bars + (uint32_t)st * 8u; };
    auto empty = [&](int st) { return bars + (uint32_t)(C::STAGES + st) * 8u; };

    const int tid = threadIdx.x, wg = tid >> 7;
    const int m0 = blockIdx.x * NT, rb = blockIdx.y;
    const int ns = a.K / QG_BK;
    if (tid == 0) {
        for (int st = 0; st < C::STAGES; st++) {
            mbar_init(full(st), 1);
            mbar_init(empty(st), 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* ---------------- producer: one thread streams the slabs ---------------- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) qg_produce<C::STAGES, C::XS, C::WS>(&xmap, a, m0, rb, xs, ws, sbs, full, empty);
    } else {
        /* ---------------- consumers: 64 weight rows x NT tokens each ---------------- */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int cw = wg - 1, t = tid & 127, lane = tid & 31, wl = t >> 5;
        const int g = lane >> 2, t4 = lane & 3;
        const int row = cw * 64 + wl * 16 + g;   /* r0 within the block's 128 rows; r1 = row + 8 */
        const uint32_t wofs = (uint32_t)cw * (C::WS / 2);
        float d[NT / 2];
#pragma unroll
        for (int i = 0; i < NT / 2; i++) d[i] = 0.f;
        reg_fence(d, NT / 2);
        /* Software pipeline per slab: issue the slab's four k16 steps (one wgmma group), convert the next slab's
         * fragments while they run, drain, release the stage. (A k16-granular variant that keeps four groups in
         * flight measured 2-4% slower.) Fragments alternate between A0 and A1 by slab parity. */
        uint32_t A0[16], A1[16], w[BITS];
        uint4 sc;
        auto wait_full = [&](int s) { mbar_wait(full(s % C::STAGES), (uint32_t)((s / C::STAGES) & 1)); };
        wait_full(0);
        qg_load_words<BITS>(w, ws(0) + wofs, t);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (j == 0 || (a.group < 64 && (j * 16) % a.group == 0)) qg_load_sb(sc, sbs(0), row, j, a.group);
            qg_convert<BITS, MODE>(A0 + 4 * j, w, j, sc);
        }
        auto slab0 = [&](int s, const uint32_t *cur, uint32_t *nxt) {
            const uint32_t xb = xs(s % C::STAGES);
            wg_fence();
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint64_t db = wg_desc(xb + (uint32_t)(j * 32));
                if (NT == 192) wgmma_m64n192_rs(d, cur + 4 * j, db);
                else wgmma_m64n128_rs(d, cur + 4 * j, db);
            }
            wg_commit();
            if (s + 1 < ns) {
                const int sn = (s + 1) % C::STAGES;
                wait_full(s + 1);
                qg_load_words<BITS>(w, ws(sn) + wofs, t);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if (j == 0 || (a.group < 64 && (j * 16) % a.group == 0)) qg_load_sb(sc, sbs(sn), row, j, a.group);
                    qg_convert<BITS, MODE>(nxt + 4 * j, w, j, sc);
                }
            }
            wg_wait0();
            reg_fence(d, NT / 2);
            mbar_arrive(empty(s % C::STAGES));
        };
        for (int s = 0; s < ns; s += 2) {
            slab0(s, A0, A1);
            if (s + 1 < ns) slab0(s + 1, A1, A0);
        }
        /* ---------------- epilogue ---------------- */
        qg_epilogue<NT>(d, a, smem_raw, base, m0, rb, row, t4, tid - 128);
    }
#endif
}

/* One dequantized weight (the low BITS bits of qv) of row n, (scale, bias) entry sbi of the [N/128][ng][128]
 * array, times rowscale[n] when given: the fallback paths' bf16 value. */
__device__ __forceinline__ __nv_bfloat16 qg_dequant_one(uint32_t qv, int bits, const float2 *sb, int64_t sbi, int64_t n,
                                                        int sb_bf16, const void *rowscale, int rs_f32) {
    float2 p = sb[sbi * QG_ROWS + n % QG_ROWS];
    if (sb_bf16) p = make_float2(__uint_as_float(__float_as_uint(p.x) << 16), __uint_as_float(__float_as_uint(p.y) << 16));
    float v = fmaf(p.x, (float)(qv & ((1u << bits) - 1u)), p.y);
    if (rowscale) v *= rs_f32 ? ((const float *)rowscale)[n] : __bfloat162float(((const __nv_bfloat16 *)rowscale)[n]);
    return __float2bfloat16_rn(v);
}

/* ------------------------------------------------------------------ re-layout at load */
/* One thread per destination word: gathers its 32/BITS elements from the MLX layout (element k of row n at bits
 * BITS·(k mod 32/BITS) of word n·K·BITS/32 + k·BITS/32). */
/* Fragment order: weight row n and column k of slot `slot` (0 .. 32/BITS-1) of packed word i; returns the
 * element's slot e in its k16 step (see qg_convert). */
template <int BITS>
__device__ __forceinline__ int qg_coords(int64_t i, int64_t K, int slot, int64_t *n, int64_t *k) {
    const int64_t ns = K / QG_BK;
    const int chunk = QG_ROWS * QG_BK * BITS / 32;   /* words per (row block, slab) */
    const int per_wg = chunk / 2, per_thread = BITS; /* 4 or 8 words per consumer thread and slab */
    const int64_t ci = i / chunk;
    const int in = (int)(i - ci * chunk);
    const int64_t rb = ci / ns, s = ci - rb * ns;
    const int cw = in / per_wg, r = in - cw * per_wg;
    const int t = r / per_thread, rem = r - t * per_thread;
    const int j = BITS == 4 ? rem : rem >> 1, hw = BITS == 4 ? 0 : rem & 1;
    const int wl = t >> 5, lane = t & 31, g = lane >> 2, t4 = lane & 3;
    const int e = hw * 4 + slot;
    const int col8 = e >> 2, half = (e >> 1) & 1, pair = e & 1;
    *n = rb * QG_ROWS + cw * 64 + wl * 16 + half * 8 + g;
    *k = s * QG_BK + j * 16 + col8 * 8 + t4 * 2 + pair;
    return e;
}

template <int BITS>
__global__ void k_qg_pack(uint32_t *dst, const uint32_t *src, int64_t N, int64_t K) {
    const int64_t words = N * K * BITS / 32;
    const int epw = 32 / BITS;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < words; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t out = 0;
        for (int slot = 0; slot < epw; slot++) {
            int64_t n, k;
            const int e = qg_coords<BITS>(i, K, slot, &n, &k);
            const uint32_t wv = src[n * (K * BITS / 32) + k / epw];
            out |= ((wv >> (BITS * (k % epw))) & ((1u << BITS) - 1u)) << qg_bitpos(BITS, e);
        }
        dst[i] = out;
    }
}

/* (scale, bias) to [N/128][ng][128]: f32 pairs, or (bf16: values exact in bf16) bf16x2 pairs {s,s}, {b,b}. */
__global__ void k_qg_pack_sb(float2 *dst, const float2 *src, int64_t N, int64_t ng, int bf16) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * ng; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / ng, gi = i - n * ng;
        float2 v = src[i];
        if (bf16) {
            const uint32_t sh = __float_as_uint(v.x) >> 16, bh = __float_as_uint(v.y) >> 16;
            v = make_float2(__uint_as_float(sh | sh << 16), __uint_as_float(bh | bh << 16));
        }
        dst[((n / QG_ROWS) * ng + gi) * QG_ROWS + n % QG_ROWS] = v;
    }
}

/* Fallback dequantization from the fragment order to dense bf16 [N, K] (rowscale as in k_dequant). */
template <int BITS>
__global__ void k_qg_dequant(__nv_bfloat16 *dst, const uint32_t *q, const float2 *sb, int64_t N, int64_t K, int group,
                             int sb_bf16, const void *rowscale, int rs_f32) {
    const int64_t words = N * K * BITS / 32, ng = K / group;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < words; i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t wv = q[i];
        for (int slot = 0; slot < 32 / BITS; slot++) {
            int64_t n, k;
            const int e = qg_coords<BITS>(i, K, slot, &n, &k);
            dst[n * K + k] = qg_dequant_one(wv >> qg_bitpos(BITS, e), BITS, sb, (n / QG_ROWS) * ng + k / group, n, sb_bf16,
                                            rowscale, rs_f32);
        }
    }
}

/* ------------------------------------------------------------------ host side */
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled from the driver library (dlopen: the build links no libcuda). NULL when unavailable. */
static encode_tiled_fn encoder(void) {
    static int tried = 0;
    static encode_tiled_fn fn = nullptr;
    if (!tried) {
        tried = 1;
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h) h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
        if (h) fn = (encode_tiled_fn)dlsym(h, "cuTensorMapEncodeTiled");
    }
    return fn;
}

int dtc_qgemm_eligible(const dtc_state *st, int64_t N, int64_t K, int bits, int group) {
    if (!st->hopper || !encoder()) return 0;
    if (bits != 4 && bits != 8) return 0;
    if (N % QG_ROWS || K % QG_BK || K >= (1LL << 31) || N >= (1LL << 31)) return 0;
    if (group < 16 || group % 16 || (group < QG_BK ? QG_BK % group : group % QG_BK)) return 0;
    return 1;
}

int dtc_qgemm_pack(dtc_state *st, dtc_qg_w *dst, const uint32_t *qw, const float2 *sb, int64_t N, int64_t K, int bits,
                   int group, int sb_bf16_exact) {
    const int64_t words = N * K * bits / 32, ng = K / group;
    dst->q = (uint32_t *)dtc_pool_alloc(st, (size_t)words * 4);
    dst->sb = (float2 *)dtc_pool_alloc(st, (size_t)N * ng * sizeof(float2));
    if (!dst->q || !dst->sb) {
        dtc_pool_free(st, dst->q);
        dtc_pool_free(st, dst->sb);
        dst->q = nullptr;
        dst->sb = nullptr;
        return -1;
    }
    dst->N = N;
    dst->K = K;
    dst->bits = bits;
    dst->group = group;
    /* option qgemm_f32_math: the f32 dequantization even for bf16-exact scales */
    dst->sb_bf16 = bits == 4 && sb_bf16_exact && !st->o.qgemm_f32_math;
    const unsigned blocks = (unsigned)(st->sm_count * 8);
    if (bits == 4) k_qg_pack<4><<<blocks, 256, 0, st->q.stream>>>(dst->q, qw, N, K);
    else k_qg_pack<8><<<blocks, 256, 0, st->q.stream>>>(dst->q, qw, N, K);
    CK_LAUNCH("qgemm_pack");
    k_qg_pack_sb<<<blocks, 256, 0, st->q.stream>>>(dst->sb, sb, N, ng, dst->sb_bf16);
    CK_LAUNCH("qgemm_pack_sb");
    return 0;
}

void dtc_qgemm_free(dtc_state *st, dtc_qg_w *w) {
    dtc_pool_free(st, w->q);
    dtc_pool_free(st, w->sb);
    w->q = nullptr;
    w->sb = nullptr;
}

void dtc_qgemm_dequant(dtc_state *st, __nv_bfloat16 *dst, const dtc_qg_w *w, const void *rowscale, int rs_f32) {
    const unsigned blocks = (unsigned)(st->sm_count * 16);
    auto kern = w->bits == 4 ? k_qg_dequant<4> : k_qg_dequant<8>;
    kern<<<blocks, 256, 0, st->q.stream>>>(dst, w->q, w->sb, w->N, w->K, w->group, w->sb_bf16, rowscale, rs_f32);
    CK_LAUNCH("qgemm_dequant");
}

/* Launches one instantiation (token tile NT: 192 or 128), raising its shared-memory limit on first use. */
template <int BITS, int MODE, int NT>
static void q_launch(dtc_state *st, const CUtensorMap &map, const qg_args &a) {
    static int attr = 0;
    auto kern = k_qgemm<BITS, NT, MODE>;
    const int smem = qg_cfg<BITS, NT>::SMEM;
    if (!attr) {
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr = 1;
    }
    dim3 grid((unsigned)((a.M + NT - 1) / NT), (unsigned)(a.N / QG_ROWS));
    kern<<<grid, QG_THREADS, smem, st->q.stream>>>(map, a);
    CK_LAUNCH("qgemm");
}

template <int BITS, int MODE>
static void q_launch_nt(dtc_state *st, const CUtensorMap &map, const qg_args &a, int small) {
    if (small) q_launch<BITS, MODE, 128>(st, map, a);
    else q_launch<BITS, MODE, 192>(st, map, a);
}

/* Token tile: 192 unless 128 fills the SMs' waves (and the last tile) clearly better. (256 would need 128
 * accumulators per thread: ptxas then serialises the wgmmas under the 168-register cap of 384 threads.) */
static int pick_nt(const dtc_state *st, int64_t M, int64_t N, int big) {
    auto eff = [&](int nt) {
        double tiles = (double)((M + nt - 1) / nt) * (double)(N / QG_ROWS);
        double waves = tiles / st->sm_count, full = (double)(int64_t)(waves + 0.999999);
        double pad = (double)M / (double)(((M + nt - 1) / nt) * nt);
        return waves / full * pad;
    };
    /* the 128 tile runs ~25% slower per FLOP than 192 (measured, stop 11): it must fill the waves that much better */
    return eff(128) > 1.25 * eff(big) ? 128 : big;
}

int dtc_qgemm(dtc_state *st, dt_mat y, dt_mat x, const dtc_qg_w *w, const dtc_qg_epi *e) {
    encode_tiled_fn enc = encoder();
    if (!enc || x.dtype != DT_BF16 || (y.dtype != DT_BF16 && y.dtype != DT_F32)) return -1;
    if (x.ld % 8 || !dtc_aligned16(x.data) || x.rows >= (1LL << 31) || x.cols != w->K || y.cols != w->N) return -1;
    CUtensorMap map;
    const int nt = pick_nt(st, x.rows, w->N, 192);
    cuuint64_t gdim[2] = {(cuuint64_t)w->K, (cuuint64_t)x.rows};
    cuuint64_t gstride[1] = {(cuuint64_t)x.ld * 2};
    cuuint32_t box[2] = {QG_BK, (cuuint32_t)nt};
    cuuint32_t estride[2] = {1, 1};
    if (enc(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, x.data, gdim, gstride, box, estride,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return -1;
    qg_args a;
    a.q = w->q;
    a.sb = w->sb;
    a.bias = e ? e->bias : nullptr;
    a.gate = e ? e->gate : nullptr;
    a.gate_f32 = e ? e->gate_f32 : 0;
    a.accumulate = e ? e->accumulate : 0;
    a.y = y.data;
    a.ldy = y.ld;
    a.ybf = y.dtype == DT_BF16;
    a.M = (int)x.rows;
    a.N = (int)w->N;
    a.K = (int)w->K;
    a.group = w->group;
    {
        /* option qgemm_direct_epilogue: per-element stores from registers (what unaligned outputs take anyway) */
        const int esz = y.dtype == DT_BF16 ? 2 : 4;
        a.staged = !st->o.qgemm_direct_epilogue && dtc_aligned16(y.data) && (y.ld * esz) % 16 == 0;
    }
    const int small = nt == 128;
    /* 4-bit: bf16x2 math (bf16-exact scales) or f32 math; 8-bit: f32 math */
    if (w->bits == 8) q_launch_nt<8, QG_F32>(st, map, a, small);
    else if (w->sb_bf16) q_launch_nt<4, QG_BF16>(st, map, a, small);
    else q_launch_nt<4, QG_F32>(st, map, a, small);
    return 0;
}

void dtc_preload_qgemm(dtc_state *st) {
    (void)st;
    dtc_preload_fn((const void *)k_qgemm<4, 192, QG_BF16>);
    dtc_preload_fn((const void *)k_qgemm<4, 128, QG_BF16>);
    dtc_preload_fn((const void *)k_qgemm<4, 192, QG_F32>);
    dtc_preload_fn((const void *)k_qgemm<4, 128, QG_F32>);
    dtc_preload_fn((const void *)k_qgemm<8, 192, QG_F32>);
    dtc_preload_fn((const void *)k_qgemm<8, 128, QG_F32>);
    dtc_preload_fn((const void *)k_qg_pack<4>);
    dtc_preload_fn((const void *)k_qg_pack<8>);
    dtc_preload_fn((const void *)k_qg_pack_sb);
    encoder();
}
