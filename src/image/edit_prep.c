/* edit_prep.c — FLUX.2-klein's preprocessing of reference images, the inpainting init image and mask
 * (edit_prep.h has the rules and their order). */
#include "image/edit_prep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "image/image_resample.h"

void dt_prep_image_free(dt_prep_image *p) {
    if (!p) return;
    free(p->rgb);
    memset(p, 0, sizeof *p);
}

void dt_prep_area_size(int w, int h, int *rw, int *rh) {
    const int64_t area = (int64_t)w * h;
    if (area <= DT_REF_MAX_AREA) {
        *rw = w;
        *rh = h;
        return;
    }
    const double s = sqrt((double)DT_REF_MAX_AREA / (double)area);
    *rw = (int)(w * s);
    *rh = (int)(h * s);
}

void dt_prep_normalize(const uint8_t *rgb, int w, int h, float *out) {
    const size_t hw = (size_t)w * (size_t)h;
    for (size_t p = 0; p < hw; p++)
        for (int c = 0; c < 3; c++) {
            const float u = (float)rgb[3 * p + (size_t)c] / 255.0f;
            out[(size_t)c * hw + p] = 2.0f * u - 1.0f;   /* two roundings, as numpy (no FMA in C11 mode) */
        }
}

/* im (any mode) -> out: RGB, normalized. */
static void finish(const dt_image *im, dt_prep_image *out) {
    uint8_t *rgb = dt_image_to_rgb(im);
    out->w = im->w;
    out->h = im->h;
    out->rgb = dt_malloc((size_t)3 * (size_t)im->w * (size_t)im->h * sizeof(float));
    dt_prep_normalize(rgb, im->w, im->h, out->rgb);
    free(rgb);
}

/* The area rule on an image: *res is a resized copy, or *im itself (no copy) when it is small enough. */
static int area_resize(const dt_image *im, dt_image *tmp, const dt_image **res) {
    int rw, rh;
    dt_prep_area_size(im->w, im->h, &rw, &rh);
    *res = im;
    if (rw == im->w && rh == im->h) return 0;
    if (dt_image_resize(im, rw, rh, tmp)) return -1;
    *res = tmp;
    return 0;
}

dt_image_limits dt_prep_reference_limits(int64_t max_pixels) {
    dt_image_limits l = {.max_pixels = max_pixels, .min_side = DT_REF_MIN_SIDE, .max_aspect = DT_REF_MAX_ASPECT};
    return l;
}

int dt_prep_check_reference(const dt_image *im, const char *name) {
    if (im->w < DT_REF_MIN_SIDE || im->h < DT_REF_MIN_SIDE) {
        dt_set_error("%s: reference image of %dx%d is too small (both sides must be at least %d pixels)", name, im->w,
                     im->h, DT_REF_MIN_SIDE);
        return -1;
    }
    const double a = (double)im->w / im->h, b = (double)im->h / im->w, ratio = a > b ? a : b;
    if (ratio > DT_REF_MAX_ASPECT) {
        dt_set_error("%s: reference image of %dx%d has an aspect ratio of %.1f:1 (at most %d:1)", name, im->w, im->h,
                     ratio, DT_REF_MAX_ASPECT);
        return -1;
    }
    return 0;
}

int dt_prep_reference(const dt_image *im, const char *name, int multiple, dt_prep_image *out) {
    memset(out, 0, sizeof *out);
    if (multiple < 1) {
        dt_set_error("%s: invalid size multiple %d", name, multiple);
        return -1;
    }
    if (dt_prep_check_reference(im, name)) return -1;
    dt_image tmp = {0}, crop = {0};
    const dt_image *r;
    if (area_resize(im, &tmp, &r)) return -1;
    const int fw = r->w / multiple * multiple, fh = r->h / multiple * multiple;
    if (fw < 1 || fh < 1 || dt_image_crop(r, (r->w - fw) / 2, (r->h - fh) / 2, fw, fh, &crop)) {
        dt_set_error("%s: reference image of %dx%d is smaller than %d pixels after resizing", name, r->w, r->h,
                     multiple);
        dt_image_free(&tmp);
        return -1;
    }
    finish(&crop, out);
    dt_image_free(&crop);
    dt_image_free(&tmp);
    return 0;
}

