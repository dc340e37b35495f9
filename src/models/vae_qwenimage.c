/* vae_qwenimage.c — AutoencoderKLQwenImage decoder for one frame on backend ops:
 *   post_quant_conv 1×1 → conv_in 3×3 → mid block (resnet, single-head attention, resnet)
 *   → up blocks (num_res_blocks+1 resnets; all but the last: nearest 2× + 3×3 conv halving the channels)
 *   → channel RMS norm + SiLU → conv_out 3×3 → clamp to [-1, 1].
 * Resnet: shortcut(x) + conv2(silu(rms2(conv1(silu(rms1(x)))))), shortcut a 1×1 conv when channels change.
 * Every norm is the channel RMS norm (backend channel_rmsnorm). Causal 3-D kernels [o, i, kt, kh, kw] are
 * loaded as their last temporal tap [o, i, kh, kw] (vae_qwenimage.h). Activations are images [C, H·W];
 * the attention works on tokens [H·W, C]. The walk, resnets and norms are the VAE decoders' shared ones
 * (vae_decoder.c); this file loads the weights and runs the attention.
 */
#include "models/vae_qwenimage.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/weights.h"
#include "models/vae_decoder.h"
#include "models/vae_tiling.h"

_Static_assert(DT_QVAE_MAX_BLOCKS <= VAE_MAX_UP_BLOCKS, "the shared decoder holds every up block");

typedef struct {
    vae_norm norm;                       /* RMS gamma [1, top] */
    dt_conv *qkv, *proj;                 /* 1×1: top -> 3·top, top -> top */
} q_attn;

struct dt_qvae {
    dt_backend *be;
    dt_weights *w;
    dt_qvae_config cfg;
    vae_decoder dec;                     /* RMS norms (groups 0); each up conv halves the channels */
    q_attn attn;
    dt_vae_tiling tiling;                /* dt_qvae_set_tiling (off by default) */
    int last_tiled;                      /* the last decode ran tiled */
};

/* ---------------- config ---------------- */

static int int_array(const json *j, const char *key, const char *what, int max, int *dst, int *n) {
    const json *a = json_get(j, key);
    if (!a || a->type != JSON_ARRAY || a->len < 1 || (int)a->len > max) {
        dt_set_error("%s: '%s' must be an array of 1..%d positive integers", what, key, max);
        return -1;
    }
    for (size_t i = 0; i < a->len; i++) {
        const json *e = json_at(a, i);
        if (!e || e->type != JSON_NUMBER || !e->is_integer || e->integer < 1 || e->integer > 4096) {
            dt_set_error("%s: %s[%zu] is not a positive integer", what, key, i);
            return -1;
        }
        dst[i] = (int)e->integer;
    }
    *n = (int)a->len;
    return 0;
}

