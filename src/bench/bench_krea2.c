/* bench_krea2.c — `ditrun bench --preset krea2`: the Krea 2 denoise step measured from the inside
 * (see bench_krea2.h for what the report holds).
 *
 * The checkpoint is synthetic (krea2_synth_write at the preset geometry, cached in
 * $TMPDIR/ditrun-bench-cache like the FLUX.2 ones) or --model DIR. The whole forward is timed through
 * krea2_forward itself; everything inside a transformer block is timed device-only on krea2.c's own
 * block weights, activation set and block ops (krea2_block_op: modulated norm, q/k/v/gate GEMMs, head
 * norm + RoPE, GQA attention with the key-padding bias, sigmoid gate, out GEMM, gated residuals, SwiGLU
 * MLP), loaded a second time after the model is freed (k2r below). That replica is checked against the
 * model: fed the model's stream after block 0, its blocks 1..L-1 must reproduce the model's stream after
 * the last block.
 */
#include "bench_krea2.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_internal.h"
#include "io/json.h"

/* ------------------------------------------------------------------ small helpers */

static void k2_note(bench_k2_report *r, const char *fmt, ...) DT_PRINTF(2, 3);
static void k2_note(bench_k2_report *r, const char *fmt, ...) {
    if (r->n_notes >= BENCH_MAX_NOTES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->notes[r->n_notes++], sizeof r->notes[0], fmt, ap);
    va_end(ap);
}

static void die_bench(void) {
    fprintf(stderr, "ditrun: error: bench: %s\n", dt_last_error());
    exit(1);
}

int bench_is_krea2_preset(const char *preset) { return preset && !strncmp(preset, "krea2", 5); }

/* ------------------------------------------------------------------ the block replica */

#define K2_ST_QKNORM KREA2_OP_QKNORM
#define K2_ST_ROPE KREA2_OP_ROPE
#define K2_ST_FULL (KREA2_OP_COUNT - 1)

static const struct { const char *name; int cat; } k2_ops[K2B_N_OPS] = {
    {"modulated norm 1 (RMSNorm + shift)", BENCH_CAT_ELEM},
    {"q/k/v + gate GEMMs", BENCH_CAT_GEMM},
    {"QK head norm", BENCH_CAT_ELEM},
    {"RoPE", BENCH_CAT_ELEM},
    {"attention (GQA + mask)", BENCH_CAT_ATTN},
    {"gate multiply (sigmoid)", BENCH_CAT_ELEM},
    {"out GEMM", BENCH_CAT_GEMM},
    {"gated residual 1", BENCH_CAT_ELEM},
    {"modulated norm 2 (RMSNorm + shift)", BENCH_CAT_ELEM},
    {"MLP gate + up GEMMs", BENCH_CAT_GEMM},
    {"SwiGLU", BENCH_CAT_ELEM},
    {"MLP down GEMM", BENCH_CAT_GEMM},
    {"gated residual 2", BENCH_CAT_ELEM},
};

/* The transformer blocks with krea2.c's own weights, activations and block ops, device-only. */
typedef struct {
    dt_backend *be;
    dt_weights *w;
    krea2_config c;
    krea2_outer_w ow;
    krea2_block_w *b;
    int nb;
    dt_linear_set lin;
    krea2_acts x;          /* activations for (n, t) */
    krea2_block_io io;     /* the blocks' views of them */
    int64_t L;
} k2r;

static void k2r_free(k2r *m) {
    if (!m) return;
    bench_sync_or_die(m->be);
    krea2_acts_free(m->be, &m->x);
    dt_linear_set_free(&m->lin);
    krea2_outer_w_free(m->be, &m->ow);
    for (int i = 0; m->b && i < m->nb; i++) krea2_block_w_free(m->be, &m->b[i]);
    free(m->b);
    if (m->w) dt_weights_close(m->w);
    free(m);
}

/* Load the outer weights (timestep MLP, modulation) and every transformer block. */
static k2r *k2r_load(dt_backend *be, const char *dir, const krea2_config *c) {
    k2r *m = dt_calloc(1, sizeof *m);
    m->be = be;
    m->lin.be = be;
    m->c = *c;
    m->w = dt_weights_open(dir);
    if (!m->w) { free(m); return NULL; }
    if (krea2_outer_w_load(&m->lin, m->w, c, &m->ow)) goto fail;
    m->b = dt_calloc((size_t)c->num_layers, sizeof *m->b);
    for (int i = 0; i < c->num_layers; i++) {
        m->nb = i + 1;
        if (krea2_block_w_load(&m->lin, m->w, c, i, &m->b[i])) goto fail;
    }
    return m;
fail:
    k2r_free(m);
    return NULL;
}

/* Activations for n image + t text tokens, RoPE tables from pos [t+n, axes], the key-padding bias from mask
 * (NULL: none) and the modulation vectors at `timestep`, as krea2_forward sets them up. */
static void k2r_alloc(k2r *m, int n, int t, const float *pos, const uint8_t *mask, float timestep) {
    dt_backend *be = m->be;
    krea2_acts_free(be, &m->x);
    if (krea2_acts_alloc(be, &m->c, n, t, &m->x)) die_bench();
    m->L = (int64_t)n + t;
    krea2_acts_positions(be, &m->c, &m->x, pos);
    krea2_acts_mask(be, &m->x, mask);
    krea2_time_mods(be, &m->c, &m->ow, m->b, &m->x, timestep);
    m->io = krea2_acts_block(&m->c, &m->x);
    bench_fill_randn(be, m->io.s, 5, 1.0f);
    bench_sync_or_die(be);
}

static void k2r_op(k2r *m, int l, int k, int split) { krea2_block_op(m->be, &m->c, &m->b[l], &m->io, l, k, split); }

/* Ops 0..last of block l, as the model runs them (QK norm and RoPE fused once the prefix reaches RoPE). */
static void k2r_block_prefix(k2r *m, int l, int last) {
    for (int k = 0; k <= last; k++) {
        if (k == K2_ST_QKNORM && last >= K2_ST_ROPE) continue;
        if (k == K2_ST_QKNORM || k == K2_ST_ROPE) k2r_op(m, l, K2_ST_QKNORM, k == K2_ST_QKNORM);
        else k2r_op(m, l, k, 0);
    }
}

static void k2r_blocks(k2r *m, int first, int count) {
    for (int l = first; l < first + count && l < m->nb; l++) krea2_block(m->be, &m->c, &m->b[l], &m->io, l);
}

/* ------------------------------------------------------------------ context */

typedef struct {
    const bench_opts *o;
    bench_k2_report *r;
    dt_backend *be;
    int is_cpu;
    const char *dir;
    k2r *rep;
    int n, t, h, w;
    float *img, *txt, *pos;
    uint8_t *mask;
    int reps, warmup;
    double rot_bytes;
    float *trace0, *trace_last;   /* model stream after block 0 / after the last block */
    int trace_ok;
} k2_ctx;

/* ------------------------------------------------------------------ synthetic checkpoint cache */

static const char *fmt_name(int f) {
    return f == BENCH_FMT_BF16 ? "bf16" : f == BENCH_FMT_Q4 ? "q4" : f == BENCH_FMT_Q8 ? "q8" : "f32";
}

static void remove_files(const char *dir) {
    const char *names[] = {".bench-complete", "config.json", "model.safetensors"};
    char p[4200];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
}

static int complete(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.bench-complete", dir);
    return access(p, F_OK) == 0;
}

static char *synth_checkpoint(const bench_opts *o, const krea2_config *c, int group, bench_k2_report *r) {
    const char *base = o->cache_dir;
    char root[1024];
    if (!base) {
        const char *tmp = getenv("TMPDIR");
        snprintf(root, sizeof root, "%s/ditrun-bench-cache", tmp && *tmp ? tmp : "/tmp");
        base = root;
    }
    if (mkdir(base, 0755) && errno != EEXIST) { dt_set_error("%s: cannot create folder (%s)", base, strerror(errno)); return NULL; }
    char key[320], dir[1400];
    snprintf(key, sizeof key, "krea2-D%d-H%d-kv%d-L%d-F%d-in%d-E%d-Y%d-tH%d-tkv%d-tF%d-lw%d-rf%d-%s", c->hidden, c->heads,
             c->kv_heads, c->num_layers, c->intermediate, c->in_channels, c->text_dim, c->text_layers, c->text_heads,
             c->text_kv_heads, c->text_intermediate, c->n_layerwise, c->n_refiner, fmt_name(o->format));
    if (o->format != BENCH_FMT_BF16) {
        size_t l = strlen(key);
        snprintf(key + l, sizeof key - l, "-g%d", group);
    }
    snprintf(dir, sizeof dir, "%s/%s", base, key);
    if (!o->fresh && complete(dir)) {
        bench_progress("using cached synthetic checkpoint %s", dir);
        return dt_strdup(dir);
    }
    /* written into a private folder, then renamed into place: concurrent runs never see half a checkpoint */
    char tmpd[1500];
    snprintf(tmpd, sizeof tmpd, "%s.tmp-%d", dir, (int)getpid());
    remove_files(tmpd);
    double t0 = dt_now();
    int bits = o->format == BENCH_FMT_Q4 ? 4 : o->format == BENCH_FMT_Q8 ? 8 : 0;
    bench_progress("writing synthetic %s checkpoint %s ...", fmt_name(o->format), dir);
    char mark[1600];
    snprintf(mark, sizeof mark, "%s/.bench-complete", tmpd);
    FILE *f = NULL;
    if (krea2_synth_write(c, tmpd, bits, group, o->seed) || !(f = fopen(mark, "w"))) {
        if (!f && !dt_last_error()[0]) dt_set_error("%s: cannot create", mark);
        remove_files(tmpd);
        rmdir(tmpd);
        return NULL;
    }
    fprintf(f, "ok\n");
    fclose(f);
    if (o->fresh || !complete(dir)) { remove_files(dir); rmdir(dir); }
    if (rename(tmpd, dir)) {
        remove_files(tmpd);
        rmdir(tmpd);
        if (!complete(dir)) { dt_set_error("%s: cannot move the synthetic checkpoint into place (%s)", dir, strerror(errno)); return NULL; }
        bench_progress("another run wrote %s first; using it", dir);
    }
    r->synth_s = dt_now() - t0;
    bench_progress("wrote it in %.1f s", r->synth_s);
    return dt_strdup(dir);
}

