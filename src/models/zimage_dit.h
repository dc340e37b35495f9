/* zimage_dit.h — the Z-Image transformer behind the DiT interface (models/dit.h). */
#ifndef DT_ZIMAGE_DIT_H
#define DT_ZIMAGE_DIT_H

#include <stdio.h>

#include "models/dit.h"
#include "models/zimage.h"

/* Load the transformer at path (folder or pipeline root; with o's LoRA adapters; a split forward or CUDA graph replay
 * is refused). NULL on error. */
dt_dit *zimage_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o);
const zimage_config *zimage_dit_config(const dt_dit *d);
zimage_model *zimage_dit_model(const dt_dit *d);

/* `ditrun forward`'s inputs (dit.h): the common ones — in.hidden_states [1, N, p²·C] image tokens
 * (zimage_patchify's order), in.encoder_hidden_states [1, T, cap_dim] (the caption's real tokens), in.timestep
 * (the model's t = 1 − sigma) — and in.grid [2] (grid_h, grid_w; grid_h · grid_w = N). No references, no mask. */
int zimage_dit_read_inputs(const st_file *in, dt_dit *d, int kv_refs, int no_mask, dt_dit_inputs *fi);

#endif
