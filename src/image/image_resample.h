/* image_resample.h — Pillow's Image.resize(size, LANCZOS) and Image.crop reproduced on dt_image, so that
 * resized inputs match the reference to the last bit (the tests allow ±1 per value).
 *
 * Lanczos (a = 3) as Pillow computes it: separable, horizontal pass first (only the source rows the
 * vertical pass needs), each pass skipped when its size does not change; per output pixel the filter is
 * stretched by max(1, in/out), taps normalized to sum 1 in double, then rounded to 22-bit fixed point;
 * sums start at 2^21 and are clipped to 0..255 after each pass (8-bit intermediate image).
 * Modes, as Pillow's resize treats them: LA and RGBA are premultiplied (v·a/255 rounded) before and
 * un-premultiplied (255·v/a truncated, alpha 0 or 255 kept) after; palette and bilevel sources
 * (dt_image.nearest) are resized with nearest neighbour whatever the filter; the same size is a copy.
 */
#ifndef DT_IMAGE_RESAMPLE_H
#define DT_IMAGE_RESAMPLE_H

#include "image/image.h"

/* dst = src resized to w x h (1..DT_IMAGE_MAX_SIDE each, w·h <= DT_IMAGE_MAX_PIXELS); same channels and
 * `nearest` flag. 0 ok, -1 error. */
int dt_image_resize(const dt_image *src, int w, int h, dt_image *dst);

/* dst = the w x h window of src at (left, top) (inside src). 0 ok, -1 error. */
int dt_image_crop(const dt_image *src, int left, int top, int w, int h, dt_image *dst);

#endif
