/* krea2.c — Krea 2 transformer forward (diffusers Krea2Transformer2DModel) on backend ops.
 *
 * Flow (T text tokens, N image tokens, L = T + N, D hidden, Y = text_layers, E = text_dim):
 *   timestep -> sinusoid [cos | sin] -> MLP (GELU tanh) = temb [1, D];
 *   time_mod_proj(GELU(temb)) = [1, 6D], shared by every block plus a per-block table [6, D];
 *   text [T*Y, E] -> layerwise fusion blocks (attention across the Y layers of each token)
 *     -> projector Y->1 -> refiner blocks (attention across tokens, text key-padding mask)
 *     -> txt_in (RMSNorm, Linear, GELU tanh, Linear) = joint rows [0, T);
 *   img_in(img) = joint rows [T, L); blocks on the joint stream S [L, D]; final layer on rows [T, L).
 * A batch of sequences (krea2_forward_batch: classifier-free guidance's prompt and negative prompt) stacks them:
 * S [nb·L, D] sequence after sequence, the text fusion over nb·T tokens; every Linear runs once on all rows, each
 * attention per sequence (NOTES.md, "Guidance batch").
 *
 * The modulated norm (1 + scale) * RMSNorm_{1+w}(x) + shift is one rmsnorm_mod pass: the scale is
 * folded into the RMSNorm weight on the host ((1 + w) * (1 + scale), an F32 [1, D] param per norm and
 * forward), the shift added in the same pass. With fp8 Linears taking fused inputs the norm feeds its
 * Linears directly (rmsnorm_mod_linears: q/k/v/gate, then the SwiGLU's gate/up, from one quantized input).
 * With weights in host memory (dt_linear_on_host) each block Linear hints the next (linear_prefetch) so that its
 * transfer over the bus overlaps the GEMM before it.
 * Layerwise text attention (one sequence of Y layers per token) keeps the text stream layer-major
 * (row l*T + t) so that a single attention call with T*H heads covers every token.
 * See docs/krea2-notes.md.
 */
#include "krea2.h"
#include "linear_set.h"
#include "lora.h"
#include "lora_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {                         /* Krea2TextFusionBlock: pre-norm, no RoPE, no modulation */
    dt_mat norm1, norm2;                 /* [1, E] F32 raw zero-centred weights (rmsnorm w_offset 1) */
    krea2_attn_w attn;
    krea2_ff_w ff;
} k2_text_block;

/* One captured forward (krea2_set_graph): the buffers' shape and the text mask it was captured with. */
typedef struct {
    void *graph;
    int warm;             /* ran once eagerly at this shape and mask (the next call captures) */
    int masked;
    uint8_t *mask;        /* [t] the mask's copy */
    unsigned long use;    /* last use (the older slot is replaced) */
} k2_graph;
#define K2_GRAPHS 2
static void drop_graphs(krea2_model *m);

struct krea2_model {
    dt_backend *be;                  /* the caller's backend, or the LoRA wrapper around it */
    dt_lora_set *lora;               /* loaded adapters (NULL: none) */
    dt_weights *w;
    krea2_config c;
    krea2_outer_w o;                 /* embedders, timestep MLP, modulation, txt_in, final layer */
    float *proj;                     /* host [Y] text_fusion.projector weights */
    k2_text_block *lw, *rf;          /* layerwise / refiner text fusion blocks */
    krea2_block_w *blk;
    dt_linear_set lin;               /* every created Linear (cleanup, format description) */
    dt_precision precision;          /* krea2_load_opts.precision: the transformer blocks' Linears */
    size_t weight_bytes;
    krea2_acts buf;                  /* for the last (N, T); kept between calls */
    dt_fbc_branch *fbc;              /* First Block Cache state of the forwards (krea2_set_block_cache; NULL: none) */
    const volatile int *cancel;      /* krea2_set_cancel: polled before each block (NULL: none) */
    int use_graph;                   /* krea2_set_graph */
    k2_graph graphs[K2_GRAPHS];
    unsigned long graph_clock;
};

void krea2_set_cancel(krea2_model *m, const volatile int *flag) { m->cancel = flag; }

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
    const int64_t hidden = (int64_t)c->heads * c->head_dim;   /* each factor is at most 2^20: no int product */
    if (hidden > KREA2_MAX_HIDDEN) {
        dt_set_error("%s: num_attention_heads %d x attention_head_dim %d = %lld is over the supported width %d", what,
                     c->heads, c->head_dim, (long long)hidden, KREA2_MAX_HIDDEN);
        return -1;
    }
    c->hidden = (int)hidden;
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

int krea2_runtime_choices(const dt_backend *be, dt_precision linears, dt_precision attn_precision, int fp8_unfused,
                          krea2_config *c, const char *what) {
    c->attn_fp8 = attn_precision == DT_PREC_FP8;   /* --attn-precision fp8: the blocks' attention */
    if (c->attn_fp8 && !be->attention_fp8) {
        dt_set_error("%s: --attn-precision fp8: the %s backend has no fp8 attention%s%s", what, be->name,
                     be->attention_fp8_off ? ": " : "", be->attention_fp8_off ? be->attention_fp8_off : "");
        return -1;
    }
    c->fuse_inputs = linears == DT_PREC_FP8 && !fp8_unfused;
    return 0;
}

/* ------------------------------------------------------------------ loading */

/* Host f32 copy of a float tensor with n elements (+ offset added to every element). NULL on error. */
static float *read_host(const dt_weights *w, const char *name, int64_t n, float offset) {
    float *p = dt_malloc(sizeof(float) * (size_t)n);
    if (dt_weights_read_f32(w, name, p, n) != 0) { free(p); return NULL; }
    if (offset != 0.0f)
        for (int64_t i = 0; i < n; i++) p[i] += offset;   /* torch: weight + 1.0 in f32 */
    return p;
}

static int load_param(dt_backend *be, const dt_weights *w, const char *name, int64_t n, float offset, dt_mat *out) {
    float *p = read_host(w, name, n, offset);
    if (!p) return -1;
    *out = dt_param_upload(be, p, n);
    free(p);
    return 0;
}

static void free_mat(dt_backend *be, dt_mat *x) {
    if (x->data) be->free(be, x);
    memset(x, 0, sizeof *x);
}

#define LIN(dst, nm, o, i, b) do { if (!((dst) = dt_linear_set_load(lin, w, (nm), (o), (i), (b)))) return -1; } while (0)

