/* time_batch_rows.c — what batching same-size requests into one forward could save: the only work a batch shares is
 * the Linears' GEMMs (attention, norms and the elementwise ops are per image either way), so this times klein-4B's
 * Linears at the rows of 1, 2 and 4 images stacked (M = k x (image + 512 text tokens)) and prints the time per image
 * relative to one image. If a batch of 2 saves under ~2% of the GEMM time per image, batching cannot win more than
 * that share of a step (issue 18's "with and without batching" comparison; PERF.md). Shapes: the single block's fused
 * in-projection [27648, 3072] and out-projection [3072, 12288] (20 of the 25 blocks), the double block's QKV
 * [9216, 3072] and feed-forward in [18432, 3072] (image stream), weights bf16 and MLX q4 g64 (transient path), at
 * 1024² (4096 + 512 rows per image) and 512² (1024 + 512).
 *   usage: make dev && build/dev/time_batch_rows   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats) */
#include "gpu_ops.h"

int main(void) {
    int rc = gpu_ops_open("time_batch_rows", NULL);
    if (rc >= 0) return rc;
    static const struct { const char *name; int64_t n, k; } shapes[] = {
        {"single in  [27648, 3072]", 27648, 3072},
        {"single out [3072, 12288]", 3072, 12288},
        {"double qkv [9216, 3072]", 9216, 3072},
        {"double ff_in [18432, 3072]", 18432, 3072},
    };
    static const int64_t rows_per_image[2] = {4096 + 512, 1024 + 512};   /* 1024², 512² */
    static const int batch[3] = {1, 2, 4};
    const int64_t max_m = 4 * rows_per_image[0], max_n = 27648, max_k = 12288;
    float *h = rand_bf((size_t)max_m * max_k, -1.f, 1.f);
    dt_mat x = upa(G, h, max_m, max_k), y = dt_alloc_or_die(G, max_m, max_n, G->act_dtype);
    for (int bits = 0; bits <= 4; bits += 4) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            wsrc w = make_weights(shapes[s].n, shapes[s].k, bits, 64, 0);
            dt_linear *l = linear_as(&w, DT_QPATH_AUTO, 0);
            for (int px = 0; px < 2; px++) {
                double one = 0;
                for (int b = 0; b < 3; b++) {
                    int64_t m = batch[b] * rows_per_image[px];
                    dt_mat xv = dt_mat_cols(dt_mat_rows(x, 0, m), 0, shapes[s].k);
                    dt_mat yv = dt_mat_cols(dt_mat_rows(y, 0, m), 0, shapes[s].n);
                    xv.ld = xv.cols;   /* contiguous views of the first rows */
                    yv.ld = yv.cols;
                    double ms = linear_ms(yv, xv, l);
                    if (b == 0) one = ms;
                    char nm[96];
                    snprintf(nm, sizeof nm, "%s %s %s x%d", bits ? "q4" : "bf16", shapes[s].name,
                             px == 0 ? "1024^2" : "512^2", batch[b]);
                    printf("TIME %-52s %8.3f ms  %7.1f TFLOPS  per image %.3f ms (%.3f of one image's)\n", nm, ms,
                           2.0 * m * shapes[s].n * shapes[s].k / (ms * 1e-3) / 1e12, ms / batch[b],
                           ms / batch[b] / one);
                }
            }
            G->linear_destroy(G, l);
            free_weights(&w);
        }
    }
    G->free(G, &x);
    G->free(G, &y);
    free(h);
    gpu_ops_close();
    return 0;
}
