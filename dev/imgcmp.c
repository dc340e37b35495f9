/* dev/imgcmp.c — compare two images of the same size (PNG, JPEG or WebP, read by the project's image reader and
 * converted to RGB as Pillow's convert("RGB")): the PSNR of B against A over the 8-bit RGB values (peak 255; "inf"
 * when every value is equal), the mean and max absolute difference. tools/gpu_run.sh's `krea2gen` section uses it
 * on a step-cached image against the uncached one of the same seed.
 *   usage: imgcmp A B   prints "psnr P dB, mean |A-B| M, max |A-B| X (W x H)"; exit 0, or 2 when an image cannot
 *   be read or the sizes differ */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"
#include "image/image.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: imgcmp A B   (PNG, JPEG or WebP of the same size)\n");
        return 2;
    }
    dt_image a = {0}, b = {0};
    if (dt_image_read_file(argv[1], &a) || dt_image_read_file(argv[2], &b)) {
        fprintf(stderr, "imgcmp: %s\n", dt_last_error());
        dt_image_free(&a);
        return 2;
    }
    int rc = 0;
    if (a.w != b.w || a.h != b.h) {
        fprintf(stderr, "imgcmp: %s is %dx%d, %s is %dx%d\n", argv[1], a.w, a.h, argv[2], b.w, b.h);
        rc = 2;
    } else {
        uint8_t *x = dt_image_to_rgb(&a), *y = dt_image_to_rgb(&b);   /* [h, w, 3] */
        const size_t n = (size_t)a.w * a.h * 3;
        double se = 0, sa = 0;
        int mx = 0;
        for (size_t i = 0; i < n; i++) {
            int d = abs((int)x[i] - (int)y[i]);
            se += (double)d * d;
            sa += d;
            if (d > mx) mx = d;
        }
        const double mse = se / (double)n;
        if (mse > 0) printf("psnr %.2f dB", 10.0 * log10(255.0 * 255.0 / mse));
        else printf("psnr inf dB");
        printf(", mean |A-B| %.3f, max |A-B| %d (%d x %d)\n", sa / (double)n, mx, a.w, a.h);
        free(x);
        free(y);
    }
    dt_image_free(&a);
    dt_image_free(&b);
    return rc;
}
