/* backend.h — the op interface every model is written against (CPU reference, CUDA, ...).
 *
 * Model code never touches CUDA or raw activation memory: it allocates matrices through the
 * backend, uploads/downloads f32 host arrays, and calls the ops below. A matrix (dt_mat) is a
 * row-major 2-D view: `rows` x `cols` elements with row stride `ld` (elements), of dtype
 * `dtype`. Activations use the backend's act_dtype (F32 on CPU, BF16 on CUDA); parameters such
 * as norm weights, RoPE tables and masks are F32 ("param" matrices). Views: dt_mat_rows /
 * dt_mat_cols give sub-matrices without copies (splits/concats folded into strides).
 *
 * Shapes in comments: [rows, cols]. L = tokens, H = heads, hd = head dim, D = H*hd.
 * All ops may be asynchronous; dt_backend.sync() waits and reports device errors.
 * Device errors inside ops are fatal: the backend prints one clear line and exits(1).
 */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H

#include <math.h>
#include <stdint.h>

#include "../core/common.h"
#include "../core/linear_src.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *data;        /* backend memory (host pointer on CPU, device pointer on CUDA) */
    int64_t rows, cols;
    int64_t ld;        /* row stride in elements (>= cols) */
    dt_dtype dtype;    /* F32 or BF16 */
} dt_mat;

static inline dt_mat dt_mat_rows(dt_mat m, int64_t r0, int64_t n) {
    dt_mat v = m; v.data = (char *)m.data + (size_t)(r0 * m.ld) * dt_dtype_size(m.dtype); v.rows = n; return v;
}
static inline dt_mat dt_mat_cols(dt_mat m, int64_t c0, int64_t n) {
    dt_mat v = m; v.data = (char *)m.data + (size_t)c0 * dt_dtype_size(m.dtype); v.cols = n; return v;
}
/* Reinterpret a contiguous matrix with a new row length (rows*cols must match; ld == cols required). */
static inline dt_mat dt_mat_reshape(dt_mat m, int64_t rows, int64_t cols) {
    dt_mat v = m; v.rows = rows; v.cols = cols; v.ld = cols; return v;
}

typedef struct dt_linear dt_linear;   /* backend-prepared Linear weights (opaque) */
typedef struct dt_conv dt_conv;       /* backend-prepared 2-D convolution (opaque) */

/* How quantized Linears are executed (CUDA; CPU always dequantizes per tile). */
typedef enum {
    DT_QPATH_AUTO = 0,     /* backend picks per shape */
    DT_QPATH_FUSED,        /* qmm: dequantize inside the GEMM main loop */
    DT_QPATH_TRANSIENT,    /* dequantize the layer to dense just before a dense GEMM */
    DT_QPATH_CACHED,       /* dequantize once at load, keep dense */
    DT_QPATH_MIXED,        /* sm_90a: weights re-laid at load, dequantized in registers inside a wgmma GEMM */
} dt_qpath;

typedef enum { DT_ROPE_NONE = 0, DT_ROPE_INTERLEAVED, DT_ROPE_HALF } dt_rope_mode;
typedef enum { DT_ACT_SILU = 0, DT_ACT_GELU_TANH, DT_ACT_GELU_ERF, DT_ACT_SIGMOID } dt_act;

struct dt_cuda_opts;   /* the CUDA backend's own options (backends/backend_cuda.h) */

/* Options given when creating a backend: typed run-time choices, set by the caller (CLI flags, the API, tests,
 * the bench); no backend reads the environment per op. A zero-filled struct is a valid default (rope_fp32 = 0
 * aside: callers set it to 1, the measured default). What a model runs in (--precision, --attn-precision) is the
 * model's load option, not the backend's (e.g. flux2_load_opts; each Linear's request is dt_linear_src.precision). */
typedef struct {
    int threads;            /* CPU threads (0 = all cores) */
    int device;             /* CUDA device index */
    dt_qpath qpath;         /* quantized Linear path */
    int rope_fp32;          /* rotate in f32 (1) or with bf16 products (0; CUDA only, the CPU always uses f32) */
    const struct dt_cuda_opts *cuda;   /* CUDA backend options (NULL: dt_cuda_opts_from_env); on a created CUDA
                                        * backend, its live copy (dt_backend_cuda_opts) */
    int verbose;            /* -v: device facts; models log the paths of their Linears at load (dt_linear_paths) */
} dt_backend_opts;

