/* test_qwen3.c — Qwen3 text encoder: fixture match against the transformers reference (CPU),
 * a double-precision host reference on a synthetic MLX-q4 checkpoint with mflux key names and
 * padding, load/encode error paths, and CUDA vs CPU when a GPU is usable.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/backend.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/qwen3.h"
#include "quant/mlx_affine.h"
#include "test.h"

/* f32 engine vs the f32 transformers reference: same math, only summation order differs. */
#define TOL_FIXTURE 1e-4
/* Fixture with f32 RoPE inverse frequencies (the default) while the fixture's reference had them
 * rounded to bf16 (its buffers went through a bf16 cast): the angle error grows with the position;
 * measured 3.4e-4 at T = 32, the same as transformers 5.17 from_pretrained (f32) vs the fixture.
 * This bound only guards against gross errors on that path. */
#define TOL_FIXTURE_F32_INV_FREQ 2e-3
/* f32 engine vs the double host reference of this file: rounding of f32 accumulation only. */
#define TOL_HOSTREF 1e-4
/* CUDA (bf16 activations, bf16 RoPE products) vs CPU f32: bf16 has 8 mantissa bits (~4e-3 per op). */
#define TOL_CUDA 2e-2

/* ------------------------------------------------------------------ host reference (double) */

/* Float weights of a model by name (name without .weight for Linears/embedding). */
typedef struct {
    const char *prefix;     /* "model." or "" */
    int D, L, H, Hkv, hd, I, vocab;
    double eps, theta;
    int inv_freq_bf16;      /* RoPE inverse frequencies rounded to bf16 */
    float *(*get)(void *ud, const char *name, size_t n);   /* malloc'd f32 [n] or exits */
    void *ud;
} ref_model;

static double *ref_rmsnorm(const double *x, int n, const float *w, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
    return y;
}

/* y[T, out] = x[T, in] · W[out, in]ᵀ */
static void ref_linear(const double *x, int T, int in, const float *W, int out, double *y) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int i = 0; i < in; i++) s += x[(size_t)t * in + i] * W[(size_t)o * in + i];
            y[(size_t)t * out + o] = s;
        }
}

static float *ref_get(const ref_model *r, const char *fmt, int layer, size_t n) {
    char name[160], full[200];
    snprintf(name, sizeof name, fmt, layer);
    snprintf(full, sizeof full, "%s%s", r->prefix, name);
    return r->get(r->ud, full, n);
}

