/* cuda_common.cuh — shared internals of the CUDA backend: the private backend state, the checked-call
 * macros (one clear line, then exit(1)), the device memory pool, grow-only scratch buffers, the generic
 * cuBLASLt GEMM helper, and small device helpers (bf16 conversion, strided element access, PTX wrappers for
 * ldmatrix / mma.sync / cp.async). Everything here is C++; only cuda_backend.cu exports the C entry points. */
#ifndef DT_CUDA_COMMON_CUH
#define DT_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/backend_cuda.h"
#include "backends/backend_ext.h"
#include "quant/dequant.h"

/* ------------------------------------------------------------------ errors */
[[noreturn]] void dtc_fatal(const char *call, const char *file, int line, const char *msg);

#define CK(call)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) dtc_fatal(#call, __FILE__, __LINE__, cudaGetErrorString(e_));    \
    } while (0)
#define CKLT(call)                                                                              \
    do {                                                                                        \
        cublasStatus_t s_ = (call);                                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS) dtc_fatal(#call, __FILE__, __LINE__, cublasGetStatusString(s_)); \
    } while (0)
/* After every kernel launch. */
#define CK_LAUNCH(name)                                                                         \
    do {                                                                                        \
        cudaError_t e_ = cudaGetLastError();                                                    \
        if (e_ != cudaSuccess) dtc_fatal(name " launch", __FILE__, __LINE__, cudaGetErrorString(e_)); \
    } while (0)
/* Precondition violated by the caller (shape/dtype mismatch): fatal, names the op. */
#define DTC_REQUIRE(cond, ...)                                                                  \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "ditrun: cuda: ");                                                  \
            fprintf(stderr, __VA_ARGS__);                                                       \
            fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);                                  \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

/* ------------------------------------------------------------------ state */
struct dtc_pool;     /* caching allocator (cuda_pool.cu) */
struct dtc_gemm_cache;
struct dtc_cudnn;     /* cuDNN handle and SDPA plan cache (cuda_cudnn.cu) */
struct dtc_fp8_cache;  /* cuda_fp8.cu */
struct dtc_fp8_w;      /* fp8 weights (cuda_fp8.cu) */

/* A grow-only device buffer for op-internal temporaries. It never shrinks and old buffers are kept
 * until the backend is destroyed, so CUDA graphs captured earlier stay valid. */
struct dtc_scratch {
    void *ptr;
    size_t size;
    void **retired;
    int nretired;
};

/* A page-locked host staging buffer (cuda_transfer.cu: upload / download). */
struct dtc_pinned {
    void *p;
    size_t size;
    cudaEvent_t ev;   /* recorded after the last transfer that read it */
    int pending;
};

/* What each of the two queues (stream_switch) owns: its stream, its cuBLASLt workspace and the scratch buffers of
 * ops that may run on either queue at the same time (sharing them would race). */
struct dtc_queue {
    cudaStream_t stream;
    void *lt_ws;            /* cuBLASLt workspace (lt_ws_size bytes) */
    dtc_scratch s_qdeq;     /* transient dequantized weights (bf16 [N,K]) when the prefetch slots are not used */
    dtc_scratch s_split;    /* split-K partials of the fused qmm */
    dtc_scratch s_cast;     /* bf16 copy of F32 inputs to linear */
    dtc_scratch s_gate;     /* linear_gated_add: the gate as f32 */
    dtc_scratch s_lga;      /* linear_gated_add fallback: the linear's output */
    dtc_scratch s_fp8;      /* fp8 linear: e4m3 activation codes [M, K] + row scales [M] */
    dtc_scratch s_fp8g;     /* fp8 linear_gated_add: the weight scales times the gate [N] */
};

