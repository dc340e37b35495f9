/* linear_set.h — the Linears of one model: resolved from a checkpoint (dense, MLX affine, fp8, GGUF blocks),
 * prepared by the backend, kept in one list for cleanup, with a short description of the weight
 * formats seen ("bf16", "q4 g64", "bf16+q4 g32", "q4 g64+fp8", "bf16+e4m3", "bf16+Q4_K", ...; "+fp8" when some run
 * in fp8, "+lora" when adapters apply). Shared by every model loader and the bench.
 *
 * LoRA adapters (lora set): each Linear loaded by name takes the updates of its module (models/lora.h), rows of
 * stacked and sliced Linears included: dense weights are merged into a copy (W + s·B·A, rounded once to the
 * file's dtype), other forms keep their weights and get the low-rank side product (models/lora_backend.h: be
 * must then be the LoRA backend wrapper). */
#ifndef DT_LINEAR_SET_H
#define DT_LINEAR_SET_H

#include "backends/backend.h"
#include "io/weights.h"
#include "models/lora.h"
#include "quant/dequant.h"

typedef struct {
    dt_backend *be;
    dt_linear **all;
    int n;
    char fmt[96];
    void **owned;      /* host buffers of stacked / converted Linears */
    int nowned;
    int dense_f32;     /* 1: dense bf16/f16 weights are converted to f32 host copies first (the bench's f32 format) */
    dt_precision precision;   /* applied to Linears added from now on (models: their DiT blocks' Linears) */
    int fp8_unfused;          /* applied to Linears added from now on: dt_linear_src.fp8_unfused (the A/B arm) */
    struct dt_lora_set *lora; /* adapters for the Linears loaded from now on (NULL: none) */
    int lora_side;            /* 1: side products for dense weights too, instead of merging (tests, comparisons) */
    int lora_merged, lora_sides;   /* Linears that took an update, by how */
    dt_linear_paths paths;    /* how many of each format take each path (the -v summary) */
} dt_linear_set;

/* Resolve NAME ([out, in]; <= 0 = from the file; want_bias as dt_weights_linear) and prepare it.
 * NULL on error (dt_last_error names the file and tensor). */
dt_linear *dt_linear_set_load(dt_linear_set *s, const dt_weights *w, const char *name, int64_t out, int64_t in,
                              int want_bias);
/* Prepare an already resolved Linear (no adapters). NULL on error. */
dt_linear *dt_linear_set_add(dt_linear_set *s, const dt_linear_src *src);
/* One Linear out of n Linears with the same input, stacked along the output ([n * out, in]; e.g. the
 * separate to_q / to_k / to_v of a checkpoint as one QKV projection). Sources of one format are stacked as
 * they are (packed 4/8-bit rows stay packed); mixed formats are dequantized to f32 first. The stacked host
 * copy lives until dt_linear_set_free (backends may keep pointers into it). NULL on error. */
dt_linear *dt_linear_set_load_stacked(dt_linear_set *s, const dt_weights *w, const char *const *names, int n,
                                      int64_t out, int64_t in, dt_linear_src *stacked);
/* (stacked, when not NULL, receives the stacked host source; valid until dt_linear_set_free) */
/* Adapters for the Linears loaded from now on: the files of specs[n] read through cat (the checkpoint's module
 * names; freed here), the set's backend and *be replaced by the LoRA backend wrapper (which adds the side products
 * of the Linears that are not merged), side as lora_side. *lora receives the adapter set (the model frees it, and
 * the wrapper). 0 or -1 (dt_last_error; *lora may then be set). */
int dt_linear_set_use_loras(dt_linear_set *s, dt_backend **be, dt_lora_set **lora, const dt_lora_spec *specs, int n,
                            int side, dt_lora_catalogue *cat);
/* With the backend's opts.verbose: the -v summary of the set's Linears (dt_linear_paths_log), one line per stored
 * format and path; `what` names the component ("transformer"). */
void dt_linear_set_log(const dt_linear_set *s, const char *what);
/* Destroy every Linear of the set (s->be must be set) and reset it. */
void dt_linear_set_free(dt_linear_set *s);

#endif
