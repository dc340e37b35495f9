/* krea2.h — the Krea 2 transformer (diffusers Krea2Transformer2DModel), written against the
 * backend op interface: text fusion over tapped text-encoder layers, a single-stream DiT with
 * grouped-query gated attention, SwiGLU MLPs and zero-centred RMSNorm. Geometry comes from
 * config.json. See docs/krea2-notes.md.
 */
#ifndef DT_KREA2_H
#define DT_KREA2_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "io/weights.h"
#include "models/linear_set.h"
#include "models/block_cache.h"
#include "models/lora.h"

#define KREA2_MAX_AXES 8

typedef struct {
    int in_channels;        /* packed latent channels per image token (64 for Krea 2) */
    int out_channels;       /* = in_channels (diffusers sets out_channels = in_channels) */
    int num_layers;         /* transformer blocks */
    int heads, kv_heads;    /* query heads, key/value heads (GQA) */
    int head_dim;           /* attention_head_dim; hidden D = heads * head_dim */
    int hidden;             /* D */
    int intermediate;       /* SwiGLU width F of the transformer blocks */
    int t_embed;            /* timestep sinusoid width (timestep_embed_dim, even) */
    int text_dim;           /* text_hidden_dim (text-encoder hidden size) */
    int text_layers;        /* num_text_layers: tapped hidden states stacked per token */
    int text_heads, text_kv_heads;  /* text fusion attention heads */
    int text_head_dim;      /* text_dim / text_heads */
    int text_intermediate;  /* SwiGLU width of the text fusion blocks */
    int n_layerwise;        /* num_layerwise_text_blocks (attend across the layer axis per token) */
    int n_refiner;          /* num_refiner_text_blocks (attend across tokens, text padding mask) */
    int n_axes;             /* RoPE axes (3: t, h, w) */
    int axes[KREA2_MAX_AXES];   /* dims per axis, sum = head_dim */
    float rope_theta;
    float eps;              /* norm_eps of every RMSNorm */
    int attn_fp8;           /* run-time choice, not from config.json (krea2_runtime_choices): the transformer blocks'
                             * attention through the backend's attention_fp8 (--attn-precision fp8) */
    int fuse_inputs;        /* run-time choice (krea2_runtime_choices): the Linears fed by the attention gate or the
                             * SwiGLU go through act_linear_gated with their gated residual (fp8 Linears: the
                             * producer writes the e4m3 codes, the gate folds into the GEMM); 0: separate ops */
} krea2_config;

/* The widest model accepted (heads x head_dim; Krea 2 is 6144): products of widths and token counts stay well
 * inside 64 bits. */
#define KREA2_MAX_HIDDEN 65536

/* Parse config.json; a missing/invalid field is an error naming `what` (the file) and the field. */
int krea2_config_parse(const json *cfg, const char *what, krea2_config *c);
/* The config's run-time choices (krea2_load and the bench, before loading the blocks): attn_fp8 from attn_precision
 * (-1 with an error naming `what` when the backend has no fp8 attention), fuse_inputs when the blocks' Linears run in
 * fp8 (`linears`: --precision, or an fp8 file) unless fp8_unfused (krea2_load_opts). */
int krea2_runtime_choices(const dt_backend *be, dt_precision linears, dt_precision attn_precision, int fp8_unfused,
                          krea2_config *c, const char *what);

typedef struct krea2_model krea2_model;

/* Observer of intermediate tensors (tests, debugging): "block.N" = joint [text, image] stream
 * [T+N, D] after transformer block N. The matrix is only valid during the call. */
typedef void (*krea2_trace_fn)(void *ud, const char *name, dt_mat m);

/* Load from a transformer folder (config.json + safetensors, dense or MLX-quantized Linears) or a
 * pipeline root holding transformer/. NULL on error (dt_last_error names file and tensor). */
krea2_model *krea2_load(dt_backend *be, const char *path);
/* Load options: LoRA adapters on its Linears (models/lora.h; keys by the checkpoint's module names, diffusers
 * or kohya spelling), merged into dense weights or side products through a backend wrapper as for FLUX.2. */
typedef struct {
    const dt_lora_spec *loras;
    int n_loras;
    int lora_side;
    dt_precision precision;      /* --precision: the transformer blocks' Linears (fp8: e4m3; embedders, modulation,
                                  * text fusion, final stay bf16), each Linear's dt_linear_src.precision */
    dt_precision attn_precision; /* --attn-precision: the blocks' attention */
    int fp8_unfused;             /* A/B arm of fp8 Linears (dt_linear_src.fp8_unfused; flux2_load_opts says more) */
} krea2_load_opts;
krea2_model *krea2_load_ex(dt_backend *be, const char *path, const krea2_load_opts *o);
void krea2_free(krea2_model *m);
const krea2_config *krea2_get_config(const krea2_model *m);
/* Bytes of weights as stored, and a short description of the formats ("bf16", "bf16+q4 g64", ...). */
void krea2_weight_info(const krea2_model *m, size_t *bytes, char *fmt, size_t fmt_len);

