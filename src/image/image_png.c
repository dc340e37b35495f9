/* image_png.c — PNG decoding from memory with libpng, keeping Pillow's mode: gray -> L (1/2/4-bit
 * samples scaled to 0..255 by bit replication; 1-bit is Pillow's bilevel mode "1", resized with nearest
 * neighbour), gray+alpha -> LA, RGB, RGBA, palette -> the palette colours (tRNS ignored, as Pillow's
 * RGB conversion ignores it; nearest-neighbour resizing). 16-bit files are refused (image.h says why).
 * Truncated data is an error as soon as the reader runs out; chunks after the pixel data are not read
 * (Pillow does not require them either). */
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "image/image.h"

typedef struct {
    const uint8_t *data;
    size_t n, pos;
    const char *name;
    const dt_image_limits *lim;
    int header_only;
    uint8_t *pix;         /* [h, w, read channels] */
    png_bytep *rows;
    int failed_msg;       /* error already set */
} png_src;

static void on_error(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    if (!s->failed_msg) dt_set_error("%s: PNG: %s", s->name, msg);
    s->failed_msg = 1;
    png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    dt_log(2, "%s: PNG warning: %s\n", s->name, msg);
}

static void on_read(png_structp png, png_bytep out, png_size_t len) {
    png_src *s = png_get_io_ptr(png);
    if (len > s->n - s->pos) {
        dt_set_error("%s: PNG: truncated file (the data ends inside the image)", s->name);
        s->failed_msg = 1;
        png_longjmp(png, 1);
    }
    memcpy(out, s->data + s->pos, len);
    s->pos += len;
}

static void fail(png_structp png, png_src *s, const char *msg) {
    dt_set_error("%s: %s", s->name, msg);
    s->failed_msg = 1;
    png_longjmp(png, 1);
}

/* Everything that can longjmp; state lives in *s so nothing needs to be volatile. */
static int decode(png_structp png, png_infop info, png_src *s, dt_image *out) {
    if (setjmp(png_jmpbuf(png))) return -1;
    png_set_read_fn(png, s, on_read);
    /* the library's own bounds: no side past 2^20 (it refuses such an IHDR itself), at most 8 MiB for one chunk and
     * 1000 ancillary chunks kept; the caller's tighter limits are checked below from the header (a message naming
     * them), before any pixel buffer is allocated */
    png_set_user_limits(png, 1u << 20, 1u << 20);
    png_set_chunk_malloc_max(png, (png_alloc_size_t)8 << 20);
    png_set_chunk_cache_max(png, 1000);
    /* ancillary chunks the conversion never uses: not parsed at all */
    static const png_byte skip[] = {'t', 'E', 'X', 't', '\0', 'z', 'T', 'X', 't', '\0', 'i', 'T', 'X', 't', '\0',
                                    'i', 'C', 'C', 'P', '\0', 's', 'P', 'L', 'T', '\0', 'e', 'X', 'I', 'f', '\0'};
    png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, skip, (int)(sizeof skip / 5));
    png_read_info(png, info);
    const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    const int ct = png_get_color_type(png, info), bd = png_get_bit_depth(png, info);
    if (bd == 16)
        fail(png, s, "16-bit PNG is not supported (the reference keeps only the high byte of 16-bit colour and turns "
                     "16-bit gray into white); save it with 8 bits per sample");
    if (dt_image_check_size(s->name, "PNG", w, h, s->lim)) { s->failed_msg = 1; png_longjmp(png, 1); }
    int read_ch;
    switch (ct) {
    case PNG_COLOR_TYPE_GRAY:
        read_ch = 1;
        if (bd < 8) png_set_expand_gray_1_2_4_to_8(png);
        out->nearest = bd == 1;
        break;
    case PNG_COLOR_TYPE_GRAY_ALPHA: read_ch = 2; break;
    case PNG_COLOR_TYPE_RGB: read_ch = 3; break;
    case PNG_COLOR_TYPE_RGB_ALPHA: read_ch = 4; break;
    case PNG_COLOR_TYPE_PALETTE:
        read_ch = 1;                     /* indices, one byte each */
        if (bd < 8) png_set_packing(png);
        out->nearest = 1;
        break;
    default: fail(png, s, "PNG: unknown colour type"); return -1;
    }
    if (s->header_only) {
        out->w = (int)w;
        out->h = (int)h;
        out->channels = ct == PNG_COLOR_TYPE_PALETTE ? 3 : read_ch;
        return 0;
    }
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * (size_t)read_ch) fail(png, s, "PNG: unexpected row layout");
    s->pix = malloc((size_t)w * h * (size_t)read_ch);
    s->rows = malloc((size_t)h * sizeof *s->rows);
    if (!s->pix || !s->rows) fail(png, s, "PNG: out of memory");
    for (png_uint_32 y = 0; y < h; y++) s->rows[y] = s->pix + (size_t)y * w * (size_t)read_ch;
    png_read_image(png, s->rows);

    out->w = (int)w;
    out->h = (int)h;
    if (ct == PNG_COLOR_TYPE_PALETTE) {
        png_colorp pal = NULL;
        int npal = 0;
        if (!png_get_PLTE(png, info, &pal, &npal) || npal < 1) fail(png, s, "PNG: palette image without a palette");
        const size_t n = (size_t)w * h;
        uint8_t *rgb = malloc(n * 3);
        if (!rgb) fail(png, s, "PNG: out of memory");
        for (size_t i = 0; i < n; i++) {
            const int k = s->pix[i];
            if (k >= npal) {
                free(rgb);
                fail(png, s, "PNG: palette index out of range (corrupt file)");
            }
            rgb[3 * i] = pal[k].red;
            rgb[3 * i + 1] = pal[k].green;
            rgb[3 * i + 2] = pal[k].blue;
        }
        free(s->pix);
        s->pix = rgb;
        out->channels = 3;
    } else {
        out->channels = read_ch;
    }
    out->px = s->pix;
    s->pix = NULL;
    return 0;
}

int dt_image_decode_png(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, int header_only,
                        dt_image *out) {
    memset(out, 0, sizeof *out);
    png_src s = {.data = data, .n = n, .name = name, .lim = lim, .header_only = header_only};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, on_error, on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    int rc = -1;
    if (!png || !info) dt_set_error("%s: cannot initialize libpng", name);
    else rc = decode(png, info, &s, out);
    png_destroy_read_struct(png ? &png : NULL, info ? &info : NULL, NULL);
    free(s.rows);
    free(s.pix);
    if (rc) {
        free(out->px);
        memset(out, 0, sizeof *out);
        if (!s.failed_msg) dt_set_error("%s: PNG: cannot decode", name);
    }
    return rc;
}
