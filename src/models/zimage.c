/* zimage.c — Z-Image transformer forward (diffusers ZImageTransformer2DModel) on backend ops.
 *
 * Flow for one image (N tokens on a grid_h x grid_w grid) and one caption (T tokens), D hidden:
 *   t · t_scale -> sinusoid [cos | sin] (256) -> Linear, SiLU, Linear = temb [1, adaln];
 *   every modulated block l: adaLN_l(temb) = [scale_msa | gate_msa | scale_mlp | gate_mlp] [1, 4D] (no SiLU);
 *   image tokens -> x_embedder -> padded to Nx (a multiple of 32) with x_pad_token -> image refiner blocks;
 *   caption -> RMSNorm, Linear -> padded to Tc with cap_pad_token -> caption refiner blocks (no modulation);
 *   joint stream S [Nx + Tc, D] = [image | caption] -> joint blocks -> final layer on the first N rows:
 *   LayerNorm (no affine, eps 1e-6) · (1 + Linear(SiLU(temb))) -> Linear -> [N, p²·C].
 * A block: x += g1 ⊙ RMSNorm₂(Attn(RMSNorm₁(x) · (1 + s1))); x += g2 ⊙ RMSNorm₄(FFN(RMSNorm₃(x) · (1 + s2))), the
 * gates tanh'd; unmodulated blocks drop the scales and gates. The scales and gates are folded into the RMSNorm
 * weights on the host (F32 [1, D] each, per forward), so a block is rmsnorm / linear / attention / gated_add.
 * Attention: to_q/k/v as one stacked GEMM, per-head RMSNorm (eps 1e-5), RoPE on interleaved pairs, SDPA with no
 * mask (one batch item: the reference's pad tokens are attended to), to_out.0. FFN: w2(SiLU(w1 x) ⊙ w3 x).
 * Positions (t, h, w): caption token i (pad tokens included) (1 + i, 0, 0); image token (h, w) (Tc + 1, h, w); image
 * pad tokens (0, 0, 0). Angles per axis in float64 rounded to f32, cos/sin of that f32 angle (torch.polar).
 */
#include "zimage.h"
#include "linear_set.h"
#include "lora.h"
#include "lora_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {                         /* ZImageTransformerBlock */
    dt_linear *qkv, *out;                /* [3D, D] (to_q | to_k | to_v), [D, D] */
    dt_linear *w1, *w2, *w3;             /* [F, D], [D, F], [F, D] */
    dt_linear *ada;                      /* adaLN_modulation.0 [4D, adaln] (modulated blocks; else NULL) */
    dt_mat norm_q, norm_k;               /* [1, hd] F32 (null data without qk_norm) */
    float *norms;                        /* host [4, D]: attention_norm1, attention_norm2, ffn_norm1, ffn_norm2 */
} zi_block;

typedef struct {
    int cap_n, cap_cap;                  /* capacity in tokens: image (padded) and caption (padded) */
    dt_mat emb, th, temb, tsilu;         /* [1, 256], [1, t_mid], [1, adaln], [1, adaln] */
    dt_mat mods;                         /* [n_mod, 4D] the modulated blocks' adaLN outputs */
    dt_mat fscale;                       /* [1, D] the final layer's scale (before the + 1) */
    dt_mat modw;                         /* [4 · n_mod, D] F32: folded norm weights of the modulated blocks */
    dt_mat s;                            /* [Lcap, D] joint stream: image rows, then caption rows */
    dt_mat in_img, in_cap, capn;         /* [Ncap, p²C], [Tcap, cap], [Tcap, cap] */
    dt_mat a, o, qkv, h1, h3;            /* flat scratch: [L, D], [L, D], [L, 3D], [L, F], [L, F] */
    dt_mat outm;                         /* flat [N, p²C] */
    dt_mat cos, sin;                     /* [Lcap, hd] F32 RoPE tables */
    int key[4];                          /* (grid_h, grid_w, Nx, Tc) the tables hold; grid_h 0: none */
    float *host_mod;                     /* host [n_mod · 4D] downloaded mods, then [4 · n_mod · D] folded */
} zi_acts;

struct zimage_model {
    dt_backend *be;
    dt_weights *w;
    zimage_config c;
    dt_linear_set lin;
    size_t weight_bytes;
    dt_linear *x_emb, *t1, *t2, *cap_lin, *final_ada, *final_lin;
    dt_mat cap_norm;                     /* [1, cap_dim] F32 */
    dt_mat x_pad, cap_pad;               /* [1, D] act */
    dt_mat ctxw;                         /* [4 · n_refiner, D] F32: the caption refiners' norm weights */
    zi_block *noise, *ctx, *layers;      /* n_refiner, n_refiner, n_layers */
    zi_acts buf;
    int attn_fp8;                        /* --attn-precision fp8: the blocks' attention on the backend's fp8 kernel */
    dt_precision precision;              /* --precision: the blocks' attention and FFN Linears */
    int fuse_inputs;                     /* fp8 Linears (--precision fp8 or an fp8 file): each RMSNorm feeds its
                                          * Linears directly (rmsnorm_mod_linears: one quantized input for q/k/v,
                                          * one for w1 and w3); 0 with zimage_load_opts.fp8_unfused */
    dt_lora_set *lora;                   /* loaded adapters (NULL: none) */
    int orig;                            /* the file has the original implementation's names (zimage_load_ex) */
    char pfx[32];                        /* and this prefix on every name ("", "model.diffusion_model.", ...) */
    json *inferred;                      /* the config inferred for a file without config.json (NULL: none) */
    const volatile int *cancel;          /* zimage_set_cancel: polled before each block (NULL: none) */
    dt_fbc_branch *fbc;                  /* First Block Cache state of the forwards (zimage_set_block_cache; NULL: none) */
};

/* ------------------------------------------------------------------ config */

static int cfg_int(const json *cfg, const char *what, const char *key, int min, int max, int *out) {
    const json *v = json_get(cfg, key);
    if (!v || v->type == JSON_NULL) { dt_set_error("%s: missing '%s'", what, key); return -1; }
    if (v->type != JSON_NUMBER || !v->is_integer || v->integer < min || v->integer > max) {
        dt_set_error("%s: '%s' must be an integer in %d..%d", what, key, min, max);
        return -1;
    }
    *out = (int)v->integer;
    return 0;
}

/* A number with the reference's default when the key is absent. */
static int cfg_float(const json *cfg, const char *what, const char *key, double dflt, float *out) {
    const json *v = json_get(cfg, key);
    if (!v) { *out = (float)dflt; return 0; }
    if (v->type != JSON_NUMBER || !isfinite(v->number)) { dt_set_error("%s: '%s' must be a number", what, key); return -1; }
    *out = (float)v->number;
    return 0;
}

