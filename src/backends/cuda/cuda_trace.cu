/* cuda_trace.cu — the per-op trace of the CUDA backend (option trace, DITRUN_CUDA_TRACE): a decorator that wraps
 * the vtable's ops with host timers (levels 1-2) or CUDA events in the running queue (level 3), printed per op at
 * destroy. Installed only when tracing is on; the ops themselves know nothing of it. */
#include <stdarg.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda_common.cuh"

/* ------------------------------------------------------------------ tracing (o.trace) */
/* o.trace = 1: each op's host time (launch work: lazy kernel loading, cuBLASLt heuristics, cudaMalloc,
 * ...); = 2: each op followed by a stream synchronize, so the time is host + device. Ops over o.trace_ms are
 * printed as they happen; a per-op summary is printed at destroy.
 * = 3: device time of each op in the running queue (CUDA events before and after it, no synchronization, so
 * caches and overlap are as in a real run; not while a graph is captured), summed per op and shape and
 * printed at destroy, largest total first.
 * The real ops sit behind the vtable; this only wraps them when tracing is on. */
struct trace_stat {
    int n = 0;
    double total = 0, maxv = 0;
};
struct trace_ev {
    std::string key;
    cudaEvent_t a, b;
};
static struct {
    int level;
    double thr_ms;
    std::map<std::string, trace_stat> *stats;
    dt_backend real;
    dtc_state *st;                       /* level 3: the traced backend */
    cudaEvent_t cur;                     /* level 3: start event of the op in progress (or NULL) */
    std::vector<trace_ev> *pending;      /* level 3: recorded, not yet resolved */
    std::vector<cudaEvent_t> *spare;
    std::map<std::string, trace_stat> *dev;
} g_tr;

