/* bench_arms.c — paired A/B arms, interleaved in one process (A B, B A, A B ...: ambient load hits both and
 * each variant runs in each position equally often), each reported with median and spread, the ratio B/A and the
 * max |A - B| of the outputs: the runner (run_arm), the dispatch over the family's arms (--arms), and FLUX.2's
 * arms:
 *   qpath, fp8  isolated GEMMs (bench_arms_gemm.c);
 *   rope     head_norm_rope rotating in fp32 vs bf16 products (two backends);
 *   mask     attention with an all-zero additive key mask vs none;
 *   cudnn    attention through cuDNN's fused SDPA vs our own wgmma kernel (CUDA, when cuDNN loads);
 *   attn-fp8 the backend's fp8 attention (per-tensor e4m3 Q/K/V/P, quantization passes included) vs bf16;
 *   gqa      native grouped-query attention vs K/V repeated to every query head (bench_arms_attn.c);
 *   graph    the device-only forward replayed from a CUDA graph vs issued eagerly (build time apart);
 *   prefetch the device-only forward with the model's linear_prefetch hints vs without (CUDA: the transient
 *            4-bit dequantization ahead on a low-priority stream vs right before each GEMM);
 *   threads  one single block with 1 CPU thread vs all (CPU backend);
 *   f8fuse   with --precision fp8: the device-only forward with the fp8 Linears' inputs written by the norm / SwiGLU
 *            and the gate folded into the GEMM vs separate quantizing passes and linear + gated_add.
 * Isolated arms rotate through distinct buffers so that one timed pass exceeds twice the cache.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend_cuda.h"
#include "bench_internal.h"
#include "pipeline/latents.h"

void run_arm(bench_ctx *x, arm_spec *a, void *ctx) {
    bench_report *r = x->r;
    int reps = x->reps;
    bench_progress("arms: %s %s (%d variants, %d reps interleaved) ...", a->arm, a->what, a->nv, reps);
    double *s = bench_time_interleaved(a->nv, reps, x->warmup, a->time, ctx);
    float *o0 = dt_malloc(sizeof(float) * (a->out_n ? a->out_n : 1)), *o1 = dt_malloc(sizeof(float) * (a->out_n ? a->out_n : 1));
    a->output(ctx, 0, o0);
    double absmax = bench_max_abs(o0, a->out_n);
    bench_stat s0 = bench_stats(s, reps);
    for (int v = 1; v < a->nv && r->n_arms < (int)(sizeof r->arms / sizeof r->arms[0]); v++) {
        a->output(ctx, v, o1);
        bench_arm *row = bench_arm_row(&r->arms[r->n_arms++], a->arm, a->what, a->names[0], a->names[v], a->note);
        row->sa = s0;
        row->sb = bench_stats(s + v * reps, reps);
        row->ratio = row->sa.med > 0 ? row->sb.med / row->sa.med : 0;
        row->maxdiff = bench_max_abs_diff(o1, o0, a->out_n);
        row->ref_absmax = absmax;
        row->tol = a->tol;
        if (a->differ >> v & 1) {   /* timing only: the outputs are not comparable */
            row->tol = INFINITY;
            size_t l = strlen(row->note);
            snprintf(row->note + l, sizeof row->note - l, "%soutputs differ by design", l ? "; " : "");
        }
    }
    free(o0);
    free(o1);
    free(s);
}

void skip_arm(bench_report *r, const char *arm, const char *a, const char *b, const char *why) {
    if (r->n_arms >= (int)(sizeof r->arms / sizeof r->arms[0])) return;
    bench_arm *row = bench_arm_row(&r->arms[r->n_arms++], arm, "", a, b, why);
    row->skipped = 1;
}

dt_backend *bench_backend_variant(bench_ctx *x, dt_backend_opts o) {
    dt_backend *be = dt_backend_create(x->r->backend, &o);
    if (!be) bench_die();
    return be;
}

/* ------------------------------------------------------------------ rope */

typedef struct {
    bm_model *bm[2];
    bench_timer tm[2];
    dt_mat src[2], work[2][16];
    int nb;
} rope_ctx;

