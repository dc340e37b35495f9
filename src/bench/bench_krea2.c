/* bench_krea2.c — Krea 2 as the bench drives it (bench_krea2_family, the interface of bench_internal.h).
 *
 * The checkpoint is synthetic (krea2_synth_write at the preset geometry, cached like the FLUX.2 ones) or --model
 * DIR. The whole forward is timed through krea2_forward itself, with the pipeline's text padding mask (its real
 * tokens computed, the padding dropped) and without a mask (every text token real), interleaved. Everything inside
 * a transformer block is timed device-only on krea2.c's own pieces: its block weights, activation set, modulation
 * fold and block ops (krea2_block_op), loaded a second time after the model is freed (the replica below). The replica is checked against the model: fed the model's stream after block 0,
 * its blocks 1..L-1 must reproduce the model's stream after the last block. Then: the transformer block's ops
 * for the ledger, block-count scaling, the step's shares (blocks from the ledger, the rest of krea2_forward),
 * the blocks' GEMM shapes and GQA attention with the mask for the utilization, and Krea 2's report sections.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_internal.h"
#include "io/json.h"
#include "models/qwen3.h"
#include "models/vae_qwenimage.h"
#include "pipeline/krea2_prompt.h"
#include "synth/synth_dit.h"
#include "synth/synth_pipeline.h"

/* ------------------------------------------------------------------ the replica: krea2.c's pieces, device-only */

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
} k2_replica;

