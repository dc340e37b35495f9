/* study_ew_ab.c — A/B of the elementwise kernels at klein-4B shapes: SwiGLU through the
 * 16-byte-chunk kernel vs the generic elementwise kernel (the same views shifted by one element, so not 16-byte
 * aligned: what makes act_mul take the generic kernel), on the model's strided views (a, b: column halves of the
 * [L, 3D+2F] projection; y: the second part of [L, D+F]), and layernorm_mod with f32 and bf16 input for
 * reference. Rounds interleave the arms; medians of 15 rounds x 5 runs.
 *   usage: make dev && build/dev/study_ew_ab   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

static void study_ew_ab(void) {
    const int64_t L = 4608, D = 3072, F = 9216, P = 3 * D + 2 * F;
    float *h = rand_bf((size_t)L * D, -2.f, 2.f);
    dt_mat s = up(G, h, L, D, DT_F32), a = dt_alloc_or_die(G, L, D, DT_BF16);
    dt_mat sh = upa(G, h, 1, D), sc = upa(G, h + D, 1, D);
    dt_mat p = dt_alloc_or_die(G, L, P, DT_BF16), c = dt_alloc_or_die(G, L, D + F, DT_BF16);
    dt_mat ga = dt_mat_cols(p, 3 * D, F), gb = dt_mat_cols(p, 3 * D + F, F), gy = dt_mat_cols(c, D, F);
    dt_mat ga1 = dt_mat_cols(p, 3 * D + 1, F - 1), gb1 = dt_mat_cols(p, 3 * D + F + 1, F - 1),
           gy1 = dt_mat_cols(c, D + 1, F - 1);   /* not 16-byte aligned: the generic kernel */
    for (int64_t r0 = 0; r0 < L; r0 += 512) {   /* fill p with copies of random rows */
        int64_t n = L - r0 < 512 ? L - r0 : 512;
        for (int64_t k = 0; k + D <= P; k += D) G->copy(G, dt_mat_rows(dt_mat_cols(p, k, D), r0, n), dt_mat_rows(dt_mat_cols(s, 0, D), r0, n));
    }
    dt_mat sb = upa(G, h, L, D);   /* bf16 input */
    const char *names[4] = {"SwiGLU [4608,9216] views, generic kernel", "SwiGLU views, chunk kernel",
                            "layernorm_mod [4608,3072] f32 in", "layernorm_mod [4608,3072] bf16 in"};
    enum { NA = 4, ROUNDS = 15, PER = 5 };
    double t[NA][ROUNDS];
    void *ev[NA + 1];
    for (int i = 0; i <= NA; i++) ev[i] = GP->event_create(G);
    for (int r = -1; r < ROUNDS; r++) {
        GP->event_record(G, ev[0]);
        for (int k = 0; k < NA; k++) {
            for (int i = 0; i < PER; i++) {
                if (k == 0) G->act_mul(G, gy1, ga1, gb1, DT_ACT_SILU);
                else if (k == 1) G->act_mul(G, gy, ga, gb, DT_ACT_SILU);
                else G->layernorm_mod(G, a, k == 2 ? s : sb, sh, sc, 1e-6f);
            }
            GP->event_record(G, ev[k + 1]);
        }
        if (r >= 0) for (int k = 0; k < NA; k++) t[k][r] = GP->event_elapsed_ms(G, ev[k], ev[k + 1]) / PER;
    }
    const double bytes[NA] = {6.0 * L * F, 6.0 * L * F, 6.0 * L * D, 4.0 * L * D};
    for (int k = 0; k < NA; k++) {
        double ms = median(t[k], ROUNDS);
        printf("TIME ewab %-44s %8.4f ms  %6.0f GB/s\n", names[k], ms, bytes[k] / (ms * 1e-3) / 1e9);
    }
    for (int i = 0; i <= NA; i++) GP->event_destroy(G, ev[i]);
    G->free(G, &s); G->free(G, &a); G->free(G, &sh); G->free(G, &sc); G->free(G, &p); G->free(G, &c);
    G->free(G, &sb);
    free(h);
}

int main(void) {
    int rc = gpu_ops_open("study_ew_ab", NULL);
    if (rc >= 0) return rc;
    study_ew_ab();
    gpu_ops_close();
    return T_DONE();
}
