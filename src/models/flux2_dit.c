/* flux2_dit.c — FLUX.2 behind the DiT interface (flux2_dit.h): one ops table for the whole model (flux2.h), one for
 * the model split over ranks (flux2_sp.h). */
#include "flux2_dit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/weights.h"

#include "models/flux2_sp.h"

/* ---- whole ---- */

static int whole_forward(dt_dit *d, const dt_dit_step *s) {
    flux2_set_block_cache(dt_dit_model(d), s->fbc);
    int rc = flux2_forward(dt_dit_model(d), s->img, s->n_img, dt_dit_step_text(d, s), s->n_txt, s->timestep,
                           s->img_ids, s->txt_ids, s->out, s->trace, s->trace_ud);
    flux2_set_block_cache(dt_dit_model(d), NULL);
    return rc;
}
static int whole_forward_pair(dt_dit *d, const dt_dit_step *s0, const dt_dit_step *s1) {
    const flux2_config *c = dt_dit_config(d);
    if (s0->n_txt != s1->n_txt || s0->img_ids != s1->img_ids ||
        (s0->txt_ids != s1->txt_ids &&
         memcmp(s0->txt_ids, s1->txt_ids, sizeof(float) * (size_t)s0->n_txt * c->n_axes))) {
        dt_set_error("flux2: a guidance batch needs two steps of one text length and the same positions");
        return -1;
    }
    return flux2_forward_pair(dt_dit_model(d), s0->img, s1->img, s0->n_img, dt_dit_step_text(d, s0),
                              dt_dit_step_text(d, s1), s0->n_txt, s0->timestep, s0->img_ids, s0->txt_ids, s0->out,
                              s1->out);
}
static int whole_refs(dt_dit *d, const float *tok, const float *ids, int r, int kv) {
    return flux2_set_refs(dt_dit_model(d), tok, ids, r, kv);
}
static int whole_text(dt_dit *d, int slot, const float *txt, int t) {
    (void)slot;
    return flux2_text_resident(dt_dit_model(d), txt, t);
}
static int whole_text_mat(dt_dit *d, int slot, dt_mat src) {
    return flux2_text_resident_mat(dt_dit_model(d), dt_dit_slot_key(d, slot), src);
}
static void whole_info(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len) {
    flux2_weight_info(dt_dit_model(d), bytes, fmt, fmt_len);
}
static void whole_free(void *m) { flux2_free(m); }
static void whole_cancel(dt_dit *d, const volatile int *flag) { flux2_set_cancel(dt_dit_model(d), flag); }
static const dt_dit_ops whole_ops = {"flux2", whole_forward, whole_refs, whole_text, whole_text_mat, whole_info,
                                     whole_free, whole_cancel, whole_forward_pair};

/* ---- split over ranks ---- */

static int split_forward(dt_dit *d, const dt_dit_step *s) {
    if (s->fbc) { dt_set_error("flux2: First Block Cache needs the whole forward (not one split over ranks)"); return -1; }
    return flux2_sp_forward(dt_dit_model(d), s->img, s->n_img, dt_dit_step_text(d, s), s->n_txt, s->timestep,
                            s->img_ids, s->txt_ids, s->out);
}
static int split_refs(dt_dit *d, const float *tok, const float *ids, int r, int kv) {
    return flux2_sp_set_refs(dt_dit_model(d), tok, ids, r, kv);
}
static int split_text(dt_dit *d, int slot, const float *txt, int t) {
    (void)slot;
    return flux2_sp_text_resident(dt_dit_model(d), txt, t);
}
static int split_text_mat(dt_dit *d, int slot, dt_mat src) {
    return flux2_sp_text_resident_mat(dt_dit_model(d), dt_dit_slot_key(d, slot), src);
}
/* no weight total (each rank holds the whole model): "split over N ranks (comm)" */
static void split_info(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len) {
    flux2_sp *sp = dt_dit_model(d);
    *bytes = 0;
    snprintf(fmt, fmt_len, "split over %d ranks (%s)", flux2_sp_ranks(sp), flux2_sp_comm_name(sp));
}
static void split_free(void *m) { flux2_sp_free(m); }
static const dt_dit_ops split_ops = {"flux2 split", split_forward, split_refs, split_text, split_text_mat, split_info,
                                     split_free, NULL, NULL};   /* cancellation between steps: the ranks stop together */

dt_dit *flux2_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o) {
    const flux2_load_opts lo = {o->loras, o->n_loras, o->lora_side, o->precision, o->attn_precision, o->fp8_unfused};
    if (o->ranks > 1) {
        flux2_sp_opts so = {o->ranks, {0}, o->n_devices, lo};
        for (int i = 0; i < o->n_devices && i < FLUX2_SP_MAX_RANKS; i++) so.devices[i] = o->devices[i];
        flux2_sp *sp = flux2_sp_load(be, path, &so);
        if (!sp) return NULL;
        if (o->cuda_graph) dt_log(1, "ditrun: note: --cuda-graph is not used with --sequence-parallel (eager)\n");
        return dt_dit_new(&split_ops, sp, flux2_sp_get_config(sp));
    }
    flux2_model *m = flux2_load_ex(be, path, &lo);
    if (!m) return NULL;
    flux2_set_graph(m, o->cuda_graph);
    return dt_dit_new(&whole_ops, m, flux2_get_config(m));
}

const flux2_config *flux2_dit_config(const dt_dit *d) { return dt_dit_config(d); }

flux2_model *flux2_dit_whole(const dt_dit *d) { return dt_dit_get_ops(d) == &whole_ops ? dt_dit_model(d) : NULL; }