struct dtc_state {
    dt_cuda_opts o;         /* the backend's options (backend_cuda.h; tests and bench arms may change the per-call
                               fields between ops through dt_backend_cuda_opts) */
    int device;
    int sm_count;
    int cc_major, cc_minor;
    int hopper;             /* our sm_90a kernels may run (dt_cuda_hopper_paths: compute 9.0, kernels not portable) */
    size_t smem_optin;
    dtc_queue q;            /* the current queue (what every op issues to) */
    cublasLtHandle_t lt;
    size_t lt_ws_size;
    dtc_pool *pool;
    dtc_gemm_cache *gemm_cache;
    dtc_scratch s_attn;     /* attention fallback: S (f32) and P (bf16) */
    dtc_scratch s_conv;     /* im2col columns */
    dtc_scratch s_misc;     /* small temporaries (group-norm partials, casts) */
    dtc_scratch s_vt;       /* attention: transposed V for the wgmma kernel */
    dtc_scratch s_mask;     /* attention: scaled key bias and the list of key tiles to visit */
    dtc_cudnn *cudnn;       /* cuDNN handle, plans and workspaces (cuda_cudnn.cu); nullptr until first used */
    dtc_fp8_cache *fp8_cache;
    int capturing;
    int verbose;
    /* stream_switch (cuda_queues.cu): the queue not in use; a switch swaps q and alt */
    int cur_queue;          /* 0 main, 1 side */
    dtc_queue alt;
    cudaEvent_t ev_switch;
    /* Transient-weight prefetch (cuda_prefetch.cu, linear_prefetch): on the main queue the transient Linears'
     * dequantized weights live in two slots; a prefetch hint dequantizes the next Linear into the free slot on
     * pf_stream (lower priority than the queues), overlapping the ops queued before it. Off with o.no_prefetch. */
    cudaStream_t pf_stream; /* NULL when the prefetch is off */
    int queue_prio;         /* priority of the two queues' streams */
    cudaEvent_t pf_pos;     /* the main queue's position when a prefetch was issued */
    cudaEvent_t pf_last;    /* after the last prefetch (join) */
    int pf_unjoined;        /* prefetches issued since the last join */
    unsigned long long pf_clock;
    struct {
        dtc_scratch buf;
        const void *w, *gate; /* what the slot holds: Linear and row gate (NULL: none); w NULL = nothing reusable */
        int gate_f32;
        int pending;          /* 1: a prefetch not yet consumed by its Linear */
        unsigned long long stamp;   /* last fill or use (least recently used slot is refilled first) */
        cudaEvent_t ready;    /* recorded on pf_stream after the slot's prefetch */
    } pf[2];
    dtc_scratch pf_stage;   /* host weights: a hinted Linear's packed weights copied over the bus by the copy engine
                             * (packed codes, then the (scale, bias) pairs at a 16-byte boundary) before the slot's
                             * dequantization reads them; one for all (pf_stream runs copy, dequantization, copy, ...
                             * in order); sized for the largest host-weight Linear at its creation */
    int graphs_made;        /* graphs captured so far: scratch growth before the first frees the old buffer */
    dtc_pinned pin_up, pin_down;   /* host staging of upload / download */
    /* GEMM algorithm choice (cuda_gemm.cu): o.gemm_tune, choices persisted in o.gemm_cache */
    char gpu_id[160];       /* device name, cc, SMs, cuBLASLt version: the persisted choices' validity key */
    char f8a_off[320];      /* why attention_fp8 is off (dt_backend.attention_fp8_off), "" when on */
    double t_preload;       /* seconds spent in dtc_preload_kernels at create */
    double trace_malloc_ms; /* o.trace: print cudaMalloc calls at least this long (0 = off) */
    int fp8_force_unfused;  /* the fp8-internals extension's force_unfused (bench A/B arm) */
    void *nvml_dev;         /* NVML handle of this device (cuda_power.cu), found on first use */
};

static inline dtc_state *dtc(dt_backend *be) { return (dtc_state *)be->impl; }

/* The vtable entries of the backend's pieces (cuda_backend.cu installs them): memory (cuda_pool.cu), copies
 * (cuda_transfer.cu), queues / graphs / extensions (cuda_queues.cu). */
