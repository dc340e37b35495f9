/* flux2.c — FLUX.2-klein transformer forward (diffusers Flux2Transformer2DModel) on backend ops.
 *
 * Layout of the residual streams: one joint matrix S [T+N, D] holds the text rows [0, T) and the
 * image rows [T, T+N) for the whole forward, so the double blocks work on row views of S and the
 * single blocks on S itself: the [text, image] concatenation costs nothing. Q/K/V of a double block
 * are written straight into the text and image row ranges of joint [T+N, D] buffers, and the single
 * block's fused projection P [L, 3D+2F] is consumed through column views (Q, K, V, gate, up);
 * the attention output and the SwiGLU output land side by side in C [L, D+F], the input of to_out.
 * See NOTES.md for the conventions (modulation order, RoPE layout, final-norm halves). Config and weights:
 * flux2_load.c.
 */
#include "flux2_internal.h"
#include "lora_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ activations, buffers, lifetime */
void flux2_acts_free(dt_backend *be, flux2_acts *x) {
    dt_mat *mats[] = {&x->emb, &x->temb, &x->th, &x->mod_img, &x->mod_txt, &x->mod_single, &x->mod_out,
                      &x->in_img, &x->in_txt, &x->s, &x->a, &x->y, &x->blocks, &x->out, &x->cos, &x->sin};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        if (mats[i]->data) be->free(be, mats[i]);
    memset(x, 0, sizeof *x);
}

void flux2_acts_alloc(dt_backend *be, const flux2_config *c, int n, int t, int with_double, int with_single,
                      flux2_acts *x) {
    flux2_acts_alloc_kv(be, c, n, t, 0, with_double, with_single, x);
}

/* flux2_acts_alloc_kv with o_rows more rows behind o and c too (the guidance batch's moved text rows). */
static void acts_alloc(dt_backend *be, const flux2_config *c, int n, int t, int kv_rows, int o_rows, int with_double,
                       int with_single, flux2_acts *x) {
    int64_t D = c->hidden, F = c->mlp_hidden, L = (int64_t)n + t;
    dt_dtype act = be->act_dtype;
    memset(x, 0, sizeof *x);
    x->emb = dt_alloc_or_die(be, 1, c->tg_channels, act);
    x->temb = dt_alloc_or_die(be, 1, D, act);
    x->th = dt_alloc_or_die(be, 1, D, act);
    x->mod_img = dt_alloc_or_die(be, 1, 6 * D, act);
    x->mod_txt = dt_alloc_or_die(be, 1, 6 * D, act);
    x->mod_single = dt_alloc_or_die(be, 1, 3 * D, act);
    x->mod_out = dt_alloc_or_die(be, 1, 2 * D, act);
    x->in_img = dt_alloc_or_die(be, n, c->in_channels, act);
    if (t > 0) x->in_txt = dt_alloc_or_die(be, t, c->joint_dim, act);
    x->s = dt_alloc_or_die(be, L, D, act);
    x->a = dt_alloc_or_die(be, L, D, act);
    x->y = dt_alloc_or_die(be, L, D, act);
    /* double-block set (qkv, o, h, g) and single-block set (p, c): views of one allocation, each matrix at a
     * 256-byte aligned offset. With both kinds of blocks the double-block matrices are column views of the single
     * blocks' ones (qkv | h = p, o | g = c: 3D + 2F and D + F columns), so both attentions see Q/K/V and O with
     * the same strides and share one attention plan (cuDNN builds a plan per stride set: ~57 ms once per process,
     * PERF.md stop 16) */
    int64_t dcols[4] = {3 * D, D, 2 * F, F}, scols[2] = {3 * D + 2 * F, D + F};
    /* rows: qkv and p get kv_rows more behind the t+n live ones (cached reference K|V, flux2_acts_alloc_kv) */
    int64_t drows[4] = {L + kv_rows, L + o_rows, L, L}, srows[2] = {L + kv_rows, L + o_rows};
    int64_t align = 256 / (int64_t)dt_dtype_size(act), dn = 0, sn = 0;
    for (int i = 0; i < 4; i++) dn += (drows[i] * dcols[i] + align - 1) / align * align;
    for (int i = 0; i < 2; i++) sn += (srows[i] * scols[i] + align - 1) / align * align;
    int64_t need = (with_double ? dn : 0) > (with_single ? sn : 0) ? dn : with_single ? sn : 0;
    if (need > 0) {
        x->blocks = dt_alloc_or_die(be, 1, need, act);
        dt_mat *dm[4] = {&x->qkv, &x->o, &x->h, &x->g}, *sm[2] = {&x->p, &x->c};
        int64_t off = 0;
        for (int i = 0; with_double && i < 4; i++) {
            dt_mat v = {(char *)x->blocks.data + (size_t)off * dt_dtype_size(act), L, dcols[i], dcols[i], act};
            *dm[i] = v;
            off += (drows[i] * dcols[i] + align - 1) / align * align;
        }
        off = 0;
        for (int i = 0; with_single && i < 2; i++) {
            dt_mat v = {(char *)x->blocks.data + (size_t)off * dt_dtype_size(act), L, scols[i], scols[i], act};
            *sm[i] = v;
            off += (srows[i] * scols[i] + align - 1) / align * align;
        }
        if (with_double && with_single) {
            x->qkv = dt_mat_cols(x->p, 0, 3 * D);
            x->h = dt_mat_cols(x->p, 3 * D, 2 * F);
            x->o = dt_mat_cols(x->c, 0, D);
            x->g = dt_mat_cols(x->c, D, F);
        }
        if (with_double) {
            x->q = dt_mat_cols(x->qkv, 0, D);
            x->k = dt_mat_cols(x->qkv, D, D);
            x->v = dt_mat_cols(x->qkv, 2 * D, D);
        }
    }
    x->out = dt_alloc_or_die(be, n, c->out_channels, act);
    x->cos = dt_alloc_or_die(be, L, c->head_dim, DT_F32);
    x->sin = dt_alloc_or_die(be, L, c->head_dim, DT_F32);
}

void flux2_acts_alloc_kv(dt_backend *be, const flux2_config *c, int n, int t, int kv_rows, int with_double,
                         int with_single, flux2_acts *x) {
    acts_alloc(be, c, n, t, kv_rows, 0, with_double, with_single, x);
}