/* Krea2Attention + Krea2SwiGLU under PREFIX ("transformer_blocks.3", "text_fusion.refiner_blocks.0"). */
static int load_attn_ff(dt_linear_set *lin, const dt_weights *w, const char *prefix, int64_t dim, int heads,
                        int kv_heads, int64_t inter, krea2_attn_w *at, krea2_ff_w *ff) {
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
    if (load_param(lin->be, w, nm, hd, 1.0f, &at->norm_q)) return -1;
    snprintf(nm, sizeof nm, "%s.attn.norm_k.weight", prefix);
    if (load_param(lin->be, w, nm, hd, 1.0f, &at->norm_k)) return -1;
    snprintf(nm, sizeof nm, "%s.ff.gate", prefix); LIN(ff->gate, nm, inter, dim, 0);
    snprintf(nm, sizeof nm, "%s.ff.up", prefix); LIN(ff->up, nm, inter, dim, 0);
    snprintf(nm, sizeof nm, "%s.ff.down", prefix); LIN(ff->down, nm, dim, inter, 0);
    return 0;
}

static void free_attn(dt_backend *be, krea2_attn_w *at) {
    free_mat(be, &at->norm_q);
    free_mat(be, &at->norm_k);
}

static int load_text_block(dt_linear_set *lin, const dt_weights *w, const krea2_config *c, const char *prefix,
                           k2_text_block *b) {
    char nm[512];
    snprintf(nm, sizeof nm, "%s.norm1.weight", prefix);
    if (load_param(lin->be, w, nm, c->text_dim, 0.0f, &b->norm1)) return -1;
    snprintf(nm, sizeof nm, "%s.norm2.weight", prefix);
    if (load_param(lin->be, w, nm, c->text_dim, 0.0f, &b->norm2)) return -1;
    return load_attn_ff(lin, w, prefix, c->text_dim, c->text_heads, c->text_kv_heads, c->text_intermediate, &b->attn,
                        &b->ff);
}

static void free_text_block(dt_backend *be, k2_text_block *b) {
    free_mat(be, &b->norm1);
    free_mat(be, &b->norm2);
    free_attn(be, &b->attn);
}

int krea2_block_w_load(dt_linear_set *lin, const dt_weights *w, const krea2_config *c, int i, krea2_block_w *b) {
    int64_t D = c->hidden;
    char nm[512];
    snprintf(nm, sizeof nm, "transformer_blocks.%d.norm1.weight", i);
    if (!(b->norm1 = read_host(w, nm, D, 1.0f))) return -1;
    snprintf(nm, sizeof nm, "transformer_blocks.%d.norm2.weight", i);
    if (!(b->norm2 = read_host(w, nm, D, 1.0f))) return -1;
    snprintf(nm, sizeof nm, "transformer_blocks.%d.scale_shift_table", i);
    if (!(b->table = read_host(w, nm, 6 * D, 0.0f))) return -1;
    snprintf(nm, sizeof nm, "transformer_blocks.%d", i);
    return load_attn_ff(lin, w, nm, D, c->heads, c->kv_heads, c->intermediate, &b->attn, &b->ff);
}

void krea2_block_w_free(dt_backend *be, krea2_block_w *b) {
    free_attn(be, &b->attn);
    free(b->norm1);
    free(b->norm2);
    free(b->table);
    b->norm1 = b->norm2 = b->table = NULL;
}

int krea2_outer_w_load(dt_linear_set *lin, const dt_weights *w, const krea2_config *c, krea2_outer_w *o) {
    int64_t D = c->hidden, E = c->text_dim;
    LIN(o->img_in, "img_in", D, c->in_channels, 1);
    LIN(o->t_lin1, "time_embed.linear_1", D, c->t_embed, 1);
    LIN(o->t_lin2, "time_embed.linear_2", D, D, 1);
    LIN(o->time_mod, "time_mod_proj", 6 * D, D, 1);
    LIN(o->txt_lin1, "txt_in.linear_1", D, E, 1);
    LIN(o->txt_lin2, "txt_in.linear_2", D, D, 1);
    LIN(o->final_lin, "final_layer.linear", c->out_channels, D, 1);
    if (load_param(lin->be, w, "txt_in.norm.weight", E, 0.0f, &o->txt_norm)) return -1;
    if (!(o->final_norm = read_host(w, "final_layer.norm.weight", D, 1.0f))) return -1;
    if (!(o->final_table = read_host(w, "final_layer.scale_shift_table", 2 * D, 0.0f))) return -1;
    return 0;
}
#undef LIN

void krea2_outer_w_free(dt_backend *be, krea2_outer_w *o) {
    free_mat(be, &o->txt_norm);
    free(o->final_norm);
    free(o->final_table);
    o->final_norm = o->final_table = NULL;
}

static int load_all(krea2_model *m) {
    const krea2_config *c = &m->c;
    char nm[512];
    for (size_t i = 0; i < dt_weights_count(m->w); i++) m->weight_bytes += dt_weights_at(m->w, i)->nbytes;
    if (krea2_outer_w_load(&m->lin, m->w, c, &m->o)) return -1;

    /* projector: Linear(Y -> 1, bias=False), applied on the host-known weights with axpby */
    dt_linear_src ps;
    if (dt_weights_linear(m->w, "text_fusion.projector", 1, c->text_layers, 0, &ps) != 0) return -1;
    m->proj = dt_malloc(sizeof(float) * (size_t)c->text_layers);
    dt_linear_src_rows_f32(&ps, 0, 1, m->proj);

    m->lw = dt_calloc((size_t)(c->n_layerwise ? c->n_layerwise : 1), sizeof *m->lw);
    for (int i = 0; i < c->n_layerwise; i++) {
        snprintf(nm, sizeof nm, "text_fusion.layerwise_blocks.%d", i);
        if (load_text_block(&m->lin, m->w, c, nm, &m->lw[i])) return -1;
    }
    m->rf = dt_calloc((size_t)(c->n_refiner ? c->n_refiner : 1), sizeof *m->rf);
    for (int i = 0; i < c->n_refiner; i++) {
        snprintf(nm, sizeof nm, "text_fusion.refiner_blocks.%d", i);
        if (load_text_block(&m->lin, m->w, c, nm, &m->rf[i])) return -1;
    }
    /* --precision fp8: the transformer blocks' Linears (embedders, modulation, text fusion, final stay bf16) */
    m->lin.precision = m->precision;
    m->blk = dt_calloc((size_t)c->num_layers, sizeof *m->blk);
    for (int i = 0; i < c->num_layers; i++)
        if (krea2_block_w_load(&m->lin, m->w, c, i, &m->blk[i])) return -1;
    return 0;
}

krea2_model *krea2_load(dt_backend *be, const char *path) { return krea2_load_ex(be, path, NULL); }

