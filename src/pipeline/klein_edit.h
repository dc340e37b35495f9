/* klein_edit.h — the editing inputs of a FLUX.2-klein request turned into what its sampling loop needs
 * (diffusers Flux2KleinPipeline with `image=`, Flux2KleinKVPipeline, Flux2KleinInpaintPipeline):
 *   - reference images: prepared (image/edit_prep.h), VAE-encoded, packed into tokens with position ids
 *     (T = 10 + 10k for the k-th image, row, column, 0), all images' tokens in one [R, C] array;
 *   - inpainting: the init image prepared to its own size (the output size), encoded: its tokens are the init
 *     latents AND the first reference (T = 10; further reference images follow at T = 20, 30, ...); the mask on
 *     the packed grid;
 *   - the output size: inpainting's init image, else a side the request left at 0 from the first reference.
 * Latent tokens live in the packed, batch-norm-normalized space of the noise. */
#ifndef DT_KLEIN_EDIT_H
#define DT_KLEIN_EDIT_H

#include "image/edit_prep.h"
#include "models/vae_flux2.h"
#include "pipeline/generate.h"

typedef struct {
    int H, W;          /* output size in pixels */
    int r;             /* reference tokens, every image together (0: none) */
    float *ref_tok;    /* [r, C] */
    float *ref_ids;    /* [r, 4] */
    float *init_tok;   /* inpainting: the init image's tokens [N, C] (N = H·W / multiple²); NULL otherwise */
    float *mask_tok;   /* inpainting: the mask on the packed grid [N] (1 = repaint) */
    dt_prep_image *imgs;   /* prepared images in token order (klein_edit_prepare -> klein_edit_encode) */
    int n_imgs;
} klein_edit;

/* Check and prepare the request's editing inputs (no model needed; every error names its image), and settle the
 * output size: e->H/W start as the request's size (0 = not given). multiple = 2 x the VAE's scale factor.
 * 0 or -1 (dt_last_error). */
int klein_edit_prepare(const dt_gen_params *g, int multiple, klein_edit *e);
/* Encode the prepared images with vae into the reference tokens (and the init latents); C latent channels per
 * token, which the transformer takes. 0 or -1. */
int klein_edit_encode(dt_vae *vae, int C, klein_edit *e);
void klein_edit_free(klein_edit *e);

/* The previous request's reference images and their tokens: a request whose prepared references are the same
 * pixels at the same sizes (an edit loop over one image with other prompts or seeds) reuses the tokens instead of
 * running the VAE encoder, and the DiT keeps them (KV mode: their cached K|V too). Inpainting is never cached. */
typedef struct {
    dt_prep_image *imgs;   /* copies of the prepared images [n] (the key) */
    int n;
    int r;                 /* their tokens [r, C] and ids [r, 4] */
    float *tok, *ids;
} klein_ref_cache;

/* Whether e's prepared images (klein_edit_prepare) are the cached ones, pixel for pixel. */
int klein_ref_cache_matches(const klein_ref_cache *c, const klein_edit *e);
/* Copy e's prepared images (call before klein_edit_encode, which frees them) as the next key; the tokens follow
 * with klein_ref_cache_set_tokens once encoded. */
void klein_ref_cache_set_images(klein_ref_cache *c, const klein_edit *e);
void klein_ref_cache_set_tokens(klein_ref_cache *c, const klein_edit *e, int C);
void klein_ref_cache_clear(klein_ref_cache *c);

#endif