int dtc_mat_alloc(dt_backend *be, dt_mat *m, int64_t rows, int64_t cols, dt_dtype dtype);
void dtc_mat_free(dt_backend *be, dt_mat *m);
void dtc_mem_stats(dt_backend *be, size_t *current, size_t *peak);
void dtc_upload(dt_backend *be, dt_mat m, const float *src);
void dtc_download(dt_backend *be, float *dst, dt_mat m);
void dtc_image_rgb8(dt_backend *be, uint8_t *dst, dt_mat x);
int dtc_sync(dt_backend *be);
const void *dtc_get_ext(dt_backend *be, const char *name);   /* profiling, fp8-internals (backend_ext.h) */
int dtc_capture_begin(dt_backend *be);
void *dtc_capture_end(dt_backend *be);
int dtc_graph_launch(dt_backend *be, void *graph);
void dtc_graph_destroy(dt_backend *be, void *graph);
void dtc_stream_switch(dt_backend *be, int q, int wait);

/* Memory (cuda_pool.cu). */
void dtc_pool_create(dtc_state *st);
void dtc_pool_destroy(dtc_state *st);       /* frees every block, live or cached */
int dtc_pool_malloc_stats(dtc_state *st, int *n, double *seconds);   /* cudaMalloc calls and their host time */
void dtc_scratch_release(dtc_state *st, dtc_scratch *s);
void dtc_queue_release(dtc_state *st, dtc_queue *q);   /* a queue's scratch buffers and workspace */
void dtc_pinned_release(dtc_pinned *b);     /* cuda_transfer.cu */
void *dtc_pool_alloc(dtc_state *st, size_t bytes);   /* NULL on out of memory or past o.max_vram (error set) */
void dtc_pool_free(dtc_state *st, void *p);
/* A block never taken from the cache and given straight back to the device (long-lived buffers: the cuBLASLt
 * workspaces), counted in the pool's use, peak and budget like every other. */
void *dtc_pool_alloc_fresh(dtc_state *st, size_t bytes);
void dtc_pool_free_to_device(dtc_state *st, void *p);
void *dtc_scratch_get(dtc_state *st, dtc_scratch *s, size_t bytes);  /* fatal on OOM */
/* Grow s to exactly `bytes` if smaller (no slack; for sizes known up front, e.g. at load). */
void dtc_scratch_reserve(dtc_state *st, dtc_scratch *s, size_t bytes);
/* The main queue waits for every prefetch issued so far (before a sync, download or the end of a capture). */
void dtc_prefetch_join(dtc_state *st);

/* Kernel preloading at backend creation (each file lists its kernels; cudaFuncGetAttributes forces the lazy
 * loader to load one). dtc_preload_kernels (cuda_backend.cu) calls them all. */
void dtc_preload_kernels(dtc_state *st);
void dtc_preload_attention(dtc_state *st);
void dtc_preload_elementwise(dtc_state *st);
void dtc_preload_image(dtc_state *st);
void dtc_preload_linear(dtc_state *st);
void dtc_preload_qmm(dtc_state *st);
void dtc_preload_fp8(dtc_state *st);
void dtc_preload_qgemm(dtc_state *st);
static inline void dtc_preload_fn(const void *f) {
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, f) != cudaSuccess) cudaGetLastError();
}

/* Clock and power through NVML (cuda_power.cu); -1 when unavailable. */
int dtc_power_sample(dtc_state *st, dt_power_sample *p);

/* ------------------------------------------------------------------ GEMM (cuda_gemm.cu) */
/* Column-major cuBLASLt product D[m,n] = alpha * op(A)[m,k] * op(B)[k,n] (+ bias[m] when bias != NULL).
 * A/B are bf16; D is bf16 or f32 (dtype). ta/tb: 1 = transposed. Leading dimensions in elements. */
/* The device key of the persisted algorithm choices (o.gemm_tune, o.gemm_cache); see cuda_gemm.cu. */
void dtc_gemm_tune_init(dtc_state *st, const char *device_name);
void dtc_gemm(dtc_state *st, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
              const void *B, int64_t ldb, void *D, int64_t ldd, dt_dtype dtype_d, float alpha,
              const void *bias_bf16);
/* The same with accumulate = 1 (D += alpha·op(A)op(B): beta = 1, C = D) and tunable = 1 (a Linear's product, whose
 * algorithm may be timed). Returns 0, or -1 when cuBLASLt has no algorithm for an accumulating product (the caller
 * falls back; a plain product without one is fatal). */
int dtc_gemm_run(dtc_state *st, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
                 const void *B, int64_t ldb, void *D, int64_t ldd, dt_dtype dtype_d, float alpha, const void *bias_bf16,
                 int accumulate, int tunable);
