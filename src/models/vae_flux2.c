/* vae_flux2.c — AutoencoderKLFlux2 decoder on backend ops (diffusers autoencoder_kl_flux2.py):
 *   post_quant_conv 1×1 → conv_in 3×3 → mid block (resnet, single-head attention, resnet)
 *   → up blocks (reversed channels, layers_per_block+1 resnets, nearest 2× + conv except the last)
 *   → GroupNorm + SiLU → conv_out.
 * Every GroupNorm uses eps 1e-6 (diffusers Decoder: resnet_eps, attention norm and conv_norm_out).
 * Activations are images [C, H·W] (channel-major); the attention works on tokens [H·W, C].
 * The blocks shared with the encoder (resnet, attention, GroupNorm, conv loading) are defined here and
 * declared in vae_flux2_internal.h; the encoder itself is vae_flux2_encoder.c.
 */
#include "models/vae_flux2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/weights.h"
#include "models/vae_flux2_internal.h"

/* ---------------- config ---------------- */

static int parse_config(const json *j, const char *what, dt_vae_config *c) {
    memset(c, 0, sizeof *c);
    if (!j || j->type != JSON_OBJECT) {
        dt_set_error("%s: config.json is missing or not an object (the VAE geometry comes from it)", what);
        return -1;
    }
    const char *cls = json_get_str(j, "_class_name");
    if (cls && strcmp(cls, "AutoencoderKLFlux2") != 0)
        dt_log(1, "%s: VAE class '%s', decoding as AutoencoderKLFlux2\n", what, cls);
    const json *boc = json_get(j, "decoder_block_out_channels");
    if (!boc || boc->type != JSON_ARRAY) boc = json_get(j, "block_out_channels");
    if (!boc || boc->type != JSON_ARRAY || boc->len < 1 || boc->len > DT_VAE_MAX_BLOCKS) {
        dt_set_error("%s: block_out_channels must be an array of 1..%d integers", what, DT_VAE_MAX_BLOCKS);
        return -1;
    }
    c->n_blocks = (int)boc->len;
    for (int i = 0; i < c->n_blocks; i++) {
        const json *e = json_at(boc, (size_t)i);
        if (!e || e->type != JSON_NUMBER || !e->is_integer || e->integer < 1 || e->integer > 65536) {
            dt_set_error("%s: block_out_channels[%d] is not a positive integer", what, i);
            return -1;
        }
        c->block_out[i] = (int)e->integer;
    }
    const json *ubt = json_get(j, "up_block_types");
    if (ubt) {
        if (ubt->type != JSON_ARRAY || (int)ubt->len != c->n_blocks) {
            dt_set_error("%s: up_block_types must list %d blocks", what, c->n_blocks);
            return -1;
        }
        for (size_t i = 0; i < ubt->len; i++) {
            const json *e = json_at(ubt, i);
            if (!e || e->type != JSON_STRING || strcmp(e->str, "UpDecoderBlock2D") != 0) {
                dt_set_error("%s: up_block_types[%zu] is not UpDecoderBlock2D (unsupported)", what, i);
                return -1;
            }
        }
    }
    const char *act = json_get_str(j, "act_fn");
    if (act && strcmp(act, "silu") != 0) {
        dt_set_error("%s: act_fn '%s' is not supported (silu only)", what, act);
        return -1;
    }
    int64_t lat = json_get_int(j, "latent_channels", -1), lpb = json_get_int(j, "layers_per_block", -1);
    int64_t grp = json_get_int(j, "norm_num_groups", -1), outc = json_get_int(j, "out_channels", 3);
    if (lat < 1 || lat > 4096) { dt_set_error("%s: latent_channels missing or invalid", what); return -1; }
    if (lpb < 0 || lpb > 64) { dt_set_error("%s: layers_per_block missing or invalid", what); return -1; }
    if (grp < 1 || grp > 4096) { dt_set_error("%s: norm_num_groups missing or invalid", what); return -1; }
    if (outc != 3) { dt_set_error("%s: out_channels %lld (3 expected)", what, (long long)outc); return -1; }
    for (int i = 0; i < c->n_blocks; i++)
        if (c->block_out[i] % grp) {
            dt_set_error("%s: block_out_channels[%d] = %d is not divisible by norm_num_groups %lld", what, i,
                         c->block_out[i], (long long)grp);
            return -1;
        }
    c->latent_channels = (int)lat;
    c->out_channels = (int)outc;
    c->layers_per_block = (int)lpb;
    c->norm_groups = (int)grp;
    c->mid_attention = json_get_bool(j, "mid_block_add_attention", 1);
    c->post_quant_conv = json_get_bool(j, "use_post_quant_conv", 1);
    c->bn_eps = (float)json_get_num(j, "batch_norm_eps", 1e-4);
    if (!(c->bn_eps >= 0.0f)) { dt_set_error("%s: batch_norm_eps invalid", what); return -1; }
    c->patch = 2;
    const json *ps = json_get(j, "patch_size");
    if (ps) {
        int64_t p0 = -1, p1 = -1;
        if (ps->type == JSON_ARRAY && ps->len == 2) {
            p0 = json_at(ps, 0)->is_integer ? json_at(ps, 0)->integer : -1;
            p1 = json_at(ps, 1)->is_integer ? json_at(ps, 1)->integer : -1;
        } else if (ps->type == JSON_NUMBER && ps->is_integer) {
            p0 = p1 = ps->integer;
        }
        if (p0 != p1) {
            dt_set_error("%s: patch_size must be square (got %lld x %lld)", what, (long long)p0, (long long)p1);
            return -1;
        }
        if (p0 < 1 || p0 > 16) {
            dt_set_error("%s: patch_size %lld is out of range (1..16)", what, (long long)p0);
            return -1;
        }
        c->patch = (int)p0;
    }
    c->scale_factor = 1 << (c->n_blocks - 1);
    return 0;
}

