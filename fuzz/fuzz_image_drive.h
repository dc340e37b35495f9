/* fuzz_image_drive.h — what the image fuzzer does with one input, shared by fuzz/fuzz_image.c and the
 * corpus replay in tests/test_fuzz_corpus.c: decode the bytes as an image (PNG, JPEG or WebP, from memory),
 * and when that works, convert to RGB and L and, for images up to 2^16 pixels, run the editing
 * preprocessing on it (as a reference, as an inpainting init image and as its own mask) plus a resize to a
 * size derived from the input. Returns 1 when the image decoded, 0 when it was refused with an error naming
 * the input, -1 when refused without one (the fuzzer traps on -1). */
#ifndef DT_FUZZ_IMAGE_DRIVE_H
#define DT_FUZZ_IMAGE_DRIVE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "image/edit_prep.h"
#include "image/image.h"
#include "image/image_resample.h"

static inline int fuzz_image_one(const uint8_t *data, size_t size) {
    dt_image im;
    if (dt_image_decode(data, size, "fuzz.img", &im)) return strstr(dt_last_error(), "fuzz.img") ? 0 : -1;
    uint8_t *rgb = dt_image_to_rgb(&im), *l = dt_image_to_l(&im);
    volatile unsigned s = 0;
    const size_t n = (size_t)im.w * (size_t)im.h;
    for (size_t i = 0; i < n; i++) s += rgb[3 * i] + l[i];
    (void)s;
    free(rgb);
    free(l);
    if (n <= ((size_t)1 << 16)) {
        dt_image r;
        if (dt_image_resize(&im, 1 + im.w % 37 + im.h % 5, 1 + im.h % 29 + im.w % 3, &r) == 0) dt_image_free(&r);
        dt_prep_image p;
        if (dt_prep_reference(&im, "fuzz.img", 16, &p) == 0) dt_prep_image_free(&p);
        if (dt_prep_init_image(&im, "fuzz.img", 8, &p) == 0) {
            float *m01 = NULL, *lat = NULL;
            if (dt_prep_mask(&im, "fuzz.img", im.w, im.h, p.w, p.h, 8, &m01, &lat) == 0) {
                free(m01);
                free(lat);
            }
            dt_prep_image_free(&p);
        }
    }
    dt_image_free(&im);
    return 1;
}

#endif
