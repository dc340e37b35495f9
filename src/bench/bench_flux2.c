/* bench_flux2.c — FLUX.2-klein as the bench drives it (bench_flux2_family, the interface of bench_internal.h):
 * geometry from a preset + overrides or the checkpoint, synthetic checkpoints (bf16/q4/q8, or f32 converted from
 * bf16), the whole forward (flux2_forward against the replica of bench_model.c, interleaved, outputs compared),
 * the single-stream block's ops for the ledger, block-count scaling over (double, single) blocks, the step's
 * shares, the GEMM shapes of the utilization table, and FLUX.2's own report sections. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_internal.h"
#include "core/infile.h"
#include "core/outfile.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "pipeline/latents.h"
#include "synth/synth_dit.h"

/* ------------------------------------------------------------------ checkpoint, geometry, inputs */

/* f32 copy of a bf16 checkpoint (flux2_synth_write writes bf16 or quantized only). */
static int write_f32_copy(const char *src_dir, const char *dst_dir) {
    if (mkdir(dst_dir, 0755) && errno != EEXIST) { dt_set_error("%s: cannot create folder (%s)", dst_dir, strerror(errno)); return -1; }
    char p[4200], q[4200];
    snprintf(p, sizeof p, "%s/config.json", src_dir);
    snprintf(q, sizeof q, "%s/config.json", dst_dir);
    FILE *fi = dt_fopen_input(p);   /* a small file, copied whole */
    if (!fi) return -1;
    char buf[65536];
    size_t k = fread(buf, 1, sizeof buf, fi);
    fclose(fi);
    if (k == sizeof buf) { dt_set_error("%s: larger than %zu bytes", p, sizeof buf); return -1; }
    if (dt_write_file(q, buf, k)) return -1;
    dt_weights *w = dt_weights_open(src_dir);
    if (!w) return -1;
    snprintf(q, sizeof q, "%s/model.safetensors", dst_dir);
    st_stream *s = st_stream_open(q);
    if (!s) { dt_weights_close(w); return -1; }
    size_t n = dt_weights_count(w);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = dt_weights_at(w, i);
        st_stream_declare(s, t->name, DT_F32, t->ndim, t->shape);
    }
    int rc = st_stream_begin_data(s);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const st_tensor *t = dt_weights_at(w, i);
        float *f = dt_malloc(sizeof(float) * (t->numel ? t->numel : 1));
        if (dt_convert_to_f32(f, t->data, t->dtype, (size_t)t->numel)) { dt_set_error("%s: not a float tensor", t->name); rc = -1; }
        if (rc == 0) rc = st_stream_write(s, f, sizeof(float) * t->numel);
        free(f);
    }
    if (st_stream_close(s) && rc == 0) rc = -1;
    dt_weights_close(w);
    return rc;
}

static int group_of(const bench_ctx *x) {
    const flux2_config *c = &x->r->flux2.c;
    return x->o->group > 0 ? x->o->group : c->joint_dim % 64 || c->in_channels % 64 ? 32 : 64;
}

static int write_checkpoint(bench_ctx *x, const char *dir) {
    const flux2_config *c = &x->r->flux2.c;
    int f = x->o->format;
    if (f != BENCH_FMT_F32)
        return flux2_synth_write(c, dir, f == BENCH_FMT_Q4 ? 4 : f == BENCH_FMT_Q8 ? 8 : 0, group_of(x), x->o->seed);
    char bdir[1600];
    snprintf(bdir, sizeof bdir, "%s.bf16", dir);
    bench_progress("(f32: written as bf16 in %s, then converted)", bdir);
    int track = dt_temp_track(bdir, 1);   /* an interrupt removes it */
    int rc = flux2_synth_write(c, bdir, 0, 64, x->o->seed);
    if (rc == 0) rc = write_f32_copy(bdir, dir);
    bench_remove_checkpoint(bdir);
    dt_temp_forget(track);
    return rc;
}

static int resolve_geometry(const bench_opts *o, flux2_config *c) {
    if (flux2_preset(o->preset, c)) return -1;
    if (o->heads > 0) {
        if (o->hidden <= 0) c->hidden = o->heads * c->head_dim;
        c->heads = o->heads;
    }
    if (o->hidden > 0) c->hidden = o->hidden;
    if (c->hidden % c->heads) { dt_set_error("bench: hidden size %d is not a multiple of %d heads", c->hidden, c->heads); return -1; }
    double ratio = o->mlp_ratio > 0 ? o->mlp_ratio : (double)c->mlp_hidden / (c->heads * c->head_dim);
    c->head_dim = c->hidden / c->heads;
    if (c->head_dim % 8) { dt_set_error("bench: head dim %d (hidden/heads) must be a multiple of 8 (4 RoPE axes of even size)", c->head_dim); return -1; }
    c->n_axes = 4;
    for (int a = 0; a < 4; a++) c->axes[a] = c->head_dim / 4;
    c->mlp_hidden = (int)(c->hidden * ratio);
    if (o->n_double >= 0) c->num_layers = o->n_double;
    if (o->n_single >= 0) c->num_single_layers = o->n_single;
    return 0;
}

