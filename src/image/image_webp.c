/* image_webp.c — WebP decoding from memory with libwebp: lossy or lossless still images, RGB, or RGBA when
 * the file has alpha (Pillow's modes; colours under transparent pixels are kept as stored). Animated files
 * are refused. */
#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>

#include "core/common.h"
#include "image/image.h"

static const char *status_text(VP8StatusCode s) {
    switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "corrupt data";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "truncated file (the data ends inside the image)";
    default: return "cannot decode";
    }
}

int dt_image_decode_webp(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, int header_only,
                         dt_image *out) {
    memset(out, 0, sizeof *out);
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg)) {
        dt_set_error("%s: WebP: library version mismatch", name);
        return -1;
    }
    VP8StatusCode st = WebPGetFeatures(data, n, &cfg.input);   /* the header alone: nothing is decoded */
    if (st != VP8_STATUS_OK) {
        dt_set_error("%s: WebP: %s", name, status_text(st));
        return -1;
    }
    if (cfg.input.has_animation) {
        dt_set_error("%s: animated WebP is not supported (save one frame as a still image)", name);
        return -1;
    }
    const int w = cfg.input.width, h = cfg.input.height, ch = cfg.input.has_alpha ? 4 : 3;
    if (dt_image_check_size(name, "WebP", w, h, lim)) return -1;
    if (header_only) {
        out->w = w;
        out->h = h;
        out->channels = ch;
        return 0;
    }
    const size_t stride = (size_t)w * (size_t)ch, size = stride * (size_t)h;
    uint8_t *pix = malloc(size);
    if (!pix) {
        dt_set_error("%s: WebP: out of memory", name);
        return -1;
    }
    cfg.output.colorspace = ch == 4 ? MODE_RGBA : MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = pix;
    cfg.output.u.RGBA.stride = (int)stride;
    cfg.output.u.RGBA.size = size;
    st = WebPDecode(data, n, &cfg);
    WebPFreeDecBuffer(&cfg.output);
    if (st != VP8_STATUS_OK) {
        free(pix);
        dt_set_error("%s: WebP: %s", name, status_text(st));
        return -1;
    }
    out->w = w;
    out->h = h;
    out->channels = ch;
    out->nearest = 0;
    out->px = pix;
    return 0;
}
