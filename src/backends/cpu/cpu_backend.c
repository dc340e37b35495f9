/* cpu_backend.c — the CPU backend object: creation, the op vtable, host memory (64-byte aligned,
 * with current/peak accounting), upload/download, scratch buffers and wall-clock timing events. */
#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend_ext.h"
#include "cpu_internal.h"

#define CPU_ALIGN 64

void cpu_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ditrun: error: cpu backend: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void *aligned_or_die(size_t bytes) {
    size_t n = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (n == 0) n = CPU_ALIGN;
    void *p = aligned_alloc(CPU_ALIGN, n);
    if (!p) cpu_fatal("out of host memory allocating %zu bytes", n);
    return p;
}

float *cpu_buf_get(cpu_buf *b, size_t n) {
    if (n > b->n) {
        free(b->p);
        b->p = aligned_or_die(n * sizeof(float));
        b->n = n;
    }
    return b->p;
}

void cpu_buf_free(cpu_buf *b) { free(b->p); b->p = NULL; b->n = 0; }

/* OpenBLAS's thread count is process-wide, so the cache is too (several CPU backends may coexist). */
static int g_blas_threads;

void cpu_blas_threads(cpu_impl *c, int n) {
    (void)c;
    if (n < 1) n = 1;
    if (g_blas_threads != n) {
        openblas_set_num_threads(n);
        g_blas_threads = n;
    }
}

/* ---- memory: each allocation carries a 64-byte header holding its size for the accounting ---- */