/* Reference forward; out [T, n_taps*D]. Queries without any visible key get zero attention output. */
static void ref_encode(const ref_model *r, const int32_t *ids, const int32_t *mask, int T, const int *taps, int n_taps,
                       float *out) {
    const int D = r->D, H = r->H, Hkv = r->Hkv, hd = r->hd, I = r->I, qd = H * hd, kvd = Hkv * hd;
    double *x = calloc((size_t)T * D, sizeof(double)), *h = calloc((size_t)T * D, sizeof(double));
    double *q = calloc((size_t)T * qd, sizeof(double)), *k = calloc((size_t)T * kvd, sizeof(double));
    double *v = calloc((size_t)T * kvd, sizeof(double)), *a = calloc((size_t)T * qd, sizeof(double));
    double *g = calloc((size_t)T * I, sizeof(double)), *u = calloc((size_t)T * I, sizeof(double));
    double *p = calloc((size_t)T, sizeof(double)), *tmp = calloc((size_t)(D > hd ? D : hd), sizeof(double));
    float *E = r->get(r->ud, strcmp(r->prefix, "") ? "model.embed_tokens" : "embed_tokens", (size_t)r->vocab * D);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D; i++) x[(size_t)t * D + i] = E[(size_t)ids[t] * D + i];
    free(E);
    int deepest = 0;
    for (int i = 0; i < n_taps; i++) deepest = taps[i] > deepest ? taps[i] : deepest;
    for (int li = 0; li <= deepest; li++) {
        if (li > 0) {
            int l = li - 1;
            float *w_in = ref_get(r, "layers.%d.input_layernorm.weight", l, D);
            float *w_post = ref_get(r, "layers.%d.post_attention_layernorm.weight", l, D);
            float *wqn = ref_get(r, "layers.%d.self_attn.q_norm.weight", l, hd);
            float *wkn = ref_get(r, "layers.%d.self_attn.k_norm.weight", l, hd);
            float *Wq = ref_get(r, "layers.%d.self_attn.q_proj", l, (size_t)qd * D);
            float *Wk = ref_get(r, "layers.%d.self_attn.k_proj", l, (size_t)kvd * D);
            float *Wv = ref_get(r, "layers.%d.self_attn.v_proj", l, (size_t)kvd * D);
            float *Wo = ref_get(r, "layers.%d.self_attn.o_proj", l, (size_t)D * qd);
            float *Wg = ref_get(r, "layers.%d.mlp.gate_proj", l, (size_t)I * D);
            float *Wu = ref_get(r, "layers.%d.mlp.up_proj", l, (size_t)I * D);
            float *Wd = ref_get(r, "layers.%d.mlp.down_proj", l, (size_t)D * I);
            for (int t = 0; t < T; t++) ref_rmsnorm(x + (size_t)t * D, D, w_in, r->eps, h + (size_t)t * D);
            ref_linear(h, T, D, Wq, qd, q);
            ref_linear(h, T, D, Wk, kvd, k);
            ref_linear(h, T, D, Wv, kvd, v);
            /* per-head norm then half-split RoPE */
            for (int t = 0; t < T; t++)
                for (int pass = 0; pass < 2; pass++) {
                    int nh = pass ? Hkv : H;
                    double *base = pass ? k + (size_t)t * kvd : q + (size_t)t * qd;
                    const float *wn = pass ? wkn : wqn;
                    for (int hh = 0; hh < nh; hh++) {
                        double *z = base + (size_t)hh * hd;
                        ref_rmsnorm(z, hd, wn, r->eps, tmp);
                        for (int i = 0; i < hd / 2; i++) {
                            double f = pow(r->theta, -2.0 * i / hd);
                            if (r->inv_freq_bf16) f = dt_bf16_round((float)f);
                            double ang = t * f, c = cos(ang), s = sin(ang);
                            double x1 = tmp[i], x2 = tmp[i + hd / 2];
                            z[i] = x1 * c - x2 * s;
                            z[i + hd / 2] = x2 * c + x1 * s;
                        }
                    }
                }
            for (int t = 0; t < T; t++)
                for (int hh = 0; hh < H; hh++) {
                    int kh = hh / (H / Hkv);
                    const double *qv = q + (size_t)t * qd + (size_t)hh * hd;
                    double mx = -INFINITY;
                    for (int j = 0; j <= t; j++) {
                        if (mask && !mask[j]) { p[j] = -INFINITY; continue; }
                        double s = 0;
                        for (int i = 0; i < hd; i++) s += qv[i] * k[(size_t)j * kvd + (size_t)kh * hd + i];
                        p[j] = s / sqrt((double)hd);
                        if (p[j] > mx) mx = p[j];
                    }
                    double *o = a + (size_t)t * qd + (size_t)hh * hd;
                    for (int i = 0; i < hd; i++) o[i] = 0;
                    if (mx == -INFINITY) continue;
                    double den = 0;
                    for (int j = 0; j <= t; j++) { p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx); den += p[j]; }
                    for (int j = 0; j <= t; j++)
                        for (int i = 0; i < hd; i++) o[i] += p[j] / den * v[(size_t)j * kvd + (size_t)kh * hd + i];
                }
            ref_linear(a, T, qd, Wo, D, h);
            for (size_t i = 0; i < (size_t)T * D; i++) x[i] += h[i];
            for (int t = 0; t < T; t++) ref_rmsnorm(x + (size_t)t * D, D, w_post, r->eps, h + (size_t)t * D);
            ref_linear(h, T, D, Wg, I, g);
            ref_linear(h, T, D, Wu, I, u);
            for (size_t i = 0; i < (size_t)T * I; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_linear(g, T, I, Wd, D, h);
            for (size_t i = 0; i < (size_t)T * D; i++) x[i] += h[i];
            free(w_in); free(w_post); free(wqn); free(wkn); free(Wq); free(Wk); free(Wv); free(Wo);
            free(Wg); free(Wu); free(Wd);
        }
        const double *src = x;
        if (li == r->L) {   /* HF: the last hidden state is after model.norm */
            float *wn = ref_get(r, "norm.weight", 0, D);
            for (int t = 0; t < T; t++) ref_rmsnorm(x + (size_t)t * D, D, wn, r->eps, h + (size_t)t * D);
            free(wn);
            src = h;
        }
        for (int ti = 0; ti < n_taps; ti++)
            if (taps[ti] == li)
                for (int t = 0; t < T; t++)
                    for (int i = 0; i < D; i++)
                        out[((size_t)t * n_taps + ti) * D + i] = (float)src[(size_t)t * D + i];
    }
    free(x); free(h); free(q); free(k); free(v); free(a); free(g); free(u); free(p); free(tmp);
}

/* ------------------------------------------------------------------ fixture access */