/* ---------------- weight loading ---------------- */

int vae_load_gnorm(dt_vae *v, const char *name, int C, gnorm *g) {
    char buf[256];
    float *tmp = dt_malloc((size_t)C * sizeof(float));
    snprintf(buf, sizeof buf, "%s.weight", name);
    if (dt_weights_read_f32(v->w, buf, tmp, C)) { free(tmp); return -1; }
    g->gamma = dt_param_upload(v->be, tmp, C);
    snprintf(buf, sizeof buf, "%s.bias", name);
    if (dt_weights_read_f32(v->w, buf, tmp, C)) { free(tmp); return -1; }
    g->beta = dt_param_upload(v->be, tmp, C);
    free(tmp);
    return 0;
}

void vae_free_gnorm(dt_backend *be, gnorm *g) {
    if (g->gamma.data) be->free(be, &g->gamma);
    if (g->beta.data) be->free(be, &g->beta);
}

/* A k×k conv NAME with weight [cout, cin, k, k] (PyTorch) or [cout, k, k, cin] (MLX) and bias [cout]; the first
 * `rows` output channels are kept. */
dt_conv *vae_load_conv(dt_vae *v, const char *name, int cout, int cin, int k, int rows) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s.weight", name);
    const st_tensor *t = dt_weights_find(v->w, buf);
    if (!t) { dt_set_error("%s: tensor '%s' not found", dt_weights_path(v->w), buf); return NULL; }
    int pt = t->ndim == 4 && t->shape[0] == cout && t->shape[1] == cin && t->shape[2] == k && t->shape[3] == k;
    int mlx = t->ndim == 4 && t->shape[0] == cout && t->shape[1] == k && t->shape[2] == k && t->shape[3] == cin;
    if (!pt && !mlx) {
        char shp[96] = "";
        for (int i = 0; i < t->ndim && i < ST_MAX_DIMS; i++) {
            size_t l = strlen(shp);
            snprintf(shp + l, sizeof shp - l, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        }
        dt_set_error("%s: conv '%s' has shape [%s], expected [%d, %d, %d, %d] or MLX [%d, %d, %d, %d]", t->file, buf,
                     shp, cout, cin, k, k, cout, k, k, cin);
        return NULL;
    }
    /* 1×1 convs have the same memory order in both layouts; cin == k is ambiguous by shape alone:
     * both take the layout seen on the other convs of the file (PyTorch by default). */
    int layout;
    if ((pt && mlx) || k == 1) layout = v->conv_layout ? v->conv_layout : 1;
    else layout = pt ? 1 : 2;
    if (!(pt && mlx) && k > 1) {
        if (v->conv_layout && v->conv_layout != layout) {
            dt_set_error("%s: conv '%s' mixes PyTorch and MLX weight layouts in one file", t->file, buf);
            return NULL;
        }
        v->conv_layout = layout;
    }
    const size_t n = (size_t)cout * cin * k * k;
    float *wt = dt_malloc(n * sizeof(float));
    if (dt_weights_read_f32(v->w, buf, wt, (int64_t)n)) { free(wt); return NULL; }
    if (layout == 2 && k > 1) {   /* [o, kh, kw, i] -> [o, i, kh, kw] */
        float *p = dt_malloc(n * sizeof(float));
        for (int o = 0; o < cout; o++)
            for (int y = 0; y < k; y++)
                for (int x = 0; x < k; x++)
                    for (int i = 0; i < cin; i++)
                        p[(((size_t)o * cin + i) * k + y) * k + x] = wt[(((size_t)o * k + y) * k + x) * cin + i];
        free(wt);
        wt = p;
    }
    float *bias = dt_malloc((size_t)cout * sizeof(float));
    snprintf(buf, sizeof buf, "%s.bias", name);
    if (dt_weights_read_f32(v->w, buf, bias, cout)) { free(wt); free(bias); return NULL; }
    dt_clear_error();
    if (rows < 1 || rows > cout) rows = cout;
    dt_conv *c = v->be->conv_create(v->be, wt, bias, rows, cin, k, k / 2);   /* rows are the leading [rows, cin·k·k] */
    free(wt);
    free(bias);
    if (!c && !strcmp(dt_last_error(), "unknown error")) dt_set_error("%s: backend could not create conv '%s'", dt_weights_path(v->w), name);
    return c;
}