static void rope_apply(rope_ctx *c, int v, dt_mat m) {
    bm_model *bm = c->bm[v];
    bm->be->head_norm_rope(bm->be, m, bm->c.heads, bm->c.head_dim, bm->sb[0].norm_q, bm->c.eps, bm->x.cos, bm->x.sin,
                           DT_ROPE_INTERLEAVED);
}

static double rope_time(void *p, int v) {
    rope_ctx *c = p;
    dt_backend *be = c->bm[v]->be;
    for (int i = 0; i < c->nb; i++) be->copy(be, c->work[v][i], c->src[v]);   /* restore, outside the timing */
    bench_timer_start(&c->tm[v]);
    for (int i = 0; i < c->nb; i++) rope_apply(c, v, c->work[v][i]);
    return bench_timer_stop(&c->tm[v]) / c->nb;
}

static void rope_output(void *p, int v, float *out) {
    rope_ctx *c = p;
    dt_backend *be = c->bm[v]->be;
    be->copy(be, c->work[v][0], c->src[v]);
    rope_apply(c, v, c->work[v][0]);
    be->download(be, out, c->work[v][0]);
}

static void arm_rope(bench_ctx *x) {
    bench_report *r = x->r;
    const flux2_config *c = &r->flux2.c;
    if (c->num_single_layers == 0) { skip_arm(r, "rope", "fp32", "bf16", "no single blocks"); return; }
    rope_ctx rc;
    memset(&rc, 0, sizeof rc);
    int64_t L = (int64_t)x->n + x->t, D = c->hidden;
    double bytes = (double)L * D * dt_dtype_size(x->be->act_dtype);
    rc.nb = (int)ceil(x->rot_bytes / bytes);
    if (rc.nb < 1) rc.nb = 1;
    if (rc.nb > 16) rc.nb = 16;
    float *hq = dt_malloc(sizeof(float) * (size_t)L * D);
    dt_randn(x->o->seed, 50, 0, hq, (size_t)L * D);
    for (int v = 0; v < 2; v++) {
        dt_backend_opts o = x->be->opts;
        o.rope_fp32 = v == 0;
        dt_backend *be = bench_backend_variant(x, o);
        rc.bm[v] = bm_load(be, x->o, x->dir, 0, 1, 0, 0);
        if (!rc.bm[v]) bench_die();
        bm_alloc(rc.bm[v], x->n, x->t, x->img_ids, x->txt_ids);
        bench_timer_init(&rc.tm[v], be);
        rc.src[v] = dt_alloc_or_die(be, L, D, be->act_dtype);
        be->upload(be, rc.src[v], hq);
        for (int i = 0; i < rc.nb; i++) rc.work[v][i] = dt_alloc_or_die(be, L, D, be->act_dtype);
    }
    free(hq);
    arm_spec a = {0};
    a.arm = "rope";
    snprintf(a.what, sizeof a.what, "QK norm + RoPE on Q [%lld, %lld] (%d bufs)", (long long)L, (long long)D, rc.nb);
    a.names[0] = "fp32";
    a.names[1] = "bf16";
    a.nv = 2;
    a.time = rope_time;
    a.output = rope_output;
    a.out_n = (size_t)L * D;
    a.tol = x->is_cpu ? 1e-6 : 3e-2;   /* bf16 products: a few bf16 ulps of |x| <= ~4 */
    snprintf(a.note, sizeof a.note, "%s", x->is_cpu ? "the CPU backend rotates in f32 either way (flag ignored)" : "isolated");
    run_arm(x, &a, &rc);
    for (int v = 0; v < 2; v++) {
        dt_backend *be = rc.bm[v]->be;
        bench_sync_or_die(be);
        be->free(be, &rc.src[v]);
        for (int i = 0; i < rc.nb; i++) be->free(be, &rc.work[v][i]);
        bench_timer_free(&rc.tm[v]);
        bm_free(rc.bm[v]);
        be->destroy(be);
    }
}

/* ------------------------------------------------------------------ attention: mask, GQA */