static int resolve_geometry(const bench_opts *o, krea2_config *c, bench_k2_report *r) {
    if (krea2_preset(o->preset, c)) return -1;
    if (o->hidden > 0) {
        if (o->hidden % c->head_dim) { dt_set_error("bench: krea2 --hidden %d must be a multiple of the head dim %d", o->hidden, c->head_dim); return -1; }
        c->heads = o->hidden / c->head_dim;
    } else if (o->heads > 0) {
        c->heads = o->heads;
    }
    c->hidden = c->heads * c->head_dim;
    if (o->kv_heads > 0) c->kv_heads = o->kv_heads;
    if (c->heads % c->kv_heads) { dt_set_error("bench: krea2: %d heads is not a multiple of %d kv heads", c->heads, c->kv_heads); return -1; }
    if (o->n_single > 0) c->num_layers = o->n_single;
    if (o->n_double > 0) k2_note(r, "krea2 has one kind of block: --double is ignored (--single N sets the transformer blocks)");
    if (o->mlp_ratio > 0) {
        int64_t f = (int64_t)llround(c->hidden * o->mlp_ratio / 64.0) * 64;
        c->intermediate = (int)(f < 64 ? 64 : f);
    }
    return 0;
}

/* ------------------------------------------------------------------ FLOPs */

static void count_flops(bench_k2_report *r, int n, int t) {
    const krea2_config *c = &r->c;
    double D = c->hidden, L = (double)n + t, dkv = (double)c->kv_heads * c->head_dim, F = c->intermediate;
    double E = c->text_dim, Ekv = (double)c->text_kv_heads * c->text_head_dim, Ft = c->text_intermediate;
    double Y = c->text_layers, T = t, N = n;
    r->gflop_block_gemm = 2.0 * L * D * (3 * D + 2 * dkv + 3 * F) * 1e-9;
    r->gflop_block_attn = 4.0 * L * L * D * 1e-9;
    double tgemm_row = 2.0 * E * (3 * E + 2 * Ekv + 3 * Ft);
    r->gflop_text = (c->n_layerwise * (T * Y * tgemm_row + 4.0 * T * Y * Y * E) +
                     c->n_refiner * (T * tgemm_row + 4.0 * T * T * E)) * 1e-9;
    r->gflop_other = (2.0 * T * (E * D + D * D) + 2.0 * N * c->in_channels * D + 2.0 * N * D * c->out_channels +
                      2.0 * (c->t_embed * D + D * D + 6 * D * D)) * 1e-9;
}

static double fwd_gflop(const bench_k2_report *r) {
    return r->c.num_layers * (r->gflop_block_gemm + r->gflop_block_attn) + r->gflop_text + r->gflop_other;
}

/* ------------------------------------------------------------------ whole forward */

typedef struct {
    k2_ctx *x;
    dt_backend *be;
    int last;
} trace_ud;

static void trace_cb(void *ud, const char *name, dt_mat m) {
    trace_ud *tu = ud;
    k2_ctx *x = tu->x;
    char last[32];
    snprintf(last, sizeof last, "block.%d", tu->last);
    if (!strcmp(name, "block.0")) tu->be->download(tu->be, x->trace0, m);
    if (!strcmp(name, last)) { tu->be->download(tu->be, x->trace_last, m); x->trace_ok = 1; }
}

static int whole_forward(k2_ctx *x) {
    bench_k2_report *r = x->r;
    dt_backend *be = x->be;
    bench_progress("loading %s with krea2_load ...", x->dir);
    double t0 = dt_now();
    krea2_model *km = krea2_load(be, x->dir);
    if (!km) return -1;
    size_t bytes;
    krea2_weight_info(km, &bytes, r->fmt, sizeof r->fmt);
    r->weight_gb = bytes / 1e9;
    r->load_s = dt_now() - t0;
    bench_progress("loaded (%.1f s, %.2f GB of weights, %s)", r->load_s, r->weight_gb, r->fmt);
    const krea2_config *c = &r->c;
    size_t no = (size_t)x->n * c->out_channels;
    float *om = dt_malloc(sizeof(float) * no), *on = dt_malloc(sizeof(float) * no);
    int wu = x->warmup > 0 ? x->warmup : 1;   /* the first call allocates: always one warm-up of each */
    bench_progress("whole forward: warm-up (%d of each) ...", wu);
    for (int i = 0; i < wu; i++) {
        for (int v = 0; v < 2; v++) {
            bench_sync_or_die(be);
            double w0 = dt_now();
            if (krea2_forward(km, x->img, x->n, x->txt, x->t, 0.5f, x->pos, v ? NULL : x->mask, v ? on : om, NULL, NULL)) {
                krea2_free(km); free(om); free(on);
                return -1;
            }
            double ms = (dt_now() - w0) * 1e3;
            if (i == 0) *(v ? &r->fwd_nomask_warm_ms : &r->fwd_mask_warm_ms) = ms;
        }
    }
    double *sm = dt_malloc(sizeof(double) * x->reps), *sn = dt_malloc(sizeof(double) * x->reps);
    dt_power_acc pw;
    dt_power_begin(&pw, be, x->reps);
    for (int i = 0; i < x->reps; i++) {
        bench_progress("whole forward: rep %d/%d (mask, no mask)", i + 1, x->reps);
        for (int v = 0; v < 2; v++) {
            bench_sync_or_die(be);
            double w0 = dt_now();
            if (krea2_forward(km, x->img, x->n, x->txt, x->t, 0.5f, x->pos, v ? NULL : x->mask, v ? on : om, NULL, NULL)) {
                krea2_free(km); free(om); free(on); free(sm); free(sn);
                dt_power_end(&pw);
                return -1;
            }
            (v ? sn : sm)[i] = (dt_now() - w0) * 1e3;
        }
        dt_power_add(&pw);
    }
    r->power = dt_power_end(&pw);
    r->fwd_mask = bench_stats(sm, x->reps);
    r->fwd_nomask = bench_stats(sn, x->reps);
    r->out_absmax = bench_max_abs(om, no);
    r->mask_effect = bench_max_abs_diff(om, on, no);
    r->out_finite = isfinite(r->out_absmax) && isfinite(bench_max_abs(on, no));
    if (!r->out_finite) k2_note(r, "WARNING: krea2_forward produced non-finite outputs");
    /* one traced forward: the stream after block 0 and after the last block, for the replica check */
    int64_t L = (int64_t)x->n + x->t;
    x->trace0 = dt_malloc(sizeof(float) * (size_t)(L * c->hidden));
    x->trace_last = dt_malloc(sizeof(float) * (size_t)(L * c->hidden));
    trace_ud tu = {x, be, c->num_layers - 1};
    if (krea2_forward(km, x->img, x->n, x->txt, x->t, 0.5f, x->pos, x->mask, om, trace_cb, &tu)) {
        krea2_free(km); free(om); free(on); free(sm); free(sn);
        return -1;
    }
    krea2_free(km);   /* the replica loads its own copy of the blocks */
    free(om); free(on); free(sm); free(sn);
    return 0;
}