static void make_ids(int na, int h, int w, int t, float *img_ids, float *txt_ids) {
    if (na == 4) {
        dt_latents_img_ids(h, w, 0.0f, img_ids);
        dt_latents_txt_ids(t, txt_ids);
        return;
    }
    memset(img_ids, 0, sizeof(float) * (size_t)h * w * na);
    memset(txt_ids, 0, sizeof(float) * (size_t)t * na);
    for (int r = 0; r < h; r++)
        for (int c = 0; c < w; c++) {
            float *id = img_ids + (size_t)(r * w + c) * na;
            if (na > 1) id[1] = (float)r;
            if (na > 2) id[2] = (float)c;
        }
    for (int l = 0; l < t; l++) txt_ids[(size_t)l * na + na - 1] = (float)l;
}

static int setup(bench_ctx *x) {
    const bench_opts *o = x->o;
    bench_report *r = x->r;
    bench_flux2_part *p = &r->flux2;
    if (x->cfg) {
        if (flux2_config_parse(x->cfg, x->cfg_path, &p->c)) return -1;
    } else {
        if (resolve_geometry(o, &p->c)) return -1;
        const flux2_config *c = &p->c;
        char key[256];
        snprintf(key, sizeof key, "flux2-D%d-H%d-hd%d-d%d-s%d-F%d-in%d-j%d-%s", c->hidden, c->heads, c->head_dim,
                 c->num_layers, c->num_single_layers, c->mlp_hidden, c->in_channels, c->joint_dim, bench_fmt_name(o->format));
        if (o->format == BENCH_FMT_Q4 || o->format == BENCH_FMT_Q8) {
            size_t l = strlen(key);
            snprintf(key + l, sizeof key - l, "-g%d", group_of(x));
        }
        if (!(x->dir = bench_checkpoint(x, key, write_checkpoint))) return -1;
        snprintf(r->source, sizeof r->source, "synthetic (%s)", x->dir);
        snprintf(r->preset, sizeof r->preset, "%s", o->preset);
    }
    snprintf(r->precision, sizeof r->precision, "Linears %s, attention %s", o->precision == DT_PREC_FP8 ? "fp8" : "bf16",
             o->attn_precision == DT_PREC_FP8 ? "fp8" : "bf16");   /* (bm_load sets the replica's, as flux2_load) */
    const flux2_config *c = &p->c;

    /* workload: the options, else per-backend defaults; a real-geometry forward costs ~8 GFLOP per token on a CPU
     * doing ~15-30 GFLOPS: keep it short there */
    int is_tiny = c->hidden <= 512;
    const bench_workload_base cpu_dflt = {is_tiny ? 128 : 64, 16, is_tiny ? 5 : 2, is_tiny ? 1 : 0};
    if (bench_workload(x, &cpu_dflt, is_tiny ? 64 : 32)) return -1;
    p->kv_heads = o->kv_heads > 0 ? o->kv_heads : (c->heads % 4 == 0 ? c->heads / 4 : c->heads % 2 == 0 ? c->heads / 2 : c->heads);
    if (c->heads % p->kv_heads) { dt_set_error("bench: --kv-heads %d does not divide %d heads", p->kv_heads, c->heads); return -1; }
    bm_flops fl;
    bm_count_flops(c, x->n, x->t, &fl);
    p->gflop_gemm = fl.total_gemm;
    p->gflop_attn = fl.total_attn;
    r->fwd_gflop = fl.total_gemm + fl.total_attn;
    bench_progress("%s on %s: D %d, %d heads x %d, %d double + %d single blocks, F %d; %d image + %d text tokens; "
                   "%.1f GFLOP per forward", r->preset, r->backend, c->hidden, c->heads, c->head_dim, c->num_layers,
                   c->num_single_layers, c->mlp_hidden, x->n, x->t, r->fwd_gflop);

    /* inputs (random, never zeros) */
    x->img = dt_malloc(sizeof(float) * (size_t)x->n * c->in_channels);
    x->txt = dt_malloc(sizeof(float) * ((size_t)x->t * c->joint_dim + 1));
    x->img_ids = dt_malloc(sizeof(float) * (size_t)x->n * c->n_axes);
    x->txt_ids = dt_malloc(sizeof(float) * ((size_t)x->t * c->n_axes + 1));
    dt_randn(o->seed, 1, 0, x->img, (size_t)x->n * c->in_channels);
    dt_randn(o->seed, 2, 0, x->txt, (size_t)x->t * c->joint_dim);
    make_ids(c->n_axes, x->h, x->w, x->t, x->img_ids, x->txt_ids);
    return 0;
}

