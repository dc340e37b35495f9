/* vae_flux2.c — AutoencoderKLFlux2 decoder on backend ops (diffusers autoencoder_kl_flux2.py):
 *   post_quant_conv 1×1 → conv_in 3×3 → mid block (resnet, single-head attention, resnet)
 *   → up blocks (reversed channels, layers_per_block+1 resnets, nearest 2× + conv except the last)
 *   → GroupNorm + SiLU → conv_out.
 * Every GroupNorm uses eps 1e-6 (diffusers Decoder: resnet_eps, attention norm and conv_norm_out).
 * Activations are images [C, H·W] (channel-major); the attention works on tokens [H·W, C].
 * The walk, resnets and norms are the VAE decoders' shared ones (vae_decoder.c); this file loads the weights
 * (GroupNorms, convs in PyTorch or MLX layout, the attention's Linears) and runs the attention, which the
 * encoder (vae_flux2_encoder.c) shares through vae_flux2_internal.h.
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

/* kl: the folder is an AutoencoderKL (no latent batch norm, scaling and shift factors; vae_kl.h). */
static int parse_config(const json *j, const char *what, int kl, dt_vae_config *c) {
    memset(c, 0, sizeof *c);
    if (!j || j->type != JSON_OBJECT) {
        dt_set_error("%s: config.json is missing or not an object (the VAE geometry comes from it)", what);
        return -1;
    }
    const char *cls = json_get_str(j, "_class_name");
    if (kl && cls && strcmp(cls, "AutoencoderKL") != 0) {
        dt_set_error("%s: VAE class '%s' is not AutoencoderKL", what, cls);
        return -1;
    }
    if (!kl && cls && strcmp(cls, "AutoencoderKLFlux2") != 0)
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
    c->batch_norm = !kl;
    c->scaling_factor = kl ? (float)json_get_num(j, "scaling_factor", 0.18215) : 1.0f;   /* diffusers' defaults */
    c->shift_factor = kl ? (float)json_get_num(j, "shift_factor", 0.0) : 0.0f;             /* null: none */
    if (!(c->scaling_factor > 0.0f) || !isfinite(c->shift_factor)) {
        dt_set_error("%s: scaling_factor must be positive and shift_factor finite", what);
        return -1;
    }
    c->patch = kl ? 1 : 2;   /* AutoencoderKL has no patchified latent: its transformer patchifies */
    const json *ps = kl ? NULL : json_get(j, "patch_size");
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
    /* sample_size: an integer or [h, w] (diffusers takes the first); the class default 1024 */
    const json *ss = json_get(j, "sample_size");
    if (ss && ss->type == JSON_ARRAY && ss->len >= 1) ss = json_at(ss, 0);
    c->sample_size = 1024;
    if (ss && ss->type == JSON_NUMBER && ss->is_integer && ss->integer >= 1 && ss->integer <= 65536)
        c->sample_size = (int)ss->integer;
    return 0;
}

/* ---------------- weight loading ---------------- */

int vae_load_gnorm(dt_vae *v, const char *name, int C, vae_norm *g) {
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
        char shp[96];
        vae_shape_str(t, shp, sizeof shp);
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
    return vae_conv_create(v->be, v->w, name, wt, cout, cin, k, rows);
}

dt_linear *vae_load_linear(dt_vae *v, const char *name, int C) {
    dt_linear_src src;
    if (dt_weights_linear(v->w, name, C, C, 1, &src)) return NULL;
    dt_clear_error();
    dt_linear *l = v->be->linear_create(v->be, &src);
    if (!l && !strcmp(dt_last_error(), "unknown error")) dt_set_error("%s: backend could not create linear '%s'", dt_weights_path(v->w), name);
    return l;
}

/* vae_loader callbacks: every conv keeps all its rows; norms are GroupNorms */
static dt_conv *loader_conv(void *v, const char *name, int cout, int cin, int k) {
    return vae_load_conv(v, name, cout, cin, k, cout);
}
static int loader_norm(void *v, const char *name, int C, vae_norm *n) { return vae_load_gnorm(v, name, C, n); }

void vae_free_attn(dt_backend *be, attn *a) {
    vae_norm_free(be, &a->norm);
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
    if (v->enc_free) v->enc_free(v);
    vae_decoder_free(be, &v->dec);
    vae_free_attn(be, &v->mid_attn);
    free(v->bn_mean);
    free(v->bn_var);
    if (v->w) dt_weights_close(v->w);
    free(v);
}

