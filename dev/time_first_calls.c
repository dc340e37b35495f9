/* time_first_calls.c — first call vs second call of ops at shapes not seen before (host wall time including a
 * sync): what a pipeline phase pays for lazy loading, cuBLASLt heuristics and pool growth; and the backend's
 * creation time (kernel preload included).
 *   usage: make dev && build/dev/time_first_calls   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

static void time_first_calls(double t_create) {
    printf("TIME %-44s %8.1f ms\n", "backend create (incl. kernel preload)", t_create * 1e3);
    const int64_t M = 512, K = 2560, N = 9728;
    float *hx = rand_bf((size_t)M * N, -1.f, 1.f);
    dt_mat x = upa(G, hx, M, K), xw = upa(G, hx, M, N), y = dt_alloc_or_die(G, M, N, DT_BF16);
    dt_mat vb = dt_alloc_or_die(G, 16384, 3 * 512, DT_BF16), vo = dt_alloc_or_die(G, 16384, 512, DT_BF16);
    G->upload(G, dt_mat_reshape(dt_mat_rows(vb, 0, 2560), 1536, 2560), hx);   /* first rows random, rest as is */
    for (int kind = 0; kind < 5; kind++) {
        double t[2];
        const char *nm = "";
        wsrc w;
        dt_linear *lw = NULL;
        dt_qpath saved = G->opts.qpath;
        if (kind <= 1) {
            w = make_weights(N, K, kind == 0 ? 0 : 4, 64, 0);
            if (kind == 1) G->opts.qpath = DT_QPATH_TRANSIENT;
            lw = G->linear_create(G, &w.src);
            G->sync(G);
        }
        for (int r = 0; r < 2; r++) {
            double t0 = dt_now();
            if (kind == 0) { nm = "first/second call linear bf16 512x2560x9728"; G->linear(G, y, x, lw); }
            else if (kind == 1) { nm = "first/second call linear q4 transient 512x2560x9728"; G->linear(G, y, x, lw); }
            else if (kind == 2) {
                nm = "first/second call attention 512 32/8 causal+mask";
                dt_mat q = dt_mat_cols(xw, 0, 4096), k = dt_mat_cols(xw, 4096, 1024), v = dt_mat_cols(xw, 5120, 1024);
                dt_mat o = dt_mat_cols(y, 0, 4096);
                float kb[512];
                for (int j = 0; j < 512; j++) kb[j] = j < 480 ? 0.f : -INFINITY;
                dt_mat gb = dt_param_upload(G, kb, 512);
                G->attention(G, o, q, k, v, 32, 8, 128, 0.088f, gb, 1);
                G->sync(G);
                G->free(G, &gb);
            } else if (kind == 4) {
                nm = "first/second call attention 16384 1x512 (VAE)";
                G->attention(G, vo, dt_mat_cols(vb, 0, 512), dt_mat_cols(vb, 512, 512), dt_mat_cols(vb, 1024, 512), 1, 1,
                             512, 0.0442f, dt_mat_null(), 0);
            } else {
                nm = "first/second call conv2d 128->128 3x3 64x64";
                float *hw = rand_bf(128 * 128 * 9, -0.05f, 0.05f);
                dt_conv *gc = G->conv_create(G, hw, hw, 128, 128, 3, 1);
                G->conv2d(G, dt_mat_reshape(y, 128, 4096), dt_mat_reshape(dt_mat_rows(xw, 0, 64), 128, 4096), gc, 64, 64);
                G->sync(G);
                G->conv_destroy(G, gc);
                free(hw);
            }
            G->sync(G);
            t[r] = (dt_now() - t0) * 1e3;
        }
        printf("TIME %-44s %8.3f ms  %8.3f ms\n", nm, t[0], t[1]);
        if (lw) { G->linear_destroy(G, lw); free_weights(&w); }
        G->opts.qpath = saved;
    }
    G->free(G, &x); G->free(G, &xw); G->free(G, &y); G->free(G, &vb); G->free(G, &vo);
    free(hx);
}

int main(void) {
    double t_create = 0;
    int rc = gpu_ops_open("time_first_calls", &t_create);
    if (rc >= 0) return rc;
    time_first_calls(t_create);
    gpu_ops_close();
    return T_DONE();
}
