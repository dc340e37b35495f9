/* image_jpeg.c — JPEG decoding from memory with libjpeg-turbo (the library Pillow uses, with the same
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