dt_linear *vae_load_linear(dt_vae *v, const char *name, int C) {
    dt_linear_src src;
    if (dt_weights_linear(v->w, name, C, C, 1, &src)) return NULL;
    dt_clear_error();
    dt_linear *l = v->be->linear_create(v->be, &src);
    if (!l && !strcmp(dt_last_error(), "unknown error")) dt_set_error("%s: backend could not create linear '%s'", dt_weights_path(v->w), name);
    return l;
}

int vae_load_resnet(dt_vae *v, const char *prefix, int cin, int cout, resnet *r) {
    char buf[256];
    r->cin = cin;
    r->cout = cout;
    snprintf(buf, sizeof buf, "%s.norm1", prefix);
    if (vae_load_gnorm(v, buf, cin, &r->n1)) return -1;
    snprintf(buf, sizeof buf, "%s.conv1", prefix);
    if (!(r->conv1 = vae_load_conv(v, buf, cout, cin, 3, cout))) return -1;
    snprintf(buf, sizeof buf, "%s.norm2", prefix);
    if (vae_load_gnorm(v, buf, cout, &r->n2)) return -1;
    snprintf(buf, sizeof buf, "%s.conv2", prefix);
    if (!(r->conv2 = vae_load_conv(v, buf, cout, cout, 3, cout))) return -1;
    if (cin != cout) {
        snprintf(buf, sizeof buf, "%s.conv_shortcut", prefix);
        if (!(r->shortcut = vae_load_conv(v, buf, cout, cin, 1, cout))) return -1;
    }
    return 0;
}

void vae_free_resnet(dt_backend *be, resnet *r) {
    vae_free_gnorm(be, &r->n1);
    vae_free_gnorm(be, &r->n2);
    if (r->conv1) be->conv_destroy(be, r->conv1);
    if (r->conv2) be->conv_destroy(be, r->conv2);
    if (r->shortcut) be->conv_destroy(be, r->shortcut);
}

void vae_free_attn(dt_backend *be, attn *a) {
    vae_free_gnorm(be, &a->norm);
    dt_linear *ls[4] = {a->q, a->k, a->v, a->o};
    for (int i = 0; i < 4; i++)
        if (ls[i]) be->linear_destroy(be, ls[i]);
}

int vae_load_attn(dt_vae *v, const char *prefix, int C, attn *a) {
    char buf[256], obuf[256];
    snprintf(buf, sizeof buf, "%s.attentions.0.group_norm", prefix);
    if (vae_load_gnorm(v, buf, C, &a->norm)) return -1;
    const char *names[3] = {"to_q", "to_k", "to_v"};
    dt_linear **dst[3] = {&a->q, &a->k, &a->v};
    for (int i = 0; i < 3; i++) {
        snprintf(buf, sizeof buf, "%s.attentions.0.%s", prefix, names[i]);
        if (!(*dst[i] = vae_load_linear(v, buf, C))) return -1;
    }
    snprintf(obuf, sizeof obuf, "%s.attentions.0.to_out.0.weight", prefix);
    snprintf(buf, sizeof buf, dt_weights_find(v->w, obuf) ? "%s.attentions.0.to_out.0" : "%s.attentions.0.to_out", prefix);
    return (a->o = vae_load_linear(v, buf, C)) ? 0 : -1;
}