static void release(bench_ctx *x) {
    if (x->bm) bm_free(x->bm);
    x->bm = NULL;
    free(x->img); free(x->txt); free(x->img_ids); free(x->txt_ids);
    x->img = x->txt = x->img_ids = x->txt_ids = NULL;
}

/* ------------------------------------------------------------------ whole forward */

static int whole_forward(bench_ctx *x) {
    bench_report *r = x->r;
    bench_flux2_part *p = &r->flux2;
    dt_backend *be = x->be;
    const flux2_config *c = &p->c;
    bench_progress("loading %s with flux2_load ...", x->dir);
    double t0 = dt_now();
    const flux2_load_opts lo = {.precision = x->o->precision, .attn_precision = x->o->attn_precision};
    flux2_model *fm = flux2_load_ex(be, x->dir, &lo);
    if (!fm) return -1;
    size_t bytes;
    flux2_weight_info(fm, &bytes, r->fmt, sizeof r->fmt);
    if (x->o->format == BENCH_FMT_F32 && !x->o->model_dir) snprintf(r->fmt, sizeof r->fmt, "f32");
    r->load_s = dt_now() - t0;
    bench_progress("loaded (%.1f s, %.2f GB of weights, %s); loading the bench replica ...", r->load_s, bytes / 1e9, r->fmt);
    x->bm = bm_load(be, x->o, x->dir, -1, -1, 1, 0);
    if (!x->bm) { flux2_free(fm); return -1; }
    bm_alloc(x->bm, x->n, x->t, x->img_ids, x->txt_ids);
    bm_inputs(x->bm, x->img, x->txt, 0.5f);

    size_t no = (size_t)x->n * c->out_channels;
    float *out_m = dt_malloc(sizeof(float) * no), *out_r = dt_malloc(sizeof(float) * no);
    bench_timer tm;
    bench_timer_init(&tm, be);
    /* warm-up (first calls: buffer allocation, RoPE tables, library handles), reported apart */
    /* at least one warm-up call of each, also with --warmup 0: the first call allocates */
    bench_progress("whole forward: warm-up (%d) ...", x->warmup > 0 ? x->warmup : 1);
    for (int i = 0; i < (x->warmup > 0 ? x->warmup : 1); i++) {
        bench_sync_or_die(be);
        double w0 = dt_now();
        if (flux2_forward(fm, x->img, x->n, x->txt, x->t, 0.5f, x->img_ids, x->txt_ids, out_m, NULL, NULL)) {
            bench_timer_free(&tm); flux2_free(fm); free(out_m); free(out_r);
            return -1;
        }
        double w1 = (dt_now() - w0) * 1e3, w2 = 0;
        if (x->warmup > 0) {   /* with --warmup 0 the replica's first timed run is not preceded by one */
            bench_timer_start(&tm);
            bm_forward(x->bm, c->num_layers, c->num_single_layers);
            w2 = bench_timer_stop(&tm);
        }
        if (i == 0) { p->fwd_model_warm_ms = w1; p->fwd_dev_warm_ms = w2; }
    }
    /* interleaved: flux2_forward (wall clock incl. uploads/download) and the device-only replica */
    double *sm = dt_malloc(sizeof(double) * x->reps), *sd = dt_malloc(sizeof(double) * x->reps);
    dt_power_acc pw;
    dt_power_begin(&pw, be, x->reps);
    for (int i = 0; i < x->reps; i++) {
        bench_progress("whole forward: rep %d/%d", i + 1, x->reps);
        bench_sync_or_die(be);
        double w0 = dt_now();
        if (flux2_forward(fm, x->img, x->n, x->txt, x->t, 0.5f, x->img_ids, x->txt_ids, out_m, NULL, NULL)) {
            bench_timer_free(&tm); flux2_free(fm); free(out_m); free(out_r); free(sm); free(sd);
            dt_power_end(&pw);
            return -1;
        }
        sm[i] = (dt_now() - w0) * 1e3;
        bench_timer_start(&tm);
        bm_forward(x->bm, c->num_layers, c->num_single_layers);
        sd[i] = bench_timer_stop(&tm);
        dt_power_add(&pw);
    }
    r->power = dt_power_end(&pw);
    p->fwd_model = bench_stats(sm, x->reps);
    p->fwd_dev = bench_stats(sd, x->reps);
    r->fwd_ms = r->floor_ms = p->fwd_dev.med;
    snprintf(r->fwd_what, sizeof r->fwd_what, "whole forward");
    snprintf(r->floor_what, sizeof r->floor_what, "Device-only forward");

    be->download(be, out_r, x->bm->x.out);
    p->fwd_maxdiff = bench_max_abs_diff(out_r, out_m, no);
    p->fwd_absmax = bench_max_abs(out_m, no);
    bench_timer_free(&tm);
    flux2_free(fm);
    free(out_m); free(out_r); free(sm); free(sd);
    if (!(p->fwd_maxdiff <= 1e-3 * (p->fwd_absmax > 1 ? p->fwd_absmax : 1)))
        bench_note(r, "WARNING: the bench replica's output differs from flux2_forward by %.3g (max |out| %.3g): "
                   "the ledger may not describe the model's forward", p->fwd_maxdiff, p->fwd_absmax);
    return 0;
}

