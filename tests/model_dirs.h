/* model_dirs.h — model folders the tests build around the fixture's tiny model: a pipeline root whose components are
 * symbolic links to another root's (with a model_index.json of its own: the KV editing pipeline of test_edit.c and
 * test_edit_engine.c, the 6-head pipelines of test_sp_generate.c), and the synthetic 6-head FLUX.2 transformer that
 * the sequence-parallel tests split over 2 to 6 ranks (test_flux2_sp.c, test_gpu_sp.c, test_sp_generate.c).
 * Header-only (static functions); remove a folder with t_rmtree (test.h), which removes links without following them. */
#ifndef DT_TESTS_MODEL_DIRS_H
#define DT_TESTS_MODEL_DIRS_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/flux2.h"
#include "test.h"
#include "synth/synth_dit.h"

/* Makes dir (it must not exist) a pipeline root: model_index.json holding index_json, and for each name in parts
 * (NULL-terminated) a symbolic link to that component of the pipeline root `from`. 0, or -1. */
static inline int linked_pipeline_root(const char *dir, const char *from, const char *const *parts,
                                       const char *index_json) {
    char src[PATH_MAX], path[PATH_MAX + 64];
    if (!realpath(from, src) || mkdir(dir, 0755)) return -1;
    for (size_t i = 0; parts[i]; i++) {
        char target[PATH_MAX + 64];
        snprintf(target, sizeof target, "%s/%s", src, parts[i]);
        snprintf(path, sizeof path, "%s/%s", dir, parts[i]);
        if (symlink(target, path)) return -1;
    }
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(index_json, f);
    return fclose(f);
}

/* The pipeline root `from` as a Flux2KleinKVPipeline (every component linked) in dir: 0, or -1. */
static inline int make_kv_root(const char *dir, const char *from) {
    static const char *const parts[] = {"tokenizer", "text_encoder", "transformer", "vae", "scheduler", NULL};
    return linked_pipeline_root(dir, from, parts, "{\"_class_name\": \"Flux2KleinKVPipeline\", \"is_distilled\": true}\n");
}

/* The tiny preset with 6 heads of dimension 32 (rope axes 8 each), 2 double and 2 single blocks: its heads divide
 * over 2 and 3 ranks evenly, over 4 not (2+2+1+1). In, joint and out channels are the tiny fixture's. */
static inline void six_heads_config(flux2_config *c) {
    flux2_preset("tiny", c);
    c->heads = 6;
    c->head_dim = 32;
    for (int i = 0; i < 4; i++) c->axes[i] = 8;
    c->hidden = c->heads * c->head_dim;
    c->mlp_hidden = 3 * c->hidden;
    c->num_layers = 2;
    c->num_single_layers = 2;
}

/* That transformer with random weights of `seed` (bf16) in dir: config.json and model.safetensors. 0, or -1. */
static inline int write_six_heads(const char *dir, uint64_t seed) {
    flux2_config c;
    six_heads_config(&c);
    return flux2_synth_write(&c, dir, 0, 64, seed);
}

#endif
