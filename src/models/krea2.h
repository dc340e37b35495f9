/* krea2.h — the Krea 2 transformer (diffusers Krea2Transformer2DModel), written against the
 * backend op interface: text fusion over tapped text-encoder layers, a single-stream DiT with
 * grouped-query gated attention, SwiGLU MLPs and zero-centred RMSNorm. Geometry comes from
 * config.json. See ../shared/spec section 4 and docs/krea2-notes.md.
 */
#ifndef DT_KREA2_H
#define DT_KREA2_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "io/weights.h"

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
} krea2_config;

/* Parse config.json; a missing/invalid field is an error naming `what` (the file) and the field. */
int krea2_config_parse(const json *cfg, const char *what, krea2_config *c);

typedef struct krea2_model krea2_model;

/* Observer of intermediate tensors (tests, debugging): "block.N" = joint [text, image] stream
 * [T+N, D] after transformer block N. The matrix is only valid during the call. */
typedef void (*krea2_trace_fn)(void *ud, const char *name, dt_mat m);

/* Load from a transformer folder (config.json + safetensors, dense or MLX-quantized Linears) or a
 * pipeline root holding transformer/. NULL on error (dt_last_error names file and tensor). */
krea2_model *krea2_load(dt_backend *be, const char *path);
void krea2_free(krea2_model *m);
const krea2_config *krea2_get_config(const krea2_model *m);
/* Bytes of weights as stored, and a short description of the formats ("bf16", "bf16+q4 g64", ...). */
void krea2_weight_info(const krea2_model *m, size_t *bytes, char *fmt, size_t fmt_len);

/* One forward pass.
 *   img       [N, in_channels]               packed latent tokens (f32 host)
 *   txt       [T, text_layers, text_dim]     stacked tapped text-encoder hidden states (f32 host)
 *   timestep  flow time in [0, 1] (the model multiplies by 1000)
 *   pos_ids   [T+N, n_axes]                  (t, h, w) RoPE coordinates, text rows first (f32 host)
 *   txt_mask  [T] 1 = real token, 0 = padding; NULL = every token valid
 *   out       [N, out_channels]              velocity (f32 host)
 *   trace     optional observer (NULL = none)
 * Returns 0 or -1 (dt_last_error). */
int krea2_forward(krea2_model *m, const float *img, int n_img, const float *txt, int n_txt, float timestep,
                  const float *pos_ids, const uint8_t *txt_mask, float *out, krea2_trace_fn trace, void *trace_ud);

/* Geometry presets: "krea2" (the released model: Krea2Transformer2DModel defaults) and "krea2-tiny"
 * (tests/fixtures/krea2). 0 or -1 (dt_last_error names the presets). krea2_synth.c. */
int krea2_preset(const char *name, krea2_config *c);
/* Write DIR/config.json and DIR/model.safetensors with random weights at geometry c: bits 0 = bf16,
 * 4/8 = MLX affine quantized Linears with `group` (Linears whose input width is not a multiple stay
 * bf16). Creates DIR. 0 or -1 (dt_last_error). */
int krea2_synth_write(const krea2_config *c, const char *dir, int bits, int group, uint64_t seed);

/* Random forward inputs for a grid_h x grid_w latent and t text tokens (krea2_forward's layouts):
 * img [N, in_channels] and txt [t, text_layers, text_dim] uniform in [-1, 1), pos [t+N, n_axes] as the
 * pipeline builds them (text rows zero, image rows (0, row, col)), mask [t] (NULL = none) from
 * krea2_synth_mask: the pipeline's [prompt | padding | 5 suffix tokens] layout. */
void krea2_synth_inputs(const krea2_config *c, int grid_h, int grid_w, int t, uint64_t seed, float *img, float *txt,
                        float *pos, uint8_t *mask);
void krea2_synth_mask(int t, uint8_t *mask);

#endif