static float *st_getter(void *ud, const char *name, size_t n) {
    char full[256];
    const st_tensor *t = st_find((st_file *)ud, name);
    if (!t) { snprintf(full, sizeof full, "%s.weight", name); t = st_find((st_file *)ud, full); }
    if (!t || (size_t)t->numel != n) { fprintf(stderr, "test: tensor %s missing or wrong size\n", name); exit(1); }
    return st_to_f32(t);
}

static int32_t *read_ids(const st_file *f, const char *name, int *T) {
    const st_tensor *t = st_find(f, name);
    if (!t) return NULL;
    float *v = st_to_f32(t);
    int32_t *r = malloc((size_t)t->numel * sizeof(int32_t));
    for (int64_t i = 0; i < t->numel; i++) r[i] = (int32_t)v[i];
    *T = (int)t->numel;
    free(v);
    return r;
}

/* ------------------------------------------------------------------ synthetic checkpoint */

typedef struct { char name[128]; float *w; size_t n; } syn_entry;
typedef struct { syn_entry e[64]; int n; } syn_table;

static float *syn_getter(void *ud, const char *name, size_t n) {
    syn_table *s = ud;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].name, name) && s->e[i].n == n) {
            float *c = malloc(n * sizeof(float));
            memcpy(c, s->e[i].w, n * sizeof(float));
            return c;
        }
    fprintf(stderr, "test: synthetic tensor %s [%zu] missing\n", name, n);
    exit(1);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) {   /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

/* Quantize a random [out, in] matrix to MLX q4 g64; store the dequantized values in the table. */
static void syn_add_q4(st_writer *sw, syn_table *tab, const char *name, int out, int in, double amp) {
    const int bits = 4, group = 64;
    float *w = malloc((size_t)out * in * sizeof(float));
    for (size_t i = 0; i < (size_t)out * in; i++) w[i] = (float)(amp * urand());
    uint32_t *packed = malloc((size_t)out * in / 8 * sizeof(uint32_t));
    uint16_t *sc = malloc((size_t)out * (in / group) * 2), *bi = malloc((size_t)out * (in / group) * 2);
    for (int o = 0; o < out; o++) {
        mlx_quant_row(w + (size_t)o * in, in, bits, group, MLX_RULE_MLX, packed + (size_t)o * in / 8,
                      sc + (size_t)o * (in / group), bi + (size_t)o * (in / group));
        mlx_dequant_row(w + (size_t)o * in, packed + (size_t)o * in / 8, sc + (size_t)o * (in / group),
                        bi + (size_t)o * (in / group), DT_BF16, in, bits, group);
    }
    char full[160];
    int64_t sp[2] = {out, in / 8}, ss[2] = {out, in / group};
    snprintf(full, sizeof full, "%s.weight", name);
    st_writer_add(sw, full, DT_U32, 2, sp, packed);
    snprintf(full, sizeof full, "%s.scales", name);
    st_writer_add(sw, full, DT_BF16, 2, ss, sc);
    snprintf(full, sizeof full, "%s.biases", name);
    st_writer_add(sw, full, DT_BF16, 2, ss, bi);
    syn_entry *e = &tab->e[tab->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->w = w;
    e->n = (size_t)out * in;
    free(packed); free(sc); free(bi);
}

static void syn_add_norm(st_writer *sw, syn_table *tab, const char *name, int n) {
    float *w = malloc((size_t)n * sizeof(float));
    uint16_t *b = malloc((size_t)n * 2);
    for (int i = 0; i < n; i++) { b[i] = dt_f32_to_bf16((float)(1.0 + 0.2 * urand())); w[i] = dt_bf16_to_f32(b[i]); }
    int64_t s[1] = {n};
    st_writer_add(sw, name, DT_BF16, 1, s, b);
    syn_entry *e = &tab->e[tab->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->w = w;
    e->n = (size_t)n;
    free(b);
}

enum { SYN_D = 256, SYN_L = 2, SYN_H = 8, SYN_HKV = 2, SYN_HD = 64, SYN_I = 512, SYN_VOCAB = 300 };

/* Writes DIR/model.safetensors (mflux keys, q4 g64) and, if with_config, DIR/config.json.
 * skip: a Linear name to leave out (error test) or NULL. */
static int write_synthetic(const char *dir, syn_table *tab, int with_config, const char *skip) {
    mkdir(dir, 0755);
    rng_state = 0x9E3779B97F4A7C15ull;
    st_writer *sw = st_writer_new();
    syn_add_q4(sw, tab, "embed_tokens", SYN_VOCAB, SYN_D, 1.0);
    char name[128];
    for (int l = 0; l < SYN_L; l++) {
        const struct { const char *n; int out, in; } lin[] = {
            {"self_attn.q_proj", SYN_H * SYN_HD, SYN_D},   {"self_attn.k_proj", SYN_HKV * SYN_HD, SYN_D},
            {"self_attn.v_proj", SYN_HKV * SYN_HD, SYN_D}, {"self_attn.o_proj", SYN_D, SYN_H * SYN_HD},
            {"mlp.gate_proj", SYN_I, SYN_D},                {"mlp.up_proj", SYN_I, SYN_D},
            {"mlp.down_proj", SYN_D, SYN_I},
        };
        for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
            snprintf(name, sizeof name, "layers.%d.%s", l, lin[i].n);
            if (skip && !strcmp(skip, name)) continue;
            syn_add_q4(sw, tab, name, lin[i].out, lin[i].in, 1.5 / sqrt((double)lin[i].in));
        }
        snprintf(name, sizeof name, "layers.%d.input_layernorm.weight", l);
        syn_add_norm(sw, tab, name, SYN_D);
        snprintf(name, sizeof name, "layers.%d.post_attention_layernorm.weight", l);
        syn_add_norm(sw, tab, name, SYN_D);
        snprintf(name, sizeof name, "layers.%d.self_attn.q_norm.weight", l);
        syn_add_norm(sw, tab, name, SYN_HD);
        snprintf(name, sizeof name, "layers.%d.self_attn.k_norm.weight", l);
        syn_add_norm(sw, tab, name, SYN_HD);
    }
    syn_add_norm(sw, tab, "norm.weight", SYN_D);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_writer_save(sw, path);
    st_writer_free(sw);
    if (rc) return -1;
    if (with_config) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        if (!f) return -1;
        fprintf(f, "{\"model_type\": \"qwen3\", \"hidden_size\": %d, \"num_hidden_layers\": %d, "
                   "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
                   "\"intermediate_size\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-06, "
                   "\"rope_theta\": 1000000.0, \"tie_word_embeddings\": true}\n",
                SYN_D, SYN_L, SYN_H, SYN_HKV, SYN_HD, SYN_I, SYN_VOCAB);
        fclose(f);
    }
    return 0;
}

static void syn_free(syn_table *t) {
    for (int i = 0; i < t->n; i++) free(t->e[i].w);
    t->n = 0;
}

static void rm_dir(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* ------------------------------------------------------------------ tests */

typedef struct {
    int32_t *ids, *mask;
    int T;
    int taps[8], n_taps;
    float *ref;       /* mid.prompt_embeds [T, n_taps*D] */
} fixture_case;

static int load_fixture_case(fixture_case *fc) {
    char path[512];
    memset(fc, 0, sizeof *fc);
    snprintf(path, sizeof path, "%s/pipeline_case.json", t_fixtures());
    json *cj = json_parse_file(path);
    if (!cj) return -1;
    const json *tl = json_get(cj, "text_encoder_out_layers");
    for (size_t i = 0; tl && i < tl->len && i < 8; i++) fc->taps[fc->n_taps++] = (int)json_at(tl, i)->integer;
    json_free(cj);
    snprintf(path, sizeof path, "%s/pipeline_io.safetensors", t_fixtures());
    st_file *f = st_open(path);
    if (!f) return -1;
    int Tm = 0;
    fc->ids = read_ids(f, "in.input_ids", &fc->T);
    fc->mask = read_ids(f, "in.attention_mask", &Tm);
    const st_tensor *pe = st_find(f, "mid.prompt_embeds");
    if (pe) fc->ref = st_to_f32(pe);
    st_close(f);
    if (!fc->ids || !fc->mask || !fc->ref || Tm != fc->T || fc->n_taps == 0) {
        dt_set_error("%s: fixture incomplete", path);
        return -1;
    }
    return 0;
}

static void free_fixture_case(fixture_case *fc) { free(fc->ids); free(fc->mask); free(fc->ref); }

static float *encode_on(dt_backend *be, const char *dir, int max_layer, int inv_freq_bf16, const fixture_case *fc,
                        int *D) {
    dt_qwen3 *m = dt_qwen3_load(be, dir, max_layer);
    if (!m) return NULL;
    dt_qwen3_set_inv_freq_bf16(m, inv_freq_bf16);
    *D = dt_qwen3_get_config(m)->hidden;
    float *out = malloc((size_t)fc->T * fc->n_taps * *D * sizeof(float));
    if (dt_qwen3_encode(m, fc->ids, fc->mask, fc->T, fc->taps, fc->n_taps, out)) { free(out); out = NULL; }
    dt_qwen3_free(m);
    return out;
}

static void test_fixture(dt_backend *cpu, const fixture_case *fc, float **cpu_out) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/model/text_encoder", t_fixtures());
    int maxtap = 0, D = 0;
    for (int i = 0; i < fc->n_taps; i++) maxtap = fc->taps[i] > maxtap ? fc->taps[i] : maxtap;
    float *out = encode_on(cpu, dir, maxtap, 1, fc, &D);
    if (!out) { T_FAIL("qwen3_fixture_prompt_embeds", "%s", dt_last_error()); return; }
    if ((size_t)fc->n_taps * D != 96) T_FAIL("qwen3_fixture_width", "n_taps*D = %d, fixture has 96", fc->n_taps * D);
    t_check_rel_l2("qwen3_fixture_prompt_embeds", out, fc->ref, (size_t)fc->T * fc->n_taps * D, TOL_FIXTURE);
    *cpu_out = out;
    float *out32 = encode_on(cpu, dir, maxtap, 0, fc, &D);
    if (!out32) T_FAIL("qwen3_fixture_f32_inv_freq", "%s", dt_last_error());
    else t_check_rel_l2("qwen3_fixture_f32_inv_freq", out32, fc->ref, (size_t)fc->T * fc->n_taps * D,
                        TOL_FIXTURE_F32_INV_FREQ);
    free(out32);

    /* all layers loaded, taps including 0 (embeddings) and num_layers (after model.norm), checked
     * against the host reference reading the same bf16 file */
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file *sf = st_open(path);
    dt_qwen3 *m = dt_qwen3_load(cpu, dir, 0);
    if (!sf || !m) { T_FAIL("qwen3_fixture_all_taps", "%s", dt_last_error()); st_close(sf); dt_qwen3_free(m); return; }
    const dt_qwen3_config *c = dt_qwen3_get_config(m);
    dt_qwen3_set_inv_freq_bf16(m, 1);
    ref_model r = {"model.", c->hidden, c->num_layers, c->heads, c->kv_heads, c->head_dim, c->intermediate, c->vocab,
                   c->eps, c->rope_theta, 1, st_getter, sf};
    int taps[5] = {0, 1, 2, 3, 4};
    size_t n = (size_t)fc->T * 5 * c->hidden;
    float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    if (dt_qwen3_encode(m, fc->ids, fc->mask, fc->T, taps, 5, got)) {
        T_FAIL("qwen3_fixture_all_taps", "%s", dt_last_error());
    } else {
        ref_encode(&r, fc->ids, fc->mask, fc->T, taps, 5, want);
        t_check_rel_l2("qwen3_fixture_all_taps_vs_host_ref", got, want, n, TOL_HOSTREF);
        /* the fixture's taps (1,2,3) must also match the host reference: validates the reference itself */
        float *sel = malloc((size_t)fc->T * 3 * c->hidden * sizeof(float));
        for (int t = 0; t < fc->T; t++)
            memcpy(sel + (size_t)t * 3 * c->hidden, want + ((size_t)t * 5 + 1) * c->hidden, 3 * c->hidden * sizeof(float));
        if (fc->n_taps == 3 && fc->taps[0] == 1 && fc->taps[1] == 2 && fc->taps[2] == 3)
            t_check_rel_l2("qwen3_host_ref_vs_fixture", sel, fc->ref, (size_t)fc->T * 3 * c->hidden, TOL_FIXTURE);
        free(sel);
        /* the model keeps its activations between encodes of one length: a shorter prompt in between, then the same
         * call again, must give the same values (bit for bit on the CPU), and encode_to (the device-side output
         * the pipeline uses) the same values as the host output */
        int Ts = fc->T > 3 ? fc->T - 3 : 1;
        float *again = malloc(n * sizeof(float)), *shortb = malloc(n * sizeof(float));
        int rc = dt_qwen3_encode(m, fc->ids, fc->mask ? fc->mask + 3 : NULL, Ts, taps, 5, shortb);
        rc |= dt_qwen3_encode(m, fc->ids, fc->mask, fc->T, taps, 5, again);
        T_CHECK("qwen3_reused_activations_same_result", rc == 0 && !memcmp(got, again, n * sizeof(float)),
                "rc %d: a second encode after a shorter one differs", rc);
        dt_mat dev = dt_alloc_or_die(cpu, fc->T, 5 * (int64_t)c->hidden, cpu->act_dtype);
        rc = dt_qwen3_encode_to(m, fc->ids, fc->mask, fc->T, taps, 5, dev);
        if (rc == 0) cpu->download(cpu, again, dev);
        T_CHECK("qwen3_encode_to_equals_encode", rc == 0 && !memcmp(got, again, n * sizeof(float)), "rc %d: %s", rc,
                dt_last_error());
        dt_mat wrong = dt_alloc_or_die(cpu, fc->T, 4 * (int64_t)c->hidden, cpu->act_dtype);
        T_CHECK("qwen3_encode_to_wrong_shape", dt_qwen3_encode_to(m, fc->ids, fc->mask, fc->T, taps, 5, wrong) != 0 &&
                                                   strstr(dt_last_error(), "expected"), "%s", dt_last_error());
        cpu->free(cpu, &dev);
        cpu->free(cpu, &wrong);
        /* the RoPE tables are kept between encodes while the positions (and the inv_freq rounding) stay the same:
         * explicit positions 0..T-1 give the default ones' values; shifted positions give other values, the same
         * as a fresh model's; the defaults again, and the rounding switched off and on, give the first values back */
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)fc->T);
        for (int t = 0; t < fc->T; t++) pos[t] = t;
        rc = dt_qwen3_encode_at(m, fc->ids, fc->mask, pos, fc->T, taps, 5, again);
        T_CHECK("qwen3_rope_same_positions", rc == 0 && !memcmp(got, again, n * sizeof(float)), "rc %d", rc);
        for (int t = 0; t < fc->T; t++) pos[t] = t + 5;
        rc = dt_qwen3_encode_at(m, fc->ids, fc->mask, pos, fc->T, taps, 5, shortb);
        dt_qwen3 *fresh = dt_qwen3_load(cpu, dir, 0);
        float *fresh_out = malloc(n * sizeof(float));
        if (fresh) dt_qwen3_set_inv_freq_bf16(fresh, 1);
        int rf = fresh ? dt_qwen3_encode_at(fresh, fc->ids, fc->mask, pos, fc->T, taps, 5, fresh_out) : -1;
        T_CHECK("qwen3_rope_shifted_positions", rc == 0 && rf == 0 && memcmp(got, shortb, n * sizeof(float)) &&
                                                    !memcmp(shortb, fresh_out, n * sizeof(float)),
                "rc %d / %d: shifted positions must change the values and match a fresh model's", rc, rf);
        rc = dt_qwen3_encode(m, fc->ids, fc->mask, fc->T, taps, 5, again);
        T_CHECK("qwen3_rope_default_again", rc == 0 && !memcmp(got, again, n * sizeof(float)), "rc %d", rc);
        dt_qwen3_set_inv_freq_bf16(m, 0);
        rc = dt_qwen3_encode(m, fc->ids, fc->mask, fc->T, taps, 5, shortb);
        dt_qwen3_set_inv_freq_bf16(m, 1);
        rc |= dt_qwen3_encode(m, fc->ids, fc->mask, fc->T, taps, 5, again);
        T_CHECK("qwen3_rope_inv_freq_rounding_switch", rc == 0 && memcmp(got, shortb, n * sizeof(float)) &&
                                                           !memcmp(got, again, n * sizeof(float)), "rc %d", rc);
        dt_qwen3_free(fresh);
        free(fresh_out);
        free(pos);
        free(again);
        free(shortb);
    }
    free(got); free(want);
    dt_qwen3_free(m);
    st_close(sf);

    /* max_layer limits what can be tapped */
    m = dt_qwen3_load(cpu, dir, 2);
    if (!m) { T_FAIL("qwen3_max_layer_limit", "%s", dt_last_error()); return; }
    int deep[1] = {3};
    float tmp[32 * 32];
    dt_clear_error();
    int rc = dt_qwen3_encode(m, fc->ids, NULL, fc->T < 32 ? fc->T : 32, deep, 1, tmp);
    T_CHECK("qwen3_max_layer_limit", rc != 0 && strstr(dt_last_error(), "tap 3"), "rc %d, error '%s'", rc,
            dt_last_error());
    int32_t bad_ids[2] = {0, 705};
    int one[1] = {1};
    rc = dt_qwen3_encode(m, bad_ids, NULL, 2, one, 1, tmp);
    T_CHECK("qwen3_bad_token_id", rc != 0 && strstr(dt_last_error(), "705"), "rc %d, error '%s'", rc, dt_last_error());
    dt_qwen3_free(m);
}

