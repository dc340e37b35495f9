/* krea2.c — Krea 2 transformer forward (diffusers Krea2Transformer2DModel) on backend ops.
 *
 * Flow (T text tokens, N image tokens, L = T + N, D hidden, Y = text_layers, E = text_dim):
 *   timestep -> sinusoid [cos | sin] -> MLP (GELU tanh) = temb [1, D];
 *   time_mod_proj(GELU(temb)) = [1, 6D], shared by every block plus a per-block table [6, D];
 *   text [T*Y, E] -> layerwise fusion blocks (attention across the Y layers of each token)
 *     -> projector Y->1 -> refiner blocks (attention across tokens, text key-padding mask)
 *     -> txt_in (RMSNorm, Linear, GELU tanh, Linear) = joint rows [0, T);
 *   img_in(img) = joint rows [T, L); blocks on the joint stream S [L, D]; final layer on rows [T, L).
 *
 * The modulated norm (1 + scale) * RMSNorm_{1+w}(x) + shift has no fused op: the scale is folded
 * into the RMSNorm weight on the host ((1 + w) * (1 + scale), an F32 [1, D] param per norm and
 * forward) and the shift is added with gated_add(x, shift, ones) against a ones matrix.
 * Layerwise text attention (one sequence of Y layers per token) keeps the text stream layer-major
 * (row l*T + t) so that a single attention call with T*H heads covers every token.
 * See docs/krea2-notes.md.
 */
#include "krea2.h"
#include "linear_set.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_linear *q, *k, *v, *gate, *out;   /* q/gate/out [dim, dim], k/v [kv*hd, dim] */
    dt_mat norm_q, norm_k;               /* [1, hd] F32, already 1 + w (head_norm_rope has no offset) */
    int heads, kv_heads, hd;
} k2_attn;

typedef struct {
    dt_linear *gate, *up, *down;         /* [F, dim], [F, dim], [dim, F] */
} k2_ff;

typedef struct {                         /* Krea2TextFusionBlock: pre-norm, no RoPE, no modulation */
    dt_mat norm1, norm2;                 /* [1, E] F32 raw zero-centred weights (rmsnorm w_offset 1) */
    k2_attn attn;
    k2_ff ff;
} k2_text_block;

typedef struct {                         /* Krea2TransformerBlock */
    float *norm1, *norm2;                /* host [D]: 1 + w */
    float *table;                        /* host [6, D] scale_shift_table */
    k2_attn attn;
    k2_ff ff;
} k2_block;

/* Activation buffers for one (N, T) shape; kept between calls. Flat buffers are [1, cap] and
 * viewed as [rows, cols] with fview(). */
typedef struct {
    int n, t;
    dt_mat emb;        /* [1, t_embed] timestep sinusoid */
    dt_mat th;         /* [1, D] hidden of the timestep MLP */
    dt_mat temb;       /* [1, D] */
    dt_mat tg;         /* [1, D] GELU(temb) */
    dt_mat tmod;       /* [1, 6D] time_mod_proj output */
    dt_mat modw;       /* [2*layers + 1, D] F32: folded norm weights (norm1, norm2 per block, final) */
    dt_mat modv;       /* [4*layers + 1, D] act: preshift, pregate, postshift, postgate per block, final shift */
    dt_mat in_img;     /* [N, in] */
    dt_mat s;          /* [L, D] joint stream, text rows first */
    dt_mat ones;       /* [L, D] all ones (broadcast shift adds) */
    dt_mat ts;         /* flat >= T*Y*E: layerwise text stream */
    dt_mat tr;         /* flat >= T*E: refiner text stream */
    dt_mat a, q, k, v, g, o, h1, h2;   /* flat scratch (sizes in ensure_bufs) */
    dt_mat outm;       /* [N, out] */
    dt_mat cos, sin;   /* [L, head_dim] F32 RoPE tables */
    dt_mat bias;       /* [1, L] F32 key-padding bias */
    float *ids;        /* host copy of the ids the tables were built from [L * n_axes] */
    float *host_mod;   /* host [(6 * layers + 9) * D]: tmod, temb, folded weights, shifts/gates */
} k2_bufs;

struct krea2_model {
    dt_backend *be;
    dt_weights *w;
    krea2_config c;
    dt_linear *img_in, *t_lin1, *t_lin2, *time_mod, *txt_lin1, *txt_lin2, *final_lin;
    dt_mat txt_norm;                 /* [1, E] F32 raw (w_offset 1) */
    float *proj;                     /* host [Y] text_fusion.projector weights */
    float *final_norm;               /* host [D]: 1 + w */
    float *final_table;              /* host [2, D] */
    k2_text_block *lw, *rf;          /* layerwise / refiner text fusion blocks */
    k2_block *blk;
    dt_linear_set lin;               /* every created Linear (cleanup, format description) */
    size_t weight_bytes;
    k2_bufs buf;
};

/* ------------------------------------------------------------------ config */

