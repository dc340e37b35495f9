/* bench_perf.c — utilization: achieved TFLOPS of every GEMM shape of the forward and of attention,
 * next to ceilings measured in the same run.
 *
 * For each GEMM shape: in-model time (from the single-block ledger, where the op is timed inside the
 * block sequence), isolated time with the model's own weights (the blocks' distinct Linears, plus host
 * copies until one pass exceeds twice the cache), and the ceiling: the backend's dense bf16 GEMM
 * (cuBLASLt on CUDA) at the same shape on random bf16 weights rotated the same way. Attention: in-model
 * and isolated on random Q/K/V. Device copy bandwidth from one large copy (bytes read + written).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

typedef struct {
    const char *name;
    int64_t M, K, N;
    int count;
    const char *fmt;        /* tensor name pattern with %d for the block, or a plain name */
    const char *fmt2[3];    /* more patterns of the same shape (e.g. to_k, to_v, to_out) */
    int per_double, per_single;
    int inmodel_op;         /* ledger op index, or -1 */
} gemm_shape;

/* Collect the replica's Linears for the shape (borrowed, distinct weights) and the first one's host source. */
static int shape_linears(bench_ctx *x, const gemm_shape *g, dt_linear **out, int max, dt_linear_src *src) {
    bm_model *bm = x->bm;
    int n = 0;
    char nm[256];
    const char *pats[4] = {g->fmt, g->fmt2[0], g->fmt2[1], g->fmt2[2]};
    int nb = g->per_double ? bm->nd : g->per_single ? bm->ns : 1;
    int have_src = 0;
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < 4; p++) {
            if (!pats[p]) continue;
            if (pats[p][0] == '@') {   /* the replica's stacked Q/K/V Linears ("@to_qkv", "@add_qkv") */
                if (!g->per_double || b >= bm->nd) continue;
                int img = !strcmp(pats[p], "@to_qkv");
                if (!have_src) { *src = img ? bm->db[b].to_qkv_src : bm->db[b].add_qkv_src; have_src = 1; }
                if (n < max) out[n++] = img ? bm->db[b].w.to_qkv : bm->db[b].w.add_qkv;
                continue;
            }
            snprintf(nm, sizeof nm, pats[p], b);
            if (!have_src) {
                if (dt_weights_linear(bm->w, nm, -1, -1, -1, src) != 0) return -1;
                have_src = 1;
            }
            dt_linear *l = NULL;
            if (g->per_single) l = strstr(nm, "to_qkv") ? bm->sb[b].qkv_mlp : bm->sb[b].out;   /* NULL when split */
            else if (g->per_double) {
                bm_double *d = &bm->db[b];
                const char *suf = strchr(strchr(nm, '.') + 1, '.') + 1;
                if (!strcmp(suf, "attn.to_out.0")) l = d->w.to_out;
                else if (!strcmp(suf, "attn.to_add_out")) l = d->w.to_add_out;
                else if (!strcmp(suf, "ff.linear_in")) l = d->w.ff_in;
                else if (!strcmp(suf, "ff.linear_out")) l = d->w.ff_out;
                else if (!strcmp(suf, "ff_context.linear_in")) l = d->w.ffc_in;
                else if (!strcmp(suf, "ff_context.linear_out")) l = d->w.ffc_out;
            } else if (!strcmp(nm, "x_embedder")) l = bm->ow.x_emb;
            else if (!strcmp(nm, "context_embedder")) l = bm->ow.ctx_emb;
            else if (!strcmp(nm, "proj_out")) l = bm->ow.proj_out;
            if (l && n < max) out[n++] = l;
        }
    return have_src ? n : -1;
}

/* One attention call (bursts and sustained timing): the model's (fp8 with --attn-precision fp8). */
typedef struct { dt_backend *be; dt_mat o, q, k, v; int heads, hd, fp8; float scale; } attn_op_ctx;
static void attn_op(void *ud, int i) {
    (void)i;
    attn_op_ctx *a = ud;
    if (a->fp8) a->be->attention_fp8(a->be, a->o, a->q, a->k, a->v, a->heads, a->heads, a->hd, a->scale);
    else a->be->attention(a->be, a->o, a->q, a->k, a->v, a->heads, a->heads, a->hd, a->scale, dt_mat_null(), 0);
}