static cudaEvent_t tr_event() {
    cudaEvent_t e;
    if (!g_tr.spare->empty()) {
        e = g_tr.spare->back();
        g_tr.spare->pop_back();
    } else {
        CK(cudaEventCreate(&e));
    }
    return e;
}
/* level 3: turn recorded event pairs into per-op device times (waits for them) */
static void tr_resolve() {
    if (!g_tr.pending) return;
    for (auto &p : *g_tr.pending) {
        float ms = 0.f;
        CK(cudaEventSynchronize(p.b));
        CK(cudaEventElapsedTime(&ms, p.a, p.b));
        trace_stat &t = (*g_tr.dev)[p.key];
        t.n++;
        t.total += ms;
        if (ms > t.maxv) t.maxv = ms;
        g_tr.spare->push_back(p.a);
        g_tr.spare->push_back(p.b);
    }
    g_tr.pending->clear();
}
static double tr_begin() {
    if (g_tr.level == 3 && !g_tr.st->capturing) {
        g_tr.cur = tr_event();
        CK(cudaEventRecord(g_tr.cur, g_tr.st->q.stream));
    }
    return dt_now();
}
static void tr_end(dt_backend *be, const char *op, double t0, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void tr_end(dt_backend *be, const char *op, double t0, const char *fmt, ...) {
    if (g_tr.level == 3) {
        if (!g_tr.cur) return;
        trace_ev e;
        char buf[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        e.key = std::string(op) + " " + buf;
        e.a = g_tr.cur;
        e.b = tr_event();
        g_tr.cur = nullptr;
        CK(cudaEventRecord(e.b, dtc(be)->q.stream));
        g_tr.pending->push_back(e);
        if (g_tr.pending->size() > 4096) tr_resolve();
        return;
    }
    if (g_tr.level >= 2) cudaStreamSynchronize(dtc(be)->q.stream);
    double ms = (dt_now() - t0) * 1e3;
    trace_stat &t = (*g_tr.stats)[op];
    t.n++;
    t.total += ms;
    if (ms > t.maxv) t.maxv = ms;
    if (ms >= g_tr.thr_ms) {
        char buf[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        fprintf(stderr, "ditrun: cuda trace: %-14s %9.3f ms  %s (call %d)\n", op, ms, buf, t.n);
    }
}
static void tr_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w) {
    double t0 = tr_begin();
    g_tr.real.linear(be, y, x, w);
    tr_end(be, "linear", t0, "M=%lld K=%lld N=%lld", (long long)x.rows, (long long)x.cols, (long long)y.cols);
}
static void tr_attention(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd, float scale,
                         dt_mat kb, int causal) {
    double t0 = tr_begin();
    g_tr.real.attention(be, o, q, k, v, hq, hkv, hd, scale, kb, causal);
    tr_end(be, "attention", t0, "Lq=%lld Lk=%lld %d/%d heads x %d%s%s", (long long)q.rows, (long long)k.rows, hq, hkv, hd,
           kb.data ? " bias" : "", causal ? " causal" : "");
}
static void tr_conv2d(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w) {
    double t0 = tr_begin();
    g_tr.real.conv2d(be, y, x, c, h, w);
    tr_end(be, "conv2d", t0, "%lld->%lld %dx%d", (long long)x.rows, (long long)y.rows, h, w);
}
static void tr_conv2d_strided(dt_backend *be, dt_mat y, dt_mat x, const dt_conv *c, int h, int w, int s, int pt, int pl,
                              int pb, int pr) {
    double t0 = tr_begin();
    g_tr.real.conv2d_strided(be, y, x, c, h, w, s, pt, pl, pb, pr);
    tr_end(be, "conv2d_strided", t0, "%lld->%lld %dx%d /%d", (long long)x.rows, (long long)y.rows, h, w, s);
}
static void tr_group_norm(dt_backend *be, dt_mat y, dt_mat x, int groups, dt_mat g, dt_mat b, float eps, int silu) {
    double t0 = tr_begin();
    g_tr.real.group_norm(be, y, x, groups, g, b, eps, silu);
    tr_end(be, "group_norm", t0, "[%lld,%lld]", (long long)x.rows, (long long)x.cols);
}
static void tr_upsample2x(dt_backend *be, dt_mat y, dt_mat x, int h, int w) {
    double t0 = tr_begin();
    g_tr.real.upsample2x(be, y, x, h, w);
    tr_end(be, "upsample2x", t0, "C=%lld %dx%d", (long long)x.rows, h, w);
}
static void tr_channel_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat g, int silu) {
    double t0 = tr_begin();
    g_tr.real.channel_rmsnorm(be, y, x, g, silu);
    tr_end(be, "channel_rmsnorm", t0, "[%lld,%lld]", (long long)x.rows, (long long)x.cols);
}
static void tr_copy(dt_backend *be, dt_mat d, dt_mat s) {
    double t0 = tr_begin();
    g_tr.real.copy(be, d, s);
    tr_end(be, "copy", t0, "[%lld,%lld]", (long long)d.rows, (long long)d.cols);
}
static void tr_upload(dt_backend *be, dt_mat m, const float *src) {
    double t0 = tr_begin();
    g_tr.real.upload(be, m, src);
    tr_end(be, "upload", t0, "[%lld,%lld]", (long long)m.rows, (long long)m.cols);
}
static void tr_download(dt_backend *be, float *dst, dt_mat m) {
    double t0 = tr_begin();
    g_tr.real.download(be, dst, m);
    tr_end(be, "download", t0, "[%lld,%lld] (waits for the queue)", (long long)m.rows, (long long)m.cols);
}
static void tr_image_rgb8(dt_backend *be, uint8_t *dst, dt_mat x) {
    double t0 = tr_begin();
    g_tr.real.image_rgb8(be, dst, x);
    tr_end(be, "image_rgb8", t0, "[%lld,%lld] (waits for the queue)", (long long)x.rows, (long long)x.cols);
}
static void tr_layernorm_mod(dt_backend *be, dt_mat y, dt_mat x, dt_mat sh, dt_mat sc, float eps) {
    double t0 = tr_begin();
    g_tr.real.layernorm_mod(be, y, x, sh, sc, eps);
    tr_end(be, "layernorm_mod", t0, "[%lld,%lld]", (long long)x.rows, (long long)x.cols);
}
static void tr_rmsnorm(dt_backend *be, dt_mat y, dt_mat x, dt_mat w, float wo, float eps) {
    double t0 = tr_begin();
    g_tr.real.rmsnorm(be, y, x, w, wo, eps);
    tr_end(be, "rmsnorm", t0, "[%lld,%lld]", (long long)x.rows, (long long)x.cols);
}
static void tr_head_norm_rope(dt_backend *be, dt_mat x, int heads, int hd, dt_mat w, float eps, dt_mat c, dt_mat s,
                              dt_rope_mode mode) {
    double t0 = tr_begin();
    g_tr.real.head_norm_rope(be, x, heads, hd, w, eps, c, s, mode);
    tr_end(be, "head_norm_rope", t0, "[%lld] %dx%d", (long long)x.rows, heads, hd);
}
static void tr_act_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b, dt_act act) {
    double t0 = tr_begin();
    g_tr.real.act_mul(be, y, a, b, act);
    tr_end(be, "act_mul", t0, "[%lld,%lld]", (long long)y.rows, (long long)y.cols);
}
static void tr_linear_gated_add(dt_backend *be, dt_mat x, dt_mat a, const dt_linear *w, dt_mat g) {
    double t0 = tr_begin();
    g_tr.real.linear_gated_add(be, x, a, w, g);
    tr_end(be, "linear_gated_add", t0, "M=%lld K=%lld N=%lld", (long long)a.rows, (long long)a.cols, (long long)x.cols);
}
static void tr_norm_linear(dt_backend *be, dt_mat y, dt_mat x, dt_mat sh, dt_mat sc, float eps, const dt_linear *w,
                           dt_mat a) {
    double t0 = tr_begin();
    g_tr.real.norm_linear(be, y, x, sh, sc, eps, w, a);
    tr_end(be, "norm_linear", t0, "M=%lld K=%lld N=%lld", (long long)x.rows, (long long)x.cols, (long long)y.cols);
}
static void tr_act_linear_gated(dt_backend *be, dt_mat x, dt_mat c, int64_t lead, dt_mat a, dt_mat b, dt_act act,
                                const dt_linear *w, dt_mat g, dt_mat y) {
    double t0 = tr_begin();
    g_tr.real.act_linear_gated(be, x, c, lead, a, b, act, w, g, y);
    tr_end(be, "act_linear_gated", t0, "M=%lld K=%lld N=%lld", (long long)c.rows, (long long)c.cols, (long long)x.cols);
}
static void tr_gated_add(dt_backend *be, dt_mat x, dt_mat g, dt_mat y) {
    double t0 = tr_begin();
    g_tr.real.gated_add(be, x, g, y);
    tr_end(be, "gated_add", t0, "[%lld,%lld]", (long long)x.rows, (long long)x.cols);
}
static void tr_mul(dt_backend *be, dt_mat y, dt_mat a, dt_mat b) {
    double t0 = tr_begin();
    g_tr.real.mul(be, y, a, b);
    tr_end(be, "mul", t0, "[%lld,%lld]", (long long)y.rows, (long long)y.cols);
}
static void tr_axpby(dt_backend *be, dt_mat y, float alpha, dt_mat a, float beta, dt_mat b) {
    double t0 = tr_begin();
    g_tr.real.axpby(be, y, alpha, a, beta, b);
    tr_end(be, "axpby", t0, "[%lld,%lld]%s", (long long)y.rows, (long long)y.cols, b.data ? "" : " (no b)");
}
static void tr_flow_step(dt_backend *be, dt_mat x, dt_mat v, dt_mat u, float guidance, int from_cond, float dt) {
    double t0 = tr_begin();
    g_tr.real.flow_step(be, x, v, u, guidance, from_cond, dt);
    tr_end(be, "flow_step", t0, "[%lld,%lld]%s", (long long)x.rows, (long long)x.cols, u.data ? " guided" : "");
}
static void tr_transpose(dt_backend *be, dt_mat y, dt_mat x) {
    double t0 = tr_begin();
    g_tr.real.transpose(be, y, x);
    tr_end(be, "transpose", t0, "[%lld,%lld]", (long long)x.rows, (long long)x.cols);
}
static void tr_attention_fp8(dt_backend *be, dt_mat o, dt_mat q, dt_mat k, dt_mat v, int hq, int hkv, int hd,
                             float scale) {
    double t0 = tr_begin();
    g_tr.real.attention_fp8(be, o, q, k, v, hq, hkv, hd, scale);
    tr_end(be, "attention_fp8", t0, "Lq=%lld Lk=%lld %d/%d heads x %d", (long long)q.rows, (long long)k.rows, hq, hkv,
           hd);
}
static void tr_linear_prefetch(dt_backend *be, const dt_linear *w, dt_mat gate, int64_t rows) {
    double t0 = tr_begin();
    g_tr.real.linear_prefetch(be, w, gate, rows);
    tr_end(be, "linear_prefetch", t0, "rows=%lld%s", (long long)rows, gate.data ? " gated" : "");
}
static void tr_fp8_quant(dt_backend *be, dt_mat x) {
    double t0 = tr_begin();
    g_tr.real.fp8_quant(be, x);
    tr_end(be, "fp8_quant", t0, "[%lld,%lld]", (long long)x.rows, (long long)x.cols);
}
static dt_linear *tr_linear_create(dt_backend *be, const dt_linear_src *src) {
    double t0 = tr_begin();
    dt_linear *r = g_tr.real.linear_create(be, src);
    tr_end(be, "linear_create", t0, "%s [%lld,%lld] bits %d", src->name ? src->name : "?", (long long)src->out,
           (long long)src->in, src->bits);
    return r;
}
static int tr_sync(dt_backend *be) {
    double t0 = tr_begin();
    int r = g_tr.real.sync(be);
    if (g_tr.level == 3) tr_resolve();
    tr_end(be, "sync", t0, "(waits for the queue)");
    return r;
}