typedef struct {
    dt_backend *be;
    bench_timer tm;
    dt_mat q, k, v, o, bias;
    int hq, hkv, hd;
    float scale;
} attn_ctx;

/* One attention call with the CUDA backend's kernel choice pinned to pick (other backends: as they are). */
static void attention_pinned(attn_ctx *c, dt_cuda_attn pick, dt_mat bias) {
    dt_cuda_opts *co = dt_backend_cuda_opts(c->be);
    dt_cuda_attn saved = co ? co->attn : DT_CUDA_ATTN_AUTO;
    if (co) co->attn = pick;
    c->be->attention(c->be, c->o, c->q, c->k, c->v, c->hq, c->hq, c->hd, c->scale, bias, 0);
    if (co) co->attn = saved;
}

/* Both variants on our own kernel (CUDA: the default sends unmasked attention to cuDNN): the cost of the mask. */
static void mask_run(attn_ctx *c, int v) { attention_pinned(c, DT_CUDA_ATTN_OWN, v ? c->bias : dt_mat_null()); }

static double mask_time(void *p, int v) {
    attn_ctx *c = p;
    bench_timer_start(&c->tm);
    mask_run(c, v);
    return bench_timer_stop(&c->tm);
}

static void mask_output(void *p, int v, float *out) {
    attn_ctx *c = p;
    mask_run(c, v);
    c->be->download(c->be, out, c->o);
}

/* cuDNN's fused SDPA (v = 1) vs our own default kernel (v = 0), chosen per call through the backend's options. */
static void dnn_run(attn_ctx *c, int v) { attention_pinned(c, v ? DT_CUDA_ATTN_CUDNN : DT_CUDA_ATTN_OWN, dt_mat_null()); }

static double dnn_time(void *p, int v) {
    attn_ctx *c = p;
    bench_timer_start(&c->tm);
    dnn_run(c, v);
    return bench_timer_stop(&c->tm);
}

static void dnn_output(void *p, int v, float *out) {
    attn_ctx *c = p;
    dnn_run(c, v);
    c->be->download(c->be, out, c->o);
}

/* The backend's fp8 attention (v = 1: per-tensor e4m3 Q/K/V and P, incl. the quantization passes) vs the
 * default bf16 attention (v = 0). */
static void f8a_run(attn_ctx *c, int v) {
    if (v) c->be->attention_fp8(c->be, c->o, c->q, c->k, c->v, c->hq, c->hq, c->hd, c->scale);
    else c->be->attention(c->be, c->o, c->q, c->k, c->v, c->hq, c->hq, c->hd, c->scale, dt_mat_null(), 0);
}

static double f8a_time(void *p, int v) {
    attn_ctx *c = p;
    bench_timer_start(&c->tm);
    f8a_run(c, v);
    return bench_timer_stop(&c->tm);
}

static void f8a_output(void *p, int v, float *out) {
    attn_ctx *c = p;
    f8a_run(c, v);
    c->be->download(c->be, out, c->o);
}