static int get_int(const json *cfg, const char *what, const char *key, int min, int *out) {
    const json *v = json_get(cfg, key);
    if (!v || v->type == JSON_NULL) { dt_set_error("%s: missing '%s'", what, key); return -1; }
    if (v->type != JSON_NUMBER || !v->is_integer || v->integer < min || v->integer > (1 << 20)) {
        dt_set_error("%s: '%s' must be an integer >= %d", what, key, min);
        return -1;
    }
    *out = (int)v->integer;
    return 0;
}

static int get_float(const json *cfg, const char *what, const char *key, float *out) {
    const json *v = json_get(cfg, key);
    if (!v || v->type != JSON_NUMBER) { dt_set_error("%s: missing or non-numeric '%s'", what, key); return -1; }
    *out = (float)v->number;
    return 0;
}

int krea2_config_parse(const json *cfg, const char *what, krea2_config *c) {
    memset(c, 0, sizeof *c);
    if (!cfg || cfg->type != JSON_OBJECT) { dt_set_error("%s: config is not a JSON object", what); return -1; }
    if (get_int(cfg, what, "in_channels", 1, &c->in_channels) || get_int(cfg, what, "num_layers", 1, &c->num_layers) ||
        get_int(cfg, what, "attention_head_dim", 2, &c->head_dim) ||
        get_int(cfg, what, "num_attention_heads", 1, &c->heads) ||
        get_int(cfg, what, "num_key_value_heads", 1, &c->kv_heads) ||
        get_int(cfg, what, "intermediate_size", 1, &c->intermediate) ||
        get_int(cfg, what, "timestep_embed_dim", 2, &c->t_embed) ||
        get_int(cfg, what, "text_hidden_dim", 1, &c->text_dim) ||
        get_int(cfg, what, "num_text_layers", 1, &c->text_layers) ||
        get_int(cfg, what, "text_num_attention_heads", 1, &c->text_heads) ||
        get_int(cfg, what, "text_num_key_value_heads", 1, &c->text_kv_heads) ||
        get_int(cfg, what, "text_intermediate_size", 1, &c->text_intermediate) ||
        get_int(cfg, what, "num_layerwise_text_blocks", 0, &c->n_layerwise) ||
        get_int(cfg, what, "num_refiner_text_blocks", 0, &c->n_refiner) ||
        get_float(cfg, what, "rope_theta", &c->rope_theta) || get_float(cfg, what, "norm_eps", &c->eps))
        return -1;
    c->out_channels = c->in_channels;   /* Krea2Transformer2DModel: out_channels = in_channels */
    c->hidden = c->heads * c->head_dim;
    if (c->t_embed % 2) { dt_set_error("%s: timestep_embed_dim must be even", what); return -1; }
    if (c->head_dim % 2) { dt_set_error("%s: attention_head_dim must be even", what); return -1; }
    if (c->heads % c->kv_heads) {
        dt_set_error("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", what, c->heads, c->kv_heads);
        return -1;
    }
    if (c->text_dim % c->text_heads) {
        dt_set_error("%s: text_hidden_dim %d is not divisible by text_num_attention_heads %d", what, c->text_dim,
                     c->text_heads);
        return -1;
    }
    c->text_head_dim = c->text_dim / c->text_heads;
    if (c->text_head_dim % 2) {
        dt_set_error("%s: text head dim %d (text_hidden_dim / text_num_attention_heads) must be even", what,
                     c->text_head_dim);
        return -1;
    }
    if (c->text_heads % c->text_kv_heads) {
        dt_set_error("%s: text_num_attention_heads %d is not a multiple of text_num_key_value_heads %d", what,
                     c->text_heads, c->text_kv_heads);
        return -1;
    }
    if (!(c->rope_theta > 0) || !(c->eps > 0 && c->eps < 1)) {
        dt_set_error("%s: rope_theta/norm_eps out of range", what);
        return -1;
    }
    const json *axes = json_get(cfg, "axes_dims_rope");
    if (!axes || axes->type != JSON_ARRAY || axes->len < 1 || axes->len > KREA2_MAX_AXES) {
        dt_set_error("%s: axes_dims_rope must be an array of 1..%d integers", what, KREA2_MAX_AXES);
        return -1;
    }
    c->n_axes = (int)axes->len;
    int sum = 0;
    for (int i = 0; i < c->n_axes; i++) {
        const json *a = json_at(axes, (size_t)i);
        if (!a || a->type != JSON_NUMBER || !a->is_integer || a->integer <= 0 || a->integer % 2 || a->integer > 4096) {
            dt_set_error("%s: axes_dims_rope[%d] must be a positive even integer", what, i);
            return -1;
        }
        c->axes[i] = (int)a->integer;
        sum += c->axes[i];
    }
    if (sum != c->head_dim) {
        dt_set_error("%s: axes_dims_rope sums to %d but attention_head_dim is %d", what, sum, c->head_dim);
        return -1;
    }
    return 0;
}

const krea2_config *krea2_get_config(const krea2_model *m) { return &m->c; }

void krea2_weight_info(const krea2_model *m, size_t *bytes, char *fmt, size_t fmt_len) {
    if (bytes) *bytes = m->weight_bytes;
    if (fmt && fmt_len) snprintf(fmt, fmt_len, "%s", m->lin.fmt);
}

/* ------------------------------------------------------------------ loading */

