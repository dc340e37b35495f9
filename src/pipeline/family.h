/* family.h — what a model family provides to the engine (pipeline/engine.c), and the state the engine
 * shares with it. One file per family implements it: klein.c (FLUX.2-klein), krea2_family.c (Krea 2), ...
 *
 * A family loads its components into its own state (dt_pipeline.fam), fills dt_pipeline.info, and runs
 * requests: text encoding, noise, schedule, the shared sampling loop (pipeline/sampler.h), decoding. */
#ifndef DT_FAMILY_H
#define DT_FAMILY_H

#include "io/json.h"
#include "pipeline/engine.h"

typedef struct dt_family dt_family;

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
    const char *name;
    /* Does this family run model_index.json's _class_name? */
    int (*matches)(const char *class_name);
    /* Load the components of p->root (model_index.json parsed in idx) into p->fam and fill p->info.
     * 0 or -1 (dt_last_error); on error the family frees what it made. */
    int (*load)(dt_pipeline *p, const json *idx);
    void (*free)(dt_pipeline *p);
    /* One request: g is already defaulted/validated by the engine (prompt set, steps > 0, size multiples). */
    int (*generate)(dt_pipeline *p, const dt_gen_params *g, uint8_t **rgb, int *w, int *h, dt_gen_timings *tm,
                    dt_gen_observer obs, void *ud);
    int sequence_parallel;      /* 1: the family honours opts.sequence_parallel (the engine refuses it otherwise) */
};

extern const dt_family dt_family_klein;
extern const dt_family dt_family_krea2;

/* Small helpers shared by the families. */
char *dt_path_join(const char *a, const char *b);                 /* "a/b", malloc'd */
int dt_path_exists(const char *p);
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
/* After a request's prompts are encoded: free *te (NULL after) when the pipeline runs with release_text_encoder. */
void dt_family_release_text_encoder(dt_pipeline *p, struct dt_qwen3 **te);
/* The log line of a request's text encoding: T tokens, the taps, whether the negative prompt is encoded too (cfg),
 * and a note ("" for none); at level 2 when the caller reports progress itself, else 1. */
void dt_gen_log_encoding(const dt_gen_params *g, int T, const int *taps, int n_taps, int cfg, const char *note);

#endif
