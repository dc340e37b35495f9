/* flux2_lora.h — the LoRA catalogue of a FLUX.2 checkpoint (flux2_lora.c): which adapter module names map to which
 * rows of which of its Linears. */
#ifndef DT_FLUX2_LORA_H
#define DT_FLUX2_LORA_H

#include "models/flux2.h"
#include "models/lora.h"

/* The catalogue of w (after flux2_layout_install): its diffusers module names and the BFL, mflux and FLUX.1-style
 * split names, with the rows they update. */
dt_lora_catalogue *flux2_lora_catalogue(const dt_weights *w, const flux2_config *c);

#endif
