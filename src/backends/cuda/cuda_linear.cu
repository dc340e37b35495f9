/* cuda_linear.cu — Linear layers on the GPU: the cuBLASLt GEMM helper (bf16 x bf16 -> bf16/f32, fp32
 * accumulation, heuristic algorithm cached per shape/alignment, optional bias epilogue), weight upload
 * (dense F32/F16/BF16 -> bf16; MLX affine 4/8-bit kept packed or dequantized), and the three quantized
 * execution paths:
 *   CACHED     dequantize once at linear_create, then dense GEMMs;
 *   TRANSIENT  keep packed; dequantize into a reused bf16 scratch right before each cuBLASLt GEMM;
 *   FUSED      "qmm": packed tiles are loaded into shared memory (cp.async, 3 stages), dequantized into a
 *              bf16 shared tile inside the main loop, and multiplied with mma.sync m16n8k16 (fp32 accum);
 *              split-K over the reduction for small grids.
 * All three dequantize w = fmaf(scale, q, bias) in fp32 and round to bf16, so they agree up to the GEMM's
 * summation order. */
#include <string.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "cuda_common.cuh"

/* ------------------------------------------------------------------ cuBLASLt helper */
/* Algorithm choice. cuBLASLt's heuristic ranks its kernels by a model, and its first pick is not always the
 * fastest at our shapes. With tuning on (default; option gemm_tune = 0 turns it off) the first call at a new
 * shape/stride/alignment of a Linear's GEMM of >= 2 GFLOP and >= 1024 tokens (the products a denoising loop
 * repeats; one-shot work such as the text encoder, the VAE convolutions and the attention fallback keeps the
 * heuristic's pick: timing would cost it more than it saves) times up to GEMM_TUNE_CANDIDATES candidates on the
 * call's own operands (1 warm-up + GEMM_TUNE_REPS timed runs each, CUDA events) and keeps the fastest. Choices
 * are appended to a text file (option gemm_cache; docs/environment.md: DITRUN_GEMM_CACHE, default
 * $XDG_CACHE_HOME or ~/.cache /ditrun/gemm-algos.txt; "" keeps them in memory) whose lines name the device and
 * cuBLASLt version they hold for, so later processes skip the timing. A persisted algorithm is re-checked with
 * cublasLtMatmulAlgoCheck. Never times while a CUDA graph is being captured (the heuristic's first pick is used and
 * not remembered). (Timing the candidates under sustained load, at the power cap, chose other algorithms at 6 of 8
 * shapes for the same forward time: PERF.md, stop 12.) */
#define GEMM_TUNE_CANDIDATES 8
#define GEMM_TUNE_REPS 3
#define GEMM_TUNE_MIN_FLOP 2e9
#define GEMM_TUNE_MIN_TOKENS 1024   /* Linears of >= 1024 tokens (the DiT's image stream), not text encoders/VAE */

struct gemm_key {
    int ta, tb, dtd, has_bias, aa, ab, ad;
    int64_t m, n, k, lda, ldb, ldd;
    int acc;    /* 1: D += alpha * op(A)op(B) (beta = 1, C = D) */
    bool operator<(const gemm_key &o) const {
        return std::tie(ta, tb, dtd, has_bias, aa, ab, ad, m, n, k, lda, ldb, ldd, acc) <
               std::tie(o.ta, o.tb, o.dtd, o.has_bias, o.aa, o.ab, o.ad, o.m, o.n, o.k, o.lda, o.ldb, o.ldd, o.acc);
    }
};
struct gemm_entry {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};
struct dtc_gemm_cache {
    std::map<gemm_key, gemm_entry> m;
    std::map<gemm_key, cublasLtMatmulAlgo_t> persisted;  /* read from the cache file, not yet checked */
    bool loaded = false;
};

void dtc_gemm_cache_free(dtc_state *st) {
    if (!st->gemm_cache) return;
    for (auto &kv : st->gemm_cache->m) {
        if (!kv.second.op) continue;
        cublasLtMatmulDescDestroy(kv.second.op);
        cublasLtMatrixLayoutDestroy(kv.second.la);
        cublasLtMatrixLayoutDestroy(kv.second.lb);
        cublasLtMatrixLayoutDestroy(kv.second.ld);
    }
    delete st->gemm_cache;
    st->gemm_cache = nullptr;
}

void dtc_gemm_tune_init(dtc_state *st, const char *device_name) {
    snprintf(st->gpu_id, sizeof st->gpu_id, "%s|cc%d.%d|%dsm|lt%zu|ws%zu", device_name, st->cc_major, st->cc_minor,
             st->sm_count, cublasLtGetVersion(), st->lt_ws_size);
    for (char *c = st->gpu_id; *c; c++)
        if (*c == ' ') *c = '_';
}

static void key_line(const dtc_state *st, const gemm_key &k, char *buf, size_t size) {
    snprintf(buf, size, "%s %d %d %d %d %d %d %d %lld %lld %lld %lld %lld %lld %d", st->gpu_id, k.ta, k.tb, k.dtd,
             k.has_bias, k.aa, k.ab, k.ad, (long long)k.m, (long long)k.n, (long long)k.k, (long long)k.lda,
             (long long)k.ldb, (long long)k.ldd, k.acc);
}

/* Read the persisted choices for this device (once). Malformed or foreign lines are skipped. */
static void gemm_cache_load(dtc_state *st) {
    dtc_gemm_cache *c = st->gemm_cache;
    c->loaded = true;
    if (!st->o.gemm_cache[0]) return;
    FILE *f = fopen(st->o.gemm_cache, "r");
    if (!f) return;
    char line[1024], id[200];
    while (fgets(line, sizeof line, f)) {
        gemm_key k;
        long long m, n, kk, lda, ldb, ldd;
        unsigned long long d[8];
        int used = 0;
        if (sscanf(line, "%199s %d %d %d %d %d %d %d %lld %lld %lld %lld %lld %lld %d :%n", id, &k.ta, &k.tb, &k.dtd,
                   &k.has_bias, &k.aa, &k.ab, &k.ad, &m, &n, &kk, &lda, &ldb, &ldd, &k.acc, &used) != 15 || !used)
            continue;
        if (strcmp(id, st->gpu_id)) continue;
        if (sscanf(line + used, "%llx %llx %llx %llx %llx %llx %llx %llx", &d[0], &d[1], &d[2], &d[3], &d[4], &d[5],
                   &d[6], &d[7]) != 8)
            continue;
        k.m = m; k.n = n; k.k = kk; k.lda = lda; k.ldb = ldb; k.ldd = ldd;
        cublasLtMatmulAlgo_t a;
        for (int i = 0; i < 8; i++) a.data[i] = d[i];
        c->persisted[k] = a;
    }
    fclose(f);
}