void dtc_gemm_cache_free(dtc_state *st);

/* ------------------------------------------------------------------ mixed-input GEMM (cuda_qgemm.cu) */
/* 4/8-bit weights in fragment order (see cuda_qgemm.cu): q packed, sb = (scale, bias) as [N/128][K/group][128]. */
struct dtc_qg_w {
    uint32_t *q;
    float2 *sb;        /* f32 pairs, or bf16x2 pairs {s,s},{b,b} when sb_bf16 */
    int64_t N, K;
    int bits, group;
    int sb_bf16;       /* 4-bit with bf16-exact scales/biases: dequantized with bf16x2 arithmetic */
};
/* Epilogue of dtc_qgemm: y = (x·Wᵀ + bias) ⊙ gate (+ y when accumulate); NULL members are skipped. */
struct dtc_qg_epi {
    const __nv_bfloat16 *bias;   /* [N] */
    const void *gate;            /* [N], bf16 or f32 (gate_f32) */
    int gate_f32, accumulate;
};
/* 1 when this device and Linear geometry can use it (sm_90, N % 128, K % 64, group 16·2^i). */
int dtc_qgemm_eligible(const dtc_state *st, int64_t N, int64_t K, int bits, int group);
/* Re-lay MLX-packed device weights qw [N, K·bits/32] and sb [N, K/group] into dst (pool allocations); -1 on OOM.
 * sb_bf16_exact: every scale and bias is exactly a bf16 value (the bf16x2 dequantization is then exact). */
int dtc_qgemm_pack(dtc_state *st, dtc_qg_w *dst, const uint32_t *qw, const float2 *sb, int64_t N, int64_t K, int bits,
                   int group, int sb_bf16_exact);
void dtc_qgemm_free(dtc_state *st, dtc_qg_w *w);
/* y[M,N] (bf16/f32) = epilogue(x[M,K] bf16 · Wᵀ). Returns -1 (nothing launched) when x's layout does not suit
 * the kernel (ld % 8, 16-byte alignment) or TMA is unavailable: the caller then dequantizes (dtc_qgemm_dequant). */
int dtc_qgemm(dtc_state *st, dt_mat y, dt_mat x, const dtc_qg_w *w, const dtc_qg_epi *e);
/* Dense bf16 [N, K] from the fragment order; rowscale ([N], bf16 or f32 when rs_f32) multiplies each row. */
void dtc_qgemm_dequant(dtc_state *st, __nv_bfloat16 *dst, const dtc_qg_w *w, const void *rowscale, int rs_f32);

/* ------------------------------------------------------------------ fp8 Linear (cuda_fp8.cu) */
/* 1 when the fp8 GEMM can take this Linear (in % 16 == 0, out % 16 == 0). */
int dtc_fp8_eligible(const dt_linear_src *src);
/* GGUF blocks (cuda_ggml.cu): whether a block type is supported, and dequantization of N rows of K values to bf16
 * dst [N, K] (rows scaled by rowscale [N] when given: bf16, or f32 when rs_f32), bit-identical to
 * bf16(quant/ggml_quants.h's reference). */
int dtc_ggml_supported(dt_dtype t);
void dtc_ggml_dequant(dtc_state *st, cudaStream_t stream, __nv_bfloat16 *dst, const uint8_t *src, dt_dtype t, int64_t N,
                      int64_t K, const void *rowscale, int rs_f32);
/* e4m3 weights [out, in] + per-output-channel scales from any source format; NULL with error set. */
dtc_fp8_w *dtc_fp8_weight_create(dtc_state *st, const dt_linear_src *src);
void dtc_fp8_weight_free(dtc_state *st, dtc_fp8_w *f);
/* y[M,N] (bf16/f32) = fp8(x[M,K]) · fp8(W)ᵀ (+ bias[N] bf16 or NULL): per-row activation quantization, then
 * one cuBLASLt e4m3 GEMM with outer-vector scales (or an epilogue pass where unsupported). */
