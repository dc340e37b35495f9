/* bench.c — orchestration of `ditrun bench`: resolve the geometry (preset + overrides) and the
 * backend defaults, write or reuse the cached synthetic checkpoint (or take --model), time the whole
 * forward (flux2_forward in-model vs the bench's device-only replica, interleaved, outputs compared),
 * then run the ledger, utilization and A/B-arm parts. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_internal.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "pipeline/latents.h"

void bench_opts_default(bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->preset = "klein-4b";
    o->hidden = o->heads = o->kv_heads = o->n_double = o->n_single = -1;
    o->format = BENCH_FMT_Q4;
    o->group = -1;
    o->image_size = o->text_tokens = -1;
    o->reps = o->warmup = -1;
    o->backend = "auto";
    o->be.rope_fp32 = 1;
    o->sections = BENCH_ALL;
    o->seed = 1;
}

static const char *fmt_name(int f) {
    switch (f) {
    case BENCH_FMT_F32: return "f32";
    case BENCH_FMT_BF16: return "bf16";
    case BENCH_FMT_Q4: return "q4";
    case BENCH_FMT_Q8: return "q8";
    }
    return "?";
}

/* ------------------------------------------------------------------ synthetic checkpoint cache */

static int dir_complete(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.bench-complete", dir);
    return access(p, F_OK) == 0;
}

static int mark_complete(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.bench-complete", dir);
    FILE *f = fopen(p, "w");
    if (!f) { dt_set_error("%s: cannot create (%s)", p, strerror(errno)); return -1; }
    fprintf(f, "ok\n");
    fclose(f);
    return 0;
}

static void remove_tree_files(const char *dir) {
    const char *names[] = {".bench-complete", "config.json", "model.safetensors"};
    char p[4200];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
}

/* f32 copy of a bf16 checkpoint (flux2_synth_write writes bf16 or quantized only). */
static int write_f32_copy(const char *src_dir, const char *dst_dir) {
    if (mkdir(dst_dir, 0755) && errno != EEXIST) { dt_set_error("%s: cannot create folder (%s)", dst_dir, strerror(errno)); return -1; }
    char p[4200], q[4200];
    snprintf(p, sizeof p, "%s/config.json", src_dir);
    snprintf(q, sizeof q, "%s/config.json", dst_dir);
    FILE *fi = fopen(p, "rb"), *fo = fopen(q, "wb");
    if (!fi || !fo) {
        if (fi) fclose(fi);
        if (fo) fclose(fo);
        dt_set_error("%s: cannot copy config.json", dst_dir);
        return -1;
    }
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, fi)) > 0) fwrite(buf, 1, k, fo);
    fclose(fi);
    if (fclose(fo)) { dt_set_error("%s: write failed", q); return -1; }
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

static void cache_key(const flux2_config *c, int fmt, int group, char *key, size_t len) {
    snprintf(key, len, "flux2-D%d-H%d-hd%d-d%d-s%d-F%d-in%d-j%d-%s", c->hidden, c->heads, c->head_dim, c->num_layers,
             c->num_single_layers, c->mlp_hidden, c->in_channels, c->joint_dim, fmt_name(fmt));
    if (fmt == BENCH_FMT_Q4 || fmt == BENCH_FMT_Q8) {
        size_t l = strlen(key);
        snprintf(key + l, len - l, "-g%d", group);
    }
}