/* An integer array of exactly n entries, each in min..max, into out. */
static int cfg_ints(const json *cfg, const char *what, const char *key, int n, int min, int max, int *out) {
    const json *a = json_get(cfg, key);
    if (!a || a->type != JSON_ARRAY || (int)a->len != n) {
        dt_set_error("%s: '%s' must be an array of %d integers", what, key, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const json *x = json_at(a, (size_t)i);
        if (!x || x->type != JSON_NUMBER || !x->is_integer || x->integer < min || x->integer > max) {
            dt_set_error("%s: '%s'[%d] must be an integer in %d..%d", what, key, i, min, max);
            return -1;
        }
        out[i] = (int)x->integer;
    }
    return 0;
}

int zimage_config_parse(const json *cfg, const char *what, zimage_config *c) {
    memset(c, 0, sizeof *c);
    if (!cfg || cfg->type != JSON_OBJECT) { dt_set_error("%s: config is not a JSON object", what); return -1; }
    if (cfg_int(cfg, what, "in_channels", 1, 4096, &c->in_channels) ||
        cfg_int(cfg, what, "dim", 2, ZIMAGE_MAX_DIM, &c->dim) || cfg_int(cfg, what, "n_layers", 1, 4096, &c->n_layers) ||
        cfg_int(cfg, what, "n_refiner_layers", 0, 4096, &c->n_refiner) ||
        cfg_int(cfg, what, "n_heads", 1, ZIMAGE_MAX_DIM, &c->heads) ||
        cfg_int(cfg, what, "cap_feat_dim", 1, ZIMAGE_MAX_DIM, &c->cap_dim) ||
        cfg_ints(cfg, what, "axes_dims", ZIMAGE_AXES, 2, 4096, c->axes))
        return -1;
    /* one patch size (the released models: 2 x 2 x 1 frame); video patches (f_patch > 1) are not supported */
    const json *ps = json_get(cfg, "all_patch_size"), *fs = json_get(cfg, "all_f_patch_size");
    int fpatch = 1;
    if (ps || fs) {
        if (!ps || !fs || ps->type != JSON_ARRAY || fs->type != JSON_ARRAY || ps->len != 1 || fs->len != 1) {
            dt_set_error("%s: all_patch_size and all_f_patch_size must each list one size (one patch size supported)",
                         what);
            return -1;
        }
        if (cfg_ints(cfg, what, "all_patch_size", 1, 1, 16, &c->patch) ||
            cfg_ints(cfg, what, "all_f_patch_size", 1, 1, 16, &fpatch))
            return -1;
    } else {
        c->patch = 2;
    }
    if (fpatch != 1) { dt_set_error("%s: all_f_patch_size %d: only single-frame patches (1) are supported", what, fpatch); return -1; }
    const json *sig = json_get(cfg, "siglip_feat_dim");
    if (sig && sig->type != JSON_NULL) {
        dt_set_error("%s: siglip_feat_dim is set (Z-Image Omni): not supported", what);
        return -1;
    }
    if (c->dim % c->heads) {
        dt_set_error("%s: dim %d is not divisible by n_heads %d", what, c->dim, c->heads);
        return -1;
    }
    c->head_dim = c->dim / c->heads;
    int sum = 0;
    for (int i = 0; i < ZIMAGE_AXES; i++) {
        if (c->axes[i] % 2) { dt_set_error("%s: axes_dims[%d] = %d is odd", what, i, c->axes[i]); return -1; }
        sum += c->axes[i];
    }
    if (sum != c->head_dim) {
        dt_set_error("%s: axes_dims sum to %d but the head dim (dim / n_heads = %d / %d) is %d", what, sum, c->dim,
                     c->heads, c->head_dim);
        return -1;
    }
    const json *al = json_get(cfg, "axes_lens");
    if (al) {
        if (cfg_ints(cfg, what, "axes_lens", ZIMAGE_AXES, 1, 1 << 24, c->axes_len)) return -1;
    } else {   /* the reference's default */
        c->axes_len[0] = 1024;
        c->axes_len[1] = c->axes_len[2] = 512;
    }
    const json *kv = json_get(cfg, "n_kv_heads");
    if (kv && kv->type == JSON_NUMBER && kv->is_integer && kv->integer != c->heads)
        dt_log(1, "%s: n_kv_heads %lld differs from n_heads %d; the reference ignores it (K and V have n_heads)\n",
               what, (long long)kv->integer, c->heads);
    c->qk_norm = json_get_bool(cfg, "qk_norm", 1);
    if (cfg_float(cfg, what, "norm_eps", 1e-5, &c->eps) || cfg_float(cfg, what, "rope_theta", 256.0, &c->rope_theta) ||
        cfg_float(cfg, what, "t_scale", 1000.0, &c->t_scale))
        return -1;
    if (!(c->eps > 0 && c->eps < 1) || !(c->rope_theta > 1)) {
        dt_set_error("%s: norm_eps must be in (0, 1) and rope_theta > 1", what);
        return -1;
    }
    c->patch_channels = c->patch * c->patch * c->in_channels;
    c->ffn = (int)((double)c->dim / 3.0 * 8.0);   /* int(dim / 3 * 8), as the reference computes it */
    c->adaln = c->dim < ZIMAGE_ADALN_MAX ? c->dim : ZIMAGE_ADALN_MAX;
    return 0;
}

int zimage_config_describe(const json *cfg, FILE *f) {
    zimage_config c;
    if (zimage_config_parse(cfg, "config.json", &c)) return -1;
    fprintf(f, "  geometry     D=%d (%d heads x %d), %d joint + 2 x %d refiner blocks, FFN %d, patch %d, in %d, "
               "caption %d, rope (%d, %d, %d)\n", c.dim, c.heads, c.head_dim, c.n_layers, c.n_refiner, c.ffn, c.patch,
            c.in_channels, c.cap_dim, c.axes[0], c.axes[1], c.axes[2]);
    return 0;
}

const zimage_config *zimage_get_config(const zimage_model *m) { return &m->c; }

void zimage_weight_info(const zimage_model *m, size_t *bytes, char *fmt, size_t fmt_len) {
    if (bytes) *bytes = m->weight_bytes;
    if (fmt && fmt_len) snprintf(fmt, fmt_len, "%s", m->lin.fmt);
}

/* ------------------------------------------------------------------ loading */

static void free_mat(dt_backend *be, dt_mat *x) {
    if (x->data) be->free(be, x);
    memset(x, 0, sizeof *x);
}

static int load_param(dt_backend *be, const dt_weights *w, const char *name, int64_t n, dt_mat *out) {
    float *p = dt_malloc(sizeof(float) * (size_t)n);
    int rc = dt_weights_read_f32(w, name, p, n);
    if (rc == 0) *out = dt_param_upload(be, p, n);
    free(p);
    return rc;
}

/* A [1, n] tensor NAME as an activation-dtype row (the pad tokens). */
static int load_row(dt_backend *be, const dt_weights *w, const char *name, int64_t n, dt_mat *out) {
    float *p = dt_malloc(sizeof(float) * (size_t)n);
    int rc = dt_weights_read_f32(w, name, p, n);
    if (rc == 0 && be->alloc(be, out, 1, n, be->act_dtype) == 0) be->upload(be, *out, p);
    else rc = -1;
    free(p);
    return rc;
}

/* The file's name of diffusers name d: the prefix, and in the original layout its renames (diffusers'
 * convert_z_image_transformer_checkpoint_to_diffusers, inverted): x_embedder, final_layer, attention.out,
 * attention.q_norm / k_norm (the fused attention.qkv is asked for by that name). Into buf (n bytes). */
static const char *fname(const zimage_model *m, const char *d, char *buf, size_t n) {
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s", d);
    if (m->orig) {
        static const char *const ren[][2] = {{".attention.to_out.0", ".attention.out"}, {".attention.norm_q", ".attention.q_norm"},
                                             {".attention.norm_k", ".attention.k_norm"}};
        char head[64];
        snprintf(head, sizeof head, "all_x_embedder.%d-1", m->c.patch);
        if (!strncmp(tmp, head, strlen(head))) {
            memmove(tmp + 10, tmp + strlen(head), strlen(tmp + strlen(head)) + 1);
            memcpy(tmp, "x_embedder", 10);
        }
        snprintf(head, sizeof head, "all_final_layer.%d-1", m->c.patch);
        if (!strncmp(tmp, head, strlen(head))) {
            memmove(tmp + 11, tmp + strlen(head), strlen(tmp + strlen(head)) + 1);
            memcpy(tmp, "final_layer", 11);
        }
        for (size_t i = 0; i < sizeof ren / sizeof ren[0]; i++) {
            char *at = strstr(tmp, ren[i][0]);
            if (!at) continue;
            char rest[300];
            snprintf(rest, sizeof rest, "%s", at + strlen(ren[i][0]));
            snprintf(at, sizeof tmp - (size_t)(at - tmp), "%s%s", ren[i][1], rest);
        }
    }
    snprintf(buf, n, "%s%s", m->pfx, tmp);
    return buf;
}

/* The layout of weights w: the prefix its names carry (from t_embedder.mlp.0.weight) and whether they are the
 * original implementation's (x_embedder). */
static void layout_of(const dt_weights *w, char *pfx, size_t n, int *orig) {
    static const char *const pre[] = {"", "model.diffusion_model.", "diffusion_model.", "model."};
    char nm[128];
    snprintf(pfx, n, "%s", "");
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++) {
        snprintf(nm, sizeof nm, "%st_embedder.mlp.0.weight", pre[i]);
        if (dt_weights_find(w, nm)) { snprintf(pfx, n, "%s", pre[i]); break; }
    }
    snprintf(nm, sizeof nm, "%sx_embedder.weight", pfx);
    *orig = dt_weights_find(w, nm) != NULL;
}

