/* weights.h — a model component's tensors as users have them on disk.
 *
 * dt_weights_open(PATH) accepts:
 *   - a single .safetensors or .gguf file (GGUF: io/gguf.h, tensors with their row-major shapes);
 *   - a folder with one or more *.safetensors files (diffusers `transformer/`, mflux shards
 *     `0.safetensors, 1.safetensors, ...`; or, when it has none, *.gguf files), using `*.safetensors.index.json` when present
 *     (every file named in its weight_map must exist; every listed tensor must be found there);
 *   - for a pipeline root, callers pass ROOT/transformer themselves (see dt_weights_component_dir).
 * config.json in the folder (if any) is parsed and kept (dt_weights_config).
 *
 * Linear weights come in these forms, resolved by dt_weights_linear():
 *   dense     NAME.weight  F32/F16/BF16 [out, in]
 *   affine    NAME.weight  U32 [out, in*bits/32] + NAME.scales + NAME.biases [out, in/group]
 *             (MLX groupwise affine; bits 4 or 8; group inferred from shapes; w = scale*q + bias)
 *   fp8       NAME.weight  F8_E4M3/F8_E5M2 [out, in], w = value(code) · scale with the scale from
 *             NAME.weight_scale or NAME.scale_weight (ComfyUI's spelling): one value (per tensor) or [out]
 *             (per output channel); none: 1. NAME.input_scale / NAME.scale_input, the file's static activation
 *             scale, is read for reports only (activations are scaled per token at run time)
 *   blocks    NAME.weight  a GGUF block type Q4_0..Q6_K [out, in] (quant/ggml_quants.h)
 *   plus an optional NAME.bias [out] (float).
 */
#ifndef DT_WEIGHTS_H
#define DT_WEIGHTS_H

#include "../core/linear_src.h"
#include "json.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {   /* (the CUDA backend reads Linear sources through these) */
#endif

typedef struct dt_weights dt_weights;

/* (A Linear's host description, dt_linear_src, is core/linear_src.h's: the backends take it without this reader.) */
dt_weights *dt_weights_open(const char *path);
void dt_weights_close(dt_weights *w);
const char *dt_weights_path(const dt_weights *w);
const json *dt_weights_config(const dt_weights *w);   /* config.json object or NULL */
/* A model folder's config.json that must be present and, when it names a _class_name, name `cls`; `what` gets
 * "DIR/config.json" for the caller's later messages, `family` names the model in the missing-file one. NULL with the
 * error set otherwise. */
const json *dt_weights_class_config(const dt_weights *w, const char *dir, const char *cls, const char *family,
                                    char *what, size_t what_len);
size_t dt_weights_count(const dt_weights *w);
const st_tensor *dt_weights_at(const dt_weights *w, size_t i);
const st_tensor *dt_weights_find(const dt_weights *w, const char *name);  /* NULL if absent */
/* safetensors (or GGUF) metadata value from the first file that has it, or NULL */
const char *dt_weights_metadata(const dt_weights *w, const char *key);
/* The container format of the files: "safetensors", "GGUF v3", ... (both when mixed). */
const char *dt_weights_container(const dt_weights *w);

/* Tensor that must exist with exactly the given shape (ndim entries). Error names file+tensor. */
const st_tensor *dt_weights_get(const dt_weights *w, const char *name, int ndim, const int64_t *shape);
/* Load a float tensor (any float dtype) of `n` elements as f32 into dst, checking numel == n. */
int dt_weights_read_f32(const dt_weights *w, const char *name, float *dst, int64_t n);

/* Resolve a Linear named NAME with expected [out, in]; `in`/`out` <= 0 means "take from file".
 * Validates dtype, shapes, bits (4/8), group size (must divide in, 32 | in*bits for packing,
 * scales/biases shapes equal). want_bias: 0 = ignore, 1 = required, -1 = optional. */
int dt_weights_linear(const dt_weights *w, const char *name, int64_t out, int64_t in, int want_bias,
                      dt_linear_src *src);

/* Find a component folder: if PATH/NAME/ exists return it (malloc'd), else if PATH itself
 * holds safetensors return a copy of PATH, else NULL with an error. */
char *dt_weights_component_dir(const char *path, const char *name);

/* ---- derived tensors: other key layouts (BFL, mflux) presented under the names loaders ask for.
 * They are found by dt_weights_find / _get / _linear / _read_f32 like stored tensors, but are not
 * counted by dt_weights_count / dt_weights_at (which list what is stored, once). Owned by w. ---- */
/* NAME = rows [row0, row0+nrows) of SRC along dimension 0 (zero copy: a view into SRC's bytes).
 * NULL with an error if NAME already exists or the rows are outside SRC. */
const st_tensor *dt_weights_add_view(dt_weights *w, const char *name, const st_tensor *src, int64_t row0, int64_t nrows);
/* NAME = SRC itself under another name (any shape, scalars included; zero copy). */
const st_tensor *dt_weights_add_alias(dt_weights *w, const char *name, const st_tensor *src);
/* NAME = the given row ranges of SRC, concatenated in that order into a buffer owned by w (a copy:
 * for small reorderings such as the swapped halves of BFL's final modulation). */
const st_tensor *dt_weights_add_rows(dt_weights *w, const char *name, const st_tensor *src, int nranges,
                                     const int64_t *row0, const int64_t *nrows);
size_t dt_weights_derived_count(const dt_weights *w);
const st_tensor *dt_weights_derived_at(const dt_weights *w, size_t i);
/* Replace the config (w takes ownership; NULL clears): e.g. geometry inferred from tensor shapes. */
void dt_weights_set_config(dt_weights *w, json *cfg);

/* Give back the resident memory of a stored tensor's mapped bytes once a streaming pass is done with it
 * (st_release_pages; the tensor stays readable). No-op for aligned copies and derived copies. */
void dt_weights_release(const dt_weights *w, const st_tensor *t);

/* (Its rows as f32 values, whatever the form: dt_linear_src_rows_f32, quant/dequant.h.) */

#ifdef __cplusplus
}
#endif
#endif
