/* zimage_dit.c — Z-Image behind the DiT interface (zimage_dit.h). Its resident text is the host text itself (the
 * forward uploads the caption each step); it takes no references. */
#include "zimage_dit.h"

#include <stdlib.h>

static int zi_forward(dt_dit *d, const dt_dit_step *s) {
    if (s->grid_h < 1 || s->grid_w < 1 || (int64_t)s->grid_h * s->grid_w != s->n_img) {
        dt_set_error("zimage: %d image tokens are not the %dx%d token grid", s->n_img, s->grid_w, s->grid_h);
        return -1;
    }
    zimage_set_block_cache(dt_dit_model(d), s->fbc);
    int rc = zimage_forward(dt_dit_model(d), s->img, s->grid_h, s->grid_w, dt_dit_step_text(d, s), s->n_txt,
                            s->timestep, s->out, s->trace, s->trace_ud);
    zimage_set_block_cache(dt_dit_model(d), NULL);
    return rc;
}
static int zi_text(dt_dit *d, int slot, const float *txt, int t) {
    (void)d; (void)slot;
    if (!txt || t <= 0) { dt_set_error("zimage: resident text needs host features and at least one token"); return -1; }
    return 0;
}
static void zi_info(const dt_dit *d, size_t *bytes, char *fmt, size_t fmt_len) {
    zimage_weight_info(dt_dit_model(d), bytes, fmt, fmt_len);
}
static void zi_free(void *m) { zimage_free(m); }
static void zi_cancel(dt_dit *d, const volatile int *flag) { zimage_set_cancel(dt_dit_model(d), flag); }
static const dt_dit_ops zi_ops = {"zimage", zi_forward, NULL, zi_text, NULL, zi_info, zi_free, zi_cancel, NULL};

dt_dit *zimage_dit_load(dt_backend *be, const char *path, const dt_dit_load_opts *o) {
    if (o->ranks > 1) { dt_set_error("%s: Z-Image has no split forward (--sequence-parallel)", path); return NULL; }
    if (o->cuda_graph) { dt_set_error("%s: Z-Image's forward has no CUDA graph replay yet (--cuda-graph)", path); return NULL; }
    const zimage_load_opts zo = {o->loras, o->n_loras, o->lora_side, o->precision, o->attn_precision, o->fp8_unfused};
    zimage_model *m = zimage_load_ex(be, path, &zo);
    return m ? dt_dit_new(&zi_ops, m, zimage_get_config(m)) : NULL;
}

const zimage_config *zimage_dit_config(const dt_dit *d) { return dt_dit_config(d); }
zimage_model *zimage_dit_model(const dt_dit *d) { return dt_dit_model(d); }

int zimage_dit_read_inputs(const st_file *in, dt_dit *d, int kv_refs, int no_mask, dt_dit_inputs *fi) {
    (void)no_mask;
    const zimage_config *c = zimage_dit_config(d);
    const char *inputs = st_path(in);
    const st_tensor *t_grid;
    int64_t tt, cj;
    if (kv_refs) { dt_set_error("--kv-refs: Z-Image takes no reference images"); return -1; }
    if (dt_dit_input_shape2(fi->t_txt, &tt, &cj)) return -1;
    if (fi->cin != c->patch_channels) {
        dt_set_error("%s: in.hidden_states has %lld channels but the model's image tokens have %d (patch² x in_channels)",
                     inputs, (long long)fi->cin, c->patch_channels);
        return -1;
    }
    if (cj != c->cap_dim) {
        dt_set_error("%s: in.encoder_hidden_states has %lld features but the model expects %d (cap_feat_dim)", inputs,
                     (long long)cj, c->cap_dim);
        return -1;
    }
    float *grid = fi->owned[3] = dt_dit_input_f32(in, "in.grid", 1, &t_grid);
    if (!grid) return -1;
    if (t_grid->numel != 2 || !(grid[0] >= 1 && grid[1] >= 1 && grid[0] <= 65536 && grid[1] <= 65536) ||
        (int64_t)grid[0] * (int64_t)grid[1] != fi->step.n_img) {
        dt_set_error("%s: in.grid must be [grid_h, grid_w] with grid_h x grid_w = %d image tokens", inputs,
                     fi->step.n_img);
        return -1;
    }
    fi->step.n_txt = (int)tt;
    fi->step.grid_h = (int)grid[0];
    fi->step.grid_w = (int)grid[1];
    fi->out_channels = c->patch_channels;
    snprintf(fi->geometry, sizeof fi->geometry, "Z-Image transformer (D=%d, %d + %d refiner and %d joint blocks, %d heads",
             c->dim, c->n_refiner, c->n_refiner, c->n_layers, c->heads);
    fi->what[0] = 0;
    return 0;
}