static void detect_layout(zimage_model *m) {
    char nm[128];
    layout_of(m->w, m->pfx, sizeof m->pfx, &m->orig);
    snprintf(nm, sizeof nm, "%st_embedder.mlp.0.weight", m->pfx);   /* the timestep MLP's width (load_all checks it) */
    const st_tensor *t1 = dt_weights_find(m->w, nm);
    if (t1 && t1->ndim == 2 && t1->shape[0] >= 1 && t1->shape[0] <= ZIMAGE_MAX_DIM) m->c.t_mid = (int)t1->shape[0];
}

/* A transformer file without config.json (single files as ComfyUI ships them): the config Z-Image-Turbo's
 * config.json has, with every width and count read from the tensors — dim and patch from the x embedder (16 latent
 * channels), the head dim from the q norm, cap_feat_dim from the caption embedder, the joint and refiner block
 * counts; axes_dims (32, 48, 48) need the head dim 128, axes_lens (1536, 512, 512), rope_theta 256, norm_eps 1e-5.
 * The parsed JSON object (caller frees), or NULL with an error naming the file and what is missing. */
static json *infer_config(const dt_weights *w) {
    char pfx[32], nm[160];
    int orig;
    layout_of(w, pfx, sizeof pfx, &orig);
    const char *path = dt_weights_path(w);
    snprintf(nm, sizeof nm, orig ? "%sx_embedder.weight" : "%sall_x_embedder.2-1.weight", pfx);
    const st_tensor *x = dt_weights_find(w, nm);
    snprintf(nm, sizeof nm, orig ? "%slayers.0.attention.q_norm.weight" : "%slayers.0.attention.norm_q.weight", pfx);
    const st_tensor *q = dt_weights_find(w, nm);
    snprintf(nm, sizeof nm, "%scap_embedder.1.weight", pfx);
    const st_tensor *cap = dt_weights_find(w, nm);
    if (!x || !q || !cap || x->ndim != 2 || q->ndim != 1 || cap->ndim != 2 || x->shape[1] != 64) {
        dt_set_error("%s: no config.json, and the tensors do not give a Z-Image geometry (x embedder [dim, 64], "
                     "layers.0 q norm, cap_embedder.1)", path);
        return NULL;
    }
    const int64_t D = x->shape[0], hd = q->shape[0];
    if (hd != 128 || D % hd) {
        dt_set_error("%s: no config.json, and head dim %lld is not Z-Image's 128 (axes_dims unknown): add config.json",
                     path, (long long)hd);
        return NULL;
    }
    int nl = 0, nr = 0;
    for (;; nl++) {
        snprintf(nm, sizeof nm, "%slayers.%d.attention_norm1.weight", pfx, nl);
        if (!dt_weights_find(w, nm)) break;
    }
    for (;; nr++) {
        snprintf(nm, sizeof nm, "%snoise_refiner.%d.attention_norm1.weight", pfx, nr);
        if (!dt_weights_find(w, nm)) break;
    }
    char text[1024];
    snprintf(text, sizeof text,
             "{\"_class_name\": \"ZImageTransformer2DModel\", \"all_patch_size\": [2], \"all_f_patch_size\": [1], "
             "\"in_channels\": 16, \"dim\": %lld, \"n_layers\": %d, \"n_refiner_layers\": %d, \"n_heads\": %lld, "
             "\"n_kv_heads\": %lld, \"norm_eps\": 1e-05, \"qk_norm\": true, \"cap_feat_dim\": %lld, "
             "\"rope_theta\": 256.0, \"t_scale\": 1000.0, \"axes_dims\": [32, 48, 48], \"axes_lens\": [1536, 512, 512]}",
             (long long)D, nl, nr, (long long)(D / hd), (long long)(D / hd), (long long)cap->shape[1]);
    dt_log(1, "%s: no config.json: Z-Image geometry from the tensors (dim %lld, %d joint + %d refiner blocks, %lld "
              "heads, caption %lld)\n", path, (long long)D, nl, nr, (long long)(D / hd), (long long)cap->shape[1]);
    return json_parse(text, strlen(text), "inferred config");
}

int zimage_config_read(const char *path, zimage_config *c) {
    char *dir = dt_weights_component_dir(path, "transformer");
    if (!dir) return -1;
    dt_weights *w = dt_weights_open(dir);
    int rc = -1;
    if (w) {
        char what[4200];
        json *inf = NULL;
        const json *cfg = dt_weights_config(w) ? dt_weights_class_config(w, dir, "ZImageTransformer2DModel", "Z-Image",
                                                                          what, sizeof what)
                                               : (inf = infer_config(w));
        if (!dt_weights_config(w)) snprintf(what, sizeof what, "%s (inferred config)", dir);
        rc = cfg ? zimage_config_parse(cfg, what, c) : -1;
        json_free(inf);
        dt_weights_close(w);
    }
    free(dir);
    return rc;
}

#define LIN(dst, nm, o, i, b) do { char fn_[300]; \
        if (!((dst) = dt_linear_set_load(&m->lin, m->w, fname(m, (nm), fn_, sizeof fn_), (o), (i), (b)))) return -1; } while (0)

