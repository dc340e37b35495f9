/* time_encode.c — encode time and size of one RGB image as PNG (zlib levels, 1 deflate thread vs several), JPEG and
 * WebP (qualities), the encoders a served image waits for; the configurations interleaved round by round, medians
 * of N rounds of the wall time and of the process's CPU time (on a shared machine the CPU time is the stable figure:
 * the work; wall / CPU shows the parallelism when cores are free). CPU only (no GPU needed).
 *   usage: make dev && build/dev/time_encode IMAGE [N]   (IMAGE: a PNG, JPEG or WebP, e.g. a 1024² photo) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/common.h"
#include "image/image.h"
#include "image/png.h"

typedef struct {
    const char *name;
    int format;   /* 0 png, 1 jpeg, 2 webp */
    int level, threads, quality;
} config;

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s IMAGE [N]\n", argv[0]);
        return 2;
    }
    const int rounds = argc > 2 ? atoi(argv[2]) : 9;
    dt_image im;
    if (dt_image_read_file(argv[1], &im)) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    uint8_t *rgb = dt_image_to_rgb(&im);
    const int nt = dt_png_threads_default();
    config cs[] = {
        {"png level 1 (Z_RLE), 1 thread", 0, 1, 1, 0},
        {"png level 1 (Z_RLE), all threads", 0, 1, nt, 0},
        {"png level 2, all threads", 0, 2, nt, 0},
        {"png level 6, all threads", 0, 6, nt, 0},
        {"png level 9, all threads", 0, 9, nt, 0},
        {"jpeg quality 100", 1, 0, 0, 100},
        {"jpeg quality 90", 1, 0, 0, 90},
        {"jpeg quality 75", 1, 0, 0, 75},
        {"webp quality 100", 2, 0, 0, 100},
        {"webp quality 90", 2, 0, 0, 90},
        {"webp quality 75", 2, 0, 0, 75},
    };
    const int nc = (int)(sizeof cs / sizeof cs[0]);
    double *t = calloc((size_t)(nc * rounds), sizeof *t), *cpu = calloc((size_t)(nc * rounds), sizeof *cpu);
    size_t *bytes = calloc((size_t)nc, sizeof *bytes);
    const dt_image_text text[] = {{"prompt", "a photo"}, {"seed", "1"}};
    for (int r = 0; r < rounds; r++) {
        for (int c = 0; c < nc; c++) {
            uint8_t *out = NULL;
            size_t len = 0;
            struct timespec a, b, ca, cb;
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
            clock_gettime(CLOCK_MONOTONIC, &a);
            int rc;
            if (cs[c].format == 0) {
                const dt_png_opts o = {cs[c].level, cs[c].threads};
                rc = dt_png_encode_opts(rgb, im.w, im.h, text, 2, &o, &out, &len);
            } else if (cs[c].format == 1) {
                rc = dt_image_encode_jpeg(rgb, im.w, im.h, cs[c].quality, text, 2, &out, &len);
            } else {
                rc = dt_image_encode_webp(rgb, im.w, im.h, cs[c].quality, text, 2, &out, &len);
            }
            clock_gettime(CLOCK_MONOTONIC, &b);
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
            if (rc) {
                fprintf(stderr, "%s: %s\n", cs[c].name, dt_last_error());
                return 1;
            }
            t[c * rounds + r] = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
            cpu[c * rounds + r] = (cb.tv_sec - ca.tv_sec) * 1e3 + (cb.tv_nsec - ca.tv_nsec) * 1e-6;
            bytes[c] = len;
            free(out);
        }
    }
    const double raw = (double)im.w * im.h * 3;
    printf("%s: %dx%d, %d rounds (interleaved), %d threads online (up to 16 used)\n", argv[1], im.w, im.h, rounds, nt);
    for (int c = 0; c < nc; c++) {
        qsort(t + c * rounds, (size_t)rounds, sizeof *t, cmp_double);
        qsort(cpu + c * rounds, (size_t)rounds, sizeof *cpu, cmp_double);
        printf("TIME %-34s wall median %7.1f ms (min %7.1f), CPU median %7.1f ms  %8zu bytes  %.3f of raw\n",
               cs[c].name, t[c * rounds + rounds / 2], t[c * rounds], cpu[c * rounds + rounds / 2], bytes[c],
               bytes[c] / raw);
    }
    free(t);
    free(cpu);
    free(bytes);
    free(rgb);
    dt_image_free(&im);
    return 0;
}
