/* time_attention.c — cuDNN's fused attention vs our own kernel, interleaved (cuDNN, own, cuDNN, own, ...),
 * at the models' shapes, and the host cost of cuDNN's first call at each shape (its plan build).
 *   usage: make dev && build/dev/time_attention   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

/* Interleaved timing (cuDNN, own, cuDNN, own, ...) of one attention at L tokens x heads x 128 (hkv kv heads),
 * Q/K/V as column views of a [L, 9*D] buffer like the single blocks' fused projection (ld 27648 at 24 heads).
 * pad: key_bias with the last 100 keys masked; causal: top-left causal. CUDA events, 3 warm-up rounds,
 * median of 25. */
static void time_cudnn_vs_own(int L, int heads, int hkv, int pad, int causal) {
    const int hd = 128;
    const int64_t D = (int64_t)heads * hd, Dk = (int64_t)hkv * hd, W = 9 * D;
    char name[160];
    float *h = rand_bf((size_t)L * (D + 2 * Dk), -2.f, 2.f);
    dt_mat buf = dt_alloc_or_die(G, L, W, DT_BF16);
    dt_mat qkv = dt_mat_cols(buf, 0, D + 2 * Dk);
    G->upload(G, qkv, h);
    dt_mat q = dt_mat_cols(buf, 0, D), k = dt_mat_cols(buf, D, Dk), v = dt_mat_cols(buf, D + Dk, Dk);
    dt_mat gb = dt_mat_null();
    if (pad) {
        float *hb = malloc((size_t)L * sizeof(float));
        for (int j = 0; j < L; j++) hb[j] = j >= L - 100 ? -INFINITY : 0.f;
        gb = dt_param_upload(G, hb, L);
        free(hb);
    }
    dt_mat o = dt_alloc_or_die(G, L, D, DT_BF16);
    float scale = 1.f / sqrtf((float)hd);
    const dt_cuda_attn fa[2] = {DT_CUDA_ATTN_CUDNN, DT_CUDA_ATTN_OWN};
    void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
    double t[2][25];
    long long c0 = 0, c1 = 0;
    dt_backend_cuda_cudnn_info(G, &c0);
    CO->attn = DT_CUDA_ATTN_CUDNN;   /* the first call at a new key builds the plan: host cost */
    double tf = dt_now();
    G->attention(G, o, q, k, v, heads, hkv, hd, scale, gb, causal);
    G->sync(G);
    tf = dt_now() - tf;
    for (int it = -3; it < 25; it++)
        for (int a = 0; a < 2; a++) {
            CO->attn = fa[a];
            GP->event_record(G, e0);
            G->attention(G, o, q, k, v, heads, hkv, hd, scale, gb, causal);
            GP->event_record(G, e1);
            double ms = GP->event_elapsed_ms(G, e0, e1);
            if (it >= 0) t[a][it] = ms;
        }
    CO->attn = DT_CUDA_ATTN_AUTO;
    dt_backend_cuda_cudnn_info(G, &c1);
    snprintf(name, sizeof name, "attention cudnn-vs-own L=%d %d/%dx%d ld=%lld%s%s", L, heads, hkv, hd, (long long)W,
             pad ? " pad100" : "", causal ? " causal" : "");
    if (c1 - c0 != 29) {
        T_SKIP(name, "cuDNN did not run every timed call (%lld of 29)", c1 - c0);
    } else {
        printf("TIME %-44s %8.1f ms  (first cuDNN call at this key: plan build + run)\n", name, tf * 1e3);
        double flops = 4.0 * L * (double)L * heads * hd * (causal ? 0.5 : 1.0), ms[2];
        for (int a = 0; a < 2; a++) {
            ms[a] = median(t[a], 25);
            printf("TIME %-44s %8.3f ms  %7.1f TFLOPS  (%s)\n", name, ms[a], flops / (ms[a] * 1e-3) / 1e12, a ? "own" : "cudnn");
        }
        printf("TIME %-44s %8.3f (own / cudnn time)\n", name, ms[1] / ms[0]);
    }
    GP->event_destroy(G, e0); GP->event_destroy(G, e1);
    G->free(G, &buf); G->free(G, &o);
    if (pad) G->free(G, &gb);
    free(h);
}

int main(void) {
    int rc = gpu_ops_open("time_attention", NULL);
    if (rc >= 0) return rc;
    if (!dt_backend_cuda_cudnn_info(G, NULL)) T_SKIP("time_attention", "cuDNN not loadable (libcudnn.so.9 not found or DITRUN_CUDNN_LIB wrong)");
    else {
        time_cudnn_vs_own(4608, 24, 24, 0, 0);
        time_cudnn_vs_own(4608, 32, 32, 0, 0);
        time_cudnn_vs_own(16896, 24, 24, 0, 0);
        time_cudnn_vs_own(1536, 24, 24, 0, 0);
        time_cudnn_vs_own(4608, 48, 12, 0, 0);   /* Krea 2 */
        time_cudnn_vs_own(4608, 48, 12, 1, 0);   /* Krea 2 with text padding */
        time_cudnn_vs_own(4608, 24, 24, 0, 1);
        time_cudnn_vs_own(512, 32, 8, 0, 1);     /* Qwen3 text encoder */
    }
    gpu_ops_close();
    return T_DONE();
}