/* Block PREFIX ("layers.3"); modulated: it has adaLN_modulation. */
static int load_block(zimage_model *m, const char *prefix, int modulated, zi_block *b) {
    const zimage_config *c = &m->c;
    const int64_t D = c->dim, F = c->ffn;
    char nm[3][256];
    const char *parts[3] = {nm[0], nm[1], nm[2]};
    const char *qkv[3] = {"to_q", "to_k", "to_v"};
    char fq[300];
    for (int j = 0; j < 3; j++) {
        snprintf(fq, sizeof fq, "%s.attention.%s", prefix, qkv[j]);
        fname(m, fq, nm[j], sizeof nm[j]);
    }
    /* --precision fp8: the attention and FFN Linears of every block (adaLN, embedders and final layer stay bf16) */
    m->lin.precision = m->precision;
    if (m->orig) {   /* the original layout's fused attention.qkv is the stacked Linear already */
        snprintf(fq, sizeof fq, "%s%s.attention.qkv", m->pfx, prefix);
        b->qkv = dt_linear_set_load(&m->lin, m->w, fq, 3 * D, D, 0);
    } else {
        b->qkv = dt_linear_set_load_stacked(&m->lin, m->w, parts, 3, D, D, NULL);
    }
    if (!b->qkv) { m->lin.precision = DT_PREC_BF16; return -1; }
    /* attention and FFN Linears have no bias in the reference (bias=False) */
    snprintf(nm[0], sizeof nm[0], "%s.attention.to_out.0", prefix); LIN(b->out, nm[0], D, D, 0);
    snprintf(nm[0], sizeof nm[0], "%s.feed_forward.w1", prefix); LIN(b->w1, nm[0], F, D, 0);
    snprintf(nm[0], sizeof nm[0], "%s.feed_forward.w2", prefix); LIN(b->w2, nm[0], D, F, 0);
    snprintf(nm[0], sizeof nm[0], "%s.feed_forward.w3", prefix); LIN(b->w3, nm[0], F, D, 0);
    m->lin.precision = DT_PREC_BF16;
    if (modulated) {
        snprintf(nm[0], sizeof nm[0], "%s.adaLN_modulation.0", prefix);
        LIN(b->ada, nm[0], 4 * D, c->adaln, 1);
    }
    if (c->qk_norm) {
        snprintf(fq, sizeof fq, "%s.attention.norm_q.weight", prefix);
        if (load_param(m->be, m->w, fname(m, fq, nm[0], sizeof nm[0]), c->head_dim, &b->norm_q)) return -1;
        snprintf(fq, sizeof fq, "%s.attention.norm_k.weight", prefix);
        if (load_param(m->be, m->w, fname(m, fq, nm[0], sizeof nm[0]), c->head_dim, &b->norm_k)) return -1;
    }
    const char *norms[4] = {"attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"};
    b->norms = dt_malloc(sizeof(float) * (size_t)(4 * D));
    for (int j = 0; j < 4; j++) {
        snprintf(fq, sizeof fq, "%s.%s.weight", prefix, norms[j]);
        if (dt_weights_read_f32(m->w, fname(m, fq, nm[0], sizeof nm[0]), b->norms + j * D, D)) return -1;
    }
    return 0;
}

static void free_block(dt_backend *be, zi_block *b) {
    free_mat(be, &b->norm_q);
    free_mat(be, &b->norm_k);
    free(b->norms);
    b->norms = NULL;
}

static int load_all(zimage_model *m) {
    zimage_config *c = &m->c;
    const int64_t D = c->dim;
    char nm[256];
    for (size_t i = 0; i < dt_weights_count(m->w); i++) m->weight_bytes += dt_weights_at(m->w, i)->nbytes;
    /* the timestep MLP's hidden width is fixed in the reference's code (1024), not in the config: from the file */
    char fn[300];
    const st_tensor *t1 = dt_weights_find(m->w, fname(m, "t_embedder.mlp.0.weight", fn, sizeof fn));   /* rows = the width */
    if (!t1 || t1->ndim != 2 || t1->shape[0] < 1 || t1->shape[0] > ZIMAGE_MAX_DIM) {
        dt_set_error("%s: %s %s (expected [hidden, %d])", dt_weights_path(m->w), fn,
                     t1 ? "has an unexpected shape" : "is missing", ZIMAGE_T_FREQ);
        return -1;
    }
    c->t_mid = (int)t1->shape[0];   /* the Linear load below checks its input width */
    snprintf(nm, sizeof nm, "all_x_embedder.%d-1", c->patch); LIN(m->x_emb, nm, D, c->patch_channels, 1);
    snprintf(nm, sizeof nm, "all_final_layer.%d-1.linear", c->patch); LIN(m->final_lin, nm, c->patch_channels, D, 1);
    snprintf(nm, sizeof nm, "all_final_layer.%d-1.adaLN_modulation.1", c->patch); LIN(m->final_ada, nm, D, c->adaln, 1);
    LIN(m->t1, "t_embedder.mlp.0", c->t_mid, ZIMAGE_T_FREQ, 1);
    LIN(m->t2, "t_embedder.mlp.2", c->adaln, c->t_mid, 1);
    LIN(m->cap_lin, "cap_embedder.1", D, c->cap_dim, 1);
    char f2[300], f3[300];
    if (load_param(m->be, m->w, fname(m, "cap_embedder.0.weight", fn, sizeof fn), c->cap_dim, &m->cap_norm) ||
        load_row(m->be, m->w, fname(m, "x_pad_token", f2, sizeof f2), D, &m->x_pad) ||
        load_row(m->be, m->w, fname(m, "cap_pad_token", f3, sizeof f3), D, &m->cap_pad))
        return -1;
    int nr = c->n_refiner;
    m->noise = dt_calloc((size_t)(nr ? nr : 1), sizeof *m->noise);
    m->ctx = dt_calloc((size_t)(nr ? nr : 1), sizeof *m->ctx);
    m->layers = dt_calloc((size_t)c->n_layers, sizeof *m->layers);
    for (int i = 0; i < nr; i++) {
        snprintf(nm, sizeof nm, "noise_refiner.%d", i);
        if (load_block(m, nm, 1, &m->noise[i])) return -1;
        snprintf(nm, sizeof nm, "context_refiner.%d", i);
        if (load_block(m, nm, 0, &m->ctx[i])) return -1;
    }
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(nm, sizeof nm, "layers.%d", i);
        if (load_block(m, nm, 1, &m->layers[i])) return -1;
    }
    if (nr > 0) {   /* the caption refiners' norm weights never change: uploaded once */
        float *h = dt_malloc(sizeof(float) * (size_t)(4 * nr * D));
        for (int i = 0; i < nr; i++) memcpy(h + (size_t)i * 4 * D, m->ctx[i].norms, sizeof(float) * (size_t)(4 * D));
        if (m->be->alloc(m->be, &m->ctxw, 4 * nr, D, DT_F32) == 0) m->be->upload(m->be, m->ctxw, h);
        free(h);
        if (!m->ctxw.data) return -1;
    }
    return 0;
}
#undef LIN

static void acts_free(dt_backend *be, zi_acts *b);

/* Adapter module `name` (the diffusers one and, when different, the original's) updating rows [row0, row0 + rows) of
 * the model's Linear `target` (the name the loader asks for). */
static void cat_add(dt_lora_catalogue *cat, const char *name, const char *orig_name, const char *target, int64_t row0,
                    int64_t rows, int64_t in) {
    dt_lora_piece pc = {target, row0, 0, rows};
    dt_lora_catalogue_add(cat, name, rows, in, 1, &pc);
    if (orig_name && strcmp(orig_name, name)) dt_lora_catalogue_add(cat, orig_name, rows, in, 1, &pc);
}

/* The adapter modules Z-Image LoRAs name, in either layout whatever the checkpoint's: diffusers' names and the
 * original implementation's that ComfyUI-style files use — a fused attention.qkv (its B's thirds update to_q, to_k,
 * to_v with one shared A), attention.out, x_embedder, final_layer — in every refiner and joint block. */
