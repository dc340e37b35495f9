/* bench_model.c — the bench's device-only replica of the FLUX.2-klein forward (src/models/flux2.c).
 *
 * The blocks are flux2.c's own (flux2_double_block, flux2_single_op and their weight loaders) run on the
 * replica's buffers, split into pieces the bench can time on their own: the pre-step (timestep MLP,
 * modulations, embedders), each double block, each single block up to any of its ops (cumulative prefixes),
 * and the final layer. It never transfers to or from the host and never allocates inside a forward, so it
 * can be captured into a CUDA graph. Any subset of blocks can be loaded, which lets the arms build small
 * per-backend copies. The bench checks it against flux2_forward (max |difference| of the outputs) in every run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"
#include "io/json.h"



bm_model *bm_load(dt_backend *be, const bench_opts *o, const char *path, int nd, int ns, int embed, int to_f32) {
    const flux2_load_opts lo = {.precision = o->precision, .attn_precision = o->attn_precision};
    char *dir = dt_weights_component_dir(path, "transformer");
    if (!dir) return NULL;
    bm_model *m = dt_calloc(1, sizeof *m);
    m->be = be;
    m->lin.be = be;
    m->to_f32 = to_f32;
    m->lin.dense_f32 = to_f32;   /* dense bf16/f16 weights as f32 host copies (the bench's f32 format) */
    m->w = dt_weights_open(dir);
    free(dir);
    if (!m->w) { free(m); return NULL; }
    const json *cfg = dt_weights_config(m->w);
    if (!cfg) { dt_set_error("%s: no config.json", dt_weights_path(m->w)); goto fail; }
    if (flux2_config_parse(cfg, "config.json", &m->c)) goto fail;
    const flux2_config *c = &m->c;
    m->nd = nd < 0 || nd > c->num_layers ? c->num_layers : nd;
    m->ns = ns < 0 || ns > c->num_single_layers ? c->num_single_layers : ns;
    m->embed = embed;
    if (embed && flux2_outer_w_load(&m->lin, m->w, c, &m->ow)) goto fail;
    m->lin.precision = o->precision;   /* --precision fp8: the blocks' Linears (embedders, modulation, final stay bf16) */
    if (flux2_runtime_choices(be, &lo, o->precision, &m->c, dt_weights_path(m->w))) goto fail;   /* as flux2_load */
    m->db = dt_calloc(m->nd ? m->nd : 1, sizeof *m->db);
    for (int i = 0; i < m->nd; i++)   /* flux2.c's loader: the same stacked Q/K/V Linears */
        if (flux2_double_w_load(&m->lin, m->w, c, i, &m->db[i].w, &m->db[i].to_qkv_src, &m->db[i].add_qkv_src)) goto fail;
    m->sb = dt_calloc(m->ns ? m->ns : 1, sizeof *m->sb);
    for (int i = 0; i < m->ns; i++)
        if (flux2_single_w_load(&m->lin, m->w, c, i, &m->sb[i])) goto fail;
    return m;
fail:
    bm_free(m);
    return NULL;
}

static void bm_free_acts(bm_model *m) { flux2_acts_free(m->be, &m->x); }

void bm_free(bm_model *m) {
    if (!m) return;
    if (m->be) {
        m->be->sync(m->be);
        bm_free_acts(m);
        dt_linear_set_free(&m->lin);
        for (int i = 0; m->db && i < m->nd; i++) flux2_double_w_free(m->be, &m->db[i].w);
        for (int i = 0; m->sb && i < m->ns; i++) flux2_single_w_free(m->be, &m->sb[i]);
    }
    free(m->db);
    free(m->sb);
    if (m->w) dt_weights_close(m->w);
    free(m);
}

void bm_alloc(bm_model *m, int n, int t, const float *img_ids, const float *txt_ids) {
    bm_free_acts(m);
    m->n = n;
    m->t = t;
    flux2_acts_alloc(m->be, &m->c, n, t, m->nd > 0, m->ns > 0, &m->x);
    /* RoPE tables as flux2.c builds them, from the joint [text | image] ids */
    int na = m->c.n_axes;
    float *ids = dt_malloc(sizeof(float) * (size_t)(t + n) * na + 1);
    if (t > 0) memcpy(ids, txt_ids, sizeof(float) * (size_t)t * na);
    if (n > 0) memcpy(ids + (size_t)t * na, img_ids, sizeof(float) * (size_t)n * na);
    flux2_acts_rope(m->be, &m->c, &m->x, ids, t + n);
    free(ids);
}


void bm_inputs(bm_model *m, const float *img, const float *txt, float timestep) {
    float *emb = dt_malloc(sizeof(float) * m->c.tg_channels);
    flux2_timestep_sinusoid(timestep * 1000.0f, m->c.tg_channels, emb);
    m->be->upload(m->be, m->x.emb, emb);
    free(emb);
    m->be->upload(m->be, m->x.in_img, img);
    if (m->t > 0) m->be->upload(m->be, m->x.in_txt, txt);
}