static void gemm_cache_append(dtc_state *st, const gemm_key &k, const cublasLtMatmulAlgo_t &a) {
    if (!st->o.gemm_cache[0]) return;
    FILE *f = fopen(st->o.gemm_cache, "a");
    if (!f) return;
    char kl[400];
    key_line(st, k, kl, sizeof kl);
    fprintf(f, "%s :", kl);
    for (int i = 0; i < 8; i++) fprintf(f, " %llx", (unsigned long long)a.data[i]);
    fprintf(f, "\n");
    fclose(f);
}

/* One product of entry e with algorithm algo on the current queue (D is also C). */
static cublasStatus_t lt_matmul(dtc_state *st, const gemm_entry &e, const cublasLtMatmulAlgo_t *algo, const void *alpha,
                                const void *A, const void *B, void *D, const float *beta) {
    return cublasLtMatmul(st->lt, e.op, alpha, A, e.la, B, e.lb, beta, D, e.ld, D, e.ld, algo, st->q.lt_ws,
                          st->lt_ws_size, st->q.stream);
}

/* Mean ms of one product with `algo` (after a warm-up run), or -1 if cuBLASLt refuses it. alpha: host scalar;
 * D is also C (beta = 1 when accumulating). */
static float time_algo(dtc_state *st, gemm_entry &e, const cublasLtMatmulAlgo_t *algo, const void *alpha,
                       const void *A, const void *B, void *D, float beta) {
    if (lt_matmul(st, e, algo, alpha, A, B, D, &beta) != CUBLAS_STATUS_SUCCESS) return -1.f;
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(cudaEventRecord(t0, st->q.stream));
    for (int r = 0; r < GEMM_TUNE_REPS; r++)
        CKLT(lt_matmul(st, e, algo, alpha, A, B, D, &beta));
    CK(cudaEventRecord(t1, st->q.stream));
    CK(cudaEventSynchronize(t1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    CK(cudaEventDestroy(t0));
    CK(cudaEventDestroy(t1));
    return ms / GEMM_TUNE_REPS;
}

static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 2 && (a % (uintptr_t)al)) al >>= 1;
    return al;
}

/* The product, with the algorithm cache and tuning. accumulate = 1: D += alpha·op(A)op(B) (beta = 1, C = D).
 * Returns 0, or -1 when cuBLASLt has no algorithm for an accumulating product (the caller falls back; a plain
 * product without one is fatal). */
static int gemm_run(dtc_state *st, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
                    const void *B, int64_t ldb, void *D, int64_t ldd, dt_dtype dtype_d, float alpha,
                    const void *bias_bf16, int accumulate, int tunable) {
    if (m <= 0 || n <= 0) return 0;
    DTC_REQUIRE(k > 0, "gemm: k = %lld", (long long)k);
    if (!st->gemm_cache) st->gemm_cache = new dtc_gemm_cache();
    gemm_key key;
    key.ta = ta; key.tb = tb; key.dtd = (int)dtype_d; key.has_bias = bias_bf16 != nullptr;
    key.aa = ptr_align(A); key.ab = ptr_align(B); key.ad = ptr_align(D);
    key.m = m; key.n = n; key.k = k; key.lda = lda; key.ldb = ldb; key.ldd = ldd;
    key.acc = accumulate != 0;
    const float beta = accumulate ? 1.f : 0.f;
    auto it = st->gemm_cache->m.find(key);
    if (it == st->gemm_cache->m.end()) {
        gemm_entry e;
        cudaDataType_t dt = dtype_d == DT_F32 ? CUDA_R_32F : CUDA_R_16BF;
        CKLT(cublasLtMatmulDescCreate(&e.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        if (bias_bf16) {
            cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
            cudaDataType_t bt = CUDA_R_16BF;
            CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
            CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_bf16,
                                                sizeof bias_bf16));
        }
        CKLT(cublasLtMatrixLayoutCreate(&e.la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
        CKLT(cublasLtMatrixLayoutCreate(&e.lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
        CKLT(cublasLtMatrixLayoutCreate(&e.ld, dt, m, n, ldd));
        if (!st->gemm_cache->loaded && st->o.gemm_tune) gemm_cache_load(st);  /* gemm_tune 0: heuristic only */
        bool chosen = false;
        auto pit = st->gemm_cache->persisted.find(key);
        if (pit != st->gemm_cache->persisted.end()) {
            cublasLtMatmulHeuristicResult_t chk;
            if (cublasLtMatmulAlgoCheck(st->lt, e.op, e.la, e.lb, e.ld, e.ld, &pit->second, &chk) ==
                    CUBLAS_STATUS_SUCCESS &&
                chk.workspaceSize <= st->lt_ws_size) {
                e.algo = pit->second;
                chosen = true;
            }
        }
        if (!chosen) {
            cublasLtMatmulPreference_t pref;
            CKLT(cublasLtMatmulPreferenceCreate(&pref));
            CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &st->lt_ws_size,
                                                      sizeof st->lt_ws_size));
            uint32_t a32 = (uint32_t)key.aa, b32 = (uint32_t)key.ab, d32 = (uint32_t)key.ad;
            CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof a32));
            CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b32, sizeof b32));
            CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &d32, sizeof d32));
            CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &d32, sizeof d32));
            cublasLtMatmulHeuristicResult_t res[GEMM_TUNE_CANDIDATES];
            const int want = GEMM_TUNE_CANDIDATES;
            int cnt = 0;
            const bool tune = tunable && st->o.gemm_tune && !st->capturing &&
                              2.0 * (double)m * (double)n * (double)k >= GEMM_TUNE_MIN_FLOP && n >= GEMM_TUNE_MIN_TOKENS;
            cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->lt, e.op, e.la, e.lb, e.ld, e.ld, pref,
                                                               tune ? want : 1, res, &cnt);
            if (hs != CUBLAS_STATUS_SUCCESS) {
                if (!accumulate) dtc_fatal("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__, cublasGetStatusString(hs));
                cnt = 0;
            }
            cublasLtMatmulPreferenceDestroy(pref);
            if (cnt < 1 && accumulate) {   /* no kernel for this mode: remember that, let the caller fall back */
                cublasLtMatmulDescDestroy(e.op);
                cublasLtMatrixLayoutDestroy(e.la);
                cublasLtMatrixLayoutDestroy(e.lb);
                cublasLtMatrixLayoutDestroy(e.ld);
                e.op = nullptr;
                st->gemm_cache->m.emplace(key, e);
                return -1;
            }
            if (cnt < 1) {
                fprintf(stderr,
                        "ditrun: cuda: cuBLASLt found no algorithm for m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldd=%lld "
                        "(alignment %d/%d/%d)\n",
                        (long long)m, (long long)n, (long long)k, (long long)lda, (long long)ldb, (long long)ldd, key.aa,
                        key.ab, key.ad);
                exit(1);
            }
            e.algo = res[0].algo;
            if (tune && cnt > 1) {
                double t0 = dt_now();
                float best = -1.f, first = -1.f;
                int bi = 0;
                /* an accumulating product (D += ...) is timed on a scratch D, not the caller's */
                void *Dt = D;
                if (accumulate) {
                    Dt = dtc_pool_alloc(st, (size_t)ldd * (size_t)n * dt_dtype_size(dtype_d));
                    if (!Dt) { cudaGetLastError(); Dt = nullptr; }
                    else CK(cudaMemsetAsync(Dt, 0x3c, (size_t)ldd * (size_t)n * dt_dtype_size(dtype_d), st->q.stream));
                }
                for (int i = 0; Dt && i < cnt; i++) {
                    float ms = time_algo(st, e, &res[i].algo, &alpha, A, B, Dt, beta);
                    if (i == 0) first = ms;
                    if (ms > 0.f && (best < 0.f || ms < best)) { best = ms; bi = i; }
                }
                if (accumulate && Dt) {
                    CK(cudaStreamSynchronize(st->q.stream));
                    dtc_pool_free(st, Dt);
                }
                e.algo = res[bi].algo;
                if (st->verbose)
                    fprintf(stderr, "ditrun: cuda: gemm m=%lld n=%lld k=%lld: candidate %d of %d, %.4f ms (heuristic's first %.4f ms; tuning took %.1f ms)\n",
                            (long long)m, (long long)n, (long long)k, bi, cnt, best, first, (dt_now() - t0) * 1e3);
                gemm_cache_append(st, key, e.algo);
            } else if (tune) {
                gemm_cache_append(st, key, e.algo);
            }
        }
        it = st->gemm_cache->m.emplace(key, e).first;
    }
    gemm_entry &e = it->second;
    if (!e.op) return -1;   /* accumulating product without an algorithm (found earlier) */
    if (bias_bf16)
        CKLT(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_bf16, sizeof bias_bf16));
    CKLT(lt_matmul(st, e, &e.algo, &alpha, A, B, D, &beta));
    return 0;
}

