/* bench_zimage.c — Z-Image as the bench drives it (bench_zimage_family, the interface of bench_internal.h).
 *
 * The checkpoint is synthetic (zimage_synth_write at the preset geometry, cached like the others) or --model DIR.
 * The whole forward is timed through zimage_forward itself (wall clock incl. host I/O). Everything inside a joint
 * block is timed device-only on zimage.c's own pieces: the loaded model's joint blocks run op by op
 * (zimage_block_op) on the activations its last forward left (the joint stream, RoPE tables and folded modulation),
 * so no second copy of the weights is needed and the ledger times exactly the forward's ops. Then: block-count
 * scaling, the step's shares (joint blocks from the ledger, the rest of zimage_forward: refiners, embedders, final
 * layer, host I/O), the joint blocks' GEMM shapes and attention for the utilization, and Z-Image's report sections.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"
#include "synth/synth_dit.h"

/* What a Z-Image run keeps besides the report. */
struct zi_bench {
    zimage_model *m;
    float *img, *cap;        /* zimage_forward's inputs: tokens [n, p²C], caption [t, cap_dim] */
    dt_mat s0;               /* the joint stream after the timed forwards (restored around every timed region) */
};

static int64_t pad32(int64_t n) { return (n + ZIMAGE_SEQ_MULTIPLE - 1) / ZIMAGE_SEQ_MULTIPLE * ZIMAGE_SEQ_MULTIPLE; }

/* ------------------------------------------------------------------ set-up */

static int write_checkpoint(bench_ctx *x, const char *dir) {
    int f = x->o->format;
    return zimage_synth_write(&x->r->zimage.c, dir, f == BENCH_FMT_Q4 ? 4 : f == BENCH_FMT_Q8 ? 8 : 0,
                              x->o->group > 0 ? x->o->group : 64, x->o->seed);
}

static void count_flops(bench_zimage_part *p, int n, int t) {
    const zimage_config *c = &p->c;
    const double D = c->dim, F = c->ffn, nx = (double)pad32(n), tc = (double)pad32(t), L = nx + tc;
    const double row = 2.0 * D * (4 * D + 3 * F);   /* q/k/v, out, w1, w3, w2 per token */
    p->gflop_block_gemm = L * row * 1e-9;
    p->gflop_block_attn = 4.0 * L * L * D * 1e-9;
    p->gflop_refiners = c->n_refiner * ((nx + tc) * row + 4.0 * (nx * nx + tc * tc) * D) * 1e-9;
    p->gflop_other = (2.0 * n * c->patch_channels * D * 2 + 2.0 * t * c->cap_dim * D +
                      2.0 * (c->n_layers + c->n_refiner + 1) * c->adaln * 4 * D) * 1e-9;
}

