/* qwen3.c — Qwen3 text encoder forward (transformers modeling_qwen3.py semantics) on the backend
 * op interface: embedding lookup on the host (dequantizing only the needed rows), then per decoder
 * layer pre-norm attention (per-head q/k RMSNorm before half-split RoPE, GQA, causal + key padding
 * mask) and a SwiGLU MLP, each with a residual add. Hidden states at the requested taps are
 * downloaded and concatenated along features.
 * The text model of Qwen3-VL (modeling_qwen3_vl.py, Qwen3VLTextModel) is the same network: its
 * checkpoints differ only in key prefix (`language_model.`, `model.language_model.`) and in a config
 * nested under `text_config` whose RoPE is multi-axis (see qwen3.h: for text it is plain RoPE).
 */
#include "qwen3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/dequant.h"

#define QW_NAME_MAX 128

enum { QW_Q, QW_K, QW_V, QW_O, QW_GATE, QW_UP, QW_DOWN, QW_NLIN };
static const char *const qw_lin_suffix[QW_NLIN] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};

typedef struct {
    dt_linear *lin[QW_NLIN];
    char names[QW_NLIN][QW_NAME_MAX];   /* kept alive for the backend's Linear (src.name) */
    dt_mat in_norm, post_norm;          /* [1, D] F32 */
    dt_mat q_norm, k_norm;              /* [1, hd] F32 */
} qw_layer;

struct dt_qwen3 {
    dt_backend *be;
    dt_weights *w;               /* kept open: Linears and the embedding are views into it */
    dt_qwen3_config cfg;
    const char *prefix;          /* "model." (Hugging Face) or "" (mflux) */
    int n_layers;                /* decoder layers loaded (1..n_layers) */
    qw_layer *layers;            /* [n_layers] */
    char embed_name[QW_NAME_MAX];
    dt_linear_src embed;         /* [vocab, D], dense or affine */
    dt_mat final_norm;           /* [1, D] F32, data NULL unless n_layers == num_layers */
    int inv_freq_bf16;           /* round RoPE inverse frequencies to bf16 (dt_qwen3_set_inv_freq_bf16) */
    /* the activations of one encode, kept for the next one of the same length (a resident pipeline encodes every
     * request: no allocation after the first, and no pool churn that moves other models' blocks) */
    struct {
        int T;
        dt_mat x, h;             /* [T, D] residual stream; normed input / branch output */
        dt_mat q, a;             /* [T, H·hd] queries; attention output */
        dt_mat k, v;             /* [T, Hkv·hd] */
        dt_mat g, u;             /* [T, I] MLP gate / up */
        dt_mat cosm, sinm;       /* [T, hd] F32 RoPE tables */
        int32_t *rope_pos;       /* [T] the positions cosm/sinm hold (NULL: not built yet) */
        int rope_bf16;           /* ... and the inv_freq rounding they were built with */
        dt_mat kbias;            /* [1, T] F32 key bias (padding mask) */
        dt_mat zeros;            /* [T, H·hd] zeros (the outputs of rows before the first real token) */
    } ws;
};

/* ---------------------------------------------------------------- config */

static int cfg_int(const json *cj, const char *what, const char *key, int64_t dflt, int required, int *dst) {
    const json *v = json_get(cj, key);
    if (!v || v->type == JSON_NULL) {
        if (required) { dt_set_error("%s: missing integer '%s'", what, key); return -1; }
        *dst = (int)dflt;
        return 0;
    }
    if (v->type != JSON_NUMBER || !v->is_integer || v->integer <= 0 || v->integer > (1 << 30)) {
        dt_set_error("%s: '%s' must be a positive integer", what, key);
        return -1;
    }
    *dst = (int)v->integer;
    return 0;
}

static int check_rope_type(const json *obj, const char *what, const char *field) {
    if (!obj || obj->type != JSON_OBJECT) return 0;
    const char *t = json_get_str(obj, "rope_type");
    if (!t) t = json_get_str(obj, "type");
    if (t && strcmp(t, "default") != 0) {
        dt_set_error("%s: %s.rope_type '%s' is not supported (only 'default')", what, field, t);
        return -1;
    }
    return 0;
}