krea2_model *krea2_load_ex(dt_backend *be, const char *path, const krea2_load_opts *o) {
    const krea2_load_opts bf16 = {0};
    if (!o) o = &bf16;
    char *dir = dt_weights_component_dir(path, "transformer");
    if (!dir) return NULL;
    krea2_model *m = dt_calloc(1, sizeof *m);
    m->be = be;
    m->lin.be = be;
    m->precision = o->precision;
    m->lin.fp8_unfused = o->fp8_unfused;   /* every fp8 Linear */
    m->w = dt_weights_open(dir);
    if (!m->w) { free(dir); free(m); return NULL; }
    char what[4200];
    const json *cfg = dt_weights_class_config(m->w, dir, "Krea2Transformer2DModel", "Krea 2", what, sizeof what);
    free(dir);
    /* an fp8 file: the blocks' Linears run on the fp8 GEMM whatever --precision says, so their producers write the
     * e4m3 codes as under --precision fp8 (the same choice, A/B knob included) */
    const st_tensor *q0 = cfg ? dt_weights_find(m->w, "transformer_blocks.0.attn.to_q.weight") : NULL;
    const int fp8_file = q0 && dt_dtype_is_fp8(q0->dtype);
    if (!cfg || krea2_config_parse(cfg, what, &m->c) ||
        krea2_runtime_choices(be, fp8_file ? DT_PREC_FP8 : o->precision, o->attn_precision, o->fp8_unfused, &m->c,
                              what))
        goto fail;
    /* adapters: the checkpoint's Linear names, and the wrapper for side products */
    if (o->n_loras > 0 && dt_linear_set_use_loras(&m->lin, &m->be, &m->lora, o->loras, o->n_loras, o->lora_side,
                                                  dt_lora_catalogue_from_weights(m->w)))
        goto fail;
    if (load_all(m)) goto fail;
    if (m->lora && dt_lora_check_used(m->lora)) goto fail;
    dt_linear_set_log(&m->lin, "transformer");
    return m;
fail:
    krea2_free(m);
    return NULL;
}

void krea2_free(krea2_model *m) {
    if (!m) return;
    dt_backend *be = m->be;
    drop_graphs(m);
    krea2_acts_free(be, &m->buf);
    dt_linear_set_free(&m->lin);
    krea2_outer_w_free(be, &m->o);
    for (int i = 0; m->lw && i < m->c.n_layerwise; i++) free_text_block(be, &m->lw[i]);
    for (int i = 0; m->rf && i < m->c.n_refiner; i++) free_text_block(be, &m->rf[i]);
    for (int i = 0; m->blk && i < m->c.num_layers; i++) krea2_block_w_free(be, &m->blk[i]);
    free(m->lw);
    free(m->rf);
    free(m->blk);
    free(m->proj);
    if (m->w) dt_weights_close(m->w);
    if (be && dt_lora_backend_is_wrapper(be)) be->destroy(be);   /* the wrapper only, not the caller's */
    dt_lora_free(m->lora);
    free(m);
}

/* ------------------------------------------------------------------ activations */

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

void krea2_acts_free(dt_backend *be, krea2_acts *b) {
    dt_mat *mats[] = {&b->emb, &b->th, &b->temb, &b->tg, &b->tmod, &b->modw, &b->modv, &b->in_img, &b->s,
                      &b->ts, &b->tr, &b->a, &b->q, &b->k, &b->v, &b->g, &b->o, &b->h1, &b->h2,
                      &b->outm, &b->cos, &b->sin};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) free_mat(be, mats[i]);
    free(b->ids);
    free(b->host_mod);
    memset(b, 0, sizeof *b);
}

