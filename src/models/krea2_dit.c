/* krea2_dit.c — Krea 2 behind the DiT interface (krea2_dit.h). Its resident text is the host text itself (the
 * forward uploads it each step); it takes no references. */
#include "krea2_dit.h"

static int k2_forward(dt_dit *d, const dt_dit_step *s) {
    return krea2_forward(dt_dit_model(d), s->img, s->n_img, dt_dit_step_text(d, s), s->n_txt, s->timestep, s->pos,
                         s->mask, s->out, s->trace, s->trace_ud);
}
static int k2_text(dt_dit *d, int slot, const float *txt, int t) {
    (void)d; (void)slot;
    if (!txt || t <= 0) { dt_set_error("krea2: resident text needs host features and at least one token"); return -1; }
    return 0;
}
static void k2_free(void *m) { krea2_free(m); }
static const dt_dit_ops k2_ops = {"krea2", k2_forward, NULL, k2_text, NULL, k2_free};

dt_dit *krea2_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o) {
    if (o->ranks > 1) { dt_set_error("%s: Krea 2 has no split forward (--sequence-parallel)", path); return NULL; }
    krea2_model *m = krea2_load_ex(be, path, &(krea2_load_opts){o->loras, o->n_loras, o->lora_side});
    if (!m) return NULL;
    return dt_dit_new(&k2_ops, m, krea2_get_config(m));
}

const krea2_config *krea2_dit_config(const dt_dit *d) { return dt_dit_config(d); }
krea2_model *krea2_dit_model(const dt_dit *d) { return dt_dit_model(d); }
