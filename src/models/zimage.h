/* zimage.h — the Z-Image transformer (diffusers ZImageTransformer2DModel: Z-Image-Turbo and Z-Image), written
 * against the backend op interface: a single-stream DiT (S3-DiT) whose image tokens and caption tokens each pass
 * their own refiner blocks (the image's modulated by the timestep, the caption's not) before the joint blocks over
 * [image | caption], with 3-axis RoPE, tanh-gated adaLN and a LayerNorm final layer. Geometry comes from
 * config.json. NOTES.md ("Z-Image") has the conventions.
 */
#ifndef DT_ZIMAGE_H
#define DT_ZIMAGE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backends/backend.h"
#include "models/block_cache.h"
#include "io/json.h"
#include "io/weights.h"
#include "models/dit.h"
#include "models/lora.h"

#define ZIMAGE_AXES 3          /* RoPE axes: (caption / frame position, row, column) */
#define ZIMAGE_SEQ_MULTIPLE 32 /* each stream is padded to a multiple of this many tokens (pad tokens) */
#define ZIMAGE_T_FREQ 256      /* timestep sinusoid width (TimestepEmbedder's frequency_embedding_size) */
#define ZIMAGE_ADALN_MAX 256   /* the adaLN input width is min(dim, 256) */
#define ZIMAGE_QK_EPS 1e-5f    /* the per-head RMSNorm of q and k (the Attention's own eps, not norm_eps) */
#define ZIMAGE_FINAL_EPS 1e-6f /* the final layer's LayerNorm */
#define ZIMAGE_MAX_DIM 65536   /* the widest model accepted (Z-Image: 3840): products stay far inside 64 bits */

typedef struct {
    int in_channels;       /* latent channels C (16) */
    int patch;             /* all_patch_size (one entry, 2): image tokens are patch x patch latent pixels */
    int patch_channels;    /* patch² · C: features of one image token (its order: (row, column, channel)) */
    int dim;               /* hidden width D */
    int heads, head_dim;   /* n_heads; D / n_heads (K and V have n_heads too: n_kv_heads is unused, as in the reference) */
    int n_layers;          /* joint blocks */
    int n_refiner;         /* refiner blocks per stream (image: modulated; caption: not) */
    int ffn;               /* SwiGLU width int(D / 3 · 8) */
    int adaln;             /* min(D, 256): the timestep embedding's width */
    int t_mid;             /* the timestep MLP's hidden width (1024; from t_embedder.mlp.0's shape at load, 0 before) */
    int cap_dim;           /* cap_feat_dim: text-encoder hidden size */
    int qk_norm;           /* per-head RMSNorm of q and k */
    int axes[ZIMAGE_AXES];     /* axes_dims: RoPE dims per axis (even, sum = head_dim) */
    int axes_len[ZIMAGE_AXES]; /* axes_lens: positions on each axis must stay below these */
    float rope_theta;      /* 256 */
    float t_scale;         /* the model embeds t · t_scale (1000) */
    float eps;             /* norm_eps of every block RMSNorm and the caption embedder's */
} zimage_config;

/* Parse a ZImageTransformer2DModel config.json; a missing or inconsistent field is an error naming `what` (the
 * file) and the field. 0 or -1. */
int zimage_config_parse(const json *cfg, const char *what, zimage_config *c);
/* The geometry of the transformer at path (folder, pipeline root, or a file): its config.json, or without one the
 * geometry read from the tensors (Z-Image-Turbo's config otherwise; single files as ComfyUI ships them). 0 or -1. */
int zimage_config_read(const char *path, zimage_config *c);
/* `ditrun info`: the geometry line of a Z-Image transformer config. 0 or -1 (invalid). */
int zimage_config_describe(const json *cfg, FILE *f);

typedef struct zimage_model zimage_model;

/* Load from a transformer folder (config.json + safetensors, or a single file without config.json: zimage_config_read)
 * or a pipeline root holding transformer/. NULL on error (dt_last_error names the file and tensor). */
zimage_model *zimage_load(dt_backend *be, const char *path);
/* What a load may ask for beyond the defaults (zero: bf16, no adapters). */
typedef struct {
    /* LoRA adapters (models/lora.h; n_loras of them): module names as the checkpoint's (diffusers:
     * layers.N.attention.to_q, feed_forward.w1, adaLN_modulation.0, ...) or as the original implementation's
     * (attention.qkv fused, attention.out), in PEFT or kohya spelling; merged into dense weights (lora_side 0), else
     * low-rank side products. */
    const dt_lora_spec *loras;
    int n_loras, lora_side;
    dt_precision precision;      /* --precision fp8: the blocks' attention and FFN Linears in e4m3 */
    dt_precision attn_precision; /* --attn-precision fp8: the blocks' attention on the backend's attention_fp8 */
    int fp8_unfused;             /* A/B arm of fp8 Linears: each quantizes its own input (no norm feeding them;
                                  * dt_linear_src.fp8_unfused) */
} zimage_load_opts;
zimage_model *zimage_load_ex(dt_backend *be, const char *path, const zimage_load_opts *o);
void zimage_free(zimage_model *m);
const zimage_config *zimage_get_config(const zimage_model *m);
/* Bytes of weights as stored, and a short description of their formats ("bf16", ...). */
void zimage_weight_info(const zimage_model *m, size_t *bytes, char *fmt, size_t fmt_len);