int krea2_acts_alloc(dt_backend *be, const krea2_config *c, int n, int t, int nb, krea2_acts *b) {
    dt_dtype act = be->act_dtype;
    if (nb < 1 || nb > KREA2_MAX_BATCH) {
        dt_set_error("krea2: %d sequences in one forward (1..%d)", nb, KREA2_MAX_BATCH);
        return -1;
    }
    /* every row count is the batch's: L joint rows and Lt text-fusion rows of all nb sequences */
    const int64_t Ls = (int64_t)n + t;
    int64_t D = c->hidden, L = nb * Ls, E = c->text_dim, Y = c->text_layers;
    int64_t Lt = (int64_t)nb * t * Y;
    int64_t dkv = (int64_t)c->kv_heads * c->head_dim, tdkv = (int64_t)c->text_kv_heads * c->text_head_dim;
    int64_t big = max64(L * D, Lt * E);
    int64_t kv = max64(L * dkv, Lt * tdkv);
    int64_t hid = max64(max64(L * c->intermediate, Lt * c->text_intermediate), (int64_t)nb * t * D);
    int nl = c->num_layers;
    struct { dt_mat *m; int64_t rows, cols; dt_dtype t; } all[] = {
        {&b->emb, 1, c->t_embed, act},   {&b->th, 1, D, act},          {&b->temb, 1, D, act},
        {&b->tg, 1, D, act},             {&b->tmod, 1, 6 * D, act},    {&b->modw, 2 * nl + 1, D, DT_F32},
        {&b->modv, 4 * nl + 1, D, act},  {&b->in_img, (int64_t)nb * n, c->in_channels, act},
        {&b->s, L, D, act},              {&b->ts, 1, Lt * E, act},
        {&b->tr, 1, (int64_t)nb * t * E, act}, {&b->a, 1, big, act},   {&b->q, 1, big, act},
        {&b->k, 1, kv, act},             {&b->v, 1, kv, act},          {&b->g, 1, big, act},
        {&b->o, 1, big, act},            {&b->h1, 1, hid, act},        {&b->h2, 1, hid, act},
        {&b->outm, (int64_t)nb * n, c->out_channels, act}, {&b->cos, L, c->head_dim, DT_F32},
        {&b->sin, L, c->head_dim, DT_F32},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (be->alloc(be, all[i].m, all[i].rows, all[i].cols, all[i].t)) { krea2_acts_free(be, b); return -1; }
    b->n = n; b->t = t; b->nb = nb;
    b->ids = dt_malloc(sizeof(float) * (size_t)(L * c->n_axes));
    b->host_mod = dt_malloc(sizeof(float) * (size_t)((6 * nl + 9) * D));   /* see krea2_time_mods */
    /* mark the RoPE tables stale */
    for (int64_t i = 0; i < L * c->n_axes; i++) b->ids[i] = NAN;
    return 0;
}

/* RoPE tables for the [text, image] sequence (Krea2RotaryPosEmbed = FLUX's): per axis a with d_a
 * dims, ω_k = 1 / θ^(2k/d_a) in float64, angle = pos · ω_k in float64, cos/sin rounded to f32,
 * each frequency repeated for the interleaved pair (2k, 2k+1). */
void krea2_acts_positions(dt_backend *be, const krea2_config *c, krea2_acts *b, const float *pos) {
    int64_t L = (int64_t)b->nb * (b->n + b->t);
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
    be->upload(be, b->cos, cs);
    be->upload(be, b->sin, sn);
    free(cs);
    free(sn);
    free(omega);
    memcpy(b->ids, pos, sizeof(float) * nids);
}

int krea2_acts_mask(krea2_acts *b, const uint8_t *mask) {
    for (int i = 0; i < b->nb; i++) b->key0[i] = 0;
    if (!mask) return 0;
    for (int i = 0; i < b->nb; i++) {
        const uint8_t *mk = mask + (size_t)i * b->t;
        int64_t k0 = 0;
        while (k0 < b->t && !mk[k0]) k0++;
        if (k0 == b->t) { dt_set_error("krea2: sequence %d's text mask marks no real token", i); return -1; }
        for (int64_t j = k0; j < b->t; j++)
            if (!mk[j]) {
                dt_set_error("krea2: sequence %d's text mask is not [padding | real tokens] (token %lld padded after a "
                             "real one)", i, (long long)j);
                return -1;
            }
        b->key0[i] = k0;
    }
    return 0;
}

krea2_block_io krea2_acts_block(const krea2_config *c, const krea2_acts *x) {
    int64_t Ls = (int64_t)x->n + x->t, L = x->nb * Ls, D = c->hidden, dkv = (int64_t)c->kv_heads * c->head_dim,
            F = c->intermediate;
    krea2_block_io io = {
        .s = x->s,                   .a = fview(x->a, L, D),
        .q = fview(x->q, L, D),      .g = fview(x->g, L, D),      .o = fview(x->o, L, D),
        .k = fview(x->k, L, dkv),    .v = fview(x->v, L, dkv),
        .h1 = fview(x->h1, L, F),    .h2 = fview(x->h2, L, F),
        .cos = x->cos,               .sin = x->sin,
        .modw = x->modw,             .modv = x->modv,
        .nb = x->nb,                 .L = Ls,
    };
    for (int i = 0; i < x->nb; i++) io.key0[i] = x->key0[i];
    return io;
}

/* ------------------------------------------------------------------ forward pieces */

/* Most heads per attention call in batched mode (CUDA grids put heads on gridDim.y <= 65535). */
#define K2_MAX_BATCHED_HEADS 32768

/* The four projections of Krea2Attention: x [R, dim] -> q, g [R, dim], k, v [R, kv_heads*hd]. */
static void attn_proj(dt_backend *be, const krea2_attn_w *at, dt_mat x, dt_mat q, dt_mat k, dt_mat v, dt_mat g) {
    be->linear(be, q, x, at->q);
    be->linear(be, k, x, at->k);
    be->linear(be, v, x, at->v);
    be->linear(be, g, x, at->gate);
}

/* Per-head RMSNorm of q and k with their weights (w_q / w_k; null data: none) and the rotation by cos/sin (mode). */
static void attn_qk(dt_backend *be, const krea2_attn_w *at, float eps, dt_mat q, dt_mat k, dt_mat w_q, dt_mat w_k,
                    dt_mat cos, dt_mat sin, dt_rope_mode mode) {
    be->head_norm_rope(be, q, at->heads, at->hd, w_q, eps, cos, sin, mode);
    be->head_norm_rope(be, k, at->kv_heads, at->hd, w_k, eps, cos, sin, mode);
}

/* Krea2Attention on normed input x [R, dim] -> y [R, dim] (y may be x's buffer: x is consumed first), on the
 * flat scratch buffers of b. nseq = 0: nb sequences of R / nb rows one after another (the batch's texts), sequence i
 * attending over its own rows from key0[i] on (its padding first; key0 NULL: every row). nseq > 0: nseq
 * independent sequences of R / nseq rows
 * stored sequence-position-major (row p * nseq + s is position p of sequence s; the layerwise text fusion
 * uses layer-major rows l * T + t). Then Q/K/V [R, H*hd] are reinterpreted as [R/nseq, nseq*H*hd]:
 * one attention call with nseq*H query heads and nseq*Hkv kv heads attends within each sequence
 * (q head s*H + h uses kv head s*Hkv + h/(H/Hkv), exactly the per-sequence GQA mapping).
 * No RoPE (the text fusion has none). */
static void text_attention(dt_backend *be, const krea2_acts *b, const krea2_attn_w *at, float eps, dt_mat x, dt_mat y,
                           int64_t nseq, int nb, const int64_t *key0) {
    int64_t R = x.rows, dim = x.cols, dkv = (int64_t)at->kv_heads * at->hd;
    dt_mat q = fview(b->q, R, dim), k = fview(b->k, R, dkv), v = fview(b->v, R, dkv);
    dt_mat g = fview(b->g, R, dim), o = fview(b->o, R, dim);
    attn_proj(be, at, x, q, k, v, g);
    attn_qk(be, at, eps, q, k, at->norm_q, at->norm_k, dt_mat_null(), dt_mat_null(), DT_ROPE_NONE);
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
        const int64_t len = R / nb;
        for (int i = 0; i < nb; i++) {
            const int64_t k0 = key0 ? key0[i] : 0;
            be->attention(be, dt_mat_rows(o, i * len, len), dt_mat_rows(q, i * len, len),
                          dt_mat_rows(k, i * len + k0, len - k0), dt_mat_rows(v, i * len + k0, len - k0), at->heads,
                          at->kv_heads, at->hd, scale, dt_mat_null(), 0);
        }
    }
    be->act_mul(be, o, g, o, DT_ACT_SIGMOID);   /* attn * sigmoid(to_gate(x)) */
    be->linear(be, y, o, at->out);
}

/* Krea2TextFusionBlock on the stream s [R, E] in place (nseq, nb, key0: see text_attention). */
static void text_block(dt_backend *be, const krea2_config *c, krea2_acts *b, const k2_text_block *tb, dt_mat s,
                       int64_t nseq, int nb, const int64_t *key0) {
    dt_mat a = fview(b->a, s.rows, s.cols);
    dt_mat h1 = fview(b->h1, s.rows, c->text_intermediate), h2 = fview(b->h2, s.rows, c->text_intermediate);
    be->rmsnorm(be, a, s, tb->norm1, 1.0f, c->eps);
    text_attention(be, b, &tb->attn, c->eps, a, a, nseq, nb, key0);
    be->gated_add(be, s, dt_mat_null(), a);
    be->rmsnorm(be, a, s, tb->norm2, 1.0f, c->eps);
    be->linear(be, h1, a, tb->ff.gate);   /* Krea2SwiGLU */
    be->linear(be, h2, a, tb->ff.up);
    be->act_mul(be, h1, h1, h2, DT_ACT_SILU);
    be->linear(be, a, h1, tb->ff.down);
    be->gated_add(be, s, dt_mat_null(), a);
}