static void arms_attention(bench_ctx *x) {
    bench_report *r = x->r;
    const flux2_config *c = &r->flux2.c;
    dt_backend *be = x->be;
    attn_ctx ac;
    memset(&ac, 0, sizeof ac);
    ac.be = be;
    ac.hq = c->heads;
    ac.hkv = ac.hq;
    ac.hd = c->head_dim;
    ac.scale = 1.0f / sqrtf((float)c->head_dim);
    int64_t L = (int64_t)x->n + x->t, D = c->hidden;
    bench_timer_init(&ac.tm, be);
    bench_attn_inputs(be, L, ac.hq, ac.hkv, ac.hd, 61, &ac.q, &ac.k, &ac.v, &ac.o);
    ac.bias = dt_alloc_or_die(be, 1, L, DT_F32);
    float *z = dt_calloc((size_t)L, sizeof(float));   /* the arm is an all-zero additive mask */
    be->upload(be, ac.bias, z);
    free(z);
    double tol_exact = x->is_cpu ? 1e-5 : 2e-2;
    arm_spec a = {0};
    a.arm = "mask";
    snprintf(a.what, sizeof a.what, "attention L=%lld, %d heads x %d", (long long)L, ac.hq, ac.hd);
    a.names[0] = "no mask";
    a.names[1] = "zero mask";
    a.nv = 2;
    a.time = mask_time;
    a.output = mask_output;
    a.out_n = (size_t)L * D;
    a.tol = tol_exact;
    snprintf(a.note, sizeof a.note, "isolated; key_bias [1, L] of zeros; CUDA: both on our kernel");
    run_arm(x, &a, &ac);

    long long dnn0 = 0, dnn1 = 0;
    int dnn_ver = dt_backend_cuda_cudnn_info(be, &dnn0);
    if (x->is_cpu || !dnn_ver) {
        skip_arm(r, "cudnn", "own wgmma", "cuDNN SDPA", x->is_cpu ? "CUDA only" : "cuDNN not loadable (libcudnn.so.9)");
    } else {
        dnn_run(&ac, 1);
        dt_backend_cuda_cudnn_info(be, &dnn1);
        if (dnn1 == dnn0 || ac.hd != 128) {
            skip_arm(r, "cudnn", "own wgmma", "cuDNN SDPA", "cuDNN rejected this shape (DITRUN_CUDNN_DEBUG=1 says why)");
        } else {
            arm_spec d = {0};
            d.arm = "cudnn";
            snprintf(d.what, sizeof d.what, "attention: cuDNN vs own wgmma, L=%lld, %d heads x %d", (long long)L, ac.hq,
                     ac.hd);
            d.names[0] = "own wgmma";
            d.names[1] = "cuDNN SDPA";
            d.nv = 2;
            d.time = dnn_time;
            d.output = dnn_output;
            d.out_n = (size_t)L * D;
            d.tol = tol_exact;
            snprintf(d.note, sizeof d.note, "isolated; cuDNN %d.%d.%d fused flash attention (bf16 P), no mask",
                     dnn_ver / 10000, dnn_ver / 100 % 100, dnn_ver % 100);
            run_arm(x, &d, &ac);
        }
    }

    if (!be->attention_fp8) {
        skip_arm(r, "attn-fp8", "bf16", "fp8", be->attention_fp8_off ? "fp8 attention is off on this backend (cuDNN < 9.19: "
                 "intermittently wrong fp8 SDPA; NOTES.md)" : "this backend has no fp8 attention");
    } else {
        /* relative L2 of fp8 vs bf16 over the whole output, for the note */
        size_t n = (size_t)L * D;
        float *o0 = dt_malloc(sizeof(float) * n), *o1 = dt_malloc(sizeof(float) * n);
        f8a_output(&ac, 0, o0);
        f8a_output(&ac, 1, o1);
        const double rel = dt_rel_l2(o1, o0, n);
        free(o0);
        free(o1);
        arm_spec f = {0};
        f.arm = "attn-fp8";
        snprintf(f.what, sizeof f.what, "attention L=%lld, %d heads x %d", (long long)L, ac.hq, ac.hd);
        f.names[0] = "bf16";
        f.names[1] = "fp8";
        f.nv = 2;
        f.time = f8a_time;
        f.output = f8a_output;
        f.out_n = n;
        f.tol = 0.25;   /* max |fp8 - bf16| / max |out|: e4m3 rounding of Q, K, V and P (~2-4% rms, tails larger) */
        snprintf(f.note, sizeof f.note, "isolated; fp8 incl. the per-tensor quantization of Q/K/V; rel L2 fp8 vs bf16 %.2f%%%s",
                 100 * rel, x->is_cpu ? "; CPU: emulation in f32" : "; CUDA: cuDNN fp8 SDPA");
        run_arm(x, &f, &ac);
    }

    if (r->flux2.kv_heads == ac.hq)
        skip_arm(r, "gqa", "native", "repeated KV", "kv heads = heads (pass --kv-heads)");
    else
        bench_arm_gqa(x, L, ac.hq, r->flux2.kv_heads, ac.hd, dt_mat_null(), 2, "");
    bench_sync_or_die(be);
    be->free(be, &ac.q); be->free(be, &ac.k); be->free(be, &ac.v); be->free(be, &ac.o); be->free(be, &ac.bias);
    bench_timer_free(&ac.tm);
}