void dtc_gemm(dtc_state *st, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
              const void *B, int64_t ldb, void *D, int64_t ldd, dt_dtype dtype_d, float alpha,
              const void *bias_bf16) {
    gemm_run(st, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, dtype_d, alpha, bias_bf16, 0, 0);
}

/* ------------------------------------------------------------------ Linear weights */
struct dt_linear {
    int64_t out, in;
    int bits, group;
    __nv_bfloat16 *w;   /* dense bf16 [out, in] (dense weights or CACHED dequantization) */
    uint32_t *qw;       /* packed MLX layout [out, in*bits/32] */
    float2 *sb;         /* (scale, bias) per group [out, in/group] */
    __nv_bfloat16 *bias;/* Linear bias [out] or NULL */
    dtc_fp8_w *f8;      /* fp8 weights (cuda_fp8.cu) instead of w/qw, or NULL */
    dtc_qg_w mx;        /* qpath mixed: fragment-ordered packed weights (cuda_qgemm.cu) instead of qw/sb; mx.q NULL
                           when unused */
    uint8_t *gq;        /* GGUF blocks as the file has them [out rows of in/QK blocks] (cuda_ggml.cu), or NULL */
    dt_dtype gtype;     /* their block type */
};

/* Exact small-integer -> float without the (slow) I2F conversion unit: 2^23 + u has u in its mantissa. */
__device__ __forceinline__ float u2f(uint32_t u) { return __uint_as_float(0x4B000000u | u) - 8388608.f; }

/* Dequantize packed -> bf16 [N, K]; one thread per 8 output elements. */
template <int BITS>
__global__ void k_dequant(__nv_bfloat16 *dst, const uint32_t *qw, const float2 *sb, int64_t N, int64_t K, int group,
                          const void *rowscale, int rs_f32) {
    int64_t chunks = N * (K / 8);
    int64_t ng = K / group;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < chunks; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / (K / 8), c = (i - n * (K / 8)) * 8;
        float2 s = sb[n * ng + c / group];
        float f[8];
        if (BITS == 4) {
            uint32_t q = qw[n * (K / 8) + c / 8];
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = fmaf(s.x, u2f((q >> (4 * j)) & 15u), s.y);
        } else {
            uint2 q = *(const uint2 *)(qw + n * (K / 4) + c / 4);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                f[j] = fmaf(s.x, u2f((q.x >> (8 * j)) & 255u), s.y);
                f[4 + j] = fmaf(s.x, u2f((q.y >> (8 * j)) & 255u), s.y);
            }
        }
        if (rowscale) {   /* the gate of linear_gated_add, folded into the weight rows */
            float g = rs_f32 ? ((const float *)rowscale)[n] : __bfloat162float(((const __nv_bfloat16 *)rowscale)[n]);
#pragma unroll
            for (int jj = 0; jj < 8; jj++) f[jj] *= g;
        }
        *(uint4 *)(dst + n * K + c) = f_to_bf8(f);
    }
}

/* rowscale: NULL, or a [N] vector (bf16, or f32 when rs_f32) multiplied into each dequantized row. */
static void dequant_launch(dtc_state *st, cudaStream_t stream, __nv_bfloat16 *dst, const dt_linear *w,
                           const void *rowscale = nullptr, int rs_f32 = 0) {
    if (w->gq) {   /* GGUF blocks */
        dtc_ggml_dequant(st, stream, dst, w->gq, w->gtype, w->out, w->in, rowscale, rs_f32);
        return;
    }
    int64_t chunks = w->out * (w->in / 8);
    int64_t b = (chunks + 255) / 256;
    if (b > (int64_t)st->sm_count * 32) b = (int64_t)st->sm_count * 32;
    if (w->bits == 4)
        k_dequant<4><<<(unsigned)b, 256, 0, stream>>>(dst, w->qw, w->sb, w->out, w->in, w->group, rowscale, rs_f32);
    else
        k_dequant<8><<<(unsigned)b, 256, 0, stream>>>(dst, w->qw, w->sb, w->out, w->in, w->group, rowscale, rs_f32);
    CK_LAUNCH("dequant");
}

