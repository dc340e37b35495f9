/* image_out.c — a generated image's bytes in the format asked for (image_out.h). */
#include "image/image_out.h"

#include <string.h>
#include <strings.h>

#include "core/common.h"
#include "image/png.h"

const char *dt_out_format_name(dt_out_format f) {
    return f == DT_OUT_JPEG ? "jpeg" : f == DT_OUT_WEBP ? "webp" : "png";
}

const char *dt_out_format_mime(dt_out_format f) {
    return f == DT_OUT_JPEG ? "image/jpeg" : f == DT_OUT_WEBP ? "image/webp" : "image/png";
}

int dt_out_format_parse(const char *s, dt_out_format *f) {
    if (!strcasecmp(s, "png")) *f = DT_OUT_PNG;
    else if (!strcasecmp(s, "jpeg") || !strcasecmp(s, "jpg")) *f = DT_OUT_JPEG;
    else if (!strcasecmp(s, "webp")) *f = DT_OUT_WEBP;
    else return -1;
    return 0;
}

/* The file name's extension (after its last dot, in its last component), or NULL. */
static const char *extension(const char *path) {
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    return dot && (!slash || dot > slash) ? dot + 1 : NULL;
}

int dt_out_format_from_path(const char *path, dt_out_format *f) {
    const char *ext = extension(path);
    return ext ? dt_out_format_parse(ext, f) : -1;
}

int dt_out_format_for_path(const char *path, dt_out_format *f) {
    if (!dt_out_format_from_path(path, f)) return 0;
    static const char *const other[] = {"gif", "bmp", "tif", "tiff", "avif", "heic", "heif", "jxl", "jp2", "ico",
                                        "ppm", "pgm", "pnm", "tga", "exr", "hdr", "svg", "psd", "dds", "qoi"};
    const char *ext = extension(path);
    for (size_t i = 0; ext && i < sizeof other / sizeof other[0]; i++)
        if (!strcasecmp(ext, other[i])) {
            dt_set_error("%s: .%s is not a format ditrun writes (.png, .jpg / .jpeg, .webp; another name gets PNG)",
                         path, ext);
            return -1;
        }
    *f = DT_OUT_PNG;
    return 0;
}

int dt_image_out_encode(dt_out_format f, int compression, int threads, const uint8_t *rgb, int w, int h,
                        const dt_image_text *text, int n_text, uint8_t **out, size_t *len) {
    if (compression < 0) compression = DT_OUT_COMPRESSION_DEFAULT;
    if (compression > 100) {
        dt_set_error("output compression %d is out of range (0..100)", compression);
        return -1;
    }
    switch (f) {
    case DT_OUT_JPEG: return dt_image_encode_jpeg(rgb, w, h, compression ? compression : 1, text, n_text, out, len);
    case DT_OUT_WEBP: return dt_image_encode_webp(rgb, w, h, compression, text, n_text, out, len);
    case DT_OUT_PNG: break;
    }
    const dt_png_opts o = {9 - (compression * 8 + 50) / 100, threads};
    return dt_png_encode_opts(rgb, w, h, text, n_text, &o, out, len);
}
