/* linear_set.c — one list of a model's prepared Linears, the description of their formats, and LoRA adapters
 * applied as they load (merged into dense weights, side products otherwise). */
#include "linear_set.h"

#include "lora.h"
#include "lora_backend.h"

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
    if (s->fp8_unfused) srcp.fp8_unfused = 1;
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
    dt_linear_src_format(src, f, sizeof f);
    fmt_add(s, f);
    dt_linear_paths_add(&s->paths, s->be, src, l);
    if (src->precision == DT_PREC_FP8) fmt_add(s, "fp8");
    return l;
}

static void *own(dt_linear_set *s, size_t bytes) {
    void *p = dt_malloc(bytes);
    s->owned = dt_realloc(s->owned, sizeof *s->owned * (size_t)(s->nowned + 1));
    s->owned[s->nowned++] = p;
    return p;
}

/* Collects the adapters' updates of module `name`, placed at row `offset` of the Linear being built. */
static int gather(dt_linear_set *s, const char *name, int64_t offset, dt_lora_placed *p, int cap, int n) {
    int k;
    const dt_lora_update *u = dt_lora_updates(s->lora, name, &k);
    for (int i = 0; i < k && n < cap; i++) p[n++] = (dt_lora_placed){&u[i], offset};
    return n;
}

/* Adds src with the placed updates (rows numbered as src's). */
static dt_linear *add_lora(dt_linear_set *s, const dt_linear_src *src, const dt_lora_placed *p, int np) {
    if (!np) return dt_linear_set_add(s, src);
    const int64_t N = src->out, K = src->in;
    dt_linear *l;
    if (dt_linear_src_dense(src) && !s->lora_side) {
        /* merged: W + s·B·A in f32, rounded once to the file's dtype */
        float *f = dt_malloc(sizeof(float) * (size_t)(N * K));
        dt_linear_src_rows_f32(src, 0, N, f);
        dt_lora_merge(p, np, 0, N, K, f);
        dt_linear_src m = *src;
        if (src->dtype == DT_F32) {
            s->owned = dt_realloc(s->owned, sizeof *s->owned * (size_t)(s->nowned + 1));
            s->owned[s->nowned++] = f;
            m.data = f;
        } else {
            uint16_t *h = own(s, sizeof(uint16_t) * (size_t)(N * K));
            for (int64_t i = 0; i < N * K; i++) h[i] = src->dtype == DT_BF16 ? dt_f32_to_bf16(f[i]) : dt_f32_to_f16(f[i]);
            free(f);
            m.data = h;
        }
        l = dt_linear_set_add(s, &m);
        if (l) s->lora_merged++;
    } else {
        float *A, *B;
        int64_t R = dt_lora_side(p, np, 0, N, K, &A, &B);
        l = dt_linear_set_add(s, src);
        if (l && R) {
            if (!dt_lora_backend_is_wrapper(s->be)) {
                dt_set_error("linear '%s': an adapter on %s weights needs the LoRA backend wrapper", src->name ? src->name : "?",
                             dt_linear_src_dense(src) ? "dense" : "quantized");
                l = NULL;
            } else if (dt_lora_backend_attach(s->be, l, A, B, R)) {
                l = NULL;
            } else {
                s->lora_sides++;
            }
        }
        free(A);
        free(B);
    }
    if (l) fmt_add(s, "lora");
    return l;
}

dt_linear *dt_linear_set_load(dt_linear_set *s, const dt_weights *w, const char *name, int64_t out, int64_t in,
                              int want_bias) {
    dt_linear_src src;
    if (dt_weights_linear(w, name, out, in, want_bias, &src) != 0) return NULL;
    dt_lora_placed p[64];
    int np = s->lora ? gather(s, name, 0, p, 64, 0) : 0;
    return add_lora(s, &src, p, np);
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
        size_t row = src[0].bits ? (size_t)(in * src[0].bits / 32) * 4 : dt_dtype_bytes(src[0].dtype, in);
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
        if (dt_linear_src_fp8(&src[0])) {   /* one scale for all rows, or a per-channel vector of the parts' */
            int one = 1;
            for (int i = 0; i < n; i++) one &= !src[i].w_scales && src[i].w_scale == src[0].w_scale;
            if (!one) {
                float *sc = own(s, sizeof(float) * (size_t)out * (size_t)n);
                for (int i = 0; i < n; i++)
                    for (int64_t r = 0; r < out; r++) sc[i * out + r] = dt_linear_src_fp8_scale(&src[i], r);
                st.w_scales = sc;
                st.w_scales_dtype = DT_F32;
                st.w_scale = 1.0f;
            }
        }
    } else {   /* mixed formats: f32 dense */
        float *d = own(s, sizeof(float) * (size_t)in * (size_t)out * (size_t)n);
        for (int i = 0; i < n; i++) dt_linear_src_rows_f32(&src[i], 0, out, d + (size_t)i * (size_t)out * (size_t)in);
        st.bits = 0;
        st.group_size = 0;
        st.dtype = DT_F32;
        st.data = d;
        st.scales = st.biases = NULL;
        st.w_scales = NULL;
        st.w_scale = 1.0f;
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
    dt_lora_placed p[64];
    int np = 0;
    for (int i = 0; s->lora && i < n; i++) np = gather(s, names[i], (int64_t)i * out, p, 64, np);
    return add_lora(s, &st, p, np);
}

int dt_linear_set_use_loras(dt_linear_set *s, dt_backend **be, dt_lora_set **lora, const dt_lora_spec *specs, int n,
                            int side, dt_lora_catalogue *cat) {
    *lora = dt_lora_load(specs, n, cat);
    dt_lora_catalogue_free(cat);
    if (!*lora) return -1;
    dt_backend *wb = dt_lora_backend_wrap(*be);
    if (!wb) return -1;
    *be = s->be = wb;
    s->lora = *lora;
    s->lora_side = side;
    return 0;
}

void dt_linear_set_log(const dt_linear_set *s, const char *what) {
    if (!s->be || !s->be->opts.verbose) return;
    dt_linear_paths_log(&s->paths, s->be, what);
}

void dt_linear_set_free(dt_linear_set *s) {
    for (int i = 0; i < s->n; i++) s->be->linear_destroy(s->be, s->all[i]);
    free(s->all);
    s->all = NULL;
    s->n = 0;
    s->fmt[0] = 0;
    memset(&s->paths, 0, sizeof s->paths);
    for (int i = 0; i < s->nowned; i++) free(s->owned[i]);
    free(s->owned);
    s->owned = NULL;
    s->nowned = 0;
}