void dt_vae_free(dt_vae *v) {
    if (!v) return;
    dt_backend *be = v->be;
    vae_encoder_free(v);
    if (v->post_quant) be->conv_destroy(be, v->post_quant);
    if (v->conv_in) be->conv_destroy(be, v->conv_in);
    if (v->conv_out) be->conv_destroy(be, v->conv_out);
    for (int i = 0; i < 2; i++) vae_free_resnet(be, &v->mid_res[i]);
    vae_free_attn(be, &v->mid_attn);
    for (int b = 0; b < DT_VAE_MAX_BLOCKS; b++) {
        if (v->up[b].res) {
            for (int i = 0; i < v->up[b].n_res; i++) vae_free_resnet(be, &v->up[b].res[i]);
            free(v->up[b].res);
        }
        if (v->up[b].up_conv) be->conv_destroy(be, v->up[b].up_conv);
    }
    vae_free_gnorm(be, &v->norm_out);
    free(v->bn_mean);
    free(v->bn_var);
    if (v->w) dt_weights_close(v->w);
    free(v);
}

int dt_vae_read_config(const char *vae_dir, dt_vae_config *cfg) {
    char *dir = dt_weights_component_dir(vae_dir, "vae");
    if (!dir) return -1;
    size_t n = strlen(dir) + 16;
    char *path = dt_malloc(n);
    snprintf(path, n, "%s/config.json", dir);
    json *j = json_parse_file(path);
    int rc = j ? parse_config(j, dir, cfg) : -1;
    json_free(j);
    free(path);
    free(dir);
    return rc;
}

dt_vae *dt_vae_load(dt_backend *be, const char *vae_dir) {
    char *dir = dt_weights_component_dir(vae_dir, "vae");
    if (!dir) return NULL;
    dt_vae *v = dt_calloc(1, sizeof *v);
    v->be = be;
    v->w = dt_weights_open(dir);
    char buf[256];
    if (!v->w) goto fail;
    if (parse_config(dt_weights_config(v->w), dir, &v->cfg)) goto fail;
    const dt_vae_config *c = &v->cfg;
    const int top = c->block_out[c->n_blocks - 1];

    /* latent batch-norm statistics */
    v->bn_n = c->latent_channels * c->patch * c->patch;
    v->bn_mean = dt_malloc((size_t)v->bn_n * sizeof(float));
    v->bn_var = dt_malloc((size_t)v->bn_n * sizeof(float));
    if (dt_weights_read_f32(v->w, "bn.running_mean", v->bn_mean, v->bn_n)) goto fail;
    if (dt_weights_read_f32(v->w, "bn.running_var", v->bn_var, v->bn_n)) goto fail;

    if (c->post_quant_conv && !(v->post_quant = vae_load_conv(v, "post_quant_conv", c->latent_channels,
                                                          c->latent_channels, 1, c->latent_channels)))
        goto fail;
    if (!(v->conv_in = vae_load_conv(v, "decoder.conv_in", top, c->latent_channels, 3, top))) goto fail;
    for (int i = 0; i < 2; i++) {
        snprintf(buf, sizeof buf, "decoder.mid_block.resnets.%d", i);
        if (vae_load_resnet(v, buf, top, top, &v->mid_res[i])) goto fail;
    }
    if (c->mid_attention && vae_load_attn(v, "decoder.mid_block", top, &v->mid_attn)) goto fail;
    int prev = top;
    for (int b = 0; b < c->n_blocks; b++) {
        up_block *u = &v->up[b];
        u->cin = prev;
        u->cout = c->block_out[c->n_blocks - 1 - b];
        u->n_res = c->layers_per_block + 1;
        u->res = dt_calloc((size_t)u->n_res, sizeof *u->res);
        for (int i = 0; i < u->n_res; i++) {
            snprintf(buf, sizeof buf, "decoder.up_blocks.%d.resnets.%d", b, i);
            if (vae_load_resnet(v, buf, i == 0 ? u->cin : u->cout, u->cout, &u->res[i])) goto fail;
        }
        if (b < c->n_blocks - 1) {
            snprintf(buf, sizeof buf, "decoder.up_blocks.%d.upsamplers.0.conv", b);
            if (!(u->up_conv = vae_load_conv(v, buf, u->cout, u->cout, 3, u->cout))) goto fail;
        }
        prev = u->cout;
    }
    if (vae_load_gnorm(v, "decoder.conv_norm_out", c->block_out[0], &v->norm_out)) goto fail;
    if (!(v->conv_out = vae_load_conv(v, "decoder.conv_out", c->out_channels, c->block_out[0], 3, c->out_channels))) goto fail;
    free(dir);
    return v;
fail:
    free(dir);
    dt_vae_free(v);
    return NULL;
}