/* Python's floor division (PIL's crop box of a smaller image has a negative left/top, rounded toward -inf). */
static int floor_div2(int v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

int dt_prep_reference_in_batch(const dt_image *im, const char *name, int fw, int fh, dt_prep_image *out) {
    memset(out, 0, sizeof *out);
    if (fw < 1 || fh < 1) {
        dt_set_error("%s: invalid batch size %dx%d for inpainting references", name, fw, fh);
        return -1;
    }
    if (dt_prep_check_reference(im, name)) return -1;
    uint8_t *rgb = dt_image_to_rgb(im);
    uint8_t *box = dt_calloc((size_t)3 * (size_t)fw * (size_t)fh, 1);   /* black where the box leaves the image */
    const int left = floor_div2(im->w - fw), top = floor_div2(im->h - fh);
    for (int y = 0; y < fh; y++) {
        const int sy = top + y;
        if (sy < 0 || sy >= im->h) continue;
        for (int x = 0; x < fw; x++) {
            const int sx = left + x;
            if (sx < 0 || sx >= im->w) continue;
            memcpy(box + 3 * ((size_t)y * fw + x), rgb + 3 * ((size_t)sy * im->w + sx), 3);
        }
    }
    out->w = fw;
    out->h = fh;
    out->rgb = dt_malloc((size_t)3 * (size_t)fw * (size_t)fh * sizeof(float));
    dt_prep_normalize(box, fw, fh, out->rgb);
    free(box);
    free(rgb);
    return 0;
}

void dt_prep_output_size(const dt_prep_image *refs, int n_refs, int *height, int *width) {
    if (n_refs < 1) return;
    if (*height <= 0) *height = refs[0].h;
    if (*width <= 0) *width = refs[0].w;
}

int dt_prep_init_image(const dt_image *init, const char *name, int multiple, dt_prep_image *out) {
    memset(out, 0, sizeof *out);
    dt_image tmp = {0}, fit = {0};
    const dt_image *r;
    if (multiple < 1) {
        dt_set_error("%s: invalid size multiple %d", name, multiple);
        return -1;
    }
    if (area_resize(init, &tmp, &r)) return -1;
    const int fw = r->w / multiple * multiple, fh = r->h / multiple * multiple;
    if (fw < 1 || fh < 1) {
        dt_set_error("%s: init image of %dx%d is too small (at least %d pixels per side)", name, init->w, init->h,
                     multiple);
        dt_image_free(&tmp);
        return -1;
    }
    int rc = dt_image_resize(r, fw, fh, &fit);
    dt_image_free(&tmp);
    if (rc) return -1;
    finish(&fit, out);
    dt_image_free(&fit);
    return 0;
}

void dt_prep_bilinear(const float *in, int iw, int ih, float *out, int ow, int oh) {
    const float sh = (float)ih / (float)oh, sw = (float)iw / (float)ow;
    int *x0 = dt_malloc((size_t)ow * 2 * sizeof(int));
    float *wx = dt_malloc((size_t)ow * 2 * sizeof(float));
    for (int j = 0; j < ow; j++) {   /* torch's area_pixel_compute_source_index + linear indices/weights */
        float s = sw * ((float)j + 0.5f) - 0.5f;
        if (s < 0.0f) s = 0.0f;
        const int i0 = (int)s;
        x0[2 * j] = i0;
        x0[2 * j + 1] = i0 + (i0 < iw - 1 ? 1 : 0);
        float l1 = s - (float)i0;
        l1 = l1 < 0.0f ? 0.0f : (l1 > 1.0f ? 1.0f : l1);
        wx[2 * j] = 1.0f - l1;
        wx[2 * j + 1] = l1;
    }
    for (int i = 0; i < oh; i++) {
        float s = sh * ((float)i + 0.5f) - 0.5f;
        if (s < 0.0f) s = 0.0f;
        const int y0 = (int)s, y1 = y0 + (y0 < ih - 1 ? 1 : 0);
        float l1 = s - (float)y0;
        l1 = l1 < 0.0f ? 0.0f : (l1 > 1.0f ? 1.0f : l1);
        const float a0 = 1.0f - l1, a1 = l1;
        const float *r0 = in + (size_t)y0 * (size_t)iw, *r1 = in + (size_t)y1 * (size_t)iw;
        for (int j = 0; j < ow; j++) {
            const int c0 = x0[2 * j], c1 = x0[2 * j + 1];
            const float b0 = wx[2 * j], b1 = wx[2 * j + 1];
            const float t0 = b0 * r0[c0] + b1 * r0[c1], t1 = b0 * r1[c0] + b1 * r1[c1];
            out[(size_t)i * (size_t)ow + (size_t)j] = a0 * t0 + a1 * t1;
        }
    }
    free(x0);
    free(wx);
}

int dt_prep_mask(const dt_image *mask, const char *name, int init_w, int init_h, int out_w, int out_h, int multiple,
                 float **mask01, float **mask_latent) {
    if (mask01) *mask01 = NULL;
    *mask_latent = NULL;
    if (mask->w != init_w || mask->h != init_h) {
        dt_set_error("%s: mask is %dx%d but the init image is %dx%d (they must have the same size)", name, mask->w,
                     mask->h, init_w, init_h);
        return -1;
    }
    if (multiple < 1 || out_w < multiple || out_h < multiple || out_w % multiple || out_h % multiple) {
        dt_set_error("%s: invalid output size %dx%d for the mask (multiples of %d)", name, out_w, out_h, multiple);
        return -1;
    }
    dt_image fit = {0};
    if (dt_image_resize(mask, out_w, out_h, &fit)) return -1;
    uint8_t *l = dt_image_to_l(&fit);
    dt_image_free(&fit);
    const size_t n = (size_t)out_w * (size_t)out_h;
    float *m = dt_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) m[i] = (float)l[i] / 255.0f >= 0.5f ? 1.0f : 0.0f;
    free(l);
    const int lw = out_w / multiple, lh = out_h / multiple;
    float *lat = dt_malloc((size_t)lw * (size_t)lh * sizeof(float));
    dt_prep_bilinear(m, out_w, out_h, lat, lw, lh);
    *mask_latent = lat;
    if (mask01) *mask01 = m;
    else free(m);
    return 0;
}
