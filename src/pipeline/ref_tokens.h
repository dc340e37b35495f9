/* ref_tokens.h — reference images -> the transformer's reference tokens (FLUX.2-klein editing), as the
 * reference pipeline's prepare_image_latents does it: for each prepared image k (image/edit_prep.h) the VAE
 * encoder's posterior mode [L, H/s, W/s], patchified to [4L, H/2s, W/2s], normalized with the VAE's latent
 * batch-norm running statistics ((x − mean) / sqrt(var + eps)), packed to tokens [(H/2s)·(W/2s), 4L] (row-major
 * over the grid), and given position ids (T, row, col, 0) with T = 10 + 10·k. The images' tokens follow each
 * other in order. Inpainting uses the same call with the init image as image 0 (T = 10): its tokens are the
 * init image latents the sampler mixes with the noise.
 */
#ifndef DT_REF_TOKENS_H
#define DT_REF_TOKENS_H

#include "image/edit_prep.h"
#include "models/vae_flux2.h"

typedef struct {
    int n_images;
    int n_tokens;      /* sum over images of grid_h[k]·grid_w[k] */
    int channels;      /* 4·latent_channels (the transformer's in_channels) */
    float *tokens;     /* [n_tokens, channels] f32 host */
    float *ids;        /* [n_tokens, 4] f32 host: (10 + 10k, row, col, 0) */
    int *first;        /* [n_images] index of image k's first token */
    int *grid_h, *grid_w;   /* [n_images] packed latent grid of image k (H/2s, W/2s) */
} dt_ref_tokens;

/* Encode n prepared images (sizes multiples of 2·scale_factor) with v's encoder (loaded on first use).
 * 0 ok, -1 error (out is left empty). */
int dt_ref_tokens_encode(dt_vae *v, const dt_prep_image *imgs, int n, dt_ref_tokens *out);
void dt_ref_tokens_free(dt_ref_tokens *r);

/* The `multiple` edit_prep.h needs for this VAE: 2·scale_factor (16 for the released VAE). */
int dt_ref_multiple(const dt_vae *v);

#endif