/* The backend: a table of function pointers in four groups, each slot declared once in the DT_BACKEND_SLOTS list
 * below (the struct takes its slots from it, and the trace wrapper backend_trace.c wraps every slot from the same
 * list, so a new op cannot go untraced):
 *   1. memory and weights     every backend
 *   2. core ops               every backend; the CPU backend is the reference the others are tested against
 *   3. fused ops              one op where a backend can do two in one pass; each has its composed form below
 *                             the struct (what the CPU backend runs), so models call them unconditionally
 *   4. execution (optional)   queues, graph capture, prefetch hints: NULL where the backend has one queue
 * and get_ext: the optional extensions (profiling, the fp8 Linear's internals, ...; backends/backend_ext.h), looked
 * up by name.
 * Each list entry is V(name, params, args) for a slot returning nothing or R(type, name, params, args) for one
 * returning `type`: params its parameters, args the same names as a call's arguments. */
typedef struct dt_backend dt_backend;

#define DT_BACKEND_SLOTS(V, R) \
    V(destroy, (dt_backend *be), (be)) \
    \
    /* ---- 1. memory and weights ---- */ \
    /* Allocate a contiguous rows x cols matrix of dtype (act_dtype or F32). 0 ok, -1 error. */ \
    R(int, alloc, (dt_backend *be, dt_mat *m, int64_t rows, int64_t cols, dt_dtype dtype), (be, m, rows, cols, dtype)) \
    V(free, (dt_backend *be, dt_mat *m), (be, m)) \
    /* Copy host f32 [rows, cols] (contiguous) into m (converted to m.dtype). */ \
    V(upload, (dt_backend *be, dt_mat m, const float *src), (be, m, src)) \
    /* Copy m into host f32 [rows, cols] (contiguous). Synchronizes. */ \
    V(download, (dt_backend *be, float *dst, dt_mat m), (be, dst, m)) \
    /* Wait for all queued work. 0 ok, -1 error (message set). */ \
    R(int, sync, (dt_backend *be), (be)) \
    /* Bytes of device memory currently allocated, and the peak the backend held at once (CUDA: its allocations \
     * plus its cache of freed blocks, i.e. what it took from cudaMalloc; for reports). */ \
    V(mem_stats, (dt_backend *be, size_t *current, size_t *peak), (be, current, peak)) \
    \
    /* Prepare a Linear from host views (CPU: zero-copy; CUDA: upload / repack). NULL on error. \
     * src->precision == DT_PREC_FP8: weights become e4m3 codes with one f32 scale per output channel \
     * (amax/448, dequantized in f32 first), activations are quantized per row at run time (core/fp8.h); \
     * a backend may keep a Linear whose shape its fp8 GEMM cannot take in bf16 (CUDA: in/out % 16). \
     * src->fp8_unfused: how that Linear takes its input in the fused ops (core/linear_src.h). */ \
    R(dt_linear *, linear_create, (dt_backend *be, const dt_linear_src *src), (be, src)) \
    V(linear_destroy, (dt_backend *be, dt_linear *w), (be, w)) \
    /* How a prepared Linear runs, in words ("dense bf16, cuBLASLt", "transient: dequantized to bf16 before each \
     * cuBLASLt GEMM", ...): what the -v summary of a model's Linears names (dt_linear_paths). The string lives as \
     * long as the Linear. */ \
    R(const char *, linear_path, (dt_backend *be, const dt_linear *w), (be, w)) \
    /* 2-D convolution weights w [cout, cin, k, k] f32 host, bias [cout] (may be NULL), stride 1, \
     * zero padding `pad`. */ \
    R(dt_conv *, conv_create, (dt_backend *be, const float *w, const float *bias, int cout, int cin, int k, int pad), \
      (be, w, bias, cout, cin, k, pad)) \
    V(conv_destroy, (dt_backend *be, dt_conv *c), (be, c)) \
    \
    /* ---- 2. core ops ---- */ \
    /* y[M,N] = x[M,K] · Wᵀ (+ bias). W is [N,K]. y must not alias x. */ \
    V(linear, (dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w), (be, y, x, w)) \
    /* y[M,D] = LN(x[M,D]) * (1 + scale) + shift; LN without affine, eps. \
     * scale/shift: [1, D] act (broadcast over rows) or NULL data (treated as 0). y may alias x. */ \
    V(layernorm_mod, (dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps), \
      (be, y, x, shift, scale, eps)) \
    /* y[M,D] = x * rsqrt(mean(x^2) + eps) * (w + w_offset); w [1, D] F32 param or NULL data (=1). \
     * w_offset: 0 normal, 1 zero-centred weights (Krea 2). y may alias x. */ \
    V(rmsnorm, (dt_backend *be, dt_mat y, dt_mat x, dt_mat w, float w_offset, float eps), (be, y, x, w, w_offset, eps)) \
    /* The modulated RMSNorm (Krea 2's, the modulation's scale folded into w): y[M,D] = rmsnorm(x, w, 0, eps) + shift, \
     * the norm's product rounded to y's dtype before the shift is added (what rmsnorm then gated_add(y, shift, \
     * ones) give, in one pass). w [1, D] F32 param or NULL data (= 1); shift [1, D] act or F32, or NULL data \
     * (none). y may alias x. */ \
    V(rmsnorm_mod, (dt_backend *be, dt_mat y, dt_mat x, dt_mat w, dt_mat shift, float eps), (be, y, x, w, shift, eps)) \
    /* In place on x[L, H*hd]: per head RMSNorm over hd with weight w [1, hd] F32 (NULL data = no norm), \
     * then RoPE with cos/sin [L, hd] F32 tables (mode NONE = no rotation). \
     * INTERLEAVED pairs (2k, 2k+1); HALF pairs (i, i+hd/2). */ \
    V(head_norm_rope, (dt_backend *be, dt_mat x, int heads, int hd, dt_mat w, float eps, dt_mat cos, dt_mat sin, \
                       dt_rope_mode mode), (be, x, heads, hd, w, eps, cos, sin, mode)) \
    /* Scaled dot-product attention. \
     * o [Lq, Hq*hd], q [Lq, Hq*hd], k/v [Lk, Hkv*hd]; Hq % Hkv == 0, q head h uses kv head h/(Hq/Hkv). \
     * key_bias: [1, Lk] F32 additive (0 or -INFINITY for padding) or NULL data. \
     * causal: query i attends keys j <= i. scale usually 1/sqrt(hd). */ \
    V(attention, (dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale, \
                  dt_mat key_bias, int causal), (be, o, q, k, v, hq, hkv, hd, scale, key_bias, causal)) \
    /* fp8 attention (optional: NULL where the backend has none; attention_fp8_off says why), shapes as attention, \
     * no bias or mask: \
     *   s_x = amax(x)/448 per tensor (q over its Lq x Hq*hd values, k and v likewise; 1 when amax is 0), \
     *   x8 = e4m3(x * (448/amax(x)))  (core/fp8.h's rounding), \
     *   S = scale * s_q * s_k * (q8 · k8ᵀ), P = softmax(S) in f32, P8 = e4m3(448 * P), \
     *   O = (s_v / 448) * (P8 · v8). \
     * The CPU backend computes exactly this; CUDA runs cuDNN's fp8 flash attention, which quantizes the \
     * unnormalized exp(S - running max) instead of P (a different rounding of the same values). */ \
    V(attention_fp8, (dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale), \
      (be, o, q, k, v, hq, hkv, hd, scale)) \
    /* y = act(a) * b elementwise (SwiGLU when act = SILU); b NULL data => y = act(a). y may alias a or b. */ \
    V(act_mul, (dt_backend *be, dt_mat y, dt_mat a, dt_mat b, dt_act act), (be, y, a, b, act)) \
    /* x += gate ⊙ y; gate [1, D] act broadcast over rows, or NULL data (plain add). */ \
    V(gated_add, (dt_backend *be, dt_mat x, dt_mat gate, dt_mat y), (be, x, gate, y)) \
    /* y = a * b elementwise (same shapes) — e.g. sigmoid-gated attention output. */ \
    V(mul, (dt_backend *be, dt_mat y, dt_mat a, dt_mat b), (be, y, a, b)) \
    /* y = alpha * a + beta * b (same shapes; b NULL data => y = alpha * a). y may alias a or b. */ \
    V(axpby, (dt_backend *be, dt_mat y, float alpha, dt_mat a, float beta, dt_mat b), (be, y, alpha, a, beta, b)) \
    /* dst = src (same shape; any strides; dtype conversion allowed). */ \
    V(copy, (dt_backend *be, dt_mat dst, dt_mat src), (be, dst, src)) \
    /* y[N, M] = x[M, N]ᵀ. */ \
    V(transpose, (dt_backend *be, dt_mat y, dt_mat x), (be, y, x)) \
    /* out[0] = Σ |a − b| and out[1] = Σ |b| over every element of a, b (same shape, F32 or BF16, any strides), \
     * each element widened to f32 and summed in double (First Block Cache's decision, models/block_cache.h). \
     * Synchronizes: the sums are on the host when it returns. */ \
    V(abs_diff_sums, (dt_backend *be, dt_mat a, dt_mat b, double out[2]), (be, a, b, out)) \
    /* Image ops (VAE). Images are [C, H*W] (channel-major, NCHW with N=1). */ \
    /* y [cout, H*W] = conv(x [cin, H*W]) with stride 1, same-size output (pad = k/2). */ \
    V(conv2d, (dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w), (be, y, x, c, h, w)) \
    /* y [cout, ho*wo] = conv(x [cin, h*w]) with stride `stride` and zero padding pad_top/left/bottom/right \
     * given here (the conv's own pad is not used), ho = (h + pad_top + pad_bottom - k)/stride + 1, wo likewise \
     * (integer division). The VAE encoder's Downsample2D: stride 2, pads (0, 0, 1, 1) (bottom and right only). */ \
    V(conv2d_strided, (dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w, int stride, int pad_top, \
                       int pad_left, int pad_bottom, int pad_right), \
      (be, y, x, c, h, w, stride, pad_top, pad_left, pad_bottom, pad_right)) \
    /* GroupNorm over [C, HW] with `groups`, affine gamma/beta [1, C] F32; optional fused SiLU. */ \
    V(group_norm, (dt_backend *be, dt_mat y, dt_mat x, int groups, dt_mat gamma, dt_mat beta, float eps, int silu), \
      (be, y, x, groups, gamma, beta, eps, silu)) \
    /* y [C, 4*H*W] = nearest-neighbour 2x upsample of x [C, H*W]. */ \
    V(upsample2x, (dt_backend *be, dt_mat y, dt_mat x, int h, int w), (be, y, x, h, w)) \
    /* RMS norm over the channels of each pixel (the Qwen-Image VAE's RMS_norm, F.normalize over C): \
     * y[c, p] = x[c, p] / max(||x[:, p]||₂, 1e-12) · sqrt(C) · gamma[c] on x [C, H*W]; gamma [1, C] F32 \
     * (NULL data = 1); silu = 1 applies SiLU to the result. y may alias x. */ \
    V(channel_rmsnorm, (dt_backend *be, dt_mat y, dt_mat x, dt_mat gamma, int silu), (be, y, x, gamma, silu)) \
    /* The decoded image x [3, H*W] (values in [-1, 1]) into host dst [H*W, 3] 8-bit RGB, each value as \
     * dt_image_u8 maps it. Synchronizes. Optional (NULL: dt_image_rgb8 downloads f32 and converts on the host); \
     * CUDA converts on the device and copies a quarter of the bytes. */ \
    V(image_rgb8, (dt_backend *be, uint8_t *dst, dt_mat x), (be, dst, x)) \
    /* The flow-matching sampler's step on the latents x [rows, cols] F32, in place (pipeline/sampler.c keeps them \
     * on the backend between steps): x = x + dt · w, w = dt_flow_guided(v, u, guidance, from_cond) per element, or \
     * w = v when u has NULL data; v and u F32 of x's shape. Each operation rounded to f32 in dt_flow_guided's order, \
     * so every backend equals the host loop (dt_sample's) bit for bit. Every backend. */ \
    V(flow_step, (dt_backend *be, dt_mat x, dt_mat v, dt_mat u, float guidance, int from_cond, float dt), \
      (be, x, v, u, guidance, from_cond, dt)) \
    \
    /* ---- 3. fused ops (composed forms: below the struct) ---- */ \
    /* x[M,N] += gate ⊙ (a[M,K] · Wᵀ): a Linear whose output goes straight into a gated residual (the output \
     * projections of the FLUX blocks). gate [1, N] act or F32 broadcast over rows; x must not alias a. \
     * Optional (NULL: callers use dt_linear_gated, linear into a scratch, then gated_add). */ \
    V(linear_gated_add, (dt_backend *be, dt_mat x, dt_mat a, const dt_linear *w, dt_mat gate), (be, x, a, w, gate)) \
    /* y[M,N] = layernorm_mod(x[M,D], shift, scale, eps) · Wᵀ (+ bias): the norm into a (scratch [M, D], act \
     * dtype), then linear. A backend may feed W without writing a (CUDA, fp8 Linears: the norm writes the e4m3 \
     * activation codes and row scales the fp8 GEMM reads, the same values linear would compute from a), so a's \
     * contents are undefined afterwards. Every backend sets it (dt_norm_linear_composed where it fuses nothing). */ \
    V(norm_linear, (dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps, const dt_linear *w, \
                    dt_mat a), (be, y, x, shift, scale, eps, w, a)) \
    /* y[i][M,N_i] = rmsnorm_mod(x[M,D], nw, shift, eps) · W[i]ᵀ (+ bias) for i < n: the norm into a (scratch \
     * [M, D], act dtype) once, then the n Linears on it (Krea 2's q/k/v/gate, its SwiGLU's gate/up). A backend may feed the W[i] without writing a (CUDA, when every W[i] is an \
     * fp8 Linear: the norm writes the e4m3 codes and row scales once, the same values linear would compute from a, \
     * and each fp8 GEMM reads them), so a's contents are undefined afterwards. Every backend sets it \
     * (dt_rmsnorm_mod_linears_composed where it fuses nothing). */ \
    V(rmsnorm_mod_linears, (dt_backend *be, dt_mat x, dt_mat nw, dt_mat shift, float eps, dt_mat a, int n, \
                            const dt_linear *const *w, const dt_mat *y), (be, x, nw, shift, eps, a, n, w, y)) \
    /* x[M,N] += gate ⊙ (c[M,K] · Wᵀ) after c[:, lead:] = act(a) ⊙ b (a, b [M, K-lead]; c[:, :lead] as given): \
     * act_mul into c's columns from `lead` on, then dt_linear_gated (gate NULL data: plain add). A backend may \
     * feed W without writing c[:, lead:] (CUDA, fp8 Linears: one pass from c[:, :lead], a and b to the e4m3 codes \
     * and row scales of the whole row), so those columns are undefined afterwards. Every backend sets it \
     * (dt_act_linear_gated_composed where it fuses nothing; y is its scratch [M, N] where linear_gated_add is \
     * NULL). */ \
    V(act_linear_gated, (dt_backend *be, dt_mat x, dt_mat c, int64_t lead, dt_mat a, dt_mat b, dt_act act, \
                         const dt_linear *w, dt_mat gate, dt_mat y), (be, x, c, lead, a, b, act, w, gate, y)) \
    \
    /* ---- 4. execution (optional: NULL when unsupported) ---- */ \
    /* Graph capture of the ops issued between capture_begin and capture_end (fixed shapes and \
     * buffers); graph_launch replays it. Allocation inside a capture is not allowed. */ \
    R(int, capture_begin, (dt_backend *be), (be)) \
    R(void *, capture_end, (dt_backend *be), (be)) \
    R(int, graph_launch, (dt_backend *be, void *graph), (be, graph)) \
    V(graph_destroy, (dt_backend *be, void *graph), (be, graph)) \
    /* Two queues (NULL = one queue, everything serial): ops issued after this call go to queue q (0 = main, \
     * 1 = side). wait = 1: queue q first waits for all work issued so far on the other queue. Ops on the two \
     * queues may run concurrently, so the caller must give them disjoint data. Work must be back on queue 0 \
     * and joined (a switch to 0 with wait = 1) before download, sync, event timing or capture_end. */ \
    V(stream_switch, (dt_backend *be, int q, int wait), (be, q, wait)) \
    /* Hint (NULL: none): the next Linear this queue runs with weights w is on `rows` tokens — through \
     * linear_gated_add with this gate when gate.data is set, else through linear. A backend may prepare the \
     * weights now, overlapping the ops queued before (CUDA: the transient dequantization of 4/8-bit weights on a \
     * low-priority stream; host weights: their packed form copied to the device by the copy engine first). The gate's values must be final when this is called. Results are the same with or \
     * without the hint; a hint no Linear matches costs only its own work. */ \
    V(linear_prefetch, (dt_backend *be, const dt_linear *w, dt_mat gate, int64_t rows), (be, w, gate, rows)) \
    /* 1 when w's weights stay in host memory and each use reads them over the bus (CUDA: host weights, the packed \
     * 4/8-bit weights in mapped pinned memory read by each dequantization): its transfer, not compute, bounds the \
     * Linear, so a linear_prefetch hint overlaps it with whatever is queued before, GEMMs included. NULL: 0 (every \
     * Linear's weights on the device). */ \
    R(int, linear_on_host, (dt_backend *be, const dt_linear *w), (be, w)) \
    \
    /* The extension called `name` (backends/backend_ext.h: DT_EXT_PROFILING, DT_EXT_FP8_INTERNALS), a pointer to \
     * its table of functions (each called with this be), or NULL where the backend has none. Optional (NULL: no \
     * extension). */ \
    R(const void *, get_ext, (dt_backend *be, const char *name), (be, name))

