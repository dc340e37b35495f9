/* dit.c — the DiT interface's common part (dit.h): the handle, its resident-text slots and the checked calls. */
#include "dit.h"

#include <stdlib.h>

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

int dt_dit_set_refs(dt_dit *d, const float *tokens, const float *ids, int r, int kv_cached) {
    if (!d->ops->set_refs) {
        if (!tokens || r <= 0) return 0;
        dt_set_error("%s: this transformer takes no reference images", d->ops->name);
        return -1;
    }
    return d->ops->set_refs(d, tokens, ids, r, kv_cached);
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