int vae_read_config_kind(const char *vae_dir, int kl, dt_vae_config *cfg) {
    char *dir = dt_weights_component_dir(vae_dir, "vae");
    if (!dir) return -1;
    size_t n = strlen(dir) + 16;
    char *path = dt_malloc(n);
    snprintf(path, n, "%s/config.json", dir);
    json *j = json_parse_file(path);
    int rc = j ? parse_config(j, dir, kl, cfg) : -1;
    json_free(j);
    free(path);
    free(dir);
    return rc;
}

int dt_vae_read_config(const char *vae_dir, dt_vae_config *cfg) { return vae_read_config_kind(vae_dir, 0, cfg); }

dt_vae *dt_vae_load(dt_backend *be, const char *vae_dir) { return vae_load_kind(be, vae_dir, 0); }

dt_vae *vae_load_kind(dt_backend *be, const char *vae_dir, int kl) {
    char *dir = dt_weights_component_dir(vae_dir, "vae");
    if (!dir) return NULL;
    dt_vae *v = dt_calloc(1, sizeof *v);
    v->be = be;
    v->ld = (vae_loader){v, loader_conv, loader_norm};
    v->w = dt_weights_open(dir);
    char buf[256];
    if (!v->w) goto fail;
    if (parse_config(dt_weights_config(v->w), dir, kl, &v->cfg)) goto fail;
    const dt_vae_config *c = &v->cfg;
    const int top = c->block_out[c->n_blocks - 1];
    vae_decoder *d = &v->dec;
    d->groups = c->norm_groups;
    d->latent = c->latent_channels;
    d->top = top;
    d->out_channels = c->out_channels;
    d->n_up = c->n_blocks;
    d->mid_attn = (vae_attention){vae_run_attention, c->mid_attention ? &v->mid_attn : NULL};

    /* latent batch-norm statistics (AutoencoderKLFlux2 only) */
    if (c->batch_norm) {
        v->bn_n = c->latent_channels * c->patch * c->patch;
        v->bn_mean = dt_malloc((size_t)v->bn_n * sizeof(float));
        v->bn_var = dt_malloc((size_t)v->bn_n * sizeof(float));
        if (dt_weights_read_f32(v->w, "bn.running_mean", v->bn_mean, v->bn_n)) goto fail;
        if (dt_weights_read_f32(v->w, "bn.running_var", v->bn_var, v->bn_n)) goto fail;
    }

    if (c->post_quant_conv && !(d->post_quant = vae_load_conv(v, "post_quant_conv", c->latent_channels,
                                                          c->latent_channels, 1, c->latent_channels)))
        goto fail;
    if (!(d->conv_in = vae_load_conv(v, "decoder.conv_in", top, c->latent_channels, 3, top))) goto fail;
    if (vae_resnets_load(&v->ld, "decoder.mid_block", 2, top, top, d->mid_res)) goto fail;
    if (c->mid_attention && vae_load_attn(v, "decoder.mid_block", top, &v->mid_attn)) goto fail;
    int prev = top;
    for (int b = 0; b < c->n_blocks; b++) {
        vae_up_block *u = &d->up[b];
        if (vae_up_block_load(&v->ld, b, prev, c->block_out[c->n_blocks - 1 - b], c->layers_per_block + 1, u)) goto fail;
        if (b < c->n_blocks - 1) {
            snprintf(buf, sizeof buf, "decoder.up_blocks.%d.upsamplers.0.conv", b);
            if (!(u->up_conv = vae_load_conv(v, buf, u->cout, u->cout, 3, u->cout))) goto fail;
            u->up_cout = u->cout;
        }
        prev = u->cout;
    }
    if (vae_load_gnorm(v, "decoder.conv_norm_out", c->block_out[0], &d->norm_out)) goto fail;
    if (!(d->conv_out = vae_load_conv(v, "decoder.conv_out", c->out_channels, c->block_out[0], 3, c->out_channels))) goto fail;
    free(dir);
    return v;
fail:
    free(dir);
    dt_vae_free(v);
    return NULL;
}

const dt_vae_config *dt_vae_get_config(const dt_vae *v) { return &v->cfg; }