static int setup(bench_ctx *x) {
    const bench_opts *o = x->o;
    bench_report *r = x->r;
    bench_zimage_part *p = &r->zimage;
    if (o->format == BENCH_FMT_F32 && !o->model_dir) {
        dt_set_error("bench: Z-Image synthetic weights are bf16, q4 or q8 (--format f32 is FLUX.2 only)");
        return -1;
    }
    if (x->cfg) {
        if (zimage_config_parse(x->cfg, x->cfg_path, &p->c)) return -1;
    } else {
        if (zimage_preset(o->preset, &p->c)) return -1;
        if (o->n_double > 0 || o->n_single > 0 || o->hidden > 0 || o->heads > 0 || o->kv_heads > 0 || o->mlp_ratio > 0)
            bench_note(r, "Z-Image runs its preset's geometry: --hidden/--heads/--kv-heads/--double/--single/--mlp-ratio "
                          "are ignored");
        const zimage_config *c = &p->c;
        char key[320];
        snprintf(key, sizeof key, "zimage-D%d-H%d-L%d-R%d-cap%d-in%d-p%d-%s", c->dim, c->heads, c->n_layers, c->n_refiner,
                 c->cap_dim, c->in_channels, c->patch, bench_fmt_name(o->format));
        if (o->format != BENCH_FMT_BF16) {
            size_t l = strlen(key);
            snprintf(key + l, sizeof key - l, "-g%d", o->group > 0 ? o->group : 64);
        }
        if (!(x->dir = bench_checkpoint(x, key, write_checkpoint))) return -1;
        snprintf(r->source, sizeof r->source, "synthetic (%s)", x->dir);
        snprintf(r->preset, sizeof r->preset, "%s", o->preset);
    }
    snprintf(r->precision, sizeof r->precision, "Linears %s, attention %s", o->precision == DT_PREC_FP8 ? "fp8" : "bf16",
             o->attn_precision == DT_PREC_FP8 ? "fp8" : "bf16");
    const zimage_config *c = &p->c;
    /* workload: a real-geometry forward is ~26 TFLOP at 1024²: tiny on a CPU */
    const int tiny = c->dim <= 1024;
    const bench_workload_base cpu_dflt = {tiny ? 128 : 32, tiny ? 24 : 8, tiny ? 5 : 2, tiny ? 1 : 0};
    if (bench_workload(x, &cpu_dflt, 0)) return -1;
    if (x->t < 1) { dt_set_error("bench: Z-Image needs at least one caption token (--text-tokens)"); return -1; }
    count_flops(p, x->n, x->t);
    p->rows = pad32(x->n) + pad32(x->t);
    r->fwd_gflop = c->n_layers * (p->gflop_block_gemm + p->gflop_block_attn) + p->gflop_refiners + p->gflop_other;
    struct zi_bench *z = x->zi = dt_calloc(1, sizeof *x->zi);
    z->img = dt_malloc(sizeof(float) * (size_t)x->n * c->patch_channels);
    z->cap = dt_malloc(sizeof(float) * (size_t)x->t * c->cap_dim);
    uint64_t s = o->seed * 0x9E3779B97F4A7C15ULL + 13;
    for (int64_t i = 0; i < (int64_t)x->n * c->patch_channels; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        z->img[i] = (float)((s >> 40) / 16777216.0 * 2 - 1);
    }
    for (int64_t i = 0; i < (int64_t)x->t * c->cap_dim; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        z->cap[i] = (float)((s >> 40) / 16777216.0 * 2 - 1);
    }
    bench_progress("%s on %s: D %d = %d heads x %d, %d joint + 2 x %d refiner blocks, FFN %d, caption %d; %d image + %d "
                   "caption tokens (%lld rows padded); %.1f GFLOP per forward", r->preset, r->backend, c->dim, c->heads,
                   c->head_dim, c->n_layers, c->n_refiner, c->ffn, c->cap_dim, x->n, x->t, (long long)p->rows,
                   r->fwd_gflop);
    return 0;
}

static void release(bench_ctx *x) {
    struct zi_bench *z = x->zi;
    if (!z) return;
    if (z->s0.data) x->be->free(x->be, &z->s0);
    zimage_free(z->m);
    free(z->img);
    free(z->cap);
    free(z);
    x->zi = NULL;
}

/* ------------------------------------------------------------------ whole forward */

/* every joint block (bench_time_restored's run) */
static void run_joint_blocks(void *ud) {
    zimage_model *m = ud;
    zimage_joint_blocks(m, 0, zimage_get_config(m)->n_layers);
}