static dt_lora_catalogue *lora_catalogue(const zimage_model *m) {
    dt_lora_catalogue *cat = dt_lora_catalogue_new();
    const zimage_config *c = &m->c;
    const int64_t D = c->dim, F = c->ffn;
    zimage_model o = *m;   /* names in the original layout, without the file's prefix */
    o.orig = 1;
    o.pfx[0] = 0;
    char dn[300], on[300], tn[300], pfx[64];
    const struct { const char *name; int64_t out, in; } glob[] = {
        {"all_x_embedder.%d-1", D, c->patch_channels}, {"all_final_layer.%d-1.linear", c->patch_channels, D},
        {"all_final_layer.%d-1.adaLN_modulation.1", D, c->adaln}, {"t_embedder.mlp.0", c->t_mid, ZIMAGE_T_FREQ},
        {"t_embedder.mlp.2", c->adaln, c->t_mid}, {"cap_embedder.1", D, c->cap_dim}};
    for (size_t i = 0; i < sizeof glob / sizeof glob[0]; i++) {
        snprintf(dn, sizeof dn, glob[i].name, c->patch);
        cat_add(cat, dn, fname(&o, dn, on, sizeof on), fname(m, dn, tn, sizeof tn), 0, glob[i].out, glob[i].in);
    }
    for (int kind = 0; kind < 3; kind++) {
        const int n = kind == 2 ? c->n_layers : c->n_refiner;
        for (int i = 0; i < n; i++) {
            snprintf(pfx, sizeof pfx, "%s.%d", kind == 0 ? "noise_refiner" : kind == 1 ? "context_refiner" : "layers", i);
            const struct { const char *name; int64_t out, in; } lin[] = {
                {"attention.to_out.0", D, D}, {"feed_forward.w1", F, D}, {"feed_forward.w2", D, F},
                {"feed_forward.w3", F, D}, {"adaLN_modulation.0", 4 * D, c->adaln}};
            for (size_t k = 0; k < sizeof lin / sizeof lin[0]; k++) {
                if (kind == 1 && k == 4) continue;   /* the caption refiners have no modulation */
                snprintf(dn, sizeof dn, "%s.%s", pfx, lin[k].name);
                cat_add(cat, dn, fname(&o, dn, on, sizeof on), fname(m, dn, tn, sizeof tn), 0, lin[k].out, lin[k].in);
            }
            /* q/k/v: three Linears stacked at load (diffusers files), or the file's fused qkv (original files) */
            static const char *const part[3] = {"to_q", "to_k", "to_v"};
            dt_lora_piece pc[3];
            char tq[3][300];
            for (int j = 0; j < 3; j++) {
                snprintf(dn, sizeof dn, "%s.attention.%s", pfx, part[j]);
                if (m->orig) snprintf(tq[j], sizeof tq[j], "%s%s.attention.qkv", m->pfx, pfx);
                else fname(m, dn, tq[j], sizeof tq[j]);
                pc[j] = (dt_lora_piece){tq[j], m->orig ? j * D : 0, j * D, D};
                cat_add(cat, dn, NULL, tq[j], m->orig ? j * D : 0, D, D);
            }
            snprintf(dn, sizeof dn, "%s.attention.qkv", pfx);
            dt_lora_catalogue_add(cat, dn, 3 * D, D, 3, pc);
        }
    }
    return cat;
}

zimage_model *zimage_load_ex(dt_backend *be, const char *path, const zimage_load_opts *o) {
    static const zimage_load_opts defaults = {0};
    if (!o) o = &defaults;
    char *dir = dt_weights_component_dir(path, "transformer");
    if (!dir) return NULL;
    zimage_model *m = dt_calloc(1, sizeof *m);
    m->be = be;
    m->lin.be = be;
    m->w = dt_weights_open(dir);
    if (!m->w) { free(dir); free(m); return NULL; }
    char what[4200];
    const json *cfg;
    if (dt_weights_config(m->w)) {
        cfg = dt_weights_class_config(m->w, dir, "ZImageTransformer2DModel", "Z-Image", what, sizeof what);
    } else {   /* a single file as ComfyUI ships it: the geometry from the tensors */
        cfg = m->inferred = infer_config(m->w);
        snprintf(what, sizeof what, "%s (inferred config)", dir);
    }
    free(dir);
    m->precision = o->precision;
    m->lin.fp8_unfused = o->fp8_unfused;   /* every fp8 Linear */
    m->attn_fp8 = o->attn_precision == DT_PREC_FP8;
    if (m->attn_fp8 && !be->attention_fp8) {
        dt_set_error("%s: --attn-precision fp8: the %s backend has no fp8 attention%s%s", what, be->name,
                     be->attention_fp8_off ? ": " : "", be->attention_fp8_off ? be->attention_fp8_off : "");
        goto fail;
    }
    if (!cfg || zimage_config_parse(cfg, what, &m->c)) goto fail;
    detect_layout(m);
    {   /* an fp8 file's blocks run on the fp8 GEMM whatever --precision says: their norms feed them as under it */
        char nm[300];
        snprintf(nm, sizeof nm, "%s%s", m->pfx,
                 m->orig ? "layers.0.attention.qkv.weight" : "layers.0.attention.to_q.weight");
        const st_tensor *q0 = dt_weights_find(m->w, nm);
        const int fp8_file = q0 && dt_dtype_is_fp8(q0->dtype);
        m->fuse_inputs = (fp8_file || m->precision == DT_PREC_FP8) && !o->fp8_unfused;
    }
    /* adapters: merged into dense weights, side products (the wrapper) on the others */
    if (o->n_loras > 0 &&
        dt_linear_set_use_loras(&m->lin, &m->be, &m->lora, o->loras, o->n_loras, o->lora_side, lora_catalogue(m)))
        goto fail;
    if (load_all(m) || (m->lora && dt_lora_check_used(m->lora))) goto fail;
    dt_linear_set_log(&m->lin, "transformer");
    return m;
fail:
    zimage_free(m);
    return NULL;
}

zimage_model *zimage_load(dt_backend *be, const char *path) { return zimage_load_ex(be, path, NULL); }

void zimage_free(zimage_model *m) {
    if (!m) return;
    dt_backend *be = m->be;
    acts_free(be, &m->buf);
    dt_linear_set_free(&m->lin);
    for (int i = 0; m->noise && i < m->c.n_refiner; i++) free_block(be, &m->noise[i]);
    for (int i = 0; m->ctx && i < m->c.n_refiner; i++) free_block(be, &m->ctx[i]);
    for (int i = 0; m->layers && i < m->c.n_layers; i++) free_block(be, &m->layers[i]);
    free(m->noise);
    free(m->ctx);
    free(m->layers);
    dt_mat *mats[] = {&m->cap_norm, &m->x_pad, &m->cap_pad, &m->ctxw};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) free_mat(be, mats[i]);
    if (m->w) dt_weights_close(m->w);
    if (be && dt_lora_backend_is_wrapper(be)) be->destroy(be);   /* the wrapper only, not the caller's */
    dt_lora_free(m->lora);
    json_free(m->inferred);
    free(m);
}

/* ------------------------------------------------------------------ patches */

void zimage_set_cancel(zimage_model *m, const volatile int *flag) { m->cancel = flag; }
void zimage_set_block_cache(zimage_model *m, dt_fbc_branch *f) { m->fbc = f; }

