/* flux2_dit.h — the FLUX.2 transformer behind the DiT interface (models/dit.h): whole on one backend, or split over
 * ranks (sequence parallelism, models/flux2_sp.h). */
#ifndef DT_FLUX2_DIT_H
#define DT_FLUX2_DIT_H

#include <stdio.h>

#include "models/dit.h"
#include "models/flux2.h"

/* Load the transformer at path (as flux2_load_ex / flux2_sp_load). NULL on error (dt_last_error). */
dt_dit *flux2_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o);
const flux2_config *flux2_dit_config(const dt_dit *d);
/* The whole model (NULL when split). */
flux2_model *flux2_dit_whole(const dt_dit *d);

/* `ditrun forward`'s inputs (dit.h): the common ones, in.img_ids [1, N, axes], in.txt_ids [1, T, axes], and
 * optionally in.ref_hidden_states [1, R, C] with in.ref_ids [1, R, axes] (set on d, KV-cached with kv_refs). */
int flux2_dit_read_inputs(const st_file *in, dt_dit *d, int kv_refs, int no_mask, dt_dit_inputs *fi);
/* `ditrun info`: the geometry, RoPE and parameter-count lines of a FLUX.2 transformer config. 0 or -1 (invalid). */
int flux2_config_describe(const json *cfg, FILE *f);
/* The geometry of a model folder (pipeline root or transformer folder): its transformer config.json, refused when
 * it names another class. 0 or -1. */
int flux2_config_read(const char *model, flux2_config *c);
/* A config without _class_name that is FLUX.2's (quantized folders drop it): its own keys. */
int flux2_config_is_flux2(const json *cfg);

#endif