/* ------------------------------------------------------------------ the ledger's block: a single-stream block */

static const bench_op_desc single_ops[FLUX2_SB_COUNT] = {
    {"adaLN norm (layernorm_mod)", BENCH_CAT_ELEM},
    {"proj GEMM (qkv+mlp_in)", BENCH_CAT_GEMM},
    {"QK norm", BENCH_CAT_ELEM},
    {"RoPE", BENCH_CAT_ELEM},
    {"attention", BENCH_CAT_ATTN},
    {"MLP activation (SwiGLU)", BENCH_CAT_ELEM},
    {"out GEMM (attn+mlp out)", BENCH_CAT_GEMM},
    {"gated residual", BENCH_CAT_ELEM},
};

static int n_blocks(bench_ctx *x) { return x->bm->ns; }

static double block_bytes(bench_ctx *x) {
    dt_linear_src s1, s2;
    if (dt_weights_linear(x->bm->w, "single_transformer_blocks.0.attn.to_qkv_mlp_proj", -1, -1, -1, &s1) == 0 &&
        dt_weights_linear(x->bm->w, "single_transformer_blocks.0.attn.to_out", -1, -1, -1, &s2) == 0)
        return (double)(bench_src_bytes(&s1) + bench_src_bytes(&s2));
    return 0;
}

static void block_op(bench_ctx *x, int b, int k, int split) { bm_single_op(x->bm, b, k, split); }

static dt_mat stream(bench_ctx *x) { return x->bm->x.s; }

static void op_work(bench_ctx *x, bench_op *ops) {
    bench_report *r = x->r;
    const flux2_config *c = &r->flux2.c;
    bm_flops fl;
    bm_count_flops(c, x->n, x->t, &fl);
    ops[FLUX2_SB_PROJ].gflop = fl.single_proj;
    ops[FLUX2_SB_OUT].gflop = fl.single_out;
    ops[FLUX2_SB_ATTN].gflop = fl.single_attn;
    /* least traffic of the elementwise ops (each input read once, each output written once) */
    double es = (double)dt_dtype_size(x->be->act_dtype), Lr = (double)x->n + x->t;
    ops[FLUX2_SB_NORM].gbytes = 2 * Lr * c->hidden * es * 1e-9;              /* s -> a */
    ops[FLUX2_SB_QKNORM].gbytes = 4 * Lr * c->hidden * es * 1e-9;            /* Q and K in place */
    ops[FLUX2_SB_ACT].gbytes = 3 * Lr * c->mlp_hidden * es * 1e-9;           /* gate, up -> out */
    ops[FLUX2_SB_RESID].gbytes = 3 * Lr * c->hidden * es * 1e-9;             /* s, y -> s */
    if (x->bm->ns == 0)
        bench_note(r, "no single blocks: the per-op ledger is empty; double blocks are reported as a whole");
    else if (x->bm->c.fuse_inputs)
        bench_note(r, "ledger: with --precision fp8 the adaLN norm runs inside the projection op (norm_linear) and the "
                   "SwiGLU inside the output op (act_linear_gated), so their own rows read ~0 and the GEMM rows carry "
                   "them (the f8fuse arm times them apart)");
}

/* Block-count scaling of the device-only forward: 0 double + 0 single blocks (embedders and final layer), all
 * doubles + {0, S/4, S/2} singles (S itself is the whole forward, measured already); the slope is the in-forward
 * cost of a single block. */
typedef struct { bm_model *bm; const int *nd, *ns; } scale_pts;
static void scale_run(void *ud, int p) {
    scale_pts *s = ud;
    bm_forward(s->bm, s->nd[p], s->ns[p]);
}

