/* image.h — reading input images (PNG via libpng, JPEG via libjpeg-turbo, WebP via libwebp) from a file or
 * a memory buffer, and converting them the way the reference (Pillow: Image.open(f).convert("RGB") / "L")
 * does; writing generated RGB images as JPEG or WebP with their parameters as text (PNG: image/png.h).
 *
 * A decoded image keeps the mode Pillow would open it in, because Pillow resizes each mode differently
 * (image_resample.h): 1 channel (L, or bilevel "1" stored as 0/255), 2 (LA), 3 (RGB; palette images are
 * expanded to their palette colours) or 4 (RGBA). `nearest` marks palette and bilevel sources, which
 * Pillow resizes with nearest neighbour whatever filter is asked for.
 *
 * What is read: PNG 8-bit and lower (gray 1/2/4/8, gray+alpha, RGB, RGBA, palette 1..8 bits, tRNS ignored
 * as Pillow's RGB conversion ignores it, Adam7 interlacing); baseline/progressive/arithmetic JPEG in gray
 * or YCbCr/RGB; WebP lossy, lossless and with alpha (still images).
 * What is refused, with one line naming the file: 16-bit PNG (Pillow turns 16-bit gray into clipped
 * white and keeps only the high byte of 16-bit RGB: not an input to trust), CMYK/YCCK JPEG, animated
 * WebP, truncated or corrupt data, anything else, and sizes outside the caller's dt_image_limits (at most
 * DT_IMAGE_MAX_SIDE per side and DT_IMAGE_MAX_PIXELS in all; a server passes its own, smaller ones). The limits are
 * checked from the file's header, before any pixel memory is allocated: a small file that declares a huge image
 * (a decompression bomb) costs its header's bytes, not its pixels. The libraries' own allocations are bounded too
 * (libpng's user limits and chunk caps, libjpeg's max_memory_to_use; WebP decodes into our buffer).
 * Alpha is never composited: converting to RGB drops it (Pillow's convert("RGB")).
 */
#ifndef DT_IMAGE_H
#define DT_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#define DT_IMAGE_MAX_SIDE 32768
#define DT_IMAGE_MAX_PIXELS ((int64_t)1 << 26)   /* 67 M pixels (8192 x 8192) */
#define DT_IMAGE_MAX_FILE_BYTES ((size_t)1 << 30)

/* What a caller accepts (checked from the header). A zero field takes its default; none goes past the defaults. */
typedef struct {
    int64_t max_pixels;     /* w * h at most (0: DT_IMAGE_MAX_PIXELS) */
    int max_side;           /* each side at most (0: DT_IMAGE_MAX_SIDE) */
    int min_side;           /* each side at least (0: 1) */
    int max_aspect;         /* max(w/h, h/w) at most (0: any) */
} dt_image_limits;

typedef struct {
    int w, h;
    int channels;   /* 1 L, 2 LA, 3 RGB, 4 RGBA */
    int nearest;    /* 1: palette or bilevel source (Pillow resizes it with nearest neighbour) */
    uint8_t *px;    /* [h, w, channels], row-major, malloc'd */
} dt_image;

/* Decode an image file (format from its first bytes) within lim (NULL: the defaults). 0 ok, -1 error (dt_last_error
 * names the file). */
int dt_image_read_file_ex(const char *path, const dt_image_limits *lim, dt_image *out);
int dt_image_read_file(const char *path, dt_image *out);   /* the default limits */
/* Decode an image held in memory within lim (NULL: the defaults); `name` (e.g. an upload's file name) is used in
 * error messages. */
int dt_image_decode_ex(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, dt_image *out);
int dt_image_decode(const uint8_t *data, size_t n, const char *name, dt_image *out);   /* the default limits */
/* The header alone, checked as dt_image_decode_ex checks it: out gets w, h, channels and nearest as the decode would
 * give them, px NULL (nothing to free). No pixel is decoded: what a decode will hold is w * h * channels bytes.
 * 0 ok, -1 error (the same message the decode would give for a bad header). */
int dt_image_probe(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, dt_image *out);
void dt_image_free(dt_image *im);

/* A copy converted as Pillow's convert("RGB"): gray replicated, alpha dropped. rgb [h, w, 3] malloc'd. */
uint8_t *dt_image_to_rgb(const dt_image *im);
/* A copy converted as Pillow's convert("L"): colour -> (19595 R + 38470 G + 7471 B + 2^15) >> 16, alpha
 * dropped. l [h, w] malloc'd. */
uint8_t *dt_image_to_l(const dt_image *im);

/* Per-format decoders (image_png.c, image_jpeg.c, image_webp.c), called by dt_image_decode_ex and dt_image_probe
 * with lim resolved (dt_image_limits_resolve: no zero field); header_only: stop after the header (dt_image_probe). */
int dt_image_decode_png(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, int header_only,
                        dt_image *out);
int dt_image_decode_jpeg(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, int header_only,
                         dt_image *out);
int dt_image_decode_webp(const uint8_t *data, size_t n, const char *name, const dt_image_limits *lim, int header_only,
                         dt_image *out);
/* A text entry stored with an encoded image (PNG tEXt/iTXt, JPEG COM, WebP XMP). key: 1..79 printable Latin-1
 * characters; value: UTF-8. */
typedef struct {
    const char *key;
    const char *value;
} dt_image_text;

/* Encode rgb [h, w, 3] (row-major, 8-bit) as baseline JPEG (libjpeg-turbo, 4:2:0, accurate DCT) at quality 1..100,
 * the text as one COM marker of "key: value" lines (cut at the marker's 65533 bytes). *out malloc'd, *len bytes.
 * 0, or -1 with the error set. */
int dt_image_encode_jpeg(const uint8_t *rgb, int w, int h, int quality, const dt_image_text *text, int n_text,
                         uint8_t **out, size_t *len);
/* Encode rgb [h, w, 3] as lossy WebP (libwebp) at quality 0..100, the text as an XMP chunk (libwebpmux: a VP8X
 * container) of dc-style properties. Sides up to 16383. *out malloc'd (free with free()), *len bytes. 0 or -1. */
int dt_image_encode_webp(const uint8_t *rgb, int w, int h, int quality, const dt_image_text *text, int n_text,
                         uint8_t **out, size_t *len);

/* lim (NULL: none) with its zero fields set to the defaults and every field clamped to them. */
dt_image_limits dt_image_limits_resolve(const dt_image_limits *lim);
/* 0 when a w x h image (from the header) is within lim (resolved), else -1 with the error set naming the file. */
int dt_image_check_size(const char *name, const char *format, int64_t w, int64_t h, const dt_image_limits *lim);

#endif
