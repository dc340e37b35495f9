/* lora.h — LoRA adapters: low-rank updates ΔW = s · B · A of a model's Linears, read from the adapter files
 * users have and mapped onto the module names the model loaders ask for.
 *
 * Adapter files (safetensors), key layouts (see NOTES.md for the peers they come from):
 *   PEFT / diffusers   [transformer. | base_model.model. | diffusion_model.]MODULE.lora_A[.default].weight [r, in]
 *                      and .lora_B[.default].weight [out, r]; alpha from "lora_adapter_metadata" (lora_alpha,
 *                      alpha_pattern) in the file's metadata, or a MODULE.alpha tensor; none: alpha = r
 *   kohya / ai-toolkit lora_unet_MODULE_WITH_UNDERSCORES.lora_down.weight / .lora_up.weight / .alpha
 *                      (also lora_transformer_ and lycoris_ prefixes); MODULE.lora_down/lora_up with dots too
 * MODULE is any name the model's catalogue knows: its diffusers names, and for FLUX.2 the BFL names (fused
 * double_blocks.N.img_attn.qkv, single_blocks.N.linear1, ...). A catalogue entry maps an adapter module onto
 * row ranges of the model's modules ("pieces"): a fused qkv adapter updates to_q, to_k and to_v with its B's
 * thirds (one shared A), BFL's final modulation updates norm_out.linear with its B's halves swapped.
 *
 *   s = user scale × alpha / r,   ΔW[row0 + i, :] += s · Σ_k B[b_row0 + i, k] · A[k, :]
 *
 * Errors (one line naming the file): a tensor that matches no module of the model (the names listed), a
 * module with A but no B (or the reverse), rank or shape mismatches, DoRA / LoHa / LoKr / full-diff tensors. */
#ifndef DT_LORA_H
#define DT_LORA_H

#include <stdint.h>

#include "core/common.h"

/* One adapter as the user names it: FILE[:SCALE] (scale default 1). */
typedef struct {
    char path[4096];
    float scale;
} dt_lora_spec;
/* Parse "FILE[:SCALE]" (a trailing ":number" is the scale; a path may itself contain ':'). 0, or -1 with an
 * error for an empty or too long path or a non-finite scale. */
int dt_lora_spec_parse(const char *arg, dt_lora_spec *spec);

/* ---- the model's side: which adapter module names exist and what they update ---- */
typedef struct {
    const char *target;     /* the model's module (the name its loader asks for) */
    int64_t row0;           /* first row of target's weight this piece updates */
    int64_t b_row0, rows;   /* the adapter's B rows [b_row0, b_row0 + rows) */
} dt_lora_piece;

typedef struct dt_lora_catalogue dt_lora_catalogue;
dt_lora_catalogue *dt_lora_catalogue_new(void);
void dt_lora_catalogue_free(dt_lora_catalogue *c);
/* Adapter module NAME (dotted) updates the given pieces; B must have out rows, A in columns. Its underscore
 * spelling (kohya) is registered too. Adding a name twice keeps the first. */
void dt_lora_catalogue_add(dt_lora_catalogue *c, const char *name, int64_t out, int64_t in, int npieces,
                           const dt_lora_piece *pieces);
/* The common case: NAME updates all rows of the module of the same name. */
void dt_lora_catalogue_add_module(dt_lora_catalogue *c, const char *name, int64_t out, int64_t in);

/* Every Linear weight of w (each 2-D NAME.weight that resolves as a Linear) as a module of its own name: the
 * catalogue of a model whose loaders ask for the checkpoint's own names (Krea 2). */
struct dt_weights;
dt_lora_catalogue *dt_lora_catalogue_from_weights(const struct dt_weights *w);

/* ---- loaded adapters ---- */
typedef struct {
    int64_t row0, rows;     /* rows of the target module's weight */
    int64_t rank, in;
    float scale;            /* user scale × alpha / rank */
    const float *A;         /* [rank, in] */
    const float *B;         /* [rows, rank] (row stride rank) */
    int a_id;               /* updates with the same a_id share A (one adapter module's pieces) */
    const char *file;       /* the adapter file (for messages) */
} dt_lora_update;

typedef struct dt_lora_set dt_lora_set;
/* Read the adapter files and map every tensor through the catalogue. NULL on error (dt_last_error). */
dt_lora_set *dt_lora_load(const dt_lora_spec *specs, int n, const dt_lora_catalogue *cat);
void dt_lora_free(dt_lora_set *s);
/* The updates of module TARGET (NULL / 0 when none); marks them used. */
const dt_lora_update *dt_lora_updates(dt_lora_set *s, const char *target, int *n);
/* Updates no loader asked for: 0, or -1 with an error naming the first module. */
int dt_lora_check_used(const dt_lora_set *s);
/* Files, adapter modules and updated model modules, for messages. */
void dt_lora_summary(const dt_lora_set *s, int *files, int *modules, int *targets);

/* ---- applying them ---- */
/* One update placed at row `offset` of a (possibly stacked) Linear. */
typedef struct {
    const dt_lora_update *u;
    int64_t offset;
} dt_lora_placed;
/* w [nrows, in] f32 holds rows [r0, r0 + nrows) of a Linear: add s·B·A of every placed update (rows outside
 * [r0, r0 + nrows) skipped). */
void dt_lora_merge(const dt_lora_placed *p, int n, int64_t r0, int64_t nrows, int64_t in, float *w);
/* The side product of the placed updates for rows [r0, r0 + nrows) of a Linear with `in` inputs, as one low-rank
 * pair: A [R, in] (the distinct A's stacked) and B [nrows, R] (each update's s·B in its rows and its A's columns,
 * zeros elsewhere), malloc'd. Returns R (0: nothing to add, *A = *B = NULL). */
int64_t dt_lora_side(const dt_lora_placed *p, int n, int64_t r0, int64_t nrows, int64_t in, float **A, float **B);

#endif