void dtc_trace_install(dt_backend *be) {
    const dtc_state *st = dtc(be);
    if (st->o.trace <= 0) return;
    if (!g_tr.stats) {
        g_tr.level = st->o.trace >= 3 ? 3 : st->o.trace;
        g_tr.pending = new std::vector<trace_ev>();
        g_tr.spare = new std::vector<cudaEvent_t>();
        g_tr.dev = new std::map<std::string, trace_stat>();
        g_tr.thr_ms = st->o.trace_ms;
        g_tr.stats = new std::map<std::string, trace_stat>();
    }
    g_tr.real = *be;
    g_tr.st = dtc(be);
    dtc(be)->trace_malloc_ms = g_tr.thr_ms > 0 ? g_tr.thr_ms : 1e-9;
    be->linear = tr_linear;
    be->attention = tr_attention;
    be->conv2d = tr_conv2d;
    be->conv2d_strided = tr_conv2d_strided;
    be->group_norm = tr_group_norm;
    be->upsample2x = tr_upsample2x;
    be->channel_rmsnorm = tr_channel_rmsnorm;
    be->copy = tr_copy;
    be->upload = tr_upload;
    be->download = tr_download;
    if (be->image_rgb8) be->image_rgb8 = tr_image_rgb8;
    be->layernorm_mod = tr_layernorm_mod;
    be->rmsnorm = tr_rmsnorm;
    be->head_norm_rope = tr_head_norm_rope;
    be->act_mul = tr_act_mul;
    be->gated_add = tr_gated_add;
    be->linear_gated_add = tr_linear_gated_add;
    be->norm_linear = tr_norm_linear;
    be->act_linear_gated = tr_act_linear_gated;
    be->linear_create = tr_linear_create;
    be->sync = tr_sync;
    be->mul = tr_mul;
    be->axpby = tr_axpby;
    if (be->flow_step) be->flow_step = tr_flow_step;
    be->transpose = tr_transpose;
    if (be->attention_fp8) be->attention_fp8 = tr_attention_fp8;
    if (be->linear_prefetch) be->linear_prefetch = tr_linear_prefetch;
    if (be->fp8_quant) be->fp8_quant = tr_fp8_quant;
    /* untraced (tests/test_backend_slots.c checks that every slot of dt_backend is traced above or named here):
     * destroy (prints this report), alloc free mem_stats (cudaMalloc is traced by the pool: trace_malloc_ms),
     * linear_destroy linear_path conv_create conv_destroy (set-up, no queued work), capture_begin capture_end
     * graph_launch graph_destroy (a graph replays ops traced while it was captured eagerly), stream_switch (queue
     * selection), event_create event_record event_elapsed_ms event_destroy power_sample fp8_scale_mode (the
     * profiling slots themselves). */
}

