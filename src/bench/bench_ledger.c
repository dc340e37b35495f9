/* bench_ledger.c — where one step's time goes.
 *
 * 1. Cumulative prefixes inside a single-stream block: prefix k runs the block's ops 0..k (norm,
 *    projection GEMM, QK norm, RoPE, attention, SwiGLU, output GEMM, residual) over B blocks' weights
 *    in a row; op k costs median(prefix k) - median(prefix k-1), so the ops add up to the whole block.
 *    All prefixes are interleaved within each repetition; the residual stream is restored before
 *    each timed region (outside it).
 * 2. Block-count scaling of the device-only forward: 0 double + 0 single blocks (embedders and final
 *    layer), all doubles + {0, S/4, S/2, S} singles; the slope is the in-forward cost of a single block.
 * 3. Shares of the full forward: GEMMs, attention, elementwise (from the single-block ledger, times
 *    the number of blocks, doubles counted as single-block equivalents), the double blocks' extra work
 *    over that, embedders + final layer, and the unexplained remainder, summing to 100 %.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

static const struct { const char *name; int cat; } op_names[BENCH_N_OPS] = {
    {"adaLN norm (layernorm_mod)", BENCH_CAT_ELEM},
    {"proj GEMM (qkv+mlp_in)", BENCH_CAT_GEMM},
    {"QK norm", BENCH_CAT_ELEM},
    {"RoPE", BENCH_CAT_ELEM},
    {"attention", BENCH_CAT_ATTN},
    {"MLP activation (SwiGLU)", BENCH_CAT_ELEM},
    {"out GEMM (attn+mlp out)", BENCH_CAT_GEMM},
    {"gated residual", BENCH_CAT_ELEM},
};

static void prefix_ledger(bench_ctx *x) {
    bench_report *r = x->r;
    bm_model *bm = x->bm;
    dt_backend *be = x->be;
    const flux2_config *c = &r->c;
    int ns = c->num_single_layers;
    r->n_ops = BENCH_N_OPS;
    for (int k = 0; k < BENCH_N_OPS; k++) {
        r->ops[k].name = op_names[k].name;
        r->ops[k].cat = op_names[k].cat;
    }
    bm_flops fl;
    bm_count_flops(c, x->n, x->t, &fl);
    r->ops[BM_ST_PROJ].gflop = fl.single_proj;
    r->ops[BM_ST_OUT].gflop = fl.single_out;
    r->ops[BM_ST_ATTN].gflop = fl.single_attn;
    /* least traffic of the elementwise ops (each input read once, each output written once) */
    double es = (double)dt_dtype_size(x->be->act_dtype), Lr = (double)x->n + x->t;
    r->ops[BM_ST_NORM].gbytes = 2 * Lr * c->hidden * es * 1e-9;              /* s -> a */
    r->ops[BM_ST_QKNORM].gbytes = 4 * Lr * c->hidden * es * 1e-9;            /* Q and K in place */
    r->ops[BM_ST_ACT].gbytes = 3 * Lr * c->mlp_hidden * es * 1e-9;           /* gate, up -> out */
    r->ops[BM_ST_RESID].gbytes = 3 * Lr * c->hidden * es * 1e-9;             /* s, y -> s */
    if (ns == 0) {
        bench_note(r, "no single blocks: the per-op ledger is empty; double blocks are reported as a whole");
        return;
    }
    /* blocks per timed region: every single block on a GPU (distinct weights, good statistics); on the
     * CPU as few as exceed the cache (the CPU is slow) */
    dt_linear_src s1, s2;
    double block_bytes = 0;
    if (dt_weights_linear(bm->w, "single_transformer_blocks.0.attn.to_qkv_mlp_proj", -1, -1, -1, &s1) == 0 &&
        dt_weights_linear(bm->w, "single_transformer_blocks.0.attn.to_out", -1, -1, -1, &s2) == 0)
        block_bytes = (double)(bench_src_bytes(&s1) + bench_src_bytes(&s2));
    int B = ns;
    if (x->is_cpu && block_bytes > 0) {
        B = (int)ceil(x->rot_bytes / block_bytes);
        if (B < 1) B = 1;
        if (B > ns) B = ns;
    }
    r->prefix_blocks = B;
    bench_progress("ledger: cumulative prefixes of a single block (%d stages x %d blocks, %d reps) ...", BENCH_N_OPS, B,
                   x->reps);
    int64_t L = (int64_t)x->n + x->t;
    dt_mat s0 = dt_alloc_or_die(be, L, c->hidden, be->act_dtype);
    be->copy(be, s0, bm->x.s);
    /* without the model's prefetch hints: each Linear then carries its own weight preparation (a hint issued after
     * the projection would move the output projection's dequantization into the projection's prefix and direct
     * time); what the hints save in the forward is the prefetch arm's number */
    void (*hint)(dt_backend *, const dt_linear *, dt_mat, int64_t) = be->linear_prefetch;
    be->linear_prefetch = NULL;
    if (hint)
        bench_note(r, "ledger: timed without the prefetch hints (each Linear with its own dequantization); the forward "
                   "runs with them: see the prefetch arm");
    if (bm->c.fuse_inputs)
        bench_note(r, "ledger: with --precision fp8 the adaLN norm runs inside the projection op (norm_linear) and the "
                   "SwiGLU inside the output op (act_linear_gated), so their own rows read ~0 and the GEMM rows carry "
                   "them (DITRUN_FP8_FUSE=0 separates them)");
    double *smp = dt_malloc(sizeof(double) * BENCH_N_OPS * x->reps);
    double *dir = dt_malloc(sizeof(double) * BENCH_N_OPS * x->reps);
    bench_timer tm;
    bench_timer_init(&tm, be);
    /* direct timing: an event before every op of the B blocks, read after the region */
    int nev = BENCH_N_OPS * B + 1, have_ev = tm.e0 != NULL;
    void **ev = dt_calloc((size_t)nev, sizeof *ev);
    double *host_t = dt_calloc((size_t)nev, sizeof *host_t);
    for (int i = 0; have_ev && i < nev; i++) ev[i] = be->event_create(be);
    for (int rep = -x->warmup; rep < x->reps; rep++) {
        for (int k = 0; k < BENCH_N_OPS; k++) {
            be->copy(be, bm->x.s, s0);
            bench_timer_start(&tm);
            for (int b = 0; b < B; b++) bm_single_stages(bm, b, k);
            double ms = bench_timer_stop(&tm) / B;
            if (rep >= 0) smp[k * x->reps + rep] = ms;
        }
        be->copy(be, bm->x.s, s0);
        bench_sync_or_die(be);
        for (int b = 0; b < B; b++)
            for (int k = 0; k < BENCH_N_OPS; k++) {
                int e = b * BENCH_N_OPS + k;
                if (have_ev) be->event_record(be, ev[e]);
                else { bench_sync_or_die(be); host_t[e] = dt_now(); }
                bm_single_op(bm, b, k, 1);
            }
        if (have_ev) be->event_record(be, ev[nev - 1]);
        else { bench_sync_or_die(be); host_t[nev - 1] = dt_now(); }
        bench_sync_or_die(be);
        for (int k = 0; rep >= 0 && k < BENCH_N_OPS; k++) {
            double sum = 0;
            for (int b = 0; b < B; b++) {
                int e = b * BENCH_N_OPS + k;
                sum += have_ev ? be->event_elapsed_ms(be, ev[e], ev[e + 1]) : (host_t[e + 1] - host_t[e]) * 1e3;
            }
            dir[k * x->reps + rep] = sum / B;
        }
    }
    for (int i = 0; have_ev && i < nev; i++) if (be->event_destroy) be->event_destroy(be, ev[i]);
    free(ev);
    free(host_t);
    double prev = 0;
    for (int k = 0; k < BENCH_N_OPS; k++) {
        r->ops[k].prefix = bench_stats(smp + k * x->reps, x->reps);
        r->ops[k].direct = bench_stats(dir + k * x->reps, x->reps);
        r->ops[k].ms = r->ops[k].prefix.med - prev;
        prev = r->ops[k].prefix.med;
    }
    free(dir);
    r->single_ledger_ms = prev;
    /* basis of the shares: the prefix increments; if noise made one negative, split the block's prefix total
     * in proportion to the direct op times instead (never negative, same total) */
    int neg = 0;
    double dsum = 0;
    for (int k = 0; k < BENCH_N_OPS; k++) {
        if (r->ops[k].ms < 0) neg++;
        dsum += r->ops[k].direct.med;
    }
    for (int k = 0; k < BENCH_N_OPS; k++)
        r->ops[k].ledger_ms = !neg || dsum <= 0 ? r->ops[k].ms : prev * r->ops[k].direct.med / dsum;
    if (!neg) snprintf(r->shares_basis, sizeof r->shares_basis, "cumulative-prefix increments");
    else {
        snprintf(r->shares_basis, sizeof r->shares_basis,
                 "direct op times scaled to the prefix block total (%d prefix increment%s negative: noise)", neg, neg > 1 ? "s" : "");
        bench_note(r, "ledger: %d prefix increment%s came out negative (timing noise larger than the op); the shares and "
                   "in-model rates use the direct op times scaled to the block's prefix total. More --reps help.",
                   neg, neg > 1 ? "s" : "");
    }
    r->attn_inmodel_ms = r->ops[BM_ST_ATTN].ledger_ms;
    be->linear_prefetch = hint;
    be->copy(be, bm->x.s, s0);
    bench_sync_or_die(be);
    be->free(be, &s0);
    bench_timer_free(&tm);
    free(smp);
}

