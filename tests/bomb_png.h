/* bomb_png.h — an all-zero RGB PNG of any size, written row by row with libpng into memory: the decompression bomb
 * the image and serve tests feed the decoders (8192² deflates to a few hundred KB and would decode to 201 MB). Header-only:
 * each test program includes it once. */
#ifndef DT_TEST_BOMB_PNG_H
#define DT_TEST_BOMB_PNG_H

#include <png.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint8_t *b; size_t n, cap; } bomb_png_buf;

static void bomb_png_write(png_structp png, png_bytep d, png_size_t n) {
    bomb_png_buf *m = png_get_io_ptr(png);
    if (m->n + n > m->cap) {
        size_t cap = (m->n + n) * 2;
        uint8_t *b = realloc(m->b, cap);
        if (!b) png_error(png, "out of memory");
        m->b = b;
        m->cap = cap;
    }
    memcpy(m->b + m->n, d, n);
    m->n += n;
}
static void bomb_png_flush(png_structp png) { (void)png; }

/* The PNG bytes (malloc'd; *n their count), or NULL when libpng fails. */
static uint8_t *bomb_png(int w, int h, size_t *n) {
    bomb_png_buf m = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    uint8_t *row = calloc((size_t)w * 3, 1);
    if (!png || !info || !row || setjmp(png_jmpbuf(png))) {
        free(row);
        free(m.b);
        png_destroy_write_struct(&png, &info);
        return NULL;
    }
    png_set_write_fn(png, &m, bomb_png_write, bomb_png_flush);
    png_set_compression_level(png, 9);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, row);
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    free(row);
    *n = m.n;
    return m.b;
}

#endif