/* Multi-axis RoPE (Qwen3-VL `mrope_section`, interleaved or chunked): each of the hd/2 rotation frequencies
 * inv_freq[i] is taken from one of three position axes (t, h, w). Text tokens carry the same position on all
 * three axes, so every frequency sees that one position: the rotation is the plain RoPE of the same inv_freq.
 * The sections only have to cover at most hd/2 frequencies (the rest come from the t axis in transformers). */
static int check_mrope(const json *obj, const char *what, const char *field, int head_dim) {
    if (!obj || obj->type != JSON_OBJECT) return 0;
    const json *sec = json_get(obj, "mrope_section");
    if (!sec || sec->type == JSON_NULL) return 0;
    if (sec->type != JSON_ARRAY || sec->len < 1 || sec->len > 4) {
        dt_set_error("%s: %s.mrope_section must be an array of 1..4 integers", what, field);
        return -1;
    }
    int64_t sum = 0;
    for (size_t i = 0; i < sec->len; i++) {
        const json *e = json_at(sec, i);
        if (!e || e->type != JSON_NUMBER || !e->is_integer || e->integer < 0 || e->integer > (1 << 20)) {
            dt_set_error("%s: %s.mrope_section[%zu] is not a non-negative integer", what, field, i);
            return -1;
        }
        sum += e->integer;
    }
    if (sum > head_dim / 2) {
        dt_set_error("%s: %s.mrope_section sums to %lld, more than head_dim/2 = %d rotation frequencies", what, field,
                     (long long)sum, head_dim / 2);
        return -1;
    }
    return 0;
}

static int parse_config(const json *cj, const char *what, dt_qwen3_config *c) {
    /* Qwen3-VL (Qwen3VLModel / Qwen3VLForConditionalGeneration): the text model's geometry is text_config */
    const json *tc = json_get(cj, "text_config");
    if (tc && tc->type == JSON_OBJECT) cj = tc;
    if (cfg_int(cj, what, "hidden_size", 0, 1, &c->hidden) || cfg_int(cj, what, "num_hidden_layers", 0, 1, &c->num_layers) ||
        cfg_int(cj, what, "num_attention_heads", 0, 1, &c->heads) ||
        cfg_int(cj, what, "intermediate_size", 0, 1, &c->intermediate) || cfg_int(cj, what, "vocab_size", 0, 1, &c->vocab))
        return -1;
    if (cfg_int(cj, what, "num_key_value_heads", c->heads, 0, &c->kv_heads)) return -1;
    if (cfg_int(cj, what, "head_dim", c->hidden / c->heads, 0, &c->head_dim)) return -1;
    c->eps = (float)json_get_num(cj, "rms_norm_eps", 1e-6);
    const json *rp = json_get(cj, "rope_parameters");
    double theta = json_get_num(cj, "rope_theta", -1.0);
    if (theta <= 0 && rp && rp->type == JSON_OBJECT) theta = json_get_num(rp, "rope_theta", -1.0);
    if (theta <= 0) theta = 10000.0;   /* Qwen3Config default */
    c->rope_theta = theta;
    if (check_rope_type(rp, what, "rope_parameters") || check_rope_type(json_get(cj, "rope_scaling"), what, "rope_scaling"))
        return -1;
    if (check_mrope(rp, what, "rope_parameters", c->head_dim) ||
        check_mrope(json_get(cj, "rope_scaling"), what, "rope_scaling", c->head_dim))
        return -1;
    if (json_get_bool(cj, "attention_bias", 0)) {
        dt_set_error("%s: attention_bias = true is not supported (Qwen3 projections have no bias)", what);
        return -1;
    }
    if (!(c->eps > 0) || !isfinite(c->eps)) { dt_set_error("%s: rms_norm_eps must be positive", what); return -1; }
    return 0;
}