/* zimage_forward timed (wall clock), then every joint block device-only on the activations it left. */
static int whole_forward(bench_ctx *x) {
    bench_report *r = x->r;
    bench_zimage_part *p = &r->zimage;
    struct zi_bench *z = x->zi;
    dt_backend *be = x->be;
    const zimage_config *c = &p->c;
    bench_progress("loading %s with zimage_load ...", x->dir);
    double t0 = dt_now();
    const zimage_load_opts lo = {.precision = x->o->precision, .attn_precision = x->o->attn_precision};
    if (!(z->m = zimage_load_ex(be, x->dir, &lo))) return -1;
    size_t bytes;
    zimage_weight_info(z->m, &bytes, r->fmt, sizeof r->fmt);
    p->weight_gb = bytes / 1e9;
    r->load_s = dt_now() - t0;
    bench_progress("loaded (%.1f s, %.2f GB of weights, %s)", r->load_s, p->weight_gb, r->fmt);
    const size_t no = (size_t)x->n * c->patch_channels;
    float *out = dt_malloc(sizeof(float) * no);
    double *sm = dt_malloc(sizeof(double) * x->reps);
    const int wu = x->warmup > 0 ? x->warmup : 1;   /* the first call allocates: always one warm-up */
    dt_power_acc pw;
    dt_power_begin(&pw, be, x->reps);
    int rc = 0;
    for (int i = -wu; i < x->reps && !rc; i++) {
        if (i >= 0) bench_progress("whole forward: rep %d/%d", i + 1, x->reps);
        bench_sync_or_die(be);
        double w0 = dt_now();
        rc = zimage_forward(z->m, z->img, x->h, x->w, z->cap, x->t, 0.5f, out, NULL, NULL);
        double ms = (dt_now() - w0) * 1e3;
        if (i >= 0) { sm[i] = ms; dt_power_add(&pw); }
        else if (i == -wu) p->fwd_warm_ms = ms;
    }
    r->power = dt_power_end(&pw);
    if (!rc) {
        p->fwd = bench_stats(sm, x->reps);
        p->out_absmax = bench_max_abs(out, no);
        p->out_finite = isfinite(p->out_absmax);
        if (!p->out_finite) bench_note(r, "WARNING: zimage_forward produced non-finite outputs");
    }
    free(out);
    free(sm);
    if (rc) return -1;
    /* device-only: the joint blocks on the forward's own activations; the stream restored outside the timing */
    dt_mat s = zimage_joint_stream(z->m);
    z->s0 = dt_alloc_or_die(be, s.rows, s.cols, be->act_dtype);
    be->copy(be, z->s0, s);
    p->blocks_dev = bench_time_restored(be, s, z->s0, wu, x->reps, run_joint_blocks, z->m);
    r->fwd_ms = p->fwd.med;
    snprintf(r->fwd_what, sizeof r->fwd_what, "whole forward");
    r->floor_ms = p->blocks_dev.n ? p->blocks_dev.med : 0;
    snprintf(r->floor_what, sizeof r->floor_what, "The %d joint blocks (device-only)", c->n_layers);
    return 0;
}

/* ------------------------------------------------------------------ the ledger's block: a joint block */

static const bench_op_desc block_ops[ZIMAGE_OP_COUNT] = {
    {"attention norm (RMSNorm, folded scale)", BENCH_CAT_ELEM},
    {"q/k/v GEMM (stacked)", BENCH_CAT_GEMM},
    {"QK head norm + RoPE", BENCH_CAT_ELEM},
    {"attention", BENCH_CAT_ATTN},
    {"out GEMM", BENCH_CAT_GEMM},
    {"post-norm + gated residual 1", BENCH_CAT_ELEM},
    {"FFN norm (RMSNorm, folded scale)", BENCH_CAT_ELEM},
    {"w1 + w3 GEMMs", BENCH_CAT_GEMM},
    {"SwiGLU", BENCH_CAT_ELEM},
    {"w2 GEMM", BENCH_CAT_GEMM},
    {"post-norm + gated residual 2", BENCH_CAT_ELEM},
};

static int n_blocks(bench_ctx *x) { return x->r->zimage.c.n_layers; }

static double block_bytes(bench_ctx *x) {
    static const char *const names[] = {"attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0",
                                        "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"};
    return bench_block_weight_bytes(zimage_weights(x->zi->m), "layers.0", names, sizeof names / sizeof names[0]);
}

static void block_op(bench_ctx *x, int b, int k, int split) {
    (void)split;   /* QK norm and RoPE are one pass in the model */
    zimage_block_op(x->zi->m, b, k);
}

static dt_mat stream(bench_ctx *x) { return zimage_joint_stream(x->zi->m); }

static void op_work(bench_ctx *x, bench_op *ops) {
    const bench_zimage_part *p = &x->r->zimage;
    const zimage_config *c = &p->c;
    const double es = (double)dt_dtype_size(x->be->act_dtype), L = (double)p->rows, D = c->dim, F = c->ffn;
    ops[ZIMAGE_OP_QKV].gflop = 2.0 * L * D * 3 * D * 1e-9;
    ops[ZIMAGE_OP_OUT].gflop = 2.0 * L * D * D * 1e-9;
    ops[ZIMAGE_OP_W13].gflop = 2.0 * L * D * 2 * F * 1e-9;
    ops[ZIMAGE_OP_W2].gflop = 2.0 * L * F * D * 1e-9;
    ops[ZIMAGE_OP_ATTN].gflop = p->gflop_block_attn;
    /* least traffic: each input read once, each output written once */
    ops[ZIMAGE_OP_NORM1].gbytes = ops[ZIMAGE_OP_NORM2].gbytes = 2 * L * D * es * 1e-9;
    ops[ZIMAGE_OP_QKNORM_ROPE].gbytes = 4 * L * D * es * 1e-9;   /* Q and K in place */
    ops[ZIMAGE_OP_RESID1].gbytes = ops[ZIMAGE_OP_RESID2].gbytes = 3 * L * D * es * 1e-9;
    ops[ZIMAGE_OP_SWIGLU].gbytes = 3 * L * F * es * 1e-9;
}