#define DT_BACKEND_SLOT_V(name, params, args) void (*name) params;
#define DT_BACKEND_SLOT_R(type, name, params, args) type (*name) params;
struct dt_backend {
    const char *name;       /* "cpu", "cuda" */
    dt_dtype act_dtype;     /* activation dtype */
    dt_backend_opts opts;
    void *impl;             /* backend private state */
    /* Why attention_fp8 is NULL on a backend that could have it (NULL: no reason to give), for error messages. */
    const char *attention_fp8_off;

    /* the function slots, all after the data members (tests/test_backend_slots.c checks that none is declared
     * outside DT_BACKEND_SLOTS) */
    DT_BACKEND_SLOTS(DT_BACKEND_SLOT_V, DT_BACKEND_SLOT_R)
};

/* Classifier-free guidance of one velocity value: v = the prompt's, u = the negative prompt's. from_cond (Krea 2):
 * v + g·(v − u); else (FLUX.2) u + g·(v − u). The f32 operations every sampler path rounds in this order. */
static inline float dt_flow_guided(float v, float u, float g, int from_cond) {
    const float d = v - u, s = g * d;
    return from_cond ? v + s : u + s;
}

/* ---- the fused ops' composed forms (backend.c): what a backend without the fused kernel runs ---- */
/* x += gate ⊙ (a · Wᵀ): the backend's fused linear_gated_add, else linear into y (a scratch of x's shape) and
 * gated_add. */
