/* lora_backend.c — the side-product backend wrapper (see lora_backend.h). Scratch for the rank-R intermediate
 * and the [M, out] product is kept per queue (the model may run two queues concurrently) and grows only in
 * eager runs (a CUDA graph captures a forward that ran once before at the same shape). */
#include "lora_backend.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_backend pub;          /* the wrapper handed to the model (first member: container of `be`) */
    dt_backend *inner;
    int queue;               /* the queue ops go to (stream_switch) */
    dt_mat t[2], y[2];       /* per queue: x·Aᵀ [M, R] and (x·Aᵀ)·Bᵀ [M, out] scratch (flat) */
} lora_be;

struct dt_linear {
    dt_linear *base;         /* the inner backend's Linear */
    dt_linear *A, *B;        /* side product: A [R, in], B [out, R] (NULL: none) */
    float *hA, *hB;          /* their host copies (backends may keep views of dense host weights) */
    int64_t in, out, R;
};

static lora_be *lb(dt_backend *be) { return (lora_be *)be; }

/* Every other slot forwards to the inner backend, called as itself (`be` becomes it), so that an inner wrapper which
 * finds its own state from `be` (the trace wrapper, backends/backend_trace.h) works under this one. */
#define LB_FWD_V(name, params, args) \
    __attribute__((unused)) static void fwd_##name params { \
        be = lb(be)->inner; \
        be->name args; \
    }
#define LB_FWD_R(type, name, params, args) \
    __attribute__((unused)) static type fwd_##name params { \
        be = lb(be)->inner; \
        return be->name args; \
    }
DT_BACKEND_SLOTS(LB_FWD_V, LB_FWD_R)


/* A [rows, cols] view of scratch m (grown to at least rows·cols elements first). */
static dt_mat scratch(lora_be *s, dt_mat *m, int64_t rows, int64_t cols) {
    dt_backend *in = s->inner;
    if (!m->data || m->cols < rows * cols) {
        if (m->data) {
            in->sync(in);
            in->free(in, m);
        }
        *m = dt_alloc_or_die(in, 1, rows * cols, in->act_dtype);
    }
    dt_mat v = *m;
    return dt_mat_reshape(v, rows, cols);
}

/* y += gate ⊙ ((x·Aᵀ)·Bᵀ) (gate NULL data: plain add) */
static void side(lora_be *s, dt_mat y, dt_mat x, const dt_linear *w, dt_mat gate) {
    dt_backend *in = s->inner;
    int q = s->queue & 1;
    dt_mat t = scratch(s, &s->t[q], x.rows, w->R);
    in->linear(in, t, x, w->A);
    if (in->linear_gated_add) {   /* (CUDA: one accumulating GEMM when there is no gate) */
        in->linear_gated_add(in, y, t, w->B, gate);
    } else {
        dt_mat p = scratch(s, &s->y[q], x.rows, w->out);
        in->linear(in, p, t, w->B);
        in->gated_add(in, y, gate, p);
    }
}

static dt_linear *w_create(dt_backend *be, const dt_linear_src *src) {
    dt_backend *in = lb(be)->inner;
    dt_linear *base = in->linear_create(in, src);
    if (!base) return NULL;
    dt_linear *w = dt_calloc(1, sizeof *w);
    w->base = base;
    w->in = src->in;
    w->out = src->out;
    return w;
}

static const char *w_path(dt_backend *be, const dt_linear *w) {
    dt_backend *in = lb(be)->inner;
    return in->linear_path ? in->linear_path(in, w->base) : "(the backend does not say)";
}

static void w_destroy(dt_backend *be, dt_linear *w) {
    if (!w) return;
    dt_backend *in = lb(be)->inner;
    in->linear_destroy(in, w->base);
    if (w->A) in->linear_destroy(in, w->A);
    if (w->B) in->linear_destroy(in, w->B);
    free(w->hA);
    free(w->hB);
    free(w);
}

static void w_linear(dt_backend *be, dt_mat y, dt_mat x, const dt_linear *w) {
    dt_backend *in = lb(be)->inner;
    in->linear(in, y, x, w->base);
    if (w->A) side(lb(be), y, x, w, dt_mat_null());
}

static void w_linear_gated_add(dt_backend *be, dt_mat x, dt_mat a, const dt_linear *w, dt_mat gate) {
    dt_backend *in = lb(be)->inner;
    in->linear_gated_add(in, x, a, w->base, gate);
    if (w->A) side(lb(be), x, a, w, gate);
}

static void w_prefetch(dt_backend *be, const dt_linear *w, dt_mat gate, int64_t rows) {
    dt_backend *in = lb(be)->inner;
    if (w) in->linear_prefetch(in, w->base, gate, rows);
}

/* With a side product the fused input paths run as their composed ops through the wrapper (the side product needs
 * the normalized / activated input itself; CUDA's fp8 producers would not write it). */
static void w_norm_linear(dt_backend *be, dt_mat y, dt_mat x, dt_mat shift, dt_mat scale, float eps, const dt_linear *w,
                          dt_mat a) {
    dt_backend *in = lb(be)->inner;
    if (!w->A) in->norm_linear(in, y, x, shift, scale, eps, w->base, a);
    else dt_norm_linear_composed(be, y, x, shift, scale, eps, w, a);
}

