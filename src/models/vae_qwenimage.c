/* vae_qwenimage.c — AutoencoderKLQwenImage decoder for one frame on backend ops:
 *   post_quant_conv 1×1 → conv_in 3×3 → mid block (resnet, single-head attention, resnet)
 *   → up blocks (num_res_blocks+1 resnets; all but the last: nearest 2× + 3×3 conv halving the channels)
 *   → channel RMS norm + SiLU → conv_out 3×3 → clamp to [-1, 1].
 * Resnet: shortcut(x) + conv2(silu(rms2(conv1(silu(rms1(x)))))), shortcut a 1×1 conv when channels change.
 * Every norm is the channel RMS norm (backend channel_rmsnorm). Causal 3-D kernels [o, i, kt, kh, kw] are
 * loaded as their last temporal tap [o, i, kh, kw] (vae_qwenimage.h). Activations are images [C, H·W];
 * the attention works on tokens [H·W, C].
 */
#include "models/vae_qwenimage.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/weights.h"

typedef struct {
    int cin, cout;
    dt_mat n1, n2;                       /* [1, C] F32 gammas */
    dt_conv *conv1, *conv2, *shortcut;   /* shortcut: 1×1, only when cin != cout */
} q_resnet;

typedef struct {
    int cin, cout, n_res;
    q_resnet *res;
    dt_conv *up_conv;                    /* cout -> cout/2 after the 2× upsample; NULL for the last block */
} q_up_block;