void bm_randomize(bm_model *m, uint64_t seed) {
    dt_backend *be = m->be;
    bench_fill_randn(be, m->x.s, seed, 1.0f);
    bench_fill_randn(be, m->x.mod_img, seed + 1, 0.3f);
    bench_fill_randn(be, m->x.mod_txt, seed + 2, 0.3f);
    bench_fill_randn(be, m->x.mod_single, seed + 3, 0.3f);
    bench_fill_randn(be, m->x.mod_out, seed + 4, 0.3f);
    if (m->x.p.data) bench_fill_randn(be, m->x.p, seed + 5, 1.0f);
    if (m->x.c.data) bench_fill_randn(be, m->x.c, seed + 6, 1.0f);
}


void bm_pre(bm_model *m) {
    flux2_outer_io io = flux2_acts_outer(&m->x);
    flux2_pre(m->be, &m->ow, &io, m->n, m->t);
}


/* Double block i: flux2.c's own block function on the replica's buffers. join = 1: the main queue waits for the
 * side one at the end (flux2.c does so after its last double block). */
void bm_double_block(bm_model *m, int i, int join) {
    flux2_double_io io = flux2_acts_double(&m->x);
    int last = i + 1 >= m->nd;
    const dt_linear *next = !last ? m->db[i + 1].w.to_qkv : m->ns > 0 ? flux2_single_first(&m->sb[0]) : NULL;
    flux2_double_block(m->be, &m->c, &m->db[i].w, &io, m->n, m->t, i == 0, join, next,
                       last ? (int64_t)m->n + m->t : m->n);
}

/* Op k of single block i alone (the ledger's direct timing). split = 1: the QK norm is a norm-only pass
 * and RoPE a rotation-only pass (two passes instead of the model's fused one). */
void bm_single_op(bm_model *m, int i, int k, int split) {
    flux2_single_io io = flux2_acts_single(&m->x);
    flux2_single_op(m->be, &m->c, &m->sb[i], &io, k, split, i + 1 < m->ns ? flux2_single_first(&m->sb[i + 1]) : NULL);
}

void bm_single_block(bm_model *m, int i) {
    for (int k = 0; k < FLUX2_SB_COUNT; k++) bm_single_op(m, i, k, 0);
}

void bm_final(bm_model *m) {
    flux2_outer_io io = flux2_acts_outer(&m->x);
    flux2_final(m->be, &m->c, &m->ow, &io, m->n, m->t, NULL, NULL);
}

void bm_forward(bm_model *m, int nd, int ns) {
    /* as flux2.c: the first block's first projection is prefetched while the embedders run */
    if (m->nd > 0) dt_prefetch(m->be, m->db[0].w.to_qkv, dt_mat_null(), m->n);
    else if (m->ns > 0) dt_prefetch(m->be, flux2_single_first(&m->sb[0]), dt_mat_null(), (int64_t)m->n + m->t);
    bm_pre(m);
    int last = (nd < m->nd ? nd : m->nd) - 1;
    for (int i = 0; i <= last; i++) bm_double_block(m, i, i == last);
    flux2_single_io io = flux2_acts_single(&m->x);
    for (int i = 0; i < ns && i < m->ns; i++)   /* flux2.c's block function (its queue overlap included) */
        flux2_single_block(m->be, &m->c, &m->sb[i], &io, i + 1 < m->ns ? flux2_single_first(&m->sb[i + 1]) : NULL);
    bm_final(m);
}

void bm_count_flops(const flux2_config *c, int n, int t, bm_flops *f) {
    double D = c->hidden, F = c->mlp_hidden, L = (double)n + t, N = n, T = t;
    memset(f, 0, sizeof *f);
    f->embed = 2 * N * c->in_channels * D + 2 * T * c->joint_dim * D + 2 * N * D * c->out_channels +
               2 * (c->tg_channels * D + D * D + D * (6 + 6 + 3 + 2) * D);
    f->single_proj = 2 * L * D * (3 * D + 2 * F);
    f->single_out = 2 * L * (D + F) * D;
    f->single_attn = 4 * L * L * D;
    f->double_img = 2 * N * D * (4 * D + 2 * F) + 2 * N * F * D;
    f->double_txt = 2 * T * D * (4 * D + 2 * F) + 2 * T * F * D;
    f->double_attn = 4 * L * L * D;
    f->total_gemm = f->embed + c->num_single_layers * (f->single_proj + f->single_out) +
                    c->num_layers * (f->double_img + f->double_txt);
    f->total_attn = (c->num_single_layers + c->num_layers) * f->single_attn;
    double g = 1e-9;
    f->embed *= g; f->single_proj *= g; f->single_out *= g; f->single_attn *= g; f->double_img *= g;
    f->double_txt *= g; f->double_attn *= g; f->total_gemm *= g; f->total_attn *= g;
}
