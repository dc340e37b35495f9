/* flux2_dit.c — FLUX.2 behind the DiT interface (flux2_dit.h): one ops table for the whole model (flux2.h), one for
 * the model split over ranks (flux2_sp.h). */
#include "flux2_dit.h"

#include <stdio.h>

#include "models/flux2_sp.h"

/* ---- whole ---- */

static int whole_forward(dt_dit *d, const dt_dit_step *s) {
    return flux2_forward(dt_dit_model(d), s->img, s->n_img, dt_dit_step_text(d, s), s->n_txt, s->timestep, s->img_ids,
                         s->txt_ids, s->out, s->trace, s->trace_ud);
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
static void whole_free(void *m) { flux2_free(m); }
static const dt_dit_ops whole_ops = {"flux2", whole_forward, whole_refs, whole_text, whole_text_mat, whole_free};

/* ---- split over ranks ---- */

static int split_forward(dt_dit *d, const dt_dit_step *s) {
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
static void split_free(void *m) { flux2_sp_free(m); }
static const dt_dit_ops split_ops = {"flux2 split", split_forward, split_refs, split_text, split_text_mat, split_free};

dt_dit *flux2_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o) {
    if (o->ranks > 1) {
        flux2_load_opts lo = {o->loras, o->n_loras, o->lora_side};
        flux2_sp_opts so = {o->ranks, {0}, o->n_devices, lo};
        for (int i = 0; i < o->n_devices && i < FLUX2_SP_MAX_RANKS; i++) so.devices[i] = o->devices[i];
        flux2_sp *sp = flux2_sp_load(be, path, &so);
        if (!sp) return NULL;
        if (o->cuda_graph) dt_log(1, "ditrun: note: --cuda-graph is not used with --sequence-parallel (eager)\n");
        return dt_dit_new(&split_ops, sp, flux2_sp_get_config(sp));
    }
    flux2_model *m = flux2_load_ex(be, path, &(flux2_load_opts){o->loras, o->n_loras, o->lora_side});
    if (!m) return NULL;
    flux2_set_graph(m, o->cuda_graph);
    return dt_dit_new(&whole_ops, m, flux2_get_config(m));
}

const flux2_config *flux2_dit_config(const dt_dit *d) { return dt_dit_config(d); }

flux2_model *flux2_dit_whole(const dt_dit *d) { return dt_dit_get_ops(d) == &whole_ops ? dt_dit_model(d) : NULL; }

void flux2_dit_describe(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len) {
    *bytes = 0;
    if (dt_dit_get_ops(d) == &whole_ops) {
        flux2_weight_info(dt_dit_model(d), bytes, fmt, fmt_len);
    } else {
        flux2_sp *sp = dt_dit_model(d);
        snprintf(fmt, fmt_len, "split over %d ranks (%s)", flux2_sp_ranks(sp), flux2_sp_comm_name(sp));
    }
}
