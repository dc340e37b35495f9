/* test_backend_slots.c — every slot of the backend interface is traced: struct dt_backend declares its function slots
 * only through DT_BACKEND_SLOTS (backends/backend.h), the list the trace wrapper (backends/backend_trace.c) generates
 * its wrappers from, so a new op cannot go untraced silently. Checks:
 *   - the struct holds exactly the listed slots after its data members (a slot declared outside the list fails);
 *   - the wrapper of a backend that has every slot replaces every one, and keeps a NULL slot NULL;
 *   - the traced CPU backend computes what the plain one does, bit for bit, and counts each call (levels 1 and 3:
 *     host times, and device times through the profiling extension's events), also under the LoRA wrapper;
 *   - on a GPU: the CUDA backend with its trace option on is handed out traced, its ops counted with device times. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/backend_cuda.h"
#include "backends/backend_ext.h"
#include "backends/backend_trace.h"
#include "models/lora_backend.h"
#include "test.h"

/* ---- a table with every slot set (never called: only the wrapper's installation is looked at) ---- */
#define STUB_V(name, params, args) static void stub_##name params { (void)0; }
#define STUB_R(type, name, params, args) static type stub_##name params { type r; memset(&r, 0, sizeof r); return r; }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
DT_BACKEND_SLOTS(STUB_V, STUB_R)
#pragma GCC diagnostic pop

static void check_layout(void) {
    size_t n = 0, first = sizeof(dt_backend);
#define COUNT_V(name, params, args) n++; if (offsetof(dt_backend, name) < first) first = offsetof(dt_backend, name);
#define COUNT_R(type, name, params, args) COUNT_V(name, params, args)
    DT_BACKEND_SLOTS(COUNT_V, COUNT_R)
    printf("# %zu function slots in DT_BACKEND_SLOTS\n", n);
    /* at least the 40 slots the interface had when this test was written: a list that expands to nothing fails */
    T_CHECK("backend slots listed", n >= 40, "only %zu slots in DT_BACKEND_SLOTS", n);
    T_CHECK("struct dt_backend: every function slot comes from DT_BACKEND_SLOTS, after the data members",
            sizeof(dt_backend) == first + n * sizeof(void (*)(void)),
            "sizeof %zu != first slot at %zu + %zu slots x %zu: a member declared outside the list (the trace wrapper "
            "would not wrap a slot there)", sizeof(dt_backend), first, n, sizeof(void (*)(void)));
}