static inline void dt_linear_gated(dt_backend *be, dt_mat x, dt_mat a, const dt_linear *w, dt_mat gate, dt_mat y) {
    if (be->linear_gated_add) {
        be->linear_gated_add(be, x, a, w, gate);
    } else {
        be->linear(be, y, a, w);
        be->gated_add(be, x, gate, y);
    }
}
/* One decoded value in [-1, 1] as diffusers' image post-processing maps it: v / 2 + 0.5 clamped to [0, 1] (NaN ->
 * 0) into *unit (may be NULL), and round-half-even of that · 255 returned. Every path to 8-bit pixels uses this
 * (the CUDA kernel repeats it operation for operation, so the bytes are the same). */
static inline uint8_t dt_image_u8(float v, float *unit) {
    float f = v / 2.0f + 0.5f;
    if (!(f >= 0.0f)) f = 0.0f;
    if (f > 1.0f) f = 1.0f;
    if (unit) *unit = f;
    return (uint8_t)nearbyintf(f * 255.0f);
}
/* Host planes x [3, hw] to interleaved u8 [hw, 3] by dt_image_u8 (u8 may be NULL), and the clamped values to unit
 * [hw, 3] (may be NULL). */
void dt_image_planes_u8(const float *x, size_t hw, uint8_t *u8, float *unit);
/* image_rgb8 where the backend has it, else download (f32 [3, H*W]) and dt_image_planes_u8 on the host. */
void dt_image_rgb8(dt_backend *be, uint8_t *dst, dt_mat x);
/* norm_linear and act_linear_gated as two ops each; rmsnorm_mod_linears as rmsnorm_mod and n linears. */
void dt_norm_linear_composed(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps,
                             const dt_linear *w, dt_mat a);
