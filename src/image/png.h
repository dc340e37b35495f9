/* png.h — PNG output of generated images (libpng chunks, zlib deflate over row bands on several threads) and a
 * reader for tests.
 *
 * The writer stores 8-bit RGB, Paeth-filtered rows, no time chunk and fixed zlib settings per level, so identical
 * pixels, text and level give byte-identical files whatever the thread count (golden-file comparisons). Text pairs
 * (prompt, seed, steps, size, model, software, ...) become tEXt chunks; a value that is not plain ASCII is stored as
 * an uncompressed iTXt chunk (UTF-8), since tEXt is Latin-1 only.
 */
#ifndef DT_PNG_H
#define DT_PNG_H

#include <stddef.h>
#include <stdint.h>

#include "image/image.h"

/* key: 1..79 printable Latin-1 characters, no leading/trailing/double spaces; value: UTF-8 */
typedef dt_image_text dt_png_text;

/* zlib level 1 (with Z_RLE: PERF.md, "Image encoding", size vs time on 1024² images) */
#define DT_PNG_LEVEL_DEFAULT 1

typedef struct {
    int level;       /* zlib level 1..9 (0 = DT_PNG_LEVEL_DEFAULT); 1 runs Z_RLE, 2..9 zlib's default strategy */
    int threads;     /* deflate threads (0 = dt_png_threads_default()); never changes the bytes */
} dt_png_opts;

/* The processors online, at most 16. */
int dt_png_threads_default(void);

/* Write rgb [h, w, 3] (row-major, 8-bit) to path. Returns 0 or -1 (dt_last_error names the file). */
int dt_png_write(const char *path, const uint8_t *rgb, int w, int h, const dt_png_text *text, int n_text);

/* The same bytes dt_png_write would write, in memory: *png = malloc'd, *len bytes. Returns 0 or -1. */
int dt_png_encode(const uint8_t *rgb, int w, int h, const dt_png_text *text, int n_text, uint8_t **png, size_t *len);
/* The same with a level and thread count (o NULL: the defaults, as dt_png_encode). */
int dt_png_encode_opts(const uint8_t *rgb, int w, int h, const dt_png_text *text, int n_text, const dt_png_opts *o,
                       uint8_t **png, size_t *len);

/* Read any PNG as 8-bit RGB: *rgb = malloc'd [h, w, 3] (alpha dropped, gray expanded, 16-bit
 * reduced). If text != NULL, *text / *n_text receive malloc'd copies of the text chunks (tEXt,
 * zTXt, iTXt; free with dt_png_text_free). Returns 0 or -1. */
int dt_png_read(const char *path, uint8_t **rgb, int *w, int *h, dt_png_text **text, int *n_text);
void dt_png_text_free(dt_png_text *text, int n_text);

/* Value of `key` in a text list, or NULL. */
const char *dt_png_text_get(const dt_png_text *text, int n_text, const char *key);

#endif
