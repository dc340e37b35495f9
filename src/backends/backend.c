/* backend.c — backend selection by name and small helpers shared by all backends. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_backend *dt_backend_create(const char *name, const dt_backend_opts *opts) {
    if (!name || !strcmp(name, "auto")) {
        if (dt_backend_cuda_available()) return dt_backend_cuda_create(opts);
        return dt_backend_cpu_create(opts);
    }
    if (!strcmp(name, "cpu")) return dt_backend_cpu_create(opts);
    if (!strcmp(name, "cuda")) return dt_backend_cuda_create(opts);
    dt_set_error("unknown backend '%s' (expected cpu, cuda or auto)", name);
    return NULL;
}

void dt_linear_src_format(const dt_linear_src *src, char *buf, size_t n) {
    if (src->bits) snprintf(buf, n, "q%d g%d", src->bits, src->group_size);
    else if (dt_linear_src_fp8(src)) snprintf(buf, n, "%s", src->dtype == DT_F8_E4M3 ? "e4m3" : "e5m2");
    else if (dt_linear_src_blocks(src)) snprintf(buf, n, "%s", dt_dtype_name(src->dtype));
    else snprintf(buf, n, "%s", src->dtype == DT_BF16 ? "bf16" : src->dtype == DT_F16 ? "f16" : "f32");
}

void dt_linear_paths_add(dt_linear_paths *t, dt_backend *be, const dt_linear_src *src, const dt_linear *w) {
    char fmt[sizeof t->kind[0].fmt];
    dt_linear_src_format(src, fmt, sizeof fmt);
    const char *path = be->linear_path ? be->linear_path(be, w) : "(the backend does not say)";
    for (int i = 0; i < t->nkind; i++)
        if (!strcmp(t->kind[i].fmt, fmt) && !strncmp(t->kind[i].path, path, sizeof t->kind[i].path - 1)) {
            t->kind[i].n++;
            return;
        }
    if (t->nkind == DT_LINEAR_PATHS_MAX) {
        t->other++;
        return;
    }
    snprintf(t->kind[t->nkind].fmt, sizeof t->kind[0].fmt, "%s", fmt);
    snprintf(t->kind[t->nkind].path, sizeof t->kind[0].path, "%s", path);
    t->kind[t->nkind++].n = 1;
}

void dt_linear_paths_log(const dt_linear_paths *t, const dt_backend *be, const char *what) {
    if (!be->opts.verbose) return;
    for (int i = 0; i < t->nkind; i++)
        fprintf(stderr, "ditrun: %s: %s: %d Linear%s %s: %s\n", be->name, what, t->kind[i].n, t->kind[i].n == 1 ? "" : "s",
                t->kind[i].fmt, t->kind[i].path);
    if (t->other) fprintf(stderr, "ditrun: %s: %s: %d Linears of further kinds\n", be->name, what, t->other);
}

dt_mat dt_alloc_or_die(dt_backend *be, int64_t rows, int64_t cols, dt_dtype dtype) {
    dt_mat m;
    if (be->alloc(be, &m, rows, cols, dtype) != 0) {
        fprintf(stderr, "ditrun: error: %s\n", dt_last_error());
        exit(1);
    }
    return m;
}

dt_mat dt_param_upload(dt_backend *be, const float *src, int64_t n) {
    dt_mat m = dt_alloc_or_die(be, 1, n, DT_F32);
    be->upload(be, m, src);
    return m;
}

void dt_image_rgb8(dt_backend *be, uint8_t *dst, dt_mat x) {
    if (be->image_rgb8) {
        be->image_rgb8(be, dst, x);
        return;
    }
    if (x.rows != 3) {   /* a caller's bug (the VAEs check out_channels == 3 at load), as the backends' op checks */
        fprintf(stderr, "ditrun: error: image_rgb8: x is [%lld,%lld], expected 3 channel rows\n", (long long)x.rows,
                (long long)x.cols);
        exit(1);
    }
    const size_t hw = (size_t)x.cols;
    float *f = dt_malloc(sizeof(float) * 3 * hw);
    be->download(be, f, x);
    dt_image_planes_u8(f, hw, dst, NULL);
    free(f);
}

void dt_image_planes_u8(const float *x, size_t hw, uint8_t *u8, float *unit) {
    for (size_t p = 0; p < hw; p++)
        for (int ch = 0; ch < 3; ch++) {
            float f;
            const uint8_t b = dt_image_u8(x[(size_t)ch * hw + p], &f);
            if (unit) unit[p * 3 + (size_t)ch] = f;
            if (u8) u8[p * 3 + (size_t)ch] = b;
        }
}

void dt_norm_linear_composed(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps,
                             const dt_linear *w, dt_mat a) {
    be->layernorm_mod(be, a, x, shift, scale, eps);
    be->linear(be, y, a, w);
}

void dt_rmsnorm_mod_linears_composed(dt_backend *be, dt_mat x, dt_mat nw, dt_mat shift, float eps, dt_mat a, int n,
                                     const dt_linear *const *w, const dt_mat *y) {
    be->rmsnorm_mod(be, a, x, nw, shift, eps);
    for (int i = 0; i < n; i++) be->linear(be, y[i], a, w[i]);
}

void dt_act_linear_gated_composed(dt_backend *be, dt_mat x, dt_mat c, int64_t lead, dt_mat a, dt_mat b, dt_act act,
                                  const dt_linear *w, dt_mat gate, dt_mat y) {
    be->act_mul(be, dt_mat_cols(c, lead, c.cols - lead), a, b, act);
    dt_linear_gated(be, x, c, w, gate, y);
}