/* Replica: load, check against the model, time every block device-only. */
static int replica(k2_ctx *x) {
    bench_k2_report *r = x->r;
    const krea2_config *c = &r->c;
    bench_progress("loading the block replica (%d blocks) ...", c->num_layers);
    x->rep = k2r_load(x->be, x->dir, c);
    if (!x->rep) return -1;
    k2r *m = x->rep;
    k2r_alloc(m, x->n, x->t, x->pos, x->mask, 0.5f);
    int64_t L = m->L, D = c->hidden;
    if (c->num_layers > 1 && x->trace_ok) {
        float *got = dt_malloc(sizeof(float) * (size_t)(L * D));
        x->be->upload(x->be, m->io.s, x->trace0);
        k2r_blocks(m, 1, c->num_layers - 1);
        x->be->download(x->be, got, m->io.s);
        r->replica_checked = 1;
        r->replica_maxdiff = bench_max_abs_diff(got, x->trace_last, (size_t)(L * D));
        r->replica_absmax = bench_max_abs(x->trace_last, (size_t)(L * D));
        free(got);
        double tol = (x->is_cpu ? 1e-5 : 2e-2) * (r->replica_absmax > 1 ? r->replica_absmax : 1);
        if (!(r->replica_maxdiff <= tol))
            k2_note(r, "WARNING: the replica's blocks 1..%d differ from krea2_forward's by %.3g (max |stream| %.3g): the "
                       "ledger may not describe the model's blocks", c->num_layers - 1, r->replica_maxdiff, r->replica_absmax);
    } else {
        k2_note(r, "replica check skipped (needs at least 2 transformer blocks)");
    }
    /* device-only: every block; the stream is restored outside the timed region */
    dt_mat s0 = dt_alloc_or_die(x->be, L, D, x->be->act_dtype);
    x->be->upload(x->be, s0, x->trace0);
    x->be->copy(x->be, m->io.s, s0);
    bench_timer tm;
    bench_timer_init(&tm, x->be);
    double *s = dt_malloc(sizeof(double) * x->reps);
    for (int rep = -(x->warmup > 0 ? x->warmup : 1); rep < x->reps; rep++) {
        x->be->copy(x->be, m->io.s, s0);
        bench_timer_start(&tm);
        k2r_blocks(m, 0, c->num_layers);
        double ms = bench_timer_stop(&tm);
        if (rep >= 0) s[rep] = ms;
    }
    r->blocks_dev = bench_stats(s, x->reps);
    x->be->copy(x->be, m->io.s, s0);
    bench_sync_or_die(x->be);
    x->be->free(x->be, &s0);
    bench_timer_free(&tm);
    free(s);
    return 0;
}

/* ------------------------------------------------------------------ ledger */

static void prefix_ledger(k2_ctx *x) {
    bench_k2_report *r = x->r;
    k2r *m = x->rep;
    dt_backend *be = x->be;
    const krea2_config *c = &r->c;
    int nl = c->num_layers;
    double es = (double)dt_dtype_size(be->act_dtype), L = (double)m->L, D = c->hidden, F = c->intermediate;
    double dkv = (double)c->kv_heads * c->head_dim;
    r->n_ops = K2B_N_OPS;
    for (int k = 0; k < K2B_N_OPS; k++) {
        r->ops[k].name = k2_ops[k].name;
        r->ops[k].cat = k2_ops[k].cat;
    }
    r->ops[KREA2_OP_QKVG].gflop = 2.0 * L * D * (2 * D + 2 * dkv) * 1e-9;
    r->ops[KREA2_OP_OUT].gflop = 2.0 * L * D * D * 1e-9;
    r->ops[KREA2_OP_MLPIN].gflop = 2.0 * L * D * 2 * F * 1e-9;
    r->ops[KREA2_OP_DOWN].gflop = 2.0 * L * F * D * 1e-9;
    r->ops[KREA2_OP_ATTN].gflop = r->gflop_block_attn;
    /* least traffic (each input read once, each output written once; a fused modulated norm moves 2 L D) */
    r->ops[KREA2_OP_NORM1].gbytes = r->ops[KREA2_OP_NORM2].gbytes = 2 * L * D * es * 1e-9;
    r->ops[K2_ST_QKNORM].gbytes = 2 * L * (D + 2 * dkv) * es * 1e-9 - L * dkv * es * 1e-9;   /* Q and K in place */
    r->ops[KREA2_OP_GATE].gbytes = 3 * L * D * es * 1e-9;
    r->ops[KREA2_OP_RESID1].gbytes = r->ops[KREA2_OP_RESID2].gbytes = 3 * L * D * es * 1e-9;
    r->ops[KREA2_OP_SWIGLU].gbytes = 3 * L * F * es * 1e-9;
    /* blocks per timed region: all on a GPU; on the CPU as few as exceed the cache */
    int B = nl;
    if (x->is_cpu) {
        dt_linear_src s1;
        double bb = 0;
        const char *nms[] = {"to_q", "to_k", "to_v", "to_gate", "to_out.0"};
        char nm[128];
        for (int i = 0; i < 5; i++) {
            snprintf(nm, sizeof nm, "transformer_blocks.0.attn.%s", nms[i]);
            if (dt_weights_linear(m->w, nm, -1, -1, -1, &s1) == 0) bb += (double)bench_src_bytes(&s1);
        }
        const char *fns[] = {"gate", "up", "down"};
        for (int i = 0; i < 3; i++) {
            snprintf(nm, sizeof nm, "transformer_blocks.0.ff.%s", fns[i]);
            if (dt_weights_linear(m->w, nm, -1, -1, -1, &s1) == 0) bb += (double)bench_src_bytes(&s1);
        }
        B = bb > 0 ? (int)ceil(x->rot_bytes / bb) : 1;
        if (B < 1) B = 1;
        if (B > nl) B = nl;
    }
    r->prefix_blocks = B;
    bench_progress("ledger: cumulative prefixes of a transformer block (%d stages x %d blocks, %d reps) ...", K2B_N_OPS, B,
                   x->reps);
    dt_mat s0 = dt_alloc_or_die(be, m->L, c->hidden, be->act_dtype);
    be->copy(be, s0, m->io.s);
    double *smp = dt_malloc(sizeof(double) * K2B_N_OPS * x->reps), *dir = dt_malloc(sizeof(double) * K2B_N_OPS * x->reps);
    bench_timer tm;
    bench_timer_init(&tm, be);
    int nev = K2B_N_OPS * B + 1, have_ev = tm.e0 != NULL;
    void **ev = dt_calloc((size_t)nev, sizeof *ev);
    double *host_t = dt_calloc((size_t)nev, sizeof *host_t);
    for (int i = 0; have_ev && i < nev; i++) ev[i] = be->event_create(be);
    for (int rep = -x->warmup; rep < x->reps; rep++) {
        for (int k = 0; k < K2B_N_OPS; k++) {
            be->copy(be, m->io.s, s0);
            bench_timer_start(&tm);
            for (int b = 0; b < B; b++) k2r_block_prefix(m, b, k);
            double ms = bench_timer_stop(&tm) / B;
            if (rep >= 0) smp[k * x->reps + rep] = ms;
        }
        /* direct: an event before every op of the B blocks (QK norm and RoPE as separate passes) */
        be->copy(be, m->io.s, s0);
        bench_sync_or_die(be);
        for (int b = 0; b < B; b++)
            for (int k = 0; k < K2B_N_OPS; k++) {
                int e = b * K2B_N_OPS + k;
                if (have_ev) be->event_record(be, ev[e]);
                else { bench_sync_or_die(be); host_t[e] = dt_now(); }
                k2r_op(m, b, k, 1);
            }
        if (have_ev) be->event_record(be, ev[nev - 1]);
        else { bench_sync_or_die(be); host_t[nev - 1] = dt_now(); }
        bench_sync_or_die(be);
        for (int k = 0; rep >= 0 && k < K2B_N_OPS; k++) {
            double sum = 0;
            for (int b = 0; b < B; b++) {
                int e = b * K2B_N_OPS + k;
                sum += have_ev ? be->event_elapsed_ms(be, ev[e], ev[e + 1]) : (host_t[e + 1] - host_t[e]) * 1e3;
            }
            dir[k * x->reps + rep] = sum / B;
        }
    }
    for (int i = 0; have_ev && i < nev; i++) if (be->event_destroy) be->event_destroy(be, ev[i]);
    free(ev);
    free(host_t);
    double prev = 0, dsum = 0;
    int neg = 0;
    for (int k = 0; k < K2B_N_OPS; k++) {
        r->ops[k].prefix = bench_stats(smp + k * x->reps, x->reps);
        r->ops[k].direct = bench_stats(dir + k * x->reps, x->reps);
        r->ops[k].ms = r->ops[k].prefix.med - prev;
        prev = r->ops[k].prefix.med;
        if (r->ops[k].ms < 0) neg++;
        dsum += r->ops[k].direct.med;
    }
    r->block_ledger_ms = prev;
    for (int k = 0; k < K2B_N_OPS; k++)
        r->ops[k].ledger_ms = !neg || dsum <= 0 ? r->ops[k].ms : prev * r->ops[k].direct.med / dsum;
    if (!neg) snprintf(r->shares_basis, sizeof r->shares_basis, "cumulative-prefix increments");
    else {
        snprintf(r->shares_basis, sizeof r->shares_basis,
                 "direct op times scaled to the prefix block total (%d prefix increment%s negative: noise)", neg, neg > 1 ? "s" : "");
        k2_note(r, "ledger: %d prefix increment%s negative (noise, or overlap: on the H200 the gate after attention is "
                   "systematically -0.13 ms); shares use the direct op times scaled to the block's prefix total", neg,
                neg > 1 ? "s" : "");
    }
    r->attn_inmodel_ms = r->ops[KREA2_OP_ATTN].ledger_ms;
    be->copy(be, m->io.s, s0);
    bench_sync_or_die(be);
    be->free(be, &s0);
    bench_timer_free(&tm);
    free(smp);
    free(dir);
}