/* Without config.json (some converted folders): geometry from tensor shapes. */
static int infer_config(const dt_weights *w, const char *prefix, const char *embed_name, dt_linear_src *emb,
                        dt_qwen3_config *c) {
    const char *what = dt_weights_path(w);
    char name[QW_NAME_MAX];
    c->num_layers = 0;
    for (;;) {
        snprintf(name, sizeof name, "%slayers.%d.input_layernorm.weight", prefix, c->num_layers);
        if (!dt_weights_find(w, name)) break;
        c->num_layers++;
    }
    if (c->num_layers == 0) {
        dt_set_error("%s: no config.json and no tensor '%slayers.0.input_layernorm.weight'", what, prefix);
        return -1;
    }
    /* D from a norm weight first: a quantized embedding's width needs it to resolve the bit width */
    snprintf(name, sizeof name, "%slayers.0.input_layernorm.weight", prefix);
    c->hidden = (int)dt_weights_find(w, name)->numel;
    if (dt_weights_linear(w, embed_name, -1, c->hidden, 0, emb) != 0) return -1;
    c->vocab = (int)emb->out;
    snprintf(name, sizeof name, "%slayers.0.self_attn.q_norm.weight", prefix);
    const st_tensor *qn = dt_weights_find(w, name);
    if (!qn) { dt_set_error("%s: no config.json and no tensor '%s'", what, name); return -1; }
    c->head_dim = (int)qn->numel;
    dt_linear_src s;
    snprintf(name, sizeof name, "%slayers.0.self_attn.q_proj", prefix);
    if (dt_weights_linear(w, name, -1, c->hidden, -1, &s)) return -1;
    c->heads = (int)(s.out / c->head_dim);
    snprintf(name, sizeof name, "%slayers.0.self_attn.k_proj", prefix);
    if (dt_weights_linear(w, name, -1, c->hidden, -1, &s)) return -1;
    c->kv_heads = (int)(s.out / c->head_dim);
    snprintf(name, sizeof name, "%slayers.0.mlp.gate_proj", prefix);
    if (dt_weights_linear(w, name, -1, c->hidden, -1, &s)) return -1;
    c->intermediate = (int)s.out;
    c->eps = 1e-6f;
    c->rope_theta = 1e6;
    dt_log(1, "%s: no config.json; inferred Qwen3 geometry D=%d layers=%d heads=%d/%d hd=%d I=%d (eps 1e-6, theta 1e6)\n",
           what, c->hidden, c->num_layers, c->heads, c->kv_heads, c->head_dim, c->intermediate);
    return 0;
}

static int check_config(const dt_qwen3_config *c, const char *what) {
    if (c->hidden <= 0 || c->num_layers <= 0 || c->heads <= 0 || c->kv_heads <= 0 || c->head_dim <= 0 ||
        c->intermediate <= 0 || c->vocab <= 0) {
        dt_set_error("%s: invalid Qwen3 geometry (D=%d layers=%d heads=%d/%d hd=%d I=%d vocab=%d)", what, c->hidden,
                     c->num_layers, c->heads, c->kv_heads, c->head_dim, c->intermediate, c->vocab);
        return -1;
    }
    if (c->heads % c->kv_heads) {
        dt_set_error("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", what, c->heads, c->kv_heads);
        return -1;
    }
    if (c->head_dim % 2) { dt_set_error("%s: head_dim %d must be even for RoPE", what, c->head_dim); return -1; }
    return 0;
}

/* ---------------------------------------------------------------- loading */

static int load_norm(dt_qwen3 *m, const char *name, int64_t n, dt_mat *dst) {
    float *buf = dt_malloc((size_t)n * sizeof(float));
    if (dt_weights_read_f32(m->w, name, buf, n) != 0) { free(buf); return -1; }
    *dst = dt_param_upload(m->be, buf, n);
    free(buf);
    return 0;
}

static int load_layer(dt_qwen3 *m, int li, qw_layer *L, dt_linear_paths *paths) {
    const dt_qwen3_config *c = &m->cfg;
    const int64_t D = c->hidden, qd = (int64_t)c->heads * c->head_dim, kvd = (int64_t)c->kv_heads * c->head_dim;
    const int64_t shape[QW_NLIN][2] = {
        {qd, D}, {kvd, D}, {kvd, D}, {D, qd}, {c->intermediate, D}, {c->intermediate, D}, {D, c->intermediate},
    };
    for (int i = 0; i < QW_NLIN; i++) {
        snprintf(L->names[i], QW_NAME_MAX, "%slayers.%d.%s", m->prefix, li, qw_lin_suffix[i]);
        dt_linear_src s;
        if (dt_weights_linear(m->w, L->names[i], shape[i][0], shape[i][1], -1, &s) != 0) return -1;
        s.name = L->names[i];
        L->lin[i] = m->be->linear_create(m->be, &s);
        if (!L->lin[i]) return -1;
        dt_linear_paths_add(paths, m->be, &s, L->lin[i]);
    }
    char name[QW_NAME_MAX];
    snprintf(name, sizeof name, "%slayers.%d.input_layernorm.weight", m->prefix, li);
    if (load_norm(m, name, D, &L->in_norm)) return -1;
    snprintf(name, sizeof name, "%slayers.%d.post_attention_layernorm.weight", m->prefix, li);
    if (load_norm(m, name, D, &L->post_norm)) return -1;
    snprintf(name, sizeof name, "%slayers.%d.self_attn.q_norm.weight", m->prefix, li);
    if (load_norm(m, name, c->head_dim, &L->q_norm)) return -1;
    snprintf(name, sizeof name, "%slayers.%d.self_attn.k_norm.weight", m->prefix, li);
    if (load_norm(m, name, c->head_dim, &L->k_norm)) return -1;
    return 0;
}