/* ------------------------------------------------------------------ transient prefetch */
static dt_qpath qpath_for(const dt_backend *be, int64_t rows);
/* On the main queue (not the side queue, not with the prefetch off) every transient Linear's dequantized weights
 * go through two slots, each as large as the largest transient Linear. linear_prefetch(w, gate) dequantizes w
 * (rows scaled by gate, as linear_gated_add folds it) into the slot used least recently on pf_stream, after the
 * main queue's work issued so far (so the gate is final and the slot's last GEMM has finished); the Linear that
 * matches (same w and gate) waits for it and runs its GEMM from the slot. A Linear without a matching prefetch
 * dequantizes into a slot on the main queue as before. pf_stream has the lowest priority and the queues the
 * highest (unless o.no_prefetch), so the dequantization fills the SMs that the queued kernels leave idle (wave
 * tails, launch gaps) instead of delaying them. Results are bit-identical with and without prefetching. */
static int pf_usable(const dtc_state *st, const dt_linear *w) {
    return st->pf_stream && st->cur_queue == 0 && (w->qw || w->gq) && !w->w && (size_t)w->out * w->in * 2 <= st->pf[0].buf.size &&
           (size_t)w->out * w->in * 2 <= st->pf[1].buf.size;
}

static int pf_find(const dtc_state *st, const dt_linear *w, const void *gate, int gate_f32) {
    for (int i = 0; i < 2; i++)
        if (st->pf[i].w == w && st->pf[i].gate == gate && (!gate || st->pf[i].gate_f32 == gate_f32)) return i;
    return -1;
}

/* The slot to (re)fill: not holding an unconsumed prefetch, least recently used; -1 if both hold one. */
static int pf_victim(const dtc_state *st) {
    int v = -1;
    for (int i = 0; i < 2; i++)
        if (!st->pf[i].pending && (v < 0 || st->pf[i].stamp < st->pf[v].stamp)) v = i;
    return v;
}

/* Slot i holds nothing reusable (after its Linear consumed it, or when its events or Linear are gone). */
static void pf_clear(dtc_state *st, int i) {
    st->pf[i].w = st->pf[i].gate = nullptr;
    st->pf[i].pending = 0;
}

void dtc_prefetch_join(dtc_state *st) {
    if (!st->pf_unjoined) return;
    CK(cudaEventRecord(st->pf_last, st->pf_stream));
    CK(cudaStreamWaitEvent(st->q.stream, st->pf_last, 0));
    st->pf_unjoined = 0;
}

/* Forget every slot's content (their events may belong to another capture); the caller joined first. */
void dtc_prefetch_forget(dtc_state *st) {
    for (int i = 0; i < 2; i++) pf_clear(st, i);
}

void dtc_linear_prefetch(dt_backend *be, const dt_linear *w, dt_mat gate, int64_t rows) {
    dtc_state *st = dtc(be);
    if (!w || rows <= 0 || !pf_usable(st, w) || qpath_for(be, rows) != DT_QPATH_TRANSIENT) return;
    if (gate.data && (w->bias || (gate.dtype != DT_BF16 && gate.dtype != DT_F32))) return;  /* not folded */
    const int gf = gate.data && gate.dtype == DT_F32;
    if (pf_find(st, w, gate.data, gf) >= 0) return;
    int s = pf_victim(st);
    if (s < 0) return;
    CK(cudaEventRecord(st->pf_pos, st->q.stream));
    CK(cudaStreamWaitEvent(st->pf_stream, st->pf_pos, 0));
    dequant_launch(st, st->pf_stream, (__nv_bfloat16 *)st->pf[s].buf.ptr, w, gate.data, gf);
    CK(cudaEventRecord(st->pf[s].ready, st->pf_stream));
    st->pf[s].w = w;
    st->pf[s].gate = gate.data;
    st->pf[s].gate_f32 = gf;
    st->pf[s].pending = 1;
    st->pf[s].stamp = ++st->pf_clock;
    st->pf_unjoined = 1;
}

/* w's dequantized weights (rows scaled by rowscale when given) for a GEMM on the current queue. */
static __nv_bfloat16 *transient_weights(dtc_state *st, const dt_linear *w, const void *rowscale = nullptr,
                                        int rs_f32 = 0) {
    if (!pf_usable(st, w)) {
        __nv_bfloat16 *tmp = (__nv_bfloat16 *)dtc_scratch_get(st, &st->q.s_qdeq, (size_t)w->out * w->in * 2);
        dequant_launch(st, st->q.stream, tmp, w, rowscale, rs_f32);
        return tmp;
    }
    int s = pf_find(st, w, rowscale, rs_f32);
    if (s >= 0 && st->pf[s].pending) {   /* prefetched: wait for it */
        CK(cudaStreamWaitEvent(st->q.stream, st->pf[s].ready, 0));
    } else {
        s = pf_victim(st);
        if (s < 0) {   /* both slots hold prefetches for other Linears: take the older one's slot */
            s = st->pf[0].stamp < st->pf[1].stamp ? 0 : 1;
            CK(cudaStreamWaitEvent(st->q.stream, st->pf[s].ready, 0));
        }
        dequant_launch(st, st->q.stream, (__nv_bfloat16 *)st->pf[s].buf.ptr, w, rowscale, rs_f32);
    }
    /* consumed: the content is not reused (a later call dequantizes again, as without prefetching) */
    pf_clear(st, s);
    st->pf[s].stamp = ++st->pf_clock;
    return (__nv_bfloat16 *)st->pf[s].buf.ptr;
}

static float host_half(const void *p, dt_dtype t, int64_t i) {
    if (t == DT_F32) return ((const float *)p)[i];
    if (t == DT_F16) return dt_f16_to_f32(((const uint16_t *)p)[i]);
    return dt_bf16_to_f32(((const uint16_t *)p)[i]);
}

