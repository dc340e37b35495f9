/* cuda_pool.cu — the CUDA backend's device memory: a caching pool over cudaMalloc (blocks keyed by rounded size,
 * best fit up to 25% larger, current and peak bytes) under the budget o.max_vram (--max-vram), grow-only scratch
 * buffers for op temporaries (kept alive for captured graphs), a queue's per-queue buffers, and the alloc / free /
 * mem_stats entries of the vtable. Every device allocation of the backend goes through pool_alloc (weights,
 * activations, scratch, cuDNN and cuBLASLt workspaces); what the CUDA context and the libraries' handles take for
 * themselves is outside it (nvidia-smi shows it on top). */
#include <map>
#include <mutex>
#include <unordered_map>

#include "cuda_common.cuh"

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

static const char *mib(size_t b, char *buf, size_t n) {
    if (b >= ((size_t)1 << 30)) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= ((size_t)1 << 20)) snprintf(buf, n, "%.1f MiB", b / 1048576.0);
    else snprintf(buf, n, "%.1f KiB", b / 1024.0);
    return buf;
}

/* The budget: 0 when rb more bytes fit (the cached blocks given back first when they are in the way), -1 with the
 * error naming the budget, the use and the request otherwise. The caller holds the lock. */
static int pool_within_budget(dtc_state *st, size_t bytes, size_t rb) {
    dtc_pool *p = st->pool;
    const int64_t budget = st->o.max_vram;
    if (budget <= 0 || (int64_t)(p->current + p->cached + rb) <= budget) return 0;
    if (p->cached) pool_release_cached(p);
    if ((int64_t)(p->current + rb) <= budget) return 0;
    char b[32], u[32], r[32];
    dt_set_error("cuda: memory budget --max-vram %s exceeded: %s in use, %s more asked (%zu bytes)",
                 mib((size_t)budget, b, sizeof b), mib(p->current, u, sizeof u), mib(rb, r, sizeof r), bytes);
    return -1;
}