static void block_scaling(bench_ctx *x) {
    bench_report *r = x->r;
    const flux2_config *c = &r->c;
    int nd = c->num_layers, ns = c->num_single_layers;
    /* points: (0,0), then (nd, s) for s in {0, S/4, S/2} (S itself is the whole forward, measured already) */
    int pts_nd[8], pts_ns[8], np = 0;
    pts_nd[np] = 0; pts_ns[np++] = 0;
    if (nd > 0) { pts_nd[np] = nd; pts_ns[np++] = 0; }
    int fr[2] = {x->is_cpu ? 0 : ns / 4, ns / 2};
    for (int i = 0; i < 2; i++) {
        int s = fr[i];
        if (s <= 0 || s >= ns) continue;
        if (np && pts_nd[np - 1] == nd && pts_ns[np - 1] == s) continue;
        pts_nd[np] = nd; pts_ns[np++] = s;
    }
    bench_progress("ledger: block-count scaling (%d partial forwards x %d reps) ...", np, x->reps);
    double *smp = dt_malloc(sizeof(double) * np * x->reps);
    bench_timer tm;
    bench_timer_init(&tm, x->be);
    for (int rep = -x->warmup; rep < x->reps; rep++)
        for (int p = 0; p < np; p++) {
            bench_timer_start(&tm);
            bm_forward(x->bm, pts_nd[p], pts_ns[p]);
            double ms = bench_timer_stop(&tm);
            if (rep >= 0) smp[p * x->reps + rep] = ms;
        }
    r->n_scale = 0;
    for (int p = 0; p < np; p++) {
        bench_scale *sc = &r->scale[r->n_scale++];
        sc->nd = pts_nd[p];
        sc->ns = pts_ns[p];
        sc->t = bench_stats(smp + p * x->reps, x->reps);
    }
    if (!(np && pts_nd[np - 1] == nd && pts_ns[np - 1] == ns)) {
        bench_scale *sc = &r->scale[r->n_scale++];
        sc->nd = nd;
        sc->ns = ns;
        sc->t = r->fwd_dev;
    }
    bench_timer_free(&tm);
    free(smp);
    /* embedders + final layer; double blocks; least-squares slope over the points with all doubles */
    r->embed_ms = r->scale[0].t.med;
    double t_nd0 = r->embed_ms;
    for (int i = 0; i < r->n_scale; i++)
        if (r->scale[i].nd == nd && r->scale[i].ns == 0) t_nd0 = r->scale[i].t.med;
    r->double_ms = nd > 0 ? (t_nd0 - r->embed_ms) / nd : 0;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (int i = 0; i < r->n_scale; i++) {
        if (r->scale[i].nd != nd) continue;
        double xs = r->scale[i].ns, ys = r->scale[i].t.med;
        sx += xs; sy += ys; sxx += xs * xs; sxy += xs * ys; m++;
    }
    double den = m * sxx - sx * sx;
    r->single_slope_ms = m >= 2 && den > 0 ? (m * sxy - sx * sy) / den : 0;
}