void zimage_patchify(const zimage_config *c, const float *latent, int H, int W, float *tokens) {
    const int p = c->patch, C = c->in_channels, gh = H / p, gw = W / p;
    for (int h = 0; h < gh; h++)
        for (int w = 0; w < gw; w++) {
            float *t = tokens + ((size_t)h * gw + w) * (size_t)c->patch_channels;
            for (int ph = 0; ph < p; ph++)
                for (int pw = 0; pw < p; pw++)
                    for (int ch = 0; ch < C; ch++)
                        t[(ph * p + pw) * C + ch] = latent[((size_t)ch * H + (size_t)(h * p + ph)) * W + (size_t)(w * p + pw)];
        }
}

void zimage_unpatchify(const zimage_config *c, const float *tokens, int H, int W, float *latent) {
    const int p = c->patch, C = c->in_channels, gh = H / p, gw = W / p;
    for (int h = 0; h < gh; h++)
        for (int w = 0; w < gw; w++) {
            const float *t = tokens + ((size_t)h * gw + w) * (size_t)c->patch_channels;
            for (int ph = 0; ph < p; ph++)
                for (int pw = 0; pw < p; pw++)
                    for (int ch = 0; ch < C; ch++)
                        latent[((size_t)ch * H + (size_t)(h * p + ph)) * W + (size_t)(w * p + pw)] = t[(ph * p + pw) * C + ch];
        }
}

/* ------------------------------------------------------------------ activations */

static int64_t pad_to(int64_t n) { return (n + ZIMAGE_SEQ_MULTIPLE - 1) / ZIMAGE_SEQ_MULTIPLE * ZIMAGE_SEQ_MULTIPLE; }

/* [rows, cols] contiguous view of a flat [1, cap] buffer. */
static dt_mat fview(dt_mat buf, int64_t rows, int64_t cols) {
    if (rows * cols > buf.rows * buf.cols) {   /* programming error: the sizes below are computed to fit */
        fprintf(stderr, "ditrun: error: zimage: scratch view [%lld, %lld] exceeds buffer of %lld\n", (long long)rows,
                (long long)cols, (long long)(buf.rows * buf.cols));
        exit(1);
    }
    dt_mat v = buf;
    v.rows = rows; v.cols = cols; v.ld = cols;
    return v;
}

static void acts_free(dt_backend *be, zi_acts *b) {
    dt_mat *mats[] = {&b->emb, &b->th, &b->temb, &b->tsilu, &b->mods, &b->fscale, &b->modw, &b->s, &b->in_img,
                      &b->in_cap, &b->capn, &b->a, &b->o, &b->qkv, &b->h1, &b->h3, &b->outm, &b->cos, &b->sin};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) free_mat(be, mats[i]);
    free(b->host_mod);
    memset(b, 0, sizeof *b);
}

