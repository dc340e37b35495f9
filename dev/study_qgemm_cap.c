/* study_qgemm_cap.c — the quantized GEMMs timed under sustained load: the H200 sits at its 700 W power cap
 * during a forward (SM clock ~1550 MHz instead of 1980), so burst timings flatter the kernels that spend the most
 * energy per FLOP. After a 300 ms heater, rounds run every arm 5 times in turn (events around each arm); the
 * median over the rounds per arm. Arms: cuBLASLt on cached bf16 weights, the transient path (dequantize +
 * cuBLASLt), the mixed GEMM (bf16 math).
 *   usage: make dev && build/dev/study_qgemm_cap   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

static void study_qgemm_cap(void) {
    const int64_t shapes[][3] = {{4608, 3072, 27648}, {4608, 12288, 3072}};
    for (int si = 0; si < 2; si++) {
        int64_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        wsrc w = make_weights(N, K, 4, 64, 0);
        float *hx = rand_bf((size_t)M * K, -1.f, 1.f);
        dt_linear *gc = linear_as(&w, DT_QPATH_CACHED, 0), *gt = linear_as(&w, DT_QPATH_TRANSIENT, 0);
        dt_linear *gm = linear_as(&w, DT_QPATH_MIXED, 0);
        dt_mat x = upa(G, hx, M, K), y = dt_alloc_or_die(G, M, N, DT_BF16);
        struct { const char *nm; dt_linear *l; } arm[] = {
            {"cuBLASLt cached bf16", gc}, {"transient (dequant + cuBLASLt)", gt}, {"mixed bf16", gm}};
        enum { NA = 3, ROUNDS = 9, PER = 5 };
        double t[NA][ROUNDS];
        void *ev[NA + 1];
        for (int i = 0; i <= NA; i++) ev[i] = GP->event_create(G);
        double t0 = dt_now();
        while (dt_now() - t0 < 0.3) { for (int i = 0; i < 20; i++) G->linear(G, y, x, gc); G->sync(G); }
        for (int r = 0; r < ROUNDS; r++) {
            GP->event_record(G, ev[0]);
            for (int a = 0; a < NA; a++) {
                for (int k = 0; k < PER; k++) G->linear(G, y, x, arm[a].l);
                GP->event_record(G, ev[a + 1]);
            }
            for (int a = 0; a < NA; a++) t[a][r] = GP->event_elapsed_ms(G, ev[a], ev[a + 1]) / PER;
        }
        for (int a = 0; a < NA; a++) {
            double ms = median(t[a], ROUNDS);
            printf("TIME sustained %lldx%lldx%lld %-32s %8.4f ms  %6.1f TFLOPS\n", (long long)M, (long long)K,
                   (long long)N, arm[a].nm, ms, 2.0 * M * N * K / (ms * 1e-3) / 1e12);
        }
        for (int i = 0; i <= NA; i++) GP->event_destroy(G, ev[i]);
        G->free(G, &x); G->free(G, &y);
        G->linear_destroy(G, gc); G->linear_destroy(G, gt); G->linear_destroy(G, gm);
        free(hx);
        free_weights(&w);
    }
}

int main(void) {
    int rc = gpu_ops_open("study_qgemm_cap", NULL);
    if (rc >= 0) return rc;
    study_qgemm_cap();
    gpu_ops_close();
    return T_DONE();
}