int dt_vae_set_tiling(dt_vae *v, int enabled, int tile) {
    if (!tile) tile = v->cfg.sample_size;
    if (enabled && vae_tiling_check(dt_weights_path(v->w), tile, v->cfg.scale_factor)) return -1;
    v->tiling = (dt_vae_tiling){enabled, tile};
    return 0;
}

int dt_vae_last_tiled(const dt_vae *v) { return v->last_tiled; }

int64_t dt_vae_decode_act_bytes(const dt_vae_config *c, int tile, int H, int W, int elem) {
    vae_decoder d = {.latent = c->latent_channels, .top = c->block_out[c->n_blocks - 1], .out_channels = c->out_channels,
                     .n_up = c->n_blocks};
    for (int b = 0, prev = d.top; b < c->n_blocks; b++) {   /* the widths dt_vae_load gives the up blocks */
        d.up[b].cin = prev;
        d.up[b].cout = prev = c->block_out[c->n_blocks - 1 - b];
        d.up[b].up_cout = b < c->n_blocks - 1 ? d.up[b].cout : 0;
    }
    const int attn = c->mid_attention ? 4 : 0;   /* q, k, v and the attention output, [hw, top] each */
    const dt_vae_tiling t = {tile > 0, tile};
    return tile > 0 ? vae_decoder_tiled_act_bytes(&d, &t, c->scale_factor, H, W, elem, attn)
                    : vae_decoder_act_bytes(&d, H, W, elem, attn);
}

void dt_vae_bn_stats(const dt_vae *v, const float **mean, const float **var, int *n, float *eps) {
    if (mean) *mean = v->bn_mean;
    if (var) *var = v->bn_var;
    if (n) *n = v->bn_n;
    if (eps) *eps = v->cfg.bn_eps;
}

/* ---------------- forward ---------------- */

/* x [C, hw] += to_out(attention(q, k, v of GN(x) tokens)) with one head of size C. */
void vae_run_attention(const void *weights, dt_backend *be, int groups, vae_act3 *a, int C, int64_t hw) {
    const attn *at = weights;
    dt_mat qkvo[4];                                      /* q, k, v, attention output: [hw, C] each */
    for (int i = 0; i < 4; i++) qkvo[i] = dt_alloc_or_die(be, hw, C, be->act_dtype);
    dt_mat X = vae_view(a, a->x, C, hw), T = vae_view(a, a->t, C, hw);
    dt_mat tokens = vae_view(a, a->y, hw, C);            /* [hw, C] */
    be->group_norm(be, T, X, groups, at->norm.gamma, at->norm.beta, VAE_GN_EPS, 0);
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
    for (int i = 0; i < 4; i++) be->free(be, &qkvo[i]);
}

/* The decoder walk into a float image (rgb) or 8-bit pixels (rgb8), after the latent size check. */
static int vae_decode_to(dt_vae *v, const float *latent, int H, int W, float *rgb, uint8_t *rgb8) {
    const dt_vae_config *c = &v->cfg;
    if (H < 1 || W < 1 || (int64_t)H * c->scale_factor > 65536 || (int64_t)W * c->scale_factor > 65536) {
        dt_set_error("vae decode: invalid latent size %dx%d", W, H);
        return -1;
    }
    if (dt_log_level >= 2) {
        const int elem = (int)dt_dtype_size(v->be->act_dtype), tile = v->tiling.tile ? v->tiling.tile : c->sample_size;
        dt_log(2, "vae: decode activations %.1f MiB untiled, %.1f MiB in %d px tiles%s\n",
               dt_vae_decode_act_bytes(c, 0, H, W, elem) / 1048576.0, dt_vae_decode_act_bytes(c, tile, H, W, elem) / 1048576.0,
               tile, v->tiling.enabled ? "" : " (--vae-tiling)");
    }
    return vae_decoder_run_tiled(v->be, &v->dec, &v->tiling, c->scale_factor, latent, H, W, rgb, rgb8, &v->last_tiled);
}

int dt_vae_decode(dt_vae *v, const float *latent, int H, int W, float *rgb) {
    return vae_decode_to(v, latent, H, W, rgb, NULL);
}

int dt_vae_decode_rgb8(dt_vae *v, const float *latent, int H, int W, uint8_t *rgb8) {
    return vae_decode_to(v, latent, H, W, NULL, rgb8);
}

void dt_vae_postprocess(const float *x, int H, int W, float *img01, uint8_t *u8) {
    dt_image_planes_u8(x, (size_t)H * (size_t)W, u8, img01);
}
