/* bench_util.c — bench helpers: event timers that end with a device synchronization, statistics,
 * random device buffers (never zeros), notes/progress, and rotating sets of distinct Linear weights
 * so that isolated GEMM timings are not cache-hot. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_internal.h"
#include "pipeline/latents.h"

/* ------------------------------------------------------------------ timing */

void bench_die(void) {
    fprintf(stderr, "ditrun: error: bench: %s\n", dt_last_error());
    exit(1);
}

void bench_sync_or_die(dt_backend *be) {
    if (be->sync(be) != 0) bench_die();
}

void bench_timer_init(bench_timer *t, dt_backend *be) {
    memset(t, 0, sizeof *t);
    t->be = be;
    t->pf = dt_backend_profiling(be);
    if (t->pf) {
        t->e0 = t->pf->event_create(be);
        t->e1 = t->pf->event_create(be);
    }
}

void bench_timer_free(bench_timer *t) {
    if (t->pf) {
        if (t->e0) t->pf->event_destroy(t->be, t->e0);
        if (t->e1) t->pf->event_destroy(t->be, t->e1);
    }
    memset(t, 0, sizeof *t);
}

void bench_timer_start(bench_timer *t) {
    if (t->e0) t->pf->event_record(t->be, t->e0);
    else {
        bench_sync_or_die(t->be);
        t->t0 = dt_now();
    }
}

double bench_timer_stop(bench_timer *t) {
    double ms;
    if (t->e0) {
        t->pf->event_record(t->be, t->e1);
        ms = t->pf->event_elapsed_ms(t->be, t->e0, t->e1);
        bench_sync_or_die(t->be);
    } else {
        bench_sync_or_die(t->be);
        ms = (dt_now() - t->t0) * 1e3;
    }
    return ms;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *s, int n, double q) {
    if (n == 1) return s[0];
    double pos = q * (n - 1);
    int i = (int)pos;
    if (i >= n - 1) return s[n - 1];
    double f = pos - i;
    return s[i] * (1 - f) + s[i + 1] * f;
}

bench_stat bench_stats(const double *v, int n) {
    bench_stat st = {0};
    if (n <= 0) return st;
    double *s = dt_malloc(sizeof(double) * n);
    memcpy(s, v, sizeof(double) * n);
    qsort(s, n, sizeof(double), cmp_double);
    st.n = n;
    st.min = s[0];
    st.max = s[n - 1];
    st.med = quantile(s, n, 0.5);
    st.p10 = quantile(s, n, 0.1);
    st.p90 = quantile(s, n, 0.9);
    free(s);
    return st;
}

bench_stat bench_time_restored(dt_backend *be, dt_mat live, dt_mat saved, int warmup, int reps, void (*run)(void *ud),
                               void *ud) {
    bench_timer tm;
    bench_timer_init(&tm, be);
    double *t = dt_malloc(sizeof(double) * (size_t)(reps > 0 ? reps : 1));
    for (int rep = -(warmup > 0 ? warmup : 1); rep < reps; rep++) {
        be->copy(be, live, saved);
        bench_timer_start(&tm);
        run(ud);
        const double ms = bench_timer_stop(&tm);
        if (rep >= 0) t[rep] = ms;
    }
    const bench_stat st = bench_stats(t, reps);
    be->copy(be, live, saved);
    bench_sync_or_die(be);
    bench_timer_free(&tm);
    free(t);
    return st;
}

bench_stat bench_time_sustained(dt_backend *be, int is_cpu, void (*op)(void *ud, int i), void *ud, double heat_ms,
                                int reps) {
    bench_stat st = {0};
    const dt_ext_profiling *pf = dt_backend_profiling(be);
    if (is_cpu || !pf || reps < 1) return st;
    double t0 = dt_now();
    int i = 0;
    while ((dt_now() - t0) * 1e3 < heat_ms) {   /* heater: back to back, a synchronization every 8 calls */
        for (int k = 0; k < 8; k++) op(ud, i++);
        bench_sync_or_die(be);
    }
    void **ev = dt_malloc(sizeof(void *) * (size_t)(reps + 1));
    for (int k = 0; k <= reps; k++) ev[k] = pf->event_create(be);
    pf->event_record(be, ev[0]);
    for (int k = 0; k < reps; k++) {
        op(ud, i++);
        pf->event_record(be, ev[k + 1]);
    }
    double *t = dt_malloc(sizeof(double) * (size_t)reps);
    for (int k = 0; k < reps; k++) t[k] = pf->event_elapsed_ms(be, ev[k], ev[k + 1]);
    bench_sync_or_die(be);
    st = bench_stats(t, reps);
    for (int k = 0; k <= reps; k++) pf->event_destroy(be, ev[k]);
    free(ev);
    free(t);
    return st;
}

