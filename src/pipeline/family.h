/* family.h — the family registry: one table per model family (FLUX.2-klein: klein.c, Krea 2: krea2_family.c, Z-Image:
 * zimage_family.c)
 * owning everything family-specific that the commands need — the `_class_name`s it accepts (pipeline and
 * transformer), its synthetic presets, its defaults, how it loads its DiT (models/dit.h), describes a transformer
 * config (`ditrun info`), writes synthetic checkpoints and inputs (`ditrun synth`) and runs a pipeline (the engine,
 * pipeline/engine.c). Every command finds the family here (dt_family_for_*), never by a class name of its own.
 *
 * A family loads its components into its own state (dt_pipeline.fam), fills dt_pipeline.info, and runs
 * requests through the generate skeleton (pipeline/generate_run.h: text encoding, noise, schedule, the shared
 * sampling loop of pipeline/sampler.h, decoding), giving it the family's steps as hooks.
 * A new family: its model (models/NAME.c + NAME_dit.c), its pipeline file with the table, its synth writer, its
 * bench file (bench_NAME.c); one line in family.c's list. */
#ifndef DT_FAMILY_H
#define DT_FAMILY_H

#include <stdio.h>

#include "core/infile.h"
#include "io/json.h"
#include "models/dit.h"
#include "models/vae_flux2.h"
#include "pipeline/engine.h"
#include "synth/synth_pipeline.h"

typedef struct dt_family dt_family;

/* A family's inputs to the memory planner (placement_sizes.c) for one image size. */
typedef struct {
    int hidden, mlp, head_dim;      /* the transformer's widths */
    int scale;                      /* the VAE's pixels per latent (8) */
    int64_t vae_act, vae_tile_act;  /* the VAE decode's activation bytes: whole, and tiled (0: one tile covers it) */
    int vae_tile_px;                /* that tile's side: `tile`, or the VAE's default */
    int vae_cmax, vae_attention;    /* the VAE's widest stage (channels), 1 when its mid block has attention (the
                                     * decode's backend scratch) */
    int side_queue;                 /* 1: the forward runs the text stream's MLP (2F x D) on a second queue, with a
                                     * dequantization buffer of its own (FLUX.2's double blocks) */
} dt_family_place;

struct dt_pipeline {
    dt_backend *be;
    dt_pipeline_opts opts;
    char *root;                 /* copy of opts.model */
    char *class_name;           /* model_index.json's _class_name */
    dt_pipeline_info info;
    const dt_family *family;
    void *fam;                  /* the family's loaded components */
};

struct dt_family {
    const char *name;                         /* "flux2-klein", "krea2" */
    const char *title;                        /* "FLUX.2", "Krea 2" (messages) */
    const char *const *pipeline_classes;      /* model_index.json _class_names it runs (NULL-terminated) */
    const char *const *transformer_classes;   /* transformer config.json _class_names (NULL-terminated) */
    const char *const *presets;               /* synthetic geometries (synth, bench --preset; NULL-terminated) */
    /* A transformer config without _class_name that is this family's (quantized folders drop it); NULL: none. */
    int (*is_config)(const json *cfg);
    int infers_config;          /* 1: a transformer folder without config.json is this family's (geometry from shapes) */
    int fp8;                    /* 1: has fp8 modes (--precision / --attn-precision fp8) */
    int guidance_batch;         /* 1: its sampler runs a guided step's two passes in one forward when
                                 * opts.guidance_batch (the memory plan counts the activations twice for a
                                 * pipeline that is not distilled, unsplit) */
    /* Load the components of p->root (model_index.json parsed in idx) into p->fam and fill p->info.
     * 0 or -1 (dt_last_error); on error the family frees what it made. */
    int (*load)(dt_pipeline *p, const json *idx);
    void (*free)(dt_pipeline *p);
    /* One request: g is already defaulted/validated by the engine (prompt set, steps > 0, size multiples). */
    int (*generate)(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                    dt_gen_observer obs, void *ud);
    int sequence_parallel;      /* 1: the family honours opts.sequence_parallel (the engine refuses it otherwise) */
    /* The transformer at path (folder, pipeline root) behind the DiT interface. NULL on error. */
    dt_dit *(*dit_load)(dt_backend *be, const char *path, const dt_dit_load_opts *o);
    /* `ditrun info`: the geometry lines ("  geometry ...") of transformer config cfg. 0, or -1 (invalid: the
     * error set, nothing printed). */
    int (*describe)(const json *cfg, FILE *f);
    /* `ditrun synth`: a checkpoint, a pipeline or forward inputs for one of its presets. 0 or -1. */
    int (*synth)(const dt_synth_req *r);
    /* `ditrun forward`: the forward inputs of a file (the names its synth writes) for the loaded DiT (dit.h). */
    int (*read_inputs)(const st_file *in, dt_dit *d, int kv_refs, int no_mask, dt_dit_inputs *fi);
    /* The memory planner (placement.h): from the transformer config cfg of folder tr (NULL: none) and the VAE folder
     * va, for a W x H image decoded in tiles of `tile` pixels (0: the VAE's default) at elem bytes per activation,
     * its widths and decode activations into *out. 0 or -1. NULL: --max-vram is refused for the family. */
    int (*place_sizes)(const json *cfg, const char *tr, const char *va, int W, int H, int tile, int elem,
                       dt_family_place *out);
};