static void test_synthetic(dt_backend *cpu) {
    char dir[256], dir2[256];
    snprintf(dir, sizeof dir, "/tmp/ditrun_test_qwen3_%d", (int)getpid());
    snprintf(dir2, sizeof dir2, "/tmp/ditrun_test_qwen3_%d_nocfg", (int)getpid());
    syn_table *tab = calloc(1, sizeof *tab), *tab2 = calloc(1, sizeof *tab2);
    if (write_synthetic(dir, tab, 1, NULL) || write_synthetic(dir2, tab2, 0, NULL)) {
        T_FAIL("qwen3_synthetic_write", "%s", dt_last_error());
        goto done;
    }
    dt_qwen3 *m = dt_qwen3_load(cpu, dir, 0);
    if (!m) { T_FAIL("qwen3_synthetic_q4_load", "%s", dt_last_error()); goto done; }
    T_PASS("qwen3_synthetic_q4_load");
    enum { T = 24 };
    int32_t ids[T], mask[T];
    for (int t = 0; t < T; t++) { ids[t] = (t * 37 + 11) % SYN_VOCAB; mask[t] = t < T - 6; }   /* right padding */
    int taps[3] = {0, 1, 2};   /* 2 == num_layers: after model.norm */
    size_t n = (size_t)T * 3 * SYN_D;
    float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float)), *got2 = malloc(n * sizeof(float));
    ref_model r = {"", SYN_D, SYN_L, SYN_H, SYN_HKV, SYN_HD, SYN_I, SYN_VOCAB, 1e-6, 1e6, 0, syn_getter, tab};
    if (dt_qwen3_encode(m, ids, mask, T, taps, 3, got)) {
        T_FAIL("qwen3_synthetic_q4_encode", "%s", dt_last_error());
    } else {
        T_CHECK("qwen3_synthetic_q4_finite", all_finite(got, n), "non-finite output");
        ref_encode(&r, ids, mask, T, taps, 3, want);
        t_check_rel_l2("qwen3_synthetic_q4_right_pad_vs_host_ref", got, want, n, TOL_HOSTREF);
    }
    /* leading padding: the first queries see no key; their attention output must be zero, not NaN */
    for (int t = 0; t < T; t++) mask[t] = t >= 3;
    if (dt_qwen3_encode(m, ids, mask, T, taps, 3, got)) {
        T_FAIL("qwen3_synthetic_q4_left_pad", "%s", dt_last_error());
    } else {
        ref_encode(&r, ids, mask, T, taps, 3, want);
        T_CHECK("qwen3_synthetic_q4_left_pad_finite", all_finite(got, n), "non-finite output");
        t_check_rel_l2("qwen3_synthetic_q4_left_pad_vs_host_ref", got, want, n, TOL_HOSTREF);
    }
    /* no mask at all and only the deepest tap */
    int tap2[1] = {2};
    float *g1 = malloc((size_t)T * SYN_D * sizeof(float)), *w1 = malloc((size_t)T * SYN_D * sizeof(float));
    if (dt_qwen3_encode(m, ids, NULL, T, tap2, 1, g1)) {
        T_FAIL("qwen3_synthetic_q4_nomask", "%s", dt_last_error());
    } else {
        ref_encode(&r, ids, NULL, T, tap2, 1, w1);
        t_check_rel_l2("qwen3_synthetic_q4_nomask_vs_host_ref", g1, w1, (size_t)T * SYN_D, TOL_HOSTREF);
    }
    /* same checkpoint without config.json: geometry inferred from shapes, identical result */
    int log_level = dt_log_level;
    dt_log_level = 0;   /* the "inferred geometry" note is expected here */
    dt_qwen3 *m2 = dt_qwen3_load(cpu, dir2, 0);
    dt_log_level = log_level;
    if (!m2) {
        T_FAIL("qwen3_synthetic_no_config", "%s", dt_last_error());
    } else {
        const dt_qwen3_config *c = dt_qwen3_get_config(m2);
        int geo_ok = c->hidden == SYN_D && c->num_layers == SYN_L && c->heads == SYN_H && c->kv_heads == SYN_HKV &&
                     c->head_dim == SYN_HD && c->intermediate == SYN_I && c->vocab == SYN_VOCAB;
        float *g2 = malloc((size_t)T * SYN_D * sizeof(float));
        int rc = dt_qwen3_encode(m2, ids, NULL, T, tap2, 1, g2);
        T_CHECK("qwen3_synthetic_no_config", geo_ok && rc == 0 && !memcmp(g1, g2, (size_t)T * SYN_D * sizeof(float)),
                "geometry ok %d, rc %d (%s)", geo_ok, rc, rc ? dt_last_error() : "outputs differ");
        free(g2);
        dt_qwen3_free(m2);
    }
    /* geometry without loading weights, with and without config.json */
    dt_qwen3_config rc1, rc2;
    dt_log_level = 0;
    int r1 = dt_qwen3_read_config(dir, &rc1), r2 = dt_qwen3_read_config(dir2, &rc2);
    dt_log_level = log_level;
    T_CHECK("qwen3_read_config", r1 == 0 && r2 == 0 && rc1.hidden == SYN_D && rc1.num_layers == SYN_L &&
                                     rc1.kv_heads == SYN_HKV && rc1.head_dim == SYN_HD && rc2.intermediate == SYN_I &&
                                     rc2.vocab == SYN_VOCAB && rc1.rope_theta == 1e6,
            "rc %d/%d (%s)", r1, r2, dt_last_error());
    free(g1); free(w1); free(got); free(want); free(got2);
    dt_qwen3_free(m);