const dt_vae_config *dt_vae_get_config(const dt_vae *v) { return &v->cfg; }

void dt_vae_bn_stats(const dt_vae *v, const float **mean, const float **var, int *n, float *eps) {
    if (mean) *mean = v->bn_mean;
    if (var) *var = v->bn_var;
    if (n) *n = v->bn_n;
    if (eps) *eps = v->cfg.bn_eps;
}

/* ---------------- forward ---------------- */

dt_mat vae_view(const vae_act3 *a, int idx, int64_t rows, int64_t cols) {
    return dt_mat_reshape(a->buf[idx], rows, cols);
}

void vae_swap_xy(vae_act3 *a) { int s = a->x; a->x = a->y; a->y = s; }

/* x [cin, hw] -> x [cout, hw]:  out = shortcut(x) + conv2(silu(gn2(conv1(silu(gn1(x)))))) */
void vae_run_resnet(dt_vae *v, const resnet *r, vae_act3 *a, int h, int w) {
    dt_backend *be = v->be;
    const int64_t hw = (int64_t)h * w;
    const int G = v->cfg.norm_groups;
    dt_mat X = vae_view(a, a->x, r->cin, hw), T = vae_view(a, a->t, r->cin, hw), Y = vae_view(a, a->y, r->cout, hw);
    be->group_norm(be, T, X, G, r->n1.gamma, r->n1.beta, VAE_GN_EPS, 1);
    be->conv2d(be, Y, T, r->conv1, h, w);
    T = vae_view(a, a->t, r->cout, hw);
    be->group_norm(be, T, Y, G, r->n2.gamma, r->n2.beta, VAE_GN_EPS, 1);
    be->conv2d(be, Y, T, r->conv2, h, w);
    if (r->shortcut) {
        be->conv2d(be, T, X, r->shortcut, h, w);
        be->gated_add(be, Y, dt_mat_null(), T);
    } else {
        be->gated_add(be, Y, dt_mat_null(), X);
    }
    vae_swap_xy(a);
}

/* x [C, hw] += to_out(attention(q, k, v of GN(x) tokens)) with one head of size C. */
void vae_run_attention(dt_vae *v, const attn *at, vae_act3 *a, dt_mat *qkvo, int C, int64_t hw) {
    dt_backend *be = v->be;
    dt_mat X = vae_view(a, a->x, C, hw), T = vae_view(a, a->t, C, hw);
    dt_mat tokens = vae_view(a, a->y, hw, C);            /* [hw, C] */
    be->group_norm(be, T, X, v->cfg.norm_groups, at->norm.gamma, at->norm.beta, VAE_GN_EPS, 0);
    be->transpose(be, tokens, T);
    be->linear(be, qkvo[0], tokens, at->q);
    be->linear(be, qkvo[1], tokens, at->k);
    be->linear(be, qkvo[2], tokens, at->v);
    be->attention(be, qkvo[3], qkvo[0], qkvo[1], qkvo[2], 1, 1, C, 1.0f / sqrtf((float)C), dt_mat_null(), 0);
    dt_mat out = vae_view(a, a->t, hw, C);               /* [hw, C] (GN result no longer needed) */
    be->linear(be, out, qkvo[3], at->o);
    dt_mat back = vae_view(a, a->y, C, hw);
    be->transpose(be, back, out);
    be->gated_add(be, X, dt_mat_null(), back);
}

