/* time_image.c — the VAE's big ops: conv2d 3x3 at its largest shapes (TFLOPS), group_norm+SiLU and
 * upsample2x (GB/s over the bytes they must move); CUDA events, median of 10 after 2 warm-up calls.
 *   usage: make dev && build/dev/time_image   (on a machine with an NVIDIA GPU; DITRUN_SEED=N repeats
 *   the random inputs) */
#include "gpu_ops.h"

static void time_image(void) {
    static const int cs[3][3] = {{512, 128, 128}, {256, 512, 512}, {128, 1024, 1024}};
    void *e0 = GP->event_create(G), *e1 = GP->event_create(G);
    for (int i = 0; i < 3; i++) {
        int ch = cs[i][0], h = cs[i][1], w = cs[i][2];
        int64_t HW = (int64_t)h * w;
        float *hw = rand_bf((size_t)ch * ch * 9, -0.05f, 0.05f), *hb = rand_bf((size_t)ch, -1.f, 1.f);
        float *hx = rand_bf((size_t)ch * HW, -2.f, 2.f);
        dt_conv *gc = G->conv_create(G, hw, hb, ch, ch, 3, 1);
        dt_mat x = upa(G, hx, ch, HW), y = dt_alloc_or_die(G, ch, HW, DT_BF16);
        dt_mat ga = dt_param_upload(G, hb, ch), gb = dt_param_upload(G, hb, ch);
        for (int op = 0; op < (i == 0 ? 1 : 3); op++) {
            double t[10];
            for (int r = 0; r < 12; r++) {
                if (r >= 2) GP->event_record(G, e0);
                if (op == 0) G->conv2d(G, y, x, gc, h, w);
                else if (op == 1) G->group_norm(G, y, x, 32, ga, gb, 1e-6f, 1);
                else G->upsample2x(G, dt_mat_reshape(y, ch / 4, 4 * HW), dt_mat_rows(x, 0, ch / 4), h, w);
                if (r >= 2) { GP->event_record(G, e1); t[r - 2] = GP->event_elapsed_ms(G, e0, e1); }
            }
            double ms = median(t, 10);
            char name[96];
            if (op == 0) {
                snprintf(name, sizeof name, "conv2d %d->%d 3x3 %dx%d", ch, ch, h, w);
                printf("TIME %-44s %8.3f ms  %7.1f TFLOPS\n", name, ms, 2.0 * ch * ch * 9 * HW / (ms * 1e-3) / 1e12);
            } else if (op == 1) {
                snprintf(name, sizeof name, "group_norm+silu C=%d %dx%d", ch, h, w);
                printf("TIME %-44s %8.3f ms  %7.0f GB/s\n", name, ms, 6.0 * ch * HW / (ms * 1e-3) / 1e9);
            } else {
                snprintf(name, sizeof name, "upsample2x C=%d %dx%d", ch / 4, h, w);
                printf("TIME %-44s %8.3f ms  %7.0f GB/s\n", name, ms, 10.0 * ch / 4 * HW / (ms * 1e-3) / 1e9);
            }
        }
        G->conv_destroy(G, gc);
        G->free(G, &x); G->free(G, &y); G->free(G, &ga); G->free(G, &gb);
        free(hw); free(hb); free(hx);
    }
    GP->event_destroy(G, e0); GP->event_destroy(G, e1);
}

int main(void) {
    int rc = gpu_ops_open("time_image", NULL);
    if (rc >= 0) return rc;
    time_image();
    gpu_ops_close();
    return T_DONE();
}
