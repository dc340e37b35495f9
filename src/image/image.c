/* image.c — format detection, file reading and Pillow's mode conversions (to RGB, to L) for decoded
 * images; the decoders themselves are image_png.c, image_jpeg.c and image_webp.c. */
#include "image/image.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/infile.h"

dt_image_limits dt_image_limits_resolve(const dt_image_limits *lim) {
    dt_image_limits r = {DT_IMAGE_MAX_PIXELS, DT_IMAGE_MAX_SIDE, 1, 0};
    if (!lim) return r;
    if (lim->max_pixels > 0 && lim->max_pixels < r.max_pixels) r.max_pixels = lim->max_pixels;
    if (lim->max_side > 0 && lim->max_side < r.max_side) r.max_side = lim->max_side;
    if (lim->min_side > 1) r.min_side = lim->min_side;
    if (lim->max_aspect > 0) r.max_aspect = lim->max_aspect;
    return r;
}

int dt_image_check_size(const char *name, const char *format, int64_t w, int64_t h, const dt_image_limits *lim) {
    if (w < 1 || h < 1) {
        dt_set_error("%s: %s image has an empty size %lldx%lld", name, format, (long long)w, (long long)h);
        return -1;
    }
    if (w > lim->max_side || h > lim->max_side) {
        dt_set_error("%s: %s image of %lldx%lld pixels is too large (at most %d per side)", name, format, (long long)w,
                     (long long)h, lim->max_side);
        return -1;
    }
    if (w * h > lim->max_pixels) {
        dt_set_error("%s: %s image of %lldx%lld = %lld pixels is too large (at most %lld pixels per image)", name,
                     format, (long long)w, (long long)h, (long long)(w * h), (long long)lim->max_pixels);
        return -1;
    }
    if (w < lim->min_side || h < lim->min_side) {
        dt_set_error("%s: %s image of %lldx%lld is too small (both sides must be at least %d pixels)", name, format,
                     (long long)w, (long long)h, lim->min_side);
        return -1;
    }
    if (lim->max_aspect > 0 && (w > h * lim->max_aspect || h > w * lim->max_aspect)) {
        const double ratio = w > h ? (double)w / (double)h : (double)h / (double)w;
        dt_set_error("%s: %s image of %lldx%lld has an aspect ratio of %.1f:1 (at most %d:1)", name, format,
                     (long long)w, (long long)h, ratio, lim->max_aspect);
        return -1;
    }
    return 0;
}

static int decode(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, int header_only,
                  dt_image *out) {
    memset(out, 0, sizeof *out);
    if (!name) name = "image";
    if (!data || n == 0) {
        dt_set_error("%s: empty image data", name);
        return -1;
    }
    const dt_image_limits l = dt_image_limits_resolve(lim);
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 8 && !memcmp(data, png_sig, 8)) return dt_image_decode_png(data, n, name, &l, header_only, out);
    if (n >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
        return dt_image_decode_jpeg(data, n, name, &l, header_only, out);
    if (n >= 12 && !memcmp(data, "RIFF", 4) && !memcmp(data + 8, "WEBP", 4))
        return dt_image_decode_webp(data, n, name, &l, header_only, out);
    dt_set_error("%s: not a PNG, JPEG or WebP image", name);
    return -1;
}

int dt_image_decode_ex(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, dt_image *out) {
    return decode(data, n, name, lim, 0, out);
}

int dt_image_probe(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, dt_image *out) {
    return decode(data, n, name, lim, 1, out);
}

int dt_image_decode(const uint8_t *data, size_t n, const char *name, dt_image *out) {
    return dt_image_decode_ex(data, n, name, NULL, out);
}

int dt_image_read_file_ex(const char *path, const dt_image_limits *lim, dt_image *out) {
    memset(out, 0, sizeof *out);
    FILE *f = dt_fopen_input(path);   /* a regular file (a FIFO or device is refused without waiting) */
    if (!f) return -1;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        dt_set_error("%s: cannot read (not a regular file?)", path);
        return -1;
    }
    if ((size_t)len > DT_IMAGE_MAX_FILE_BYTES) {
        fclose(f);
        dt_set_error("%s: file of %ld bytes is too large for an image (at most %zu)", path, len,
                     DT_IMAGE_MAX_FILE_BYTES);
        return -1;
    }
    uint8_t *buf = dt_malloc(len > 0 ? (size_t)len : 1);
    size_t got = len > 0 ? fread(buf, 1, (size_t)len, f) : 0;
    int err = ferror(f);
    fclose(f);
    if (err || got != (size_t)len) {
        free(buf);
        dt_set_error("%s: read error", path);
        return -1;
    }
    int rc = dt_image_decode_ex(buf, got, path, lim, out);
    free(buf);
    return rc;
}

int dt_image_read_file(const char *path, dt_image *out) { return dt_image_read_file_ex(path, NULL, out); }

void dt_image_free(dt_image *im) {
    if (!im) return;
    free(im->px);
    memset(im, 0, sizeof *im);
}

uint8_t *dt_image_to_rgb(const dt_image *im) {
    const size_t n = (size_t)im->w * (size_t)im->h;
    uint8_t *o = dt_malloc(n * 3);
    const int c = im->channels;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *s = im->px + i * (size_t)c;
        if (c <= 2) {
            o[3 * i] = o[3 * i + 1] = o[3 * i + 2] = s[0];
        } else {
            o[3 * i] = s[0];
            o[3 * i + 1] = s[1];
            o[3 * i + 2] = s[2];
        }
    }
    return o;
}

uint8_t *dt_image_to_l(const dt_image *im) {
    const size_t n = (size_t)im->w * (size_t)im->h;
    uint8_t *o = dt_malloc(n ? n : 1);
    const int c = im->channels;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *s = im->px + i * (size_t)c;
        o[i] = c <= 2 ? s[0] : (uint8_t)((s[0] * 19595u + s[1] * 38470u + s[2] * 7471u + 0x8000u) >> 16);
    }
    return o;
}
