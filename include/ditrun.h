/* ditrun.h — the public C API of libditrun (build/libditrun.a).
 *
 *   ditrun_engine *e = ditrun_engine_create("auto", 0);            // cuda when a GPU is usable
 *   ditrun_image img;
 *   ditrun_generate_opts o = ditrun_generate_defaults();
 *   o.model = "FLUX.2-klein-4B"; o.prompt = "a fox in the snow";
 *   if (ditrun_generate(e, &o, &img) == 0) { ...img.rgb [h][w][3]...; ditrun_image_free(&img); }
 *   else fprintf(stderr, "%s\n", ditrun_last_error());
 *   ditrun_engine_free(e);
 *
 * Lower level: ditrun_transformer_load / ditrun_transformer_forward run one DiT step on host arrays.
 * Every function returns 0 / non-NULL on success; on failure ditrun_last_error() says what, naming
 * the file, tensor or option. Thread safety: one engine per thread. */
#ifndef DITRUN_H
#define DITRUN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char *ditrun_version(void);
const char *ditrun_last_error(void);

typedef struct ditrun_engine ditrun_engine;
/* backend: "cpu", "cuda" or "auto"; threads: CPU threads (0 = all cores). */
ditrun_engine *ditrun_engine_create(const char *backend, int threads);
void ditrun_engine_free(ditrun_engine *e);
const char *ditrun_engine_backend(const ditrun_engine *e);
/* Precision of the DiT blocks' Linears for transformers loaded (or generations started) from now on:
 * "bf16" (default) or "fp8" (e4m3 weights with per-output-channel scales, e4m3 activations with per-token
 * scales; opt-in: see ditrun forward --compare-bf16 for its error). -1 on an unknown value. */
int ditrun_engine_set_precision(ditrun_engine *e, const char *precision);
/* Precision of the DiT blocks' attention (FLUX.2) for transformers loaded from now on: "bf16" (default) or "fp8"
 * (e4m3 Q/K/V/P with one scale per tensor; CUDA through cuDNN's fp8 attention; opt-in). -1 on an unknown value. */
int ditrun_engine_set_attn_precision(ditrun_engine *e, const char *precision);

typedef struct {
    const char *model;          /* pipeline root */
    const char *prompt;
    int width, height;          /* default 1024 x 1024 */
    int steps;                  /* 0 = model default (4 distilled, 50 base) */
    uint64_t seed;
    float guidance;             /* < 0 = default (4.0, base models only) */
    int max_sequence_length;    /* default 512 */
} ditrun_generate_opts;

typedef struct { uint8_t *rgb; int width, height; } ditrun_image;   /* rgb [height][width][3] */

ditrun_generate_opts ditrun_generate_defaults(void);
int ditrun_generate(ditrun_engine *e, const ditrun_generate_opts *o, ditrun_image *out);
void ditrun_image_free(ditrun_image *img);

/* One FLUX.2 transformer step. Arrays are f32 host memory:
 *   img [n_img, in_channels], txt [n_txt, joint_dim], img_ids [n_img, 4], txt_ids [n_txt, 4],
 *   out [n_img, out_channels]; timestep = sigma in [0, 1]. */
typedef struct ditrun_transformer ditrun_transformer;
ditrun_transformer *ditrun_transformer_load(ditrun_engine *e, const char *path);
void ditrun_transformer_free(ditrun_transformer *t);
int ditrun_transformer_dims(const ditrun_transformer *t, int *in_channels, int *out_channels, int *joint_dim);
int ditrun_transformer_forward(ditrun_transformer *t, const float *img, int n_img, const float *txt, int n_txt,
                               float timestep, const float *img_ids, const float *txt_ids, float *out);

#ifdef __cplusplus
}
#endif
#endif