/* Block-count scaling (bench_block_scaling) of the joint blocks, on the stream the forward left (z->s0). */
static void scale_run(void *ud, int blocks) { zimage_joint_blocks(ud, 0, blocks); }

static void scaling(bench_ctx *x) {
    bench_zimage_part *p = &x->r->zimage;
    bench_block_scaling(x, p->c.n_layers, zimage_joint_stream(x->zi->m), x->zi->s0, p->blocks_dev, scale_run, x->zi->m,
                        &p->scale);
}

/* Shares of zimage_forward: the joint blocks from the ledger (times the blocks), the rest of the forward
 * (zimage_forward − the joint blocks device-only) and the unexplained remainder (joint blocks − ledger x blocks). */
static void shares(bench_ctx *x) {
    bench_report *r = x->r;
    const bench_zimage_part *p = &r->zimage;
    const double nl = p->c.n_layers;
    r->total_ms = p->fwd.med;
    snprintf(r->shares_of, sizeof r->shares_of, "zimage_forward");
    snprintf(r->shares_how, sizeof r->shares_how, "times %d joint blocks. Rest = zimage_forward - the joint blocks "
             "device-only (the 2 x %d refiner blocks, embedders, timestep MLP + host modulation fold, final layer, host "
             "uploads/download); remainder = joint blocks - ledger block x blocks.", p->c.n_layers, p->c.n_refiner);
    double cat[3];
    bench_ledger_by_cat(r, cat);
    const bench_op *o = r->ops;
    bench_add_share(r, "joint-block GEMMs (q/k/v, out, w1/w3, w2)", nl * cat[BENCH_CAT_GEMM], 0);
    bench_add_share(r, "q/k/v", nl * o[ZIMAGE_OP_QKV].ledger_ms, 1);
    bench_add_share(r, "out", nl * o[ZIMAGE_OP_OUT].ledger_ms, 1);
    bench_add_share(r, "w1 + w3, w2", nl * (o[ZIMAGE_OP_W13].ledger_ms + o[ZIMAGE_OP_W2].ledger_ms), 1);
    bench_add_share(r, "attention", nl * cat[BENCH_CAT_ATTN], 0);
    bench_add_share(r, "elementwise (norms, QK norm + RoPE, SwiGLU, gated residuals)", nl * cat[BENCH_CAT_ELEM], 0);
    const double blocks_ledger = nl * (cat[0] + cat[1] + cat[2]);
    bench_shares_rest(r, blocks_ledger, p->fwd.med - p->blocks_dev.med,
                      "rest: refiners, embedders, modulation, final layer, host I/O",
                      "unexplained remainder (joint blocks - ledger x blocks)");
}

/* ------------------------------------------------------------------ utilization: GEMM shapes, attention */

