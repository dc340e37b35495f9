/* vae_qwenimage.h — the decoder half of diffusers AutoencoderKLQwenImage (the Qwen-Image / Wan 2.1 video
 * VAE) for one frame, written against the backend op interface, plus its latent de-normalization.
 *
 * The model is a causal 3-D (video) VAE; an image is a video of one frame. On a single frame every causal
 * 3-D convolution reduces to a 2-D convolution with the kernel's last temporal tap (the causal padding puts
 * kt-1 zero frames before the frame), the temporal upsampling convolution of "upsample3d" blocks is skipped
 * (the first frame is never doubled), and the rest is 2-D: NOTES.md has the derivation.
 *
 * Geometry comes from config.json (base_dim, z_dim, dim_mult, num_res_blocks, temperal_downsample,
 * latents_mean, latents_std); the decoder upsamples by 2^(len(dim_mult) - 1) = 2^len(temperal_downsample)
 * (8 for the released VAE).
 */
#ifndef DT_VAE_QWENIMAGE_H
#define DT_VAE_QWENIMAGE_H

#include <stdint.h>

#include "backends/backend.h"

#define DT_QVAE_MAX_BLOCKS 8
#define DT_QVAE_MAX_Z 256

typedef struct {
    int base_dim;                       /* base channel count (96 released) */
    int z_dim;                          /* latent channels (16 released) */
    int n_mult;                         /* len(dim_mult) */
    int dim_mult[DT_QVAE_MAX_BLOCKS];   /* channel multipliers, encoder order */
    int num_res_blocks;                 /* the decoder runs num_res_blocks + 1 resnets per up block */
    int scale_factor;                   /* image pixels per latent pixel = 2^(n_mult - 1) */
    float latents_mean[DT_QVAE_MAX_Z], latents_std[DT_QVAE_MAX_Z];   /* [z_dim] */
} dt_qvae_config;

typedef struct dt_qvae dt_qvae;

/* Geometry only from a vae/ folder (config.json); 0 or -1 (dt_last_error names the file and field). */
int dt_qvae_read_config(const char *vae_dir, dt_qvae_config *c);

/* Load from a vae/ folder or a pipeline root holding vae/. NULL on error (dt_last_error). */
dt_qvae *dt_qvae_load(dt_backend *be, const char *vae_dir);
void dt_qvae_free(dt_qvae *v);
const dt_qvae_config *dt_qvae_get_config(const dt_qvae *v);

/* The pipeline's de-normalization in place on x [z_dim, hw]: x = x / (1 / std) + mean per channel
 * (float32, as diffusers: the reciprocal rounded first, then the division and the add). */
void dt_qvae_denormalize(const dt_qvae_config *c, float *x, int64_t hw);

/* Tiled decoding as diffusers' enable_tiling (models/vae_tiling.h; tile_sample_min 256 and stride 192 by default):
 * with enabled, a latent larger than tile/s on a side is decoded in overlapping tiles of tile pixels (0: 256),
 * blended. 0, or -1 when the tile is not a multiple of 4 x scale_factor. */
#define DT_QVAE_DEFAULT_TILE 256
int dt_qvae_set_tiling(dt_qvae *v, int enabled, int tile);
/* Whether the last decode ran tiled. */
int dt_qvae_last_tiled(const dt_qvae *v);

/* Device bytes of the decoder's activations for a latent of H x W (elem bytes per element), untiled (tile 0) or
 * one tile's with tiles of `tile` pixels (dt_vae_decode_act_bytes' counterpart). From the config alone. */
int64_t dt_qvae_decode_act_bytes(const dt_qvae_config *c, int tile, int H, int W, int elem);
/* GFLOP of one untiled decode of a latent of H x W (1 MAC = 2 FLOP): the convolutions (3 x 3 and 1 x 1, on one
 * frame) and the mid block's attention (one head of the top width over H x W tokens); norms and SiLU not counted. */
double dt_qvae_decode_gflop(const dt_qvae_config *c, int H, int W);

/* Decode latent [z_dim, H, W] (f32 host, de-normalized) into rgb [3, s·H, s·W] (f32 host, clamped to
 * [-1, 1] as the VAE's decode does; a tiled decode is not clamped, as diffusers' tiled_decode), s = scale_factor.
 * 0 ok, -1 error. */
int dt_qvae_decode(dt_qvae *v, const float *latent, int H, int W, float *rgb);
/* The same into rgb8 [s·H, s·W, 3] 8-bit RGB (the pipeline's post-processing, converted on the backend). */
int dt_qvae_decode_rgb8(dt_qvae *v, const float *latent, int H, int W, uint8_t *rgb8);

#endif