void dt_rmsnorm_mod_linears_composed(dt_backend *be, dt_mat x, dt_mat nw, dt_mat shift, float eps, dt_mat a, int n,
                                     const dt_linear *const *w, const dt_mat *y);
void dt_act_linear_gated_composed(dt_backend *be, dt_mat x, dt_mat c, int64_t lead, dt_mat a, dt_mat b, dt_act act,
                                  const dt_linear *w, dt_mat gate, dt_mat y);

/* ---- the optional execution ops, as no-ops where a backend lacks them ---- */
/* linear_prefetch where the backend has it (w NULL: nothing). */
static inline void dt_prefetch(dt_backend *be, const dt_linear *w, dt_mat gate, int64_t rows) {
    if (be->linear_prefetch && w) be->linear_prefetch(be, w, gate, rows);
}
/* linear_on_host where the backend has it (w NULL: 0). */
static inline int dt_linear_on_host(dt_backend *be, const dt_linear *w) {
    return be->linear_on_host && w && be->linear_on_host(be, w);
}
/* Queue for the next ops (stream_switch; a no-op on one-queue backends). */
static inline void dt_on_queue(dt_backend *be, int q, int wait) {
    if (be->stream_switch) be->stream_switch(be, q, wait);
}

/* ---- creation ---- */
/* Create backends. NULL with dt_last_error() set when unavailable. (CUDA's own options and facts:
 * backends/backend_cuda.h.) */
