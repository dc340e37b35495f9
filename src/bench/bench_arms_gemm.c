/* bench_arms_gemm.c — FLUX.2's isolated-GEMM arms (interleaved A/B through run_arm, bench_arms.c):
 *   qpath    fused qmm vs transient dequantize+GEMM vs cached dense weights (vs mixed on CUDA), the single
 *            blocks' GEMM shapes at several token counts (one backend per path on the same host weights);
 *   fp8      GEMM with e4m3 weights/activations (--precision fp8's Linear) vs the dense bf16 GEMM at the model's
 *            main shapes, TFLOPS of each and the activation-quantization pass alone (CUDA).
 * Weights of distinct blocks are rotated so that one timed pass exceeds twice the cache.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"
#include "pipeline/latents.h"

/* ------------------------------------------------------------------ qpath */

typedef struct {
    dt_backend *be[4];
    bench_timer tm[4];
    dt_linear *w[4][2][64];   /* [variant][shape][block] */
    int nw[2];
    dt_mat xm[4], ym[4];
    int shape;
    int64_t rows_out;         /* rows compared */
} qpath_ctx;

static double qpath_time(void *c, int v) {
    qpath_ctx *q = c;
    dt_backend *be = q->be[v];
    bench_timer_start(&q->tm[v]);
    for (int i = 0; i < q->nw[q->shape]; i++) be->linear(be, q->ym[v], q->xm[v], q->w[v][q->shape][i]);
    return bench_timer_stop(&q->tm[v]) / q->nw[q->shape];
}

static void qpath_output(void *c, int v, float *out) {
    qpath_ctx *q = c;
    dt_backend *be = q->be[v];
    be->linear(be, q->ym[v], q->xm[v], q->w[v][q->shape][0]);
    be->download(be, out, dt_mat_rows(q->ym[v], 0, q->rows_out));
}

void bench_arm_qpath(bench_ctx *x) {
    bench_report *r = x->r;
    bm_model *bm = x->bm;
    const flux2_config *c = &r->flux2.c;
    int ns = c->num_single_layers;
    dt_linear_src src[2];
    if (ns == 0 || dt_weights_linear(bm->w, "single_transformer_blocks.0.attn.to_qkv_mlp_proj", -1, -1, -1, &src[0]) ||
        dt_weights_linear(bm->w, "single_transformer_blocks.0.attn.to_out", -1, -1, -1, &src[1])) {
        skip_arm(r, "qpath", "fused", "transient/cached/mixed", "no single blocks to take the GEMM shapes from");
        return;
    }
    if (!src[0].bits) {
        skip_arm(r, "qpath", "fused", "transient/cached/mixed", "dense weights: the quantized-path arm needs --format q4 or q8");
        return;
    }
    qpath_ctx q;
    memset(&q, 0, sizeof q);
    dt_qpath paths[4] = {DT_QPATH_FUSED, DT_QPATH_TRANSIENT, DT_QPATH_CACHED, DT_QPATH_MIXED};
    int nv = x->is_cpu ? 3 : 4;   /* mixed exists on CUDA only */
    for (int s = 0; s < 2; s++) {
        double each = (double)bench_src_bytes(&src[s]);
        int k = (int)ceil(x->rot_bytes / each);
        q.nw[s] = k < 1 ? 1 : k > ns ? ns : k > 64 ? 64 : k;
    }
    for (int v = 0; v < nv; v++) {
        dt_backend_opts o = x->be->opts;
        o.qpath = paths[v];
        q.be[v] = bench_backend_variant(x, o);
        bench_timer_init(&q.tm[v], q.be[v]);
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < q.nw[s]; i++) {
                char nm[128];
                snprintf(nm, sizeof nm, s == 0 ? "single_transformer_blocks.%d.attn.to_qkv_mlp_proj" : "single_transformer_blocks.%d.attn.to_out", i);
                dt_linear_src ls;
                if (dt_weights_linear(bm->w, nm, -1, -1, -1, &ls) || !(q.w[v][s][i] = q.be[v]->linear_create(q.be[v], &ls)))
                    bench_die();
            }
    }
    const char *note = x->is_cpu ? "the CPU backend dequantizes per tile whatever the qpath: the arms time the same code"
                                 : "isolated; weights of distinct single blocks rotated";
    for (int ti = 0; ti < x->n_arm_tokens; ti++) {
        int64_t M = x->arm_tokens[ti];
        for (int s = 0; s < 2; s++) {
            int64_t K = src[s].in, N = src[s].out;
            float *hx = dt_malloc(sizeof(float) * (size_t)M * K);
            dt_randn(x->o->seed, 40 + s, 0, hx, (size_t)M * K);
            for (int v = 0; v < nv; v++) {
                q.xm[v] = dt_alloc_or_die(q.be[v], M, K, q.be[v]->act_dtype);
                q.ym[v] = dt_alloc_or_die(q.be[v], M, N, q.be[v]->act_dtype);
                q.be[v]->upload(q.be[v], q.xm[v], hx);
            }
            free(hx);
            q.shape = s;
            q.rows_out = M < 256 ? M : 256;
            arm_spec a = {0};
            a.arm = "qpath";
            snprintf(a.what, sizeof a.what, "%s M=%lld K=%lld N=%lld (%d bufs)", s == 0 ? "proj" : "out", (long long)M,
                     (long long)K, (long long)N, q.nw[s]);
            a.names[0] = "fused";
            a.names[1] = "transient";
            a.names[2] = "cached";
            a.names[3] = "mixed";
            a.nv = nv;
            a.time = qpath_time;
            a.output = qpath_output;
            a.out_n = (size_t)q.rows_out * N;
            a.tol = x->is_cpu ? 1e-5 : 2e-2;   /* bf16 outputs, different accumulation orders on CUDA */
            snprintf(a.note, sizeof a.note, "%s", note);
            run_arm(x, &a, &q);
            for (int v = 0; v < nv; v++) {
                bench_sync_or_die(q.be[v]);
                q.be[v]->free(q.be[v], &q.xm[v]);
                q.be[v]->free(q.be[v], &q.ym[v]);
            }
        }
    }
    for (int v = 0; v < nv; v++) {
        bench_sync_or_die(q.be[v]);
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < q.nw[s]; i++) q.be[v]->linear_destroy(q.be[v], q.w[v][s][i]);
        bench_timer_free(&q.tm[v]);
        q.be[v]->destroy(q.be[v]);
    }
}

