/* vae_flux2_internal.h — what the AutoencoderKLFlux2 decoder (vae_flux2.c) and encoder (vae_flux2_encoder.c)
 * share: the dt_vae object, its weight loading (GroupNorms, convs in either layout, Linears) and the
 * single-head attention; the resnets, norms and activation buffers are the VAE decoders' (vae_decoder.h).
 * Not a public interface. */
#ifndef DT_VAE_FLUX2_INTERNAL_H
#define DT_VAE_FLUX2_INTERNAL_H

#include "io/weights.h"
#include "models/vae_decoder.h"
#include "models/vae_flux2.h"
#include "models/vae_tiling.h"

_Static_assert(DT_VAE_MAX_BLOCKS <= VAE_MAX_UP_BLOCKS, "the shared decoder holds every up block");

typedef struct {
    vae_norm norm;                       /* GroupNorm */
    dt_linear *q, *k, *v, *o;            /* [C, C] with bias */
} attn;

typedef struct vae_encoder vae_encoder;  /* vae_flux2_encoder.c */

struct dt_vae {
    dt_backend *be;
    dt_weights *w;                       /* kept open: Linear weights may be zero-copy views; the encoder loads later */
    dt_vae_config cfg;
    float *bn_mean, *bn_var;             /* [latent_channels·patch²] */
    int bn_n;
    vae_decoder dec;                     /* GroupNorm groups; mid_attn.weights: &mid_attn when the config has it */
    attn mid_attn;
    vae_loader ld;                       /* this file's convs (vae_load_conv, all rows) and GroupNorms */
    int conv_layout;                     /* 0 unknown, 1 PyTorch [o,i,kh,kw], 2 MLX [o,kh,kw,i] */
    vae_encoder *enc;                    /* NULL until dt_vae_load_encoder */
    void (*enc_free)(dt_vae *v);         /* frees enc: set with it by the encoder file (vae_flux2.c calls none of it) */
    dt_vae_tiling tiling;                /* dt_vae_set_tiling (off by default) */
    int last_tiled;                      /* the last decode or encode ran tiled */
};

/* ---- loading (NAME is the tensor prefix) ---- */
/* dt_vae_load / dt_vae_read_config for either class: kl 0 AutoencoderKLFlux2, 1 AutoencoderKL (vae_kl.c). */
dt_vae *vae_load_kind(dt_backend *be, const char *vae_dir, int kl);
int vae_read_config_kind(const char *vae_dir, int kl, dt_vae_config *cfg);
int vae_load_gnorm(dt_vae *v, const char *name, int C, vae_norm *g);
/* k×k conv NAME, weight [cout, cin, k, k] (PyTorch) or [cout, k, k, cin] (MLX), bias [cout]; only the first
 * `rows` output channels are kept (rows = cout: all). Created with padding k/2 (conv2d_strided ignores it). */
dt_conv *vae_load_conv(dt_vae *v, const char *name, int cout, int cin, int k, int rows);
dt_linear *vae_load_linear(dt_vae *v, const char *name, int C);
/* A mid-block attention PREFIX.attentions.0 (group_norm, to_q/k/v, to_out.0 or mflux's to_out). */
int vae_load_attn(dt_vae *v, const char *prefix, int C, attn *a);
void vae_free_attn(dt_backend *be, attn *a);

/* ---- running ---- */
/* vae_attention.run with weights an attn: x [C, hw] += to_out(attention(GN(x) tokens)), one head of size C. */
void vae_run_attention(const void *weights, dt_backend *be, int groups, vae_act3 *a, int C, int64_t hw);

#endif
