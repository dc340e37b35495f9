/* ditrun_api.c — the public API (include/ditrun.h) over the internal layers. */
#include "ditrun.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/backend_cuda.h"
#include "image/edit_prep.h"
#include "image/image.h"
#include "models/flux2.h"
#include "pipeline/engine.h"

struct ditrun_engine {
    dt_backend *be;
    dt_precision precision, attn_precision;   /* what models loaded from now on run in (their load options) */
};
struct ditrun_transformer { flux2_model *m; };
struct ditrun_pipeline { dt_pipeline *p; };

const char *ditrun_version(void) { return DITRUN_VERSION; }
const char *ditrun_last_error(void) { return dt_last_error(); }

ditrun_engine *ditrun_engine_create(const char *backend, int threads) {
    dt_backend_opts o;
    memset(&o, 0, sizeof o);
    o.threads = threads;
    o.rope_fp32 = 1;
    dt_backend *be = dt_backend_create(backend ? backend : "auto", &o);
    if (!be) return NULL;
    ditrun_engine *e = dt_calloc(1, sizeof *e);
    e->be = be;
    return e;
}

void ditrun_engine_free(ditrun_engine *e) {
    if (!e) return;
    e->be->destroy(e->be);
    free(e);
}

const char *ditrun_engine_backend(const ditrun_engine *e) { return e->be->name; }

int ditrun_engine_set_precision(ditrun_engine *e, const char *precision) {
    if (dt_precision_from_name(precision, &e->precision) == 0) return 0;
    dt_set_error("precision: unknown value '%s' (bf16, fp8)", precision ? precision : "(null)");
    return -1;
}

int ditrun_engine_set_attn_precision(ditrun_engine *e, const char *precision) {
    if (dt_precision_from_name(precision, &e->attn_precision) == 0) return 0;
    dt_set_error("attention precision: unknown value '%s' (bf16, fp8)", precision ? precision : "(null)");
    return -1;
}

ditrun_generate_opts ditrun_generate_defaults(void) {
    ditrun_generate_opts o;
    memset(&o, 0, sizeof o);
    o.guidance = -1;
    o.cfg_normalization = o.cfg_truncation = -1;
    o.guidance_batch = 1;
    return o;
}

/* A request's editing images decoded (each error names the file or the given name). */
typedef struct {
    dt_image refs[DT_GEN_MAX_REFS], init, mask;
    const char *ref_names[DT_GEN_MAX_REFS];
    int n;
} api_images;

/* lim: what the image must be (NULL: any size the decoder takes), checked from its header. */
static int decode_input(const ditrun_image_input *in, const char *what, const dt_image_limits *lim, dt_image *out,
                        const char **name) {
    if (in->path) {
        *name = in->path;
        return dt_image_read_file_ex(in->path, lim, out);
    }
    *name = in->name ? in->name : what;
    if (!in->data || !in->size) { dt_set_error("%s: no image data (path or data + size)", *name); return -1; }
    return dt_image_decode_ex(in->data, in->size, *name, lim, out);
}

static void api_images_free(api_images *a) {
    for (int i = 0; i < a->n; i++) dt_image_free(&a->refs[i]);
    dt_image_free(&a->init);
    dt_image_free(&a->mask);
}

/* Decode o's images into a and point p at them. 0 or -1. */
static int api_images_load(const ditrun_generate_opts *o, api_images *a, dt_gen_params *p) {
    memset(a, 0, sizeof *a);
    if (o->n_images < 0 || o->n_images > DT_GEN_MAX_REFS || (o->n_images && !o->images)) {
        dt_set_error("generate: %d reference images (at most %d)", o->n_images, DT_GEN_MAX_REFS);
        return -1;
    }
    const dt_image_limits ref_lim = dt_prep_reference_limits(0);
    for (; a->n < o->n_images; a->n++) {
        char nm[48];
        snprintf(nm, sizeof nm, "reference image %d", a->n + 1);
        if (decode_input(&o->images[a->n], nm, &ref_lim, &a->refs[a->n], &a->ref_names[a->n])) return -1;
        if (!o->images[a->n].path && !o->images[a->n].name) a->ref_names[a->n] = NULL;   /* "reference image k" */
    }
    p->refs = a->refs;
    p->ref_names = a->ref_names;
    p->n_refs = a->n;
    if (o->init_image) {
        if (decode_input(o->init_image, "init image", NULL, &a->init, &p->init_name)) return -1;
        p->init_image = &a->init;
    }
    if (o->mask) {
        if (decode_input(o->mask, "mask", NULL, &a->mask, &p->mask_name)) return -1;
        p->mask = &a->mask;
    }
    return 0;
}

/* The public request as the engine's: 0, or -1 for a bad cache setting (dt_last_error). */
static int to_params(const ditrun_generate_opts *o, dt_gen_params *p) {
    dt_gen_params_default(p);
    p->prompt = o->prompt;
    if (o->negative_prompt) p->negative_prompt = o->negative_prompt;
    p->width = o->width;
    p->height = o->height;
    p->steps = o->steps;
    p->seed = o->seed;
    p->guidance = o->guidance;
    p->max_seq_len = o->max_sequence_length;
    p->noise = o->noise;
    p->noise_len = o->noise_len;
    p->progress = o->progress;
    p->progress_ud = o->progress_user;
    p->cancel = o->cancel;
    p->strength = o->strength;
    p->cfg_normalization_set = o->cfg_normalization >= 0;
    p->cfg_normalization = o->cfg_normalization;
    p->cfg_truncation_set = o->cfg_truncation >= 0;
    p->cfg_truncation = o->cfg_truncation;
    return dt_cache_parse(o->cache, &p->cache);
}