int dtc_host_scales(const dt_linear_src *src, float2 *h, int64_t n) {
    if (src->sb_dtype == DT_BF16) {
        /* the common case, without a per-element dtype switch and exactness test (bf16 -> f32 is exact): 7x
         * faster on the host (0.54 -> 0.07 s for a klein-4B's 60 M pairs on the dev machine) */
        const uint16_t *sc = (const uint16_t *)src->scales, *bi = (const uint16_t *)src->biases;
        for (int64_t i = 0; i < n; i++) {
            h[i].x = dt_bf16_to_f32(sc[i]);
            h[i].y = dt_bf16_to_f32(bi[i]);
        }
        return 1;
    }
    int exact = 1;
    for (int64_t i = 0; i < n; i++) {
        h[i].x = host_half(src->scales, src->sb_dtype, i);
        h[i].y = host_half(src->biases, src->sb_dtype, i);
        exact &= dt_bf16_to_f32(dt_f32_to_bf16(h[i].x)) == h[i].x && dt_bf16_to_f32(dt_f32_to_bf16(h[i].y)) == h[i].y;
    }
    return exact;
}

void dtc_linear_destroy(dt_backend *be, dt_linear *w) {
    if (!w) return;
    dtc_state *st = dtc(be);
    for (int i = 0; i < 2; i++)
        if (st->pf[i].w == w) {   /* a later Linear at this address must not match the slot */
            dtc_prefetch_join(st);
            pf_clear(st, i);
        }
    dtc_pool_free(st, w->w);
    dtc_pool_free(st, w->qw);
    dtc_pool_free(st, w->sb);
    dtc_pool_free(st, w->gq);
    dtc_pool_free(st, w->bias);
    dtc_fp8_weight_free(st, w->f8);
    dtc_qgemm_free(st, &w->mx);
    free(w);
}

/* The MLX-packed copy once another form was made from it (cached dense, mixed layout): free it when done. */
static void drop_packed(dtc_state *st, dt_linear *w) {
    CK(cudaStreamSynchronize(st->q.stream));
    dtc_pool_free(st, w->qw);
    dtc_pool_free(st, w->sb);
    w->qw = nullptr;
    w->sb = nullptr;
}

/* The execution path of a prepared Linear, for the -v line (dt_linear_log_path). */
static const char *linear_path_name(const dt_backend *be, const dt_linear *w, const dt_linear_src *src) {
    if (w->f8) return "fp8: e4m3 weights with per-channel scales, cuBLASLt e4m3 GEMM";
    if (w->w && !src->bits)
        return src->precision == DT_PREC_FP8 ? "dense bf16 (fp8 asked for; the fp8 GEMM needs in and out % 16)"
                                             : "dense bf16, cuBLASLt";
    if (w->w) return "cached: dequantized to bf16 once at load, cuBLASLt";
    if (w->mx.q) return "mixed: packed weights dequantized in registers inside our wgmma GEMM";
    switch (be->opts.qpath) {
    case DT_QPATH_FUSED: return "fused: our qmm GEMM dequantizes each tile (transient where its layout does not fit)";
    case DT_QPATH_TRANSIENT: return "transient: dequantized to bf16 before each cuBLASLt GEMM";
    default:
        return "transient: dequantized to bf16 before each cuBLASLt GEMM (fused qmm at <= 64 rows)";
    }
}

#define LIN_ALLOC(ptr, bytes)                                                                   \
    do {                                                                                        \
        *(void **)&(ptr) = dtc_pool_alloc(st, (bytes));                                         \
        if (!(ptr)) { dtc_linear_destroy(be, w); return NULL; }                                 \
    } while (0)