static void replica_free(k2_replica *m) {
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

/* The outer weights (timestep MLP, modulation) and every transformer block. */
static k2_replica *replica_load(dt_backend *be, const bench_opts *o, const char *dir, const krea2_config *c) {
    k2_replica *m = dt_calloc(1, sizeof *m);
    m->be = be;
    m->lin.be = be;
    m->c = *c;
    m->w = dt_weights_open(dir);
    if (!m->w) { free(m); return NULL; }
    if (krea2_runtime_choices(be, o->precision, o->attn_precision, 0, &m->c, dir))   /* as krea2_load: fp8 attention, */
        goto fail;                                                                   /* fused producers */
    if (krea2_outer_w_load(&m->lin, m->w, c, &m->ow)) goto fail;
    m->lin.precision = o->precision;   /* --precision fp8: the blocks' Linears, as krea2_load */
    m->b = dt_calloc((size_t)c->num_layers, sizeof *m->b);
    for (int i = 0; i < c->num_layers; i++) {
        m->nb = i + 1;
        if (krea2_block_w_load(&m->lin, m->w, c, i, &m->b[i])) goto fail;
    }
    return m;
fail:
    replica_free(m);
    return NULL;
}

/* Activations for n image + t text tokens (all real: krea2_forward computes a text's real tokens only), RoPE tables
 * from pos [t+n, axes] and the modulation vectors at `timestep`, as krea2_forward sets them up. */
static void replica_alloc(k2_replica *m, int n, int t, const float *pos, float timestep) {
    dt_backend *be = m->be;
    krea2_acts_free(be, &m->x);
    if (krea2_acts_alloc(be, &m->c, n, t, 1, &m->x)) bench_die();
    krea2_acts_positions(be, &m->c, &m->x, pos);
    if (krea2_acts_mask(&m->x, NULL)) bench_die();
    krea2_time_mods(be, &m->c, &m->ow, m->b, &m->x, timestep);
    m->io = krea2_acts_block(&m->c, &m->x);
    bench_fill_randn(be, m->io.s, 5, 1.0f);
    bench_sync_or_die(be);
}

static void replica_blocks(k2_replica *m, int first, int count) {
    for (int l = first; l < first + count && l < m->nb; l++) krea2_block(m->be, &m->c, &m->b[l], &m->io, l);
}

/* What a Krea 2 run keeps besides the report. */
struct k2_state {
    float *img, *txt, *pos;       /* krea2_forward's inputs */
    uint8_t *mask;                /* [t] the pipeline's [prompt | padding | suffix] layout */
    float *trace0, *trace_last;   /* model stream after block 0 / after the last block */
    int trace_ok;
    k2_replica *rep;
};

/* ------------------------------------------------------------------ set-up */

static int write_checkpoint(bench_ctx *x, const char *dir) {
    int f = x->o->format;
    return krea2_synth_write(&x->r->krea2.c, dir, f == BENCH_FMT_Q4 ? 4 : f == BENCH_FMT_Q8 ? 8 : 0,
                             x->o->group > 0 ? x->o->group : 64, x->o->seed);
}

static int resolve_geometry(const bench_opts *o, krea2_config *c, bench_report *r) {
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
    if (o->n_double > 0) bench_note(r, "krea2 has one kind of block: --double is ignored (--single N sets the transformer blocks)");
    if (o->mlp_ratio > 0) {
        int64_t f = (int64_t)llround(c->hidden * o->mlp_ratio / 64.0) * 64;
        c->intermediate = (int)(f < 64 ? 64 : f);
    }
    return 0;
}

static void count_flops(bench_krea2_part *p, int n, int t) {
    const krea2_config *c = &p->c;
    double D = c->hidden, L = (double)n + t, dkv = (double)c->kv_heads * c->head_dim, F = c->intermediate;
    double E = c->text_dim, Ekv = (double)c->text_kv_heads * c->text_head_dim, Ft = c->text_intermediate;
    double Y = c->text_layers, T = t, N = n;
    p->gflop_block_gemm = 2.0 * L * D * (3 * D + 2 * dkv + 3 * F) * 1e-9;
    p->gflop_block_attn = 4.0 * L * L * D * 1e-9;
    double tgemm_row = 2.0 * E * (3 * E + 2 * Ekv + 3 * Ft);
    p->gflop_text = (c->n_layerwise * (T * Y * tgemm_row + 4.0 * T * Y * Y * E) +
                     c->n_refiner * (T * tgemm_row + 4.0 * T * T * E)) * 1e-9;
    p->gflop_other = (2.0 * T * (E * D + D * D) + 2.0 * N * c->in_channels * D + 2.0 * N * D * c->out_channels +
                      2.0 * (c->t_embed * D + D * D + 6 * D * D)) * 1e-9;
}

static int setup(bench_ctx *x) {
    const bench_opts *o = x->o;
    bench_report *r = x->r;
    bench_krea2_part *p = &r->krea2;
    if (o->format == BENCH_FMT_F32 && !o->model_dir) {
        dt_set_error("bench: krea2 synthetic weights are bf16, q4 or q8 (--format f32 is FLUX.2 only)");
        return -1;
    }
    if (x->cfg) {
        if (krea2_config_parse(x->cfg, x->cfg_path, &p->c)) return -1;
    } else {
        if (resolve_geometry(o, &p->c, r)) return -1;
        const krea2_config *c = &p->c;
        char key[320];
        snprintf(key, sizeof key, "krea2-D%d-H%d-kv%d-L%d-F%d-in%d-E%d-Y%d-tH%d-tkv%d-tF%d-lw%d-rf%d-%s", c->hidden,
                 c->heads, c->kv_heads, c->num_layers, c->intermediate, c->in_channels, c->text_dim, c->text_layers,
                 c->text_heads, c->text_kv_heads, c->text_intermediate, c->n_layerwise, c->n_refiner,
                 bench_fmt_name(o->format));
        if (o->format != BENCH_FMT_BF16) {
            size_t l = strlen(key);
            snprintf(key + l, sizeof key - l, "-g%d", o->group > 0 ? o->group : 64);
        }
        if (!(x->dir = bench_checkpoint(x, key, write_checkpoint))) return -1;
        snprintf(r->source, sizeof r->source, "synthetic (%s)", x->dir);
        snprintf(r->preset, sizeof r->preset, "%s", o->preset);
    }
    snprintf(r->precision, sizeof r->precision, "Linears %s, attention %s", o->precision == DT_PREC_FP8 ? "fp8" : "bf16",
             o->attn_precision == DT_PREC_FP8 ? "fp8" : "bf16");   /* (replica_load sets the replica's, as krea2_load) */
    const krea2_config *c = &p->c;
    /* workload: the options, else per-backend defaults; a real-geometry forward is ~28 TFLOP per 1000 tokens: tiny
     * on a CPU */
    const int tiny = c->hidden <= 1024;
    const bench_workload_base cpu_dflt = {tiny ? 128 : 32, tiny ? 24 : 8, tiny ? 5 : 2, tiny ? 1 : 0};
    if (bench_workload(x, &cpu_dflt, 0)) return -1;
    if (x->t < 1) { dt_set_error("bench: krea2 needs at least one text token (--text-tokens)"); return -1; }
    count_flops(p, x->n, x->t);
    r->fwd_gflop = c->num_layers * (p->gflop_block_gemm + p->gflop_block_attn) + p->gflop_text + p->gflop_other;

    /* inputs: random latents and text states, the pipeline's position ids and padding layout */
    struct k2_state *k = x->k2 = dt_calloc(1, sizeof *x->k2);
    int64_t L = (int64_t)x->n + x->t;
    k->img = dt_malloc(sizeof(float) * (size_t)x->n * c->in_channels);
    k->txt = dt_malloc(sizeof(float) * (size_t)x->t * c->text_layers * c->text_dim);
    k->pos = dt_malloc(sizeof(float) * (size_t)L * c->n_axes);
    k->mask = dt_malloc((size_t)x->t);
    krea2_synth_inputs(c, x->h, x->w, x->t, o->seed, k->img, k->txt, k->pos, k->mask);
    for (int i = 0; i < x->t; i++) p->n_valid += k->mask[i];
    {   /* the masked forward computes the real tokens only (krea2_forward drops the padding) */
        bench_krea2_part v = *p;
        count_flops(&v, x->n, krea2_text_rows(p->n_valid, x->t));
        p->gflop_forward_valid = c->num_layers * (v.gflop_block_gemm + v.gflop_block_attn) + v.gflop_text + v.gflop_other;
    }
    bench_progress("%s on %s: D %d = %d heads (%d kv) x %d, %d blocks, F %d, text %d x %d layers; %d image + %d text tokens "
                   "(%d valid); %.1f GFLOP per forward", r->preset, r->backend, c->hidden, c->heads, c->kv_heads, c->head_dim,
                   c->num_layers, c->intermediate, c->text_dim, c->text_layers, x->n, x->t, p->n_valid, r->fwd_gflop);
    return 0;
}

static void release(bench_ctx *x) {
    struct k2_state *k = x->k2;
    if (!k) return;
    replica_free(k->rep);
    free(k->img); free(k->txt); free(k->pos); free(k->mask); free(k->trace0); free(k->trace_last);
    free(k);
    x->k2 = NULL;
}

/* ------------------------------------------------------------------ whole forward */

typedef struct {
    struct k2_state *k;
    dt_backend *be;
    int last;
} trace_ud;

static void trace_cb(void *ud, const char *name, dt_mat m) {
    trace_ud *tu = ud;
    char last[32];
    snprintf(last, sizeof last, "block.%d", tu->last);
    if (!strcmp(name, "block.0")) tu->be->download(tu->be, tu->k->trace0, m);
    if (!strcmp(name, last)) { tu->be->download(tu->be, tu->k->trace_last, m); tu->k->trace_ok = 1; }
}

/* krea2_forward with the mask and without it, interleaved; then one traced forward for the replica's check. */
static int model_forward(bench_ctx *x) {
    bench_report *r = x->r;
    bench_krea2_part *p = &r->krea2;
    struct k2_state *k = x->k2;
    dt_backend *be = x->be;
    bench_progress("loading %s with krea2_load ...", x->dir);
    double t0 = dt_now();
    const krea2_load_opts lo = {.precision = x->o->precision, .attn_precision = x->o->attn_precision};
    krea2_model *km = krea2_load_ex(be, x->dir, &lo);
    if (!km) return -1;
    size_t bytes;
    krea2_weight_info(km, &bytes, r->fmt, sizeof r->fmt);
    p->weight_gb = bytes / 1e9;
    r->load_s = dt_now() - t0;
    bench_progress("loaded (%.1f s, %.2f GB of weights, %s)", r->load_s, p->weight_gb, r->fmt);
    const krea2_config *c = &p->c;
    size_t no = (size_t)x->n * c->out_channels;
    float *om = dt_malloc(sizeof(float) * no), *on = dt_malloc(sizeof(float) * no);
    double *sm = dt_malloc(sizeof(double) * x->reps), *sn = dt_malloc(sizeof(double) * x->reps);
    int wu = x->warmup > 0 ? x->warmup : 1;   /* the first call allocates: always one warm-up of each */
    bench_progress("whole forward: warm-up (%d of each) ...", wu);
    dt_power_acc pw;
    dt_power_begin(&pw, be, x->reps);
    int rc = 0;
    for (int i = -wu; i < x->reps && !rc; i++) {
        if (i >= 0) bench_progress("whole forward: rep %d/%d (mask, no mask)", i + 1, x->reps);
        for (int v = 0; v < 2 && !rc; v++) {
            bench_sync_or_die(be);
            double w0 = dt_now();
            rc = krea2_forward(km, k->img, x->n, k->txt, x->t, 0.5f, k->pos, v ? NULL : k->mask, v ? on : om, NULL, NULL);
            double ms = (dt_now() - w0) * 1e3;
            if (i >= 0) (v ? sn : sm)[i] = ms;
            else if (i == -wu) *(v ? &p->fwd_nomask_warm_ms : &p->fwd_mask_warm_ms) = ms;
        }
        if (i >= 0) dt_power_add(&pw);
    }
    r->power = dt_power_end(&pw);
    if (!rc) {
        p->fwd_mask = bench_stats(sm, x->reps);
        p->fwd_nomask = bench_stats(sn, x->reps);
        p->out_absmax = bench_max_abs(om, no);
        p->mask_effect = bench_max_abs_diff(om, on, no);
        p->out_finite = isfinite(p->out_absmax) && isfinite(bench_max_abs(on, no));
        if (!p->out_finite) bench_note(r, "WARNING: krea2_forward produced non-finite outputs");
        /* one traced forward without the mask (the replica's: every text token real): the stream after block 0 and
         * after the last block, for the replica check */
        int64_t L = (int64_t)x->n + x->t;
        k->trace0 = dt_malloc(sizeof(float) * (size_t)(L * c->hidden));
        k->trace_last = dt_malloc(sizeof(float) * (size_t)(L * c->hidden));
        trace_ud tu = {k, be, c->num_layers - 1};
        rc = krea2_forward(km, k->img, x->n, k->txt, x->t, 0.5f, k->pos, NULL, on, trace_cb, &tu);
    }
    krea2_free(km);   /* the replica loads its own copy of the blocks */
    free(om); free(on); free(sm); free(sn);
    return rc;
}

/* every block of the replica (bench_time_restored's run) */
typedef struct { k2_replica *m; int n; } blocks_run;
static void run_blocks(void *ud) {
    const blocks_run *b = ud;
    replica_blocks(b->m, 0, b->n);
}

/* ------------------------------------------------------------------ the rest of the image: text encode, VAE decode */

static int write_text_vae(bench_ctx *x, const char *dir) {
    int f = x->o->format;
    return dt_synth_krea2_text_vae(x->o->preset, dir, f == BENCH_FMT_Q4 ? 4 : f == BENCH_FMT_Q8 ? 8 : 0,
                                   x->o->group > 0 ? x->o->group : 64, x->o->seed);
}

/* The folder holding text_encoder/ and vae/ (malloc'd) and the taps: a synthetic preset's (written and cached like the
 * transformer), or --model's parent when it is a pipeline root (model_index.json's text_encoder_select_layers).
 * NULL with p->parts_note saying why not. */
static char *parts_folder(bench_ctx *x, int *taps, int *n_taps) {
    bench_krea2_part *p = &x->r->krea2;
    if (!x->cfg) {
        const krea2_config *c = &p->c;
        char key[200];
        snprintf(key, sizeof key, "krea2-text-vae-%s-E%d-Y%d-%s", x->o->preset, c->text_dim, c->text_layers,
                 bench_fmt_name(x->o->format));
        if (x->o->format != BENCH_FMT_BF16) {
            size_t l = strlen(key);
            snprintf(key + l, sizeof key - l, "-g%d", x->o->group > 0 ? x->o->group : 64);
        }
        if (dt_synth_krea2_taps(x->o->preset, taps, n_taps)) {
            snprintf(p->parts_note, sizeof p->parts_note, "no text encoder and VAE for preset %s", x->o->preset);
            return NULL;
        }
        char *d = bench_checkpoint(x, key, write_text_vae);
        if (!d) snprintf(p->parts_note, sizeof p->parts_note, "synthetic text encoder and VAE: %s", dt_last_error());
        return d;
    }
    char idx[4400];
    snprintf(idx, sizeof idx, "%s/../model_index.json", x->dir);
    json *j = access(idx, R_OK) == 0 ? json_parse_file(idx) : NULL;
    const json *t = j ? json_get(j, "text_encoder_select_layers") : NULL;
    *n_taps = 0;
    for (size_t i = 0; t && t->type == JSON_ARRAY && i < t->len && i < 16; i++) {
        const json *e = json_at(t, i);
        if (e && e->type == JSON_NUMBER && e->number >= 0) taps[(*n_taps)++] = (int)e->number;
    }
    json_free(j);
    if (!*n_taps) {
        snprintf(p->parts_note, sizeof p->parts_note, "--model is not inside a Krea 2 pipeline folder (no ../model_index.json "
                 "with text_encoder_select_layers)");
        return NULL;
    }
    char *d = dt_malloc(strlen(x->dir) + 4);
    sprintf(d, "%s/..", x->dir);
    return d;
}

/* The Qwen3-VL encode of one prompt block as the pipeline lays it out (krea2_tokenize: system prefix + 12 prompt
 * tokens + padding to the workload's text tokens + the 5-token suffix, positions counting real tokens only), and the
 * Qwen-Image decode of a latent of the workload's image to 8-bit RGB, each timed wall clock (host in and out, as
 * generate runs them). */
static void image_parts(bench_ctx *x) {
    bench_krea2_part *p = &x->r->krea2;
    dt_backend *be = x->be;
    int taps[16], n_taps = 0, max_tap = 0;
    char *root = parts_folder(x, taps, &n_taps);
    if (!root) { bench_note(x->r, "text encode and VAE decode not timed: %s", p->parts_note); return; }
    snprintf(p->parts_src, sizeof p->parts_src, "%s", root);
    for (int i = 0; i < n_taps; i++) if (taps[i] > max_tap) max_tap = taps[i];
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/text_encoder", root);
    bench_progress("text encoder %s (layers 1..%d) ...", dir, max_tap);
    dt_qwen3 *te = dt_qwen3_load(be, dir, max_tap);
    if (!te) { snprintf(p->parts_note, sizeof p->parts_note, "%s", dt_last_error()); bench_note(x->r, "text encoder: %s", p->parts_note); free(root); return; }
    const dt_qwen3_config *tc = dt_qwen3_get_config(te);
    const int block = x->t > DT_KREA2_PROMPT_SUFFIX_TOKENS ? x->t - DT_KREA2_PROMPT_SUFFIX_TOKENS : 1;
    const int T = DT_KREA2_PROMPT_DROP + block + DT_KREA2_PROMPT_SUFFIX_TOKENS, prompt = block < 12 ? block : 12;
    int32_t *ids = dt_malloc(sizeof(int32_t) * T), *mask = dt_malloc(sizeof(int32_t) * T), *pos = dt_malloc(sizeof(int32_t) * T);
    int real = 0;
    for (int i = 0; i < T; i++) {
        mask[i] = i < DT_KREA2_PROMPT_DROP + prompt || i >= T - DT_KREA2_PROMPT_SUFFIX_TOKENS;
        ids[i] = (int32_t)((7 + 31 * i) % tc->vocab);
        real += mask[i];
        pos[i] = real > 0 ? real - 1 : 0;
    }
    p->te_tokens = T;
    p->te_valid = real;
    p->te_layers = dt_qwen3_loaded_layers(te);
    const double E = tc->hidden, q = (double)tc->heads * tc->head_dim, kv = (double)tc->kv_heads * tc->head_dim;
    p->gflop_te = p->te_layers * (2.0 * T * (E * q + 2 * E * kv + q * E + 3 * E * tc->intermediate) + 4.0 * T * T * q) * 1e-9;
    float *out = dt_malloc(sizeof(float) * (size_t)T * n_taps * tc->hidden);
    const int wu = x->warmup > 0 ? x->warmup : 1;
    double *ms = dt_malloc(sizeof(double) * (size_t)x->reps);
    int rc = 0;
    for (int i = -wu; i < x->reps && !rc; i++) {
        bench_sync_or_die(be);
        double t0 = dt_now();
        rc = dt_qwen3_encode_at(te, ids, mask, pos, T, taps, n_taps, out);
        if (i >= 0) ms[i] = (dt_now() - t0) * 1e3;
    }
    if (!rc) p->te_enc = bench_stats(ms, x->reps);
    dt_qwen3_free(te);
    free(ids); free(mask); free(pos); free(out);
    if (rc) bench_note(x->r, "text encode failed: %s", dt_last_error());
    /* the VAE: a latent [z, 2h, 2w] of the workload's image (the transformer's tokens are 2x2 latent patches) */
    dt_qvae *vae = rc ? NULL : dt_qvae_load(be, root);
    if (!rc && !vae) bench_note(x->r, "VAE: %s", dt_last_error());
    if (vae) {
        const dt_qvae_config *vc = dt_qvae_get_config(vae);
        p->lat_h = 2 * x->h;
        p->lat_w = 2 * x->w;
        size_t nl = (size_t)vc->z_dim * p->lat_h * p->lat_w;
        float *lat = dt_malloc(sizeof(float) * nl);
        for (size_t i = 0; i < nl; i++) lat[i] = x->k2->img[i % ((size_t)x->n * p->c.in_channels)];
        const int s = p->vae_scale = vc->scale_factor;
        uint8_t *rgb = dt_malloc((size_t)3 * p->lat_h * s * p->lat_w * s);
        p->gflop_vae = dt_qvae_decode_gflop(vc, p->lat_h, p->lat_w);
        bench_progress("VAE decode %dx%d ...", p->lat_w * s, p->lat_h * s);
        for (int i = -wu; i < x->reps && !rc; i++) {
            bench_sync_or_die(be);
            double t0 = dt_now();
            rc = dt_qvae_decode_rgb8(vae, lat, p->lat_h, p->lat_w, rgb);
            if (i >= 0) ms[i] = (dt_now() - t0) * 1e3;
        }
        if (!rc) p->vae_dec = bench_stats(ms, x->reps);
        else bench_note(x->r, "VAE decode failed: %s", dt_last_error());
        dt_qvae_free(vae);
        free(lat); free(rgb);
    }
    p->parts = !rc && p->te_enc.n && p->vae_dec.n;
    free(ms);
    free(root);
}

/* The replica: loaded, checked against the model, every block timed device-only. */
static int whole_forward(bench_ctx *x) {
    if (model_forward(x)) return -1;
    image_parts(x);
    bench_report *r = x->r;
    bench_krea2_part *p = &r->krea2;
    struct k2_state *k = x->k2;
    const krea2_config *c = &p->c;
    dt_backend *be = x->be;
    bench_progress("loading the block replica (%d blocks) ...", c->num_layers);
    if (!(k->rep = replica_load(be, x->o, x->dir, c))) return -1;
    k2_replica *m = k->rep;
    replica_alloc(m, x->n, x->t, k->pos, 0.5f);
    int64_t L = (int64_t)x->n + x->t, D = c->hidden;
    if (c->num_layers > 1 && k->trace_ok) {
        float *got = dt_malloc(sizeof(float) * (size_t)(L * D));
        be->upload(be, m->io.s, k->trace0);
        replica_blocks(m, 1, c->num_layers - 1);
        be->download(be, got, m->io.s);
        p->replica_checked = 1;
        p->replica_maxdiff = bench_max_abs_diff(got, k->trace_last, (size_t)(L * D));
        p->replica_absmax = bench_max_abs(k->trace_last, (size_t)(L * D));
        free(got);
        double tol = (x->is_cpu ? 1e-5 : 2e-2) * (p->replica_absmax > 1 ? p->replica_absmax : 1);
        if (!(p->replica_maxdiff <= tol))
            bench_note(r, "WARNING: the replica's blocks 1..%d differ from krea2_forward's by %.3g (max |stream| %.3g): the "
                          "ledger may not describe the model's blocks", c->num_layers - 1, p->replica_maxdiff, p->replica_absmax);
    } else {
        bench_note(r, "replica check skipped (needs at least 2 transformer blocks)");
    }
    /* device-only: every block; the stream is restored outside the timed region */
    dt_mat s0 = dt_alloc_or_die(be, L, D, be->act_dtype);
    be->upload(be, s0, k->trace0);
    blocks_run br = {m, c->num_layers};
    p->blocks_dev = bench_time_restored(be, m->io.s, s0, x->warmup, x->reps, run_blocks, &br);
    be->free(be, &s0);
    r->fwd_ms = p->fwd_nomask.med;
    snprintf(r->fwd_what, sizeof r->fwd_what, "whole forward, %d text tokens", x->t);
    r->floor_ms = p->blocks_dev.n ? p->blocks_dev.med : 0;
    snprintf(r->floor_what, sizeof r->floor_what, "The %d transformer blocks (device-only)", c->num_layers);
    return 0;
}

/* ------------------------------------------------------------------ the ledger's block: a transformer block */

static const bench_op_desc block_ops[KREA2_OP_COUNT] = {
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

static int n_blocks(bench_ctx *x) { return x->k2->rep->nb; }

static double block_bytes(bench_ctx *x) {
    static const char *const names[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_gate", "attn.to_out.0",
                                        "ff.gate", "ff.up", "ff.down"};
    return bench_block_weight_bytes(x->k2->rep->w, "transformer_blocks.0", names, sizeof names / sizeof names[0]);
}

static void block_op(bench_ctx *x, int b, int k, int split) {
    k2_replica *m = x->k2->rep;
    krea2_block_op(m->be, &m->c, &m->b[b], &m->io, b, k, split);
}

static dt_mat stream(bench_ctx *x) { return x->k2->rep->io.s; }

static void op_work(bench_ctx *x, bench_op *ops) {
    const bench_krea2_part *p = &x->r->krea2;
    const krea2_config *c = &p->c;
    double es = (double)dt_dtype_size(x->be->act_dtype), L = (double)x->n + x->t, D = c->hidden, F = c->intermediate;
    double dkv = (double)c->kv_heads * c->head_dim;
    ops[KREA2_OP_QKVG].gflop = 2.0 * L * D * (2 * D + 2 * dkv) * 1e-9;
    ops[KREA2_OP_OUT].gflop = 2.0 * L * D * D * 1e-9;
    ops[KREA2_OP_MLPIN].gflop = 2.0 * L * D * 2 * F * 1e-9;
    ops[KREA2_OP_DOWN].gflop = 2.0 * L * F * D * 1e-9;
    ops[KREA2_OP_ATTN].gflop = p->gflop_block_attn;
    /* least traffic (each input read once, each output written once; a fused modulated norm moves 2 L D) */
    ops[KREA2_OP_NORM1].gbytes = ops[KREA2_OP_NORM2].gbytes = 2 * L * D * es * 1e-9;
    ops[KREA2_OP_QKNORM].gbytes = 2 * L * (D + 2 * dkv) * es * 1e-9 - L * dkv * es * 1e-9;   /* Q and K in place */
    ops[KREA2_OP_GATE].gbytes = 3 * L * D * es * 1e-9;
    ops[KREA2_OP_RESID1].gbytes = ops[KREA2_OP_RESID2].gbytes = 3 * L * D * es * 1e-9;
    ops[KREA2_OP_SWIGLU].gbytes = 3 * L * F * es * 1e-9;
}

/* Block-count scaling (bench_block_scaling) of the replica's blocks, on a copy of the stream the forward left. */
static void scale_run(void *ud, int blocks) { replica_blocks(ud, 0, blocks); }

static void scaling(bench_ctx *x) {
    bench_krea2_part *p = &x->r->krea2;
    k2_replica *m = x->k2->rep;
    dt_backend *be = x->be;
    dt_mat s0 = dt_alloc_or_die(be, m->io.s.rows, m->io.s.cols, be->act_dtype);
    be->copy(be, s0, m->io.s);
    bench_block_scaling(x, p->c.num_layers, m->io.s, s0, p->blocks_dev, scale_run, m, &p->scale);
    be->free(be, &s0);
}

/* Shares of krea2_forward without a mask (the replica's workload): the blocks from the ledger (times the blocks), the
 * rest of the forward (krea2_forward - the replica's blocks) and the unexplained remainder (the replica's blocks -
 * ledger x blocks). */
static void shares(bench_ctx *x) {
    bench_report *r = x->r;
    const bench_krea2_part *p = &r->krea2;
    double nl = p->c.num_layers;
    r->total_ms = p->fwd_nomask.med;
    snprintf(r->shares_of, sizeof r->shares_of, "krea2_forward without a mask (%d text tokens)", x->t);
    snprintf(r->shares_how, sizeof r->shares_how, "times %d blocks. Rest = krea2_forward - the replica's blocks (text "
             "fusion, txt_in/img_in, timestep MLP + host modulation fold, final layer, host uploads/download); remainder "
             "= replica blocks - ledger block x blocks.", p->c.num_layers);
    double cat[3];
    bench_ledger_by_cat(r, cat);
    const bench_op *o = r->ops;
    bench_add_share(r, "transformer-block GEMMs (q/k/v/gate, out, MLP)", nl * cat[BENCH_CAT_GEMM], 0);
    bench_add_share(r, "q/k/v + gate", nl * o[KREA2_OP_QKVG].ledger_ms, 1);
    bench_add_share(r, "out", nl * o[KREA2_OP_OUT].ledger_ms, 1);
    bench_add_share(r, "MLP gate + up, down", nl * (o[KREA2_OP_MLPIN].ledger_ms + o[KREA2_OP_DOWN].ledger_ms), 1);
    bench_add_share(r, "attention (GQA)", nl * cat[BENCH_CAT_ATTN], 0);
    bench_add_share(r, "elementwise (modulated norms, QK norm, RoPE, gate, SwiGLU, residuals)", nl * cat[BENCH_CAT_ELEM], 0);
    bench_add_share(r, "modulated norms (RMSNorm + shift add)", nl * (o[KREA2_OP_NORM1].ledger_ms + o[KREA2_OP_NORM2].ledger_ms), 1);
    bench_add_share(r, "QK norm + RoPE", nl * (o[KREA2_OP_QKNORM].ledger_ms + o[KREA2_OP_ROPE].ledger_ms), 1);
    bench_add_share(r, "gate multiply + SwiGLU", nl * (o[KREA2_OP_GATE].ledger_ms + o[KREA2_OP_SWIGLU].ledger_ms), 1);
    bench_add_share(r, "gated residuals", nl * (o[KREA2_OP_RESID1].ledger_ms + o[KREA2_OP_RESID2].ledger_ms), 1);
    double blocks_ledger = nl * (cat[0] + cat[1] + cat[2]);
    bench_shares_rest(r, blocks_ledger, p->fwd_nomask.med - p->blocks_dev.med,
                      "rest: text fusion, embedders, modulation, final layer, host I/O",
                      "unexplained remainder (replica blocks - ledger x blocks)");
}

/* ------------------------------------------------------------------ utilization: GEMM shapes, attention */

static int gemm_shapes(bench_ctx *x, bench_gemm_shape *out, int max) {
    const krea2_config *c = &x->r->krea2.c;
    k2_replica *m = x->k2->rep;
    int64_t D = c->hidden, F = c->intermediate, dkv = (int64_t)c->kv_heads * c->head_dim, L = (int64_t)x->n + x->t;
    int nl = c->num_layers;
    const struct { const char *name, *tensor; int64_t K, N; int count, op, per_block; } defs[] = {
        {"to_q / to_gate", "attn.to_q", D, D, 2 * nl, KREA2_OP_QKVG, 2},
        {"to_k / to_v", "attn.to_k", D, dkv, 2 * nl, KREA2_OP_QKVG, 2},
        {"to_out.0", "attn.to_out.0", D, D, nl, KREA2_OP_OUT, 1},
        {"ff.gate / ff.up", "ff.gate", D, F, 2 * nl, KREA2_OP_MLPIN, 2},
        {"ff.down", "ff.down", F, D, nl, KREA2_OP_DOWN, 1},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof defs / sizeof defs[0] && n < max; i++) {
        bench_gemm_shape *s = &out[n++];
        memset(s, 0, sizeof *s);
        s->name = defs[i].name;
        s->M = L; s->K = defs[i].K; s->N = defs[i].N;
        s->count = defs[i].count;
        s->inmodel_op = defs[i].op;
        s->per_block = defs[i].per_block;
        char nm[160];
        snprintf(nm, sizeof nm, "transformer_blocks.0.%s", defs[i].tensor);
        if (dt_weights_linear(m->w, nm, -1, -1, -1, &s->src)) bench_die();
        s->have_src = 1;
        for (int b = 0; b < m->nb && s->nw < 64; b++) {
            const krea2_block_w *kb = &m->b[b];
            const dt_linear *l[] = {kb->attn.q, kb->attn.k, kb->attn.out, kb->ff.gate, kb->ff.down};
            s->w[s->nw++] = (dt_linear *)l[i];
        }
    }
    return n;
}

static void attention(bench_ctx *x, bench_attn_shape *a) {
    const krea2_config *c = &x->r->krea2.c;
    a->hq = c->heads;
    a->hkv = c->kv_heads;
    a->hd = c->head_dim;
    a->bias = dt_mat_null();   /* as in the model: GQA over real keys only */
    a->calls = c->num_layers;
    snprintf(x->r->attn_what, sizeof x->r->attn_what, "attention, GQA %d/%d", c->heads, c->kv_heads);
}

/* ------------------------------------------------------------------ arms */

/* Krea 2's attention: grouped-query over the pipeline's padded layout; native GQA vs repeated K/V, and the padding
 * as a key bias (the reference's mask) vs compacted keys (what krea2_forward does) vs none. */
static void arm_attention(bench_ctx *x) {
    const krea2_config *c = &x->r->krea2.c;
    const uint8_t *mask = x->k2->mask;
    int64_t L = (int64_t)x->n + x->t;
    dt_mat bias = dt_alloc_or_die(x->be, 1, L, DT_F32);   /* [1, L]: -inf on the padded text keys */
    float *bh = dt_malloc(sizeof(float) * (size_t)L);
    for (int64_t j = 0; j < L; j++) bh[j] = j < x->t && !mask[j] ? -INFINITY : 0.0f;
    x->be->upload(x->be, bias, bh);
    free(bh);
    if (c->kv_heads == c->heads)
        skip_arm(x->r, "gqa", "native GQA", "repeated KV", "kv heads = heads (pass --kv-heads)");
    else
        bench_arm_gqa(x, L, c->heads, c->kv_heads, c->head_dim, bias, 3, "diffusers' repeat_interleave");
    bench_arm_key_padding(x, c->heads, c->kv_heads, c->head_dim, bias, mask);
    x->be->free(x->be, &bias);
}

static const bench_arm_entry arms[] = {{"attention", arm_attention}, {NULL, NULL}};

/* ------------------------------------------------------------------ report: Krea 2's own sections */

static void md_head(const bench_report *r, FILE *f) {
    const bench_krea2_part *p = &r->krea2;
    const krea2_config *c = &p->c;
    double gf = r->fwd_gflop, nl = c->num_layers;
    fprintf(f, "# ditrun bench: %s (Krea 2) on %s (%s)\n\n| setup | value |\n|---|---|\n", r->preset, r->backend, r->fmt);
    fprintf(f, "| weights | %s (%.2f GB) |\n", r->source, p->weight_gb);
    fprintf(f, "| geometry | D %d = %d q heads (%d kv) x %d, MLP %d, %d blocks; in %d; text %d (%d/%d heads, MLP %d) x %d "
               "layers, %d layerwise + %d refiner blocks |\n", c->hidden, c->heads, c->kv_heads, c->head_dim, c->intermediate,
            c->num_layers, c->in_channels, c->text_dim, c->text_heads, c->text_kv_heads, c->text_intermediate,
            c->text_layers, c->n_layerwise, c->n_refiner);
    fprintf(f, "| workload | image %d px -> %d image tokens + %d text tokens (%d valid, [prompt | padding | suffix]) = %d |\n",
            r->image_size, r->n_img, r->n_txt, p->n_valid, r->n_img + r->n_txt);
    fprintf(f, "| work per forward | %.1f GFLOP: blocks %.1f GEMM + %.1f attention, text fusion %.1f, embedders/final %.1f |\n",
            gf, nl * p->gflop_block_gemm, nl * p->gflop_block_attn, p->gflop_text, p->gflop_other);
    bench_md_setup_end(r, f, "krea2_load");

    fprintf(f, "## Whole forward\n\n| what | median ms | p10-p90 ms | min-max ms | TFLOPS |\n|---|---:|---:|---:|---:|\n");
    char mrow[160];
    snprintf(mrow, sizeof mrow, "krea2_forward with the pipeline's mask: its %d real text tokens computed, %d rows (wall "
             "clock incl. host I/O)", p->n_valid, krea2_text_rows(p->n_valid, r->n_txt));
    bench_md_stat_row(f, mrow, p->fwd_mask, p->gflop_forward_valid);
    bench_md_stat_row(f, "krea2_forward without a mask: every text token computed", p->fwd_nomask, gf);
    if (p->blocks_dev.n) {
        char what[96];
        snprintf(what, sizeof what, "replica: the %d transformer blocks (device-only, events)", c->num_layers);
        bench_md_stat_row(f, what, p->blocks_dev, nl * (p->gflop_block_gemm + p->gflop_block_attn));
    }
    fprintf(f, "\nWarm-up (excluded): first forward %.3f ms with mask, %.3f ms without. Output %s, max |out| %.3g; "
               "max |out(mask) - out(no mask)| %.3g (the mask drops %d padded text tokens). ",
            p->fwd_mask_warm_ms, p->fwd_nomask_warm_ms, p->out_finite ? "finite" : "NOT FINITE", p->out_absmax, p->mask_effect,
            r->n_txt - p->n_valid);
    if (p->replica_checked)
        fprintf(f, "Replica blocks 1..%d fed the model's stream after block 0 vs the model's stream after block %d: "
                   "max |diff| %.3g (max |stream| %.3g).\n\n", c->num_layers - 1, c->num_layers - 1, p->replica_maxdiff,
                p->replica_absmax);
    else fprintf(f, "\n\n");
    bench_md_power(f, &r->power, "timed pair");
    if (!p->parts) return;
    fprintf(f, "## The rest of the image: text encode and VAE decode\n\n| what | median ms | p10-p90 ms | min-max ms | "
               "TFLOPS |\n|---|---:|---:|---:|---:|\n");
    char what[160];
    snprintf(what, sizeof what, "text encode: Qwen3-VL, %d rows (%d real), layers 1..%d (wall clock incl. host I/O)",
             p->te_tokens, p->te_valid, p->te_layers);
    bench_md_stat_row(f, what, p->te_enc, p->gflop_te);
    snprintf(what, sizeof what, "VAE decode: Qwen-Image, latent %dx%d -> %dx%d 8-bit RGB (wall clock incl. host I/O)",
             p->lat_w, p->lat_h, p->vae_scale * p->lat_w, p->vae_scale * p->lat_h);
    bench_md_stat_row(f, what, p->vae_dec, p->gflop_vae);
    fprintf(f, "\nA generated image runs the text encode once per prompt (twice with guidance: the negative prompt too) and "
               "the VAE decode once; the transformer runs steps x (1 or 2) forwards. Work counted: the encoder's GEMMs and "
               "attention over every row (%.3g GFLOP), the decoder's convolutions and mid-block attention (%.3g GFLOP).\n\n",
            p->gflop_te, p->gflop_vae);
}

static void md_scaling(const bench_report *r, FILE *f) {
    bench_md_block_scaling(f, &r->krea2.scale, r->block_ledger_ms, "replica, device-only");
}

static void json_head(const bench_report *r, FILE *f) {
    const bench_krea2_part *p = &r->krea2;
    const krea2_config *c = &p->c;
    double gf = r->fwd_gflop;
    fprintf(f, "{"); bench_jstr(f, "type", "setup"); fputc(',', f); bench_jstr(f, "model", "krea2"); fputc(',', f);
    bench_jstr(f, "preset", r->preset); fputc(',', f); bench_jstr(f, "backend", r->backend); fputc(',', f); bench_jstr(f, "format", r->fmt);
    fputc(',', f); bench_jstr(f, "weights", r->source);
    bench_jnum(f, "hidden", c->hidden); bench_jnum(f, "heads", c->heads); bench_jnum(f, "kv_heads", c->kv_heads); bench_jnum(f, "head_dim", c->head_dim);
    bench_jnum(f, "intermediate", c->intermediate); bench_jnum(f, "blocks", c->num_layers); bench_jnum(f, "text_dim", c->text_dim);
    bench_jnum(f, "text_layers", c->text_layers); bench_jnum(f, "image_size", r->image_size); bench_jnum(f, "image_tokens", r->n_img);
    bench_jnum(f, "text_tokens", r->n_txt); bench_jnum(f, "valid_text_tokens", p->n_valid); bench_jnum(f, "reps", r->reps);
    bench_jnum(f, "warmup", r->warmup); bench_jnum(f, "cache_mb", r->l2_mb); bench_jnum(f, "synth_s", r->synth_s); bench_jnum(f, "load_s", r->load_s);
    bench_jnum(f, "weight_gb", p->weight_gb); bench_jnum(f, "gflop_forward", gf); bench_jnum(f, "gflop_block_gemm", p->gflop_block_gemm);
    bench_jnum(f, "gflop_block_attention", p->gflop_block_attn); bench_jnum(f, "gflop_text_fusion", p->gflop_text);
    bench_jnum(f, "gflop_other", p->gflop_other); bench_jnum(f, "peak_tflops", r->peak_tflops); bench_jnum(f, "bench_s", r->total_s);
    bench_jnum(f, "mem_peak_gb", r->mem_peak_gb);
    fprintf(f, "}\n");
    bench_json_power(f, &r->power);
    const char *fn[3] = {"krea2_forward mask", "krea2_forward no mask", "replica blocks"};
    const bench_stat *fs[3] = {&p->fwd_mask, &p->fwd_nomask, &p->blocks_dev};
    for (int i = 0; i < 3; i++) {
        fprintf(f, "{"); bench_jstr(f, "type", "forward"); fputc(',', f); bench_jstr(f, "name", fn[i]);
        bench_jstat(f, "t", *fs[i]);
        bench_jnum(f, "tflops", bench_tflops(i == 2 ? c->num_layers * (p->gflop_block_gemm + p->gflop_block_attn)
                                             : i == 0 ? p->gflop_forward_valid : gf, fs[i]->med));
        if (i == 0) { bench_jnum(f, "warmup_ms", p->fwd_mask_warm_ms); bench_jnum(f, "out_absmax", p->out_absmax); bench_jnum(f, "finite", p->out_finite); }
        if (i == 1) { bench_jnum(f, "warmup_ms", p->fwd_nomask_warm_ms); bench_jnum(f, "maxdiff_vs_mask", p->mask_effect); }
        if (i == 2 && p->replica_checked) { bench_jnum(f, "maxdiff_vs_model", p->replica_maxdiff); bench_jnum(f, "model_absmax", p->replica_absmax); }
        fprintf(f, "}\n");
    }
    if (!p->parts) return;
    const char *pn[2] = {"text encode", "vae decode"};
    const bench_stat *ps[2] = {&p->te_enc, &p->vae_dec};
    const double pg[2] = {p->gflop_te, p->gflop_vae};
    for (int i = 0; i < 2; i++) {
        fprintf(f, "{"); bench_jstr(f, "type", "image_part"); fputc(',', f); bench_jstr(f, "name", pn[i]);
        bench_jstat(f, "t", *ps[i]);
        bench_jnum(f, "gflop", pg[i]); bench_jnum(f, "tflops", bench_tflops(pg[i], ps[i]->med));
        if (i == 0) { bench_jnum(f, "rows", p->te_tokens); bench_jnum(f, "real_rows", p->te_valid); bench_jnum(f, "layers", p->te_layers); }
        else { bench_jnum(f, "latent_h", p->lat_h); bench_jnum(f, "latent_w", p->lat_w); }
        fprintf(f, "}\n");
    }
}

static void json_scaling(const bench_report *r, FILE *f) { bench_json_block_scaling(f, &r->krea2.scale, r->block_ledger_ms); }

const bench_family bench_krea2_family = {
    .name = "Krea 2",
    .family = &dt_family_krea2,
    .setup = setup,
    .whole_forward = whole_forward,
    .release = release,
    .block_kind = "transformer block",
    .ledger_note = "The modulated norm is one rmsnorm_mod pass (RMSNorm with the folded weight, plus the shift); with "
                   "--precision fp8 it runs inside the q/k/v + gate and the MLP gate + up ops (rmsnorm_mod_linears: the "
                   "norm writes the fp8 GEMMs' input once), so those rows hold it and the norm rows are empty.",
    .n_ops = KREA2_OP_COUNT,
    .ops = block_ops,
    .op_qknorm = KREA2_OP_QKNORM,
    .op_rope = KREA2_OP_ROPE,
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
