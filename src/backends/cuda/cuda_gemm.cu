/* cuda_gemm.cu — the cuBLASLt GEMM helper of the CUDA backend: bf16 x bf16 -> bf16/f32 products with fp32
 * accumulation, an optional bias epilogue and accumulation into D, one cached cuBLASLt descriptor and algorithm per
 * shape / stride / alignment, the algorithm timed among the heuristic's candidates for large shapes, and the
 * choices persisted in a file across processes. */
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
int dtc_gemm_run(dtc_state *st, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
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
    dtc_gemm_run(st, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, dtype_d, alpha, bias_bf16, 0, 0);
}