flux2_outer_io flux2_acts_outer(const flux2_acts *x) {
    flux2_outer_io io = {x->emb, x->temb, x->th, x->mod_img, x->mod_txt, x->mod_single, x->mod_out,
                         x->in_img, x->in_txt, x->s, x->a, x->out};
    return io;
}
flux2_double_io flux2_acts_double(const flux2_acts *x) {
    flux2_double_io io = {x->s, x->a, x->y, x->qkv, x->q, x->k, x->v, x->o, x->h, x->g,
                          x->cos, x->sin, x->mod_img, x->mod_txt, 0, dt_mat_null(), dt_mat_null(), NULL, NULL};
    return io;
}
flux2_single_io flux2_acts_single(const flux2_acts *x) {
    flux2_single_io io = {x->s, x->a, x->y, x->p, x->c, x->cos, x->sin, x->mod_single, 0, dt_mat_null(), dt_mat_null(),
                          NULL, NULL};
    return io;
}

static void free_bufs(dt_backend *be, flux2_bufs *b) {
    flux2_acts_free(be, &b->x);
    free(b->ids);
    memset(b, 0, sizeof *b);
}

static void drop_refs(flux2_model *m);

static void drop_graph(flux2_model *m) {
    if (m->graph) m->be->graph_destroy(m->be, m->graph);
    m->graph = NULL;
    m->warm_n = m->warm_t = m->warm_nout = m->warm_nb = -1;
}

void flux2_set_graph(flux2_model *m, int on) {
    m->use_graph = on && m->be->capture_begin && m->be->capture_end && m->be->graph_launch && m->be->graph_destroy;
    if (!m->use_graph) drop_graph(m);
}

static void drop_resident(flux2_model *m) {
    for (int i = 0; i < 2; i++) {
        if (m->res[i].dev.data) m->be->free(m->be, &m->res[i].dev);
        memset(&m->res[i], 0, sizeof m->res[i]);
    }
}

/* The resident slot for (key, t): the matching one, else the least recently used one (re-allocated when its
 * token count differs). -1 on allocation failure. */
static int resident_slot(flux2_model *m, const void *key, int t) {
    int slot = -1;
    for (int i = 0; i < 2; i++)
        if (m->res[i].host == key && m->res[i].t == t) slot = i;
    if (slot < 0) {
        slot = m->res[0].use <= m->res[1].use ? 0 : 1;
        if (m->res[slot].dev.data && m->res[slot].t != t) m->be->free(m->be, &m->res[slot].dev);
        if (!m->res[slot].dev.data) {
            if (m->be->alloc(m->be, &m->res[slot].dev, t, m->c.joint_dim, m->be->act_dtype)) return -1;
        }
        m->res[slot].host = key;
        m->res[slot].t = t;
    }
    m->res[slot].use = ++m->res_clock;
    return slot;
}

int flux2_text_resident(flux2_model *m, const float *txt, int t) {
    if (!txt) { drop_resident(m); return 0; }
    if (t <= 0) { dt_set_error("flux2: resident text needs at least one token (got %d)", t); return -1; }
    int slot = resident_slot(m, txt, t);
    if (slot < 0) return -1;
    m->be->upload(m->be, m->res[slot].dev, txt);   /* always: a repeated call declares new contents */
    return 0;
}

int flux2_text_resident_mat(flux2_model *m, const void *key, dt_mat src) {
    if (!key || src.rows <= 0 || src.cols != m->c.joint_dim) {
        dt_set_error("flux2: resident text from a [%lld, %lld] matrix, expected [tokens, %d] and a key",
                     (long long)src.rows, (long long)src.cols, m->c.joint_dim);
        return -1;
    }
    int slot = resident_slot(m, key, (int)src.rows);
    if (slot < 0) return -1;
    m->be->copy(m->be, m->res[slot].dev, src);
    return 0;
}

void flux2_free(flux2_model *m) {
    if (!m) return;
    if (m->be) {
        drop_resident(m);
        drop_refs(m);
        drop_graph(m);
        free_bufs(m->be, &m->buf);
    }
    flux2_weights_free(m);
}

const flux2_config *flux2_get_config(const flux2_model *m) { return &m->c; }

void flux2_model_weights(const flux2_model *m, const flux2_outer_w **outer, const flux2_double_w **db,
                         const flux2_single_w **sb) {
    *outer = &m->o;
    *db = m->db;
    *sb = m->sb;
}

dt_backend *flux2_model_backend(const flux2_model *m) { return m->be; }

void flux2_weight_info(const flux2_model *m, size_t *bytes, char *fmt, size_t fmt_len) {
    if (bytes) *bytes = m->weight_bytes;
    if (fmt && fmt_len) snprintf(fmt, fmt_len, "%s", m->lin.fmt);
}

/* ------------------------------------------------------------------ forward */

/* Buffers for nb sequences of n image and t text rows each (nb 2: the guidance batch's layout, flux2_forward_pair). */
static void ensure_bufs(flux2_model *m, int n, int t, int kv, int nb) {
    flux2_bufs *b = &m->buf;
    if (b->x.s.data && b->n == n && b->t == t && b->kv == kv && b->nb == nb) return;
    drop_graph(m);   /* a captured graph refers to the old buffers */
    free_bufs(m->be, b);
    b->n = n; b->t = t; b->kv = kv; b->nb = nb;
    const int wd = m->c.num_layers > 0, ws = m->c.num_single_layers > 0;
    if (nb == 1) flux2_acts_alloc_kv(m->be, &m->c, n, t, kv, wd, ws, &b->x);
    else acts_alloc(m->be, &m->c, nb * n, nb * t, t, t, wd, ws, &b->x);
}

/* RoPE tables for the joint [text, image, reference] sequence (diffusers Flux2PosEmbed; r = 0 without appended
 * references): per axis a of d_a dims, omega_k = theta^(-2k/d_a) in float64, angle = f32(pos) * omega_k in float64,
 * cos/sin rounded to f32, each frequency repeated for the interleaved pair (2k, 2k+1). Rebuilt only when the ids
 * change. */
