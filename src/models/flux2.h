/* flux2.h — the FLUX.2-klein transformer (diffusers Flux2Transformer2DModel), written against
 * the backend op interface. Geometry comes from config.json (or the quantized folder's config).
 * NOTES.md holds the model facts (residual layout, modulation order, RoPE axes) the code relies on.
 */
#ifndef DT_FLUX2_H
#define DT_FLUX2_H

#include "backends/backend.h"
#include "io/weights.h"
#include "models/linear_set.h"
#include "models/block_cache.h"
#include "models/lora.h"

typedef struct {
    int in_channels;        /* latent channels per token (128 for klein) */
    int out_channels;       /* = in_channels unless config says otherwise */
    int num_layers;         /* double-stream blocks */
    int num_single_layers;  /* single-stream blocks */
    int heads, head_dim;    /* attention heads x head dim; hidden D = heads*head_dim */
    int hidden;             /* D */
    int mlp_hidden;         /* F = D * mlp_ratio */
    int joint_dim;          /* text feature size (joint_attention_dim) */
    int tg_channels;        /* timestep sinusoid channels (256) */
    int n_axes;             /* RoPE axes (4) */
    int axes[8];            /* dims per axis, sum = head_dim */
    float rope_theta;
    float eps;
    int guidance_embeds;    /* must be 0 for klein */
    int attn_fp8;           /* run-time choice, not from config.json: the blocks' attention through the backend's
                             * attention_fp8 (flux2_runtime_choices sets it from the load options' attn_precision) */
    int fuse_inputs;        /* run-time choice (flux2_runtime_choices): the Linears fed by a norm or an activation go
                             * through norm_linear / act_linear_gated (fp8 Linears: no quantizing pass); 0 keeps the
                             * ops apart (the bf16 ledger times them one by one) */
} flux2_config;

/* The widest model accepted (heads x head_dim; klein-9B is 4096): far past any real checkpoint, small enough that
 * products of widths and token counts stay well inside 64 bits. */
#define FLUX2_MAX_HIDDEN 65536

/* Parse config.json; every missing/invalid field is an error naming `what` (the file). */
int flux2_config_parse(const json *cfg, const char *what, flux2_config *c);

typedef struct flux2_model flux2_model;

/* Observer of intermediate tensors (tests, debugging): called with names
 * "double.N.out0" (text stream), "double.N.out1" (image stream), "single.N", "norm_out". */
typedef void (*flux2_trace_fn)(void *ud, const char *name, dt_mat m);

/* Load from a transformer folder (config.json + safetensors), a quantized folder, or a pipeline
 * root holding transformer/. NULL on error (dt_last_error). */
flux2_model *flux2_load(dt_backend *be, const char *path);
/* Load options (flux2_load: none of them, i.e. bf16). */
typedef struct {
    const dt_lora_spec *loras;   /* LoRA adapters (models/lora.h), all applied; n_loras of them */
    int n_loras;
    int lora_side;               /* 1: side products for dense weights too instead of merging (comparisons) */
    dt_precision precision;      /* --precision: the blocks' Linears (fp8: e4m3; embedders, modulation, final stay
                                  * bf16), each Linear's dt_linear_src.precision */
    dt_precision attn_precision; /* --attn-precision: the blocks' attention (fp8: the backend's attention_fp8) */
    int fp8_unfused;             /* A/B arm of fp8 Linears (default 0): they quantize their input in a pass of their
                                  * own and a gated residual runs as linear + gated_add, instead of taking e4m3
                                  * activations from the producing norm / SwiGLU (dt_linear_src.fp8_unfused) */
} flux2_load_opts;
/* flux2_load with options (o may be NULL). With adapters the model runs through a LoRA backend wrapper of be
 * (models/lora_backend.h; freed with the model). */
flux2_model *flux2_load_ex(dt_backend *be, const char *path, const flux2_load_opts *o);
void flux2_free(flux2_model *m);
const flux2_config *flux2_get_config(const flux2_model *m);
/* Bytes of weights as stored, and a short description of the formats ("bf16", "q4 g64", ...). */
void flux2_weight_info(const flux2_model *m, size_t *bytes, char *fmt, size_t fmt_len);

/* CUDA-graph replay of the forward's device part for fixed shapes (on = 1; only where the backend
 * supports capture, else ignored). The first call at a shape runs eagerly, the second captures, later
 * ones replay. Traced calls always run eagerly. */
void flux2_set_graph(flux2_model *m, int on);
/* A cancellation flag (dt_cancel_requested) the forwards poll before each block, so that a cancelled request stops
 * within one block instead of one step: the forward then fails with "cancelled" (its output unset). A forward being
 * captured into a CUDA graph runs whole. NULL: none. */