static int gemm_shapes(bench_ctx *x, bench_gemm_shape *out, int max) {
    const bench_zimage_part *p = &x->r->zimage;
    const zimage_config *c = &p->c;
    const int64_t D = c->dim, F = c->ffn;
    const int nl = c->n_layers;
    const struct { const char *name, *tensor; int64_t K, N; int count, op, per_block, slot; } defs[] = {
        {"to_q/k/v (stacked)", NULL, D, 3 * D, nl, ZIMAGE_OP_QKV, 1, 0},
        {"to_out.0", "attention.to_out.0", D, D, nl, ZIMAGE_OP_OUT, 1, 1},
        {"w1 / w3", "feed_forward.w1", D, F, 2 * nl, ZIMAGE_OP_W13, 2, 2},
        {"w2", "feed_forward.w2", F, D, nl, ZIMAGE_OP_W2, 1, 4},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof defs / sizeof defs[0] && n < max; i++) {
        bench_gemm_shape *s = &out[n++];
        memset(s, 0, sizeof *s);
        s->name = defs[i].name;
        s->M = p->rows; s->K = defs[i].K; s->N = defs[i].N;
        s->count = defs[i].count;
        s->inmodel_op = defs[i].op;
        s->per_block = defs[i].per_block;
        s->fp8 = x->o->precision == DT_PREC_FP8;
        if (defs[i].tensor) {   /* (the stacked q/k/v has no single tensor: its ceiling uses random weights) */
            char nm[160];
            snprintf(nm, sizeof nm, "layers.0.%s", defs[i].tensor);
            if (dt_weights_linear(zimage_weights(x->zi->m), nm, -1, -1, -1, &s->src)) bench_die();
            s->have_src = 1;
        }
        for (int b = 0; b < nl && s->nw < 64; b++) {
            dt_linear *l[5];
            zimage_block_linears(x->zi->m, b, l);
            s->w[s->nw++] = l[defs[i].slot];
        }
    }
    return n;
}

static void attention(bench_ctx *x, bench_attn_shape *a) {
    const zimage_config *c = &x->r->zimage.c;
    a->hq = a->hkv = c->heads;
    a->hd = c->head_dim;
    a->bias = dt_mat_null();   /* no mask: the reference attends to its pad tokens */
    a->fp8 = x->o->attn_precision == DT_PREC_FP8;
    a->calls = c->n_layers;
    snprintf(x->r->attn_what, sizeof x->r->attn_what, "attention, %d heads, no mask", c->heads);
}

static const bench_arm_entry arms[] = {{NULL, NULL}};

/* ------------------------------------------------------------------ report: Z-Image's own sections */

static void md_head(const bench_report *r, FILE *f) {
    const bench_zimage_part *p = &r->zimage;
    const zimage_config *c = &p->c;
    const double gf = r->fwd_gflop, nl = c->n_layers;
    fprintf(f, "# ditrun bench: %s (Z-Image) on %s (%s)\n\n| setup | value |\n|---|---|\n", r->preset, r->backend, r->fmt);
    fprintf(f, "| weights | %s (%.2f GB) |\n", r->source, p->weight_gb);
    fprintf(f, "| geometry | D %d = %d heads x %d, FFN %d, %d joint + 2 x %d refiner blocks; patch %d, in %d; caption %d |\n",
            c->dim, c->heads, c->head_dim, c->ffn, c->n_layers, c->n_refiner, c->patch, c->in_channels, c->cap_dim);
    fprintf(f, "| workload | image %d px -> %d image tokens + %d caption tokens, padded to %lld joint rows |\n",
            r->image_size, r->n_img, r->n_txt, (long long)p->rows);
    fprintf(f, "| work per forward | %.1f GFLOP: joint blocks %.1f GEMM + %.1f attention, refiners %.1f, embedders/final %.1f |\n",
            gf, nl * p->gflop_block_gemm, nl * p->gflop_block_attn, p->gflop_refiners, p->gflop_other);
    bench_md_setup_end(r, f, "zimage_load");
    fprintf(f, "## Whole forward\n\n| what | median ms | p10-p90 ms | min-max ms | TFLOPS |\n|---|---:|---:|---:|---:|\n");
    bench_md_stat_row(f, "zimage_forward (wall clock incl. host I/O)", p->fwd, gf);
    if (p->blocks_dev.n) {
        char what[96];
        snprintf(what, sizeof what, "the %d joint blocks (device-only, events)", c->n_layers);
        bench_md_stat_row(f, what, p->blocks_dev, nl * (p->gflop_block_gemm + p->gflop_block_attn));
    }
    fprintf(f, "\nWarm-up (excluded): first forward %.3f ms. Output %s, max |out| %.3g.\n\n", p->fwd_warm_ms,
            p->out_finite ? "finite" : "NOT FINITE", p->out_absmax);
    bench_md_power(f, &r->power, "timed forward");
}

static void md_scaling(const bench_report *r, FILE *f) {
    bench_md_block_scaling(f, &r->zimage.scale, r->block_ledger_ms, "device-only");
}

