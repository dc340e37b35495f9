/* bench_report.c — the bench report as markdown tables (stdout) and as JSON lines (--json FILE): one object per
 * line with a "type" key (setup, forward, power, ledger_op, scale, blocks, share, gemm, attention, forward_util,
 * copy, arm, note), every number of the report in it. The sections every family has are printed here; the
 * family's own ones (setup, whole forward, block-count scaling) by its bench_family functions. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench_internal.h"
#include "core/outfile.h"

double bench_tflops(double gflop, double ms) { return ms > 0 ? gflop / ms : 0; }

void bench_md_stat_row(FILE *f, const char *what, bench_stat s, double gflop) {
    fprintf(f, "| %s | %.3f | %.3f-%.3f | %.3f-%.3f | %.3f |\n", what, s.med, s.p10, s.p90, s.min, s.max,
            bench_tflops(gflop, s.med));
}

static const char *cat_name(int c) { return c == BENCH_CAT_GEMM ? "gemm" : c == BENCH_CAT_ATTN ? "attention" : "elementwise"; }

/* ------------------------------------------------------------------ markdown */

static void peak_pct(double peak, double tf, char *buf, size_t n) {
    if (peak > 0) snprintf(buf, n, "%.1f%%", 100.0 * tf / peak);
    else snprintf(buf, n, "-");
}