void flux2_set_cancel(flux2_model *m, const volatile int *flag);

/* First Block Cache (models/block_cache.h) for the forwards that follow: f is the guidance branch's state (NULL:
 * every block runs). The head is the first block; its residual and the cached one are the image rows' (noise and
 * appended reference tokens). Those forwards run eagerly (the decision reads a device result mid-forward). */
void flux2_set_block_cache(flux2_model *m, dt_fbc_branch *f);

/* Keep text features on the device across forwards (the denoising loop passes the same prompt every step):
 * uploads txt [t, joint_dim] now; later flux2_forward calls with this same pointer and t copy it on the
 * device instead of transferring it from the host. The caller must not change the buffer's contents while
 * it is resident (call again to re-upload after a change). Two prompts can be resident (CFG's positive and
 * negative; the least recently used is replaced). txt = NULL releases them. 0 or -1 (dt_last_error). */
int flux2_text_resident(flux2_model *m, const float *txt, int t);
/* The same from a backend matrix src [t, joint_dim] (the text encoder's output, already on the device): copied into
 * a resident slot known by `key`, an address the caller then passes as txt to flux2_forward (never read there). */
int flux2_text_resident_mat(flux2_model *m, const void *key, dt_mat src);

/* ---- the activations of one (n image, t text token) forward, shared by flux2_forward and the bench ----
 * Rows of the [t+n, ...] buffers are the joint [text | image] sequence. */
typedef struct {
    dt_mat emb;       /* [1, tg]   timestep sinusoid */
    dt_mat temb;      /* [1, D] */
    dt_mat th;        /* [1, D]    hidden of the timestep MLP, then SiLU(temb) */
    dt_mat mod_img, mod_txt, mod_single, mod_out;   /* [1,6D] [1,6D] [1,3D] [1,2D] */
    dt_mat in_img;    /* [n, in] */
    dt_mat in_txt;    /* [t, joint] (t > 0) */
    dt_mat s;         /* [t+n, D]  joint residual stream */
    dt_mat a;         /* [t+n, D]  modulated-norm scratch */
    dt_mat y;         /* [t+n, D]  projection outputs */
    dt_mat qkv;       /* [t+n, 3D] double-block joint Q|K|V (q, k, v are column views of it) */
    dt_mat q, k, v, o;/* [t+n, D]  double-block joint attention views / output */
    dt_mat h;         /* [t+n, 2F] MLP hidden (double) */
    dt_mat g;         /* [t+n, F]  SwiGLU output (double) */
    dt_mat p;         /* [t+n, 3D+2F] single-block fused projection */
    dt_mat c;         /* [t+n, D+F]   single-block [attn | mlp] */
    dt_mat out;       /* [n, out] */
    dt_mat cos, sin;  /* [t+n, hd] F32 RoPE tables */
    dt_mat blocks;    /* the one allocation behind qkv/o/h/g and p/c (views; see flux2_acts_alloc) */
} flux2_acts;
/* Allocate them (the double-block buffers when with_double, the single-block ones when with_single); exits
 * with the backend's error when the device is out of memory. flux2_acts_free frees what is allocated.
 * The double-block buffers (qkv, o, h, g) and the single-block ones (p, c) are never live at once (the single
 * blocks start after the double blocks' queues have joined), so both sets are views of one allocation as large
 * as the bigger set: at 1024² with klein-4B's geometry that saves 368 MB. */
void flux2_acts_alloc(dt_backend *be, const flux2_config *c, int n, int t, int with_double, int with_single,
                      flux2_acts *x);
/* The same with kv_rows more rows behind qkv and p (their views keep t+n rows): the rows where a block's cached
 * reference K|V (flux2_double_io.kv_load) sit behind the live keys, so one attention sees both. */
void flux2_acts_alloc_kv(dt_backend *be, const flux2_config *c, int n, int t, int kv_rows, int with_double,
                         int with_single, flux2_acts *x);
void flux2_acts_free(dt_backend *be, flux2_acts *x);

/* Host-side inputs (shared with the bench): RoPE tables cos/sin [rows, head_dim] from position ids
 * [rows, n_axes] (pairs (2k, 2k+1) share an angle), and the timestep sinusoid [channels] of t (cos | sin). */
void flux2_rope_tables(const flux2_config *c, const float *ids, int rows, float *cos_out, float *sin_out);
void flux2_timestep_sinusoid(float t, int channels, float *out);

