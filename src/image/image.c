/* image.c — format detection, file reading and Pillow's mode conversions (to RGB, to L) for decoded
 * images; the decoders themselves are image_png.c, image_jpeg.c and image_webp.c. */
#include "image/image.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/infile.h"

int dt_image_check_size(const char *name, const char *format, int64_t w, int64_t h) {
    if (w < 1 || h < 1) {
        dt_set_error("%s: %s image has an empty size %lldx%lld", name, format, (long long)w, (long long)h);
        return -1;
    }
    if (w > DT_IMAGE_MAX_SIDE || h > DT_IMAGE_MAX_SIDE || w * h > DT_IMAGE_MAX_PIXELS) {
        dt_set_error("%s: %s image of %lldx%lld pixels is too large (at most %d per side and %lld pixels)", name,
                     format, (long long)w, (long long)h, DT_IMAGE_MAX_SIDE, (long long)DT_IMAGE_MAX_PIXELS);
        return -1;
    }
    return 0;
}

int dt_image_decode(const uint8_t *data, size_t n, const char *name, dt_image *out) {
    memset(out, 0, sizeof *out);
    if (!name) name = "image";
    if (!data || n == 0) {
        dt_set_error("%s: empty image data", name);
        return -1;
    }
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 8 && !memcmp(data, png_sig, 8)) return dt_image_decode_png(data, n, name, out);
    if (n >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return dt_image_decode_jpeg(data, n, name, out);
    if (n >= 12 && !memcmp(data, "RIFF", 4) && !memcmp(data + 8, "WEBP", 4)) return dt_image_decode_webp(data, n, name, out);
    dt_set_error("%s: not a PNG, JPEG or WebP image", name);
    return -1;
}

int dt_image_read_file(const char *path, dt_image *out) {
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
    int rc = dt_image_decode(buf, got, path, out);
    free(buf);
    return rc;
}

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