/* ------------------------------------------------------------------ fp8 */

typedef struct {
    dt_backend *be;
    bench_timer tm;
    dt_linear *w[2][64];   /* [bf16, fp8][copy] */
    int nw;
    dt_mat xm, ym;
    int64_t rows_out;
} fp8_ctx;

static double fp8_time(void *c, int v) {
    fp8_ctx *f = c;
    bench_timer_start(&f->tm);
    for (int i = 0; i < f->nw; i++) f->be->linear(f->be, f->ym, f->xm, f->w[v][i]);
    return bench_timer_stop(&f->tm) / f->nw;
}

static void fp8_output(void *c, int v, float *out) {
    fp8_ctx *f = c;
    f->be->linear(f->be, f->ym, f->xm, f->w[v][0]);
    f->be->download(f->be, out, dt_mat_rows(f->ym, 0, f->rows_out));
}

void bench_arm_fp8(bench_ctx *x) {
    bench_report *r = x->r;
    dt_backend *be = x->be;
    if (x->is_cpu) { skip_arm(r, "fp8", "bf16", "fp8", "CUDA only (the CPU backend emulates fp8 in f32)"); return; }
    const flux2_config *c = &r->flux2.c;
    const char *fmts[5] = {"single_transformer_blocks.%d.attn.to_qkv_mlp_proj", "single_transformer_blocks.%d.attn.to_out",
                           "transformer_blocks.%d.attn.to_q", "transformer_blocks.%d.ff.linear_in",
                           "transformer_blocks.%d.ff.linear_out"};
    const char *tags[5] = {"single proj", "single out", "double q/k/v/out", "double ff in", "double ff out"};
    const int counts[5] = {c->num_single_layers, c->num_single_layers, c->num_layers, c->num_layers, c->num_layers};
    const int64_t M = (int64_t)x->n + x->t;
    for (int s = 0; s < 5; s++) {
        char nm[128];
        dt_linear_src src;
        snprintf(nm, sizeof nm, fmts[s], 0);
        if (counts[s] < 1 || dt_weights_linear(x->bm->w, nm, -1, -1, -1, &src)) continue;
        const int64_t N = src.out, K = src.in;
        fp8_ctx f;
        memset(&f, 0, sizeof f);
        f.be = be;
        int k = (int)ceil(x->rot_bytes / ((double)N * K));   /* fp8 bytes per copy: both sets exceed the cache */
        f.nw = k < 1 ? 1 : k > counts[s] ? counts[s] : k > 64 ? 64 : k;
        for (int i = 0; i < f.nw; i++) {
            snprintf(nm, sizeof nm, fmts[s], i);
            dt_linear_src ls, lb;
            if (dt_weights_linear(x->bm->w, nm, -1, -1, -1, &ls)) bench_die();
            uint16_t *hb = NULL;
            lb = ls;
            if (ls.bits) {   /* the bf16 arm is the dense GEMM: dequantize on the host (the fp8 arm converts from 4-bit) */
                float *row = dt_malloc(sizeof(float) * (size_t)K);
                hb = dt_malloc(sizeof(uint16_t) * (size_t)(N * K));
                for (int64_t n = 0; n < N; n++) {
                    dt_linear_src_rows_f32(&ls, n, 1, row);
                    for (int64_t j = 0; j < K; j++) hb[n * K + j] = dt_f32_to_bf16(row[j]);
                }
                free(row);
                lb.bits = 0; lb.group_size = 0; lb.dtype = DT_BF16; lb.data = hb; lb.scales = lb.biases = NULL;
            }
            lb.precision = DT_PREC_BF16;
            ls.precision = DT_PREC_FP8;
            f.w[0][i] = be->linear_create(be, &lb);
            f.w[1][i] = be->linear_create(be, &ls);
            free(hb);
            if (!f.w[0][i] || !f.w[1][i]) bench_die();
        }
        bench_timer_init(&f.tm, be);
        f.xm = dt_alloc_or_die(be, M, K, be->act_dtype);
        f.ym = dt_alloc_or_die(be, M, N, be->act_dtype);
        bench_fill_randn(be, f.xm, x->o->seed + 90 + s, 1.0f);
        f.rows_out = M < 256 ? M : 256;
        arm_spec a = {0};
        a.arm = "fp8";
        snprintf(a.what, sizeof a.what, "%s M=%lld K=%lld N=%lld (%d bufs)", tags[s], (long long)M, (long long)K, (long long)N, f.nw);
        a.names[0] = "bf16";
        a.names[1] = "fp8";
        a.nv = 2;
        a.time = fp8_time;
        a.output = fp8_output;
        a.out_n = (size_t)f.rows_out * N;
        a.tol = 0.25;   /* max |fp8 - bf16| / max |out|: e4m3 rounding of both operands (~3.7% rms, tails larger) */
        snprintf(a.note, sizeof a.note, "isolated; distinct blocks' weights rotated; fp8 includes the activation quantization");
        int row0 = r->n_arms;
        run_arm(x, &a, &f);
        double q_ms = -1;
        const dt_ext_fp8_internals *f8 = dt_backend_fp8_internals(be);
        if (f8) {
            double t[20];
            for (int i = -3; i < 20; i++) {
                bench_timer_start(&f.tm);
                f8->quant(be, f.xm);
                double ms = bench_timer_stop(&f.tm);
                if (i >= 0) t[i] = ms;
            }
            q_ms = bench_stats(t, 20).med;
        }
        if (r->n_arms > row0) {
            const bench_arm *ar = &r->arms[row0];
            double fl = 2.0 * M * N * K;
            bench_note(r, "fp8 arm, %s M=%lld K=%lld N=%lld: bf16 %.0f TFLOPS, fp8 %.0f TFLOPS (%.2fx faster); activation "
                       "quantize %.3f ms (%.0f GB/s); scales: %s", tags[s], (long long)M, (long long)K, (long long)N,
                       fl / (ar->sa.med * 1e-3) / 1e12, fl / (ar->sb.med * 1e-3) / 1e12, ar->sa.med / ar->sb.med, q_ms,
                       q_ms > 0 ? 3.0 * M * K / (q_ms * 1e-3) / 1e9 : 0.0,
                       f8 ? f8->scale_mode(be) : "?");
        }
        bench_sync_or_die(be);
        be->free(be, &f.xm);
        be->free(be, &f.ym);
        for (int i = 0; i < f.nw; i++) { be->linear_destroy(be, f.w[0][i]); be->linear_destroy(be, f.w[1][i]); }
        bench_timer_free(&f.tm);
    }
}