static void time_shape(bench_ctx *x, const gemm_shape *g) {
    bench_report *r = x->r;
    dt_backend *be = x->be;
    if (g->M <= 0 || g->count <= 0) return;
    bench_gemm *row = &r->gemm[r->n_gemm++];
    snprintf(row->name, sizeof row->name, "%s", g->name);
    row->M = g->M;
    row->K = g->K;
    row->N = g->N;
    row->count = g->count;
    row->gflop = 2.0 * g->M * g->K * g->N * 1e-9;
    row->inmodel_ms = g->inmodel_op >= 0 && r->ops[g->inmodel_op].prefix.n ? r->ops[g->inmodel_op].ledger_ms : -1;
    bench_progress("utilization: GEMM %s [%lld x %lld -> %lld] ...", g->name, (long long)g->M, (long long)g->K,
                   (long long)g->N);

    dt_mat xm = dt_alloc_or_die(be, g->M, g->K, be->act_dtype), ym = dt_alloc_or_die(be, g->M, g->N, be->act_dtype);
    bench_fill_randn(be, xm, 100 + r->n_gemm, 1.0f);
    bench_timer tm;
    bench_timer_init(&tm, be);
    dt_linear *bor[64];
    dt_linear_src src;
    int nb = shape_linears(x, g, bor, 64, &src);
    bench_wset iso, ceil_set;
    memset(&iso, 0, sizeof iso);
    float *conv = NULL;
    if (nb >= 0) {
        if (x->bm->to_f32 && !src.bits && src.dtype != DT_F32) {   /* same format as the replica's Linears */
            conv = dt_malloc(sizeof(float) * (size_t)src.out * src.in);
            dt_convert_to_f32(conv, src.data, src.dtype, (size_t)src.out * src.in);
            src.data = conv;
            src.dtype = DT_F32;
        }
        bench_wset_init(&iso, be, bor, nb, &src, x->rot_bytes);
    }
    /* the ceiling in the model's own precision: with --precision fp8 the blocks' Linears are fp8 (e4m3 GEMM + its
     * activation-quantizing pass), the embedders and proj_out stay bf16 */
    row->ceil_fp8 = be->opts.precision == DT_PREC_FP8 && (g->per_single || g->per_double);
    bench_wset_dense(&ceil_set, be, g->N, g->K, x->rot_bytes, 1000 + r->n_gemm,
                     row->ceil_fp8 ? DT_PREC_FP8 : DT_PREC_BF16);
    double *si = dt_malloc(sizeof(double) * x->reps), *sc = dt_malloc(sizeof(double) * x->reps);
    for (int rep = -x->warmup; rep < x->reps; rep++) {   /* interleaved: model weights, then the dense ceiling */
        double a = iso.n ? bench_wset_time(&iso, &tm, ym, xm) : 0;
        double b = bench_wset_time(&ceil_set, &tm, ym, xm);
        if (rep >= 0) { si[rep] = a; sc[rep] = b; }
    }
    if (iso.n) row->iso = bench_stats(si, x->reps);
    row->ceil = bench_stats(sc, x->reps);
    row->ceil_sus = bench_wset_time_sustained(&ceil_set, ym, xm, x->reps, x->is_cpu);
    row->iso_bufs = iso.n;
    row->iso_mb = iso.mb;
    row->ceil_bufs = ceil_set.n;
    row->ceil_mb = ceil_set.mb;
    bench_wset_free(&iso);
    bench_wset_free(&ceil_set);
    free(conv);
    free(si);
    free(sc);
    bench_timer_free(&tm);
    be->free(be, &xm);
    be->free(be, &ym);
}