/* A block of at least bytes: from the cache when use_cache (best fit), else a fresh cudaMalloc. */
static void *pool_alloc(dtc_state *st, size_t bytes, bool use_cache) {
    dtc_pool *p = st->pool;
    size_t rb = pool_round(bytes);
    std::lock_guard<std::mutex> lk(p->mu);
    void *ptr = nullptr;
    /* best fit among the cached blocks, up to 25% larger than asked (phases of a pipeline ask for slightly
     * different sizes; a fresh cudaMalloc costs far more than the slack) */
    auto it = use_cache ? p->freeb.lower_bound(rb) : p->freeb.end();
    if (it != p->freeb.end() && it->first <= rb + rb / 4) {
        ptr = it->second;
        rb = it->first;
        p->freeb.erase(it);
        p->cached -= rb;
    } else {
        if (pool_within_budget(st, bytes, rb)) return nullptr;
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

void *dtc_pool_alloc(dtc_state *st, size_t bytes) { return pool_alloc(st, bytes, true); }
void *dtc_pool_alloc_fresh(dtc_state *st, size_t bytes) { return pool_alloc(st, bytes, false); }

/* Take ptr out of the live blocks (the caller holds the lock): its block size. A pointer this pool did not hand out
 * is a bug: the process stops. */
static size_t pool_unlive(dtc_pool *p, void *ptr) {
    auto it = p->live.find(ptr);
    if (it == p->live.end()) {
        fprintf(stderr, "ditrun: cuda: free of a pointer not allocated by this backend (%p)\n", ptr);
        exit(1);
    }
    size_t rb = it->second;
    p->live.erase(it);
    p->current -= rb;
    return rb;
}

void dtc_pool_free(dtc_state *st, void *ptr) {
    if (!ptr) return;
    dtc_pool *p = st->pool;
    std::lock_guard<std::mutex> lk(p->mu);
    size_t rb = pool_unlive(p, ptr);
    /* Stream-ordered reuse: blocks are freed (and re-allocated) from the main queue's order only; the side queue
     * and the prefetch stream use grow-only scratch, and scratch_grow synchronizes before it frees. */
    p->freeb.emplace(rb, ptr);
    p->cached += rb;
}

/* Give one live block straight back to the device (not to the pool's cache). */
void dtc_pool_free_to_device(dtc_state *st, void *ptr) {
    if (!ptr) return;
    dtc_pool *p = st->pool;
    std::lock_guard<std::mutex> lk(p->mu);
    pool_unlive(p, ptr);
    cudaFree(ptr);
}

static void scratch_grow(dtc_state *st, dtc_scratch *s, size_t want) {
    if (s->ptr && !st->graphs_made && !st->capturing) {
        /* no graph can hold the old buffer: free it (after the queues are done with it) before allocating, so
         * growth while a model loads (each Linear a bit larger) does not leave a trail of dead buffers. Only that
         * buffer goes back to the device: the pool's other cached blocks stay, so a later request finds the blocks
         * the first one used (releasing them all made the second image of a size allocate again: +75 KB on the
         * tiny pipeline, test_engine; H200, 2026-12-01) */
        CK(cudaStreamSynchronize(st->q.stream));
        if (st->alt.stream) CK(cudaStreamSynchronize(st->alt.stream));
        if (st->pf_stream) CK(cudaStreamSynchronize(st->pf_stream));
        dtc_pool_free_to_device(st, s->ptr);
        s->ptr = nullptr;
        s->size = 0;
    }
    /* a fresh block, never one of the cache's: a grow-only buffer that took an activation's cached block would make
     * a later request allocate that activation again (the second image of a size growing the pool: test_engine) */
    void *np = pool_alloc(st, want, false);
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

void dtc_scratch_release(dtc_state *st, dtc_scratch *s) {
    for (int i = 0; i < s->nretired; i++) dtc_pool_free(st, s->retired[i]);
    free(s->retired);
    if (s->ptr) dtc_pool_free(st, s->ptr);
    memset(s, 0, sizeof *s);
}

/* A queue's scratch buffers and workspace (its stream is destroyed last, after the pool). */
void dtc_queue_release(dtc_state *st, dtc_queue *q) {
    dtc_scratch *all[] = {&q->s_qdeq, &q->s_split, &q->s_cast, &q->s_gate, &q->s_lga, &q->s_fp8, &q->s_fp8g};
    for (dtc_scratch *s : all) dtc_scratch_release(st, s);
    dtc_pool_free_to_device(st, q->lt_ws);
    q->lt_ws = nullptr;
}

/* ------------------------------------------------------------------ vtable: memory */
int dtc_mat_alloc(dt_backend *be, dt_mat *m, int64_t rows, int64_t cols, dt_dtype dtype) {
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

void dtc_mat_free(dt_backend *be, dt_mat *m) {
    if (!m || !m->data) return;
    dtc_pool_free(dtc(be), m->data);
    m->data = nullptr;
}

void dtc_mem_stats(dt_backend *be, size_t *current, size_t *peak) {
    dtc_pool *p = dtc(be)->pool;
    std::lock_guard<std::mutex> lk(p->mu);
    if (current) *current = p->current;
    if (peak) *peak = p->peak;
}

extern "C" int dt_backend_cuda_mem_budget(dt_backend *be, int64_t *budget, int64_t *held) {
    if (!be || !be->name || strcmp(be->name, "cuda")) return -1;
    dtc_state *st = dtc(be);
    size_t h;
    {
        std::lock_guard<std::mutex> lk(st->pool->mu);
        h = st->pool->current + st->pool->cached;
    }
    size_t fr = 0, tot = 0;
    if (st->o.max_vram <= 0 && cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
    if (held) *held = (int64_t)h;
    if (budget) *budget = st->o.max_vram > 0 ? st->o.max_vram : (int64_t)(fr + h);
    return 0;
}

void dtc_pool_create(dtc_state *st) { st->pool = new dtc_pool(); }

void dtc_pool_destroy(dtc_state *st) {
    if (!st->pool) return;
    for (auto &kv : st->pool->live) cudaFree(kv.first);
    pool_release_cached(st->pool);
    delete st->pool;
    st->pool = nullptr;
}

int dtc_pool_malloc_stats(dtc_state *st, int *n, double *seconds) {
    if (!st->pool) return 0;
    std::lock_guard<std::mutex> lk(st->pool->mu);
    *n = st->pool->n_malloc;
    *seconds = st->pool->t_malloc;
    return 1;
}