static dt_linear *load_linear(krea2_model *m, const char *name, int64_t out, int64_t in, int want_bias) {
    return dt_linear_set_load(&m->lin, m->w, name, out, in, want_bias);
}

/* Host f32 copy of a float tensor with n elements (+ offset added to every element). NULL on error. */
static float *read_host(krea2_model *m, const char *name, int64_t n, float offset) {
    float *p = dt_malloc(sizeof(float) * (size_t)n);
    if (dt_weights_read_f32(m->w, name, p, n) != 0) { free(p); return NULL; }
    if (offset != 0.0f)
        for (int64_t i = 0; i < n; i++) p[i] += offset;   /* torch: weight + 1.0 in f32 */
    return p;
}

static int load_param(krea2_model *m, const char *name, int64_t n, float offset, dt_mat *out) {
    float *p = read_host(m, name, n, offset);
    if (!p) return -1;
    *out = dt_param_upload(m->be, p, n);
    free(p);
    return 0;
}

#define LIN(dst, nm, o, i, b) do { if (!((dst) = load_linear(m, (nm), (o), (i), (b)))) return -1; } while (0)

/* Krea2Attention + Krea2SwiGLU under PREFIX ("transformer_blocks.3", "text_fusion.refiner_blocks.0"). */
static int load_attn_ff(krea2_model *m, const char *prefix, int64_t dim, int heads, int kv_heads, int64_t inter,
                        k2_attn *at, k2_ff *ff) {
    char nm[512];
    int hd = (int)(dim / heads);
    int64_t dkv = (int64_t)kv_heads * hd;
    at->heads = heads; at->kv_heads = kv_heads; at->hd = hd;
    /* Attention and MLP Linears have no bias in diffusers (bias=False); a stray one is ignored like
     * diffusers ignores unexpected keys. */
    snprintf(nm, sizeof nm, "%s.attn.to_q", prefix); LIN(at->q, nm, dim, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.to_k", prefix); LIN(at->k, nm, dkv, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.to_v", prefix); LIN(at->v, nm, dkv, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.to_gate", prefix); LIN(at->gate, nm, dim, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.to_out.0", prefix); LIN(at->out, nm, dim, dim, 0);
    snprintf(nm, sizeof nm, "%s.attn.norm_q.weight", prefix);
    if (load_param(m, nm, hd, 1.0f, &at->norm_q)) return -1;
    snprintf(nm, sizeof nm, "%s.attn.norm_k.weight", prefix);
    if (load_param(m, nm, hd, 1.0f, &at->norm_k)) return -1;
    snprintf(nm, sizeof nm, "%s.ff.gate", prefix); LIN(ff->gate, nm, inter, dim, 0);
    snprintf(nm, sizeof nm, "%s.ff.up", prefix); LIN(ff->up, nm, inter, dim, 0);
    snprintf(nm, sizeof nm, "%s.ff.down", prefix); LIN(ff->down, nm, dim, inter, 0);
    return 0;
}

static int load_text_block(krea2_model *m, const char *prefix, k2_text_block *b) {
    const krea2_config *c = &m->c;
    char nm[512];
    snprintf(nm, sizeof nm, "%s.norm1.weight", prefix);
    if (load_param(m, nm, c->text_dim, 0.0f, &b->norm1)) return -1;
    snprintf(nm, sizeof nm, "%s.norm2.weight", prefix);
    if (load_param(m, nm, c->text_dim, 0.0f, &b->norm2)) return -1;
    return load_attn_ff(m, prefix, c->text_dim, c->text_heads, c->text_kv_heads, c->text_intermediate, &b->attn, &b->ff);
}