static void block_scaling(k2_ctx *x) {
    bench_k2_report *r = x->r;
    k2r *m = x->rep;
    dt_backend *be = x->be;
    int nl = r->c.num_layers;
    int pts[K2B_MAX_SCALE], np = 0;
    int cand[3] = {1, nl / 4, nl / 2};
    for (int i = 0; i < 3; i++) {
        if (cand[i] < 1 || cand[i] >= nl || (np && pts[np - 1] == cand[i])) continue;
        pts[np++] = cand[i];
    }
    bench_progress("ledger: block-count scaling (%d partial stacks x %d reps) ...", np, x->reps);
    dt_mat s0 = dt_alloc_or_die(be, m->L, r->c.hidden, be->act_dtype);
    be->copy(be, s0, m->io.s);
    bench_timer tm;
    bench_timer_init(&tm, be);
    double *smp = dt_malloc(sizeof(double) * (np ? np : 1) * x->reps);
    for (int rep = -x->warmup; rep < x->reps; rep++)
        for (int p = 0; p < np; p++) {
            be->copy(be, m->io.s, s0);
            bench_timer_start(&tm);
            k2r_blocks(m, 0, pts[p]);
            double ms = bench_timer_stop(&tm);
            if (rep >= 0) smp[p * x->reps + rep] = ms;
        }
    r->n_scale = 0;
    for (int p = 0; p < np; p++) {
        r->scale_n[r->n_scale] = pts[p];
        r->scale_t[r->n_scale++] = bench_stats(smp + p * x->reps, x->reps);
    }
    r->scale_n[r->n_scale] = nl;
    r->scale_t[r->n_scale++] = r->blocks_dev;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < r->n_scale; i++) {
        double xs = r->scale_n[i], ys = r->scale_t[i].med;
        sx += xs; sy += ys; sxx += xs * xs; sxy += xs * ys;
    }
    double den = r->n_scale * sxx - sx * sx;
    r->block_slope_ms = r->n_scale >= 2 && den > 0 ? (r->n_scale * sxy - sx * sy) / den : r->blocks_dev.med / nl;
    be->copy(be, m->io.s, s0);
    bench_sync_or_die(be);
    be->free(be, &s0);
    bench_timer_free(&tm);
    free(smp);
}

