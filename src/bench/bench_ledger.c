/* bench_ledger.c — where one step's time goes, for any model family (the family's block ops through
 * bench_family).
 *
 * 1. Cumulative prefixes inside one block (FLUX.2: a single-stream block; Krea 2: a transformer block): prefix k
 *    runs the block's ops 0..k over B blocks' weights in a row; op k costs median(prefix k) - median(prefix k-1),
 *    so the ops add up to the whole block. All prefixes are interleaved within each repetition; the residual
 *    stream is restored before each timed region (outside it). Each op is also timed directly (an event before
 *    every op), QK norm and RoPE as two separate passes.
 * 2. Block-count scaling and 3. the shares of the step, summing to 100 % with the unexplained remainder: the
 *    family's (their points and parts differ), with the helpers below.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

void bench_block_prefix(bench_ctx *x, int b, int last) {
    const bench_family *f = x->fam;
    for (int k = 0; k <= last; k++) {
        if (k == f->op_qknorm && last >= f->op_rope) continue;   /* the model's fused norm + RoPE pass, at RoPE */
        if (k == f->op_qknorm || k == f->op_rope) f->op(x, b, f->op_qknorm, k == f->op_qknorm);
        else f->op(x, b, k, 0);
    }
}

static void prefix_ledger(bench_ctx *x) {
    bench_report *r = x->r;
    const bench_family *f = x->fam;
    dt_backend *be = x->be;
    const int nk = f->n_ops, nb = f->blocks(x);
    r->n_ops = nk;
    for (int k = 0; k < nk; k++) {
        r->ops[k].name = f->ops[k].name;
        r->ops[k].cat = f->ops[k].cat;
    }
    f->op_work(x, r->ops);
    if (nb == 0) return;
    /* blocks per timed region: every block on a GPU (distinct weights, good statistics); on the CPU as few as
     * exceed the cache (the CPU is slow) */
    double block_bytes = f->block_bytes(x);
    int B = nb;
    if (x->is_cpu && block_bytes > 0) {
        B = (int)ceil(x->rot_bytes / block_bytes);
        if (B < 1) B = 1;
        if (B > nb) B = nb;
    }
    r->prefix_blocks = B;
    bench_progress("ledger: cumulative prefixes of a %s (%d stages x %d blocks, %d reps) ...", f->block_kind, nk, B,
                   x->reps);
    dt_mat s = f->stream(x);
    dt_mat s0 = dt_alloc_or_die(be, s.rows, s.cols, s.dtype);
    be->copy(be, s0, s);
    /* without the model's prefetch hints: each Linear then carries its own weight preparation (a hint issued after
     * the projection would move the output projection's dequantization into the projection's prefix and direct
     * time); what the hints save in the forward is the prefetch arm's number */
    void (*hint)(dt_backend *, const dt_linear *, dt_mat, int64_t) = be->linear_prefetch;
    be->linear_prefetch = NULL;
    if (hint && f->hints)
        bench_note(r, "ledger: timed without the prefetch hints (each Linear with its own dequantization); the forward "
                   "runs with them: see the prefetch arm");
    double *smp = dt_malloc(sizeof(double) * nk * x->reps);
    double *dir = dt_malloc(sizeof(double) * nk * x->reps);
    bench_timer tm;
    bench_timer_init(&tm, be);
    /* direct timing: an event before every op of the B blocks, read after the region */
    int nev = nk * B + 1, have_ev = tm.e0 != NULL;
    void **ev = dt_calloc((size_t)nev, sizeof *ev);
    double *host_t = dt_calloc((size_t)nev, sizeof *host_t);
    for (int i = 0; have_ev && i < nev; i++) ev[i] = tm.pf->event_create(be);
    for (int rep = -x->warmup; rep < x->reps; rep++) {
        for (int k = 0; k < nk; k++) {
            be->copy(be, s, s0);
            bench_timer_start(&tm);
            for (int b = 0; b < B; b++) bench_block_prefix(x, b, k);
            double ms = bench_timer_stop(&tm) / B;
            if (rep >= 0) smp[k * x->reps + rep] = ms;
        }
        be->copy(be, s, s0);
        bench_sync_or_die(be);
        for (int b = 0; b < B; b++)
            for (int k = 0; k < nk; k++) {
                int e = b * nk + k;
                if (have_ev) tm.pf->event_record(be, ev[e]);
                else { bench_sync_or_die(be); host_t[e] = dt_now(); }
                f->op(x, b, k, 1);
            }
        if (have_ev) tm.pf->event_record(be, ev[nev - 1]);
        else { bench_sync_or_die(be); host_t[nev - 1] = dt_now(); }
        bench_sync_or_die(be);
        for (int k = 0; rep >= 0 && k < nk; k++) {
            double sum = 0;
            for (int b = 0; b < B; b++) {
                int e = b * nk + k;
                sum += have_ev ? tm.pf->event_elapsed_ms(be, ev[e], ev[e + 1]) : (host_t[e + 1] - host_t[e]) * 1e3;
            }
            dir[k * x->reps + rep] = sum / B;
        }
    }
    for (int i = 0; have_ev && i < nev; i++) tm.pf->event_destroy(be, ev[i]);
    free(ev);
    free(host_t);
    double prev = 0;
    for (int k = 0; k < nk; k++) {
        r->ops[k].prefix = bench_stats(smp + k * x->reps, x->reps);
        r->ops[k].direct = bench_stats(dir + k * x->reps, x->reps);
        r->ops[k].ms = r->ops[k].prefix.med - prev;
        prev = r->ops[k].prefix.med;
    }
    free(dir);
    free(smp);
    r->block_ledger_ms = prev;
    /* basis of the shares: the prefix increments; if noise made one negative, split the block's prefix total
     * in proportion to the direct op times instead (never negative, same total) */
    int neg = 0;
    double dsum = 0;
    for (int k = 0; k < nk; k++) {
        if (r->ops[k].ms < 0) neg++;
        dsum += r->ops[k].direct.med;
    }
    for (int k = 0; k < nk; k++)
        r->ops[k].ledger_ms = !neg || dsum <= 0 ? r->ops[k].ms : prev * r->ops[k].direct.med / dsum;
    if (!neg) snprintf(r->shares_basis, sizeof r->shares_basis, "cumulative-prefix increments");
    else {
        snprintf(r->shares_basis, sizeof r->shares_basis,
                 "direct op times scaled to the prefix block total (%d prefix increment%s negative: noise)", neg, neg > 1 ? "s" : "");
        bench_note(r, "ledger: %d prefix increment%s came out negative (timing noise larger than the op, or an op "
                   "overlapping its neighbour); the shares and in-model rates use the direct op times scaled to the "
                   "block's prefix total. More --reps help.", neg, neg > 1 ? "s" : "");
    }
    for (int k = 0; k < nk; k++)
        if (r->ops[k].cat == BENCH_CAT_ATTN) r->attn_inmodel_ms = r->ops[k].ledger_ms;
    be->linear_prefetch = hint;
    be->copy(be, s, s0);
    bench_sync_or_die(be);
    be->free(be, &s0);
    bench_timer_free(&tm);
}

