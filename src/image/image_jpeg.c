/* image_jpeg.c — JPEG encoding of generated images (image.h: dt_image_encode_jpeg) and JPEG decoding from memory with libjpeg-turbo (the library Pillow uses, with the same
 * defaults: accurate integer DCT, fancy upsampling), gray -> L, YCbCr/RGB -> RGB. CMYK/YCCK files are
 * refused. The library's "premature end of data" warning is an error (it would otherwise pad the image
 * with gray), raised at the point the data runs out; progressive files with more than MAX_SCANS scans are
 * refused (each scan re-walks the whole image: a few hundred bytes could otherwise cost minutes). */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "core/common.h"
#include "image/image.h"

#define MAX_SCANS 500

typedef struct {
    struct jpeg_error_mgr pub;
    struct jpeg_progress_mgr progress;
    jmp_buf jb;
    const char *name;
} jpeg_ctx;

static void on_error_exit(j_common_ptr c) {
    jpeg_ctx *x = (jpeg_ctx *)c->err;
    char msg[JMSG_LENGTH_MAX];
    c->err->format_message(c, msg);
    dt_set_error("%s: JPEG: %s", x->name, msg);
    longjmp(x->jb, 1);
}

static void on_emit(j_common_ptr c, int level) {
    jpeg_ctx *x = (jpeg_ctx *)c->err;
    if (level < 0) {
        if (c->err->msg_code == JWRN_JPEG_EOF) {
            dt_set_error("%s: JPEG: truncated file (the data ends inside the image)", x->name);
            longjmp(x->jb, 1);
        }
        c->err->num_warnings++;   /* other corrupt-data warnings: decoded as the library does (Pillow too) */
    }
}

static void on_output(j_common_ptr c) { (void)c; }

static void on_progress(j_common_ptr c) {
    jpeg_ctx *x = (jpeg_ctx *)c->err;
    if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > MAX_SCANS) {
        dt_set_error("%s: JPEG: more than %d progressive scans (corrupt or hostile file)", x->name, MAX_SCANS);
        longjmp(x->jb, 1);
    }
}

/* The pixels go to *pix (malloc'd before any scanline is read), freed by the caller on error. */
static int decode(struct jpeg_decompress_struct *ci, jpeg_ctx *x, const uint8_t *data, size_t n,
                  const dt_image_limits *lim, int header_only, dt_image *out, uint8_t **pix) {
    if (setjmp(x->jb)) return -1;
    jpeg_create_decompress(ci);
    ci->progress = &x->progress;
    jpeg_mem_src(ci, data, (unsigned long)n);
    if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK) {
        dt_set_error("%s: JPEG: no image in the file", x->name);
        return -1;
    }
    int ch;
    switch (ci->jpeg_color_space) {
    case JCS_GRAYSCALE: ci->out_color_space = JCS_GRAYSCALE; ch = 1; break;
    case JCS_YCbCr:
    case JCS_RGB: ci->out_color_space = JCS_RGB; ch = 3; break;
    case JCS_CMYK:
    case JCS_YCCK:
        dt_set_error("%s: CMYK JPEG is not supported (convert it to RGB first)", x->name);
        return -1;
    default:
        dt_set_error("%s: JPEG with %d colour components of an unknown colour space is not supported", x->name,
                     ci->num_components);
        return -1;
    }
    if (dt_image_check_size(x->name, "JPEG", ci->image_width, ci->image_height, lim)) return -1;
    if (header_only) {
        out->w = (int)ci->image_width;
        out->h = (int)ci->image_height;
        out->channels = ch;
        return 0;
    }
    /* the library's working memory: a progressive file keeps every DCT coefficient (2 bytes a sample per
     * component), plus a few MB of tables and row buffers; past that it would need a backing store it does not
     * have and fails (an error, not an allocation) */
    ci->mem->max_memory_to_use = (long)((int64_t)ci->image_width * ci->image_height * ci->num_components * 2 +
                                        ((int64_t)16 << 20));
    jpeg_start_decompress(ci);
    if (ci->output_components != ch || ci->output_width != ci->image_width ||
        ci->output_height != ci->image_height) {
        dt_set_error("%s: JPEG: unexpected output layout", x->name);
        return -1;
    }
    const size_t stride = (size_t)ci->output_width * (size_t)ch;
    *pix = malloc(stride * ci->output_height);
    if (!*pix) {
        dt_set_error("%s: JPEG: out of memory", x->name);
        return -1;
    }
    while (ci->output_scanline < ci->output_height) {
        JSAMPROW row = *pix + (size_t)ci->output_scanline * stride;
        if (jpeg_read_scanlines(ci, &row, 1) != 1) {
            dt_set_error("%s: JPEG: truncated file", x->name);
            return -1;
        }
    }
    out->w = (int)ci->output_width;
    out->h = (int)ci->output_height;
    out->channels = ch;
    out->nearest = 0;
    return 0;
}