static int load_all(krea2_model *m) {
    const krea2_config *c = &m->c;
    int64_t D = c->hidden, E = c->text_dim;
    char nm[512];
    for (size_t i = 0; i < dt_weights_count(m->w); i++) m->weight_bytes += dt_weights_at(m->w, i)->nbytes;

    LIN(m->img_in, "img_in", D, c->in_channels, 1);
    LIN(m->t_lin1, "time_embed.linear_1", D, c->t_embed, 1);
    LIN(m->t_lin2, "time_embed.linear_2", D, D, 1);
    LIN(m->time_mod, "time_mod_proj", 6 * D, D, 1);
    LIN(m->txt_lin1, "txt_in.linear_1", D, E, 1);
    LIN(m->txt_lin2, "txt_in.linear_2", D, D, 1);
    LIN(m->final_lin, "final_layer.linear", c->out_channels, D, 1);
    if (load_param(m, "txt_in.norm.weight", E, 0.0f, &m->txt_norm)) return -1;
    if (!(m->final_norm = read_host(m, "final_layer.norm.weight", D, 1.0f))) return -1;
    if (!(m->final_table = read_host(m, "final_layer.scale_shift_table", 2 * D, 0.0f))) return -1;

    /* projector: Linear(Y -> 1, bias=False), applied on the host-known weights with axpby */
    dt_linear_src ps;
    if (dt_weights_linear(m->w, "text_fusion.projector", 1, c->text_layers, 0, &ps) != 0) return -1;
    m->proj = dt_malloc(sizeof(float) * (size_t)c->text_layers);
    dt_linear_src_rows_f32(&ps, 0, 1, m->proj);

    m->lw = dt_calloc((size_t)(c->n_layerwise ? c->n_layerwise : 1), sizeof *m->lw);
    for (int i = 0; i < c->n_layerwise; i++) {
        snprintf(nm, sizeof nm, "text_fusion.layerwise_blocks.%d", i);
        if (load_text_block(m, nm, &m->lw[i])) return -1;
    }
    m->rf = dt_calloc((size_t)(c->n_refiner ? c->n_refiner : 1), sizeof *m->rf);
    for (int i = 0; i < c->n_refiner; i++) {
        snprintf(nm, sizeof nm, "text_fusion.refiner_blocks.%d", i);
        if (load_text_block(m, nm, &m->rf[i])) return -1;
    }
    m->blk = dt_calloc((size_t)c->num_layers, sizeof *m->blk);
    for (int i = 0; i < c->num_layers; i++) {
        k2_block *b = &m->blk[i];
        snprintf(nm, sizeof nm, "transformer_blocks.%d.norm1.weight", i);
        if (!(b->norm1 = read_host(m, nm, D, 1.0f))) return -1;
        snprintf(nm, sizeof nm, "transformer_blocks.%d.norm2.weight", i);
        if (!(b->norm2 = read_host(m, nm, D, 1.0f))) return -1;
        snprintf(nm, sizeof nm, "transformer_blocks.%d.scale_shift_table", i);
        if (!(b->table = read_host(m, nm, 6 * D, 0.0f))) return -1;
        snprintf(nm, sizeof nm, "transformer_blocks.%d", i);
        if (load_attn_ff(m, nm, D, c->heads, c->kv_heads, c->intermediate, &b->attn, &b->ff)) return -1;
    }
    return 0;
}
#undef LIN

krea2_model *krea2_load(dt_backend *be, const char *path) {
    char *dir = dt_weights_component_dir(path, "transformer");
    if (!dir) return NULL;
    krea2_model *m = dt_calloc(1, sizeof *m);
    m->be = be;
    m->lin.be = be;
    m->w = dt_weights_open(dir);
    if (!m->w) { free(dir); free(m); return NULL; }
    const json *cfg = dt_weights_config(m->w);
    char what[4200];
    snprintf(what, sizeof what, "%s/config.json", dir);
    free(dir);
    if (!cfg) { dt_set_error("%s: missing (a Krea 2 transformer folder needs its config.json)", what); goto fail; }
    const char *cls = json_get_str(cfg, "_class_name");
    if (cls && strcmp(cls, "Krea2Transformer2DModel")) {
        dt_set_error("%s: _class_name is '%s', expected Krea2Transformer2DModel", what, cls);
        goto fail;
    }
    if (krea2_config_parse(cfg, what, &m->c)) goto fail;
    if (load_all(m)) goto fail;
    return m;
fail:
    krea2_free(m);
    return NULL;
}

static void free_mat(dt_backend *be, dt_mat *x) {
    if (x->data) be->free(be, x);
    memset(x, 0, sizeof *x);
}

static void free_bufs(dt_backend *be, k2_bufs *b) {
    dt_mat *mats[] = {&b->emb, &b->th, &b->temb, &b->tg, &b->tmod, &b->modw, &b->modv, &b->in_img, &b->s,
                      &b->ones, &b->ts, &b->tr, &b->a, &b->q, &b->k, &b->v, &b->g, &b->o, &b->h1, &b->h2,
                      &b->outm, &b->cos, &b->sin, &b->bias};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) free_mat(be, mats[i]);
    free(b->ids);
    free(b->host_mod);
    memset(b, 0, sizeof *b);
}

static void free_attn_ff(dt_backend *be, k2_attn *at) {
    free_mat(be, &at->norm_q);
    free_mat(be, &at->norm_k);
}

void krea2_free(krea2_model *m) {
    if (!m) return;
    if (m->be) {
        free_bufs(m->be, &m->buf);
        dt_linear_set_free(&m->lin);
        free_mat(m->be, &m->txt_norm);
        for (int i = 0; m->lw && i < m->c.n_layerwise; i++) {
            free_mat(m->be, &m->lw[i].norm1); free_mat(m->be, &m->lw[i].norm2); free_attn_ff(m->be, &m->lw[i].attn);
        }
        for (int i = 0; m->rf && i < m->c.n_refiner; i++) {
            free_mat(m->be, &m->rf[i].norm1); free_mat(m->be, &m->rf[i].norm2); free_attn_ff(m->be, &m->rf[i].attn);
        }
        for (int i = 0; m->blk && i < m->c.num_layers; i++) free_attn_ff(m->be, &m->blk[i].attn);
    }
    for (int i = 0; m->blk && i < m->c.num_layers; i++) {
        free(m->blk[i].norm1); free(m->blk[i].norm2); free(m->blk[i].table);
    }
    free(m->lw);
    free(m->rf);
    free(m->blk);
    free(m->proj);
    free(m->final_norm);
    free(m->final_table);
    if (m->w) dt_weights_close(m->w);
    free(m);
}

