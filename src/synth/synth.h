/* synth.h — synthetic checkpoints: a list of named tensors with random contents written as
 * safetensors, streamed tensor by tensor. Linears can be written dense (bf16/f32) or as MLX affine
 * quantized (random codes; scale/bias chosen so w is uniform in about [-a, a]). Used by the FLUX.2,
 * Qwen3 and VAE synthetic writers (tests, bench and speed runs at real geometry without weights). */
#ifndef DT_SYNTH_H
#define DT_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"
#include "core/outfile.h"

typedef struct {
    char *name;          /* full tensor name (for Linears: NAME.weight; quantized adds .scales/.biases) */
    int ndim;
    int64_t shape[5];    /* up to 5 dims (3-D conv kernels) */
    int quantizable;     /* a Linear weight [out, in] that may be written quantized */
    float center, amp;   /* values uniform in [center - amp, center + amp] */
} synth_tensor;

typedef struct {
    synth_tensor *t;
    int n, cap;
} synth_list;

/* Linear NAME [out, in] with variance 1/in (and NAME.bias [out] when bias). */
void synth_add_linear(synth_list *l, const char *name, int64_t out, int64_t in, int bias);
/* A float tensor of any shape, uniform in [center - amp, center + amp]. */
void synth_add(synth_list *l, const char *name, int ndim, const int64_t *shape, float center, float amp);
void synth_list_free(synth_list *l);

/* Write the list to path. bits 0 = dense in `dense` dtype (BF16 or F32); 4/8 = quantizable Linears as
 * MLX affine with `group` (others dense). Returns 0 or -1 (dt_last_error). */
int synth_write(const synth_list *l, const char *path, int bits, int group, dt_dtype dense, uint64_t seed);
/* Write a small text file (configs). */
int synth_write_text(const char *path, const char *text);
/* Write the list to DIR/model.safetensors (dense tensors bf16; bits/group as synth_write) and free it. */
int synth_write_model(synth_list *l, const char *dir, int bits, int group, uint64_t seed);

/* Create the folder DIR (one level; an existing one is fine). 0 or -1 (dt_last_error). */
int synth_mkdir(const char *dir);
/* dst = the config.json entry naming how the Linears are quantized (",\n  \"quantization\": {...}"), or "" for
 * bits 0: a config names the group size its weights were written with. */
void synth_quantization_entry(char *dst, size_t n, int bits, int group);
/* A transformer's config.json: begin opens DIR/config.json (a temporary renamed into place when complete) and
 * writes the keys every DiT config starts with (_class_name, attention_head_dim, axes_dims_rope), leaving the
 * caller to print its own keys, each after ",\n"; end adds the quantization entry (bits > 0) and the closing
 * brace and commits. begin: NULL on error; end: 0 or -1 (dt_last_error). */
dt_outfile *synth_config_begin(const char *dir, const char *class_name, int head_dim, const int *axes, int n_axes);
int synth_config_end(dt_outfile *of, int bits, int group);

#endif
