/* cuda_backend.cu — the CUDA backend's C edge: dt_backend_cuda_available / dt_backend_cuda_create, the
 * vtable, the caching device-memory pool (plain cudaMalloc, keyed by rounded size, current/peak stats),
 * grow-only scratch buffers, upload/download, sync, timing events and CUDA-graph capture. Ops are queued on the
 * current queue's stream (st->q: the main queue, or the side queue after stream_switch); the transient prefetch
 * (cuda_linear.cu) runs on a third, low-priority stream joined back before syncs, downloads and capture ends. */
#include <stdarg.h>

#include <algorithm>
#include <utility>
#include <map>
#include <string>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_common.cuh"

/* ------------------------------------------------------------------ errors */
void dtc_fatal(const char *call, const char *file, int line, const char *msg) {
    fprintf(stderr, "ditrun: cuda: %s failed at %s:%d: %s\n", call, file, line, msg ? msg : "unknown error");
    fflush(stderr);
    exit(1);
}

/* ------------------------------------------------------------------ pool */
struct dtc_pool {
    std::mutex mu;
    std::unordered_map<void *, size_t> live;  /* pointer -> block size */
    std::multimap<size_t, void *> freeb;      /* cached free blocks by size */
    size_t current = 0, cached = 0;
    size_t peak = 0;                          /* most bytes held at once: live blocks + cached free ones */
    int n_malloc = 0;                         /* cudaMalloc calls and their host time */
    double t_malloc = 0;
};

static size_t pool_round(size_t b) {
    if (b == 0) b = 1;
    if (b <= ((size_t)1 << 20)) return (b + 511) & ~(size_t)511;          /* small: 512-byte steps */
    if (b <= ((size_t)64 << 20)) return (b + ((1 << 20) - 1)) & ~(size_t)((1 << 20) - 1);  /* 1 MiB steps */
    return (b + ((size_t)(8 << 20) - 1)) & ~(size_t)((8 << 20) - 1);      /* 8 MiB steps */
}

static void pool_release_cached(dtc_pool *p) {
    for (auto &kv : p->freeb) cudaFree(kv.second);
    p->freeb.clear();
    p->cached = 0;
}

void *dtc_pool_alloc(dtc_state *st, size_t bytes) {
    dtc_pool *p = st->pool;
    size_t rb = pool_round(bytes);
    std::lock_guard<std::mutex> lk(p->mu);
    void *ptr = nullptr;
    /* best fit among the cached blocks, up to 25% larger than asked (phases of a pipeline ask for slightly
     * different sizes; a fresh cudaMalloc costs far more than the slack) */
    auto it = p->freeb.lower_bound(rb);
    if (it != p->freeb.end() && it->first <= rb + rb / 4) {
        ptr = it->second;
        rb = it->first;
        p->freeb.erase(it);
        p->cached -= rb;
    } else {
        double t0 = dt_now();
        cudaError_t e = cudaMalloc(&ptr, rb);
        double dt = dt_now() - t0;
        p->n_malloc++;
        p->t_malloc += dt;
        if (st->trace_malloc_ms > 0 && dt * 1e3 >= st->trace_malloc_ms)
            fprintf(stderr, "ditrun: cuda trace: cudaMalloc     %9.3f ms  %.1f MB\n", dt * 1e3, rb / 1048576.0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            pool_release_cached(p);  /* give cached blocks back and retry once */
            e = cudaMalloc(&ptr, rb);
            if (e != cudaSuccess) {
                cudaGetLastError();
                size_t fr = 0, tot = 0;
                cudaMemGetInfo(&fr, &tot);
                dt_set_error("cuda: out of device memory allocating %zu bytes (in use %zu, free %zu of %zu): %s", bytes,
                             p->current, fr, tot, cudaGetErrorString(e));
                return nullptr;
            }
        }
    }
    p->live[ptr] = rb;
    p->current += rb;
    if (p->current + p->cached > p->peak) p->peak = p->current + p->cached;
    return ptr;
}