static int float_array(const json *j, const char *key, const char *what, int n, float *dst) {
    const json *a = json_get(j, key);
    if (!a || a->type != JSON_ARRAY || (int)a->len != n) {
        dt_set_error("%s: '%s' must list z_dim = %d numbers", what, key, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const json *e = json_at(a, (size_t)i);
        if (!e || e->type != JSON_NUMBER || !isfinite(e->number)) {
            dt_set_error("%s: %s[%d] is not a finite number", what, key, i);
            return -1;
        }
        dst[i] = (float)e->number;
    }
    return 0;
}

static int parse_config(const json *j, const char *what, dt_qvae_config *c) {
    memset(c, 0, sizeof *c);
    if (!j || j->type != JSON_OBJECT) {
        dt_set_error("%s: config.json is missing or not an object (the VAE geometry comes from it)", what);
        return -1;
    }
    const char *cls = json_get_str(j, "_class_name");
    if (cls && strcmp(cls, "AutoencoderKLQwenImage") != 0) {
        dt_set_error("%s: VAE class '%s' is not AutoencoderKLQwenImage", what, cls);
        return -1;
    }
    int64_t base = json_get_int(j, "base_dim", -1), z = json_get_int(j, "z_dim", -1);
    int64_t nres = json_get_int(j, "num_res_blocks", -1), inc = json_get_int(j, "input_channels", 3);
    if (base < 1 || base > 4096) { dt_set_error("%s: base_dim missing or invalid", what); return -1; }
    if (z < 1 || z > DT_QVAE_MAX_Z) { dt_set_error("%s: z_dim missing or outside 1..%d", what, DT_QVAE_MAX_Z); return -1; }
    if (nres < 0 || nres > 64) { dt_set_error("%s: num_res_blocks missing or invalid", what); return -1; }
    if (inc != 3) { dt_set_error("%s: input_channels %lld (3 expected)", what, (long long)inc); return -1; }
    c->base_dim = (int)base;
    c->z_dim = (int)z;
    c->num_res_blocks = (int)nres;
    if (int_array(j, "dim_mult", what, DT_QVAE_MAX_BLOCKS, c->dim_mult, &c->n_mult)) return -1;
    /* the pipeline's vae_scale_factor is 2^len(temperal_downsample); the decoder upsamples once per block
     * but the last: the two must agree */
    const json *td = json_get(j, "temperal_downsample");
    if (!td || td->type != JSON_ARRAY || (int)td->len != c->n_mult - 1) {
        dt_set_error("%s: temperal_downsample must list len(dim_mult) - 1 = %d flags", what, c->n_mult - 1);
        return -1;
    }
    if (float_array(j, "latents_mean", what, c->z_dim, c->latents_mean) ||
        float_array(j, "latents_std", what, c->z_dim, c->latents_std))
        return -1;
    for (int i = 0; i < c->z_dim; i++)
        if (c->latents_std[i] == 0.0f) { dt_set_error("%s: latents_std[%d] is 0", what, i); return -1; }
    c->scale_factor = 1 << (c->n_mult - 1);
    return 0;
}

int dt_qvae_read_config(const char *vae_dir, dt_qvae_config *c) {
    char *dir = dt_weights_component_dir(vae_dir, "vae");
    if (!dir) return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json *j = json_parse_file(path);
    int rc = j ? parse_config(j, path, c) : -1;
    json_free(j);
    free(dir);
    return rc;
}

/* ---------------- weight loading ---------------- */

/* The RMS norm NAME's gamma [C] (the vae_loader norm). */
static int load_gamma(void *ctx, const char *name, int C, vae_norm *dst) {
    dt_qvae *v = ctx;
    char buf[256];
    float *tmp = dt_malloc((size_t)C * sizeof(float));
    snprintf(buf, sizeof buf, "%s.gamma", name);
    int rc = dt_weights_read_f32(v->w, buf, tmp, C);
    if (rc == 0) dst->gamma = dt_param_upload(v->be, tmp, C);
    free(tmp);
    return rc;
}

/* A k×k conv NAME: weight [cout, cin, kt, k, k] (causal 3-D: the last temporal tap is kept) or
 * [cout, cin, k, k] (2-D), bias [cout] (the vae_loader conv). */
static dt_conv *load_conv(void *ctx, const char *name, int cout, int cin, int k) {
    dt_qvae *v = ctx;
    char buf[256];
    snprintf(buf, sizeof buf, "%s.weight", name);
    const st_tensor *t = dt_weights_find(v->w, buf);
    if (!t) { dt_set_error("%s: tensor '%s' not found", dt_weights_path(v->w), buf); return NULL; }
    int is3 = t->ndim == 5 && t->shape[0] == cout && t->shape[1] == cin && t->shape[2] >= 1 && t->shape[2] <= 16 &&
              t->shape[3] == k && t->shape[4] == k;
    int is2 = t->ndim == 4 && t->shape[0] == cout && t->shape[1] == cin && t->shape[2] == k && t->shape[3] == k;
    if (!is3 && !is2) {
        char shp[96];
        vae_shape_str(t, shp, sizeof shp);
        dt_set_error("%s: conv '%s' has shape [%s], expected [%d, %d, kt, %d, %d] or [%d, %d, %d, %d]", t->file, buf,
                     shp, cout, cin, k, k, cout, cin, k, k);
        return NULL;
    }
    const int kt = is3 ? (int)t->shape[2] : 1;
    const size_t kk = (size_t)k * k, n = (size_t)cout * cin * kk;
    float *all = dt_malloc(n * (size_t)kt * sizeof(float));
    if (dt_weights_read_f32(v->w, buf, all, (int64_t)(n * (size_t)kt))) { free(all); return NULL; }
    float *wt = all;
    if (kt > 1) {   /* [o, i, kt, kh, kw] -> [o, i, kh, kw] at tap kt-1 */
        wt = dt_malloc(n * sizeof(float));
        for (size_t oi = 0; oi < (size_t)cout * cin; oi++)
            memcpy(wt + oi * kk, all + (oi * (size_t)kt + (size_t)(kt - 1)) * kk, kk * sizeof(float));
        free(all);
    }
    return vae_conv_create(v->be, v->w, name, wt, cout, cin, k, cout);
}

void dt_qvae_free(dt_qvae *v) {
    if (!v) return;
    dt_backend *be = v->be;
    vae_decoder_free(be, &v->dec);
    vae_norm_free(be, &v->attn.norm);
    if (v->attn.qkv) be->conv_destroy(be, v->attn.qkv);
    if (v->attn.proj) be->conv_destroy(be, v->attn.proj);
    if (v->w) dt_weights_close(v->w);
    free(v);
}

static void run_attention(const void *weights, dt_backend *be, int groups, vae_act3 *a, int C, int64_t hw);

dt_qvae *dt_qvae_load(dt_backend *be, const char *vae_dir) {
    if (!be->channel_rmsnorm) {
        dt_set_error("backend %s has no channel_rmsnorm op (needed by the Qwen-Image VAE)", be->name);
        return NULL;
    }
    char *dir = dt_weights_component_dir(vae_dir, "vae");
    if (!dir) return NULL;
    dt_qvae *v = dt_calloc(1, sizeof *v);
    v->be = be;
    v->w = dt_weights_open(dir);
    char buf[256], what[4200];
    if (!v->w) goto fail;
    snprintf(what, sizeof what, "%s/config.json", dir);
    if (parse_config(dt_weights_config(v->w), what, &v->cfg)) goto fail;
    const dt_qvae_config *c = &v->cfg;
    /* decoder channels: dims = base·[mult[-1], mult[-1], ..., mult[0]] (dim_mult reversed after its last) */
    int dims[DT_QVAE_MAX_BLOCKS + 1];
    dims[0] = c->base_dim * c->dim_mult[c->n_mult - 1];
    for (int i = 0; i < c->n_mult; i++) dims[i + 1] = c->base_dim * c->dim_mult[c->n_mult - 1 - i];
    const int top = dims[0];
    vae_decoder *d = &v->dec;
    const vae_loader ld = {v, load_conv, load_gamma};
    d->groups = 0;
    d->latent = c->z_dim;
    d->top = top;
    d->out_channels = 3;
    d->n_up = c->n_mult;
    d->mid_attn = (vae_attention){run_attention, &v->attn};

    if (!(d->post_quant = load_conv(v, "post_quant_conv", c->z_dim, c->z_dim, 1))) goto fail;
    if (!(d->conv_in = load_conv(v, "decoder.conv_in", top, c->z_dim, 3))) goto fail;
    if (vae_resnets_load(&ld, "decoder.mid_block", 2, top, top, d->mid_res)) goto fail;
    if (load_gamma(v, "decoder.mid_block.attentions.0.norm", top, &v->attn.norm)) goto fail;
    if (!(v->attn.qkv = load_conv(v, "decoder.mid_block.attentions.0.to_qkv", 3 * top, top, 1))) goto fail;
    if (!(v->attn.proj = load_conv(v, "decoder.mid_block.attentions.0.proj", top, top, 1))) goto fail;
    for (int b = 0; b < c->n_mult; b++) {
        vae_up_block *u = &d->up[b];
        /* the previous block's upsample halved its channels */
        if (vae_up_block_load(&ld, b, b > 0 ? dims[b] / 2 : dims[b], dims[b + 1], c->num_res_blocks + 1, u)) goto fail;
        if (b < c->n_mult - 1) {
            if (u->cout % 2) { dt_set_error("%s: up block %d has an odd channel count %d", what, b, u->cout); goto fail; }
            snprintf(buf, sizeof buf, "decoder.up_blocks.%d.upsamplers.0.resample.1", b);
            if (!(u->up_conv = load_conv(v, buf, u->cout / 2, u->cout, 3))) goto fail;
            u->up_cout = u->cout / 2;
        }
    }
    const int last = d->up[c->n_mult - 1].cout;
    if (load_gamma(v, "decoder.norm_out", last, &d->norm_out)) goto fail;
    if (!(d->conv_out = load_conv(v, "decoder.conv_out", 3, last, 3))) goto fail;
    free(dir);
    return v;
fail:
    free(dir);
    dt_qvae_free(v);
    return NULL;
}

const dt_qvae_config *dt_qvae_get_config(const dt_qvae *v) { return &v->cfg; }

int dt_qvae_set_tiling(dt_qvae *v, int enabled, int tile) {
    if (!tile) tile = DT_QVAE_DEFAULT_TILE;
    if (enabled && vae_tiling_check(dt_weights_path(v->w), tile, v->cfg.scale_factor)) return -1;
    v->tiling = (dt_vae_tiling){enabled, tile};
    return 0;
}

int dt_qvae_last_tiled(const dt_qvae *v) { return v->last_tiled; }

int64_t dt_qvae_decode_act_bytes(const dt_qvae_config *c, int tile, int H, int W, int elem) {
    int dims[DT_QVAE_MAX_BLOCKS + 1];   /* the widths dt_qvae_load gives the up blocks */
    dims[0] = c->base_dim * c->dim_mult[c->n_mult - 1];
    for (int i = 0; i < c->n_mult; i++) dims[i + 1] = c->base_dim * c->dim_mult[c->n_mult - 1 - i];
    vae_decoder d = {.latent = c->z_dim, .top = dims[0], .out_channels = 3, .n_up = c->n_mult};
    for (int b = 0; b < c->n_mult; b++) {
        d.up[b].cin = b > 0 ? dims[b] / 2 : dims[b];
        d.up[b].cout = dims[b + 1];
        d.up[b].up_cout = b < c->n_mult - 1 ? dims[b + 1] / 2 : 0;
    }
    const dt_vae_tiling t = {tile > 0, tile};   /* attention: qkv [3C, hw] and [hw, 3C], out [hw, C] */
    return tile > 0 ? vae_decoder_tiled_act_bytes(&d, &t, c->scale_factor, H, W, elem, 7)
                    : vae_decoder_act_bytes(&d, H, W, elem, 7);
}

double dt_qvae_decode_gflop(const dt_qvae_config *c, int H, int W) {
    double dims[DT_QVAE_MAX_BLOCKS + 1];   /* the widths dt_qvae_load gives the up blocks */
    dims[0] = (double)c->base_dim * c->dim_mult[c->n_mult - 1];
    for (int i = 0; i < c->n_mult; i++) dims[i + 1] = (double)c->base_dim * c->dim_mult[c->n_mult - 1 - i];
    const double z = c->z_dim, top = dims[0];
    double hw = (double)H * W;
    /* post_quant_conv 1x1, conv_in 3x3, mid: two resnets (two 3x3 convs each), attention (qkv 1x1, QK^T and PV, proj) */
    double mac = hw * (z * z + 9 * z * top + 4 * 9 * top * top + 3 * top * top + top * top) + 2 * hw * hw * top;
    for (int b = 0; b < c->n_mult; b++) {
        const double cin = b > 0 ? dims[b] / 2 : dims[b], cout = dims[b + 1];
        mac += hw * 9 * (cin * cout + cout * cout) + (cin != cout ? hw * cin * cout : 0);   /* resnet 0 (+ shortcut) */
        mac += hw * 9 * 2 * cout * cout * c->num_res_blocks;                                  /* the other resnets */
        if (b < c->n_mult - 1) {   /* 2x upsample, then the 3x3 conv cout -> cout / 2 at the new size */
            hw *= 4;
            mac += hw * 9 * cout * (cout / 2);
        }
    }
    mac += hw * 9 * dims[c->n_mult] * 3;   /* conv_out */
    return 2 * mac * 1e-9;
}

void dt_qvae_denormalize(const dt_qvae_config *c, float *x, int64_t hw) {
    for (int ch = 0; ch < c->z_dim; ch++) {
        const float inv_std = 1.0f / c->latents_std[ch], m = c->latents_mean[ch];
        float *row = x + (size_t)ch * (size_t)hw;
        for (int64_t i = 0; i < hw; i++) {
            float t = row[i] / inv_std;   /* separate rounding of the quotient (no FMA under -std=c11) */
            row[i] = t + m;
        }
    }
}

/* ---------------- forward ---------------- */

/* x [C, hw] += proj(attention of the 1×1-projected q, k, v of rms(x), one head of size C) (vae_attention.run). */
static void run_attention(const void *weights, dt_backend *be, int groups, vae_act3 *a, int C, int64_t hw) {
    const q_attn *at = weights;
    (void)groups;   /* the RMS norm */
    const dt_dtype act = be->act_dtype;
    dt_mat qkv_c = dt_alloc_or_die(be, 3 * (int64_t)C, hw, act);   /* [3C, hw] */
    dt_mat qkv_t = dt_alloc_or_die(be, hw, 3 * (int64_t)C, act);   /* [hw, 3C] */
    dt_mat o = dt_alloc_or_die(be, hw, C, act);                    /* [hw, C] */
    dt_mat X = vae_view(a, a->x, C, hw), T = vae_view(a, a->t, C, hw), Y = vae_view(a, a->y, C, hw);
    be->channel_rmsnorm(be, T, X, at->norm.gamma, 0);
    be->conv2d(be, qkv_c, T, at->qkv, 1, (int)hw);
    be->transpose(be, qkv_t, qkv_c);
    be->attention(be, o, dt_mat_cols(qkv_t, 0, C), dt_mat_cols(qkv_t, C, C), dt_mat_cols(qkv_t, 2 * (int64_t)C, C), 1, 1,
                  C, 1.0f / sqrtf((float)C), dt_mat_null(), 0);
    be->transpose(be, T, o);
    be->conv2d(be, Y, T, at->proj, 1, (int)hw);
    be->gated_add(be, Y, dt_mat_null(), X);
    vae_swap_xy(a);
    be->free(be, &qkv_c);
    be->free(be, &qkv_t);
    be->free(be, &o);
}

static int qvae_size_ok(const dt_qvae *v, int H, int W) {
    const dt_qvae_config *c = &v->cfg;
    if (H < 1 || W < 1 || (int64_t)H * c->scale_factor > 65536 || (int64_t)W * c->scale_factor > 65536 ||
        (int64_t)H * W > (1LL << 30)) {
        dt_set_error("qwen-image vae decode: invalid latent size %dx%d", W, H);
        return 0;
    }
    return 1;
}

/* -v: the decode's activation bytes, untiled and tiled (the placement planner's numbers). */
static void log_act(const dt_qvae *v, int H, int W) {
    if (dt_log_level < 2) return;
    const int elem = (int)dt_dtype_size(v->be->act_dtype), tile = v->tiling.tile ? v->tiling.tile : DT_QVAE_DEFAULT_TILE;
    dt_log(2, "vae: decode activations %.1f MiB untiled, %.1f MiB in %d px tiles%s\n",
           dt_qvae_decode_act_bytes(&v->cfg, 0, H, W, elem) / 1048576.0,
           dt_qvae_decode_act_bytes(&v->cfg, tile, H, W, elem) / 1048576.0, tile, v->tiling.enabled ? "" : " (--vae-tiling)");
}

int dt_qvae_decode_rgb8(dt_qvae *v, const float *latent, int H, int W, uint8_t *rgb8) {
    /* (dt_image_u8 clamps after v / 2 + 0.5: the same bytes as the decode's clamp to [-1, 1] first) */
    if (!qvae_size_ok(v, H, W)) return -1;
    log_act(v, H, W);
    return vae_decoder_run_tiled(v->be, &v->dec, &v->tiling, v->cfg.scale_factor, latent, H, W, NULL, rgb8,
                                 &v->last_tiled);
}

int dt_qvae_decode(dt_qvae *v, const float *latent, int H, int W, float *rgb) {
    const dt_qvae_config *c = &v->cfg;
    if (!qvae_size_ok(v, H, W)) return -1;
    log_act(v, H, W);
    int rc = vae_decoder_run_tiled(v->be, &v->dec, &v->tiling, c->scale_factor, latent, H, W, rgb, NULL, &v->last_tiled);
    if (v->last_tiled) return rc;   /* diffusers' tiled_decode returns the blend unclamped */
    const int64_t hw = (int64_t)H * c->scale_factor * W * c->scale_factor;
    for (int64_t i = 0; i < 3 * hw; i++) {
        float f = rgb[i];
        rgb[i] = f < -1.0f ? -1.0f : f > 1.0f ? 1.0f : f;
    }
    return rc;
}
