/* image_out.h — a generated image's bytes in the format asked for: PNG (image/png.h), JPEG or WebP
 * (image/image.h), with its parameters as text, and the OpenAI `output_format` / `output_compression` names and
 * meanings. The one encoder of `ditrun generate` and the server, so both give the same bytes for the same settings. */
#ifndef DT_IMAGE_OUT_H
#define DT_IMAGE_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "image/image.h"

typedef enum { DT_OUT_PNG, DT_OUT_JPEG, DT_OUT_WEBP } dt_out_format;

/* "png", "jpeg", "webp" */
const char *dt_out_format_name(dt_out_format f);
/* "image/png", "image/jpeg", "image/webp" */
const char *dt_out_format_mime(dt_out_format f);
/* "png", "jpeg" (or "jpg"), "webp", any case: 0 and *f, or -1. */
int dt_out_format_parse(const char *s, dt_out_format *f);
/* The format a file name's extension asks for (.png, .jpg, .jpeg, .webp, any case): 0 and *f, or -1. */
int dt_out_format_from_path(const char *path, dt_out_format *f);
/* The format an output file gets: its extension's (above), PNG for any other name (no extension, /dev/stdout, a
 * FIFO, out.img); -1 (dt_last_error names the file) when the extension names an image format that is not written
 * here (.gif, .bmp, .tif, .avif, ...), so that out.gif never holds PNG bytes. */
int dt_out_format_for_path(const char *path, dt_out_format *f);

/* compression: OpenAI's output_compression, 0..100 (-1: the default, 100). JPEG and WebP: the quality (100 the
 * best; JPEG 0 is taken as 1). PNG stays lossless: 100 is zlib level 1 (Z_RLE, the fastest, and on photos also the
 * smallest), lower values zlib levels up to 9 at 0 (level = 9 - round(compression * 8 / 100); smaller files on flat
 * content, far slower). */
#define DT_OUT_COMPRESSION_DEFAULT 100

/* Encode rgb [h, w, 3] with text (PNG tEXt/iTXt, JPEG COM, WebP XMP). PNG deflates on threads threads (0: all
 * online up to 16). *out malloc'd, *len bytes. 0 or -1 (dt_last_error). */
int dt_image_out_encode(dt_out_format f, int compression, int threads, const uint8_t *rgb, int w, int h,
                        const dt_image_text *text, int n_text, uint8_t **out, size_t *len);

#endif