/* ---- the parts around the blocks (timestep MLP, modulation, embedders, final layer), shared with the bench ---- */
typedef struct {
    dt_linear *x_emb, *ctx_emb;                      /* [D, in], [D, joint] */
    dt_linear *t_lin1, *t_lin2;                      /* timestep MLP [D, tg], [D, D] */
    dt_linear *mod_img, *mod_txt, *mod_single;       /* [6D, D], [6D, D], [3D, D] */
    dt_linear *norm_out, *proj_out;                  /* [2D, D], [out, D] */
} flux2_outer_w;
typedef struct {
    dt_mat emb;                                      /* [1, tg] timestep sinusoid (input) */
    dt_mat temb, th;                                 /* [1, D] */
    dt_mat mod_img, mod_txt, mod_single, mod_out;    /* [1, 6D] [1, 6D] [1, 3D] [1, 2D] */
    dt_mat in_img, in_txt;                           /* [n, in], [t, joint] (inputs) */
    dt_mat s, a;                                     /* [t+n, D] joint stream and norm scratch */
    dt_mat out;                                      /* [n, out] */
} flux2_outer_io;
int flux2_outer_w_load(dt_linear_set *lin, const dt_weights *w, const flux2_config *c, flux2_outer_w *out);
/* Timestep MLP, the modulation vectors and the input projections into the joint stream. */
void flux2_pre(dt_backend *be, const flux2_outer_w *w, const flux2_outer_io *io, int n, int t);
/* Final modulated norm and proj_out of the image rows (trace, if set, observes "norm_out"). */
void flux2_final(dt_backend *be, const flux2_config *c, const flux2_outer_w *w, const flux2_outer_io *io, int n, int t,
                 void (*trace)(void *ud, const char *name, dt_mat m), void *ud);

/* ---- one double-stream block, shared by flux2_forward and the bench's device-only replica ---- */
typedef struct {
    dt_linear *to_qkv, *to_out;       /* image attention: to_q/to_k/to_v stacked [3D, D]; [D, D] */
    dt_linear *add_qkv, *to_add_out;  /* text attention: add_q/k/v_proj stacked [3D, D]; [D, D] */
    dt_linear *ff_in, *ff_out;        /* image MLP [2F, D], [D, F] */
    dt_linear *ffc_in, *ffc_out;      /* text MLP */
    dt_mat norm_q, norm_k, norm_aq, norm_ak;   /* [1, hd] F32 */
} flux2_double_w;

/* Load double block i's weights (Q/K/V stacked per stream) into lin. qkv_src / add_qkv_src (may be NULL) get
 * the stacked host sources. 0 or -1 (dt_last_error names the tensor); on error the caller frees what was made
 * (dt_linear_set_free and the norms' non-NULL data). */
int flux2_double_w_load(dt_linear_set *lin, const dt_weights *w, const flux2_config *c, int i, flux2_double_w *out,
                        dt_linear_src *qkv_src, dt_linear_src *add_qkv_src);

/* A replacement for a block's attention (the sequence-parallel forward, flux2_sp.c): o [rows, D] = attention of the
 * block's q, k, v [rows, D] (after the Q/K norm and RoPE; rows = the caller's [text | image] rows), issued on the
 * backend's main queue where the block's own attention would run. */
typedef void (*flux2_attn_hook)(void *ud, dt_mat o, dt_mat q, dt_mat k, dt_mat v);

/* The activations it works on; rows are the joint [text (t) | image (n)] sequence. */
typedef struct {
    dt_mat s;                   /* [t+n, D]  residual stream (updated in place) */
    dt_mat a, y;                /* [t+n, D]  modulated-norm and projection scratch */
    dt_mat qkv, q, k, v;        /* [t+n, 3D] joint Q|K|V; q, k, v its column views */
    dt_mat o;                   /* [t+n, D]  attention output */
    dt_mat h, g;                /* [t+n, 2F], [t+n, F] MLP hidden and SwiGLU output */
    dt_mat cos, sin;            /* [t+n, hd] F32 RoPE tables */
    dt_mat mod_img, mod_txt;    /* [1, 6D] modulation vectors */
    /* KV-cached references (both 0 / NULL data otherwise; see flux2_set_refs):
     * kv_load [kv_rows, 2D]: this block's cached reference K|V, copied behind the t+n rows of qkv's K|V columns
     * (allocated by flux2_acts_alloc_kv) before the attention, which then attends over t+n+kv_rows keys;
     * kv_store [t+n, 2D]: receives every row's K|V after norm + RoPE (the text-free reference-only pass). */
    int64_t kv_rows;
    dt_mat kv_load, kv_store;
    flux2_attn_hook attn;       /* NULL: the block's own attention (and kv_load/kv_store); else this is called instead */
    void *attn_ud;
} flux2_double_io;