static void json_head(const bench_report *r, FILE *f) {
    const bench_zimage_part *p = &r->zimage;
    const zimage_config *c = &p->c;
    fprintf(f, "{"); bench_jstr(f, "type", "setup"); fputc(',', f); bench_jstr(f, "model", "zimage"); fputc(',', f);
    bench_jstr(f, "preset", r->preset); fputc(',', f); bench_jstr(f, "backend", r->backend); fputc(',', f);
    bench_jstr(f, "format", r->fmt); fputc(',', f); bench_jstr(f, "weights", r->source);
    bench_jnum(f, "dim", c->dim); bench_jnum(f, "heads", c->heads); bench_jnum(f, "head_dim", c->head_dim);
    bench_jnum(f, "ffn", c->ffn); bench_jnum(f, "joint_blocks", c->n_layers); bench_jnum(f, "refiner_blocks", c->n_refiner);
    bench_jnum(f, "cap_dim", c->cap_dim); bench_jnum(f, "image_size", r->image_size); bench_jnum(f, "image_tokens", r->n_img);
    bench_jnum(f, "text_tokens", r->n_txt); bench_jnum(f, "joint_rows", (double)p->rows); bench_jnum(f, "reps", r->reps);
    bench_jnum(f, "warmup", r->warmup); bench_jnum(f, "cache_mb", r->l2_mb); bench_jnum(f, "synth_s", r->synth_s);
    bench_jnum(f, "load_s", r->load_s); bench_jnum(f, "weight_gb", p->weight_gb); bench_jnum(f, "gflop_forward", r->fwd_gflop);
    bench_jnum(f, "gflop_block_gemm", p->gflop_block_gemm); bench_jnum(f, "gflop_block_attention", p->gflop_block_attn);
    bench_jnum(f, "gflop_refiners", p->gflop_refiners); bench_jnum(f, "gflop_other", p->gflop_other);
    bench_jnum(f, "peak_tflops", r->peak_tflops); bench_jnum(f, "bench_s", r->total_s); bench_jnum(f, "mem_peak_gb", r->mem_peak_gb);
    fprintf(f, "}\n");
    bench_json_power(f, &r->power);
    const char *fn[2] = {"zimage_forward", "joint blocks"};
    const bench_stat *fs[2] = {&p->fwd, &p->blocks_dev};
    for (int i = 0; i < 2; i++) {
        fprintf(f, "{"); bench_jstr(f, "type", "forward"); fputc(',', f); bench_jstr(f, "name", fn[i]);
        bench_jstat(f, "t", *fs[i]);
        bench_jnum(f, "tflops", bench_tflops(i ? c->n_layers * (p->gflop_block_gemm + p->gflop_block_attn) : r->fwd_gflop, fs[i]->med));
        if (i == 0) { bench_jnum(f, "warmup_ms", p->fwd_warm_ms); bench_jnum(f, "out_absmax", p->out_absmax); bench_jnum(f, "finite", p->out_finite); }
        fprintf(f, "}\n");
    }
}

static void json_scaling(const bench_report *r, FILE *f) { bench_json_block_scaling(f, &r->zimage.scale, r->block_ledger_ms); }

const bench_family bench_zimage_family = {
    .name = "Z-Image",
    .family = &dt_family_zimage,
    .setup = setup,
    .whole_forward = whole_forward,
    .release = release,
    .block_kind = "joint block",
    .ledger_note = "The scale and tanh gate of the adaLN modulation are folded into the RMSNorm weights on the host once "
                   "per forward, so the norms are plain RMSNorms here; with fp8 Linears the attention and FFN norms run "
                   "inside the q/k/v and w1 + w3 ops (rmsnorm_mod_linears: the norm writes the fp8 GEMMs' input once), "
                   "so those rows hold them and the norm rows are empty.",
    .n_ops = ZIMAGE_OP_COUNT,
    .ops = block_ops,
    .op_qknorm = -1,   /* QK norm and RoPE are one op (head_norm_rope) */
    .op_rope = -1,
    .hints = 0,
    .blocks = n_blocks,
    .block_bytes = block_bytes,
    .op = block_op,
    .stream = stream,
    .op_work = op_work,
    .scaling = scaling,
    .shares = shares,
    .gemm_shapes = gemm_shapes,
    .attention = attention,
    .arms = arms,
    .md_head = md_head,
    .md_scaling = md_scaling,
    .json_head = json_head,
    .json_scaling = json_scaling,
};