/* The VAE part of *o (scale and the decode's activations, tile and widest stage) for a VAE that runs the shared
 * decoder walk (FLUX.2's AutoencoderKLFlux2, AutoencoderKL): a place_sizes helper (placement_sizes.c). */
void dt_family_place_vae(const dt_vae_config *v, int W, int H, int tile, int elem, dt_family_place *o);

/* ---- the registry (family.c) ---- */
/* Every family, in order (the first is the fallback of folders without a config). */
const dt_family *const *dt_families(int *n);
/* The family running model_index.json's _class_name cls; NULL with the error listing the supported ones. */
const dt_family *dt_family_for_pipeline(const char *cls, const char *what);
/* The family of a transformer config.json (its _class_name, or a family's is_config); NULL if none (no error). */
const dt_family *dt_family_for_config(const json *cfg);
/* The family of the transformer at path (folder, pipeline root, or file with config.json beside); a folder
 * without config.json is the infers_config family's. NULL on error (unreadable config, unknown class). */
const dt_family *dt_family_for_model(const char *path);
/* The family with synthetic preset name; NULL with the error listing every preset. */
const dt_family *dt_family_for_preset(const char *preset);
/* 1 when s is one of the NULL-terminated names. */
int dt_family_name_in(const char *const *names, const char *s);

extern const dt_family dt_family_klein;
extern const dt_family dt_family_krea2;
extern const dt_family dt_family_zimage;

/* The steps of a request the families share (family_steps.c). */
void dt_gen_observe(dt_gen_observer obs, void *ud, const char *name, const float *d, int ndim, int64_t d0,
                    int64_t d1, int64_t d2, int64_t d3);
/* The request's noise (noise array or noise_file's in.initial_latents) into out [n]; 1 if given, 0 if the
 * request has none (draw it), -1 on error (wrong count: `layout` names the expected shape). */
int dt_gen_read_noise(const dt_gen_params *g, float *out, int64_t n, const char *layout);
/* The request's noise (as dt_gen_read_noise) or, when it has none, the seeded Gaussian noise [c, h, w]
 * (dt_latents_noise) into out. 0 or -1 (dt_last_error). */
int dt_gen_noise(const dt_gen_params *g, float *out, int c, int h, int w, const char *layout);
/* The VAE's image [3, H, W] (f32, nominal range [-1, 1]) as 8-bit RGB [H, W, 3] (malloc'd; diffusers' image
 * post-processing), observed as image_float [1, H, W, 3] when obs is set. */
uint8_t *dt_gen_image_rgb(const float *img, int H, int W, dt_gen_observer obs, void *ud);
/* Non-zero when the request has been cancelled (flag set); sets the error. */
int dt_gen_cancelled(const dt_gen_params *g);
/* Load *te from dir (Qwen3 / Qwen3-VL text model, layers up to max_tap, at least 1) with the pipeline's options,
 * unless it is loaded already. 0 or -1 (dt_last_error). */
struct dt_qwen3;
int dt_family_ensure_text_encoder(dt_pipeline *p, const char *dir, int max_tap, struct dt_qwen3 **te);
/* The pipeline's options for loading its DiT (adapters, ranks, CUDA graph, precisions): every family's loader
 * takes them whole and refuses what its model cannot honour. */
dt_dit_load_opts dt_family_dit_opts(const dt_pipeline *p);
/* After a request's prompts are encoded: free *te (NULL after) when the pipeline runs with release_text_encoder. */
void dt_family_release_text_encoder(dt_pipeline *p, struct dt_qwen3 **te);
/* The log line of a request's text encoding: T tokens, the taps, whether the negative prompt is encoded too (cfg),
 * and a note ("" for none); at level 2 when the caller reports progress itself, else 1. */
void dt_gen_log_encoding(const dt_gen_params *g, int T, const int *taps, int n_taps, int cfg, const char *note);

#endif
