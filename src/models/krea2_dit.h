/* krea2_dit.h — the Krea 2 transformer behind the DiT interface (models/dit.h). */
#ifndef DT_KREA2_DIT_H
#define DT_KREA2_DIT_H

#include "models/dit.h"
#include "models/krea2.h"

/* Load the transformer at path (as krea2_load_ex; it has no split forward: ranks > 1 is refused). NULL on error. */
dt_dit *krea2_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o);
const krea2_config *krea2_dit_config(const dt_dit *d);
krea2_model *krea2_dit_model(const dt_dit *d);

#endif
