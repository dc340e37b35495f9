/* vae_tiling.h — tiled VAE decoding and encoding with the semantics of diffusers' enable_tiling
 * (AutoencoderKL / AutoencoderKLFlux2 tiled_decode and _tiled_encode, AutoencoderKLQwenImage tiled_decode):
 * the input is cut into square tiles whose starts are a stride apart (3/4 of a tile: overlap factor 1/4),
 * every tile runs through the whole decoder (or encoder) on its own, each result is blended linearly with
 * the finished tile above (its last rows) and then the one on the left (its last columns) over the overlap,
 * and its first `keep` rows and columns are placed in the output. Peak memory follows the tile, not the image;
 * the output differs a little from the untiled one near the seams (each tile sees only its own context).
 * The blending runs on the host over f32 tiles; the model runs through the backend (vae_decoder_run). */
#ifndef DT_VAE_TILING_H
#define DT_VAE_TILING_H

#include <stdint.h>

#include "backends/backend.h"
#include "models/vae_decoder.h"

/* What a VAE is asked to do: tile or not, and the tile side. */
typedef struct {
    int enabled;   /* tile when the image is larger than one tile (diffusers: use_tiling) */
    int tile;      /* tile side in image pixels, a multiple of 4 x the VAE's scale factor */
} dt_vae_tiling;

/* One tiled run's geometry. Output size = input size · num / den. */
typedef struct {
    int cin, cout;      /* channels in, out */
    int num, den;       /* decode: scale, 1; encode: 1, scale */
    int tile, stride;   /* input: tile side, distance between tile starts */
    int blend, keep;    /* output: rows/columns blended with the neighbour, rows/columns kept of each tile */
} vae_tile_geom;

/* One tile: in [cin, h, w] (f32 host) -> out [cout, h·num/den, w·num/den] (f32 host). 0 or -1 (dt_last_error). */
typedef int (*vae_tile_fn)(void *ctx, const float *in, int h, int w, float *out);

/* 0 when `tile` pixels can be a tile side of a VAE with this scale factor (a multiple of 4·scale: the latent tile,
 * its stride and the blend are then whole numbers and the tiles add up to the image), else -1 with an error naming
 * `what` and the sizes that work. */
int vae_tiling_check(const char *what, int tile, int scale);
/* The geometry of diffusers' tiled_decode for a tile of `tile` pixels (latent tile tile/scale). */
vae_tile_geom vae_tile_geom_decode(int cin, int cout, int scale, int tile);
/* The geometry of diffusers' _tiled_encode for a tile of `tile` pixels. */
vae_tile_geom vae_tile_geom_encode(int cin, int cout, int scale, int tile);
/* Does an input of H x W (input units) take more than one tile? (diffusers: larger than one tile on a side) */
int vae_tiles_needed(const vae_tile_geom *g, int H, int W);
/* Tiles along a side of n input units. */
int vae_tile_count(const vae_tile_geom *g, int n);
/* Run fn over the tiles of in [cin, H, W] and blend them into out [cout, H·num/den, W·num/den] (f32 host).
 * Host memory: one input and one output tile, plus the overlap strips of a row of tiles. 0 or -1. */
int vae_tiled_run(const vae_tile_geom *g, const float *in, int H, int W, float *out, vae_tile_fn fn, void *ctx);

/* Device bytes of vae_decoder_run's activations for a latent of H x W with elements of elem bytes: its three
 * rotating buffers (the largest stage) plus the mid-block attention's temporaries, attn_per_token values per latent
 * pixel (FLUX.2: q, k, v, out = 4·C; Qwen-Image: qkv twice and out = 7·C). Only d's widths are read (n_up, latent,
 * top, out_channels, up[].cin/cout/up_cout, 0 for no upsampler): a decoder described from a config without weights will do. */
int64_t vae_decoder_act_bytes(const vae_decoder *d, int H, int W, int elem, int attn_per_token);
/* The same for a tiled decode: one tile's (the largest tile of t's geometry; the untiled size when it is one tile). */
int64_t vae_decoder_tiled_act_bytes(const vae_decoder *d, const dt_vae_tiling *t, int scale, int H, int W, int elem,
                                    int attn_per_token);

/* The shared decoder walk (vae_decoder_run) tiled when t->enabled and the latent [d->latent, H, W] is larger than
 * a tile; into rgb [out_channels, s·H, s·W] f32 or rgb8 [s·H, s·W, 3] (s = scale). *tiled (may be NULL) says which
 * path ran. 0 or -1. */
int vae_decoder_run_tiled(dt_backend *be, const vae_decoder *d, const dt_vae_tiling *t, int scale, const float *latent,
                          int H, int W, float *rgb, uint8_t *rgb8, int *tiled);

#endif