void dtc_pool_free(dtc_state *st, void *ptr) {
    if (!ptr) return;
    dtc_pool *p = st->pool;
    std::lock_guard<std::mutex> lk(p->mu);
    auto it = p->live.find(ptr);
    if (it == p->live.end()) {
        fprintf(stderr, "ditrun: cuda: free of a pointer not allocated by this backend (%p)\n", ptr);
        exit(1);
    }
    size_t rb = it->second;
    p->live.erase(it);
    p->current -= rb;
    /* Stream-ordered reuse: blocks are freed (and re-allocated) from the main queue's order only; the side queue
     * and the prefetch stream use grow-only scratch, and scratch_grow synchronizes before it frees. */
    p->freeb.emplace(rb, ptr);
    p->cached += rb;
}

static void scratch_grow(dtc_state *st, dtc_scratch *s, size_t want) {
    if (s->ptr && !st->graphs_made && !st->capturing) {
        /* no graph can hold the old buffer: free it (after the queues are done with it) before allocating, so
         * growth while a model loads (each Linear a bit larger) does not leave a trail of dead buffers */
        CK(cudaStreamSynchronize(st->q.stream));
        if (st->alt.stream) CK(cudaStreamSynchronize(st->alt.stream));
        if (st->pf_stream) CK(cudaStreamSynchronize(st->pf_stream));
        dtc_pool_free(st, s->ptr);
        {
            std::lock_guard<std::mutex> lk(st->pool->mu);
            pool_release_cached(st->pool);   /* give it back to the device, not to the pool's cache */
        }
        s->ptr = nullptr;
        s->size = 0;
    }
    void *np = dtc_pool_alloc(st, want);
    if (!np) {
        fprintf(stderr, "ditrun: cuda: %s\n", dt_last_error());
        exit(1);
    }
    if (s->ptr) {  /* keep the old one alive: a captured graph may still use it */
        s->retired = (void **)realloc(s->retired, sizeof(void *) * (size_t)(s->nretired + 1));
        if (!s->retired) { fprintf(stderr, "ditrun: error: out of host memory\n"); exit(1); }
        s->retired[s->nretired++] = s->ptr;
    }
    s->ptr = np;
    s->size = want;
}

void *dtc_scratch_get(dtc_state *st, dtc_scratch *s, size_t bytes) {
    if (bytes <= s->size && s->ptr) return s->ptr;
    scratch_grow(st, s, bytes + bytes / 8);
    return s->ptr;
}

void dtc_scratch_reserve(dtc_state *st, dtc_scratch *s, size_t bytes) {
    if (bytes > s->size || !s->ptr) scratch_grow(st, s, bytes);
}

static void scratch_release(dtc_state *st, dtc_scratch *s) {
    for (int i = 0; i < s->nretired; i++) dtc_pool_free(st, s->retired[i]);
    free(s->retired);
    if (s->ptr) dtc_pool_free(st, s->ptr);
    memset(s, 0, sizeof *s);
}

/* A queue's scratch buffers and workspace (its stream is destroyed last, after the pool). */
static void queue_release(dtc_state *st, dtc_queue *q) {
    dtc_scratch *all[] = {&q->s_qdeq, &q->s_split, &q->s_cast, &q->s_gate, &q->s_lga, &q->s_fp8, &q->s_fp8g};
    for (dtc_scratch *s : all) scratch_release(st, s);
    if (q->lt_ws) cudaFree(q->lt_ws);
    q->lt_ws = nullptr;
}

/* ------------------------------------------------------------------ vtable: memory */
static int be_alloc(dt_backend *be, dt_mat *m, int64_t rows, int64_t cols, dt_dtype dtype) {
    if (dtype != DT_BF16 && dtype != DT_F32) {
        dt_set_error("cuda: alloc: unsupported dtype %s (BF16 or F32)", dt_dtype_name(dtype));
        return -1;
    }
    if (rows < 0 || cols < 0) {
        dt_set_error("cuda: alloc: bad shape [%lld, %lld]", (long long)rows, (long long)cols);
        return -1;
    }
    size_t bytes = (size_t)rows * (size_t)cols * dt_dtype_size(dtype);
    void *p = dtc_pool_alloc(dtc(be), bytes);
    if (!p) return -1;
    m->data = p;
    m->rows = rows;
    m->cols = cols;
    m->ld = cols;
    m->dtype = dtype;
    return 0;
}