/* ------------------------------------------------------------------ buffers */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* [rows, cols] contiguous view of a flat [1, cap] buffer. */
static dt_mat fview(dt_mat buf, int64_t rows, int64_t cols) {
    dt_mat v = buf;
    if (rows * cols > buf.rows * buf.cols) {   /* programming error: sizes below are computed to fit */
        fprintf(stderr, "ditrun: error: krea2: scratch view [%lld, %lld] exceeds buffer of %lld\n", (long long)rows,
                (long long)cols, (long long)(buf.rows * buf.cols));
        exit(1);
    }
    v.rows = rows; v.cols = cols; v.ld = cols;
    return v;
}

static int alloc_mat(dt_backend *be, dt_mat *x, int64_t rows, int64_t cols, dt_dtype t) {
    return be->alloc(be, x, rows, cols, t);
}

static int ensure_bufs(krea2_model *m, int n, int t) {
    k2_bufs *b = &m->buf;
    if (b->s.data && b->n == n && b->t == t) return 0;
    dt_backend *be = m->be;
    free_bufs(be, b);
    const krea2_config *c = &m->c;
    dt_dtype act = be->act_dtype;
    int64_t D = c->hidden, L = (int64_t)n + t, E = c->text_dim, Y = c->text_layers;
    int64_t Lt = (int64_t)t * Y;
    int64_t dkv = (int64_t)c->kv_heads * c->head_dim, tdkv = (int64_t)c->text_kv_heads * c->text_head_dim;
    int64_t big = max64(L * D, Lt * E);
    int64_t kv = max64(L * dkv, Lt * tdkv);
    int64_t hid = max64(max64(L * c->intermediate, Lt * c->text_intermediate), (int64_t)t * D);
    int nl = c->num_layers;
    int rc = 0;
    rc |= alloc_mat(be, &b->emb, 1, c->t_embed, act);
    rc |= alloc_mat(be, &b->th, 1, D, act);
    rc |= alloc_mat(be, &b->temb, 1, D, act);
    rc |= alloc_mat(be, &b->tg, 1, D, act);
    rc |= alloc_mat(be, &b->tmod, 1, 6 * D, act);
    rc |= alloc_mat(be, &b->modw, 2 * nl + 1, D, DT_F32);
    rc |= alloc_mat(be, &b->modv, 4 * nl + 1, D, act);
    rc |= alloc_mat(be, &b->in_img, n, c->in_channels, act);
    rc |= alloc_mat(be, &b->s, L, D, act);
    rc |= alloc_mat(be, &b->ones, L, D, act);
    rc |= alloc_mat(be, &b->ts, 1, Lt * E, act);
    rc |= alloc_mat(be, &b->tr, 1, (int64_t)t * E, act);
    rc |= alloc_mat(be, &b->a, 1, big, act);
    rc |= alloc_mat(be, &b->q, 1, big, act);
    rc |= alloc_mat(be, &b->k, 1, kv, act);
    rc |= alloc_mat(be, &b->v, 1, kv, act);
    rc |= alloc_mat(be, &b->g, 1, big, act);
    rc |= alloc_mat(be, &b->o, 1, big, act);
    rc |= alloc_mat(be, &b->h1, 1, hid, act);
    rc |= alloc_mat(be, &b->h2, 1, hid, act);
    rc |= alloc_mat(be, &b->outm, n, c->out_channels, act);
    rc |= alloc_mat(be, &b->cos, L, c->head_dim, DT_F32);
    rc |= alloc_mat(be, &b->sin, L, c->head_dim, DT_F32);
    rc |= alloc_mat(be, &b->bias, 1, L, DT_F32);
    if (rc) { free_bufs(be, b); return -1; }
    b->n = n; b->t = t;
    b->ids = dt_malloc(sizeof(float) * (size_t)(L * c->n_axes));
    b->host_mod = dt_malloc(sizeof(float) * (size_t)((6 * nl + 9) * D));   /* see time_and_mods */
    /* ones: upload one row, then double the filled prefix with copies */
    float *one = dt_malloc(sizeof(float) * (size_t)D);
    for (int64_t i = 0; i < D; i++) one[i] = 1.0f;
    be->upload(be, dt_mat_rows(b->ones, 0, 1), one);
    free(one);
    for (int64_t filled = 1; filled < L;) {
        int64_t k = filled < L - filled ? filled : L - filled;
        be->copy(be, dt_mat_rows(b->ones, filled, k), dt_mat_rows(b->ones, 0, k));
        filled += k;
    }
    /* mark the RoPE tables stale */
    for (int64_t i = 0; i < L * c->n_axes; i++) b->ids[i] = NAN;
    return 0;
}

/* RoPE tables for the [text, image] sequence (Krea2RotaryPosEmbed = FLUX's): per axis a with d_a
 * dims, ω_k = 1 / θ^(2k/d_a) in float64, angle = pos · ω_k in float64, cos/sin rounded to f32,
 * each frequency repeated for the interleaved pair (2k, 2k+1). */
