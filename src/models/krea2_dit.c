/* krea2_dit.c — Krea 2 behind the DiT interface (krea2_dit.h). Its resident text is the host text itself (the
 * forward uploads it each step); it takes no references. */
#include "krea2_dit.h"

#include <stdlib.h>

static int k2_forward(dt_dit *d, const dt_dit_step *s) {
    krea2_set_block_cache(dt_dit_model(d), s->fbc);
    int rc = krea2_forward(dt_dit_model(d), s->img, s->n_img, dt_dit_step_text(d, s), s->n_txt, s->timestep, s->pos,
                           s->mask, s->out, s->trace, s->trace_ud);
    krea2_set_block_cache(dt_dit_model(d), NULL);
    return rc;
}
static int k2_forward_pair(dt_dit *d, const dt_dit_step *s0, const dt_dit_step *s1) {
    krea2_seq q[2];
    for (int i = 0; i < 2; i++) {
        const dt_dit_step *s = i ? s1 : s0;
        q[i] = (krea2_seq){.img = s->img, .txt = dt_dit_step_text(d, s), .n_txt = s->n_txt, .pos = s->pos,
                           .mask = s->mask, .out = s->out};
    }
    return krea2_forward_batch(dt_dit_model(d), q, 2, s0->n_img, s0->timestep);
}
static int k2_text(dt_dit *d, int slot, const float *txt, int t) {
    (void)d; (void)slot;
    if (!txt || t <= 0) { dt_set_error("krea2: resident text needs host features and at least one token"); return -1; }
    return 0;
}
static void k2_info(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len) {
    krea2_weight_info(dt_dit_model(d), bytes, fmt, fmt_len);
}
static void k2_free(void *m) { krea2_free(m); }
static void k2_cancel(dt_dit *d, const volatile int *flag) { krea2_set_cancel(dt_dit_model(d), flag); }
static const dt_dit_ops k2_ops = {"krea2", k2_forward, NULL, k2_text, NULL, k2_info, k2_free, k2_cancel,
                                   k2_forward_pair};

dt_dit *krea2_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o) {
    if (o->ranks > 1) { dt_set_error("%s: Krea 2 has no split forward (--sequence-parallel)", path); return NULL; }
    krea2_model *m = krea2_load_ex(be, path, &(krea2_load_opts){o->loras, o->n_loras, o->lora_side, o->precision,
                                                                       o->attn_precision, o->fp8_unfused});
    if (!m) return NULL;
    krea2_set_graph(m, o->cuda_graph);
    return dt_dit_new(&k2_ops, m, krea2_get_config(m));
}

const krea2_config *krea2_dit_config(const dt_dit *d) { return dt_dit_config(d); }
krea2_model *krea2_dit_model(const dt_dit *d) { return dt_dit_model(d); }

int krea2_dit_read_inputs(const st_file *in, dt_dit *d, int kv_refs, int no_mask, dt_dit_inputs *fi) {
    const krea2_config *c = krea2_dit_config(d);
    const char *inputs = st_path(in);
    const st_tensor *t_pos, *t_mask;
    const st_tensor *t_txt = fi->t_txt;
    const int64_t cin = fi->cin;
    const int64_t n = fi->step.n_img;
    if (kv_refs) { dt_set_error("--kv-refs: Krea 2 takes no reference images"); return -1; }
    /* encoder_hidden_states [1, T, layers, dim], position_ids [T+N, axes], optional mask [1, T] */
    if (t_txt->ndim != 4 || t_txt->shape[0] != 1) { dt_set_error("%s: in.encoder_hidden_states must be [1, T, layers, dim] for Krea 2", inputs); return -1; }
    const int64_t tt = t_txt->shape[1];
    float *pos = fi->owned[3] = dt_dit_input_f32(in, "in.position_ids", 1, &t_pos);
    if (!pos) return -1;
    if (!no_mask && (t_mask = st_find(in, "in.encoder_attention_mask"))) {
        if (t_mask->numel != tt) { dt_set_error("%s: in.encoder_attention_mask must have %lld entries", inputs, (long long)tt); return -1; }
        float *mf = st_to_f32(t_mask);
        fi->owned_mask = dt_malloc((size_t)tt);
        for (int64_t i = 0; i < tt; i++) fi->owned_mask[i] = mf[i] != 0;
        free(mf);
    }
    if (cin != c->in_channels) { dt_set_error("%s: in.hidden_states has %lld channels but the model expects %d", inputs, (long long)cin, c->in_channels); return -1; }
    if (t_txt->shape[2] != c->text_layers || t_txt->shape[3] != c->text_dim) {
        dt_set_error("%s: in.encoder_hidden_states must be [1, T, %d, %d]", inputs, c->text_layers, c->text_dim);
        return -1;
    }
    if (t_pos->numel != (tt + n) * c->n_axes) { dt_set_error("%s: in.position_ids must be [%lld, %d]", inputs, (long long)(tt + n), c->n_axes); return -1; }
    fi->step.n_txt = (int)tt;
    fi->step.pos = pos;
    fi->step.mask = fi->owned_mask;
    fi->out_channels = c->out_channels;
    snprintf(fi->geometry, sizeof fi->geometry, "Krea 2 transformer (D=%d, %d blocks, %d/%d heads", c->hidden,
             c->num_layers, c->heads, c->kv_heads);
    snprintf(fi->what, sizeof fi->what, "%s", fi->owned_mask ? " (text mask)" : "");
    return 0;
}

int krea2_config_describe(const json *cfg, FILE *f) {
    krea2_config c;
    if (krea2_config_parse(cfg, "config.json", &c)) return -1;
    fprintf(f, "  geometry     D=%d (%d heads x %d, %d kv), %d blocks, MLP %d, in %d, text %d x %d layers\n", c.hidden,
            c.heads, c.head_dim, c.kv_heads, c.num_layers, c.intermediate, c.in_channels, c.text_dim, c.text_layers);
    return 0;
}
