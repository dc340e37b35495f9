/* study_qgemm.c — timing study of the mixed-input GEMM (--qpath mixed): bf16x2 vs f32 dequantization and the
 * staged vs direct epilogue, against the transient path on the same shapes; correctness of each against the
 * transient output (TOL_QPATH).
 *   usage: make dev && build/dev/study_qgemm   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

static void study_qgemm(void) {
    const int64_t shapes[][3] = {{4608, 3072, 27648}, {4608, 12288, 3072}, {4096, 3072, 18432}, {4608, 3072, 9216}};
    for (int si = 0; si < 4; si++) {
        int64_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        wsrc w = make_weights(N, K, 4, 64, 0);
        float *hx = rand_bf((size_t)M * K, -1.f, 1.f);
        dt_qpath saved = G->opts.qpath;
        dt_linear *gt = linear_as(&w, DT_QPATH_TRANSIENT, 0), *gm = linear_as(&w, DT_QPATH_MIXED, 0);
        G->opts.qpath = DT_QPATH_TRANSIENT;
        dt_mat x = upa(G, hx, M, K), y = dt_alloc_or_die(G, M, N, DT_BF16);
        char name[160];
        G->linear(G, y, x, gt);
        float *ref = down(G, y);
        snprintf(name, sizeof name, "study transient %lldx%lldx%lld", (long long)M, (long long)K, (long long)N);
        time_linear(name, y, x, gt, M, N, K);
        /* variants: dequantization math (chosen at create: a Linear of its own) and the epilogue (per call) */
        dt_linear *gf = linear_as(&w, DT_QPATH_MIXED, 1);
        struct { const char *nm; int direct; dt_linear *l; } v[] = {
            {"bf16", 0, gm}, {"bf16 direct-epilogue", 1, gm}, {"f32", 0, gf}};
        for (int vi = 0; vi < 3; vi++) {
            CO->qgemm_direct_epilogue = v[vi].direct;
            dt_linear *lw = v[vi].l;
            snprintf(name, sizeof name, "study mixed %s %lldx%lldx%lld", v[vi].nm, (long long)M, (long long)K, (long long)N);
            poison(G, y);
            G->linear(G, y, x, lw);
            float *o = down(G, y);
            t_check_rel_l2(name, o, ref, (size_t)(M * N), TOL_QPATH);
            free(o);
            time_linear(name, y, x, lw, M, N, K);
        }
        CO->qgemm_direct_epilogue = 0;
        G->linear_destroy(G, gf);
        G->opts.qpath = saved;
        free(ref); free(hx);
        G->free(G, &x); G->free(G, &y);
        G->linear_destroy(G, gt);
        G->linear_destroy(G, gm);
        free_weights(&w);
    }
}

int main(void) {
    int rc = gpu_ops_open("study_qgemm", NULL);
    if (rc >= 0) return rc;
    study_qgemm();
    gpu_ops_close();
    return T_DONE();
}