/* Key prefix, embedding and geometry of an open checkpoint (config.json or tensor shapes). */
static int resolve_geometry(const dt_weights *w, const char **prefix, char *embed_name, dt_linear_src *embed,
                            dt_qwen3_config *cfg) {
    const char *what = dt_weights_path(w);
    /* Hugging Face Qwen3, mflux, Qwen3-VL text model (Qwen3VLModel), Qwen3-VL with its LM head */
    static const char *const prefixes[] = {"model.", "", "language_model.", "model.language_model."};
    *prefix = NULL;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes && !*prefix; i++) {
        snprintf(embed_name, QW_NAME_MAX, "%sembed_tokens.weight", prefixes[i]);
        if (dt_weights_find(w, embed_name)) *prefix = prefixes[i];
    }
    if (!*prefix) {
        dt_set_error("%s: tensor 'model.embed_tokens.weight' (or mflux 'embed_tokens.weight', Qwen3-VL "
                     "'language_model.embed_tokens.weight') not found", what);
        return -1;
    }
    snprintf(embed_name, QW_NAME_MAX, "%sembed_tokens", *prefix);
    const json *cj = dt_weights_config(w);
    if (!cj && strstr(*prefix, "language_model.")) {
        dt_set_error("%s: a Qwen3-VL text encoder needs its config.json (its RoPE theta and geometry)", what);
        return -1;
    }
    if (cj) {
        char cwhat[1024];
        snprintf(cwhat, sizeof cwhat, "%s/config.json", what);
        if (parse_config(cj, cwhat, cfg) || check_config(cfg, cwhat)) return -1;
        return dt_weights_linear(w, embed_name, cfg->vocab, cfg->hidden, 0, embed) != 0 ? -1 : 0;
    }
    return infer_config(w, *prefix, embed_name, embed, cfg) || check_config(cfg, what) ? -1 : 0;
}

int dt_qwen3_read_config(const char *dir, dt_qwen3_config *cfg) {
    dt_weights *w = dt_weights_open(dir);
    if (!w) return -1;
    const char *prefix;
    char embed_name[QW_NAME_MAX];
    dt_linear_src embed;
    int rc = resolve_geometry(w, &prefix, embed_name, &embed, cfg);
    dt_weights_close(w);
    return rc;
}

dt_qwen3 *dt_qwen3_load(dt_backend *be, const char *dir, int max_layer) {
    dt_weights *w = dt_weights_open(dir);
    if (!w) return NULL;
    dt_qwen3 *m = dt_calloc(1, sizeof *m);
    m->be = be;
    m->w = w;
    const char *what = dt_weights_path(w);
    if (resolve_geometry(w, &m->prefix, m->embed_name, &m->embed, &m->cfg)) goto fail;
    m->embed.name = m->embed_name;

    if (max_layer <= 0) max_layer = m->cfg.num_layers;
    if (max_layer > m->cfg.num_layers) {
        dt_set_error("%s: max_layer %d exceeds num_hidden_layers %d", what, max_layer, m->cfg.num_layers);
        goto fail;
    }
    {   /* the deepest layer asked for must be in the weights before anything is allocated per layer */
        char name[QW_NAME_MAX];
        snprintf(name, sizeof name, "%slayers.%d.input_layernorm.weight", m->prefix, max_layer - 1);
        if (!dt_weights_find(w, name)) {
            dt_set_error("%s: layer %d is needed (num_hidden_layers %d) but the weights have no '%s'", what, max_layer - 1,
                         m->cfg.num_layers, name);
            goto fail;
        }
    }
    m->n_layers = max_layer;
    m->layers = dt_calloc((size_t)max_layer, sizeof *m->layers);
    dt_linear_paths paths = {0};
    for (int l = 0; l < max_layer; l++)
        if (load_layer(m, l, &m->layers[l], &paths)) goto fail;
    dt_linear_paths_log(&paths, be, "text encoder");
    if (max_layer == m->cfg.num_layers) {
        char name[QW_NAME_MAX];
        snprintf(name, sizeof name, "%snorm.weight", m->prefix);
        if (load_norm(m, name, m->cfg.hidden, &m->final_norm)) goto fail;
    }
    return m;
fail:
    dt_qwen3_free(m);
    return NULL;
}