void krea2_time_mods(dt_backend *be, const krea2_config *c, const krea2_outer_w *o, const krea2_block_w *blk,
                     krea2_acts *b, float timestep) {
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
    be->linear(be, b->th, b->emb, o->t_lin1);
    be->act_mul(be, b->th, b->th, dt_mat_null(), DT_ACT_GELU_TANH);
    be->linear(be, b->temb, b->th, o->t_lin2);
    be->act_mul(be, b->tg, b->temb, dt_mat_null(), DT_ACT_GELU_TANH);
    be->linear(be, b->tmod, b->tg, o->time_mod);

    int nlay = c->num_layers;
    float *tmod = b->host_mod;                 /* [6D] */
    float *temb = tmod + 6 * D;                /* [D] */
    float *w = temb + D;                       /* [(2*nlay + 1) * D] folded norm weights */
    float *vv = w + (2 * nlay + 1) * D;        /* [(4*nlay + 1) * D] shifts and gates */
    be->download(be, tmod, b->tmod);
    be->download(be, temb, b->temb);
    for (int l = 0; l < nlay; l++) {
        const krea2_block_w *bl = &blk[l];
        for (int64_t j = 0; j < D; j++) {
            float mod[6];
            for (int q = 0; q < 6; q++) mod[q] = tmod[q * D + j] + bl->table[q * D + j];
            /* order: prescale, preshift, pregate, postscale, postshift, postgate */
            w[(2 * l) * D + j] = bl->norm1[j] * (1.0f + mod[0]);
            w[(2 * l + 1) * D + j] = bl->norm2[j] * (1.0f + mod[3]);
            vv[(4 * l) * D + j] = mod[1];
            vv[(4 * l + 1) * D + j] = mod[2];
            vv[(4 * l + 2) * D + j] = mod[4];
            vv[(4 * l + 3) * D + j] = mod[5];
        }
    }
    /* Krea2FinalLayer: (temb + table) chunked -> scale = row 0, shift = row 1 (raw temb, no GELU) */
    for (int64_t j = 0; j < D; j++) {
        float scale = temb[j] + o->final_table[j], shift = temb[j] + o->final_table[D + j];
        w[(2 * nlay) * D + j] = o->final_norm[j] * (1.0f + scale);
        vv[(4 * nlay) * D + j] = shift;
    }
    be->upload(be, b->modw, w);
    be->upload(be, b->modv, vv);
}

/* y = RMSNorm(x) * folded weight row wi + shift row vi (the modulated norm of the blocks and the final layer). */
static void mod_norm(dt_backend *be, const krea2_config *c, dt_mat y, dt_mat x, dt_mat modw, dt_mat modv, int wi,
                     int vi) {
    be->rmsnorm_mod(be, y, x, dt_mat_rows(modw, wi, 1), dt_mat_rows(modv, vi, 1), c->eps);
}

/* y = x · Wᵀ; first, where the weights are read over the bus (dt_linear_on_host), a prefetch hint for w (a no-op
 * when already hinted) and one for `next`, the Linear after it, so that next's transfer overlaps this GEMM (two
 * slots: w's and next's). With device weights no hint: there it could only overlap a GEMM, which lost (PERF.md). */
static void k2_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w, const dt_linear *next) {
    if (dt_linear_on_host(be, w)) dt_prefetch(be, w, dt_mat_null(), x.rows);
    if (dt_linear_on_host(be, next)) dt_prefetch(be, next, dt_mat_null(), x.rows);
    be->linear(be, y, x, w);
}

/* The blocks' GQA attention, per sequence of the batch (its L rows): over its real keys only, rows [key0, L) (a
 * shorter text's padding comes first: krea2_acts_mask). A padded key's weight would be exp(-inf) = 0, so this is
 * exactly the masked attention, as a view and without a mask: bf16, or with c->attn_fp8 the backend's fp8 attention
 * (its per-tensor K / V scales then cover the sequence's real keys only, as in its single forward). */
static void block_attention(dt_backend *be, const krea2_config *c, const krea2_attn_w *at, const krea2_block_io *io) {
    const float scale = 1.0f / sqrtf((float)at->hd);
    const int64_t L = io->L;
    for (int b = 0; b < io->nb; b++) {
        const int64_t k0 = b * L + io->key0[b];
        dt_mat o = dt_mat_rows(io->o, b * L, L), q = dt_mat_rows(io->q, b * L, L);
        dt_mat k = dt_mat_rows(io->k, k0, L - io->key0[b]), v = dt_mat_rows(io->v, k0, L - io->key0[b]);
        if (c->attn_fp8) be->attention_fp8(be, o, q, k, v, at->heads, at->kv_heads, at->hd, scale);
        else be->attention(be, o, q, k, v, at->heads, at->kv_heads, at->hd, scale, dt_mat_null(), 0);
    }
}

void krea2_block_op(dt_backend *be, const krea2_config *c, const krea2_block_w *w, const krea2_block_io *io, int l,
                    int k, int split) {
    const krea2_attn_w *at = &w->attn;
    dt_mat none = dt_mat_null();
    switch (k) {
    /* with fuse_inputs the norms run inside QKVG / MLPIN (rmsnorm_mod_linears: fp8 Linears read one quantized input) */
    case KREA2_OP_NORM1:
        if (!c->fuse_inputs) mod_norm(be, c, io->a, io->s, io->modw, io->modv, 2 * l, 4 * l);
        break;
    case KREA2_OP_QKVG:
        if (c->fuse_inputs) {
            const dt_linear *lin[4] = {at->q, at->k, at->v, at->gate};
            const dt_mat y[4] = {io->q, io->k, io->v, io->g};
            be->rmsnorm_mod_linears(be, io->s, dt_mat_rows(io->modw, 2 * l, 1), dt_mat_rows(io->modv, 4 * l, 1),
                                    c->eps, io->a, 4, lin, y);
        } else {
            k2_linear(be, io->q, io->a, at->q, at->k);
            k2_linear(be, io->k, io->a, at->k, at->v);
            k2_linear(be, io->v, io->a, at->v, at->gate);
            k2_linear(be, io->g, io->a, at->gate, at->out);   /* out's transfer overlaps the attention too */
        }
        break;
    case KREA2_OP_QKNORM:
        attn_qk(be, at, c->eps, io->q, io->k, at->norm_q, at->norm_k, io->cos, io->sin,
                split ? DT_ROPE_NONE : DT_ROPE_INTERLEAVED);
        break;
    case KREA2_OP_ROPE:
        if (split) attn_qk(be, at, c->eps, io->q, io->k, none, none, io->cos, io->sin, DT_ROPE_INTERLEAVED);
        break;
    case KREA2_OP_ATTN: block_attention(be, c, at, io); break;
    /* attn * sigmoid(to_gate(x)) -> to_out -> s += pregate * out: with fuse_inputs one act_linear_gated (OUT) */
    case KREA2_OP_GATE:
        if (!c->fuse_inputs) be->act_mul(be, io->o, io->g, io->o, DT_ACT_SIGMOID);
        break;
    case KREA2_OP_OUT:
        if (c->fuse_inputs)
            be->act_linear_gated(be, io->s, io->o, 0, io->g, io->o, DT_ACT_SIGMOID, at->out,
                                 dt_mat_rows(io->modv, 4 * l + 1, 1), io->a);
        else k2_linear(be, io->a, io->o, at->out, w->ff.gate);
        break;
    case KREA2_OP_RESID1:
        if (!c->fuse_inputs) be->gated_add(be, io->s, dt_mat_rows(io->modv, 4 * l + 1, 1), io->a);
        break;
    case KREA2_OP_NORM2:
        if (!c->fuse_inputs) mod_norm(be, c, io->a, io->s, io->modw, io->modv, 2 * l + 1, 4 * l + 2);
        break;
    case KREA2_OP_MLPIN:
        if (c->fuse_inputs) {
            const dt_linear *lin[2] = {w->ff.gate, w->ff.up};
            const dt_mat y[2] = {io->h1, io->h2};
            be->rmsnorm_mod_linears(be, io->s, dt_mat_rows(io->modw, 2 * l + 1, 1), dt_mat_rows(io->modv, 4 * l + 2, 1),
                                    c->eps, io->a, 2, lin, y);
        } else {
            k2_linear(be, io->h1, io->a, w->ff.gate, w->ff.up);
            k2_linear(be, io->h2, io->a, w->ff.up, w->ff.down);
        }
        break;
    /* silu(gate) * up -> ff.down -> s += postgate * mlp: with fuse_inputs one act_linear_gated (DOWN) */
    case KREA2_OP_SWIGLU:
        if (!c->fuse_inputs) be->act_mul(be, io->h1, io->h1, io->h2, DT_ACT_SILU);
        break;
    case KREA2_OP_DOWN:
        if (c->fuse_inputs)
            be->act_linear_gated(be, io->s, io->h1, 0, io->h1, io->h2, DT_ACT_SILU, w->ff.down,
                                 dt_mat_rows(io->modv, 4 * l + 3, 1), io->a);
        else k2_linear(be, io->a, io->h1, w->ff.down, io->next);
        break;
    case KREA2_OP_RESID2:
        if (!c->fuse_inputs) be->gated_add(be, io->s, dt_mat_rows(io->modv, 4 * l + 3, 1), io->a);
        break;
    }
}