/* Run double block w on io: the text stream on the backend's side queue (stream_switch) where it has one.
 * first: the side queue first waits for the main one (work before the first block); join: the main queue
 * waits for the side one at the end (before the single blocks or an observer reads the text rows).
 * next (may be NULL): the main queue's first Linear after this block, on next_rows tokens (a prefetch hint). */
void flux2_double_block(dt_backend *be, const flux2_config *c, const flux2_double_w *w, const flux2_double_io *io,
                        int n, int t, int first, int join, const dt_linear *next, int64_t next_rows);

/* ---- one single-stream block, shared by flux2_forward and the bench's replica ---- */
typedef struct {
    dt_linear *qkv_mlp;   /* [3D + 2F, D] fused Q|K|V|MLP-in projection */
    dt_linear *out;       /* [D, D + F] fused attention-out | MLP-out projection */
    dt_mat norm_q, norm_k;
} flux2_single_w;

typedef struct {
    dt_mat s;            /* [t+n, D]       residual stream (updated in place) */
    dt_mat a, y;         /* [t+n, D]       modulated norm; projection output (when not fused) */
    dt_mat p;            /* [t+n, 3D + 2F] fused projection output (q, k, v, MLP gate/up are column views) */
    dt_mat c;            /* [t+n, D + F]   [attention | SwiGLU] */
    dt_mat cos, sin;     /* [t+n, hd] F32 RoPE tables */
    dt_mat mod_single;   /* [1, 3D] modulation vector */
    int64_t kv_rows;     /* KV-cached references: as flux2_double_io (K|V are p's columns [D, 3D)) */
    dt_mat kv_load, kv_store;
    flux2_attn_hook attn;  /* as flux2_double_io */
    void *attn_ud;
} flux2_single_io;

/* The ops of a single block in order (the bench times cumulative prefixes of them). */
enum {
    FLUX2_SB_NORM = 0,  /* adaLN: layernorm_mod (with c->fuse_inputs: part of PROJ) */
    FLUX2_SB_PROJ,      /* fused projection GEMM [L, D] -> [L, 3D + 2F] */
    FLUX2_SB_QKNORM,    /* per-head RMSNorm of Q and K (+ RoPE unless split) */
    FLUX2_SB_ROPE,      /* split only: the rotation as its own pass */
    FLUX2_SB_ATTN,      /* attention */
    FLUX2_SB_ACT,       /* SwiGLU (with c->fuse_inputs: part of OUT) */
    FLUX2_SB_OUT,       /* output GEMM [L, D + F] -> [L, D] (+ the gated residual when the backend fuses it) */
    FLUX2_SB_RESID,     /* gated residual (when not fused) */
    FLUX2_SB_COUNT
};
/* Op k of single block w on io. split = 0: the model (QKNORM is the fused norm + RoPE pass, ROPE nothing);
 * split = 1: QKNORM normalizes only and ROPE rotates only (two passes, for the bench's timing). next (may be
 * NULL): the next block's projection, prefetched with this block's output projection after PROJ. */
void flux2_single_op(dt_backend *be, const flux2_config *c, const flux2_single_w *w, const flux2_single_io *io,
                     int k, int split, const dt_linear *next);
/* Load single block i's weights into lin; 0 or -1 (dt_last_error). */
int flux2_single_w_load(dt_linear_set *lin, const dt_weights *w, const flux2_config *c, int i, flux2_single_w *out);
/* The block's first Linear (a prefetch hint for whatever runs before it). */
static inline const dt_linear *flux2_single_first(const flux2_single_w *w) { return w->qkv_mlp; }
/* The config's run-time choices (flux2_load and the bench's replica, before loading the blocks): attn_fp8 from
 * o->attn_precision (-1 with an error naming `what` when the backend has no fp8 attention), and fuse_inputs when the
 * blocks' Linears run in fp8 (`linears`: o->precision, or an fp8 file) unless o->fp8_unfused. (A schedule that split
 * the single blocks' projection and ran the attention on the side queue beside the MLP half measured no faster:
 * PERF.md, stop 15.) */
int flux2_runtime_choices(const dt_backend *be, const flux2_load_opts *o, dt_precision linears, flux2_config *c,
                          const char *what);
/* Single block w as the model runs it: flux2_single_op's ops in order. next: as flux2_single_op. */
void flux2_single_block(dt_backend *be, const flux2_config *c, const flux2_single_w *w, const flux2_single_io *io,
                        const dt_linear *next);