dt_linear *dtc_linear_create(dt_backend *be, const dt_linear_src *src) {
    dtc_state *st = dtc(be);
    const char *nm = src->name ? src->name : "?";
    if (src->out <= 0 || src->in <= 0) {
        dt_set_error("cuda: linear %s: bad shape [%lld, %lld]", nm, (long long)src->out, (long long)src->in);
        return NULL;
    }
    dt_linear *w = (dt_linear *)calloc(1, sizeof(dt_linear));
    if (!w) { dt_set_error("cuda: out of host memory"); return NULL; }
    w->out = src->out;
    w->in = src->in;
    w->bits = src->bits;
    w->group = src->group_size;
    const int64_t N = src->out, K = src->in;
    /* fp8 files run on the fp8 GEMM as stored (no bf16 copy); --precision fp8 converts other forms */
    if ((src->precision == DT_PREC_FP8 || dt_linear_src_fp8(src)) && dtc_fp8_eligible(src)) {
        w->f8 = dtc_fp8_weight_create(st, src);
        if (!w->f8) { free(w); return NULL; }
    } else if (dt_linear_src_blocks(src)) {   /* GGUF: the blocks on the device, dequantized before the GEMM */
        if (!dtc_ggml_supported(src->dtype) || K % 32) {
            dt_set_error("cuda: linear %s: unsupported GGUF block type %s (in %lld)", nm, dt_dtype_name(src->dtype), (long long)K);
            free(w);
            return NULL;
        }
        const size_t bytes = dt_dtype_bytes(src->dtype, K) * (size_t)N;
        LIN_ALLOC(w->gq, bytes);
        w->gtype = src->dtype;
        CK(cudaMemcpyAsync(w->gq, src->data, bytes, cudaMemcpyHostToDevice, st->q.stream));
        if (be->opts.qpath == DT_QPATH_CACHED) {
            LIN_ALLOC(w->w, (size_t)N * K * 2);
            dequant_launch(st, st->q.stream, w->w, w);
            CK(cudaStreamSynchronize(st->q.stream));
            dtc_pool_free(st, w->gq);
            w->gq = nullptr;
        } else if (st->pf_stream) {   /* the transient scratch (or the prefetch slots) now: graph capture never allocates */
            dtc_scratch_reserve(st, &st->pf[0].buf, (size_t)N * K * 2);
            dtc_scratch_reserve(st, &st->pf[1].buf, (size_t)N * K * 2);
        } else {
            dtc_scratch_get(st, &st->q.s_qdeq, (size_t)N * K * 2);
        }
    } else if (dt_linear_src_fp8(src)) {   /* an fp8 Linear the fp8 GEMM cannot take (in/out % 16): bf16 */
        LIN_ALLOC(w->w, (size_t)N * K * 2);
        int64_t rows = ((int64_t)1 << 24) / K;
        if (rows < 1) rows = 1;
        if (rows > N) rows = N;
        float *h = (float *)malloc((size_t)(rows * K) * sizeof(float));
        void *stage = dtc_pool_alloc(st, (size_t)(rows * K) * sizeof(float));
        if (!h || !stage) { free(h); dtc_pool_free(st, stage); dtc_linear_destroy(be, w); return NULL; }
        for (int64_t r0 = 0; r0 < N; r0 += rows) {
            int64_t nr = N - r0 < rows ? N - r0 : rows;
            dt_linear_src_rows_f32(src, r0, nr, h);
            CK(cudaMemcpyAsync(stage, h, (size_t)(nr * K) * sizeof(float), cudaMemcpyHostToDevice, st->q.stream));
            dtc_convert_to_bf16(st, w->w + r0 * K, stage, DT_F32, nr * K);
            CK(cudaStreamSynchronize(st->q.stream));   /* h and the stage are reused */
        }
        free(h);
        dtc_pool_free(st, stage);
    } else if (src->bits == 0) {
        if (src->dtype != DT_F32 && src->dtype != DT_F16 && src->dtype != DT_BF16) {
            dt_set_error("cuda: linear %s: unsupported weight dtype %s", nm, dt_dtype_name(src->dtype));
            free(w);
            return NULL;
        }
        LIN_ALLOC(w->w, (size_t)N * K * 2);
        if (src->dtype == DT_BF16) {
            CK(cudaMemcpyAsync(w->w, src->data, (size_t)N * K * 2, cudaMemcpyHostToDevice, st->q.stream));
        } else {
            /* stage raw bytes in chunks and convert on the device */
            size_t es = dt_dtype_size(src->dtype);
            int64_t total = N * K, chunk = (int64_t)1 << 26;
            if (chunk > total) chunk = total;
            void *stage = dtc_pool_alloc(st, (size_t)chunk * es);
            if (!stage) { dtc_linear_destroy(be, w); return NULL; }
            for (int64_t off = 0; off < total; off += chunk) {
                int64_t nn = total - off < chunk ? total - off : chunk;
                CK(cudaMemcpyAsync(stage, (const char *)src->data + (size_t)off * es, (size_t)nn * es,
                                   cudaMemcpyHostToDevice, st->q.stream));
                dtc_convert_to_bf16(st, w->w + off, stage, src->dtype, nn);
            }
            CK(cudaStreamSynchronize(st->q.stream));
            dtc_pool_free(st, stage);
        }
    } else {
        if ((src->bits != 4 && src->bits != 8) || src->group_size <= 0 || K % src->group_size || K % 8) {
            dt_set_error("cuda: linear %s: unsupported quantization bits=%d group=%d in=%lld", nm, src->bits,
                         src->group_size, (long long)K);
            free(w);
            return NULL;
        }
        int64_t words = K * src->bits / 32, ng = K / src->group_size;
        LIN_ALLOC(w->qw, (size_t)N * words * 4);
        LIN_ALLOC(w->sb, (size_t)N * ng * sizeof(float2));
        CK(cudaMemcpyAsync(w->qw, src->data, (size_t)N * words * 4, cudaMemcpyHostToDevice, st->q.stream));
        float2 *h = (float2 *)malloc((size_t)N * ng * sizeof(float2));
        if (!h) { dt_set_error("cuda: out of host memory"); dtc_linear_destroy(be, w); return NULL; }
        /* every scale and bias a bf16 value? (the mixed GEMM's bf16x2 dequantization needs it) */
        int sb_bf16_exact = dtc_host_scales(src, h, N * ng);
        CK(cudaMemcpyAsync(w->sb, h, (size_t)N * ng * sizeof(float2), cudaMemcpyHostToDevice, st->q.stream));
        CK(cudaStreamSynchronize(st->q.stream));
        free(h);
        if (be->opts.qpath == DT_QPATH_CACHED) {
            LIN_ALLOC(w->w, (size_t)N * K * 2);
            dequant_launch(st, st->q.stream, w->w, w);
            drop_packed(st, w);
        } else if (be->opts.qpath == DT_QPATH_MIXED && dtc_qgemm_eligible(st, N, K, src->bits, src->group_size)) {
            if (dtc_qgemm_pack(st, &w->mx, w->qw, w->sb, N, K, src->bits, src->group_size, sb_bf16_exact)) {
                dtc_linear_destroy(be, w);
                return NULL;
            }
            drop_packed(st, w);
        } else {
            /* grow the transient scratch (or the prefetch slots) now, so graph capture never allocates */
            if (st->pf_stream) {
                dtc_scratch_reserve(st, &st->pf[0].buf, (size_t)N * K * 2);
                dtc_scratch_reserve(st, &st->pf[1].buf, (size_t)N * K * 2);
            } else {
                dtc_scratch_get(st, &st->q.s_qdeq, (size_t)N * K * 2);
            }
        }
    }
    if (src->bias) {
        uint16_t *hb = (uint16_t *)malloc((size_t)N * 2);
        if (!hb) { dt_set_error("cuda: out of host memory"); dtc_linear_destroy(be, w); return NULL; }
        for (int64_t i = 0; i < N; i++) hb[i] = dt_f32_to_bf16(host_half(src->bias, src->bias_dtype, i));
        LIN_ALLOC(w->bias, (size_t)N * 2);
        CK(cudaMemcpyAsync(w->bias, hb, (size_t)N * 2, cudaMemcpyHostToDevice, st->q.stream));
        CK(cudaStreamSynchronize(st->q.stream));
        free(hb);
    }
    CK(cudaStreamSynchronize(st->q.stream));
    if (be->opts.verbose) dt_linear_log_path(be, src, linear_path_name(be, w, src));
    return w;
}

/* ------------------------------------------------------------------ fused qmm kernel */
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

static void linear_fused(dtc_state *st, dt_mat y, dt_mat x, const dt_linear *w) {
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
}

/* ------------------------------------------------------------------ linear dispatch */
/* fp8 Linears take their activations from the producing op (norm_linear, act_linear_gated) and fold the gated
 * residual into the GEMM; opts.fp8_unfused turns both off (A/B arm: the quantizing pass and linear + gated_add). */
static int fp8_fuse_on(const dt_backend *be) { return !be->opts.fp8_unfused; }