static void scaling(bench_ctx *x) {
    bench_report *r = x->r;
    bench_flux2_part *p = &r->flux2;
    int nd = p->c.num_layers, ns = p->c.num_single_layers;
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
    bench_stat st[8];
    scale_pts sp = {x->bm, pts_nd, pts_ns};
    bench_time_points(x, np, NULL, scale_run, &sp, st);
    p->n_scale = 0;
    for (int i = 0; i < np; i++) p->scale[p->n_scale++] = (bench_scale){pts_nd[i], pts_ns[i], st[i]};
    if (!(np && pts_nd[np - 1] == nd && pts_ns[np - 1] == ns)) p->scale[p->n_scale++] = (bench_scale){nd, ns, p->fwd_dev};
    /* embedders + final layer; double blocks; least-squares slope over the points with all doubles */
    p->embed_ms = p->scale[0].t.med;
    double t_nd0 = p->embed_ms, xs[8], ys[8];
    int m = 0;
    for (int i = 0; i < p->n_scale; i++) {
        if (p->scale[i].nd == nd && p->scale[i].ns == 0) t_nd0 = p->scale[i].t.med;
        if (p->scale[i].nd != nd) continue;
        xs[m] = p->scale[i].ns;
        ys[m++] = p->scale[i].t.med;
    }
    p->double_ms = nd > 0 ? (t_nd0 - p->embed_ms) / nd : 0;
    p->single_slope_ms = bench_slope(xs, ys, m);
}

/* Shares of the device-only forward: GEMMs, attention, elementwise (from the single-block ledger, times the number
 * of blocks, doubles counted as single-block equivalents), the double blocks' extra work over that, embedders +
 * final layer, and the unexplained remainder, summing to 100 %. */
static void shares(bench_ctx *x) {
    bench_report *r = x->r;
    const bench_flux2_part *p = &r->flux2;
    int nd = p->c.num_layers, ns = p->c.num_single_layers;
    r->total_ms = p->fwd_dev.med;
    snprintf(r->shares_of, sizeof r->shares_of, "device-only forward");
    snprintf(r->shares_how, sizeof r->shares_how, "blocks scaled by count (double blocks as single-block equivalents "
             "plus their extra).");
    double nb = ns > 0 ? ns + nd : 0;   /* blocks counted at the single-block ledger's cost */
    double cat[3];
    bench_ledger_by_cat(r, cat);
    double gemm = nb * cat[BENCH_CAT_GEMM], attn = nb * cat[BENCH_CAT_ATTN], elem = nb * cat[BENCH_CAT_ELEM];
    double dbl_extra = nd > 0 ? nd * p->double_ms - (ns > 0 ? nd * r->block_ledger_ms : 0) : 0;
    const bench_op *o = r->ops;
    bench_add_share(r, "fused projection + output GEMMs", gemm, 0);
    bench_add_share(r, "attention", attn, 0);
    bench_add_share(r, "elementwise (norms, RoPE, activation, residual; splits/copies are views)", elem, 0);
    if (ns > 0) {
        bench_add_share(r, "norms: adaLN + QK norm", nb * (o[FLUX2_SB_NORM].ledger_ms + o[FLUX2_SB_QKNORM].ledger_ms), 1);
        bench_add_share(r, "RoPE", nb * o[FLUX2_SB_ROPE].ledger_ms, 1);
        bench_add_share(r, "activation (SwiGLU)", nb * o[FLUX2_SB_ACT].ledger_ms, 1);
        bench_add_share(r, "gated residual", nb * o[FLUX2_SB_RESID].ledger_ms, 1);
    }
    bench_add_share(r, "double blocks' extra (text stream, separate GEMMs) over single-block cost", dbl_extra, 0);
    bench_add_share(r, "embedders, timestep/modulation, final layer", p->embed_ms, 0);
    r->remainder_ms = r->total_ms - (gemm + attn + elem + dbl_extra + p->embed_ms);
    r->remainder_share = r->total_ms > 0 ? 100.0 * r->remainder_ms / r->total_ms : 0;
    bench_add_share(r, "unexplained remainder", r->remainder_ms, 0);
}

/* ------------------------------------------------------------------ utilization: GEMM shapes, attention */

typedef struct {
    const char *name;
    int64_t M, K, N;
    int count;
    const char *pat;        /* tensor name pattern with %d for the block, a plain name, or "@to_qkv" / "@add_qkv" */
    int per_double, per_single;
    int inmodel_op;         /* ledger op, or -1 */
} shape_def;