const dt_qwen3_config *dt_qwen3_get_config(const dt_qwen3 *m) { return &m->cfg; }
int dt_qwen3_loaded_layers(const dt_qwen3 *m) { return m->n_layers; }
void dt_qwen3_set_inv_freq_bf16(dt_qwen3 *m, int on) { m->inv_freq_bf16 = on != 0; }

static void free_param(dt_backend *be, dt_mat *p) {
    if (p->data) be->free(be, p);
    *p = dt_mat_null();
}

static void free_ws(dt_qwen3 *m) {
    dt_mat *mats[] = {&m->ws.x, &m->ws.h, &m->ws.q, &m->ws.a, &m->ws.k, &m->ws.v, &m->ws.g, &m->ws.u,
                      &m->ws.cosm, &m->ws.sinm, &m->ws.kbias, &m->ws.zeros};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) free_param(m->be, mats[i]);
    free(m->ws.rope_pos);
    m->ws.rope_pos = NULL;
    m->ws.T = 0;
}

/* The encode activations for T tokens (allocated when T changes). */
static void ensure_ws(dt_qwen3 *m, int T) {
    if (m->ws.T == T) return;
    free_ws(m);
    dt_backend *be = m->be;
    const dt_qwen3_config *c = &m->cfg;
    const dt_dtype act = be->act_dtype;
    const int64_t D = c->hidden, Dq = (int64_t)c->heads * c->head_dim, Dkv = (int64_t)c->kv_heads * c->head_dim;
    m->ws.x = dt_alloc_or_die(be, T, D, act);
    m->ws.h = dt_alloc_or_die(be, T, D, act);
    m->ws.q = dt_alloc_or_die(be, T, Dq, act);
    m->ws.a = dt_alloc_or_die(be, T, Dq, act);
    m->ws.k = dt_alloc_or_die(be, T, Dkv, act);
    m->ws.v = dt_alloc_or_die(be, T, Dkv, act);
    m->ws.g = dt_alloc_or_die(be, T, c->intermediate, act);
    m->ws.u = dt_alloc_or_die(be, T, c->intermediate, act);
    m->ws.cosm = dt_alloc_or_die(be, T, c->head_dim, DT_F32);
    m->ws.sinm = dt_alloc_or_die(be, T, c->head_dim, DT_F32);
    m->ws.kbias = dt_alloc_or_die(be, 1, T, DT_F32);
    m->ws.zeros = dt_alloc_or_die(be, T, Dq, act);
    float *z = dt_calloc((size_t)T * Dq, sizeof(float));
    be->upload(be, m->ws.zeros, z);
    free(z);
    m->ws.T = T;
}

void dt_qwen3_free(dt_qwen3 *m) {
    if (!m) return;
    dt_backend *be = m->be;
    free_ws(m);
    if (m->layers) {
        for (int l = 0; l < m->n_layers; l++) {
            qw_layer *L = &m->layers[l];
            for (int i = 0; i < QW_NLIN; i++)
                if (L->lin[i]) be->linear_destroy(be, L->lin[i]);
            free_param(be, &L->in_norm);
            free_param(be, &L->post_norm);
            free_param(be, &L->q_norm);
            free_param(be, &L->k_norm);
        }
        free(m->layers);
    }
    free_param(be, &m->final_norm);
    dt_weights_close(m->w);
    free(m);
}

/* ---------------------------------------------------------------- forward */

/* Every tap equal to `index` gets x [T, D]: copied into its columns of the backend matrix out_dev [T, n_taps·D]
 * when that is given, else downloaded (once) into its columns of the host array out [T, n_taps·D]. */