/* The quantized-weight path for a product of `rows` tokens: the requested one, or (auto) the fused qmm for
 * mat-vec-like sizes and transient dequantization above. CACHED and MIXED Linears leave the packed form at load
 * (dense, or re-laid for the mixed GEMM), so a Linear that kept it under either behaves as auto. */
static dt_qpath qpath_for(const dt_backend *be, int64_t rows) {
    dt_qpath path = be->opts.qpath;
    if (path == DT_QPATH_AUTO || path == DT_QPATH_CACHED || path == DT_QPATH_MIXED)
        path = rows > 64 ? DT_QPATH_TRANSIENT : DT_QPATH_FUSED;
    return path;
}

static void dense_gemm(dtc_state *st, dt_mat y, dt_mat x, const __nv_bfloat16 *W, const dt_linear *w) {
    /* column-major view: yᵀ[N,M] = W[N,K] (stored as col-major [K,N], transposed) · xᵀ (col-major [K,M]) */
    int bias_epi = w->bias && y.dtype == DT_BF16;
    gemm_run(st, 1, 0, w->out, x.rows, w->in, W, w->in, x.data, x.ld, y.data, y.ld, y.dtype, 1.f,
             bias_epi ? w->bias : nullptr, 0, 1);
    if (w->bias && !bias_epi) dtc_add_row_bias(st, y, w->bias);
}

void dtc_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(x.cols == w->in && y.cols == w->out && y.rows == x.rows,
                "linear: y[%lld,%lld] = x[%lld,%lld] · W[%lld,%lld]ᵀ shape mismatch", (long long)y.rows,
                (long long)y.cols, (long long)x.rows, (long long)x.cols, (long long)w->out, (long long)w->in);
    DTC_REQUIRE(y.dtype == DT_BF16 || y.dtype == DT_F32, "linear: y dtype %s", dt_dtype_name(y.dtype));
    DTC_REQUIRE(x.dtype == DT_BF16 || x.dtype == DT_F32, "linear: x dtype %s", dt_dtype_name(x.dtype));
    if (x.rows <= 0) return;
    if (w->f8) {
        dtc_fp8_linear(st, y, x, w->f8, w->bias);
        return;
    }
    if (x.dtype != DT_BF16) {  /* cast F32 input to a bf16 scratch copy */
        void *p = dtc_scratch_get(st, &st->q.s_cast, (size_t)x.rows * x.cols * 2);
        dt_mat xb = {p, x.rows, x.cols, x.cols, DT_BF16};
        dtc_copy(be, xb, x);
        x = xb;
    }
    if (w->w) {
        dense_gemm(st, y, x, w->w, w);
        return;
    }
    if (w->mx.q) {
        dtc_qg_epi e = {w->bias, nullptr, 0, 0};
        if (dtc_qgemm(st, y, x, &w->mx, &e) == 0) return;
        __nv_bfloat16 *tmp = (__nv_bfloat16 *)dtc_scratch_get(st, &st->q.s_qdeq, (size_t)w->out * w->in * 2);
        dtc_qgemm_dequant(st, tmp, &w->mx, nullptr, 0);
        dense_gemm(st, y, x, tmp, w);
        return;
    }
    if (w->qw && qpath_for(be, x.rows) == DT_QPATH_FUSED) {   /* (MLX layout only; GGUF blocks go transient) */
        int ok = w->in % QMM_BK == 0 && w->group >= 32 && x.ld % 8 == 0 && dtc_aligned16(x.data) && x.rows < (1LL << 30) &&
                 w->out < (1LL << 30);
        if (ok) {
            linear_fused(st, y, x, w);
            return;
        }
    }
    dense_gemm(st, y, x, transient_weights(st, w), w);
}

/* x[M,N] += gate ⊙ (a[M,K] · Wᵀ), gate [1,N]. With transient quantized weights the gate is folded into the
 * dequantized rows (W' = diag(gate)·W, in the dequantization pass that runs anyway) and the GEMM accumulates into
 * x (beta = 1, C = D = x): one pass, no y buffer, no gated_add pass. The weight products are rounded to bf16 once
 * (gate·w instead of w) and the sum once (instead of y, gate·y and x + ...). Dense weights, biases, F32 x and the
 * fused-qmm sizes take linear + gated_add. (cuBLASLt's per-row alpha vector would fold the gate without touching
 * W, but it is not supported for bf16 on sm_90: "the requested functionality is not supported".) */
void dtc_linear_gated_add(dt_backend *be, dt_mat x, dt_mat a, const dt_linear *w, dt_mat gate) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(a.cols == w->in && x.cols == w->out && x.rows == a.rows,
                "linear_gated_add: x[%lld,%lld] += a[%lld,%lld] · W[%lld,%lld]ᵀ shape mismatch", (long long)x.rows,
                (long long)x.cols, (long long)a.rows, (long long)a.cols, (long long)w->out, (long long)w->in);
    DTC_REQUIRE(!gate.data || gate.cols == x.cols, "linear_gated_add: gate has %lld columns, x %lld",
                (long long)gate.cols, (long long)x.cols);
    if (a.rows <= 0) return;
    if (w->f8 && fp8_fuse_on(be) && (a.dtype == DT_BF16 || a.dtype == DT_F32) && (x.dtype == DT_BF16 || x.dtype == DT_F32)) {
        /* fp8: the gate folded into the weight scales, the residual as the GEMM's C (dtc_fp8_gemm_q) */
        float *sx;
        uint8_t *xq = dtc_fp8_quant_act(st, a, &sx);
        dtc_fp8_gemm_q(be, x, xq, sx, w->f8, w->bias, gate, 1);
        return;
    }
    if (w->mx.q && a.dtype == DT_BF16 && (x.dtype == DT_BF16 || x.dtype == DT_F32) &&
        (!gate.data || gate.dtype == DT_BF16 || gate.dtype == DT_F32)) {
        /* mixed-input GEMM: bias, gate and the residual add in its epilogue, weights untouched */
        dtc_qg_epi e = {w->bias, gate.data, gate.dtype == DT_F32, 1};
        if (dtc_qgemm(st, x, a, &w->mx, &e) == 0) return;
    }
    /* packed weights only (w->qw or w->gq: not dense, not dequantized at load, not fp8) */
    int ok = gate.data && !w->bias && (w->qw || w->gq) && qpath_for(be, a.rows) == DT_QPATH_TRANSIENT &&
             x.dtype == DT_BF16 && a.dtype == DT_BF16 &&
             (gate.dtype == DT_BF16 || gate.dtype == DT_F32) &&
             x.ld % 8 == 0 && a.ld % 8 == 0 && dtc_aligned16(x.data) && dtc_aligned16(a.data);
    if (ok) {
        __nv_bfloat16 *W = transient_weights(st, w, gate.data, gate.dtype == DT_F32);
        if (gemm_run(st, 1, 0, w->out, a.rows, w->in, W, w->in, a.data, a.ld, x.data, x.ld, DT_BF16, 1.f, nullptr,
                     1, 1) == 0)
            return;
    }
    /* no gate (a plain x += a·Wᵀ, e.g. a LoRA side product's second GEMM) on dense weights: accumulate directly */
    if (!gate.data && w->w && !w->bias && x.dtype == DT_BF16 && a.dtype == DT_BF16 && x.ld % 8 == 0 && a.ld % 8 == 0 &&
        dtc_aligned16(x.data) && dtc_aligned16(a.data) &&
        gemm_run(st, 1, 0, w->out, a.rows, w->in, w->w, w->in, a.data, a.ld, x.data, x.ld, DT_BF16, 1.f, nullptr, 1, 1) == 0)
        return;
    void *yp = dtc_scratch_get(st, &st->q.s_lga, (size_t)x.rows * x.cols * 2);
    dt_mat y = {yp, x.rows, x.cols, x.cols, DT_BF16};
    dtc_linear(be, y, a, w);
    dtc_gated_add(be, x, gate, y);
}