static void be_free(dt_backend *be, dt_mat *m) {
    if (!m || !m->data) return;
    dtc_pool_free(dtc(be), m->data);
    m->data = nullptr;
}

/* Pinned host staging for transfers of up to PINNED_MAX bytes: a copy from pageable memory runs at ~6 GB/s
 * (the driver stages it itself), from page-locked memory at the link's speed. One buffer per direction, grown
 * on demand; before the upload buffer is refilled, the transfer that last read it must have finished. */
#define PINNED_MAX ((size_t)64 << 20)
static void *pinned_get(dtc_pinned *b, size_t bytes) {
    if (b->pending) {
        CK(cudaEventSynchronize(b->ev));
        b->pending = 0;
    }
    if (bytes > b->size) {
        if (b->p) CK(cudaFreeHost(b->p));
        b->p = nullptr;
        b->size = 0;
        if (cudaHostAlloc(&b->p, bytes, cudaHostAllocDefault) != cudaSuccess) {   /* no pinned memory: pageable */
            cudaGetLastError();
            b->p = nullptr;
            return nullptr;
        }
        b->size = bytes;
    }
    if (!b->ev) CK(cudaEventCreateWithFlags(&b->ev, cudaEventDisableTiming));
    return b->p;
}
static void pinned_release(dtc_pinned *b) {
    if (b->pending) cudaEventSynchronize(b->ev);
    if (b->p) cudaFreeHost(b->p);
    if (b->ev) cudaEventDestroy(b->ev);
    memset(b, 0, sizeof *b);
}

/* host src -> device dst (bytes), through the pinned buffer when it fits */
static void h2d(dtc_state *st, void *dst, const void *src, size_t bytes) {
    void *p = (!st->capturing && bytes <= PINNED_MAX) ? pinned_get(&st->pin_up, bytes) : nullptr;
    if (!p) {
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->q.stream));
        return;
    }
    memcpy(p, src, bytes);
    CK(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, st->q.stream));
    CK(cudaEventRecord(st->pin_up.ev, st->q.stream));
    st->pin_up.pending = 1;
}
/* device src -> host dst (bytes), synchronizing the stream */
static void d2h_sync(dtc_state *st, void *dst, const void *src, size_t bytes) {
    dtc_prefetch_join(st);
    void *p = bytes <= PINNED_MAX ? pinned_get(&st->pin_down, bytes) : nullptr;
    CK(cudaMemcpyAsync(p ? p : dst, src, bytes, cudaMemcpyDeviceToHost, st->q.stream));
    CK(cudaStreamSynchronize(st->q.stream));
    if (p) memcpy(dst, p, bytes);
}

static void be_upload(dt_backend *be, dt_mat m, const float *src) {
    dtc_state *st = dtc(be);
    if (m.rows <= 0 || m.cols <= 0) return;
    size_t n = (size_t)m.rows * (size_t)m.cols;
    if (m.dtype == DT_F32 && m.ld == m.cols) {
        h2d(st, m.data, src, n * 4);
        return;
    }
    float *tmp = (float *)dtc_pool_alloc(st, n * 4);
    if (!tmp) { fprintf(stderr, "ditrun: cuda: %s\n", dt_last_error()); exit(1); }
    h2d(st, tmp, src, n * 4);
    dt_mat s = {tmp, m.rows, m.cols, m.cols, DT_F32};
    dtc_copy(be, m, s);
    dtc_pool_free(st, tmp);
}

static void be_download(dt_backend *be, float *dst, dt_mat m) {
    dtc_state *st = dtc(be);
    if (m.rows <= 0 || m.cols <= 0) return;
    size_t n = (size_t)m.rows * (size_t)m.cols;
    if (m.dtype == DT_F32 && m.ld == m.cols) {
        d2h_sync(st, dst, m.data, n * 4);
        return;
    }
    float *tmp = (float *)dtc_pool_alloc(st, n * 4);
    if (!tmp) { fprintf(stderr, "ditrun: cuda: %s\n", dt_last_error()); exit(1); }
    dt_mat d = {tmp, m.rows, m.cols, m.cols, DT_F32};
    dtc_copy(be, d, m);
    d2h_sync(st, dst, tmp, n * 4);
    dtc_pool_free(st, tmp);
}