done:
    syn_free(tab); syn_free(tab2);
    free(tab); free(tab2);
    rm_dir(dir); rm_dir(dir2);
}

static void test_errors(dt_backend *cpu) {
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/ditrun_test_qwen3_%d_missing", (int)getpid());
    syn_table *tab = calloc(1, sizeof *tab);
    if (write_synthetic(dir, tab, 1, "layers.1.mlp.up_proj")) {
        T_FAIL("qwen3_missing_tensor", "write: %s", dt_last_error());
    } else {
        dt_clear_error();
        dt_qwen3 *m = dt_qwen3_load(cpu, dir, 0);
        const char *e = dt_last_error();
        if (!m && e) printf("# error message: %s\n", e);
        T_CHECK("qwen3_missing_tensor", !m && e && strstr(e, "layers.1.mlp.up_proj") && strstr(e, dir),
                "load %s; error '%s'", m ? "succeeded" : "failed", e ? e : "");
        dt_qwen3_free(m);
        /* layers past max_layer are never read: loading only layer 1 works */
        m = dt_qwen3_load(cpu, dir, 1);
        T_CHECK("qwen3_missing_tensor_beyond_max_layer", m != NULL, "%s", dt_last_error());
        dt_qwen3_free(m);
    }
    syn_free(tab);
    free(tab);
    rm_dir(dir);
    dt_clear_error();
    dt_qwen3 *m = dt_qwen3_load(cpu, "/nonexistent/text_encoder", 0);
    T_CHECK("qwen3_missing_dir", !m && strstr(dt_last_error(), "/nonexistent/text_encoder"), "error '%s'",
            dt_last_error());
    dt_qwen3_free(m);
}