/* ------------------------------------------------------------------ graph */

/* Arms over the whole device-only forward: variant v runs one forward its own way (run), timed with events;
 * the output compared is the forward's. */
typedef struct fwd_arm_ctx fwd_arm_ctx;
struct fwd_arm_ctx {
    bm_model *bm;
    bench_timer tm;
    void (*run)(fwd_arm_ctx *c, int v);
    void *graph;                                                       /* graph arm: the captured forward */
    void (*hint)(dt_backend *, const dt_linear *, dt_mat, int64_t);   /* prefetch arm: linear_prefetch */
};

static double fwd_arm_time(void *p, int v) {
    fwd_arm_ctx *c = p;
    bench_timer_start(&c->tm);
    c->run(c, v);
    return bench_timer_stop(&c->tm);
}

static void fwd_arm_output(void *p, int v, float *out) {
    fwd_arm_ctx *c = p;
    c->run(c, v);
    c->bm->be->download(c->bm->be, out, c->bm->x.out);
}

/* The spec of a whole-forward arm: variants named n[0..nv), the forward's output compared within tol. */
static arm_spec fwd_arm_spec(bench_ctx *x, const char *arm, int nv, const char *const *n, double tol) {
    arm_spec a = {0};
    a.arm = arm;
    snprintf(a.what, sizeof a.what, "device-only forward (%d tokens)", x->n + x->t);
    for (int v = 0; v < nv; v++) a.names[v] = n[v];
    a.nv = nv;
    a.time = fwd_arm_time;
    a.output = fwd_arm_output;
    a.out_n = (size_t)x->n * x->r->flux2.c.out_channels;
    a.tol = tol;
    return a;
}

static void graph_run(fwd_arm_ctx *g, int v) {
    if (v == 0) bm_forward(g->bm, g->bm->nd, g->bm->ns);
    else if (g->bm->be->graph_launch(g->bm->be, g->graph)) {
        fprintf(stderr, "ditrun: error: bench: %s\n", dt_last_error());
        exit(1);
    }
}

static void arm_graph(bench_ctx *x) {
    bench_report *r = x->r;
    dt_backend *be = x->be;
    if (!be->capture_begin || !be->capture_end || !be->graph_launch) {
        skip_arm(r, "graph", "eager", "graph", "the backend has no graph capture");
        bench_note(r, "graph arm skipped: the %s backend has no graph capture", r->backend);
        return;
    }
    fwd_arm_ctx g;
    memset(&g, 0, sizeof g);
    g.bm = x->bm;
    g.run = graph_run;
    bm_forward(g.bm, g.bm->nd, g.bm->ns);   /* eager warm-up: scratch buffers grown before the capture */
    bench_sync_or_die(be);
    double t0 = dt_now();
    if (be->capture_begin(be)) {
        skip_arm(r, "graph", "eager", "graph", "capture_begin failed");
        bench_note(r, "graph arm skipped: %s", dt_last_error());
        return;
    }
    bm_forward(g.bm, g.bm->nd, g.bm->ns);
    g.graph = be->capture_end(be);
    double build_ms = (dt_now() - t0) * 1e3;
    if (!g.graph) {
        skip_arm(r, "graph", "eager", "graph", "capture failed");
        bench_note(r, "graph arm skipped: %s", dt_last_error());
        return;
    }
    bench_timer_init(&g.tm, be);
    /* the first replay (upload of the executable graph) is warm-up, reported with the build */
    bench_timer_start(&g.tm);
    graph_run(&g, 1);
    double first_ms = bench_timer_stop(&g.tm);
    bench_note(r, "graph build (capture + instantiate) %.2f ms and first replay %.2f ms: excluded from the graph arm's step time",
               build_ms, first_ms);
    static const char *const names[] = {"eager", "graph"};
    arm_spec a = fwd_arm_spec(x, "graph", 2, names, 1e-3);
    snprintf(a.note, sizeof a.note, "in-model; build %.1f ms excluded", build_ms);
    run_arm(x, &a, &g);
    bench_sync_or_die(be);
    if (be->graph_destroy) be->graph_destroy(be, g.graph);
    bench_timer_free(&g.tm);
}