static int cpu_alloc(dt_backend *be, dt_mat *m, int64_t rows, int64_t cols, dt_dtype dtype) {
    cpu_impl *c = cpu_of(be);
    if (dtype != DT_F32) {
        dt_set_error("cpu backend: cannot allocate a %s matrix (the CPU backend is F32 only)", dt_dtype_name(dtype));
        return -1;
    }
    if (rows < 0 || cols < 0 || (cols > 0 && rows > (int64_t)(SIZE_MAX / 8 / (size_t)cols))) {
        dt_set_error("cpu backend: bad matrix shape [%lld, %lld]", (long long)rows, (long long)cols);
        return -1;
    }
    size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
    size_t total = CPU_ALIGN + (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    char *base = aligned_alloc(CPU_ALIGN, total);
    if (!base) {
        dt_set_error("cpu backend: out of host memory allocating [%lld, %lld] F32 (%zu bytes)", (long long)rows,
                     (long long)cols, bytes);
        return -1;
    }
    memcpy(base, &total, sizeof total);
    size_t cur = atomic_fetch_add(&c->mem_cur, total) + total;
    size_t peak = atomic_load(&c->mem_peak);
    while (cur > peak && !atomic_compare_exchange_weak(&c->mem_peak, &peak, cur)) {}
    m->data = base + CPU_ALIGN;
    m->rows = rows;
    m->cols = cols;
    m->ld = cols;
    m->dtype = dtype;
    return 0;
}

static void cpu_free(dt_backend *be, dt_mat *m) {
    if (!m || !m->data) return;
    char *base = (char *)m->data - CPU_ALIGN;
    size_t total;
    memcpy(&total, base, sizeof total);
    atomic_fetch_sub(&cpu_of(be)->mem_cur, total);
    free(base);
    m->data = NULL;
}

static void cpu_mem_stats(dt_backend *be, size_t *current, size_t *peak) {
    cpu_impl *c = cpu_of(be);
    if (current) *current = atomic_load(&c->mem_cur);
    if (peak) *peak = atomic_load(&c->mem_peak);
}

/* Host f32 [rows, cols] contiguous -> m (F32 or BF16 view). */
static void cpu_upload(dt_backend *be, dt_mat m, const float *src) {
    (void)be;
    for (int64_t r = 0; r < m.rows; r++) {
        const float *s = src + r * m.cols;
        if (m.dtype == DT_F32) {
            memcpy((float *)m.data + r * m.ld, s, (size_t)m.cols * sizeof(float));
        } else if (m.dtype == DT_BF16) {
            uint16_t *d = (uint16_t *)m.data + r * m.ld;
            for (int64_t j = 0; j < m.cols; j++) d[j] = dt_f32_to_bf16(s[j]);
        } else {
            cpu_fatal("upload: unsupported dtype %s", dt_dtype_name(m.dtype));
        }
    }
}

/* m -> host f32 [rows, cols] contiguous. */
static void cpu_download(dt_backend *be, float *dst, dt_mat m) {
    (void)be;
    for (int64_t r = 0; r < m.rows; r++) {
        float *d = dst + r * m.cols;
        if (m.dtype == DT_F32) {
            memcpy(d, (const float *)m.data + r * m.ld, (size_t)m.cols * sizeof(float));
        } else if (m.dtype == DT_BF16) {
            const uint16_t *s = (const uint16_t *)m.data + r * m.ld;
            for (int64_t j = 0; j < m.cols; j++) d[j] = dt_bf16_to_f32(s[j]);
        } else {
            cpu_fatal("download: unsupported dtype %s", dt_dtype_name(m.dtype));
        }
    }
}

static int cpu_sync(dt_backend *be) { (void)be; return 0; }

/* ---- timing events: CPU ops are synchronous, so an event is just a wall-clock timestamp ---- */
static void *cpu_event_create(dt_backend *be) { (void)be; return dt_calloc(1, sizeof(double)); }
static void cpu_event_record(dt_backend *be, void *ev) { (void)be; *(double *)ev = dt_now(); }
static float cpu_event_elapsed_ms(dt_backend *be, void *start, void *end) {
    (void)be;
    return (float)((*(double *)end - *(double *)start) * 1000.0);
}
static void cpu_event_destroy(dt_backend *be, void *ev) { (void)be; free(ev); }
static const dt_ext_profiling cpu_profiling = {cpu_event_create, cpu_event_record, cpu_event_elapsed_ms,
                                               cpu_event_destroy, NULL, NULL};   /* no power sensor */
static const void *cpu_get_ext(dt_backend *be, const char *name) {
    (void)be;
    return !strcmp(name, DT_EXT_PROFILING) ? &cpu_profiling : NULL;
}

/* OpenBLAS (DYNAMIC_ARCH) picks its kernels from CPUID when the library loads (or from OPENBLAS_CORETYPE, which
 * OpenBLAS reads itself); on CPUs it does not know (e.g. recent Xeons seen through some hypervisors) it falls back
 * to its generic SSE3 "Prescott" kernels, several times slower. The choice cannot be changed after load, so say
 * once how to fix it. */
static void warn_generic_blas(void) {
    static int warned;
    if (warned) return;
    const char *core = openblas_get_corename();
    static const char *generic[] = { "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
                                     "Coppermine", "Northwood", "Banias" };
    int is_generic = 0;
    for (size_t i = 0; i < sizeof generic / sizeof *generic; i++)
        if (core && !strcmp(core, generic[i])) is_generic = 1;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
#else
    const char *better = NULL;
#endif
    if (is_generic && better) {
        warned = 1;
        dt_log(2, "ditrun: note: OpenBLAS did not recognise this CPU and uses its generic '%s' kernels; "
               "set OPENBLAS_CORETYPE=%s in the environment for several times faster CPU matrix products\n",
               core, better);
    }
}

static void cpu_destroy(dt_backend *be) {
    if (!be) return;
    cpu_impl *c = cpu_of(be);
    if (c) {
        dt_pool_destroy(c->pool);
        cpu_buf_free(&c->shared);
        if (c->per_thread)
            for (int t = 0; t < c->threads; t++) cpu_buf_free(&c->per_thread[t]);
        free(c->per_thread);
        free(c);
    }
    free(be);
}

dt_backend *dt_backend_cpu_create(const dt_backend_opts *opts) {
    dt_backend_opts o;
    if (opts) o = *opts; else memset(&o, 0, sizeof o);
    int threads = o.threads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    if (threads > 1024) threads = 1024;
    o.threads = threads;

    cpu_impl *c = dt_calloc(1, sizeof *c);
    c->threads = threads;
    atomic_init(&c->mem_cur, 0);
    atomic_init(&c->mem_peak, 0);
    c->per_thread = dt_calloc((size_t)threads, sizeof *c->per_thread);
    c->pool = dt_pool_create(threads);
    if (!c->pool) {
        free(c->per_thread);
        free(c);
        return NULL;
    }
    cpu_blas_threads(c, threads);

    dt_backend *be = dt_calloc(1, sizeof *be);
    be->name = "cpu";
    be->act_dtype = DT_F32;
    be->opts = o;
    be->impl = c;
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_upload;
    be->download = cpu_download;
    be->sync = cpu_sync;
    be->mem_stats = cpu_mem_stats;
    be->linear_create = cpu_linear_create;
    be->linear_destroy = cpu_linear_destroy;
    be->linear_path = cpu_linear_path;
    be->conv_create = cpu_conv_create;
    be->conv_destroy = cpu_conv_destroy;
    be->linear = cpu_linear;
    be->layernorm_mod = cpu_layernorm_mod;
    be->norm_linear = dt_norm_linear_composed;
    be->rmsnorm_mod_linears = dt_rmsnorm_mod_linears_composed;
    be->act_linear_gated = dt_act_linear_gated_composed;
    be->rmsnorm = cpu_rmsnorm;
    be->rmsnorm_mod = cpu_rmsnorm_mod;
    be->head_norm_rope = cpu_head_norm_rope;
    be->attention = cpu_attention;
    be->attention_fp8 = cpu_attention_fp8;
    be->act_mul = cpu_act_mul;
    be->gated_add = cpu_gated_add;
    be->mul = cpu_mul;
    be->axpby = cpu_axpby;
    be->flow_step = cpu_flow_step;
    be->copy = cpu_copy;
    be->transpose = cpu_transpose;
    be->abs_diff_sums = cpu_abs_diff_sums;
    be->conv2d = cpu_conv2d;
    be->conv2d_strided = cpu_conv2d_strided;
    be->group_norm = cpu_group_norm;
    be->upsample2x = cpu_upsample2x;
    be->channel_rmsnorm = cpu_channel_rmsnorm;
    be->get_ext = cpu_get_ext;
    dt_log(2, "cpu backend: %d threads, OpenBLAS %s\n", threads, openblas_get_config());
    warn_generic_blas();
    return be;
}
