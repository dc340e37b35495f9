/* krea2_dit.h — the Krea 2 transformer behind the DiT interface (models/dit.h). */
#ifndef DT_KREA2_DIT_H
#define DT_KREA2_DIT_H

#include <stdio.h>

#include "models/dit.h"
#include "models/krea2.h"

/* Load the transformer at path (as krea2_load_ex; it has no split forward: ranks > 1 is refused). NULL on error. */
dt_dit *krea2_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o);
const krea2_config *krea2_dit_config(const dt_dit *d);
krea2_model *krea2_dit_model(const dt_dit *d);

/* `ditrun forward`'s inputs (dit.h): the common ones with in.encoder_hidden_states [1, T, layers, dim],
 * in.position_ids [T+N, axes] and, unless no_mask, in.encoder_attention_mask [1, T]. No references. */
int krea2_dit_read_inputs(const st_file *in, dt_dit *d, int kv_refs, int no_mask, dt_dit_inputs *fi);
/* `ditrun info`: the geometry line of a Krea 2 transformer config. 0 or -1 (invalid). */
int krea2_config_describe(const json *cfg, FILE *f);

#endif