/* First Block Cache (models/block_cache.h) for the forwards that follow: f is the guidance branch's state (NULL:
 * every block runs). The head is the first transformer block; its residual and the cached one are the joint
 * stream's image rows (the rows the final layer reads). */
void krea2_set_block_cache(krea2_model *m, dt_fbc_branch *f);

/* One forward pass.
 *   img       [N, in_channels]               packed latent tokens (f32 host)
 *   txt       [T, text_layers, text_dim]     stacked tapped text-encoder hidden states (f32 host)
 *   timestep  flow time in [0, 1] (the model multiplies by 1000)
 *   pos_ids   [T+N, n_axes]                  (t, h, w) RoPE coordinates, text rows first (f32 host)
 *   txt_mask  [T] 1 = real token, 0 = padding; NULL = every token valid. Padded tokens are dropped before the
 *             blocks (only the real ones are computed: the velocity is the masked forward's)
 *   out       [N, out_channels]              velocity (f32 host)
 *   trace     optional observer (NULL = none); the joint stream it sees holds the real text tokens only
 * Returns 0 or -1 (dt_last_error). */
/* A cancellation flag (dt_cancel_requested) the forwards poll before each block: a cancelled request stops within one
 * block, the forward failing with "cancelled". NULL: none. */
void krea2_set_cancel(krea2_model *m, const volatile int *flag);

int krea2_forward(krea2_model *m, const float *img, int n_img, const float *txt, int n_txt, float timestep,
                  const float *pos_ids, const uint8_t *txt_mask, float *out, krea2_trace_fn trace, void *trace_ud);

/* CUDA-graph replay of the forward's device part (on = 1; only where the backend captures): per shape and text mask,
 * the first call runs eagerly, the second is captured, later ones replay it (two masks kept: a guided step's prompt
 * and negative prompt run one after the other; a batched guided step (krea2_forward_batch) is one shape with both
 * masks). A trace runs eagerly. */
void krea2_set_graph(krea2_model *m, int on);

/* krea2_forward on backend matrices: the latents img [N, in_channels] and the velocity out [N, out_channels] (F32 or
 * the backend's act dtype) stay on the backend (the sampler's device path); the work is queued, not waited for.
 * 0 or -1 (dt_last_error). */
int krea2_forward_dev(krea2_model *m, dt_mat img, const float *txt, int n_txt, float timestep, const float *pos_ids,
                      const uint8_t *txt_mask, dt_mat out);

/* The text rows a forward computes for a text of `real` real tokens among `longest` (the longest text given): real
 * rounded up to a multiple of 32 (masked padding in front) within longest, or longest when no token is padding. */
int krea2_text_rows(int real, int longest);

/* Sequences one forward runs together (classifier-free guidance: the prompt's and the negative prompt's). */
#define KREA2_MAX_BATCH 2

/* One sequence of a batched forward: its latents, text, positions, mask and where its velocity goes. */
typedef struct {
    const float *img;       /* [N, in_channels] f32 host latents, or NULL: img_m */
    dt_mat img_m;           /* [N, in_channels] F32 / act on the backend (the sampler's device path) */
    const float *txt;       /* [n_txt, text_layers, text_dim] f32 host */
    int n_txt;
    const float *pos;       /* [n_txt + N, n_axes] (t, h, w) positions, text rows first */
    const uint8_t *mask;    /* [n_txt] 1 = real token; NULL: every token */
    float *out;             /* [N, out_channels] f32 host, or NULL: out_m */
    dt_mat out_m;           /* [N, out_channels] on the backend (queued, not synchronized) */
} krea2_seq;

/* nb (1..KREA2_MAX_BATCH) sequences of N image tokens each through one forward at one timestep: every Linear runs
 * once on the rows of all of them (each weight read once), the modulation is shared, the attentions run per sequence
 * with its own key padding. Each text is compacted to its real tokens (a padded token is never computed: the image
 * rows do not depend on it), and texts of different lengths are padded to the longest with masked keys (zero features,
 * never attended to), so each sequence's velocity is its single forward's. Device outputs (out_m) are queued, host
 * ones downloaded and synchronized. First Block Cache (krea2_set_block_cache) needs nb = 1. 0 or -1. */
