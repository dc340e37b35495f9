/* qwen3.h — the Qwen3 text encoder (transformers Qwen3ForCausalLM, decoder only, no lm_head),
 * written against the backend op interface. Used by the FLUX.2-klein pipeline: the prompt
 * features are the concatenation of a few intermediate hidden states (layers 9, 18 and 27 for klein: NOTES.md).
 * Also the text model of Qwen3-VL (Qwen3VLModel's language_model, the Krea 2 text encoder): the same
 * layers; its multi-axis RoPE (mrope_section) is the plain RoPE below for text, whose three position
 * axes are equal (verified in NOTES.md); the vision tower is never loaded.
 *
 * Checkpoints: a text_encoder folder with config.json and safetensors shards. Keys are either
 * Hugging Face (`model.embed_tokens.weight`, `model.layers.N...`, `model.norm.weight`), mflux
 * (the same without the `model.` prefix) or Qwen3-VL (`language_model.` or `model.language_model.`
 * prefix, geometry in config.json's `text_config`). Linears and the embedding may be dense
 * (F32/F16/BF16) or MLX affine quantized (`.weight` U32 + `.scales` + `.biases`); norms are float.
 * When config.json is absent the geometry is inferred from tensor shapes (eps 1e-6, theta 1e6;
 * Qwen3-VL folders must have their config.json).
 */
#ifndef DT_QWEN3_H
#define DT_QWEN3_H

#include <stdint.h>

#include "backends/backend.h"

typedef struct {
    int hidden;          /* D = hidden_size */
    int num_layers;      /* num_hidden_layers of the checkpoint */
    int heads;           /* num_attention_heads (Hq) */
    int kv_heads;        /* num_key_value_heads (Hkv), Hq % Hkv == 0 */
    int head_dim;        /* hd (default D / Hq) */
    int intermediate;    /* MLP width I */
    int vocab;           /* embedding rows */
    float eps;           /* rms_norm_eps */
    double rope_theta;   /* rope_theta or rope_parameters.rope_theta */
} dt_qwen3_config;

typedef struct dt_qwen3 dt_qwen3;

/* Load from a text_encoder folder (or a single .safetensors file). Only decoder layers
 * 1..max_layer are loaded (max_layer <= 0: all); the final norm is loaded only when
 * max_layer == num_layers. NULL on error (dt_last_error names the file and tensor). */
dt_qwen3 *dt_qwen3_load(dt_backend *be, const char *dir, int max_layer);

/* Geometry only (config.json, or tensor shapes without it); loads no weights. 0 or -1. */
int dt_qwen3_read_config(const char *dir, dt_qwen3_config *cfg);

const dt_qwen3_config *dt_qwen3_get_config(const dt_qwen3 *m);
int dt_qwen3_loaded_layers(const dt_qwen3 *m);   /* max_layer after defaulting */

/* RoPE inverse frequencies rounded to bf16 (on = 1), as in a transformers model whose buffers were
 * cast with model.to(torch.bfloat16) -- the tests/fixtures reference was produced that way.
 * Default 0: f32 inv_freq, what from_pretrained keeps for any dtype (checked with transformers
 * 5.17: the buffer stays float32 and exact). At T = 512 the rotation angles of far positions
 * differ by up to about 1 rad between the two. */
void dt_qwen3_set_inv_freq_bf16(dt_qwen3 *m, int on);

/* Encode one sequence.
 *   ids   [T]  token ids (0 <= id < vocab)
 *   mask  [T]  1 = real token, 0 = padding (NULL = all real); padded keys are never attended;
 *              queries before the first real token (left padding) get a zero attention output,
 *              as transformers' default SDPA attention gives for fully masked rows
 *   taps  [n_taps] hidden-state indices (HF output_hidden_states): 0 = embeddings, k = output of
 *              decoder layer k (1-based); k == num_layers gets the final norm `model.norm`.
 *   out   [T, n_taps*D] f32 host: row t = [h_tap0[t] | h_tap1[t] | ...]
 * Positions are 0..T-1 regardless of padding. Returns 0 or -1 (dt_last_error). */
int dt_qwen3_encode(dt_qwen3 *m, const int32_t *ids, const int32_t *mask, int T, const int *taps, int n_taps,
                    float *out);

/* The same, into a backend matrix out [T, n_taps*D] (act dtype) that stays on the device (the DiT reads the
 * features from there: no download and upload between the two models). */
int dt_qwen3_encode_to(dt_qwen3 *m, const int32_t *ids, const int32_t *mask, int T, const int *taps, int n_taps,
                       dt_mat out);

/* dt_qwen3_encode with explicit RoPE positions pos [T] (>= 0; NULL = 0..T-1), e.g. positions that count only
 * real tokens when padding sits in the middle of the sequence (Krea 2). */
int dt_qwen3_encode_at(dt_qwen3 *m, const int32_t *ids, const int32_t *mask, const int32_t *pos, int T,
                       const int *taps, int n_taps, float *out);

void dt_qwen3_free(dt_qwen3 *m);

#endif