int dt_image_decode_jpeg(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, int header_only,
                         dt_image *out) {
    memset(out, 0, sizeof *out);
    struct jpeg_decompress_struct ci;
    memset(&ci, 0, sizeof ci);
    jpeg_ctx x;
    memset(&x, 0, sizeof x);
    x.name = name;
    ci.err = jpeg_std_error(&x.pub);
    x.pub.error_exit = on_error_exit;
    x.pub.emit_message = on_emit;
    x.pub.output_message = on_output;
    x.progress.progress_monitor = on_progress;
    uint8_t *pix = NULL;
    int rc = decode(&ci, &x, data, n, lim, header_only, out, &pix);
    jpeg_destroy_decompress(&ci);
    if (rc) {
        free(pix);
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->px = pix;
    return 0;
}

/* ---- encoding ---- */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
} jpeg_enc_err;

static void on_enc_error_exit(j_common_ptr c) {
    jpeg_enc_err *x = (jpeg_enc_err *)c->err;
    char msg[JMSG_LENGTH_MAX];
    c->err->format_message(c, msg);
    dt_set_error("JPEG encoding: %s", msg);
    longjmp(x->jb, 1);
}

/* The text as "key: value" lines, at most cap bytes (a COM marker holds 65533). *n bytes, malloc'd. */
static char *comment_text(const dt_image_text *text, int n_text, size_t cap, size_t *n) {
    size_t total = 0;
    for (int i = 0; i < n_text; i++) total += strlen(text[i].key) + strlen(text[i].value) + 3;
    if (total > cap) total = cap;
    char *c = dt_malloc(total + 1);
    size_t k = 0;
    for (int i = 0; i < n_text && k < total; i++) {
        const char *parts[4] = {text[i].key, ": ", text[i].value, "\n"};
        for (int p = 0; p < 4 && k < total; p++) {
            size_t m = strlen(parts[p]);
            if (m > total - k) m = total - k;
            memcpy(c + k, parts[p], m);
            k += m;
        }
    }
    *n = k;
    return c;
}

/* Everything that can longjmp; *buf / *size are libjpeg's memory destination (freed by the caller). */
static int encode(struct jpeg_compress_struct *ci, jpeg_enc_err *x, const uint8_t *rgb, int w, int h, int quality,
                  const char *comment, size_t comment_len, unsigned char **buf, unsigned long *size) {
    if (setjmp(x->jb)) return -1;
    jpeg_create_compress(ci);
    jpeg_mem_dest(ci, buf, size);
    ci->image_width = (JDIMENSION)w;
    ci->image_height = (JDIMENSION)h;
    ci->input_components = 3;
    ci->in_color_space = JCS_RGB;
    jpeg_set_defaults(ci);
    jpeg_set_quality(ci, quality, TRUE);
    ci->dct_method = JDCT_ISLOW;
    jpeg_start_compress(ci, TRUE);
    if (comment_len) jpeg_write_marker(ci, JPEG_COM, (const JOCTET *)comment, (unsigned)comment_len);
    const size_t stride = (size_t)w * 3;
    while (ci->next_scanline < ci->image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)ci->next_scanline * stride);
        jpeg_write_scanlines(ci, &row, 1);
    }
    jpeg_finish_compress(ci);
    return 0;
}

int dt_image_encode_jpeg(const uint8_t *rgb, int w, int h, int quality, const dt_image_text *text, int n_text,
                         uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (w < 1 || h < 1 || w > 65500 || h > 65500 || quality < 1 || quality > 100) {
        dt_set_error("JPEG encoding: invalid size %dx%d or quality %d (1..65500 per side, quality 1..100)", w, h,
                     quality);
        return -1;
    }
    struct jpeg_compress_struct ci;
    memset(&ci, 0, sizeof ci);
    jpeg_enc_err x;
    memset(&x, 0, sizeof x);
    ci.err = jpeg_std_error(&x.pub);
    x.pub.error_exit = on_enc_error_exit;
    x.pub.output_message = on_output;
    size_t comment_len = 0;
    char *comment = comment_text(text, n_text, 65533, &comment_len);
    unsigned char *buf = NULL;
    unsigned long size = 0;
    int rc = encode(&ci, &x, rgb, w, h, quality, comment, comment_len, &buf, &size);
    jpeg_destroy_compress(&ci);
    free(comment);
    if (rc) {
        free(buf);
        return -1;
    }
    *out = buf;   /* libjpeg-turbo's memory destination is malloc'd: free() releases it */
    *len = size;
    return 0;
}