/* The blocks' attention over `heads` heads of q, k, v (o, q [Lq, heads*hd], k, v [Lk, heads*hd]): the backend's attention,
 * or its fp8 attention with c->attn_fp8. */
void flux2_block_attention(dt_backend *be, const flux2_config *c, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int heads);

/* The loaded weights of a model (the split forward, flux2_sp.c, runs the blocks itself): the outer Linears and the
 * c->num_layers double / c->num_single_layers single blocks. */
void flux2_model_weights(const flux2_model *m, const flux2_outer_w **outer, const flux2_double_w **db,
                         const flux2_single_w **sb);
/* The backend the model's Linears run on: the one it was loaded on, or its LoRA wrapper (same memory and queues). */
dt_backend *flux2_model_backend(const flux2_model *m);

/* The block functions' views of an activation set. */
flux2_outer_io flux2_acts_outer(const flux2_acts *x);
flux2_double_io flux2_acts_double(const flux2_acts *x);
flux2_single_io flux2_acts_single(const flux2_acts *x);

/* One forward pass (with the references of flux2_set_refs, if any).
 *   img      [N, in_channels]   packed latent tokens (f32 host)
 *   txt      [T, joint_dim]     text features (f32 host)
 *   timestep sigma in [0,1] (the model multiplies by 1000)
 *   img_ids  [N, n_axes], txt_ids [T, n_axes] position ids (f32 host)
 *   out      [N, out_channels]  velocity (f32 host)
 * Returns 0 or -1 (dt_last_error). */
int flux2_forward(flux2_model *m, const float *img, int n_img, const float *txt, int n_txt, float timestep,
                  const float *img_ids, const float *txt_ids, float *out, flux2_trace_fn trace, void *trace_ud);

/* Classifier-free guidance's two passes in one forward (the guidance batch): sequence 0 (latents img0, text txt0,
 * velocity out0: the prompt's) and sequence 1 (img1, txt1, out1: the negative prompt's), both n image tokens, t text
 * tokens (txt0 / txt1 may be resident, flux2_text_resident), the same positions, timestep and appended references.
 * Every Linear runs once on both sequences' rows (each weight read once), the attention per sequence; each velocity
 * is its flux2_forward's (the keys summed in another order). Refused (-1) with First Block Cache or KV-cached
 * references: run two flux2_forward then. 0 or -1 (dt_last_error). */
int flux2_forward_pair(flux2_model *m, const float *img0, const float *img1, int n, const float *txt0,
                       const float *txt1, int t, float timestep, const float *img_ids, const float *txt_ids,
                       float *out0, float *out1);

/* ---- reference tokens (image editing) ----
 * Set the reference images' packed latent tokens for the forwards that follow (they stay on the device):
 *   tokens [r, in_channels] f32 host, ids [r, n_axes] position ids (T = 10 + 10k for reference k, row, col, 0).
 * kv_cached = 0 (Flux2KleinPipeline): the reference tokens follow the noise tokens in the image stream of every
 *   forward ([text | noise | reference]), with the step's modulation; only the noise rows are projected out.
 * kv_cached = 1 (Flux2KleinKVPipeline): the next forward first runs the references alone (timestep 0, attending
 *   only to themselves) and keeps each block's reference K|V after norm + RoPE; that forward and every later one
 *   run only text + noise tokens, whose attention also sees the cached K|V. The cached K|V depend only on the
 *   references and the weights, so CFG's passes share them.
 * tokens = NULL or r = 0 removes the references. The host arrays are copied; 0 or -1 (dt_last_error).
 * The device buffers (tokens, KV mode's cache and its pass's activations) stay allocated after removal: a later call
 * with the same token count and mode reuses them (no allocation, a captured CUDA graph stays valid). */
int flux2_set_refs(flux2_model *m, const float *tokens, const float *ids, int r, int kv_cached);

/* Geometry presets: "klein-4b", "klein-9b" (their published config.json geometry), "tiny" (the test fixture).
 * 0 ok, -1 unknown. flux2_presets.c (the synthetic writers: synth/synth_dit.h). */
int flux2_preset(const char *name, flux2_config *c);


/* Free the norm weights a double / single block's load uploaded (its Linears belong to the linear set and go with
 * dt_linear_set_free); also after a failed load. */
void flux2_double_w_free(dt_backend *be, flux2_double_w *w);
void flux2_single_w_free(dt_backend *be, flux2_single_w *w);
/* Upload the RoPE tables of x (cos/sin [rows, head_dim]) built from joint position ids [rows, n_axes]
 * (flux2_rope_tables). */
void flux2_acts_rope(dt_backend *be, const flux2_config *c, flux2_acts *x, const float *ids, int rows);

#endif