/* A cancellation flag (dt_cancel_requested) polled before each joint block: a cancelled forward stops within one
 * block and fails with "zimage: cancelled". NULL: none. */
/* First Block Cache (models/block_cache.h) for the forwards that follow: f is the guidance branch's state (NULL:
 * every block runs). The head is joint block 0 (layers.0), the tail the last joint block; the residuals are the joint
 * stream's N real image rows (the rows the final layer reads). */
void zimage_set_block_cache(zimage_model *m, dt_fbc_branch *f);
void zimage_set_cancel(zimage_model *m, const volatile int *flag);

/* Image tokens of a latent and back: latent [C, H, W] (H, W multiples of patch) <-> tokens
 * [(H/p)·(W/p), p·p·C], token (h, w) in row-major order, its features ordered (row in patch, column in patch,
 * channel) — the reference's patchify (channel fastest, unlike FLUX's packing). */
void zimage_patchify(const zimage_config *c, const float *latent, int H, int W, float *tokens);
void zimage_unpatchify(const zimage_config *c, const float *tokens, int H, int W, float *latent);

/* One forward, as the reference runs one batch item:
 *   img     [grid_h · grid_w, patch_channels]   image tokens (zimage_patchify), f32 host
 *   cap     [n_cap, cap_dim]                     the caption's features (real tokens only), f32 host
 *   t       the model's time, 1 − sigma (the pipeline passes (1000 − timestep) / 1000); embedded as t · t_scale
 *   out     [grid_h · grid_w, patch_channels]    the model's output (the pipeline's velocity is its negative)
 *   trace   optional observer (NULL: none): "t_emb" [1, adaln]; "x_embed" [N, D] and "cap_embed" [n_cap, D] (the
 *           embedders, before the pad tokens); "noise_refiner.i" [Nx, D] and "context_refiner.i" [Tc, D] (the
 *           padded streams after refiner i); "layer.i" [Nx + Tc, D] (the joint [image | caption] stream);
 *           "final" [N, patch_channels]. Nx, Tc: the streams padded to ZIMAGE_SEQ_MULTIPLE.
 * 0 or -1 (dt_last_error). Buffers are kept between calls (grown when a call needs more). */
int zimage_forward(zimage_model *m, const float *img, int grid_h, int grid_w, const float *cap, int n_cap, float t,
                   float *out, dt_dit_trace_fn trace, void *trace_ud);

/* ---- the bench's view (bench/bench_zimage.c): the joint blocks' ops, device-only, on the model's own weights and the
 * activations its last zimage_forward left (the joint stream after the last block, the RoPE tables, the folded
 * modulation of its timestep). A block is its ops in this order. */
enum {
    ZIMAGE_OP_NORM1,        /* RMSNorm · (1 + scale_msa) */
    ZIMAGE_OP_QKV,          /* the stacked q/k/v GEMM */
    ZIMAGE_OP_QKNORM_ROPE,  /* per-head RMSNorm and RoPE of q and k (one pass each) */
    ZIMAGE_OP_ATTN,         /* SDPA, no mask */
    ZIMAGE_OP_OUT,          /* to_out.0 GEMM */
    ZIMAGE_OP_RESID1,       /* RMSNorm · tanh(gate_msa), residual add */
    ZIMAGE_OP_NORM2,        /* RMSNorm · (1 + scale_mlp) */
    ZIMAGE_OP_W13,          /* w1 and w3 GEMMs */
    ZIMAGE_OP_SWIGLU,       /* SiLU(w1 x) ⊙ w3 x */
    ZIMAGE_OP_W2,           /* w2 GEMM */
    ZIMAGE_OP_RESID2,       /* RMSNorm · tanh(gate_mlp), residual add */
    ZIMAGE_OP_COUNT
};
/* Rows of the joint stream of the last forward (padded image + padded caption; 0 before any forward). */
int64_t zimage_joint_rows(const zimage_model *m);
dt_mat zimage_joint_stream(zimage_model *m);   /* [rows, D] */
/* Op `op` of joint block `layer` on the joint stream (queued, no sync); blocks first .. first + count − 1 whole. */
void zimage_block_op(zimage_model *m, int layer, int op);
void zimage_joint_blocks(zimage_model *m, int first, int count);
/* Joint block `layer`'s Linears: qkv [3D, D], out [D, D], w1 [F, D], w3 [F, D], w2 [D, F]. */
void zimage_block_linears(const zimage_model *m, int layer, dt_linear *out[5]);
const dt_weights *zimage_weights(const zimage_model *m);

/* Geometry presets: "z-image-turbo" (ZImageTransformer2DModel's defaults: Z-Image(-Turbo)) and "z-image-tiny"
 * (tests/fixtures/zimage). 0 or -1 (dt_last_error names the presets). zimage_presets.c; the synthetic writer is
 * synth/synth_dit.h's zimage_synth_write. */
int zimage_preset(const char *name, zimage_config *c);

#endif
