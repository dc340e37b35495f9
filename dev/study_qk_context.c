/* study_qk_context.c — the single block's QK norm + RoPE in context: in the model the fused
 * pass over q and k costs ~0.087 ms (bench ledger) against ~0.039 ms for two contiguous [4608, 3072] tensors in
 * isolation. The same two head_norm_rope calls, timed between events, interleaved per repetition: on contiguous
 * tensors or on column views of the fused [L, 3D+2F] projection output (row stride 55 KB) or of a [L, 3D] Q|K|V
 * buffer (18 KB), each after itself or right after the GEMM that writes its buffer (or, for the contiguous
 * tensors, after the projection GEMM writing elsewhere). Which case is slow says whether the stride or the
 * preceding GEMM (its write-back, the clock after it) costs the in-model time.
 *   usage: make dev && build/dev/study_qk_context   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

static void study_qk_context(void) {
    const int64_t L = 4608, D = 3072, F = 9216, H = 24, hd = 128, P = 3 * D + 2 * F;
    wsrc w = make_weights(P, D, 4, 64, 0), w3 = make_weights(3 * D, D, 4, 64, 0);
    float *hx = rand_bf((size_t)L * D, -1.f, 1.f);
    dt_linear *gw = G->linear_create(G, &w.src), *g3 = G->linear_create(G, &w3.src);
    dt_mat a = upa(G, hx, L, D), p = dt_alloc_or_die(G, L, P, DT_BF16), p3 = dt_alloc_or_die(G, L, 3 * D, DT_BF16);
    dt_mat qc = dt_alloc_or_die(G, L, D, DT_BF16), kc = dt_alloc_or_die(G, L, D, DT_BF16);
    dt_mat nw, cs, sn;
    norm_rope_params(L, hd, &nw, &cs, &sn);
    G->linear(G, p, a, gw);
    G->linear(G, p3, a, g3);
    G->copy(G, qc, dt_mat_cols(p, 0, D));
    G->copy(G, kc, dt_mat_cols(p, D, D));
    struct { const char *nm; dt_mat q, k; const dt_linear *pre; dt_mat out; } cs_[6] = {
        {"contiguous, after itself", qc, kc, NULL, {0}},
        {"views ld 3D+2F, after itself", dt_mat_cols(p, 0, D), dt_mat_cols(p, D, D), NULL, {0}},
        {"views ld 3D+2F, after its GEMM", dt_mat_cols(p, 0, D), dt_mat_cols(p, D, D), gw, p},
        {"contiguous, after the proj GEMM", qc, kc, gw, p},
        {"views ld 3D, after itself", dt_mat_cols(p3, 0, D), dt_mat_cols(p3, D, D), NULL, {0}},
        {"views ld 3D, after its GEMM", dt_mat_cols(p3, 0, D), dt_mat_cols(p3, D, D), g3, p3},
    };
    enum { NC = 6, REPS = 15 };
    double t[NC][REPS];
    void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
    for (int r = 0; r < REPS; r++)
        for (int c0 = 0; c0 < NC; c0++) {
            int c = (c0 + r) % NC;   /* the order rotates */
            if (cs_[c].pre) G->linear(G, cs_[c].out, a, cs_[c].pre);
            else {
                G->head_norm_rope(G, cs_[c].q, H, hd, nw, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED);
                G->head_norm_rope(G, cs_[c].k, H, hd, nw, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED);
            }
            GP->event_record(G, e0);
            G->head_norm_rope(G, cs_[c].q, H, hd, nw, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED);
            G->head_norm_rope(G, cs_[c].k, H, hd, nw, 1e-6f, cs, sn, DT_ROPE_INTERLEAVED);
            GP->event_record(G, e1);
            t[c][r] = GP->event_elapsed_ms(G, e0, e1);
        }
    const double bytes = 2.0 * 2 * (double)L * D * 2;   /* q and k, read + written, bf16 */
    for (int c = 0; c < NC; c++) {
        double ms = median(t[c], REPS);
        printf("TIME qk norm+rope %-36s %8.4f ms  %6.0f GB/s\n", cs_[c].nm, ms, bytes / (ms * 1e-3) / 1e9);
    }
    GP->event_destroy(G, e0); GP->event_destroy(G, e1);
    G->free(G, &a); G->free(G, &p); G->free(G, &p3); G->free(G, &qc); G->free(G, &kc);
    G->free(G, &nw); G->free(G, &cs); G->free(G, &sn);
    G->linear_destroy(G, gw); G->linear_destroy(G, g3);
    free(hx);
    free_weights(&w); free_weights(&w3);
}

int main(void) {
    int rc = gpu_ops_open("study_qk_context", NULL);
    if (rc >= 0) return rc;
    study_qk_context();
    gpu_ops_close();
    return T_DONE();
}