static void build_rope(flux2_model *m, const float *txt_ids, int t, const float *img_ids, int n, const float *ref_ids,
                       int r) {
    const flux2_config *c = &m->c;
    flux2_bufs *b = &m->buf;
    int na = c->n_axes, L = t + n + r;
    size_t nid = (size_t)L * na;
    float *ids = dt_malloc(sizeof(float) * (nid ? nid : 1));
    memcpy(ids, txt_ids, sizeof(float) * t * na);
    memcpy(ids + (size_t)t * na, img_ids, sizeof(float) * n * na);
    if (r > 0) memcpy(ids + (size_t)(t + n) * na, ref_ids, sizeof(float) * r * na);
    if (b->ids && !memcmp(b->ids, ids, sizeof(float) * nid)) { free(ids); return; }
    free(b->ids);
    b->ids = ids;
    flux2_acts_rope(m->be, c, &b->x, ids, L);
}

void flux2_acts_rope(dt_backend *be, const flux2_config *c, flux2_acts *x, const float *ids, int rows) {
    float *tables = dt_malloc(sizeof(float) * 2 * (size_t)rows * c->head_dim + 1);
    float *sn = tables + (size_t)rows * c->head_dim;
    flux2_rope_tables(c, ids, rows, tables, sn);
    be->upload(be, x->cos, tables);
    be->upload(be, x->sin, sn);
    free(tables);
}

/* Timestep sinusoid as diffusers computes it in float32: exponent_i = -ln(10000) * i / half,
 * arg = t * exp(exponent_i), output [cos(arg_0..), sin(arg_0..)] (flip_sin_to_cos). */
void flux2_rope_tables(const flux2_config *c, const float *ids, int rows, float *cs, float *sn) {
    int na = c->n_axes, hd = c->head_dim;
    for (int r = 0; r < rows; r++) {
        int off = 0;
        for (int a = 0; a < na; a++) {
            int d = c->axes[a];
            double pos = (double)ids[(size_t)r * na + a];
            for (int k = 0; k < d / 2; k++) {
                double omega = 1.0 / pow((double)c->rope_theta, (double)(2 * k) / d);
                double ang = pos * omega;
                float cv = (float)cos(ang), sv = (float)sin(ang);
                size_t at = (size_t)r * hd + off + 2 * k;
                cs[at] = cs[at + 1] = cv;
                sn[at] = sn[at + 1] = sv;
            }
            off += d;
        }
    }
}

void flux2_timestep_sinusoid(float t, int channels, float *out) {
    int half = channels / 2;
    float lnp = (float)log(10000.0);
    for (int i = 0; i < half; i++) {
        float e = expf(-lnp * (float)i / (float)half);
        float a = t * e;
        out[i] = cosf(a);
        out[half + i] = sinf(a);
    }
}

static dt_mat chunk(dt_mat v, int idx, int64_t d) { return dt_mat_cols(v, idx * d, d); }


void flux2_pre(dt_backend *be, const flux2_outer_w *w, const flux2_outer_io *io, int n, int t) {
    dt_mat none = dt_mat_null();
    be->linear(be, io->th, io->emb, w->t_lin1);
    be->act_mul(be, io->th, io->th, none, DT_ACT_SILU);
    be->linear(be, io->temb, io->th, w->t_lin2);
    be->act_mul(be, io->th, io->temb, none, DT_ACT_SILU);          /* th = SiLU(temb) */
    be->linear(be, io->mod_img, io->th, w->mod_img);
    be->linear(be, io->mod_txt, io->th, w->mod_txt);
    be->linear(be, io->mod_single, io->th, w->mod_single);
    be->linear(be, io->mod_out, io->th, w->norm_out);
    /* input projections straight into the joint stream: text rows [0,T), image rows [T,T+N) */
    be->linear(be, dt_mat_rows(io->s, t, n), io->in_img, w->x_emb);
    if (t > 0) be->linear(be, dt_mat_rows(io->s, 0, t), io->in_txt, w->ctx_emb);
}

void flux2_final(dt_backend *be, const flux2_config *c, const flux2_outer_w *w, const flux2_outer_io *io, int n, int t,
                 void (*trace)(void *ud, const char *name, dt_mat m), void *ud) {
    int64_t D = c->hidden;
    dt_mat a_img = dt_mat_rows(io->a, t, n), s_img = dt_mat_rows(io->s, t, n);
    /* norm_out's modulation is [scale | shift] (the reverse of the blocks' order) */
    be->layernorm_mod(be, a_img, s_img, chunk(io->mod_out, 1, D), chunk(io->mod_out, 0, D), c->eps);
    if (trace) trace(ud, "norm_out", a_img);
    be->linear(be, io->out, a_img, w->proj_out);
}

/* The blocks' joint attention: bf16 (the reference) or, with --attn-precision fp8, the backend's fp8 attention. */
void flux2_block_attention(dt_backend *be, const flux2_config *c, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int heads) {
    const float att_scale = 1.0f / sqrtf((float)c->head_dim);
    if (c->attn_fp8) be->attention_fp8(be, o, q, k, v, heads, heads, c->head_dim, att_scale);
    else be->attention(be, o, q, k, v, heads, heads, c->head_dim, att_scale, dt_mat_null(), 0);
}

static void block_attention(dt_backend *be, const flux2_config *c, dt_mat o, dt_mat q, dt_mat k, dt_mat v) {
    flux2_block_attention(be, c, o, q, k, v, c->heads);
}

/* ---- KV-cached references inside a block (flux2_set_refs with kv_cached): K and V are adjacent column blocks
 * [D, 3D) of qkv (double) and p (single), so a block's reference K|V is one [r, 2D] matrix ---- */

/* kv_store (the reference-only pass): every row's K|V after norm + RoPE into the block's cache. */
static void kv_store(dt_backend *be, const flux2_config *c, dt_mat qkv, dt_mat store) {
    if (store.data) be->copy(be, store, dt_mat_cols(qkv, c->hidden, 2 * c->hidden));
}

/* The attention's K and V: with cached reference rows, the block's cache is copied behind the live rows (which
 * flux2_acts_alloc_kv allocated) and K/V are extended over them: keys [text | noise | reference]. */