/* Returns the folder holding the synthetic checkpoint (malloc'd) or NULL. */
static char *synth_checkpoint(const bench_opts *o, const flux2_config *c, int group, bench_report *r) {
    const char *base = o->cache_dir;
    char root[1024];
    if (!base) {
        const char *tmp = getenv("TMPDIR");
        snprintf(root, sizeof root, "%s/ditrun-bench-cache", tmp && *tmp ? tmp : "/tmp");
        base = root;
    }
    if (mkdir(base, 0755) && errno != EEXIST) { dt_set_error("%s: cannot create folder (%s)", base, strerror(errno)); return NULL; }
    char key[256], dir[1400];
    cache_key(c, o->format, group, key, sizeof key);
    snprintf(dir, sizeof dir, "%s/%s", base, key);
    if (!o->fresh && dir_complete(dir)) {
        bench_progress("using cached synthetic checkpoint %s", dir);
        return dt_strdup(dir);
    }
    /* write into a private folder, then rename it into place: concurrent runs never see half a checkpoint */
    char tmpd[1500];
    snprintf(tmpd, sizeof tmpd, "%s.tmp-%d", dir, (int)getpid());
    remove_tree_files(tmpd);
    double t0 = dt_now();
    if (o->format == BENCH_FMT_F32) {
        char bdir[1600];
        snprintf(bdir, sizeof bdir, "%s.bf16", tmpd);
        bench_progress("writing synthetic bf16 checkpoint %s (then converting to f32) ...", bdir);
        int rc = flux2_synth_write(c, bdir, 0, 64, o->seed);
        if (rc == 0) rc = write_f32_copy(bdir, tmpd);
        remove_tree_files(bdir);
        rmdir(bdir);
        if (rc) { remove_tree_files(tmpd); rmdir(tmpd); return NULL; }
    } else {
        int bits = o->format == BENCH_FMT_Q4 ? 4 : o->format == BENCH_FMT_Q8 ? 8 : 0;
        bench_progress("writing synthetic %s checkpoint %s ...", fmt_name(o->format), dir);
        if (flux2_synth_write(c, tmpd, bits, group, o->seed)) { remove_tree_files(tmpd); rmdir(tmpd); return NULL; }
    }
    if (mark_complete(tmpd)) { remove_tree_files(tmpd); rmdir(tmpd); return NULL; }
    if (o->fresh || !dir_complete(dir)) {   /* replace a stale or incomplete folder */
        remove_tree_files(dir);
        rmdir(dir);
    }
    if (rename(tmpd, dir)) {
        remove_tree_files(tmpd);
        rmdir(tmpd);
        if (!dir_complete(dir)) { dt_set_error("%s: cannot move the synthetic checkpoint into place (%s)", dir, strerror(errno)); return NULL; }
        bench_progress("another run wrote %s first; using it", dir);
    }
    r->synth_s = dt_now() - t0;
    bench_progress("wrote it in %.1f s", r->synth_s);
    return dt_strdup(dir);
}

/* ------------------------------------------------------------------ geometry */

static int resolve_geometry(const bench_opts *o, flux2_config *c) {
    if (!strncmp(o->preset, "krea2", 5)) {
        dt_set_error("bench: Krea 2 presets are benchmarked by bench_krea2_run (bench_krea2.h; `ditrun bench --preset "
                     "krea2` dispatches there), not bench_run");
        return -1;
    }
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

/* ------------------------------------------------------------------ inputs */

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

/* ------------------------------------------------------------------ whole forward */

static int whole_forward(bench_ctx *x) {
    bench_report *r = x->r;
    dt_backend *be = x->be;
    const flux2_config *c = &r->c;
    bench_progress("loading %s with flux2_load ...", x->dir);
    double t0 = dt_now();
    flux2_model *fm = flux2_load(be, x->dir);
    if (!fm) return -1;
    size_t bytes;
    flux2_weight_info(fm, &bytes, r->fmt, sizeof r->fmt);
    if (x->o->format == BENCH_FMT_F32 && !x->o->model_dir) snprintf(r->fmt, sizeof r->fmt, "f32");
    r->load_s = dt_now() - t0;
    bench_progress("loaded (%.1f s, %.2f GB of weights, %s); loading the bench replica ...", r->load_s, bytes / 1e9, r->fmt);
    x->bm = bm_load(be, x->dir, -1, -1, 1, 0);
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
        if (i == 0) { r->fwd_model_warm_ms = w1; r->fwd_dev_warm_ms = w2; }
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
            return -1;
        }
        sm[i] = (dt_now() - w0) * 1e3;
        bench_timer_start(&tm);
        bm_forward(x->bm, c->num_layers, c->num_single_layers);
        sd[i] = bench_timer_stop(&tm);
        dt_power_add(&pw);
    }
    r->power = dt_power_end(&pw);
    r->fwd_model = bench_stats(sm, x->reps);
    r->fwd_dev = bench_stats(sd, x->reps);

    be->download(be, out_r, x->bm->x.out);
    r->fwd_maxdiff = bench_max_abs_diff(out_r, out_m, no);
    r->fwd_absmax = bench_max_abs(out_m, no);
    bench_timer_free(&tm);
    flux2_free(fm);
    free(out_m); free(out_r); free(sm); free(sd);
    if (!(r->fwd_maxdiff <= 1e-3 * (r->fwd_absmax > 1 ? r->fwd_absmax : 1)))
        bench_note(r, "WARNING: the bench replica's output differs from flux2_forward by %.3g (max |out| %.3g): "
                   "the ledger may not describe the model's forward", r->fwd_maxdiff, r->fwd_absmax);
    return 0;
}