int ditrun_generate(ditrun_engine *e, const ditrun_generate_opts *o, ditrun_image *out) {
    dt_gen_params p;
    memset(out, 0, sizeof *out);
    if (to_params(o, &p)) return -1;
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.precision = e->precision;
    lo.attn_precision = e->attn_precision;
    lo.model = o->model;
    lo.vae_tiling = o->vae_tiling;
    lo.vae_tile = o->vae_tile_size;
    lo.max_vram = o->max_vram;
    lo.guidance_batch = o->guidance_batch;
    memset(out, 0, sizeof *out);
    api_images im;
    int rc = api_images_load(o, &im, &p);
    /* a CUDA pool holds to the budget for this call (and the plan's host weights last as long) */
    dt_cuda_opts *co = dt_backend_cuda_opts(e->be);
    const int64_t pool_budget = co ? co->max_vram : 0;
    const int host_weights = co ? co->host_weights : 0;
    if (co && o->max_vram > 0) co->max_vram = o->max_vram;
    if (rc == 0) rc = dt_generate(e->be, &lo, &p, &out->rgb, &out->width, &out->height, NULL, NULL, NULL);
    if (co) {
        co->max_vram = pool_budget;
        co->host_weights = host_weights;
    }
    api_images_free(&im);
    return rc;
}

ditrun_load_opts ditrun_load_defaults(void) {
    ditrun_load_opts o;
    memset(&o, 0, sizeof o);
    o.guidance_batch = 1;
    return o;
}

ditrun_pipeline *ditrun_pipeline_load(ditrun_engine *e, const ditrun_load_opts *o) {
    dt_pipeline_opts lo;
    dt_pipeline_opts_default(&lo);
    lo.precision = e->precision;
    lo.attn_precision = e->attn_precision;
    lo.model = o->model;
    if (o->n_text_encoder_layers < 0 || o->n_text_encoder_layers > DT_GEN_MAX_TAPS) {
        dt_set_error("pipeline: %d text-encoder layers (at most %d)", o->n_text_encoder_layers, DT_GEN_MAX_TAPS);
        return NULL;
    }
    lo.n_taps = o->n_text_encoder_layers;
    memcpy(lo.taps, o->text_encoder_layers, sizeof(int) * (size_t)lo.n_taps);
    lo.cuda_graph = o->cuda_graph;
    lo.guidance_batch = o->guidance_batch;
    lo.release_text_encoder = o->release_text_encoder;
    lo.sequence_parallel = o->sequence_parallel;
    lo.vae_tiling = o->vae_tiling;
    lo.vae_tile = o->vae_tile_size;
    if (o->n_loras < 0 || o->n_loras > 8 || (o->n_loras && !o->loras)) {
        dt_set_error("pipeline: %d LoRA adapters (0..8, with their names)", o->n_loras);
        return NULL;
    }
    dt_lora_spec *specs = o->n_loras ? dt_calloc((size_t)o->n_loras, sizeof *specs) : NULL;
    for (int i = 0; i < o->n_loras; i++)
        if (dt_lora_spec_parse(o->loras[i], &specs[i])) { free(specs); return NULL; }
    lo.loras = specs;
    lo.n_loras = o->n_loras;
    dt_pipeline *p = dt_pipeline_load(e->be, &lo);   /* (copies the adapter list) */
    free(specs);
    if (!p) return NULL;
    ditrun_pipeline *r = dt_calloc(1, sizeof *r);
    r->p = p;
    return r;
}

void ditrun_pipeline_free(ditrun_pipeline *p) {
    if (!p) return;
    dt_pipeline_free(p->p);
    free(p);
}

ditrun_pipeline_info ditrun_pipeline_describe(const ditrun_pipeline *p) {
    const dt_pipeline_info *i = dt_pipeline_get_info(p->p);
    ditrun_pipeline_info r = {i->family, i->distilled, i->default_steps, i->default_guidance, i->size_multiple,
                              i->max_side, i->editing, i->kv_refs, i->img2img, i->cfg_shaping};
    return r;
}

int ditrun_pipeline_generate(ditrun_pipeline *p, const ditrun_generate_opts *o, ditrun_image *out) {
    dt_gen_params g;
    memset(out, 0, sizeof *out);
    if (to_params(o, &g)) return -1;
    api_images im;
    int rc = api_images_load(o, &im, &g);
    if (rc == 0) rc = dt_pipeline_generate(p->p, &g, &out->rgb, &out->width, &out->height, NULL, NULL, NULL);
    api_images_free(&im);
    return rc;
}

void ditrun_image_free(ditrun_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
}

ditrun_transformer *ditrun_transformer_load(ditrun_engine *e, const char *path) {
    const flux2_load_opts lo = {.precision = e->precision, .attn_precision = e->attn_precision};
    flux2_model *m = flux2_load_ex(e->be, path, &lo);
    if (!m) return NULL;
    ditrun_transformer *t = dt_calloc(1, sizeof *t);
    t->m = m;
    return t;
}

void ditrun_transformer_free(ditrun_transformer *t) {
    if (!t) return;
    flux2_free(t->m);
    free(t);
}

int ditrun_transformer_dims(const ditrun_transformer *t, int *in_channels, int *out_channels, int *joint_dim) {
    const flux2_config *c = flux2_get_config(t->m);
    if (in_channels) *in_channels = c->in_channels;
    if (out_channels) *out_channels = c->out_channels;
    if (joint_dim) *joint_dim = c->joint_dim;
    return 0;
}

int ditrun_transformer_forward(ditrun_transformer *t, const float *img, int n_img, const float *txt, int n_txt,
                               float timestep, const float *img_ids, const float *txt_ids, float *out) {
    return flux2_forward(t->m, img, n_img, txt, n_txt, timestep, img_ids, txt_ids, out, NULL, NULL);
}