static void md_op_ledger(FILE *f, const bench_op *ops, int n, double block_ms, double copy_gbs, const char *total_label) {
    fprintf(f, "| # | op | kind | prefix median ms | prefix p10-p90 | op ms | %% of block | direct ms (p10-p90) | GFLOP | "
               "TFLOPS | GB moved | GB/s | %% of copy BW |\n|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double dsum = 0;
    for (int k = 0; k < n; k++) {
        const bench_op *o = &ops[k];
        char tf[32] = "", gb[32] = "", gbs[32] = "", pc[32] = "";
        if (o->gflop > 0) snprintf(tf, sizeof tf, "%.3f", bench_tflops(o->gflop, o->ledger_ms));
        if (o->gbytes > 0) {
            double bw = o->ledger_ms > 0 ? o->gbytes / (o->ledger_ms * 1e-3) : 0;
            snprintf(gb, sizeof gb, "%.4f", o->gbytes);
            snprintf(gbs, sizeof gbs, "%.1f", bw);
            if (copy_gbs > 0) snprintf(pc, sizeof pc, "%.0f%%", 100.0 * bw / copy_gbs);
        }
        fprintf(f, "| %d | %s | %s | %.4f | %.4f-%.4f | %.4f | %.1f%% | %.4f (%.4f-%.4f) | %.2f | %s | %s | %s | %s |\n", k,
                o->name, cat_name(o->cat), o->prefix.med, o->prefix.p10, o->prefix.p90, o->ms,
                block_ms > 0 ? 100.0 * o->ms / block_ms : 0, o->direct.med, o->direct.p10, o->direct.p90, o->gflop, tf, gb,
                gbs, pc);
        dsum += o->direct.med;
    }
    fprintf(f, "| | **%s** | | | | **%.4f** | 100%% | **%.4f** | | | | | |\n\n", total_label, block_ms, dsum);
}

static void md_gemms(FILE *f, const bench_gemm *gemm, int n, double l2_mb, double peak) {
    char pk[32];
    fprintf(f, "| GEMM | M | K | N | per fwd | GFLOP | in-model ms | in-model TFLOPS | isolated ms | isolated TFLOPS | "
               "ceiling ms (dense bf16 GEMM; [fp8]: fp8 Linear) | ceiling TFLOPS | sustained ceiling ms (TFLOPS) | isolated speed / ceiling | isolated %% of peak | "
               "rotation (isolated / ceiling) |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < n; i++) {
        const bench_gemm *g = &gemm[i];
        char im[32] = "-", it[32] = "-", is[32] = "-", itf[32] = "-", ratio[32] = "-";
        if (g->inmodel_ms >= 0) {
            snprintf(im, sizeof im, "%.4f", g->inmodel_ms);
            snprintf(it, sizeof it, "%.3f", bench_tflops(g->gflop, g->inmodel_ms));
        }
        if (g->iso.n) {
            snprintf(is, sizeof is, "%.4f", g->iso.med);
            snprintf(itf, sizeof itf, "%.3f", bench_tflops(g->gflop, g->iso.med));
            snprintf(ratio, sizeof ratio, "%.0f%%", g->iso.med > 0 ? 100.0 * g->ceil.med / g->iso.med : 0);
        }
        char sus[48] = "-";
        if (g->ceil_sus.n) snprintf(sus, sizeof sus, "%.4f (%.1f)", g->ceil_sus.med, bench_tflops(g->gflop, g->ceil_sus.med));
        peak_pct(peak, g->iso.n ? bench_tflops(g->gflop, g->iso.med) : 0, pk, sizeof pk);
        fprintf(f, "| %s%s | %lld | %lld | %lld | %d | %.2f | %s | %s | %s | %s | %.4f | %.3f | %s | %s | %s | %d x = %.0f MB / %d x = %.0f MB%s |\n",
                g->name, g->ceil_fp8 ? " [fp8]" : "", (long long)g->M, (long long)g->K, (long long)g->N, g->count, g->gflop, im, it, is, itf, g->ceil.med,
                bench_tflops(g->gflop, g->ceil.med), sus, ratio, pk, g->iso_bufs, g->iso_mb, g->ceil_bufs, g->ceil_mb,
                g->iso_mb < 2 * l2_mb ? " (cache-resident)" : "");
    }
}

void bench_md_setup_end(const bench_report *r, FILE *f, const char *loader) {
    fprintf(f, "| repetitions | %d timed (median, p10-p90), %d warm-up excluded |\n", r->reps, r->warmup);
    fprintf(f, "| cache the rotations exceed | %.1f MB (x2) |\n", r->l2_mb);
    if (r->synth_s > 0) fprintf(f, "| synthetic checkpoint written | %.1f s |\n", r->synth_s);
    fprintf(f, "| load (%s) | %.1f s |\n| backend memory peak | %.2f GB |\n\n", loader, r->load_s, r->mem_peak_gb);
}

void bench_md_power(FILE *f, const bench_power *p, const char *what) {
    if (!p->n) return;
    fprintf(f, "GPU right after each %s: SM clock median %.0f MHz (%.0f-%.0f; maximum %d), power median %.0f W of the "
               "%.0f W limit, power-capped in %d of %d samples.\n\n",
            what, p->sm_mhz_med, p->sm_mhz_min, p->sm_mhz_max, p->sm_max_mhz, p->power_w_med, p->limit_w, p->capped, p->n);
}

static void json_gemms(FILE *f, const bench_gemm *gemm, int n) {
    for (int i = 0; i < n; i++) {
        const bench_gemm *g = &gemm[i];
        fprintf(f, "{"); bench_jstr(f, "type", "gemm"); fputc(',', f); bench_jstr(f, "name", g->name); bench_jnum(f, "M", g->M);
        bench_jnum(f, "K", g->K); bench_jnum(f, "N", g->N); bench_jnum(f, "per_forward", g->count); bench_jnum(f, "gflop", g->gflop);
        if (g->inmodel_ms >= 0) { bench_jnum(f, "inmodel_ms", g->inmodel_ms); bench_jnum(f, "inmodel_tflops", bench_tflops(g->gflop, g->inmodel_ms)); }
        if (g->iso.n) { bench_jstat(f, "isolated", g->iso); bench_jnum(f, "isolated_tflops", bench_tflops(g->gflop, g->iso.med)); }
        bench_jstat(f, "ceiling", g->ceil); bench_jnum(f, "ceiling_tflops", bench_tflops(g->gflop, g->ceil.med));
        bench_jnum(f, "ceiling_fp8", g->ceil_fp8);
        bench_jnum(f, "isolated_bufs", g->iso_bufs); bench_jnum(f, "isolated_mb", g->iso_mb); bench_jnum(f, "ceiling_bufs", g->ceil_bufs);
        bench_jnum(f, "ceiling_mb", g->ceil_mb);
        if (g->ceil_sus.n) { bench_jstat(f, "ceiling_sustained", g->ceil_sus); bench_jnum(f, "ceiling_sustained_tflops", bench_tflops(g->gflop, g->ceil_sus.med)); }
        fprintf(f, "}\n");
    }
}

void bench_json_power(FILE *f, const bench_power *p) {
    if (!p->n) return;
    fprintf(f, "{"); bench_jstr(f, "type", "power"); bench_jnum(f, "samples", p->n);
    bench_jnum(f, "sm_mhz_median", p->sm_mhz_med); bench_jnum(f, "sm_mhz_min", p->sm_mhz_min);
    bench_jnum(f, "sm_mhz_max", p->sm_mhz_max); bench_jnum(f, "sm_mhz_limit", p->sm_max_mhz);
    bench_jnum(f, "power_w_median", p->power_w_med); bench_jnum(f, "power_limit_w", p->limit_w);
    bench_jnum(f, "power_capped_samples", p->capped);
    fprintf(f, "}\n");
}

static void md_floor(FILE *f, const bench_gemm *gemm, int n, bench_stat attn_iso, bench_stat attn_sus, int attn_calls,
                    int attn_fp8, double ms, const char *what) {
    double g_b = 0, g_s = 0, g_best = 0;
    int have_s = attn_sus.n > 0, n8 = 0;
    for (int i = 0; i < n; i++) {
        n8 += gemm[i].ceil_fp8;
        g_b += gemm[i].count * gemm[i].ceil.med;
        if (gemm[i].ceil_sus.n) {
            g_s += gemm[i].count * gemm[i].ceil_sus.med;
            g_best += gemm[i].count * fmin(gemm[i].ceil.med, gemm[i].ceil_sus.med);
        } else {
            have_s = 0;
        }
    }
    if (!n || !attn_iso.n || attn_calls <= 0 || ms <= 0) return;
    double a_b = attn_calls * attn_iso.med, fb = g_b + a_b;
    fprintf(f, "**Floor from this run's ceilings** (each GEMM shape x its count at %s, plus %d %sattention calls at "
               "the isolated rate): bursts %.2f ms (GEMMs %.2f + attention %.2f)",
            n8 ? "its ceiling: the fp8 Linear (e4m3 GEMM incl. its activation pass) for the [fp8] shapes, the dense "
                 "bf16 GEMM for the others" : "the dense bf16 ceiling",
            attn_calls, attn_fp8 ? "fp8 " : "", fb, g_b, a_b);
    if (have_s) {
        double a_s = attn_calls * attn_sus.med, fs = g_s + a_s;
        /* a ceiling is the fastest the library went: per shape the better of the two timings (a burst timing taken
         * while the GPU sat at its power cap can come out slower than the sustained one) */
        double a_best = attn_calls * fmin(attn_iso.med, attn_sus.med), fbest = g_best + a_best;
        fprintf(f, "; sustained %.2f ms (GEMMs %.2f + attention %.2f); the better of the two per shape %.2f ms (GEMMs "
                   "%.2f + attention %.2f). %s: %.3f ms, %+.1f%% over the burst floor, %+.1f%% over the sustained one, "
                   "**%+.1f%% over the best-per-shape one**",
                fs, g_s, a_s, fbest, g_best, a_best, what, ms, 100.0 * (ms / fb - 1), 100.0 * (ms / fs - 1),
                100.0 * (ms / fbest - 1));
    } else {
        fprintf(f, ". %s: %.3f ms, %+.1f%% over it", what, ms, 100.0 * (ms / fb - 1));
    }
    fprintf(f, "; elementwise passes, the transient dequantization and launch gaps are outside the floor.\n\n");
}

static void md_arms_notes(FILE *f, const bench_arm *arms, int n_arms, const char (*notes)[240], int n_notes) {
    if (n_arms) {
        fprintf(f, "## A/B arms (interleaved in one process, the order rotating every repetition: A B, B A, ...)\n\n| arm | workload | A | B | A median ms (p10-p90) | "
                   "B median ms (p10-p90) | B/A | max abs(A-B) | max abs(A) | agree | note |\n|---|---|---|---|---:|---:|---:|---:|---:|---|---|\n");
        for (int i = 0; i < n_arms; i++) {
            const bench_arm *a = &arms[i];
            if (a->skipped) {
                fprintf(f, "| %s | - | %s | %s | - | - | - | - | - | skipped | %s |\n", a->arm, a->a, a->b, a->note);
                continue;
            }
            /* tol = inf: the variants compute different things (timing only) */
            const char *agree = isinf(a->tol) ? "n/a" : a->maxdiff <= a->tol * (a->ref_absmax > 0 ? a->ref_absmax : 1) ? "yes" : "NO";
            fprintf(f, "| %s | %s | %s | %s | %.4f (%.4f-%.4f) | %.4f (%.4f-%.4f) | %.3f | %.3g | %.3g | %s | %s |\n", a->arm,
                    a->what, a->a, a->b, a->sa.med, a->sa.p10, a->sa.p90, a->sb.med, a->sb.p10, a->sb.p90, a->ratio,
                    a->maxdiff, a->ref_absmax, agree, a->note);
        }
        fprintf(f, "\n");
    }
    if (n_notes) {
        fprintf(f, "## Notes\n\n");
        for (int i = 0; i < n_notes; i++) fprintf(f, "- %s\n", notes[i]);
        fprintf(f, "\n");
    }
}

void bench_report_markdown(const bench_report *r, FILE *f) {
    const bench_family *fam = r->family;
    char pk[32];
    fam->md_head(r, f);
    if (r->n_ops && r->ops[0].prefix.n) {
        fprintf(f, "## Ledger: one %s, cumulative prefixes (the model's block ops, %d blocks' weights per timed region)\n\n",
                fam->block_kind, r->prefix_blocks);
        md_op_ledger(f, r->ops, r->n_ops, r->block_ledger_ms, r->copy_gbs, fam->block_kind);
        fprintf(f, "Op ms = median(prefix k) - median(prefix k-1) (the shares use these unless noise made one "
                   "negative: see the shares' basis); RoPE = the extra cost of rotating inside the fused QK-norm op. Direct = the op alone between "
                   "two events, QK norm and RoPE as two separate passes. GB moved = least traffic (each input read, each "
                   "output written once); TFLOPS and GB/s from the shares' per-op basis.%s%s\n\n",
                fam->ledger_note ? " " : "", fam->ledger_note ? fam->ledger_note : "");
    }
    fam->md_scaling(r, f);
    if (r->n_shares) {
        fprintf(f, "## Ledger: shares of one step (%s, %.3f ms)\n\nPer-op basis: %s; %s\n\n| part | ms | share |\n|---|---:|---:|\n",
                r->shares_of, r->total_ms, r->shares_basis, r->shares_how);
        double sum = 0;
        for (int i = 0; i < r->n_shares; i++) {
            const bench_share *s = &r->shares[i];
            if (s->level == 0) sum += s->share;
            fprintf(f, "| %s%s | %.3f | %.1f%% |\n", s->level ? "&nbsp;&nbsp;- " : "", s->name, s->ms, s->share);
        }
        fprintf(f, "| **total** | **%.3f** | **%.1f%%** |\n\n", r->total_ms, sum);
    }
    if (r->n_gemm || r->attn_iso.n || r->copy.n) {
        fprintf(f, "## Utilization (nominal peak: %s)\n\n", r->peak_src);
        if (r->peak_tflops > 0) fprintf(f, "Nominal peak %.0f TFLOPS (%s).\n\n", r->peak_tflops, r->peak_src);
        md_gemms(f, r->gemm, r->n_gemm, r->l2_mb, r->peak_tflops);
        fprintf(f, "\n| other | in-model ms | in-model TFLOPS | isolated ms | isolated TFLOPS | %% of peak |\n|---|---:|---:|---:|---:|---:|\n");
        if (r->attn_iso.n) {
            peak_pct(r->peak_tflops, bench_tflops(r->attn_gflop, r->attn_iso.med), pk, sizeof pk);
            fprintf(f, "| %s (%.2f GFLOP per call) | %.4f | %.3f | %.4f | %.3f | %s |\n", r->attn_what, r->attn_gflop,
                    r->attn_inmodel_ms, bench_tflops(r->attn_gflop, r->attn_inmodel_ms), r->attn_iso.med,
                    bench_tflops(r->attn_gflop, r->attn_iso.med), pk);
        }
        if (r->attn_sus.n) {
            peak_pct(r->peak_tflops, bench_tflops(r->attn_gflop, r->attn_sus.med), pk, sizeof pk);
            fprintf(f, "| attention, sustained (back to back after a %.0f ms heater) | - | - | %.4f | %.3f | %s |\n",
                    BENCH_HEAT_MS, r->attn_sus.med, bench_tflops(r->attn_gflop, r->attn_sus.med), pk);
        }
        peak_pct(r->peak_tflops, bench_tflops(r->fwd_gflop, r->fwd_ms), pk, sizeof pk);
        fprintf(f, "| %s (%.1f GFLOP) | %.3f | %.3f | - | - | %s |\n", r->fwd_what, r->fwd_gflop, r->fwd_ms,
                bench_tflops(r->fwd_gflop, r->fwd_ms), pk);
        if (r->copy.n)
            fprintf(f, "\nDevice copy bandwidth: %.1f GB/s (read + write, %.0f MB moved, median %.3f ms).\n", r->copy_gbs,
                    r->copy_bytes / 1e6, r->copy.med);
        fprintf(f, "In-model = timed inside the block sequence (ledger; an op of several GEMM shapes is split over them "
                   "in proportion to their isolated times); isolated = the op alone, weights rotated through the listed "
                   "distinct buffers, attention on random Q/K/V with the model's heads and key mask; sustained = the "
                   "dense ceiling or the attention run back to back after a %.0f ms heater, events around each call and "
                   "no synchronization between them: the power state a forward runs in.\n\n", BENCH_HEAT_MS);
        if (r->floor_ms > 0)
            md_floor(f, r->gemm, r->n_gemm, r->attn_iso, r->attn_sus, r->attn_calls, r->attn_fp8, r->floor_ms,
                     r->floor_what);
    }
    md_arms_notes(f, r->arms, r->n_arms, r->notes, r->n_notes);
    fprintf(f, "Bench time %.1f s.\n", r->total_s);
}

/* ------------------------------------------------------------------ JSON lines */

int bench_report_json(const bench_report *r, const char *path) {
    dt_outfile *of = dt_outfile_open(path);   /* a temporary renamed into place when complete */
    if (!of) return -1;
    FILE *f = dt_outfile_fp(of);
    r->family->json_head(r, f);
    for (int k = 0; k < r->n_ops; k++) {
        const bench_op *o = &r->ops[k];
        fprintf(f, "{"); bench_jstr(f, "type", "ledger_op"); bench_jnum(f, "index", k); fputc(',', f); bench_jstr(f, "name", o->name);
        fputc(',', f); bench_jstr(f, "category", cat_name(o->cat)); bench_jstat(f, "prefix", o->prefix); bench_jnum(f, "ms", o->ms);
        bench_jstat(f, "direct", o->direct); bench_jnum(f, "ledger_ms", o->ledger_ms);
        bench_jnum(f, "gflop", o->gflop); bench_jnum(f, "tflops", o->gflop > 0 ? bench_tflops(o->gflop, o->ledger_ms) : 0);
        bench_jnum(f, "gbytes", o->gbytes);
        bench_jnum(f, "gb_per_s", o->gbytes > 0 && o->ledger_ms > 0 ? o->gbytes / (o->ledger_ms * 1e-3) : 0);
        bench_jnum(f, "blocks_per_region", r->prefix_blocks);
        fprintf(f, "}\n");
    }
    r->family->json_scaling(r, f);
    for (int i = 0; i < r->n_shares; i++) {
        const bench_share *s = &r->shares[i];
        fprintf(f, "{"); bench_jstr(f, "type", "share"); fputc(',', f); bench_jstr(f, "name", s->name); bench_jnum(f, "level", s->level);
        bench_jnum(f, "ms", s->ms); bench_jnum(f, "share_pct", s->share); bench_jnum(f, "total_ms", r->total_ms);
        bench_jnum(f, "is_remainder", strstr(s->name, "unexplained remainder") != NULL); fputc(',', f);
        bench_jstr(f, "basis", r->shares_basis);
        fprintf(f, "}\n");
    }
    json_gemms(f, r->gemm, r->n_gemm);
    if (r->attn_iso.n) {
        fprintf(f, "{"); bench_jstr(f, "type", "attention"); bench_jnum(f, "gflop", r->attn_gflop); bench_jnum(f, "inmodel_ms", r->attn_inmodel_ms);
        bench_jnum(f, "inmodel_tflops", bench_tflops(r->attn_gflop, r->attn_inmodel_ms)); bench_jstat(f, "isolated", r->attn_iso);
        bench_jnum(f, "isolated_tflops", bench_tflops(r->attn_gflop, r->attn_iso.med));
        if (r->attn_sus.n) { bench_jstat(f, "sustained", r->attn_sus); bench_jnum(f, "sustained_tflops", bench_tflops(r->attn_gflop, r->attn_sus.med)); }
        bench_jnum(f, "calls_per_forward", r->attn_calls);
        fprintf(f, "}\n");
    }
    fprintf(f, "{"); bench_jstr(f, "type", "forward_util"); fputc(',', f); bench_jstr(f, "name", r->fwd_what);
    bench_jnum(f, "gflop", r->fwd_gflop); bench_jnum(f, "ms", r->fwd_ms);
    bench_jnum(f, "tflops", bench_tflops(r->fwd_gflop, r->fwd_ms)); bench_jnum(f, "peak_tflops", r->peak_tflops); fputc(',', f);
    bench_jstr(f, "peak_source", r->peak_src);
    fprintf(f, "}\n");
    if (r->copy.n) {
        fprintf(f, "{"); bench_jstr(f, "type", "copy"); bench_jnum(f, "bytes", r->copy_bytes); bench_jstat(f, "t", r->copy);
        bench_jnum(f, "gb_per_s", r->copy_gbs);
        fprintf(f, "}\n");
    }
    for (int i = 0; i < r->n_arms; i++) {
        const bench_arm *a = &r->arms[i];
        fprintf(f, "{"); bench_jstr(f, "type", "arm"); fputc(',', f); bench_jstr(f, "arm", a->arm); fputc(',', f); bench_jstr(f, "workload", a->what);
        fputc(',', f); bench_jstr(f, "a", a->a); fputc(',', f); bench_jstr(f, "b", a->b); bench_jnum(f, "skipped", a->skipped);
        if (!a->skipped) {
            bench_jstat(f, "a", a->sa); bench_jstat(f, "b", a->sb); bench_jnum(f, "ratio_b_over_a", a->ratio); bench_jnum(f, "maxdiff", a->maxdiff);
            bench_jnum(f, "ref_absmax", a->ref_absmax); bench_jnum(f, "tol", a->tol);
        }
        fputc(',', f); bench_jstr(f, "note", a->note);
        fprintf(f, "}\n");
    }
    for (int i = 0; i < r->n_notes; i++) {
        fprintf(f, "{"); bench_jstr(f, "type", "note"); fputc(',', f); bench_jstr(f, "text", r->notes[i]);
        fprintf(f, "}\n");
    }
    return dt_outfile_commit(of);
}