void krea2_block(dt_backend *be, const krea2_config *c, const krea2_block_w *w, const krea2_block_io *io, int l) {
    for (int k = 0; k < KREA2_OP_COUNT; k++) krea2_block_op(be, c, w, io, l, k, 0);
}

void krea2_set_block_cache(krea2_model *m, dt_fbc_branch *f) { m->fbc = f; }

/* The device part of a forward (capturable with may_stop 0): everything between the host inputs (time_mods,
 * positions, mask, text and latents uploaded) and the output in b->outm. The b->nb sequences share every Linear
 * (their rows together), the text fusion's and the blocks' attentions run per sequence. may_stop: before each block,
 * stop when the request is cancelled (m->cancel) and return 1; else 0. */
static int device_part(krea2_model *m, krea2_trace_fn trace, void *trace_ud, int may_stop) {
    const krea2_config *c = &m->c;
    dt_backend *be = m->be;
    krea2_acts *b = &m->buf;
    const int nb = b->nb;
    int64_t D = c->hidden, E = c->text_dim, Y = c->text_layers, T = b->t, N = b->n, L = T + N, Tb = nb * T;

    /* ---- text fusion over the Tb tokens of every sequence (sequence i's tokens i·T ..) ---- */
    /* the token-major [Tb*Y, E] upload reordered to layer-major rows l*Tb + t (Y strided copies) */
    dt_mat ts = fview(b->ts, Tb * Y, E), raw = fview(b->a, Tb * Y, E);
    for (int64_t l = 0; l < Y; l++) {
        dt_mat lv = dt_mat_rows(raw, l, Tb);   /* layer l of every token: rows l, l+Y, ... */
        lv.ld = raw.ld * Y;
        be->copy(be, dt_mat_rows(ts, l * Tb, Tb), lv);
    }
    for (int i = 0; i < c->n_layerwise; i++) text_block(be, c, b, &m->lw[i], ts, Tb, 1, NULL);
    /* projector Y -> 1: tr[t] = sum_l p_l * ts[l*Tb + t] */
    dt_mat tr = fview(b->tr, Tb, E);
    for (int64_t l = 0; l < Y; l++) {
        dt_mat lv = dt_mat_rows(ts, l * Tb, Tb);
        if (l == 0) be->axpby(be, tr, m->proj[0], lv, 0.0f, dt_mat_null());
        else be->axpby(be, tr, 1.0f, tr, m->proj[l], lv);
    }
    for (int i = 0; i < c->n_refiner; i++) text_block(be, c, b, &m->rf[i], tr, 0, nb, b->key0);   /* each text's own */

    /* ---- txt_in, img_in -> joint stream, per sequence [text, image] ---- */
    dt_mat s = b->s;
    dt_mat txt_rows = dt_mat_rows(s, 0, T), img_rows = dt_mat_rows(s, T, N);
    {
        dt_mat a = fview(b->a, Tb, E), h = fview(b->h1, Tb, D);
        be->rmsnorm(be, a, tr, m->o.txt_norm, 1.0f, c->eps);
        be->linear(be, h, a, m->o.txt_lin1);
        be->act_mul(be, h, h, dt_mat_null(), DT_ACT_GELU_TANH);
        if (nb == 1) {
            be->linear(be, txt_rows, h, m->o.txt_lin2);
        } else {   /* all texts in one GEMM, then each into its sequence's rows */
            dt_mat tx = fview(b->q, Tb, D);
            be->linear(be, tx, h, m->o.txt_lin2);
            for (int i = 0; i < nb; i++) be->copy(be, dt_mat_rows(s, i * L, T), dt_mat_rows(tx, i * T, T));
        }
    }
    for (int i = 0; i < nb; i++)
        be->linear(be, dt_mat_rows(s, i * L + T, N), dt_mat_rows(b->in_img, i * N, N), m->o.img_in);

    /* ---- transformer blocks ---- */
    krea2_block_io io = krea2_acts_block(c, b);
    char name[32];
    if (m->fbc) dt_fbc_begin(be, m->fbc, img_rows);   /* (one sequence: forward checks) */
    for (int l = 0; l < c->num_layers; l++) {
        if (may_stop && dt_cancel_requested(m->cancel)) return 1;
        /* (not ahead of First Block Cache's decision after block 0: a skipped block would leave its hint pending) */
        io.next = l + 1 < c->num_layers && !(m->fbc && l == 0) ? m->blk[l + 1].attn.q : NULL;
        krea2_block(be, c, &m->blk[l], &io, l);
        if (trace) {
            snprintf(name, sizeof name, "block.%d", l);
            trace(trace_ud, name, s);
        }
        if (m->fbc && l == 0 && !dt_fbc_after_head(be, m->fbc, img_rows)) break;   /* the cached residual instead */
        if (m->fbc && l == c->num_layers - 1) dt_fbc_end(be, m->fbc, img_rows);
    }

    /* ---- final layer on the image rows of every sequence (one GEMM) ---- */
    dt_mat an = fview(b->a, nb * N, D);
    for (int i = 0; i < nb; i++)
        mod_norm(be, c, dt_mat_rows(an, i * N, N), dt_mat_rows(s, i * L + T, N), b->modw, b->modv,
                 2 * c->num_layers, 4 * c->num_layers);
    be->linear(be, b->outm, an, m->o.final_lin);
    return 0;
}

