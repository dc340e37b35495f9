/* time_elementwise.c — the memory-bound ops at klein-4B shapes (layernorm_mod, head_norm_rope, SwiGLU, the
 * gated residual) and same-dtype copies: CUDA events, median of 20 after 3 warm-up calls, GB/s over the bytes
 * each must move.
 *   usage: make dev && build/dev/time_elementwise   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

static void time_elementwise(void) {
    const int64_t L = 4608, D = 3072, F = 9216;
    float *h = rand_bf((size_t)L * F, -2.f, 2.f);
    dt_mat x = upa(G, h, L, D), y = upa(G, h, L, D), a = upa(G, h, L, F), b = upa(G, h, L, F), o = upa(G, h, L, F);
    dt_mat sh = upa(G, h, 1, D), sc = upa(G, h + D, 1, D), w = dt_param_upload(G, h, 128);
    dt_mat cs = up(G, h, L, 128, DT_F32), sn = up(G, h + L * 128, L, 128, DT_F32);
    void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
    for (int op = 0; op < 4; op++) {
        double t[20], bytes = 0;
        const char *name = "";
        for (int i = 0; i < 23; i++) {
            if (i >= 3) GP->event_record(G, e0);
            switch (op) {
            case 0: G->layernorm_mod(G, y, x, sh, sc, 1e-6f); name = "layernorm_mod [4608,3072]"; bytes = 4.0 * L * D; break;
            case 1: G->head_norm_rope(G, x, 24, 128, w, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED); name = "head_norm_rope [4608,24x128]";
                    bytes = 4.0 * L * D + 8.0 * L * 128; break;
            case 2: G->act_mul(G, o, a, b, DT_ACT_SILU); name = "act_mul silu*b [4608,9216]"; bytes = 6.0 * L * F; break;
            default: G->gated_add(G, x, sc, y); name = "gated_add [4608,3072]"; bytes = 6.0 * L * D; break;
            }
            if (i >= 3) { GP->event_record(G, e1); t[i - 3] = GP->event_elapsed_ms(G, e0, e1); }
        }
        double ms = median(t, 20);
        printf("TIME %-44s %8.4f ms  %7.0f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
    }
    GP->event_destroy(G, e0); GP->event_destroy(G, e1);
    G->free(G, &x); G->free(G, &y); G->free(G, &a); G->free(G, &b); G->free(G, &o);
    G->free(G, &sh); G->free(G, &sc); G->free(G, &w); G->free(G, &cs); G->free(G, &sn);
    free(h);
}

/* Copies: 472 MB contiguous (cudaMemcpyAsync) and a [4608, 3072] column view of [4608, 9216] (the copy kernel);
 * GB/s = bytes read + written. */
static void time_copy(void) {
    /* timings: 472 MB contiguous; a [4608, 3072] column view of [4608, 9216] */
    void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
    for (int k = 0; k < 2; k++) {
        int64_t rows = k == 0 ? 57600 : 4608, cols = k == 0 ? 4096 : 3072, ld = k == 0 ? 4096 : 9216;
        dt_mat src = dt_alloc_or_die(G, rows, ld, DT_BF16), dst = dt_alloc_or_die(G, rows, ld, DT_BF16);
        dt_mat sv = dt_mat_cols(src, k == 0 ? 0 : 3072, cols), dv = dt_mat_cols(dst, 0, cols);
        double t[20];
        for (int r = 0; r < 23; r++) {
            if (r >= 3) GP->event_record(G, e0);
            G->copy(G, dv, sv);
            if (r >= 3) { GP->event_record(G, e1); t[r - 3] = GP->event_elapsed_ms(G, e0, e1); }
        }
        double ms = median(t, 20);
        const char *nm = k == 0 ? "copy bf16 contiguous 472 MB" : "copy bf16 view [4608,3072] kernel";
        printf("TIME %-44s %8.4f ms  %7.0f GB/s\n", nm, ms, 2.0 * rows * cols * 2 / (ms * 1e-3) / 1e9);
        G->free(G, &src); G->free(G, &dst);
    }
    GP->event_destroy(G, e0); GP->event_destroy(G, e1);
}

int main(void) {
    int rc = gpu_ops_open("time_elementwise", NULL);
    if (rc >= 0) return rc;
    time_elementwise();
    time_copy();
    gpu_ops_close();
    return T_DONE();
}