void dtc_fp8_linear(dtc_state *st, dt_mat y, dt_mat x, const dtc_fp8_w *f, const __nv_bfloat16 *bias);
/* The activation scratch of the current queue: codes [M, K] (16-byte aligned) and row scales *sx [M]. */
uint8_t *dtc_fp8_act_scratch(dtc_state *st, int64_t M, int64_t K, float **sx);
/* x [M, K] (bf16/f32, any ld) -> codes [M, K] + row scales *sx [M] in that scratch (one pass); returns the codes. */
uint8_t *dtc_fp8_quant_act(dtc_state *st, dt_mat x, float **sx);
/* From activation codes xq [M, K] + row scales sx [M] (dtc_fp8_act_scratch's layout): acc = 0: x = xq · Wᵀ (+ bias);
 * acc = 1: x += gate ⊙ (xq · Wᵀ (+ bias)) (gate [1, N] bf16/f32, NULL data = plain add), in one GEMM where cuBLASLt
 * takes the gate as weight scales and x as C, else the product into a scratch and gated_add. */
void dtc_fp8_gemm_q(dt_backend *be, dt_mat x, const uint8_t *xq, const float *sx, const dtc_fp8_w *f,
                    const __nv_bfloat16 *bias, dt_mat gate, int acc);
/* The activation quantization pass alone (bench). */
void dtc_fp8_quant(dt_backend *be, dt_mat x);
/* How the scales are applied: "outer-vector (cuBLASLt)", "epilogue (...)" or "untested". */
const char *dtc_fp8_scale_mode(dtc_state *st);
/* fp8 attention inputs: q [Lq, Dq], k, v [Lk, Dk] (bf16, any ld) -> contiguous e4m3 codes q8/k8/v8 with one
 * scale per tensor (backend.h's definition). sc: 16-byte slots of 4 floats (cuDNN's scalar tensors): slot t =
 * 0..2 amax of q, k, v; 3..5 their scales amax/448; 6: 1/448 (P's descale); 7: 448 (P's scale); 8: O's scale
 * (1, or 448/amax(v) when o_fp8: an e4m3 output); 9, 10: cuDNN's amax outputs. */
void dtc_attn_fp8_quant(dtc_state *st, dt_mat q, dt_mat k, dt_mat v, uint8_t *q8, uint8_t *k8, uint8_t *v8,
                        float *sc, int o_fp8);
/* o (bf16, any ld) = src [o.rows, o.cols] (row stride lds elements): f16 (f8 = 0), or e4m3 codes times *scale. */
void dtc_attn_fp8_out(dtc_state *st, dt_mat o, const void *src, int64_t lds, int f8, const float *scale);
void dtc_fp8_cache_free(dtc_state *st);

/* ------------------------------------------------------------------ op entry points (per file) */
void dtc_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w);
void dtc_linear_gated_add(dt_backend *be, dt_mat x, dt_mat a, const dt_linear *w, dt_mat gate);
void dtc_norm_linear(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps, const dt_linear *w,
                     dt_mat a);
void dtc_rmsnorm_mod_linears(dt_backend *be, dt_mat x, dt_mat nw, dt_mat shift, float eps, dt_mat a, int n,
                             const dt_linear *const *w, const dt_mat *y);
void dtc_act_linear_gated(dt_backend *be, dt_mat x, dt_mat c, int64_t lead, dt_mat a, dt_mat b, dt_act act,
                          const dt_linear *w, dt_mat gate, dt_mat y);
void dtc_linear_prefetch(dt_backend *be, const dt_linear *w, dt_mat gate, int64_t rows);
/* MLX (scale, bias) pairs of src (BF16/F16/F32) as f32 pairs h[n]; returns 1 when every value is a bf16 value. */
int dtc_host_scales(const dt_linear_src *src, float2 *h, int64_t n);
void dtc_prefetch_forget(dtc_state *st);
dt_linear *dtc_linear_create(dt_backend *be, const dt_linear_src *src);
void dtc_linear_destroy(dt_backend *be, dt_linear *w);
const char *dtc_linear_path(dt_backend *be, const dt_linear *w);
int dtc_linear_on_host(dt_backend *be, const dt_linear *w);

void dtc_attention(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale,
                   dt_mat key_bias, int causal);