/* Destroy the captured graphs, keeping their slots' masks (warm: the next use captures again). Before any eager
 * forward while graphs exist: an eager forward may grow a scratch buffer (fp8 attention's grows with the number of
 * unmasked keys) that a captured graph points into. */
static void drop_captured(krea2_model *m) {
    for (int i = 0; i < K2_GRAPHS; i++)
        if (m->graphs[i].graph) {
            m->be->graph_destroy(m->be, m->graphs[i].graph);
            m->graphs[i].graph = NULL;
        }
}

/* The graph slot for this forward's mask (the shape is the buffers'; a batch's: its sequences' masks); when none
 * matches, the older slot takes the mask (and every captured graph goes: this call runs eagerly). A guided step in
 * two passes alternates the prompt's and the negative prompt's masks: two slots. */
static k2_graph *graph_slot(krea2_model *m, const uint8_t *mask) {
    const int t = m->buf.t * m->buf.nb;   /* a batch's masks, one after another */
    for (int i = 0; i < K2_GRAPHS; i++) {
        k2_graph *g = &m->graphs[i];
        if ((g->graph || g->warm) && g->masked == (mask != NULL) && (!mask || !memcmp(g->mask, mask, (size_t)t))) {
            g->use = ++m->graph_clock;
            return g;
        }
    }
    drop_captured(m);
    k2_graph *g = &m->graphs[0];
    for (int i = 1; i < K2_GRAPHS; i++)
        if (m->graphs[i].use < g->use) g = &m->graphs[i];
    g->warm = 0;
    g->masked = mask != NULL;
    free(g->mask);
    g->mask = dt_malloc((size_t)t + 1);
    if (mask) memcpy(g->mask, mask, (size_t)t);
    g->use = ++m->graph_clock;
    return g;
}

static void drop_graphs(krea2_model *m) {
    for (int i = 0; i < K2_GRAPHS; i++) {
        k2_graph *g = &m->graphs[i];
        if (g->graph) m->be->graph_destroy(m->be, g->graph);
        free(g->mask);
        memset(g, 0, sizeof *g);
    }
}

void krea2_set_graph(krea2_model *m, int on) {
    dt_backend *be = m->be;
    m->use_graph = on && be->capture_begin && be->capture_end && be->graph_launch && be->graph_destroy;
    if (!m->use_graph) drop_graphs(m);
}

/* The real text tokens of sequence q: its mask's ones (every token without a mask). */
static int real_tokens(const krea2_seq *q) {
    if (!q->mask) return q->n_txt;
    int real = 0;
    for (int j = 0; j < q->n_txt; j++) real += q->mask[j] != 0;
    return real;
}

/* Text rows of a forward whose padding was dropped: the most real tokens rounded up to a multiple of this (within the
 * longest text given), the rows above them padding (masked keys). A prompt of a new length then reuses the GEMM
 * algorithms tuned and the buffers sized for its bucket instead of timing every Linear's candidates again at a new
 * row count (~15-50 ms a shape, once per process and length): ≤ 31 idle rows of ~4100 at 1024². */
#define K2_TEXT_BUCKET 32

int krea2_text_rows(int real, int longest) {
    if (real >= longest) return longest;
    const int b = (real + K2_TEXT_BUCKET - 1) / K2_TEXT_BUCKET * K2_TEXT_BUCKET;
    return b < longest ? b : longest;
}

/* Check the inputs of a batch of nb sequences; *t_max: the batch's text rows — the most real text tokens, rounded up
 * to K2_TEXT_BUCKET (at most the longest text) when a mask dropped some. 0 or -1. */
static int check_batch(const krea2_model *m, const krea2_seq *seq, int nb, int n_img, float timestep, int *t_max) {
    const krea2_config *c = &m->c;
    if (nb < 1 || nb > KREA2_MAX_BATCH) {
        dt_set_error("krea2_forward: %d sequences in one forward (1..%d)", nb, KREA2_MAX_BATCH);
        return -1;
    }
    if (nb > 1 && m->fbc) {
        dt_set_error("krea2_forward: First Block Cache keeps one state per forward: run the sequences one by one");
        return -1;
    }
    *t_max = 0;
    int longest = 0, dropped = 0;
    for (int i = 0; i < nb; i++) {
        const krea2_seq *q = &seq[i];
        if (!(q->img || q->img_m.data) || !q->txt || !q->pos || !(q->out || q->out_m.data)) {
            dt_set_error("krea2_forward: NULL input or output");
            return -1;
        }
        if ((q->img_m.data && (q->img_m.rows != n_img || q->img_m.cols != c->in_channels)) ||
            (q->out_m.data && (q->out_m.rows != n_img || q->out_m.cols != c->out_channels))) {
            dt_set_error("krea2_forward: latents [%lld, %lld] / velocity [%lld, %lld] on the backend, expected [%d, %d]",
                         (long long)q->img_m.rows, (long long)q->img_m.cols, (long long)q->out_m.rows,
                         (long long)q->out_m.cols, n_img, c->in_channels);
            return -1;
        }
        if (n_img < 1 || q->n_txt < 1) {
            dt_set_error("krea2_forward: need at least one image and one text token (got N=%d, T=%d)", n_img, q->n_txt);
            return -1;
        }
        const int real = real_tokens(q);
        if (!real) {
            /* the reference would produce NaN (softmax over no key in the refiner) */
            dt_set_error("krea2_forward: the text mask marks no valid token");
            return -1;
        }
        if (real > *t_max) *t_max = real;
        if (q->n_txt > longest) longest = q->n_txt;
        dropped |= real != q->n_txt;
    }
    if (dropped) *t_max = krea2_text_rows(*t_max, longest);
    if (!isfinite(timestep)) { dt_set_error("krea2_forward: timestep is not finite"); return -1; }
    return 0;
}

/* The host inputs of a batch into the buffers, the texts compacted to their real tokens (T: the most of any sequence;
 * NOTES.md, "Krea 2: padded text tokens are not computed"): a padded token is never attended to (a masked key) and
 * its rows are dropped at the output, so the image rows do not depend on it; all text rows sit at position 0. Sequence
 * i's ti real tokens take the last ti of its T text rows, in their order; a shorter text's first T - ti rows are
 * zero features (finite) masked as keys, so its keys stay one run of rows (block_attention: a view, no mask).
 * Uploaded: positions [nb·L, axes], the mask [nb·T] (NULL when every sequence has T real tokens), the texts
 * token-major [nb·T·Y, E] and the latents [nb·N, in]. One sequence without padding uses its own arrays as they are.
 * *mask_out: the batch's mask (NULL: none), owned[0..1]: what was allocated for it (the caller frees). 0 or -1. */