static void test_cuda(const fixture_case *fc, const float *cpu_out) {
    if (!dt_backend_cuda_available()) {
        if (t_require_gpu_env()) T_FAIL("qwen3_cuda_vs_cpu", "DITRUN_REQUIRE_GPU=1 but no usable CUDA GPU");
        else T_SKIP("qwen3_cuda_vs_cpu", "no usable CUDA GPU (or built without CUDA)");
        return;
    }
    if (!cpu_out) { T_FAIL("qwen3_cuda_vs_cpu", "no CPU result to compare with"); return; }
    dt_backend_opts o = {0};
    dt_backend *cu = dt_backend_cuda_create(&o);
    if (!cu) { T_FAIL("qwen3_cuda_vs_cpu", "%s", dt_last_error()); return; }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/model/text_encoder", t_fixtures());
    int D = 0, maxtap = 0;
    for (int i = 0; i < fc->n_taps; i++) maxtap = fc->taps[i] > maxtap ? fc->taps[i] : maxtap;
    float *out = encode_on(cu, dir, maxtap, 1, fc, &D);
    if (!out) T_FAIL("qwen3_cuda_vs_cpu", "%s", dt_last_error());
    else {
        size_t n = (size_t)fc->T * fc->n_taps * D;
        t_check_rel_l2("qwen3_cuda_vs_cpu", out, cpu_out, n, TOL_CUDA);
        t_check_rel_l2("qwen3_cuda_vs_fixture", out, fc->ref, n, TOL_CUDA);
    }
    free(out);
    cu->destroy(cu);
}

int main(void) {
    dt_backend_opts o = {0};
    dt_backend *cpu = dt_backend_cpu_create(&o);
    if (!cpu) { T_FAIL("qwen3_cpu_backend", "%s", dt_last_error()); return T_DONE(); }
    fixture_case fc;
    float *cpu_out = NULL;
    if (load_fixture_case(&fc)) T_FAIL("qwen3_fixture_load", "%s", dt_last_error());
    else test_fixture(cpu, &fc, &cpu_out);
    test_synthetic(cpu);
    test_errors(cpu);
    if (fc.ids) test_cuda(&fc, cpu_out);
    free(cpu_out);
    free_fixture_case(&fc);
    cpu->destroy(cpu);
    return T_DONE();
}
