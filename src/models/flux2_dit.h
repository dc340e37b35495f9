/* flux2_dit.h — the FLUX.2 transformer behind the DiT interface (models/dit.h): whole on one backend, or split over
 * ranks (sequence parallelism, models/flux2_sp.h). */
#ifndef DT_FLUX2_DIT_H
#define DT_FLUX2_DIT_H

#include "models/dit.h"
#include "models/flux2.h"

/* Load the transformer at path (as flux2_load_ex / flux2_sp_load). NULL on error (dt_last_error). */
dt_dit *flux2_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o);
const flux2_config *flux2_dit_config(const dt_dit *d);
/* The whole model (NULL when split). */
flux2_model *flux2_dit_whole(const dt_dit *d);
/* The weights' bytes and formats (whole), or "split over N ranks (comm)" (bytes 0). */
void flux2_dit_describe(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len);

#endif