/* ------------------------------------------------------------------ run */

int bench_run(const bench_opts *o, bench_report *r) {
    memset(r, 0, sizeof *r);
    double t_start = dt_now();
    bench_ctx x;
    memset(&x, 0, sizeof x);
    x.o = o;
    x.r = r;

    /* backend */
    x.be = dt_backend_create(o->backend, &o->be);
    if (!x.be) return -1;
    x.is_cpu = !strcmp(x.be->name, "cpu");
    snprintf(r->backend, sizeof r->backend, "%s", x.be->name);

    /* geometry and checkpoint */
    char *dir = NULL;
    int group = o->group;
    if (o->model_dir) {
        char cp[4300];
        json *cfg = bench_open_config(o->model_dir, &dir, cp, sizeof cp);
        if (!cfg) goto fail;
        const char *cls = json_get_str(cfg, "_class_name");
        if (cls && strstr(cls, "Krea2")) {
            json_free(cfg);
            dt_set_error("%s: Krea 2 checkpoints are benchmarked by bench_krea2_run (bench_krea2.h; `ditrun bench --model` "
                         "dispatches there), not bench_run", dir);
            goto fail;
        }
        int rc = flux2_config_parse(cfg, cp, &r->c);
        json_free(cfg);
        if (rc) goto fail;
        snprintf(r->source, sizeof r->source, "%s", dir);
        snprintf(r->preset, sizeof r->preset, "checkpoint");
    } else {
        if (resolve_geometry(o, &r->c)) goto fail;
        if (group <= 0) group = r->c.joint_dim % 64 || r->c.in_channels % 64 ? 32 : 64;
        dir = synth_checkpoint(o, &r->c, group, r);
        if (!dir) goto fail;
        snprintf(r->source, sizeof r->source, "synthetic (%s)", dir);
        snprintf(r->preset, sizeof r->preset, "%s", o->preset);
    }
    x.dir = dir;
    snprintf(r->precision, sizeof r->precision, "Linears %s, attention %s", o->be.precision == DT_PREC_FP8 ? "fp8" : "bf16",
             o->be.attn_precision == DT_PREC_FP8 ? "fp8" : "bf16");   /* (bm_load sets the replica's, as flux2_load) */
    const flux2_config *c = &r->c;

    /* workload: the options, else per-backend defaults (bench_workload_resolve); a real-geometry forward costs
     * ~8 GFLOP per token on a CPU doing ~15-30 GFLOPS: keep it short there */
    int is_tiny = c->hidden <= 512;
    const bench_workload_base cpu_dflt = {is_tiny ? 128 : 64, 16, is_tiny ? 5 : 2, is_tiny ? 1 : 0};
    bench_workload wl;
    if (bench_workload_resolve(o, x.is_cpu, &cpu_dflt, &wl)) goto fail;
    if (o->n_arm_tokens) {
        memcpy(x.arm_tokens, o->arm_tokens, sizeof(int) * o->n_arm_tokens);
        x.n_arm_tokens = o->n_arm_tokens;
    } else if (x.is_cpu) {
        x.arm_tokens[0] = is_tiny ? 64 : 32;
        x.n_arm_tokens = 1;
        size_t len = strlen(wl.scaled);
        snprintf(wl.scaled + len, sizeof wl.scaled - len, " --arm-tokens %d", x.arm_tokens[0]);
    } else {
        int d[4] = {256, 1024, 4096, 16384};
        memcpy(x.arm_tokens, d, sizeof d);
        x.n_arm_tokens = 4;
    }
    if (wl.scaled[0]) {
        bench_note(r, "cpu backend: workload scaled down for a small CPU (CUDA defaults are --image-size 1024 "
                      "--text-tokens 512 --reps 20 --warmup 3 --arm-tokens 256,1024,4096,16384); used:%s", wl.scaled);
        bench_progress("cpu: scaled down:%s (pass the flags to override)", wl.scaled);
    }
    const int img_size = wl.v.img_size, txt = wl.v.txt;
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
        bench_note(r, "cpu: the last-level cache reports %.0f MB; rotations target 2 x 32 MB (pass --l2-mb to change)", wl.llc_mb);
    x.rot_bytes = wl.rot_bytes;
    r->kv_heads = o->kv_heads > 0 ? o->kv_heads : (c->heads % 4 == 0 ? c->heads / 4 : c->heads % 2 == 0 ? c->heads / 2 : c->heads);
    if (c->heads % r->kv_heads) { dt_set_error("bench: --kv-heads %d does not divide %d heads", r->kv_heads, c->heads); goto fail; }
    r->peak_tflops = wl.peak;
    snprintf(r->peak_src, sizeof r->peak_src, "%s", wl.peak_src);
    bm_flops fl;
    bm_count_flops(c, x.n, x.t, &fl);
    r->gflop_gemm = fl.total_gemm;
    r->gflop_attn = fl.total_attn;
    bench_progress("%s on %s: D %d, %d heads x %d, %d double + %d single blocks, F %d; %d image + %d text tokens; "
                   "%.1f GFLOP per forward", r->preset, r->backend, c->hidden, c->heads, c->head_dim, c->num_layers,
                   c->num_single_layers, c->mlp_hidden, x.n, x.t, fl.total_gemm + fl.total_attn);

    /* inputs (random, never zeros) */
    x.img = dt_malloc(sizeof(float) * (size_t)x.n * c->in_channels);
    x.txt = dt_malloc(sizeof(float) * ((size_t)x.t * c->joint_dim + 1));
    x.img_ids = dt_malloc(sizeof(float) * (size_t)x.n * c->n_axes);
    x.txt_ids = dt_malloc(sizeof(float) * ((size_t)x.t * c->n_axes + 1));
    dt_randn(o->seed, 1, 0, x.img, (size_t)x.n * c->in_channels);
    dt_randn(o->seed, 2, 0, x.txt, (size_t)x.t * c->joint_dim);
    make_ids(c->n_axes, x.h, x.w, x.t, x.img_ids, x.txt_ids);

    if (whole_forward(&x)) goto fail;
    if ((o->sections & BENCH_LEDGER) && bench_ledger(&x)) goto fail;
    if ((o->sections & BENCH_UTIL) && bench_perf(&x)) goto fail;
    if ((o->sections & BENCH_ARMS) && bench_arms(&x)) goto fail;

    bm_free(x.bm);
    if (x.be->mem_stats) {
        size_t cur = 0, peak = 0;
        x.be->mem_stats(x.be, &cur, &peak);
        r->mem_peak_gb = peak / 1e9;
    }
    x.be->destroy(x.be);
    free(dir);
    free(x.img); free(x.txt); free(x.img_ids); free(x.txt_ids);
    r->total_s = dt_now() - t_start;
    bench_progress("done in %.1f s", r->total_s);
    return 0;
fail:
    if (x.bm) bm_free(x.bm);
    if (x.be) x.be->destroy(x.be);
    free(dir);
    free(x.img); free(x.txt); free(x.img_ids); free(x.txt_ids);
    return -1;
}
