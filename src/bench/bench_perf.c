/* bench_perf.c — utilization: achieved TFLOPS of every GEMM shape of the forward and of attention, next to
 * ceilings measured in the same run, for any model family (its shapes through bench_family).
 *
 * For each GEMM shape: in-model time (from the ledger, where the op is timed inside the block sequence; an op of
 * several GEMM shapes is split over them in proportion to their isolated times), isolated time with the model's
 * own weights (the blocks' distinct Linears, plus host copies until one pass exceeds twice the cache), and the
 * ceiling: the backend's dense bf16 GEMM (cuBLASLt on CUDA; the fp8 Linear where the model runs fp8 Linears) at
 * the same shape on random weights rotated the same way. Attention: in-model and isolated on random Q/K/V with the
 * model's heads and key mask. Device copy bandwidth from one large copy (bytes read + written).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

static void time_shape(bench_ctx *x, const bench_gemm_shape *g) {
    bench_report *r = x->r;
    dt_backend *be = x->be;
    bench_gemm *row = &r->gemm[r->n_gemm++];
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "%s", g->name);
    row->M = g->M;
    row->K = g->K;
    row->N = g->N;
    row->count = g->count;
    row->gflop = 2.0 * g->M * g->K * g->N * 1e-9;
    row->inmodel_ms = -1;
    bench_progress("utilization: GEMM %s [%lld x %lld -> %lld] ...", g->name, (long long)g->M, (long long)g->K,
                   (long long)g->N);

    dt_mat xm = dt_alloc_or_die(be, g->M, g->K, be->act_dtype), ym = dt_alloc_or_die(be, g->M, g->N, be->act_dtype);
    bench_fill_randn(be, xm, 100 + r->n_gemm, 1.0f);
    bench_timer tm;
    bench_timer_init(&tm, be);
    bench_wset iso, ceil_set;
    memset(&iso, 0, sizeof iso);
    dt_linear *bor[64];
    memcpy(bor, g->w, sizeof(dt_linear *) * g->nw);
    if (g->have_src) bench_wset_init(&iso, be, bor, g->nw, &g->src, x->rot_bytes);
    row->ceil_fp8 = g->fp8;
    bench_wset_dense(&ceil_set, be, g->N, g->K, x->rot_bytes, 1000 + r->n_gemm, g->fp8 ? DT_PREC_FP8 : DT_PREC_BF16);
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
    free(si);
    free(sc);
    bench_timer_free(&tm);
    be->free(be, &xm);
    be->free(be, &ym);
}

/* In-model time per GEMM: the ledger time of the op that runs the shape, split over the op's shapes in proportion to
 * per_block x isolated time (one shape: all of it), divided by the shape's GEMMs per block. */
static void inmodel_times(bench_report *r, const bench_gemm_shape *s, int n) {
    for (int i = 0; i < n; i++) {
        int op = s[i].inmodel_op;
        if (op < 0 || !r->ops[op].prefix.n) continue;
        double mine = s[i].per_block * r->gemm[i].iso.med, all = 0;
        int shapes = 0;
        for (int j = 0; j < n; j++)
            if (s[j].inmodel_op == op) { all += s[j].per_block * r->gemm[j].iso.med; shapes++; }
        double frac = shapes == 1 ? 1.0 : all > 0 ? mine / all : 1.0 / shapes;
        r->gemm[i].inmodel_ms = r->ops[op].ledger_ms * frac / s[i].per_block;
    }
}

/* One attention call (bursts and sustained timing): the model's (fp8 when the model attends in fp8). */
typedef struct { dt_backend *be; dt_mat o, q, k, v, bias; bench_attn_shape a; float scale; } attn_op_ctx;
static void attn_op(void *ud, int i) {
    (void)i;
    attn_op_ctx *c = ud;
    if (c->a.fp8) c->be->attention_fp8(c->be, c->o, c->q, c->k, c->v, c->a.hq, c->a.hkv, c->a.hd, c->scale);
    else c->be->attention(c->be, c->o, c->q, c->k, c->v, c->a.hq, c->a.hkv, c->a.hd, c->scale, c->a.bias, 0);
}

static void time_attention(bench_ctx *x) {
    bench_report *r = x->r;
    dt_backend *be = x->be;
    attn_op_ctx ac;
    memset(&ac, 0, sizeof ac);
    x->fam->attention(x, &ac.a);
    int64_t L = (int64_t)x->n + x->t, D = (int64_t)ac.a.hq * ac.a.hd;
    r->attn_gflop = 4.0 * L * L * D * 1e-9;
    r->attn_fp8 = ac.a.fp8;
    r->attn_calls = ac.a.calls;
    bench_progress("utilization: attention [%lld tokens, %d/%d heads x %d%s] ...", (long long)L, ac.a.hq, ac.a.hkv,
                   ac.a.hd, ac.a.bias.data ? ", key mask" : "");
    ac.be = be;
    bench_attn_inputs(be, L, ac.a.hq, ac.a.hkv, ac.a.hd, 201, &ac.q, &ac.k, &ac.v, &ac.o);
    ac.scale = 1.0f / sqrtf((float)ac.a.hd);
    bench_timer tm;
    bench_timer_init(&tm, be);
    double *s = dt_malloc(sizeof(double) * x->reps);
    for (int rep = -x->warmup; rep < x->reps; rep++) {
        bench_timer_start(&tm);
        attn_op(&ac, 0);
        double ms = bench_timer_stop(&tm);
        if (rep >= 0) s[rep] = ms;
    }
    r->attn_iso = bench_stats(s, x->reps);
    r->attn_sus = bench_time_sustained(be, x->is_cpu, attn_op, &ac, BENCH_HEAT_MS, 2 * x->reps);
    free(s);
    bench_timer_free(&tm);
    be->free(be, &ac.q); be->free(be, &ac.k); be->free(be, &ac.v); be->free(be, &ac.o);
}

int bench_perf(bench_ctx *x) {
    bench_report *r = x->r;
    bench_gemm_shape *shapes = dt_calloc(16, sizeof *shapes);
    int n = x->fam->gemm_shapes(x, shapes, 16);
    r->n_gemm = 0;
    for (int i = 0; i < n; i++) time_shape(x, &shapes[i]);
    inmodel_times(r, shapes, n);
    free(shapes);
    time_attention(x);
    bench_copy_bandwidth(x->be, x->rot_bytes, x->is_cpu, x->warmup, x->reps, &r->copy, &r->copy_bytes, &r->copy_gbs);
    return 0;
}
