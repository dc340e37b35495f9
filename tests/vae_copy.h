/* vae_copy.h — shared by test_vae.c and test_vae_encoder.c: a copy of the fixture VAE (tests/fixtures/model/vae)
 * written into a folder in another form, to check that the loader reads it the same: the MLX weight layout or
 * decoder-only weights. Header-only (static functions); remove the copy with t_rmtree (test.h). */
#ifndef DT_TESTS_VAE_COPY_H
#define DT_TESTS_VAE_COPY_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "test.h"

typedef enum {
    VAE_COPY_MLX,            /* conv weights [o, kh, kw, i] instead of [o, i, kh, kw]; attention "to_out.x" without ".0" */
    VAE_COPY_DECODER_ONLY,   /* no encoder.* and quant_conv.* tensors (a VAE that can decode, not encode) */
} vae_copy_kind;

/* Writes dir/model.safetensors (the fixture VAE's tensors in form `kind`) and dir/config.json (the fixture's).
 * dir must exist. 0, or -1. */
static inline int vae_copy_write(const char *dir, vae_copy_kind kind) {
    char path[1100];
    snprintf(path, sizeof path, "%s/model/vae/diffusion_pytorch_model.safetensors", t_fixtures());
    st_file *src = st_open(path);
    if (!src) return -1;
    st_writer *wr = st_writer_new();
    for (size_t i = 0; i < st_count(src); i++) {
        const st_tensor *t = st_at(src, i);
        char name[256];
        snprintf(name, sizeof name, "%s", t->name);
        if (kind == VAE_COPY_DECODER_ONLY) {
            if (strncmp(name, "encoder.", 8) && strncmp(name, "quant_conv.", 11))
                st_writer_add(wr, name, t->dtype, t->ndim, t->shape, t->data);
            continue;
        }
        char *p = strstr(name, "to_out.0.");
        if (p) memmove(p + 6, p + 8, strlen(p + 8) + 1);   /* "to_out.0.x" -> "to_out.x" */
        if (t->ndim == 4 && t->dtype == DT_F32) {
            const int64_t o = t->shape[0], ci = t->shape[1], k = t->shape[2];
            const float *w = t->data;   /* [o, ci, k, k] */
            float *m = malloc((size_t)t->numel * sizeof(float));   /* [o, k, k, ci] */
            for (int64_t a = 0; a < o; a++)
                for (int64_t y = 0; y < k; y++)
                    for (int64_t x = 0; x < k; x++)
                        for (int64_t b = 0; b < ci; b++) m[((a * k + y) * k + x) * ci + b] = w[((a * ci + b) * k + y) * k + x];
            int64_t shp[4] = {o, k, k, ci};
            st_writer_add(wr, name, DT_F32, 4, shp, m);
            free(m);
        } else {
            st_writer_add(wr, name, t->dtype, t->ndim, t->shape, t->data);
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_writer_save(wr, path);
    st_writer_free(wr);
    st_close(src);
    if (rc) return -1;
    snprintf(path, sizeof path, "%s/model/vae/config.json", t_fixtures());
    size_t n = 0;
    char *cfg = t_slurp(path, &n);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *o = cfg ? fopen(path, "wb") : NULL;
    rc = o && fwrite(cfg, 1, n, o) == n ? 0 : -1;
    if (o && fclose(o)) rc = -1;
    free(cfg);
    return rc;
}

#endif
