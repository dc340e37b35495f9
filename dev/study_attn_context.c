/* study_attn_context.c — the attention inside the single block's sequence: the same attention call (Q/K/V column views of the fused [L, 3D+2F] projection output, as in the model),
 * timed between two events after different predecessors, interleaved per repetition: nothing (idle queue),
 * itself, the projection GEMM that writes the buffer, a 255 MB copy (L2 full of dirty lines), the GEMM +
 * QK norm/RoPE (the model's order), and the GEMM followed by a host pause of 20 ms (clocks recover). Which
 * predecessor slows it says where the in-model attention gap (0.50 vs 0.41 ms) comes from.
 *   usage: make dev && build/dev/study_attn_context   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

static void study_attn_context(void) {
    const int64_t L = 4608, D = 3072, F = 9216, H = 24, hd = 128, P = 3 * D + 2 * F;
    wsrc w = make_weights(P, D, 4, 64, 0);
    float *hx = rand_bf((size_t)L * D, -1.f, 1.f);
    dt_linear *gw = G->linear_create(G, &w.src);
    dt_mat a = upa(G, hx, L, D), p = dt_alloc_or_die(G, L, P, DT_BF16), o = dt_alloc_or_die(G, L, D, DT_BF16);
    dt_mat big0 = dt_alloc_or_die(G, L, P, DT_BF16), big1 = dt_alloc_or_die(G, L, P, DT_BF16);
    dt_mat nw, cs, sn;
    norm_rope_params(L, hd, &nw, &cs, &sn);
    dt_mat q = dt_mat_cols(p, 0, D), k = dt_mat_cols(p, D, D), v = dt_mat_cols(p, 2 * D, D);
    float sc = 1.f / sqrtf((float)hd);
    G->linear(G, p, a, gw);
    G->head_norm_rope(G, q, H, hd, nw, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED);
    G->head_norm_rope(G, k, H, hd, nw, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED);
    G->copy(G, big0, p);
    for (int i = 0; i < 3; i++) G->attention(G, o, q, k, v, H, H, hd, sc, dt_mat_null(), 0);
    static const char *names[6] = {"after idle", "after itself", "after proj GEMM", "after 255 MB copy",
                                   "after GEMM + QK norm/RoPE", "after GEMM + 20 ms pause"};
    enum { REPS = 15 };
    double t[6][REPS], tg[REPS];
    void *e0 = GP->event_create(G), *e1 = GP->event_create(G), *e2 = GP->event_create(G);
    for (int r = 0; r < REPS; r++) {
        for (int c = 0; c < 6; c++) {
            G->sync(G);
            if (c == 0) pause_ms(20);
            if (c == 1) G->attention(G, o, q, k, v, H, H, hd, sc, dt_mat_null(), 0);
            if (c == 2 || c == 4 || c == 5) { GP->event_record(G, e2); G->linear(G, p, a, gw); }
            if (c == 3) G->copy(G, big1, big0);
            if (c == 4) {
                G->head_norm_rope(G, q, H, hd, nw, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED);
                G->head_norm_rope(G, k, H, hd, nw, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED);
            }
            if (c == 5) { G->sync(G); pause_ms(20); }
            GP->event_record(G, e0);
            G->attention(G, o, q, k, v, H, H, hd, sc, dt_mat_null(), 0);
            GP->event_record(G, e1);
            t[c][r] = GP->event_elapsed_ms(G, e0, e1);
            if (c == 2) tg[r] = GP->event_elapsed_ms(G, e2, e0);
        }
    }
    double fl = 4.0 * L * L * H * hd;
    for (int c = 0; c < 6; c++) {
        double ms = median(t[c], REPS);
        printf("TIME attention L=4608 24x128 %-28s %8.4f ms  %6.1f TFLOPS\n", names[c], ms, fl / (ms * 1e-3) / 1e12);
    }
    printf("TIME   (the proj GEMM before it: %.4f ms)\n", median(tg, REPS));
    GP->event_destroy(G, e0); GP->event_destroy(G, e1); GP->event_destroy(G, e2);
    G->free(G, &a); G->free(G, &p); G->free(G, &o); G->free(G, &big0); G->free(G, &big1);
    G->free(G, &nw); G->free(G, &cs); G->free(G, &sn);
    G->linear_destroy(G, gw);
    free(hx);
    free_weights(&w);
}

int main(void) {
    int rc = gpu_ops_open("study_attn_context", NULL);
    if (rc >= 0) return rc;
    study_attn_context();
    gpu_ops_close();
    return T_DONE();
}
