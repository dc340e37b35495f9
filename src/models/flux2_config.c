/* flux2_config.c — the FLUX.2-klein transformer's config (diffusers Flux2Transformer2DModel's config.json) and the
 * run-time choices a backend's options make in it; shared by the loader (flux2_load.c), the key layouts
 * (flux2_layouts.c) and the bench. */
#include "flux2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ config */

static int get_pos_int(const json *cfg, const char *what, const char *key, int dflt, int *out) {
    const json *v = json_get(cfg, key);
    if (!v || v->type == JSON_NULL) {
        if (dflt < 0) { dt_set_error("%s: missing '%s'", what, key); return -1; }
        *out = dflt;
        return 0;
    }
    if (v->type != JSON_NUMBER || !v->is_integer || v->integer <= 0 || v->integer > (1 << 20)) {
        dt_set_error("%s: '%s' must be a positive integer", what, key);
        return -1;
    }
    *out = (int)v->integer;
    return 0;
}

int flux2_config_parse(const json *cfg, const char *what, flux2_config *c) {
    memset(c, 0, sizeof *c);
    if (!cfg || cfg->type != JSON_OBJECT) { dt_set_error("%s: config is not a JSON object", what); return -1; }
    int patch = 1;
    if (get_pos_int(cfg, what, "in_channels", -1, &c->in_channels) || get_pos_int(cfg, what, "num_layers", -1, &c->num_layers) ||
        get_pos_int(cfg, what, "num_single_layers", -1, &c->num_single_layers) ||
        get_pos_int(cfg, what, "num_attention_heads", -1, &c->heads) ||
        get_pos_int(cfg, what, "attention_head_dim", -1, &c->head_dim) ||
        get_pos_int(cfg, what, "joint_attention_dim", -1, &c->joint_dim) ||
        get_pos_int(cfg, what, "timestep_guidance_channels", 256, &c->tg_channels) ||
        get_pos_int(cfg, what, "patch_size", 1, &patch))
        return -1;
    if (get_pos_int(cfg, what, "out_channels", c->in_channels, &c->out_channels)) return -1;
    if (patch != 1) { dt_set_error("%s: patch_size %d is not supported (FLUX.2 uses 1)", what, patch); return -1; }
    if (c->tg_channels % 2) { dt_set_error("%s: timestep_guidance_channels must be even", what); return -1; }
    double ratio = json_get_num(cfg, "mlp_ratio", 3.0);
    c->rope_theta = (float)json_get_num(cfg, "rope_theta", 2000.0);
    c->eps = (float)json_get_num(cfg, "eps", 1e-6);
    c->guidance_embeds = json_get_bool(cfg, "guidance_embeds", 0);
    if (c->guidance_embeds) { dt_set_error("%s: guidance_embeds=true (FLUX.2-dev) is not supported; klein has none", what); return -1; }
    if (!(ratio > 0 && ratio < 64) || !(c->rope_theta > 0) || !(c->eps > 0 && c->eps < 1)) {
        dt_set_error("%s: mlp_ratio/rope_theta/eps out of range", what);
        return -1;
    }
    const int64_t hidden = (int64_t)c->heads * c->head_dim;   /* each factor is at most 2^20: no int product */
    if (hidden > FLUX2_MAX_HIDDEN) {
        dt_set_error("%s: num_attention_heads %d x attention_head_dim %d = %lld is over the supported width %d", what,
                     c->heads, c->head_dim, (long long)hidden, FLUX2_MAX_HIDDEN);
        return -1;
    }
    c->hidden = (int)hidden;
    c->mlp_hidden = (int)(c->hidden * ratio);
    if (c->head_dim % 2) { dt_set_error("%s: attention_head_dim must be even", what); return -1; }
    const json *axes = json_get(cfg, "axes_dims_rope");
    if (!axes) { c->n_axes = 4; for (int i = 0; i < 4; i++) c->axes[i] = c->head_dim / 4; }
    else {
        if (axes->type != JSON_ARRAY || axes->len < 1 || axes->len > 8) { dt_set_error("%s: axes_dims_rope must be an array of 1..8 integers", what); return -1; }
        c->n_axes = (int)axes->len;
        int sum = 0;
        for (int i = 0; i < c->n_axes; i++) {
            const json *a = json_at(axes, i);
            if (!a || a->type != JSON_NUMBER || !a->is_integer || a->integer <= 0 || a->integer % 2) {
                dt_set_error("%s: axes_dims_rope[%d] must be a positive even integer", what, i);
                return -1;
            }
            if (a->integer > c->head_dim) {
                dt_set_error("%s: axes_dims_rope[%d] = %lld is larger than attention_head_dim %d", what, i,
                             (long long)a->integer, c->head_dim);
                return -1;
            }
            c->axes[i] = (int)a->integer;
            sum += c->axes[i];
        }
        if (sum != c->head_dim) { dt_set_error("%s: axes_dims_rope sums to %d but attention_head_dim is %d", what, sum, c->head_dim); return -1; }
    }
    return 0;
}

int flux2_runtime_choices(const dt_backend *be, const flux2_load_opts *o, dt_precision linears, flux2_config *c,
                          const char *what) {
    c->attn_fp8 = o->attn_precision == DT_PREC_FP8;   /* --attn-precision fp8: the blocks' attention */
    if (c->attn_fp8 && !be->attention_fp8) {
        dt_set_error("%s: --attn-precision fp8: the %s backend has no fp8 attention%s%s", what, be->name,
                     be->attention_fp8_off ? ": " : "", be->attention_fp8_off ? be->attention_fp8_off : "");
        return -1;
    }
    c->fuse_inputs = linears == DT_PREC_FP8 && !o->fp8_unfused;
    return 0;
}
