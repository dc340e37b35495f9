/* linear_set.c — one list of a model's prepared Linears and the description of their formats. */
#include "linear_set.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fmt_add(dt_linear_set *s, const char *f) {
    if (!strstr(s->fmt, f)) {
        size_t len = strlen(s->fmt);
        snprintf(s->fmt + len, sizeof s->fmt - len, "%s%s", len ? "+" : "", f);
    }
}

static void *own(dt_linear_set *s, size_t bytes);

dt_linear *dt_linear_set_add(dt_linear_set *s, const dt_linear_src *src0) {
    dt_linear_src srcp = *src0;
    const dt_linear_src *src = &srcp;
    if (s->precision != DT_PREC_BF16) srcp.precision = s->precision;
    if (s->dense_f32 && !srcp.bits && srcp.dtype != DT_F32) {
        size_t n = (size_t)srcp.out * (size_t)srcp.in;
        float *f = own(s, sizeof(float) * n);
        if (dt_convert_to_f32(f, srcp.data, srcp.dtype, n) != 0) {
            dt_set_error("linear '%s': dense weights of dtype %s", srcp.name ? srcp.name : "?", dt_dtype_name(srcp.dtype));
            return NULL;
        }
        srcp.data = f;
        srcp.dtype = DT_F32;
    }
    dt_linear *l = s->be->linear_create(s->be, src);
    if (!l) return NULL;
    s->all = dt_realloc(s->all, sizeof *s->all * (size_t)(s->n + 1));
    s->all[s->n++] = l;
    char f[32];
    if (src->bits) snprintf(f, sizeof f, "q%d g%d", src->bits, src->group_size);
    else snprintf(f, sizeof f, "%s", src->dtype == DT_BF16 ? "bf16" : src->dtype == DT_F16 ? "f16" : "f32");
    fmt_add(s, f);
    if (src->precision == DT_PREC_FP8) fmt_add(s, "fp8");
    return l;
}

dt_linear *dt_linear_set_load(dt_linear_set *s, const dt_weights *w, const char *name, int64_t out, int64_t in,
                              int want_bias) {
    dt_linear_src src;
    if (dt_weights_linear(w, name, out, in, want_bias, &src) != 0) return NULL;
    return dt_linear_set_add(s, &src);
}

static void *own(dt_linear_set *s, size_t bytes) {
    void *p = dt_malloc(bytes);
    s->owned = dt_realloc(s->owned, sizeof *s->owned * (size_t)(s->nowned + 1));
    s->owned[s->nowned++] = p;
    return p;
}

dt_linear *dt_linear_set_load_stacked(dt_linear_set *s, const dt_weights *w, const char *const *names, int n,
                                      int64_t out, int64_t in, dt_linear_src *stacked) {
    dt_linear_src src[8];
    if (n < 1 || n > 8) { dt_set_error("stacked linear: %d parts (1..8)", n); return NULL; }
    for (int i = 0; i < n; i++)
        if (dt_weights_linear(w, names[i], out, in, -1, &src[i]) != 0) return NULL;
    int same = 1, any_bias = 0;
    for (int i = 0; i < n; i++) {
        const dt_linear_src *a = &src[0], *b = &src[i];
        if (b->bits != a->bits || b->dtype != a->dtype || (b->bits && (b->group_size != a->group_size || b->sb_dtype != a->sb_dtype)))
            same = 0;
        if (b->bias) any_bias = 1;
    }
    dt_linear_src st = src[0];
    st.name = names[0];
    st.out = out * n;
    st.in = in;
    if (same) {
        size_t es = dt_dtype_size(src[0].dtype);
        size_t row = src[0].bits ? (size_t)(in * src[0].bits / 32) * 4 : (size_t)in * es;
        char *d = own(s, row * (size_t)out * (size_t)n);
        for (int i = 0; i < n; i++) memcpy(d + row * (size_t)out * (size_t)i, src[i].data, row * (size_t)out);
        st.data = d;
        if (src[0].bits) {
            size_t srow = (size_t)(in / src[0].group_size) * dt_dtype_size(src[0].sb_dtype);
            char *sc = own(s, srow * (size_t)out * (size_t)n), *bi = own(s, srow * (size_t)out * (size_t)n);
            for (int i = 0; i < n; i++) {
                memcpy(sc + srow * (size_t)out * (size_t)i, src[i].scales, srow * (size_t)out);
                memcpy(bi + srow * (size_t)out * (size_t)i, src[i].biases, srow * (size_t)out);
            }
            st.scales = sc;
            st.biases = bi;
        }
    } else {   /* mixed formats: f32 dense */
        float *d = own(s, sizeof(float) * (size_t)in * (size_t)out * (size_t)n);
        for (int i = 0; i < n; i++) dt_linear_src_rows_f32(&src[i], 0, out, d + (size_t)i * (size_t)out * (size_t)in);
        st.bits = 0;
        st.group_size = 0;
        st.dtype = DT_F32;
        st.data = d;
        st.scales = st.biases = NULL;
    }
    if (any_bias) {   /* f32 stacked bias; parts without one contribute zeros */
        float *bb = own(s, sizeof(float) * (size_t)out * (size_t)n);
        for (int i = 0; i < n; i++) {
            float *part = bb + (size_t)i * (size_t)out;
            if (!src[i].bias) {
                memset(part, 0, sizeof(float) * (size_t)out);
            } else if (dt_convert_to_f32(part, src[i].bias, src[i].bias_dtype, (size_t)out) != 0) {
                dt_set_error("stacked linear '%s': bias dtype %s", names[i], dt_dtype_name(src[i].bias_dtype));
                return NULL;
            }
        }
        st.bias = bb;
        st.bias_dtype = DT_F32;
    }
    if (stacked) *stacked = st;
    return dt_linear_set_add(s, &st);
}

void dt_linear_set_free(dt_linear_set *s) {
    for (int i = 0; i < s->n; i++) s->be->linear_destroy(s->be, s->all[i]);
    free(s->all);
    s->all = NULL;
    s->n = 0;
    s->fmt[0] = 0;
    for (int i = 0; i < s->nowned; i++) free(s->owned[i]);
    free(s->owned);
    s->owned = NULL;
    s->nowned = 0;
}