int dt_vae_decode(dt_vae *v, const float *latent, int H, int W, float *rgb) {
    dt_backend *be = v->be;
    const dt_vae_config *c = &v->cfg;
    const int top = c->block_out[c->n_blocks - 1];
    if (H < 1 || W < 1 || (int64_t)H * c->scale_factor > 65536 || (int64_t)W * c->scale_factor > 65536) {
        dt_set_error("vae decode: invalid latent size %dx%d", W, H);
        return -1;
    }
    /* largest activation (elements) over every stage */
    int64_t hw = (int64_t)H * W, cap = (int64_t)c->latent_channels * hw;
    if ((int64_t)top * hw > cap) cap = (int64_t)top * hw;
    for (int b = 0; b < c->n_blocks; b++) {
        int64_t cm = v->up[b].cin > v->up[b].cout ? v->up[b].cin : v->up[b].cout;
        if (cm * hw > cap) cap = cm * hw;
        if (v->up[b].up_conv) {
            hw *= 4;
            if ((int64_t)v->up[b].cout * hw > cap) cap = (int64_t)v->up[b].cout * hw;
        }
    }
    if ((int64_t)c->out_channels * hw > cap) cap = (int64_t)c->out_channels * hw;

    vae_act3 a = {.x = 0, .t = 1, .y = 2};
    for (int i = 0; i < 3; i++) a.buf[i] = dt_alloc_or_die(be, 1, cap, be->act_dtype);
    int h = H, w = W;
    hw = (int64_t)h * w;

    /* latent -> post_quant_conv -> conv_in */
    dt_mat L = vae_view(&a, a.t, c->latent_channels, hw);
    be->upload(be, L, latent);
    if (v->post_quant) {
        be->conv2d(be, vae_view(&a, a.y, c->latent_channels, hw), L, v->post_quant, h, w);
        L = vae_view(&a, a.y, c->latent_channels, hw);
    }
    be->conv2d(be, vae_view(&a, a.x, top, hw), L, v->conv_in, h, w);

    /* mid block */
    vae_run_resnet(v, &v->mid_res[0], &a, h, w);
    if (c->mid_attention) {
        dt_mat qkvo[4];
        for (int i = 0; i < 4; i++) qkvo[i] = dt_alloc_or_die(be, hw, top, be->act_dtype);
        vae_run_attention(v, &v->mid_attn, &a, qkvo, top, hw);
        for (int i = 0; i < 4; i++) be->free(be, &qkvo[i]);
    }
    vae_run_resnet(v, &v->mid_res[1], &a, h, w);

    /* up blocks */
    for (int b = 0; b < c->n_blocks; b++) {
        const up_block *u = &v->up[b];
        for (int i = 0; i < u->n_res; i++) vae_run_resnet(v, &u->res[i], &a, h, w);
        if (u->up_conv) {
            dt_mat T = vae_view(&a, a.t, u->cout, 4 * (int64_t)h * w);
            be->upsample2x(be, T, vae_view(&a, a.x, u->cout, (int64_t)h * w), h, w);
            h *= 2;
            w *= 2;
            be->conv2d(be, vae_view(&a, a.y, u->cout, (int64_t)h * w), T, u->up_conv, h, w);
            vae_swap_xy(&a);
        }
    }
    hw = (int64_t)h * w;

    /* GroupNorm + SiLU -> conv_out */
    dt_mat T = vae_view(&a, a.t, c->block_out[0], hw);
    be->group_norm(be, T, vae_view(&a, a.x, c->block_out[0], hw), c->norm_groups, v->norm_out.gamma, v->norm_out.beta,
                   VAE_GN_EPS, 1);
    dt_mat Y = vae_view(&a, a.y, c->out_channels, hw);
    be->conv2d(be, Y, T, v->conv_out, h, w);
    be->download(be, rgb, Y);
    int rc = be->sync(be);
    for (int i = 0; i < 3; i++) be->free(be, &a.buf[i]);
    return rc;
}

void dt_vae_postprocess(const float *x, int H, int W, float *img01, uint8_t *u8) {
    const size_t hw = (size_t)H * (size_t)W;
    for (size_t p = 0; p < hw; p++)
        for (int ch = 0; ch < 3; ch++) {
            float f = x[(size_t)ch * hw + p] / 2.0f + 0.5f;
            if (!(f >= 0.0f)) f = 0.0f;   /* NaN -> 0 as well */
            if (f > 1.0f) f = 1.0f;
            if (img01) img01[p * 3 + (size_t)ch] = f;
            if (u8) u8[p * 3 + (size_t)ch] = (uint8_t)nearbyintf(f * 255.0f);
        }
}
