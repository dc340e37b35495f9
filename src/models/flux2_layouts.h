/* flux2_layouts.h — FLUX.2 transformer checkpoints in the key layouts users have, presented to the
 * loader under diffusers names (the rules below):
 *   diffusers  x_embedder, transformer_blocks.N.attn.to_q, ... (the loader's own names)
 *   BFL        img_in, double_blocks.N.img_attn.qkv (fused q|k|v rows), single_blocks.N.linear1,
 *              final_layer.adaLN_modulation.1 (shift|scale, i.e. halves swapped vs diffusers), ...
 *              optionally under a "model.diffusion_model." prefix (ComfyUI single files)
 *   mflux      diffusers names except double-block attn.to_out (no .0) and time_guidance_embed.linear_1/2
 * flux2_layout_install() registers derived tensors in the dt_weights (zero-copy row views; only the
 * final modulation's swapped halves are copied) and, when there is no config.json, infers the geometry
 * from tensor shapes. Dense and MLX-quantized (.weight U32 + .scales + .biases) tensors both work.
 */
#ifndef DT_FLUX2_LAYOUTS_H
#define DT_FLUX2_LAYOUTS_H

#include "flux2.h"

typedef enum {
    FLUX2_LAYOUT_UNKNOWN = 0,   /* not a FLUX.2 transformer (or no recognisable key) */
    FLUX2_LAYOUT_DIFFUSERS,
    FLUX2_LAYOUT_BFL,
    FLUX2_LAYOUT_MFLUX,
} flux2_layout;

flux2_layout flux2_layout_detect(const dt_weights *w);
const char *flux2_layout_name(flux2_layout l);      /* "diffusers", "BFL", "mflux", "unknown" */

/* How one stored tensor appears under diffusers names. part: FLUX2_PART_WHOLE (same rows),
 * 0..2 (a third of the rows: q, k, v of a fused qkv), FLUX2_PART_SWAP (row halves swapped). */
enum { FLUX2_PART_WHOLE = -1, FLUX2_PART_SWAP = 3 };
typedef struct {
    char name[256];
    int part;
} flux2_key_map;
/* Fills out[] (up to 3 entries) with the diffusers name(s) of stored tensor NAME in layout L and
 * returns how many; 0 when the name has no diffusers counterpart in that layout (or is already one). */
int flux2_map_key(flux2_layout l, const char *name, flux2_key_map out[3]);

/* Detect the layout of w and register the diffusers-named tensors it lacks; when w has no config,
 * infer one from the shapes (dt_weights_set_config; "_ditrun_inferred": true). 0 ok; -1 with an error
 * naming the file when a mapped tensor has an impossible shape or no config can be inferred. */
int flux2_layout_install(dt_weights *w);

/* Geometry from diffusers-named tensors (after install): D and in_channels from x_embedder, head_dim
 * from a norm_q, heads = D / head_dim, block counts by scanning names, joint_dim from context_embedder,
 * F from ff.linear_in (rows / 2) or the single blocks' fused projection, tg_channels from linear_1;
 * RoPE axes 4 x head_dim/4, theta 2000, eps 1e-6. 0 ok, -1 with an error. */
int flux2_layout_infer_config(const dt_weights *w, flux2_config *c);

/* config.json text (diffusers Flux2Transformer2DModel) for c, malloc'd; bits > 0 adds a
 * "quantization": {"group_size", "bits"} entry. */
char *flux2_config_json(const flux2_config *c, int bits, int group);

/* Diffusers base names of every parameter of the geometry c, in the canonical order of the diffusers
 * state dict; is_norm[i] = 1 for the [head_dim] RMSNorm weights, 0 for Linears. Returns the count;
 * free with flux2_names_free. */
int flux2_diffusers_names(const flux2_config *c, char ***names, int **is_norm);
void flux2_names_free(char **names, int *is_norm, int n);

/* Write the FLUX.2 transformer at INPUT (any layout: file, folder, shards, pipeline root) with diffusers
 * key names: OUTPUT ending in .safetensors is that file (+ config.json beside it); otherwise OUTPUT is a
 * folder that receives config.json + diffusion_pytorch_model.safetensors. Tensors are streamed (fused
 * qkv split by row views, final modulation halves swapped); quantized tensors stay quantized.
 * Stored tensors with no diffusers counterpart are skipped and counted in *skipped. 0 ok, -1 error. */
int flux2_convert_to_diffusers(const char *input, const char *output, int *written, int *skipped);

#endif
