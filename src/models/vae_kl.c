/* vae_kl.c — AutoencoderKL (vae_kl.h): loading through the shared dt_vae with the kind set, and the pipelines'
 * latent scaling around dt_vae_decode / dt_vae_encode. */
#include "models/vae_kl.h"

#include <math.h>
#include <stdlib.h>

#include "core/common.h"
#include "models/vae_flux2_internal.h"

dt_vae *dt_vae_kl_load(dt_backend *be, const char *vae_dir) { return vae_load_kind(be, vae_dir, 1); }

int dt_vae_kl_read_config(const char *vae_dir, dt_vae_config *cfg) { return vae_read_config_kind(vae_dir, 1, cfg); }

/* z [n] = latents / scaling + shift (a host copy; NULL after an error). */
static float *unscale(const dt_vae *v, const float *latents, int H, int W) {
    const dt_vae_config *c = dt_vae_get_config(v);
    if (c->batch_norm) { dt_set_error("vae: not an AutoencoderKL (load it with dt_vae_kl_load)"); return NULL; }
    if (H < 1 || W < 1 || H > 65536 || W > 65536) { dt_set_error("vae decode: invalid latent size %dx%d", W, H); return NULL; }
    const size_t n = (size_t)c->latent_channels * (size_t)H * (size_t)W;
    float *z = dt_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) z[i] = latents[i] / c->scaling_factor + c->shift_factor;
    return z;
}

int dt_vae_kl_decode(dt_vae *v, const float *latents, int H, int W, float *rgb) {
    float *z = unscale(v, latents, H, W);
    int rc = z ? dt_vae_decode(v, z, H, W, rgb) : -1;
    free(z);
    return rc;
}

int dt_vae_kl_decode_rgb8(dt_vae *v, const float *latents, int H, int W, uint8_t *rgb8) {
    float *z = unscale(v, latents, H, W);
    int rc = z ? dt_vae_decode_rgb8(v, z, H, W, rgb8) : -1;
    free(z);
    return rc;
}

int dt_vae_kl_encode(dt_vae *v, const float *rgb, int H, int W, float *latents) {
    const dt_vae_config *c = dt_vae_get_config(v);
    if (c->batch_norm) { dt_set_error("vae: not an AutoencoderKL (load it with dt_vae_kl_load)"); return -1; }
    if (dt_vae_encode(v, rgb, H, W, latents)) return -1;
    const size_t n = (size_t)c->latent_channels * (size_t)(H / c->scale_factor) * (size_t)(W / c->scale_factor);
    for (size_t i = 0; i < n; i++) latents[i] = (latents[i] - c->shift_factor) * c->scaling_factor;
    return 0;
}

int dt_vae_kl_encode_sample(dt_vae *v, const float *rgb, int H, int W, const float *eps, float *latents) {
    const dt_vae_config *c = dt_vae_get_config(v);
    if (c->batch_norm) { dt_set_error("vae: not an AutoencoderKL (load it with dt_vae_kl_load)"); return -1; }
    const size_t n = (size_t)c->latent_channels * (size_t)(H / c->scale_factor) * (size_t)(W / c->scale_factor);
    float *mom = dt_malloc(2 * n * sizeof(float));   /* [2L, h, w]: mean | logvar */
    int rc = dt_vae_encode_moments(v, rgb, H, W, mom);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const float lv = fminf(fmaxf(mom[n + i], -30.0f), 20.0f), sd = expf(0.5f * lv);
        latents[i] = (mom[i] + sd * eps[i] - c->shift_factor) * c->scaling_factor;
    }
    free(mom);
    return rc;
}