/* layernorm_mod + linear; for fp8 Linears the norm writes the GEMM's e4m3 activations directly (a not written). */
void dtc_norm_linear(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps, const dt_linear *w,
                     dt_mat a) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(x.cols == w->in && y.cols == w->out && y.rows == x.rows && a.rows == x.rows && a.cols == x.cols,
                "norm_linear: y[%lld,%lld] = LN(x[%lld,%lld]) · W[%lld,%lld]ᵀ via a[%lld,%lld]: shape mismatch",
                (long long)y.rows, (long long)y.cols, (long long)x.rows, (long long)x.cols, (long long)w->out,
                (long long)w->in, (long long)a.rows, (long long)a.cols);
    if (w->f8 && fp8_fuse_on(be) && x.rows > 0 && (y.dtype == DT_BF16 || y.dtype == DT_F32)) {
        float *sx;
        uint8_t *xq = dtc_fp8_act_scratch(st, x.rows, x.cols, &sx);
        if (dtc_layernorm_mod_e4m3(st, x, shift, scale, eps, xq, sx) == 0) {
            dtc_fp8_gemm_q(be, y, xq, sx, w->f8, w->bias, dt_mat_null(), 0);
            return;
        }
    }
    dtc_layernorm_mod(be, a, x, shift, scale, eps);
    dtc_linear(be, y, a, w);
}

/* act_mul into c[:, lead:] + linear_gated_add; for fp8 Linears one pass writes the GEMM's e4m3 activations of
 * [c[:, :lead] | act(a) ⊙ b] (c[:, lead:] not written). */
void dtc_act_linear_gated(dt_backend *be, dt_mat x, dt_mat c, int64_t lead, dt_mat a, dt_mat b, dt_act act,
                          const dt_linear *w, dt_mat gate, dt_mat y) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(lead >= 0 && lead <= c.cols && a.cols == c.cols - lead && a.rows == c.rows,
                "act_linear_gated: c[%lld,%lld] from column %lld and a[%lld,%lld]: shape mismatch", (long long)c.rows,
                (long long)c.cols, (long long)lead, (long long)a.rows, (long long)a.cols);
    DTC_REQUIRE(c.cols == w->in && x.cols == w->out && x.rows == c.rows,
                "act_linear_gated: x[%lld,%lld] += c[%lld,%lld] · W[%lld,%lld]ᵀ shape mismatch", (long long)x.rows,
                (long long)x.cols, (long long)c.rows, (long long)c.cols, (long long)w->out, (long long)w->in);
    if (w->f8 && fp8_fuse_on(be) && c.rows > 0 && (x.dtype == DT_BF16 || x.dtype == DT_F32)) {
        float *sx;
        uint8_t *xq = dtc_fp8_act_scratch(st, c.rows, c.cols, &sx);
        if (dtc_act_e4m3(st, dt_mat_cols(c, 0, lead), a, b, act, xq, sx) == 0) {
            dtc_fp8_gemm_q(be, x, xq, sx, w->f8, w->bias, gate, 1);
            return;
        }
    }
    dtc_act_mul(be, dt_mat_cols(c, lead, c.cols - lead), a, b, act);
    dtc_linear_gated_add(be, x, c, w, gate);
    (void)y;
}

/* ------------------------------------------------------------------ preloading (see cuda_common.cuh) */
template <int BITS, int BM, int WM, int WN>
static void preload_qmm() {
    dtc_preload_fn((const void *)k_qmm<BITS, BM, WM, WN>);
    cudaFuncSetAttribute(k_qmm<BITS, BM, WM, WN>, cudaFuncAttributeMaxDynamicSharedMemorySize, qmm_smem<BITS, BM>::TOTAL);
    cudaGetLastError();
}
void dtc_preload_linear(dtc_state *st) {
    preload_qmm<4, 16, 1, 4>();
    preload_qmm<4, 32, 2, 2>();
    preload_qmm<4, 64, 2, 2>();
    preload_qmm<8, 16, 1, 4>();
    preload_qmm<8, 32, 2, 2>();
    preload_qmm<8, 64, 2, 2>();
    dtc_preload_fn((const void *)k_dequant<4>);
    dtc_preload_fn((const void *)k_dequant<8>);
    dtc_preload_fn((const void *)k_splitk_reduce);
    /* one small cuBLASLt product: its first call initialises the library's internals (once per process) */
    void *buf = dtc_pool_alloc(st, 3 * 128 * 128 * 2);
    if (buf) {
        __nv_bfloat16 *a = (__nv_bfloat16 *)buf, *b = a + 128 * 128, *d = b + 128 * 128;
        CK(cudaMemsetAsync(buf, 0, 2 * 128 * 128 * 2, st->q.stream));
        dtc_gemm(st, 1, 0, 128, 128, 128, a, 128, b, 128, d, 128, DT_BF16, 1.f, nullptr);
        CK(cudaStreamSynchronize(st->q.stream));
        dtc_pool_free(st, buf);
    } else {
        cudaGetLastError();
    }
}