static void build_rope(krea2_model *m, const float *pos, int64_t L) {
    const krea2_config *c = &m->c;
    k2_bufs *b = &m->buf;
    size_t nids = (size_t)(L * c->n_axes);
    if (!memcmp(b->ids, pos, sizeof(float) * nids)) return;   /* NaN-marked tables never match */
    int hd = c->head_dim;
    float *cs = dt_malloc(sizeof(float) * (size_t)(L * hd));
    float *sn = dt_malloc(sizeof(float) * (size_t)(L * hd));
    double *omega = dt_malloc(sizeof(double) * (size_t)(hd / 2));
    for (int a = 0, off = 0; a < c->n_axes; off += c->axes[a], a++)
        for (int k = 0; k < c->axes[a] / 2; k++)
            omega[off / 2 + k] = 1.0 / pow((double)c->rope_theta, (double)(2 * k) / c->axes[a]);
    for (int64_t i = 0; i < L; i++) {
        int off = 0;
        for (int a = 0; a < c->n_axes; a++) {
            int d = c->axes[a];
            double p = (double)pos[i * c->n_axes + a];
            for (int k = 0; k < d / 2; k++) {
                double ang = p * omega[off / 2 + k];
                float cv = (float)cos(ang), sv = (float)sin(ang);
                cs[i * hd + off + 2 * k] = cs[i * hd + off + 2 * k + 1] = cv;
                sn[i * hd + off + 2 * k] = sn[i * hd + off + 2 * k + 1] = sv;
            }
            off += d;
        }
    }
    m->be->upload(m->be, b->cos, cs);
    m->be->upload(m->be, b->sin, sn);
    free(cs);
    free(sn);
    free(omega);
    memcpy(b->ids, pos, sizeof(float) * nids);
}

/* ------------------------------------------------------------------ forward pieces */

/* Most heads per attention call in batched mode (CUDA grids put heads on gridDim.y <= 65535). */
#define K2_MAX_BATCHED_HEADS 32768

/* Krea2Attention on normed input x [R, dim] -> y [R, dim] (y may be x's buffer: x is consumed first).
 * nseq = 0: one sequence of R rows. nseq > 0: nseq independent sequences of R / nseq rows stored
 * sequence-position-major (row p * nseq + s is position p of sequence s; the layerwise text fusion
 * uses layer-major rows l * T + t). Then Q/K/V [R, H*hd] are reinterpreted as [R/nseq, nseq*H*hd]:
 * one attention call with nseq*H query heads and nseq*Hkv kv heads attends within each sequence
 * (q head s*H + h uses kv head s*Hkv + h/(H/Hkv), exactly the per-sequence GQA mapping).
 * cos/sin: RoPE tables (NULL data = no RoPE); bias: [1, R] key-padding bias or NULL data. */
static void attention_block(krea2_model *m, const k2_attn *at, dt_mat x, dt_mat y, int64_t nseq, dt_mat cos,
                            dt_mat sin, dt_mat bias) {
    dt_backend *be = m->be;
    k2_bufs *b = &m->buf;
    int64_t R = x.rows, dim = x.cols, dkv = (int64_t)at->kv_heads * at->hd;
    dt_mat q = fview(b->q, R, dim), k = fview(b->k, R, dkv), v = fview(b->v, R, dkv);
    dt_mat g = fview(b->g, R, dim), o = fview(b->o, R, dim);
    be->linear(be, q, x, at->q);
    be->linear(be, k, x, at->k);
    be->linear(be, v, x, at->v);
    be->linear(be, g, x, at->gate);
    dt_rope_mode mode = cos.data ? DT_ROPE_INTERLEAVED : DT_ROPE_NONE;
    be->head_norm_rope(be, q, at->heads, at->hd, at->norm_q, m->c.eps, cos, sin, mode);
    be->head_norm_rope(be, k, at->kv_heads, at->hd, at->norm_k, m->c.eps, cos, sin, mode);
    float scale = 1.0f / sqrtf((float)at->hd);
    if (nseq > 0) {
        int64_t len = R / nseq;
        dt_mat qb = fview(b->q, len, nseq * dim), kb = fview(b->k, len, nseq * dkv), vb = fview(b->v, len, nseq * dkv);
        dt_mat ob = fview(b->o, len, nseq * dim);
        int64_t per = K2_MAX_BATCHED_HEADS / at->heads;
        if (per < 1) per = 1;
        for (int64_t s0 = 0; s0 < nseq; s0 += per) {
            int64_t ns = nseq - s0 < per ? nseq - s0 : per;
            be->attention(be, dt_mat_cols(ob, s0 * dim, ns * dim), dt_mat_cols(qb, s0 * dim, ns * dim),
                          dt_mat_cols(kb, s0 * dkv, ns * dkv), dt_mat_cols(vb, s0 * dkv, ns * dkv),
                          (int)(ns * at->heads), (int)(ns * at->kv_heads), at->hd, scale, dt_mat_null(), 0);
        }
    } else {
        be->attention(be, o, q, k, v, at->heads, at->kv_heads, at->hd, scale, bias, 0);
    }
    be->act_mul(be, o, g, o, DT_ACT_SIGMOID);   /* attn * sigmoid(to_gate(x)) */
    be->linear(be, y, o, at->out);
}

