/* cuda_linear.cuh — what the CUDA Linear's files share (private to them): the prepared Linear, the dequantization
 * of its packed weights, the transient-weight slots, and the fused qmm GEMM. Files: cuda_linear_weights.cu (upload,
 * forms, destroy), cuda_prefetch.cu (transient slots and hints), cuda_qmm.cu (fused qmm kernel), cuda_linear.cu
 * (the ops: which path a product takes). The cuBLASLt GEMM helper is cuda_gemm.cu (cuda_common.cuh). */
#ifndef DT_CUDA_LINEAR_CUH
#define DT_CUDA_LINEAR_CUH

#include "cuda_common.cuh"

struct dt_linear {
    int64_t out, in;
    int bits, group;
    __nv_bfloat16 *w;   /* dense bf16 [out, in] (dense weights or CACHED dequantization) */
    uint32_t *qw;       /* packed MLX layout [out, in*bits/32] */
    float2 *sb;         /* (scale, bias) per group [out, in/group] */
    __nv_bfloat16 *bias;/* Linear bias [out] or NULL */
    dtc_fp8_w *f8;      /* fp8 weights (cuda_fp8.cu) instead of w/qw, or NULL */
    int f8_unfused;     /* dt_linear_src.fp8_unfused: f8 quantizes its input in a pass of its own (no fused inputs) */
    dtc_qg_w mx;        /* qpath mixed: fragment-ordered packed weights (cuda_qgemm.cu) instead of qw/sb; mx.q NULL
                           when unused */
    uint8_t *gq;        /* GGUF blocks as the file has them [out rows of in/QK blocks] (cuda_ggml.cu), or NULL */
    int host;           /* 1: qw and sb are mapped pinned host memory (o.host_weights), not pool blocks */
    dt_dtype gtype;     /* their block type */
    const char *path;   /* how it runs, in words (linear_path) */
};

/* Exact small-integer -> float without the (slow) I2F conversion unit: 2^23 + u has u in its mantissa. */
__device__ __forceinline__ float u2f(uint32_t u) { return __uint_as_float(0x4B000000u | u) - 8388608.f; }

/* Packed weights -> dense bf16 [out, in] on stream (rowscale: NULL, or a [out] vector, bf16 or f32 when rs_f32,
 * multiplied into each row: the gate of linear_gated_add). cuda_linear_weights.cu. */
void dtc_dequant_launch(dtc_state *st, cudaStream_t stream, __nv_bfloat16 *dst, const dt_linear *w,
                        const void *rowscale, int rs_f32);
/* The same from a copy of w's packed MLX form (codes qw, pairs sb: w's layout, e.g. in pf_stage). */
void dtc_dequant_launch_from(dtc_state *st, cudaStream_t stream, __nv_bfloat16 *dst, const dt_linear *w,
                             const uint32_t *qw, const float2 *sb, const void *rowscale, int rs_f32);
/* Bytes of w's packed MLX form as staged: the codes (*qbytes), then the (scale, bias) pairs at a 16-byte boundary
 * (*sb_off); both out parameters may be NULL. */
size_t dtc_packed_bytes(const dt_linear *w, size_t *qbytes, size_t *sb_off);
/* The quantized-weight path of a product of `rows` tokens (cuda_linear.cu). */
dt_qpath dtc_qpath_for(const dt_backend *be, int64_t rows);
/* w's dequantized weights (rows scaled by rowscale when given) for a GEMM on the current queue: a prefetched slot,
 * or dequantized now (cuda_prefetch.cu). */
__nv_bfloat16 *dtc_transient_weights(dtc_state *st, const dt_linear *w, const void *rowscale, int rs_f32);
/* A destroyed Linear: no slot may match it later (cuda_prefetch.cu). */
void dtc_prefetch_drop(dtc_state *st, const dt_linear *w);
/* y = x · Wᵀ (+ bias) through the fused qmm kernel (cuda_qmm.cu); -1 (nothing queued) when the shapes or the
 * layout do not suit it. */
int dtc_qmm_linear(dtc_state *st, dt_mat y, dt_mat x, const dt_linear *w);

#endif