void bench_time_points(bench_ctx *x, int np, void (*prepare)(void *ud, int p), void (*run)(void *ud, int p), void *ud,
                       bench_stat *out) {
    double *smp = dt_malloc(sizeof(double) * (np ? np : 1) * x->reps);
    bench_timer tm;
    bench_timer_init(&tm, x->be);
    for (int rep = -x->warmup; rep < x->reps; rep++)
        for (int p = 0; p < np; p++) {
            if (prepare) prepare(ud, p);
            bench_timer_start(&tm);
            run(ud, p);
            double ms = bench_timer_stop(&tm);
            if (rep >= 0) smp[p * x->reps + rep] = ms;
        }
    for (int p = 0; p < np; p++) out[p] = bench_stats(smp + p * x->reps, x->reps);
    bench_timer_free(&tm);
    free(smp);
}

double bench_slope(const double *xs, const double *ys, int n) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        sx += xs[i]; sy += ys[i]; sxx += xs[i] * xs[i]; sxy += xs[i] * ys[i];
    }
    double den = n * sxx - sx * sx;
    return n >= 2 && den > 0 ? (n * sxy - sx * sy) / den : 0;
}

typedef struct { dt_backend *be; dt_mat live, saved; const int *pts; void (*run)(void *ud, int blocks); void *ud; } scale_pts;
static void scale_restore(void *ud, int p) {
    scale_pts *s = ud;
    (void)p;
    s->be->copy(s->be, s->live, s->saved);
}
static void scale_run(void *ud, int p) {
    scale_pts *s = ud;
    s->run(s->ud, s->pts[p]);
}