static void kv_extend(dt_backend *be, const flux2_config *c, int64_t kv_rows, dt_mat load, dt_mat *k, dt_mat *v) {
    if (!kv_rows) return;
    int64_t L = k->rows;
    dt_mat kv = dt_mat_cols(*k, 0, 2 * c->hidden);   /* k's row pointer, K|V columns (v follows k) */
    kv.rows = L + kv_rows;
    be->copy(be, dt_mat_rows(kv, L, kv_rows), load);
    k->rows += kv_rows;
    v->rows += kv_rows;
}

void flux2_single_op(dt_backend *be, const flux2_config *c, const flux2_single_w *w, const flux2_single_io *io,
                     int k, int split, const dt_linear *next) {
    int H = c->heads, hd = c->head_dim;
    int64_t D = c->hidden, F = c->mlp_hidden;
    float eps = c->eps;
    dt_mat none = dt_mat_null(), ms = io->mod_single;
    dt_mat q = dt_mat_cols(io->p, 0, D), kk = dt_mat_cols(io->p, D, D), v = dt_mat_cols(io->p, 2 * D, D);
    switch (k) {
    case FLUX2_SB_NORM:
        if (!c->fuse_inputs) be->layernorm_mod(be, io->a, io->s, chunk(ms, 0, D), chunk(ms, 1, D), eps);
        break;
    case FLUX2_SB_PROJ:
        if (c->fuse_inputs) be->norm_linear(be, io->p, io->s, chunk(ms, 0, D), chunk(ms, 1, D), eps, w->qkv_mlp, io->a);
        else be->linear(be, io->p, io->a, w->qkv_mlp);
        /* the output projection's weights and the next block's projection can be made ready during the
         * attention (backends that prefetch; the projection's slot is free once its GEMM has run) */
        dt_prefetch(be, w->out, be->linear_gated_add ? chunk(ms, 2, D) : none, io->s.rows);
        dt_prefetch(be, next, none, io->s.rows);
        break;
    case FLUX2_SB_QKNORM: {
        dt_rope_mode mode = split ? DT_ROPE_NONE : DT_ROPE_INTERLEAVED;
        be->head_norm_rope(be, q, H, hd, w->norm_q, eps, io->cos, io->sin, mode);
        be->head_norm_rope(be, kk, H, hd, w->norm_k, eps, io->cos, io->sin, mode);
        kv_store(be, c, io->p, io->kv_store);
        break;
    }
    case FLUX2_SB_ROPE:
        if (split) {
            be->head_norm_rope(be, q, H, hd, none, eps, io->cos, io->sin, DT_ROPE_INTERLEAVED);
            be->head_norm_rope(be, kk, H, hd, none, eps, io->cos, io->sin, DT_ROPE_INTERLEAVED);
        }
        break;
    case FLUX2_SB_ATTN:
        if (io->attn) {
            io->attn(io->attn_ud, dt_mat_cols(io->c, 0, D), q, kk, v);
            break;
        }
        kv_extend(be, c, io->kv_rows, io->kv_load, &kk, &v);
        block_attention(be, c, dt_mat_cols(io->c, 0, D), q, kk, v);
        break;
    case FLUX2_SB_ACT:   /* SwiGLU of the MLP half into the second part of c (the concat is a column view) */
        if (!c->fuse_inputs)
            be->act_mul(be, dt_mat_cols(io->c, D, F), dt_mat_cols(io->p, 3 * D, F), dt_mat_cols(io->p, 3 * D + F, F),
                        DT_ACT_SILU);
        break;
    case FLUX2_SB_OUT:
        if (c->fuse_inputs)   /* [attention | SwiGLU] -> output projection + gated residual */
            be->act_linear_gated(be, io->s, io->c, D, dt_mat_cols(io->p, 3 * D, F), dt_mat_cols(io->p, 3 * D + F, F),
                                 DT_ACT_SILU, w->out, chunk(ms, 2, D), io->y);
        else if (be->linear_gated_add) be->linear_gated_add(be, io->s, io->c, w->out, chunk(ms, 2, D));
        else be->linear(be, io->y, io->c, w->out);
        break;
    case FLUX2_SB_RESID:
        if (!c->fuse_inputs && !be->linear_gated_add) be->gated_add(be, io->s, chunk(ms, 2, D), io->y);
        break;
    }
}

void flux2_single_block(dt_backend *be, const flux2_config *c, const flux2_single_w *w, const flux2_single_io *io,
                        const dt_linear *next) {
    for (int k = 0; k < FLUX2_SB_COUNT; k++) flux2_single_op(be, c, w, io, k, 0, next);
}

/* y = layernorm_mod(x) · Wᵀ through a: one backend op when c->fuse_inputs, else the two. */
static void norm_then_linear(dt_backend *be, const flux2_config *c, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale,
                             const dt_linear *w, dt_mat a) {
    if (c->fuse_inputs) be->norm_linear(be, y, x, shift, scale, c->eps, w, a);
    else dt_norm_linear_composed(be, y, x, shift, scale, c->eps, w, a);
}

/* x += gate ⊙ (SwiGLU(h) · Wᵀ), h = [gate half | up half] [M, 2F], g the SwiGLU's scratch [M, F], y the linear's. */
static void swiglu_then_linear(dt_backend *be, const flux2_config *c, dt_mat x, dt_mat h, dt_mat g, const dt_linear *w,
                               dt_mat gate, dt_mat y) {
    int64_t F = c->mlp_hidden;
    dt_mat a = dt_mat_cols(h, 0, F), b = dt_mat_cols(h, F, F);
    if (c->fuse_inputs) be->act_linear_gated(be, x, g, 0, a, b, DT_ACT_SILU, w, gate, y);
    else dt_act_linear_gated_composed(be, x, g, 0, a, b, DT_ACT_SILU, w, gate, y);
}