/* ------------------------------------------------------------------ prefetch */

static void prefetch_run(fwd_arm_ctx *p, int v) {
    p->bm->be->linear_prefetch = v == 1 ? p->hint : NULL;   /* the model's hints become no-ops without it */
    bm_forward(p->bm, p->bm->nd, p->bm->ns);
    p->bm->be->linear_prefetch = p->hint;
}

static void arm_prefetch(bench_ctx *x) {
    bench_report *r = x->r;
    dt_backend *be = x->be;
    if (!be->linear_prefetch) {
        skip_arm(r, "prefetch", "no hints", "hints", "the backend prefetches nothing");
        bench_note(r, "prefetch arm skipped: the %s backend has no linear_prefetch (CUDA: option no_prefetch)",
                   r->backend);
        return;
    }
    fwd_arm_ctx p;
    memset(&p, 0, sizeof p);
    p.bm = x->bm;
    p.run = prefetch_run;
    p.hint = be->linear_prefetch;
    bench_timer_init(&p.tm, be);
    /* the third variant is A against itself: what remains of the order's effect and the noise; tolerance 0: the
     * same weights, bit for bit, only the timing of their dequantization moves */
    static const char *const names[] = {"no hints", "hints", "no hints, again"};
    arm_spec a = fwd_arm_spec(x, "prefetch", 3, names, 0);
    snprintf(a.note, sizeof a.note, "in-model; transient weights dequantized ahead on a low-priority stream");
    run_arm(x, &a, &p);
    bench_sync_or_die(be);
    bench_timer_free(&p.tm);
}

/* ------------------------------------------------------------------ f8fuse */

/* v = 0: the fp8 Linears quantize their inputs in passes of their own and the gated residual runs as linear +
 * gated_add (the model's fuse_inputs off, and the fp8-internals extension's force_unfused for the backend's
 * linear_gated_add: as Linears loaded with fp8_unfused); v = 1: the default of --precision fp8 (norm_linear /
 * act_linear_gated, the gate folded into the GEMM). */
static void f8fuse_run(fwd_arm_ctx *p, int v) {
    int saved = p->bm->c.fuse_inputs;
    const dt_ext_fp8_internals *f8 = dt_backend_fp8_internals(p->bm->be);   /* (CPU: none; it fuses nothing) */
    if (!v) {
        p->bm->c.fuse_inputs = 0;
        if (f8) f8->force_unfused(p->bm->be, 1);
    }
    bm_forward(p->bm, p->bm->nd, p->bm->ns);
    if (!v) {
        p->bm->c.fuse_inputs = saved;
        if (f8) f8->force_unfused(p->bm->be, 0);
    }
}

static void arm_f8fuse(bench_ctx *x) {
    bench_report *r = x->r;
    if (!x->bm->c.fuse_inputs) {
        skip_arm(r, "f8fuse", "separate ops", "fused inputs", "needs --precision fp8");
        return;
    }
    fwd_arm_ctx p;
    memset(&p, 0, sizeof p);
    p.bm = x->bm;
    p.run = f8fuse_run;
    bench_timer_init(&p.tm, x->be);
    /* tolerance of max |A - B| / max |out|: the same e4m3 codes; the folded gate rounds each residual update once
     * instead of three times, a bf16 reordering the random-weight synthetic model amplifies like the q paths' gate
     * folds (1.7% rel L2, PERF stop 11): measured 5.6% at 1024², 5.4% at 2048² (stop 16). CPU: 0, its fused ops
     * are the separate ones */
    static const char *const names[] = {"separate ops", "fused inputs"};
    arm_spec a = fwd_arm_spec(x, "f8fuse", 2, names, 0.1);
    snprintf(a.note, sizeof a.note, "in-model; fp8 Linears fed by the norm / SwiGLU, gate folded into the GEMM");
    run_arm(x, &a, &p);
    bench_sync_or_die(x->be);
    bench_timer_free(&p.tm);
}