#define LB_NORM_LINEARS_MAX 8   /* the most Linears rmsnorm_mod_linears hands on to the inner backend's fused op */
static void w_rmsnorm_mod_linears(dt_backend *be, dt_mat x, dt_mat nw, dt_mat shift, float eps, dt_mat a, int n,
                                  const dt_linear *const *w, const dt_mat *y) {
    dt_backend *in = lb(be)->inner;
    const dt_linear *base[LB_NORM_LINEARS_MAX];
    int composed = n > LB_NORM_LINEARS_MAX;   /* (more than the table holds: composed too) */
    for (int i = 0; i < n && !composed; i++) {
        composed = w[i]->A != NULL;
        base[i] = w[i]->base;
    }
    if (!composed) in->rmsnorm_mod_linears(in, x, nw, shift, eps, a, n, base, y);
    else dt_rmsnorm_mod_linears_composed(be, x, nw, shift, eps, a, n, w, y);
}

static int w_on_host(dt_backend *be, const dt_linear *w) {
    dt_backend *in = lb(be)->inner;
    return in->linear_on_host(in, w->base);
}

static void w_act_linear_gated(dt_backend *be, dt_mat x, dt_mat c, int64_t lead, dt_mat a, dt_mat b, dt_act act,
                               const dt_linear *w, dt_mat gate, dt_mat y) {
    dt_backend *in = lb(be)->inner;
    if (!w->A) in->act_linear_gated(in, x, c, lead, a, b, act, w->base, gate, y);
    else dt_act_linear_gated_composed(be, x, c, lead, a, b, act, w, gate, y);
}

static void w_stream_switch(dt_backend *be, int q, int wait) {
    lb(be)->queue = q;
    lb(be)->inner->stream_switch(lb(be)->inner, q, wait);
}

static void w_destroy_backend(dt_backend *be) {
    lora_be *s = lb(be);
    for (int q = 0; q < 2; q++) {
        if (s->t[q].data) s->inner->free(s->inner, &s->t[q]);
        if (s->y[q].data) s->inner->free(s->inner, &s->y[q]);
    }
    free(s);
}

int dt_lora_backend_is_wrapper(const dt_backend *be) { return be && be->destroy == w_destroy_backend; }

dt_backend *dt_lora_backend_wrap(dt_backend *inner) {
    if (!inner) { dt_set_error("lora: no backend to wrap"); return NULL; }
    lora_be *s = dt_calloc(1, sizeof *s);
    s->pub = *inner;              /* the same impl and options, the inner's ops (forwarded) ... */
    s->inner = inner;
    dt_backend *be = &s->pub;     /* ... but its own Linears */
#define LB_SET_V(name, params, args) be->name = inner->name ? fwd_##name : NULL;
#define LB_SET_R(type, name, params, args) LB_SET_V(name, params, args)
    DT_BACKEND_SLOTS(LB_SET_V, LB_SET_R)
    be->destroy = w_destroy_backend;
    be->linear_create = w_create;
    be->linear_destroy = w_destroy;
    be->linear_path = w_path;
    be->linear = w_linear;
    be->linear_gated_add = inner->linear_gated_add ? w_linear_gated_add : NULL;
    be->linear_prefetch = inner->linear_prefetch ? w_prefetch : NULL;
    be->norm_linear = w_norm_linear;
    be->rmsnorm_mod_linears = w_rmsnorm_mod_linears;
    be->act_linear_gated = w_act_linear_gated;
    be->linear_on_host = inner->linear_on_host ? w_on_host : NULL;
    be->stream_switch = inner->stream_switch ? w_stream_switch : NULL;
    return be;
}

int dt_lora_backend_attach(dt_backend *be, dt_linear *w, const float *A, const float *B, int64_t R) {
    if (!dt_lora_backend_is_wrapper(be)) { dt_set_error("lora: side products need the LoRA backend wrapper"); return -1; }
    if (w->A) { dt_set_error("lora: Linear already has a side product"); return -1; }
    if (R <= 0) { dt_set_error("lora: side product of rank %lld", (long long)R); return -1; }
    dt_backend *in = lb(be)->inner;
    w->hA = dt_malloc(sizeof(float) * (size_t)(R * w->in));
    w->hB = dt_malloc(sizeof(float) * (size_t)(w->out * R));
    memcpy(w->hA, A, sizeof(float) * (size_t)(R * w->in));
    memcpy(w->hB, B, sizeof(float) * (size_t)(w->out * R));
    dt_linear_src a = {0}, b = {0};
    a.name = "lora.A";
    a.out = R;
    a.in = w->in;
    a.dtype = DT_F32;
    a.data = w->hA;
    b.name = "lora.B";
    b.out = w->out;
    b.in = R;
    b.dtype = DT_F32;
    b.data = w->hB;
    w->A = in->linear_create(in, &a);
    w->B = w->A ? in->linear_create(in, &b) : NULL;
    if (!w->B) {
        if (w->A) in->linear_destroy(in, w->A);
        w->A = NULL;
        free(w->hA);
        free(w->hB);
        w->hA = w->hB = NULL;
        return -1;
    }
    w->R = R;
    return 0;
}
