/* cuda_ggml.cu — GGUF block weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) dequantized on the device to
 * bf16 [N, K] for a dense GEMM (the transient path of cuda_linear.cu, as for MLX 4/8-bit weights). The raw blocks
 * stay on the device as the file has them (rows of K / QK blocks); one thread makes 32 consecutive values.
 * The arithmetic is quant/ggml_quants.h's reference: f32 with one rounding per operation in the same order
 * (__fmul_rn / __fadd_rn keep the compiler from fusing), then one rounding to bf16, so the device weights are
 * bf16(CPU reference) bit for bit. An optional row scale (the gate of linear_gated_add) multiplies each row after. */
#include "cuda_common.cuh"

__device__ __forceinline__ float gg_h2f(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}
__device__ __forceinline__ uint32_t gg_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
/* 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 packed bytes */
__device__ __forceinline__ void gg_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* the 32 values of unit u (a 32-value block, or a 32-value part of a 256-value super-block) of one row */
template <int T>
__device__ __forceinline__ void gg_unit(const uint8_t *row, int64_t u, float *f) {
    if (T == DT_Q8_0) {
        const uint8_t *b = row + u * 34;
        const float d = gg_h2f(b);
        for (int j = 0; j < 32; j++) f[j] = __fmul_rn((float)(int8_t)b[2 + j], d);
    } else if (T == DT_Q4_0 || T == DT_Q5_0) {
        const uint8_t *b = row + u * (T == DT_Q4_0 ? 18 : 22), *qs = b + (T == DT_Q4_0 ? 2 : 6);
        const float d = gg_h2f(b);
        const uint32_t qh = T == DT_Q5_0 ? gg_u32(b + 2) : 0u;
        const int off = T == DT_Q4_0 ? 8 : 16;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0xF) | (int)((qh >> j) & 1u) << 4, hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
            f[j] = __fmul_rn((float)(lo - off), d);
            f[j + 16] = __fmul_rn((float)(hi - off), d);
        }
    } else if (T == DT_Q4_1 || T == DT_Q5_1) {
        const uint8_t *b = row + u * (T == DT_Q4_1 ? 20 : 24), *qs = b + (T == DT_Q4_1 ? 4 : 8);
        const float d = gg_h2f(b), m = gg_h2f(b + 2);
        const uint32_t qh = T == DT_Q5_1 ? gg_u32(b + 4) : 0u;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0xF) | (int)((qh >> j) & 1u) << 4, hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
            f[j] = __fadd_rn(__fmul_rn((float)lo, d), m);
            f[j + 16] = __fadd_rn(__fmul_rn((float)hi, d), m);
        }
    } else if (T == DT_Q4_K || T == DT_Q5_K) {
        const int64_t sb = u >> 3;
        const int sub = (int)(u & 7), g = sub >> 1, h = sub & 1;
        const uint8_t *b = row + sb * (T == DT_Q4_K ? 144 : 176);
        const uint8_t *qh = b + 16, *qs = b + (T == DT_Q4_K ? 16 : 48);
        int sc, mn;
        gg_scale_min(sub, b + 4, &sc, &mn);
        const float d1 = __fmul_rn(gg_h2f(b), (float)sc), m1 = __fmul_rn(gg_h2f(b + 2), (float)mn);
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * g + l] >> (4 * h)) & 0xF;
            if (T == DT_Q5_K) q |= ((qh[l] >> (2 * g + h)) & 1) << 4;
            f[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
        }
    } else {   /* Q6_K: value v = 128 n + 32 k + l */
        const int64_t sb = u >> 3;
        const int sub = (int)(u & 7), n = sub >> 2, k = sub & 3;
        const uint8_t *b = row + sb * 210, *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = gg_h2f(b + 208);
        for (int l = 0; l < 32; l++) {
            int lo = (ql[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xF;
            int q = (lo | (((qh[32 * n + l] >> (2 * k)) & 3) << 4)) - 32;
            const float ds = __fmul_rn(d, (float)sc[(128 * n + 32 * k + l) / 16]);
            f[l] = __fmul_rn(ds, (float)q);
        }
    }
}

template <int T>
__global__ void k_ggml_dequant(__nv_bfloat16 *dst, const uint8_t *src, int64_t N, int64_t K, int64_t row_bytes,
                               const void *rowscale, int rs_f32) {
    const int64_t units = K / 32, total = N * units;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / units, u = i - n * units;
        float f[32];
        gg_unit<T>(src + n * row_bytes, u, f);
        if (rowscale) {   /* the gate of linear_gated_add, folded into the weight rows */
            float g = rs_f32 ? ((const float *)rowscale)[n] : __bfloat162float(((const __nv_bfloat16 *)rowscale)[n]);
#pragma unroll
            for (int j = 0; j < 32; j++) f[j] *= g;
        }
        uint4 *o = (uint4 *)(dst + n * K + u * 32);
#pragma unroll
        for (int c = 0; c < 4; c++) o[c] = f_to_bf8(f + 8 * c);
    }
}

int dtc_ggml_supported(dt_dtype t) {
    return t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q5_0 || t == DT_Q5_1 || t == DT_Q8_0 || t == DT_Q4_K ||
           t == DT_Q5_K || t == DT_Q6_K;
}

void dtc_ggml_dequant(dtc_state *st, cudaStream_t stream, __nv_bfloat16 *dst, const uint8_t *src, dt_dtype t, int64_t N,
                      int64_t K, const void *rowscale, int rs_f32) {
    const int64_t units = N * (K / 32), rb = (int64_t)dt_dtype_bytes(t, K);
    int64_t b = (units + 255) / 256;
    if (b > (int64_t)st->sm_count * 32) b = (int64_t)st->sm_count * 32;
    if (b < 1) b = 1;
#define GG_LAUNCH(TT) k_ggml_dequant<TT><<<(unsigned)b, 256, 0, stream>>>(dst, src, N, K, rb, rowscale, rs_f32)
    switch (t) {
    case DT_Q4_0: GG_LAUNCH(DT_Q4_0); break;
    case DT_Q4_1: GG_LAUNCH(DT_Q4_1); break;
    case DT_Q5_0: GG_LAUNCH(DT_Q5_0); break;
    case DT_Q5_1: GG_LAUNCH(DT_Q5_1); break;
    case DT_Q8_0: GG_LAUNCH(DT_Q8_0); break;
    case DT_Q4_K: GG_LAUNCH(DT_Q4_K); break;
    case DT_Q5_K: GG_LAUNCH(DT_Q5_K); break;
    case DT_Q6_K: GG_LAUNCH(DT_Q6_K); break;
    default: return;
    }
#undef GG_LAUNCH
    CK_LAUNCH("ggml_dequant");
}