static void time_attention(bench_ctx *x) {
    bench_report *r = x->r;
    dt_backend *be = x->be;
    const flux2_config *c = &r->c;
    int64_t L = (int64_t)x->n + x->t, D = c->hidden;
    r->attn_gflop = 4.0 * L * L * D * 1e-9;
    bench_progress("utilization: attention [%lld tokens, %d heads x %d] ...", (long long)L, c->heads, c->head_dim);
    dt_mat q = dt_alloc_or_die(be, L, D, be->act_dtype), k = dt_alloc_or_die(be, L, D, be->act_dtype);
    dt_mat v = dt_alloc_or_die(be, L, D, be->act_dtype), o = dt_alloc_or_die(be, L, D, be->act_dtype);
    bench_fill_randn(be, q, 201, 1.0f);
    bench_fill_randn(be, k, 202, 1.0f);
    bench_fill_randn(be, v, 203, 1.0f);
    bench_timer tm;
    bench_timer_init(&tm, be);
    double *s = dt_malloc(sizeof(double) * x->reps);
    float sc = 1.0f / sqrtf((float)c->head_dim);
    attn_op_ctx ac = {be, o, q, k, v, c->heads, c->head_dim, x->bm->c.attn_fp8 && be->attention_fp8, sc};
    r->attn_fp8 = ac.fp8;
    for (int rep = -x->warmup; rep < x->reps; rep++) {
        bench_timer_start(&tm);
        attn_op(&ac, 0);
        double ms = bench_timer_stop(&tm);
        if (rep >= 0) s[rep] = ms;
    }
    r->attn_iso = bench_stats(s, x->reps);
    r->attn_sus = bench_time_sustained(be, x->is_cpu, attn_op, &ac, BENCH_HEAT_MS, 2 * x->reps);
    r->attn_layers = c->num_layers + c->num_single_layers;
    free(s);
    bench_timer_free(&tm);
    be->free(be, &q); be->free(be, &k); be->free(be, &v); be->free(be, &o);
}

static void time_copy(bench_ctx *x) {
    bench_report *r = x->r;
    bench_copy_bandwidth(x->be, x->rot_bytes, x->is_cpu, x->warmup, x->reps, &r->copy, &r->copy_bytes, &r->copy_gbs);
}

int bench_perf(bench_ctx *x) {
    bench_report *r = x->r;
    const flux2_config *c = &r->c;
    int64_t D = c->hidden, F = c->mlp_hidden, N = x->n, T = x->t, L = N + T;
    int nd = c->num_layers, ns = c->num_single_layers;
    gemm_shape shapes[] = {
        {"single: qkv+mlp_in proj", L, D, 3 * D + 2 * F, ns, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", {0}, 0, 1, BM_ST_PROJ},
        {"single: attn+mlp out", L, D + F, D, ns, "single_transformer_blocks.%d.attn.to_out", {0}, 0, 1, BM_ST_OUT},
        {"double img: qkv (stacked)", N, D, 3 * D, nd, "@to_qkv", {0}, 1, 0, -1},
        {"double img: out", N, D, D, nd, "transformer_blocks.%d.attn.to_out.0", {0}, 1, 0, -1},
        {"double img: mlp in", N, D, 2 * F, nd, "transformer_blocks.%d.ff.linear_in", {0}, 1, 0, -1},
        {"double img: mlp out", N, F, D, nd, "transformer_blocks.%d.ff.linear_out", {0}, 1, 0, -1},
        {"double txt: qkv (stacked)", T, D, 3 * D, nd, "@add_qkv", {0}, 1, 0, -1},
        {"double txt: out", T, D, D, nd, "transformer_blocks.%d.attn.to_add_out", {0}, 1, 0, -1},
        {"double txt: mlp in", T, D, 2 * F, nd, "transformer_blocks.%d.ff_context.linear_in", {0}, 1, 0, -1},
        {"double txt: mlp out", T, F, D, nd, "transformer_blocks.%d.ff_context.linear_out", {0}, 1, 0, -1},
        {"x_embedder", N, c->in_channels, D, 1, "x_embedder", {0}, 0, 0, -1},
        {"context_embedder", T, c->joint_dim, D, 1, "context_embedder", {0}, 0, 0, -1},
        {"proj_out", N, D, c->out_channels, 1, "proj_out", {0}, 0, 0, -1},
    };
    r->n_gemm = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) time_shape(x, &shapes[i]);
    time_attention(x);
    time_copy(x);
    return 0;
}