int krea2_forward_batch(krea2_model *m, const krea2_seq *seq, int nb, int n_img, float timestep);

/* ---- the pieces of the forward that the bench drives too (src/bench), op by op ---- */

/* Krea2Attention's weights (transformer and text-fusion blocks). */
typedef struct {
    dt_linear *q, *k, *v, *gate, *out;   /* q/gate/out [dim, dim], k/v [kv_heads*hd, dim] */
    dt_mat norm_q, norm_k;               /* [1, hd] F32, already 1 + w (head_norm_rope has no offset) */
    int heads, kv_heads, hd;
} krea2_attn_w;

/* Krea2SwiGLU's weights: gate, up [F, dim], down [dim, F]. */
typedef struct {
    dt_linear *gate, *up, *down;
} krea2_ff_w;

/* One transformer block (Krea2TransformerBlock). */
typedef struct {
    float *norm1, *norm2;                /* host [D]: 1 + w */
    float *table;                        /* host [6, D] scale_shift_table */
    krea2_attn_w attn;
    krea2_ff_w ff;
} krea2_block_w;

/* The Linears and norms around the blocks (embedders, timestep MLP, time_mod_proj, txt_in, final layer). */
typedef struct {
    dt_linear *img_in, *t_lin1, *t_lin2, *time_mod;   /* [D, in], [D, t_embed], [D, D], [6D, D] */
    dt_linear *txt_lin1, *txt_lin2, *final_lin;       /* [D, E], [D, D], [out, D] */
    dt_mat txt_norm;                                  /* [1, E] F32 raw zero-centred weights (rmsnorm w_offset 1) */
    float *final_norm;                                /* host [D]: 1 + w */
    float *final_table;                               /* host [2, D] */
} krea2_outer_w;

/* Load transformer block i / the outer weights into lin (lin->be set). 0 or -1 (dt_last_error names the tensor);
 * the *_free functions release what a load made (also after a failed one) except the Linears, which
 * dt_linear_set_free destroys. */
int krea2_block_w_load(dt_linear_set *lin, const dt_weights *w, const krea2_config *c, int i, krea2_block_w *out);
void krea2_block_w_free(dt_backend *be, krea2_block_w *b);
int krea2_outer_w_load(dt_linear_set *lin, const dt_weights *w, const krea2_config *c, krea2_outer_w *out);
void krea2_outer_w_free(dt_backend *be, krea2_outer_w *o);

/* The activations of one forward of nb sequences of (n image, t text tokens), L = t + n each. The joint stream holds
 * the sequences one after the other (sequence b: rows [b·L, (b+1)·L), its text rows first); the text fusion's streams
 * hold nb·t tokens (sequence b's tokens b·t .. b·t + t − 1). Flat buffers are [1, capacity], sized for both the text
 * fusion ([nb·t·text_layers, E] streams) and the joint stream; krea2_acts_block views them. */
typedef struct {
    int n, t, nb;
    dt_mat emb;        /* [1, t_embed] timestep sinusoid */
    dt_mat th;         /* [1, D] hidden of the timestep MLP */
    dt_mat temb;       /* [1, D] */
    dt_mat tg;         /* [1, D] GELU(temb) */
    dt_mat tmod;       /* [1, 6D] time_mod_proj output */
    dt_mat modw;       /* [2*layers + 1, D] F32: folded norm weights (norm1, norm2 per block, final) */
    dt_mat modv;       /* [4*layers + 1, D]: preshift, pregate, postshift, postgate per block, final shift */
    dt_mat in_img;     /* [nb*N, in] */
    dt_mat s;          /* [nb*L, D] joint stream, per sequence its text rows first */
    dt_mat ts;         /* flat >= T*Y*E: layerwise text stream */
    dt_mat tr;         /* flat >= T*E: refiner text stream */
    dt_mat a, q, k, v, g, o, h1, h2;   /* flat scratch (sizes in krea2_acts_alloc) */
    dt_mat outm;       /* [nb*N, out] (sequence b's rows b·N ..) */
    dt_mat cos, sin;   /* [nb*L, head_dim] F32 RoPE tables */
    int64_t key0[KREA2_MAX_BATCH];   /* each sequence's first unmasked row (its padding comes first; 0: none) */
    float *ids;        /* host copy of the positions the tables were built from [nb * L * n_axes] */
    float *host_mod;   /* host [(6 * layers + 9) * D]: tmod, temb, folded weights, shifts/gates */
} krea2_acts;
/* Allocate them for nb (1..KREA2_MAX_BATCH) sequences (x zeroed or freed); 0 or -1 with the backend's error.
 * krea2_acts_free frees what is allocated. */
