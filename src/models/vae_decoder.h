/* vae_decoder.h — what the two VAE decoders (vae_flux2.c: AutoencoderKLFlux2, vae_qwenimage.c:
 * AutoencoderKLQwenImage on one frame) share: the decoder walk
 *   [post_quant_conv 1×1] → conv_in 3×3 → mid block (resnet, the family's attention, resnet)
 *   → up blocks (resnets, then nearest 2× + 3×3 conv except after the last) → norm + SiLU → conv_out 3×3,
 * its resnets and channel norms, and the three rotating activation buffers. The families differ in the
 * norm (GroupNorm or the channel RMS norm), the mid-block attention (passed in), the upsampler's width and the
 * tensor names and kernel layouts (each loads its own weights through a vae_loader). Activations are images
 * [C, h·w] (channel-major). Not a public interface.
 */
#ifndef DT_VAE_DECODER_H
#define DT_VAE_DECODER_H

#include <stdint.h>

#include "backends/backend.h"
#include "io/weights.h"

#define VAE_MAX_UP_BLOCKS 8
#define VAE_GN_EPS 1e-6f   /* every GroupNorm of the FLUX.2 VAE (resnet_eps, attention norm, conv_norm_out) */

/* A channel norm's parameters, [1, C] F32 each: GroupNorm's gamma and beta, or the RMS norm's gamma (beta null). */
typedef struct {
    dt_mat gamma, beta;
} vae_norm;

/* x [cin, hw] -> x [cout, hw]: shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))). */
typedef struct {
    int cin, cout;
    vae_norm n1, n2;
    dt_conv *conv1, *conv2, *shortcut;   /* 3×3, 3×3; shortcut: 1×1, only when cin != cout */
} vae_resnet;

typedef struct {
    int cin, cout, n_res;
    vae_resnet *res;
    dt_conv *up_conv;                    /* after the 2× upsample: cout -> up_cout; NULL for the last block */
    int up_cout;
} vae_up_block;

/* Three rotating image buffers of `cap` elements: x = current activation, t = scratch, y = output. */
typedef struct {
    dt_mat buf[3];
    int x, t, y;
} vae_act3;

/* A family's mid-block attention: x [C, hw] (a->x) += attention(norm(x)), the result left in a->x. */
typedef struct {
    void (*run)(const void *weights, dt_backend *be, int groups, vae_act3 *a, int C, int64_t hw);
    const void *weights;                 /* the family's attention weights; NULL: the block has no attention */
} vae_attention;

/* The decoder's weights and widths (filled by the family's loader). */
typedef struct {
    int groups;                          /* GroupNorm groups (eps VAE_GN_EPS); 0: channel RMS norm */
    int latent, top, out_channels;       /* latent channels, mid-block channels, image channels */
    int n_up;
    dt_conv *post_quant, *conv_in, *conv_out;   /* post_quant: 1×1, NULL when the model has none */
    vae_resnet mid_res[2];
    vae_attention mid_attn;
    vae_up_block up[VAE_MAX_UP_BLOCKS];
    vae_norm norm_out;                   /* [up[n_up - 1].cout] */
} vae_decoder;

/* How a family reads its weights: a k×k conv NAME [cout, cin, k, k] with bias, and a channel norm NAME of C. */
typedef struct {
    void *ctx;
    dt_conv *(*conv)(void *ctx, const char *name, int cout, int cin, int k);
    int (*norm)(void *ctx, const char *name, int C, vae_norm *n);
} vae_loader;

/* ---- loading ---- */
/* The backend conv from wt [cout, cin, k, k] (host, freed here) and NAME.bias [cout] read from w; only the first
 * `rows` output channels are kept (rows outside 1..cout: all); padding k/2. NULL on error (dt_last_error). */
dt_conv *vae_conv_create(dt_backend *be, dt_weights *w, const char *name, float *wt, int cout, int cin, int k, int rows);
/* "d0, d1, ..." of t's shape into dst (error messages). */
void vae_shape_str(const st_tensor *t, char *dst, size_t n);
/* n resnets PREFIX.resnets.0 .. n-1 (norm1, conv1, norm2, conv2, conv_shortcut): the first cin -> cout, the rest
 * cout -> cout. 0 or -1. */
int vae_resnets_load(const vae_loader *ld, const char *prefix, int n, int cin, int cout, vae_resnet *res);
/* Up block B's resnets (decoder.up_blocks.B.resnets.*, n_res of them) into u; the family loads the upsampler.
 * 0 or -1. */
int vae_up_block_load(const vae_loader *ld, int b, int cin, int cout, int n_res, vae_up_block *u);
void vae_norm_free(dt_backend *be, vae_norm *n);
void vae_resnet_free(dt_backend *be, vae_resnet *r);
/* Every weight of d but the attention's (the family's). */
void vae_decoder_free(dt_backend *be, vae_decoder *d);

/* ---- running ---- */
dt_mat vae_view(const vae_act3 *a, int idx, int64_t rows, int64_t cols);
void vae_swap_xy(vae_act3 *a);
/* out = norm(in) [C, hw], then SiLU when silu: GroupNorm with `groups` groups, or with groups 0 the RMS norm. */
void vae_run_norm(dt_backend *be, int groups, dt_mat out, dt_mat in, const vae_norm *n, int silu);
/* x [cin, hw] -> x [cout, hw] */
void vae_run_resnet(dt_backend *be, int groups, const vae_resnet *r, vae_act3 *a, int h, int w);
/* x [C, hw] -> resnet, attention (when at->weights), resnet. */
void vae_run_mid_block(dt_backend *be, int groups, const vae_resnet res[2], const vae_attention *at, vae_act3 *a, int C,
                       int h, int w);
/* Decode latent [latent, H, W] (f32 host) into rgb [out_channels, s·H, s·W] (f32 host), s = 2^(upsampling blocks).
 * The caller checks H and W. The backend's sync status: 0 ok, -1 error. */
int vae_decoder_run(dt_backend *be, const vae_decoder *d, const float *latent, int H, int W, float *rgb,
                    uint8_t *rgb8);

#endif