static void emit_taps(dt_qwen3 *m, dt_mat x, int index, const int *taps, int n_taps, int T, float *host, float *out,
                      dt_mat out_dev) {
    const int D = m->cfg.hidden;
    int downloaded = 0;
    for (int i = 0; i < n_taps; i++) {
        if (taps[i] != index) continue;
        if (out_dev.data) { m->be->copy(m->be, dt_mat_cols(out_dev, (int64_t)i * D, D), x); continue; }
        if (!downloaded) { m->be->download(m->be, host, x); downloaded = 1; }
        for (int t = 0; t < T; t++)
            memcpy(out + ((size_t)t * n_taps + i) * D, host + (size_t)t * D, (size_t)D * sizeof(float));
    }
}

static int encode(dt_qwen3 *m, const int32_t *ids, const int32_t *mask, const int32_t *pos, int T, const int *taps,
                  int n_taps, float *out, dt_mat out_dev);

int dt_qwen3_encode(dt_qwen3 *m, const int32_t *ids, const int32_t *mask, int T, const int *taps, int n_taps,
                    float *out) {
    return encode(m, ids, mask, NULL, T, taps, n_taps, out, dt_mat_null());
}

int dt_qwen3_encode_at(dt_qwen3 *m, const int32_t *ids, const int32_t *mask, const int32_t *pos, int T,
                       const int *taps, int n_taps, float *out) {
    return encode(m, ids, mask, pos, T, taps, n_taps, out, dt_mat_null());
}

int dt_qwen3_encode_to(dt_qwen3 *m, const int32_t *ids, const int32_t *mask, int T, const int *taps, int n_taps,
                       dt_mat out) {
    if (!out.data || out.rows != T || out.cols != (int64_t)n_taps * m->cfg.hidden) {
        dt_set_error("qwen3 encode: the output matrix is [%lld, %lld], expected [%d, %lld]", (long long)out.rows,
                     (long long)out.cols, T, (long long)n_taps * m->cfg.hidden);
        return -1;
    }
    return encode(m, ids, mask, NULL, T, taps, n_taps, NULL, out);
}