void flux2_double_block(dt_backend *be, const flux2_config *c, const flux2_double_w *w, const flux2_double_io *io,
                        int n, int t, int first, int join, const dt_linear *next, int64_t next_rows) {
    int64_t D = c->hidden;
    int H = c->heads, hd = c->head_dim;
    float eps = c->eps;
    dt_mat none = dt_mat_null(), mi = io->mod_img, mt = io->mod_txt;
    dt_mat s_txt = dt_mat_rows(io->s, 0, t), s_img = dt_mat_rows(io->s, t, n);
    dt_mat a_txt = dt_mat_rows(io->a, 0, t), a_img = dt_mat_rows(io->a, t, n);
    dt_mat cos_t = dt_mat_rows(io->cos, 0, t), sin_t = dt_mat_rows(io->sin, 0, t);
    dt_mat cos_i = dt_mat_rows(io->cos, t, n), sin_i = dt_mat_rows(io->sin, t, n);
    /* attention: norm1 + modulation, projections into joint Q/K/V rows. The text stream's ops touch only text
     * rows: they run on the side queue, which waits for the main one before the first block and after each
     * attention; the main queue waits for it before each attention (and at the end when joining). */
    if (t > 0) {
        dt_on_queue(be, 1, first);
        norm_then_linear(be, c, dt_mat_rows(io->qkv, 0, t), s_txt, chunk(mt, 0, D), chunk(mt, 1, D), w->add_qkv, a_txt);
        be->head_norm_rope(be, dt_mat_rows(io->q, 0, t), H, hd, w->norm_aq, eps, cos_t, sin_t, DT_ROPE_INTERLEAVED);
        be->head_norm_rope(be, dt_mat_rows(io->k, 0, t), H, hd, w->norm_ak, eps, cos_t, sin_t, DT_ROPE_INTERLEAVED);
        dt_on_queue(be, 0, 0);
    }
    norm_then_linear(be, c, dt_mat_rows(io->qkv, t, n), s_img, chunk(mi, 0, D), chunk(mi, 1, D), w->to_qkv, a_img);
    /* main-queue weights ahead (backends that prefetch): the output projection and linear_in during the
     * attention, linear_out after the output projection, the next block's first projection after linear_in */
    dt_mat gate_or_none = be->linear_gated_add ? chunk(mi, 2, D) : none;
    dt_prefetch(be, w->to_out, gate_or_none, n);
    dt_prefetch(be, w->ff_in, none, n);
    be->head_norm_rope(be, dt_mat_rows(io->q, t, n), H, hd, w->norm_q, eps, cos_i, sin_i, DT_ROPE_INTERLEAVED);
    be->head_norm_rope(be, dt_mat_rows(io->k, t, n), H, hd, w->norm_k, eps, cos_i, sin_i, DT_ROPE_INTERLEAVED);
    if (t > 0) dt_on_queue(be, 0, 1);   /* attention needs the text rows */
    if (io->attn) {
        io->attn(io->attn_ud, io->o, io->q, io->k, io->v);
    } else {
        kv_store(be, c, io->qkv, io->kv_store);
        dt_mat k_att = io->k, v_att = io->v;
        kv_extend(be, c, io->kv_rows, io->kv_load, &k_att, &v_att);
        block_attention(be, c, io->o, io->q, k_att, v_att);
    }
    /* output projections + gated residual; feed-forward (SwiGLU: first half of linear_in is the gate) */
    dt_mat y_txt = dt_mat_rows(io->y, 0, t), y_img = dt_mat_rows(io->y, t, n);
    if (t > 0) {
        dt_mat h_txt = dt_mat_rows(io->h, 0, t), g_txt = dt_mat_rows(io->g, 0, t);
        dt_on_queue(be, 1, 1);          /* after the attention */
        dt_linear_gated(be, s_txt, dt_mat_rows(io->o, 0, t), w->to_add_out, chunk(mt, 2, D), y_txt);
        norm_then_linear(be, c, h_txt, s_txt, chunk(mt, 3, D), chunk(mt, 4, D), w->ffc_in, a_txt);
        swiglu_then_linear(be, c, s_txt, h_txt, g_txt, w->ffc_out, chunk(mt, 5, D), y_txt);
        dt_on_queue(be, 0, 0);
    }
    dt_linear_gated(be, s_img, dt_mat_rows(io->o, t, n), w->to_out, chunk(mi, 2, D), y_img);
    dt_prefetch(be, w->ff_out, be->linear_gated_add ? chunk(mi, 5, D) : none, n);
    dt_mat h_img = dt_mat_rows(io->h, t, n), g_img = dt_mat_rows(io->g, t, n);
    norm_then_linear(be, c, h_img, s_img, chunk(mi, 3, D), chunk(mi, 4, D), w->ff_in, a_img);
    dt_prefetch(be, next, none, next_rows);
    swiglu_then_linear(be, c, s_img, h_img, g_img, w->ff_out, chunk(mi, 5, D), y_img);
    if (t > 0 && join) dt_on_queue(be, 0, 1);
}

void flux2_set_cancel(flux2_model *m, const volatile int *flag) { m->cancel = flag; }

/* A forward that stopped at a block boundary because its request was cancelled: -1 with the error set, once the work
 * already queued on the device has finished (the next forward starts from a quiet stream). */
static int stopped(flux2_model *m) {
    m->be->sync(m->be);
    dt_set_error("flux2: cancelled");
    return -1;
}

/* The blocks of one forward on activations x (n image rows, t text rows), from the timestep MLP to the last single
 * block; inputs in x->emb / x->in_img / x->in_txt and the RoPE tables. kv_rows, kv_load (per block, NULL: none): cached
 * reference K|V the attention also sees; kv_store (per block, NULL: none): where each block's K|V go (the
 * reference-only pass). Blocks are numbered double first, then single. No host transfers and no allocation, except
 * with First Block Cache (fbc, NULL: none): after the first block, a download of its residual decides whether the
 * other blocks run or their cached residual is added (block_cache.h). may_stop: before each block, stop when the
 * request is cancelled (m->cancel) and return 1; else 0. */
