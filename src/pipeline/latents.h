/* latents.h — latent-space bookkeeping of the FLUX.2 pipeline (diffusers pipelines/flux2: latent preparation
 * and decoding): portable seeded Gaussian noise, packing [C,h,w] <-> tokens [h·w, C], position ids,
 * batch-norm (de)normalization and (un)patchify between the packed 4c-channel grid and the VAE latent.
 *
 * Noise: Philox-4x32-10 (Salmon et al. 2011; key = seed, counter = (block lo, block hi, stream lo,
 * stream hi)) gives four 32-bit words per block; word -> uniform u = (x + 0.5)·2^-32 in (0,1);
 * Box–Muller on consecutive pairs (u1, u2): z1 = r·cos θ, z2 = r·sin θ, r = sqrt(−2 ln u1),
 * θ = 2π·u2, evaluated in float64 and rounded to float32. Element i uses block i/4, lane i%4.
 * Everything runs on the host, so a seed gives the same noise on every backend and machine.
 * (torch's generator is not reproduced; for bit-matching diffusers, pass its noise in.)
 */
#ifndef DT_LATENTS_H
#define DT_LATENTS_H

#include <stddef.h>
#include <stdint.h>

/* One Philox-4x32-10 block (exposed for known-answer tests). */
void dt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* n standard-normal floats for (seed, stream), elements [offset, offset + n) of that sequence. */
void dt_randn(uint64_t seed, uint64_t stream, uint64_t offset, float *out, size_t n);

/* Initial noise in packed, normalized latent space: out [c_packed, h, w] (c_packed = 4·VAE channels;
 * h, w = image size / 16 for FLUX.2). Stream 0 of `seed`. */
void dt_latents_noise(uint64_t seed, int c_packed, int h, int w, float *out);

/* x [C, h, w] -> tokens [h·w, C] (token = row·w + col). */
void dt_latents_pack(const float *x, int C, int h, int w, float *tokens);
/* tokens [h·w, C] -> x [C, h, w]. */
void dt_latents_unpack(const float *tokens, int C, int h, int w, float *x);

/* Image position ids [h·w, 4] = (t, row, col, 0) as f32; t = 0 for the generated image
 * (10·(k+1) for the k-th reference image in edit mode). */
void dt_latents_img_ids(int h, int w, float t, float *ids);
/* Text position ids [L, 4] = (0, 0, 0, l). */
void dt_latents_txt_ids(int L, float *ids);

/* Batch-norm de-normalization in place on x [C, hw]: x = x·sqrt(var + eps) + mean per channel
 * (float32, the multiply and the add rounded separately as torch does). mean/var [C]. */
void dt_latents_bn_denorm(float *x, int C, int64_t hw, const float *mean, const float *var, float eps);
/* Inverse: x = (x − mean) / sqrt(var + eps). */
void dt_latents_bn_norm(float *x, int C, int64_t hw, const float *mean, const float *var, float eps);

/* Unpatchify: x [4c, h, w] (packed channel 4·ch + 2·dy + dx) -> out [c, 2h, 2w]. */
void dt_latents_unpatchify(const float *x, int c, int h, int w, float *out);
/* Patchify: x [c, 2h, 2w] -> out [4c, h, w]. */
void dt_latents_patchify(const float *x, int c, int h, int w, float *out);

#endif