static void check_every_slot_wrapped(void) {
    dt_backend *full = dt_calloc(1, sizeof *full);
    full->name = "full";
#define SET_V(name, params, args) full->name = stub_##name;
#define SET_R(type, name, params, args) SET_V(name, params, args)
    DT_BACKEND_SLOTS(SET_V, SET_R)
    dt_backend *t = dt_backend_trace(full, 1, 1e9);
    int unwrapped = 0;
    char nm[128];
#define WRAPPED_V(name, params, args) \
    snprintf(nm, sizeof nm, "slot %s has a trace wrapper", #name); \
    if (!t->name || t->name == stub_##name) unwrapped++; \
    T_CHECK(nm, t->name && t->name != stub_##name, "%s", t->name ? "the inner slot itself" : "NULL");
#define WRAPPED_R(type, name, params, args) WRAPPED_V(name, params, args)
    DT_BACKEND_SLOTS(WRAPPED_V, WRAPPED_R)
    printf("# %d slots without a trace wrapper\n", unwrapped);
    T_CHECK("traced backend: name, impl and options are the inner's", t->name == full->name && t->impl == full->impl,
            "name %s", t->name);
    t->destroy(t);   /* the summary, then the stub's destroy (which frees nothing) */
    free(full);

    /* a NULL slot stays NULL (callers test optional slots) */
    dt_backend_opts o = {0};
    o.threads = 1;
    dt_backend *cpu = dt_backend_cpu_create(&o);
    dt_backend plain = *cpu;
    dt_backend *tc = dt_backend_trace(cpu, 1, 1e9);
    int kept = 1;
#define NULLS_V(name, params, args) kept &= !plain.name == !tc->name;
#define NULLS_R(type, name, params, args) NULLS_V(name, params, args)
    DT_BACKEND_SLOTS(NULLS_V, NULLS_R)
    T_CHECK("traced cpu backend: the optional slots it lacks stay NULL (capture_begin, stream_switch, ...)",
            kept && !tc->capture_begin && !tc->stream_switch && tc->linear, "%s", "a NULL slot became set or the reverse");
    tc->destroy(tc);
}

/* n pseudo-random values in [-1, 1) (xorshift; the same for every run) */
static void fill(float *v, size_t n, uint64_t s) {
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v[i] = (float)((s >> 40) * (1.0 / 8388608.0)) - 1.0f;
    }
}

/* y = rmsnorm(x) · Wᵀ + 0.5 x[:, :N] on be (x [M, K], W [N, K]): y as host floats [M, N]. */
static float *run_ops(dt_backend *be, const float *hx, const float *hw, int64_t M, int64_t K, int64_t N) {
    dt_linear_src src = {0};
    src.name = "w";
    src.out = N;
    src.in = K;
    src.dtype = DT_F32;
    src.data = hw;
    dt_linear *w = be->linear_create(be, &src);
    dt_mat x = dt_alloc_or_die(be, M, K, DT_F32), h = dt_alloc_or_die(be, M, K, DT_F32);
    dt_mat y = dt_alloc_or_die(be, M, N, DT_F32);
    be->upload(be, x, hx);
    be->rmsnorm(be, h, x, dt_mat_null(), 0.0f, 1e-6f);
    be->linear(be, y, h, w);
    be->axpby(be, y, 1.0f, y, 0.5f, dt_mat_cols(x, 0, N));
    float *out = dt_malloc(sizeof(float) * (size_t)(M * N));
    be->download(be, out, y);
    be->sync(be);
    be->free(be, &x);
    be->free(be, &h);
    be->free(be, &y);
    be->linear_destroy(be, w);
    return out;
}

static void check_traced_cpu(int level) {
    const int64_t M = 37, K = 64, N = 48;
    float *hx = dt_malloc(sizeof(float) * (size_t)(M * K)), *hw = dt_malloc(sizeof(float) * (size_t)(N * K));
    fill(hx, (size_t)(M * K), 7);
    fill(hw, (size_t)(N * K), 8);
    dt_backend_opts o = {0};
    o.threads = 2;
    dt_backend *plain = dt_backend_cpu_create(&o), *be = dt_backend_trace(dt_backend_cpu_create(&o), level, 1e9);
    float *ref = run_ops(plain, hx, hw, M, K, N), *got = run_ops(be, hx, hw, M, K, N);
    char nm[160];
    snprintf(nm, sizeof nm, "traced cpu backend (level %d): rmsnorm, linear, axpby equal the plain backend's bit for bit",
             level);
    T_CHECK(nm, !memcmp(ref, got, sizeof(float) * (size_t)(M * N)), "%s", "outputs differ");
    static const struct { const char *slot; int n; } want[] = {
        {"linear_create", 1}, {"alloc", 3}, {"upload", 1}, {"rmsnorm", 1}, {"linear", 1}, {"axpby", 1},
        {"download", 1}, {"sync", 1}, {"free", 3}, {"linear_destroy", 1}, {"attention", 0}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        double ms = -1;
        int n = dt_backend_trace_calls(be, want[i].slot, &ms);
        snprintf(nm, sizeof nm, "traced cpu backend (level %d): %d call%s of %s counted, with a time", level, want[i].n,
                 want[i].n == 1 ? "" : "s", want[i].slot);
        T_CHECK(nm, n == want[i].n && ms >= 0, "%d calls, %.3g ms", n, ms);
    }
    double ms = 0;
    snprintf(nm, sizeof nm, "traced cpu backend (level %d): the linear took measurable time", level);
    dt_backend_trace_calls(be, "linear", &ms);
    T_CHECK(nm, ms > 0, "%.3g ms", ms);
    snprintf(nm, sizeof nm, "traced cpu backend (level %d): get_ext reaches the inner backend's extensions", level);
    T_CHECK(nm, dt_backend_profiling(be) == dt_backend_profiling(plain) && dt_backend_profiling(be) &&
                    dt_backend_trace_calls(be, "get_ext", NULL) >= 1, "%s", "a different table");
    T_CHECK("a backend that is not traced has no trace counts", dt_backend_trace_calls(plain, "linear", NULL) == -1 &&
            dt_backend_trace_calls(be, "no_such_slot", NULL) == -1, "%s", "counts reported");
    plain->destroy(plain);
    be->destroy(be);
    free(ref); free(got); free(hx); free(hw);
}

/* A wrapper above the traced backend (the LoRA side-product wrapper, models/lora_backend.c, as a model with
 * adapters on a traced CUDA backend has it): the ops still reach the trace with its own state, results unchanged. */
static void check_lora_over_trace(void) {
    const int64_t M = 19, K = 32, N = 24;
    float *hx = dt_malloc(sizeof(float) * (size_t)(M * K)), *hw = dt_malloc(sizeof(float) * (size_t)(N * K));
    fill(hx, (size_t)(M * K), 11);
    fill(hw, (size_t)(N * K), 12);
    dt_backend_opts o = {0};
    o.threads = 1;
    dt_backend *plain = dt_backend_cpu_create(&o), *traced = dt_backend_trace(dt_backend_cpu_create(&o), 1, 1e9);
    dt_backend *lw = dt_lora_backend_wrap(traced);
    float *ref = run_ops(plain, hx, hw, M, K, N), *got = run_ops(lw, hx, hw, M, K, N);
    T_CHECK("lora wrapper over the traced cpu backend: outputs equal the plain backend's bit for bit",
            !memcmp(ref, got, sizeof(float) * (size_t)(M * N)), "%s", "outputs differ");
    int nr = dt_backend_trace_calls(traced, "rmsnorm", NULL), nl = dt_backend_trace_calls(traced, "linear", NULL);
    T_CHECK("lora wrapper over the traced cpu backend: the trace counts the ops issued through the wrapper",
            nr == 1 && nl == 1, "rmsnorm %d, linear %d calls", nr, nl);
    lw->destroy(lw);
    traced->destroy(traced);
    plain->destroy(plain);
    free(ref); free(got); free(hx); free(hw);
}

/* GPU: the trace option hands the CUDA backend out wrapped; its ops are counted with device times (level 3). */
static void check_traced_cuda(void) {
    if (!dt_backend_cuda_available()) { T_SKIP("traced cuda backend", "no CUDA GPU"); return; }
    dt_cuda_opts co;
    if (dt_cuda_opts_from_env(&co)) { T_FAIL("traced cuda backend", "%s", dt_last_error()); return; }
    co.trace = 3;
    co.trace_ms = 1e9;
    dt_backend_opts o = {0};
    o.rope_fp32 = 1;
    o.cuda = &co;
    dt_backend *be = dt_backend_cuda_create(&o);
    if (!be) { T_FAIL("traced cuda backend", "%s", dt_last_error()); return; }
    const int64_t M = 256, K = 512;
    float *hx = dt_malloc(sizeof(float) * (size_t)(M * K));
    fill(hx, (size_t)(M * K), 9);
    dt_mat x = dt_alloc_or_die(be, M, K, be->act_dtype), y = dt_alloc_or_die(be, M, K, be->act_dtype);
    be->upload(be, x, hx);
    for (int i = 0; i < 3; i++) be->rmsnorm(be, y, x, dt_mat_null(), 0.0f, 1e-6f);
    be->sync(be);
    double ms = 0;
    int n = dt_backend_trace_calls(be, "rmsnorm", &ms);
    T_CHECK("traced cuda backend: 3 rmsnorm calls counted with their device time", n == 3 && ms > 0, "%d calls, %.3g ms",
            n, ms);
    T_CHECK("traced cuda backend: its own options still reachable (impl shared)", dt_backend_cuda_opts(be) != NULL,
            "%s", "dt_backend_cuda_opts NULL");
    T_CHECK("traced cuda backend: extensions through get_ext", dt_backend_profiling(be) && dt_backend_fp8_internals(be),
            "%s", "missing");
    be->free(be, &x);
    be->free(be, &y);
    be->destroy(be);   /* prints the level-3 report */
    free(hx);
}

int main(void) {
    dt_log_level = 0;
    check_layout();
    check_every_slot_wrapped();
    check_traced_cpu(1);
    check_traced_cpu(3);
    check_lora_over_trace();
    check_traced_cuda();
    return T_DONE();
}