void dtc_trace_report(dtc_state *st) {
    if (g_tr.level == 3 && g_tr.st == st) {
        tr_resolve();
        std::vector<std::pair<double, std::string>> v;
        double all = 0;
        for (auto &kv : *g_tr.dev) {
            v.push_back({kv.second.total, kv.first});
            all += kv.second.total;
        }
        std::sort(v.rbegin(), v.rend());
        fprintf(stderr, "ditrun: cuda trace (device ms per op and shape, events in the running queue): %.2f ms in all\n", all);
        for (auto &p : v) {
            const trace_stat &t = (*g_tr.dev)[p.second];
            fprintf(stderr, "ditrun: cuda trace   %9.3f ms %5.1f%%  n=%-5d mean %8.4f  %s\n", t.total,
                    all > 0 ? 100.0 * t.total / all : 0.0, t.n, t.total / t.n, p.second.c_str());
        }
        g_tr.dev->clear();
    }
    if (!g_tr.stats || g_tr.stats->empty()) return;
    fprintf(stderr, "ditrun: cuda trace summary (%s ms per op; level %d):\n", g_tr.level >= 2 ? "host+device" : "host",
            g_tr.level);
    for (auto &kv : *g_tr.stats)
        fprintf(stderr, "ditrun: cuda trace   %-14s n=%-6d total %9.2f ms  max %8.3f ms\n", kv.first.c_str(),
                kv.second.n, kv.second.total, kv.second.maxv);
    int n_malloc = 0;
    double t_malloc = 0;
    if (dtc_pool_malloc_stats(st, &n_malloc, &t_malloc))
        fprintf(stderr, "ditrun: cuda trace   cudaMalloc: %d calls, %.2f ms\n", n_malloc, t_malloc * 1e3);
    g_tr.stats->clear();
}