/* ------------------------------------------------------------------ threads */

typedef struct {
    bm_model *bm[2];
    dt_mat s0[2];
    bench_timer tm[2];
} threads_ctx;

static double threads_time(void *p, int v) {
    threads_ctx *c = p;
    dt_backend *be = c->bm[v]->be;
    be->copy(be, c->bm[v]->x.s, c->s0[v]);
    bench_timer_start(&c->tm[v]);
    bm_single_block(c->bm[v], 0);
    return bench_timer_stop(&c->tm[v]);
}

static void threads_output(void *p, int v, float *out) {
    threads_ctx *c = p;
    dt_backend *be = c->bm[v]->be;
    be->copy(be, c->bm[v]->x.s, c->s0[v]);
    bm_single_block(c->bm[v], 0);
    be->download(be, out, c->bm[v]->x.s);
}

static void arm_threads(bench_ctx *x) {
    bench_report *r = x->r;
    if (!x->is_cpu) { skip_arm(r, "threads", "1 thread", "all", "CPU backend only"); return; }
    if (r->flux2.c.num_single_layers == 0) { skip_arm(r, "threads", "1 thread", "all", "no single blocks"); return; }
    threads_ctx tc;
    memset(&tc, 0, sizeof tc);
    int nall = 0;
    for (int v = 0; v < 2; v++) {
        dt_backend_opts o = x->be->opts;
        o.threads = v == 0 ? 1 : 0;
        dt_backend *be = bench_backend_variant(x, o);
        if (v == 1) nall = be->opts.threads;
        tc.bm[v] = bm_load(be, x->o, x->dir, 0, 1, 0, 0);
        if (!tc.bm[v]) bench_die();
        bm_alloc(tc.bm[v], x->n, x->t, x->img_ids, x->txt_ids);
        bm_randomize(tc.bm[v], 71);
        int64_t L = (int64_t)x->n + x->t;
        tc.s0[v] = dt_alloc_or_die(be, L, r->flux2.c.hidden, be->act_dtype);
        be->copy(be, tc.s0[v], tc.bm[v]->x.s);
        bench_timer_init(&tc.tm[v], be);
    }
    arm_spec a = {0};
    a.arm = "threads";
    snprintf(a.what, sizeof a.what, "one single block, %d tokens", x->n + x->t);
    a.names[0] = "1 thread";
    static char all_name[24];
    snprintf(all_name, sizeof all_name, "all (%d)", nall);
    a.names[1] = all_name;
    a.nv = 2;
    a.time = threads_time;
    a.output = threads_output;
    a.out_n = (size_t)(x->n + x->t) * r->flux2.c.hidden;
    a.tol = 1e-4;
    snprintf(a.note, sizeof a.note, "%s", nall == 1 ? "only one core: both arms use 1 thread" : "in-model block");
    run_arm(x, &a, &tc);
    for (int v = 0; v < 2; v++) {
        dt_backend *be = tc.bm[v]->be;
        be->free(be, &tc.s0[v]);
        bench_timer_free(&tc.tm[v]);
        bm_free(tc.bm[v]);
        be->destroy(be);
    }
}

static int arm_on(const bench_ctx *x, const char *name) {
    if (!x->o->arms) return 1;
    size_t n = strlen(name);
    for (const char *p = x->o->arms; (p = strstr(p, name)); p += n)
        if ((p == x->o->arms || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    return 0;
}

const bench_arm_entry bench_flux2_arms[] = {
    {"qpath", bench_arm_qpath}, {"rope", arm_rope},         {"attention", arms_attention}, {"graph", arm_graph},
    {"prefetch", arm_prefetch}, {"threads", arm_threads},   {"fp8", bench_arm_fp8},        {"f8fuse", arm_f8fuse},
    {NULL, NULL},
};

int bench_arms(bench_ctx *x) {
    for (const bench_arm_entry *e = x->fam->arms; e && e->name; e++)
        if (arm_on(x, e->name)) e->run(x);
    return 0;
}