void dtc_attention_fp8(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale);
/* Attention (head dim 128, bf16, q/k/v/o as dtc_attention's fast path takes them) through cuDNN's fused SDPA
 * (cuda_cudnn.cu). pick (o.attn): CUDNN forces it (fatal if cuDNN cannot be loaded), OWN / MMA select our
 * kernels, AUTO = the measured default. Returns 0 when cuDNN ran it, 1 when the caller must (nothing queued).
 * kbias: F32 [1, Lk] additive key bias or NULL. */
int dtc_cudnn_attention(dtc_state *st, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, float scale,
                        const float *kbias, int causal, dt_cuda_attn pick);
int dtc_cudnn_version(dtc_state *st);       /* cudnnGetVersion() of the loaded library, 0 = unavailable */
long long dtc_cudnn_calls(dtc_state *st);   /* attention calls run by cuDNN so far */
void dtc_cudnn_destroy(dtc_state *st);
/* fp8 attention (backend.h: attention_fp8) through cuDNN's fp8 SDPA: q/k/v quantized per tensor
 * (dtc_attn_fp8_quant), O in bf16 where cuDNN can write it, else f16 or e4m3 (Hopper: e4m3 only) + one widening
 * pass (dtc_attn_fp8_out). No key bias, no mask.
 * Returns 0 when it ran; 1 when it cannot (cuDNN unavailable or no fp8 plan: *why says which). */
int dtc_cudnn_attention_fp8(dtc_state *st, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd,
                            float scale, const char **why);

void dtc_layernorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps);
/* The fp8 Linear's activation form (codes q [M, K] row stride K, one scale per row s [M]: dtc_fp8_quant_act's layout)
 * written straight from the producing op, the same codes and scales as the op's bf16 output quantized by
 * dtc_fp8_quant_act (bit for bit). 0 = queued; -1 = this layout or length is not taken (nothing queued).
 * layernorm_mod of x [M, D] (bf16 or f32 rows of 16-byte vectors): */
int dtc_layernorm_mod_e4m3(dtc_state *st, dt_mat x, dt_mat shift, dt_mat scale, float eps, uint8_t *q, float *s);
/* rows [lead | act(a) ⊙ b] of K = lead.cols + a.cols (all bf16, 16-byte vectors; lead may have 0 columns; b NULL
 * data: act(a)): */
int dtc_act_e4m3(dtc_state *st, dt_mat lead, dt_mat a, dt_mat b, dt_act act, uint8_t *q, float *s);
void dtc_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, float w_offset, float eps);
void dtc_rmsnorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, dt_mat shift, float eps);
/* rmsnorm_mod of x [M, D] (bf16 or f32 rows of 16-byte vectors) in the fp8 Linear's activation form (as
 * dtc_layernorm_mod_e4m3): */
int dtc_rmsnorm_mod_e4m3(dtc_state *st, dt_mat x, dt_mat w, dt_mat shift, float eps, uint8_t *q, float *s);
void dtc_head_norm_rope(dt_backend *be, dt_mat x, int heads, int hd, dt_mat w, float eps, dt_mat cos, dt_mat sin,
                        dt_rope_mode mode);
void dtc_act_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b, dt_act act);
void dtc_gated_add(dt_backend *be, dt_mat x, dt_mat gate, dt_mat y);
void dtc_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b);
void dtc_axpby(dt_backend *be, dt_mat y, float alpha, dt_mat a, float beta, dt_mat b);
void dtc_flow_step(dt_backend *be, dt_mat x, dt_mat v, dt_mat u, float guidance, int from_cond, float dt);
void dtc_copy(dt_backend *be, dt_mat dst, dt_mat src);
void dtc_transpose(dt_backend *be, dt_mat y, dt_mat x);
void dtc_abs_diff_sums(dt_backend *be, dt_mat a, dt_mat b, double out[2]);
/* Upload helpers: convert a device buffer of `n` elements of dtype `t` (F32/F16/BF16) into bf16. */
void dtc_convert_to_bf16(dtc_state *st, __nv_bfloat16 *dst, const void *src, dt_dtype t, int64_t n);
/* Add a bias vector bias[cols] (bf16) to each row of m (bf16 or f32). */
void dtc_add_row_bias(dtc_state *st, dt_mat m, const __nv_bfloat16 *bias);
/* Add bias[rows] (f32) to each column of m: m[r, c] += bias[r]. */
void dtc_add_col_bias(dtc_state *st, dt_mat m, const float *bias);