static size_t llc_bytes(void) {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l3 > 0) return (size_t)l3;
    if (l2 > 0) return (size_t)l2;
    return (size_t)32 << 20;
}

double bench_cache_mb(const bench_opts *o, int is_cpu, double *llc_mb) {
    *llc_mb = 0;
    if (o->l2_mb > 0) return o->l2_mb;
    if (!is_cpu) return 60.0;   /* H200 L2 */
    double llc = llc_bytes() / 1e6;
    if (llc <= 32) return llc;
    *llc_mb = llc;
    return 32;
}

double bench_peak_tflops(const bench_opts *o, int is_cpu, char *src, size_t n) {
    if (o->peak_tflops > 0) { snprintf(src, n, "--peak-tflops"); return o->peak_tflops; }
    if (!is_cpu) { snprintf(src, n, "table: H200 dense bf16"); return 989; }
    snprintf(src, n, "none for cpu (pass --peak-tflops)");
    return 0;
}

void bench_fill_randn(dt_backend *be, dt_mat m, uint64_t seed, float sd) {
    size_t n = (size_t)m.rows * m.cols;
    if (!n) return;
    float *h = dt_malloc(sizeof(float) * n);
    dt_randn(seed, 7, 0, h, n);
    for (size_t i = 0; i < n; i++) {
        h[i] *= sd;
        if (h[i] == 0.0f) h[i] = sd * 1e-3f;
    }
    be->upload(be, m, h);
    free(h);
}

void bench_attn_inputs(dt_backend *be, int64_t L, int hq, int hkv, int hd, uint64_t seed, dt_mat *q, dt_mat *k, dt_mat *v,
                       dt_mat *o) {
    *q = dt_alloc_or_die(be, L, (int64_t)hq * hd, be->act_dtype);
    *k = dt_alloc_or_die(be, L, (int64_t)hkv * hd, be->act_dtype);
    *v = dt_alloc_or_die(be, L, (int64_t)hkv * hd, be->act_dtype);
    *o = dt_alloc_or_die(be, L, (int64_t)hq * hd, be->act_dtype);
    bench_fill_randn(be, *q, seed, 1.0f);
    bench_fill_randn(be, *k, seed + 1, 1.0f);
    bench_fill_randn(be, *v, seed + 2, 1.0f);
}

double bench_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d != d) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

double bench_max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i]);
        if (d != d) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

void bench_note(bench_report *r, const char *fmt, ...) {
    if (r->n_notes >= BENCH_MAX_NOTES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->notes[r->n_notes++], sizeof r->notes[0], fmt, ap);
    va_end(ap);
}