struct dt_qvae {
    dt_backend *be;
    dt_weights *w;
    dt_qvae_config cfg;
    int top;                             /* channels of the mid block */
    dt_conv *post_quant, *conv_in, *conv_out;
    q_resnet mid_res[2];
    dt_mat attn_norm;                    /* [1, top] */
    dt_conv *attn_qkv, *attn_proj;       /* 1×1: top -> 3·top, top -> top */
    q_up_block up[DT_QVAE_MAX_BLOCKS];
    dt_mat norm_out;                     /* [1, base_dim·dim_mult[0]] */
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

static int load_gamma(dt_qvae *v, const char *name, int C, dt_mat *dst) {
    char buf[256];
    float *tmp = dt_malloc((size_t)C * sizeof(float));
    snprintf(buf, sizeof buf, "%s.gamma", name);
    int rc = dt_weights_read_f32(v->w, buf, tmp, C);
    if (rc == 0) *dst = dt_param_upload(v->be, tmp, C);
    free(tmp);
    return rc;
}

/* A k×k conv NAME: weight [cout, cin, kt, k, k] (causal 3-D: the last temporal tap is kept) or
 * [cout, cin, k, k] (2-D), bias [cout]. */
static dt_conv *load_conv(dt_qvae *v, const char *name, int cout, int cin, int k) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s.weight", name);
    const st_tensor *t = dt_weights_find(v->w, buf);
    if (!t) { dt_set_error("%s: tensor '%s' not found", dt_weights_path(v->w), buf); return NULL; }
    int is3 = t->ndim == 5 && t->shape[0] == cout && t->shape[1] == cin && t->shape[2] >= 1 && t->shape[2] <= 16 &&
              t->shape[3] == k && t->shape[4] == k;
    int is2 = t->ndim == 4 && t->shape[0] == cout && t->shape[1] == cin && t->shape[2] == k && t->shape[3] == k;
    if (!is3 && !is2) {
        char shp[96] = "";
        for (int i = 0; i < t->ndim && i < ST_MAX_DIMS; i++) {
            size_t l = strlen(shp);
            snprintf(shp + l, sizeof shp - l, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        }
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
    float *bias = dt_malloc((size_t)cout * sizeof(float));
    snprintf(buf, sizeof buf, "%s.bias", name);
    if (dt_weights_read_f32(v->w, buf, bias, cout)) { free(wt); free(bias); return NULL; }
    dt_clear_error();
    dt_conv *c = v->be->conv_create(v->be, wt, bias, cout, cin, k, k / 2);
    free(wt);
    free(bias);
    if (!c && !strcmp(dt_last_error(), "unknown error"))
        dt_set_error("%s: backend could not create conv '%s'", dt_weights_path(v->w), name);
    return c;
}

static int load_resnet(dt_qvae *v, const char *prefix, int cin, int cout, q_resnet *r) {
    char buf[256];
    r->cin = cin;
    r->cout = cout;
    snprintf(buf, sizeof buf, "%s.norm1", prefix);
    if (load_gamma(v, buf, cin, &r->n1)) return -1;
    snprintf(buf, sizeof buf, "%s.conv1", prefix);
    if (!(r->conv1 = load_conv(v, buf, cout, cin, 3))) return -1;
    snprintf(buf, sizeof buf, "%s.norm2", prefix);
    if (load_gamma(v, buf, cout, &r->n2)) return -1;
    snprintf(buf, sizeof buf, "%s.conv2", prefix);
    if (!(r->conv2 = load_conv(v, buf, cout, cout, 3))) return -1;
    if (cin != cout) {
        snprintf(buf, sizeof buf, "%s.conv_shortcut", prefix);
        if (!(r->shortcut = load_conv(v, buf, cout, cin, 1))) return -1;
    }
    return 0;
}

static void free_param(dt_backend *be, dt_mat *m) {
    if (m->data) be->free(be, m);
}

static void free_conv(dt_backend *be, dt_conv *c) {
    if (c) be->conv_destroy(be, c);
}

static void free_resnet(dt_backend *be, q_resnet *r) {
    free_param(be, &r->n1);
    free_param(be, &r->n2);
    free_conv(be, r->conv1);
    free_conv(be, r->conv2);
    free_conv(be, r->shortcut);
}

void dt_qvae_free(dt_qvae *v) {
    if (!v) return;
    dt_backend *be = v->be;
    free_conv(be, v->post_quant);
    free_conv(be, v->conv_in);
    free_conv(be, v->conv_out);
    for (int i = 0; i < 2; i++) free_resnet(be, &v->mid_res[i]);
    free_param(be, &v->attn_norm);
    free_conv(be, v->attn_qkv);
    free_conv(be, v->attn_proj);
    for (int b = 0; b < DT_QVAE_MAX_BLOCKS; b++) {
        if (v->up[b].res) {
            for (int i = 0; i < v->up[b].n_res; i++) free_resnet(be, &v->up[b].res[i]);
            free(v->up[b].res);
        }
        free_conv(be, v->up[b].up_conv);
    }
    free_param(be, &v->norm_out);
    if (v->w) dt_weights_close(v->w);
    free(v);
}

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
    v->top = dims[0];

    if (!(v->post_quant = load_conv(v, "post_quant_conv", c->z_dim, c->z_dim, 1))) goto fail;
    if (!(v->conv_in = load_conv(v, "decoder.conv_in", v->top, c->z_dim, 3))) goto fail;
    for (int i = 0; i < 2; i++) {
        snprintf(buf, sizeof buf, "decoder.mid_block.resnets.%d", i);
        if (load_resnet(v, buf, v->top, v->top, &v->mid_res[i])) goto fail;
    }
    if (load_gamma(v, "decoder.mid_block.attentions.0.norm", v->top, &v->attn_norm)) goto fail;
    if (!(v->attn_qkv = load_conv(v, "decoder.mid_block.attentions.0.to_qkv", 3 * v->top, v->top, 1))) goto fail;
    if (!(v->attn_proj = load_conv(v, "decoder.mid_block.attentions.0.proj", v->top, v->top, 1))) goto fail;
    for (int b = 0; b < c->n_mult; b++) {
        q_up_block *u = &v->up[b];
        u->cin = b > 0 ? dims[b] / 2 : dims[b];   /* the previous block's upsample halved its channels */
        u->cout = dims[b + 1];
        u->n_res = c->num_res_blocks + 1;
        u->res = dt_calloc((size_t)u->n_res, sizeof *u->res);
        for (int i = 0; i < u->n_res; i++) {
            snprintf(buf, sizeof buf, "decoder.up_blocks.%d.resnets.%d", b, i);
            if (load_resnet(v, buf, i == 0 ? u->cin : u->cout, u->cout, &u->res[i])) goto fail;
        }
        if (b < c->n_mult - 1) {
            if (u->cout % 2) { dt_set_error("%s: up block %d has an odd channel count %d", what, b, u->cout); goto fail; }
            snprintf(buf, sizeof buf, "decoder.up_blocks.%d.upsamplers.0.resample.1", b);
            if (!(u->up_conv = load_conv(v, buf, u->cout / 2, u->cout, 3))) goto fail;
        }
    }
    const int last = v->up[c->n_mult - 1].cout;
    if (load_gamma(v, "decoder.norm_out", last, &v->norm_out)) goto fail;
    if (!(v->conv_out = load_conv(v, "decoder.conv_out", 3, last, 3))) goto fail;
    free(dir);
    return v;
fail:
    free(dir);
    dt_qvae_free(v);
    return NULL;
}

const dt_qvae_config *dt_qvae_get_config(const dt_qvae *v) { return &v->cfg; }

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

/* Three rotating image buffers of `cap` elements: x = current activation, t = scratch, y = output. */
typedef struct {
    dt_mat buf[3];
    int x, t, y;
} q_act;

static dt_mat view(const q_act *a, int idx, int64_t rows, int64_t cols) { return dt_mat_reshape(a->buf[idx], rows, cols); }
static void swap_xy(q_act *a) { int s = a->x; a->x = a->y; a->y = s; }

/* x [cin, hw] -> x [cout, hw] */
static void run_resnet(dt_qvae *v, const q_resnet *r, q_act *a, int h, int w) {
    dt_backend *be = v->be;
    const int64_t hw = (int64_t)h * w;
    dt_mat X = view(a, a->x, r->cin, hw), T = view(a, a->t, r->cin, hw), Y = view(a, a->y, r->cout, hw);
    be->channel_rmsnorm(be, T, X, r->n1, 1);
    be->conv2d(be, Y, T, r->conv1, h, w);
    T = view(a, a->t, r->cout, hw);
    be->channel_rmsnorm(be, T, Y, r->n2, 1);
    be->conv2d(be, Y, T, r->conv2, h, w);
    if (r->shortcut) {
        be->conv2d(be, T, X, r->shortcut, h, w);
        be->gated_add(be, Y, dt_mat_null(), T);
    } else {
        be->gated_add(be, Y, dt_mat_null(), X);
    }
    swap_xy(a);
}

/* x [C, hw] += proj(attention of the 1×1-projected q, k, v of rms(x), one head of size C) */
static void run_attention(dt_qvae *v, q_act *a, int C, int64_t hw) {
    dt_backend *be = v->be;
    const dt_dtype act = be->act_dtype;
    dt_mat qkv_c = dt_alloc_or_die(be, 3 * (int64_t)C, hw, act);   /* [3C, hw] */
    dt_mat qkv_t = dt_alloc_or_die(be, hw, 3 * (int64_t)C, act);   /* [hw, 3C] */
    dt_mat o = dt_alloc_or_die(be, hw, C, act);                    /* [hw, C] */
    dt_mat X = view(a, a->x, C, hw), T = view(a, a->t, C, hw), Y = view(a, a->y, C, hw);
    be->channel_rmsnorm(be, T, X, v->attn_norm, 0);
    be->conv2d(be, qkv_c, T, v->attn_qkv, 1, (int)hw);
    be->transpose(be, qkv_t, qkv_c);
    be->attention(be, o, dt_mat_cols(qkv_t, 0, C), dt_mat_cols(qkv_t, C, C), dt_mat_cols(qkv_t, 2 * (int64_t)C, C), 1, 1,
                  C, 1.0f / sqrtf((float)C), dt_mat_null(), 0);
    be->transpose(be, T, o);
    be->conv2d(be, Y, T, v->attn_proj, 1, (int)hw);
    be->gated_add(be, Y, dt_mat_null(), X);
    swap_xy(a);
    be->free(be, &qkv_c);
    be->free(be, &qkv_t);
    be->free(be, &o);
}

int dt_qvae_decode(dt_qvae *v, const float *latent, int H, int W, float *rgb) {
    dt_backend *be = v->be;
    const dt_qvae_config *c = &v->cfg;
    if (H < 1 || W < 1 || (int64_t)H * c->scale_factor > 65536 || (int64_t)W * c->scale_factor > 65536 ||
        (int64_t)H * W > (1LL << 30)) {
        dt_set_error("qwen-image vae decode: invalid latent size %dx%d", W, H);
        return -1;
    }
    /* largest activation (elements) over every stage */
    int64_t hw = (int64_t)H * W, cap = (int64_t)(v->top > c->z_dim ? v->top : c->z_dim) * hw;
    for (int b = 0; b < c->n_mult; b++) {
        const q_up_block *u = &v->up[b];
        int64_t cm = u->cin > u->cout ? u->cin : u->cout;
        if (cm * hw > cap) cap = cm * hw;
        if (u->up_conv) {
            hw *= 4;
            if ((int64_t)u->cout * hw > cap) cap = (int64_t)u->cout * hw;
        }
    }
    if (3 * hw > cap) cap = 3 * hw;

    q_act a = {.x = 0, .t = 1, .y = 2};
    for (int i = 0; i < 3; i++) a.buf[i] = dt_alloc_or_die(be, 1, cap, be->act_dtype);
    int h = H, w = W;
    hw = (int64_t)h * w;

    /* latent -> post_quant_conv -> conv_in */
    dt_mat L = view(&a, a.t, c->z_dim, hw);
    be->upload(be, L, latent);
    be->conv2d(be, view(&a, a.y, c->z_dim, hw), L, v->post_quant, h, w);
    be->conv2d(be, view(&a, a.x, v->top, hw), view(&a, a.y, c->z_dim, hw), v->conv_in, h, w);

    run_resnet(v, &v->mid_res[0], &a, h, w);
    run_attention(v, &a, v->top, hw);
    run_resnet(v, &v->mid_res[1], &a, h, w);

    for (int b = 0; b < c->n_mult; b++) {
        const q_up_block *u = &v->up[b];
        for (int i = 0; i < u->n_res; i++) run_resnet(v, &u->res[i], &a, h, w);
        if (u->up_conv) {
            dt_mat T = view(&a, a.t, u->cout, 4 * (int64_t)h * w);
            be->upsample2x(be, T, view(&a, a.x, u->cout, (int64_t)h * w), h, w);
            h *= 2;
            w *= 2;
            be->conv2d(be, view(&a, a.y, u->cout / 2, (int64_t)h * w), T, u->up_conv, h, w);
            swap_xy(&a);
        }
    }
    hw = (int64_t)h * w;
    const int last = v->up[c->n_mult - 1].cout;
    dt_mat T = view(&a, a.t, last, hw);
    be->channel_rmsnorm(be, T, view(&a, a.x, last, hw), v->norm_out, 1);
    dt_mat Y = view(&a, a.y, 3, hw);
    be->conv2d(be, Y, T, v->conv_out, h, w);
    be->download(be, rgb, Y);
    int rc = be->sync(be);
    for (int i = 0; i < 3; i++) be->free(be, &a.buf[i]);
    for (int64_t i = 0; i < 3 * hw; i++) {
        float f = rgb[i];
        rgb[i] = f < -1.0f ? -1.0f : f > 1.0f ? 1.0f : f;
    }
    return rc;
}