/* Buffers for Nx padded image tokens and Tc padded caption tokens (kept when the current ones are large enough). */
static int acts_ensure(dt_backend *be, const zimage_config *c, int64_t nx, int64_t tc, zi_acts *b) {
    if (b->s.data && nx <= b->cap_n && tc <= b->cap_cap) return 0;
    if (b->s.data) {   /* grow to cover both the old and the new sizes (CFG alternates two captions) */
        if (nx < b->cap_n) nx = b->cap_n;
        if (tc < b->cap_cap) tc = b->cap_cap;
    }
    acts_free(be, b);
    dt_dtype act = be->act_dtype;
    const int64_t D = c->dim, L = nx + tc, F = c->ffn, nmod = c->n_refiner + c->n_layers;
    struct { dt_mat *m; int64_t rows, cols; dt_dtype t; } all[] = {
        {&b->emb, 1, ZIMAGE_T_FREQ, act}, {&b->th, 1, c->t_mid, act},    {&b->temb, 1, c->adaln, act},
        {&b->tsilu, 1, c->adaln, act},    {&b->mods, nmod, 4 * D, act},  {&b->fscale, 1, D, act},
        {&b->modw, 4 * nmod, D, DT_F32},  {&b->s, L, D, act},            {&b->in_img, 1, nx * c->patch_channels, act},
        {&b->in_cap, 1, tc * c->cap_dim, act}, {&b->capn, 1, tc * c->cap_dim, act},
        {&b->a, 1, L * D, act},           {&b->o, 1, L * D, act},        {&b->qkv, 1, L * 3 * D, act},
        {&b->h1, 1, L * F, act},          {&b->h3, 1, L * F, act},       {&b->outm, 1, nx * c->patch_channels, act},
        {&b->cos, L, c->head_dim, DT_F32}, {&b->sin, L, c->head_dim, DT_F32},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (be->alloc(be, all[i].m, all[i].rows, all[i].cols, all[i].t)) { acts_free(be, b); return -1; }
    b->cap_n = (int)nx;
    b->cap_cap = (int)tc;
    b->host_mod = dt_malloc(sizeof(float) * (size_t)(nmod * 4 * D));
    return 0;
}

/* RoPE tables for the joint layout [image (nx rows) | caption (tc rows)] of a gh x gw grid. */
static void acts_positions(dt_backend *be, const zimage_config *c, zi_acts *b, int gh, int gw, int64_t nx, int64_t tc) {
    if (b->key[0] == gh && b->key[1] == gw && b->key[2] == (int)nx && b->key[3] == (int)tc) return;
    const int hd = c->head_dim;
    const int64_t L = nx + tc, n = (int64_t)gh * gw;
    float *cs = dt_malloc(sizeof(float) * (size_t)(L * hd));
    float *sn = dt_malloc(sizeof(float) * (size_t)(L * hd));
    double *omega = dt_malloc(sizeof(double) * (size_t)(hd / 2));
    for (int a = 0, off = 0; a < ZIMAGE_AXES; off += c->axes[a], a++)
        for (int k = 0; k < c->axes[a] / 2; k++) omega[off / 2 + k] = 1.0 / pow((double)c->rope_theta, (double)(2 * k) / c->axes[a]);
    for (int64_t i = 0; i < L; i++) {
        int64_t pos[ZIMAGE_AXES] = {0, 0, 0};
        if (i < n) {                       /* image token (h, w) */
            pos[0] = tc + 1;
            pos[1] = i / gw;
            pos[2] = i % gw;
        } else if (i >= nx) {              /* caption token (pad tokens included) */
            pos[0] = 1 + (i - nx);
        }                                  /* image pad tokens: (0, 0, 0) */
        for (int a = 0, off = 0; a < ZIMAGE_AXES; off += c->axes[a], a++)
            for (int k = 0; k < c->axes[a] / 2; k++) {
                const float ang = (float)((double)pos[a] * omega[off / 2 + k]);   /* torch: outer() in f64, .float() */
                const float cv = (float)cos((double)ang), sv = (float)sin((double)ang);
                cs[i * hd + off + 2 * k] = cs[i * hd + off + 2 * k + 1] = cv;
                sn[i * hd + off + 2 * k] = sn[i * hd + off + 2 * k + 1] = sv;
            }
    }
    dt_mat cv = b->cos, sv = b->sin;
    cv.rows = sv.rows = L;
    be->upload(be, cv, cs);
    be->upload(be, sv, sn);
    free(cs);
    free(sn);
    free(omega);
    b->key[0] = gh;
    b->key[1] = gw;
    b->key[2] = (int)nx;
    b->key[3] = (int)tc;
}

/* rows [r0, r0 + n) of dst = the [1, D] row (doubling copies). */
static void fill_rows(dt_backend *be, dt_mat dst, int64_t r0, int64_t n, dt_mat row) {
    if (n <= 0) return;
    be->copy(be, dt_mat_rows(dst, r0, 1), row);
    for (int64_t filled = 1; filled < n;) {
        int64_t k = filled < n - filled ? filled : n - filled;
        be->copy(be, dt_mat_rows(dst, r0 + filled, k), dt_mat_rows(dst, r0, k));
        filled += k;
    }
}

/* ------------------------------------------------------------------ forward */

/* The timestep embedding, every modulated block's adaLN and the final layer's scale at t; the scales and gates
 * folded into the blocks' norm weights (b->modw rows 4l..4l+3 for modulated block l: noise refiners, then layers). */
static void time_mods(zimage_model *m, zi_acts *b, float t) {
    dt_backend *be = m->be;
    const zimage_config *c = &m->c;
    const int64_t D = c->dim;
    const int half = ZIMAGE_T_FREQ / 2, nmod = c->n_refiner + c->n_layers;
    /* TimestepEmbedder, f32 like the reference: f_i = exp(-ln(1e4) · i / half), a_i = (t · t_scale) · f_i */
    float emb[ZIMAGE_T_FREQ];
    const float ts = t * c->t_scale, nl = (float)(-log(1e4));
    for (int i = 0; i < half; i++) {
        const float a = ts * expf((nl * (float)i) / (float)half);
        emb[i] = cosf(a);
        emb[half + i] = sinf(a);
    }
    be->upload(be, b->emb, emb);
    be->linear(be, b->th, b->emb, m->t1);
    be->act_mul(be, b->th, b->th, dt_mat_null(), DT_ACT_SILU);
    be->linear(be, b->temb, b->th, m->t2);
    be->act_mul(be, b->tsilu, b->temb, dt_mat_null(), DT_ACT_SILU);
    be->linear(be, b->fscale, b->tsilu, m->final_ada);
    for (int l = 0; l < nmod; l++) {
        const zi_block *bl = l < c->n_refiner ? &m->noise[l] : &m->layers[l - c->n_refiner];
        be->linear(be, dt_mat_rows(b->mods, l, 1), b->temb, bl->ada);   /* adaLN takes temb itself (no SiLU) */
    }
    float *h = b->host_mod;
    be->download(be, h, b->mods);
    for (int l = 0; l < nmod; l++) {   /* in place: row l's [4D] mods become the block's 4 folded [D] weights */
        const zi_block *bl = l < c->n_refiner ? &m->noise[l] : &m->layers[l - c->n_refiner];
        float *r = h + (size_t)l * 4 * D;
        for (int64_t j = 0; j < D; j++) {
            const float s1 = r[j], g1 = r[D + j], s2 = r[2 * D + j], g2 = r[3 * D + j];
            r[j] = bl->norms[j] * (1.0f + s1);               /* attention_norm1 · (1 + scale_msa) */
            r[D + j] = bl->norms[D + j] * tanhf(g1);          /* attention_norm2 · tanh(gate_msa) */
            r[2 * D + j] = bl->norms[2 * D + j] * (1.0f + s2);/* ffn_norm1 · (1 + scale_mlp) */
            r[3 * D + j] = bl->norms[3 * D + j] * tanhf(g2);  /* ffn_norm2 · tanh(gate_mlp) */
        }
    }
    be->upload(be, b->modw, h);
}

/* One block on the stream x [R, D] (rows of b->s) with positions cos/sin [R, hd] and folded norm weights w [4, D]
 * (F32 rows: norm1, norm2, norm3, norm4). */
/* Op k (ZIMAGE_OP_*) of a block on the stream x [R, D] with its RoPE rows cos / sin [R, hd] and folded norm weights
 * w [4, D] (F32): the block's ops in order are the whole block. */
static void block_op(zimage_model *m, zi_acts *b, const zi_block *bl, dt_mat x, dt_mat cos, dt_mat sin, dt_mat w,
                     int op) {
    dt_backend *be = m->be;
    const zimage_config *c = &m->c;
    const int64_t R = x.rows, D = c->dim, F = c->ffn;
    const float eps = c->eps;
    dt_mat a = fview(b->a, R, D), o = fview(b->o, R, D), qkv = fview(b->qkv, R, 3 * D);
    dt_mat h1 = fview(b->h1, R, F), h3 = fview(b->h3, R, F);
    dt_mat q = dt_mat_cols(qkv, 0, D), k = dt_mat_cols(qkv, D, D), v = dt_mat_cols(qkv, 2 * D, D);
    const float scale = 1.0f / sqrtf((float)c->head_dim);
    switch (op) {
    /* with fuse_inputs the norms run inside QKV / W13 (rmsnorm_mod_linears, no shift: fp8 Linears read one quantized
     * input; the composed form is this rmsnorm and these linears) */
    case ZIMAGE_OP_NORM1:
        if (!m->fuse_inputs) be->rmsnorm(be, a, x, dt_mat_rows(w, 0, 1), 0.0f, eps);
        break;
    case ZIMAGE_OP_QKV:
        if (m->fuse_inputs) {
            const dt_linear *ws[1] = {bl->qkv};
            be->rmsnorm_mod_linears(be, x, dt_mat_rows(w, 0, 1), dt_mat_null(), eps, a, 1, ws, &qkv);
        } else {
            be->linear(be, qkv, a, bl->qkv);
        }
        break;
    case ZIMAGE_OP_QKNORM_ROPE:
        be->head_norm_rope(be, q, c->heads, c->head_dim, bl->norm_q, ZIMAGE_QK_EPS, cos, sin, DT_ROPE_INTERLEAVED);
        be->head_norm_rope(be, k, c->heads, c->head_dim, bl->norm_k, ZIMAGE_QK_EPS, cos, sin, DT_ROPE_INTERLEAVED);
        break;
    case ZIMAGE_OP_ATTN:   /* no mask to drop: fp8 attention takes the same call */
        if (m->attn_fp8) be->attention_fp8(be, o, q, k, v, c->heads, c->heads, c->head_dim, scale);
        else be->attention(be, o, q, k, v, c->heads, c->heads, c->head_dim, scale, dt_mat_null(), 0);
        break;
    case ZIMAGE_OP_OUT: be->linear(be, a, o, bl->out); break;
    case ZIMAGE_OP_RESID1:
        be->rmsnorm(be, a, a, dt_mat_rows(w, 1, 1), 0.0f, eps);
        be->gated_add(be, x, dt_mat_null(), a);
        break;
    case ZIMAGE_OP_NORM2:
        if (!m->fuse_inputs) be->rmsnorm(be, a, x, dt_mat_rows(w, 2, 1), 0.0f, eps);
        break;
    case ZIMAGE_OP_W13:
        if (m->fuse_inputs) {
            const dt_linear *ws[2] = {bl->w1, bl->w3};
            const dt_mat ys[2] = {h1, h3};
            be->rmsnorm_mod_linears(be, x, dt_mat_rows(w, 2, 1), dt_mat_null(), eps, a, 2, ws, ys);
        } else {
            be->linear(be, h1, a, bl->w1);
            be->linear(be, h3, a, bl->w3);
        }
        break;
    case ZIMAGE_OP_SWIGLU: be->act_mul(be, h1, h1, h3, DT_ACT_SILU); break;
    case ZIMAGE_OP_W2: be->linear(be, a, h1, bl->w2); break;
    case ZIMAGE_OP_RESID2:
        be->rmsnorm(be, a, a, dt_mat_rows(w, 3, 1), 0.0f, eps);
        be->gated_add(be, x, dt_mat_null(), a);
        break;
    default: break;
    }
}

static void block(zimage_model *m, zi_acts *b, const zi_block *bl, dt_mat x, dt_mat cos, dt_mat sin, dt_mat w) {
    for (int op = 0; op < ZIMAGE_OP_COUNT; op++) block_op(m, b, bl, x, cos, sin, w, op);
}

/* ------------------------------------------------------------------ the bench's view */

int64_t zimage_joint_rows(const zimage_model *m) { return m->buf.key[0] ? (int64_t)m->buf.key[2] + m->buf.key[3] : 0; }

dt_mat zimage_joint_stream(zimage_model *m) {
    dt_mat s = m->buf.s;
    s.rows = zimage_joint_rows(m);
    return s;
}

void zimage_block_op(zimage_model *m, int layer, int op) {
    zi_acts *b = &m->buf;
    const int64_t L = zimage_joint_rows(m);
    if (!L || layer < 0 || layer >= m->c.n_layers) return;
    dt_mat cos = b->cos, sin = b->sin;
    cos.rows = sin.rows = L;
    block_op(m, b, &m->layers[layer], zimage_joint_stream(m), cos, sin,
             dt_mat_rows(b->modw, 4 * (m->c.n_refiner + layer), 4), op);
}

void zimage_joint_blocks(zimage_model *m, int first, int count) {
    for (int l = first; l < first + count && l < m->c.n_layers; l++)
        for (int op = 0; op < ZIMAGE_OP_COUNT; op++) zimage_block_op(m, l, op);
}

void zimage_block_linears(const zimage_model *m, int layer, dt_linear *out[5]) {
    const zi_block *bl = &m->layers[layer];
    out[0] = bl->qkv; out[1] = bl->out; out[2] = bl->w1; out[3] = bl->w3; out[4] = bl->w2;
}

const dt_weights *zimage_weights(const zimage_model *m) { return m->w; }

int zimage_forward(zimage_model *m, const float *img, int grid_h, int grid_w, const float *cap, int n_cap, float t,
                   float *out, dt_dit_trace_fn trace, void *trace_ud) {
    const zimage_config *c = &m->c;
    if (!img || !cap || !out) { dt_set_error("zimage_forward: NULL input or output"); return -1; }
    if (grid_h < 1 || grid_w < 1 || n_cap < 1) {
        dt_set_error("zimage_forward: need at least one image and one caption token (grid %dx%d, %d caption tokens)",
                     grid_w, grid_h, n_cap);
        return -1;
    }
    if (!isfinite(t)) { dt_set_error("zimage_forward: t is not finite"); return -1; }
    const int64_t N = (int64_t)grid_h * grid_w, nx = pad_to(N), tc = pad_to(n_cap), L = nx + tc;
    /* the reference's RoPE tables end at axes_lens: positions past them are out of its range */
    if (tc + 1 >= c->axes_len[0] || grid_h > c->axes_len[1] || grid_w > c->axes_len[2]) {
        dt_set_error("zimage_forward: %d caption tokens (padded to %lld) and a %dx%d token grid exceed the model's "
                     "position range axes_lens (%d, %d, %d)", n_cap, (long long)tc, grid_w, grid_h, c->axes_len[0],
                     c->axes_len[1], c->axes_len[2]);
        return -1;
    }
    if (L > (int64_t)1 << 24) { dt_set_error("zimage_forward: %lld tokens is too many", (long long)L); return -1; }
    dt_backend *be = m->be;
    zi_acts *b = &m->buf;
    if (acts_ensure(be, c, nx, tc, b)) return -1;
    const int64_t D = c->dim;
    if (m->fbc && dt_fbc_prepare(be, m->fbc, N, D)) return -1;
    dt_mat s = b->s;
    s.rows = L;
    char name[40];

    time_mods(m, b, t);
    acts_positions(be, c, b, grid_h, grid_w, nx, tc);
    dt_mat cos = b->cos, sin = b->sin;
    cos.rows = sin.rows = L;
    if (trace) trace(trace_ud, "t_emb", b->temb);

    /* image: embed, pad, refine */
    dt_mat xs = dt_mat_rows(s, 0, nx), in_img = fview(b->in_img, N, c->patch_channels);
    be->upload(be, in_img, img);
    be->linear(be, dt_mat_rows(s, 0, N), in_img, m->x_emb);
    if (trace) trace(trace_ud, "x_embed", dt_mat_rows(s, 0, N));
    fill_rows(be, s, N, nx - N, m->x_pad);
    for (int i = 0; i < c->n_refiner; i++) {
        block(m, b, &m->noise[i], xs, dt_mat_rows(cos, 0, nx), dt_mat_rows(sin, 0, nx), dt_mat_rows(b->modw, 4 * i, 4));
        if (trace) {
            snprintf(name, sizeof name, "noise_refiner.%d", i);
            trace(trace_ud, name, xs);
        }
    }

    /* caption: RMSNorm, embed, pad, refine */
    dt_mat cs = dt_mat_rows(s, nx, tc);
    dt_mat in_cap = fview(b->in_cap, n_cap, c->cap_dim), capn = fview(b->capn, n_cap, c->cap_dim);
    be->upload(be, in_cap, cap);
    be->rmsnorm(be, capn, in_cap, m->cap_norm, 0.0f, c->eps);
    be->linear(be, dt_mat_rows(s, nx, n_cap), capn, m->cap_lin);
    if (trace) trace(trace_ud, "cap_embed", dt_mat_rows(s, nx, n_cap));
    fill_rows(be, s, nx + n_cap, tc - n_cap, m->cap_pad);
    for (int i = 0; i < c->n_refiner; i++) {
        block(m, b, &m->ctx[i], cs, dt_mat_rows(cos, nx, tc), dt_mat_rows(sin, nx, tc), dt_mat_rows(m->ctxw, 4 * i, 4));
        if (trace) {
            snprintf(name, sizeof name, "context_refiner.%d", i);
            trace(trace_ud, name, cs);
        }
    }

    /* joint blocks on [image | caption]; with First Block Cache, after block 0 the N image rows' residual decides
     * whether the others run or their cached residual is added (block_cache.h) */
    const dt_mat img_rows = dt_mat_rows(s, 0, N);
    if (m->fbc) dt_fbc_begin(be, m->fbc, img_rows);
    for (int i = 0; i < c->n_layers; i++) {
        if (dt_cancel_requested(m->cancel)) {
            be->sync(be);
            dt_set_error("zimage: cancelled");
            return -1;
        }
        block(m, b, &m->layers[i], s, cos, sin, dt_mat_rows(b->modw, 4 * (c->n_refiner + i), 4));
        if (trace) {
            snprintf(name, sizeof name, "layer.%d", i);
            trace(trace_ud, name, s);
        }
        if (m->fbc && i == 0 && !dt_fbc_after_head(be, m->fbc, img_rows)) break;   /* the cached residual instead */
        if (m->fbc && i == c->n_layers - 1) dt_fbc_end(be, m->fbc, img_rows);
    }

    /* final layer on the image tokens: LayerNorm · (1 + scale), Linear */
    dt_mat an = fview(b->a, N, D), outm = fview(b->outm, N, c->patch_channels);
    be->layernorm_mod(be, an, dt_mat_rows(s, 0, N), dt_mat_null(), b->fscale, ZIMAGE_FINAL_EPS);
    be->linear(be, outm, an, m->final_lin);
    if (trace) trace(trace_ud, "final", outm);
    be->download(be, out, outm);
    return be->sync(be);
}