int krea2_acts_alloc(dt_backend *be, const krea2_config *c, int n, int t, int nb, krea2_acts *x);
void krea2_acts_free(dt_backend *be, krea2_acts *x);
/* RoPE tables for positions pos [nb * L, n_axes] (the sequences' in order; rebuilt only when they change). */
void krea2_acts_positions(dt_backend *be, const krea2_config *c, krea2_acts *x, const float *pos);
/* The key padding from mask [nb * t] (the sequences' in order, 1 = real token; NULL = no mask) into key0: each
 * sequence's padded tokens must come first (krea2.c lays a shorter text out so), its real keys then being one run
 * of rows. 0, or -1 when a sequence's mask is not [padding | real] or marks no real token. */
int krea2_acts_mask(krea2_acts *x, const uint8_t *mask);
/* Timestep MLP and the modulation of every block and the final layer at `timestep`, folded on the host into
 * modw / modv (blk: the config's num_layers blocks). */
void krea2_time_mods(dt_backend *be, const krea2_config *c, const krea2_outer_w *o, const krea2_block_w *blk,
                     krea2_acts *x, float timestep);

/* What a transformer block works on: views of the activation set. */
typedef struct {
    dt_mat s;          /* [R, D] joint stream (updated in place); R = nb * L, sequence b at rows [b·L, (b+1)·L) */
    dt_mat a;          /* [R, D] modulated norm, then the attention / MLP output */
    dt_mat q, g, o;    /* [R, D] queries, gate projection, attention output */
    dt_mat k, v;       /* [R, kv_heads*hd] */
    dt_mat h1, h2;     /* [R, F] MLP gate and up projections */
    dt_mat cos, sin;   /* [R, hd] F32 RoPE tables */
    dt_mat modw, modv; /* the folded modulation (krea2_acts): rows 2l, 2l+1 and 4l..4l+3 belong to block l */
    const dt_linear *next;   /* the Linear after this block's last (the next block's to_q: its prefetch hint's
                              * target; NULL: none) */
    int nb;            /* sequences; the attention runs per sequence */
    int64_t L;         /* rows of each sequence */
    int64_t key0[KREA2_MAX_BATCH];   /* sequence b attends to its rows [key0[b], L) (before: padded text) */
} krea2_block_io;
krea2_block_io krea2_acts_block(const krea2_config *c, const krea2_acts *x);

/* The ops of a transformer block in order (the bench times cumulative prefixes of them). */
enum {
    KREA2_OP_NORM1 = 0, /* modulated norm: RMSNorm(s) * folded (1+w)(1+scale) + shift */
    KREA2_OP_QKVG,      /* to_q, to_k, to_v, to_gate GEMMs */
    KREA2_OP_QKNORM,    /* per-head RMSNorm of Q and K (+ RoPE unless split) */
    KREA2_OP_ROPE,      /* split only: the rotation as its own pass */
    KREA2_OP_ATTN,      /* attention, GQA over the sequence's real keys */
    KREA2_OP_GATE,      /* attn * sigmoid(gate) */
    KREA2_OP_OUT,       /* to_out GEMM */
    KREA2_OP_RESID1,    /* s += pregate * attn */
    KREA2_OP_NORM2,     /* second modulated norm */
    KREA2_OP_MLPIN,     /* ff.gate, ff.up GEMMs */
    KREA2_OP_SWIGLU,    /* silu(gate) * up */
    KREA2_OP_DOWN,      /* ff.down GEMM */
    KREA2_OP_RESID2,    /* s += postgate * mlp */
    KREA2_OP_COUNT
};
/* Op k of transformer block l (weights w) on io. split = 0: the model (QKNORM is the fused norm + RoPE pass,
 * ROPE nothing); split = 1: QKNORM normalizes only and ROPE rotates only (two passes, for the bench's timing). */
void krea2_block_op(dt_backend *be, const krea2_config *c, const krea2_block_w *w, const krea2_block_io *io, int l,
                    int k, int split);
/* Transformer block l as the model runs it: its ops in order. */
void krea2_block(dt_backend *be, const krea2_config *c, const krea2_block_w *w, const krea2_block_io *io, int l);

/* Geometry presets: "krea2" (the released model: Krea2Transformer2DModel defaults) and "krea2-tiny"
 * (tests/fixtures/krea2). 0 or -1 (dt_last_error names the presets). krea2_presets.c (the synthetic writers:
 * synth/synth_dit.h). */
int krea2_preset(const char *name, krea2_config *c);

#endif