static int run_blocks(flux2_model *m, const flux2_acts *x, int n, int t, int64_t kv_rows, const dt_mat *kv_load,
                      const dt_mat *kv_store, dt_fbc_branch *fbc, flux2_trace_fn trace, void *ud, int may_stop,
                      flux2_attn_hook attn, void *attn_ud) {
    const flux2_config *c = &m->c;
    dt_backend *be = m->be;
    int nd = c->num_layers;
    flux2_outer_io oio = flux2_acts_outer(x);
    dt_mat s_txt = dt_mat_rows(x->s, 0, t), s_img = dt_mat_rows(x->s, t, n);

    /* ---- double-stream blocks (flux2_double_block: the text stream on the side queue) ---- */
    flux2_double_io io = flux2_acts_double(x);
    io.kv_rows = kv_rows;
    io.attn = attn;
    io.attn_ud = attn_ud;
    /* the first transient Linear of the first block can be prepared while the embedders run */
    if (c->num_layers > 0) dt_prefetch(be, m->db[0].to_qkv, dt_mat_null(), n);
    else if (c->num_single_layers > 0) dt_prefetch(be, flux2_single_first(&m->sb[0]), dt_mat_null(), (int64_t)n + t);
    flux2_pre(be, &m->o, &oio, n, t);
    const int nb = c->num_layers + c->num_single_layers;
    if (fbc) dt_fbc_begin(be, fbc, s_img);
    for (int i = 0; i < c->num_layers; i++) {
        if (may_stop && dt_cancel_requested(m->cancel)) return 1;
        int last = i == c->num_layers - 1;
        const dt_linear *next = !last ? m->db[i + 1].to_qkv : c->num_single_layers > 0 ? flux2_single_first(&m->sb[0]) : NULL;
        if (kv_load) io.kv_load = kv_load[i];
        if (kv_store) io.kv_store = kv_store[i];
        flux2_double_block(be, c, &m->db[i], &io, n, t, i == 0, last || trace || (fbc && i == 0), next,
                           last ? (int64_t)n + t : n);
        if (trace) {
            char nm[64];
            snprintf(nm, sizeof nm, "double.%d.out0", i); trace(ud, nm, s_txt);
            snprintf(nm, sizeof nm, "double.%d.out1", i); trace(ud, nm, s_img);
        }
        if (fbc && i == 0 && !dt_fbc_after_head(be, fbc, s_img)) return 0;   /* the cached residual instead */
    }

    /* ---- single-stream blocks on the joint stream ---- */
    flux2_single_io sio = flux2_acts_single(x);
    sio.kv_rows = kv_rows;
    sio.attn = attn;
    sio.attn_ud = attn_ud;
    for (int i = 0; i < c->num_single_layers; i++) {
        if (may_stop && dt_cancel_requested(m->cancel)) return 1;
        const dt_linear *next = i + 1 < c->num_single_layers ? flux2_single_first(&m->sb[i + 1]) : NULL;
        if (kv_load) sio.kv_load = kv_load[nd + i];
        if (kv_store) sio.kv_store = kv_store[nd + i];
        flux2_single_block(be, c, &m->sb[i], &sio, next);
        if (trace) {
            char nm[64];
            snprintf(nm, sizeof nm, "single.%d", i);
            trace(ud, nm, x->s);
        }
        if (fbc && c->num_layers == 0 && i == 0 && !dt_fbc_after_head(be, fbc, s_img)) return 0;
    }
    if (fbc && nb > 0) dt_fbc_end(be, fbc, s_img);
    return 0;
}

/* The guidance batch's attention (flux2_attn_hook of every block): the rows are [text 0 | text 1 | image 1 | image 0]
 * (t text and na image rows per sequence), so sequence 1 is the contiguous rows [t, 2t + na); sequence 0's text rows
 * (its Q|K|V after norm + RoPE) are copied behind the last row, making it the rows [2t + na, R + t), and its
 * attention output's text rows go back to [0, t). Each sequence's attention is its single forward's (the keys in
 * another order). */
typedef struct {
    dt_backend *be;
    const flux2_config *c;
    int64_t t, na;
} pair_attn;

static void pair_attention(void *ud, dt_mat o, dt_mat q, dt_mat k, dt_mat v) {
    const pair_attn *p = ud;
    dt_backend *be = p->be;
    const int64_t t = p->t, na = p->na, R = o.rows, L = t + na;
    block_attention(be, p->c, dt_mat_rows(o, t, L), dt_mat_rows(q, t, L), dt_mat_rows(k, t, L), dt_mat_rows(v, t, L));
    dt_mat qkv = dt_mat_cols(q, 0, 3 * (int64_t)p->c->hidden);   /* q's row pointer, Q|K|V (adjacent columns) */
    if (t > 0) be->copy(be, dt_mat_rows(qkv, R, t), dt_mat_rows(qkv, 0, t));
    const int64_t r0 = 2 * t + na;
    block_attention(be, p->c, dt_mat_rows(o, r0, L), dt_mat_rows(q, r0, L), dt_mat_rows(k, r0, L), dt_mat_rows(v, r0, L));
    if (t > 0) be->copy(be, dt_mat_rows(o, 0, t), dt_mat_rows(o, R, t));
}

/* Everything of one forward that runs on the device, from the timestep MLP to proj_out: inputs are in b->x.emb /
 * b->x.in_img / b->x.in_txt and the RoPE tables, the result lands in b->x.out's first n_out rows (n image rows run
 * through the blocks: the noise tokens, then appended reference tokens). No host transfers and no allocation, so it
 * can be captured into a graph (may_stop 0). may_stop: stop at a block boundary of a cancelled request, returning 1. */
static int device_part(flux2_model *m, int n, int n_out, int t, flux2_trace_fn trace, void *ud, int may_stop) {
    flux2_bufs *b = &m->buf;
    if (b->nb == 2) {   /* the guidance batch (flux2_forward_pair): both sequences' rows through every Linear */
        pair_attn pa = {m->be, &m->c, t, n};
        if (run_blocks(m, &b->x, 2 * n, 2 * t, 0, NULL, NULL, NULL, NULL, NULL, may_stop, pair_attention, &pa)) return 1;
        /* each sequence's noise rows (sequence 1's image rows first) into out rows [s * n_out, (s + 1) * n_out) */
        for (int s = 0; s < 2; s++) {
            flux2_outer_io oio = flux2_acts_outer(&b->x);
            oio.out = dt_mat_rows(oio.out, (int64_t)s * n_out, n_out);
            flux2_final(m->be, &m->c, &m->o, &oio, n_out, 2 * t + (s ? 0 : n), NULL, NULL);
        }
        return 0;
    }
    if (run_blocks(m, &b->x, n, t, b->kv, b->kv ? m->ref.cache : NULL, NULL, m->fbc, trace, ud, may_stop, NULL, NULL))
        return 1;
    /* ---- final adaptive norm (diffusers order: scale first, then shift) and projection of the noise rows ---- */
    flux2_outer_io oio = flux2_acts_outer(&b->x);
    oio.out = dt_mat_rows(oio.out, 0, n_out);
    flux2_final(m->be, &m->c, &m->o, &oio, n_out, t, trace, ud);
    return 0;
}