static void add_share(bench_k2_report *r, const char *name, double ms, int level) {
    if (r->n_shares >= (int)(sizeof r->shares / sizeof r->shares[0])) return;
    bench_share *s = &r->shares[r->n_shares++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ms = ms;
    s->level = level;
    s->share = r->total_ms > 0 ? 100.0 * ms / r->total_ms : 0;
}

static void shares(k2_ctx *x) {
    bench_k2_report *r = x->r;
    double nl = r->c.num_layers;
    r->total_ms = r->fwd_mask.med;
    r->n_shares = 0;
    double cat[3] = {0, 0, 0};
    for (int k = 0; k < r->n_ops; k++) cat[r->ops[k].cat] += r->ops[k].ledger_ms;
    const bench_op *o = r->ops;
    add_share(r, "transformer-block GEMMs (q/k/v/gate, out, MLP)", nl * cat[BENCH_CAT_GEMM], 0);
    add_share(r, "q/k/v + gate", nl * o[KREA2_OP_QKVG].ledger_ms, 1);
    add_share(r, "out", nl * o[KREA2_OP_OUT].ledger_ms, 1);
    add_share(r, "MLP gate + up, down", nl * (o[KREA2_OP_MLPIN].ledger_ms + o[KREA2_OP_DOWN].ledger_ms), 1);
    add_share(r, "attention (GQA + key-padding mask)", nl * cat[BENCH_CAT_ATTN], 0);
    add_share(r, "elementwise (modulated norms, QK norm, RoPE, gate, SwiGLU, residuals)", nl * cat[BENCH_CAT_ELEM], 0);
    add_share(r, "modulated norms (RMSNorm + shift add)", nl * (o[KREA2_OP_NORM1].ledger_ms + o[KREA2_OP_NORM2].ledger_ms), 1);
    add_share(r, "QK norm + RoPE", nl * (o[K2_ST_QKNORM].ledger_ms + o[K2_ST_ROPE].ledger_ms), 1);
    add_share(r, "gate multiply + SwiGLU", nl * (o[KREA2_OP_GATE].ledger_ms + o[KREA2_OP_SWIGLU].ledger_ms), 1);
    add_share(r, "gated residuals", nl * (o[KREA2_OP_RESID1].ledger_ms + o[KREA2_OP_RESID2].ledger_ms), 1);
    double blocks_ledger = nl * (cat[0] + cat[1] + cat[2]);
    double rest = r->fwd_mask.med - r->blocks_dev.med;
    add_share(r, "rest: text fusion, embedders, modulation, final layer, host I/O", rest, 0);
    r->remainder_ms = r->total_ms - blocks_ledger - rest;   /* = replica blocks - ledger x blocks */
    r->remainder_share = r->total_ms > 0 ? 100.0 * r->remainder_ms / r->total_ms : 0;
    add_share(r, "unexplained remainder (replica blocks - ledger x blocks)", r->remainder_ms, 0);
}

/* ------------------------------------------------------------------ utilization */

static void time_gemm(k2_ctx *x, const char *name, int64_t K, int64_t N, int count, const char *pat, int inmodel_op,
                      double inmodel_part) {
    bench_k2_report *r = x->r;
    dt_backend *be = x->be;
    k2r *m = x->rep;
    if (r->n_gemm >= (int)(sizeof r->gemm / sizeof r->gemm[0])) return;
    bench_gemm *g = &r->gemm[r->n_gemm++];
    memset(g, 0, sizeof *g);
    int64_t M = m->L;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->M = M; g->K = K; g->N = N;
    g->count = count;
    g->gflop = 2.0 * M * K * N * 1e-9;
    g->inmodel_ms = inmodel_op >= 0 && r->ops[inmodel_op].prefix.n ? r->ops[inmodel_op].ledger_ms * inmodel_part : -1;
    bench_progress("utilization: GEMM %s [%lld x %lld -> %lld] ...", name, (long long)M, (long long)K, (long long)N);
    dt_mat xm = dt_alloc_or_die(be, M, K, be->act_dtype), ym = dt_alloc_or_die(be, M, N, be->act_dtype);
    bench_fill_randn(be, xm, 100 + r->n_gemm, 1.0f);
    bench_timer tm;
    bench_timer_init(&tm, be);
    dt_linear *bor[64];
    int nb = 0;
    dt_linear_src src;
    char nm[160];
    snprintf(nm, sizeof nm, pat, 0);
    if (dt_weights_linear(m->w, nm, -1, -1, -1, &src)) die_bench();
    for (int b = 0; b < m->nb && nb < 64; b++) {
        const krea2_block_w *kb = &m->b[b];
        dt_linear *l = strstr(pat, "to_q") ? kb->attn.q : strstr(pat, "to_k") ? kb->attn.k
                       : strstr(pat, "to_out") ? kb->attn.out : strstr(pat, "ff.gate") ? kb->ff.gate : kb->ff.down;
        bor[nb++] = l;
    }
    bench_wset iso, ceil_set;
    bench_wset_init(&iso, be, bor, nb, &src, x->rot_bytes);
    bench_wset_dense(&ceil_set, be, N, K, x->rot_bytes, 1000 + r->n_gemm, DT_PREC_BF16);
    double *si = dt_malloc(sizeof(double) * x->reps), *sc = dt_malloc(sizeof(double) * x->reps);
    for (int rep = -x->warmup; rep < x->reps; rep++) {
        double a = bench_wset_time(&iso, &tm, ym, xm);
        double b = bench_wset_time(&ceil_set, &tm, ym, xm);
        if (rep >= 0) { si[rep] = a; sc[rep] = b; }
    }
    g->iso = bench_stats(si, x->reps);
    g->ceil = bench_stats(sc, x->reps);
    g->ceil_sus = bench_wset_time_sustained(&ceil_set, ym, xm, x->reps, x->is_cpu);
    g->iso_bufs = iso.n; g->iso_mb = iso.mb;
    g->ceil_bufs = ceil_set.n; g->ceil_mb = ceil_set.mb;
    bench_wset_free(&iso);
    bench_wset_free(&ceil_set);
    free(si); free(sc);
    bench_timer_free(&tm);
    be->free(be, &xm);
    be->free(be, &ym);
}

/* The attention op of block 0 (sustained timing). */
static void attn_block0(void *ud, int i) {
    (void)i;
    k2r_op((k2r *)ud, 0, KREA2_OP_ATTN, 0);
}

static void utilization(k2_ctx *x) {
    bench_k2_report *r = x->r;
    dt_backend *be = x->be;
    const krea2_config *c = &r->c;
    int64_t D = c->hidden, F = c->intermediate, dkv = (int64_t)c->kv_heads * c->head_dim;
    int nl = c->num_layers;
    r->n_gemm = 0;
    time_gemm(x, "to_q / to_gate", D, D, 2 * nl, "transformer_blocks.%d.attn.to_q", -1, 0);
    time_gemm(x, "to_k / to_v", D, dkv, 2 * nl, "transformer_blocks.%d.attn.to_k", -1, 0);
    /* the q/k/v/gate op's in-model time, split over its four GEMMs in proportion to their isolated times */
    if (r->n_gemm == 2 && r->ops[KREA2_OP_QKVG].prefix.n) {
        double a = r->gemm[0].iso.med, b = r->gemm[1].iso.med, den = 2 * (a + b);
        if (den > 0) {
            r->gemm[0].inmodel_ms = r->ops[KREA2_OP_QKVG].ledger_ms * a / den;
            r->gemm[1].inmodel_ms = r->ops[KREA2_OP_QKVG].ledger_ms * b / den;
        }
    }
    time_gemm(x, "to_out.0", D, D, nl, "transformer_blocks.%d.attn.to_out.0", KREA2_OP_OUT, 1.0);
    time_gemm(x, "ff.gate / ff.up", D, F, 2 * nl, "transformer_blocks.%d.ff.gate", KREA2_OP_MLPIN, 0.5);
    time_gemm(x, "ff.down", F, D, nl, "transformer_blocks.%d.ff.down", KREA2_OP_DOWN, 1.0);

    /* attention alone, as in the model: GQA + key-padding bias */
    k2r *m = x->rep;
    r->attn_gflop = r->gflop_block_attn;
    bench_progress("utilization: attention [%lld tokens, %d/%d heads x %d, mask] ...", (long long)m->L, c->heads,
                   c->kv_heads, c->head_dim);
    bench_fill_randn(be, m->io.q, 201, 1.0f);
    bench_fill_randn(be, m->io.k, 202, 1.0f);
    bench_fill_randn(be, m->io.v, 203, 1.0f);
    bench_timer tm;
    bench_timer_init(&tm, be);
    double *s = dt_malloc(sizeof(double) * x->reps);
    for (int rep = -x->warmup; rep < x->reps; rep++) {
        bench_timer_start(&tm);
        k2r_op(m, 0, KREA2_OP_ATTN, 0);
        double ms = bench_timer_stop(&tm);
        if (rep >= 0) s[rep] = ms;
    }
    r->attn_iso = bench_stats(s, x->reps);
    r->attn_sus = bench_time_sustained(be, x->is_cpu, attn_block0, m, BENCH_HEAT_MS, 2 * x->reps);

    free(s);
    bench_timer_free(&tm);
    /* device copy bandwidth (elementwise ops' reference) */
    bench_copy_bandwidth(be, x->rot_bytes, x->is_cpu, x->warmup, x->reps, &r->copy, &r->copy_bytes, &r->copy_gbs);
}

/* ------------------------------------------------------------------ arms */

#define K2_MAX_SEG 8

typedef struct {
    dt_backend *be;
    bench_timer tm;
    int hq, hkv, hd;
    int64_t L, Lv;               /* keys, valid keys */
    float scale;
    dt_mat q, k, v, o, kr, vr, kc, vc, bias;
    int64_t seg0[K2_MAX_SEG], segn[K2_MAX_SEG];   /* valid key row ranges (prompt, suffix, image) */
    int nseg;
} k2_attn_ctx;

/* K/V [L, hkv*hd] -> [L, hq*hd] with query head h reading kv head h / g (bench_arms.c gqa_repeat). */
static void repeat_kv(k2_attn_ctx *c, dt_mat rep, dt_mat src) {
    int g = c->hq / c->hkv;
    dt_mat rv = dt_mat_reshape(rep, c->L * c->hkv, (int64_t)g * c->hd);
    dt_mat sv = dt_mat_reshape(src, c->L * c->hkv, c->hd);
    for (int r = 0; r < g; r++) c->be->copy(c->be, dt_mat_cols(rv, (int64_t)r * c->hd, c->hd), sv);
}

/* arm "gqa": 0 native GQA, 1 repeated KV (copies + attention with hq kv heads), 2 attention on pre-repeated KV */
static void gqa_run(k2_attn_ctx *c, int v) {
    dt_backend *be = c->be;
    if (v == 0) be->attention(be, c->o, c->q, c->k, c->v, c->hq, c->hkv, c->hd, c->scale, c->bias, 0);
    else {
        if (v == 1) { repeat_kv(c, c->kr, c->k); repeat_kv(c, c->vr, c->v); }
        be->attention(be, c->o, c->q, c->kr, c->vr, c->hq, c->hq, c->hd, c->scale, c->bias, 0);
    }
}

/* arm "mask": 0 key-padding bias, 1 compacted keys (padded rows dropped by copies, no bias), 2 no mask */
static void mask_run(k2_attn_ctx *c, int v) {
    dt_backend *be = c->be;
    if (v == 0) be->attention(be, c->o, c->q, c->k, c->v, c->hq, c->hkv, c->hd, c->scale, c->bias, 0);
    else if (v == 1) {
        int64_t at = 0;
        for (int i = 0; i < c->nseg; i++) {
            be->copy(be, dt_mat_rows(c->kc, at, c->segn[i]), dt_mat_rows(c->k, c->seg0[i], c->segn[i]));
            be->copy(be, dt_mat_rows(c->vc, at, c->segn[i]), dt_mat_rows(c->v, c->seg0[i], c->segn[i]));
            at += c->segn[i];
        }
        be->attention(be, c->o, c->q, dt_mat_rows(c->kc, 0, c->Lv), dt_mat_rows(c->vc, 0, c->Lv), c->hq, c->hkv, c->hd,
                      c->scale, dt_mat_null(), 0);
    } else {
        be->attention(be, c->o, c->q, c->k, c->v, c->hq, c->hkv, c->hd, c->scale, dt_mat_null(), 0);
    }
}

typedef struct {
    const char *arm, *names[3];
    char what[96], note[200];
    int nv;
    void (*run)(k2_attn_ctx *c, int v);
    double tol[3];      /* agreement tolerance of variant v vs 0, relative to max |A|; INFINITY = differs by design */
} k2_arm;

typedef struct {
    k2_attn_ctx *ac;
    const k2_arm *a;
} k2_arm_run;

static double k2_arm_time(void *p, int v) {
    k2_arm_run *k = p;
    bench_timer_start(&k->ac->tm);
    k->a->run(k->ac, v);
    return bench_timer_stop(&k->ac->tm);
}

static void run_arm(k2_ctx *x, k2_attn_ctx *ac, const k2_arm *a) {
    bench_k2_report *r = x->r;
    int reps = x->reps;
    bench_progress("arms: %s %s (%d variants, %d reps interleaved) ...", a->arm, a->what, a->nv, reps);
    k2_arm_run kr = {ac, a};
    double *s = bench_time_interleaved(a->nv, reps, x->warmup, k2_arm_time, &kr);
    size_t no = (size_t)(ac->L * ac->hq * ac->hd);
    float *o0 = dt_malloc(sizeof(float) * no), *o1 = dt_malloc(sizeof(float) * no);
    a->run(ac, 0);
    ac->be->download(ac->be, o0, ac->o);
    double absmax = bench_max_abs(o0, no);
    bench_stat s0 = bench_stats(s, reps);
    for (int v = 1; v < a->nv && r->n_arms < (int)(sizeof r->arms / sizeof r->arms[0]); v++) {
        a->run(ac, v);
        ac->be->download(ac->be, o1, ac->o);
        bench_arm *row = bench_arm_row(&r->arms[r->n_arms++], a->arm, a->what, a->names[0], a->names[v], a->note);
        if (isinf(a->tol[v])) {
            size_t l = strlen(row->note);
            snprintf(row->note + l, sizeof row->note - l, "%soutputs differ by design (attends to the padding)", l ? "; " : "");
        }
        row->sa = s0;
        row->sb = bench_stats(s + v * reps, reps);
        row->ratio = row->sa.med > 0 ? row->sb.med / row->sa.med : 0;
        row->maxdiff = bench_max_abs_diff(o1, o0, no);
        row->ref_absmax = absmax;
        row->tol = a->tol[v];
    }
    free(o0); free(o1); free(s);
}

static void arms(k2_ctx *x) {
    bench_k2_report *r = x->r;
    dt_backend *be = x->be;
    const krea2_config *c = &r->c;
    k2_attn_ctx ac;
    memset(&ac, 0, sizeof ac);
    ac.be = be;
    ac.hq = c->heads; ac.hkv = c->kv_heads; ac.hd = c->head_dim;
    ac.L = (int64_t)x->n + x->t;
    ac.scale = 1.0f / sqrtf((float)c->head_dim);
    int64_t D = c->hidden, dkv = (int64_t)ac.hkv * ac.hd;
    bench_timer_init(&ac.tm, be);
    ac.q = dt_alloc_or_die(be, ac.L, D, be->act_dtype);
    ac.k = dt_alloc_or_die(be, ac.L, dkv, be->act_dtype);
    ac.v = dt_alloc_or_die(be, ac.L, dkv, be->act_dtype);
    ac.o = dt_alloc_or_die(be, ac.L, D, be->act_dtype);
    bench_fill_randn(be, ac.q, 61, 1.0f);
    bench_fill_randn(be, ac.k, 62, 1.0f);
    bench_fill_randn(be, ac.v, 63, 1.0f);
    ac.bias = x->rep->io.bias;   /* the model's key-padding bias for this workload */
    double tol = x->is_cpu ? 1e-5 : 2e-2;

    if (ac.hkv == ac.hq) {
        r->arms[r->n_arms].skipped = 1;
        snprintf(r->arms[r->n_arms].arm, sizeof r->arms[0].arm, "gqa");
        snprintf(r->arms[r->n_arms].a, sizeof r->arms[0].a, "native GQA");
        snprintf(r->arms[r->n_arms].b, sizeof r->arms[0].b, "repeated KV");
        snprintf(r->arms[r->n_arms++].note, sizeof r->arms[0].note, "kv heads = heads (pass --kv-heads)");
    } else {
        ac.kr = dt_alloc_or_die(be, ac.L, D, be->act_dtype);
        ac.vr = dt_alloc_or_die(be, ac.L, D, be->act_dtype);
        repeat_kv(&ac, ac.kr, ac.k);
        repeat_kv(&ac, ac.vr, ac.v);
        k2_arm a = {0};
        a.arm = "gqa";
        snprintf(a.what, sizeof a.what, "attention L=%lld, %d q / %d kv heads x %d, key-padding mask", (long long)ac.L,
                 ac.hq, ac.hkv, ac.hd);
        a.names[0] = "native GQA";
        a.names[1] = "repeated KV";
        a.names[2] = "pre-repeated KV";
        a.nv = 3;
        a.run = gqa_run;
        a.tol[1] = a.tol[2] = tol;
        snprintf(a.note, sizeof a.note, "isolated; repeated = %d strided copies of K and V (diffusers' repeat_interleave) + "
                 "attention with %d kv heads; pre-repeated = the attention alone", ac.hq / ac.hkv, ac.hq);
        run_arm(x, &ac, &a);
        bench_sync_or_die(be);
        be->free(be, &ac.kr);
        be->free(be, &ac.vr);
    }

    /* key rows that the mask keeps: [0, prompt), the suffix, the image */
    int64_t T = x->t;
    int simple = 1;   /* every valid text run fits the segment table: compaction keeps exactly the unmasked keys */
    ac.nseg = 0;
    for (int64_t j = 0; j < T;) {
        if (!x->mask[j]) { j++; continue; }
        int64_t e = j;
        while (e < T && x->mask[e]) e++;
        if (ac.nseg < K2_MAX_SEG - 1) { ac.seg0[ac.nseg] = j; ac.segn[ac.nseg++] = e - j; }
        else simple = 0;
        j = e;
    }
    ac.seg0[ac.nseg] = T;
    ac.segn[ac.nseg++] = x->n;
    ac.Lv = 0;
    for (int i = 0; i < ac.nseg; i++) ac.Lv += ac.segn[i];
    ac.kc = dt_alloc_or_die(be, ac.L, dkv, be->act_dtype);
    ac.vc = dt_alloc_or_die(be, ac.L, dkv, be->act_dtype);
    k2_arm a = {0};
    a.arm = "mask";
    snprintf(a.what, sizeof a.what, "attention L=%lld (%lld valid keys), %d q / %d kv heads x %d", (long long)ac.L,
             (long long)ac.Lv, ac.hq, ac.hkv, ac.hd);
    a.names[0] = "key-padding bias";
    a.names[1] = "compacted keys";
    a.names[2] = "no mask";
    a.nv = 3;
    a.run = mask_run;
    a.tol[1] = simple ? tol : INFINITY;
    a.tol[2] = ac.Lv == ac.L ? tol : INFINITY;
    snprintf(a.note, sizeof a.note, "isolated; bias = [1, Lk] additive 0/-inf; compacted = %d row copies of K and V "
             "dropping the padded keys, then no mask", 2 * (ac.nseg));
    run_arm(x, &ac, &a);
    k2_note(r, "mask arm: attention takes a [1, Lk] key bias only (no dense additive [Lq, Lk] mask op), so the dense-mask "
               "path of SDPA cannot be timed; the arm compares the bias with compacted keys and with no mask");
    bench_sync_or_die(be);
    be->free(be, &ac.kc); be->free(be, &ac.vc);
    be->free(be, &ac.q); be->free(be, &ac.k); be->free(be, &ac.v); be->free(be, &ac.o);
    bench_timer_free(&ac.tm);
}

/* ------------------------------------------------------------------ run */

int bench_krea2_run(const bench_opts *o, bench_k2_report *r) {
    memset(r, 0, sizeof *r);
    double t_start = dt_now();
    k2_ctx x;
    memset(&x, 0, sizeof x);
    x.o = o;
    x.r = r;
    char *dir = NULL;
    if (o->format == BENCH_FMT_F32 && !o->model_dir) {
        dt_set_error("bench: krea2 synthetic weights are bf16, q4 or q8 (--format f32 is FLUX.2 only)");
        return -1;
    }
    x.be = dt_backend_create(o->backend, &o->be);
    if (!x.be) return -1;
    x.is_cpu = !strcmp(x.be->name, "cpu");
    snprintf(r->backend, sizeof r->backend, "%s", x.be->name);
    if (o->model_dir) {
        char cp[4300];
        json *cfg = bench_open_config(o->model_dir, &dir, cp, sizeof cp);
        if (!cfg) goto fail;
        int rc = krea2_config_parse(cfg, cp, &r->c);
        json_free(cfg);
        if (rc) goto fail;
        snprintf(r->source, sizeof r->source, "%s", dir);
        snprintf(r->preset, sizeof r->preset, "checkpoint");
    } else {
        if (resolve_geometry(o, &r->c, r)) goto fail;
        int group = o->group > 0 ? o->group : 64;
        dir = synth_checkpoint(o, &r->c, group, r);
        if (!dir) goto fail;
        snprintf(r->source, sizeof r->source, "synthetic (%s)", dir);
        snprintf(r->preset, sizeof r->preset, "%s", o->preset);
    }
    x.dir = dir;
    const krea2_config *c = &r->c;

    /* workload: the options, else per-backend defaults (bench_workload_resolve); a real-geometry forward is ~28 TFLOP
     * per 1000 tokens: tiny on a CPU */
    const int tiny = c->hidden <= 1024;
    const bench_workload_base cpu_dflt = {tiny ? 128 : 32, tiny ? 24 : 8, tiny ? 5 : 2, tiny ? 1 : 0};
    bench_workload wl;
    if (bench_workload_resolve(o, x.is_cpu, &cpu_dflt, &wl)) goto fail;
    if (wl.scaled[0]) {
        k2_note(r, "cpu backend: workload scaled down (CUDA defaults are --image-size 1024 --text-tokens 512 --reps 20 "
                   "--warmup 3); used:%s", wl.scaled);
        bench_progress("cpu: scaled down:%s (pass the flags to override)", wl.scaled);
    }
    const int img_size = wl.v.img_size, txt = wl.v.txt;
    if (txt < 1) { dt_set_error("bench: krea2 needs at least one text token (--text-tokens)"); goto fail; }
    x.reps = wl.v.reps;
    x.warmup = wl.v.warmup;
    x.h = wl.h;
    x.w = wl.w;
    x.n = wl.n;
    x.t = txt;
    r->image_size = img_size;
    r->n_img = x.n;
    r->n_txt = x.t;
    r->reps = x.reps;
    r->warmup = x.warmup;
    r->l2_mb = wl.l2_mb;
    if (wl.llc_mb > 0)
        k2_note(r, "cpu: the last-level cache reports %.0f MB; rotations target 2 x 32 MB (pass --l2-mb to change)", wl.llc_mb);
    x.rot_bytes = wl.rot_bytes;
    r->peak_tflops = wl.peak;
    snprintf(r->peak_src, sizeof r->peak_src, "%s", wl.peak_src);
    count_flops(r, x.n, x.t);

    /* inputs: random latents and text states, the pipeline's position ids and padding layout */
    int64_t L = (int64_t)x.n + x.t;
    x.img = dt_malloc(sizeof(float) * (size_t)x.n * c->in_channels);
    x.txt = dt_malloc(sizeof(float) * (size_t)x.t * c->text_layers * c->text_dim);
    x.pos = dt_malloc(sizeof(float) * (size_t)L * c->n_axes);
    x.mask = dt_malloc((size_t)x.t);
    krea2_synth_inputs(c, x.h, x.w, x.t, o->seed, x.img, x.txt, x.pos, x.mask);
    for (int i = 0; i < x.t; i++) r->n_valid += x.mask[i];
    bench_progress("%s on %s: D %d = %d heads (%d kv) x %d, %d blocks, F %d, text %d x %d layers; %d image + %d text tokens "
                   "(%d valid); %.1f GFLOP per forward", r->preset, r->backend, c->hidden, c->heads, c->kv_heads, c->head_dim,
                   c->num_layers, c->intermediate, c->text_dim, c->text_layers, x.n, x.t, r->n_valid, fwd_gflop(r));

    if (whole_forward(&x)) goto fail;
    if (replica(&x)) goto fail;
    if (o->sections & BENCH_LEDGER) {
        prefix_ledger(&x);
        block_scaling(&x);
        shares(&x);
    }
    if (o->sections & BENCH_UTIL) utilization(&x);
    if (o->sections & BENCH_ARMS) arms(&x);

    k2r_free(x.rep);
    x.rep = NULL;
    if (x.be->mem_stats) {
        size_t cur = 0, peak = 0;
        x.be->mem_stats(x.be, &cur, &peak);
        r->mem_peak_gb = peak / 1e9;
    }
    x.be->destroy(x.be);
    free(dir);
    free(x.img); free(x.txt); free(x.pos); free(x.mask); free(x.trace0); free(x.trace_last);
    r->total_s = dt_now() - t_start;
    bench_progress("done in %.1f s", r->total_s);
    return 0;
fail:
    if (x.rep) k2r_free(x.rep);
    if (x.be) x.be->destroy(x.be);
    free(dir);
    free(x.img); free(x.txt); free(x.pos); free(x.mask); free(x.trace0); free(x.trace_last);
    return -1;
}

/* ------------------------------------------------------------------ report */

static double tflops(double gflop, double ms) { return ms > 0 ? gflop / ms : 0; }
static const char *cat_name(int c) { return c == BENCH_CAT_GEMM ? "gemm" : c == BENCH_CAT_ATTN ? "attention" : "elementwise"; }

static void pct(const bench_k2_report *r, double tf, char *buf, size_t n) {
    if (r->peak_tflops > 0) snprintf(buf, n, "%.1f%%", 100.0 * tf / r->peak_tflops);
    else snprintf(buf, n, "-");
}

void bench_krea2_markdown(const bench_k2_report *r, FILE *f) {
    const krea2_config *c = &r->c;
    double gf = fwd_gflop(r), nl = c->num_layers;
    char pk[32];
    fprintf(f, "# ditrun bench: %s (Krea 2) on %s (%s)\n\n| setup | value |\n|---|---|\n", r->preset, r->backend, r->fmt);
    fprintf(f, "| weights | %s (%.2f GB) |\n", r->source, r->weight_gb);
    fprintf(f, "| geometry | D %d = %d q heads (%d kv) x %d, MLP %d, %d blocks; in %d; text %d (%d/%d heads, MLP %d) x %d "
               "layers, %d layerwise + %d refiner blocks |\n", c->hidden, c->heads, c->kv_heads, c->head_dim, c->intermediate,
            c->num_layers, c->in_channels, c->text_dim, c->text_heads, c->text_kv_heads, c->text_intermediate,
            c->text_layers, c->n_layerwise, c->n_refiner);
    fprintf(f, "| workload | image %d px -> %d image tokens + %d text tokens (%d valid, [prompt | padding | suffix]) = %d |\n",
            r->image_size, r->n_img, r->n_txt, r->n_valid, r->n_img + r->n_txt);
    fprintf(f, "| work per forward | %.1f GFLOP: blocks %.1f GEMM + %.1f attention, text fusion %.1f, embedders/final %.1f |\n",
            gf, nl * r->gflop_block_gemm, nl * r->gflop_block_attn, r->gflop_text, r->gflop_other);
    fprintf(f, "| repetitions | %d timed (median, p10-p90), %d warm-up excluded |\n", r->reps, r->warmup);
    fprintf(f, "| cache the rotations exceed | %.1f MB (x2) |\n", r->l2_mb);
    if (r->synth_s > 0) fprintf(f, "| synthetic checkpoint written | %.1f s |\n", r->synth_s);
    fprintf(f, "| load (krea2_load) | %.1f s |\n| backend memory peak | %.2f GB |\n\n", r->load_s, r->mem_peak_gb);

    fprintf(f, "## Whole forward\n\n| what | median ms | p10-p90 ms | min-max ms | TFLOPS |\n|---|---:|---:|---:|---:|\n");
    fprintf(f, "| krea2_forward with the text mask (wall clock incl. host I/O) | %.3f | %.3f-%.3f | %.3f-%.3f | %.3f |\n",
            r->fwd_mask.med, r->fwd_mask.p10, r->fwd_mask.p90, r->fwd_mask.min, r->fwd_mask.max, tflops(gf, r->fwd_mask.med));
    fprintf(f, "| krea2_forward without a mask | %.3f | %.3f-%.3f | %.3f-%.3f | %.3f |\n", r->fwd_nomask.med, r->fwd_nomask.p10,
            r->fwd_nomask.p90, r->fwd_nomask.min, r->fwd_nomask.max, tflops(gf, r->fwd_nomask.med));
    if (r->blocks_dev.n)
        fprintf(f, "| replica: the %d transformer blocks (device-only, events) | %.3f | %.3f-%.3f | %.3f-%.3f | %.3f |\n",
                c->num_layers, r->blocks_dev.med, r->blocks_dev.p10, r->blocks_dev.p90, r->blocks_dev.min, r->blocks_dev.max,
                tflops(nl * (r->gflop_block_gemm + r->gflop_block_attn), r->blocks_dev.med));
    fprintf(f, "\nWarm-up (excluded): first forward %.3f ms with mask, %.3f ms without. Output %s, max |out| %.3g; "
               "max |out(mask) - out(no mask)| %.3g (the mask hides %d padded keys). ",
            r->fwd_mask_warm_ms, r->fwd_nomask_warm_ms, r->out_finite ? "finite" : "NOT FINITE", r->out_absmax, r->mask_effect,
            r->n_txt - r->n_valid);
    if (r->replica_checked)
        fprintf(f, "Replica blocks 1..%d fed the model's stream after block 0 vs the model's stream after block %d: "
                   "max |diff| %.3g (max |stream| %.3g).\n\n", c->num_layers - 1, c->num_layers - 1, r->replica_maxdiff,
                r->replica_absmax);
    else fprintf(f, "\n\n");
    bench_md_power(f, &r->power, "timed pair");

    if (r->n_ops && r->ops[0].prefix.n) {
        fprintf(f, "## Ledger: one transformer block, cumulative prefixes (replica, %d blocks' weights per timed region)\n\n",
                r->prefix_blocks);
        bench_md_op_ledger(f, r->ops, r->n_ops, r->block_ledger_ms, r->copy_gbs, "block");
        fprintf(f, "Op ms = median(prefix k) - median(prefix k-1); RoPE = the extra cost of rotating inside the fused "
                   "head-norm op. Direct = the op alone between two events (QK norm and RoPE as separate passes). The "
                   "modulated norm is RMSNorm with the folded weight plus a shift add against a ones matrix (two passes); "
                   "its GB moved is what one fused pass would move.\n\n");
    }
    if (r->n_scale) {
        fprintf(f, "## Ledger: block-count scaling (replica, device-only)\n\n| blocks | median ms | p10-p90 ms |\n|---:|---:|---:|\n");
        for (int i = 0; i < r->n_scale; i++)
            fprintf(f, "| %d | %.3f | %.3f-%.3f |\n", r->scale_n[i], r->scale_t[i].med, r->scale_t[i].p10, r->scale_t[i].p90);
        fprintf(f, "\nPer block: %.4f ms in the stack (slope) vs %.4f ms from the prefix ledger.\n\n", r->block_slope_ms,
                r->block_ledger_ms);
    }
    if (r->n_shares) {
        fprintf(f, "## Ledger: shares of one step (krea2_forward with the mask, %.3f ms)\n\nPer-op basis: %s, times %d blocks.\n\n"
                   "Rest = krea2_forward - the replica's blocks (text fusion, txt_in/img_in, timestep MLP + host modulation fold, "
                   "final layer, host uploads/download); remainder = replica blocks - ledger block x blocks.\n\n"
                   "| part | ms | share |\n|---|---:|---:|\n", r->total_ms, r->shares_basis, c->num_layers);
        double sum = 0;
        for (int i = 0; i < r->n_shares; i++) {
            const bench_share *s = &r->shares[i];
            if (s->level == 0) sum += s->share;
            fprintf(f, "| %s%s | %.3f | %.1f%% |\n", s->level ? "&nbsp;&nbsp;- " : "", s->name, s->ms, s->share);
        }
        fprintf(f, "| **total** | **%.3f** | **%.1f%%** |\n\n", r->total_ms, sum);
    }
    if (r->n_gemm || r->attn_iso.n) {
        fprintf(f, "## Utilization (nominal peak: %s)\n\n", r->peak_src);
        bench_md_gemms(f, r->gemm, r->n_gemm, r->l2_mb, r->peak_tflops);
        fprintf(f, "\n| other | in-model ms | in-model TFLOPS | isolated ms | isolated TFLOPS | %% of peak |\n|---|---:|---:|---:|---:|---:|\n");
        if (r->attn_iso.n) {
            pct(r, tflops(r->attn_gflop, r->attn_iso.med), pk, sizeof pk);
            fprintf(f, "| attention, GQA %d/%d + mask (%.2f GFLOP per block) | %.4f | %.3f | %.4f | %.3f | %s |\n", c->heads,
                    c->kv_heads, r->attn_gflop, r->attn_inmodel_ms, tflops(r->attn_gflop, r->attn_inmodel_ms), r->attn_iso.med,
                    tflops(r->attn_gflop, r->attn_iso.med), pk);
        }
        if (r->attn_sus.n) {
            pct(r, tflops(r->attn_gflop, r->attn_sus.med), pk, sizeof pk);
            fprintf(f, "| attention, sustained (back to back after a %.0f ms heater) | - | - | %.4f | %.3f | %s |\n",
                    BENCH_HEAT_MS, r->attn_sus.med, tflops(r->attn_gflop, r->attn_sus.med), pk);
        }
        pct(r, tflops(gf, r->fwd_mask.med), pk, sizeof pk);
        fprintf(f, "| whole forward with mask (%.1f GFLOP) | %.3f | %.3f | - | - | %s |\n", gf, r->fwd_mask.med,
                tflops(gf, r->fwd_mask.med), pk);
        if (r->copy.n)
            fprintf(f, "\nDevice copy bandwidth: %.1f GB/s (read + write, %.0f MB moved, median %.3f ms).\n", r->copy_gbs,
                    r->copy_bytes / 1e6, r->copy.med);
        fprintf(f, "In-model = timed inside the block (ledger; the q/k/v/gate op is split over its four GEMMs in proportion "
                   "to their isolated times, the MLP gate+up op in halves); isolated = the GEMM alone, weights rotated "
                   "through the listed distinct buffers; attention isolated on random Q/K/V with the model's mask; "
                   "sustained = run back to back after a %.0f ms heater (the power state a forward runs in).\n\n",
                BENCH_HEAT_MS);
        if (r->blocks_dev.n)
            bench_md_floor(f, r->gemm, r->n_gemm, r->attn_iso, r->attn_sus, c->num_layers, 0, r->blocks_dev.med,
                           "Replica's transformer blocks");
    }
    bench_md_arms_notes(f, r->arms, r->n_arms, r->notes, r->n_notes);
    fprintf(f, "Bench time %.1f s.\n", r->total_s);
}

/* ------------------------------------------------------------------ JSON lines */

int bench_krea2_json(const bench_k2_report *r, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) { dt_set_error("%s: cannot create (%s)", path, strerror(errno)); return -1; }
    const krea2_config *c = &r->c;
    double gf = fwd_gflop(r);
    fprintf(f, "{"); bench_jstr(f, "type", "setup"); fputc(',', f); bench_jstr(f, "model", "krea2"); fputc(',', f);
    bench_jstr(f, "preset", r->preset); fputc(',', f); bench_jstr(f, "backend", r->backend); fputc(',', f); bench_jstr(f, "format", r->fmt);
    fputc(',', f); bench_jstr(f, "weights", r->source);
    bench_jnum(f, "hidden", c->hidden); bench_jnum(f, "heads", c->heads); bench_jnum(f, "kv_heads", c->kv_heads); bench_jnum(f, "head_dim", c->head_dim);
    bench_jnum(f, "intermediate", c->intermediate); bench_jnum(f, "blocks", c->num_layers); bench_jnum(f, "text_dim", c->text_dim);
    bench_jnum(f, "text_layers", c->text_layers); bench_jnum(f, "image_size", r->image_size); bench_jnum(f, "image_tokens", r->n_img);
    bench_jnum(f, "text_tokens", r->n_txt); bench_jnum(f, "valid_text_tokens", r->n_valid); bench_jnum(f, "reps", r->reps);
    bench_jnum(f, "warmup", r->warmup); bench_jnum(f, "cache_mb", r->l2_mb); bench_jnum(f, "synth_s", r->synth_s); bench_jnum(f, "load_s", r->load_s);
    bench_jnum(f, "weight_gb", r->weight_gb); bench_jnum(f, "gflop_forward", gf); bench_jnum(f, "gflop_block_gemm", r->gflop_block_gemm);
    bench_jnum(f, "gflop_block_attention", r->gflop_block_attn); bench_jnum(f, "gflop_text_fusion", r->gflop_text);
    bench_jnum(f, "gflop_other", r->gflop_other); bench_jnum(f, "peak_tflops", r->peak_tflops); bench_jnum(f, "bench_s", r->total_s);
    bench_jnum(f, "mem_peak_gb", r->mem_peak_gb);
    fprintf(f, "}\n");
    bench_json_power(f, &r->power);
    const char *fn[3] = {"krea2_forward mask", "krea2_forward no mask", "replica blocks"};
    const bench_stat *fs[3] = {&r->fwd_mask, &r->fwd_nomask, &r->blocks_dev};
    for (int i = 0; i < 3; i++) {
        fprintf(f, "{"); bench_jstr(f, "type", "forward"); fputc(',', f); bench_jstr(f, "name", fn[i]);
        bench_jstat(f, "t", *fs[i]);
        bench_jnum(f, "tflops", tflops(i == 2 ? c->num_layers * (r->gflop_block_gemm + r->gflop_block_attn) : gf, fs[i]->med));
        if (i == 0) { bench_jnum(f, "warmup_ms", r->fwd_mask_warm_ms); bench_jnum(f, "out_absmax", r->out_absmax); bench_jnum(f, "finite", r->out_finite); }
        if (i == 1) { bench_jnum(f, "warmup_ms", r->fwd_nomask_warm_ms); bench_jnum(f, "maxdiff_vs_mask", r->mask_effect); }
        if (i == 2 && r->replica_checked) { bench_jnum(f, "maxdiff_vs_model", r->replica_maxdiff); bench_jnum(f, "model_absmax", r->replica_absmax); }
        fprintf(f, "}\n");
    }
    for (int k = 0; k < r->n_ops; k++) {
        const bench_op *o = &r->ops[k];
        fprintf(f, "{"); bench_jstr(f, "type", "ledger_op"); bench_jnum(f, "index", k); fputc(',', f); bench_jstr(f, "name", o->name);
        fputc(',', f); bench_jstr(f, "category", cat_name(o->cat)); bench_jstat(f, "prefix", o->prefix); bench_jnum(f, "ms", o->ms);
        bench_jstat(f, "direct", o->direct); bench_jnum(f, "ledger_ms", o->ledger_ms); bench_jnum(f, "gflop", o->gflop);
        bench_jnum(f, "tflops", o->gflop > 0 ? tflops(o->gflop, o->ledger_ms) : 0); bench_jnum(f, "gbytes", o->gbytes);
        bench_jnum(f, "gb_per_s", o->gbytes > 0 && o->ledger_ms > 0 ? o->gbytes / (o->ledger_ms * 1e-3) : 0);
        bench_jnum(f, "blocks_per_region", r->prefix_blocks);
        fprintf(f, "}\n");
    }
    for (int i = 0; i < r->n_scale; i++) {
        fprintf(f, "{"); bench_jstr(f, "type", "scale"); bench_jnum(f, "blocks", r->scale_n[i]); bench_jstat(f, "t", r->scale_t[i]);
        fprintf(f, "}\n");
    }
    if (r->n_scale) {
        fprintf(f, "{"); bench_jstr(f, "type", "blocks"); bench_jnum(f, "slope_ms", r->block_slope_ms); bench_jnum(f, "ledger_ms", r->block_ledger_ms);
        fprintf(f, "}\n");
    }
    for (int i = 0; i < r->n_shares; i++) {
        const bench_share *s = &r->shares[i];
        fprintf(f, "{"); bench_jstr(f, "type", "share"); fputc(',', f); bench_jstr(f, "name", s->name); bench_jnum(f, "level", s->level);
        bench_jnum(f, "ms", s->ms); bench_jnum(f, "share_pct", s->share); bench_jnum(f, "total_ms", r->total_ms);
        bench_jnum(f, "is_remainder", strstr(s->name, "unexplained remainder") != NULL); fputc(',', f);
        bench_jstr(f, "basis", r->shares_basis);
        fprintf(f, "}\n");
    }
    bench_json_gemms(f, r->gemm, r->n_gemm);
    if (r->attn_iso.n) {
        fprintf(f, "{"); bench_jstr(f, "type", "attention"); bench_jnum(f, "gflop", r->attn_gflop); bench_jnum(f, "inmodel_ms", r->attn_inmodel_ms);
        bench_jnum(f, "inmodel_tflops", tflops(r->attn_gflop, r->attn_inmodel_ms)); bench_jstat(f, "isolated", r->attn_iso);
        bench_jnum(f, "isolated_tflops", tflops(r->attn_gflop, r->attn_iso.med));
        if (r->attn_sus.n) { bench_jstat(f, "sustained", r->attn_sus); bench_jnum(f, "sustained_tflops", tflops(r->attn_gflop, r->attn_sus.med)); }
        bench_jnum(f, "calls_per_forward", r->c.num_layers);
        fprintf(f, "}\n");
    }
    bench_json_tail(f, &r->copy, r->copy_bytes, r->copy_gbs, r->arms, r->n_arms, r->notes, r->n_notes);
    if (fclose(f)) { dt_set_error("%s: write failed", path); return -1; }
    return 0;
}