dt_backend *dt_backend_cpu_create(const dt_backend_opts *opts);
dt_backend *dt_backend_cuda_create(const dt_backend_opts *opts);   /* stub returning NULL without CUDA */
int dt_backend_cuda_available(void);                               /* 1 if a CUDA GPU can be used */
int dt_backend_cuda_device_count(void);                            /* CUDA devices visible (0 without CUDA) */
/* By name: "cpu", "cuda", or "auto" (cuda when available, else cpu). */
dt_backend *dt_backend_create(const char *name, const dt_backend_opts *opts);

/* The -v summary of a model's Linears: how many of each stored format take each path (linear_path). A model loader
 * adds every Linear it prepares and logs the tally once at the end of its load, with opts.verbose, e.g.
 *   ditrun: cuda: transformer: 40 Linears q4 g64: transient: dequantized to bf16 before each cuBLASLt GEMM
 * Kinds beyond DT_LINEAR_PATHS_MAX are counted together. */
#define DT_LINEAR_PATHS_MAX 16
typedef struct {
    struct { char fmt[24]; char path[128]; int n; } kind[DT_LINEAR_PATHS_MAX];
    int nkind, other;
} dt_linear_paths;
void dt_linear_paths_add(dt_linear_paths *t, dt_backend *be, const dt_linear_src *src, const dt_linear *w);
void dt_linear_paths_log(const dt_linear_paths *t, const dt_backend *be, const char *what);
/* The stored format of a Linear's weights as the summaries name it: "bf16", "f16", "f32", "q4 g64", "e4m3",
 * "e5m2", or a GGUF block type ("Q4_K"). */
void dt_linear_src_format(const dt_linear_src *src, char *buf, size_t n);

/* Convenience: allocate or exit with the backend's error. */
dt_mat dt_alloc_or_die(dt_backend *be, int64_t rows, int64_t cols, dt_dtype dtype);
/* Upload a host f32 vector as a [1, n] F32 param matrix. */
dt_mat dt_param_upload(dt_backend *be, const float *src, int64_t n);
static inline dt_mat dt_mat_null(void) { dt_mat m = {0}; return m; }

#ifdef __cplusplus
}
#endif
#endif