dt_conv *dtc_conv_create(dt_backend *be, const float *w, const float *bias, int cout, int cin, int k, int pad);
void dtc_conv_destroy(dt_backend *be, dt_conv *c);
void dtc_conv2d(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w);
void dtc_conv2d_strided(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w, int stride, int pad_top,
                        int pad_left, int pad_bottom, int pad_right);
void dtc_group_norm(dt_backend *be, dt_mat y, dt_mat x, int groups, dt_mat gamma, dt_mat beta, float eps, int silu);
void dtc_upsample2x(dt_backend *be, dt_mat y, dt_mat x, int h, int w);
void dtc_channel_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat gamma, int silu);

/* ------------------------------------------------------------------ host helpers */
static inline int dtc_is_bf16(const dt_mat &m) { return m.dtype == DT_BF16; }
static inline int dtc_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
/* A bf16 matrix whose rows can be read as 16-byte vectors. */
static inline int dtc_vec8_ok(const dt_mat &m) {
    return m.dtype == DT_BF16 && dtc_aligned16(m.data) && (m.ld % 8) == 0 && (m.cols % 8) == 0;
}
static inline unsigned dtc_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 2147483647LL) b = 2147483647LL;
    return (unsigned)b;
}

/* ------------------------------------------------------------------ device helpers */
/* A strided matrix as kernels see it. isbf: 1 = bf16 elements, 0 = f32. */
struct dmat {
    void *p;
    int64_t ld;
    int isbf;
};
static inline dmat dtc_dm(const dt_mat &m) {
    dmat d;
    d.p = m.data;
    d.ld = m.ld;
    d.isbf = m.dtype == DT_BF16;
    return d;
}

__device__ __forceinline__ float dm_get(const dmat &m, int64_t r, int64_t c) {
    if (m.isbf) return __bfloat162float(((const __nv_bfloat16 *)m.p)[r * m.ld + c]);
    return ((const float *)m.p)[r * m.ld + c];
}
__device__ __forceinline__ void dm_set(const dmat &m, int64_t r, int64_t c, float v) {
    if (m.isbf) ((__nv_bfloat16 *)m.p)[r * m.ld + c] = __float2bfloat16_rn(v);
    else ((float *)m.p)[r * m.ld + c] = v;
}
__device__ __forceinline__ float bfr(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

/* 8 bf16 packed in a uint4 <-> 8 floats */
__device__ __forceinline__ void bf8_to_f(const uint4 &u, float *f) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ uint4 f_to_bf8(const float *f) {
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return u;
}
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Block-wide sum (MAX = 0) or max (MAX = 1; of non-negative values: empty slots count as 0); `sh` needs 32
 * floats. All threads get the result. */
template <int MAX>
__device__ __forceinline__ float block_reduce(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.f;
    return MAX ? warp_max(t) : warp_sum(t);
}
__device__ __forceinline__ float block_sum(float v, float *sh) { return block_reduce<0>(v, sh); }
__device__ __forceinline__ float block_max(float v, float *sh) { return block_reduce<1>(v, sh); }

/* e4m3 codes as core/fp8.c computes them: one f32 product, RNE, saturating. */
__device__ __forceinline__ uint8_t f2e4m3(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
/* 8 codes e4m3(f[i] * inv) packed for one 8-byte store. */
__device__ __forceinline__ uint2 e4m3x8(const float *f, float inv) {
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(f[4 * h], inv), __fmul_rn(f[4 * h + 1], inv)),
                                               __NV_SATFINITE, __NV_E4M3);
        uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(f[4 * h + 2], inv), __fmul_rn(f[4 * h + 3], inv)),
                                               __NV_SATFINITE, __NV_E4M3);
        w[h] = lo | (hi << 16);
    }
    return make_uint2(w[0], w[1]);
}

/* ---- PTX wrappers (sm_80+) ---- */
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                  uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
/* D(16x8 f32) += A(16x16 bf16, row) * B(16x8 bf16, col) */
__device__ __forceinline__ void mma_bf16_16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