static int be_sync(dt_backend *be) {
    dtc_prefetch_join(dtc(be));
    cudaError_t e = cudaStreamSynchronize(dtc(be)->q.stream);
    if (e != cudaSuccess) {
        dt_set_error("cuda: stream synchronize failed: %s", cudaGetErrorString(e));
        return -1;
    }
    e = cudaGetLastError();
    if (e != cudaSuccess) {
        dt_set_error("cuda: device error: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

static void be_mem_stats(dt_backend *be, size_t *current, size_t *peak) {
    dtc_pool *p = dtc(be)->pool;
    std::lock_guard<std::mutex> lk(p->mu);
    if (current) *current = p->current;
    if (peak) *peak = p->peak;
}

/* ------------------------------------------------------------------ vtable: events, graphs */
static void *be_event_create(dt_backend *be) {
    (void)be;
    cudaEvent_t e;
    CK(cudaEventCreate(&e));
    return (void *)e;
}
static void be_event_record(dt_backend *be, void *ev) {
    dtc_prefetch_join(dtc(be));   /* a timed region includes the prefetches issued in it */
    CK(cudaEventRecord((cudaEvent_t)ev, dtc(be)->q.stream));
}
static float be_event_elapsed_ms(dt_backend *be, void *start, void *end) {
    (void)be;
    float ms = 0;
    CK(cudaEventSynchronize((cudaEvent_t)end));
    CK(cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end));
    return ms;
}
static int be_power_sample(dt_backend *be, dt_power_sample *p) { return dtc_power_sample(dtc(be), p); }
static void be_event_destroy(dt_backend *be, void *ev) {
    (void)be;
    if (ev) CK(cudaEventDestroy((cudaEvent_t)ev));
}

static int be_capture_begin(dt_backend *be) {
    dtc_state *st = dtc(be);
    if (st->capturing) {
        dt_set_error("cuda: capture_begin: a capture is already in progress");
        return -1;
    }
    /* prefetches issued before the capture are joined and forgotten (their events are outside it) */
    dtc_prefetch_join(st);
    dtc_prefetch_forget(st);
    cudaError_t e = cudaStreamBeginCapture(st->q.stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: cudaStreamBeginCapture failed: %s", cudaGetErrorString(e));
        return -1;
    }
    st->capturing = 1;
    return 0;
}

/* Two queues: the current one (stream, GEMM workspace, per-queue scratch) is st->q; a switch swaps it with st->alt,
 * after making the new queue wait for the old one if asked. The side queue is created at the first switch (never
 * during a capture: then switches are ignored and work stays serial). */
static void be_stream_switch(dt_backend *be, int q, int wait) {
    dtc_state *st = dtc(be);
    DTC_REQUIRE(q == 0 || q == 1, "stream_switch: queue %d (0 or 1)", q);
    if (st->o.serial) return;
    if (!st->alt.stream) {
        if (st->capturing || q == 0) return;
        CK(cudaStreamCreateWithPriority(&st->alt.stream, cudaStreamNonBlocking, st->queue_prio));
        CK(cudaMalloc(&st->alt.lt_ws, st->lt_ws_size));
        CK(cudaEventCreateWithFlags(&st->ev_switch, cudaEventDisableTiming));
    }
    if (q == st->cur_queue) {   /* staying: wait for the other queue if asked */
        if (wait) {
            CK(cudaEventRecord(st->ev_switch, st->alt.stream));
            CK(cudaStreamWaitEvent(st->q.stream, st->ev_switch, 0));
        }
        return;
    }
    if (wait) {
        CK(cudaEventRecord(st->ev_switch, st->q.stream));
        CK(cudaStreamWaitEvent(st->alt.stream, st->ev_switch, 0));
    }
    std::swap(st->q, st->alt);
    st->cur_queue = q;
}

static void *be_capture_end(dt_backend *be) {
    dtc_state *st = dtc(be);
    if (!st->capturing) {
        dt_set_error("cuda: capture_end without capture_begin");
        return nullptr;
    }
    /* the graph must join every stream it forked; slots filled inside it are not reusable outside */
    dtc_prefetch_join(st);
    dtc_prefetch_forget(st);
    st->capturing = 0;
    st->graphs_made++;
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(st->q.stream, &g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: cudaStreamEndCapture failed: %s", cudaGetErrorString(e));
        return nullptr;
    }
    cudaGraphExec_t ex = nullptr;
    /* the kernels keep the priorities of the streams they were captured from (the prefetch stream's is the
     * lowest); measured against running every node at the launch stream's priority and against ignoring the
     * hints while capturing: 57.75 vs 57.97 vs 58.27 ms (PERF.md, stop 13) */
    e = cudaGraphInstantiate(&ex, g, cudaGraphInstantiateFlagUseNodePriority);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: cudaGraphInstantiate failed: %s", cudaGetErrorString(e));
        return nullptr;
    }
    return (void *)ex;
}

static int be_graph_launch(dt_backend *be, void *graph) {
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, dtc(be)->q.stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dt_set_error("cuda: cudaGraphLaunch failed: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

static void be_graph_destroy(dt_backend *be, void *graph) {
    (void)be;
    if (graph) CK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

static const char *be_fp8_scale_mode(dt_backend *be) { return dtc_fp8_scale_mode(dtc(be)); }

/* ------------------------------------------------------------------ kernel preloading */
void dtc_preload_kernels(dtc_state *st) {
    dtc_preload_attention(st);
    dtc_preload_elementwise(st);
    dtc_preload_image(st);
    dtc_preload_linear(st);
    dtc_preload_fp8(st);
    dtc_preload_qgemm(st);
}

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

static void trace_install(dt_backend *be) {
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
}

static void trace_report(dtc_state *st) {
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
    if (st->pool)
        fprintf(stderr, "ditrun: cuda trace   cudaMalloc: %d calls, %.2f ms\n", st->pool->n_malloc,
                st->pool->t_malloc * 1e3);
    g_tr.stats->clear();
}

/* ------------------------------------------------------------------ create / destroy */
void dtc_gemm_cache_free(dtc_state *st);  /* cuda_linear.cu */

static void be_destroy(dt_backend *be) {
    if (!be) return;
    dtc_state *st = dtc(be);
    if (st) {
        if (st->cur_queue) be_stream_switch(be, 0, 1);
        cudaStreamSynchronize(st->q.stream);
        if (st->alt.stream) cudaStreamSynchronize(st->alt.stream);
        if (st->pf_stream) cudaStreamSynchronize(st->pf_stream);
        trace_report(st);
        dtc_gemm_cache_free(st);
        dtc_cudnn_destroy(st);
        dtc_fp8_cache_free(st);
        queue_release(st, &st->q);
        queue_release(st, &st->alt);
        scratch_release(st, &st->s_attn);
        scratch_release(st, &st->s_conv);
        scratch_release(st, &st->s_misc);
        scratch_release(st, &st->s_vt);
        scratch_release(st, &st->s_mask);
        for (int i = 0; i < 2; i++) {
            scratch_release(st, &st->pf[i].buf);
            if (st->pf[i].ready) cudaEventDestroy(st->pf[i].ready);
        }
        if (st->pf_pos) cudaEventDestroy(st->pf_pos);
        if (st->pf_last) cudaEventDestroy(st->pf_last);
        if (st->pf_stream) cudaStreamDestroy(st->pf_stream);
        pinned_release(&st->pin_up);
        pinned_release(&st->pin_down);
        if (st->ev_switch) cudaEventDestroy(st->ev_switch);
        if (st->lt) cublasLtDestroy(st->lt);
        if (st->pool) {
            for (auto &kv : st->pool->live) cudaFree(kv.first);
            pool_release_cached(st->pool);
            delete st->pool;
        }
        if (st->q.stream) cudaStreamDestroy(st->q.stream);
        if (st->alt.stream) cudaStreamDestroy(st->alt.stream);
        delete st;
    }
    free(be);
}

extern "C" int dt_backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int dt_backend_cuda_available(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        cudaGetLastError();
        cached = 0;
        return 0;
    }
    int ok = 0;
    for (int d = 0; d < n; d++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess && major >= 8) ok = 1;
    }
    cudaGetLastError();
    cached = ok;
    return ok;
}

#define CREATE_CK(call)                                                                         \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            cudaGetLastError();                                                                 \
            dt_set_error("cuda: %s failed: %s", #call, cudaGetErrorString(e_));                 \
            be_destroy(be);                                                                     \
            return NULL;                                                                        \
        }                                                                                       \
    } while (0)

extern "C" dt_backend *dt_backend_cuda_create(const dt_backend_opts *opts) {
    int n = 0;
    cudaError_t e0 = cudaGetDeviceCount(&n);
    if (e0 != cudaSuccess || n <= 0) {
        cudaGetLastError();
        dt_set_error("cuda: no CUDA GPU available (%s); use --backend cpu",
                     e0 != cudaSuccess ? cudaGetErrorString(e0) : "no devices");
        return NULL;
    }
    dt_backend_opts o;
    if (opts) o = *opts;
    else {
        memset(&o, 0, sizeof o);
        o.rope_fp32 = 1;
    }
    if (o.device < 0 || o.device >= n) {
        dt_set_error("cuda: device %d does not exist (%d device(s) found)", o.device, n);
        return NULL;
    }
    dt_cuda_opts co;
    if (o.cuda) co = *o.cuda;
    else if (dt_cuda_opts_from_env(&co)) return NULL;
    dt_backend *be = (dt_backend *)calloc(1, sizeof(dt_backend));
    if (!be) { dt_set_error("cuda: out of host memory"); return NULL; }
    dtc_state *st = new dtc_state();
    memset(st, 0, sizeof *st);
    st->o = co;
    be->impl = st;
    st->device = o.device;
    st->verbose = o.verbose;
    CREATE_CK(cudaSetDevice(o.device));
    cudaDeviceProp prop;
    CREATE_CK(cudaGetDeviceProperties(&prop, o.device));
    if (prop.major < 8) {
        dt_set_error("cuda: device %d (%s) has compute capability %d.%d; ditrun needs 8.0 or newer", o.device,
                     prop.name, prop.major, prop.minor);
        be_destroy(be);
        return NULL;
    }
    st->sm_count = prop.multiProcessorCount;
    st->cc_major = prop.major;
    st->cc_minor = prop.minor;
    st->smem_optin = prop.sharedMemPerBlockOptin;
    st->pool = new dtc_pool();
    /* the transient prefetch (default) runs on a lowest-priority stream, the queues at the highest; with
     * o.no_prefetch every dequantization runs on its queue */
    int prio_least = 0, prio_greatest = 0;
    CREATE_CK(cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest));
    st->queue_prio = !st->o.no_prefetch ? prio_greatest : prio_least;
    CREATE_CK(cudaStreamCreateWithPriority(&st->q.stream, cudaStreamNonBlocking, st->queue_prio));
    if (!st->o.no_prefetch) {
        CREATE_CK(cudaStreamCreateWithPriority(&st->pf_stream, cudaStreamNonBlocking, prio_least));
        CREATE_CK(cudaEventCreateWithFlags(&st->pf_pos, cudaEventDisableTiming));
        CREATE_CK(cudaEventCreateWithFlags(&st->pf_last, cudaEventDisableTiming));
        for (int i = 0; i < 2; i++) CREATE_CK(cudaEventCreateWithFlags(&st->pf[i].ready, cudaEventDisableTiming));
    }
    {
        cublasStatus_t s = cublasLtCreate(&st->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            dt_set_error("cuda: cublasLtCreate failed: %s", cublasGetStatusString(s));
            be_destroy(be);
            return NULL;
        }
    }
    st->lt_ws_size = (size_t)64 << 20;
    dtc_gemm_tune_init(st, prop.name);
    CREATE_CK(cudaMalloc(&st->q.lt_ws, st->lt_ws_size));
    if (o.verbose)
        fprintf(stderr, "ditrun: cuda: device %d: %s, cc %d.%d, %d SMs, %.1f GiB\n", o.device, prop.name, prop.major,
                prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);

    be->name = "cuda";
    be->act_dtype = DT_BF16;
    be->opts = o;
    be->destroy = be_destroy;
    be->alloc = be_alloc;
    be->free = be_free;
    be->upload = be_upload;
    be->download = be_download;
    be->sync = be_sync;
    be->mem_stats = be_mem_stats;
    be->linear_create = dtc_linear_create;
    be->linear_destroy = dtc_linear_destroy;
    be->conv_create = dtc_conv_create;
    be->conv_destroy = dtc_conv_destroy;
    be->linear = dtc_linear;
    be->linear_gated_add = dtc_linear_gated_add;
    be->norm_linear = dtc_norm_linear;
    be->act_linear_gated = dtc_act_linear_gated;
    if (!st->o.no_prefetch) be->linear_prefetch = dtc_linear_prefetch;
    be->layernorm_mod = dtc_layernorm_mod;
    be->rmsnorm = dtc_rmsnorm;
    be->head_norm_rope = dtc_head_norm_rope;
    be->attention = dtc_attention;
    /* fp8 attention is cuDNN's fp8 SDPA, which 9.14 computes intermittently wrong on the H200 and 9.19 right
     * (NOTES.md): on with cuDNN >= 9.19 (o.cudnn_lib picks the library), else off with the reason;
     * o.fp8_attn_unsafe turns it on anyway (measurements). Probing loads cuDNN now instead of at the first
     * attention (every model's forward uses it). */
    {
        const int ver = dtc_cudnn_version(st);
        if (st->o.fp8_attn_unsafe || ver >= 91900) {
            be->attention_fp8 = dtc_attention_fp8;
        } else {
            if (ver)
                snprintf(st->f8a_off, sizeof st->f8a_off, "it runs on cuDNN's fp8 SDPA, and the loaded cuDNN %d.%d is "
                         "one that gave intermittently wrong outputs (9.14 on the H200: about 1 call in 10; 9.19 is "
                         "right; NOTES.md): set DITRUN_CUDNN_LIB to a cuDNN >= 9.19", ver / 10000, ver / 100 % 100);
            else
                snprintf(st->f8a_off, sizeof st->f8a_off, "it runs on cuDNN's fp8 SDPA and cuDNN is not loadable");
            be->attention_fp8_off = st->f8a_off;
        }
    }
    be->act_mul = dtc_act_mul;
    be->gated_add = dtc_gated_add;
    be->mul = dtc_mul;
    be->axpby = dtc_axpby;
    be->copy = dtc_copy;
    be->transpose = dtc_transpose;
    be->conv2d = dtc_conv2d;
    be->conv2d_strided = dtc_conv2d_strided;
    be->group_norm = dtc_group_norm;
    be->upsample2x = dtc_upsample2x;
    be->channel_rmsnorm = dtc_channel_rmsnorm;
    be->event_create = be_event_create;
    be->event_record = be_event_record;
    be->event_elapsed_ms = be_event_elapsed_ms;
    be->event_destroy = be_event_destroy;
    be->power_sample = be_power_sample;
    be->capture_begin = be_capture_begin;
    be->capture_end = be_capture_end;
    be->graph_launch = be_graph_launch;
    be->graph_destroy = be_graph_destroy;
    be->fp8_quant = dtc_fp8_quant;
    be->fp8_scale_mode = be_fp8_scale_mode;
    be->stream_switch = be_stream_switch;
    {
        /* Load every kernel of the backend now (lazy module loading would otherwise load each one at its first
         * launch, inside the first forward / encode / decode) and raise their shared-memory limits. */
        double t0 = dt_now();
        if (st->cc_major == 9 && st->cc_minor == 0) dtc_preload_kernels(st);
        st->t_preload = dt_now() - t0;
        if (o.verbose) fprintf(stderr, "ditrun: cuda: kernels preloaded in %.1f ms\n", st->t_preload * 1e3);
    }
    if (o.qpath == DT_QPATH_MIXED && !dtc_qgemm_eligible(st, 128, 64, 4, 64))
        fprintf(stderr, "ditrun: cuda: --qpath mixed needs an sm_90 GPU with TMA (this one is compute %d.%d): "
                        "quantized Linears take the auto path\n", st->cc_major, st->cc_minor);
    trace_install(be);
    be->opts.cuda = &st->o;
    return be;
}

extern "C" dt_cuda_opts *dt_backend_cuda_opts(dt_backend *be) {
    if (!be || !be->name || strcmp(be->name, "cuda")) return nullptr;
    return &dtc(be)->o;
}
