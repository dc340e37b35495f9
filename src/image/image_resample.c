/* image_resample.c — Pillow-exact Lanczos / nearest resizing and cropping (image_resample.h). The
 * arithmetic follows Pillow's Resample.c and Geometry.c step for step (double-precision coefficients,
 * the same rounding to 22-bit fixed point, int32 sums), so results are bit-identical to Pillow's. */
#include "image/image_resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

#define PRECISION_BITS 22
#define LANCZOS_SUPPORT 3.0

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

typedef struct {
    int ksize;        /* taps per output pixel */
    int *bounds;      /* [out, 2]: first source index, tap count */
    int32_t *kk;      /* [out, ksize] fixed-point taps */
} coeffs;

/* Taps for out_size outputs over the source span [in0, in1) of an axis of in_size samples. */
static void precompute(int in_size, float in0, float in1, int out_size, coeffs *c) {
    double scale = (double)(in1 - in0) / out_size, filterscale = scale;
    if (filterscale < 1.0) filterscale = 1.0;
    const double support = LANCZOS_SUPPORT * filterscale;
    const int ksize = (int)ceil(support) * 2 + 1;
    double *pre = dt_malloc((size_t)out_size * (size_t)ksize * sizeof(double));
    c->ksize = ksize;
    c->bounds = dt_malloc((size_t)out_size * 2 * sizeof(int));
    c->kk = dt_malloc((size_t)out_size * (size_t)ksize * sizeof(int32_t));
    for (int xx = 0; xx < out_size; xx++) {
        const double center = in0 + (xx + 0.5) * scale, ss = 1.0 / filterscale;
        double ww = 0.0;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = pre + (size_t)xx * (size_t)ksize;
        int x;
        for (x = 0; x < xmax; x++) {
            const double w = lanczos((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        c->bounds[2 * xx] = xmin;
        c->bounds[2 * xx + 1] = xmax;
    }
    for (size_t i = 0; i < (size_t)out_size * (size_t)ksize; i++)
        c->kk[i] = pre[i] < 0 ? (int32_t)(-0.5 + pre[i] * (1 << PRECISION_BITS))
                              : (int32_t)(0.5 + pre[i] * (1 << PRECISION_BITS));
    free(pre);
}

static void coeffs_free(coeffs *c) {
    free(c->bounds);
    free(c->kk);
}

static inline uint8_t clip8(int32_t v) {
    if (v >= (1 << PRECISION_BITS << 8)) return 255;
    if (v <= 0) return 0;
    return (uint8_t)(v >> PRECISION_BITS);
}

/* out [rows, out_w, ch] from in rows [row0, row0 + rows) of [*, in_w, ch]. */
static void pass_h(uint8_t *out, const uint8_t *in, int in_w, int out_w, int row0, int rows, int ch,
                   const coeffs *c) {
    for (int y = 0; y < rows; y++) {
        const uint8_t *src = in + (size_t)(row0 + y) * (size_t)in_w * (size_t)ch;
        uint8_t *dst = out + (size_t)y * (size_t)out_w * (size_t)ch;
        for (int xx = 0; xx < out_w; xx++) {
            const int xmin = c->bounds[2 * xx], xmax = c->bounds[2 * xx + 1];
            const int32_t *k = c->kk + (size_t)xx * (size_t)c->ksize;
            for (int b = 0; b < ch; b++) {
                int32_t ss = 1 << (PRECISION_BITS - 1);
                for (int x = 0; x < xmax; x++) ss += src[(size_t)(x + xmin) * (size_t)ch + (size_t)b] * k[x];
                dst[(size_t)xx * (size_t)ch + (size_t)b] = clip8(ss);
            }
        }
    }
}

/* out [out_h, w, ch] from in [*, w, ch]; bounds are relative to in's first row (row_shift subtracted). */
static void pass_v(uint8_t *out, const uint8_t *in, int w, int out_h, int ch, const coeffs *c, int row_shift) {
    const size_t stride = (size_t)w * (size_t)ch;
    for (int yy = 0; yy < out_h; yy++) {
        const int ymin = c->bounds[2 * yy] - row_shift, ymax = c->bounds[2 * yy + 1];
        const int32_t *k = c->kk + (size_t)yy * (size_t)c->ksize;
        uint8_t *dst = out + (size_t)yy * stride;
        for (size_t i = 0; i < stride; i++) {
            int32_t ss = 1 << (PRECISION_BITS - 1);
            for (int y = 0; y < ymax; y++) ss += in[(size_t)(y + ymin) * stride + i] * k[y];
            dst[i] = clip8(ss);
        }
    }
}

static uint8_t *lanczos_resize(const uint8_t *in, int in_w, int in_h, int ch, int w, int h) {
    const int need_h = w != in_w, need_v = h != in_h;
    coeffs ch_, cv;
    precompute(in_w, 0.0f, (float)in_w, w, &ch_);
    precompute(in_h, 0.0f, (float)in_h, h, &cv);
    const int first = cv.bounds[0], last = cv.bounds[2 * h - 2] + cv.bounds[2 * h - 1];
    uint8_t *out;
    if (need_h && need_v) {
        uint8_t *tmp = dt_malloc((size_t)(last - first) * (size_t)w * (size_t)ch);
        pass_h(tmp, in, in_w, w, first, last - first, ch, &ch_);
        out = dt_malloc((size_t)h * (size_t)w * (size_t)ch);
        pass_v(out, tmp, w, h, ch, &cv, first);
        free(tmp);
    } else if (need_h) {
        out = dt_malloc((size_t)h * (size_t)w * (size_t)ch);
        pass_h(out, in, in_w, w, 0, h, ch, &ch_);
    } else if (need_v) {
        out = dt_malloc((size_t)h * (size_t)w * (size_t)ch);
        pass_v(out, in, w, h, ch, &cv, 0);
    } else {
        out = dt_malloc((size_t)h * (size_t)w * (size_t)ch);
        memcpy(out, in, (size_t)h * (size_t)w * (size_t)ch);
    }
    coeffs_free(&ch_);
    coeffs_free(&cv);
    return out;
}

/* Pillow's affine nearest-neighbour scaling (ImagingScaleAffine): source column positions accumulated
 * in double from the first pixel centre, rows computed per row; pixels mapping outside stay 0. */
static uint8_t *nearest_resize(const uint8_t *in, int in_w, int in_h, int ch, int w, int h) {
    const double a0 = (double)((float)in_w - 0.0f) / w, a4 = (double)((float)in_h - 0.0f) / h;
    uint8_t *out = dt_calloc((size_t)h * (size_t)w * (size_t)ch, 1);
    int *xin = dt_malloc((size_t)w * sizeof(int));
    double xo = 0.0 + a0 * 0.5;
    for (int x = 0; x < w; x++) {
        xin[x] = xo < 0.0 ? -1 : (int)xo;
        xo += a0;
    }
    for (int y = 0; y < h; y++) {
        const double yo = 0.0 + y * a4 + a4 * 0.5;
        const int yi = yo < 0.0 ? -1 : (int)yo;
        if (yi < 0 || yi >= in_h) continue;
        const uint8_t *src = in + (size_t)yi * (size_t)in_w * (size_t)ch;
        uint8_t *dst = out + (size_t)y * (size_t)w * (size_t)ch;
        for (int x = 0; x < w; x++)
            if (xin[x] >= 0 && xin[x] < in_w) memcpy(dst + (size_t)x * (size_t)ch, src + (size_t)xin[x] * (size_t)ch, (size_t)ch);
    }
    free(xin);
    return out;
}

static inline uint8_t muldiv255(unsigned a, unsigned b) {
    unsigned t = a * b + 128;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

int dt_image_resize(const dt_image *src, int w, int h, dt_image *dst) {
    memset(dst, 0, sizeof *dst);
    if (!src->px || src->channels < 1 || src->channels > 4 || w < 1 || h < 1 || w > DT_IMAGE_MAX_SIDE ||
        h > DT_IMAGE_MAX_SIDE || (int64_t)w * h > DT_IMAGE_MAX_PIXELS) {
        dt_set_error("image resize: invalid size %dx%d (from %dx%d)", w, h, src->w, src->h);
        return -1;
    }
    const int ch = src->channels;
    const size_t n_in = (size_t)src->w * (size_t)src->h;
    dst->w = w;
    dst->h = h;
    dst->channels = ch;
    dst->nearest = src->nearest;
    if (w == src->w && h == src->h) {
        dst->px = dt_malloc(n_in * (size_t)ch);
        memcpy(dst->px, src->px, n_in * (size_t)ch);
        return 0;
    }
    if (src->nearest) {
        dst->px = nearest_resize(src->px, src->w, src->h, ch, w, h);
        return 0;
    }
    if (ch == 2 || ch == 4) {   /* Pillow converts LA -> La, RGBA -> RGBa around the filter */
        uint8_t *pm = dt_malloc(n_in * (size_t)ch);
        for (size_t i = 0; i < n_in; i++) {
            const uint8_t *s = src->px + i * (size_t)ch;
            uint8_t *d = pm + i * (size_t)ch;
            const unsigned a = s[ch - 1];
            for (int b = 0; b < ch - 1; b++) d[b] = muldiv255(s[b], a);
            d[ch - 1] = (uint8_t)a;
        }
        uint8_t *r = lanczos_resize(pm, src->w, src->h, ch, w, h);
        free(pm);
        const size_t n = (size_t)w * (size_t)h;
        for (size_t i = 0; i < n; i++) {
            uint8_t *p = r + i * (size_t)ch;
            const unsigned a = p[ch - 1];
            if (a == 0 || a == 255) continue;
            for (int b = 0; b < ch - 1; b++) {
                const unsigned v = 255u * p[b] / a;
                p[b] = (uint8_t)(v > 255 ? 255 : v);
            }
        }
        dst->px = r;
        return 0;
    }
    dst->px = lanczos_resize(src->px, src->w, src->h, ch, w, h);
    return 0;
}

int dt_image_crop(const dt_image *src, int left, int top, int w, int h, dt_image *dst) {
    memset(dst, 0, sizeof *dst);
    if (!src->px || left < 0 || top < 0 || w < 1 || h < 1 || (int64_t)left + w > src->w ||
        (int64_t)top + h > src->h) {
        dt_set_error("image crop: window %dx%d at (%d, %d) is not inside the %dx%d image", w, h, left, top, src->w,
                     src->h);
        return -1;
    }
    const size_t ch = (size_t)src->channels;
    dst->w = w;
    dst->h = h;
    dst->channels = src->channels;
    dst->nearest = src->nearest;
    dst->px = dt_malloc((size_t)w * (size_t)h * ch);
    for (int y = 0; y < h; y++)
        memcpy(dst->px + (size_t)y * (size_t)w * ch, src->px + ((size_t)(top + y) * (size_t)src->w + (size_t)left) * ch,
               (size_t)w * ch);
    return 0;
}
