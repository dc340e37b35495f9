/* png.h — PNG output of generated images (libpng) and a reader for tests.
 *
 * The writer stores 8-bit RGB, no time chunk and fixed zlib settings, so identical pixels and
 * text give byte-identical files (golden-file comparisons). Text pairs (prompt, seed, steps, size,
 * model, software, ...) become tEXt chunks; a value that is not plain ASCII is stored as an
 * uncompressed iTXt chunk (UTF-8), since tEXt is Latin-1 only.
 */
#ifndef DT_PNG_H
#define DT_PNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *key;     /* 1..79 printable Latin-1 characters, no leading/trailing/double spaces */
    const char *value;   /* UTF-8 */
} dt_png_text;

/* Write rgb [h, w, 3] (row-major, 8-bit) to path. Returns 0 or -1 (dt_last_error names the file). */
int dt_png_write(const char *path, const uint8_t *rgb, int w, int h, const dt_png_text *text, int n_text);

/* The same bytes dt_png_write would write, in memory: *png = malloc'd, *len bytes. Returns 0 or -1. */
int dt_png_encode(const uint8_t *rgb, int w, int h, const dt_png_text *text, int n_text, uint8_t **png, size_t *len);

/* Read any PNG as 8-bit RGB: *rgb = malloc'd [h, w, 3] (alpha dropped, gray expanded, 16-bit
 * reduced). If text != NULL, *text / *n_text receive malloc'd copies of the text chunks (tEXt,
 * zTXt, iTXt; free with dt_png_text_free). Returns 0 or -1. */
int dt_png_read(const char *path, uint8_t **rgb, int *w, int *h, dt_png_text **text, int *n_text);
void dt_png_text_free(dt_png_text *text, int n_text);

/* Value of `key` in a text list, or NULL. */
const char *dt_png_text_get(const dt_png_text *text, int n_text, const char *key);

#endif
