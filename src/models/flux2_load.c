/* flux2_load.c — the FLUX.2-klein transformer's weights: the blocks' and the outer layers' Linears and norms through
 * the model's Linear set (any checkpoint layout and weight form, LoRA adapters merged or as side products), and
 * flux2_load / flux2_load_ex; flux2_weights_free. The config: flux2_config.c; the forward: flux2.c. */
#include "flux2_internal.h"
#include "flux2_layouts.h"
#include "flux2_lora.h"
#include "lora_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ loading */


static int norm_upload(dt_backend *be, const dt_weights *w, int hd, const char *name, dt_mat *out) {
    float *tmp = dt_malloc(sizeof(float) * hd);
    int rc = dt_weights_read_f32(w, name, tmp, hd);
    if (rc == 0) *out = dt_param_upload(be, tmp, hd);
    free(tmp);
    return rc;
}

int flux2_double_w_load(dt_linear_set *lin, const dt_weights *w, const flux2_config *c, int i, flux2_double_w *out,
                        dt_linear_src *qkv_src, dt_linear_src *add_qkv_src) {
    int64_t D = c->hidden, F = c->mlp_hidden;
    char qn[3][256], nm[256];
    const char *parts[3] = {qn[0], qn[1], qn[2]};
    const char *img[3] = {"attn.to_q", "attn.to_k", "attn.to_v"};
    const char *txt[3] = {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
    /* Q, K and V projections as one GEMM each for the image and the text stream */
    for (int j = 0; j < 3; j++) snprintf(qn[j], sizeof qn[j], "transformer_blocks.%d.%s", i, img[j]);
    if (!(out->to_qkv = dt_linear_set_load_stacked(lin, w, parts, 3, D, D, qkv_src))) return -1;
    for (int j = 0; j < 3; j++) snprintf(qn[j], sizeof qn[j], "transformer_blocks.%d.%s", i, txt[j]);
    if (!(out->add_qkv = dt_linear_set_load_stacked(lin, w, parts, 3, D, D, add_qkv_src))) return -1;
    struct { dt_linear **dst; const char *suffix; int64_t o, in; } l[] = {
        {&out->to_out, "attn.to_out.0", D, D},        {&out->to_add_out, "attn.to_add_out", D, D},
        {&out->ff_in, "ff.linear_in", 2 * F, D},      {&out->ff_out, "ff.linear_out", D, F},
        {&out->ffc_in, "ff_context.linear_in", 2 * F, D}, {&out->ffc_out, "ff_context.linear_out", D, F},
    };
    for (size_t j = 0; j < sizeof l / sizeof l[0]; j++) {
        snprintf(nm, sizeof nm, "transformer_blocks.%d.%s", i, l[j].suffix);
        if (!(*l[j].dst = dt_linear_set_load(lin, w, nm, l[j].o, l[j].in, -1))) return -1;
    }
    struct { dt_mat *dst; const char *suffix; } n[] = {
        {&out->norm_q, "norm_q"}, {&out->norm_k, "norm_k"}, {&out->norm_aq, "norm_added_q"}, {&out->norm_ak, "norm_added_k"},
    };
    for (size_t j = 0; j < sizeof n / sizeof n[0]; j++) {
        snprintf(nm, sizeof nm, "transformer_blocks.%d.attn.%s.weight", i, n[j].suffix);
        if (norm_upload(lin->be, w, c->head_dim, nm, n[j].dst)) return -1;
    }
    return 0;
}

int flux2_single_w_load(dt_linear_set *lin, const dt_weights *w, const flux2_config *c, int i, flux2_single_w *out) {
    int64_t D = c->hidden, F = c->mlp_hidden;
    char nm[256];
    snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", i);
    if (!(out->qkv_mlp = dt_linear_set_load(lin, w, nm, 3 * D + 2 * F, D, -1))) return -1;
    snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.to_out", i);
    if (!(out->out = dt_linear_set_load(lin, w, nm, D, D + F, -1))) return -1;
    snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.norm_q.weight", i);
    if (norm_upload(lin->be, w, c->head_dim, nm, &out->norm_q)) return -1;
    snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.norm_k.weight", i);
    if (norm_upload(lin->be, w, c->head_dim, nm, &out->norm_k)) return -1;
    return 0;
}

int flux2_outer_w_load(dt_linear_set *lin, const dt_weights *w, const flux2_config *c, flux2_outer_w *out) {
    int64_t D = c->hidden;
    struct { dt_linear **dst; const char *name; int64_t o, in; } l[] = {
        {&out->x_emb, "x_embedder", D, c->in_channels},
        {&out->ctx_emb, "context_embedder", D, c->joint_dim},
        {&out->t_lin1, "time_guidance_embed.timestep_embedder.linear_1", D, c->tg_channels},
        {&out->t_lin2, "time_guidance_embed.timestep_embedder.linear_2", D, D},
        {&out->mod_img, "double_stream_modulation_img.linear", 6 * D, D},
        {&out->mod_txt, "double_stream_modulation_txt.linear", 6 * D, D},
        {&out->mod_single, "single_stream_modulation.linear", 3 * D, D},
        {&out->norm_out, "norm_out.linear", 2 * D, D},
        {&out->proj_out, "proj_out", c->out_channels, D},
    };
    for (size_t j = 0; j < sizeof l / sizeof l[0]; j++)
        if (!(*l[j].dst = dt_linear_set_load(lin, w, l[j].name, l[j].o, l[j].in, -1))) return -1;
    return 0;
}

static void free_norm(dt_backend *be, dt_mat *m) {
    if (m->data) be->free(be, m);
    memset(m, 0, sizeof *m);
}

void flux2_double_w_free(dt_backend *be, flux2_double_w *w) {
    free_norm(be, &w->norm_q);
    free_norm(be, &w->norm_k);
    free_norm(be, &w->norm_aq);
    free_norm(be, &w->norm_ak);
}

void flux2_single_w_free(dt_backend *be, flux2_single_w *w) {
    free_norm(be, &w->norm_q);
    free_norm(be, &w->norm_k);
}


flux2_model *flux2_load(dt_backend *be, const char *path) { return flux2_load_ex(be, path, NULL); }

/* Adapters: the catalogue of this checkpoint's module names, the files read through it, and (when any is given)
 * the model's ops through the LoRA backend wrapper, which adds the side products of quantized Linears. */
static int load_loras(flux2_model *m, const flux2_load_opts *o) {
    return dt_linear_set_use_loras(&m->lin, &m->be, &m->lora, o->loras, o->n_loras, o->lora_side,
                                   flux2_lora_catalogue(m->w, &m->c));
}

flux2_model *flux2_load_ex(dt_backend *be, const char *path, const flux2_load_opts *o) {
    const flux2_load_opts bf16 = {0};
    if (!o) o = &bf16;
    char *dir = dt_weights_component_dir(path, "transformer");
    if (!dir) return NULL;
    flux2_model *m = dt_calloc(1, sizeof *m);
    m->be = be;
    m->lin.be = be;
    m->w = dt_weights_open(dir);
    if (!m->w) { free(dir); free(m); return NULL; }
    if (flux2_layout_install(m->w)) { free(dir); flux2_weights_free(m); return NULL; }   /* BFL/mflux keys; geometry without config.json */
    char what[4200];
    const json *cfg = dt_weights_class_config(m->w, dir, "Flux2Transformer2DModel", "FLUX.2", what, sizeof what);
    free(dir);
    if (!cfg || flux2_config_parse(cfg, what, &m->c)) goto fail;

    const flux2_config *c = &m->c;
    for (size_t i = 0; i < dt_weights_count(m->w); i++) m->weight_bytes += dt_weights_at(m->w, i)->nbytes;
    if (o->n_loras > 0 && load_loras(m, o)) goto fail;

    m->lin.fp8_unfused = o->fp8_unfused;   /* every fp8 Linear (a file's outer ones too) */
    if (flux2_outer_w_load(&m->lin, m->w, c, &m->o)) goto fail;

    m->lin.precision = o->precision;   /* --precision fp8: the blocks' Linears (embedders, modulation, final stay bf16) */
    /* an fp8 file: the blocks' Linears run on the fp8 GEMM whatever --precision says, so their producers (norms,
     * SwiGLU) write the e4m3 codes as under --precision fp8 (the same choice, A/B knob included) */
    const st_tensor *sb0 = dt_weights_find(m->w, "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight");
    const int fp8_file = sb0 && dt_dtype_is_fp8(sb0->dtype);
    if (flux2_runtime_choices(be, o, fp8_file ? DT_PREC_FP8 : o->precision, &m->c, what)) goto fail;
    m->db = dt_calloc(c->num_layers, sizeof *m->db);
    for (int i = 0; i < c->num_layers; i++) {
        if (flux2_double_w_load(&m->lin, m->w, c, i, &m->db[i], NULL, NULL)) goto fail;
    }
    m->sb = dt_calloc(c->num_single_layers, sizeof *m->sb);
    for (int i = 0; i < c->num_single_layers; i++) {
        if (flux2_single_w_load(&m->lin, m->w, c, i, &m->sb[i])) goto fail;
    }
    if (m->lora) {
        if (dt_lora_check_used(m->lora)) goto fail;
        int files, modules, targets;
        dt_lora_summary(m->lora, &files, &modules, &targets);
        dt_log(2, "lora: %d file(s), %d adapter modules on %d model modules: %d Linears merged, %d with side products\n",
               files, modules, targets, m->lin.lora_merged, m->lin.lora_sides);
    }
    dt_linear_set_log(&m->lin, "transformer");
    return m;
fail:
    flux2_weights_free(m);
    return NULL;
}

void flux2_weights_free(flux2_model *m) {
    if (m->be) {
        dt_linear_set_free(&m->lin);
        for (int i = 0; m->db && i < m->c.num_layers; i++) flux2_double_w_free(m->be, &m->db[i]);
        for (int i = 0; m->sb && i < m->c.num_single_layers; i++) flux2_single_w_free(m->be, &m->sb[i]);
    }
    free(m->db);
    free(m->sb);
    if (m->w) dt_weights_close(m->w);
    if (m->be && dt_lora_backend_is_wrapper(m->be)) m->be->destroy(m->be);   /* the wrapper only, not the caller's */
    dt_lora_free(m->lora);
    free(m);
}