void bench_block_scaling(bench_ctx *x, int nl, dt_mat live, dt_mat saved, bench_stat all,
                         void (*run)(void *ud, int blocks), void *ud, bench_block_scale *out) {
    int pts[BENCH_MAX_SCALE], np = 0;
    const int cand[3] = {1, nl / 4, nl / 2};
    for (int i = 0; i < 3; i++) {
        if (cand[i] < 1 || cand[i] >= nl || (np && pts[np - 1] == cand[i])) continue;
        pts[np++] = cand[i];
    }
    bench_progress("ledger: block-count scaling (%d partial stacks x %d reps) ...", np, x->reps);
    scale_pts sp = {x->be, live, saved, pts, run, ud};
    bench_time_points(x, np, scale_restore, scale_run, &sp, out->t);
    out->n = 0;
    for (int i = 0; i < np; i++) out->blocks[out->n++] = pts[i];
    out->blocks[out->n] = nl;
    out->t[out->n++] = all;
    double xs[BENCH_MAX_SCALE], ys[BENCH_MAX_SCALE];
    for (int i = 0; i < out->n; i++) { xs[i] = out->blocks[i]; ys[i] = out->t[i].med; }
    out->slope_ms = out->n >= 2 ? bench_slope(xs, ys, out->n) : all.med / nl;
    x->be->copy(x->be, live, saved);
    bench_sync_or_die(x->be);
}

void bench_md_block_scaling(FILE *f, const bench_block_scale *s, double ledger_ms, const char *what) {
    if (!s->n) return;
    fprintf(f, "## Ledger: block-count scaling (%s)\n\n| blocks | median ms | p10-p90 ms |\n|---:|---:|---:|\n", what);
    for (int i = 0; i < s->n; i++)
        fprintf(f, "| %d | %.3f | %.3f-%.3f |\n", s->blocks[i], s->t[i].med, s->t[i].p10, s->t[i].p90);
    fprintf(f, "\nPer block: %.4f ms in the stack (slope) vs %.4f ms from the prefix ledger.\n\n", s->slope_ms, ledger_ms);
}

void bench_json_block_scaling(FILE *f, const bench_block_scale *s, double ledger_ms) {
    for (int i = 0; i < s->n; i++) {
        fprintf(f, "{"); bench_jstr(f, "type", "scale"); bench_jnum(f, "blocks", s->blocks[i]); bench_jstat(f, "t", s->t[i]);
        fprintf(f, "}\n");
    }
    if (s->n) {
        fprintf(f, "{"); bench_jstr(f, "type", "blocks"); bench_jnum(f, "slope_ms", s->slope_ms);
        bench_jnum(f, "ledger_ms", ledger_ms);
        fprintf(f, "}\n");
    }
}

void bench_add_share(bench_report *r, const char *name, double ms, int level) {
    if (r->n_shares >= (int)(sizeof r->shares / sizeof r->shares[0])) return;
    bench_share *s = &r->shares[r->n_shares++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ms = ms;
    s->level = level;
    s->share = r->total_ms > 0 ? 100.0 * ms / r->total_ms : 0;
}

void bench_ledger_by_cat(const bench_report *r, double cat[3]) {
    cat[0] = cat[1] = cat[2] = 0;
    for (int k = 0; k < r->n_ops; k++) cat[r->ops[k].cat] += r->ops[k].ledger_ms;
}

void bench_shares_rest(bench_report *r, double blocks_ledger_ms, double rest_ms, const char *rest_name,
                       const char *remainder_name) {
    bench_add_share(r, rest_name, rest_ms, 0);
    r->remainder_ms = r->total_ms - blocks_ledger_ms - rest_ms;
    r->remainder_share = r->total_ms > 0 ? 100.0 * r->remainder_ms / r->total_ms : 0;
    bench_add_share(r, remainder_name, r->remainder_ms, 0);
}

int bench_ledger(bench_ctx *x) {
    prefix_ledger(x);
    x->fam->scaling(x);
    x->r->n_shares = 0;
    x->fam->shares(x);
    return 0;
}