static void add_share(bench_report *r, const char *name, double ms, int level) {
    bench_share *s = &r->shares[r->n_shares++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ms = ms;
    s->level = level;
    s->share = r->total_ms > 0 ? 100.0 * ms / r->total_ms : 0;
}

static void shares(bench_ctx *x) {
    bench_report *r = x->r;
    const flux2_config *c = &r->c;
    int nd = c->num_layers, ns = c->num_single_layers;
    r->total_ms = r->fwd_dev.med;
    r->n_shares = 0;
    double nb = ns > 0 ? ns + nd : 0;   /* blocks counted at the single-block ledger's cost */
    double cat[3] = {0, 0, 0};
    for (int k = 0; k < r->n_ops; k++) cat[r->ops[k].cat] += r->ops[k].ledger_ms;
    double gemm = nb * cat[BENCH_CAT_GEMM], attn = nb * cat[BENCH_CAT_ATTN], elem = nb * cat[BENCH_CAT_ELEM];
    double dbl_extra = nd > 0 ? nd * r->double_ms - (ns > 0 ? nd * r->single_ledger_ms : 0) : 0;
    add_share(r, "fused projection + output GEMMs", gemm, 0);
    add_share(r, "attention", attn, 0);
    add_share(r, "elementwise (norms, RoPE, activation, residual; splits/copies are views)", elem, 0);
    if (ns > 0) {
        add_share(r, "norms: adaLN + QK norm", nb * (r->ops[BM_ST_NORM].ledger_ms + r->ops[BM_ST_QKNORM].ledger_ms), 1);
        add_share(r, "RoPE", nb * r->ops[BM_ST_ROPE].ledger_ms, 1);
        add_share(r, "activation (SwiGLU)", nb * r->ops[BM_ST_ACT].ledger_ms, 1);
        add_share(r, "gated residual", nb * r->ops[BM_ST_RESID].ledger_ms, 1);
    }
    add_share(r, "double blocks' extra (text stream, separate GEMMs) over single-block cost", dbl_extra, 0);
    add_share(r, "embedders, timestep/modulation, final layer", r->embed_ms, 0);
    double sum = gemm + attn + elem + dbl_extra + r->embed_ms;
    r->remainder_ms = r->total_ms - sum;
    r->remainder_share = r->total_ms > 0 ? 100.0 * r->remainder_ms / r->total_ms : 0;
    add_share(r, "unexplained remainder", r->remainder_ms, 0);
}

int bench_ledger(bench_ctx *x) {
    prefix_ledger(x);
    block_scaling(x);
    shares(x);
    return 0;
}