int flux2_dit_read_inputs(const st_file *in, dt_dit *d, int kv_refs, int no_mask, dt_dit_inputs *fi) {
    (void)no_mask;
    const flux2_config *c = flux2_dit_config(d);
    const char *inputs = st_path(in);
    const st_tensor *t_iid, *t_tid;
    int64_t tt, cj, r, cc;
    const st_tensor *t_txt = fi->t_txt;
    const int64_t cin = fi->cin;
    const int64_t n = fi->step.n_img;
    if (dt_dit_input_shape2(t_txt, &tt, &cj)) return -1;
    float *img_ids = fi->owned[3] = dt_dit_input_f32(in, "in.img_ids", 1, &t_iid);
    float *txt_ids = img_ids ? (fi->owned[4] = dt_dit_input_f32(in, "in.txt_ids", 1, &t_tid)) : NULL;
    if (!img_ids || !txt_ids) return -1;
    if (cin != c->in_channels) { dt_set_error("%s: in.hidden_states has %lld channels but the model expects %d", inputs, (long long)cin, c->in_channels); return -1; }
    if (cj != c->joint_dim) { dt_set_error("%s: in.encoder_hidden_states has %lld features but the model expects %d (joint_attention_dim)", inputs, (long long)cj, c->joint_dim); return -1; }
    if (dt_dit_input_shape2(t_iid, &r, &cc) || r != n || cc != c->n_axes) { dt_set_error("%s: in.img_ids must be [1, %lld, %d]", inputs, (long long)n, c->n_axes); return -1; }
    if (dt_dit_input_shape2(t_tid, &r, &cc) || r != tt || cc != c->n_axes) { dt_set_error("%s: in.txt_ids must be [1, %lld, %d]", inputs, (long long)tt, c->n_axes); return -1; }
    const st_tensor *t_ref, *t_rid;
    int64_t nref = 0;
    float *ref = fi->owned[5] = dt_dit_input_f32(in, "in.ref_hidden_states", 0, &t_ref);
    if (ref) {
        float *ref_ids = fi->owned[6] = dt_dit_input_f32(in, "in.ref_ids", 1, &t_rid);
        if (!ref_ids) return -1;
        if (dt_dit_input_shape2(t_ref, &nref, &cc) || cc != c->in_channels || nref > (1 << 24)) { dt_set_error("%s: in.ref_hidden_states must be [1, R, %d]", inputs, c->in_channels); return -1; }
        if (dt_dit_input_shape2(t_rid, &r, &cc) || r != nref || cc != c->n_axes) { dt_set_error("%s: in.ref_ids must be [1, %lld, %d]", inputs, (long long)nref, c->n_axes); return -1; }
        if (dt_dit_set_refs(d, ref, ref_ids, (int)nref, kv_refs)) return -1;
        dt_log(1, "ditrun: %lld reference tokens, %s\n", (long long)nref, kv_refs ? "KV-cached" : "appended");
    } else if (kv_refs) {
        dt_set_error("%s: --kv-refs but no in.ref_hidden_states", inputs);
        return -1;
    }
    fi->step.n_txt = (int)tt;
    fi->step.img_ids = img_ids;
    fi->step.txt_ids = txt_ids;
    fi->out_channels = c->out_channels;
    fi->n_refs = (int)nref;
    fi->ref_tok = ref;
    fi->ref_ids = fi->owned[6];
    snprintf(fi->geometry, sizeof fi->geometry, "FLUX.2 transformer (D=%d, %d double + %d single blocks", c->hidden,
             c->num_layers, c->num_single_layers);
    snprintf(fi->what, sizeof fi->what, "%s", !nref ? "" : kv_refs ? " (KV-cached references)" : " + appended references");
    return 0;
}

int flux2_config_is_flux2(const json *cfg) {
    return json_get(cfg, "num_single_layers") && json_get(cfg, "joint_attention_dim");
}

int flux2_config_describe(const json *cfg, FILE *f) {
    flux2_config c;
    if (flux2_config_parse(cfg, "config.json", &c)) return -1;
    double params = 0;
    double D = c.hidden, F = c.mlp_hidden;
    params += D * c.in_channels + D * c.joint_dim + D * c.tg_channels + D * D + 2 * 6 * D * D + 3 * D * D + 2 * D * D + D * c.out_channels;
    params += c.num_layers * (8 * D * D + 2 * (2 * F * D + D * F) + 4 * c.head_dim);
    params += c.num_single_layers * ((3 * D + 2 * F) * D + D * (D + F) + 2 * c.head_dim);
    fprintf(f, "  geometry     D=%d (%d heads x %d), %d double + %d single blocks, MLP %d, in %d, out %d, text %d\n",
            c.hidden, c.heads, c.head_dim, c.num_layers, c.num_single_layers, c.mlp_hidden, c.in_channels,
            c.out_channels, c.joint_dim);
    fprintf(f, "  rope         axes (");
    for (int a = 0; a < c.n_axes; a++) fprintf(f, "%s%d", a ? "," : "", c.axes[a]);
    fprintf(f, "), theta %g; eps %g\n", c.rope_theta, c.eps);
    fprintf(f, "  parameters   %.4f B\n", params / 1e9);
    return 0;
}

int flux2_config_read(const char *model, flux2_config *c) {
    char *dir = dt_weights_component_dir(model, "transformer");
    if (!dir) return -1;
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    free(dir);
    json *cfg = json_parse_file(p);
    if (!cfg) return -1;
    const char *cls = json_get_str(cfg, "_class_name");
    int rc;
    if (cls && strcmp(cls, "Flux2Transformer2DModel")) {
        dt_set_error("%s: _class_name is '%s'; --lora adapters are written for Flux2Transformer2DModel", p, cls);
        rc = -1;
    } else {
        rc = flux2_config_parse(cfg, p, c);
    }
    json_free(cfg);
    return rc;
}