/* The replica's Linear for tensor name nm of block b. */
static dt_linear *linear_of(bm_model *bm, const shape_def *g, int b, const char *nm) {
    if (g->per_single) return strstr(nm, "to_qkv") ? bm->sb[b].qkv_mlp : bm->sb[b].out;   /* NULL when split */
    if (g->per_double) {
        const bm_double *d = &bm->db[b];
        const char *suf = strchr(strchr(nm, '.') + 1, '.') + 1;
        if (!strcmp(suf, "attn.to_out.0")) return d->w.to_out;
        if (!strcmp(suf, "attn.to_add_out")) return d->w.to_add_out;
        if (!strcmp(suf, "ff.linear_in")) return d->w.ff_in;
        if (!strcmp(suf, "ff.linear_out")) return d->w.ff_out;
        if (!strcmp(suf, "ff_context.linear_in")) return d->w.ffc_in;
        if (!strcmp(suf, "ff_context.linear_out")) return d->w.ffc_out;
        return NULL;
    }
    if (!strcmp(nm, "x_embedder")) return bm->ow.x_emb;
    if (!strcmp(nm, "context_embedder")) return bm->ow.ctx_emb;
    if (!strcmp(nm, "proj_out")) return bm->ow.proj_out;
    return NULL;
}

/* The replica's Linears of a shape (borrowed, distinct weights) and the first one's host source (converted to f32
 * like the replica's Linears with the f32 format; the conversion lives until release_conv). */
static void fill_shape(bench_ctx *x, const shape_def *g, bench_gemm_shape *s) {
    bm_model *bm = x->bm;
    memset(s, 0, sizeof *s);
    s->name = g->name;
    s->M = g->M; s->K = g->K; s->N = g->N;
    s->count = g->count;
    s->inmodel_op = g->inmodel_op;
    s->per_block = 1;
    /* the ceiling in the model's own precision: with --precision fp8 the blocks' Linears are fp8, the embedders and
     * proj_out stay bf16 */
    s->fp8 = x->o->precision == DT_PREC_FP8 && (g->per_single || g->per_double);
    int nb = g->per_double ? bm->nd : g->per_single ? bm->ns : 1;
    char nm[256];
    for (int b = 0; b < nb; b++) {
        if (g->pat[0] == '@') {   /* the replica's stacked Q/K/V Linears */
            int img = !strcmp(g->pat, "@to_qkv");
            if (!s->have_src) { s->src = img ? bm->db[b].to_qkv_src : bm->db[b].add_qkv_src; s->have_src = 1; }
            if (s->nw < 64) s->w[s->nw++] = img ? bm->db[b].w.to_qkv : bm->db[b].w.add_qkv;
            continue;
        }
        snprintf(nm, sizeof nm, g->pat, b);
        if (!s->have_src) {
            if (dt_weights_linear(bm->w, nm, -1, -1, -1, &s->src) != 0) return;
            s->have_src = 1;
        }
        dt_linear *l = linear_of(bm, g, b, nm);
        if (l && s->nw < 64) s->w[s->nw++] = l;
    }
}