/* ------------------------------------------------------------------ reference tokens */

static void drop_refs(flux2_model *m) {
    dt_backend *be = m->be;
    if (m->ref.tok.data) be->free(be, &m->ref.tok);
    for (int i = 0; m->ref.cache && i < m->c.num_layers + m->c.num_single_layers; i++)
        if (m->ref.cache[i].data) be->free(be, &m->ref.cache[i]);
    if (m->ref.x.s.data) flux2_acts_free(be, &m->ref.x);
    free(m->ref.cache);
    free(m->ref.ids);
    memset(&m->ref, 0, sizeof m->ref);
}

/* Device buffers for r reference tokens (KV mode: every block's K|V and the reference-only pass's activations):
 * the previous request's when its geometry was the same (nothing allocated, a captured graph stays valid), else
 * new ones. 0 or -1 (dt_last_error). */
static int refs_ensure(flux2_model *m, int r, int kv_cached) {
    const flux2_config *c = &m->c;
    dt_backend *be = m->be;
    const int nb = c->num_layers + c->num_single_layers;
    if (m->ref.tok.data && m->ref.tok.rows == r && (m->ref.cache != NULL) == (kv_cached != 0)) return 0;
    drop_graph(m);   /* a captured forward refers to the old buffers */
    drop_refs(m);
    if (be->alloc(be, &m->ref.tok, r, c->in_channels, be->act_dtype)) goto fail;
    m->ref.ids = dt_malloc(sizeof(float) * (size_t)r * c->n_axes);
    if (kv_cached) {
        m->ref.cache = dt_calloc(nb ? nb : 1, sizeof(dt_mat));
        for (int i = 0; i < nb; i++)
            if (be->alloc(be, &m->ref.cache[i], r, 2 * (int64_t)c->hidden, be->act_dtype)) goto fail;
        flux2_acts_alloc(be, c, r, 0, c->num_layers > 0, c->num_single_layers > 0, &m->ref.x);
    }
    return 0;
fail:
    drop_refs(m);
    return -1;
}

int flux2_set_refs(flux2_model *m, const float *tokens, const float *ids, int r, int kv_cached) {
    const flux2_config *c = &m->c;
    if (!tokens || r <= 0) {   /* none: the buffers stay for a later request of the same geometry */
        m->ref.r = 0;
        m->ref.filled = 0;
        return 0;
    }
    if (!ids) { dt_set_error("flux2: reference tokens need their position ids"); return -1; }
    if (refs_ensure(m, r, kv_cached)) return -1;
    m->be->upload(m->be, m->ref.tok, tokens);
    memcpy(m->ref.ids, ids, sizeof(float) * (size_t)r * c->n_axes);
    m->ref.r = r;
    m->ref.kv_cached = kv_cached != 0;
    m->ref.filled = 0;   /* KV mode: the next forward runs the reference-only pass for these tokens */
    return 0;
}

/* The KV mode's reference-only pass (Flux2KleinKVPipeline's step 0 "extract"): the reference tokens alone through
 * the blocks at timestep 0 (ref_fixed_timestep: their own modulation), attending only to themselves, each block's
 * K|V after norm + RoPE into m->ref.cache. Text and noise never reach these rows, so the result depends only on the
 * references: it is computed once and every forward's attention reuses it. */
static int kv_extract(flux2_model *m) {
    const flux2_config *c = &m->c;
    dt_backend *be = m->be;
    int r = m->ref.r;
    flux2_acts *x = &m->ref.x;   /* [r] rows, kept with the references (refs_ensure) */
    float *emb = dt_malloc(sizeof(float) * c->tg_channels);
    float *cs = dt_malloc(sizeof(float) * (size_t)r * c->head_dim), *sn = dt_malloc(sizeof(float) * (size_t)r * c->head_dim);
    flux2_timestep_sinusoid(0.0f, c->tg_channels, emb);
    flux2_rope_tables(c, m->ref.ids, r, cs, sn);
    be->upload(be, x->emb, emb);
    be->upload(be, x->cos, cs);
    be->upload(be, x->sin, sn);
    be->copy(be, x->in_img, m->ref.tok);
    int cut = run_blocks(m, x, r, 0, 0, NULL, m->ref.cache, NULL, NULL, NULL, 1, NULL, NULL);
    free(emb); free(cs); free(sn);
    if (cut) return stopped(m);
    int rc = be->sync(be);
    if (rc == 0) m->ref.filled = 1;
    return rc;
}

void flux2_set_block_cache(flux2_model *m, dt_fbc_branch *f) { m->fbc = f; }

/* The text features txt [t, joint] into dst: a device copy of a resident slot holding them, else an upload. */
static void text_input(flux2_model *m, const float *txt, int t, dt_mat dst) {
    int slot = -1;
    for (int i = 0; i < 2; i++)
        if (m->res[i].host && m->res[i].host == txt && m->res[i].t == t) slot = i;
    if (slot >= 0) {
        m->be->copy(m->be, dst, m->res[slot].dev);   /* resident: a device copy, no host transfer */
        m->res[slot].use = ++m->res_clock;
    } else {
        m->be->upload(m->be, dst, txt);
    }
}

/* The device part of a forward on the uploaded inputs (na image rows of which n projected out, t text rows per
 * sequence; the buffers' sequences): eager, or captured on the second call of a shape and replayed (flux2_set_graph;
 * a trace or First Block Cache runs eagerly). 0 or -1 (a cancelled forward: stopped). */
