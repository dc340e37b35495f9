/* ref_tokens.c — reference images to packed, normalized latent tokens + position ids (ref_tokens.h). */
#include "pipeline/ref_tokens.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "pipeline/latents.h"

int dt_ref_multiple(const dt_vae *v) { return 2 * dt_vae_get_config(v)->scale_factor; }

void dt_ref_tokens_free(dt_ref_tokens *r) {
    if (!r) return;
    free(r->tokens);
    free(r->ids);
    free(r->first);
    free(r->grid_h);
    free(r->grid_w);
    memset(r, 0, sizeof *r);
}

int dt_ref_tokens_encode(dt_vae *v, const dt_prep_image *imgs, int n, dt_ref_tokens *out) {
    memset(out, 0, sizeof *out);
    const dt_vae_config *c = dt_vae_get_config(v);
    const int s = c->scale_factor, m = 2 * s, L = c->latent_channels, C = 4 * L;
    const float *mean, *var;
    int bn_n;
    float eps;
    dt_vae_bn_stats(v, &mean, &var, &bn_n, &eps);
    if (c->patch != 2 || bn_n != C) {
        dt_set_error("reference tokens: VAE patch size %d / %d batch-norm channels (2 and %d expected)", c->patch, bn_n, C);
        return -1;
    }
    if (n < 1) {
        dt_set_error("reference tokens: no images");
        return -1;
    }
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (imgs[k].w < m || imgs[k].h < m || imgs[k].w % m || imgs[k].h % m || !imgs[k].rgb) {
            dt_set_error("reference image %d: size %dx%d is not a positive multiple of %d", k, imgs[k].w, imgs[k].h, m);
            return -1;
        }
        total += (int64_t)(imgs[k].h / m) * (imgs[k].w / m);
    }
    if (total > (1 << 26)) {
        dt_set_error("reference tokens: %lld tokens is too many", (long long)total);
        return -1;
    }
    out->n_images = n;
    out->n_tokens = (int)total;
    out->channels = C;
    out->tokens = dt_malloc((size_t)total * (size_t)C * sizeof(float));
    out->ids = dt_malloc((size_t)total * 4 * sizeof(float));
    out->first = dt_malloc((size_t)n * sizeof(int));
    out->grid_h = dt_malloc((size_t)n * sizeof(int));
    out->grid_w = dt_malloc((size_t)n * sizeof(int));
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        const int H = imgs[k].h, W = imgs[k].w, gh = H / m, gw = W / m;
        const size_t lat_n = (size_t)L * (size_t)(H / s) * (size_t)(W / s);
        float *lat = dt_malloc(lat_n * sizeof(float)), *pat = dt_malloc(lat_n * sizeof(float));
        if (dt_vae_encode(v, imgs[k].rgb, H, W, lat)) {
            free(lat);
            free(pat);
            dt_ref_tokens_free(out);
            return -1;
        }
        dt_latents_patchify(lat, L, gh, gw, pat);                  /* [L, 2gh, 2gw] -> [4L, gh, gw] */
        dt_latents_bn_norm(pat, C, (int64_t)gh * gw, mean, var, eps);
        dt_latents_pack(pat, C, gh, gw, out->tokens + at * C);      /* -> [gh·gw, 4L] */
        dt_latents_img_ids(gh, gw, (float)(10 + 10 * k), out->ids + at * 4);
        out->first[k] = (int)at;
        out->grid_h[k] = gh;
        out->grid_w[k] = gw;
        at += (int64_t)gh * gw;
        free(lat);
        free(pat);
    }
    return 0;
}