static int gemm_shapes(bench_ctx *x, bench_gemm_shape *out, int max) {
    const flux2_config *c = &x->r->flux2.c;
    int64_t D = c->hidden, F = c->mlp_hidden, N = x->n, T = x->t, L = N + T;
    int nd = c->num_layers, ns = c->num_single_layers;
    const shape_def defs[] = {
        {"single: qkv+mlp_in proj", L, D, 3 * D + 2 * F, ns, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", 0, 1, FLUX2_SB_PROJ},
        {"single: attn+mlp out", L, D + F, D, ns, "single_transformer_blocks.%d.attn.to_out", 0, 1, FLUX2_SB_OUT},
        {"double img: qkv (stacked)", N, D, 3 * D, nd, "@to_qkv", 1, 0, -1},
        {"double img: out", N, D, D, nd, "transformer_blocks.%d.attn.to_out.0", 1, 0, -1},
        {"double img: mlp in", N, D, 2 * F, nd, "transformer_blocks.%d.ff.linear_in", 1, 0, -1},
        {"double img: mlp out", N, F, D, nd, "transformer_blocks.%d.ff.linear_out", 1, 0, -1},
        {"double txt: qkv (stacked)", T, D, 3 * D, nd, "@add_qkv", 1, 0, -1},
        {"double txt: out", T, D, D, nd, "transformer_blocks.%d.attn.to_add_out", 1, 0, -1},
        {"double txt: mlp in", T, D, 2 * F, nd, "transformer_blocks.%d.ff_context.linear_in", 1, 0, -1},
        {"double txt: mlp out", T, F, D, nd, "transformer_blocks.%d.ff_context.linear_out", 1, 0, -1},
        {"x_embedder", N, c->in_channels, D, 1, "x_embedder", 0, 0, -1},
        {"context_embedder", T, c->joint_dim, D, 1, "context_embedder", 0, 0, -1},
        {"proj_out", N, D, c->out_channels, 1, "proj_out", 0, 0, -1},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof defs / sizeof defs[0] && n < max; i++)
        if (defs[i].M > 0 && defs[i].count > 0) fill_shape(x, &defs[i], &out[n++]);
    return n;
}

static void attention(bench_ctx *x, bench_attn_shape *a) {
    const flux2_config *c = &x->r->flux2.c;
    a->hq = a->hkv = c->heads;
    a->hd = c->head_dim;
    a->bias = dt_mat_null();
    a->fp8 = x->bm->c.attn_fp8 && x->be->attention_fp8;   /* the model's attention (fp8 with --attn-precision fp8) */
    a->calls = c->num_layers + c->num_single_layers;
    snprintf(x->r->attn_what, sizeof x->r->attn_what, "attention%s", a->fp8 ? " fp8" : "");
}

/* ------------------------------------------------------------------ report: FLUX.2's own sections */

static void md_head(const bench_report *r, FILE *f) {
    const bench_flux2_part *p = &r->flux2;
    const flux2_config *c = &p->c;
    fprintf(f, "# ditrun bench: %s on %s (%s)\n\n", r->preset, r->backend, r->fmt);
    fprintf(f, "| setup | value |\n|---|---|\n");
    fprintf(f, "| weights | %s |\n", r->source);
    if (r->precision[0]) fprintf(f, "| DiT blocks' precision | %s |\n", r->precision);
    fprintf(f, "| geometry | D %d = %d heads x %d, F %d, %d double + %d single blocks, in %d, joint %d |\n", c->hidden,
            c->heads, c->head_dim, c->mlp_hidden, c->num_layers, c->num_single_layers, c->in_channels, c->joint_dim);
    fprintf(f, "| workload | image %d px -> %d image tokens + %d text tokens = %d |\n", r->image_size, r->n_img, r->n_txt,
            r->n_img + r->n_txt);
    fprintf(f, "| work per forward | %.1f GFLOP GEMM + %.1f GFLOP attention |\n", p->gflop_gemm, p->gflop_attn);
    bench_md_setup_end(r, f, "flux2_load");

    double gf = r->fwd_gflop;
    fprintf(f, "## Whole forward\n\n| what | median ms | p10-p90 ms | min-max ms | TFLOPS |\n|---|---:|---:|---:|---:|\n");
    fprintf(f, "| flux2_forward (in-model, wall clock incl. host uploads/download) | %.3f | %.3f-%.3f | %.3f-%.3f | %.3f |\n",
            p->fwd_model.med, p->fwd_model.p10, p->fwd_model.p90, p->fwd_model.min, p->fwd_model.max, bench_tflops(gf, p->fwd_model.med));
    fprintf(f, "| bench replica (device-only, same ops, events) | %.3f | %.3f-%.3f | %.3f-%.3f | %.3f |\n\n", p->fwd_dev.med,
            p->fwd_dev.p10, p->fwd_dev.p90, p->fwd_dev.min, p->fwd_dev.max, bench_tflops(gf, p->fwd_dev.med));
    char wr[48];
    if (p->fwd_dev_warm_ms > 0) snprintf(wr, sizeof wr, "%.3f ms", p->fwd_dev_warm_ms);
    else snprintf(wr, sizeof wr, "not run (--warmup 0)");
    fprintf(f, "Warm-up (excluded): first flux2_forward %.3f ms, first replica forward %s. "
               "Replica vs flux2_forward: max |diff| %.3g (max |out| %.3g).\n\n",
            p->fwd_model_warm_ms, wr, p->fwd_maxdiff, p->fwd_absmax);
    bench_md_power(f, &r->power, "timed pair");
}

static void md_scaling(const bench_report *r, FILE *f) {
    const bench_flux2_part *p = &r->flux2;
    if (!p->n_scale) return;
    fprintf(f, "## Ledger: block-count scaling (device-only forward)\n\n| double blocks | single blocks | median ms | p10-p90 ms |\n"
               "|---:|---:|---:|---:|\n");
    for (int i = 0; i < p->n_scale; i++)
        fprintf(f, "| %d | %d | %.3f | %.3f-%.3f |\n", p->scale[i].nd, p->scale[i].ns, p->scale[i].t.med,
                p->scale[i].t.p10, p->scale[i].t.p90);
    fprintf(f, "\nPer single block: %.4f ms in the forward (slope) vs %.4f ms from the prefix ledger; per double block "
               "%.4f ms; embedders + timestep/modulation + final layer %.4f ms.\n\n",
            p->single_slope_ms, r->block_ledger_ms, p->double_ms, p->embed_ms);
}

static void json_head(const bench_report *r, FILE *f) {
    const bench_flux2_part *p = &r->flux2;
    const flux2_config *c = &p->c;
    double gf = r->fwd_gflop;
    fprintf(f, "{");
    bench_jstr(f, "type", "setup"); fputc(',', f); bench_jstr(f, "model", "flux2"); fputc(',', f);
    bench_jstr(f, "preset", r->preset); fputc(',', f); bench_jstr(f, "backend", r->backend);
    fputc(',', f); bench_jstr(f, "format", r->fmt); fputc(',', f); bench_jstr(f, "weights", r->source);
    fputc(',', f); bench_jstr(f, "precision", r->precision);
    bench_jnum(f, "hidden", c->hidden); bench_jnum(f, "heads", c->heads); bench_jnum(f, "head_dim", c->head_dim); bench_jnum(f, "kv_heads", p->kv_heads);
    bench_jnum(f, "mlp_hidden", c->mlp_hidden); bench_jnum(f, "double_blocks", c->num_layers); bench_jnum(f, "single_blocks", c->num_single_layers);
    bench_jnum(f, "image_size", r->image_size); bench_jnum(f, "image_tokens", r->n_img); bench_jnum(f, "text_tokens", r->n_txt);
    bench_jnum(f, "reps", r->reps); bench_jnum(f, "warmup", r->warmup); bench_jnum(f, "cache_mb", r->l2_mb); bench_jnum(f, "synth_s", r->synth_s);
    bench_jnum(f, "load_s", r->load_s); bench_jnum(f, "gflop_gemm", p->gflop_gemm); bench_jnum(f, "gflop_attention", p->gflop_attn);
    bench_jnum(f, "peak_tflops", r->peak_tflops); bench_jnum(f, "bench_s", r->total_s);
    bench_jnum(f, "mem_peak_gb", r->mem_peak_gb);
    fprintf(f, "}\n");
    fprintf(f, "{"); bench_jstr(f, "type", "forward"); fputc(',', f); bench_jstr(f, "name", "flux2_forward"); fputc(',', f);
    bench_jstr(f, "scope", "in-model, wall clock incl. host I/O");
    bench_jstat(f, "t", p->fwd_model); bench_jnum(f, "warmup_ms", p->fwd_model_warm_ms); bench_jnum(f, "tflops", bench_tflops(gf, p->fwd_model.med));
    fprintf(f, "}\n");
    fprintf(f, "{"); bench_jstr(f, "type", "forward"); fputc(',', f); bench_jstr(f, "name", "replica"); fputc(',', f);
    bench_jstr(f, "scope", "device-only, events");
    bench_jstat(f, "t", p->fwd_dev); bench_jnum(f, "warmup_ms", p->fwd_dev_warm_ms); bench_jnum(f, "tflops", bench_tflops(gf, p->fwd_dev.med));
    bench_jnum(f, "maxdiff_vs_model", p->fwd_maxdiff); bench_jnum(f, "model_absmax", p->fwd_absmax);
    fprintf(f, "}\n");
    bench_json_power(f, &r->power);
}

static void json_scaling(const bench_report *r, FILE *f) {
    const bench_flux2_part *p = &r->flux2;
    for (int i = 0; i < p->n_scale; i++) {
        fprintf(f, "{"); bench_jstr(f, "type", "scale"); bench_jnum(f, "double_blocks", p->scale[i].nd); bench_jnum(f, "single_blocks", p->scale[i].ns);
        bench_jstat(f, "t", p->scale[i].t);
        fprintf(f, "}\n");
    }
    if (p->n_scale) {
        fprintf(f, "{"); bench_jstr(f, "type", "blocks"); bench_jnum(f, "single_slope_ms", p->single_slope_ms);
        bench_jnum(f, "single_ledger_ms", r->block_ledger_ms); bench_jnum(f, "double_ms", p->double_ms); bench_jnum(f, "embed_final_ms", p->embed_ms);
        fprintf(f, "}\n");
    }
}

const bench_family bench_flux2_family = {
    .name = "FLUX.2",
    .family = &dt_family_klein,
    .setup = setup,
    .whole_forward = whole_forward,
    .release = release,
    .block_kind = "single block",
    .ledger_note = NULL,
    .n_ops = FLUX2_SB_COUNT,
    .ops = single_ops,
    .op_qknorm = FLUX2_SB_QKNORM,
    .op_rope = FLUX2_SB_ROPE,
    .hints = 1,
    .blocks = n_blocks,
    .block_bytes = block_bytes,
    .op = block_op,
    .stream = stream,
    .op_work = op_work,
    .scaling = scaling,
    .shares = shares,
    .gemm_shapes = gemm_shapes,
    .attention = attention,
    .arms = bench_flux2_arms,
    .md_head = md_head,
    .md_scaling = md_scaling,
    .json_head = json_head,
    .json_scaling = json_scaling,
};