static int run_device(flux2_model *m, int na, int n, int t, flux2_trace_fn trace, void *ud) {
    dt_backend *be = m->be;
    const int nb = m->buf.nb;
    if (!m->use_graph || trace || m->fbc) {
        if (device_part(m, na, n, t, trace, ud, 1)) return stopped(m);
    } else if (m->graph && m->graph_n == na && m->graph_t == t && m->graph_nout == n && m->graph_nb == nb) {
        if (be->graph_launch(be, m->graph)) return -1;
    } else if (m->warm_n == na && m->warm_t == t && m->warm_nout == n && m->warm_nb == nb) {
        /* second call at this shape: capture the device part, then replay it */
        if (be->capture_begin(be)) return -1;
        device_part(m, na, n, t, NULL, NULL, 0);
        m->graph = be->capture_end(be);
        if (!m->graph) return -1;
        m->graph_n = na; m->graph_t = t; m->graph_nout = n; m->graph_nb = nb;
        if (be->graph_launch(be, m->graph)) return -1;
    } else {
        /* eager warm-up: scratch buffers reach their sizes (a cancelled one does not count as the warm-up) */
        if (device_part(m, na, n, t, NULL, NULL, 1)) return stopped(m);
        m->warm_n = na; m->warm_t = t; m->warm_nout = n; m->warm_nb = nb;
    }
    return 0;
}

int flux2_forward(flux2_model *m, const float *img, int n, const float *txt, int t, float timestep,
                  const float *img_ids, const float *txt_ids, float *out, flux2_trace_fn trace, void *ud) {
    const flux2_config *c = &m->c;
    dt_backend *be = m->be;
    if (n <= 0 || t < 0) { dt_set_error("flux2: need at least one image token (got %d image, %d text)", n, t); return -1; }
    if (!isfinite(timestep)) { dt_set_error("flux2: timestep is %g; it must be a finite number", (double)timestep); return -1; }
    /* references (flux2_set_refs): appended after the noise rows (ra), or as cached K|V rows (kv) */
    int ra = m->ref.r && !m->ref.kv_cached ? m->ref.r : 0, kv = m->ref.kv_cached ? m->ref.r : 0;
    if (kv && !m->ref.filled && kv_extract(m)) return -1;
    int na = n + ra;
    ensure_bufs(m, na, t, kv, 1);
    flux2_bufs *b = &m->buf;
    build_rope(m, txt_ids, t, img_ids, n, m->ref.ids, ra);

    /* host inputs: timestep sinusoid, latent tokens (+ the resident reference tokens), text features */
    float *emb = dt_malloc(sizeof(float) * c->tg_channels);
    flux2_timestep_sinusoid(timestep * 1000.0f, c->tg_channels, emb);
    be->upload(be, b->x.emb, emb);
    free(emb);
    if (ra) {
        be->upload(be, dt_mat_rows(b->x.in_img, 0, n), img);
        be->copy(be, dt_mat_rows(b->x.in_img, n, ra), m->ref.tok);
    } else {
        be->upload(be, b->x.in_img, img);
    }
    if (t > 0) text_input(m, txt, t, b->x.in_txt);

    if (m->fbc && dt_fbc_prepare(be, m->fbc, na, c->hidden)) return -1;
    if (run_device(m, na, n, t, trace, ud)) return -1;
    be->download(be, out, dt_mat_rows(b->x.out, 0, n));
    if (be->sync(be) != 0) return -1;
    return 0;
}

int flux2_forward_pair(flux2_model *m, const float *img0, const float *img1, int n, const float *txt0,
                       const float *txt1, int t, float timestep, const float *img_ids, const float *txt_ids,
                       float *out0, float *out1) {
    const flux2_config *c = &m->c;
    dt_backend *be = m->be;
    if (n <= 0 || t < 0) { dt_set_error("flux2: need at least one image token (got %d image, %d text)", n, t); return -1; }
    if (!isfinite(timestep)) { dt_set_error("flux2: timestep is %g; it must be a finite number", (double)timestep); return -1; }
    if (m->fbc || (m->ref.kv_cached && m->ref.r)) {
        dt_set_error("flux2: the guidance batch runs without First Block Cache and KV-cached references (two passes "
                     "then)");
        return -1;
    }
    const int ra = m->ref.kv_cached ? 0 : m->ref.r, na = n + ra;   /* appended references (KV ones: refused above) */
    ensure_bufs(m, na, t, 0, 2);
    flux2_bufs *b = &m->buf;
    /* rows [text 0 | text 1 | image 1 (+ references) | image 0 (+ references)] (pair_attention), positions alike */
    const int naxes = c->n_axes, R = 2 * (t + na);
    float *ids = dt_malloc(sizeof(float) * (size_t)R * naxes + 1);
    for (int s = 0; s < 2; s++) {
        if (t > 0) memcpy(ids + (size_t)s * t * naxes, txt_ids, sizeof(float) * (size_t)t * naxes);
        float *im = ids + (size_t)(2 * t + s * na) * naxes;
        memcpy(im, img_ids, sizeof(float) * (size_t)n * naxes);
        if (ra) memcpy(im + (size_t)n * naxes, m->ref.ids, sizeof(float) * (size_t)ra * naxes);
    }
    if (b->ids && !memcmp(b->ids, ids, sizeof(float) * (size_t)R * naxes)) {
        free(ids);
    } else {
        free(b->ids);
        b->ids = ids;
        flux2_acts_rope(be, c, &b->x, ids, R);
    }
    float *emb = dt_malloc(sizeof(float) * c->tg_channels);
    flux2_timestep_sinusoid(timestep * 1000.0f, c->tg_channels, emb);
    be->upload(be, b->x.emb, emb);
    free(emb);
    for (int s = 0; s < 2; s++) {   /* in_img rows: sequence 1's, then sequence 0's (each noise, then references) */
        dt_mat dst = dt_mat_rows(b->x.in_img, (int64_t)(1 - s) * na, na);
        be->upload(be, dt_mat_rows(dst, 0, n), s ? img1 : img0);
        if (ra) be->copy(be, dt_mat_rows(dst, n, ra), m->ref.tok);
        if (t > 0) text_input(m, s ? txt1 : txt0, t, dt_mat_rows(b->x.in_txt, (int64_t)s * t, t));
    }
    if (run_device(m, na, n, t, NULL, NULL)) return -1;
    be->download(be, out0, dt_mat_rows(b->x.out, 0, n));
    be->download(be, out1, dt_mat_rows(b->x.out, n, n));
    return be->sync(be) != 0 ? -1 : 0;
}
