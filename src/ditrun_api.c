/* ditrun_api.c — the public API (include/ditrun.h) over the internal layers. */
#include "ditrun.h"

#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "models/flux2.h"
#include "pipeline/generate.h"

struct ditrun_engine { dt_backend *be; };
struct ditrun_transformer { flux2_model *m; };

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
    if (dt_precision_from_name(precision, &e->be->opts.precision) == 0) return 0;
    dt_set_error("precision: unknown value '%s' (bf16, fp8)", precision ? precision : "(null)");
    return -1;
}

int ditrun_engine_set_attn_precision(ditrun_engine *e, const char *precision) {
    if (dt_precision_from_name(precision, &e->be->opts.attn_precision) == 0) return 0;
    dt_set_error("attention precision: unknown value '%s' (bf16, fp8)", precision ? precision : "(null)");
    return -1;
}

ditrun_generate_opts ditrun_generate_defaults(void) {
    ditrun_generate_opts o;
    memset(&o, 0, sizeof o);
    o.width = o.height = 1024;
    o.guidance = -1;
    o.max_sequence_length = 512;
    return o;
}

int ditrun_generate(ditrun_engine *e, const ditrun_generate_opts *o, ditrun_image *out) {
    dt_gen_params p;
    dt_gen_params_default(&p);
    p.model = o->model;
    p.prompt = o->prompt;
    if (o->width > 0) p.width = o->width;
    if (o->height > 0) p.height = o->height;
    p.steps = o->steps;
    p.seed = o->seed;
    p.guidance = o->guidance;
    if (o->max_sequence_length > 0) p.max_seq_len = o->max_sequence_length;
    memset(out, 0, sizeof *out);
    return dt_generate(e->be, &p, &out->rgb, &out->width, &out->height, NULL, NULL, NULL);
}

void ditrun_image_free(ditrun_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
}

ditrun_transformer *ditrun_transformer_load(ditrun_engine *e, const char *path) {
    flux2_model *m = flux2_load(e->be, path);
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