/* Krea2SwiGLU on x [R, dim] -> y [R, dim] (y may be x's buffer). */
static void ff_block(krea2_model *m, const k2_ff *ff, dt_mat x, dt_mat y, int64_t inter) {
    dt_backend *be = m->be;
    dt_mat h1 = fview(m->buf.h1, x.rows, inter), h2 = fview(m->buf.h2, x.rows, inter);
    be->linear(be, h1, x, ff->gate);
    be->linear(be, h2, x, ff->up);
    be->act_mul(be, h1, h1, h2, DT_ACT_SILU);
    be->linear(be, y, h1, ff->down);
}

/* Krea2TextFusionBlock on the stream s [R, E] in place (nseq: see attention_block). */
static void text_block(krea2_model *m, const k2_text_block *tb, dt_mat s, int64_t nseq, dt_mat bias) {
    dt_backend *be = m->be;
    dt_mat a = fview(m->buf.a, s.rows, s.cols);
    be->rmsnorm(be, a, s, tb->norm1, 1.0f, m->c.eps);
    attention_block(m, &tb->attn, a, a, nseq, dt_mat_null(), dt_mat_null(), bias);
    be->gated_add(be, s, dt_mat_null(), a);
    be->rmsnorm(be, a, s, tb->norm2, 1.0f, m->c.eps);
    ff_block(m, &tb->ff, a, a, m->c.text_intermediate);
    be->gated_add(be, s, dt_mat_null(), a);
}

/* Timestep embedding + modulation vectors (host fold, one upload each for modw / modv). */
static void time_and_mods(krea2_model *m, float timestep) {
    dt_backend *be = m->be;
    k2_bufs *b = &m->buf;
    const krea2_config *c = &m->c;
    int64_t D = c->hidden;
    int half = c->t_embed / 2;
    /* Krea2TimestepEmbedding, f32 like the reference: f_i = exp(-ln(1e4) * i / half),
     * a_i = (t * 1000) * f_i, emb = [cos(a), sin(a)]. */
    float *emb = dt_malloc(sizeof(float) * (size_t)c->t_embed);
    float t1000 = timestep * 1000.0f;
    float nl = (float)(-log(1e4));
    for (int i = 0; i < half; i++) {
        float f = expf((nl * (float)i) / (float)half);
        float arg = t1000 * f;
        emb[i] = cosf(arg);
        emb[half + i] = sinf(arg);
    }
    be->upload(be, b->emb, emb);
    free(emb);
    be->linear(be, b->th, b->emb, m->t_lin1);
    be->act_mul(be, b->th, b->th, dt_mat_null(), DT_ACT_GELU_TANH);
    be->linear(be, b->temb, b->th, m->t_lin2);
    be->act_mul(be, b->tg, b->temb, dt_mat_null(), DT_ACT_GELU_TANH);
    be->linear(be, b->tmod, b->tg, m->time_mod);

    int nlay = c->num_layers;
    float *tmod = b->host_mod;                 /* [6D] */
    float *temb = tmod + 6 * D;                /* [D] */
    float *w = temb + D;                       /* [(2*nlay + 1) * D] folded norm weights */
    float *vv = w + (2 * nlay + 1) * D;        /* [(4*nlay + 1) * D] shifts and gates */
    be->download(be, tmod, b->tmod);
    be->download(be, temb, b->temb);
    for (int l = 0; l < nlay; l++) {
        const k2_block *blk = &m->blk[l];
        for (int64_t j = 0; j < D; j++) {
            float mod[6];
            for (int q = 0; q < 6; q++) mod[q] = tmod[q * D + j] + blk->table[q * D + j];
            /* order: prescale, preshift, pregate, postscale, postshift, postgate */
            w[(2 * l) * D + j] = blk->norm1[j] * (1.0f + mod[0]);
            w[(2 * l + 1) * D + j] = blk->norm2[j] * (1.0f + mod[3]);
            vv[(4 * l) * D + j] = mod[1];
            vv[(4 * l + 1) * D + j] = mod[2];
            vv[(4 * l + 2) * D + j] = mod[4];
            vv[(4 * l + 3) * D + j] = mod[5];
        }
    }
    /* Krea2FinalLayer: (temb + table) chunked -> scale = row 0, shift = row 1 (raw temb, no GELU) */
    for (int64_t j = 0; j < D; j++) {
        float scale = temb[j] + m->final_table[j], shift = temb[j] + m->final_table[D + j];
        w[(2 * nlay) * D + j] = m->final_norm[j] * (1.0f + scale);
        vv[(4 * nlay) * D + j] = shift;
    }
    be->upload(be, b->modw, w);
    be->upload(be, b->modv, vv);
}

/* y = RMSNorm(x) * folded weight row wi + shift row vi (the block's modulated norm). */
static void mod_norm(krea2_model *m, dt_mat y, dt_mat x, int wi, int vi) {
    dt_backend *be = m->be;
    k2_bufs *b = &m->buf;
    be->rmsnorm(be, y, x, dt_mat_rows(b->modw, wi, 1), 0.0f, m->c.eps);
    be->gated_add(be, y, dt_mat_rows(b->modv, vi, 1), dt_mat_rows(b->ones, 0, x.rows));
}

