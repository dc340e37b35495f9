/* vae_flux2.h — the decoder half of diffusers AutoencoderKLFlux2 (models/autoencoders/autoencoder_kl_flux2.py),
 * written against the backend op interface, plus the latent batch-norm statistics and the image post-processing.
 *
 * Geometry always comes from the folder's config.json (block_out_channels, layers_per_block,
 * norm_num_groups, latent_channels, mid_block_add_attention, use_post_quant_conv, batch_norm_eps).
 * The decoder upsamples by 2^(len(block_out_channels) − 1) (8 for the released VAE).
 * Conv weights may be PyTorch [out, in, kh, kw] or MLX [out, kh, kw, in] (mflux); the layout is
 * detected per tensor from its shape. The attention output projection may be named `to_out.0`
 * (diffusers) or `to_out` (mflux).
 * The same object holds an AutoencoderKL (FLUX.1's and Z-Image's VAE: this network without the latent batch norm),
 * loaded with dt_vae_kl_load (vae_kl.h).
 */
#ifndef DT_VAE_FLUX2_H
#define DT_VAE_FLUX2_H

#include <stdint.h>

#include "backends/backend.h"

#define DT_VAE_MAX_BLOCKS 8

typedef struct {
    int latent_channels;        /* VAE latent channels (32 for FLUX.2) */
    int out_channels;           /* image channels (3) */
    int n_blocks;               /* len(block_out_channels) */
    int block_out[DT_VAE_MAX_BLOCKS];  /* decoder block_out_channels (encoder order, small -> large) */
    int layers_per_block;       /* the decoder runs layers_per_block + 1 resnets per up block */
    int norm_groups;            /* GroupNorm groups */
    int mid_attention;          /* mid_block_add_attention */
    int post_quant_conv;        /* use_post_quant_conv */
    float bn_eps;               /* batch_norm_eps of the latent BN (1e-4) */
    int batch_norm;             /* 1: the latent batch norm (AutoencoderKLFlux2); 0: AutoencoderKL (vae_kl.h) */
    float scaling_factor, shift_factor;   /* AutoencoderKL's latent scaling (1 and 0 for AutoencoderKLFlux2) */
    int patch;                  /* patch_size (2): packed channels = latent_channels·patch² */
    int scale_factor;           /* image pixels per latent pixel = 2^(n_blocks − 1) */
    int sample_size;            /* sample_size (1024): the default tile side of tiled decoding, in pixels */
} dt_vae_config;

typedef struct dt_vae dt_vae;

/* Load from a vae/ folder or a pipeline root holding vae/. NULL on error (dt_last_error). */
dt_vae *dt_vae_load(dt_backend *be, const char *vae_dir);
void dt_vae_free(dt_vae *v);
/* Geometry only (vae/ folder or pipeline root: its config.json); loads no weights. 0 or -1. */
int dt_vae_read_config(const char *vae_dir, dt_vae_config *cfg);
const dt_vae_config *dt_vae_get_config(const dt_vae *v);

/* Tiled decoding and encoding as diffusers' enable_tiling (models/vae_tiling.h): with enabled, an image larger
 * than tile x tile pixels (tile 0: config sample_size) is decoded / encoded in overlapping tiles, blended.
 * 0, or -1 when the tile is not a multiple of 4 x scale_factor. */
int dt_vae_set_tiling(dt_vae *v, int enabled, int tile);
/* Whether the last dt_vae_decode* / dt_vae_encode ran tiled. */
int dt_vae_last_tiled(const dt_vae *v);

/* Device bytes of the decoder's activations for a latent of H x W (elements of elem bytes: 2 bf16 on CUDA, 4 f32
 * on the CPU), untiled (tile 0) or with tiles of `tile` pixels (one tile's): what the placement planner
 * (pipeline/placement.h) counts for the decode phase. From the config alone. */
int64_t dt_vae_decode_act_bytes(const dt_vae_config *c, int tile, int H, int W, int elem);

/* Latent batch-norm running statistics, [latent_channels·patch²] each (host memory owned by v); n = 0 and NULL
 * statistics for an AutoencoderKL. */
void dt_vae_bn_stats(const dt_vae *v, const float **mean, const float **var, int *n, float *eps);

/* Decode latent [latent_channels, H, W] (f32 host, after BN de-normalization and unpatchify) into
 * rgb [out_channels, s·H, s·W] (f32 host, nominal range [−1, 1]), s = config scale_factor.
 * 0 ok, -1 error. */
int dt_vae_decode(dt_vae *v, const float *latent, int H, int W, float *rgb);
/* The same into rgb8 [s·H, s·W, 3] 8-bit RGB (dt_vae_postprocess's bytes, converted on the backend). */
int dt_vae_decode_rgb8(dt_vae *v, const float *latent, int H, int W, uint8_t *rgb8);

/* ---- encoder (vae_flux2_encoder.c): optional, text-to-image never loads it ----
 * Geometry from config.json: block_out_channels (the encoder never uses decoder_block_out_channels),
 * layers_per_block resnets per DownEncoderBlock2D, a stride-2 Downsample2D (pad bottom/right by one, 3×3
 * conv) after every block but the last, mid block (resnet, attention, resnet), GroupNorm + SiLU, conv_out to
 * 2·latent_channels, quant_conv (use_quant_conv). The posterior mode is the mean: the first latent_channels
 * channels. Its downsampling factor must equal the decoder's scale_factor. */

/* Load the encoder's weights now (dt_vae_encode does it on first use). 0 ok, -1 error. */
int dt_vae_load_encoder(dt_vae *v);

/* Encode rgb [3, H, W] (f32 host, nominal range [−1, 1]; H, W positive multiples of scale_factor) into
 * latent [latent_channels, H/s, W/s] (f32 host; s = scale_factor): the posterior mode (mean), before
 * patchify and batch-norm. 0 ok, -1 error. */
int dt_vae_encode(dt_vae *v, const float *rgb, int H, int W, float *latent);
/* The same, the whole posterior: moments [2·latent_channels, H/s, W/s] = mean | logvar (unclamped), for a VAE
 * without quant_conv (AutoencoderKL as FLUX.1 and Z-Image use it); tiled like dt_vae_encode, the moments blended.
 * 0 ok, -1 error. */
int dt_vae_encode_moments(dt_vae *v, const float *rgb, int H, int W, float *moments);

/* Post-processing as diffusers' image processor: p = clamp(x/2 + 0.5, 0, 1) per element of
 * x [3, H, W]; img01 [H, W, 3] receives p (may be NULL), u8 [H, W, 3] receives
 * round-half-even(p·255) (may be NULL). */
void dt_vae_postprocess(const float *x, int H, int W, float *img01, uint8_t *u8);

#endif