static int upload_batch(krea2_model *m, const krea2_seq *seq, int nb, int T, const uint8_t **mask_out,
                        void *owned[2]) {
    const krea2_config *c = &m->c;
    dt_backend *be = m->be;
    krea2_acts *b = &m->buf;
    const int64_t N = b->n, L = T + N, na = c->n_axes, Y = c->text_layers, E = c->text_dim;
    int padded = 0, compact = 0, real[KREA2_MAX_BATCH];
    for (int i = 0; i < nb; i++) {
        real[i] = real_tokens(&seq[i]);
        padded |= real[i] != T;
        compact |= real[i] != seq[i].n_txt;
    }
    const float *pos = seq[0].pos;
    owned[0] = owned[1] = NULL;
    if (nb > 1 || compact) {
        float *pa = owned[0] = dt_calloc((size_t)(nb * L * na), sizeof(float));
        uint8_t *ma = owned[1] = padded ? dt_calloc((size_t)nb * T, 1) : NULL;
        for (int i = 0; i < nb; i++) {
            const krea2_seq *q = &seq[i];
            int64_t r = i * L + T - real[i];   /* the first real text row (padding rows: position 0) */
            for (int j = 0; j < q->n_txt; j++)
                if (!q->mask || q->mask[j]) memcpy(pa + r++ * na, q->pos + (int64_t)j * na, sizeof(float) * (size_t)na);
            memcpy(pa + (i * L + T) * na, q->pos + q->n_txt * na, sizeof(float) * (size_t)(N * na));
            if (ma) memset(ma + (size_t)i * T + (T - real[i]), 1, (size_t)real[i]);
        }
        pos = pa;
    }
    const uint8_t *mask = owned[1];
    *mask_out = mask;
    krea2_acts_positions(be, c, b, pos);
    if (krea2_acts_mask(b, mask)) return -1;
    /* the texts token-major into scratch (device_part reorders them): each run of real tokens in one upload */
    dt_mat raw = fview(b->a, (int64_t)nb * T * Y, E);
    float *zeros = NULL;
    for (int i = 0; i < nb; i++) {
        const krea2_seq *q = &seq[i];
        const int64_t pad = T - real[i];
        if (pad) {
            if (!zeros) zeros = dt_calloc((size_t)(T * Y * E), sizeof(float));
            be->upload(be, dt_mat_rows(raw, i * T * Y, pad * Y), zeros);
        }
        int64_t r = i * T + pad;
        for (int j = 0; j < q->n_txt;) {
            if (q->mask && !q->mask[j]) { j++; continue; }
            int j1 = j + 1;
            while (j1 < q->n_txt && (!q->mask || q->mask[j1])) j1++;
            be->upload(be, dt_mat_rows(raw, r * Y, (j1 - j) * Y), q->txt + (size_t)j * Y * E);
            r += j1 - j;
            j = j1;
        }
        dt_mat dst = dt_mat_rows(b->in_img, i * N, N);
        if (q->img) be->upload(be, dst, q->img);
        else be->copy(be, dst, q->img_m);
    }
    free(zeros);
    return 0;
}

/* The forward of a batch (krea2_forward_batch; a trace only with host outputs). Device outputs are queued; with a
 * host output the backend is synchronized. */
static int forward(krea2_model *m, const krea2_seq *seq, int nb, int n_img, float timestep, krea2_trace_fn trace,
                   void *trace_ud) {
    const krea2_config *c = &m->c;
    int T;
    if (check_batch(m, seq, nb, n_img, timestep, &T)) return -1;
    dt_backend *be = m->be;
    krea2_acts *b = &m->buf;
    if (!(b->s.data && b->n == n_img && b->t == T && b->nb == nb)) {
        drop_graphs(m);   /* a captured forward refers to the old buffers */
        krea2_acts_free(be, b);
        if (krea2_acts_alloc(be, c, n_img, T, nb, b)) return -1;
    }

    krea2_time_mods(be, c, &m->o, m->blk, b, timestep);
    const uint8_t *mask = NULL;
    void *owned[2];
    int rc = 0;
    if (upload_batch(m, seq, nb, T, &mask, owned)) { rc = -1; goto out; }

    /* First Block Cache downloads a residual mid-forward: such forwards run eagerly */
    if (m->fbc && dt_fbc_prepare(be, m->fbc, n_img, c->hidden)) { rc = -1; goto out; }
    k2_graph *gs = m->use_graph && !trace && !m->fbc ? graph_slot(m, mask) : NULL;
    if (m->use_graph && (trace || m->fbc)) drop_captured(m);   /* an eager forward (see drop_captured) */
    if (!gs) {
        if (device_part(m, trace, trace_ud, 1)) {
            be->sync(be);
            dt_set_error("krea2: cancelled");
            rc = -1;
            goto out;
        }
    } else if (gs->graph) {
        if (be->graph_launch(be, gs->graph)) { rc = -1; goto out; }
    } else if (gs->warm) {   /* second call with this shape and mask: capture the device part, then replay it */
        if (be->capture_begin(be)) { rc = -1; goto out; }
        device_part(m, NULL, NULL, 0);
        gs->graph = be->capture_end(be);
        if (!gs->graph || be->graph_launch(be, gs->graph)) { rc = -1; goto out; }
    } else {
        device_part(m, NULL, NULL, 0);   /* eager warm-up: scratch buffers and attention plans reach their sizes */
        gs->warm = 1;
    }
    int host = 0;
    for (int i = 0; i < nb; i++) {
        dt_mat rows = dt_mat_rows(b->outm, (int64_t)i * n_img, n_img);
        if (seq[i].out) {
            be->download(be, seq[i].out, rows);
            host = 1;
        } else {
            be->copy(be, seq[i].out_m, rows);
        }
    }
    if (host) rc = be->sync(be);
out:
    free(owned[0]);
    free(owned[1]);
    return rc;
}

int krea2_forward_batch(krea2_model *m, const krea2_seq *seq, int nb, int n_img, float timestep) {
    return forward(m, seq, nb, n_img, timestep, NULL, NULL);
}

int krea2_forward(krea2_model *m, const float *img, int n_img, const float *txt, int n_txt, float timestep,
                  const float *pos_ids, const uint8_t *txt_mask, float *out, krea2_trace_fn trace, void *trace_ud) {
    const krea2_seq q = {.img = img, .txt = txt, .n_txt = n_txt, .pos = pos_ids, .mask = txt_mask, .out = out};
    return forward(m, &q, 1, n_img, timestep, trace, trace_ud);
}

int krea2_forward_dev(krea2_model *m, dt_mat img, const float *txt, int n_txt, float timestep, const float *pos_ids,
                      const uint8_t *txt_mask, dt_mat out) {
    if (!img.data || !out.data) { dt_set_error("krea2_forward_dev: NULL latents or velocity"); return -1; }
    const krea2_seq q = {.img_m = img, .txt = txt, .n_txt = n_txt, .pos = pos_ids, .mask = txt_mask, .out_m = out};
    return forward(m, &q, 1, (int)img.rows, timestep, NULL, NULL);
}
