/* vae_flux2_internal.h — what the AutoencoderKLFlux2 decoder (vae_flux2.c) and encoder (vae_flux2_encoder.c)
 * share: the dt_vae object, the resnet / attention / GroupNorm blocks (loading and running), and the three
 * rotating activation buffers. Not a public interface. */
#ifndef DT_VAE_FLUX2_INTERNAL_H
#define DT_VAE_FLUX2_INTERNAL_H

#include "io/weights.h"
#include "models/vae_flux2.h"

#define VAE_GN_EPS 1e-6f   /* every GroupNorm of the VAE (resnet_eps, attention norm, conv_norm_out) */

typedef struct {
    dt_mat gamma, beta;   /* [1, C] F32 params */
} gnorm;

typedef struct {
    int cin, cout;
    gnorm n1, n2;
    dt_conv *conv1, *conv2, *shortcut;   /* shortcut: 1×1, only when cin != cout */
} resnet;

typedef struct {
    gnorm norm;
    dt_linear *q, *k, *v, *o;            /* [C, C] with bias */
} attn;

typedef struct {
    int cin, cout, n_res;
    resnet *res;
    dt_conv *up_conv;                    /* NULL for the last block */
} up_block;

typedef struct vae_encoder vae_encoder;  /* vae_flux2_encoder.c */

struct dt_vae {
    dt_backend *be;
    dt_weights *w;                       /* kept open: Linear weights may be zero-copy views; the encoder loads later */
    dt_vae_config cfg;
    float *bn_mean, *bn_var;             /* [latent_channels·patch²] */
    int bn_n;
    dt_conv *post_quant, *conv_in, *conv_out;
    resnet mid_res[2];
    attn mid_attn;
    up_block up[DT_VAE_MAX_BLOCKS];
    gnorm norm_out;
    int conv_layout;                     /* 0 unknown, 1 PyTorch [o,i,kh,kw], 2 MLX [o,kh,kw,i] */
    vae_encoder *enc;                    /* NULL until dt_vae_load_encoder */
};

/* ---- loading (NAME is the tensor prefix) ---- */
int vae_load_gnorm(dt_vae *v, const char *name, int C, gnorm *g);
void vae_free_gnorm(dt_backend *be, gnorm *g);
/* k×k conv NAME, weight [cout, cin, k, k] (PyTorch) or [cout, k, k, cin] (MLX), bias [cout]; only the first
 * `rows` output channels are kept (rows = cout: all). Created with padding k/2 (conv2d_strided ignores it). */
dt_conv *vae_load_conv(dt_vae *v, const char *name, int cout, int cin, int k, int rows);
dt_linear *vae_load_linear(dt_vae *v, const char *name, int C);
int vae_load_resnet(dt_vae *v, const char *prefix, int cin, int cout, resnet *r);
void vae_free_resnet(dt_backend *be, resnet *r);
/* A mid-block attention PREFIX.attentions.0 (group_norm, to_q/k/v, to_out.0 or mflux's to_out). */
int vae_load_attn(dt_vae *v, const char *prefix, int C, attn *a);
void vae_free_attn(dt_backend *be, attn *a);

/* ---- running: images are [C, h·w] in three rotating buffers of `cap` elements each ---- */
typedef struct {
    dt_mat buf[3];
    int x, t, y;   /* indices: current activation, scratch, output */
} vae_act3;

dt_mat vae_view(const vae_act3 *a, int idx, int64_t rows, int64_t cols);
void vae_swap_xy(vae_act3 *a);
/* x [cin, hw] -> x [cout, hw]: shortcut(x) + conv2(silu(gn2(conv1(silu(gn1(x)))))) */
void vae_run_resnet(dt_vae *v, const resnet *r, vae_act3 *a, int h, int w);
/* x [C, hw] += to_out(attention(GN(x) tokens)), one head of size C; qkvo: 4 scratch [hw, C]. */
void vae_run_attention(dt_vae *v, const attn *at, vae_act3 *a, dt_mat *qkvo, int C, int64_t hw);

void vae_encoder_free(dt_vae *v);

#endif