int krea2_forward(krea2_model *m, const float *img, int n_img, const float *txt, int n_txt, float timestep,
                  const float *pos_ids, const uint8_t *txt_mask, float *out, krea2_trace_fn trace, void *trace_ud) {
    const krea2_config *c = &m->c;
    if (!img || !txt || !pos_ids || !out) { dt_set_error("krea2_forward: NULL input or output"); return -1; }
    if (n_img < 1 || n_txt < 1) {
        dt_set_error("krea2_forward: need at least one image and one text token (got N=%d, T=%d)", n_img, n_txt);
        return -1;
    }
    if (!isfinite(timestep)) { dt_set_error("krea2_forward: timestep is not finite"); return -1; }
    if (txt_mask) {
        int valid = 0;
        for (int i = 0; i < n_txt; i++) valid += txt_mask[i] != 0;
        if (!valid) {
            /* the reference would produce NaN (softmax over no key in the refiner) */
            dt_set_error("krea2_forward: the text mask marks no valid token");
            return -1;
        }
    }
    if (ensure_bufs(m, n_img, n_txt)) return -1;
    dt_backend *be = m->be;
    k2_bufs *b = &m->buf;
    int64_t D = c->hidden, E = c->text_dim, Y = c->text_layers, T = n_txt, N = n_img, L = T + N;

    time_and_mods(m, timestep);
    build_rope(m, pos_ids, L);
    dt_mat bias = dt_mat_null();
    if (txt_mask) {
        float *bh = dt_malloc(sizeof(float) * (size_t)L);
        for (int64_t j = 0; j < L; j++) bh[j] = (j < T && !txt_mask[j]) ? -INFINITY : 0.0f;
        be->upload(be, b->bias, bh);
        free(bh);
        bias = b->bias;
    }

    /* ---- text fusion ---- */
    /* upload token-major [T*Y, E] into scratch, then reorder to layer-major rows l*T + t (Y strided copies) */
    dt_mat ts = fview(b->ts, T * Y, E), raw = fview(b->a, T * Y, E);
    be->upload(be, raw, txt);
    for (int64_t l = 0; l < Y; l++) {
        dt_mat lv = dt_mat_rows(raw, l, T);   /* layer l of every token: rows l, l+Y, ... */
        lv.ld = raw.ld * Y;
        be->copy(be, dt_mat_rows(ts, l * T, T), lv);
    }
    for (int i = 0; i < c->n_layerwise; i++) text_block(m, &m->lw[i], ts, T, dt_mat_null());
    /* projector Y -> 1: tr[t] = sum_l p_l * ts[l*T + t] */
    dt_mat tr = fview(b->tr, T, E);
    for (int64_t l = 0; l < Y; l++) {
        dt_mat lv = dt_mat_rows(ts, l * T, T);
        if (l == 0) be->axpby(be, tr, m->proj[0], lv, 0.0f, dt_mat_null());
        else be->axpby(be, tr, 1.0f, tr, m->proj[l], lv);
    }
    dt_mat tbias = txt_mask ? dt_mat_cols(bias, 0, T) : dt_mat_null();
    for (int i = 0; i < c->n_refiner; i++) text_block(m, &m->rf[i], tr, 0, tbias);

    /* ---- txt_in, img_in -> joint stream [text, image] ---- */
    dt_mat s = b->s;
    dt_mat txt_rows = dt_mat_rows(s, 0, T), img_rows = dt_mat_rows(s, T, N);
    {
        dt_mat a = fview(b->a, T, E), h = fview(b->h1, T, D);
        be->rmsnorm(be, a, tr, m->txt_norm, 1.0f, c->eps);
        be->linear(be, h, a, m->txt_lin1);
        be->act_mul(be, h, h, dt_mat_null(), DT_ACT_GELU_TANH);
        be->linear(be, txt_rows, h, m->txt_lin2);
    }
    be->upload(be, b->in_img, img);
    be->linear(be, img_rows, b->in_img, m->img_in);

    /* ---- transformer blocks ---- */
    dt_mat a = fview(b->a, L, D);
    char name[32];
    for (int l = 0; l < c->num_layers; l++) {
        const k2_block *blk = &m->blk[l];
        mod_norm(m, a, s, 2 * l, 4 * l);
        attention_block(m, &blk->attn, a, a, 0, b->cos, b->sin, bias);
        be->gated_add(be, s, dt_mat_rows(b->modv, 4 * l + 1, 1), a);
        mod_norm(m, a, s, 2 * l + 1, 4 * l + 2);
        ff_block(m, &blk->ff, a, a, c->intermediate);
        be->gated_add(be, s, dt_mat_rows(b->modv, 4 * l + 3, 1), a);
        if (trace) {
            snprintf(name, sizeof name, "block.%d", l);
            trace(trace_ud, name, s);
        }
    }

    /* ---- final layer on the image rows ---- */
    dt_mat an = fview(b->a, N, D);
    mod_norm(m, an, img_rows, 2 * c->num_layers, 4 * c->num_layers);
    be->linear(be, b->outm, an, m->final_lin);
    be->download(be, out, b->outm);
    return be->sync(be);
}