void bench_progress(const char *fmt, ...) {
    if (dt_log_level < 1) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

double *bench_time_interleaved(int nv, int reps, int warmup, double (*time)(void *ctx, int v), void *ctx) {
    double *s = dt_malloc(sizeof(double) * (size_t)nv * (size_t)(reps > 0 ? reps : 1));
    for (int rep = -warmup; rep < reps; rep++)
        for (int j = 0; j < nv; j++) {
            int v = (j + rep + warmup) % nv;
            double ms = time(ctx, v);
            if (rep >= 0) s[v * reps + rep] = ms;
        }
    return s;
}

/* ------------------------------------------------------------------ rotating weight sets */

size_t bench_src_bytes(const dt_linear_src *s) {
    if (!s->bits) return (size_t)s->out * s->in * dt_dtype_size(s->dtype);
    size_t ng = (size_t)(s->in / s->group_size);
    return (size_t)s->out * s->in * s->bits / 8 + 2 * (size_t)s->out * ng * dt_dtype_size(s->sb_dtype);
}

double bench_block_weight_bytes(const dt_weights *w, const char *prefix, const char *const *names, size_t n) {
    double bb = 0;
    char nm[160];
    for (size_t i = 0; i < n; i++) {
        dt_linear_src s;
        snprintf(nm, sizeof nm, "%s.%s", prefix, names[i]);
        if (dt_weights_linear(w, nm, -1, -1, -1, &s) == 0) bb += (double)bench_src_bytes(&s);
    }
    return bb;
}

#define WSET_MAX 64

static void wset_add(bench_wset *ws, dt_linear *l) {
    ws->w = dt_realloc(ws->w, sizeof *ws->w * (ws->n + 1));
    ws->w[ws->n++] = l;
}

/* A Linear the set owns, created on be (fatal with the backend's error: the bench cannot go on without it). */
static void wset_create(bench_wset *ws, dt_backend *be, const dt_linear_src *src) {
    dt_linear *l = be->linear_create(be, src);
    if (!l) {
        fprintf(stderr, "ditrun: error: bench: %s\n", dt_last_error());
        exit(1);
    }
    wset_add(ws, l);
    ws->n_owned++;
}

static void *host_keep(bench_wset *ws, const void *src, size_t bytes) {
    void *p = dt_malloc(bytes ? bytes : 1);
    if (bytes) memcpy(p, src, bytes);
    ws->host = dt_realloc(ws->host, sizeof *ws->host * (ws->n_host + 1));
    ws->host[ws->n_host++] = p;
    return p;
}

void bench_wset_init(bench_wset *ws, dt_backend *be, dt_linear **borrow, int n, const dt_linear_src *src,
                     double target_bytes) {
    memset(ws, 0, sizeof *ws);
    ws->be = be;
    double each = (double)bench_src_bytes(src);
    for (int i = 0; i < n && i < WSET_MAX; i++) wset_add(ws, borrow[i]);
    double total = each * ws->n;
    while ((ws->n == 0 || total < target_bytes) && ws->n < WSET_MAX) {
        /* distinct host copies: the CPU backend keeps zero-copy views, CUDA uploads each one */
        dt_linear_src c = *src;
        if (src->bits) {
            size_t ng = (size_t)(src->in / src->group_size);
            c.data = host_keep(ws, src->data, (size_t)src->out * src->in * src->bits / 8);
            c.scales = host_keep(ws, src->scales, (size_t)src->out * ng * dt_dtype_size(src->sb_dtype));
            c.biases = host_keep(ws, src->biases, (size_t)src->out * ng * dt_dtype_size(src->sb_dtype));
        } else {
            c.data = host_keep(ws, src->data, (size_t)src->out * src->in * dt_dtype_size(src->dtype));
        }
        if (src->bias) c.bias = host_keep(ws, src->bias, (size_t)src->out * dt_dtype_size(src->bias_dtype));
        wset_create(ws, be, &c);
        total += each;
    }
    ws->mb = total / 1e6;
}

void bench_wset_dense(bench_wset *ws, dt_backend *be, int64_t N, int64_t K, double target_bytes, uint64_t seed,
                      dt_precision prec) {
    memset(ws, 0, sizeof *ws);
    ws->be = be;
    size_t ne = (size_t)N * K;
    double each = 2.0 * ne, total = 0;
    float amp = sqrtf(3.0f / (float)K);
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 17;
    while ((ws->n == 0 || total < target_bytes) && ws->n < WSET_MAX) {
        uint16_t *w = dt_malloc(sizeof(uint16_t) * ne);
        for (size_t i = 0; i < ne; i++) {   /* xorshift: cheap distinct random contents per copy */
            s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
            uint64_t x = s * 0x2545F4914F6CDD1DULL;
            float u = (float)((x >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
            w[i] = dt_f32_to_bf16(amp * (u == 0.0f ? 0.5f : u));
        }
        ws->host = dt_realloc(ws->host, sizeof *ws->host * (ws->n_host + 1));
        ws->host[ws->n_host++] = w;
        dt_linear_src src = {0};
        src.name = "bench.dense";
        src.out = N;
        src.in = K;
        src.dtype = DT_BF16;
        src.data = w;
        src.precision = prec;
        wset_create(ws, be, &src);
        total += each;
    }
    ws->mb = total / 1e6;
}

void bench_wset_free(bench_wset *ws) {
    if (!ws->be) return;
    bench_sync_or_die(ws->be);
    for (int i = ws->n - ws->n_owned; i < ws->n; i++) ws->be->linear_destroy(ws->be, ws->w[i]);
    for (int i = 0; i < ws->n_host; i++) free(ws->host[i]);
    free(ws->w);
    free(ws->host);
    memset(ws, 0, sizeof *ws);
}

double bench_wset_time(bench_wset *ws, bench_timer *tm, dt_mat y, dt_mat x) {
    bench_timer_start(tm);
    for (int i = 0; i < ws->n; i++) ws->be->linear(ws->be, y, x, ws->w[i]);
    return bench_timer_stop(tm) / ws->n;
}

typedef struct { dt_backend *be; bench_wset *ws; dt_mat x, y; } wset_op_ctx;
static void wset_op(void *ud, int i) {
    wset_op_ctx *g = ud;
    g->be->linear(g->be, g->y, g->x, g->ws->w[i % g->ws->n]);
}

bench_stat bench_wset_time_sustained(bench_wset *ws, dt_mat y, dt_mat x, int reps, int is_cpu) {
    bench_stat none = {0};
    if (ws->n < 1) return none;
    wset_op_ctx c = {ws->be, ws, x, y};
    return bench_time_sustained(ws->be, is_cpu, wset_op, &c, BENCH_HEAT_MS, 2 * reps);
}

/* ---- JSON-lines writers shared by the reports ---- */

void bench_jstr(FILE *f, const char *key, const char *v) {
    fprintf(f, "\"%s\":\"", key);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

void bench_jnum(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

void bench_jstat(FILE *f, const char *p, bench_stat s) {
    char k[64];
    snprintf(k, sizeof k, "%s_median_ms", p); bench_jnum(f, k, s.med);
    snprintf(k, sizeof k, "%s_p10_ms", p); bench_jnum(f, k, s.p10);
    snprintf(k, sizeof k, "%s_p90_ms", p); bench_jnum(f, k, s.p90);
    snprintf(k, sizeof k, "%s_min_ms", p); bench_jnum(f, k, s.min);
    snprintf(k, sizeof k, "%s_max_ms", p); bench_jnum(f, k, s.max);
    snprintf(k, sizeof k, "%s_n", p); bench_jnum(f, k, s.n);
}


void bench_copy_bandwidth(dt_backend *be, double rot_bytes, int is_cpu, int warmup, int reps, bench_stat *copy,
                          double *bytes, double *gbs) {
    double target = 4.0 * rot_bytes;          /* 8 x the cache per buffer */
    double cap = is_cpu ? 256e6 : 1e9;
    if (target < 64e6) target = 64e6;
    if (target > cap) target = cap;
    int64_t cols = 4096, es = (int64_t)dt_dtype_size(be->act_dtype);
    int64_t rows = (int64_t)(target / (cols * es));
    bench_progress("utilization: device copy bandwidth (%.0f MB) ...", rows * cols * es / 1e6);
    dt_mat a = dt_alloc_or_die(be, rows, cols, be->act_dtype), b = dt_alloc_or_die(be, rows, cols, be->act_dtype);
    bench_fill_randn(be, a, 301, 1.0f);
    bench_timer tm;
    bench_timer_init(&tm, be);
    double *s = dt_malloc(sizeof(double) * reps);
    for (int rep = -warmup; rep < reps; rep++) {
        bench_timer_start(&tm);
        be->copy(be, b, a);
        double ms = bench_timer_stop(&tm);
        if (rep >= 0) s[rep] = ms;
    }
    *copy = bench_stats(s, reps);
    *bytes = 2.0 * rows * cols * es;
    *gbs = copy->med > 0 ? *bytes / (copy->med * 1e-3) / 1e9 : 0;
    free(s);
    bench_sync_or_die(be);
    bench_timer_free(&tm);
    be->free(be, &a);
    be->free(be, &b);
}

bench_arm *bench_arm_row(bench_arm *row, const char *arm, const char *what, const char *a, const char *b, const char *note) {
    memset(row, 0, sizeof *row);
    snprintf(row->arm, sizeof row->arm, "%s", arm);
    snprintf(row->what, sizeof row->what, "%s", what);
    snprintf(row->a, sizeof row->a, "%s", a);
    snprintf(row->b, sizeof row->b, "%s", b);
    snprintf(row->note, sizeof row->note, "%s", note);
    return row;
}

json *bench_open_config(const char *model_dir, char **dir, char *cfg_path, size_t n) {
    *dir = dt_weights_component_dir(model_dir, "transformer");
    if (!*dir) return NULL;
    snprintf(cfg_path, n, "%s/config.json", *dir);
    return json_parse_file(cfg_path);
}
