/* image_webp.c — WebP encoding of generated images (lossy, with the parameters as XMP through libwebpmux: image.h
 * dt_image_encode_webp) and WebP decoding from memory with libwebp: lossy or lossless still images, RGB, or RGBA
 * when the file has alpha (Pillow's modes; colours under transparent pixels are kept as stored). Animated files
 * are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>
#include <webp/encode.h>
#include <webp/mux.h>

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

/* ---- encoding ---- */

/* Method 2 of 0 (fastest) .. 6 (smallest): PERF.md, "Image encoding" (size vs time on a 1024² image). */
#define WEBP_METHOD 2

/* A growing text (the XMP packet). */
typedef struct {
    char *data;
    size_t len, cap;
} text_buf;

static void put(text_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = dt_realloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void puts_(text_buf *b, const char *s) { put(b, s, strlen(s)); }

static void xml_escaped(text_buf *o, const char *s) {
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '&') puts_(o, "&amp;");
        else if (c == '<') puts_(o, "&lt;");
        else if (c == '>') puts_(o, "&gt;");
        else if (c == '"') puts_(o, "&quot;");
        else if (c < 32) {
            char ref[16];
            snprintf(ref, sizeof ref, "&#%d;", c == '\t' || c == '\n' || c == '\r' ? c : 0xFFFD);
            puts_(o, ref);
        }
        else put(o, s, 1);
    }
}

/* An XMP packet with one attribute per text entry in the namespace ditrun: (a key's characters outside
 * [A-Za-z0-9_-] become '_'; a key starting with a digit or '-' gets a leading '_'). */
static void xmp_packet(text_buf *o, const dt_image_text *text, int n_text) {
    puts_(o, "<?xpacket begin=\"\xEF\xBB\xBF\" id=\"W5M0MpCehiHzreSzNTczkc9d\"?>\n"
               "<x:xmpmeta xmlns:x=\"adobe:ns:meta/\"><rdf:RDF xmlns:rdf=\"http://www.w3.org/1999/02/22-rdf-syntax-ns#\">"
               "<rdf:Description rdf:about=\"\" xmlns:ditrun=\"urn:ditrun:parameters:1\"");
    for (int i = 0; i < n_text; i++) {
        puts_(o, "\n  ditrun:");
        const char *k = text[i].key;
        if (!((k[0] >= 'A' && k[0] <= 'Z') || (k[0] >= 'a' && k[0] <= 'z') || k[0] == '_')) puts_(o, "_");
        for (; *k; k++) {
            const char c = *k;
            const int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                           c == '-';
            put(o, ok ? k : "_", 1);
        }
        puts_(o, "=\"");
        xml_escaped(o, text[i].value);
        puts_(o, "\"");
    }
    puts_(o, "/></rdf:RDF></x:xmpmeta>\n<?xpacket end=\"w\"?>");
}

int dt_image_encode_webp(const uint8_t *rgb, int w, int h, int quality, const dt_image_text *text, int n_text,
                         uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (w < 1 || h < 1 || w > WEBP_MAX_DIMENSION || h > WEBP_MAX_DIMENSION || quality < 0 || quality > 100) {
        dt_set_error("WebP encoding: invalid size %dx%d or quality %d (1..%d per side, quality 0..100)", w, h, quality,
                     WEBP_MAX_DIMENSION);
        return -1;
    }
    WebPConfig cfg;
    WebPPicture pic;
    if (!WebPConfigInit(&cfg) || !WebPPictureInit(&pic)) {
        dt_set_error("WebP encoding: library version mismatch");
        return -1;
    }
    cfg.quality = (float)quality;
    cfg.method = WEBP_METHOD;
    cfg.thread_level = 1;
    pic.use_argb = 0;
    pic.width = w;
    pic.height = h;
    WebPMemoryWriter wr;
    WebPMemoryWriterInit(&wr);
    pic.writer = WebPMemoryWrite;
    pic.custom_ptr = &wr;
    int ok = WebPPictureImportRGB(&pic, rgb, w * 3) && WebPEncode(&cfg, &pic);
    if (!ok) dt_set_error("WebP encoding failed (libwebp error %d)", (int)pic.error_code);
    WebPPictureFree(&pic);
    if (ok && n_text > 0) {
        text_buf x = {NULL, 0, 0};
        xmp_packet(&x, text, n_text);
        WebPMux *mux = WebPMuxNew();
        const WebPData image = {wr.mem, wr.size}, xmp = {(const uint8_t *)x.data, x.len};
        WebPData assembled = {NULL, 0};
        ok = mux && WebPMuxSetImage(mux, &image, 0) == WEBP_MUX_OK && WebPMuxSetChunk(mux, "XMP ", &xmp, 0) == WEBP_MUX_OK &&
             WebPMuxAssemble(mux, &assembled) == WEBP_MUX_OK;
        if (ok) {
            *out = dt_malloc(assembled.size);
            memcpy(*out, assembled.bytes, assembled.size);
            *len = assembled.size;
        } else {
            dt_set_error("WebP encoding: cannot add the XMP metadata (libwebpmux)");
        }
        WebPDataClear(&assembled);
        WebPMuxDelete(mux);
        free(x.data);
    } else if (ok) {
        *out = dt_malloc(wr.size);
        memcpy(*out, wr.mem, wr.size);
        *len = wr.size;
    }
    WebPMemoryWriterClear(&wr);
    return ok ? 0 : -1;
}
