/* vae_kl.h — diffusers AutoencoderKL (models/autoencoders/autoencoder_kl.py) as FLUX.1 and Z-Image use it: 16 latent
 * channels, scaling_factor and shift_factor, quant convs per use_quant_conv / use_post_quant_conv. The network is
 * AutoencoderKLFlux2's without the latent batch norm and the 2 x 2 latent packing, so it loads into the same dt_vae
 * (vae_flux2.h) and runs the same decoder walk (vae_decoder.c) and encoder (vae_flux2_encoder.c); dt_vae_decode and
 * dt_vae_encode work on the VAE's own latent. This file adds the pipelines' latent scaling:
 *   decode: z = latents / scaling_factor + shift_factor;  encode: latents = (mean - shift_factor) · scaling_factor.
 */
#ifndef DT_VAE_KL_H
#define DT_VAE_KL_H

#include <stdint.h>

#include "models/vae_flux2.h"

/* Load from a vae/ folder or a pipeline root holding vae/ (config.json's _class_name, when given, must be
 * AutoencoderKL). NULL on error (dt_last_error names the file). Freed with dt_vae_free. */
dt_vae *dt_vae_kl_load(dt_backend *be, const char *vae_dir);
/* Geometry only (config.json); loads no weights. 0 or -1. */
int dt_vae_kl_read_config(const char *vae_dir, dt_vae_config *cfg);

/* Decode the pipeline's latents [latent_channels, H, W] (f32 host) into rgb [3, s·H, s·W] (f32 host, nominal
 * [−1, 1]) or rgb8 [s·H, s·W, 3] (the image processor's bytes), s = scale_factor. 0 or -1. */
int dt_vae_kl_decode(dt_vae *v, const float *latents, int H, int W, float *rgb);
int dt_vae_kl_decode_rgb8(dt_vae *v, const float *latents, int H, int W, uint8_t *rgb8);
/* Encode rgb [3, H, W] (f32 host, [−1, 1]; H, W multiples of scale_factor) into the pipeline's latents
 * [latent_channels, H/s, W/s] from the posterior mean. 0 or -1. */
int dt_vae_kl_encode(dt_vae *v, const float *rgb, int H, int W, float *latents);
/* The same from a posterior sample (diffusers' retrieve_latents, sample mode): mean + exp(logvar / 2) · eps with
 * logvar clamped to [−30, 20] as DiagonalGaussianDistribution does, eps [latent_channels, H/s, W/s] the N(0, 1) draw.
 * 0 or -1. */
int dt_vae_kl_encode_sample(dt_vae *v, const float *rgb, int H, int W, const float *eps, float *latents);

#endif
