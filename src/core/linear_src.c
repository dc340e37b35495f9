/* linear_src.c — a Linear's host description (linear_src.h): the scale of an fp8 row, and rows as a Linear of their
 * own. */
#include "linear_src.h"

float dt_linear_src_fp8_scale(const dt_linear_src *s, int64_t r) {
    if (!s->w_scales) return s->w_scale;
    float v = 0;
    dt_convert_to_f32(&v, (const char *)s->w_scales + (size_t)r * dt_dtype_size(s->w_scales_dtype), s->w_scales_dtype, 1);
    return v;
}

dt_linear_src dt_linear_src_rows(const dt_linear_src *s, int64_t r0, int64_t nrows) {
    dt_linear_src v = *s;
    v.out = nrows;
    if (s->bits == 0) {
        v.data = (const char *)s->data + (size_t)r0 * dt_dtype_bytes(s->dtype, s->in);
        if (s->w_scales) v.w_scales = (const char *)s->w_scales + (size_t)r0 * dt_dtype_size(s->w_scales_dtype);
    } else {
        const size_t groups = (size_t)(s->in / s->group_size), ses = dt_dtype_size(s->sb_dtype);
        v.data = (const char *)s->data + (size_t)r0 * (size_t)(s->in * s->bits / 32) * 4;
        v.scales = (const char *)s->scales + (size_t)r0 * groups * ses;
        v.biases = (const char *)s->biases + (size_t)r0 * groups * ses;
    }
    if (s->bias) v.bias = (const char *)s->bias + (size_t)r0 * dt_dtype_size(s->bias_dtype);
    return v;
}