static int encode(dt_qwen3 *m, const int32_t *ids, const int32_t *mask, const int32_t *pos, int T, const int *taps,
                  int n_taps, float *out, dt_mat out_dev) {
    const dt_qwen3_config *c = &m->cfg;
    const char *what = dt_weights_path(m->w);
    dt_backend *be = m->be;
    if (T <= 0 || n_taps <= 0) {
        dt_set_error("%s: qwen3 encode needs T > 0 and at least one tap (T=%d, taps=%d)", what, T, n_taps);
        return -1;
    }
    int deepest = 0;
    for (int i = 0; i < n_taps; i++) {
        if (taps[i] < 0 || taps[i] > m->n_layers) {
            dt_set_error("%s: hidden-state tap %d outside 0..%d (layers loaded: %d of %d)", what, taps[i], m->n_layers,
                         m->n_layers, c->num_layers);
            return -1;
        }
        if (taps[i] > deepest) deepest = taps[i];
    }
    for (int t = 0; t < T; t++)
        if (pos && (pos[t] < 0 || pos[t] > (1 << 24))) {
            dt_set_error("%s: position %d of token %d is outside 0..2^24", what, (int)pos[t], t);
            return -1;
        }
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab) {
            dt_set_error("%s: token id %d at position %d outside the vocabulary [0, %d)", what, (int)ids[t], t, c->vocab);
            return -1;
        }

    const int D = c->hidden, H = c->heads, Hkv = c->kv_heads, hd = c->head_dim;

    /* Leading padding: queries before the first real token have no key to attend to. Their attention
     * output is set to zero (what PyTorch >= 2.5 SDPA returns for fully masked rows). */
    int first_real = 0;
    if (mask)
        while (first_real < T && !mask[first_real]) first_real++;

    /* Host inputs: embeddings [T, D] (a row repeated from the previous token when the id repeats: the padding),
     * key bias [1, T]; the RoPE tables [T, hd] only when the positions differ from the previous encode's (a
     * resident pipeline encodes every request at the same length). */
    float *host = dt_malloc((size_t)T * D * sizeof(float));
    for (int t = 0; t < T; t++) {
        if (t > 0 && ids[t] == ids[t - 1]) memcpy(host + (size_t)t * D, host + (size_t)(t - 1) * D, sizeof(float) * D);
        else dt_linear_src_rows_f32(&m->embed, ids[t], 1, host + (size_t)t * D);
    }

    ensure_ws(m, T);
    dt_mat x = m->ws.x, h = m->ws.h, q = m->ws.q, k = m->ws.k, v = m->ws.v, a = m->ws.a, g = m->ws.g, u = m->ws.u;
    dt_mat cosm = m->ws.cosm, sinm = m->ws.sinm;
    int32_t *want = dt_malloc(sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) want[t] = pos ? pos[t] : t;
    if (!m->ws.rope_pos || m->ws.rope_bf16 != m->inv_freq_bf16 || memcmp(m->ws.rope_pos, want, sizeof(int32_t) * T)) {
        float *cosb = dt_malloc((size_t)T * hd * sizeof(float)), *sinb = dt_malloc((size_t)T * hd * sizeof(float));
        const int half = hd / 2;
        for (int i = 0; i < half; i++) {
            double inv_freq = pow(c->rope_theta, -2.0 * i / hd);
            if (m->inv_freq_bf16) inv_freq = dt_bf16_round((float)inv_freq);
            for (int t = 0; t < T; t++) {
                double ang = (double)want[t] * inv_freq;
                float cv = (float)cos(ang), sv = (float)sin(ang);
                cosb[(size_t)t * hd + i] = cosb[(size_t)t * hd + i + half] = cv;
                sinb[(size_t)t * hd + i] = sinb[(size_t)t * hd + i + half] = sv;
            }
        }
        be->upload(be, cosm, cosb);
        be->upload(be, sinm, sinb);
        free(cosb);
        free(sinb);
        free(m->ws.rope_pos);
        m->ws.rope_pos = want;
        m->ws.rope_bf16 = m->inv_freq_bf16;
    } else {
        free(want);
    }
    dt_mat kbias = dt_mat_null(), zeros = dt_mat_null();
    if (mask && deepest > 0) {
        float *kb = dt_malloc((size_t)T * sizeof(float));
        for (int t = 0; t < T; t++) kb[t] = mask[t] ? 0.0f : -INFINITY;
        kbias = m->ws.kbias;
        be->upload(be, kbias, kb);
        free(kb);
        if (first_real > 0) zeros = dt_mat_rows(m->ws.zeros, 0, first_real);
    }
    be->upload(be, x, host);
    emit_taps(m, x, 0, taps, n_taps, T, host, out, out_dev);

    const float scale = (float)(1.0 / sqrt((double)hd));
    for (int l = 0; l < deepest; l++) {
        const qw_layer *L = &m->layers[l];
        /* attention block */
        be->rmsnorm(be, h, x, L->in_norm, 0.0f, c->eps);
        be->linear(be, q, h, L->lin[QW_Q]);
        be->linear(be, k, h, L->lin[QW_K]);
        be->linear(be, v, h, L->lin[QW_V]);
        be->head_norm_rope(be, q, H, hd, L->q_norm, c->eps, cosm, sinm, DT_ROPE_HALF);
        be->head_norm_rope(be, k, Hkv, hd, L->k_norm, c->eps, cosm, sinm, DT_ROPE_HALF);
        be->attention(be, a, q, k, v, H, Hkv, hd, scale, kbias, 1);
        if (zeros.data) be->copy(be, dt_mat_rows(a, 0, first_real), zeros);
        be->linear(be, h, a, L->lin[QW_O]);
        be->gated_add(be, x, dt_mat_null(), h);
        /* MLP block */
        be->rmsnorm(be, h, x, L->post_norm, 0.0f, c->eps);
        be->linear(be, g, h, L->lin[QW_GATE]);
        be->linear(be, u, h, L->lin[QW_UP]);
        be->act_mul(be, g, g, u, DT_ACT_SILU);
        be->linear(be, h, g, L->lin[QW_DOWN]);
        be->gated_add(be, x, dt_mat_null(), h);

        if (l + 1 == c->num_layers) {   /* HF: the last hidden state is after the final norm */
            be->rmsnorm(be, h, x, m->final_norm, 0.0f, c->eps);
            emit_taps(m, h, l + 1, taps, n_taps, T, host, out, out_dev);
        } else {
            emit_taps(m, x, l + 1, taps, n_taps, T, host, out, out_dev);
        }
    }
    int rc = be->sync(be);

    free(host);
    return rc == 0 ? 0 : -1;
}
