/* dit.c — the DiT interface's common part (dit.h): the handle, its resident-text slots and the checked calls. */
#include "dit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dt_dit {
    const dt_dit_ops *ops;
    void *m;
    const void *config;
    const void *slot_text[DT_DIT_TEXT_SLOTS];   /* what each slot holds: host text or &key[slot] (NULL: none) */
    char key[DT_DIT_TEXT_SLOTS];                /* the slots' own addresses (device-made text) */
};

dt_dit *dt_dit_new(const dt_dit_ops *ops, void *m, const void *config) {
    dt_dit *d = dt_calloc(1, sizeof *d);
    d->ops = ops;
    d->m = m;
    d->config = config;
    return d;
}

void dt_dit_free(dt_dit *d) {
    if (!d) return;
    d->ops->free(d->m);
    free(d);
}

void *dt_dit_model(const dt_dit *d) { return d->m; }
const dt_dit_ops *dt_dit_get_ops(const dt_dit *d) { return d->ops; }
const void *dt_dit_config(const dt_dit *d) { return d->config; }

static int slot_ok(int slot) {
    if (slot >= 0 && slot < DT_DIT_TEXT_SLOTS) return 1;
    dt_set_error("dit: resident text slot %d (0..%d)", slot, DT_DIT_TEXT_SLOTS - 1);
    return 0;
}

const void *dt_dit_text_key(const dt_dit *d, int slot) { return slot_ok(slot) ? d->slot_text[slot] : NULL; }

const void *dt_dit_slot_key(const dt_dit *d, int slot) { return &d->key[slot]; }

const float *dt_dit_step_text(const dt_dit *d, const dt_dit_step *s) {
    return s->text < 0 ? s->txt : (const float *)dt_dit_text_key(d, s->text);
}

int dt_dit_forward(dt_dit *d, const dt_dit_step *s) {
    if (s->text >= 0 && !dt_dit_text_key(d, s->text)) {
        dt_set_error("dit: resident text slot %d holds no text", s->text);
        return -1;
    }
    return d->ops->forward(d, s);
}

int dt_dit_can_pair(const dt_dit *d) { return d->ops->forward_pair != NULL; }

int dt_dit_forward_pair(dt_dit *d, const dt_dit_step *s0, const dt_dit_step *s1) {
    if (!d->ops->forward_pair) {
        dt_set_error("dit: the %s model runs one sequence per forward (no guidance batch)", d->ops->name);
        return -1;
    }
    if (s0->n_img != s1->n_img || s0->timestep != s1->timestep || s0->fbc || s1->fbc) {
        dt_set_error("dit: a guidance batch needs two steps of one image size and timestep, without a block cache");
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        const dt_dit_step *s = i ? s1 : s0;
        if (s->text >= 0 && !dt_dit_text_key(d, s->text)) {
            dt_set_error("dit: resident text slot %d holds no text", s->text);
            return -1;
        }
    }
    return d->ops->forward_pair(d, s0, s1);
}

int dt_dit_set_refs(dt_dit *d, const float *tokens, const float *ids, int r, int kv_cached) {
    if (!d->ops->set_refs) {
        if (!tokens || r <= 0) return 0;
        dt_set_error("%s: this transformer takes no reference images", d->ops->name);
        return -1;
    }
    return d->ops->set_refs(d, tokens, ids, r, kv_cached);
}

void dt_dit_set_cancel(dt_dit *d, const volatile int *flag) {
    if (d->ops->set_cancel) d->ops->set_cancel(d, flag);
}

void dt_dit_weight_info(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len) {
    d->ops->weight_info(d, bytes, fmt, fmt_len);
}

int dt_dit_text_resident(dt_dit *d, int slot, const float *txt, int t) {
    if (!slot_ok(slot)) return -1;
    d->slot_text[slot] = NULL;
    if (d->ops->text_resident(d, slot, txt, t)) return -1;
    d->slot_text[slot] = txt;
    return 0;
}

int dt_dit_text_resident_mat(dt_dit *d, int slot, dt_mat src) {
    if (!slot_ok(slot)) return -1;
    d->slot_text[slot] = NULL;
    if (!d->ops->text_resident_mat) {
        dt_set_error("%s: resident text from a device matrix is not implemented", d->ops->name);
        return -1;
    }
    if (d->ops->text_resident_mat(d, slot, src)) return -1;
    d->slot_text[slot] = &d->key[slot];
    return 0;
}

void dt_dit_inputs_free(dt_dit_inputs *fi) {
    for (size_t i = 0; i < sizeof fi->owned / sizeof fi->owned[0]; i++) free(fi->owned[i]);
    free(fi->owned_mask);
    memset(fi, 0, sizeof *fi);
}

float *dt_dit_input_f32(const st_file *f, const char *name, int required, const st_tensor **out) {
    const st_tensor *t = st_find(f, name);
    if (!t) {
        if (required) dt_set_error("%s: missing input tensor '%s'", st_path(f), name);
        return NULL;
    }
    *out = t;
    return st_to_f32(t);
}

int dt_dit_input_shape2(const st_tensor *t, int64_t *rows, int64_t *cols) {
    if (t->ndim == 3 && t->shape[0] == 1) { *rows = t->shape[1]; *cols = t->shape[2]; return 0; }
    if (t->ndim == 2) { *rows = t->shape[0]; *cols = t->shape[1]; return 0; }
    dt_set_error("%s: tensor '%s' must be [1, rows, cols] or [rows, cols]", t->file, t->name);
    return -1;
}

int dt_dit_read_common(const st_file *f, dt_dit_inputs *fi) {
    const st_tensor *t_img, *t_ts;
    int64_t n;
    float *img = fi->owned[0] = dt_dit_input_f32(f, "in.hidden_states", 1, &t_img);
    if (!img || dt_dit_input_shape2(t_img, &n, &fi->cin)) return -1;
    float *ts = fi->owned[1] = dt_dit_input_f32(f, "in.timestep", 1, &t_ts);
    if (!ts) return -1;
    if (t_ts->numel != 1) {
        dt_set_error("%s: in.timestep must hold one value (batch 1), has %lld", st_path(f), (long long)t_ts->numel);
        return -1;
    }
    if (!isfinite(ts[0])) { dt_set_error("%s: in.timestep is %g; it must be a finite number", st_path(f), (double)ts[0]); return -1; }
    if (!(fi->owned[2] = dt_dit_input_f32(f, "in.encoder_hidden_states", 1, &fi->t_txt))) return -1;
    fi->step.img = img;
    fi->step.n_img = (int)n;
    fi->step.timestep = ts[0];
    fi->step.txt = fi->owned[2];
    fi->step.text = -1;
    return 0;
}
