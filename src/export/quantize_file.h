/* quantize_file.h — write a checkpoint as one MLX affine quantized .safetensors file (`ditrun quantize`).
 *
 * Every 2-D float `NAME.weight` whose input width is a multiple of the group (and that no --keep pattern
 * matches) becomes NAME.weight U32 [out, in*bits/32] + NAME.scales + NAME.biases BF16 [out, in/group]
 * (MLX's rule: 2-D Linear weights whose input size the group divides); every other tensor (norms, biases,
 * 1-D and conv weights, already-packed weights) is copied unchanged.
 * Metadata: quantization = {"group_size":G,"bits":B,"mode":"affine"}, format = mlx.
 * Streaming: tensors are read one at a time from the mapped input in blocks of rows and written with
 * st_stream; the input pages are released after each tensor, so memory stays near one tensor's
 * scales + a block of f32 rows whatever the checkpoint size. When the input folder has config.json, a
 * copy with a "quantization" entry is written beside the output.
 */
#ifndef DT_QUANTIZE_FILE_H
#define DT_QUANTIZE_FILE_H

#include <stdint.h>
#include <stdio.h>

#include "quant/mlx_affine.h"

#define DT_QUANT_MAX_KEEP 32

typedef struct {
    int bits;                 /* 4 or 8 */
    int group;                /* 32, 64 or 128 */
    mlx_rule rule;            /* MLX_RULE_MLX (default) or MLX_RULE_MINMAX (the test fixtures' rule) */
    const char *keep[DT_QUANT_MAX_KEEP];   /* patterns of weights to keep dense (see dt_quant_keep_match) */
    int n_keep;
    int threads;              /* worker threads (<= 0: online CPUs, at most 16) */
    int report;               /* per-tensor lines on `log`: 0 none, 1 the 10 worst, 2 every tensor */
    int write_config;         /* 1: write config.json beside the output when the input folder has one */
    FILE *log;                /* NULL: stderr */
} dt_quant_opts;

typedef struct {
    int n_quantized;          /* Linears written as U32 + scales + biases */
    int n_copied;             /* tensors copied unchanged */
    int n_kept;               /* of those, 2-D weights kept dense by --keep or an incompatible width */
    double err2, ref2;        /* sum (w - deq(q(w)))^2 and sum w^2 over the quantized weights */
    double rel_err;           /* whole-model relative L2 error sqrt(err2 / ref2) */
    double worst_rel;         /* largest per-tensor relative error and its tensor */
    char worst_name[256];
    uint64_t in_bytes, out_bytes;
    double seconds;
    int wrote_config;         /* config.json written beside the output */
} dt_quant_stats;

void dt_quant_opts_default(dt_quant_opts *o);
/* PATTERN matches NAME as a glob (fnmatch, when it has * ? or [) or else as a substring. */
int dt_quant_keep_match(const char *pattern, const char *name);
/* INPUT: a .safetensors file, a component folder (sharded or not) or a pipeline root (its transformer/).
 * 0 ok, -1 with dt_last_error naming the file. */
int dt_quantize_checkpoint(const char *input, const char *output, const dt_quant_opts *o, dt_quant_stats *st);

#endif
